/* cpu_attn_x512.h - AVX-512 helpers shared by the reduced-precision
 * attention kernels (cpu_attn_avx512bf16.c, cpu_attn_i8_avx512vnni.c):
 * static inline, compiled into each with that file's ISA flags. */
#ifndef FY_CPU_ATTN_X512_H
#define FY_CPU_ATTN_X512_H

#include <immintrin.h>

/* exp(x) for 16 floats, exp8's method (cpu_x86.h): 2^n * p(r), p the
 * degree-7 Taylor polynomial; relative error ~1e-7 */
static inline __attribute__((always_inline)) __m512 exp16(__m512 x)
{
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.3f)), _mm512_set1_ps(-87.3f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    __m512i e = _mm512_slli_epi32(_mm512_cvtps_epi32(n), 23);
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(p), e));
}

/* in place: r[i] element j <- r[j] element i (16 x 16 of 32-bit) */
static inline __attribute__((always_inline)) void transpose16(__m512i *r)
{
    __m512i t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) { /* u[i + j], 128-bit lane L: column 4L + j of rows i .. i + 3 */
        u[i + 0] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int h = 0; h < 16; h += 8) /* t[h + j]: columns j, j + 8 (j < 4) or j, j + 8 (j >= 4, lanes 1 and 3) */
        for (int j = 0; j < 4; j++) {
            t[h + j] = _mm512_shuffle_i32x4(u[h + j], u[h + 4 + j], 0x88);
            t[h + 4 + j] = _mm512_shuffle_i32x4(u[h + j], u[h + 4 + j], 0xdd);
        }
    for (int j = 0; j < 8; j++) {
        r[j] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0x88);
        r[j + 8] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0xdd);
    }
}

#endif

/*
 * cpu_avx2.c - AVX2 + FMA + F16C versions of the CPU inner loops.
 * Compiled with -mavx2 -mfma -mf16c (Makefile: *_avx2.c); called only
 * after fy_cpu_has_avx2() said yes.
 */
#include <immintrin.h>

#include "cpu_kernels.h"

static inline float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

/* 16 bytes of packed nibbles -> 32 bytes 0..15: low nibbles (elements
 * 0..15) in the low lane, high nibbles (16..31) in the high lane */
static inline __m256i unpack_nibbles(const uint8_t *qs)
{
    __m128i b = _mm_loadu_si128((const __m128i *)qs);
    __m128i m = _mm_set1_epi8(0x0f);
    __m128i lo = _mm_and_si128(b, m);
    __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

/* unsigned bytes times signed bytes, summed to 8 int32 lanes, as float */
static inline __m256 dot_u8s8(__m256i u, __m256i s)
{
    __m256i p16 = _mm256_maddubs_epi16(u, s);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

static void quantize_q8a(const float *x, fy_block_q8a_t *y, int64_t n)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < n / FY_QK; b++) {
        const float *xb = x + b * FY_QK;
        __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8);
        __m256 v2 = _mm256_loadu_ps(xb + 16), v3 = _mm256_loadu_ps(xb + 24);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float d = _mm_cvtss_f32(m4) / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        __m256 vid = _mm256_set1_ps(id);
        __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, vid));
        __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, vid));
        __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, vid));
        __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, vid));
        __m256i s = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        s4 = _mm_hadd_epi32(s4, s4);
        s4 = _mm_hadd_epi32(s4, s4);
        /* pack 32 int32 -> 32 int8; packs work per 128-bit lane, so fix
         * the order with a cross-lane permute */
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)y[b].qs, p);
        y[b].d = d;
        y[b].s = d * (float)_mm_cvtsi128_si32(s4);
    }
}

static float dot_q8_0(const void *w, const void *x, int64_t n)
{
    const fy_block_q8_0_t *wb = w;
    const fy_block_q8a_t *xb = x;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / FY_QK; b++) {
        __m256i qw = _mm256_loadu_si256((const __m256i *)wb[b].qs);
        __m256i qx = _mm256_loadu_si256((const __m256i *)xb[b].qs);
        /* signed x signed through |w| and sign(x, w) */
        __m256 p = dot_u8s8(_mm256_sign_epi8(qw, qw), _mm256_sign_epi8(qx, qw));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(wb[b].d) * xb[b].d), p, acc);
    }
    return hsum(acc);
}

static float dot_q4_0(const void *w, const void *x, int64_t n)
{
    const fy_block_q4_0_t *wb = w;
    const fy_block_q8a_t *xb = x;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / FY_QK; b++) {
        /* q - 8 in [-8, 7], then signed x signed as for q8_0 (subtracting
         * 8 * sum(x) afterwards instead would cancel badly) */
        __m256i qw = _mm256_sub_epi8(unpack_nibbles(wb[b].qs), _mm256_set1_epi8(8));
        __m256i qx = _mm256_loadu_si256((const __m256i *)xb[b].qs);
        __m256 p = dot_u8s8(_mm256_sign_epi8(qw, qw), _mm256_sign_epi8(qx, qw));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(wb[b].d) * xb[b].d), p, acc);
    }
    return hsum(acc);
}

static float dot_q4_1(const void *w, const void *x, int64_t n)
{
    const fy_block_q4_1_t *wb = w;
    const fy_block_q8a_t *xb = x;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    float mins = 0.0f;
    int64_t nb = n / FY_QK, b = 0;
    for (; b + 1 < nb; b += 2) {
        __m256 p0 = dot_u8s8(unpack_nibbles(wb[b].qs), _mm256_loadu_si256((const __m256i *)xb[b].qs));
        __m256 p1 = dot_u8s8(unpack_nibbles(wb[b + 1].qs), _mm256_loadu_si256((const __m256i *)xb[b + 1].qs));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(wb[b].d) * xb[b].d), p0, acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(wb[b + 1].d) * xb[b + 1].d), p1, acc1);
        mins += h2f(wb[b].m) * xb[b].s + h2f(wb[b + 1].m) * xb[b + 1].s;
    }
    for (; b < nb; b++) {
        __m256 p = dot_u8s8(unpack_nibbles(wb[b].qs), _mm256_loadu_si256((const __m256i *)xb[b].qs));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(wb[b].d) * xb[b].d), p, acc0);
        mins += h2f(wb[b].m) * xb[b].s;
    }
    return hsum(_mm256_add_ps(acc0, acc1)) + mins;
}

static float dot_f32(const void *w, const void *x, int64_t n)
{
    const float *a = w, *b = x;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
        acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), acc2);
        acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), acc3);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    float sum = hsum(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

static float dot_f16(const void *w, const void *x, int64_t n)
{
    const uint16_t *a = w;
    const float *b = x;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + i))),
                               _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + i + 8))),
                               _mm256_loadu_ps(b + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8)
        acc0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + i))),
                               _mm256_loadu_ps(b + i), acc0);
    float sum = hsum(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) sum += h2f(a[i]) * b[i];
    return sum;
}

static inline __m256 load_bf16(const uint16_t *p)
{
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

static float dot_bf16(const void *w, const void *x, int64_t n)
{
    const uint16_t *a = w;
    const float *b = x;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(load_bf16(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(load_bf16(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(load_bf16(a + i), _mm256_loadu_ps(b + i), acc0);
    float sum = hsum(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) sum += fy_bf16_to_fp32(a[i]) * b[i];
    return sum;
}

static void axpy_f32(float *y, float a, const float *x, int64_t n)
{
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

static void axpy_f16(float *y, float a, const uint16_t *x, int64_t n)
{
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))),
                                                _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * h2f(x[i]);
}

static void f32_to_f16(const float *x, uint16_t *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) y[i] = fy_fp32_to_fp16(x[i]);
}

const fy_cpu_kernels_t fy_cpu_kernels_avx2 = {
    .name = "avx2",
    .quantize_q8a = quantize_q8a,
    .vec_dot =
        {
            [FY_DTYPE_F32] = dot_f32,
            [FY_DTYPE_F16] = dot_f16,
            [FY_DTYPE_BF16] = dot_bf16,
            [FY_DTYPE_Q8_0] = dot_q8_0,
            [FY_DTYPE_Q4_0] = dot_q4_0,
            [FY_DTYPE_Q4_1] = dot_q4_1,
        },
    .axpy_f32 = axpy_f32,
    .axpy_f16 = axpy_f16,
    .f32_to_f16 = f32_to_f16,
};

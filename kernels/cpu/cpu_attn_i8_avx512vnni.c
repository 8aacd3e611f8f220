/* cpu_attn_i8_avx512vnni.c - decode attention over int8 KV blocks read in
 * place (rows [f32 scale][hd codes], kv.h) with 8-bit dot products: each
 * query head is quantized to int8 once per (token, kv head), Q . K is
 * vpdpbusd (64 u8 x s8 products per instruction) on the stored codes, the
 * softmax and P . V (codes converted to f32, scaled per row) in f32.
 * Called by the row walk under FY_CPU_ATTN=int8 only (an experiment; the
 * default dequantizes int8 rows to f32).  Makefile: AVX512-VNNI flags. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/cpu_attn_x512.h"
#include "kernels/cpu/cpu_kernels.h"

void fy_attn_q8_quantize(const float *q, int G, int hd, int8_t *qc, float *qs, int32_t *qsum)
{
    for (int g = 0; g < G; g++) {
        const float *x = q + (size_t)g * hd;
        float amax = 0.0f;
        for (int d = 0; d < hd; d++) amax = fabsf(x[d]) > amax ? fabsf(x[d]) : amax;
        const float s = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        int32_t sum = 0;
        for (int d = 0; d < hd; d++) {
            int c = (int)lrintf(x[d] * inv);
            qc[(size_t)g * hd + d] = (int8_t)c;
            sum += c;
        }
        qs[g] = s, qsum[g] = sum;
    }
}

/* up to 4 heads' accumulators stay in registers across the keys */
#define I8_GROUP 4

/* acc[g][0 .. 64) += sum over rows i < n of w[g][i] * codes_i[0 .. 64),
 * for NG heads (w: [NG][16], acc rows hd apart), each row's codes
 * converted to f32 once */
static inline __attribute__((always_inline)) void values_i8(const char *vc, size_t row_bytes, int n, float (*w)[16],
                                                            float *acc, int hd, const int NG)
{
    __m512 a[I8_GROUP][4];
#pragma GCC unroll 4
    for (int g = 0; g < NG; g++)
#pragma GCC unroll 4
        for (int jj = 0; jj < 4; jj++) a[g][jj] = _mm512_loadu_ps(acc + (size_t)g * hd + 16 * jj);
    for (int i = 0; i < n; i++) {
        const int8_t *c = (const int8_t *)(vc + (size_t)i * row_bytes);
        __m512 vv[4];
#pragma GCC unroll 4
        for (int jj = 0; jj < 4; jj++)
            vv[jj] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(c + 16 * jj))));
#pragma GCC unroll 4
        for (int g = 0; g < NG; g++) {
            const __m512 x = _mm512_set1_ps(w[g][i]);
#pragma GCC unroll 4
            for (int jj = 0; jj < 4; jj++) a[g][jj] = _mm512_fmadd_ps(x, vv[jj], a[g][jj]);
        }
    }
#pragma GCC unroll 4
    for (int g = 0; g < NG; g++)
#pragma GCC unroll 4
        for (int jj = 0; jj < 4; jj++) _mm512_storeu_ps(acc + (size_t)g * hd + 16 * jj, a[g][jj]);
}

void fy_attn_block_i8_vnni(const int8_t *qc, const float *qs, const int32_t *qsum, int G, const void *k, const void *v,
                           size_t row_bytes, int nk, int hd, float scale, float *m, float *l, float *acc)
{
    const char *kr = k, *vr = v;
    float e[FY_ATTN_MAX_GROUP][16] __attribute__((aligned(64))); /* exp(score - m) * v's row scale */
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    for (int c0 = 0; c0 < nk; c0 += 16) {
        const int n = nk - c0 < 16 ? nk - c0 : 16;
        const __mmask16 live = (__mmask16)((1u << n) - 1);
        float ks[16] __attribute__((aligned(64))) = {0}, vs[16] __attribute__((aligned(64))) = {0};
        for (int i = 0; i < n; i++) {
            memcpy(&ks[i], kr + (size_t)(c0 + i) * row_bytes, sizeof(float));
            memcpy(&vs[i], vr + (size_t)(c0 + i) * row_bytes, sizeof(float));
        }
        /* Q . K: keys along the lanes, 4 dims a lane; keys as u8 (code +
         * 128), so dot = sum (k + 128) q - 128 sum q */
        __m512i dot[FY_ATTN_MAX_GROUP];
        for (int g = 0; g < G; g++) dot[g] = _mm512_setzero_si512();
        for (int d0 = 0; d0 < hd; d0 += 64) {
            __m512i rows[16];
            for (int i = 0; i < 16; i++)
                rows[i] = i < n ? _mm512_xor_si512(_mm512_loadu_si512(kr + (size_t)(c0 + i) * row_bytes + 4 + d0), bias)
                                : _mm512_setzero_si512();
            transpose16(rows); /* rows[p]: dims d0 + 4p .. + 3 of the 16 keys */
            for (int g = 0; g < G; g++) {
                const int32_t *q4 = (const int32_t *)(qc + (size_t)g * hd + d0);
                __m512i a0 = dot[g], a1 = _mm512_setzero_si512();
                for (int p = 0; p < 16; p += 2) {
                    a0 = _mm512_dpbusd_epi32(a0, rows[p], _mm512_set1_epi32(q4[p]));
                    a1 = _mm512_dpbusd_epi32(a1, rows[p + 1], _mm512_set1_epi32(q4[p + 1]));
                }
                dot[g] = _mm512_add_epi32(a0, a1);
            }
        }
        const __m512 kss = _mm512_load_ps(ks);
        for (int g = 0; g < G; g++) {
            __m512i d = _mm512_sub_epi32(dot[g], _mm512_set1_epi32(128 * qsum[g]));
            __m512 s = _mm512_mul_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(kss, _mm512_set1_ps(qs[g] * scale)));
            s = _mm512_mask_blend_ps(live, _mm512_set1_ps(-INFINITY), s);
            const float mb = _mm512_reduce_max_ps(s);
            if (mb > m[g]) {
                const float corr = expf(m[g] - mb);
                l[g] *= corr;
                for (int j = 0; j < hd; j += 16)
                    _mm512_storeu_ps(acc + (size_t)g * hd + j,
                                     _mm512_mul_ps(_mm512_loadu_ps(acc + (size_t)g * hd + j), _mm512_set1_ps(corr)));
                m[g] = mb;
            }
            __m512 x = _mm512_maskz_mov_ps(live, exp16(_mm512_sub_ps(s, _mm512_set1_ps(m[g]))));
            l[g] += _mm512_reduce_add_ps(x);
            _mm512_store_ps(e[g], _mm512_mul_ps(x, _mm512_load_ps(vs)));
        }
        /* P . V: each row's codes converted once for up to I8_GROUP heads */
        for (int g0 = 0; g0 < G; g0 += I8_GROUP) {
            const int ng = G - g0 < I8_GROUP ? G - g0 : I8_GROUP;
            for (int j0 = 0; j0 < hd; j0 += 64) {
                const char *vc = vr + (size_t)c0 * row_bytes + 4 + j0;
                float *ag = acc + (size_t)g0 * hd + j0;
                if (ng == 4)
                    values_i8(vc, row_bytes, n, e + g0, ag, hd, 4);
                else if (ng == 3)
                    values_i8(vc, row_bytes, n, e + g0, ag, hd, 3);
                else if (ng == 2)
                    values_i8(vc, row_bytes, n, e + g0, ag, hd, 2);
                else
                    values_i8(vc, row_bytes, n, e + g0, ag, hd, 1);
            }
        }
    }
}

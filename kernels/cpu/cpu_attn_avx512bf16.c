/* cpu_attn_avx512bf16.c - the prefill attention tile (fy_attn_tile_fn) in
 * bf16 arithmetic: Q . K^T and P . V with vdpbf16ps (32 bf16 products into
 * 16 f32 lanes per instruction, twice an f32 FMA's work), the online
 * softmax and every sum in f32.  A faster, less exact alternative to the
 * f32 tile kernel, which stays the reference; picked at run time
 * (FY_CPU_ATTN=bf16) and only on CPUs with AVX512_BF16 (Makefile: this
 * file alone gets -mavx512bf16).  Not a decode kernel: converting a
 * block to bf16 pays only when many query rows read it. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/cpu_attn_x512.h"
#include "kernels/cpu/cpu_kernels.h"

/* 16 K/V elements of a row as f32 */
static inline __attribute__((always_inline)) __m512 load16(const void *p, int64_t i, const int f16)
{
    if (f16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)));
    return _mm512_loadu_ps((const float *)p + i);
}

/* 32 f32 as 16 bf16 pairs (element i: x[2i] low, x[2i + 1] high), rounded to nearest even */
static inline __attribute__((always_inline)) __m512i pairs32(__m512 lo, __m512 hi)
{
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

/* scores of the 16 keys of kc (kt's chunk) for two heads' query pairs
 * (qb may equal qa), unscaled */
static inline __attribute__((always_inline)) void scores16(const uint32_t *qa, const uint32_t *qb, const uint32_t *kc,
                                                           int np, __m512 *sa, __m512 *sb, const int two)
{
    /* four sums a head: a dot's latency is several times its issue rate */
    __m512 a[4], b[4];
    for (int i = 0; i < 4; i++) a[i] = _mm512_setzero_ps(), b[i] = a[i];
    for (int p = 0; p < np; p += 4) {
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            __m512bh kk = (__m512bh)_mm512_load_si512(kc + (size_t)(p + i) * 32);
            a[i] = _mm512_dpbf16_ps(a[i], (__m512bh)_mm512_set1_epi32((int)qa[p + i]), kk);
            if (two) b[i] = _mm512_dpbf16_ps(b[i], (__m512bh)_mm512_set1_epi32((int)qb[p + i]), kk);
        }
    }
    *sa = _mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3]));
    if (two) *sb = _mm512_add_ps(_mm512_add_ps(b[0], b[1]), _mm512_add_ps(b[2], b[3]));
}

/* m is the softmax's reference point, not always the running maximum: it
 * moves (to the maximum) only when a score passes it by more than
 * LAZY_MAX, which saves a reduction in most blocks; weights stay below
 * e^LAZY_MAX, far inside f32's and bf16's range, and the merge of
 * partials (cpu_backend.c) and the output acc / l hold for any m. */
#define LAZY_MAX 8.0f

/* One head's online-softmax step over its block scores s[0..1] (32 keys,
 * keys outside [lo, hi) masked): m, l updated, e (16 bf16 pairs) set to
 * exp(score - m) rounded to bf16, zero outside [lo, hi); l takes the sum
 * of the rounded values, so the weights P . V uses and their normaliser
 * agree.  Returns the factor acc must be multiplied by. */
static inline __attribute__((always_inline)) float softmax32(__m512 s0, __m512 s1, __mmask16 k0, __mmask16 k1, float *m,
                                                             float *l, uint32_t *e)
{
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    s0 = _mm512_mask_blend_ps(k0, ninf, s0), s1 = _mm512_mask_blend_ps(k1, ninf, s1);
    float corr = 1.0f;
    const __m512 lim = _mm512_set1_ps(*m + LAZY_MAX);
    if (_mm512_cmp_ps_mask(s0, lim, _CMP_GT_OQ) | _mm512_cmp_ps_mask(s1, lim, _CMP_GT_OQ)) {
        const float mb = _mm512_reduce_max_ps(_mm512_max_ps(s0, s1));
        corr = expf(*m - mb);
        *l *= corr;
        *m = mb;
    }
    const __m512 mm = _mm512_set1_ps(*m);
    __m512 e0 = _mm512_maskz_mov_ps(k0, exp16(_mm512_sub_ps(s0, mm)));
    __m512 e1 = _mm512_maskz_mov_ps(k1, exp16(_mm512_sub_ps(s1, mm)));
    __m512i pb = pairs32(e0, e1);
    _mm512_store_si512(e, pb);
    /* the rounded values back in f32: low halves shifted up, high halves masked */
    __m512 lo = _mm512_castsi512_ps(_mm512_slli_epi32(pb, 16));
    __m512 hi = _mm512_castsi512_ps(_mm512_and_si512(pb, _mm512_set1_epi32((int)0xffff0000u)));
    *l += _mm512_reduce_add_ps(_mm512_add_ps(lo, hi));
    return corr;
}

/* softmax32 for rows that see keys of one 16-key chunk c only (every
 * row of blocks of 8 or 16): e[8c .. 8c + 8) set */
static inline __attribute__((always_inline)) float softmax16(__m512 s, __mmask16 k, int c, float *m, float *l,
                                                             uint32_t *e)
{
    s = _mm512_mask_blend_ps(k, _mm512_set1_ps(-INFINITY), s);
    float corr = 1.0f;
    if (_mm512_cmp_ps_mask(s, _mm512_set1_ps(*m + LAZY_MAX), _CMP_GT_OQ)) {
        const float mb = _mm512_reduce_max_ps(s);
        corr = expf(*m - mb);
        *l *= corr;
        *m = mb;
    }
    __m256i pb = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_mov_ps(k, exp16(_mm512_sub_ps(s, _mm512_set1_ps(*m)))));
    _mm256_store_si256((__m256i *)(e + 8 * c), pb);
    *l += _mm512_reduce_add_ps(_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(pb), 16)));
    return corr;
}

/* acc = acc * corr + sum over key pairs [pa, pb) of e[i] . vt[i] over
 * columns [j0, j0 + 16 NJ), for two heads of a row at once (ab NULL: one
 * head); NJ a constant so that the sums stay in registers */
static inline __attribute__((always_inline)) void values_cols(const uint32_t *vt, int pa, int pb, int hd, int j0,
                                                              const int NJ, const uint32_t *ea, float ca, float *aa,
                                                              const uint32_t *eb, float cb, float *ab)
{
    __m512 x[4], y[4];
#pragma GCC unroll 4
    for (int jj = 0; jj < NJ; jj++) x[jj] = _mm512_mul_ps(_mm512_loadu_ps(aa + j0 + 16 * jj), _mm512_set1_ps(ca));
    if (ab) {
#pragma GCC unroll 4
        for (int jj = 0; jj < NJ; jj++) y[jj] = _mm512_mul_ps(_mm512_loadu_ps(ab + j0 + 16 * jj), _mm512_set1_ps(cb));
        for (int i = pa; i < pb; i++) {
            __m512bh e = (__m512bh)_mm512_set1_epi32((int)ea[i]), f = (__m512bh)_mm512_set1_epi32((int)eb[i]);
#pragma GCC unroll 4
            for (int jj = 0; jj < NJ; jj++) {
                __m512bh vv = (__m512bh)_mm512_load_si512(vt + (size_t)i * hd + j0 + 16 * jj);
                x[jj] = _mm512_dpbf16_ps(x[jj], e, vv);
                y[jj] = _mm512_dpbf16_ps(y[jj], f, vv);
            }
        }
#pragma GCC unroll 4
        for (int jj = 0; jj < NJ; jj++) _mm512_storeu_ps(ab + j0 + 16 * jj, y[jj]);
    } else {
        for (int i = pa; i < pb; i++) {
            __m512bh e = (__m512bh)_mm512_set1_epi32((int)ea[i]);
#pragma GCC unroll 4
            for (int jj = 0; jj < NJ; jj++)
                x[jj] = _mm512_dpbf16_ps(x[jj], e, (__m512bh)_mm512_load_si512(vt + (size_t)i * hd + j0 + 16 * jj));
        }
    }
#pragma GCC unroll 4
    for (int jj = 0; jj < NJ; jj++) _mm512_storeu_ps(aa + j0 + 16 * jj, x[jj]);
}

static inline __attribute__((always_inline)) void values(const uint32_t *vt, int pa, int pb, int hd, const uint32_t *ea,
                                                         float ca, float *aa, const uint32_t *eb, float cb, float *ab)
{
    int j0 = 0;
    for (; j0 + 64 <= hd; j0 += 64) values_cols(vt, pa, pb, hd, j0, 4, ea, ca, aa, eb, cb, ab);
    if (j0 < hd) values_cols(vt, pa, pb, hd, j0, 2, ea, ca, aa, eb, cb, ab); /* hd % 64 == 32 */
}

static inline __attribute__((always_inline)) __mmask16 range_mask(int c0, int lo, int hi)
{
    int a = lo - c0, b = hi - c0; /* keys [a, b) of this chunk's 16 */
    a = a < 0 ? 0 : a > 16 ? 16 : a;
    b = b < 0 ? 0 : b > 16 ? 16 : b;
    return (__mmask16)(((1u << b) - 1) & ~((1u << a) - 1));
}

static inline __attribute__((always_inline)) void tile_bf16(const float *const *q, int nr, int G, const void *k,
                                                            const void *v, int nk, int hd, float scale,
                                                            const int32_t *vis, float *m, float *l, float *acc,
                                                            float *work, const int f16)
{
    const int np = hd / 2; /* bf16 pairs per row */
    /* kt: [np][32] pairs (element [p][i]: key i's dims 2p, 2p + 1); vt:
     * [16][hd] (element [i][d]: keys 2i, 2i + 1 at dim d); both 64-byte
     * aligned, 64 hd bytes each, within work's 256 hd */
    uint32_t *kt = (uint32_t *)work, *vt = kt + (size_t)np * 32;
    int ulo = nk, uhi = 0;
    for (int r = 0; r < nr; r++) {
        ulo = vis[2 * r] < ulo ? vis[2 * r] : ulo;
        uhi = vis[2 * r + 1] > uhi ? vis[2 * r + 1] : uhi;
    }
    /* K: whole 16-key chunks, keys nobody sees (or past nk) as zeros */
    const int c_lo = ulo / 16, c_hi = (uhi + 15) / 16;
    for (int c = c_lo; c < c_hi; c++)
        for (int p0 = 0; p0 < np; p0 += 16) {
            __m512i rows[16];
            for (int i = 0; i < 16; i++) {
                int key = c * 16 + i;
                if (key < ulo || key >= uhi) {
                    rows[i] = _mm512_setzero_si512();
                    continue;
                }
                int64_t o = (int64_t)key * hd + 2 * p0;
                rows[i] = pairs32(load16(k, o, f16), load16(k, o + 16, f16));
            }
            transpose16(rows); /* rows[j]: pair p0 + j of the chunk's 16 keys */
            for (int j = 0; j < 16; j++) _mm512_store_si512(kt + (size_t)(p0 + j) * 32 + c * 16, rows[j]);
        }
    /* V: key pairs interleaved per dim */
    const int pa_all = ulo / 2, pb_all = (uhi + 1) / 2;
    for (int i = pa_all; i < pb_all; i++) {
        const int k0 = 2 * i, k1 = 2 * i + 1;
        for (int d = 0; d < hd; d += 16) {
            __m512i a = _mm512_setzero_si512(), b = a;
            if (k0 >= ulo) a = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(load16(v, (int64_t)k0 * hd + d, f16)));
            if (k1 < uhi) b = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(load16(v, (int64_t)k1 * hd + d, f16)));
            _mm512_store_si512(vt + (size_t)i * hd + d, _mm512_or_si512(a, _mm512_slli_epi32(b, 16)));
        }
    }
    uint32_t qa[256] __attribute__((aligned(64))), qb[256] __attribute__((aligned(64)));
    uint32_t ea[16] __attribute__((aligned(64))), eb[16] __attribute__((aligned(64)));
    const __m512 vs = _mm512_set1_ps(scale);
    for (int r = 0; r < nr; r++) {
        const int lo = vis[2 * r], hi = vis[2 * r + 1];
        const __mmask16 k0 = range_mask(0, lo, hi), k1 = range_mask(16, lo, hi);
        for (int g = 0; g < G; g += 2) {
            const int two = g + 1 < G;
            const float *xa = q[r] + (size_t)g * hd;
            for (int p = 0; p < np; p += 16) {
                _mm512_store_si512(qa + p, pairs32(_mm512_loadu_ps(xa + 2 * p), _mm512_loadu_ps(xa + 2 * p + 16)));
                if (two)
                    _mm512_store_si512(
                        qb + p, pairs32(_mm512_loadu_ps(xa + hd + 2 * p), _mm512_loadu_ps(xa + hd + 2 * p + 16)));
            }
            __m512 sa[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()}, sb[2] = {sa[0], sa[0]};
            for (int c = 0; c < 2; c++) {
                if (!(c ? k1 : k0)) continue;
                if (two)
                    scores16(qa, qb, kt + c * 16, np, &sa[c], &sb[c], 1);
                else
                    scores16(qa, qa, kt + c * 16, np, &sa[c], &sb[c], 0);
                sa[c] = _mm512_mul_ps(sa[c], vs), sb[c] = _mm512_mul_ps(sb[c], vs);
            }
            const size_t ia = (size_t)r * G + g;
            float ca, cb = 0.0f;
            if (k0 && k1) {
                ca = softmax32(sa[0], sa[1], k0, k1, m + ia, l + ia, ea);
                if (two) cb = softmax32(sb[0], sb[1], k0, k1, m + ia + 1, l + ia + 1, eb);
            } else {
                const int c = k0 ? 0 : 1;
                ca = softmax16(sa[c], k0 | k1, c, m + ia, l + ia, ea);
                if (two) cb = softmax16(sb[c], k0 | k1, c, m + ia + 1, l + ia + 1, eb);
            }
            values(vt, lo / 2, (hi + 1) / 2, hd, ea, ca, acc + ia * hd, eb, cb, two ? acc + (ia + 1) * hd : NULL);
        }
    }
}

void fy_attn_tile_bf16_f32(const float *const *q, int nr, int G, const void *k, const void *v, int nk, int hd,
                           float scale, const int32_t *vis, float *m, float *l, float *acc, float *work)
{
    tile_bf16(q, nr, G, k, v, nk, hd, scale, vis, m, l, acc, work, 0);
}

void fy_attn_tile_bf16_f16(const float *const *q, int nr, int G, const void *k, const void *v, int nk, int hd,
                           float scale, const int32_t *vis, float *m, float *l, float *acc, float *work)
{
    tile_bf16(q, nr, G, k, v, nk, hd, scale, vis, m, l, acc, work, 1);
}

/*
 * cpu_x86.h - the x86 vector kernels, written once and compiled three
 * times (cpu_avx2.c, cpu_avxvnni.c, cpu_avx512vnni.c) with different
 * instruction-set flags; the including file defines FY_X86_TABLE (the
 * table's name), FY_X86_NAME and FY_X86_VNNI (0: AVX2 maddubs+madd,
 * 1: AVX-VNNI, 2: AVX512-VNNI on 256-bit vectors).  Only included by
 * those files; the backend calls a table only after checking the CPU.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_kernels.h"

/* acc + sum over each 4 bytes of u (unsigned) times s (signed), per int32
 * lane.  Without VNNI the 16-bit intermediate sums saturate past 32767:
 * callers keep |u| <= 128 (quants of at most 8 bits, magnitudes only). */
#if FY_X86_VNNI == 2
#define DPBUSD(acc, u, s) _mm256_dpbusd_epi32(acc, u, s)
#elif FY_X86_VNNI == 1
#define DPBUSD(acc, u, s) _mm256_dpbusd_avx_epi32(acc, u, s)
#else
#define DPBUSD(acc, u, s) _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)))
#endif

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

/* unsigned bytes times signed bytes, summed to 8 int32 lanes */
static inline __m256i dot_u8s8(__m256i u, __m256i s) { return DPBUSD(_mm256_setzero_si256(), u, s); }

/* signed times signed bytes, through |a| and sign(b, a) */
static inline __m256i dot_s8s8(__m256i a, __m256i b)
{
    return dot_u8s8(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
}

/* p[0..7] -> [sum(p[0]), ..., sum(p[7])] */
static inline __m256i hsum8_epi32(const __m256i *p)
{
    __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

/* The first two fp16 values of each of 8 blocks `stride` bytes apart
 * (GGUF puts d, then m for Q4_1, at the start of a block), as floats. */
static inline void load_scales8(const void *base, int stride, __m256 *d, __m256 *m)
{
    const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(stride));
    __m256i g = _mm256_i32gather_epi32((const int *)base, idx, 1);
    /* per lane: the low halves (d) of its 4 dwords, then the high halves (m) */
    const __m256i sh = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12, 13,
                                        2, 3, 6, 7, 10, 11, 14, 15);
    __m256i v = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(g, sh), _MM_SHUFFLE(3, 1, 2, 0));
    *d = _mm256_cvtph_ps(_mm256_castsi256_si128(v));
    if (m) *m = _mm256_cvtph_ps(_mm256_extracti128_si256(v, 1));
}

static void quantize_q8a(const float *x, const fy_q8a_t *y, int64_t n)
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
        /* the sums of elements 0..15 and 16..31 in lanes 0 and 1 */
        __m256i h = _mm256_hadd_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
        h = _mm256_hadd_epi32(h, h);
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
        /* pack 32 int32 -> 32 int8; packs work per 128-bit lane, so fix
         * the order with a cross-lane permute */
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(y->qs + b * FY_QK), p);
        y->d[b] = d;
        y->isum16[2 * b] = _mm_cvtsi128_si32(s4);
        y->isum16[2 * b + 1] = _mm_extract_epi32(s4, 1);
        y->isum[b] = y->isum16[2 * b] + y->isum16[2 * b + 1];
        y->s[b] = d * (float)y->isum[b];
    }
}

/*
 * The quantized dots work on groups of 8 blocks: 8 integer block dots
 * are reduced to one vector of 8 sums, and the 8 weight scales (gathered)
 * times the 8 activation scales (one load) scale them in one multiply.
 * That is about half the instructions of scaling each block on its own,
 * and the decode step is instruction-bound before it is memory-bound.
 */
#define Q8_0_BYTES ((int)sizeof(fy_block_q8_0_t))
#define Q4_0_BYTES ((int)sizeof(fy_block_q4_0_t))
#define Q4_1_BYTES ((int)sizeof(fy_block_q4_1_t))

static inline __m256i qdot_q8_0(const void *w, const int8_t *xq)
{
    const fy_block_q8_0_t *b = w;
    return dot_s8s8(_mm256_loadu_si256((const __m256i *)b->qs), _mm256_loadu_si256((const __m256i *)xq));
}

static inline __m256i qdot_q4_0(const void *w, const int8_t *xq)
{
    /* q - 8 in [-8, 7]; subtracting 8 * sum(x) afterwards would cancel badly */
    const fy_block_q4_0_t *b = w;
    __m256i q = _mm256_sub_epi8(unpack_nibbles(b->qs), _mm256_set1_epi8(8));
    return dot_s8s8(q, _mm256_loadu_si256((const __m256i *)xq));
}

static inline __m256i qdot_q4_1(const void *wv, const int8_t *xq)
{
    const fy_block_q4_1_t *w = wv;
    return dot_u8s8(unpack_nibbles(w->qs), _mm256_loadu_si256((const __m256i *)xq));
}

/* x = d q blocks (Q8_0, Q4_0, Q5_0, IQ4_NL): the fp16 scale leads each
 * block; with_min (Q4_1, Q5_1): x = d q + m, the fp16 minimum after it,
 * which meets the activation through its per-block sums s.  Inlined with
 * constant arguments, so each type gets its own loop. */
static inline __attribute__((always_inline)) float dot_scaled(const void *w, int bytes, const fy_q8a_t *xa, int64_t n,
                                                              __m256i (*qdot)(const void *, const int8_t *),
                                                              bool with_min)
{
    const char *wb = w;
    int64_t nb = n / FY_QK, b = 0;
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (; b + 8 <= nb; b += 8) {
        __m256i p[8];
        for (int j = 0; j < 8; j++) p[j] = qdot(wb + (b + j) * bytes, xa->qs + (b + j) * FY_QK);
        __m256 d, m;
        load_scales8(wb + b * bytes, bytes, &d, with_min ? &m : NULL);
        acc = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_loadu_ps(xa->d + b)), _mm256_cvtepi32_ps(hsum8_epi32(p)), acc);
        if (with_min) accm = _mm256_fmadd_ps(m, _mm256_loadu_ps(xa->s + b), accm);
    }
    float tail_m = 0.0f;
    __m256 tail = _mm256_setzero_ps();
    for (; b < nb; b++) {
        uint16_t dm[2] = {0, 0};
        memcpy(dm, wb + b * bytes, with_min ? 4 : 2);
        tail = _mm256_fmadd_ps(_mm256_set1_ps(h2f(dm[0]) * xa->d[b]),
                               _mm256_cvtepi32_ps(qdot(wb + b * bytes, xa->qs + b * FY_QK)), tail);
        if (with_min) tail_m += h2f(dm[1]) * xa->s[b];
    }
    return with_min ? hsum(acc) + hsum(accm) + hsum(tail) + tail_m : hsum(acc) + hsum(tail);
}

static float dot_q8_0(const void *w, const void *x, int64_t n)
{
    return dot_scaled(w, Q8_0_BYTES, x, n, qdot_q8_0, false);
}
static float dot_q4_0(const void *w, const void *x, int64_t n)
{
    return dot_scaled(w, Q4_0_BYTES, x, n, qdot_q4_0, false);
}

static float dot_q4_1(const void *w, const void *x, int64_t n)
{
    return dot_scaled(w, Q4_1_BYTES, x, n, qdot_q4_1, true);
}

/* ---- Q5_0, Q5_1, IQ4_NL: 32-element blocks ------------------------------------------------ */

#define Q5_0_BYTES ((int)sizeof(fy_block_q5_0_t))
#define Q5_1_BYTES ((int)sizeof(fy_block_q5_1_t))
#define IQ4_NL_BYTES ((int)sizeof(fy_block_iq4_nl_t))

/* bit i of the 32 at p -> byte i: 0xff where set, 0 where clear */
static inline __m256i bits_to_bytes(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    const __m256i shuf =
        _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303);
    __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)v), shuf);
    const __m256i bit = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe); /* all ones but bit i % 8 of byte i */
    return _mm256_cmpeq_epi8(_mm256_or_si256(bytes, bit), _mm256_set1_epi64x(-1));
}

static inline __m256i qdot_q5_0(const void *w, const int8_t *xq)
{
    /* q - 16 in [-16, 15]: the low nibble, or'ed with 0xf0 (-16) where the fifth bit is clear */
    const fy_block_q5_0_t *b = w;
    __m256i q =
        _mm256_or_si256(unpack_nibbles(b->qs), _mm256_andnot_si256(bits_to_bytes(b->qh), _mm256_set1_epi8((char)0xf0)));
    return dot_s8s8(q, _mm256_loadu_si256((const __m256i *)xq));
}

static inline __m256i qdot_iq4_nl(const void *w, const int8_t *xq)
{
    const fy_block_iq4_nl_t *b = w;
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)fy_iq4nl_values));
    __m256i q = _mm256_shuffle_epi8(lut, unpack_nibbles(b->qs));
    return dot_s8s8(q, _mm256_loadu_si256((const __m256i *)xq));
}

static float dot_q5_0(const void *w, const void *x, int64_t n)
{
    return dot_scaled(w, Q5_0_BYTES, x, n, qdot_q5_0, false);
}
static float dot_iq4_nl(const void *w, const void *x, int64_t n)
{
    return dot_scaled(w, IQ4_NL_BYTES, x, n, qdot_iq4_nl, false);
}

static inline __m256i qdot_q5_1(const void *wv, const int8_t *xq)
{
    const fy_block_q5_1_t *w = wv;
    __m256i q = _mm256_or_si256(unpack_nibbles(w->qs), _mm256_and_si256(bits_to_bytes(w->qh), _mm256_set1_epi8(0x10)));
    return dot_u8s8(q, _mm256_loadu_si256((const __m256i *)xq));
}

static float dot_q5_1(const void *w, const void *x, int64_t n)
{
    return dot_scaled(w, Q5_1_BYTES, x, n, qdot_q5_1, true);
}

/* ---- K-quants: a super-block is 8 activation blocks ----------------------------------------
 *
 * Each activation block has its own scale, so the 8 integer block sums of
 * a super-block are reduced to one vector and scaled by 8 floats at once,
 * as the 32-element types do in groups of 8 blocks: d * sc[j] * x.d[j]
 * (scales per 32) or d * x.d[j] with the per-16 scales folded into the
 * integer sums by the 16-bit multiply-add that pairs the bytes anyway.
 */

/* Q4_K/Q5_K: the 8 6-bit scales and the 8 minimums as floats (ggml's
 * utmp unpacking: four 32-bit words of 8-bit values) */
static inline void k4_scales(const uint8_t *packed, __m256 *sc, __m256 *m)
{
    uint32_t u[4];
    memcpy(u, packed, 12);
    u[3] = ((u[2] >> 4) & 0x0f0f0f0f) | (((u[1] >> 6) & 0x03030303) << 4);
    uint32_t mins_lo = u[1] & 0x3f3f3f3f;
    u[1] = (u[2] & 0x0f0f0f0f) | (((u[0] >> 6) & 0x03030303) << 4);
    u[2] = mins_lo;
    u[0] &= 0x3f3f3f3f;
    __m128i v = _mm_setr_epi32((int)u[0], (int)u[1], (int)u[2], (int)u[3]);
    *sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
    *m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)));
}

/* bit j of each of 32 bytes, moved to bit `to` (0 elsewhere) */
static inline __m256i bit_to(__m256i v, int j, int to)
{
    __m256i b = _mm256_and_si256(v, _mm256_set1_epi8((char)(1 << j)));
    return j > to ? _mm256_srli_epi16(b, j - to) : _mm256_slli_epi16(b, to - j);
}

static inline __attribute__((always_inline)) float dot_k45(const void *w, int64_t n, const fy_q8a_t *xa, bool q5)
{
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    const __m256i low = _mm256_set1_epi8(0x0f);
    for (int64_t i = 0; i < n / FY_QK_K; i++) {
        const fy_block_q4_k_t *b4 = (const fy_block_q4_k_t *)w + i;
        const fy_block_q5_k_t *b5 = (const fy_block_q5_k_t *)w + i;
        const uint8_t *qs = q5 ? b5->qs : b4->qs;
        const int8_t *xq = xa->qs + i * FY_QK_K;
        __m256i hb = q5 ? _mm256_loadu_si256((const __m256i *)b5->qh) : _mm256_setzero_si256();
        __m256i p[8];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
            __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
            if (q5) {
                lo = _mm256_or_si256(lo, bit_to(hb, 2 * j, 4));
                hi = _mm256_or_si256(hi, bit_to(hb, 2 * j + 1, 4));
            }
            p[2 * j] = dot_u8s8(lo, _mm256_loadu_si256((const __m256i *)(xq + 64 * j)));
            p[2 * j + 1] = dot_u8s8(hi, _mm256_loadu_si256((const __m256i *)(xq + 64 * j + 32)));
        }
        __m256 sc, m;
        k4_scales(q5 ? b5->scales : b4->scales, &sc, &m);
        __m256 d = _mm256_set1_ps(h2f(q5 ? b5->d : b4->d)), dmin = _mm256_set1_ps(h2f(q5 ? b5->dmin : b4->dmin));
        __m256 ws = _mm256_mul_ps(_mm256_mul_ps(d, sc), _mm256_loadu_ps(xa->d + 8 * i));
        acc = _mm256_fmadd_ps(ws, _mm256_cvtepi32_ps(hsum8_epi32(p)), acc);
        accm = _mm256_fmadd_ps(_mm256_mul_ps(dmin, m), _mm256_loadu_ps(xa->s + 8 * i), accm);
    }
    return hsum(acc) - hsum(accm);
}

static float dot_q4_k(const void *w, const void *x, int64_t n) { return dot_k45(w, n, x, false); }
static float dot_q5_k(const void *w, const void *x, int64_t n) { return dot_k45(w, n, x, true); }

/* 16 8-bit scales s -> per 32-element block j, 16 int16: s[2j] in the
 * low half (elements 0..15), s[2j + 1] in the high half */
static inline __m256i scales16_for(__m128i s, int j)
{
    const __m128i idx = _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(s, _mm_add_epi8(idx, _mm_set1_epi8((char)(2 * j)))));
}

/* sum over a block of signed q (|q| <= 32) times x, each 16 weighted by
 * its scale (|sc| <= 128): 8 int32 lanes, exact */
static inline __m256i dot_s8s8_scaled(__m256i q, const int8_t *xq, __m256i sc16)
{
    __m256i x = _mm256_loadu_si256((const __m256i *)xq);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(x, q)), sc16);
}

static float dot_q6_k(const void *w, const void *x, int64_t n)
{
    const fy_block_q6_k_t *wb = w;
    const fy_q8a_t *xa = x;
    const __m256i low = _mm256_set1_epi8(0x0f), b45 = _mm256_set1_epi8(0x30), off = _mm256_set1_epi8(32);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / FY_QK_K; i++) {
        const int8_t *xq = xa->qs + i * FY_QK_K;
        __m128i sc = _mm_loadu_si128((const __m128i *)wb[i].scales);
        __m256i p[8];
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256i l0 = _mm256_loadu_si256((const __m256i *)(wb[i].ql + 64 * h));
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(wb[i].ql + 64 * h + 32));
            __m256i qh = _mm256_loadu_si256((const __m256i *)(wb[i].qh + 32 * h));
            __m256i q0 = _mm256_or_si256(_mm256_and_si256(l0, low), _mm256_and_si256(_mm256_slli_epi16(qh, 4), b45));
            __m256i q1 = _mm256_or_si256(_mm256_and_si256(l1, low), _mm256_and_si256(_mm256_slli_epi16(qh, 2), b45));
            __m256i q2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low), _mm256_and_si256(qh, b45));
            __m256i q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low),
                                         _mm256_and_si256(_mm256_srli_epi16(qh, 2), b45));
            p[4 * h + 0] = dot_s8s8_scaled(_mm256_sub_epi8(q0, off), xq + 128 * h, scales16_for(sc, 4 * h + 0));
            p[4 * h + 1] = dot_s8s8_scaled(_mm256_sub_epi8(q1, off), xq + 128 * h + 32, scales16_for(sc, 4 * h + 1));
            p[4 * h + 2] = dot_s8s8_scaled(_mm256_sub_epi8(q2, off), xq + 128 * h + 64, scales16_for(sc, 4 * h + 2));
            p[4 * h + 3] = dot_s8s8_scaled(_mm256_sub_epi8(q3, off), xq + 128 * h + 96, scales16_for(sc, 4 * h + 3));
        }
        __m256 ws = _mm256_mul_ps(_mm256_set1_ps(h2f(wb[i].d)), _mm256_loadu_ps(xa->d + 8 * i));
        acc = _mm256_fmadd_ps(ws, _mm256_cvtepi32_ps(hsum8_epi32(p)), acc);
    }
    return hsum(acc);
}

static float dot_q3_k(const void *w, const void *x, int64_t n)
{
    const fy_block_q3_k_t *wb = w;
    const fy_q8a_t *xa = x;
    const __m256i three = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / FY_QK_K; i++) {
        const int8_t *xq = xa->qs + i * FY_QK_K;
        /* the 16 6-bit scales less 32 (ggml's aux unpacking) */
        uint32_t a[3];
        memcpy(a, wb[i].scales, 12);
        __m128i sc = _mm_setr_epi32((int)((a[0] & 0x0f0f0f0f) | (((a[2] >> 0) & 0x03030303) << 4)),
                                    (int)((a[1] & 0x0f0f0f0f) | (((a[2] >> 2) & 0x03030303) << 4)),
                                    (int)(((a[0] >> 4) & 0x0f0f0f0f) | (((a[2] >> 4) & 0x03030303) << 4)),
                                    (int)(((a[1] >> 4) & 0x0f0f0f0f) | (((a[2] >> 6) & 0x03030303) << 4)));
        sc = _mm_sub_epi8(sc, _mm_set1_epi8(32));
        __m256i hm = _mm256_loadu_si256((const __m256i *)wb[i].hmask);
        __m256i p[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(wb[i].qs + 32 * (j / 4)));
            __m256i lo = _mm256_and_si256(_mm256_srli_epi16(v, 2 * (j % 4)), three);
            /* q = low 2 bits, less 4 where the high bit is clear */
            __m256i q = _mm256_sub_epi8(_mm256_or_si256(lo, bit_to(hm, j, 2)), four);
            p[j] = dot_s8s8_scaled(q, xq + 32 * j, scales16_for(sc, j));
        }
        __m256 ws = _mm256_mul_ps(_mm256_set1_ps(h2f(wb[i].d)), _mm256_loadu_ps(xa->d + 8 * i));
        acc = _mm256_fmadd_ps(ws, _mm256_cvtepi32_ps(hsum8_epi32(p)), acc);
    }
    return hsum(acc);
}

static float dot_q2_k(const void *w, const void *x, int64_t n)
{
    const fy_block_q2_k_t *wb = w;
    const fy_q8a_t *xa = x;
    const __m256i three = _mm256_set1_epi8(3), ones = _mm256_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / FY_QK_K; i++) {
        const int8_t *xq = xa->qs + i * FY_QK_K;
        __m128i s = _mm_loadu_si128((const __m128i *)wb[i].scales);
        __m128i sc = _mm_and_si128(s, _mm_set1_epi8(0x0f)),
                mn = _mm_and_si128(_mm_srli_epi16(s, 4), _mm_set1_epi8(0x0f));
        __m256i p[8], pm[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(wb[i].qs + 32 * (j / 4)));
            __m256i q = _mm256_and_si256(_mm256_srli_epi16(v, 2 * (j % 4)), three);
            __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + 32 * j));
            p[j] = _mm256_madd_epi16(_mm256_maddubs_epi16(q, xv), scales16_for(sc, j));
            /* the minimum: its 4-bit multiple of the sums of x per 16 */
            pm[j] = _mm256_madd_epi16(_mm256_maddubs_epi16(ones, xv), scales16_for(mn, j));
        }
        __m256 xd = _mm256_loadu_ps(xa->d + 8 * i);
        acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(h2f(wb[i].d)), xd), _mm256_cvtepi32_ps(hsum8_epi32(p)), acc);
        accm = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(h2f(wb[i].dmin)), xd), _mm256_cvtepi32_ps(hsum8_epi32(pm)),
                               accm);
    }
    return hsum(acc) - hsum(accm);
}

/* ---- packed (x8) matrices ------------------------------------------------------------ */

static inline __m256i bcast4(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/*
 * The gemm kernels take tokens in groups of up to 4 so that each weight
 * chunk is unpacked once per group; each token's arithmetic is one
 * inline function, the same in any group, so results do not depend on
 * the batch.  A lone token (decode) gets its own loop so that the
 * unpacked chunks stay in registers.
 */
#define TOK_GROUP 4
#define PREFETCH_BLOCKS 16 /* blocks ahead (2-3 KiB): about a DRAM latency of streaming */

typedef struct unpacked4 {
    __m256i lo[4], hi[4]; /* columns 4c..4c+3 and 16+4c..16+4c+3 of 8 rows */
} unpacked4_t;

static inline void unpack_q4x8(const uint8_t *qs, unpacked4_t *u)
{
    const __m256i mask = _mm256_set1_epi8(0x0f);
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
        u->lo[c] = _mm256_and_si256(v, mask);
        u->hi[c] = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
    }
}

/* sum over the block of quant(row) * x_q, one row per lane; two
 * accumulators so that the dependent dot products form two short chains
 * instead of one of eight (the chain's latency bounded the kernel) */
static inline __m256i isum_q4x8(const unpacked4_t *u, const int8_t *xq)
{
    __m256i a = _mm256_setzero_si256(), b = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        a = DPBUSD(a, u->lo[c], bcast4(xq + 4 * c));
        b = DPBUSD(b, u->hi[c], bcast4(xq + 16 + 4 * c));
    }
    return _mm256_add_epi32(a, b);
}

static inline __m256 step_q4_0x8(__m256 acc, const unpacked4_t *u, __m256 dw, const fy_q8a_t *x, int64_t b)
{
    /* quants are q - 8: exact in integers */
    __m256i is = _mm256_sub_epi32(isum_q4x8(u, x->qs + b * FY_QK), _mm256_set1_epi32(8 * x->isum[b]));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(dw, _mm256_set1_ps(x->d[b])), acc);
}

static inline __m256 step_q4_1x8(__m256 acc, const unpacked4_t *u, __m256 dw, __m256 mw, const fy_q8a_t *x, int64_t b)
{
    /* x = d q + m:  d d_x sum(q x_q) + m d_x sum(x_q) */
    __m256i is = isum_q4x8(u, x->qs + b * FY_QK);
    __m256 a = _mm256_fmadd_ps(mw, _mm256_set1_ps(x->s[b]), acc);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(dw, _mm256_set1_ps(x->d[b])), a);
}

static inline __m256 step_q8_0x8(__m256 acc, const int8_t *qs, __m256 dw, const fy_q8a_t *x, int64_t b)
{
    const int8_t *xq = x->qs + b * FY_QK;
    /* four accumulators: short dependency chains (a loop over an array of
     * them kept them in memory; spelled out they stay in registers) */
#if FY_X86_VNNI
    /* w + 128 is unsigned; subtract 128 sum(x) after */
    const __m256i flip = _mm256_set1_epi8((char)0x80);
#define Q8_DOT(acc, c)                                                                                                 \
    DPBUSD(acc, _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(qs + 32 * (c))), flip), bcast4(xq + 4 * (c)))
#else
#define Q8_DOT(acc, c)                                                                                                 \
    DPBUSD(acc,                                                                                                        \
           _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(qs + 32 * (c))),                                      \
                            _mm256_loadu_si256((const __m256i *)(qs + 32 * (c)))),                                     \
           _mm256_sign_epi8(bcast4(xq + 4 * (c)), _mm256_loadu_si256((const __m256i *)(qs + 32 * (c)))))
#endif
    __m256i c0 = Q8_DOT(_mm256_setzero_si256(), 0), c1 = Q8_DOT(_mm256_setzero_si256(), 1);
    __m256i c2 = Q8_DOT(_mm256_setzero_si256(), 2), c3 = Q8_DOT(_mm256_setzero_si256(), 3);
    c0 = Q8_DOT(c0, 4), c1 = Q8_DOT(c1, 5), c2 = Q8_DOT(c2, 6), c3 = Q8_DOT(c3, 7);
#undef Q8_DOT
    __m256i is = _mm256_add_epi32(_mm256_add_epi32(c0, c1), _mm256_add_epi32(c2, c3));
#if FY_X86_VNNI
    is = _mm256_sub_epi32(is, _mm256_set1_epi32(128 * x->isum[b]));
#endif
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(dw, _mm256_set1_ps(x->d[b])), acc);
}

static inline __m256 load_h8(const uint16_t *h) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h)); }

/*
 * Each token accumulates even and odd blocks separately and adds the two
 * at the end: two independent chains of dependent multiply-adds instead of
 * one (the single chain bounded the decode kernel).  The single-token and
 * grouped paths do the same arithmetic.
 */
static void gemm_q4_0x8(const void *w, int64_t nb, const fy_q8a_t *x, int n_tok, float *y, int64_t ldy)
{
    const fy_block_q4_0x8_t *wb = w;
    unpacked4_t u;
    if (n_tok == 1) {
        __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int64_t b = 0; b < nb; b++) {
            _mm_prefetch((const char *)(wb + b + PREFETCH_BLOCKS), _MM_HINT_T0);
            unpack_q4x8(wb[b].qs, &u);
            acc[b & 1] = step_q4_0x8(acc[b & 1], &u, load_h8(wb[b].d), x, b);
        }
        _mm256_storeu_ps(y, _mm256_add_ps(acc[0], acc[1]));
        return;
    }
    for (int t0 = 0; t0 < n_tok; t0 += TOK_GROUP) {
        int nt = n_tok - t0 < TOK_GROUP ? n_tok - t0 : TOK_GROUP;
        __m256 acc[TOK_GROUP][2];
        for (int t = 0; t < nt; t++) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            unpack_q4x8(wb[b].qs, &u);
            __m256 dw = load_h8(wb[b].d);
            for (int t = 0; t < nt; t++) acc[t][b & 1] = step_q4_0x8(acc[t][b & 1], &u, dw, &x[t0 + t], b);
        }
        for (int t = 0; t < nt; t++) _mm256_storeu_ps(y + (t0 + t) * ldy, _mm256_add_ps(acc[t][0], acc[t][1]));
    }
}

static void gemm_q4_1x8(const void *w, int64_t nb, const fy_q8a_t *x, int n_tok, float *y, int64_t ldy)
{
    const fy_block_q4_1x8_t *wb = w;
    unpacked4_t u;
    if (n_tok == 1) {
        __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int64_t b = 0; b < nb; b++) {
            _mm_prefetch((const char *)(wb + b + PREFETCH_BLOCKS), _MM_HINT_T0);
            unpack_q4x8(wb[b].qs, &u);
            acc[b & 1] = step_q4_1x8(acc[b & 1], &u, load_h8(wb[b].d), load_h8(wb[b].m), x, b);
        }
        _mm256_storeu_ps(y, _mm256_add_ps(acc[0], acc[1]));
        return;
    }
    for (int t0 = 0; t0 < n_tok; t0 += TOK_GROUP) {
        int nt = n_tok - t0 < TOK_GROUP ? n_tok - t0 : TOK_GROUP;
        __m256 acc[TOK_GROUP][2];
        for (int t = 0; t < nt; t++) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            unpack_q4x8(wb[b].qs, &u);
            __m256 dw = load_h8(wb[b].d), mw = load_h8(wb[b].m);
            for (int t = 0; t < nt; t++) acc[t][b & 1] = step_q4_1x8(acc[t][b & 1], &u, dw, mw, &x[t0 + t], b);
        }
        for (int t = 0; t < nt; t++) _mm256_storeu_ps(y + (t0 + t) * ldy, _mm256_add_ps(acc[t][0], acc[t][1]));
    }
}

static void gemm_q8_0x8(const void *w, int64_t nb, const fy_q8a_t *x, int n_tok, float *y, int64_t ldy)
{
    const fy_block_q8_0x8_t *wb = w;
    for (int t0 = 0; t0 < n_tok; t0 += TOK_GROUP) {
        int nt = n_tok - t0 < TOK_GROUP ? n_tok - t0 : TOK_GROUP;
        __m256 acc[TOK_GROUP][2];
        for (int t = 0; t < nt; t++) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            _mm_prefetch((const char *)(wb + b + PREFETCH_BLOCKS / 2), _MM_HINT_T0);
            __m256 dw = load_h8(wb[b].d);
            for (int t = 0; t < nt; t++) acc[t][b & 1] = step_q8_0x8(acc[t][b & 1], wb[b].qs, dw, &x[t0 + t], b);
        }
        for (int t = 0; t < nt; t++) _mm256_storeu_ps(y + (t0 + t) * ldy, _mm256_add_ps(acc[t][0], acc[t][1]));
    }
}

/* ---- packed Q5_0, Q5_1, IQ4_NL ------------------------------------------------------------ */

/* the fifth bits of unpacked chunk s (lo[s] for s < 4, hi[s - 4] after),
 * at bit 4 of each byte (fy_block_q5_0x8_t) */
static inline void add_fifth_bits(unpacked4_t *u, const uint8_t *qh)
{
    const __m256i p = _mm256_loadu_si256((const __m256i *)qh), b4 = _mm256_set1_epi8(0x10);
    u->lo[0] = _mm256_or_si256(u->lo[0], _mm256_and_si256(_mm256_slli_epi16(p, 4), b4));
    u->lo[1] = _mm256_or_si256(u->lo[1], _mm256_and_si256(_mm256_slli_epi16(p, 3), b4));
    u->lo[2] = _mm256_or_si256(u->lo[2], _mm256_and_si256(_mm256_slli_epi16(p, 2), b4));
    u->lo[3] = _mm256_or_si256(u->lo[3], _mm256_and_si256(_mm256_slli_epi16(p, 1), b4));
    u->hi[0] = _mm256_or_si256(u->hi[0], _mm256_and_si256(p, b4));
    u->hi[1] = _mm256_or_si256(u->hi[1], _mm256_and_si256(_mm256_srli_epi16(p, 1), b4));
    u->hi[2] = _mm256_or_si256(u->hi[2], _mm256_and_si256(_mm256_srli_epi16(p, 2), b4));
    u->hi[3] = _mm256_or_si256(u->hi[3], _mm256_and_si256(_mm256_srli_epi16(p, 3), b4));
}

static inline __m256 step_q5_0x8(__m256 acc, const unpacked4_t *u, __m256 dw, const fy_q8a_t *x, int64_t b)
{
    /* quants are q + 16 in [0, 31]: 16 sum(x) taken off, exact in integers */
    __m256i is = _mm256_sub_epi32(isum_q4x8(u, x->qs + b * FY_QK), _mm256_set1_epi32(16 * x->isum[b]));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(dw, _mm256_set1_ps(x->d[b])), acc);
}

/* IQ4_NL through its table: with VNNI the levels plus 128 (unsigned; 128
 * sum(x) taken off after), without it |level| and the sign moved onto x, so
 * that maddubs's 16-bit pair sums cannot saturate */
static inline void iq4_levels(unpacked4_t *u)
{
#if FY_X86_VNNI
    const __m256i lut =
        _mm256_setr_epi8(1, 24, 45, 63, 79, 93, 106, 118, (char)129, (char)141, (char)153, (char)166, (char)181,
                         (char)197, (char)217, (char)241, 1, 24, 45, 63, 79, 93, 106, 118, (char)129, (char)141,
                         (char)153, (char)166, (char)181, (char)197, (char)217, (char)241);
#else
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)fy_iq4nl_values));
#endif
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        u->lo[c] = _mm256_shuffle_epi8(lut, u->lo[c]);
        u->hi[c] = _mm256_shuffle_epi8(lut, u->hi[c]);
    }
}

static inline __m256 step_iq4_nlx8(__m256 acc, const unpacked4_t *u, __m256 dw, const fy_q8a_t *x, int64_t b)
{
    const int8_t *xq = x->qs + b * FY_QK;
#if FY_X86_VNNI
    __m256i is = _mm256_sub_epi32(isum_q4x8(u, xq), _mm256_set1_epi32(128 * x->isum[b]));
#else
    __m256i a = _mm256_setzero_si256(), bb = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        a = DPBUSD(a, _mm256_sign_epi8(u->lo[c], u->lo[c]), _mm256_sign_epi8(bcast4(xq + 4 * c), u->lo[c]));
        bb = DPBUSD(bb, _mm256_sign_epi8(u->hi[c], u->hi[c]), _mm256_sign_epi8(bcast4(xq + 16 + 4 * c), u->hi[c]));
    }
    __m256i is = _mm256_add_epi32(a, bb);
#endif
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(dw, _mm256_set1_ps(x->d[b])), acc);
}

/*
 * The 32-element packed types, one block at a time: `prep` unpacks block
 * b (and loads its scales) once for all tokens of the group, `step` adds
 * one token's share.  A lone token is its own instance (nt = 1 known to
 * the compiler) so that its state stays in registers; the arithmetic is
 * the same either way.
 */
#define GEMM_X8_32(name, block_t, PREP, STEP)                                                                          \
    static inline __attribute__((always_inline)) void name##_tokens(const block_t *wb, int64_t nb, const fy_q8a_t *x,  \
                                                                    int nt, float *y, int64_t ldy)                     \
    {                                                                                                                  \
        __m256 acc[TOK_GROUP][2];                                                                                      \
        for (int t = 0; t < nt; t++) acc[t][0] = acc[t][1] = _mm256_setzero_ps();                                      \
        for (int64_t b = 0; b < nb; b++) {                                                                             \
            unpacked4_t u;                                                                                             \
            __m256 dw, mw;                                                                                             \
            if (nt == 1) _mm_prefetch((const char *)(wb + b + PREFETCH_BLOCKS), _MM_HINT_T0);                          \
            PREP;                                                                                                      \
            (void)mw;                                                                                                  \
            for (int t = 0; t < nt; t++) acc[t][b & 1] = STEP;                                                         \
        }                                                                                                              \
        for (int t = 0; t < nt; t++) _mm256_storeu_ps(y + t * ldy, _mm256_add_ps(acc[t][0], acc[t][1]));               \
    }                                                                                                                  \
    static void name(const void *w, int64_t nb, const fy_q8a_t *x, int n_tok, float *y, int64_t ldy)                   \
    {                                                                                                                  \
        if (n_tok == 1) {                                                                                              \
            name##_tokens(w, nb, x, 1, y, ldy);                                                                        \
            return;                                                                                                    \
        }                                                                                                              \
        for (int t0 = 0; t0 < n_tok; t0 += TOK_GROUP)                                                                  \
            name##_tokens(w, nb, x + t0, n_tok - t0 < TOK_GROUP ? n_tok - t0 : TOK_GROUP, y + t0 * ldy, ldy);          \
    }

GEMM_X8_32(gemm_q5_0x8, fy_block_q5_0x8_t,
           (unpack_q4x8(wb[b].qs, &u), add_fifth_bits(&u, wb[b].qh), dw = load_h8(wb[b].d), mw = dw),
           step_q5_0x8(acc[t][b & 1], &u, dw, &x[t], b))
GEMM_X8_32(gemm_q5_1x8, fy_block_q5_1x8_t,
           (unpack_q4x8(wb[b].qs, &u), add_fifth_bits(&u, wb[b].qh), dw = load_h8(wb[b].d), mw = load_h8(wb[b].m)),
           step_q4_1x8(acc[t][b & 1], &u, dw, mw, &x[t], b))
GEMM_X8_32(gemm_iq4_nlx8, fy_block_iq4_nlx8_t,
           (unpack_q4x8(wb[b].qs, &u), iq4_levels(&u), dw = load_h8(wb[b].d), mw = dw),
           step_iq4_nlx8(acc[t][b & 1], &u, dw, &x[t], b))
#undef GEMM_X8_32

/* ---- packed K-quants ------------------------------------------------------------------------
 *
 * One super-block of 8 rows at a time.  Its quants are unpacked one
 * activation block (32 columns x 8 rows, 8 vectors) at a time into
 * registers for a lone token, or once for a group of tokens; each token's
 * 8 integer dots accumulate per row (lane) and become one float
 * multiply-add per activation block with that block's scales, computed
 * once per super-block for all tokens.
 */
#define K_PREFETCH 2048 /* bytes ahead: about a DRAM latency of streaming */

/* the `lines` cache lines from p (spelled out: GCC dropped a loop of prefetches) */
static inline __attribute__((always_inline)) void prefetch_lines(const char *p, int lines)
{
#pragma GCC unroll 8
    for (int l = 0; l < lines; l++) _mm_prefetch(p + 64 * l, _MM_HINT_T0);
}

/* byte j of each 32-bit lane, unsigned, as float */
static inline __m256 lane_u8f(__m256i v, int j)
{
    return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v, 8 * j), _mm256_set1_epi32(0xff)));
}

/* 8 bytes (one per row) as int32 lanes */
static inline __m256i load_s8x8(const int8_t *p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)); }

/* sum over the 32 columns of q (8 chunks of 4, row r in lane r) times
 * one token's 32 quants: columns 0..15 in *a0, 16..31 in *a1 */
static inline void isum_x8_halves(const __m256i *q, const int8_t *xq, __m256i *a0, __m256i *a1)
{
    __m256i p0 = _mm256_setzero_si256(), p1 = _mm256_setzero_si256();
    __m256i p2 = _mm256_setzero_si256(), p3 = _mm256_setzero_si256();
    p0 = DPBUSD(p0, q[0], bcast4(xq + 0)), p1 = DPBUSD(p1, q[1], bcast4(xq + 4));
    p2 = DPBUSD(p2, q[4], bcast4(xq + 16)), p3 = DPBUSD(p3, q[5], bcast4(xq + 20));
    p0 = DPBUSD(p0, q[2], bcast4(xq + 8)), p1 = DPBUSD(p1, q[3], bcast4(xq + 12));
    p2 = DPBUSD(p2, q[6], bcast4(xq + 24)), p3 = DPBUSD(p3, q[7], bcast4(xq + 28));
    *a0 = _mm256_add_epi32(p0, p1);
    *a1 = _mm256_add_epi32(p2, p3);
}

static inline __m256i isum_x8(const __m256i *q, const int8_t *xq)
{
    __m256i a0, a1;
    isum_x8_halves(q, xq, &a0, &a1);
    return _mm256_add_epi32(a0, a1);
}

/* Q4_K/Q5_K's scales and minimums of 8 rows: bytes 0..3 of lane r in
 * s[0] are row r's scales 0..3, s[1] scales 4..7, m[0], m[1] minimums
 * (ggml's unpacking of the 12 bytes, on 8 rows at once) */
static inline void k4_scales8(const uint32_t (*w)[8], __m256i *s, __m256i *m)
{
    const __m256i u0 = _mm256_loadu_si256((const __m256i *)w[0]), u1 = _mm256_loadu_si256((const __m256i *)w[1]);
    const __m256i u2 = _mm256_loadu_si256((const __m256i *)w[2]);
    const __m256i k6 = _mm256_set1_epi32(0x3f3f3f3f), k4 = _mm256_set1_epi32(0x0f0f0f0f);
    const __m256i k2 = _mm256_set1_epi32(0x03030303);
    s[0] = _mm256_and_si256(u0, k6);
    m[0] = _mm256_and_si256(u1, k6);
    s[1] =
        _mm256_or_si256(_mm256_and_si256(u2, k4), _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u0, 6), k2), 4));
    m[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u2, 4), k4),
                           _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u1, 6), k2), 4));
}

static inline __attribute__((always_inline)) void gemm_k45_tokens(const void *w, int64_t nsb, const fy_q8a_t *x, int nt,
                                                                  float *y, int64_t ldy, bool q5)
{
    const __m256i low = _mm256_set1_epi8(0x0f);
    const size_t sb_bytes = q5 ? sizeof(fy_block_q5_kx8_t) : sizeof(fy_block_q4_kx8_t);
    __m256 acc[TOK_GROUP][2], accm[TOK_GROUP];
    for (int t = 0; t < nt; t++) acc[t][0] = acc[t][1] = accm[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nsb; i++) {
        const fy_block_q4_kx8_t *b4 = (const fy_block_q4_kx8_t *)w + i;
        const fy_block_q5_kx8_t *b5 = (const fy_block_q5_kx8_t *)w + i;
        __m256i s[2], m[2];
        k4_scales8(q5 ? b5->scales : b4->scales, s, m);
        const __m256 d = load_h8(q5 ? b5->d : b4->d), dmin = load_h8(q5 ? b5->dmin : b4->dmin);
#pragma GCC unroll 4
        for (int j2 = 0; j2 < 4; j2++) {
            const uint8_t(*qs)[32] = q5 ? b5->qs[j2] : b4->qs[j2];
            /* a quarter of the super-block (288 or 352 bytes), K_PREFETCH bytes ahead */
            if (nt == 1)
                prefetch_lines((const char *)w + (size_t)i * sb_bytes + K_PREFETCH + j2 * (sb_bytes / 4), q5 ? 6 : 5);
            __m256i lo[8], hi[8];
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) {
                __m256i v = _mm256_loadu_si256((const __m256i *)qs[c]);
                lo[c] = _mm256_and_si256(v, low);
                hi[c] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
                if (q5) {
                    __m256i h = _mm256_loadu_si256((const __m256i *)b5->qh[c]);
                    lo[c] = _mm256_or_si256(lo[c], bit_to(h, 2 * j2, 4));
                    hi[c] = _mm256_or_si256(hi[c], bit_to(h, 2 * j2 + 1, 4));
                }
            }
            const int jb = 2 * (j2 % 2);
            const __m256 dsc0 = _mm256_mul_ps(d, lane_u8f(s[j2 / 2], jb));
            const __m256 dsc1 = _mm256_mul_ps(d, lane_u8f(s[j2 / 2], jb + 1));
            const __m256 dm0 = _mm256_mul_ps(dmin, lane_u8f(m[j2 / 2], jb));
            const __m256 dm1 = _mm256_mul_ps(dmin, lane_u8f(m[j2 / 2], jb + 1));
            const int64_t j = 8 * i + 2 * j2; /* activation block of the low nibbles */
            for (int t = 0; t < nt; t++) {
                const fy_q8a_t *xt = &x[t];
                __m256i il = isum_x8(lo, xt->qs + j * FY_QK), ih = isum_x8(hi, xt->qs + (j + 1) * FY_QK);
                acc[t][0] =
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(il), _mm256_mul_ps(dsc0, _mm256_set1_ps(xt->d[j])), acc[t][0]);
                acc[t][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ih), _mm256_mul_ps(dsc1, _mm256_set1_ps(xt->d[j + 1])),
                                            acc[t][1]);
                accm[t] = _mm256_fmadd_ps(dm0, _mm256_set1_ps(xt->s[j]), accm[t]);
                accm[t] = _mm256_fmadd_ps(dm1, _mm256_set1_ps(xt->s[j + 1]), accm[t]);
            }
        }
    }
    for (int t = 0; t < nt; t++)
        _mm256_storeu_ps(y + t * ldy, _mm256_sub_ps(_mm256_add_ps(acc[t][0], acc[t][1]), accm[t]));
}

typedef enum { K16_Q6, K16_Q3, K16_Q2 } k16_kind_t;

/* Chunk c (columns 4 c .. 4 c + 3) of sub-blocks 4 h .. 4 h + 3, as
 * unsigned quants: Q6_K q + 32 (0..63), Q3_K q + 4 (0..7), Q2_K q (0..3) */
static inline void q6_chunk4(const fy_block_q6_kx8_t *b, int h, int c, __m256i *q)
{
    const __m256i low = _mm256_set1_epi8(0x0f), b45 = _mm256_set1_epi8(0x30);
    const __m256i la = _mm256_loadu_si256((const __m256i *)b->q[h][c][0]);
    const __m256i lb = _mm256_loadu_si256((const __m256i *)b->q[h][c][1]);
    const __m256i qh = _mm256_loadu_si256((const __m256i *)b->q[h][c][2]);
    q[0] = _mm256_or_si256(_mm256_and_si256(la, low), _mm256_and_si256(_mm256_slli_epi16(qh, 4), b45));
    q[1] = _mm256_or_si256(_mm256_and_si256(lb, low), _mm256_and_si256(_mm256_slli_epi16(qh, 2), b45));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(la, 4), low), _mm256_and_si256(qh, b45));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lb, 4), low),
                           _mm256_and_si256(_mm256_srli_epi16(qh, 2), b45));
}

/* chunk c of all 8 sub-blocks: Q3_K q + 4 (0..7), Q2_K q (0..3) */
static inline void q3_chunk8(const fy_block_q3_kx8_t *b, int c, __m256i *q)
{
    const __m256i seven = _mm256_set1_epi8(7), three = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
    const __m256i b0 = _mm256_loadu_si256((const __m256i *)b->q[c][0]);
    const __m256i b1 = _mm256_loadu_si256((const __m256i *)b->q[c][1]);
    const __m256i b2 = _mm256_loadu_si256((const __m256i *)b->q[c][2]);
    q[0] = _mm256_and_si256(b0, seven);
    q[2] = _mm256_and_si256(b1, seven);
    q[4] = _mm256_and_si256(b2, seven);
#if FY_X86_VNNI /* masked in place: 8 (q + 4), see k16_shift */
    const __m256i seven3 = _mm256_set1_epi8(7 << 3);
    q[1] = _mm256_and_si256(b0, seven3);
    q[3] = _mm256_and_si256(b1, seven3);
    q[5] = _mm256_and_si256(b2, seven3);
#else
    q[1] = _mm256_and_si256(_mm256_srli_epi16(b0, 3), seven);
    q[3] = _mm256_and_si256(_mm256_srli_epi16(b1, 3), seven);
    q[5] = _mm256_and_si256(_mm256_srli_epi16(b2, 3), seven);
#endif
    q[6] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b0, 6), three),
                           _mm256_and_si256(_mm256_srli_epi16(b2, 4), four));
    q[7] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b1, 6), three),
                           _mm256_and_si256(_mm256_srli_epi16(b2, 5), four));
}

static inline void q2_chunk8(const fy_block_q2_kx8_t *b, int c, __m256i *q)
{
    const __m256i three = _mm256_set1_epi8(3);
    for (int h = 0; h < 2; h++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)b->qs[c][h]);
#if FY_X86_VNNI /* masked in place: 4^t q, see k16_shift */
        q[4 * h] = _mm256_and_si256(v, three);
        q[4 * h + 1] = _mm256_and_si256(v, _mm256_set1_epi8(3 << 2));
        q[4 * h + 2] = _mm256_and_si256(v, _mm256_set1_epi8(3 << 4));
        q[4 * h + 3] = _mm256_and_si256(v, _mm256_set1_epi8((char)(3 << 6)));
#else
        q[4 * h] = _mm256_and_si256(v, three);
        q[4 * h + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 2), three);
        q[4 * h + 2] = _mm256_and_si256(_mm256_srli_epi16(v, 4), three);
        q[4 * h + 3] = _mm256_and_si256(_mm256_srli_epi16(v, 6), three);
#endif
    }
}

/*
 * With VNNI's byte dots (no 16-bit intermediate to saturate) the 2- and
 * 3-bit quants of some sub-blocks are masked where they lie instead of
 * shifted down, saving an operation per vector: their dots come out times
 * 2^k16_shift, exactly, and are shifted back (exact: a multiple) before use.
 */
static inline int k16_shift(k16_kind_t kind, int k)
{
#if FY_X86_VNNI
    if (kind == K16_Q2) return 2 * (k % 4);
    if (kind == K16_Q3) return k == 1 || k == 3 || k == 5 ? 3 : 0;
#else
    (void)kind, (void)k;
#endif
    return 0;
}

/* Q3_K's 16 scales of 8 rows, less 32: bytes 0..3 of lane r in w[q] are
 * row r's scales 4 q .. 4 q + 3 (ggml's aux unpacking on 8 rows) */
static inline void k3_scales8(const uint32_t (*s)[8], __m256i *w)
{
    const __m256i a0 = _mm256_loadu_si256((const __m256i *)s[0]), a1 = _mm256_loadu_si256((const __m256i *)s[1]);
    const __m256i a2 = _mm256_loadu_si256((const __m256i *)s[2]);
    const __m256i k4 = _mm256_set1_epi32(0x0f0f0f0f), k2 = _mm256_set1_epi32(0x03030303);
    const __m256i off = _mm256_set1_epi8(32);
    w[0] = _mm256_or_si256(_mm256_and_si256(a0, k4), _mm256_slli_epi32(_mm256_and_si256(a2, k2), 4));
    w[1] =
        _mm256_or_si256(_mm256_and_si256(a1, k4), _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(a2, 2), k2), 4));
    w[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(a0, 4), k4),
                           _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(a2, 4), k2), 4));
    w[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(a1, 4), k4),
                           _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(a2, 6), k2), 4));
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) w[q] = _mm256_sub_epi8(w[q], off);
}

/* (lo & 0xffff) | hi << 16: two int16 halves of a 32-bit word */
static inline int32_t pair16(int32_t lo, int32_t hi)
{
    return (int32_t)(((uint32_t)lo & 0xffff) | ((uint32_t)hi << 16));
}

/*
 * One token's share of activation block j: a0, a1 the integer dots of
 * columns 0..15 and 16..31 with the stored quants (offset, and for VNNI
 * scaled by 2^sh).  For Q6_K they are multiplied by the two scales (sc[0],
 * sc[1]) as int32.  Q3_K's and Q2_K's fit in 16 bits (|dot| < 2^15), so
 * the pair goes into the two halves of each lane and one 16-bit
 * multiply-add applies both scales (sc[0] holds them as int16 pairs), and
 * Q2_K's minimums (mn[0]) the same way to the pair of activation sums:
 * half the operations of two 32-bit multiplies and their scale unpacking.
 */
static inline __attribute__((always_inline)) void k16_tail(__m256 *acc, __m256 *accm, __m256i a0, __m256i a1,
                                                           const __m256i *sc, const __m256i *mn, __m256 d, __m256 dmin,
                                                           const fy_q8a_t *xt, int64_t j, k16_kind_t kind, int sh)
{
    const int32_t s0 = xt->isum16[2 * j], s1 = xt->isum16[2 * j + 1];
    __m256i is;
    if (sh) {
        a0 = _mm256_srai_epi32(a0, sh);
        a1 = _mm256_srai_epi32(a1, sh);
    }
    if (kind == K16_Q6) {
        a0 = _mm256_sub_epi32(a0, _mm256_set1_epi32(32 * s0));
        a1 = _mm256_sub_epi32(a1, _mm256_set1_epi32(32 * s1));
        is = _mm256_add_epi32(_mm256_mullo_epi32(a0, sc[0]), _mm256_mullo_epi32(a1, sc[1]));
    } else {
        __m256i p = _mm256_blend_epi16(a0, _mm256_slli_epi32(a1, 16), 0xaa);
        if (kind == K16_Q3) p = _mm256_sub_epi16(p, _mm256_set1_epi32(pair16(4 * s0, 4 * s1)));
        is = _mm256_madd_epi16(p, sc[0]);
    }
    const __m256 xd = _mm256_set1_ps(xt->d[j]);
    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(d, xd), *acc);
    if (kind == K16_Q2) {
        __m256i ms = _mm256_madd_epi16(_mm256_set1_epi32(pair16(s0, s1)), mn[0]);
        *accm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ms), _mm256_mul_ps(dmin, xd), *accm);
    }
}

/* sub-block sb's scales of the 8 rows, lane r row r: Q6_K's as two int32
 * vectors (columns 0..15, 16..31), Q3_K's and Q2_K's (and Q2_K's
 * minimums in mn[0]) as one vector of int16 pairs */
static inline __attribute__((always_inline)) void k16_scales(const void *blk, const __m256i *w3, int sb,
                                                             k16_kind_t kind, __m256i *sc, __m256i *mn)
{
    mn[0] = _mm256_setzero_si256();
    if (kind == K16_Q6) {
        const fy_block_q6_kx8_t *b6 = blk;
        sc[0] = load_s8x8(b6->scales[2 * sb]), sc[1] = load_s8x8(b6->scales[2 * sb + 1]);
    } else if (kind == K16_Q3) {
        /* bytes 2 (sb % 2) and 2 (sb % 2) + 1 of each lane to the high bytes of its int16 halves, then
         * shifted down with their sign */
        const char lo = (char)(2 * (sb % 2)), hi = (char)(2 * (sb % 2) + 1), z = (char)0x80;
        const __m256i sh =
            _mm256_setr_epi8(z, lo, z, hi, z, (char)(4 + lo), z, (char)(4 + hi), z, (char)(8 + lo), z, (char)(8 + hi),
                             z, (char)(12 + lo), z, (char)(12 + hi), z, lo, z, hi, z, (char)(4 + lo), z, (char)(4 + hi),
                             z, (char)(8 + lo), z, (char)(8 + hi), z, (char)(12 + lo), z, (char)(12 + hi));
        sc[0] = _mm256_srai_epi16(_mm256_shuffle_epi8(w3[sb / 2], sh), 8);
    } else {
        const fy_block_q2_kx8_t *b2 = blk;
        const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)b2->scales[sb]));
        sc[0] = _mm256_and_si256(v, _mm256_set1_epi16(0x0f));
        mn[0] = _mm256_srli_epi16(v, 4);
    }
}

/* chunk c of the sub-blocks in group g: 4 of them for Q6_K (g = h), all 8
 * for Q3_K and Q2_K (g = 0) */
static inline __attribute__((always_inline)) void k16_chunk(const void *blk, int g, int c, k16_kind_t kind, __m256i *q)
{
    if (kind == K16_Q6)
        q6_chunk4(blk, g, c, q);
    else if (kind == K16_Q3)
        q3_chunk8(blk, c, q);
    else
        q2_chunk8(blk, c, q);
}

/*
 * Q6_K, Q3_K, Q2_K: scales per 16 columns, quants stored with an offset
 * (Q6_K q + 32, Q3_K q + 4; Q2_K's are plain with a minimum).  Each half
 * of an activation block's dot is offset-corrected with that half's sum of
 * x (isum16) and multiplied by its row's scale in integers (exact: under
 * 2^24 in magnitude), then scaled in float once per block.  A lone token
 * takes each chunk's sub-blocks (4 for Q6_K, 8 for the others) into as
 * many pairs of running dots at once, reading the super-block once in
 * order; a group of tokens unpacks them into memory first and runs each
 * token over them.
 */
/* group g (of 8 / per) of super-block i: its sub-blocks' share of every
 * token's sums */
static inline __attribute__((always_inline)) void k16_group(const char *blk, const __m256i *w3, __m256 d, __m256 dmin,
                                                            const fy_q8a_t *x, int nt, int64_t i, int g,
                                                            k16_kind_t kind, __m256 (*acc)[2], __m256 *accm)
{
    const int per = kind == K16_Q6 ? 4 : 8; /* sub-blocks per chunk */
    if (nt == 1) {
        const int8_t *xq = x->qs + (8 * i + per * g) * FY_QK;
        __m256i a[8][2];
#pragma GCC unroll 8
        for (int k = 0; k < per; k++) a[k][0] = a[k][1] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) {
            __m256i q[8];
            /* the share of the super-block this chunk reads, K_PREFETCH bytes ahead */
            prefetch_lines(blk + K_PREFETCH + (8 * g + c) * 128, kind == K16_Q2 ? 1 : 2);
            k16_chunk(blk, g, c, kind, q);
#pragma GCC unroll 8
            for (int k = 0; k < per; k++) a[k][c / 4] = DPBUSD(a[k][c / 4], q[k], bcast4(xq + 32 * k + 4 * c));
        }
#pragma GCC unroll 8
        for (int k = 0; k < per; k++) {
            __m256i sc[2], mn[1];
            k16_scales(blk, w3, per * g + k, kind, sc, mn);
            k16_tail(&acc[0][k & 1], &accm[0], a[k][0], a[k][1], sc, mn, d, dmin, x, 8 * i + per * g + k, kind,
                     k16_shift(kind, k));
        }
        return;
    }
    __m256i qq[8][8]; /* [k][c] */
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++) {
        __m256i q[8];
        k16_chunk(blk, g, c, kind, q);
        for (int k = 0; k < per; k++) qq[k][c] = q[k];
    }
#pragma GCC unroll 8
    for (int k = 0; k < per; k++) {
        __m256i sc[2], mn[1];
        k16_scales(blk, w3, per * g + k, kind, sc, mn);
        const int64_t j = 8 * i + per * g + k; /* activation block */
        for (int t = 0; t < nt; t++) {
            __m256i a0, a1;
            isum_x8_halves(qq[k], x[t].qs + j * FY_QK, &a0, &a1);
            k16_tail(&acc[t][k & 1], &accm[t], a0, a1, sc, mn, d, dmin, &x[t], j, kind, k16_shift(kind, k));
        }
    }
}

static inline __attribute__((always_inline)) void gemm_k16_tokens(const void *w, int64_t nsb, const fy_q8a_t *x, int nt,
                                                                  float *y, int64_t ldy, k16_kind_t kind)
{
    const size_t sb_bytes = kind == K16_Q6   ? sizeof(fy_block_q6_kx8_t)
                            : kind == K16_Q3 ? sizeof(fy_block_q3_kx8_t)
                                             : sizeof(fy_block_q2_kx8_t);
    __m256 acc[TOK_GROUP][2], accm[TOK_GROUP];
    for (int t = 0; t < nt; t++) acc[t][0] = acc[t][1] = accm[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nsb; i++) {
        const char *blk = (const char *)w + (size_t)i * sb_bytes;
        const fy_block_q6_kx8_t *b6 = (const fy_block_q6_kx8_t *)blk;
        const fy_block_q3_kx8_t *b3 = (const fy_block_q3_kx8_t *)blk;
        const fy_block_q2_kx8_t *b2 = (const fy_block_q2_kx8_t *)blk;
        __m256i w3[4];
        if (kind == K16_Q3) k3_scales8(b3->scales, w3);
        const __m256 d = load_h8(kind == K16_Q6 ? b6->d : kind == K16_Q3 ? b3->d : b2->d);
        const __m256 dmin = kind == K16_Q2 ? load_h8(b2->dmin) : d;
        /* Q6_K in two groups of 4 sub-blocks (h), the others in one of 8;
         * spelled out so that g is a constant in each */
        k16_group(blk, w3, d, dmin, x, nt, i, 0, kind, acc, accm);
        if (kind == K16_Q6) k16_group(blk, w3, d, dmin, x, nt, i, 1, kind, acc, accm);
    }
    for (int t = 0; t < nt; t++)
        _mm256_storeu_ps(y + t * ldy, _mm256_sub_ps(_mm256_add_ps(acc[t][0], acc[t][1]), accm[t]));
}

#define GEMM_X8_K(name, BODY)                                                                                          \
    static void name(const void *w, int64_t nb, const fy_q8a_t *x, int n_tok, float *y, int64_t ldy)                   \
    {                                                                                                                  \
        if (n_tok == 1) {                                                                                              \
            BODY(w, nb / 8, x, 1, y, ldy);                                                                             \
            return;                                                                                                    \
        }                                                                                                              \
        for (int t0 = 0; t0 < n_tok; t0 += TOK_GROUP)                                                                  \
            BODY(w, nb / 8, x + t0, n_tok - t0 < TOK_GROUP ? n_tok - t0 : TOK_GROUP, y + t0 * ldy, ldy);               \
    }
#define Q4K_BODY(w, nsb, x, nt, y, ldy) gemm_k45_tokens(w, nsb, x, nt, y, ldy, false)
#define Q5K_BODY(w, nsb, x, nt, y, ldy) gemm_k45_tokens(w, nsb, x, nt, y, ldy, true)
#define Q6K_BODY(w, nsb, x, nt, y, ldy) gemm_k16_tokens(w, nsb, x, nt, y, ldy, K16_Q6)
#define Q3K_BODY(w, nsb, x, nt, y, ldy) gemm_k16_tokens(w, nsb, x, nt, y, ldy, K16_Q3)
#define Q2K_BODY(w, nsb, x, nt, y, ldy) gemm_k16_tokens(w, nsb, x, nt, y, ldy, K16_Q2)
GEMM_X8_K(gemm_q4_kx8, Q4K_BODY)
GEMM_X8_K(gemm_q5_kx8, Q5K_BODY)
GEMM_X8_K(gemm_q6_kx8, Q6K_BODY)
GEMM_X8_K(gemm_q3_kx8, Q3K_BODY)
GEMM_X8_K(gemm_q2_kx8, Q2K_BODY)
#undef GEMM_X8_K
#undef Q4K_BODY
#undef Q5K_BODY
#undef Q6K_BODY
#undef Q3K_BODY
#undef Q2K_BODY

#if FY_X86_VNNI == 2
/* ---- 512-bit kernels: two 8-row groups per vector, for several tokens --------------------- */

/* lanes 0..7: group 0's 32 bytes at p0, lanes 8..15: group 1's at p1 */
static inline __m512i load2x256(const void *p0, const void *p1)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p0)),
                              _mm256_loadu_si256((const __m256i *)p1), 1);
}

static inline __m512 load2_h8(const uint16_t *h0, const uint16_t *h1)
{
    __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)h0)),
                                        _mm_loadu_si128((const __m128i *)h1), 1);
    return _mm512_cvtph_ps(v);
}

static inline __m512i bcast4_512(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

typedef struct unpacked16 {
    __m512i lo[4], hi[4];
} unpacked16_t;

static inline void unpack_q4x16(const uint8_t *q0, const uint8_t *q1, unpacked16_t *u)
{
    const __m512i mask = _mm512_set1_epi8(0x0f);
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        __m512i v = load2x256(q0 + 32 * c, q1 + 32 * c);
        u->lo[c] = _mm512_and_si512(v, mask);
        u->hi[c] = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
    }
}

/* as isum_q4x8: two chains, lo and hi */
static inline __m512i isum_q4x16(const unpacked16_t *u, const int8_t *xq)
{
    __m512i a = _mm512_setzero_si512(), b = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        a = _mm512_dpbusd_epi32(a, u->lo[c], bcast4_512(xq + 4 * c));
        b = _mm512_dpbusd_epi32(b, u->hi[c], bcast4_512(xq + 16 + 4 * c));
    }
    return _mm512_add_epi32(a, b);
}

static inline __m512 step_q4_0x16(__m512 acc, const unpacked16_t *u, __m512 dw, const fy_q8a_t *x, int64_t b)
{
    __m512i is = _mm512_sub_epi32(isum_q4x16(u, x->qs + b * FY_QK), _mm512_set1_epi32(8 * x->isum[b]));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(dw, _mm512_set1_ps(x->d[b])), acc);
}

static inline __m512 step_q4_1x16(__m512 acc, const unpacked16_t *u, __m512 dw, __m512 mw, const fy_q8a_t *x, int64_t b)
{
    __m512i is = isum_q4x16(u, x->qs + b * FY_QK);
    __m512 a = _mm512_fmadd_ps(mw, _mm512_set1_ps(x->s[b]), acc);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(dw, _mm512_set1_ps(x->d[b])), a);
}

/* as step_q8_0x8: four chains, w + 128 unsigned, 128 sum(x) taken off */
static inline __m512 step_q8_0x16(__m512 acc, const int8_t *q0, const int8_t *q1, __m512 dw, const fy_q8a_t *x,
                                  int64_t b)
{
    const int8_t *xq = x->qs + b * FY_QK;
    const __m512i flip = _mm512_set1_epi8((char)0x80);
#define Q8_DOT16(acc, c)                                                                                               \
    _mm512_dpbusd_epi32(acc, _mm512_xor_si512(load2x256(q0 + 32 * (c), q1 + 32 * (c)), flip), bcast4_512(xq + 4 * (c)))
    __m512i c0 = Q8_DOT16(_mm512_setzero_si512(), 0), c1 = Q8_DOT16(_mm512_setzero_si512(), 1);
    __m512i c2 = Q8_DOT16(_mm512_setzero_si512(), 2), c3 = Q8_DOT16(_mm512_setzero_si512(), 3);
    c0 = Q8_DOT16(c0, 4), c1 = Q8_DOT16(c1, 5), c2 = Q8_DOT16(c2, 6), c3 = Q8_DOT16(c3, 7);
#undef Q8_DOT16
    __m512i is = _mm512_add_epi32(_mm512_add_epi32(c0, c1), _mm512_add_epi32(c2, c3));
    is = _mm512_sub_epi32(is, _mm512_set1_epi32(128 * x->isum[b]));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(dw, _mm512_set1_ps(x->d[b])), acc);
}

/* Each token: even and odd blocks in two accumulators, as gemm_*x8. */
#define GEMM_X16(name, block_t, ...)                                                                                   \
    static void name(const void *w0, const void *w1, int64_t nb, const fy_q8a_t *x, int n_tok, float *y, int64_t ldy)  \
    {                                                                                                                  \
        const block_t *b0 = w0, *b1 = w1;                                                                              \
        for (int t0 = 0; t0 < n_tok; t0 += TOK_GROUP) {                                                                \
            int nt = n_tok - t0 < TOK_GROUP ? n_tok - t0 : TOK_GROUP;                                                  \
            __m512 acc[TOK_GROUP][2];                                                                                  \
            for (int t = 0; t < nt; t++) acc[t][0] = acc[t][1] = _mm512_setzero_ps();                                  \
            for (int64_t b = 0; b < nb; b++) {                                                                         \
                __VA_ARGS__                                                                                            \
            }                                                                                                          \
            for (int t = 0; t < nt; t++) _mm512_storeu_ps(y + (t0 + t) * ldy, _mm512_add_ps(acc[t][0], acc[t][1]));    \
        }                                                                                                              \
    }

GEMM_X16(gemm_q4_0x16, fy_block_q4_0x8_t, {
    unpacked16_t u;
    unpack_q4x16(b0[b].qs, b1[b].qs, &u);
    __m512 dw = load2_h8(b0[b].d, b1[b].d);
    for (int t = 0; t < nt; t++) acc[t][b & 1] = step_q4_0x16(acc[t][b & 1], &u, dw, &x[t0 + t], b);
})

GEMM_X16(gemm_q4_1x16, fy_block_q4_1x8_t, {
    unpacked16_t u;
    unpack_q4x16(b0[b].qs, b1[b].qs, &u);
    __m512 dw = load2_h8(b0[b].d, b1[b].d), mw = load2_h8(b0[b].m, b1[b].m);
    for (int t = 0; t < nt; t++) acc[t][b & 1] = step_q4_1x16(acc[t][b & 1], &u, dw, mw, &x[t0 + t], b);
})

GEMM_X16(gemm_q8_0x16, fy_block_q8_0x8_t, {
    __m512 dw = load2_h8(b0[b].d, b1[b].d);
    for (int t = 0; t < nt; t++) acc[t][b & 1] = step_q8_0x16(acc[t][b & 1], b0[b].qs, b1[b].qs, dw, &x[t0 + t], b);
})
#undef GEMM_X16
#endif /* FY_X86_VNNI == 2 */

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
        acc0 =
            _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + i))), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + i + 8))),
                               _mm256_loadu_ps(b + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8)
        acc0 =
            _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + i))), _mm256_loadu_ps(b + i), acc0);
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

/* exp(x) for 8 floats: 2^n * p(r), x = n ln2 + r, |r| <= ln2 / 2, p the
 * degree-7 Taylor polynomial (relative error ~1e-8, below float's own);
 * inputs below -87.3 give ~1e-38, not 0 */
static inline __m256 exp8(__m256 x)
{
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.3f)), _mm256_set1_ps(-87.3f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
}

static inline __attribute__((always_inline)) __m256 kv8_f32(const void *p, int64_t i)
{
    return _mm256_loadu_ps((const float *)p + i);
}
static inline __attribute__((always_inline)) __m256 kv8_f16(const void *p, int64_t i)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
}

/* [sum(s[0]), ..., sum(s[7])] */
static inline __m256 hsum8_ps(const __m256 *s)
{
    __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(s[0], s[1]), _mm256_hadd_ps(s[2], s[3]));
    __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(s[4], s[5]), _mm256_hadd_ps(s[6], s[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

/* sum of e[0 .. n), n <= 32: 8-wide partial sums added in order, then
 * hsum's tree.  A block's share of l (and H2O's block mass) in both
 * attention kernels, so that they agree bit for bit; l then takes it in one
 * addition (a key-by-key chain was a quarter of the tiled kernel's time). */
static inline __attribute__((always_inline)) float attn_bsum(const float *e, int n)
{
    __m256 s = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) {
        __m256 x = _mm256_loadu_ps(e + i);
        if (n - i < 8) /* lanes past n hold scores of no key */
            x = _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n - i),
                                                                        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))));
        s = _mm256_add_ps(s, x);
    }
    return hsum(s);
}

/*
 * One head at a time, so that everything lives in registers: scores of 8
 * keys at once (8 accumulators, one horizontal-sum tree), then the values
 * 8 columns at a time.  K and V rows are re-read per head of the group;
 * they are in L1 by then, and converting f16 is one instruction per 8.
 */
static inline __attribute__((always_inline)) void attn_head(const float *q, const void *k, const void *v, int nk,
                                                            int hd, float scale, float *m, float *l, float *acc,
                                                            float *bsum, __m256 (*load8)(const void *, int64_t))
{
    float sc[32] __attribute__((aligned(32)));
    for (int i0 = 0; i0 < nk; i0 += 8) {
        __m256 s;
        if (nk - i0 >= 8) {
            /* every index constant after unrolling: the 8 accumulators
             * stay in registers (one array indexed by a variable, as the
             * partial group needs, put them on the stack for every group) */
            __m256 s8[8];
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) s8[i] = _mm256_setzero_ps();
            for (int j = 0; j < hd; j += 8) {
                __m256 qv = _mm256_loadu_ps(q + j);
#pragma GCC unroll 8
                for (int i = 0; i < 8; i++) s8[i] = _mm256_fmadd_ps(load8(k, (int64_t)(i0 + i) * hd + j), qv, s8[i]);
            }
            s = hsum8_ps(s8);
        } else { /* the last, partial group of a sequence's last block */
            __m256 p8[8];
            for (int i = 0; i < 8; i++) p8[i] = _mm256_setzero_ps();
            for (int j = 0; j < hd; j += 8) {
                __m256 qv = _mm256_loadu_ps(q + j);
                for (int i = 0; i < nk - i0; i++)
                    p8[i] = _mm256_fmadd_ps(load8(k, (int64_t)(i0 + i) * hd + j), qv, p8[i]);
            }
            s = hsum8_ps(p8);
        }
        _mm256_store_ps(sc + i0, _mm256_mul_ps(s, _mm256_set1_ps(scale)));
    }
    float mb = *m;
    for (int i = 0; i < nk; i++) mb = sc[i] > mb ? sc[i] : mb;
    float corr = 1.0f;
    if (mb > *m) {
        corr = expf(*m - mb); /* 0 on the first block */
        *l *= corr;
        *m = mb;
    }
    for (int i = 0; i < nk; i += 8) /* entries past nk are computed and ignored */
        _mm256_store_ps(sc + i, exp8(_mm256_sub_ps(_mm256_load_ps(sc + i), _mm256_set1_ps(*m))));
    const float bs = attn_bsum(sc, nk);
    *l += bs;
    if (bsum) *bsum = bs;
    /* values: keys outer and 64 columns in 8 accumulators inner, so the
     * multiply-adds form 8 independent chains (one chain per column
     * chunk over all keys waited on its own latency) */
    const __m256 vc = _mm256_set1_ps(corr);
    int j0 = 0;
    for (; j0 + 64 <= hd; j0 += 64) {
        __m256 a[8];
#pragma GCC unroll 8
        for (int jj = 0; jj < 8; jj++) a[jj] = _mm256_mul_ps(_mm256_loadu_ps(acc + j0 + 8 * jj), vc);
        for (int i = 0; i < nk; i++) {
            __m256 e = _mm256_set1_ps(sc[i]);
#pragma GCC unroll 8
            for (int jj = 0; jj < 8; jj++) a[jj] = _mm256_fmadd_ps(e, load8(v, (int64_t)i * hd + j0 + 8 * jj), a[jj]);
        }
#pragma GCC unroll 8
        for (int jj = 0; jj < 8; jj++) _mm256_storeu_ps(acc + j0 + 8 * jj, a[jj]);
    }
    for (int j = j0; j < hd; j += 8) { /* head sizes that are not a multiple of 64 */
        __m256 a = _mm256_mul_ps(_mm256_loadu_ps(acc + j), vc);
        for (int i = 0; i < nk; i++) a = _mm256_fmadd_ps(_mm256_set1_ps(sc[i]), load8(v, (int64_t)i * hd + j), a);
        _mm256_storeu_ps(acc + j, a);
    }
}

static inline __attribute__((always_inline)) void attn_block_x86(const float *q, int G, const void *k, const void *v,
                                                                 int nk, int hd, float scale, float *m, float *l,
                                                                 float *acc, float *bsum,
                                                                 __m256 (*load8)(const void *, int64_t))
{
    for (int g = 0; g < G; g++)
        attn_head(q + (size_t)g * hd, k, v, nk, hd, scale, m + g, l + g, acc + (size_t)g * hd, bsum ? bsum + g : NULL,
                  load8);
}

static void attn_block_f32(const float *q, int G, const void *k, const void *v, int nk, int hd, float scale, float *m,
                           float *l, float *acc, float *bsum)
{
    attn_block_x86(q, G, k, v, nk, hd, scale, m, l, acc, bsum, kv8_f32);
}

static void attn_block_f16(const float *q, int G, const void *k, const void *v, int nk, int hd, float scale, float *m,
                           float *l, float *acc, float *bsum)
{
    if (G == 1 || (size_t)nk * (size_t)hd > 32 * 128) {
        attn_block_x86(q, G, k, v, nk, hd, scale, m, l, acc, bsum, kv8_f16);
        return;
    }
    /* several heads read this block: convert it to f32 once, not per head */
    float kf[32 * 128] __attribute__((aligned(32))), vf[32 * 128] __attribute__((aligned(32)));
    int64_t n = (int64_t)nk * hd;
    for (int64_t i = 0; i < n; i += 8) {
        _mm256_store_ps(kf + i, kv8_f16(k, i));
        _mm256_store_ps(vf + i, kv8_f16(v, i));
    }
    attn_block_x86(q, G, kf, vf, nk, hd, scale, m, l, acc, bsum, kv8_f32);
}

/*
 * Tiled attention: one K/V block for a tile of query rows (prefill chunks
 * read each block once for many rows).  The block is transposed once per
 * tile into kt[hd][32] (keys along the vector), so a row's scores come from
 * broadcast-multiply-adds with no horizontal sums; V is converted to f32
 * once.  Each row's arithmetic is attn_head's, operation for operation: a
 * key's score keeps 8 partial sums by column mod 8 (attn_head's lanes),
 * added in hsum8_ps's tree, then scaled; max, exp, l and acc as there.  So
 * a row gets the same bits in any tile, and the same as attn_block would
 * give it over the keys it sees.
 */
#if FY_X86_VNNI == 2
#define TW 16 /* keys per score vector */
typedef __m512 tv_t;
#define TV_ZERO() _mm512_setzero_ps()
#define TV_LOAD(p) _mm512_load_ps(p)
#define TV_LOADU(p) _mm512_loadu_ps(p)
#define TV_STOREU(p, x) _mm512_storeu_ps(p, x)
#define TV_STORE(p, x) _mm512_store_ps(p, x)
#define TV_SET1(x) _mm512_set1_ps(x)
#define TV_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define TV_MUL(a, b) _mm512_mul_ps(a, b)
#define TV_ADD(a, b) _mm512_add_ps(a, b)
#else
#define TW 8
typedef __m256 tv_t;
#define TV_ZERO() _mm256_setzero_ps()
#define TV_LOAD(p) _mm256_load_ps(p)
#define TV_LOADU(p) _mm256_loadu_ps(p)
#define TV_STOREU(p, x) _mm256_storeu_ps(p, x)
#define TV_STORE(p, x) _mm256_store_ps(p, x)
#define TV_SET1(x) _mm256_set1_ps(x)
#define TV_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define TV_MUL(a, b) _mm256_mul_ps(a, b)
#define TV_ADD(a, b) _mm256_add_ps(a, b)
#endif
#define TILE_LD 32 /* kt's row: a block's keys (at most 32) */

/* rows r0 .. r0+7 (8 f32 vectors of 8 columns) into kt columns r0 .. r0+7 */
static inline __attribute__((always_inline)) void tile_transpose8(const __m256 *r, float *kt, int r0)
{
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
    _mm256_store_ps(kt + 0 * TILE_LD + r0, _mm256_permute2f128_ps(u0, u4, 0x20));
    _mm256_store_ps(kt + 1 * TILE_LD + r0, _mm256_permute2f128_ps(u1, u5, 0x20));
    _mm256_store_ps(kt + 2 * TILE_LD + r0, _mm256_permute2f128_ps(u2, u6, 0x20));
    _mm256_store_ps(kt + 3 * TILE_LD + r0, _mm256_permute2f128_ps(u3, u7, 0x20));
    _mm256_store_ps(kt + 4 * TILE_LD + r0, _mm256_permute2f128_ps(u0, u4, 0x31));
    _mm256_store_ps(kt + 5 * TILE_LD + r0, _mm256_permute2f128_ps(u1, u5, 0x31));
    _mm256_store_ps(kt + 6 * TILE_LD + r0, _mm256_permute2f128_ps(u2, u6, 0x31));
    _mm256_store_ps(kt + 7 * TILE_LD + r0, _mm256_permute2f128_ps(u3, u7, 0x31));
}

/* scores of keys [TW c, TW c + TW) for two heads (qb may equal qa: one
 * head), scaled, into sa and sb */
static inline __attribute__((always_inline)) void tile_scores(const float *qa, const float *qb, const float *kt, int c,
                                                              int hd, float scale, float *sa, float *sb, const int two)
{
    tv_t a[8], b[8];
    for (int i = 0; i < 8; i++) a[i] = TV_ZERO(), b[i] = TV_ZERO();
    const float *kc = kt + c * TW;
    for (int d = 0; d < hd; d += 8) {
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            tv_t kv = TV_LOAD(kc + (size_t)(d + i) * TILE_LD);
            a[i] = TV_FMA(TV_SET1(qa[d + i]), kv, a[i]);
            if (two) b[i] = TV_FMA(TV_SET1(qb[d + i]), kv, b[i]);
        }
    }
    /* hsum8_ps's tree: ((0+1)+(2+3)) + ((4+5)+(6+7)) */
    tv_t s = TV_ADD(TV_ADD(TV_ADD(a[0], a[1]), TV_ADD(a[2], a[3])), TV_ADD(TV_ADD(a[4], a[5]), TV_ADD(a[6], a[7])));
    TV_STOREU(sa + c * TW, TV_MUL(s, TV_SET1(scale)));
    if (!two) return;
    s = TV_ADD(TV_ADD(TV_ADD(b[0], b[1]), TV_ADD(b[2], b[3])), TV_ADD(TV_ADD(b[4], b[5]), TV_ADD(b[6], b[7])));
    TV_STOREU(sb + c * TW, TV_MUL(s, TV_SET1(scale)));
}

/* attn_head's softmax step over sc[lo, hi) (exp in place, from lo); the
 * factor acc must be multiplied by */
static inline __attribute__((always_inline)) float tile_softmax(float *sc, int lo, int hi, float *m, float *l)
{
    __m256 mx = _mm256_set1_ps(*m);
    for (int i = lo; i < hi; i += 8) { /* the maximum is exact in any order */
        __m256 x = _mm256_loadu_ps(sc + i);
        if (hi - i < 8)
            x = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), x,
                                 _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(hi - i),
                                                                        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))));
        mx = _mm256_max_ps(mx, x);
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    const float mb = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
    float corr = 1.0f;
    if (mb > *m) {
        corr = expf(*m - mb);
        *l *= corr;
        *m = mb;
    }
    for (int i = lo; i < hi; i += 8)
        _mm256_storeu_ps(sc + i, exp8(_mm256_sub_ps(_mm256_loadu_ps(sc + i), _mm256_set1_ps(*m))));
    *l += attn_bsum(sc + lo, hi - lo);
    return corr;
}

/* acc = acc * corr + sum over keys [lo, hi) of e[i] v[i], in key order,
 * for two heads of one row at once (they read the same V rows); ab may be
 * NULL (one head) */
static inline __attribute__((always_inline)) void tile_values(const float *v, int lo, int hi, int hd, const float *ea,
                                                              float ca, float *aa, const float *eb, float cb, float *ab)
{
    enum { NA = 64 / TW };
    int j0 = 0;
    for (; j0 + 64 <= hd; j0 += 64) {
        tv_t x[NA], y[NA];
        for (int jj = 0; jj < NA; jj++) x[jj] = TV_MUL(TV_LOADU(aa + j0 + TW * jj), TV_SET1(ca));
        if (ab) {
            for (int jj = 0; jj < NA; jj++) y[jj] = TV_MUL(TV_LOADU(ab + j0 + TW * jj), TV_SET1(cb));
            for (int i = lo; i < hi; i++) {
                tv_t e = TV_SET1(ea[i]), f = TV_SET1(eb[i]);
#pragma GCC unroll 8
                for (int jj = 0; jj < NA; jj++) {
                    tv_t vv = TV_LOADU(v + (size_t)i * hd + j0 + TW * jj);
                    x[jj] = TV_FMA(e, vv, x[jj]);
                    y[jj] = TV_FMA(f, vv, y[jj]);
                }
            }
            for (int jj = 0; jj < NA; jj++) TV_STOREU(ab + j0 + TW * jj, y[jj]);
        } else {
            for (int i = lo; i < hi; i++) {
                tv_t e = TV_SET1(ea[i]);
#pragma GCC unroll 8
                for (int jj = 0; jj < NA; jj++) x[jj] = TV_FMA(e, TV_LOADU(v + (size_t)i * hd + j0 + TW * jj), x[jj]);
            }
        }
        for (int jj = 0; jj < NA; jj++) TV_STOREU(aa + j0 + TW * jj, x[jj]);
    }
    for (int j = j0; j < hd; j += 8) { /* head sizes that are not a multiple of 64 */
        __m256 x = _mm256_mul_ps(_mm256_loadu_ps(aa + j), _mm256_set1_ps(ca));
        for (int i = lo; i < hi; i++)
            x = _mm256_fmadd_ps(_mm256_set1_ps(ea[i]), _mm256_loadu_ps(v + (size_t)i * hd + j), x);
        _mm256_storeu_ps(aa + j, x);
        if (!ab) continue;
        __m256 y = _mm256_mul_ps(_mm256_loadu_ps(ab + j), _mm256_set1_ps(cb));
        for (int i = lo; i < hi; i++)
            y = _mm256_fmadd_ps(_mm256_set1_ps(eb[i]), _mm256_loadu_ps(v + (size_t)i * hd + j), y);
        _mm256_storeu_ps(ab + j, y);
    }
}

static inline __attribute__((always_inline)) void attn_tile_x86(const float *const *q, int nr, int G, const void *k,
                                                                const void *v, int nk, int hd, float scale,
                                                                const int32_t *vis, float *m, float *l, float *acc,
                                                                float *work, int f16)
{
    float *kt = work, *vf = work + (size_t)TILE_LD * hd; /* [hd][32], [32][hd] */
    int ulo = nk, uhi = 0;
    for (int r = 0; r < nr; r++) {
        ulo = vis[2 * r] < ulo ? vis[2 * r] : ulo;
        uhi = vis[2 * r + 1] > uhi ? vis[2 * r + 1] : uhi;
    }
    const int a8 = ulo & ~7, b8 = (uhi + 7) & ~7; /* whole 8-row groups: blocks hold 8, 16 or 32 rows */
    for (int i0 = a8; i0 < b8; i0 += 8) {
        for (int d0 = 0; d0 < hd; d0 += 8) {
            __m256 rows[8];
            for (int i = 0; i < 8; i++)
                rows[i] = f16 ? kv8_f16(k, (int64_t)(i0 + i) * hd + d0) : kv8_f32(k, (int64_t)(i0 + i) * hd + d0);
            tile_transpose8(rows, kt + (size_t)d0 * TILE_LD, i0);
        }
    }
    if (f16) {
        for (int64_t i = (int64_t)ulo * hd; i < (int64_t)uhi * hd; i += 8) _mm256_store_ps(vf + i, kv8_f16(v, i));
        v = vf;
    }
    float sa[TILE_LD + 8] __attribute__((aligned(64))), sb[TILE_LD + 8] __attribute__((aligned(64)));
    for (int r = 0; r < nr; r++) {
        const int lo = vis[2 * r], hi = vis[2 * r + 1];
        for (int g = 0; g < G; g += 2) {
            const int two = g + 1 < G;
            const float *qa = q[r] + (size_t)g * hd, *qb = two ? qa + hd : qa;
            for (int c = lo / TW; c * TW < hi; c++) {
                if (two)
                    tile_scores(qa, qb, kt, c, hd, scale, sa, sb, 1);
                else
                    tile_scores(qa, qa, kt, c, hd, scale, sa, sb, 0);
            }
            size_t ia = (size_t)r * G + g;
            float ca = tile_softmax(sa, lo, hi, m + ia, l + ia), cb = 0.0f;
            if (two) cb = tile_softmax(sb, lo, hi, m + ia + 1, l + ia + 1);
            tile_values(v, lo, hi, hd, sa, ca, acc + ia * hd, sb, cb, two ? acc + (ia + 1) * hd : NULL);
        }
    }
}

static void attn_tile_f32(const float *const *q, int nr, int G, const void *k, const void *v, int nk, int hd,
                          float scale, const int32_t *vis, float *m, float *l, float *acc, float *work)
{
    attn_tile_x86(q, nr, G, k, v, nk, hd, scale, vis, m, l, acc, work, 0);
}

static void attn_tile_f16(const float *const *q, int nr, int G, const void *k, const void *v, int nk, int hd,
                          float scale, const int32_t *vis, float *m, float *l, float *acc, float *work)
{
    attn_tile_x86(q, nr, G, k, v, nk, hd, scale, vis, m, l, acc, work, 1);
}

static void rmsnorm(const float *x, const float *w, int64_t n, float eps, float *y)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
        a0 = _mm256_fmadd_ps(v0, v0, a0);
        a1 = _mm256_fmadd_ps(v1, v1, a1);
    }
    double ss = hsum(_mm256_add_ps(a0, a1));
    for (; i < n; i++) ss += (double)x[i] * x[i];
    __m256 sc = _mm256_set1_ps((float)(1.0 / sqrt(ss / (double)n + (double)eps)));
    for (i = 0; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), sc), _mm256_loadu_ps(w + i)));
    for (; i < n; i++) y[i] = x[i] * _mm256_cvtss_f32(sc) * w[i];
}

static void swiglu(const float *gate, const float *up, float *out, int64_t n)
{
    int64_t i = 0;
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i);
        __m256 sg = _mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_xor_ps(g, sign))));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(sg, _mm256_loadu_ps(up + i)));
    }
    for (; i < n; i++) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

/* as the scalar table's: gate / (1 + exp(-2u)) * up */
static void geglu(const float *gate, const float *up, float *out, int64_t n)
{
    int64_t i = 0;
    const __m256 one = _mm256_set1_ps(1.0f), k2 = _mm256_set1_ps(-2.0f * 0.7978845608028654f),
                 c = _mm256_set1_ps(0.044715f);
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i);
        __m256 inner = _mm256_fmadd_ps(_mm256_mul_ps(c, g), _mm256_mul_ps(g, g), g); /* g + c g^3 */
        __m256 e = exp8(_mm256_mul_ps(k2, inner));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
    }
    for (; i < n; i++) {
        float g = gate[i], u = 0.7978845608028654f * (g + 0.044715f * g * g * g);
        out[i] = g / (1.0f + expf(-2.0f * u)) * up[i];
    }
}

static void f32_to_f16(const float *x, uint16_t *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) y[i] = fy_fp32_to_fp16(x[i]);
}

static void kv_row_read(const void *row, int fp8, float *x, int64_t n)
{
    float sc;
    memcpy(&sc, row, sizeof(sc));
    const uint8_t *q = (const uint8_t *)row + sizeof(float);
    const __m256 s = _mm256_set1_ps(sc);
    int64_t i = 0;
    if (fp8) {
        /* as fy_fp8_to_fp32: bits moved to the top of an f32's, rebiased by 2^120 */
        const __m256 rebias = _mm256_set1_ps(0x1p120f);
        const __m256i m7f = _mm256_set1_epi32(0x7f), qnan = _mm256_set1_epi32(0x7fc00000);
        for (; i + 8 <= n; i += 8) {
            __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + i)));
            __m256i mag = _mm256_and_si256(b, m7f);
            __m256i sign = _mm256_slli_epi32(_mm256_andnot_si256(m7f, b), 24);
            __m256 v = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(mag, 20)), rebias);
            __m256i bits = _mm256_blendv_epi8(_mm256_castps_si256(v), qnan, _mm256_cmpeq_epi32(mag, m7f));
            _mm256_storeu_ps(x + i, _mm256_mul_ps(s, _mm256_castsi256_ps(_mm256_or_si256(bits, sign))));
        }
        for (; i < n; i++) x[i] = sc * fy_fp8_to_fp32(q[i]);
    } else {
        for (; i + 8 <= n; i += 8) {
            __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + i))));
            _mm256_storeu_ps(x + i, _mm256_mul_ps(s, v));
        }
        for (; i < n; i++) x[i] = sc * (float)(int8_t)q[i];
    }
}

const fy_cpu_kernels_t FY_X86_TABLE = {
    .name = FY_X86_NAME,
    .quantize_q8a = quantize_q8a,
    .vec_dot =
        {
            [FY_DTYPE_F32] = dot_f32,
            [FY_DTYPE_F16] = dot_f16,
            [FY_DTYPE_BF16] = dot_bf16,
            [FY_DTYPE_Q8_0] = dot_q8_0,
            [FY_DTYPE_Q4_0] = dot_q4_0,
            [FY_DTYPE_Q4_1] = dot_q4_1,
            [FY_DTYPE_Q5_0] = dot_q5_0,
            [FY_DTYPE_Q5_1] = dot_q5_1,
            [FY_DTYPE_IQ4_NL] = dot_iq4_nl,
            [FY_DTYPE_Q2_K] = dot_q2_k,
            [FY_DTYPE_Q3_K] = dot_q3_k,
            [FY_DTYPE_Q4_K] = dot_q4_k,
            [FY_DTYPE_Q5_K] = dot_q5_k,
            [FY_DTYPE_Q6_K] = dot_q6_k,
        },
    .gemm_x8 =
        {
            [FY_DTYPE_Q8_0] = gemm_q8_0x8,
            [FY_DTYPE_Q4_0] = gemm_q4_0x8,
            [FY_DTYPE_Q4_1] = gemm_q4_1x8,
            [FY_DTYPE_Q5_0] = gemm_q5_0x8,
            [FY_DTYPE_Q5_1] = gemm_q5_1x8,
            [FY_DTYPE_IQ4_NL] = gemm_iq4_nlx8,
            [FY_DTYPE_Q2_K] = gemm_q2_kx8,
            [FY_DTYPE_Q3_K] = gemm_q3_kx8,
            [FY_DTYPE_Q4_K] = gemm_q4_kx8,
            [FY_DTYPE_Q5_K] = gemm_q5_kx8,
            [FY_DTYPE_Q6_K] = gemm_q6_kx8,
        },
#if FY_X86_VNNI == 2
    .gemm_x16 =
        {
            [FY_DTYPE_Q8_0] = gemm_q8_0x16,
            [FY_DTYPE_Q4_0] = gemm_q4_0x16,
            [FY_DTYPE_Q4_1] = gemm_q4_1x16,
        },
#endif

    .attn_block = {[FY_DTYPE_F32] = attn_block_f32, [FY_DTYPE_F16] = attn_block_f16},
    .attn_tile = {[FY_DTYPE_F32] = attn_tile_f32, [FY_DTYPE_F16] = attn_tile_f16},
    .rmsnorm = rmsnorm,
    .swiglu = swiglu,
    .geglu = geglu,
    .f32_to_f16 = f32_to_f16,
    .kv_row_read = kv_row_read,
};

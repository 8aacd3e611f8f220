/*
 * cuda_qblock.h - the CUDA weight kernels' reading of GGUF blocks, written
 * once for both sides: nvcc compiles it into kernels/cuda/cuda_quant.cu's
 * kernels (__host__ __device__), gcc into tests/test_cuda.c, which checks
 * every type on the CPU (no GPU needed) against dtype.c's reference
 * dequantizers and the CPU backend's integer dot products.  So the
 * indexing the GPU runs is the indexing the CPU tests ran.
 *
 * Two readings of a row of a weight of type t (row: the row's first byte,
 * 2-byte aligned, as cudaMalloc'd rows of every type are):
 *
 *  - fyq_deq: element e as f32, bit for bit fy_dequantize_row's value (the
 *    same f32 operations in the same order, no fused multiply-add: on the
 *    device the products and sums are __fmul_rn/__fadd_rn, which nvcc
 *    never contracts).  The embedding lookup and the bf16 tiles of the
 *    prefill GEMM use it.
 *
 *  - fyq_sub_load + fyq_sub_dot: the 32-element block b as 32 small
 *    integers (packed 4 to a word, element 4 i + k in byte k of q[i]) and
 *    the floats that scale them, and its dot product with 32 activations
 *    quantized to 8 bits per 32 (qs ~= x / dx, the CPU backend's q8
 *    activation rows, cpu_kernels.h):
 *        w_l = a[l / 16] q_l + e[l / 16] + c        (l < 32)
 *        w . x ~= dx (a0 S0 + a1 S1 + e0 X0 + e1 X1) + c dx (X0 + X1)
 *    S0, S1: the integer sums of q_l qs_l over l < 16 and l >= 16; X0, X1
 *    those of qs_l.  The integer sums are exact (dp4a on the device), so
 *    the result differs from the CPU backend's only in the order of f32
 *    operations.  The K-quants' block b is sub-block b % 8 of super-block
 *    b / 8.
 *
 * Only F32/F16/BF16 and the quantized weight types (fy_cuda_weight_type)
 * are read here; other types read as 0.
 */
#ifndef FY_CUDA_QBLOCK_H
#define FY_CUDA_QBLOCK_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "common/dtype.h"

#ifdef __CUDACC__
#include <cuda_fp16.h>
#define FYQ_FN static __host__ __device__ __forceinline__
#else
#define FYQ_FN static inline
#endif

/* f32 operations that are never fused */
#ifdef __CUDA_ARCH__
#define FYQ_MUL(a, b) __fmul_rn((a), (b))
#define FYQ_ADD(a, b) __fadd_rn((a), (b))
#define FYQ_SUB(a, b) __fsub_rn((a), (b))
#else
#define FYQ_MUL(a, b) ((a) * (b))
#define FYQ_ADD(a, b) ((a) + (b))
#define FYQ_SUB(a, b) ((a) - (b))
#endif

/* 16 bits at an even address */
FYQ_FN uint32_t fyq_u16(const uint8_t *p)
{
#ifdef __CUDA_ARCH__
    return *(const uint16_t *)p;
#else
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
#endif
}

/* 32 bits at an even address, little-endian (byte k in bits 8k) */
FYQ_FN int32_t fyq_i32(const uint8_t *p) { return (int32_t)(fyq_u16(p) | fyq_u16(p + 2) << 16); }

FYQ_FN float fyq_f16(uint32_t h)
{
#ifdef __CUDA_ARCH__
    return __half2float(__ushort_as_half((unsigned short)h));
#else
    return fy_fp16_to_fp32((uint16_t)h);
#endif
}

FYQ_FN float fyq_bits_f32(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    return fy_fp32_from_bits(u);
#endif
}

/* sum over the 4 bytes of a and b as signed 8-bit products, plus c */
FYQ_FN int32_t fyq_dp4a(int32_t a, int32_t b, int32_t c)
{
#ifdef __CUDA_ARCH__
    return __dp4a(a, b, c);
#else
    for (int k = 0; k < 4; k++)
        c += (int32_t)(int8_t)(uint8_t)(a >> (8 * k)) * (int32_t)(int8_t)(uint8_t)(b >> (8 * k));
    return c;
#endif
}

/* each byte of v (all below 0x80) minus o (o <= 0x80), as int8 */
FYQ_FN int32_t fyq_sub_bytes(int32_t v, uint32_t o)
{
    return (int32_t)((((uint32_t)v | 0x80808080u) - o * 0x01010101u) ^ 0x80808080u);
}

/* bits 0..3 of h to bit 4 of bytes 0..3 */
FYQ_FN int32_t fyq_spread4(uint32_t h)
{
    return (int32_t)(((h & 1u) << 4) | ((h & 2u) << 11) | ((h & 4u) << 18) | ((h & 8u) << 25));
}

/* IQ4_NL's levels (fy_iq4nl_values), index i in byte i % 8 of word i / 8 */
FYQ_FN int32_t fyq_iq4nl(uint32_t i)
{
    const uint64_t lo = 0xF6EADDCFBFAD9881ull, hi = 0x7159453526190D01ull;
    return (int32_t)(int8_t)(uint8_t)((i < 8 ? lo : hi) >> (8 * (i & 7)));
}

/* 4 nibbles (bytes of v, each < 16) through the IQ4_NL table */
FYQ_FN int32_t fyq_iq4nl4(uint32_t v)
{
    uint32_t r = 0;
    for (int k = 0; k < 4; k++) r |= ((uint32_t)fyq_iq4nl((v >> (8 * k)) & 15) & 0xffu) << (8 * k);
    return (int32_t)r;
}

/* scale and minimum j of a Q4_K/Q5_K block's 12 packed bytes (fy_k4_scale_min) */
FYQ_FN void fyq_k4(const uint8_t *q, int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* scale i (0..63, biased by 32) of a Q3_K block's 12 packed bytes (fy_k3_scales) */
FYQ_FN int fyq_k3(const uint8_t *q, int i)
{
    return ((q[i % 8] >> (4 * (i / 8))) & 0xf) | (((q[8 + i % 4] >> (2 * (i / 4))) & 3) << 4);
}

/* Element e of a row of type t as f32: fy_dequantize_row's bits. */
FYQ_FN float fyq_deq(fy_dtype_t t, const uint8_t *row, int64_t e)
{
    switch (t) {
    case FY_DTYPE_F32: return fyq_bits_f32((uint32_t)fyq_i32(row + 4 * e));
    case FY_DTYPE_F16: return fyq_f16(fyq_u16(row + 2 * e));
    case FY_DTYPE_BF16: return fyq_bits_f32(fyq_u16(row + 2 * e) << 16);
    case FY_DTYPE_Q8_0: {
        const uint8_t *p = row + (e / 32) * 34;
        return FYQ_MUL(fyq_f16(fyq_u16(p)), (float)(int8_t)p[2 + e % 32]);
    }
    case FY_DTYPE_Q4_0:
    case FY_DTYPE_Q4_1:
    case FY_DTYPE_IQ4_NL: {
        const int l = (int)(e % 32), bb = t == FY_DTYPE_Q4_1 ? 20 : 18, qo = t == FY_DTYPE_Q4_1 ? 4 : 2;
        const uint8_t *p = row + (e / 32) * bb;
        const int q = l < 16 ? p[qo + l] & 15 : p[qo + l - 16] >> 4;
        const float d = fyq_f16(fyq_u16(p));
        if (t == FY_DTYPE_Q4_0) return FYQ_MUL(d, (float)(q - 8));
        if (t == FY_DTYPE_IQ4_NL) return FYQ_MUL(d, (float)fyq_iq4nl((uint32_t)q));
        return FYQ_ADD(FYQ_MUL(d, (float)q), fyq_f16(fyq_u16(p + 2)));
    }
    case FY_DTYPE_Q5_0:
    case FY_DTYPE_Q5_1: {
        const bool q51 = t == FY_DTYPE_Q5_1;
        const int l = (int)(e % 32), j = l % 16, ho = q51 ? 4 : 2;
        const uint8_t *p = row + (e / 32) * (q51 ? 24 : 22);
        const uint32_t qh = fyq_u16(p + ho) | fyq_u16(p + ho + 2) << 16;
        const uint8_t qs = p[ho + 4 + j];
        const int x =
            l < 16 ? (int)((qs & 0x0f) | (((qh >> j) << 4) & 0x10)) : (int)((qs >> 4) | ((qh >> (j + 12)) & 0x10));
        const float d = fyq_f16(fyq_u16(p));
        if (!q51) return FYQ_MUL((float)(x - 16), d);
        return FYQ_ADD(FYQ_MUL((float)x, d), fyq_f16(fyq_u16(p + 2)));
    }
    case FY_DTYPE_Q2_K: {
        const uint8_t *p = row + (e / 256) * 84;
        const int ee = (int)(e % 256), sc = p[ee / 16];
        const float d = fyq_f16(fyq_u16(p + 80)), min = fyq_f16(fyq_u16(p + 82));
        const float dl = FYQ_MUL(d, (float)(sc & 0xf)), ml = FYQ_MUL(min, (float)(sc >> 4));
        const int q = (p[16 + 32 * (ee / 128) + ee % 32] >> (2 * (ee / 32 % 4))) & 3;
        return FYQ_SUB(FYQ_MUL(dl, (float)q), ml);
    }
    case FY_DTYPE_Q3_K: {
        const uint8_t *p = row + (e / 256) * 110;
        const int ee = (int)(e % 256);
        const float dl = FYQ_MUL(fyq_f16(fyq_u16(p + 108)), (float)(fyq_k3(p + 96, ee / 16) - 32));
        const int q =
            ((p[32 + 32 * (ee / 128) + ee % 32] >> (2 * (ee / 32 % 4))) & 3) - ((p[ee % 32] >> (ee / 32)) & 1 ? 0 : 4);
        return FYQ_MUL(dl, (float)q);
    }
    case FY_DTYPE_Q4_K:
    case FY_DTYPE_Q5_K: {
        const bool q5 = t == FY_DTYPE_Q5_K;
        const uint8_t *p = row + (e / 256) * (q5 ? 176 : 144);
        const int ee = (int)(e % 256), j = ee / 32, l = ee % 32;
        int sc, m;
        fyq_k4(p + 4, j, &sc, &m);
        const float d1 = FYQ_MUL(fyq_f16(fyq_u16(p)), (float)sc), m1 = FYQ_MUL(fyq_f16(fyq_u16(p + 2)), (float)m);
        int q = (p[(q5 ? 48 : 16) + 32 * (j / 2) + l] >> (4 * (j % 2))) & 0xf;
        if (q5 && (p[16 + l] >> j) & 1) q += 16;
        return FYQ_SUB(FYQ_MUL(d1, (float)q), m1);
    }
    case FY_DTYPE_Q6_K: {
        const uint8_t *p = row + (e / 256) * 210;
        const int ee = (int)(e % 256);
        const int lo = (p[64 * (ee / 128) + ee % 64] >> (4 * (ee / 64 % 2))) & 0xf;
        const int hi = (p[128 + 32 * (ee / 128) + ee % 32] >> (2 * (ee / 32 % 4))) & 3;
        const float ds = FYQ_MUL(fyq_f16(fyq_u16(p + 208)), (float)(int8_t)p[192 + ee / 16]);
        return FYQ_MUL(ds, (float)((lo | (hi << 4)) - 32));
    }
    default: return 0.0f;
    }
}

/* One 32-element block of a quantized row, decoded for integer dot products (see above). */
typedef struct fyq_sub {
    int32_t q[8];
    float a[2], e[2], c;
} fyq_sub_t;

/* Does type t's dot product need the activation's quant sums (X0, X1)? */
FYQ_FN bool fyq_needs_xsum(fy_dtype_t t)
{
    return t == FY_DTYPE_Q4_1 || t == FY_DTYPE_Q5_1 || t == FY_DTYPE_Q2_K || t == FY_DTYPE_Q4_K || t == FY_DTYPE_Q5_K;
}

FYQ_FN void fyq_sub_load(fy_dtype_t t, const uint8_t *row, int64_t b, fyq_sub_t *s)
{
    s->e[0] = s->e[1] = s->c = 0.0f;
    switch (t) {
    case FY_DTYPE_Q8_0: {
        const uint8_t *p = row + b * 34;
        s->a[0] = s->a[1] = fyq_f16(fyq_u16(p));
        for (int i = 0; i < 8; i++) s->q[i] = fyq_i32(p + 2 + 4 * i);
        return;
    }
    case FY_DTYPE_Q4_0:
    case FY_DTYPE_Q4_1:
    case FY_DTYPE_IQ4_NL: {
        const bool q41 = t == FY_DTYPE_Q4_1;
        const uint8_t *p = row + b * (q41 ? 20 : 18), *qs = p + (q41 ? 4 : 2);
        s->a[0] = s->a[1] = fyq_f16(fyq_u16(p));
        if (q41) s->c = fyq_f16(fyq_u16(p + 2));
        for (int i = 0; i < 4; i++) {
            int32_t v = fyq_i32(qs + 4 * i), lo = v & 0x0F0F0F0F, hi = (v >> 4) & 0x0F0F0F0F;
            if (t == FY_DTYPE_Q4_0) lo = fyq_sub_bytes(lo, 8), hi = fyq_sub_bytes(hi, 8);
            if (t == FY_DTYPE_IQ4_NL) lo = fyq_iq4nl4((uint32_t)lo), hi = fyq_iq4nl4((uint32_t)hi);
            s->q[i] = lo;
            s->q[i + 4] = hi;
        }
        return;
    }
    case FY_DTYPE_Q5_0:
    case FY_DTYPE_Q5_1: {
        const bool q51 = t == FY_DTYPE_Q5_1;
        const int ho = q51 ? 4 : 2;
        const uint8_t *p = row + b * (q51 ? 24 : 22), *qs = p + ho + 4;
        const uint32_t qh = fyq_u16(p + ho) | fyq_u16(p + ho + 2) << 16;
        s->a[0] = s->a[1] = fyq_f16(fyq_u16(p));
        if (q51) s->c = fyq_f16(fyq_u16(p + 2));
        for (int i = 0; i < 4; i++) {
            int32_t v = fyq_i32(qs + 4 * i);
            int32_t lo = (v & 0x0F0F0F0F) | fyq_spread4(qh >> (4 * i));
            int32_t hi = ((v >> 4) & 0x0F0F0F0F) | fyq_spread4(qh >> (16 + 4 * i));
            s->q[i] = q51 ? lo : fyq_sub_bytes(lo, 16);
            s->q[i + 4] = q51 ? hi : fyq_sub_bytes(hi, 16);
        }
        return;
    }
    case FY_DTYPE_Q2_K: {
        const uint8_t *p = row + (b / 8) * 84;
        const int j = (int)(b % 8);
        const float d = fyq_f16(fyq_u16(p + 80)), dmin = fyq_f16(fyq_u16(p + 82));
        for (int h = 0; h < 2; h++) {
            const int sc = p[2 * j + h];
            s->a[h] = d * (float)(sc & 0xf);
            s->e[h] = -(dmin * (float)(sc >> 4));
        }
        for (int i = 0; i < 8; i++) s->q[i] = (fyq_i32(p + 16 + 32 * (j / 4) + 4 * i) >> (2 * (j % 4))) & 0x03030303;
        return;
    }
    case FY_DTYPE_Q3_K: {
        const uint8_t *p = row + (b / 8) * 110;
        const int j = (int)(b % 8);
        const float d = fyq_f16(fyq_u16(p + 108));
        for (int h = 0; h < 2; h++) s->a[h] = d * (float)(fyq_k3(p + 96, 2 * j + h) - 32);
        for (int i = 0; i < 8; i++) {
            int32_t lo = (fyq_i32(p + 32 + 32 * (j / 4) + 4 * i) >> (2 * (j % 4))) & 0x03030303;
            int32_t hb = ((fyq_i32(p + 4 * i) >> j) & 0x01010101) << 2;
            s->q[i] = fyq_sub_bytes(lo | hb, 4);
        }
        return;
    }
    case FY_DTYPE_Q4_K:
    case FY_DTYPE_Q5_K: {
        const bool q5 = t == FY_DTYPE_Q5_K;
        const uint8_t *p = row + (b / 8) * (q5 ? 176 : 144);
        const int j = (int)(b % 8);
        int sc, m;
        fyq_k4(p + 4, j, &sc, &m);
        s->a[0] = s->a[1] = fyq_f16(fyq_u16(p)) * (float)sc;
        s->c = -(fyq_f16(fyq_u16(p + 2)) * (float)m);
        for (int i = 0; i < 8; i++) {
            int32_t v = (fyq_i32(p + (q5 ? 48 : 16) + 32 * (j / 2) + 4 * i) >> (4 * (j % 2))) & 0x0F0F0F0F;
            if (q5) v |= ((fyq_i32(p + 16 + 4 * i) >> j) & 0x01010101) << 4;
            s->q[i] = v;
        }
        return;
    }
    case FY_DTYPE_Q6_K: {
        const uint8_t *p = row + (b / 8) * 210;
        const int j = (int)(b % 8);
        const float d = fyq_f16(fyq_u16(p + 208));
        for (int h = 0; h < 2; h++) s->a[h] = d * (float)(int8_t)p[192 + 2 * j + h];
        for (int i = 0; i < 8; i++) {
            int32_t lo = (fyq_i32(p + 64 * (j / 4) + 32 * (j % 2) + 4 * i) >> (4 * (j / 2 % 2))) & 0x0F0F0F0F;
            int32_t hi = (fyq_i32(p + 128 + 32 * (j / 4) + 4 * i) >> (2 * (j % 4))) & 0x03030303;
            s->q[i] = fyq_sub_bytes(lo | (hi << 4), 32);
        }
        return;
    }
    default:
        for (int i = 0; i < 8; i++) s->q[i] = 0;
        s->a[0] = s->a[1] = 0.0f;
        return;
    }
}

/* The block's dot product with 32 activation quants xq (packed as s->q)
 * of scale dx; xsum: whether the type needs the activation sums
 * (fyq_needs_xsum; a constant where the type is). */
FYQ_FN float fyq_sub_dot(const fyq_sub_t *s, const int32_t xq[8], float dx, bool xsum)
{
    int32_t s0 = 0, s1 = 0, x0 = 0, x1 = 0;
    for (int i = 0; i < 4; i++) {
        s0 = fyq_dp4a(s->q[i], xq[i], s0);
        s1 = fyq_dp4a(s->q[i + 4], xq[i + 4], s1);
    }
    float r = s->a[0] * (float)s0 + s->a[1] * (float)s1;
    if (!xsum) return dx * r;
    for (int i = 0; i < 4; i++) {
        x0 = fyq_dp4a(0x01010101, xq[i], x0);
        x1 = fyq_dp4a(0x01010101, xq[i + 4], x1);
    }
    r += s->e[0] * (float)x0 + s->e[1] * (float)x1;
    return dx * r + s->c * (dx * (float)(x0 + x1));
}

/* q8 activation blocks (the CPU backend's quantize_q8a, bit for bit): the
 * scale of a block whose largest magnitude is amax, its inverse, and an
 * element's quant. */
FYQ_FN float fyq_q8_scale(float amax) { return amax / 127.0f; }
FYQ_FN float fyq_q8_inv(float d) { return d != 0.0f ? 1.0f / d : 0.0f; }
FYQ_FN int32_t fyq_q8_round(float x, float id)
{
#ifdef __CUDA_ARCH__
    return __float2int_rn(x * id);
#else
    return (int32_t)nearbyintf(x * id); /* to nearest even, as the CPU's */
#endif
}

#endif /* FY_CUDA_QBLOCK_H */

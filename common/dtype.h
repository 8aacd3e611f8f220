/*
 * dtype.h - element types of weights, activations and KV, and the tensor
 * descriptor that the loaders fill and the kernels read.
 *
 * Quantized types follow GGUF's block formats bit for bit (blocks of 32
 * elements sharing an fp16 scale, plus an fp16 minimum for Q4_1) so that
 * GGUF weights are used in place, straight from the mmap.  FP8 (e4m3)
 * and I8 are plain one-byte element types with no scale of their own:
 * the KV cache (kv.h) keeps a scale per row beside them.  The scalar
 * reference (de)quantizers here are the definition; kernels/ has the fast
 * paths and is tested against these.
 */
#ifndef FY_DTYPE_H
#define FY_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "status.h"

typedef enum fy_dtype {
    FY_DTYPE_F32 = 0,
    FY_DTYPE_F16,
    FY_DTYPE_BF16,
    FY_DTYPE_Q8_0,
    FY_DTYPE_Q4_0,
    FY_DTYPE_Q4_1,
    FY_DTYPE_FP8, /* OCP fp8 e4m3 ("e4m3fn"): KV cache only, one byte per element */
    FY_DTYPE_I8,  /* signed 8-bit integer: KV cache only */
    FY_DTYPE_COUNT
} fy_dtype_t;

#define FY_QK 32 /* elements per quantized block */

typedef struct fy_block_q8_0 {
    uint16_t d;       /* fp16 scale */
    int8_t qs[FY_QK]; /* x = d * q */
} fy_block_q8_0_t;

typedef struct fy_block_q4_0 {
    uint16_t d;            /* fp16 scale */
    uint8_t qs[FY_QK / 2]; /* element i in low nibble of qs[i], i+16 in high; x = d * (q - 8) */
} fy_block_q4_0_t;

typedef struct fy_block_q4_1 {
    uint16_t d;            /* fp16 scale */
    uint16_t m;            /* fp16 minimum */
    uint8_t qs[FY_QK / 2]; /* as q4_0; x = d * q + m */
} fy_block_q4_1_t;

_Static_assert(sizeof(fy_block_q8_0_t) == 34, "q8_0 block is 34 bytes");
_Static_assert(sizeof(fy_block_q4_0_t) == 18, "q4_0 block is 18 bytes");
_Static_assert(sizeof(fy_block_q4_1_t) == 20, "q4_1 block is 20 bytes");

typedef struct fy_dtype_info {
    const char *name;
    int block_elems; /* elements per block (1 for plain types) */
    int block_bytes; /* bytes per block */
} fy_dtype_info_t;

const fy_dtype_info_t *fy_dtype_info(fy_dtype_t dtype);
const char *fy_dtype_name(fy_dtype_t dtype);
/* Parses "f32", "f16", "bf16", "q8_0", ... */
fy_status_t fy_dtype_from_name(const char *name, fy_dtype_t *dtype_p);
/* Bytes of a row of n elements; FY_ERR_INVALID if n is not a whole number
 * of blocks or the size overflows. */
fy_status_t fy_dtype_row_bytes(fy_dtype_t dtype, int64_t n, size_t *bytes_p);
bool fy_dtype_is_quantized(fy_dtype_t dtype);

/*
 * A 1-D or 2-D tensor in row-major order: ne[1] rows of ne[0] elements,
 * each row row_bytes long.  For a weight matrix ne[0] is the input size and
 * ne[1] the output size (GGUF's convention, and safetensors' [out, in]).
 * data points into backend memory: the mmap for the CPU backend.
 * packing is 0 for the layout above; a backend that rearranges a tensor
 * for its kernels (interleaved rows, dequantized copies) sets its own tag
 * and is the only reader of such a tensor.
 */
typedef struct fy_tensor {
    fy_dtype_t dtype;
    int64_t ne[2];
    size_t row_bytes;
    size_t nbytes;
    const void *data;
    uint32_t packing;
} fy_tensor_t;

/* Half and bfloat16 conversions (round to nearest even). */
static inline float fy_fp32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static inline uint32_t fy_fp32_to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static inline float fy_fp16_to_fp32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    if (exp == 0x1f) return fy_fp32_from_bits(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) {
        if (mant == 0) return fy_fp32_from_bits(sign);
        /* subnormal: mant * 2^-24 */
        float v = (float)mant * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return fy_fp32_from_bits(sign | ((exp + 112) << 23) | (mant << 13));
}

static inline uint16_t fy_fp32_to_fp16(float f)
{
    uint32_t x = fy_fp32_to_bits(f);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t mant = x & 0x7fffff;
    int32_t exp = (int32_t)((x >> 23) & 0xff);
    if (exp == 0xff) return (uint16_t)(sign | 0x7c00 | (mant ? 0x200 | (mant >> 13) : 0));
    int32_t e = exp - 127 + 15;
    if (e >= 31) return (uint16_t)(sign | 0x7c00);
    if (e <= 0) {
        if (e < -10) return (uint16_t)sign;
        mant |= 0x800000;
        int shift = 14 - e;
        uint32_t half = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1);
        uint32_t halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = sign | ((uint32_t)e << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++; /* may carry into inf */
    return (uint16_t)h;
}

static inline float fy_bf16_to_fp32(uint16_t h) { return fy_fp32_from_bits((uint32_t)h << 16); }

static inline uint16_t fy_fp32_to_bf16(float f)
{
    uint32_t x = fy_fp32_to_bits(f);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

/*
 * FP8 e4m3 (OCP "e4m3fn"): 1 sign, 4 exponent (bias 7), 3 mantissa bits;
 * no infinities; 0x7f and 0xff are NaN; largest finite 448 (0x7e);
 * subnormals m * 2^-9.  Encoding rounds to nearest even and saturates
 * (anything beyond 448, infinities included, becomes +-448); NaN stays NaN.
 */
static inline float fy_fp8_to_fp32(uint8_t b)
{
    /* exponent and mantissa bits placed at the top of an f32's, then
     * rebiased (127 - 7) by a multiply: right for normals and subnormals
     * alike, without branches, so row loops vectorize */
    uint32_t mag = b & 0x7fu, sign = (uint32_t)(b & 0x80) << 24;
    float v = fy_fp32_from_bits(mag << 20) * 0x1p120f;
    uint32_t bits = mag == 0x7f ? 0x7fc00000u : fy_fp32_to_bits(v);
    return fy_fp32_from_bits(bits | sign);
}

static inline uint8_t fy_fp32_to_fp8(float f)
{
    uint32_t x = fy_fp32_to_bits(f);
    uint8_t sign = (uint8_t)((x >> 24) & 0x80);
    x &= 0x7fffffffu;
    if (x > 0x7f800000u) return (uint8_t)(sign | 0x7f);  /* NaN */
    if (x >= 0x43e00000u) return (uint8_t)(sign | 0x7e); /* >= 448, inf: saturate */
    if (x < 0x3c800000u) {                               /* below 2^-6: subnormal, m * 2^-9 */
        float q = fy_fp32_from_bits(x) * 512.0f;         /* exact, < 8 */
        int qi = (int)q;
        float fr = q - (float)qi;
        if (fr > 0.5f || (fr == 0.5f && (qi & 1))) qi++;
        return (uint8_t)(sign | qi); /* 8 is 2^-6, the smallest normal: same bits */
    }
    uint32_t e = (x >> 23) - 120, mant = x & 0x7fffff;
    uint32_t code = (e << 3) | (mant >> 20), rem = mant & 0xfffff;
    if (rem > 0x80000 || (rem == 0x80000 && (code & 1))) code++; /* may carry into the exponent */
    return (uint8_t)(sign | code);
}

/* Reference conversions of n elements (n a multiple of the block size). */
void fy_dequantize_row(fy_dtype_t dtype, const void *src, float *dst, int64_t n);
/* Quantize floats into dtype; for F32/F16/BF16 a plain conversion. */
void fy_quantize_row(fy_dtype_t dtype, const float *src, void *dst, int64_t n);

#endif /* FY_DTYPE_H */

/*
 * dtype.h - element types of weights, activations and KV, and the tensor
 * descriptor that the loaders fill and the kernels read.
 *
 * Quantized types follow GGUF's block formats bit for bit (ggml-common.h)
 * so that GGUF weights are used in place, straight from the mmap: blocks
 * of 32 elements sharing an fp16 scale (Q8_0, Q4_0, Q5_0, IQ4_NL; plus an
 * fp16 minimum for Q4_1, Q5_1), and the "K-quants" Q2_K..Q6_K, super-blocks
 * of 256 elements with an fp16 scale (and minimum) refined by small integer
 * scales per 16 or 32 elements.  FP8 (e4m3)
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

#include "common/status.h"

typedef enum fy_dtype {
    FY_DTYPE_F32 = 0,
    FY_DTYPE_F16,
    FY_DTYPE_BF16,
    FY_DTYPE_Q8_0,
    FY_DTYPE_Q4_0,
    FY_DTYPE_Q4_1,
    FY_DTYPE_FP8, /* OCP fp8 e4m3 ("e4m3fn"): KV cache only, one byte per element */
    FY_DTYPE_I8,  /* signed 8-bit integer: KV cache only */
    /* weight types added after the KV ones: the numbers of the earlier
     * ones stay as they were (model ids hash them) */
    FY_DTYPE_Q5_0,
    FY_DTYPE_Q5_1,
    FY_DTYPE_IQ4_NL,
    FY_DTYPE_Q2_K,
    FY_DTYPE_Q3_K,
    FY_DTYPE_Q4_K,
    FY_DTYPE_Q5_K,
    FY_DTYPE_Q6_K,
    FY_DTYPE_COUNT
} fy_dtype_t;

#define FY_QK 32    /* elements per quantized block */
#define FY_QK_K 256 /* elements per K-quant super-block */

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

typedef struct fy_block_q5_0 {
    uint16_t d;            /* fp16 scale */
    uint8_t qh[4];         /* bit i (of the little-endian u32) is bit 4 of element i */
    uint8_t qs[FY_QK / 2]; /* low 4 bits, as q4_0; x = d * (q - 16) */
} fy_block_q5_0_t;

typedef struct fy_block_q5_1 {
    uint16_t d;            /* fp16 scale */
    uint16_t m;            /* fp16 minimum */
    uint8_t qh[4];         /* as q5_0 */
    uint8_t qs[FY_QK / 2]; /* as q5_0; x = d * q + m */
} fy_block_q5_1_t;

typedef struct fy_block_iq4_nl {
    uint16_t d;            /* fp16 scale */
    uint8_t qs[FY_QK / 2]; /* 4-bit indices into fy_iq4nl_values, placed as q4_0's; x = d * value */
} fy_block_iq4_nl_t;

/* IQ4_NL's 16 levels (ggml's kvalues_iq4nl) */
extern const int8_t fy_iq4nl_values[16];

/*
 * K-quants: element e of a super-block of 256 (ggml-quants.c,
 * dequantize_row_q*_K):
 *   Q2_K  q = qs[32 (e / 128) + e % 32] >> (2 (e / 32 % 4)) & 3;
 *         s = scales[e / 16]: x = d * (s & 15) * q - dmin * (s >> 4)
 *   Q3_K  q = (qs[32 (e / 128) + e % 32] >> (2 (e / 32 % 4)) & 3)
 *             - (hmask[e % 32] bit (e / 32) ? 0 : 4);
 *         x = d * (s - 32) * q, s the 6-bit scale e / 16 (packed, see dtype.c)
 *   Q4_K  q = qs[32 (e / 64) + e % 32] >> (4 (e / 32 % 2)) & 15;
 *         x = d * sc * q - dmin * m, (sc, m) the 6-bit pair e / 32 (packed)
 *   Q5_K  as Q4_K, plus 16 when qh[e % 32] bit (e / 32) is set
 *   Q6_K  q = (ql[64 (e / 128) + e % 64] >> (4 (e / 64 % 2)) & 15)
 *             | (qh[32 (e / 128) + e % 32] >> (2 (e / 32 % 4)) & 3) << 4;
 *         x = d * scales[e / 16] * (q - 32)
 */
typedef struct fy_block_q2_k {
    uint8_t scales[FY_QK_K / 16]; /* low nibble: scale, high nibble: minimum, per 16 */
    uint8_t qs[FY_QK_K / 4];      /* 2-bit quants */
    uint16_t d;                   /* fp16 super-block scale of the scales */
    uint16_t dmin;                /* fp16 super-block scale of the minimums */
} fy_block_q2_k_t;

typedef struct fy_block_q3_k {
    uint8_t hmask[FY_QK_K / 8]; /* high bit of each quant */
    uint8_t qs[FY_QK_K / 4];    /* low 2 bits */
    uint8_t scales[12];         /* 16 6-bit scales */
    uint16_t d;                 /* fp16 super-block scale */
} fy_block_q3_k_t;

typedef struct fy_block_q4_k {
    uint16_t d;              /* fp16 super-block scale of the scales */
    uint16_t dmin;           /* fp16 super-block scale of the minimums */
    uint8_t scales[12];      /* 8 6-bit scales and 8 6-bit minimums */
    uint8_t qs[FY_QK_K / 2]; /* 4-bit quants */
} fy_block_q4_k_t;

typedef struct fy_block_q5_k {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];      /* as q4_k */
    uint8_t qh[FY_QK_K / 8]; /* fifth bit of each quant */
    uint8_t qs[FY_QK_K / 2]; /* low 4 bits */
} fy_block_q5_k_t;

typedef struct fy_block_q6_k {
    uint8_t ql[FY_QK_K / 2];     /* low 4 bits */
    uint8_t qh[FY_QK_K / 4];     /* high 2 bits */
    int8_t scales[FY_QK_K / 16]; /* 8-bit scales, per 16 */
    uint16_t d;                  /* fp16 super-block scale */
} fy_block_q6_k_t;

_Static_assert(sizeof(fy_block_q8_0_t) == 34, "q8_0 block is 34 bytes");
_Static_assert(sizeof(fy_block_q4_0_t) == 18, "q4_0 block is 18 bytes");
_Static_assert(sizeof(fy_block_q4_1_t) == 20, "q4_1 block is 20 bytes");
_Static_assert(sizeof(fy_block_q5_0_t) == 22, "q5_0 block is 22 bytes");
_Static_assert(sizeof(fy_block_q5_1_t) == 24, "q5_1 block is 24 bytes");
_Static_assert(sizeof(fy_block_iq4_nl_t) == 18, "iq4_nl block is 18 bytes");
_Static_assert(sizeof(fy_block_q2_k_t) == 84, "q2_k block is 84 bytes");
_Static_assert(sizeof(fy_block_q3_k_t) == 110, "q3_k block is 110 bytes");
_Static_assert(sizeof(fy_block_q4_k_t) == 144, "q4_k block is 144 bytes");
_Static_assert(sizeof(fy_block_q5_k_t) == 176, "q5_k block is 176 bytes");
_Static_assert(sizeof(fy_block_q6_k_t) == 210, "q6_k block is 210 bytes");

/* Scale j and minimum j (j < 8) of a Q4_K/Q5_K block's 12 packed bytes
 * (ggml's get_scale_min_k4). */
static inline void fy_k4_scale_min(const uint8_t *q, int j, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* The 16 6-bit scales (0..63, stored with a bias of 32) of a Q3_K block's
 * 12 packed bytes. */
static inline void fy_k3_scales(const uint8_t *q, uint8_t out[16])
{
    for (int i = 0; i < 16; i++)
        out[i] = (uint8_t)(((q[i % 8] >> (4 * (i / 8))) & 0xf) | (((q[8 + i % 4] >> (2 * (i / 4))) & 3) << 4));
}

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

/* Reference conversions of n elements (n a multiple of the block size).
 * Dequantization is ggml's, operation for operation (the same f32 products
 * in the same order, no fused multiply-add), so it gives ggml's bits. */
void fy_dequantize_row(fy_dtype_t dtype, const void *src, float *dst, int64_t n);
/* Quantize floats into dtype; for F32/F16/BF16 a plain conversion.  For
 * the types ferry only reads (Q5_0 on), a simple round-to-nearest
 * quantizer that writes valid blocks of bounded error, for tests and
 * benchmark models; not llama.cpp's search for the best scales, so its
 * blocks differ from llama-quantize's. */
void fy_quantize_row(fy_dtype_t dtype, const float *src, void *dst, int64_t n);

#endif /* FY_DTYPE_H */

/* dtype.c - type table and the reference (scalar) quantizers. */
#include "common/dtype.h"

#include <math.h>

#include "common/mem.h"

static const fy_dtype_info_t g_info[FY_DTYPE_COUNT] = {
    [FY_DTYPE_F32] = {"f32", 1, 4},
    [FY_DTYPE_F16] = {"f16", 1, 2},
    [FY_DTYPE_BF16] = {"bf16", 1, 2},
    [FY_DTYPE_Q8_0] = {"q8_0", FY_QK, sizeof(fy_block_q8_0_t)},
    [FY_DTYPE_Q4_0] = {"q4_0", FY_QK, sizeof(fy_block_q4_0_t)},
    [FY_DTYPE_Q4_1] = {"q4_1", FY_QK, sizeof(fy_block_q4_1_t)},
    [FY_DTYPE_FP8] = {"fp8", 1, 1},
    [FY_DTYPE_I8] = {"int8", 1, 1},
    [FY_DTYPE_Q5_0] = {"q5_0", FY_QK, sizeof(fy_block_q5_0_t)},
    [FY_DTYPE_Q5_1] = {"q5_1", FY_QK, sizeof(fy_block_q5_1_t)},
    [FY_DTYPE_IQ4_NL] = {"iq4_nl", FY_QK, sizeof(fy_block_iq4_nl_t)},
    [FY_DTYPE_Q2_K] = {"q2_k", FY_QK_K, sizeof(fy_block_q2_k_t)},
    [FY_DTYPE_Q3_K] = {"q3_k", FY_QK_K, sizeof(fy_block_q3_k_t)},
    [FY_DTYPE_Q4_K] = {"q4_k", FY_QK_K, sizeof(fy_block_q4_k_t)},
    [FY_DTYPE_Q5_K] = {"q5_k", FY_QK_K, sizeof(fy_block_q5_k_t)},
    [FY_DTYPE_Q6_K] = {"q6_k", FY_QK_K, sizeof(fy_block_q6_k_t)},
};

const int8_t fy_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

const fy_dtype_info_t *fy_dtype_info(fy_dtype_t dtype)
{
    if ((unsigned)dtype >= FY_DTYPE_COUNT) return NULL;
    return &g_info[dtype];
}

const char *fy_dtype_name(fy_dtype_t dtype)
{
    const fy_dtype_info_t *info = fy_dtype_info(dtype);
    return info ? info->name : "?";
}

fy_status_t fy_dtype_from_name(const char *name, fy_dtype_t *dtype_p)
{
    for (int i = 0; i < FY_DTYPE_COUNT; i++) {
        if (strcmp(name, g_info[i].name) == 0) {
            *dtype_p = (fy_dtype_t)i;
            return FY_OK;
        }
    }
    return FY_ERR_INVALID;
}

bool fy_dtype_is_quantized(fy_dtype_t dtype) { return fy_dtype_info(dtype)->block_elems > 1; }

fy_status_t fy_dtype_row_bytes(fy_dtype_t dtype, int64_t n, size_t *bytes_p)
{
    const fy_dtype_info_t *info = fy_dtype_info(dtype);
    if (!info || n < 0 || n % info->block_elems != 0) return FY_ERR_INVALID;
    size_t bytes;
    if (!fy_mul_size((size_t)(n / info->block_elems), (size_t)info->block_bytes, &bytes)) return FY_ERR_INVALID;
    *bytes_p = bytes;
    return FY_OK;
}

/* 16-bit values at any address: safetensors does not align tensor data */
static inline uint16_t load_u16(const void *p, int64_t i)
{
    uint16_t v;
    memcpy(&v, (const char *)p + 2 * i, 2);
    return v;
}

void fy_dequantize_row(fy_dtype_t dtype, const void *src, float *dst, int64_t n)
{
    switch (dtype) {
    case FY_DTYPE_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case FY_DTYPE_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = fy_fp16_to_fp32(load_u16(src, i));
        break;
    case FY_DTYPE_BF16:
        for (int64_t i = 0; i < n; i++) dst[i] = fy_bf16_to_fp32(load_u16(src, i));
        break;
    case FY_DTYPE_Q8_0: {
        const fy_block_q8_0_t *b = src;
        for (int64_t i = 0; i < n / FY_QK; i++) {
            float d = fy_fp16_to_fp32(b[i].d);
            for (int j = 0; j < FY_QK; j++) dst[i * FY_QK + j] = d * (float)b[i].qs[j];
        }
        break;
    }
    case FY_DTYPE_Q4_0: {
        const fy_block_q4_0_t *b = src;
        for (int64_t i = 0; i < n / FY_QK; i++) {
            float d = fy_fp16_to_fp32(b[i].d);
            for (int j = 0; j < FY_QK / 2; j++) {
                dst[i * FY_QK + j] = d * (float)((b[i].qs[j] & 0x0f) - 8);
                dst[i * FY_QK + j + FY_QK / 2] = d * (float)((b[i].qs[j] >> 4) - 8);
            }
        }
        break;
    }
    case FY_DTYPE_Q4_1: {
        const fy_block_q4_1_t *b = src;
        for (int64_t i = 0; i < n / FY_QK; i++) {
            float d = fy_fp16_to_fp32(b[i].d);
            float m = fy_fp16_to_fp32(b[i].m);
            for (int j = 0; j < FY_QK / 2; j++) {
                dst[i * FY_QK + j] = d * (float)(b[i].qs[j] & 0x0f) + m;
                dst[i * FY_QK + j + FY_QK / 2] = d * (float)(b[i].qs[j] >> 4) + m;
            }
        }
        break;
    }
    case FY_DTYPE_FP8:
        for (int64_t i = 0; i < n; i++) dst[i] = fy_fp8_to_fp32(((const uint8_t *)src)[i]);
        break;
    case FY_DTYPE_I8:
        for (int64_t i = 0; i < n; i++) dst[i] = (float)((const int8_t *)src)[i];
        break;
    case FY_DTYPE_Q5_0: {
        const fy_block_q5_0_t *b = src;
        for (int64_t i = 0; i < n / FY_QK; i++) {
            float d = fy_fp16_to_fp32(b[i].d);
            uint32_t qh;
            memcpy(&qh, b[i].qh, 4);
            for (int j = 0; j < FY_QK / 2; j++) {
                int x0 = (int)((b[i].qs[j] & 0x0f) | (((qh >> j) << 4) & 0x10)) - 16;
                int x1 = (int)((b[i].qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) - 16;
                dst[i * FY_QK + j] = (float)x0 * d;
                dst[i * FY_QK + j + FY_QK / 2] = (float)x1 * d;
            }
        }
        break;
    }
    case FY_DTYPE_Q5_1: {
        const fy_block_q5_1_t *b = src;
        for (int64_t i = 0; i < n / FY_QK; i++) {
            float d = fy_fp16_to_fp32(b[i].d), m = fy_fp16_to_fp32(b[i].m);
            uint32_t qh;
            memcpy(&qh, b[i].qh, 4);
            for (int j = 0; j < FY_QK / 2; j++) {
                int x0 = (int)((b[i].qs[j] & 0x0f) | (((qh >> j) << 4) & 0x10));
                int x1 = (int)((b[i].qs[j] >> 4) | ((qh >> (j + 12)) & 0x10));
                dst[i * FY_QK + j] = (float)x0 * d + m;
                dst[i * FY_QK + j + FY_QK / 2] = (float)x1 * d + m;
            }
        }
        break;
    }
    case FY_DTYPE_IQ4_NL: {
        const fy_block_iq4_nl_t *b = src;
        for (int64_t i = 0; i < n / FY_QK; i++) {
            float d = fy_fp16_to_fp32(b[i].d);
            for (int j = 0; j < FY_QK / 2; j++) {
                dst[i * FY_QK + j] = d * (float)fy_iq4nl_values[b[i].qs[j] & 0x0f];
                dst[i * FY_QK + j + FY_QK / 2] = d * (float)fy_iq4nl_values[b[i].qs[j] >> 4];
            }
        }
        break;
    }
    case FY_DTYPE_Q2_K: {
        const fy_block_q2_k_t *b = src;
        for (int64_t i = 0; i < n / FY_QK_K; i++) {
            float d = fy_fp16_to_fp32(b[i].d), min = fy_fp16_to_fp32(b[i].dmin);
            float *y = dst + i * FY_QK_K;
            for (int e = 0; e < FY_QK_K; e++) {
                uint8_t sc = b[i].scales[e / 16];
                float dl = d * (float)(sc & 0xf), ml = min * (float)(sc >> 4);
                int q = (b[i].qs[32 * (e / 128) + e % 32] >> (2 * (e / 32 % 4))) & 3;
                y[e] = dl * (float)q - ml;
            }
        }
        break;
    }
    case FY_DTYPE_Q3_K: {
        const fy_block_q3_k_t *b = src;
        for (int64_t i = 0; i < n / FY_QK_K; i++) {
            float d = fy_fp16_to_fp32(b[i].d);
            uint8_t sc[16];
            fy_k3_scales(b[i].scales, sc);
            float *y = dst + i * FY_QK_K;
            for (int e = 0; e < FY_QK_K; e++) {
                float dl = d * (float)(sc[e / 16] - 32);
                int q = ((b[i].qs[32 * (e / 128) + e % 32] >> (2 * (e / 32 % 4))) & 3) -
                        ((b[i].hmask[e % 32] >> (e / 32)) & 1 ? 0 : 4);
                y[e] = dl * (float)q;
            }
        }
        break;
    }
    case FY_DTYPE_Q4_K:
    case FY_DTYPE_Q5_K: {
        /* the same but for Q5_K's fifth bit; d * sc and dmin * m rounded
         * to f32 first, as ggml does */
        const bool q5 = dtype == FY_DTYPE_Q5_K;
        for (int64_t i = 0; i < n / FY_QK_K; i++) {
            const fy_block_q4_k_t *b4 = (const fy_block_q4_k_t *)src + i;
            const fy_block_q5_k_t *b5 = (const fy_block_q5_k_t *)src + i;
            const uint8_t *scales = q5 ? b5->scales : b4->scales, *qs = q5 ? b5->qs : b4->qs;
            float d = fy_fp16_to_fp32(q5 ? b5->d : b4->d), min = fy_fp16_to_fp32(q5 ? b5->dmin : b4->dmin);
            float *y = dst + i * FY_QK_K;
            for (int j = 0; j < 8; j++) {
                uint8_t sc, m;
                fy_k4_scale_min(scales, j, &sc, &m);
                float d1 = d * (float)sc, m1 = min * (float)m;
                for (int l = 0; l < 32; l++) {
                    int q = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0xf;
                    if (q5 && (b5->qh[l] >> j) & 1) q += 16;
                    y[32 * j + l] = d1 * (float)q - m1;
                }
            }
        }
        break;
    }
    case FY_DTYPE_Q6_K: {
        const fy_block_q6_k_t *b = src;
        for (int64_t i = 0; i < n / FY_QK_K; i++) {
            float d = fy_fp16_to_fp32(b[i].d);
            float *y = dst + i * FY_QK_K;
            for (int e = 0; e < FY_QK_K; e++) {
                int lo = (b[i].ql[64 * (e / 128) + e % 64] >> (4 * (e / 64 % 2))) & 0xf;
                int hi = (b[i].qh[32 * (e / 128) + e % 32] >> (2 * (e / 32 % 4))) & 3;
                y[e] = d * (float)b[i].scales[e / 16] * (float)((lo | (hi << 4)) - 32);
            }
        }
        break;
    }
    case FY_DTYPE_COUNT: break;
    }
}

/* ---- quantizers for the read-only types: round to nearest, valid blocks ---------------- */

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* to nearest (ties to even), clamped; 0 where s is 0 */
static inline int qround(float x, float s, int lo, int hi)
{
    return s != 0.0f ? clampi((int)lrintf(x / s), lo, hi) : 0;
}

/* the element of largest magnitude, with its sign */
static float signed_amax(const float *x, int n)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

/* the fp16 a block stores for v, and the value it reads back */
static inline float fp16_round(float v, uint16_t *h)
{
    *h = fy_fp32_to_fp16(v);
    return fy_fp16_to_fp32(*h);
}

/* 5-bit quants q[32] into qh/qs as Q5_0 and Q5_1 place them */
static void put_q5(const int *q, uint8_t *qh, uint8_t *qs)
{
    uint32_t h = 0;
    for (int j = 0; j < FY_QK / 2; j++) {
        qs[j] = (uint8_t)((q[j] & 0xf) | ((q[j + 16] & 0xf) << 4));
        h |= (uint32_t)(q[j] >> 4) << j;
        h |= (uint32_t)(q[j + 16] >> 4) << (j + 16);
    }
    memcpy(qh, &h, 4);
}

static void quantize_q5_0(const float *x, fy_block_q5_0_t *b)
{
    float d = fp16_round(signed_amax(x, FY_QK) / -16.0f, &b->d);
    int q[FY_QK];
    for (int j = 0; j < FY_QK; j++) q[j] = qround(x[j], d, -16, 15) + 16;
    put_q5(q, b->qh, b->qs);
}

static void quantize_q5_1(const float *x, fy_block_q5_1_t *b)
{
    float min = x[0], max = x[0];
    for (int j = 1; j < FY_QK; j++) min = fminf(min, x[j]), max = fmaxf(max, x[j]);
    float d = fp16_round((max - min) / 31.0f, &b->d), m = fp16_round(min, &b->m);
    int q[FY_QK];
    for (int j = 0; j < FY_QK; j++) q[j] = qround(x[j] - m, d, 0, 31);
    put_q5(q, b->qh, b->qs);
}

static int iq4nl_nearest(float v)
{
    int best = 0;
    for (int k = 1; k < 16; k++)
        if (fabsf(v - (float)fy_iq4nl_values[k]) < fabsf(v - (float)fy_iq4nl_values[best])) best = k;
    return best;
}

/* the largest magnitude on the outermost level, then the least-squares
 * scale for the levels chosen */
static void quantize_iq4_nl(const float *x, fy_block_iq4_nl_t *b)
{
    float d0 = signed_amax(x, FY_QK) / (float)fy_iq4nl_values[0];
    int k[FY_QK];
    double sqx = 0, sqq = 0;
    for (int j = 0; j < FY_QK; j++) {
        k[j] = d0 != 0.0f ? iq4nl_nearest(x[j] / d0) : 8;
        double v = fy_iq4nl_values[k[j]];
        sqx += v * x[j], sqq += v * v;
    }
    fp16_round(sqq > 0 ? (float)(sqx / sqq) : 0.0f, &b->d);
    for (int j = 0; j < FY_QK / 2; j++) b->qs[j] = (uint8_t)(k[j] | (k[j + 16] << 4));
}

static void quantize_q2_k(const float *x, fy_block_q2_k_t *b)
{
    float scale[16], mins[16], smax = 0.0f, mmax = 0.0f;
    for (int i = 0; i < 16; i++) {
        float mn = 0.0f, mx = x[16 * i];
        for (int l = 0; l < 16; l++) mn = fminf(mn, x[16 * i + l]), mx = fmaxf(mx, x[16 * i + l]);
        scale[i] = (mx - mn) / 3.0f, mins[i] = -mn;
        smax = fmaxf(smax, scale[i]), mmax = fmaxf(mmax, mins[i]);
    }
    float d = fp16_round(smax / 15.0f, &b->d), dmin = fp16_round(mmax / 15.0f, &b->dmin);
    memset(b->qs, 0, sizeof(b->qs));
    for (int i = 0; i < 16; i++) {
        int ls = qround(scale[i], d, 0, 15), lm = qround(mins[i], dmin, 0, 15);
        b->scales[i] = (uint8_t)(ls | (lm << 4));
        float dl = d * (float)ls, ml = dmin * (float)lm;
        for (int l = 0; l < 16; l++) {
            int e = 16 * i + l, q = qround(x[e] + ml, dl, 0, 3);
            b->qs[32 * (e / 128) + e % 32] |= (uint8_t)(q << (2 * (e / 32 % 4)));
        }
    }
}

static void quantize_q3_k(const float *x, fy_block_q3_k_t *b)
{
    float scale[16], smax = 0.0f;
    for (int i = 0; i < 16; i++) {
        scale[i] = signed_amax(x + 16 * i, 16) / -4.0f; /* the largest magnitude on -4 */
        if (fabsf(scale[i]) > fabsf(smax)) smax = scale[i];
    }
    float d = fp16_round(smax / -32.0f, &b->d);
    memset(b->hmask, 0, sizeof(b->hmask));
    memset(b->qs, 0, sizeof(b->qs));
    memset(b->scales, 0, sizeof(b->scales));
    for (int i = 0; i < 16; i++) {
        int ls = qround(scale[i], d, -32, 31);
        int v = ls + 32;
        b->scales[i % 8] |= (uint8_t)((v & 0xf) << (4 * (i / 8)));
        b->scales[8 + i % 4] |= (uint8_t)((v >> 4) << (2 * (i / 4)));
        float dl = d * (float)ls;
        for (int l = 0; l < 16; l++) {
            int e = 16 * i + l, q = qround(x[e], dl, -4, 3) + 4;
            b->qs[32 * (e / 128) + e % 32] |= (uint8_t)((q & 3) << (2 * (e / 32 % 4)));
            if (q & 4) b->hmask[e % 32] |= (uint8_t)(1u << (e / 32));
        }
    }
}

/* Q4_K (bits 4) and Q5_K (bits 5): per 32 a scale and a minimum, each
 * 6 bits against the super-block's d and dmin */
static void quantize_k45(const float *x, int bits, uint16_t *d_h, uint16_t *dmin_h, uint8_t *scales, uint8_t *qs,
                         uint8_t *qh)
{
    const int qmax = (1 << bits) - 1;
    float scale[8], mins[8], smax = 0.0f, mmax = 0.0f;
    for (int j = 0; j < 8; j++) {
        float mn = 0.0f, mx = x[32 * j];
        for (int l = 0; l < 32; l++) mn = fminf(mn, x[32 * j + l]), mx = fmaxf(mx, x[32 * j + l]);
        scale[j] = (mx - mn) / (float)qmax, mins[j] = -mn;
        smax = fmaxf(smax, scale[j]), mmax = fmaxf(mmax, mins[j]);
    }
    float d = fp16_round(smax / 63.0f, d_h), dmin = fp16_round(mmax / 63.0f, dmin_h);
    memset(scales, 0, 12);
    memset(qs, 0, FY_QK_K / 2);
    if (qh) memset(qh, 0, FY_QK_K / 8);
    for (int j = 0; j < 8; j++) {
        int ls = qround(scale[j], d, 0, 63), lm = qround(mins[j], dmin, 0, 63);
        if (j < 4) {
            scales[j] |= (uint8_t)ls;
            scales[j + 4] |= (uint8_t)lm;
        } else {
            scales[j + 4] = (uint8_t)((ls & 0xf) | ((lm & 0xf) << 4));
            scales[j - 4] |= (uint8_t)((ls >> 4) << 6);
            scales[j] |= (uint8_t)((lm >> 4) << 6);
        }
        float dl = d * (float)ls, ml = dmin * (float)lm;
        for (int l = 0; l < 32; l++) {
            int q = qround(x[32 * j + l] + ml, dl, 0, qmax);
            qs[32 * (j / 2) + l] |= (uint8_t)((q & 0xf) << (4 * (j % 2)));
            if (qh && q > 15) qh[l] |= (uint8_t)(1u << j);
        }
    }
}

static void quantize_q6_k(const float *x, fy_block_q6_k_t *b)
{
    float scale[16], smax = 0.0f;
    for (int i = 0; i < 16; i++) {
        scale[i] = signed_amax(x + 16 * i, 16) / -32.0f;
        if (fabsf(scale[i]) > fabsf(smax)) smax = scale[i];
    }
    float d = fp16_round(smax / -127.0f, &b->d);
    memset(b->ql, 0, sizeof(b->ql));
    memset(b->qh, 0, sizeof(b->qh));
    for (int i = 0; i < 16; i++) {
        int ls = qround(scale[i], d, -127, 127);
        b->scales[i] = (int8_t)ls;
        float dl = d * (float)ls;
        for (int l = 0; l < 16; l++) {
            int e = 16 * i + l, q = qround(x[e], dl, -32, 31) + 32;
            b->ql[64 * (e / 128) + e % 64] |= (uint8_t)((q & 0xf) << (4 * (e / 64 % 2)));
            b->qh[32 * (e / 128) + e % 32] |= (uint8_t)((q >> 4) << (2 * (e / 32 % 4)));
        }
    }
}

void fy_quantize_row(fy_dtype_t dtype, const float *src, void *dst, int64_t n)
{
    switch (dtype) {
    case FY_DTYPE_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case FY_DTYPE_F16: {
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = fy_fp32_to_fp16(src[i]);
        break;
    }
    case FY_DTYPE_BF16: {
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = fy_fp32_to_bf16(src[i]);
        break;
    }
    case FY_DTYPE_Q8_0: {
        fy_block_q8_0_t *b = dst;
        for (int64_t i = 0; i < n / FY_QK; i++) {
            const float *x = src + i * FY_QK;
            float amax = 0.0f;
            for (int j = 0; j < FY_QK; j++) amax = fmaxf(amax, fabsf(x[j]));
            float d = amax / 127.0f;
            float id = d ? 1.0f / d : 0.0f;
            b[i].d = fy_fp32_to_fp16(d);
            for (int j = 0; j < FY_QK; j++) b[i].qs[j] = (int8_t)roundf(x[j] * id);
        }
        break;
    }
    case FY_DTYPE_Q4_0: {
        /* as GGUF: the element of largest magnitude maps to -8 */
        fy_block_q4_0_t *b = dst;
        for (int64_t i = 0; i < n / FY_QK; i++) {
            const float *x = src + i * FY_QK;
            float amax = 0.0f, max = 0.0f;
            for (int j = 0; j < FY_QK; j++) {
                if (fabsf(x[j]) > amax) {
                    amax = fabsf(x[j]);
                    max = x[j];
                }
            }
            float d = max / -8.0f;
            float id = d ? 1.0f / d : 0.0f;
            b[i].d = fy_fp32_to_fp16(d);
            for (int j = 0; j < FY_QK / 2; j++) {
                int q0 = (int)fminf(15.0f, x[j] * id + 8.5f);
                int q1 = (int)fminf(15.0f, x[j + FY_QK / 2] * id + 8.5f);
                b[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
            }
        }
        break;
    }
    case FY_DTYPE_Q4_1: {
        fy_block_q4_1_t *b = dst;
        for (int64_t i = 0; i < n / FY_QK; i++) {
            const float *x = src + i * FY_QK;
            float min = x[0], max = x[0];
            for (int j = 1; j < FY_QK; j++) {
                min = fminf(min, x[j]);
                max = fmaxf(max, x[j]);
            }
            float d = (max - min) / 15.0f;
            float id = d ? 1.0f / d : 0.0f;
            b[i].d = fy_fp32_to_fp16(d);
            b[i].m = fy_fp32_to_fp16(min);
            for (int j = 0; j < FY_QK / 2; j++) {
                int q0 = (int)fminf(15.0f, (x[j] - min) * id + 0.5f);
                int q1 = (int)fminf(15.0f, (x[j + FY_QK / 2] - min) * id + 0.5f);
                b[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
            }
        }
        break;
    }
    case FY_DTYPE_FP8:
        for (int64_t i = 0; i < n; i++) ((uint8_t *)dst)[i] = fy_fp32_to_fp8(src[i]);
        break;
    case FY_DTYPE_I8: /* unscaled: round to nearest, saturate to [-127, 127] */
        for (int64_t i = 0; i < n; i++) ((int8_t *)dst)[i] = (int8_t)fmaxf(-127.0f, fminf(127.0f, roundf(src[i])));
        break;
    case FY_DTYPE_Q5_0:
        for (int64_t i = 0; i < n / FY_QK; i++) quantize_q5_0(src + i * FY_QK, (fy_block_q5_0_t *)dst + i);
        break;
    case FY_DTYPE_Q5_1:
        for (int64_t i = 0; i < n / FY_QK; i++) quantize_q5_1(src + i * FY_QK, (fy_block_q5_1_t *)dst + i);
        break;
    case FY_DTYPE_IQ4_NL:
        for (int64_t i = 0; i < n / FY_QK; i++) quantize_iq4_nl(src + i * FY_QK, (fy_block_iq4_nl_t *)dst + i);
        break;
    case FY_DTYPE_Q2_K:
        for (int64_t i = 0; i < n / FY_QK_K; i++) quantize_q2_k(src + i * FY_QK_K, (fy_block_q2_k_t *)dst + i);
        break;
    case FY_DTYPE_Q3_K:
        for (int64_t i = 0; i < n / FY_QK_K; i++) quantize_q3_k(src + i * FY_QK_K, (fy_block_q3_k_t *)dst + i);
        break;
    case FY_DTYPE_Q4_K:
        for (int64_t i = 0; i < n / FY_QK_K; i++) {
            fy_block_q4_k_t *b = (fy_block_q4_k_t *)dst + i;
            quantize_k45(src + i * FY_QK_K, 4, &b->d, &b->dmin, b->scales, b->qs, NULL);
        }
        break;
    case FY_DTYPE_Q5_K:
        for (int64_t i = 0; i < n / FY_QK_K; i++) {
            fy_block_q5_k_t *b = (fy_block_q5_k_t *)dst + i;
            quantize_k45(src + i * FY_QK_K, 5, &b->d, &b->dmin, b->scales, b->qs, b->qh);
        }
        break;
    case FY_DTYPE_Q6_K:
        for (int64_t i = 0; i < n / FY_QK_K; i++) quantize_q6_k(src + i * FY_QK_K, (fy_block_q6_k_t *)dst + i);
        break;
    case FY_DTYPE_COUNT: break;
    }
}

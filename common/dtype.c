/* dtype.c - type table and the reference (scalar) quantizers. */
#include "dtype.h"

#include <math.h>

#include "mem.h"

static const fy_dtype_info_t g_info[FY_DTYPE_COUNT] = {
    [FY_DTYPE_F32] = {"f32", 1, 4},
    [FY_DTYPE_F16] = {"f16", 1, 2},
    [FY_DTYPE_BF16] = {"bf16", 1, 2},
    [FY_DTYPE_Q8_0] = {"q8_0", FY_QK, sizeof(fy_block_q8_0_t)},
    [FY_DTYPE_Q4_0] = {"q4_0", FY_QK, sizeof(fy_block_q4_0_t)},
    [FY_DTYPE_Q4_1] = {"q4_1", FY_QK, sizeof(fy_block_q4_1_t)},
    [FY_DTYPE_FP8] = {"fp8", 1, 1},
    [FY_DTYPE_I8] = {"int8", 1, 1},
};

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
    case FY_DTYPE_COUNT: break;
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
    case FY_DTYPE_COUNT: break;
    }
}

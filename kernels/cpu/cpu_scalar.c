/*
 * cpu_scalar.c - portable C versions of the CPU inner loops: the fallback
 * on machines without AVX2, and the reference the AVX2 versions are
 * tested against.
 */
#include <math.h>

#include "cpu_kernels.h"

static void quantize_q8a(const float *x, fy_block_q8a_t *y, int64_t n)
{
    for (int64_t b = 0; b < n / FY_QK; b++) {
        const float *xb = x + b * FY_QK;
        float amax = 0.0f;
        for (int j = 0; j < FY_QK; j++) amax = fmaxf(amax, fabsf(xb[j]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < FY_QK; j++) {
            int q = (int)nearbyintf(xb[j] * id); /* to nearest even, as AVX2's cvtps */
            y[b].qs[j] = (int8_t)q;
            sum += q;
        }
        y[b].d = d;
        y[b].s = d * (float)sum;
    }
}

static float dot_q8_0(const void *w, const void *x, int64_t n)
{
    const fy_block_q8_0_t *wb = w;
    const fy_block_q8a_t *xb = x;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / FY_QK; b++) {
        int isum = 0;
        for (int j = 0; j < FY_QK; j++) isum += wb[b].qs[j] * xb[b].qs[j];
        sum += fy_fp16_to_fp32(wb[b].d) * xb[b].d * (float)isum;
    }
    return sum;
}

static float dot_q4_0(const void *w, const void *x, int64_t n)
{
    const fy_block_q4_0_t *wb = w;
    const fy_block_q8a_t *xb = x;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / FY_QK; b++) {
        int isum = 0;
        for (int j = 0; j < FY_QK / 2; j++) {
            isum += ((wb[b].qs[j] & 0x0f) - 8) * xb[b].qs[j];
            isum += ((wb[b].qs[j] >> 4) - 8) * xb[b].qs[j + FY_QK / 2];
        }
        sum += fy_fp16_to_fp32(wb[b].d) * xb[b].d * (float)isum;
    }
    return sum;
}

static float dot_q4_1(const void *w, const void *x, int64_t n)
{
    const fy_block_q4_1_t *wb = w;
    const fy_block_q8a_t *xb = x;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / FY_QK; b++) {
        int isum = 0;
        for (int j = 0; j < FY_QK / 2; j++) {
            isum += (wb[b].qs[j] & 0x0f) * xb[b].qs[j];
            isum += (wb[b].qs[j] >> 4) * xb[b].qs[j + FY_QK / 2];
        }
        sum += fy_fp16_to_fp32(wb[b].d) * xb[b].d * (float)isum + fy_fp16_to_fp32(wb[b].m) * xb[b].s;
    }
    return sum;
}

static float dot_f32(const void *w, const void *x, int64_t n)
{
    const float *a = w, *b = x;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) sum += a[i] * b[i];
    return sum;
}

static float dot_f16(const void *w, const void *x, int64_t n)
{
    const uint16_t *a = w;
    const float *b = x;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) sum += fy_fp16_to_fp32(a[i]) * b[i];
    return sum;
}

static float dot_bf16(const void *w, const void *x, int64_t n)
{
    const uint16_t *a = w;
    const float *b = x;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) sum += fy_bf16_to_fp32(a[i]) * b[i];
    return sum;
}

static void axpy_f32(float *y, float a, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

static void axpy_f16(float *y, float a, const uint16_t *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] += a * fy_fp16_to_fp32(x[i]);
}

static void f32_to_f16(const float *x, uint16_t *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] = fy_fp32_to_fp16(x[i]);
}

const fy_cpu_kernels_t fy_cpu_kernels_scalar = {
    .name = "scalar",
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

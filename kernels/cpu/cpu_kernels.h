/*
 * cpu_kernels.h - the inner loops of the CPU backend, one table per
 * instruction set (scalar, AVX2+FMA+F16C), picked at run time.
 *
 * Quantized weights are multiplied straight from their GGUF blocks: the
 * activation row is quantized once to Q8A blocks (32 int8 plus an f32
 * scale d and d * sum(q)), and each weight block contributes an integer
 * dot product times two scales (plus min * d * sum(q) for Q4_1).  No
 * dequantized copy of any weight matrix exists.
 */
#ifndef FY_CPU_KERNELS_H
#define FY_CPU_KERNELS_H

#include <stdint.h>

#include "dtype.h"

typedef struct fy_block_q8a {
    float d;          /* scale */
    float s;          /* d * sum(qs) */
    int8_t qs[FY_QK]; /* x ~= d * q */
} fy_block_q8a_t;

/* dot of one weight row (n elements of dtype) with one activation row:
 * a Q8A row for quantized dtypes, an f32 row otherwise. */
typedef float (*fy_vec_dot_fn)(const void *w, const void *x, int64_t n);

typedef struct fy_cpu_kernels {
    const char *name;
    /* x (n floats, n % 32 == 0) to n / 32 Q8A blocks */
    void (*quantize_q8a)(const float *x, fy_block_q8a_t *y, int64_t n);
    fy_vec_dot_fn vec_dot[FY_DTYPE_COUNT];
    /* y += a * x, x in f32 or f16 (the KV cache types) */
    void (*axpy_f32)(float *y, float a, const float *x, int64_t n);
    void (*axpy_f16)(float *y, float a, const uint16_t *x, int64_t n);
    /* f16 <-> f32 rows (KV writes) */
    void (*f32_to_f16)(const float *x, uint16_t *y, int64_t n);
} fy_cpu_kernels_t;

extern const fy_cpu_kernels_t fy_cpu_kernels_scalar;
extern const fy_cpu_kernels_t fy_cpu_kernels_avx2;
/* Does this machine run the AVX2 table (AVX2, FMA and F16C)? */
int fy_cpu_has_avx2(void);

#endif /* FY_CPU_KERNELS_H */

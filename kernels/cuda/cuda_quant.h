/*
 * cuda_quant.h - the CUDA backend's weight kernels (cuda_quant.cu): the
 * matmul and embedding of weights kept on the device as their file stores
 * them (kernels/cuda_plan.h says which kernel serves which type and n;
 * kernels/cuda_qblock.h is how each reads a block).  Launchers enqueue on
 * the given stream and return the launch's cudaError_t; they never
 * synchronize or allocate.  w / table: rows of row_bytes bytes
 * (fy_dtype_row_bytes of their width), row r at w + r * row_bytes.
 *
 * Compiled for sm_80 and sm_90 with warnings as errors; its block reading
 * is tested on the CPU, and every kernel against the CPU backend on a GPU
 * (test_cuda; first run on an H200, 2026-11-28).
 *
 * Only kernels/cuda/ includes this header.
 */
#ifndef FY_CUDA_QUANT_H
#define FY_CUDA_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

/* x [n, in] f32 (in a multiple of 32) to the q8 activation blocks of the
 * vector kernels: xq [n, in] int8 and xd [n, in / 32] f32, the CPU
 * backend's quantize_q8a bit for bit. */
cudaError_t fy_cuda_quantize_q8(const float *x, int32_t n, int32_t in, int8_t *xq, float *xd, cudaStream_t s);

/* y[t * rows + r] = w_r . x_t for t < n <= FY_CUDA_MMV_MAX_N: for a
 * quantized dtype from xq/xd (fy_cuda_quantize_q8 of x), for F32, F16 and
 * BF16 from x itself ([n, in] f32).  dtype: a fy_dtype_t weight type. */
cudaError_t fy_cuda_mmv(int dtype, const void *w, size_t row_bytes, int64_t rows, int32_t in, const float *x,
                        const int8_t *xq, const float *xd, int32_t n, float *y, cudaStream_t s);

/* Rows r0 .. r0 + nr - 1 of w dequantized (fy_dequantize_row's values)
 * and rounded to bf16 into out [nr, in] (__nv_bfloat16). */
cudaError_t fy_cuda_dequant_bf16(int dtype, const void *w, size_t row_bytes, int64_t r0, int64_t nr, int32_t in,
                                 void *out, cudaStream_t s);

/* out[t] = row tokens[t] of table, dequantized to f32 bit for bit as
 * fy_dequantize_row; out: [n, dim]; tokens in range (the caller checked). */
cudaError_t fy_cuda_embed_rows(int dtype, const void *table, size_t row_bytes, const int32_t *tokens, int32_t n,
                               int32_t dim, float *out, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* FY_CUDA_QUANT_H */

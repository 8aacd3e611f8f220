/*
 * cuda_quant.cu - the kernels of weights kept as their file stores them
 * (cuda_quant.h): activations quantized to q8 per 32, the vector matmuls
 * of decode (integer dot products on the stored blocks, or f32 for float
 * weights), bf16 tiles for the prefill GEMM, and the embedding lookup.
 * Every read of a block is kernels/cuda_qblock.h's, which the CPU tests
 * check type by type; the kernels here only map threads to rows, blocks
 * and elements.
 *
 * Vector matmul (n <= FY_CUDA_MMV_MAX_N): a warp per output row; lane l
 * takes the row's 32-element blocks l, l + 32, ..., decodes each once
 * (fyq_sub_load) and multiplies it with the same block of each of the n
 * activation rows (two 16-byte loads of quants, one scale), keeping n
 * accumulators; a shuffle tree sums the lanes.  A warp reads its row's
 * blocks front to back, 32 consecutive blocks per step: every byte of the
 * weight is read once, in whole sectors.  Not tuned: llama.cpp's mmvq
 * loads several 32-bit words per lane per step and splits a block among
 * lanes; this keeps a block per lane for the plainest indexing.  On an
 * H200 (ncu, BENCHMARKS.md issue 31) it reads 1.0-1.8 TB/s of the 4.1 TB/s
 * a copy gets: the 2-byte loads keep few bytes in flight, and a short
 * matrix is one wave of latency.  The staged variant below is faster on
 * tall matrices only, and is taken there.
 */
#include "kernels/cuda/cuda_quant.h"

#include <cuda_bf16.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* the project's headers are C11; their one C-only construct, spelled for C++ */
#define _Static_assert static_assert
extern "C" {
#include "kernels/cuda_plan.h"
#include "common/dtype.h"
}
#include "kernels/cuda_qblock.h"

/* ---- activations ------------------------------------------------------------------ */

/* one thread per element, a warp per 32-element block; total a multiple of
 * 32, so a warp is wholly in range or wholly out */
static __global__ void quantize_q8_kernel(const float *x, int64_t total, int8_t *xq, float *xd)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const float v = x[i];
    float amax = fabsf(v);
    for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = fyq_q8_scale(amax), id = fyq_q8_inv(d);
    xq[i] = (int8_t)fyq_q8_round(v, id);
    if (threadIdx.x % 32 == 0) xd[i / 32] = d;
}

extern "C" cudaError_t fy_cuda_quantize_q8(const float *x, int32_t n, int32_t in, int8_t *xq, float *xd, cudaStream_t s)
{
    if (in % FY_QK) return cudaErrorInvalidValue;
    const int64_t total = (int64_t)n * in;
    fy_cuda_launch_t l = fy_cuda_elem_launch(total);
    quantize_q8_kernel<<<l.grid, l.block, 0, s>>>(x, total, xq, xd);
    return cudaGetLastError();
}

/* ---- vector matmul ---------------------------------------------------------------- */

/* the sum over the warp, in every lane */
static __device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* acc[t] += the dot product of decoded block sb with block b (of 32) of
 * x row t, for each t < n; both vector kernels' inner step */
template <int T>
static __device__ __forceinline__ void mmv_block(const fyq_sub_t *sb, const int8_t *xq, const float *xd, int32_t in,
                                                 int32_t b, int32_t n, float acc[FY_CUDA_MMV_MAX_N])
{
    const int32_t nb = in / FY_QK;
#pragma unroll
    for (int t = 0; t < FY_CUDA_MMV_MAX_N; t++) {
        if (t < n) { /* n is the same in every lane */
            /* 32 quants at a 32-byte boundary: in is a multiple of 32 */
            const int4 *xv = (const int4 *)(xq + (int64_t)t * in + (int64_t)b * FY_QK);
            const int4 v0 = xv[0], v1 = xv[1];
            const int32_t xw[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
            acc[t] += fyq_sub_dot(sb, xw, xd[(int64_t)t * nb + b], fyq_needs_xsum((fy_dtype_t)T));
        }
    }
}

template <int T>
static __global__ void __launch_bounds__(32 * FY_CUDA_MMV_WARPS)
    mmv_q8_kernel(const uint8_t *w, size_t row_bytes, int64_t rows, int32_t in, const int8_t *xq, const float *xd,
                  int32_t n, float *y)
{
    const int lane = threadIdx.x % 32;
    const int64_t r = (int64_t)blockIdx.x * FY_CUDA_MMV_WARPS + threadIdx.x / 32;
    if (r >= rows) return; /* the whole warp: r is the warp's */
    const uint8_t *row = w + r * (int64_t)row_bytes;
    const int32_t nb = in / FY_QK;
    float acc[FY_CUDA_MMV_MAX_N];
#pragma unroll
    for (int t = 0; t < FY_CUDA_MMV_MAX_N; t++) acc[t] = 0.0f;
    for (int32_t b = lane; b < nb; b += 32) {
        fyq_sub_t sb;
        fyq_sub_load((fy_dtype_t)T, row, b, &sb);
        mmv_block<T>(&sb, xq, xd, in, b, n, acc);
    }
#pragma unroll
    for (int t = 0; t < FY_CUDA_MMV_MAX_N; t++) {
        if (t < n) { /* n is the same in every lane */
            const float v = warp_sum(acc[t]);
            if (lane == 0) y[(int64_t)t * rows + r] = v;
        }
    }
}

/* The staged variant (FY_CUDA_MMV=staged): the same arithmetic per block,
 * but a warp first copies a stretch of its row (whole iterations of 32
 * blocks, up to MMV_STAGE bytes) into shared memory with 16-byte loads
 * where the stretch is 16-byte aligned (4- or 1-byte loads otherwise),
 * all issued before the first is used, then each lane decodes its block
 * from shared memory.  The lane kernel above reads a block with 2-byte
 * loads, so a warp has few bytes in flight; this one has a whole stretch.
 * Blocks are summed in the same order as the lane kernel, lane by lane,
 * so both give the same bits. */
#define MMV_STAGE 4352 /* bytes a warp stages: 4 iterations of Q8_0 (32 blocks of 34 bytes) */

/* elements and bytes of type T's block as stored (a K-quant's super-block) */
static constexpr __host__ __device__ int mmv_blk_elems(int t)
{
    return t == FY_DTYPE_Q2_K || t == FY_DTYPE_Q3_K || t == FY_DTYPE_Q4_K || t == FY_DTYPE_Q5_K || t == FY_DTYPE_Q6_K
               ? 256
               : 32;
}
static constexpr __host__ __device__ int mmv_blk_bytes(int t)
{
    return t == FY_DTYPE_Q8_0     ? 34
           : t == FY_DTYPE_Q4_0   ? 18
           : t == FY_DTYPE_Q4_1   ? 20
           : t == FY_DTYPE_Q5_0   ? 22
           : t == FY_DTYPE_Q5_1   ? 24
           : t == FY_DTYPE_IQ4_NL ? 18
           : t == FY_DTYPE_Q2_K   ? 84
           : t == FY_DTYPE_Q3_K   ? 110
           : t == FY_DTYPE_Q4_K   ? 144
           : t == FY_DTYPE_Q5_K   ? 176
           : t == FY_DTYPE_Q6_K   ? 210
                                  : 0;
}

/* n bytes from src (global) to dst (shared, 16-byte aligned) by the warp's lanes */
static __device__ __forceinline__ void warp_stage(uint8_t *dst, const uint8_t *src, int n, int lane)
{
    if (((uintptr_t)src & 15) == 0 && (n & 15) == 0) {
        const int4 *s4 = (const int4 *)src;
        int4 *d4 = (int4 *)dst;
        int4 v[MMV_STAGE / 16 / 32 + 1];
#pragma unroll
        for (int k = 0; k < MMV_STAGE / 16 / 32 + 1; k++)
            if (lane + 32 * k < n / 16) v[k] = __ldg(s4 + lane + 32 * k);
#pragma unroll
        for (int k = 0; k < MMV_STAGE / 16 / 32 + 1; k++)
            if (lane + 32 * k < n / 16) d4[lane + 32 * k] = v[k];
    } else if (((uintptr_t)src & 3) == 0 && (n & 3) == 0) {
        const uint32_t *s1 = (const uint32_t *)src;
        uint32_t *d1 = (uint32_t *)dst;
        for (int k = lane; k < n / 4; k += 32) d1[k] = __ldg(s1 + k);
    } else {
        for (int k = lane; k < n; k += 32) dst[k] = __ldg(src + k);
    }
}

template <int T>
static __global__ void __launch_bounds__(32 * FY_CUDA_MMV_WARPS)
    mmv_q8_staged_kernel(const uint8_t *w, size_t row_bytes, int64_t rows, int32_t in, const int8_t *xq,
                         const float *xd, int32_t n, float *y)
{
    constexpr int BE = mmv_blk_elems(T), BB = mmv_blk_bytes(T);
    constexpr int IB = 1024 / BE * BB; /* bytes of 32 blocks of 32 */
    constexpr int U = MMV_STAGE / IB;  /* iterations a stretch holds */
    static_assert(U >= 1, "a stretch holds an iteration");
    __shared__ __align__(16) uint8_t stage[FY_CUDA_MMV_WARPS][MMV_STAGE];
    const int lane = threadIdx.x % 32, wi = threadIdx.x / 32;
    const int64_t r = (int64_t)blockIdx.x * FY_CUDA_MMV_WARPS + wi;
    if (r >= rows) return; /* the whole warp */
    const uint8_t *row = w + r * (int64_t)row_bytes;
    uint8_t *sm = stage[wi];
    const int32_t nb = in / FY_QK;
    float acc[FY_CUDA_MMV_MAX_N];
#pragma unroll
    for (int t = 0; t < FY_CUDA_MMV_MAX_N; t++) acc[t] = 0.0f;
    for (int32_t b0 = 0; b0 < nb; b0 += 32 * U) {
        const int32_t cnt = nb - b0 < 32 * U ? nb - b0 : 32 * U; /* blocks of 32 in this stretch */
        const int64_t off = (int64_t)b0 * FY_QK / BE * BB;
        const int bytes = cnt * FY_QK / BE * BB;
        __syncwarp();
        warp_stage(sm, row + off, bytes, lane);
        __syncwarp();
        for (int32_t b = lane; b < cnt; b += 32) {
            fyq_sub_t sb;
            fyq_sub_load((fy_dtype_t)T, sm, b, &sb); /* block b of the stretch, b0 + b of the row */
            mmv_block<T>(&sb, xq, xd, in, b0 + b, n, acc);
        }
    }
#pragma unroll
    for (int t = 0; t < FY_CUDA_MMV_MAX_N; t++) {
        if (t < n) {
            const float v = warp_sum(acc[t]);
            if (lane == 0) y[(int64_t)t * rows + r] = v;
        }
    }
}

/* float weights: lane l takes elements l, l + 32, ... (coalesced), x as it is */
template <int T>
static __global__ void __launch_bounds__(32 * FY_CUDA_MMV_WARPS)
    mmv_f_kernel(const uint8_t *w, size_t row_bytes, int64_t rows, int32_t in, const float *x, int32_t n, float *y)
{
    const int lane = threadIdx.x % 32;
    const int64_t r = (int64_t)blockIdx.x * FY_CUDA_MMV_WARPS + threadIdx.x / 32;
    if (r >= rows) return;
    const uint8_t *row = w + r * (int64_t)row_bytes;
    float acc[FY_CUDA_MMV_MAX_N];
#pragma unroll
    for (int t = 0; t < FY_CUDA_MMV_MAX_N; t++) acc[t] = 0.0f;
    for (int32_t k = lane; k < in; k += 32) {
        const float wv = fyq_deq((fy_dtype_t)T, row, k);
#pragma unroll
        for (int t = 0; t < FY_CUDA_MMV_MAX_N; t++)
            if (t < n) acc[t] += wv * x[(int64_t)t * in + k];
    }
#pragma unroll
    for (int t = 0; t < FY_CUDA_MMV_MAX_N; t++) {
        if (t < n) {
            const float v = warp_sum(acc[t]);
            if (lane == 0) y[(int64_t)t * rows + r] = v;
        }
    }
}

/* every weight type the device holds, quantized ones and float ones */
#define FY_QUANT_TYPES(X)                                                                                              \
    X(FY_DTYPE_Q8_0)                                                                                                   \
    X(FY_DTYPE_Q4_0)                                                                                                   \
    X(FY_DTYPE_Q4_1)                                                                                                   \
    X(FY_DTYPE_Q5_0)                                                                                                   \
    X(FY_DTYPE_Q5_1)                                                                                                   \
    X(FY_DTYPE_IQ4_NL)                                                                                                 \
    X(FY_DTYPE_Q2_K)                                                                                                   \
    X(FY_DTYPE_Q3_K)                                                                                                   \
    X(FY_DTYPE_Q4_K)                                                                                                   \
    X(FY_DTYPE_Q5_K)                                                                                                   \
    X(FY_DTYPE_Q6_K)
#define FY_FLOAT_TYPES(X) X(FY_DTYPE_F32) X(FY_DTYPE_F16) X(FY_DTYPE_BF16)

extern "C" cudaError_t fy_cuda_mmv(int dtype, const void *w, size_t row_bytes, int64_t rows, int32_t in, const float *x,
                                   const int8_t *xq, const float *xd, int32_t n, float *y, cudaStream_t s)
{
    if (n < 1 || n > FY_CUDA_MMV_MAX_N || rows < 1) return cudaErrorInvalidValue;
    const fy_cuda_launch_t l = fy_cuda_mmv_launch(rows);
    const uint8_t *wb = (const uint8_t *)w;
    /* FY_CUDA_MMV = lanes or staged forces a kernel (read at each call, for
     * tests and benches); otherwise the staged one where it was faster on an
     * H200 (ncu, BENCHMARKS.md): one x row over a tall matrix (the output
     * head 1.41x, gate/up 1.08x); the lanes kernel for the rest (short
     * matrices, the long rows of down, n > 1) */
    const char *v = getenv("FY_CUDA_MMV");
    const bool staged = v && !strcmp(v, "staged") ? true : v && !strcmp(v, "lanes") ? false : n == 1 && rows >= 8192;
    switch (dtype) {
#define MMV_Q(T)                                                                                                       \
    case T:                                                                                                            \
        if (in % FY_QK) return cudaErrorInvalidValue;                                                                  \
        if (staged)                                                                                                    \
            mmv_q8_staged_kernel<T><<<l.grid, l.block, 0, s>>>(wb, row_bytes, rows, in, xq, xd, n, y);                 \
        else                                                                                                           \
            mmv_q8_kernel<T><<<l.grid, l.block, 0, s>>>(wb, row_bytes, rows, in, xq, xd, n, y);                        \
        break;
        FY_QUANT_TYPES(MMV_Q)
#undef MMV_Q
#define MMV_F(T)                                                                                                       \
    case T: mmv_f_kernel<T><<<l.grid, l.block, 0, s>>>(wb, row_bytes, rows, in, x, n, y); break;
        FY_FLOAT_TYPES(MMV_F)
#undef MMV_F
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

/* ---- dequantized tiles and rows ----------------------------------------------------- */

/* one thread per element of the tile [nr, in], w at the tile's first row */
template <int T>
static __global__ void dequant_bf16_kernel(const uint8_t *w, size_t row_bytes, int64_t nr, int32_t in,
                                           __nv_bfloat16 *out)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nr * in) return;
    const int64_t r = i / in, k = i % in;
    out[i] = __float2bfloat16_rn(fyq_deq((fy_dtype_t)T, w + r * (int64_t)row_bytes, k));
}

extern "C" cudaError_t fy_cuda_dequant_bf16(int dtype, const void *w, size_t row_bytes, int64_t r0, int64_t nr,
                                            int32_t in, void *out, cudaStream_t s)
{
    if (nr < 1 || in < 1) return cudaErrorInvalidValue;
    const fy_cuda_launch_t l = fy_cuda_elem_launch(nr * in);
    const uint8_t *wb = (const uint8_t *)w + r0 * (int64_t)row_bytes;
    __nv_bfloat16 *o = (__nv_bfloat16 *)out;
    switch (dtype) {
#define DEQ(T)                                                                                                         \
    case T: dequant_bf16_kernel<T><<<l.grid, l.block, 0, s>>>(wb, row_bytes, nr, in, o); break;
        FY_QUANT_TYPES(DEQ)
        FY_FLOAT_TYPES(DEQ)
#undef DEQ
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

/* one block per token */
template <int T>
static __global__ void embed_rows_kernel(const uint8_t *table, size_t row_bytes, const int32_t *tokens, int32_t dim,
                                         float *out)
{
    const uint8_t *row = table + (int64_t)tokens[blockIdx.x] * (int64_t)row_bytes;
    float *o = out + (int64_t)blockIdx.x * dim;
    for (int32_t d = threadIdx.x; d < dim; d += blockDim.x) o[d] = fyq_deq((fy_dtype_t)T, row, d);
}

extern "C" cudaError_t fy_cuda_embed_rows(int dtype, const void *table, size_t row_bytes, const int32_t *tokens,
                                          int32_t n, int32_t dim, float *out, cudaStream_t s)
{
    if (n < 1) return cudaSuccess;
    const uint8_t *tb = (const uint8_t *)table;
    switch (dtype) {
#define EMB(T)                                                                                                         \
    case T: embed_rows_kernel<T><<<n, FY_CUDA_ELEM_THREADS, 0, s>>>(tb, row_bytes, tokens, dim, out); break;
        FY_QUANT_TYPES(EMB)
        FY_FLOAT_TYPES(EMB)
#undef EMB
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

/*
 * cuda_kernels.h - the CUDA backend's kernels, each a static __global__ in
 * cuda_kernels.cu behind one of these plain host launchers.  Launchers
 * enqueue on the given stream and return the launch's cudaError_t; they
 * never synchronize.  The CPU reference of each is the same-named op of
 * kernels/cpu/cpu_backend.c (tests/test_cuda.c compares them).
 *
 * The weights' kernels (matmul, embedding) are cuda_quant.h's.
 *
 * Only kernels/cuda/ includes this header.
 */
#ifndef FY_CUDA_KERNELS_H
#define FY_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

/* positions per attention segment: partials of one segment are merged by
 * fy_cuda_attn_reduce; fixed, so a token's bits do not depend on its batch */
#define FY_CUDA_ATTN_SEG 256
/* query rows (tokens x heads of a group) one attention block serves */
#define FY_CUDA_ATTN_ROWS 32
/* keys staged in shared memory at a time (a block of 32 is read in halves) */
#define FY_CUDA_ATTN_CHUNK 16
#define FY_CUDA_ATTN_THREADS 256
/* accumulator elements per thread: rows * head_dim <= THREADS * ACC */
#define FY_CUDA_ATTN_ACC 32

/* One sequence of the batch as the device sees it. */
typedef struct fy_cuda_seq {
    int32_t q_start, n_q, kv_len, n_blocks;
    int32_t bt_off; /* first entry of its block tables (n_blocks per group) in the batch's block_tables */
} fy_cuda_seq_t;

/* y[i] = bf16(x[i]); y: [n] __nv_bfloat16 */
cudaError_t fy_cuda_f32_to_bf16(const float *x, void *y, size_t n, cudaStream_t s);
/* y[t] = x[t] / rms(x[t]) * w, double accumulation as on the CPU; x, y: [n, dim] (may alias); w: [dim] */
cudaError_t fy_cuda_rmsnorm(const float *x, const float *w, int32_t n, int32_t dim, float eps, float *y,
                            cudaStream_t s);
/* the inverse frequencies of one rope (rope.h's fy_rope_inv_freq, computed
 * on the host as the CPU does), passed by value to the kernel */
#define FY_CUDA_ROPE_MAX_PAIRS 256
typedef struct fy_cuda_rope_freqs {
    double inv_freq[FY_CUDA_ROPE_MAX_PAIRS];
} fy_cuda_rope_freqs_t;

/* q: [n, n_heads, hd], k: [n, n_kv, hd], rotated in place at pos[t] by
 * pos * inv_freq[i]; neox: halves, else adjacent pairs */
cudaError_t fy_cuda_rope(float *q, float *k, const int32_t *pos, int32_t n, int32_t n_heads, int32_t n_kv, int32_t hd,
                         const fy_cuda_rope_freqs_t *freqs, int neox, cudaStream_t s);
/* out = silu(gate) * up; out may alias gate */
cudaError_t fy_cuda_swiglu(const float *gate, const float *up, float *out, size_t n, cudaStream_t s);
/* out = gate / (1 + exp(-2u)) * up, u = sqrt(2/pi) (gate + 0.044715 gate^3)
 * (GELU-tanh gated, as the CPU's geglu); out may alias gate */
cudaError_t fy_cuda_geglu(const float *gate, const float *up, float *out, size_t n, cudaStream_t s);
/* x += y */
cudaError_t fy_cuda_add(float *x, const float *y, size_t n, cudaStream_t s);
/* x[t, i] += b[i] for t < n, i < width */
cudaError_t fy_cuda_add_bias(float *x, const float *b, int32_t n, int32_t width, cudaStream_t s);
/* x *= a */
cudaError_t fy_cuda_scale(float *x, float a, size_t n, cudaStream_t s);
/* K and V ([n, n_kv, hd] f32) of one layer into the paged arena at slots[t];
 * f16: the arena holds half, else float.  Offsets as fy_kv_offset. */
cudaError_t fy_cuda_kv_write(void *arena, const int32_t *slots, int32_t n, const float *k, const float *v, int32_t n_kv,
                             int32_t hd, int32_t block_size, size_t block_bytes, size_t layer_bytes, size_t kv_bytes,
                             size_t head_bytes, int32_t layer, int f16, cudaStream_t s);

/* Paged causal attention, pass 1 (see cuda_kernels.cu).  q: [n_tokens,
 * n_heads, hd]; apos: [n_tokens] each token's position in its sequence;
 * pm, pl: [n_tokens, n_heads, max_segs]; pacc: [n_tokens, n_heads, max_segs, hd].
 * n_tiles: sum over seqs of ceil(n_q / qt); qt * G <= FY_CUDA_ATTN_ROWS. */
typedef struct fy_cuda_attn_args {
    const float *q;
    const void *arena;
    const fy_cuda_seq_t *seqs;
    const int32_t *block_tables;
    const int32_t *apos;
    float *pm, *pl, *pacc;
    float *out;
    int32_t n_seqs, n_tokens, n_heads, n_kv, hd, G, qt, n_tiles, max_segs;
    int32_t block_size, f16;
    int32_t layer;  /* the layer's place in its group's blocks */
    int32_t group;  /* its KV group: table g of a sequence starts at bt_off + g * n_blocks */
    int32_t window; /* 0: global; W: a query at p sees p - W + 1 .. p */
    size_t block_bytes, layer_bytes, kv_bytes, head_bytes;
    float scale;
} fy_cuda_attn_args_t;

/* Pass 1 (partials per segment) then pass 2 (merge in segment order into out). */
cudaError_t fy_cuda_attention(const fy_cuda_attn_args_t *a, int32_t grid_segs, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* FY_CUDA_KERNELS_H */

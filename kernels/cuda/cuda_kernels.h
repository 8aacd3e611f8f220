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

/* the attention plans and their constants (plain C, tested on every machine);
 * the project's headers are C11, their one C-only construct spelled for C++ */
#if defined(__cplusplus) && !defined(_Static_assert)
#define _Static_assert static_assert
#endif
#include "kernels/cuda_attn.h"

/* One sequence of the batch as the device sees it. */
typedef struct fy_cuda_seq {
    int32_t q_start, n_q, kv_len, n_blocks;
    int32_t bt_off;  /* first entry of its block tables (n_blocks per group) in the batch's block_tables */
    int32_t seg_len; /* positions per segment (fy_cuda_attn_seg_len); 0: one segment, not split */
    int32_t part0;   /* split: the index of its first query token among the batch's split tokens; else -1 */
} fy_cuda_seq_t;

/* KV formats as the kernels name them */
enum { FY_CUDA_KV_F32 = 0, FY_CUDA_KV_F16 = 1, FY_CUDA_KV_FP8 = 2, FY_CUDA_KV_I8 = 3 };

/* Where one layer's rows lie in the paged arena (fy_kv_offset's layout:
 * [block][layer][k|v][kv_head][token_in_block][row_bytes]). */
typedef struct fy_cuda_kv_geom {
    size_t block_bytes, layer_bytes, kv_bytes, head_bytes, row_bytes;
    int32_t block_size, n_kv, hd;
    int32_t dtype; /* FY_CUDA_KV_* */
    int32_t layer; /* the layer's place in its group's blocks */
} fy_cuda_kv_geom_t;

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
/* K and V ([n, n_kv, hd] f32) of one layer into the paged arena at
 * slots[t], in the layout's format: f32 and f16 rows converted (round to
 * nearest even), fp8 and int8 rows with their scale as kv.c's
 * fy_kv_row_write computes it, bit for bit. */
cudaError_t fy_cuda_kv_write(void *arena, const int32_t *slots, int32_t n, const float *k, const float *v,
                             const fy_cuda_kv_geom_t *g, cudaStream_t s);

/* Paged causal attention (see cuda_kernels.cu).  q: [n_tokens, n_heads,
 * hd]; apos, tseq: [n_tokens] each token's position and sequence;
 * split_tok: [n_split] the tokens of split sequences, in batch order.
 * Partials of split rows: pm, pl [n_split, n_heads, splits], pacc
 * [n_split, n_heads, splits, hd].  fm, fl [n_tokens, n_heads]: each row's
 * final softmax max and sum (read by the H2O score pass).  n_tiles: sum
 * over seqs of ceil(n_q / qt); qt * G <= FY_CUDA_ATTN_ROWS. */
typedef struct fy_cuda_attn_args {
    const float *q;
    const void *arena;
    const fy_cuda_seq_t *seqs;
    const int32_t *block_tables;
    const int32_t *apos, *tseq, *split_tok;
    float *pm, *pl, *pacc;
    float *fm, *fl;
    float *out;
    float *scores; /* H2O, device [n_seqs, scores_stride]: NULL when off */
    int32_t scores_stride;
    fy_cuda_kv_geom_t kv;
    int32_t n_seqs, n_tokens, n_heads, G, qt, n_tiles, splits, n_split, max_n_blocks;
    int32_t chunk;  /* fy_cuda_attn_chunk */
    int32_t vec;    /* rows are 16-byte aligned (4-byte for fp8/int8 codes): vector loads */
    int32_t group;  /* its KV group: table g of a sequence starts at bt_off + g * n_blocks */
    int32_t window; /* 0: global; W: a query at p sees p - W + 1 .. p */
    float scale;
} fy_cuda_attn_args_t;

/* Pass 1 (a block per tile, KV head and segment; unsplit rows written to
 * out directly), pass 2 (the split rows' segments merged in order), and
 * with scores set the H2O pass (each block's attention mass added into
 * scores[s * stride + i], one thread block per entry, a fixed order).
 * grid_segs: the most segments of any split sequence (1 when none). */
cudaError_t fy_cuda_attention(const fy_cuda_attn_args_t *a, int32_t grid_segs, cudaStream_t s);
/* Once per device, before any launch: lets pass 1 take up to max_smem
 * bytes of shared memory (the device's opt-in limit; fy_cuda_attn_smem
 * above 48 KB needs it).  Set once, outside any recording. */
cudaError_t fy_cuda_attention_init(size_t max_smem);

#ifdef __cplusplus
}
#endif

#endif /* FY_CUDA_KERNELS_H */

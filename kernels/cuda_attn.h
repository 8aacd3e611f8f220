/*
 * cuda_attn.h - the host-side plans of the CUDA backend's paged attention
 * and KV cache, in plain C: which shapes and KV formats the kernels take,
 * how a sequence's context is split over the GPU, how big the scratch is,
 * how much shared memory a block needs.  kernels/cuda/ calls these; they
 * are compiled into every build, so tests/test_cuda.c checks them on
 * machines without a GPU (where the kernels themselves cannot run).
 *
 * Splitting (flash-decoding).  A decode row (one query token) has little
 * work per KV head: one block per (token, KV head) would leave most of a
 * GPU's multiprocessors idle at small batches.  So a sequence whose query
 * rows fit a few tiles (n_q <= FY_CUDA_SPLIT_MAX_Q: decode and speculative
 * verification) has its context cut into segments, each a block of its
 * own, whose partial softmax states a second kernel merges in segment
 * order.  The segment length depends only on that sequence's own context
 * length and on the device (its multiprocessor count and the model's KV
 * heads), never on the rest of the batch: a token's bits do not depend on
 * what it is batched with.  Longer query runs (prefill chunks) are not
 * split: their tiles already fill the GPU, and their rows need no partial
 * scratch, so the scratch is sized by decode rows alone.
 *
 * Threading: pure functions.
 */
#ifndef FY_CUDA_ATTN_H
#define FY_CUDA_ATTN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"

/* query rows (tokens x heads of a group) one attention block serves */
#define FY_CUDA_ATTN_ROWS 32
#define FY_CUDA_ATTN_THREADS 256
/* accumulator elements per thread: rows * head_dim <= THREADS * ACC */
#define FY_CUDA_ATTN_ACC 32
/* keys staged in shared memory at a time: the most, and for head sizes over 128 */
#define FY_CUDA_ATTN_CHUNK 32
#define FY_CUDA_ATTN_CHUNK_WIDE 16
/* shortest segment of a split context (positions; a multiple of every chunk) */
#define FY_CUDA_ATTN_MIN_SEG 64
/* most segments one sequence is cut into */
#define FY_CUDA_ATTN_MAX_SPLITS 64
/* sequences with at most this many query rows in a step are split */
#define FY_CUDA_SPLIT_MAX_Q 8
#define FY_CUDA_MAX_HEAD_DIM 512

/* Keys staged per chunk for a head size. */
int32_t fy_cuda_attn_chunk(int32_t head_dim);
/* Query tokens per tile for G query heads per KV head: at most ROWS / G,
 * and rows x head_dim within the threads' accumulators; 0 when not even
 * one token fits (the shape is unsupported). */
int32_t fy_cuda_attn_qt(int32_t G, int32_t head_dim);
/* Dynamic shared memory of one pass-1 block (bytes): queries, K and V of a
 * chunk (K rows padded by one float so the score loop's column reads fall
 * in different banks), scores, the softmax state, positions. */
size_t fy_cuda_attn_smem(int32_t G, int32_t qt, int32_t head_dim);
/* Segments a split sequence aims for: enough blocks over the KV heads to
 * give each multiprocessor two (n_sms from the device), within
 * [1, FY_CUDA_ATTN_MAX_SPLITS]. */
int32_t fy_cuda_attn_splits(int32_t n_sms, int32_t n_kv_heads);
/* Segment length (positions) for a sequence of kv_len tokens with n_q
 * query rows this step: for decode rows (n_q <= FY_CUDA_SPLIT_MAX_Q)
 * kv_len / splits rounded up to a multiple of FY_CUDA_ATTN_MIN_SEG, at
 * least that (a short context is one segment, still merged by the second
 * kernel, which gives the same bits as writing it directly: so every
 * decode row takes one path, and a recorded step's shapes do not depend
 * on context lengths); 0 for longer query runs (not split: the whole
 * context in one block, written directly).  Never more than `splits`
 * segments: ceil(kv_len / seg) <= max(splits, 1). */
int32_t fy_cuda_attn_seg_len(int32_t kv_len, int32_t n_q, int32_t splits);
/* Rows of partial-softmax scratch a step can need: split tokens are at
 * most FY_CUDA_SPLIT_MAX_Q per sequence and max_tokens in all. */
int32_t fy_cuda_attn_split_tokens(int32_t max_tokens, int32_t max_seqs);
/* Bytes of partial scratch: split tokens x heads x splits x (head_dim + 2) floats. */
size_t fy_cuda_attn_part_bytes(int32_t split_tokens, int32_t n_heads, int32_t splits, int32_t head_dim);

/* KV formats the kernels read and write: f32, f16, and the scaled
 * one-byte rows of kv.h (fp8 e4m3, int8, an f32 scale per row). */
bool fy_cuda_kv_dtype_ok(fy_dtype_t dtype);

/* What a model and its configuration ask of the CUDA attention.  NULL when
 * the kernels can run it; else why not, in words naming what to change
 * (a static string, or `buf`). */
const char *fy_cuda_attn_unsupported(int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, fy_dtype_t kv_dtype,
                                     size_t max_smem, char *buf, size_t cap);

#endif /* FY_CUDA_ATTN_H */

/*
 * cuda_plan.h - the CUDA backend's host-side decisions for weights, in
 * plain C: which kernel multiplies which weight type for how many rows,
 * the launch shapes, the scratch a reservation needs, the tiling of a
 * weight for dequantize + GEMM, the chunks and thread slices of a staged
 * upload, and the table that lets uploads of one host tensor (tied
 * embeddings) share one device copy.  Every build compiles it (gcc, no
 * CUDA needed) so that tests/test_cuda.c runs it on any machine;
 * kernels/cuda/ includes it and does what it says.
 *
 * Weights on the GPU.  Every matmul and embedding weight goes to the
 * device as its file stores it (the GGUF blocks, or F16/BF16/F32 rows):
 * see fy_cuda_weight_type.  Decode (n <= FY_CUDA_MMV_MAX_N rows of x)
 * multiplies with kernels that read the stored blocks (kernels/cuda_qblock.h
 * decodes them); prefill dequantizes tiles of rows to bf16 into a scratch
 * buffer and multiplies them with cuBLAS (tensor cores, fp32
 * accumulation).
 *
 * Threading: the functions are pure (the share table is the caller's,
 * guarded by the caller as the backend context is).
 */
#ifndef FY_CUDA_PLAN_H
#define FY_CUDA_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "common/dtype.h"
#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Rows of x up to which the matmul reads the stored weight blocks
 * directly (one pass over the weight, each row's dot products for all n
 * tokens at once, accumulators in registers).  The weight is read once
 * whatever n is, but x is re-read per weight block and the accumulators
 * grow with n; past 8 rows the tensor-core GEMM on dequantized tiles wins
 * on arithmetic (llama.cpp's mmvq stops at the same 8,
 * MMVQ_MAX_BATCH_SIZE). */
#define FY_CUDA_MMV_MAX_N 8
/* warps per thread block of the vector kernels; each warp one output row */
#define FY_CUDA_MMV_WARPS 4
/* threads per block of the elementwise kernels (quantize x, dequantize, embed) */
#define FY_CUDA_ELEM_THREADS 256
/* a tile of dequantized weight rows: at most this many bf16 elements ... */
#define FY_CUDA_TILE_ELEMS ((int64_t)16 << 20)
/* ... and at most this many rows (a small model need not take 32 MB) */
#define FY_CUDA_TILE_MAX_ROWS 8192
/* rows per tile are a multiple of this (whole warps of the GEMM's tiles) */
#define FY_CUDA_TILE_ALIGN 64
/* uploads: pinned staging buffers of this many bytes, used in turn */
#define FY_CUDA_STAGE_BYTES ((size_t)16 << 20)
#define FY_CUDA_STAGE_BUFS 3
/* host threads filling one staging buffer: one per this many bytes, at most MAX */
#define FY_CUDA_STAGE_PER_THREAD ((size_t)2 << 20)
#define FY_CUDA_STAGE_MAX_THREADS 8

/* Does a GPU kernel read this type as stored (every matmul and embedding
 * weight type GGUF and safetensors give ferry: F32, F16, BF16 and every
 * quantized type of dtype.h)?  FP8 and I8 are KV types, not weights. */
bool fy_cuda_weight_type(fy_dtype_t t);

/* Checks that host is a weight the device can hold as stored: a type
 * above, rows of whole blocks, row_bytes as the type says, an input width
 * that fits an int (cuBLAS's), and data.  On failure why says which
 * (for the caller's error). */
fy_status_t fy_cuda_weight_check(const fy_tensor_t *host, char *why, size_t cap);

typedef enum fy_cuda_mm_path {
    FY_CUDA_MM_VEC_Q8 = 0, /* x quantized to q8 per 32; integer dot products with the weight's blocks */
    FY_CUDA_MM_VEC_F,      /* float weights: f32 dot products with x as it is */
    FY_CUDA_MM_GEMM_TILED, /* tiles of rows dequantized to bf16, then cublasGemmEx */
    FY_CUDA_MM_GEMM_BF16,  /* bf16 weights: cublasGemmEx on the weight itself */
} fy_cuda_mm_path_t;

/* The kernel for a weight of type t times n rows of x (t a weight type, n >= 1). */
fy_cuda_mm_path_t fy_cuda_mm_path(fy_dtype_t t, int32_t n);

typedef struct fy_cuda_launch {
    uint32_t grid, block;
} fy_cuda_launch_t;

/* vector kernels: FY_CUDA_MMV_WARPS rows per block, one warp each */
fy_cuda_launch_t fy_cuda_mmv_launch(int64_t rows);
/* elementwise over n elements, one thread each (n < 2^31 * 256) */
fy_cuda_launch_t fy_cuda_elem_launch(int64_t n);

/* What a reservation needs for the weights' kernels (allocated once, in
 * reserve).  x quantized for the vector kernels: FY_CUDA_MMV_MAX_N rows,
 * row t of a call of width in at xq + t * in (int8) and its scales at
 * xq + xd_off + 4 * t * (in / 32) (float).  A bf16 tile of tile_rows_max
 * rows of max_row (the tile of a narrower weight holds more rows:
 * fy_cuda_tile_rows). */
typedef struct fy_cuda_wscratch {
    size_t xq_bytes; /* the q8 rows and their scales */
    size_t xd_off;   /* where the scales start (16-byte aligned) */
    size_t tile_bytes;
    int64_t tile_rows_max; /* rows of max_row the tile holds */
} fy_cuda_wscratch_t;

fy_status_t fy_cuda_wscratch_plan(const fy_backend_reserve_t *r, fy_cuda_wscratch_t *out);

/* Rows of a weight of width in that one tile of tile_bytes holds: a
 * multiple of FY_CUDA_TILE_ALIGN where that is at least one multiple,
 * at most FY_CUDA_TILE_MAX_ROWS; 0 if not even one row fits. */
int64_t fy_cuda_tile_rows(size_t tile_bytes, int64_t in);
/* The tiles of a weight of rows rows, tile_rows (> 0) at a time: how many,
 * and tile k's first row and row count. */
int64_t fy_cuda_tile_count(int64_t rows, int64_t tile_rows);
void fy_cuda_tile(int64_t rows, int64_t tile_rows, int64_t k, int64_t *r0_p, int64_t *nr_p);

/* A staged upload of bytes: chunks of FY_CUDA_STAGE_BYTES (the last one
 * shorter), chunk k through staging buffer k % FY_CUDA_STAGE_BUFS. */
size_t fy_cuda_stage_chunks(size_t bytes);
void fy_cuda_stage_chunk(size_t bytes, size_t k, size_t *off_p, size_t *len_p);
/* Threads that fill a chunk of len bytes on a host with ncpu cores (>= 1). */
int fy_cuda_stage_threads(size_t len, int ncpu);
/* Thread i of threads's slice of a chunk of len bytes: contiguous,
 * 4 KiB-aligned boundaries (whole pages of the mmap per thread), together
 * exactly the chunk; a slice may be empty. */
void fy_cuda_stage_slice(size_t len, int threads, int i, size_t *off_p, size_t *n_p);

/* Device copies shared between uploads of the same host tensor (the same
 * data pointer, type, shape and row length, and the same first and last
 * bytes, a guard against host memory reused for other weights while a
 * copy is alive): tied embeddings, uploaded for rows (the embedding) and
 * for matmul (the output head), become one device copy, released when the
 * last of its tensors is. */
typedef struct fy_cuda_shared {
    const void *host;
    fy_dtype_t dtype;
    int64_t ne[2];
    size_t row_bytes;
    uint8_t head[16], tail[16];
    void *dev;
    int32_t refs;
} fy_cuda_shared_t;

typedef struct fy_cuda_share_table {
    fy_cuda_shared_t *e;
    int32_t n, cap;
} fy_cuda_share_table_t;

/* The live device copy of host, or NULL. */
fy_cuda_shared_t *fy_cuda_share_find(fy_cuda_share_table_t *t, const fy_tensor_t *host);
/* Records dev as host's device copy with one reference; FY_ERR_NOMEM. */
fy_status_t fy_cuda_share_add(fy_cuda_share_table_t *t, const fy_tensor_t *host, void *dev);
/* Drops one reference to dev: the references left (0: the caller frees
 * dev; the entry is gone), or -1 when dev is not in the table (a tensor
 * that was never shared: the caller frees it). */
int32_t fy_cuda_share_drop(fy_cuda_share_table_t *t, const void *dev);
void fy_cuda_share_free(fy_cuda_share_table_t *t);

#ifdef __cplusplus
}
#endif

#endif /* FY_CUDA_PLAN_H */

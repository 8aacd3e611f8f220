/*
 * kv.h - the paged KV cache: its memory layout, a pool of fixed-size
 * blocks, and per-sequence block tables.
 *
 * Layout.  The KV arena is an array of blocks; each block holds
 * block_size tokens of every layer, ordered
 *     [layer][k | v][kv_head][token_in_block][head_dim]
 * ("block-major").  One block is one contiguous byte range, so shipping a
 * run of blocks to another worker is one put, and a prefill chunk that
 * fills whole blocks can be sent as soon as its last layer is done
 * (docs/architecture.md says why this order was chosen).  Attention reads
 * K/V only through a sequence's block table.
 *
 * Pool.  This file only accounts for block ids (free list, refcounts); the
 * arena's bytes belong to the backend (host memory for the CPU, device
 * memory for CUDA), so nothing here touches them.  The interface is the
 * one the block manager grows into: refcounted blocks that sequences can
 * share, freed when the last reference goes.
 */
#ifndef FY_KV_H
#define FY_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "status.h"

typedef struct fy_kv_layout {
    int32_t n_layers;
    int32_t n_kv_heads;
    int32_t head_dim;
    int32_t block_size; /* tokens per block: 8, 16 or 32 */
    fy_dtype_t dtype;   /* element type of K and V: f32 or f16 */
    /* derived, in bytes */
    size_t elem_bytes;
    size_t head_bytes;  /* one head of one block: block_size * head_dim elements */
    size_t kv_bytes;    /* all K (or all V) heads of one layer of one block */
    size_t layer_bytes; /* K and V of one layer of one block */
    size_t block_bytes; /* the whole block */
} fy_kv_layout_t;

/* Fills lay; FY_ERR_INVALID (logged) for unsupported sizes or dtypes. */
fy_status_t fy_kv_layout_init(fy_kv_layout_t *lay, int32_t n_layers, int32_t n_kv_heads, int32_t head_dim,
                              int32_t block_size, fy_dtype_t dtype);

/* Byte offset of (block, layer, k or v, head, token 0) in the arena. */
static inline size_t fy_kv_offset(const fy_kv_layout_t *lay, int32_t block, int32_t layer, int is_v,
                                  int32_t head)
{
    return (size_t)block * lay->block_bytes + (size_t)layer * lay->layer_bytes + (size_t)is_v * lay->kv_bytes +
           (size_t)head * lay->head_bytes;
}

/* KV bytes one token takes across all layers. */
static inline size_t fy_kv_bytes_per_token(const fy_kv_layout_t *lay)
{
    return lay->block_bytes / (size_t)lay->block_size;
}

/* ---- block pool ---------------------------------------------------------------- */

typedef struct fy_kv_pool fy_kv_pool_t;

fy_status_t fy_kv_pool_create(int32_t n_blocks, fy_kv_pool_t **pool_p);
void fy_kv_pool_destroy(fy_kv_pool_t *pool); /* accepts NULL */

/* Takes a free block with refcount 1.  FY_ERR_NO_SPACE when none is free. */
fy_status_t fy_kv_pool_alloc(fy_kv_pool_t *pool, int32_t *block_p);
/* Adds a reference to a block in use (sharing). */
void fy_kv_pool_ref(fy_kv_pool_t *pool, int32_t block);
/* Drops a reference; the block returns to the free list at zero. */
void fy_kv_pool_unref(fy_kv_pool_t *pool, int32_t block);
int32_t fy_kv_pool_refcount(const fy_kv_pool_t *pool, int32_t block);
int32_t fy_kv_pool_n_blocks(const fy_kv_pool_t *pool);
int32_t fy_kv_pool_n_free(const fy_kv_pool_t *pool);

/* ---- block table ----------------------------------------------------------------- */

/* The blocks of one sequence, in order; token t lives in block
 * blocks[t / block_size] at slot t % block_size.  The array is sized at
 * init for the longest sequence allowed, so appending never allocates. */
typedef struct fy_block_table {
    int32_t *blocks;
    int32_t n_blocks;   /* blocks held */
    int32_t max_blocks; /* capacity of blocks[] */
    int32_t n_tokens;   /* tokens whose K/V are written (or being written this step) */
    int32_t block_size;
} fy_block_table_t;

fy_status_t fy_block_table_init(fy_block_table_t *bt, int32_t block_size, int32_t max_tokens);
/* Frees the array; the table must hold no blocks (fy_block_table_release first). */
void fy_block_table_deinit(fy_block_table_t *bt);
/* Makes room for n_tokens tokens in total, allocating blocks as needed.
 * All or nothing: on FY_ERR_NO_SPACE (pool empty) or FY_ERR_INVALID (past
 * max_tokens) the table is unchanged.  Does not change n_tokens. */
fy_status_t fy_block_table_reserve(fy_block_table_t *bt, fy_kv_pool_t *pool, int32_t n_tokens);
/* Keeps the first n_tokens tokens and returns blocks no longer needed. */
void fy_block_table_truncate(fy_block_table_t *bt, fy_kv_pool_t *pool, int32_t n_tokens);
/* Returns every block to the pool; the table is empty afterwards. */
void fy_block_table_release(fy_block_table_t *bt, fy_kv_pool_t *pool);
/* The KV slot (block * block_size + offset) of token t; t < n_blocks * block_size. */
static inline int32_t fy_block_table_slot(const fy_block_table_t *bt, int32_t t)
{
    return bt->blocks[t / bt->block_size] * bt->block_size + t % bt->block_size;
}

#endif /* FY_KV_H */

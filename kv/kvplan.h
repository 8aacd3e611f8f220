/*
 * kvplan.h - KV cache capacity arithmetic: bytes per token and per block,
 * how many blocks, tokens and requests fit a memory budget.  Used by
 * `ferry plan` and to size the KV arena from configuration.  Also the
 * size parser every command and config file shares ("50GiB", "1.5G").
 */
#ifndef FY_KVPLAN_H
#define FY_KVPLAN_H

#include <stddef.h>
#include <stdint.h>

#include "kv/kv.h"
#include "common/size.h"
#include "common/status.h"

/* Bytes per element of a KV dtype name: f32 4, f16 and bf16 2, fp8 and
 * int8 1.  FY_ERR_INVALID for other names. */
fy_status_t fy_kv_dtype_bytes(const char *name, int32_t *bytes_p);
/* Bytes of scale beside each row (one token of one K or V head) of a KV
 * dtype: 4 for fp8 and int8 (an f32 per row, kv.h), 0 otherwise. */
int32_t fy_kv_dtype_scale_bytes(const char *name);

/*
 * Tensor-parallel ranks' heads: query heads split evenly (n_heads % tp ==
 * 0); KV heads split evenly when n_kv_heads % tp == 0, else, when tp %
 * n_kv_heads == 0, each rank keeps the one KV head its query heads read
 * (replicated tp / n_kv_heads times).  Rank `rank` of tp holds query heads
 * [*q0_p, *q0_p + *nq_p) and KV heads [*kv0_p, *kv0_p + *nkv_p).
 * FY_ERR_INVALID (logged, naming the counts) for a split that cannot be.
 */
fy_status_t fy_kv_tp_heads(int32_t n_heads, int32_t n_kv_heads, int32_t tp, int32_t rank, int32_t *q0_p, int32_t *nq_p,
                           int32_t *kv0_p, int32_t *nkv_p);
/* Pipeline stages: stage `stage` of pp holds layers [*first_p, *first_p +
 * *count_p), n_layers / pp each and one more for the first n_layers % pp.
 * FY_ERR_INVALID (logged) when pp exceeds the layers. */
fy_status_t fy_kv_pp_layers(int32_t n_layers, int32_t pp, int32_t stage, int32_t *first_p, int32_t *count_p);

typedef struct fy_kv_plan_in {
    int32_t n_layers, n_kv_heads, head_dim;
    int32_t elem_bytes;
    int32_t scale_bytes; /* per row (token, head): fy_kv_dtype_scale_bytes */
    int32_t block_size;
    int64_t kv_mem;         /* the KV budget; or 0 and the next three */
    int64_t mem;            /* device memory */
    int64_t weights;        /* what the weights take of it */
    double mem_fraction;    /* the share of what is left that the KV cache gets */
    int64_t context;        /* tokens per request */
    const int32_t *windows; /* [n_layers] each layer's sliding window (0: global); NULL: all global */
    int32_t step;           /* tokens one forward pass adds (a sliding layer's bound); 0: 512 */
    int64_t kv_budget;      /* KV budget per request in tokens (kv.evict, evict.h); 0: none */
    int32_t n_heads;        /* query heads: needed with tp > 1 */
    int32_t tp, pp;         /* tensor and pipeline ranks (0 or 1: one); kv_mem, mem and weights are then per
                               rank (one device each), weights already divided */
} fy_kv_plan_in_t;

typedef struct fy_kv_plan {
    int64_t kv_mem;
    int64_t bytes_per_token, bytes_per_block;
    int64_t blocks, tokens;
    int64_t blocks_per_request, requests; /* as if every layer kept every block */
    /* with sliding-window layers in KV groups (kv.sliding_groups) and a
     * KV budget: what a request of `context` tokens holds at most, and how
     * many fit */
    int64_t held_per_request, requests_held;
    /* with ranks: the figures above are the fullest rank's (every rank
     * holds the same block ids, so it bounds them all) */
    int32_t ranks;               /* tp * pp */
    int32_t kv_heads_per_rank;   /* after splitting or replicating */
    int32_t max_stage_layers;    /* the largest stage */
    int64_t bytes_per_token_all; /* summed over ranks, replicated KV heads counted each time */
} fy_kv_plan_t;

/* FY_ERR_INVALID (logged) for shapes or budgets that make no sense, or
 * ranks the model cannot be split over. */
fy_status_t fy_kv_plan(const fy_kv_plan_in_t *in, fy_kv_plan_t *out);

/* ---- what admission asks, and the pool that grants it ---- */

/*
 * Pages (blocks of one KV group) a request of `tokens` tokens (prompt plus
 * new) needs at most, less the blocks its cached prefix of cached_tokens
 * covers: every block of a global group; of a sliding group no more than
 * its window and one forward pass of up to `step` tokens see (step 0:
 * sliding groups counted whole); no group more than cap blocks (a KV
 * budget, evict.h; INT64_MAX: none).  The one formula of what a request
 * needs: the block manager's admission (fy_kvm_blocks_for_capped), the
 * router's placement (fy_kv_blocks_held) and the pools below use it.
 */
int64_t fy_kv_blocks_needed(const fy_kv_layout_t *lay, int64_t tokens, int64_t cached_tokens, int32_t step,
                            int64_t cap);
/* Pages admission keeps free in a pool of n pages (fy_kvm_params_t's
 * watermark, a share in [0, 1)): the block manager's own count. */
int32_t fy_kv_watermark_pages(float watermark, int32_t n);
/*
 * The pool (fy_runner_params_t.n_kv_blocks: blocks of every layer, each
 * n_groups pages) that admits `requests` requests of `tokens` tokens each
 * at once: their fy_kv_blocks_needed pages plus the watermark admission
 * keeps free, rounded up to whole blocks of every layer.  step and
 * watermark as the block manager gets them (fy_runner_kvm_params:
 * max_batch_tokens, 1%).  Every tool that sizes a pool for a context
 * (`ferry generate`, the bench commands) calls this, and a worker's pool
 * sized from kv_mem is checked against it at start.  -1 (logged) for a
 * bad argument or a pool past INT32_MAX / 2 pages.
 */
int32_t fy_kv_pool_blocks(const fy_kv_layout_t *lay, int64_t tokens, int32_t requests, int32_t step, float watermark);

#endif /* FY_KVPLAN_H */

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

#include "size.h"
#include "status.h"

/* Bytes per element of a KV dtype name: f32 4, f16 and bf16 2, fp8 and
 * int8 1.  FY_ERR_INVALID for other names. */
fy_status_t fy_kv_dtype_bytes(const char *name, int32_t *bytes_p);
/* Bytes of scale beside each row (one token of one K or V head) of a KV
 * dtype: 4 for fp8 and int8 (an f32 per row, kv.h), 0 otherwise. */
int32_t fy_kv_dtype_scale_bytes(const char *name);

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
} fy_kv_plan_t;

/* FY_ERR_INVALID (logged) for shapes or budgets that make no sense. */
fy_status_t fy_kv_plan(const fy_kv_plan_in_t *in, fy_kv_plan_t *out);

#endif /* FY_KVPLAN_H */

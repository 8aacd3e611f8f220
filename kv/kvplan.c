/* kvplan.c - KV capacity arithmetic. */
#include "kvplan.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

fy_status_t fy_kv_dtype_bytes(const char *name, int32_t *bytes_p)
{
    static const struct {
        const char *name;
        int32_t bytes;
    } t[] = {{"f32", 4}, {"f16", 2}, {"bf16", 2}, {"fp8", 1}, {"int8", 1}};
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        if (!strcmp(name, t[i].name)) {
            *bytes_p = t[i].bytes;
            return FY_OK;
        }
    }
    fy_error("kv dtype '%s' is not one of f32, f16, bf16, fp8, int8", name);
    return FY_ERR_INVALID;
}

int32_t fy_kv_dtype_scale_bytes(const char *name)
{
    return !strcmp(name, "fp8") || !strcmp(name, "int8") ? (int32_t)sizeof(float) : 0;
}

fy_status_t fy_kv_plan(const fy_kv_plan_in_t *in, fy_kv_plan_t *out)
{
    if (in->n_layers < 1 || in->n_kv_heads < 1 || in->head_dim < 1 || in->elem_bytes < 1 || in->scale_bytes < 0 ||
        in->scale_bytes > 64 || in->n_layers > 4096 || in->n_kv_heads > 4096 || in->head_dim > 4096) {
        fy_error("plan: bad model shape (%d layers, %d kv heads, head size %d)", in->n_layers, in->n_kv_heads,
                 in->head_dim);
        return FY_ERR_INVALID;
    }
    if (in->block_size < 1 || in->block_size > 4096) {
        fy_error("plan: bad block size %d", in->block_size);
        return FY_ERR_INVALID;
    }
    if (in->context < 0 || in->kv_budget < 0) {
        fy_error("plan: negative context");
        return FY_ERR_INVALID;
    }
    fy_kv_plan_t p = {0};
    p.kv_mem = in->kv_mem;
    if (p.kv_mem <= 0) {
        if (in->mem <= 0 || in->weights < 0 || !(in->mem_fraction > 0 && in->mem_fraction <= 1)) {
            fy_error("plan: give a kv budget, or memory, weights and a fraction in (0, 1]");
            return FY_ERR_INVALID;
        }
        if (in->weights >= in->mem) {
            fy_error("plan: the weights (%lld bytes) leave no memory of %lld bytes for the kv cache",
                     (long long)in->weights, (long long)in->mem);
            return FY_ERR_INVALID;
        }
        p.kv_mem = (int64_t)((double)(in->mem - in->weights) * in->mem_fraction);
    }
    /* K and V, every layer and kv head: a row of head_dim elements and its scale */
    p.bytes_per_token =
        2 * (int64_t)in->n_layers * in->n_kv_heads * ((int64_t)in->head_dim * in->elem_bytes + in->scale_bytes);
    p.bytes_per_block = p.bytes_per_token * in->block_size;
    p.blocks = p.kv_mem / p.bytes_per_block;
    p.tokens = p.blocks * in->block_size;
    if (in->context > 0) {
        p.blocks_per_request = (in->context + in->block_size - 1) / in->block_size;
        p.requests = p.blocks / p.blocks_per_request;
        /* per layer: every block, or of a sliding layer what its window
         * and one step see (kv.h's fy_kv_blocks_held, layer by layer) */
        int64_t layer_block = p.bytes_per_block / in->n_layers, step = in->step > 0 ? in->step : 512, held = 0;
        /* a budget: its sink, recent and heavy parts each round up to
         * blocks, plus a step and the block being written (evict.h's
         * fy_evict_max_blocks) */
        int64_t budget_blocks =
            in->kv_budget > 0 ? (in->kv_budget + step + in->block_size - 1) / in->block_size + 3 : p.blocks_per_request;
        for (int32_t l = 0; l < in->n_layers; l++) {
            int64_t w = in->windows ? in->windows[l] : 0, most = p.blocks_per_request;
            if (budget_blocks < most) most = budget_blocks;
            if (w > 0) {
                int64_t win = (w - 1 + step + in->block_size - 1) / in->block_size + 1;
                if (win < most) most = win;
            }
            held += most * layer_block;
        }
        p.held_per_request = held;
        p.requests_held = held ? p.kv_mem / held : 0;
    }
    *out = p;
    return FY_OK;
}

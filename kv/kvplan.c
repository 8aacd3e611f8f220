/* kvplan.c - KV capacity arithmetic. */
#include "kv/kvplan.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

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

fy_status_t fy_kv_tp_heads(int32_t n_heads, int32_t n_kv_heads, int32_t tp, int32_t rank, int32_t *q0_p, int32_t *nq_p,
                           int32_t *kv0_p, int32_t *nkv_p)
{
    if (tp < 1 || rank < 0 || rank >= tp || n_heads < 1 || n_kv_heads < 1 || n_heads % n_kv_heads) {
        fy_error("tensor parallel: bad shape (%d heads, %d kv heads, rank %d of %d)", n_heads, n_kv_heads, rank, tp);
        return FY_ERR_INVALID;
    }
    if (n_heads % tp) {
        fy_error("tensor parallel: %d query heads do not split over %d ranks", n_heads, tp);
        return FY_ERR_INVALID;
    }
    int32_t nq = n_heads / tp, q0 = rank * nq, kv0, nkv;
    if (n_kv_heads % tp == 0) {
        nkv = n_kv_heads / tp;
        kv0 = rank * nkv;
    } else if (tp % n_kv_heads == 0) { /* each rank's query heads read one KV head: keep a copy of it */
        nkv = 1;
        kv0 = q0 / (n_heads / n_kv_heads);
    } else {
        fy_error("tensor parallel: %d kv heads neither split over %d ranks nor replicate evenly across them",
                 n_kv_heads, tp);
        return FY_ERR_INVALID;
    }
    *q0_p = q0;
    *nq_p = nq;
    *kv0_p = kv0;
    *nkv_p = nkv;
    return FY_OK;
}

fy_status_t fy_kv_pp_layers(int32_t n_layers, int32_t pp, int32_t stage, int32_t *first_p, int32_t *count_p)
{
    if (pp < 1 || stage < 0 || stage >= pp || n_layers < pp) {
        fy_error("pipeline parallel: %d layers do not make %d stages (stage %d)", n_layers, pp, stage);
        return FY_ERR_INVALID;
    }
    int32_t base = n_layers / pp, extra = n_layers % pp;
    *first_p = stage * base + (stage < extra ? stage : extra);
    *count_p = base + (stage < extra);
    return FY_OK;
}

static fy_status_t plan_one(const fy_kv_plan_in_t *in, fy_kv_plan_t *out)
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

fy_status_t fy_kv_plan(const fy_kv_plan_in_t *in, fy_kv_plan_t *out)
{
    int32_t tp = in->tp > 1 ? in->tp : 1, pp = in->pp > 1 ? in->pp : 1;
    if (in->tp < 0 || in->pp < 0 || tp > 64 || pp > 64 || tp * pp > 64) {
        fy_error("plan: bad ranks (tp %d, pp %d; at most 64 ranks)", in->tp, in->pp);
        return FY_ERR_INVALID;
    }
    fy_kv_plan_t p;
    fy_status_t st;
    if (tp * pp == 1) {
        if ((st = plan_one(in, &p))) return st;
        p.ranks = 1;
        p.kv_heads_per_rank = in->n_kv_heads;
        p.max_stage_layers = in->n_layers;
        p.bytes_per_token_all = p.bytes_per_token;
        *out = p;
        return FY_OK;
    }
    int32_t q0, nq, kv0, nkv;
    if (tp > 1 && in->n_heads < 1) {
        fy_error("plan: tensor parallel needs the query head count");
        return FY_ERR_INVALID;
    }
    if (tp > 1 && (st = fy_kv_tp_heads(in->n_heads, in->n_kv_heads, tp, 0, &q0, &nq, &kv0, &nkv))) return st;
    if (tp == 1) nkv = in->n_kv_heads;
    /* every rank holds the same block ids: the fullest stage bounds them all */
    for (int32_t s = 0; s < pp; s++) {
        int32_t first, count;
        if ((st = fy_kv_pp_layers(in->n_layers, pp, s, &first, &count))) return st;
        fy_kv_plan_in_t one = *in;
        one.n_layers = count;
        one.n_kv_heads = nkv;
        one.windows = in->windows ? in->windows + first : NULL;
        one.tp = one.pp = 1;
        fy_kv_plan_t q;
        if ((st = plan_one(&one, &q))) return st;
        if (s == 0) {
            p = q;
            p.bytes_per_token_all = 0;
            p.max_stage_layers = 0;
        }
        if (q.bytes_per_block > p.bytes_per_block) {
            p.bytes_per_token = q.bytes_per_token;
            p.bytes_per_block = q.bytes_per_block;
        }
        if (q.blocks < p.blocks) p.blocks = q.blocks;
        if (q.requests < p.requests) p.requests = q.requests;
        if (q.held_per_request > p.held_per_request) p.held_per_request = q.held_per_request;
        if (q.requests_held < p.requests_held) p.requests_held = q.requests_held;
        if (count > p.max_stage_layers) p.max_stage_layers = count;
        p.bytes_per_token_all += q.bytes_per_token * tp;
    }
    p.tokens = p.blocks * in->block_size;
    p.ranks = tp * pp;
    p.kv_heads_per_rank = nkv;
    *out = p;
    return FY_OK;
}

int64_t fy_kv_blocks_needed(const fy_kv_layout_t *lay, int64_t tokens, int64_t cached_tokens, int32_t step, int64_t cap)
{
    int64_t bs = lay->block_size, need = 0;
    int64_t all = (tokens + bs - 1) / bs - cached_tokens / bs;
    if (all > cap) all = cap; /* a budget holds at most cap blocks however long the request runs */
    for (int32_t g = 0; g < lay->n_groups; g++) {
        int64_t w = lay->group_window[g];
        /* a sliding group's cached blocks (its window at the hit) are
         * held, not new, but its bound counts them: conservative */
        int64_t most = w && step > 0 ? (w - 1 + step + bs - 1) / bs + 1 : all;
        need += most < all ? most : all;
    }
    return need < 0 ? 0 : need;
}

int32_t fy_kv_watermark_pages(float watermark, int32_t n) { return (int32_t)((double)watermark * n); }

int32_t fy_kv_pool_blocks(const fy_kv_layout_t *lay, int64_t tokens, int32_t requests, int32_t step, float watermark)
{
    if (lay->n_groups < 1 || lay->block_size < 1 || tokens < 1 || requests < 1 || step < 0 ||
        !(watermark >= 0.0f && watermark < 1.0f)) {
        fy_error("kv pool: bad request (%lld tokens, %d requests, step %d, watermark %g)", (long long)tokens, requests,
                 step, (double)watermark);
        return -1;
    }
    const int64_t G = lay->n_groups, most = INT32_MAX / 2;
    int64_t want = fy_kv_blocks_needed(lay, tokens, 0, step, INT64_MAX) * requests;
    if (want > most) goto too_big;
    /* the fewest whole blocks of every layer whose pages, less the
     * watermark's, cover the requests: start from the real-valued answer
     * and step to the exact one (the watermark rounds down, so at most a
     * few steps either way) */
    int64_t blocks = (int64_t)ceil((double)want / (1.0 - (double)watermark) / (double)G);
    if (blocks < 1) blocks = 1;
    if (blocks * G > most) goto too_big;
    while (blocks > 1 && (blocks - 1) * G - fy_kv_watermark_pages(watermark, (int32_t)((blocks - 1) * G)) >= want)
        blocks--;
    while (blocks * G - fy_kv_watermark_pages(watermark, (int32_t)(blocks * G)) < want) {
        if (++blocks * G > most) goto too_big;
    }
    return (int32_t)blocks;
too_big:
    fy_error("kv pool: %d requests of %lld tokens need more than %lld pages", requests, (long long)tokens,
             (long long)most);
    return -1;
}

/* evict.c - KV budgets: which blocks to evict (evict.h says why whole blocks). */
#include "kv/evict.h"

#include <stdlib.h>

#include "common/log.h"

const char *fy_evict_policy_name(fy_evict_policy_t p)
{
    switch (p) {
    case FY_EVICT_NONE: return "none";
    case FY_EVICT_STREAMING: return "streaming";
    case FY_EVICT_H2O: return "h2o";
    }
    return "?";
}

int32_t fy_evict_budget(const fy_evict_params_t *p)
{
    int64_t t = (int64_t)p->sink_tokens + p->recent_tokens + (p->policy == FY_EVICT_H2O ? p->heavy_tokens : 0);
    return t > INT32_MAX ? INT32_MAX : (int32_t)t;
}

fy_status_t fy_evict_for_budget(const fy_evict_params_t *d, int32_t tokens, fy_evict_params_t *out_p)
{
    int32_t full = fy_evict_budget(d);
    if (d->policy == FY_EVICT_NONE) {
        fy_error("a kv budget of %d tokens asked for; this deployment evicts nothing (kv.evict = none)", tokens);
        return FY_ERR_INVALID;
    }
    if (tokens < 1 || tokens > full) {
        fy_error("a kv budget of %d tokens; this deployment allows 1 to %d", tokens, full);
        return FY_ERR_INVALID;
    }
    /* the same split, scaled; rounding goes to the recent window */
    fy_evict_params_t p = *d;
    p.sink_tokens = (int32_t)((int64_t)d->sink_tokens * tokens / full);
    p.heavy_tokens = d->policy == FY_EVICT_H2O ? (int32_t)((int64_t)d->heavy_tokens * tokens / full) : 0;
    p.recent_tokens = tokens - p.sink_tokens - p.heavy_tokens;
    *out_p = p;
    return FY_OK;
}

static int32_t blocks_of(int64_t tokens, int32_t bs) { return (int32_t)((tokens + bs - 1) / bs); }

int32_t fy_evict_max_blocks(const fy_evict_params_t *p, int32_t bs, int32_t step)
{
    if (p->policy == FY_EVICT_NONE) return INT32_MAX;
    int64_t n = (int64_t)blocks_of(p->sink_tokens, bs) + blocks_of((int64_t)p->recent_tokens + step, bs) + 1;
    if (p->policy == FY_EVICT_H2O) n += blocks_of(p->heavy_tokens, bs);
    return n > INT32_MAX ? INT32_MAX : (int32_t)n;
}

/* Highest score first; of equal scores the later block first (it stays). */
static int by_score(const void *a, const void *b)
{
    const fy_evict_cand_t *x = a, *y = b;
    if (x->score != y->score) return x->score < y->score ? 1 : -1;
    return (x->block < y->block) - (x->block > y->block);
}

static int by_block(const void *a, const void *b)
{
    const fy_evict_cand_t *x = a, *y = b;
    return (x->block > y->block) - (x->block < y->block);
}

int32_t fy_evict_choose(const fy_evict_params_t *p, const fy_block_table_t *bt, const float *scores, int32_t *out,
                        fy_evict_cand_t *c, int32_t cap)
{
    if (p->policy == FY_EVICT_NONE) return 0;
    int32_t bs = bt->block_size, n = bt->n_tokens, cur = n / bs;
    int32_t sinks = blocks_of(p->sink_tokens, bs);
    int32_t recent = n - p->recent_tokens > 0 ? (n - p->recent_tokens) / bs : 0; /* first recent block */
    int32_t end = recent < cur ? recent : cur;
    int32_t nc = 0;
    for (int32_t i = sinks; i < end && nc < cap; i++)
        if (fy_block_table_holds(bt, i))
            c[nc++] = (fy_evict_cand_t){i, scores && p->policy == FY_EVICT_H2O ? scores[i] : 0.0f};
    int32_t keep = p->policy == FY_EVICT_H2O ? blocks_of(p->heavy_tokens, bs) : 0;
    int32_t n_out = 0;
    if (nc > keep) {
        if (keep > 0) qsort(c, (size_t)nc, sizeof(*c), by_score);
        qsort(c + keep, (size_t)(nc - keep), sizeof(*c), by_block);
        for (int32_t k = keep; k < nc; k++) out[n_out++] = c[k].block;
    }
    return n_out;
}

/*
 * evict.h - KV budgets for long contexts: which blocks of a sequence to
 * evict, StreamingLLM's way (attention sinks and a recent window) or
 * H2O's (those plus the "heavy hitters", the blocks that received the most
 * attention so far).
 *
 * Granularity: whole blocks.  Eviction drops a block-table entry (the
 * kernels skip -1 entries), so kernels, transfer and the block manager
 * keep whole blocks of contiguous tokens; token-level eviction would need
 * compaction, moving K/V inside blocks every step.  The price: budgets are
 * counted in blocks (a budget of N tokens keeps ceil(N / B) blocks per
 * part, plus the block being written).
 *
 * Positions: kept keys keep their original positions (K is stored after
 * RoPE, and a query at its true position sees exact relative distances to
 * every kept key).  StreamingLLM re-numbers positions inside its cache so
 * that a model never sees distances past its trained length; within a
 * model's context (what ferry admits) true distances are the ones it was
 * trained on, and re-numbering would need the cached keys rotated again.
 *
 * Not here: the scores themselves (the attention kernel accumulates them,
 * fy_backend_set_attn_scores), applying the choice (fy_kvm_seq_evict), or
 * the engine's bookkeeping (engine.c).
 */
#ifndef FY_EVICT_H
#define FY_EVICT_H

#include <stdint.h>

#include "kv/kv.h"
#include "common/status.h"

typedef enum fy_evict_policy {
    FY_EVICT_NONE = 0,
    FY_EVICT_STREAMING, /* sinks + recent window */
    FY_EVICT_H2O,       /* sinks + recent window + heavy hitters */
} fy_evict_policy_t;

const char *fy_evict_policy_name(fy_evict_policy_t p);

typedef struct fy_evict_params {
    fy_evict_policy_t policy;
    int32_t sink_tokens;   /* the first tokens, always kept */
    int32_t recent_tokens; /* the last tokens, always kept */
    int32_t heavy_tokens;  /* H2O: middle tokens kept by score (0 for streaming) */
} fy_evict_params_t;

/* Tokens the three parts add up to: the budget. */
int32_t fy_evict_budget(const fy_evict_params_t *p);

/* The deployment's split scaled to a request's budget of `tokens` (no
 * more than the deployment's budget; FY_ERR_INVALID, logged, otherwise,
 * or with policy none). */
fy_status_t fy_evict_for_budget(const fy_evict_params_t *deploy, int32_t tokens, fy_evict_params_t *out_p);

/* Blocks a sequence under p holds at most per KV group, when one forward
 * pass adds up to step tokens before eviction runs. */
int32_t fy_evict_max_blocks(const fy_evict_params_t *p, int32_t block_size, int32_t step);

/* One candidate block of fy_evict_choose (the caller's scratch). */
typedef struct fy_evict_cand {
    int32_t block;
    float score;
} fy_evict_cand_t;

/*
 * The blocks to evict now from bt (n_tokens written): every held full
 * block before the one being written that is neither a sink block (the
 * first ceil(sink / B)), nor in the recent window (blocks holding any of
 * the last `recent` tokens), nor, for H2O, among the ceil(heavy / B)
 * middle blocks with the highest scores[i] (ties: the later block stays).
 * Writes at most cap indexes into out, ascending; returns the count.
 * cand: scratch of cap entries (nothing is allocated: it runs every engine
 * step).  Policy none: 0.
 */
int32_t fy_evict_choose(const fy_evict_params_t *p, const fy_block_table_t *bt, const float *scores, int32_t *out,
                        fy_evict_cand_t *cand, int32_t cap);

#endif /* FY_EVICT_H */

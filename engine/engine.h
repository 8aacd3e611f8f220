/*
 * engine.h - the serving engine: continuous batching over one runner and
 * one block manager.
 *
 * Requests wait in a queue ordered by priority then arrival; each step
 * runs one batched forward pass over every running request: a decode
 * token for each decoding request first, then prompt chunks that share
 * the step's token budget (chunked prefill).  Requests join between steps
 * when the block manager can promise them their worst case (prompt plus
 * max_tokens, less the cached prefix; or a predicted output length when
 * configured), and leave as soon as they finish.  When blocks run out
 * anyway (optimistic admission, copy-on-write), the lowest-priority,
 * latest-arriving request is preempted: its KV is dropped and recomputed
 * later (its full blocks stay in the prefix cache) or swapped to the host
 * tier.  A queue past its bound refuses new requests at once with
 * FY_ERR_OVERLOADED.  No configuration and no load makes the process run
 * out of memory: every buffer is sized at creation or at admission.
 *
 * Each request streams events to its own callback, on the engine thread:
 * tokens as they are sampled (with the text that became final), then
 * exactly one terminal event, finished (length, stop, end of turn,
 * context) or error (cancelled, shutting down, a compute failure), after
 * which the engine holds none of its blocks.  A seeded request gives the
 * same tokens whatever runs beside it: its sampler draws only from its
 * own generator, and the forward pass computes each token the same way in
 * any batch.
 *
 * The engine is driven either by the caller (fy_engine_step, one thread)
 * or by its own thread (fy_engine_start); submit and cancel are safe from
 * any thread in both cases.  This engine is what a decode worker runs,
 * and what one process runs for both phases in colocated mode.
 */
#ifndef FY_ENGINE_H
#define FY_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "kv/evict.h"
#include "common/genspec.h"
#include "kv/kv.h"
#include "engine/logits.h"
#include "engine/runner.h"
#include "engine/sampler.h"
#include "engine/spec.h"
#include "common/status.h"
#include "engine/stop.h"
#include "model/tokenizer.h"

typedef enum fy_finish_reason {
    FY_FINISH_NONE = 0,
    FY_FINISH_LENGTH,   /* max_tokens reached */
    FY_FINISH_STOP,     /* a stop string matched */
    FY_FINISH_EOS,      /* the model ended its turn */
    FY_FINISH_CONTEXT,  /* the context window is full */
    FY_FINISH_CALLBACK, /* the text callback asked to stop */
} fy_finish_reason_t;

const char *fy_finish_reason_str(fy_finish_reason_t r);

typedef enum fy_preempt_mode {
    FY_PREEMPT_RECOMPUTE = 0, /* drop the KV; prefill again later, reusing cached prefix blocks */
    FY_PREEMPT_SWAP,          /* move the KV to the host tier; recompute when it is full */
} fy_preempt_mode_t;

typedef struct fy_engine_params {
    int32_t max_num_seqs;           /* running requests at most */
    int32_t max_num_batched_tokens; /* tokens per step (decodes and prompt chunks) */
    int32_t max_waiting;            /* queued requests before new ones are refused as overloaded */
    fy_preempt_mode_t preempt;
    double itl_target_s;        /* guardrail: p95 inter-token latency target; 0 turns it off */
    int32_t itl_window;         /* inter-token latencies the guardrail looks at */
    int32_t min_prefill_budget; /* the guardrail never cuts prompt tokens per step below this */
    bool predict_output;        /* admit on a predicted output length, not max_tokens */
    double predict_quantile;    /* of recent output lengths, e.g. 0.9 */
    /* called on the engine thread after every step, and at least every
     * tick_s while idle (lease reaping, load reports); NULL: none */
    void (*tick_fn)(void *arg);
    void *tick_arg;
    double tick_s;
    /* speculative decoding: the deployment's proposer and its control
     * (engine/spec.h); method none turns it off unless a request asks */
    fy_spec_params_t spec;
    /* KV eviction for long contexts (evict.h): every request keeps at most
     * this budget of blocks once its context passes it; policy none: off */
    fy_evict_params_t evict;
} fy_engine_params_t;

/* Defaults: 64 sequences, 512 tokens a step, 256 waiting, recompute, no
 * guardrail, pessimistic admission.  Bounded by the runner's sizes. */
void fy_engine_params_default(fy_engine_params_t *p);

/*
 * What the place a request runs adds to it.  What the client asked is
 * fy_genspec_t (common/genspec.h), the one request type from the HTTP door
 * to here: the router parses it, the wire carries it, the engine takes it
 * as it is and applies its limits at submission (fy_genspec_max_tokens).
 * This is the rest, set by the server, never by the client.  Zeroed: the
 * zero namespace, no progress events, no scores, a whole generation.
 */
typedef struct fy_request_ctx {
    fy_kv_ns_t ns; /* prefix-cache namespace: the tenant's */
    bool progress; /* FY_EVENT_PROGRESS after each forward pass that computed prompt tokens */
    /* a prefill worker's request: one token, whatever the client's
     * max_tokens, with no stop strings, no end of turn and no stop token
     * ids ending it (min_tokens still bans them) and no speculation: the
     * decode worker decides what the first token means */
    bool first_only;
    /* fy_engine_adopt under H2O: the attention each prompt block received
     * where the prompt ran ([the prompt's blocks], copied); NULL: none, and
     * H2O's first choice here is by position */
    const float *kv_scores;
    /* fy_engine_adopt: the first token's alternatives, as the prefill
     * worker reported them */
    const int32_t *first_top_ids;
    const float *first_top_logprobs;
    int32_t n_first_top;
} fy_request_ctx_t;

typedef struct fy_request_timings {
    double queue_s;     /* submitted to first scheduled */
    double ttft_s;      /* submitted to first token */
    double e2e_s;       /* submitted to the terminal event */
    const float *itl_s; /* [n_itl] each inter-token latency */
    int32_t n_itl;
    int32_t n_prompt, n_generated, n_cached; /* n_cached: prompt tokens found in the prefix cache */
    int32_t n_preempted;
    int32_t n_spec_proposed, n_spec_accepted; /* speculative tokens proposed for it, and accepted */
    int32_t n_spec_steps;                     /* its verification steps */
    int32_t n_kv_kept; /* tokens whose K/V it held at its end: fewer than its length under a KV budget */
} fy_request_timings_t;

typedef enum fy_event_kind {
    FY_EVENT_TOKEN = 0,       /* a token was sampled; text is what became final with it (may be empty) */
    FY_EVENT_FINISH,          /* terminal: finished, see reason */
    FY_EVENT_ERROR,           /* terminal: failed, see status and message */
    FY_EVENT_PROGRESS,        /* prompt tokens were computed (requests with progress set) */
    FY_EVENT_PROMPT_LOGPROBS, /* prompt tokens' logprobs (requests with prompt_logprobs), before the first token */
} fy_event_kind_t;

typedef struct fy_event {
    fy_event_kind_t kind;
    uint64_t id;
    int32_t token;    /* FY_EVENT_TOKEN */
    float logprob;    /* of token under the temperature-scaled distribution */
    const char *text; /* FY_EVENT_TOKEN and FY_EVENT_FINISH (held-back text), not NUL-terminated */
    size_t len;
    fy_finish_reason_t reason;           /* FY_EVENT_FINISH */
    fy_status_t status;                  /* FY_EVENT_ERROR */
    const char *message;                 /* FY_EVENT_ERROR, NUL-terminated */
    const fy_request_timings_t *timings; /* terminal events */
    const fy_rng_t *rng;                 /* FY_EVENT_TOKEN: the generator after drawing token */
    /* FY_EVENT_TOKEN with top_logprobs: the most likely tokens at this
     * step and their log-probabilities (as logprob), most likely first;
     * FY_EVENT_PROMPT_LOGPROBS: n_top of them for each of its rows, row
     * after row ([n_rows * n_top]) */
    const int32_t *top_ids;
    const float *top_logprobs;
    int32_t n_top;
    /* FY_EVENT_TOKEN: more tokens of this request from the same step
     * follow at once (a speculative step's accepted run, all but its
     * last token); a receiver may hold this one to send with them.  The
     * run's last token, or the request's end event, comes next. */
    bool more;
    /* FY_EVENT_PROGRESS: the request's block table (valid during the
     * callback; the callback may fork it to keep its blocks) and how many
     * tokens of it have their K/V written */
    const fy_block_table_t *bt;
    int32_t n_computed, n_prompt;
    /* FY_EVENT_PROGRESS, after the KV budget's eviction (evict.h) ran on
     * the table: the attention each block received so far ([bt->n_blocks];
     * H2O only, else NULL) */
    const float *kv_scores;
    /* FY_EVENT_PROMPT_LOGPROBS: prompt tokens [first, first + n_rows)
     * (first >= 1: the first prompt token has none), each one's
     * log-probability and rank (1: the most likely); a request preempted
     * and recomputed before its first token may report a position again,
     * with the same values */
    int32_t first, n_rows;
    const float *prompt_lps;    /* [n_rows] */
    const int32_t *prompt_rank; /* [n_rows] */
} fy_event_t;

/* Called on the engine thread; must not call back into the engine except
 * fy_engine_cancel. */
typedef void (*fy_event_fn)(void *arg, const fy_event_t *ev);

typedef struct fy_engine fy_engine_t;

/* The runner, block manager and tokenizer must outlive the engine. */
fy_status_t fy_engine_create(fy_runner_t *runner, fy_kvm_t *kvm, const fy_tokenizer_t *tok,
                             const fy_engine_params_t *params, fy_engine_t **engine_p);
/* Ends every request still in it with an error event ("shutting down"). */
void fy_engine_destroy(fy_engine_t *engine); /* accepts NULL */

/*
 * Queues a request: gen is what the client asked (copied; its max_tokens
 * clamped to the context), ctx what the server adds (NULL: zeroed).
 * FY_ERR_OVERLOADED when the queue is at its bound,
 * FY_ERR_INVALID (message logged) for a bad prompt or parameters or a
 * request the KV cache could never hold, FY_ERR_NOMEM.  On success the
 * request will produce exactly one terminal event and *id_p names it;
 * otherwise no event is produced.
 */
fy_status_t fy_engine_submit(fy_engine_t *e, const int32_t *prompt, int32_t n_prompt, const fy_genspec_t *gen,
                             const fy_request_ctx_t *ctx, fy_event_fn cb, void *arg, uint64_t *id_p);
/* Why the last fy_engine_submit (or adopt) on this thread refused its
 * request ("response_format (regex): ..."), for the worker's answer;
 * empty when none has. */
const char *fy_engine_refusal(void);
/* Asks for a request to end (error event FY_ERR_CANCELLED) and free its
 * blocks at the next step; unknown or finished ids are ignored. */
void fy_engine_cancel(fy_engine_t *e, uint64_t id);

/* Runs one step (takes submitted and cancelled requests in, schedules,
 * runs the forward pass, emits events).  For callers that drive the
 * engine themselves; not while fy_engine_start's thread runs. */
fy_status_t fy_engine_step(fy_engine_t *e);
/* No request is queued, running or swapped out. */
bool fy_engine_idle(fy_engine_t *e);

/*
 * Work for the engine thread: fn(e, arg) runs before the next step (from
 * fy_engine_step when the caller drives the engine).  Any thread; never
 * blocks.  This is how servers touch the block manager and adopt
 * requests without locks on the hot path.  FY_ERR_NOMEM, or
 * FY_ERR_CANCELLED once the engine is being destroyed (fn will not run).
 */
typedef void (*fy_engine_fn)(fy_engine_t *e, void *arg);
fy_status_t fy_engine_post(fy_engine_t *e, fy_engine_fn fn, void *arg);

/*
 * Engine thread only (inside a posted function or the tick).  Takes in a
 * request whose prompt's K/V are already in the cache (a decode worker's
 * blocks, filled by a prefill worker): bt holds the prompt (n_prompt
 * tokens written, initialized for n_prompt + max_tokens), resv the rest
 * of its admission promise, first the first generated token, sampled
 * elsewhere with the generator left in rng.  The first token's event is
 * emitted before this returns (it may also be the terminal one).  On
 * success bt and resv are taken over (left empty); on failure
 * (FY_ERR_NO_SPACE: max_num_seqs running; FY_ERR_INVALID) nothing is.
 */
fy_status_t fy_engine_adopt(fy_engine_t *e, const int32_t *prompt, int32_t n_prompt, const fy_genspec_t *gen,
                            const fy_request_ctx_t *ctx, fy_block_table_t *bt, fy_kv_resv_t *resv, int32_t first,
                            float logprob, const fy_rng_t *rng, fy_event_fn cb, void *arg, uint64_t *id_p);

/* A request's KV budget here (evict.h): the engine's policy scaled to
 * kv_budget tokens (0: the engine's own), and the most blocks a KV group
 * of it holds (INT32_MAX without eviction).  FY_ERR_INVALID (logged) for a
 * budget the engine would refuse.  Any thread. */
fy_status_t fy_engine_request_evict(const fy_engine_t *e, int32_t kv_budget, fy_evict_params_t *ev_p, int32_t *cap_p);

/* Steps on a thread of the engine's own while there is work, sleeping
 * otherwise; fy_engine_stop (or destroy) ends it. */
fy_status_t fy_engine_start(fy_engine_t *e);
void fy_engine_stop(fy_engine_t *e);

typedef struct fy_engine_stats {
    int32_t running, waiting, swapped;
    uint64_t submitted, finished, errors, refused_overloaded, refused_invalid, cancelled;
    uint64_t steps, preemptions_recompute, preemptions_swap;
    uint64_t prompt_tokens, generation_tokens, computed_prompt_tokens;
    uint64_t forward_tokens; /* tokens fed to forward passes, every step's (vLLM's iteration tokens) */
    int32_t prefill_budget;  /* prompt tokens per step now (the guardrail moves it) */
    double itl_p95_s;        /* over the guardrail's window */
    /* speculative decoding: tokens proposed and accepted, verification
     * steps (one per request per step that speculated; mean accepted
     * length = spec_accepted / spec_steps, tokens per verification one
     * more), time spent proposing (n-gram lookups, draft forward passes),
     * and how often a request or the whole worker turned speculation off */
    uint64_t spec_proposed, spec_accepted, spec_steps;
    double propose_s;
    uint64_t spec_request_offs, spec_worker_offs;
    bool spec_worker_off; /* the worker's speculation is off now (probed again later) */
    /* structured outputs: grammars compiled at submission, and found in the cache */
    uint64_t grammar_compiles, grammar_cache_hits;
} fy_engine_stats_t;

void fy_engine_stats(fy_engine_t *e, fy_engine_stats_t *out);

/* The engine was given a draft model (requests may ask for FY_SPEC_DRAFT). */
bool fy_engine_has_draft(const fy_engine_t *e);

/* Between steps, on the thread that steps (tests): every running request
 * holds exactly the blocks its computed tokens need, in the target's
 * cache and the draft's (nothing left of rolled-back proposals), and both
 * block managers pass fy_kvm_check.  FY_ERR_INTERNAL (logged) otherwise. */
fy_status_t fy_engine_check(fy_engine_t *e);

#endif /* FY_ENGINE_H */

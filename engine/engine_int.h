/*
 * engine_int.h - what the engine's files share, and nothing outside
 * engine/ includes but its tests (tests/test_sched.c drives the planner
 * and the output stage without a model): the request and the engine's
 * state, and the functions one part of a step calls in another.
 *
 * The step is cut along its seams (docs/architecture.md, "The engine"):
 *   engine.c     the thread, the inbox, submission, the loop, a request's
 *                life and its one terminal event;
 *   sched.c      the plan: admission, chunking under the budgets,
 *                preemption, eviction, the latency guardrail (eng_plan);
 *   spec_step.c  speculative decoding's part of a step: proposals, their
 *                cost model, verification;
 *   output.c     logits into tokens and events: prompt logprobs, logits
 *                processing, the grammar's mask, sampling, alternatives,
 *                stop strings and streaming (eng_outputs).
 * The contract between them is the plan, eng_plan_t: eng_plan fills it
 * (and sets each planned request's sched and spec_k, which the plan's
 * sequences describe); the runner computes plan->seqs into the logits;
 * eng_outputs reads the plan and those logits, plan->n_rows rows in the
 * plan's order.  The planner never reads logits; the output stage takes
 * its requests and rows from the plan alone (a request it ends leaves the
 * queues through eng_end_request).  All of it runs on the engine thread,
 * except what engine.c says runs under mu.
 *
 * tests/test_sched.c drives the pieces without a model or a runner: an
 * engine made by eng_create with no runner, a real KV manager, requests
 * submitted as any caller's, eng_plan's plans checked, and logits written
 * by hand into eng_outputs.
 */
#ifndef FY_ENGINE_INT_H
#define FY_ENGINE_INT_H

#include <pthread.h>

#include "engine/engine.h"
#include "grammar/grammar.h"

#define OUT_CAP (FY_DETOK_MAX_OUT + FY_STOP_MAX_LEN + 16)
#define OUTPUT_RING 128
/* sampled requests whose draft distributions one step can keep (each
 * k_max rows of the vocabulary); greedy ones need none */
#define SPEC_QSLOTS 8
/* suffix lookup: a tenant's finished texts it searches at most, and the
 * tokens kept of each (the tail); a search reads them all each step */
#define SPEC_HIST_MAX 8
#define SPEC_HIST_TOKENS 2048
/* forward-pass costs are tracked per token count below this */
#define COST_N 512

typedef enum rq_state {
    RQ_INBOX = 0,
    RQ_WAITING,
    RQ_RUNNING,
    RQ_SWAPPED,
} rq_state_t;

typedef struct request {
    uint64_t id, seq;
    int32_t priority;
    rq_state_t state;
    fy_event_fn cb;
    void *cb_arg;
    /* what to do */
    fy_sampling_params_t sampling;
    bool logprobs, ignore_eos, progress;
    int32_t max_tokens;
    /* tokens: prompt then generated; n_computed of them are in the cache */
    int32_t *tokens;
    int32_t cap, n_prompt, n_total, n_computed, n_generated;
    int32_t sched; /* tokens scheduled this step */
    fy_block_table_t bt;
    fy_kv_resv_t resv;
    bool looked_up;
    /* KV budget: its policy, the most blocks a group holds, H2O's scores */
    fy_evict_params_t evict;
    int32_t kv_cap;
    float *scores; /* [blocks of cap tokens] attention mass each block received (H2O) */
    /* logits processing (logits.h): lp's arrays point at its own copies */
    fy_logits_params_t lp;
    bool lp_on;
    int32_t *bias_ids;
    float *bias;
    int32_t *allowed_ids;
    int32_t stop_ids[FY_LOGITS_MAX_STOP_IDS];
    int32_t top_logprobs;
    int32_t bad_lens[FY_LOGITS_MAX_BAD];
    int32_t bad_ids[FY_LOGITS_MAX_BAD_IDS];
    /* prompt logprobs: wanted, with this many alternatives; done once
     * every prompt row has been reported (the prefix cache is skipped
     * until then) */
    bool plp, plp_done;
    int32_t plp_top;
    bool defer_stops;
    fy_gmatch_t *gm; /* structured output: the grammar's state after the generated tokens; NULL: none */
    /* output */
    fy_rng_t rng;
    fy_detok_t detok;
    fy_stopper_t stopper;
    /* the token being streamed is not this step's last for q: a
     * speculative step's accepted run (its event's more) */
    bool step_more;
    char out[OUT_CAP];
    size_t n_out;
    /* timing */
    double t_submit, t_sched, t_first, t_last;
    float *itl;
    fy_request_timings_t timings;
    /* speculative decoding: proposals of this step sit at tokens[n_total,
     * n_total + spec_k), verified after the forward pass */
    fy_spec_method_t spec; /* FY_SPEC_NONE: off */
    fy_spec_ctl_t ctl;
    int32_t spec_k;                 /* tokens proposed this step */
    int32_t spec_drawn;             /* blocks this step's extra reservation drew from resv */
    int32_t qslot;                  /* draft distributions' slot (sampled requests with a draft), -1: none */
    fy_block_table_t dbt;           /* the draft's KV (FY_SPEC_DRAFT) */
    int32_t d_computed;             /* leading tokens with draft K/V */
    fy_rng_t drng;                  /* the draft's own draws */
    fy_spec_est_t est;              /* suffix lookup: how its proposals fare */
    int32_t spec_match;             /* suffix lookup: this step's matched length */
    bool spec_own;                  /* suffix lookup: the match is in the request's own text */
    float spec_gain[FY_SPEC_MAX_K]; /* suffix lookup: P(proposals 0..i all accepted) */
    struct request *next;           /* inbox and queue links */
} request_t;

/* A step's plan.  Its arrays are the engine's, sized max_num_seqs at
 * creation: planning a step allocates nothing.  Valid from eng_plan to
 * the end of eng_outputs, which may end (free) the requests it names. */
typedef struct eng_plan {
    fy_forward_seq_t *seqs; /* [n] the batch the runner computes, in the running set's order */
    request_t **reqs;       /* [n] seqs[i]'s request: sched tokens from n_computed, spec_k of them proposals */
    int32_t n;              /* sequences */
    int32_t n_tokens;       /* tokens over seqs */
    int32_t n_rows;         /* logit rows over seqs: the runner writes seqs[i].n_logits rows for each, in order */
    int32_t n_prefill;      /* of n_tokens, prompt chunks' (not decode tokens or proposals) */
    int32_t n_admitted;     /* requests that came in from waiting or swapped this step */
    int32_t n_preempted;    /* requests preempted for blocks this step (by recompute or swap) */
} eng_plan_t;

struct fy_engine {
    fy_runner_t *r;
    fy_kvm_t *kvm;
    const fy_tokenizer_t *tok;
    fy_engine_params_t p;
    int32_t vocab, max_ctx, block_size, total_blocks;
    fy_sampler_t *sampler;
    float *logits;      /* [logit_rows, vocab] */
    int32_t logit_rows; /* the runner's max_logits */
    /* speculative decoding */
    fy_spec_ctl_t wctl;   /* the worker's acceptance and off switch */
    float *probs;         /* [k_max + 1, vocab] target distributions of one sampled verification */
    float *qprobs;        /* [SPEC_QSLOTS, k_max, vocab] draft distributions (sampled requests) */
    float *scratch;       /* [vocab] */
    fy_spec_hist_t *hist; /* suffix lookup: tenants' recent texts; NULL: none */
    fy_spec_est_t west;   /* suffix lookup: all requests' outcomes, a new request's prior */
    fy_logits_scratch_t lscratch;
    int32_t top_ids[FY_LOGITS_MAX_TOP];
    float top_lps[FY_LOGITS_MAX_TOP];
    /* prompt logprobs of one request's rows in a step */
    float *plp_lps;    /* [logit_rows] */
    int32_t *plp_rank; /* [logit_rows] */
    int32_t *plp_ids;  /* [logit_rows, FY_LOGITS_MAX_TOP] */
    float *plp_tlps;   /* [logit_rows, FY_LOGITS_MAX_TOP] */
    /* structured outputs: the vocabulary's trie, compiled grammars, a mask */
    fy_token_trie_t *trie;
    fy_grammar_cache_t *gcache;
    uint32_t *gmask;        /* [mask words] */
    fy_forward_seq_t *dfwd; /* [max_num_seqs] draft batch */
    request_t **dreq;       /* [max_num_seqs] */
    int32_t *dk;            /* [max_num_seqs] tokens each wants proposed */
    double cost[COST_N];    /* seconds of a forward pass of n tokens (moving average) */
    uint32_t cost_n[COST_N];
    request_t **dfwd_req;        /* [max_num_seqs] dfwd[i]'s request */
    double dcost;                /* seconds of one draft pass (moving average) */
    eng_plan_t plan;             /* the step's plan, its arrays [max_num_seqs] */
    int32_t *evict_buf;          /* [evict_cap] blocks kv_evict drops */
    fy_evict_cand_t *evict_cand; /* [evict_cap] its scratch */
    int32_t evict_cap;
    /* queues: the engine thread's */
    request_t *waiting, *swapped; /* sorted: priority down, then arrival */
    request_t **running;          /* [max_num_seqs] */
    int32_t n_running, n_waiting, n_swapped;
    /* inbox: any thread, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    request_t *inbox, *inbox_tail;
    struct post *posts, *posts_tail;
    bool dying; /* destroy began: no more posts */
    uint64_t *cancels;
    int32_t n_cancels, cap_cancels;
    int32_t queued; /* inbox + waiting, for the overload bound */
    uint64_t next_id, next_seq;
    pthread_t thread;
    bool thread_on, stop;
    /* guardrail */
    float *itl_ring;
    int32_t itl_n, itl_pos, itl_since_change;
    int32_t prefill_budget;
    float *itl_scratch;
    /* output lengths for prediction */
    int32_t out_ring[OUTPUT_RING];
    int32_t out_n, out_pos;
    fy_engine_stats_t st; /* counters; submit-side ones under mu */
};

typedef struct post {
    fy_engine_fn fn;
    void *arg;
    struct post *next;
} post_t;

/* engine.c */
/* fy_engine_create's body, for a runner of parameters rp and vocabulary
 * vocab.  r may be NULL: an engine that plans steps and takes their
 * outputs (eng_plan, eng_outputs) but has no forward pass, so
 * fy_engine_step and fy_engine_start refuse it (test_sched). */
fy_status_t eng_create(fy_runner_t *r, const fy_runner_params_t *rp, int32_t vocab, fy_kvm_t *kvm,
                       const fy_tokenizer_t *tok, const fy_engine_params_t *p, fy_engine_t **e_p);
/* Moves what other threads handed in (requests, cancels) into the queues. */
void eng_take_inbox(fy_engine_t *e);
bool eng_before(const request_t *a, const request_t *b);
void eng_draft_drop(fy_engine_t *e, request_t *q);
void eng_emit_text(void *arg, const char *text, size_t len);
void eng_end_error(fy_engine_t *e, request_t *q, fy_status_t status, const char *message);
void eng_end_request(fy_engine_t *e, request_t *q, fy_event_kind_t kind, fy_finish_reason_t reason, fy_status_t status,
                     const char *message);
void eng_list_insert(request_t **head, request_t *q);
bool eng_list_remove(request_t **head, request_t *q);
void eng_unlink_request(fy_engine_t *e, request_t *q);

/* sched.c */
void eng_adjust_budget(fy_engine_t *e);
void eng_guardrail(fy_engine_t *e, float itl);
void eng_kv_evict(fy_engine_t *e, request_t *q);
bool eng_plp_rows(const request_t *q);
void eng_plan(fy_engine_t *e, eng_plan_t *plan);

/* spec_step.c */
void eng_cost_note(fy_engine_t *e, int32_t n, double s);
void eng_spec_plan(fy_engine_t *e, int32_t budget);
void eng_spec_verify(fy_engine_t *e, request_t *q, float *lg, double t);

/* output.c */
fy_status_t eng_grammar_mask(fy_engine_t *e, request_t *q, float *lg);
bool eng_on_token(fy_engine_t *e, request_t *q, int32_t tok, float logprob, double t);
bool eng_on_token_top(fy_engine_t *e, request_t *q, int32_t tok, float logprob, const int32_t *top_ids,
                      const float *top_lps, int32_t n_top, double t);
void eng_outputs(fy_engine_t *e, const eng_plan_t *plan, float *logits, double t);

#endif /* FY_ENGINE_INT_H */

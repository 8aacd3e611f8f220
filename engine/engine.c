/*
 * engine.c - continuous batching: queues, admission, the step, preemption,
 * the inter-token-latency guardrail, per-request streaming.
 *
 * A request's tokens are prompt then generated tokens; n_computed of them
 * have their K/V in the cache.  Each step a running request computes
 * tokens [n_computed, n_computed + k): one for a decoding request (the
 * token it sampled last step), a chunk of its prompt otherwise.  When a
 * chunk reaches the last known token, its logits give the next token.  A
 * request preempted by recompute starts again at n_computed = 0 (its
 * cached prefix blocks make that cheap) and, having computed all its known
 * tokens, samples exactly the token it would have sampled unpreempted.
 */
#include "engine.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "grammar.h"
#include "log.h"
#include "mem.h"

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
    double dcost;                /* seconds of one draft pass (moving average) */
    fy_forward_seq_t *fwd;       /* [max_num_seqs] */
    int32_t *evict_buf;          /* [evict_cap] blocks kv_evict drops */
    fy_evict_cand_t *evict_cand; /* [evict_cap] its scratch */
    int32_t evict_cap;
    request_t **fwd_req; /* [max_num_seqs] */
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

const char *fy_finish_reason_str(fy_finish_reason_t r)
{
    switch (r) {
    case FY_FINISH_NONE: return "none";
    case FY_FINISH_LENGTH: return "length";
    case FY_FINISH_STOP: return "stop";
    case FY_FINISH_EOS: return "eos";
    case FY_FINISH_CONTEXT: return "context";
    case FY_FINISH_CALLBACK: return "callback";
    }
    return "?";
}

void fy_engine_params_default(fy_engine_params_t *p)
{
    *p = (fy_engine_params_t){
        .max_num_seqs = 64,
        .max_num_batched_tokens = 512,
        .max_waiting = 256,
        .preempt = FY_PREEMPT_RECOMPUTE,
        .itl_target_s = 0.0,
        .itl_window = 256,
        .min_prefill_budget = 32,
        .predict_output = false,
        .predict_quantile = 0.9,
        .tick_s = 0.1,
    };
    fy_spec_params_default(&p->spec);
}

void fy_request_params_default(fy_request_params_t *p)
{
    memset(p, 0, sizeof(*p));
    fy_sampling_params_default(&p->sampling);
    p->max_tokens = 128;
    p->logits.repetition_penalty = 1.0f;
}

/* ---- requests ----------------------------------------------------------------------------- */

static void request_free(request_t *q)
{
    if (!q) return;
    fy_kvm_seq_deinit(&q->bt);
    fy_kvm_seq_deinit(&q->dbt);
    fy_stopper_deinit(&q->stopper);
    fy_free(q->tokens);
    fy_free(q->itl);
    fy_free(q->scores);
    fy_free(q->bias_ids);
    fy_free(q->bias);
    fy_gmatch_destroy(q->gm);
    fy_free(q);
}

/* ordering of queues and of the running set: priority down, then arrival */
static bool before(const request_t *a, const request_t *b)
{
    return a->priority > b->priority || (a->priority == b->priority && a->seq < b->seq);
}

static void list_insert(request_t **head, request_t *q)
{
    while (*head && before(*head, q)) head = &(*head)->next;
    q->next = *head;
    *head = q;
}

static bool list_remove(request_t **head, request_t *q)
{
    for (; *head; head = &(*head)->next) {
        if (*head == q) {
            *head = q->next;
            q->next = NULL;
            return true;
        }
    }
    return false;
}

static void emit_text(void *arg, const char *text, size_t len)
{
    request_t *q = arg;
    size_t room = sizeof(q->out) - q->n_out;
    if (len > room) len = room; /* cannot happen: OUT_CAP covers a piece and a held stop prefix */
    memcpy(q->out + q->n_out, text, len);
    q->n_out += len;
}

static void fill_timings(request_t *q, double t_end)
{
    fy_request_timings_t *t = &q->timings;
    t->queue_s = q->t_sched > 0 ? q->t_sched - q->t_submit : t_end - q->t_submit;
    t->ttft_s = q->t_first > 0 ? q->t_first - q->t_submit : 0.0;
    t->e2e_s = t_end - q->t_submit;
    t->itl_s = q->itl;
    t->n_prompt = q->n_prompt;
    t->n_generated = q->n_generated;
    t->n_spec_proposed = (int32_t)q->ctl.proposed;
    t->n_spec_accepted = (int32_t)q->ctl.accepted;
    t->n_spec_steps = (int32_t)q->ctl.verifies;
}

/* Gives the draft's blocks back; the draft recomputes from the start
 * when the request speculates again. */
static void draft_drop(fy_engine_t *e, request_t *q)
{
    if (q->dbt.blocks) fy_kvm_seq_release(e->p.spec.draft_kvm, &q->dbt);
    q->d_computed = 0;
}

/* Takes the request out of whichever queue holds it. */
static void unlink_request(fy_engine_t *e, request_t *q)
{
    switch (q->state) {
    case RQ_WAITING:
        list_remove(&e->waiting, q);
        e->n_waiting--;
        pthread_mutex_lock(&e->mu);
        e->queued--;
        pthread_mutex_unlock(&e->mu);
        break;
    case RQ_SWAPPED:
        list_remove(&e->swapped, q);
        e->n_swapped--;
        break;
    case RQ_RUNNING:
        for (int32_t i = 0; i < e->n_running; i++) {
            if (e->running[i] == q) {
                memmove(&e->running[i], &e->running[i + 1], (size_t)(e->n_running - i - 1) * sizeof(request_t *));
                e->n_running--;
                break;
            }
        }
        break;
    case RQ_INBOX: break;
    }
}

/* Tokens whose K/V a table holds in some KV group (a KV budget's kept
 * ones; all of them without eviction). */
static int32_t kv_kept_tokens(const fy_block_table_t *bt)
{
    int64_t kept = 0;
    for (int32_t i = 0; i < bt->n_blocks; i++) {
        int32_t in = bt->n_tokens - i * bt->block_size;
        if (fy_block_table_holds(bt, i) && in > 0) kept += in < bt->block_size ? in : bt->block_size;
    }
    return (int32_t)kept;
}

/* The one terminal event: the request leaves, its blocks and promise go back. */
static void end_request(fy_engine_t *e, request_t *q, fy_event_kind_t kind, fy_finish_reason_t reason,
                        fy_status_t status, const char *message)
{
    unlink_request(e, q);
    /* its text is what the tenant's next requests may repeat */
    if (e->hist && kind == FY_EVENT_FINISH && q->spec == FY_SPEC_NGRAM)
        fy_spec_hist_add(e->hist, &q->bt.ns, q->tokens, q->n_total);
    q->timings.n_kv_kept = kv_kept_tokens(&q->bt);
    fy_kvm_seq_release(e->kvm, &q->bt);
    fy_kvm_resv_release(e->kvm, &q->resv);
    draft_drop(e, q);
    double t = fy_now_s();
    fill_timings(q, t);
    fy_event_t ev = {.kind = kind,
                     .id = q->id,
                     .reason = reason,
                     .status = status,
                     .message = message,
                     .timings = &q->timings,
                     .token = -1};
    if (kind == FY_EVENT_FINISH) {
        q->n_out = 0;
        if (reason != FY_FINISH_STOP) {
            char piece[FY_DETOK_MAX_OUT];
            size_t n = fy_detok_flush(&q->detok, piece, sizeof(piece));
            if (fy_stopper_feed(&q->stopper, piece, n, emit_text, q))
                ev.reason = FY_FINISH_STOP;
            else
                fy_stopper_flush(&q->stopper, emit_text, q);
        }
        ev.text = q->out;
        ev.len = q->n_out;
        e->st.finished++;
        if (e->out_n < OUTPUT_RING) e->out_n++;
        e->out_ring[e->out_pos] = q->n_generated;
        e->out_pos = (e->out_pos + 1) % OUTPUT_RING;
    } else {
        e->st.errors++;
        if (status == FY_ERR_CANCELLED) e->st.cancelled++;
    }
    q->cb(q->cb_arg, &ev);
    request_free(q);
}

static void end_error(fy_engine_t *e, request_t *q, fy_status_t status, const char *message)
{
    end_request(e, q, FY_EVENT_ERROR, FY_FINISH_NONE, status, message);
}

/* ---- creation ------------------------------------------------------------------------------- */

fy_status_t fy_engine_create(fy_runner_t *r, fy_kvm_t *kvm, const fy_tokenizer_t *tok, const fy_engine_params_t *p,
                             fy_engine_t **e_p)
{
    const fy_runner_params_t *rp = fy_runner_params(r);
    if (p->max_num_seqs < 1 || p->max_num_seqs > rp->max_seqs || p->max_num_seqs > rp->max_logits ||
        p->max_num_batched_tokens < p->max_num_seqs || p->max_num_batched_tokens > rp->max_batch_tokens ||
        p->max_waiting < 0 || p->itl_target_s < 0 || (p->itl_target_s > 0 && p->itl_window < 8) ||
        p->min_prefill_budget < 1 || !(p->predict_quantile > 0 && p->predict_quantile <= 1) ||
        (p->tick_fn && !(p->tick_s > 0 && p->tick_s < 3600)) || fy_spec_params_check(&p->spec) != FY_OK) {
        fy_error("engine: bad parameters (%d sequences, %d tokens a step, %d waiting); the runner allows %d "
                 "sequences, %d logit rows, %d tokens",
                 p->max_num_seqs, p->max_num_batched_tokens, p->max_waiting, rp->max_seqs, rp->max_logits,
                 rp->max_batch_tokens);
        return FY_ERR_INVALID;
    }
    const fy_evict_params_t *ev = &p->evict;
    if (ev->policy < FY_EVICT_NONE || ev->policy > FY_EVICT_H2O ||
        (ev->policy != FY_EVICT_NONE &&
         (ev->sink_tokens < 0 || ev->recent_tokens < 1 || ev->heavy_tokens < 0 ||
          (ev->policy == FY_EVICT_H2O && ev->heavy_tokens < 1) || fy_evict_budget(ev) >= rp->max_ctx))) {
        fy_error("engine: kv eviction %s with %d sink, %d recent and %d heavy tokens (a recent window, for h2o "
                 "heavy tokens, and a budget under the context of %d)",
                 fy_evict_policy_name(ev->policy), ev->sink_tokens, ev->recent_tokens, ev->heavy_tokens, rp->max_ctx);
        return FY_ERR_INVALID;
    }
    fy_engine_t *e = fy_calloc(1, sizeof(*e));
    if (!e) goto nomem;
    e->r = r;
    e->kvm = kvm;
    e->tok = tok;
    e->p = *p;
    e->vocab = fy_model_config(fy_runner_model(r))->vocab_size;
    e->max_ctx = rp->max_ctx;
    e->block_size = rp->block_size;
    fy_kvm_stats_t ks;
    fy_kvm_stats(kvm, &ks);
    e->total_blocks = ks.tier[FY_KV_DEVICE].total;
    e->prefill_budget = p->max_num_batched_tokens;
    e->next_id = 1;
    e->logit_rows = rp->max_logits;
    if (p->spec.draft) {
        const fy_runner_params_t *dp = fy_runner_params(p->spec.draft);
        if (fy_model_config(fy_runner_model(p->spec.draft))->vocab_size != e->vocab || dp->max_seqs < p->max_num_seqs ||
            dp->max_logits < p->max_num_seqs) {
            fy_error("engine: the draft runner has another vocabulary or holds fewer than %d sequences",
                     p->max_num_seqs);
            fy_free(e);
            return FY_ERR_INVALID;
        }
    }
    fy_spec_ctl_init(&e->wctl, &p->spec);
    fy_spec_est_init(&e->west);
    e->wctl.window = 256;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    int32_t n = p->max_num_seqs, w = p->itl_window > 0 ? p->itl_window : 1;
    e->logits = fy_malloc((size_t)e->logit_rows * (size_t)e->vocab * sizeof(float));
    e->plp_lps = fy_malloc((size_t)e->logit_rows * sizeof(float));
    e->plp_rank = fy_malloc((size_t)e->logit_rows * sizeof(int32_t));
    e->plp_ids = fy_malloc((size_t)e->logit_rows * FY_LOGITS_MAX_TOP * sizeof(int32_t));
    e->plp_tlps = fy_malloc((size_t)e->logit_rows * FY_LOGITS_MAX_TOP * sizeof(float));
    if (!e->plp_lps || !e->plp_rank || !e->plp_ids || !e->plp_tlps) goto nomem;
    int32_t K = p->spec.k_max;
    e->probs = fy_malloc((size_t)(K + 1) * (size_t)e->vocab * sizeof(float));
    e->scratch = fy_malloc((size_t)e->vocab * sizeof(float));
    if (fy_logits_scratch_init(&e->lscratch, e->vocab) != FY_OK) goto nomem;
    if (fy_token_trie_from_tokenizer(tok, &e->trie) != FY_OK || fy_grammar_cache_create(64, &e->gcache) != FY_OK)
        goto nomem;
    e->gmask = fy_malloc(fy_token_trie_mask_words(e->trie) * sizeof(uint32_t));
    if (!e->gmask) goto nomem;
    e->dfwd = fy_calloc((size_t)n, sizeof(*e->dfwd));
    e->dreq = fy_calloc((size_t)n, sizeof(*e->dreq));
    e->dk = fy_calloc((size_t)n, sizeof(*e->dk));
    if (p->spec.draft) e->qprobs = fy_malloc((size_t)SPEC_QSLOTS * (size_t)K * (size_t)e->vocab * sizeof(float));
    if (!e->probs || !e->scratch || !e->dfwd || !e->dreq || !e->dk || (p->spec.draft && !e->qprobs)) goto nomem;
    if (p->spec.lookup == FY_SPEC_LOOKUP_SUFFIX && p->spec.history > 0 &&
        fy_spec_hist_create(p->spec.history, SPEC_HIST_TOKENS, &e->hist) != FY_OK)
        goto nomem;
    e->fwd = fy_calloc((size_t)n, sizeof(*e->fwd));
    e->fwd_req = fy_calloc((size_t)n, sizeof(*e->fwd_req));
    e->evict_cap = rp->max_ctx / rp->block_size + 1;
    e->evict_buf = fy_calloc((size_t)e->evict_cap, sizeof(int32_t));
    e->evict_cand = fy_calloc((size_t)e->evict_cap, sizeof(fy_evict_cand_t));
    if (!e->evict_buf || !e->evict_cand) goto nomem;
    e->running = fy_calloc((size_t)n, sizeof(*e->running));
    e->itl_ring = fy_calloc((size_t)w, sizeof(float));
    e->itl_scratch = fy_calloc((size_t)w, sizeof(float));
    if (!e->logits || !e->fwd || !e->fwd_req || !e->running || !e->itl_ring || !e->itl_scratch) goto nomem;
    if (fy_sampler_create(e->vocab, &e->sampler) != FY_OK) goto fail;
    *e_p = e;
    return FY_OK;
nomem:
    fy_error("engine: out of memory");
fail:
    fy_engine_destroy(e);
    return FY_ERR_NOMEM;
}

static void run_posts(fy_engine_t *e)
{
    pthread_mutex_lock(&e->mu);
    post_t *p = e->posts;
    e->posts = e->posts_tail = NULL;
    pthread_mutex_unlock(&e->mu);
    while (p) {
        post_t *next = p->next;
        p->fn(e, p->arg);
        fy_free(p);
        p = next;
    }
}

fy_status_t fy_engine_post(fy_engine_t *e, fy_engine_fn fn, void *arg)
{
    post_t *p = fy_malloc(sizeof(*p));
    if (!p) return FY_ERR_NOMEM;
    *p = (post_t){fn, arg, NULL};
    pthread_mutex_lock(&e->mu);
    if (e->dying) {
        pthread_mutex_unlock(&e->mu);
        fy_free(p);
        return FY_ERR_CANCELLED;
    }
    if (e->posts_tail)
        e->posts_tail->next = p;
    else
        e->posts = p;
    e->posts_tail = p;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return FY_OK;
}

void fy_engine_destroy(fy_engine_t *e)
{
    if (!e) return;
    fy_engine_stop(e);
    /* posted work still runs (it may owe someone a reply), then nothing
     * more is accepted */
    pthread_mutex_lock(&e->mu);
    e->dying = true;
    pthread_mutex_unlock(&e->mu);
    run_posts(e);
    /* whatever is left ends with an error, so nobody waits forever */
    pthread_mutex_lock(&e->mu);
    request_t *in = e->inbox;
    e->inbox = e->inbox_tail = NULL;
    pthread_mutex_unlock(&e->mu);
    while (in) {
        request_t *q = in;
        in = q->next;
        q->next = NULL;
        end_error(e, q, FY_ERR_CANCELLED, "engine shutting down");
    }
    while (e->n_running) end_error(e, e->running[e->n_running - 1], FY_ERR_CANCELLED, "engine shutting down");
    while (e->waiting) end_error(e, e->waiting, FY_ERR_CANCELLED, "engine shutting down");
    while (e->swapped) end_error(e, e->swapped, FY_ERR_CANCELLED, "engine shutting down");
    fy_sampler_destroy(e->sampler);
    fy_spec_hist_destroy(e->hist);
    fy_free(e->logits);
    fy_free(e->plp_lps);
    fy_free(e->plp_rank);
    fy_free(e->plp_ids);
    fy_free(e->plp_tlps);
    fy_free(e->fwd);
    fy_free(e->fwd_req);
    fy_free(e->evict_buf);
    fy_free(e->evict_cand);
    fy_free(e->running);
    fy_free(e->itl_ring);
    fy_free(e->itl_scratch);
    fy_free(e->cancels);
    fy_free(e->probs);
    fy_free(e->qprobs);
    fy_free(e->scratch);
    fy_logits_scratch_deinit(&e->lscratch);
    fy_free(e->gmask);
    fy_grammar_cache_destroy(e->gcache);
    fy_token_trie_destroy(e->trie);
    fy_free(e->dfwd);
    fy_free(e->dreq);
    fy_free(e->dk);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    fy_free(e);
}

/* ---- submit and cancel (any thread) ------------------------------------------------------------ */

static fy_status_t refuse(fy_engine_t *e, fy_status_t st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static _Thread_local char t_refusal[256]; /* fy_engine_refusal */

const char *fy_engine_refusal(void) { return t_refusal; }

static fy_status_t refuse(fy_engine_t *e, fy_status_t st, const char *fmt, ...)
{
    char *msg = t_refusal;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(t_refusal), fmt, ap);
    va_end(ap);
    fy_error("engine: %s", msg);
    pthread_mutex_lock(&e->mu);
    if (st == FY_ERR_OVERLOADED)
        e->st.refused_overloaded++;
    else
        e->st.refused_invalid++;
    pthread_mutex_unlock(&e->mu);
    return st;
}

/* Checks a request and builds it (not yet queued); NULL after refusing. */
static request_t *request_new(fy_engine_t *e, const int32_t *prompt, int32_t n_prompt, const fy_request_params_t *rp,
                              fy_event_fn cb, void *arg, bool init_bt, fy_status_t *st_p)
{
    if (!cb || n_prompt < 1) {
        *st_p = refuse(e, FY_ERR_INVALID, "a request needs a prompt and a callback");
        return NULL;
    }
    if (n_prompt >= e->max_ctx) {
        *st_p =
            refuse(e, FY_ERR_INVALID, "prompt of %d tokens leaves no room in the context of %d", n_prompt, e->max_ctx);
        return NULL;
    }
    for (int32_t i = 0; i < n_prompt; i++) {
        if (prompt[i] < 0 || prompt[i] >= e->vocab) {
            *st_p = refuse(e, FY_ERR_INVALID, "prompt token %d is %d, outside the vocabulary of %d", i, prompt[i],
                           e->vocab);
            return NULL;
        }
    }
    if (rp->max_tokens < 1) {
        *st_p = refuse(e, FY_ERR_INVALID, "max_tokens %d is below 1", rp->max_tokens);
        return NULL;
    }
    if (fy_sampling_params_check(&rp->sampling) != FY_OK) {
        *st_p = refuse(e, FY_ERR_INVALID, "bad sampling parameters (see above)");
        return NULL;
    }
    fy_logits_params_t lpv = rp->logits; /* a zeroed one: repetition penalty 0 means off too */
    if (lpv.repetition_penalty == 0) lpv.repetition_penalty = 1.0f;
    const fy_logits_params_t *lp = &lpv;
    if (lp->n_bias < 0 || lp->n_bias > FY_LOGITS_MAX_BIAS || lp->n_stop_ids < 0 ||
        lp->n_stop_ids > FY_LOGITS_MAX_STOP_IDS || rp->top_logprobs < 0 || rp->top_logprobs > FY_LOGITS_MAX_TOP ||
        lp->min_tokens < 0 || !(lp->repetition_penalty > 0)) {
        *st_p = refuse(e, FY_ERR_INVALID, "logits processing: %d biases, %d stop ids, %d alternatives, min_tokens %d",
                       lp->n_bias, lp->n_stop_ids, rp->top_logprobs, lp->min_tokens);
        return NULL;
    }
    int32_t n_bad_ids = 0;
    for (int32_t i = 0; i < lp->n_bad && lp->n_bad <= FY_LOGITS_MAX_BAD; i++) {
        if (lp->bad_lens[i] < 1 || n_bad_ids + lp->bad_lens[i] > FY_LOGITS_MAX_BAD_IDS) {
            n_bad_ids = -1;
            break;
        }
        n_bad_ids += lp->bad_lens[i];
    }
    if (lp->n_bad < 0 || lp->n_bad > FY_LOGITS_MAX_BAD || n_bad_ids < 0 || rp->prompt_top < 0 ||
        rp->prompt_top > FY_LOGITS_MAX_TOP) {
        *st_p = refuse(e, FY_ERR_INVALID, "%d bad words (at most %d, of %d tokens in all), %d prompt alternatives",
                       lp->n_bad, FY_LOGITS_MAX_BAD, FY_LOGITS_MAX_BAD_IDS, rp->prompt_top);
        return NULL;
    }
    for (int32_t i = 0; i < n_bad_ids; i++) {
        if (lp->bad_ids[i] < 0 || lp->bad_ids[i] >= e->vocab) {
            *st_p =
                refuse(e, FY_ERR_INVALID, "bad_words names token %d; the vocabulary has %d", lp->bad_ids[i], e->vocab);
            return NULL;
        }
    }
    for (int32_t i = 0; i < lp->n_bias + lp->n_stop_ids; i++) {
        int32_t t = i < lp->n_bias ? lp->bias_ids[i] : lp->stop_ids[i - lp->n_bias];
        if (t < 0 || t >= e->vocab) {
            *st_p = refuse(e, FY_ERR_INVALID, "%s names token %d; the vocabulary has %d",
                           i < lp->n_bias ? "logit_bias" : "stop_token_ids", t, e->vocab);
            return NULL;
        }
    }
    /* by default a sampled request speculates only where the deployment
     * says so (spec.h: its seed then no longer fixes its tokens under load);
     * processed logits and reported alternatives are per position, which a
     * verification step does not do: no speculation for them */
    fy_spec_method_t spec = rp->spec;
    if (spec == FY_SPEC_DEFAULT)
        spec = fy_sampling_is_greedy(&rp->sampling) || e->p.spec.sampled ? e->p.spec.method : FY_SPEC_NONE;
    if (fy_logits_active(lp) || rp->top_logprobs > 0 || rp->prompt_logprobs) spec = FY_SPEC_NONE;
    if (spec > FY_SPEC_DRAFT || (spec == FY_SPEC_DRAFT && !e->p.spec.draft)) {
        *st_p = refuse(e, FY_ERR_INVALID, "speculative decoding '%s' asked for; this engine has no draft model",
                       fy_spec_method_str(spec));
        return NULL;
    }
    int32_t max_tokens = rp->max_tokens < e->max_ctx - n_prompt ? rp->max_tokens : e->max_ctx - n_prompt;
    /* its KV budget: the engine's, or a smaller one it asks for */
    fy_evict_params_t evict;
    int32_t kv_cap;
    if (fy_engine_request_evict(e, rp->kv_budget, &evict, &kv_cap) != FY_OK) {
        *st_p = refuse(e, FY_ERR_INVALID, "kv_budget %d refused (see above)", rp->kv_budget);
        return NULL;
    }
    /* a request the cache could never hold would wait forever: refuse it */
    int32_t need = fy_kvm_blocks_for_capped(e->kvm, n_prompt, e->p.predict_output ? 1 : max_tokens, 0, kv_cap);
    /* (admission keeps the watermark free: a request needing more than the
     * rest was once queued and never admitted) */
    int32_t most = fy_kvm_capacity(e->kvm);
    if (need > most) {
        *st_p =
            refuse(e, FY_ERR_INVALID, "request needs %d kv blocks; the cache has %d, of which admission promises %d",
                   need, e->total_blocks, most);
        return NULL;
    }
    /* structured output: compiled once per source (the cache), a matcher per request */
    fy_gmatch_t *gm = NULL;
    if (rp->grammar_kind != FY_GEN_GRAMMAR_NONE) {
        char err[FY_GRAMMAR_ERR_LEN] = "";
        fy_grammar_t *g = NULL;
        fy_grammar_kind_t kind;
        bool hit = false;
        fy_status_t gst = !fy_grammar_kind_of_gen(rp->grammar_kind, &kind) || rp->grammar_len < 0
                              ? FY_ERR_INVALID
                              : fy_grammar_cache_get(e->gcache, kind, rp->grammar ? rp->grammar : "",
                                                     (size_t)rp->grammar_len, &g, &hit, err, sizeof(err));
        if (!gst) gst = fy_gmatch_create(g, &gm);
        fy_grammar_unref(g);
        if (gst) {
            *st_p = refuse(e, gst == FY_ERR_NOMEM ? FY_ERR_NOMEM : FY_ERR_INVALID, "response_format (%s): %s",
                           fy_gen_grammar_str(rp->grammar_kind), err[0] ? err : fy_status_str(gst));
            return NULL;
        }
        pthread_mutex_lock(&e->mu);
        e->st.grammar_compiles += !hit;
        e->st.grammar_cache_hits += hit;
        pthread_mutex_unlock(&e->mu);
    }
    request_t *q = fy_calloc(1, sizeof(*q));
    if (!q) {
        fy_gmatch_destroy(gm);
        *st_p = refuse(e, FY_ERR_NOMEM, "out of memory for a request");
        return NULL;
    }
    q->gm = gm;
    q->cap = n_prompt + max_tokens;
    q->tokens = fy_malloc((size_t)q->cap * sizeof(int32_t));
    q->itl = fy_malloc((size_t)max_tokens * sizeof(float));
    q->evict = evict;
    q->kv_cap = kv_cap;
    if (evict.policy == FY_EVICT_H2O) q->scores = fy_calloc((size_t)(q->cap / e->block_size + 1), sizeof(float));
    fy_status_t st = FY_ERR_NOMEM;
    q->lp = *lp;
    q->lp.stop_ids = q->stop_ids;
    if (lp->n_stop_ids) memcpy(q->stop_ids, lp->stop_ids, (size_t)lp->n_stop_ids * sizeof(int32_t));
    if (lp->n_bias) {
        q->bias_ids = fy_malloc((size_t)lp->n_bias * sizeof(int32_t));
        q->bias = fy_malloc((size_t)lp->n_bias * sizeof(float));
        if (q->bias_ids) memcpy(q->bias_ids, lp->bias_ids, (size_t)lp->n_bias * sizeof(int32_t));
        if (q->bias) memcpy(q->bias, lp->bias, (size_t)lp->n_bias * sizeof(float));
    }
    q->lp.bias_ids = q->bias_ids;
    q->lp.bias = q->bias;
    if (lp->n_bad) {
        memcpy(q->bad_lens, lp->bad_lens, (size_t)lp->n_bad * sizeof(int32_t));
        memcpy(q->bad_ids, lp->bad_ids, (size_t)n_bad_ids * sizeof(int32_t));
    }
    q->lp.bad_lens = q->bad_lens;
    q->lp.bad_ids = q->bad_ids;
    q->plp = rp->prompt_logprobs;
    q->plp_top = rp->prompt_top < e->vocab ? rp->prompt_top : e->vocab;
    q->lp_on = fy_logits_active(lp);
    q->top_logprobs = rp->top_logprobs;
    q->defer_stops = rp->defer_stops;
    if (!q->tokens || !q->itl || (evict.policy == FY_EVICT_H2O && !q->scores) ||
        (lp->n_bias && (!q->bias_ids || !q->bias)) ||
        (init_bt && (st = fy_kvm_seq_init(e->kvm, &q->bt, q->cap, &rp->ns))) ||
        (st = fy_stopper_init(&q->stopper, rp->stop, rp->n_stop, FY_DETOK_MAX_OUT))) {
        request_free(q);
        *st_p = refuse(e, st, "cannot set up the request: %s", fy_status_str(st));
        return NULL;
    }
    memcpy(q->tokens, prompt, (size_t)n_prompt * sizeof(int32_t));
    q->n_prompt = q->n_total = n_prompt;
    q->max_tokens = max_tokens;
    q->sampling = rp->sampling;
    q->ignore_eos = rp->ignore_eos;
    q->logprobs = rp->logprobs;
    q->progress = rp->progress;
    q->priority = rp->priority;
    q->cb = cb;
    q->cb_arg = arg;
    fy_rng_seed(&q->rng, rp->sampling.seed);
    q->spec = spec;
    fy_spec_ctl_init(&q->ctl, &e->p.spec);
    q->est = e->west;
    q->qslot = -1;
    /* the draft's draws must not move the request's own generator */
    fy_rng_seed(&q->drng, rp->sampling.seed ^ 0x5bd1e9955bd1e995ull);
    fy_detok_init(&q->detok, e->tok, false);
    q->t_submit = fy_now_s();
    q->state = RQ_INBOX;
    *st_p = FY_OK;
    return q;
}

fy_status_t fy_engine_request_evict(const fy_engine_t *e, int32_t kv_budget, fy_evict_params_t *ev_p, int32_t *cap_p)
{
    fy_evict_params_t ev = e->p.evict;
    if (kv_budget && fy_evict_for_budget(&e->p.evict, kv_budget, &ev) != FY_OK) return FY_ERR_INVALID;
    *ev_p = ev;
    *cap_p = fy_evict_max_blocks(&ev, e->block_size, e->p.max_num_batched_tokens);
    return FY_OK;
}

fy_status_t fy_engine_submit(fy_engine_t *e, const int32_t *prompt, int32_t n_prompt, const fy_request_params_t *rp,
                             fy_event_fn cb, void *arg, uint64_t *id_p)
{
    fy_status_t st;
    request_t *q = request_new(e, prompt, n_prompt, rp, cb, arg, true, &st);
    if (!q) return st;
    pthread_mutex_lock(&e->mu);
    if (e->queued >= e->p.max_waiting) {
        e->st.refused_overloaded++;
        pthread_mutex_unlock(&e->mu);
        request_free(q);
        fy_warn("engine: overloaded: %d requests waiting; request refused", e->p.max_waiting);
        return FY_ERR_OVERLOADED;
    }
    uint64_t id = q->id = e->next_id++;
    q->seq = e->next_seq++;
    if (e->inbox_tail)
        e->inbox_tail->next = q;
    else
        e->inbox = q;
    e->inbox_tail = q;
    e->queued++;
    e->st.submitted++;
    e->st.prompt_tokens += (uint64_t)n_prompt;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    /* q belongs to the engine thread now, which may already have freed it */
    if (id_p) *id_p = id;
    return FY_OK;
}

void fy_engine_cancel(fy_engine_t *e, uint64_t id)
{
    pthread_mutex_lock(&e->mu);
    if (e->n_cancels == e->cap_cancels) {
        int32_t cap = e->cap_cancels ? 2 * e->cap_cancels : 16;
        uint64_t *c = fy_realloc(e->cancels, (size_t)cap * sizeof(uint64_t));
        if (!c) { /* the request runs to its end instead; nothing leaks */
            pthread_mutex_unlock(&e->mu);
            fy_warn("engine: out of memory queueing a cancel of request %llu", (unsigned long long)id);
            return;
        }
        e->cancels = c;
        e->cap_cancels = cap;
    }
    e->cancels[e->n_cancels++] = id;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

/* ---- the step --------------------------------------------------------------------------------- */

static request_t *find_request(fy_engine_t *e, uint64_t id)
{
    for (int32_t i = 0; i < e->n_running; i++)
        if (e->running[i]->id == id) return e->running[i];
    for (request_t *q = e->waiting; q; q = q->next)
        if (q->id == id) return q;
    for (request_t *q = e->swapped; q; q = q->next)
        if (q->id == id) return q;
    return NULL;
}

/* Moves what other threads handed in into the queues. */
static void take_inbox(fy_engine_t *e)
{
    pthread_mutex_lock(&e->mu);
    request_t *in = e->inbox;
    e->inbox = e->inbox_tail = NULL;
    int32_t nc = e->n_cancels;
    uint64_t cancels[64];
    int32_t take = nc < 64 ? nc : 64; /* the rest wait for the next step */
    if (take) {
        memcpy(cancels, e->cancels, (size_t)take * sizeof(uint64_t));
        memmove(e->cancels, e->cancels + take, (size_t)(nc - take) * sizeof(uint64_t));
    }
    e->n_cancels = nc - take;
    pthread_mutex_unlock(&e->mu);
    while (in) {
        request_t *q = in;
        in = q->next;
        q->next = NULL;
        q->state = RQ_WAITING;
        list_insert(&e->waiting, q);
        e->n_waiting++;
    }
    for (int32_t i = 0; i < take; i++) {
        request_t *q = find_request(e, cancels[i]);
        if (q) end_error(e, q, FY_ERR_CANCELLED, "cancelled");
    }
}

static int cmp_running(const void *a, const void *b)
{
    const request_t *x = *(request_t *const *)a, *y = *(request_t *const *)b;
    return before(x, y) ? -1 : before(y, x) ? 1 : 0;
}

/* Output tokens admission plans for: max_tokens, or a quantile of recent
 * output lengths when prediction is on (never more than max_tokens). */
static int32_t planned_output(const fy_engine_t *e, const request_t *q)
{
    int32_t left = q->max_tokens - q->n_generated;
    if (!e->p.predict_output || e->out_n < 8) return left;
    int32_t s[OUTPUT_RING];
    memcpy(s, e->out_ring, (size_t)e->out_n * sizeof(int32_t));
    for (int32_t i = 1; i < e->out_n; i++) /* insertion sort: at most 128 */
        for (int32_t j = i; j > 0 && s[j - 1] > s[j]; j--) {
            int32_t t = s[j];
            s[j] = s[j - 1];
            s[j - 1] = t;
        }
    int32_t k = (int32_t)ceil(e->p.predict_quantile * e->out_n) - 1;
    int32_t pred = s[k < 0 ? 0 : k] - q->n_generated;
    if (pred < 1) pred = 1;
    return pred < left ? pred : left;
}

/* Blocks a request's promise must cover from here: its known tokens and
 * the output it plans for, less the full blocks it already holds. */
static int32_t blocks_needed(const fy_engine_t *e, const request_t *q)
{
    return fy_kvm_blocks_for_capped(e->kvm, q->n_total, planned_output(e, q), q->n_computed, q->kv_cap);
}

/* A request past its KV budget drops the blocks its policy does not keep
 * (after a commit: the blocks it names are the full prefix's). */
static void kv_evict(fy_engine_t *e, request_t *q)
{
    if (q->evict.policy == FY_EVICT_NONE) return;
    int32_t n = fy_evict_choose(&q->evict, &q->bt, q->scores, e->evict_buf, e->evict_cand, e->evict_cap);
    if (n > 0) (void)fy_kvm_seq_evict(e->kvm, &q->bt, e->evict_buf, n, &q->resv); /* refusal: logged, a bug */
}

static void preempt(fy_engine_t *e, request_t *q)
{
    unlink_request(e, q); /* from running */
    fy_kvm_resv_release(e->kvm, &q->resv);
    draft_drop(e, q);
    q->timings.n_preempted++;
    if (e->p.preempt == FY_PREEMPT_SWAP && fy_kvm_seq_swap_out(e->kvm, &q->bt) == FY_OK) {
        q->state = RQ_SWAPPED;
        list_insert(&e->swapped, q);
        e->n_swapped++;
        e->st.preemptions_swap++;
        return;
    }
    /* recompute: the full blocks stay in the prefix cache for the retry */
    fy_kvm_seq_release(e->kvm, &q->bt);
    q->n_computed = 0;
    q->looked_up = false;
    q->state = RQ_WAITING;
    list_insert(&e->waiting, q);
    e->n_waiting++;
    pthread_mutex_lock(&e->mu);
    e->queued++;
    pthread_mutex_unlock(&e->mu);
    e->st.preemptions_recompute++;
}

/* Schedules k tokens of running request i, preempting from the end of the
 * running set (lowest priority, latest) until its blocks fit.  Returns
 * false when the request itself left the running set. */
static bool schedule(fy_engine_t *e, int32_t i, int32_t k)
{
    request_t *q = e->running[i];
    for (;;) {
        fy_status_t st = fy_kvm_seq_reserve(e->kvm, &q->bt, q->n_computed + k, &q->resv);
        if (st == FY_OK) break;
        if (st != FY_ERR_NO_SPACE) { /* a bug, not a shortage: end the request, keep serving */
            end_error(e, q, st, "kv cache reservation failed");
            return false;
        }
        request_t *victim = e->running[e->n_running - 1];
        if (victim == q && e->n_running == 1) {
            /* alone and still out of blocks: it would come back forever */
            end_error(e, q, FY_ERR_NO_SPACE, "the kv cache cannot hold this request");
            return false;
        }
        preempt(e, victim);
        if (victim == q) return false;
    }
    q->sched = k;
    if (q->t_sched == 0) q->t_sched = fy_now_s();
    return true;
}

/* Swapped-out requests come back first, while their promise fits. */
static void admit_swapped(fy_engine_t *e)
{
    while (e->swapped && e->n_running < e->p.max_num_seqs) {
        request_t *q = e->swapped;
        /* a budgeted request's promise is capped as at its admission: its
         * whole length might never fit again */
        if (fy_kvm_admit(e->kvm, fy_kvm_blocks_for_capped(e->kvm, q->n_total, planned_output(e, q), 0, q->kv_cap),
                         &q->resv) != FY_OK)
            return;
        if (fy_kvm_seq_swap_in(e->kvm, &q->bt, &q->resv) != FY_OK) {
            fy_kvm_resv_release(e->kvm, &q->resv);
            return;
        }
        list_remove(&e->swapped, q);
        e->n_swapped--;
        q->state = RQ_RUNNING;
        e->running[e->n_running++] = q;
    }
}

/* Whether q's next chunk is prompt rows whose logprobs it reports (every
 * row of the chunk wants logits). */
static bool plp_rows(const request_t *q) { return q->plp && !q->plp_done && q->n_computed < q->n_prompt; }

/* Admits waiting requests while their promise, a first chunk and its
 * logit rows fit, and schedules that chunk. */
static void admit_waiting(fy_engine_t *e, int32_t *budget, int32_t *prefill_left, int32_t *rows_left)
{
    while (e->waiting && e->n_running<e->p.max_num_seqs && * budget> 0 && *prefill_left > 0 && *rows_left > 0) {
        request_t *q = e->waiting;
        if (!q->looked_up) {
            int32_t hit = 0;
            /* prompt logprobs need every prompt row's logits: no cached prefix */
            if ((!q->plp || q->plp_done) && fy_kvm_seq_lookup(e->kvm, &q->bt, q->tokens, q->n_total, &hit) != FY_OK) {
                end_error(e, q, FY_ERR_INTERNAL, "prefix lookup failed");
                continue;
            }
            q->n_computed = hit;
            if (q->timings.n_preempted == 0) q->timings.n_cached = hit;
            q->looked_up = true;
        }
        if (fy_kvm_admit(e->kvm, blocks_needed(e, q), &q->resv) != FY_OK) {
            /* let the prefix go back to the cache while it waits */
            fy_kvm_seq_release(e->kvm, &q->bt);
            q->n_computed = 0;
            q->looked_up = false;
            return;
        }
        list_remove(&e->waiting, q);
        e->n_waiting--;
        pthread_mutex_lock(&e->mu);
        e->queued--;
        pthread_mutex_unlock(&e->mu);
        q->state = RQ_RUNNING;
        e->running[e->n_running++] = q;
        int32_t k = q->n_total - q->n_computed;
        if (k > *budget) k = *budget;
        if (k > 1 && k > *prefill_left) k = *prefill_left;
        if (plp_rows(q) && k > *rows_left) k = *rows_left;
        if (schedule(e, e->n_running - 1, k)) {
            *budget -= k;
            *rows_left -= plp_rows(q) ? k : 1;
            if (q->n_total - q->n_computed > 1) *prefill_left -= k;
        }
    }
}

static void guardrail(fy_engine_t *e, float itl)
{
    if (e->p.itl_target_s <= 0) return;
    int32_t w = e->p.itl_window;
    e->itl_ring[e->itl_pos] = itl;
    e->itl_pos = (e->itl_pos + 1) % w;
    if (e->itl_n < w) e->itl_n++;
    e->itl_since_change++;
}

static double itl_p95(fy_engine_t *e)
{
    if (e->itl_n == 0) return 0.0;
    memcpy(e->itl_scratch, e->itl_ring, (size_t)e->itl_n * sizeof(float));
    int32_t n = e->itl_n, k = (int32_t)ceil(0.95 * n) - 1;
    /* quickselect for the k-th smallest */
    float *a = e->itl_scratch;
    int32_t lo = 0, hi = n - 1;
    while (lo < hi) {
        float pivot = a[(lo + hi) / 2];
        int32_t i = lo, j = hi;
        while (i <= j) {
            while (a[i] < pivot) i++;
            while (a[j] > pivot) j--;
            if (i <= j) {
                float t = a[i];
                a[i++] = a[j];
                a[j--] = t;
            }
        }
        if (k <= j)
            hi = j;
        else if (k >= i)
            lo = i;
        else
            break;
    }
    return a[k];
}

/* Halve the prompt tokens a step may take when p95 inter-token latency is
 * over target; give back a sixteenth at a time when it is comfortably
 * under.  Changes wait for a quarter window of fresh samples. */
static void adjust_budget(fy_engine_t *e)
{
    if (e->p.itl_target_s <= 0 || e->itl_since_change < e->p.itl_window / 4) return;
    double p95 = itl_p95(e);
    e->st.itl_p95_s = p95;
    int32_t max = e->p.max_num_batched_tokens, b = e->prefill_budget;
    if (p95 > e->p.itl_target_s && b > e->p.min_prefill_budget) {
        b = b / 2 > e->p.min_prefill_budget ? b / 2 : e->p.min_prefill_budget;
    } else if (p95 < 0.8 * e->p.itl_target_s && b < max) {
        b += max / 16 > 1 ? max / 16 : 1;
        if (b > max) b = max;
    } else {
        return;
    }
    fy_debug("engine: p95 inter-token latency %.1f ms; prompt tokens per step %d -> %d", p95 * 1e3, e->prefill_budget,
             b);
    e->prefill_budget = b;
    e->itl_since_change = 0;
}

/* Structured output: the tokens q's grammar does not allow next (and any
 * logit past the tokenizer's vocabulary) cannot be drawn from row lg. */
static fy_status_t grammar_mask(fy_engine_t *e, request_t *q, float *lg)
{
    fy_status_t st = fy_gmatch_mask(q->gm, e->trie, e->gmask);
    if (st != FY_OK) return st;
    int32_t n = fy_token_trie_n_vocab(e->trie);
    for (int32_t w = 0; w * 32 < n; w++) {
        uint32_t m = e->gmask[w];
        if (m == UINT32_MAX) continue;
        for (int32_t b = 0; b < 32 && w * 32 + b < n; b++)
            if (!(m >> b & 1u)) lg[w * 32 + b] = FY_LOGPROB_MIN;
    }
    for (int32_t i = n; i < e->vocab; i++) lg[i] = FY_LOGPROB_MIN;
    return FY_OK;
}

/* A token was sampled for q: stream it (with n_top alternatives), and
 * end q if it is done (then false: q is gone). */
static bool on_token_top(fy_engine_t *e, request_t *q, int32_t tok, float logprob, const int32_t *top_ids,
                         const float *top_lps, int32_t n_top, double t)
{
    if (q->t_first == 0) {
        q->t_first = t;
    } else {
        float itl = (float)(t - q->t_last);
        if (q->timings.n_itl < q->max_tokens) q->itl[q->timings.n_itl++] = itl;
        guardrail(e, itl);
    }
    q->t_last = t;
    /* structured output: the token moves the grammar on (it was drawn
     * from its mask; an adopted first token is checked here) */
    if (q->gm && fy_gmatch_accept_token(q->gm, e->trie, tok) != FY_OK) {
        end_error(e, q, FY_ERR_INVALID, "a token the structured output does not allow");
        return false;
    }
    if (q->gm && fy_gmatch_is_ended(q->gm) && !q->defer_stops) { /* its end token, whatever ignore_eos says */
        end_request(e, q, FY_EVENT_FINISH, FY_FINISH_EOS, FY_OK, NULL);
        return false;
    }
    /* min_tokens: nothing ends it earlier (the logits banned the end
     * tokens; stop strings are not looked for: vLLM's rule) */
    bool may_stop = q->n_generated >= q->lp.min_tokens;
    if (!q->ignore_eos && may_stop && fy_tokenizer_is_eog(e->tok, tok)) {
        end_request(e, q, FY_EVENT_FINISH, FY_FINISH_EOS, FY_OK, NULL);
        return false;
    }
    for (int32_t i = 0; i < q->lp.n_stop_ids && may_stop && !q->defer_stops; i++)
        if (tok == q->lp.stop_ids[i]) { /* like an end token: not part of the text */
            end_request(e, q, FY_EVENT_FINISH, FY_FINISH_STOP, FY_OK, NULL);
            return false;
        }
    q->tokens[q->n_total++] = tok;
    q->n_generated++;
    e->st.generation_tokens++;
    char piece[FY_DETOK_MAX_OUT];
    size_t n = fy_detok_push(&q->detok, tok, piece, sizeof(piece));
    q->n_out = 0;
    bool stopped = false;
    if (may_stop) {
        stopped = fy_stopper_feed(&q->stopper, piece, n, emit_text, q);
    } else {
        fy_stopper_flush(&q->stopper, emit_text, q);
        emit_text(q, piece, n);
    }
    fy_event_t ev = {.kind = FY_EVENT_TOKEN,
                     .id = q->id,
                     .token = tok,
                     .logprob = logprob,
                     .text = q->out,
                     .len = q->n_out,
                     .rng = &q->rng,
                     .top_ids = top_ids,
                     .top_logprobs = top_lps,
                     .n_top = n_top};
    q->cb(q->cb_arg, &ev);
    if (stopped)
        end_request(e, q, FY_EVENT_FINISH, FY_FINISH_STOP, FY_OK, NULL);
    else if (q->n_generated >= q->max_tokens)
        end_request(e, q, FY_EVENT_FINISH, FY_FINISH_LENGTH, FY_OK, NULL);
    else if (q->n_total >= e->max_ctx)
        end_request(e, q, FY_EVENT_FINISH, FY_FINISH_CONTEXT, FY_OK, NULL);
    else
        return true;
    return false;
}

static bool on_token(fy_engine_t *e, request_t *q, int32_t tok, float logprob, double t)
{
    return on_token_top(e, q, tok, logprob, NULL, NULL, 0, t);
}

/* ---- speculative decoding ------------------------------------------------------------------------- */

/* Gives back the target blocks reserved for proposals beyond the first m
 * (all of them at m = 0 ... the decode token's stay). */
static void spec_shrink(fy_engine_t *e, request_t *q, int32_t m)
{
    q->spec_drawn -= fy_kvm_seq_rollback(e->kvm, &q->bt, q->n_computed + 1 + m, &q->resv, q->spec_drawn);
    q->spec_k = m;
    q->sched = 1 + m;
    if (q->dbt.blocks) fy_kvm_seq_truncate(e->p.spec.draft_kvm, &q->dbt, q->d_computed);
}

/* Picks the draft's token from one row of draft logits: its argmax for a
 * greedy request, else a draw from its distribution (kept for the
 * verification in the request's slot). */
static int32_t draft_pick(fy_engine_t *e, request_t *q, const float *lg, int32_t j)
{
    if (q->qslot < 0) return fy_argmax(lg, e->vocab);
    float *qp = e->qprobs + ((size_t)q->qslot * (size_t)e->p.spec.k_max + (size_t)j) * (size_t)e->vocab;
    fy_sampler_probs(e->sampler, &q->sampling, lg, qp);
    double r = fy_rng_uniform(&q->drng), acc = 0.0;
    int32_t pick = -1;
    for (int32_t v = 0; v < e->vocab; v++) {
        if (qp[v] <= 0.0f) continue;
        pick = v;
        acc += qp[v];
        if (r < acc) break;
    }
    return pick;
}

/*
 * Runs the draft model for the n requests in e->dreq, each wanting
 * e->dk[i] tokens: first the tokens its draft KV lacks (the whole text
 * the first time, then what the last verification accepted, in chunks
 * that fit the draft's batch), whose last logits give the first
 * proposal, then one token a pass.  Proposals land at tokens[n_total ..].
 * A request whose draft KV cannot grow, or whose pass fails, proposes
 * nothing.
 */
static void draft_propose(fy_engine_t *e, int32_t n)
{
    fy_runner_t *dr = e->p.spec.draft;
    fy_kvm_t *dk = e->p.spec.draft_kvm;
    const fy_runner_params_t *dp = fy_runner_params(dr);
    int32_t max_k = 0;
    for (int32_t i = 0; i < n; i++) {
        request_t *q = e->dreq[i];
        /* KV for the text, then for proposals 1 .. k-1 */
        if (!q->dbt.blocks && fy_kvm_seq_init(dk, &q->dbt, q->cap, NULL) != FY_OK) {
            e->dk[i] = 0;
            continue;
        }
        if (fy_kvm_seq_reserve(dk, &q->dbt, q->n_total + e->dk[i] - 1, NULL) != FY_OK) {
            draft_drop(e, q); /* the draft pool is full: start over later */
            e->dk[i] = 0;
            continue;
        }
        if (e->dk[i] > max_k) max_k = e->dk[i];
    }
    /* catch up: the first proposal comes from the last known token */
    for (;;) {
        int32_t nf = 0, tokens = 0;
        for (int32_t i = 0; i < n && nf < dp->max_seqs; i++) {
            request_t *q = e->dreq[i];
            if (e->dk[i] <= 0 || q->d_computed >= q->n_total) continue;
            int32_t rem = q->n_total - q->d_computed, take = rem;
            if (take > dp->max_batch_tokens - tokens) take = dp->max_batch_tokens - tokens;
            if (take <= 0) break;
            e->fwd_req[nf] = q;
            e->dfwd[nf++] = (fy_forward_seq_t){.bt = &q->dbt,
                                               .tokens = q->tokens + q->d_computed,
                                               .n_tokens = take,
                                               .pos = q->d_computed,
                                               .n_logits = take == rem ? 1 : 0};
            tokens += take;
        }
        if (nf == 0) break;
        if (fy_runner_forward(dr, e->dfwd, nf, e->logits) != FY_OK) {
            for (int32_t i = 0; i < n; i++) {
                if (e->dk[i] > 0) draft_drop(e, e->dreq[i]);
                e->dk[i] = 0;
            }
            return;
        }
        int32_t row = 0;
        for (int32_t f = 0; f < nf; f++) {
            request_t *q = e->fwd_req[f];
            q->d_computed += e->dfwd[f].n_tokens;
            fy_kvm_seq_commit(dk, &q->dbt, q->tokens, q->d_computed, NULL);
            if (e->dfwd[f].n_logits)
                q->tokens[q->n_total] = draft_pick(e, q, e->logits + (size_t)row++ * (size_t)e->vocab, 0);
        }
    }
    /* then one token a pass: proposal j feeds proposal j + 1 */
    for (int32_t j = 1; j < max_k; j++) {
        int32_t nf = 0;
        for (int32_t i = 0; i < n; i++) {
            request_t *q = e->dreq[i];
            if (e->dk[i] <= j) continue;
            int32_t pos = q->n_total + j - 1;
            e->fwd_req[nf] = q;
            e->dfwd[nf++] =
                (fy_forward_seq_t){.bt = &q->dbt, .tokens = q->tokens + pos, .n_tokens = 1, .pos = pos, .n_logits = 1};
        }
        if (nf == 0) break;
        double td = fy_now_s();
        fy_status_t st = fy_runner_forward(dr, e->dfwd, nf, e->logits);
        td = fy_now_s() - td;
        e->dcost = e->dcost > 0 ? e->dcost + 0.2 * (td - e->dcost) : td;
        if (st != FY_OK) {
            /* keep what was proposed so far */
            for (int32_t i = 0; i < n; i++)
                if (e->dk[i] > j) e->dk[i] = j;
            break;
        }
        for (int32_t f = 0; f < nf; f++) {
            request_t *q = e->fwd_req[f];
            q->d_computed = q->n_total + j;
            fy_kvm_seq_commit(dk, &q->dbt, q->tokens, q->d_computed, NULL);
            q->tokens[q->n_total + j] = draft_pick(e, q, e->logits + (size_t)f * (size_t)e->vocab, j);
        }
    }
}

/* Seconds a forward pass of n tokens takes, from the passes measured so
 * far (moving averages per token count); a count not seen yet is scaled
 * from the nearest one seen by a prior in which each token adds a quarter
 * of a one-token pass (measured at batch 1 on a 2-vCPU Zen 5). */
static double prior_cost(int32_t n) { return 1.0 + 0.25 * (n - 1); }

static double step_cost(const fy_engine_t *e, int32_t n)
{
    if (n < 1) n = 1;
    if (n < COST_N && e->cost_n[n]) return e->cost[n];
    int32_t top = n < COST_N ? n : COST_N - 1;
    for (int32_t a = top; a >= 1; a--)
        if (e->cost_n[a]) return e->cost[a] * prior_cost(n) / prior_cost(a);
    for (int32_t b = top; b < COST_N; b++)
        if (e->cost_n[b]) return e->cost[b] * prior_cost(n) / prior_cost(b);
    return prior_cost(n) * 1e-3;
}

static void cost_note(fy_engine_t *e, int32_t n, double s)
{
    if (n < 1 || n >= COST_N) return;
    e->cost[n] = e->cost_n[n] ? e->cost[n] + 0.2 * (s - e->cost[n]) : s;
    if (e->cost_n[n] < UINT32_MAX) e->cost_n[n]++;
}

/* The request's proposals come from the suffix lookup (sized by its own
 * confidence), not issue 8's n-gram lookup or a draft. */
static bool suffix_lookup(const fy_engine_t *e, const request_t *q)
{
    return q->spec == FY_SPEC_NGRAM && e->p.spec.lookup == FY_SPEC_LOOKUP_SUFFIX;
}

/*
 * After scheduling: gives decoding requests that speculate their
 * proposals.  Tokens are handed out one at a time, each to the request
 * most likely to have it accepted (its acceptance rate to the power of
 * its next position), while the expected tokens the step emits per
 * second of its (measured) cost still grow: cheap while a step is
 * bandwidth-bound, not at all once the batch makes it compute-bound, so
 * speculation backs off by itself.  Also bounded by the step's token
 * budget, its logit rows and batch_tokens.  Each request's extra blocks
 * come from its own promise; one that cannot get them just decodes.
 * Never preempts.
 */
static void spec_plan(fy_engine_t *e, int32_t budget)
{
    const fy_spec_params_t *sp = &e->p.spec;
    for (int32_t i = 0; i < e->n_running; i++) e->running[i]->spec_k = 0;
    if (fy_spec_ctl_want(&e->wctl) == 0) return; /* the worker's speculation is off for now */
    double t0 = fy_now_s();
    int32_t rows = 0, tokens = 0;
    for (int32_t i = 0; i < e->n_running; i++) {
        request_t *q = e->running[i];
        if (q->sched <= 0) continue;
        tokens += q->sched;
        rows += plp_rows(q) ? q->sched : q->n_computed + q->sched == q->n_total;
    }
    int32_t spare = e->logit_rows - rows;
    if (spare > budget) spare = budget;
    if (sp->batch_tokens > 0 && spare > sp->batch_tokens - tokens) spare = sp->batch_tokens - tokens;
    /* candidates and how many tokens each could take */
    int32_t nc = 0, slots = 0;
    for (int32_t i = 0; i < e->n_running && spare > 0 && nc < 64; i++) {
        request_t *q = e->running[i];
        if (q->spec == FY_SPEC_NONE || q->sched != 1 || q->n_total - q->n_computed != 1) continue;
        int32_t k = fy_spec_ctl_want(&q->ctl);
        if (k > q->max_tokens - q->n_generated - 1) k = q->max_tokens - q->n_generated - 1;
        if (k > e->max_ctx - q->n_total) k = e->max_ctx - q->n_total;
        if (k <= 0) continue;
        if (q->spec == FY_SPEC_NGRAM && sp->lookup == FY_SPEC_LOOKUP_SUFFIX) {
            /* sized by its own confidence, not the controller's k */
            fy_spec_text_t src[SPEC_HIST_MAX];
            float freq[FY_SPEC_MAX_K];
            int32_t ns = e->hist ? fy_spec_hist_texts(e->hist, &q->bt.ns, src, SPEC_HIST_MAX) : 0;
            int32_t kk =
                sp->k_max < q->max_tokens - q->n_generated - 1 ? sp->k_max : q->max_tokens - q->n_generated - 1;
            if (kk > e->max_ctx - q->n_total) kk = e->max_ctx - q->n_total;
            k = fy_spec_suffix_propose(q->tokens, q->n_total, src, ns, kk, q->tokens + q->n_total, freq, &q->spec_match,
                                       &q->spec_own);
            if (k == 0) continue;
            fy_spec_est_gains(&q->est, q->spec_match, q->spec_own, freq, k, q->spec_gain);
        } else if (q->spec == FY_SPEC_NGRAM) {
            k = fy_spec_ngram_propose(q->tokens, q->n_total, sp->ngram_max, k, q->tokens + q->n_total);
            if (k == 0) continue;
        } else {
            q->qslot = -1;
            if (!fy_sampling_is_greedy(&q->sampling)) {
                if (slots == SPEC_QSLOTS) continue;
                q->qslot = slots++;
            }
        }
        e->dreq[nc] = q;
        e->dk[nc] = k; /* the most it may take */
        q->spec_k = 0;
        nc++;
    }
    /* hand out tokens while they pay */
    double G = rows, g_next[64];
    int32_t draft_k = 0;
    double dcost = e->dcost > 0 ? e->dcost : 0.5 * step_cost(e, 1);
    for (int32_t c = 0; c < nc; c++) {
        double a = suffix_lookup(e, e->dreq[c]) ? e->dreq[c]->spec_gain[0] : e->dreq[c]->ctl.rate;
        g_next[c] = a < 0.02 ? 0.02 : a > 0.98 ? 0.98 : a;
    }
    for (int32_t T = tokens; spare > 0;) {
        int32_t best = -1;
        for (int32_t c = 0; c < nc; c++)
            if (e->dreq[c]->spec_k < e->dk[c] && (best < 0 || g_next[c] > g_next[best])) best = c;
        if (best < 0) break;
        request_t *q = e->dreq[best];
        bool draft = q->spec == FY_SPEC_DRAFT;
        double before = step_cost(e, T) + dcost * draft_k;
        double after = step_cost(e, T + 1) + dcost * (draft && q->spec_k + 1 > draft_k ? q->spec_k + 1 : draft_k);
        double g = g_next[best];
        if (sp->cost_aware && (G + g) * before <= G * after) break;
        q->spec_k++;
        if (draft && q->spec_k > draft_k) draft_k = q->spec_k;
        G += g;
        T++;
        spare--;
        if (suffix_lookup(e, q)) {
            if (q->spec_k < e->dk[best]) g_next[best] = q->spec_gain[q->spec_k];
        } else {
            double a = q->ctl.rate < 0.02 ? 0.02 : q->ctl.rate > 0.98 ? 0.98 : q->ctl.rate;
            g_next[best] *= a;
        }
    }
    /* blocks for the proposals; the draft runs for those that use one */
    int32_t nd = 0;
    for (int32_t c = 0; c < nc; c++) {
        request_t *q = e->dreq[c];
        int32_t m = q->spec_k;
        q->spec_k = 0;
        if (m == 0) continue;
        int32_t before = q->resv.blocks;
        if (fy_kvm_seq_reserve(e->kvm, &q->bt, q->n_computed + 1 + m, &q->resv) != FY_OK) continue;
        q->spec_drawn = before - q->resv.blocks;
        q->spec_k = m;
        q->sched = 1 + m;
        if (q->spec == FY_SPEC_DRAFT) {
            e->dreq[nd] = q;
            e->dk[nd++] = m;
        }
    }
    if (nd > 0) {
        draft_propose(e, nd);
        for (int32_t i = 0; i < nd; i++)
            if (e->dk[i] < e->dreq[i]->spec_k) spec_shrink(e, e->dreq[i], e->dk[i]);
    }
    e->st.propose_s += fy_now_s() - t0;
}

/*
 * Verifies q's proposals against the target's k + 1 rows of logits,
 * keeps the K/V of the accepted ones (rolling back the rest in both
 * caches), adapts, and streams the accepted tokens and the one the target
 * gives after them.  Greedy: the proposals are kept while they equal the
 * argmax, so the text is the target's own.  Sampled: rejection sampling,
 * so the text is distributed as the target's.
 */
static void spec_verify(fy_engine_t *e, request_t *q, const float *lg, double t)
{
    int32_t k = q->spec_k, V = e->vocab, base = q->n_total;
    const int32_t *draft = q->tokens + base;
    int32_t out[FY_SPEC_MAX_K + 1];
    float lp[FY_SPEC_MAX_K + 1] = {0};
    int32_t a = 0;
    /* structured output: row i is masked in the grammar's state after the
     * first i proposals; a proposal it does not allow ends the masking
     * (verification rejects it there: it is out of that row's mask) */
    if (q->gm) {
        int32_t taken = 0;
        for (int32_t i = 0; i <= k; i++) {
            if (grammar_mask(e, q, e->logits + (lg - e->logits) + (size_t)i * (size_t)V) != FY_OK) {
                (void)fy_gmatch_rollback(q->gm, taken);
                end_error(e, q, FY_ERR_INTERNAL, "the structured output's mask failed");
                return;
            }
            if (i == k || fy_gmatch_accept_token(q->gm, e->trie, draft[i]) != FY_OK) break;
            taken++;
        }
        (void)fy_gmatch_rollback(q->gm, taken); /* on_token takes the accepted ones for good */
    }
    if (fy_sampling_is_greedy(&q->sampling)) {
        for (;;) {
            out[a] = fy_argmax(lg + (size_t)a * (size_t)V, V);
            if (a == k || out[a] != draft[a]) break;
            a++;
        }
    } else {
        const float *p[FY_SPEC_MAX_K + 1], *qq[FY_SPEC_MAX_K];
        for (int32_t i = 0; i <= k; i++) {
            float *row = e->probs + (size_t)i * (size_t)V;
            fy_sampler_probs(e->sampler, &q->sampling, lg + (size_t)i * (size_t)V, row);
            p[i] = row;
        }
        for (int32_t i = 0; i < k && q->qslot >= 0; i++)
            qq[i] = e->qprobs + ((size_t)q->qslot * (size_t)e->p.spec.k_max + (size_t)i) * (size_t)V;
        a = fy_spec_verify_sampled(p, q->qslot >= 0 ? qq : NULL, draft, k, V, &q->rng, e->scratch, out);
    }
    if (q->logprobs)
        for (int32_t i = 0; i <= a; i++) lp[i] = fy_logprob(lg + (size_t)i * (size_t)V, V, &q->sampling, out[i]);
    /* K/V stays for the decode token and the accepted proposals */
    q->n_computed = base + a;
    q->sched = 0;
    q->spec_k = 0;
    fy_kvm_seq_rollback(e->kvm, &q->bt, q->n_computed, &q->resv, q->spec_drawn);
    q->spec_drawn = 0;
    fy_kvm_seq_commit(e->kvm, &q->bt, q->tokens, q->n_computed, &q->resv);
    kv_evict(e, q);
    if (q->dbt.blocks) {
        if (q->d_computed > q->n_computed) q->d_computed = q->n_computed;
        fy_kvm_seq_truncate(e->p.spec.draft_kvm, &q->dbt, q->d_computed);
    }
    if (suffix_lookup(e, q)) {
        fy_spec_est_note(&q->est, q->spec_match, q->spec_own, k, a);
        fy_spec_est_note(&e->west, q->spec_match, q->spec_own, k, a);
    }
    e->st.spec_proposed += (uint64_t)k;
    e->st.spec_accepted += (uint64_t)a;
    e->st.spec_steps++;
    if (fy_spec_ctl_update(&q->ctl, &e->p.spec, k, a)) {
        e->st.spec_request_offs++;
        fy_debug("engine: request %llu: acceptance %.2f under %.2f; speculation off for %d steps",
                 (unsigned long long)q->id, q->ctl.rate, e->p.spec.min_accept, e->p.spec.probe_steps);
    }
    if (fy_spec_ctl_update(&e->wctl, &e->p.spec, k, a)) {
        e->st.spec_worker_offs++;
        fy_info("engine: acceptance %.2f under %.2f across requests; speculation off for %d steps", e->wctl.rate,
                e->p.spec.min_accept, e->p.spec.probe_steps);
    }
    for (int32_t i = 0; i <= a; i++)
        if (!on_token(e, q, out[i], lp[i], t)) return;
}

fy_status_t fy_engine_adopt(fy_engine_t *e, const int32_t *prompt, int32_t n_prompt, const fy_request_params_t *rp,
                            fy_block_table_t *bt, fy_kv_resv_t *resv, int32_t first, float logprob, const fy_rng_t *rng,
                            fy_event_fn cb, void *arg, uint64_t *id_p)
{
    if (e->n_running >= e->p.max_num_seqs) return FY_ERR_NO_SPACE;
    if (bt->n_tokens != n_prompt || bt->tier != FY_KV_DEVICE || first < 0 || first >= e->vocab)
        return refuse(e, FY_ERR_INVALID, "adopted request: %d tokens in its blocks for a prompt of %d, first token %d",
                      bt->n_tokens, n_prompt, first);
    fy_status_t st;
    fy_request_params_t rq = *rp;
    rq.prompt_logprobs = false; /* its prompt ran elsewhere: nothing stops it speculating */
    request_t *q = request_new(e, prompt, n_prompt, &rq, cb, arg, false, &st);
    if (!q) return st;
    if ((int64_t)bt->max_blocks * e->block_size < q->cap) {
        request_free(q);
        return refuse(e, FY_ERR_INVALID, "adopted request: its block table holds %d blocks, it needs %d tokens",
                      bt->max_blocks, q->cap);
    }
    q->bt = *bt; /* the table's arrays move with it */
    memset(bt, 0, sizeof(*bt));
    q->resv = *resv;
    resv->blocks = 0;
    if (rng) q->rng = *rng;
    pthread_mutex_lock(&e->mu);
    q->id = e->next_id++;
    q->seq = e->next_seq++;
    e->st.submitted++;
    e->st.prompt_tokens += (uint64_t)n_prompt;
    pthread_mutex_unlock(&e->mu);
    q->n_computed = n_prompt;
    q->looked_up = true;
    /* a KV budget applies from the prompt's end, as after a colocated
     * prompt's last chunk, with the scores the prompt's blocks received
     * where it ran (a decode worker's placed blocks are within the budget
     * already: nothing goes) */
    if (q->scores && rp->kv_scores) memcpy(q->scores, rp->kv_scores, (size_t)q->bt.n_blocks * sizeof(float));
    kv_evict(e, q);
    q->state = RQ_RUNNING;
    e->running[e->n_running++] = q;
    double t = fy_now_s();
    q->t_sched = t;
    if (id_p) *id_p = q->id;
    int32_t n_top = rp->n_first_top < q->top_logprobs ? rp->n_first_top : q->top_logprobs;
    (void)on_token_top(e, q, first, logprob, rp->first_top_ids, rp->first_top_logprobs, n_top, t); /* may end it */
    return FY_OK;
}

/* Reports the prompt logprobs of q's chunk this step: rows [n_rows, vocab]
 * of raw logits, row r the distribution of token n_computed + r + 1 (the
 * prompt's tokens only; a last row past them is the first token's). */
static void plp_report(fy_engine_t *e, request_t *q, const float *logits, int32_t n_rows)
{
    int32_t first = q->n_computed + 1, n = q->n_prompt - first;
    if (n > n_rows) n = n_rows;
    int32_t k = q->plp_top;
    for (int32_t r = 0; r < n; r++) {
        const float *lg = logits + (size_t)r * (size_t)e->vocab;
        e->plp_lps[r] =
            fy_logits_token_logprob(lg, e->vocab, q->tokens[first + r], k, e->plp_ids + (size_t)r * (size_t)k,
                                    e->plp_tlps + (size_t)r * (size_t)k, &e->plp_rank[r]);
    }
    if (first + n >= q->n_prompt) q->plp_done = true;
    if (n < 1) return;
    fy_event_t ev = {.kind = FY_EVENT_PROMPT_LOGPROBS,
                     .id = q->id,
                     .token = -1,
                     .first = first,
                     .n_rows = n,
                     .prompt_lps = e->plp_lps,
                     .prompt_rank = e->plp_rank,
                     .top_ids = e->plp_ids,
                     .top_logprobs = e->plp_tlps,
                     .n_top = k,
                     .n_prompt = q->n_prompt};
    q->cb(q->cb_arg, &ev);
}

fy_status_t fy_engine_step(fy_engine_t *e)
{
    run_posts(e);
    take_inbox(e);
    admit_swapped(e);
    qsort(e->running, (size_t)e->n_running, sizeof(request_t *), cmp_running);
    int32_t budget = e->p.max_num_batched_tokens, prefill_left = e->prefill_budget;
    /* logit rows: one for each request scheduled (at most max_num_seqs,
     * which the runner's rows cover), a chunk's worth for prompt logprobs,
     * which take only rows no later running request could need */
    int32_t rows_left = e->logit_rows;
    /* running requests in priority order; a token for every decoding
     * request is set aside before prompt chunks take the rest */
    int32_t decodes = 0;
    for (int32_t i = 0; i < e->n_running; i++) {
        e->running[i]->sched = 0;
        decodes += e->running[i]->n_total - e->running[i]->n_computed == 1;
    }
    for (int32_t i = 0; i < e->n_running; i++) {
        request_t *q = e->running[i];
        int32_t k = q->n_total - q->n_computed;
        bool decode = k == 1;
        if (decode) {
            decodes--;
        } else {
            if (k > budget - decodes) k = budget - decodes;
            if (k > prefill_left) k = prefill_left;
            if (plp_rows(q) && k > rows_left - (e->n_running - i - 1)) k = rows_left - (e->n_running - i - 1);
        }
        if (k <= 0) continue;
        if (!schedule(e, i, k)) {
            /* q left the running set: preempted (it was the last) or failed */
            if (i < e->n_running && e->running[i] != q) i--;
            continue;
        }
        rows_left -= plp_rows(q) ? k : 1;
        budget -= k;
        if (!decode) prefill_left -= k;
    }
    admit_waiting(e, &budget, &prefill_left, &rows_left);
    spec_plan(e, budget);

    int32_t n = 0;
    for (int32_t i = 0; i < e->n_running; i++) {
        request_t *q = e->running[i];
        if (q->sched <= 0) continue;
        e->fwd_req[n] = q;
        e->fwd[n] = (fy_forward_seq_t){
            .bt = &q->bt,
            .tokens = q->tokens + q->n_computed,
            .n_tokens = q->sched,
            .pos = q->n_computed,
            .n_logits = q->spec_k > 0                            ? q->spec_k + 1
                        : plp_rows(q)                            ? q->sched
                        : q->n_computed + q->sched == q->n_total ? 1
                                                                 : 0,
            .scores = q->scores,
        };
        n++;
    }
    if (n == 0) return FY_OK;
    e->st.steps++;
    int32_t n_tok = 0;
    for (int32_t i = 0; i < n; i++) n_tok += e->fwd[i].n_tokens;
    e->st.forward_tokens += (uint64_t)n_tok;
    double t_fwd = fy_now_s();
    fy_status_t st = fy_runner_forward(e->r, e->fwd, n, e->logits);
    cost_note(e, n_tok, fy_now_s() - t_fwd);
    if (st != FY_OK) { /* logged; the requests in this batch end, the engine keeps serving */
        for (int32_t i = 0; i < n; i++) end_error(e, e->fwd_req[i], st, "forward pass failed");
        return st;
    }
    double t = fy_now_s();
    int32_t row = 0;
    for (int32_t i = 0; i < n; i++) {
        request_t *q = e->fwd_req[i];
        if (q->spec_k > 0) {
            const float *lg = e->logits + (size_t)row * (size_t)e->vocab;
            row += q->spec_k + 1;
            spec_verify(e, q, lg, t); /* may end it */
            continue;
        }
        int32_t before = q->n_computed, n_rows = e->fwd[i].n_logits;
        if (plp_rows(q)) {
            plp_report(e, q, e->logits + (size_t)row * (size_t)e->vocab, n_rows);
            row += n_rows - 1; /* the last row: the first token's, when the chunk ends the prompt */
        }
        q->n_computed += q->sched;
        q->sched = 0;
        if (before < q->n_prompt)
            e->st.computed_prompt_tokens +=
                (uint64_t)((q->n_computed < q->n_prompt ? q->n_computed : q->n_prompt) - before);
        fy_kvm_seq_commit(e->kvm, &q->bt, q->tokens, q->n_computed, &q->resv);
        kv_evict(e, q);
        if (q->progress && before < q->n_prompt) {
            fy_event_t ev = {.kind = FY_EVENT_PROGRESS,
                             .id = q->id,
                             .token = -1,
                             .bt = &q->bt,
                             .n_computed = q->n_computed,
                             .n_prompt = q->n_prompt,
                             .kv_scores = q->scores};
            q->cb(q->cb_arg, &ev);
        }
        if (n_rows == 0) continue;
        if (q->n_computed < q->n_total) { /* a prompt-logprobs chunk short of the prompt's end */
            row++;
            continue;
        }
        float *lg = e->logits + (size_t)row++ * (size_t)e->vocab;
        if (q->lp_on)
            fy_logits_apply(&q->lp, &e->lscratch, q->tokens, q->n_prompt, q->n_total, e->trie->eog, e->trie->n_eog, lg);
        if (q->gm && grammar_mask(e, q, lg) != FY_OK) {
            end_error(e, q, FY_ERR_INTERNAL, "the structured output's mask failed");
            continue;
        }
        float lp = 0.0f;
        int32_t tok = fy_sampler_sample(e->sampler, &q->sampling, &q->rng, lg, q->logprobs ? &lp : NULL);
        int32_t n_top =
            q->top_logprobs
                ? fy_logits_top(lg, e->vocab, fy_sampling_is_greedy(&q->sampling) ? 1.0f : q->sampling.temperature,
                                q->top_logprobs, e->top_ids, e->top_lps)
                : 0;
        (void)on_token_top(e, q, tok, lp, e->top_ids, e->top_lps, n_top, t);
    }
    adjust_budget(e);
    return FY_OK;
}

bool fy_engine_idle(fy_engine_t *e)
{
    pthread_mutex_lock(&e->mu);
    bool pending = e->inbox || e->n_cancels || e->posts;
    pthread_mutex_unlock(&e->mu);
    return !pending && !e->n_running && !e->n_waiting && !e->n_swapped;
}

/* ---- the engine's own thread ------------------------------------------------------------------------ */

static void *engine_main(void *p)
{
    fy_engine_t *e = p;
    double last_tick = fy_now_s();
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!e->stop && !e->inbox && !e->n_cancels && !e->posts && !e->n_running && !e->n_waiting && !e->n_swapped) {
            if (!e->p.tick_fn) {
                pthread_cond_wait(&e->cv, &e->mu);
                continue;
            }
            double left = last_tick + e->p.tick_s - fy_now_s();
            if (left <= 0) break;
            struct timespec ts;
            fy_deadline_in(CLOCK_REALTIME, left, &ts);
            pthread_cond_timedwait(&e->cv, &e->mu, &ts);
        }
        bool stop = e->stop;
        pthread_mutex_unlock(&e->mu);
        if (stop) break;
        int32_t before_running = e->n_running, before_waiting = e->n_waiting;
        fy_engine_step(e);
        if (e->p.tick_fn) {
            e->p.tick_fn(e->p.tick_arg);
            last_tick = fy_now_s();
        }
        /* waiting requests that cannot be admitted yet, with nothing
         * running to free blocks: sleep until something is handed in */
        if (!e->n_running && e->n_waiting && e->n_waiting == before_waiting && before_running == 0) {
            pthread_mutex_lock(&e->mu);
            if (!e->stop && !e->inbox && !e->n_cancels && !e->posts) {
                struct timespec ts;
                fy_deadline_in(CLOCK_REALTIME, 0.010, &ts); /* and look again in 10 ms */
                pthread_cond_timedwait(&e->cv, &e->mu, &ts);
            }
            pthread_mutex_unlock(&e->mu);
        }
    }
    return NULL;
}

fy_status_t fy_engine_start(fy_engine_t *e)
{
    if (e->thread_on) return FY_OK;
    e->stop = false;
    int rc = pthread_create(&e->thread, NULL, engine_main, e);
    if (rc) {
        fy_error("engine: cannot start its thread: error %d", rc);
        return FY_ERR_INTERNAL;
    }
    e->thread_on = true;
    return FY_OK;
}

void fy_engine_stop(fy_engine_t *e)
{
    if (!e->thread_on) return;
    pthread_mutex_lock(&e->mu);
    e->stop = true;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    e->thread_on = false;
}

void fy_engine_stats(fy_engine_t *e, fy_engine_stats_t *out)
{
    pthread_mutex_lock(&e->mu);
    *out = e->st;
    out->waiting = e->queued;
    pthread_mutex_unlock(&e->mu);
    out->running = e->n_running;
    out->swapped = e->n_swapped;
    out->prefill_budget = e->prefill_budget;
    out->spec_worker_off = e->wctl.off_steps > 0;
}

bool fy_engine_has_draft(const fy_engine_t *e) { return e->p.spec.draft != NULL; }

fy_status_t fy_engine_check(fy_engine_t *e)
{
    int32_t bs = e->block_size, draft_blocks = 0;
    for (int32_t i = 0; i < e->n_running; i++) {
        const request_t *q = e->running[i];
        int32_t dbs = q->dbt.block_size ? q->dbt.block_size : 1;
        if (q->bt.n_blocks != (q->n_computed + bs - 1) / bs || q->bt.n_tokens != q->n_computed ||
            q->d_computed > q->n_computed || q->dbt.n_blocks != (q->d_computed + dbs - 1) / dbs ||
            q->dbt.n_tokens != q->d_computed) {
            fy_error("engine: request %llu holds %d blocks for %d computed tokens (%d written), its draft %d "
                     "blocks for %d",
                     (unsigned long long)q->id, q->bt.n_blocks, q->n_computed, q->bt.n_tokens, q->dbt.n_blocks,
                     q->d_computed);
            return FY_ERR_INTERNAL;
        }
        draft_blocks += q->dbt.n_blocks;
    }
    if (fy_kvm_check(e->kvm) != FY_OK) return FY_ERR_INTERNAL;
    if (e->p.spec.draft_kvm) {
        fy_kvm_stats_t ds;
        fy_kvm_stats(e->p.spec.draft_kvm, &ds);
        if (fy_kvm_check(e->p.spec.draft_kvm) != FY_OK || ds.tier[FY_KV_DEVICE].used != draft_blocks) {
            fy_error("engine: the draft cache has %d blocks in use; its requests hold %d", ds.tier[FY_KV_DEVICE].used,
                     draft_blocks);
            return FY_ERR_INTERNAL;
        }
    }
    return FY_OK;
}

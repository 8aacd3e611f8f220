/*
 * engine.c - continuous batching: the engine's thread, its inbox, submit,
 * adopt and cancel, the step's loop (plan, forward pass, outputs) and a
 * request's life to its one terminal event.  The plan is sched.c's, the
 * outputs output.c's, speculation's part of a step spec_step.c's
 * (engine_int.h says how they meet).
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
#include "engine/engine_int.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "grammar/grammar.h"
#include "common/log.h"
#include "common/mem.h"

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
    fy_free(q->allowed_ids);
    fy_gmatch_destroy(q->gm);
    fy_free(q);
}

/* ordering of queues and of the running set: priority down, then arrival */
bool eng_before(const request_t *a, const request_t *b)
{
    return a->priority > b->priority || (a->priority == b->priority && a->seq < b->seq);
}

void eng_list_insert(request_t **head, request_t *q)
{
    while (*head && eng_before(*head, q)) head = &(*head)->next;
    q->next = *head;
    *head = q;
}

bool eng_list_remove(request_t **head, request_t *q)
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

void eng_emit_text(void *arg, const char *text, size_t len)
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
void eng_draft_drop(fy_engine_t *e, request_t *q)
{
    if (q->dbt.blocks) fy_kvm_seq_release(e->p.spec.draft_kvm, &q->dbt);
    q->d_computed = 0;
}

/* Takes the request out of whichever queue holds it. */
void eng_unlink_request(fy_engine_t *e, request_t *q)
{
    switch (q->state) {
    case RQ_WAITING:
        eng_list_remove(&e->waiting, q);
        e->n_waiting--;
        pthread_mutex_lock(&e->mu);
        e->queued--;
        pthread_mutex_unlock(&e->mu);
        break;
    case RQ_SWAPPED:
        eng_list_remove(&e->swapped, q);
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
void eng_end_request(fy_engine_t *e, request_t *q, fy_event_kind_t kind, fy_finish_reason_t reason, fy_status_t status,
                     const char *message)
{
    eng_unlink_request(e, q);
    /* its text is what the tenant's next requests may repeat */
    if (e->hist && kind == FY_EVENT_FINISH && q->spec == FY_SPEC_NGRAM)
        fy_spec_hist_add(e->hist, &q->bt.ns, q->tokens, q->n_total);
    q->timings.n_kv_kept = kv_kept_tokens(&q->bt);
    fy_kvm_seq_release(e->kvm, &q->bt);
    fy_kvm_resv_release(e->kvm, &q->resv);
    eng_draft_drop(e, q);
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
            if (fy_stopper_feed(&q->stopper, piece, n, eng_emit_text, q))
                ev.reason = FY_FINISH_STOP;
            else
                fy_stopper_flush(&q->stopper, eng_emit_text, q);
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

void eng_end_error(fy_engine_t *e, request_t *q, fy_status_t status, const char *message)
{
    eng_end_request(e, q, FY_EVENT_ERROR, FY_FINISH_NONE, status, message);
}

/* ---- creation ------------------------------------------------------------------------------- */

fy_status_t fy_engine_create(fy_runner_t *r, fy_kvm_t *kvm, const fy_tokenizer_t *tok, const fy_engine_params_t *p,
                             fy_engine_t **e_p)
{
    return eng_create(r, fy_runner_params(r), fy_model_config(fy_runner_model(r))->vocab_size, kvm, tok, p, e_p);
}

fy_status_t eng_create(fy_runner_t *r, const fy_runner_params_t *rp, int32_t vocab, fy_kvm_t *kvm,
                       const fy_tokenizer_t *tok, const fy_engine_params_t *p, fy_engine_t **e_p)
{
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
    e->vocab = vocab;
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
    e->dfwd_req = fy_calloc((size_t)n, sizeof(*e->dfwd_req));
    if (p->spec.draft) e->qprobs = fy_malloc((size_t)SPEC_QSLOTS * (size_t)K * (size_t)e->vocab * sizeof(float));
    if (!e->probs || !e->scratch || !e->dfwd || !e->dfwd_req || !e->dreq || !e->dk || (p->spec.draft && !e->qprobs))
        goto nomem;
    if (p->spec.lookup == FY_SPEC_LOOKUP_SUFFIX && p->spec.history > 0 &&
        fy_spec_hist_create(p->spec.history, SPEC_HIST_TOKENS, &e->hist) != FY_OK)
        goto nomem;
    e->plan.seqs = fy_calloc((size_t)n, sizeof(*e->plan.seqs));
    e->plan.reqs = fy_calloc((size_t)n, sizeof(*e->plan.reqs));
    e->evict_cap = rp->max_ctx / rp->block_size + 1;
    e->evict_buf = fy_calloc((size_t)e->evict_cap, sizeof(int32_t));
    e->evict_cand = fy_calloc((size_t)e->evict_cap, sizeof(fy_evict_cand_t));
    if (!e->evict_buf || !e->evict_cand) goto nomem;
    e->running = fy_calloc((size_t)n, sizeof(*e->running));
    e->itl_ring = fy_calloc((size_t)w, sizeof(float));
    e->itl_scratch = fy_calloc((size_t)w, sizeof(float));
    if (!e->logits || !e->plan.seqs || !e->plan.reqs || !e->running || !e->itl_ring || !e->itl_scratch) goto nomem;
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
        eng_end_error(e, q, FY_ERR_CANCELLED, "engine shutting down");
    }
    while (e->n_running) eng_end_error(e, e->running[e->n_running - 1], FY_ERR_CANCELLED, "engine shutting down");
    while (e->waiting) eng_end_error(e, e->waiting, FY_ERR_CANCELLED, "engine shutting down");
    while (e->swapped) eng_end_error(e, e->swapped, FY_ERR_CANCELLED, "engine shutting down");
    fy_sampler_destroy(e->sampler);
    fy_spec_hist_destroy(e->hist);
    fy_free(e->logits);
    fy_free(e->plp_lps);
    fy_free(e->plp_rank);
    fy_free(e->plp_ids);
    fy_free(e->plp_tlps);
    fy_free(e->plan.seqs);
    fy_free(e->plan.reqs);
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
    fy_free(e->dfwd_req);
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

/* request_t's copies hold whatever fy_genspec_check lets through */
_Static_assert(FY_GEN_MAX_STOP_IDS <= FY_LOGITS_MAX_STOP_IDS && FY_GEN_MAX_BAD_SEQS <= FY_LOGITS_MAX_BAD &&
                   FY_GEN_MAX_BAD_TOKENS <= FY_LOGITS_MAX_BAD_IDS && FY_GEN_MAX_TOP_LOGPROBS <= FY_LOGITS_MAX_TOP &&
                   FY_GEN_MAX_PROMPT_LOGPROBS <= FY_LOGITS_MAX_TOP && FY_GEN_MAX_STOP <= FY_STOP_MAX,
               "the engine's per-request arrays are smaller than what a genspec may hold");

/* Checks a request and builds it (not yet queued); NULL after refusing. */
static request_t *request_new(fy_engine_t *e, const int32_t *prompt, int32_t n_prompt, const fy_genspec_t *gen,
                              const fy_request_ctx_t *ctx, fy_event_fn cb, void *arg, bool adopted, fy_status_t *st_p)
{
    static const fy_request_ctx_t no_ctx;
    if (!ctx) ctx = &no_ctx;
    /* an adopted request's prompt ran elsewhere: no prompt logprobs here,
     * so nothing stops it speculating */
    const bool plp = gen && gen->prompt_logprobs && !adopted;
    if (!cb || n_prompt < 1 || !gen) {
        *st_p = refuse(e, FY_ERR_INVALID, "a request needs a prompt, its parameters and a callback");
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
    /* every range (sampling, lengths, counts of stops, biases, bad words,
     * allowed tokens, alternatives): the wire's and the door's own check;
     * what only the engine knows, its vocabulary, below */
    const char *field = NULL;
    char why[160];
    if (fy_genspec_check(gen, INT32_MAX, &field, why, sizeof(why)) != FY_OK) {
        *st_p = refuse(e, FY_ERR_INVALID, "%s", why);
        return NULL;
    }
    /* logits processing (logits.h; vLLM's definitions), as the client asked */
    const fy_logits_params_t lpv = {.presence_penalty = gen->presence_penalty,
                                    .frequency_penalty = gen->frequency_penalty,
                                    .repetition_penalty = gen->repetition_penalty,
                                    .bias_ids = gen->logit_bias_id,
                                    .bias = gen->logit_bias,
                                    .n_bias = gen->n_logit_bias,
                                    .min_tokens = gen->min_tokens,
                                    .stop_ids = gen->stop_ids,
                                    .n_stop_ids = gen->n_stop_ids,
                                    .bad_lens = gen->bad_lens,
                                    .bad_ids = gen->bad_ids,
                                    .n_bad = gen->n_bad,
                                    .allowed_ids = gen->allowed_ids,
                                    .n_allowed = gen->n_allowed};
    const fy_logits_params_t *lp = &lpv;
    int32_t n_bad_ids = 0;
    for (int32_t i = 0; i < lp->n_bad; i++) n_bad_ids += lp->bad_lens[i];
    for (int32_t i = 0; i < n_bad_ids; i++) {
        if (lp->bad_ids[i] < 0 || lp->bad_ids[i] >= e->vocab) {
            *st_p =
                refuse(e, FY_ERR_INVALID, "bad_words names token %d; the vocabulary has %d", lp->bad_ids[i], e->vocab);
            return NULL;
        }
    }
    for (int32_t i = 0; i < lp->n_bias + lp->n_stop_ids + lp->n_allowed; i++) {
        int32_t n1 = lp->n_bias, n2 = n1 + lp->n_stop_ids;
        int32_t t = i < n1 ? lp->bias_ids[i] : i < n2 ? lp->stop_ids[i - n1] : lp->allowed_ids[i - n2];
        if (t < 0 || t >= e->vocab) {
            *st_p = refuse(e, FY_ERR_INVALID, "%s names token %d; the vocabulary has %d",
                           i < n1   ? "logit_bias"
                           : i < n2 ? "stop_token_ids"
                                    : "allowed_token_ids",
                           t, e->vocab);
            return NULL;
        }
    }
    /* by default a sampled request speculates only where the deployment
     * says so (spec.h: its seed then no longer fixes its tokens under load);
     * processed logits and reported alternatives are per position, which a
     * verification step does not do: no speculation for them */
    fy_spec_method_t spec = ctx->first_only ? FY_SPEC_NONE : gen->spec;
    if (spec == FY_SPEC_DEFAULT)
        spec = fy_sampling_is_greedy(&gen->sampling) || e->p.spec.sampled ? e->p.spec.method : FY_SPEC_NONE;
    if (fy_logits_active(lp) || gen->top_logprobs > 0 || plp) spec = FY_SPEC_NONE;
    if (spec > FY_SPEC_DRAFT || (spec == FY_SPEC_DRAFT && !e->p.spec.draft)) {
        *st_p = refuse(e, FY_ERR_INVALID, "speculative decoding '%s' asked for; this engine has no draft model",
                       fy_spec_method_str(spec));
        return NULL;
    }
    int32_t max_tokens = ctx->first_only ? 1 : fy_genspec_max_tokens(gen, n_prompt, e->max_ctx);
    /* its KV budget: the engine's, or a smaller one it asks for */
    fy_evict_params_t evict;
    int32_t kv_cap;
    if (fy_engine_request_evict(e, gen->kv_budget, &evict, &kv_cap) != FY_OK) {
        *st_p = refuse(e, FY_ERR_INVALID, "kv_budget %d refused (see above)", gen->kv_budget);
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
    if (gen->grammar_kind != FY_GEN_GRAMMAR_NONE) {
        char err[FY_GRAMMAR_ERR_LEN] = "";
        fy_grammar_t *g = NULL;
        fy_grammar_kind_t kind;
        bool hit = false;
        fy_status_t gst = !fy_grammar_kind_of_gen(gen->grammar_kind, &kind)
                              ? FY_ERR_INVALID
                              : fy_grammar_cache_get(e->gcache, kind, gen->grammar, (size_t)gen->grammar_len, &g, &hit,
                                                     err, sizeof(err));
        if (!gst) gst = fy_gmatch_create(g, &gm);
        fy_grammar_unref(g);
        if (gst) {
            *st_p = refuse(e, gst == FY_ERR_NOMEM ? FY_ERR_NOMEM : FY_ERR_INVALID, "response_format (%s): %s",
                           fy_gen_grammar_str(gen->grammar_kind), err[0] ? err : fy_status_str(gst));
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
    if (lp->n_allowed && (q->allowed_ids = fy_malloc((size_t)lp->n_allowed * sizeof(int32_t))))
        memcpy(q->allowed_ids, lp->allowed_ids, (size_t)lp->n_allowed * sizeof(int32_t));
    q->lp.allowed_ids = q->allowed_ids;
    if (lp->n_bad) {
        memcpy(q->bad_lens, lp->bad_lens, (size_t)lp->n_bad * sizeof(int32_t));
        memcpy(q->bad_ids, lp->bad_ids, (size_t)n_bad_ids * sizeof(int32_t));
    }
    q->lp.bad_lens = q->bad_lens;
    q->lp.bad_ids = q->bad_ids;
    q->plp = plp;
    q->plp_top = gen->prompt_top < e->vocab ? gen->prompt_top : e->vocab;
    q->lp_on = fy_logits_active(lp);
    q->top_logprobs = gen->top_logprobs;
    q->defer_stops = ctx->first_only;
    /* stop strings are the decode worker's when the request is one token here */
    const char *stops[FY_GEN_MAX_STOP];
    int32_t n_stop = ctx->first_only ? 0 : fy_genspec_stops(gen, stops);
    if (!q->tokens || !q->itl || (evict.policy == FY_EVICT_H2O && !q->scores) ||
        (lp->n_bias && (!q->bias_ids || !q->bias)) || (lp->n_allowed && !q->allowed_ids) ||
        (!adopted && (st = fy_kvm_seq_init(e->kvm, &q->bt, q->cap, &ctx->ns))) ||
        (st = fy_stopper_init(&q->stopper, stops, n_stop, FY_DETOK_MAX_OUT))) {
        request_free(q);
        *st_p = refuse(e, st, "cannot set up the request: %s", fy_status_str(st));
        return NULL;
    }
    memcpy(q->tokens, prompt, (size_t)n_prompt * sizeof(int32_t));
    q->n_prompt = q->n_total = n_prompt;
    q->max_tokens = max_tokens;
    q->sampling = gen->sampling;
    q->ignore_eos = gen->ignore_eos || ctx->first_only;
    q->logprobs = gen->logprobs || gen->top_logprobs > 0;
    q->progress = ctx->progress;
    q->priority = gen->priority;
    q->cb = cb;
    q->cb_arg = arg;
    fy_rng_seed(&q->rng, gen->sampling.seed);
    q->spec = spec;
    fy_spec_ctl_init(&q->ctl, &e->p.spec);
    q->est = e->west;
    q->qslot = -1;
    /* the draft's draws must not move the request's own generator */
    fy_rng_seed(&q->drng, gen->sampling.seed ^ 0x5bd1e9955bd1e995ull);
    fy_detok_init(&q->detok, e->tok, gen->render_special);
    q->stopper.include_stop = gen->include_stop;
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

fy_status_t fy_engine_submit(fy_engine_t *e, const int32_t *prompt, int32_t n_prompt, const fy_genspec_t *gen,
                             const fy_request_ctx_t *ctx, fy_event_fn cb, void *arg, uint64_t *id_p)
{
    fy_status_t st;
    request_t *q = request_new(e, prompt, n_prompt, gen, ctx, cb, arg, false, &st);
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

void eng_take_inbox(fy_engine_t *e)
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
        eng_list_insert(&e->waiting, q);
        e->n_waiting++;
    }
    for (int32_t i = 0; i < take; i++) {
        request_t *q = find_request(e, cancels[i]);
        if (q) eng_end_error(e, q, FY_ERR_CANCELLED, "cancelled");
    }
}

fy_status_t fy_engine_adopt(fy_engine_t *e, const int32_t *prompt, int32_t n_prompt, const fy_genspec_t *gen,
                            const fy_request_ctx_t *ctx, fy_block_table_t *bt, fy_kv_resv_t *resv, int32_t first,
                            float logprob, const fy_rng_t *rng, fy_event_fn cb, void *arg, uint64_t *id_p)
{
    if (e->n_running >= e->p.max_num_seqs) return FY_ERR_NO_SPACE;
    if (bt->n_tokens != n_prompt || bt->tier != FY_KV_DEVICE || first < 0 || first >= e->vocab)
        return refuse(e, FY_ERR_INVALID, "adopted request: %d tokens in its blocks for a prompt of %d, first token %d",
                      bt->n_tokens, n_prompt, first);
    fy_status_t st;
    static const fy_request_ctx_t no_ctx;
    if (!ctx) ctx = &no_ctx;
    request_t *q = request_new(e, prompt, n_prompt, gen, ctx, cb, arg, true, &st);
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
    if (q->scores && ctx->kv_scores) memcpy(q->scores, ctx->kv_scores, (size_t)q->bt.n_blocks * sizeof(float));
    eng_kv_evict(e, q);
    q->state = RQ_RUNNING;
    e->running[e->n_running++] = q;
    double t = fy_now_s();
    q->t_sched = t;
    if (id_p) *id_p = q->id;
    int32_t n_top = ctx->n_first_top < q->top_logprobs ? ctx->n_first_top : q->top_logprobs;
    (void)eng_on_token_top(e, q, first, logprob, ctx->first_top_ids, ctx->first_top_logprobs, n_top,
                           t); /* may end it */
    return FY_OK;
}

fy_status_t fy_engine_step(fy_engine_t *e)
{
    if (!e->r) { /* eng_create without a runner (test_sched): it plans, it has no forward pass */
        fy_error("engine: step of an engine without a runner");
        return FY_ERR_INVALID;
    }
    run_posts(e);
    eng_take_inbox(e);
    eng_plan_t *plan = &e->plan;
    eng_plan(e, plan); /* sched.c */
    if (plan->n == 0) return FY_OK;
    e->st.steps++;
    e->st.forward_tokens += (uint64_t)plan->n_tokens;
    double t_fwd = fy_now_s();
    fy_status_t st = fy_runner_forward(e->r, plan->seqs, plan->n, e->logits);
    eng_cost_note(e, plan->n_tokens, fy_now_s() - t_fwd);
    if (st != FY_OK) { /* logged; the requests in this batch end, the engine keeps serving */
        for (int32_t i = 0; i < plan->n; i++) eng_end_error(e, plan->reqs[i], st, "forward pass failed");
        return st;
    }
    eng_outputs(e, plan, e->logits, fy_now_s()); /* output.c */
    eng_adjust_budget(e);
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
    if (!e->r) {
        fy_error("engine: start of an engine without a runner");
        return FY_ERR_INVALID;
    }
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

/*
 * prefill_worker.c - the prefill worker: runs prompts through the engine
 * (chunked, batched with other prompts, skipping blocks its own prefix
 * cache holds), ships each block as soon as it is complete into the
 * blocks a decode worker reserved, flushes, and reports the first token.
 *
 * A job is an engine request with max_tokens 1 and progress events.  After
 * each forward pass that computed part of its prompt, the blocks that
 * became complete (full ones; the last, partial one once the whole prompt
 * is done) are handed to the transfer engine, so the transfer of early
 * chunks overlaps the compute of later ones; blocks the decode worker
 * already caches (before first_block) are never sent.  The job holds its
 * own references to the blocks it shipped (a fork of the request's block
 * table) until the transfer has completed or failed, so a block is never
 * reused while a put may still read it.  When the first token is sampled
 * the job flushes; the flush's completion (transfer thread) is posted
 * back to the engine thread, which reports "prefilled" or an error.
 *
 * Under a KV budget (kv.evict) the engine evicts blocks between chunks,
 * so which blocks survive is known only at the prompt's end: the decode
 * worker reserved "slots", as many blocks per group as the budget keeps,
 * and the job ships every kept block after the last chunk, in order, into
 * them; "prefilled" names the kept blocks and carries their H2O scores,
 * for the decode worker to put its blocks in place and go on evicting as
 * this engine would have.
 *
 * Staged (worker.kv_transfer, xstage.h): the blocks a job hands to the
 * transfer wait in its queue for staging slots; the pump copies what the
 * slots allow device-to-host and puts it from there, and goes on when
 * put completions give slots back (a wake-up posted to the engine
 * thread).  The job's finish waits until its queue is empty; an abort
 * drops the queue.  A job's blocks stay held (hold) the same way.
 *
 * Metrics (besides node.c's): per job, time to first token and queue time
 * as the engine measures them (submission to the first token: queue and
 * prompt compute, not the transfer), the whole job (command received to
 * "prefilled" or the error reported, transfer tail included), the KV
 * transfer (first put to flush done) and the job's outcome.
 */
#include "prefill/prefill_worker.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "common/clock.h"
#include "common/genspec.h"
#include "common/log.h"
#include "common/mem.h"
#include "rpc/rpc.h"
#include "transfer/xgroup.h"
#include "worker/xstage.h"

#define MAX_PROMPT 32768

typedef struct pjob {
    struct prefill *p;
    uint64_t id, engine_id;
    int64_t attempt;     /* the router's try number: an old try's events are told apart */
    fy_xgroup_job_t *xj; /* one transfer job per pair of ranks that share bytes (xgroup.h) */
    bool xj_closed;      /* finish or abort was called */
    /* staged: blocks waiting for staging slots; the finish waits for them */
    fy_xstage_queue_t stq;
    bool finish_wanted;
    _Atomic bool xj_gone; /* the transfer called back: xj is freed (set on the transfer thread) */
    int32_t n_prompt, first_block, n_dst, shipped, computed;
    int32_t *dst;  /* [n_dst] the decode worker's blocks for prompt blocks first_block.. */
    int32_t slots; /* a KV budget's reservation: dst holds slots blocks per group (0: positional) */
    int32_t *kept; /* [n_kept] the prompt blocks kept at its end (slots) */
    float *scores; /* [n_kept] their H2O scores, or NULL */
    int32_t n_kept;
    fy_block_table_t hold; /* references to every block handed to the transfer */
    bool engine_done, xfer_done;
    fy_status_t engine_status, xfer_status;
    char xfer_msg[200];
    char engine_msg[200];
    int32_t first_token;
    float logprob;
    int32_t top_ids[FY_LOGITS_MAX_TOP]; /* the first token's alternatives (top_logprobs) */
    float top_lps[FY_LOGITS_MAX_TOP];
    int32_t n_top;
    fy_rng_t rng;
    bool have_token;
    bool cancelled;
    double t_recv, t_computed, t_first_put;
    double queue_s, n_cached;
    int64_t bytes;
    struct pjob *prev, *next;
    struct pjob *xnext; /* on p->open while its transfer handle can take a new deadline */
    bool open;
} pjob_t;

typedef struct prefill {
    fy_node_t *n;
    pjob_t *jobs;
    int32_t n_jobs;
    uint64_t done, failed;
    int64_t bytes;
    double last_progress; /* when the last progress report went out */
    /* jobs whose transfer is open (between begin and finish/abort): the
     * "extend" command moves their deadline on the nng thread, so a lease
     * renewal does not wait behind a long engine step */
    pthread_mutex_t open_mu;
    pjob_t *open;
    struct {
        fy_metric_t *ttft, *queue, *e2e, *xfer_s, *ok, *failed, *cancelled;
    } m;
    fy_xstage_t *stage;       /* worker.kv_transfer runs staged; else NULL */
    _Atomic bool pump_posted; /* a pump is posted to the engine thread */
} prefill_t;

static void open_add(prefill_t *p, pjob_t *j)
{
    pthread_mutex_lock(&p->open_mu);
    j->open = true;
    j->xnext = p->open;
    p->open = j;
    pthread_mutex_unlock(&p->open_mu);
}

/* Before the handle goes (finish, abort, or the transfer's own end): no
 * extend touches it afterwards.  Idempotent. */
static void open_remove(prefill_t *p, pjob_t *j)
{
    pthread_mutex_lock(&p->open_mu);
    if (j->open) {
        for (pjob_t **q = &p->open; *q; q = &(*q)->xnext) {
            if (*q == j) {
                *q = j->xnext;
                break;
            }
        }
        j->open = false;
    }
    pthread_mutex_unlock(&p->open_mu);
}

/* Ends the job's transfer (engine thread): flush what was put, or give
 * up.  Staged, a finish waits until the pump has put every queued block. */
static void job_close_xfer(pjob_t *j, bool finish)
{
    if (finish && fy_xstage_queue_left(&j->stq) > 0) {
        j->finish_wanted = true;
        return;
    }
    j->finish_wanted = false;
    fy_xstage_queue_clear(&j->stq);
    open_remove(j->p, j);
    j->xj_closed = true;
    if (finish)
        fy_xgroup_job_finish(j->xj);
    else
        fy_xgroup_job_abort(j->xj);
}

static void job_unlink(prefill_t *p, pjob_t *j)
{
    if (j->prev)
        j->prev->next = j->next;
    else
        p->jobs = j->next;
    if (j->next) j->next->prev = j->prev;
    p->n_jobs--;
}

static void job_free(prefill_t *p, pjob_t *j)
{
    fy_kvm_seq_release(fy_node_kvm(p->n), &j->hold);
    fy_kvm_seq_deinit(&j->hold);
    fy_xstage_queue_clear(&j->stq);
    fy_free(j->dst);
    fy_free(j->kept);
    fy_free(j->scores);
    fy_free(j);
}

/* ---- the end of a job: both the engine and the transfer are done ------------------------------ */

static void job_error(pjob_t *j, fy_status_t st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void job_error(pjob_t *j, fy_status_t st, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fy_warn("request %llu: %s", (unsigned long long)j->id, msg);
    fy_wire_ev_error_t m = {.ev = fy_node_ev(j->p->n, 0, j->id), .has_attempt = true, .attempt = (int32_t)j->attempt};
    snprintf(m.code, sizeof(m.code), "%s", fy_status_tag(st));
    snprintf(m.message, sizeof(m.message), "%.*s", (int)sizeof(m.message) - 1, msg); /* the wire's limit */
    fy_msgw_t w;
    fy_wire_ev_error_write(&w, &m);
    fy_node_push(j->p->n, &w);
}

/* engine thread: reports and frees the job once both halves are over */
static void job_maybe_end(pjob_t *j)
{
    if (!j->engine_done || !j->xfer_done) return;
    prefill_t *p = j->p;
    fy_node_t *n = p->n;
    double now = fy_now_s();
    fy_metric_observe(p->m.e2e, now - j->t_recv);
    if (j->xfer_status == FY_OK && j->engine_status == FY_OK && j->have_token && !j->cancelled) {
        fy_metric_inc(p->m.ok);
        if (j->t_first_put > 0) fy_metric_observe(p->m.xfer_s, now - j->t_first_put);
        fy_wire_prefilled_t m = {.ev = fy_node_ev(n, 0, j->id),
                                 .attempt = (int32_t)j->attempt,
                                 .first_token = j->first_token,
                                 .logprob = j->logprob,
                                 .n_rng = 4,
                                 .cached = (int32_t)j->n_cached,
                                 .timings = {.queue_s = j->queue_s,
                                             .compute_s = j->t_computed - j->t_recv - j->queue_s,
                                             .transfer_tail_s = now - j->t_computed,
                                             .transfer_s = j->t_first_put > 0 ? now - j->t_first_put : 0,
                                             .bytes = j->bytes},
                                 .kept = j->kept,
                                 .n_kept = j->n_kept,
                                 .scores = j->scores,
                                 .n_scores = j->scores ? j->n_kept : 0,
                                 .top_ids = j->top_ids,
                                 .n_top_ids = j->n_top,
                                 .top_logprobs = j->top_lps,
                                 .n_top_logprobs = j->n_top};
        memcpy(m.rng, j->rng.s, sizeof(m.rng));
        fy_msgw_t w;
        fy_wire_prefilled_write(&w, &m);
        fy_node_push(n, &w);
        p->done++;
    } else if (j->cancelled) {
        fy_metric_inc(p->m.cancelled);
    } else {
        fy_metric_inc(p->m.failed);
        p->failed++;
        if (j->engine_status != FY_OK)
            job_error(j, j->engine_status, "prefill failed: %s", j->engine_msg);
        else if (j->xfer_status != FY_OK)
            job_error(j, j->xfer_status, "kv transfer failed: %s", j->xfer_msg);
        else
            job_error(j, FY_ERR_INTERNAL, "prefill ended without a token");
    }
    job_unlink(p, j);
    job_free(p, j);
}

typedef struct xfer_result {
    pjob_t *j;
    fy_status_t st;
    char msg[200];
} xfer_result_t;

/* engine thread */
static void xfer_end(fy_engine_t *e, void *arg)
{
    xfer_result_t *x = arg;
    pjob_t *j = x->j;
    j->xfer_done = true;
    j->xj_closed = true; /* the handle is gone (also when the transfer engine shut down first) */
    j->finish_wanted = false;
    fy_xstage_queue_clear(&j->stq);
    j->xfer_status = x->st;
    snprintf(j->xfer_msg, sizeof(j->xfer_msg), "%s", x->msg);
    fy_free(x);
    job_maybe_end(j);
}

/* transfer thread: hand the result to the engine thread */
static void on_xfer_done(void *arg, fy_status_t st, const char *message)
{
    pjob_t *j = arg;
    open_remove(j->p, j); /* the handle is freed after this returns */
    /* a pump posted before xfer_end runs must not touch it (only at
     * shutdown can a transfer end before finish or abort was called) */
    atomic_store(&j->xj_gone, true);
    xfer_result_t *x = fy_calloc(1, sizeof(*x));
    if (!x) { /* cannot happen in practice; the job's blocks would stay held */
        fy_error("request %llu: out of memory ending a transfer", (unsigned long long)j->id);
        return;
    }
    x->j = j;
    x->st = st;
    snprintf(x->msg, sizeof(x->msg), "%s", message ? message : "");
    if (fy_engine_post(fy_node_engine(j->p->n), xfer_end, x) != FY_OK) fy_free(x);
}

/* ---- shipping blocks ------------------------------------------------------------------------ */

/* Ends the job for a reason of the engine side's (engine thread). */
static void ship_fail(pjob_t *j, fy_status_t st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void ship_fail(pjob_t *j, fy_status_t st, const char *fmt, ...)
{
    job_close_xfer(j, false);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(j->engine_msg, sizeof(j->engine_msg), fmt, ap);
    va_end(ap);
    j->engine_status = st;
    fy_engine_cancel(fy_node_engine(j->p->n), j->engine_id);
}

/* Staged: moves what the staging slots allow from the job's queue into
 * its transfer, and flushes once the queue is empty and the job is done
 * (engine thread). */
static void stage_pump(pjob_t *j)
{
    prefill_t *p = j->p;
    if (j->xj_closed || atomic_load(&j->xj_gone) || fy_xstage_queue_left(&j->stq) == 0) return;
    int64_t sent = 0;
    fy_status_t st = fy_xstage_pump(p->stage, &j->stq, j->xj, &sent);
    if (sent) fy_node_kv_moved(p->n, sent, sent * (int64_t)fy_xgroup_job_block_bytes(j->xj));
    if (st != FY_OK) {
        ship_fail(j, st, "kv staging failed (copy to host staging, or queueing its puts): %s", fy_status_str(st));
        return;
    }
    if (j->finish_wanted && fy_xstage_queue_left(&j->stq) == 0) job_close_xfer(j, true);
}

/* engine thread: staging slots came back */
static void pump_all(fy_engine_t *e, void *arg)
{
    prefill_t *p = arg;
    atomic_store(&p->pump_posted, false);
    for (pjob_t *j = p->jobs; j; j = j->next) stage_pump(j);
}

/* any thread (a transfer thread's put completion): slots came back after
 * a pump found too few */
static void stage_wake(void *arg)
{
    prefill_t *p = arg;
    if (atomic_exchange(&p->pump_posted, true)) return;
    if (fy_engine_post(fy_node_engine(p->n), pump_all, p) != FY_OK) atomic_store(&p->pump_posted, false);
}

/* Hands n blocks src -> dst to the transfer, in puts of up to 256
 * (staged: into the job's queue, pumped through the staging slots). */
static int32_t put_blocks(pjob_t *j, const int32_t *src, const int32_t *dst, int32_t n)
{
    if (j->xj_closed) return n; /* failed meanwhile (staging): nothing more goes */
    if (j->p->stage) {
        if (fy_xstage_queue_push(&j->stq, src, dst, n) != FY_OK) {
            ship_fail(j, FY_ERR_NOMEM, "out of memory queueing %d blocks for staging", n);
            return n;
        }
    } else {
        fy_xgroup_job_put(j->xj, src, dst, n); /* an error is remembered and reported at the end */
        fy_node_kv_moved(j->p->n, n, (int64_t)n * (int64_t)fy_xgroup_job_block_bytes(j->xj));
    }
    if (j->t_first_put == 0) j->t_first_put = fy_now_s();
    int64_t b = (int64_t)n * (int64_t)fy_xgroup_job_block_bytes(j->xj); /* every rank's share */
    j->bytes += b;
    j->p->bytes += b;
    if (j->p->stage) stage_pump(j);
    return n;
}

/* A KV budget's job at the prompt's end (bt after its last eviction): the
 * kept blocks, and each group's kept blocks from the first the decode
 * worker lacks (or the group's window) into its slots, in order. */
static void ship_kept(pjob_t *j, const fy_block_table_t *bt, const float *scores)
{
    int32_t nb = bt->n_blocks, n = 0;
    j->kept = fy_malloc((size_t)nb * sizeof(int32_t));
    j->scores = scores ? fy_malloc((size_t)nb * sizeof(float)) : NULL;
    if (!j->kept || (scores && !j->scores)) {
        ship_fail(j, FY_ERR_NOMEM, "out of memory for the kept blocks");
        return;
    }
    for (int32_t i = 0; i < nb; i++) {
        if (!fy_block_table_holds(bt, i)) continue;
        if (scores) j->scores[n] = scores[i];
        j->kept[n++] = i;
    }
    j->n_kept = n;
    int32_t src[256], dst[256], k = 0;
    for (int32_t g = 0; g < bt->n_groups; g++) {
        const int32_t *tab = fy_block_table_group(bt, g), *want = j->dst + (size_t)g * (size_t)j->slots;
        int32_t from = bt->lo[g] > j->first_block ? bt->lo[g] : j->first_block, s = 0;
        for (int32_t i = from; i < nb; i++) {
            if (tab[i] < 0) continue;
            if (s >= j->slots || want[s] < 0) {
                ship_fail(j, FY_ERR_INVALID,
                          "kv group %d keeps more blocks than the decode worker reserved (%d): do the workers' "
                          "kv.evict settings differ?",
                          g, j->slots);
                return;
            }
            src[k] = tab[i];
            dst[k++] = want[s++];
            if (k == 256) k -= put_blocks(j, src, dst, k);
        }
    }
    if (k) put_blocks(j, src, dst, k);
    j->shipped = nb;
}

/* Hands every block that is complete and not yet shipped to the transfer
 * (under a KV budget: every kept block, once the prompt is done). */
static void ship(pjob_t *j, const fy_block_table_t *bt, int32_t n_computed, const float *scores)
{
    fy_kvm_t *kvm = fy_node_kvm(j->p->n);
    int32_t bs = bt->block_size;
    int32_t ready = n_computed >= j->n_prompt ? (j->n_prompt + bs - 1) / bs : n_computed / bs;
    int32_t from = j->shipped > j->first_block ? j->shipped : j->first_block;
    if (ready <= from || j->xj_closed || (j->slots && n_computed < j->n_prompt)) return;
    /* hold the blocks before the transfer can read them */
    fy_kvm_seq_release(kvm, &j->hold);
    if (fy_kvm_seq_fork(kvm, bt, &j->hold) != FY_OK) {
        ship_fail(j, FY_ERR_INTERNAL, "cannot hold blocks for the transfer");
        return;
    }
    if (j->slots) {
        ship_kept(j, bt, scores);
        return;
    }
    /* per KV group, the blocks the decode worker will read (a sliding
     * group's before the prompt's last window come as -1: never sent);
     * every one of those is still held here, since this side drops only
     * what a query at its own position, never past the prompt's end, cannot
     * see */
    int32_t per = j->n_dst / bt->n_groups, n = 0;
    int32_t src[256], dst[256];
    for (int32_t g = 0; g < bt->n_groups; g++) {
        const int32_t *tab = fy_block_table_group(bt, g), *want = j->dst + (size_t)g * (size_t)per;
        for (int32_t i = from; i < ready; i++) {
            int32_t d = want[i - j->first_block];
            if (d < 0) continue;
            if (i < bt->lo[g] || tab[i] < 0) { /* cannot happen: equal layouts (the handshake), and a
                                                  * positional job evicts nothing (cmd_prefill) */
                ship_fail(j, FY_ERR_INTERNAL, "kv group %d: block %d was dropped before it was sent", g, i);
                return;
            }
            src[n] = tab[i];
            dst[n++] = d;
            if (n == 256) n -= put_blocks(j, src, dst, n);
        }
    }
    if (n) put_blocks(j, src, dst, n);
    j->shipped = ready;
}

static void on_event(void *arg, const fy_event_t *ev)
{
    pjob_t *j = arg;
    switch (ev->kind) {
    case FY_EVENT_PROMPT_LOGPROBS: /* before "prefilled" on the same socket */
        if (!j->cancelled) fy_node_push_prompt_logprobs(j->p->n, j->id, j->attempt, ev);
        return;
    case FY_EVENT_PROGRESS:
        j->computed = ev->n_computed;
        ship(j, ev->bt, ev->n_computed, ev->kv_scores);
        return;
    case FY_EVENT_TOKEN:
        j->first_token = ev->token;
        j->logprob = ev->logprob;
        j->n_top = ev->n_top < FY_LOGITS_MAX_TOP ? ev->n_top : FY_LOGITS_MAX_TOP;
        if (j->n_top > 0) {
            memcpy(j->top_ids, ev->top_ids, (size_t)j->n_top * sizeof(int32_t));
            memcpy(j->top_lps, ev->top_logprobs, (size_t)j->n_top * sizeof(float));
        }
        j->rng = *ev->rng;
        j->have_token = true;
        return;
    case FY_EVENT_FINISH:
    case FY_EVENT_ERROR:
        j->engine_done = true;
        j->t_computed = fy_now_s();
        if (ev->timings) {
            j->queue_s = ev->timings->queue_s;
            j->n_cached = ev->timings->n_cached;
            fy_metric_observe(j->p->m.queue, ev->timings->queue_s);
            if (j->have_token) fy_metric_observe(j->p->m.ttft, ev->timings->ttft_s);
        }
        if (ev->kind == FY_EVENT_ERROR && j->engine_status == FY_OK) { /* ship_fail's reason, not its cancel */
            j->engine_status = ev->status;
            snprintf(j->engine_msg, sizeof(j->engine_msg), "%s", ev->message ? ev->message : "");
        }
        if (!j->xj_closed) job_close_xfer(j, ev->kind == FY_EVENT_FINISH && j->have_token); /* on_xfer_done follows */
        job_maybe_end(j);
        return;
    }
}

/* ---- commands ----------------------------------------------------------------------------------- */

static pjob_t *job_find(prefill_t *p, uint64_t id, int64_t attempt)
{
    for (pjob_t *j = p->jobs; j; j = j->next)
        if (j->id == id && j->attempt == attempt) return j;
    return NULL;
}

static void cmd_prefill(prefill_t *p, fy_msgr_t *r, uint64_t rid)
{
    fy_node_t *n = p->n;
    fy_kvm_t *kvm = fy_node_kvm(n);
    const fy_runner_params_t *rp = fy_runner_params(fy_node_runner(n));
    /* token ids of this vocabulary; a prompt that leaves room for a token in the context */
    fy_wire_lim_t lim = {.token_hi = fy_model_config(fy_node_model(n))->vocab_size - 1,
                         .max_prompt = rp->max_ctx - 1 < MAX_PROMPT ? rp->max_ctx - 1 : MAX_PROMPT,
                         .max_ctx = rp->max_ctx,
                         .block_size = fy_kvm_layout(kvm)->block_size,
                         .kv_groups = fy_kvm_layout(kvm)->n_groups};
    fy_wire_prefill_t m;
    fy_wire_prefill_init(&m);
    m.deadline_s = 30;
    fy_wire_prefill_read(r, &lim, &m);
    if (fy_msgr_ok(r) && job_find(p, m.id, m.attempt))
        fy_msgr_fail(r, FY_ERR_INVALID, "request %llu (try %lld) is already here", (unsigned long long)m.id,
                     (long long)m.attempt);
    /* a KV budget here and a reservation of slots there go together: the
     * engine evicts as the prompt runs, and ships only what it kept */
    fy_evict_params_t ev;
    int32_t kv_cap;
    if (fy_msgr_ok(r) && fy_engine_request_evict(fy_node_engine(n), m.gen.kv_budget, &ev, &kv_cap))
        fy_msgr_fail(r, FY_ERR_INVALID, "kv_budget %d is more than this prefill worker allows (kv.evict)",
                     m.gen.kv_budget);
    else if (fy_msgr_ok(r) && (ev.policy != FY_EVICT_NONE) != (m.slots > 0))
        fy_msgr_fail(r, FY_ERR_INVALID,
                     m.slots ? "the decode worker reserved blocks for a KV budget; this prefill worker evicts nothing "
                               "(kv.evict = none)"
                             : "this prefill worker evicts (kv.evict = %s); the decode worker reserved every prompt "
                               "block (kv.evict differs between the workers)",
                     fy_evict_policy_name(ev.policy));
    if (!fy_msgr_ok(r)) {
        fy_node_error(n, rid, m.id, r->status, "bad prefill: %s", r->err);
        fy_wire_prefill_clear(&m);
        return;
    }
    uint64_t id = m.id;
    pjob_t *j = fy_calloc(1, sizeof(*j));
    if (!j) {
        fy_wire_prefill_clear(&m);
        fy_node_error(n, rid, id, FY_ERR_NOMEM, "out of memory for a prefill job");
        return;
    }
    int32_t *prompt = m.tokens, n_prompt = m.n_tokens; /* freed once the engine copied them */
    j->dst = m.blocks;                                 /* the job keeps them */
    m.tokens = m.blocks = NULL;
    j->p = p;
    j->id = id;
    j->attempt = m.attempt;
    j->n_prompt = n_prompt;
    j->first_block = m.first_block;
    j->n_dst = m.n_blocks;
    j->slots = m.slots;
    j->t_recv = fy_now_s();
    /* one token: the decode worker decides what it means (stop strings, end
     * of turn, stop token ids); progress events drive the transfer */
    fy_request_ctx_t ctx = {.progress = true, .first_only = true};
    fy_node_ns(n, m.tenant, &ctx.ns);
    fy_status_t st = fy_kvm_seq_init(kvm, &j->hold, n_prompt + 1, &ctx.ns);
    if (!st)
        st = fy_xgroup_job_begin(fy_node_xfer(n), m.target, m.target_len, j->t_recv + m.deadline_s, on_xfer_done, j,
                                 &j->xj);
    if (st) {
        fy_kvm_seq_deinit(&j->hold);
        job_error(j, st, "cannot start the kv transfer: %s", fy_status_str(st));
        fy_free(prompt);
        fy_free(j->dst);
        fy_free(j);
        return;
    }
    j->next = p->jobs;
    if (p->jobs) p->jobs->prev = j;
    p->jobs = j;
    p->n_jobs++;
    open_add(p, j);
    st = fy_engine_submit(fy_node_engine(n), prompt, n_prompt, &m.gen, &ctx, on_event, j, &j->engine_id);
    fy_free(prompt);
    if (st) {
        /* no engine events will come: end the transfer; its completion frees the job */
        j->engine_status = st;
        snprintf(j->engine_msg, sizeof(j->engine_msg), "%s",
                 st == FY_ERR_OVERLOADED ? "overloaded: too many prompts waiting"
                 : st == FY_ERR_INVALID && *fy_engine_refusal()
                     ? fy_engine_refusal() /* the engine's reason: the prompt's length, a grammar */
                     : fy_status_str(st));
        j->engine_done = true;
        job_close_xfer(j, false);
        return;
    }
    fy_wire_ack_t a = {.ev = fy_node_ev(n, rid, id)};
    fy_msgw_t w;
    fy_wire_ev_accepted_write(&w, &a);
    fy_node_push(n, &w);
}

/* The router renewed the lease of a job's target blocks: its transfer may
 * run until deadline_s from now (nng thread: see prefill_t.open).  A job
 * whose transfer is already closed has put its last block. */
static bool p_direct(fy_node_t *n, void *state, const char *type, fy_msgr_t *r)
{
    prefill_t *p = state;
    fy_wire_extend_t m;
    fy_wire_extend_init(&m);
    if (!fy_wire_extend_is(r)) return false;
    if (fy_wire_extend_read(r, NULL, &m)) return false; /* the engine thread's pass reports it */
    double until = fy_now_s() + m.deadline_s;
    pthread_mutex_lock(&p->open_mu);
    for (pjob_t *j = p->open; j; j = j->xnext)
        if (j->id == m.id && j->attempt == m.attempt) fy_xgroup_job_extend(j->xj, until);
    pthread_mutex_unlock(&p->open_mu);
    return true;
}

/* Every heartbeat (worker.heartbeat) while there are jobs, the router hears which ones
 * this worker holds and how far each prompt got: that renews their leases
 * at the decode workers (router.c, "Lease renewal").  Sent from the engine
 * thread's tick, so a stalled engine renews nothing. */
static void p_tick(fy_node_t *n, void *state, double now)
{
    prefill_t *p = state;
    if (!p->jobs || now - p->last_progress < fy_node_heartbeat(n)) return;
    p->last_progress = now;
    int32_t k = 0;
    for (pjob_t *j = p->jobs; j; j = j->next) k += !j->cancelled;
    if (!k) return;
    uint64_t *ids = fy_malloc((size_t)k * sizeof(uint64_t));
    int32_t *att = fy_malloc((size_t)k * sizeof(int32_t)), *done = fy_malloc((size_t)k * sizeof(int32_t));
    if (ids && att && done) {
        int32_t i = 0;
        for (pjob_t *j = p->jobs; j; j = j->next) {
            if (j->cancelled) continue;
            ids[i] = j->id;
            att[i] = (int32_t)j->attempt;
            done[i++] = j->computed;
        }
        fy_wire_progress_t m = {.ev = fy_node_ev(n, 0, 0),
                                .ids = ids,
                                .n_ids = k,
                                .attempts = att,
                                .n_attempts = k,
                                .computed = done,
                                .n_computed = k};
        fy_msgw_t w;
        fy_wire_progress_write(&w, &m);
        fy_node_push(n, &w);
    }
    fy_free(ids);
    fy_free(att);
    fy_free(done);
}

static void cmd_cancel(prefill_t *p, fy_msgr_t *r, uint64_t rid)
{
    fy_wire_release_t m;
    fy_wire_cmd_cancel_init(&m);
    if (fy_wire_cmd_cancel_read(r, NULL, &m)) {
        fy_node_error(p->n, rid, 0, r->status, "bad cancel: %s", r->err);
        return;
    }
    uint64_t id = m.id;
    for (pjob_t *j = p->jobs; j; j = j->next) { /* every try of it */
        if (j->id != id || j->cancelled) continue;
        j->cancelled = true; /* nothing more is reported for it */
        if (!j->engine_done) fy_engine_cancel(fy_node_engine(p->n), j->engine_id);
    }
}

/* a router is gone (cluster.etcd): its jobs end as a cancel would end them */
static void p_forget(fy_node_t *n, void *state, uint32_t tag)
{
    prefill_t *p = state;
    int k = 0;
    for (pjob_t *j = p->jobs; j; j = j->next) {
        if (fy_node_id_tag(j->id) != tag || j->cancelled) continue;
        j->cancelled = true;
        if (!j->engine_done) fy_engine_cancel(fy_node_engine(n), j->engine_id);
        k++;
    }
    if (k) fy_warn("its router is gone: %d prefill job(s) cancelled", k);
}

/* ---- the role ---------------------------------------------------------------------------------- */

static fy_status_t p_start(fy_node_t *n, void **state_p)
{
    prefill_t *p = fy_calloc(1, sizeof(*p));
    if (!p) return FY_ERR_NOMEM;
    p->n = n;
    pthread_mutex_init(&p->open_mu, NULL);
    p->stage = fy_node_stage(n);
    if (p->stage) fy_xstage_set_wake(p->stage, stage_wake, p);
    fy_metrics_t *reg = fy_node_metrics(n);
    fy_status_t st = fy_metrics_histogram(
        reg, "ferry:prefill_time_to_first_token_seconds",
        "On a prefill worker: from a job's submission to its engine to the first token (queue and prompt compute; "
        "the KV transfer's tail and the router's hops are not in it).",
        NULL, fy_metrics_ttft_buckets, fy_metrics_n_ttft_buckets, &p->m.ttft);
    if (!st)
        st = fy_metrics_histogram(reg, "ferry:prefill_queue_time_seconds",
                                  "From a job's submission to its engine to its first scheduled step.", NULL,
                                  fy_metrics_e2e_buckets, fy_metrics_n_e2e_buckets, &p->m.queue);
    if (!st)
        st = fy_metrics_histogram(reg, "ferry:prefill_job_latency_seconds",
                                  "On a prefill worker: from the prefill command's arrival to the job's report "
                                  "(prefilled or failed), KV transfer included.",
                                  NULL, fy_metrics_e2e_buckets, fy_metrics_n_e2e_buckets, &p->m.e2e);
    if (!st)
        st = fy_metrics_histogram(reg, "ferry:kv_transfer_seconds",
                                  "Per successful job: from its first KV put to the flush that confirms every byte "
                                  "is in the decode worker's cache.",
                                  NULL, fy_metrics_ttft_buckets, fy_metrics_n_ttft_buckets, &p->m.xfer_s);
    const char *help = "Prefill jobs ended, by outcome.";
    if (!st)
        st = fy_metrics_counter(reg, "ferry:prefill_jobs_total", help, (const char *const[]){"outcome", "ok", NULL},
                                &p->m.ok);
    if (!st)
        st = fy_metrics_counter(reg, "ferry:prefill_jobs_total", help, (const char *const[]){"outcome", "failed", NULL},
                                &p->m.failed);
    if (!st)
        st = fy_metrics_counter(reg, "ferry:prefill_jobs_total", help,
                                (const char *const[]){"outcome", "cancelled", NULL}, &p->m.cancelled);
    if (st) {
        pthread_mutex_destroy(&p->open_mu);
        fy_free(p);
        return st;
    }
    *state_p = p;
    return FY_OK;
}

static void p_command(fy_node_t *n, void *state, const char *type, fy_msgr_t *r, uint64_t rid)
{
    prefill_t *p = state;
    if (fy_wire_prefill_is(r))
        cmd_prefill(p, r, rid);
    else if (fy_wire_cmd_cancel_is(r))
        cmd_cancel(p, r, rid);
    else if (fy_wire_extend_is(r)) { /* only when p_direct could not read it */
        fy_wire_extend_t m;
        fy_wire_extend_init(&m);
        if (fy_wire_extend_read(r, NULL, &m)) fy_node_error(n, rid, 0, r->status, "bad extend: %s", r->err);
    } else
        fy_node_error(n, rid, 0, FY_ERR_UNSUPPORTED, "unknown command '%s' for a prefill worker", type);
}

static void p_load(fy_node_t *n, void *state, fy_wire_load_t *m)
{
    prefill_t *p = state;
    m->has_prefill = true;
    m->jobs = p->n_jobs;
    m->jobs_done = p->done;
    m->jobs_failed = p->failed;
    m->bytes_shipped = p->bytes;
}

/* Every job has ended by now: the transfer engine (destroyed first) ended
 * their transfers, the engine (destroyed next) their requests. */
static void p_destroy(void *state)
{
    prefill_t *p = state;
    if (p->jobs) fy_error("%d prefill jobs outlived shutdown", p->n_jobs);
    pthread_mutex_destroy(&p->open_mu);
    fy_free(p);
}

const fy_node_role_t fy_prefill_role = {
    .name = "prefill",
    .start = p_start,
    .command = p_command,
    .direct = p_direct,
    .tick = p_tick,
    .load = p_load,
    .forget = p_forget,
    .destroy = p_destroy,
};

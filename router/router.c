/*
 * router.c - placement, the request state machine, health, client polls
 * (see router.h).
 *
 * A request's life:
 *
 *   QUEUED --reserve--> RESERVING --reserved--> PREFILLING --prefilled--> ADOPTING --adopted--> DECODING --finish--> DONE
 *
 * QUEUED: waiting for a decode worker that can admit it and a prefill
 * worker.  RESERVING: the decode worker is asked for a lease on blocks.
 * PREFILLING: the prefill worker computes the prompt and puts its KV into
 * the leased blocks.  ADOPTING: the decode worker turns the lease into a
 * running sequence.  DECODING: tokens stream in.  Any failure ends in DONE
 * with an error that names what failed, after telling the workers to let
 * go (release at the decode worker, cancel at the prefill worker); a
 * failure on the prefill side (worker down, its error, its deadline, the
 * lease expiring) is retried once from QUEUED on another prefill worker.
 *
 * Threads: nng's callbacks (client calls, worker events) and one
 * housekeeping thread (timeouts, health, placement every 10 ms) all work
 * under one mutex; nothing under it blocks (pushes never block, replies
 * are asynchronous).
 */
#include "router/router_int.h"

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "kv/bloom.h"
#include "common/clock.h"
#include "common/cluster.h"
#include "rpc/etcd.h"
#include "kv/evict.h"
#include "common/genspec.h"
#include "grammar/grammar.h"
#include "kv/kv.h"
#include "common/log.h"
#include "common/mem.h"
#include "common/metrics.h"
#include "model/model.h"
#include "common/msg.h"
#include "model/prompt.h"
#include "rpc/rpc.h"
#include "model/tokenizer.h"
#include "common/wire.h"
#include "router/workq.h"

#define MAX_WORKERS 64
#define N_BUCKETS 1024
#define MAX_PROMPT_TOKENS 32768

typedef enum rstate {
    RQ_QUEUED = 0,
    RQ_RESERVING,
    RQ_PREFILLING,
    RQ_ADOPTING,
    RQ_DECODING,
    RQ_DONE,
} rstate_t;

static const char *const STATE_NAMES[] = {"queued", "reserving", "prefilling", "adopting", "decoding", "done"};

typedef enum wrole { W_PREFILL = 0, W_DECODE } wrole_t;

/* A worker's circuit breaker: a command it let time out opens it (no new
 * requests for a while), then one trial request goes there (half-open)
 * and its answer closes it, its timeout opens it again for longer. */
typedef enum wbreaker { BR_CLOSED = 0, BR_OPEN, BR_HALF_OPEN } wbreaker_t;

typedef struct worker {
    bool used; /* a free slot (never used, or forgotten) is not */
    char name[64];
    wrole_t role;
    uint64_t inc;
    char listen[256];
    fy_push_t *push;
    bool up, incompatible;
    bool unlisted; /* cluster.etcd: up, but its record is not in etcd now: no new requests */
    double last_seen;
    /* the last load report */
    int32_t running, waiting, max_seqs, total_blocks, admittable, capacity, leases;
    int32_t ctx; /* the longest sequence it holds (its ROLE.ctx; an older worker's: the model's) */
    uint8_t *bloom;
    uint32_t bloom_bytes;
    /* the router's own view since that report */
    int32_t assigned;         /* requests placed here and not yet done */
    int32_t blocks_since;     /* decode: blocks reserved since the last report */
    bool full;                /* decode: refused a reservation; skip until the next report */
    int64_t pending_tokens;   /* prefill: prompt tokens of jobs sent, not yet finished */
    int32_t ranks;            /* tp * pp of its rank group (1: one process) */
    char out_of_service[160]; /* its own word that it serves nothing (a rank died); "" when it serves */
    wbreaker_t breaker;
    double breaker_until; /* open: half-open from then */
    double breaker_wait;  /* how long it stayed open the last time */
    uint64_t trial;       /* half-open: the request placed there to try it (0: none yet) */
    uint64_t n_loads;     /* load reports taken: its engine thread, which answers commands, ticks */
} worker_t;

#define MAX_TENANT_SERIES 64
/* Tokens of one engine step held for its last (decode.spec_k is at most
 * 16: a run is at most 17); a longer run goes out in pieces. */
#define MAX_HELD_TOKENS 64

typedef struct rreq {
    uint64_t id;
    char tenant[64];
    int32_t *prompt;
    int32_t n_prompt;
    fy_kv_hash_t *hashes; /* [n_prompt / block_size] the prompt's block names */
    int32_t n_hashes;
    fy_genspec_t gen;
    rstate_t state;
    int dw, pw, excluded_pw, excluded_dw; /* excluded: the worker of the last failed try */
    uint64_t d_inc, p_inc;
    uint64_t lease;
    /* the lease the decode worker granted (its decode.max_lease caps the
     * router's), its end as the router knows it for sure (the worker's clock
     * started no earlier than the command that set it), the renewal in
     * flight, and the prompt tokens the prefill worker last reported */
    double lease_s, lease_end, renew_sent;
    uint64_t renew_rid;
    int32_t p_computed;
    int32_t first_block, n_dst, need_blocks, cached_d, cached_p;
    int32_t slots; /* a KV budget's reservation (the decode worker's "slots"): passed on to the prefill worker */
    int32_t *dst;
    void *target;
    size_t target_len;
    uint64_t rid;
    uint64_t rid_loads; /* the load reports of the worker rid went to, when it went */
    double rid_deadline, prefill_deadline, deadline;
    int retries;
    /* timings (router clock) and the prefill worker's */
    double t_arrive, t_reserve, t_reserved, t_prefill, t_prefilled, t_first, t_last, t_done, last_poll;
    /* the last n_held tokens (an engine step's run, until its last: a
     * token event's more) are not shown yet, nor the text from held_text */
    int32_t n_held;
    size_t held_text;
    double p_queue, p_compute, p_tail, p_transfer;
    int64_t bytes;
    /* output */
    int32_t *out;
    int32_t n_out, cap_out;
    char *text;
    size_t text_len, text_cap;
    bool done, done_seen;
    fy_status_t err;
    char err_msg[256];
    char finish[16];
    float *lps;      /* [cap_out] each token's logprob, when asked for */
    int32_t *tops;   /* [cap_out * gen.top_logprobs] each token's alternatives (top_logprobs) */
    float *top_lps;  /* [cap_out * gen.top_logprobs] their logprobs */
    uint8_t *n_tops; /* [cap_out] how many each has */
    /* prompt_logprobs: prompt token i's logprob and rank (i >= 1), and
     * gen.prompt_top alternatives ([n_prompt * prompt_top]); plp_got[i]:
     * token i's have arrived, plp_have of them */
    float *plp;
    int32_t *plp_rank, *plp_ids;
    float *plp_tlps;
    uint8_t *plp_got;
    int32_t plp_have;
    /* who made it on the client port (0: the HTTP front door): only that
     * client may poll or cancel it */
    uint64_t owner_inc;
    char owner[64];
    /* an in-process watcher (the HTTP front door), called under the lock */
    fy_router_watch_fn watch;
    void *watch_arg;
    /* a client's poll held until there is something new */
    fy_rpc_call_t *poll;
    int32_t poll_from;
    size_t poll_text;
    double poll_until;
    struct rreq *hnext;       /* hash bucket */
    struct rreq *prev, *next; /* all requests */
} rreq_t;

typedef struct router {
    pthread_mutex_t mu;
    fy_router_conf_t conf; /* read once at start (router_config.h); its secrets wiped once used */
    /* settings */
    double last_tick; /* housekeeping thread: its last tick (a gap: the router did not run) */
    double health_timeout, request_timeout, prefill_timeout, command_timeout, lease_s, client_timeout, drain_timeout;
    double breaker_cooldown, forget_after;
    int32_t max_queue, max_retries;
    int64_t prefill_queue_tokens;
    double prefix_weight;
    bool colocated; /* no prefill workers: decode workers run whole requests */
    /* the model, for tokenizing and naming prefix blocks */
    fy_model_t *model;
    char model_id[64];
    fy_kv_hasher_t *hasher;
    fy_kv_layout_t lay;
    int32_t vocab, max_ctx;
    int32_t pool_ctx;             /* fy_router_pool_ctx's last answer from workers up (the model's until one is) */
    size_t max_prompt_bytes;      /* text longer than this cannot fit max_ctx (0: no bound; workq.h) */
    fy_workq_t *parse;            /* tokenizing and parsing of clients' prompts, off nng's and HTTP's threads */
    fy_grammar_cache_t *grammars; /* nng clients' structured outputs, compiled as the workers will (thread-safe) */
    int32_t step;                 /* decode.max_batch_tokens: a sliding KV group's bound (fy_kv_blocks_held) */
    fy_evict_params_t evict;      /* the deployment's KV budget (kv.evict): the decode workers' admission bound */
    /* sockets, and the credentials they carry */
    fy_env_auth_t auth;
    fy_rpc_server_t *srv;
    fy_pull_t *events;
    const fy_router_door_t *door; /* NULL: no front door */
    void *door_h;
    char listen[256], events_url[256];
    /* cluster.etcd: this router's record and the workers etcd lists (the
     * membership thread's last round that reached etcd); a worker not
     * listed gets no requests, and its load reports are not taken */
    bool etcd;
    fy_membership_t *members;
    char name[FY_ENV_NAME_MAX + 1];
    uint64_t inc;
    uint32_t tag; /* the high 32 bits of this router's request ids */
    char (*listed)[64];
    int n_listed;
    bool listed_once;
    /* state */
    worker_t workers[MAX_WORKERS];
    int n_workers;
    rreq_t *buckets[N_BUCKETS];
    rreq_t *all;
    int32_t n_reqs, n_queued;
    uint64_t next_id, next_rid;
    pthread_t hk;
    bool hk_on, stop;
    bool draining; /* shutting down: new requests refused, running ones finish */
    /* figures */
    uint64_t accepted, refused, completed, failed, retried, bad_events, renewals, breaker_trips, forgotten;
    fy_metrics_t *reg;
    struct {
        fy_metric_t *running, *waiting, *prefill_up, *decode_up, *generation, *retries, *bad_events;
        fy_metric_t *renewals;
        fy_metric_t *breaker_open[2], *breaker_trips; /* [wrole_t] */
        fy_metric_t *forgotten;
        fy_metric_t *ttft, *itl, *e2e, *queue, *xfer_s, *xfer_bytes;
        fy_metric_t *prompt_len, *gen_len, *max_gen, *prefill_s, *decode_s, *inference_s;
        fy_metric_t *success[4];                   /* length, stop, eos, context */
        fy_metric_t *failure[6];                   /* cancelled, timeout, peer, invalid, overloaded, other */
        fy_metric_t *refused[2];                   /* overloaded, invalid */
        fy_metric_t *ctl_refused[FY_ENV_N_FAULTS]; /* control messages refused, by fault (0 unused) */
        /* prompt and cached tokens by tenant, registered when a tenant is
         * first seen (tenants come from the key file, never from clients;
         * past MAX_TENANT_SERIES they share tenant="_other") */
        struct {
            char name[64];
            fy_metric_t *prompt, *cached;
        } tenant[MAX_TENANT_SERIES + 1];
        int n_tenants;
    } m;
} router_t;

/* ---- requests ------------------------------------------------------------------------------------ */

/* What clients may see of q's output: less a step's run being held. */
static int32_t vis_out(const rreq_t *q) { return q->n_out - q->n_held; }
static size_t vis_text(const rreq_t *q) { return q->n_held ? q->held_text : q->text_len; }

static rreq_t *req_find(router_t *R, uint64_t id)
{
    for (rreq_t *q = R->buckets[id % N_BUCKETS]; q; q = q->hnext)
        if (q->id == id) return q;
    return NULL;
}

static void req_free(router_t *R, rreq_t *q)
{
    rreq_t **b = &R->buckets[q->id % N_BUCKETS];
    while (*b != q) b = &(*b)->hnext;
    *b = q->hnext;
    if (q->prev)
        q->prev->next = q->next;
    else
        R->all = q->next;
    if (q->next) q->next->prev = q->prev;
    R->n_reqs--;
    if (q->state == RQ_QUEUED) R->n_queued--;
    fy_free(q->prompt);
    fy_free(q->hashes);
    fy_free(q->dst);
    fy_free(q->target);
    fy_free(q->out);
    fy_free(q->lps);
    fy_free(q->tops);
    fy_free(q->top_lps);
    fy_free(q->n_tops);
    fy_free(q->plp);
    fy_free(q->plp_rank);
    fy_free(q->plp_ids);
    fy_free(q->plp_tlps);
    fy_free(q->plp_got);
    fy_free(q->text);
    fy_free(q);
}

static void set_state(router_t *R, rreq_t *q, rstate_t s)
{
    if (q->state == RQ_QUEUED) R->n_queued--;
    if (s == RQ_QUEUED) R->n_queued++;
    q->state = s;
}

static bool text_append(rreq_t *q, const char *s, size_t n)
{
    if (q->text_len + n + 1 > q->text_cap) {
        size_t cap = (q->text_len + n + 1) * 2;
        char *t = fy_realloc(q->text, cap);
        if (!t) return false;
        q->text = t;
        q->text_cap = cap;
    }
    memcpy(q->text + q->text_len, s, n);
    q->text_len += n;
    q->text[q->text_len] = 0;
    return true;
}

/* ---- commands to workers --------------------------------------------------------------------------- */

/* A command's header for worker wk (rid 0: no reply expected). */
static fy_wire_cmd_t cmd_to(const worker_t *wk, uint64_t rid) { return (fy_wire_cmd_t){.to = wk->inc, .rid = rid}; }

static void cmd_send(worker_t *wk, fy_msgw_t *w)
{
    if (!wk->push || fy_push_msgw(wk->push, w) != FY_OK)
        fy_warn("command to %s not sent (its queue is full or it is gone)", wk->name);
}

/* Tells the workers holding anything of q to let go. */
static void let_go(router_t *R, rreq_t *q)
{
    fy_msgw_t w;
    if (q->dw >= 0 && q->state >= RQ_RESERVING && q->state <= RQ_DECODING) {
        worker_t *d = &R->workers[q->dw];
        if (d->inc == q->d_inc) {
            fy_wire_release_t m = {.cmd = cmd_to(d, 0), .id = q->id};
            fy_wire_release_write(&w, &m);
            cmd_send(d, &w);
        }
        d->assigned--;
    }
    if (q->pw >= 0 && q->state == RQ_PREFILLING) {
        worker_t *p = &R->workers[q->pw];
        if (p->inc == q->p_inc) {
            fy_wire_release_t m = {.cmd = cmd_to(p, 0), .id = q->id};
            fy_wire_cmd_cancel_write(&w, &m);
            cmd_send(p, &w);
        }
        p->pending_tokens -= q->n_prompt;
    }
    q->dw = q->pw = -1;
    q->rid = 0;
}

static void wake_poll(router_t *R, rreq_t *q);

static void finish_req(router_t *R, rreq_t *q, fy_status_t err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The prompt and cached-token series of a tenant (router lock held). */
static int tenant_series(router_t *R, const char *tenant)
{
    int i = 0;
    while (i < R->m.n_tenants && strcmp(R->m.tenant[i].name, tenant)) i++;
    if (i < R->m.n_tenants) return i;
    if (i == MAX_TENANT_SERIES) { /* full: the rest count together */
        tenant = "_other";
        while (i < R->m.n_tenants && strcmp(R->m.tenant[i].name, tenant)) i++;
        if (i < R->m.n_tenants) return i;
    }
    const char *l[] = {"tenant", tenant, NULL};
    snprintf(R->m.tenant[i].name, sizeof(R->m.tenant[i].name), "%s", tenant);
    /* a failure leaves a series NULL: it counts nothing, the request goes on */
    (void)fy_metrics_counter(R->reg, "ferry:prompt_tokens_total", "Prompt tokens of accepted requests, by tenant", l,
                             &R->m.tenant[i].prompt);
    (void)fy_metrics_counter(R->reg, "ferry:prompt_tokens_cached_total",
                             "Prompt tokens found in a worker's prefix cache, by tenant", l, &R->m.tenant[i].cached);
    R->m.n_tenants = i + 1;
    return i;
}

/* The request ends: with an error (err != FY_OK) or finished (finish set). */
static void finish_req(router_t *R, rreq_t *q, fy_status_t err, const char *fmt, ...)
{
    if (q->state == RQ_DONE) return;
    if (err != FY_OK) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(q->err_msg, sizeof(q->err_msg), fmt, ap);
        va_end(ap);
        q->err = err;
        fy_warn("request %llu: %s", (unsigned long long)q->id, q->err_msg);
        let_go(R, q);
        R->failed++;
    } else {
        if (q->dw >= 0) R->workers[q->dw].assigned--;
        q->dw = q->pw = -1;
        R->completed++;
    }
    set_state(R, q, RQ_DONE);
    q->done = true;
    q->n_held = 0; /* the end shows what a run held */
    q->t_done = fy_now_s();
    fy_metric_observe(R->m.e2e, q->t_done - q->t_arrive);
    /* vLLM's per-request phases, on the router's clock: queue (arrival to
     * the last placement), prefill (placement to the first token),
     * decode (first token to the end), inference (the two) */
    if (q->t_reserve > 0) fy_metric_observe(R->m.queue, q->t_reserve - q->t_arrive);
    if (err == FY_OK) {
        fy_metric_observe(R->m.prompt_len, q->n_prompt);
        fy_metric_observe(R->m.gen_len, q->n_out);
        if (!q->watch) fy_metric_observe(R->m.max_gen, q->n_out); /* a front door's: fy_router_observe_max_generation */
        if (q->t_reserve > 0 && q->t_first > 0) {
            fy_metric_observe(R->m.prefill_s, q->t_first - q->t_reserve);
            fy_metric_observe(R->m.decode_s, q->t_done - q->t_first);
            fy_metric_observe(R->m.inference_s, q->t_done - q->t_reserve);
        }
    }
    if (err == FY_OK) {
        static const char *const reasons[] = {"length", "stop", "eos", "context"};
        int k = 0;
        while (k < 3 && strcmp(q->finish, reasons[k])) k++;
        fy_metric_inc(R->m.success[k]);
    } else {
        int k = err == FY_ERR_CANCELLED    ? 0
                : err == FY_ERR_TIMEOUT    ? 1
                : err == FY_ERR_PEER       ? 2
                : err == FY_ERR_INVALID    ? 3
                : err == FY_ERR_OVERLOADED ? 4
                                           : 5;
        fy_metric_inc(R->m.failure[k]);
    }
    wake_poll(R, q);
}

/* A failure on the prefill side, or a decode worker that let a command
 * time out before any token reached the client (decode_side: its open
 * breaker keeps the next try off it): once more from the queue, or the
 * end.  Never after a token was delivered: the client has seen them. */
static void retry_side(router_t *R, rreq_t *q, fy_status_t err, const char *why, bool decode_side)
{
    if (q->retries < R->max_retries && q->deadline > fy_now_s() && (!decode_side || q->n_out == 0)) {
        fy_warn("request %llu: %s; retrying on another %s worker", (unsigned long long)q->id, why,
                decode_side ? "decode" : "prefill");
        int failed_pw = q->pw, failed_dw = q->dw;
        let_go(R, q);
        q->retries++;
        R->retried++;
        fy_metric_inc(R->m.retries);
        q->excluded_pw = decode_side ? -1 : failed_pw;
        q->excluded_dw = decode_side ? failed_dw : -1;
        q->lease = 0;
        set_state(R, q, RQ_QUEUED);
        return;
    }
    finish_req(R, q, err, "%s%s", why, q->retries ? " (after a retry)" : "");
}

static void retry_or_fail(router_t *R, rreq_t *q, fy_status_t err, const char *why)
{
    retry_side(R, q, err, why, false);
}

/* ---- placement ---------------------------------------------------------------------------------------- */

/* The blocks a decode worker promises q (fy_kvm_blocks_for without a
 * cached prefix): every block of the global KV groups, a window's of the
 * sliding ones. */
static int32_t blocks_for(const router_t *R, const rreq_t *q)
{
    int32_t gen = fy_genspec_max_tokens(&q->gen, q->n_prompt, R->max_ctx);
    int64_t total = (int64_t)q->n_prompt + (gen > 0 ? gen : 0);
    int64_t n = fy_kv_blocks_held(&R->lay, total, R->step);
    /* a KV budget holds at most its blocks in every group (the engine's
     * fy_kvm_blocks_for_capped); a budget the deployment refuses is the
     * worker's to refuse, counted here as the deployment's */
    fy_evict_params_t ev = R->evict;
    if (q->gen.kv_budget > 0 && fy_evict_budget(&R->evict) >= q->gen.kv_budget && R->evict.policy != FY_EVICT_NONE)
        (void)fy_evict_for_budget(&R->evict, q->gen.kv_budget, &ev);
    if (ev.policy != FY_EVICT_NONE) {
        int64_t cap = (int64_t)fy_evict_max_blocks(&ev, R->lay.block_size, R->step) * R->lay.n_groups;
        if (cap < n) n = cap;
    }
    return n > INT32_MAX ? INT32_MAX : (int32_t)n;
}

/* Up, compatible, listed, of the role, and not shut off by its breaker
 * (half-open: until its trial request is placed). */
static bool usable(const worker_t *w, wrole_t role)
{
    return w->used && w->up && !w->incompatible && !w->unlisted && w->role == role && w->push &&
           w->breaker != BR_OPEN && !(w->breaker == BR_HALF_OPEN && w->trial);
}

/* Worker wi let a command time out while its engine thread went on
 * ticking: its breaker opens (again, for twice as long, when this was its
 * trial), up to 16 cooldowns.  A worker in one long engine step (it sends
 * no load report then, only "alive") is slow, not deaf: no breaker. */
static void breaker_trip(router_t *R, int wi, double now)
{
    worker_t *w = &R->workers[wi];
    double wait = R->breaker_cooldown;
    if (w->breaker == BR_HALF_OPEN && w->breaker_wait > 0)
        wait = w->breaker_wait * 2 < R->breaker_cooldown * 16 ? w->breaker_wait * 2 : R->breaker_cooldown * 16;
    if (w->breaker != BR_OPEN) {
        R->breaker_trips++;
        fy_metric_inc(R->m.breaker_trips);
        fy_warn("worker %s let a command time out: no new requests for %.1f s, then one trial (circuit breaker open)",
                w->name, wait);
    }
    w->breaker = BR_OPEN;
    w->breaker_wait = wait;
    w->breaker_until = now + wait;
    w->trial = 0;
}

/* An answer to a command from worker w: it is listening again. */
static void breaker_answer(worker_t *w)
{
    if (w->breaker == BR_CLOSED) return;
    fy_info("worker %s answers commands again (circuit breaker closed)", w->name);
    w->breaker = BR_CLOSED;
    w->breaker_wait = 0;
    w->trial = 0;
}

/* A request placed on worker w: the trial, when its breaker is half-open. */
static void breaker_placed(worker_t *w, const rreq_t *q)
{
    if (w->breaker == BR_HALF_OPEN && !w->trial) w->trial = q->id;
}

/* The least-loaded decode worker that looks able to admit q (not the one
 * its last try timed out on, unless it is the only one); -1 if none. */
static int pick_decode(router_t *R, const rreq_t *q)
{
    int best = -1;
    double best_load = 1e300;
    bool other = false;
    for (int i = 0; i < R->n_workers && q->excluded_dw >= 0; i++)
        other |= i != q->excluded_dw && usable(&R->workers[i], W_DECODE);
    for (int i = 0; i < R->n_workers; i++) {
        worker_t *w = &R->workers[i];
        if (!usable(w, W_DECODE) || w->full || (i == q->excluded_dw && other)) continue;
        if (w->assigned >= w->max_seqs) continue;
        if (q->need_blocks > w->admittable - w->blocks_since) continue;
        double load = (double)w->assigned / (double)(w->max_seqs > 0 ? w->max_seqs : 1) -
                      1e-6 * (double)(w->admittable - w->blocks_since);
        if (load < best_load) best_load = load, best = i;
    }
    return best;
}

/* Leading prompt blocks a prefill worker's digest says it holds. */
static int32_t cached_blocks(const worker_t *w, const rreq_t *q)
{
    if (!w->bloom) return 0;
    int32_t n = 0;
    while (n < q->n_hashes && fy_bloom_has(w->bloom, w->bloom_bytes, &q->hashes[n])) n++;
    return n;
}

/* The prefill worker with the least work to do for q: blocks it would
 * compute plus (weighted) the prompt blocks already queued on it. */
static int pick_prefill(router_t *R, const rreq_t *q, int32_t *cached_p)
{
    int best = -1;
    double best_cost = 1e300;
    int32_t bs = R->lay.block_size, blocks = (q->n_prompt + bs - 1) / bs;
    for (int i = 0; i < R->n_workers; i++) {
        worker_t *w = &R->workers[i];
        if (!usable(w, W_PREFILL)) continue;
        if (i == q->excluded_pw && R->n_workers > 1) {
            /* the one that just failed: only when nothing else is up */
            bool other = false;
            for (int k = 0; k < R->n_workers; k++) other |= k != i && usable(&R->workers[k], W_PREFILL);
            if (other) continue;
        }
        int32_t cached = cached_blocks(w, q);
        double cost = (double)(blocks - cached) + R->prefix_weight * (double)w->pending_tokens / bs;
        if (cost < best_cost) best_cost = cost, best = i, *cached_p = cached;
    }
    return best;
}

/*
 * Places q on decode worker di: "reserve" (a lease on blocks for a prompt
 * a prefill worker will fill), or in colocated mode "generate" (the worker
 * runs the whole request and answers "adopted" or an error).
 */
static void send_to_decode(router_t *R, rreq_t *q, int di)
{
    worker_t *d = &R->workers[di];
    fy_msgw_t w;
    q->rid = ++R->next_rid;
    q->rid_loads = d->n_loads;
    q->rid_deadline = fy_now_s() + R->command_timeout;
    fy_wire_reserve_t m = {
        .cmd = cmd_to(d, q->rid), .id = q->id, .tokens = q->prompt, .n_tokens = q->n_prompt, .gen = q->gen};
    snprintf(m.tenant, sizeof(m.tenant), "%s", q->tenant);
    if (R->colocated) {
        fy_wire_cmd_generate_write(&w, &m);
    } else {
        m.lease_s = R->lease_s;
        fy_wire_reserve_write(&w, &m);
    }
    q->lease_s = R->lease_s;
    cmd_send(d, &w);
    breaker_placed(d, q);
    q->dw = di;
    q->d_inc = d->inc;
    d->assigned++;
    d->blocks_since += q->need_blocks;
    q->t_reserve = fy_now_s();
    set_state(R, q, R->colocated ? RQ_ADOPTING : RQ_RESERVING);
}

/* Places queued requests, by priority then arrival, while workers can take them. */
static void pump(router_t *R)
{
    if (!R->n_queued) return;
    bool any_prefill = false;
    for (int i = 0; i < R->n_workers; i++) any_prefill |= usable(&R->workers[i], W_PREFILL);
    if (!any_prefill && !R->colocated) return;
    for (;;) {
        rreq_t *best = NULL;
        for (rreq_t *q = R->all; q; q = q->next) {
            if (q->state != RQ_QUEUED || q->need_blocks < 0) continue;
            if (!best || q->gen.priority > best->gen.priority ||
                (q->gen.priority == best->gen.priority && q->id < best->id))
                best = q;
        }
        if (!best) return;
        /* a request no worker could ever hold would wait forever */
        int32_t largest = -1, largest_p = -1, bs = R->lay.block_size;
        for (int i = 0; i < R->n_workers; i++) {
            const worker_t *w = &R->workers[i];
            if (usable(w, W_DECODE) && w->capacity > largest) largest = w->capacity;
            if (usable(w, W_PREFILL) && w->capacity > largest_p) largest_p = w->capacity;
        }
        if (largest < 0) return; /* no decode worker up yet */
        if (!R->colocated && (best->n_prompt + 1 + bs - 1) / bs > largest_p) {
            finish_req(R, best, FY_ERR_INVALID,
                       "the prompt of %d tokens needs %d kv blocks; the largest prefill worker holds %d",
                       best->n_prompt, (best->n_prompt + 1 + bs - 1) / bs, largest_p);
            continue;
        }
        if (best->need_blocks > largest) {
            finish_req(R, best, FY_ERR_INVALID,
                       "the request needs %d kv blocks (%d prompt and %d new tokens); the largest decode worker "
                       "holds %d",
                       best->need_blocks, best->n_prompt, best->gen.max_tokens, largest);
            continue;
        }
        /* a lease's clock runs from the reservation: hold requests here, not
         * in a prefill worker's queue, until one has room for the prompt */
        bool room = R->colocated;
        for (int i = 0; i < R->n_workers && !room; i++) {
            const worker_t *w = &R->workers[i];
            room = usable(w, W_PREFILL) &&
                   (w->pending_tokens == 0 || w->pending_tokens + best->n_prompt <= R->prefill_queue_tokens);
        }
        if (!room) return;
        int di = pick_decode(R, best);
        if (di < 0) return; /* the head waits; what is behind it too (no overtaking) */
        send_to_decode(R, best, di);
    }
}

/* ---- events from workers ---------------------------------------------------------------------------- */

/* The worker of that name; with create, a new one in a free slot (one
 * forgotten by forget_workers, or past the last) when there is one. */
static worker_t *worker_by_name(router_t *R, const char *name, bool create)
{
    int free_slot = -1;
    for (int i = 0; i < R->n_workers; i++) {
        if (R->workers[i].used && !strcmp(R->workers[i].name, name)) return &R->workers[i];
        if (!R->workers[i].used && free_slot < 0) free_slot = i;
    }
    if (!create) return NULL;
    if (free_slot < 0) {
        if (R->n_workers >= MAX_WORKERS) return NULL;
        free_slot = R->n_workers++;
    }
    worker_t *w = &R->workers[free_slot];
    memset(w, 0, sizeof(*w));
    w->used = true;
    snprintf(w->name, sizeof(w->name), "%s", name);
    return w;
}

/* A worker is gone (silent, or restarted as a new incarnation): its requests end or move. */
static void worker_lost(router_t *R, int wi, const char *why)
{
    worker_t *w = &R->workers[wi];
    fy_warn("worker %s is down: %s", w->name, why);
    w->up = false;
    for (rreq_t *q = R->all; q; q = q->next) {
        if (q->state == RQ_DONE || q->state == RQ_QUEUED) continue;
        if (q->dw == wi) {
            /* its KV and stream are gone with it; the prefill side is told to stop */
            q->dw = -1;
            w->assigned--;
            finish_req(R, q, FY_ERR_PEER, "decode worker %s %s", w->name, why);
        } else if (q->pw == wi && q->state == RQ_PREFILLING) {
            q->pw = -1;
            w->pending_tokens -= q->n_prompt;
            char msg[160];
            snprintf(msg, sizeof(msg), "prefill worker %s %s", w->name, why);
            retry_or_fail(R, q, FY_ERR_PEER, msg);
        }
    }
    w->assigned = 0;
    w->pending_tokens = 0;
}

static bool worker_listed(const router_t *R, const char *name)
{
    for (int i = 0; i < R->n_listed; i++)
        if (!strcmp(R->listed[i], name)) return true;
    return false;
}

/* membership thread: the workers etcd lists now.  Those that left get no
 * new requests; their running ones end as for a worker that went silent,
 * unless it still reports (within router.health_timeout): a record can
 * vanish while its worker runs (etcd lost its lease in an outage, or
 * someone deleted it) and the worker writes it again, so those requests
 * go on, and the worker stops reporting when it really ends.  Those that
 * appeared are dialled at once, and join with their first load report. */
static void on_workers(void *arg, const fy_member_t *live, int n_live)
{
    router_t *R = arg;
    char(*listed)[64] = n_live ? fy_calloc((size_t)n_live, sizeof(*listed)) : NULL;
    if (n_live && !listed) return; /* the last list stays */
    int n = 0;
    for (int k = 0; k < n_live; k++)
        if (strcmp(live[k].kind, "router")) snprintf(listed[n++], sizeof(listed[0]), "%s", live[k].name);
    pthread_mutex_lock(&R->mu);
    fy_free(R->listed);
    R->listed = listed;
    R->n_listed = n;
    if (!R->listed_once) fy_info("etcd lists %d worker(s)", n);
    R->listed_once = true;
    double now = fy_now_s();
    for (int i = 0; i < R->n_workers; i++) {
        worker_t *w = &R->workers[i];
        bool is_listed = worker_listed(R, w->name);
        if (w->up && !is_listed && now - w->last_seen > R->health_timeout) {
            worker_lost(R, i, "left the cluster (its etcd record is gone)");
        } else if (w->up && !is_listed && !w->unlisted) {
            fy_warn("worker %s: its etcd record is gone but it still reports: its requests go on, new ones go "
                    "elsewhere until it is listed again",
                    w->name);
        } else if (w->up && is_listed && w->unlisted) {
            fy_info("worker %s is listed in etcd again", w->name);
        }
        w->unlisted = !is_listed;
    }
    for (int k = 0; k < n_live; k++) {
        const fy_member_t *m = &live[k];
        if (!strcmp(m->kind, "router")) continue;
        worker_t *w = worker_by_name(R, m->name, true);
        if (!w || (w->push && !strcmp(w->listen, m->addr))) continue;
        fy_push_destroy(w->push);
        w->push = NULL;
        snprintf(w->listen, sizeof(w->listen), "%s", m->addr);
        fy_env_peer_t to = {.role = strcmp(m->kind, "prefill") ? FY_ROLE_DECODE : FY_ROLE_PREFILL};
        snprintf(to.name, sizeof(to.name), "%s", m->name);
        if (fy_push_create(m->addr, 4096, &R->auth, &to, &w->push) != FY_OK)
            fy_error("cannot reach worker %s at %s", m->name, m->addr);
    }
    pthread_mutex_unlock(&R->mu);
}

static void on_load(router_t *R, fy_msgr_t *r, const fy_env_hdr_t *from, const char *name, uint64_t inc)
{
    fy_wire_load_t m;
    fy_wire_load_init(&m);
    fy_wire_load_read(r, NULL, &m);
    if (fy_msgr_ok(r) && strcmp(m.role, fy_env_role_str(from->role))) { /* a prefill worker cannot join as decode */
        if (R->events) fy_pull_refuse(R->events, from, "a load report for another role");
        return;
    }
    if (!fy_msgr_ok(r)) {
        R->bad_events++;
        fy_warn("bad load report from %s: %s", name, r->err);
        return;
    }
    const char *role = m.role, *listen = m.listen, *model = m.model;
    int32_t bs = m.block_size, capacity = m.has_capacity ? m.capacity : m.total_blocks;
    if (R->etcd && !worker_listed(R, name)) { /* it joins through etcd, or not at all */
        const worker_t *k = worker_by_name(R, name, false);
        if (!k || k->inc != inc || !k->up) return; /* one already up goes on reporting (on_workers) */
    }
    const void *bloom = m.bloom;
    size_t bloom_len = m.bloom_len;
    worker_t *w = worker_by_name(R, name, true);
    if (!w) {
        fy_warn("load report from %s ignored: %d workers already (a worker's slot is freed router.forget_after "
                "after it went down)",
                name, MAX_WORKERS);
        return;
    }
    int wi = (int)(w - R->workers);
    wrole_t wrole = strcmp(role, "prefill") ? W_DECODE : W_PREFILL;
    if (w->inc && w->inc != inc && w->up) worker_lost(R, wi, "restarted");
    if (w->inc != inc) {
        bool compatible = !strcmp(model, R->model_id) && bs == R->lay.block_size;
        w->breaker = BR_CLOSED; /* a new incarnation starts with a clean record */
        w->breaker_wait = 0;
        w->trial = 0;
        if (!compatible)
            fy_error("worker %s refused: model %s with %d-token blocks; this deployment runs %s with %d", name, model,
                     bs, R->model_id, R->lay.block_size);
        else
            fy_info("worker %s (%s) joined: %s", name, role, listen);
        w->incompatible = !compatible;
        w->assigned = 0;
        w->pending_tokens = 0;
    }
    if (!w->push || strcmp(w->listen, listen)) {
        fy_push_destroy(w->push);
        w->push = NULL;
        snprintf(w->listen, sizeof(w->listen), "%s", listen);
        fy_env_peer_t to = {.role = from->role}; /* commands for that worker alone */
        snprintf(to.name, sizeof(to.name), "%s", name);
        if (fy_push_create(listen, 4096, &R->auth, &to, &w->push) != FY_OK)
            fy_error("cannot reach worker %s at %s", name, listen);
    }
    w->ranks = (m.tp > 0 ? m.tp : 1) * (m.pp > 0 ? m.pp : 1);
    if (m.out_of_service[0]) { /* its rank group broke: nothing new goes there; what ran there has ended */
        if (!w->out_of_service[0] || w->inc != inc)
            fy_error("worker %s (%d ranks) is out of service: %s", name, w->ranks, m.out_of_service);
        snprintf(w->out_of_service, sizeof(w->out_of_service), "%s", m.out_of_service);
        if (w->up && w->inc == inc) worker_lost(R, wi, "is out of service");
        w->inc = inc;
        w->role = wrole;
        w->up = false;
        w->last_seen = fy_now_s();
        return;
    }
    w->out_of_service[0] = '\0';
    if (!w->up && w->inc == inc && !w->incompatible) fy_info("worker %s is back", name);
    w->inc = inc;
    w->role = wrole;
    w->up = true;
    w->last_seen = fy_now_s();
    w->n_loads++;
    w->running = m.running;
    w->waiting = m.waiting;
    w->max_seqs = m.max_seqs;
    w->total_blocks = m.total_blocks;
    w->admittable = m.admittable;
    w->capacity = capacity;
    w->leases = m.leases;
    w->ctx = m.ctx > 0 && m.ctx < R->max_ctx ? m.ctx : R->max_ctx;
    w->blocks_since = 0;
    w->full = false;
    if (bloom) {
        if (w->bloom_bytes != bloom_len) {
            uint8_t *b = fy_realloc(w->bloom, bloom_len);
            if (!b) return;
            w->bloom = b;
            w->bloom_bytes = (uint32_t)bloom_len;
        }
        memcpy(w->bloom, bloom, bloom_len);
    }
}

/* The request an event is about, if the event comes from the worker it is
 * assigned to in that role. */
static rreq_t *req_of(router_t *R, uint64_t id, const char *name, uint64_t inc, bool decode_side)
{
    rreq_t *q = req_find(R, id);
    if (!q || q->state == RQ_DONE) return NULL;
    int wi = decode_side ? q->dw : q->pw;
    if (wi < 0) return NULL;
    worker_t *w = &R->workers[wi];
    if (strcmp(w->name, name) || w->inc != inc) return NULL;
    return q;
}

static void send_prefill(router_t *R, rreq_t *q)
{
    int32_t cached_p = 0;
    int pi = pick_prefill(R, q, &cached_p);
    if (pi < 0) {
        retry_or_fail(R, q, FY_ERR_OVERLOADED, "no prefill worker is up");
        return;
    }
    worker_t *p = &R->workers[pi];
    fy_msgw_t w;
    q->rid = ++R->next_rid;
    q->rid_loads = p->n_loads;
    q->rid_deadline = fy_now_s() + R->command_timeout;
    /* the prefill worker stops putting a second before the lease ends */
    double left = q->lease_end - fy_now_s() - 1.0;
    fy_wire_prefill_t m = {.cmd = cmd_to(p, q->rid),
                           .id = q->id,
                           .attempt = q->retries,
                           .tokens = q->prompt,
                           .n_tokens = q->n_prompt,
                           .gen = q->gen,
                           .target = q->target,
                           .target_len = q->target_len,
                           .first_block = q->first_block,
                           .blocks = q->dst,
                           .n_blocks = q->n_dst,
                           .deadline_s = left > 0.05 ? left : 0.05,
                           .slots = q->slots};
    snprintf(m.tenant, sizeof(m.tenant), "%s", q->tenant);
    fy_wire_prefill_write(&w, &m);
    cmd_send(p, &w);
    breaker_placed(p, q);
    q->pw = pi;
    q->p_inc = p->inc;
    p->pending_tokens += q->n_prompt;
    q->t_prefill = fy_now_s();
    q->prefill_deadline = q->t_prefill + R->prefill_timeout;
    set_state(R, q, RQ_PREFILLING);
}

static void on_reserved(router_t *R, rreq_t *q, fy_msgr_t *r)
{
    fy_wire_lim_t lim = {.n_prompt = q->n_prompt, .block_size = R->lay.block_size, .kv_groups = R->lay.n_groups};
    fy_wire_reserved_t m;
    fy_wire_reserved_init(&m);
    m.lease_s = R->lease_s; /* the lease the worker granted (its own cap may shorten what was asked) */
    fy_wire_reserved_read(r, &lim, &m);
    size_t tl = m.target_len;
    const void *target = m.target;
    void *tcopy = fy_msgr_ok(r) ? fy_malloc(tl ? tl : 1) : NULL;
    if (!fy_msgr_ok(r) || !tcopy) {
        fy_wire_reserved_clear(&m);
        R->bad_events++;
        finish_req(R, q, FY_ERR_FORMAT, "bad reservation from decode worker %s: %s", R->workers[q->dw].name,
                   fy_msgr_ok(r) ? "out of memory" : r->err);
        return;
    }
    double granted = m.lease_s;
    int32_t *dst = m.blocks, n_dst = m.n_blocks, cached = m.cached, first = m.first_block;
    uint64_t lease = m.lease;
    m.blocks = NULL; /* q keeps them */
    memcpy(tcopy, target, tl);
    fy_free(q->dst);
    fy_free(q->target);
    q->dst = dst;
    q->n_dst = n_dst;
    q->target = tcopy;
    q->target_len = tl;
    q->lease = lease;
    q->lease_s = granted < R->lease_s ? granted : R->lease_s;
    q->lease_end = q->t_reserve + q->lease_s;
    q->renew_rid = 0;
    q->p_computed = 0;
    q->first_block = first;
    q->slots = m.slots;
    q->cached_d = cached;
    q->t_reserved = fy_now_s();
    q->rid = 0;
    send_prefill(R, q);
}

/*
 * Lease renewal.  A long prompt on a loaded prefill worker can take longer
 * than any fixed lease, so the lease lives as long as the prefill worker
 * keeps reporting the job (its engine is ticking and holds it): each
 * "progress" report (every worker.heartbeat) renews the lease at the
 * decode worker once a quarter of it has passed ("renew" -> "renewed"), and the
 * new end goes on to the prefill worker as its transfer deadline
 * ("extend").  The prefill deadline here (router.prefill_timeout) counts
 * from the last report in which the job's worker showed new prompt tokens
 * computed (for any of its jobs), so a worker that stops moving fails its
 * jobs while one working through a long queue does not.
 */
static void maybe_renew(router_t *R, rreq_t *q, double now)
{
    /* a quarter of the lease gone: reports come every heartbeat, but a long
     * engine step on a loaded prefill worker can space them out */
    if (q->dw < 0 || q->lease_end - now > q->lease_s * 0.75) return;
    if (q->renew_rid && now - q->renew_sent < R->command_timeout) return; /* one in flight */
    worker_t *d = &R->workers[q->dw];
    if (d->inc != q->d_inc) return;
    fy_msgw_t w;
    q->renew_rid = ++R->next_rid;
    q->renew_sent = now;
    fy_wire_renew_t m = {.cmd = cmd_to(d, q->renew_rid), .id = q->id, .lease = q->lease, .lease_s = R->lease_s};
    fy_wire_renew_write(&w, &m);
    cmd_send(d, &w);
}

static void on_progress(router_t *R, fy_msgr_t *r, const char *name, uint64_t inc)
{
    fy_wire_progress_t m;
    fy_wire_progress_init(&m);
    if (fy_wire_progress_read(r, NULL, &m)) {
        R->bad_events++;
        fy_warn("bad progress report from %s: %s", name, r->err);
        return;
    }
    double now = fy_now_s();
    /* a worker moves through its jobs a step at a time (a step's prompt
     * tokens go to the earliest jobs first), so a job can wait several
     * steps behind others, not yet started or between its chunks: while
     * any of the worker's jobs moves, every job it reports has a new
     * deadline; a worker none of whose jobs moves fails them */
    bool moved = false;
    for (int32_t i = 0; i < m.n_ids && !moved; i++) {
        rreq_t *q = req_of(R, m.ids[i], name, inc, false);
        moved = q && q->state == RQ_PREFILLING && m.attempts[i] == q->retries && m.computed[i] > q->p_computed;
    }
    for (int32_t i = 0; i < m.n_ids; i++) {
        rreq_t *q = req_of(R, m.ids[i], name, inc, false);
        if (!q || q->state != RQ_PREFILLING || m.attempts[i] != q->retries) continue;
        if (m.computed[i] > q->p_computed) q->p_computed = m.computed[i];
        if (moved) q->prefill_deadline = now + R->prefill_timeout;
        maybe_renew(R, q, now);
    }
    fy_wire_progress_clear(&m);
}

static void on_renewed(router_t *R, rreq_t *q, fy_msgr_t *r, uint64_t rid)
{
    fy_wire_renewed_t m;
    fy_wire_renewed_init(&m);
    if (fy_wire_renewed_read(r, NULL, &m)) {
        R->bad_events++;
        fy_warn("bad renewal from %s: %s", R->workers[q->dw].name, r->err);
        return;
    }
    uint64_t lease = m.lease;
    double granted = m.lease_s;
    if (rid != q->renew_rid || lease != q->lease) return; /* an older one */
    q->renew_rid = 0;
    q->lease_s = granted < R->lease_s ? granted : R->lease_s;
    q->lease_end = q->renew_sent + q->lease_s;
    R->renewals++;
    if (q->state != RQ_PREFILLING || q->pw < 0) return; /* the prompt already arrived */
    worker_t *p = &R->workers[q->pw];
    if (p->inc != q->p_inc) return;
    fy_msgw_t w;
    double left = q->lease_end - fy_now_s() - 1.0;
    fy_wire_extend_t m2 = {
        .cmd = cmd_to(p, 0), .id = q->id, .attempt = q->retries, .deadline_s = left > 0.05 ? left : 0.05};
    fy_wire_extend_write(&w, &m2);
    cmd_send(p, &w);
}

static void on_prefilled(router_t *R, rreq_t *q, fy_msgr_t *r)
{
    fy_wire_lim_t lim = {.token_hi = R->vocab - 1,
                         .n_prompt = q->n_prompt,
                         .block_size = R->lay.block_size,
                         .kv_groups = R->lay.n_groups};
    fy_wire_prefilled_t m;
    fy_wire_prefilled_init(&m);
    fy_wire_prefilled_read(r, &lim, &m);
    if (m.attempt != q->retries) { /* an earlier try's */
        fy_wire_prefilled_clear(&m);
        return;
    }
    if (!fy_msgr_ok(r)) {
        R->bad_events++;
        retry_or_fail(R, q, FY_ERR_FORMAT, r->err);
        return;
    }
    q->cached_p = m.cached;
    q->p_queue = m.timings.queue_s;
    q->p_compute = m.timings.compute_s;
    q->p_tail = m.timings.transfer_tail_s;
    q->p_transfer = m.timings.transfer_s;
    q->bytes = m.timings.bytes;
    worker_t *p = &R->workers[q->pw];
    p->pending_tokens -= q->n_prompt;
    q->pw = -1;
    q->t_prefilled = fy_now_s();
    fy_metric_add(R->m.xfer_bytes, (double)q->bytes);
    if (q->bytes > 0) fy_metric_observe(R->m.xfer_s, q->p_transfer);
    worker_t *d = &R->workers[q->dw];
    fy_msgw_t w;
    q->rid = ++R->next_rid;
    q->rid_loads = d->n_loads;
    q->rid_deadline = fy_now_s() + R->command_timeout;
    fy_wire_adopt_t a = {.cmd = cmd_to(d, q->rid),
                         .id = q->id,
                         .lease = q->lease,
                         .first_token = m.first_token,
                         .logprob = m.logprob,
                         .n_rng = 4,
                         .kept = m.kept,
                         .n_kept = m.n_kept,
                         .scores = m.scores,
                         .n_scores = m.n_scores,
                         .top_ids = m.top_ids,
                         .n_top_ids = m.n_top_ids,
                         .top_logprobs = m.top_logprobs,
                         .n_top_logprobs = m.n_top_logprobs};
    memcpy(a.rng, m.rng, sizeof(a.rng));
    fy_wire_adopt_write(&w, &a);
    fy_wire_prefilled_clear(&m);
    cmd_send(d, &w);
    set_state(R, q, RQ_ADOPTING);
}

static void on_token(router_t *R, rreq_t *q, fy_msgr_t *r)
{
    fy_wire_lim_t lim = {.token_hi = R->vocab - 1};
    fy_wire_token_t m;
    fy_wire_token_init(&m);
    fy_wire_token_read(r, &lim, &m);
    int32_t n = m.n, tok = m.token;
    bool more = m.more;
    float lp = (float)m.logprob;
    size_t len = m.text_len;
    const char *text = m.text;
    if (!fy_msgr_ok(r)) {
        R->bad_events++;
        finish_req(R, q, FY_ERR_FORMAT, "bad token event from %s: %s", R->workers[q->dw].name, r->err);
        return;
    }
    int32_t K = q->gen.top_logprobs, n_top = m.n_top_ids < K ? m.n_top_ids : K;
    if (n != q->n_out) { /* an event was dropped on the way: the stream is broken */
        fy_wire_token_clear(&m);
        finish_req(R, q, FY_ERR_PEER, "token %d from decode worker %s arrived after %d: tokens were lost", n,
                   R->workers[q->dw].name, q->n_out);
        return;
    }
    if (q->n_out == q->cap_out) {
        int32_t cap = q->cap_out ? 2 * q->cap_out : 64;
        int32_t *o = fy_realloc(q->out, (size_t)cap * sizeof(int32_t));
        if (o) q->out = o;
        float *l = o && q->gen.logprobs ? fy_realloc(q->lps, (size_t)cap * sizeof(float)) : NULL;
        if (l) q->lps = l;
        int32_t *ti = o && K ? fy_realloc(q->tops, (size_t)cap * (size_t)K * sizeof(int32_t)) : NULL;
        if (ti) q->tops = ti;
        float *tl = ti ? fy_realloc(q->top_lps, (size_t)cap * (size_t)K * sizeof(float)) : NULL;
        if (tl) q->top_lps = tl;
        uint8_t *tn = tl ? fy_realloc(q->n_tops, (size_t)cap) : NULL;
        if (tn) q->n_tops = tn;
        if (!o || (q->gen.logprobs && !l) || (K && !tn)) {
            fy_wire_token_clear(&m);
            finish_req(R, q, FY_ERR_NOMEM, "router out of memory");
            return;
        }
        q->cap_out = cap;
    }
    if (q->lps) q->lps[q->n_out] = lp;
    if (K) {
        q->n_tops[q->n_out] = (uint8_t)n_top;
        if (n_top > 0) {
            memcpy(q->tops + (size_t)q->n_out * (size_t)K, m.top_ids, (size_t)n_top * sizeof(int32_t));
            memcpy(q->top_lps + (size_t)q->n_out * (size_t)K, m.top_logprobs, (size_t)n_top * sizeof(float));
        }
    }
    fy_wire_token_clear(&m);
    size_t text_before = q->text_len;
    q->out[q->n_out++] = tok;
    if (len && !text_append(q, text, len)) {
        finish_req(R, q, FY_ERR_NOMEM, "router out of memory");
        return;
    }
    if (q->state == RQ_ADOPTING) set_state(R, q, RQ_DECODING); /* the token overtook nothing: adopted came first */
    fy_metric_inc(R->m.generation);
    /* A speculative step's accepted run arrives as one event per token,
     * microseconds apart: all but its last say more.  They are held and
     * go to the client with the last (one SSE chunk, one poll answer per
     * step, as vLLM sends them), and the step is one inter-token gap.  A
     * worker that never ends a run is not waited on for long. */
    if (more && q->n_held < MAX_HELD_TOKENS) {
        if (!q->n_held++) q->held_text = text_before;
        return;
    }
    q->n_held = 0;
    double now = fy_now_s();
    if (q->t_first == 0) {
        q->t_first = now;
        fy_metric_observe(R->m.ttft, now - q->t_arrive);
        double hit = q->cached_p > q->cached_d ? q->cached_p : q->cached_d;
        fy_metric_add(R->m.tenant[tenant_series(R, q->tenant)].cached, hit);
    } else {
        fy_metric_observe(R->m.itl, now - q->t_last);
    }
    q->t_last = now;
    wake_poll(R, q);
}

/* Prompt logprobs, from the worker that runs the prompt: the prefill
 * worker (its try's) or, colocated, the decode worker. */
static void on_prompt_logprobs(router_t *R, rreq_t *q, fy_msgr_t *r)
{
    fy_wire_lim_t lim = {.token_hi = R->vocab - 1, .n_prompt = q->n_prompt};
    fy_wire_prompt_logprobs_t m;
    fy_wire_prompt_logprobs_init(&m);
    fy_wire_prompt_logprobs_read(r, &lim, &m);
    if (fy_msgr_ok(r) && m.has_attempt && m.attempt != q->retries) { /* an earlier try's */
        fy_wire_prompt_logprobs_clear(&m);
        return;
    }
    int32_t K = q->gen.prompt_top;
    if (fy_msgr_ok(r) && (!q->gen.prompt_logprobs || m.k != K))
        fy_msgr_fail(r, FY_ERR_FORMAT, "%d prompt alternatives for a request that asked for %s%d", m.k,
                     q->gen.prompt_logprobs ? "" : "none, not ", K);
    if (!fy_msgr_ok(r)) {
        R->bad_events++;
        finish_req(R, q, FY_ERR_FORMAT, "bad prompt_logprobs event: %s", r->err);
        return;
    }
    size_t np = (size_t)q->n_prompt;
    if (!q->plp) {
        q->plp = fy_calloc(np, sizeof(float));
        q->plp_rank = fy_calloc(np, sizeof(int32_t));
        q->plp_ids = K ? fy_calloc(np * (size_t)K, sizeof(int32_t)) : NULL;
        q->plp_tlps = K ? fy_calloc(np * (size_t)K, sizeof(float)) : NULL;
        q->plp_got = fy_calloc(np, 1);
        if (!q->plp || !q->plp_rank || !q->plp_got || (K && (!q->plp_ids || !q->plp_tlps))) {
            fy_wire_prompt_logprobs_clear(&m);
            finish_req(R, q, FY_ERR_NOMEM, "router out of memory");
            return;
        }
    }
    int32_t n = m.n_logprobs;
    memcpy(q->plp + m.first, m.logprobs, (size_t)n * sizeof(float));
    memcpy(q->plp_rank + m.first, m.ranks, (size_t)n * sizeof(int32_t));
    if (K) {
        memcpy(q->plp_ids + (size_t)m.first * (size_t)K, m.top_ids, (size_t)n * (size_t)K * sizeof(int32_t));
        memcpy(q->plp_tlps + (size_t)m.first * (size_t)K, m.top_logprobs, (size_t)n * (size_t)K * sizeof(float));
    }
    for (int32_t i = m.first; i < m.first + n; i++) {
        q->plp_have += !q->plp_got[i];
        q->plp_got[i] = 1;
    }
    fy_wire_prompt_logprobs_clear(&m);
}

static void on_finish(router_t *R, rreq_t *q, fy_msgr_t *r)
{
    fy_wire_lim_t lim = {.n_prompt = q->n_prompt, .max_ctx = R->max_ctx};
    fy_wire_finish_t m;
    fy_wire_finish_init(&m);
    fy_wire_finish_read(r, &lim, &m);
    fy_wire_finish_clear(&m); /* the inter-token latencies: not kept here */
    size_t len = m.text_len;
    const char *text = m.text;
    int32_t cached = m.timings.n_cached;
    if (!fy_msgr_ok(r)) {
        R->bad_events++;
        finish_req(R, q, FY_ERR_FORMAT, "bad finish event from %s: %s", R->workers[q->dw].name, r->err);
        return;
    }
    if (R->colocated) { /* the prefix hit is only known in the worker's engine */
        q->cached_d = cached;
        fy_metric_add(R->m.tenant[tenant_series(R, q->tenant)].cached, cached);
    }
    if (len) text_append(q, text, len);
    snprintf(q->finish, sizeof(q->finish), "%s", m.reason);
    if (q->t_first == 0) q->t_first = fy_now_s();
    if (q->gen.prompt_logprobs && q->plp_have != q->n_prompt - 1) { /* asked for, and not all came */
        finish_req(R, q, FY_ERR_PEER, "prompt logprobs of %d of the prompt's %d tokens arrived", q->plp_have,
                   q->n_prompt - 1);
        return;
    }
    finish_req(R, q, FY_OK, NULL);
}

static void on_error_event(router_t *R, fy_msgr_t *r, const char *name, uint64_t inc, uint64_t id, uint64_t rid)
{
    rreq_t *q = id ? req_find(R, id) : NULL;
    /* what could be read of it counts: a bad code is "internal", a bad message empty */
    fy_wire_ev_error_t m;
    fy_wire_ev_error_init(&m);
    snprintf(m.code, sizeof(m.code), "internal");
    m.attempt = q ? q->retries : 0; /* without one: the current try */
    fy_wire_ev_error_read(r, NULL, &m);
    const char *code = m.code, *message = m.message;
    fy_status_t st = fy_msg_error_code(code);
    if (!q || q->state == RQ_DONE) {
        if (!id) fy_warn("worker %s reports: %s (%s)", name, message, code);
        return;
    }
    bool from_d = q->dw >= 0 && !strcmp(R->workers[q->dw].name, name) && R->workers[q->dw].inc == inc;
    if (from_d && rid && rid == q->renew_rid) {
        /* the lease is gone: its lease_expired event ends or retries the request */
        q->renew_rid = 0;
        fy_debug("request %llu: renewal refused by %s: %s", (unsigned long long)id, name, message);
        return;
    }
    bool from_p = q->pw >= 0 && !strcmp(R->workers[q->pw].name, name) && R->workers[q->pw].inc == inc &&
                  m.attempt == q->retries; /* not an older try's */
    if (from_d && (q->state == RQ_RESERVING || (R->colocated && q->state == RQ_ADOPTING)) && st == FY_ERR_NO_SPACE) {
        /* it cannot take this one after all: back to the queue, and skip it until its next report */
        worker_t *d = &R->workers[q->dw];
        d->full = true;
        d->assigned--;
        d->blocks_since -= q->need_blocks;
        q->dw = -1;
        q->rid = 0;
        set_state(R, q, RQ_QUEUED);
        return;
    }
    char why[400];
    if (from_p) {
        snprintf(why, sizeof(why), "prefill worker %s: %s", name, message);
        retry_or_fail(R, q, st, why);
    } else if (from_d) {
        if (!R->colocated && q->state == RQ_ADOPTING &&
            st == FY_ERR_NOT_FOUND) { /* the lease went before the KV arrived */
            snprintf(why, sizeof(why), "decode worker %s: %s", name, message);
            R->workers[q->dw].assigned--;
            q->dw = -1; /* nothing left to release there */
            retry_or_fail(R, q, st, why);
            return;
        }
        finish_req(R, q, st, "decode worker %s: %s", name, message);
    }
}

static void on_event(void *arg, const fy_env_hdr_t *from, const void *buf, size_t len)
{
    router_t *R = arg;
    fy_msgr_t r;
    if (fy_msgr_parse(&r, buf, len) != FY_OK) {
        pthread_mutex_lock(&R->mu);
        R->bad_events++;
        pthread_mutex_unlock(&R->mu);
        fy_warn("bad event: %s", r.err);
        fy_msgr_free(&r);
        return;
    }
    fy_wire_ev_t ev = {.id = 0};
    fy_wire_ev_read(&r, &ev);
    const char *name = ev.worker, *type = fy_msgr_type(&r);
    uint64_t inc = ev.inc, id = ev.id, rid = ev.rid;
    pthread_mutex_lock(&R->mu);
    if (fy_msgr_ok(&r) && rid && !strcmp(name, from->name) && inc == from->inc) {
        /* an answer to a command (only those carry a rid): the worker listens */
        worker_t *bw = worker_by_name(R, name, false);
        if (bw && bw->inc == inc) breaker_answer(bw);
    }
    if (fy_msgr_ok(&r) && (strcmp(name, from->name) || inc != from->inc)) {
        /* a worker speaks for itself only: its events name the sender of the envelope */
        char why[160];
        snprintf(why, sizeof(why), "a '%s' event in the name of %s (incarnation %016llx)", type, name,
                 (unsigned long long)inc);
        if (R->events) fy_pull_refuse(R->events, from, why);
    } else if (!fy_msgr_ok(&r)) {
        R->bad_events++;
        fy_warn("bad '%s' event: %s", type, r.err);
    } else if (fy_wire_load_is(&r)) {
        on_load(R, &r, from, name, inc);
    } else if (fy_wire_alive_is(&r)) {
        fy_wire_alive_t m;
        fy_wire_alive_init(&m);
        worker_t *w = worker_by_name(R, name, false); /* known incarnations only: a load report joins */
        if (fy_wire_alive_read(&r, NULL, &m)) {
            R->bad_events++;
            fy_warn("bad 'alive' event from %s: %s", name, r.err);
        } else if (w && w->inc == inc && !w->incompatible) {
            if (!w->up && !w->out_of_service[0]) fy_info("worker %s is back", name);
            w->up = !w->out_of_service[0]; /* alive, but it said it serves nothing */
            w->last_seen = fy_now_s();
        }
    } else if (fy_wire_ev_error_is(&r)) {
        on_error_event(R, &r, name, inc, id, rid);
    } else if (fy_wire_progress_is(&r)) {
        worker_t *w = worker_by_name(R, name, false);
        if (w && w->inc == inc) w->last_seen = fy_now_s();
        on_progress(R, &r, name, inc);
    } else {
        worker_t *w = worker_by_name(R, name, false);
        if (w && w->inc == inc) w->last_seen = fy_now_s();
        /* prompt logprobs: a prefill worker's name their try */
        bool decode_side = !fy_wire_ev_accepted_is(&r) && !fy_wire_prefilled_is(&r) &&
                           !(fy_wire_prompt_logprobs_is(&r) && fy_msgr_has(&r, "attempt"));
        rreq_t *q = req_of(R, id, name, inc, decode_side);
        if (!q) {
            /* about a request that ended, or from a worker it no longer belongs to */
            fy_debug("'%s' event for request %llu from %s ignored", type, (unsigned long long)id, name);
        } else if (fy_wire_renewed_is(&r)) {
            if (q->state == RQ_PREFILLING || q->state == RQ_ADOPTING) on_renewed(R, q, &r, rid);
        } else if (fy_wire_reserved_is(&r)) {
            if (q->state == RQ_RESERVING && rid == q->rid) on_reserved(R, q, &r);
        } else if (fy_wire_ev_accepted_is(&r)) { /* the header is all it holds */
            if (rid == q->rid) q->rid = 0;
        } else if (fy_wire_prefilled_is(&r)) {
            if (q->state == RQ_PREFILLING) on_prefilled(R, q, &r);
        } else if (fy_wire_adopted_is(&r)) { /* the header is all it holds */
            if (q->state == RQ_ADOPTING && rid == q->rid) {
                q->rid = 0;
                set_state(R, q, RQ_DECODING);
            }
        } else if (fy_wire_token_is(&r)) {
            if (q->state == RQ_DECODING || q->state == RQ_ADOPTING) on_token(R, q, &r);
        } else if (fy_wire_prompt_logprobs_is(&r)) {
            if (q->state == RQ_PREFILLING || (R->colocated && (q->state == RQ_ADOPTING || q->state == RQ_DECODING)))
                on_prompt_logprobs(R, q, &r);
        } else if (fy_wire_finish_is(&r)) {
            if (q->state == RQ_DECODING || q->state == RQ_ADOPTING) on_finish(R, q, &r);
        } else if (fy_wire_lease_expired_is(&r)) {
            fy_wire_lease_expired_t m;
            fy_wire_lease_expired_init(&m);
            if (fy_wire_lease_expired_read(&r, NULL, &m)) {
                R->bad_events++;
                fy_warn("bad 'lease_expired' event from %s: %s", name, r.err);
            } else if (q->state == RQ_PREFILLING || q->state == RQ_ADOPTING) {
                let_go(R, q); /* cancels the prefill job; the lease itself is gone */
                retry_or_fail(R, q, FY_ERR_TIMEOUT, "the kv lease expired before the prompt arrived");
            }
        } else {
            R->bad_events++;
            fy_warn("unknown event '%s' from %s", type, name);
        }
    }
    pthread_mutex_unlock(&R->mu);
    fy_msgr_free(&r);
}

/* ---- clients ---------------------------------------------------------------------------------------- */

static void reply_events(router_t *R, rreq_t *q, fy_rpc_call_t *call, int32_t from, size_t from_text)
{
    int32_t n_out = vis_out(q);
    size_t text_len = vis_text(q);
    if (from > n_out) from = n_out;
    if (from_text > text_len) from_text = text_len;
    fy_wire_events_t m;
    fy_wire_events_init(&m);
    m.id = q->id;
    m.tokens = q->out ? q->out + from : NULL;
    m.n_tokens = n_out - from;
    m.text = q->text ? q->text + from_text : "";
    m.text_len = text_len - from_text;
    m.n_prompt = q->n_prompt;
    snprintf(m.state, sizeof(m.state), "%s", STATE_NAMES[q->state]);
    m.done = q->done;
    if (q->done) {
        q->done_seen = true;
        if (q->err != FY_OK) {
            snprintf(m.error_code, sizeof(m.error_code), "%s", fy_status_tag(q->err));
            snprintf(m.error, sizeof(m.error), "%s", q->err_msg);
        } else {
            snprintf(m.finish_reason, sizeof(m.finish_reason), "%s", q->finish);
        }
        /* a phase the request never reached is left out (0) */
        fy_wire_req_timings_t *t = &m.timings;
        double t0 = q->t_arrive;
        m.has_timings = true;
        t->queue_s = (q->t_reserve > 0 ? q->t_reserve : q->t_done) - t0;
        if (q->t_reserved > 0) t->reserve_s = q->t_reserved - q->t_reserve;
        if (q->t_prefilled > 0) {
            t->prefill_queue_s = q->p_queue;
            t->prefill_compute_s = q->p_compute;
            t->transfer_s = q->p_transfer;
            t->transfer_tail_s = q->p_tail;
            t->prefill_total_s = q->t_prefilled - q->t_prefill;
            t->transfer_bytes = q->bytes;
        }
        if (q->t_first > 0) {
            if (q->t_prefilled > 0) t->first_token_s = q->t_first - q->t_prefilled;
            t->ttft_s = q->t_first - t0;
        }
        t->e2e_s = q->t_done - t0;
        t->cached_prefill = q->cached_p;
        t->cached_decode = q->cached_d;
        t->retries = q->retries;
    }
    fy_msgw_t w;
    fy_wire_events_write(&w, &m);
    fy_rpc_reply_msgw(call, &w);
}

/* Answers a held poll when there is something new for it. */
static void wake_poll(router_t *R, rreq_t *q)
{
    if (q->watch) q->watch(q->watch_arg);
    if (!q->poll) return;
    if (vis_out(q) > q->poll_from || vis_text(q) > q->poll_text || q->done) {
        fy_rpc_call_t *c = q->poll;
        q->poll = NULL;
        reply_events(R, q, c, q->poll_from, q->poll_text);
    }
}

/* A prompt of n tokens, or max_tokens, that the context of ctx tokens
 * cannot hold, in OpenAI's words (the HTTP door's too: it answers
 * "context_length_exceeded" for a message that starts so). */
static void context_refusal(int32_t n, int32_t max_tokens, int32_t ctx, char *err, size_t err_cap)
{
    if (n >= ctx)
        snprintf(err, err_cap,
                 "This model's maximum context length is %d tokens. However, the prompt has %d tokens, which leaves "
                 "no room for the completion (the workers' context: prefill.ctx, decode.ctx). Please reduce the "
                 "length of the prompt.",
                 ctx, n);
    else
        snprintf(err, err_cap,
                 "This model's maximum context length is %d tokens. However, 'max_tokens' is %d (the workers' "
                 "context: prefill.ctx, decode.ctx). Please reduce the completion.",
                 ctx, max_tokens);
}

/*
 * A new request for the queue: ids (fy_malloc'd) are taken in every case.
 * On success the request is queued and the lock is HELD (the caller
 * answers, then pumps and unlocks); on failure the lock is not held and
 * err says why.
 */
static fy_status_t enqueue(router_t *R, const char *tenant, int32_t *ids, int32_t n, const fy_genspec_t *gen,
                           double deadline_s, fy_router_watch_fn watch, void *watch_arg, bool held, rreq_t **q_p,
                           char *err, size_t err_cap)
{
    if (n < 1 || n >= R->max_ctx || n > MAX_PROMPT_TOKENS) {
        if (n >= R->max_ctx)
            context_refusal(n, gen->max_tokens, R->max_ctx, err, err_cap);
        else
            snprintf(err, err_cap, "the prompt has %d tokens; the router takes 1 to %d", n, MAX_PROMPT_TOKENS);
        fy_free(ids);
        fy_metric_inc(R->m.refused[1]);
        return FY_ERR_INVALID;
    }
    if (gen->kv_budget > 0 && (R->evict.policy == FY_EVICT_NONE || gen->kv_budget > fy_evict_budget(&R->evict))) {
        if (R->evict.policy == FY_EVICT_NONE)
            snprintf(err, err_cap, "'kv_budget' is %d; this deployment evicts nothing (kv.evict = none)",
                     gen->kv_budget);
        else
            snprintf(err, err_cap, "'kv_budget' is %d; this deployment allows at most %d", gen->kv_budget,
                     fy_evict_budget(&R->evict));
        fy_free(ids);
        fy_metric_inc(R->m.refused[1]);
        return FY_ERR_INVALID;
    }
    rreq_t *q = fy_calloc(1, sizeof(*q));
    int32_t bs = R->lay.block_size;
    if (q) q->hashes = fy_malloc((size_t)(n / bs + 1) * sizeof(fy_kv_hash_t));
    if (!q || !q->hashes) {
        fy_free(q);
        fy_free(ids);
        snprintf(err, err_cap, "router out of memory");
        return FY_ERR_NOMEM;
    }
    q->prompt = ids;
    q->n_prompt = n;
    q->gen = *gen;
    q->dw = q->pw = q->excluded_pw = q->excluded_dw = -1;
    q->watch = watch;
    q->watch_arg = watch_arg;
    /* the tenant comes from the server side (an API key's), never from the client */
    snprintf(q->tenant, sizeof(q->tenant), "%s", tenant);
    fy_kv_ns_t ns;
    fy_kv_ns_make(R->hasher, q->tenant, R->model_id, &R->lay, NULL, &ns);
    q->n_hashes = (n - 1) / bs; /* what a prefix lookup can find: one token is always computed */
    for (int32_t i = 0; i < q->n_hashes; i++)
        fy_kv_hash_block(R->hasher, &ns, i ? &q->hashes[i - 1] : NULL, ids + (size_t)i * bs, bs, &q->hashes[i]);
    q->need_blocks = blocks_for(R, q);

    if (!held) pthread_mutex_lock(&R->mu);
    /* the workers' context (they refuse what does not fit it): said here
     * in the door's words, before any worker is asked */
    int32_t ctx = fy_router_pool_ctx(R);
    if (n >= ctx || gen->max_tokens > ctx) {
        R->refused++;
        if (!held) pthread_mutex_unlock(&R->mu);
        fy_free(q->hashes);
        fy_free(q->prompt);
        fy_free(q);
        context_refusal(n, gen->max_tokens, ctx, err, err_cap);
        fy_metric_inc(R->m.refused[1]);
        return FY_ERR_INVALID;
    }
    /* draining: nothing new (a watch function's submission, held, belongs
     * to a request already running: HTTP's samples after the first) */
    if (R->draining && !held) {
        R->refused++;
        pthread_mutex_unlock(&R->mu);
        fy_free(q->hashes);
        fy_free(q->prompt);
        fy_free(q);
        snprintf(err, err_cap, "the router is shutting down; send this request to another router, or again later");
        fy_metric_inc(R->m.refused[0]);
        return FY_ERR_OVERLOADED;
    }
    if (R->n_queued >= R->max_queue) {
        R->refused++;
        if (!held) pthread_mutex_unlock(&R->mu);
        fy_free(q->hashes);
        fy_free(q->prompt);
        fy_free(q);
        snprintf(err, err_cap, "overloaded: %d requests are waiting", R->max_queue);
        fy_metric_inc(R->m.refused[0]);
        return FY_ERR_OVERLOADED;
    }
    double now = fy_now_s();
    q->id = ++R->next_id; /* cluster.etcd: under this router's tag (fy_router_start) */
    q->t_arrive = q->last_poll = now;
    q->deadline = now + deadline_s;
    q->state = RQ_QUEUED;
    R->n_queued++;
    q->hnext = R->buckets[q->id % N_BUCKETS];
    R->buckets[q->id % N_BUCKETS] = q;
    q->next = R->all;
    if (R->all) R->all->prev = q;
    R->all = q;
    R->n_reqs++;
    R->accepted++;
    fy_metric_add(R->m.tenant[tenant_series(R, q->tenant)].prompt, n);
    *q_p = q;
    return FY_OK;
}

/* A generate message waiting for a parse worker: the call holds msg
 * until it is answered. */
typedef struct gen_job {
    router_t *R;
    fy_rpc_call_t *call;
    fy_env_hdr_t from;
    const void *msg;
    size_t len;
} gen_job_t;

static void client_generate(router_t *R, fy_rpc_call_t *call, const fy_env_hdr_t *from, fy_msgr_t *r);

/* A parse worker: the message read and its prompt tokenized there. */
static void gen_job_run(void *arg, bool run)
{
    gen_job_t *j = arg;
    if (!run) {
        fy_rpc_reply_error(j->call, 0, FY_ERR_OVERLOADED, "the router is shutting down; send this request again");
        fy_free(j);
        return;
    }
    fy_msgr_t r;
    if (fy_msgr_parse(&r, j->msg, j->len) != FY_OK)
        fy_rpc_reply_error(j->call, 0, r.status, r.err);
    else
        client_generate(j->R, j->call, &j->from, &r);
    fy_msgr_free(&r);
    fy_free(j);
}

/* nng's thread: a generate goes to the parse workers, or is refused at
 * once when they are all busy and their queue is full. */
static void client_generate_queue(router_t *R, fy_rpc_call_t *call, const fy_env_hdr_t *from, const void *msg,
                                  size_t len)
{
    gen_job_t *j = fy_malloc(sizeof(*j));
    if (!j) {
        fy_rpc_reply_error(call, 0, FY_ERR_NOMEM, "router out of memory");
        return;
    }
    *j = (gen_job_t){.R = R, .call = call, .from = *from, .msg = msg, .len = len};
    fy_status_t st = fy_workq_push(R->parse, len <= FY_WORKQ_QUICK_BYTES, gen_job_run, j);
    if (st == FY_OK) return;
    fy_free(j);
    pthread_mutex_lock(&R->mu);
    R->refused++;
    pthread_mutex_unlock(&R->mu);
    fy_metric_inc(R->m.refused[0]);
    fy_rpc_reply_error(call, 0, FY_ERR_OVERLOADED,
                       st == FY_ERR_CANCELLED ? "the router is shutting down; send this request again"
                                              : "overloaded: the router's prompt parsers are all busy; try again");
}

/* A parse worker (gen_job_run): reads the message, tokenizes its prompt
 * and queues the request. */
static void client_generate(router_t *R, fy_rpc_call_t *call, const fy_env_hdr_t *from, fy_msgr_t *r)
{
    char *prompt_text = NULL, *system = NULL;
    fy_wire_lim_t lim = {.token_hi = R->vocab - 1, .max_prompt = MAX_PROMPT_TOKENS, .max_ctx = R->max_ctx};
    fy_wire_generate_t m;
    fy_wire_generate_init(&m);
    m.deadline_s = R->request_timeout;
    if (fy_wire_generate_read(r, &lim, &m)) {
        fy_rpc_reply_error(call, 0, r->status, r->err);
        return;
    }
    if (m.gen.prompt_logprobs) { /* the events a client polls carry none: computing them would be waste */
        fy_wire_generate_clear(&m);
        fy_rpc_reply_error(
            call, 0, FY_ERR_INVALID,
            "field 'prompt_logprobs': served on the HTTP API only (a client's events do not carry them)");
        return;
    }
    if (m.gen.grammar_kind != FY_GEN_GRAMMAR_NONE) { /* what the workers will compile, with the same limits */
        fy_grammar_kind_t kind;
        fy_grammar_t *g = NULL;
        char gerr[FY_GRAMMAR_ERR_LEN] = "", msg[FY_GRAMMAR_ERR_LEN + 64];
        fy_status_t gst = !fy_grammar_kind_of_gen(m.gen.grammar_kind, &kind)
                              ? FY_ERR_INVALID
                              : fy_grammar_cache_get(R->grammars, kind, m.gen.grammar, (size_t)m.gen.grammar_len, &g,
                                                     NULL, gerr, sizeof(gerr));
        fy_grammar_unref(g);
        if (gst) {
            fy_wire_generate_clear(&m);
            snprintf(msg, sizeof(msg), "field 'grammar': %s", gerr[0] ? gerr : fy_status_str(gst));
            fy_rpc_reply_error(call, 0, gst == FY_ERR_NOMEM ? FY_ERR_NOMEM : FY_ERR_INVALID, msg);
            return;
        }
    }
    int32_t *ids = m.tokens, n = m.n_tokens; /* taken: enqueue owns them */
    m.tokens = NULL;
    size_t text = m.prompt ? m.prompt_len + (m.chat && m.system ? m.system_len : 0) : 0;
    if (R->max_prompt_bytes && text > R->max_prompt_bytes) { /* before any tokenizing (workq.h) */
        fy_wire_generate_clear(&m);
        fy_free(ids);
        char msg[256];
        snprintf(msg, sizeof(msg),
                 "the prompt is %zu bytes of text; it cannot fit the context of %d tokens (at most %zu bytes)", text,
                 R->max_ctx, R->max_prompt_bytes);
        pthread_mutex_lock(&R->mu);
        R->refused++;
        pthread_mutex_unlock(&R->mu);
        fy_metric_inc(R->m.refused[1]);
        fy_rpc_reply_error(call, 0, FY_ERR_INVALID, msg);
        return;
    }
    if (m.prompt) { /* tokenizing takes the model's tokenizer, not the router's lock */
        prompt_text = fy_strndup(m.prompt, m.prompt_len);
        system = m.system ? fy_strndup(m.system, m.system_len) : NULL;
        fy_status_t st = !prompt_text || (m.system && !system)
                             ? FY_ERR_NOMEM
                             : fy_prompt_tokens(R->model, system, prompt_text, m.chat, &ids, &n);
        fy_free(prompt_text);
        fy_free(system);
        if (st) {
            fy_rpc_reply_error(call, 0, st, "cannot tokenize the prompt (a chat template error, or not text)");
            return;
        }
    }
    char err[256];
    rreq_t *q;
    fy_status_t st = enqueue(R, "", ids, n, &m.gen, m.deadline_s, NULL, NULL, false, &q, err, sizeof(err));
    if (st) {
        fy_rpc_reply_error(call, 0, st, err);
        return;
    }
    q->owner_inc = from->inc;
    snprintf(q->owner, sizeof(q->owner), "%s", from->name);
    fy_wire_accepted_t a = {.id = q->id, .n_prompt = n};
    fy_msgw_t w;
    fy_wire_accepted_write(&w, &a);
    fy_rpc_reply_msgw(call, &w);
    pump(R);
    pthread_mutex_unlock(&R->mu);
}

/* The request id names, if the client asking made it: another client's (or
 * the HTTP front door's) requests look the same as ones that do not exist. */
static rreq_t *req_of_client(router_t *R, uint64_t id, const fy_env_hdr_t *from)
{
    rreq_t *q = req_find(R, id);
    if (!q || q->owner_inc != from->inc || strcmp(q->owner, from->name)) return NULL;
    return q;
}

static void client_poll(router_t *R, fy_rpc_call_t *call, const fy_env_hdr_t *sender, fy_msgr_t *r)
{
    fy_wire_poll_t m;
    fy_wire_poll_init(&m);
    m.wait_s = 1.0;
    if (fy_wire_poll_read(r, NULL, &m)) {
        fy_rpc_reply_error(call, m.id, r->status, r->err);
        return;
    }
    uint64_t id = m.id;
    int32_t from = m.from;
    int64_t from_text = m.from_text;
    double wait = m.wait_s;
    pthread_mutex_lock(&R->mu);
    rreq_t *q = req_of_client(R, id, sender);
    if (!q) {
        pthread_mutex_unlock(&R->mu);
        fy_rpc_reply_error(call, id, FY_ERR_NOT_FOUND,
                           "no such request of this client (finished and collected, made by another client, or never "
                           "made)");
        return;
    }
    q->last_poll = fy_now_s();
    if (q->poll) { /* a newer poll replaces a held one, which gets what there is */
        fy_rpc_call_t *old = q->poll;
        q->poll = NULL;
        reply_events(R, q, old, q->poll_from, q->poll_text);
    }
    if (vis_out(q) > from || vis_text(q) > (size_t)from_text || q->done || wait <= 0) {
        reply_events(R, q, call, from, (size_t)from_text);
    } else {
        q->poll = call;
        q->poll_from = from;
        q->poll_text = (size_t)from_text;
        q->poll_until = q->last_poll + wait;
    }
    pthread_mutex_unlock(&R->mu);
}

static void client_cancel(router_t *R, fy_rpc_call_t *call, const fy_env_hdr_t *from, fy_msgr_t *r)
{
    fy_wire_cancel_t m;
    fy_wire_cancel_init(&m);
    if (fy_wire_cancel_read(r, NULL, &m)) {
        fy_rpc_reply_error(call, m.id, r->status, r->err);
        return;
    }
    pthread_mutex_lock(&R->mu);
    rreq_t *q = req_of_client(R, m.id, from);
    if (q) finish_req(R, q, FY_ERR_CANCELLED, "cancelled by the client");
    pthread_mutex_unlock(&R->mu);
    fy_wire_cancelled_t c = {.id = m.id};
    fy_msgw_t w;
    fy_wire_cancelled_write(&w, &c);
    fy_rpc_reply_msgw(call, &w);
}

/* Control messages refused on the router's sockets, by fault. */
static void refused_messages(router_t *R, uint64_t out[FY_ENV_N_FAULTS])
{
    memset(out, 0, sizeof(uint64_t) * FY_ENV_N_FAULTS);
    if (R->events) fy_pull_refused(R->events, out);
    if (R->srv) fy_rpc_server_refused(R->srv, out);
}

static void client_status(router_t *R, fy_rpc_call_t *call)
{
    fy_wire_status_reply_t *m = fy_calloc(1, sizeof(*m)); /* 6 KiB: not on an nng thread's stack */
    if (!m) {
        fy_rpc_reply_error(call, 0, FY_ERR_NOMEM, "router out of memory");
        return;
    }
    pthread_mutex_lock(&R->mu);
    snprintf(m->model, sizeof(m->model), "%s", R->model_id);
    snprintf(m->served_model, sizeof(m->served_model), "%s", R->conf.served);
    m->requests = R->n_reqs;
    m->queued = R->n_queued;
    m->completed = R->completed;
    m->failed = R->failed;
    m->refused = R->refused;
    m->retried = R->retried;
    m->bad_events = R->bad_events;
    int n = 0; /* the slots in use, packed (a forgotten worker's is free) */
    for (int i = 0; i < R->n_workers; i++) {
        const worker_t *k = &R->workers[i];
        if (!k->used) continue;
        if (k->up && !k->incompatible) {
            if (k->role == W_PREFILL)
                m->prefill_up++;
            else
                m->decode_up++;
        }
        snprintf(m->workers[n], sizeof(m->workers[n]), "%s", k->name);
        m->up[n] = k->up && !k->incompatible;
        m->assigned[n] = k->assigned;
        m->admittable[n] = k->admittable;
        m->total_blocks[n] = k->total_blocks;
        m->decode[n] = k->role == W_DECODE;
        m->pending_tokens[n] = k->pending_tokens > INT32_MAX ? INT32_MAX : (int32_t)k->pending_tokens;
        m->ranks[n] = k->ranks;
        m->out[n] = k->out_of_service[0] != '\0';
        n++;
    }
    m->n_workers = m->n_up = m->n_assigned = m->n_admittable = m->n_total_blocks = m->n_decode = m->n_pending_tokens =
        m->n_ranks = m->n_out = n;
    uint64_t refused[FY_ENV_N_FAULTS];
    refused_messages(R, refused);
    m->refused_messages = (fy_wire_refused_t){.format = refused[FY_ENV_FORMAT],
                                              .mac = refused[FY_ENV_MAC],
                                              .stale = refused[FY_ENV_STALE],
                                              .replay = refused[FY_ENV_REPLAY],
                                              .identity = refused[FY_ENV_IDENTITY],
                                              .clear = refused[FY_ENV_CLEAR]};
    pthread_mutex_unlock(&R->mu);
    fy_msgw_t w;
    fy_wire_status_reply_write(&w, m);
    fy_free(m);
    fy_rpc_reply_msgw(call, &w);
}

static void on_client(void *arg, fy_rpc_call_t *call, const fy_env_hdr_t *from, const void *buf, size_t len)
{
    router_t *R = arg;
    fy_msgr_t r;
    if (fy_msgr_parse(&r, buf, len) != FY_OK) {
        fy_rpc_reply_error(call, 0, r.status, r.err);
    } else if (fy_wire_generate_is(&r)) {
        client_generate_queue(R, call, from, buf, len);
    } else if (fy_wire_poll_is(&r)) {
        client_poll(R, call, from, &r);
    } else if (fy_wire_cancel_is(&r)) {
        client_cancel(R, call, from, &r);
    } else if (fy_wire_status_is(&r)) {
        client_status(R, call);
    } else {
        char msg[96];
        snprintf(msg, sizeof(msg), "unknown request type '%s'", fy_msgr_type(&r));
        fy_rpc_reply_error(call, 0, FY_ERR_UNSUPPORTED, msg);
    }
    fy_msgr_free(&r);
}

/* ---- the in-process interface (router_int.h) ------------------------------------------------------ */

void fy_router_lock(router_t *R) { pthread_mutex_lock(&R->mu); }
void fy_router_unlock(router_t *R) { pthread_mutex_unlock(&R->mu); }
const fy_model_t *fy_router_model(const router_t *R) { return R->model; }
const char *fy_router_model_id(const router_t *R) { return R->model_id; }
size_t fy_router_max_prompt_bytes(const router_t *R) { return R->max_prompt_bytes; }
fy_status_t fy_router_offload(router_t *R, size_t bytes, void (*fn)(void *arg, bool run), void *arg)
{
    return fy_workq_push(R->parse, bytes <= FY_WORKQ_QUICK_BYTES, fn, arg);
}
int32_t fy_router_max_ctx(const router_t *R) { return R->max_ctx; }

int32_t fy_router_pool_ctx(router_t *R)
{
    int32_t ctx = 0;
    for (int i = 0; i < R->n_workers; i++) {
        const worker_t *w = &R->workers[i];
        if (!w->used || !w->up || w->incompatible || w->unlisted || (R->colocated && w->role == W_PREFILL)) continue;
        int32_t c = w->ctx > 0 ? w->ctx : R->max_ctx;
        if (!ctx || c < ctx) ctx = c;
    }
    if (ctx) R->pool_ctx = ctx; /* none up: the last pool's (a worker that comes back is the same, most likely) */
    return R->pool_ctx;
}
const fy_router_conf_t *fy_router_conf(const router_t *R) { return &R->conf; }

fy_status_t fy_router_submit(router_t *R, const char *tenant, int32_t *ids, int32_t n, const fy_genspec_t *gen,
                             double deadline_s, fy_router_watch_fn watch, void *arg, uint64_t *id_p, char *err,
                             size_t err_cap)
{
    rreq_t *q;
    if (deadline_s <= 0) deadline_s = R->request_timeout;
    fy_status_t st = enqueue(R, tenant, ids, n, gen, deadline_s, watch, arg, false, &q, err, err_cap);
    if (st) return st;
    *id_p = q->id;
    pump(R);
    pthread_mutex_unlock(&R->mu);
    return FY_OK;
}

fy_status_t fy_router_submit_locked(router_t *R, const char *tenant, int32_t *ids, int32_t n, const fy_genspec_t *gen,
                                    double deadline_s, fy_router_watch_fn watch, void *arg, uint64_t *id_p, char *err,
                                    size_t err_cap)
{
    rreq_t *q;
    if (deadline_s <= 0) deadline_s = R->request_timeout;
    fy_status_t st = enqueue(R, tenant, ids, n, gen, deadline_s, watch, arg, true, &q, err, err_cap);
    if (st) return st;
    *id_p = q->id;
    return FY_OK; /* placed at the next housekeeping tick (within 10 ms) */
}

bool fy_router_view(router_t *R, uint64_t id, fy_router_view_t *v)
{
    rreq_t *q = req_find(R, id);
    if (!q) return false;
    memset(v, 0, sizeof(*v));
    v->tokens = q->out;
    v->logprobs = q->lps;
    v->n_tokens = vis_out(q);
    v->top_k = q->n_tops ? q->gen.top_logprobs : 0;
    v->top_ids = q->tops;
    v->top_logprobs = q->top_lps;
    v->n_top = q->n_tops;
    v->prompt_tokens = q->prompt;
    v->plp_k = q->gen.prompt_top;
    v->plp_ready = q->gen.prompt_logprobs && q->plp_have == q->n_prompt - 1;
    v->plp = q->plp;
    v->plp_rank = q->plp_rank;
    v->plp_ids = q->plp_ids;
    v->plp_tlps = q->plp_tlps;
    v->text = q->text ? q->text : "";
    v->text_len = vis_text(q);
    v->n_prompt = q->n_prompt;
    v->cached = q->cached_p > q->cached_d ? q->cached_p : q->cached_d;
    v->done = q->done;
    v->error = q->err;
    v->message = q->err_msg;
    v->finish = q->finish;
    v->t_arrive = q->t_arrive;
    v->t_first = q->t_first;
    v->t_done = q->t_done;
    v->t_sched = q->t_reserve;
    return true;
}

void fy_router_detach(router_t *R, uint64_t id, bool cancel)
{
    rreq_t *q = req_find(R, id);
    if (!q) return;
    q->watch = NULL;
    q->watch_arg = NULL;
    if (cancel && !q->done) finish_req(R, q, FY_ERR_CANCELLED, "the client went away");
    q->done_seen = true;
    /* freed by the next tick, not here: detach runs inside watch callbacks
     * that the router makes while it still holds q */
    q->last_poll = -1e9;
}

fy_metrics_t *fy_router_metrics(router_t *R) { return R->reg; }

void fy_router_metrics_refresh(router_t *R)
{
    int running = 0, p = 0, d = 0;
    bool colocated;
    for (rreq_t *q = R->all; q; q = q->next) running += q->state != RQ_QUEUED && q->state != RQ_DONE;
    fy_router_workers_up(R, &p, &d, &colocated);
    fy_metric_set(R->m.running, running);
    fy_metric_set(R->m.waiting, R->n_queued);
    fy_metric_set(R->m.prefill_up, p);
    fy_metric_set(R->m.decode_up, d);
    fy_metric_set(R->m.bad_events, (double)R->bad_events);
    fy_metric_set(R->m.renewals, (double)R->renewals);
    int open[2] = {0, 0};
    for (int i = 0; i < R->n_workers; i++) {
        const worker_t *k = &R->workers[i];
        if (k->used && k->breaker != BR_CLOSED) open[k->role]++;
    }
    fy_metric_set(R->m.breaker_open[W_PREFILL], open[W_PREFILL]);
    fy_metric_set(R->m.breaker_open[W_DECODE], open[W_DECODE]);
    fy_metric_set(R->m.forgotten, (double)R->forgotten);
    uint64_t refused[FY_ENV_N_FAULTS];
    refused_messages(R, refused);
    for (int i = 1; i < FY_ENV_N_FAULTS; i++) fy_metric_set(R->m.ctl_refused[i], (double)refused[i]);
}

/* The router's series (docs/operations.md). */
static fy_status_t metrics_setup(router_t *R)
{
    fy_status_t st =
        fy_metrics_create_labeled((const char *const[]){"model_name", R->conf.served, "role", "router", NULL}, &R->reg);
    if (st) return st;
    fy_metrics_t *g = R->reg;
    static const char *const up_p[] = {"worker_role", "prefill", NULL}, *const up_d[] = {"worker_role", "decode", NULL};
    if (!st)
        st = fy_metrics_gauge(g, "ferry:num_requests_running", "Requests placed on workers, not yet done", NULL,
                              &R->m.running);
    if (!st)
        st = fy_metrics_gauge(g, "ferry:num_requests_waiting", "Requests in the router's queue", NULL, &R->m.waiting);
    if (!st) st = fy_metrics_gauge(g, "ferry:workers_up", "Workers reporting, by role", up_p, &R->m.prefill_up);
    if (!st) st = fy_metrics_gauge(g, "ferry:workers_up", "Workers reporting, by role", up_d, &R->m.decode_up);
    /* the tenant of requests without an API key, from the start (other
     * tenants' series appear with their first request) */
    if (!st) st = tenant_series(R, "") == 0 && R->m.tenant[0].prompt && R->m.tenant[0].cached ? FY_OK : FY_ERR_NOMEM;
    if (!st)
        st = fy_metrics_counter(g, "ferry:generation_tokens_total", "Tokens streamed to clients", NULL,
                                &R->m.generation);
    if (!st)
        st = fy_metrics_counter(g, "ferry:router_retries_total", "Requests retried on another prefill worker", NULL,
                                &R->m.retries);
    if (!st)
        st = fy_metrics_gauge(g, "ferry:worker_breakers_open",
                              "Workers shut off from new requests after a command timed out (open or half-open), "
                              "by role",
                              up_p, &R->m.breaker_open[W_PREFILL]);
    if (!st)
        st = fy_metrics_gauge(g, "ferry:worker_breakers_open",
                              "Workers shut off from new requests after a command timed out (open or half-open), "
                              "by role",
                              up_d, &R->m.breaker_open[W_DECODE]);
    if (!st)
        st = fy_metrics_counter(g, "ferry:worker_breaker_trips_total",
                                "Times a worker's circuit breaker opened (a command it let time out)", NULL,
                                &R->m.breaker_trips);
    if (!st)
        st = fy_metrics_counter(g, "ferry:workers_forgotten_total",
                                "Workers whose table slot was freed, down for router.forget_after", NULL,
                                &R->m.forgotten);
    if (!st)
        st = fy_metrics_counter(g, "ferry:bad_events_total", "Malformed or unexpected worker events", NULL,
                                &R->m.bad_events);
    if (!st)
        st = fy_metrics_counter(g, "ferry:kv_lease_renewals_total",
                                "KV leases renewed at a decode worker while their prompt was still being prefilled",
                                NULL, &R->m.renewals);
    static const char *const reasons[] = {"length", "stop", "eos", "context"};
    for (int i = 0; i < 4 && !st; i++) {
        const char *l[] = {"finished_reason", reasons[i], NULL};
        st = fy_metrics_counter(g, "ferry:request_success_total", "Requests finished, by reason", l, &R->m.success[i]);
    }
    static const char *const fails[] = {"cancelled", "timeout", "peer", "invalid", "overloaded", "other"};
    for (int i = 0; i < 6 && !st; i++) {
        const char *l[] = {"reason", fails[i], NULL};
        st = fy_metrics_counter(g, "ferry:request_failure_total", "Accepted requests that ended in an error, by kind",
                                l, &R->m.failure[i]);
    }
    static const char *const refusals[] = {"overloaded", "invalid"};
    for (int i = 0; i < 2 && !st; i++) {
        const char *l[] = {"reason", refusals[i], NULL};
        st = fy_metrics_counter(g, "ferry:requests_refused_total", "Requests refused at the door, by reason", l,
                                &R->m.refused[i]);
    }
    for (int i = 1; i < FY_ENV_N_FAULTS && !st; i++) {
        const char *l[] = {"reason", fy_env_fault_str((fy_env_fault_t)i), NULL};
        st = fy_metrics_counter(g, "ferry:control_messages_refused_total",
                                "Control-plane messages refused: not authenticated, stale, replayed, or from a "
                                "sender that may not send them",
                                l, &R->m.ctl_refused[i]);
    }
    if (!st)
        st = fy_metrics_histogram(g, "ferry:time_to_first_token_seconds", "Arrival at the router to the first token",
                                  NULL, fy_metrics_ttft_buckets, fy_metrics_n_ttft_buckets, &R->m.ttft);
    if (!st)
        st =
            fy_metrics_histogram(g, "ferry:inter_token_latency_seconds", "Gap between a request's tokens at the router",
                                 NULL, fy_metrics_itl_buckets, fy_metrics_n_itl_buckets, &R->m.itl);
    if (!st)
        st = fy_metrics_histogram(g, "ferry:e2e_request_latency_seconds", "Arrival to the end (finished or failed)",
                                  NULL, fy_metrics_e2e_buckets, fy_metrics_n_e2e_buckets, &R->m.e2e);
    if (!st)
        st = fy_metrics_histogram(g, "ferry:request_queue_time_seconds",
                                  "Arrival to (the last) placement on a worker, observed when the request ends", NULL,
                                  fy_metrics_e2e_buckets, fy_metrics_n_e2e_buckets, &R->m.queue);
    if (!st)
        st = fy_metrics_histogram(g, "ferry:request_prefill_time_seconds",
                                  "Finished requests: placement on a worker to the first token at the router", NULL,
                                  fy_metrics_e2e_buckets, fy_metrics_n_e2e_buckets, &R->m.prefill_s);
    if (!st)
        st = fy_metrics_histogram(g, "ferry:request_decode_time_seconds",
                                  "Finished requests: first token to the last at the router", NULL,
                                  fy_metrics_e2e_buckets, fy_metrics_n_e2e_buckets, &R->m.decode_s);
    if (!st)
        st = fy_metrics_histogram(g, "ferry:request_inference_time_seconds",
                                  "Finished requests: placement on a worker to the end (prefill and decode)", NULL,
                                  fy_metrics_e2e_buckets, fy_metrics_n_e2e_buckets, &R->m.inference_s);
    double lens[40];
    int n_lens = fy_metrics_buckets_125(R->max_ctx, lens, 40);
    if (!st)
        st = fy_metrics_histogram(g, "ferry:request_prompt_tokens", "Finished requests: prompt tokens", NULL, lens,
                                  n_lens, &R->m.prompt_len);
    if (!st)
        st = fy_metrics_histogram(g, "ferry:request_generation_tokens", "Finished requests: generated tokens", NULL,
                                  lens, n_lens, &R->m.gen_len);
    if (!st)
        st = fy_metrics_histogram(g, "ferry:request_max_num_generation_tokens",
                                  "Finished requests: the most tokens one of a request's samples generated (n)", NULL,
                                  lens, n_lens, &R->m.max_gen);
    if (!st)
        st = fy_metrics_histogram(g, "ferry:request_kv_transfer_seconds",
                                  "A prompt's KV transfer, as its prefill worker timed it", NULL,
                                  fy_metrics_e2e_buckets, fy_metrics_n_e2e_buckets, &R->m.xfer_s);
    if (!st)
        st = fy_metrics_counter(g, "ferry:request_kv_transfer_bytes_total",
                                "KV bytes prefill workers put into decode workers, counted per request", NULL,
                                &R->m.xfer_bytes);
    return st;
}

void fy_router_observe_max_generation(router_t *R, int32_t n_tokens) { fy_metric_observe(R->m.max_gen, n_tokens); }

void fy_router_workers_up(router_t *R, int *prefill_up, int *decode_up, bool *colocated)
{
    int p = 0, d = 0;
    for (int i = 0; i < R->n_workers; i++) {
        const worker_t *k = &R->workers[i];
        if (!k->up || k->incompatible) continue;
        if (k->role == W_PREFILL)
            p++;
        else
            d++;
    }
    *prefill_up = p;
    *decode_up = d;
    *colocated = R->colocated;
}

/* ---- housekeeping -------------------------------------------------------------------------------------- */

/* The router itself did not run for a while (SIGSTOP, a stalled host):
 * what workers sent meanwhile waits in the sockets, so silence measured
 * across the gap says nothing of them; they get a fresh health window,
 * and command and poll deadlines move by the gap. */
static void after_own_stall(router_t *R, double now, double gap)
{
    fy_warn("this router did not run for %.1f s (stopped or starved): workers get a fresh health window", gap);
    for (int i = 0; i < R->n_workers; i++)
        if (R->workers[i].up && R->workers[i].last_seen < now) R->workers[i].last_seen = now;
    for (rreq_t *q = R->all; q; q = q->next) {
        if (q->state == RQ_DONE) continue;
        q->rid_deadline += gap;
        q->prefill_deadline += gap;
        q->last_poll += gap;
    }
}

/* Whether a request still running holds slot wi (as its decode or prefill worker). */
static bool slot_held(const router_t *R, int wi)
{
    for (const rreq_t *q = R->all; q; q = q->next)
        if (q->state != RQ_DONE && (q->dw == wi || q->pw == wi)) return true;
    return false;
}

/*
 * Frees the slots of workers down for router.forget_after with nothing of
 * theirs in flight (and, with etcd, no record): pod churn brings new names
 * all the time, and the table holds 64.  Nothing keeps a slot's index past
 * this: running requests hold none (slot_held), a queued one's excluded
 * workers are let go, and the status table is rebuilt per call.
 */
static void forget_workers(router_t *R, double now)
{
    for (int i = 0; i < R->n_workers; i++) {
        worker_t *w = &R->workers[i];
        if (!w->used || w->up || now - w->last_seen < R->forget_after || w->assigned > 0 || w->pending_tokens > 0)
            continue;
        if ((R->etcd && worker_listed(R, w->name)) || slot_held(R, i)) continue;
        fy_info("worker %s forgotten: down for %.0f s (router.forget_after); its slot is free", w->name,
                now - w->last_seen);
        for (rreq_t *q = R->all; q; q = q->next) {
            if (q->excluded_pw == i) q->excluded_pw = -1;
            if (q->excluded_dw == i) q->excluded_dw = -1;
        }
        fy_push_destroy(w->push);
        fy_free(w->bloom);
        memset(w, 0, sizeof(*w));
        R->forgotten++;
    }
    while (R->n_workers > 0 && !R->workers[R->n_workers - 1].used) R->n_workers--;
}

static void tick(router_t *R)
{
    double now = fy_now_s();
    if (R->last_tick > 0 && now - R->last_tick > R->health_timeout / 2) after_own_stall(R, now, now - R->last_tick);
    R->last_tick = now;
    for (int i = 0; i < R->n_workers; i++) {
        worker_t *w = &R->workers[i];
        if (w->up && now - w->last_seen > R->health_timeout) {
            char why[96];
            snprintf(why, sizeof(why), "stopped answering (no report for %.1f s)", now - w->last_seen);
            worker_lost(R, i, why);
        }
        if (w->breaker == BR_OPEN && now >= w->breaker_until) {
            fy_info("worker %s: one trial request after %.1f s (circuit breaker half-open)", w->name, w->breaker_wait);
            w->breaker = BR_HALF_OPEN;
            w->trial = 0;
        } else if (w->breaker == BR_HALF_OPEN && w->trial) {
            /* its trial ended without a verdict (cancelled, its deadline): the next request tries */
            const rreq_t *t = req_find(R, w->trial);
            if (!t || t->state == RQ_DONE || (t->dw != i && t->pw != i)) w->trial = 0;
        }
    }
    forget_workers(R, now);
    rreq_t *next;
    for (rreq_t *q = R->all; q; q = next) {
        next = q->next;
        if (q->state != RQ_DONE) {
            if (now > q->deadline) {
                finish_req(R, q, FY_ERR_TIMEOUT, "deadline exceeded in state %s", STATE_NAMES[q->state]);
            } else if (q->rid && now > q->rid_deadline) {
                const char *who = q->state == RQ_PREFILLING ? "prefill" : "decode";
                int wi = q->state == RQ_PREFILLING ? q->pw : q->dw;
                char why[160];
                snprintf(why, sizeof(why), "%s worker %s did not answer within %.1f s", who,
                         wi >= 0 ? R->workers[wi].name : "?", R->command_timeout);
                /* deaf, not slow: its engine thread, which runs commands and
                 * answers them at once, sent two load reports since */
                if (wi >= 0 && R->workers[wi].n_loads - q->rid_loads >= 2) breaker_trip(R, wi, now);
                retry_side(R, q, FY_ERR_TIMEOUT, why, q->state != RQ_PREFILLING);
            } else if (q->state == RQ_PREFILLING && now > q->prefill_deadline) {
                retry_or_fail(R, q, FY_ERR_TIMEOUT, "prefill took too long");
            } else if (!q->watch && now - q->last_poll > R->client_timeout) {
                finish_req(R, q, FY_ERR_CANCELLED, "the client stopped polling");
            }
        }
        if (q->poll && now >= q->poll_until) {
            fy_rpc_call_t *c = q->poll;
            q->poll = NULL;
            reply_events(R, q, c, q->poll_from, q->poll_text);
        }
        /* a finished request stays until its client saw the end (or gave up) */
        if (q->state == RQ_DONE && !q->poll && !q->watch &&
            ((q->done_seen && now - q->last_poll > 5.0) || now - q->last_poll > R->client_timeout))
            req_free(R, q);
    }
    pump(R);
}

static void *hk_main(void *arg)
{
    router_t *R = arg;
    pthread_mutex_lock(&R->mu);
    while (!R->stop) {
        tick(R);
        pthread_mutex_unlock(&R->mu);
        usleep(10000);
        pthread_mutex_lock(&R->mu);
    }
    pthread_mutex_unlock(&R->mu);
    return NULL;
}

/* ---- the process ------------------------------------------------------------------------------------------ */

/* membership thread: this router's lease expired (etcd lost it, most
 * likely in an outage): it registers again next.  Its requests go on:
 * workers that still hold its connection keep them (node.c), and one
 * that dropped them stops reporting to it, which ends them here after
 * router.health_timeout. */
static void on_lease_lost(void *arg)
{
    router_t *R = arg;
    pthread_mutex_lock(&R->mu);
    int n = 0;
    for (rreq_t *q = R->all; q; q = q->next) n += q->state != RQ_DONE;
    pthread_mutex_unlock(&R->mu);
    fy_warn("etcd: this router's record expired; %d request(s) go on with the workers that still hear it", n);
}

/* cluster.etcd: registers this router and watches the workers */
static fy_status_t membership_start(router_t *R)
{
    fy_membership_params_t mp = {
        .dir = "routers", .watch = "workers/", .fn = on_workers, .lost = on_lease_lost, .arg = R};
    fy_status_t st = fy_membership_params_conf(&mp, &R->conf.members);
    if (st) return st;
    snprintf(mp.self.kind, sizeof(mp.self.kind), "router");
    snprintf(mp.self.name, sizeof(mp.self.name), "%s", R->name);
    mp.self.inc = R->inc;
    mp.self.tag = R->tag;
    snprintf(mp.self.addr, sizeof(mp.self.addr), "%s", R->events_url);
    snprintf(mp.self.client, sizeof(mp.self.client), "%s", R->listen);
    snprintf(mp.self.http, sizeof(mp.self.http), "%s", R->conf.http);
    snprintf(mp.self.model, sizeof(mp.self.model), "%s", R->model_id);
    mp.self.layout = fy_member_layout_hash(R->lay.block_size, (int32_t)R->lay.dtype, R->lay.n_layers, R->lay.n_kv_heads,
                                           R->lay.head_dim, R->lay.block_bytes, fy_kv_layout_groups_digest(&R->lay));
    st = fy_metrics_counter(R->reg, "ferry:etcd_records_refused_total",
                            "etcd records refused (unsigned, forged, stale, malformed or incompatible), each once",
                            NULL, &mp.refused);
    if (!st) st = fy_membership_start(&mp, &R->members);
    sodium_memzero(mp.key, sizeof(mp.key));
    sodium_memzero(&mp.tls, sizeof(mp.tls));
    return st;
}

static fy_status_t setup(router_t *R)
{
    const fy_router_conf_t *rc = &R->conf;
    fy_status_t st;
    R->health_timeout = rc->health_timeout;
    R->request_timeout = rc->request_timeout;
    R->prefill_timeout = rc->prefill_timeout;
    R->command_timeout = rc->command_timeout;
    R->breaker_cooldown = rc->breaker_cooldown;
    R->forget_after = rc->forget_after;
    R->lease_s = rc->lease_s;
    R->client_timeout = rc->client_timeout;
    R->drain_timeout = rc->drain_timeout;
    R->prefix_weight = rc->prefix_weight;
    int64_t max_queue = rc->max_queue, parse_threads = rc->parse_threads, parse_queue = rc->parse_queue;
    int64_t step = rc->step, n_prefill = rc->n_prefill;
    int evict = rc->evict;
    R->step = (int32_t)step;
    R->evict = (fy_evict_params_t){.policy = (fy_evict_policy_t)evict,
                                   .sink_tokens = (int32_t)rc->sink,
                                   .recent_tokens = (int32_t)rc->recent,
                                   .heavy_tokens = evict == FY_EVICT_H2O ? (int32_t)rc->heavy : 0};
    R->colocated = n_prefill == 0;
    R->max_queue = (int32_t)max_queue;
    R->max_retries = (int32_t)rc->retries;
    R->prefill_queue_tokens = rc->prefill_queue_tokens;
    snprintf(R->listen, sizeof(R->listen), "%s", rc->listen);
    snprintf(R->events_url, sizeof(R->events_url), "%s", rc->events);
    fy_log_set_prefix("router");
    if ((st = fy_model_load(rc->model_path, &R->model))) return st;
    fy_model_id(R->model, R->model_id, sizeof(R->model_id));
    const fy_model_config_t *mc = fy_model_config(R->model);
    R->vocab = mc->vocab_size;
    R->max_ctx = mc->max_ctx;
    R->pool_ctx = R->max_ctx;
    R->max_prompt_bytes = (size_t)R->max_ctx * fy_tokenizer_max_token_text(fy_model_tokenizer(R->model));
    int32_t win[FY_KV_MAX_LAYERS]; /* the workers' KV groups: names and block counts agree */
    for (int32_t l = 0; l < mc->n_layers && l < FY_KV_MAX_LAYERS; l++) win[l] = mc->layer[l].window;
    if ((st = fy_kv_layout_make(&R->lay, mc->n_layers, mc->n_kv_heads, mc->head_dim, rc->block_size, rc->dtype,
                                rc->sliding_groups ? win : NULL)))
        return st;
    /* the deployment's hasher (kv.secret_file): the workers name blocks with the same key */
    if ((st = fy_kv_hasher_for(rc->prefix_key, rc->prefix_key_len, &R->hasher))) return st;
    const char *rname = rc->router_name;
    R->etcd = rc->members.etcd[0] != 0;
    snprintf(R->name, sizeof(R->name), "router");
    if (R->etcd) { /* one of several: a name, an incarnation and request ids of its own */
        if (sodium_init() < 0) return FY_ERR_INTERNAL;
        if (*rname) {
            snprintf(R->name, sizeof(R->name), "%.*s", (int)sizeof(R->name) - 1, rname); /* cut as before */
        } else {
            char host[64] = "host";
            gethostname(host, sizeof(host) - 1);
            for (char *h = host; *h; h++)
                if (*h == '.' || *h == '/') *h = 0;
            snprintf(R->name, sizeof(R->name), "router-%.40s-%d", host, (int)getpid());
        }
        while (!R->inc) randombytes_buf(&R->inc, sizeof(R->inc));
        R->tag = 1 + randombytes_uniform((1u << 20) - 1);
        R->next_id = (uint64_t)R->tag << 32;
        fy_log_set_prefix(R->name);
    }
    if ((st = fy_cluster_auth(rc->secret_file, rc->encrypt, FY_ROLE_ROUTER, R->name, R->inc, &R->auth))) return st;
    /* small bodies wait as requests wait for placement (router.max_queue):
     * a burst of ordinary requests is never refused here */
    int32_t quick_cap = (int32_t)(max_queue > parse_queue ? max_queue : parse_queue);
    if ((st = fy_workq_create((int32_t)parse_threads, quick_cap, (int32_t)parse_queue, &R->parse))) return st;
    if ((st = fy_grammar_cache_create(64, &R->grammars))) return st;
    if (R->max_prompt_bytes)
        fy_info("prompts of more than %zu bytes of text cannot fit %d tokens: refused before tokenizing; %lld parse "
                "threads, %lld queued at most (%d small ones)",
                R->max_prompt_bytes, R->max_ctx, (long long)parse_threads, (long long)parse_queue, quick_cap);
    /* the sockets are published under the lock: their callbacks read them there */
    fy_pull_t *pull;
    fy_rpc_server_t *srv;
    if ((st = fy_pull_create(R->events_url, &R->auth, FY_RPC_FROM(FY_ROLE_PREFILL) | FY_RPC_FROM(FY_ROLE_DECODE),
                             on_event, R, &pull)))
        return st;
    pthread_mutex_lock(&R->mu);
    R->events = pull;
    pthread_mutex_unlock(&R->mu);
    if ((st = fy_rpc_server_create(R->listen, 256, &R->auth, FY_RPC_FROM(FY_ROLE_CLIENT), on_client, R, &srv)))
        return st;
    /* before authentication a connection can hold at most a frame of the
     * largest message its port takes (wire.c's bounds): a generate of
     * MAX_PROMPT_TOKENS or 1 MiB of text on the client port; any worker
     * event about a prompt that long on the events port */
    static const char *const from_clients[] = {"client → router"};
    static const char *const from_workers[] = {"worker → router", "decode worker → router", "prefill worker → router"};
    fy_wire_lim_t wl = {.token_hi = R->vocab - 1,
                        .max_prompt = MAX_PROMPT_TOKENS,
                        .n_prompt = MAX_PROMPT_TOKENS,
                        .max_ctx = R->max_ctx,
                        .block_size = R->lay.block_size,
                        .kv_groups = R->lay.n_groups};
    fy_rpc_limits_t cl = {.max_msg = fy_wire_max_route(from_clients, 1, &wl),
                          .max_conns = FY_RPC_SERVER_CONNS,
                          .max_pending = FY_RPC_PENDING,
                          .auth_s = FY_RPC_AUTH_S};
    fy_rpc_limits_t el = {.max_msg = fy_wire_max_route(from_workers, 3, &wl),
                          .max_conns = FY_RPC_PULL_CONNS,
                          .max_pending = FY_RPC_PENDING,
                          .auth_s = FY_RPC_AUTH_S};
    if (cl.max_msg > FY_RPC_MAX_MSG) cl.max_msg = FY_RPC_MAX_MSG;
    if (el.max_msg > FY_RPC_MAX_MSG) el.max_msg = FY_RPC_MAX_MSG;
    fy_rpc_server_limit(srv, &cl);
    fy_pull_limit(pull, &el);
    fy_info("before authentication: frames of at most %zu KiB from a client, %zu KiB from a worker; %d connections "
            "not yet authenticated per port, %.0f s to authenticate",
            cl.max_msg >> 10, el.max_msg >> 10, cl.max_pending, cl.auth_s);
    pthread_mutex_lock(&R->mu);
    R->srv = srv;
    pthread_mutex_unlock(&R->mu);
    if ((st = metrics_setup(R))) return st;
    if (R->door && (st = R->door->start(R, &R->door_h))) return st;
    if (pthread_create(&R->hk, NULL, hk_main, R)) return FY_ERR_INTERNAL;
    R->hk_on = true;
    if (R->etcd && (st = membership_start(R))) return st;
    fy_info("router up: clients on %s, worker events on %s, model %s%s", R->listen, R->events_url, R->model_id,
            R->colocated ? " (colocated: decode workers run whole requests)" : "");
    return FY_OK;
}

static void teardown(router_t *R)
{
    /* prompts not yet parsed are answered while the sockets still carry
     * answers; the queue refuses what comes after, until it is freed once
     * nothing can push to it (the client port and the front door gone) */
    fy_workq_stop(R->parse);
    fy_membership_stop(R->members); /* the record goes: workers end what they still hold of ours */
    R->members = NULL;
    if (R->door) R->door->stop(R->door_h); /* its requests cancelled, its sockets closed */
    R->door_h = NULL;
    if (R->hk_on) {
        pthread_mutex_lock(&R->mu);
        R->stop = true;
        pthread_mutex_unlock(&R->mu);
        pthread_join(R->hk, NULL);
    }
    /* cleared under the lock: status calls read it there */
    pthread_mutex_lock(&R->mu);
    fy_pull_t *events = R->events;
    R->events = NULL;
    pthread_mutex_unlock(&R->mu);
    fy_pull_destroy(events);
    /* every request ends (workers told to let go), every held poll is answered */
    pthread_mutex_lock(&R->mu);
    for (rreq_t *q = R->all; q; q = q->next) {
        finish_req(R, q, FY_ERR_CANCELLED, "the router is shutting down");
        if (q->poll) {
            fy_rpc_call_t *c = q->poll;
            q->poll = NULL;
            reply_events(R, q, c, q->poll_from, q->poll_text);
        }
    }
    pthread_mutex_unlock(&R->mu);
    fy_rpc_server_destroy(R->srv);
    fy_workq_destroy(R->parse);
    R->parse = NULL;
    while (R->all) req_free(R, R->all);
    for (int i = 0; i < R->n_workers; i++) {
        fy_push_destroy(R->workers[i].push);
        fy_free(R->workers[i].bloom);
    }
    fy_free(R->listed);
    fy_kv_hasher_destroy(R->hasher);
    fy_grammar_cache_destroy(R->grammars);
    fy_env_auth_wipe(&R->auth);
    fy_metrics_destroy(R->reg);
    fy_model_destroy(R->model);
    fy_router_conf_wipe_secrets(&R->conf);
}

/*
 * SIGINT or SIGTERM arrived: new requests are refused from now on (nng
 * generate with `overloaded`, HTTP with 503 and Retry-After, /health
 * 503), running ones have router.drain_timeout to finish, then the rest
 * end with an error (a terminal event on HTTP streams, done with an error
 * on nng polls), and their clients get a moment to see it.  A second
 * signal cuts the wait short.
 */
static void drain(router_t *R, sigset_t *sigs)
{
    double t0 = fy_now_s();
    const struct timespec tick_ts = {0, 20 * 1000 * 1000};
    int running = 0, live;
    bool hurry = false;
    pthread_mutex_lock(&R->mu);
    R->draining = true;
    if (R->door) R->door->drain(R->door_h);
    for (rreq_t *q = R->all; q; q = q->next) running += q->state != RQ_DONE;
    pthread_mutex_unlock(&R->mu);
    fy_info("draining: %d request%s running, new ones refused; waiting up to %.1f s (router.drain_timeout)", running,
            running == 1 ? "" : "s", R->drain_timeout);
    for (;;) {
        pthread_mutex_lock(&R->mu);
        running = 0;
        for (rreq_t *q = R->all; q; q = q->next) running += q->state != RQ_DONE;
        live = R->door ? R->door->live(R->door_h) : 0;
        pthread_mutex_unlock(&R->mu);
        if ((!running && !live) || fy_now_s() - t0 >= R->drain_timeout) break;
        if (sigtimedwait(sigs, NULL, &tick_ts) > 0) {
            fy_info("a second signal: ending the running requests now");
            hurry = true;
            break;
        }
    }
    int cut = 0;
    pthread_mutex_lock(&R->mu);
    for (rreq_t *q = R->all; q; q = q->next) {
        if (q->state == RQ_DONE) continue;
        finish_req(R, q, FY_ERR_CANCELLED, "the router is shutting down (its drain time of %.1f s is over)",
                   R->drain_timeout);
        cut++;
    }
    pthread_mutex_unlock(&R->mu);
    if (cut) fy_warn("drain: %d request%s cut short", cut, cut == 1 ? "" : "s");
    /* the clients see their ends: HTTP answers written, nng clients' next polls answered */
    double t1 = fy_now_s();
    while (!hurry && fy_now_s() - t1 < 2.0) {
        int unseen = 0;
        pthread_mutex_lock(&R->mu);
        live = R->door ? R->door->live(R->door_h) : 0;
        for (rreq_t *q = R->all; q; q = q->next) unseen += !q->done_seen && !q->watch;
        pthread_mutex_unlock(&R->mu);
        if (!live && !unseen) break;
        if (sigtimedwait(sigs, NULL, &tick_ts) > 0) break;
    }
    fy_info("drained in %.2f s", fy_now_s() - t0);
}

int fy_router_run(int argc, char **argv, const fy_router_door_t *door)
{
    fy_log_crash_reports();
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    fy_cluster_raise_nofile();
    router_t *R = fy_calloc(1, sizeof(*R));
    if (!R) return 1;
    R->door = door;
    pthread_mutex_init(&R->mu, NULL);
    /* the configuration is read once, here (router_config.h) */
    bool loaded;
    fy_status_t st = fy_router_conf_load(argc, argv, "-c FILE [--set section.key=value]...", &R->conf, &loaded);
    int rc = 0;
    if (loaded) {
        if (!st) st = setup(R);
        fy_router_conf_wipe_secrets(&R->conf); /* the hasher, credentials and membership hold what they need */
        if (st) {
            fy_error("router: start-up failed: %s", fy_status_str(st));
            rc = 1;
        } else {
            /* every listener is bound: `ferry serve` may count us in */
            fy_cluster_notify_ready();
            int sig = 0;
            sigwait(&sigs, &sig);
            fy_info("%s: shutting down", sig == SIGINT ? "SIGINT" : "SIGTERM");
            drain(R, &sigs);
        }
        teardown(R);
    } else {
        rc = st == FY_ERR_CANCELLED ? 0 : 2;
    }
    pthread_mutex_destroy(&R->mu);
    fy_free(R);
    return rc;
}

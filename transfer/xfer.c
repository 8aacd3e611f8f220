/*
 * xfer.c - the transfer engine: a UCX context, worker and registered arena
 * per fy_xfer_t, and the one thread that owns the worker.
 *
 * Everything UCX happens on that thread (the worker is
 * UCS_THREAD_MODE_SINGLE).  Public calls put commands on a mutex-protected
 * queue and poke an eventfd; the thread takes the queue, progresses the
 * worker, acts on what the UCX callbacks recorded, checks deadlines, and
 * completes jobs.  UCX callbacks only record (counters, flags): closing
 * endpoints, failing jobs and calling the user's callbacks happen in the
 * loop, outside ucp_worker_progress, so no UCX call is made re-entrantly
 * except the handshake reply, which UCX allows from an AM handler.
 *
 * Peers are keyed by the target's worker address bytes.  A peer is
 * CONNECTING (endpoint created, hello sent), READY (reply was OK; rkey
 * unpacked), REFUSED (layouts differ: kept so later jobs fail at once) or
 * FAILED (endpoint error, handshake timeout, or closed by force; taken off
 * the lookup list so the next job reconnects, freed once its endpoint is
 * closed and no job refers to it).
 *
 * Not here: the byte formats (xfer_wire.c).
 */
#include "transfer/xfer.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"
#include "transfer/reshard.h"
#include "transfer/xfer_wire.h"

#define DEFAULT_CONNECT_TIMEOUT_S 5.0
#define SHUTDOWN_LIMIT_S 2.0 /* forced closes complete at once; graceful ones need a live peer */
#define SHUTDOWN_FLUSH_S 2.0 /* shutdown_flush */
#define AM_ID_HELLO 1        /* the worker is ours alone, so small ids cannot clash */
#define AM_ID_REPLY 2

struct fy_xfer_job;

/* One fy_xfer_job_put_then call's release: fires once none of its runs
 * can read its source any more (transfer thread only; on its job's list
 * from its command on, freed with the job). */
typedef struct xfer_mark {
    struct xfer_mark *next;
    struct fy_xfer_job *job;
    fy_xfer_release_fn fn;
    void *arg;
    int32_t runs_left; /* runs of its call neither issued nor dropped yet */
    int outstanding;   /* its puts UCX holds */
    bool fired;
} xfer_mark_t;

/* A run of blocks consecutive on both sides: one put; or (len > 0) one
 * piece of one block (fy_xfer_job_put_piece). */
typedef struct xfer_run {
    int32_t src, dst, count;
    uint64_t src_off, dst_off, len;
    xfer_mark_t *mark; /* put_then: whose release waits for this run; else NULL */
} xfer_run_t;

typedef enum cmd_type { CMD_BEGIN, CMD_PUT, CMD_FINISH, CMD_ABORT } cmd_type_t;

typedef struct xfer_cmd {
    struct xfer_cmd *next;
    cmd_type_t type;
    fy_xfer_job_t *job;
    int32_t n_runs;
    xfer_run_t *runs;  /* CMD_PUT: in the same allocation, after the command */
    xfer_mark_t *mark; /* CMD_PUT from put_then: linked to the job by the thread */
} xfer_cmd_t;

typedef enum peer_state { PEER_CONNECTING, PEER_READY, PEER_REFUSED, PEER_FAILED } peer_state_t;

typedef struct xfer_peer {
    struct xfer_peer *next; /* x->peers (CONNECTING, READY, REFUSED) or x->dead (FAILED) */
    fy_xfer_t *x;
    uint64_t cookie; /* echoed by the target's reply */
    peer_state_t state;
    uint8_t *addr; /* worker address: the key; addr and rkey_buf in one allocation */
    uint32_t addr_len;
    uint8_t *rkey_buf;
    uint32_t rkey_len;
    uint64_t arena_base, arena_bytes, block_bytes;
    char name[FY_XFER_NAME_LEN];
    ucp_ep_h ep;     /* NULL once closed or closing */
    ucp_rkey_h rkey; /* unpacked when the handshake succeeds */
    double hs_deadline;
    uint8_t hello[FY_XFER_HELLO_LEN]; /* must outlive its send */
    bool hello_inflight, close_inflight, flush_inflight;
    bool abandoned; /* failed without peer error handling: its endpoint stays open until the worker goes */
    /* recorded by UCX callbacks, acted on by the loop */
    bool ep_failed;
    ucs_status_t ep_status;
    bool got_reply;
    fy_xfer_reply_t reply;
    bool same_shape;   /* READY: the target's layout is ours (whole blocks may go); else pieces only */
    fy_xfer_mem_t mem; /* READY: the target's memory (its reply) */
    int n_jobs;        /* jobs attached to this peer */
    char refusal[256]; /* REFUSED: what every job to it reports */
} xfer_peer_t;

struct fy_xfer_job {
    fy_xfer_t *x;
    /* set by fy_xfer_job_begin, read-only afterwards (any thread) */
    int32_t remote_blocks;
    _Atomic double deadline; /* only moves later (fy_xfer_job_extend) */
    fy_xfer_done_fn cb;
    void *arg;
    _Atomic int caller_st; /* an error fy_xfer_job_put returned; the thread fails the job with it */
    uint8_t *blob;         /* the target blob until the thread attaches the job to a peer */
    fy_xfer_target_t target;
    xfer_cmd_t begin_cmd, end_cmd; /* allocated with the job, so begin/finish/abort cannot fail */
    /* transfer thread only */
    struct fy_xfer_job *next, *prev;
    xfer_peer_t *peer;
    xfer_run_t *pending; /* queued before the handshake completed */
    int32_t n_pending, cap_pending;
    xfer_mark_t *marks; /* put_then's releases, fired or not */
    int outstanding;    /* UCX requests in flight: puts and the flush */
    bool ended, flush_issued, flushed;
    bool orphan; /* cb ran while UCX still held a request (FY_XFER_ERRMODE_NONE only); on x->zombies */
    fy_status_t st;
    char msg[256];
};

typedef struct xfer_reply_buf {
    struct xfer_reply_buf *next, *prev;
    fy_xfer_t *x;
    uint8_t bytes[FY_XFER_REPLY_LEN];
} xfer_reply_buf_t;

struct fy_xfer {
    fy_xfer_layout_t layout;
    uint8_t *arena;
    size_t arena_bytes;
    int32_t n_blocks;
    double connect_timeout_s;
    fy_xfer_errmode_t err_mode;
    fy_xfer_mem_t mem; /* what the arena is (never UNSTATED here) */
    bool ucx_cuda;     /* this context supports CUDA memory */
    char name[FY_XFER_NAME_LEN];

    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_mem_h memh;
    uint8_t *blob;
    size_t blob_len;
    int worker_fd, event_fd, epoll_fd;
    pthread_t thread;
    bool thread_started;

    pthread_mutex_t lock; /* guards the queue and stop */
    xfer_cmd_t *q_head, *q_tail;
    bool stop;

    /* transfer thread only */
    fy_xfer_job_t *jobs;
    fy_xfer_job_t *zombies; /* orphans: completed, waiting for UCX to give back their requests */
    xfer_peer_t *peers, *dead;
    xfer_reply_buf_t *replies; /* handshake replies in flight (target side) */
    uint64_t next_cookie;
    bool arm_broken;

    struct {
        _Atomic uint64_t jobs_ok, jobs_failed, puts, bytes, layout_refusals, peers_connected, peer_failures,
            mem_refusals;
    } stats;

    /* fy_xfer_health: pings sent (by its caller) and the last one the thread saw */
    _Atomic uint64_t ping_sent, ping_seen;
    double ping_t; /* when the unanswered ping was sent (the caller's) */
};

/* ---- jobs: state changes (transfer thread) ------------------------------------------------- */

/* The first error is the one the job reports; later ones are dropped. */
__attribute__((format(printf, 3, 4))) static void job_fail(fy_xfer_job_t *j, fy_status_t st, const char *fmt, ...)
{
    if (j->st != FY_OK) return;
    j->st = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(j->msg, sizeof(j->msg), fmt, ap);
    va_end(ap);
    fy_debug("xfer: job to %s failed: %s", j->target.name, j->msg);
}

static void put_done(void *request, ucs_status_t status, void *user_data)
{
    fy_xfer_job_t *j = user_data;
    j->outstanding--;
    if (status != UCS_OK) job_fail(j, FY_ERR_PEER, "put to %s failed: %s", j->target.name, ucs_status_string(status));
    ucp_request_free(request);
}

/* a put of a put_then call: its mark counts it too */
static void put_mark_done(void *request, ucs_status_t status, void *user_data)
{
    xfer_mark_t *m = user_data;
    fy_xfer_job_t *j = m->job;
    m->outstanding--;
    j->outstanding--;
    if (status != UCS_OK) job_fail(j, FY_ERR_PEER, "put to %s failed: %s", j->target.name, ucs_status_string(status));
    ucp_request_free(request);
}

/* Runs that will never be issued (the job failed): their marks stop waiting for them. */
static void runs_drop(const xfer_run_t *r, int32_t n)
{
    for (int32_t i = 0; i < n; i++)
        if (r[i].mark) r[i].mark->runs_left--;
}

/* Releases whose puts are all done, or will never be issued: the loop's,
 * outside UCX callbacks.  all: the job is completing, every one goes. */
static void fire_marks(fy_xfer_job_t *j, bool all)
{
    for (xfer_mark_t *m = j->marks; m; m = m->next) {
        if (m->fired || (!all && (m->outstanding > 0 || (m->runs_left > 0 && j->st == FY_OK)))) continue;
        m->fired = true;
        m->fn(m->arg);
    }
}

static void flush_done(void *request, ucs_status_t status, void *user_data)
{
    fy_xfer_job_t *j = user_data;
    j->outstanding--;
    if (status == UCS_OK)
        j->flushed = true;
    else
        job_fail(j, FY_ERR_PEER, "flush to %s failed: %s", j->target.name, ucs_status_string(status));
    ucp_request_free(request);
}

static void issue_run(fy_xfer_job_t *j, const xfer_run_t *r)
{
    fy_xfer_t *x = j->x;
    xfer_peer_t *p = j->peer;
    size_t off = (size_t)r->src * x->layout.block_bytes + r->src_off;
    size_t len = r->len ? r->len : (size_t)r->count * x->layout.block_bytes;
    uint64_t raddr = p->arena_base + (uint64_t)r->dst * p->block_bytes + r->dst_off;
    if (!r->len && !p->same_shape) { /* a whole block of one shape into a rank of another: garbage there */
        job_fail(j, FY_ERR_MISMATCH, "whole blocks to %s, a rank of another shape: only pieces (reshard.h) go there",
                 p->name);
        return;
    }
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMH,
        .cb.send = r->mark ? put_mark_done : put_done,
        .user_data = r->mark ? (void *)r->mark : (void *)j,
        .memh = x->memh,
    };
    ucs_status_ptr_t sp = ucp_put_nbx(p->ep, x->arena + off, len, raddr, p->rkey, &prm);
    if (UCS_PTR_IS_ERR(sp)) {
        job_fail(j, FY_ERR_PEER, "put to %s failed: %s", p->name, ucs_status_string(UCS_PTR_STATUS(sp)));
        return;
    }
    if (sp) {
        j->outstanding++;
        if (r->mark) r->mark->outstanding++;
    }
    atomic_fetch_add(&x->stats.puts, 1);
    atomic_fetch_add(&x->stats.bytes, len);
}

static void job_issue(fy_xfer_job_t *j, const xfer_run_t *r)
{
    issue_run(j, r);
    if (r->mark) r->mark->runs_left--; /* issued, or failed (and so never issued) */
}

static void job_flush(fy_xfer_job_t *j)
{
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send = flush_done,
        .user_data = j,
    };
    j->flush_issued = true;
    ucs_status_ptr_t sp = ucp_ep_flush_nbx(j->peer->ep, &prm);
    if (UCS_PTR_IS_ERR(sp))
        job_fail(j, FY_ERR_PEER, "flush to %s failed: %s", j->target.name, ucs_status_string(UCS_PTR_STATUS(sp)));
    else if (sp)
        j->outstanding++;
    else
        j->flushed = true;
}

/* Moves the job as far as it can go now: fails it past its deadline,
 * issues what waited for the handshake, flushes once the caller finished.
 * True when it is complete (cb may run). */
static void job_take_caller_error(fy_xfer_job_t *j)
{
    int cst = atomic_load(&j->caller_st);
    if (cst != FY_OK)
        job_fail(j, (fy_status_t)cst, "%s",
                 cst == FY_ERR_INVALID ? "a put named a block out of range" : "out of memory queueing puts");
}

static bool job_advance(fy_xfer_job_t *j, double now)
{
    job_take_caller_error(j);
    if (j->st == FY_OK && now > j->deadline)
        job_fail(j, FY_ERR_TIMEOUT, "deadline passed before the transfer to %s completed", j->target.name);
    if (j->st == FY_OK && j->peer && j->peer->state == PEER_READY) {
        int32_t i = 0;
        for (; i < j->n_pending && j->st == FY_OK; i++) job_issue(j, &j->pending[i]);
        runs_drop(j->pending + i, j->n_pending - i);
        j->n_pending = 0;
        if (j->st == FY_OK && j->ended && !j->flush_issued) job_flush(j);
    }
    return j->ended && (j->outstanding == 0 || j->orphan) && (j->st != FY_OK || j->flushed);
}

static void job_unlink(fy_xfer_t *x, fy_xfer_job_t *j)
{
    if (j->prev)
        j->prev->next = j->next;
    else
        x->jobs = j->next;
    if (j->next) j->next->prev = j->prev;
    j->next = j->prev = NULL;
}

static void job_free(fy_xfer_job_t *j)
{
    if (j->peer) j->peer->n_jobs--;
    while (j->marks) {
        xfer_mark_t *m = j->marks;
        j->marks = m->next;
        fy_free(m);
    }
    fy_free(j->pending);
    fy_free(j->blob);
    fy_free(j);
}

/* Runs the user's callback and frees the job.  Called from the loop only,
 * never inside a UCX callback, so cb may start new jobs. */
static void job_complete(fy_xfer_t *x, fy_xfer_job_t *j)
{
    job_unlink(x, j);
    atomic_fetch_add(j->st == FY_OK ? &x->stats.jobs_ok : &x->stats.jobs_failed, 1);
    fire_marks(j, true); /* before cb, as xfer.h promises */
    j->cb(j->arg, j->st, j->st == FY_OK ? NULL : j->msg);
    if (j->outstanding > 0) {
        /* the UCX callbacks still point at it */
        j->next = x->zombies;
        x->zombies = j;
        return;
    }
    job_free(j);
}

static void reap_zombies(fy_xfer_t *x)
{
    for (fy_xfer_job_t **jj = &x->zombies; *jj;) {
        fy_xfer_job_t *j = *jj;
        if (j->outstanding == 0) {
            *jj = j->next;
            job_free(j);
        } else {
            jj = &j->next;
        }
    }
}

/* ---- peers (transfer thread) --------------------------------------------------------------- */

static void close_done(void *request, ucs_status_t status, void *user_data)
{
    xfer_peer_t *p = user_data;
    p->close_inflight = false;
    ucp_request_free(request);
}

/* Closes the endpoint.  By force when the peer failed or will not finish
 * its puts: every request on it then completes (UCS_ERR_CANCELED), so no
 * put is in flight when a job's cb runs, where a graceful close would wait
 * on the very peer that is failing.  Gracefully when the peer is healthy
 * (refused, shutting down) and the endpoints have no peer error handling:
 * UCX calls a forced close without it undefined behaviour at the peer. */
static void peer_close(xfer_peer_t *p, bool force)
{
    if (!p->ep) return;
    if (p->x->err_mode == FY_XFER_ERRMODE_PEER) {
        force = true;
    } else if (force) {
        /* UCX 1.13 refuses a forced close without peer error handling, and
         * a graceful one would wait on the failed peer forever: the
         * endpoint is left to ucp_worker_destroy */
        p->ep = NULL;
        p->abandoned = true;
        return;
    }
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
        .cb.send = close_done,
        .user_data = p,
        .flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0,
    };
    ucp_ep_h ep = p->ep;
    p->ep = NULL;
    ucs_status_ptr_t sp = ucp_ep_close_nbx(ep, &prm);
    if (UCS_PTR_IS_ERR(sp))
        fy_debug("xfer: closing the endpoint to %s: %s", p->name, ucs_status_string(UCS_PTR_STATUS(sp)));
    else if (sp)
        p->close_inflight = true;
}

static void peer_unlink(xfer_peer_t **list, xfer_peer_t *p)
{
    for (xfer_peer_t **pp = list; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            p->next = NULL;
            return;
        }
}

/* The connection is gone or given up: every job on it fails, the peer
 * leaves the lookup list (a later job reconnects) and its endpoint closes. */
__attribute__((format(printf, 3, 4))) static void peer_fail(xfer_peer_t *p, fy_status_t st, const char *fmt, ...)
{
    fy_xfer_t *x = p->x;
    if (p->state == PEER_FAILED || p->state == PEER_REFUSED) return; /* a refusal stands; its endpoint is closed */
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fy_warn("xfer: %s", msg);
    atomic_fetch_add(&x->stats.peer_failures, 1);
    peer_unlink(&x->peers, p);
    p->next = x->dead;
    x->dead = p;
    p->state = PEER_FAILED;
    for (fy_xfer_job_t *j = x->jobs; j; j = j->next)
        if (j->peer == p) job_fail(j, st, "%s", msg);
    peer_close(p, true);
}

static void peer_refuse(xfer_peer_t *p, bool mem, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* mem: the sides' memory cannot meet (fy_xfer_mem_explain); else their layouts differ */
static void peer_refuse(xfer_peer_t *p, bool mem, const char *fmt, ...)
{
    fy_xfer_t *x = p->x;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->refusal, sizeof(p->refusal), fmt, ap);
    va_end(ap);
    fy_error("xfer: %s", p->refusal);
    atomic_fetch_add(mem ? &x->stats.mem_refusals : &x->stats.layout_refusals, 1);
    p->state = PEER_REFUSED;
    for (fy_xfer_job_t *j = x->jobs; j; j = j->next)
        if (j->peer == p) job_fail(j, FY_ERR_MISMATCH, "%s", p->refusal);
    peer_close(p, false);
}

static void peer_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    xfer_peer_t *p = arg;
    p->ep_failed = true;
    p->ep_status = status;
}

static void hello_done(void *request, ucs_status_t status, void *user_data)
{
    xfer_peer_t *p = user_data;
    p->hello_inflight = false;
    if (status != UCS_OK && !p->ep_failed) {
        p->ep_failed = true;
        p->ep_status = status;
    }
    ucp_request_free(request);
}

static xfer_peer_t *peer_find(fy_xfer_t *x, const uint8_t *addr, uint32_t len)
{
    for (xfer_peer_t *p = x->peers; p; p = p->next)
        if (p->addr_len == len && !memcmp(p->addr, addr, len)) return p;
    return NULL;
}

/* Creates the endpoint and sends the hello; the peer stays CONNECTING until
 * the reply.  On failure the job is failed and NULL returned. */
static xfer_peer_t *peer_connect(fy_xfer_t *x, fy_xfer_job_t *j)
{
    const fy_xfer_target_t *t = &j->target;
    xfer_peer_t *p = fy_calloc(1, sizeof(*p));
    uint8_t *keys = fy_malloc((size_t)t->addr_len + t->rkey_len);
    if (!p || !keys) {
        fy_free(p);
        fy_free(keys);
        job_fail(j, FY_ERR_NOMEM, "out of memory connecting to %s", t->name);
        return NULL;
    }
    p->x = x;
    p->cookie = ++x->next_cookie;
    p->addr = keys;
    p->addr_len = t->addr_len;
    memcpy(p->addr, t->addr, t->addr_len);
    p->rkey_buf = keys + t->addr_len;
    p->rkey_len = t->rkey_len;
    memcpy(p->rkey_buf, t->rkey, t->rkey_len);
    p->arena_base = t->arena_base;
    p->arena_bytes = t->arena_bytes;
    p->block_bytes = t->block_bytes;
    memcpy(p->name, t->name, sizeof(p->name));
    p->hs_deadline = fy_now_s() + x->connect_timeout_s;

    ucp_ep_params_t ep_params = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
        .address = (const ucp_address_t *)p->addr,
        .err_mode = UCP_ERR_HANDLING_MODE_NONE,
    };
    if (x->err_mode == FY_XFER_ERRMODE_PEER) {
        ep_params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
        ep_params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
        ep_params.err_handler = (ucp_err_handler_t){.cb = peer_err_cb, .arg = p};
    }
    ucs_status_t us = ucp_ep_create(x->worker, &ep_params, &p->ep);
    if (us != UCS_OK) {
        fy_warn("xfer: cannot connect to %s: %s", p->name, ucs_status_string(us));
        atomic_fetch_add(&x->stats.peer_failures, 1);
        job_fail(j, FY_ERR_PEER, "cannot connect to %s: %s", p->name, ucs_status_string(us));
        fy_free(keys);
        fy_free(p);
        return NULL;
    }
    p->next = x->peers;
    x->peers = p;

    fy_xfer_hello_t h = {.cookie = p->cookie, .layout = x->layout, .mem = x->mem, .ucx_cuda = x->ucx_cuda};
    memcpy(h.name, x->name, sizeof(h.name));
    fy_xfer_hello_pack(&h, p->hello);
    /* REPLY: the target answers on the endpoint UCX made for us there,
     * without having to connect back through our address */
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
        .cb.send = hello_done,
        .user_data = p,
        .flags = UCP_AM_SEND_FLAG_REPLY,
    };
    ucs_status_ptr_t sp = ucp_am_send_nbx(p->ep, AM_ID_HELLO, NULL, 0, p->hello, sizeof(p->hello), &prm);
    if (UCS_PTR_IS_ERR(sp)) {
        p->n_jobs++; /* so that peer_fail reaches this job through x->jobs */
        j->peer = p;
        peer_fail(p, FY_ERR_PEER, "cannot send the handshake to %s: %s", p->name,
                  ucs_status_string(UCS_PTR_STATUS(sp)));
        return NULL;
    }
    p->hello_inflight = sp != NULL;
    fy_debug("xfer: connecting to %s", p->name);
    return p;
}

/* One debug line naming the transports UCX chose for a connection (the
 * lanes of ucp_ep_print_info): whether it is shared memory or TCP matters
 * for throughput by an order of magnitude. */
static void log_lanes(xfer_peer_t *p)
{
    char *text = NULL, lanes[256] = "";
    size_t len = 0, used = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return;
    ucp_ep_print_info(p->ep, f);
    fclose(f);
    for (char *l = text ? strstr(text, "lane[") : NULL; l; l = strstr(l + 1, "lane[")) {
        char tl[64];
        /* "lane[0]:  1:tcp/lo.0 md[1] -> ..." */
        if (sscanf(l, "lane[%*d]: %*d:%63s", tl) == 1 && used < sizeof(lanes))
            used += (size_t)snprintf(lanes + used, sizeof(lanes) - used, "%s%s", used ? ", " : "", tl);
    }
    fy_debug("xfer: connected to %s over %s", p->name, used ? lanes : "(no lanes printed)");
    free(text); /* open_memstream's buffer comes from malloc */
}

/* Acts on what the reply handler recorded. */
/* Do here and peer refuse each other (why says so, from here's side)?
 * Equal layouts connect; so do two ranks of one model in different
 * shapes that re-sharding maps (src: the initiator's layout, whose
 * blocks go to the target), which then take pieces only. */
static bool handshake_refuses(const fy_xfer_layout_t *here, const fy_xfer_layout_t *peer, const fy_xfer_layout_t *src,
                              char *why, size_t cap)
{
    if (!fy_xfer_layout_explain(here, peer, why, cap)) return false;
    /* the same but for what a shard changes? then it is re-sharding's call */
    fy_xfer_layout_t p = *peer;
    p.n_layers = here->n_layers, p.n_kv_heads = here->n_kv_heads, p.block_bytes = here->block_bytes;
    p.groups = here->groups;
    p.tp = here->tp, p.pp = here->pp, p.tp_rank = here->tp_rank, p.stage = here->stage;
    p.layer0 = here->layer0, p.kv_head0 = here->kv_head0;
    if (fy_xfer_layout_diff(here, &p)) /* a difference no shard explains: name it */
        return fy_xfer_layout_explain(here, &p, why, cap);
    const fy_xfer_layout_t *dst = src == here ? peer : here;
    return fy_xfer_reshard_pair(src, dst, why, cap) != FY_OK;
}

static void peer_handle_reply(xfer_peer_t *p)
{
    fy_xfer_t *x = p->x;
    const fy_xfer_reply_t *r = &p->reply;
    char why[256];
    p->got_reply = false;
    if (p->state != PEER_CONNECTING) return;
    /* our own comparison names the field from this side ("16 here, 32 at
     * the peer"); the target's text only when we see no difference */
    if (handshake_refuses(&x->layout, &r->layout, &x->layout, why, sizeof(why))) {
        peer_refuse(p, false, "%s (target %s)", why, p->name);
        return;
    }
    fy_xfer_mem_t pm = r->mem == FY_XFER_MEM_UNSTATED ? FY_XFER_MEM_HOST : r->mem;
    if (fy_xfer_mem_explain(x->mem, x->ucx_cuda, pm, r->ucx_cuda, why, sizeof(why))) {
        peer_refuse(p, true, "%s (target %s)", why, p->name);
        return;
    }
    if (!r->ok) {
        peer_refuse(p, !strncmp(r->message, "kv memory mismatch", 18), "target %s refused the connection: %s", p->name,
                    r->message);
        return;
    }
    if (p->block_bytes != r->layout.block_bytes) {
        peer_fail(p, FY_ERR_FORMAT, "target %s: its descriptor says %" PRIu64 "-byte blocks, its handshake %" PRIu64,
                  p->name, p->block_bytes, r->layout.block_bytes);
        return;
    }
    ucs_status_t us = ucp_ep_rkey_unpack(p->ep, p->rkey_buf, &p->rkey);
    if (us != UCS_OK) {
        p->rkey = NULL;
        peer_fail(p, FY_ERR_PEER, "cannot unpack the rkey of %s: %s", p->name, ucs_status_string(us));
        return;
    }
    if (fy_log_get_level() >= FY_LOG_DEBUG) log_lanes(p);
    p->same_shape = fy_xfer_layout_same_data(&x->layout, &r->layout); /* same bytes: whole blocks may go */
    p->mem = pm;
    fy_debug("xfer: %s: %s here, %s at the target", p->name, fy_xfer_mem_name(x->mem), fy_xfer_mem_name(pm));
    p->state = PEER_READY;
    atomic_fetch_add(&x->stats.peers_connected, 1);
}

static void peer_free(xfer_peer_t *p)
{
    if (p->rkey) ucp_rkey_destroy(p->rkey);
    fy_free(p->addr);
    fy_free(p);
}

/* ---- active messages ----------------------------------------------------------------------- */

static void reply_buf_free(xfer_reply_buf_t *b)
{
    if (b->prev)
        b->prev->next = b->next;
    else
        b->x->replies = b->next;
    if (b->next) b->next->prev = b->prev;
    fy_free(b);
}

static void reply_done(void *request, ucs_status_t status, void *user_data)
{
    /* a failed reply needs nothing here: the initiator times out or sees
     * its endpoint fail */
    reply_buf_free(user_data);
    ucp_request_free(request);
}

/* Target side: compare the initiator's layout with ours and answer. */
static ucs_status_t am_hello(void *arg, const void *header, size_t header_length, void *data, size_t length,
                             const ucp_am_recv_param_t *param)
{
    fy_xfer_t *x = arg;
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        fy_warn("xfer: ignoring a %zu-byte handshake (far larger than a hello)", length);
        return UCS_OK;
    }
    fy_xfer_hello_t h;
    if (fy_xfer_hello_unpack(data, length, &h) != FY_OK) return UCS_OK; /* logged */
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) || !param->reply_ep) {
        fy_warn("xfer: hello from %s without a reply endpoint; ignored", h.name);
        return UCS_OK;
    }
    fy_xfer_reply_t r = {.cookie = h.cookie, .ok = true, .layout = x->layout, .mem = x->mem, .ucx_cuda = x->ucx_cuda};
    char why[FY_XFER_MSG_LEN];
    fy_xfer_mem_t hm = h.mem == FY_XFER_MEM_UNSTATED ? FY_XFER_MEM_HOST : h.mem;
    if (handshake_refuses(&x->layout, &h.layout, &h.layout, why, sizeof(why))) {
        r.ok = false;
        snprintf(r.message, sizeof(r.message), "%s", why);
        fy_error("xfer: refusing a connection from %s: %s", h.name, why);
        atomic_fetch_add(&x->stats.layout_refusals, 1);
    } else if (fy_xfer_mem_explain(x->mem, x->ucx_cuda, hm, h.ucx_cuda, why, sizeof(why))) {
        r.ok = false;
        snprintf(r.message, sizeof(r.message), "%s", why);
        fy_error("xfer: refusing a connection from %s: %s", h.name, why);
        atomic_fetch_add(&x->stats.mem_refusals, 1);
    } else {
        fy_debug("xfer: %s connects: %s there, %s here", h.name, fy_xfer_mem_name(hm), fy_xfer_mem_name(x->mem));
    }
    xfer_reply_buf_t *b = fy_calloc(1, sizeof(*b));
    if (!b) {
        fy_warn("xfer: out of memory answering the hello from %s", h.name);
        return UCS_OK;
    }
    fy_xfer_reply_pack(&r, b->bytes);
    b->x = x;
    b->next = x->replies;
    if (x->replies) x->replies->prev = b;
    x->replies = b;
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send = reply_done,
        .user_data = b,
    };
    /* sending from an AM handler is allowed (UCX's iodemo answers this way) */
    ucs_status_ptr_t sp = ucp_am_send_nbx(param->reply_ep, AM_ID_REPLY, NULL, 0, b->bytes, sizeof(b->bytes), &prm);
    if (UCS_PTR_IS_ERR(sp))
        fy_warn("xfer: cannot answer the hello from %s: %s", h.name, ucs_status_string(UCS_PTR_STATUS(sp)));
    if (!sp || UCS_PTR_IS_ERR(sp)) reply_buf_free(b);
    return UCS_OK;
}

/* Initiator side: record the reply for its peer; the loop acts on it. */
static ucs_status_t am_reply(void *arg, const void *header, size_t header_length, void *data, size_t length,
                             const ucp_am_recv_param_t *param)
{
    fy_xfer_t *x = arg;
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) return UCS_OK;
    fy_xfer_reply_t r;
    if (fy_xfer_reply_unpack(data, length, &r) != FY_OK) return UCS_OK; /* logged */
    for (xfer_peer_t *p = x->peers; p; p = p->next)
        if (p->cookie == r.cookie && p->state == PEER_CONNECTING) {
            p->reply = r;
            p->got_reply = true;
            return UCS_OK;
        }
    fy_debug("xfer: handshake reply for an unknown or closed connection %" PRIu64, r.cookie);
    return UCS_OK;
}

/* ---- the transfer thread ------------------------------------------------------------------- */

static void job_link(fy_xfer_t *x, fy_xfer_job_t *j)
{
    j->prev = NULL;
    j->next = x->jobs;
    if (x->jobs) x->jobs->prev = j;
    x->jobs = j;
}

static void cmd_begin(fy_xfer_t *x, fy_xfer_job_t *j)
{
    const fy_xfer_target_t *t = &j->target;
    job_link(x, j);
    xfer_peer_t *p = peer_find(x, t->addr, t->addr_len);
    if (p && (p->arena_base != t->arena_base || p->arena_bytes != t->arena_bytes || p->block_bytes != t->block_bytes ||
              p->rkey_len != t->rkey_len || memcmp(p->rkey_buf, t->rkey, t->rkey_len))) {
        /* one worker address, one arena: a second description of it is forged or corrupt */
        job_fail(j, FY_ERR_FORMAT, "target descriptor for %s disagrees with the one it was connected with", t->name);
    } else {
        if (!p) p = peer_connect(x, j);
        if (p) {
            j->peer = p;
            p->n_jobs++;
            if (p->state == PEER_REFUSED)
                job_fail(j, FY_ERR_MISMATCH, "%s", p->refusal);
            else if (p->state == PEER_FAILED)
                job_fail(j, FY_ERR_PEER, "connection to %s failed", p->name);
        }
    }
    /* the peer keeps its own copies; the name stays in j->target */
    fy_free(j->blob);
    j->blob = NULL;
    j->target.addr = j->target.rkey = NULL;
}

static void cmd_put(fy_xfer_job_t *j, const xfer_cmd_t *c)
{
    if (c->mark) {
        c->mark->next = j->marks;
        j->marks = c->mark;
    }
    job_take_caller_error(j); /* set before this command was queued, so visible now */
    if (j->st != FY_OK) {     /* an earlier error stands; later puts are ignored */
        runs_drop(c->runs, c->n_runs);
        return;
    }
    if (j->peer && j->peer->state == PEER_READY && j->n_pending == 0) {
        int32_t i = 0;
        for (; i < c->n_runs && j->st == FY_OK; i++) job_issue(j, &c->runs[i]);
        runs_drop(c->runs + i, c->n_runs - i);
        return;
    }
    if (j->n_pending + c->n_runs > j->cap_pending) {
        int32_t cap = FY_MAX(j->n_pending + c->n_runs, 2 * j->cap_pending);
        xfer_run_t *nr = fy_realloc(j->pending, (size_t)cap * sizeof(*nr));
        if (!nr) {
            job_fail(j, FY_ERR_NOMEM, "out of memory queueing puts to %s", j->target.name);
            runs_drop(c->runs, c->n_runs);
            return;
        }
        j->pending = nr;
        j->cap_pending = cap;
    }
    memcpy(j->pending + j->n_pending, c->runs, (size_t)c->n_runs * sizeof(*c->runs));
    j->n_pending += c->n_runs;
}

/* Takes the queue and runs its commands in order; returns the stop flag as
 * it was when the queue was taken (enqueue refuses once it is set, so
 * nothing can follow). */
static bool take_commands(fy_xfer_t *x)
{
    pthread_mutex_lock(&x->lock);
    xfer_cmd_t *c = x->q_head;
    x->q_head = x->q_tail = NULL;
    bool stop = x->stop;
    pthread_mutex_unlock(&x->lock);
    while (c) {
        xfer_cmd_t *next = c->next;
        fy_xfer_job_t *j = c->job;
        switch (c->type) {
        case CMD_BEGIN: cmd_begin(x, j); break;
        case CMD_PUT:
            cmd_put(j, c);
            fy_free(c);
            break;
        case CMD_FINISH: j->ended = true; break;
        case CMD_ABORT:
            j->ended = true;
            job_fail(j, FY_ERR_CANCELLED, "transfer to %s aborted by the caller", j->target.name);
            break;
        }
        c = next;
    }
    return stop;
}

static void progress(fy_xfer_t *x)
{
    while (ucp_worker_progress(x->worker)) {}
}

/* Acts on what the UCX callbacks recorded and on the clock. */
static void handle_events(fy_xfer_t *x, double now)
{
    xfer_peer_t *next;
    for (xfer_peer_t *p = x->peers; p; p = next) {
        next = p->next; /* peer_fail moves p to the dead list */
        if (p->got_reply) peer_handle_reply(p);
        if (p->ep_failed)
            peer_fail(p, FY_ERR_PEER, "connection to %s lost: %s", p->name, ucs_status_string(p->ep_status));
        else if (p->state == PEER_CONNECTING && now > p->hs_deadline)
            peer_fail(p, FY_ERR_TIMEOUT, "handshake with %s timed out after %.1f s", p->name, x->connect_timeout_s);
    }
    for (fy_xfer_job_t *j = x->jobs; j; j = j->next) {
        xfer_peer_t *p = j->peer;
        if (j->outstanding > 0 && now > j->deadline + FY_XFER_GRACE_S && p && p->state == PEER_READY) {
            peer_fail(p, FY_ERR_TIMEOUT, "transfer to %s still in flight %.1f s past its deadline; connection %s",
                      p->name, FY_XFER_GRACE_S, x->err_mode == FY_XFER_ERRMODE_PEER ? "closed by force" : "abandoned");
        }
        /* without peer error handling UCX cannot cancel (a forced close is
         * refused), so the job stops waiting for it; see xfer.h */
        if (j->outstanding > 0 && now > j->deadline + FY_XFER_GRACE_S && x->err_mode == FY_XFER_ERRMODE_NONE)
            j->orphan = true;
    }
}

static void complete_jobs(fy_xfer_t *x, double now)
{
    fy_xfer_job_t *next;
    for (fy_xfer_job_t *j = x->jobs; j; j = next) {
        next = j->next;
        bool done = job_advance(j, now);
        fire_marks(j, false);
        if (done) job_complete(x, j);
    }
}

static void reap_peers(fy_xfer_t *x)
{
    for (xfer_peer_t **pp = &x->dead; *pp;) {
        xfer_peer_t *p = *pp;
        if (p->n_jobs == 0 && !p->close_inflight && !p->hello_inflight && !p->flush_inflight && !p->abandoned) {
            *pp = p->next;
            peer_free(p);
        } else {
            pp = &p->next;
        }
    }
}

/* The next moment the clock alone changes something; -1: none. */
static double next_timer(fy_xfer_t *x)
{
    double t = -1;
    for (xfer_peer_t *p = x->peers; p; p = p->next)
        if (p->state == PEER_CONNECTING && (t < 0 || p->hs_deadline < t)) t = p->hs_deadline;
    for (fy_xfer_job_t *j = x->jobs; j; j = j->next) {
        /* the grace timer only where handle_events still has something to
         * do at it: else a past one would make the loop spin */
        bool grace = j->outstanding > 0 && !j->orphan &&
                     (x->err_mode == FY_XFER_ERRMODE_NONE || (j->peer && j->peer->state == PEER_READY));
        double d = j->st == FY_OK ? j->deadline : grace ? j->deadline + FY_XFER_GRACE_S : -1;
        if (d >= 0 && (t < 0 || d < t)) t = d;
    }
    return t;
}

/* Sleeps until the worker or the queue has something, or the next timer. */
static void wait_events(fy_xfer_t *x, double now)
{
    if (!x->arm_broken) {
        ucs_status_t us = ucp_worker_arm(x->worker);
        if (us == UCS_ERR_BUSY) return; /* events arrived since the last progress */
        if (us != UCS_OK) {
            fy_error("xfer: ucp_worker_arm: %s; polling every millisecond instead", ucs_status_string(us));
            x->arm_broken = true;
        }
    }
    double t = next_timer(x);
    int ms = -1;
    if (t >= 0) {
        double d = (t - now) * 1e3 + 1; /* +1: wake after the deadline, not just before it */
        ms = d <= 0 ? 0 : d > 60e3 ? 60000 : (int)d;
    }
    if (x->arm_broken && (ms < 0 || ms > 1)) ms = 1;
    struct epoll_event ev[2];
    int n = epoll_wait(x->epoll_fd, ev, 2, ms);
    for (int i = 0; i < n; i++)
        if (ev[i].data.fd == x->event_fd) {
            uint64_t v;
            if (read(x->event_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
                fy_warn("xfer: reading the wake-up eventfd: %s", strerror(errno));
        }
}

/* True while UCX owes a request that it can still be expected to return. */
static bool shutdown_busy(fy_xfer_t *x)
{
    for (fy_xfer_job_t *j = x->jobs; j; j = j->next)
        if (j->outstanding > 0 && !(j->peer && j->peer->abandoned)) return true;
    for (xfer_peer_t *p = x->dead; p; p = p->next)
        if (!p->abandoned && (p->close_inflight || p->hello_inflight || p->flush_inflight)) return true;
    return false;
}

static void peer_flush_done(void *request, ucs_status_t status, void *user_data)
{
    xfer_peer_t *p = user_data;
    p->flush_inflight = false;
    ucp_request_free(request);
}

static bool shutdown_flushing(fy_xfer_t *x)
{
    for (xfer_peer_t *p = x->peers; p; p = p->next)
        if (p->flush_inflight) return true;
    return false;
}

/* Flushes every connection that is up before shutdown_all closes it, for
 * at most SHUTDOWN_FLUSH_S: over TCP, UCX 1.13 emulates a put with
 * messages the target answers, and a target still answering puts when
 * this side closes the endpoint dies in UCX ("ucp_request.inl:346 Fatal:
 * unexpected error: Endpoint timeout", in ucp_put_handler).  A job that
 * failed or was aborted completes without a flush, and its puts may still
 * be on their way: test_xfer's aborted put_then, destroyed at once, killed
 * the test in 10 of 30 runs on a loaded machine (2026-11-29).  A peer
 * that does not answer within the bound is closed as before. */
static void shutdown_flush(fy_xfer_t *x)
{
    for (xfer_peer_t *p = x->peers; p; p = p->next) {
        if (p->state != PEER_READY || !p->ep) continue;
        ucp_request_param_t prm = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
            .cb.send = peer_flush_done,
            .user_data = p,
        };
        ucs_status_ptr_t sp = ucp_ep_flush_nbx(p->ep, &prm);
        if (UCS_PTR_IS_ERR(sp))
            fy_debug("xfer: flushing the endpoint to %s: %s", p->name, ucs_status_string(UCS_PTR_STATUS(sp)));
        else if (sp)
            p->flush_inflight = true;
    }
    double limit = fy_now_s() + SHUTDOWN_FLUSH_S;
    while (shutdown_flushing(x) && fy_now_s() < limit) {
        progress(x);
        if (shutdown_flushing(x)) usleep(1000);
    }
    for (xfer_peer_t *p = x->peers; p; p = p->next)
        if (p->flush_inflight)
            fy_warn("xfer: %s did not confirm its puts within %.0f s of shutting down; closing the connection anyway",
                    p->name, SHUTDOWN_FLUSH_S);
}

/* Fails every job, closes every endpoint and waits (boundedly) for UCX to
 * give back every request, so that no job's cb runs while one of its puts
 * is in flight.  What UCX cannot give back (endpoints abandoned without
 * peer error handling) waits for ucp_worker_destroy in fy_xfer_destroy. */
static void shutdown_all(fy_xfer_t *x)
{
    for (fy_xfer_job_t *j = x->jobs; j; j = j->next) {
        job_fail(j, FY_ERR_CANCELLED, "transfer engine shut down");
        j->ended = true;
    }
    for (xfer_peer_t *p = x->dead; p; p = p->next) peer_close(p, true);
    shutdown_flush(x);
    while (x->peers) {
        xfer_peer_t *p = x->peers;
        x->peers = p->next;
        p->next = x->dead;
        x->dead = p;
        peer_close(p, false);
    }
    double limit = fy_now_s() + SHUTDOWN_LIMIT_S;
    for (;;) {
        progress(x);
        if (!shutdown_busy(x)) break;
        if (fy_now_s() > limit) {
            fy_warn("xfer: UCX still holds requests %.0f s after closing every endpoint; shutting down anyway",
                    SHUTDOWN_LIMIT_S);
            break;
        }
        usleep(1000);
    }
    while (x->jobs) job_complete(x, x->jobs);
    reap_zombies(x);
    reap_peers(x);
}

static void *xfer_main(void *arg)
{
    fy_xfer_t *x = arg;
    for (;;) {
        bool stop = take_commands(x);
        atomic_store(&x->ping_seen, atomic_load(&x->ping_sent));
        progress(x);
        double now = fy_now_s();
        handle_events(x, now);
        progress(x); /* closes by force complete their requests here */
        complete_jobs(x, now);
        reap_zombies(x);
        reap_peers(x);
        if (stop) break;
        wait_events(x, now);
    }
    shutdown_all(x);
    return NULL;
}

/* ---- public: queueing ---------------------------------------------------------------------- */

static bool enqueue(fy_xfer_t *x, xfer_cmd_t *c)
{
    c->next = NULL;
    pthread_mutex_lock(&x->lock);
    bool stop = x->stop;
    if (!stop) {
        if (x->q_tail)
            x->q_tail->next = c;
        else
            x->q_head = c;
        x->q_tail = c;
    }
    pthread_mutex_unlock(&x->lock);
    if (stop) return false;
    uint64_t one = 1;
    if (write(x->event_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        fy_warn("xfer: waking the transfer thread: %s", strerror(errno)); /* EAGAIN: already pending */
    return true;
}

fy_status_t fy_xfer_job_begin(fy_xfer_t *x, const void *target_blob, size_t len, double deadline, fy_xfer_done_fn cb,
                              void *arg, fy_xfer_job_t **job_p)
{
    if (!x || !cb || !job_p) {
        fy_error("xfer: job_begin needs a transfer engine, a callback and a job pointer");
        return FY_ERR_INVALID;
    }
    fy_xfer_target_t t;
    fy_status_t st = fy_xfer_blob_parse(target_blob, len, &t);
    if (st != FY_OK) return st;
    fy_xfer_job_t *j = fy_calloc(1, sizeof(*j));
    uint8_t *blob = fy_malloc(len);
    if (!j || !blob) {
        fy_free(j);
        fy_free(blob);
        fy_error("xfer: out of memory starting a transfer to %s", t.name);
        return FY_ERR_NOMEM;
    }
    memcpy(blob, target_blob, len);
    j->x = x;
    j->blob = blob;
    j->target = t;
    j->target.addr = blob + (t.addr - (const uint8_t *)target_blob);
    j->target.rkey = blob + (t.rkey - (const uint8_t *)target_blob);
    j->remote_blocks = (int32_t)(t.arena_bytes / t.block_bytes);
    atomic_init(&j->deadline, deadline);
    j->cb = cb;
    j->arg = arg;
    atomic_init(&j->caller_st, FY_OK);
    j->st = FY_OK;
    j->begin_cmd = (xfer_cmd_t){.type = CMD_BEGIN, .job = j};
    if (!enqueue(x, &j->begin_cmd)) {
        fy_error("xfer: job_begin after fy_xfer_destroy started");
        fy_free(blob);
        fy_free(j);
        return FY_ERR_CANCELLED;
    }
    *job_p = j;
    return FY_OK;
}

/* Every block id within both arenas?  If not: logged, and the job will
 * fail with FY_ERR_INVALID (a transfer with a hole must not succeed). */
static bool blocks_in_range(fy_xfer_job_t *j, const int32_t *src, const int32_t *dst, int32_t n, const char *what)
{
    for (int32_t i = 0; i < n; i++) {
        if (src[i] < 0 || src[i] >= j->x->n_blocks || dst[i] < 0 || dst[i] >= j->remote_blocks) {
            fy_error("xfer: %s to %s: block %d -> %d out of range (%d blocks here, %d at the target)", what,
                     j->target.name, src[i], dst[i], j->x->n_blocks, j->remote_blocks);
            atomic_store(&j->caller_st, FY_ERR_INVALID);
            return false;
        }
    }
    return true;
}

/* fy_xfer_job_put (piece NULL) and fy_xfer_job_put_piece, with an
 * optional release (put_then). */
static fy_status_t queue_put(fy_xfer_job_t *j, const int32_t *src, const int32_t *dst, int32_t n,
                             const fy_xfer_piece_t *piece, fy_xfer_release_fn release, void *arg, const char *what)
{
    if (!j) {
        fy_error("xfer: %s on a NULL job", what);
        return FY_ERR_INVALID;
    }
    fy_xfer_t *x = j->x;
    if (n < 0 || (n > 0 && (!src || !dst))) {
        fy_error("xfer: %s to %s: %d blocks from %p to %p", what, j->target.name, n, (const void *)src,
                 (const void *)dst);
        atomic_store(&j->caller_st, FY_ERR_INVALID);
        return FY_ERR_INVALID;
    }
    if (piece &&
        (piece->len == 0 || piece->len > x->layout.block_bytes || piece->src_off > x->layout.block_bytes - piece->len ||
         piece->len > j->target.block_bytes || piece->dst_off > j->target.block_bytes - piece->len)) {
        fy_error("xfer: %s to %s: %d blocks, a piece of %llu bytes at %llu -> %llu (blocks of %llu bytes "
                 "here, %llu at the target)",
                 what, j->target.name, n, (unsigned long long)piece->len, (unsigned long long)piece->src_off,
                 (unsigned long long)piece->dst_off, (unsigned long long)x->layout.block_bytes,
                 (unsigned long long)j->target.block_bytes);
        atomic_store(&j->caller_st, FY_ERR_INVALID);
        return FY_ERR_INVALID;
    }
    if (!blocks_in_range(j, src, dst, n, what)) return FY_ERR_INVALID;
    int32_t runs = 0;
    for (int32_t i = 0; i < n; i++)
        if (piece || i == 0 || src[i] != src[i - 1] + 1 || dst[i] != dst[i - 1] + 1) runs++;
    if (n == 0 && !release) return FY_OK;
    xfer_cmd_t *c = fy_malloc(sizeof(*c) + (size_t)runs * sizeof(xfer_run_t));
    xfer_mark_t *m = release ? fy_calloc(1, sizeof(*m)) : NULL;
    if (!c || (release && !m)) {
        fy_error("xfer: out of memory queueing %d puts to %s", n, j->target.name);
        fy_free(c);
        fy_free(m);
        atomic_store(&j->caller_st, FY_ERR_NOMEM);
        return FY_ERR_NOMEM;
    }
    if (m) *m = (xfer_mark_t){.job = j, .fn = release, .arg = arg, .runs_left = runs};
    *c = (xfer_cmd_t){.type = CMD_PUT, .job = j, .n_runs = runs, .runs = (xfer_run_t *)(c + 1), .mark = m};
    int32_t r = -1;
    for (int32_t i = 0; i < n; i++) {
        if (piece)
            c->runs[++r] = (xfer_run_t){.src = src[i],
                                        .dst = dst[i],
                                        .count = 1,
                                        .src_off = piece->src_off,
                                        .dst_off = piece->dst_off,
                                        .len = piece->len,
                                        .mark = m};
        else if (i == 0 || src[i] != src[i - 1] + 1 || dst[i] != dst[i - 1] + 1)
            c->runs[++r] = (xfer_run_t){.src = src[i], .dst = dst[i], .count = 0, .len = 0, .mark = m};
        if (!piece) c->runs[r].count++;
    }
    if (!enqueue(x, c)) {
        fy_free(c);
        fy_free(m);
        return FY_ERR_CANCELLED;
    }
    return FY_OK;
}

fy_status_t fy_xfer_job_put(fy_xfer_job_t *j, const int32_t *src, const int32_t *dst, int32_t n)
{
    return queue_put(j, src, dst, n, NULL, NULL, NULL, "job_put");
}

fy_status_t fy_xfer_job_put_piece(fy_xfer_job_t *j, const int32_t *src, const int32_t *dst, int32_t n,
                                  const fy_xfer_piece_t *piece)
{
    if (!piece) {
        fy_error("xfer: job_put_piece without a piece");
        if (j) atomic_store(&j->caller_st, FY_ERR_INVALID);
        return FY_ERR_INVALID;
    }
    return queue_put(j, src, dst, n, piece, NULL, NULL, "job_put_piece");
}

fy_status_t fy_xfer_job_put_then(fy_xfer_job_t *j, const int32_t *src, const int32_t *dst, int32_t n,
                                 const fy_xfer_piece_t *piece, fy_xfer_release_fn release, void *arg)
{
    if (!release) {
        fy_error("xfer: job_put_then without a release function");
        if (j) atomic_store(&j->caller_st, FY_ERR_INVALID);
        return FY_ERR_INVALID;
    }
    return queue_put(j, src, dst, n, piece, release, arg, "job_put_then");
}

void fy_xfer_job_extend(fy_xfer_job_t *j, double deadline)
{
    if (!j) return;
    /* one writer at a time (the caller's contract), the transfer thread reads */
    if (deadline > atomic_load(&j->deadline)) atomic_store(&j->deadline, deadline);
    /* a sleeping transfer thread re-reads deadlines when it wakes, at the
     * old one at the latest: nothing to poke */
}

void fy_xfer_job_finish(fy_xfer_job_t *j)
{
    if (!j) return;
    j->end_cmd = (xfer_cmd_t){.type = CMD_FINISH, .job = j};
    enqueue(j->x, &j->end_cmd); /* refused only while destroy runs, which fails the job itself */
}

void fy_xfer_job_abort(fy_xfer_job_t *j)
{
    if (!j) return;
    j->end_cmd = (xfer_cmd_t){.type = CMD_ABORT, .job = j};
    enqueue(j->x, &j->end_cmd);
}

fy_status_t fy_xfer_health(fy_xfer_t *x, double now, double timeout_s, double *waited_p)
{
    *waited_p = 0;
    pthread_mutex_lock(&x->lock);
    bool stop = x->stop;
    pthread_mutex_unlock(&x->lock);
    if (stop || !x->thread_started) return FY_ERR_CANCELLED;
    uint64_t sent = atomic_load(&x->ping_sent);
    if (sent != 0 && atomic_load(&x->ping_seen) != sent) { /* the last ping is still waiting */
        *waited_p = now - x->ping_t;
        return *waited_p > timeout_s ? FY_ERR_TIMEOUT : FY_OK;
    }
    x->ping_t = now;
    atomic_store(&x->ping_sent, sent + 1);
    uint64_t one = 1;
    if (write(x->event_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        fy_warn("xfer: waking the transfer thread: %s", strerror(errno));
    return FY_OK;
}

void fy_xfer_stats(fy_xfer_t *x, fy_xfer_stats_t *out)
{
    if (!x) {
        *out = (fy_xfer_stats_t){0};
        return;
    }
    *out = (fy_xfer_stats_t){
        .jobs_ok = atomic_load(&x->stats.jobs_ok),
        .jobs_failed = atomic_load(&x->stats.jobs_failed),
        .puts = atomic_load(&x->stats.puts),
        .bytes = atomic_load(&x->stats.bytes),
        .layout_refusals = atomic_load(&x->stats.layout_refusals),
        .peers_connected = atomic_load(&x->stats.peers_connected),
        .peer_failures = atomic_load(&x->stats.peer_failures),
        .mem_refusals = atomic_load(&x->stats.mem_refusals),
    };
}

void *fy_xfer_arena(fy_xfer_t *x) { return x->arena; }

fy_status_t fy_xfer_target_desc(fy_xfer_t *x, const void **blob_p, size_t *len_p)
{
    if (!x || !blob_p || !len_p) {
        fy_error("xfer: target_desc needs an engine and two out-pointers");
        return FY_ERR_INVALID;
    }
    *blob_p = x->blob;
    *len_p = x->blob_len;
    return FY_OK;
}

/* ---- create / destroy ---------------------------------------------------------------------- */

static fy_status_t check_params(const fy_xfer_params_t *p)
{
    const fy_xfer_layout_t *l = &p->layout;
    if (!memchr(l->model_id, 0, sizeof(l->model_id))) {
        fy_error("xfer: layout model_id is not NUL-terminated");
        return FY_ERR_INVALID;
    }
    if (l->block_bytes == 0 || l->block_size <= 0 || l->n_layers <= 0 || l->n_kv_heads <= 0 || l->head_dim <= 0) {
        fy_error("xfer: layout has a zero or negative size (block_bytes %" PRIu64
                 ", block_size %d, layers %d, kv heads %d, head_dim %d)",
                 l->block_bytes, l->block_size, l->n_layers, l->n_kv_heads, l->head_dim);
        return FY_ERR_INVALID;
    }
    if (!fy_xfer_layout_shard_ok(l)) {
        fy_error("xfer: layout shard (tp %d x pp %d, rank %d.%d, layers %d+%d of %d, kv heads %d+%d of %d) does not "
                 "fit its model (one process: fy_xfer_layout_whole)",
                 l->tp, l->pp, l->stage, l->tp_rank, l->layer0, l->n_layers, l->model_layers, l->kv_head0,
                 l->n_kv_heads, l->model_kv_heads);
        return FY_ERR_INVALID;
    }
    if (p->err_mode != FY_XFER_ERRMODE_PEER && p->err_mode != FY_XFER_ERRMODE_NONE) {
        fy_error("xfer: unknown error handling mode %d", (int)p->err_mode);
        return FY_ERR_INVALID;
    }
    if ((unsigned)p->mem > FY_XFER_MEM_STAGED || (p->mem == FY_XFER_MEM_CUDA && !p->arena)) {
        fy_error("xfer: memory kind %d%s", (int)p->mem,
                 p->mem == FY_XFER_MEM_CUDA ? " needs the caller's arena (UCX allocates host memory only)" : "");
        return FY_ERR_INVALID;
    }
    if (p->arena_bytes == 0 || p->arena_bytes % l->block_bytes || p->arena_bytes / l->block_bytes > INT32_MAX) {
        fy_error("xfer: the arena (%zu bytes at %p) must be a non-zero multiple of %" PRIu64
                 "-byte blocks, at most 2^31-1 of them",
                 p->arena_bytes, p->arena, l->block_bytes);
        return FY_ERR_INVALID;
    }
    return FY_OK;
}

/* ---- network devices ----------------------------------------------------------------------- */

static bool append_dev(char *buf, size_t cap, size_t *len, const char *name)
{
    int k = snprintf(buf + *len, cap - *len, "%s%s", *len ? "," : "", name);
    if (k < 0 || (size_t)k >= cap - *len) return false;
    *len += (size_t)k;
    return true;
}

/* Every RDMA port of the host as "device:port"; none where the host has no
 * /sys/class/infiniband. */
static bool append_rdma_ports(char *buf, size_t cap, size_t *len)
{
    DIR *d = opendir("/sys/class/infiniband");
    if (!d) return true;
    bool ok = true;
    struct dirent *e;
    while (ok && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[512];
        snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports", e->d_name);
        DIR *pd = opendir(path);
        if (!pd) continue;
        struct dirent *pe;
        while (ok && (pe = readdir(pd))) {
            if (pe->d_name[0] == '.') continue;
            char dev[600];
            snprintf(dev, sizeof(dev), "%s:%s", e->d_name, pe->d_name);
            ok = append_dev(buf, cap, len, dev);
        }
        closedir(pd);
    }
    closedir(d);
    return ok;
}

static bool same_addr(const struct sockaddr *a, const struct sockaddr_storage *b)
{
    if (a->sa_family != b->ss_family) return false;
    if (a->sa_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr == ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &((const struct sockaddr_in6 *)b)->sin6_addr,
                   sizeof(struct in6_addr));
}

fy_status_t fy_xfer_devices_for(const char *url, char *buf, size_t cap)
{
    char host[256];
    const char *h = NULL;
    bool local = false;
    if (!url) url = "";
    if (!strncmp(url, "ipc://", 6) || !strncmp(url, "inproc://", 9)) {
        local = true;
    } else {
        const char *sep = strstr(url, "://");
        h = sep ? sep + 3 : url;
    }
    if (h) {
        size_t n;
        if (*h == '[') { /* [v6]:port */
            const char *e = strchr(h, ']');
            if (!e) goto bad;
            h++;
            n = (size_t)(e - h);
        } else {
            const char *e = strrchr(h, ':');
            n = e ? (size_t)(e - h) : strlen(h);
        }
        if (n >= sizeof(host)) goto bad;
        memcpy(host, h, n);
        host[n] = '\0';
        if (!*host || !strcmp(host, "*") || !strcmp(host, "0.0.0.0") || !strcmp(host, "::")) {
            if (cap < 1) return FY_ERR_NO_SPACE;
            buf[0] = '\0';
            return FY_OK;
        }
    }
    struct sockaddr_storage want = {0};
    if (!local) {
        struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
        int rv = getaddrinfo(host, NULL, &hints, &ai);
        if (rv || !ai) {
            fy_error("xfer: cannot resolve '%s' (from %s) to pick the network device: %s", host, url,
                     rv ? gai_strerror(rv) : "no address");
            return FY_ERR_INVALID;
        }
        memcpy(&want, ai->ai_addr, ai->ai_addrlen < sizeof(want) ? ai->ai_addrlen : sizeof(want));
        freeaddrinfo(ai);
        if (want.ss_family == AF_INET)
            local = (ntohl(((struct sockaddr_in *)&want)->sin_addr.s_addr) >> 24) == 127;
        else if (want.ss_family == AF_INET6)
            local = IN6_IS_ADDR_LOOPBACK(&((struct sockaddr_in6 *)&want)->sin6_addr);
    }
    struct ifaddrs *ifs;
    if (getifaddrs(&ifs)) {
        fy_error("xfer: getifaddrs: %m");
        return FY_ERR_IO;
    }
    char name[IF_NAMESIZE + 1] = "";
    for (struct ifaddrs *i = ifs; i && !*name; i = i->ifa_next) {
        if (!i->ifa_addr || (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6)) continue;
        if (local ? (i->ifa_flags & IFF_LOOPBACK) != 0 : same_addr(i->ifa_addr, &want))
            snprintf(name, sizeof(name), "%s", i->ifa_name);
    }
    freeifaddrs(ifs);
    if (!*name) {
        fy_error("xfer: no network interface has the address of %s (%s)", url,
                 local ? "no loopback interface" : "not this host's address");
        return FY_ERR_INVALID;
    }
    char out[1024];
    size_t len = 0;
    if (!append_dev(out, sizeof(out), &len, name) || (!local && !append_rdma_ports(out, sizeof(out), &len)) ||
        len + 1 > cap)
        return FY_ERR_NO_SPACE;
    memcpy(buf, out, len + 1);
    return FY_OK;
bad:
    fy_error("xfer: cannot tell the host of '%s' to pick the network device", url);
    return FY_ERR_INVALID;
}

static fy_status_t ucx_init(fy_xfer_t *x, const char *transports, const char *net_devices)
{
    ucp_config_t *cfg;
    ucs_status_t us = ucp_config_read(NULL, NULL, &cfg);
    if (us != UCS_OK) {
        fy_error("xfer: ucp_config_read: %s", ucs_status_string(us));
        return FY_ERR_IO;
    }
    if (transports && (us = ucp_config_modify(cfg, "TLS", transports)) != UCS_OK) {
        fy_error("xfer: transports '%s': %s", transports, ucs_status_string(us));
        ucp_config_release(cfg);
        return FY_ERR_INVALID;
    }
    /* UCX's TCP transport listens on every device it may use: without a
     * list, on every interface of the host, whatever address the
     * deployment was configured with */
    if (net_devices && *net_devices && (us = ucp_config_modify(cfg, "NET_DEVICES", net_devices)) != UCS_OK) {
        fy_error("xfer: network devices '%s': %s", net_devices, ucs_status_string(us));
        ucp_config_release(cfg);
        return FY_ERR_INVALID;
    }
    /* Over TCP, UCX 1.13 has no RMA lane: a put travels as active-message
     * fragments of TCP_TX_SEG_SIZE (8 KiB by default), one send and one
     * copy each.  64 KiB fragments triple the throughput (bench-xfer:
     * 0.9 -> 2.8 GB/s on loopback).  The environment still wins. */
    const char *tls = transports ? transports : getenv("UCX_TLS");
    bool tcp_possible = !tls || strstr(tls, "tcp") || strstr(tls, "all") || tls[0] == '^';
    /* the key goes to every transport's settings unprefixed (UCX warns
     * about it as invalid when no transport uses it: hence the check) */
    if (tcp_possible && !getenv("UCX_TCP_TX_SEG_SIZE") && (us = ucp_config_modify(cfg, "TX_SEG_SIZE", "64k")) != UCS_OK)
        fy_debug("xfer: cannot set TX_SEG_SIZE: %s", ucs_status_string(us));
    ucp_params_t params = {
        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME,
        .features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
        .name = "ferry-xfer",
    };
    us = ucp_init(&params, cfg, &x->ctx);
    ucp_config_release(cfg);
    if (us != UCS_OK) {
        x->ctx = NULL;
        fy_error("xfer: ucp_init (transports %s): %s", transports ? transports : "UCX's choice", ucs_status_string(us));
        return us == UCS_ERR_NO_DEVICE || us == UCS_ERR_NO_ELEM ? FY_ERR_UNSUPPORTED : FY_ERR_IO;
    }
    ucp_context_attr_t ca = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
    x->ucx_cuda = ucp_context_query(x->ctx, &ca) == UCS_OK && (ca.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA));
    if (x->mem == FY_XFER_MEM_CUDA && !x->ucx_cuda) {
        fy_error("xfer: the kv arena is CUDA device memory, and this UCX (transports %s) has no CUDA memory support "
                 "(no cuda_copy/cuda_ipc transports): it cannot move it directly; stage it through host memory "
                 "(worker.kv_transfer = staged)",
                 transports ? transports : "UCX's choice");
        return FY_ERR_UNSUPPORTED;
    }
    ucp_worker_params_t wp = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_SINGLE, /* one thread owns it: see the top of this file */
    };
    if ((us = ucp_worker_create(x->ctx, &wp, &x->worker)) != UCS_OK) {
        x->worker = NULL;
        fy_error("xfer: ucp_worker_create: %s", ucs_status_string(us));
        return FY_ERR_IO;
    }
    if ((us = ucp_worker_get_efd(x->worker, &x->worker_fd)) != UCS_OK) {
        fy_error("xfer: ucp_worker_get_efd: %s", ucs_status_string(us));
        return FY_ERR_IO;
    }
    /* no arena given: UCX allocates one, in shared memory when a
     * shared-memory transport is on, so that peers on this host put with
     * memcpy into the mapping rather than process_vm_writev (cma) */
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS,
        .address = x->arena,
        .length = x->arena_bytes,
        .flags = x->arena ? 0 : UCP_MEM_MAP_ALLOCATE,
    };
    if (x->mem == FY_XFER_MEM_CUDA) { /* UCX would otherwise detect it, or take it for host memory */
        mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
        mp.memory_type = UCS_MEMORY_TYPE_CUDA;
    }
    if ((us = ucp_mem_map(x->ctx, &mp, &x->memh)) != UCS_OK) {
        x->memh = NULL;
        fy_error("xfer: %s the %zu-byte kv arena: %s", x->arena ? "registering" : "allocating", x->arena_bytes,
                 ucs_status_string(us));
        return x->arena ? FY_ERR_IO : FY_ERR_NOMEM;
    }
    if (!x->arena) {
        ucp_mem_attr_t ma = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH};
        if ((us = ucp_mem_query(x->memh, &ma)) != UCS_OK || ma.length < x->arena_bytes) {
            fy_error("xfer: ucp_mem_query on the allocated arena: %s", ucs_status_string(us));
            return FY_ERR_IO;
        }
        x->arena = ma.address;
    }
    ucp_am_handler_param_t ap = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG |
                      UCP_AM_HANDLER_PARAM_FIELD_FLAGS,
        .flags = UCP_AM_FLAG_WHOLE_MSG,
        .arg = x,
    };
    ap.id = AM_ID_HELLO;
    ap.cb = am_hello;
    if ((us = ucp_worker_set_am_recv_handler(x->worker, &ap)) == UCS_OK) {
        ap.id = AM_ID_REPLY;
        ap.cb = am_reply;
        us = ucp_worker_set_am_recv_handler(x->worker, &ap);
    }
    if (us != UCS_OK) {
        fy_error("xfer: ucp_worker_set_am_recv_handler: %s", ucs_status_string(us));
        return FY_ERR_IO;
    }
    return FY_OK;
}

bool fy_xfer_ucx_cuda(const char *transports)
{
    ucp_config_t *cfg;
    if (ucp_config_read(NULL, NULL, &cfg) != UCS_OK) return false;
    if (transports && ucp_config_modify(cfg, "TLS", transports) != UCS_OK) {
        ucp_config_release(cfg);
        return false;
    }
    ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME,
                           .features = UCP_FEATURE_RMA | UCP_FEATURE_AM,
                           .name = "ferry-xfer-probe"};
    ucp_context_h ctx;
    ucs_status_t us = ucp_init(&params, cfg, &ctx);
    ucp_config_release(cfg);
    if (us != UCS_OK) return false;
    ucp_context_attr_t ca = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
    bool cuda = ucp_context_query(ctx, &ca) == UCS_OK && (ca.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA));
    ucp_cleanup(ctx);
    return cuda;
}

/* Packs what a peer needs to put here: worker address, rkey, arena. */
static fy_status_t build_blob(fy_xfer_t *x)
{
    ucp_address_t *addr = NULL;
    size_t addr_len = 0, rkey_len = 0;
    void *rkey = NULL;
    ucs_status_t us = ucp_worker_get_address(x->worker, &addr, &addr_len);
    if (us != UCS_OK) {
        fy_error("xfer: ucp_worker_get_address: %s", ucs_status_string(us));
        return FY_ERR_IO;
    }
    if ((us = ucp_rkey_pack(x->ctx, x->memh, &rkey, &rkey_len)) != UCS_OK) {
        fy_error("xfer: ucp_rkey_pack: %s", ucs_status_string(us));
        ucp_worker_release_address(x->worker, addr);
        return FY_ERR_IO;
    }
    /* the name tells two engines in one process apart by their address */
    char host[32] = "?";
    gethostname(host, sizeof(host) - 1);
    host[sizeof(host) - 1] = '\0';
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < addr_len; i++) h = (h ^ ((const uint8_t *)addr)[i]) * 16777619u;
    snprintf(x->name, sizeof(x->name), "%s:%d/%04x", host, (int)getpid(), (unsigned)(h & 0xffff));
    fy_status_t st = FY_OK;
    if (addr_len > FY_XFER_MAX_ADDR_LEN || rkey_len > FY_XFER_MAX_RKEY_LEN) {
        fy_error("xfer: worker address (%zu bytes) or rkey (%zu bytes) too large to describe", addr_len, rkey_len);
        st = FY_ERR_UNSUPPORTED;
    } else {
        fy_xfer_target_t t = {
            .addr = (const uint8_t *)addr,
            .addr_len = (uint32_t)addr_len,
            .rkey = rkey,
            .rkey_len = (uint32_t)rkey_len,
            .arena_base = (uint64_t)(uintptr_t)x->arena,
            .arena_bytes = x->arena_bytes,
            .block_bytes = x->layout.block_bytes,
        };
        memcpy(t.name, x->name, sizeof(t.name));
        st = fy_xfer_blob_build(&t, &x->blob, &x->blob_len);
    }
    ucp_rkey_buffer_release(rkey);
    ucp_worker_release_address(x->worker, addr);
    return st;
}

fy_status_t fy_xfer_create(const fy_xfer_params_t *p, fy_xfer_t **x_p)
{
    if (!p || !x_p) return FY_ERR_INVALID;
    fy_status_t st = check_params(p);
    if (st != FY_OK) return st;
    fy_xfer_t *x = fy_calloc(1, sizeof(*x));
    if (!x) {
        fy_error("xfer: out of memory");
        return FY_ERR_NOMEM;
    }
    x->layout = p->layout;
    x->arena = p->arena;
    x->arena_bytes = p->arena_bytes;
    x->n_blocks = (int32_t)(p->arena_bytes / p->layout.block_bytes);
    x->connect_timeout_s = p->connect_timeout_s > 0 ? p->connect_timeout_s : DEFAULT_CONNECT_TIMEOUT_S;
    x->err_mode = p->err_mode;
    x->mem = p->mem == FY_XFER_MEM_UNSTATED ? FY_XFER_MEM_HOST : p->mem;
    x->worker_fd = x->event_fd = x->epoll_fd = -1;
    pthread_mutex_init(&x->lock, NULL);
    if ((st = ucx_init(x, p->transports, p->net_devices)) != FY_OK || (st = build_blob(x)) != FY_OK) goto fail;
    x->event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    x->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    if (x->event_fd < 0 || x->epoll_fd < 0) {
        fy_error("xfer: eventfd/epoll_create1: %s", strerror(errno));
        st = FY_ERR_IO;
        goto fail;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = x->worker_fd};
    struct epoll_event ev2 = {.events = EPOLLIN, .data.fd = x->event_fd};
    if (epoll_ctl(x->epoll_fd, EPOLL_CTL_ADD, x->worker_fd, &ev) ||
        epoll_ctl(x->epoll_fd, EPOLL_CTL_ADD, x->event_fd, &ev2)) {
        fy_error("xfer: epoll_ctl: %s", strerror(errno));
        st = FY_ERR_IO;
        goto fail;
    }
    int rc = pthread_create(&x->thread, NULL, xfer_main, x);
    if (rc) {
        fy_error("xfer: starting the transfer thread: %s", strerror(rc));
        st = FY_ERR_IO;
        goto fail;
    }
    x->thread_started = true;
    fy_debug("xfer: %s ready: %d blocks of %" PRIu64 " bytes (%s), transports %s, devices %s, peer failure %s, UCX "
             "CUDA memory %s",
             x->name, x->n_blocks, x->layout.block_bytes, fy_xfer_mem_name(x->mem),
             p->transports ? p->transports : "UCX's choice",
             p->net_devices && *p->net_devices ? p->net_devices : "UCX's choice",
             x->err_mode == FY_XFER_ERRMODE_PEER ? "detected" : "not detected", x->ucx_cuda ? "yes" : "no");
    *x_p = x;
    return FY_OK;
fail:
    fy_xfer_destroy(x);
    return st;
}

void fy_xfer_destroy(fy_xfer_t *x)
{
    if (!x) return;
    if (x->thread_started) {
        pthread_mutex_lock(&x->lock);
        x->stop = true;
        pthread_mutex_unlock(&x->lock);
        uint64_t one = 1;
        if (write(x->event_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
            fy_warn("xfer: waking the transfer thread: %s", strerror(errno));
        pthread_join(x->thread, NULL);
    }
    /* rkeys come from the worker's pool: they go before it does */
    for (xfer_peer_t *p = x->dead; p; p = p->next)
        if (p->rkey) {
            ucp_rkey_destroy(p->rkey);
            p->rkey = NULL;
        }
    if (x->memh) ucp_mem_unmap(x->ctx, x->memh);
    if (x->worker) ucp_worker_destroy(x->worker);
    /* what shutdown_all left for the worker's destruction: orphaned jobs
     * (their callbacks ran; UCX's are done now) and abandoned peers */
    while (x->zombies) {
        fy_xfer_job_t *j = x->zombies;
        x->zombies = j->next;
        job_free(j);
    }
    while (x->dead) {
        xfer_peer_t *p = x->dead;
        x->dead = p->next;
        peer_free(p);
    }
    /* replies whose sends UCX dropped with the worker */
    while (x->replies) reply_buf_free(x->replies);
    if (x->ctx) ucp_cleanup(x->ctx);
    if (x->epoll_fd >= 0) close(x->epoll_fd);
    if (x->event_fd >= 0) close(x->event_fd);
    pthread_mutex_destroy(&x->lock);
    fy_free(x->blob);
    fy_free(x);
}

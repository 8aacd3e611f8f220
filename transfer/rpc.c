/*
 * rpc.c - nng request/reply servers and clients, and push/pull event
 * streams (see rpc.h).
 *
 * The server keeps n_slots nng contexts, each cycling receive -> handler
 * -> (any time later) reply -> receive, so a slow or deferred answer holds
 * one slot and nothing else.  Client calls get a context and an aio each;
 * the aio's callback drives send -> receive -> the caller's callback, and
 * the call is reaped from inside that callback (nng_aio_reap).  nng error
 * numbers become fy_status_t here, with nng's message in the log line.
 */
#include "rpc.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>

#include <nng/nng.h>
#include <nng/protocol/pipeline0/pull.h>
#include <nng/protocol/pipeline0/push.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>

#include "log.h"
#include "mem.h"

static fy_status_t from_nng(int rv)
{
    switch (rv) {
    case 0: return FY_OK;
    case NNG_ENOMEM: return FY_ERR_NOMEM;
    case NNG_ETIMEDOUT: return FY_ERR_TIMEOUT;
    case NNG_ECLOSED:
    case NNG_ECANCELED: return FY_ERR_CANCELLED;
    case NNG_EMSGSIZE:
    case NNG_EADDRINVAL:
    case NNG_EINVAL: return FY_ERR_INVALID;
    case NNG_ECONNREFUSED:
    case NNG_ECONNRESET:
    case NNG_ECONNSHUT:
    case NNG_ECONNABORTED:
    case NNG_EPEERAUTH:
    case NNG_EPROTO: return FY_ERR_PEER;
    default: return FY_ERR_IO;
    }
}

/*
 * nng 1.5.2 (Debian 12) can hang in nng_close when a reply arrived for a
 * request whose context had already given up (nng issues #1543, #1813,
 * fixed in later releases).  A socket is closed on a helper thread; if
 * that does not finish within two seconds the socket is left behind with
 * a warning rather than hanging the process that is shutting it down.
 */
typedef struct closer {
    nng_socket sock;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int refs;
} closer_t;

static void closer_unref(closer_t *k)
{
    bool last = --k->refs == 0;
    pthread_mutex_unlock(&k->mu);
    if (last) {
        pthread_cond_destroy(&k->cv);
        pthread_mutex_destroy(&k->mu);
        fy_free(k);
    }
}

static void *closer_main(void *p)
{
    closer_t *k = p;
    nng_close(k->sock);
    pthread_mutex_lock(&k->mu);
    k->done = true;
    pthread_cond_signal(&k->cv);
    closer_unref(k);
    return NULL;
}

static void close_socket(nng_socket sock, const char *what)
{
    closer_t *k = fy_calloc(1, sizeof(*k));
    pthread_t t;
    pthread_attr_t attr;
    if (!k) {
        nng_close(sock);
        return;
    }
    k->sock = sock;
    k->refs = 2;
    pthread_mutex_init(&k->mu, NULL);
    pthread_cond_init(&k->cv, NULL);
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &attr, closer_main, k)) {
        pthread_attr_destroy(&attr);
        nng_close(sock);
        pthread_cond_destroy(&k->cv);
        pthread_mutex_destroy(&k->mu);
        fy_free(k);
        return;
    }
    pthread_attr_destroy(&attr);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 2;
    pthread_mutex_lock(&k->mu);
    while (!k->done)
        if (pthread_cond_timedwait(&k->cv, &k->mu, &ts)) break;
    if (!k->done) fy_warn("rpc: closing the socket of %s is stuck (an nng 1.5 bug); left behind", what);
    closer_unref(k);
}

/* ---- status tags on the wire ---------------------------------------------------------------- */

static const char *const TAGS[FY_STATUS_COUNT] = {
    [FY_OK] = "ok",
    [FY_ERR_NOMEM] = "nomem",
    [FY_ERR_IO] = "io",
    [FY_ERR_FORMAT] = "format",
    [FY_ERR_INVALID] = "invalid",
    [FY_ERR_UNSUPPORTED] = "unsupported",
    [FY_ERR_NOT_FOUND] = "not_found",
    [FY_ERR_NO_SPACE] = "no_space",
    [FY_ERR_OVERLOADED] = "overloaded",
    [FY_ERR_CANCELLED] = "cancelled",
    [FY_ERR_TIMEOUT] = "timeout",
    [FY_ERR_BACKEND] = "backend",
    [FY_ERR_PEER] = "peer",
    [FY_ERR_MISMATCH] = "mismatch",
    [FY_ERR_INTERNAL] = "internal",
};

const char *fy_status_tag(fy_status_t st) { return st >= 0 && st < FY_STATUS_COUNT && TAGS[st] ? TAGS[st] : "internal"; }

fy_status_t fy_msg_error_code(const char *code)
{
    for (int i = 1; i < FY_STATUS_COUNT; i++)
        if (TAGS[i] && !strcmp(TAGS[i], code)) return (fy_status_t)i;
    return FY_ERR_INTERNAL;
}

void fy_msg_error(fy_msgw_t *w, uint64_t id, fy_status_t st, const char *message)
{
    fy_msgw_init(w, "error");
    fy_msgw_u64(w, "id", id);
    fy_msgw_str(w, "code", fy_status_tag(st));
    fy_msgw_str(w, "message", message ? message : fy_status_str(st));
}

/* ---- server ------------------------------------------------------------------------------------ */

enum { SLOT_RECV, SLOT_BUSY, SLOT_SEND };

struct fy_rpc_call {
    fy_rpc_server_t *s;
    nng_ctx ctx;
    nng_aio *aio;
    nng_msg *req;
    int state;
};

struct fy_rpc_server {
    nng_socket sock;
    fy_rpc_handler_fn fn;
    void *arg;
    fy_rpc_call_t *slots;
    int n_slots;
    atomic_bool closing;
    char url[256];
};

static void slot_recv(fy_rpc_call_t *c)
{
    if (atomic_load(&c->s->closing)) return;
    c->state = SLOT_RECV;
    nng_ctx_recv(c->ctx, c->aio);
}

static void slot_cb(void *arg)
{
    fy_rpc_call_t *c = arg;
    int rv = nng_aio_result(c->aio);
    if (c->state == SLOT_SEND) {
        if (rv) nng_msg_free(nng_aio_get_msg(c->aio));
        slot_recv(c);
        return;
    }
    if (rv) {
        if (rv != NNG_ECLOSED && !atomic_load(&c->s->closing)) {
            fy_warn("rpc: receive on %s failed: %s", c->s->url, nng_strerror(rv));
            slot_recv(c);
        }
        return;
    }
    c->req = nng_aio_get_msg(c->aio);
    c->state = SLOT_BUSY;
    c->s->fn(c->s->arg, c, nng_msg_body(c->req), nng_msg_len(c->req));
}

void fy_rpc_reply(fy_rpc_call_t *c, const void *buf, size_t len)
{
    /* the reply is built before the request goes: buf may point into it */
    nng_msg *m;
    int rv = nng_msg_alloc(&m, 0);
    if (!rv && (rv = nng_msg_append(m, buf, len))) nng_msg_free(m);
    nng_msg_free(c->req);
    c->req = NULL;
    if (rv) { /* the client's timeout reports it; the slot serves on */
        fy_error("rpc: cannot build a reply of %zu bytes: %s", len, nng_strerror(rv));
        slot_recv(c);
        return;
    }
    c->state = SLOT_SEND;
    nng_aio_set_msg(c->aio, m);
    nng_ctx_send(c->ctx, c->aio);
}

void fy_rpc_reply_error(fy_rpc_call_t *c, uint64_t id, fy_status_t st, const char *message)
{
    fy_msgw_t w;
    fy_msg_error(&w, id, st, message);
    fy_rpc_reply_msgw(c, &w);
}

void fy_rpc_reply_msgw(fy_rpc_call_t *c, fy_msgw_t *w)
{
    void *buf;
    size_t len;
    if (fy_msgw_finish(w, &buf, &len) != FY_OK) {
        /* a small fixed error always fits */
        static const char nomem[] = "\x83\xa1v\x01\xa4type\xa5" "error\xa4" "code\xa5nomem";
        fy_rpc_reply(c, nomem, sizeof(nomem) - 1);
        return;
    }
    fy_rpc_reply(c, buf, len);
    fy_free(buf);
}

static fy_status_t listen_on(nng_socket sock, const char *url, const char *what)
{
    int rv = nng_listen(sock, url, NULL, 0);
    if (rv) {
        fy_error("rpc: cannot listen on %s (%s): %s", url, what, nng_strerror(rv));
        return from_nng(rv) == FY_ERR_INVALID ? FY_ERR_INVALID : FY_ERR_IO;
    }
    return FY_OK;
}

fy_status_t fy_rpc_server_create(const char *url, int n_slots, fy_rpc_handler_fn fn, void *arg,
                                 fy_rpc_server_t **s_p)
{
    if (n_slots < 1 || n_slots > 4096 || !fn) return FY_ERR_INVALID;
    fy_rpc_server_t *s = fy_calloc(1, sizeof(*s));
    if (!s) return FY_ERR_NOMEM;
    snprintf(s->url, sizeof(s->url), "%s", url);
    s->fn = fn;
    s->arg = arg;
    int rv = nng_rep0_open(&s->sock);
    if (rv) {
        fy_error("rpc: cannot open a reply socket: %s", nng_strerror(rv));
        fy_free(s);
        return from_nng(rv);
    }
    nng_socket_set_size(s->sock, NNG_OPT_RECVMAXSZ, FY_RPC_MAX_MSG);
    s->slots = fy_calloc((size_t)n_slots, sizeof(*s->slots));
    if (!s->slots) goto nomem;
    for (int i = 0; i < n_slots; i++) {
        fy_rpc_call_t *c = &s->slots[i];
        c->s = s;
        if ((rv = nng_aio_alloc(&c->aio, slot_cb, c)) || (rv = nng_ctx_open(&c->ctx, s->sock))) {
            fy_error("rpc: cannot set up a server slot: %s", nng_strerror(rv));
            s->n_slots = i + (c->aio != NULL);
            fy_rpc_server_destroy(s);
            return from_nng(rv);
        }
        s->n_slots = i + 1;
    }
    fy_status_t st = listen_on(s->sock, url, "rpc server");
    if (st) {
        fy_rpc_server_destroy(s);
        return st;
    }
    for (int i = 0; i < n_slots; i++) slot_recv(&s->slots[i]);
    *s_p = s;
    return FY_OK;
nomem:
    nng_close(s->sock);
    fy_free(s);
    return FY_ERR_NOMEM;
}

void fy_rpc_server_destroy(fy_rpc_server_t *s)
{
    if (!s) return;
    atomic_store(&s->closing, true);
    /* stopped slots run no callback afterwards and start nothing new */
    for (int i = 0; i < s->n_slots; i++)
        if (s->slots[i].aio) nng_aio_stop(s->slots[i].aio);
    close_socket(s->sock, s->url);
    for (int i = 0; i < s->n_slots; i++) {
        fy_rpc_call_t *c = &s->slots[i];
        if (c->aio) nng_aio_free(c->aio);
        if (c->req) nng_msg_free(c->req);
    }
    fy_free(s->slots);
    fy_free(s);
}

/* ---- client ------------------------------------------------------------------------------------ */

/*
 * A fixed pool of contexts, opened with the client and closed only by
 * fy_rpc_client_destroy, so calls neither open nor close contexts inside
 * aio callbacks, and the calls in flight to one peer are bounded.  Calls
 * beyond the pool wait in a queue for a free slot.
 */
#define CLIENT_SLOTS 32

typedef struct pending {
    nng_msg *msg;
    double deadline;
    fy_rpc_reply_fn cb;
    void *arg;
    struct pending *next;
} pending_t;

typedef struct cslot {
    fy_rpc_client_t *c;
    nng_ctx ctx;
    nng_aio *aio;
    bool busy, receiving;
    double deadline;
    fy_rpc_reply_fn cb;
    void *arg;
} cslot_t;

struct fy_rpc_client {
    nng_socket sock;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* a slot went idle */
    cslot_t slots[CLIENT_SLOTS];
    int n_slots;
    pending_t *head, *tail;
    bool closing;
    char url[256];
};

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static nng_duration ms_left(double deadline)
{
    double left = deadline - mono_s();
    return left <= 0 ? 1 : (nng_duration)(left * 1000.0 + 1.0);
}

static void slot_start(cslot_t *k, nng_msg *m, double deadline, fy_rpc_reply_fn cb, void *arg)
{
    k->deadline = deadline;
    k->cb = cb;
    k->arg = arg;
    k->receiving = false;
    nng_aio_set_msg(k->aio, m);
    nng_aio_set_timeout(k->aio, ms_left(deadline));
    nng_ctx_send(k->ctx, k->aio);
}

/* The call on slot k ended: tell its owner, then give the slot to the
 * next queued call (those already past their deadline end at once). */
static void cslot_end(cslot_t *k, fy_status_t st, const void *reply, size_t len)
{
    fy_rpc_client_t *c = k->c;
    k->cb(k->arg, st, reply, len);
    for (;;) {
        pthread_mutex_lock(&c->mu);
        pending_t *p = c->head;
        if (p) {
            c->head = p->next;
            if (!c->head) c->tail = NULL;
        }
        bool closing = c->closing;
        if (!p) {
            k->busy = false;
            pthread_cond_broadcast(&c->cv);
        }
        pthread_mutex_unlock(&c->mu);
        if (!p) return;
        fy_status_t why = closing ? FY_ERR_CANCELLED : p->deadline <= mono_s() ? FY_ERR_TIMEOUT : FY_OK;
        if (why == FY_OK) {
            slot_start(k, p->msg, p->deadline, p->cb, p->arg);
            fy_free(p);
            return;
        }
        nng_msg_free(p->msg);
        p->cb(p->arg, why, NULL, 0);
        fy_free(p);
    }
}

static void cslot_cb(void *arg)
{
    cslot_t *k = arg;
    int rv = nng_aio_result(k->aio);
    fy_status_t st = rv && k->c->closing ? FY_ERR_CANCELLED : from_nng(rv);
    if (!k->receiving) {
        if (rv || k->c->closing) {
            if (rv) nng_msg_free(nng_aio_get_msg(k->aio));
            cslot_end(k, rv ? st : FY_ERR_CANCELLED, NULL, 0);
            return;
        }
        k->receiving = true;
        nng_aio_set_timeout(k->aio, ms_left(k->deadline));
        nng_ctx_recv(k->ctx, k->aio);
        return;
    }
    if (rv) {
        cslot_end(k, st, NULL, 0);
        return;
    }
    nng_msg *m = nng_aio_get_msg(k->aio);
    cslot_end(k, FY_OK, nng_msg_body(m), nng_msg_len(m));
    nng_msg_free(m);
}

fy_status_t fy_rpc_client_create(const char *url, fy_rpc_client_t **c_p)
{
    fy_rpc_client_t *c = fy_calloc(1, sizeof(*c));
    if (!c) return FY_ERR_NOMEM;
    snprintf(c->url, sizeof(c->url), "%s", url);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    int rv = nng_req0_open(&c->sock);
    if (rv) {
        fy_error("rpc: cannot open a request socket: %s", nng_strerror(rv));
        pthread_cond_destroy(&c->cv);
        pthread_mutex_destroy(&c->mu);
        fy_free(c);
        return from_nng(rv);
    }
    /* no silent resends: a request is answered once or times out, so a
     * reservation is never made twice behind the caller's back */
    nng_socket_set_ms(c->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
    nng_socket_set_size(c->sock, NNG_OPT_RECVMAXSZ, FY_RPC_MAX_MSG);
    nng_socket_set_ms(c->sock, NNG_OPT_RECONNMINT, 50);
    nng_socket_set_ms(c->sock, NNG_OPT_RECONNMAXT, 1000);
    for (int i = 0; i < CLIENT_SLOTS; i++) {
        cslot_t *k = &c->slots[i];
        k->c = c;
        if ((rv = nng_aio_alloc(&k->aio, cslot_cb, k))) break;
        if ((rv = nng_ctx_open(&k->ctx, c->sock))) {
            nng_aio_free(k->aio);
            break;
        }
        c->n_slots++;
    }
    if (!rv) rv = nng_dial(c->sock, url, NULL, NNG_FLAG_NONBLOCK);
    if (rv) {
        fy_error("rpc: cannot set up a client of %s: %s", url, nng_strerror(rv));
        fy_rpc_client_destroy(c);
        return from_nng(rv) == FY_ERR_INVALID ? FY_ERR_INVALID : FY_ERR_IO;
    }
    *c_p = c;
    return FY_OK;
}

void fy_rpc_client_destroy(fy_rpc_client_t *c)
{
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    c->closing = true;
    pthread_mutex_unlock(&c->mu);
    /* stopping an aio ends its operation and waits for its callback,
     * which ends queued calls too now that closing is set */
    for (int i = 0; i < c->n_slots; i++) nng_aio_stop(c->slots[i].aio);
    /* an operation started by a callback racing the stop is refused by
     * nng and its callback still runs: wait for every slot to go idle */
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n_slots; i++)
        while (c->slots[i].busy) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < c->n_slots; i++) {
        nng_ctx_close(c->slots[i].ctx);
        nng_aio_free(c->slots[i].aio);
    }
    close_socket(c->sock, c->url);
    while (c->head) { /* queued with every slot idle: cannot happen, but end them anyway */
        pending_t *p = c->head;
        c->head = p->next;
        nng_msg_free(p->msg);
        p->cb(p->arg, FY_ERR_CANCELLED, NULL, 0);
        fy_free(p);
    }
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    fy_free(c);
}

fy_status_t fy_rpc_call_async(fy_rpc_client_t *c, const void *buf, size_t len, double timeout_s, fy_rpc_reply_fn cb,
                              void *arg)
{
    nng_msg *m = NULL;
    int rv = nng_msg_alloc(&m, 0);
    if (!rv && (rv = nng_msg_append(m, buf, len))) nng_msg_free(m);
    if (rv) {
        fy_error("rpc: cannot build a call to %s: %s", c->url, nng_strerror(rv));
        return from_nng(rv);
    }
    double deadline = mono_s() + timeout_s;
    pthread_mutex_lock(&c->mu);
    if (c->closing) {
        pthread_mutex_unlock(&c->mu);
        nng_msg_free(m);
        return FY_ERR_CANCELLED;
    }
    cslot_t *k = NULL;
    for (int i = 0; i < c->n_slots && !k; i++)
        if (!c->slots[i].busy) k = &c->slots[i];
    if (k) {
        k->busy = true;
        pthread_mutex_unlock(&c->mu);
        slot_start(k, m, deadline, cb, arg);
        return FY_OK;
    }
    pending_t *p = fy_calloc(1, sizeof(*p));
    if (!p) {
        pthread_mutex_unlock(&c->mu);
        nng_msg_free(m);
        return FY_ERR_NOMEM;
    }
    *p = (pending_t){m, deadline, cb, arg, NULL};
    if (c->tail)
        c->tail->next = p;
    else
        c->head = p;
    c->tail = p;
    pthread_mutex_unlock(&c->mu);
    return FY_OK;
}

typedef struct sync_call {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    fy_status_t st;
    void *reply;
    size_t len;
} sync_call_t;

static void sync_cb(void *arg, fy_status_t st, const void *reply, size_t len)
{
    sync_call_t *s = arg;
    void *copy = NULL;
    if (st == FY_OK) {
        copy = fy_malloc(len ? len : 1);
        if (copy)
            memcpy(copy, reply, len);
        else
            st = FY_ERR_NOMEM;
    }
    pthread_mutex_lock(&s->mu);
    s->st = st;
    s->reply = copy;
    s->len = len;
    s->done = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

fy_status_t fy_rpc_call(fy_rpc_client_t *c, const void *buf, size_t len, double timeout_s, void **reply_p,
                        size_t *len_p)
{
    sync_call_t s = {.done = false};
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    fy_status_t st = fy_rpc_call_async(c, buf, len, timeout_s, sync_cb, &s);
    if (st == FY_OK) {
        pthread_mutex_lock(&s.mu);
        while (!s.done) pthread_cond_wait(&s.cv, &s.mu);
        pthread_mutex_unlock(&s.mu);
        st = s.st;
    }
    pthread_cond_destroy(&s.cv);
    pthread_mutex_destroy(&s.mu);
    if (st == FY_OK) {
        *reply_p = s.reply;
        *len_p = s.len;
    }
    return st;
}

/* ---- push ------------------------------------------------------------------------------------ */

struct fy_push {
    nng_socket sock;
    atomic_uint_fast64_t dropped;
    char url[256];
};

fy_status_t fy_push_create(const char *url, int queue, fy_push_t **p_p)
{
    fy_push_t *p = fy_calloc(1, sizeof(*p));
    if (!p) return FY_ERR_NOMEM;
    snprintf(p->url, sizeof(p->url), "%s", url);
    int rv = nng_push0_open(&p->sock);
    if (rv) {
        fy_free(p);
        fy_error("rpc: cannot open a push socket: %s", nng_strerror(rv));
        return from_nng(rv);
    }
    nng_socket_set_int(p->sock, NNG_OPT_SENDBUF, queue < 1 ? 1 : queue > 8192 ? 8192 : queue);
    nng_socket_set_ms(p->sock, NNG_OPT_RECONNMINT, 50);
    nng_socket_set_ms(p->sock, NNG_OPT_RECONNMAXT, 1000);
    if ((rv = nng_dial(p->sock, url, NULL, NNG_FLAG_NONBLOCK))) {
        fy_error("rpc: cannot dial %s: %s", url, nng_strerror(rv));
        nng_close(p->sock);
        fy_free(p);
        return from_nng(rv) == FY_ERR_INVALID ? FY_ERR_INVALID : FY_ERR_IO;
    }
    *p_p = p;
    return FY_OK;
}

void fy_push_destroy(fy_push_t *p)
{
    if (!p) return;
    close_socket(p->sock, p->url);
    fy_free(p);
}

fy_status_t fy_push_send(fy_push_t *p, const void *buf, size_t len)
{
    nng_msg *m;
    int rv = nng_msg_alloc(&m, 0);
    if (!rv && (rv = nng_msg_append(m, buf, len))) nng_msg_free(m);
    if (!rv && (rv = nng_sendmsg(p->sock, m, NNG_FLAG_NONBLOCK))) nng_msg_free(m);
    if (rv) {
        if (atomic_fetch_add(&p->dropped, 1) == 0)
            fy_error("rpc: event to %s dropped: %s (further drops are counted, not logged)", p->url,
                     nng_strerror(rv));
        return rv == NNG_EAGAIN ? FY_ERR_NO_SPACE : from_nng(rv);
    }
    return FY_OK;
}

fy_status_t fy_push_msgw(fy_push_t *p, fy_msgw_t *w)
{
    void *buf;
    size_t len;
    fy_status_t st = fy_msgw_finish(w, &buf, &len);
    if (st) return st;
    st = fy_push_send(p, buf, len);
    fy_free(buf);
    return st;
}

uint64_t fy_push_dropped(fy_push_t *p) { return atomic_load(&p->dropped); }

/* ---- pull ------------------------------------------------------------------------------------ */

struct fy_pull {
    nng_socket sock;
    nng_aio *aio;
    fy_pull_fn fn;
    void *arg;
    atomic_bool closing;
};

static void pull_cb(void *arg)
{
    fy_pull_t *p = arg;
    int rv = nng_aio_result(p->aio);
    if (rv == 0) {
        nng_msg *m = nng_aio_get_msg(p->aio);
        p->fn(p->arg, nng_msg_body(m), nng_msg_len(m));
        nng_msg_free(m);
    } else if (rv == NNG_ECLOSED || atomic_load(&p->closing)) {
        return;
    }
    if (!atomic_load(&p->closing)) nng_recv_aio(p->sock, p->aio);
}

fy_status_t fy_pull_create(const char *url, fy_pull_fn fn, void *arg, fy_pull_t **p_p)
{
    fy_pull_t *p = fy_calloc(1, sizeof(*p));
    if (!p) return FY_ERR_NOMEM;
    p->fn = fn;
    p->arg = arg;
    int rv = nng_pull0_open(&p->sock);
    if (rv) {
        fy_free(p);
        fy_error("rpc: cannot open a pull socket: %s", nng_strerror(rv));
        return from_nng(rv);
    }
    nng_socket_set_size(p->sock, NNG_OPT_RECVMAXSZ, FY_RPC_MAX_MSG);
    if ((rv = nng_aio_alloc(&p->aio, pull_cb, p))) {
        nng_close(p->sock);
        fy_free(p);
        return from_nng(rv);
    }
    fy_status_t st = listen_on(p->sock, url, "event stream");
    if (st) {
        nng_close(p->sock);
        nng_aio_free(p->aio);
        fy_free(p);
        return st;
    }
    nng_recv_aio(p->sock, p->aio);
    *p_p = p;
    return FY_OK;
}

void fy_pull_destroy(fy_pull_t *p)
{
    if (!p) return;
    atomic_store(&p->closing, true);
    nng_aio_stop(p->aio);
    close_socket(p->sock, "an event stream");
    nng_aio_free(p->aio);
    fy_free(p);
}

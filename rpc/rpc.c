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
 *
 * Envelopes (envelope.h): each socket has its own channel id and sequence
 * counter; a message is sealed right before nng takes it (under the push
 * socket's lock, so one pipe carries one channel in sequence order), and
 * opened, role-checked and run past the replay guard before anyone sees
 * it.  Not here: which fields a message holds, and whether its sender may
 * say them (the router and the workers check that).
 */
#include "rpc/rpc.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <nng/nng.h>
#include <nng/protocol/pipeline0/pull.h>
#include <nng/protocol/pipeline0/push.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>

#include "common/clock.h"
#include "common/envelope.h"
#include "common/log.h"
#include "common/mem.h"
#include "common/wire.h"

#define SERVER_CHANNELS 4096 /* client channels a server remembers */
#define PULL_CHANNELS 1024   /* sender channels an event stream remembers */
#define REFUSAL_LOG_S 10.0   /* one log line per fault and socket at most this often */

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

/* ---- refused messages: counted by fault, logged rate-limited ---------------------------------- */

typedef struct refusals {
    pthread_mutex_t mu;
    uint64_t n[FY_ENV_N_FAULTS];
    uint64_t quiet[FY_ENV_N_FAULTS]; /* refused since the last line about that fault */
    double last[FY_ENV_N_FAULTS];    /* when that line was written (0: never) */
    char what[300];                  /* "events on tcp://..." */
} refusals_t;

static void refusals_init(refusals_t *r, const char *kind, const char *url)
{
    memset(r, 0, sizeof(*r));
    pthread_mutex_init(&r->mu, NULL);
    snprintf(r->what, sizeof(r->what), "%s %s", kind, url);
}

static void refusals_destroy(refusals_t *r) { pthread_mutex_destroy(&r->mu); }

static void refusals_add(refusals_t *r, uint64_t out[FY_ENV_N_FAULTS])
{
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < FY_ENV_N_FAULTS; i++) out[i] += r->n[i];
    pthread_mutex_unlock(&r->mu);
}

/* Counts a refusal of fault f; true when it is time for a log line
 * (*quiet_p: how many went unlogged since the last). */
static bool refusal_count(refusals_t *r, fy_env_fault_t f, uint64_t *quiet_p)
{
    double now = fy_now_s();
    pthread_mutex_lock(&r->mu);
    r->n[f]++;
    bool say = r->last[f] == 0 || now - r->last[f] >= REFUSAL_LOG_S;
    *quiet_p = r->quiet[f];
    if (say) {
        r->last[f] = now;
        r->quiet[f] = 0;
    } else {
        r->quiet[f]++;
    }
    pthread_mutex_unlock(&r->mu);
    return say;
}

/* Counts a refused message; h is what its header claims (NULL if none
 * could be read), why an extra word from the owner. */
static void refused(refusals_t *r, fy_env_fault_t f, const fy_env_hdr_t *h, const char *why)
{
    uint64_t quiet;
    if (!refusal_count(r, f, &quiet)) return;
    char who[200] = "", more[96] = "";
    if (h)
        snprintf(who, sizeof(who), " from %s%s (%s, incarnation %016llx)",
                 f == FY_ENV_MAC ? "a sender claiming to be " : "", h->name, fy_env_role_str(h->role),
                 (unsigned long long)h->inc);
    if (quiet)
        snprintf(more, sizeof(more), "; %llu more refused for this since the last line", (unsigned long long)quiet);
    fy_warn("rpc: %s: refused a message%s: %s%s%s%s", r->what, who, fy_env_fault_words(f), why ? ": " : "",
            why ? why : "", more);
}

/* ---- which connections are encrypted (cluster.encrypt) -------------------------------------- */

/* Whether host (a URL's, brackets removed) is this machine's loopback:
 * 127.0.0.0/8, ::1 or "localhost". */
static bool host_loopback(const char *host, size_t n)
{
    if (n == 9 && !strncmp(host, "localhost", 9)) return true;
    if (n == 3 && !strncmp(host, "::1", 3)) return true;
    if (n >= 4 && !strncmp(host, "127.", 4)) {
        for (size_t i = 4; i < n; i++)
            if (!(host[i] == '.' || (host[i] >= '0' && host[i] <= '9'))) return false;
        return true;
    }
    return false;
}

/* A dialer's judgement: whether url's peer is on this machine's loopback
 * (ipc:// and inproc:// are; a tcp host is when it is 127.x.y.z, [::1] or
 * localhost; anything else is not). */
static bool url_loopback(const char *url)
{
    if (!strncmp(url, "ipc://", 6) || !strncmp(url, "inproc://", 9) || !strncmp(url, "abstract://", 11)) return true;
    const char *h = strstr(url, "://");
    if (!h || strncmp(url, "tcp", 3)) return false;
    h += 3;
    if (*h == '[') {
        const char *e = strchr(h, ']');
        return e && host_loopback(h + 1, (size_t)(e - h - 1));
    }
    const char *e = strrchr(h, ':');
    return host_loopback(h, e ? (size_t)(e - h) : strlen(h));
}

/* A listener's judgement, for each message: whether the connection it
 * came on has a loopback (or local ipc) peer; false when that cannot be
 * told. */
static bool msg_loopback(nng_msg *m)
{
    nng_sockaddr sa;
    if (nng_pipe_get_addr(nng_msg_get_pipe(m), NNG_OPT_REMADDR, &sa)) return false;
    switch (sa.s_family) {
    case NNG_AF_IPC:
    case NNG_AF_INPROC:
    case NNG_AF_ABSTRACT: return true;
    case NNG_AF_INET: return ((const uint8_t *)&sa.s_in.sa_addr)[0] == 127; /* network byte order */
    case NNG_AF_INET6: {
        static const uint8_t one[16] = {[15] = 1}, v4[12] = {[10] = 0xff, [11] = 0xff};
        const uint8_t *a = sa.s_in6.sa_addr;
        return !memcmp(a, one, 16) || (!memcmp(a, v4, 12) && a[12] == 127);
    }
    default: return false;
    }
}

/* Opens what arrived (a hello too when hello): FY_ENV_OK with the
 * sender's header and where the payload starts (decrypted in place when
 * it came encrypted), else the fault (counted and logged).  need_aead:
 * this connection must encrypt (cluster.encrypt), so a payload in clear
 * is refused. */
static fy_env_fault_t open_incoming(const fy_env_auth_t *a, fy_env_keys_t *keys, fy_env_guard_t *g, unsigned roles,
                                    bool hello, bool need_aead, refusals_t *r, void *buf, size_t len, fy_env_hdr_t *h,
                                    size_t *off_p)
{
    fy_env_fault_t f = fy_env_open_as(a, keys, buf, len, h, off_p);
    const char *why = f == FY_ENV_IDENTITY ? "addressed to another receiver" : NULL;
    if (!f && h->kind != FY_ENV_MSG && !(hello && h->kind == FY_ENV_HELLO))
        f = FY_ENV_FORMAT, why = "a reply where a request belongs";
    if (!f && !(roles & FY_RPC_FROM(h->role))) f = FY_ENV_IDENTITY, why = "its role does not send here";
    /* a hello carries no payload: nothing to hide, and the answer says who we are */
    if (!f && need_aead && !h->aead && *off_p < len) f = FY_ENV_CLEAR;
    if (!f) f = fy_env_guard_admit(g, h, fy_env_now_ms());
    if (f) {
        fy_env_hdr_t claim;
        size_t o;
        bool have = fy_env_parse(buf, len, &claim, &o) == FY_ENV_OK;
        refused(r, f, have ? &claim : NULL, why);
    }
    return f;
}

/* This socket's header for what it sends next to "to" (NULL: nobody yet;
 * sequence and time are set by the caller). */
static void self_header(const fy_env_auth_t *a, uint64_t chan, fy_env_kind_t kind, const fy_env_peer_t *to,
                        fy_env_hdr_t *h)
{
    memset(h, 0, sizeof(*h));
    h->kind = kind;
    h->role = a->role;
    snprintf(h->name, sizeof(h->name), "%s", a->name);
    if (to) h->to = *to;
    h->inc = a->inc;
    h->chan = chan;
}

/* ---- the nng linked ---------------------------------------------------------------------------- */

const char *fy_rpc_nng_version(void) { return nng_version(); }

bool fy_rpc_nng_fixed(void)
{
    /* nng_version() is "MAJOR.MINOR.PATCH" with an optional suffix ("1.6.0-pre") */
    unsigned major = 0, minor = 0;
    if (sscanf(nng_version(), "%u.%u", &major, &minor) != 2) return false;
    return major > 1 || (major == 1 && minor >= 6);
}

#if defined(__SANITIZE_ADDRESS__)
#define FY_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FY_LSAN 1
#endif
#endif
#ifdef FY_LSAN
/* LeakSanitizer reads this at exit in ASan builds (tests, daemons, fuzz
 * targets).  nng 1.11 leaves some of its endpoints behind when sockets
 * are closed while their dialers connect and their listeners accept
 * (test_close_in_flight closes about 1,300 sockets so and leaks about 70
 * dialers and listeners with their connections, ipc or tcp; a program
 * of nng alone does the same, waiting 3 s before nng_fini).  Only nng's
 * endpoint and connection allocations are named: a message or anything
 * else ferry leaks still reports. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:nni_dialer_create\nleak:nni_listener_create\nleak:ipc_ep_\nleak:ipc_listener_\n"
           "leak:ipc_dialer_\nleak:nni_ipc_\nleak:nni_posix_ipc_alloc\nleak:tcptran_ep\nleak:tcptran_dial\n"
           "leak:tcptran_accept\nleak:tcptran_listener\nleak:tcptran_pipe_alloc\nleak:tcp_listener_\n"
           "leak:tcp_dialer_\nleak:nni_tcp_\nleak:nni_posix_tcp_alloc\n";
}
#endif

static pthread_once_t nng_noted = PTHREAD_ONCE_INIT;

static void note_nng(void)
{
    if (fy_rpc_nng_fixed())
        fy_info("rpc: nng %s", nng_version());
    else
        fy_warn("rpc: nng %s is older than 1.6: push sockets can use freed memory (nng issue 1653) and a close "
                "can hang (worked around); `make deps` builds nng 1.11 into build/nng",
                nng_version());
}

/*
 * nng 1.5.2 (Debian 12) can hang in nng_close when a message arrives on
 * one of the socket's pipes while the socket closes.  The ipc and tcp
 * transports read a message in two steps (its length, then its body);
 * if the pipe closes between the two, the body's read is refused without
 * a callback, so the protocol's receive on that pipe never ends
 * (nanomsg/nng pull request #1636, "Finish receive aio on close", fixed
 * it for tcp after 1.5.2; ipc has the same code).  The pipe is torn down
 * on nng's single reaper thread, which then waits for that receive
 * forever: this close hangs, and so does every later close in the
 * process, since pipes are no longer reaped (and dials that fail leave
 * their socket in the poller, which then spins a core).  So the close
 * must not race an arriving message: a client lets the replies it still
 * expects arrive before it closes (fy_rpc_client_destroy).  A server or
 * an event stream cannot know that its peers are done sending, so its
 * close can still meet the bug, when a peer sends just then (at
 * shutdown, in practice).  As a last resort, a socket is closed on a
 * helper thread; if that does not finish within two seconds the socket
 * is left behind with a warning rather than hanging the process that is
 * shutting it down.
 *
 * nng 1.6 took that fix for tcp (the receive callback checks whether the
 * pipe closed before it reads the body), and `make deps` links 1.11; but
 * 1.11's ipc transport still reads the body without that check, and a
 * host without build/nng links Debian's 1.5.2, so the workaround stays:
 * it costs a thread per close.
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

static bool close_socket(nng_socket sock, const char *what)
{
    closer_t *k = fy_calloc(1, sizeof(*k));
    pthread_t t;
    pthread_attr_t attr;
    if (!k) {
        nng_close(sock);
        return true;
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
        return true;
    }
    pthread_attr_destroy(&attr);
    struct timespec ts;
    fy_deadline_in(CLOCK_REALTIME, 2, &ts);
    pthread_mutex_lock(&k->mu);
    while (!k->done)
        if (pthread_cond_timedwait(&k->cv, &k->mu, &ts)) break;
    bool done = k->done;
    if (!done) fy_warn("rpc: closing the socket of %s is stuck (an nng 1.5 bug); left behind", what);
    closer_unref(k);
    return done;
}

/* ---- a listening socket's connections, before they authenticate ------------------------------------------ */

/*
 * nng reads a frame's length and allocates that much before a byte of it
 * is checked, per connection, with no limit on connections and no
 * deadline on a frame.  So each listening socket has a receive limit
 * sized to the largest message its port takes (NNG_OPT_RECVMAXSZ: a
 * longer frame closes the connection before anything is allocated), a
 * cap on connections and a smaller one on those not authenticated yet
 * (one over either is closed as it is added, before it can receive), and
 * a deadline: a connection that has not delivered an authenticated
 * message within auth_s of connecting is closed.  What unauthenticated
 * connections can hold is then at most max_pending times the limit, for
 * auth_s at most.  Pipes are tracked from nng's pipe notifications;
 * the deadline is checked every CONN_TICK_MS on an nng timer.
 */
#define CONN_TICK_MS 250

typedef struct conn {
    nng_pipe pipe;
    double t0;   /* when it was added */
    bool authed; /* it delivered an authenticated message */
} conn_t;

typedef struct conns {
    pthread_mutex_t mu;
    conn_t *v;
    int n, cap_v;
    int n_unauthed;
    int max_conns;   /* 0: no cap */
    int max_pending; /* of those not authenticated yet; 0: no cap */
    double auth_s;   /* 0: no deadline */
    uint64_t over_cap, late;
    double last_log;
    nng_aio *timer;
    atomic_bool stopping;
    char what[280];
} conns_t;

static void conns_log(conns_t *g, const char *why)
{
    /* mu held: one line every REFUSAL_LOG_S at most */
    double now = fy_now_s();
    if (g->last_log && now - g->last_log < REFUSAL_LOG_S) return;
    g->last_log = now;
    fy_warn("rpc: %s: closed a connection %s (%llu over the caps of %d connections and %d unauthenticated, %llu past "
            "the deadline of %.1f s so far)",
            g->what, why, (unsigned long long)g->over_cap, g->max_conns, g->max_pending, (unsigned long long)g->late,
            g->auth_s);
}

static void conns_event(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    conns_t *g = arg;
    bool close_it = false;
    pthread_mutex_lock(&g->mu);
    if (ev == NNG_PIPE_EV_ADD_PRE) {
        if ((g->max_conns && g->n >= g->max_conns) || (g->max_pending && g->n_unauthed >= g->max_pending)) {
            g->over_cap++;
            conns_log(g, "over the cap");
            close_it = true;
        } else {
            if (g->n == g->cap_v) {
                int nc = g->cap_v ? 2 * g->cap_v : 64;
                conn_t *nv = fy_realloc(g->v, (size_t)nc * sizeof(*nv));
                if (nv) g->v = nv, g->cap_v = nc;
            }
            if (g->n < g->cap_v) {
                g->v[g->n++] = (conn_t){.pipe = p, .t0 = fy_now_s()};
                g->n_unauthed++;
            } else {
                close_it = true; /* out of memory: not taken */
            }
        }
    } else if (ev == NNG_PIPE_EV_REM_POST) {
        for (int i = 0; i < g->n; i++)
            if (nng_pipe_id(g->v[i].pipe) == nng_pipe_id(p)) {
                if (!g->v[i].authed) g->n_unauthed--;
                g->v[i] = g->v[--g->n];
                break;
            }
    }
    pthread_mutex_unlock(&g->mu);
    if (close_it) nng_pipe_close(p);
}

/* m arrived authenticated: its connection is past the deadline's reach. */
static void conns_authed(conns_t *g, nng_msg *m)
{
    if (!g) return;
    nng_pipe p = nng_msg_get_pipe(m);
    pthread_mutex_lock(&g->mu);
    for (int i = 0; g->n_unauthed && i < g->n; i++)
        if (nng_pipe_id(g->v[i].pipe) == nng_pipe_id(p)) {
            if (!g->v[i].authed) g->v[i].authed = true, g->n_unauthed--;
            break;
        }
    pthread_mutex_unlock(&g->mu);
}

static void conns_tick(void *arg)
{
    conns_t *g = arg;
    if (nng_aio_result(g->timer) || atomic_load(&g->stopping)) return;
    nng_pipe late[64];
    int n_late = 0;
    double now = fy_now_s();
    pthread_mutex_lock(&g->mu);
    for (int i = 0; g->auth_s > 0 && i < g->n && n_late < 64; i++)
        if (!g->v[i].authed && now - g->v[i].t0 > g->auth_s) {
            late[n_late++] = g->v[i].pipe;
            g->v[i].authed = true; /* closed once; REM_POST drops it */
            g->n_unauthed--;
            g->late++;
        }
    if (n_late) conns_log(g, "past the deadline without an authenticated message");
    pthread_mutex_unlock(&g->mu);
    for (int i = 0; i < n_late; i++) nng_pipe_close(late[i]);
    if (!atomic_load(&g->stopping)) nng_sleep_aio(CONN_TICK_MS, g->timer);
}

/* Watches sock's connections (before it listens); NULL when out of memory. */
static conns_t *conns_create(nng_socket sock, const char *kind, const char *url, int max_conns, int max_pending,
                             double auth_s)
{
    conns_t *g = fy_calloc(1, sizeof(*g));
    if (!g) return NULL;
    pthread_mutex_init(&g->mu, NULL);
    g->max_conns = max_conns;
    g->max_pending = max_pending;
    g->auth_s = auth_s;
    snprintf(g->what, sizeof(g->what), "%s %s", kind, url);
    if (nng_aio_alloc(&g->timer, conns_tick, g) || nng_pipe_notify(sock, NNG_PIPE_EV_ADD_PRE, conns_event, g) ||
        nng_pipe_notify(sock, NNG_PIPE_EV_REM_POST, conns_event, g)) {
        if (g->timer) nng_aio_free(g->timer);
        pthread_mutex_destroy(&g->mu);
        fy_free(g);
        return NULL;
    }
    nng_sleep_aio(CONN_TICK_MS, g->timer);
    return g;
}

/* Stops the deadline's timer (before the socket closes). */
static void conns_stop(conns_t *g)
{
    if (!g) return;
    atomic_store(&g->stopping, true);
    nng_aio_stop(g->timer);
}

/* After the socket closed (closed: it did; else nng may still call us: leak). */
static void conns_free(conns_t *g, bool closed)
{
    if (!g || !closed) return;
    nng_aio_free(g->timer);
    pthread_mutex_destroy(&g->mu);
    fy_free(g->v);
    fy_free(g);
}

static void conns_set(conns_t *g, int max_conns, int max_pending, double auth_s)
{
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    g->max_conns = max_conns;
    g->max_pending = max_pending;
    g->auth_s = auth_s;
    pthread_mutex_unlock(&g->mu);
}

static void conns_counts(conns_t *g, fy_rpc_conns_t *out)
{
    memset(out, 0, sizeof(*out));
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    out->open = g->n;
    out->over_cap = g->over_cap;
    out->late = g->late;
    pthread_mutex_unlock(&g->mu);
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

const char *fy_status_tag(fy_status_t st)
{
    return st >= 0 && st < FY_STATUS_COUNT && TAGS[st] ? TAGS[st] : "internal";
}

fy_status_t fy_msg_error_code(const char *code)
{
    for (int i = 1; i < FY_STATUS_COUNT; i++)
        if (TAGS[i] && !strcmp(TAGS[i], code)) return (fy_status_t)i;
    return FY_ERR_INTERNAL;
}

void fy_msg_error(fy_msgw_t *w, uint64_t id, fy_status_t st, const char *message)
{
    fy_wire_error_t m = {.id = id};
    snprintf(m.code, sizeof(m.code), "%s", fy_status_tag(st));
    snprintf(m.message, sizeof(m.message), "%s", message ? message : fy_status_str(st));
    fy_wire_error_write(w, &m);
}

/* ---- server ------------------------------------------------------------------------------------ */

enum { SLOT_RECV, SLOT_BUSY, SLOT_SEND };

struct fy_rpc_call {
    fy_rpc_server_t *s;
    nng_ctx ctx;
    nng_aio *aio;
    nng_msg *req;
    uint64_t re_chan, re_seq; /* the request being answered */
    fy_env_peer_t from;       /* its sender: the reply's receiver */
    bool aead;                /* the reply is encrypted: the request was, or the connection must be */
    int state;
};

struct fy_rpc_server {
    nng_socket sock;
    fy_rpc_handler_fn fn;
    void *arg;
    fy_rpc_call_t *slots;
    int n_slots;
    atomic_bool closing;
    fy_env_auth_t auth;
    fy_env_keys_t *keys; /* the clients' keys, derived once */
    conns_t *conns;      /* its connections before they authenticate */
    unsigned roles;
    uint64_t chan;
    atomic_uint_fast64_t seq;
    fy_env_guard_t *guard;
    refusals_t refusals;
    char url[256];
};

static void slot_recv(fy_rpc_call_t *c)
{
    if (atomic_load(&c->s->closing)) return;
    c->state = SLOT_RECV;
    nng_ctx_recv(c->ctx, c->aio);
}

static void slot_send(fy_rpc_call_t *c, nng_msg *m)
{
    c->state = SLOT_SEND;
    nng_aio_set_msg(c->aio, m);
    nng_ctx_send(c->ctx, c->aio);
}

/* A request that did not pass: the client hears why (the fault's code,
 * nothing more), rather than waiting out its timeout. */
static void slot_refuse(fy_rpc_call_t *c, fy_env_fault_t f)
{
    fy_rpc_server_t *s = c->s;
    fy_env_hdr_t h;
    self_header(&s->auth, s->chan, FY_ENV_REFUSAL, NULL, &h);
    h.seq = atomic_fetch_add(&s->seq, 1) + 1;
    h.ts_ms = fy_env_now_ms();
    uint8_t buf[FY_ENV_MAX_HEADER];
    size_t n = fy_env_refusal(&h, f, buf, sizeof(buf));
    nng_msg *m;
    if (!n || nng_msg_alloc(&m, 0)) {
        slot_recv(c);
        return;
    }
    if (nng_msg_append(m, buf, n)) {
        nng_msg_free(m);
        slot_recv(c);
        return;
    }
    slot_send(c, m);
}

static void slot_cb(void *arg)
{
    fy_rpc_call_t *c = arg;
    fy_rpc_server_t *s = c->s;
    int rv = nng_aio_result(c->aio);
    if (c->state == SLOT_SEND) {
        if (rv) nng_msg_free(nng_aio_get_msg(c->aio));
        slot_recv(c);
        return;
    }
    if (rv) {
        if (rv != NNG_ECLOSED && !atomic_load(&s->closing)) {
            fy_warn("rpc: receive on %s failed: %s", s->url, nng_strerror(rv));
            slot_recv(c);
        }
        return;
    }
    nng_msg *m = nng_aio_get_msg(c->aio);
    fy_env_hdr_t h;
    size_t off;
    bool need = fy_env_crypt_wanted(s->auth.crypt, msg_loopback(m));
    fy_env_fault_t f = open_incoming(&s->auth, s->keys, s->guard, s->roles, true, need, &s->refusals, nng_msg_body(m),
                                     nng_msg_len(m), &h, &off);
    if (f) {
        nng_msg_free(m);
        slot_refuse(c, f);
        return;
    }
    conns_authed(s->conns, m);
    c->req = m;
    c->re_chan = h.chan;
    c->re_seq = h.seq;
    c->aead = need || h.aead;
    c->from = (fy_env_peer_t){.role = h.role, .inc = h.inc};
    snprintf(c->from.name, sizeof(c->from.name), "%s", h.name);
    c->state = SLOT_BUSY;
    if (h.kind == FY_ENV_HELLO) { /* who we are: the reply's header says it, sealed for the asker */
        fy_rpc_reply(c, "", 0);
        return;
    }
    s->fn(s->arg, c, &h, (const uint8_t *)nng_msg_body(m) + off, nng_msg_len(m) - off);
}

void fy_rpc_reply(fy_rpc_call_t *c, const void *buf, size_t len)
{
    /* the reply is built before the request goes: buf may point into it */
    fy_rpc_server_t *s = c->s;
    fy_env_hdr_t h;
    self_header(&s->auth, s->chan, FY_ENV_REPLY, &c->from, &h);
    h.re_chan = c->re_chan;
    h.re_seq = c->re_seq;
    h.aead = c->aead;
    size_t hl = fy_env_header_bytes(&h);
    nng_msg *m;
    int rv = nng_msg_alloc(&m, hl + len);
    if (!rv) {
        uint8_t *body = nng_msg_body(m);
        memcpy(body + hl, buf, len);
        h.seq = atomic_fetch_add(&s->seq, 1) + 1;
        h.ts_ms = fy_env_now_ms();
        if (!fy_env_seal_as(&s->auth, s->keys, &h, body + hl, len, body)) {
            nng_msg_free(m);
            rv = NNG_EPERM; /* a server without the deployment's secret cannot answer a client */
        }
    }
    nng_msg_free(c->req);
    c->req = NULL;
    if (rv) { /* the client's timeout reports it; the slot serves on */
        fy_error("rpc: cannot build a reply of %zu bytes: %s", len, nng_strerror(rv));
        slot_recv(c);
        return;
    }
    slot_send(c, m);
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
        static const char nomem[] = "\x83\xa1v\x01\xa4type\xa5"
                                    "error\xa4"
                                    "code\xa5nomem";
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

fy_status_t fy_rpc_server_create(const char *url, int n_slots, const fy_env_auth_t *auth, unsigned roles,
                                 fy_rpc_handler_fn fn, void *arg, fy_rpc_server_t **s_p)
{
    if (n_slots < 1 || n_slots > 4096 || !fn || !auth) return FY_ERR_INVALID;
    pthread_once(&nng_noted, note_nng);
    fy_rpc_server_t *s = fy_calloc(1, sizeof(*s));
    if (!s) return FY_ERR_NOMEM;
    snprintf(s->url, sizeof(s->url), "%s", url);
    s->fn = fn;
    s->arg = arg;
    s->auth = *auth;
    s->roles = roles;
    refusals_init(&s->refusals, "requests on", url);
    if (!(s->chan = fy_env_random_id()) || fy_env_keys_create(&s->keys) ||
        fy_env_guard_create(SERVER_CHANNELS, fy_env_now_ms(), &s->guard)) {
        fy_env_keys_destroy(s->keys);
        refusals_destroy(&s->refusals);
        fy_env_auth_wipe(&s->auth);
        fy_free(s);
        return FY_ERR_NOMEM;
    }
    int rv = nng_rep0_open(&s->sock);
    if (rv) {
        fy_error("rpc: cannot open a reply socket: %s", nng_strerror(rv));
        fy_env_guard_destroy(s->guard);
        fy_env_keys_destroy(s->keys);
        refusals_destroy(&s->refusals);
        fy_env_auth_wipe(&s->auth);
        fy_free(s);
        return from_nng(rv);
    }
    nng_socket_set_size(s->sock, NNG_OPT_RECVMAXSZ, FY_RPC_MAX_MSG + FY_ENV_MAX_HEADER);
    if (!(s->conns = conns_create(s->sock, "requests on", url, FY_RPC_SERVER_CONNS, FY_RPC_PENDING, FY_RPC_AUTH_S))) {
        fy_rpc_server_destroy(s);
        return FY_ERR_NOMEM;
    }
    s->slots = fy_calloc((size_t)n_slots, sizeof(*s->slots));
    if (!s->slots) {
        fy_rpc_server_destroy(s);
        return FY_ERR_NOMEM;
    }
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
}

void fy_rpc_server_destroy(fy_rpc_server_t *s)
{
    if (!s) return;
    atomic_store(&s->closing, true);
    /* stopped slots run no callback afterwards and start nothing new */
    for (int i = 0; i < s->n_slots; i++)
        if (s->slots[i].aio) nng_aio_stop(s->slots[i].aio);
    conns_stop(s->conns);
    conns_free(s->conns, close_socket(s->sock, s->url));
    for (int i = 0; i < s->n_slots; i++) {
        fy_rpc_call_t *c = &s->slots[i];
        if (c->aio) nng_aio_free(c->aio);
        if (c->req) nng_msg_free(c->req);
    }
    fy_free(s->slots);
    fy_env_guard_destroy(s->guard);
    fy_env_keys_destroy(s->keys);
    refusals_destroy(&s->refusals);
    fy_env_auth_wipe(&s->auth);
    fy_free(s);
}

void fy_rpc_server_refused(fy_rpc_server_t *s, uint64_t out[FY_ENV_N_FAULTS]) { refusals_add(&s->refusals, out); }

void fy_rpc_server_limit(fy_rpc_server_t *s, const fy_rpc_limits_t *l)
{
    nng_socket_set_size(s->sock, NNG_OPT_RECVMAXSZ, l->max_msg + FY_ENV_MAX_HEADER);
    conns_set(s->conns, l->max_conns, l->max_pending, l->auth_s);
}

void fy_rpc_server_conns(fy_rpc_server_t *s, fy_rpc_conns_t *out) { conns_counts(s->conns, out); }

/* ---- client ------------------------------------------------------------------------------------ */

/*
 * A fixed pool of contexts, opened with the client and closed only by
 * fy_rpc_client_destroy, so calls neither open nor close contexts inside
 * aio callbacks, and the calls in flight to one peer are bounded.  Calls
 * beyond the pool wait in a queue for a free slot.
 *
 * A request that went out is answered on its own context, even after
 * its caller gave up: the caller hears FY_ERR_TIMEOUT from the slot's
 * timer at its deadline, while the context keeps waiting (LATE_REPLY_S
 * more at most) for the late reply and drops it.  So the client always
 * knows which replies may still come, and fy_rpc_client_destroy lets
 * them arrive (CLOSE_DRAIN_S at most) before it closes the socket: a
 * message arriving while nng 1.5 closes a socket can hang that close and
 * every later one in the process (see close_socket).
 */
#define CLIENT_SLOTS 32
#define LATE_REPLY_S 5.0  /* a slot waits this long past its call's deadline for a late reply */
#define CLOSE_DRAIN_S 1.0 /* destroy waits this long for replies still on their way */

typedef struct pending {
    nng_msg *msg; /* the payload: the header goes in front when it is sent */
    double deadline;
    fy_rpc_reply_fn cb;
    void *arg;
    bool hello;
    struct pending *next;
} pending_t;

/* Every field but seq is under the client's mu.  A slot is busy from the
 * moment a call takes it until both of its operations (the send, then
 * the receive, on aio; the deadline on timer) have ended and the caller
 * has been told; only then does the next queued call get it. */
typedef struct cslot {
    fy_rpc_client_t *c;
    nng_ctx ctx;
    nng_aio *aio;   /* the request's send, then its reply's receive */
    nng_aio *timer; /* the caller's deadline, once the request is out */
    bool busy;
    bool receiving; /* the request went out: aio receives its reply */
    bool waiting;   /* aio has an operation outstanding */
    bool timing;    /* timer is running */
    bool told;      /* the caller has had its answer */
    bool hello;     /* the call asks the server who it is */
    double deadline;
    uint64_t seq; /* the request's sequence number: its reply must name it */
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
    bool closing;  /* no new calls; calls still waiting were told FY_ERR_CANCELLED */
    bool stopping; /* no new operations: every outstanding one is being cancelled */
    fy_env_auth_t auth;
    fy_env_hdr_t self;  /* this client's request header, less receiver, sequence and time */
    fy_env_peer_t peer; /* the server, as its answer to our hello named it */
    bool aead;          /* requests are encrypted and replies must be (cluster.encrypt and the URL) */
    bool peer_known;    /* else calls wait in held while a hello asks */
    bool hello_busy;    /* a hello is on its way */
    pending_t *held, *held_tail;
    atomic_uint_fast64_t seq;
    refusals_t refusals;
    char url[256];
};

static nng_duration ms_left(double deadline)
{
    double left = deadline - fy_now_s();
    return left <= 0 ? 1 : (nng_duration)(left * 1000.0 + 1.0);
}

/* Gives slot k to a call (mu held). */
static void slot_assign(cslot_t *k, double deadline, fy_rpc_reply_fn cb, void *arg, bool hello)
{
    k->hello = hello;
    k->busy = true;
    k->receiving = false;
    k->waiting = true; /* from here on: slot_start sends, or ends the call */
    k->timing = false;
    k->told = false;
    k->deadline = deadline;
    k->cb = cb;
    k->arg = arg;
}

/* Tells the caller of slot k's call st, unless it has been told already. */
static void cslot_tell(cslot_t *k, fy_status_t st, const void *reply, size_t len)
{
    fy_rpc_client_t *c = k->c;
    pthread_mutex_lock(&c->mu);
    bool tell = !k->told;
    k->told = true;
    fy_rpc_reply_fn cb = k->cb;
    void *arg = k->arg;
    pthread_mutex_unlock(&c->mu);
    if (tell) cb(arg, st, reply, len);
}

static void slot_start(cslot_t *k, nng_msg *m);

/* Slot k's call is over: the slot goes to the next queued call (those
 * already past their deadline, or queued when the client closes, end at
 * once), or idle. */
static void cslot_release(cslot_t *k)
{
    fy_rpc_client_t *c = k->c;
    for (;;) {
        pthread_mutex_lock(&c->mu);
        pending_t *p = c->head;
        if (p) {
            c->head = p->next;
            if (!c->head) c->tail = NULL;
        }
        if (!p) {
            k->busy = false;
            pthread_cond_broadcast(&c->cv);
            pthread_mutex_unlock(&c->mu);
            return;
        }
        fy_status_t why = c->closing ? FY_ERR_CANCELLED : p->deadline <= fy_now_s() ? FY_ERR_TIMEOUT : FY_OK;
        if (why == FY_OK) slot_assign(k, p->deadline, p->cb, p->arg, p->hello);
        pthread_mutex_unlock(&c->mu);
        if (why == FY_OK) {
            slot_start(k, p->msg);
            fy_free(p);
            return;
        }
        nng_msg_free(p->msg);
        p->cb(p->arg, why, NULL, 0);
        fy_free(p);
    }
}

/* One of slot k's operations ended (*which: waiting or timing); after
 * the last the slot is released.  A reply ends the deadline's timer. */
static void cslot_done(cslot_t *k, bool *which)
{
    fy_rpc_client_t *c = k->c;
    pthread_mutex_lock(&c->mu);
    *which = false;
    if (!k->waiting && k->timing) nng_aio_cancel(k->timer); /* completes on another thread */
    bool idle = !k->waiting && !k->timing;
    pthread_mutex_unlock(&c->mu);
    if (idle) cslot_release(k);
}

/* Seals m (its payload) as the next request, to the server the hello
 * named (a hello: to nobody yet), and sends it on slot k, which
 * slot_assign gave to this call. */
static void slot_start(cslot_t *k, nng_msg *m)
{
    fy_rpc_client_t *c = k->c;
    /* sequence numbers go out in about the order they are taken: at most
     * CLIENT_SLOTS calls race, well inside the receiver's window */
    fy_env_hdr_t h = c->self;
    pthread_mutex_lock(&c->mu);
    if (k->hello)
        h.kind = FY_ENV_HELLO;
    else
        h.to = c->peer, h.aead = c->aead;
    pthread_mutex_unlock(&c->mu);
    h.seq = k->seq = atomic_fetch_add(&c->seq, 1) + 1;
    h.ts_ms = fy_env_now_ms();
    uint8_t hdr[FY_ENV_MAX_HEADER];
    fy_status_t st = FY_OK;
    if (!fy_env_seal_as(&c->auth, NULL, &h, nng_msg_body(m), nng_msg_len(m), hdr))
        st = FY_ERR_INTERNAL; /* a client always holds its own key */
    else if (nng_msg_insert(m, hdr, fy_env_header_bytes(&h)))
        st = FY_ERR_NOMEM;
    /* operations start under mu, so that none starts once destroy has
     * cancelled them all (nng 1.5 ignores an operation on a stopped aio
     * without a callback); nng completes them on its own threads */
    pthread_mutex_lock(&c->mu);
    if (!st && c->stopping) st = FY_ERR_CANCELLED;
    if (!st) {
        nng_aio_set_msg(k->aio, m);
        nng_aio_set_timeout(k->aio, ms_left(k->deadline));
        nng_ctx_send(k->ctx, k->aio);
    }
    pthread_mutex_unlock(&c->mu);
    if (st) {
        nng_msg_free(m);
        cslot_tell(k, st, NULL, 0);
        cslot_done(k, &k->waiting);
    }
}

/* The deadline of slot k's call passed (or the timer was cancelled). */
static void cslot_timer_cb(void *arg)
{
    cslot_t *k = arg;
    if (nng_aio_result(k->timer) == 0) cslot_tell(k, FY_ERR_TIMEOUT, NULL, 0);
    cslot_done(k, &k->timing);
}

/* Checks a reply to slot k's request: FY_OK with its payload, or why not. */
static fy_status_t cslot_check(cslot_t *k, nng_msg *m, const uint8_t **payload_p, size_t *len_p)
{
    fy_rpc_client_t *c = k->c;
    uint8_t *body = nng_msg_body(m);
    size_t len = nng_msg_len(m), off;
    fy_env_hdr_t h;
    fy_env_fault_t f = fy_env_open_as(&c->auth, NULL, body, len, &h, &off);
    if (f) {
        fy_env_hdr_t r;
        if (fy_env_parse(body, len, &r, &off) == FY_ENV_OK && r.kind == FY_ENV_REFUSAL) {
            /* the server could not authenticate our request: say why, once in a while.
             * Not addressed to it: a router restarted (another incarnation) or
             * another took its address; the next call asks who is there */
            if (r.reason == FY_ENV_IDENTITY) {
                pthread_mutex_lock(&c->mu);
                c->peer_known = false;
                pthread_mutex_unlock(&c->mu);
            }
            uint64_t quiet;
            if (refusal_count(&c->refusals, r.reason, &quiet)) /* "clear" names its remedy itself */
                fy_error("rpc: %s refused our request: %s%s", c->url, fy_env_fault_words(r.reason),
                         r.reason == FY_ENV_CLEAR ? ""
                                                  : " (does this process read the same kv.secret_file as the router?)");
            return FY_ERR_MISMATCH;
        }
        refused(&c->refusals, f, NULL, "a reply");
        return FY_ERR_PEER;
    }
    if (h.kind != FY_ENV_REPLY || h.role != FY_ROLE_ROUTER || h.re_chan != c->self.chan || h.re_seq != k->seq) {
        refused(&c->refusals, FY_ENV_IDENTITY, &h, "not a router's reply to this request");
        return FY_ERR_PEER;
    }
    if (c->aead && !h.aead && off < len) { /* a hello's answer has no payload */
        refused(&c->refusals, FY_ENV_CLEAR, &h, "a reply");
        return FY_ERR_PEER;
    }
    if (k->hello) { /* the server's identity, authenticated: every request from now on names it */
        pthread_mutex_lock(&c->mu);
        c->peer = (fy_env_peer_t){.role = h.role, .inc = h.inc};
        snprintf(c->peer.name, sizeof(c->peer.name), "%s", h.name);
        c->peer_known = true;
        pthread_mutex_unlock(&c->mu);
    }
    *payload_p = body + off;
    *len_p = len - off;
    return FY_OK;
}

static void cslot_cb(void *arg)
{
    cslot_t *k = arg;
    fy_rpc_client_t *c = k->c;
    int rv = nng_aio_result(k->aio);
    pthread_mutex_lock(&c->mu);
    bool receiving = k->receiving, closing = c->closing;
    if (!receiving && !rv && !c->stopping) {
        /* the request is out: wait for its reply, past the caller's
         * deadline too (the timer tells the caller then) */
        k->receiving = true;
        nng_duration ms = ms_left(k->deadline);
        if (!closing) {
            k->timing = true;
            nng_sleep_aio(ms, k->timer);
        }
        nng_aio_set_timeout(k->aio, ms + (nng_duration)(LATE_REPLY_S * 1000));
        nng_ctx_recv(k->ctx, k->aio);
        pthread_mutex_unlock(&c->mu);
        return;
    }
    pthread_mutex_unlock(&c->mu);
    if (!receiving) {
        /* not sent (or sent while the client stops: nobody waits for it) */
        if (rv) nng_msg_free(nng_aio_get_msg(k->aio));
        cslot_tell(k, rv && !closing ? from_nng(rv) : FY_ERR_CANCELLED, NULL, 0);
        cslot_done(k, &k->waiting);
        return;
    }
    if (rv) {
        cslot_tell(k, closing ? FY_ERR_CANCELLED : from_nng(rv), NULL, 0);
    } else {
        nng_msg *m = nng_aio_get_msg(k->aio);
        const uint8_t *payload = NULL;
        size_t len = 0;
        fy_status_t st = cslot_check(k, m, &payload, &len);
        cslot_tell(k, st, st == FY_OK ? payload : NULL, st == FY_OK ? len : 0);
        nng_msg_free(m);
    }
    cslot_done(k, &k->waiting);
}

fy_status_t fy_rpc_client_create(const char *url, const fy_env_auth_t *auth, fy_rpc_client_t **c_p)
{
    if (!auth) return FY_ERR_INVALID;
    uint64_t chan = fy_env_random_id();
    if (!chan) return FY_ERR_INTERNAL;
    fy_rpc_client_t *c = fy_calloc(1, sizeof(*c));
    if (!c) return FY_ERR_NOMEM;
    snprintf(c->url, sizeof(c->url), "%s", url);
    c->auth = *auth;
    c->aead = fy_env_crypt_wanted(auth->crypt, url_loopback(url));
    self_header(auth, chan, FY_ENV_MSG, NULL, &c->self);
    refusals_init(&c->refusals, "replies from", url);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    int rv = nng_req0_open(&c->sock);
    if (rv) {
        fy_error("rpc: cannot open a request socket: %s", nng_strerror(rv));
        pthread_cond_destroy(&c->cv);
        pthread_mutex_destroy(&c->mu);
        refusals_destroy(&c->refusals);
        fy_env_auth_wipe(&c->auth);
        fy_free(c);
        return from_nng(rv);
    }
    /* no silent resends: a request is answered once or times out, so a
     * reservation is never made twice behind the caller's back */
    nng_socket_set_ms(c->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
    nng_socket_set_size(c->sock, NNG_OPT_RECVMAXSZ, FY_RPC_MAX_MSG + FY_ENV_MAX_HEADER);
    nng_socket_set_ms(c->sock, NNG_OPT_RECONNMINT, 50);
    nng_socket_set_ms(c->sock, NNG_OPT_RECONNMAXT, 1000);
    for (int i = 0; i < CLIENT_SLOTS; i++) {
        cslot_t *k = &c->slots[i];
        k->c = c;
        if ((rv = nng_aio_alloc(&k->aio, cslot_cb, k))) break;
        if ((rv = nng_aio_alloc(&k->timer, cslot_timer_cb, k))) {
            nng_aio_free(k->aio);
            break;
        }
        if ((rv = nng_ctx_open(&k->ctx, c->sock))) {
            nng_aio_free(k->timer);
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

static void end_calls(pending_t *p, fy_status_t st);

static bool any_busy(fy_rpc_client_t *c)
{
    for (int i = 0; i < c->n_slots; i++)
        if (c->slots[i].busy) return true;
    return false;
}

void fy_rpc_client_destroy(fy_rpc_client_t *c)
{
    if (!c) return;
    /* every call still waiting ends now; requests not yet out are withdrawn */
    fy_rpc_reply_fn cbs[CLIENT_SLOTS];
    void *args[CLIENT_SLOTS];
    int n = 0;
    pthread_mutex_lock(&c->mu);
    c->closing = true;
    for (int i = 0; i < c->n_slots; i++) {
        cslot_t *k = &c->slots[i];
        if (k->busy && !k->told) {
            k->told = true;
            cbs[n] = k->cb;
            args[n++] = k->arg;
        }
        if (k->timing) nng_aio_cancel(k->timer);
        if (k->waiting && !k->receiving) nng_aio_cancel(k->aio);
    }
    pending_t *held = c->held;
    c->held = c->held_tail = NULL;
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < n; i++) cbs[i](args[i], FY_ERR_CANCELLED, NULL, 0);
    end_calls(held, FY_ERR_CANCELLED);
    /* replies to requests that went out may still come: let them arrive
     * rather than close the socket under them (see close_socket) */
    struct timespec ts;
    fy_deadline_in(CLOCK_REALTIME, CLOSE_DRAIN_S, &ts);
    pthread_mutex_lock(&c->mu);
    while (any_busy(c))
        if (pthread_cond_timedwait(&c->cv, &c->mu, &ts)) break;
    /* then cancel what is left: each cancelled operation still runs its
     * callback, and no new one starts once stopping is set */
    c->stopping = true;
    for (int i = 0; i < c->n_slots; i++) {
        cslot_t *k = &c->slots[i];
        if (k->waiting) nng_aio_cancel(k->aio);
        if (k->timing) nng_aio_cancel(k->timer);
    }
    while (any_busy(c)) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < c->n_slots; i++) {
        nng_aio_stop(c->slots[i].aio);
        nng_aio_stop(c->slots[i].timer);
        nng_ctx_close(c->slots[i].ctx);
        nng_aio_free(c->slots[i].aio);
        nng_aio_free(c->slots[i].timer);
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
    refusals_destroy(&c->refusals);
    fy_env_auth_wipe(&c->auth);
    fy_free(c);
}

/* Ends each call of a list with st (their messages freed). */
static void end_calls(pending_t *p, fy_status_t st)
{
    while (p) {
        pending_t *next = p->next;
        nng_msg_free(p->msg);
        p->cb(p->arg, st, NULL, 0);
        fy_free(p);
        p = next;
    }
}

/* Starts a call on a free slot, or queues it for the next one (mu held;
 * releases it).  On an error m is freed and cb does not run. */
static fy_status_t submit_locked(fy_rpc_client_t *c, nng_msg *m, double deadline, fy_rpc_reply_fn cb, void *arg,
                                 bool hello)
{
    if (c->closing) {
        pthread_mutex_unlock(&c->mu);
        nng_msg_free(m);
        return FY_ERR_CANCELLED;
    }
    cslot_t *k = NULL;
    for (int i = 0; i < c->n_slots && !k; i++)
        if (!c->slots[i].busy) k = &c->slots[i];
    if (k) {
        slot_assign(k, deadline, cb, arg, hello);
        pthread_mutex_unlock(&c->mu);
        slot_start(k, m);
        return FY_OK;
    }
    pending_t *p = fy_calloc(1, sizeof(*p));
    if (!p) {
        pthread_mutex_unlock(&c->mu);
        nng_msg_free(m);
        return FY_ERR_NOMEM;
    }
    *p = (pending_t){m, deadline, cb, arg, hello, NULL};
    if (c->tail)
        c->tail->next = p;
    else
        c->head = p;
    c->tail = p;
    pthread_mutex_unlock(&c->mu);
    return FY_OK;
}

/* The hello's answer came (or not): the calls held for it go out to the
 * server it named, or end with its status. */
static void hello_done(void *arg, fy_status_t st, const void *reply, size_t len)
{
    (void)reply, (void)len;
    fy_rpc_client_t *c = arg;
    pthread_mutex_lock(&c->mu);
    c->hello_busy = false;
    bool known = c->peer_known;
    pending_t *p = c->held;
    c->held = c->held_tail = NULL;
    pthread_mutex_unlock(&c->mu);
    if (!known) {
        end_calls(p, st ? st : FY_ERR_PEER);
        return;
    }
    while (p) {
        pending_t *next = p->next;
        pthread_mutex_lock(&c->mu);
        fy_status_t sst = submit_locked(c, p->msg, p->deadline, p->cb, p->arg, false);
        if (sst) p->cb(p->arg, sst, NULL, 0);
        fy_free(p);
        p = next;
    }
}

fy_status_t fy_rpc_call_async(fy_rpc_client_t *c, const void *buf, size_t len, double timeout_s, fy_rpc_reply_fn cb,
                              void *arg)
{
    if (len > FY_RPC_MAX_MSG) return FY_ERR_INVALID;
    nng_msg *m = NULL, *hm = NULL; /* the header is put in front when the call goes out */
    int rv = nng_msg_alloc(&m, len);
    if (rv) {
        fy_error("rpc: cannot build a call to %s: %s", c->url, nng_strerror(rv));
        return from_nng(rv);
    }
    memcpy(nng_msg_body(m), buf, len);
    double deadline = fy_now_s() + timeout_s;
    pthread_mutex_lock(&c->mu);
    if (c->peer_known || c->closing) return submit_locked(c, m, deadline, cb, arg, false);
    /* whom to address it to is not known yet: it waits while a hello asks */
    pending_t *p = fy_calloc(1, sizeof(*p));
    bool ask = p && !c->hello_busy;
    if (ask && nng_msg_alloc(&hm, 0)) ask = false, fy_free(p), p = NULL;
    if (!p) {
        pthread_mutex_unlock(&c->mu);
        nng_msg_free(m);
        return FY_ERR_NOMEM;
    }
    *p = (pending_t){m, deadline, cb, arg, false, NULL};
    if (c->held_tail)
        c->held_tail->next = p;
    else
        c->held = p;
    c->held_tail = p;
    if (!ask) {
        pthread_mutex_unlock(&c->mu);
        return FY_OK;
    }
    c->hello_busy = true;
    fy_status_t st = submit_locked(c, hm, deadline, hello_done, c, true);
    if (st) hello_done(c, st, NULL, 0);
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
    atomic_int pipes;   /* connections up now (fy_push_connected) */
    pthread_mutex_t mu; /* sequence numbers reach the pipe in order */
    fy_env_auth_t auth;
    fy_env_hdr_t self;
    size_t hlen;
    uint64_t seq;
    char url[256];
};

static void push_pipe_added(nng_pipe pipe, nng_pipe_ev ev, void *arg)
{
    (void)pipe, (void)ev;
    atomic_fetch_add(&((fy_push_t *)arg)->pipes, 1);
}

static void push_pipe_removed(nng_pipe pipe, nng_pipe_ev ev, void *arg)
{
    (void)pipe, (void)ev;
    atomic_fetch_sub(&((fy_push_t *)arg)->pipes, 1);
}

bool fy_push_connected(fy_push_t *p) { return atomic_load(&p->pipes) > 0; }

fy_status_t fy_push_create(const char *url, int queue, const fy_env_auth_t *auth, const fy_env_peer_t *to,
                           fy_push_t **p_p)
{
    if (!auth || !to || !to->role || !to->name[0]) return FY_ERR_INVALID;
    uint64_t chan = fy_env_random_id();
    if (!chan) return FY_ERR_INTERNAL;
    fy_push_t *p = fy_calloc(1, sizeof(*p));
    if (!p) return FY_ERR_NOMEM;
    snprintf(p->url, sizeof(p->url), "%s", url);
    p->auth = *auth;
    self_header(auth, chan, FY_ENV_MSG, to, &p->self);
    p->self.aead = fy_env_crypt_wanted(auth->crypt, url_loopback(url));
    p->hlen = fy_env_header_bytes(&p->self);
    int rv = nng_push0_open(&p->sock);
    if (rv) {
        fy_env_auth_wipe(&p->auth);
        fy_free(p);
        fy_error("rpc: cannot open a push socket: %s", nng_strerror(rv));
        return from_nng(rv);
    }
    nng_socket_set_int(p->sock, NNG_OPT_SENDBUF, queue < 1 ? 1 : queue > 8192 ? 8192 : queue);
    nng_socket_set_ms(p->sock, NNG_OPT_RECONNMINT, 50);
    nng_socket_set_ms(p->sock, NNG_OPT_RECONNMAXT, 1000);
    nng_pipe_notify(p->sock, NNG_PIPE_EV_ADD_POST, push_pipe_added, p);
    nng_pipe_notify(p->sock, NNG_PIPE_EV_REM_POST, push_pipe_removed, p);
    if ((rv = nng_dial(p->sock, url, NULL, NNG_FLAG_NONBLOCK))) {
        fy_error("rpc: cannot dial %s: %s", url, nng_strerror(rv));
        nng_close(p->sock);
        fy_env_auth_wipe(&p->auth);
        fy_free(p);
        return from_nng(rv) == FY_ERR_INVALID ? FY_ERR_INVALID : FY_ERR_IO;
    }
    pthread_mutex_init(&p->mu, NULL);
    *p_p = p;
    return FY_OK;
}

void fy_push_destroy(fy_push_t *p)
{
    if (!p) return;
    fy_env_auth_wipe(&p->auth);
    /* a close left behind may still run the pipe callbacks, which count
     * into p: p stays allocated with it (as conns_free keeps a server's) */
    if (!close_socket(p->sock, p->url)) return;
    pthread_mutex_destroy(&p->mu);
    fy_free(p);
}

fy_status_t fy_push_send(fy_push_t *p, const void *buf, size_t len)
{
    if (len > FY_RPC_MAX_MSG) return FY_ERR_INVALID;
    nng_msg *m;
    int rv = nng_msg_alloc(&m, p->hlen + len);
    if (!rv) {
        uint8_t *body = nng_msg_body(m);
        memcpy(body + p->hlen, buf, len);
        fy_env_hdr_t h = p->self;
        pthread_mutex_lock(&p->mu);
        h.seq = ++p->seq;
        h.ts_ms = fy_env_now_ms();
        if (!fy_env_seal_as(&p->auth, NULL, &h, body + p->hlen, len, body))
            rv = NNG_EPERM; /* a client's credentials push nothing */
        else
            rv = nng_sendmsg(p->sock, m, NNG_FLAG_NONBLOCK);
        if (rv) nng_msg_free(m);
        pthread_mutex_unlock(&p->mu);
    }
    if (rv) {
        if (atomic_fetch_add(&p->dropped, 1) == 0)
            fy_error("rpc: event to %s dropped: %s (further drops are counted, not logged)", p->url, nng_strerror(rv));
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
    fy_env_auth_t auth;
    fy_env_keys_t *keys; /* the senders' keys, derived once */
    conns_t *conns;      /* its connections before they authenticate */
    unsigned roles;
    fy_env_guard_t *guard;
    refusals_t refusals;
};

static void pull_cb(void *arg)
{
    fy_pull_t *p = arg;
    int rv = nng_aio_result(p->aio);
    if (rv == 0) {
        nng_msg *m = nng_aio_get_msg(p->aio);
        fy_env_hdr_t h;
        size_t off;
        bool need = fy_env_crypt_wanted(p->auth.crypt, msg_loopback(m));
        if (open_incoming(&p->auth, p->keys, p->guard, p->roles, false, need, &p->refusals, nng_msg_body(m),
                          nng_msg_len(m), &h, &off) == FY_ENV_OK) {
            conns_authed(p->conns, m);
            p->fn(p->arg, &h, (const uint8_t *)nng_msg_body(m) + off, nng_msg_len(m) - off);
        }
        nng_msg_free(m);
    } else if (rv == NNG_ECLOSED || atomic_load(&p->closing)) {
        return;
    }
    if (!atomic_load(&p->closing)) nng_recv_aio(p->sock, p->aio);
}

static void pull_free(fy_pull_t *p)
{
    fy_env_guard_destroy(p->guard);
    fy_env_keys_destroy(p->keys);
    refusals_destroy(&p->refusals);
    fy_env_auth_wipe(&p->auth);
    fy_free(p);
}

fy_status_t fy_pull_create(const char *url, const fy_env_auth_t *auth, unsigned roles, fy_pull_fn fn, void *arg,
                           fy_pull_t **p_p)
{
    if (!auth || !fn) return FY_ERR_INVALID;
    fy_pull_t *p = fy_calloc(1, sizeof(*p));
    if (!p) return FY_ERR_NOMEM;
    p->fn = fn;
    p->arg = arg;
    p->auth = *auth;
    p->roles = roles;
    refusals_init(&p->refusals, "messages on", url);
    if (fy_env_keys_create(&p->keys) || fy_env_guard_create(PULL_CHANNELS, fy_env_now_ms(), &p->guard)) {
        pull_free(p);
        return FY_ERR_NOMEM;
    }
    int rv = nng_pull0_open(&p->sock);
    if (rv) {
        pull_free(p);
        fy_error("rpc: cannot open a pull socket: %s", nng_strerror(rv));
        return from_nng(rv);
    }
    nng_socket_set_size(p->sock, NNG_OPT_RECVMAXSZ, FY_RPC_MAX_MSG + FY_ENV_MAX_HEADER);
    if (!(p->conns = conns_create(p->sock, "messages on", url, FY_RPC_PULL_CONNS, FY_RPC_PENDING, FY_RPC_AUTH_S))) {
        nng_close(p->sock);
        pull_free(p);
        return FY_ERR_NOMEM;
    }
    if ((rv = nng_aio_alloc(&p->aio, pull_cb, p))) {
        conns_stop(p->conns);
        conns_free(p->conns, true);
        nng_close(p->sock);
        pull_free(p);
        return from_nng(rv);
    }
    fy_status_t st = listen_on(p->sock, url, "event stream");
    if (st) {
        conns_stop(p->conns);
        nng_close(p->sock);
        conns_free(p->conns, true);
        nng_aio_free(p->aio);
        pull_free(p);
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
    conns_stop(p->conns);
    conns_free(p->conns, close_socket(p->sock, "an event stream"));
    nng_aio_free(p->aio);
    pull_free(p);
}

void fy_pull_refuse(fy_pull_t *p, const fy_env_hdr_t *from, const char *why)
{
    refused(&p->refusals, FY_ENV_IDENTITY, from, why);
}

void fy_pull_refused(fy_pull_t *p, uint64_t out[FY_ENV_N_FAULTS]) { refusals_add(&p->refusals, out); }

void fy_pull_limit(fy_pull_t *p, const fy_rpc_limits_t *l)
{
    nng_socket_set_size(p->sock, NNG_OPT_RECVMAXSZ, l->max_msg + FY_ENV_MAX_HEADER);
    conns_set(p->conns, l->max_conns, l->max_pending, l->auth_s);
}

void fy_pull_conns(fy_pull_t *p, fy_rpc_conns_t *out) { conns_counts(p->conns, out); }

/*
 * httpd.c - the HTTP server (see httpd.h), on libmicrohttpd.
 *
 * libmicrohttpd (MHD) parses requests, keeps connections alive, writes
 * chunked answers, answers oversized request lines and headers (414,
 * 431) and closes connections idle past a timeout, on its own event
 * threads.  What it does not do is done here, by one guard thread per
 * server:
 *
 *   - the header deadline: MHD's timeout is an idle timeout, which a
 *     client sending a byte every few seconds never reaches; the guard
 *     closes a connection whose request is not complete in time;
 *   - the connection cap: MHD at its limit stops accepting, so a flood of
 *     idle connections would shut out /health; here a new connection
 *     beyond the cap closes the oldest one that has no request under way,
 *     and MHD's own limit sits a little higher, for the 503 refusals;
 *   - noticing a client that leaves while its answer waits: MHD does not
 *     watch a suspended connection, so the guard polls those sockets for
 *     a hang-up.
 *
 * The guard closes a connection with shutdown(), never close(): MHD's
 * thread sees the end of the stream and closes it itself.  The socket
 * is only touched while its connection is listed here, under the
 * server's lock, and MHD unlists it (NOTIFY_CONNECTION, CLOSED) before
 * it closes the descriptor, so a descriptor number reused by another
 * socket is never shut down.
 *
 * Held requests: a handler may leave a request unanswered; its connection
 * is suspended in MHD, and an answer from another thread (the router's,
 * under its lock) only records what to send and asks the guard to resume
 * the connection.  So no MHD function is ever called with a caller's
 * lock held, and MHD's callbacks (the end callback takes the router's
 * lock) never run under the server's lock.  A connection is resumed only
 * after MHD_suspend_connection has returned (suspending, then suspended,
 * then a wake-up noticed on the way is passed on), never before.
 *
 * Servers are kept in a process-wide list by address so that two holders
 * share one listener, as the router's API and a metrics route do.
 */
#include "rpc/httpd.h"

#include <errno.h>
#include <netdb.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"
#include "common/metrics.h"

#define MAX_PENDING (8u << 20) /* streamed bytes the client has not taken */
#define STREAM_BLOCK 16384
#define STOP_WAIT_S 3.0
/* body bytes of a refused request (404, 405, 413, OPTIONS) read and dropped
 * so that the connection stays usable; a longer body closes it */
#define DROP_MAX (8u << 20)

typedef struct srv srv_t;

typedef struct route {
    fy_httpd_t *owner;
    char path[128];
    bool get;    /* GET (and HEAD); else POST */
    bool prefix; /* registered as "PATH*": every path that starts with PATH */
    size_t max_body;
    fy_httpd_get_fn get_fn;
    fy_httpd_fn fn;
    void *arg;
    bool dead;    /* its holder removed it */
    int inflight; /* handler calls running */
    int refs;     /* requests pointing at it, plus one while listed */
    struct route *next;
} route_t;

enum { PH_WAIT, PH_READ, PH_ANSWER };

typedef struct conn {
    int fd;
    int phase;        /* no request under way, a request coming in, being answered */
    bool fresh;       /* no request yet on this connection */
    bool over_cap;    /* accepted beyond the cap: refused, except GET routes */
    bool killed;      /* shut down here; MHD closes it */
    uint64_t dropped; /* body bytes of a refused request, read and dropped */
    double deadline;  /* PH_WAIT, PH_READ: shut down past it */
    struct conn *prev, *next;
} conn_t;

enum { RS_NEW, RS_HELD, RS_WHOLE, RS_STREAM, RS_QUEUED, RS_DONE };

struct fy_httpd_req {
    srv_t *S;
    struct MHD_Connection *mc;
    conn_t *c;
    route_t *route;
    uint64_t serial;
    char *path; /* as MHD gives it: unescaped, without the query */
    int state;
    bool ran; /* its route ran (MHD's thread alone reads and writes it) */
    bool streamed, close_after;
    /* the request body */
    char *body;
    size_t len, cap;
    bool too_big;
    /* the answer */
    int status;
    char ctype[96];
    char *hdrs; /* "name\0value\0...\0" */
    char *out;
    size_t out_len;
    /* a stream: bytes not yet taken by MHD */
    char *sbuf;
    size_t slen, soff, scap;
    bool s_end;
    /* suspension */
    bool suspending, suspended, wake, watched, resume_queued, gone;
    fy_httpd_end_fn end;
    void *end_arg;
    struct fy_httpd_req *prev, *next; /* S->reqs */
    struct fy_httpd_req *qnext;       /* S's resume queue */
};

struct srv {
    char host[128];
    int port;
    int refs;
    struct MHD_Daemon *d;
    fy_httpd_limits_t lim;
    int32_t cap;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    conn_t *conns, *conns_tail; /* oldest first */
    int32_t n_conns, n_killed;
    fy_httpd_req_t *reqs;
    uint64_t next_serial;
    fy_httpd_req_t *rq, *rq_tail; /* to resume */
    route_t *routes;
    char cors[1024]; /* allowed origins: "" none, "*", or "a\0b\0\0" */
    bool closing;
    uint64_t timed_out, evicted, refused;
    int ep, evfd;
    /* TLS: the PEM texts MHD reads from (it keeps the pointers); the key's
     * bytes are wiped before they are freed */
    char *tls_cert, *tls_key;
    size_t tls_key_len;
    bool starting;       /* MHD_start_daemon runs: its log lines are kept */
    char start_log[512]; /* as long as a line of on_mhd_log */
    pthread_t guard;
    bool guard_on, guard_stop;
    srv_t *next;
};

struct fy_httpd {
    srv_t *S;
    char url[256];
};

/* *con_cls of a request refused before any route runs: its body is read
 * and dropped, then it is answered, and the connection goes on */
static char g_refused;
#define REFUSED ((fy_httpd_req_t *)(void *)&g_refused)

/* the servers of this process, by address (see the file's head) */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static srv_t *g_servers;

/* ---- limits ---------------------------------------------------------------------------------------- */

/* PEM files at most this long: a certificate chain of a few certificates */
#define TLS_FILE_MAX (1u << 20)

/*
 * Reads a TLS file (what: "router.tls_key") into a NUL-terminated buffer
 * (*out_p, fy_free; NULL with out_p NULL: only checked).  A regular file
 * (a FIFO would block) of at most TLS_FILE_MAX bytes holding the PEM
 * marker want ("CERTIFICATE-----", "PRIVATE KEY-----"); a key (secret)
 * also owned by this user or root and not open to its group or others,
 * as kv.secret_file.  O_NONBLOCK: opening a FIFO returns at once.
 */
static fy_status_t tls_file_read(const char *path, const char *what, bool secret, const char *want, char **out_p)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        fy_error("%s %s: cannot open: %s", what, path, strerror(errno));
        return FY_ERR_INVALID;
    }
    struct stat sb;
    fy_status_t st = FY_ERR_INVALID;
    char *buf = NULL;
    if (fstat(fd, &sb)) {
        fy_error("%s %s: cannot stat: %s", what, path, strerror(errno));
    } else if (!S_ISREG(sb.st_mode)) {
        fy_error("%s %s: not a regular file; a PEM file was expected", what, path);
    } else if (secret && sb.st_uid != geteuid() && sb.st_uid != 0) {
        fy_error("%s %s: owned by uid %u, not by this user (uid %u) or root; someone else could replace it", what, path,
                 (unsigned)sb.st_uid, (unsigned)geteuid());
    } else if (secret && (sb.st_mode & 077)) {
        fy_error("%s %s: mode %04o lets its group or others read the server's private key; it must be the owner's "
                 "alone (chmod 600 %s)",
                 what, path, (unsigned)(sb.st_mode & 07777), path);
    } else if (sb.st_size == 0 || sb.st_size > (off_t)TLS_FILE_MAX) {
        fy_error("%s %s: %lld bytes; a PEM file of 1 to %u bytes was expected", what, path, (long long)sb.st_size,
                 TLS_FILE_MAX);
    } else if (!(buf = fy_malloc((size_t)sb.st_size + 1))) {
        fy_error("%s %s: out of memory", what, path);
        st = FY_ERR_NOMEM;
    } else {
        size_t n = 0;
        errno = 0;
        while (n < (size_t)sb.st_size) {
            ssize_t r = read(fd, buf + n, (size_t)sb.st_size - n);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) break;
            n += (size_t)r;
        }
        buf[n] = 0;
        if (n < (size_t)sb.st_size)
            fy_error("%s %s: cannot read it whole: %s", what, path, errno ? strerror(errno) : "it shrank");
        else if (!strstr(buf, "-----BEGIN ") || !strstr(buf, want))
            fy_error("%s %s: no PEM %s in it (\"-----BEGIN ...%s\" expected)", what, path,
                     secret ? "private key" : "certificate", want);
        else
            st = FY_OK;
    }
    close(fd);
    if (buf && (st || !out_p)) {
        memset(buf, 0, (size_t)sb.st_size + 1); /* a key's bytes do not linger in freed memory */
        fy_free(buf);
        buf = NULL;
    }
    if (out_p) *out_p = buf;
    return st;
}

fy_status_t fy_httpd_limits_check(const fy_httpd_limits_t *l)
{
    if (!l->tls_cert[0]) return FY_OK;
    char what_c[48], what_k[48];
    snprintf(what_c, sizeof(what_c), "%s.tls_cert", l->section ? l->section : "router");
    snprintf(what_k, sizeof(what_k), "%s.tls_key", l->section ? l->section : "router");
    fy_status_t st;
    if ((st = tls_file_read(l->tls_cert, what_c, false, "CERTIFICATE-----", NULL)) ||
        (st = tls_file_read(l->tls_key, what_k, true, "PRIVATE KEY-----", NULL)))
        return st;
    if (!MHD_is_feature_supported(MHD_FEATURE_TLS)) {
        fy_error("%s is set but this libmicrohttpd was built without TLS: HTTPS cannot be served", what_c);
        return FY_ERR_INVALID;
    }
    return FY_OK;
}

/* ---- small helpers (lock held where they say so) ----------------------------------------------------- */

static void json_escape(char *out, size_t cap, const char *s)
{
    size_t n = 0;
    for (; *s && n + 7 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            out[n++] = '\\';
            out[n++] = (char)c;
        } else if (c < 0x20) {
            n += (size_t)snprintf(out + n, cap - n, "\\u%04x", c);
        } else {
            out[n++] = (char)c;
        }
    }
    out[n] = 0;
}

void fy_httpd_reply_metrics(fy_http_reply_t *reply, fy_metrics_t *reg)
{
    char *text;
    size_t len;
    if (fy_metrics_render(reg, &text, &len) != FY_OK) {
        fy_httpd_reply_error(reply, 500, "internal", "out of memory rendering the metrics");
        return;
    }
    reply->content_type = FY_METRICS_CONTENT_TYPE;
    if (reply->body_owned) fy_free(reply->body);
    reply->body = text;
    reply->body_len = len;
    reply->body_owned = 1;
}

void fy_httpd_reply_error(fy_http_reply_t *reply, int status, const char *type, const char *msg)
{
    char m[512], t[64], *body = fy_malloc(700);
    json_escape(m, sizeof(m), msg);
    json_escape(t, sizeof(t), type);
    reply->status = status;
    reply->content_type = "application/json";
    if (reply->body_owned) fy_free(reply->body);
    reply->body = body;
    reply->body_owned = body != NULL;
    reply->body_len = body ? (size_t)snprintf(body, 700,
                                              "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"param\":null,"
                                              "\"code\":null}}\n",
                                              m, t)
                           : 0;
}

/* ---- cross-origin requests ------------------------------------------------------------------------------ */

/* The Access-Control-Allow-Origin for mc's request: "*", its own Origin
 * when that is allowed, or NULL (CORS off, no Origin, not allowed).
 * *listed_p: origins are a list (answers then vary with Origin). */
static const char *cors_origin(srv_t *S, struct MHD_Connection *mc, bool *listed_p)
{
    const char *o = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Origin");
    const char *allow = NULL;
    pthread_mutex_lock(&S->mu);
    *listed_p = S->cors[0] && strcmp(S->cors, "*");
    if (!strcmp(S->cors, "*") && o) allow = "*";
    for (const char *a = *listed_p ? S->cors : ""; o && *a && !allow; a += strlen(a) + 1)
        if (!strcasecmp(a, o)) allow = o;
    pthread_mutex_unlock(&S->mu);
    return allow;
}

static void cors_headers(srv_t *S, struct MHD_Connection *mc, struct MHD_Response *res)
{
    bool listed;
    const char *allow = cors_origin(S, mc, &listed);
    if (listed) MHD_add_response_header(res, "Vary", "Origin");
    if (!allow) return;
    MHD_add_response_header(res, "Access-Control-Allow-Origin", allow);
    MHD_add_response_header(res, "Access-Control-Expose-Headers", "Retry-After");
}

/* MHD thread: queues a JSON error answer (an OpenAI-shaped body). */
static enum MHD_Result queue_error(srv_t *S, struct MHD_Connection *mc, unsigned status, const char *type,
                                   const char *msg, const char *hname, const char *hvalue, bool close_after)
{
    char m[512], body[768];
    json_escape(m, sizeof(m), msg);
    int n = snprintf(body, sizeof(body),
                     "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"param\":null,\"code\":null}}", m, type);
    struct MHD_Response *res = MHD_create_response_from_buffer((size_t)n, body, MHD_RESPMEM_MUST_COPY);
    if (!res) return MHD_NO;
    MHD_add_response_header(res, "Content-Type", "application/json");
    if (hname) MHD_add_response_header(res, hname, hvalue);
    if (close_after) MHD_add_response_header(res, "Connection", "close");
    cors_headers(S, mc, res);
    enum MHD_Result rc = MHD_queue_response(mc, status, res);
    MHD_destroy_response(res);
    return rc;
}

static conn_t *conn_of(struct MHD_Connection *mc)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* Lock held: shuts c's socket; MHD's thread then closes it. */
static void conn_kill(srv_t *S, conn_t *c)
{
    if (c->killed) return;
    c->killed = true;
    S->n_killed++;
    shutdown(c->fd, SHUT_RDWR);
}

static void guard_signal(srv_t *S)
{
    uint64_t one = 1;
    if (write(S->evfd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        fy_warn("http: cannot wake the guard thread: %s", strerror(errno));
}

/* Lock held: r's connection should be looked at again by MHD (an answer,
 * data, the end of a stream, or the client gone).  True when the guard
 * must be woken. */
static bool req_wake(srv_t *S, fy_httpd_req_t *r)
{
    if (r->suspending) {
        r->wake = true; /* the thread suspending it passes it on */
        return false;
    }
    if (!r->suspended || r->resume_queued) return false;
    r->resume_queued = true;
    r->qnext = NULL;
    if (S->rq_tail)
        S->rq_tail->qnext = r;
    else
        S->rq = r;
    S->rq_tail = r;
    return true;
}

/* Lock held: the client's socket is watched for a hang-up while r waits. */
static void req_watch(srv_t *S, fy_httpd_req_t *r)
{
    struct epoll_event ev = {.events = EPOLLRDHUP | EPOLLHUP | EPOLLERR, .data.u64 = r->serial};
    if (!r->watched && r->c && epoll_ctl(S->ep, EPOLL_CTL_ADD, r->c->fd, &ev) == 0) r->watched = true;
}

static void req_unwatch(srv_t *S, fy_httpd_req_t *r)
{
    if (r->watched && r->c) epoll_ctl(S->ep, EPOLL_CTL_DEL, r->c->fd, NULL);
    r->watched = false;
}

/*
 * MHD thread, lock NOT held: suspends r's connection until req_wake.
 * Returns with the lock not held.
 */
static void req_suspend(srv_t *S, fy_httpd_req_t *r)
{
    MHD_suspend_connection(r->mc);
    pthread_mutex_lock(&S->mu);
    r->suspending = false;
    r->suspended = true;
    req_watch(S, r);
    bool sig = (r->wake || r->gone) && req_wake(S, r);
    r->wake = false;
    pthread_mutex_unlock(&S->mu);
    if (sig) guard_signal(S);
}

static void route_unref(srv_t *S, route_t *rt)
{
    if (--rt->refs > 0) return;
    route_t **p = &S->routes;
    while (*p && *p != rt) p = &(*p)->next;
    if (*p) *p = rt->next;
    fy_free(rt);
}

/* Lock held: the live route for path (an exact one, else the longest
 * prefix route that path extends by a byte or more), or NULL. */
static route_t *route_find(srv_t *S, const char *path)
{
    route_t *best = NULL;
    size_t best_len = 0;
    for (route_t *rt = S->routes; rt; rt = rt->next) {
        if (rt->dead) continue;
        if (!rt->prefix && !strcmp(rt->path, path)) return rt;
        size_t l = strlen(rt->path);
        if (rt->prefix && !strncmp(rt->path, path, l) && path[l] && l > best_len) best = rt, best_len = l;
    }
    return best;
}

/* ---- MHD callbacks ------------------------------------------------------------------------------------ */

static void on_connection(void *cls, struct MHD_Connection *mc, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    srv_t *S = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        conn_t *c = fy_calloc(1, sizeof(*c));
        if (!c) { /* untracked: not served */
            if (ci) shutdown(ci->connect_fd, SHUT_RDWR);
            return;
        }
        c->fd = ci ? ci->connect_fd : -1;
        c->fresh = true;
        c->phase = PH_WAIT;
        c->deadline = fy_now_s() + S->lim.header_timeout_s;
        pthread_mutex_lock(&S->mu);
        c->prev = S->conns_tail;
        if (S->conns_tail)
            S->conns_tail->next = c;
        else
            S->conns = c;
        S->conns_tail = c;
        S->n_conns++;
        if (S->n_conns - S->n_killed > S->cap) {
            /* room for the newcomer: the oldest connection without a request
             * under way, else one whose request is still coming in */
            conn_t *victim = NULL;
            for (conn_t *k = S->conns; k && !victim; k = k->next)
                if (k != c && !k->killed && k->phase == PH_WAIT) victim = k;
            for (conn_t *k = S->conns; k && !victim; k = k->next)
                if (k != c && !k->killed && k->phase == PH_READ) victim = k;
            if (victim) {
                conn_kill(S, victim);
                S->evicted++;
            } else {
                c->over_cap = true;
            }
        }
        pthread_mutex_unlock(&S->mu);
        *socket_context = c;
    } else {
        conn_t *c = *socket_context;
        if (!c) return;
        pthread_mutex_lock(&S->mu);
        if (c->prev)
            c->prev->next = c->next;
        else
            S->conns = c->next;
        if (c->next)
            c->next->prev = c->prev;
        else
            S->conns_tail = c->prev;
        S->n_conns--;
        if (c->killed) S->n_killed--;
        pthread_mutex_unlock(&S->mu);
        fy_free(c);
        *socket_context = NULL;
    }
}

/* The request line is in: from here the header deadline runs (a kept-alive
 * connection waited under the idle timeout until now). */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *mc)
{
    srv_t *S = cls;
    conn_t *c = conn_of(mc);
    if (!c) return NULL;
    pthread_mutex_lock(&S->mu);
    c->phase = PH_READ;
    if (!c->fresh) c->deadline = fy_now_s() + S->lim.header_timeout_s;
    pthread_mutex_unlock(&S->mu);
    return NULL;
}

static void set_phase(srv_t *S, conn_t *c, int phase)
{
    if (!c) return;
    pthread_mutex_lock(&S->mu);
    c->phase = phase;
    pthread_mutex_unlock(&S->mu);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    fy_httpd_req_t *r = cls;
    srv_t *S = r->S;
    pthread_mutex_lock(&S->mu);
    if (r->gone) {
        pthread_mutex_unlock(&S->mu);
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t avail = r->slen - r->soff;
    if (avail) {
        size_t n = avail < max ? avail : max;
        memcpy(buf, r->sbuf + r->soff, n);
        r->soff += n;
        if (r->soff == r->slen) r->soff = r->slen = 0;
        pthread_mutex_unlock(&S->mu);
        return (ssize_t)n;
    }
    if (r->s_end) {
        pthread_mutex_unlock(&S->mu);
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    r->suspending = true; /* nothing to send until the next write */
    r->wake = false;
    pthread_mutex_unlock(&S->mu);
    req_suspend(S, r);
    return 0;
}

/* MHD thread: what to do with r now that its route ran or it was resumed. */
static enum MHD_Result dispatch(srv_t *S, fy_httpd_req_t *r)
{
    pthread_mutex_lock(&S->mu);
    if (r->gone) {
        pthread_mutex_unlock(&S->mu);
        return MHD_NO; /* closes the connection */
    }
    if (r->state == RS_HELD) {
        r->suspending = true;
        r->wake = false;
        pthread_mutex_unlock(&S->mu);
        req_suspend(S, r);
        return MHD_YES;
    }
    if (r->state == RS_NEW) {
        pthread_mutex_unlock(&S->mu);
        return queue_error(S, r->mc, 500, "server_error", "the handler gave no answer", NULL, NULL, false);
    }
    if (r->state != RS_WHOLE && r->state != RS_STREAM) {
        pthread_mutex_unlock(&S->mu);
        return MHD_YES;
    }
    /* status, type and headers are fixed once answered; the body is ours */
    bool stream = r->state == RS_STREAM;
    char *out = r->out;
    size_t out_len = r->out_len;
    r->out = NULL;
    r->streamed = stream;
    r->state = RS_QUEUED;
    pthread_mutex_unlock(&S->mu);
    struct MHD_Response *res =
        stream ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK, stream_read, r, NULL)
               : MHD_create_response_from_buffer(out_len, out ? out : (void *)"", MHD_RESPMEM_MUST_COPY);
    fy_free(out);
    if (!res) return MHD_NO;
    if (r->ctype[0]) MHD_add_response_header(res, "Content-Type", r->ctype);
    for (const char *h = r->hdrs; h && *h;) {
        const char *v = h + strlen(h) + 1;
        MHD_add_response_header(res, h, v);
        h = v + strlen(v) + 1;
    }
    if (r->close_after) MHD_add_response_header(res, "Connection", "close");
    cors_headers(S, r->mc, res);
    enum MHD_Result rc = MHD_queue_response(r->mc, (unsigned)r->status, res);
    MHD_destroy_response(res);
    return rc;
}

/* MHD thread: runs r's route (its handler, or a GET route's function). */
static enum MHD_Result run_route(srv_t *S, fy_httpd_req_t *r)
{
    route_t *rt = r->route;
    pthread_mutex_lock(&S->mu);
    bool dead = rt->dead || S->closing;
    if (!dead) rt->inflight++;
    pthread_mutex_unlock(&S->mu);
    if (dead) return queue_error(S, r->mc, 503, "unavailable", "shutting down", "Retry-After", "1", true);
    if (rt->get_fn) {
        fy_http_reply_t reply = {.status = 200};
        rt->get_fn(rt->arg, rt->path, &reply);
        if (reply.status < 100 || reply.status > 599) reply.status = 500;
        const char *hdr[] = {"Cache-Control", "no-store", NULL};
        fy_httpd_answer(r, reply.status, reply.content_type ? reply.content_type : "text/plain", hdr,
                        reply.body ? reply.body : "", reply.body ? reply.body_len : 0);
        if (reply.body_owned) fy_free(reply.body);
    } else {
        rt->fn(rt->arg, r);
    }
    pthread_mutex_lock(&S->mu);
    if (--rt->inflight == 0) pthread_cond_broadcast(&S->cv);
    pthread_mutex_unlock(&S->mu);
    return dispatch(S, r);
}

static enum MHD_Result add_header_size(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind;
    *(size_t *)cls += strlen(key) + (value ? strlen(value) : 0) + 4;
    return MHD_YES;
}

/* How a request frames its body: its Content-Length fields (all of them:
 * MHD keeps each) and whether it has Transfer-Encoding. */
typedef struct framing {
    int n_length;
    bool conflict, bad, chunked;
    char first[32];
} framing_t;

static enum MHD_Result add_framing(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind;
    framing_t *f = cls;
    if (!strcasecmp(key, "Transfer-Encoding")) f->chunked = true;
    if (strcasecmp(key, "Content-Length")) return MHD_YES;
    value = value ? value : "";
    /* digits only: "5, 6" or "+5" is no length (RFC 9112, 6.3) */
    size_t n = strlen(value);
    if (!n || n >= sizeof(f->first) || strspn(value, "0123456789") != n) f->bad = true;
    if (f->n_length++ == 0)
        snprintf(f->first, sizeof(f->first), "%s", value);
    else if (strcmp(f->first, value))
        f->conflict = true;
    return MHD_YES;
}

/* MHD thread: the answer to a request no route takes (no such path, a
 * route's path with another method, OPTIONS), once its body is dropped;
 * close_after: the body was too long to drop, the connection goes. */
static enum MHD_Result answer_refused(srv_t *S, struct MHD_Connection *mc, const char *url, const char *method,
                                      bool close_after)
{
    pthread_mutex_lock(&S->mu);
    route_t *rt = route_find(S, url);
    int kind = !rt ? 0 : rt->get ? 1 : 2;
    pthread_mutex_unlock(&S->mu);
    char msg[256];
    if (!kind) {
        snprintf(msg, sizeof(msg), "no such path: %.160s", url);
        return queue_error(S, mc, 404, "not_found_error", msg, NULL, NULL, close_after);
    }
    const char *allow = kind == 1 ? "GET, HEAD, OPTIONS" : "POST, OPTIONS";
    if (strcmp(method, "OPTIONS")) {
        snprintf(msg, sizeof(msg), "%.160s takes %s, not %.16s", url, kind == 1 ? "GET" : "POST", method);
        return queue_error(S, mc, 405, "invalid_request_error", msg, "Allow", allow, close_after);
    }
    /* OPTIONS: a CORS preflight (Origin and Access-Control-Request-Method)
     * from an origin not allowed is refused by name; else what is allowed */
    const char *origin = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Origin");
    const char *want = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Access-Control-Request-Method");
    bool listed;
    const char *ok = cors_origin(S, mc, &listed);
    if (origin && want && !ok) {
        snprintf(msg, sizeof(msg), "cross-origin requests from %.160s are not allowed here", origin);
        return queue_error(S, mc, 403, "permission_error", msg, NULL, NULL, close_after);
    }
    struct MHD_Response *res = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!res) return MHD_NO;
    MHD_add_response_header(res, "Allow", allow);
    if (ok && want) {
        const char *hdrs = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Access-Control-Request-Headers");
        MHD_add_response_header(res, "Access-Control-Allow-Methods", allow);
        MHD_add_response_header(res, "Access-Control-Allow-Headers",
                                hdrs && *hdrs && strlen(hdrs) < 512 ? hdrs : "Authorization, Content-Type");
        MHD_add_response_header(res, "Access-Control-Max-Age", "600");
    }
    if (close_after) MHD_add_response_header(res, "Connection", "close");
    cors_headers(S, mc, res);
    enum MHD_Result rc = MHD_queue_response(mc, 204, res);
    MHD_destroy_response(res);
    return rc;
}

/* The request's declared body length; 0 when it declares none. */
static unsigned long long declared_length(struct MHD_Connection *mc)
{
    const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Content-Length");
    return cl ? strtoull(cl, NULL, 10) : 0;
}

/* Body bytes of a request being refused: dropped; false (the connection
 * is closed) past DROP_MAX. */
static bool drop_body(struct MHD_Connection *mc, size_t n)
{
    conn_t *c = conn_of(mc);
    if (!c) return true;
    c->dropped += n;
    return c->dropped <= DROP_MAX;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    srv_t *S = cls;
    fy_httpd_req_t *r = *con_cls;
    if (r == REFUSED) { /* its body is dropped, then it is answered */
        if (*upload_size) {
            bool keep = drop_body(mc, *upload_size);
            *upload_size = 0;
            return keep ? MHD_YES : MHD_NO;
        }
        set_phase(S, conn_of(mc), PH_ANSWER);
        return answer_refused(S, mc, url, method, false);
    }
    if (!r) { /* the headers are in */
        conn_t *c = conn_of(mc);
        /* MHD refuses what does not fit its connection memory (431, 414);
         * the limit itself is exact here */
        size_t hbytes = strlen(method) + strlen(url) + strlen(version) + 4;
        MHD_get_connection_values(mc, MHD_HEADER_KIND, add_header_size, &hbytes);
        if (hbytes > (size_t)S->lim.max_header) {
            set_phase(S, c, PH_ANSWER);
            char msg[128];
            snprintf(msg, sizeof(msg), "the request line and headers are %zu bytes; at most %lld", hbytes,
                     (long long)S->lim.max_header);
            return queue_error(S, mc, 431, "invalid_request_error", msg, NULL, NULL, true);
        }
        /* a body framed two ways is refused, and the connection closed: a
         * proxy in front may have read it the other way, and what this
         * server would take for the next request is the rest of this one
         * (request smuggling; RFC 9112, 6.1 and 6.3) */
        framing_t fr = {0};
        MHD_get_connection_values(mc, MHD_HEADER_KIND, add_framing, &fr);
        if (fr.conflict || fr.bad || (fr.n_length && fr.chunked)) {
            set_phase(S, c, PH_ANSWER);
            const char *why = fr.conflict ? "Content-Length fields that disagree"
                              : fr.bad    ? "a Content-Length that is not a number"
                                          : "both Content-Length and Transfer-Encoding";
            char msg[128];
            snprintf(msg, sizeof(msg), "the request's body is framed ambiguously: %s", why);
            return queue_error(S, mc, 400, "invalid_request_error", msg, NULL, NULL, true);
        }
        bool is_get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
        unsigned long long declared = declared_length(mc);
        pthread_mutex_lock(&S->mu);
        route_t *rt = route_find(S, url);
        bool closing = S->closing, over = c && c->over_cap;
        bool fits = rt && (rt->get ? is_get : !strcmp(method, "POST"));
        if (fits && !closing && !(over && !rt->get)) {
            r = fy_calloc(1, sizeof(*r));
            if (r && !(r->path = fy_strndup(url, strlen(url)))) {
                fy_free(r);
                r = NULL;
            }
            if (r) {
                rt->refs++;
                r->route = rt;
                r->S = S;
                r->mc = mc;
                r->c = c;
                r->serial = ++S->next_serial;
                r->close_after = over;
                r->next = S->reqs;
                if (S->reqs) S->reqs->prev = r;
                S->reqs = r;
            }
        }
        if (over && !(rt && rt->get)) S->refused++;
        bool refused = !r && !closing && !(over && !(rt && rt->get)) && !fits;
        if (c && !r && !refused) c->phase = PH_ANSWER;
        if (c) c->dropped = 0;
        pthread_mutex_unlock(&S->mu);
        if (r) {
            *con_cls = r;
            if (!rt->get && declared > (unsigned long long)rt->max_body) {
                /* dropped, then answered, when it is not too long to read */
                if (declared <= DROP_MAX) {
                    r->too_big = true;
                    return MHD_YES;
                }
                set_phase(S, c, PH_ANSWER);
                char msg[96];
                snprintf(msg, sizeof(msg), "the body is larger than %zu bytes", rt->max_body);
                return queue_error(S, mc, 413, "invalid_request_error", msg, NULL, NULL, true);
            }
            return MHD_YES;
        }
        if (closing)
            return queue_error(S, mc, 503, "unavailable", "the server is shutting down", "Retry-After", "1", true);
        if (over && !(rt && rt->get)) {
            char msg[128];
            snprintf(msg, sizeof(msg), "too many connections (%d): try again shortly", S->cap);
            return queue_error(S, mc, 503, "server_overloaded", msg, "Retry-After", "1", true);
        }
        if (fits) /* out of memory */
            return queue_error(S, mc, 500, "server_error", "out of memory", NULL, NULL, true);
        /* 404, 405, OPTIONS: answered once the body is in and dropped, so the
         * next request on the connection starts where this one ends */
        if (declared > DROP_MAX) {
            set_phase(S, c, PH_ANSWER);
            return answer_refused(S, mc, url, method, true);
        }
        *con_cls = REFUSED;
        return MHD_YES;
    }
    if (*upload_size) { /* a piece of the body */
        size_t n = *upload_size;
        *upload_size = 0;
        if (r->too_big) return drop_body(mc, n) ? MHD_YES : MHD_NO;
        if (r->len + n > r->route->max_body) {
            r->too_big = true;
            fy_free(r->body);
            r->body = NULL;
            r->len = r->cap = 0;
            return drop_body(mc, n) ? MHD_YES : MHD_NO;
        }
        if (r->len + n + 1 > r->cap) {
            size_t cap = (r->len + n + 1) * 2;
            if (cap > r->route->max_body + 1) cap = r->route->max_body + 1;
            char *b = fy_realloc(r->body, cap);
            if (!b) return MHD_NO;
            r->body = b;
            r->cap = cap;
        }
        memcpy(r->body + r->len, upload, n);
        r->len += n;
        r->body[r->len] = 0;
        return MHD_YES;
    }
    if (!r->ran) { /* the whole request is in */
        r->ran = true;
        set_phase(S, r->c, PH_ANSWER);
        if (r->too_big) { /* read and dropped: the connection goes on */
            char msg[96];
            snprintf(msg, sizeof(msg), "the body is larger than %zu bytes", r->route->max_body);
            return queue_error(S, mc, 413, "invalid_request_error", msg, NULL, NULL, false);
        }
        return run_route(S, r);
    }
    return dispatch(S, r); /* resumed */
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    srv_t *S = cls;
    fy_httpd_req_t *r = *con_cls == REFUSED ? NULL : *con_cls;
    conn_t *c = conn_of(mc);
    if (!r) *con_cls = NULL;
    pthread_mutex_lock(&S->mu);
    if (c) { /* kept alive: the next request may take the idle timeout to start */
        c->phase = PH_WAIT;
        c->fresh = false;
        c->deadline = fy_now_s() + S->lim.idle_timeout_s;
    }
    if (!r) {
        pthread_mutex_unlock(&S->mu);
        return;
    }
    if (r->prev)
        r->prev->next = r->next;
    else
        S->reqs = r->next;
    if (r->next) r->next->prev = r->prev;
    req_unwatch(S, r);
    if (r->resume_queued) {
        fy_httpd_req_t **p = &S->rq;
        while (*p && *p != r) p = &(*p)->qnext;
        if (*p) *p = r->qnext;
        S->rq_tail = NULL;
        for (fy_httpd_req_t *q = S->rq; q; q = q->qnext) S->rq_tail = q;
    }
    bool complete = toe == MHD_REQUEST_TERMINATED_COMPLETED_OK && !r->gone && r->state == RS_QUEUED;
    r->state = RS_DONE;
    route_unref(S, r->route);
    pthread_cond_broadcast(&S->cv);
    fy_httpd_end_fn end = r->end;
    pthread_mutex_unlock(&S->mu);
    if (end) end(r->end_arg, complete);
    fy_free(r->path);
    fy_free(r->body);
    fy_free(r->hdrs);
    fy_free(r->out);
    fy_free(r->sbuf);
    fy_free(r);
    *con_cls = NULL;
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    char line[512];
    vsnprintf(line, sizeof(line), fmt, ap);
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '.')) line[--n] = 0;
    srv_t *S = cls;
    pthread_mutex_lock(&S->mu);
    if (S->starting) snprintf(S->start_log, sizeof(S->start_log), "%s", line); /* why a start failed */
    pthread_mutex_unlock(&S->mu);
    fy_debug("http: %s", line);
}

/* ---- the guard thread ------------------------------------------------------------------------------ */

static void *guard_main(void *arg)
{
    srv_t *S = arg;
    struct epoll_event evs[64];
    for (;;) {
        int n = epoll_wait(S->ep, evs, 64, 100);
        pthread_mutex_lock(&S->mu);
        for (int i = 0; i < n; i++) {
            if (evs[i].data.u64 == 0) { /* the eventfd: a wake-up */
                uint64_t v;
                if (read(S->evfd, &v, sizeof(v)) < 0 && errno != EAGAIN) fy_debug("http: eventfd: %s", strerror(errno));
                continue;
            }
            for (fy_httpd_req_t *r = S->reqs; r; r = r->next) { /* a waiting client hung up */
                if (r->serial != evs[i].data.u64 || !r->watched) continue;
                r->gone = true;
                req_unwatch(S, r);
                req_wake(S, r);
                break;
            }
        }
        /* resume what has news; each was suspended before it was queued */
        struct MHD_Connection *resume[64];
        int nr = 0;
        while (S->rq && nr < 64) {
            fy_httpd_req_t *r = S->rq;
            S->rq = r->qnext;
            if (!S->rq) S->rq_tail = NULL;
            r->resume_queued = false;
            if (!r->suspended) continue;
            r->suspended = false;
            req_unwatch(S, r);
            resume[nr++] = r->mc;
        }
        bool more = S->rq != NULL;
        /* requests not complete in time */
        double now = fy_now_s();
        for (conn_t *c = S->conns; c; c = c->next) {
            if (c->phase != PH_ANSWER && !c->killed && now > c->deadline) {
                conn_kill(S, c);
                S->timed_out++;
            }
        }
        bool stop = S->guard_stop;
        pthread_mutex_unlock(&S->mu);
        for (int i = 0; i < nr; i++) MHD_resume_connection(resume[i]);
        if (more) guard_signal(S);
        if (stop) return NULL;
    }
}

/* ---- servers ------------------------------------------------------------------------------------------ */

/* "http://HOST:PORT", "https://HOST:PORT" (*https_p) or "tcp://HOST:PORT"
 * (a trailing "/" allowed). */
static fy_status_t parse_url(const char *url, char *host, size_t host_cap, int *port_p, bool *https_p)
{
    *https_p = !strncmp(url, "https://", 8);
    const char *p = !strncmp(url, "http://", 7)  ? url + 7
                    : *https_p                   ? url + 8
                    : !strncmp(url, "tcp://", 6) ? url + 6
                                                 : NULL;
    if (!p) {
        fy_error("http: '%s': expected http://HOST:PORT, https://HOST:PORT or tcp://HOST:PORT", url);
        return FY_ERR_INVALID;
    }
    const char *colon, *hs = p, *he;
    if (*p == '[') {
        he = strchr(p, ']');
        if (!he || he[1] != ':') goto bad;
        hs = p + 1;
        colon = he + 1;
    } else {
        colon = strrchr(p, ':');
        if (!colon) goto bad;
        he = colon;
    }
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (end == colon + 1 || port < 0 || port > 65535) goto bad;
    if (*end && strcmp(end, "/")) {
        fy_error("http: '%s': a server address takes no path", url);
        return FY_ERR_INVALID;
    }
    if ((size_t)(he - hs) >= host_cap) goto bad;
    memcpy(host, hs, (size_t)(he - hs));
    host[he - hs] = 0;
    *port_p = (int)port;
    return FY_OK;
bad:
    fy_error("http: '%s': expected http://HOST:PORT, https://HOST:PORT or tcp://HOST:PORT", url);
    return FY_ERR_INVALID;
}

/* A listening socket on host:port, or -1 (logged with the reason). */
static int listen_on(const char *url, const char *host, int port, bool *v6_p)
{
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    char ps[16];
    snprintf(ps, sizeof(ps), "%d", port);
    int rv = getaddrinfo(*host && strcmp(host, "*") ? host : NULL, ps, &hints, &ai);
    if (rv) {
        fy_error("http %s: cannot resolve '%s': %s", url, host, gai_strerror(rv));
        return -1;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
        bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, 511)) {
        fy_error("http %s: cannot listen: %s", url, strerror(errno));
        if (fd >= 0) close(fd);
        freeaddrinfo(ai);
        return -1;
    }
    *v6_p = ai->ai_family == AF_INET6;
    freeaddrinfo(ai);
    return fd;
}

/* How many connections this process can afford: the configured cap, and
 * at most half the descriptors left after a reserve, so the nng ports and
 * files always have some. */
static int32_t afford(int32_t want)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur == RLIM_INFINITY) return want;
    long room = ((long)rl.rlim_cur - 64) / 2;
    if (room < 8) room = 8;
    return want < room ? want : (int32_t)room;
}

static void srv_free(srv_t *S)
{
    if (S->ep >= 0) close(S->ep);
    if (S->evfd >= 0) close(S->evfd);
    while (S->routes) {
        route_t *rt = S->routes;
        S->routes = rt->next;
        fy_free(rt);
    }
    if (S->tls_key) memset(S->tls_key, 0, S->tls_key_len);
    fy_free(S->tls_key);
    fy_free(S->tls_cert);
    pthread_mutex_destroy(&S->mu);
    pthread_cond_destroy(&S->cv);
    fy_free(S);
}

static fy_status_t srv_start(const char *url, const char *host, int port, const fy_httpd_limits_t *lim, srv_t **S_p)
{
    srv_t *S = fy_calloc(1, sizeof(*S));
    if (!S) {
        fy_error("http %s: out of memory", url);
        return FY_ERR_NOMEM;
    }
    snprintf(S->host, sizeof(S->host), "%s", host);
    S->lim = *lim;
    S->cap = afford(lim->max_connections);
    S->ep = S->evfd = -1;
    pthread_mutex_init(&S->mu, NULL);
    pthread_cond_init(&S->cv, NULL);
    if (S->cap < lim->max_connections)
        fy_warn("http %s: serving %d connections at most, not %d: the descriptor limit is low", url, S->cap,
                lim->max_connections);
    S->ep = epoll_create1(EPOLL_CLOEXEC);
    S->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 0};
    if (S->ep < 0 || S->evfd < 0 || epoll_ctl(S->ep, EPOLL_CTL_ADD, S->evfd, &ev)) {
        fy_error("http %s: cannot set up its guard: %s", url, strerror(errno));
        srv_free(S);
        return FY_ERR_IO;
    }
    const char *sec = lim->section ? lim->section : "worker";
    char what_c[48], what_k[48];
    snprintf(what_c, sizeof(what_c), "%s.tls_cert", sec);
    snprintf(what_k, sizeof(what_k), "%s.tls_key", sec);
    fy_status_t st;
    if (lim->tls_cert[0] && ((st = tls_file_read(lim->tls_cert, what_c, false, "CERTIFICATE-----", &S->tls_cert)) ||
                             (st = tls_file_read(lim->tls_key, what_k, true, "PRIVATE KEY-----", &S->tls_key)))) {
        srv_free(S);
        return st;
    }
    if (S->tls_key) S->tls_key_len = strlen(S->tls_key);
    bool v6 = false;
    int lfd = listen_on(url, host, port, &v6);
    if (lfd < 0) {
        srv_free(S);
        return FY_ERR_IO;
    }
    struct sockaddr_storage sa;
    socklen_t sl = sizeof(sa);
    S->port = port;
    if (!getsockname(lfd, (struct sockaddr *)&sa, &sl))
        S->port = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                                 : ((struct sockaddr_in *)&sa)->sin_port);
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (v6) flags |= MHD_USE_IPv6;
    if (S->tls_cert) flags |= MHD_USE_TLS;
    /* GnuTLS's defaults without the versions below the floor; TLS 1.3 is
     * preferred whenever the client has it */
    const char *prio =
        lim->tls_min >= 13 ? "NORMAL:-VERS-ALL:+VERS-TLS1.3" : "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2";
    unsigned headroom = (unsigned)(S->cap / 8 > 4 ? S->cap / 8 : 4);
    /* MHD's memory per connection holds the request's line and headers and
     * the answer's buffers: the limit on headers is checked exactly in
     * on_request, this is the backstop */
    size_t pool = (size_t)lim->max_header + 16384;
    if (pool < 32768) pool = 32768;
    unsigned threads = lim->threads > 1 ? (unsigned)lim->threads : 1;
    unsigned timeout = (unsigned)(lim->idle_timeout_s + 0.999);
    struct MHD_OptionItem opts[] = {
        {MHD_OPTION_LISTEN_SOCKET, lfd, NULL},
        {MHD_OPTION_NOTIFY_CONNECTION, (intptr_t)on_connection, S},
        {MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)on_completed, S},
        {MHD_OPTION_URI_LOG_CALLBACK, (intptr_t)on_uri, S},
        {MHD_OPTION_EXTERNAL_LOGGER, (intptr_t)on_mhd_log, S},
        {MHD_OPTION_CONNECTION_MEMORY_LIMIT, (intptr_t)pool, NULL},
        {MHD_OPTION_CONNECTION_LIMIT, (intptr_t)((unsigned)S->cap + headroom), NULL},
        {MHD_OPTION_CONNECTION_TIMEOUT, (intptr_t)timeout, NULL},
        {MHD_OPTION_END, 0, NULL}, /* the optional ones below, then the end */
        {MHD_OPTION_END, 0, NULL},
        {MHD_OPTION_END, 0, NULL},
        {MHD_OPTION_END, 0, NULL},
        {MHD_OPTION_END, 0, NULL},
    };
    size_t no = FY_ARRAY_LEN(opts) - 5;
    if (threads > 1) opts[no++] = (struct MHD_OptionItem){MHD_OPTION_THREAD_POOL_SIZE, (intptr_t)threads, NULL};
    if (S->tls_cert) {
        opts[no++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_CERT, 0, S->tls_cert};
        opts[no++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_KEY, 0, S->tls_key};
        opts[no++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_PRIORITIES, 0, (void *)prio};
    }
    pthread_mutex_lock(&S->mu);
    S->starting = true;
    pthread_mutex_unlock(&S->mu);
    S->d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, S, MHD_OPTION_ARRAY, opts, MHD_OPTION_END);
    pthread_mutex_lock(&S->mu);
    S->starting = false;
    pthread_mutex_unlock(&S->mu);
    if (!S->d && S->tls_cert) {
        /* the files were PEM of the right kinds: GnuTLS refused their
         * contents, or the key is not the certificate's */
        fy_error("http %s: %s %s and %s %s refused by the TLS library: %s (is the key the certificate's, "
                 "both unencrypted PEM?)",
                 url, what_c, lim->tls_cert, what_k, lim->tls_key, S->start_log[0] ? S->start_log : "no reason given");
        close(lfd);
        srv_free(S);
        return FY_ERR_INVALID;
    }
    if (!S->d) {
        fy_error("http %s: cannot start the server (libmicrohttpd refused its options)", url);
        close(lfd);
        srv_free(S);
        return FY_ERR_INTERNAL;
    }
    if (pthread_create(&S->guard, NULL, guard_main, S)) {
        fy_error("http %s: cannot start its guard thread", url);
        MHD_stop_daemon(S->d);
        srv_free(S);
        return FY_ERR_INTERNAL;
    }
    S->guard_on = true;
    *S_p = S;
    return FY_OK;
}

/* Ends every held request of owner (all when NULL) and waits for their
 * end callbacks, up to a bound: an answer being written has a second to
 * finish, then its connection is shut.  False when some are still there. */
static bool end_held(srv_t *S, fy_httpd_t *owner)
{
    double t0 = fy_now_s();
    pthread_mutex_lock(&S->mu);
    for (;;) {
        bool any = false, sig = false, late = fy_now_s() - t0 > 1.0;
        for (fy_httpd_req_t *r = S->reqs; r; r = r->next) {
            if (owner && r->route->owner != owner) continue;
            any = true;
            bool writing = r->state == RS_QUEUED && (!r->streamed || r->s_end);
            if (!r->gone && !writing) r->gone = true;
            if (r->gone) sig |= req_wake(S, r);
            if (late && writing && r->c) conn_kill(S, r->c);
        }
        if (!any) break;
        if (fy_now_s() - t0 > STOP_WAIT_S) {
            pthread_mutex_unlock(&S->mu);
            return false;
        }
        pthread_mutex_unlock(&S->mu);
        if (sig) guard_signal(S);
        usleep(5000);
        pthread_mutex_lock(&S->mu);
    }
    pthread_mutex_unlock(&S->mu);
    return true;
}

static void srv_stop(srv_t *S, const char *url)
{
    pthread_mutex_lock(&S->mu);
    S->closing = true;
    pthread_mutex_unlock(&S->mu);
    /* answers being written get their chance; then every held request ends */
    bool clean = end_held(S, NULL);
    pthread_mutex_lock(&S->mu);
    S->guard_stop = true;
    pthread_mutex_unlock(&S->mu);
    guard_signal(S);
    pthread_join(S->guard, NULL);
    if (!clean) { /* a suspended connection makes MHD_stop_daemon undefined: keep it */
        fy_warn("http %s: requests still open at shutdown; the server is left running", url);
        return;
    }
    MHD_stop_daemon(S->d);
    srv_free(S);
}

fy_status_t fy_httpd_create_with(const char *url, const fy_httpd_limits_t *limits, fy_httpd_t **h_p)
{
    char host[128];
    int port;
    bool https;
    fy_status_t st = parse_url(url ? url : "(null)", host, sizeof(host), &port, &https);
    if (st) return st;
    const char *sec = limits && limits->section ? limits->section : "worker";
    if (https && !(limits && limits->tls_cert[0])) {
        fy_error("http: '%s' is https:// but %s.tls_cert is empty: nothing to serve HTTPS with", url, sec);
        return FY_ERR_INVALID;
    }
    fy_httpd_t *h = fy_calloc(1, sizeof(*h));
    if (!h) {
        fy_error("http: out of memory");
        return FY_ERR_NOMEM;
    }
    snprintf(h->url, sizeof(h->url), "%s", url);
    pthread_mutex_lock(&g_mu);
    srv_t *S = NULL;
    if (port)
        for (S = g_servers; S && !(S->port == port && !strcmp(S->host, host)); S = S->next) {}
    if (S && !S->tls_cert && limits && limits->tls_cert[0]) { /* joining a TLS server is fine: more private */
        pthread_mutex_unlock(&g_mu);
        fy_free(h);
        fy_error("http %s: already served without TLS by another holder of this process", url);
        return FY_ERR_INVALID;
    }
    if (!S) {
        fy_httpd_limits_t def;
        fy_httpd_limits_default(&def);
        st = srv_start(url, host, port, limits ? limits : &def, &S);
        if (st) {
            pthread_mutex_unlock(&g_mu);
            fy_free(h);
            return st;
        }
        S->next = g_servers;
        g_servers = S;
    }
    S->refs++;
    pthread_mutex_unlock(&g_mu);
    h->S = S;
    *h_p = h;
    return FY_OK;
}

fy_status_t fy_httpd_create(const char *url, fy_httpd_t **h_p) { return fy_httpd_create_with(url, NULL, h_p); }

int fy_httpd_port(const fy_httpd_t *h) { return h ? h->S->port : -1; }

bool fy_httpd_tls(const fy_httpd_t *h) { return h && h->S->tls_cert; }

void fy_httpd_stats(const fy_httpd_t *h, fy_httpd_stats_t *s)
{
    srv_t *S = h->S;
    pthread_mutex_lock(&S->mu);
    s->open = S->n_conns;
    s->timed_out = S->timed_out;
    s->evicted = S->evicted;
    s->refused = S->refused;
    pthread_mutex_unlock(&S->mu);
}

/* One allowed origin: http(s)://HOST[:PORT], no path, nothing odd. */
static bool origin_ok(const char *o, size_t n)
{
    size_t k = !strncmp(o, "http://", 7) ? 7 : !strncmp(o, "https://", 8) ? 8 : 0;
    if (!k || k >= n) return false;
    for (size_t i = k; i < n; i++)
        if (o[i] == '/' || o[i] <= ' ' || o[i] >= 0x7f || o[i] == ',') return false;
    return true;
}

fy_status_t fy_httpd_cors(fy_httpd_t *h, const char *origins)
{
    char list[sizeof(((srv_t *)0)->cors)] = {0};
    size_t k = 0;
    const char *p = origins ? origins : "";
    while (*p == ' ') p++;
    if (!strcmp(p, "*")) {
        list[0] = '*';
    } else {
        while (*p) {
            const char *e = strchr(p, ',') ? strchr(p, ',') : p + strlen(p);
            const char *a = p, *b = e;
            while (a < b && *a == ' ') a++;
            while (b > a && b[-1] == ' ') b--;
            size_t n = (size_t)(b - a);
            if (n && b[-1] == '/') n--; /* "https://a.example/": the origin is without it */
            if (!origin_ok(a, n)) {
                fy_error("http %s: '%.*s' is not an origin (http://HOST[:PORT] or https://...; \"*\" alone for any)",
                         h->url, (int)(b - a), a);
                return FY_ERR_INVALID;
            }
            if (k + n + 2 > sizeof(list)) {
                fy_error("http %s: the list of allowed origins is over %zu bytes", h->url, sizeof(list) - 2);
                return FY_ERR_INVALID;
            }
            memcpy(list + k, a, n);
            k += n + 1;
            p = *e ? e + 1 : e;
        }
    }
    srv_t *S = h->S;
    pthread_mutex_lock(&S->mu);
    memcpy(S->cors, list, sizeof(list));
    pthread_mutex_unlock(&S->mu);
    return FY_OK;
}

static fy_status_t add_route(fy_httpd_t *h, route_t *rt)
{
    srv_t *S = h->S;
    if (!rt->path[0] || rt->path[0] != '/') {
        fy_error("http %s: a route needs a path starting with /", h->url);
        fy_free(rt);
        return FY_ERR_INVALID;
    }
    rt->owner = h;
    rt->refs = 1;
    pthread_mutex_lock(&S->mu);
    bool taken = false;
    for (route_t *o = S->routes; o; o = o->next)
        taken |= !o->dead && o->prefix == rt->prefix && !strcmp(o->path, rt->path);
    if (taken) {
        pthread_mutex_unlock(&S->mu);
        fy_error("http %s: the path %s already has a route", h->url, rt->path);
        fy_free(rt);
        return FY_ERR_INVALID;
    }
    rt->next = S->routes;
    S->routes = rt;
    pthread_mutex_unlock(&S->mu);
    return FY_OK;
}

fy_status_t fy_httpd_route(fy_httpd_t *h, const char *path, fy_httpd_get_fn fn, void *arg)
{
    if (!path || strlen(path) >= sizeof(((route_t *)0)->path) || !fn) {
        fy_error("http %s: a route needs a path starting with / and a function", h->url);
        return FY_ERR_INVALID;
    }
    route_t *rt = fy_calloc(1, sizeof(*rt));
    if (!rt) {
        fy_error("http %s: out of memory for route %s", h->url, path);
        return FY_ERR_NOMEM;
    }
    snprintf(rt->path, sizeof(rt->path), "%s", path);
    rt->get = true;
    rt->get_fn = fn;
    rt->arg = arg;
    return add_route(h, rt);
}

fy_status_t fy_httpd_handle(fy_httpd_t *h, const char *method, const char *path, size_t max_body, fy_httpd_fn fn,
                            void *arg)
{
    if (!path || strlen(path) >= sizeof(((route_t *)0)->path) || !fn || !method ||
        (strcmp(method, "GET") && strcmp(method, "POST"))) {
        fy_error("http %s: a handler needs GET or POST, a path starting with / and a function", h->url);
        return FY_ERR_INVALID;
    }
    route_t *rt = fy_calloc(1, sizeof(*rt));
    if (!rt) {
        fy_error("http %s: out of memory for route %s", h->url, path);
        return FY_ERR_NOMEM;
    }
    snprintf(rt->path, sizeof(rt->path), "%s", path);
    size_t pl = strlen(rt->path);
    if (pl > 1 && rt->path[pl - 1] == '*') { /* a prefix route */
        rt->path[pl - 1] = 0;
        rt->prefix = true;
    }
    rt->get = !strcmp(method, "GET");
    rt->max_body = max_body;
    rt->fn = fn;
    rt->arg = arg;
    return add_route(h, rt);
}

void fy_httpd_destroy(fy_httpd_t *h)
{
    if (!h) return;
    srv_t *S = h->S;
    /* this holder's routes go, once the calls in them return */
    pthread_mutex_lock(&S->mu);
    for (route_t *rt = S->routes; rt; rt = rt->next)
        if (rt->owner == h) rt->dead = true;
    for (;;) {
        bool busy = false;
        for (route_t *rt = S->routes; rt; rt = rt->next) busy |= rt->owner == h && rt->inflight > 0;
        if (!busy) break;
        pthread_cond_wait(&S->cv, &S->mu);
    }
    pthread_mutex_unlock(&S->mu);
    if (!end_held(S, h)) fy_warn("http %s: requests still open after their routes went", h->url);
    pthread_mutex_lock(&S->mu);
    for (route_t *rt = S->routes, *next; rt; rt = next) {
        next = rt->next;
        if (rt->owner == h) route_unref(S, rt);
    }
    pthread_mutex_unlock(&S->mu);
    pthread_mutex_lock(&g_mu);
    bool last = --S->refs == 0;
    if (last) {
        srv_t **p = &g_servers;
        while (*p != S) p = &(*p)->next;
        *p = S->next;
    }
    pthread_mutex_unlock(&g_mu);
    if (last) srv_stop(S, h->url);
    fy_free(h);
}

/* ---- requests ---------------------------------------------------------------------------------------- */

const char *fy_httpd_req_header(fy_httpd_req_t *r, const char *name)
{
    return MHD_lookup_connection_value(r->mc, MHD_HEADER_KIND, name);
}

const char *fy_httpd_req_path(fy_httpd_req_t *r) { return r->path ? r->path : ""; }

const char *fy_httpd_req_body(fy_httpd_req_t *r, size_t *len_p)
{
    *len_p = r->len;
    return r->body ? r->body : "";
}

/* "name\0value\0...\0", or NULL (no headers, or out of memory). */
static char *pack_headers(const char *const *h)
{
    size_t n = 1;
    for (int i = 0; h && h[i] && h[i + 1]; i += 2) n += strlen(h[i]) + strlen(h[i + 1]) + 2;
    if (n == 1) return NULL;
    char *p = fy_malloc(n), *o = p;
    if (!p) return NULL;
    for (int i = 0; h[i] && h[i + 1]; i += 2) {
        size_t a = strlen(h[i]) + 1, b = strlen(h[i + 1]) + 1;
        memcpy(o, h[i], a);
        memcpy(o + a, h[i + 1], b);
        o += a + b;
    }
    *o = 0;
    return p;
}

void fy_httpd_answer(fy_httpd_req_t *r, int status, const char *content_type, const char *const *headers,
                     const void *body, size_t len)
{
    srv_t *S = r->S;
    char *out = fy_malloc(len ? len : 1);
    char *hdrs = pack_headers(headers);
    if (out && len) memcpy(out, body, len);
    pthread_mutex_lock(&S->mu);
    bool sig = false;
    if ((r->state == RS_NEW || r->state == RS_HELD) && !r->gone && out) {
        r->state = RS_WHOLE;
        r->status = status;
        snprintf(r->ctype, sizeof(r->ctype), "%s", content_type ? content_type : "");
        r->hdrs = hdrs;
        r->out = out;
        r->out_len = len;
        hdrs = out = NULL;
        sig = req_wake(S, r);
    } else if (!out && (r->state == RS_NEW || r->state == RS_HELD) && !r->gone) { /* no memory: dropped */
        r->gone = true;
        sig = req_wake(S, r);
    }
    pthread_mutex_unlock(&S->mu);
    if (sig) guard_signal(S);
    fy_free(out);
    fy_free(hdrs);
}

void fy_httpd_hold(fy_httpd_req_t *r, fy_httpd_end_fn end, void *arg)
{
    srv_t *S = r->S;
    pthread_mutex_lock(&S->mu);
    r->end = end;
    r->end_arg = arg;
    if (r->state == RS_NEW) r->state = RS_HELD;
    pthread_mutex_unlock(&S->mu);
}

fy_status_t fy_httpd_stream_begin(fy_httpd_req_t *r, int status, const char *content_type, const char *const *headers)
{
    srv_t *S = r->S;
    char *hdrs = pack_headers(headers);
    fy_status_t st = FY_ERR_CANCELLED;
    pthread_mutex_lock(&S->mu);
    bool sig = false;
    if ((r->state == RS_NEW || r->state == RS_HELD) && !r->gone) {
        r->state = RS_STREAM;
        r->status = status;
        snprintf(r->ctype, sizeof(r->ctype), "%s", content_type ? content_type : "");
        r->hdrs = hdrs;
        hdrs = NULL;
        sig = req_wake(S, r);
        st = FY_OK;
    }
    pthread_mutex_unlock(&S->mu);
    if (sig) guard_signal(S);
    fy_free(hdrs);
    return st;
}

fy_status_t fy_httpd_stream_write(fy_httpd_req_t *r, const void *data, size_t len)
{
    srv_t *S = r->S;
    fy_status_t st = FY_OK;
    pthread_mutex_lock(&S->mu);
    bool streaming = r->state == RS_STREAM || (r->state == RS_QUEUED && r->streamed);
    if (r->gone || !streaming || r->s_end) {
        st = FY_ERR_CANCELLED;
    } else if (r->slen - r->soff + len > MAX_PENDING) { /* the client does not read: as good as gone */
        r->gone = true;
        st = FY_ERR_CANCELLED;
    } else if (len) {
        if (r->soff && r->slen + len > r->scap) { /* what was taken goes first */
            memmove(r->sbuf, r->sbuf + r->soff, r->slen - r->soff);
            r->slen -= r->soff;
            r->soff = 0;
        }
        if (r->slen + len > r->scap) {
            size_t cap = (r->slen + len) * 2;
            char *b = fy_realloc(r->sbuf, cap);
            if (!b) {
                st = FY_ERR_NOMEM;
            } else {
                r->sbuf = b;
                r->scap = cap;
            }
        }
        if (!st) {
            memcpy(r->sbuf + r->slen, data, len);
            r->slen += len;
        }
    }
    bool sig = (st == FY_OK || r->gone) && req_wake(S, r);
    pthread_mutex_unlock(&S->mu);
    if (sig) guard_signal(S);
    return st;
}

void fy_httpd_stream_end(fy_httpd_req_t *r)
{
    srv_t *S = r->S;
    pthread_mutex_lock(&S->mu);
    bool sig = false;
    if (!r->s_end) {
        r->s_end = true;
        sig = req_wake(S, r);
    }
    pthread_mutex_unlock(&S->mu);
    if (sig) guard_signal(S);
}

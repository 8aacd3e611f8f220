/*
 * test_httpd.c - the HTTP server (rpc/httpd.h) on its own, on
 * loopback: whole answers given later from another thread, streams written
 * from another thread (and thousands of answers racing the server's
 * suspension of their connection: none may be lost), a client that hangs up
 * while its answer waits (noticed at once), the server stopped with answers
 * still held; and the guards: a client trickling its headers is closed at
 * the header timeout, an idle kept-alive connection at the idle timeout,
 * headers over the limit get 431, bodies over a route's limit 413, and
 * beyond the connection cap idle connections make room (the newcomer is
 * served) while a newcomer among busy ones gets a 503 with a JSON body.
 */
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/config.h"
#include "common/clock.h"
#include "tests/cluster_util.h"
#include "rpc/httpd.h"
#include "common/mem.h"
#include "tests/testutil.h"

/* ---- a server whose handlers the tests steer ---- */

typedef struct held {
    fy_httpd_req_t *r;
    int kind; /* 0: answer later, 1: stream later, 2: never answer */
} held_t;

typedef struct ctx {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    held_t q[256]; /* requests handed to the answering thread */
    int nq;
    atomic_int held, ended, ended_complete, ended_gone;
    bool stop;
    pthread_t th;
} ctx_t;

static ctx_t X;

static void on_end(void *arg, bool complete)
{
    (void)arg;
    atomic_fetch_add(&X.ended, 1);
    atomic_fetch_add(complete ? &X.ended_complete : &X.ended_gone, 1);
}

/* POST /later: held, answered by the other thread; /stream: held, streamed
 * by it; /never: held forever; /now: answered in the handler. */
static void on_post(void *arg, fy_httpd_req_t *r)
{
    const char *kind = arg;
    if (!strcmp(kind, "now")) {
        size_t len;
        const char *b = fy_httpd_req_body(r, &len);
        fy_httpd_answer(r, 200, "text/plain", NULL, b, len);
        return;
    }
    fy_httpd_hold(r, on_end, NULL);
    atomic_fetch_add(&X.held, 1);
    pthread_mutex_lock(&X.mu);
    assert_true(X.nq < 256);
    X.q[X.nq++] = (held_t){r, !strcmp(kind, "later") ? 0 : !strcmp(kind, "stream") ? 1 : 2};
    pthread_cond_signal(&X.cv);
    pthread_mutex_unlock(&X.mu);
}

static void *answerer(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&X.mu);
    while (!X.stop) {
        if (!X.nq) {
            pthread_cond_wait(&X.cv, &X.mu);
            continue;
        }
        held_t h = X.q[0];
        memmove(X.q, X.q + 1, (size_t)--X.nq * sizeof(X.q[0]));
        if (h.kind == 2) continue; /* never: the server ends it */
        pthread_mutex_unlock(&X.mu);
        if (h.kind == 0) {
            fy_httpd_answer(h.r, 201, "text/plain", (const char *const[]){"X-Later", "yes", NULL}, "later", 5);
        } else {
            assert_int_equal(fy_httpd_stream_begin(h.r, 200, "text/event-stream", NULL), FY_OK);
            for (int i = 0; i < 200; i++) {
                char b[32];
                int n = snprintf(b, sizeof(b), "data: %d\n\n", i);
                assert_int_equal(fy_httpd_stream_write(h.r, b, (size_t)n), FY_OK);
                if (i % 50 == 0) usleep(1000); /* some writes find the connection suspended */
            }
            fy_httpd_stream_end(h.r);
        }
        pthread_mutex_lock(&X.mu);
    }
    pthread_mutex_unlock(&X.mu);
    return NULL;
}

static void get_hello(void *arg, const char *path, fy_http_reply_t *reply)
{
    (void)path;
    reply->body = arg;
    reply->body_len = strlen(arg);
}

static fy_httpd_t *start(const fy_httpd_limits_t *lim, int *port_p)
{
    memset(&X, 0, sizeof(X));
    pthread_mutex_init(&X.mu, NULL);
    pthread_cond_init(&X.cv, NULL);
    assert_int_equal(pthread_create(&X.th, NULL, answerer, NULL), 0);
    fy_httpd_t *h;
    assert_int_equal(fy_httpd_create_with("http://127.0.0.1:0", lim, &h), FY_OK);
    assert_int_equal(fy_httpd_handle(h, "POST", "/now", 4096, on_post, "now"), FY_OK);
    assert_int_equal(fy_httpd_handle(h, "POST", "/later", 4096, on_post, "later"), FY_OK);
    assert_int_equal(fy_httpd_handle(h, "POST", "/stream", 4096, on_post, "stream"), FY_OK);
    assert_int_equal(fy_httpd_handle(h, "POST", "/never", 4096, on_post, "never"), FY_OK);
    assert_int_equal(fy_httpd_route(h, "/health", get_hello, "healthy"), FY_OK);
    *port_p = fy_httpd_port(h);
    assert_true(*port_p > 0);
    return h;
}

static void stop(fy_httpd_t *h)
{
    fy_httpd_destroy(h);
    pthread_mutex_lock(&X.mu);
    X.stop = true;
    pthread_cond_signal(&X.cv);
    pthread_mutex_unlock(&X.mu);
    pthread_join(X.th, NULL);
}

static int post(int port, const char *path, const char *body, tc_http_resp_t *r)
{
    int fd = tc_http_dial(port, 10);
    assert_true(fd >= 0);
    tc_http_send(fd, "POST", path, NULL, "text/plain", body, strlen(body));
    int st = tc_http_read(fd, r);
    close(fd);
    return st;
}

/* Seconds until the server closes fd (reading and dropping what comes), or -1 after limit_s. */
static double until_closed(int fd, double limit_s, size_t *got_p)
{
    double t0 = fy_now_s();
    size_t got = 0;
    while (fy_now_s() - t0 < limit_s) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 50) <= 0) continue;
        char b[4096];
        ssize_t k = recv(fd, b, sizeof(b), 0);
        if (k <= 0) {
            if (got_p) *got_p = got;
            return fy_now_s() - t0;
        }
        got += (size_t)k;
    }
    return -1;
}

/* ---- answers from other threads ---- */

static void test_held_and_streamed(void **state)
{
    (void)state;
    fy_httpd_limits_t lim;
    fy_httpd_limits_default(&lim);
    int port;
    fy_httpd_t *h = start(&lim, &port);
    tc_http_resp_t r;
    assert_int_equal(post(port, "/now", "echo me", &r), 200);
    assert_string_equal(r.body, "echo me");
    tc_http_free(&r);
    assert_int_equal(post(port, "/later", "", &r), 201);
    assert_string_equal(r.body, "later");
    assert_non_null(strstr(r.head, "X-Later: yes"));
    tc_http_free(&r);
    assert_int_equal(post(port, "/stream", "", &r), 200);
    assert_non_null(strstr(r.head, "chunked"));
    for (int i = 0; i < 200; i++) {
        char want[32];
        snprintf(want, sizeof(want), "data: %d\n\n", i);
        if (!strstr(r.body, want)) fail_msg("event %d missing from the stream", i);
    }
    tc_http_free(&r);
    /* many at once, on parallel connections: every answer arrives */
    enum { N = 64 };
    int fds[N];
    for (int i = 0; i < N; i++) {
        fds[i] = tc_http_dial(port, 10);
        tc_http_send(fds[i], "POST", i % 2 ? "/later" : "/stream", NULL, "text/plain", "", 0);
    }
    for (int i = 0; i < N; i++) {
        int st = tc_http_read(fds[i], &r);
        close(fds[i]);
        assert_int_equal(st, i % 2 ? 201 : 200);
        assert_non_null(strstr(r.body, i % 2 ? "later" : "data: 199"));
        tc_http_free(&r);
    }
    /* and kept-alive: two answers on one connection */
    int fd = tc_http_dial(port, 10);
    const char *two = "POST /later HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n";
    send(fd, two, strlen(two), MSG_NOSIGNAL);
    assert_int_equal(tc_http_read(fd, &r), 201);
    tc_http_free(&r);
    send(fd, two, strlen(two), MSG_NOSIGNAL);
    assert_int_equal(tc_http_read(fd, &r), 201);
    tc_http_free(&r);
    /* answers racing the suspension of their connection: none is lost */
    const char *st = "POST /stream HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n";
    for (int i = 0; i < 400; i++) {
        const char *q = i % 2 ? two : st;
        send(fd, q, strlen(q), MSG_NOSIGNAL);
        int got = tc_http_read(fd, &r);
        if (got != (i % 2 ? 201 : 200)) fail_msg("answer %d on one connection: %d", i, got);
        tc_http_free(&r);
    }
    close(fd);
    double t0 = fy_now_s();
    while (atomic_load(&X.ended) < 1 + 1 + N + 2 + 400 && fy_now_s() - t0 < 5) usleep(1000);
    assert_int_equal(atomic_load(&X.ended_complete), 1 + 1 + N + 2 + 400);
    stop(h);
}

/* A client that hangs up while its answer waits is noticed at once; the
 * server stopping ends what is still held. */
static void test_gone_and_stopped(void **state)
{
    (void)state;
    fy_httpd_limits_t lim;
    fy_httpd_limits_default(&lim);
    int port;
    fy_httpd_t *h = start(&lim, &port);
    int fd = tc_http_dial(port, 10);
    tc_http_send(fd, "POST", "/never", NULL, "text/plain", "", 0);
    double t0 = fy_now_s();
    while (atomic_load(&X.held) < 1 && fy_now_s() - t0 < 5) usleep(1000);
    close(fd);
    t0 = fy_now_s();
    while (atomic_load(&X.ended_gone) < 1 && fy_now_s() - t0 < 5) usleep(1000);
    assert_int_equal(atomic_load(&X.ended_gone), 1);
    print_message("a client that hung up: noticed in %.0f ms\n", (fy_now_s() - t0) * 1e3);
    /* a half-close counts as gone too */
    fd = tc_http_dial(port, 10);
    tc_http_send(fd, "POST", "/never", NULL, "text/plain", "", 0);
    t0 = fy_now_s();
    while (atomic_load(&X.held) < 2 && fy_now_s() - t0 < 5) usleep(1000);
    shutdown(fd, SHUT_WR);
    t0 = fy_now_s();
    while (atomic_load(&X.ended_gone) < 2 && fy_now_s() - t0 < 5) usleep(1000);
    assert_int_equal(atomic_load(&X.ended_gone), 2);
    close(fd);
    /* three held forever: stopping the server ends them */
    int fds[3];
    for (int i = 0; i < 3; i++) {
        fds[i] = tc_http_dial(port, 10);
        tc_http_send(fds[i], "POST", "/never", NULL, "text/plain", "", 0);
    }
    t0 = fy_now_s();
    while (atomic_load(&X.held) < 5 && fy_now_s() - t0 < 5) usleep(1000);
    t0 = fy_now_s();
    stop(h);
    assert_true(fy_now_s() - t0 < 4);
    assert_int_equal(atomic_load(&X.ended_gone), 5);
    for (int i = 0; i < 3; i++) {
        assert_true(until_closed(fds[i], 5, NULL) >= 0);
        close(fds[i]);
    }
    assert_int_equal(tc_http(port, "GET", "/health", NULL), -1); /* nobody listens */
}

/* ---- guards ---- */

static void test_header_timeout_and_idle(void **state)
{
    (void)state;
    fy_httpd_limits_t lim;
    fy_httpd_limits_default(&lim);
    lim.header_timeout_s = 1.0;
    lim.idle_timeout_s = 2.0;
    int port;
    fy_httpd_t *h = start(&lim, &port);
    /* a slowloris: a header byte every 200 ms never completes its request */
    int fd = tc_http_dial(port, 10);
    const char *line = "GET /health HTTP/1.1\r\nX-Slow: ";
    send(fd, line, strlen(line), MSG_NOSIGNAL);
    double t0 = fy_now_s(), closed = -1;
    while (fy_now_s() - t0 < 6) {
        if (send(fd, "a", 1, MSG_NOSIGNAL) != 1) break;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 200) > 0) {
            char b[256];
            if (recv(fd, b, sizeof(b), 0) <= 0) break;
        }
    }
    closed = fy_now_s() - t0;
    close(fd);
    print_message("a client trickling its headers: closed after %.2f s (header timeout 1 s)\n", closed);
    assert_true(closed >= 0.9 && closed < 4);
    /* a connection that sends nothing: closed at the header timeout too */
    fd = tc_http_dial(port, 10);
    closed = until_closed(fd, 6, NULL);
    close(fd);
    assert_true(closed >= 0.9 && closed < 4);
    /* a body that trickles: the deadline covers it */
    fd = tc_http_dial(port, 10);
    const char *head = "POST /now HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n";
    send(fd, head, strlen(head), MSG_NOSIGNAL);
    t0 = fy_now_s();
    while (fy_now_s() - t0 < 6 && send(fd, "b", 1, MSG_NOSIGNAL) == 1) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 200) > 0) break;
    }
    closed = until_closed(fd, 6, NULL);
    close(fd);
    assert_true(closed >= 0 && fy_now_s() - t0 < 4);
    /* kept alive after an answer, then idle: closed at the idle timeout */
    fd = tc_http_dial(port, 10);
    const char *req = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    send(fd, req, strlen(req), MSG_NOSIGNAL);
    tc_http_resp_t r;
    assert_int_equal(tc_http_read(fd, &r), 200);
    tc_http_free(&r);
    closed = until_closed(fd, 8, NULL);
    close(fd);
    print_message("an idle kept-alive connection: closed after %.2f s (idle timeout 2 s)\n", closed);
    assert_true(closed >= 1.5 && closed < 5);
    fy_httpd_stats_t s;
    fy_httpd_stats(h, &s);
    assert_true(s.timed_out >= 3);
    /* and the server still answers */
    assert_int_equal(tc_http(port, "GET", "/health", NULL), 200);
    stop(h);
}

static void test_sizes_and_errors(void **state)
{
    (void)state;
    fy_httpd_limits_t lim;
    fy_httpd_limits_default(&lim);
    lim.max_header = 8192;
    int port;
    fy_httpd_t *h = start(&lim, &port);
    char *hdr = fy_malloc(70000);
    static const int sizes[] = {2000, 7000, 9000, 64000};
    for (int k = 0; k < 4; k++) {
        int size = sizes[k];
        int fd = tc_http_dial(port, 10);
        int n = snprintf(hdr, 70000, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Big: ");
        memset(hdr + n, 'h', (size_t)size);
        memcpy(hdr + n + size, "\r\n\r\n", 5);
        send(fd, hdr, strlen(hdr), MSG_NOSIGNAL);
        tc_http_resp_t r;
        int st = tc_http_read(fd, &r);
        close(fd);
        print_message("a %d-byte header: HTTP %d\n", size, st);
        assert_int_equal(st, size < 8000 ? 200 : 431);
        tc_http_free(&r);
    }
    fy_free(hdr);
    tc_http_resp_t r;
    char big[5000];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = 0;
    assert_int_equal(post(port, "/now", big, &r), 413); /* over the route's 4096 */
    assert_non_null(strstr(r.body, "\"error\""));
    tc_http_free(&r);
    char *body;
    assert_int_equal(tc_http(port, "GET", "/nothing", &body), 404);
    assert_non_null(strstr(body, "\"error\""));
    fy_free(body);
    assert_int_equal(tc_http(port, "GET", "/now", &body), 405);
    assert_non_null(strstr(body, "POST"));
    fy_free(body);
    assert_int_equal(tc_http(port, "HEAD", "/health", &body), 200);
    assert_string_equal(body, "");
    fy_free(body);
    stop(h);
}

/* A raw request on a connection of its own: everything the server sends
 * until it closes (5 s at most), NUL-terminated, to fy_free. */
static char *raw_exchange(int port, const char *req)
{
    int fd = tc_http_dial(port, 5);
    assert_true(fd >= 0);
    send(fd, req, strlen(req), MSG_NOSIGNAL);
    size_t cap = 65536, n = 0;
    char *out = fy_malloc(cap);
    ssize_t k;
    while (n + 1 < cap && (k = recv(fd, out + n, cap - 1 - n, 0)) > 0) n += (size_t)k;
    out[n] = 0;
    close(fd);
    return out;
}

static int count_of(const char *s, const char *what)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, what)); p += strlen(what)) n++;
    return n;
}

/* issue 32, item 10: a body framed two ways (two Content-Lengths that
 * disagree, Content-Length with Transfer-Encoding, a length that is no
 * number) is refused with 400 and the connection closed: what follows
 * the first framing's end is never read as a request of its own. */
static void test_ambiguous_framing(void **state)
{
    (void)state;
    fy_httpd_limits_t lim;
    fy_httpd_limits_default(&lim);
    int port;
    fy_httpd_t *h = start(&lim, &port);
    static const char *const smuggled[] = {
        "POST /now HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 46\r\n\r\n"
        "helloGET /health HTTP/1.1\r\nHost: x\r\n\r\n",
        "POST /now HTTP/1.1\r\nHost: x\r\nContent-Length: 46\r\nContent-Length: 5\r\n\r\n"
        "helloGET /health HTTP/1.1\r\nHost: x\r\n\r\n",
        "POST /now HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
        "0\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n",
        "POST /now HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n"
        "0\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n",
        "POST /now HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 46\r\n\r\n"
        "helloGET /health HTTP/1.1\r\nHost: x\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof(smuggled) / sizeof(*smuggled); i++) {
        char *out = raw_exchange(port, smuggled[i]);
        int answers = count_of(out, "HTTP/1.1 ");
        print_message("framing %zu: %d answer%s, first %.12s\n", i, answers, answers == 1 ? "" : "s", out);
        /* (a length that is no number libmicrohttpd refuses itself, in its own words) */
        bool ours = i < 4;
        if ((ours && answers != 1) || strncmp(out, "HTTP/1.1 400", 12) ||
            (ours && !strstr(out, "framed ambiguously")) || strstr(out, " 200 ") || strstr(out, "healthy"))
            fail_msg("framing %zu: expected a 400 and the connection closed; got:\n%s", i, out);
        fy_free(out);
    }
    /* the same length twice is one framing: served */
    char *out = raw_exchange(port, "POST /now HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 5\r\n"
                                   "Content-Length: 5\r\n\r\nhello");
    assert_int_equal(strncmp(out, "HTTP/1.1 200", 12), 0);
    assert_non_null(strstr(out, "hello"));
    fy_free(out);
    assert_int_equal(tc_http(port, "GET", "/health", NULL), 200);
    stop(h);
}

static void test_connection_cap(void **state)
{
    (void)state;
    fy_httpd_limits_t lim;
    fy_httpd_limits_default(&lim);
    lim.max_connections = 8;
    int port;
    fy_httpd_t *h = start(&lim, &port);
    /* 40 idle connections: each newcomer beyond 8 closes the oldest idle one */
    int idle[40];
    for (int i = 0; i < 40; i++) idle[i] = tc_http_dial(port, 10);
    char *body;
    assert_int_equal(tc_http(port, "GET", "/health", &body), 200);
    assert_string_equal(body, "healthy");
    fy_free(body);
    /* an evicted connection is counted open until the server's thread has
     * closed it, which under TSan's slowdown comes a little later */
    fy_httpd_stats_t s;
    double t_settle = fy_now_s();
    do {
        fy_httpd_stats(h, &s);
    } while (s.open > 9 && fy_now_s() - t_settle < 5 && usleep(10000) == 0);
    print_message("40 idle connections with a cap of 8: %d open, %llu evicted\n", s.open,
                  (unsigned long long)s.evicted);
    assert_true(s.evicted >= 32);
    assert_true(s.open <= 9);
    for (int i = 0; i < 40; i++) close(idle[i]);
    /* 8 busy ones (answers held): a newcomer's POST gets a 503 with a JSON body and
     * is closed; its GET of a plain route is still answered */
    int busy[8];
    for (int i = 0; i < 8; i++) {
        busy[i] = tc_http_dial(port, 10);
        tc_http_send(busy[i], "POST", "/never", NULL, "text/plain", "", 0);
    }
    double t0 = fy_now_s();
    while (atomic_load(&X.held) < 8 && fy_now_s() - t0 < 5) usleep(1000);
    assert_int_equal(atomic_load(&X.held), 8);
    tc_http_resp_t r;
    assert_int_equal(post(port, "/now", "x", &r), 503);
    assert_non_null(strstr(r.body, "too many connections"));
    assert_non_null(strcasestr(r.head, "Retry-After: 1"));
    tc_http_free(&r);
    assert_int_equal(tc_http(port, "GET", "/health", NULL), 200);
    fy_httpd_stats(h, &s);
    assert_true(s.refused >= 1);
    for (int i = 0; i < 8; i++) close(busy[i]);
    t0 = fy_now_s();
    while (atomic_load(&X.ended_gone) < 8 && fy_now_s() - t0 < 5) usleep(1000);
    assert_int_equal(atomic_load(&X.ended_gone), 8);
    assert_int_equal(post(port, "/now", "back", &r), 200);
    tc_http_free(&r);
    stop(h);
}

/* Two holders of one address share its listener (the router's API and a
 * metrics route); a bad address is refused. */
static void test_shared_and_bad_urls(void **state)
{
    (void)state;
    int port = tc_free_port();
    char url[64];
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", port);
    fy_httpd_t *a, *b, *c;
    assert_int_equal(fy_httpd_create(url, &a), FY_OK);
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/", port);
    assert_int_equal(fy_httpd_create(url, &b), FY_OK);
    assert_int_equal(fy_httpd_port(a), port);
    assert_int_equal(fy_httpd_port(b), port);
    fy_httpd_destroy(a);
    fy_test_log_begin();
    assert_int_equal(fy_httpd_create("http://127.0.0.1", &c), FY_ERR_INVALID);
    assert_int_equal(fy_httpd_create("http://127.0.0.1:99999", &c), FY_ERR_INVALID);
    assert_int_equal(fy_httpd_create("udp://127.0.0.1:80", &c), FY_ERR_INVALID);
    fy_test_log_end();
    /* a port another process (here: a plain socket) listens on */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(fd, 1), 0);
    socklen_t sl = sizeof(sa);
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", ntohs(sa.sin_port));
    fy_test_log_begin();
    assert_int_equal(fy_httpd_create(url, &c), FY_ERR_IO);
    fy_test_log_end();
    assert_non_null(strstr(fy_test_log_text(), "Address already in use"));
    close(fd);
    fy_httpd_destroy(b);
}

/* Prefix routes (a path ending in a star) with the request's path, the exact route
 * winning over them; and the allowed origins checked as they are set. */
static void on_path(void *arg, fy_httpd_req_t *r)
{
    char b[256];
    int n = snprintf(b, sizeof(b), "%s %s", (const char *)arg, fy_httpd_req_path(r));
    fy_httpd_answer(r, 200, "text/plain", NULL, b, (size_t)n);
}

static void test_prefix_routes_and_origins(void **state)
{
    (void)state;
    fy_httpd_t *h;
    assert_int_equal(fy_httpd_create("http://127.0.0.1:0", &h), FY_OK);
    assert_int_equal(fy_httpd_handle(h, "GET", "/items/*", 0, on_path, "prefix"), FY_OK);
    assert_int_equal(fy_httpd_handle(h, "GET", "/items/special", 0, on_path, "exact"), FY_OK);
    assert_int_equal(fy_httpd_handle(h, "GET", "/items", 0, on_path, "list"), FY_OK);
    fy_test_log_begin();
    assert_int_equal(fy_httpd_handle(h, "GET", "/items/*", 0, on_path, "again"), FY_ERR_INVALID);
    fy_test_log_end();
    int port = fy_httpd_port(h);
    static const struct {
        const char *path;
        int status;
        const char *body;
    } cases[] = {
        {"/items/a%2Fb?x=1", 200, "prefix /items/a/b"},
        {"/items/special", 200, "exact /items/special"},
        {"/items", 200, "list /items"},
        {"/items/", 404, NULL},
        {"/itemsx", 404, NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *body;
        int st = tc_http(port, "GET", cases[i].path, &body);
        print_message("GET %s: HTTP %d %s\n", cases[i].path, st, body ? body : "");
        assert_int_equal(st, cases[i].status);
        if (cases[i].body)
            assert_string_equal(body, cases[i].body);
        else
            assert_non_null(strstr(body, "\"code\":null"));
        fy_free(body);
    }
    assert_int_equal(fy_httpd_cors(h, "*"), FY_OK);
    assert_int_equal(fy_httpd_cors(h, " https://a.example , http://localhost:3000/,http://[::1]:8080"), FY_OK);
    assert_int_equal(fy_httpd_cors(h, ""), FY_OK);
    static const char *const bad[] = {
        "a.example",      "https://a.example/app", "https://", "https://a.example,,x", "*, https://a.example",
        "ftp://a.example"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        fy_test_log_begin();
        assert_int_equal(fy_httpd_cors(h, bad[i]), FY_ERR_INVALID);
        fy_test_log_end();
        assert_non_null(strstr(fy_test_log_text(), "not an origin"));
    }
    fy_httpd_destroy(h);
}

/* Limits from a config section, and values out of range refused. */
static void test_limits_config(void **state)
{
    (void)state;
    fy_config_t *c;
    assert_int_equal(fy_config_create(&c), FY_OK);
    fy_httpd_limits_t l;
    assert_int_equal(fy_netconf_httpd(c, "router", &l), FY_OK);
    assert_true(l.header_timeout_s == 10 && l.idle_timeout_s == 30 && l.max_connections == 512 &&
                l.max_header == 16384);
    assert_int_equal(fy_config_set(c, "router.http_header_timeout=2500ms"), FY_OK);
    assert_int_equal(fy_config_set(c, "router.http_max_connections=64"), FY_OK);
    assert_int_equal(fy_config_set(c, "router.http_max_header=32KiB"), FY_OK);
    assert_int_equal(fy_netconf_httpd(c, "router", &l), FY_OK);
    assert_true(l.header_timeout_s == 2.5 && l.max_connections == 64 && l.max_header == 32768);
    assert_int_equal(fy_config_set(c, "router.http_max_connections=0"), FY_OK);
    fy_test_log_begin();
    assert_int_equal(fy_netconf_httpd(c, "router", &l), FY_ERR_INVALID);
    fy_test_log_end();
    fy_config_destroy(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_held_and_streamed),       cmocka_unit_test(test_gone_and_stopped),
        cmocka_unit_test(test_header_timeout_and_idle), cmocka_unit_test(test_sizes_and_errors),
        cmocka_unit_test(test_connection_cap),          cmocka_unit_test(test_shared_and_bad_urls),
        cmocka_unit_test(test_limits_config),           cmocka_unit_test(test_prefix_routes_and_origins),
        cmocka_unit_test(test_ambiguous_framing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

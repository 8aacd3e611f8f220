/*
 * test_http_robust.c - the router's HTTP front door under the failures an
 * operator meets in the first week, each against a real cluster (router,
 * one prefill and one decode worker as processes) on loopback:
 *
 *   - a decode worker killed (SIGKILL) while a dozen HTTP generations,
 *     streamed and not, are in flight on it: every client gets its end (an
 *     error event and [DONE], or a 502), and /health, the nng port and
 *     SIGTERM still work afterwards (issue 13, defect 1: the router used to
 *     wedge for good);
 *   - slow and idle clients against a router whose descriptor limit is 256
 *     (defect 3): 300 idle connections, and /health, the nng port and a
 *     generation are still served; a client trickling its headers is
 *     closed at router.http_header_timeout; headers over the limit get 431;
 *   - SIGTERM with a long stream, a short stream and an nng stream in
 *     flight (defect 7): /health says 503 "draining", new requests are
 *     refused (HTTP 503 with Retry-After, nng `overloaded`), the short one
 *     finishes, and at router.drain_timeout the stream ends with a
 *     finish_reason "abort" chunk, an error event and [DONE], the nng poll
 *     with an error, and the router exits 0;
 *   - a flood of large prompts (issue 32, item 1): 12 HTTP clients and 4
 *     nng clients sending prompts of about a megabyte for 8 s, while
 *     /health is polled and short streams run: /health answers within
 *     1 s every time (it waited over 1.4 s behind tokenizing on the
 *     server's threads before), the streams complete and their TTFT is
 *     printed beside the same without the flood; a text too long to fit
 *     is refused by its bytes (context_length_exceeded), a full parse
 *     queue with 503 and Retry-After at once.
 */
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"
#include "tests/cluster_util.h"
#include "common/mem.h"
#include "model/model.h"
#include "tests/testutil.h"
#include "model/tokenizer.h"

static int32_t decode_assigned(tc_cluster_t *c)
{
    fy_client_status_t s;
    tc_status(c, &s);
    for (int i = 0; i < s.n_workers; i++)
        if (s.workers[i].decode) return s.workers[i].assigned;
    return -1;
}

/* ---- defect 1: a worker dies under many HTTP generations ---- */

#define N_GEN 12

static void test_worker_killed_under_http_load(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    tc_cluster_t c;
    int port = tc_free_port();
    char http[128];
    snprintf(http, sizeof(http), "router.http=http://127.0.0.1:%d", port);
    tc_opts_t o = {.n_prefill = 1, .n_decode = 1, .common = {http, "decode.kv_mem=160MiB"}};
    tc_start(&c, &o);
    int fds[N_GEN];
    for (int i = 0; i < N_GEN; i++) {
        char body[256];
        snprintf(body, sizeof(body),
                 "{\"prompt\":\"Story number %d: once upon a time\",\"max_tokens\":400,\"ignore_eos\":true,"
                 "\"temperature\":0%s}",
                 i, i % 2 ? ",\"stream\":true" : "");
        fds[i] = tc_http_dial(port, 15);
        assert_true(fds[i] >= 0);
        tc_http_send(fds[i], "POST", "/v1/completions", NULL, "application/json", body, strlen(body));
    }
    /* every one decoding on decode-0, the streams' first bytes out */
    double t0 = fy_now_s();
    while (decode_assigned(&c) < N_GEN && fy_now_s() - t0 < 30) usleep(20000);
    assert_int_equal(decode_assigned(&c), N_GEN);
    for (int i = 1; i < N_GEN; i += 2) { /* a token chunk, not just the headers (peeked: left for later) */
        char b[8192];
        ssize_t k;
        while ((k = recv(fds[i], b, sizeof(b), MSG_PEEK)) > 0 && !memmem(b, (size_t)k, "data: {", 7)) usleep(10000);
        assert_true(k > 0);
    }
    tc_kill(&c, "decode-0");
    /* every client gets its end */
    for (int i = 0; i < N_GEN; i++) {
        tc_http_resp_t r;
        int status = tc_http_read(fds[i], &r);
        close(fds[i]);
        if (status < 0 || (i % 2 && !strstr(r.body, "data: [DONE]"))) {
            tc_print_logs(&c);
            fail_msg("%s %d: no end within 15 s of the kill (the router is wedged?): status %d, ...%s",
                     i % 2 ? "stream" : "request", i, status, r.body + (r.len > 400 ? r.len - 400 : 0));
        }
        if (i % 2) {
            if (status != 200 || !strstr(r.body, "\"error\"") || !strstr(r.body, "data: [DONE]"))
                fail_msg("stream %d: status %d, no error event and [DONE]: ...%s", i, status,
                         r.body + (r.len > 400 ? r.len - 400 : 0));
        } else if (status != 502) {
            fail_msg("request %d: status %d, expected 502: %s", i, status, r.body);
        }
        tc_http_free(&r);
    }
    /* and the router still answers: /health (503: no decode worker), the nng port, SIGTERM */
    char *body = NULL;
    int st = tc_http(port, "GET", "/health", &body);
    if (st != 503) {
        tc_print_logs(&c);
        fail_msg("/health after the kill: %d, expected 503 (%s)", st, body ? body : "no answer");
    }
    fy_free(body);
    fy_client_status_t s;
    tc_status(&c, &s);
    assert_int_equal(s.decode_up, 0);
    tc_stop(&c);
}

/* ---- defect 3: slow and idle clients, few descriptors ---- */

static void test_idle_flood_and_slow_clients(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    tc_cluster_t c;
    int port = tc_free_port();
    char http[128];
    snprintf(http, sizeof(http), "router.http=http://127.0.0.1:%d", port);
    static const char *const low_fd[] = {"prlimit", "--nofile=256:256", "--", NULL};
    tc_opts_t o = {.n_prefill = 1, .n_decode = 1, .common = {http, "router.http_header_timeout=1500ms"}};
    o.wrap[0] = low_fd;
    tc_start(&c, &o);
    /* 300 connections that send nothing, from a process with room for them */
    enum { N_IDLE = 300 };
    int idle[N_IDLE];
    for (int i = 0; i < N_IDLE; i++) {
        idle[i] = tc_http_dial(port, 5);
        assert_true(idle[i] >= 0);
    }
    char *body = NULL;
    int st = tc_http(port, "GET", "/health", &body);
    if (st != 200) {
        tc_print_logs(&c);
        fail_msg("/health with %d idle connections open: %d (%s)", N_IDLE, st, body ? body : "no answer");
    }
    fy_free(body);
    fy_client_status_t s;
    tc_status(&c, &s); /* the nng port has descriptors too */
    tc_http_resp_t r;
    int fd = tc_http_dial(port, 30);
    const char *req = "{\"prompt\":\"Hello\",\"max_tokens\":3}";
    tc_http_send(fd, "POST", "/v1/completions", NULL, "application/json", req, strlen(req));
    assert_int_equal(tc_http_read(fd, &r), 200);
    tc_http_free(&r);
    close(fd);
    assert_int_equal(tc_http(port, "GET", "/metrics", &body), 200);
    double evicted = tc_metric(body, "ferry:http_connections_closed_total{reason=\"evicted\"}");
    print_message("%d idle connections, descriptor limit 256: /health answered; %.0f evicted\n", N_IDLE, evicted);
    assert_true(evicted >= N_IDLE - 96); /* the router affords (256 - 64) / 2 connections */
    fy_free(body);
    for (int i = 0; i < N_IDLE; i++) close(idle[i]);

    /* a slowloris: a header byte every 200 ms is closed at the header timeout */
    fd = tc_http_dial(port, 5);
    const char *line = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ";
    send(fd, line, strlen(line), MSG_NOSIGNAL);
    double t0 = fy_now_s();
    for (;;) {
        if (fy_now_s() - t0 > 10 || send(fd, "a", 1, MSG_NOSIGNAL) != 1) break;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        char b[64];
        if (poll(&p, 1, 200) > 0 && recv(fd, b, sizeof(b), 0) <= 0) break;
    }
    double closed = fy_now_s() - t0;
    close(fd);
    print_message("a client trickling its headers: closed after %.2f s (router.http_header_timeout 1.5 s)\n", closed);
    assert_true(closed >= 1.3 && closed < 6);
    /* headers over the limit (16 KiB): 431, and the router goes on */
    char *big = fy_malloc(40000);
    int n = snprintf(big, 40000, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Big: ");
    memset(big + n, 'h', 30000);
    memcpy(big + n + 30000, "\r\n\r\n", 5);
    fd = tc_http_dial(port, 5);
    send(fd, big, strlen(big), MSG_NOSIGNAL);
    assert_int_equal(tc_http_read(fd, &r), 431);
    tc_http_free(&r);
    close(fd);
    fy_free(big);
    assert_int_equal(tc_http(port, "GET", "/health", NULL), 200);
    tc_stop(&c);
}

/* ---- defect 7: SIGTERM drains ---- */

static pid_t router_pid(tc_cluster_t *c)
{
    for (int i = 0; i < c->n_procs; i++)
        if (!strcmp(c->procs[i].name, "router")) return c->procs[i].pid;
    return 0;
}

/* sanitizer builds (TSan above all) decode several times slower: the short
 * stream needs longer to finish within the drain */
#ifdef FY_DEBUG
#define DRAIN_S 20
#else
#define DRAIN_S 6
#endif

static void test_sigterm_drains(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    tc_cluster_t c;
    int port = tc_free_port();
    char http[128];
    snprintf(http, sizeof(http), "router.http=http://127.0.0.1:%d", port);
    char drain[64];
    snprintf(drain, sizeof(drain), "router.drain_timeout=%ds", DRAIN_S);
    tc_opts_t o = {.n_prefill = 1, .n_decode = 1, .common = {http, drain, "decode.kv_mem=160MiB"}};
    tc_start(&c, &o);
    /* a long stream, running */
    int longfd = tc_http_dial(port, 30);
    const char *lreq = "{\"prompt\":\"Tell me a long story\",\"max_tokens\":3000,\"ignore_eos\":true,\"stream\":true}";
    tc_http_send(longfd, "POST", "/v1/completions", NULL, "application/json", lreq, strlen(lreq));
    char peek[8192];
    ssize_t k;
    while ((k = recv(longfd, peek, sizeof(peek), MSG_PEEK)) > 0 && !memmem(peek, (size_t)k, "\"text\":", 7)) {
        assert_null(memmem(peek, (size_t)k, "\"error\"", 7));
        usleep(10000);
    }
    assert_true(k > 0);
    /* a long nng stream, running */
    fy_client_req_t q = {.prompt = "Count to a thousand"};
    fy_genspec_default(&q.gen);
    q.gen.max_tokens = 3000;
    q.gen.ignore_eos = true;
    fy_client_stream_t ns;
    char err[256];
    assert_int_equal(fy_client_generate(c.client, &q, &ns, err, sizeof(err)), FY_OK);
    fy_client_update_t u;
    do {
        assert_int_equal(fy_client_poll(c.client, &ns, 1.0, &u), FY_OK);
    } while (!u.n_tokens && !u.done);
    assert_false(u.done);
    /* a short stream, running when the signal comes: it finishes */
    int shortfd = tc_http_dial(port, 30);
    const char *sreq = "{\"prompt\":\"Hi\",\"max_tokens\":12,\"ignore_eos\":true,\"stream\":true}";
    tc_http_send(shortfd, "POST", "/v1/completions", NULL, "application/json", sreq, strlen(sreq));
    while ((k = recv(shortfd, peek, sizeof(peek), MSG_PEEK)) > 0 && !memmem(peek, (size_t)k, "\"text\":", 7))
        usleep(10000);
    assert_true(k > 0);

    pid_t rp = router_pid(&c);
    double t0 = fy_now_s();
    assert_int_equal(kill(rp, SIGTERM), 0);
    /* while it drains: /health 503 "draining", new work refused */
    char *body = NULL;
    int st = -1;
    while (fy_now_s() - t0 < DRAIN_S) {
        st = tc_http(port, "GET", "/health", &body);
        if (st == 503 && strstr(body, "draining")) break;
        fy_free(body);
        body = NULL;
        usleep(10000);
    }
    if (st != 503 || !body || !strstr(body, "\"draining\"")) {
        tc_print_logs(&c);
        fail_msg("/health while draining: %d (%s)", st, body ? body : "no answer");
    }
    fy_free(body);
    int fd = tc_http_dial(port, 10);
    assert_true(fd >= 0);
    tc_http_send(fd, "POST", "/v1/completions", NULL, "application/json", sreq, strlen(sreq));
    tc_http_resp_t r;
    assert_int_equal(tc_http_read(fd, &r), 503);
    assert_non_null(strcasestr(r.head, "Retry-After:"));
    assert_non_null(strstr(r.body, "shutting down"));
    tc_http_free(&r);
    close(fd);
    fy_client_stream_t ns2;
    assert_int_equal(fy_client_generate(c.client, &q, &ns2, err, sizeof(err)), FY_ERR_OVERLOADED);
    assert_non_null(strstr(err, "shutting down"));
    /* the short one finished normally */
    assert_int_equal(tc_http_read(shortfd, &r), 200);
    if (!strstr(r.body, "\"finish_reason\":\"length\"") || !strstr(r.body, "data: [DONE]")) {
        tc_print_logs(&c);
        fail_msg("the short stream did not finish normally while the router drained: ...%s",
                 r.body + (r.len > 600 ? r.len - 600 : 0));
    }
    tc_http_free(&r);
    close(shortfd);
    /* the long stream ends with its terminal events at the drain time */
    assert_int_equal(tc_http_read(longfd, &r), 200);
    double t_end = fy_now_s() - t0;
    close(longfd);
    if (!strstr(r.body, "\"finish_reason\":\"abort\"") || !strstr(r.body, "data: {\"error\"") ||
        !strstr(r.body, "data: [DONE]"))
        fail_msg("the cut stream lacks its terminal events: ...%s", r.body + (r.len > 600 ? r.len - 600 : 0));
    assert_true(strstr(r.body, "\"finish_reason\":\"abort\"") < strstr(r.body, "data: [DONE]"));
    tc_http_free(&r);
    print_message("SIGTERM: the long stream ended with abort, error and [DONE] after %.2f s (drain_timeout %d s)\n",
                  t_end, DRAIN_S);
    if (!(t_end >= DRAIN_S - 0.5 && t_end < 2 * DRAIN_S)) {
        tc_print_logs(&c);
        fail_msg("the stream ended %.2f s after SIGTERM; the drain time is %d s", t_end, DRAIN_S);
    }
    /* the nng stream: done, with an error saying why */
    for (;;) {
        fy_status_t ps = fy_client_poll(c.client, &ns, 1.0, &u);
        if (ps != FY_OK)
            fail_msg("nng poll after the drain: %s (the router closed before the client saw its end)",
                     fy_status_str(ps));
        if (u.done) break;
    }
    assert_int_not_equal(u.error, FY_OK);
    assert_non_null(strstr(u.message, "shutting down"));
    /* and the router exits 0 */
    int status = 0;
    pid_t w;
    while ((w = waitpid(rp, &status, WNOHANG)) == 0 && fy_now_s() - t0 < 3 * DRAIN_S) usleep(20000);
    if (w != rp || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        tc_print_logs(&c);
        fail_msg("the router did not exit 0 after draining (status 0x%x)", w == rp ? status : -1);
    }
    print_message("the router exited 0 after %.2f s\n", fy_now_s() - t0);
    for (int i = 0; i < c.n_procs; i++)
        if (c.procs[i].pid == rp) c.procs[i].pid = 0;
    tc_stop(&c);
}

/* ---- issue 32, item 1: a flood of large prompts ---- */

#ifdef FY_DEBUG
#define ANSWER_S 60 /* sanitizer builds: a megabyte prompt's parse takes seconds */
#else
#define ANSWER_S 10
#endif

/* One HTTP request on a socket of its own, nothing asserted (flood and
 * poll threads): the status (-1: no answer within ANSWER_S) and up to cap
 * bytes of the answer's head and body in out. */
static int raw_http(int port, const char *req, size_t req_len, char *out, size_t cap)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {
        .sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a))) {
        if (fd >= 0) close(fd);
        return -1;
    }
    struct timeval tv = {.tv_sec = ANSWER_S};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    for (size_t off = 0; off < req_len;) {
        ssize_t k = send(fd, req + off, req_len - off, MSG_NOSIGNAL);
        if (k <= 0) break; /* refused before the whole body: its answer is read below */
        off += (size_t)k;
    }
    size_t n = 0;
    ssize_t k;
    while (n + 1 < cap && (k = recv(fd, out + n, cap - 1 - n, 0)) > 0) n += (size_t)k;
    out[n] = 0;
    close(fd);
    int status = -1;
    if (sscanf(out, "HTTP/1.%*d %d", &status) != 1) status = -1;
    return status;
}

/* A request for a completion of text (a JSON-safe text), whole. */
static char *completion_req(const char *text, size_t text_len, const char *extra, size_t *len_p)
{
    size_t cap = text_len + 512;
    char *b = fy_malloc(cap);
    int body_len = (int)(text_len + strlen(extra) + 13); /* {"prompt":" text " extra } */
    int n = snprintf(b, cap,
                     "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: "
                     "application/json\r\nContent-Length: %d\r\n\r\n{\"prompt\":\"",
                     body_len);
    memcpy(b + n, text, text_len);
    n += (int)text_len;
    n += snprintf(b + n, cap - (size_t)n, "\"%s}", extra);
    *len_p = (size_t)n;
    return b;
}

/* Words, not one repeated byte: what a tokenizer takes long over. */
static char *words(size_t len)
{
    static const char *const w[] = {"river ", "quantum ",    "lighthouse ", "seven ", "ferry ",   "marmalade ",
                                    "of ",    "tokenizers ", "and ",        "42 ",    "unicode ", "zebra "};
    char *t = fy_malloc(len + 1);
    size_t n = 0;
    for (unsigned i = 0; n < len; i = i * 7 + 3) {
        const char *x = w[i % 12];
        size_t l = strlen(x);
        if (n + l > len) l = len - n;
        memcpy(t + n, x, l);
        n += l;
    }
    t[len] = 0;
    return t;
}

typedef struct flood {
    int port;
    tc_cluster_t *c;
    double until;
    const char *req_big, *req_near; /* over the byte bound; just under it */
    size_t len_big, len_near;
    const char *nng_text;
    /* counts, each written by its own thread */
    int ok400, busy503, retry_after, other, nng_refused, nng_other;
} flood_t;

static void *flood_http(void *arg)
{
    flood_t *f = arg;
    char *out = fy_malloc(8192);
    for (int i = 0; fy_now_s() < f->until; i++) {
        bool big = i % 2;
        int st = raw_http(f->port, big ? f->req_big : f->req_near, big ? f->len_big : f->len_near, out, 8192);
        if (st == 400 && (!big || strstr(out, "context_length_exceeded")))
            __atomic_add_fetch(&f->ok400, 1, __ATOMIC_RELAXED);
        else if (st == 503) {
            __atomic_add_fetch(&f->busy503, 1, __ATOMIC_RELAXED);
            if (strcasestr(out, "Retry-After:")) __atomic_add_fetch(&f->retry_after, 1, __ATOMIC_RELAXED);
        } else if (__atomic_add_fetch(&f->other, 1, __ATOMIC_RELAXED) <= 3) {
            print_message("flood answer %d: %.300s\n", st, out);
        }
    }
    fy_free(out);
    return NULL;
}

static void *flood_nng(void *arg)
{
    flood_t *f = arg;
    fy_client_t *cl;
    if (fy_client_create(f->c->router_url, f->c->secret, 3 * ANSWER_S, &cl) != FY_OK) {
        __atomic_add_fetch(&f->nng_other, 1, __ATOMIC_RELAXED);
        return NULL;
    }
    while (fy_now_s() < f->until) {
        fy_client_req_t req = {.prompt = f->nng_text};
        fy_genspec_default(&req.gen);
        req.gen.max_tokens = 1;
        fy_client_stream_t s;
        char err[256];
        fy_status_t st = fy_client_generate(cl, &req, &s, err, sizeof(err));
        if (st == FY_ERR_INVALID || st == FY_ERR_OVERLOADED) {
            __atomic_add_fetch(&f->nng_refused, 1, __ATOMIC_RELAXED);
        } else {
            __atomic_add_fetch(&f->nng_other, 1, __ATOMIC_RELAXED);
            print_message("nng flood: %s (%s)\n", fy_status_str(st), err);
        }
        if (st == FY_OK) fy_client_cancel(cl, s.id);
    }
    fy_client_destroy(cl);
    return NULL;
}

typedef struct health_poll {
    int port;
    double until, worst;
    int n, bad;
} health_poll_t;

static void *poll_health(void *arg)
{
    health_poll_t *h = arg;
    static const char req[] = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    char out[2048];
    while (fy_now_s() < h->until) {
        double t0 = fy_now_s();
        int st = raw_http(h->port, req, sizeof(req) - 1, out, sizeof(out));
        double dt = fy_now_s() - t0;
        h->n++;
        if (st != 200) h->bad++;
        if (dt > h->worst) h->worst = dt;
        usleep(50000);
    }
    return NULL;
}

/* A short streamed completion: its time to the first token (-1 when it
 * did not end with [DONE]). */
static double stream_ttft(int port)
{
    const char *body = "{\"prompt\":\"The capital of France is\",\"max_tokens\":8,\"stream\":true,\"temperature\":0}";
    char req[512];
    int n = snprintf(req, sizeof(req),
                     "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: "
                     "application/json\r\nContent-Length: %zu\r\n\r\n%s",
                     strlen(body), body);
    int fd = tc_http_dial(port, 30);
    assert_true(fd >= 0);
    double t0 = fy_now_s(), first = -1;
    assert_int_equal(send(fd, req, (size_t)n, MSG_NOSIGNAL), n);
    char b[16384];
    size_t got = 0;
    ssize_t k;
    while (got + 1 < sizeof(b) && (k = recv(fd, b + got, sizeof(b) - 1 - got, 0)) > 0) {
        got += (size_t)k;
        b[got] = 0;
        if (first < 0 && strstr(b, "\"text\"")) first = fy_now_s() - t0;
    }
    close(fd);
    if (!strstr(b, "data: [DONE]") || !strstr(b, " 200 ")) {
        print_message("a normal stream did not end well: %s\n", b);
        return -1;
    }
    return first;
}

static double median3(double *v)
{
    double a = v[0], b = v[1], c = v[2];
    return a > b ? (b > c ? b : a > c ? c : a) : (a > c ? a : b > c ? c : b);
}

/* The test's flood; a benchmark run (BENCHMARKS.md) sets
 * FERRY_FLOOD="SECONDS HTTP_CLIENTS NNG_CLIENTS" and the router's
 * default parse settings. */
#define FLOOD_S 8
#define N_FLOOD_HTTP 12
#define MAX_FLOOD 128
#define N_FLOOD_NNG 4
#ifdef FY_DEBUG
#define HEALTH_BOUND_S 2.0 /* sanitizer builds: every thread several times slower */
#else
#define HEALTH_BOUND_S 1.0
#endif

static void test_large_prompt_flood(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    tc_cluster_t c;
    int port = tc_free_port();
    char http[128];
    snprintf(http, sizeof(http), "router.http=http://127.0.0.1:%d", port);
    /* a small general lane, so that the flood fills it: 503s with Retry-After */
    int flood_s = FLOOD_S, n_http = N_FLOOD_HTTP, n_nng = N_FLOOD_NNG;
    const char *bench = getenv("FERRY_FLOOD");
    if (bench && (sscanf(bench, "%d %d %d", &flood_s, &n_http, &n_nng) != 3 || flood_s < 1 || flood_s > 120 ||
                  n_http < 1 || n_nng < 0 || n_http + n_nng > MAX_FLOOD))
        fail_msg("FERRY_FLOOD='%s': SECONDS (1-120) HTTP_CLIENTS NNG_CLIENTS (at most %d together)", bench, MAX_FLOOD);
    tc_opts_t o = {.n_prefill = 1,
                   .n_decode = 1,
                   .common = {http, "router.max_body=2MiB", bench ? NULL : "router.parse_threads=1",
                              bench ? NULL : "router.parse_queue=2"}};
    tc_start(&c, &o);
    /* the byte bound the router works out from its tokenizer and context */
    fy_model_t *m;
    assert_int_equal(fy_model_load(tc_model(), &m), FY_OK);
    size_t bound = (size_t)fy_model_config(m)->max_ctx * fy_tokenizer_max_token_text(fy_model_tokenizer(m));
    fy_model_destroy(m);
    assert_true(bound > 4096);
    size_t big_len = bound + 4096 > (1u << 20) ? bound + 4096 : (1u << 20);
    size_t near_len = bound - 16;
    char *big_text = words(big_len), *near_text = words(near_len);
    /* nng: the most prompt text a message carries (FY_WIRE_MAX_PROMPT_BYTES) */
    flood_t f = {.port = port, .c = &c, .nng_text = near_text + (near_len > (1u << 20) ? near_len - (1u << 20) : 0)};
    char *req_big = completion_req(big_text, big_len, ",\"max_tokens\":1", &f.len_big);
    char *req_near = completion_req(near_text, near_len, ",\"max_tokens\":1", &f.len_near);
    f.req_big = req_big;
    f.req_near = req_near;

    /* alone: a text too long to fit is refused as OpenAI refuses it, without tokenizing */
    char *out = fy_malloc(8192);
    double t1 = fy_now_s();
    int st1 = raw_http(port, req_big, f.len_big, out, 8192);
    bool code = strstr(out, "\"code\":\"context_length_exceeded\"") && strstr(out, "\"param\":\"prompt\"");
    print_message("a prompt of %zu bytes (more than %zu): %d in %.3f s%s\n", big_len, bound, st1, fy_now_s() - t1,
                  code ? ", context_length_exceeded" : "");
    if (!bench) { /* (a benchmark run may measure a router from before) */
        assert_int_equal(st1, 400);
        assert_true(code);
    }
    fy_free(out);

    double before[3], during[3];
    for (int i = 0; i < 3; i++) assert_true((before[i] = stream_ttft(port)) >= 0);

    double t0 = fy_now_s();
    f.until = t0 + flood_s;
    health_poll_t hp = {.port = port, .until = f.until};
    pthread_t th[MAX_FLOOD], hth;
    for (int i = 0; i < n_http; i++) assert_int_equal(pthread_create(&th[i], NULL, flood_http, &f), 0);
    for (int i = 0; i < n_nng; i++) assert_int_equal(pthread_create(&th[n_http + i], NULL, flood_nng, &f), 0);
    /* the flood under way: the general lane full (a 503), or for a
     * benchmark's larger lane, the router answering the flood */
    while (fy_now_s() < f.until && !(__atomic_load_n(&f.busy503, __ATOMIC_RELAXED) > 0 ||
                                     (bench && __atomic_load_n(&f.ok400, __ATOMIC_RELAXED) > 0)))
        usleep(10000);
    assert_int_equal(pthread_create(&hth, NULL, poll_health, &hp), 0);
    /* normal requests during the flood: streamed over HTTP, and one over nng */
    for (int i = 0; i < 3; i++) during[i] = stream_ttft(port);
    int32_t hello[] = {1, 2, 3, 4};
    fy_client_req_t nreq = {.tokens = hello, .n_tokens = 4};
    fy_genspec_default(&nreq.gen);
    nreq.gen.max_tokens = 4;
    fy_client_stream_t ns;
    char err[256] = "";
    fy_status_t nst = fy_client_generate(c.client, &nreq, &ns, err, sizeof(err));
    tc_result_t nres;
    if (nst == FY_OK) tc_collect(&c, &ns, &nres, 1, 30);
    for (int i = 0; i < n_http + n_nng; i++) pthread_join(th[i], NULL);
    pthread_join(hth, NULL);
    double flood_wall = fy_now_s() - t0;

    print_message("flood of %.1f s: HTTP %d refused 400, %d 503 (%d with Retry-After), %d other; nng %d refused, %d "
                  "other\n",
                  flood_wall, f.ok400, f.busy503, f.retry_after, f.other, f.nng_refused, f.nng_other);
    print_message("/health during the flood: %d polls, %d not 200, worst %.3f s (bound %.1f s)\n", hp.n, hp.bad,
                  hp.worst, HEALTH_BOUND_S);
    print_message("streamed TTFT, median of 3: %.1f ms without the flood, %.1f ms during it (x%.1f)\n",
                  median3(before) * 1e3, median3(during) * 1e3, median3(during) / median3(before));
    bool alive = tc_alive(&c, "router");
    if (!alive || hp.worst > HEALTH_BOUND_S || hp.bad || during[0] < 0 || during[1] < 0 || during[2] < 0 ||
        nst != FY_OK || f.other || f.nng_other) {
        tc_print_logs(&c);
        fail_msg("under the flood: router %s, /health worst %.3f s (%d bad), streams %s, nng %s (%s), %d HTTP and %d "
                 "nng answers neither refusal",
                 alive ? "alive" : "dead", hp.worst, hp.bad,
                 during[0] < 0 || during[1] < 0 || during[2] < 0 ? "failed" : "ok", fy_status_str(nst), err, f.other,
                 f.nng_other);
    }
    /* (under a sanitizer the general lane may refuse every one: its parses are slow) */
    assert_true(f.ok400 + f.busy503 > 0 && (f.nng_refused > 0 || !n_nng));
    assert_true(f.retry_after == f.busy503);
    if (!bench) assert_true(f.busy503 > 0); /* the general lane filled, refused at once */
    fy_free(big_text);
    fy_free(near_text);
    fy_free(req_big);
    fy_free(req_near);
    tc_stop(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worker_killed_under_http_load),
        cmocka_unit_test(test_idle_flood_and_slow_clients),
        cmocka_unit_test(test_sigterm_drains),
        cmocka_unit_test(test_large_prompt_flood),
    };
    if (getenv("FERRY_TEST_ONLY")) cmocka_set_test_filter(getenv("FERRY_TEST_ONLY")); /* one test, by name */
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    fy_test_tmpdir_remove();
    return rc;
}

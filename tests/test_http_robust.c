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
 *     with an error, and the router exits 0.
 */
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cluster_util.h"
#include "mem.h"
#include "testutil.h"

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
    double t0 = tc_now();
    while (decode_assigned(&c) < N_GEN && tc_now() - t0 < 30) usleep(20000);
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
    double t0 = tc_now();
    for (;;) {
        if (tc_now() - t0 > 10 || send(fd, "a", 1, MSG_NOSIGNAL) != 1) break;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        char b[64];
        if (poll(&p, 1, 200) > 0 && recv(fd, b, sizeof(b), 0) <= 0) break;
    }
    double closed = tc_now() - t0;
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
    double t0 = tc_now();
    assert_int_equal(kill(rp, SIGTERM), 0);
    /* while it drains: /health 503 "draining", new work refused */
    char *body = NULL;
    int st = -1;
    while (tc_now() - t0 < DRAIN_S) {
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
    if (!strstr(r.body, "\"finish_reason\":\"length\"") || !strstr(r.body, "data: [DONE]"))
        fail_msg("the short stream did not finish normally while the router drained: %s", r.body);
    tc_http_free(&r);
    close(shortfd);
    /* the long stream ends with its terminal events at the drain time */
    assert_int_equal(tc_http_read(longfd, &r), 200);
    double t_end = tc_now() - t0;
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
    while ((w = waitpid(rp, &status, WNOHANG)) == 0 && tc_now() - t0 < 3 * DRAIN_S) usleep(20000);
    if (w != rp || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        tc_print_logs(&c);
        fail_msg("the router did not exit 0 after draining (status 0x%x)", w == rp ? status : -1);
    }
    print_message("the router exited 0 after %.2f s\n", tc_now() - t0);
    for (int i = 0; i < c.n_procs; i++)
        if (c.procs[i].pid == rp) c.procs[i].pid = 0;
    tc_stop(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worker_killed_under_http_load),
        cmocka_unit_test(test_idle_flood_and_slow_clients),
        cmocka_unit_test(test_sigterm_drains),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    fy_test_tmpdir_remove();
    return rc;
}

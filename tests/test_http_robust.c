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
 *
 * The router answers /health after each.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worker_killed_under_http_load),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    fy_test_tmpdir_remove();
    return rc;
}

/*
 * test_router.c - the router's table of workers against workers that come
 * and go or stop listening, with real processes (a router and one decode
 * worker, colocated) and fake decode workers the test plays itself:
 *
 *  - pod churn: 200 distinct worker names over time, each reporting a few
 *    times and then gone; the router's table holds 64, so each name must
 *    get a slot freed by router.forget_after, while a request streams on
 *    the real worker;
 *  - a decode worker that sends load reports but never answers a command:
 *    its circuit breaker opens on the first timeout, the request that
 *    timed out is retried on the real worker, a trial request later finds
 *    it answering and closes the breaker again; its reports are an older
 *    worker's (no ctx), and the pool's context (max_model_len) stays the
 *    model's;
 *  - a stuck rank (SIGSTOP) of a decode worker's group: the worker calls
 *    itself out of service when its /health turns 503 for the stall
 *    (worker.stall_timeout), and the router stops placing there.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "common/clock.h"
#include "common/cluster.h"
#include "tests/cluster_util.h"
#include "common/envelope.h"
#include "common/mem.h"
#include "common/msg.h"
#include "rpc/rpc.h"
#include "tests/testutil.h"
#include "common/wire.h"

/* without etcd there is one router, named "router" (worker/node.c addresses it so) */
static const fy_env_peer_t TO_ROUTER = {.role = FY_ROLE_ROUTER, .name = "router"};

static void make_prompt(int32_t *p, int32_t n, uint64_t seed)
{
    for (int32_t i = 0; i < n; i++) p[i] = 100 + (int32_t)(fy_test_rand_u64(&seed) % 40000);
}

static fy_client_stream_t submit(tc_cluster_t *c, const int32_t *p, int32_t n, int32_t max_tokens)
{
    fy_client_req_t q = {.tokens = p, .n_tokens = n};
    fy_genspec_default(&q.gen);
    q.gen.max_tokens = max_tokens;
    q.gen.ignore_eos = true;
    fy_client_stream_t s;
    char err[256];
    fy_status_t st = fy_client_generate(c->client, &q, &s, err, sizeof(err));
    if (st) fail_msg("generate refused: %s (%s)", err, fy_status_str(st));
    return s;
}

static bool has_worker(const fy_client_status_t *s, const char *name)
{
    for (int i = 0; i < s->n_workers; i++)
        if (!strcmp(s->workers[i].name, name)) return true;
    return false;
}

/* A decode worker's load report, as the worker writes it. */
static void send_load(fy_push_t *p, const char *name, uint64_t inc, const char *model, const char *listen)
{
    fy_msgw_t w;
    fy_msgw_init(&w, "load");
    fy_msgw_str(&w, "worker", name);
    fy_msgw_u64(&w, "inc", inc);
    fy_msgw_str(&w, "role", "decode");
    fy_msgw_str(&w, "listen", listen);
    fy_msgw_str(&w, "model", model);
    fy_msgw_i64(&w, "block_size", 16);
    fy_msgw_i64(&w, "max_seqs", 32);
    fy_msgw_i64(&w, "total_blocks", 100000);
    fy_msgw_i64(&w, "admittable", 100000);
    fy_msgw_i64(&w, "capacity", 100000);
    assert_int_equal(fy_push_msgw(p, &w), FY_OK);
}

/* ---- 200 worker names over a router's life ---- */

enum { N_CHURN = 200, CHURN_BATCH = 50 };

static void test_churn_forgets_gone_workers(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    int32_t prompt[40];
    make_prompt(prompt, 40, 7);
    int32_t *pp[1] = {prompt}, len = 40, max_tokens = 48;
    tc_result_t ref;
    tc_reference(tc_model(), pp, &len, &max_tokens, 1, &ref);
    tc_cluster_t c;
    tc_opts_t o = {.n_prefill = 0, .n_decode = 1, .common = {"router.health_timeout=1s", "router.forget_after=1s"}};
    tc_start(&c, &o);
    fy_client_status_t s;
    char listen[600];
    snprintf(listen, sizeof(listen), "ipc://%s/nobody", c.dir);
    int listed = 0;
    for (int b = 0; b < N_CHURN / CHURN_BATCH; b++) {
        /* a request streams on the real worker while the table churns */
        fy_client_stream_t st = submit(&c, prompt, len, max_tokens);
        fy_env_auth_t auth[CHURN_BATCH];
        fy_push_t *push[CHURN_BATCH];
        char names[CHURN_BATCH][32];
        for (int k = 0; k < CHURN_BATCH; k++) {
            snprintf(names[k], sizeof(names[k]), "pod-%d", b * CHURN_BATCH + k);
            assert_int_equal(fy_cluster_auth_file(c.secret, FY_ROLE_DECODE, names[k], 0, &auth[k]), FY_OK);
            assert_int_equal(fy_push_create(c.events_url, 16, &auth[k], &TO_ROUTER, &push[k]), FY_OK);
        }
        /* each pod reports (of another model: nothing is placed there) until the router lists it */
        double t0 = fy_now_s();
        int seen = 0;
        while (seen < CHURN_BATCH && fy_now_s() - t0 < 20) {
            for (int k = 0; k < CHURN_BATCH; k++) send_load(push[k], names[k], auth[k].inc, "another-model", listen);
            usleep(200000);
            tc_status(&c, &s);
            seen = 0;
            for (int k = 0; k < CHURN_BATCH; k++) seen += has_worker(&s, names[k]);
        }
        listed += seen;
        if (seen < CHURN_BATCH) {
            tc_print_logs(&c);
            fail_msg("batch %d: the router lists %d of its %d new workers (%d of %d so far)", b, seen, CHURN_BATCH,
                     listed, (b + 1) * CHURN_BATCH);
        }
        for (int k = 0; k < CHURN_BATCH; k++) {
            fy_push_destroy(push[k]);
            fy_env_auth_wipe(&auth[k]);
        }
        /* the pods are gone: down after 1 s, forgotten 1 s later */
        t0 = fy_now_s();
        do {
            usleep(200000);
            tc_status(&c, &s);
            seen = 0;
            for (int k = 0; k < CHURN_BATCH; k++) seen += has_worker(&s, names[k]);
        } while (seen && fy_now_s() - t0 < 15); /* still listed: the next batch finds no room */
        /* the real worker, busy or not, keeps its slot, and its stream its tokens */
        assert_true(has_worker(&s, "decode-0"));
        tc_result_t got = {0};
        tc_collect(&c, &st, &got, 1, 60);
        if (got.error) fail_msg("batch %d: the stream failed: %s", b, got.message);
        assert_int_equal(got.n, ref.n);
        assert_memory_equal(got.tokens, ref.tokens, (size_t)ref.n * sizeof(int32_t));
    }
    print_message("%d distinct worker names listed, each forgotten after it went\n", listed);
    assert_int_equal(listed, N_CHURN);
    for (int k = N_CHURN - CHURN_BATCH; k < N_CHURN; k++) {
        char name[32];
        snprintf(name, sizeof(name), "pod-%d", k);
        assert_false(has_worker(&s, name));
    }
    tc_stop(&c);
}

/* ---- a decode worker that reports load and never answers ---- */

typedef struct deaf {
    tc_cluster_t *c;
    char name[32], listen[600], model[64];
    fy_env_auth_t auth;
    fy_push_t *events;
    fy_pull_t *cmds;
    pthread_t th;
    atomic_bool stop;
    atomic_bool answer; /* refuses each command as no_space (an answer) instead of keeping silent */
    bool slow;          /* one load report, then "alive" only: a worker in one long engine step */
    atomic_int commands;
} deaf_t;

static void deaf_command(void *arg, const fy_env_hdr_t *from, const void *buf, size_t len)
{
    (void)from;
    deaf_t *d = arg;
    atomic_fetch_add(&d->commands, 1);
    if (!atomic_load(&d->answer)) return;
    fy_msgr_t r;
    if (fy_msgr_parse(&r, buf, len) != FY_OK) return;
    fy_wire_cmd_t h = {0};
    fy_wire_cmd_read(&r, &h);
    uint64_t id = fy_msgr_u64(&r, "id", FY_OPT, 0, 0, UINT64_MAX);
    fy_msgr_free(&r);
    if (!h.rid) return;
    fy_wire_ev_error_t m = {.ev = {.inc = d->auth.inc, .rid = h.rid, .id = id}};
    snprintf(m.ev.worker, sizeof(m.ev.worker), "%s", d->name);
    snprintf(m.code, sizeof(m.code), "%s", fy_status_tag(FY_ERR_NO_SPACE));
    snprintf(m.message, sizeof(m.message), "no room here");
    fy_msgw_t w;
    fy_wire_ev_error_write(&w, &m);
    (void)fy_push_msgw(d->events, &w);
}

static void *deaf_main(void *arg)
{
    deaf_t *d = arg;
    double t0 = fy_now_s();
    for (int k = 0; !atomic_load(&d->stop); k++) { /* every worker.heartbeat */
        if (!d->slow || k == 0) {
            send_load(d->events, d->name, d->auth.inc, d->model, d->listen);
        } else {
            fy_wire_alive_t m = {.ev = {.inc = d->auth.inc}, .busy_s = fy_now_s() - t0};
            snprintf(m.ev.worker, sizeof(m.ev.worker), "%s", d->name);
            fy_msgw_t w;
            fy_wire_alive_write(&w, &m);
            (void)fy_push_msgw(d->events, &w);
        }
        usleep(200000);
    }
    return NULL;
}

static void deaf_start(deaf_t *d, tc_cluster_t *c, const char *model, bool slow)
{
    memset(d, 0, sizeof(*d));
    d->slow = slow;
    d->c = c;
    snprintf(d->name, sizeof(d->name), "deaf-0");
    snprintf(d->listen, sizeof(d->listen), "ipc://%s/deaf-0", c->dir);
    snprintf(d->model, sizeof(d->model), "%s", model);
    assert_int_equal(fy_cluster_auth_file(c->secret, FY_ROLE_DECODE, d->name, 0, &d->auth), FY_OK);
    assert_int_equal(fy_pull_create(d->listen, &d->auth, FY_RPC_FROM(FY_ROLE_ROUTER), deaf_command, d, &d->cmds),
                     FY_OK);
    assert_int_equal(fy_push_create(c->events_url, 64, &d->auth, &TO_ROUTER, &d->events), FY_OK);
    assert_int_equal(pthread_create(&d->th, NULL, deaf_main, d), 0);
}

static void deaf_stop(deaf_t *d)
{
    atomic_store(&d->stop, true);
    pthread_join(d->th, NULL);
    fy_pull_destroy(d->cmds);
    fy_push_destroy(d->events);
    fy_env_auth_wipe(&d->auth);
}

/* The HTTP door's max_model_len: the pool's context. */
static json_int_t max_model_len(int port)
{
    char *body = NULL;
    assert_int_equal(tc_http(port, "GET", "/v1/models", &body), 200);
    json_error_t e;
    json_t *j = json_loads(body, 0, &e);
    fy_free(body);
    assert_non_null(j);
    json_int_t n = json_integer_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "max_model_len"));
    json_decref(j);
    return n;
}

static double breakers_open(int port)
{
    char *body = NULL;
    assert_int_equal(tc_http(port, "GET", "/metrics", &body), 200);
    double v = tc_metric(body, "ferry:worker_breakers_open{worker_role=\"decode\"}");
    fy_free(body);
    return v;
}

enum { N_DEAF = 7 };

static void test_breaker_skips_deaf_worker(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    int32_t prompt[24];
    make_prompt(prompt, 24, 11);
    int32_t *pp[1] = {prompt}, len = 24, max_tokens = 8;
    tc_result_t ref;
    tc_reference(tc_model(), pp, &len, &max_tokens, 1, &ref);
    int port = tc_free_port();
    char http[64];
    snprintf(http, sizeof(http), "router.http=http://127.0.0.1:%d", port);
    tc_cluster_t c;
    tc_opts_t o = {
        .n_prefill = 0, .n_decode = 1, .common = {"router.command_timeout=1s", "router.breaker_cooldown=2s", http}};
    tc_start(&c, &o);
    fy_client_status_t s;
    tc_status(&c, &s);
    json_int_t ctx = max_model_len(port); /* the real worker's: the model's (decode.ctx 0) */
    assert_true(ctx >= 2048);
    deaf_t d;
    deaf_start(&d, &c, s.model, false);
    double t0 = fy_now_s();
    do {
        usleep(50000);
        tc_status(&c, &s);
    } while (s.decode_up < 2 && fy_now_s() - t0 < 20);
    assert_int_equal(s.decode_up, 2);
    /* its load reports are an older worker's (no ctx): it counts as holding the model's context */
    assert_int_equal(max_model_len(port), ctx);
    /* one request at a time: each looks for the least-loaded decode worker,
     * and the deaf one (nothing assigned, the most room) is it every time
     * unless its breaker keeps it out */
    int ok = 0;
    double t_start = fy_now_s();
    for (int i = 0; i < N_DEAF; i++) {
        fy_client_stream_t st = submit(&c, prompt, len, max_tokens);
        tc_result_t got = {0};
        tc_collect(&c, &st, &got, 1, 60);
        if (got.error) {
            print_message("request %d: %s\n", i, got.message);
            continue;
        }
        assert_int_equal(got.n, ref.n);
        assert_memory_equal(got.tokens, ref.tokens, (size_t)ref.n * sizeof(int32_t));
        ok++;
    }
    print_message("%d of %d requests served in %.1f s; the deaf worker got %d commands\n", ok, N_DEAF,
                  fy_now_s() - t_start, atomic_load(&d.commands));
    assert_int_equal(ok, N_DEAF);
    assert_true(atomic_load(&d.commands) >= 1); /* it was chosen, and the breaker took it out */
    assert_int_equal(breakers_open(port), 1);
    /* it starts answering (each command refused as no_space, an answer all
     * the same): the next trial request closes the breaker */
    atomic_store(&d.answer, true);
    int before = atomic_load(&d.commands);
    t0 = fy_now_s();
    while (breakers_open(port) != 0 && fy_now_s() - t0 < 30) {
        fy_client_stream_t st = submit(&c, prompt, len, max_tokens);
        tc_result_t got = {0};
        tc_collect(&c, &st, &got, 1, 60);
        if (got.error) fail_msg("a request failed while the deaf worker answered: %s", got.message);
        assert_memory_equal(got.tokens, ref.tokens, (size_t)ref.n * sizeof(int32_t));
    }
    assert_int_equal(breakers_open(port), 0);
    assert_true(atomic_load(&d.commands) > before);
    deaf_stop(&d);
    tc_stop(&c);
}

/* A worker in one long engine step (alive, no load report, no answer) is
 * slow, not deaf: its breaker stays closed; the request that timed out
 * there is served elsewhere all the same. */
static void test_breaker_spares_slow_worker(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    int32_t prompt[24];
    make_prompt(prompt, 24, 13);
    int port = tc_free_port();
    char http[64];
    snprintf(http, sizeof(http), "router.http=http://127.0.0.1:%d", port);
    tc_cluster_t c;
    tc_opts_t o = {
        .n_prefill = 0, .n_decode = 1, .common = {"router.command_timeout=1s", "router.breaker_cooldown=2s", http}};
    tc_start(&c, &o);
    fy_client_status_t s;
    tc_status(&c, &s);
    deaf_t d;
    deaf_start(&d, &c, s.model, true);
    double t0 = fy_now_s();
    do {
        usleep(50000);
        tc_status(&c, &s);
    } while (s.decode_up < 2 && fy_now_s() - t0 < 20);
    assert_int_equal(s.decode_up, 2);
    for (int i = 0; i < 2; i++) {
        fy_client_stream_t st = submit(&c, prompt, 24, 4);
        tc_result_t got = {0};
        tc_collect(&c, &st, &got, 1, 60);
        if (got.error) fail_msg("request %d: %s", i, got.message);
        assert_int_equal(got.n, 4);
    }
    print_message("the slow worker got %d commands; breakers open: %.0f\n", atomic_load(&d.commands),
                  breakers_open(port));
    assert_true(atomic_load(&d.commands) >= 2);
    assert_int_equal(breakers_open(port), 0);
    deaf_stop(&d);
    tc_stop(&c);
}

/* ---- a crash leaves a report ---- */

/* A router and a decode worker that die of SIGSEGV say so on stderr, with
 * the stack, and still end by the signal (their cores are kept).  The
 * router of a chaos round once died of SIGSEGV with no core and no trace. */
static void test_crash_report(void **state)
{
    (void)state;
    if (!tc_available()) skip();
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    skip(); /* the sanitizer's handler reports instead (log.h) */
#endif
    tc_cluster_t c;
    tc_opts_t o = {.n_prefill = 0, .n_decode = 1};
    tc_start(&c, &o);
    for (int i = 0; i < c.n_procs; i++) {
        tc_proc_t *p = &c.procs[i];
        p->killed = true;
        assert_int_equal(kill(p->pid, SIGSEGV), 0);
        int status = 0;
        assert_int_equal(waitpid(p->pid, &status, 0), p->pid);
        p->pid = 0;
        assert_true(WIFSIGNALED(status));
        assert_int_equal(WTERMSIG(status), SIGSEGV);
        char *log = fy_test_read_file(p->log, NULL);
        assert_non_null(log);
        char want[96];
        snprintf(want, sizeof(want), "error: fatal signal 11 (SIGSEGV) sent by pid %d", (int)getpid());
        const char *at = strstr(log, want);
        if (!at || !strstr(at, "(+0x")) {
            tc_print_logs(&c);
            fail_msg("%s: no crash report with a stack in its log", p->name);
        }
        print_message("%s: %.*s\n", p->name, (int)strcspn(at, "\n"), at);
        fy_free(log);
    }
    tc_stop(&c);
}

/* ---- a stuck rank ---- */

static void test_stuck_rank_out_of_service(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    int32_t prompt[32];
    make_prompt(prompt, 32, 5);
    tc_cluster_t c;
    tc_opts_t o = {.n_prefill = 1,
                   .n_decode = 1,
                   .common = {"decode.kv_mem=64MiB", "prefill.kv_mem=64MiB", "worker.stall_timeout=2s"},
                   .per_worker = {{NULL}, {"decode.tp=3"}}};
    tc_start(&c, &o);
    tc_proc_t *dp = NULL;
    for (int i = 0; i < c.n_procs; i++)
        if (!strcmp(c.procs[i].name, "decode-0")) dp = &c.procs[i];
    assert_non_null(dp);
    pid_t ranks[8];
    assert_int_equal(tc_children_of(dp->pid, ranks, 8), 2);
    fy_client_stream_t st = submit(&c, prompt, 32, 4000);
    fy_client_update_t u;
    double t0 = fy_now_s();
    int32_t seen = 0;
    while (seen < 4 && fy_now_s() - t0 < 30) { /* it streams from the group */
        assert_int_equal(fy_client_poll(c.client, &st, 0.2, &u), FY_OK);
        seen += u.n_tokens;
        assert_false(u.done);
    }
    assert_true(seen >= 4);
    assert_int_equal(kill(ranks[1], SIGSTOP), 0);
    double t_stop = fy_now_s(), t_out = -1;
    fy_client_status_t s;
    /* out of service on its own word within the stall bound and a margin
     * (the group's default is 30 s) */
    while (t_out < 0 && fy_now_s() - t_stop < 10) {
        tc_status(&c, &s);
        for (int i = 0; i < s.n_workers; i++)
            if (!strcmp(s.workers[i].name, "decode-0") && s.workers[i].out_of_service && !s.workers[i].up)
                t_out = fy_now_s();
        (void)fy_client_poll(c.client, &st, 0.1, &u);
    }
    if (t_out < 0) {
        kill(ranks[1], SIGKILL);
        tc_print_logs(&c);
        fail_msg("decode-0 was still in placement %.1f s after a rank stopped", fy_now_s() - t_stop);
    }
    print_message("decode-0 out of service %.2f s after its rank stopped (worker.stall_timeout = 2 s)\n",
                  t_out - t_stop);
    tc_result_t res = {0};
    tc_collect(&c, &st, &res, 1, 30);
    print_message("the stream ended: %s\n", res.message);
    assert_int_not_equal(res.error, FY_OK);
    /* nothing is placed on it: a new request waits (no decode worker up) */
    fy_client_stream_t st2 = submit(&c, prompt, 32, 4);
    usleep(500000); /* a fixed time: nothing brings decode-0 back into placement within it */
    tc_status(&c, &s);
    assert_int_equal(s.decode_up, 0);
    assert_int_equal(fy_client_cancel(c.client, st2.id), FY_OK);
    /* the worker leaves with status 3, its stopped rank killed by its group's destroy */
    int status = 0;
    pid_t r = 0;
    for (t0 = fy_now_s(); r == 0 && fy_now_s() - t0 < 15; usleep(20000)) r = waitpid(dp->pid, &status, WNOHANG);
    if (r != dp->pid) {
        kill(ranks[1], SIGKILL);
        tc_print_logs(&c);
        fail_msg("decode-0 did not exit after its rank got stuck");
    }
    dp->pid = 0;
    dp->killed = true;
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 3);
    for (t0 = fy_now_s(); kill(ranks[1], 0) == 0 && fy_now_s() - t0 < 5;) usleep(20000);
    assert_true(kill(ranks[1], 0) < 0 && errno == ESRCH);
    tc_stop(&c);
}

static int teardown(void **state)
{
    (void)state;
    fy_test_tmpdir_remove();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_churn_forgets_gone_workers, teardown),
        cmocka_unit_test_teardown(test_breaker_skips_deaf_worker, teardown),
        cmocka_unit_test_teardown(test_breaker_spares_slow_worker, teardown),
        cmocka_unit_test_teardown(test_stuck_rank_out_of_service, teardown),
        cmocka_unit_test_teardown(test_crash_report, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

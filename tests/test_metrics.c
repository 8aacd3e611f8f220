/*
 * test_metrics.c - the metrics registry's exact text (counters, labelled
 * gauges, cumulative histogram buckets, escaping), registration errors,
 * concurrent updates; the HTTP routes (404, 405, two holders of one
 * server); the health rules one by one; and a real cluster (one prefill
 * and one decode worker): every worker's /metrics is well-formed
 * Prometheus text whose token counters and histogram counts match what
 * was sent, blocks go back, /health is 200 at rest and 503 while the
 * prefill engine is held in a step longer than its stall limit.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "tests/cluster_util.h"
#include "rpc/httpd.h"
#include "common/mem.h"
#include "common/metrics.h"
#include "worker/node_metrics.h"
#include "tests/testutil.h"

/* ---- the registry ---------------------------------------------------------------------------- */

static char *render(fy_metrics_t *r)
{
    char *t;
    size_t len;
    assert_int_equal(fy_metrics_render(r, &t, &len), FY_OK);
    assert_int_equal(strlen(t), len);
    return t;
}

static void test_render_exact(void **state)
{
    fy_metrics_t *r;
    assert_int_equal(fy_metrics_create(&r), FY_OK);
    fy_metric_t *c, *g1, *g2, *h;
    assert_int_equal(fy_metrics_counter(r, "ferry:prompt_tokens_total", "Prompt tokens.", NULL, &c), FY_OK);
    assert_int_equal(fy_metrics_gauge(r, "ferry:kv_blocks", "Blocks \\ by state\nand tier.",
                                      (const char *const[]){"tier", "device", "state", "free", NULL}, &g1),
                     FY_OK);
    assert_int_equal(fy_metrics_gauge(r, "ferry:kv_blocks", "Blocks \\ by state\nand tier.",
                                      (const char *const[]){"tier", "a\"b\\c\nd", "state", "used", NULL}, &g2),
                     FY_OK);
    const double b[] = {0.1, 0.5, 2.5};
    assert_int_equal(fy_metrics_histogram(r, "ferry:x_seconds", "X.", (const char *const[]){"k", "v", NULL}, b, 3, &h),
                     FY_OK);
    fy_metric_add(c, 368640);
    fy_metric_add(c, 1e12);
    fy_metric_inc(c);
    fy_metric_add(c, -5); /* ignored: counters do not go down */
    fy_metric_set(g1, 91);
    fy_metric_set(g2, 0.25);
    fy_metric_observe(h, 0.05);
    fy_metric_observe(h, 0.1); /* on a bound: that bucket */
    fy_metric_observe(h, 1.0);
    const float more[] = {3.0f, 0.5f};
    fy_metric_observe_f32(h, more, 2);
    char *t = render(r);
    const char *want = "# HELP ferry:prompt_tokens_total Prompt tokens.\n"
                       "# TYPE ferry:prompt_tokens_total counter\n"
                       "ferry:prompt_tokens_total 1000000368641\n"
                       "# HELP ferry:kv_blocks Blocks \\\\ by state\\nand tier.\n"
                       "# TYPE ferry:kv_blocks gauge\n"
                       "ferry:kv_blocks{tier=\"device\",state=\"free\"} 91\n"
                       "ferry:kv_blocks{tier=\"a\\\"b\\\\c\\nd\",state=\"used\"} 0.25\n"
                       "# HELP ferry:x_seconds X.\n"
                       "# TYPE ferry:x_seconds histogram\n"
                       "ferry:x_seconds_bucket{k=\"v\",le=\"0.1\"} 2\n"
                       "ferry:x_seconds_bucket{k=\"v\",le=\"0.5\"} 3\n"
                       "ferry:x_seconds_bucket{k=\"v\",le=\"2.5\"} 4\n"
                       "ferry:x_seconds_bucket{k=\"v\",le=\"+Inf\"} 5\n"
                       "ferry:x_seconds_sum{k=\"v\"} 4.65\n"
                       "ferry:x_seconds_count{k=\"v\"} 5\n";
    if (strcmp(t, want)) fail_msg("rendered:\n%s\nexpected:\n%s", t, want);
    assert_int_equal(fy_metric_count(h), 5);
    assert_true(fy_metric_value(c) == 1000000368641.0);
    fy_free(t);
    fy_metrics_destroy(r);
}

/* A registry's own labels lead every series; a series may not name them
 * again; fy_metrics_sample finds samples by the labels it is given. */
static void test_const_labels_and_sample(void **state)
{
    (void)state;
    fy_metrics_t *r;
    fy_metric_t *c, *g, *h, *m = NULL;
    assert_int_equal(
        fy_metrics_create_labeled((const char *const[]){"model_name", "tiny \"m\"", "role", "router", NULL}, &r),
        FY_OK);
    assert_int_equal(fy_metrics_counter(r, "a_total", "A.", NULL, &c), FY_OK);
    assert_int_equal(fy_metrics_gauge(r, "b", "B.", (const char *const[]){"tenant", "x", NULL}, &g), FY_OK);
    const double bounds[] = {1, 2};
    assert_int_equal(fy_metrics_histogram(r, "h", "H.", NULL, bounds, 2, &h), FY_OK);
    fy_test_log_begin();
    assert_int_equal(fy_metrics_gauge(r, "b", "B.", (const char *const[]){"role", "x", NULL}, &m), FY_ERR_INVALID);
    assert_true(fy_test_log_has("given twice", NULL));
    fy_test_log_end();
    fy_metric_add(c, 3);
    fy_metric_set(g, 2.5);
    fy_metric_observe(h, 1.5);
    char *t = render(r);
    const char *want = "# HELP a_total A.\n# TYPE a_total counter\n"
                       "a_total{model_name=\"tiny \\\"m\\\"\",role=\"router\"} 3\n"
                       "# HELP b B.\n# TYPE b gauge\n"
                       "b{model_name=\"tiny \\\"m\\\"\",role=\"router\",tenant=\"x\"} 2.5\n"
                       "# HELP h H.\n# TYPE h histogram\n"
                       "h_bucket{model_name=\"tiny \\\"m\\\"\",role=\"router\",le=\"1\"} 0\n"
                       "h_bucket{model_name=\"tiny \\\"m\\\"\",role=\"router\",le=\"2\"} 1\n"
                       "h_bucket{model_name=\"tiny \\\"m\\\"\",role=\"router\",le=\"+Inf\"} 1\n"
                       "h_sum{model_name=\"tiny \\\"m\\\"\",role=\"router\"} 1.5\n"
                       "h_count{model_name=\"tiny \\\"m\\\"\",role=\"router\"} 1\n";
    assert_string_equal(t, want);
    double v = -1;
    assert_int_equal(fy_metrics_sample(t, "a_total", &v), FY_OK);
    assert_true(v == 3);
    assert_int_equal(fy_metrics_sample(t, "b{tenant=\"x\",role=\"router\"}", &v), FY_OK);
    assert_true(v == 2.5);
    assert_int_equal(fy_metrics_sample(t, "b{tenant=\"y\"}", &v), FY_ERR_NOT_FOUND);
    assert_int_equal(fy_metrics_sample(t, "h_bucket{le=\"2\"}", &v), FY_OK);
    assert_true(v == 1);
    assert_int_equal(fy_metrics_sample(t, "h_bucket{le=\"+Inf\"}", &v), FY_OK);
    assert_true(v == 1);
    assert_int_equal(fy_metrics_sample(t, "h_bucket{model_name=\"tiny \\\"m\\\"\",le=\"1\"}", &v), FY_OK);
    assert_true(v == 0);
    assert_int_equal(fy_metrics_sample(t, "h", &v), FY_ERR_NOT_FOUND); /* names match whole */
    assert_int_equal(fy_metrics_sample(t, "a_tota", &v), FY_ERR_NOT_FOUND);
    fy_free(t);
    fy_metrics_destroy(r);
    /* vLLM's 1-2-5 token buckets stop at the first bound past max */
    double b[40];
    int n = fy_metrics_buckets_125(1000, b, 40);
    assert_int_equal(n, 10);
    assert_true(b[0] == 1 && b[1] == 2 && b[2] == 5 && b[3] == 10 && b[9] == 1000);
    assert_int_equal(fy_metrics_buckets_125(8192, b, 40), 12); /* ... 5000 */
    assert_true(b[11] == 5000);
    assert_int_equal(fy_metrics_buckets_125(0, b, 40), 1);
    assert_int_equal(fy_metrics_buckets_125(1e30, b, 4), 4);
    /* inter-token latency resolves gaps under 10 ms (vLLM's first bound),
     * and keeps every bound of vLLM's, so its dashboards' quantiles hold */
    assert_int_equal(fy_metrics_create(&r), FY_OK);
    fy_metric_t *itl;
    assert_int_equal(fy_metrics_histogram(r, "itl", "", NULL, fy_metrics_itl_buckets, fy_metrics_n_itl_buckets, &itl),
                     FY_OK);
    fy_metric_observe(itl, 0.0004);
    fy_metric_observe(itl, 0.0018);
    fy_metric_observe(itl, 0.0042);
    fy_metric_observe(itl, 0.02);
    t = render(r);
    static const struct {
        const char *le;
        double n;
    } itl_want[] = {{"0.0005", 1}, {"0.001", 1}, {"0.002", 2}, {"0.005", 3}, {"0.01", 3}, {"0.025", 4}, {"80", 4}};
    for (size_t i = 0; i < sizeof(itl_want) / sizeof(itl_want[0]); i++) {
        char series[64];
        snprintf(series, sizeof(series), "itl_bucket{le=\"%s\"}", itl_want[i].le);
        if (fy_metrics_sample(t, series, &v) != FY_OK || v != itl_want[i].n)
            fail_msg("%s: %g, expected %g", series, v, itl_want[i].n);
    }
    static const double vllm_itl[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                      0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
    for (size_t i = 0, j = 0; i < sizeof(vllm_itl) / sizeof(vllm_itl[0]); i++) {
        while ((int)j < fy_metrics_n_itl_buckets && fy_metrics_itl_buckets[j] < vllm_itl[i]) j++;
        assert_true((int)j < fy_metrics_n_itl_buckets && fy_metrics_itl_buckets[j] == vllm_itl[i]);
    }
    fy_free(t);
    fy_metrics_destroy(r);
}

static void test_register_errors(void **state)
{
    fy_metrics_t *r;
    fy_metric_t *m = NULL;
    assert_int_equal(fy_metrics_create(&r), FY_OK);
    fy_test_log_begin();
    assert_int_equal(fy_metrics_counter(r, "ferry:requests", "no _total", NULL, &m), FY_ERR_INVALID);
    assert_int_equal(fy_metrics_gauge(r, "9lives", "bad name", NULL, &m), FY_ERR_INVALID);
    assert_int_equal(fy_metrics_gauge(r, "a-b", "bad name", NULL, &m), FY_ERR_INVALID);
    assert_int_equal(fy_metrics_gauge(r, "g", "", (const char *const[]){"a:b", "v", NULL}, &m), FY_ERR_INVALID);
    assert_int_equal(fy_metrics_gauge(r, "g", "", (const char *const[]){"__x", "v", NULL}, &m), FY_ERR_INVALID);
    assert_int_equal(fy_metrics_gauge(r, "g", "", (const char *const[]){"a", "1", "a", "2", NULL}, &m), FY_ERR_INVALID);
    const double up[] = {1, 2}, down[] = {2, 1};
    assert_int_equal(fy_metrics_histogram(r, "h", "", NULL, down, 2, &m), FY_ERR_INVALID);
    assert_int_equal(fy_metrics_histogram(r, "h", "", (const char *const[]){"le", "1", NULL}, up, 2, &m),
                     FY_ERR_INVALID);
    assert_int_equal(fy_metrics_gauge(r, "g", "G.", (const char *const[]){"a", "1", NULL}, &m), FY_OK);
    /* the same series twice, or the family with another type or help */
    assert_int_equal(fy_metrics_gauge(r, "g", "G.", (const char *const[]){"a", "1", NULL}, &m), FY_ERR_INVALID);
    assert_int_equal(fy_metrics_histogram(r, "g", "G.", NULL, up, 2, &m), FY_ERR_INVALID);
    assert_int_equal(fy_metrics_gauge(r, "g", "other help", (const char *const[]){"a", "2", NULL}, &m), FY_ERR_INVALID);
    assert_true(fy_test_log_has("already registered", NULL));
    fy_test_log_end();
    /* nothing half-registered shows */
    char *t = render(r);
    assert_string_equal(t, "# HELP g G.\n# TYPE g gauge\ng{a=\"1\"} 0\n");
    fy_free(t);
    /* NULL series are no-ops */
    fy_metric_inc(NULL);
    fy_metric_observe(NULL, 1);
    fy_metrics_destroy(r);
}

enum { N_THREADS = 4, N_INCS = 50000 };

typedef struct inc_arg {
    fy_metric_t *c, *g, *h;
    fy_metrics_t *r;
} inc_arg_t;

static void *incr(void *p)
{
    inc_arg_t *a = p;
    for (int i = 0; i < N_INCS; i++) {
        fy_metric_inc(a->c);
        fy_metric_add(a->g, 0.5);
        fy_metric_observe(a->h, (double)(i % 4));
        if (i % 1000 == 0) {
            fy_metrics_batch_begin(a->r);
            fy_metric_add(a->g, -0.5);
            fy_metric_add(a->g, 0.5);
            fy_metrics_batch_end(a->r);
        }
    }
    return NULL;
}

static void test_concurrent(void **state)
{
    fy_metrics_t *r;
    assert_int_equal(fy_metrics_create(&r), FY_OK);
    inc_arg_t a = {.r = r};
    const double b[] = {0.5, 1.5, 2.5};
    assert_int_equal(fy_metrics_counter(r, "c_total", "", NULL, &a.c), FY_OK);
    assert_int_equal(fy_metrics_gauge(r, "g", "", NULL, &a.g), FY_OK);
    assert_int_equal(fy_metrics_histogram(r, "h", "", NULL, b, 3, &a.h), FY_OK);
    pthread_t th[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) assert_int_equal(pthread_create(&th[i], NULL, incr, &a), 0);
    for (int k = 0; k < 20; k++) { /* renders while they run: every histogram cut is consistent */
        char *t = render(r);
        double inf = tc_metric(t, "h_bucket{le=\"+Inf\"}"), count = tc_metric(t, "h_count");
        assert_true(inf == count);
        fy_free(t);
    }
    for (int i = 0; i < N_THREADS; i++) pthread_join(th[i], NULL);
    char *t = render(r);
    double n = (double)N_THREADS * N_INCS;
    assert_true(tc_metric(t, "c_total") == n);
    assert_true(tc_metric(t, "g") == n / 2);
    assert_true(tc_metric(t, "h_count") == n);
    assert_true(tc_metric(t, "h_bucket{le=\"0.5\"}") == n / 4);
    assert_true(tc_metric(t, "h_bucket{le=\"1.5\"}") == n / 2);
    assert_true(tc_metric(t, "h_sum") == n / 4 * (0 + 1 + 2 + 3));
    fy_free(t);
    fy_metrics_destroy(r);
}

/* ---- health rules --------------------------------------------------------------------------- */

static void test_health_rules(void **state)
{
    fy_health_t ok = {.role = "decode",
                      .worker = "decode-0",
                      .up = true,
                      .last_tick = 100.0,
                      .stall_s = 2.0,
                      .kv_balanced = true,
                      .kv_check = FY_OK,
                      .xfer = FY_OK,
                      .running = 3,
                      .kv_usage = 0.5};
    char body[512];
    assert_int_equal(fy_health_eval(&ok, 101.0, body, sizeof(body)), 200);
    assert_non_null(strstr(body, "\"status\":\"ok\""));
    assert_non_null(strstr(body, "\"running\":3"));
    struct {
        fy_health_t h;
        double now;
        const char *reason;
    } bad[] = {
        {ok, 103.0, "engine stalled"},        {ok, 101.0, "starting up or shutting down"},
        {ok, 101.0, "books do not balance"},  {ok, 101.0, "invariant check failed"},
        {ok, 101.0, "transfer engine stuck"}, {ok, 101.0, "transfer engine down"},
    };
    bad[1].h.up = false;
    bad[2].h.kv_balanced = false;
    bad[3].h.kv_check = FY_ERR_INTERNAL;
    bad[4].h.xfer = FY_ERR_TIMEOUT;
    bad[4].h.xfer_waited = 3.5;
    bad[5].h.xfer = FY_ERR_CANCELLED;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(fy_health_eval(&bad[i].h, bad[i].now, body, sizeof(body)), 503);
        if (!strstr(body, bad[i].reason) || !strstr(body, "\"status\":\"unavailable\""))
            fail_msg("case %zu: %s", i, body);
    }
    /* the first thing wrong is named: stalled before the transfer */
    fy_health_t both = bad[4].h;
    assert_int_equal(fy_health_eval(&both, 200.0, body, sizeof(body)), 503);
    assert_non_null(strstr(body, "engine stalled"));
}

/* ---- HTTP routes ----------------------------------------------------------------------------- */

static void say(void *arg, const char *path, fy_http_reply_t *reply)
{
    reply->body = (char *)arg;
    reply->body_len = strlen(arg);
}

static void test_httpd_routes(void **state)
{
    int port = tc_free_port();
    char url[64];
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", port);
    fy_httpd_t *a, *b;
    assert_int_equal(fy_httpd_create(url, &a), FY_OK);
    assert_int_equal(fy_httpd_port(a), port);
    assert_int_equal(fy_httpd_route(a, "/metrics", say, "metrics here"), FY_OK);
    /* a second holder of the same server (the router's API server) adds its own route */
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", port);
    assert_int_equal(fy_httpd_create(url, &b), FY_OK);
    assert_int_equal(fy_httpd_route(b, "/v1/models", say, "models here"), FY_OK);
    fy_test_log_begin();
    assert_int_equal(fy_httpd_route(b, "/metrics", say, "twice"), FY_ERR_INVALID);
    fy_test_log_end();
    char *body;
    assert_int_equal(tc_http(port, "GET", "/metrics", &body), 200);
    assert_string_equal(body, "metrics here");
    fy_free(body);
    assert_int_equal(tc_http(port, "GET", "/v1/models", &body), 200);
    assert_string_equal(body, "models here");
    fy_free(body);
    assert_int_equal(tc_http(port, "GET", "/nothing", NULL), 404);
    assert_int_equal(tc_http(port, "POST", "/metrics", NULL), 405);
    assert_int_equal(tc_http(port, "GET", "/metrics", NULL), 200); /* still serving */
    /* one holder goes: its routes go, the other's stay */
    fy_httpd_destroy(a);
    assert_int_equal(tc_http(port, "GET", "/metrics", NULL), 404);
    assert_int_equal(tc_http(port, "GET", "/v1/models", NULL), 200);
    fy_httpd_destroy(b);
    assert_int_equal(tc_http(port, "GET", "/v1/models", NULL), -1); /* nobody listens */
    fy_test_log_begin();
    assert_int_equal(fy_httpd_create("ipc:///tmp/x", &a), FY_ERR_INVALID);
    assert_int_equal(fy_httpd_create("http://127.0.0.1:1/path", &a), FY_ERR_INVALID);
    fy_test_log_end();
}

/* ---- a real cluster -------------------------------------------------------------------------- */

/* Every sample line belongs to a family whose # TYPE came before it, and
 * its value parses; a histogram's buckets never decrease and end in +Inf
 * equal to its _count. */
static void expect_wellformed(const char *text, const char *who)
{
    char fam[128] = "", type[16] = "";
    double last_bucket = -1;
    for (const char *p = text; *p;) {
        const char *e = strchr(p, '\n');
        if (!e) fail_msg("%s: the text does not end in a newline", who);
        char line[1024];
        size_t n = (size_t)(e - p) < sizeof(line) - 1 ? (size_t)(e - p) : sizeof(line) - 1;
        memcpy(line, p, n);
        line[n] = 0;
        p = e + 1;
        if (!strncmp(line, "# HELP ", 7)) continue;
        if (!strncmp(line, "# TYPE ", 7)) {
            if (sscanf(line + 7, "%127s %15s", fam, type) != 2) fail_msg("%s: bad line '%s'", who, line);
            last_bucket = -1;
            continue;
        }
        size_t fl = strlen(fam);
        if (!fl || strncmp(line, fam, fl)) fail_msg("%s: '%s' outside its family (%s)", who, line, fam);
        const char *rest = line + fl;
        bool hist = !strcmp(type, "histogram");
        if (hist && !strncmp(rest, "_bucket{", 8)) {
            double v = strtod(strrchr(line, ' ') + 1, NULL);
            if (v < last_bucket) fail_msg("%s: buckets decrease at '%s'", who, line);
            last_bucket = v;
        } else if (!(rest[0] == ' ' || rest[0] == '{' ||
                     (hist && (!strncmp(rest, "_sum", 4) || !strncmp(rest, "_count", 6)))))
            fail_msg("%s: '%s' is not a sample of %s", who, line, fam);
        if (hist && !strncmp(rest, "_count", 6) && strtod(strrchr(line, ' ') + 1, NULL) != last_bucket)
            fail_msg("%s: _count differs from the +Inf bucket at '%s'", who, line);
        const char *v = strrchr(line, ' ');
        char *end;
        if (!v) fail_msg("%s: no value in '%s'", who, line);
        strtod(v + 1, &end);
        if (*end) fail_msg("%s: bad value in '%s'", who, line);
    }
}

static char *scrape(tc_cluster_t *c, int w)
{
    char *body;
    int st = tc_http(c->metrics_port[w], "GET", "/metrics", &body);
    if (st != 200) {
        tc_print_logs(c);
        fail_msg("worker %d: /metrics answered %d", w, st);
    }
    return body;
}

typedef struct watch {
    int port;
    volatile bool stop;
    int n_ok, n_stalled, n_other;
    char other[256];
} watch_t;

static void *watch_health(void *p)
{
    watch_t *w = p;
    while (!w->stop) {
        char *body;
        int st = tc_http(w->port, "GET", "/health", &body);
        if (st == 200)
            w->n_ok++;
        else if (st == 503 && body && strstr(body, "engine stalled"))
            w->n_stalled++;
        else if (st != 503) { /* 503 for the transfer ping is possible at a 50 ms limit too */
            w->n_other++;
            snprintf(w->other, sizeof(w->other), "%d %s", st, body ? body : "");
        }
        fy_free(body);
        usleep(5000);
    }
    return NULL;
}

enum { N_REQ = 8 };

static void test_cluster_metrics(void **state)
{
    if (!tc_available()) skip();
    tc_cluster_t c;
    /* the prefill worker's stall limit (50 ms) is shorter than one step of a
     * 256-token chunk, so its /health must go 503 while it computes */
    tc_opts_t o = {.n_prefill = 1, .n_decode = 1, .metrics = true, .per_worker = {{"worker.stall_timeout=50ms"}}};
    tc_start(&c, &o);
    int P = 0, D = 1; /* worker indexes */
    char *body;
    /* idle, both are healthy; with a 50-ms limit one late tick of an idle
     * engine on a loaded machine reads as a stall, so look a few times */
    for (int w = 0; w < 2; w++) {
        int st = 0;
        for (int tries = 0; tries < 20 && st != 200; tries++) {
            if (tries) usleep(100000);
            body = NULL;
            st = tc_http(c.metrics_port[w], "GET", "/health", &body);
            if (st != 200 && tries < 19) fy_free(body);
        }
        if (st != 200) fail_msg("worker %d: /health %d %s", w, st, body ? body : "");
        fy_free(body);
    }
    char *t0 = scrape(&c, D);
    double free0 = tc_metric(t0, "ferry:kv_blocks{tier=\"device\",state=\"free\"}");
    fy_free(t0);

    static int32_t prompts[N_REQ][700];
    int32_t lens[N_REQ], maxt[N_REQ];
    uint64_t seed = 77;
    double sum_prompt = 0, sum_gen = 0, sum_itl = 0;
    for (int i = 0; i < N_REQ; i++) {
        lens[i] = i == 0 ? 600 : 9 + 37 * i;
        maxt[i] = 4 + i;
        for (int32_t k = 0; k < lens[i]; k++) prompts[i][k] = 100 + (int32_t)(fy_test_rand_u64(&seed) % 40000);
        if (i == 3) memcpy(prompts[i], prompts[2], sizeof(int32_t) * (size_t)lens[2]); /* a prefix hit */
        sum_prompt += lens[i];
        sum_gen += maxt[i];
        sum_itl += maxt[i] - 1;
    }
    watch_t wt = {.port = c.metrics_port[P]};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, watch_health, &wt), 0);
    fy_client_stream_t s[N_REQ];
    static tc_result_t res[N_REQ];
    memset(res, 0, sizeof(res));
    for (int i = 0; i < N_REQ; i++) {
        fy_client_req_t q = {.tokens = prompts[i], .n_tokens = lens[i]};
        fy_genspec_default(&q.gen);
        q.gen.max_tokens = maxt[i];
        q.gen.ignore_eos = true;
        char err[256];
        fy_status_t st = fy_client_generate(c.client, &q, &s[i], err, sizeof(err));
        if (st) fail_msg("generate refused: %s", err);
        if (i == 2) tc_collect(&c, &s[2], &res[2], 1, 60); /* its blocks are cached before 3 asks */
    }
    tc_collect(&c, s, res, N_REQ, 120);
    for (int i = 0; i < N_REQ; i++)
        if (res[i].error || res[i].n != maxt[i]) fail_msg("request %d: %s, %d tokens", i, res[i].message, res[i].n);

    /* counters are copied on the engine tick: wait for the last copy */
    char *tp = NULL, *td = NULL;
    double t_start = fy_now_s();
    for (;;) {
        fy_free(tp);
        fy_free(td);
        tp = scrape(&c, P);
        td = scrape(&c, D);
        if (tc_metric(td, "ferry:engine_generation_tokens_total") == sum_gen &&
            tc_metric(td, "ferry:kv_blocks{tier=\"device\",state=\"used\"}") == 0 &&
            tc_metric(tp, "ferry:engine_prompt_tokens_total") == sum_prompt)
            break;
        if (fy_now_s() - t_start > 30) { /* a bound for a loaded machine under a sanitizer; done in ms when quiet */
            double gen = tc_metric(td, "ferry:engine_generation_tokens_total"),
                   used = tc_metric(td, "ferry:kv_blocks{tier=\"device\",state=\"used\"}"),
                   prompt = tc_metric(tp, "ferry:engine_prompt_tokens_total");
            fy_free(tp);
            fy_free(td);
            fail_msg("the counters did not settle in 30 s: decode generation tokens %.0f (want %.0f), decode blocks "
                     "used %.0f (want 0), prefill prompt tokens %.0f (want %.0f)",
                     gen, sum_gen, used, prompt, sum_prompt);
        }
        usleep(20000);
    }
    wt.stop = true;
    pthread_join(th, NULL);
    expect_wellformed(tp, "prefill");
    expect_wellformed(td, "decode");

    /* prefill: every prompt token arrived; the prefix hit was not computed */
    double hits = tc_metric(tp, "ferry:prefix_cache_hits_total");
    assert_true(tc_metric(tp, "ferry:engine_prompt_tokens_total") == sum_prompt);
    assert_true(hits >= 16);
    assert_true(tc_metric(tp, "ferry:engine_prompt_tokens_computed_total") == sum_prompt - hits);
    assert_true(tc_metric(tp, "ferry:prefix_cache_queries_total") == sum_prompt);
    assert_true(tc_metric(tp, "ferry:engine_generation_tokens_total") == N_REQ); /* the first token of each */
    assert_true(tc_metric(tp, "ferry:prefill_time_to_first_token_seconds_count") == N_REQ);
    assert_true(tc_metric(tp, "ferry:prefill_queue_time_seconds_count") == N_REQ);
    assert_true(tc_metric(tp, "ferry:prefill_job_latency_seconds_count") == N_REQ);
    assert_true(tc_metric(tp, "ferry:kv_transfer_seconds_count") == N_REQ);
    assert_true(tc_metric(tp, "ferry:prefill_jobs_total{outcome=\"ok\"}") == N_REQ);
    assert_true(tc_metric(tp, "ferry:kv_transfer_jobs_total{result=\"ok\"}") == N_REQ);
    assert_true(tc_metric(tp, "ferry:kv_transfer_bytes_total") > 0);
    assert_true(tc_metric(tp, "ferry:prefill_time_to_first_token_seconds_sum") > 0);
    assert_true(tc_metric(tp, "ferry:kv_blocks{tier=\"device\",state=\"used\"}") == 0);
    assert_true(tc_metric(tp, "ferry:spec_decode_num_draft_tokens_total") == 0);
    /* decode: prompts arrive by adoption (computed elsewhere), every token after the first is sampled here */
    assert_true(tc_metric(td, "ferry:engine_prompt_tokens_total") == sum_prompt);
    assert_true(tc_metric(td, "ferry:engine_prompt_tokens_computed_total") == 0);
    assert_true(tc_metric(td, "ferry:engine_generation_tokens_total") == sum_gen);
    assert_true(tc_metric(td, "ferry:decode_request_latency_seconds_count") == N_REQ);
    assert_true(tc_metric(td, "ferry:decode_inter_token_latency_seconds_count") == sum_itl);
    assert_true(tc_metric(td, "ferry:kv_lease_wait_seconds_count") == N_REQ);
    assert_true(tc_metric(td, "ferry:decode_request_success_total{finished_reason=\"length\"}") == N_REQ);
    assert_true(tc_metric(td, "ferry:kv_leases_expired_total") == 0);
    assert_true(tc_metric(td, "ferry:kv_leases") == 0);
    assert_true(tc_metric(td, "ferry:engine_num_requests_running") == 0);
    assert_true(tc_metric(td, "ferry:kv_cache_usage_perc") == 0);
    /* every series names the model and the role; the cache's shape is in cache_config_info */
    assert_true(
        tc_metric(tp, "ferry:kv_cache_usage_perc{role=\"prefill\",model_name=\"SmolLM2-135M-Instruct.Q4_1\"}") == 0);
    assert_true(tc_metric(td, "ferry:kv_cache_usage_perc{role=\"decode\",model_name=\"SmolLM2-135M-Instruct.Q4_1\"}") ==
                0);
    for (int w = 0; w < 2; w++) {
        const char *t = w ? td : tp;
        double total = tc_metric(t, "ferry:kv_blocks{tier=\"device\",state=\"free\"}") +
                       tc_metric(t, "ferry:kv_blocks{tier=\"device\",state=\"used\"}") +
                       tc_metric(t, "ferry:kv_blocks{tier=\"device\",state=\"cached\"}");
        char want[256];
        snprintf(want, sizeof(want), "ferry:cache_config_info{block_size=\"16\",num_gpu_blocks=\"%.0f\"}", total);
        assert_true(tc_metric(t, want) == 1);
        for (const char *p = t; (p = strchr(p, '\n')) != NULL;) { /* no sample without both labels */
            p++;
            if (*p == '#' || !*p) continue;
            if (strncmp(p, "ferry:", 6) || !strstr(p, "model_name=\"SmolLM2-135M-Instruct.Q4_1\"") ||
                !strstr(p, w ? "role=\"decode\"" : "role=\"prefill\""))
                fail_msg("a sample without model_name or role: %.120s", p);
        }
    }
    /* tokens per step: the prefill steps fed every prompt token less the hits; the decode steps fed each
     * token but the last (the first came by adoption) and the speculative drafts */
    assert_true(tc_metric(tp, "ferry:iteration_tokens_sum") == sum_prompt - hits);
    /* a verification step feeds its drafts too, and keeps the accepted ones */
    double drafted = tc_metric(td, "ferry:spec_decode_num_draft_tokens_total");
    double accepted = tc_metric(td, "ferry:spec_decode_num_accepted_tokens_total");
    assert_true(tc_metric(td, "ferry:iteration_tokens_sum") == sum_itl + drafted - accepted);
    assert_true(tc_metric(tp, "ferry:iteration_tokens_count") == tc_metric(tp, "ferry:engine_steps_total"));
    assert_true(tc_metric(td, "ferry:iteration_tokens_count") == tc_metric(td, "ferry:engine_steps_total"));
    /* blocks went back: free again, or cached for the prefix cache */
    double free1 = tc_metric(td, "ferry:kv_blocks{tier=\"device\",state=\"free\"}");
    double cached1 = tc_metric(td, "ferry:kv_blocks{tier=\"device\",state=\"cached\"}");
    assert_true(free1 + cached1 == free0);
    assert_true(tc_metric(td, "ferry:kv_blocks{tier=\"device\",state=\"promised\"}") == 0);
    fy_free(tp);
    fy_free(td);

    /* the prefill engine was seen stalled (a step longer than 50 ms), then healthy again */
    print_message("prefill /health during the run: %d ok, %d engine stalled\n", wt.n_ok, wt.n_stalled);
    if (wt.n_other) fail_msg("unexpected /health answer: %s", wt.other);
    assert_true(wt.n_stalled > 0);
    for (int w = 0; w < 2; w++) {
        int st = 0;
        for (double t1 = fy_now_s(); fy_now_s() - t1 < 5;) { /* the transfer ping may still be settling */
            if ((st = tc_http(c.metrics_port[w], "GET", "/health", NULL)) == 200) break;
            usleep(20000);
        }
        assert_int_equal(st, 200);
    }
    /* bad requests are refused and the worker keeps serving */
    assert_int_equal(tc_http(c.metrics_port[D], "POST", "/metrics", NULL), 405);
    assert_int_equal(tc_http(c.metrics_port[D], "GET", "/metrics/x", NULL), 404);
    assert_int_equal(tc_http(c.metrics_port[D], "GET", "/", NULL), 404);
    assert_int_equal(tc_http(c.metrics_port[D], "GET", "/health", NULL), 200);
    tc_stop(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_render_exact),    cmocka_unit_test(test_const_labels_and_sample),
        cmocka_unit_test(test_register_errors), cmocka_unit_test(test_concurrent),
        cmocka_unit_test(test_health_rules),    cmocka_unit_test(test_httpd_routes),
        cmocka_unit_test(test_cluster_metrics),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

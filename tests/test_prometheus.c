/*
 * test_prometheus.c - the Grafana dashboard (docs/grafana/ferry.json)
 * against a real Prometheus: a cluster (router with its HTTP API, one
 * prefill and one decode worker, router.served_model_name set) scraped
 * every second by the prometheus binary (Debian's package) on a loopback
 * port; a known number of requests; then every query of the dashboard,
 * its variables substituted, is valid PromQL that returns data, and the
 * totals panels return what the test sent (requests, prompt and generated
 * tokens, TTFT observations).  Also: every target carries the configured
 * model_name, and a sum over the whole job of the router's series counts
 * each token once (workers' figures have their own names).
 *
 * vLLM's dashboard: a second job scrapes the same targets with the
 * relabelling docs/operations.md gives ("vLLM's Grafana dashboards on
 * ferry", read from its yaml block), and every query vLLM's published
 * dashboard makes (examples/observability/prometheus_grafana/grafana.json
 * in vLLM's repository: its metric names and query shapes, written out
 * below) returns data, the totals what the test sent, and no ferry: name
 * is left in that job.
 *
 * Not here: the exposition text itself (test_metrics.c), the router's
 * series one by one (test_http.c).  Skips with a message where the
 * prometheus binary ($FERRY_PROMETHEUS, else prometheus on PATH) or the
 * model is missing.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "common/clock.h"
#include "tests/cluster_util.h"
#include "common/genspec.h"
#include "common/mem.h"
#include "tests/testutil.h"

#define DASHBOARD "docs/grafana/ferry.json"
#define OPERATIONS "docs/operations.md"
#define MODEL_NAME "ferry-test-model"
enum { N_REQ = 5 };

/* The prometheus binary, or NULL. */
static const char *prometheus_bin(char *buf, size_t cap)
{
    const char *env = getenv("FERRY_PROMETHEUS");
    if (env && *env) return access(env, X_OK) == 0 ? env : NULL;
    const char *path = getenv("PATH");
    if (!path) path = "/usr/bin:/bin";
    while (*path) {
        size_t n = strcspn(path, ":");
        if (n && (size_t)snprintf(buf, cap, "%.*s/prometheus", (int)n, path) < cap && access(buf, X_OK) == 0)
            return buf;
        path += n + (path[n] == ':');
    }
    return NULL;
}

static pid_t prom_start(const char *bin, const char *dir, int port)
{
    char conf[600], data[600], log[600], listen[64], cflag[640], dflag[640];
    snprintf(conf, sizeof(conf), "%s/prometheus.yml", dir);
    snprintf(data, sizeof(data), "%s/prometheus-data", dir);
    snprintf(log, sizeof(log), "%s/prometheus.log", dir);
    snprintf(listen, sizeof(listen), "--web.listen-address=127.0.0.1:%d", port);
    snprintf(cflag, sizeof(cflag), "--config.file=%s", conf);
    snprintf(dflag, sizeof(dflag), "--storage.tsdb.path=%s", data);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives the test */
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execl(bin, bin, cflag, dflag, listen, "--log.level=warn", "--storage.tsdb.retention.time=1h", (char *)NULL);
        _exit(127);
    }
    return pid;
}

static void prom_stop(pid_t pid)
{
    if (pid <= 0) return;
    kill(pid, SIGTERM);
    for (double t0 = fy_now_s(); fy_now_s() - t0 < 10;) {
        if (waitpid(pid, NULL, WNOHANG) == pid) return;
        usleep(20000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

static void url_encode(const char *s, char *out, size_t cap)
{
    size_t n = 0;
    for (; *s && n + 4 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || strchr("-_.~", c))
            out[n++] = (char)c;
        else
            n += (size_t)snprintf(out + n, cap - n, "%%%02X", c);
    }
    assert_true(!*s); /* it fit */
    out[n] = 0;
}

/* An instant query over the HTTP API: false when Prometheus says it is not
 * valid (err gets why); else the number of series and the first's value. */
static bool prom_query(int port, const char *expr, int *n_p, double *v_p, char *err, size_t cap)
{
    static char body[16384];
    url_encode(expr, body + 6, sizeof(body) - 6);
    memcpy(body, "query=", 6);
    int fd = tc_http_dial(port, 5);
    assert_true(fd >= 0);
    tc_http_send(fd, "POST", "/api/v1/query", NULL, "application/x-www-form-urlencoded", body, strlen(body));
    tc_http_resp_t r;
    int status = tc_http_read(fd, &r);
    close(fd);
    json_error_t je;
    json_t *j = r.body ? json_loads(r.body, 0, &je) : NULL;
    const char *st = json_string_value(json_object_get(j, "status"));
    bool ok = status == 200 && st && !strcmp(st, "success");
    if (!ok) {
        snprintf(err, cap, "%d %s", status, r.body ? r.body : "");
    } else {
        json_t *res = json_object_get(json_object_get(j, "data"), "result");
        *n_p = json_is_array(res) ? (int)json_array_size(res) : 0;
        *v_p = 0;
        if (*n_p > 0) {
            const char *v = json_string_value(json_array_get(json_object_get(json_array_get(res, 0), "value"), 1));
            *v_p = v ? strtod(v, NULL) : 0;
        }
    }
    json_decref(j);
    tc_http_free(&r);
    return ok;
}

/* Waits (up to timeout_s) until expr's first series reads want. */
static bool prom_wait_value(int port, const char *expr, double want, double timeout_s, double *got_p)
{
    char err[512];
    int n = 0;
    double v = -1;
    for (double t0 = fy_now_s(); fy_now_s() - t0 < timeout_s; usleep(250000)) {
        if (!prom_query(port, expr, &n, &v, err, sizeof(err))) fail_msg("query %s: %s", expr, err);
        if (n > 0 && v == want) break;
    }
    *got_p = n > 0 ? v : -1;
    return n > 0 && v == want;
}

/* The dashboard's variables as Grafana would fill them in for a view of
 * the last few minutes. */
static void substitute(const char *expr, char *out, size_t cap)
{
    static const char *const vars[][2] = {
        {"${model_name}", MODEL_NAME}, {"$model_name", MODEL_NAME}, {"$__rate_interval", "1m"},
        {"$__interval", "2s"},         {"$__range", "5m"},
    };
    size_t n = 0;
    while (*expr) {
        bool hit = false;
        for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]) && !hit; i++) {
            size_t l = strlen(vars[i][0]);
            if (!strncmp(expr, vars[i][0], l)) {
                n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, "%s", vars[i][1]);
                expr += l;
                hit = true;
            }
        }
        if (!hit && n + 1 < cap)
            out[n++] = *expr++;
        else if (!hit)
            expr++;
        assert_true(n + 1 < cap);
    }
    out[n] = 0;
    if (strchr(out, '$')) fail_msg("a variable the test does not know in: %s", out);
}

/* The metric_relabel_configs of docs/operations.md's vLLM job, as written
 * there (indented for a job of scrape_configs), into out[cap]. */
static void vllm_relabel_rules(char *out, size_t cap)
{
    size_t len = 0;
    char *doc = fy_test_read_file(OPERATIONS, &len);
    if (!doc) fail_msg("cannot read %s", OPERATIONS);
    const char *from = strstr(doc, "    metric_relabel_configs:\n");
    const char *to = from ? strstr(from, "```") : NULL;
    if (!from || !to) fail_msg("%s has no yaml block with metric_relabel_configs", OPERATIONS);
    if ((size_t)(to - from) >= cap) fail_msg("the relabel rules are longer than %zu bytes", cap);
    memcpy(out, from, (size_t)(to - from));
    out[to - from] = 0;
    assert_non_null(strstr(out, "vllm:"));
    fy_free(doc);
}

/* The queries of vLLM's dashboard, by the shape each panel uses: 0 the
 * quantiles over a histogram's buckets (and the mean: rate of _sum over
 * rate of _count), 1 a rate, 2 the value, 3 the buckets' increase by le
 * (a heatmap), 4 the increase by finished_reason. */
static const struct {
    int shape;
    const char *metric;
} VLLM_QUERIES[] = {
    {0, "vllm:e2e_request_latency_seconds"},
    {1, "vllm:prompt_tokens_total"},
    {1, "vllm:generation_tokens_total"},
    {0, "vllm:inter_token_latency_seconds"},
    {2, "vllm:num_requests_running"},
    {2, "vllm:num_requests_waiting"},
    {0, "vllm:time_to_first_token_seconds"},
    {2, "vllm:kv_cache_usage_perc"},
    {3, "vllm:request_prompt_tokens"},
    {3, "vllm:request_generation_tokens"},
    {4, "vllm:request_success_total"},
    {1, "vllm:request_queue_time_seconds_sum"},
    {1, "vllm:request_prefill_time_seconds_sum"},
    {1, "vllm:request_decode_time_seconds_sum"},
    {1, "vllm:request_max_num_generation_tokens_sum"},
};

/* Query k of shape s for metric m, as the dashboard writes it (its
 * variables filled in as substitute() does). */
static bool vllm_query(int shape, const char *m, int k, char *out, size_t cap)
{
    static const double q[] = {0.99, 0.95, 0.9, 0.5};
    const char *sel = "{model_name=\"" MODEL_NAME "\"}[1m]";
    switch (shape) {
    case 0:
        if (k < 4)
            snprintf(out, cap, "histogram_quantile(%g, sum by(le) (rate(%s_bucket%s)))", q[k], m, sel);
        else if (k == 4)
            snprintf(out, cap, "rate(%s_sum%s)\n/\nrate(%s_count%s)", m, sel, m, sel);
        return k <= 4;
    case 1: snprintf(out, cap, "rate(%s%s)", m, sel); return k == 0;
    case 2: snprintf(out, cap, "%s{model_name=\"" MODEL_NAME "\"}", m); return k == 0;
    case 3: snprintf(out, cap, "sum by(le) (increase(%s_bucket%s))", m, sel); return k == 0;
    default: snprintf(out, cap, "sum by(finished_reason) (increase(%s%s))", m, sel); return k == 0;
    }
}

typedef struct target {
    char panel[128];
    char expr[2048];
} target_t;

/* Every target of every panel (rows' nested panels too). */
static int dashboard_targets(target_t *t, int cap)
{
    json_error_t je;
    json_t *d = json_load_file(DASHBOARD, 0, &je);
    if (!d) fail_msg("%s: %s (line %d)", DASHBOARD, je.text, je.line);
    /* the model_name variable exists: every panel filters on it */
    bool var = false;
    json_t *v;
    size_t i;
    json_array_foreach(json_object_get(json_object_get(d, "templating"), "list"), i, v)
    {
        const char *name = json_string_value(json_object_get(v, "name"));
        var |= name && !strcmp(name, "model_name");
    }
    assert_true(var);
    int n = 0;
    json_t *panels = json_object_get(d, "panels"), *p;
    json_array_foreach(panels, i, p)
    {
        json_t *lists[2] = {json_object_get(p, "targets"), json_object_get(p, "panels")};
        json_t *sub;
        size_t k;
        json_t *flat[64];
        int n_flat = 0;
        flat[n_flat++] = p;
        json_array_foreach(lists[1], k, sub) if (n_flat < 64) flat[n_flat++] = sub;
        for (int f = 0; f < n_flat; f++) {
            json_t *tg;
            size_t j;
            json_array_foreach(json_object_get(flat[f], "targets"), j, tg)
            {
                const char *e = json_string_value(json_object_get(tg, "expr"));
                if (!e) continue;
                assert_true(n < cap);
                snprintf(t[n].panel, sizeof(t[n].panel), "%s", json_string_value(json_object_get(flat[f], "title")));
                if (!strstr(e, "$model_name")) fail_msg("panel '%s': a query without $model_name: %s", t[n].panel, e);
                substitute(e, t[n].expr, sizeof(t[n].expr));
                n++;
            }
        }
    }
    json_decref(d);
    return n;
}

static const char *panel_expr(const target_t *t, int n, const char *title)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(t[i].panel, title)) return t[i].expr;
    fail_msg("the dashboard has no panel '%s'", title);
    return NULL;
}

static void test_dashboard_queries(void **state)
{
    (void)state;
    char buf[1024];
    const char *bin = prometheus_bin(buf, sizeof(buf));
    if (!bin) {
        print_message("skipped: no prometheus binary (apt-get install prometheus, or set FERRY_PROMETHEUS)\n");
        skip();
    }
    if (!tc_available()) skip();
    if (access(DASHBOARD, R_OK)) {
        print_message("skipped: no %s here (run from the repository root)\n", DASHBOARD);
        skip();
    }
    static target_t targets[256];
    int n_targets = dashboard_targets(targets, 256);
    assert_true(n_targets > 20);

    int http_port = tc_free_port(), prom_port = tc_free_port();
    while (prom_port == http_port) prom_port = tc_free_port();
    char http_set[128];
    snprintf(http_set, sizeof(http_set), "router.http=http://127.0.0.1:%d", http_port);
    tc_cluster_t c;
    tc_opts_t o = {
        .n_prefill = 1, .n_decode = 1, .metrics = true, .common = {http_set, "router.served_model_name=" MODEL_NAME}};
    tc_start(&c, &o);

    static char yml[8192], rules[4096];
    char path[600];
    vllm_relabel_rules(rules, sizeof(rules));
    snprintf(yml, sizeof(yml),
             "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
             "scrape_configs:\n  - job_name: ferry\n    static_configs:\n"
             "      - targets: [\"127.0.0.1:%d\", \"127.0.0.1:%d\", \"127.0.0.1:%d\"]\n"
             "  - job_name: vllm\n    static_configs:\n"
             "      - targets: [\"127.0.0.1:%d\", \"127.0.0.1:%d\", \"127.0.0.1:%d\"]\n%s",
             http_port, c.metrics_port[0], c.metrics_port[1], http_port, c.metrics_port[0], c.metrics_port[1], rules);
    snprintf(path, sizeof(path), "%s/prometheus.yml", c.dir);
    assert_true(fy_test_write_file(path, yml, strlen(yml)));
    pid_t prom = prom_start(bin, c.dir, prom_port);

    /* ready, and every target scraped once */
    int st = 0;
    for (double t0 = fy_now_s(); fy_now_s() - t0 < 30 && st != 200; usleep(100000))
        st = tc_http(prom_port, "GET", "/-/ready", NULL);
    if (st != 200) {
        prom_stop(prom);
        fail_msg("prometheus did not get ready in 30 s (see %s/prometheus.log)", c.dir);
    }
    double got;
    if (!prom_wait_value(prom_port, "sum(up{job=\"ferry\"})", 3, 20, &got) ||
        !prom_wait_value(prom_port, "sum(up{job=\"vllm\"})", 3, 20, &got)) {
        prom_stop(prom);
        fail_msg("prometheus sees %.0f of 3 targets up", got);
    }

    /* the requests: known prompt and generated lengths */
    static int32_t prompts[N_REQ][200];
    int32_t lens[N_REQ], maxt[N_REQ];
    double sum_prompt = 0, sum_gen = 0;
    uint64_t seed = 17;
    fy_client_stream_t s[N_REQ];
    static tc_result_t res[N_REQ];
    memset(res, 0, sizeof(res));
    for (int i = 0; i < N_REQ; i++) {
        lens[i] = 20 + 31 * i;
        maxt[i] = 3 + 2 * i;
        for (int32_t k = 0; k < lens[i]; k++) prompts[i][k] = 100 + (int32_t)(fy_test_rand_u64(&seed) % 20000);
        sum_prompt += lens[i];
        sum_gen += maxt[i];
        fy_client_req_t q = {.tokens = prompts[i], .n_tokens = lens[i]};
        fy_genspec_default(&q.gen);
        q.gen.max_tokens = maxt[i];
        q.gen.ignore_eos = true;
        char err[256];
        if (fy_client_generate(c.client, &q, &s[i], err, sizeof(err))) fail_msg("generate refused: %s", err);
    }
    tc_collect(&c, s, res, N_REQ, 60);
    for (int i = 0; i < N_REQ; i++)
        if (res[i].error || res[i].n != maxt[i]) fail_msg("request %d: %s, %d tokens", i, res[i].message, res[i].n);

    /* the totals panels return what was sent (the next scrapes bring them in) */
    static const struct {
        const char *title;
        int what; /* 0 requests, 1 generated, 2 prompt */
    } totals[] = {
        {"Requests finished", 0}, {"Requests with a first token", 0}, {"Generated tokens", 1}, {"Prompt tokens", 2}};
    for (size_t i = 0; i < sizeof(totals) / sizeof(totals[0]); i++) {
        const char *e = panel_expr(targets, n_targets, totals[i].title);
        double want = totals[i].what == 0 ? N_REQ : totals[i].what == 1 ? sum_gen : sum_prompt;
        if (!prom_wait_value(prom_port, e, want, 15, &got)) {
            prom_stop(prom);
            fail_msg("panel '%s': %s gives %g, sent %g", totals[i].title, e, got, want);
        }
    }
    /* a sum over the whole job, no role chosen, counts each token once */
    assert_true(prom_wait_value(prom_port, "sum(ferry:generation_tokens_total{job=\"ferry\"})", sum_gen, 5, &got));
    assert_true(prom_wait_value(prom_port, "sum(ferry:request_success_total{job=\"ferry\"})", N_REQ, 5, &got));
    /* every target names the configured model */
    assert_true(prom_wait_value(prom_port, "count(count by (instance) ({job=\"ferry\",model_name=\"" MODEL_NAME "\"}))",
                                3, 5, &got));
    assert_true(
        prom_wait_value(prom_port, "count(count by (model_name) ({job=\"ferry\",model_name!=\"\"}))", 1, 5, &got));

    /* the vLLM job: vLLM's names, ferry's figures, no ferry: name left */
    static const struct {
        const char *expr;
        int what; /* 0 requests, 1 generated, 2 prompt */
    } vtotals[] = {
        {"sum(vllm:request_success_total{job=\"vllm\"})", 0},
        {"sum(vllm:generation_tokens_total{job=\"vllm\"})", 1},
        {"sum(vllm:prompt_tokens_total{job=\"vllm\"})", 2},
        {"sum(vllm:request_generation_tokens_sum{job=\"vllm\"})", 1},
        {"sum(vllm:request_max_num_generation_tokens_count{job=\"vllm\"})", 0},
        {"sum(vllm:request_max_num_generation_tokens_sum{job=\"vllm\"})", 1}, /* n = 1: each request's own */
        {"sum(vllm:time_to_first_token_seconds_count{job=\"vllm\"})", 0},
    };
    for (size_t i = 0; i < sizeof(vtotals) / sizeof(vtotals[0]); i++) {
        double want = vtotals[i].what == 0 ? N_REQ : vtotals[i].what == 1 ? sum_gen : sum_prompt;
        if (!prom_wait_value(prom_port, vtotals[i].expr, want, 5, &got)) {
            prom_stop(prom);
            fail_msg("%s gives %g, sent %g", vtotals[i].expr, got, want);
        }
    }
    {
        char err[512];
        int n = 0;
        double v;
        /* vLLM's _total name of the iteration histogram: the workers' steps */
        assert_true(
            prom_query(prom_port, "sum(vllm:iteration_tokens_total_count{job=\"vllm\"})", &n, &v, err, sizeof(err)));
        assert_true(n == 1 && v > 0);
        assert_true(prom_query(prom_port, "count({job=\"vllm\",__name__=~\"ferry:.+\"})", &n, &v, err, sizeof(err)));
        if (n) fail_msg("%.0f series of the vllm job keep a ferry: name", v);
    }

    /* every query of the dashboard is valid PromQL and returns data. A rate()
     * needs two scrapes of a series after it appears: with a 1 s interval a
     * fast run can query before a target's second scrape (CI saw the prefill
     * worker scraped once), so an empty answer is asked again until 20 s have
     * passed since the first query. */
    int empty = 0;
    double q0 = fy_now_s();
    for (int i = 0; i < n_targets; i++) {
        char err[1024];
        int n = 0;
        double v;
        for (;;) {
            if (!prom_query(prom_port, targets[i].expr, &n, &v, err, sizeof(err))) {
                prom_stop(prom);
                fail_msg("panel '%s': %s: %s", targets[i].panel, targets[i].expr, err);
            }
            if (n > 0 || fy_now_s() - q0 > 20) break;
            usleep(250000);
        }
        if (n == 0) {
            print_message("panel '%s': no data from %s\n", targets[i].panel, targets[i].expr);
            empty++;
        }
    }
    /* vLLM's dashboard, with the same grace for its rates */
    int n_vllm = 0;
    for (size_t i = 0; i < sizeof(VLLM_QUERIES) / sizeof(VLLM_QUERIES[0]); i++) {
        char expr[1024];
        for (int k = 0; vllm_query(VLLM_QUERIES[i].shape, VLLM_QUERIES[i].metric, k, expr, sizeof(expr)); k++) {
            char err[1024];
            int n = 0;
            double v;
            for (;;) {
                if (!prom_query(prom_port, expr, &n, &v, err, sizeof(err))) {
                    prom_stop(prom);
                    fail_msg("vLLM's dashboard: %s: %s", expr, err);
                }
                if (n > 0 || fy_now_s() - q0 > 20) break;
                usleep(250000);
            }
            n_vllm++;
            if (n == 0) {
                print_message("vLLM's dashboard: no data from %s\n", expr);
                empty++;
            }
        }
    }
    print_message("%d dashboard queries and %d of vLLM's dashboard checked against prometheus, %d empty\n", n_targets,
                  n_vllm, empty);
    if (empty) { /* what the scrapes looked like */
        static const char *const dbg[] = {"up{job=\"ferry\"}", "count_over_time(up{job=\"ferry\"}[30s])",
                                          "scrape_duration_seconds{job=\"ferry\"}",
                                          "scrape_samples_scraped{job=\"ferry\"}"};
        for (size_t i = 0; i < sizeof(dbg) / sizeof(dbg[0]); i++) {
            char q[256], url[600];
            url_encode(dbg[i], q, sizeof(q));
            snprintf(url, sizeof(url), "/api/v1/query?query=%s", q);
            char *body = NULL;
            tc_http(prom_port, "GET", url, &body);
            print_message("%s: %s\n", dbg[i], body ? body : "(no answer)");
            fy_free(body);
        }
    }
    prom_stop(prom);
    assert_int_equal(empty, 0);
    tc_stop(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_dashboard_queries)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_bench.c - ferry-bench: workload generators (lengths, classes,
 * shared prefixes, arrival processes, traces), percentile and goodput
 * arithmetic, address checks, and whole runs against the echo server
 * over both clients with every request accounted for.  Seeds are fixed
 * and printed with any failure.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>

#include "common/clock.h"
#include "common/cluster.h"
#include "bench/echo.h"
#include "common/mem.h"
#include "bench/report.h"
#include "bench/run.h"
#include "tests/testutil.h"
#include "bench/workload.h"

/* The deployment's secret the nng echo and its clients share (in the test's directory). */
static const char *bench_secret(void)
{
    static char path[512];
    snprintf(path, sizeof(path), "%s", fy_test_path("kv.secret"));
    assert_int_equal(fy_cluster_make_secret(path), FY_OK);
    return path;
}

#define SEED 42

static int32_t words(const char *s, size_t n)
{
    int32_t w = 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] == ' ') w++;
    return w;
}

/* The first n words of s (each " word"), as a byte length. */
static size_t prefix_bytes(const char *s, int32_t n)
{
    size_t i = 0;
    int32_t seen = 0;
    for (; s[i]; i++)
        if (s[i] == ' ' && seen++ == n) break;
    return i;
}

/* ---- workloads --------------------------------------------------------------------------------- */

static void test_len_parse(void **state)
{
    fy_bench_len_t l;
    char err[256];
    assert_int_equal(fy_bench_len_parse("64", &l, err, sizeof(err)), FY_OK);
    assert_int_equal(l.kind, FY_BENCH_LEN_FIXED);
    assert_int_equal(l.lo, 64);
    assert_int_equal(fy_bench_len_parse("10-20", &l, err, sizeof(err)), FY_OK);
    assert_int_equal(l.kind, FY_BENCH_LEN_UNIFORM);
    fy_bench_rng_t r;
    fy_bench_rng_seed(&r, SEED, 0);
    bool seen_lo = false, seen_hi = false;
    for (int i = 0; i < 2000; i++) {
        int32_t v = fy_bench_len_draw(&l, &r);
        assert_true(v >= 10 && v <= 20);
        seen_lo |= v == 10;
        seen_hi |= v == 20;
    }
    assert_true(seen_lo && seen_hi); /* inclusive at both ends */
    static const char *const bad[] = {"", "0", "-3", "5-3", "abc", "1-", "7x", "1-2-3", "2000000"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = 0;
        assert_int_not_equal(fy_bench_len_parse(bad[i], &l, err, sizeof(err)), FY_OK);
        assert_non_null(strstr(err, "expected"));
    }
    /* a distribution file: only its values, in about their weights */
    const char *dir = fy_test_tmpdir();
    (void)dir;
    const char *path = fy_test_path("lens.txt");
    const char *text = "# length weight\n100 3\n\n200 1\n";
    assert_true(fy_test_write_file(path, text, strlen(text)));
    char spec[512];
    snprintf(spec, sizeof(spec), "@%s", path);
    assert_int_equal(fy_bench_len_parse(spec, &l, err, sizeof(err)), FY_OK);
    int n100 = 0;
    for (int i = 0; i < 4000; i++) {
        int32_t v = fy_bench_len_draw(&l, &r);
        assert_true(v == 100 || v == 200);
        n100 += v == 100;
    }
    if (n100 < 2800 || n100 > 3200) fail_msg("seed %d: 100 drawn %d times of 4000, expected about 3000", SEED, n100);
    fy_bench_len_free(&l);
    const char *badf = "100 1\n200 x\n";
    assert_true(fy_test_write_file(path, badf, strlen(badf)));
    assert_int_equal(fy_bench_len_parse(spec, &l, err, sizeof(err)), FY_ERR_FORMAT);
    assert_non_null(strstr(err, "lens.txt:2:"));
    fy_test_tmpdir_remove();
}

static void test_synth_lengths(void **state)
{
    fy_bench_synth_t p = {.n_requests = 400, .n_classes = 2, .turns = 1, .seed = SEED};
    char err[256];
    assert_int_equal(fy_bench_class_parse("10-20/5-7/3", &p.classes[0], err, sizeof(err)), FY_OK);
    assert_int_equal(fy_bench_class_parse("300/40", &p.classes[1], err, sizeof(err)), FY_OK);
    fy_bench_workload_t *w, *w2;
    assert_int_equal(fy_bench_workload_synth(&p, &w, err, sizeof(err)), FY_OK);
    assert_int_equal(w->n_reqs, 400);
    int n_small = 0;
    for (int32_t i = 0; i < w->n_reqs; i++) {
        const fy_bench_req_t *q = &w->reqs[i];
        assert_int_equal(words(q->text, q->text_len), q->n_in); /* one word, one token */
        assert_int_equal(strlen(q->text), q->text_len);
        if (q->n_in <= 20) {
            n_small++;
            assert_true(q->n_in >= 10 && q->n_out >= 5 && q->n_out <= 7);
        } else {
            assert_int_equal(q->n_in, 300);
            assert_int_equal(q->n_out, 40);
        }
    }
    if (n_small < 260 || n_small > 340)
        fail_msg("seed %d: %d of 400 in the 3:1 class, expected about 300", SEED, n_small);
    /* the same seed gives the same bytes; another seed other bytes */
    assert_int_equal(fy_bench_workload_synth(&p, &w2, err, sizeof(err)), FY_OK);
    for (int32_t i = 0; i < w->n_reqs; i++) assert_string_equal(w->reqs[i].text, w2->reqs[i].text);
    fy_bench_workload_destroy(w2);
    p.seed = SEED + 1;
    assert_int_equal(fy_bench_workload_synth(&p, &w2, err, sizeof(err)), FY_OK);
    int same = 0;
    for (int32_t i = 0; i < w->n_reqs; i++) same += !strcmp(w->reqs[i].text, w2->reqs[i].text);
    assert_true(same < 5);
    fy_bench_workload_destroy(w2);
    fy_bench_workload_destroy(w);
    for (int k = 0; k < 2; k++) fy_bench_class_free(&p.classes[k]);
    assert_int_not_equal(fy_bench_class_parse("10-20", &p.classes[0], err, sizeof(err)), FY_OK);
    assert_int_not_equal(fy_bench_class_parse("10/20/-1", &p.classes[0], err, sizeof(err)), FY_OK);
}

static void test_shared_prefix(void **state)
{
    fy_bench_synth_t p = {
        .n_requests = 30, .n_classes = 1, .turns = 1, .seed = SEED, .prefix_groups = 3, .prefix_len = 50};
    char err[256];
    assert_int_equal(fy_bench_class_parse("20/8", &p.classes[0], err, sizeof(err)), FY_OK);
    fy_bench_workload_t *w;
    assert_int_equal(fy_bench_workload_synth(&p, &w, err, sizeof(err)), FY_OK);
    const char *first[3] = {NULL, NULL, NULL};
    for (int32_t i = 0; i < w->n_reqs; i++) {
        const fy_bench_req_t *q = &w->reqs[i];
        assert_int_equal(q->n_in, 70);
        assert_int_equal(words(q->text, q->text_len), 70);
        assert_true(q->group >= 0 && q->group < 3);
        if (!first[q->group]) {
            first[q->group] = q->text;
            continue;
        }
        /* the same 50 words as the group's first member, then its own */
        size_t pb = prefix_bytes(q->text, 50);
        assert_int_equal(pb, prefix_bytes(first[q->group], 50));
        assert_memory_equal(q->text, first[q->group], pb);
        assert_string_not_equal(q->text + pb, first[q->group] + pb);
    }
    for (int a = 0; a < 3; a++)
        for (int b = a + 1; b < 3; b++) {
            size_t pa = prefix_bytes(first[a], 50), pb = prefix_bytes(first[b], 50);
            assert_false(pa == pb && !memcmp(first[a], first[b], pa));
            /* different from the first block on, so no cache block is shared */
            assert_false(!memcmp(first[a], first[b], prefix_bytes(first[a], 16)) &&
                         prefix_bytes(first[a], 16) == prefix_bytes(first[b], 16));
        }
    fy_bench_workload_destroy(w);
    fy_bench_class_free(&p.classes[0]);
    p.prefix_len = 0;
    assert_int_not_equal(fy_bench_workload_synth(&p, &w, err, sizeof(err)), FY_OK);
}

static void test_arrivals(void **state)
{
    fy_bench_synth_t p = {.n_requests = 20000, .n_classes = 1, .turns = 1, .seed = SEED};
    char err[256];
    assert_int_equal(fy_bench_class_parse("1/1", &p.classes[0], err, sizeof(err)), FY_OK);
    fy_bench_workload_t *w;
    assert_int_equal(fy_bench_workload_synth(&p, &w, err, sizeof(err)), FY_OK);
    double *at = fy_malloc((size_t)w->n_convs * sizeof(double));
    assert_non_null(at);
    const double rate = 50, shapes[] = {1.0, 0.5, 4.0};
    for (int s = 0; s < 3; s++) {
        fy_bench_arrivals(w, rate, shapes[s], SEED, at);
        assert_true(at[0] == 0);
        double sum = 0, ss = 0;
        int32_t n = w->n_convs - 1;
        for (int32_t i = 1; i < w->n_convs; i++) {
            double d = at[i] - at[i - 1];
            assert_true(d >= 0);
            sum += d;
            ss += d * d;
        }
        double mean = sum / n, var = ss / n - mean * mean, cv2 = var / (mean * mean);
        /* mean 1/rate within 3%; squared coefficient of variation 1/shape within 10% */
        if (fabs(mean * rate - 1) > 0.03 || fabs(cv2 * shapes[s] - 1) > 0.10)
            fail_msg("seed %d, shape %g: mean gap %.5f s (expected %.5f), cv^2 %.3f (expected %.3f)", SEED, shapes[s],
                     mean, 1 / rate, cv2, 1 / shapes[s]);
    }
    fy_bench_arrivals(w, 0, 1, SEED, at); /* all at once */
    for (int32_t i = 0; i < w->n_convs; i++) assert_true(at[i] == 0);
    assert_true(fy_bench_closed_loop(w, 0)); /* paced by the concurrency limit, not a schedule */
    assert_false(fy_bench_closed_loop(w, 2.5));
    fy_free(at);
    fy_bench_workload_destroy(w);
    fy_bench_class_free(&p.classes[0]);
}

static void test_trace(void **state)
{
    fy_test_tmpdir();
    const char *path = fy_test_path("trace.jsonl");
    const char *good = "{\"timestamp\": 1000, \"input_length\": 40, \"output_length\": 8, \"hash_ids\": [7, 9]}\n"
                       "\n"
                       "{\"timestamp\": 1500, \"input_length\": 30, \"output_length\": 4, \"hash_ids\": [7]}\n"
                       "{\"arrival_s\": 3.0, \"prompt\": \"hello there, how are you\", \"max_tokens\": 5}\n";
    assert_true(fy_test_write_file(path, good, strlen(good)));
    fy_bench_trace_opts_t o = {.block_tokens = 16, .time_scale = 1, .seed = SEED};
    fy_bench_workload_t *w;
    char err[256] = "";
    assert_int_equal(fy_bench_workload_trace(path, &o, &w, err, sizeof(err)), FY_OK);
    assert_int_equal(w->n_reqs, 3);
    assert_true(w->timed);
    assert_true(fabs(w->convs[0].at_s) < 1e-9 && fabs(w->convs[1].at_s - 0.5) < 1e-9 &&
                fabs(w->convs[2].at_s - 2.0) < 1e-9);
    assert_int_equal(w->reqs[0].n_in, 40);
    assert_int_equal(words(w->reqs[0].text, w->reqs[0].text_len), 40);
    assert_int_equal(w->reqs[1].n_out, 4);
    /* the block named 7 is the same 16 words in both lines, the rest differs */
    size_t b16 = prefix_bytes(w->reqs[0].text, 16);
    assert_int_equal(b16, prefix_bytes(w->reqs[1].text, 16));
    assert_memory_equal(w->reqs[0].text, w->reqs[1].text, b16);
    assert_string_not_equal(w->reqs[0].text + b16, w->reqs[1].text + b16);
    assert_string_equal(w->reqs[2].text, "hello there, how are you");
    assert_int_equal(w->reqs[2].n_out, 5);
    double at[3];
    fy_bench_arrivals(w, 0, 1, SEED, at); /* rate 0: the trace's own times */
    assert_true(fabs(at[2] - 2.0) < 1e-9);
    assert_false(fy_bench_closed_loop(w, 0)); /* a trace is a schedule: its send lag means something */
    fy_bench_workload_destroy(w);

    /* every malformed line names its file and line and what is wrong */
    static const struct {
        const char *line, *why;
    } bad[] = {
        {"{\"timestamp\": 5, \"input_length\": 10", "not JSON"},
        {"[1, 2]", "expected a JSON object"},
        {"{\"input_length\": 10, \"output_length\": 3}", "no arrival time"},
        {"{\"timestamp\": 5, \"output_length\": 3}", "no prompt"},
        {"{\"timestamp\": 5, \"input_length\": 0, \"output_length\": 3}", "input_length must be"},
        {"{\"timestamp\": 5, \"input_length\": 10}", "no output length"},
        {"{\"timestamp\": \"x\", \"input_length\": 10, \"output_length\": 3}", "must be a number"},
        {"{\"timestamp\": 5, \"input_length\": 10, \"output_length\": 3, \"hash_ids\": [-1]}", "hash_ids[0]"},
        {"{\"timestamp\": 1, \"input_length\": 10, \"output_length\": 3}", "sort the trace"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char text[512];
        snprintf(text, sizeof(text), "{\"timestamp\": 2, \"input_length\": 4, \"output_length\": 2}\n\n%s\n",
                 bad[i].line);
        assert_true(fy_test_write_file(path, text, strlen(text)));
        err[0] = 0;
        w = NULL;
        assert_int_equal(fy_bench_workload_trace(path, &o, &w, err, sizeof(err)), FY_ERR_FORMAT);
        assert_null(w);
        if (!strstr(err, "trace.jsonl:3:") || !strstr(err, bad[i].why))
            fail_msg("line '%s': error '%s' should name line 3 and say '%s'", bad[i].line, err, bad[i].why);
    }
    assert_int_equal(fy_bench_workload_trace(fy_test_path("absent.jsonl"), &o, &w, err, sizeof(err)), FY_ERR_IO);
    /* ShareGPT */
    const char *sg = "[{\"conversations\": [{\"from\": \"human\", \"value\": \"abcdefghijklmnop\"},"
                     "{\"from\": \"gpt\", \"value\": \"0123456789abcdefghijklmnopqrstuv\"}]},"
                     "{\"conversations\": [{\"from\": \"human\", \"value\": \"lonely\"}]}]";
    path = fy_test_path("sg.json");
    assert_true(fy_test_write_file(path, sg, strlen(sg)));
    assert_int_equal(fy_bench_workload_sharegpt(path, 0, 0, &w, err, sizeof(err)), FY_OK);
    assert_int_equal(w->n_reqs, 1); /* the one without a reply is skipped */
    assert_int_equal(w->reqs[0].n_in, 4);
    assert_int_equal(w->reqs[0].n_out, 8);
    fy_bench_workload_destroy(w);
    fy_test_tmpdir_remove();
}

/* ---- arithmetic -------------------------------------------------------------------------------- */

static void test_percentiles(void **state)
{
    double v[100];
    for (int i = 0; i < 100; i++) v[i] = (double)(100 - i); /* 100..1, unsorted */
    fy_bench_dist_t d;
    fy_bench_dist_of(v, 100, &d);
    /* numpy.percentile(range(1, 101), q), linear */
    assert_true(fabs(d.p50 - 50.5) < 1e-9);
    assert_true(fabs(d.p90 - 90.1) < 1e-9);
    assert_true(fabs(d.p95 - 95.05) < 1e-9);
    assert_true(fabs(d.p99 - 99.01) < 1e-9);
    assert_true(fabs(d.mean - 50.5) < 1e-9);
    assert_true(d.min == 1 && d.max == 100 && d.n == 100);
    double one = 7;
    fy_bench_dist_of(&one, 1, &d);
    assert_true(d.p50 == 7 && d.p99 == 7 && d.std == 0);
    double two[] = {10, 0};
    fy_bench_dist_of(two, 2, &d);
    assert_true(fabs(d.p90 - 9.0) < 1e-9 && fabs(d.p50 - 5.0) < 1e-9);
    fy_bench_dist_of(NULL, 0, &d);
    assert_true(d.n == 0 && d.p99 == 0);
}

static void set_result(fy_bench_result_t *r, double sent, double ttft, double e2e, int32_t n_out, bool ok,
                       const char *kind)
{
    r->sched_s = sent;
    r->sent_s = sent;
    r->first_s = sent + ttft;
    r->end_s = sent + e2e;
    r->n_in = 10;
    r->n_out = n_out;
    r->ok = ok;
    snprintf(r->error, sizeof(r->error), "%s", kind);
    r->n_chunks = 0;
}

static void test_slo_goodput(void **state)
{
    fy_bench_slo_t slo;
    char err[256];
    assert_int_equal(fy_bench_slo_parse("ttft=500ms,tpot=50ms", &slo, err, sizeof(err)), FY_OK);
    assert_true(fabs(slo.ttft_s - 0.5) < 1e-12 && fabs(slo.tpot_s - 0.05) < 1e-12 && slo.e2e_s == 0);
    assert_int_equal(fy_bench_slo_parse("e2e=2s", &slo, err, sizeof(err)), FY_OK);
    assert_true(slo.e2e_s == 2 && slo.ttft_s == 0);
    static const char *const bad[] = {"ttft=500", "ttft", "latency=1s", "ttft=-1ms", "ttft=1h", ""};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_not_equal(fy_bench_slo_parse(bad[i], &slo, err, sizeof(err)), FY_OK);
    assert_int_equal(fy_bench_slo_parse("ttft=500ms,tpot=50ms", &slo, err, sizeof(err)), FY_OK);

    fy_bench_result_t r[6];
    memset(r, 0, sizeof(r));
    /* tpot = (e2e - ttft) / (n_out - 1) */
    set_result(&r[0], 0.0, 0.2, 0.2 + 9 * 0.04, 10, true, ""); /* good */
    set_result(&r[1], 1.0, 0.6, 0.6 + 9 * 0.01, 10, true, ""); /* ttft too long */
    set_result(&r[2], 2.0, 0.1, 0.1 + 9 * 0.06, 10, true, ""); /* tpot too long */
    set_result(&r[3], 3.0, 0.4, 0.4, 1, true, "");             /* one token: no tpot, good */
    set_result(&r[4], 4.0, 0.1, 0.2, 2, false, "timeout");     /* fast but failed: never good */
    set_result(&r[5], 5.0, 0.1, 0.2, 2, false, "overloaded");
    assert_true(fabs(fy_bench_tpot(&r[0]) - 0.04) < 1e-9);
    fy_bench_summary_t s;
    assert_int_equal(fy_bench_summarize(r, 6, 10.0, 1.0, false, &slo, &s), FY_OK);
    assert_int_equal(s.n_ok, 4);
    assert_int_equal(s.n_failed, 2);
    assert_int_equal(s.n_good, 2);
    assert_true(fabs(s.goodput - 0.2) < 1e-12);
    assert_true(fabs(s.req_tput - 0.4) < 1e-12);
    assert_int_equal(s.out_tokens, 31);
    assert_int_equal(s.ttft.n, 4);
    assert_int_equal(s.tpot.n, 3);
    assert_int_equal(s.n_kinds, 2);
    assert_true((!strcmp(s.kinds[0].kind, "timeout") && s.kinds[0].n == 1) &&
                (!strcmp(s.kinds[1].kind, "overloaded") && s.kinds[1].n == 1));
    fy_bench_slo_t none = {0};
    assert_int_equal(fy_bench_summarize(r, 6, 10.0, 1.0, false, &none, &s), FY_OK);
    assert_true(s.goodput < 0); /* no SLO: no goodput figure */

    /* send lag: an open loop's delay against its schedule; a closed loop
     * (all due at 0, each sent as a slot frees: here up to 5 s later) has
     * no schedule, and its "lag" (the wait for a slot, once reported as
     * the harness's delay) is not reported, in the table or the JSON */
    for (int i = 0; i < 6; i++) r[i].sched_s = 0;
    assert_int_equal(fy_bench_summarize(r, 6, 10.0, 0, false, &none, &s), FY_OK); /* a trace due at 0 */
    assert_int_equal(s.lag.n, 6);
    assert_true(fabs(s.lag.max - 5.0) < 1e-9);
    assert_int_equal(fy_bench_summarize(r, 6, 10.0, 0, true, &none, &s), FY_OK);
    assert_int_equal(s.lag.n, 0);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    fy_bench_print_summary(f, "closed", &s, &none);
    fclose(f);
    if (!strstr(buf, "send lag") || !strstr(buf, "n/a  (closed loop") || strstr(buf, "5000.00"))
        fail_msg("a closed loop's summary:\n%s", buf);
    free(buf);
    fy_bench_synth_t p = {.n_requests = 6, .n_classes = 1, .turns = 1, .seed = SEED};
    assert_int_equal(fy_bench_class_parse("10/5", &p.classes[0], err, sizeof(err)), FY_OK);
    fy_bench_workload_t *w;
    assert_int_equal(fy_bench_workload_synth(&p, &w, err, sizeof(err)), FY_OK);
    fy_bench_class_free(&p.classes[0]);
    json_t *j = fy_bench_json_run(&s, w, r, &none);
    assert_non_null(j);
    assert_true(json_is_null(json_object_get(j, "send_lag")));
    json_decref(j);
    fy_bench_workload_destroy(w);
}

static void test_addresses(void **state)
{
    char err[256];
    static const char *const ok[] = {"tcp://127.0.0.1:7400", "http://localhost:8080", "http://[::1]:80",
                                     "tcp://127.3.2.1:1",    "ipc:///tmp/x.sock",     "http://127.0.0.1"};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
        assert_int_equal(fy_bench_check_address(ok[i], false, err, sizeof(err)), FY_OK);
    static const char *const remote[] = {"tcp://10.0.0.1:7400", "http://example.com:8080", "http://[2001:db8::1]:80",
                                         "http://128.0.0.1"};
    for (size_t i = 0; i < sizeof(remote) / sizeof(remote[0]); i++) {
        assert_int_equal(fy_bench_check_address(remote[i], false, err, sizeof(err)), FY_ERR_INVALID);
        assert_non_null(strstr(err, "--allow-remote"));
        assert_int_equal(fy_bench_check_address(remote[i], true, err, sizeof(err)), FY_OK);
    }
    assert_int_equal(fy_bench_check_address("127.0.0.1:80", false, err, sizeof(err)), FY_ERR_INVALID);
    assert_int_equal(fy_bench_check_address("ftp://127.0.0.1", false, err, sizeof(err)), FY_ERR_INVALID);
}

/* ---- runs against the echo server -------------------------------------------------------------- */

typedef struct runout {
    fy_bench_workload_t *w;
    fy_bench_result_t *res;
    fy_bench_summary_t s;
    double duration;
} runout_t;

static void run_echo(const fy_bench_target_t *t, const char *cls, int32_t n, int32_t turns, double rate, double timeout,
                     runout_t *o)
{
    fy_bench_synth_t p = {.n_requests = n, .n_classes = 1, .turns = turns, .seed = SEED};
    char err[256];
    assert_int_equal(fy_bench_class_parse(cls, &p.classes[0], err, sizeof(err)), FY_OK);
    assert_int_equal(fy_bench_workload_synth(&p, &o->w, err, sizeof(err)), FY_OK);
    fy_bench_class_free(&p.classes[0]);
    double *at = fy_malloc((size_t)o->w->n_convs * sizeof(double));
    assert_non_null(at);
    fy_bench_arrivals(o->w, rate, 1, SEED, at);
    assert_int_equal(fy_bench_results_create(o->w, &o->res), FY_OK);
    fy_bench_run_params_t rp = {.timeout_s = timeout, .max_concurrency = 64};
    assert_int_equal(fy_bench_run(t, o->w, at, &rp, o->res, &o->duration), FY_OK);
    fy_bench_slo_t slo = {.ttft_s = 10};
    assert_int_equal(
        fy_bench_summarize(o->res, o->w->n_reqs, o->duration, rate, fy_bench_closed_loop(o->w, rate), &slo, &o->s),
        FY_OK);
    fy_free(at);
}

static void runout_free(runout_t *o)
{
    fy_bench_results_destroy(o->res, o->w->n_reqs);
    fy_bench_workload_destroy(o->w);
}

/* Every request has exactly one outcome; the successful ones got every
 * token, in chunks that add up, after at least the echo's first-token
 * delay; the refused ones are the echo's every fail_every-th. */
static void check_accounted(const runout_t *o, int32_t fail_every, const char *refusal, double ttft_min)
{
    int32_t n = o->w->n_reqs, ok = 0, refused = 0;
    for (int32_t i = 0; i < n; i++) {
        const fy_bench_result_t *r = &o->res[i];
        const fy_bench_req_t *q = &o->w->reqs[i];
        assert_true(r->sent_s >= 0);
        assert_true(r->end_s >= r->sent_s);
        if (r->ok) {
            ok++;
            assert_string_equal(r->error, "");
            assert_int_equal(r->n_out, q->n_out);
            int32_t sum = 0;
            for (int32_t c = 0; c < r->n_chunks; c++) sum += r->chunk_n[c];
            assert_int_equal(sum, r->n_out);
            assert_true(r->server_counted_in);
            if (q->turn == 0) assert_int_equal(r->n_in, q->n_in);
            if (fy_bench_ttft(r) < ttft_min - 1e-3)
                fail_msg("request %d: ttft %.4f s below the echo's delay %.3f s", i, fy_bench_ttft(r), ttft_min);
            assert_true(r->first_s <= r->end_s);
        } else {
            if (strcmp(r->error, refusal)) fail_msg("request %d failed as '%s' (%s)", i, r->error, r->message);
            refused++;
        }
    }
    assert_int_equal(ok + refused, n);
    assert_int_equal(refused, fail_every ? n / fail_every : 0);
    assert_int_equal(o->s.n_ok, ok);
    assert_int_equal(o->s.n_failed, refused);
}

static void test_echo_nng(void **state)
{
    fy_test_tmpdir();
    char url[512];
    snprintf(url, sizeof(url), "ipc://%s", fy_test_path("echo-nng.sock"));
    fy_bench_echo_params_t ep = {
        .nng_url = url, .secret_file = bench_secret(), .ttft_s = 0.02, .itl_s = 0.002, .fail_every = 7};
    fy_bench_echo_t *e;
    assert_int_equal(fy_bench_echo_create(&ep, &e), FY_OK);
    fy_bench_target_t t = {.proto = FY_BENCH_PROTO_NNG, .url = url, .ignore_eos = true, .secret_file = ep.secret_file};
    runout_t o;
    run_echo(&t, "10-30/8-24", 70, 1, 100, 10, &o);
    check_accounted(&o, 7, "overloaded", 0.02);
    assert_int_equal(fy_bench_echo_served(e) + fy_bench_echo_refused(e), 70);
    /* paced at 2 ms a token, the long polls bring tokens in several chunks */
    assert_true(o.s.chunks > o.s.n_ok);
    runout_free(&o);
    /* a harness with another deployment's secret is refused, every request, never served */
    const char *other = fy_test_path("other.secret");
    assert_int_equal(fy_cluster_make_secret(other), FY_OK);
    fy_bench_target_t x = t;
    x.secret_file = other;
    uint64_t served = fy_bench_echo_served(e);
    fy_test_log_begin();
    run_echo(&x, "10-30/8-24", 5, 1, 0, 10, &o);
    fy_test_log_end();
    for (int32_t i = 0; i < 5; i++) assert_string_not_equal(o.res[i].error, "");
    assert_int_equal(fy_bench_echo_served(e), served);
    assert_true(fy_test_log_has("refused our request", "bad MAC", NULL));
    runout_free(&o);
    fy_bench_echo_destroy(e);
    fy_test_tmpdir_remove();
}

/* several routers (--url A,B): client threads spread over them, and move
 * on from one that does not answer; every request counted once */
static void test_echo_nng_routers(void **state)
{
    fy_test_tmpdir();
    char ua[512], ub[512], dead[512], urls[1600];
    snprintf(ua, sizeof(ua), "ipc://%s", fy_test_path("echo-a.sock"));
    snprintf(ub, sizeof(ub), "ipc://%s", fy_test_path("echo-b.sock"));
    snprintf(dead, sizeof(dead), "ipc://%s", fy_test_path("nobody.sock"));
    fy_bench_echo_params_t pa = {.nng_url = ua, .secret_file = bench_secret(), .ttft_s = 0.01, .itl_s = 0.001};
    fy_bench_echo_params_t pb = pa;
    pb.nng_url = ub;
    fy_bench_echo_t *a, *b;
    assert_int_equal(fy_bench_echo_create(&pa, &a), FY_OK);
    assert_int_equal(fy_bench_echo_create(&pb, &b), FY_OK);
    snprintf(urls, sizeof(urls), "%s,%s", ua, ub);
    fy_bench_target_t t = {.proto = FY_BENCH_PROTO_NNG, .url = urls, .ignore_eos = true, .secret_file = pa.secret_file};
    runout_t o;
    run_echo(&t, "10-30/8-24", 40, 1, 100, 10, &o);
    check_accounted(&o, 0, "", 0.01);
    assert_int_equal(fy_bench_echo_served(a) + fy_bench_echo_served(b), 40);
    assert_true(fy_bench_echo_served(a) > 0 && fy_bench_echo_served(b) > 0);
    runout_free(&o);
    /* the first router gone: its threads move to the second */
    fy_bench_echo_destroy(b);
    snprintf(urls, sizeof(urls), "%s,%s", dead, ua);
    uint64_t before = fy_bench_echo_served(a);
    run_echo(&t, "10-30/8-24", 12, 1, 100, 20, &o);
    check_accounted(&o, 0, "", 0.01);
    assert_int_equal(fy_bench_echo_served(a) - before, 12);
    runout_free(&o);
    fy_bench_echo_destroy(a);
    fy_test_tmpdir_remove();
}

static void test_echo_http(void **state)
{
    fy_bench_echo_params_t ep = {.http = true, .ttft_s = 0.02, .itl_s = 0.001, .fail_every = 9, .api_key = "k3y"};
    fy_bench_echo_t *e;
    assert_int_equal(fy_bench_echo_create(&ep, &e), FY_OK);
    char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", fy_bench_echo_http_port(e));
    fy_bench_target_t t = {.proto = FY_BENCH_PROTO_HTTP, .url = url, .ignore_eos = true, .api_key = "k3y"};
    runout_t o;
    run_echo(&t, "10-30/8-24", 72, 1, 100, 10, &o);
    check_accounted(&o, 9, "http_429", 0.02);
    assert_int_equal(o.s.chunks, o.s.out_tokens); /* the echo sends one token an event */
    runout_free(&o);
    /* chat */
    t.chat = true;
    run_echo(&t, "10/5", 18, 1, 0, 10, &o);
    check_accounted(&o, 9, "http_429", 0.02);
    runout_free(&o);
    /* a wrong key: every request refused, none lost */
    t.api_key = "wrong";
    run_echo(&t, "10/5", 10, 1, 0, 10, &o);
    for (int32_t i = 0; i < 10; i++) assert_string_equal(o.res[i].error, "http_401");
    assert_int_equal(o.s.n_failed, 10);
    runout_free(&o);
    fy_bench_echo_destroy(e);
}

/* Conversations resend their history: turn k's prompt is every earlier
 * turn's text and answer (the echo answers one word a token), then its own. */
static void check_history(const runout_t *o)
{
    for (int32_t c = 0; c < o->w->n_convs; c++) {
        const fy_bench_conv_t *cv = &o->w->convs[c];
        int32_t expect = 0;
        for (int32_t k = 0; k < cv->n_turns; k++) {
            const fy_bench_req_t *q = &o->w->reqs[cv->first + k];
            const fy_bench_result_t *r = &o->res[cv->first + k];
            assert_true(r->ok);
            expect += q->n_in;
            assert_int_equal(r->n_in, expect);
            expect += q->n_out;
            if (k > 0) assert_true(r->sched_s >= o->res[cv->first + k - 1].end_s - 1e-6);
        }
    }
}

static void test_multiturn(void **state)
{
    fy_test_tmpdir();
    char url[512];
    snprintf(url, sizeof(url), "ipc://%s", fy_test_path("echo-turns.sock"));
    fy_bench_echo_params_t ep = {.nng_url = url, .secret_file = bench_secret(), .http = true};
    fy_bench_echo_t *e;
    assert_int_equal(fy_bench_echo_create(&ep, &e), FY_OK);
    fy_bench_target_t t = {.proto = FY_BENCH_PROTO_NNG, .url = url, .ignore_eos = true, .secret_file = ep.secret_file};
    runout_t o;
    run_echo(&t, "6-12/3-9", 24, 3, 50, 10, &o);
    assert_int_equal(o.w->n_convs, 8);
    check_history(&o);
    runout_free(&o);
    char hurl[64];
    snprintf(hurl, sizeof(hurl), "http://127.0.0.1:%d", fy_bench_echo_http_port(e));
    fy_bench_target_t h = {.proto = FY_BENCH_PROTO_HTTP, .url = hurl, .ignore_eos = true};
    run_echo(&h, "6-12/3-9", 24, 3, 50, 10, &o);
    check_history(&o);
    runout_free(&o);
    fy_bench_echo_destroy(e);
    fy_test_tmpdir_remove();
}

/* Bounded: a server slower than the timeout ends every request as
 * timeout, and the run returns soon after. */
static void test_timeout(void **state)
{
    fy_test_tmpdir();
    char url[512];
    snprintf(url, sizeof(url), "ipc://%s", fy_test_path("echo-timeout.sock"));
    fy_bench_echo_params_t ep = {.nng_url = url, .secret_file = bench_secret(), .http = true, .ttft_s = 5};
    fy_bench_echo_t *e;
    assert_int_equal(fy_bench_echo_create(&ep, &e), FY_OK);
    char hurl[64];
    snprintf(hurl, sizeof(hurl), "http://127.0.0.1:%d", fy_bench_echo_http_port(e));
    fy_bench_target_t ts[2] = {{.proto = FY_BENCH_PROTO_NNG, .url = url, .secret_file = ep.secret_file},
                               {.proto = FY_BENCH_PROTO_HTTP, .url = hurl}};
    for (int k = 0; k < 2; k++) {
        runout_t o;
        double t0 = fy_now_s();
        run_echo(&ts[k], "5/5", 6, 1, 0, 0.3, &o);
        double took = fy_now_s() - t0;
        for (int32_t i = 0; i < 6; i++) assert_string_equal(o.res[i].error, "timeout");
        if (took > 3.0) fail_msg("%s: a run of 0.3 s timeouts took %.2f s", k ? "http" : "nng", took);
        runout_free(&o);
    }
    fy_bench_echo_destroy(e);
    fy_test_tmpdir_remove();
}

/* The harness's own ceiling, kept from regressing: both clients sustain
 * 200 requests/s open loop against the echo with every request served
 * (the cluster under test serves a few per second on this machine; the
 * measured ceiling is in BENCHMARKS.md). */
static void test_ceiling(void **state)
{
    fy_test_tmpdir();
    char url[512];
    snprintf(url, sizeof(url), "ipc://%s", fy_test_path("echo-ceiling.sock"));
    fy_bench_echo_params_t ep = {.nng_url = url, .secret_file = bench_secret(), .http = true};
    fy_bench_echo_t *e;
    assert_int_equal(fy_bench_echo_create(&ep, &e), FY_OK);
    char hurl[64];
    snprintf(hurl, sizeof(hurl), "http://127.0.0.1:%d", fy_bench_echo_http_port(e));
    fy_bench_target_t ts[2] = {
        {.proto = FY_BENCH_PROTO_NNG, .url = url, .ignore_eos = true, .secret_file = ep.secret_file},
        {.proto = FY_BENCH_PROTO_HTTP, .url = hurl, .ignore_eos = true}};
    for (int k = 0; k < 2; k++) {
        runout_t o;
        run_echo(&ts[k], "64/16", 600, 1, 200, 10, &o);
        assert_int_equal(o.s.n_ok, 600);
        if (o.s.req_tput < 150 || o.s.lag.p99 > 0.25)
            fail_msg("%s: %.1f req/s of 200 offered, send lag p99 %.1f ms", k ? "http" : "nng", o.s.req_tput,
                     o.s.lag.p99 * 1e3);
        runout_free(&o);
    }
    fy_bench_echo_destroy(e);
    fy_test_tmpdir_remove();
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_len_parse),     cmocka_unit_test(test_synth_lengths),
        cmocka_unit_test(test_shared_prefix), cmocka_unit_test(test_arrivals),
        cmocka_unit_test(test_trace),         cmocka_unit_test(test_percentiles),
        cmocka_unit_test(test_slo_goodput),   cmocka_unit_test(test_addresses),
        cmocka_unit_test(test_echo_nng),      cmocka_unit_test(test_echo_nng_routers),
        cmocka_unit_test(test_echo_http),     cmocka_unit_test(test_multiturn),
        cmocka_unit_test(test_timeout),       cmocka_unit_test(test_ceiling),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}

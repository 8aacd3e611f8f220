/*
 * report.c - figures from a run's results (report.h).
 */
#include "bench/report.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "common/log.h"
#include "common/mem.h"
#include "bench/stats.h"

static void say(char *err, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *err, size_t cap, const char *fmt, ...)
{
    if (!err || !cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
}

/* Percentile q (0..100) of sorted s[n], linear between closest ranks
 * (numpy's default); 0 when n is 0. */
static double percentile(const double *s, size_t n, double q)
{
    if (n == 0) return 0;
    if (q <= 0) return s[0];
    if (q >= 100) return s[n - 1];
    double pos = q / 100.0 * (double)(n - 1);
    size_t lo = (size_t)pos;
    double frac = pos - (double)lo;
    if (lo + 1 >= n) return s[n - 1];
    return s[lo] + frac * (s[lo + 1] - s[lo]);
}

void fy_bench_dist_of(double *v, size_t n, fy_bench_dist_t *d)
{
    memset(d, 0, sizeof(*d));
    if (!n) return;
    qsort(v, n, sizeof(double), cmp_double);
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += v[i];
    double mean = sum / (double)n, ss = 0;
    for (size_t i = 0; i < n; i++) ss += (v[i] - mean) * (v[i] - mean);
    *d = (fy_bench_dist_t){
        .n = (int64_t)n,
        .mean = mean,
        .std = n > 1 ? sqrt(ss / (double)(n - 1)) : 0,
        .min = v[0],
        .max = v[n - 1],
        .p50 = percentile(v, n, 50),
        .p90 = percentile(v, n, 90),
        .p95 = percentile(v, n, 95),
        .p99 = percentile(v, n, 99),
    };
}

/* ---- SLOs -------------------------------------------------------------------------------------- */

static bool parse_duration(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !(v > 0) || !isfinite(v)) return false;
    if (!strcmp(end, "ms"))
        v *= 1e-3;
    else if (!strcmp(end, "us"))
        v *= 1e-6;
    else if (strcmp(end, "s"))
        return false;
    *out = v;
    return true;
}

fy_status_t fy_bench_slo_parse(const char *spec, fy_bench_slo_t *slo, char *err, size_t cap)
{
    fy_bench_slo_t o = {0};
    char buf[256];
    if (snprintf(buf, sizeof(buf), "%s", spec) >= (int)sizeof(buf) || !buf[0]) {
        say(err, cap, "--slo '%.40s': expected ttft=500ms,tpot=50ms,e2e=10s", spec);
        return FY_ERR_INVALID;
    }
    char *save = NULL;
    for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        double v;
        if (!eq) {
            say(err, cap, "--slo: '%s' is not NAME=DURATION (names: ttft, tpot, e2e)", item);
            return FY_ERR_INVALID;
        }
        *eq = 0;
        if (!parse_duration(eq + 1, &v)) {
            say(err, cap, "--slo: %s=%s: expected a positive duration with a unit (500ms, 2s, 800us)", item, eq + 1);
            return FY_ERR_INVALID;
        }
        if (!strcmp(item, "ttft"))
            o.ttft_s = v;
        else if (!strcmp(item, "tpot"))
            o.tpot_s = v;
        else if (!strcmp(item, "e2e") || !strcmp(item, "e2el"))
            o.e2e_s = v;
        else {
            say(err, cap, "--slo: unknown objective '%s' (ttft, tpot, e2e)", item);
            return FY_ERR_INVALID;
        }
    }
    *slo = o;
    return FY_OK;
}

static bool slo_any(const fy_bench_slo_t *slo) { return slo && (slo->ttft_s > 0 || slo->tpot_s > 0 || slo->e2e_s > 0); }

double fy_bench_ttft(const fy_bench_result_t *r)
{
    return r->first_s >= 0 && r->sent_s >= 0 ? r->first_s - r->sent_s : -1;
}

double fy_bench_e2e(const fy_bench_result_t *r) { return r->end_s >= 0 && r->sent_s >= 0 ? r->end_s - r->sent_s : -1; }

double fy_bench_tpot(const fy_bench_result_t *r)
{
    if (r->n_out < 2 || r->first_s < 0 || r->end_s < 0) return 0;
    return (r->end_s - r->first_s) / (double)(r->n_out - 1);
}

/* A successful request within every SLO set. */
static bool slo_met(const fy_bench_slo_t *slo, const fy_bench_result_t *r)
{
    if (!r->ok) return false;
    if (slo->ttft_s > 0 && fy_bench_ttft(r) > slo->ttft_s) return false;
    if (slo->tpot_s > 0 && fy_bench_tpot(r) > slo->tpot_s) return false;
    if (slo->e2e_s > 0 && fy_bench_e2e(r) > slo->e2e_s) return false;
    return true;
}

/* ---- summary ----------------------------------------------------------------------------------- */

fy_status_t fy_bench_summarize(const fy_bench_result_t *res, int32_t n, double duration_s, double rate,
                               bool closed_loop, const fy_bench_slo_t *slo, fy_bench_summary_t *s)
{
    memset(s, 0, sizeof(*s));
    s->rate = rate;
    s->closed_loop = closed_loop;
    s->duration_s = duration_s;
    s->n_total = n;
    int64_t n_itl = 0;
    for (int32_t i = 0; i < n; i++)
        if (res[i].ok && res[i].n_chunks > 1) n_itl += res[i].n_chunks - 1;
    double *v = fy_malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    double *itl = fy_malloc((size_t)(n_itl > 0 ? n_itl : 1) * sizeof(double));
    if (!v || !itl) {
        fy_free(v);
        fy_free(itl);
        fy_error("bench: out of memory summarizing %d results", n);
        return FY_ERR_NOMEM;
    }
    size_t k;
    /* latency distributions over the requests that succeeded, as vLLM's */
#define DIST(field, cond, expr)                                                                                        \
    do {                                                                                                               \
        k = 0;                                                                                                         \
        for (int32_t i = 0; i < n; i++) {                                                                              \
            const fy_bench_result_t *r = &res[i];                                                                      \
            if (cond) v[k++] = (expr);                                                                                 \
        }                                                                                                              \
        fy_bench_dist_of(v, k, &s->field);                                                                             \
    } while (0)
    DIST(ttft, r->ok && r->first_s >= 0, fy_bench_ttft(r));
    DIST(tpot, r->ok && r->n_out > 1, fy_bench_tpot(r));
    DIST(e2e, r->ok, fy_bench_e2e(r));
    DIST(lag, !closed_loop && r->sent_s >= 0, r->sent_s - r->sched_s);
#undef DIST
    k = 0;
    for (int32_t i = 0; i < n; i++) {
        const fy_bench_result_t *r = &res[i];
        if (!r->ok) continue;
        for (int32_t c = 1; c < r->n_chunks; c++) itl[k++] = r->chunk_s[c] - r->chunk_s[c - 1];
    }
    fy_bench_dist_of(itl, k, &s->itl);
    fy_free(v);
    fy_free(itl);
    for (int32_t i = 0; i < n; i++) {
        const fy_bench_result_t *r = &res[i];
        if (r->sent_s >= 0) s->n_sent++;
        if (r->ok) {
            s->n_ok++;
            s->in_tokens += r->n_in;
            s->out_tokens += r->n_out;
            s->chunks += r->n_chunks;
            if (r->n_cached >= 0) {
                s->cached_tokens += r->n_cached;
                s->counted_in += r->n_in;
            }
            if (slo_met(slo, r)) s->n_good++;
            continue;
        }
        s->n_failed++;
        /* distinct kinds; when they overflow, the last slot becomes "other" */
        const char *kind = r->error[0] ? r->error : "unknown";
        int32_t j = 0;
        while (j < s->n_kinds && strcmp(s->kinds[j].kind, kind)) j++;
        if (j == FY_BENCH_MAX_KINDS)
            snprintf(s->kinds[--j].kind, FY_BENCH_KIND_LEN, "other");
        else if (j == s->n_kinds) {
            snprintf(s->kinds[j].kind, FY_BENCH_KIND_LEN, "%s", kind);
            snprintf(s->kinds[j].example, sizeof(s->kinds[j].example), "%s", r->message);
            s->n_kinds++;
        }
        s->kinds[j].n++;
    }
    double lo = 1e300, hi = -1;
    for (int32_t i = 0; i < n; i++)
        if (res[i].sent_s >= 0) {
            if (res[i].sched_s < lo) lo = res[i].sched_s;
            if (res[i].sched_s > hi) hi = res[i].sched_s;
        }
    s->drawn_rate = s->n_sent > 1 && hi > lo ? (s->n_sent - 1) / (hi - lo) : 0;
    double d = duration_s > 0 ? duration_s : 1e-9;
    s->req_tput = s->n_ok / d;
    s->in_tput = (double)s->in_tokens / d;
    s->out_tput = (double)s->out_tokens / d;
    s->goodput = slo_any(slo) ? s->n_good / d : -1;
    return FY_OK;
}

static void slo_words(const fy_bench_slo_t *slo, char *buf, size_t cap)
{
    size_t o = 0;
    buf[0] = 0;
    if (slo->ttft_s > 0) o += (size_t)snprintf(buf + o, cap - o, "ttft<=%gms ", slo->ttft_s * 1e3);
    if (slo->tpot_s > 0 && o < cap) o += (size_t)snprintf(buf + o, cap - o, "tpot<=%gms ", slo->tpot_s * 1e3);
    if (slo->e2e_s > 0 && o < cap) o += (size_t)snprintf(buf + o, cap - o, "e2e<=%gms ", slo->e2e_s * 1e3);
    if (o && o < cap) buf[o - 1] = 0;
}

static void dist_row(FILE *f, const char *name, const fy_bench_dist_t *d)
{
    if (!d->n) {
        fprintf(f, "%-14s %10s\n", name, "-");
        return;
    }
    fprintf(f, "%-14s %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f %8lld\n", name, d->mean * 1e3, d->p50 * 1e3,
            d->p90 * 1e3, d->p95 * 1e3, d->p99 * 1e3, d->max * 1e3, (long long)d->n);
}

void fy_bench_print_summary(FILE *f, const char *title, const fy_bench_summary_t *s, const fy_bench_slo_t *slo)
{
    char rate[32], sl[128];
    if (s->rate > 0)
        snprintf(rate, sizeof(rate), "%g req/s", s->rate);
    else
        snprintf(rate, sizeof(rate), "all at once / trace");
    fprintf(f, "==================== %s (rate: %s) ====================\n", title ? title : "ferry-bench", rate);
    fprintf(f, "%-42s %d total, %d sent, %d ok, %d failed\n", "requests:", s->n_total, s->n_sent, s->n_ok, s->n_failed);
    fprintf(f, "%-42s %.2f\n", "duration (s):", s->duration_s);
    if (s->rate > 0) fprintf(f, "%-42s %.3f\n", "offered by the drawn arrivals (req/s):", s->drawn_rate);
    fprintf(f, "%-42s %.3f\n", "request throughput (req/s):", s->req_tput);
    fprintf(f, "%-42s %.1f\n", "input token throughput (tok/s):", s->in_tput);
    fprintf(f, "%-42s %.1f\n", "output token throughput (tok/s):", s->out_tput);
    if (slo_any(slo)) {
        slo_words(slo, sl, sizeof(sl));
        char label[160];
        snprintf(label, sizeof(label), "goodput (req/s) [%s]:", sl);
        fprintf(f, "%-42s %.3f (%d of %d requests met every SLO)\n", label, s->goodput, s->n_good, s->n_total);
    } else {
        fprintf(f, "%-42s n/a (no --slo)\n", "goodput (req/s):");
    }
    fprintf(f, "%-14s %10s %10s %10s %10s %10s %10s %8s\n", "latency (ms)", "mean", "p50", "p90", "p95", "p99", "max",
            "n");
    dist_row(f, "TTFT", &s->ttft);
    dist_row(f, "TPOT", &s->tpot);
    dist_row(f, "ITL (chunks)", &s->itl);
    dist_row(f, "E2E", &s->e2e);
    if (s->closed_loop) /* every request due at once: its "lag" would be its wait for a slot */
        fprintf(f, "%-14s %10s  (closed loop: each request is sent when a slot frees; no schedule to lag)\n",
                "send lag", "n/a");
    else
        dist_row(f, "send lag", &s->lag);
    fprintf(f, "%-42s %.2f\n", "tokens per chunk (mean):", s->chunks ? (double)s->out_tokens / (double)s->chunks : 0);
    if (s->counted_in)
        fprintf(f, "%-42s %.1f%% (%lld of %lld)\n",
                "prompt tokens found cached:", 100.0 * (double)s->cached_tokens / (double)s->counted_in,
                (long long)s->cached_tokens, (long long)s->counted_in);
    for (int32_t i = 0; i < s->n_kinds; i++)
        fprintf(f, "%s %-12s %6d  e.g. %s\n", i ? "      " : "errors:", s->kinds[i].kind, s->kinds[i].n,
                s->kinds[i].example);
}

void fy_bench_print_sweep(FILE *f, const fy_bench_summary_t *s, int32_t n, const fy_bench_slo_t *slo)
{
    fprintf(f, "%8s %8s %9s %10s %10s %10s %10s %9s %9s %8s\n", "rate", "req/s", "out tok/s", "TTFT p50", "TTFT p99",
            "TPOT p50", "TPOT p99", "goodput", "SLO met", "failed");
    for (int32_t i = 0; i < n; i++) {
        char rate[16], good[16], met[16];
        if (s[i].rate > 0)
            snprintf(rate, sizeof(rate), "%g", s[i].rate);
        else
            snprintf(rate, sizeof(rate), "max");
        if (slo_any(slo)) {
            snprintf(good, sizeof(good), "%.3f", s[i].goodput);
            snprintf(met, sizeof(met), "%.0f%%", s[i].n_total ? 100.0 * s[i].n_good / s[i].n_total : 0);
        } else {
            snprintf(good, sizeof(good), "-");
            snprintf(met, sizeof(met), "-");
        }
        fprintf(f, "%8s %8.3f %9.1f %10.1f %10.1f %10.1f %10.1f %9s %9s %8d\n", rate, s[i].req_tput, s[i].out_tput,
                s[i].ttft.p50 * 1e3, s[i].ttft.p99 * 1e3, s[i].tpot.p50 * 1e3, s[i].tpot.p99 * 1e3, good, met,
                s[i].n_failed);
    }
}

/* ---- JSON -------------------------------------------------------------------------------------- */

static json_t *json_dist(const fy_bench_dist_t *d)
{
    return json_pack("{s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "n", (json_int_t)d->n, "mean", d->mean, "std",
                     d->std, "min", d->min, "max", d->max, "p50", d->p50, "p90", d->p90, "p95", d->p95, "p99", d->p99);
}

json_t *fy_bench_json_slo(const fy_bench_slo_t *slo)
{
    json_t *o = json_object();
    if (!o) return NULL;
    if (slo->ttft_s > 0) json_object_set_new(o, "ttft_s", json_real(slo->ttft_s));
    if (slo->tpot_s > 0) json_object_set_new(o, "tpot_s", json_real(slo->tpot_s));
    if (slo->e2e_s > 0) json_object_set_new(o, "e2e_s", json_real(slo->e2e_s));
    return o;
}

static json_t *maybe_time(double t) { return t >= 0 ? json_real(t) : json_null(); }

json_t *fy_bench_json_run(const fy_bench_summary_t *s, const fy_bench_workload_t *w, const fy_bench_result_t *res,
                          const fy_bench_slo_t *slo)
{
    json_t *errs = json_object(), *reqs = json_array();
    json_t *o = json_pack("{s:f, s:f, s:i, s:i, s:i, s:i, s:i, s:I, s:I, s:f, s:f, s:f, s:o, s:o, s:o, s:o, s:o, "
                          "s:o, s:f}",
                          "rate", s->rate, "duration_s", s->duration_s, "n_total", s->n_total, "n_sent", s->n_sent,
                          "n_ok", s->n_ok, "n_failed", s->n_failed, "n_good", s->n_good, "input_tokens",
                          (json_int_t)s->in_tokens, "output_tokens", (json_int_t)s->out_tokens, "request_throughput",
                          s->req_tput, "input_throughput", s->in_tput, "output_throughput", s->out_tput, "goodput",
                          s->goodput >= 0 ? json_real(s->goodput) : json_null(), "ttft", json_dist(&s->ttft), "tpot",
                          json_dist(&s->tpot), "itl_chunks", json_dist(&s->itl), "e2e", json_dist(&s->e2e), "send_lag",
                          s->closed_loop ? json_null() : json_dist(&s->lag), "tokens_per_chunk",
                          s->chunks ? (double)s->out_tokens / (double)s->chunks : 0.0);
    if (!o || !errs || !reqs) goto fail;
    for (int32_t i = 0; i < s->n_kinds; i++)
        json_object_set_new(errs, s->kinds[i].kind,
                            json_pack("{s:i, s:s}", "n", s->kinds[i].n, "example", s->kinds[i].example));
    json_object_set_new(o, "cached_prompt_tokens", json_integer(s->cached_tokens));
    json_object_set_new(o, "drawn_rate", json_real(s->drawn_rate));
    json_object_set_new(o, "errors", errs);
    errs = NULL;
    for (int32_t i = 0; i < s->n_total; i++) {
        const fy_bench_result_t *r = &res[i];
        const fy_bench_req_t *q = &w->reqs[i];
        json_t *chunks = json_array();
        for (int32_t c = 0; chunks && c < r->n_chunks; c++)
            json_array_append_new(chunks, json_pack("[f, i]", r->chunk_s[c], r->chunk_n[c]));
        json_t *e =
            json_pack("{s:i, s:i, s:i, s:i, s:f, s:o, s:o, s:o, s:i, s:b, s:i, s:i, s:b, s:s, s:s, s:o, "
                      "s:o, s:o, s:b, s:o}",
                      "i", i, "conv", q->conv, "turn", q->turn, "group", q->group, "sched_s", r->sched_s, "sent_s",
                      maybe_time(r->sent_s), "first_s", maybe_time(r->first_s), "end_s", maybe_time(r->end_s), "n_in",
                      r->n_in, "n_in_from_server", r->server_counted_in, "n_out", r->n_out, "n_out_asked", q->n_out,
                      "ok", r->ok, "error", r->error, "message", r->message, "ttft_s", maybe_time(fy_bench_ttft(r)),
                      "tpot_s", r->ok && r->n_out > 1 ? json_real(fy_bench_tpot(r)) : json_null(), "e2e_s",
                      maybe_time(fy_bench_e2e(r)), "slo_met", slo_met(slo, r), "chunks", chunks ? chunks : json_null());
        if (e && r->n_cached >= 0) json_object_set_new(e, "n_cached", json_integer(r->n_cached));
        if (!e || json_array_append_new(reqs, e)) goto fail;
    }
    json_object_set_new(o, "requests", reqs);
    return o;
fail:
    json_decref(errs);
    json_decref(reqs);
    json_decref(o);
    fy_error("bench: out of memory building the JSON report");
    return NULL;
}

/* ---- plots ------------------------------------------------------------------------------------- */

/* dir/name.dat: the sorted samples of one metric against their cumulative share. */
static fy_status_t write_cdf(const char *path, const fy_bench_result_t *res, int32_t n, int metric)
{
    double *v = fy_malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    if (!v) return FY_ERR_NOMEM;
    size_t k = 0;
    for (int32_t i = 0; i < n; i++) {
        const fy_bench_result_t *r = &res[i];
        if (!r->ok) continue;
        if (metric == 0 && r->first_s >= 0) v[k++] = fy_bench_ttft(r) * 1e3;
        if (metric == 1) v[k++] = fy_bench_e2e(r) * 1e3;
        if (metric == 2 && r->n_out > 1) v[k++] = fy_bench_tpot(r) * 1e3;
    }
    qsort(v, k, sizeof(double), cmp_double);
    FILE *f = fopen(path, "w");
    if (!f) {
        fy_error("bench: cannot write %s: %m", path);
        fy_free(v);
        return FY_ERR_IO;
    }
    for (size_t i = 0; i < k; i++) fprintf(f, "%.6f %.6f\n", v[i], (double)(i + 1) / (double)k);
    if (!k) fprintf(f, "0 0\n");
    fy_free(v);
    if (fclose(f)) {
        fy_error("bench: cannot write %s: %m", path);
        return FY_ERR_IO;
    }
    return FY_OK;
}

fy_status_t fy_bench_plot(const char *dir, const fy_bench_summary_t *s, fy_bench_result_t *const *res,
                          const int32_t *n_res, int32_t n_runs)
{
    static const char *const METRIC[] = {"ttft", "e2e", "tpot"};
    static const char *const LABEL[] = {"time to first token (ms)", "end-to-end latency (ms)",
                                        "time per output token (ms)"};
    char path[4096];
    if (mkdir(dir, 0755) && errno != EEXIST) {
        fy_error("bench: cannot make %s: %m", dir);
        return FY_ERR_IO;
    }
    fy_status_t st = FY_OK;
    for (int m = 0; m < 3 && !st; m++)
        for (int32_t r = 0; r < n_runs && !st; r++) {
            snprintf(path, sizeof(path), "%s/%s_%d.dat", dir, METRIC[m], (int)r);
            st = write_cdf(path, res[r], n_res[r], m);
        }
    if (st) return st;
    snprintf(path, sizeof(path), "%s/sweep.dat", dir);
    FILE *f = fopen(path, "w");
    if (!f) {
        fy_error("bench: cannot write %s: %m", path);
        return FY_ERR_IO;
    }
    fprintf(f, "# rate req_tput goodput out_tput ttft_p50_ms ttft_p99_ms tpot_p50_ms tpot_p99_ms\n");
    for (int32_t r = 0; r < n_runs; r++)
        fprintf(f, "%g %g %g %g %g %g %g %g\n", s[r].rate, s[r].req_tput, s[r].goodput >= 0 ? s[r].goodput : 0,
                s[r].out_tput, s[r].ttft.p50 * 1e3, s[r].ttft.p99 * 1e3, s[r].tpot.p50 * 1e3, s[r].tpot.p99 * 1e3);
    if (fclose(f)) {
        fy_error("bench: cannot write %s: %m", path);
        return FY_ERR_IO;
    }
    snprintf(path, sizeof(path), "%s/plot.gp", dir);
    if (!(f = fopen(path, "w"))) {
        fy_error("bench: cannot write %s: %m", path);
        return FY_ERR_IO;
    }
    fprintf(f, "set terminal pngcairo size 800,500 noenhanced\nset grid\nset key bottom right\n");
    for (int m = 0; m < 3; m++) {
        fprintf(f, "set output '%s/%s_cdf.png'\nset xlabel '%s'\nset ylabel 'share of requests'\nset yrange [0:1]\n",
                dir, METRIC[m], LABEL[m]);
        fprintf(f, "plot");
        for (int32_t r = 0; r < n_runs; r++) {
            char t[32];
            if (s[r].rate > 0)
                snprintf(t, sizeof(t), "%g req/s", s[r].rate);
            else
                snprintf(t, sizeof(t), "run %d", (int)r);
            fprintf(f, "%s '%s/%s_%d.dat' using 1:2 with lines lw 2 title '%s'", r ? "," : "", dir, METRIC[m], (int)r,
                    t);
        }
        fprintf(f, "\n");
    }
    int32_t n_rated = 0;
    for (int32_t r = 0; r < n_runs; r++) n_rated += s[r].rate > 0;
    if (n_rated >= 2) {
        fprintf(f, "set autoscale y\nset yrange [0:*]\nset key top left\nset xlabel 'offered rate (req/s)'\n");
        fprintf(f,
                "set output '%s/throughput.png'\nset ylabel 'req/s'\n"
                "plot '%s/sweep.dat' using 1:2 with linespoints lw 2 title 'throughput', "
                "'%s/sweep.dat' using 1:3 with linespoints lw 2 title 'goodput', x with lines dt 2 title 'offered'\n",
                dir, dir, dir);
        fprintf(f,
                "set output '%s/goodput.png'\nset ylabel 'goodput (req/s)'\n"
                "plot '%s/sweep.dat' using 1:3 with linespoints lw 2 title 'goodput'\n",
                dir, dir);
    }
    if (fclose(f)) {
        fy_error("bench: cannot write %s: %m", path);
        return FY_ERR_IO;
    }
    char cmd[4200];
    snprintf(cmd, sizeof(cmd), "gnuplot '%s/plot.gp'", dir);
    int rc = system(cmd);
    if (rc == -1 || !WIFEXITED(rc) || WEXITSTATUS(rc) != 0) {
        bool missing = rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 127;
        fy_error("bench: gnuplot %s (%s/plot.gp)",
                 missing ? "is not installed (apt-get install gnuplot-nox)" : "failed", dir);
        return missing ? FY_ERR_NOT_FOUND : FY_ERR_IO;
    }
    return FY_OK;
}

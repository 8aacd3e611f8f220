/*
 * report.h - what a run measured: latency distributions with exact
 * percentiles, throughput, goodput under SLOs, errors by kind; printed as
 * a table, written as JSON (every figure and every request), and drawn
 * with gnuplot.
 */
#ifndef FY_BENCH_REPORT_H
#define FY_BENCH_REPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "bench/run.h"
#include "common/status.h"

typedef struct fy_bench_dist {
    int64_t n;
    double mean, std, min, max, p50, p90, p95, p99;
} fy_bench_dist_t;

/* Sorts v in place. */
void fy_bench_dist_of(double *v, size_t n, fy_bench_dist_t *d);

/* Service-level objectives in seconds; 0 means not set. */
typedef struct fy_bench_slo {
    double ttft_s, tpot_s, e2e_s;
} fy_bench_slo_t;

/* "ttft=500ms,tpot=50ms,e2e=10s": units ms, s or us are required. */
fy_status_t fy_bench_slo_parse(const char *spec, fy_bench_slo_t *slo, char *err, size_t cap);

/* Per-request figures (seconds); tpot is 0 for one-token answers. */
double fy_bench_ttft(const fy_bench_result_t *r);
double fy_bench_e2e(const fy_bench_result_t *r);
double fy_bench_tpot(const fy_bench_result_t *r);

#define FY_BENCH_MAX_KINDS 16

typedef struct fy_bench_summary {
    double rate;       /* requested (0: all at once / trace times) */
    bool closed_loop;  /* all at once under --concurrency: each request sent when a slot frees, no schedule */
    double drawn_rate; /* what the drawn arrivals offer: (sent - 1) / (last due - first due) */
    double duration_s;
    int32_t n_total, n_sent, n_ok, n_failed, n_good;
    int64_t in_tokens, out_tokens, chunks;
    int64_t cached_tokens, counted_in; /* prompt tokens found cached, of counted_in where the server said */
    double req_tput, in_tput, out_tput, goodput;
    /* lag: send time less due time, open loop only (empty in a closed loop, where nothing is due at a time):
     * the harness's own delay, plus the wait for a free slot where --concurrency is reached */
    fy_bench_dist_t ttft, tpot, itl, e2e, lag;
    int32_t n_kinds;
    struct {
        char kind[FY_BENCH_KIND_LEN];
        int32_t n;
        char example[160]; /* the first one's message */
    } kinds[FY_BENCH_MAX_KINDS];
} fy_bench_summary_t;

/* closed_loop: every request was due at once (rate 0, no trace times),
 * sent as a slot freed; its send lag would be the wait for a slot, not a
 * delay against a schedule, and is not reported. */
fy_status_t fy_bench_summarize(const fy_bench_result_t *res, int32_t n, double duration_s, double rate,
                               bool closed_loop, const fy_bench_slo_t *slo, fy_bench_summary_t *s);

void fy_bench_print_summary(FILE *f, const char *title, const fy_bench_summary_t *s, const fy_bench_slo_t *slo);
/* One line per rate: the sweep at a glance. */
void fy_bench_print_sweep(FILE *f, const fy_bench_summary_t *s, int32_t n, const fy_bench_slo_t *slo);

/* One run as JSON: its summary and every request's timings (new reference). */
json_t *fy_bench_json_run(const fy_bench_summary_t *s, const fy_bench_workload_t *w, const fy_bench_result_t *res,
                          const fy_bench_slo_t *slo);
json_t *fy_bench_json_slo(const fy_bench_slo_t *slo);

/* PNGs in dir: ttft_cdf.png, e2e_cdf.png, tpot_cdf.png (one curve per
 * run) and, with two runs or more, throughput.png and goodput.png against
 * the rate.  Runs gnuplot; FY_ERR_NOT_FOUND with a message when it is
 * missing. */
fy_status_t fy_bench_plot(const char *dir, const fy_bench_summary_t *s, fy_bench_result_t *const *res,
                          const int32_t *n_res, int32_t n_runs);

#endif /* FY_BENCH_REPORT_H */

/*
 * metrics.h - a registry of counters, gauges and histograms, rendered in
 * the Prometheus text exposition format (0.0.4).
 *
 * A series is one metric name with one fixed set of label pairs, made at
 * registration (start-up); series of the same name form a family that
 * shares its HELP, TYPE and (histograms) bucket bounds.  Updates are
 * lock-free for counters and gauges (atomic doubles) and take one
 * uncontended mutex per histogram, so any thread may update any series;
 * nothing allocates after registration except rendering.  Rendering is a
 * consistent cut of every histogram, and of any group of updates made
 * between fy_metrics_batch_begin and _end (a worker copies its engine's
 * figures on its tick that way, so free + used + cached blocks always
 * add up in one scrape).
 *
 * Not here: serving the text over HTTP (rpc/httpd.h), and what each
 * process exports (docs/operations.md, "Metrics and health").
 */
#ifndef FY_METRICS_H
#define FY_METRICS_H

#include <stddef.h>

#include "common/status.h"

typedef struct fy_metrics fy_metrics_t; /* the registry */
typedef struct fy_metric fy_metric_t;   /* one series; owned by its registry */

fy_status_t fy_metrics_create(fy_metrics_t **reg_p);
/* A registry whose every series carries the label pairs const_labels
 * (NULL-terminated, as in fy_metrics_counter; copied), before its own:
 * a process's model_name and role (docs/operations.md).  A series may not
 * name one of them again. */
fy_status_t fy_metrics_create_labeled(const char *const *const_labels, fy_metrics_t **reg_p);
void fy_metrics_destroy(fy_metrics_t *reg); /* accepts NULL; frees every series */

/*
 * Registers a series.  name: [a-zA-Z_:][a-zA-Z0-9_:]*, counters ending in
 * "_total"; help: any text (escaped when rendered); labels: NULL, or
 * name/value pairs ending in NULL ({"tier", "device", "state", "free",
 * NULL}), values any text.  A second series of a name must have the same
 * type, help and bounds and a different label set.  FY_ERR_INVALID
 * (logged) otherwise, FY_ERR_NOMEM.  *m_p lives as long as the registry.
 */
fy_status_t fy_metrics_counter(fy_metrics_t *reg, const char *name, const char *help, const char *const *labels,
                               fy_metric_t **m_p);
fy_status_t fy_metrics_gauge(fy_metrics_t *reg, const char *name, const char *help, const char *const *labels,
                             fy_metric_t **m_p);
/* bounds: [n_bounds] strictly increasing finite upper bounds; the +Inf
 * bucket is implied.  The registry copies them. */
fy_status_t fy_metrics_histogram(fy_metrics_t *reg, const char *name, const char *help, const char *const *labels,
                                 const double *bounds, int n_bounds, fy_metric_t **m_p);

/* Counters and gauges; every function accepts m == NULL and does nothing,
 * so optional series need no checks at the call site. */
void fy_metric_inc(fy_metric_t *m);
void fy_metric_add(fy_metric_t *m, double v); /* counters: v >= 0 (a negative v is ignored) */
/* Gauges; and counters kept elsewhere (an engine's running totals) whose
 * value is mirrored: it must never go down. */
void fy_metric_set(fy_metric_t *m, double v);
double fy_metric_value(const fy_metric_t *m); /* counters and gauges; histograms: their sum */

/* Histograms. */
void fy_metric_observe(fy_metric_t *m, double v);
void fy_metric_observe_f32(fy_metric_t *m, const float *v, int n); /* n observations under one lock */
/* Observations so far (histograms), for tests and logs. */
unsigned long long fy_metric_count(const fy_metric_t *m);

/* Updates between begin and end are seen by a render all or none.  No
 * registration or render inside a batch (they wait for it to end). */
void fy_metrics_batch_begin(fy_metrics_t *reg);
void fy_metrics_batch_end(fy_metrics_t *reg);

/* The whole registry as Prometheus text, families in registration order.
 * On success *text_p (NUL-terminated, *len_p bytes without the NUL) is the
 * caller's to fy_free; FY_ERR_NOMEM otherwise. */
fy_status_t fy_metrics_render(fy_metrics_t *reg, char **text_p, size_t *len_p);

/* The content type of that text. */
#define FY_METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* vLLM's bucket bounds, in seconds (a superset: its queries work on them). */
extern const double fy_metrics_ttft_buckets[]; /* time to first token */
extern const int fy_metrics_n_ttft_buckets;
extern const double fy_metrics_itl_buckets[]; /* inter-token latency (finer below 10 ms than vLLM's) */
extern const int fy_metrics_n_itl_buckets;
extern const double fy_metrics_e2e_buckets[]; /* whole requests, queue time, transfers */
extern const int fy_metrics_n_e2e_buckets;
extern const double fy_metrics_iteration_buckets[]; /* tokens an engine step computes */
extern const int fy_metrics_n_iteration_buckets;

/* vLLM's token-count buckets: 1, 2, 5, 10, 20, 50, ... up to max (at
 * least 1), into out[cap]; the number written. */
int fy_metrics_buckets_125(double max, double *out, int cap);

/* The value of the first sample in Prometheus text that matches series:
 * "name" or "name{k=\"v\",...}", matched on the name and on the labels it
 * gives (a sample may carry more, such as model_name and role).  For
 * tests and tools that read /metrics.  FY_ERR_NOT_FOUND when no sample
 * matches. */
fy_status_t fy_metrics_sample(const char *text, const char *series, double *v_p);

#endif /* FY_METRICS_H */

/*
 * node_metrics.h - what every worker exports (both roles): the engine's,
 * the block manager's and the transfer engine's figures as Prometheus
 * series, copied from their stats on the engine tick; and the health
 * verdict that /health answers.
 *
 * The role's own series (histograms of its requests, leases, jobs) are
 * registered by the role in the same registry (fy_node_metrics in
 * node.h).  Serving over HTTP is node.c's; this file has no nng in it, so
 * the health rules can be tested on their own.
 */
#ifndef FY_NODE_METRICS_H
#define FY_NODE_METRICS_H

#include <stdbool.h>
#include <stddef.h>

#include "engine/engine.h"
#include "kv/kv.h"
#include "common/metrics.h"
#include "common/status.h"
#include "transfer/xfer.h"

typedef struct fy_node_series fy_node_series_t;

/* The KV cache as configured, for ferry:cache_config_info (vLLM's labels). */
typedef struct fy_node_cache_info {
    int32_t block_size;    /* tokens a block holds */
    int32_t device_blocks; /* num_gpu_blocks: the device tier */
    int32_t host_blocks;   /* num_cpu_blocks: the host tier (0: none) */
    const char *dtype;     /* cache_dtype: f16, f32, fp8, int8 */
    bool prefix_caching;   /* kv.prefix_cache */
    int32_t n_groups;      /* KV groups of the layout */
    size_t block_bytes;    /* bytes of one block, every layer of its group */
} fy_node_cache_info_t;

/* Registers the common series in reg (whose own labels carry model_name
 * and role).  worker: the worker's name; model_id: the model's identity
 * (worker_info's model_id label); cache: cache_config_info's labels;
 * host_tier: the block manager has a host tier (its block series are
 * exported too); puts: this role initiates KV transfers (prefill), so it
 * exports bytes and jobs. */
fy_status_t fy_node_series_create(fy_metrics_t *reg, const char *worker, const char *model_id,
                                  const fy_node_cache_info_t *cache, bool host_tier, bool puts, fy_node_series_t **s_p);
void fy_node_series_destroy(fy_node_series_t *s); /* accepts NULL; the series stay in reg */

/* Copies the figures into the series, as one batch (engine thread). */
void fy_node_series_sync(fy_node_series_t *s, const fy_engine_stats_t *es, const fy_kvm_stats_t *ks,
                         const fy_xfer_stats_t *xs, uint64_t bad_commands);

/* How KV moves between workers (worker.kv_transfer): which path runs,
 * what went over it, and the staging area's state when staged. */
typedef struct fy_node_path_series fy_node_path_series_t;

typedef struct fy_node_path_figures {
    uint64_t blocks, bytes; /* a prefill worker: blocks handed to puts; a decode worker: blocks received
                               * into its pool (adopted); bytes: theirs */
    uint64_t mem_refusals;  /* fy_xfer_stats_t.mem_refusals */
    bool staged;            /* the staging figures below are meant */
    int32_t staging_slots, staging_free;
    uint64_t staging_waits, staging_exhausted, staging_copy_failures;
} fy_node_path_figures_t;

/* path: fy_xfer_mem_name's words with the space made '_' ("direct_host",
 * "direct_cuda", "staged"), the label of ferry:kv_transfer_path_blocks_total
 * and ..._bytes_total; staged: the ferry:kv_staging_* series too. */
fy_status_t fy_node_path_series_create(fy_metrics_t *reg, const char *path, bool staged, fy_node_path_series_t **s_p);
void fy_node_path_series_destroy(fy_node_path_series_t *s); /* accepts NULL */
void fy_node_path_series_sync(fy_node_path_series_t *s, const fy_node_path_figures_t *f);

/* After every engine step (the engine's tick; engine thread): the tokens
 * the steps since the last call fed to their forward passes into the
 * iteration-tokens histogram, one observation a step (the mean when the
 * tick saw more than one step). */
void fy_node_series_step(fy_node_series_t *s, const fy_engine_stats_t *es);

/* ---- health ---- */

typedef struct fy_health {
    const char *role, *worker;
    bool up;              /* start-up finished and shutdown not begun */
    double last_tick;     /* CLOCK_MONOTONIC seconds of the engine's last tick */
    double stall_s;       /* a tick older than this is a stalled engine */
    bool kv_balanced;     /* free + used + cached == total in every tier, at the last tick */
    fy_status_t kv_check; /* the last full scan (fy_kvm_check) */
    fy_status_t xfer;     /* fy_xfer_health at the last tick */
    double xfer_waited;
    int32_t running, waiting;
    double kv_usage;
    char group[160]; /* "" or why the worker's rank group is out of service (no quotes or backslashes) */
} fy_health_t;

/* The verdict at now: 200 and {"status":"ok",...}, or 503 and
 * {"status":"unavailable","reason":"...",...} naming the first thing
 * wrong, in this order: not up (starting or shutting down), engine
 * stalled, rank group broken, KV books unbalanced, KV check failed, transfer engine down or
 * stuck.  The body is NUL-terminated (truncated to cap). */
int fy_health_eval(const fy_health_t *h, double now, char *body, size_t cap);

#endif /* FY_NODE_METRICS_H */

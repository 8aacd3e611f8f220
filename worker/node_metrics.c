/*
 * node_metrics.c - the series every worker exports, and the health
 * verdict (see node_metrics.h).  Names follow vLLM's where the meaning is
 * the same, under ferry:; docs/operations.md lists them.
 */
#include "worker/node_metrics.h"

#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "common/mem.h"

struct fy_node_series {
    fy_metrics_t *reg;
    bool host_tier, puts;
    fy_metric_t *usage;
    fy_metric_t *blocks[2][4]; /* [tier: device, host][free, used, cached, promised] */
    fy_metric_t *prefix_queries, *prefix_hits;
    fy_metric_t *preempt_recompute, *preempt_swap, *swap_out, *swap_in;
    fy_metric_t *grammar_compiled, *grammar_cached;
    fy_metric_t *window_dropped, *evicted, *groups[2], *disk_bad;
    fy_metric_t *running, *waiting, *swapped;
    fy_metric_t *prompt_tokens, *computed_tokens, *generation_tokens;
    fy_metric_t *refused_overloaded, *refused_invalid;
    fy_metric_t *spec_draft, *spec_accepted;
    fy_metric_t *layout_refusals, *peer_failures, *xfer_bytes, *xfer_ok, *xfer_failed;
    fy_metric_t *steps, *bad_commands;
    fy_metric_t *iteration_tokens;
    uint64_t last_steps, last_tokens; /* at the last fy_node_series_step */
};

static const char *const STATE[4] = {"free", "used", "cached", "promised"};

fy_status_t fy_node_series_create(fy_metrics_t *reg, const char *worker, const char *model_id,
                                  const fy_node_cache_info_t *cache, bool host_tier, bool puts, fy_node_series_t **s_p)
{
    fy_node_series_t *s = fy_calloc(1, sizeof(*s));
    if (!s) {
        fy_error("metrics: out of memory");
        return FY_ERR_NOMEM;
    }
    s->reg = reg;
    s->host_tier = host_tier;
    s->puts = puts;
    fy_metric_t *info, *cache_info;
    fy_status_t st;
    char bs[16], dev[16], host[16], groups[16], bytes[24];
    snprintf(bs, sizeof(bs), "%d", (int)cache->block_size);
    snprintf(dev, sizeof(dev), "%d", (int)cache->device_blocks);
    snprintf(host, sizeof(host), "%d", (int)cache->host_blocks);
    snprintf(groups, sizeof(groups), "%d", (int)cache->n_groups);
    snprintf(bytes, sizeof(bytes), "%zu", cache->block_bytes);
#define C(field, name, help, ...)                                                                                      \
    if (!st) st = fy_metrics_counter(reg, name, help, (const char *const[]){__VA_ARGS__, NULL}, &s->field)
#define G(field, name, help, ...)                                                                                      \
    if (!st) st = fy_metrics_gauge(reg, name, help, (const char *const[]){__VA_ARGS__, NULL}, &s->field)
    st = fy_metrics_gauge(reg, "ferry:worker_info", "This worker: its name and its model's identity (value 1).",
                          (const char *const[]){"worker", worker, "model_id", model_id, NULL}, &info);
    if (!st) fy_metric_set(info, 1);
    if (!st)
        st = fy_metrics_gauge(reg, "ferry:cache_config_info", "The KV cache as configured, in the labels (value 1).",
                              (const char *const[]){"block_size", bs, "num_gpu_blocks", dev, "num_cpu_blocks", host,
                                                    "cache_dtype", cache->dtype, "enable_prefix_caching",
                                                    cache->prefix_caching ? "true" : "false", "kv_groups", groups,
                                                    "block_bytes", bytes, NULL},
                              &cache_info);
    if (!st) fy_metric_set(cache_info, 1);
    G(usage, "ferry:kv_cache_usage_perc", "Share of device KV blocks in use by requests (0 to 1).", NULL);
    for (int t = 0; t < (host_tier ? 2 : 1); t++) {
        for (int k = 0; k < (t == 0 ? 4 : 3); k++) {
            G(blocks[t][k], "ferry:kv_blocks",
              "KV blocks by tier and state: free, used (held by requests), cached (prefix cache, evictable); "
              "promised blocks are free blocks set aside at admission.",
              "tier", t == 0 ? "device" : "host", "state", STATE[k]);
        }
    }
    C(prefix_queries, "ferry:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.", NULL);
    C(prefix_hits, "ferry:prefix_cache_hits_total", "Prompt tokens found in the prefix cache.", NULL);
    C(preempt_recompute, "ferry:num_preemptions_total", "Requests preempted, by how.", "mode", "recompute");
    C(preempt_swap, "ferry:num_preemptions_total", "Requests preempted, by how.", "mode", "swap");
    C(grammar_compiled, "ferry:grammar_requests_total",
      "Requests with a structured output, by whether its grammar was compiled or found in the engine's cache.",
      "grammar", "compiled");
    C(grammar_cached, "ferry:grammar_requests_total",
      "Requests with a structured output, by whether its grammar was compiled or found in the engine's cache.",
      "grammar", "cached");
    C(swap_out, "ferry:kv_swapped_blocks_total", "KV blocks moved by swap preemption.", "direction", "out");
    C(swap_in, "ferry:kv_swapped_blocks_total", "KV blocks moved by swap preemption.", "direction", "in");
    C(window_dropped, "ferry:kv_window_dropped_blocks_total",
      "KV blocks sliding-window groups gave back while their requests ran (no query could see them).", NULL);
    C(evicted, "ferry:kv_evicted_blocks_total",
      "KV blocks evicted by KV budgets (kv.evict: StreamingLLM or H2O), each group's copy counted.", NULL);
    C(disk_bad, "ferry:kv_disk_blocks_dropped_total",
      "KV blocks of the disk tier (kv.disk_dir) dropped when read back: they did not match their checksum.", NULL);
    G(groups[0], "ferry:kv_groups", "KV groups of the layout (block tables per request), by window.", "window",
      "global");
    G(groups[1], "ferry:kv_groups", "KV groups of the layout (block tables per request), by window.", "window",
      "sliding");
    G(running, "ferry:engine_num_requests_running", "Requests in the engine's running batch.", NULL);
    G(waiting, "ferry:engine_num_requests_waiting", "Requests queued in the engine, not yet running.", NULL);
    G(swapped, "ferry:engine_num_requests_swapped", "Requests swapped out to the host tier.", NULL);
    C(prompt_tokens, "ferry:engine_prompt_tokens_total",
      "Prompt tokens of requests this engine took in (submitted on a prefill worker, adopted on a decode worker), "
      "prefix-cache hits included.",
      NULL);
    C(computed_tokens, "ferry:engine_prompt_tokens_computed_total",
      "Prompt tokens this engine computed (hits and adopted prompts excluded; recomputation after preemption "
      "included).",
      NULL);
    C(generation_tokens, "ferry:engine_generation_tokens_total", "Tokens sampled by this engine.", NULL);
    C(refused_overloaded, "ferry:engine_requests_refused_total", "Requests the engine refused at submission.", "reason",
      "overloaded");
    C(refused_invalid, "ferry:engine_requests_refused_total", "Requests the engine refused at submission.", "reason",
      "invalid");
    C(spec_draft, "ferry:spec_decode_num_draft_tokens_total", "Draft tokens proposed by speculative decoding.", NULL);
    C(spec_accepted, "ferry:spec_decode_num_accepted_tokens_total", "Draft tokens accepted by the target model.", NULL);
    C(layout_refusals, "ferry:kv_layout_refusals_total",
      "KV transfer connections refused because the two sides' KV layouts differ.", NULL);
    C(peer_failures, "ferry:kv_transfer_peer_failures_total",
      "KV transfer connections lost, timed out or closed by force.", NULL);
    if (puts) {
        C(xfer_bytes, "ferry:kv_transfer_bytes_total", "KV bytes put into decode workers' caches.", NULL);
        C(xfer_ok, "ferry:kv_transfer_jobs_total", "KV transfer jobs ended, by result.", "result", "ok");
        C(xfer_failed, "ferry:kv_transfer_jobs_total", "KV transfer jobs ended, by result.", "result", "failed");
    }
    C(steps, "ferry:engine_steps_total", "Forward passes the engine ran.", NULL);
    C(bad_commands, "ferry:bad_commands_total", "Commands from the router that did not parse.", NULL);
    if (!st)
        st = fy_metrics_histogram(
            reg, "ferry:iteration_tokens",
            "Tokens an engine step fed to its forward pass: prompt chunks, decoded tokens and speculative drafts.",
            NULL, fy_metrics_iteration_buckets, fy_metrics_n_iteration_buckets, &s->iteration_tokens);
#undef C
#undef G
    if (st) {
        fy_free(s);
        return st;
    }
    *s_p = s;
    return FY_OK;
}

void fy_node_series_destroy(fy_node_series_t *s) { fy_free(s); }

void fy_node_series_sync(fy_node_series_t *s, const fy_engine_stats_t *es, const fy_kvm_stats_t *ks,
                         const fy_xfer_stats_t *xs, uint64_t bad_commands)
{
    fy_metrics_batch_begin(s->reg);
    fy_metric_set(s->usage, ks->usage);
    for (int t = 0; t < (s->host_tier ? 2 : 1); t++) {
        const fy_kvm_tier_stats_t *ts = &ks->tier[t == 0 ? FY_KV_DEVICE : FY_KV_HOST];
        fy_metric_set(s->blocks[t][0], ts->free);
        fy_metric_set(s->blocks[t][1], ts->used);
        fy_metric_set(s->blocks[t][2], ts->cached);
    }
    fy_metric_set(s->blocks[0][3], ks->promised);
    fy_metric_set(s->prefix_queries, (double)ks->query_tokens);
    fy_metric_set(s->prefix_hits, (double)ks->hit_tokens);
    fy_metric_set(s->preempt_recompute, (double)es->preemptions_recompute);
    fy_metric_set(s->preempt_swap, (double)es->preemptions_swap);
    fy_metric_set(s->grammar_compiled, (double)es->grammar_compiles);
    fy_metric_set(s->grammar_cached, (double)es->grammar_cache_hits);
    fy_metric_set(s->swap_out, (double)ks->swap_out_blocks);
    fy_metric_set(s->swap_in, (double)ks->swap_in_blocks);
    fy_metric_set(s->window_dropped, (double)ks->slid_blocks);
    fy_metric_set(s->evicted, (double)ks->evicted_blocks);
    fy_metric_set(s->disk_bad, (double)ks->disk_bad_blocks);
    fy_metric_set(s->groups[0], ks->groups_global);
    fy_metric_set(s->groups[1], ks->groups_sliding);
    fy_metric_set(s->running, es->running);
    fy_metric_set(s->waiting, es->waiting);
    fy_metric_set(s->swapped, es->swapped);
    fy_metric_set(s->prompt_tokens, (double)es->prompt_tokens);
    fy_metric_set(s->computed_tokens, (double)es->computed_prompt_tokens);
    fy_metric_set(s->generation_tokens, (double)es->generation_tokens);
    fy_metric_set(s->refused_overloaded, (double)es->refused_overloaded);
    fy_metric_set(s->refused_invalid, (double)es->refused_invalid);
    fy_metric_set(s->spec_draft, (double)es->spec_proposed);
    fy_metric_set(s->spec_accepted, (double)es->spec_accepted);
    fy_metric_set(s->layout_refusals, (double)xs->layout_refusals);
    fy_metric_set(s->peer_failures, (double)xs->peer_failures);
    if (s->puts) {
        fy_metric_set(s->xfer_bytes, (double)xs->bytes);
        fy_metric_set(s->xfer_ok, (double)xs->jobs_ok);
        fy_metric_set(s->xfer_failed, (double)xs->jobs_failed);
    }
    fy_metric_set(s->steps, (double)es->steps);
    fy_metric_set(s->bad_commands, (double)bad_commands);
    fy_metrics_batch_end(s->reg);
}

struct fy_node_path_series {
    fy_metrics_t *reg;
    bool staged;
    fy_metric_t *blocks, *bytes, *mem_refusals;
    fy_metric_t *slots, *free, *waits, *exhausted, *copy_failures;
};

fy_status_t fy_node_path_series_create(fy_metrics_t *reg, const char *path, bool staged, fy_node_path_series_t **s_p)
{
    fy_node_path_series_t *s = fy_calloc(1, sizeof(*s));
    if (!s) return FY_ERR_NOMEM;
    s->reg = reg;
    s->staged = staged;
    fy_status_t st = FY_OK;
#define C(field, name, help, ...)                                                                                      \
    if (!st) st = fy_metrics_counter(reg, name, help, (const char *const[]){__VA_ARGS__, NULL}, &s->field)
#define G(field, name, help, ...)                                                                                      \
    if (!st) st = fy_metrics_gauge(reg, name, help, (const char *const[]){__VA_ARGS__, NULL}, &s->field)
    C(blocks, "ferry:kv_transfer_path_blocks_total",
      "KV blocks moved between workers, by path (worker.kv_transfer: direct_host, direct_cuda, staged): on a prefill "
      "worker handed to puts, on a decode worker received into its pool.",
      "path", path);
    C(bytes, "ferry:kv_transfer_path_bytes_total", "The bytes of ferry:kv_transfer_path_blocks_total.", "path", path);
    C(mem_refusals, "ferry:kv_memory_refusals_total",
      "KV transfer connections refused because the two sides' memory cannot meet (direct cuda with a UCX without "
      "CUDA memory support).",
      NULL);
    if (staged) {
        G(slots, "ferry:kv_staging_blocks", "Blocks of the pinned host staging area (worker.kv_staging_blocks).", NULL);
        G(free, "ferry:kv_staging_free_blocks", "Staging blocks free now; all of them when no transfer is under way.",
          NULL);
        C(waits, "ferry:kv_staging_waits_total", "Times a transfer found fewer free staging blocks than it wanted.",
          NULL);
        C(exhausted, "ferry:kv_staging_exhausted_total",
          "Reservations refused because the staging area could not take the whole prompt (decode workers).", NULL);
        C(copy_failures, "ferry:kv_staging_copy_failures_total",
          "Copies between the KV pool and the staging area that failed.", NULL);
    }
#undef C
#undef G
    if (st) {
        fy_free(s);
        return st;
    }
    *s_p = s;
    return FY_OK;
}

void fy_node_path_series_destroy(fy_node_path_series_t *s) { fy_free(s); }

void fy_node_path_series_sync(fy_node_path_series_t *s, const fy_node_path_figures_t *f)
{
    fy_metrics_batch_begin(s->reg);
    fy_metric_set(s->blocks, (double)f->blocks);
    fy_metric_set(s->bytes, (double)f->bytes);
    fy_metric_set(s->mem_refusals, (double)f->mem_refusals);
    if (s->staged) {
        fy_metric_set(s->slots, f->staging_slots);
        fy_metric_set(s->free, f->staging_free);
        fy_metric_set(s->waits, (double)f->staging_waits);
        fy_metric_set(s->exhausted, (double)f->staging_exhausted);
        fy_metric_set(s->copy_failures, (double)f->staging_copy_failures);
    }
    fy_metrics_batch_end(s->reg);
}

void fy_node_series_step(fy_node_series_t *s, const fy_engine_stats_t *es)
{
    uint64_t tokens = es->forward_tokens;
    uint64_t steps = es->steps - s->last_steps, done = tokens - s->last_tokens;
    s->last_steps = es->steps;
    s->last_tokens = tokens;
    /* a tick with no step (idle) observes nothing; more than one step
     * between ticks is not expected (the engine ticks after each) */
    for (uint64_t i = 0; i < steps && i < 64; i++) fy_metric_observe(s->iteration_tokens, (double)done / (double)steps);
}

/* ---- health ---------------------------------------------------------------------------------------- */

int fy_health_eval(const fy_health_t *h, double now, char *body, size_t cap)
{
    char why[200] = "";
    double idle = now - h->last_tick;
    if (!h->up)
        snprintf(why, sizeof(why), "not serving: starting up or shutting down");
    else if (idle > h->stall_s)
        snprintf(why, sizeof(why), "engine stalled: no step or tick for %.2f s (limit %.2f s)", idle, h->stall_s);
    else if (h->group[0])
        snprintf(why, sizeof(why), "%.180s", h->group);
    else if (!h->kv_balanced)
        snprintf(why, sizeof(why), "kv pool books do not balance: free + used + cached != total");
    else if (h->kv_check != FY_OK)
        snprintf(why, sizeof(why), "kv pool invariant check failed: %s", fy_status_str(h->kv_check));
    else if (h->xfer == FY_ERR_TIMEOUT)
        snprintf(why, sizeof(why), "transfer engine stuck: a ping unanswered for %.2f s", h->xfer_waited);
    else if (h->xfer != FY_OK)
        snprintf(why, sizeof(why), "transfer engine down: %s", fy_status_str(h->xfer));
    int code = why[0] ? 503 : 200;
    if (cap == 0) return code;
    /* role and worker come from the configuration: keep them out of the
     * JSON when they would need escaping */
    const char *role = strpbrk(h->role, "\"\\") ? "?" : h->role;
    const char *worker = strpbrk(h->worker, "\"\\") ? "?" : h->worker;
    int n;
    if (code == 200)
        n = snprintf(body, cap,
                     "{\"status\":\"ok\",\"role\":\"%s\",\"worker\":\"%s\",\"engine_idle_s\":%.3f,"
                     "\"running\":%d,\"waiting\":%d,\"kv_usage\":%.4f}\n",
                     role, worker, idle, h->running, h->waiting, h->kv_usage);
    else
        n = snprintf(body, cap, "{\"status\":\"unavailable\",\"reason\":\"%s\",\"role\":\"%s\",\"worker\":\"%s\"}\n",
                     why, role, worker);
    (void)n;
    return code;
}

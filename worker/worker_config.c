/*
 * worker_config.c - a worker's engine build from its configuration (see
 * worker_config.h).
 */
#include "worker/worker_config.h"

#include <errno.h>
#include <sodium.h>
#include <string.h>

#include "common/cluster.h"
#include "common/config.h"
#include "common/log.h"

/* A decode worker's speculative decoding from decode.spec*: the method and
 * its controller into sp, the draft's spec ("draft:FILE", "self:L") and
 * its share of the KV budget. */
static fy_status_t spec_read(const fy_config_t *c, fy_spec_params_t *sp, const char **draft_p, double *frac_p)
{
    const char *spec;
    int64_t k, ngram, warmup, probe, batch, history;
    int lookup;
    double min_accept, frac;
    bool sampled, cost_aware;
    fy_status_t st;
    if ((st = fy_conf_string(c, "decode", "spec", &spec)) || (st = fy_conf_int(c, "decode", "spec_k", &k)) ||
        (st = fy_conf_int(c, "decode", "spec_ngram_max", &ngram)) ||
        (st = fy_conf_enum(c, "decode", "spec_lookup", &lookup)) ||
        (st = fy_conf_int(c, "decode", "spec_history", &history)) ||
        (st = fy_conf_float(c, "decode", "spec_min_accept", &min_accept)) ||
        (st = fy_conf_int(c, "decode", "spec_warmup", &warmup)) ||
        (st = fy_conf_int(c, "decode", "spec_probe_steps", &probe)) ||
        (st = fy_conf_int(c, "decode", "spec_batch_tokens", &batch)) ||
        (st = fy_conf_bool(c, "decode", "spec_sampled", &sampled)) ||
        (st = fy_conf_bool(c, "decode", "spec_cost_aware", &cost_aware)) ||
        (st = fy_conf_float(c, "decode", "spec_draft_kv_fraction", &frac)))
        return st;
    const char *draft = NULL;
    if (!strcmp(spec, "none")) {
        sp->method = FY_SPEC_NONE;
    } else if (!strcmp(spec, "ngram")) {
        sp->method = FY_SPEC_NGRAM;
    } else if (!strncmp(spec, "draft:", 6) || !strncmp(spec, "self:", 5)) {
        sp->method = FY_SPEC_DRAFT;
        draft = spec;
    } else {
        fy_error("config: decode.spec = '%s': expected none, ngram, draft:MODEL_FILE or self:LAYERS", spec);
        return FY_ERR_INVALID;
    }
    sp->k_max = (int32_t)k;
    sp->ngram_max = (int32_t)ngram;
    sp->lookup = lookup ? FY_SPEC_LOOKUP_NGRAM : FY_SPEC_LOOKUP_SUFFIX; /* "suffix|ngram" */
    sp->history = (int32_t)history;
    sp->min_accept = min_accept;
    sp->warmup = (int32_t)warmup;
    sp->probe_steps = (int32_t)probe;
    sp->batch_tokens = (int32_t)batch;
    sp->sampled = sampled;
    sp->cost_aware = cost_aware;
    *draft_p = draft;
    *frac_p = frac;
    return FY_OK;
}

/* kv.disk_dir and kv.disk_bytes: a decode worker's disk tier, under its
 * host tier; refused at start, naming the key, where it cannot serve. */
static fy_status_t disk_read(const fy_config_t *c, const char *role, int64_t host_mem, int64_t ranks,
                             fy_engine_build_t *b)
{
    const char *dir;
    int64_t bytes;
    fy_status_t st;
    if ((st = fy_conf_string(c, "kv", "disk_dir", &dir)) || (st = fy_conf_size(c, "kv", "disk_bytes", &bytes)))
        return st;
    if (!dir || !*dir) return FY_OK;
    char why[200];
    if (fy_kv_disk_dir_check(dir, why, sizeof(why)) != FY_OK) {
        fy_error("kv.disk_dir = '%s': the folder %s", dir, why);
        return FY_ERR_INVALID;
    }
    if (host_mem <= 0) {
        fy_error("kv.disk_dir = '%s': the disk tier takes what the host tier evicts; set %s.host_kv_mem", dir, role);
        return FY_ERR_INVALID;
    }
    if (ranks > 1) {
        fy_error("kv.disk_dir = '%s': not with a rank group (%lld ranks): only rank 0's host arena would reach the "
                 "disk",
                 dir, (long long)ranks);
        return FY_ERR_UNSUPPORTED;
    }
    b->disk_dir = dir;
    b->disk_bytes = bytes;
    return FY_OK;
}

fy_status_t fy_worker_build_read(const fy_config_t *c, const char *role, fy_engine_build_t *b_p)
{
    bool decode = !strcmp(role, "decode");
    const char *isa, *device, *draft = NULL;
    int64_t threads, kv_mem, max_seqs, max_batch, max_waiting, ctx, host_mem = 0;
    int32_t block_size;
    fy_dtype_t kv_dtype;
    bool prefix_caching, sliding_groups, graphs;
    int evict, attn;
    int64_t sink, recent, heavy;
    double draft_frac = 0;
    fy_status_t st;
    if ((st = fy_conf_string(c, "worker", "isa", &isa)) || (st = fy_conf_string(c, "worker", "device", &device)) ||
        (st = fy_conf_enum(c, "worker", "attn", &attn)) || (st = fy_conf_int(c, role, "threads", &threads)) ||
        (st = fy_conf_size(c, role, "kv_mem", &kv_mem)) || (st = fy_conf_int(c, role, "max_seqs", &max_seqs)) ||
        (st = fy_conf_int(c, role, "max_batch_tokens", &max_batch)) ||
        (st = fy_conf_int(c, role, "max_waiting", &max_waiting)) || (st = fy_conf_int(c, role, "ctx", &ctx)) ||
        (st = fy_cluster_kv(c, &block_size, &kv_dtype)) ||
        (st = fy_conf_bool(c, "kv", "prefix_cache", &prefix_caching)) ||
        (st = fy_conf_bool(c, "worker", "cuda_graphs", &graphs)) ||
        (st = fy_conf_bool(c, "kv", "sliding_groups", &sliding_groups)) ||
        (st = fy_conf_enum(c, "kv", "evict", &evict)) || (st = fy_conf_int(c, "kv", "sink_tokens", &sink)) ||
        (st = fy_conf_int(c, "kv", "recent_tokens", &recent)) || (st = fy_conf_int(c, "kv", "heavy_tokens", &heavy)) ||
        (decode && (st = fy_conf_size(c, role, "host_kv_mem", &host_mem))))
        return st;
    int32_t tp, pp;
    if ((st = fy_cluster_ranks(c, role, &tp, &pp))) return st;
    if (max_batch < max_seqs) max_batch = max_seqs;

    fy_engine_build_t b;
    fy_engine_build_default(&b);
    b.device = device;
    b.threads = (int)threads;
    b.isa = isa;
    b.attn_bf16 = attn == 1; /* "f32|bf16" */
    /* the deployment's prefix-hash secret: blocks are named alike on every worker and the router */
    size_t key_len = 0;
    if ((st = fy_cluster_prefix_secret(c, b.hash_key, sizeof(b.hash_key), &key_len))) return st;
    b.hash_key_len = key_len;
    /* kv.prefix_cache = false: no block is named or kept after its request
     * (the baseline of the harness's prefix-caching experiment) */
    b.prefix_caching = prefix_caching;
    fy_engine_params_t *ep = &b.engine;
    if (decode) {
        int preempt;
        if ((st = spec_read(c, &ep->spec, &draft, &draft_frac)) || (st = fy_conf_enum(c, role, "preempt", &preempt)) ||
            (st = fy_conf_duration(c, role, "itl_target", &ep->itl_target_s)))
            return st;
        ep->preempt = preempt ? FY_PREEMPT_SWAP : FY_PREEMPT_RECOMPUTE; /* "recompute|swap" */
    }
    /* kv.evict: none|streaming|h2o, the table's order */
    ep->evict = (fy_evict_params_t){.policy = (fy_evict_policy_t)evict,
                                    .sink_tokens = (int32_t)sink,
                                    .recent_tokens = (int32_t)recent,
                                    .heavy_tokens = evict == FY_EVICT_H2O ? (int32_t)heavy : 0};
    ep->max_num_seqs = (int32_t)max_seqs;
    ep->max_num_batched_tokens = (int32_t)max_batch;
    ep->max_waiting = (int32_t)max_waiting;

    fy_runner_params_t *rp = &b.runner;
    rp->max_seqs = rp->max_logits = (int32_t)max_seqs;
    const fy_spec_params_t *sp = &ep->spec;
    if (sp->method != FY_SPEC_NONE) { /* logit rows for verifications: the proposals a step can hold */
        int64_t rows = max_seqs + (sp->batch_tokens > 0 ? sp->batch_tokens : max_seqs * sp->k_max);
        rp->max_logits = (int32_t)(rows < max_batch ? rows : max_batch);
    }
    rp->max_batch_tokens = (int32_t)max_batch;
    rp->max_ctx = (int32_t)ctx;
    /* a draft's KV comes out of the same budget */
    rp->kv_mem = draft ? (int64_t)((double)kv_mem * (1 - draft_frac)) : kv_mem;
    rp->block_size = block_size;
    rp->kv_dtype = kv_dtype;
    rp->kv_one_group = !sliding_groups;
    rp->graphs = graphs ? 1 : 0;
    rp->tp = tp;
    rp->pp = pp;
    b.shared_arenas = rp->tp * rp->pp > 1; /* the worker's transfer engine puts into every rank's arena */
    b.host_kv_mem = host_mem;
    if (decode && (st = disk_read(c, role, host_mem, (rp->tp > 1 ? rp->tp : 1) * (rp->pp > 1 ? rp->pp : 1), &b)))
        return st;
    b.draft = draft;
    b.draft_kv_mem = draft ? (int64_t)((double)kv_mem * draft_frac) : 0;
    b.role = role;
    *b_p = b;
    sodium_memzero(&b, sizeof(b));
    return FY_OK;
}

/* a string the build points at, moved into nc's own copy (NULL stays NULL) */
static fy_status_t own(const char **p, char *buf, size_t cap, const char *key)
{
    if (!*p) return FY_OK;
    size_t n = strlen(*p);
    if (n >= cap) {
        fy_error("config: %s: %zu bytes; at most %zu fit here", key, n, cap - 1);
        return FY_ERR_INVALID;
    }
    memcpy(buf, *p, n + 1);
    *p = buf;
    return FY_OK;
}

fy_status_t fy_node_conf_read(const fy_config_t *c, const char *role, fy_node_conf_t *nc)
{
    memset(nc, 0, sizeof(*nc));
    fy_status_t st;
    if ((st = fy_conf_copy(c, role, "cpus", nc->cpus, sizeof(nc->cpus))) ||
        (st = fy_conf_copy(c, "model", "path", nc->model_path, sizeof(nc->model_path))) ||
        (st = fy_conf_copy(c, "worker", "name", nc->name, sizeof(nc->name))) ||
        (st = fy_conf_copy(c, role, "listen", nc->listen, sizeof(nc->listen))) ||
        (st = fy_conf_copy(c, "router", "events", nc->events, sizeof(nc->events))) ||
        (st = fy_conf_copy(c, "worker", "transports", nc->transports, sizeof(nc->transports))) ||
        (st = fy_conf_copy(c, "worker", "net_devices", nc->net_devices, sizeof(nc->net_devices))) ||
        (st = fy_conf_duration(c, "worker", "heartbeat", &nc->heartbeat)) ||
        (st = fy_conf_duration(c, "worker", "stall_timeout", &nc->stall)) ||
        (st = fy_conf_copy(c, role, "metrics", nc->metrics, sizeof(nc->metrics))) ||
        (st = fy_conf_copy(c, "worker", "kv_transfer", nc->kv_transfer, sizeof(nc->kv_transfer))) ||
        (st = fy_conf_int(c, "worker", "kv_staging_blocks", &nc->staging_blocks)) ||
        (st = fy_worker_build_read(c, role, &nc->eb)) ||
        (st = own(&nc->eb.device, nc->device, sizeof(nc->device), "worker.device")) ||
        (st = own(&nc->eb.isa, nc->isa, sizeof(nc->isa), "worker.isa")) ||
        (st = own(&nc->eb.disk_dir, nc->disk_dir, sizeof(nc->disk_dir), "kv.disk_dir")) ||
        (st = own(&nc->eb.draft, nc->draft, sizeof(nc->draft), "decode.spec")) ||
        (st = fy_conf_copy(c, "kv", "secret_file", nc->secret_file, sizeof(nc->secret_file))) ||
        (st = fy_conf_enum(c, "cluster", "encrypt", &nc->encrypt)) ||
        (st = fy_cluster_served_model_name(c, nc->served, sizeof(nc->served))) ||
        (st = fy_conf_bool(c, "kv", "prefix_cache", &nc->prefix_cache)) || (st = fy_netconf_members(c, &nc->members)) ||
        (nc->metrics[0] && (st = fy_netconf_httpd(c, "worker", &nc->http_lim))) ||
        (!strcmp(role, "decode") && (st = fy_conf_duration(c, "decode", "max_lease", &nc->max_lease)))) {
        sodium_memzero(nc, sizeof(*nc));
        return st;
    }
    return FY_OK;
}

void fy_node_conf_wipe_secrets(fy_node_conf_t *nc)
{
    sodium_memzero(nc->eb.hash_key, sizeof(nc->eb.hash_key));
    fy_netconf_members_wipe(&nc->members);
}

fy_status_t fy_node_conf_load(int argc, char **argv, const char *usage, const char *role, fy_node_conf_t *nc,
                              bool *loaded)
{
    fy_config_t *cfg = NULL;
    fy_status_t st = fy_cluster_config(argc, argv, usage, &cfg);
    *loaded = st == FY_OK;
    if (st) return st;
    st = fy_node_conf_read(cfg, role, nc);
    fy_config_destroy(cfg);
    return st;
}

/*
 * engine_config.c - an engine and what it runs on, from a configuration
 * or a command's options (see engine_config.h).
 */
#include "engine_config.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cluster.h"
#include "cpuset.h"
#include "kvplan.h"
#include "log.h"
#include "mem.h"

void fy_engine_build_default(fy_engine_build_t *b)
{
    *b = (fy_engine_build_t){.prefix_caching = true, .watermark = -1};
    fy_runner_params_default(&b->runner);
    fy_engine_params_default(&b->engine);
}

/* A decode worker's speculative decoding from decode.spec*: the method and
 * its controller into sp, the draft's spec ("draft:FILE", "self:L") and
 * its share of the KV budget. */
static fy_status_t spec_read(const fy_config_t *c, fy_spec_params_t *sp, const char **draft_p, double *frac_p)
{
    const char *spec;
    int64_t k, ngram, warmup, probe, batch, history;
    int lookup;
    double min_accept, frac;
    bool sampled;
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

fy_status_t fy_engine_build_read(const fy_config_t *c, const char *role, fy_engine_build_t *b_p)
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
    b.cluster = c;
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
    return FY_OK;
}

/* A group can serve what b asks? */
static fy_status_t group_check(const fy_model_t *m, const fy_engine_build_t *b, const fy_runner_params_t *rp)
{
    fy_status_t st = fy_runner_check_shape(m, rp);
    if (st != FY_OK) return st;
    const char *why = NULL;
    if (b->draft)
        why = "a speculative draft";
    else if (b->engine.evict.policy == FY_EVICT_H2O)
        why = "H2O eviction (kv.evict = h2o: its attention scores are not gathered across ranks)";
    else if (b->device && strcmp(b->device, "cpu"))
        why = "a device other than the cpu (the collectives move host memory)";
    if (why) {
        fy_error("engine: tp %d x pp %d ranks do not run %s", rp->tp, rp->pp, why);
        return FY_ERR_UNSUPPORTED;
    }
    if (rp->n_kv_blocks == 0 && rp->kv_mem == 0) {
        fy_error("engine: tp %d x pp %d ranks need a kv block count or kv_mem (each rank sizing from the memory it "
                 "finds free could get unequal pools)",
                 rp->tp, rp->pp);
        return FY_ERR_INVALID;
    }
    return FY_OK;
}

/* A worker's pool, sized from ROLE.kv_mem, against its context: it must
 * admit one request of the whole context (what the block manager counts:
 * fy_kvm_blocks_for, less the watermark), else a prompt the worker
 * advertises could never run.  An explicit ROLE.ctx is refused (the
 * operator asked for it: vLLM refuses too).  The default, the model's
 * trained context (32k, 128k), would make the default kv_mem refuse most
 * models: a warning says how long a request the pool admits, and longer
 * ones are refused as needing more blocks than the worker holds (the
 * router's placement).  The context itself is not lowered: a prefill
 * worker's bounds the max_tokens it accepts (the wire's limits), and its
 * pool holds only prompts while the decode worker's holds their outputs
 * too. */
static fy_status_t pool_check(const fy_model_t *m, const fy_engine_build_t *b, fy_engine_stack_t *s)
{
    const fy_runner_params_t *rp = fy_runner_params(s->runner);
    const fy_kv_layout_t *lay = fy_kvm_layout(s->kvm);
    /* a KV budget (kv.evict) caps what any request holds, as the engine counts it */
    int32_t cap = fy_evict_max_blocks(&b->engine.evict, lay->block_size, b->engine.max_num_batched_tokens);
    int32_t most = fy_kvm_capacity(s->kvm), ctx = rp->max_ctx, need = fy_kvm_blocks_for_capped(s->kvm, ctx, 0, 0, cap);
    if (need <= most) return FY_OK;
    int32_t lo = 0, hi = ctx; /* what a request needs grows with its length: the longest that fits */
    while (hi - lo > 1) {
        int32_t mid = lo + (hi - lo) / 2;
        if (fy_kvm_blocks_for_capped(s->kvm, mid, 0, 0, cap) <= most)
            lo = mid;
        else
            hi = mid;
    }
    /* the pool that would serve the whole context, in bytes of kv_mem (a
     * budget holds fewer pages than the pool function counts: no figure) */
    float wm = b->watermark >= 0 ? b->watermark : FY_KVM_WATERMARK;
    int32_t want = fy_kv_pool_blocks(lay, ctx, 1, rp->max_batch_tokens, wm);
    fy_runner_params_t full = *rp;
    full.n_kv_blocks = want;
    size_t bytes = 0;
    char ask[96] = "";
    if (b->engine.evict.policy == FY_EVICT_NONE && want > 0 && !fy_runner_group_arena_bytes(m, &full, &bytes))
        snprintf(ask, sizeof(ask), "; %zu MiB of KV would serve the whole of it", (bytes + (1 << 20) - 1) >> 20);
    if (b->runner.max_ctx > 0 || lo < 2) {
        fy_error(
            "%s.kv_mem: its pool of %d kv blocks admits %d pages, and one request of %s.ctx = %d tokens needs %d%s; "
            "raise %s.kv_mem or lower %s.ctx to %d",
            b->role, rp->n_kv_blocks, most, b->role, ctx, need, ask, b->role, b->role, lo);
        return FY_ERR_INVALID;
    }
    fy_warn("%s.ctx: the model's context of %d tokens does not fit %s.kv_mem (its pool of %d kv blocks admits %d "
            "pages; such a request needs %d): requests of up to %d tokens are served, longer ones refused%s",
            b->role, ctx, b->role, rp->n_kv_blocks, most, need, lo, ask);
    return FY_OK;
}

/* Can the backend the worker got serve this model and configuration?
 * Refused here, at start, naming what to change, rather than at the first
 * forward pass. */
static fy_status_t backend_check(const fy_model_t *m, const fy_engine_build_t *b, const fy_runner_params_t *rp,
                                 fy_backend_t *be)
{
    const fy_model_config_t *c = fy_model_config(m);
    fy_backend_needs_t n = {.n_heads = c->n_heads,
                            .n_kv_heads = c->n_kv_heads,
                            .head_dim = c->head_dim,
                            .kv_dtype = rp->kv_dtype,
                            .attn_scores = b->engine.evict.policy == FY_EVICT_H2O};
    char why[256] = "";
    fy_status_t st = fy_backend_check(be, &n, why, sizeof(why));
    if (st != FY_OK)
        fy_error("engine: worker.device = %s (%s) cannot serve this configuration: %s", b->device ? b->device : "cpu",
                 fy_backend_describe(be), why);
    return st;
}

/* A rank other than 0, in the forked child: its backend and shard, then
 * rank 0's commands until the group ends.  Never returns. */
static _Noreturn void follower_main(const fy_model_t *m, const fy_engine_build_t *b, const fy_runner_params_t *rp,
                                    fy_group_t *g, int threads)
{
    fy_backend_params_t bp = {.n_threads = threads, .isa = b->isa, .attn_bf16 = b->attn_bf16};
    fy_backend_t *be = NULL;
    fy_runner_t *r = NULL;
    fy_status_t st = fy_backend_create_device(b->device, &bp, &be);
    if (st == FY_OK) st = fy_runner_create_rank(m, be, rp, g, &r);
    if (st != FY_OK) {
        char why[96];
        snprintf(why, sizeof(why), "rank %d could not start: %s", fy_group_rank(g), fy_status_str(st));
        fy_group_abort(g, why);
    } else {
        st = fy_runner_follow(r);
    }
    fy_runner_destroy(r);
    fy_backend_destroy(be);
    fy_group_destroy(g);
    _exit(st == FY_OK ? 0 : 1);
}

fy_status_t fy_engine_stack_create(const fy_model_t *m, const fy_engine_build_t *b, fy_engine_stack_t *s_p)
{
    fy_engine_stack_t s = {0};
    fy_runner_params_t rp = b->runner;
    fy_status_t st;
    int32_t n_ranks = (rp.tp > 1 ? rp.tp : 1) * (rp.pp > 1 ? rp.pp : 1);
    if (n_ranks > 1 && (st = group_check(m, b, &rp))) return st;
    if (b->host_kv_mem > 0) { /* the host tier (swap preemption), in whole blocks */
        fy_kv_layout_t lay;
        if ((st = fy_runner_layout_for(m, fy_model_config(m)->n_layers, &rp, &lay))) return st;
        rp.n_host_blocks = (int32_t)(b->host_kv_mem / ((int64_t)lay.block_bytes * lay.n_groups));
    }
    int threads = b->threads;
    if (n_ranks > 1) { /* fork before the backend starts its threads */
        fy_group_params_t gp;
        int32_t rank;
        if ((st = fy_runner_group_params(m, &rp, &gp))) return st;
        if (b->group_timeout_ms > 0) gp.timeout_ms = b->group_timeout_ms;
        if (b->shared_arenas) { /* every rank's arena where rank 0 sees it too: mapped before the fork */
            size_t stride, all;
            if ((st = fy_runner_group_arena_bytes(m, &rp, &stride))) return st;
            if (!fy_mul_size(stride, (size_t)n_ranks, &all)) return FY_ERR_INVALID;
            void *a = mmap(NULL, all, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (a == MAP_FAILED) {
                fy_error("engine: cannot map %zu MiB of kv arenas for %d ranks: %s", all >> 20, n_ranks,
                         strerror(errno));
                return FY_ERR_NOMEM;
            }
            s.arenas = a;
            s.arenas_bytes = all;
            s.arena_stride = stride;
            rp.kv_arenas = a;
            rp.kv_arena_stride = stride;
        }
        if ((st = fy_group_spawn(&gp, &s.group, &rank))) {
            if (s.arenas) munmap(s.arenas, s.arenas_bytes);
            return st;
        }
        threads = (threads > 0 ? threads : fy_cpuset_usable()) / n_ranks;
        if (threads < 1) threads = 1;
        if (rank != 0) follower_main(m, b, &rp, s.group, threads);
    }
    fy_backend_params_t bp = {.n_threads = threads, .isa = b->isa, .attn_bf16 = b->attn_bf16};
    if ((st = fy_backend_create_device(b->device, &bp, &s.be)) || (st = backend_check(m, b, &rp, s.be)) ||
        (st = fy_runner_create_rank(m, s.be, &rp, s.group, &s.runner)))
        goto fail;
    st = b->cluster ? fy_kv_hasher_from_config(b->cluster, &s.hasher) : fy_kv_hasher_create_random(&s.hasher);
    if (st) goto fail;
    fy_kvm_params_t kp;
    fy_runner_kvm_params(s.runner, &kp);
    kp.hasher = s.hasher;
    kp.prefix_caching = b->prefix_caching;
    kp.disk_dir = b->disk_dir;
    kp.disk_bytes = b->disk_bytes;
    if (b->watermark >= 0) kp.watermark = b->watermark;
    if ((st = fy_kvm_create(&kp, &s.kvm))) goto fail;
    if (b->role && (st = pool_check(m, b, &s))) goto fail;
    fy_engine_params_t ep = b->engine;
    if (b->draft) {
        if ((st = fy_spec_draft_open(b->draft, s.runner, b->draft_kv_mem, s.hasher, &s.draft))) goto fail;
        ep.spec.draft = fy_spec_draft_runner(s.draft);
        ep.spec.draft_kvm = fy_spec_draft_kvm(s.draft);
        fy_info("speculative draft: %s", fy_spec_draft_describe(s.draft));
    }
    if (!b->no_engine && (st = fy_engine_create(s.runner, s.kvm, fy_model_tokenizer(m), &ep, &s.engine))) goto fail;
    if (s.group)
        fy_info("engine: %d ranks (tp %d, pp %d), kv %d blocks on each", n_ranks, rp.tp > 1 ? rp.tp : 1,
                rp.pp > 1 ? rp.pp : 1, fy_runner_params(s.runner)->n_kv_blocks);
    *s_p = s;
    return FY_OK;
fail:
    if (s.group && !fy_group_broken(s.group)) fy_group_abort(s.group, "rank 0 could not start");
    fy_engine_stack_destroy(&s);
    return st;
}

void fy_engine_stack_destroy(fy_engine_stack_t *s)
{
    fy_engine_destroy(s->engine);
    fy_spec_draft_destroy(s->draft); /* after the engine that used it, before the runner it borrows from */
    fy_kvm_destroy(s->kvm);
    fy_kv_hasher_destroy(s->hasher);
    fy_runner_destroy(s->runner);
    fy_group_destroy(s->group); /* the other ranks leave and are reaped */
    fy_backend_destroy(s->be);
    if (s->arenas) munmap(s->arenas, s->arenas_bytes); /* after the group: no rank maps it any more */
    *s = (fy_engine_stack_t){0};
}

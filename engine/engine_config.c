/*
 * engine_config.c - an engine and what it runs on, from a build a worker
 * read from its configuration or a command set from its options (see
 * engine_config.h).
 */
#include "engine/engine_config.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/cpuset.h"
#include "kv/kvplan.h"
#include "common/log.h"
#include "common/mem.h"

void fy_engine_build_default(fy_engine_build_t *b)
{
    *b = (fy_engine_build_t){.prefix_caching = true, .watermark = -1};
    fy_runner_params_default(&b->runner);
    fy_engine_params_default(&b->engine);
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
    st = fy_kv_hasher_for(b->hash_key, b->hash_key_len, &s.hasher);
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

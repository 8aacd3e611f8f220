/* backend.c - backend selection and dispatch through the ops table. */
#include "kernels/backend_impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"

#ifdef FY_HAVE_CUDA
#define BUILT_BACKENDS "cpu, cuda"
#else
#define BUILT_BACKENDS "cpu"
#endif

struct fy_backend {
    const fy_backend_ops_t *ops;
    void *ctx;
    int n_threads;
    bool device_memory; /* fy_backend_device_memory: which constructor made it says */
    char desc[96];
    bool profiling;
    fy_backend_profile_t prof;
};

void fy_backend_profile_enable(fy_backend_t *be, bool on)
{
    be->profiling = on;
    memset(&be->prof, 0, sizeof(be->prof));
}

void fy_backend_profile_get(const fy_backend_t *be, fy_backend_profile_t *out) { *out = be->prof; }

const char *fy_backend_op_name(fy_backend_op_t op)
{
    static const char *names[FY_OP_COUNT] = {"embed",    "matmul",    "rmsnorm", "rope",  "swiglu", "add",  "get_rows",
                                             "kv_write", "attention", "copy",    "geglu", "bias",   "scale"};
    return (unsigned)op < FY_OP_COUNT ? names[op] : "?";
}

fy_status_t fy_backend_create(const char *name, const fy_backend_params_t *params, fy_backend_t **be_p)
{
    fy_backend_params_t dflt = {0};
    if (!params) params = &dflt;
    fy_backend_t *be = fy_calloc(1, sizeof(*be));
    if (!be) {
        fy_error("backend: out of memory");
        return FY_ERR_NOMEM;
    }
    fy_status_t st;
    if (!strcmp(name, "cpu")) {
        st = fy_backend_cpu_init(params, &be->ops, &be->ctx, be->desc, sizeof(be->desc), &be->n_threads);
#ifdef FY_HAVE_CUDA
    } else if (!strcmp(name, "cuda")) {
        st = fy_backend_cuda_init(params, &be->ops, &be->ctx, be->desc, sizeof(be->desc), &be->n_threads);
        be->device_memory = true; /* cudaMalloc'd (cuda_alloc) */
#endif
    } else {
        fy_error("backend: unknown backend '%s' (this build has: %s)", name, BUILT_BACKENDS);
        st = FY_ERR_INVALID;
    }
    if (st != FY_OK) {
        fy_free(be);
        return st;
    }
    *be_p = be;
    return FY_OK;
}

bool fy_backend_cuda_usable(char *why, size_t cap)
{
#ifdef FY_HAVE_CUDA
    return fy_backend_cuda_probe(why, cap) > 0;
#else
    if (why) snprintf(why, cap, "this build has no CUDA backend (built with CUDA=0 or without nvcc)");
    return false;
#endif
}

fy_status_t fy_backend_create_device(const char *device, const fy_backend_params_t *params, fy_backend_t **be_p)
{
    if (!device || !strcmp(device, "cpu")) return fy_backend_create("cpu", params, be_p);
    if (strcmp(device, "cuda")) {
        fy_error("backend: unknown device '%s' (cpu, cuda)", device);
        return FY_ERR_INVALID;
    }
    char why[192];
    if (!fy_backend_cuda_usable(why, sizeof(why))) {
        fy_warn("backend: cuda requested but unavailable (%s); falling back to the cpu", why);
        return fy_backend_create("cpu", params, be_p);
    }
    return fy_backend_create("cuda", params, be_p);
}

void fy_backend_destroy(fy_backend_t *be)
{
    if (!be) return;
    be->ops->destroy(be->ctx);
    fy_free(be);
}

const char *fy_backend_describe(const fy_backend_t *be) { return be->desc; }

static fy_status_t missing(const fy_backend_t *be, const char *op)
{
    fy_error("backend %s: op '%s' is not implemented", be->ops->name, op);
    return FY_ERR_UNSUPPORTED;
}

#define CALL(op, ...) (be->ops->op ? be->ops->op(be->ctx, __VA_ARGS__) : missing(be, #op))

/* a compute op, timed (with a sync, so the time is the op's) when profiling */
#define TIMED(kind, op, ...)                                                                                           \
    do {                                                                                                               \
        if (!be->profiling) return CALL(op, __VA_ARGS__);                                                              \
        uint64_t t0_ = fy_now_ns();                                                                                    \
        fy_status_t st_ = CALL(op, __VA_ARGS__);                                                                       \
        if (st_ == FY_OK && be->ops->sync) st_ = be->ops->sync(be->ctx);                                               \
        be->prof.ns[kind] += fy_now_ns() - t0_;                                                                        \
        be->prof.calls[kind]++;                                                                                        \
        return st_;                                                                                                    \
    } while (0)

/* n_groups 0 reads as 1 (one KV group: the layout without groups) */
fy_status_t fy_backend_reserve(fy_backend_t *be, const fy_backend_reserve_t *r)
{
    fy_backend_reserve_t res = *r;
    if (res.n_groups == 0) res.n_groups = 1;
    return CALL(reserve, &res);
}
fy_status_t fy_backend_check(fy_backend_t *be, const fy_backend_needs_t *n, char *why, size_t cap)
{
    if (n->attn_scores && !be->ops->set_attn_scores) {
        snprintf(why, cap, "kv.evict = h2o: the %s backend gathers no attention scores", be->ops->name);
        return FY_ERR_UNSUPPORTED;
    }
    return be->ops->check ? be->ops->check(be->ctx, n, why, cap) : FY_OK;
}

fy_status_t fy_backend_alloc(fy_backend_t *be, size_t bytes, void **ptr_p) { return CALL(alloc, bytes, ptr_p); }

void fy_backend_free(fy_backend_t *be, void *ptr)
{
    if (ptr) be->ops->free(be->ctx, ptr);
}

fy_status_t fy_backend_mem_info(fy_backend_t *be, int64_t *total_p, int64_t *free_p)
{
    return CALL(mem_info, total_p, free_p);
}

bool fy_backend_device_memory(const fy_backend_t *be) { return be->device_memory; }

fy_status_t fy_backend_alloc_host(fy_backend_t *be, size_t bytes, void **ptr_p)
{
    return CALL(alloc_host, bytes, ptr_p);
}

void fy_backend_free_host(fy_backend_t *be, void *ptr)
{
    if (ptr) be->ops->free_host(be->ctx, ptr);
}

fy_status_t fy_backend_memcpy(fy_backend_t *be, void *dst, const void *src, size_t bytes, fy_copy_kind_t kind)
{
    TIMED(FY_OP_COPY, memcpy, dst, src, bytes, kind);
}

fy_status_t fy_backend_upload(fy_backend_t *be, const fy_tensor_t *host, fy_tensor_use_t use, fy_tensor_t *dev_p)
{
    return CALL(upload, host, use, dev_p);
}

void fy_backend_release_tensor(fy_backend_t *be, fy_tensor_t *dev)
{
    if (dev && be->ops->release_tensor) be->ops->release_tensor(be->ctx, dev);
}

fy_status_t fy_backend_copy_blocks(fy_backend_t *be, const fy_kv_layout_t *lay, void *dst_arena, const void *src_arena,
                                   const int32_t *dst, const int32_t *src, int32_t n, fy_copy_kind_t kind)
{
    TIMED(FY_OP_COPY, copy_blocks, lay, dst_arena, src_arena, dst, src, n, kind);
}

fy_status_t fy_backend_set_batch(fy_backend_t *be, const fy_batch_meta_t *meta)
{
    fy_batch_meta_t m = *meta;
    if (m.n_groups == 0) m.n_groups = 1;
    return CALL(set_batch, &m);
}

fy_status_t fy_backend_embed(fy_backend_t *be, const fy_tensor_t *table, float *out)
{
    TIMED(FY_OP_EMBED, embed, table, out);
}

fy_status_t fy_backend_matmul(fy_backend_t *be, int n_w, const fy_tensor_t *const *w, const float *x, int32_t n,
                              float *const *y)
{
    TIMED(FY_OP_MATMUL, matmul, n_w, w, x, n, y);
}

fy_status_t fy_backend_rmsnorm_matmul(fy_backend_t *be, const float *x, const fy_tensor_t *norm, float eps, int n_w,
                                      const fy_tensor_t *const *w, int32_t n, float *h, float *const *y)
{
    if (!be->ops->rmsnorm_matmul) {
        fy_status_t st = fy_backend_rmsnorm(be, x, norm, n, eps, h);
        return st != FY_OK ? st : fy_backend_matmul(be, n_w, w, h, n, y);
    }
    TIMED(FY_OP_MATMUL, rmsnorm_matmul, x, norm, eps, n_w, w, n, h, y);
}

fy_status_t fy_backend_rmsnorm(fy_backend_t *be, const float *x, const fy_tensor_t *w, int32_t n, float eps, float *y)
{
    TIMED(FY_OP_RMSNORM, rmsnorm, x, w, n, eps, y);
}

fy_status_t fy_backend_rope(fy_backend_t *be, float *q, float *k, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                            const fy_rope_t *rope)
{
    TIMED(FY_OP_ROPE, rope, q, k, n_heads, n_kv_heads, head_dim, rope);
}

fy_status_t fy_backend_swiglu(fy_backend_t *be, const float *gate, const float *up, float *out, size_t n)
{
    TIMED(FY_OP_SWIGLU, swiglu, gate, up, out, n);
}

fy_status_t fy_backend_geglu(fy_backend_t *be, const float *gate, const float *up, float *out, size_t n)
{
    TIMED(FY_OP_GEGLU, geglu, gate, up, out, n);
}

fy_status_t fy_backend_add(fy_backend_t *be, float *x, const float *y, size_t n) { TIMED(FY_OP_ADD, add, x, y, n); }

fy_status_t fy_backend_add_bias(fy_backend_t *be, float *x, const fy_tensor_t *b, int32_t n)
{
    TIMED(FY_OP_BIAS, add_bias, x, b, n);
}

fy_status_t fy_backend_scale(fy_backend_t *be, float *x, float s, size_t n) { TIMED(FY_OP_SCALE, scale, x, s, n); }

fy_status_t fy_backend_get_rows(fy_backend_t *be, const float *src, const int32_t *rows, int32_t n, int32_t dim,
                                float *dst)
{
    TIMED(FY_OP_GET_ROWS, get_rows, src, rows, n, dim, dst);
}

fy_status_t fy_backend_kv_write(fy_backend_t *be, const fy_kv_layout_t *lay, void *arena, int32_t layer, const float *k,
                                const float *v)
{
    TIMED(FY_OP_KV_WRITE, kv_write, lay, arena, layer, k, v);
}

fy_status_t fy_backend_attention(fy_backend_t *be, const fy_kv_layout_t *lay, const void *arena, int32_t layer,
                                 int32_t n_heads, float scale, int32_t window, const float *q, float *out)
{
    if (window < 0 || !(scale > 0) || !isfinite(scale)) {
        fy_error("backend %s: attention window %d or scale %g is invalid", be->ops->name, window, (double)scale);
        return FY_ERR_INVALID;
    }
    TIMED(FY_OP_ATTENTION, attention, lay, arena, layer, n_heads, scale, window, q, out);
}

fy_status_t fy_backend_set_attn_scores(fy_backend_t *be, float *scores, int32_t stride)
{
    if (scores && stride < 1) {
        fy_error("backend %s: attention scores with stride %d", be->ops->name, stride);
        return FY_ERR_INVALID;
    }
    if (!be->ops->set_attn_scores) return scores ? missing(be, "set_attn_scores") : FY_OK;
    return be->ops->set_attn_scores(be->ctx, scores, stride);
}

fy_status_t fy_backend_sync(fy_backend_t *be) { return be->ops->sync ? be->ops->sync(be->ctx) : FY_OK; }

fy_status_t fy_backend_graph_begin(fy_backend_t *be, const void *owner, int32_t shape, bool *replay_p)
{
    *replay_p = false;
    /* profiling times each op with a sync after it: nothing to record */
    if (!be->ops->graph_begin || be->profiling) return FY_ERR_UNSUPPORTED;
    return be->ops->graph_begin(be->ctx, owner, shape, replay_p);
}

bool fy_backend_graphs(const fy_backend_t *be) { return be->ops->graph_begin && !be->profiling; }

fy_status_t fy_backend_graph_end(fy_backend_t *be, bool keep)
{
    return be->ops->graph_end ? be->ops->graph_end(be->ctx, keep) : FY_ERR_UNSUPPORTED;
}

/*
 * backend_impl.h - what a backend implements: the ops table behind
 * fy_backend_t.  Only backend.c and the backends include this.
 * Optional ops may be NULL; backend.c reports them as unsupported.
 */
#ifndef FY_BACKEND_IMPL_H
#define FY_BACKEND_IMPL_H

#include "kernels/backend.h"

typedef struct fy_backend_ops {
    const char *name;
    void (*destroy)(void *ctx);
    fy_status_t (*reserve)(void *ctx, const fy_backend_reserve_t *r);
    fy_status_t (*alloc)(void *ctx, size_t bytes, void **ptr_p);
    void (*free)(void *ctx, void *ptr);
    fy_status_t (*mem_info)(void *ctx, int64_t *total_p, int64_t *free_p);
    fy_status_t (*alloc_host)(void *ctx, size_t bytes, void **ptr_p);
    void (*free_host)(void *ctx, void *ptr);
    fy_status_t (*memcpy)(void *ctx, void *dst, const void *src, size_t bytes, fy_copy_kind_t kind);
    fy_status_t (*upload)(void *ctx, const fy_tensor_t *host, fy_tensor_use_t use, fy_tensor_t *dev_p);
    void (*release_tensor)(void *ctx, fy_tensor_t *dev);
    fy_status_t (*copy_blocks)(void *ctx, const fy_kv_layout_t *lay, void *dst_arena, const void *src_arena,
                               const int32_t *dst, const int32_t *src, int32_t n, fy_copy_kind_t kind);
    fy_status_t (*set_batch)(void *ctx, const fy_batch_meta_t *meta);
    fy_status_t (*embed)(void *ctx, const fy_tensor_t *table, float *out);
    fy_status_t (*matmul)(void *ctx, int n_w, const fy_tensor_t *const *w, const float *x, int32_t n, float *const *y);
    fy_status_t (*rmsnorm)(void *ctx, const float *x, const fy_tensor_t *w, int32_t n, float eps, float *y);
    fy_status_t (*rope)(void *ctx, float *q, float *k, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                        const fy_rope_t *rope);
    fy_status_t (*swiglu)(void *ctx, const float *gate, const float *up, float *out, size_t n);
    fy_status_t (*add)(void *ctx, float *x, const float *y, size_t n);
    fy_status_t (*get_rows)(void *ctx, const float *src, const int32_t *rows, int32_t n, int32_t dim, float *dst);
    fy_status_t (*kv_write)(void *ctx, const fy_kv_layout_t *lay, void *arena, int32_t layer, const float *k,
                            const float *v);
    fy_status_t (*attention)(void *ctx, const fy_kv_layout_t *lay, const void *arena, int32_t layer, int32_t n_heads,
                             float scale, int32_t window, const float *q, float *out);
    fy_status_t (*sync)(void *ctx);
    /* the architectures' ops (model.h's description): after sync so that
     * the table's older entries keep their places */
    fy_status_t (*geglu)(void *ctx, const float *gate, const float *up, float *out, size_t n);
    fy_status_t (*add_bias)(void *ctx, float *x, const fy_tensor_t *b, int32_t n);
    fy_status_t (*scale)(void *ctx, float *x, float s, size_t n);
    /* optional: NULL means H2O scores are unsupported (turning them off
     * still succeeds) */
    fy_status_t (*set_attn_scores)(void *ctx, float *scores, int32_t stride);
    /* optional: NULL means rmsnorm then matmul */
    fy_status_t (*rmsnorm_matmul)(void *ctx, const float *x, const fy_tensor_t *norm, float eps, int n_w,
                                  const fy_tensor_t *const *w, int32_t n, float *h, float *const *y);
    /* optional: NULL means the backend runs every model and KV format the
     * runner can lay out */
    fy_status_t (*check)(void *ctx, const fy_backend_needs_t *n, char *why, size_t cap);
    /* optional, both or neither: recorded steps (backend.h) */
    fy_status_t (*graph_begin)(void *ctx, const void *owner, int32_t shape, bool *replay_p);
    fy_status_t (*graph_end)(void *ctx, bool keep);
} fy_backend_ops_t;

/* Each backend's constructor: fills *ops_p and *ctx_p, and a description. */
fy_status_t fy_backend_cpu_init(const fy_backend_params_t *params, const fy_backend_ops_t **ops_p, void **ctx_p,
                                char *desc, size_t desc_cap, int *n_threads_p);
#ifdef FY_HAVE_CUDA
/* kernels/cuda/cuda_backend.cu.  init fails (logged) where no GPU can be
 * used; probe logs nothing: it returns the number of devices, and where
 * that is 0 writes the reason (CUDA's own words) into why. */
fy_status_t fy_backend_cuda_init(const fy_backend_params_t *params, const fy_backend_ops_t **ops_p, void **ctx_p,
                                 char *desc, size_t desc_cap, int *n_threads_p);
int fy_backend_cuda_probe(char *why, size_t cap);
#endif

#endif /* FY_BACKEND_IMPL_H */

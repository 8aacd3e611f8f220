/*
 * cuda_backend.cu - the CUDA backend: the ops table of backend_impl.h on
 * one GPU.  Projections go through cuBLAS (bf16 inputs, fp32 compute and
 * output); the other ops are the kernels of cuda_kernels.cu.
 *
 * Weights.  Matmul weights and embedding tables are uploaded as bf16
 * [rows, in]: GGUF-quantized (every type dtype.h reads, the K-quants
 * included), F16 and F32 rows are dequantized on the host with the
 * reference dequantizers of dtype.h and rounded to bf16 once, at load.
 * Norm weights stay f32.
 *
 * Streams.  Compute runs on one stream; KV block copies (swap, demotion,
 * copy-on-write) on a second, ordered after the compute enqueued before
 * them by an event, and complete when copy_blocks returns.
 *
 * Not here: a determinism guarantee across batch compositions (cuBLAS
 * picks its algorithm by shape), multi-GPU, CUDA graphs, H2O attention
 * scores (set_attn_scores refuses them; the CPU backend has them).
 *
 * Status: compiled in CI for sm_80 and sm_90; never yet run on a GPU.
 */
#include <stdio.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

/* the project's headers are C11; their one C-only construct, spelled for C++ */
#define _Static_assert static_assert
extern "C" {
#include "backend_impl.h"
#include "log.h"
#include "mem.h"
}

#include "cuda_kernels.h"

#define FY_CUDA_PACK_BF16 0x42 /* fy_tensor_t.packing: bf16 [rows, in] on the device */
#define MAX_HEAD_DIM 512

/* ---- foreign errors at the boundary -------------------------------------------------- */

static fy_status_t cuda_check(cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return FY_OK;
    fy_error("cuda backend: %s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    return e == cudaErrorMemoryAllocation ? FY_ERR_NOMEM : FY_ERR_BACKEND;
}

static const char *cublas_str(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "architecture mismatch";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "execution failed";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "internal error";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported";
    default: return "unknown cublas status";
    }
}

static fy_status_t blas_check(cublasStatus_t s, const char *what)
{
    if (s == CUBLAS_STATUS_SUCCESS) return FY_OK;
    fy_error("cuda backend: %s: cublas: %s (%d)", what, cublas_str(s), (int)s);
    return s == CUBLAS_STATUS_ALLOC_FAILED ? FY_ERR_NOMEM : FY_ERR_BACKEND;
}

#define CK(call, what)                                                                                                 \
    do {                                                                                                               \
        fy_status_t st_ = cuda_check((call), (what));                                                                  \
        if (st_ != FY_OK) return st_;                                                                                  \
    } while (0)

/* ---- context --------------------------------------------------------------------------- */

typedef struct cuda_ctx {
    int device;
    cudaStream_t stream;      /* compute */
    cudaStream_t copy_stream; /* KV block copies */
    cudaEvent_t compute_done; /* copy_stream waits on it */
    cudaEvent_t meta_done;    /* the last batch upload finished reading meta_pinned */
    cublasHandle_t blas;
    fy_backend_reserve_t res;
    bool reserved;
    /* the batch: one pinned staging buffer and its device twin, laid out
     * tokens | pos | apos [max_tokens] | slots [n_groups][max_tokens] | seqs [max_seqs] |
     * block_tables [max_blocks] (each sequence's groups one after another) */
    int32_t *meta_pinned, *meta_dev;
    size_t meta_ints;
    int32_t *tokens_dev, *pos_dev, *slots_dev, *apos_dev, *bt_dev;
    fy_cuda_seq_t *seqs_dev;
    fy_cuda_seq_t *seqs_host; /* [max_seqs] the host's copy (tiling, checks) */
    int32_t *tokens_host;     /* [max_tokens] (range checks in embed) */
    int32_t n_tokens, n_seqs, max_pos;
    void *xb_dev;                      /* [max_tokens, max_row] bf16 matmul input */
    float *pm_dev, *pl_dev, *pacc_dev; /* attention partials */
    int32_t max_segs;
} cuda_ctx_t;

static void cuda_destroy(void *p)
{
    cuda_ctx_t *c = (cuda_ctx_t *)p;
    if (!c) return;
    cudaSetDevice(c->device);
    if (c->stream) cudaStreamSynchronize(c->stream);
    cudaFree(c->meta_dev);
    cudaFreeHost(c->meta_pinned);
    cudaFree(c->xb_dev);
    cudaFree(c->pm_dev);
    cudaFree(c->pl_dev);
    cudaFree(c->pacc_dev);
    fy_free(c->seqs_host);
    fy_free(c->tokens_host);
    if (c->blas) cublasDestroy(c->blas);
    if (c->meta_done) cudaEventDestroy(c->meta_done);
    if (c->compute_done) cudaEventDestroy(c->compute_done);
    if (c->copy_stream) cudaStreamDestroy(c->copy_stream);
    if (c->stream) cudaStreamDestroy(c->stream);
    fy_free(c);
}

static void free_work(cuda_ctx_t *c)
{
    cudaFree(c->meta_dev);
    cudaFreeHost(c->meta_pinned);
    cudaFree(c->xb_dev);
    cudaFree(c->pm_dev);
    cudaFree(c->pl_dev);
    cudaFree(c->pacc_dev);
    fy_free(c->seqs_host);
    fy_free(c->tokens_host);
    c->meta_dev = c->meta_pinned = NULL;
    c->xb_dev = NULL;
    c->pm_dev = c->pl_dev = c->pacc_dev = NULL;
    c->seqs_host = NULL;
    c->tokens_host = NULL;
    c->reserved = false;
}

static fy_status_t cuda_reserve(void *p, const fy_backend_reserve_t *r)
{
    cuda_ctx_t *c = (cuda_ctx_t *)p;
    if (r->max_tokens < 1 || r->max_row < 1 || r->max_seqs < 1 || r->max_blocks < 1 || r->max_kv_len < 1 ||
        r->n_heads < 1 || r->head_dim < 1 || r->head_dim > MAX_HEAD_DIM) {
        fy_error("cuda backend: bad reservation (tokens %d, row %d, seqs %d, blocks %d, heads %d x %d)", r->max_tokens,
                 r->max_row, r->max_seqs, r->max_blocks, r->n_heads, r->head_dim);
        return FY_ERR_INVALID;
    }
    CK(cudaStreamSynchronize(c->stream), "synchronizing before reserve");
    free_work(c);
    const size_t T = (size_t)r->max_tokens, seq_ints = sizeof(fy_cuda_seq_t) / sizeof(int32_t);
    const size_t NG = (size_t)(r->n_groups > 0 ? r->n_groups : 1);
    c->meta_ints = (3 + NG) * T + (size_t)r->max_seqs * seq_ints + (size_t)r->max_blocks;
    c->max_segs = (r->max_kv_len - 1) / FY_CUDA_ATTN_SEG + 1;
    const size_t parts = T * (size_t)r->n_heads * (size_t)c->max_segs;
    c->seqs_host = (fy_cuda_seq_t *)fy_calloc((size_t)r->max_seqs, sizeof(fy_cuda_seq_t));
    c->tokens_host = (int32_t *)fy_calloc(T, sizeof(int32_t));
    if (!c->seqs_host || !c->tokens_host) {
        free_work(c);
        fy_error("cuda backend: out of host memory reserving batch metadata");
        return FY_ERR_NOMEM;
    }
    struct {
        void **slot;
        size_t bytes;
        const char *what;
    } bufs[] = {
        {(void **)&c->meta_dev, c->meta_ints * sizeof(int32_t), "batch metadata"},
        {&c->xb_dev, T * (size_t)r->max_row * 2, "bf16 matmul input"},
        {(void **)&c->pm_dev, parts * sizeof(float), "attention maxima"},
        {(void **)&c->pl_dev, parts * sizeof(float), "attention sums"},
        {(void **)&c->pacc_dev, parts * (size_t)r->head_dim * sizeof(float), "attention partials"},
    };
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) {
        cudaError_t e = cudaMalloc(bufs[i].slot, bufs[i].bytes);
        if (e != cudaSuccess) {
            *bufs[i].slot = NULL;
            free_work(c);
            char what[96];
            snprintf(what, sizeof(what), "reserving %zu bytes of %s", bufs[i].bytes, bufs[i].what);
            return cuda_check(e, what);
        }
    }
    cudaError_t e = cudaHostAlloc((void **)&c->meta_pinned, c->meta_ints * sizeof(int32_t), cudaHostAllocDefault);
    if (e != cudaSuccess) {
        c->meta_pinned = NULL;
        free_work(c);
        return cuda_check(e, "reserving pinned batch metadata");
    }
    c->tokens_dev = c->meta_dev;
    c->pos_dev = c->meta_dev + T;
    c->apos_dev = c->meta_dev + 2 * T;
    c->slots_dev = c->meta_dev + 3 * T;
    c->seqs_dev = (fy_cuda_seq_t *)(c->meta_dev + (3 + NG) * T);
    c->bt_dev = c->meta_dev + (3 + NG) * T + (size_t)r->max_seqs * seq_ints;
    c->res = *r;
    c->reserved = true;
    return FY_OK;
}

/* ---- memory ------------------------------------------------------------------------------ */

static fy_status_t cuda_alloc(void *p, size_t bytes, void **ptr_p)
{
    cuda_ctx_t *c = (cuda_ctx_t *)p;
    void *m = NULL;
    char what[64];
    snprintf(what, sizeof(what), "allocating %zu bytes", bytes);
    CK(cudaMalloc(&m, bytes), what);
    fy_status_t st = cuda_check(cudaMemsetAsync(m, 0, bytes, c->stream), "zeroing an allocation");
    if (st == FY_OK) st = cuda_check(cudaStreamSynchronize(c->stream), "zeroing an allocation");
    if (st != FY_OK) {
        cudaFree(m);
        return st;
    }
    *ptr_p = m;
    return FY_OK;
}

static void cuda_free(void *p, void *ptr)
{
    cudaError_t e = cudaFree(ptr);
    if (e != cudaSuccess) cuda_check(e, "freeing device memory");
}

static fy_status_t cuda_mem_info(void *p, int64_t *total_p, int64_t *free_p)
{
    size_t fr = 0, tot = 0;
    CK(cudaMemGetInfo(&fr, &tot), "querying device memory");
    *total_p = (int64_t)tot;
    *free_p = (int64_t)fr;
    return FY_OK;
}

static fy_status_t cuda_alloc_host(void *p, size_t bytes, void **ptr_p)
{
    void *m = NULL;
    char what[64];
    snprintf(what, sizeof(what), "allocating %zu bytes of pinned host memory", bytes);
    CK(cudaHostAlloc(&m, bytes, cudaHostAllocPortable), what);
    memset(m, 0, bytes);
    *ptr_p = m;
    return FY_OK;
}

static void cuda_free_host(void *p, void *ptr)
{
    cudaError_t e = cudaFreeHost(ptr);
    if (e != cudaSuccess) cuda_check(e, "freeing pinned host memory");
}

static cudaMemcpyKind copy_kind(fy_copy_kind_t k)
{
    switch (k) {
    case FY_COPY_H2D: return cudaMemcpyHostToDevice;
    case FY_COPY_D2H: return cudaMemcpyDeviceToHost;
    case FY_COPY_D2D: return cudaMemcpyDeviceToDevice;
    default: return cudaMemcpyHostToHost;
    }
}

/* synchronous, like the CPU backend's: ordered after the compute enqueued so far */
static fy_status_t cuda_memcpy(void *p, void *dst, const void *src, size_t bytes, fy_copy_kind_t kind)
{
    cuda_ctx_t *c = (cuda_ctx_t *)p;
    if (kind == FY_COPY_H2H) {
        memcpy(dst, src, bytes);
        return FY_OK;
    }
    CK(cudaMemcpyAsync(dst, src, bytes, copy_kind(kind), c->stream), "copying memory");
    CK(cudaStreamSynchronize(c->stream), "waiting for a copy");
    return FY_OK;
}

/* Host rows of any dtype -> bf16 rows on the device, a slab of rows at a time. */
static fy_status_t upload_bf16(cuda_ctx_t *c, const fy_tensor_t *h, void *dst_dev)
{
    const int64_t in = h->ne[0], rows = h->ne[1] > 0 ? h->ne[1] : 1;
    const int64_t slab = in >= (1 << 20) ? 1 : (1 << 20) / in; /* ~1M elements per copy */
    float *f = (float *)fy_malloc((size_t)in * sizeof(float));
    uint16_t *b = NULL;
    cudaError_t e = cudaHostAlloc((void **)&b, (size_t)slab * (size_t)in * 2, cudaHostAllocDefault);
    if (!f || e != cudaSuccess) {
        fy_free(f);
        if (e == cudaSuccess) cudaFreeHost(b);
        fy_error("cuda backend: out of host memory converting a %lld x %lld tensor to bf16", (long long)rows,
                 (long long)in);
        return FY_ERR_NOMEM;
    }
    fy_status_t st = FY_OK;
    for (int64_t r0 = 0; r0 < rows && st == FY_OK; r0 += slab) {
        int64_t nr = rows - r0 < slab ? rows - r0 : slab;
        for (int64_t r = 0; r < nr; r++) {
            fy_dequantize_row(h->dtype, (const char *)h->data + (size_t)(r0 + r) * h->row_bytes, f, in);
            for (int64_t i = 0; i < in; i++) b[r * in + i] = fy_fp32_to_bf16(f[i]);
        }
        st = cuda_check(cudaMemcpy((char *)dst_dev + (size_t)r0 * (size_t)in * 2, b, (size_t)nr * (size_t)in * 2,
                                   cudaMemcpyHostToDevice),
                        "uploading weights");
    }
    cudaFreeHost(b);
    fy_free(f);
    return st;
}

static fy_status_t cuda_upload(void *p, const fy_tensor_t *host, fy_tensor_use_t use, fy_tensor_t *dev_p)
{
    cuda_ctx_t *c = (cuda_ctx_t *)p;
    fy_tensor_t t = *host;
    void *m = NULL;
    fy_status_t st;
    if (use == FY_USE_VECTOR) {
        if (host->dtype != FY_DTYPE_F32) {
            fy_error("cuda backend: vector parameters must be f32, not %s", fy_dtype_name(host->dtype));
            return FY_ERR_INVALID;
        }
        if ((st = cuda_alloc(c, host->nbytes, &m))) return st;
        st = cuda_check(cudaMemcpy(m, host->data, host->nbytes, cudaMemcpyHostToDevice), "uploading a vector");
    } else {
        size_t elems = (size_t)host->ne[0] * (size_t)(host->ne[1] > 0 ? host->ne[1] : 1);
        if ((st = cuda_alloc(c, elems * 2, &m))) return st;
        st = upload_bf16(c, host, m);
        t.dtype = FY_DTYPE_BF16;
        t.row_bytes = (size_t)host->ne[0] * 2;
        t.nbytes = elems * 2;
        t.packing = FY_CUDA_PACK_BF16;
    }
    if (st != FY_OK) {
        cudaFree(m);
        return st;
    }
    t.data = m;
    *dev_p = t;
    return FY_OK;
}

static void cuda_release_tensor(void *p, fy_tensor_t *t)
{
    cuda_free(p, (void *)t->data);
    t->data = NULL;
    t->packing = 0;
}

/* Runs of consecutive ids go as one copy. */
static fy_status_t cuda_copy_blocks(void *p, const fy_kv_layout_t *lay, void *dst_arena, const void *src_arena,
                                    const int32_t *dst, const int32_t *src, int32_t n, fy_copy_kind_t kind)
{
    cuda_ctx_t *c = (cuda_ctx_t *)p;
    const size_t bb = lay->block_bytes;
    if (kind == FY_COPY_H2H) {
        for (int32_t i = 0; i < n; i++)
            memcpy((char *)dst_arena + (size_t)dst[i] * bb, (const char *)src_arena + (size_t)src[i] * bb, bb);
        return FY_OK;
    }
    CK(cudaEventRecord(c->compute_done, c->stream), "ordering block copies after compute");
    CK(cudaStreamWaitEvent(c->copy_stream, c->compute_done, 0), "ordering block copies after compute");
    for (int32_t i = 0; i < n;) {
        int32_t run = 1;
        while (i + run < n && dst[i + run] == dst[i] + run && src[i + run] == src[i] + run) run++;
        CK(cudaMemcpyAsync((char *)dst_arena + (size_t)dst[i] * bb, (const char *)src_arena + (size_t)src[i] * bb,
                           (size_t)run * bb, copy_kind(kind), c->copy_stream),
           "copying kv blocks");
        i += run;
    }
    CK(cudaStreamSynchronize(c->copy_stream), "waiting for kv block copies");
    return FY_OK;
}

/* ---- batch ------------------------------------------------------------------------------- */

static fy_status_t cuda_set_batch(void *p, const fy_batch_meta_t *m)
{
    cuda_ctx_t *c = (cuda_ctx_t *)p;
    if (!c->reserved) {
        fy_error("cuda backend: set_batch before reserve");
        return FY_ERR_INTERNAL;
    }
    if (m->n_tokens < 1 || m->n_tokens > c->res.max_tokens || m->n_seqs < 1 || m->n_seqs > c->res.max_seqs) {
        fy_error("cuda backend: batch of %d tokens in %d sequences exceeds the reservation (%d, %d)", m->n_tokens,
                 m->n_seqs, c->res.max_tokens, c->res.max_seqs);
        return FY_ERR_INVALID;
    }
    /* the previous upload must be done reading the staging buffer */
    CK(cudaEventSynchronize(c->meta_done), "waiting for the previous batch upload");
    if (m->n_groups < 1 || m->n_groups > c->res.n_groups) {
        fy_error("cuda backend: %d kv groups (reserved %d)", m->n_groups, c->res.n_groups);
        return FY_ERR_INVALID;
    }
    const size_t T = (size_t)c->res.max_tokens, NG = (size_t)c->res.n_groups;
    int32_t *tokens = c->meta_pinned, *pos = tokens + T, *apos = pos + T, *slots = apos + T;
    fy_cuda_seq_t *seqs = (fy_cuda_seq_t *)(tokens + (3 + NG) * T);
    int32_t *bt = (int32_t *)(seqs + c->res.max_seqs);
    memcpy(tokens, m->tokens, (size_t)m->n_tokens * sizeof(int32_t));
    memcpy(pos, m->pos, (size_t)m->n_tokens * sizeof(int32_t));
    memcpy(slots, m->slots, (size_t)m->n_tokens * (size_t)m->n_groups * sizeof(int32_t));
    int32_t used = 0, covered = 0, max_pos = 0;
    for (int32_t s = 0; s < m->n_seqs; s++) {
        const fy_attn_seq_t q = m->seqs[s];
        if (q.q_start != covered || q.n_q < 1 || q.q_start + q.n_q > m->n_tokens || q.kv_len < q.n_q ||
            q.kv_len > c->res.max_kv_len || q.n_blocks < 1 || (m->n_groups > 1 && q.group_stride < q.n_blocks) ||
            (int64_t)used + (int64_t)q.n_blocks * m->n_groups > c->res.max_blocks) {
            fy_error("cuda backend: inconsistent batch metadata for sequence %d", s);
            return FY_ERR_INVALID;
        }
        for (int32_t g = 0; g < m->n_groups; g++)
            memcpy(bt + used + g * q.n_blocks, q.block_table + (size_t)g * (size_t)q.group_stride,
                   (size_t)q.n_blocks * sizeof(int32_t));
        seqs[s] = (fy_cuda_seq_t){q.q_start, q.n_q, q.kv_len, q.n_blocks, used};
        used += q.n_blocks * m->n_groups;
        for (int32_t t = q.q_start; t < q.q_start + q.n_q; t++) apos[t] = q.kv_len - q.n_q + (t - q.q_start);
        if (q.kv_len - 1 > max_pos) max_pos = q.kv_len - 1;
        covered += q.n_q;
    }
    if (covered != m->n_tokens) {
        fy_error("cuda backend: batch sequences cover %d of %d tokens", covered, m->n_tokens);
        return FY_ERR_INVALID;
    }
    memcpy(c->seqs_host, seqs, (size_t)m->n_seqs * sizeof(fy_cuda_seq_t));
    memcpy(c->tokens_host, tokens, (size_t)m->n_tokens * sizeof(int32_t));
    /* whole sections up to the last block-table entry used: one copy */
    size_t ints = (size_t)((const int32_t *)(bt + used) - c->meta_pinned);
    CK(cudaMemcpyAsync(c->meta_dev, c->meta_pinned, ints * sizeof(int32_t), cudaMemcpyHostToDevice, c->stream),
       "uploading batch metadata");
    CK(cudaEventRecord(c->meta_done, c->stream), "uploading batch metadata");
    c->n_tokens = m->n_tokens;
    c->n_seqs = m->n_seqs;
    c->max_pos = max_pos;
    return FY_OK;
}

/* ---- compute ----------------------------------------------------------------------------- */

static fy_status_t cuda_embed(void *p, const fy_tensor_t *table, float *out)
{
    cuda_ctx_t *c = (cuda_ctx_t *)p;
    if (table->packing != FY_CUDA_PACK_BF16) {
        fy_error("cuda backend: embedding table was not uploaded for rows");
        return FY_ERR_INVALID;
    }
    for (int32_t t = 0; t < c->n_tokens; t++) {
        if (c->tokens_host[t] < 0 || c->tokens_host[t] >= table->ne[1]) {
            fy_error("cuda backend: token id %d out of range (vocabulary %lld)", c->tokens_host[t],
                     (long long)table->ne[1]);
            return FY_ERR_INVALID;
        }
    }
    CK(fy_cuda_embed(table->data, c->tokens_dev, c->n_tokens, (int32_t)table->ne[0], out, c->stream),
       "launching embed");
    return FY_OK;
}

/* y (row-major [n, rows]) = x ([n, in]) . W^T, W row-major [rows, in]: in
 * cuBLAS's column-major terms Y^T (rows x n) = op(W)=W^T... i.e. A = W
 * viewed as [in, rows] col-major, transposed. */
static fy_status_t cuda_matmul(void *p, int n_w, const fy_tensor_t *const *w, const float *x, int32_t n,
                               float *const *y)
{
    cuda_ctx_t *c = (cuda_ctx_t *)p;
    if (n_w < 1) return FY_ERR_INVALID;
    const int64_t in = w[0]->ne[0];
    for (int i = 0; i < n_w; i++) {
        if (w[i]->ne[0] != in || w[i]->packing != FY_CUDA_PACK_BF16) {
            fy_error("cuda backend: matmul weights of mixed widths or not uploaded for matmul");
            return FY_ERR_INVALID;
        }
    }
    if (n < 1 || n > c->res.max_tokens || in > c->res.max_row) {
        fy_error("cuda backend: matmul of %d x %lld exceeds the reservation", n, (long long)in);
        return FY_ERR_INVALID;
    }
    CK(fy_cuda_f32_to_bf16(x, c->xb_dev, (size_t)n * (size_t)in, c->stream), "launching bf16 conversion");
    const float one = 1.0f, zero = 0.0f;
    for (int i = 0; i < n_w; i++) {
        int rows = (int)w[i]->ne[1];
        fy_status_t st = blas_check(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, (int)in, &one, w[i]->data,
                                                 CUDA_R_16BF, (int)in, c->xb_dev, CUDA_R_16BF, (int)in, &zero, y[i],
                                                 CUDA_R_32F, rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                                    "matmul");
        if (st != FY_OK) return st;
    }
    return FY_OK;
}

static fy_status_t cuda_rmsnorm(void *p, const float *x, const fy_tensor_t *w, int32_t n, float eps, float *y)
{
    cuda_ctx_t *c = (cuda_ctx_t *)p;
    if (w->dtype != FY_DTYPE_F32) {
        fy_error("cuda backend: rmsnorm weight must be f32, not %s", fy_dtype_name(w->dtype));
        return FY_ERR_INVALID;
    }
    CK(fy_cuda_rmsnorm(x, (const float *)w->data, n, (int32_t)w->ne[0], eps, y, c->stream), "launching rmsnorm");
    return FY_OK;
}

static fy_status_t cuda_rope(void *p, float *q, float *k, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                             const fy_rope_t *rope)
{
    cuda_ctx_t *c = (cuda_ctx_t *)p;
    if (head_dim > MAX_HEAD_DIM || head_dim % 2 || head_dim > c->res.head_dim ||
        head_dim / 2 > FY_CUDA_ROPE_MAX_PAIRS) {
        fy_error("cuda backend: rope head size %d unsupported (even, at most %d)", head_dim,
                 head_dim > c->res.head_dim ? c->res.head_dim : MAX_HEAD_DIM);
        return FY_ERR_UNSUPPORTED;
    }
    if (!(rope->theta > 0) || !(rope->freq_scale > 0)) {
        fy_error("cuda backend: rope base %g or scale %g is not positive", (double)rope->theta,
                 (double)rope->freq_scale);
        return FY_ERR_INVALID;
    }
    fy_cuda_rope_freqs_t f;
    memset(&f, 0, sizeof(f));
    for (int32_t i = 0; i < head_dim / 2; i++) f.inv_freq[i] = fy_rope_inv_freq(rope, i, head_dim);
    CK(fy_cuda_rope(q, k, c->pos_dev, c->n_tokens, n_heads, n_kv_heads, head_dim, &f, rope->style == FY_ROPE_NEOX,
                    c->stream),
       "launching rope");
    return FY_OK;
}

static fy_status_t cuda_swiglu(void *p, const float *gate, const float *up, float *out, size_t n)
{
    cuda_ctx_t *c = (cuda_ctx_t *)p;
    CK(fy_cuda_swiglu(gate, up, out, n, c->stream), "launching swiglu");
    return FY_OK;
}

static fy_status_t cuda_geglu(void *p, const float *gate, const float *up, float *out, size_t n)
{
    cuda_ctx_t *c = (cuda_ctx_t *)p;
    CK(fy_cuda_geglu(gate, up, out, n, c->stream), "launching geglu");
    return FY_OK;
}

static fy_status_t cuda_add(void *p, float *x, const float *y, size_t n)
{
    cuda_ctx_t *c = (cuda_ctx_t *)p;
    CK(fy_cuda_add(x, y, n, c->stream), "launching add");
    return FY_OK;
}

static fy_status_t cuda_add_bias(void *p, float *x, const fy_tensor_t *b, int32_t n)
{
    cuda_ctx_t *c = (cuda_ctx_t *)p;
    if (b->dtype != FY_DTYPE_F32 || b->ne[1] != 1) {
        fy_error("cuda backend: a bias must be an f32 vector, not %s [%lld, %lld]", fy_dtype_name(b->dtype),
                 (long long)b->ne[1], (long long)b->ne[0]);
        return FY_ERR_INVALID;
    }
    if (n < 1) return FY_OK;
    CK(fy_cuda_add_bias(x, (const float *)b->data, n, (int32_t)b->ne[0], c->stream), "launching add_bias");
    return FY_OK;
}

static fy_status_t cuda_scale(void *p, float *x, float s, size_t n)
{
    cuda_ctx_t *c = (cuda_ctx_t *)p;
    CK(fy_cuda_scale(x, s, n, c->stream), "launching scale");
    return FY_OK;
}

/* rows in stream order, one copy each: the same result as the CPU's
 * memmove loop even when dst and src are the same buffer */
static fy_status_t cuda_get_rows(void *p, const float *src, const int32_t *rows, int32_t n, int32_t dim, float *dst)
{
    cuda_ctx_t *c = (cuda_ctx_t *)p;
    for (int32_t i = 0; i < n; i++) {
        const float *s = src + (size_t)rows[i] * dim;
        float *d = dst + (size_t)i * dim;
        if (s == d) continue;
        CK(cudaMemcpyAsync(d, s, (size_t)dim * sizeof(float), cudaMemcpyDeviceToDevice, c->stream), "copying rows");
    }
    return FY_OK;
}

static fy_status_t cuda_kv_write(void *p, const fy_kv_layout_t *lay, void *arena, int32_t layer, const float *k,
                                 const float *v)
{
    cuda_ctx_t *c = (cuda_ctx_t *)p;
    if (lay->dtype != FY_DTYPE_F32 && lay->dtype != FY_DTYPE_F16) {
        fy_error("cuda backend: kv dtype %s unsupported (f32, f16)", fy_dtype_name(lay->dtype));
        return FY_ERR_UNSUPPORTED;
    }
    /* the slots of the layer's group; the layer's place in that group's blocks */
    CK(fy_cuda_kv_write(arena, c->slots_dev + (size_t)lay->layer_group[layer] * (size_t)c->n_tokens, c->n_tokens, k, v,
                        lay->n_kv_heads, lay->head_dim, lay->block_size, lay->block_bytes, lay->layer_bytes,
                        lay->kv_bytes, lay->head_bytes, lay->layer_slot[layer], lay->dtype == FY_DTYPE_F16, c->stream),
       "launching kv_write");
    return FY_OK;
}

static fy_status_t cuda_attention(void *p, const fy_kv_layout_t *lay, const void *arena, int32_t layer, int32_t n_heads,
                                  float scale, int32_t window, const float *q, float *out)
{
    cuda_ctx_t *c = (cuda_ctx_t *)p;
    const int32_t n_kv = lay->n_kv_heads, hd = lay->head_dim;
    const int32_t G = n_kv > 0 && n_heads % n_kv == 0 ? n_heads / n_kv : 0;
    if (!G || G > FY_CUDA_ATTN_ROWS || hd > c->res.head_dim || n_heads > c->res.n_heads ||
        (lay->dtype != FY_DTYPE_F32 && lay->dtype != FY_DTYPE_F16)) {
        fy_error("cuda backend: attention shape unsupported (%d heads, %d kv heads, head size %d, kv %s)", n_heads,
                 n_kv, hd, fy_dtype_name(lay->dtype));
        return FY_ERR_UNSUPPORTED;
    }
    /* prefill tiles several tokens per block; at most ROWS query rows, and
     * the accumulators must fit the threads' registers */
    int32_t qt = FY_CUDA_ATTN_ROWS / G;
    while (qt > 1 && (size_t)qt * G * hd > (size_t)FY_CUDA_ATTN_THREADS * FY_CUDA_ATTN_ACC) qt--;
    if ((size_t)qt * G * hd > (size_t)FY_CUDA_ATTN_THREADS * FY_CUDA_ATTN_ACC) {
        fy_error("cuda backend: attention group of %d heads of size %d is too large for one block", G, hd);
        return FY_ERR_UNSUPPORTED;
    }
    int32_t n_tiles = 0;
    for (int32_t s = 0; s < c->n_seqs; s++) {
        if (c->seqs_host[s].kv_len > c->seqs_host[s].n_blocks * lay->block_size) {
            fy_error("cuda backend: sequence %d has %d tokens but only %d blocks", s, c->seqs_host[s].kv_len,
                     c->seqs_host[s].n_blocks);
            return FY_ERR_INVALID;
        }
        n_tiles += (c->seqs_host[s].n_q + qt - 1) / qt;
    }
    fy_cuda_attn_args_t a;
    memset(&a, 0, sizeof(a));
    a.q = q;
    a.arena = arena;
    a.seqs = c->seqs_dev;
    a.block_tables = c->bt_dev;
    a.apos = c->apos_dev;
    a.pm = c->pm_dev;
    a.pl = c->pl_dev;
    a.pacc = c->pacc_dev;
    a.out = out;
    a.n_seqs = c->n_seqs;
    a.n_tokens = c->n_tokens;
    a.n_heads = n_heads;
    a.n_kv = n_kv;
    a.hd = hd;
    a.G = G;
    a.qt = qt;
    a.n_tiles = n_tiles;
    a.max_segs = c->max_segs;
    a.block_size = lay->block_size;
    a.layer = lay->layer_slot[layer]; /* its place in its group's blocks */
    a.group = lay->layer_group[layer];
    a.f16 = lay->dtype == FY_DTYPE_F16;
    a.block_bytes = lay->block_bytes;
    a.layer_bytes = lay->layer_bytes;
    a.kv_bytes = lay->kv_bytes;
    a.head_bytes = lay->head_bytes;
    a.window = window;
    a.scale = scale;
    CK(fy_cuda_attention(&a, c->max_pos / FY_CUDA_ATTN_SEG + 1, c->stream), "launching attention");
    return FY_OK;
}

static fy_status_t cuda_sync(void *p)
{
    cuda_ctx_t *c = (cuda_ctx_t *)p;
    CK(cudaStreamSynchronize(c->stream), "synchronizing the compute stream");
    return FY_OK;
}

/* H2O's per-block attention mass is computed by the CPU attention only */
static fy_status_t cuda_set_attn_scores(void *p, float *scores, int32_t stride)
{
    if (!scores) return FY_OK;
    fy_error("cuda backend: H2O attention scores are not on the GPU yet (kv eviction by scores needs the cpu backend)");
    return FY_ERR_UNSUPPORTED;
}

static const fy_backend_ops_t
    g_cuda_ops =
        {
            "cuda",
            cuda_destroy,
            cuda_reserve,
            cuda_alloc,
            cuda_free,
            cuda_mem_info,
            cuda_alloc_host,
            cuda_free_host,
            cuda_memcpy,
            cuda_upload,
            cuda_release_tensor,
            cuda_copy_blocks,
            cuda_set_batch,
            cuda_embed,
            cuda_matmul,
            cuda_rmsnorm,
            cuda_rope,
            cuda_swiglu,
            cuda_add,
            cuda_get_rows,
            cuda_kv_write,
            cuda_attention,
            cuda_sync,
            cuda_geglu,
            cuda_add_bias,
            cuda_scale,
            cuda_set_attn_scores,
            NULL, /* rmsnorm_matmul: backend.c runs rmsnorm then matmul */
};

/* ---- creation ---------------------------------------------------------------------------- */

extern "C" int fy_backend_cuda_probe(char *why, size_t cap)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        if (why) snprintf(why, cap, "cudaGetDeviceCount: %s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
        cudaGetLastError(); /* clear the sticky-free error so later calls start clean */
        return 0;
    }
    if (n == 0 && why) snprintf(why, cap, "cudaGetDeviceCount found no device");
    return n;
}

extern "C" fy_status_t fy_backend_cuda_init(const fy_backend_params_t *params, const fy_backend_ops_t **ops_p,
                                            void **ctx_p, char *desc, size_t desc_cap, int *n_threads_p)
{
    char why[160];
    if (fy_backend_cuda_probe(why, sizeof(why)) < 1) {
        fy_error("cuda backend: no usable device: %s", why);
        return FY_ERR_UNSUPPORTED;
    }
    cuda_ctx_t *c = (cuda_ctx_t *)fy_calloc(1, sizeof(*c));
    if (!c) {
        fy_error("cuda backend: out of memory");
        return FY_ERR_NOMEM;
    }
    c->device = 0;
    cudaDeviceProp prop;
    fy_status_t st = cuda_check(cudaSetDevice(c->device), "selecting device 0");
    if (!st) st = cuda_check(cudaGetDeviceProperties(&prop, c->device), "querying device 0");
    if (!st) st = cuda_check(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "creating a stream");
    if (!st) st = cuda_check(cudaStreamCreateWithFlags(&c->copy_stream, cudaStreamNonBlocking), "creating a stream");
    if (!st) st = cuda_check(cudaEventCreateWithFlags(&c->compute_done, cudaEventDisableTiming), "creating an event");
    if (!st) st = cuda_check(cudaEventCreateWithFlags(&c->meta_done, cudaEventDisableTiming), "creating an event");
    if (!st) st = blas_check(cublasCreate(&c->blas), "creating a handle");
    if (!st) st = blas_check(cublasSetStream(c->blas, c->stream), "setting the stream");
    if (!st) st = cuda_check(cudaEventRecord(c->meta_done, c->stream), "recording an event");
    if (st != FY_OK) {
        cuda_destroy(c);
        return st;
    }
    if (prop.major < 8) {
        fy_error("cuda backend: %s is compute capability %d.%d; bf16 kernels need 8.0 or newer", prop.name, prop.major,
                 prop.minor);
        cuda_destroy(c);
        return FY_ERR_UNSUPPORTED;
    }
    snprintf(desc, desc_cap, "cuda/%s sm_%d%d", prop.name, prop.major, prop.minor);
    *ops_p = &g_cuda_ops;
    *ctx_p = c;
    *n_threads_p = 1;
    return FY_OK;
}

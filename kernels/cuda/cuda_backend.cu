/*
 * cuda_backend.cu - the CUDA backend: the ops table of backend_impl.h on
 * one GPU.  Projections are cuda_quant.cu's vector kernels (decode) or
 * cuBLAS on bf16 tiles (prefill); the other ops are the kernels of
 * cuda_kernels.cu.
 *
 * Weights.  Matmul weights and embedding tables stay on the device as the
 * file stores them (every weight type: GGUF's blocks, F16/BF16/F32 rows;
 * kernels/cuda_plan.h), copied from the mmap through pinned staging
 * buffers filled by several threads while the previous chunk's copy is
 * in flight.  Uploads of the same host tensor (a tied output head and the
 * embedding table) share one device copy, counted, freed with the last
 * tensor.  Decode matmuls (n <= FY_CUDA_MMV_MAX_N) quantize x to q8 and
 * take integer dot products with the stored blocks; prefill dequantizes
 * tiles of rows to bf16 into the reservation's scratch tile and calls
 * cublasGemmEx (bf16 in, fp32 compute and out).  The embedding lookup
 * dequantizes the tokens' rows on the device.  Norm weights stay f32.
 *
 * Streams.  Compute runs on one stream; KV block copies (swap, demotion,
 * copy-on-write) on a second, ordered after the compute enqueued before
 * them by an event, and complete when copy_blocks returns.
 *
 * KV and attention.  Every KV format of kv.h: f32, f16, and fp8/int8 rows
 * with their per-row scale, written bit for bit as the CPU writes them.
 * Decode rows' contexts are split over the multiprocessors (flash-
 * decoding, cuda_attn.h); the partial scratch is sized by decode rows
 * only and reserved before the runner sizes the KV pool from what is
 * left.  H2O's per-block attention mass is a third kernel that rereads K
 * with each row's final softmax state (the CPU computes it inside its
 * attention pass); it is gathered on the device and added into the host
 * array at sync.
 *
 * Recorded steps.  graph_begin/graph_end capture the compute stream
 * between them into a CUDA graph per (owner, shape) and replay it
 * (backend.h; the runner pads decode batches to buckets for it).
 *
 * Not here: a determinism guarantee across batch compositions (cuBLAS
 * picks its algorithm by shape; attention is batch-independent), multi-
 * GPU.
 *
 * Status: compiled in CI for sm_80 and sm_90; never yet run on a GPU.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

/* the project's headers are C11; their one C-only construct, spelled for C++ */
#define _Static_assert static_assert
extern "C" {
#include "kernels/backend_impl.h"
#include "kernels/cuda_plan.h"
#include "common/log.h"
#include "common/mem.h"
}

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_quant.h"

#define FY_CUDA_PACK_STORED 0x53 /* fy_tensor_t.packing: a matmul/rows weight on the device as its file stores it */
#define MAX_HEAD_DIM FY_CUDA_MAX_HEAD_DIM
#define CUDA_MAX_GRAPHS 64              /* recorded steps kept: buckets x runners */
#define CUDA_BLAS_WORKSPACE (32u << 20) /* cuBLAS's recommended size on Hopper */

/* ---- foreign errors at the boundary -------------------------------------------------- */

/* Logs a failed call and clears CUDA's last-error slot, so the next
 * launch's cudaGetLastError reports that launch, not this one.  (A sticky
 * error, a kernel fault, stays: every later call fails, and says so.) */
static fy_status_t cuda_check(cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return FY_OK;
    (void)cudaGetLastError();
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
    int32_t n_sms;   /* multiprocessors: how far a decode row's context is split */
    size_t max_smem; /* shared memory a block may opt in to */
    fy_backend_reserve_t res;
    bool reserved;
    /* the batch: one pinned staging buffer and its device twin, laid out
     * tokens | pos | apos | tseq | split_tok [max_tokens] | slots [n_groups][max_tokens] |
     * seqs [max_seqs] | block_tables [max_blocks] (each sequence's groups one after another) */
    int32_t *meta_pinned, *meta_dev;
    size_t meta_ints;
    int32_t *tokens_dev, *pos_dev, *slots_dev, *apos_dev, *tseq_dev, *split_dev, *bt_dev;
    fy_cuda_seq_t *seqs_dev;
    fy_cuda_seq_t *seqs_host; /* [max_seqs] the host's copy (tiling, checks) */
    int32_t *tokens_host;     /* [max_tokens] (range checks in embed) */
    int32_t n_tokens, n_seqs, max_pos;
    int32_t n_split, grid_segs, max_n_blocks; /* this batch: split tokens, most segments, longest table */
    void *xb_dev;                             /* [max_tokens, max_row] bf16 matmul input */
    /* attention scratch: partials of split rows [split_tokens, n_heads, splits] (+ head_dim),
     * and every row's final max and sum [max_tokens, n_heads] */
    float *pm_dev, *pl_dev, *pacc_dev, *fm_dev, *fl_dev;
    int32_t splits, split_tokens;
    /* H2O: the step's per-block attention mass on the device, the pinned
     * buffer it comes back through, and the host array it is added into */
    float *scores_dev, *scores_pinned, *scores_host;
    size_t scores_cap; /* floats in either buffer */
    int32_t scores_stride, scores_seqs;
    bool scores_pending; /* the device holds mass not yet added into scores_host */
    /* recorded steps (backend.h): instantiated graphs by (owner, shape) */
    struct {
        const void *owner;
        int32_t shape;
        cudaGraphExec_t exec;
    } graphs[CUDA_MAX_GRAPHS];
    int32_t n_graphs;
    int32_t recording;     /* 1 while the compute stream is being recorded */
    const void *rec_owner; /* what is being recorded */
    int32_t rec_shape;
    int32_t replay;  /* graphs[replay - 1] is to be launched by graph_end */
    bool graphs_off; /* a recording failed: run every step directly */
    void *blas_work; /* cuBLAS's workspace, fixed so that a recorded GEMM allocates nothing */
    /* ---- weights as stored (cuda_quant.cu; kernels/cuda_plan.h) ---- */
    fy_cuda_wscratch_t wplan;                   /* the reservation's weight scratch */
    void *wxq_dev;                              /* q8 activation rows and scales of the vector kernels */
    void *wtile_dev;                            /* bf16 tile of dequantized weight rows for the GEMM */
    void *stage[FY_CUDA_STAGE_BUFS];            /* pinned upload staging, made at the first upload */
    cudaEvent_t stage_done[FY_CUDA_STAGE_BUFS]; /* the copy out of stage[i] finished */
    fy_cuda_share_table_t shared;               /* device copies shared by uploads of one host tensor */
} cuda_ctx_t;

static void free_work(cuda_ctx_t *c);

/* Every recording refers to the memory it was made with. */
static void drop_graphs(cuda_ctx_t *c)
{
    for (int32_t i = 0; i < c->n_graphs; i++) cudaGraphExecDestroy(c->graphs[i].exec);
    c->n_graphs = 0;
    c->replay = 0;
}

/* the weight scratch of a reservation (reserve-time; free_work frees it) */
static void free_weight_work(cuda_ctx_t *c)
{
    cudaFree(c->wxq_dev);
    cudaFree(c->wtile_dev);
    c->wxq_dev = c->wtile_dev = NULL;
    memset(&c->wplan, 0, sizeof(c->wplan));
}

static void cuda_destroy(void *p)
{
    cuda_ctx_t *c = (cuda_ctx_t *)p;
    if (!c) return;
    cudaSetDevice(c->device);
    if (c->stream) cudaStreamSynchronize(c->stream);
    free_work(c); /* the weight scratch too */
    drop_graphs(c);
    cudaFree(c->blas_work);
    /* ---- weights as stored ---- */
    for (int i = 0; i < FY_CUDA_STAGE_BUFS; i++) {
        cudaFreeHost(c->stage[i]);
        if (c->stage_done[i]) cudaEventDestroy(c->stage_done[i]);
    }
    fy_cuda_share_free(&c->shared);
    /* ---- */
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
    cudaFree(c->fm_dev);
    cudaFree(c->fl_dev);
    cudaFree(c->scores_dev);
    cudaFreeHost(c->scores_pinned);
    fy_free(c->seqs_host);
    fy_free(c->tokens_host);
    c->meta_dev = c->meta_pinned = NULL;
    c->xb_dev = NULL;
    c->pm_dev = c->pl_dev = c->pacc_dev = c->fm_dev = c->fl_dev = NULL;
    c->scores_dev = c->scores_pinned = c->scores_host = NULL;
    c->scores_cap = 0;
    c->scores_pending = false;
    c->seqs_host = NULL;
    c->tokens_host = NULL;
    c->reserved = false;
    free_weight_work(c); /* weights as stored */
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
    drop_graphs(c);
    const size_t T = (size_t)r->max_tokens, seq_ints = sizeof(fy_cuda_seq_t) / sizeof(int32_t);
    const size_t NG = (size_t)(r->n_groups > 0 ? r->n_groups : 1);
    c->meta_ints = (5 + NG) * T + (size_t)r->max_seqs * seq_ints + (size_t)r->max_blocks;
    /* partials for decode rows only (cuda_attn.h): prefill rows are not split */
    c->splits = fy_cuda_attn_splits(c->n_sms, r->n_kv_heads > 0 ? r->n_kv_heads : r->n_heads);
    c->split_tokens = fy_cuda_attn_split_tokens(r->max_tokens, r->max_seqs);
    const size_t parts = (size_t)c->split_tokens * (size_t)r->n_heads * (size_t)c->splits;
    const size_t rows = T * (size_t)r->n_heads;
    /* H2O's per-block mass: a block holds at least 8 tokens (kv.h) */
    c->scores_cap = (size_t)r->max_seqs * (size_t)((r->max_kv_len + 7) / 8);
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
        {(void **)&c->fm_dev, rows * sizeof(float), "attention row maxima"},
        {(void **)&c->fl_dev, rows * sizeof(float), "attention row sums"},
        {(void **)&c->scores_dev, c->scores_cap * sizeof(float), "attention scores"},
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
    if (e == cudaSuccess)
        e = cudaHostAlloc((void **)&c->scores_pinned, c->scores_cap * sizeof(float), cudaHostAllocDefault);
    if (e != cudaSuccess) {
        free_work(c);
        return cuda_check(e, "reserving pinned batch metadata");
    }
    fy_status_t st = cuda_check(cudaMemsetAsync(c->scores_dev, 0, c->scores_cap * sizeof(float), c->stream),
                                "clearing attention scores");
    if (st != FY_OK) {
        free_work(c);
        return st;
    }
    c->tokens_dev = c->meta_dev;
    c->pos_dev = c->meta_dev + T;
    c->apos_dev = c->meta_dev + 2 * T;
    c->tseq_dev = c->meta_dev + 3 * T;
    c->split_dev = c->meta_dev + 4 * T;
    c->slots_dev = c->meta_dev + 5 * T;
    c->seqs_dev = (fy_cuda_seq_t *)(c->meta_dev + (5 + NG) * T);
    c->bt_dev = c->meta_dev + (5 + NG) * T + (size_t)r->max_seqs * seq_ints;
    /* ---- weights as stored: q8 activations for decode, a bf16 tile for prefill ---- */
    if (fy_cuda_wscratch_plan(r, &c->wplan) != FY_OK) { /* rows and tokens were checked above */
        fy_error("cuda backend: no weight scratch for a reservation of %d tokens of %d", r->max_tokens, r->max_row);
        free_work(c);
        return FY_ERR_INVALID;
    }
    e = cudaMalloc(&c->wxq_dev, c->wplan.xq_bytes);
    if (e != cudaSuccess) {
        c->wxq_dev = NULL;
    } else if (c->wplan.tile_bytes) {
        e = cudaMalloc(&c->wtile_dev, c->wplan.tile_bytes);
        if (e != cudaSuccess) c->wtile_dev = NULL;
    }
    if (e != cudaSuccess) {
        char what[128];
        snprintf(what, sizeof(what), "reserving %zu + %zu bytes of weight scratch (q8 activations, a bf16 tile)",
                 c->wplan.xq_bytes, c->wplan.tile_bytes);
        free_work(c);
        return cuda_check(e, what);
    }
    /* ---- */
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
    if (!ptr) return;
    drop_graphs((cuda_ctx_t *)p);
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

/* One slice of a staging chunk, copied by its own thread (page faults of
 * a cold mmap are the cost: several threads take them in parallel). */
typedef struct stage_job {
    char *dst;
    const char *src;
    size_t n;
} stage_job_t;

static void *stage_copy_slice(void *arg)
{
    const stage_job_t *j = (const stage_job_t *)arg;
    memcpy(j->dst, j->src, j->n);
    return NULL;
}

/* fills dst (pinned) from src with threads threads (fy_cuda_stage_slice);
 * a thread that cannot be started copies on the caller's */
static void stage_fill(char *dst, const char *src, size_t len, int threads)
{
    pthread_t tid[FY_CUDA_STAGE_MAX_THREADS];
    stage_job_t jobs[FY_CUDA_STAGE_MAX_THREADS];
    bool started[FY_CUDA_STAGE_MAX_THREADS] = {false};
    for (int i = 0; i < threads; i++) {
        size_t off, n;
        fy_cuda_stage_slice(len, threads, i, &off, &n);
        jobs[i] = (stage_job_t){dst + off, src + off, n};
        if (i > 0 && n > 0) started[i] = pthread_create(&tid[i], NULL, stage_copy_slice, &jobs[i]) == 0;
    }
    for (int i = 0; i < threads; i++)
        if (!started[i]) stage_copy_slice(&jobs[i]);
    for (int i = 1; i < threads; i++)
        if (started[i]) pthread_join(tid[i], NULL);
}

/* Host bytes to the device as they lie: chunks through the pinned staging
 * buffers in turn, each filled by several threads while the copy of the
 * one before is in flight on the compute stream (so compute enqueued later
 * is ordered after it).  Complete when it returns. */
static fy_status_t stage_upload(cuda_ctx_t *c, void *dst_dev, const void *src, size_t bytes)
{
    for (int i = 0; i < FY_CUDA_STAGE_BUFS; i++) {
        if (c->stage[i]) continue;
        char what[80];
        snprintf(what, sizeof(what), "allocating %zu bytes of pinned upload staging", FY_CUDA_STAGE_BYTES);
        cudaError_t e = cudaHostAlloc(&c->stage[i], FY_CUDA_STAGE_BYTES, cudaHostAllocDefault);
        if (e != cudaSuccess) {
            c->stage[i] = NULL;
            return cuda_check(e, what);
        }
        e = cudaEventCreateWithFlags(&c->stage_done[i], cudaEventDisableTiming);
        if (e != cudaSuccess) {
            cudaFreeHost(c->stage[i]);
            c->stage[i] = NULL;
            c->stage_done[i] = NULL;
            return cuda_check(e, "creating an upload event");
        }
    }
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    const size_t chunks = fy_cuda_stage_chunks(bytes);
    fy_status_t st = FY_OK;
    for (size_t k = 0; k < chunks && st == FY_OK; k++) {
        const int b = (int)(k % FY_CUDA_STAGE_BUFS);
        size_t off, len;
        fy_cuda_stage_chunk(bytes, k, &off, &len);
        if (k >= FY_CUDA_STAGE_BUFS && (st = cuda_check(cudaEventSynchronize(c->stage_done[b]), "uploading weights")))
            break;
        stage_fill((char *)c->stage[b], (const char *)src + off, len, fy_cuda_stage_threads(len, (int)ncpu));
        st = cuda_check(cudaMemcpyAsync((char *)dst_dev + off, c->stage[b], len, cudaMemcpyHostToDevice, c->stream),
                        "uploading weights");
        if (st == FY_OK) st = cuda_check(cudaEventRecord(c->stage_done[b], c->stream), "uploading weights");
    }
    /* every chunk in flight finishes before the staging is reused or the caller frees src */
    fy_status_t done = cuda_check(cudaStreamSynchronize(c->stream), "uploading weights");
    return st != FY_OK ? st : done;
}

/* Vectors (f32) as they are; matmul and rows weights as their file stores
 * them (cuda_plan.h: every weight type has a GPU kernel), one device copy
 * for every upload of the same host tensor (tied embeddings: the table
 * for rows and the output head for matmul are the same bytes). */
static fy_status_t cuda_upload(void *p, const fy_tensor_t *host, fy_tensor_use_t use, fy_tensor_t *dev_p)
{
    cuda_ctx_t *c = (cuda_ctx_t *)p;
    fy_tensor_t t = *host;
    void *m = NULL;
    fy_status_t st;
    char what[160];
    if (use == FY_USE_VECTOR) {
        if (host->dtype != FY_DTYPE_F32) {
            fy_error("cuda backend: vector parameters must be f32, not %s", fy_dtype_name(host->dtype));
            return FY_ERR_INVALID;
        }
        snprintf(what, sizeof(what), "allocating %zu bytes for a vector", host->nbytes);
        CK(cudaMalloc(&m, host->nbytes), what);
        if ((st = stage_upload(c, m, host->data, host->nbytes)) != FY_OK) {
            cudaFree(m);
            return st;
        }
        t.data = m;
        t.packing = 0;
        *dev_p = t;
        return FY_OK;
    }
    if ((st = fy_cuda_weight_check(host, what, sizeof(what))) != FY_OK) {
        fy_error("cuda backend: cannot upload for %s: %s", use == FY_USE_ROWS ? "rows" : "matmul", what);
        return st;
    }
    fy_cuda_shared_t *sh = fy_cuda_share_find(&c->shared, host);
    if (sh) {
        sh->refs++;
        t.data = sh->dev;
        t.packing = FY_CUDA_PACK_STORED;
        *dev_p = t;
        return FY_OK;
    }
    const size_t bytes = host->row_bytes * (size_t)(host->ne[1] > 0 ? host->ne[1] : 1);
    snprintf(what, sizeof(what), "allocating %zu bytes for a %s weight of %lld x %lld", bytes,
             fy_dtype_name(host->dtype), (long long)host->ne[1], (long long)host->ne[0]);
    CK(cudaMalloc(&m, bytes), what);
    st = stage_upload(c, m, host->data, bytes);
    if (st == FY_OK && (st = fy_cuda_share_add(&c->shared, host, m)) != FY_OK)
        fy_error("cuda backend: out of host memory recording a weight");
    if (st != FY_OK) {
        cudaFree(m);
        return st;
    }
    t.data = m;
    t.nbytes = bytes;
    t.packing = FY_CUDA_PACK_STORED;
    *dev_p = t;
    return FY_OK;
}

/* a shared weight's device copy goes with its last tensor */
static void cuda_release_tensor(void *p, fy_tensor_t *t)
{
    cuda_ctx_t *c = (cuda_ctx_t *)p;
    if (fy_cuda_share_drop(&c->shared, t->data) <= 0) cuda_free(p, (void *)t->data);
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

/* H2O: the mass the device gathered since the last flush, added into the
 * host array (backend.h: "adds into"), and the device buffer cleared.
 * Waits for the compute stream. */
static fy_status_t scores_flush(cuda_ctx_t *c)
{
    if (!c->scores_pending) return FY_OK;
    c->scores_pending = false;
    const size_t n = (size_t)c->scores_seqs * (size_t)c->scores_stride;
    CK(cudaMemcpyAsync(c->scores_pinned, c->scores_dev, n * sizeof(float), cudaMemcpyDeviceToHost, c->stream),
       "fetching attention scores");
    CK(cudaMemsetAsync(c->scores_dev, 0, n * sizeof(float), c->stream), "clearing attention scores");
    CK(cudaStreamSynchronize(c->stream), "fetching attention scores");
    for (size_t i = 0; i < n; i++) c->scores_host[i] += c->scores_pinned[i];
    return FY_OK;
}

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
    /* a new batch turns H2O scores off (backend.h); what the last one gathered goes home first */
    fy_status_t fst = scores_flush(c);
    c->scores_host = NULL;
    if (fst != FY_OK) return fst;
    /* the previous upload must be done reading the staging buffer */
    CK(cudaEventSynchronize(c->meta_done), "waiting for the previous batch upload");
    if (m->n_groups < 1 || m->n_groups > c->res.n_groups) {
        fy_error("cuda backend: %d kv groups (reserved %d)", m->n_groups, c->res.n_groups);
        return FY_ERR_INVALID;
    }
    const size_t T = (size_t)c->res.max_tokens, NG = (size_t)c->res.n_groups;
    int32_t *tokens = c->meta_pinned, *pos = tokens + T, *apos = pos + T, *tseq = apos + T, *split = tseq + T;
    int32_t *slots = split + T;
    fy_cuda_seq_t *seqs = (fy_cuda_seq_t *)(tokens + (5 + NG) * T);
    int32_t *bt = (int32_t *)(seqs + c->res.max_seqs);
    memcpy(tokens, m->tokens, (size_t)m->n_tokens * sizeof(int32_t));
    memcpy(pos, m->pos, (size_t)m->n_tokens * sizeof(int32_t));
    memcpy(slots, m->slots, (size_t)m->n_tokens * (size_t)m->n_groups * sizeof(int32_t));
    int32_t used = 0, covered = 0, max_pos = 0, n_split = 0, grid_segs = 1, max_nb = 1;
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
        /* decode rows' contexts are split over the GPU (cuda_attn.h) */
        int32_t seg = fy_cuda_attn_seg_len(q.kv_len, q.n_q, c->splits);
        if (seg > 0 && n_split + q.n_q > c->split_tokens) seg = 0; /* cannot happen: split_tokens bounds them */
        seqs[s] = (fy_cuda_seq_t){q.q_start, q.n_q, q.kv_len, q.n_blocks, used, seg, seg > 0 ? n_split : -1};
        used += q.n_blocks * m->n_groups;
        for (int32_t t = q.q_start; t < q.q_start + q.n_q; t++) {
            apos[t] = q.kv_len - q.n_q + (t - q.q_start);
            tseq[t] = s;
            if (seg > 0) split[n_split++] = t;
        }
        if (seg > 0 && (q.kv_len - 1) / seg + 1 > grid_segs) grid_segs = (q.kv_len - 1) / seg + 1;
        if (q.n_blocks > max_nb) max_nb = q.n_blocks;
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
    c->n_split = n_split;
    c->grid_segs = grid_segs;
    c->max_n_blocks = max_nb;
    return FY_OK;
}

/* ---- compute ----------------------------------------------------------------------------- */

static fy_status_t cuda_embed(void *p, const fy_tensor_t *table, float *out)
{
    cuda_ctx_t *c = (cuda_ctx_t *)p;
    if (table->packing != FY_CUDA_PACK_STORED) {
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
    CK(fy_cuda_embed_rows(table->dtype, table->data, table->row_bytes, c->tokens_dev, c->n_tokens,
                          (int32_t)table->ne[0], out, c->stream),
       "launching embed");
    return FY_OK;
}

/* y (row-major [n, rows]) = x ([n, in]) . W^T for each weight, W as
 * stored, row-major [rows, in] (cuda_plan.h's fy_cuda_mm_path picks the
 * kernel).  Decode (n <= FY_CUDA_MMV_MAX_N): x is quantized to q8 once for
 * all the quantized weights, then one vector kernel per weight.  Prefill:
 * x goes to bf16 once; each weight is multiplied by cublasGemmEx (bf16 in,
 * fp32 compute and out), a bf16 weight directly, any other tile by tile
 * dequantized into the reservation's tile.  In cuBLAS's column-major
 * terms Y^T (rows x n) = op(A) B with A the weight (or tile) viewed as
 * [in, rows] and transposed, B = x^T [in, n]; a tile of rows r0.. writes
 * Y^T's rows r0.., at y + r0 with leading dimension rows. */
static fy_status_t cuda_matmul(void *p, int n_w, const fy_tensor_t *const *w, const float *x, int32_t n,
                               float *const *y)
{
    cuda_ctx_t *c = (cuda_ctx_t *)p;
    if (n_w < 1) return FY_ERR_INVALID;
    const int64_t in = w[0]->ne[0];
    bool any_q8 = false, any_tiled = false;
    for (int i = 0; i < n_w; i++) {
        if (w[i]->ne[0] != in || w[i]->packing != FY_CUDA_PACK_STORED) {
            fy_error("cuda backend: matmul weights of mixed widths or not uploaded for matmul");
            return FY_ERR_INVALID;
        }
        fy_cuda_mm_path_t path = fy_cuda_mm_path(w[i]->dtype, n);
        any_q8 |= path == FY_CUDA_MM_VEC_Q8;
        any_tiled |= path == FY_CUDA_MM_GEMM_TILED;
    }
    if (!c->reserved || n < 1 || n > c->res.max_tokens || in > c->res.max_row) {
        fy_error("cuda backend: matmul of %d x %lld exceeds the reservation", n, (long long)in);
        return FY_ERR_INVALID;
    }
    if (any_tiled && fy_cuda_tile_rows(c->wplan.tile_bytes, in) < 1) { /* the plan sizes it for max_row */
        fy_error("cuda backend: no weight tile for a matmul of %d x %lld", n, (long long)in);
        return FY_ERR_INVALID;
    }
    int8_t *xq = (int8_t *)c->wxq_dev;
    float *xd = (float *)((char *)c->wxq_dev + c->wplan.xd_off);
    if (any_q8) CK(fy_cuda_quantize_q8(x, n, (int32_t)in, xq, xd, c->stream), "launching q8 quantization");
    if (n > FY_CUDA_MMV_MAX_N)
        CK(fy_cuda_f32_to_bf16(x, c->xb_dev, (size_t)n * (size_t)in, c->stream), "launching bf16 conversion");
    const float one = 1.0f, zero = 0.0f;
    for (int i = 0; i < n_w; i++) {
        const fy_tensor_t *wi = w[i];
        const int64_t rows = wi->ne[1] > 0 ? wi->ne[1] : 1;
        const fy_cuda_mm_path_t path = fy_cuda_mm_path(wi->dtype, n);
        if (path == FY_CUDA_MM_VEC_Q8 || path == FY_CUDA_MM_VEC_F) {
            CK(fy_cuda_mmv(wi->dtype, wi->data, wi->row_bytes, rows, (int32_t)in, x, xq, xd, n, y[i], c->stream),
               "launching a vector matmul");
            continue;
        }
        if (path == FY_CUDA_MM_GEMM_BF16) {
            fy_status_t st =
                blas_check(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, n, (int)in, &one, wi->data,
                                        CUDA_R_16BF, (int)in, c->xb_dev, CUDA_R_16BF, (int)in, &zero, y[i], CUDA_R_32F,
                                        (int)rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                           "matmul");
            if (st != FY_OK) return st;
            continue;
        }
        const int64_t tr = fy_cuda_tile_rows(c->wplan.tile_bytes, in);
        for (int64_t k = 0; k < fy_cuda_tile_count(rows, tr); k++) {
            int64_t r0, nr;
            fy_cuda_tile(rows, tr, k, &r0, &nr);
            /* the tile is reused: stream order puts this after the GEMM of the tile before */
            CK(fy_cuda_dequant_bf16(wi->dtype, wi->data, wi->row_bytes, r0, nr, (int32_t)in, c->wtile_dev, c->stream),
               "launching a weight tile's dequantization");
            fy_status_t st =
                blas_check(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, n, (int)in, &one, c->wtile_dev,
                                        CUDA_R_16BF, (int)in, c->xb_dev, CUDA_R_16BF, (int)in, &zero, y[i] + r0,
                                        CUDA_R_32F, (int)rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                           "matmul of a weight tile");
            if (st != FY_OK) return st;
        }
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

/* The layer's rows in the arena as the kernels address them. */
static fy_status_t kv_geom(const fy_kv_layout_t *lay, int32_t layer, fy_cuda_kv_geom_t *g)
{
    if (!fy_cuda_kv_dtype_ok(lay->dtype)) {
        fy_error("cuda backend: kv dtype %s unsupported (f32, f16, fp8, int8)", fy_dtype_name(lay->dtype));
        return FY_ERR_UNSUPPORTED;
    }
    if (layer < 0 || layer >= lay->n_layers) {
        fy_error("cuda backend: layer %d of a %d-layer kv layout", layer, lay->n_layers);
        return FY_ERR_INVALID;
    }
    *g = (fy_cuda_kv_geom_t){lay->block_bytes,
                             lay->layer_bytes,
                             lay->kv_bytes,
                             lay->head_bytes,
                             lay->row_bytes,
                             lay->block_size,
                             lay->n_kv_heads,
                             lay->head_dim,
                             lay->dtype == FY_DTYPE_F32   ? FY_CUDA_KV_F32
                             : lay->dtype == FY_DTYPE_F16 ? FY_CUDA_KV_F16
                             : lay->dtype == FY_DTYPE_FP8 ? FY_CUDA_KV_FP8
                                                          : FY_CUDA_KV_I8,
                             lay->layer_slot[layer]};
    return FY_OK;
}

static fy_status_t cuda_kv_write(void *p, const fy_kv_layout_t *lay, void *arena, int32_t layer, const float *k,
                                 const float *v)
{
    cuda_ctx_t *c = (cuda_ctx_t *)p;
    fy_cuda_kv_geom_t g;
    fy_status_t st = kv_geom(lay, layer, &g);
    if (st != FY_OK) return st;
    /* the slots of the layer's group; the layer's place in that group's blocks */
    CK(fy_cuda_kv_write(arena, c->slots_dev + (size_t)lay->layer_group[layer] * (size_t)c->n_tokens, c->n_tokens, k, v,
                        &g, c->stream),
       "launching kv_write");
    return FY_OK;
}

static fy_status_t cuda_attention(void *p, const fy_kv_layout_t *lay, const void *arena, int32_t layer, int32_t n_heads,
                                  float scale, int32_t window, const float *q, float *out)
{
    cuda_ctx_t *c = (cuda_ctx_t *)p;
    const int32_t n_kv = lay->n_kv_heads, hd = lay->head_dim;
    char buf[192];
    const char *why = fy_cuda_attn_unsupported(n_heads, n_kv, hd, lay->dtype, c->max_smem, buf, sizeof(buf));
    if (!why && (hd > c->res.head_dim || n_heads > c->res.n_heads)) why = "more heads or a wider head than reserved";
    if (why) {
        fy_error("cuda backend: attention unsupported: %s", why);
        return FY_ERR_UNSUPPORTED;
    }
    fy_cuda_attn_args_t a;
    memset(&a, 0, sizeof(a));
    fy_status_t st = kv_geom(lay, layer, &a.kv);
    if (st != FY_OK) return st;
    const int32_t G = n_heads / n_kv, qt = fy_cuda_attn_qt(G, hd);
    int32_t n_tiles = 0;
    for (int32_t s = 0; s < c->n_seqs; s++) {
        if (c->seqs_host[s].kv_len > c->seqs_host[s].n_blocks * lay->block_size) {
            fy_error("cuda backend: sequence %d has %d tokens but only %d blocks", s, c->seqs_host[s].kv_len,
                     c->seqs_host[s].n_blocks);
            return FY_ERR_INVALID;
        }
        n_tiles += (c->seqs_host[s].n_q + qt - 1) / qt;
    }
    a.q = q;
    a.arena = arena;
    a.seqs = c->seqs_dev;
    a.block_tables = c->bt_dev;
    a.apos = c->apos_dev;
    a.tseq = c->tseq_dev;
    a.split_tok = c->split_dev;
    a.pm = c->pm_dev;
    a.pl = c->pl_dev;
    a.pacc = c->pacc_dev;
    a.fm = c->fm_dev;
    a.fl = c->fl_dev;
    a.out = out;
    a.scores = c->scores_host ? c->scores_dev : NULL;
    a.scores_stride = c->scores_stride;
    a.n_seqs = c->n_seqs;
    a.n_tokens = c->n_tokens;
    a.n_heads = n_heads;
    a.G = G;
    a.qt = qt;
    a.n_tiles = n_tiles;
    a.splits = c->splits;
    a.n_split = c->n_split;
    a.max_n_blocks = c->max_n_blocks;
    a.chunk = fy_cuda_attn_chunk(hd);
    /* 16-byte loads where every row starts 16-byte aligned (cudaMalloc'd
     * arenas are 256-byte aligned); the codes of fp8/int8 rows, after their
     * 4-byte scale, in 4-byte words where the head size allows */
    const bool scaled = fy_kv_dtype_scaled(lay->dtype);
    a.vec = scaled ? hd % 4 == 0 && lay->row_bytes % 4 == 0 && (uintptr_t)arena % 4 == 0
                   : lay->row_bytes % 16 == 0 && hd % (lay->dtype == FY_DTYPE_F16 ? 8 : 4) == 0 &&
                         (uintptr_t)arena % 16 == 0;
    a.group = lay->layer_group[layer];
    a.window = window;
    a.scale = scale;
    /* a recorded step is replayed with other context lengths: its grid
     * covers the most segments any decode row can have */
    CK(fy_cuda_attention(&a, c->recording ? c->splits : c->grid_segs, c->stream), "launching attention");
    if (a.scores) c->scores_pending = true;
    return FY_OK;
}

static fy_status_t cuda_sync(void *p)
{
    cuda_ctx_t *c = (cuda_ctx_t *)p;
    CK(cudaStreamSynchronize(c->stream), "synchronizing the compute stream");
    return scores_flush(c);
}

/* H2O: the attention kernels add each block's mass into a device buffer;
 * sync (or unsetting, or the next set_batch) adds it into the host array */
static fy_status_t cuda_set_attn_scores(void *p, float *scores, int32_t stride)
{
    cuda_ctx_t *c = (cuda_ctx_t *)p;
    fy_status_t st = scores_flush(c);
    c->scores_host = NULL;
    if (st != FY_OK || !scores) return st;
    if (!c->reserved || stride < 1 || (size_t)stride * (size_t)c->n_seqs > c->scores_cap) {
        fy_error("cuda backend: attention scores of %d sequences x %d blocks exceed the reservation (%zu)", c->n_seqs,
                 stride, c->scores_cap);
        return FY_ERR_INVALID;
    }
    for (int32_t s = 0; s < c->n_seqs; s++) {
        if (c->seqs_host[s].n_blocks > stride) {
            fy_error("cuda backend: attention scores stride %d is less than sequence %d's %d blocks", stride, s,
                     c->seqs_host[s].n_blocks);
            return FY_ERR_INVALID;
        }
    }
    c->scores_host = scores;
    c->scores_stride = stride;
    c->scores_seqs = c->n_seqs;
    return FY_OK;
}

/* ---- recorded steps (CUDA graphs) ---------------------------------------------------- */

static fy_status_t cuda_graph_begin(void *p, const void *owner, int32_t shape, bool *replay_p)
{
    cuda_ctx_t *c = (cuda_ctx_t *)p;
    if (c->graphs_off || c->recording || c->scores_host) return FY_ERR_UNSUPPORTED;
    for (int32_t i = 0; i < c->n_graphs; i++) {
        if (c->graphs[i].owner == owner && c->graphs[i].shape == shape) {
            c->replay = i + 1;
            *replay_p = true;
            return FY_OK;
        }
    }
    if (c->n_graphs == CUDA_MAX_GRAPHS) return FY_ERR_UNSUPPORTED; /* run it directly */
    /* thread-local: another thread's unrelated CUDA calls do not break it */
    CK(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal), "starting a recording");
    c->recording = 1;
    c->rec_owner = owner;
    c->rec_shape = shape;
    *replay_p = false;
    return FY_OK;
}

/* A recording that failed leaves nothing run and nothing kept, and turns
 * recordings off: the caller runs the step directly. */
static fy_status_t graph_failed(cuda_ctx_t *c, cudaError_t e, const char *what)
{
    (void)cudaGetLastError();
    c->graphs_off = true;
    fy_warn("cuda backend: %s failed (%s); steps run without cuda graphs from now on", what,
            e == cudaSuccess ? "an op failed while recording" : cudaGetErrorString(e));
    return FY_ERR_UNSUPPORTED;
}

static fy_status_t cuda_graph_end(void *p, bool keep)
{
    cuda_ctx_t *c = (cuda_ctx_t *)p;
    if (c->replay) {
        cudaGraphExec_t exec = c->graphs[c->replay - 1].exec;
        c->replay = 0;
        CK(cudaGraphLaunch(exec, c->stream), "launching a recorded step");
        return FY_OK;
    }
    if (!c->recording) {
        fy_error("cuda backend: graph_end without graph_begin");
        return FY_ERR_INTERNAL;
    }
    c->recording = 0;
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    if (!keep) { /* an op failed while recording: nothing of it may run */
        if (g) cudaGraphDestroy(g);
        return graph_failed(c, e, "recording a step");
    }
    if (e != cudaSuccess || !g) return graph_failed(c, e, "recording a step");
    cudaGraphExec_t exec = NULL;
    e = cudaGraphInstantiate(&exec, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) return graph_failed(c, e, "instantiating a recorded step");
    c->graphs[c->n_graphs].owner = c->rec_owner;
    c->graphs[c->n_graphs].shape = c->rec_shape;
    c->graphs[c->n_graphs].exec = exec;
    c->n_graphs++;
    CK(cudaGraphLaunch(exec, c->stream), "launching a recorded step");
    return FY_OK;
}

/* What the kernels cannot run, found when a worker starts (backend.h). */
static fy_status_t cuda_check_needs(void *p, const fy_backend_needs_t *n, char *why, size_t cap)
{
    cuda_ctx_t *c = (cuda_ctx_t *)p;
    char buf[192];
    const char *w =
        fy_cuda_attn_unsupported(n->n_heads, n->n_kv_heads, n->head_dim, n->kv_dtype, c->max_smem, buf, sizeof(buf));
    if (!w && n->head_dim / 2 > FY_CUDA_ROPE_MAX_PAIRS) w = "the model's head size (rope takes at most 512)";
    if (!w) return FY_OK;
    snprintf(why, cap, "%s", w);
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
            cuda_check_needs,
            cuda_graph_begin,
            cuda_graph_end,
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
    if (!st) st = cuda_check(cudaMalloc(&c->blas_work, CUDA_BLAS_WORKSPACE), "allocating cuBLAS's workspace");
    if (!st) st = blas_check(cublasSetWorkspace(c->blas, c->blas_work, CUDA_BLAS_WORKSPACE), "setting its workspace");
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
    c->n_sms = prop.multiProcessorCount;
    c->max_smem = prop.sharedMemPerBlockOptin;
    if ((st = cuda_check(fy_cuda_attention_init(c->max_smem), "opting attention in to shared memory"))) {
        cuda_destroy(c);
        return st;
    }
    snprintf(desc, desc_cap, "cuda/%s sm_%d%d", prop.name, prop.major, prop.minor);
    *ops_p = &g_cuda_ops;
    *ctx_p = c;
    *n_threads_p = 1;
    return FY_OK;
}

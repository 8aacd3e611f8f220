/* cuda_plan.c - the CUDA backend's host-side decisions for weights (cuda_plan.h). */
#include "kernels/cuda_plan.h"

#include <stdio.h>
#include <string.h>

#include "common/mem.h"

bool fy_cuda_weight_type(fy_dtype_t t)
{
    switch (t) {
    case FY_DTYPE_F32:
    case FY_DTYPE_F16:
    case FY_DTYPE_BF16:
    case FY_DTYPE_Q8_0:
    case FY_DTYPE_Q4_0:
    case FY_DTYPE_Q4_1:
    case FY_DTYPE_Q5_0:
    case FY_DTYPE_Q5_1:
    case FY_DTYPE_IQ4_NL:
    case FY_DTYPE_Q2_K:
    case FY_DTYPE_Q3_K:
    case FY_DTYPE_Q4_K:
    case FY_DTYPE_Q5_K:
    case FY_DTYPE_Q6_K: return true;
    case FY_DTYPE_FP8:
    case FY_DTYPE_I8:
    case FY_DTYPE_COUNT: break;
    }
    return false;
}

fy_status_t fy_cuda_weight_check(const fy_tensor_t *host, char *why, size_t cap)
{
    const int64_t in = host->ne[0], rows = host->ne[1] > 0 ? host->ne[1] : 1;
    size_t rb = 0, total = 0;
    if (!fy_cuda_weight_type(host->dtype)) {
        snprintf(why, cap, "weight type %s has no GPU kernel", fy_dtype_name(host->dtype));
        return FY_ERR_UNSUPPORTED;
    }
    if (in < 1 || in > INT32_MAX || rows > INT32_MAX || fy_dtype_row_bytes(host->dtype, in, &rb) != FY_OK) {
        snprintf(why, cap, "a %s weight of %lld x %lld is not whole blocks of at most 2^31 elements per row",
                 fy_dtype_name(host->dtype), (long long)rows, (long long)in);
        return FY_ERR_INVALID;
    }
    if (host->row_bytes != rb || !fy_mul_size(rb, (size_t)rows, &total) || host->nbytes < total || !host->data) {
        snprintf(why, cap, "a %s weight of %lld x %lld has rows of %zu bytes (expected %zu), %zu bytes in all%s",
                 fy_dtype_name(host->dtype), (long long)rows, (long long)in, host->row_bytes, rb, host->nbytes,
                 host->data ? "" : " and no data");
        return FY_ERR_INVALID;
    }
    return FY_OK;
}

fy_cuda_mm_path_t fy_cuda_mm_path(fy_dtype_t t, int32_t n)
{
    bool quant = fy_dtype_is_quantized(t);
    if (n <= FY_CUDA_MMV_MAX_N) return quant ? FY_CUDA_MM_VEC_Q8 : FY_CUDA_MM_VEC_F;
    return t == FY_DTYPE_BF16 ? FY_CUDA_MM_GEMM_BF16 : FY_CUDA_MM_GEMM_TILED;
}

fy_cuda_launch_t fy_cuda_mmv_launch(int64_t rows)
{
    fy_cuda_launch_t l = {(uint32_t)((rows + FY_CUDA_MMV_WARPS - 1) / FY_CUDA_MMV_WARPS), 32 * FY_CUDA_MMV_WARPS};
    return l;
}

fy_cuda_launch_t fy_cuda_elem_launch(int64_t n)
{
    int64_t g = (n + FY_CUDA_ELEM_THREADS - 1) / FY_CUDA_ELEM_THREADS;
    fy_cuda_launch_t l = {(uint32_t)(g > 0 ? g : 1), FY_CUDA_ELEM_THREADS};
    return l;
}

int64_t fy_cuda_tile_rows(size_t tile_bytes, int64_t in)
{
    if (in < 1) return 0;
    int64_t rows = (int64_t)(tile_bytes / 2 / (size_t)in);
    if (rows > FY_CUDA_TILE_MAX_ROWS) rows = FY_CUDA_TILE_MAX_ROWS;
    if (rows >= FY_CUDA_TILE_ALIGN) rows -= rows % FY_CUDA_TILE_ALIGN;
    return rows;
}

fy_status_t fy_cuda_wscratch_plan(const fy_backend_reserve_t *r, fy_cuda_wscratch_t *out)
{
    memset(out, 0, sizeof(*out));
    if (r->max_row < 1 || r->max_tokens < 1) return FY_ERR_INVALID;
    const int64_t row = ((int64_t)r->max_row + FY_QK - 1) / FY_QK * FY_QK; /* whole q8 blocks */
    size_t qs = (size_t)FY_CUDA_MMV_MAX_N * (size_t)row;
    out->xd_off = (qs + 15) / 16 * 16;
    out->xq_bytes = out->xd_off + (size_t)FY_CUDA_MMV_MAX_N * (size_t)(row / FY_QK) * sizeof(float);
    /* a tile only where a call can have more rows than the vector kernels take */
    if (r->max_tokens > FY_CUDA_MMV_MAX_N) {
        int64_t rows = fy_cuda_tile_rows((size_t)FY_CUDA_TILE_ELEMS * 2, r->max_row);
        if (rows < 1) rows = 1; /* a row wider than the budget: one row at a time */
        out->tile_rows_max = rows;
        out->tile_bytes = (size_t)rows * (size_t)r->max_row * 2;
    }
    return FY_OK;
}

int64_t fy_cuda_tile_count(int64_t rows, int64_t tile_rows) { return (rows + tile_rows - 1) / tile_rows; }

void fy_cuda_tile(int64_t rows, int64_t tile_rows, int64_t k, int64_t *r0_p, int64_t *nr_p)
{
    int64_t r0 = k * tile_rows, nr = rows - r0 < tile_rows ? rows - r0 : tile_rows;
    *r0_p = r0;
    *nr_p = nr > 0 ? nr : 0;
}

size_t fy_cuda_stage_chunks(size_t bytes) { return (bytes + FY_CUDA_STAGE_BYTES - 1) / FY_CUDA_STAGE_BYTES; }

void fy_cuda_stage_chunk(size_t bytes, size_t k, size_t *off_p, size_t *len_p)
{
    size_t off = k * FY_CUDA_STAGE_BYTES;
    *off_p = off;
    *len_p = off >= bytes ? 0 : bytes - off < FY_CUDA_STAGE_BYTES ? bytes - off : FY_CUDA_STAGE_BYTES;
}

int fy_cuda_stage_threads(size_t len, int ncpu)
{
    size_t t = (len + FY_CUDA_STAGE_PER_THREAD - 1) / FY_CUDA_STAGE_PER_THREAD;
    if (t > (size_t)FY_CUDA_STAGE_MAX_THREADS) t = FY_CUDA_STAGE_MAX_THREADS;
    if (ncpu >= 1 && t > (size_t)ncpu) t = (size_t)ncpu;
    return t < 1 ? 1 : (int)t;
}

void fy_cuda_stage_slice(size_t len, int threads, int i, size_t *off_p, size_t *n_p)
{
    const size_t page = 4096;
    size_t pages = (len + page - 1) / page, per = (pages + (size_t)threads - 1) / (size_t)threads;
    size_t b = (size_t)i * per * page, e = b + per * page;
    if (b > len) b = len;
    if (e > len) e = len;
    *off_p = b;
    *n_p = e - b;
}

/* ---- shared device copies ----------------------------------------------------------- */

static void fingerprint(const fy_tensor_t *h, uint8_t head[16], uint8_t tail[16])
{
    size_t n = h->row_bytes * (size_t)(h->ne[1] > 0 ? h->ne[1] : 1), k = n < 16 ? n : 16;
    memset(head, 0, 16);
    memset(tail, 0, 16);
    memcpy(head, h->data, k);
    memcpy(tail, (const char *)h->data + n - k, k);
}

fy_cuda_shared_t *fy_cuda_share_find(fy_cuda_share_table_t *t, const fy_tensor_t *host)
{
    uint8_t head[16], tail[16];
    bool have = false;
    for (int32_t i = 0; i < t->n; i++) {
        fy_cuda_shared_t *e = &t->e[i];
        if (e->host != host->data || e->dtype != host->dtype || e->ne[0] != host->ne[0] || e->ne[1] != host->ne[1] ||
            e->row_bytes != host->row_bytes)
            continue;
        if (!have) fingerprint(host, head, tail), have = true;
        if (memcmp(head, e->head, 16) == 0 && memcmp(tail, e->tail, 16) == 0) return e;
    }
    return NULL;
}

fy_status_t fy_cuda_share_add(fy_cuda_share_table_t *t, const fy_tensor_t *host, void *dev)
{
    if (t->n == t->cap) {
        int32_t cap = t->cap ? 2 * t->cap : 64;
        fy_cuda_shared_t *e = fy_realloc(t->e, (size_t)cap * sizeof(*e));
        if (!e) return FY_ERR_NOMEM;
        t->e = e;
        t->cap = cap;
    }
    fy_cuda_shared_t *e = &t->e[t->n++];
    memset(e, 0, sizeof(*e));
    e->host = host->data;
    e->dtype = host->dtype;
    e->ne[0] = host->ne[0];
    e->ne[1] = host->ne[1];
    e->row_bytes = host->row_bytes;
    fingerprint(host, e->head, e->tail);
    e->dev = dev;
    e->refs = 1;
    return FY_OK;
}

int32_t fy_cuda_share_drop(fy_cuda_share_table_t *t, const void *dev)
{
    for (int32_t i = 0; i < t->n; i++) {
        if (t->e[i].dev != dev) continue;
        int32_t left = --t->e[i].refs;
        if (left == 0) t->e[i] = t->e[--t->n];
        return left;
    }
    return -1;
}

void fy_cuda_share_free(fy_cuda_share_table_t *t)
{
    fy_free(t->e);
    memset(t, 0, sizeof(*t));
}

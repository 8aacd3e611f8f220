/*
 * cpu_backend.c - the CPU backend: ops parallelized over a thread pool,
 * inner loops from the scalar or AVX2 kernel table chosen at start-up.
 *
 * Device memory is host memory; weights are used in place from the mmap.
 * Work is split so that every output element is computed by exactly one
 * work item in a fixed order (rows of a matmul, one (token, kv head) pair
 * of attention): results are identical for any thread count and any
 * batch a sequence happens to share.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/backend_impl.h"
#include "kernels/cpu/cpu_kernels.h"
#include "common/cpuset.h"
#include "common/log.h"
#include "common/mem.h"
#include "kernels/cpu/threadpool.h"
#include "common/cpuset.h"

#define MAX_GROUP FY_ATTN_MAX_GROUP /* query heads per kv head */
#define MAX_HEAD_DIM 512
#define MAX_MATMUL_W 8
#define ATTN_SEG 64                       /* attention segment: a multiple of every block size (see below) */
#define ROPE_SLOTS 4                      /* angle tables kept per batch: distinct ropes among a model's layers */
#define H2O_ROWS_FLOATS ((size_t)1 << 20) /* H2O mass rows: 4 MiB, unless one split batch needs more */
#define TILE_ROWS 32                      /* query rows of a prefill attention tile */

int fy_cpu_has_avx2(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
    return 0;
#endif
}

int fy_cpu_has_avx512bf16(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512bf16");
#else
    return 0;
#endif
}

const fy_cpu_kernels_t *fy_cpu_kernels_pick(const char *name)
{
    bool avx2 = fy_cpu_has_avx2(), avxvnni = false, avx512vnni = false;
#if defined(__x86_64__) || defined(__i386__)
    avxvnni = avx2 && __builtin_cpu_supports("avxvnni");
    avx512vnni = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                 __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
#endif
    /* AVX512-VNNI first: its 512-bit kernels for several tokens at once
     * (prefill, batched decode) do twice the work per instruction */
    if (!name || !strcmp(name, "auto"))
        return avx512vnni ? &fy_cpu_kernels_avx512vnni
               : avxvnni  ? &fy_cpu_kernels_avxvnni
               : avx2     ? &fy_cpu_kernels_avx2
                          : &fy_cpu_kernels_scalar;
    if (!strcmp(name, "scalar")) return &fy_cpu_kernels_scalar;
    if (!strcmp(name, "avx2")) return avx2 ? &fy_cpu_kernels_avx2 : NULL;
    if (!strcmp(name, "avxvnni")) return avxvnni ? &fy_cpu_kernels_avxvnni : NULL;
    if (!strcmp(name, "avx512vnni")) return avx512vnni ? &fy_cpu_kernels_avx512vnni : NULL;
    return NULL;
}

typedef struct cpu_ctx {
    const fy_cpu_kernels_t *k;
    fy_threadpool_t *tp;
    int n_threads;
    bool no_repack;
    fy_backend_reserve_t res;
    bool reserved;
    char *xq; /* max_tokens rows of fy_q8a_bytes(max_row): quantized activations */
    /* the current batch (copied by set_batch) */
    int32_t n_tokens, n_seqs;
    int32_t *tokens, *pos, *tok_seq; /* [max_tokens] */
    int32_t *slots;                  /* [n_groups][max_tokens] */
    int32_t n_groups;
    fy_attn_seq_t *seqs;   /* [max_seqs] */
    int32_t *block_tables; /* [max_blocks] */
    fy_q8a_t *rows;        /* [max_tokens] */
    int32_t *ent_off;      /* [max_tokens + 1] attention partial offsets */
    /* this batch's rotation angles, one table per distinct rope of the
     * model's layers (local and global layers turn differently) */
    float *rope_cs, *rope_sn; /* [ROPE_SLOTS][max_tokens, head_dim / 2] */
    struct {
        bool valid;
        fy_rope_t rope;
        int32_t hd;
    } rope_slot[ROPE_SLOTS];
    int rope_next; /* the slot a new rope replaces */
    float *part;   /* attention partials of split (few-token) batches */
    size_t part_floats;
    float *kvdq; /* [n_threads][k | v][32][head_dim]: one fp8/int8 block dequantized for attention */
    /* H2O scores: the caller's array while on (set_batch turns them off),
     * and the attention pass's scratch (see attn_mass) */
    float *scores;
    int32_t scores_stride;
    float *h2o_rec; /* [n_threads][h2o_rec_per]: block records of the (token, kv head) a thread walks */
    size_t h2o_rec_per;
    float *h2o_prec; /* split mode: block records of each partial, [part][ATTN_SEG / block_size][2G] */
    size_t h2o_prec_floats;
    float *h2o_rows; /* [tokens of a pass][n_kv_heads][blocks]: mass per block of each (token, kv head) */
    size_t h2o_rows_floats;
    /* tiled attention (prefill chunks): the items of a call and each
     * thread's scratch (see attn_tiles) */
    bool attn_rows;    /* FY_CPU_ATTN=rows: every query row on its own (the reference) */
    bool attn_bf16;    /* FY_CPU_ATTN=bf16: tiles in bf16 arithmetic (where the CPU has it) */
    bool attn_i8;      /* FY_CPU_ATTN=int8: int8 KV read in place by 8-bit query dots (VNNI) in the row walk */
    int32_t *tiles;    /* [max_tiles][4]: sequence, kv head, first row, rows */
    int64_t max_tiles; /* n_heads * (max_tokens / TILE_ROWS + max_seqs) */
    float *tile_ws;    /* [n_threads][tile_ws_per] */
    size_t tile_ws_per;
    bool no_fuse; /* FY_CPU_FUSE=0: rmsnorm_matmul runs the two ops */
    /* two-pass activations (fy_backend_params_t.act_q8x2, FY_CPU_ACT=q8x2):
     * each quantized row's rounding error quantized again (xq2, rows2), and
     * each weight unit multiplied by both while in cache (x2_ws: a
     * thread's outputs of the second pass, [n_threads][max_tokens][16]) */
    bool act_x2;
    char *xq2;
    fy_q8a_t *rows2;
    float *x2_ws;
    float *x2_res; /* [n_threads][max_row]: a row's rounding error */
} cpu_ctx_t;

/* ---- memory ---------------------------------------------------------------------- */

static void cpu_destroy(void *p)
{
    cpu_ctx_t *c = p;
    if (!c) return;
    fy_threadpool_destroy(c->tp);
    fy_free(c->xq);
    fy_free(c->xq2);
    fy_free(c->rows2);
    fy_free(c->x2_ws);
    fy_free(c->x2_res);
    fy_free(c->tokens);
    fy_free(c->pos);
    fy_free(c->slots);
    fy_free(c->tok_seq);
    fy_free(c->seqs);
    fy_free(c->block_tables);
    fy_free(c->rows);
    fy_free(c->ent_off);
    fy_free(c->rope_cs);
    fy_free(c->rope_sn);
    fy_free(c->part);
    fy_free(c->kvdq);
    fy_free(c->h2o_rec);
    fy_free(c->h2o_prec);
    fy_free(c->h2o_rows);
    fy_free(c->tiles);
    fy_free(c->tile_ws);
    fy_free(c);
}

static fy_status_t cpu_reserve(void *p, const fy_backend_reserve_t *r)
{
    cpu_ctx_t *c = p;
    if (r->max_tokens < 1 || r->max_row < FY_QK || r->max_seqs < 1 || r->max_blocks < 1 || r->max_kv_len < 1 ||
        r->n_heads < 1 || r->head_dim < 1 || r->n_groups < 1 || r->n_groups > FY_KV_MAX_LAYERS) {
        fy_error("cpu backend: bad reservation (tokens %d, row %d, seqs %d, blocks %d, heads %d x %d)", r->max_tokens,
                 r->max_row, r->max_seqs, r->max_blocks, r->n_heads, r->head_dim);
        return FY_ERR_INVALID;
    }
    size_t xq_bytes;
    if (!fy_mul_size((size_t)r->max_tokens, fy_q8a_bytes(FY_ALIGN_UP(r->max_row, FY_QK)), &xq_bytes))
        return FY_ERR_INVALID;
    /* split attention runs for fewer than 4 (token, kv head) pairs per
     * thread; each pair has a partial per segment of every head, plus
     * max and sum */
    size_t part_floats = (size_t)4 * (size_t)c->n_threads * (size_t)(r->max_kv_len / ATTN_SEG + 1) *
                         (size_t)r->n_heads * (size_t)(r->head_dim + 2);
    /* H2O scratch, reserved always (a few MiB) so that scores can be
     * turned on per batch.  Bounds: blocks a query sees at the smallest
     * block size (8), groups of at most n_heads heads.  Each thread keeps
     * (bsum, m) per head of every block its current (token, kv head)
     * visits; split mode keeps them per partial (8 blocks per segment at
     * most); the rows of masses hold as many tokens as fit in
     * H2O_ROWS_FLOATS (prefill chunks beyond that run in several passes),
     * and always every token of a batch small enough for split mode. */
    size_t nb_max = (size_t)r->max_kv_len / 8 + 1, g_max = r->n_heads < MAX_GROUP ? (size_t)r->n_heads : MAX_GROUP;
    size_t per_token = (size_t)r->n_heads * nb_max, split_rows = (size_t)4 * (size_t)c->n_threads * per_token;
    size_t rows_floats = (size_t)r->max_tokens * per_token;
    size_t rows_cap = H2O_ROWS_FLOATS > split_rows ? H2O_ROWS_FLOATS : split_rows;
    if (rows_floats > rows_cap) rows_floats = rows_cap;
    size_t rec_per = nb_max * 2 * g_max;
    /* tiles: a thread's kernel work (transposed K, f32 V), then per row
     * of its tile the segment partial and the running (m, l) and sums */
    size_t tile_g = (size_t)g_max, tile_hd = (size_t)r->head_dim;
    size_t tile_ws_per = FY_ALIGN_UP(2 * 32 * tile_hd + (size_t)TILE_ROWS * tile_g * (4 + 2 * tile_hd), 16);
    int64_t max_tiles = (int64_t)r->n_heads * ((int64_t)r->max_tokens / TILE_ROWS + r->max_seqs + 1);
    size_t prec_floats = (size_t)4 * (size_t)c->n_threads * (size_t)(r->max_kv_len / ATTN_SEG + 1) *
                         (size_t)r->n_heads * 2 * (ATTN_SEG / 8);
    struct {
        void **slot;
        size_t bytes;
    } bufs[] = {
        {(void **)&c->xq, xq_bytes},
        {(void **)&c->tokens, (size_t)r->max_tokens * sizeof(int32_t)},
        {(void **)&c->pos, (size_t)r->max_tokens * sizeof(int32_t)},
        {(void **)&c->slots, (size_t)r->max_tokens * (size_t)r->n_groups * sizeof(int32_t)},
        {(void **)&c->tok_seq, (size_t)r->max_tokens * sizeof(int32_t)},
        {(void **)&c->seqs, (size_t)r->max_seqs * sizeof(fy_attn_seq_t)},
        {(void **)&c->block_tables, (size_t)r->max_blocks * sizeof(int32_t)},
        {(void **)&c->rows, (size_t)r->max_tokens * sizeof(fy_q8a_t)},
        {(void **)&c->ent_off, ((size_t)r->max_tokens + 1) * sizeof(int32_t)},
        {(void **)&c->part, part_floats * sizeof(float)},
        {(void **)&c->kvdq, (size_t)c->n_threads * 2 * 32 * (size_t)r->head_dim * sizeof(float)},
        {(void **)&c->h2o_rec, (size_t)c->n_threads * rec_per * sizeof(float)},
        {(void **)&c->h2o_prec, prec_floats * sizeof(float)},
        {(void **)&c->h2o_rows, rows_floats * sizeof(float)},
        {(void **)&c->tiles, (size_t)max_tiles * 4 * sizeof(int32_t)},
        {(void **)&c->tile_ws, (size_t)c->n_threads * tile_ws_per * sizeof(float)},
        {(void **)&c->rope_cs, ROPE_SLOTS * (size_t)r->max_tokens * (size_t)(r->head_dim / 2 + 1) * sizeof(float)},
        {(void **)&c->rope_sn, ROPE_SLOTS * (size_t)r->max_tokens * (size_t)(r->head_dim / 2 + 1) * sizeof(float)},
        /* two-pass activations only (a byte otherwise) */
        {(void **)&c->xq2, c->act_x2 ? xq_bytes : 1},
        {(void **)&c->rows2, c->act_x2 ? (size_t)r->max_tokens * sizeof(fy_q8a_t) : 1},
        {(void **)&c->x2_ws, c->act_x2 ? (size_t)c->n_threads * (size_t)r->max_tokens * 16 * sizeof(float) : 1},
        {(void **)&c->x2_res,
         c->act_x2 ? (size_t)c->n_threads * FY_ALIGN_UP((size_t)r->max_row, FY_QK) * sizeof(float) : 1},
    };
    for (size_t i = 0; i < FY_ARRAY_LEN(bufs); i++) {
        fy_free(*bufs[i].slot);
        *bufs[i].slot = fy_aligned_alloc(64, bufs[i].bytes);
        if (!*bufs[i].slot) {
            c->reserved = false;
            fy_error("cpu backend: out of memory reserving %zu bytes of work buffers", bufs[i].bytes);
            return FY_ERR_NOMEM;
        }
    }
    c->part_floats = part_floats;
    c->h2o_rec_per = rec_per;
    c->h2o_prec_floats = prec_floats;
    c->h2o_rows_floats = rows_floats;
    c->max_tiles = max_tiles;
    c->tile_ws_per = tile_ws_per;
    c->scores = NULL;
    c->res = *r;
    c->reserved = true;
    return FY_OK;
}

static fy_status_t cpu_alloc(void *p, size_t bytes, void **ptr_p)
{
    void *m = fy_aligned_alloc(64, bytes);
    if (!m) {
        fy_error("cpu backend: cannot allocate %zu bytes", bytes);
        return FY_ERR_NOMEM;
    }
    /* touch every page now: the memory is really there (not just
     * overcommitted), and no request pays page faults later */
    memset(m, 0, bytes);
    *ptr_p = m;
    return FY_OK;
}

static void cpu_free(void *p, void *ptr) { fy_free(ptr); }

static fy_status_t cpu_mem_info(void *p, int64_t *total_p, int64_t *free_p)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) {
        fy_error("cpu backend: cannot read /proc/meminfo: %m");
        return FY_ERR_IO;
    }
    long long total = -1, avail = -1, v;
    char line[256];
    while (fgets(line, sizeof(line), f)) {
        if (sscanf(line, "MemTotal: %lld kB", &v) == 1) total = v;
        if (sscanf(line, "MemAvailable: %lld kB", &v) == 1) avail = v;
    }
    fclose(f);
    if (total < 0 || avail < 0) {
        fy_error("cpu backend: /proc/meminfo has no MemTotal or MemAvailable");
        return FY_ERR_IO;
    }
    *total_p = total * 1024;
    *free_p = avail * 1024;
    return FY_OK;
}

static fy_status_t cpu_memcpy(void *p, void *dst, const void *src, size_t bytes, fy_copy_kind_t kind)
{
    memcpy(dst, src, bytes);
    return FY_OK;
}

typedef struct pack_job {
    const fy_tensor_t *t;
    char *dst;
} pack_job_t;

static void pack_groups(void *arg, int64_t b, int64_t e, int thread)
{
    const pack_job_t *j = arg;
    size_t group = j->t->row_bytes * 8;
    for (int64_t g = b; g < e; g++)
        fy_pack_x8(j->t->dtype, (const char *)j->t->data + (size_t)g * group, j->t->row_bytes, j->t->ne[0] / FY_QK,
                   j->dst + (size_t)g * group);
}

static fy_status_t cpu_upload(void *p, const fy_tensor_t *host, fy_tensor_use_t use, fy_tensor_t *dev_p)
{
    cpu_ctx_t *c = p;
    fy_tensor_t t = *host; /* host memory is device memory: use the mapping in place */
    if (use == FY_USE_MATMUL && !c->no_repack && c->k->gemm_x8[host->dtype] && host->ne[1] % 8 == 0) {
        char *buf = fy_aligned_alloc(64, host->nbytes);
        if (!buf) {
            fy_error("cpu backend: out of memory packing a %lld x %lld matrix", (long long)host->ne[1],
                     (long long)host->ne[0]);
            return FY_ERR_NOMEM;
        }
        pack_job_t j = {host, buf};
        fy_threadpool_run(c->tp, host->ne[1] / 8, 16, pack_groups, &j);
        t.data = buf;
        t.packing = FY_CPU_PACK_X8;
    }
    *dev_p = t;
    return FY_OK;
}

static void cpu_release_tensor(void *p, fy_tensor_t *t)
{
    if (t->packing == FY_CPU_PACK_X8) fy_free((void *)t->data);
    t->data = NULL;
    t->packing = 0;
}

static fy_status_t cpu_copy_blocks(void *p, const fy_kv_layout_t *lay, void *dst_arena, const void *src_arena,
                                   const int32_t *dst, const int32_t *src, int32_t n, fy_copy_kind_t kind)
{
    for (int32_t i = 0; i < n; i++)
        memcpy((char *)dst_arena + (size_t)dst[i] * lay->block_bytes,
               (const char *)src_arena + (size_t)src[i] * lay->block_bytes, lay->block_bytes);
    return FY_OK;
}

/* ---- batch ------------------------------------------------------------------------ */

/* FY_CPU_FUSE=0 (rmsnorm and matmul as two ops): the path before issue 19,
 * for benchmarks.  Read at every batch (one getenv per forward pass), so
 * that a benchmark can alternate the two in one process over the same
 * weights in memory. */
static void read_switches(cpu_ctx_t *c)
{
    const char *fz = getenv("FY_CPU_FUSE");
    c->no_fuse = fz && !strcmp(fz, "0");
}

static fy_status_t cpu_set_batch(void *p, const fy_batch_meta_t *m)
{
    cpu_ctx_t *c = p;
    if (!c->reserved) {
        fy_error("cpu backend: set_batch before reserve");
        return FY_ERR_INTERNAL;
    }
    if (m->n_tokens < 1 || m->n_tokens > c->res.max_tokens || m->n_seqs < 1 || m->n_seqs > c->res.max_seqs) {
        fy_error("cpu backend: batch of %d tokens in %d sequences exceeds the reservation (%d, %d)", m->n_tokens,
                 m->n_seqs, c->res.max_tokens, c->res.max_seqs);
        return FY_ERR_INVALID;
    }
    memcpy(c->tokens, m->tokens, (size_t)m->n_tokens * sizeof(int32_t));
    memcpy(c->pos, m->pos, (size_t)m->n_tokens * sizeof(int32_t));
    if (m->n_groups < 1 || m->n_groups > c->res.n_groups) {
        fy_error("cpu backend: %d kv groups (reserved %d)", m->n_groups, c->res.n_groups);
        return FY_ERR_INVALID;
    }
    memcpy(c->slots, m->slots, (size_t)m->n_tokens * (size_t)m->n_groups * sizeof(int32_t));
    c->n_groups = m->n_groups;
    int32_t used = 0, covered = 0;
    for (int32_t s = 0; s < m->n_seqs; s++) {
        fy_attn_seq_t q = m->seqs[s];
        if (q.q_start != covered || q.n_q < 1 || q.q_start + q.n_q > m->n_tokens || q.kv_len < q.n_q ||
            q.kv_len > c->res.max_kv_len || q.n_blocks < 1 || (m->n_groups > 1 && q.group_stride < q.n_blocks) ||
            (int64_t)used + (int64_t)q.n_blocks * m->n_groups > c->res.max_blocks) {
            fy_error("cpu backend: inconsistent batch metadata for sequence %d", s);
            return FY_ERR_INVALID;
        }
        for (int32_t g = 0; g < m->n_groups; g++)
            memcpy(c->block_tables + used + g * q.n_blocks, q.block_table + (size_t)g * (size_t)q.group_stride,
                   (size_t)q.n_blocks * sizeof(int32_t));
        q.block_table = c->block_tables + used;
        q.group_stride = q.n_blocks;
        used += q.n_blocks * m->n_groups;
        c->seqs[s] = q;
        for (int32_t t = q.q_start; t < q.q_start + q.n_q; t++) c->tok_seq[t] = s;
        covered += q.n_q;
    }
    if (covered != m->n_tokens) {
        fy_error("cpu backend: batch sequences cover %d of %d tokens", covered, m->n_tokens);
        return FY_ERR_INVALID;
    }
    c->n_tokens = m->n_tokens;
    c->n_seqs = m->n_seqs;
    c->scores = NULL; /* the caller's scores were indexed by the last batch's sequences */
    read_switches(c);
    for (int i = 0; i < ROPE_SLOTS; i++) c->rope_slot[i].valid = false; /* new positions */
    return FY_OK;
}

static fy_status_t cpu_set_attn_scores(void *p, float *scores, int32_t stride)
{
    cpu_ctx_t *c = p;
    if (scores && c->n_seqs < 1) {
        fy_error("cpu backend: attention scores set before any batch");
        return FY_ERR_INVALID;
    }
    for (int32_t s = 0; scores && s < c->n_seqs; s++) {
        if (c->seqs[s].n_blocks > stride) {
            fy_error("cpu backend: attention scores stride %d is short of sequence %d's %d blocks", stride, s,
                     c->seqs[s].n_blocks);
            return FY_ERR_INVALID;
        }
    }
    c->scores = scores;
    c->scores_stride = stride;
    return FY_OK;
}

/* ---- elementwise and row ops ---------------------------------------------------------- */

static fy_status_t cpu_embed(void *p, const fy_tensor_t *table, float *out)
{
    cpu_ctx_t *c = p;
    int64_t dim = table->ne[0];
    for (int32_t t = 0; t < c->n_tokens; t++) {
        int32_t tok = c->tokens[t];
        if (tok < 0 || tok >= table->ne[1]) {
            fy_error("cpu backend: token id %d out of range (vocabulary %lld)", tok, (long long)table->ne[1]);
            return FY_ERR_INVALID;
        }
        fy_dequantize_row(table->dtype, (const char *)table->data + (size_t)tok * table->row_bytes, out + t * dim, dim);
    }
    return FY_OK;
}

typedef struct rms_job {
    const fy_cpu_kernels_t *k;
    const float *x;
    const float *w;
    float *y;
    int64_t dim;
    float eps;
} rms_job_t;

static void rms_rows(void *arg, int64_t b, int64_t e, int thread)
{
    const rms_job_t *j = arg;
    for (int64_t t = b; t < e; t++) j->k->rmsnorm(j->x + t * j->dim, j->w, j->dim, j->eps, j->y + t * j->dim);
}

static fy_status_t cpu_rmsnorm(void *p, const float *x, const fy_tensor_t *w, int32_t n, float eps, float *y)
{
    cpu_ctx_t *c = p;
    if (w->dtype != FY_DTYPE_F32) {
        fy_error("cpu backend: rmsnorm weight must be f32, not %s", fy_dtype_name(w->dtype));
        return FY_ERR_INVALID;
    }
    rms_job_t j = {c->k, x, w->data, y, w->ne[0], eps};
    fy_threadpool_run(c->tp, n, 4, rms_rows, &j);
    return FY_OK;
}

typedef struct rope_job {
    cpu_ctx_t *c;
    float *q, *k;
    int32_t n_heads, n_kv_heads, head_dim;
    fy_rope_style_t style;
    const double *inv_freq; /* [head_dim / 2] */
    float *cs, *sn;         /* the slot's tables, [n_tokens, head_dim / 2] */
} rope_job_t;

static void rope_apply(float *x, int32_t n_heads, int32_t hd, const float *cs, const float *sn, fy_rope_style_t st)
{
    int32_t half = hd / 2;
    for (int32_t h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * hd;
        for (int32_t i = 0; i < half; i++) {
            int32_t a = st == FY_ROPE_NORM ? 2 * i : i;
            int32_t b = st == FY_ROPE_NORM ? 2 * i + 1 : i + half;
            float x0 = v[a], x1 = v[b];
            v[a] = x0 * cs[i] - x1 * sn[i];
            v[b] = x0 * sn[i] + x1 * cs[i];
        }
    }
}

/* cos and sin of each token's angles, once per batch and rope: every layer
 * that turns the same way uses the same table */
static void rope_table_rows(void *arg, int64_t b, int64_t e, int thread)
{
    const rope_job_t *j = arg;
    int32_t half = j->head_dim / 2;
    for (int64_t t = b; t < e; t++) {
        double pos = (double)j->c->pos[t];
        for (int32_t i = 0; i < half; i++) {
            double a = pos * j->inv_freq[i];
            j->cs[t * half + i] = (float)cos(a);
            j->sn[t * half + i] = (float)sin(a);
        }
    }
}

static void rope_rows(void *arg, int64_t b, int64_t e, int thread)
{
    const rope_job_t *j = arg;
    int32_t half = j->head_dim / 2;
    for (int64_t t = b; t < e; t++) {
        const float *cs = j->cs + t * half, *sn = j->sn + t * half;
        rope_apply(j->q + t * j->n_heads * j->head_dim, j->n_heads, j->head_dim, cs, sn, j->style);
        rope_apply(j->k + t * j->n_kv_heads * j->head_dim, j->n_kv_heads, j->head_dim, cs, sn, j->style);
    }
}

static fy_status_t cpu_rope(void *p, float *q, float *k, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                            const fy_rope_t *rope)
{
    cpu_ctx_t *c = p;
    if (head_dim > MAX_HEAD_DIM || head_dim % 2 || head_dim > c->res.head_dim) {
        fy_error("cpu backend: rope head size %d unsupported (even, at most %d)", head_dim,
                 head_dim > c->res.head_dim ? c->res.head_dim : MAX_HEAD_DIM);
        return FY_ERR_UNSUPPORTED;
    }
    if (!(rope->theta > 0) || !(rope->freq_scale > 0)) {
        fy_error("cpu backend: rope base %g or scale %g is not positive", (double)rope->theta,
                 (double)rope->freq_scale);
        return FY_ERR_INVALID;
    }
    int slot = 0;
    while (slot < ROPE_SLOTS && !(c->rope_slot[slot].valid && c->rope_slot[slot].hd == head_dim &&
                                  fy_rope_same_angles(&c->rope_slot[slot].rope, rope)))
        slot++;
    size_t table = (size_t)c->res.max_tokens * (size_t)(c->res.head_dim / 2 + 1);
    double inv_freq[MAX_HEAD_DIM / 2];
    rope_job_t j = {c, q, k, n_heads, n_kv_heads, head_dim, rope->style, inv_freq, NULL, NULL};
    if (slot == ROPE_SLOTS) { /* a rope not seen this batch: its table, in the oldest slot */
        slot = c->rope_next;
        c->rope_next = (c->rope_next + 1) % ROPE_SLOTS;
        for (int32_t i = 0; i < head_dim / 2; i++) inv_freq[i] = fy_rope_inv_freq(rope, i, head_dim);
        j.cs = c->rope_cs + (size_t)slot * table, j.sn = c->rope_sn + (size_t)slot * table;
        fy_threadpool_run(c->tp, c->n_tokens, 16, rope_table_rows, &j);
        c->rope_slot[slot].valid = true;
        c->rope_slot[slot].rope = *rope;
        c->rope_slot[slot].hd = head_dim;
    }
    j.cs = c->rope_cs + (size_t)slot * table, j.sn = c->rope_sn + (size_t)slot * table;
    fy_threadpool_run(c->tp, c->n_tokens, 8, rope_rows, &j);
    return FY_OK;
}

typedef struct ew_job {
    const fy_cpu_kernels_t *k;
    float *out;
    const float *a, *b;
} ew_job_t;

static void swiglu_range(void *arg, int64_t b, int64_t e, int thread)
{
    const ew_job_t *j = arg;
    j->k->swiglu(j->a + b, j->b + b, j->out + b, e - b);
}

static fy_status_t cpu_swiglu(void *p, const float *gate, const float *up, float *out, size_t n)
{
    cpu_ctx_t *c = p;
    ew_job_t j = {c->k, out, gate, up};
    fy_threadpool_run(c->tp, (int64_t)n, 4096, swiglu_range, &j);
    return FY_OK;
}

static void geglu_range(void *arg, int64_t b, int64_t e, int thread)
{
    const ew_job_t *j = arg;
    j->k->geglu(j->a + b, j->b + b, j->out + b, e - b);
}

static fy_status_t cpu_geglu(void *p, const float *gate, const float *up, float *out, size_t n)
{
    cpu_ctx_t *c = p;
    ew_job_t j = {c->k, out, gate, up};
    fy_threadpool_run(c->tp, (int64_t)n, 4096, geglu_range, &j);
    return FY_OK;
}

static void add_range(void *arg, int64_t b, int64_t e, int thread)
{
    const ew_job_t *j = arg;
    for (int64_t i = b; i < e; i++) j->out[i] += j->a[i];
}

static fy_status_t cpu_add(void *p, float *x, const float *y, size_t n)
{
    cpu_ctx_t *c = p;
    ew_job_t j = {c->k, x, y, NULL};
    fy_threadpool_run(c->tp, (int64_t)n, 16384, add_range, &j);
    return FY_OK;
}

typedef struct bias_job {
    float *x;
    const float *b;
    int64_t width;
} bias_job_t;

static void bias_rows(void *arg, int64_t b, int64_t e, int thread)
{
    const bias_job_t *j = arg;
    for (int64_t t = b; t < e; t++)
        for (int64_t i = 0; i < j->width; i++) j->x[t * j->width + i] += j->b[i];
}

static fy_status_t cpu_add_bias(void *p, float *x, const fy_tensor_t *b, int32_t n)
{
    cpu_ctx_t *c = p;
    if (b->dtype != FY_DTYPE_F32 || b->ne[1] != 1) {
        fy_error("cpu backend: a bias must be an f32 vector, not %s [%lld, %lld]", fy_dtype_name(b->dtype),
                 (long long)b->ne[1], (long long)b->ne[0]);
        return FY_ERR_INVALID;
    }
    bias_job_t j = {x, b->data, b->ne[0]};
    fy_threadpool_run(c->tp, n, 16, bias_rows, &j);
    return FY_OK;
}

static void scale_range(void *arg, int64_t b, int64_t e, int thread)
{
    const ew_job_t *j = arg;
    const float s = j->a[0];
    for (int64_t i = b; i < e; i++) j->out[i] *= s;
}

static fy_status_t cpu_scale(void *p, float *x, float s, size_t n)
{
    cpu_ctx_t *c = p;
    ew_job_t j = {c->k, x, &s, NULL};
    fy_threadpool_run(c->tp, (int64_t)n, 16384, scale_range, &j);
    return FY_OK;
}

static fy_status_t cpu_get_rows(void *p, const float *src, const int32_t *rows, int32_t n, int32_t dim, float *dst)
{
    for (int32_t i = 0; i < n; i++)
        memmove(dst + (size_t)i * dim, src + (size_t)rows[i] * dim, (size_t)dim * sizeof(float));
    return FY_OK;
}

/* ---- matmul ------------------------------------------------------------------------- */

typedef struct mm_job {
    const fy_cpu_kernels_t *k;
    int n_w;
    const fy_tensor_t *const *w;
    float *const *y;
    int64_t unit_end[MAX_MATMUL_W]; /* cumulative work units: a row, or 8 rows of a packed matrix */
    const float *x;
    char *xq;       /* workspace: one quantized row per token */
    fy_q8a_t *rows; /* [n] views of the quantized rows */
    /* two-pass activations (cpu_ctx_t.act_x2), else NULL: the rows'
     * rounding errors quantized, a thread's second-pass outputs, and its
     * row of rounding errors */
    char *xq2;
    fy_q8a_t *rows2;
    float *x2_ws;
    float *x2_res;
    size_t x2_ws_per, x2_res_per;
    int64_t in;    /* input width */
    size_t xq_row; /* workspace bytes per token */
    int32_t n;     /* tokens */
} mm_job_t;

/* Two-pass activations: row t's rounding error x - d q, quantized again
 * into rows2[t] (its scales about 1/254 of the first's), so that w . x =
 * w . (d q) + w . (d2 q2) up to the second rounding. */
static void quant_residual(const mm_job_t *j, const float *x, int64_t t, int thread)
{
    float *res = j->x2_res + (size_t)thread * j->x2_res_per;
    const fy_q8a_t *q = &j->rows[t];
    for (int64_t i = 0; i < j->in; i++) res[i] = x[i] - q->d[i / FY_QK] * (float)q->qs[i];
    j->rows2[t] = fy_q8a_at(j->xq2 + (size_t)t * j->xq_row, j->in);
    j->k->quantize_q8a(res, &j->rows2[t], j->in);
}

static void quant_rows(void *arg, int64_t b, int64_t e, int thread)
{
    const mm_job_t *j = arg;
    for (int64_t t = b; t < e; t++) {
        j->rows[t] = fy_q8a_at(j->xq + (size_t)t * j->xq_row, j->in);
        j->k->quantize_q8a(j->x + t * j->in, &j->rows[t], j->in);
        if (j->rows2) quant_residual(j, j->x + t * j->in, t, thread);
    }
}

#define X16_MIN_TOKENS 8

static void mm_units(void *arg, int64_t b, int64_t e, int thread)
{
    const mm_job_t *j = arg;
    int wi = 0;
    int64_t u = b;
    while (u < e) {
        while (u >= j->unit_end[wi]) wi++;
        const fy_tensor_t *w = j->w[wi];
        int64_t first = wi ? j->unit_end[wi - 1] : 0;
        int64_t stop = e < j->unit_end[wi] ? e : j->unit_end[wi];
        int64_t rows = w->ne[1];
        float *y = j->y[wi];
        if (w->packing == FY_CPU_PACK_X8) {
            fy_gemm_x8_fn gemm = j->k->gemm_x8[w->dtype];
            /* from about 8 tokens on the matmul is compute-bound and two
             * groups per wide vector pay; below that (measured with
             * ferry bench-batch) the 256-bit kernel streams faster */
            fy_gemm_x16_fn gemm2 = j->n >= X16_MIN_TOKENS ? j->k->gemm_x16[w->dtype] : NULL;
            size_t group = 8 * w->row_bytes;
            float *ws = j->x2_ws ? j->x2_ws + (size_t)thread * j->x2_ws_per : NULL;
            for (; u < stop; u++) {
                int64_t g = u - first;
                const char *wg = (const char *)w->data + (size_t)g * group;
                int width = 8;
                if (gemm2 && u + 1 < stop) {
                    gemm2(wg, wg + group, j->in / FY_QK, j->rows, j->n, y + g * 8, rows);
                    if (ws) gemm2(wg, wg + group, j->in / FY_QK, j->rows2, j->n, ws, 16);
                    width = 16;
                } else {
                    gemm(wg, j->in / FY_QK, j->rows, j->n, y + g * 8, rows);
                    if (ws) gemm(wg, j->in / FY_QK, j->rows2, j->n, ws, 8);
                }
                /* the second pass while the unit's weights are in cache */
                for (int32_t t = 0; ws && t < j->n; t++)
                    for (int c = 0; c < width; c++) y[t * rows + g * 8 + c] += ws[t * width + c];
                if (width == 16) u++;
            }
            continue;
        }
        fy_vec_dot_fn dot = j->k->vec_dot[w->dtype];
        bool quant = fy_dtype_is_quantized(w->dtype);
        for (; u < stop; u++) {
            int64_t lr = u - first;
            const void *wrow = (const char *)w->data + (size_t)lr * w->row_bytes;
            for (int32_t t = 0; t < j->n; t++) {
                const void *xr = quant ? (const void *)&j->rows[t] : (const void *)(j->x + t * j->in);
                float v = dot(wrow, xr, j->in);
                if (quant && j->rows2) v += dot(wrow, &j->rows2[t], j->in);
                y[t * rows + lr] = v;
            }
        }
    }
}

/* Checks a matmul against the weights' types and the reservation and
 * fills the job; *quant_p says whether x must be quantized first. */
static fy_status_t mm_prepare(cpu_ctx_t *c, int n_w, const fy_tensor_t *const *w, const float *x, int32_t n,
                              float *const *y, mm_job_t *j, bool *quant_p)
{
    if (n_w < 1 || n_w > MAX_MATMUL_W) return FY_ERR_INVALID;
    *j = (mm_job_t){.k = c->k, .n_w = n_w, .w = w, .y = y, .x = x, .xq = c->xq, .in = w[0]->ne[0], .n = n};
    bool any_quant = false;
    int64_t total = 0;
    for (int i = 0; i < n_w; i++) {
        if (w[i]->ne[0] != j->in || !c->k->vec_dot[w[i]->dtype]) {
            fy_error("cpu backend: matmul weights of mixed widths or unsupported type %s", fy_dtype_name(w[i]->dtype));
            return FY_ERR_INVALID;
        }
        int be = fy_dtype_info(w[i]->dtype)->block_elems; /* 32, or 256 for the K-quants */
        if (j->in % be) {
            fy_error("cpu backend: matmul input width %lld is not a multiple of %s's %d-element blocks",
                     (long long)j->in, fy_dtype_name(w[i]->dtype), be);
            return FY_ERR_INVALID;
        }
        any_quant |= fy_dtype_is_quantized(w[i]->dtype);
        total += w[i]->packing == FY_CPU_PACK_X8 ? w[i]->ne[1] / 8 : w[i]->ne[1];
        j->unit_end[i] = total;
    }
    if (n > c->res.max_tokens || j->in > c->res.max_row) {
        fy_error("cpu backend: matmul of %d x %lld exceeds the reservation", n, (long long)j->in);
        return FY_ERR_INVALID;
    }
    if (any_quant) {
        j->xq_row = fy_q8a_bytes(j->in);
        j->rows = c->rows;
        if (c->act_x2) {
            j->xq2 = c->xq2;
            j->rows2 = c->rows2;
            j->x2_ws = c->x2_ws;
            j->x2_res = c->x2_res;
            j->x2_ws_per = (size_t)c->res.max_tokens * 16;
            j->x2_res_per = FY_ALIGN_UP((size_t)c->res.max_row, FY_QK);
        }
    }
    *quant_p = any_quant;
    return FY_OK;
}

/* The matmul proper, once x is quantized (where it must be). */
static void mm_run(cpu_ctx_t *c, mm_job_t *j)
{
    /* rows cost the same: a few large claims per thread (every claim is a
     * contended compare-and-swap) leave enough slack for imbalance */
    int64_t total = j->unit_end[j->n_w - 1];
    int64_t chunk = total / (4 * (int64_t)c->n_threads);
    fy_threadpool_run(c->tp, total, chunk > 0 ? chunk : 1, mm_units, j);
}

static fy_status_t cpu_matmul(void *p, int n_w, const fy_tensor_t *const *w, const float *x, int32_t n, float *const *y)
{
    cpu_ctx_t *c = p;
    mm_job_t j;
    bool quant;
    fy_status_t st = mm_prepare(c, n_w, w, x, n, y, &j, &quant);
    if (st != FY_OK) return st;
    if (quant) fy_threadpool_run(c->tp, n, 8, quant_rows, &j);
    mm_run(c, &j);
    return FY_OK;
}

typedef struct rms_mm_job {
    const mm_job_t *mm;
    const float *x, *norm;
    float eps;
    float *h;
    bool quant;
} rms_mm_job_t;

/* rmsnorm then quantization of each row, while the row is in L1: the same
 * kernels on the same floats as rms_rows then quant_rows */
static void rms_quant_rows(void *arg, int64_t b, int64_t e, int thread)
{
    const rms_mm_job_t *j = arg;
    const mm_job_t *m = j->mm;
    for (int64_t t = b; t < e; t++) {
        float *h = j->h + t * m->in;
        m->k->rmsnorm(j->x + t * m->in, j->norm, m->in, j->eps, h);
        if (!j->quant) continue;
        m->rows[t] = fy_q8a_at(m->xq + (size_t)t * m->xq_row, m->in);
        m->k->quantize_q8a(h, &m->rows[t], m->in);
        if (m->rows2) quant_residual(m, h, t, thread);
    }
}

static fy_status_t cpu_rmsnorm_matmul(void *p, const float *x, const fy_tensor_t *norm, float eps, int n_w,
                                      const fy_tensor_t *const *w, int32_t n, float *h, float *const *y)
{
    cpu_ctx_t *c = p;
    if (c->no_fuse) { /* FY_CPU_FUSE=0: the two ops, for comparison */
        fy_status_t st = cpu_rmsnorm(p, x, norm, n, eps, h);
        return st != FY_OK ? st : cpu_matmul(p, n_w, w, h, n, y);
    }
    mm_job_t j;
    bool quant;
    fy_status_t st = mm_prepare(c, n_w, w, h, n, y, &j, &quant);
    if (st != FY_OK) return st;
    if (norm->dtype != FY_DTYPE_F32 || norm->ne[0] != j.in) {
        fy_error("cpu backend: rmsnorm weight must be f32 of the matmul's width %lld, not %s of %lld", (long long)j.in,
                 fy_dtype_name(norm->dtype), (long long)norm->ne[0]);
        return FY_ERR_INVALID;
    }
    rms_mm_job_t r = {&j, x, norm->data, eps, h, quant};
    fy_threadpool_run(c->tp, n, 4, rms_quant_rows, &r);
    mm_run(c, &j);
    return FY_OK;
}

/* ---- KV cache and attention ------------------------------------------------------------ */

typedef struct kv_job {
    cpu_ctx_t *c;
    const fy_kv_layout_t *lay;
    char *arena;
    int32_t layer;
    const float *k, *v;
} kv_job_t;

static void kv_rows(void *arg, int64_t b, int64_t e, int thread)
{
    const kv_job_t *j = arg;
    const fy_kv_layout_t *L = j->lay;
    int64_t hd = L->head_dim;
    for (int64_t t = b; t < e; t++) {
        int32_t slot = j->c->slots[(int64_t)L->layer_group[j->layer] * j->c->n_tokens + t];
        if (slot < 0) continue; /* a padding row: nothing to keep */
        int32_t block = slot / L->block_size, off = slot % L->block_size;
        for (int32_t h = 0; h < L->n_kv_heads; h++) {
            for (int is_v = 0; is_v < 2; is_v++) {
                const float *src = (is_v ? j->v : j->k) + (t * L->n_kv_heads + h) * hd;
                char *dst = j->arena + fy_kv_offset(L, block, j->layer, is_v, h) + (size_t)off * L->row_bytes;
                if (L->dtype == FY_DTYPE_F32)
                    memcpy(dst, src, (size_t)hd * sizeof(float));
                else if (L->dtype == FY_DTYPE_F16)
                    j->c->k->f32_to_f16(src, (uint16_t *)dst, hd);
                else
                    fy_kv_row_write(L, src, dst); /* fp8, int8: quantize on write, scale per row */
            }
        }
    }
}

static fy_status_t cpu_kv_write(void *p, const fy_kv_layout_t *lay, void *arena, int32_t layer, const float *k,
                                const float *v)
{
    cpu_ctx_t *c = p;
    kv_job_t j = {c, lay, arena, layer, k, v};
    fy_threadpool_run(c->tp, c->n_tokens, 16, kv_rows, &j);
    return FY_OK;
}

/*
 * Attention runs over fixed segments of ATTN_SEG positions: for each
 * segment an online softmax over its blocks gives a partial (max, sum,
 * numerator), and the partials are merged in segment order.  When a batch
 * has few (token, KV head) pairs (decoding a sequence or two), segments
 * become separate work items whose partials are merged afterwards
 * (flash-decoding); otherwise one item walks all its segments.  The
 * segments and the merge order depend only on the token's position, so
 * both ways give the same bits and a sequence's output does not depend on
 * the batch it is in.
 *
 * H2O scores come out of the same walk.  For each block it visits, the
 * block kernel also returns the block's own sum of exp(score - m), bsum,
 * in the frame of the running max m just after the block; (bsum, m) is
 * recorded per head.  Once the segments are merged into the row's final
 * max M and sum L, the block's softmax mass is bsum * exp(m - M) / L
 * (attn_mass): exact whichever segment frame the block was summed in, and
 * no key is read twice.  Each (token, kv head) item writes its masses,
 * summed over its heads, into its own row of h2o_rows; the caller then
 * adds the rows into the scores in token and kv-head order.  A prefill
 * batch whose rows do not fit the scratch runs in several passes of
 * tokens; the order of additions is the same.
 */

typedef struct attn_job {
    cpu_ctx_t *c;
    fy_attn_block_fn block;
    const fy_kv_layout_t *lay;
    const char *arena;
    int32_t layer, n_heads, G;
    int32_t window; /* 0: global; else the last window positions */
    float scale;
    const float *q;
    float *out;
    int32_t *ent_off; /* split mode: first partial of each token, [n_tokens + 1] */
    float *part;      /* split mode: partials, G * (head_dim + 2) floats each */
    /* H2O scores (rows NULL: off) */
    int32_t t0;  /* whole mode: the pass's first token (items count from it) */
    int32_t nbw; /* blocks per row: the longest sequence's */
    float *rows; /* [pass tokens][n_kv][nbw] */
    float *rec;  /* whole mode: [n_threads][rec_per] */
    size_t rec_per;
    float *prec; /* split mode: [partial][ATTN_SEG / block_size][2G] */
} attn_job_t;

static int32_t tok_pos(const cpu_ctx_t *c, int32_t t)
{
    const fy_attn_seq_t *s = &c->seqs[c->tok_seq[t]];
    return s->kv_len - s->n_q + (t - s->q_start);
}

static float *attn_dq(const attn_job_t *j, int thread)
{
    return j->c->kvdq + (size_t)thread * 2 * 32 * (size_t)j->c->res.head_dim;
}

/* The first position the query at p sees: 0, or the start of its window. */
static int32_t win_lo(int32_t window, int32_t p) { return window && p - window + 1 > 0 ? p - window + 1 : 0; }
/* Segments [first_seg, first_seg + n_segs) hold what the query at p sees. */
static int32_t first_seg(int32_t window, int32_t p) { return win_lo(window, p) / ATTN_SEG; }
static int32_t n_segs(int32_t window, int32_t p) { return p / ATTN_SEG + 1 - first_seg(window, p); }

/* Partial attention of token t's G heads of KV head kvh over the positions
 * it sees in [seg * ATTN_SEG, (seg + 1) * ATTN_SEG): from the window's start
 * (which can fall inside a block: the block is read from that row on) to
 * p, less the blocks evicted from the table (-1: skipped, as if masked).
 * ml: m[G] then l[G] (-inf and 0 when every key was evicted).  fp8/int8
 * blocks are dequantized into the thread's dq (2 * 32 * head_dim floats)
 * and go through the f32 block kernel.  rec (H2O; NULL: off): block b's
 * (bsum[G], m[G]) at rec + (b - rec_b0) * 2G for every block the segment's
 * walk reaches, bsum 0 for an evicted one (it received nothing). */
static void attn_segment(const attn_job_t *j, int32_t t, int32_t kvh, int32_t seg, float *ml, float *acc, float *dq,
                         float *rec, int32_t rec_b0)
{
    const cpu_ctx_t *c = j->c;
    const fy_kv_layout_t *L = j->lay;
    const fy_attn_seq_t *s = &c->seqs[c->tok_seq[t]];
    const int32_t hd = L->head_dim, bs = L->block_size, G = j->G, p = tok_pos(c, t);
    const int32_t g_off = (int32_t)L->layer_group[j->layer] * s->group_stride;
    for (int32_t g = 0; g < G; g++) ml[g] = -INFINITY, ml[G + g] = 0.0f;
    memset(acc, 0, (size_t)G * hd * sizeof(float));
    const float *qt = j->q + ((size_t)t * j->n_heads + (size_t)kvh * G) * hd;
    /* int8 KV with VNNI (FY_CPU_ATTN=int8): the query quantized once here,
     * the blocks read in place; not with H2O records (no block sums) */
    const bool i8 = c->attn_i8 && L->dtype == FY_DTYPE_I8 && !rec && hd % 64 == 0;
    int8_t qc[MAX_GROUP * MAX_HEAD_DIM];
    float qs[MAX_GROUP];
    int32_t qsum[MAX_GROUP];
    if (i8) fy_attn_q8_quantize(qt, G, hd, qc, qs, qsum);
    int32_t last = (seg + 1) * ATTN_SEG < p + 1 ? (seg + 1) * ATTN_SEG : p + 1;
    int32_t lo = win_lo(j->window, p), start = seg * ATTN_SEG > lo ? seg * ATTN_SEG : lo;
    for (int32_t pos = start; pos < last;) {
        int32_t id = s->block_table[g_off + pos / bs], off = pos % bs;
        int32_t nk = last - pos < bs - off ? last - pos : bs - off;
        /* a block never straddles a segment (ATTN_SEG is a multiple of the
         * block size), so this is the block's one call for this row */
        float *r = rec ? rec + (size_t)(pos / bs - rec_b0) * 2 * G : NULL;
        if (id < 0) { /* evicted: its keys are masked, and there is nothing to read */
            if (r) memset(r, 0, (size_t)G * sizeof(float));
            pos += nk;
            continue;
        }
        const char *kb = j->arena + fy_kv_offset(L, id, j->layer, 0, kvh) + (size_t)off * L->row_bytes;
        const char *vb = j->arena + fy_kv_offset(L, id, j->layer, 1, kvh) + (size_t)off * L->row_bytes;
        if (i8) {
            fy_attn_block_i8_vnni(qc, qs, qsum, G, kb, vb, L->row_bytes, nk, hd, j->scale, ml, ml + G, acc);
            pos += nk;
            continue;
        }
        if (fy_kv_dtype_scaled(L->dtype)) {
            const int fp8 = L->dtype == FY_DTYPE_FP8;
            for (int32_t i = 0; i < nk; i++) {
                c->k->kv_row_read(kb + (size_t)i * L->row_bytes, fp8, dq + (size_t)i * hd, hd);
                c->k->kv_row_read(vb + (size_t)i * L->row_bytes, fp8, dq + (size_t)(32 + i) * hd, hd);
            }
            kb = (const char *)dq, vb = (const char *)(dq + (size_t)32 * hd);
        }
        j->block(qt, G, kb, vb, nk, hd, j->scale, ml, ml + G, acc, r);
        if (r) memcpy(r + G, ml, (size_t)G * sizeof(float)); /* the frame r's sums are in */
        pos += nk;
    }
}

/* Folds a partial (ml, acc) into the running (ML, A). */
static void attn_merge(int32_t G, int32_t hd, const float *ml, const float *acc, float *ML, float *A)
{
    for (int32_t g = 0; g < G; g++) {
        if (ml[g] == -INFINITY) continue; /* every key of the segment evicted: nothing to add */
        float mx = ml[g] > ML[g] ? ml[g] : ML[g];
        float ca = expf(ML[g] - mx), cs = expf(ml[g] - mx); /* ca is 0 at the first merge */
        ML[G + g] = ML[G + g] * ca + ml[G + g] * cs;
        for (int32_t d = 0; d < hd; d++) A[g * hd + d] = A[g * hd + d] * ca + acc[g * hd + d] * cs;
        ML[g] = mx;
    }
}

static void attn_store(const attn_job_t *j, int32_t t, int32_t kvh, const float *ML, const float *A)
{
    int32_t hd = j->lay->head_dim;
    float *ot = j->out + ((size_t)t * j->n_heads + (size_t)kvh * j->G) * hd;
    for (int32_t g = 0; g < j->G; g++) {
        /* no visible key left (all evicted; the engine never lets that
         * happen): zeros rather than 0 / 0 */
        float inv = ML[j->G + g] > 0.0f ? 1.0f / ML[j->G + g] : 0.0f;
        for (int32_t d = 0; d < hd; d++) ot[(size_t)g * hd + d] = A[(size_t)g * hd + d] * inv;
    }
}

static void attn_start(int32_t G, int32_t hd, float *ML, float *A)
{
    for (int32_t g = 0; g < G; g++) ML[g] = -INFINITY, ML[G + g] = 0.0f;
    memset(A, 0, (size_t)G * hd * sizeof(float));
}

/* H2O: adds the softmax mass of n recorded blocks (rec as attn_segment
 * writes it) under the row's final (M, L) = ML into row[0 .. n), head
 * after head: each entry gets its heads' shares in head order, whichever
 * mode recorded them.  A segment's running max changes at few blocks, so
 * the factor exp(m - M) / L is recomputed only when m does (the same
 * value either way). */
static void attn_mass(int32_t G, const float *ML, const float *rec, int32_t n, float *row)
{
    for (int32_t g = 0; g < G; g++) {
        if (!(ML[G + g] > 0.0f)) continue; /* the head saw no key */
        float inv = 1.0f / ML[G + g], m = -INFINITY, f = 0.0f;
        for (int32_t b = 0; b < n; b++) {
            const float *r = rec + (size_t)b * 2 * G;
            if (!(r[g] > 0.0f)) continue; /* not visited */
            if (r[G + g] != m) m = r[G + g], f = expf(m - ML[g]) * inv;
            row[b] += r[g] * f;
        }
    }
}

static float *attn_row(const attn_job_t *j, int32_t t, int32_t kvh)
{
    return j->rows + ((size_t)(t - j->t0) * j->lay->n_kv_heads + (size_t)kvh) * (size_t)j->nbw;
}

/* items (t, kvh) from the pass's first token on, each walking all its segments */
static void attn_whole(void *arg, int64_t b, int64_t e, int thread)
{
    const attn_job_t *j = arg;
    const int32_t n_kv = j->lay->n_kv_heads, G = j->G, hd = j->lay->head_dim, bs = j->lay->block_size;
    float ml[2 * MAX_GROUP], ML[2 * MAX_GROUP], acc[MAX_GROUP * MAX_HEAD_DIM], A[MAX_GROUP * MAX_HEAD_DIM];
    float *rec = j->rows ? j->rec + (size_t)thread * j->rec_per : NULL;
    for (int64_t it = b; it < e; it++) {
        int32_t t = j->t0 + (int32_t)(it / n_kv), kvh = (int32_t)(it % n_kv), p = tok_pos(j->c, t);
        int32_t seg0 = first_seg(j->window, p), segs = n_segs(j->window, p);
        int32_t b0 = win_lo(j->window, p) / bs, nv = p / bs + 1 - b0; /* the blocks its segments walk */
        attn_start(G, hd, ML, A);
        for (int32_t seg = seg0; seg < seg0 + segs; seg++) {
            attn_segment(j, t, kvh, seg, ml, acc, attn_dq(j, thread), rec, b0);
            attn_merge(G, hd, ml, acc, ML, A);
        }
        attn_store(j, t, kvh, ML, A);
        if (rec) {
            float *row = attn_row(j, t, kvh);
            memset(row, 0, (size_t)(p / bs + 1) * sizeof(float));
            attn_mass(G, ML, rec, nv, row + b0);
        }
    }
}

/*
 * Tiled attention for prefill chunks: one work item is a tile of up to
 * TILE_ROWS consecutive query rows of a sequence and one KV head, so each
 * K/V block is read, converted (f16, fp8, int8) and transposed once for
 * the tile's rows and heads instead of once per row.  The walk is
 * attn_whole's, row by row: the same segments and merges, the same block
 * calls over the keys each row sees (the rows that see a block form a
 * contiguous run of the tile: positions, window starts and segment ranges
 * all grow with the row), and the tile kernel repeats attn_block's
 * arithmetic per row.  So every row gets exactly the bits attn_whole gives
 * it: alone, in another tile, in split mode or with H2O scores on (which
 * still run attn_whole: they need per-block records).
 */
static void attn_tiles(void *arg, int64_t b, int64_t e, int thread)
{
    const attn_job_t *j = arg;
    const cpu_ctx_t *c = j->c;
    const fy_kv_layout_t *L = j->lay;
    const int32_t G = j->G, hd = L->head_dim, bs = L->block_size;
    float *ws = c->tile_ws + (size_t)thread * c->tile_ws_per;
    float *work = ws, *pm = work + 2 * 32 * (size_t)hd;                         /* [R][G] segment partial max */
    float *pl = pm + TILE_ROWS * G, *pacc = pl + TILE_ROWS * G;                 /* [R][G], [R][G][hd] */
    float *ML = pacc + (size_t)TILE_ROWS * G * hd, *A = ML + 2 * TILE_ROWS * G; /* [R][2G], [R][G][hd] */
    const float *qp[TILE_ROWS];
    int32_t vis[2 * TILE_ROWS], pos[TILE_ROWS], lo[TILE_ROWS];
    for (int64_t it = b; it < e; it++) {
        const int32_t *ti = c->tiles + 4 * it;
        const fy_attn_seq_t *s = &c->seqs[ti[0]];
        const int32_t kvh = ti[1], t0 = ti[2], nr = ti[3];
        const int32_t g_off = (int32_t)L->layer_group[j->layer] * s->group_stride;
        for (int32_t r = 0; r < nr; r++) {
            pos[r] = tok_pos(c, t0 + r), lo[r] = win_lo(j->window, pos[r]);
            qp[r] = j->q + ((size_t)(t0 + r) * j->n_heads + (size_t)kvh * G) * hd;
            attn_start(G, hd, ML + (size_t)r * 2 * G, A + (size_t)r * G * hd);
        }
        const int32_t seg_a = first_seg(j->window, pos[0]), seg_b = pos[nr - 1] / ATTN_SEG;
        for (int32_t seg = seg_a; seg <= seg_b; seg++) {
            /* rows whose walk has this segment: [ra, rb) */
            int32_t ra = 0, rb = nr;
            while (ra < nr && pos[ra] < seg * ATTN_SEG) ra++;
            while (rb > ra && first_seg(j->window, pos[rb - 1]) > seg) rb--;
            if (ra >= rb) continue;
            for (int32_t i = ra * G; i < rb * G; i++) pm[i] = -INFINITY, pl[i] = 0.0f;
            memset(pacc + (size_t)ra * G * hd, 0, (size_t)(rb - ra) * G * hd * sizeof(float));
            int32_t p0 = seg * ATTN_SEG > lo[ra] ? seg * ATTN_SEG : lo[ra];
            int32_t p1 = (seg + 1) * ATTN_SEG < pos[rb - 1] + 1 ? (seg + 1) * ATTN_SEG : pos[rb - 1] + 1;
            for (int32_t blk = p0 / bs; blk * bs < p1; blk++) {
                int32_t id = s->block_table[g_off + blk], b0 = blk * bs;
                if (id < 0) continue; /* evicted: masked, nothing to read */
                /* the rows that see some of this block: [va, vb) */
                int32_t va = ra, vb = rb, ulo = bs, uhi = 0;
                while (va < vb && pos[va] < b0) va++;
                while (vb > va && lo[vb - 1] >= b0 + bs) vb--;
                if (va >= vb) continue;
                for (int32_t r = va; r < vb; r++) {
                    int32_t from = lo[r] > seg * ATTN_SEG ? lo[r] : seg * ATTN_SEG;
                    int32_t vl = from > b0 ? from - b0 : 0, vh = pos[r] + 1 - b0 < bs ? pos[r] + 1 - b0 : bs;
                    vis[2 * (r - va)] = vl, vis[2 * (r - va) + 1] = vh;
                    ulo = vl < ulo ? vl : ulo, uhi = vh > uhi ? vh : uhi;
                }
                const char *kb = j->arena + fy_kv_offset(L, id, j->layer, 0, kvh);
                const char *vb_ = j->arena + fy_kv_offset(L, id, j->layer, 1, kvh);
                fy_attn_tile_fn tile = c->k->attn_tile[L->dtype == FY_DTYPE_F16 ? FY_DTYPE_F16 : FY_DTYPE_F32];
                if (c->attn_bf16 && hd % 32 == 0)
                    tile = L->dtype == FY_DTYPE_F16 ? fy_attn_tile_bf16_f16 : fy_attn_tile_bf16_f32;
                if (fy_kv_dtype_scaled(L->dtype)) { /* dequantized rows, as attn_segment reads them */
                    float *dq = attn_dq(j, thread);
                    const int fp8 = L->dtype == FY_DTYPE_FP8;
                    for (int32_t i = ulo; i < uhi; i++) {
                        c->k->kv_row_read(kb + (size_t)i * L->row_bytes, fp8, dq + (size_t)i * hd, hd);
                        c->k->kv_row_read(vb_ + (size_t)i * L->row_bytes, fp8, dq + (size_t)(32 + i) * hd, hd);
                    }
                    kb = (const char *)dq, vb_ = (const char *)(dq + (size_t)32 * hd);
                }
                tile(qp + va, vb - va, G, kb, vb_, bs, hd, j->scale, vis, pm + (size_t)va * G, pl + (size_t)va * G,
                     pacc + (size_t)va * G * hd, work);
            }
            for (int32_t r = ra; r < rb; r++) {
                float ml[2 * MAX_GROUP];
                memcpy(ml, pm + (size_t)r * G, (size_t)G * sizeof(float));
                memcpy(ml + G, pl + (size_t)r * G, (size_t)G * sizeof(float));
                attn_merge(G, hd, ml, pacc + (size_t)r * G * hd, ML + (size_t)r * 2 * G, A + (size_t)r * G * hd);
            }
        }
        for (int32_t r = 0; r < nr; r++) attn_store(j, t0 + r, kvh, ML + (size_t)r * 2 * G, A + (size_t)r * G * hd);
    }
}

/* The tiles of a batch, the costliest (last rows of the longest chunks)
 * first; false where they do not fit the reservation. */
static bool attn_tiles_plan(cpu_ctx_t *c, int32_t n_kv, int64_t *n_p)
{
    int64_t n = 0;
    for (int32_t s = 0; s < c->n_seqs; s++) {
        const fy_attn_seq_t *q = &c->seqs[s];
        for (int32_t r1 = q->n_q; r1 > 0; r1 -= TILE_ROWS) {
            int32_t r0 = r1 - TILE_ROWS > 0 ? r1 - TILE_ROWS : 0;
            for (int32_t kvh = 0; kvh < n_kv; kvh++) {
                if (n >= c->max_tiles) return false;
                int32_t *ti = c->tiles + 4 * n++;
                ti[0] = s, ti[1] = kvh, ti[2] = q->q_start + r0, ti[3] = r1 - r0;
            }
        }
    }
    *n_p = n;
    return true;
}

/* split mode, pass 1: one item per (t, kvh, segment) partial */
static void attn_parts(void *arg, int64_t b, int64_t e, int thread)
{
    const attn_job_t *j = arg;
    const int32_t G = j->G, hd = j->lay->head_dim, spb = ATTN_SEG / j->lay->block_size;
    for (int64_t it = b; it < e; it++) {
        int32_t t = 0;
        while (j->ent_off[t + 1] <= it) t++;
        int32_t p = tok_pos(j->c, t), segs = n_segs(j->window, p), local = (int32_t)(it - j->ent_off[t]);
        int32_t seg = first_seg(j->window, p) + local % segs;
        float *ml = j->part + (size_t)it * G * (hd + 2);
        float *rec = j->prec ? j->prec + (size_t)it * spb * 2 * G : NULL;
        attn_segment(j, t, local / segs, seg, ml, ml + 2 * G, attn_dq(j, thread), rec, seg * spb);
    }
}

/* split mode, pass 2: merge each (t, kvh)'s partials in segment order */
static void attn_reduce(void *arg, int64_t b, int64_t e, int thread)
{
    const attn_job_t *j = arg;
    const int32_t n_kv = j->lay->n_kv_heads, G = j->G, hd = j->lay->head_dim, bs = j->lay->block_size;
    const int32_t spb = ATTN_SEG / bs;
    float ML[2 * MAX_GROUP], A[MAX_GROUP * MAX_HEAD_DIM];
    for (int64_t it = b; it < e; it++) {
        int32_t t = (int32_t)(it / n_kv), kvh = (int32_t)(it % n_kv), p = tok_pos(j->c, t);
        int32_t seg0 = first_seg(j->window, p), segs = n_segs(j->window, p);
        attn_start(G, hd, ML, A);
        for (int32_t seg = 0; seg < segs; seg++) {
            const float *ml = j->part + (size_t)(j->ent_off[t] + kvh * segs + seg) * G * (hd + 2);
            attn_merge(G, hd, ml, ml + 2 * G, ML, A);
        }
        attn_store(j, t, kvh, ML, A);
        if (!j->prec) continue;
        float *row = attn_row(j, t, kvh);
        memset(row, 0, (size_t)(p / bs + 1) * sizeof(float));
        /* the blocks each segment's walk reached: from the window's start
         * or the segment's, to p or the segment's end */
        int32_t lo = win_lo(j->window, p) / bs, hi = p / bs;
        for (int32_t seg = 0; seg < segs; seg++) {
            int32_t sb0 = (seg0 + seg) * spb, first = sb0 > lo ? sb0 : lo,
                    last = sb0 + spb - 1 < hi ? sb0 + spb - 1 : hi;
            const float *rec = j->prec + (size_t)(j->ent_off[t] + kvh * segs + seg) * spb * 2 * G;
            attn_mass(G, ML, rec + (size_t)(first - sb0) * 2 * G, last - first + 1, row + first);
        }
    }
}

/* H2O: adds the rows of tokens [t0, t1) into the caller's scores, in token
 * then kv-head order: the order of additions into each entry (and so its
 * bits) does not depend on the passes, the threads or the mode. */
static void attn_scores_add(const cpu_ctx_t *c, const attn_job_t *j, int32_t t0, int32_t t1)
{
    const int32_t n_kv = j->lay->n_kv_heads, bs = j->lay->block_size;
    for (int32_t t = t0; t < t1; t++) {
        float *dst = c->scores + (size_t)c->tok_seq[t] * (size_t)c->scores_stride;
        int32_t nb = tok_pos(c, t) / bs + 1; /* the blocks the row may have seen */
        for (int32_t kvh = 0; kvh < n_kv; kvh++) {
            const float *row = attn_row(j, t, kvh);
            for (int32_t i = 0; i < nb; i++) dst[i] += row[i];
        }
    }
}

static fy_status_t cpu_attention(void *p, const fy_kv_layout_t *lay, const void *arena, int32_t layer, int32_t n_heads,
                                 float scale, int32_t window, const float *q, float *out)
{
    cpu_ctx_t *c = p;
    if (n_heads % lay->n_kv_heads || n_heads / lay->n_kv_heads > MAX_GROUP || lay->head_dim > MAX_HEAD_DIM ||
        lay->block_size > 32 || ATTN_SEG % lay->block_size) {
        fy_error("cpu backend: attention shape unsupported (%d heads, %d kv heads, head size %d)", n_heads,
                 lay->n_kv_heads, lay->head_dim);
        return FY_ERR_UNSUPPORTED;
    }
    int32_t nbw = 0; /* blocks of the longest sequence */
    for (int32_t s = 0; s < c->n_seqs; s++) {
        if (c->seqs[s].kv_len > c->seqs[s].n_blocks * lay->block_size) {
            fy_error("cpu backend: sequence %d has %d tokens but only %d blocks", s, c->seqs[s].kv_len,
                     c->seqs[s].n_blocks);
            return FY_ERR_INVALID;
        }
        int32_t nb = (c->seqs[s].kv_len + lay->block_size - 1) / lay->block_size;
        if (nb > nbw) nbw = nb;
    }
    if (fy_kv_dtype_scaled(lay->dtype) && lay->head_dim > c->res.head_dim) {
        fy_error("cpu backend: kv head size %d exceeds the reserved %d", lay->head_dim, c->res.head_dim);
        return FY_ERR_UNSUPPORTED;
    }
    /* fp8/int8 blocks are dequantized to f32 rows first; the vector tables
     * want whole 8-float chunks of a head */
    fy_dtype_t kd = fy_kv_dtype_scaled(lay->dtype) ? FY_DTYPE_F32 : lay->dtype;
    fy_attn_block_fn block = c->k->attn_block[kd];
    if (lay->head_dim % 8) block = fy_cpu_kernels_scalar.attn_block[kd];
    const int32_t n_kv = lay->n_kv_heads, G = n_heads / n_kv, spb = ATTN_SEG / lay->block_size;
    const bool h2o = c->scores != NULL;
    if (h2o && ((size_t)nbw * 2 * (size_t)G > c->h2o_rec_per || (size_t)nbw * (size_t)n_kv > c->h2o_rows_floats)) {
        fy_error("cpu backend: attention scores over %d blocks of %d heads exceed the reservation", nbw, n_heads);
        return FY_ERR_INVALID;
    }
    attn_job_t j = {.c = c,
                    .block = block,
                    .lay = lay,
                    .arena = arena,
                    .layer = layer,
                    .n_heads = n_heads,
                    .G = G,
                    .window = window,
                    .scale = scale,
                    .q = q,
                    .out = out};
    if (h2o) j.nbw = nbw, j.rows = c->h2o_rows, j.rec = c->h2o_rec, j.rec_per = c->h2o_rec_per;
    int64_t pairs = (int64_t)c->n_tokens * n_kv;
    if (c->n_threads > 1 && pairs < 4 * (int64_t)c->n_threads) {
        int64_t n_part = 0;
        c->ent_off[0] = 0;
        for (int32_t t = 0; t < c->n_tokens; t++)
            c->ent_off[t + 1] = c->ent_off[t] + n_kv * n_segs(window, tok_pos(c, t));
        n_part = c->ent_off[c->n_tokens];
        bool fits = (size_t)n_part * (size_t)G * (size_t)(lay->head_dim + 2) <= c->part_floats;
        if (h2o)
            fits = fits && (size_t)n_part * (size_t)spb * 2 * (size_t)G <= c->h2o_prec_floats &&
                   (size_t)pairs * (size_t)nbw <= c->h2o_rows_floats;
        if (fits) {
            j.ent_off = c->ent_off;
            j.part = c->part;
            if (h2o) j.prec = c->h2o_prec;
            fy_threadpool_run(c->tp, n_part, 1, attn_parts, &j);
            fy_threadpool_run(c->tp, pairs, 1, attn_reduce, &j);
            if (h2o) attn_scores_add(c, &j, 0, c->n_tokens);
            return FY_OK;
        }
    }
    /* prefill chunks (rows of several tokens per sequence): tiles, where
     * this table has the kernel; the same bits as the walk below */
    int32_t max_q = 0;
    for (int32_t s = 0; s < c->n_seqs; s++) max_q = c->seqs[s].n_q > max_q ? c->seqs[s].n_q : max_q;
    int64_t n_tiles = 0;
    if (!h2o && !c->attn_rows && max_q > 1 && c->k->attn_tile[kd] && lay->head_dim % 8 == 0 &&
        (size_t)2 * 32 * lay->head_dim + (size_t)TILE_ROWS * G * (4 + 2 * (size_t)lay->head_dim) <= c->tile_ws_per &&
        attn_tiles_plan(c, n_kv, &n_tiles)) {
        fy_threadpool_run(c->tp, n_tiles, 1, attn_tiles, &j);
        return FY_OK;
    }
    /* with scores, as many tokens per pass as their rows of masses fit */
    int32_t step = h2o ? (int32_t)(c->h2o_rows_floats / ((size_t)nbw * (size_t)n_kv)) : c->n_tokens;
    for (int32_t t0 = 0; t0 < c->n_tokens; t0 += step) {
        int32_t t1 = c->n_tokens - t0 < step ? c->n_tokens : t0 + step;
        int64_t items = (int64_t)(t1 - t0) * n_kv;
        int64_t chunk = items / (8 * (int64_t)c->n_threads); /* few claims; lengths differ, so not too few */
        j.t0 = t0;
        fy_threadpool_run(c->tp, items, chunk > 0 ? chunk : 1, attn_whole, &j);
        if (h2o) attn_scores_add(c, &j, t0, t1);
    }
    return FY_OK;
}

static fy_status_t cpu_sync(void *p) { return FY_OK; }

static const fy_backend_ops_t g_cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .reserve = cpu_reserve,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .mem_info = cpu_mem_info,
    .alloc_host = cpu_alloc, /* device memory is host memory */
    .free_host = cpu_free,
    .memcpy = cpu_memcpy,
    .upload = cpu_upload,
    .release_tensor = cpu_release_tensor,
    .copy_blocks = cpu_copy_blocks,
    .set_batch = cpu_set_batch,
    .embed = cpu_embed,
    .matmul = cpu_matmul,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .swiglu = cpu_swiglu,
    .add = cpu_add,
    .get_rows = cpu_get_rows,
    .kv_write = cpu_kv_write,
    .attention = cpu_attention,
    .sync = cpu_sync,
    .geglu = cpu_geglu,
    .add_bias = cpu_add_bias,
    .scale = cpu_scale,
    .set_attn_scores = cpu_set_attn_scores,
    .rmsnorm_matmul = cpu_rmsnorm_matmul,
};

fy_status_t fy_backend_cpu_init(const fy_backend_params_t *params, const fy_backend_ops_t **ops_p, void **ctx_p,
                                char *desc, size_t desc_cap, int *n_threads_p)
{
    const char *isa = params->isa && params->isa[0] ? params->isa : "auto";
    const fy_cpu_kernels_t *k = fy_cpu_kernels_pick(isa);
    if (!k) {
        bool known = !strcmp(isa, "avx2") || !strcmp(isa, "avxvnni") || !strcmp(isa, "avx512vnni");
        if (known) {
            fy_error("cpu backend: this machine cannot run the %s kernels", isa);
            return FY_ERR_UNSUPPORTED;
        }
        fy_error("cpu backend: unknown isa '%s' (auto, avx512vnni, avxvnni, avx2, scalar)", isa);
        return FY_ERR_INVALID;
    }
    int n = params->n_threads;
    if (n <= 0) n = fy_cpuset_usable(); /* the CPUs this process may run on (worker cpus, taskset, cgroups) */
    if (n > 256) {
        fy_error("cpu backend: %d threads is absurd (at most 256)", n);
        return FY_ERR_INVALID;
    }
    cpu_ctx_t *c = fy_calloc(1, sizeof(*c));
    if (!c) {
        fy_error("cpu backend: out of memory");
        return FY_ERR_NOMEM;
    }
    c->k = k;
    c->n_threads = n;
    c->no_repack = params->no_repack;
    const char *ak = getenv("FY_CPU_ATTN"); /* read once: the reference kernel for benchmarks */
    c->attn_rows = ak && !strcmp(ak, "rows");
    read_switches(c);
    const char *act = getenv("FY_CPU_ACT"); /* read once: q8 or q8x2, for measurements */
    c->act_x2 = act && *act ? !strcmp(act, "q8x2") : params->act_q8x2;
    c->attn_bf16 = ak && *ak ? !strcmp(ak, "bf16") : params->attn_bf16;
    c->attn_i8 = ak && !strcmp(ak, "int8") && k == &fy_cpu_kernels_avx512vnni; /* an experiment: env only */
    if (ak && !strcmp(ak, "int8") && !c->attn_i8)
        fy_info("cpu backend: no avx512vnni kernels here: int8 KV dequantized for attention as usual");
    if (c->attn_bf16 && (!fy_cpu_has_avx512bf16() || !k->attn_tile[FY_DTYPE_F32])) {
        fy_info("cpu backend: no avx512_bf16 (or tiles) here: f32 attention instead of bf16");
        c->attn_bf16 = false;
    }
    fy_status_t st = fy_threadpool_create(n, &c->tp);
    if (st != FY_OK) {
        cpu_destroy(c);
        return st;
    }
    snprintf(desc, desc_cap, "cpu/%s x%d%s%s%s", k->name, n,
             c->no_repack || !k->gemm_x8[FY_DTYPE_Q4_1] ? "" : ", packed",
             c->attn_bf16 ? ", bf16 attention"
             : c->attn_i8 ? ", int8 vnni decode attention"
                          : "",
             c->act_x2 ? ", two-pass activations" : "");
    *ops_p = &g_cpu_ops;
    *ctx_p = c;
    *n_threads_p = n;
    return FY_OK;
}

/*
 * bench_gpu.c - `ferry bench-gpu`: what a compute backend achieves on the
 * operations that bound serving, each against a device-to-device copy
 * measured in the same run by the same backend (fy_backend_memcpy,
 * FY_COPY_D2D, counting bytes read plus bytes written: the STREAM "copy"
 * convention).
 *
 *   copy      the reference bandwidth
 *   decode    a decode step of the runner at batch 1, 8, 64 (every
 *             sequence holding --ctx tokens): step time, and the bytes it
 *             must read (the weights as the file stores them, and each
 *             sequence's K/V) over that time, as bandwidth and as a
 *             fraction of the copy's
 *   attn      paged decode attention alone (fy_backend_attention, one
 *             layer, blocks scattered at random through the arena) at
 *             --attn-ctx contexts and --attn-batch sequences: K/V bytes
 *             read over time, against the copy
 *   matmul    prefill matrix products (fy_backend_matmul) over one layer's
 *             seven matrices at n = --matmul-n tokens, as stored and
 *             dequantized to bf16, in TFLOP/s
 *
 * Only the public backend and runner APIs are used, so it measures
 * whatever the backend does (where it keeps weights quantized or not).
 * --device cuda refuses to run without a usable GPU (no silent CPU
 * fallback); --device cpu measures the CPU backend (the GPU check's dry
 * run).  Times are host clocks around each call and a fy_backend_sync
 * (the runner's forward returns with its logits on the host), medians of
 * --reps after warm-up calls; inputs are random, never zeros.
 *
 * First run on a GPU (an H200) on 2026-11-28 by tools/gpu_check.sh;
 * figures in BENCHMARKS.md, raw output under bench/results/gpu/.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/backend.h"
#include "tools/cli.h"
#include "common/clock.h"
#include "tools/commands.h"
#include "engine/engine_config.h"
#include "kv/kv.h"
#include "common/log.h"
#include "common/mem.h"
#include "model/model.h"
#include "engine/runner.h"
#include "engine/sampler.h"
#include "bench/stats.h"

#define MAX_LIST 16
#define MAX_REPS 100

typedef struct gpu_opts {
    const char *device;
    int threads;
    int batches[MAX_LIST], n_batches;
    int ctx, steps, reps;
    int attn_ctx[MAX_LIST], n_attn_ctx, attn_batch;
    int matmul_n[MAX_LIST], n_matmul_n;
    long copy_mib;
    bool do_copy, do_decode, do_attn, do_matmul;
    bool profile; /* decode: where a step's time goes, by op */
} gpu_opts_t;

static fy_status_t make_backend(const gpu_opts_t *o, fy_backend_t **be_p)
{
    fy_backend_params_t bp = {.n_threads = o->threads, .isa = "auto"};
    return fy_backend_create(o->device, &bp, be_p);
}

/* n random values in [-1, 1) into device memory at dev (floats) */
static fy_status_t upload_random_f32(fy_backend_t *be, float *dev, size_t n, uint64_t seed)
{
    float *h = fy_malloc(n * sizeof(float));
    if (!h) return FY_ERR_NOMEM;
    fy_rng_t rng;
    fy_rng_seed(&rng, seed);
    for (size_t i = 0; i < n; i++) h[i] = (float)((double)(fy_rng_next(&rng) >> 11) * 0x1.0p-52 - 1.0);
    fy_status_t st = fy_backend_memcpy(be, dev, h, n * sizeof(float), FY_COPY_H2D);
    fy_free(h);
    return st;
}

static bool all_finite(fy_backend_t *be, const float *dev, size_t n)
{
    float *h = fy_malloc(n * sizeof(float));
    if (!h) return false;
    bool ok = fy_backend_memcpy(be, h, dev, n * sizeof(float), FY_COPY_D2H) == FY_OK && fy_backend_sync(be) == FY_OK;
    for (size_t i = 0; ok && i < n; i++) ok = isfinite(h[i]);
    fy_free(h);
    return ok;
}

/* ---- copy ------------------------------------------------------------------------------------ */

static fy_status_t bench_copy(const gpu_opts_t *o, double *bw_p)
{
    fy_backend_t *be = NULL;
    void *a = NULL, *b = NULL;
    size_t bytes = (size_t)o->copy_mib << 20;
    double t[MAX_REPS];
    fy_status_t st;
    if ((st = make_backend(o, &be))) return st;
    if ((st = fy_backend_alloc(be, bytes, &a)) || (st = fy_backend_alloc(be, bytes, &b))) goto out;
    if ((st = upload_random_f32(be, a, bytes / sizeof(float), 7))) goto out;
    for (int r = -2; r < o->reps; r++) { /* two warm-up copies */
        if ((st = fy_backend_sync(be))) goto out;
        double t0 = fy_now_s();
        if ((st = fy_backend_memcpy(be, b, a, bytes, FY_COPY_D2D)) || (st = fy_backend_sync(be))) goto out;
        if (r >= 0) t[r] = fy_now_s() - t0;
    }
    double med = median(t, o->reps);
    *bw_p = 2.0 * (double)bytes / med;
    printf("| copy | %ld MiB D2D | %.3f ms | %.1f GB/s (read + write) |\n\n", o->copy_mib, med * 1e3, *bw_p / 1e9);
out:
    fy_backend_free(be, a);
    fy_backend_free(be, b);
    fy_backend_destroy(be);
    return st;
}

/* ---- decode steps ------------------------------------------------------------------------------ */

static fy_status_t bench_decode(const gpu_opts_t *o, const fy_model_t *m, double copy_bw)
{
    const fy_model_config_t *c = fy_model_config(m);
    int maxB = 0;
    for (int i = 0; i < o->n_batches; i++)
        if (o->batches[i] > maxB) maxB = o->batches[i];
    /* every batch size runs 1 + 2 warm-up and 2 x `steps` timed steps on the first B sequences (with graphs
     * and without), and `steps` more profiled */
    int32_t extra = o->n_batches * ((o->profile ? 3 : 2) * o->steps + 3) + 1, cap = o->ctx + extra;
    if (cap > c->max_ctx) {
        fy_error("bench-gpu: --ctx %d plus %d decode steps is past the model's context of %d", o->ctx, extra,
                 c->max_ctx);
        return FY_ERR_INVALID;
    }
    fy_backend_t *probe = NULL;
    fy_engine_stack_t s = {0};
    fy_block_table_t *bt = fy_calloc((size_t)maxB, sizeof(*bt));
    int32_t *pos = fy_calloc((size_t)maxB, sizeof(int32_t)), *tok = fy_calloc((size_t)maxB + 512, sizeof(int32_t));
    fy_forward_seq_t *f = fy_calloc((size_t)maxB, sizeof(*f));
    float *logits = fy_malloc((size_t)maxB * (size_t)c->vocab_size * sizeof(float));
    double t[MAX_REPS + 100];
    fy_status_t st = FY_ERR_NOMEM;
    int n_init = 0;
    if (!bt || !pos || !tok || !f || !logits) goto out;
    /* a backend of its own measures what the stack takes of the device */
    int64_t total, free0 = 0, free1 = 0;
    if ((st = make_backend(o, &probe)) || (st = fy_backend_mem_info(probe, &total, &free0))) goto out;
    fy_engine_build_t eb;
    fy_engine_build_default(&eb);
    eb.device = o->device;
    eb.threads = o->threads;
    eb.prefix_caching = false;
    eb.no_engine = true;
    fy_runner_params_t *rp = &eb.runner;
    rp->max_batch_tokens = 512 > maxB ? 512 : maxB;
    rp->max_seqs = rp->max_logits = maxB;
    rp->max_ctx = cap;
    rp->n_kv_blocks = maxB * ((cap + rp->block_size - 1) / rp->block_size);
    if ((st = fy_engine_stack_create(m, &eb, &s))) goto out;
    if ((st = fy_backend_mem_info(probe, &total, &free1))) goto out;
    const fy_kv_layout_t *lay = fy_runner_kv_layout(s.runner);
    double arena = (double)rp->n_kv_blocks * (double)lay->block_bytes;
    double wbytes = (double)fy_model_weight_bytes_per_token(m), kv_tok = (double)fy_kv_bytes_per_token(lay);
    printf("decode: %s; backend %s; weights read per step as the file stores them %.1f MiB; KV arena %.1f MiB\n",
           c->name, fy_backend_describe(s.be), wbytes / 1048576.0, arena / 1048576.0);
    if (strcmp(o->device, "cpu")) /* the CPU backend's free memory is the system's, which other processes move */
        printf("the stack took %.1f MiB of device memory beyond its KV arena (weights as the backend holds them, "
               "and work buffers)\n",
               ((double)(free0 - free1) - arena) / 1048576.0);
    printf("\n");
    /* prompts: random ids, prefilled in chunks the runner takes */
    fy_rng_t rng;
    fy_rng_seed(&rng, 4321);
    double tp = fy_now_s();
    for (int b = 0; b < maxB; b++) {
        if ((st = fy_kvm_seq_init(s.kvm, &bt[b], cap, NULL))) goto out;
        n_init++;
        if ((st = fy_kvm_seq_reserve(s.kvm, &bt[b], cap, NULL))) goto out;
        for (int32_t p = 0; p < o->ctx; p += rp->max_batch_tokens) {
            int32_t n = o->ctx - p < rp->max_batch_tokens ? o->ctx - p : rp->max_batch_tokens;
            for (int32_t i = 0; i < n; i++) tok[i] = (int32_t)(fy_rng_next(&rng) % (uint64_t)c->vocab_size);
            fy_forward_seq_t pf = {&bt[b], tok, n, p, p + n == o->ctx ? 1 : 0, NULL};
            if ((st = fy_runner_forward(s.runner, &pf, 1, logits))) goto out;
        }
        pos[b] = o->ctx;
    }
    printf("prefill of %d sequences of %d tokens: %.2f s\n\n", maxB, o->ctx, fy_now_s() - tp);
    /* each batch size with recorded steps (CUDA graphs, the default) and
     * with every kernel launched directly; the first recorded step of a
     * bucket records it (a warm-up step) */
    printf(
        "| batch | step ms (median of %d) | tok/s | weight + KV bytes per step | GB/s | of copy | without graphs ms | "
        "graphs save |\n",
        o->steps);
    printf("|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    fy_backend_profile_t prof[MAX_LIST];
    for (int i = 0; i < o->n_batches; i++) {
        int B = o->batches[i];
        double kv_sum = 0, direct = 0;
        fy_runner_timing_t tm0, tm1;
        fy_runner_set_graphs(s.runner, 0);
        for (int k = -1; k < o->steps; k++) {
            for (int b = 0; b < B; b++) {
                tok[b] = (int32_t)(fy_rng_next(&rng) % (uint64_t)c->vocab_size);
                f[b] = (fy_forward_seq_t){&bt[b], &tok[b], 1, pos[b], 1, NULL};
            }
            double t0 = fy_now_s();
            if ((st = fy_runner_forward(s.runner, f, B, logits))) goto out;
            if (k >= 0) t[k] = fy_now_s() - t0;
            for (int b = 0; b < B; b++) pos[b]++;
        }
        direct = median(t, o->steps);
        fy_runner_set_graphs(s.runner, 1);
        if ((st = fy_runner_timing(s.runner, &tm0, 1, false))) goto out;
        for (int k = -2; k < o->steps; k++) {
            kv_sum = 0;
            for (int b = 0; b < B; b++) {
                tok[b] = (int32_t)(fy_rng_next(&rng) % (uint64_t)c->vocab_size);
                f[b] = (fy_forward_seq_t){&bt[b], &tok[b], 1, pos[b], 1, NULL};
                kv_sum += (double)(pos[b] + 1) * kv_tok;
            }
            double t0 = fy_now_s();
            if ((st = fy_runner_forward(s.runner, f, B, logits))) goto out;
            if (k >= 0) t[k] = fy_now_s() - t0;
            for (int b = 0; b < B; b++) pos[b]++;
        }
        for (size_t j = 0; j < (size_t)B * (size_t)c->vocab_size; j++)
            if (!isfinite(logits[j])) {
                fy_error("bench-gpu: batch %d: logit %zu is not finite", B, j);
                st = FY_ERR_INTERNAL;
                goto out;
            }
        if ((st = fy_runner_timing(s.runner, &tm1, 1, false))) goto out;
        double med = median(t, o->steps), bytes = wbytes + kv_sum; /* KV of the last step */
        char save[48] = "none recorded";
        if (tm1.graph_steps > tm0.graph_steps) snprintf(save, sizeof(save), "%.0f%%", 100.0 * (direct - med) / direct);
        printf("| %d | %.3f | %.1f | %.1f MiB | %.1f | %.0f%% | %.3f | %s |\n", B, med * 1e3, B / med,
               bytes / 1048576.0, bytes / med / 1e9, copy_bw > 0 ? 100.0 * bytes / med / copy_bw : 0, direct * 1e3,
               save);
        fflush(stdout);
        if (o->profile) { /* steps launched directly, each op synchronized and timed by the dispatch layer */
            fy_runner_set_graphs(s.runner, 0);
            fy_backend_profile_enable(s.be, true);
            for (int k = 0; k < o->steps; k++) {
                for (int b = 0; b < B; b++) {
                    tok[b] = (int32_t)(fy_rng_next(&rng) % (uint64_t)c->vocab_size);
                    f[b] = (fy_forward_seq_t){&bt[b], &tok[b], 1, pos[b], 1, NULL};
                }
                if ((st = fy_runner_forward(s.runner, f, B, logits))) goto out;
                for (int b = 0; b < B; b++) pos[b]++;
            }
            fy_backend_profile_get(s.be, &prof[i]);
            fy_backend_profile_enable(s.be, false);
            fy_runner_set_graphs(s.runner, 1);
        }
    }
    printf("\n");
    if (o->profile) {
        printf("decode step by op (--profile: each op synchronized and timed on the host, launch and wait included; "
               "ms per step, mean of %d steps without graphs; calls per step)\n\n| op |",
               o->steps);
        for (int i = 0; i < o->n_batches; i++) printf(" batch %d ms | calls |", o->batches[i]);
        printf("\n|---|");
        for (int i = 0; i < o->n_batches; i++) printf("---:|---:|");
        printf("\n");
        for (int op = 0; op < FY_OP_COUNT; op++) {
            bool any = false;
            for (int i = 0; i < o->n_batches; i++) any |= prof[i].calls[op] > 0;
            if (!any) continue;
            printf("| %s |", fy_backend_op_name((fy_backend_op_t)op));
            for (int i = 0; i < o->n_batches; i++)
                printf(" %.3f | %.0f |", (double)prof[i].ns[op] / 1e6 / o->steps, (double)prof[i].calls[op] / o->steps);
            printf("\n");
        }
        printf("\n");
    }
    st = FY_OK;
out:
    for (int b = 0; b < n_init; b++) {
        fy_kvm_seq_release(s.kvm, &bt[b]);
        fy_kvm_seq_deinit(&bt[b]);
    }
    fy_engine_stack_destroy(&s);
    fy_backend_destroy(probe);
    fy_free(bt), fy_free(pos), fy_free(tok), fy_free(f), fy_free(logits);
    return st;
}

/* ---- paged decode attention ------------------------------------------------------------------------ */

static fy_status_t bench_attn(const gpu_opts_t *o, const fy_model_config_t *c, double copy_bw)
{
    const int32_t bs = 16, B = o->attn_batch, n_heads = c->n_heads, hd = c->head_dim;
    int32_t max_ctx = 0;
    for (int i = 0; i < o->n_attn_ctx; i++)
        if (o->attn_ctx[i] > max_ctx) max_ctx = o->attn_ctx[i];
    int32_t nb_max = (max_ctx + bs - 1) / bs, n_blocks = B * nb_max;
    fy_kv_layout_t lay;
    fy_status_t st;
    if ((st = fy_kv_layout_init(&lay, 1, c->n_kv_heads, hd, bs, FY_DTYPE_F16))) return st;
    fy_backend_t *be = NULL;
    void *arena = NULL, *chunk = NULL;
    float *q = NULL, *out = NULL;
    int32_t *table = fy_malloc((size_t)n_blocks * sizeof(int32_t)),
            *perm = fy_malloc((size_t)n_blocks * sizeof(int32_t));
    int32_t *tokens = fy_calloc((size_t)B, sizeof(int32_t)), *posv = fy_calloc((size_t)B, sizeof(int32_t));
    int32_t *slots = fy_calloc((size_t)B, sizeof(int32_t));
    fy_attn_seq_t *seqs = fy_calloc((size_t)B, sizeof(*seqs));
    double t[MAX_REPS];
    size_t arena_bytes = (size_t)n_blocks * lay.block_bytes, chunk_bytes = (size_t)16 << 20;
    if (!table || !perm || !tokens || !posv || !slots || !seqs) {
        st = FY_ERR_NOMEM;
        goto out;
    }
    if ((st = make_backend(o, &be))) goto out;
    fy_backend_reserve_t r = {.max_tokens = B,
                              .max_row = n_heads * hd,
                              .max_seqs = B,
                              .max_blocks = n_blocks,
                              .n_groups = 1,
                              .max_kv_len = max_ctx,
                              .n_heads = n_heads,
                              .head_dim = hd};
    if ((st = fy_backend_reserve(be, &r))) goto out;
    if ((st = fy_backend_alloc(be, arena_bytes, &arena)) ||
        (st = fy_backend_alloc(be, (size_t)B * n_heads * hd * sizeof(float), (void **)&q)) ||
        (st = fy_backend_alloc(be, (size_t)B * n_heads * hd * sizeof(float), (void **)&out)))
        goto out;
    /* K/V: random f16 values in [-1, 1), a chunk written over the whole arena */
    if (chunk_bytes > arena_bytes) chunk_bytes = arena_bytes;
    if ((st = fy_backend_alloc_host(be, chunk_bytes, &chunk))) goto out;
    fy_rng_t rng;
    fy_rng_seed(&rng, 99);
    for (size_t i = 0; i < chunk_bytes / 2; i++)
        ((uint16_t *)chunk)[i] = fy_fp32_to_fp16((float)((double)(fy_rng_next(&rng) >> 11) * 0x1.0p-52 - 1.0));
    for (size_t off = 0; off < arena_bytes; off += chunk_bytes) {
        size_t n = arena_bytes - off < chunk_bytes ? arena_bytes - off : chunk_bytes;
        if ((st = fy_backend_memcpy(be, (char *)arena + off, chunk, n, FY_COPY_H2D))) goto out;
    }
    if ((st = upload_random_f32(be, q, (size_t)B * n_heads * hd, 5)) || (st = fy_backend_sync(be))) goto out;
    /* blocks scattered through the arena, as a pool hands them out after a while */
    for (int32_t i = 0; i < n_blocks; i++) perm[i] = i;
    for (int32_t i = n_blocks - 1; i > 0; i--) {
        int32_t j = (int32_t)(fy_rng_next(&rng) % (uint64_t)(i + 1)), x = perm[i];
        perm[i] = perm[j], perm[j] = x;
    }
    printf("attention: one layer, %d query heads, %d KV heads of %d, f16 K/V in %d-token blocks, batch %d\n\n", n_heads,
           c->n_kv_heads, hd, bs, B);
    printf("| context | ms (median of %d) | K/V bytes read | GB/s | of copy |\n", o->reps);
    printf("|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < o->n_attn_ctx; i++) {
        int32_t ctx = o->attn_ctx[i], nb = (ctx + bs - 1) / bs;
        for (int32_t s = 0; s < B; s++) {
            memcpy(table + (size_t)s * nb, perm + (size_t)s * nb, (size_t)nb * sizeof(int32_t));
            posv[s] = ctx - 1;
            slots[s] = table[(size_t)s * nb + (ctx - 1) / bs] * bs + (ctx - 1) % bs;
            seqs[s] = (fy_attn_seq_t){.q_start = s,
                                      .n_q = 1,
                                      .kv_len = ctx,
                                      .n_blocks = nb,
                                      .block_table = table + (size_t)s * nb,
                                      .group_stride = nb};
        }
        fy_batch_meta_t meta = {
            .n_tokens = B, .tokens = tokens, .pos = posv, .slots = slots, .n_seqs = B, .seqs = seqs, .n_groups = 1};
        if ((st = fy_backend_set_batch(be, &meta))) goto out;
        for (int k = -2; k < o->reps; k++) {
            if ((st = fy_backend_sync(be))) goto out;
            double t0 = fy_now_s();
            if ((st = fy_backend_attention(be, &lay, arena, 0, n_heads, 1.0f / sqrtf((float)hd), 0, q, out)) ||
                (st = fy_backend_sync(be)))
                goto out;
            if (k >= 0) t[k] = fy_now_s() - t0;
        }
        if (!all_finite(be, out, (size_t)B * n_heads * hd)) {
            fy_error("bench-gpu: attention at context %d gave values that are not finite", ctx);
            st = FY_ERR_INTERNAL;
            goto out;
        }
        double med = median(t, o->reps), bytes = (double)B * ctx * 2.0 * lay.kv_bytes / bs;
        printf("| %d | %.3f | %.1f MiB | %.1f | %.0f%% |\n", ctx, med * 1e3, bytes / 1048576.0, bytes / med / 1e9,
               copy_bw > 0 ? 100.0 * bytes / med / copy_bw : 0);
        fflush(stdout);
    }
    printf("\n");
out:
    fy_backend_free_host(be, chunk);
    fy_backend_free(be, arena), fy_backend_free(be, q), fy_backend_free(be, out);
    fy_backend_destroy(be);
    fy_free(table), fy_free(perm), fy_free(tokens), fy_free(posv), fy_free(slots), fy_free(seqs);
    return st;
}

/* ---- prefill matrix products -------------------------------------------------------------------- */

/* w as bf16 in host memory (*keep to free) */
static fy_status_t to_bf16(const fy_tensor_t *w, fy_tensor_t *out, void **keep)
{
    int64_t cols = w->ne[0], rows = w->ne[1];
    uint16_t *d = fy_malloc((size_t)(cols * rows) * sizeof(uint16_t));
    float *row = fy_malloc((size_t)cols * sizeof(float));
    if (!d || !row) {
        fy_free(d), fy_free(row);
        return FY_ERR_NOMEM;
    }
    for (int64_t r = 0; r < rows; r++) {
        fy_dequantize_row(w->dtype, (const char *)w->data + (size_t)r * w->row_bytes, row, cols);
        for (int64_t i = 0; i < cols; i++) d[r * cols + i] = fy_fp32_to_bf16(row[i]);
    }
    fy_free(row);
    *out = (fy_tensor_t){.dtype = FY_DTYPE_BF16,
                         .ne = {cols, rows},
                         .row_bytes = (size_t)cols * 2,
                         .nbytes = (size_t)(cols * rows) * 2,
                         .data = d};
    *keep = d;
    return FY_OK;
}

static fy_status_t bench_matmul(const gpu_opts_t *o, const fy_model_t *m)
{
    const fy_model_config_t *c = fy_model_config(m);
    const fy_layer_weights_t *L = &fy_model_weights(m)->layers[0];
    const fy_tensor_t *host[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    int32_t qdim = c->n_heads * c->head_dim, maxn = 0, widest = c->dim;
    if (qdim > widest) widest = qdim;
    if (c->ffn_dim > widest) widest = c->ffn_dim;
    for (int i = 0; i < o->n_matmul_n; i++)
        if (o->matmul_n[i] > maxn) maxn = o->matmul_n[i];
    fy_backend_t *be = NULL;
    fy_tensor_t dev[2][7];
    void *keep[7] = {0};
    int n_up[2] = {0, 0};
    float *x = NULL, *y[7] = {0};
    double t[MAX_REPS], flop_per_tok = 0, wbytes[2] = {0, 0};
    fy_status_t st;
    memset(dev, 0, sizeof(dev));
    if ((st = make_backend(o, &be))) return st;
    fy_backend_reserve_t r = {.max_tokens = maxn,
                              .max_row = widest,
                              .max_seqs = 1,
                              .max_blocks = 1,
                              .n_groups = 1,
                              .max_kv_len = 1,
                              .n_heads = c->n_heads,
                              .head_dim = c->head_dim};
    if ((st = fy_backend_reserve(be, &r))) goto out;
    for (int w = 0; w < 7; w++, n_up[0]++) {
        if ((st = fy_backend_upload(be, host[w], FY_USE_MATMUL, &dev[0][w]))) goto out;
        flop_per_tok += 2.0 * (double)host[w]->ne[0] * (double)host[w]->ne[1];
        wbytes[0] += (double)host[w]->nbytes;
        wbytes[1] += 2.0 * (double)host[w]->ne[0] * (double)host[w]->ne[1];
    }
    for (int w = 0; w < 7; w++, n_up[1]++) {
        fy_tensor_t b16;
        if ((st = to_bf16(host[w], &b16, &keep[w]))) goto out;
        if ((st = fy_backend_upload(be, &b16, FY_USE_MATMUL, &dev[1][w]))) goto out;
    }
    if ((st = fy_backend_alloc(be, (size_t)maxn * widest * sizeof(float), (void **)&x))) goto out;
    for (int w = 0; w < 7; w++)
        if ((st = fy_backend_alloc(be, (size_t)maxn * host[w]->ne[1] * sizeof(float), (void **)&y[w]))) goto out;
    if ((st = upload_random_f32(be, x, (size_t)maxn * widest, 11))) goto out;
    printf("matmul: layer 0's seven matrices (q, k, v, o, gate, up, down: %.1f M weights, %.1f MiB as stored) of %s, "
           "x of n tokens; four calls, as the runner groups them; weight GB/s: the weights' bytes (as stored or "
           "bf16) over the time\n\n",
           flop_per_tok / 2e6, wbytes[0] / 1048576.0, c->name);
    printf("| tokens | weights | ms (median of %d) | TFLOP/s | weight GB/s |\n", o->reps);
    printf("|---:|---|---:|---:|---:|\n");
    for (int i = 0; i < o->n_matmul_n; i++) {
        int32_t n = o->matmul_n[i];
        for (int v = 0; v < 2; v++) {
            const fy_tensor_t *d = dev[v];
            const fy_tensor_t *qkv[3] = {&d[0], &d[1], &d[2]}, *wo[1] = {&d[3]}, *gu[2] = {&d[4], &d[5]},
                              *dn[1] = {&d[6]};
            float *yqkv[3] = {y[0], y[1], y[2]}, *yo[1] = {y[3]}, *ygu[2] = {y[4], y[5]}, *ydn[1] = {y[6]};
            for (int k = -1; k < o->reps; k++) {
                if ((st = fy_backend_sync(be))) goto out;
                double t0 = fy_now_s();
                if ((st = fy_backend_matmul(be, 3, qkv, x, n, yqkv)) || (st = fy_backend_matmul(be, 1, wo, x, n, yo)) ||
                    (st = fy_backend_matmul(be, 2, gu, x, n, ygu)) || (st = fy_backend_matmul(be, 1, dn, x, n, ydn)) ||
                    (st = fy_backend_sync(be)))
                    goto out;
                if (k >= 0) t[k] = fy_now_s() - t0;
            }
            if (!all_finite(be, y[6], (size_t)n * host[6]->ne[1])) {
                fy_error("bench-gpu: matmul at %d tokens gave values that are not finite", n);
                st = FY_ERR_INTERNAL;
                goto out;
            }
            double med = median(t, o->reps);
            printf("| %d | %s | %.3f | %.2f | %.1f |\n", n, v ? "bf16" : "as stored", med * 1e3,
                   flop_per_tok * n / med / 1e12, wbytes[v] / med / 1e9);
            fflush(stdout);
        }
    }
    printf("\n");
out:
    fy_backend_free(be, x);
    for (int w = 0; w < 7; w++) fy_backend_free(be, y[w]), fy_free(keep[w]);
    for (int v = 0; v < 2; v++)
        for (int w = 0; w < n_up[v]; w++) fy_backend_release_tensor(be, &dev[v][w]);
    fy_backend_destroy(be);
    return st;
}

/* ---- the command ------------------------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ferry bench-gpu -m MODEL [--device cuda|cpu] [--only copy,decode,attn,matmul]\n"
            "                       [--batches 1,8,64] [--ctx 1024] [--steps 16] [--attn-ctx 4096,8192,16384,32768]\n"
            "                       [--attn-batch 64] [--matmul-n 512,1024,2048] [--copy-mib 1024] [--reps 10]\n"
            "                       [--profile] [--threads N]\n"
            "  a backend's decode steps, paged attention and prefill matmuls against its device-to-device copy\n"
            "  -m, --model PATH     the model whose shapes and weights are measured (a llama-shaped .gguf)\n"
            "      --device D       cuda (refused where no GPU can be used) or cpu (default cuda)\n"
            "      --only LIST      sections to run (default all; copy always runs: it is the reference)\n"
            "      --batches LIST   decode batch sizes\n"
            "      --ctx N          tokens each decoding sequence holds\n"
            "      --steps N        timed decode steps per batch size\n"
            "      --attn-ctx LIST  contexts of the attention section\n"
            "      --attn-batch N   sequences of the attention section\n"
            "      --matmul-n LIST  prefill tokens of the matmul section\n"
            "      --copy-mib N     bytes of the reference copy\n"
            "      --reps N         timed calls of copy, attention and matmul (median)\n"
            "      --profile        decode: also --steps steps without graphs, each op synchronized and timed\n"
            "  -t, --threads N      CPU threads (cpu device; default one per core)\n"
            "  -h, --help\n");
}

static bool parse_only(const char *s, gpu_opts_t *o)
{
    o->do_decode = o->do_attn = o->do_matmul = false;
    char buf[128];
    snprintf(buf, sizeof(buf), "%s", s);
    for (char *save = NULL, *p = strtok_r(buf, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
        if (!strcmp(p, "copy"))
            continue;
        else if (!strcmp(p, "decode"))
            o->do_decode = true;
        else if (!strcmp(p, "attn"))
            o->do_attn = true;
        else if (!strcmp(p, "matmul"))
            o->do_matmul = true;
        else {
            fprintf(stderr, "ferry bench-gpu: --only: unknown section '%s' (copy, decode, attn, matmul)\n", p);
            return false;
        }
    }
    return true;
}

int fy_cmd_bench_gpu(int argc, char **argv)
{
    enum {
        O_DEVICE = 256,
        O_ONLY,
        O_BATCHES,
        O_CTX,
        O_STEPS,
        O_ATTN_CTX,
        O_ATTN_BATCH,
        O_MATMUL_N,
        O_COPY,
        O_REPS,
        O_PROFILE
    };
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},
        {"device", required_argument, 0, O_DEVICE},
        {"only", required_argument, 0, O_ONLY},
        {"batches", required_argument, 0, O_BATCHES},
        {"ctx", required_argument, 0, O_CTX},
        {"steps", required_argument, 0, O_STEPS},
        {"attn-ctx", required_argument, 0, O_ATTN_CTX},
        {"attn-batch", required_argument, 0, O_ATTN_BATCH},
        {"matmul-n", required_argument, 0, O_MATMUL_N},
        {"copy-mib", required_argument, 0, O_COPY},
        {"reps", required_argument, 0, O_REPS},
        {"profile", no_argument, 0, O_PROFILE},
        {"threads", required_argument, 0, 't'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    gpu_opts_t o = {.device = "cuda",
                    .batches = {1, 8, 64},
                    .n_batches = 3,
                    .ctx = 1024,
                    .steps = 16,
                    .reps = 10,
                    .attn_ctx = {4096, 8192, 16384, 32768},
                    .n_attn_ctx = 4,
                    .attn_batch = 64,
                    .matmul_n = {512, 1024, 2048},
                    .n_matmul_n = 3,
                    .copy_mib = 1024,
                    .do_copy = true,
                    .do_decode = true,
                    .do_attn = true,
                    .do_matmul = true};
    const char *model = NULL;
    long v;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:t:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case O_DEVICE:
            if (strcmp(optarg, "cuda") && strcmp(optarg, "cpu")) {
                fprintf(stderr, "ferry bench-gpu: --device: '%s' is neither cuda nor cpu\n", optarg);
                return 2;
            }
            o.device = optarg;
            break;
        case O_ONLY:
            if (!parse_only(optarg, &o)) return 2;
            break;
        case O_BATCHES:
            if (!fy_cli_parse_int_list("--batches", optarg, 1, 1024, o.batches, MAX_LIST, &o.n_batches)) return 2;
            break;
        case O_CTX:
            if (!fy_cli_parse_int("--ctx", optarg, 1, 1 << 20, &v)) return 2;
            o.ctx = (int)v;
            break;
        case O_STEPS:
            if (!fy_cli_parse_int("--steps", optarg, 1, MAX_REPS, &v)) return 2;
            o.steps = (int)v;
            break;
        case O_ATTN_CTX:
            if (!fy_cli_parse_int_list("--attn-ctx", optarg, 1, 1 << 20, o.attn_ctx, MAX_LIST, &o.n_attn_ctx)) return 2;
            break;
        case O_ATTN_BATCH:
            if (!fy_cli_parse_int("--attn-batch", optarg, 1, 4096, &v)) return 2;
            o.attn_batch = (int)v;
            break;
        case O_MATMUL_N:
            if (!fy_cli_parse_int_list("--matmul-n", optarg, 1, 65536, o.matmul_n, MAX_LIST, &o.n_matmul_n)) return 2;
            break;
        case O_COPY:
            if (!fy_cli_parse_int("--copy-mib", optarg, 1, 1 << 20, &o.copy_mib)) return 2;
            break;
        case O_REPS:
            if (!fy_cli_parse_int("--reps", optarg, 1, MAX_REPS, &v)) return 2;
            o.reps = (int)v;
            break;
        case O_PROFILE: o.profile = true; break;
        case 't':
            if (!fy_cli_parse_int("--threads", optarg, 1, 256, &v)) return 2;
            o.threads = (int)v;
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!fy_cli_no_operands("bench-gpu", argc, argv, usage)) return 2;
    if (!model) {
        fprintf(stderr, "ferry bench-gpu: -m MODEL is required (tests/mkbench writes one: --shape llama3-8b)\n");
        usage(stderr);
        return 2;
    }
    char why[256] = "";
    if (!strcmp(o.device, "cuda") && !fy_backend_cuda_usable(why, sizeof(why))) {
        fprintf(stderr, "ferry bench-gpu: cuda is not usable here: %s (--device cpu measures the CPU backend)\n", why);
        return 1;
    }
    fy_model_t *m;
    if (fy_model_load(model, &m) != FY_OK) return 1;
    time_t now = time(NULL);
    char date[32];
    strftime(date, sizeof(date), "%Y-%m-%d %H:%M UTC", gmtime(&now));
    printf("ferry bench-gpu, %s, device %s\n\n", date, o.device);
    double copy_bw = 0;
    int rc = 0;
    if (bench_copy(&o, &copy_bw) != FY_OK) rc = 1;
    if (o.do_decode && bench_decode(&o, m, copy_bw) != FY_OK) rc = 1;
    if (o.do_attn && bench_attn(&o, fy_model_config(m), copy_bw) != FY_OK) rc = 1;
    if (o.do_matmul && bench_matmul(&o, m) != FY_OK) rc = 1;
    fy_model_destroy(m);
    if (rc) fprintf(stderr, "ferry bench-gpu: a section failed (above)\n");
    return rc;
}

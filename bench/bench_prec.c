/*
 * bench_prec.c - `ferry bench-prec`: where ferry's numerical error enters,
 * measured on the real model against an exact forward pass.
 *
 * The reference is a double-precision forward pass over the model's own
 * weights as the file holds them (each matrix dequantized exactly to f32,
 * every product and sum in double): RMSNorm, projections, rope with double
 * angles, attention with an exact softmax over unrounded K and V, the MLP
 * and the output head, written from the model's description (model.h), not
 * from the kernels.  It runs layer after layer over the whole text, keeps
 * the residual stream after each layer's attention and after its MLP, and
 * its logits.
 *
 * ferry then runs the same tokens teacher-forced in chunks, as a worker
 * would, once per configuration, each switching some approximations to
 * exact: f32 KV instead of f16; f32 activations (the matrices dequantized to
 * f32 at load: fy_runner_params_t.f32_weights) for one class of matmul at
 * a time instead of 8-bit ones; all of them.  For each it prints the
 * perplexity and its excess over the exact model's, the mean KL divergence
 * of its next-token distribution from the reference's, the relative error
 * of its logits, and the relative error ||x - x_ref|| / ||x_ref|| of the
 * residual stream after attention and after the MLP of chosen layers
 * (fy_runner_set_taps).  What the last row (every switch on) leaves is the
 * f32 arithmetic itself: norms, rope tables, attention's softmax and P.V,
 * the MLP's activation.
 *
 * CPU only; any architecture model.h describes; the reference costs about
 * 2 x parameters double multiply-adds per token (SmolLM2-135M, 512
 * tokens: about a minute on 2 cores).
 */
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "cli.h"
#include "commands.h"
#include "kv.h"
#include "log.h"
#include "mem.h"
#include "model.h"
#include "runner.h"
#include "tokenizer.h"

enum { MAX_THREADS = 64 };

static void usage(FILE *f)
{
    fprintf(f, "usage: ferry bench-prec -m FILE --text FILE [--tokens N] [--chunk N] [--threads N] [--layers LIST]\n"
               "  ferry's error against an exact double-precision forward pass over the same weights, with\n"
               "  each approximation (8-bit activations per matmul class, f16 KV) switched off in turn\n"
               "  -m, --model FILE   the model (GGUF or Hugging Face folder)\n"
               "  --text FILE        an English text (tests/data/gpl-3.0.txt); BOS is added\n"
               "  --tokens N         tokens of it, teacher-forced (default 512, at least 16)\n"
               "  --chunk N          tokens per forward pass of ferry (default 64)\n"
               "  --threads N        CPU threads, ferry's and the reference's (default 2)\n"
               "  --layers LIST      layers whose residual error is printed (default: first, middle, last)\n"
               "  -h, --help\n");
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- a parallel for over rows ---------------------------------------------------------- */

typedef void (*rows_fn)(void *arg, int64_t b, int64_t e);

typedef struct pf {
    rows_fn fn;
    void *arg;
    int64_t n;
    int idx, nt;
} pf_t;

static void *pf_main(void *p)
{
    pf_t *a = p;
    int64_t b = a->n * a->idx / a->nt, e = a->n * (a->idx + 1) / a->nt;
    if (e > b) a->fn(a->arg, b, e);
    return NULL;
}

static void par_for(int nt, int64_t n, rows_fn fn, void *arg)
{
    pthread_t th[MAX_THREADS];
    pf_t a[MAX_THREADS];
    int started = 0;
    for (int i = 0; i < nt; i++) a[i] = (pf_t){fn, arg, n, i, nt};
    for (int i = 1; i < nt; i++)
        if (pthread_create(&th[i], NULL, pf_main, &a[i]) == 0)
            started = i;
        else
            break;
    /* threads that did not start: their rows on this one */
    for (int i = started + 1; i < nt; i++) pf_main(&a[i]);
    pf_main(&a[0]);
    for (int i = 1; i <= started; i++) pthread_join(th[i], NULL);
}

/* ---- the reference ---------------------------------------------------------------------- */

typedef double v4d __attribute__((vector_size(32)));

typedef struct mm {
    const double *x; /* [n, in] */
    const float *w;  /* [rows, in] */
    double *y;       /* [n, rows] */
    int64_t n, in, rows;
} mm_t;

/* y[t][r] = x[t] . w[r] in double, 4 weight rows at a time (their values
 * transposed into doubles so each of 4 sums is one lane, added in order) */
static void mm_rows(void *arg, int64_t b, int64_t e)
{
    const mm_t *m = arg;
    int64_t in = m->in;
    v4d *wt = malloc((size_t)in * sizeof(v4d));
    if (!wt) abort();
    for (int64_t r = b * 4; r < e * 4 && r < m->rows; r += 4) {
        int64_t nr = m->rows - r < 4 ? m->rows - r : 4;
        for (int64_t i = 0; i < in; i++)
            for (int k = 0; k < 4; k++) wt[i][k] = k < nr ? (double)m->w[(r + k) * in + i] : 0.0;
        for (int64_t t = 0; t < m->n; t++) {
            const double *x = m->x + t * in;
            v4d acc0 = {0, 0, 0, 0}, acc1 = {0, 0, 0, 0};
            int64_t i = 0;
            for (; i + 1 < in; i += 2) {
                acc0 += x[i] * wt[i];
                acc1 += x[i + 1] * wt[i + 1];
            }
            for (; i < in; i++) acc0 += x[i] * wt[i];
            acc0 += acc1;
            for (int k = 0; k < nr; k++) m->y[t * m->rows + r + k] = acc0[k];
        }
    }
    free(wt);
}

typedef struct ref {
    const fy_model_t *m;
    const fy_model_config_t *c;
    int nt;
    float *wbuf; /* dequantized weights of one matrix */
} ref_t;

/* y = x W^T for n rows; W dequantized from the file. */
static void ref_matmul(ref_t *R, const fy_tensor_t *w, const double *x, int64_t n, double *y)
{
    int64_t in = w->ne[0], rows = w->ne[1];
    for (int64_t r = 0; r < rows; r++)
        fy_dequantize_row(w->dtype, (const char *)w->data + (size_t)r * w->row_bytes, R->wbuf + r * in, in);
    mm_t j = {x, R->wbuf, y, n, in, rows};
    par_for(R->nt, (rows + 3) / 4, mm_rows, &j);
}

static void ref_rmsnorm(const double *x, const fy_tensor_t *w, int64_t n, int64_t d, float eps, double *y)
{
    const float *g = w->data;
    for (int64_t t = 0; t < n; t++) {
        double ss = 0;
        for (int64_t i = 0; i < d; i++) ss += x[t * d + i] * x[t * d + i];
        double s = 1.0 / sqrt(ss / (double)d + (double)eps);
        for (int64_t i = 0; i < d; i++) y[t * d + i] = x[t * d + i] * s * (double)g[i];
    }
}

static void ref_bias(double *x, const fy_tensor_t *b, int64_t n)
{
    const float *v = b->data;
    for (int64_t t = 0; t < n; t++)
        for (int64_t i = 0; i < b->ne[0]; i++) x[t * b->ne[0] + i] += (double)v[i];
}

static void ref_rope(double *x, int64_t n, int32_t heads, int32_t hd, const fy_rope_t *rope)
{
    for (int64_t t = 0; t < n; t++)
        for (int32_t h = 0; h < heads; h++) {
            double *v = x + (t * heads + h) * hd;
            for (int32_t i = 0; i < hd / 2; i++) {
                double a = (double)t * fy_rope_inv_freq(rope, i, hd), cs = cos(a), sn = sin(a);
                int32_t p = rope->style == FY_ROPE_NORM ? 2 * i : i;
                int32_t q = rope->style == FY_ROPE_NORM ? 2 * i + 1 : i + hd / 2;
                double x0 = v[p], x1 = v[q];
                v[p] = x0 * cs - x1 * sn;
                v[q] = x0 * sn + x1 * cs;
            }
        }
}

typedef struct att {
    const double *q, *k, *v;
    double *out;
    int32_t nh, nkv, hd, window;
    double scale;
} att_t;

/* causal attention of query rows [b, e): exact softmax in double */
static void att_rows(void *arg, int64_t b, int64_t e)
{
    const att_t *a = arg;
    double *w = malloc((size_t)(e + 1) * sizeof(double));
    if (!w) abort();
    int32_t grp = a->nh / a->nkv;
    for (int64_t t = b; t < e; t++) {
        int64_t lo = a->window > 0 && t - a->window + 1 > 0 ? t - a->window + 1 : 0;
        for (int32_t h = 0; h < a->nh; h++) {
            const double *q = a->q + (t * a->nh + h) * a->hd;
            int32_t kh = h / grp;
            double mx = -INFINITY;
            for (int64_t j = lo; j <= t; j++) {
                const double *k = a->k + (j * a->nkv + kh) * a->hd;
                double s = 0;
                for (int32_t d = 0; d < a->hd; d++) s += q[d] * k[d];
                w[j] = s * a->scale;
                mx = w[j] > mx ? w[j] : mx;
            }
            double sum = 0;
            for (int64_t j = lo; j <= t; j++) sum += (w[j] = exp(w[j] - mx));
            double *o = a->out + (t * a->nh + h) * a->hd;
            for (int32_t d = 0; d < a->hd; d++) o[d] = 0;
            for (int64_t j = lo; j <= t; j++) {
                const double *v = a->v + (j * a->nkv + kh) * a->hd;
                double p = w[j] / sum;
                for (int32_t d = 0; d < a->hd; d++) o[d] += p * v[d];
            }
        }
    }
    free(w);
}

/* The exact forward pass over tok[0..n): the residual after each layer's
 * attention (tap_attn) and MLP (tap_mlp), [n_layers][n][dim] as floats, and
 * the logits [n][vocab] as floats.  Returns false when out of memory. */
static bool reference(const fy_model_t *m, int nt, const int32_t *tok, int64_t n, float *tap_attn, float *tap_mlp,
                      float *logits)
{
    const fy_model_config_t *c = fy_model_config(m);
    const fy_model_weights_t *W = fy_model_weights(m);
    const fy_arch_traits_t *a = &c->traits;
    int64_t d = c->dim, hd = c->head_dim, qd = (int64_t)c->n_heads * hd, kd = (int64_t)c->n_kv_heads * hd;
    int64_t f = c->ffn_dim, big = f > d ? f : d;
    big = big > qd ? big : qd;
    size_t wmax = (size_t)(c->vocab_size > f ? c->vocab_size : f) * (size_t)(big > d ? big : d);
    ref_t R = {m, c, nt, fy_malloc(wmax * sizeof(float))};
    double *x = fy_malloc((size_t)(n * d) * sizeof(double)), *h = fy_malloc((size_t)(n * big) * sizeof(double));
    double *q = fy_malloc((size_t)(n * qd) * sizeof(double)), *k = fy_malloc((size_t)(n * kd) * sizeof(double));
    double *v = fy_malloc((size_t)(n * kd) * sizeof(double)), *o = fy_malloc((size_t)(n * qd) * sizeof(double));
    double *g = fy_malloc((size_t)(n * f) * sizeof(double)), *u = fy_malloc((size_t)(n * f) * sizeof(double));
    enum { LB = 64 };
    double *lg = fy_malloc((size_t)LB * (size_t)c->vocab_size * sizeof(double));
    bool ok = R.wbuf && x && h && q && k && v && o && g && u && lg;
    if (!ok) goto out;
    /* embeddings */
    for (int64_t t = 0; t < n; t++) {
        fy_dequantize_row(W->tok_embd.dtype, (const char *)W->tok_embd.data + (size_t)tok[t] * W->tok_embd.row_bytes,
                          R.wbuf, d);
        for (int64_t i = 0; i < d; i++) x[t * d + i] = (double)R.wbuf[i] * (double)c->embed_scale;
    }
    for (int32_t l = 0; l < c->n_layers; l++) {
        const fy_layer_weights_t *L = &W->layers[l];
        const fy_layer_config_t *D = &c->layer[l];
        ref_rmsnorm(x, &L->attn_norm, n, d, c->norm_eps, h);
        ref_matmul(&R, &L->wq, h, n, q);
        ref_matmul(&R, &L->wk, h, n, k);
        ref_matmul(&R, &L->wv, h, n, v);
        if (a->qkv_bias) ref_bias(q, &L->bq, n), ref_bias(k, &L->bk, n), ref_bias(v, &L->bv, n);
        if (a->qk_norm) {
            ref_rmsnorm(q, &L->q_norm, n * c->n_heads, hd, c->norm_eps, q);
            ref_rmsnorm(k, &L->k_norm, n * c->n_kv_heads, hd, c->norm_eps, k);
        }
        ref_rope(q, n, c->n_heads, (int32_t)hd, &D->rope);
        ref_rope(k, n, c->n_kv_heads, (int32_t)hd, &D->rope);
        att_t at = {q, k, v, o, c->n_heads, c->n_kv_heads, (int32_t)hd, D->window, (double)c->attn_scale};
        par_for(nt, n, att_rows, &at);
        ref_matmul(&R, &L->wo, o, n, h);
        if (a->post_norms) ref_rmsnorm(h, &L->post_attn_norm, n, d, c->norm_eps, h);
        for (int64_t i = 0; i < n * d; i++) {
            x[i] += h[i];
            tap_attn[(size_t)l * (size_t)(n * d) + (size_t)i] = (float)x[i];
        }
        ref_rmsnorm(x, &L->ffn_norm, n, d, c->norm_eps, h);
        ref_matmul(&R, &L->w_gate, h, n, g);
        ref_matmul(&R, &L->w_up, h, n, u);
        for (int64_t i = 0; i < n * f; i++) {
            double z = g[i];
            if (a->act == FY_ACT_GELU_TANH)
                z = 0.5 * z * (1.0 + tanh(sqrt(2.0 / M_PI) * (z + 0.044715 * z * z * z)));
            else
                z = z / (1.0 + exp(-z));
            g[i] = z * u[i];
        }
        ref_matmul(&R, &L->w_down, g, n, h);
        if (a->post_norms) ref_rmsnorm(h, &L->post_ffn_norm, n, d, c->norm_eps, h);
        for (int64_t i = 0; i < n * d; i++) {
            x[i] += h[i];
            tap_mlp[(size_t)l * (size_t)(n * d) + (size_t)i] = (float)x[i];
        }
        fprintf(stderr, "\rreference: layer %d of %d", l + 1, c->n_layers);
    }
    fprintf(stderr, "\n");
    ref_rmsnorm(x, &W->out_norm, n, d, c->norm_eps, h);
    {
        const fy_tensor_t *w = &W->output;
        for (int64_t r = 0; r < w->ne[1]; r++)
            fy_dequantize_row(w->dtype, (const char *)w->data + (size_t)r * w->row_bytes, R.wbuf + r * d, d);
        for (int64_t t0 = 0; t0 < n; t0 += LB) {
            int64_t nb = n - t0 < LB ? n - t0 : LB;
            mm_t j = {h + t0 * d, R.wbuf, lg, nb, d, w->ne[1]};
            par_for(nt, (w->ne[1] + 3) / 4, mm_rows, &j);
            for (int64_t i = 0; i < nb * w->ne[1]; i++) logits[(size_t)(t0 * w->ne[1] + i)] = (float)lg[i];
        }
    }
out:
    fy_free(R.wbuf);
    double *bufs[] = {x, h, q, k, v, o, g, u, lg};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) fy_free(bufs[i]);
    return ok;
}

/* ---- comparisons ------------------------------------------------------------------------ */

/* log-softmax of row lg at index y, in double */
static double log_prob(const float *lg, int32_t vocab, int32_t y)
{
    float mx = lg[0];
    for (int32_t i = 1; i < vocab; i++) mx = lg[i] > mx ? lg[i] : mx;
    double s = 0;
    for (int32_t i = 0; i < vocab; i++) s += exp((double)lg[i] - (double)mx);
    return (double)lg[y] - (double)mx - log(s);
}

/* KL(p_ref || p) of two logit rows, in double */
static double kl_row(const float *ref, const float *got, int32_t vocab)
{
    double mr = ref[0], mg = got[0];
    for (int32_t i = 1; i < vocab; i++) {
        mr = ref[i] > mr ? ref[i] : mr;
        mg = got[i] > mg ? got[i] : mg;
    }
    double sr = 0, sg = 0;
    for (int32_t i = 0; i < vocab; i++) sr += exp(ref[i] - mr), sg += exp(got[i] - mg);
    double lr = log(sr), lgs = log(sg), kl = 0;
    for (int32_t i = 0; i < vocab; i++) {
        double a = ref[i] - mr - lr, b = got[i] - mg - lgs;
        kl += exp(a) * (a - b);
    }
    return kl;
}

static double rel_err(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)a[i] - (double)b[i];
        num += e * e;
        den += (double)b[i] * (double)b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

typedef struct conf {
    const char *name;
    fy_dtype_t kv;
    uint32_t f32;
} conf_t;

static const conf_t CONFS[] = {
    {"ferry (q8 activations, f16 KV)", FY_DTYPE_F16, 0},
    {"f32 KV", FY_DTYPE_F32, 0},
    {"f32 x: q, k, v", FY_DTYPE_F16, FY_RUNNER_F32_QKV},
    {"f32 x: o", FY_DTYPE_F16, FY_RUNNER_F32_O},
    {"f32 x: gate, up", FY_DTYPE_F16, FY_RUNNER_F32_GATE_UP},
    {"f32 x: down", FY_DTYPE_F16, FY_RUNNER_F32_DOWN},
    {"f32 x: output head", FY_DTYPE_F16, FY_RUNNER_F32_HEAD},
    {"f32 x: every matmul", FY_DTYPE_F16, FY_RUNNER_F32_ALL},
    {"f32 x: every matmul, f32 KV", FY_DTYPE_F32, FY_RUNNER_F32_ALL},
};

/* One configuration of ferry over tok[0..n) in chunks: its residual taps
 * ([n_layers][n][dim]) and logits ([n][vocab]). */
static fy_status_t ferry_run(const fy_model_t *m, fy_backend_t *be, const conf_t *cf, const int32_t *tok, int32_t n,
                             int32_t chunk, float *tap_attn, float *tap_mlp, float *logits, double *secs)
{
    const fy_model_config_t *c = fy_model_config(m);
    fy_runner_params_t rp;
    fy_runner_params_default(&rp);
    rp.max_batch_tokens = chunk;
    rp.max_seqs = 1;
    rp.max_logits = chunk;
    rp.max_ctx = n + 16;
    rp.n_kv_blocks = (n + rp.block_size) / rp.block_size + 1;
    rp.kv_dtype = cf->kv;
    rp.f32_weights = cf->f32;
    fy_runner_t *r = NULL;
    fy_kv_hasher_t *hs = NULL;
    fy_kvm_t *kvm = NULL;
    size_t d = (size_t)c->dim, L = (size_t)c->n_layers;
    float *ta = fy_malloc(L * (size_t)chunk * d * sizeof(float)), *tm = fy_malloc(L * (size_t)chunk * d * sizeof(float));
    fy_block_table_t bt;
    bool bt_init = false;
    fy_status_t st = ta && tm ? FY_OK : FY_ERR_NOMEM;
    if (st || (st = fy_runner_create(m, be, &rp, &r)) || (st = fy_kv_hasher_create_random(&hs))) goto out;
    fy_kvm_params_t kp;
    fy_runner_kvm_params(r, &kp);
    kp.hasher = hs;
    kp.prefix_caching = false;
    kp.watermark = 0;
    if ((st = fy_kvm_create(&kp, &kvm)) || (st = fy_kvm_seq_init(kvm, &bt, n + 1, NULL))) goto out;
    bt_init = true;
    fy_runner_set_taps(r, ta, tm);
    double t0 = now_s();
    for (int32_t done = 0; done < n;) {
        int32_t k = n - done < chunk ? n - done : chunk;
        if ((st = fy_kvm_seq_reserve(kvm, &bt, done + k, NULL))) break;
        fy_forward_seq_t fs = {&bt, tok + done, k, done, k, NULL};
        if ((st = fy_runner_forward(r, &fs, 1, logits + (size_t)done * (size_t)c->vocab_size))) break;
        for (size_t l = 0; l < L; l++) {
            memcpy(tap_attn + (l * (size_t)n + (size_t)done) * d, ta + l * (size_t)chunk * d, (size_t)k * d * 4);
            memcpy(tap_mlp + (l * (size_t)n + (size_t)done) * d, tm + l * (size_t)chunk * d, (size_t)k * d * 4);
        }
        done += k;
        fy_kvm_seq_commit(kvm, &bt, tok, done, NULL);
    }
    *secs = now_s() - t0;
    fy_kvm_seq_release(kvm, &bt);
out:
    if (bt_init) fy_kvm_seq_deinit(&bt);
    fy_kvm_destroy(kvm);
    fy_kv_hasher_destroy(hs);
    fy_runner_destroy(r);
    fy_free(ta);
    fy_free(tm);
    if (st) fy_error("bench-prec: the run '%s' failed: %s", cf->name, fy_status_str(st));
    return st;
}

static double ppl_of(const float *logits, const int32_t *tok, int32_t n, int32_t vocab)
{
    double s = 0;
    for (int32_t t = 0; t + 1 < n; t++) s -= log_prob(logits + (size_t)t * (size_t)vocab, vocab, tok[t + 1]);
    return exp(s / (n - 1));
}

int fy_cmd_bench_prec(int argc, char **argv)
{
    const char *model_path = NULL, *text_path = NULL;
    long n_tok = 512, chunk = 64, threads = 2;
    int layers[16], n_layers_arg = 0;
    enum { O_TEXT = 256, O_TOKENS, O_CHUNK, O_THREADS, O_LAYERS };
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},     {"text", required_argument, 0, O_TEXT},
        {"tokens", required_argument, 0, O_TOKENS}, {"chunk", required_argument, 0, O_CHUNK},
        {"threads", required_argument, 0, O_THREADS}, {"layers", required_argument, 0, O_LAYERS},
        {"help", no_argument, 0, 'h'},            {0, 0, 0, 0},
    };
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "m:h", opts, NULL)) != -1) {
        switch (opt) {
        case 'm': model_path = optarg; break;
        case O_TEXT: text_path = optarg; break;
        case O_TOKENS:
            if (!fy_cli_parse_int("--tokens", optarg, 16, 1 << 16, &n_tok)) return 2;
            break;
        case O_CHUNK:
            if (!fy_cli_parse_int("--chunk", optarg, 1, 4096, &chunk)) return 2;
            break;
        case O_THREADS:
            if (!fy_cli_parse_int("--threads", optarg, 1, MAX_THREADS, &threads)) return 2;
            break;
        case O_LAYERS:
            if (!fy_cli_parse_int_list("--layers", optarg, 0, 1 << 12, layers, 16, &n_layers_arg)) return 2;
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!fy_cli_no_operands("bench-prec", argc, argv, usage)) return 2;
    if (!model_path || !text_path) {
        fprintf(stderr, "ferry: bench-prec needs --model and --text\n");
        usage(stderr);
        return 2;
    }
    char *text = fy_cli_read_file(text_path);
    if (!text) return 1;
    size_t tlen = strlen(text), n_text = 0;
    fy_model_t *m = NULL;
    fy_backend_t *be = NULL;
    fy_backend_params_t bp = {.n_threads = (int)threads};
    int32_t *tok = NULL;
    float *ref_a = NULL, *ref_m = NULL, *ref_lg = NULL, *got_a = NULL, *got_m = NULL, *got_lg = NULL;
    int rc = 1;
    if (fy_model_load(model_path, &m) || fy_backend_create("cpu", &bp, &be)) goto out;
    const fy_model_config_t *c = fy_model_config(m);
    tok = fy_malloc((tlen + 2) * sizeof(int32_t));
    if (!tok || fy_tokenizer_encode(fy_model_tokenizer(m), text, tlen, true, false, tok, tlen + 2, &n_text)) goto out;
    if ((size_t)n_tok > n_text || n_tok + 16 > c->max_ctx) {
        fy_error("bench-prec: %s is %zu tokens and the model's context %d; --tokens %ld asks for more", text_path,
                 n_text, c->max_ctx, n_tok);
        goto out;
    }
    for (int i = 0; i < n_layers_arg; i++)
        if (layers[i] >= c->n_layers) {
            fy_error("bench-prec: --layers: layer %d of a %d-layer model", layers[i], c->n_layers);
            goto out;
        }
    if (!n_layers_arg) {
        layers[0] = 0, layers[1] = c->n_layers / 2, layers[2] = c->n_layers - 1;
        n_layers_arg = 3;
    }
    int32_t n = (int32_t)n_tok, V = c->vocab_size;
    size_t tap = (size_t)c->n_layers * (size_t)n * (size_t)c->dim, nl = (size_t)n * (size_t)V;
    ref_a = fy_malloc(tap * 4), ref_m = fy_malloc(tap * 4), ref_lg = fy_malloc(nl * 4);
    got_a = fy_malloc(tap * 4), got_m = fy_malloc(tap * 4), got_lg = fy_malloc(nl * 4);
    if (!ref_a || !ref_m || !ref_lg || !got_a || !got_m || !got_lg) {
        fy_error("bench-prec: out of memory for %d tokens", n);
        goto out;
    }
    printf("ferry bench-prec: %s, the first %d tokens of %s (BOS included), chunks of %ld, %ld threads, %s\n",
           c->name, n, text_path, chunk, threads, fy_backend_describe(be));
    double t0 = now_s();
    if (!reference(m, (int)threads, tok, n, ref_a, ref_m, ref_lg)) {
        fy_error("bench-prec: out of memory for the reference");
        goto out;
    }
    double ref_ppl = ppl_of(ref_lg, tok, n, V);
    printf("exact (double-precision forward, dequantized weights): perplexity %.4f (%.1f s)\n", ref_ppl,
           now_s() - t0);
    printf("\n%-32s %10s %8s %10s %9s", "configuration", "perplexity", "vs exact", "KL (nats)", "logit err");
    for (int i = 0; i < n_layers_arg; i++) printf("  L%-2d attn  L%-2d mlp", layers[i], layers[i]);
    printf(" %7s\n", "s");
    for (size_t ci = 0; ci < sizeof(CONFS) / sizeof(CONFS[0]); ci++) {
        double secs = 0;
        if (ferry_run(m, be, &CONFS[ci], tok, n, (int32_t)chunk, got_a, got_m, got_lg, &secs)) goto out;
        double p = ppl_of(got_lg, tok, n, V), kl = 0;
        for (int32_t t = 0; t + 1 < n; t++) kl += kl_row(ref_lg + (size_t)t * V, got_lg + (size_t)t * V, V);
        printf("%-32s %10.4f %+7.3f%% %10.2e %9.2e", CONFS[ci].name, p, 100 * (p / ref_ppl - 1), kl / (n - 1),
               rel_err(got_lg, ref_lg, nl));
        size_t ld = (size_t)n * (size_t)c->dim;
        for (int i = 0; i < n_layers_arg; i++)
            printf("  %8.2e %8.2e", rel_err(got_a + (size_t)layers[i] * ld, ref_a + (size_t)layers[i] * ld, ld),
                   rel_err(got_m + (size_t)layers[i] * ld, ref_m + (size_t)layers[i] * ld, ld));
        printf(" %7.1f\n", secs);
        fflush(stdout);
    }
    rc = 0;
out:
    fy_free(tok);
    fy_free(text);
    fy_free(ref_a), fy_free(ref_m), fy_free(ref_lg), fy_free(got_a), fy_free(got_m), fy_free(got_lg);
    fy_backend_destroy(be);
    fy_model_destroy(m);
    return rc;
}

/*
 * exact.c - the exact forward pass (exact.h).
 */
#include "engine/exact.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/mem.h"

enum { MAX_THREADS = 64 };

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
    int *fail;       /* set when a thread's buffer could not be had */
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
    if (!wt) {
        __atomic_store_n(m->fail, 1, __ATOMIC_RELAXED);
        return;
    }
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
    int nt;
    int fail;
    float *wbuf; /* dequantized weights of one matrix */
} ref_t;

/* y = x W^T for n rows; W dequantized from the file. */
static void ref_matmul(ref_t *R, const fy_tensor_t *w, const double *x, int64_t n, double *y)
{
    int64_t in = w->ne[0], rows = w->ne[1];
    for (int64_t r = 0; r < rows; r++)
        fy_dequantize_row(w->dtype, (const char *)w->data + (size_t)r * w->row_bytes, R->wbuf + r * in, in);
    mm_t j = {&R->fail, x, R->wbuf, y, n, in, rows};
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
    int *fail;
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
    if (!w) {
        __atomic_store_n(a->fail, 1, __ATOMIC_RELAXED);
        return;
    }
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

bool fy_exact_forward(const fy_model_t *m, int nt, const int32_t *tok, int64_t n, float *tap_attn, float *tap_mlp,
                      float *logits)
{
    const fy_model_config_t *c = fy_model_config(m);
    const fy_model_weights_t *W = fy_model_weights(m);
    const fy_arch_traits_t *a = &c->traits;
    int64_t d = c->dim, hd = c->head_dim, qd = (int64_t)c->n_heads * hd, kd = (int64_t)c->n_kv_heads * hd;
    int64_t f = c->ffn_dim, big = f > d ? f : d;
    big = big > qd ? big : qd;
    size_t wmax = (size_t)(c->vocab_size > f ? c->vocab_size : f) * (size_t)(big > d ? big : d);
    ref_t R = {nt < 1 ? 1 : nt > MAX_THREADS ? MAX_THREADS : nt, 0, fy_malloc(wmax * sizeof(float))};
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
        att_t at = {&R.fail, q, k, v, o, c->n_heads, c->n_kv_heads, (int32_t)hd, D->window, (double)c->attn_scale};
        par_for(R.nt, n, att_rows, &at);
        ref_matmul(&R, &L->wo, o, n, h);
        if (a->post_norms) ref_rmsnorm(h, &L->post_attn_norm, n, d, c->norm_eps, h);
        for (int64_t i = 0; i < n * d; i++) {
            x[i] += h[i];
            if (tap_attn) tap_attn[(size_t)l * (size_t)(n * d) + (size_t)i] = (float)x[i];
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
            if (tap_mlp) tap_mlp[(size_t)l * (size_t)(n * d) + (size_t)i] = (float)x[i];
        }
    }
    ref_rmsnorm(x, &W->out_norm, n, d, c->norm_eps, h);
    {
        const fy_tensor_t *w = &W->output;
        for (int64_t r = 0; r < w->ne[1]; r++)
            fy_dequantize_row(w->dtype, (const char *)w->data + (size_t)r * w->row_bytes, R.wbuf + r * d, d);
        for (int64_t t0 = 0; t0 < n; t0 += LB) {
            int64_t nb = n - t0 < LB ? n - t0 : LB;
            mm_t j = {&R.fail, h + t0 * d, R.wbuf, lg, nb, d, w->ne[1]};
            par_for(R.nt, (w->ne[1] + 3) / 4, mm_rows, &j);
            for (int64_t i = 0; i < nb * w->ne[1]; i++) logits[(size_t)(t0 * w->ne[1] + i)] = (float)lg[i];
        }
    }
    ok = !R.fail;
out:
    if (!ok) fy_error("exact forward pass: out of memory for %lld tokens", (long long)n);
    fy_free(R.wbuf);
    double *bufs[] = {x, h, q, k, v, o, g, u, lg};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) fy_free(bufs[i]);
    return ok;
}

/* ---- comparisons ------------------------------------------------------------------------ */

double fy_exact_log_prob(const float *lg, int32_t vocab, int32_t y)
{
    float mx = lg[0];
    for (int32_t i = 1; i < vocab; i++) mx = lg[i] > mx ? lg[i] : mx;
    double s = 0;
    for (int32_t i = 0; i < vocab; i++) s += exp((double)lg[i] - (double)mx);
    return (double)lg[y] - (double)mx - log(s);
}

double fy_exact_kl(const float *ref, const float *got, int32_t vocab)
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

double fy_exact_rel_err(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)a[i] - (double)b[i];
        num += e * e;
        den += (double)b[i] * (double)b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/*
 * runner.c - the forward pass over a batch, through the backend ops: one
 * function for every architecture, which reads the model's description
 * (model.h: the architecture's traits and each layer's window and rope)
 * instead of branching on the architecture's name.
 *
 *   x = embed(tokens) * embed_scale
 *   per layer:  h = rmsnorm(x);  q, k, v = h Wq (+ bq), h Wk (+ bk), h Wv (+ bv)
 *               [q, k = rmsnorm per head (q_norm, k_norm)];  rope(q, k) as the layer turns
 *               write k, v to the paged cache;  a = attention(q, cache, scale, the layer's window)
 *               o = a Wo [; o = rmsnorm(o, post_attn_norm)];  x += o
 *               h = rmsnorm(x);  m = (act(h Wgate) * h Wup) Wdown [; m = rmsnorm(m, post_ffn_norm)];  x += m
 *   logits = rmsnorm(x[rows wanted]) Wout
 *
 * Ranks (runner.h): a rank of a group computes its stage's layers with
 * its heads and its slice of the MLP; wq, wk, wv, w_gate, w_up (and the
 * biases) are row slices, views into the model's tensors.  wo and w_down
 * are row slices too: each rank gathers the whole attention output (or MLP
 * activation), computes its rows of the projection, and the rows are
 * gathered (fy_group_allgather: bytes copied, nothing summed), so every
 * element is computed as one rank computes it.  With tp_partial_sums they
 * are column slices, copied row by row into buffers the runner owns, and
 * the partial projections are added across the stage's ranks instead.
 * Either way before the post norms and the residual.  Stage 0 embeds,
 * each later stage receives x from the one before, and the last stage's
 * logit rows go back to rank 0 for the final norm and the head.  Rank 0
 * broadcasts each forward pass and block copy before running its own part
 * (encode_forward / decode_forward below: block tables travel as their
 * fields the kernels read), and the followers apply them in
 * fy_runner_follow.
 *
 * Not here: the kernels (kernels/), the weights' reading and the
 * description's making (model/model.c), the transport (group.c).
 */
#include "engine/runner.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "kv/kvplan.h"
#include "common/log.h"
#include "common/mem.h"

struct fy_runner {
    const fy_model_t *model;
    const fy_model_config_t *cfg;
    fy_backend_t *be;
    fy_runner_params_t p;
    int32_t n_layers;          /* layers run: the model's, or fewer for a self-draft */
    const fy_runner_t *shared; /* the runner whose device weights this one borrows, or NULL */
    size_t dropped;            /* bytes of the file's mapping dropped after their copy (fy_model_drop_host) */
    fy_backend_reserve_t res;  /* what this runner asked of the backend */
    fy_kv_layout_t kv;
    void *arena;         /* device: n_pages * kv.block_bytes */
    bool arena_borrowed; /* in params.kv_arenas: the caller's mapping */
    void *host_arena;    /* host tier: n_host_pages * kv.block_bytes */
    int32_t n_pages;     /* the pool's blocks: n_kv_blocks of every layer, n_groups pages each */
    int32_t n_host_pages;

    /* device copies of the weights */
    fy_tensor_t tok_embd, out_norm, output;
    fy_layer_weights_t *layers;

    /* device activations; T = max_batch_tokens, L = max_logits */
    float *x, *xb, *xb2; /* [T, dim] */
    float *q, *att;      /* [T, n_heads * head_dim] */
    float *k, *v;        /* [T, n_kv_heads * head_dim] */
    float *hb, *hb2;     /* [T, ffn_dim] (this rank's share of it) */
    float *attf, *hbf;   /* tp, gathered inputs: [T, n_heads * head_dim], [T, ffn_dim] of every rank */
    float *xl;           /* [L, dim] */
    float *logits;       /* [L, vocab] */

    /* host metadata for one batch */
    int32_t *tokens, *pos, *slots; /* [T] */
    int32_t *logit_rows;           /* [L] */
    float *scores;                 /* [max_seqs, scores_stride] H2O: one pass's attention mass per block */
    int32_t *pad_table;            /* [n_groups] of -1: the block table of a padding row (pad_batch) */
    bool graphs_failed;            /* a recording failed: decode steps run directly */
    int32_t scores_stride;         /* blocks per sequence at most */
    fy_attn_seq_t *seqs;           /* [max_seqs] */

    /* this rank's place and shard (one rank: tp = pp = 1, the whole model) */
    fy_group_t *group; /* NULL alone */
    int32_t tp, pp, rank, stage, tp_rank;
    int32_t layer0;                   /* the model's index of this stage's first layer */
    int32_t n_heads, n_kv_heads, ffn; /* this rank's query heads, KV heads, MLP width */
    void **owned;                     /* [2 * n_layers] host copies of the wo and w_down column slices */
    bool gather;                      /* tp > 1 without partial sums: gather inputs, split output rows */
    bool has_head;                    /* final norm and output head uploaded (rank 0) */
    bool broken;                      /* rank 0: a rank failed; every later call fails */
    int32_t n_forwards;
    fy_runner_timing_t tm;
    /* precision measurements: f32 copies of the weights params.f32_weights
     * names, and the residual taps (fy_runner_set_taps) */
    float **f32_copies;
    int32_t n_f32_copies;
    float *tap_attn, *tap_mlp;
    /* commands: rank 0 encodes into cmd, followers decode into the rest */
    size_t cmd_cap;           /* bytes */
    int32_t *cmd;             /* [cmd_cap / 4] */
    fy_block_table_t *f_bt;   /* [max_seqs] */
    int32_t *f_blocks;        /* [max_seqs][n_groups][blocks_per_seq] */
    int32_t *f_lo;            /* [max_seqs][n_groups] */
    int32_t *f_tokens;        /* [T] */
    int32_t *f_ids;           /* [2 * max_copy] a block copy's ids */
    fy_forward_seq_t *f_seqs; /* [max_seqs] */
    int32_t blocks_per_seq;   /* ceil(max_ctx / block_size) */
};

/* Commands rank 0 broadcasts, as int32 words: [type, ...]. */
enum { CMD_FORWARD = 1, CMD_COPY, CMD_TIMING };
#define CMD_FORWARD_HEAD 2 /* type, n_seqs */
#define CMD_SEQ_HEAD 5     /* n_tokens, pos, n_logits, n_groups, n_blocks; then lo[n_groups], blocks, tokens */
#define CMD_COPY_HEAD 4    /* type, dst tier, src tier, n; then dst[n], src[n] */

/* ---- shapes ---- */

/* One rank's share of the model. */
typedef struct shard {
    int32_t tp, pp, stage, tp_rank;
    int32_t l0, l1;         /* the stage's layers [l0, l1) */
    int32_t n_heads, head0; /* query heads [head0, head0 + n_heads) */
    int32_t n_kv_heads, kv_head0;
    int32_t ffn, ffn0; /* MLP columns [ffn0, ffn0 + ffn) */
    int32_t dim, dim0; /* gathering: rows [dim0, dim0 + dim) of the o- and down-projections */
    bool gather;
} shard_t;

static int32_t ranks_or_one(int32_t n) { return n > 1 ? n : 1; }

/* The layers of stage s of pp over n: as even as possible, the first
 * n % pp stages one more. */
static void stage_layers(int32_t n, int32_t pp, int32_t s, int32_t *l0_p, int32_t *l1_p)
{
    int32_t count = 0;
    (void)fy_kv_pp_layers(n, pp, s, l0_p, &count); /* ferry plan's split; pp <= n checked by the caller */
    *l1_p = *l0_p + count;
}
/* Is the column range [c0, c0 + w) of t on whole blocks of its dtype? */
static bool columns_aligned(const fy_tensor_t *t, int64_t c0, int64_t w)
{
    int be = fy_dtype_info(t->dtype)->block_elems;
    return c0 % be == 0 && w % be == 0;
}

static fy_status_t shard_of(const fy_model_t *m, const fy_runner_params_t *p, int32_t rank, bool log, shard_t *s_p)
{
    const fy_model_config_t *c = fy_model_config(m);
    shard_t s = {.tp = ranks_or_one(p->tp), .pp = ranks_or_one(p->pp)};
    if (s.tp > 64 || s.pp > 64 || s.tp * s.pp > 64) {
        if (log) fy_error("runner: tp %d x pp %d ranks (at most 64)", s.tp, s.pp);
        return FY_ERR_INVALID;
    }
    if (c->n_heads % s.tp) {
        if (log) fy_error("runner: tp %d does not divide the model's %d attention heads", s.tp, c->n_heads);
        return FY_ERR_INVALID;
    }
    if (c->n_kv_heads % s.tp && s.tp % c->n_kv_heads) {
        if (log)
            fy_error("runner: tp %d neither divides the model's %d KV heads nor is a multiple of them", s.tp,
                     c->n_kv_heads);
        return FY_ERR_INVALID;
    }
    if (c->ffn_dim % s.tp) {
        if (log) fy_error("runner: tp %d does not divide the MLP's width %d", s.tp, c->ffn_dim);
        return FY_ERR_INVALID;
    }
    if (c->n_layers < s.pp) {
        if (log) fy_error("runner: pp %d stages for a model of %d layers", s.pp, c->n_layers);
        return FY_ERR_INVALID;
    }
    s.stage = rank / s.tp;
    s.tp_rank = rank % s.tp;
    stage_layers(c->n_layers, s.pp, s.stage, &s.l0, &s.l1);
    /* the heads (split, or with fewer KV heads than ranks the one KV head
     * its query heads read): ferry plan's split, checked above */
    if (fy_kv_tp_heads(c->n_heads, c->n_kv_heads, s.tp, s.tp_rank, &s.head0, &s.n_heads, &s.kv_head0, &s.n_kv_heads))
        return FY_ERR_INVALID;
    s.ffn = c->ffn_dim / s.tp;
    s.ffn0 = s.tp_rank * s.ffn;
    s.gather = s.tp > 1 && !p->tp_partial_sums;
    s.dim = s.gather ? c->dim / s.tp : c->dim;
    s.dim0 = s.gather ? s.tp_rank * s.dim : 0;
    if (s.gather && c->dim % s.tp) {
        if (log) fy_error("runner: tp %d does not divide the model's width %d", s.tp, c->dim);
        return FY_ERR_INVALID;
    }
    if (s.tp > 1 && !s.gather) { /* every rank's column slices on whole quantization blocks, in every layer */
        const fy_model_weights_t *w = fy_model_weights(m);
        int64_t qw = (int64_t)s.n_heads * c->head_dim;
        for (int32_t l = 0; l < c->n_layers; l++) {
            const fy_layer_weights_t *L = &w->layers[l];
            const fy_tensor_t *t[2] = {&L->wo, &L->w_down};
            const char *name[2] = {"attn_output", "ffn_down"};
            int64_t width[2] = {qw, s.ffn};
            for (int i = 0; i < 2; i++) {
                if (columns_aligned(t[i], 0, width[i])) continue;
                if (log)
                    fy_error("runner: tp %d: layer %d's %s (%s, %d-element blocks) would split into slices of %lld "
                             "columns",
                             s.tp, l, name[i], fy_dtype_name(t[i]->dtype), fy_dtype_info(t[i]->dtype)->block_elems,
                             (long long)width[i]);
                return FY_ERR_INVALID;
            }
        }
    }
    *s_p = s;
    return FY_OK;
}

fy_status_t fy_runner_check_shape(const fy_model_t *m, const fy_runner_params_t *p)
{
    shard_t s;
    return shard_of(m, p, 0, true, &s);
}

/* The layout of stage (or the first n_layers layers of the model, a
 * self-draft's, when pp is 1) with n_kv_heads heads; groups by window
 * unless one_group. */
static fy_status_t stage_layout(const fy_model_t *m, int32_t l0, int32_t l1, int32_t n_kv_heads,
                                const fy_runner_params_t *p, bool one_group, fy_kv_layout_t *lay)
{
    const fy_model_config_t *c = fy_model_config(m);
    int32_t win[FY_KV_MAX_LAYERS]; /* KV groups by window: sliding layers give blocks back */
    for (int32_t l = l0; l < l1 && l - l0 < FY_KV_MAX_LAYERS; l++) win[l - l0] = c->layer[l].window;
    return fy_kv_layout_make(lay, l1 - l0, n_kv_heads, c->head_dim, p->block_size, p->kv_dtype, one_group ? NULL : win);
}

static bool same_grouping(const fy_kv_layout_t *a, const fy_kv_layout_t *b)
{
    if (a->n_groups != b->n_groups) return false;
    for (int32_t g = 0; g < a->n_groups; g++)
        if (a->group_window[g] != b->group_window[g]) return false;
    return true;
}

/* The layout of rank's shard: its stage's layers, its KV heads.  Every
 * stage must group alike (rank 0's block tables serve them all): where the
 * stages' windows would group differently, every stage takes one group. */
static fy_status_t rank_layout(const fy_model_t *m, const fy_runner_params_t *p, const shard_t *s,
                               fy_kv_layout_t *lay_p)
{
    bool one = p->kv_one_group;
    fy_status_t st;
    if (s->pp > 1 && !one) {
        fy_kv_layout_t *a = fy_calloc(2, sizeof(*a));
        if (!a) return FY_ERR_NOMEM;
        for (int32_t st2 = 0; st2 < s->pp && !one; st2++) {
            int32_t l0, l1;
            stage_layers(fy_model_config(m)->n_layers, s->pp, st2, &l0, &l1);
            if ((st = stage_layout(m, l0, l1, s->n_kv_heads, p, false, &a[st2 ? 1 : 0]))) {
                fy_free(a);
                return st;
            }
            if (st2 && !same_grouping(&a[0], &a[1])) one = true;
        }
        fy_free(a);
    }
    return stage_layout(m, s->l0, s->l1, s->n_kv_heads, p, one, lay_p);
}

void fy_runner_params_default(fy_runner_params_t *p)
{
    *p = (fy_runner_params_t){
        .max_batch_tokens = 512,
        .max_seqs = 64,
        .max_logits = 64,
        .max_ctx = 0,
        .n_kv_blocks = 0,
        .kv_mem_fraction = 0.9,
        .block_size = 16,
        .kv_dtype = FY_DTYPE_F16,
        .graphs = 1,
    };
}

const fy_kv_layout_t *fy_runner_kv_layout(const fy_runner_t *r) { return &r->kv; }
void fy_runner_set_graphs(fy_runner_t *r, int32_t graphs) { r->p.graphs = graphs; }
void fy_runner_set_taps(fy_runner_t *r, float *attn, float *mlp)
{
    r->tap_attn = attn;
    r->tap_mlp = mlp;
    if (attn || mlp) r->p.graphs = 0; /* a recorded step cannot sync and copy between its ops */
}
const fy_runner_params_t *fy_runner_params(const fy_runner_t *r) { return &r->p; }
const fy_model_t *fy_runner_model(const fy_runner_t *r) { return r->model; }
void *fy_runner_kv_arena(fy_runner_t *r) { return r->arena; }

/* Block copies within this rank's arenas. */
static fy_status_t copy_local(fy_runner_t *r, fy_kv_tier_t dst_tier, const int32_t *dst, fy_kv_tier_t src_tier,
                              const int32_t *src, int32_t n)
{
    void *da = dst_tier == FY_KV_DEVICE ? r->arena : r->host_arena;
    void *sa = src_tier == FY_KV_DEVICE ? r->arena : r->host_arena;
    fy_copy_kind_t kind = dst_tier == FY_KV_DEVICE ? (src_tier == FY_KV_DEVICE ? FY_COPY_D2D : FY_COPY_H2D)
                                                   : (src_tier == FY_KV_DEVICE ? FY_COPY_D2H : FY_COPY_H2H);
    return fy_backend_copy_blocks(r->be, &r->kv, da, sa, dst, src, n, kind);
}

/* ---- rank 0's side of a command: post it, run its own part, collect every rank's status ---- */

static fy_status_t lead_post(fy_runner_t *r, size_t words, const char *what)
{
    if (r->broken || fy_group_broken(r->group)) {
        r->broken = true;
        fy_error("runner: %s refused: the rank group is broken", what);
        return FY_ERR_PEER;
    }
    fy_status_t st = fy_group_post_cmd(r->group, r->cmd, words * sizeof(int32_t));
    if (st != FY_OK) {
        fy_error("runner: %s: posting to the rank group failed: %s", what, fy_status_str(st));
        r->broken = true;
    }
    return st;
}

static fy_status_t lead_done(fy_runner_t *r, fy_status_t mine, const char *what)
{
    if (mine != FY_OK && !fy_group_broken(r->group)) /* the others may wait on a collective of ours */
        fy_group_abort(r->group, "rank 0 failed its part");
    int32_t bad = -1;
    fy_status_t st = fy_group_done(r->group, mine, &bad);
    if (mine != FY_OK) {
        r->broken = true;
        return mine;
    }
    if (st != FY_OK) {
        if (bad > 0)
            fy_error("runner: rank %d failed %s: %s; the rank group is out of service", bad, what, fy_status_str(st));
        else
            fy_error("runner: the rank group failed during %s: %s; it is out of service", what, fy_status_str(st));
        r->broken = true;
    }
    return st;
}

/* fy_kv_copy_fn over the runner's arenas; rank 0 of a group has every
 * rank copy the same blocks in its own arenas */
static fy_status_t kv_copy(void *arg, fy_kv_tier_t dst_tier, const int32_t *dst, fy_kv_tier_t src_tier,
                           const int32_t *src, int32_t n)
{
    fy_runner_t *r = arg;
    if (!r->group) return copy_local(r, dst_tier, dst, src_tier, src, n);
    int32_t most = (int32_t)((r->cmd_cap / sizeof(int32_t) - CMD_COPY_HEAD) / 2);
    for (int32_t i = 0; i < n; i += most) {
        int32_t k = n - i < most ? n - i : most;
        int32_t *w = r->cmd;
        w[0] = CMD_COPY;
        w[1] = (int32_t)dst_tier;
        w[2] = (int32_t)src_tier;
        w[3] = k;
        memcpy(w + CMD_COPY_HEAD, dst + i, (size_t)k * sizeof(int32_t));
        memcpy(w + CMD_COPY_HEAD + k, src + i, (size_t)k * sizeof(int32_t));
        fy_status_t st = lead_post(r, CMD_COPY_HEAD + 2 * (size_t)k, "a kv block copy");
        if (st != FY_OK) return st;
        st = lead_done(r, copy_local(r, dst_tier, dst + i, src_tier, src + i, k), "a kv block copy");
        if (st != FY_OK) return st;
    }
    return FY_OK;
}

fy_status_t fy_runner_layout_for(const fy_model_t *model, int32_t n_layers, const fy_runner_params_t *p,
                                 fy_kv_layout_t *lay_p)
{
    const fy_model_config_t *c = fy_model_config(model);
    fy_kv_layout_t lay;
    fy_status_t st;
    if (n_layers < 1 || n_layers > c->n_layers) {
        fy_error("runner: a kv layout of %d layers for a model of %d", n_layers, c->n_layers);
        return FY_ERR_INVALID;
    }
    if (ranks_or_one(p->tp) * ranks_or_one(p->pp) > 1) { /* rank 0's shard */
        shard_t s;
        if ((st = shard_of(model, p, 0, true, &s)) || (st = rank_layout(model, p, &s, &lay))) return st;
    } else if ((st = stage_layout(model, 0, n_layers, c->n_kv_heads, p, p->kv_one_group, &lay))) {
        return st;
    }
    *lay_p = lay;
    return FY_OK;
}

int32_t fy_runner_pool_blocks(const fy_model_t *model, int32_t n_layers, const fy_runner_params_t *p, int64_t tokens,
                              int32_t requests, int32_t step, float watermark)
{
    fy_kv_layout_t lay;
    if (fy_runner_layout_for(model, n_layers > 0 ? n_layers : fy_model_config(model)->n_layers, p, &lay)) return -1;
    return fy_kv_pool_blocks(&lay, tokens, requests, step, watermark);
}

void fy_runner_kvm_params(fy_runner_t *r, fy_kvm_params_t *p)
{
    *p = (fy_kvm_params_t){
        .layout = r->kv,
        .n_device_blocks = r->n_pages,
        .n_host_blocks = r->n_host_pages,
        .host_arena = r->host_arena,
        .copy = kv_copy,
        .copy_arg = r,
        .prefix_caching = true,
        .watermark = FY_KVM_WATERMARK,
        .max_step_tokens = r->p.max_batch_tokens,
        .n_ranks = fy_runner_n_ranks(r),
    };
}

static fy_status_t dev_alloc(fy_runner_t *r, size_t n_floats, float **p)
{
    return fy_backend_alloc(r->be, n_floats * sizeof(float), (void **)p);
}

/* Rows [r0, r0 + n) of a matrix: a view of the same memory. */
static fy_tensor_t row_slice(const fy_tensor_t *t, int64_t r0, int64_t n)
{
    fy_tensor_t v = *t;
    v.data = (const uint8_t *)t->data + (size_t)r0 * t->row_bytes;
    v.ne[1] = n;
    v.nbytes = (size_t)n * t->row_bytes;
    return v;
}

/* Elements [e0, e0 + n) of a vector (a bias): a view. */
static fy_status_t elem_slice(const fy_tensor_t *t, int64_t e0, int64_t n, fy_tensor_t *v_p)
{
    size_t off, bytes;
    if (fy_dtype_row_bytes(t->dtype, e0, &off) || fy_dtype_row_bytes(t->dtype, n, &bytes)) return FY_ERR_INVALID;
    fy_tensor_t v = *t;
    v.data = (const uint8_t *)t->data + off;
    v.ne[0] = n;
    v.row_bytes = v.nbytes = bytes;
    *v_p = v;
    return FY_OK;
}

/* Columns [c0, c0 + n) of every row of a matrix (whole quantization
 * blocks, checked by shard_of), copied into *buf_p (the caller's to free). */
static fy_status_t col_slice(const fy_tensor_t *t, int64_t c0, int64_t n, void **buf_p, fy_tensor_t *v_p)
{
    size_t off, bytes, all;
    if (fy_dtype_row_bytes(t->dtype, c0, &off) || fy_dtype_row_bytes(t->dtype, n, &bytes) ||
        !fy_mul_size(bytes, (size_t)t->ne[1], &all))
        return FY_ERR_INVALID;
    uint8_t *buf = fy_malloc(all ? all : 1);
    if (!buf) return FY_ERR_NOMEM;
    for (int64_t i = 0; i < t->ne[1]; i++)
        memcpy(buf + (size_t)i * bytes, (const uint8_t *)t->data + (size_t)i * t->row_bytes + off, bytes);
    fy_tensor_t v = *t;
    v.data = buf;
    v.ne[0] = n;
    v.row_bytes = bytes;
    v.nbytes = all;
    *buf_p = buf;
    *v_p = v;
    return FY_OK;
}

/* This rank's part of one layer's weights, in host memory. */
static fy_status_t layer_shard(fy_runner_t *r, const shard_t *S, const fy_layer_weights_t *src, void **owned,
                               fy_layer_weights_t *h)
{
    *h = *src;
    if (S->tp == 1) return FY_OK;
    const int64_t hd = r->cfg->head_dim, q0 = S->head0 * hd, nq = S->n_heads * hd, k0 = S->kv_head0 * hd,
                  nk = S->n_kv_heads * hd;
    fy_status_t st;
    h->wq = row_slice(&src->wq, q0, nq);
    h->wk = row_slice(&src->wk, k0, nk);
    h->wv = row_slice(&src->wv, k0, nk);
    h->w_gate = row_slice(&src->w_gate, S->ffn0, S->ffn);
    h->w_up = row_slice(&src->w_up, S->ffn0, S->ffn);
    if (src->bq.data && ((st = elem_slice(&src->bq, q0, nq, &h->bq)) || (st = elem_slice(&src->bk, k0, nk, &h->bk)) ||
                         (st = elem_slice(&src->bv, k0, nk, &h->bv))))
        return st;
    if (S->gather) { /* rows of the outputs, over the gathered inputs */
        h->wo = row_slice(&src->wo, S->dim0, S->dim);
        h->w_down = row_slice(&src->w_down, S->dim0, S->dim);
        return FY_OK;
    }
    if ((st = col_slice(&src->wo, q0, nq, &owned[0], &h->wo)) ||
        (st = col_slice(&src->w_down, S->ffn0, S->ffn, &owned[1], &h->w_down)))
        return st;
    return FY_OK;
}

/* A matmul weight, through an f32 copy of its values when params.f32_weights
 * names its class (cls): its matmuls then take f32 activations. */
static fy_status_t upload_matmul(fy_runner_t *r, const fy_tensor_t *host, uint32_t cls, fy_tensor_t *dev)
{
    if (!(r->p.f32_weights & cls) || host->dtype == FY_DTYPE_F32)
        return fy_backend_upload(r->be, host, FY_USE_MATMUL, dev);
    size_t n = (size_t)host->ne[0] * (size_t)host->ne[1];
    float *f = fy_malloc(n * sizeof(float));
    if (!f) return FY_ERR_NOMEM;
    r->f32_copies[r->n_f32_copies++] = f;
    for (int64_t i = 0; i < host->ne[1]; i++)
        fy_dequantize_row(host->dtype, (const char *)host->data + (size_t)i * host->row_bytes,
                          f + (size_t)i * (size_t)host->ne[0], host->ne[0]);
    fy_tensor_t t = {.dtype = FY_DTYPE_F32,
                     .ne = {host->ne[0], host->ne[1]},
                     .row_bytes = (size_t)host->ne[0] * sizeof(float),
                     .nbytes = n * sizeof(float),
                     .data = f};
    return fy_backend_upload(r->be, &t, FY_USE_MATMUL, dev);
}

static fy_status_t upload_weights(fy_runner_t *r, const shard_t *S)
{
    const fy_model_weights_t *w = fy_model_weights(r->model);
    fy_status_t st;
    if (r->shared) { /* a self-draft: the target's device tensors, first layers only */
        r->tok_embd = r->shared->tok_embd;
        r->out_norm = r->shared->out_norm;
        r->output = r->shared->output;
        r->layers = r->shared->layers;
        r->has_head = true;
        return FY_OK;
    }
    r->layers = fy_calloc((size_t)r->n_layers, sizeof(*r->layers));
    r->owned = fy_calloc(2 * (size_t)r->n_layers, sizeof(*r->owned));
    r->f32_copies = fy_calloc(7 * (size_t)r->n_layers + 1, sizeof(*r->f32_copies));
    if (!r->layers || !r->owned || !r->f32_copies) return FY_ERR_NOMEM;
    /* stage 0 embeds; rank 0 alone applies the final norm and the head */
    if (S->stage == 0 && (st = fy_backend_upload(r->be, &w->tok_embd, FY_USE_ROWS, &r->tok_embd))) return st;
    if (r->rank == 0) {
        if ((st = fy_backend_upload(r->be, &w->out_norm, FY_USE_VECTOR, &r->out_norm)) ||
            (st = upload_matmul(r, &w->output, FY_RUNNER_F32_HEAD, &r->output)))
            return st;
        if (r->output.data != w->output.data) r->dropped += fy_model_drop_host(r->model, &w->output);
        r->has_head = true;
    }
    for (int32_t l = 0; l < r->n_layers; l++) {
        fy_layer_weights_t hw;
        if ((st = layer_shard(r, S, &w->layers[r->layer0 + l], &r->owned[2 * l], &hw))) return st;
        const fy_layer_weights_t *src = &hw;
        fy_layer_weights_t *dst = &r->layers[l];
        const fy_tensor_t *s[] = {&src->attn_norm,    &src->wq,     &src->wk,     &src->wv,     &src->wo,
                                  &src->ffn_norm,     &src->w_gate, &src->w_up,   &src->w_down, &src->bq,
                                  &src->bk,           &src->bv,     &src->q_norm, &src->k_norm, &src->post_attn_norm,
                                  &src->post_ffn_norm};
        fy_tensor_t *d[] = {&dst->attn_norm,    &dst->wq,     &dst->wk,     &dst->wv,     &dst->wo,
                            &dst->ffn_norm,     &dst->w_gate, &dst->w_up,   &dst->w_down, &dst->bq,
                            &dst->bk,           &dst->bv,     &dst->q_norm, &dst->k_norm, &dst->post_attn_norm,
                            &dst->post_ffn_norm};
        const uint32_t cls[] = {0, FY_RUNNER_F32_QKV,     FY_RUNNER_F32_QKV,     FY_RUNNER_F32_QKV, FY_RUNNER_F32_O,
                                0, FY_RUNNER_F32_GATE_UP, FY_RUNNER_F32_GATE_UP, FY_RUNNER_F32_DOWN};
        for (size_t i = 0; i < FY_ARRAY_LEN(s); i++) {
            if (!s[i]->data) continue; /* a tensor this architecture has not */
            fy_tensor_use_t use = s[i]->ne[1] == 1 ? FY_USE_VECTOR : FY_USE_MATMUL;
            if ((st = use == FY_USE_MATMUL && i < FY_ARRAY_LEN(cls) ? upload_matmul(r, s[i], cls[i], d[i])
                                                                    : fy_backend_upload(r->be, s[i], use, d[i])))
                return st;
            /* copied (packed, dequantized, or to a device): the mapping's pages go (model.h) */
            if (d[i]->data != s[i]->data) r->dropped += fy_model_drop_host(r->model, s[i]);
        }
    }
    return FY_OK;
}

/* Words of the command area for runners of p whose layout has n_groups
 * groups: the largest forward pass (every sequence at the context limit),
 * or a block copy's chunk. */
static size_t cmd_words(const fy_runner_params_t *p, int32_t n_groups)
{
    size_t bps = (size_t)((p->max_ctx + p->block_size - 1) / p->block_size), seqs = (size_t)p->max_seqs,
           g = (size_t)n_groups;
    size_t w = CMD_FORWARD_HEAD + seqs * (CMD_SEQ_HEAD + g) + seqs * g * bps + (size_t)p->max_batch_tokens;
    return w < 1024 ? 1024 : w;
}

/* The bytes of a block of every layer of the largest stage: a kv_mem
 * budget sized by it gives every rank the same block count. */
static fy_status_t largest_block(const fy_model_t *m, const fy_runner_params_t *p, size_t *bytes_p)
{
    shard_t s;
    fy_kv_layout_t *lay = fy_calloc(1, sizeof(*lay));
    fy_status_t st = lay ? FY_OK : FY_ERR_NOMEM;
    size_t most = 0;
    int32_t tp = ranks_or_one(p->tp);
    for (int32_t stage = 0; st == FY_OK && stage < ranks_or_one(p->pp); stage++) {
        if ((st = shard_of(m, p, stage * tp, false, &s)) || (st = rank_layout(m, p, &s, lay))) break;
        size_t b = lay->block_bytes * (size_t)lay->n_groups;
        if (b > most) most = b;
    }
    fy_free(lay);
    if (st == FY_OK) *bytes_p = most;
    return st;
}

fy_status_t fy_runner_group_arena_bytes(const fy_model_t *m, const fy_runner_params_t *p, size_t *bytes_p)
{
    size_t largest;
    fy_status_t st = largest_block(m, p, &largest);
    if (st != FY_OK) return st;
    int64_t blocks = p->n_kv_blocks > 0 ? p->n_kv_blocks : p->kv_mem / (int64_t)largest;
    size_t bytes;
    if (blocks < 1 || !fy_mul_size((size_t)blocks, largest, &bytes)) {
        fy_error("runner: a group's kv arenas of %lld blocks of %zu bytes: none, or too many", (long long)blocks,
                 largest);
        return FY_ERR_INVALID;
    }
    *bytes_p = (bytes + 4095) & ~(size_t)4095;
    return FY_OK;
}

fy_status_t fy_runner_group_params(const fy_model_t *m, const fy_runner_params_t *params, fy_group_params_t *gp_p)
{
    const fy_model_config_t *c = fy_model_config(m);
    fy_runner_params_t p = *params;
    if (p.max_ctx <= 0 || p.max_ctx > c->max_ctx) p.max_ctx = c->max_ctx;
    if (p.max_batch_tokens < 1 || p.max_batch_tokens > (1 << 20) || p.max_seqs < 1 || p.block_size < 1) {
        fy_error("runner: bad parameters for a rank group (batch %d tokens, %d sequences)", p.max_batch_tokens,
                 p.max_seqs);
        return FY_ERR_INVALID;
    }
    fy_kv_layout_t *lay = fy_calloc(1, sizeof(*lay));
    if (!lay) return FY_ERR_NOMEM;
    fy_status_t st = fy_runner_layout_for(m, c->n_layers, &p, lay);
    int32_t n_groups = lay->n_groups;
    fy_free(lay);
    if (st != FY_OK) return st;
    size_t widest = (size_t)c->dim; /* x between stages, a reduction; gathering also the inputs */
    if (ranks_or_one(p.tp) > 1 && !p.tp_partial_sums) {
        if ((size_t)c->ffn_dim > widest) widest = (size_t)c->ffn_dim;
        if ((size_t)c->n_heads * (size_t)c->head_dim > widest) widest = (size_t)c->n_heads * (size_t)c->head_dim;
    }
    size_t slot = (size_t)p.max_batch_tokens * widest * sizeof(float);
    if (slot < sizeof(fy_runner_timing_t)) slot = sizeof(fy_runner_timing_t);
    *gp_p = (fy_group_params_t){
        .n_ranks = ranks_or_one(p.tp) * ranks_or_one(p.pp),
        .slot_bytes = slot,
        .cmd_bytes = cmd_words(&p, n_groups) * sizeof(int32_t),
    };
    return FY_OK;
}

/* Rank 0 hears every other rank's pool and refuses unequal ones; the
 * others tell it theirs. */
static fy_status_t compare_pools(fy_runner_t *r)
{
    int32_t mine[2] = {r->n_pages, r->n_host_pages}, theirs[2];
    fy_status_t st;
    int32_t n = fy_group_size(r->group);
    if (r->rank != 0) {
        if ((st = fy_group_send(r->group, 0, mine, sizeof(mine))))
            fy_error("runner: rank %d: telling rank 0 its pool failed: %s", r->rank, fy_status_str(st));
        return st;
    }
    for (int32_t k = 1; k < n; k++) {
        if ((st = fy_group_recv(r->group, k, theirs, sizeof(theirs)))) {
            fy_error("runner: hearing rank %d's pool failed: %s", k, fy_status_str(st));
            return st;
        }
        if (theirs[0] != mine[0] || theirs[1] != mine[1]) {
            fy_error("runner: unequal kv pools: rank 0 has %d device and %d host blocks, rank %d %d and %d (one "
                     "shard would run out first)",
                     mine[0], mine[1], k, theirs[0], theirs[1]);
            return FY_ERR_MISMATCH;
        }
    }
    return FY_OK;
}

static fy_status_t runner_create(const fy_model_t *model, fy_backend_t *be, const fy_runner_params_t *params,
                                 int32_t n_layers, const fy_runner_t *shared, const fy_backend_reserve_t *also,
                                 fy_group_t *group, fy_runner_t **runner_p)
{
    const fy_model_config_t *c = fy_model_config(model);
    fy_runner_params_t p = *params;
    if (p.max_ctx <= 0 || p.max_ctx > c->max_ctx) p.max_ctx = c->max_ctx;
    if (p.max_batch_tokens < 1 || p.max_batch_tokens > (1 << 20) || p.max_seqs < 1 || p.max_seqs > p.max_batch_tokens ||
        p.max_logits < 1 || p.max_logits > p.max_batch_tokens || p.n_kv_blocks < 0 || p.n_host_blocks < 0 ||
        p.kv_mem < 0 || (p.n_kv_blocks == 0 && p.kv_mem == 0 && !(p.kv_mem_fraction > 0 && p.kv_mem_fraction <= 1))) {
        fy_error("runner: bad parameters (batch %d tokens, %d sequences, %d logit rows, %d kv blocks)",
                 p.max_batch_tokens, p.max_seqs, p.max_logits, p.n_kv_blocks);
        return FY_ERR_INVALID;
    }
    int32_t n_ranks = ranks_or_one(p.tp) * ranks_or_one(p.pp), rank = group ? fy_group_rank(group) : 0;
    if ((group ? fy_group_size(group) : 1) != n_ranks) {
        fy_error("runner: tp %d x pp %d ranks in a group of %d", ranks_or_one(p.tp), ranks_or_one(p.pp),
                 group ? fy_group_size(group) : 1);
        return FY_ERR_INVALID;
    }
    if (group && p.n_kv_blocks == 0 && p.kv_mem == 0) {
        fy_error("runner: a rank group needs a kv block count or a kv_mem budget (ranks sizing from the memory each "
                 "finds free could get unequal pools)");
        return FY_ERR_INVALID;
    }
    if (p.f32_weights & ~(uint32_t)FY_RUNNER_F32_ALL || (p.f32_weights && (n_ranks > 1 || shared))) {
        fy_error("runner: f32_weights 0x%x: unknown classes, or with ranks or a self-draft", p.f32_weights);
        return FY_ERR_INVALID;
    }
    shard_t S;
    fy_status_t st = shard_of(model, &p, rank, true, &S);
    if (st != FY_OK) return st;
    if (n_ranks > 1) n_layers = S.l1 - S.l0;
    fy_runner_t *r = fy_calloc(1, sizeof(*r));
    if (!r) {
        fy_error("runner: out of memory");
        return FY_ERR_NOMEM;
    }
    r->model = model;
    r->cfg = c;
    r->be = be;
    r->p = p;
    r->n_layers = n_layers;
    r->shared = shared;
    r->group = group;
    r->tp = S.tp;
    r->pp = S.pp;
    r->rank = rank;
    r->stage = S.stage;
    r->tp_rank = S.tp_rank;
    r->layer0 = S.l0;
    r->n_heads = S.n_heads;
    r->n_kv_heads = S.n_kv_heads;
    r->ffn = S.ffn;
    r->gather = S.gather;
    if (n_ranks > 1)
        st = rank_layout(model, &p, &S, &r->kv);
    else
        st = fy_runner_layout_for(model, n_layers, &p, &r->kv);
    if (st != FY_OK) goto fail;

    if ((st = upload_weights(r, &S))) goto fail;
    if (r->dropped)
        fy_debug("runner: %.1f MiB of the model file's mapping released (the backend holds its own copy)",
                 (double)r->dropped / (1 << 20));
    /* activations and the backend's scratch before the KV arena, which may
     * be sized from the memory left free */
    size_t T = (size_t)p.max_batch_tokens, L = (size_t)p.max_logits;
    size_t qd = (size_t)r->n_heads * c->head_dim, kvd = (size_t)r->n_kv_heads * c->head_dim, ffn = (size_t)r->ffn;
    if ((st = dev_alloc(r, T * c->dim, &r->x)) || (st = dev_alloc(r, T * c->dim, &r->xb)) ||
        (st = dev_alloc(r, T * c->dim, &r->xb2)) || (st = dev_alloc(r, T * qd, &r->q)) ||
        (st = dev_alloc(r, T * qd, &r->att)) || (st = dev_alloc(r, T * kvd, &r->k)) ||
        (st = dev_alloc(r, T * kvd, &r->v)) || (st = dev_alloc(r, T * ffn, &r->hb)) ||
        (st = dev_alloc(r, T * ffn, &r->hb2)) || (st = dev_alloc(r, L * c->dim, &r->xl)) ||
        (r->has_head && (st = dev_alloc(r, L * c->vocab_size, &r->logits))) ||
        (r->gather && ((st = dev_alloc(r, T * (size_t)c->n_heads * c->head_dim, &r->attf)) ||
                       (st = dev_alloc(r, T * c->ffn_dim, &r->hbf)))))
        goto fail;

    r->tokens = fy_calloc(T, sizeof(int32_t));
    r->pos = fy_calloc(T, sizeof(int32_t));
    r->slots = fy_calloc(T * (size_t)r->kv.n_groups, sizeof(int32_t));
    r->logit_rows = fy_calloc(L, sizeof(int32_t));
    r->scores_stride = (p.max_ctx + p.block_size - 1) / p.block_size;
    r->scores = fy_calloc((size_t)p.max_seqs * (size_t)r->scores_stride, sizeof(float));
    r->seqs = fy_calloc((size_t)p.max_seqs, sizeof(fy_attn_seq_t));
    r->pad_table = fy_malloc((size_t)r->kv.n_groups * sizeof(int32_t));
    if (!r->tokens || !r->pos || !r->slots || !r->logit_rows || !r->seqs || !r->scores || !r->pad_table) {
        fy_error("runner: out of memory for batch metadata");
        st = FY_ERR_NOMEM;
        goto fail;
    }
    for (int32_t g = 0; g < r->kv.n_groups; g++) r->pad_table[g] = -1;
    r->blocks_per_seq = (p.max_ctx + p.block_size - 1) / p.block_size;
    if (group) { /* the command area's copy (rank 0) or what a command decodes into (the others) */
        size_t ng = (size_t)r->kv.n_groups, bps = (size_t)r->blocks_per_seq, seqs = (size_t)p.max_seqs;
        r->cmd_cap = cmd_words(&p, r->kv.n_groups) * sizeof(int32_t);
        r->cmd = fy_malloc(r->cmd_cap);
        r->f_bt = fy_calloc(seqs, sizeof(*r->f_bt));
        r->f_blocks = fy_calloc(seqs * ng * bps, sizeof(int32_t));
        r->f_lo = fy_calloc(seqs * ng, sizeof(int32_t));
        r->f_tokens = fy_calloc(T, sizeof(int32_t));
        r->f_ids = fy_calloc(r->cmd_cap / sizeof(int32_t), sizeof(int32_t));
        r->f_seqs = fy_calloc(seqs, sizeof(*r->f_seqs));
        if (!r->cmd || !r->f_bt || !r->f_blocks || !r->f_lo || !r->f_tokens || !r->f_ids || !r->f_seqs) {
            fy_error("runner: out of memory for the rank group's commands");
            st = FY_ERR_NOMEM;
            goto fail;
        }
    }
    int32_t max_row = c->dim;
    if (r->ffn > max_row) max_row = r->ffn;
    if ((int32_t)qd > max_row) max_row = (int32_t)qd;
    if (r->gather && c->ffn_dim > max_row) max_row = c->ffn_dim; /* the gathered inputs */
    if (r->gather && c->n_heads * c->head_dim > max_row) max_row = c->n_heads * c->head_dim;
    int32_t blocks_per_seq = r->blocks_per_seq;
    fy_backend_reserve_t res = {
        .max_tokens = p.max_batch_tokens,
        .max_row = max_row,
        .max_seqs = p.max_seqs,
        .max_blocks = p.max_seqs * blocks_per_seq * r->kv.n_groups,
        .n_groups = r->kv.n_groups,
        .max_kv_len = p.max_ctx,
        .n_heads = r->n_heads,
        .head_dim = c->head_dim,
        .n_kv_heads = r->n_kv_heads,
    };
    r->res = res;
    if (also) { /* two runners on one backend: its buffers must fit either */
#define RES_MAX(f)                                                                                                     \
    if (also->f > res.f) res.f = also->f
        RES_MAX(max_tokens);
        RES_MAX(max_row);
        RES_MAX(max_seqs);
        RES_MAX(max_blocks);
        RES_MAX(n_groups);
        RES_MAX(max_kv_len);
        RES_MAX(n_heads);
        RES_MAX(head_dim);
        RES_MAX(n_kv_heads);
#undef RES_MAX
    }
    if ((st = fy_backend_reserve(be, &res))) goto fail;
    if (p.n_kv_blocks == 0) {
        /* sized from a byte budget, or from what the weights left free */
        int64_t budget = p.kv_mem, total, avail;
        if (!budget) {
            if ((st = fy_backend_mem_info(be, &total, &avail))) goto fail;
            budget = (int64_t)((double)avail * p.kv_mem_fraction);
        }
        size_t all_layers = r->kv.block_bytes * (size_t)r->kv.n_groups;
        if (n_ranks > 1 && (st = largest_block(model, &p, &all_layers))) goto fail;
        int64_t blocks = budget / (int64_t)all_layers;
        if (blocks < 1) {
            fy_error("runner: a kv budget of %lld bytes holds no %zu-byte block", (long long)budget, all_layers);
            st = FY_ERR_NO_SPACE;
            goto fail;
        }
        int64_t most = INT32_MAX / 2 / r->kv.n_groups;
        r->p.n_kv_blocks = p.n_kv_blocks = blocks > most ? (int32_t)most : (int32_t)blocks;
        fy_info("runner: kv arena of %d blocks (%lld MiB) from a budget of %lld MiB", p.n_kv_blocks,
                (long long)((int64_t)p.n_kv_blocks * (int64_t)all_layers >> 20), (long long)(budget >> 20));
    }
    if (group && rank == n_ranks - 1 && p.pool_skew) /* tests only: unequal pools, which must be refused */
        r->p.n_kv_blocks = p.n_kv_blocks += p.pool_skew;
    /* the pool counts pages of one KV group; a block of every layer is
     * n_groups of them (the same bytes) */
    size_t arena_bytes;
    if (p.n_kv_blocks < 1 || (int64_t)p.n_kv_blocks * r->kv.n_groups > INT32_MAX / 2 ||
        (int64_t)p.n_host_blocks * r->kv.n_groups > INT32_MAX / 2 ||
        !fy_mul_size((size_t)p.n_kv_blocks * (size_t)r->kv.n_groups, r->kv.block_bytes, &arena_bytes)) {
        fy_error("runner: kv arena of %d blocks (or a host tier of %d) overflows", p.n_kv_blocks, p.n_host_blocks);
        st = FY_ERR_INVALID;
        goto fail;
    }
    r->n_pages = p.n_kv_blocks * r->kv.n_groups;
    r->n_host_pages = p.n_host_blocks * r->kv.n_groups;
    if (p.kv_arenas) { /* a worker's group: every rank's arena in one mapping rank 0 also sees */
        if (!group || arena_bytes > p.kv_arena_stride) {
            fy_error("runner: rank %d's kv arena of %zu bytes does not fit its %zu-byte share of the group's mapping",
                     rank, arena_bytes, p.kv_arena_stride);
            st = FY_ERR_INVALID;
            goto fail;
        }
        r->arena = (char *)p.kv_arenas + (size_t)rank * p.kv_arena_stride;
        r->arena_borrowed = true;
    } else if ((st = fy_backend_alloc(be, arena_bytes, &r->arena))) {
        goto fail;
    }
    if (p.n_host_blocks > 0) {
        size_t host_bytes;
        if (!fy_mul_size((size_t)r->n_host_pages, r->kv.block_bytes, &host_bytes)) {
            fy_error("runner: host kv tier of %d blocks overflows", p.n_host_blocks);
            st = FY_ERR_INVALID;
            goto fail;
        }
        if ((st = fy_backend_alloc_host(be, host_bytes, &r->host_arena))) goto fail;
    }

    if (group && (st = compare_pools(r))) goto fail;
    *runner_p = r;
    return FY_OK;
fail:
    if (st == FY_ERR_NOMEM) fy_error("runner: out of memory");
    fy_runner_destroy(r);
    return st;
}

fy_status_t fy_runner_create(const fy_model_t *model, fy_backend_t *be, const fy_runner_params_t *params,
                             fy_runner_t **runner_p)
{
    return runner_create(model, be, params, fy_model_config(model)->n_layers, NULL, NULL, NULL, runner_p);
}

fy_status_t fy_runner_create_rank(const fy_model_t *model, fy_backend_t *be, const fy_runner_params_t *params,
                                  fy_group_t *group, fy_runner_t **runner_p)
{
    return runner_create(model, be, params, fy_model_config(model)->n_layers, NULL, NULL, group, runner_p);
}

fy_status_t fy_runner_create_draft(fy_runner_t *target, const fy_model_t *draft_model, int32_t n_layers,
                                   const fy_runner_params_t *params, fy_runner_t **runner_p)
{
    const fy_model_t *m = draft_model ? draft_model : target->model;
    const fy_model_config_t *c = fy_model_config(m);
    bool self = m == target->model;
    if (target->group || ranks_or_one(params->tp) * ranks_or_one(params->pp) > 1) {
        fy_error("runner: speculative drafts do not run on a rank group (tp %d, pp %d)", target->tp, target->pp);
        return FY_ERR_UNSUPPORTED;
    }
    if (!self && n_layers == 0) n_layers = c->n_layers;
    if (n_layers < 1 || n_layers > c->n_layers || (self && n_layers > target->n_layers)) {
        fy_error("runner: a draft of %d layers from a model of %d", n_layers, c->n_layers);
        return FY_ERR_INVALID;
    }
    if (c->vocab_size != target->cfg->vocab_size) {
        fy_error("runner: the draft's vocabulary has %d tokens, the target's %d", c->vocab_size,
                 target->cfg->vocab_size);
        return FY_ERR_INVALID;
    }
    if (!self && n_layers != c->n_layers) {
        fy_error("runner: only a self-draft (the target's own file) runs fewer layers than its model has");
        return FY_ERR_INVALID;
    }
    return runner_create(m, target->be, params, n_layers, self ? target : NULL, &target->res, NULL, runner_p);
}

int32_t fy_runner_n_layers(const fy_runner_t *r) { return r->n_layers; }
int32_t fy_runner_n_ranks(const fy_runner_t *r) { return r->group ? fy_group_size(r->group) : 1; }

void fy_runner_destroy(fy_runner_t *r)
{
    if (!r) return;
    float *bufs[] = {r->x, r->xb, r->xb2, r->q, r->att, r->k, r->v, r->hb, r->hb2, r->xl, r->logits, r->attf, r->hbf};
    for (size_t i = 0; i < FY_ARRAY_LEN(bufs); i++) fy_backend_free(r->be, bufs[i]);
    if (!r->arena_borrowed) fy_backend_free(r->be, r->arena);
    fy_backend_free_host(r->be, r->host_arena);
    if (r->shared) { /* borrowed, not ours to release */
        r->layers = NULL;
        memset(&r->tok_embd, 0, sizeof(r->tok_embd));
        memset(&r->out_norm, 0, sizeof(r->out_norm));
        memset(&r->output, 0, sizeof(r->output));
    }
    if (r->layers) {
        for (int32_t l = 0; l < r->n_layers; l++) {
            fy_layer_weights_t *L = &r->layers[l];
            fy_tensor_t *t[] = {&L->attn_norm,      &L->wq,           &L->wk, &L->wv, &L->wo, &L->ffn_norm, &L->w_gate,
                                &L->w_up,           &L->w_down,       &L->bq, &L->bk, &L->bv, &L->q_norm,   &L->k_norm,
                                &L->post_attn_norm, &L->post_ffn_norm};
            for (size_t i = 0; i < FY_ARRAY_LEN(t); i++)
                if (t[i]->data) fy_backend_release_tensor(r->be, t[i]);
        }
    }
    if (r->tok_embd.data) fy_backend_release_tensor(r->be, &r->tok_embd);
    if (r->out_norm.data) fy_backend_release_tensor(r->be, &r->out_norm);
    if (r->output.data) fy_backend_release_tensor(r->be, &r->output);
    if (r->owned) /* after the device tensors that may alias them */
        for (int32_t i = 0; i < 2 * r->n_layers; i++) fy_free(r->owned[i]);
    fy_free(r->owned);
    for (int32_t i = 0; i < r->n_f32_copies; i++) fy_free(r->f32_copies[i]);
    fy_free(r->f32_copies);
    fy_free(r->layers);
    fy_free(r->tokens);
    fy_free(r->pos);
    fy_free(r->slots);
    fy_free(r->logit_rows);
    fy_free(r->scores);
    fy_free(r->pad_table);
    fy_free(r->seqs);
    fy_free(r->cmd);
    fy_free(r->f_bt);
    fy_free(r->f_blocks);
    fy_free(r->f_lo);
    fy_free(r->f_tokens);
    fy_free(r->f_ids);
    fy_free(r->f_seqs);
    fy_free(r);
}

/* Fills the host metadata for a batch; FY_ERR_INVALID on bad input. */
static fy_status_t build_batch(fy_runner_t *r, const fy_forward_seq_t *seqs, int32_t n_seqs, int32_t *n_tokens_p,
                               int32_t *n_logits_p)
{
    const fy_model_config_t *c = r->cfg;
    if (n_seqs < 1 || n_seqs > r->p.max_seqs) {
        fy_error("runner: %d sequences in a batch (1 to %d)", n_seqs, r->p.max_seqs);
        return FY_ERR_INVALID;
    }
    int32_t nt = 0, nl = 0;
    for (int32_t s = 0; s < n_seqs; s++) {
        const fy_forward_seq_t *f = &seqs[s];
        const fy_block_table_t *bt = f->bt;
        if (f->n_tokens < 1 || f->pos < 0 || f->n_logits < 0 || f->n_logits > f->n_tokens) {
            fy_error("runner: sequence %d: %d tokens at position %d with %d logits", s, f->n_tokens, f->pos,
                     f->n_logits);
            return FY_ERR_INVALID;
        }
        if (nt + f->n_tokens > r->p.max_batch_tokens || nl + f->n_logits > r->p.max_logits) {
            fy_error("runner: batch exceeds %d tokens or %d logit rows", r->p.max_batch_tokens, r->p.max_logits);
            return FY_ERR_INVALID;
        }
        int32_t kv_len = f->pos + f->n_tokens;
        if (kv_len > r->p.max_ctx) {
            fy_error("runner: sequence %d reaches %d tokens, past the context limit %d", s, kv_len, r->p.max_ctx);
            return FY_ERR_INVALID;
        }
        if (!bt || bt->block_size != r->kv.block_size || bt->n_groups != r->kv.n_groups ||
            kv_len > bt->n_blocks * bt->block_size) {
            fy_error("runner: sequence %d: %d tokens need more blocks than its table holds", s, kv_len);
            return FY_ERR_INVALID;
        }
        for (int32_t g = 0; g < bt->n_groups; g++) {
            /* a sliding group holds what its first query sees, from there on */
            int32_t w = r->kv.group_window[g], lo = w && f->pos - w + 1 > 0 ? (f->pos - w + 1) / bt->block_size : 0;
            if (bt->lo[g] > lo) {
                fy_error("runner: sequence %d: group %d dropped block %d, which a query at %d reads", s, g,
                         bt->lo[g] - 1, f->pos);
                return FY_ERR_INVALID;
            }
        }
        for (int32_t i = 0; i < f->n_tokens; i++) {
            int32_t tok = f->tokens[i];
            if (tok < 0 || tok >= c->vocab_size) {
                fy_error("runner: sequence %d: token id %d out of range (vocabulary %d)", s, tok, c->vocab_size);
                return FY_ERR_INVALID;
            }
            r->tokens[nt + i] = tok;
            r->pos[nt + i] = f->pos + i;
            for (int32_t g = 0; g < bt->n_groups; g++)
                r->slots[(size_t)g * r->p.max_batch_tokens + nt + i] = fy_block_table_slot(bt, g, f->pos + i);
        }
        for (int32_t i = 0; i < f->n_logits; i++) r->logit_rows[nl + i] = nt + f->n_tokens - f->n_logits + i;
        r->seqs[s] = (fy_attn_seq_t){
            .q_start = nt,
            .n_q = f->n_tokens,
            .kv_len = kv_len,
            .n_blocks = (kv_len + bt->block_size - 1) / bt->block_size,
            .block_table = bt->blocks,
            .group_stride = bt->max_blocks,
        };
        nt += f->n_tokens;
        nl += f->n_logits;
    }
    *n_tokens_p = nt;
    *n_logits_p = nl;
    return FY_OK;
}

/* The end of a forward pass: wait for the backend, then add this pass's
 * block scores into the sequences that asked for them. */
static fy_status_t finish(fy_runner_t *r, const fy_forward_seq_t *seqs, int32_t n_seqs, bool scores)
{
    fy_status_t st = fy_backend_sync(r->be);
    if (!scores) return st;
    fy_backend_set_attn_scores(r->be, NULL, 0);
    if (st) return st;
    for (int32_t s = 0; s < n_seqs; s++) {
        const fy_forward_seq_t *f = &seqs[s];
        if (!f->scores) continue;
        const float *src = r->scores + (size_t)s * (size_t)r->scores_stride;
        int32_t nb = (f->pos + f->n_tokens + r->kv.block_size - 1) / r->kv.block_size;
        for (int32_t i = 0; i < nb; i++) f->scores[i] += src[i];
    }
    return FY_OK;
}

/* The stage's tensor ranks add their partial sums of x [n] (the o- or
 * down-projection's); device pointers are host memory on the CPU backend,
 * the only one a group runs on. */
static fy_status_t reduce(fy_runner_t *r, float *x, size_t n)
{
    if (r->tp == 1) return FY_OK;
    fy_status_t st = fy_backend_sync(r->be);
    if (st != FY_OK) return st;
    uint64_t t = fy_now_ns();
    st = fy_group_allreduce_f32(r->group, r->stage * r->tp, r->tp, x, n);
    r->tm.allreduce_ns += fy_now_ns() - t;
    return st;
}

/* Every tensor rank's columns of a [n, w * tp] matrix, this one's [n, w]
 * at column tp_rank * w of it (the ranks' slices lie in rank order): into
 * dst on every rank, the computed values bit for bit.  Host memory (the
 * CPU backend). */
static fy_status_t gather(fy_runner_t *r, const float *src, size_t w, float *dst, int32_t n)
{
    fy_status_t st = fy_backend_sync(r->be);
    if (st != FY_OK) return st;
    uint64_t t = fy_now_ns();
    st = fy_group_allgather(r->group, r->stage * r->tp, r->tp, src, (size_t)n, w * sizeof(float), dst);
    r->tm.allreduce_ns += fy_now_ns() - t;
    return st;
}

/* One projection of the layer (wo or w_down) of input x [n, in] (this
 * rank's columns, at column tp_rank * in of the whole input) into
 * xb2 [n, dim]: the whole input gathered into x_full and this rank's rows
 * (gathering), or this rank's columns summed across ranks, or one rank's
 * whole product. */
static fy_status_t project(fy_runner_t *r, const fy_tensor_t *w, float *x, size_t in, float *x_full, int32_t n)
{
    const fy_tensor_t *ws[1] = {w};
    float *y[1] = {r->xb2};
    fy_status_t st;
    if (!r->gather) {
        if ((st = fy_backend_matmul(r->be, 1, ws, x, n, y))) return st;
        return reduce(r, r->xb2, (size_t)n * (size_t)r->cfg->dim);
    }
    size_t rows = (size_t)w->ne[1];
    float *part[1] = {r->xb}; /* free here: the projection's input was made from it */
    if ((st = gather(r, x, in, x_full, n)) || (st = fy_backend_matmul(r->be, 1, ws, x_full, n, part))) return st;
    return gather(r, r->xb, rows, r->xb2, n);
}

static fy_status_t stage_send(fy_runner_t *r, int32_t dst, const float *x, size_t n)
{
    fy_status_t st = fy_backend_sync(r->be);
    if (st != FY_OK) return st;
    uint64_t t = fy_now_ns();
    st = fy_group_send(r->group, dst, x, n * sizeof(float));
    r->tm.send_ns += fy_now_ns() - t;
    return st;
}

static fy_status_t stage_recv(fy_runner_t *r, int32_t src, float *x, size_t n)
{
    uint64_t t = fy_now_ns();
    fy_status_t st = fy_group_recv(r->group, src, x, n * sizeof(float));
    r->tm.wait_ns += fy_now_ns() - t;
    return st;
}

/* This rank's layers and, where it has them, the head: from the embedding
 * (or the previous stage's x) to the logits of the nl rows in r->logits
 * (*head_p: rank 0 made them).  Only compute ops on a single rank: what a
 * recorded step (fy_backend_graph_begin) holds. */
/* fy_runner_set_taps: layer l's x (nd floats) into its place in dst */
static fy_status_t tap(fy_runner_t *r, float *dst, int32_t l, size_t nd)
{
    if (!dst) return FY_OK;
    fy_status_t st = fy_backend_sync(r->be);
    if (st) return st;
    return fy_backend_memcpy(r->be, dst + (size_t)l * (size_t)r->p.max_batch_tokens * (size_t)r->cfg->dim, r->x,
                             nd * sizeof(float), FY_COPY_D2H);
}

static fy_status_t run_layers(fy_runner_t *r, int32_t n, int32_t nl, bool *head_p)
{
    const fy_model_config_t *c = r->cfg;
    const fy_arch_traits_t *a = &c->traits;
    fy_backend_t *be = r->be;
    fy_status_t st;
    const size_t dim = (size_t)c->dim, nd = (size_t)n * dim, nf = (size_t)n * (size_t)r->ffn;
    const int32_t nh = r->n_heads, nkv = r->n_kv_heads;
    const size_t qd = (size_t)nh * (size_t)c->head_dim;
    *head_p = false;
    if (r->stage == 0) {
        if ((st = fy_backend_embed(be, &r->tok_embd, r->x))) return st;
        if (c->embed_scale != 1.0f && (st = fy_backend_scale(be, r->x, c->embed_scale, nd))) return st;
    } else if ((st = stage_recv(r, r->rank - r->tp, r->x, nd))) { /* the previous stage's x */
        return st;
    }

    for (int32_t l = 0; l < r->n_layers; l++) {
        const fy_layer_weights_t *L = &r->layers[l];
        const fy_layer_config_t *D = &c->layer[r->layer0 + l];
        const fy_tensor_t *qkv_w[3] = {&L->wq, &L->wk, &L->wv};
        float *qkv_y[3] = {r->q, r->k, r->v};
        const fy_tensor_t *gu_w[2] = {&L->w_gate, &L->w_up};
        float *gu_y[2] = {r->hb, r->hb2};
        /* attention */
        if ((st = fy_backend_rmsnorm_matmul(be, r->x, &L->attn_norm, c->norm_eps, 3, qkv_w, n, r->xb, qkv_y)))
            return st;
        if (a->qkv_bias &&
            ((st = fy_backend_add_bias(be, r->q, &L->bq, n)) || (st = fy_backend_add_bias(be, r->k, &L->bk, n)) ||
             (st = fy_backend_add_bias(be, r->v, &L->bv, n))))
            return st;
        if (a->qk_norm && ((st = fy_backend_rmsnorm(be, r->q, &L->q_norm, n * nh, c->norm_eps, r->q)) ||
                           (st = fy_backend_rmsnorm(be, r->k, &L->k_norm, n * nkv, c->norm_eps, r->k))))
            return st;
        if ((st = fy_backend_rope(be, r->q, r->k, nh, nkv, c->head_dim, &D->rope)) ||
            (st = fy_backend_kv_write(be, &r->kv, r->arena, l, r->k, r->v)) ||
            (st = fy_backend_attention(be, &r->kv, r->arena, l, nh, c->attn_scale, D->window, r->q, r->att)) ||
            (st = project(r, &L->wo, r->att, qd, r->attf, n)))
            return st;
        if (a->post_norms && (st = fy_backend_rmsnorm(be, r->xb2, &L->post_attn_norm, n, c->norm_eps, r->xb2)))
            return st;
        if ((st = fy_backend_add(be, r->x, r->xb2, nd)) || (st = tap(r, r->tap_attn, l, nd))) return st;
        /* MLP */
        if ((st = fy_backend_rmsnorm_matmul(be, r->x, &L->ffn_norm, c->norm_eps, 2, gu_w, n, r->xb, gu_y)) ||
            (st = a->act == FY_ACT_GELU_TANH ? fy_backend_geglu(be, r->hb, r->hb2, r->hb, nf)
                                             : fy_backend_swiglu(be, r->hb, r->hb2, r->hb, nf)) ||
            (st = project(r, &L->w_down, r->hb, (size_t)r->ffn, r->hbf, n)))
            return st;
        if (a->post_norms && (st = fy_backend_rmsnorm(be, r->xb2, &L->post_ffn_norm, n, c->norm_eps, r->xb2)))
            return st;
        if ((st = fy_backend_add(be, r->x, r->xb2, nd)) || (st = tap(r, r->tap_mlp, l, nd))) return st;
    }
    const bool last = r->stage == r->pp - 1;
    if (!last && (st = stage_send(r, r->rank + r->tp, r->x, nd))) return st; /* on to the next stage */
    if (nl == 0) return FY_OK;
    if (r->rank != 0) { /* the last stage's first tensor rank hands rank 0 the rows that want logits */
        if (last && r->tp_rank == 0 && r->pp > 1 &&
            ((st = fy_backend_get_rows(be, r->x, r->logit_rows, nl, c->dim, r->xl)) ||
             (st = stage_send(r, 0, r->xl, (size_t)nl * dim))))
            return st;
        return FY_OK;
    }
    const fy_tensor_t *out_w[1] = {&r->output};
    float *out_y[1] = {r->logits};
    if (last)
        st = fy_backend_get_rows(be, r->x, r->logit_rows, nl, c->dim, r->xl);
    else
        st = stage_recv(r, (r->pp - 1) * r->tp, r->xl, (size_t)nl * dim);
    if (st || (st = fy_backend_rmsnorm_matmul(be, r->xl, &r->out_norm, c->norm_eps, 1, out_w, nl, r->xl, out_y)))
        return st;
    *head_p = true;
    return FY_OK;
}

/* Recorded steps (CUDA graphs) run decode batches: every sequence one new
 * token that wants its logits, a single rank, no H2O scores.  Such a batch
 * of n sequences runs as the next bucket (1, 2, 4, .. and the largest
 * batch the runner takes), padded with sequences that write nothing and
 * attend to nothing, so a handful of recordings serve every decode step.
 * 0: run this batch as it is. */
static int32_t graph_bucket(const fy_runner_t *r, const fy_forward_seq_t *seqs, int32_t n_seqs, int32_t n, int32_t nl,
                            bool scores)
{
    if (!r->p.graphs || r->graphs_failed || r->group || scores || n != n_seqs || nl != n) return 0;
    if (r->p.graphs == 1 && !fy_backend_graphs(r->be)) return 0; /* nothing records: no padding */
    for (int32_t s = 0; s < n_seqs; s++)
        if (seqs[s].n_tokens != 1 || seqs[s].n_logits != 1) return 0;
    int32_t most = r->p.max_seqs;
    if (r->p.max_logits < most) most = r->p.max_logits;
    if (r->p.max_batch_tokens < most) most = r->p.max_batch_tokens;
    int32_t b = 1;
    while (b < n) b *= 2;
    return b < most ? b : most;
}

/* Rows n .. b - 1 of the batch: one sequence each, token 0 at position 0,
 * every slot -1 (kv_write keeps nothing) and every block -1 (attention
 * sees no key: zeros), its logits computed and not returned. */
static void pad_batch(fy_runner_t *r, int32_t n, int32_t b)
{
    for (int32_t i = n; i < b; i++) {
        r->tokens[i] = 0;
        r->pos[i] = 0;
        for (int32_t g = 0; g < r->kv.n_groups; g++) r->slots[(size_t)g * r->p.max_batch_tokens + i] = -1;
        r->seqs[i] = (fy_attn_seq_t){
            .q_start = i, .n_q = 1, .kv_len = 1, .n_blocks = 1, .block_table = r->pad_table, .group_stride = 1};
        r->logit_rows[i] = i;
    }
}

/* This rank's part of a forward pass over a batch build_batch accepted
 * (n tokens, nl logit rows); logits: rank 0's. */
static fy_status_t compute(fy_runner_t *r, const fy_forward_seq_t *seqs, int32_t n_seqs, int32_t n, int32_t nl,
                           bool scores, float *logits)
{
    const fy_model_config_t *c = r->cfg;
    fy_backend_t *be = r->be;
    fy_status_t st;
    const int32_t nl_out = nl, bucket = graph_bucket(r, seqs, n_seqs, n, nl, scores);
    int32_t n_batch_seqs = n_seqs;
    if (bucket) {
        pad_batch(r, n, bucket);
        r->tm.pad_rows += (uint64_t)(bucket - n);
        n = nl = n_batch_seqs = bucket;
    }
    /* the groups' slots, packed [n_groups][n] */
    for (int32_t g = 1; g < r->kv.n_groups; g++)
        memmove(r->slots + (size_t)g * n, r->slots + (size_t)g * r->p.max_batch_tokens, (size_t)n * sizeof(int32_t));
    fy_batch_meta_t meta = {
        .n_tokens = n,
        .n_groups = r->kv.n_groups,
        .tokens = r->tokens,
        .pos = r->pos,
        .slots = r->slots,
        .n_seqs = n_batch_seqs,
        .seqs = r->seqs,
    };
    if ((st = fy_backend_set_batch(be, &meta))) return st;
    if (scores) { /* H2O: the kernel adds each block's attention mass here (set_batch turned it off) */
        memset(r->scores, 0, (size_t)n_seqs * (size_t)r->scores_stride * sizeof(float));
        if ((st = fy_backend_set_attn_scores(be, r->scores, r->scores_stride))) return st;
    }
    bool head = false, replay = false, recorded = false;
    if (bucket) {
        st = fy_backend_graph_begin(be, r, bucket, &replay);
        if (st != FY_OK && st != FY_ERR_UNSUPPORTED) return st;
        recorded = st == FY_OK;
    }
    st = replay ? FY_OK : run_layers(r, n, nl, &head);
    if (recorded) {
        fy_status_t end = fy_backend_graph_end(be, st == FY_OK);
        if (!replay && (st != FY_OK || end == FY_ERR_UNSUPPORTED)) {
            /* the recording failed and nothing ran (the backend said why):
             * this step, and every later one, runs directly */
            r->graphs_failed = true;
            st = run_layers(r, n, nl, &head);
        } else if (st == FY_OK) {
            st = end;
            head = r->rank == 0 && nl > 0;
            r->tm.graph_steps++;
        }
    }
    if (st == FY_OK && head)
        st = fy_backend_memcpy(be, logits, r->logits, (size_t)nl_out * (size_t)c->vocab_size * sizeof(float),
                               FY_COPY_D2H);
    if (st != FY_OK) return st;
    return finish(r, seqs, n_seqs, scores);
}

/* compute, with its time split into the counters */
static fy_status_t compute_timed(fy_runner_t *r, const fy_forward_seq_t *seqs, int32_t n_seqs, int32_t n, int32_t nl,
                                 bool scores, float *logits)
{
    uint64_t t0 = fy_now_ns(), other = r->tm.allreduce_ns + r->tm.wait_ns + r->tm.send_ns;
    fy_status_t st = compute(r, seqs, n_seqs, n, nl, scores, logits);
    uint64_t spent = fy_now_ns() - t0, waited = r->tm.allreduce_ns + r->tm.wait_ns + r->tm.send_ns - other;
    r->tm.compute_ns += spent > waited ? spent - waited : 0;
    r->tm.forwards++;
    return st;
}

/* Rank 0: the batch as the other ranks need it: per sequence its counts,
 * and of its block table what the kernels read (each group's first held
 * block and the blocks up to its kv length). */
static fy_status_t encode_forward(fy_runner_t *r, const fy_forward_seq_t *seqs, int32_t n_seqs, size_t *words_p)
{
    int32_t *w = r->cmd;
    size_t cap = r->cmd_cap / sizeof(int32_t), at = CMD_FORWARD_HEAD;
    w[0] = CMD_FORWARD;
    w[1] = n_seqs;
    for (int32_t s = 0; s < n_seqs; s++) {
        const fy_forward_seq_t *f = &seqs[s];
        const fy_block_table_t *bt = f->bt;
        int32_t ng = bt->n_groups, nb = (f->pos + f->n_tokens + bt->block_size - 1) / bt->block_size;
        size_t need = CMD_SEQ_HEAD + (size_t)ng + (size_t)ng * (size_t)nb + (size_t)f->n_tokens;
        if (cap - at < need) {
            fy_error("runner: a batch of %d sequences overflows the rank group's command area (%zu bytes)", n_seqs,
                     r->cmd_cap);
            return FY_ERR_INVALID;
        }
        w[at++] = f->n_tokens;
        w[at++] = f->pos;
        w[at++] = f->n_logits;
        w[at++] = ng;
        w[at++] = nb;
        for (int32_t g = 0; g < ng; g++) w[at++] = bt->lo[g];
        for (int32_t g = 0; g < ng; g++) {
            memcpy(w + at, fy_block_table_group(bt, g), (size_t)nb * sizeof(int32_t));
            at += (size_t)nb;
        }
        memcpy(w + at, f->tokens, (size_t)f->n_tokens * sizeof(int32_t));
        at += (size_t)f->n_tokens;
    }
    *words_p = at;
    return FY_OK;
}

/* A follower: rank 0's batch back into forward entries over its own
 * block tables, every count and block id checked. */
static fy_status_t decode_forward(fy_runner_t *r, const int32_t *w, size_t nw, int32_t *n_seqs_p)
{
    const int32_t ng = r->kv.n_groups, bps = r->blocks_per_seq, bs = r->kv.block_size;
    size_t at = CMD_FORWARD_HEAD;
    int32_t n_seqs = nw >= at ? w[1] : 0, nt_all = 0;
    if (n_seqs < 1 || n_seqs > r->p.max_seqs) goto bad;
    for (int32_t s = 0; s < n_seqs; s++) {
        if (nw - at < CMD_SEQ_HEAD) goto bad;
        int32_t nt = w[at], pos = w[at + 1], nlg = w[at + 2], g_n = w[at + 3], nb = w[at + 4];
        at += CMD_SEQ_HEAD;
        if (g_n != ng || nt < 1 || nt > r->p.max_batch_tokens - nt_all || pos < 0 || pos > r->p.max_ctx || nlg < 0 ||
            nlg > nt || nb != (pos + nt + bs - 1) / bs || nb > bps)
            goto bad;
        if (nw - at < (size_t)ng + (size_t)ng * (size_t)nb + (size_t)nt) goto bad;
        fy_block_table_t *bt = &r->f_bt[s];
        *bt = (fy_block_table_t){
            .blocks = r->f_blocks + (size_t)s * (size_t)ng * (size_t)bps,
            .lo = r->f_lo + (size_t)s * (size_t)ng,
            .n_groups = ng,
            .n_blocks = nb,
            .max_blocks = bps,
            .n_tokens = pos,
            .block_size = bs,
            .tier = FY_KV_DEVICE,
        };
        for (int32_t g = 0; g < ng; g++) {
            bt->lo[g] = w[at++];
            if (bt->lo[g] < 0 || bt->lo[g] > nb) goto bad;
        }
        for (int32_t g = 0; g < ng; g++) {
            int32_t *dst = fy_block_table_group(bt, g);
            for (int32_t i = 0; i < nb; i++) {
                int32_t id = w[at++];
                /* a block this pass writes must be there; others may be gone (-1) */
                bool written = i >= pos / bs;
                if (id < -1 || id >= r->n_pages || (written && id < 0)) goto bad;
                dst[i] = id;
            }
        }
        memcpy(r->f_tokens + nt_all, w + at, (size_t)nt * sizeof(int32_t));
        at += (size_t)nt;
        r->f_seqs[s] =
            (fy_forward_seq_t){.bt = bt, .tokens = r->f_tokens + nt_all, .n_tokens = nt, .pos = pos, .n_logits = nlg};
        nt_all += nt;
    }
    if (at != nw) goto bad;
    *n_seqs_p = n_seqs;
    return FY_OK;
bad:
    fy_error("runner: rank %d: a malformed forward command (%zu words, at %zu)", r->rank, nw, at);
    return FY_ERR_FORMAT;
}

fy_status_t fy_runner_forward(fy_runner_t *r, const fy_forward_seq_t *seqs, int32_t n_seqs, float *logits)
{
    int32_t n, nl;
    bool scores = false;
    for (int32_t s = 0; s < n_seqs && seqs; s++) scores |= seqs[s].scores != NULL;
    if (scores && r->group) {
        fy_error("runner: H2O's attention scores are not gathered across ranks (tp %d, pp %d)", r->tp, r->pp);
        return FY_ERR_UNSUPPORTED;
    }
    fy_status_t st = build_batch(r, seqs, n_seqs, &n, &nl);
    if (st != FY_OK) return st;
    if (!r->group) return compute_timed(r, seqs, n_seqs, n, nl, scores, logits);
    size_t words;
    if ((st = encode_forward(r, seqs, n_seqs, &words)) || (st = lead_post(r, words, "a forward pass"))) return st;
    return lead_done(r, compute_timed(r, seqs, n_seqs, n, nl, false, logits), "a forward pass");
}

/* ---- followers ---- */

static fy_status_t follow_forward(fy_runner_t *r, const int32_t *w, size_t nw, bool *clean_p)
{
    int32_t n_seqs, n, nl;
    fy_status_t st;
    if ((st = decode_forward(r, w, nw, &n_seqs)) || (st = build_batch(r, r->f_seqs, n_seqs, &n, &nl))) return st;
    if ((st = compute_timed(r, r->f_seqs, n_seqs, n, nl, false, NULL))) return st;
    r->n_forwards++;
    if (r->p.fail_after_forwards > 0 && r->rank == fy_group_size(r->group) - 1 &&
        r->n_forwards > r->p.fail_after_forwards) { /* tests: after its part, so nobody waits on it */
        fy_error("runner: rank %d: injected failure after %d forward passes (a test's fail_after_forwards)", r->rank,
                 r->p.fail_after_forwards);
        *clean_p = true;
        return FY_ERR_NO_SPACE;
    }
    return FY_OK;
}

static fy_status_t follow_copy(fy_runner_t *r, const int32_t *w, size_t nw)
{
    int32_t dt = nw >= CMD_COPY_HEAD ? w[1] : -1, sti = nw >= CMD_COPY_HEAD ? w[2] : -1,
            k = nw >= CMD_COPY_HEAD ? w[3] : -1;
    if ((dt != FY_KV_DEVICE && dt != FY_KV_HOST) || (sti != FY_KV_DEVICE && sti != FY_KV_HOST) || k < 0 ||
        nw != CMD_COPY_HEAD + 2 * (size_t)k) {
        fy_error("runner: rank %d: a malformed block copy command (%zu words)", r->rank, nw);
        return FY_ERR_FORMAT;
    }
    const int32_t *dst = w + CMD_COPY_HEAD, *src = dst + k;
    int32_t dn = dt == FY_KV_DEVICE ? r->n_pages : r->n_host_pages,
            sn = sti == FY_KV_DEVICE ? r->n_pages : r->n_host_pages;
    for (int32_t i = 0; i < k; i++) {
        if (dst[i] < 0 || dst[i] >= dn || src[i] < 0 || src[i] >= sn) {
            fy_error("runner: rank %d: a block copy names block %d <- %d outside its pools (%d, %d)", r->rank, dst[i],
                     src[i], dn, sn);
            return FY_ERR_FORMAT;
        }
    }
    memcpy(r->f_ids, dst, (size_t)k * sizeof(int32_t));
    memcpy(r->f_ids + k, src, (size_t)k * sizeof(int32_t));
    return copy_local(r, (fy_kv_tier_t)dt, r->f_ids, (fy_kv_tier_t)sti, r->f_ids + k, k);
}

static fy_status_t follow_timing(fy_runner_t *r, const int32_t *w, size_t nw)
{
    if (nw != 2) {
        fy_error("runner: rank %d: a malformed timing command (%zu words)", r->rank, nw);
        return FY_ERR_FORMAT;
    }
    fy_status_t st = fy_group_send(r->group, 0, &r->tm, sizeof(r->tm));
    if (st == FY_OK && w[1]) memset(&r->tm, 0, sizeof(r->tm));
    return st;
}

fy_status_t fy_runner_follow(fy_runner_t *r)
{
    if (!r->group || r->rank == 0) {
        fy_error("runner: only a rank other than 0 follows");
        return FY_ERR_INVALID;
    }
    for (;;) {
        const void *buf;
        size_t len;
        fy_status_t st = fy_group_wait_cmd(r->group, &buf, &len);
        if (st == FY_ERR_CANCELLED) return FY_OK; /* the group is ending */
        if (st != FY_OK) return st;
        /* the command area is rank 0's: copy it before reading (aligned, and stable) */
        size_t nw = len / sizeof(int32_t);
        bool clean = false;
        if (len % sizeof(int32_t) || len > r->cmd_cap || nw < 1) {
            fy_error("runner: rank %d: a command of %zu bytes", r->rank, len);
            st = FY_ERR_FORMAT;
        } else {
            memcpy(r->cmd, buf, len);
            switch (r->cmd[0]) {
            case CMD_FORWARD: st = follow_forward(r, r->cmd, nw, &clean); break;
            case CMD_COPY: st = follow_copy(r, r->cmd, nw); break;
            case CMD_TIMING: st = follow_timing(r, r->cmd, nw); break;
            default: fy_error("runner: rank %d: unknown command %d", r->rank, r->cmd[0]); st = FY_ERR_FORMAT;
            }
            if (st != FY_OK && !clean && !fy_group_broken(r->group)) { /* rank 0 may wait on a collective of ours */
                char why[96];
                snprintf(why, sizeof(why), "rank %d failed a command: %s", r->rank, fy_status_str(st));
                fy_group_abort(r->group, why);
            }
        }
        fy_status_t done = fy_group_done(r->group, st, NULL);
        if (st != FY_OK && clean) { /* stay until rank 0 ends the group, which it now treats as broken */
            while ((done = fy_group_wait_cmd(r->group, &buf, &len)) == FY_OK)
                if ((done = fy_group_done(r->group, FY_ERR_PEER, NULL))) break;
            return st;
        }
        if (st != FY_OK) return st;
        if (done != FY_OK) return done;
    }
}

fy_status_t fy_runner_timing(fy_runner_t *r, fy_runner_timing_t *out, int32_t n_ranks, bool reset)
{
    int32_t n = fy_runner_n_ranks(r);
    if (n_ranks < n || (r->group && r->rank != 0)) {
        fy_error("runner: timing of %d ranks asked of rank %d of %d", n_ranks, r->rank, n);
        return FY_ERR_INVALID;
    }
    out[0] = r->tm;
    if (reset) memset(&r->tm, 0, sizeof(r->tm));
    if (!r->group) return FY_OK;
    r->cmd[0] = CMD_TIMING;
    r->cmd[1] = reset;
    fy_status_t st = lead_post(r, 2, "a timing report");
    if (st != FY_OK) return st;
    for (int32_t k = 1; k < n && st == FY_OK; k++) st = fy_group_recv(r->group, k, &out[k], sizeof(out[k]));
    return lead_done(r, st, "a timing report");
}

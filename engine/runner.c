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
 * Not here: the kernels (kernels/), the weights' reading and the
 * description's making (model/model.c).
 */
#include "runner.h"

#include <string.h>

#include "log.h"
#include "mem.h"

struct fy_runner {
    const fy_model_t *model;
    const fy_model_config_t *cfg;
    fy_backend_t *be;
    fy_runner_params_t p;
    int32_t n_layers;          /* layers run: the model's, or fewer for a self-draft */
    const fy_runner_t *shared; /* the runner whose device weights this one borrows, or NULL */
    fy_backend_reserve_t res;  /* what this runner asked of the backend */
    fy_kv_layout_t kv;
    void *arena;      /* device: n_pages * kv.block_bytes */
    void *host_arena; /* host tier: n_host_pages * kv.block_bytes */
    int32_t n_pages;  /* the pool's blocks: n_kv_blocks of every layer, n_groups pages each */
    int32_t n_host_pages;

    /* device copies of the weights */
    fy_tensor_t tok_embd, out_norm, output;
    fy_layer_weights_t *layers;

    /* device activations; T = max_batch_tokens, L = max_logits */
    float *x, *xb, *xb2; /* [T, dim] */
    float *q, *att;      /* [T, n_heads * head_dim] */
    float *k, *v;        /* [T, n_kv_heads * head_dim] */
    float *hb, *hb2;     /* [T, ffn_dim] */
    float *xl;           /* [L, dim] */
    float *logits;       /* [L, vocab] */

    /* host metadata for one batch */
    int32_t *tokens, *pos, *slots; /* [T] */
    int32_t *logit_rows;           /* [L] */
    float *scores;                 /* [max_seqs, scores_stride] H2O: one pass's attention mass per block */
    int32_t scores_stride;         /* blocks per sequence at most */
    fy_attn_seq_t *seqs;           /* [max_seqs] */
};

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
    };
}

const fy_kv_layout_t *fy_runner_kv_layout(const fy_runner_t *r) { return &r->kv; }
const fy_runner_params_t *fy_runner_params(const fy_runner_t *r) { return &r->p; }
const fy_model_t *fy_runner_model(const fy_runner_t *r) { return r->model; }
void *fy_runner_kv_arena(fy_runner_t *r) { return r->arena; }

/* fy_kv_copy_fn over the runner's arenas */
static fy_status_t kv_copy(void *arg, fy_kv_tier_t dst_tier, const int32_t *dst, fy_kv_tier_t src_tier,
                           const int32_t *src, int32_t n)
{
    fy_runner_t *r = arg;
    void *da = dst_tier == FY_KV_DEVICE ? r->arena : r->host_arena;
    void *sa = src_tier == FY_KV_DEVICE ? r->arena : r->host_arena;
    fy_copy_kind_t kind = dst_tier == FY_KV_DEVICE ? (src_tier == FY_KV_DEVICE ? FY_COPY_D2D : FY_COPY_H2D)
                                                   : (src_tier == FY_KV_DEVICE ? FY_COPY_D2H : FY_COPY_H2H);
    return fy_backend_copy_blocks(r->be, &r->kv, da, sa, dst, src, n, kind);
}

fy_status_t fy_runner_layout_for(const fy_model_t *model, int32_t n_layers, const fy_runner_params_t *p,
                                 fy_kv_layout_t *lay_p)
{
    const fy_model_config_t *c = fy_model_config(model);
    fy_kv_layout_t lay;
    if (n_layers < 1 || n_layers > c->n_layers) {
        fy_error("runner: a kv layout of %d layers for a model of %d", n_layers, c->n_layers);
        return FY_ERR_INVALID;
    }
    fy_status_t st = fy_kv_layout_init(&lay, n_layers, c->n_kv_heads, c->head_dim, p->block_size, p->kv_dtype);
    if (st != FY_OK) return st;
    if (!p->kv_one_group) { /* KV groups by window: sliding layers give blocks back */
        int32_t win[FY_KV_MAX_LAYERS];
        for (int32_t l = 0; l < n_layers; l++) win[l] = c->layer[l].window;
        if ((st = fy_kv_layout_set_windows(&lay, win))) return st;
    }
    *lay_p = lay;
    return FY_OK;
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
        .watermark = 0.01f,
        .max_step_tokens = r->p.max_batch_tokens,
    };
}

static fy_status_t dev_alloc(fy_runner_t *r, size_t n_floats, float **p)
{
    return fy_backend_alloc(r->be, n_floats * sizeof(float), (void **)p);
}

static fy_status_t upload_weights(fy_runner_t *r)
{
    const fy_model_weights_t *w = fy_model_weights(r->model);
    fy_status_t st;
    if (r->shared) { /* a self-draft: the target's device tensors, first layers only */
        r->tok_embd = r->shared->tok_embd;
        r->out_norm = r->shared->out_norm;
        r->output = r->shared->output;
        r->layers = r->shared->layers;
        return FY_OK;
    }
    r->layers = fy_calloc((size_t)r->n_layers, sizeof(*r->layers));
    if (!r->layers) return FY_ERR_NOMEM;
    if ((st = fy_backend_upload(r->be, &w->tok_embd, FY_USE_ROWS, &r->tok_embd)) ||
        (st = fy_backend_upload(r->be, &w->out_norm, FY_USE_VECTOR, &r->out_norm)) ||
        (st = fy_backend_upload(r->be, &w->output, FY_USE_MATMUL, &r->output)))
        return st;
    for (int32_t l = 0; l < r->n_layers; l++) {
        const fy_layer_weights_t *src = &w->layers[l];
        fy_layer_weights_t *dst = &r->layers[l];
        const fy_tensor_t *s[] = {&src->attn_norm,    &src->wq,     &src->wk,     &src->wv,     &src->wo,
                                  &src->ffn_norm,     &src->w_gate, &src->w_up,   &src->w_down, &src->bq,
                                  &src->bk,           &src->bv,     &src->q_norm, &src->k_norm, &src->post_attn_norm,
                                  &src->post_ffn_norm};
        fy_tensor_t *d[] = {&dst->attn_norm,    &dst->wq,     &dst->wk,     &dst->wv,     &dst->wo,
                            &dst->ffn_norm,     &dst->w_gate, &dst->w_up,   &dst->w_down, &dst->bq,
                            &dst->bk,           &dst->bv,     &dst->q_norm, &dst->k_norm, &dst->post_attn_norm,
                            &dst->post_ffn_norm};
        for (size_t i = 0; i < FY_ARRAY_LEN(s); i++) {
            if (!s[i]->data) continue; /* a tensor this architecture has not */
            fy_tensor_use_t use = s[i]->ne[1] == 1 ? FY_USE_VECTOR : FY_USE_MATMUL;
            if ((st = fy_backend_upload(r->be, s[i], use, d[i]))) return st;
        }
    }
    return FY_OK;
}

static fy_status_t runner_create(const fy_model_t *model, fy_backend_t *be, const fy_runner_params_t *params,
                                 int32_t n_layers, const fy_runner_t *shared, const fy_backend_reserve_t *also,
                                 fy_runner_t **runner_p)
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
    fy_status_t st = fy_runner_layout_for(model, n_layers, &p, &r->kv);
    if (st != FY_OK) goto fail;

    if ((st = upload_weights(r))) goto fail;
    if (p.n_kv_blocks == 0) {
        /* sized from a byte budget, or from what the weights left free */
        int64_t budget = p.kv_mem, total, avail;
        if (!budget) {
            if ((st = fy_backend_mem_info(be, &total, &avail))) goto fail;
            budget = (int64_t)((double)avail * p.kv_mem_fraction);
        }
        size_t all_layers = r->kv.block_bytes * (size_t)r->kv.n_groups;
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
    /* the pool counts pages of one KV group; a block of every layer is
     * n_groups of them (the same bytes) */
    size_t arena_bytes;
    if ((int64_t)p.n_kv_blocks * r->kv.n_groups > INT32_MAX / 2 ||
        (int64_t)p.n_host_blocks * r->kv.n_groups > INT32_MAX / 2 ||
        !fy_mul_size((size_t)p.n_kv_blocks * (size_t)r->kv.n_groups, r->kv.block_bytes, &arena_bytes)) {
        fy_error("runner: kv arena of %d blocks (or a host tier of %d) overflows", p.n_kv_blocks, p.n_host_blocks);
        st = FY_ERR_INVALID;
        goto fail;
    }
    r->n_pages = p.n_kv_blocks * r->kv.n_groups;
    r->n_host_pages = p.n_host_blocks * r->kv.n_groups;
    if ((st = fy_backend_alloc(be, arena_bytes, &r->arena))) goto fail;
    if (p.n_host_blocks > 0) {
        size_t host_bytes;
        if (!fy_mul_size((size_t)r->n_host_pages, r->kv.block_bytes, &host_bytes)) {
            fy_error("runner: host kv tier of %d blocks overflows", p.n_host_blocks);
            st = FY_ERR_INVALID;
            goto fail;
        }
        if ((st = fy_backend_alloc_host(be, host_bytes, &r->host_arena))) goto fail;
    }

    size_t T = (size_t)p.max_batch_tokens, L = (size_t)p.max_logits;
    size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    if ((st = dev_alloc(r, T * c->dim, &r->x)) || (st = dev_alloc(r, T * c->dim, &r->xb)) ||
        (st = dev_alloc(r, T * c->dim, &r->xb2)) || (st = dev_alloc(r, T * qd, &r->q)) ||
        (st = dev_alloc(r, T * qd, &r->att)) || (st = dev_alloc(r, T * kvd, &r->k)) ||
        (st = dev_alloc(r, T * kvd, &r->v)) || (st = dev_alloc(r, T * c->ffn_dim, &r->hb)) ||
        (st = dev_alloc(r, T * c->ffn_dim, &r->hb2)) || (st = dev_alloc(r, L * c->dim, &r->xl)) ||
        (st = dev_alloc(r, L * c->vocab_size, &r->logits)))
        goto fail;

    r->tokens = fy_calloc(T, sizeof(int32_t));
    r->pos = fy_calloc(T, sizeof(int32_t));
    r->slots = fy_calloc(T * (size_t)r->kv.n_groups, sizeof(int32_t));
    r->logit_rows = fy_calloc(L, sizeof(int32_t));
    r->scores_stride = (p.max_ctx + p.block_size - 1) / p.block_size;
    r->scores = fy_calloc((size_t)p.max_seqs * (size_t)r->scores_stride, sizeof(float));
    r->seqs = fy_calloc((size_t)p.max_seqs, sizeof(fy_attn_seq_t));
    if (!r->tokens || !r->pos || !r->slots || !r->logit_rows || !r->seqs || !r->scores) {
        fy_error("runner: out of memory for batch metadata");
        st = FY_ERR_NOMEM;
        goto fail;
    }
    int32_t max_row = c->dim;
    if (c->ffn_dim > max_row) max_row = c->ffn_dim;
    if ((int32_t)qd > max_row) max_row = (int32_t)qd;
    int32_t blocks_per_seq = (p.max_ctx + p.block_size - 1) / p.block_size;
    fy_backend_reserve_t res = {
        .max_tokens = p.max_batch_tokens,
        .max_row = max_row,
        .max_seqs = p.max_seqs,
        .max_blocks = p.max_seqs * blocks_per_seq * r->kv.n_groups,
        .n_groups = r->kv.n_groups,
        .max_kv_len = p.max_ctx,
        .n_heads = c->n_heads,
        .head_dim = c->head_dim,
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
#undef RES_MAX
    }
    if ((st = fy_backend_reserve(be, &res))) goto fail;
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
    return runner_create(model, be, params, fy_model_config(model)->n_layers, NULL, NULL, runner_p);
}

fy_status_t fy_runner_create_draft(fy_runner_t *target, const fy_model_t *draft_model, int32_t n_layers,
                                   const fy_runner_params_t *params, fy_runner_t **runner_p)
{
    const fy_model_t *m = draft_model ? draft_model : target->model;
    const fy_model_config_t *c = fy_model_config(m);
    bool self = m == target->model;
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
    return runner_create(m, target->be, params, n_layers, self ? target : NULL, &target->res, runner_p);
}

int32_t fy_runner_n_layers(const fy_runner_t *r) { return r->n_layers; }

void fy_runner_destroy(fy_runner_t *r)
{
    if (!r) return;
    float *bufs[] = {r->x, r->xb, r->xb2, r->q, r->att, r->k, r->v, r->hb, r->hb2, r->xl, r->logits};
    for (size_t i = 0; i < FY_ARRAY_LEN(bufs); i++) fy_backend_free(r->be, bufs[i]);
    fy_backend_free(r->be, r->arena);
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
    fy_backend_release_tensor(r->be, &r->tok_embd);
    fy_backend_release_tensor(r->be, &r->out_norm);
    fy_backend_release_tensor(r->be, &r->output);
    fy_free(r->layers);
    fy_free(r->tokens);
    fy_free(r->pos);
    fy_free(r->slots);
    fy_free(r->logit_rows);
    fy_free(r->scores);
    fy_free(r->seqs);
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

fy_status_t fy_runner_forward(fy_runner_t *r, const fy_forward_seq_t *seqs, int32_t n_seqs, float *logits)
{
    const fy_model_config_t *c = r->cfg;
    const fy_arch_traits_t *a = &c->traits;
    fy_backend_t *be = r->be;
    int32_t n, nl;
    fy_status_t st = build_batch(r, seqs, n_seqs, &n, &nl);
    if (st != FY_OK) return st;
    /* the groups' slots, packed [n_groups][n] */
    for (int32_t g = 1; g < r->kv.n_groups; g++)
        memmove(r->slots + (size_t)g * n, r->slots + (size_t)g * r->p.max_batch_tokens, (size_t)n * sizeof(int32_t));
    fy_batch_meta_t meta = {
        .n_tokens = n,
        .n_groups = r->kv.n_groups,
        .tokens = r->tokens,
        .pos = r->pos,
        .slots = r->slots,
        .n_seqs = n_seqs,
        .seqs = r->seqs,
    };
    const size_t dim = (size_t)c->dim, nd = (size_t)n * dim, nf = (size_t)n * (size_t)c->ffn_dim;
    if ((st = fy_backend_set_batch(be, &meta))) return st;
    bool scores = false;
    for (int32_t s = 0; s < n_seqs; s++) scores |= seqs[s].scores != NULL;
    if (scores) { /* H2O: the kernel adds each block's attention mass here (set_batch turned it off) */
        memset(r->scores, 0, (size_t)n_seqs * (size_t)r->scores_stride * sizeof(float));
        if ((st = fy_backend_set_attn_scores(be, r->scores, r->scores_stride))) return st;
    }
    if ((st = fy_backend_embed(be, &r->tok_embd, r->x))) return st;
    if (c->embed_scale != 1.0f && (st = fy_backend_scale(be, r->x, c->embed_scale, nd))) return st;

    for (int32_t l = 0; l < r->n_layers; l++) {
        const fy_layer_weights_t *L = &r->layers[l];
        const fy_layer_config_t *D = &c->layer[l];
        const fy_tensor_t *qkv_w[3] = {&L->wq, &L->wk, &L->wv};
        float *qkv_y[3] = {r->q, r->k, r->v};
        const fy_tensor_t *gu_w[2] = {&L->w_gate, &L->w_up};
        float *gu_y[2] = {r->hb, r->hb2};
        const fy_tensor_t *o_w[1] = {&L->wo}, *d_w[1] = {&L->w_down};
        float *xb2[1] = {r->xb2};
        /* attention */
        if ((st = fy_backend_rmsnorm_matmul(be, r->x, &L->attn_norm, c->norm_eps, 3, qkv_w, n, r->xb, qkv_y)))
            return st;
        if (a->qkv_bias &&
            ((st = fy_backend_add_bias(be, r->q, &L->bq, n)) || (st = fy_backend_add_bias(be, r->k, &L->bk, n)) ||
             (st = fy_backend_add_bias(be, r->v, &L->bv, n))))
            return st;
        if (a->qk_norm && ((st = fy_backend_rmsnorm(be, r->q, &L->q_norm, n * c->n_heads, c->norm_eps, r->q)) ||
                           (st = fy_backend_rmsnorm(be, r->k, &L->k_norm, n * c->n_kv_heads, c->norm_eps, r->k))))
            return st;
        if ((st = fy_backend_rope(be, r->q, r->k, c->n_heads, c->n_kv_heads, c->head_dim, &D->rope)) ||
            (st = fy_backend_kv_write(be, &r->kv, r->arena, l, r->k, r->v)) ||
            (st = fy_backend_attention(be, &r->kv, r->arena, l, c->n_heads, c->attn_scale, D->window, r->q, r->att)) ||
            (st = fy_backend_matmul(be, 1, o_w, r->att, n, xb2)))
            return st;
        if (a->post_norms && (st = fy_backend_rmsnorm(be, r->xb2, &L->post_attn_norm, n, c->norm_eps, r->xb2)))
            return st;
        if ((st = fy_backend_add(be, r->x, r->xb2, nd))) return st;
        /* MLP */
        if ((st = fy_backend_rmsnorm_matmul(be, r->x, &L->ffn_norm, c->norm_eps, 2, gu_w, n, r->xb, gu_y)) ||
            (st = a->act == FY_ACT_GELU_TANH ? fy_backend_geglu(be, r->hb, r->hb2, r->hb, nf)
                                             : fy_backend_swiglu(be, r->hb, r->hb2, r->hb, nf)) ||
            (st = fy_backend_matmul(be, 1, d_w, r->hb, n, xb2)))
            return st;
        if (a->post_norms && (st = fy_backend_rmsnorm(be, r->xb2, &L->post_ffn_norm, n, c->norm_eps, r->xb2)))
            return st;
        if ((st = fy_backend_add(be, r->x, r->xb2, nd))) return st;
    }
    if (nl == 0) return finish(r, seqs, n_seqs, scores);
    const fy_tensor_t *out_w[1] = {&r->output};
    float *out_y[1] = {r->logits};
    if ((st = fy_backend_get_rows(be, r->x, r->logit_rows, nl, c->dim, r->xl)) ||
        (st = fy_backend_rmsnorm_matmul(be, r->xl, &r->out_norm, c->norm_eps, 1, out_w, nl, r->xl, out_y)) ||
        (st =
             fy_backend_memcpy(be, logits, r->logits, (size_t)nl * (size_t)c->vocab_size * sizeof(float), FY_COPY_D2H)))
        return st;
    return finish(r, seqs, n_seqs, scores);
}

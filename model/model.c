/*
 * model.c - loading a Llama-family model from GGUF or from a Hugging Face
 * folder, with every tensor checked for presence, type and shape.
 *
 * Weights stay in the mapped files; only 1-D norm weights stored in 16-bit
 * types are converted to an owned f32 copy (kernels take f32 norms).
 */
#include "model.h"

#include <sodium.h>

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf.h"
#include "log.h"
#include "mem.h"
#include "safetensors.h"

struct fy_model {
    char *path;
    fy_model_config_t cfg;
    fy_model_weights_t w;
    fy_tokenizer_t *tokenizer;
    fy_chat_template_t *chat;
    fy_gguf_t *gguf;
    fy_safetensors_t *st;
    float **owned; /* f32 copies of 16-bit norm weights */
    int n_owned;
};

/* ---- configuration ---------------------------------------------------------- */

fy_status_t fy_model_config_check(const fy_model_config_t *c, const char *path)
{
#define CHECK(cond, ...)                                                                                               \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            char m_[256];                                                                                              \
            snprintf(m_, sizeof(m_), __VA_ARGS__);                                                                     \
            fy_error("model: %s: %s", path, m_);                                                                       \
            return FY_ERR_FORMAT;                                                                                      \
        }                                                                                                              \
    } while (0)
    CHECK(c->n_layers >= 1 && c->n_layers <= 1024, "absurd layer count %d", c->n_layers);
    CHECK(c->dim >= 1 && c->dim <= 65536, "absurd embedding width %d", c->dim);
    CHECK(c->n_heads >= 1 && c->n_heads <= 1024, "absurd attention head count %d", c->n_heads);
    CHECK(c->n_kv_heads >= 1 && c->n_kv_heads <= c->n_heads && c->n_heads % c->n_kv_heads == 0,
          "key/value head count %d does not divide the head count %d", c->n_kv_heads, c->n_heads);
    CHECK(c->head_dim >= 2 && c->head_dim <= 1024 && c->head_dim % 2 == 0, "absurd head size %d", c->head_dim);
    CHECK(c->ffn_dim >= 1 && c->ffn_dim <= (1 << 20), "absurd feed-forward width %d", c->ffn_dim);
    CHECK(c->vocab_size >= 1 && c->vocab_size <= (1 << 22), "absurd vocabulary size %d", c->vocab_size);
    CHECK(c->max_ctx >= 1 && c->max_ctx <= (1 << 24), "absurd context length %d", c->max_ctx);
    CHECK(isfinite(c->rope_theta) && c->rope_theta > 0, "rope theta %g is not a positive number",
          (double)c->rope_theta);
    CHECK(isfinite(c->norm_eps) && c->norm_eps > 0 && c->norm_eps < 1, "rms norm epsilon %g out of range",
          (double)c->norm_eps);
#undef CHECK
    return FY_OK;
}

const fy_model_config_t *fy_model_config(const fy_model_t *m) { return &m->cfg; }
const fy_model_weights_t *fy_model_weights(const fy_model_t *m) { return &m->w; }
const fy_tokenizer_t *fy_model_tokenizer(const fy_model_t *m) { return m->tokenizer; }
const fy_chat_template_t *fy_model_chat_template(const fy_model_t *m) { return m->chat; }

size_t fy_model_weight_bytes_per_token(const fy_model_t *m)
{
    size_t total = m->w.out_norm.nbytes + m->w.output.nbytes;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const fy_layer_weights_t *L = &m->w.layers[l];
        total += L->attn_norm.nbytes + L->wq.nbytes + L->wk.nbytes + L->wv.nbytes + L->wo.nbytes + L->ffn_norm.nbytes +
                 L->w_gate.nbytes + L->w_up.nbytes + L->w_down.nbytes;
    }
    return total;
}

void fy_model_describe(const fy_model_t *m, char *buf, size_t cap)
{
    const fy_model_config_t *c = &m->cfg;
    snprintf(buf, cap,
             "%s (%s): %d layers, dim %d, %d heads / %d kv heads of %d, ffn %d, vocab %d, ctx %d, "
             "weights %s/%s, %.1f MiB read per token",
             c->name, c->arch, c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->head_dim, c->ffn_dim, c->vocab_size,
             c->max_ctx, fy_dtype_name(m->w.layers[0].wq.dtype), fy_dtype_name(m->w.output.dtype),
             (double)fy_model_weight_bytes_per_token(m) / (1 << 20));
}

/* ---- shared tensor checks --------------------------------------------------- */

/* A source-independent view of one stored tensor. */
typedef struct raw_tensor {
    bool found;
    bool supported;
    const char *type_name;
    fy_dtype_t dtype;
    int n_dims;
    int64_t ne[4]; /* innermost first */
    const void *data;
    uint64_t nbytes;
} raw_tensor_t;

typedef fy_status_t (*find_fn)(fy_model_t *m, const char *name, raw_tensor_t *t);

static fy_status_t own_f32(fy_model_t *m, const raw_tensor_t *r, fy_tensor_t *t)
{
    float **owned = fy_realloc(m->owned, (size_t)(m->n_owned + 1) * sizeof(*owned));
    if (!owned) return FY_ERR_NOMEM;
    m->owned = owned;
    float *f = fy_malloc((size_t)r->ne[0] * sizeof(float));
    if (!f) return FY_ERR_NOMEM;
    m->owned[m->n_owned++] = f;
    fy_dequantize_row(r->dtype, r->data, f, r->ne[0]);
    t->dtype = FY_DTYPE_F32;
    t->row_bytes = t->nbytes = (size_t)r->ne[0] * sizeof(float);
    t->data = f;
    return FY_OK;
}

/* Looks up a tensor that must have shape (ne1 rows of ne0), ne1 = 0 for a
 * vector.  optional: absence is not an error (*present_p says). */
static fy_status_t get_tensor(fy_model_t *m, find_fn find, const char *name, int64_t ne0, int64_t ne1, fy_tensor_t *t,
                              bool optional, bool *present_p)
{
    raw_tensor_t r = {0};
    fy_status_t st = find(m, name, &r);
    if (st != FY_OK) return st;
    if (present_p) *present_p = r.found;
    if (!r.found) {
        if (optional) return FY_OK;
        fy_error("model: %s: missing tensor '%s'", m->path, name);
        return FY_ERR_FORMAT;
    }
    if (!r.supported) {
        fy_error("model: %s: tensor '%s' has type %s, which ferry does not support "
                 "(f32, f16, bf16, q8_0, q5_0, q5_1, q4_0, q4_1, iq4_nl, q2_k..q6_k)",
                 m->path, name, r.type_name);
        return FY_ERR_UNSUPPORTED;
    }
    int want_dims = ne1 ? 2 : 1;
    bool ok = r.n_dims == want_dims && r.ne[0] == ne0 && (!ne1 || r.ne[1] == ne1);
    if (!ok) {
        char got[96] = "", want[64];
        int n = 0;
        for (int d = r.n_dims - 1; d >= 0; d--)
            n +=
                snprintf(got + n, sizeof(got) - (size_t)n, "%s%lld", d == r.n_dims - 1 ? "" : ", ", (long long)r.ne[d]);
        if (ne1)
            snprintf(want, sizeof(want), "%lld, %lld", (long long)ne1, (long long)ne0);
        else
            snprintf(want, sizeof(want), "%lld", (long long)ne0);
        fy_error("model: %s: tensor '%s' has shape [%s], expected [%s] (rows, columns)", m->path, name, got, want);
        return FY_ERR_FORMAT;
    }
    memset(t, 0, sizeof(*t));
    t->dtype = r.dtype;
    t->ne[0] = ne0;
    t->ne[1] = ne1 ? ne1 : 1;
    if (fy_dtype_row_bytes(r.dtype, ne0, &t->row_bytes) != FY_OK) {
        fy_error("model: %s: tensor '%s': rows of %lld elements are not whole %s blocks", m->path, name, (long long)ne0,
                 fy_dtype_name(r.dtype));
        return FY_ERR_FORMAT;
    }
    t->nbytes = (size_t)r.nbytes;
    t->data = r.data;
    if (t->row_bytes * (size_t)t->ne[1] != t->nbytes) {
        fy_error("model: %s: tensor '%s' holds %llu bytes, expected %zu", m->path, name, (unsigned long long)r.nbytes,
                 t->row_bytes * (size_t)t->ne[1]);
        return FY_ERR_FORMAT;
    }
    /* norms are read by plain f32 loops: 16-bit ones and any at an odd
     * address (safetensors does not align data) get an aligned f32 copy */
    if (!ne1 && (r.dtype != FY_DTYPE_F32 || (uintptr_t)r.data % sizeof(float))) {
        if (fy_dtype_is_quantized(r.dtype)) {
            fy_error("model: %s: norm tensor '%s' is quantized (%s); expected a float type", m->path, name,
                     fy_dtype_name(r.dtype));
            return FY_ERR_UNSUPPORTED;
        }
        if (own_f32(m, &r, t) != FY_OK) {
            fy_error("model: %s: out of memory converting '%s'", m->path, name);
            return FY_ERR_NOMEM;
        }
    }
    return FY_OK;
}

typedef struct tensor_names {
    const char *tok_embd, *out_norm, *output;
    const char *attn_norm, *wq, *wk, *wv, *wo, *ffn_norm, *w_gate, *w_up, *w_down; /* with %d */
} tensor_names_t;

static const tensor_names_t g_gguf_names = {
    "token_embd.weight",      "output_norm.weight",     "output.weight",        "blk.%d.attn_norm.weight",
    "blk.%d.attn_q.weight",   "blk.%d.attn_k.weight",   "blk.%d.attn_v.weight", "blk.%d.attn_output.weight",
    "blk.%d.ffn_norm.weight", "blk.%d.ffn_gate.weight", "blk.%d.ffn_up.weight", "blk.%d.ffn_down.weight",
};

static const tensor_names_t g_hf_names = {
    "model.embed_tokens.weight",
    "model.norm.weight",
    "lm_head.weight",
    "model.layers.%d.input_layernorm.weight",
    "model.layers.%d.self_attn.q_proj.weight",
    "model.layers.%d.self_attn.k_proj.weight",
    "model.layers.%d.self_attn.v_proj.weight",
    "model.layers.%d.self_attn.o_proj.weight",
    "model.layers.%d.post_attention_layernorm.weight",
    "model.layers.%d.mlp.gate_proj.weight",
    "model.layers.%d.mlp.up_proj.weight",
    "model.layers.%d.mlp.down_proj.weight",
};

/* Fills m->w from the tensors; decides tying when tie_hint < 0 (GGUF: tied
 * when there is no output tensor). */
static fy_status_t load_weights(fy_model_t *m, find_fn find, const tensor_names_t *nm, int tie_hint)
{
    fy_model_config_t *c = &m->cfg;
    fy_status_t st;
    int64_t q_rows = (int64_t)c->n_heads * c->head_dim, kv_rows = (int64_t)c->n_kv_heads * c->head_dim;
    if ((st = get_tensor(m, find, nm->tok_embd, c->dim, c->vocab_size, &m->w.tok_embd, false, NULL))) return st;
    if ((st = get_tensor(m, find, nm->out_norm, c->dim, 0, &m->w.out_norm, false, NULL))) return st;
    bool has_output = false;
    if ((st = get_tensor(m, find, nm->output, c->dim, c->vocab_size, &m->w.output, true, &has_output))) return st;
    if (!has_output) {
        if (tie_hint == 0) {
            fy_error("model: %s: missing tensor '%s' (and the config does not tie embeddings)", m->path, nm->output);
            return FY_ERR_FORMAT;
        }
        m->w.output = m->w.tok_embd;
    }
    c->tied_embeddings = !has_output;

    m->w.layers = fy_calloc((size_t)c->n_layers, sizeof(*m->w.layers));
    if (!m->w.layers) {
        fy_error("model: %s: out of memory", m->path);
        return FY_ERR_NOMEM;
    }
    for (int l = 0; l < c->n_layers; l++) {
        fy_layer_weights_t *L = &m->w.layers[l];
        struct {
            const char *fmt;
            int64_t ne0, ne1;
            fy_tensor_t *t;
        } want[] = {
            {nm->attn_norm, c->dim, 0, &L->attn_norm},
            {nm->wq, c->dim, q_rows, &L->wq},
            {nm->wk, c->dim, kv_rows, &L->wk},
            {nm->wv, c->dim, kv_rows, &L->wv},
            {nm->wo, q_rows, c->dim, &L->wo},
            {nm->ffn_norm, c->dim, 0, &L->ffn_norm},
            {nm->w_gate, c->dim, c->ffn_dim, &L->w_gate},
            {nm->w_up, c->dim, c->ffn_dim, &L->w_up},
            {nm->w_down, c->ffn_dim, c->dim, &L->w_down},
        };
        for (size_t i = 0; i < FY_ARRAY_LEN(want); i++) {
            char name[128];
            snprintf(name, sizeof(name), want[i].fmt, l);
            if ((st = get_tensor(m, find, name, want[i].ne0, want[i].ne1, want[i].t, false, NULL))) return st;
        }
    }
    return FY_OK;
}

static fy_status_t chat_from_tokenizer(fy_model_t *m, const char *tmpl_src)
{
    const char *bos = NULL, *eos = NULL;
    int32_t b = fy_tokenizer_bos(m->tokenizer), e = fy_tokenizer_eos(m->tokenizer);
    if (b >= 0) bos = fy_tokenizer_piece(m->tokenizer, b);
    if (e >= 0) eos = fy_tokenizer_piece(m->tokenizer, e);
    fy_status_t st = fy_chat_template_create(tmpl_src, bos, eos, &m->chat);
    if (st != FY_OK && tmpl_src) {
        fy_warn("model: %s: cannot use the model's chat template (see above); falling back to chatml", m->path);
        st = fy_chat_template_create(NULL, bos, eos, &m->chat);
    }
    return st;
}

/* ---- GGUF ------------------------------------------------------------------- */

static fy_status_t gguf_find(fy_model_t *m, const char *name, raw_tensor_t *r)
{
    const fy_gguf_tensor_t *t = fy_gguf_find_tensor(m->gguf, name);
    if (!t) return FY_OK;
    r->found = true;
    r->supported = t->supported;
    r->type_name = fy_gguf_ggml_type_name(t->ggml_type);
    r->dtype = t->dtype;
    r->n_dims = (int)t->n_dims;
    for (int d = 0; d < 4; d++) r->ne[d] = t->ne[d];
    r->data = t->data;
    r->nbytes = t->nbytes;
    return FY_OK;
}

static fy_status_t gguf_u32(fy_model_t *m, const char *key, bool required, uint32_t dflt, int32_t *out)
{
    uint32_t v = dflt;
    fy_status_t st = fy_gguf_get_u32(m->gguf, key, &v);
    if (st == FY_ERR_NOT_FOUND) {
        if (required) {
            fy_error("model: %s: missing metadata '%s'", m->path, key);
            return FY_ERR_FORMAT;
        }
        v = dflt;
    } else if (st != FY_OK) {
        return st;
    }
    if (v > INT32_MAX) {
        fy_error("model: %s: metadata '%s' = %u is absurd", m->path, key, v);
        return FY_ERR_FORMAT;
    }
    *out = (int32_t)v;
    return FY_OK;
}

static fy_status_t load_gguf(fy_model_t *m)
{
    fy_status_t st = fy_gguf_open(m->path, &m->gguf);
    if (st != FY_OK) return st;
    fy_gguf_t *g = m->gguf;
    fy_model_config_t *c = &m->cfg;
    fy_str_t s;
    if ((st = fy_gguf_get_str(g, "general.architecture", &s)) != FY_OK) {
        if (st == FY_ERR_NOT_FOUND) fy_error("model: %s: missing metadata 'general.architecture'", m->path);
        return FY_ERR_FORMAT;
    }
    snprintf(c->arch, sizeof(c->arch), "%.*s", (int)FY_MIN(s.len, 31), s.ptr);
    if (strcmp(c->arch, "llama") != 0) {
        fy_error("model: %s: architecture '%s' is not supported (ferry runs 'llama')", m->path, c->arch);
        return FY_ERR_UNSUPPORTED;
    }
    if (fy_gguf_get_str(g, "general.name", &s) == FY_OK)
        snprintf(c->name, sizeof(c->name), "%.*s", (int)FY_MIN(s.len, 127), s.ptr);
    else
        snprintf(c->name, sizeof(c->name), "%s", "unnamed");

    int32_t rope_dims = 0, key_len = 0;
    if ((st = gguf_u32(m, "llama.block_count", true, 0, &c->n_layers)) ||
        (st = gguf_u32(m, "llama.embedding_length", true, 0, &c->dim)) ||
        (st = gguf_u32(m, "llama.feed_forward_length", true, 0, &c->ffn_dim)) ||
        (st = gguf_u32(m, "llama.attention.head_count", true, 0, &c->n_heads)) ||
        (st = gguf_u32(m, "llama.context_length", false, 4096, &c->max_ctx)))
        return st;
    if ((st = gguf_u32(m, "llama.attention.head_count_kv", false, (uint32_t)c->n_heads, &c->n_kv_heads))) return st;
    if (c->n_heads <= 0 || c->dim % c->n_heads) {
        fy_error("model: %s: embedding width %d is not a multiple of the head count %d", m->path, c->dim, c->n_heads);
        return FY_ERR_FORMAT;
    }
    if ((st = gguf_u32(m, "llama.attention.key_length", false, (uint32_t)(c->dim / c->n_heads), &key_len))) return st;
    c->head_dim = key_len;
    int32_t val_len;
    if ((st = gguf_u32(m, "llama.attention.value_length", false, (uint32_t)key_len, &val_len))) return st;
    if (val_len != key_len) {
        fy_error("model: %s: key length %d differs from value length %d (unsupported)", m->path, key_len, val_len);
        return FY_ERR_UNSUPPORTED;
    }
    if ((st = gguf_u32(m, "llama.rope.dimension_count", false, (uint32_t)c->head_dim, &rope_dims))) return st;
    if (rope_dims != c->head_dim) {
        fy_error("model: %s: partial rotary embedding (%d of %d dims) is not supported", m->path, rope_dims,
                 c->head_dim);
        return FY_ERR_UNSUPPORTED;
    }
    c->rope_theta = 10000.0f;
    c->norm_eps = 1e-5f;
    if ((st = fy_gguf_get_f32(g, "llama.rope.freq_base", &c->rope_theta)) && st != FY_ERR_NOT_FOUND) return st;
    if ((st = fy_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &c->norm_eps)) && st != FY_ERR_NOT_FOUND)
        return st;
    if (fy_gguf_has_key(g, "llama.rope.scaling.type")) {
        fy_str_t t;
        if (fy_gguf_get_str(g, "llama.rope.scaling.type", &t) == FY_OK && !fy_str_eq(t, "none")) {
            fy_error("model: %s: rope scaling '%.*s' is not supported", m->path, (int)FY_MIN(t.len, 32), t.ptr);
            return FY_ERR_UNSUPPORTED;
        }
    }
    if (fy_gguf_find_tensor(g, "rope_freqs.weight")) {
        fy_error("model: %s: per-frequency rope factors (llama 3.1 rope scaling) are not supported", m->path);
        return FY_ERR_UNSUPPORTED;
    }
    c->rope_style = FY_ROPE_NORM;
    const fy_gguf_tensor_t *emb = fy_gguf_find_tensor(g, "token_embd.weight");
    if (!emb) {
        fy_error("model: %s: missing tensor 'token_embd.weight'", m->path);
        return FY_ERR_FORMAT;
    }
    if (emb->n_dims != 2 || emb->ne[1] > INT32_MAX) {
        fy_error("model: %s: tensor 'token_embd.weight' is not a 2-d matrix", m->path);
        return FY_ERR_FORMAT;
    }
    c->vocab_size = (int32_t)emb->ne[1];
    int32_t vocab_meta;
    if ((st = gguf_u32(m, "llama.vocab_size", false, (uint32_t)c->vocab_size, &vocab_meta))) return st;
    if (vocab_meta != c->vocab_size) {
        fy_error("model: %s: llama.vocab_size %d disagrees with the embedding's %d rows", m->path, vocab_meta,
                 c->vocab_size);
        return FY_ERR_FORMAT;
    }
    if ((st = fy_model_config_check(c, m->path))) return st;
    if ((st = load_weights(m, gguf_find, &g_gguf_names, -1))) return st;
    if ((st = fy_tokenizer_from_gguf(g, &m->tokenizer))) return st;

    char *tmpl = NULL;
    if (fy_gguf_get_str(g, "tokenizer.chat_template", &s) == FY_OK) {
        tmpl = fy_strndup(s.ptr, (size_t)s.len);
        if (!tmpl) return FY_ERR_NOMEM;
    }
    st = chat_from_tokenizer(m, tmpl);
    fy_free(tmpl);
    return st;
}

/* ---- Hugging Face folder ------------------------------------------------------ */

static fy_status_t st_find(fy_model_t *m, const char *name, raw_tensor_t *r)
{
    const fy_st_tensor_t *t = fy_safetensors_find(m->st, name);
    if (!t) return FY_OK;
    r->found = true;
    r->supported = t->supported;
    r->type_name = t->dtype_name;
    r->dtype = t->dtype;
    r->n_dims = t->n_dims;
    for (int d = 0; d < t->n_dims; d++) r->ne[d] = t->shape[t->n_dims - 1 - d];
    r->data = t->data;
    r->nbytes = t->nbytes;
    return FY_OK;
}

static fy_status_t json_int(fy_model_t *m, json_t *cfg, const char *key, bool required, int64_t dflt, int32_t *out)
{
    json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v)) {
        if (required) {
            fy_error("model: %s: config.json has no '%s'", m->path, key);
            return FY_ERR_FORMAT;
        }
        *out = (int32_t)dflt;
        return FY_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
        fy_error("model: %s: config.json '%s' is not a non-negative 32-bit integer", m->path, key);
        return FY_ERR_FORMAT;
    }
    *out = (int32_t)json_integer_value(v);
    return FY_OK;
}

static fy_status_t json_float(fy_model_t *m, json_t *cfg, const char *key, float dflt, float *out)
{
    json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return FY_OK;
    }
    if (!json_is_number(v)) {
        fy_error("model: %s: config.json '%s' is not a number", m->path, key);
        return FY_ERR_FORMAT;
    }
    *out = (float)json_number_value(v);
    return FY_OK;
}

static fy_status_t hf_config(fy_model_t *m, json_t *cfg, bool *tie_p)
{
    fy_model_config_t *c = &m->cfg;
    fy_status_t st;
    if (!json_is_object(cfg)) {
        fy_error("model: %s: config.json is not a json object", m->path);
        return FY_ERR_FORMAT;
    }
    json_t *mt = json_object_get(cfg, "model_type");
    const char *type = json_is_string(mt) ? json_string_value(mt) : "";
    if (strcmp(type, "llama") != 0 && strcmp(type, "mistral") != 0) {
        fy_error("model: %s: model_type '%s' is not supported (ferry runs llama and mistral)", m->path, type);
        return FY_ERR_UNSUPPORTED;
    }
    snprintf(c->arch, sizeof(c->arch), "%s", "llama");
    const char *base = strrchr(m->path, '/');
    snprintf(c->name, sizeof(c->name), "%s", base && base[1] ? base + 1 : m->path);
    if ((st = json_int(m, cfg, "num_hidden_layers", true, 0, &c->n_layers)) ||
        (st = json_int(m, cfg, "hidden_size", true, 0, &c->dim)) ||
        (st = json_int(m, cfg, "intermediate_size", true, 0, &c->ffn_dim)) ||
        (st = json_int(m, cfg, "num_attention_heads", true, 0, &c->n_heads)) ||
        (st = json_int(m, cfg, "vocab_size", true, 0, &c->vocab_size)) ||
        (st = json_int(m, cfg, "max_position_embeddings", false, 4096, &c->max_ctx)))
        return st;
    if ((st = json_int(m, cfg, "num_key_value_heads", false, c->n_heads, &c->n_kv_heads))) return st;
    if (c->n_heads <= 0 || c->dim % c->n_heads) {
        fy_error("model: %s: hidden_size %d is not a multiple of num_attention_heads %d", m->path, c->dim, c->n_heads);
        return FY_ERR_FORMAT;
    }
    if ((st = json_int(m, cfg, "head_dim", false, c->dim / c->n_heads, &c->head_dim))) return st;
    if ((st = json_float(m, cfg, "rope_theta", 10000.0f, &c->rope_theta)) ||
        (st = json_float(m, cfg, "rms_norm_eps", 1e-6f, &c->norm_eps)))
        return st;
    json_t *rs = json_object_get(cfg, "rope_scaling");
    if (rs && !json_is_null(rs)) {
        json_t *t = json_object_get(rs, "rope_type");
        if (!t) t = json_object_get(rs, "type");
        const char *ts = json_is_string(t) ? json_string_value(t) : "?";
        if (strcmp(ts, "default") != 0) {
            fy_error("model: %s: rope_scaling '%s' is not supported", m->path, ts);
            return FY_ERR_UNSUPPORTED;
        }
    }
    json_t *bias = json_object_get(cfg, "attention_bias");
    if (json_is_true(bias)) {
        fy_error("model: %s: attention biases are not supported", m->path);
        return FY_ERR_UNSUPPORTED;
    }
    json_t *tie = json_object_get(cfg, "tie_word_embeddings");
    *tie_p = json_is_true(tie);
    c->rope_style = FY_ROPE_NEOX;
    return fy_model_config_check(c, m->path);
}

static char *read_template(fy_model_t *m, const char *cfg_path)
{
    json_error_t jerr;
    json_t *root = json_load_file(cfg_path, 0, &jerr);
    if (!root) return NULL;
    json_t *t = json_object_get(root, "chat_template");
    const char *src = NULL;
    if (json_is_string(t)) {
        src = json_string_value(t);
    } else if (json_is_array(t)) { /* [{name, template}, ...]: take "default" */
        size_t i;
        json_t *e;
        json_array_foreach(t, i, e)
        {
            json_t *n = json_object_get(e, "name");
            if (json_is_string(n) && !strcmp(json_string_value(n), "default"))
                src = json_string_value(json_object_get(e, "template"));
        }
    }
    char *out = src ? fy_strdup(src) : NULL;
    json_decref(root);
    (void)m;
    return out;
}

static fy_status_t load_hf(fy_model_t *m)
{
    char p[PATH_MAX], p2[PATH_MAX];
    snprintf(p, sizeof(p), "%s/config.json", m->path);
    json_error_t jerr;
    json_t *cfg = json_load_file(p, 0, &jerr);
    if (!cfg) {
        fy_error("model: %s: cannot read config.json: %s", m->path, jerr.text);
        return access(p, F_OK) ? FY_ERR_NOT_FOUND : FY_ERR_FORMAT;
    }
    bool tie = false;
    fy_status_t st = hf_config(m, cfg, &tie);
    json_decref(cfg);
    if (st != FY_OK) return st;
    if ((st = fy_safetensors_open(m->path, &m->st))) return st;
    if ((st = load_weights(m, st_find, &g_hf_names, tie ? 1 : 0))) return st;
    snprintf(p, sizeof(p), "%s/tokenizer.json", m->path);
    snprintf(p2, sizeof(p2), "%s/tokenizer_config.json", m->path);
    bool have_cfg = access(p2, R_OK) == 0;
    if ((st = fy_tokenizer_from_json(p, have_cfg ? p2 : NULL, &m->tokenizer))) return st;
    char *tmpl = have_cfg ? read_template(m, p2) : NULL;
    st = chat_from_tokenizer(m, tmpl);
    fy_free(tmpl);
    return st;
}

/* ---- entry points ------------------------------------------------------------ */

fy_status_t fy_model_load(const char *path, fy_model_t **model_p)
{
    fy_model_t *m = fy_calloc(1, sizeof(*m));
    if (!m || !(m->path = fy_strdup(path))) {
        fy_free(m);
        fy_error("model: %s: out of memory", path);
        return FY_ERR_NOMEM;
    }
    struct stat sb;
    fy_status_t st;
    if (stat(path, &sb) != 0) {
        fy_error("model: %s: %m", path);
        st = FY_ERR_NOT_FOUND;
    } else if (S_ISDIR(sb.st_mode)) {
        st = load_hf(m);
    } else {
        st = load_gguf(m);
    }
    if (st == FY_OK && fy_tokenizer_vocab_size(m->tokenizer) > m->cfg.vocab_size) {
        fy_error("model: %s: the tokenizer has %d tokens but the model only %d", path,
                 fy_tokenizer_vocab_size(m->tokenizer), m->cfg.vocab_size);
        st = FY_ERR_FORMAT;
    }
    if (st != FY_OK) {
        fy_model_destroy(m);
        return st;
    }
    *model_p = m;
    return FY_OK;
}

void fy_model_destroy(fy_model_t *m)
{
    if (!m) return;
    fy_chat_template_destroy(m->chat);
    fy_tokenizer_destroy(m->tokenizer);
    fy_free(m->w.layers);
    for (int i = 0; i < m->n_owned; i++) fy_free(m->owned[i]);
    fy_free(m->owned);
    fy_gguf_close(m->gguf);
    fy_safetensors_close(m->st);
    fy_free(m->path);
    fy_free(m);
}

static void id_tensor(crypto_generichash_state *st, const fy_tensor_t *t)
{
    int32_t hdr[4] = {(int32_t)t->dtype, (int32_t)t->ne[0], (int32_t)t->ne[1], 0};
    crypto_generichash_update(st, (const unsigned char *)hdr, sizeof(hdr));
    size_t n = t->nbytes < 65536 ? t->nbytes : 65536;
    if (t->data && n) crypto_generichash_update(st, t->data, n);
}

void fy_model_id(const fy_model_t *m, char *buf, size_t cap)
{
    const fy_model_config_t *c = fy_model_config(m);
    const fy_model_weights_t *w = fy_model_weights(m);
    crypto_generichash_state st;
    unsigned char h[16];
    crypto_generichash_init(&st, NULL, 0, sizeof(h));
    /* fields one by one: the struct's padding and the bytes after each
     * name's NUL are not part of the model */
    crypto_generichash_update(&st, (const unsigned char *)c->arch, strlen(c->arch) + 1);
    crypto_generichash_update(&st, (const unsigned char *)c->name, strlen(c->name) + 1);
    int32_t dims[8] = {c->n_layers, c->dim,     c->n_heads,    c->n_kv_heads,
                       c->head_dim, c->ffn_dim, c->vocab_size, (int32_t)c->rope_style};
    float f[2] = {c->rope_theta, c->norm_eps};
    crypto_generichash_update(&st, (const unsigned char *)dims, sizeof(dims));
    crypto_generichash_update(&st, (const unsigned char *)f, sizeof(f));
    id_tensor(&st, &w->tok_embd);
    id_tensor(&st, &w->output);
    id_tensor(&st, &w->layers[0].wq);
    id_tensor(&st, &w->layers[c->n_layers - 1].w_down);
    crypto_generichash_final(&st, h, sizeof(h));
    char hex[33];
    for (int i = 0; i < 16; i++) snprintf(hex + 2 * i, 3, "%02x", h[i]);
    snprintf(buf, cap, "%.30s@%s", c->name[0] ? c->name : c->arch, hex);
}

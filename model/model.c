/*
 * model.c - loading a decoder model (llama, mistral, qwen2, qwen3, gemma3)
 * from GGUF or from a Hugging Face folder: its description (the
 * architecture's choices, each layer's window and rope) and its weights,
 * every tensor checked for presence, type and shape; and inspection, the
 * same reading with every fault noted instead of the first one fatal
 * (`ferry info`).
 *
 * Weights stay in the mapped files; only 1-D weights (norms, biases,
 * rope factors) stored in 16-bit types or at odd addresses, and norms that
 * a Hugging Face Gemma stores as w for a scale of 1 + w, get an owned f32
 * copy (kernels take f32 vectors).
 *
 * Not here: the forward pass (engine/runner.c) and the file formats'
 * parsers (gguf.c, safetensors.c).
 */
#include "model/model.h"

#include <sodium.h>

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/gguf.h"
#include "common/log.h"
#include "common/mem.h"
#include "model/safetensors.h"
#include "common/strbuf.h"

#define MAX_BAD_TYPES 16
#define MAX_ISSUES 64 /* faults listed by an inspection; the rest are counted */
#define SUPPORTED_TYPES "f32, f16, bf16, q8_0, q5_0, q5_1, q4_0, q4_1, iq4_nl, q2_k..q6_k"

struct fy_model {
    char *path;
    fy_model_config_t cfg;
    fy_layer_config_t *layers; /* [n_layers]: cfg.layer */
    fy_model_weights_t w;
    fy_tokenizer_t *tokenizer;
    fy_chat_template_t *chat;
    const char *chat_origin; /* where the chat template came from */
    fy_gguf_t *gguf;
    fy_safetensors_t *st;
    float **owned; /* f32 copies of 1-D weights, rope factors */
    int n_owned;
    bool arch_known;      /* the file's architecture is one ferry runs */
    char prefix[40];      /* of every tensor name but the output head's (HF multimodal checkpoints) */
    char output_name[64]; /* the output head's tensor name */
    /* inspection (fy_model_inspect): faults that reading can go past are
     * noted here instead of failing the load */
    bool inspect;
    char *issues; /* "- fault\n" lines, the first MAX_ISSUES */
    size_t issues_len;
    int n_issues; /* faults noted, listed or not */
    struct {
        char type[24];
        char first[96];
        int count;
    } bad_types[MAX_BAD_TYPES]; /* unsupported tensor types, counted */
    int n_bad_types;
};

/* ---- architectures --------------------------------------------------------------- */

static const fy_arch_traits_t g_traits[FY_ARCH_COUNT] = {
    /*                  name      qkv_bias qk_norm post_norms plus_one embed_scale act   gguf rope */
    [FY_ARCH_LLAMA] = {"llama", false, false, false, false, false, FY_ACT_SILU, FY_ROPE_NORM},
    [FY_ARCH_QWEN2] = {"qwen2", true, false, false, false, false, FY_ACT_SILU, FY_ROPE_NEOX},
    [FY_ARCH_QWEN3] = {"qwen3", false, true, false, false, false, FY_ACT_SILU, FY_ROPE_NEOX},
    [FY_ARCH_GEMMA3] = {"gemma3", false, true, true, true, true, FY_ACT_GELU_TANH, FY_ROPE_NEOX},
};

const fy_arch_traits_t *fy_arch_traits(fy_arch_t arch)
{
    return (unsigned)arch < FY_ARCH_COUNT ? &g_traits[arch] : &g_traits[FY_ARCH_LLAMA];
}

/* How an architecture lays out its layers' attention (data, beside the
 * traits the runner reads): which layers slide when the file names a
 * window but no pattern, and how the sliding layers turn. */
typedef struct arch_layout {
    int32_t swa_period;     /* layer l is global when (l + 1) % period == 0; 0: every layer slides */
    float local_rope_theta; /* sliding layers' rope base, unscaled (gemma3: 10000, llama.cpp's and HF's
                             * rope_local_base_freq); 0: the global layers' rope */
} arch_layout_t;

static const arch_layout_t g_layout[FY_ARCH_COUNT] = {
    [FY_ARCH_LLAMA] = {0, 0.0f},
    [FY_ARCH_QWEN2] = {0, 0.0f},
    [FY_ARCH_QWEN3] = {0, 0.0f},
    [FY_ARCH_GEMMA3] = {6, 10000.0f},
};

typedef struct arch_name {
    const char *name;
    fy_arch_t arch;
} arch_name_t;

/* GGUF general.architecture */
static const arch_name_t g_gguf_archs[] = {
    {"llama", FY_ARCH_LLAMA}, {"mistral", FY_ARCH_LLAMA}, {"qwen2", FY_ARCH_QWEN2},
    {"qwen3", FY_ARCH_QWEN3}, {"gemma3", FY_ARCH_GEMMA3},
};
#define GGUF_ARCHS "llama, mistral, qwen2, qwen3, gemma3"

/* config.json "architectures"[0], then "model_type" */
static const arch_name_t g_hf_archs[] = {
    {"LlamaForCausalLM", FY_ARCH_LLAMA},
    {"MistralForCausalLM", FY_ARCH_LLAMA},
    {"Qwen2ForCausalLM", FY_ARCH_QWEN2},
    {"Qwen3ForCausalLM", FY_ARCH_QWEN3},
    {"Gemma3ForCausalLM", FY_ARCH_GEMMA3},
    {"Gemma3ForConditionalGeneration", FY_ARCH_GEMMA3},
    {"llama", FY_ARCH_LLAMA},
    {"mistral", FY_ARCH_LLAMA},
    {"qwen2", FY_ARCH_QWEN2},
    {"qwen3", FY_ARCH_QWEN3},
    {"gemma3_text", FY_ARCH_GEMMA3},
    {"gemma3", FY_ARCH_GEMMA3},
};

static bool arch_lookup(const arch_name_t *tab, size_t n, const char *name, fy_arch_t *arch_p)
{
    for (size_t i = 0; i < n; i++) {
        if (!strcmp(tab[i].name, name)) {
            *arch_p = tab[i].arch;
            return true;
        }
    }
    return false;
}

/* ---- faults ------------------------------------------------------------------------ */

/*
 * A fault in the file.  Loading logs it as the one error line
 * ("model: PATH: what") and fails with st.  Inspection notes it; when the
 * reading can go past it (soft) the caller gets FY_OK and goes on.
 */
static fy_status_t __attribute__((format(printf, 4, 5)))
fault(fy_model_t *m, bool soft, fy_status_t st, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (!m->inspect) {
        fy_error("model: %s: %s", m->path, msg);
        return st;
    }
    /* a file can fault once per tensor of every layer (thousands): the
     * first MAX_ISSUES are listed and the rest counted, which also keeps
     * the list's growth from going quadratic (a fuzz timeout) */
    if (m->n_issues++ >= MAX_ISSUES) return soft ? FY_OK : st;
    size_t n = strlen(msg);
    char *p = fy_realloc(m->issues, m->issues_len + n + 4);
    if (p) {
        m->issues = p;
        memcpy(p + m->issues_len, "- ", 2);
        memcpy(p + m->issues_len + 2, msg, n);
        p[m->issues_len + 2 + n] = '\n';
        m->issues_len += n + 3;
        p[m->issues_len] = '\0';
    }
    return soft ? FY_OK : st;
}

/* An unsupported tensor type: one fault when loading; counted per type
 * when inspecting (a K-quant file has dozens of such tensors). */
static fy_status_t bad_type(fy_model_t *m, const char *tensor, const char *type)
{
    if (!m->inspect)
        return fault(m, false, FY_ERR_UNSUPPORTED,
                     "tensor '%s' has type %s, which ferry does not support (" SUPPORTED_TYPES ")", tensor, type);
    for (int i = 0; i < m->n_bad_types; i++) {
        if (!strcmp(m->bad_types[i].type, type)) {
            m->bad_types[i].count++;
            return FY_OK;
        }
    }
    if (m->n_bad_types < MAX_BAD_TYPES) {
        int i = m->n_bad_types++;
        snprintf(m->bad_types[i].type, sizeof(m->bad_types[i].type), "%s", type);
        snprintf(m->bad_types[i].first, sizeof(m->bad_types[i].first), "%s", tensor);
        m->bad_types[i].count = 1;
    }
    return FY_OK;
}

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
    /* the description, where one is set (a hand-made configuration has none) */
    CHECK(!c->embed_scale || (isfinite(c->embed_scale) && c->embed_scale > 0), "embedding scale %g is not positive",
          (double)c->embed_scale);
    CHECK(!c->attn_scale || (isfinite(c->attn_scale) && c->attn_scale > 0), "attention scale %g is not positive",
          (double)c->attn_scale);
    for (int l = 0; c->layer && l < c->n_layers; l++) {
        const fy_layer_config_t *L = &c->layer[l];
        CHECK(L->window >= 0, "layer %d has a negative sliding window %d", l, L->window);
        CHECK(isfinite(L->rope.theta) && L->rope.theta > 0, "layer %d: rope base %g is not a positive number", l,
              (double)L->rope.theta);
        CHECK(isfinite(L->rope.freq_scale) && L->rope.freq_scale > 0, "layer %d: rope scale %g is not positive", l,
              (double)L->rope.freq_scale);
    }
#undef CHECK
    return FY_OK;
}

const fy_model_config_t *fy_model_config(const fy_model_t *m) { return &m->cfg; }
const fy_model_weights_t *fy_model_weights(const fy_model_t *m) { return &m->w; }
const fy_tokenizer_t *fy_model_tokenizer(const fy_model_t *m) { return m->tokenizer; }
const fy_chat_template_t *fy_model_chat_template(const fy_model_t *m) { return m->chat; }

static size_t layer_bytes(const fy_layer_weights_t *L)
{
    const fy_tensor_t *t[] = {&L->attn_norm,      &L->wq,           &L->wk, &L->wv, &L->wo, &L->ffn_norm, &L->w_gate,
                              &L->w_up,           &L->w_down,       &L->bq, &L->bk, &L->bv, &L->q_norm,   &L->k_norm,
                              &L->post_attn_norm, &L->post_ffn_norm};
    size_t total = 0;
    for (size_t i = 0; i < FY_ARRAY_LEN(t); i++) total += t[i]->nbytes;
    return total;
}

size_t fy_model_weight_bytes_per_token(const fy_model_t *m)
{
    size_t total = m->w.out_norm.nbytes + m->w.output.nbytes;
    for (int l = 0; l < m->cfg.n_layers; l++) total += layer_bytes(&m->w.layers[l]);
    return total;
}

void fy_model_describe(const fy_model_t *m, char *buf, size_t cap)
{
    const fy_model_config_t *c = &m->cfg;
    int sliding = 0, window = 0;
    for (int l = 0; l < c->n_layers; l++)
        if (c->layer[l].window) sliding++, window = c->layer[l].window;
    char swa[64] = "";
    if (sliding) snprintf(swa, sizeof(swa), ", window %d on %d of %d layers", window, sliding, c->n_layers);
    snprintf(buf, cap,
             "%s (%s): %d layers, dim %d, %d heads / %d kv heads of %d, ffn %d, vocab %d, ctx %d%s, "
             "weights %s/%s, %.1f MiB read per token",
             c->name, c->arch, c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->head_dim, c->ffn_dim, c->vocab_size,
             c->max_ctx, swa, fy_dtype_name(m->w.layers[0].wq.dtype), fy_dtype_name(m->w.output.dtype),
             (double)fy_model_weight_bytes_per_token(m) / (1 << 20));
}

/* ---- the layers' attention ---------------------------------------------------------- */

/*
 * Fills m->layers: which layers slide (sliding[l], or NULL for none), the
 * window they use, and the two ropes (the global layers', and the sliding
 * layers' when the architecture gives them their own).
 */
static fy_status_t set_layers(fy_model_t *m, const bool *sliding, const int32_t *windows, const fy_rope_t *global,
                              const fy_rope_t *local)
{
    fy_model_config_t *c = &m->cfg;
    m->layers = fy_calloc((size_t)c->n_layers, sizeof(*m->layers));
    if (!m->layers) return fault(m, false, FY_ERR_NOMEM, "out of memory");
    for (int l = 0; l < c->n_layers; l++) {
        bool sl = sliding && sliding[l] && windows[l] > 0;
        m->layers[l].window = sl ? windows[l] : 0;
        m->layers[l].rope = sl && local ? *local : *global;
    }
    c->layer = m->layers;
    return FY_OK;
}

/* An owned float array of n (freed with the model). */
static float *own_floats(fy_model_t *m, size_t n)
{
    float **owned = fy_realloc(m->owned, (size_t)(m->n_owned + 1) * sizeof(*owned));
    if (!owned) return NULL;
    m->owned = owned;
    float *f = fy_malloc(n * sizeof(float));
    if (f) m->owned[m->n_owned++] = f;
    return f;
}

/*
 * Llama 3's per-frequency divisors, as Hugging Face's
 * _compute_llama3_parameters and llama.cpp's converter (which writes them
 * as the rope_freqs tensor): frequencies whose wavelength exceeds
 * old_ctx / low are divided by factor, those below old_ctx / high kept,
 * the ones between blended.
 */
static fy_status_t llama3_factors(fy_model_t *m, double theta, int32_t hd, double factor, double low, double high,
                                  double old_ctx, const float **factors_p)
{
    if (!(factor > 0) || !(low > 0) || !(high > low) || !(old_ctx > 0) || !isfinite(factor) || !isfinite(high) ||
        !isfinite(old_ctx))
        return fault(m, false, FY_ERR_FORMAT,
                     "rope_scaling llama3: factor %g, low_freq_factor %g, high_freq_factor %g, "
                     "original_max_position_embeddings %g are not a valid set (positive, low < high)",
                     factor, low, high, old_ctx);
    float *f = own_floats(m, (size_t)hd / 2);
    if (!f) return fault(m, false, FY_ERR_NOMEM, "out of memory");
    double low_wl = old_ctx / low, high_wl = old_ctx / high;
    for (int32_t i = 0; i < hd / 2; i++) {
        double inv = pow(theta, -2.0 * i / hd), wl = 2 * M_PI / inv;
        if (wl < high_wl) {
            f[i] = 1.0f;
        } else if (wl > low_wl) {
            f[i] = (float)factor;
        } else {
            double smooth = (old_ctx / wl - low) / (high - low);
            f[i] = (float)(1.0 / ((1 - smooth) / factor + smooth));
        }
    }
    *factors_p = f;
    return FY_OK;
}

/* ---- tensors --------------------------------------------------------------------- */

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

/* An owned f32 copy of a 1-D tensor, each element plus add. */
static fy_status_t own_f32(fy_model_t *m, const raw_tensor_t *r, float add, fy_tensor_t *t)
{
    float *f = own_floats(m, (size_t)r->ne[0]);
    if (!f) return FY_ERR_NOMEM;
    fy_dequantize_row(r->dtype, r->data, f, r->ne[0]);
    for (int64_t i = 0; add != 0.0f && i < r->ne[0]; i++) f[i] += add;
    t->dtype = FY_DTYPE_F32;
    t->row_bytes = t->nbytes = (size_t)r->ne[0] * sizeof(float);
    t->data = f;
    return FY_OK;
}

/* Looks up a tensor that must have shape (ne1 rows of ne0), ne1 = 0 for a
 * vector.  optional: absence is not an error (*present_p says).  add: a
 * vector's elements get it added (a (1 + w) norm folded), 0 for none.
 * Inspecting, a missing, unsupported or misshapen tensor is noted and left
 * zeroed. */
static fy_status_t get_tensor(fy_model_t *m, find_fn find, const char *name, int64_t ne0, int64_t ne1, fy_tensor_t *t,
                              bool optional, bool *present_p, float add)
{
    raw_tensor_t r = {0};
    memset(t, 0, sizeof(*t));
    fy_status_t st = find(m, name, &r);
    if (st != FY_OK) return st;
    if (present_p) *present_p = r.found;
    if (!r.found) {
        if (optional) return FY_OK;
        return fault(m, true, FY_ERR_FORMAT, "missing tensor '%s'", name);
    }
    if (!r.supported) return bad_type(m, name, r.type_name);
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
        return fault(m, true, FY_ERR_FORMAT, "tensor '%s' has shape [%s], expected [%s]%s", name, got, want,
                     ne1 ? " (rows, columns)" : "");
    }
    fy_tensor_t v = {.dtype = r.dtype, .ne = {ne0, ne1 ? ne1 : 1}};
    if (fy_dtype_row_bytes(r.dtype, ne0, &v.row_bytes) != FY_OK)
        return fault(m, true, FY_ERR_FORMAT, "tensor '%s': rows of %lld elements are not whole %s blocks", name,
                     (long long)ne0, fy_dtype_name(r.dtype));
    v.nbytes = (size_t)r.nbytes;
    v.data = r.data;
    if (v.row_bytes * (size_t)v.ne[1] != v.nbytes)
        return fault(m, true, FY_ERR_FORMAT, "tensor '%s' holds %llu bytes, expected %zu", name,
                     (unsigned long long)r.nbytes, v.row_bytes * (size_t)v.ne[1]);
    /* vectors are read by plain f32 loops: 16-bit ones, any at an odd
     * address (safetensors does not align data) and (1 + w) norms get an
     * aligned f32 copy */
    if (!ne1 && (r.dtype != FY_DTYPE_F32 || (uintptr_t)r.data % sizeof(float) || add != 0.0f)) {
        if (fy_dtype_is_quantized(r.dtype))
            return fault(m, true, FY_ERR_UNSUPPORTED, "vector tensor '%s' is quantized (%s); expected a float type",
                         name, fy_dtype_name(r.dtype));
        if (own_f32(m, &r, add, &v) != FY_OK)
            return fault(m, false, FY_ERR_NOMEM, "out of memory converting '%s'", name);
    }
    *t = v;
    return FY_OK;
}

typedef struct tensor_names {
    const char *tok_embd, *out_norm;
    const char *attn_norm, *wq, *wk, *wv, *wo, *ffn_norm, *w_gate, *w_up, *w_down; /* with %d */
    const char *bq, *bk, *bv, *q_norm, *k_norm, *post_attn_norm, *post_ffn_norm;   /* with %d */
} tensor_names_t;

static const tensor_names_t g_gguf_names = {
    "token_embd.weight",
    "output_norm.weight",
    "blk.%d.attn_norm.weight",
    "blk.%d.attn_q.weight",
    "blk.%d.attn_k.weight",
    "blk.%d.attn_v.weight",
    "blk.%d.attn_output.weight",
    "blk.%d.ffn_norm.weight",
    "blk.%d.ffn_gate.weight",
    "blk.%d.ffn_up.weight",
    "blk.%d.ffn_down.weight",
    "blk.%d.attn_q.bias",
    "blk.%d.attn_k.bias",
    "blk.%d.attn_v.bias",
    "blk.%d.attn_q_norm.weight",
    "blk.%d.attn_k_norm.weight",
    "blk.%d.post_attention_norm.weight",
    "blk.%d.post_ffw_norm.weight",
};

/* Hugging Face names, after the checkpoint's prefix ("model.", or a
 * multimodal checkpoint's language model's).  Llama and Qwen call the MLP's
 * input norm post_attention_layernorm; Gemma uses that name for the norm of
 * the attention's output and calls the MLP's pre_feedforward_layernorm. */
static const tensor_names_t g_hf_names = {
    "embed_tokens.weight",
    "norm.weight",
    "layers.%d.input_layernorm.weight",
    "layers.%d.self_attn.q_proj.weight",
    "layers.%d.self_attn.k_proj.weight",
    "layers.%d.self_attn.v_proj.weight",
    "layers.%d.self_attn.o_proj.weight",
    "layers.%d.post_attention_layernorm.weight",
    "layers.%d.mlp.gate_proj.weight",
    "layers.%d.mlp.up_proj.weight",
    "layers.%d.mlp.down_proj.weight",
    "layers.%d.self_attn.q_proj.bias",
    "layers.%d.self_attn.k_proj.bias",
    "layers.%d.self_attn.v_proj.bias",
    "layers.%d.self_attn.q_norm.weight",
    "layers.%d.self_attn.k_norm.weight",
    NULL,
    NULL,
};

static const tensor_names_t g_hf_gemma_names = {
    "embed_tokens.weight",
    "norm.weight",
    "layers.%d.input_layernorm.weight",
    "layers.%d.self_attn.q_proj.weight",
    "layers.%d.self_attn.k_proj.weight",
    "layers.%d.self_attn.v_proj.weight",
    "layers.%d.self_attn.o_proj.weight",
    "layers.%d.pre_feedforward_layernorm.weight",
    "layers.%d.mlp.gate_proj.weight",
    "layers.%d.mlp.up_proj.weight",
    "layers.%d.mlp.down_proj.weight",
    NULL,
    NULL,
    NULL,
    "layers.%d.self_attn.q_norm.weight",
    "layers.%d.self_attn.k_norm.weight",
    "layers.%d.post_attention_layernorm.weight",
    "layers.%d.post_feedforward_layernorm.weight",
};

static void tensor_name(const fy_model_t *m, const char *fmt, int layer, char *buf, size_t cap)
{
    int n = snprintf(buf, cap, "%s", m->prefix);
    if (n < 0 || (size_t)n >= cap) n = 0;
    snprintf(buf + n, cap - (size_t)n, fmt, layer);
}

/* Fills m->w from the tensors the architecture needs; decides tying when
 * tie_hint < 0 (GGUF: tied when there is no output tensor). */
static fy_status_t load_weights(fy_model_t *m, find_fn find, const tensor_names_t *nm, int tie_hint)
{
    fy_model_config_t *c = &m->cfg;
    const fy_arch_traits_t *a = &c->traits;
    fy_status_t st;
    /* Hugging Face Gemma norms scale by 1 + w; GGUF files hold 1 + w already */
    float norm_add = a->norm_plus_one && m->st ? 1.0f : 0.0f;
    int64_t q_rows = (int64_t)c->n_heads * c->head_dim, kv_rows = (int64_t)c->n_kv_heads * c->head_dim;
    char name[160];
    tensor_name(m, nm->tok_embd, 0, name, sizeof(name));
    if ((st = get_tensor(m, find, name, c->dim, c->vocab_size, &m->w.tok_embd, false, NULL, 0))) return st;
    tensor_name(m, nm->out_norm, 0, name, sizeof(name));
    if ((st = get_tensor(m, find, name, c->dim, 0, &m->w.out_norm, false, NULL, norm_add))) return st;
    bool has_output = false;
    if ((st = get_tensor(m, find, m->output_name, c->dim, c->vocab_size, &m->w.output, true, &has_output, 0)))
        return st;
    if (!has_output) {
        if (tie_hint == 0 &&
            (st = fault(m, true, FY_ERR_FORMAT, "missing tensor '%s' (and the config does not tie embeddings)",
                        m->output_name)))
            return st;
        m->w.output = m->w.tok_embd;
    }
    c->tied_embeddings = !has_output;

    m->w.layers = fy_calloc((size_t)c->n_layers, sizeof(*m->w.layers));
    if (!m->w.layers) return fault(m, false, FY_ERR_NOMEM, "out of memory");
    for (int l = 0; l < c->n_layers; l++) {
        fy_layer_weights_t *L = &m->w.layers[l];
        struct {
            const char *fmt;
            int64_t ne0, ne1;
            fy_tensor_t *t;
            bool needed;
            float add;
        } want[] = {
            {nm->attn_norm, c->dim, 0, &L->attn_norm, true, norm_add},
            {nm->wq, c->dim, q_rows, &L->wq, true, 0},
            {nm->wk, c->dim, kv_rows, &L->wk, true, 0},
            {nm->wv, c->dim, kv_rows, &L->wv, true, 0},
            {nm->bq, q_rows, 0, &L->bq, a->qkv_bias, 0},
            {nm->bk, kv_rows, 0, &L->bk, a->qkv_bias, 0},
            {nm->bv, kv_rows, 0, &L->bv, a->qkv_bias, 0},
            {nm->q_norm, c->head_dim, 0, &L->q_norm, a->qk_norm, norm_add},
            {nm->k_norm, c->head_dim, 0, &L->k_norm, a->qk_norm, norm_add},
            {nm->wo, q_rows, c->dim, &L->wo, true, 0},
            {nm->post_attn_norm, c->dim, 0, &L->post_attn_norm, a->post_norms, norm_add},
            {nm->ffn_norm, c->dim, 0, &L->ffn_norm, true, norm_add},
            {nm->w_gate, c->dim, c->ffn_dim, &L->w_gate, true, 0},
            {nm->w_up, c->dim, c->ffn_dim, &L->w_up, true, 0},
            {nm->w_down, c->ffn_dim, c->dim, &L->w_down, true, 0},
            {nm->post_ffn_norm, c->dim, 0, &L->post_ffn_norm, a->post_norms, norm_add},
        };
        for (size_t i = 0; i < FY_ARRAY_LEN(want); i++) {
            if (!want[i].needed || !want[i].fmt) continue;
            tensor_name(m, want[i].fmt, l, name, sizeof(name));
            if ((st = get_tensor(m, find, name, want[i].ne0, want[i].ne1, want[i].t, false, NULL, want[i].add)))
                return st;
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
    /* a file without a template gets its family's own turn markers (a
     * Gemma GGUF often ships none), else ChatML */
    const char *builtin = m->cfg.arch_id == FY_ARCH_GEMMA3 ? "gemma" : "chatml";
    m->chat_origin = "the model's own";
    if (!tmpl_src) {
        tmpl_src = fy_chat_template_builtin(builtin);
        m->chat_origin = m->cfg.arch_id == FY_ARCH_GEMMA3 ? "gemma (built in: the model has none)"
                                                          : "chatml (built in: the model has none)";
    }
    fy_status_t st = fy_chat_template_create(tmpl_src, bos, eos, &m->chat);
    if (st != FY_OK && tmpl_src != fy_chat_template_builtin(builtin)) {
        fy_warn("model: %s: cannot use the model's chat template (see above); falling back to %s", m->path, builtin);
        m->chat_origin = "built in (the model's own failed to parse)";
        st = fy_chat_template_create(fy_chat_template_builtin(builtin), bos, eos, &m->chat);
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
        if (required) return fault(m, false, FY_ERR_FORMAT, "missing metadata '%s'", key);
        v = dflt;
    } else if (st != FY_OK) {
        return st;
    }
    if (v > INT32_MAX) return fault(m, false, FY_ERR_FORMAT, "metadata '%s' = %u is absurd", key, v);
    *out = (int32_t)v;
    return FY_OK;
}

static fy_status_t gguf_f32(fy_model_t *m, const char *key, float dflt, float *out)
{
    *out = dflt;
    fy_status_t st = fy_gguf_get_f32(m->gguf, key, out);
    if (st == FY_ERR_NOT_FOUND) {
        *out = dflt;
        return FY_OK;
    }
    return st;
}

/* A per-layer integer key: a scalar (*scalar_p) or an array of exactly
 * n_layers values (*arr_p, owned by the caller).  Absent: neither set. */
static fy_status_t gguf_per_layer(fy_model_t *m, const char *key, int32_t *scalar_p, int32_t **arr_p, bool *found_p)
{
    *found_p = false;
    fy_gguf_type_t type = fy_gguf_key_type(m->gguf, key);
    if (type == FY_GGUF_TYPE_COUNT) return FY_OK;
    *found_p = true;
    fy_status_t st;
    if (type != FY_GGUF_TYPE_ARRAY) {
        int32_t v;
        if ((st = gguf_u32(m, key, true, 0, &v))) return st;
        *scalar_p = v;
        return FY_OK;
    }
    int32_t *arr = NULL;
    uint64_t n = 0;
    /* integers of any width, and bools (GGUF's one-byte booleans read as 0 or 1) */
    if ((st = fy_gguf_get_i32_arr(m->gguf, key, &arr, &n)) != FY_OK) return st;
    if (n != (uint64_t)m->cfg.n_layers) {
        fy_free(arr);
        return fault(m, false, FY_ERR_FORMAT, "metadata '%s' has %llu entries, expected %d (one per layer)", key,
                     (unsigned long long)n, m->cfg.n_layers);
    }
    for (uint64_t i = 0; i < n; i++) {
        if (arr[i] < 0) {
            int32_t bad = arr[i];
            fy_free(arr);
            return fault(m, false, FY_ERR_FORMAT, "metadata '%s'[%llu] = %d is negative", key, (unsigned long long)i,
                         bad);
        }
    }
    *arr_p = arr;
    return FY_OK;
}

/* Windows and ropes of a GGUF file's layers (llama.cpp's reading):
 * <arch>.attention.sliding_window (a window for the layers that slide, or
 * one per layer), <arch>.attention.sliding_window_pattern (a period, layer
 * l global when (l + 1) % period == 0, or a 0/1 flag per layer; absent: the
 * architecture's), <arch>.rope.* and the rope_freqs tensor. */
static fy_status_t gguf_layers(fy_model_t *m, const char *arch)
{
    fy_model_config_t *c = &m->cfg;
    const arch_layout_t *lay = &g_layout[c->arch_id];
    fy_status_t st;
    char key[128];
    const int n = c->n_layers;
    bool *sliding = fy_calloc((size_t)n, sizeof(bool));
    int32_t *windows = fy_calloc((size_t)n, sizeof(int32_t)), *warr = NULL, *parr = NULL;
    if (!sliding || !windows) {
        st = fault(m, false, FY_ERR_NOMEM, "out of memory");
        goto out;
    }
    int32_t window = 0, period = lay->swa_period;
    bool has_window, has_pattern;
    snprintf(key, sizeof(key), "%s.attention.sliding_window", arch);
    if ((st = gguf_per_layer(m, key, &window, &warr, &has_window))) goto out;
    snprintf(key, sizeof(key), "%s.attention.sliding_window_pattern", arch);
    if ((st = gguf_per_layer(m, key, &period, &parr, &has_pattern))) goto out;
    if (has_pattern && !parr && period > n) {
        st = fault(m, false, FY_ERR_FORMAT,
                   "metadata '%s' = %d disagrees with the layer count %d (no layer would be global)", key, period, n);
        goto out;
    }
    for (int l = 0; l < n; l++) {
        windows[l] = warr ? warr[l] : window;
        sliding[l] = parr ? parr[l] != 0 : period == 0 || (l + 1) % period != 0;
    }

    /* ropes: the global layers' from rope.* and rope_freqs; gemma3's
     * sliding layers turn with their own base (rope.freq_base_swa, else
     * 10000) and no scaling, as in llama.cpp */
    fy_rope_t global = {c->traits.gguf_rope, c->rope_theta, 1.0f, NULL}, local;
    snprintf(key, sizeof(key), "%s.rope.scaling.type", arch);
    fy_str_t type = {"none", 4};
    if (fy_gguf_has_key(m->gguf, key) && (st = fy_gguf_get_str(m->gguf, key, &type)) != FY_OK) goto out;
    if (fy_str_eq(type, "linear")) {
        float factor;
        snprintf(key, sizeof(key), "%s.rope.scaling.factor", arch);
        if ((st = gguf_f32(m, key, 1.0f, &factor))) goto out;
        if (!(factor > 0) || !isfinite(factor)) {
            st = fault(m, false, FY_ERR_FORMAT, "metadata '%s' = %g is not a positive number", key, (double)factor);
            goto out;
        }
        global.freq_scale = 1.0f / factor;
    } else if (!fy_str_eq(type, "none") && !fy_str_eq(type, "llama3")) {
        /* llama3 scaling is carried by the rope_freqs tensor */
        if ((st = fault(m, true, FY_ERR_UNSUPPORTED, "rope scaling '%.*s' is not supported (none, linear, llama3)",
                        (int)FY_MIN(type.len, 32), type.ptr)))
            goto out;
    }
    const fy_gguf_tensor_t *rf = fy_gguf_find_tensor(m->gguf, "rope_freqs.weight");
    if (rf) {
        fy_tensor_t t;
        if ((st = get_tensor(m, gguf_find, "rope_freqs.weight", c->head_dim / 2, 0, &t, false, NULL, 0))) goto out;
        for (int i = 0; t.data && i < c->head_dim / 2; i++) {
            float v = ((const float *)t.data)[i];
            if (!(v > 0) || !isfinite(v)) {
                st = fault(m, false, FY_ERR_FORMAT, "tensor 'rope_freqs.weight'[%d] = %g is not a positive number", i,
                           (double)v);
                goto out;
            }
        }
        global.freq_factors = t.data;
    } else if (fy_str_eq(type, "llama3")) {
        st = fault(m, false, FY_ERR_FORMAT, "rope scaling 'llama3' without its 'rope_freqs.weight' tensor");
        goto out;
    }
    local = global;
    if (lay->local_rope_theta) {
        snprintf(key, sizeof(key), "%s.rope.freq_base_swa", arch);
        if ((st = gguf_f32(m, key, lay->local_rope_theta, &local.theta))) goto out;
        local.freq_scale = 1.0f;
        local.freq_factors = NULL;
    }
    st = set_layers(m, has_window ? sliding : NULL, windows, &global, &local);
out:
    fy_free(sliding);
    fy_free(windows);
    fy_free(warr);
    fy_free(parr);
    return st;
}

/* The tensor types of a GGUF file, for inspection. */
static void gguf_unsupported_types(fy_model_t *m)
{
    for (uint64_t i = 0; i < fy_gguf_n_tensors(m->gguf); i++) {
        const fy_gguf_tensor_t *t = fy_gguf_tensor(m->gguf, i);
        if (t->supported) continue;
        char name[96];
        snprintf(name, sizeof(name), "%.*s", (int)FY_MIN(t->name.len, 95), t->name.ptr);
        bad_type(m, name, fy_gguf_ggml_type_name(t->ggml_type));
    }
}

static fy_status_t load_gguf(fy_model_t *m)
{
    fy_status_t st = fy_gguf_open(m->path, &m->gguf);
    if (st != FY_OK) return st;
    fy_gguf_t *g = m->gguf;
    fy_model_config_t *c = &m->cfg;
    fy_str_t s;
    if ((st = fy_gguf_get_str(g, "general.architecture", &s)) != FY_OK) {
        if (st == FY_ERR_NOT_FOUND) fault(m, false, FY_ERR_FORMAT, "missing metadata 'general.architecture'");
        return FY_ERR_FORMAT;
    }
    snprintf(c->arch, sizeof(c->arch), "%.*s", (int)FY_MIN(s.len, 31), s.ptr);
    bool known = arch_lookup(g_gguf_archs, FY_ARRAY_LEN(g_gguf_archs), c->arch, &c->arch_id);
    m->arch_known = known;
    if (!known) {
        /* inspection reads on with llama's key names, which most
         * architectures share */
        if ((st = fault(m, true, FY_ERR_UNSUPPORTED, "architecture '%s' is not supported (ferry runs " GGUF_ARCHS ")",
                        c->arch)))
            return st;
        c->arch_id = FY_ARCH_LLAMA;
    }
    c->traits = g_traits[c->arch_id];
    if (fy_gguf_get_str(g, "general.name", &s) == FY_OK)
        snprintf(c->name, sizeof(c->name), "%.*s", (int)FY_MIN(s.len, 127), s.ptr);
    else
        snprintf(c->name, sizeof(c->name), "%s", "unnamed");

    const char *A = c->arch;
    char k[6][96];
    snprintf(k[0], sizeof(k[0]), "%s.block_count", A);
    snprintf(k[1], sizeof(k[1]), "%s.embedding_length", A);
    snprintf(k[2], sizeof(k[2]), "%s.feed_forward_length", A);
    snprintf(k[3], sizeof(k[3]), "%s.attention.head_count", A);
    snprintf(k[4], sizeof(k[4]), "%s.context_length", A);
    snprintf(k[5], sizeof(k[5]), "%s.attention.head_count_kv", A);
    if ((st = gguf_u32(m, k[0], true, 0, &c->n_layers)) || (st = gguf_u32(m, k[1], true, 0, &c->dim)) ||
        (st = gguf_u32(m, k[2], true, 0, &c->ffn_dim)) || (st = gguf_u32(m, k[3], true, 0, &c->n_heads)) ||
        (st = gguf_u32(m, k[4], false, 4096, &c->max_ctx)) ||
        (st = gguf_u32(m, k[5], false, (uint32_t)c->n_heads, &c->n_kv_heads)))
        return st;
    char key[128];
    int32_t rope_dims = 0, key_len = 0, val_len;
    snprintf(key, sizeof(key), "%s.attention.key_length", A);
    bool has_key_len = fy_gguf_has_key(g, key);
    if (!has_key_len && (c->n_heads <= 0 || c->dim % c->n_heads))
        return fault(m, false, FY_ERR_FORMAT, "embedding width %d is not a multiple of the head count %d", c->dim,
                     c->n_heads);
    if ((st = gguf_u32(m, key, false, c->n_heads > 0 ? (uint32_t)(c->dim / c->n_heads) : 0, &key_len))) return st;
    c->head_dim = key_len;
    snprintf(key, sizeof(key), "%s.attention.value_length", A);
    if ((st = gguf_u32(m, key, false, (uint32_t)key_len, &val_len))) return st;
    if (val_len != key_len)
        return fault(m, false, FY_ERR_UNSUPPORTED, "key length %d differs from value length %d (unsupported)", key_len,
                     val_len);
    snprintf(key, sizeof(key), "%s.rope.dimension_count", A);
    if ((st = gguf_u32(m, key, false, (uint32_t)c->head_dim, &rope_dims))) return st;
    if (rope_dims != c->head_dim &&
        (st = fault(m, true, FY_ERR_UNSUPPORTED, "partial rotary embedding (%d of %d dims) is not supported", rope_dims,
                    c->head_dim)))
        return st;
    snprintf(key, sizeof(key), "%s.rope.freq_base", A);
    if ((st = gguf_f32(m, key, 10000.0f, &c->rope_theta))) return st;
    snprintf(key, sizeof(key), "%s.attention.layer_norm_rms_epsilon", A);
    if ((st = gguf_f32(m, key, c->arch_id == FY_ARCH_GEMMA3 ? 1e-6f : 1e-5f, &c->norm_eps))) return st;
    static const char *const softcaps[] = {"final_logit_softcapping", "attn_logit_softcapping"};
    for (size_t i = 0; i < FY_ARRAY_LEN(softcaps); i++) {
        float cap = 0;
        snprintf(key, sizeof(key), "%s.%s", A, softcaps[i]);
        if ((st = gguf_f32(m, key, 0.0f, &cap))) return st;
        if (cap != 0 && (st = fault(m, true, FY_ERR_UNSUPPORTED,
                                    "metadata '%s' = %g: logit soft-capping is not "
                                    "supported",
                                    key, (double)cap)))
            return st;
    }
    c->rope_style = c->traits.gguf_rope;
    const fy_gguf_tensor_t *emb = fy_gguf_find_tensor(g, "token_embd.weight");
    if (!emb) return fault(m, false, FY_ERR_FORMAT, "missing tensor 'token_embd.weight'");
    if (emb->n_dims != 2 || emb->ne[1] > INT32_MAX)
        return fault(m, false, FY_ERR_FORMAT, "tensor 'token_embd.weight' is not a 2-d matrix");
    c->vocab_size = (int32_t)emb->ne[1];
    int32_t vocab_meta;
    snprintf(key, sizeof(key), "%s.vocab_size", A);
    if ((st = gguf_u32(m, key, false, (uint32_t)c->vocab_size, &vocab_meta))) return st;
    if (vocab_meta != c->vocab_size)
        return fault(m, false, FY_ERR_FORMAT, "%s %d disagrees with the embedding's %d rows", key, vocab_meta,
                     c->vocab_size);
    /* the scales: Gemma's embeddings grow by sqrt(dim); its queries shrink
     * by 1 / sqrt(head_dim), or by <arch>.attention.scale, or for the 27B
     * (62 layers) by 1 / sqrt(dim / heads) as llama.cpp has it */
    c->embed_scale = c->traits.embed_scale ? sqrtf((float)c->dim) : 1.0f;
    c->attn_scale = 1.0f / sqrtf((float)c->head_dim);
    if (c->arch_id == FY_ARCH_GEMMA3) {
        if (c->n_layers == 62 && c->n_heads > 0) c->attn_scale = 1.0f / sqrtf((float)(c->dim / c->n_heads));
        snprintf(key, sizeof(key), "%s.attention.scale", A);
        if ((st = gguf_f32(m, key, c->attn_scale, &c->attn_scale))) return st;
    }
    if ((st = fy_model_config_check(c, m->path))) return st;
    if ((st = gguf_layers(m, A))) return st;
    if ((st = fy_model_config_check(c, m->path))) return st;
    if (known) {
        snprintf(m->output_name, sizeof(m->output_name), "%s", "output.weight");
        if ((st = load_weights(m, gguf_find, &g_gguf_names, -1))) return st;
    } else {
        gguf_unsupported_types(m); /* the weights of an unknown layout cannot be checked; their types can */
    }
    if ((st = fy_tokenizer_from_gguf(g, &m->tokenizer))) return m->inspect ? FY_OK : st;

    char *tmpl = NULL;
    if (fy_gguf_get_str(g, "tokenizer.chat_template", &s) == FY_OK) {
        tmpl = fy_strndup(s.ptr, (size_t)s.len);
        if (!tmpl) return fault(m, false, FY_ERR_NOMEM, "out of memory");
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
        if (required) return fault(m, false, FY_ERR_FORMAT, "config.json has no '%s'", key);
        *out = (int32_t)dflt;
        return FY_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
        return fault(m, false, FY_ERR_FORMAT, "config.json '%s' is not a non-negative 32-bit integer", key);
    *out = (int32_t)json_integer_value(v);
    return FY_OK;
}

static fy_status_t json_float(fy_model_t *m, json_t *cfg, const char *key, double dflt, double *out)
{
    json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return FY_OK;
    }
    if (!json_is_number(v)) return fault(m, false, FY_ERR_FORMAT, "config.json '%s' is not a number", key);
    *out = json_number_value(v);
    return FY_OK;
}

static fy_status_t json_float32(fy_model_t *m, json_t *cfg, const char *key, float dflt, float *out)
{
    double d;
    fy_status_t st = json_float(m, cfg, key, dflt, &d);
    if (st == FY_OK) *out = (float)d;
    return st;
}

/* A string key's value, or dflt when absent or null. */
static const char *json_str(json_t *cfg, const char *key, const char *dflt)
{
    json_t *v = json_object_get(cfg, key);
    return json_is_string(v) ? json_string_value(v) : dflt;
}

/* config.json's rope_scaling into the global layers' rope: none/default,
 * linear (factor), llama3 (factor, low/high_freq_factor,
 * original_max_position_embeddings). */
static fy_status_t hf_rope_scaling(fy_model_t *m, json_t *cfg, fy_rope_t *rope)
{
    json_t *rs = json_object_get(cfg, "rope_scaling");
    if (!rs || json_is_null(rs)) return FY_OK;
    if (!json_is_object(rs)) return fault(m, false, FY_ERR_FORMAT, "config.json 'rope_scaling' is not an object");
    const char *type = json_str(rs, "rope_type", json_str(rs, "type", "?"));
    fy_status_t st;
    double factor;
    if (!strcmp(type, "default")) return FY_OK;
    if (strcmp(type, "linear") && strcmp(type, "llama3"))
        return fault(m, true, FY_ERR_UNSUPPORTED, "rope_scaling '%s' is not supported (default, linear, llama3)", type);
    if ((st = json_float(m, rs, "factor", NAN, &factor))) return st;
    if (!(factor > 0) || !isfinite(factor))
        return fault(m, false, FY_ERR_FORMAT, "config.json rope_scaling '%s' needs a positive 'factor'", type);
    if (!strcmp(type, "linear")) {
        rope->freq_scale = (float)(1.0 / factor);
        return FY_OK;
    }
    double low, high, old_ctx;
    if ((st = json_float(m, rs, "low_freq_factor", 1.0, &low)) ||
        (st = json_float(m, rs, "high_freq_factor", 4.0, &high)) ||
        (st = json_float(m, rs, "original_max_position_embeddings", 8192, &old_ctx)))
        return st;
    return llama3_factors(m, rope->theta, m->cfg.head_dim, factor, low, high, old_ctx, &rope->freq_factors);
}

/* Which layers slide, and by how much: layer_types when the config has it
 * (transformers >= 4.53 writes it), else each family's rule: Gemma 3 a
 * period (sliding_window_pattern, 6), Qwen the layers from
 * max_window_layers on when use_sliding_window, Mistral all of them. */
static fy_status_t hf_layers(fy_model_t *m, json_t *cfg)
{
    fy_model_config_t *c = &m->cfg;
    const arch_layout_t *lay = &g_layout[c->arch_id];
    const int n = c->n_layers;
    fy_status_t st;
    int32_t window = 0;
    if (c->arch_id == FY_ARCH_GEMMA3) {
        if ((st = json_int(m, cfg, "sliding_window", false, 4096, &window))) return st;
    } else if (c->arch_id == FY_ARCH_QWEN2 || c->arch_id == FY_ARCH_QWEN3) {
        if (json_is_true(json_object_get(cfg, "use_sliding_window")) &&
            (st = json_int(m, cfg, "sliding_window", false, 0, &window)))
            return st;
    } else if ((st = json_int(m, cfg, "sliding_window", false, 0, &window))) {
        return st;
    }
    bool *sliding = fy_calloc((size_t)n, sizeof(bool));
    int32_t *windows = fy_calloc((size_t)n, sizeof(int32_t));
    if (!sliding || !windows) {
        fy_free(sliding), fy_free(windows);
        return fault(m, false, FY_ERR_NOMEM, "out of memory");
    }
    json_t *types = json_object_get(cfg, "layer_types");
    st = FY_OK;
    if (types && !json_is_null(types)) {
        if (!json_is_array(types) || json_array_size(types) != (size_t)n) {
            st =
                fault(m, false, FY_ERR_FORMAT, "config.json 'layer_types' has %zu entries, expected %d (one per layer)",
                      json_is_array(types) ? json_array_size(types) : 0, n);
        }
        for (int l = 0; st == FY_OK && l < n; l++) {
            const char *t = json_string_value(json_array_get(types, (size_t)l));
            if (t && !strcmp(t, "sliding_attention"))
                sliding[l] = true;
            else if (!t || strcmp(t, "full_attention"))
                st = fault(m, false, FY_ERR_UNSUPPORTED,
                           "config.json 'layer_types'[%d] is '%s' (sliding_attention, full_attention)", l,
                           t ? t : "not a string");
        }
        if (st == FY_OK && window <= 0) {
            for (int l = 0; l < n && st == FY_OK; l++)
                if (sliding[l])
                    st = fault(m, false, FY_ERR_FORMAT,
                               "config.json 'layer_types' has sliding layers but 'sliding_window' is not set");
        }
    } else if (c->arch_id == FY_ARCH_GEMMA3) {
        int32_t period;
        if ((st = json_int(m, cfg, "sliding_window_pattern", false, lay->swa_period, &period)) == FY_OK) {
            if (period < 1 || period > n)
                st = fault(m, false, FY_ERR_FORMAT,
                           "config.json 'sliding_window_pattern' = %d disagrees with the layer count %d", period, n);
            for (int l = 0; st == FY_OK && l < n; l++) sliding[l] = (l + 1) % period != 0;
        }
    } else if (c->arch_id == FY_ARCH_QWEN2 || c->arch_id == FY_ARCH_QWEN3) {
        int32_t from;
        if ((st = json_int(m, cfg, "max_window_layers", false, 28, &from)) == FY_OK)
            for (int l = 0; l < n; l++) sliding[l] = l >= from;
    } else {
        for (int l = 0; l < n; l++) sliding[l] = true;
    }
    for (int l = 0; l < n; l++) windows[l] = window;

    fy_rope_t global = {FY_ROPE_NEOX, c->rope_theta, 1.0f, NULL}, local;
    if (st == FY_OK) st = hf_rope_scaling(m, cfg, &global);
    local = global;
    if (st == FY_OK && lay->local_rope_theta) { /* gemma3: unscaled, its own base */
        st = json_float32(m, cfg, "rope_local_base_freq", lay->local_rope_theta, &local.theta);
        local.freq_scale = 1.0f;
        local.freq_factors = NULL;
    }
    if (st == FY_OK) st = set_layers(m, window > 0 ? sliding : NULL, windows, &global, &local);
    fy_free(sliding);
    fy_free(windows);
    return st;
}

static fy_status_t hf_config(fy_model_t *m, json_t *root, bool *tie_p)
{
    fy_model_config_t *c = &m->cfg;
    fy_status_t st;
    if (!json_is_object(root)) return fault(m, false, FY_ERR_FORMAT, "config.json is not a json object");
    /* the architecture: architectures[0], else model_type */
    json_t *archs = json_object_get(root, "architectures");
    const char *aname = json_is_array(archs) ? json_string_value(json_array_get(archs, 0)) : NULL;
    const char *type = json_str(root, "model_type", "");
    bool known = (aname && arch_lookup(g_hf_archs, FY_ARRAY_LEN(g_hf_archs), aname, &c->arch_id)) ||
                 arch_lookup(g_hf_archs, FY_ARRAY_LEN(g_hf_archs), type, &c->arch_id);
    m->arch_known = known;
    if (!known) {
        if ((st = fault(m, true, FY_ERR_UNSUPPORTED,
                        "model_type '%s'%s%s%s is not supported (ferry runs LlamaForCausalLM, MistralForCausalLM, "
                        "Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma3ForCausalLM, Gemma3ForConditionalGeneration)",
                        type, aname ? " (" : "", aname ? aname : "", aname ? ")" : "")))
            return st;
        c->arch_id = FY_ARCH_LLAMA;
    }
    c->traits = g_traits[c->arch_id];
    snprintf(c->arch, sizeof(c->arch), "%s", known ? c->traits.name : type);
    /* a multimodal Gemma 3 keeps its language model's hyper-parameters in text_config */
    json_t *cfg = root;
    json_t *text = json_object_get(root, "text_config");
    if (json_is_object(text)) cfg = text;
    const char *base = strrchr(m->path, '/');
    snprintf(c->name, sizeof(c->name), "%s", base && base[1] ? base + 1 : m->path);
    /* Gemma 3's configs leave out what Gemma3TextConfig defaults */
    bool gemma = c->arch_id == FY_ARCH_GEMMA3;
    if ((st = json_int(m, cfg, "num_hidden_layers", !gemma, 26, &c->n_layers)) ||
        (st = json_int(m, cfg, "hidden_size", !gemma, 2304, &c->dim)) ||
        (st = json_int(m, cfg, "intermediate_size", !gemma, 9216, &c->ffn_dim)) ||
        (st = json_int(m, cfg, "num_attention_heads", !gemma, 8, &c->n_heads)) ||
        (st = json_int(m, cfg, "vocab_size", !gemma, 262208, &c->vocab_size)) ||
        (st = json_int(m, cfg, "max_position_embeddings", false, gemma ? 131072 : 4096, &c->max_ctx)))
        return st;
    if ((st = json_int(m, cfg, "num_key_value_heads", false, gemma ? 4 : c->n_heads, &c->n_kv_heads))) return st;
    if (!gemma && !json_object_get(cfg, "head_dim") && (c->n_heads <= 0 || c->dim % c->n_heads))
        return fault(m, false, FY_ERR_FORMAT, "hidden_size %d is not a multiple of num_attention_heads %d", c->dim,
                     c->n_heads);
    if ((st = json_int(m, cfg, "head_dim", false,
                       gemma            ? 256
                       : c->n_heads > 0 ? c->dim / c->n_heads
                                        : 0,
                       &c->head_dim)))
        return st;
    if ((st = json_float32(m, cfg, "rope_theta", gemma ? 1e6f : 10000.0f, &c->rope_theta)) ||
        (st = json_float32(m, cfg, "rms_norm_eps", 1e-6f, &c->norm_eps)))
        return st;
    /* what the one forward pass does not do */
    const char *act =
        json_str(cfg, "hidden_activation", json_str(cfg, "hidden_act", gemma ? "gelu_pytorch_tanh" : "silu"));
    const char *want_act = gemma ? "gelu_pytorch_tanh" : "silu";
    if (strcmp(act, want_act) && (st = fault(m, true, FY_ERR_UNSUPPORTED,
                                             "activation '%s' is not supported for %s (%s)", act, c->arch, want_act)))
        return st;
    if (c->arch_id != FY_ARCH_QWEN2 && json_is_true(json_object_get(cfg, "attention_bias")) &&
        (st = fault(m, true, FY_ERR_UNSUPPORTED, "attention biases are not supported for %s", c->arch)))
        return st;
    static const char *const softcaps[] = {"final_logit_softcapping", "attn_logit_softcapping"};
    for (size_t i = 0; i < FY_ARRAY_LEN(softcaps); i++) {
        json_t *v = json_object_get(cfg, softcaps[i]);
        if (v && !json_is_null(v) &&
            (st = fault(m, true, FY_ERR_UNSUPPORTED, "config.json '%s': logit soft-capping is not supported",
                        softcaps[i])))
            return st;
    }
    json_t *tie = json_object_get(root, "tie_word_embeddings");
    if (!tie) tie = json_object_get(cfg, "tie_word_embeddings");
    *tie_p = tie ? json_is_true(tie) : gemma; /* Gemma 3 ties by default, the others do not */
    c->rope_style = FY_ROPE_NEOX;
    c->embed_scale = c->traits.embed_scale ? sqrtf((float)c->dim) : 1.0f;
    c->attn_scale = c->head_dim > 0 ? 1.0f / sqrtf((float)c->head_dim) : 1.0f;
    if (gemma) {
        double scalar;
        if ((st = json_float(m, cfg, "query_pre_attn_scalar", 256, &scalar))) return st;
        if (!(scalar > 0) || !isfinite(scalar))
            return fault(m, false, FY_ERR_FORMAT, "config.json 'query_pre_attn_scalar' = %g is not positive", scalar);
        c->attn_scale = (float)(1.0 / sqrt(scalar));
    }
    if ((st = fy_model_config_check(c, m->path))) return st;
    if ((st = hf_layers(m, cfg))) return st;
    return fy_model_config_check(c, m->path);
}

static char *read_template(const char *cfg_path)
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
    return out;
}

/* The checkpoint's tensor-name prefix: "model.", or a multimodal Gemma
 * 3's language model's (older and newer transformers save it apart). */
static void hf_prefix(fy_model_t *m)
{
    static const struct {
        const char *prefix, *output;
    } forms[] = {
        {"model.", "lm_head.weight"},
        {"language_model.model.", "language_model.lm_head.weight"},
        {"model.language_model.", "lm_head.weight"},
    };
    size_t pick = 0;
    for (size_t i = 0; i < FY_ARRAY_LEN(forms); i++) {
        char name[96];
        snprintf(name, sizeof(name), "%sembed_tokens.weight", forms[i].prefix);
        if (fy_safetensors_find(m->st, name)) {
            pick = i;
            break;
        }
    }
    snprintf(m->prefix, sizeof(m->prefix), "%s", forms[pick].prefix);
    snprintf(m->output_name, sizeof(m->output_name), "%s", forms[pick].output);
}

static fy_status_t load_hf(fy_model_t *m)
{
    char p[PATH_MAX], p2[PATH_MAX];
    snprintf(p, sizeof(p), "%s/config.json", m->path);
    json_error_t jerr;
    json_t *cfg = json_load_file(p, 0, &jerr);
    if (!cfg) {
        fault(m, false, FY_ERR_FORMAT, "cannot read config.json: %s", jerr.text);
        return access(p, F_OK) ? FY_ERR_NOT_FOUND : FY_ERR_FORMAT;
    }
    bool tie = false;
    fy_status_t st = hf_config(m, cfg, &tie);
    json_decref(cfg);
    if (st != FY_OK) return st;
    if ((st = fy_safetensors_open(m->path, &m->st))) return st;
    hf_prefix(m);
    if ((st =
             load_weights(m, st_find, m->cfg.arch_id == FY_ARCH_GEMMA3 ? &g_hf_gemma_names : &g_hf_names, tie ? 1 : 0)))
        return st;
    snprintf(p, sizeof(p), "%s/tokenizer.json", m->path);
    snprintf(p2, sizeof(p2), "%s/tokenizer_config.json", m->path);
    bool have_cfg = access(p2, R_OK) == 0;
    if ((st = fy_tokenizer_from_json(p, have_cfg ? p2 : NULL, &m->tokenizer))) return m->inspect ? FY_OK : st;
    char *tmpl = have_cfg ? read_template(p2) : NULL;
    st = chat_from_tokenizer(m, tmpl);
    fy_free(tmpl);
    return st;
}

/* ---- entry points ------------------------------------------------------------ */

static fy_status_t model_open(const char *path, bool inspect, fy_model_t **model_p)
{
    fy_model_t *m = fy_calloc(1, sizeof(*m));
    if (!m || !(m->path = fy_strdup(path))) {
        fy_free(m);
        fy_error("model: %s: out of memory", path);
        return FY_ERR_NOMEM;
    }
    m->inspect = inspect;
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
    if (st == FY_OK && m->tokenizer && fy_tokenizer_vocab_size(m->tokenizer) > m->cfg.vocab_size)
        st = fault(m, true, FY_ERR_FORMAT, "the tokenizer has %d tokens but the model only %d",
                   fy_tokenizer_vocab_size(m->tokenizer), m->cfg.vocab_size);
    if (st != FY_OK) {
        fy_model_destroy(m);
        return st;
    }
    *model_p = m;
    return FY_OK;
}

fy_status_t fy_model_load(const char *path, fy_model_t **model_p) { return model_open(path, false, model_p); }

size_t fy_model_drop_host(const fy_model_t *m, const fy_tensor_t *t)
{
    if (!m || !t || !t->data) return 0;
    return fy_gguf_drop(m->gguf, t->data, t->nbytes) + fy_safetensors_drop(m->st, t->data, t->nbytes);
}

void fy_model_destroy(fy_model_t *m)
{
    if (!m) return;
    fy_chat_template_destroy(m->chat);
    fy_tokenizer_destroy(m->tokenizer);
    fy_free(m->w.layers);
    fy_free(m->layers);
    for (int i = 0; i < m->n_owned; i++) fy_free(m->owned[i]);
    fy_free(m->owned);
    fy_gguf_close(m->gguf);
    fy_safetensors_close(m->st);
    fy_free(m->issues);
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
    /* the description: what K holds depends on each layer's rope and norms */
    int32_t arch[2] = {(int32_t)c->arch_id, 0};
    float scales[2] = {c->embed_scale, c->attn_scale};
    crypto_generichash_update(&st, (const unsigned char *)arch, sizeof(arch));
    crypto_generichash_update(&st, (const unsigned char *)scales, sizeof(scales));
    for (int l = 0; l < c->n_layers; l++) {
        const fy_layer_config_t *L = &c->layer[l];
        int32_t li[2] = {L->window, (int32_t)L->rope.style};
        float lf[2] = {L->rope.theta, L->rope.freq_scale};
        crypto_generichash_update(&st, (const unsigned char *)li, sizeof(li));
        crypto_generichash_update(&st, (const unsigned char *)lf, sizeof(lf));
        if (L->rope.freq_factors)
            crypto_generichash_update(&st, (const unsigned char *)L->rope.freq_factors,
                                      (size_t)c->head_dim / 2 * sizeof(float));
    }
    id_tensor(&st, &w->tok_embd);
    id_tensor(&st, &w->output);
    id_tensor(&st, &w->layers[0].wq);
    id_tensor(&st, &w->layers[c->n_layers - 1].w_down);
    crypto_generichash_final(&st, h, sizeof(h));
    char hex[33];
    for (int i = 0; i < 16; i++) snprintf(hex + 2 * i, 3, "%02x", h[i]);
    snprintf(buf, cap, "%.30s@%s", c->name[0] ? c->name : c->arch, hex);
}

/* ---- inspection ------------------------------------------------------------------ */

static const char *yes(bool v) { return v ? "yes" : "no"; }

typedef struct type_count {
    const char *name;
    int n;
} type_count_t;

static void describe_rope(fy_strbuf_t *b, const fy_rope_t *r)
{
    fy_strbuf_printf(b, "rope base %g %s", (double)r->theta, r->style == FY_ROPE_NEOX ? "neox" : "norm");
    if (r->freq_scale != 1.0f) fy_strbuf_printf(b, ", linear scaling x%g", 1.0 / (double)r->freq_scale);
    if (r->freq_factors) fy_strbuf_printf(b, ", per-frequency factors (llama3)");
}

static void describe_layers(fy_strbuf_t *b, const fy_model_config_t *c)
{
    for (int l = 0; l < c->n_layers;) {
        const fy_layer_config_t *L = &c->layer[l];
        int e = l + 1;
        while (e < c->n_layers && c->layer[e].window == L->window && fy_rope_same_angles(&c->layer[e].rope, &L->rope) &&
               c->layer[e].rope.style == L->rope.style)
            e++;
        char range[32];
        if (e - l > 1)
            snprintf(range, sizeof(range), "%d-%d", l, e - 1);
        else
            snprintf(range, sizeof(range), "%d", l);
        fy_strbuf_printf(b, "  %-8s ", range);
        if (L->window)
            fy_strbuf_printf(b, "sliding window %d, ", L->window);
        else
            fy_strbuf_printf(b, "global, ");
        describe_rope(b, &L->rope);
        fy_strbuf_printf(b, "\n");
        l = e;
    }
}

fy_status_t fy_model_inspect(const char *path, char **report_p)
{
    fy_model_t *m = NULL;
    fy_status_t st = model_open(path, true, &m);
    if (st != FY_OK) return st;
    const fy_model_config_t *c = &m->cfg;
    bool known = m->arch_known;
    bool runs = !m->issues && !m->n_bad_types && m->tokenizer && known;
    fy_strbuf_t b = {0};
    fy_strbuf_printf(&b, "model: %s (%s)\n", c->name, c->arch);
    fy_strbuf_printf(&b, "file: %s", path);
    if (m->gguf)
        fy_strbuf_printf(&b, " (gguf v%u, %.1f MiB)\n", fy_gguf_version(m->gguf),
                         (double)fy_gguf_file_size(m->gguf) / (1 << 20));
    else
        fy_strbuf_printf(&b, " (hugging face folder, tensors under '%s')\n", m->prefix);
    fy_strbuf_printf(&b, "shape: %d layers, dim %d, %d heads / %d kv heads of %d, ffn %d, vocab %d, context %d\n",
                     c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->head_dim, c->ffn_dim, c->vocab_size,
                     c->max_ctx);
    const fy_arch_traits_t *a = &c->traits;
    fy_strbuf_printf(&b, "architecture: %s%s\n", a->name, known ? "" : " key names (the file's own is unknown)");
    fy_strbuf_printf(&b, "  norms           rms, eps %g%s\n", (double)c->norm_eps,
                     a->norm_plus_one ? (m->st ? ", (1 + w): 1 added to the stored weights at load"
                                               : ", (1 + w): the file stores 1 + w (llama.cpp's converter)")
                                      : "");
    fy_strbuf_printf(&b, "  qkv bias        %s\n", yes(a->qkv_bias));
    fy_strbuf_printf(&b, "  q/k norm        %s\n", yes(a->qk_norm));
    fy_strbuf_printf(&b, "  post norms      %s\n", yes(a->post_norms));
    fy_strbuf_printf(&b, "  mlp             %s\n",
                     a->act == FY_ACT_GELU_TANH ? "gelu-tanh gated (geglu)" : "silu gated (swiglu)");
    fy_strbuf_printf(&b, "  embedding scale %g%s\n", (double)c->embed_scale, a->embed_scale ? " (sqrt(dim))" : "");
    fy_strbuf_printf(&b, "  attention scale %g (1/sqrt(head_dim) = %g)\n", (double)c->attn_scale,
                     1.0 / sqrt((double)c->head_dim));
    if (m->w.layers)
        fy_strbuf_printf(&b, "  output          %s\n", c->tied_embeddings ? "tied to the embeddings" : "its own");
    fy_strbuf_printf(&b, "layers:\n");
    if (c->layer) describe_layers(&b, c);
    if (m->gguf) {
        type_count_t types[48];
        int nt = 0;
        for (uint64_t i = 0; i < fy_gguf_n_tensors(m->gguf); i++) {
            const char *tn = fy_gguf_ggml_type_name(fy_gguf_tensor(m->gguf, i)->ggml_type);
            int j = 0;
            while (j < nt && strcmp(types[j].name, tn)) j++;
            if (j == nt && nt < 48) types[nt++] = (type_count_t){tn, 0};
            if (j < nt) types[j].n++;
        }
        fy_strbuf_printf(&b, "tensors: %llu (", (unsigned long long)fy_gguf_n_tensors(m->gguf));
        for (int j = 0; j < nt; j++) fy_strbuf_printf(&b, "%s%s %d", j ? ", " : "", types[j].name, types[j].n);
        fy_strbuf_printf(&b, ")\n");
    } else {
        fy_strbuf_printf(&b, "tensors: %lld\n", (long long)fy_safetensors_n_tensors(m->st));
    }
    if (m->w.layers && runs) {
        char desc[512];
        fy_model_describe(m, desc, sizeof(desc));
        const char *w = strstr(desc, "weights ");
        if (w) fy_strbuf_printf(&b, "%s\n", w);
    }
    if (m->tokenizer)
        fy_strbuf_printf(
            &b, "tokenizer: %s, %d tokens, bos %d, eos %d\n",
            fy_tokenizer_kind(m->tokenizer) == FY_TOKENIZER_BPE_BYTE ? "byte-level bpe" : "sentencepiece bpe",
            fy_tokenizer_vocab_size(m->tokenizer), fy_tokenizer_bos(m->tokenizer), fy_tokenizer_eos(m->tokenizer));
    else
        fy_strbuf_printf(&b, "tokenizer: unusable (see the error above)\n");
    if (m->chat) fy_strbuf_printf(&b, "chat template: %s\n", m->chat_origin);
    if (runs) {
        fy_strbuf_printf(&b, "ferry runs it: yes\n");
    } else {
        fy_strbuf_printf(&b, "ferry runs it: no\n");
        if (m->issues) fy_strbuf_printf(&b, "%s", m->issues);
        if (m->n_issues > MAX_ISSUES)
            fy_strbuf_printf(&b, "- and %d more faults like these\n", m->n_issues - MAX_ISSUES);
        for (int i = 0; i < m->n_bad_types; i++)
            fy_strbuf_printf(
                &b,
                "- tensor type %s is not supported (%d tensor%s, the first '%s'; ferry reads " SUPPORTED_TYPES ")\n",
                m->bad_types[i].type, m->bad_types[i].count, m->bad_types[i].count == 1 ? "" : "s",
                m->bad_types[i].first);
        if (!m->tokenizer) fy_strbuf_printf(&b, "- the tokenizer cannot be read\n");
    }
    fy_model_destroy(m);
    char *report = fy_strbuf_take(&b, NULL);
    if (!report) {
        fy_error("model: %s: out of memory describing the model", path);
        return FY_ERR_NOMEM;
    }
    *report_p = report;
    return FY_OK;
}

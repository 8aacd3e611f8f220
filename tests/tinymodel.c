/* tinymodel.c - tiny random models of every architecture for tests, and their reference forward pass. */
#include "tests/tinymodel.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/dtype.h"
#include "tests/gguf_writer.h"
#include "tests/testutil.h"

#define N_SPECIAL 3

void fy_tiny_cfg_default(fy_tiny_cfg_t *c)
{
    *c = (fy_tiny_cfg_t){.n_layers = 2,
                         .dim = 64,
                         .n_heads = 4,
                         .n_kv_heads = 2,
                         .ffn = 96,
                         .max_ctx = 256,
                         .theta = 10000.0f,
                         .eps = 1e-5f,
                         .tied = false,
                         .seed = 42,
                         .arch = FY_ARCH_LLAMA};
}

void fy_tiny_cfg_arch(fy_tiny_cfg_t *c, fy_arch_t arch)
{
    fy_tiny_cfg_default(c);
    c->arch = arch;
    switch (arch) {
    case FY_ARCH_QWEN3: c->head_dim = 32; break;
    case FY_ARCH_GEMMA3:
        c->n_layers = 6;
        c->window = 7;
        c->swa_period = 6;
        c->local_theta = 10000.0f;
        c->theta = 1e6f;
        c->eps = 1e-6f;
        c->tied = true;
        break;
    default: break;
    }
}

static int layer_window(const fy_tiny_cfg_t *c, int l)
{
    if (!c->window) return 0;
    if (c->max_window_layers) return l >= c->max_window_layers ? c->window : 0;
    return c->swa_period == 0 || (l + 1) % c->swa_period != 0 ? c->window : 0;
}

int fy_tiny_layer_window(const fy_tiny_model_t *m, int l) { return layer_window(&m->c, l); }

static float *rand_mat(uint64_t *s, long n, float scale)
{
    float *p = malloc((size_t)n * sizeof(float));
    if (!p) abort();
    for (long i = 0; i < n; i++) p[i] = fy_test_rand_uniform(s) * scale;
    return p;
}

static float *rand_norm(uint64_t *s, long n)
{
    float *p = rand_mat(s, n, 0.2f);
    for (long i = 0; i < n; i++) p[i] += 1.0f;
    return p;
}

void fy_tiny_init(fy_tiny_model_t *m, const fy_tiny_cfg_t *c)
{
    memset(m, 0, sizeof(*m));
    m->c = *c;
    m->vocab = 256 + N_SPECIAL;
    m->head_dim = c->head_dim ? c->head_dim : c->dim / c->n_heads;
    uint64_t s = c->seed;
    int D = c->dim, hd = m->head_dim, F = c->ffn;
    float sd = 1.0f / sqrtf((float)D), sf = 1.0f / sqrtf((float)F);
    m->embd = rand_mat(&s, (long)m->vocab * D, 1.0f);
    m->out_norm = rand_norm(&s, D);
    m->output = c->tied ? m->embd : rand_mat(&s, (long)m->vocab * D, sd);
    m->L = calloc((size_t)c->n_layers, sizeof(*m->L));
    if (!m->L) abort();
    for (int l = 0; l < c->n_layers; l++) {
        fy_tiny_layer_t *L = &m->L[l];
        L->attn_norm = rand_norm(&s, D);
        L->wq = rand_mat(&s, (long)c->n_heads * hd * D, sd);
        L->wk = rand_mat(&s, (long)c->n_kv_heads * hd * D, sd);
        L->wv = rand_mat(&s, (long)c->n_kv_heads * hd * D, sd);
        L->wo = rand_mat(&s, (long)D * c->n_heads * hd, sd);
        L->ffn_norm = rand_norm(&s, D);
        L->wg = rand_mat(&s, (long)F * D, sd);
        L->wu = rand_mat(&s, (long)F * D, sd);
        L->wd = rand_mat(&s, (long)D * F, sf);
    }
    /* the other architectures' tensors, drawn after llama's so that a
     * llama keeps the weights it always had */
    for (int l = 0; l < c->n_layers; l++) {
        fy_tiny_layer_t *L = &m->L[l];
        if (c->arch == FY_ARCH_QWEN2) {
            L->bq = rand_mat(&s, (long)c->n_heads * hd, 0.5f);
            L->bk = rand_mat(&s, (long)c->n_kv_heads * hd, 0.5f);
            L->bv = rand_mat(&s, (long)c->n_kv_heads * hd, 0.5f);
        }
        if (c->arch == FY_ARCH_QWEN3 || c->arch == FY_ARCH_GEMMA3) {
            L->q_norm = rand_norm(&s, hd);
            L->k_norm = rand_norm(&s, hd);
        }
        if (c->arch == FY_ARCH_GEMMA3) {
            L->post_attn_norm = rand_norm(&s, D);
            L->post_ffn_norm = rand_norm(&s, D);
        }
    }
}

void fy_tiny_free(fy_tiny_model_t *m)
{
    if (m->output != m->embd) free(m->output);
    free(m->embd);
    free(m->out_norm);
    for (int l = 0; l < m->c.n_layers; l++) {
        fy_tiny_layer_t *L = &m->L[l];
        free(L->attn_norm), free(L->wq), free(L->wk), free(L->wv), free(L->wo);
        free(L->ffn_norm), free(L->wg), free(L->wu), free(L->wd);
        free(L->bq), free(L->bk), free(L->bv), free(L->q_norm), free(L->k_norm);
        free(L->post_attn_norm), free(L->post_ffn_norm);
    }
    free(m->L);
    memset(m, 0, sizeof(*m));
}

static fy_dtype_t dtype_of(uint32_t ggml)
{
    switch (ggml) {
    case GW_F16: return FY_DTYPE_F16;
    case GW_BF16: return FY_DTYPE_BF16;
    case GW_Q8_0: return FY_DTYPE_Q8_0;
    case GW_Q4_0: return FY_DTYPE_Q4_0;
    case GW_Q4_1: return FY_DTYPE_Q4_1;
    case GW_Q5_0: return FY_DTYPE_Q5_0;
    case GW_Q5_1: return FY_DTYPE_Q5_1;
    case GW_IQ4_NL: return FY_DTYPE_IQ4_NL;
    case GW_Q2_K: return FY_DTYPE_Q2_K;
    case GW_Q3_K: return FY_DTYPE_Q3_K;
    case GW_Q4_K: return FY_DTYPE_Q4_K;
    case GW_Q5_K: return FY_DTYPE_Q5_K;
    case GW_Q6_K: return FY_DTYPE_Q6_K;
    default: return FY_DTYPE_F32;
    }
}

static void roundtrip(float *w, long rows, long cols, fy_dtype_t t)
{
    size_t rb;
    if (fy_dtype_row_bytes(t, cols, &rb) != FY_OK) abort();
    void *tmp = malloc(rb);
    if (!tmp) abort();
    for (long r = 0; r < rows; r++) {
        fy_quantize_row(t, w + r * cols, tmp, cols);
        fy_dequantize_row(t, tmp, w + r * cols, cols);
    }
    free(tmp);
}

void fy_tiny_roundtrip(fy_tiny_model_t *m, uint32_t ggml_type)
{
    fy_dtype_t t = dtype_of(ggml_type);
    int D = m->c.dim, hd = m->head_dim, F = m->c.ffn;
    roundtrip(m->embd, m->vocab, D, t);
    if (t == FY_DTYPE_F16 || t == FY_DTYPE_BF16) { /* 16-bit files store the vectors in 16 bits too */
        roundtrip(m->out_norm, 1, D, t);
        for (int l = 0; l < m->c.n_layers; l++) {
            fy_tiny_layer_t *L = &m->L[l];
            float *v[] = {L->attn_norm, L->ffn_norm, L->post_attn_norm, L->post_ffn_norm};
            for (size_t i = 0; i < 4; i++)
                if (v[i]) roundtrip(v[i], 1, D, t);
            float *h[] = {L->q_norm, L->k_norm};
            for (size_t i = 0; i < 2; i++)
                if (h[i]) roundtrip(h[i], 1, hd, t);
            if (L->bq) roundtrip(L->bq, 1, (long)m->c.n_heads * hd, t);
            if (L->bk) roundtrip(L->bk, 1, (long)m->c.n_kv_heads * hd, t);
            if (L->bv) roundtrip(L->bv, 1, (long)m->c.n_kv_heads * hd, t);
        }
    }
    if (m->output != m->embd) roundtrip(m->output, m->vocab, D, t);
    for (int l = 0; l < m->c.n_layers; l++) {
        fy_tiny_layer_t *L = &m->L[l];
        roundtrip(L->wq, (long)m->c.n_heads * hd, D, t);
        roundtrip(L->wk, (long)m->c.n_kv_heads * hd, D, t);
        roundtrip(L->wv, (long)m->c.n_kv_heads * hd, D, t);
        roundtrip(L->wo, D, (long)m->c.n_heads * hd, t);
        roundtrip(L->wg, F, D, t);
        roundtrip(L->wu, F, D, t);
        roundtrip(L->wd, D, F, t);
    }
}

/* GPT-2's byte -> code point table */
static int byte_to_cp(int b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return b;
    int n = 0;
    for (int i = 0; i < b; i++)
        if (!((i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174 && i <= 255))) n++;
    return 256 + n;
}

static void cp_to_utf8(int cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp, out[1] = 0;
    } else {
        out[0] = (char)(0xc0 | (cp >> 6)), out[1] = (char)(0x80 | (cp & 0x3f)), out[2] = 0;
    }
}

static const char *g_specials[N_SPECIAL] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};

static void add_matrix(fy_gw_t *w, const char *name, const float *data, long rows, long cols, uint32_t ggml)
{
    fy_dtype_t t = dtype_of(ggml);
    size_t rb;
    if (fy_dtype_row_bytes(t, cols, &rb) != FY_OK) abort();
    char *buf = malloc(rb * (size_t)rows);
    if (!buf) abort();
    for (long r = 0; r < rows; r++) fy_quantize_row(t, data + r * cols, buf + (size_t)r * rb, cols);
    int64_t ne[2] = {cols, rows};
    fy_gw_tensor(w, name, ggml, 2, ne, buf, rb * (size_t)rows);
    free(buf);
}

static void add_vector(fy_gw_t *w, const char *name, const float *data, long n)
{
    int64_t ne[1] = {n};
    fy_gw_tensor(w, name, GW_F32, 1, ne, data, (size_t)n * sizeof(float));
}

/* llama.cpp's converter reorders the rows of each Q/K head from halves to
 * interleaved pairs so that "normal" rope matches HF's rotate_half */
static float *permute_qk(const float *w, int n_heads, int hd, int cols)
{
    float *p = malloc((size_t)n_heads * hd * cols * sizeof(float));
    if (!p) abort();
    for (int h = 0; h < n_heads; h++)
        for (int i = 0; i < hd / 2; i++)
            for (int j = 0; j < 2; j++)
                memcpy(p + ((size_t)h * hd + 2 * i + j) * cols, w + ((size_t)h * hd + j * (hd / 2) + i) * cols,
                       (size_t)cols * sizeof(float));
    return p;
}

/* Llama 3's rope factors as llama.cpp's converter writes them (the
 * rope_freqs tensor): 1 for short wavelengths, factor for long ones, a
 * blend between. */
static void llama3_rope_freqs(const fy_tiny_cfg_t *c, int hd, float *out)
{
    double low_wl = c->rope_orig_ctx / c->rope_low, high_wl = c->rope_orig_ctx / c->rope_high;
    for (int i = 0; i < hd / 2; i++) {
        double freq = 1.0 / pow(c->theta, 2.0 * i / hd), wl = 2 * M_PI / freq;
        if (wl < high_wl) {
            out[i] = 1.0f;
        } else if (wl > low_wl) {
            out[i] = c->rope_factor;
        } else {
            double smooth = (c->rope_orig_ctx / wl - c->rope_low) / (c->rope_high - c->rope_low);
            out[i] = (float)(1.0 / ((1 - smooth) / c->rope_factor + smooth));
        }
    }
}

/* The metadata of a model of shape c, under its architecture's keys, with
 * the byte-level tokenizer. */
static void put_header(fy_gw_t *w, const fy_tiny_cfg_t *c, int hd, int vocab)
{
    int D = c->dim, F = c->ffn;
    const char *A = c->mistral ? "mistral" : fy_arch_traits(c->arch)->name;
    char key[96];
#define KEY(k) (snprintf(key, sizeof(key), "%s." k, A), key)
    fy_gw_str(w, "general.architecture", A);
    fy_gw_str(w, "general.name", "tiny");
    fy_gw_u32(w, KEY("block_count"), (uint32_t)c->n_layers);
    fy_gw_u32(w, KEY("context_length"), (uint32_t)c->max_ctx);
    fy_gw_u32(w, KEY("embedding_length"), (uint32_t)D);
    fy_gw_u32(w, KEY("feed_forward_length"), (uint32_t)F);
    fy_gw_u32(w, KEY("attention.head_count"), (uint32_t)c->n_heads);
    fy_gw_u32(w, KEY("attention.head_count_kv"), (uint32_t)c->n_kv_heads);
    if (hd != D / c->n_heads) {
        fy_gw_u32(w, KEY("attention.key_length"), (uint32_t)hd);
        fy_gw_u32(w, KEY("attention.value_length"), (uint32_t)hd);
    }
    fy_gw_u32(w, KEY("rope.dimension_count"), (uint32_t)hd);
    fy_gw_f32(w, KEY("rope.freq_base"), c->theta);
    fy_gw_f32(w, KEY("attention.layer_norm_rms_epsilon"), c->eps);
    if (c->window && c->max_window_layers) { /* a window per layer, 0 for the global ones */
        int32_t win[64];
        for (int l = 0; l < c->n_layers && l < 64; l++) win[l] = layer_window(c, l);
        fy_gw_i32_arr(w, KEY("attention.sliding_window"), win, (size_t)c->n_layers);
    } else if (c->window) {
        fy_gw_u32(w, KEY("attention.sliding_window"), (uint32_t)c->window);
        if (c->write_pattern) fy_gw_u32(w, KEY("attention.sliding_window_pattern"), (uint32_t)c->swa_period);
    }
    if (c->arch == FY_ARCH_GEMMA3) {
        if (c->local_theta != 10000.0f) fy_gw_f32(w, KEY("rope.freq_base_swa"), c->local_theta);
        if (c->query_scalar) fy_gw_f32(w, KEY("attention.scale"), 1.0f / sqrtf(c->query_scalar));
    }
    if (c->rope_scaling == FY_TINY_ROPE_LINEAR) {
        fy_gw_str(w, KEY("rope.scaling.type"), "linear");
        fy_gw_f32(w, KEY("rope.scaling.factor"), c->rope_factor);
    }
#undef KEY
    fy_gw_str(w, "tokenizer.ggml.model", "gpt2");
    fy_gw_str(w, "tokenizer.ggml.pre", "default");
    char strs[256][4];
    const char **toks = malloc((size_t)vocab * sizeof(*toks));
    int32_t *types = malloc((size_t)vocab * sizeof(*types));
    char *unused = vocab > 256 + N_SPECIAL ? malloc((size_t)(vocab - 256 - N_SPECIAL) * 24) : NULL;
    if (!toks || !types || (vocab > 256 + N_SPECIAL && !unused)) abort();
    for (int i = 256 + N_SPECIAL; i < vocab; i++) {
        char *u = unused + (size_t)(i - 256 - N_SPECIAL) * 24;
        snprintf(u, 24, "<unused_%d>", i);
        toks[i] = u;
        types[i] = 5; /* UNUSED */
    }
    for (int b = 0; b < 256; b++) {
        cp_to_utf8(byte_to_cp(b), strs[b]);
        toks[b] = strs[b];
        types[b] = 1;
    }
    for (int i = 0; i < N_SPECIAL; i++) {
        toks[256 + i] = g_specials[i];
        types[256 + i] = 3;
    }
    fy_gw_str_arr(w, "tokenizer.ggml.tokens", toks, (size_t)vocab);
    fy_gw_i32_arr(w, "tokenizer.ggml.token_type", types, (size_t)vocab);
    free(toks), free(types), free(unused);
    fy_gw_str_arr(w, "tokenizer.ggml.merges", NULL, 0);
    fy_gw_u32(w, "tokenizer.ggml.bos_token_id", 257);
    fy_gw_u32(w, "tokenizer.ggml.eos_token_id", 258);
    fy_gw_bool(w, "tokenizer.ggml.add_bos_token", c->add_bos);
    if (c->chat_template) fy_gw_str(w, "tokenizer.chat_template", c->chat_template);
}

bool fy_tiny_write_gguf(const fy_tiny_model_t *m, const char *path, uint32_t ggml)
{
    const fy_tiny_cfg_t *c = &m->c;
    int D = c->dim, hd = m->head_dim, F = c->ffn;
    fy_gw_t *w = fy_gw_new();
    put_header(w, c, hd, m->vocab);
    add_matrix(w, "token_embd.weight", m->embd, m->vocab, D, ggml);
    add_vector(w, "output_norm.weight", m->out_norm, D);
    if (!c->tied) add_matrix(w, "output.weight", m->output, m->vocab, D, ggml);
    if (c->rope_scaling == FY_TINY_ROPE_LLAMA3) {
        float f[512];
        llama3_rope_freqs(c, hd, f);
        add_vector(w, "rope_freqs.weight", f, hd / 2);
    }
    /* only llama's converter reorders Q/K rows for its pairwise rope */
    bool permute = c->arch == FY_ARCH_LLAMA;
    for (int l = 0; l < c->n_layers; l++) {
        const fy_tiny_layer_t *L = &m->L[l];
        char name[64];
#define NAME(s) (snprintf(name, sizeof(name), "blk.%d." s, l), name)
        float *q = permute ? permute_qk(L->wq, c->n_heads, hd, D) : L->wq;
        float *k = permute ? permute_qk(L->wk, c->n_kv_heads, hd, D) : L->wk;
        add_vector(w, NAME("attn_norm.weight"), L->attn_norm, D);
        add_matrix(w, NAME("attn_q.weight"), q, (long)c->n_heads * hd, D, ggml);
        add_matrix(w, NAME("attn_k.weight"), k, (long)c->n_kv_heads * hd, D, ggml);
        add_matrix(w, NAME("attn_v.weight"), L->wv, (long)c->n_kv_heads * hd, D, ggml);
        if (L->bq) {
            add_vector(w, NAME("attn_q.bias"), L->bq, (long)c->n_heads * hd);
            add_vector(w, NAME("attn_k.bias"), L->bk, (long)c->n_kv_heads * hd);
            add_vector(w, NAME("attn_v.bias"), L->bv, (long)c->n_kv_heads * hd);
        }
        if (L->q_norm) {
            add_vector(w, NAME("attn_q_norm.weight"), L->q_norm, hd);
            add_vector(w, NAME("attn_k_norm.weight"), L->k_norm, hd);
        }
        add_matrix(w, NAME("attn_output.weight"), L->wo, D, (long)c->n_heads * hd, ggml);
        if (L->post_attn_norm) add_vector(w, NAME("post_attention_norm.weight"), L->post_attn_norm, D);
        add_vector(w, NAME("ffn_norm.weight"), L->ffn_norm, D);
        add_matrix(w, NAME("ffn_gate.weight"), L->wg, F, D, ggml);
        add_matrix(w, NAME("ffn_up.weight"), L->wu, F, D, ggml);
        add_matrix(w, NAME("ffn_down.weight"), L->wd, D, F, ggml);
        if (L->post_ffn_norm) add_vector(w, NAME("post_ffw_norm.weight"), L->post_ffn_norm, D);
#undef NAME
        if (permute) free(q), free(k);
    }
    bool ok = fy_gw_write(w, path);
    fy_gw_free(w);
    return ok;
}

/* rows x cols of uniform random values times scale, quantized a row at a time */
static void add_random_matrix(fy_gw_t *w, const char *name, long rows, long cols, uint32_t ggml, float scale,
                              uint64_t *s)
{
    fy_dtype_t t = dtype_of(ggml);
    size_t rb;
    if (fy_dtype_row_bytes(t, cols, &rb) != FY_OK) abort();
    char *buf = malloc(rb * (size_t)rows);
    float *row = malloc((size_t)cols * sizeof(float));
    if (!buf || !row) abort();
    for (long r = 0; r < rows; r++) {
        for (long i = 0; i < cols; i++) row[i] = fy_test_rand_uniform(s) * scale;
        fy_quantize_row(t, row, buf + (size_t)r * rb, cols);
    }
    int64_t ne[2] = {cols, rows};
    fy_gw_tensor_take(w, name, ggml, 2, ne, buf, rb * (size_t)rows);
    free(row);
}

/* Blocks drawn per matrix from a pool of POOL_BLOCKS quantized random
 * blocks: a model of billions of weights is written in about the time its
 * bytes take to copy, where quantizing every row takes minutes. */
#define POOL_BLOCKS 4096

/* rows x cols whose every quantization block is one of POOL_BLOCKS blocks
 * of uniform random values times scale, picked at random: valid blocks
 * at the scale asked, rows that differ from each other (the output head's
 * logits are not tied; a matrix too small for that is written block by
 * block), no two tensors alike. */
static void add_pooled_matrix(fy_gw_t *w, const char *name, long rows, long cols, uint32_t ggml, float scale,
                              uint64_t *s)
{
    fy_dtype_t t = dtype_of(ggml);
    const fy_dtype_info_t *ti = fy_dtype_info(t);
    size_t rb, bb = (size_t)ti->block_bytes;
    long be = ti->block_elems, n_pool = POOL_BLOCKS;
    if (fy_dtype_row_bytes(t, cols, &rb) != FY_OK) abort();
    if (rb * (size_t)rows / bb <= 4 * POOL_BLOCKS) { /* small: every block its own, no two rows alike */
        add_random_matrix(w, name, rows, cols, ggml, scale, s);
        return;
    }
    char *pool = malloc(bb * (size_t)n_pool);
    float *vals = malloc((size_t)be * sizeof(float));
    char *buf = malloc(rb * (size_t)rows);
    if (!pool || !vals || !buf) abort();
    for (long b = 0; b < n_pool; b++) {
        for (long i = 0; i < be; i++) vals[i] = fy_test_rand_uniform(s) * scale;
        fy_quantize_row(t, vals, pool + (size_t)b * bb, be);
    }
    size_t n_blocks = rb * (size_t)rows / bb;
    uint64_t x = *s | 1;
    for (size_t b = 0; b < n_blocks; b++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17; /* xorshift64 */
        memcpy(buf + b * bb, pool + (size_t)(x % (uint64_t)n_pool) * bb, bb);
    }
    *s = x;
    int64_t ne[2] = {cols, rows};
    fy_gw_tensor_take(w, name, ggml, 2, ne, buf, rb * (size_t)rows);
    free(pool), free(vals);
}

void fy_tiny_random_default(fy_tiny_random_t *r, uint32_t ggml_type) { *r = (fy_tiny_random_t){.type = ggml_type}; }

/* llama.cpp's use_more_bits (llama-quant.cpp): the layers whose attn_v and
 * ffn_down Q4_K_M keeps in Q6_K */
static bool more_bits(int l, int n) { return l < n / 8 || l >= 7 * n / 8 || (l - n / 8) % 3 == 2; }

bool fy_tiny_write_random_gguf_as(const fy_tiny_cfg_t *c, const char *path, const fy_tiny_random_t *r)
{
    int D = c->dim, hd = c->head_dim ? c->head_dim : c->dim / c->n_heads, F = c->ffn;
    int vocab = r->vocab > 256 + N_SPECIAL ? r->vocab : 256 + N_SPECIAL;
    uint64_t s = c->seed;
    float sd = 1.0f / sqrtf((float)D), sf = 1.0f / sqrtf((float)F), sh = 1.0f / sqrtf((float)c->n_heads * hd);
    long big = D > hd ? D : hd;
    float *ones = malloc((size_t)big * sizeof(float));
    if (!ones) abort();
    for (long i = 0; i < big; i++) ones[i] = 1.0f;
    /* qwen2's q/k/v biases: one small random vector, every layer the same */
    bool qwen2 = c->arch == FY_ARCH_QWEN2;
    float *bias = qwen2 ? rand_mat(&s, (long)c->n_heads * hd, 0.02f) : NULL;
    uint32_t t = r->q4_k_m ? GW_Q4_K : r->type, t6 = r->q4_k_m ? GW_Q6_K : r->type;
    void (*mat)(fy_gw_t *, const char *, long, long, uint32_t, float, uint64_t *) =
        r->pooled ? add_pooled_matrix : add_random_matrix;
    bool gemma = c->arch == FY_ARCH_GEMMA3;
    fy_gw_t *w = fy_gw_new();
    put_header(w, c, hd, r->full_vocab ? vocab : 256 + N_SPECIAL); /* the matrices may have more rows */
    /* Q4_K_M: a tied embedding is the output head, kept in Q6_K; and at the
     * output head's scale, or (gemma3 multiplying it by sqrt(dim)) the
     * embedding would swamp every layer and each token predict itself */
    mat(w, "token_embd.weight", vocab, D, c->tied ? t6 : t, c->tied ? sd : 1.0f, &s);
    add_vector(w, "output_norm.weight", ones, D);
    if (!c->tied) mat(w, "output.weight", vocab, D, t6, sd, &s);
    for (int l = 0; l < c->n_layers; l++) {
        char name[64];
        bool more = r->q4_k_m && more_bits(l, c->n_layers);
#define NAME(x) (snprintf(name, sizeof(name), "blk.%d." x, l), name)
        add_vector(w, NAME("attn_norm.weight"), ones, D);
        mat(w, NAME("attn_q.weight"), (long)c->n_heads * hd, D, t, sd, &s);
        mat(w, NAME("attn_k.weight"), (long)c->n_kv_heads * hd, D, t, sd, &s);
        mat(w, NAME("attn_v.weight"), (long)c->n_kv_heads * hd, D, more ? t6 : t, sd, &s);
        if (qwen2) {
            add_vector(w, NAME("attn_q.bias"), bias, (long)c->n_heads * hd);
            add_vector(w, NAME("attn_k.bias"), bias, (long)c->n_kv_heads * hd);
            add_vector(w, NAME("attn_v.bias"), bias, (long)c->n_kv_heads * hd);
        }
        if (gemma) {
            add_vector(w, NAME("attn_q_norm.weight"), ones, hd);
            add_vector(w, NAME("attn_k_norm.weight"), ones, hd);
        }
        mat(w, NAME("attn_output.weight"), D, (long)c->n_heads * hd, t, sh, &s);
        if (gemma) add_vector(w, NAME("post_attention_norm.weight"), ones, D);
        add_vector(w, NAME("ffn_norm.weight"), ones, D);
        mat(w, NAME("ffn_gate.weight"), F, D, t, sd, &s);
        mat(w, NAME("ffn_up.weight"), F, D, t, sd, &s);
        mat(w, NAME("ffn_down.weight"), D, F, more ? t6 : t, sf, &s);
        if (gemma) add_vector(w, NAME("post_ffw_norm.weight"), ones, D);
#undef NAME
    }
    bool ok = fy_gw_write(w, path);
    fy_gw_free(w);
    free(ones), free(bias);
    return ok;
}

bool fy_tiny_write_random_gguf(const fy_tiny_cfg_t *c, const char *path, uint32_t ggml)
{
    fy_tiny_random_t r;
    fy_tiny_random_default(&r, ggml);
    return fy_tiny_write_random_gguf_as(c, path, &r);
}

/* ---- Hugging Face folder ------------------------------------------------------------ */

typedef struct st_entry {
    char name[128];
    const float *data;
    long rows, cols; /* rows = 0 for a vector */
} st_entry_t;

static size_t elem_size(const char *dtype) { return !strcmp(dtype, "F32") ? 4 : 2; }

/* a copy of v (len) less 1 in *keep: how a Gemma checkpoint stores the norm v */
static const float *minus_one(const float *v, long len, float **keep)
{
    float *p = malloc((size_t)len * sizeof(float));
    if (!p) abort();
    for (long i = 0; i < len; i++) p[i] = v[i] - 1.0f;
    return *keep = p;
}

static bool write_shard(const char *path, const st_entry_t *e, int n, const char *dtype)
{
    json_t *hdr = json_object();
    size_t off = 0, es = elem_size(dtype);
    for (int i = 0; i < n; i++) {
        long count = e[i].rows ? e[i].rows * e[i].cols : e[i].cols;
        json_t *shape = e[i].rows ? json_pack("[II]", (json_int_t)e[i].rows, (json_int_t)e[i].cols)
                                  : json_pack("[I]", (json_int_t)e[i].cols);
        json_object_set_new(hdr, e[i].name,
                            json_pack("{s:s, s:o, s:[II]}", "dtype", dtype, "shape", shape, "data_offsets",
                                      (json_int_t)off, (json_int_t)(off + (size_t)count * es)));
        off += (size_t)count * es;
    }
    json_object_set_new(hdr, "__metadata__", json_pack("{s:s}", "format", "pt"));
    char *text = json_dumps(hdr, JSON_COMPACT);
    json_decref(hdr);
    FILE *f = fopen(path, "wb");
    if (!f || !text) return false;
    uint64_t len = strlen(text);
    fwrite(&len, 8, 1, f);
    fwrite(text, 1, len, f);
    free(text);
    for (int i = 0; i < n; i++) {
        long count = e[i].rows ? e[i].rows * e[i].cols : e[i].cols;
        for (long j = 0; j < count; j++) {
            float v = e[i].data[j];
            if (es == 4) {
                fwrite(&v, 4, 1, f);
            } else {
                uint16_t h = !strcmp(dtype, "F16") ? fy_fp32_to_fp16(v) : fy_fp32_to_bf16(v);
                fwrite(&h, 2, 1, f);
            }
        }
    }
    return fclose(f) == 0;
}

static bool write_tokenizer_json(const fy_tiny_model_t *m, const char *path)
{
    json_t *vocab = json_object();
    for (int b = 0; b < 256; b++) {
        char s[4];
        cp_to_utf8(byte_to_cp(b), s);
        json_object_set_new(vocab, s, json_integer(b));
    }
    json_t *added = json_array();
    for (int i = 0; i < N_SPECIAL; i++) {
        json_object_set_new(vocab, g_specials[i], json_integer(256 + i));
        json_array_append_new(added,
                              json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", 256 + i, "content", g_specials[i],
                                        "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1));
    }
    json_t *root =
        json_pack("{s:s, s:o, s:n, s:{s:s, s:b, s:b, s:b}, s:{s:s, s:b, s:b, s:b}, s:{s:s, s:o, s:[]}}", "version",
                  "1.0", "added_tokens", added, "normalizer", "pre_tokenizer", "type", "ByteLevel", "add_prefix_space",
                  0, "trim_offsets", 1, "use_regex", 1, "decoder", "type", "ByteLevel", "add_prefix_space", 1,
                  "trim_offsets", 1, "use_regex", 1, "model", "type", "BPE", "vocab", vocab, "merges");
    if (!root) return false;
    int rc = json_dump_file(root, path, JSON_INDENT(1));
    json_decref(root);
    (void)m;
    return rc == 0;
}

/* config.json for the model's architecture, as transformers writes it */
static json_t *hf_config_json(const fy_tiny_model_t *m)
{
    const fy_tiny_cfg_t *c = &m->c;
    static const char *const names[FY_ARCH_COUNT][2] = {
        [FY_ARCH_LLAMA] = {"LlamaForCausalLM", "llama"},
        [FY_ARCH_QWEN2] = {"Qwen2ForCausalLM", "qwen2"},
        [FY_ARCH_QWEN3] = {"Qwen3ForCausalLM", "qwen3"},
        [FY_ARCH_GEMMA3] = {"Gemma3ForCausalLM", "gemma3_text"},
    };
    bool mistral = c->arch == FY_ARCH_LLAMA && (c->mistral || c->window);
    json_t *t = json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:b, s:i, s:i}", "architectures",
                          mistral ? "MistralForCausalLM" : names[c->arch][0], "model_type",
                          mistral ? "mistral" : names[c->arch][1], "hidden_size", c->dim, "intermediate_size", c->ffn,
                          "num_hidden_layers", c->n_layers, "num_attention_heads", c->n_heads, "num_key_value_heads",
                          c->n_kv_heads, "vocab_size", m->vocab, "max_position_embeddings", c->max_ctx, "rope_theta",
                          (double)c->theta, "rms_norm_eps", (double)c->eps, "tie_word_embeddings", c->tied,
                          "bos_token_id", 257, "eos_token_id", 258);
    if (c->head_dim) json_object_set_new(t, "head_dim", json_integer(c->head_dim));
    if (c->arch == FY_ARCH_GEMMA3) {
        json_object_set_new(t, "head_dim", json_integer(m->head_dim));
        json_object_set_new(t, "hidden_activation", json_string("gelu_pytorch_tanh"));
        json_object_set_new(t, "query_pre_attn_scalar",
                            json_real(c->query_scalar ? c->query_scalar : (double)m->head_dim));
        json_object_set_new(t, "rope_local_base_freq", json_real(c->local_theta));
        json_object_set_new(t, "sliding_window", c->window ? json_integer(c->window) : json_null());
        json_object_set_new(t, "final_logit_softcapping", json_null());
        json_object_set_new(t, "attn_logit_softcapping", json_null());
    } else {
        json_object_set_new(t, "hidden_act", json_string("silu"));
    }
    if (c->arch == FY_ARCH_QWEN2 || c->arch == FY_ARCH_QWEN3) {
        json_object_set_new(t, "use_sliding_window", json_boolean(c->window != 0));
        json_object_set_new(t, "sliding_window", json_integer(c->window ? c->window : 4096));
        json_object_set_new(t, "max_window_layers", json_integer(c->max_window_layers));
    } else if (mistral) {
        json_object_set_new(t, "sliding_window", c->window ? json_integer(c->window) : json_null());
    }
    if (c->layer_types) {
        json_t *types = json_array();
        for (int l = 0; l < c->n_layers; l++)
            json_array_append_new(types,
                                  json_string(fy_tiny_layer_window(m, l) ? "sliding_attention" : "full_attention"));
        json_object_set_new(t, "layer_types", types);
    } else if (c->arch == FY_ARCH_GEMMA3 && c->write_pattern) {
        json_object_set_new(t, "sliding_window_pattern", json_integer(c->swa_period));
    }
    if (c->rope_scaling == FY_TINY_ROPE_LINEAR)
        json_object_set_new(t, "rope_scaling",
                            json_pack("{s:s, s:f}", "rope_type", "linear", "factor", (double)c->rope_factor));
    if (c->rope_scaling == FY_TINY_ROPE_LLAMA3)
        json_object_set_new(t, "rope_scaling",
                            json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor",
                                      (double)c->rope_factor, "low_freq_factor", (double)c->rope_low,
                                      "high_freq_factor", (double)c->rope_high, "original_max_position_embeddings",
                                      c->rope_orig_ctx));
    if (!c->multimodal) return t;
    /* Gemma3ForConditionalGeneration: the language model's config inside */
    json_object_set_new(t, "model_type", json_string("gemma3_text"));
    json_object_del(t, "architectures");
    return json_pack("{s:[s], s:s, s:o, s:b}", "architectures", "Gemma3ForConditionalGeneration", "model_type",
                     "gemma3", "text_config", t, "tie_word_embeddings", c->tied);
}

bool fy_tiny_write_hf(const fy_tiny_model_t *m, const char *dir, const char *dtype, int shards)
{
    const fy_tiny_cfg_t *c = &m->c;
    int D = c->dim, hd = m->head_dim, F = c->ffn;
    mkdir(dir, 0755);
    char path[1024];
    json_t *cfg = hf_config_json(m);
    snprintf(path, sizeof(path), "%s/config.json", dir);
    if (!cfg || json_dump_file(cfg, path, JSON_INDENT(1))) return false;
    json_decref(cfg);
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    if (!write_tokenizer_json(m, path)) return false;

    int n = 0, cap = 3 + 16 * c->n_layers, n_tmp = 0;
    st_entry_t *e = calloc((size_t)cap, sizeof(*e));
    float **tmp = calloc((size_t)cap, sizeof(*tmp)); /* Gemma's norms, stored as w - 1 */
    if (!e || !tmp) abort();
    bool gemma = c->arch == FY_ARCH_GEMMA3;
    const char *pre = c->multimodal ? "language_model.model." : "model.";
#define ADD(nm, d, r, cl)                                                                                              \
    (snprintf(e[n].name, sizeof(e[n].name), "%s", nm), e[n].data = d, e[n].rows = r, e[n].cols = cl, n++)
#define NORM(v, len) (gemma ? minus_one(v, len, &tmp[n_tmp++]) : (v))
    char nm[128];
#define PADD(s, d, r, cl) (snprintf(nm, sizeof(nm), "%s" s, pre), ADD(nm, d, r, cl))
    PADD("embed_tokens.weight", m->embd, m->vocab, D);
    PADD("norm.weight", NORM(m->out_norm, D), 0, D);
    if (!c->tied) ADD(c->multimodal ? "language_model.lm_head.weight" : "lm_head.weight", m->output, m->vocab, D);
    for (int l = 0; l < c->n_layers; l++) {
        const fy_tiny_layer_t *L = &m->L[l];
#define LADD(s, d, r, cl) (snprintf(nm, sizeof(nm), "%slayers.%d." s, pre, l), ADD(nm, d, r, cl))
        LADD("input_layernorm.weight", NORM(L->attn_norm, D), 0, D);
        LADD("self_attn.q_proj.weight", L->wq, c->n_heads * hd, D);
        LADD("self_attn.k_proj.weight", L->wk, c->n_kv_heads * hd, D);
        LADD("self_attn.v_proj.weight", L->wv, c->n_kv_heads * hd, D);
        if (L->bq) {
            LADD("self_attn.q_proj.bias", L->bq, 0, c->n_heads * hd);
            LADD("self_attn.k_proj.bias", L->bk, 0, c->n_kv_heads * hd);
            LADD("self_attn.v_proj.bias", L->bv, 0, c->n_kv_heads * hd);
        }
        if (L->q_norm) {
            LADD("self_attn.q_norm.weight", NORM(L->q_norm, hd), 0, hd);
            LADD("self_attn.k_norm.weight", NORM(L->k_norm, hd), 0, hd);
        }
        LADD("self_attn.o_proj.weight", L->wo, D, c->n_heads * hd);
        if (gemma) {
            LADD("post_attention_layernorm.weight", NORM(L->post_attn_norm, D), 0, D);
            LADD("pre_feedforward_layernorm.weight", NORM(L->ffn_norm, D), 0, D);
            LADD("post_feedforward_layernorm.weight", NORM(L->post_ffn_norm, D), 0, D);
        } else {
            LADD("post_attention_layernorm.weight", L->ffn_norm, 0, D);
        }
        LADD("mlp.gate_proj.weight", L->wg, F, D);
        LADD("mlp.up_proj.weight", L->wu, F, D);
        LADD("mlp.down_proj.weight", L->wd, D, F);
#undef LADD
    }
#undef PADD
#undef NORM
#undef ADD
    bool ok = true;
    if (shards <= 1) {
        snprintf(path, sizeof(path), "%s/model.safetensors", dir);
        ok = write_shard(path, e, n, dtype);
    } else {
        json_t *map = json_object();
        int per = (n + shards - 1) / shards;
        for (int s = 0; s < shards && ok; s++) {
            int b = s * per, cnt = b + per > n ? n - b : per;
            if (cnt <= 0) break;
            char fn[64];
            snprintf(fn, sizeof(fn), "model-%05d-of-%05d.safetensors", s + 1, shards);
            snprintf(path, sizeof(path), "%s/%s", dir, fn);
            ok = write_shard(path, e + b, cnt, dtype);
            for (int i = b; i < b + cnt; i++) json_object_set_new(map, e[i].name, json_string(fn));
        }
        json_t *idx = json_pack("{s:{s:i}, s:o}", "metadata", "total_size", 0, "weight_map", map);
        snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
        ok = ok && json_dump_file(idx, path, JSON_INDENT(1)) == 0;
        json_decref(idx);
    }
    for (int i = 0; i < n_tmp; i++) free(tmp[i]);
    free(tmp);
    free(e);
    return ok;
}

/* ---- reference forward -------------------------------------------------------------- */

static void rmsnorm_d(const double *x, const float *w, int n, double eps, double *y)
{
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double s = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * s * w[i];
}

static void matvec_d(const float *w, const double *x, int rows, int cols, double *y)
{
    for (int r = 0; r < rows; r++) {
        double s = 0;
        for (int c = 0; c < cols; c++) s += (double)w[(long)r * cols + c] * x[c];
        y[r] = s;
    }
}

/* transformers' inverse frequencies for a layer: the default, linear
 * ("inv_freq / factor") or _compute_llama3_parameters' */
static void inv_freq_d(const fy_tiny_cfg_t *c, int hd, bool local, double *inv)
{
    double theta = local ? c->local_theta : c->theta;
    for (int i = 0; i < hd / 2; i++) inv[i] = 1.0 / pow(theta, 2.0 * i / hd);
    if (local || c->rope_scaling == FY_TINY_ROPE_NONE) return;
    if (c->rope_scaling == FY_TINY_ROPE_LINEAR) {
        for (int i = 0; i < hd / 2; i++) inv[i] /= c->rope_factor;
        return;
    }
    double factor = c->rope_factor, low_wl = c->rope_orig_ctx / c->rope_low, high_wl = c->rope_orig_ctx / c->rope_high;
    for (int i = 0; i < hd / 2; i++) {
        double wavelen = 2 * M_PI / inv[i];
        double llama = wavelen > low_wl ? inv[i] / factor : inv[i];
        double smooth = (c->rope_orig_ctx / wavelen - c->rope_low) / (c->rope_high - c->rope_low);
        double smoothed = (1 - smooth) * llama / factor + smooth * llama;
        bool medium = !(wavelen < high_wl) && !(wavelen > low_wl);
        inv[i] = medium ? smoothed : llama;
    }
}

static void rope_neox_d(double *v, int n_heads, int hd, int pos, const double *inv)
{
    for (int h = 0; h < n_heads; h++) {
        double *x = v + h * hd;
        for (int i = 0; i < hd / 2; i++) {
            double a = pos * inv[i];
            double x0 = x[i], x1 = x[i + hd / 2];
            x[i] = x0 * cos(a) - x1 * sin(a);
            x[i + hd / 2] = x0 * sin(a) + x1 * cos(a);
        }
    }
}

static void head_norms_d(double *v, int n_heads, int hd, const float *w, double eps)
{
    for (int h = 0; h < n_heads; h++) rmsnorm_d(v + h * hd, w, hd, eps, v + h * hd);
}

/* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): gelu_pytorch_tanh */
static double gelu_tanh_d(double x) { return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }

void fy_tiny_reference(const fy_tiny_model_t *m, const int32_t *tokens, int n, double *logits)
{
    const fy_tiny_cfg_t *c = &m->c;
    const int D = c->dim, hd = m->head_dim, H = c->n_heads, KV = c->n_kv_heads, F = c->ffn;
    const bool gemma = c->arch == FY_ARCH_GEMMA3;
    /* Gemma scales its embeddings by sqrt(dim) and its queries by query_pre_attn_scalar^-0.5 */
    const double emb_scale = gemma ? sqrt((double)D) : 1.0;
    const double qscale = 1.0 / sqrt(gemma && c->query_scalar ? (double)c->query_scalar : (double)hd);
    double *x = calloc((size_t)n * D, sizeof(double));
    double *K = calloc((size_t)n * KV * hd, sizeof(double)), *V = calloc((size_t)n * KV * hd, sizeof(double));
    double *xb = malloc((size_t)D * sizeof(double)), *q = malloc((size_t)H * hd * sizeof(double));
    double *att = malloc((size_t)H * hd * sizeof(double)), *o = malloc((size_t)D * sizeof(double));
    double *g = malloc((size_t)F * sizeof(double)), *u = malloc((size_t)F * sizeof(double));
    double *sc = malloc((size_t)n * sizeof(double)), inv[512];
    for (int t = 0; t < n; t++)
        for (int i = 0; i < D; i++) x[(long)t * D + i] = m->embd[(long)tokens[t] * D + i] * emb_scale;
    for (int l = 0; l < c->n_layers; l++) {
        const fy_tiny_layer_t *L = &m->L[l];
        const int W = fy_tiny_layer_window(m, l);
        inv_freq_d(c, hd, gemma && W, inv); /* Gemma's sliding layers turn with their own base */
        /* K/V of every position first, then each position attends causally */
        for (int t = 0; t < n; t++) {
            double *kt = K + (long)t * KV * hd, *vt = V + (long)t * KV * hd;
            rmsnorm_d(x + (long)t * D, L->attn_norm, D, c->eps, xb);
            matvec_d(L->wk, xb, KV * hd, D, kt);
            matvec_d(L->wv, xb, KV * hd, D, vt);
            for (int i = 0; L->bk && i < KV * hd; i++) kt[i] += L->bk[i], vt[i] += L->bv[i];
            if (L->k_norm) head_norms_d(kt, KV, hd, L->k_norm, c->eps);
            rope_neox_d(kt, KV, hd, t, inv);
        }
        double *nx = malloc((size_t)n * D * sizeof(double));
        for (int t = 0; t < n; t++) {
            double *xt = x + (long)t * D;
            rmsnorm_d(xt, L->attn_norm, D, c->eps, xb);
            matvec_d(L->wq, xb, H * hd, D, q);
            for (int i = 0; L->bq && i < H * hd; i++) q[i] += L->bq[i];
            if (L->q_norm) head_norms_d(q, H, hd, L->q_norm, c->eps);
            rope_neox_d(q, H, hd, t, inv);
            /* keys s with s <= t and, in a sliding layer, s > t - W */
            int lo = W && t - W + 1 > 0 ? t - W + 1 : 0;
            for (int h = 0; h < H; h++) {
                int kvh = h / (H / KV);
                double mx = -INFINITY, sum = 0;
                for (int s = lo; s <= t; s++) {
                    double d = 0;
                    for (int i = 0; i < hd; i++) d += q[h * hd + i] * K[((long)s * KV + kvh) * hd + i];
                    sc[s] = d * qscale;
                    if (sc[s] > mx) mx = sc[s];
                }
                for (int s = lo; s <= t; s++) sum += (sc[s] = exp(sc[s] - mx));
                for (int i = 0; i < hd; i++) {
                    double a = 0;
                    for (int s = lo; s <= t; s++) a += sc[s] * V[((long)s * KV + kvh) * hd + i];
                    att[h * hd + i] = a / sum;
                }
            }
            matvec_d(L->wo, att, D, H * hd, o);
            if (L->post_attn_norm) rmsnorm_d(o, L->post_attn_norm, D, c->eps, o);
            double *y = nx + (long)t * D;
            for (int i = 0; i < D; i++) y[i] = xt[i] + o[i];
            rmsnorm_d(y, L->ffn_norm, D, c->eps, xb);
            matvec_d(L->wg, xb, F, D, g);
            matvec_d(L->wu, xb, F, D, u);
            for (int i = 0; i < F; i++) g[i] = (gemma ? gelu_tanh_d(g[i]) : g[i] / (1.0 + exp(-g[i]))) * u[i];
            matvec_d(L->wd, g, D, F, o);
            if (L->post_ffn_norm) rmsnorm_d(o, L->post_ffn_norm, D, c->eps, o);
            for (int i = 0; i < D; i++) y[i] += o[i];
        }
        memcpy(x, nx, (size_t)n * D * sizeof(double));
        free(nx);
    }
    for (int t = 0; t < n; t++) {
        rmsnorm_d(x + (long)t * D, m->out_norm, D, c->eps, xb);
        matvec_d(m->output, xb, m->vocab, D, logits + (long)t * m->vocab);
    }
    free(x), free(K), free(V), free(xb), free(q), free(att), free(o), free(g), free(u), free(sc);
}

double fy_rel_err(const float *a, const double *b, long n)
{
    double num = 0, den = 0;
    for (long i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

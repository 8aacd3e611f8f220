/* tinymodel.c - tiny random Llama models for tests, and their reference forward pass. */
#include "tinymodel.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dtype.h"
#include "gguf_writer.h"
#include "testutil.h"

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
                         .seed = 42};
}

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
    m->head_dim = c->dim / c->n_heads;
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
    if (t == FY_DTYPE_F16 || t == FY_DTYPE_BF16) { /* 16-bit files store the norms in 16 bits too */
        roundtrip(m->out_norm, 1, D, t);
        for (int l = 0; l < m->c.n_layers; l++) {
            roundtrip(m->L[l].attn_norm, 1, D, t);
            roundtrip(m->L[l].ffn_norm, 1, D, t);
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

/* The metadata of a llama model of shape c with the byte-level tokenizer. */
static void put_header(fy_gw_t *w, const fy_tiny_cfg_t *c, int hd, int vocab)
{
    int D = c->dim, F = c->ffn;
    fy_gw_str(w, "general.architecture", "llama");
    fy_gw_str(w, "general.name", "tiny");
    fy_gw_u32(w, "llama.block_count", (uint32_t)c->n_layers);
    fy_gw_u32(w, "llama.context_length", (uint32_t)c->max_ctx);
    fy_gw_u32(w, "llama.embedding_length", (uint32_t)D);
    fy_gw_u32(w, "llama.feed_forward_length", (uint32_t)F);
    fy_gw_u32(w, "llama.attention.head_count", (uint32_t)c->n_heads);
    fy_gw_u32(w, "llama.attention.head_count_kv", (uint32_t)c->n_kv_heads);
    fy_gw_u32(w, "llama.rope.dimension_count", (uint32_t)hd);
    fy_gw_f32(w, "llama.rope.freq_base", c->theta);
    fy_gw_f32(w, "llama.attention.layer_norm_rms_epsilon", c->eps);
    fy_gw_str(w, "tokenizer.ggml.model", "gpt2");
    fy_gw_str(w, "tokenizer.ggml.pre", "default");
    char strs[256][4];
    const char *toks[256 + N_SPECIAL];
    int32_t types[256 + N_SPECIAL];
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
    fy_gw_str_arr(w, "tokenizer.ggml.merges", NULL, 0);
    fy_gw_u32(w, "tokenizer.ggml.bos_token_id", 257);
    fy_gw_u32(w, "tokenizer.ggml.eos_token_id", 258);
    fy_gw_bool(w, "tokenizer.ggml.add_bos_token", false);
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
    for (int l = 0; l < c->n_layers; l++) {
        const fy_tiny_layer_t *L = &m->L[l];
        char name[64];
#define NAME(s) (snprintf(name, sizeof(name), "blk.%d." s, l), name)
        float *q = permute_qk(L->wq, c->n_heads, hd, D), *k = permute_qk(L->wk, c->n_kv_heads, hd, D);
        add_vector(w, NAME("attn_norm.weight"), L->attn_norm, D);
        add_matrix(w, NAME("attn_q.weight"), q, (long)c->n_heads * hd, D, ggml);
        add_matrix(w, NAME("attn_k.weight"), k, (long)c->n_kv_heads * hd, D, ggml);
        add_matrix(w, NAME("attn_v.weight"), L->wv, (long)c->n_kv_heads * hd, D, ggml);
        add_matrix(w, NAME("attn_output.weight"), L->wo, D, (long)c->n_heads * hd, ggml);
        add_vector(w, NAME("ffn_norm.weight"), L->ffn_norm, D);
        add_matrix(w, NAME("ffn_gate.weight"), L->wg, F, D, ggml);
        add_matrix(w, NAME("ffn_up.weight"), L->wu, F, D, ggml);
        add_matrix(w, NAME("ffn_down.weight"), L->wd, D, F, ggml);
#undef NAME
        free(q), free(k);
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
    fy_gw_tensor(w, name, ggml, 2, ne, buf, rb * (size_t)rows);
    free(buf), free(row);
}

bool fy_tiny_write_random_gguf(const fy_tiny_cfg_t *c, const char *path, uint32_t ggml)
{
    int D = c->dim, hd = c->dim / c->n_heads, F = c->ffn, vocab = 256 + N_SPECIAL;
    uint64_t s = c->seed;
    float sd = 1.0f / sqrtf((float)D), sf = 1.0f / sqrtf((float)F);
    float *ones = malloc((size_t)D * sizeof(float));
    if (!ones) abort();
    for (int i = 0; i < D; i++) ones[i] = 1.0f;
    fy_gw_t *w = fy_gw_new();
    put_header(w, c, hd, vocab);
    add_random_matrix(w, "token_embd.weight", vocab, D, ggml, 1.0f, &s);
    add_vector(w, "output_norm.weight", ones, D);
    if (!c->tied) add_random_matrix(w, "output.weight", vocab, D, ggml, sd, &s);
    for (int l = 0; l < c->n_layers; l++) {
        char name[64];
#define NAME(x) (snprintf(name, sizeof(name), "blk.%d." x, l), name)
        add_vector(w, NAME("attn_norm.weight"), ones, D);
        add_random_matrix(w, NAME("attn_q.weight"), (long)c->n_heads * hd, D, ggml, sd, &s);
        add_random_matrix(w, NAME("attn_k.weight"), (long)c->n_kv_heads * hd, D, ggml, sd, &s);
        add_random_matrix(w, NAME("attn_v.weight"), (long)c->n_kv_heads * hd, D, ggml, sd, &s);
        add_random_matrix(w, NAME("attn_output.weight"), D, (long)c->n_heads * hd, ggml, sd, &s);
        add_vector(w, NAME("ffn_norm.weight"), ones, D);
        add_random_matrix(w, NAME("ffn_gate.weight"), F, D, ggml, sd, &s);
        add_random_matrix(w, NAME("ffn_up.weight"), F, D, ggml, sd, &s);
        add_random_matrix(w, NAME("ffn_down.weight"), D, F, ggml, sf, &s);
#undef NAME
    }
    bool ok = fy_gw_write(w, path);
    fy_gw_free(w);
    free(ones);
    return ok;
}

/* ---- Hugging Face folder ------------------------------------------------------------ */

typedef struct st_entry {
    char name[96];
    const float *data;
    long rows, cols; /* rows = 0 for a vector */
} st_entry_t;

static size_t elem_size(const char *dtype) { return !strcmp(dtype, "F32") ? 4 : 2; }

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

bool fy_tiny_write_hf(const fy_tiny_model_t *m, const char *dir, const char *dtype, int shards)
{
    const fy_tiny_cfg_t *c = &m->c;
    int D = c->dim, hd = m->head_dim, F = c->ffn;
    mkdir(dir, 0755);
    char path[1024];
    json_t *cfg = json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:b, s:i, s:i}", "architectures",
                            "LlamaForCausalLM", "model_type", "llama", "hidden_size", D, "intermediate_size", F,
                            "num_hidden_layers", c->n_layers, "num_attention_heads", c->n_heads, "num_key_value_heads",
                            c->n_kv_heads, "vocab_size", m->vocab, "max_position_embeddings", c->max_ctx, "rope_theta",
                            (double)c->theta, "rms_norm_eps", (double)c->eps, "tie_word_embeddings", c->tied,
                            "bos_token_id", 257, "eos_token_id", 258);
    snprintf(path, sizeof(path), "%s/config.json", dir);
    if (!cfg || json_dump_file(cfg, path, JSON_INDENT(1))) return false;
    json_decref(cfg);
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    if (!write_tokenizer_json(m, path)) return false;

    int n = 0, cap = 3 + 9 * c->n_layers;
    st_entry_t *e = calloc((size_t)cap, sizeof(*e));
    if (!e) abort();
#define ADD(nm, d, r, cl)                                                                                              \
    (snprintf(e[n].name, sizeof(e[n].name), "%s", nm), e[n].data = d, e[n].rows = r, e[n].cols = cl, n++)
    ADD("model.embed_tokens.weight", m->embd, m->vocab, D);
    ADD("model.norm.weight", m->out_norm, 0, D);
    if (!c->tied) ADD("lm_head.weight", m->output, m->vocab, D);
    for (int l = 0; l < c->n_layers; l++) {
        const fy_tiny_layer_t *L = &m->L[l];
        char nm[96];
#define LADD(s, d, r, cl) (snprintf(nm, sizeof(nm), "model.layers.%d." s, l), ADD(nm, d, r, cl))
        LADD("input_layernorm.weight", L->attn_norm, 0, D);
        LADD("self_attn.q_proj.weight", L->wq, c->n_heads * hd, D);
        LADD("self_attn.k_proj.weight", L->wk, c->n_kv_heads * hd, D);
        LADD("self_attn.v_proj.weight", L->wv, c->n_kv_heads * hd, D);
        LADD("self_attn.o_proj.weight", L->wo, D, c->n_heads * hd);
        LADD("post_attention_layernorm.weight", L->ffn_norm, 0, D);
        LADD("mlp.gate_proj.weight", L->wg, F, D);
        LADD("mlp.up_proj.weight", L->wu, F, D);
        LADD("mlp.down_proj.weight", L->wd, D, F);
#undef LADD
    }
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

static void rope_neox_d(double *v, int n_heads, int hd, int pos, double theta)
{
    for (int h = 0; h < n_heads; h++) {
        double *x = v + h * hd;
        for (int i = 0; i < hd / 2; i++) {
            double a = pos * pow(theta, -2.0 * i / hd);
            double x0 = x[i], x1 = x[i + hd / 2];
            x[i] = x0 * cos(a) - x1 * sin(a);
            x[i + hd / 2] = x0 * sin(a) + x1 * cos(a);
        }
    }
}

void fy_tiny_reference(const fy_tiny_model_t *m, const int32_t *tokens, int n, double *logits)
{
    const fy_tiny_cfg_t *c = &m->c;
    int D = c->dim, hd = m->head_dim, H = c->n_heads, KV = c->n_kv_heads, F = c->ffn;
    double *x = calloc((size_t)n * D, sizeof(double));
    double *K = calloc((size_t)n * KV * hd, sizeof(double)), *V = calloc((size_t)n * KV * hd, sizeof(double));
    double *xb = malloc((size_t)D * sizeof(double)), *q = malloc((size_t)H * hd * sizeof(double));
    double *att = malloc((size_t)H * hd * sizeof(double)), *o = malloc((size_t)D * sizeof(double));
    double *g = malloc((size_t)F * sizeof(double)), *u = malloc((size_t)F * sizeof(double));
    double *sc = malloc((size_t)n * sizeof(double));
    for (int t = 0; t < n; t++)
        for (int i = 0; i < D; i++) x[(long)t * D + i] = m->embd[(long)tokens[t] * D + i];
    for (int l = 0; l < c->n_layers; l++) {
        const fy_tiny_layer_t *L = &m->L[l];
        /* K/V of every position first, then each position attends causally */
        for (int t = 0; t < n; t++) {
            rmsnorm_d(x + (long)t * D, L->attn_norm, D, c->eps, xb);
            matvec_d(L->wk, xb, KV * hd, D, K + (long)t * KV * hd);
            matvec_d(L->wv, xb, KV * hd, D, V + (long)t * KV * hd);
            rope_neox_d(K + (long)t * KV * hd, KV, hd, t, c->theta);
        }
        double *nx = malloc((size_t)n * D * sizeof(double));
        for (int t = 0; t < n; t++) {
            double *xt = x + (long)t * D;
            rmsnorm_d(xt, L->attn_norm, D, c->eps, xb);
            matvec_d(L->wq, xb, H * hd, D, q);
            rope_neox_d(q, H, hd, t, c->theta);
            for (int h = 0; h < H; h++) {
                int kvh = h / (H / KV);
                double mx = -INFINITY, sum = 0;
                for (int s = 0; s <= t; s++) {
                    double d = 0;
                    for (int i = 0; i < hd; i++) d += q[h * hd + i] * K[((long)s * KV + kvh) * hd + i];
                    sc[s] = d / sqrt((double)hd);
                    if (sc[s] > mx) mx = sc[s];
                }
                for (int s = 0; s <= t; s++) sum += (sc[s] = exp(sc[s] - mx));
                for (int i = 0; i < hd; i++) {
                    double a = 0;
                    for (int s = 0; s <= t; s++) a += sc[s] * V[((long)s * KV + kvh) * hd + i];
                    att[h * hd + i] = a / sum;
                }
            }
            matvec_d(L->wo, att, D, H * hd, o);
            double *y = nx + (long)t * D;
            for (int i = 0; i < D; i++) y[i] = xt[i] + o[i];
            rmsnorm_d(y, L->ffn_norm, D, c->eps, xb);
            matvec_d(L->wg, xb, F, D, g);
            matvec_d(L->wu, xb, F, D, u);
            for (int i = 0; i < F; i++) g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
            matvec_d(L->wd, g, D, F, o);
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

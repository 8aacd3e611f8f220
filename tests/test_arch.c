/*
 * test_arch.c - the architectures: tiny random models of each (llama with a
 * sliding window and Llama 3 or linear rope scaling, mistral, qwen2's
 * biases, qwen3's Q/K norms and wide heads, gemma3 with all its pieces),
 * written as GGUF and as Hugging Face folders, checked against the
 * double-precision reference of tests/tinymodel.c through chunked prefill
 * and token-by-token decode over every block size; sliding windows that cut
 * through blocks and segments and windows longer than the sequence; the
 * description each file yields; bad input (one error naming the file and
 * the tensor or key, never a crash); and `ferry info`'s inspection of files
 * ferry cannot run.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "model/gguf.h"
#include "tests/gguf_writer.h"
#include "kv/kv.h"
#include "common/mem.h"
#include "model/model.h"
#include "model/prompt.h"
#include "engine/runner.h"
#include "tests/testutil.h"
#include "tests/tinymodel.h"

#define SEED 20261123u
#define MAX_CTX 256

static void make_tokens(int32_t *t, int n, int vocab, uint64_t seed)
{
    for (int i = 0; i < n; i++) t[i] = (int32_t)(fy_test_rand_u64(&seed) % (uint64_t)vocab);
}

typedef struct env {
    fy_model_t *m;
    fy_backend_t *be;
    fy_runner_t *r;
    fy_kv_hasher_t *hasher;
    fy_kvm_t *kvm;
} env_t;

static void env_open(env_t *e, const char *path, int threads, int block_size, fy_dtype_t kv)
{
    memset(e, 0, sizeof(*e));
    assert_int_equal(fy_model_load(path, &e->m), FY_OK);
    fy_backend_params_t bp = {.n_threads = threads};
    assert_int_equal(fy_backend_create("cpu", &bp, &e->be), FY_OK);
    fy_runner_params_t rp;
    fy_runner_params_default(&rp);
    rp.max_batch_tokens = 160;
    rp.max_seqs = 4;
    rp.max_logits = 160;
    rp.max_ctx = MAX_CTX;
    rp.block_size = block_size;
    rp.kv_dtype = kv;
    rp.n_kv_blocks = 4 * (MAX_CTX / block_size);
    assert_int_equal(fy_runner_create(e->m, e->be, &rp, &e->r), FY_OK);
    assert_int_equal(fy_kv_hasher_create_random(&e->hasher), FY_OK);
    fy_kvm_params_t kp;
    fy_runner_kvm_params(e->r, &kp);
    kp.hasher = e->hasher;
    kp.prefix_caching = false;
    assert_int_equal(fy_kvm_create(&kp, &e->kvm), FY_OK);
}

static void env_close(env_t *e)
{
    fy_kvm_stats_t ks;
    fy_kvm_stats(e->kvm, &ks);
    assert_int_equal(ks.tier[FY_KV_DEVICE].free, ks.tier[FY_KV_DEVICE].total);
    assert_int_equal(fy_kvm_check(e->kvm), FY_OK);
    fy_kvm_destroy(e->kvm);
    fy_kv_hasher_destroy(e->hasher);
    fy_runner_destroy(e->r);
    fy_backend_destroy(e->be);
    fy_model_destroy(e->m);
}

/* tokens through the runner in chunks of `chunk` (1: decode), logits for every token into out [n, vocab] */
static void run_chunked(env_t *e, const int32_t *tok, int n, int chunk, float *out)
{
    int vocab = fy_model_config(e->m)->vocab_size;
    fy_block_table_t bt;
    assert_int_equal(fy_kvm_seq_init(e->kvm, &bt, MAX_CTX, NULL), FY_OK);
    for (int done = 0; done < n;) {
        int k = n - done < chunk ? n - done : chunk;
        assert_int_equal(fy_kvm_seq_reserve(e->kvm, &bt, done + k, NULL), FY_OK);
        /* KV groups: a sliding group holds no more than its window and this
         * step can see; a global one every block */
        const fy_kv_layout_t *lay = fy_kvm_layout(e->kvm);
        for (int32_t g = 0; g < lay->n_groups; g++) {
            int32_t w = lay->group_window[g], bs = lay->block_size, held = bt.n_blocks - bt.lo[g];
            int32_t most = w ? (w - 1 + k + bs - 1) / bs + 1 : (done + k + bs - 1) / bs;
            if (held > most || (!w && bt.lo[g] != 0))
                fail_msg("group %d (window %d) holds %d blocks at %d + %d tokens; at most %d", g, w, held, done, k,
                         most);
        }
        fy_forward_seq_t f = {&bt, tok + done, k, done, k, NULL};
        assert_int_equal(fy_runner_forward(e->r, &f, 1, out + (long)done * vocab), FY_OK);
        done += k;
        fy_kvm_seq_commit(e->kvm, &bt, tok, done, NULL);
    }
    fy_kvm_seq_release(e->kvm, &bt);
    fy_kvm_seq_deinit(&bt);
}

/* The file's logits against the reference: every block size, prefill in
 * one go, in chunks, and token by token (decode, split over both threads). */
static void check_reference(const char *path, const fy_tiny_model_t *tm, int n_tok, double tol)
{
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)n_tok);
    make_tokens(tok, n_tok, tm->vocab, SEED);
    double *ref = malloc(sizeof(double) * (size_t)n_tok * tm->vocab);
    float *got = malloc(sizeof(float) * (size_t)n_tok * tm->vocab);
    fy_tiny_reference(tm, tok, n_tok, ref);
    const int block_sizes[] = {8, 16, 32}, chunks[] = {1, 7, n_tok};
    for (size_t b = 0; b < FY_ARRAY_LEN(block_sizes); b++) {
        env_t e;
        env_open(&e, path, 2, block_sizes[b], FY_DTYPE_F32);
        for (size_t c = 0; c < FY_ARRAY_LEN(chunks); c++) {
            memset(got, 0, sizeof(float) * (size_t)n_tok * tm->vocab);
            run_chunked(&e, tok, n_tok, chunks[c], got);
            double err = fy_rel_err(got, ref, (long)n_tok * tm->vocab);
            if (!(err < tol))
                fail_msg("%s: block %d, chunk %d: relative error %.3g >= %.3g (seed %u)", path, block_sizes[b],
                         chunks[c], err, tol, SEED);
        }
        /* a window that leaves whole blocks behind (decode and 7-token
         * chunks move past them) gave them back while the sequence ran */
        const fy_kv_layout_t *lay = fy_kvm_layout(e.kvm);
        bool behind = false;
        for (int32_t g = 0; g < lay->n_groups; g++)
            behind |= lay->group_window[g] && n_tok - lay->group_window[g] >= 2 * block_sizes[b] + 7;
        fy_kvm_stats_t ks;
        fy_kvm_stats(e.kvm, &ks);
        if (behind && ks.slid_blocks == 0)
            fail_msg("%s: block %d: no block of a sliding group was dropped", path, block_sizes[b]);
        env_close(&e);
    }
    free(tok), free(ref), free(got);
}

/* Writes tm as GGUF and as a Hugging Face folder and checks both. */
static void check_both(const fy_tiny_model_t *tm, const char *name, int n_tok)
{
    char file[96], dir[96];
    snprintf(file, sizeof(file), "%s.gguf", name);
    snprintf(dir, sizeof(dir), "%s-hf", name);
    const char *gguf = fy_test_path(file);
    assert_true(fy_tiny_write_gguf(tm, gguf, GW_F32));
    check_reference(gguf, tm, n_tok, 1e-5);
    const char *hf = fy_test_path(dir);
    assert_true(fy_tiny_write_hf(tm, hf, "F32", 1));
    check_reference(hf, tm, n_tok, 1e-5);
}

/* The description a loaded file yields. */
static void expect_layers(const char *path, const fy_tiny_model_t *tm)
{
    fy_model_t *m;
    assert_int_equal(fy_model_load(path, &m), FY_OK);
    const fy_model_config_t *c = fy_model_config(m);
    assert_int_equal(c->arch_id, tm->c.arch);
    assert_int_equal(c->head_dim, tm->head_dim);
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer[l].window != fy_tiny_layer_window(tm, l))
            fail_msg("%s: layer %d: window %d, expected %d", path, l, c->layer[l].window, fy_tiny_layer_window(tm, l));
        bool local = tm->c.arch == FY_ARCH_GEMMA3 && c->layer[l].window;
        assert_float_equal(c->layer[l].rope.theta, local ? tm->c.local_theta : tm->c.theta, 1e-3);
    }
    fy_model_destroy(m);
}

/* ---- the architectures ------------------------------------------------------------ */

static void test_llama_sliding_window(void **state)
{
    /* windows that end inside blocks of 8, 16 and 32, one exactly a block,
     * one longer than the sequence; as llama and as mistral files */
    const int windows[] = {5, 13, 16, 100};
    for (size_t i = 0; i < FY_ARRAY_LEN(windows); i++) {
        fy_tiny_cfg_t c;
        fy_tiny_cfg_default(&c);
        c.window = windows[i];
        c.mistral = i % 2;
        fy_tiny_model_t tm;
        fy_tiny_init(&tm, &c);
        char name[32];
        snprintf(name, sizeof(name), "llama-w%d", windows[i]);
        check_both(&tm, name, 45);
        char file[48];
        snprintf(file, sizeof(file), "%s.gguf", name);
        expect_layers(fy_test_path(file), &tm);
        fy_tiny_free(&tm);
    }
}

/* A window longer than the sequence is global attention, to the bit; and a
 * long sequence whose window skips whole 64-position segments. */
static void test_window_past_the_sequence_and_segments(void **state)
{
    fy_tiny_cfg_t c;
    fy_tiny_cfg_default(&c);
    fy_tiny_model_t global, wide;
    fy_tiny_init(&global, &c);
    c.window = 1000;
    fy_tiny_init(&wide, &c);
    const char *pg = fy_test_path("global.gguf"), *pw = fy_test_path("wide.gguf");
    assert_true(fy_tiny_write_gguf(&global, pg, GW_F32));
    assert_true(fy_tiny_write_gguf(&wide, pw, GW_F32));
    enum { N = 150 };
    int32_t tok[N];
    make_tokens(tok, N, global.vocab, SEED + 1);
    float *a = malloc(sizeof(float) * N * (size_t)global.vocab), *b = malloc(sizeof(float) * N * (size_t)global.vocab);
    const int chunks[] = {1, 64};
    for (size_t ci = 0; ci < FY_ARRAY_LEN(chunks); ci++) {
        env_t e;
        env_open(&e, pg, 2, 16, FY_DTYPE_F16);
        run_chunked(&e, tok, N, chunks[ci], a);
        env_close(&e);
        env_open(&e, pw, 2, 16, FY_DTYPE_F16);
        run_chunked(&e, tok, N, chunks[ci], b);
        env_close(&e);
        assert_memory_equal(a, b, sizeof(float) * N * (size_t)global.vocab);
    }
    free(a), free(b);
    fy_tiny_free(&global), fy_tiny_free(&wide);
    /* 150 tokens, a window of 20: queries past 84 skip whole segments */
    c.window = 20;
    fy_tiny_model_t tm;
    fy_tiny_init(&tm, &c);
    const char *p = fy_test_path("long-w20.gguf");
    assert_true(fy_tiny_write_gguf(&tm, p, GW_F32));
    check_reference(p, &tm, N, 1e-5);
    fy_tiny_free(&tm);
}

static void test_llama3_and_linear_rope_scaling(void **state)
{
    fy_tiny_cfg_t c;
    fy_tiny_cfg_default(&c);
    /* wavelengths of head size 16 at base 10000 run from 6 to 20,000:
     * with an original context of 64, low 1 and high 4, some frequencies
     * are kept, some divided by the factor and some blended */
    c.rope_scaling = FY_TINY_ROPE_LLAMA3;
    c.rope_factor = 8;
    c.rope_low = 1;
    c.rope_high = 4;
    c.rope_orig_ctx = 64;
    fy_tiny_model_t tm;
    fy_tiny_init(&tm, &c);
    check_both(&tm, "llama3", 45);
    fy_model_t *m;
    assert_int_equal(fy_model_load(fy_test_path("llama3.gguf"), &m), FY_OK);
    const fy_rope_t *r = &fy_model_config(m)->layer[0].rope;
    assert_non_null(r->freq_factors);
    /* wavelengths 6.3, 20, 63, 199, ...: below 64 / 4 kept, above 64 / 1
     * divided by the factor, the two between blended */
    assert_float_equal(r->freq_factors[0], 1.0f, 0);
    for (int i = 1; i <= 2; i++) assert_true(r->freq_factors[i] > 1.0f && r->freq_factors[i] < 8.0f);
    for (int i = 3; i < 8; i++) assert_float_equal(r->freq_factors[i], 8.0f, 0);
    fy_model_destroy(m);
    fy_tiny_free(&tm);

    fy_tiny_cfg_default(&c);
    c.rope_scaling = FY_TINY_ROPE_LINEAR;
    c.rope_factor = 4;
    fy_tiny_init(&tm, &c);
    check_both(&tm, "linear", 45);
    fy_tiny_free(&tm);
}

static void test_qwen2_bias(void **state)
{
    fy_tiny_cfg_t c;
    fy_tiny_cfg_arch(&c, FY_ARCH_QWEN2);
    fy_tiny_model_t tm;
    fy_tiny_init(&tm, &c);
    check_both(&tm, "qwen2", 45);
    expect_layers(fy_test_path("qwen2.gguf"), &tm);
    fy_tiny_free(&tm);
    /* Qwen's sliding window: the layers from max_window_layers on (in GGUF a window per layer) */
    fy_tiny_cfg_arch(&c, FY_ARCH_QWEN2);
    c.window = 9;
    c.max_window_layers = 1;
    c.tied = true;
    fy_tiny_init(&tm, &c);
    check_both(&tm, "qwen2-swa", 45);
    expect_layers(fy_test_path("qwen2-swa.gguf"), &tm);
    expect_layers(fy_test_path("qwen2-swa-hf"), &tm);
    fy_tiny_free(&tm);
}

static void test_qwen3_qk_norm(void **state)
{
    fy_tiny_cfg_t c;
    fy_tiny_cfg_arch(&c, FY_ARCH_QWEN3); /* head size 32: q is 128 wide on a 64-wide model */
    fy_tiny_model_t tm;
    fy_tiny_init(&tm, &c);
    check_both(&tm, "qwen3", 45);
    expect_layers(fy_test_path("qwen3-hf"), &tm);
    fy_tiny_free(&tm);
}

static void test_gemma3(void **state)
{
    /* 6 layers: 0-4 slide over 7 positions turning with base 10000, 5 is
     * global with base 1e6; norms before and after attention and MLP, q/k
     * norms, gelu-tanh, sqrt(dim) embeddings, tied output */
    fy_tiny_cfg_t c;
    fy_tiny_cfg_arch(&c, FY_ARCH_GEMMA3);
    fy_tiny_model_t tm;
    fy_tiny_init(&tm, &c);
    check_both(&tm, "gemma3", 45);
    expect_layers(fy_test_path("gemma3.gguf"), &tm);
    expect_layers(fy_test_path("gemma3-hf"), &tm);
    fy_model_t *m;
    assert_int_equal(fy_model_load(fy_test_path("gemma3.gguf"), &m), FY_OK);
    const fy_model_config_t *mc = fy_model_config(m);
    assert_true(mc->tied_embeddings);
    assert_float_equal(mc->embed_scale, 8.0f, 1e-6);
    assert_float_equal(mc->attn_scale, 0.25f, 1e-7); /* 1 / sqrt(16) */
    assert_true(mc->traits.qk_norm && mc->traits.post_norms && mc->traits.act == FY_ACT_GELU_TANH);
    fy_model_destroy(m);
    fy_tiny_free(&tm);

    /* the period written down (3), its own query scalar, linear scaling of
     * the global layers only, a local base of its own; and the multimodal
     * checkpoint (text_config, language_model.* names, layer_types) */
    fy_tiny_cfg_arch(&c, FY_ARCH_GEMMA3);
    c.swa_period = 3;
    c.write_pattern = true;
    c.query_scalar = 36;
    c.rope_scaling = FY_TINY_ROPE_LINEAR;
    c.rope_factor = 8;
    c.local_theta = 20000;
    c.window = 11;
    fy_tiny_init(&tm, &c);
    check_both(&tm, "gemma3-p3", 45);
    expect_layers(fy_test_path("gemma3-p3.gguf"), &tm);
    tm.c.multimodal = true;
    tm.c.layer_types = true;
    const char *mm = fy_test_path("gemma3-mm");
    assert_true(fy_tiny_write_hf(&tm, mm, "F32", 2));
    check_reference(mm, &tm, 45, 1e-5);
    expect_layers(mm, &tm);
    fy_tiny_free(&tm);
}

/* ---- bad input ------------------------------------------------------------------- */

/* Loads path and checks the status and that one error line names the file
 * and every given substring. */
static fy_status_t load_expect(const char *path, fy_status_t want, const char *a, const char *b, const char *c)
{
    fy_model_t *m = NULL;
    fy_test_log_begin();
    fy_status_t st = fy_model_load(path, &m);
    fy_test_log_end();
    fy_model_destroy(m);
    if (st != want)
        fail_msg("%s: status %s, expected %s; log:\n%s", path, fy_status_str(st), fy_status_str(want),
                 fy_test_log_text());
    if (!fy_test_log_has(path, "error", a, b, c, NULL))
        fail_msg("%s: no error line naming '%s' '%s' '%s'; log:\n%s", path, a, b ? b : "", c ? c : "",
                 fy_test_log_text());
    return st;
}

/* the GGUF of a tiny model, through the writer, with edits */
typedef struct variant {
    fy_arch_t arch;
    const char *gguf_arch; /* general.architecture written instead of the model's */
    const char *drop;      /* a tensor left out */
    int64_t bias_len;      /* qwen2: blk.0.attn_q.bias of this length */
    uint32_t pattern;      /* sliding_window_pattern written */
    int n_windows;         /* sliding_window as an array of this many entries */
    const char *rope_type; /* rope.scaling.type */
    bool rope_freqs_short; /* a rope_freqs tensor one entry short */
    uint32_t bad_type;     /* blk.0.attn_k.weight of this ggml type */
    int32_t extra_layers;  /* block_count this much above the layers whose tensors are written */
} variant_t;

static bool keep_tensor(const variant_t *v, const char *name) { return !v->drop || strcmp(v->drop, name); }

static const char *write_gguf_variant(const variant_t *v, const char *file)
{
    fy_tiny_cfg_t c;
    fy_tiny_cfg_arch(&c, v->arch);
    if (v->pattern || v->n_windows) c.window = 5;
    fy_tiny_model_t tm;
    fy_tiny_init(&tm, &c);
    const char *path = fy_test_path(file);
    assert_true(fy_tiny_write_gguf(&tm, path, GW_F32));
    fy_tiny_free(&tm);
    /* copy it key by key and tensor by tensor, changed */
    fy_gguf_t *g;
    assert_int_equal(fy_gguf_open(path, &g), FY_OK);
    fy_gw_t *w = fy_gw_new();
    const char *A = v->gguf_arch ? v->gguf_arch : fy_arch_traits(v->arch)->name;
    char key[96];
#define KEY(k) (snprintf(key, sizeof(key), "%s." k, A), key)
    fy_gw_str(w, "general.architecture", A);
    int32_t n_layers = c.n_layers;
    fy_gw_u32(w, KEY("block_count"), (uint32_t)(n_layers + v->extra_layers));
    fy_gw_u32(w, KEY("context_length"), (uint32_t)c.max_ctx);
    fy_gw_u32(w, KEY("embedding_length"), (uint32_t)c.dim);
    fy_gw_u32(w, KEY("feed_forward_length"), (uint32_t)c.ffn);
    fy_gw_u32(w, KEY("attention.head_count"), (uint32_t)c.n_heads);
    fy_gw_u32(w, KEY("attention.head_count_kv"), (uint32_t)c.n_kv_heads);
    int hd = c.head_dim ? c.head_dim : c.dim / c.n_heads;
    fy_gw_u32(w, KEY("attention.key_length"), (uint32_t)hd);
    fy_gw_u32(w, KEY("attention.value_length"), (uint32_t)hd);
    if (v->n_windows) {
        int32_t win[16] = {0};
        for (int i = 0; i < v->n_windows; i++) win[i] = 5;
        fy_gw_i32_arr(w, KEY("attention.sliding_window"), win, (size_t)v->n_windows);
    } else if (c.window) {
        fy_gw_u32(w, KEY("attention.sliding_window"), (uint32_t)c.window);
    }
    if (v->pattern) fy_gw_u32(w, KEY("attention.sliding_window_pattern"), v->pattern);
    if (v->rope_type) fy_gw_str(w, KEY("rope.scaling.type"), v->rope_type);
#undef KEY
    static const char *const copy_keys[] = {"tokenizer.ggml.model", "tokenizer.ggml.pre"};
    for (size_t i = 0; i < FY_ARRAY_LEN(copy_keys); i++) {
        fy_str_t s;
        assert_int_equal(fy_gguf_get_str(g, copy_keys[i], &s), FY_OK);
        char buf[64];
        snprintf(buf, sizeof(buf), "%.*s", (int)s.len, s.ptr);
        fy_gw_str(w, copy_keys[i], buf);
    }
    fy_str_t *toks;
    uint64_t nt;
    assert_int_equal(fy_gguf_get_str_arr(g, "tokenizer.ggml.tokens", &toks, &nt), FY_OK);
    const char **tp = calloc(nt, sizeof(char *));
    for (uint64_t i = 0; i < nt; i++) tp[i] = fy_strndup(toks[i].ptr, toks[i].len);
    fy_gw_str_arr(w, "tokenizer.ggml.tokens", tp, nt);
    for (uint64_t i = 0; i < nt; i++) fy_free((void *)tp[i]);
    free(tp);
    fy_free(toks);
    int32_t *types;
    assert_int_equal(fy_gguf_get_i32_arr(g, "tokenizer.ggml.token_type", &types, &nt), FY_OK);
    fy_gw_i32_arr(w, "tokenizer.ggml.token_type", types, nt);
    fy_free(types);
    fy_gw_str_arr(w, "tokenizer.ggml.merges", NULL, 0);
    for (uint64_t i = 0; i < fy_gguf_n_tensors(g); i++) {
        const fy_gguf_tensor_t *t = fy_gguf_tensor(g, i);
        char name[96];
        snprintf(name, sizeof(name), "%.*s", (int)t->name.len, t->name.ptr);
        if (!keep_tensor(v, name)) continue;
        int64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
        if (v->bias_len && !strcmp(name, "blk.0.attn_q.bias")) {
            ne[0] = v->bias_len;
            float *b = calloc((size_t)v->bias_len, sizeof(float));
            fy_gw_tensor(w, name, GW_F32, 1, ne, b, (size_t)v->bias_len * sizeof(float));
            free(b);
            continue;
        }
        if (v->bad_type && !strcmp(name, "blk.0.attn_k.weight")) {
            fy_gw_tensor(w, name, v->bad_type, (int)t->n_dims, ne, t->data, t->nbytes);
            continue;
        }
        fy_gw_tensor(w, name, t->ggml_type, (int)t->n_dims, ne, t->data, t->nbytes);
    }
    if (v->rope_freqs_short) {
        float f[7] = {1, 1, 1, 2, 4, 8, 8};
        int64_t ne[1] = {7};
        fy_gw_tensor(w, "rope_freqs.weight", GW_F32, 1, ne, f, sizeof(f));
    }
    fy_gguf_close(g);
    assert_true(fy_gw_write(w, path));
    fy_gw_free(w);
    return path;
}

static void test_bad_input(void **state)
{
    variant_t v;
    /* the copy itself loads */
    v = (variant_t){.arch = FY_ARCH_GEMMA3};
    fy_model_t *m;
    assert_int_equal(fy_model_load(write_gguf_variant(&v, "copy.gguf"), &m), FY_OK);
    fy_model_destroy(m);
    v = (variant_t){.arch = FY_ARCH_QWEN2};
    assert_int_equal(fy_model_load(write_gguf_variant(&v, "copy2.gguf"), &m), FY_OK);
    fy_model_destroy(m);

    v = (variant_t){.arch = FY_ARCH_LLAMA, .gguf_arch = "mamba"};
    load_expect(write_gguf_variant(&v, "mamba.gguf"), FY_ERR_UNSUPPORTED, "architecture 'mamba' is not supported",
                "gemma3", NULL);
    v = (variant_t){.arch = FY_ARCH_LLAMA, .bad_type = 16};
    load_expect(write_gguf_variant(&v, "iq2.gguf"), FY_ERR_UNSUPPORTED, "'blk.0.attn_k.weight'", "iq2_xxs",
                "does not support");
    v = (variant_t){.arch = FY_ARCH_LLAMA, .bad_type = 99};
    load_expect(write_gguf_variant(&v, "type99.gguf"), FY_ERR_UNSUPPORTED, "'blk.0.attn_k.weight'", "unknown", NULL);
    v = (variant_t){.arch = FY_ARCH_QWEN3, .drop = "blk.1.attn_q_norm.weight"};
    load_expect(write_gguf_variant(&v, "qwen3-noqnorm.gguf"), FY_ERR_FORMAT,
                "missing tensor 'blk.1.attn_q_norm.weight'", NULL, NULL);
    v = (variant_t){.arch = FY_ARCH_QWEN2, .bias_len = 60};
    load_expect(write_gguf_variant(&v, "qwen2-bias.gguf"), FY_ERR_FORMAT, "'blk.0.attn_q.bias'", "shape [60]",
                "expected [64]");
    v = (variant_t){.arch = FY_ARCH_QWEN2, .drop = "blk.0.attn_v.bias"};
    load_expect(write_gguf_variant(&v, "qwen2-nobias.gguf"), FY_ERR_FORMAT, "missing tensor 'blk.0.attn_v.bias'", NULL,
                NULL);
    v = (variant_t){.arch = FY_ARCH_GEMMA3, .drop = "blk.5.post_ffw_norm.weight"};
    load_expect(write_gguf_variant(&v, "gemma-nopost.gguf"), FY_ERR_FORMAT,
                "missing tensor 'blk.5.post_ffw_norm.weight'", NULL, NULL);
    v = (variant_t){.arch = FY_ARCH_GEMMA3, .pattern = 7};
    load_expect(write_gguf_variant(&v, "gemma-pattern.gguf"), FY_ERR_FORMAT,
                "'gemma3.attention.sliding_window_pattern' = 7", "layer count 6", NULL);
    v = (variant_t){.arch = FY_ARCH_GEMMA3, .n_windows = 5};
    load_expect(write_gguf_variant(&v, "gemma-windows.gguf"), FY_ERR_FORMAT, "'gemma3.attention.sliding_window'",
                "5 entries", "expected 6 (one per layer)");
    v = (variant_t){.arch = FY_ARCH_LLAMA, .rope_type = "yarn"};
    load_expect(write_gguf_variant(&v, "yarn.gguf"), FY_ERR_UNSUPPORTED, "rope scaling 'yarn' is not supported", NULL,
                NULL);
    v = (variant_t){.arch = FY_ARCH_LLAMA, .rope_type = "llama3"};
    load_expect(write_gguf_variant(&v, "llama3-nofreqs.gguf"), FY_ERR_FORMAT, "'llama3' without", "'rope_freqs.weight'",
                NULL);
    v = (variant_t){.arch = FY_ARCH_LLAMA, .rope_freqs_short = true};
    load_expect(write_gguf_variant(&v, "freqs.gguf"), FY_ERR_FORMAT, "'rope_freqs.weight' has shape [7]",
                "expected [8]", NULL);

    /* Hugging Face configs */
    fy_tiny_cfg_t c;
    fy_tiny_cfg_arch(&c, FY_ARCH_GEMMA3);
    fy_tiny_model_t tm;
    fy_tiny_init(&tm, &c);
    const char *dir = fy_test_path("gemma-bad-hf");
    assert_true(fy_tiny_write_hf(&tm, dir, "F32", 1));
    fy_tiny_free(&tm);
    char p[1024];
    snprintf(p, sizeof(p), "%s/config.json", dir);
    size_t len;
    char *orig = fy_test_read_file(p, &len);
    const struct {
        const char *from, *to, *a, *b;
        fy_status_t st;
    } edits[] = {
        {"\"sliding_window\": 7", "\"sliding_window\": 7, \"layer_types\": [\"sliding_attention\"]",
         "'layer_types' has 1 entries", "expected 6", FY_ERR_FORMAT},
        {"\"sliding_window\": 7", "\"sliding_window\": 7, \"sliding_window_pattern\": 9",
         "'sliding_window_pattern' = 9", "layer count 6", FY_ERR_FORMAT},
        {"\"gelu_pytorch_tanh\"", "\"relu\"", "activation 'relu'", "gemma3", FY_ERR_UNSUPPORTED},
        {"\"final_logit_softcapping\": null", "\"final_logit_softcapping\": 30.0", "'final_logit_softcapping'",
         "soft-capping", FY_ERR_UNSUPPORTED},
        {"\"rope_theta\"", "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}, \"rope_theta\"",
         "rope_scaling 'yarn'", "not supported", FY_ERR_UNSUPPORTED},
        {"\"rope_theta\"",
         "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 4.0},"
         " \"rope_theta\"",
         "llama3", "not a valid set", FY_ERR_FORMAT},
    };
    for (size_t i = 0; i < FY_ARRAY_LEN(edits); i++) {
        const char *at = strstr(orig, edits[i].from);
        if (!at) fail_msg("config.json has no '%s':\n%s", edits[i].from, orig);
        char *edited = malloc(len + strlen(edits[i].to) + 1);
        size_t pre = (size_t)(at - orig);
        memcpy(edited, orig, pre);
        strcpy(edited + pre, edits[i].to);
        strcat(edited, at + strlen(edits[i].from));
        assert_true(fy_test_write_file(p, edited, strlen(edited)));
        free(edited);
        load_expect(dir, edits[i].st, edits[i].a, edits[i].b, NULL);
    }
    fy_free(orig);
}

/* ---- inspection (ferry info) --------------------------------------------------------- */

static char *inspect(const char *path)
{
    char *report = NULL;
    fy_test_log_begin();
    fy_status_t st = fy_model_inspect(path, &report);
    fy_test_log_end();
    if (st != FY_OK) fail_msg("inspect %s: %s; log:\n%s", path, fy_status_str(st), fy_test_log_text());
    return report;
}

static void expect_in(const char *report, const char *want)
{
    if (!strstr(report, want)) fail_msg("the report lacks '%s':\n%s", want, report);
}

static void test_inspect(void **state)
{
    fy_tiny_cfg_t c;
    fy_tiny_cfg_arch(&c, FY_ARCH_GEMMA3);
    fy_tiny_model_t tm;
    fy_tiny_init(&tm, &c);
    const char *path = fy_test_path("inspect-gemma.gguf");
    assert_true(fy_tiny_write_gguf(&tm, path, GW_F32));
    fy_tiny_free(&tm);
    char *r = inspect(path);
    expect_in(r, "model: tiny (gemma3)");
    expect_in(r, "6 layers, dim 64, 4 heads / 2 kv heads of 16");
    expect_in(r, "q/k norm        yes");
    expect_in(r, "gelu-tanh gated");
    expect_in(r, "embedding scale 8 (sqrt(dim))");
    expect_in(r, "0-4      sliding window 7, rope base 10000 neox");
    expect_in(r, "5        global, rope base 1e+06 neox");
    expect_in(r, "tied to the embeddings");
    expect_in(r, "chat template: gemma (built in");
    expect_in(r, "ferry runs it: yes");
    fy_free(r);

    /* what ferry cannot run: every reason, not the first */
    variant_t v = {.arch = FY_ARCH_LLAMA, .gguf_arch = "mamba"};
    r = inspect(write_gguf_variant(&v, "inspect-mamba.gguf"));
    expect_in(r, "model: unnamed (mamba)");
    expect_in(r, "ferry runs it: no");
    expect_in(r, "- architecture 'mamba' is not supported");
    expect_in(r, "2 layers, dim 64");
    fy_free(r);
    v = (variant_t){.arch = FY_ARCH_QWEN3, .bad_type = 16, .drop = "blk.1.attn_k_norm.weight", .rope_type = "yarn"};
    r = inspect(write_gguf_variant(&v, "inspect-qwen3.gguf"));
    expect_in(r, "ferry runs it: no");
    expect_in(r, "- rope scaling 'yarn' is not supported");
    expect_in(r, "- missing tensor 'blk.1.attn_k_norm.weight'");
    expect_in(r, "- tensor type iq2_xxs is not supported (1 tensor, the first 'blk.0.attn_k.weight'");
    expect_in(r, "tensors: ");
    fy_free(r);
    /* a file that faults on every tensor of 300 layers: the first 64
     * faults listed, the rest counted (the list once grew quadratically,
     * and a fuzz input like it outlasted libFuzzer's 30-s timeout) */
    v = (variant_t){.arch = FY_ARCH_LLAMA, .extra_layers = 298};
    r = inspect(write_gguf_variant(&v, "inspect-300.gguf"));
    expect_in(r, "300 layers");
    expect_in(r, "ferry runs it: no");
    expect_in(r, "- missing tensor 'blk.2.attn_norm.weight'");
    expect_in(r, " more faults like these\n");
    size_t lines = 0;
    for (const char *q = strstr(r, "ferry runs it: no"); q && (q = strstr(q, "\n- ")); q++) lines++;
    if (lines > 66) fail_msg("%zu fault lines listed:\n%s", lines, r);
    fy_free(r);
    /* not a model file at all: an error, as loading gives */
    char *none = NULL;
    fy_test_log_begin();
    assert_int_equal(fy_model_inspect(fy_test_path("nothing.gguf"), &none), FY_ERR_NOT_FOUND);
    fy_test_log_end();
    assert_null(none);
}

/* The description is the runner's only architecture input: a gemma3
 * file's layers run with their own windows and bases through prefill
 * chunks that cross a window boundary, alone and beside a llama-like
 * sequence, bit for bit the same at any thread count. */
static void test_batch_and_thread_invariance(void **state)
{
    fy_tiny_cfg_t c;
    fy_tiny_cfg_arch(&c, FY_ARCH_GEMMA3);
    fy_tiny_model_t tm;
    fy_tiny_init(&tm, &c);
    const char *path = fy_test_path("gemma-inv.gguf");
    assert_true(fy_tiny_write_gguf(&tm, path, GW_Q8_0));
    enum { NS = 3 };
    const int lens[NS] = {9, 30, 70};
    int32_t tok[NS][80];
    for (int s = 0; s < NS; s++) make_tokens(tok[s], lens[s], tm.vocab, SEED + 10 + (uint64_t)s);
    float *alone = calloc((size_t)NS * tm.vocab, sizeof(float)),
          *batched = calloc((size_t)NS * tm.vocab, sizeof(float));
    for (int threads = 1; threads <= 2; threads++) {
        env_t e;
        env_open(&e, path, threads, 16, FY_DTYPE_F16);
        fy_block_table_t bt[NS];
        fy_forward_seq_t f[NS];
        for (int s = 0; s < NS; s++) {
            assert_int_equal(fy_kvm_seq_init(e.kvm, &bt[s], MAX_CTX, NULL), FY_OK);
            assert_int_equal(fy_kvm_seq_reserve(e.kvm, &bt[s], lens[s], NULL), FY_OK);
            float dummy;
            if (threads == 1) { /* alone: prefill, then decode the last token */
                fy_forward_seq_t p = {&bt[s], tok[s], lens[s] - 1, 0, 0, NULL};
                assert_int_equal(fy_runner_forward(e.r, &p, 1, &dummy), FY_OK);
                fy_forward_seq_t d = {&bt[s], tok[s] + lens[s] - 1, 1, lens[s] - 1, 1, NULL};
                assert_int_equal(fy_runner_forward(e.r, &d, 1, alone + (long)s * tm.vocab), FY_OK);
            }
            f[s] = (fy_forward_seq_t){&bt[s], tok[s], lens[s] - 1, 0, 0, NULL};
        }
        if (threads == 1) {
            for (int s = 0; s < NS; s++) fy_kvm_seq_release(e.kvm, &bt[s]), fy_kvm_seq_deinit(&bt[s]);
            for (int s = 0; s < NS; s++) {
                assert_int_equal(fy_kvm_seq_init(e.kvm, &bt[s], MAX_CTX, NULL), FY_OK);
                assert_int_equal(fy_kvm_seq_reserve(e.kvm, &bt[s], lens[s], NULL), FY_OK);
                f[s].bt = &bt[s];
            }
        }
        float dummy;
        assert_int_equal(fy_runner_forward(e.r, f, NS, &dummy), FY_OK);
        for (int s = 0; s < NS; s++) f[s] = (fy_forward_seq_t){&bt[s], tok[s] + lens[s] - 1, 1, lens[s] - 1, 1, NULL};
        assert_int_equal(fy_runner_forward(e.r, f, NS, batched), FY_OK);
        assert_memory_equal(batched, alone, sizeof(float) * NS * (size_t)tm.vocab);
        for (int s = 0; s < NS; s++) fy_kvm_seq_release(e.kvm, &bt[s]), fy_kvm_seq_deinit(&bt[s]);
        env_close(&e);
    }
    free(alone), free(batched);
    fy_tiny_free(&tm);
}

/* A chat prompt holds one BOS: the template's (Gemma's starts with
 * {{ bos_token }}), not the template's and the tokenizer's; a template
 * without one gets the tokenizer's. */
static void test_chat_prompt_one_bos(void **state)
{
    for (int arch = 0; arch < 2; arch++) {
        fy_tiny_cfg_t c;
        fy_tiny_cfg_arch(&c, arch ? FY_ARCH_GEMMA3 : FY_ARCH_LLAMA);
        c.add_bos = true;
        fy_tiny_model_t tm;
        fy_tiny_init(&tm, &c);
        const char *path = fy_test_path(arch ? "bos-gemma.gguf" : "bos-llama.gguf");
        assert_true(fy_tiny_write_gguf(&tm, path, GW_F32));
        fy_tiny_free(&tm);
        fy_model_t *m;
        assert_int_equal(fy_model_load(path, &m), FY_OK);
        int32_t *ids, n;
        assert_int_equal(fy_prompt_tokens(m, "be brief", "hi", true, &ids, &n), FY_OK);
        const fy_tokenizer_t *tok = fy_model_tokenizer(m);
        int bos = 0;
        for (int i = 0; i < n; i++) bos += ids[i] == fy_tokenizer_bos(tok);
        assert_int_equal(ids[0], fy_tokenizer_bos(tok));
        /* gemma: its template's <bos> text (here the tokenizer's BOS piece
         * is <|im_start|>, which ChatML also writes at each turn) */
        if (arch) assert_int_equal(bos, 1);
        assert_true(n > 1 && ids[1] != fy_tokenizer_bos(tok));
        fy_free(ids);
        fy_model_destroy(m);
    }
}

static int teardown(void **state)
{
    fy_test_tmpdir_remove();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_sliding_window),
        cmocka_unit_test(test_window_past_the_sequence_and_segments),
        cmocka_unit_test(test_llama3_and_linear_rope_scaling),
        cmocka_unit_test(test_qwen2_bias),
        cmocka_unit_test(test_qwen3_qk_norm),
        cmocka_unit_test(test_gemma3),
        cmocka_unit_test(test_batch_and_thread_invariance),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_inspect),
        cmocka_unit_test(test_chat_prompt_one_bos),
    };
    return cmocka_run_group_tests(tests, NULL, teardown);
}

/*
 * test_loaders.c - bad model files get one clear error naming the file and
 * the fault, and never a crash or an out-of-bounds read (run under ASan):
 * truncation at every depth, bad magic and versions, absurd counts and
 * sizes, unknown tensor types, wrong shapes, missing tensors, absurd
 * hyper-parameters, broken safetensors headers, random corruption.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model/gguf.h"
#include "tests/gguf_writer.h"
#include "common/mem.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "tests/testutil.h"
#include "tests/tinymodel.h"

static uint8_t *g_good;
static size_t g_good_len;

static int setup(void **state)
{
    fy_tiny_cfg_t c;
    fy_tiny_cfg_default(&c);
    c.n_layers = 1;
    fy_tiny_model_t tm;
    fy_tiny_init(&tm, &c);
    const char *path = fy_test_path("good.gguf");
    if (!fy_tiny_write_gguf(&tm, path, GW_Q4_1)) return -1;
    fy_tiny_free(&tm);
    g_good = (uint8_t *)fy_test_read_file(path, &g_good_len);
    return g_good ? 0 : -1;
}

static int teardown(void **state)
{
    fy_free(g_good);
    fy_test_tmpdir_remove();
    return 0;
}

/* Loads bytes as a model file; returns the status, with the log captured. */
static fy_status_t load_bytes(const void *data, size_t len, const char *name)
{
    const char *path = fy_test_path(name);
    assert_true(fy_test_write_file(path, data, len));
    fy_model_t *m = NULL;
    fy_test_log_begin();
    fy_status_t st = fy_model_load(path, &m);
    fy_test_log_end();
    fy_model_destroy(m);
    return st;
}

static void test_good_file_loads(void **state) { assert_int_equal(load_bytes(g_good, g_good_len, "copy.gguf"), FY_OK); }

static void test_truncated_everywhere(void **state)
{
    /* every cut in the header, then coarser steps through the data */
    for (size_t cut = 0; cut < g_good_len; cut += cut < 4096 ? 1 : 997) {
        fy_status_t st = load_bytes(g_good, cut, "cut.gguf");
        if (st == FY_OK) fail_msg("file cut at %zu of %zu bytes loaded", cut, g_good_len);
        assert_true(st == FY_ERR_FORMAT);
        assert_true(fy_test_log_has("cut.gguf", NULL));
    }
    assert_int_equal(load_bytes(g_good, g_good_len - 1, "cut.gguf"), FY_ERR_FORMAT);
    assert_true(fy_test_log_has("cut.gguf", "past the end of the file", NULL));
}

static void test_bad_header(void **state)
{
    uint8_t *b = malloc(g_good_len);
    memcpy(b, g_good, g_good_len);
    memcpy(b, "GGUX", 4);
    assert_int_equal(load_bytes(b, g_good_len, "magic.gguf"), FY_ERR_FORMAT);
    assert_true(fy_test_log_has("magic.gguf", "not a gguf file", NULL));
    memcpy(b, g_good, 8);
    uint32_t v = 1;
    memcpy(b + 4, &v, 4);
    assert_int_equal(load_bytes(b, g_good_len, "v1.gguf"), FY_ERR_FORMAT);
    assert_true(fy_test_log_has("unsupported gguf version 1", NULL));
    memcpy(b, g_good, 24);
    uint64_t huge = UINT64_C(1) << 60;
    memcpy(b + 8, &huge, 8); /* tensor count */
    assert_int_equal(load_bytes(b, g_good_len, "ntensors.gguf"), FY_ERR_FORMAT);
    assert_true(fy_test_log_has("absurd tensor count", NULL));
    memcpy(b, g_good, 24);
    memcpy(b + 16, &huge, 8); /* metadata count */
    assert_int_equal(load_bytes(b, g_good_len, "nkv.gguf"), FY_ERR_FORMAT);
    assert_true(fy_test_log_has("absurd metadata count", NULL));
    memcpy(b, g_good, 24);
    memcpy(b + 24, &huge, 8); /* length of the first key */
    assert_int_equal(load_bytes(b, g_good_len, "keylen.gguf"), FY_ERR_FORMAT);
    assert_true(fy_test_log_has("keylen.gguf", "metadata key 0", NULL));
    free(b);
    assert_int_equal(load_bytes("", 0, "empty.gguf"), FY_ERR_FORMAT);
    assert_true(fy_test_log_has("empty.gguf", "too short", NULL));
    fy_model_t *m;
    fy_test_log_begin();
    assert_int_equal(fy_model_load(fy_test_path("missing.gguf"), &m), FY_ERR_NOT_FOUND);
    assert_true(fy_test_log_has("missing.gguf", "No such file", NULL));
    fy_test_log_end();
}

/* A minimal valid model, with hooks to break one thing. */
typedef struct variant {
    uint32_t layers;    /* llama.block_count */
    uint32_t q_type;    /* type of blk.0.attn_q.weight */
    int64_t q_rows;     /* its rows */
    bool drop_down;     /* leave out blk.0.ffn_down.weight */
    bool five_dims;     /* a 5-dim tensor */
    int64_t huge_dim;   /* a dimension of this size */
    bool bad_alignment; /* general.alignment = 3 */
    bool dup_key;
    uint32_t dim; /* llama.embedding_length */
} variant_t;

static const variant_t g_base = {.layers = 1, .q_type = GW_F32, .q_rows = 64, .dim = 64};

static fy_status_t load_variant(const variant_t *v, const char *name)
{
    const int D = 64, F = 96, KV = 32, V = 259;
    fy_gw_t *w = fy_gw_new();
    if (v->bad_alignment) fy_gw_set_alignment(w, 3);
    fy_gw_str(w, "general.architecture", "llama");
    fy_gw_u32(w, "llama.block_count", v->layers);
    if (v->dup_key) fy_gw_u32(w, "llama.block_count", v->layers);
    fy_gw_u32(w, "llama.embedding_length", v->dim);
    fy_gw_u32(w, "llama.feed_forward_length", F);
    fy_gw_u32(w, "llama.attention.head_count", 4);
    fy_gw_u32(w, "llama.attention.head_count_kv", 2);
    fy_gw_str(w, "tokenizer.ggml.model", "gpt2");
    const char *toks[V];
    char strs[256][4];
    int32_t types[V];
    for (int i = 0; i < 256; i++) {
        snprintf(strs[i], sizeof(strs[i]), "%c", 'A' + i % 26);
        /* distinct strings: byte-level vocab proper is tested elsewhere */
        int n = i / 26;
        if (n) snprintf(strs[i], sizeof(strs[i]), "%c%c", 'A' + i % 26, 'a' + n);
        toks[i] = strs[i];
        types[i] = 1;
    }
    toks[256] = "<|endoftext|>", toks[257] = "<|im_start|>", toks[258] = "<|im_end|>";
    types[256] = types[257] = types[258] = 3;
    fy_gw_str_arr(w, "tokenizer.ggml.tokens", toks, V);
    fy_gw_i32_arr(w, "tokenizer.ggml.token_type", types, V);
    fy_gw_str_arr(w, "tokenizer.ggml.merges", NULL, 0);
    float *zeros = calloc((size_t)V * F * 4, 1);
    int64_t ne_e[2] = {D, V}, ne_n[1] = {D}, ne_q[2] = {D, v->q_rows}, ne_kv[2] = {D, KV}, ne_o[2] = {D, D},
            ne_g[2] = {D, F}, ne_d[2] = {F, D};
    fy_gw_tensor(w, "token_embd.weight", GW_F32, 2, ne_e, zeros, (size_t)D * V * 4);
    fy_gw_tensor(w, "output_norm.weight", GW_F32, 1, ne_n, zeros, D * 4);
    fy_gw_tensor(w, "blk.0.attn_norm.weight", GW_F32, 1, ne_n, zeros, D * 4);
    size_t qbytes = v->q_type == GW_F32 ? (size_t)D * v->q_rows * 4 : (size_t)D / 32 * 20 * v->q_rows;
    fy_gw_tensor(w, "blk.0.attn_q.weight", v->q_type, 2, ne_q, zeros, qbytes);
    fy_gw_tensor(w, "blk.0.attn_k.weight", GW_F32, 2, ne_kv, zeros, (size_t)D * KV * 4);
    fy_gw_tensor(w, "blk.0.attn_v.weight", GW_F32, 2, ne_kv, zeros, (size_t)D * KV * 4);
    fy_gw_tensor(w, "blk.0.attn_output.weight", GW_F32, 2, ne_o, zeros, (size_t)D * D * 4);
    fy_gw_tensor(w, "blk.0.ffn_norm.weight", GW_F32, 1, ne_n, zeros, D * 4);
    fy_gw_tensor(w, "blk.0.ffn_gate.weight", GW_F32, 2, ne_g, zeros, (size_t)D * F * 4);
    fy_gw_tensor(w, "blk.0.ffn_up.weight", GW_F32, 2, ne_g, zeros, (size_t)D * F * 4);
    if (!v->drop_down) fy_gw_tensor(w, "blk.0.ffn_down.weight", GW_F32, 2, ne_d, zeros, (size_t)D * F * 4);
    if (v->five_dims) {
        int64_t ne5[5] = {1, 1, 1, 1, 1};
        fy_gw_tensor(w, "extra.weight", GW_F32, 5, ne5, zeros, 4);
    }
    if (v->huge_dim) {
        int64_t ne2[2] = {v->huge_dim, v->huge_dim};
        fy_gw_tensor(w, "huge.weight", GW_F32, 2, ne2, zeros, 4);
    }
    size_t len;
    const uint8_t *bytes = fy_gw_bytes(w, &len);
    fy_status_t st = load_bytes(bytes, len, name);
    fy_gw_free(w);
    free(zeros);
    return st;
}

static void test_model_faults(void **state)
{
    variant_t v = g_base;
    assert_int_equal(load_variant(&v, "base.gguf"), FY_OK);

    v = g_base, v.q_type = 16; /* iq2_xxs */
    assert_int_equal(load_variant(&v, "iq2xxs.gguf"), FY_ERR_UNSUPPORTED);
    assert_true(fy_test_log_has("iq2xxs.gguf", "blk.0.attn_q.weight", "iq2_xxs", "does not support", NULL));

    /* a K-quant's rows are whole 256-element super-blocks: 64 columns are not */
    v = g_base, v.q_type = 13; /* q5_k */
    assert_int_equal(load_variant(&v, "q5k.gguf"), FY_ERR_FORMAT);
    assert_true(fy_test_log_has("q5k.gguf", "blk.0.attn_q.weight", "64 elements", "q5_k blocks", NULL));

    v = g_base, v.q_type = 99;
    assert_int_equal(load_variant(&v, "type99.gguf"), FY_ERR_UNSUPPORTED);
    assert_true(fy_test_log_has("type99.gguf", "blk.0.attn_q.weight", "unknown", NULL));

    v = g_base, v.q_rows = 48;
    assert_int_equal(load_variant(&v, "shape.gguf"), FY_ERR_FORMAT);
    assert_true(fy_test_log_has("shape.gguf", "blk.0.attn_q.weight", "shape [48, 64], expected [64, 64]", NULL));

    v = g_base, v.drop_down = true;
    assert_int_equal(load_variant(&v, "missing.gguf"), FY_ERR_FORMAT);
    assert_true(fy_test_log_has("missing.gguf", "missing tensor 'blk.0.ffn_down.weight'", NULL));

    v = g_base, v.layers = 1000000000;
    assert_int_equal(load_variant(&v, "layers.gguf"), FY_ERR_FORMAT);
    assert_true(fy_test_log_has("layers.gguf", "absurd layer count 1000000000", NULL));

    v = g_base, v.layers = 2; /* claims a layer whose tensors are absent */
    assert_int_equal(load_variant(&v, "layer2.gguf"), FY_ERR_FORMAT);
    assert_true(fy_test_log_has("layer2.gguf", "missing tensor 'blk.1.attn_norm.weight'", NULL));

    v = g_base, v.dim = 63;
    assert_int_equal(load_variant(&v, "dim.gguf"), FY_ERR_FORMAT);
    assert_true(fy_test_log_has("dim.gguf", "not a multiple of the head count", NULL));

    v = g_base, v.five_dims = true;
    assert_int_equal(load_variant(&v, "dims.gguf"), FY_ERR_FORMAT);
    assert_true(fy_test_log_has("dims.gguf", "'extra.weight': 5 dimensions", NULL));

    v = g_base, v.huge_dim = INT64_C(1) << 40;
    assert_int_equal(load_variant(&v, "huge.gguf"), FY_ERR_FORMAT);
    assert_true(fy_test_log_has("huge.gguf", "huge.weight", "absurd", NULL));

    v = g_base, v.bad_alignment = true;
    assert_int_equal(load_variant(&v, "align.gguf"), FY_ERR_FORMAT);
    assert_true(fy_test_log_has("align.gguf", "alignment 3", NULL));

    v = g_base, v.dup_key = true;
    assert_int_equal(load_variant(&v, "dup.gguf"), FY_ERR_FORMAT);
    assert_true(fy_test_log_has("dup.gguf", "appears twice", NULL));
}

static void test_random_corruption(void **state)
{
    uint64_t seed = 77;
    uint8_t *b = malloc(g_good_len);
    int loaded = 0;
    for (int it = 0; it < 3000; it++) {
        memcpy(b, g_good, g_good_len);
        int flips = 1 + (int)(fy_test_rand_u64(&seed) % 4);
        /* the header is where the parsing is; hit it far more often */
        size_t span = it % 4 ? 8192 : g_good_len;
        if (span > g_good_len) span = g_good_len;
        for (int f = 0; f < flips; f++) {
            size_t at = fy_test_rand_u64(&seed) % span;
            b[at] ^= (uint8_t)(1u << (fy_test_rand_u64(&seed) % 8));
        }
        fy_status_t st = load_bytes(b, g_good_len, "fuzz.gguf");
        if (st == FY_OK)
            loaded++;
        else
            assert_true(fy_test_log_has("fuzz.gguf", NULL));
    }
    free(b);
    (void)loaded; /* flips in weights or unused metadata still load: fine */
}

static void test_gguf_accessors(void **state)
{
    const char *path = fy_test_path("acc.gguf");
    fy_gw_t *w = fy_gw_new();
    fy_gw_u32(w, "a.u32", 7);
    fy_gw_i32(w, "a.neg", -3);
    fy_gw_f32(w, "a.f32", 2.5f);
    fy_gw_str(w, "a.str", "hello");
    const char *arr[] = {"x", "", "zz"};
    fy_gw_str_arr(w, "a.strs", arr, 3);
    int32_t ints[] = {1, -2, 3};
    fy_gw_i32_arr(w, "a.ints", ints, 3);
    assert_true(fy_gw_write(w, path));
    fy_gw_free(w);
    fy_gguf_t *g;
    assert_int_equal(fy_gguf_open(path, &g), FY_OK);
    assert_int_equal(fy_gguf_version(g), 3);
    uint32_t u;
    assert_int_equal(fy_gguf_get_u32(g, "a.u32", &u), FY_OK);
    assert_int_equal(u, 7);
    fy_test_log_begin();
    assert_int_equal(fy_gguf_get_u32(g, "a.neg", &u), FY_ERR_FORMAT);
    assert_int_equal(fy_gguf_get_u32(g, "a.str", &u), FY_ERR_FORMAT);
    assert_true(fy_test_log_has("a.str", "should be an integer but is string", NULL));
    fy_test_log_end();
    assert_int_equal(fy_gguf_get_u32(g, "nope", &u), FY_ERR_NOT_FOUND);
    float f;
    assert_int_equal(fy_gguf_get_f32(g, "a.f32", &f), FY_OK);
    assert_float_equal(f, 2.5f, 0);
    fy_str_t s;
    assert_int_equal(fy_gguf_get_str(g, "a.str", &s), FY_OK);
    assert_true(fy_str_eq(s, "hello"));
    fy_str_t *ss;
    uint64_t n;
    assert_int_equal(fy_gguf_get_str_arr(g, "a.strs", &ss, &n), FY_OK);
    assert_int_equal(n, 3);
    assert_true(fy_str_eq(ss[0], "x") && fy_str_eq(ss[1], "") && fy_str_eq(ss[2], "zz"));
    fy_free(ss);
    int32_t *ii;
    assert_int_equal(fy_gguf_get_i32_arr(g, "a.ints", &ii, &n), FY_OK);
    assert_int_equal(ii[1], -2);
    fy_free(ii);
    fy_gguf_close(g);
}

/* ---- safetensors ------------------------------------------------------------------------ */

static const char *write_st(const char *dir, const char *header, size_t data_len)
{
    mkdir(dir, 0755);
    static char path[1024];
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    uint64_t n = strlen(header);
    fwrite(&n, 8, 1, f);
    fwrite(header, 1, n, f);
    for (size_t i = 0; i < data_len; i++) fputc(0, f);
    fclose(f);
    return path;
}

static void test_safetensors_faults(void **state)
{
    struct {
        const char *header;
        size_t data;
        const char *expect;
    } cases[] = {
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 16, NULL},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 8, "past the end"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,16]}}", 16, "need 24"},
        {"{\"a\":{\"dtype\":\"F17\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "unknown dtype 'F17'"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, "shape[0]"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, "begin <= end"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,65536],\"data_offsets\":[0,8]}}", 8, "absurd"},
        {"{\"a\":{\"dtype\":\"F32\"", 8, "not valid json"},
        {"[1,2]", 8, "not a json object"},
        {"{\"a\":[1]}", 8, "not an object"},
    };
    for (size_t i = 0; i < FY_ARRAY_LEN(cases); i++) {
        char dir[64];
        snprintf(dir, sizeof(dir), "st%zu", i);
        const char *path = write_st(fy_test_path(dir), cases[i].header, cases[i].data);
        fy_safetensors_t *st = NULL;
        fy_test_log_begin();
        fy_status_t s = fy_safetensors_open(path, &st);
        fy_test_log_end();
        if (!cases[i].expect) {
            assert_int_equal(s, FY_OK);
            assert_non_null(fy_safetensors_find(st, "a"));
        } else {
            if (s == FY_OK) fail_msg("case %zu loaded", i);
            if (!fy_test_log_has(cases[i].expect, NULL)) fail_msg("case %zu: log was: %s", i, fy_test_log_text());
        }
        fy_safetensors_close(st);
    }
    /* a header length larger than the file */
    const char *path = fy_test_path("sthuge.safetensors");
    uint64_t big = UINT64_C(1) << 40;
    assert_true(fy_test_write_file(path, &big, 8));
    fy_safetensors_t *st;
    fy_test_log_begin();
    assert_int_equal(fy_safetensors_open(path, &st), FY_ERR_FORMAT);
    assert_true(fy_test_log_has("sthuge.safetensors", "header length", NULL));
    fy_test_log_end();
}

static void test_hf_folder_faults(void **state)
{
    fy_tiny_cfg_t c;
    fy_tiny_cfg_default(&c);
    c.n_layers = 1;
    fy_tiny_model_t tm;
    fy_tiny_init(&tm, &c);
    const char *dir = fy_test_path("hfbad");
    assert_true(fy_tiny_write_hf(&tm, dir, "F32", 1));
    fy_tiny_free(&tm);
    char p[1024];
    snprintf(p, sizeof(p), "%s/config.json", dir);
    fy_model_t *m;
    /* a config that claims two layers */
    assert_true(fy_test_write_file(p,
                                   "{\"model_type\":\"llama\",\"hidden_size\":64,\"intermediate_size\":96,"
                                   "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
                                   "\"vocab_size\":259}",
                                   strlen("{\"model_type\":\"llama\",\"hidden_size\":64,\"intermediate_size\":96,"
                                          "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
                                          "\"vocab_size\":259}")));
    fy_test_log_begin();
    assert_int_equal(fy_model_load(dir, &m), FY_ERR_FORMAT);
    assert_true(fy_test_log_has("hfbad", "missing tensor 'model.layers.1.input_layernorm.weight'", NULL));
    const char *mamba = "{\"model_type\":\"mamba\"}";
    assert_true(fy_test_write_file(p, mamba, strlen(mamba)));
    assert_int_equal(fy_model_load(dir, &m), FY_ERR_UNSUPPORTED);
    assert_true(fy_test_log_has("hfbad", "model_type 'mamba' is not supported", "Qwen2ForCausalLM", NULL));
    const char *nolayers = "{\"model_type\":\"llama\",\"hidden_size\":64}";
    assert_true(fy_test_write_file(p, nolayers, strlen(nolayers)));
    assert_int_equal(fy_model_load(dir, &m), FY_ERR_FORMAT);
    assert_true(fy_test_log_has("config.json has no 'num_hidden_layers'", NULL));
    assert_true(fy_test_write_file(p, "{", 1));
    assert_int_equal(fy_model_load(dir, &m), FY_ERR_FORMAT);
    assert_true(fy_test_log_has("cannot read config.json", NULL));
    fy_test_log_end();
}

/* Every allocation in loading can fail without a crash or a leak. */
static void test_load_allocation_failures(void **state)
{
    const char *path = fy_test_path("good.gguf");
    int n;
    for (n = 1; n < 100000; n++) {
        fy_model_t *m = NULL;
        fy_test_log_begin();
        fy_mem_fail_after(n);
        fy_status_t st = fy_model_load(path, &m);
        fy_mem_fail_after(0);
        fy_test_log_end();
        if (st == FY_OK) {
            fy_model_destroy(m);
            break;
        }
        assert_int_equal(st, FY_ERR_NOMEM);
    }
    assert_true(n > 5 && n < 100000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_file_loads),
        cmocka_unit_test(test_truncated_everywhere),
        cmocka_unit_test(test_bad_header),
        cmocka_unit_test(test_model_faults),
        cmocka_unit_test(test_random_corruption),
        cmocka_unit_test(test_gguf_accessors),
        cmocka_unit_test(test_safetensors_faults),
        cmocka_unit_test(test_hf_folder_faults),
        cmocka_unit_test(test_load_allocation_failures),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

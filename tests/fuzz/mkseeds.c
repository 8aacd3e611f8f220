/*
 * mkseeds.c - writes the fuzz targets' seed corpora (tests/fuzz/corpus/NAME/)
 * with the project's own writers: tiny models from tests/tinymodel.c, GGUF
 * files from tests/gguf_writer.c, messages from fy_msgw and the writers of
 * wire.c (tests/wire_examples.c's messages), genspec.c, rpc.c, bloom.h and
 * xfer_wire.c, the chat templates of
 * tests/test_chat.c, and a small tokenizer cut out of the default model.
 *
 *     make fuzz-seeds        (runs build/fuzz/tests/fuzz/mkseeds tests/fuzz/corpus)
 *
 * Deterministic: the same sources give the same files.  Seeds that need
 * the default model (the cut-out tokenizer, SmolLM2's own template) are
 * left as they are when it is absent.  Not a fuzz target (no fuzz_ prefix).
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/gguf_writer.h"
#include "tests/tinymodel.h"
#include "tests/wire_examples.h"
#include "kv/bloom.h"
#include "common/genspec.h"
#include "model/gguf.h"
#include "common/mem.h"
#include "common/msg.h"
#include "rpc/rpc.h"
#include "rpc/etcd.h"
#include "tests/fuzz/util.h"
#include "common/wire.h"
#include "transfer/xfer_wire.h"
#include "transfer/xgroup.h"

static const char *g_root;
static int g_files;

/* ---- output ----------------------------------------------------------------------------------------------- */

static void put(const char *target, const char *name, const void *data, size_t len)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", g_root, target);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "mkseeds: %s: %s\n", path, strerror(errno));
        exit(1);
    }
    snprintf(path, sizeof(path), "%s/%s/%s", g_root, target, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
        fprintf(stderr, "mkseeds: cannot write %s\n", path);
        exit(1);
    }
    g_files++;
}

static void put_str(const char *target, const char *name, const char *s) { put(target, name, s, strlen(s)); }

static char *slurp(const char *path, size_t *len_p)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, len = 0;
    char *b = malloc(cap);
    for (size_t n; b && (n = fread(b + len, 1, cap - len, f)) > 0;) {
        len += n;
        if (len == cap) b = realloc(b, cap *= 2);
    }
    fclose(f);
    if (!b) abort();
    *len_p = len;
    return b;
}

/* Files joined with FZ_SEP, as the multi-file targets read them. */
typedef struct joined {
    char *p;
    size_t n;
} joined_t;

static void join(joined_t *j, const void *data, size_t len)
{
    size_t sep = strlen(FZ_SEP);
    j->p = realloc(j->p, j->n + sep + len);
    if (!j->p) abort();
    if (j->n) {
        memcpy(j->p + j->n, FZ_SEP, sep);
        j->n += sep;
    }
    memcpy(j->p + j->n, data, len);
    j->n += len;
}

static void join_file(joined_t *j, const char *path)
{
    size_t len;
    char *b = slurp(path, &len);
    if (!b) {
        fprintf(stderr, "mkseeds: cannot read %s\n", path);
        exit(1);
    }
    join(j, b, len);
    free(b);
}

static void put_msg(const char *target, const char *name, fy_msgw_t *w)
{
    void *buf;
    size_t len;
    if (fy_msgw_finish(w, &buf, &len) != FY_OK) abort();
    put(target, name, buf, len);
    fy_free(buf);
}

/* ---- models: gguf, model, safetensors ----------------------------------------------------------------------- */

static void tiny_cfg(fy_tiny_cfg_t *c, bool tied)
{
    fy_tiny_cfg_default(c);
    c->n_layers = 1, c->dim = 32, c->n_heads = 2, c->n_kv_heads = 1, c->ffn = 32, c->max_ctx = 64;
    c->tied = tied;
}

static void models(const char *tmp)
{
    fy_tiny_cfg_t c;
    fy_tiny_model_t m;
    char path[512], dir[512];
    static const struct {
        const char *name;
        uint32_t type;
        bool tied;
    } ggufs[] = {
        {"tiny-q4_0.gguf", GW_Q4_0, false}, {"tiny-q8_0-tied.gguf", GW_Q8_0, true}, {"tiny-q5_0.gguf", GW_Q5_0, false}};
    for (size_t i = 0; i < FY_ARRAY_LEN(ggufs); i++) {
        tiny_cfg(&c, ggufs[i].tied);
        fy_tiny_init(&m, &c);
        snprintf(path, sizeof(path), "%s/%s", tmp, ggufs[i].name);
        if (!fy_tiny_write_gguf(&m, path, ggufs[i].type)) abort();
        fy_tiny_free(&m);
        size_t len;
        char *b = slurp(path, &len);
        put("gguf", ggufs[i].name, b, len);
        put("model", ggufs[i].name, b, len);
        free(b);
    }
    /* the other architectures: their keys, windows, patterns and extra tensors */
    static const struct {
        const char *name;
        fy_arch_t arch;
    } archs[] = {{"tiny-qwen2-swa.gguf", FY_ARCH_QWEN2},
                 {"tiny-qwen3.gguf", FY_ARCH_QWEN3},
                 {"tiny-gemma3.gguf", FY_ARCH_GEMMA3}};
    for (size_t i = 0; i < FY_ARRAY_LEN(archs); i++) {
        fy_tiny_cfg_arch(&c, archs[i].arch);
        c.dim = 32, c.n_heads = 2, c.n_kv_heads = 1, c.ffn = 32, c.max_ctx = 64;
        if (archs[i].arch == FY_ARCH_QWEN2) c.window = 5, c.max_window_layers = 1;
        if (archs[i].arch == FY_ARCH_GEMMA3) c.n_layers = 3, c.swa_period = 3, c.write_pattern = true;
        fy_tiny_init(&m, &c);
        snprintf(path, sizeof(path), "%s/%s", tmp, archs[i].name);
        if (!fy_tiny_write_gguf(&m, path, GW_Q8_0)) abort();
        size_t len;
        char *b = slurp(path, &len);
        put("model", archs[i].name, b, len);
        free(b);
        if (archs[i].arch == FY_ARCH_GEMMA3) { /* and as a folder: (1 + w) norms, Gemma's names */
            snprintf(dir, sizeof(dir), "%s/hf-gemma3", tmp);
            if (!fy_tiny_write_hf(&m, dir, "BF16", 1)) abort();
            joined_t j = {0};
            static const char *const files[] = {"config.json", "model.safetensors", "tokenizer.json"};
            for (size_t k = 0; k < FY_ARRAY_LEN(files); k++) {
                snprintf(path, sizeof(path), "%s/%s", dir, files[k]);
                join_file(&j, path);
            }
            put("model", "hf-gemma3", j.p, j.n);
            free(j.p);
        }
        fy_tiny_free(&m);
    }

    /* Hugging Face folders: config.json, model.safetensors, tokenizer.json [, tokenizer_config.json] */
    static const struct {
        const char *name, *dtype;
        bool tied, config;
    } hfs[] = {{"hf-bf16", "BF16", false, true}, {"hf-f16-tied", "F16", true, false}};
    for (size_t i = 0; i < FY_ARRAY_LEN(hfs); i++) {
        tiny_cfg(&c, hfs[i].tied);
        fy_tiny_init(&m, &c);
        snprintf(dir, sizeof(dir), "%s/%s", tmp, hfs[i].name);
        if (!fy_tiny_write_hf(&m, dir, hfs[i].dtype, 1)) abort();
        joined_t j = {0};
        static const char *const files[] = {"config.json", "model.safetensors", "tokenizer.json"};
        for (size_t k = 0; k < FY_ARRAY_LEN(files); k++) {
            snprintf(path, sizeof(path), "%s/%s", dir, files[k]);
            join_file(&j, path);
        }
        if (hfs[i].config) {
            static const char cfg[] =
                "{\"bos_token\": \"<|im_start|>\", \"eos_token\": {\"content\": \"<|im_end|>\"}, "
                "\"add_bos_token\": false, \"chat_template\": \"{% for message in messages %}{{'<|im_start|>' + "
                "message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if "
                "add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}\"}";
            join(&j, cfg, strlen(cfg));
        }
        put("model", hfs[i].name, j.p, j.n);
        if (!i) {
            snprintf(path, sizeof(path), "%s/model.safetensors", dir);
            size_t len;
            char *b = slurp(path, &len);
            put("safetensors", "tiny-bf16.safetensors", b, len);
            free(b);
            snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
            b = slurp(path, &len);
            put("tokenizer_json", "tiny-bytes.json", b, len);
            joined_t t = {0};
            join(&t, b, len);
            free(b);
            static const char tcfg[] = "{\"bos_token\": {\"content\": \"<|im_start|>\"}, \"eos_token\": "
                                       "\"<|im_end|>\", \"add_bos_token\": true}";
            join(&t, tcfg, strlen(tcfg));
            put("tokenizer_json", "tiny-bytes-with-config", t.p, t.n);
            free(t.p);
        }
        free(j.p);
        fy_tiny_free(&m);
    }

    /* a sharded folder: the index, then its two shards */
    tiny_cfg(&c, false);
    fy_tiny_init(&m, &c);
    snprintf(dir, sizeof(dir), "%s/sharded", tmp);
    if (!fy_tiny_write_hf(&m, dir, "F16", 2)) abort();
    fy_tiny_free(&m);
    joined_t j = {0};
    static const char *const shards[] = {"model.safetensors.index.json", "model-00001-of-00002.safetensors",
                                         "model-00002-of-00002.safetensors"};
    for (size_t k = 0; k < FY_ARRAY_LEN(shards); k++) {
        snprintf(path, sizeof(path), "%s/%s", dir, shards[k]);
        join_file(&j, path);
    }
    put("safetensors", "sharded-f16", j.p, j.n);
    free(j.p);

    /* every dtype the format names, with odd shapes: a scalar, an empty tensor, 4 dimensions */
    static const char hdr[] = "{\"__metadata__\":{\"format\":\"pt\"},"
                              "\"a\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]},"
                              "\"b\":{\"dtype\":\"I64\",\"shape\":[2,1],\"data_offsets\":[8,24]},"
                              "\"c\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[24,24]},"
                              "\"d\":{\"dtype\":\"BOOL\",\"shape\":[1,1,2,2],\"data_offsets\":[24,28]},"
                              "\"e\":{\"dtype\":\"F8_E4M3\",\"shape\":[4],\"data_offsets\":[28,32]},"
                              "\"f\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[32,40]},"
                              "\"g\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[40,44]},"
                              "\"h\":{\"dtype\":\"U16\",\"shape\":[2],\"data_offsets\":[44,48]}}";
    uint8_t file[8 + sizeof(hdr) - 1 + 48];
    uint64_t hl = sizeof(hdr) - 1;
    memcpy(file, &hl, 8);
    memcpy(file + 8, hdr, hl);
    for (size_t i = 0; i < 48; i++) file[8 + hl + i] = (uint8_t)(i * 37);
    put("safetensors", "dtypes.safetensors", file, sizeof(file));
}

/* Two rows of each weight type ferry reads beyond the tiny models' (the
 * K-quants need rows of 256), so that the reader's type table and row
 * sizes are in the corpus; a model would be 200 KiB at the smallest. */
static void gguf_types(void)
{
    static const struct {
        const char *name;
        uint32_t type;
        int64_t cols;
        size_t row_bytes;
    } ts[] = {{"w.q5_1", GW_Q5_1, 32, 24},   {"w.iq4_nl", GW_IQ4_NL, 32, 18}, {"w.q2_k", GW_Q2_K, 256, 84},
              {"w.q3_k", GW_Q3_K, 256, 110}, {"w.q4_k", GW_Q4_K, 256, 144},   {"w.q5_k", GW_Q5_K, 256, 176},
              {"w.q6_k", GW_Q6_K, 256, 210}, {"w.q4_1", GW_Q4_1, 64, 40}};
    uint8_t data[2 * 210];
    for (size_t i = 0; i < sizeof(data); i++) data[i] = (uint8_t)(i * 131 + 7);
    fy_gw_t *w = fy_gw_new();
    fy_gw_str(w, "general.architecture", "llama");
    for (size_t i = 0; i < FY_ARRAY_LEN(ts); i++) {
        int64_t ne[2] = {ts[i].cols, 2};
        fy_gw_tensor(w, ts[i].name, ts[i].type, 2, ne, data, 2 * ts[i].row_bytes);
    }
    size_t len;
    const uint8_t *b = fy_gw_bytes(w, &len);
    put("gguf", "types.gguf", b, len);
    fy_gw_free(w);
}

/* ---- tokenizers ------------------------------------------------------------------------------------------- */

/* GGUF tokenizer keys of an SPM (Llama-2 style) vocabulary with byte tokens and scores. */
static void gguf_llama_tokenizer(void)
{
    const char *toks[3 + 256 + 8];
    char bytes[256][8];
    float scores[3 + 256 + 8];
    int32_t types[3 + 256 + 8];
    int n = 0;
    toks[n] = "<unk>", types[n] = 2, scores[n++] = 0;
    toks[n] = "<s>", types[n] = 3, scores[n++] = 0;
    toks[n] = "</s>", types[n] = 3, scores[n++] = 0;
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], sizeof(bytes[b]), "<0x%02X>", b);
        toks[n] = bytes[b], types[n] = 6, scores[n++] = 0;
    }
    static const char *const words[] = {"\xe2\x96\x81", "\xe2\x96\x81t",   "h", "e",
                                        "he",           "\xe2\x96\x81the", "t", "\xe2\x96\x81th"};
    for (size_t i = 0; i < FY_ARRAY_LEN(words); i++) toks[n] = words[i], types[n] = 1, scores[n++] = -(float)i;
    fy_gw_t *w = fy_gw_new();
    fy_gw_str(w, "general.architecture", "llama");
    fy_gw_str(w, "tokenizer.ggml.model", "llama");
    fy_gw_str_arr(w, "tokenizer.ggml.tokens", toks, (size_t)n);
    fy_gw_f32_arr(w, "tokenizer.ggml.scores", scores, (size_t)n);
    fy_gw_i32_arr(w, "tokenizer.ggml.token_type", types, (size_t)n);
    fy_gw_u32(w, "tokenizer.ggml.bos_token_id", 1);
    fy_gw_u32(w, "tokenizer.ggml.eos_token_id", 2);
    fy_gw_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    fy_gw_bool(w, "tokenizer.ggml.add_bos_token", true);
    fy_gw_bool(w, "tokenizer.ggml.add_space_prefix", true);
    fy_gw_str(w, "tokenizer.chat_template",
              "{{ bos_token }}{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}");
    fy_gw_set_alignment(w, 64);
    size_t len;
    const uint8_t *b = fy_gw_bytes(w, &len);
    put("gguf", "tok-llama-spm.gguf", b, len);
    fy_gw_free(w);
}

/* A SentencePiece-style tokenizer.json (Llama-2 shape): byte fallback, ▁ for spaces. */
static void json_spm_tokenizer(void)
{
    json_t *vocab = json_object();
    json_object_set_new(vocab, "<unk>", json_integer(0));
    json_object_set_new(vocab, "<s>", json_integer(1));
    json_object_set_new(vocab, "</s>", json_integer(2));
    for (int b = 0; b < 256; b++) {
        char s[8];
        snprintf(s, sizeof(s), "<0x%02X>", b);
        json_object_set_new(vocab, s, json_integer(3 + b));
    }
    static const char *const words[] = {"\xe2\x96\x81", "t", "h", "e", "\xe2\x96\x81t", "he", "\xe2\x96\x81the", "a"};
    for (size_t i = 0; i < FY_ARRAY_LEN(words); i++) json_object_set_new(vocab, words[i], json_integer(259 + (int)i));
    json_t *merges = json_pack("[s, s, s]", "\xe2\x96\x81 t", "h e", "\xe2\x96\x81t he");
    json_t *added =
        json_pack("[{s:i, s:s, s:b}, {s:i, s:s, s:b}, {s:i, s:s, s:b}]", "id", 0, "content", "<unk>", "special", 1,
                  "id", 1, "content", "<s>", "special", 1, "id", 2, "content", "</s>", "special", 1);
    json_t *root = json_pack(
        "{s:o, s:{s:s, s:[{s:s, s:s}, {s:s, s:{s:s}, s:s}]}, s:n, s:{s:s, s:[{s:{s:s, s:s}}, {s:{s:s, s:s}}]}, "
        "s:{s:s, s:o, s:o, s:b, s:s}}",
        "added_tokens", added, "normalizer", "type", "Sequence", "normalizers", "type", "Prepend", "prepend",
        "\xe2\x96\x81", "type", "Replace", "pattern", "String", " ", "content", "\xe2\x96\x81", "pre_tokenizer",
        "post_processor", "type", "TemplateProcessing", "single", "SpecialToken", "id", "<s>", "type_id", "0",
        "Sequence", "id", "A", "type_id", "0", "model", "type", "BPE", "vocab", vocab, "merges", merges,
        "byte_fallback", 1, "unk_token", "<unk>");
    if (!root) abort();
    char *s = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
    put_str("tokenizer_json", "spm-byte-fallback.json", s);
    free(s);
    json_decref(root);

    /* the same as Metaspace pre-tokenizer with a config */
    root = json_pack("{s:{s:s, s:s, s:s, s:b}, s:{s:s, s:{s:i, s:i, s:i}, s:[], s:s}}", "pre_tokenizer", "type",
                     "Metaspace", "replacement", "\xe2\x96\x81", "prepend_scheme", "first", "split", 1, "model", "type",
                     "BPE", "vocab", "<unk>", 0, "\xe2\x96\x81", 1, "a", 2, "merges", "unk_token", "<unk>");
    s = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
    joined_t j = {0};
    join(&j, s, strlen(s));
    static const char cfg[] = "{\"bos_token\": null, \"eos_token\": \"<unk>\", \"add_bos_token\": false}";
    join(&j, cfg, strlen(cfg));
    put("tokenizer_json", "metaspace-with-config", j.p, j.n);
    free(j.p);
    free(s);
    json_decref(root);
}

/*
 * The default model's tokenizer cut down to its first K ids and the
 * merges among them: as tokenizer.json (SmolLM2's pre-tokenizer and
 * decoder) and as GGUF keys with the model's chat template.
 */
static void smollm2_cut(const char *model)
{
    enum { K = 700 };
    fy_gguf_t *g = NULL;
    if (!model || fy_gguf_open(model, &g) != FY_OK) {
        fprintf(stderr, "mkseeds: no default model: the seeds cut from it are left as they are\n");
        return;
    }
    fy_str_t *toks = NULL, *merges = NULL, tmpl = {0};
    int32_t *types = NULL;
    uint64_t nt = 0, nm = 0, ny = 0;
    if (fy_gguf_get_str_arr(g, "tokenizer.ggml.tokens", &toks, &nt) || nt < K ||
        fy_gguf_get_str_arr(g, "tokenizer.ggml.merges", &merges, &nm) ||
        fy_gguf_get_i32_arr(g, "tokenizer.ggml.token_type", &types, &ny) || ny != nt ||
        fy_gguf_get_str(g, "tokenizer.chat_template", &tmpl))
        abort();
    char *tsrc = fy_strndup(tmpl.ptr, tmpl.len);
    put_str("chat", "smollm2-from-model.jinja", tsrc);

    /* ids below K, and the merges whose halves and result are among them */
    json_t *vocab = json_object(), *jm = json_array(), *added = json_array();
    char **ks = calloc(K, sizeof(*ks));
    const char *kept_m[2048];
    int n_kept = 0;
    for (int i = 0; i < K; i++) {
        ks[i] = fy_strndup(toks[i].ptr, toks[i].len);
        json_object_set_new(vocab, ks[i], json_integer(i));
        if (types[i] == 3)
            json_array_append_new(added,
                                  json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", i, "content", ks[i],
                                            "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1));
    }
    char **ms = calloc(nm, sizeof(*ms));
    for (uint64_t i = 0; i < nm && n_kept < 2048; i++) {
        ms[i] = fy_strndup(merges[i].ptr, merges[i].len);
        const char *sp = strchr(ms[i] + 1, ' ');
        if (!sp) continue;
        char *a = fy_strndup(ms[i], (size_t)(sp - ms[i])), *ab = malloc(strlen(ms[i]));
        snprintf(ab, strlen(ms[i]), "%s%s", a, sp + 1);
        json_t *ia = json_object_get(vocab, a), *ib = json_object_get(vocab, sp + 1), *iab = json_object_get(vocab, ab);
        if (ia && ib && iab) {
            json_array_append_new(jm, json_string(ms[i]));
            kept_m[n_kept++] = ms[i];
        }
        fy_free(a);
        free(ab);
    }
    json_t *root =
        json_pack("{s:s, s:o, s:n, s:{s:s, s:[{s:s, s:b}, {s:s, s:b, s:b, s:b}]}, s:{s:s, s:b, s:b, s:b}, "
                  "s:{s:s, s:b, s:b, s:b}, s:{s:s, s:n, s:n, s:n, s:b, s:b, s:o, s:o}}",
                  "version", "1.0", "added_tokens", added, "normalizer", "pre_tokenizer", "type", "Sequence",
                  "pretokenizers", "type", "Digits", "individual_digits", 1, "type", "ByteLevel", "add_prefix_space", 0,
                  "trim_offsets", 1, "use_regex", 1, "post_processor", "type", "ByteLevel", "add_prefix_space", 0,
                  "trim_offsets", 0, "use_regex", 0, "decoder", "type", "ByteLevel", "add_prefix_space", 1,
                  "trim_offsets", 1, "use_regex", 1, "model", "type", "BPE", "dropout", "unk_token",
                  "continuing_subword_prefix", "fuse_unk", 0, "byte_fallback", 0, "vocab", vocab, "merges", jm);
    if (!root) abort();
    char *s = json_dumps(root, JSON_COMPACT);
    put_str("tokenizer_json", "smollm2-cut.json", s);
    json_t *cfg = json_pack("{s:s, s:s, s:b, s:s}", "bos_token", "<|im_start|>", "eos_token", "<|im_end|>",
                            "add_bos_token", 0, "chat_template", tsrc);
    char *cs = json_dumps(cfg, JSON_COMPACT);
    joined_t j = {0};
    join(&j, s, strlen(s));
    join(&j, cs, strlen(cs));
    put("tokenizer_json", "smollm2-cut-with-config", j.p, j.n);
    free(j.p);
    free(cs);
    free(s);
    json_decref(cfg);
    json_decref(root);

    /* the same as GGUF tokenizer keys */
    const char *tk[K];
    int32_t ty[K];
    for (int i = 0; i < K; i++) tk[i] = ks[i], ty[i] = types[i];
    fy_gw_t *w = fy_gw_new();
    fy_gw_str(w, "general.architecture", "llama");
    fy_gw_str(w, "general.name", "SmolLM2 tokenizer cut");
    fy_gw_str(w, "tokenizer.ggml.model", "gpt2");
    fy_gw_str(w, "tokenizer.ggml.pre", "smollm");
    fy_gw_str_arr(w, "tokenizer.ggml.tokens", tk, K);
    fy_gw_i32_arr(w, "tokenizer.ggml.token_type", ty, K);
    fy_gw_str_arr(w, "tokenizer.ggml.merges", kept_m, (size_t)n_kept);
    fy_gw_u32(w, "tokenizer.ggml.bos_token_id", 1);
    fy_gw_u32(w, "tokenizer.ggml.eos_token_id", 2);
    fy_gw_bool(w, "tokenizer.ggml.add_bos_token", false);
    fy_gw_str(w, "tokenizer.chat_template", tsrc);
    fy_gw_set_version(w, 2);
    size_t len;
    const uint8_t *b = fy_gw_bytes(w, &len);
    put("gguf", "tok-smollm2-cut-v2.gguf", b, len);
    fy_gw_free(w);

    for (int i = 0; i < K; i++) fy_free(ks[i]);
    for (uint64_t i = 0; i < nm; i++) fy_free(ms[i]);
    free(ks);
    free(ms);
    fy_free(tsrc);
    fy_free(toks);
    fy_free(merges);
    fy_free(types);
    fy_gguf_close(g);
}

static void texts(void)
{
    static const struct {
        const char *name, *text;
    } t[] = {
        {"ascii.txt", "The quick brown fox jumps over the lazy dog. 1234567890!?"},
        {"code.txt", "int main(void) {\n\treturn printf(\"%d\\n\", 42) < 0;\n}\n"},
        {"specials.txt", "<|im_start|>system\nignore that<|im_end|>\n<|im_start|>assistant\n<|endoftext|></s><s>"},
        {"unicode.txt", "caf\xc3\xa9 na\xc3\xafve \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x98\x80 \xe2\x96\x81x"},
        {"spaces.txt", "   leading\n\n\ttabs  and   runs   \r\n"},
        {"invalid-utf8.txt", "\xff\xfe\xc3\x28\xe2\x82\xf0\x90\x80 \xed\xa0\x80 \xc0\xaf end"},
        {"digits.txt", "3.14159 2,718 1e10 0x1F 0001"},
    };
    for (size_t i = 0; i < FY_ARRAY_LEN(t); i++) put_str("tokenizer", t[i].name, t[i].text);
}

/* ---- chat templates: the ones tests/test_chat.c holds, as C string literals ---------------------------------- */

static size_t c_literal(const char *s, char *out, const char **end_p)
{
    size_t n = 0;
    for (s++; *s && *s != '"'; s++) {
        if (*s != '\\') {
            out[n++] = *s;
            continue;
        }
        s++;
        switch (*s) {
        case 'n': out[n++] = '\n'; break;
        case 't': out[n++] = '\t'; break;
        case 'r': out[n++] = '\r'; break;
        case 'x': {
            unsigned v = 0;
            while (s[1] && strchr("0123456789abcdefABCDEF", s[1]))
                v = v * 16 + (unsigned)(s[1] <= '9' ? s[1] - '0' : (s[1] | 32) - 'a' + 10), s++;
            out[n++] = (char)v;
            break;
        }
        default: out[n++] = *s;
        }
    }
    *end_p = *s ? s + 1 : s;
    return n;
}

static void chat_templates(void)
{
    size_t len;
    char *src = slurp("tests/test_chat.c", &len);
    if (!src) {
        fprintf(stderr, "mkseeds: run from the repository root (tests/test_chat.c)\n");
        exit(1);
    }
    src = realloc(src, len + 1);
    src[len] = 0;
    const char *p = strstr(src, "/* ---- templates"), *stop = strstr(src, "/* ---- conversations");
    char *buf = malloc(len);
    while (p && stop && (p = strstr(p, "static const char ")) && p < stop) {
        p += strlen("static const char ");
        const char *br = strchr(p, '[');
        char name[64];
        snprintf(name, sizeof(name), "%.*s.jinja", (int)(br - p), p);
        for (char *c = name; *c; c++) *c = (char)(*c >= 'A' && *c <= 'Z' ? *c + 32 : *c);
        size_t n = 0;
        for (p = strchr(br, '=') + 1; *p && *p != ';';) {
            if (*p == '"')
                n += c_literal(p, buf + n, &p);
            else
                p++;
        }
        put("chat", name, buf, n);
        /* the same with its own conversation (NUL-separated) */
        static const char conv[] = "\0Be brief.\0Hello\0Hi there\0Who are you?\0I am \xe2\x9c\x93 here";
        memcpy(buf + n, conv, sizeof(conv) - 1);
        char name2[80];
        snprintf(name2, sizeof(name2), "%.*s-conv", (int)(strlen(name) - 6), name);
        put("chat", name2, buf, n + sizeof(conv) - 1);
    }
    free(buf);
    free(src);
    static const char *const small[] = {
        "{% for m in messages %}{{ m.role|upper }}: {{ m.content|trim }}\n{% endfor %}",
        ("{% set ns = namespace(n=0) %}{% for m in messages[::-1] %}{% set ns.n = ns.n + 1 %}{{ loop.index }}/"
         "{{ loop.length }} {{ m['content'][:3] }}{% endfor %}{{ ns.n }}"),
        "{{ messages|tojson }}{{ messages|length }}{% if messages[0].role is defined %}d{% endif %}",
        "{% macro m(x) %}[{{ x }}]{% endmacro %}{% for i in range(3) %}{{ m(i) }}{% endfor %}",
        "{%- if add_generation_prompt -%}{{ raise_exception('no') }}{%- else -%}{{ 'a' * 3 ~ 'b' }}{%- endif -%}",
    };
    for (size_t i = 0; i < FY_ARRAY_LEN(small); i++) {
        char name[32];
        snprintf(name, sizeof(name), "small-%zu.jinja", i);
        put_str("chat", name, small[i]);
    }
}

/* ---- config, api keys ---------------------------------------------------------------------------------------- */

static void configs(void)
{
    size_t len;
    char *b = slurp("configs/local.ini", &len);
    if (!b) abort();
    put("config", "local.ini", b, len);
    free(b);
    put_str("config", "types.ini",
            "; every value type\n[n]\na = 42\nb = -7\nc = +3\n[d]\na = 1.5\ne = .5\n[b]\nt = YES\nf = off\n"
            "[s]\na = 4096\nb = 512M\nc = 50GiB\nd = 1.5Ki\n[t]\na = 250ms\nb = 2s\nc = 1.5m\nh = 2min\n"
            "[prefill.0]\nthreads = 4\n[router]\nport = 7400 ; inline comment\nhttp = 127.0.0.1:8080\n");
    static const char sets[] = "[router]\nport = 1\n" FZ_SEP
                               "router.port=2\nprefill.0.threads = 8\ndecode.kv_mem=lots\nserve.stop_grace=5s\nbad";
    put("config", "with-sets", sets, sizeof(sets) - 1);
    put_str("config", "bad-line.ini", "[a]\nx = 1\n[b\ny = 2\nhost:port = 1\n");
    /* what the fuzzer found (docs/fuzzing.md) */
    put_str("config", "found-leading-semicolon.ini", "[kv]\ndtype =; not a comment\n");
    { /* key=value lines of the full 196 bytes (found by reading, issue 14) */
        char path[192], value[189], full[512];
        memset(path, 'm', sizeof(path) - 1);
        path[sizeof(path) - 1] = '\0';
        memset(value, 'x', sizeof(value) - 1);
        value[sizeof(value) - 1] = '\0';
        snprintf(full, sizeof(full), "[model]\npath=%s\n[kv]\ndtype=;%s\n", path, value);
        put_str("config", "found-full-line.ini", full);
    }
    put_str("tenants", "keys.txt",
            "# comment\n\nkey-one-0001 alpha   # trailing comment\nkey-two-0002 alpha max_concurrent=2\n"
            "key-three-03 beta tokens_per_minute=600\n");
    put_str("tenants", "limits.txt", "sk-0123456789abcdef team.a-1 max_concurrent=4 tokens_per_minute=100000\r\n");
    put_str("tenants", "bad.txt", "short alpha\nkey-one-0001 al/pha\n");
}

/* ---- grammars -------------------------------------------------------------------------------------------------- */

/* fuzz_grammar: a kind byte, 8 token-picking bytes, the source. */
static void grammars(void)
{
    static const struct {
        const char *name;
        char kind; /* 0 json_schema, 1 json_object, 2 regex, 3 choice, 4 gbnf (fy_grammar_kind_t) */
        const char *src;
    } seeds[] = {
        {"schema-object", 0,
         "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\",\"maxLength\":3}"
         ","
         "\"c\":{\"type\":\"array\",\"items\":{\"enum\":[\"x\",1,null]},\"maxItems\":2}},\"required\":[\"a\"]}"},
        {"schema-pydantic", 0,
         "{\"$defs\":{\"Color\":{\"enum\":[\"red\",\"blue\"],\"title\":\"Color\",\"type\":\"string\"}},"
         "\"properties\":{\"c\":{\"$ref\":\"#/$defs/"
         "Color\"},\"n\":{\"anyOf\":[{\"type\":\"number\"},{\"type\":\"null\"}],"
         "\"default\":null}},\"required\":[\"c\"],\"title\":\"M\",\"type\":\"object\"}"},
        {"schema-recursive", 0,
         "{\"definitions\":{\"n\":{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"array\",\"items\":"
         "{\"$ref\":\"#/definitions/n\"}}}}},\"$ref\":\"#/definitions/n\"}"},
        {"schema-formats", 0,
         "{\"anyOf\":[{\"type\":\"string\",\"format\":\"date-time\"},{\"type\":\"string\",\"format\":\"uuid\"},"
         "{\"type\":\"string\",\"pattern\":\"^[a-z]+\\\\d?$\"},{\"type\":\"integer\",\"minimum\":0}]}"},
        {"schema-map", 0, "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"boolean\"}}"},
        {"schema-refused", 0, "{\"type\":\"object\",\"patternProperties\":{}}"},
        {"json-object", 1, ""},
        {"regex-phone", 2, "\\(?\\d{3}\\)?[ -]?\\d{3}-\\d{4}"},
        {"regex-mixed", 2, "^(?:yes|no|[A-Z][a-z]*\\.)+(x|\\u00e9){1,3}.?$"},
        {"regex-class", 2, "[^\\s\"]+@[\\w.-]+"},
        {"choice", 3, "[\"positive\",\"negative\",\"n/a\",\"\"]"},
        {"gbnf-json", 4,
         "root ::= object\nvalue ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
         "object ::= \"{\" ws ( string \":\" ws value (\",\" ws string \":\" ws value)* )? \"}\" ws\n"
         "array ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n"
         "string ::= \"\\\"\" ( [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) )* "
         "\"\\\"\" ws\n"
         "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9]{1,3})? ws\n"
         "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}  # bounded\n"},
        {"gbnf-small", 4, "root ::= (\"yes\" | \"no\") \".\"? [\\u00e9a-c]{1,3} tail\ntail ::= ( . )*\n"},
        /* what the fuzzer found: an empty language's grammar has no byte sets */
        {"found-empty-regex", 2, ""},
    };
    for (size_t i = 0; i < sizeof(seeds) / sizeof(seeds[0]); i++) {
        size_t n = strlen(seeds[i].src);
        char *buf = malloc(9 + n);
        if (!buf) abort();
        buf[0] = seeds[i].kind;
        memcpy(buf + 1, "\x03\x11\x07\x29\x02\x05\x13\x0b", 8);
        memcpy(buf + 9, seeds[i].src, n);
        put("grammar", seeds[i].name, buf, 9 + n);
        free(buf);
    }
}

/* ---- wire messages -------------------------------------------------------------------------------------------- */

static void messages(void)
{
    fy_msgw_t w;
    fy_genspec_t g;
    fy_genspec_default(&g);
    fy_msgw_init(&w, "generate");
    fy_msgw_str(&w, "prompt", "Hello");
    fy_msgw_bool(&w, "chat", true);
    fy_genspec_write(&w, &g);
    put_msg("msg", "generate", &w);

    g.sampling.temperature = 0.7f, g.sampling.top_k = 40, g.sampling.top_p = 0.9f, g.sampling.min_p = 0.05f;
    g.sampling.seed = 12345, g.max_tokens = 64, g.ignore_eos = true, g.logprobs = true, g.priority = -3;
    g.spec = FY_SPEC_NGRAM, g.n_stop = 2;
    strcpy(g.stop[0], "\n\n");
    strcpy(g.stop[1], "</s>");
    const int32_t toks[] = {1, 2, 3, 49151, 0};
    fy_msgw_init(&w, "reserve");
    fy_msgw_u64(&w, "id", 7);
    fy_msgw_u64(&w, "rid", 9);
    fy_msgw_i32s(&w, "tokens", toks, 5);
    fy_genspec_write(&w, &g);
    put_msg("msg", "reserve", &w);
    fy_msgw_init(&w, "reserve");
    fy_genspec_write(&w, &g);
    put_msg("genspec", "full", &w);
    fy_genspec_default(&g);
    fy_msgw_init(&w, "generate");
    fy_genspec_write(&w, &g);
    put_msg("genspec", "default", &w);
    g.sampling.temperature = 1.5f, g.sampling.top_k = 1 << 24, g.sampling.top_p = 1e-6f, g.max_tokens = 4096;
    g.spec = FY_SPEC_DRAFT;
    fy_msgw_init(&w, "prefill");
    fy_genspec_write(&w, &g);
    put_msg("genspec", "edges", &w);
    /* vLLM's output controls and a structured output with bad words */
    fy_genspec_default(&g);
    g.n_allowed = 3, g.allowed_ids[0] = 5, g.allowed_ids[1] = 17, g.allowed_ids[2] = 49151;
    g.include_stop = g.render_special = true, g.n_stop = 1;
    strcpy(g.stop[0], "END");
    g.grammar_kind = FY_GEN_GRAMMAR_REGEX, g.grammar_len = 4;
    memcpy(g.grammar, "a+b?", 5);
    g.n_bad = 2, g.bad_lens[0] = 1, g.bad_lens[1] = 2, g.bad_ids[0] = 9, g.bad_ids[1] = 10, g.bad_ids[2] = 11;
    g.prompt_logprobs = true, g.prompt_top = 2, g.repetition_penalty = 1.2f;
    fy_msgw_init(&w, "generate");
    fy_genspec_write(&w, &g);
    put_msg("genspec", "controls", &w);

    /* what the fuzzer found (docs/fuzzing.md): kept so that every run checks them */
    fy_genspec_default(&g);
    g.sampling.temperature = 1.0f, g.sampling.top_p = 0.3f, g.sampling.min_p = 0.05f;
    fy_msgw_init(&w, "generate");
    fy_genspec_write(&w, &g);
    put_msg("genspec", "found-small-top-p", &w);
    g.sampling.temperature = 1e-39f, g.sampling.top_p = 0.9f;
    fy_msgw_init(&w, "generate");
    fy_genspec_write(&w, &g);
    put_msg("genspec", "found-tiny-temperature", &w);
    fy_msgw_init(&w, "generate");
    fy_msgw_f64(&w, "top_p", 1e-6);
    put_msg("genspec", "found-top-p-bound", &w);

    fy_msgw_init(&w, "events");
    fy_msgw_u64(&w, "id", 3);
    fy_msgw_i32s(&w, "tokens", toks, 3);
    fy_msgw_strn(&w, "text", "abc\xe2\x9c", 5);
    fy_msgw_bool(&w, "done", true);
    fy_msgw_str(&w, "finish_reason", "stop");
    fy_msgw_map_begin(&w, "timings");
    fy_msgw_f64(&w, "ttft_s", 0.125);
    fy_msgw_i64(&w, "transfer_bytes", 1 << 20);
    fy_msgw_map_begin(&w, "deeper");
    fy_msgw_f64(&w, "x", -1.5);
    fy_msgw_map_end(&w);
    fy_msgw_map_end(&w);
    put_msg("msg", "events", &w);

    const uint64_t rng[4] = {1, UINT64_MAX, 0, 42};
    const float lps[3] = {-0.5f, -1e-3f, 0};
    const char *const names[] = {"prefill-0", "decode-0", "decode-1"};
    fy_msgw_init(&w, "status");
    fy_msgw_strs(&w, "workers", names, 3);
    fy_msgw_u64s(&w, "rng", rng, 4);
    fy_msgw_f32s(&w, "logprobs", lps, 3);
    fy_msgw_bin(&w, "target", "\x00\x01\x02\xff", 4);
    fy_msgw_i64(&w, "queued", -1);
    put_msg("msg", "status", &w);

    for (int s = 1; s < FY_STATUS_COUNT; s += 4) {
        char name[32];
        fy_msg_error(&w, (uint64_t)s, (fy_status_t)s, s == 1 ? NULL : "the request failed: details");
        snprintf(name, sizeof(name), "error-%s", fy_status_tag((fy_status_t)s));
        put_msg("error", name, &w);
        if (s == 5) {
            fy_msg_error(&w, 5, (fy_status_t)s, "x");
            put_msg("msg", "error", &w);
        }
    }

    /* what the fuzzer found (docs/fuzzing.md): empty keys, one and two */
    static const unsigned char one_empty[] = {0x83, 0xa0, 0x01, 0xa1, 'v', 0x01, 0xa4, 't', 'y', 'p', 'e', 0xa1, 'x'};
    static const unsigned char found[] = {0x85, 0xa0, 0xa0, 0xa0, 0xa0, 0xa0, 0xff, 0xff, 0x69, 0x6f,
                                          0xd3, 0x89, 0x63, 0x74, 0x20, 0x6f, 0xd2, 0x41, 0x6f};
    put("msg", "found-empty-key", one_empty, sizeof(one_empty));
    put("error", "found-empty-keys", found, sizeof(found));

    /* load reports with a digest */
    for (int n = 0; n < 2; n++) {
        uint32_t bytes = fy_bloom_bytes_for(n ? 1000 : 10);
        uint8_t *bits = calloc(bytes, 1);
        uint64_t x = 99;
        for (int i = 0; i < (n ? 1000 : 10); i++) {
            fy_kv_hash_t h;
            for (size_t k = 0; k < sizeof(h.b); k++) h.b[k] = (uint8_t)((x = x * 6364136223846793005ull + 1) >> 56);
            fy_bloom_add(bits, bytes, &h);
        }
        fy_msgw_init(&w, "load");
        fy_msgw_str(&w, "worker", "decode-0");
        fy_msgw_u64(&w, "inc", 1);
        fy_msgw_str(&w, "role", "decode");
        fy_msgw_str(&w, "listen", "tcp://127.0.0.1:7500");
        fy_msgw_str(&w, "model", "tiny@0123456789abcdef");
        fy_msgw_i64(&w, "block_size", 16);
        fy_msgw_i64(&w, "max_seqs", 32);
        fy_msgw_i64(&w, "total_blocks", 1024);
        fy_msgw_u64(&w, "seed", 99);
        fy_msgw_bin(&w, "bloom", bits, bytes);
        char name[32];
        snprintf(name, sizeof(name), "load-%u", bytes);
        put_msg("bloom", name, &w);
        if (!n) {
            fy_msgw_init(&w, "load");
            fy_msgw_bin(&w, "bloom", bits, bytes);
            put_msg("msg", "load", &w);
        }
        free(bits);
    }
}

/* One example of every control-plane message, written by its schema, and
 * the variants other senders write (a text prompt, a token without its
 * logprob, each role's load report, an error without an attempt). */
static void wire_messages(void)
{
    static _Alignas(max_align_t) char m[65536];
    fy_msgw_t w;
    for (int32_t i = 0; i < fy_wire_n_all; i++) {
        const fy_wire_schema_t *s = fy_wire_all[i];
        if (fy_wire_size(s) > sizeof(m)) abort();
        fy_test_wire_example(s, m);
        fy_wire_write(s, &w, m);
        put_msg("wire", fy_wire_name(s), &w);
    }
    fy_wire_generate_t *g = (fy_wire_generate_t *)m;
    fy_test_wire_example(&fy_wire_generate_schema, g);
    g->has_tokens = false, g->prompt = "Hello, world", g->prompt_len = 12, g->system = NULL;
    fy_wire_generate_write(&w, g);
    put_msg("wire", "generate-text", &w);
    fy_wire_token_t *t = (fy_wire_token_t *)m;
    fy_test_wire_example(&fy_wire_token_schema, t);
    t->has_logprob = false;
    fy_wire_token_write(&w, t);
    put_msg("wire", "token-no-logprob", &w);
    fy_wire_load_t *l = (fy_wire_load_t *)m;
    fy_test_wire_example(&fy_wire_load_schema, l);
    l->has_decode = false;
    snprintf(l->role, sizeof(l->role), "prefill");
    fy_wire_load_write(&w, l);
    put_msg("wire", "load-prefill", &w);
    fy_wire_ev_error_t *e = (fy_wire_ev_error_t *)m;
    fy_test_wire_example(&fy_wire_ev_error_schema, e);
    e->has_attempt = false;
    fy_wire_ev_error_write(&w, e);
    put_msg("wire", "ev_error-decode", &w);
}

/* ---- transfer: target blobs and handshakes ------------------------------------------------------------------- */

static void transfer(void)
{
    uint8_t addr[40], rkey[24];
    for (size_t i = 0; i < sizeof(addr); i++) addr[i] = (uint8_t)(i * 7 + 1);
    for (size_t i = 0; i < sizeof(rkey); i++) rkey[i] = (uint8_t)(i * 13 + 5);
    fy_xfer_target_t t = {.addr = addr,
                          .addr_len = sizeof(addr),
                          .rkey = rkey,
                          .rkey_len = sizeof(rkey),
                          .arena_base = 0x7f0000000000ull,
                          .arena_bytes = 64 << 20,
                          .block_bytes = 1 << 16};
    snprintf(t.name, sizeof(t.name), "decode-0");
    uint8_t *blob;
    size_t len;
    if (fy_xfer_blob_build(&t, &blob, &len) != FY_OK) abort();
    put("xfer_blob", "decode-0", blob, len);
    fy_free(blob);
    t.addr_len = 1, t.rkey_len = 1, t.arena_bytes = t.block_bytes = 4096;
    t.name[0] = 0;
    if (fy_xfer_blob_build(&t, &blob, &len) != FY_OK) abort();
    put("xfer_blob", "smallest", blob, len);
    /* a decode group's descriptors: tp 3 of real-shaped blobs, tp 3 x pp 2 of the smallest */
    {
        uint8_t *b0, *g;
        size_t l0, gl;
        t.addr_len = sizeof(addr), t.rkey_len = sizeof(rkey), t.arena_bytes = 64 << 20, t.block_bytes = 1 << 14;
        snprintf(t.name, sizeof(t.name), "decode-0");
        if (fy_xfer_blob_build(&t, &b0, &l0) != FY_OK) abort();
        fy_xgroup_desc_t gd = {.tp = 3, .pp = 1, .n = 3};
        for (int k = 0; k < 3; k++) gd.blob[k] = b0, gd.blob_len[k] = l0;
        if (fy_xgroup_desc_build(&gd, &g, &gl) != FY_OK) abort();
        put("xgroup_desc", "tp3", g, gl);
        fy_free(g);
        fy_free(b0);
    }
    {
        fy_xgroup_desc_t gd = {.tp = 3, .pp = 2, .n = 6};
        for (int k = 0; k < 6; k++) gd.blob[k] = blob, gd.blob_len[k] = len;
        uint8_t *g;
        size_t gl;
        if (fy_xgroup_desc_build(&gd, &g, &gl) != FY_OK) abort();
        put("xgroup_desc", "tp3-pp2-smallest", g, gl);
        fy_free(g);
    }
    fy_free(blob);

    fy_xfer_layout_t l = {.dtype = 1,
                          .block_size = 16,
                          .n_layers = 30,
                          .n_kv_heads = 3,
                          .head_dim = 64,
                          .order = FY_XFER_ORDER_BLOCK_MAJOR,
                          .scale_format = 0,
                          .block_bytes = 368640,
                          .n_groups = 1};
    snprintf(l.model_id, sizeof(l.model_id), "SmolLM2-135M@3f9a0c1d");
    fy_xfer_layout_whole(&l);
    fy_xfer_hello_t h = {.cookie = 0x1122334455667788ull, .layout = l};
    snprintf(h.name, sizeof(h.name), "prefill-0");
    uint8_t hb[FY_XFER_HELLO_LEN];
    fy_xfer_hello_pack(&h, hb);
    put("xfer_hello", "hello", hb, sizeof(hb));
    fy_xfer_reply_t r = {.cookie = h.cookie, .ok = true, .layout = l};
    uint8_t rb[FY_XFER_REPLY_LEN];
    fy_xfer_reply_pack(&r, rb);
    put("xfer_hello", "reply-ok", rb, sizeof(rb));
    r.ok = false;
    r.layout.block_size = 32;
    (void)fy_xfer_layout_explain(&l, &r.layout, r.message, sizeof(r.message));
    fy_xfer_reply_pack(&r, rb);
    put("xfer_hello", "reply-refused", rb, sizeof(rb));
    uint8_t two[2 * FY_XFER_LAYOUT_WIRE_LEN];
    fy_xfer_layout_pack(&l, two);
    fy_xfer_layout_pack(&r.layout, two + FY_XFER_LAYOUT_WIRE_LEN);
    put("xfer_hello", "two-layouts", two, sizeof(two));
    /* Gemma 3's KV groups against the same model with one table for every layer */
    fy_xfer_layout_t g = l, one = l;
    g.n_layers = one.n_layers = 18, g.n_kv_heads = one.n_kv_heads = 1, g.head_dim = one.head_dim = 256;
    g.n_groups = 6, g.groups = 0x5eed6a11u, g.block_bytes = 49152, one.block_bytes = 294912;
    fy_xfer_layout_pack(&g, two);
    fy_xfer_layout_pack(&one, two + FY_XFER_LAYOUT_WIRE_LEN);
    put("xfer_hello", "two-layouts-groups", two, sizeof(two));
    /* a rank of a tp 3 x pp 2 group against the whole model */
    fy_xfer_layout_t r1 = l;
    r1.tp = 3, r1.pp = 2, r1.tp_rank = 1, r1.stage = 1, r1.layer0 = 15, r1.n_layers = 15, r1.kv_head0 = 1;
    r1.n_kv_heads = 1, r1.block_bytes = l.block_bytes / 6;
    fy_xfer_layout_pack(&r1, two);
    fy_xfer_layout_pack(&l, two + FY_XFER_LAYOUT_WIRE_LEN);
    put("xfer_hello", "two-layouts-ranks", two, sizeof(two));
}

/* ---- HTTP bodies (first byte: 0 completions, 1 chat, 2 tokenize, 3 detokenize) ------------------------------------------------------------ */

static void http(void)
{
    static const struct {
        const char *name;
        int kind;
        const char *body;
    } b[] = {
        {"completion", false,
         "{\"model\":\"SmolLM2-135M-Instruct.Q4_1\",\"prompt\":\"Once upon a time\",\"max_tokens\":16,"
         "\"temperature\":0.7,\"top_p\":0.9,\"top_k\":40,\"seed\":1,\"stop\":[\"\\n\",\"The end\"]}"},
        {"completion-ids", false,
         "{\"prompt\":[1,2,3,4,49151],\"logprobs\":0,\"stream\":true,"
         "\"stream_options\":{\"include_usage\":true},\"n\":2,\"min_p\":0.05}"},
        {"completion-batch", false, "{\"prompt\":[\"a\",\"b\"],\"echo\":true,\"best_of\":1,\"suffix\":null}"},
        /* prompt arrays (issue 35): token-id arrays, n per prompt, truncation per prompt, special tokens */
        {"completion-batch-ids", false,
         "{\"prompt\":[[1,2,3],[4,5],[49151]],\"n\":3,\"stream\":true,\"truncate_prompt_tokens\":2}"},
        {"completion-batch-special", false,
         "{\"prompt\":[\"<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n\",\"b\"],\"n\":2}"},
        {"completion-batch-bad", false, "{\"prompt\":[[1],\"\",[]],\"n\":40}"},
        {"chat", true,
         "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\","
         "\"content\":\"Hello <|im_end|>\"}],\"max_completion_tokens\":32,\"logprobs\":true,"
         "\"top_logprobs\":0,\"speculative\":\"ngram\",\"priority\":5,\"ignore_eos\":false}"},
        {"chat-parts", true,
         "{\"messages\":[{\"role\":\"developer\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
         "{\"type\":\"text\",\"text\":\"\\u00e9\\ud83d\\ude00\"}]},{\"role\":\"assistant\","
         "\"content\":\"x\"},{\"role\":\"user\",\"content\":\"y\"}],\"response_format\":"
         "{\"type\":\"text\"},\"tools\":[],\"presence_penalty\":0}"},
        /* HTTP accepts these and the wire refuses them (issue 13, item 5): what the target checks
         * once it calls http.c's own parser (docs/fuzzing.md) */
        {"found-top-p-1e-7", false, "{\"prompt\":\"hi\",\"top_p\":1e-7}"},
        {"found-top-k-2e7", false, "{\"prompt\":\"hi\",\"top_k\":20000000}"},
        {"chat-bad", true,
         "{\"messages\":[{\"role\":\"tool\",\"content\":1}],\"temperature\":\"hot\","
         "\"logit_bias\":{\"1\":2}}"},
        {"completion-max-completion-tokens", false,
         "{\"prompt\":\"hi\",\"max_completion_tokens\":4,\"max_tokens\":4,\"min_tokens\":0}"},
        {"completion-echo", false,
         "{\"prompt\":\"The sky is\",\"max_tokens\":0,\"echo\":true,\"logprobs\":2,\"prompt_logprobs\":3,"
         "\"bad_words\":[\"blue\",\" green sky\"]}"},
        /* issue 35: an integer beyond int64 is named by its field (found again with integers as
         * reals, after a real beyond it); stream_options without stream */
        {"completion-huge-seed", false, "{\"prompt\":\"hi\",\"temperature\":1e30,\"seed\":18446744073709551616}"},
        {"chat-huge-bias", true,
         "{\"messages\":[{\"role\":\"developer\",\"content\":\"x\"}],\"stream\":false,"
         "\"stream_options\":{\"include_usage\":true},\"logit_bias\":{\"5\":-99999999999999999999}}"},
        {"tokenize", 2,
         "{\"model\":\"SmolLM2-135M-Instruct.Q4_1\",\"prompt\":\"Hello <|im_end|> \\u00e9\","
         "\"add_special_tokens\":false,\"return_token_strs\":true}"},
        {"tokenize-empty", 2, "{\"prompt\":\"\"}"},
        {"tokenize-chat", 2,
         "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\","
         "\"content\":[{\"type\":\"text\",\"text\":\"x\"}]}],\"add_generation_prompt\":true}"},
        {"detokenize", 3, "{\"model\":null,\"tokens\":[1,2,3,49151,0,198]}"},
        {"detokenize-bad", 3, "{\"tokens\":[1,-1,\"x\"]}"},
        /* POST /v1/responses (bit 6) */
        {"responses", 0x41,
         "{\"model\":\"SmolLM2-135M-Instruct.Q4_1\",\"input\":\"Say hi\",\"instructions\":\"Be brief.\","
         "\"max_output_tokens\":16,\"temperature\":0.5,\"top_p\":0.9,\"seed\":2,\"stream\":true,\"store\":true,"
         "\"metadata\":{\"a\":\"b\"},\"text\":{\"format\":{\"type\":\"json_object\"}}}"},
        {"responses-items", 0x41,
         "{\"input\":[{\"role\":\"developer\",\"content\":\"x\"},{\"type\":\"message\",\"role\":\"user\","
         "\"content\":[{\"type\":\"input_text\",\"text\":\"Weather?\"}]},{\"type\":\"function_call\","
         "\"call_id\":\"call_1\",\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"},"
         "{\"type\":\"function_call_output\",\"call_id\":\"call_1\",\"output\":\"21 C\"}],\"tools\":[{\"type\":"
         "\"function\",\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":"
         "{\"type\":\"string\"}}},\"strict\":true}],\"tool_choice\":{\"type\":\"function\",\"name\":"
         "\"get_weather\"},\"parallel_tool_calls\":false}"},
        {"responses-schema", 0x41,
         "{\"input\":\"Is it?\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"yn\",\"strict\":"
         "true,\"schema\":{\"type\":\"object\",\"properties\":{\"answer\":{\"enum\":[\"yes\",\"no\"]}}}}}}"},
        {"responses-bad", 0xc1,
         "{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\"}]}],\"previous_response_id\":"
         "\"resp_1\",\"tools\":[{\"type\":\"web_search\"}],\"max_output_tokens\":0}"},
    };
    for (size_t i = 0; i < FY_ARRAY_LEN(b); i++) {
        size_t n = strlen(b[i].body);
        char *buf = malloc(n + 1);
        buf[0] = (char)b[i].kind;
        memcpy(buf + 1, b[i].body, n);
        put("http", b[i].name, buf, n + 1);
        free(buf);
    }
}

/* ---- etcd's answers and the registration record --------------------------------------------------------- */

static void etcd_answers(void)
{
    /* as etcd 3.4's JSON gateway answers */
    put_str("etcd", "grant",
            "{\"header\":{\"cluster_id\":\"324952591200643719\",\"member_id\":\"3319814642761637952\","
            "\"revision\":\"1\",\"raft_term\":\"2\"},\"ID\":\"2324035578623626757\",\"TTL\":\"5\"}");
    put_str("etcd", "keepalive",
            "{\"result\":{\"header\":{\"revision\":\"1\"},\"ID\":\"2324035578623626759\",\"TTL\":\"5\"}}");
    put_str("etcd", "keepalive-expired", "{\"result\":{\"header\":{\"revision\":\"2\"},\"ID\":\"12345\"}}");
    put_str("etcd", "put",
            "{\"header\":{\"cluster_id\":\"324952591200643719\",\"revision\":\"2\",\"raft_term\":\"2\"}}");
    put_str("etcd", "error",
            "{\"error\":\"illegal base64 data at input byte 0\",\"message\":\"illegal base64 data at "
            "input byte 0\",\"code\":3}");
    put_str("etcd", "range-empty", "{\"header\":{\"revision\":\"2\"}}");
    /* a range holding a router's and a worker's records, as ferry writes them */
    fy_member_t r = {.inc = 0x1122334455667788ull, .tag = 4242, .layout = 0x0123456789abcdefull};
    snprintf(r.kind, sizeof(r.kind), "router");
    snprintf(r.name, sizeof(r.name), "router-a");
    snprintf(r.addr, sizeof(r.addr), "tcp://10.0.0.1:7401");
    snprintf(r.client, sizeof(r.client), "tcp://10.0.0.1:7400");
    snprintf(r.http, sizeof(r.http), "http://10.0.0.1:8080");
    snprintf(r.model, sizeof(r.model), "smollm2-135m-q4_1");
    snprintf(r.version, sizeof(r.version), "0.1.0");
    fy_member_t w = r;
    w.tag = 0;
    snprintf(w.kind, sizeof(w.kind), "decode");
    snprintf(w.name, sizeof(w.name), "decode-0");
    snprintf(w.addr, sizeof(w.addr), "tcp://10.0.0.2:7500");
    w.client[0] = 0;
    char *rj, *wj, *uj;
    size_t rl, wl, ul;
    /* signed as a cluster with FZ_MEMBER_SECRET signs them (fuzz_etcd verifies with it) */
    uint8_t key[FY_MEMBER_KEY_BYTES];
    if (fy_member_key((const uint8_t *)FZ_MEMBER_SECRET, strlen(FZ_MEMBER_SECRET), key) ||
        fy_member_sign(&r, key, "/ferry/t/routers/router-a", 1700000000000, &rj, &rl) ||
        fy_member_sign(&w, key, "/ferry/t/workers/decode/decode-0", 1700000000000, &wj, &wl))
        exit(1);
    put("etcd", "record-router", rj, rl);
    put("etcd", "record-decode", wj, wl);
    w.mac[0] ^= 1; /* a forged one: reads, does not verify */
    if (fy_member_write(&w, &uj, &ul)) exit(1);
    put("etcd", "record-forged", uj, ul);
    fy_free(uj);
    /* a router's tag claim (/v3/kv/txn): won, and lost to the record there */
    put_str("etcd", "txn-won",
            "{\"header\":{\"revision\":\"4\"},\"succeeded\":true,\"responses\":[{\"response_put\":{\"header\":"
            "{\"revision\":\"4\"}}}]}");
    char rb[2048], wb[2048], json[8192];
    sodium_bin2base64(rb, sizeof(rb), (const unsigned char *)rj, rl, sodium_base64_VARIANT_ORIGINAL);
    sodium_bin2base64(wb, sizeof(wb), (const unsigned char *)wj, wl, sodium_base64_VARIANT_ORIGINAL);
    snprintf(json, sizeof(json),
             "{\"header\":{\"revision\":\"9\"},\"kvs\":[{\"key\":\"L2ZlcnJ5L3Qvcm91dGVycy9yb3V0ZXItYQ==\","
             "\"create_revision\":\"3\",\"mod_revision\":\"3\",\"version\":\"1\",\"value\":\"%s\",\"lease\":\"7\"},"
             "{\"key\":\"L2ZlcnJ5L3Qvd29ya2Vycy9kZWNvZGUvZGVjb2RlLTA=\",\"value\":\"%s\"}],\"count\":\"2\"}",
             rb, wb);
    put_str("etcd", "range", json);
    snprintf(json, sizeof(json),
             "{\"header\":{\"revision\":\"5\"},\"responses\":[{\"response_range\":{\"header\":{\"revision\":"
             "\"5\"},\"kvs\":[{\"key\":\"L2ZlcnJ5L3QvdGFncy8wMTA5Mg==\",\"create_revision\":\"4\",\"value\":\"%s\","
             "\"lease\":\"7\"}],\"count\":\"1\"}}]}",
             rb);
    put_str("etcd", "txn-lost", json);
    fy_free(rj);
    fy_free(wj);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: mkseeds CORPUS_DIR   (from the repository root)\n");
        return 2;
    }
    g_root = argv[1];
    if (mkdir(g_root, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "mkseeds: %s: %s\n", g_root, strerror(errno));
        return 1;
    }
    fz_quiet_log();
    char tmp[] = "/tmp/ferry-mkseeds-XXXXXX";
    if (!mkdtemp(tmp)) return 1;
    const char *model = getenv("FERRY_MODEL");
    if (!model || access(model, R_OK)) model = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (access(model, R_OK)) model = NULL;

    models(tmp);
    gguf_types();
    gguf_llama_tokenizer();
    json_spm_tokenizer();
    smollm2_cut(model);
    texts();
    chat_templates();
    configs();
    messages();
    wire_messages();
    transfer();
    http();
    grammars();
    etcd_answers();

    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
    if (system(cmd) != 0) fprintf(stderr, "mkseeds: cannot remove %s\n", tmp);
    printf("mkseeds: %d files under %s\n", g_files, g_root);
    return 0;
}

/*
 * fuzz_gguf.c - the GGUF reader (model/gguf.c) on any bytes as a .gguf file.
 *
 * Checks: fy_gguf_open reads nothing outside the file (the file is a heap
 * copy of its exact size, util.h) and fails with FY_ERR_FORMAT, or gives a
 * reader whose every supported tensor lies inside the file with data at
 * its offset; every getter, on every key model.c and tokenizer.c read,
 * answers FY_OK, FY_ERR_NOT_FOUND or FY_ERR_FORMAT, and its arrays hold
 * the count it says.  Seeds: tiny models and tokenizers from
 * tests/tinymodel.c and tests/gguf_writer.c (mkseeds.c).
 */
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "common/mem.h"
#include "tests/fuzz/util.h"

static const char *const k_keys[] = {
    "general.architecture",
    "general.name",
    "general.alignment",
    "llama.block_count",
    "llama.embedding_length",
    "llama.attention.head_count",
    "llama.attention.head_count_kv",
    "llama.attention.key_length",
    "llama.attention.value_length",
    "llama.feed_forward_length",
    "llama.vocab_size",
    "llama.context_length",
    "llama.rope.freq_base",
    "llama.rope.dimension_count",
    "llama.rope.scaling.type",
    "llama.attention.layer_norm_rms_epsilon",
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.scores",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_space_prefix",
    "tokenizer.chat_template",
};

static volatile uint8_t g_sink;

static void check_status(fy_status_t st, const char *what, const char *key)
{
    FZ_CHECK(st == FY_OK || st == FY_ERR_NOT_FOUND || st == FY_ERR_FORMAT, "%s('%s') returned %s", what, key,
             fy_status_str(st));
}

static void read_keys(const fy_gguf_t *g)
{
    for (size_t i = 0; i < FY_ARRAY_LEN(k_keys); i++) {
        const char *key = k_keys[i];
        bool has = fy_gguf_has_key(g, key);
        uint32_t u;
        float f;
        bool b;
        fy_str_t s;
        fy_status_t st = fy_gguf_get_u32(g, key, &u);
        check_status(st, "get_u32", key);
        FZ_CHECK(has == (st != FY_ERR_NOT_FOUND), "has_key and get_u32 disagree on '%s'", key);
        check_status(fy_gguf_get_f32(g, key, &f), "get_f32", key);
        check_status(fy_gguf_get_bool(g, key, &b), "get_bool", key);
        st = fy_gguf_get_str(g, key, &s);
        check_status(st, "get_str", key);
        if (st == FY_OK && s.len) g_sink ^= (uint8_t)(s.ptr[0] ^ s.ptr[s.len - 1]);

        fy_str_t *sv = NULL;
        float *fv = NULL;
        int32_t *iv = NULL;
        uint64_t n = 0;
        st = fy_gguf_get_str_arr(g, key, &sv, &n);
        check_status(st, "get_str_arr", key);
        if (st == FY_OK) {
            for (uint64_t k = 0; k < n; k++)
                if (sv[k].len) g_sink ^= (uint8_t)(sv[k].ptr[0] ^ sv[k].ptr[sv[k].len - 1]);
            fy_free(sv);
        }
        st = fy_gguf_get_f32_arr(g, key, &fv, &n);
        check_status(st, "get_f32_arr", key);
        if (st == FY_OK) {
            for (uint64_t k = 0; k < n; k++) g_sink ^= (uint8_t)(fv[k] > 0);
            fy_free(fv);
        }
        st = fy_gguf_get_i32_arr(g, key, &iv, &n);
        check_status(st, "get_i32_arr", key);
        if (st == FY_OK) {
            for (uint64_t k = 0; k < n; k++) g_sink ^= (uint8_t)iv[k];
            fy_free(iv);
        }
    }
}

static void read_tensors(const fy_gguf_t *g)
{
    uint64_t size = fy_gguf_file_size(g), n = fy_gguf_n_tensors(g);
    const uint8_t *base = NULL;
    for (uint64_t i = 0; i < n; i++) {
        const fy_gguf_tensor_t *t = fy_gguf_tensor(g, i);
        FZ_CHECK(t != NULL, "tensor %llu of %llu is NULL", (unsigned long long)i, (unsigned long long)n);
        FZ_CHECK(t->n_dims >= 1 && t->n_dims <= FY_GGUF_MAX_DIMS, "tensor with %u dims", t->n_dims);
        for (int d = 0; d < FY_GGUF_MAX_DIMS; d++) FZ_CHECK(t->ne[d] >= 1, "ne[%d] = %lld", d, (long long)t->ne[d]);
        (void)fy_gguf_ggml_type_name(t->ggml_type);
        if (t->name.len && !memchr(t->name.ptr, 0, t->name.len)) {
            char *name = fz_strndup(t->name.ptr, t->name.len);
            const fy_gguf_tensor_t *found = fy_gguf_find_tensor(g, name);
            FZ_CHECK(found == t, "tensor '%s' is not found by its own name", name);
            free(name);
        }
        if (!t->supported) continue;
        FZ_CHECK(t->offset <= size && t->nbytes <= size - t->offset, "tensor of %llu bytes at %llu in a %llu-byte file",
                 (unsigned long long)t->nbytes, (unsigned long long)t->offset, (unsigned long long)size);
        const uint8_t *d = t->data;
        if (!base) base = d - t->offset;
        FZ_CHECK(d - t->offset == base, "tensor data is not at its offset in the file");
        if (t->nbytes) g_sink ^= (uint8_t)(d[0] ^ d[t->nbytes - 1]);
    }
    FZ_CHECK(fy_gguf_tensor(g, n) == NULL, "a tensor past the count");
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fz_quiet_log();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fz_write("model.gguf", data, size);
    fy_gguf_t *g = NULL;
    fy_status_t st = fy_gguf_open(path, &g);
    FZ_CHECK(st == FY_OK || st == FY_ERR_FORMAT, "fy_gguf_open returned %s", fy_status_str(st));
    if (st != FY_OK) return 0;
    FZ_CHECK(fy_gguf_file_size(g) == size, "file size %llu, wrote %zu", (unsigned long long)fy_gguf_file_size(g), size);
    FZ_CHECK(fy_gguf_version(g) == 2 || fy_gguf_version(g) == 3, "version %u", fy_gguf_version(g));
    read_keys(g);
    read_tensors(g);
    fy_gguf_close(g);
    return 0;
}

/*
 * fuzz_model.c - model loading (model/model.c) on top of the GGUF,
 * safetensors and tokenizer readers: an input is a .gguf file, or, when it
 * holds FZ_SEP, a Hugging Face folder: config.json, model.safetensors,
 * tokenizer.json and (optionally) tokenizer_config.json, in that order.
 *
 * Checks: fy_model_load fails with a status a model file can cause
 * (format, unsupported, not found, io) or gives a model whose
 * configuration passes fy_model_config_check, every weight readable to its
 * last byte, a description, an id, and a tokenizer and chat template that
 * encode and render a short conversation; fy_model_inspect (ferry info)
 * reports on every input without crashing.  Seeds: tiny models written by
 * tests/tinymodel.c, as GGUF (q8_0, q4_0, q5_0; qwen2, qwen3, gemma3) and as
 * folders.
 */
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "model/model.h"
#include "tests/fuzz/util.h"

static volatile uint8_t g_sink;

static void touch(const fy_tensor_t *t, const char *what)
{
    FZ_CHECK(t->data != NULL && t->nbytes > 0, "weight %s has no data", what);
    FZ_CHECK(t->row_bytes * (size_t)t->ne[1] == t->nbytes, "weight %s: %zu bytes for %lld rows of %zu", what, t->nbytes,
             (long long)t->ne[1], t->row_bytes);
    const uint8_t *p = t->data;
    g_sink ^= (uint8_t)(p[0] ^ p[t->nbytes - 1]);
}

static void use_model(const fy_model_t *m)
{
    const fy_model_config_t *c = fy_model_config(m);
    FZ_CHECK(fy_model_config_check(c, "loaded") == FY_OK, "a loaded model fails its own config check");
    const fy_model_weights_t *w = fy_model_weights(m);
    touch(&w->tok_embd, "tok_embd");
    touch(&w->out_norm, "out_norm");
    touch(&w->output, "output");
    for (int l = 0; l < c->n_layers; l++) {
        const fy_layer_weights_t *L = &w->layers[l];
        const fy_tensor_t *t[] = {&L->attn_norm, &L->wq,     &L->wk,   &L->wv,    &L->wo,
                                  &L->ffn_norm,  &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < FY_ARRAY_LEN(t); i++) touch(t[i], "layer");
        /* the architecture's own: present exactly when its traits say */
        const fy_arch_traits_t *a = &c->traits;
        const struct {
            const fy_tensor_t *t;
            bool want;
        } extra[] = {{&L->bq, a->qkv_bias},
                     {&L->bk, a->qkv_bias},
                     {&L->bv, a->qkv_bias},
                     {&L->q_norm, a->qk_norm},
                     {&L->k_norm, a->qk_norm},
                     {&L->post_attn_norm, a->post_norms},
                     {&L->post_ffn_norm, a->post_norms}};
        for (size_t i = 0; i < FY_ARRAY_LEN(extra); i++) {
            FZ_CHECK((extra[i].t->data != NULL) == extra[i].want, "layer %d: tensor %zu present %d, wanted %d", l, i,
                     extra[i].t->data != NULL, extra[i].want);
            if (extra[i].want) touch(extra[i].t, "layer extra");
        }
        FZ_CHECK(c->layer[l].window >= 0 && c->layer[l].rope.theta > 0, "layer %d: window %d, rope base %g", l,
                 c->layer[l].window, (double)c->layer[l].rope.theta);
    }
    char buf[512];
    fy_model_describe(m, buf, sizeof(buf));
    fy_model_id(m, buf, 64);
    FZ_CHECK(strlen(buf) <= 63, "model id of %zu bytes", strlen(buf));
    (void)fy_model_weight_bytes_per_token(m);

    const fy_tokenizer_t *tok = fy_model_tokenizer(m);
    FZ_CHECK(fy_tokenizer_vocab_size(tok) <= c->vocab_size, "tokenizer larger than the model");
    static const char text[] = "Hello, world! <|im_end|> \xe2\x96\x81"
                               "caf\xc3\xa9 \xff\x00 12345";
    int32_t ids[256];
    size_t n = 0;
    fy_status_t st = fy_tokenizer_encode(tok, text, sizeof(text) - 1, true, false, ids, 256, &n);
    FZ_CHECK(st == FY_OK || st == FY_ERR_NO_SPACE, "encode: %s", fy_status_str(st));
    for (size_t i = 0; st == FY_OK && i < n; i++)
        FZ_CHECK(ids[i] >= 0 && ids[i] < fy_tokenizer_vocab_size(tok), "id %d out of the vocabulary", ids[i]);
    if (st == FY_OK) fy_tokenizer_decode(tok, ids, n, false, buf, sizeof(buf));

    const fy_chat_msg_t msgs[] = {{"system", "be brief"}, {"user", "hi"}, {"assistant", "hello"}, {"user", "?"}};
    char *out = NULL;
    st = fy_chat_template_apply(fy_model_chat_template(m), msgs, FY_ARRAY_LEN(msgs), true, &out);
    FZ_CHECK(st == FY_OK || st == FY_ERR_INVALID, "chat template: %s", fy_status_str(st));
    fy_free(out);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fz_quiet_log();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const names[] = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"};
    fz_part_t parts[4];
    size_t n = fz_split(data, size, FZ_SEP, parts, 4);
    const char *path;
    if (n == 1) {
        path = fz_write("model.gguf", data, size);
    } else {
        for (size_t i = 0; i < FY_ARRAY_LEN(names); i++) {
            if (i < n)
                fz_write(names[i], parts[i].p, parts[i].n);
            else
                fz_unlink(names[i]);
        }
        path = fz_dir();
    }
    fy_model_t *m = NULL;
    fy_status_t st = fy_model_load(path, &m);
    FZ_CHECK(st == FY_OK || st == FY_ERR_FORMAT || st == FY_ERR_UNSUPPORTED || st == FY_ERR_NOT_FOUND ||
                 st == FY_ERR_IO,
             "fy_model_load returned %s", fy_status_str(st));
    if (st == FY_OK) {
        use_model(m);
        fy_model_destroy(m);
    }
    /* inspection reads on past what loading refuses: it must not crash
     * either, and it describes whatever loads */
    char *report = NULL;
    st = fy_model_inspect(path, &report);
    FZ_CHECK(st == FY_OK || st == FY_ERR_FORMAT || st == FY_ERR_UNSUPPORTED || st == FY_ERR_NOT_FOUND ||
                 st == FY_ERR_IO,
             "fy_model_inspect returned %s", fy_status_str(st));
    FZ_CHECK((st == FY_OK) == (report != NULL), "inspect: a report without success or the reverse");
    fy_free(report);
    return 0;
}

/*
 * fuzz_tokenizer.c - the built-in models' tokenizers and chat prompts on
 * untrusted text (model/tokenizer.c encode/decode, model/prompt.c): the
 * default model (SmolLM2, byte-level BPE) and, when present, Gemma 3
 * (SentencePiece with user-defined tokens: runs of spaces, tabs and
 * newlines, HTML tags, matched in any text).  The models are loaded once;
 * an input is any bytes, the text a user sends, and goes to each.
 *
 * Checks, on every input and model:
 *  - encoding without parse_special gives ids inside the vocabulary and
 *    no special token (user text can never become <|im_end|>,
 *    <start_of_turn> and the like), and decoding them gives the text back
 *    byte for byte, except the bytes the vocabulary has no token for,
 *    which come back as U+FFFD (SmolLM2 lacks 21 bytes that valid UTF-8
 *    never holds; tokenizer.c, spell_bytes()), and SentencePiece's "▁"
 *    typed by the user, which comes back as the space it stands for;
 *  - the streaming detokenizer gives the same bytes as the whole decode;
 *  - encoding with parse_special gives ids inside the vocabulary;
 *  - the text as the user's turn of a chat (fy_prompt_chat, the model's
 *    own template) yields exactly as many special tokens as a one-letter
 *    message does: the template's own markers and nothing from the text.
 * Needs the default model (make model); skipped without it.  Gemma 3 is
 * $FERRY_GEMMA_MODEL or models/gemma-3-270m-q4_k_m.gguf.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/mem.h"
#include "model/model.h"
#include "model/prompt.h"
#include "model/tokenizer.h"
#include "tests/fuzz/util.h"

typedef struct fz_model {
    fy_model_t *model;
    const fy_tokenizer_t *tok;
    int chat_specials; /* in the conversation with the one-letter message */
    bool spelled[256]; /* bytes the vocabulary has a token for */
} fz_model_t;

static fz_model_t g_models[2];
static int g_n_models;

static int count_specials(const fy_tokenizer_t *tok, const int32_t *ids, int32_t n)
{
    int c = 0;
    for (int32_t i = 0; i < n; i++) c += fy_tokenizer_is_special(tok, ids[i]);
    return c;
}

static int chat_specials(const fz_model_t *m, const char *user, fy_status_t *st_p)
{
    const fy_chat_msg_t msgs[] = {{"system", "You are a helpful assistant."}, {"user", user}};
    int32_t *ids = NULL, n = 0;
    *st_p = fy_prompt_chat(m->model, msgs, 2, &ids, &n);
    int c = *st_p == FY_OK ? count_specials(m->tok, ids, n) : -1;
    fy_free(ids);
    return c;
}

static void load(const char *path)
{
    fz_model_t *m = &g_models[g_n_models++];
    if (fy_model_load(path, &m->model) != FY_OK) {
        fprintf(stderr, "fuzz_tokenizer: cannot load %s\n", path);
        exit(1);
    }
    m->tok = fy_model_tokenizer(m->model);
    int missing = 0;
    for (int b = 0; b < 256; b++) {
        char c = (char)b, out[8];
        int32_t ids[8];
        size_t n = 0;
        if (fy_tokenizer_encode(m->tok, &c, 1, false, false, ids, 8, &n) != FY_OK) abort();
        m->spelled[b] = fy_tokenizer_decode(m->tok, ids, n, false, out, sizeof(out)) == 1 && out[0] == c;
        missing += !m->spelled[b];
    }
    if (getenv("FUZZ_LOG")) fprintf(stderr, "fuzz_tokenizer: %s: %d bytes have no token of their own\n", path, missing);
    fy_status_t st;
    m->chat_specials = chat_specials(m, "x", &st);
    if (st != FY_OK || m->chat_specials <= 0) {
        fprintf(stderr, "fuzz_tokenizer: %s: the chat template gives no special tokens\n", path);
        exit(1);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    const char *path = fz_default_model();
    fz_quiet_log();
    load(path);
    const char *gemma = getenv("FERRY_GEMMA_MODEL");
    if (!gemma || !gemma[0]) gemma = "models/gemma-3-270m-q4_k_m.gguf";
    if (access(gemma, R_OK) == 0) load(gemma);
    return 0;
}

static void one_model(const fz_model_t *m, const char *text, size_t size)
{
    const fy_tokenizer_t *tok = m->tok;
    bool spm = fy_tokenizer_kind(tok) == FY_TOKENIZER_SPM;
    size_t cap = size + 8;
    int32_t *ids = malloc(cap * sizeof(*ids));
    char *back = malloc(4 * size + 64), *streamed = malloc(4 * size + 64 + FY_DETOK_MAX_OUT);
    char *want = malloc(3 * size + 1);
    if (!ids || !back || !streamed || !want) abort();
    int32_t vocab = fy_tokenizer_vocab_size(tok);

    size_t n = 0;
    fy_status_t st = fy_tokenizer_encode(tok, text, size, false, false, ids, cap, &n);
    FZ_CHECK(st == FY_OK, "encode: %s (%zu ids)", fy_status_str(st), n);
    for (size_t i = 0; i < n; i++) {
        FZ_CHECK(ids[i] >= 0 && ids[i] < vocab, "id %d outside the vocabulary", ids[i]);
        FZ_CHECK(!fy_tokenizer_is_special(tok, ids[i]), "user text gave special token %d '%s' at %zu", ids[i],
                 fy_tokenizer_piece(tok, ids[i]), i);
    }
    size_t len = fy_tokenizer_decode(tok, ids, n, false, back, 4 * size + 64);
    size_t k = 0;
    for (size_t i = 0; i < size; i++) {
        if (spm && size - i >= 3 && !memcmp(text + i, "\xe2\x96\x81", 3)) { /* "▁" */
            want[k++] = ' ';
            i += 2;
        } else if (m->spelled[(uint8_t)text[i]]) {
            want[k++] = text[i];
        } else {
            memcpy(want + k, "\xef\xbf\xbd", 3), k += 3;
        }
    }
    FZ_CHECK(len == k && !memcmp(back, want, k), "decode(encode(text)) is %zu bytes, not the %zu expected", len, k);

    fy_detok_t d;
    fy_detok_init(&d, tok, false);
    k = 0;
    for (size_t i = 0; i < n; i++) k += fy_detok_push(&d, ids[i], streamed + k, FY_DETOK_MAX_OUT);
    k += fy_detok_flush(&d, streamed + k, FY_DETOK_MAX_OUT);
    FZ_CHECK(k == len && !memcmp(streamed, back, k), "streamed decode (%zu bytes) differs from the whole (%zu)", k,
             len);

    st = fy_tokenizer_encode(tok, text, size, true, true, ids, cap, &n);
    FZ_CHECK(st == FY_OK, "encode with parse_special: %s", fy_status_str(st));
    for (size_t i = 0; i < n; i++) FZ_CHECK(ids[i] >= 0 && ids[i] < vocab, "id %d outside the vocabulary", ids[i]);

    if (!memchr(text, 0, size)) { /* a chat message is a C string */
        char *user = fz_strndup(text, size);
        int c = chat_specials(m, user, &st);
        FZ_CHECK(st == FY_OK || st == FY_ERR_INVALID, "fy_prompt_chat: %s", fy_status_str(st));
        FZ_CHECK(st != FY_OK || c == m->chat_specials, "the chat prompt holds %d special tokens, %d without this text",
                 c, m->chat_specials);
        free(user);
    }
    free(ids);
    free(back);
    free(streamed);
    free(want);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    for (int i = 0; i < g_n_models; i++) one_model(&g_models[i], (const char *)data, size);
    return 0;
}

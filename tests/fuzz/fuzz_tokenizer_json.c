/*
 * fuzz_tokenizer_json.c - tokenizer.json loading (model/tokenizer.c,
 * fy_tokenizer_from_json): an input is a tokenizer.json, optionally
 * followed by FZ_SEP and a tokenizer_config.json.
 *
 * Checks: loading fails with a status a file can cause, or the tokenizer
 * encodes a fixed set of texts (ASCII, UTF-8, invalid bytes, the usual
 * special-token spellings) and the text of each of its own special
 * tokens with ids inside the vocabulary, never a special token from text
 * read without parse_special (the unknown token aside: text a vocabulary
 * cannot spell becomes it), decodes them, and its streaming detokenizer
 * gives the same bytes as the whole-sequence decoder.  Seeds: the tiny
 * models' tokenizer.json (tests/tinymodel.c) and byte-level and
 * SentencePiece-style tokenizers with merges written by mkseeds.c.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "model/tokenizer.h"
#include "tests/fuzz/util.h"

#define MAX_IDS 1024

/* The unknown token as the file names it (model.unk_token), or -1. */
static int32_t unk_of(const fy_tokenizer_t *tok, const uint8_t *json, size_t len)
{
    json_t *root = json_loadb((const char *)json, len, JSON_ALLOW_NUL, NULL);
    json_t *u = json_object_get(json_object_get(root, "model"), "unk_token");
    int32_t id = json_is_string(u) ? fy_tokenizer_find(tok, json_string_value(u)) : -1;
    json_decref(root);
    return id;
}

static void roundtrip(const fy_tokenizer_t *tok, int32_t unk, const char *text, size_t len)
{
    static int32_t ids[MAX_IDS];
    static char whole[8192], streamed[8192];
    int32_t vocab = fy_tokenizer_vocab_size(tok);
    for (int special = 0; special < 2; special++) {
        size_t n = 0;
        fy_status_t st = fy_tokenizer_encode(tok, text, len, special == 0, special, ids, MAX_IDS, &n);
        FZ_CHECK(st == FY_OK || st == FY_ERR_NO_SPACE, "encode: %s", fy_status_str(st));
        if (st != FY_OK) continue;
        for (size_t i = 0; i < n; i++) {
            FZ_CHECK(ids[i] >= 0 && ids[i] < vocab, "id %d outside a vocabulary of %d", ids[i], vocab);
            bool bos = i == 0 && special == 0 && fy_tokenizer_wants_bos(tok) && ids[0] == fy_tokenizer_bos(tok);
            FZ_CHECK(special || bos || ids[i] == unk || !fy_tokenizer_is_special(tok, ids[i]),
                     "text read without parse_special gave special token %d '%s'", ids[i],
                     fy_tokenizer_piece(tok, ids[i]));
        }
        size_t full = fy_tokenizer_decode(tok, ids, n, special, whole, sizeof(whole));
        fy_detok_t d;
        fy_detok_init(&d, tok, special);
        size_t k = 0;
        char out[FY_DETOK_MAX_OUT];
        for (size_t i = 0; i < n; i++) {
            size_t m = fy_detok_push(&d, ids[i], out, sizeof(out));
            FZ_CHECK(m <= sizeof(out), "detok wrote %zu bytes", m);
            if (k + m <= sizeof(streamed)) memcpy(streamed + k, out, m);
            k += m;
        }
        size_t m = fy_detok_flush(&d, out, sizeof(out));
        if (k + m <= sizeof(streamed)) memcpy(streamed + k, out, m);
        k += m;
        /* tokens longer than FY_DETOK_MAX_OUT are cut in the stream (documented) */
        if (full < sizeof(whole) && k <= sizeof(streamed) && k == full)
            FZ_CHECK(!memcmp(whole, streamed, k), "streamed and whole decodes differ");
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fz_quiet_log();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_part_t parts[2];
    size_t n = fz_split(data, size, FZ_SEP, parts, 2);
    const char *json = fz_write("tokenizer.json", parts[0].p, parts[0].n);
    const char *cfg = n > 1 ? fz_write("tokenizer_config.json", parts[1].p, parts[1].n) : NULL;
    fy_tokenizer_t *tok = NULL;
    fy_status_t st = fy_tokenizer_from_json(json, cfg, &tok);
    FZ_CHECK(st == FY_OK || st == FY_ERR_FORMAT || st == FY_ERR_UNSUPPORTED, "fy_tokenizer_from_json returned %s",
             fy_status_str(st));
    if (st != FY_OK) return 0;
    int32_t vocab = fy_tokenizer_vocab_size(tok);
    FZ_CHECK(vocab >= 1, "empty vocabulary");
    int32_t unk = unk_of(tok, parts[0].p, parts[0].n);
    static const char *const texts[] = {
        "Hello, world!",
        " leading space",
        "x",
        "caf\xc3\xa9 \xe2\x96\x81 \xf0\x9f\x98\x80",
        "\xff\xfe\x80 \xc3",
        "<|im_start|>user\nhi<|im_end|>",
        "<s></s><unk><|endoftext|>",
        "1234567 89",
        "\t\n  \r\n",
    };
    for (size_t i = 0; i < FY_ARRAY_LEN(texts); i++) roundtrip(tok, unk, texts[i], strlen(texts[i]));
    int specials = 0;
    for (int32_t id = 0; id < vocab && specials < 32; id++) {
        if (!fy_tokenizer_is_special(tok, id)) continue;
        specials++;
        const char *p = fy_tokenizer_piece(tok, id);
        roundtrip(tok, unk, p, strlen(p));
    }
    fy_tokenizer_destroy(tok);
    return 0;
}

/*
 * test_tokenizer.c - the tokenizer against tiny vocabularies built here
 * (GGUF through gguf_writer, tokenizer.json as literal text) with merges
 * worked out by hand, and against the default model with ids taken from
 * llama.cpp's llama-tokenize.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "common/clock.h"
#include "tests/gguf_writer.h"
#include "common/mem.h"
#include "tests/testutil.h"
#include "model/model.h"
#include "model/prompt.h"
#include "model/tokenizer.h"

#define SEED 0x7e57c0de
#define SP "\xe2\x96\x81" /* U+2581, "▁" */

/* ---- helpers ------------------------------------------------------------------------ */

/* GPT-2's bytes_to_unicode, written again here as a second opinion. */
static void gpt2_char(int b, char out[3])
{
    int cp = b;
    if (!((b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff))) {
        int n = 0;
        for (int c = 0; c < b; c++)
            if (!((c >= '!' && c <= '~') || (c >= 0xa1 && c <= 0xac) || (c >= 0xae && c <= 0xff))) n++;
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = '\0';
    } else {
        out[0] = (char)(0xc0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3f));
        out[2] = '\0';
    }
}

/* Writes w to a file, opens it and makes a tokenizer; frees w. */
static fy_status_t tok_from_gw(fy_gw_t *w, fy_tokenizer_t **tok_p)
{
    const char *path = fy_test_path("tok.gguf");
    assert_true(fy_gw_write(w, path));
    fy_gw_free(w);
    fy_gguf_t *gguf;
    assert_int_equal(fy_gguf_open(path, &gguf), FY_OK);
    fy_status_t st = fy_tokenizer_from_gguf(gguf, tok_p);
    fy_gguf_close(gguf); /* the tokenizer keeps nothing of the file */
    return st;
}

static fy_status_t tok_from_json_text(const char *json, const char *config, fy_tokenizer_t **tok_p)
{
    const char *path = fy_test_path("tokenizer.json");
    const char *config_path = config ? fy_test_path("tokenizer_config.json") : NULL;
    assert_true(fy_test_write_file(path, json, strlen(json)));
    if (config) assert_true(fy_test_write_file(config_path, config, strlen(config)));
    return fy_tokenizer_from_json(path, config_path, tok_p);
}

/* Encodes text (without BOS) and checks the ids. */
static void expect_ids(const fy_tokenizer_t *tok, const char *text, bool parse_special, const int32_t *want,
                       size_t n_want)
{
    int32_t got[256];
    size_t n = 0;
    fy_status_t st = fy_tokenizer_encode(tok, text, strlen(text), false, parse_special, got, FY_ARRAY_LEN(got), &n);
    if (st != FY_OK || n != n_want || memcmp(got, want, n * sizeof(*got)) != 0) {
        char buf[1024];
        size_t at = (size_t)snprintf(buf, sizeof(buf), "'%s': status %d, got", text, (int)st);
        for (size_t i = 0; i < n && i < FY_ARRAY_LEN(got) && at < 900; i++)
            at += (size_t)snprintf(buf + at, sizeof(buf) - at, " %d", got[i]);
        at += (size_t)snprintf(buf + at, sizeof(buf) - at, ", want");
        for (size_t i = 0; i < n_want && at < 1000; i++)
            at += (size_t)snprintf(buf + at, sizeof(buf) - at, " %d", want[i]);
        fail_msg("%s", buf);
    }
}

#define EXPECT(tok, text, special, ...)                                                                                \
    do {                                                                                                               \
        const int32_t want_[] = {__VA_ARGS__};                                                                         \
        expect_ids(tok, text, special, want_, FY_ARRAY_LEN(want_));                                                    \
    } while (0)

/* Streams ids through a detokenizer and returns the concatenated output. */
static size_t stream_decode(const fy_tokenizer_t *tok, const int32_t *ids, size_t n, bool render_special, char *out,
                            size_t cap)
{
    fy_detok_t d;
    fy_detok_init(&d, tok, render_special);
    size_t len = 0;
    char piece[FY_DETOK_MAX_OUT];
    for (size_t i = 0; i < n; i++) {
        size_t k = fy_detok_push(&d, ids[i], piece, sizeof(piece));
        assert_true(len + k <= cap);
        memcpy(out + len, piece, k);
        len += k;
    }
    size_t k = fy_detok_flush(&d, piece, sizeof(piece));
    assert_true(len + k <= cap);
    memcpy(out + len, piece, k);
    return len + k;
}

/* encode -> decode gives the text back, and streaming gives the same bytes. */
static void check_round_trip(const fy_tokenizer_t *tok, const char *text, size_t len)
{
    size_t cap = 4 * len + 16, n = 0;
    int32_t *ids = fy_calloc(cap, sizeof(*ids));
    char *whole = fy_malloc(4 * len + 64), *streamed = fy_malloc(4 * len + 64);
    assert_non_null(ids);
    assert_non_null(whole);
    assert_non_null(streamed);
    assert_int_equal(fy_tokenizer_encode(tok, text, len, false, false, ids, cap, &n), FY_OK);
    size_t whole_len = fy_tokenizer_decode(tok, ids, n, false, whole, 4 * len + 64);
    if (whole_len != len || memcmp(whole, text, len) != 0)
        fail_msg("round trip of %zu bytes gave %zu bytes: '%.*s'", len, whole_len, (int)whole_len, whole);
    size_t streamed_len = stream_decode(tok, ids, n, false, streamed, 4 * len + 64);
    assert_int_equal(streamed_len, whole_len);
    assert_memory_equal(streamed, whole, whole_len);
    fy_free(streamed);
    fy_free(whole);
    fy_free(ids);
}

/* Texts with their lengths, so that one may hold a NUL. */
#define TEXT(s)                                                                                                        \
    {                                                                                                                  \
        s, sizeof(s) - 1                                                                                               \
    }
static const struct {
    const char *s;
    size_t len;
} k_round_trip_texts[] = {
    TEXT("hello world"),
    TEXT("  two leading spaces, trailing  "),
    TEXT("tabs\tand\nnew\r\nlines\n\n"),
    TEXT("digits 1234567890 and 3.14159"),
    TEXT("emoji \xf0\x9f\xa6\x99 \xf0\x9f\x98\x80 \xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd"), /* 🦙 😀 👍🏽 */
    TEXT("CJK \xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c"),         /* 你好，世界 */
    TEXT("combining e\xcc\x81 a\xcc\x8a n\xcc\x83"),                                  /* e + U+0301 ... */
    TEXT("invalid \xff\xfe bytes"),
    TEXT("lone continuation \x80 byte"),
    TEXT("truncated four-byte \xf0\x9f\x98 sequence"),
    TEXT("truncated at the end \xe2\x82"),
    TEXT("overlong \xc0\xaf and surrogate \xed\xa0\x80"),
    TEXT("don't we'll THEY'RE"),
    TEXT("nul \0 inside"),
};

static void round_trip_all(const fy_tokenizer_t *tok, bool skip_vocab_gaps)
{
    for (size_t i = 0; i < FY_ARRAY_LEN(k_round_trip_texts); i++) {
        const char *t = k_round_trip_texts[i].s;
        size_t len = k_round_trip_texts[i].len;
        /* SmolLM2 has no tokens for 21 rare bytes (C0, C1, F5-FF among
         * them): those come back as U+FFFD, tested separately */
        if (skip_vocab_gaps && (memchr(t, 0xff, len) || memchr(t, 0xc0, len))) continue;
        check_round_trip(tok, t, len);
    }
}

/* ---- tiny byte-level GGUF -------------------------------------------------------- */

/*
 * Ids 0-255: the GPT-2 character of each byte, in byte order, so a byte's
 * token is its value.  Then merges, ranked in this order:
 */
static const char *const k_bl_merges[] = {
    "h e",     /* 256 he     */
    "l l",     /* 257 ll     */
    "he ll",   /* 258 hell   */
    "hell o",  /* 259 hello  */
    "Ġ w",     /* 260 Ġw     */
    "o r",     /* 261 or     */
    "Ġw or",   /* 262 Ġwor   */
    "l d",     /* 263 ld     */
    "Ġwor ld", /* 264 Ġworld */
    "1 2",     /* 265 12     */
    "12 3",    /* 266 123    */
    "4 5",     /* 267 45     */
    "123 45",  /* 268 12345  */
    "e l",     /* 269 el: ranked after "l l", so "hell" is he+ll */
};
enum {
    BL_HE = 256,
    BL_LL,
    BL_HELL,
    BL_HELLO,
    BL_GW,
    BL_OR,
    BL_GWOR,
    BL_LD,
    BL_GWORLD,
    BL_12,
    BL_123,
    BL_45,
    BL_12345,
    BL_EL,
    BL_IM_START,
    BL_IM_END,
    BL_EOT,
    BL_TOOL,
    BL_TOOL_CALL,
    BL_N_VOCAB
};

typedef struct tiny_opts {
    const char *model; /* tokenizer.ggml.model, NULL to leave it out */
    const char *pre;   /* tokenizer.ggml.pre, NULL to leave it out */
    bool omit_tokens, omit_merges, omit_scores;
    size_t n_types;          /* entries of token_type; 0: one per token */
    int32_t first_type;      /* type of token 0 when nonzero */
    const char *extra_merge; /* appended to the merges */
    uint32_t bos;            /* bos_token_id; 0: left out */
    bool add_bos;
    bool junction; /* SPM: add "o▁w", a token across a word start */
    bool user;     /* SPM: add the user-defined tokens "  " and "<b>" */
} tiny_opts_t;

static fy_gw_t *tiny_bytelevel(const tiny_opts_t *o)
{
    static char chars[256][3];
    static char merged[FY_ARRAY_LEN(k_bl_merges)][16];
    const char *tokens[BL_N_VOCAB];
    int32_t types[BL_N_VOCAB];
    for (int b = 0; b < 256; b++) {
        gpt2_char(b, chars[b]);
        tokens[b] = chars[b];
        types[b] = 1;
    }
    for (size_t i = 0; i < FY_ARRAY_LEN(k_bl_merges); i++) {
        const char *m = k_bl_merges[i], *sp = strchr(m, ' ');
        snprintf(merged[i], sizeof(merged[i]), "%.*s%s", (int)(sp - m), m, sp + 1);
        tokens[256 + i] = merged[i];
        types[256 + i] = 1;
    }
    tokens[BL_IM_START] = "<|im_start|>";
    tokens[BL_IM_END] = "<|im_end|>";
    tokens[BL_EOT] = "<|endoftext|>";
    tokens[BL_TOOL] = "<|tool|>";
    tokens[BL_TOOL_CALL] = "<|tool|>call";
    types[BL_IM_START] = types[BL_IM_END] = types[BL_EOT] = 3;
    types[BL_TOOL] = types[BL_TOOL_CALL] = 4; /* user-defined */
    if (o->first_type) types[0] = o->first_type;

    const char *merges[FY_ARRAY_LEN(k_bl_merges) + 1];
    size_t n_merges = FY_ARRAY_LEN(k_bl_merges);
    memcpy(merges, k_bl_merges, sizeof(k_bl_merges));
    if (o->extra_merge) merges[n_merges++] = o->extra_merge;

    fy_gw_t *w = fy_gw_new();
    if (o->model) fy_gw_str(w, "tokenizer.ggml.model", o->model);
    if (o->pre) fy_gw_str(w, "tokenizer.ggml.pre", o->pre);
    if (!o->omit_tokens) fy_gw_str_arr(w, "tokenizer.ggml.tokens", tokens, BL_N_VOCAB);
    if (!o->omit_merges) fy_gw_str_arr(w, "tokenizer.ggml.merges", merges, n_merges);
    fy_gw_i32_arr(w, "tokenizer.ggml.token_type", types, o->n_types ? o->n_types : BL_N_VOCAB);
    fy_gw_u32(w, "tokenizer.ggml.bos_token_id", o->bos ? o->bos : BL_EOT);
    fy_gw_u32(w, "tokenizer.ggml.eos_token_id", BL_IM_END);
    fy_gw_bool(w, "tokenizer.ggml.add_bos_token", o->add_bos);
    return w;
}

static const tiny_opts_t k_bl_default = {.model = "gpt2", .pre = "smollm"};

static fy_tokenizer_t *tiny_bytelevel_tok(const char *pre)
{
    tiny_opts_t o = k_bl_default;
    o.pre = pre;
    fy_tokenizer_t *tok = NULL;
    assert_int_equal(tok_from_gw(tiny_bytelevel(&o), &tok), FY_OK);
    return tok;
}

static void test_bytelevel_ids(void **state)
{
    (void)state;
    fy_tokenizer_t *tok = tiny_bytelevel_tok("smollm");
    assert_int_equal(fy_tokenizer_kind(tok), FY_TOKENIZER_BPE_BYTE);
    assert_int_equal(fy_tokenizer_vocab_size(tok), BL_N_VOCAB);
    EXPECT(tok, "hello world", false, BL_HELLO, BL_GWORLD);
    EXPECT(tok, "hell", false, BL_HELL); /* he (rank 0) before ll (1), el (13) never */
    EXPECT(tok, "helo", false, BL_HE, 'l', 'o');
    EXPECT(tok, "lll", false, BL_LL, 'l'); /* equal ranks: the leftmost pair first */
    EXPECT(tok, "hello\nworld", false, BL_HELLO, '\n', 'w', BL_OR, BL_LD);
    EXPECT(tok, " world", false, BL_GWORLD);
    /* "\xc3\xa9" is two byte tokens: bytes map to ids one to one */
    EXPECT(tok, "\xc3\xa9", false, 0xc3, 0xa9);
    int32_t id = -7;
    size_t n = 9;
    assert_int_equal(fy_tokenizer_encode(tok, "", 0, false, false, &id, 1, &n), FY_OK);
    assert_int_equal(n, 0);
    assert_int_equal(id, -7);
    fy_tokenizer_destroy(tok);
}

/* tokenizer.ggml.pre picks the regexes: digits are where they differ. */
static void test_bytelevel_pre(void **state)
{
    (void)state;
    static const struct {
        const char *pre;
        int32_t ids[5];
        size_t n;
    } cases[] = {
        {"gpt-2", {BL_12345}, 1}, /* \p{N}+ keeps the run whole */
        {"default", {BL_12345}, 1},
        {"smollm", {'1', '2', '3', '4', '5'}, 5}, /* \p{N} first: one digit a piece */
        {"starcoder", {'1', '2', '3', '4', '5'}, 5},
        {"llama-bpe", {BL_123, BL_45}, 2}, /* \p{N}{1,3} */
        {"qwen2", {'1', '2', '3', '4', '5'}, 5},
    };
    for (size_t i = 0; i < FY_ARRAY_LEN(cases); i++) {
        fy_tokenizer_t *tok = tiny_bytelevel_tok(cases[i].pre);
        expect_ids(tok, "12345", false, cases[i].ids, cases[i].n);
        fy_tokenizer_destroy(tok);
    }

    /* unknown: the gpt-2 regex, with a warning */
    fy_test_log_begin();
    fy_tokenizer_t *tok = tiny_bytelevel_tok("no-such-pre");
    fy_test_log_end();
    assert_true(fy_test_log_has("unknown tokenizer.ggml.pre 'no-such-pre'", "gpt-2", NULL));
    EXPECT(tok, "12345", false, BL_12345);
    fy_tokenizer_destroy(tok);

    /* the gpt-2 regex's \s+(?!\S): the last space goes with the word */
    tok = tiny_bytelevel_tok("gpt-2");
    EXPECT(tok, "  world", false, ' ', BL_GWORLD);
    fy_tokenizer_destroy(tok);
}

static void test_bytelevel_special(void **state)
{
    (void)state;
    fy_tokenizer_t *tok = tiny_bytelevel_tok("smollm");
    const char *text = "<|im_start|>hello<|im_end|>";
    EXPECT(tok, text, true, BL_IM_START, BL_HELLO, BL_IM_END);
    /* without parse_special the same text is plain bytes */
    int32_t ids[64];
    size_t n;
    assert_int_equal(fy_tokenizer_encode(tok, text, strlen(text), false, false, ids, 64, &n), FY_OK);
    assert_int_equal(n, strlen("<|im_start|>") + 1 + strlen("<|im_end|>"));
    for (size_t i = 0; i < n; i++) assert_false(fy_tokenizer_is_special(tok, ids[i]));
    char out[64];
    assert_int_equal(fy_tokenizer_decode(tok, ids, n, false, out, sizeof(out)), strlen(text));
    assert_string_equal(out, text);
    /* user-defined tokens with or without parse_special; the longest match wins */
    for (int parse_special = 0; parse_special < 2; parse_special++) {
        EXPECT(tok, "a<|tool|>", parse_special, 'a', BL_TOOL);
        EXPECT(tok, "<|tool|>call", parse_special, BL_TOOL_CALL);
        EXPECT(tok, "<|tool|>cal", parse_special, BL_TOOL, 'c', 'a', 'l');
        /* "<|tool|>call" sorts before the text, shares "<|tool|>ca": the match is shorter */
        EXPECT(tok, "<|tool|>cax", parse_special, BL_TOOL, 'c', 'a', 'x');
        EXPECT(tok, "<|tool|<|tool|>", parse_special, '<', '|', 't', 'o', 'o', 'l', '|', BL_TOOL);
    }
    EXPECT(tok, "<|im_end|x<|endoftext|>", true, '<', '|', 'i', 'm', '_', 'e', 'n', 'd', '|', 'x', BL_EOT);
    EXPECT(tok, "<|im_start|><|im_start|>", true, BL_IM_START, BL_IM_START);
    EXPECT(tok, "<|im_start", true, '<', '|', 'i', 'm', '_', 's', 't', 'a', 'r', 't');
    fy_tokenizer_destroy(tok);
}

static void test_bytelevel_queries(void **state)
{
    (void)state;
    tiny_opts_t o = k_bl_default;
    o.add_bos = true;
    fy_tokenizer_t *tok = NULL;
    assert_int_equal(tok_from_gw(tiny_bytelevel(&o), &tok), FY_OK);
    assert_int_equal(fy_tokenizer_bos(tok), BL_EOT);
    assert_int_equal(fy_tokenizer_eos(tok), BL_IM_END);
    assert_true(fy_tokenizer_wants_bos(tok));
    assert_true(fy_tokenizer_is_eog(tok, BL_IM_END));
    assert_true(fy_tokenizer_is_eog(tok, BL_EOT));
    assert_false(fy_tokenizer_is_eog(tok, BL_IM_START));
    assert_false(fy_tokenizer_is_eog(tok, BL_HELLO));
    assert_false(fy_tokenizer_is_eog(tok, -1));
    assert_false(fy_tokenizer_is_eog(tok, BL_N_VOCAB));
    assert_true(fy_tokenizer_is_special(tok, BL_IM_START));
    assert_false(fy_tokenizer_is_special(tok, BL_TOOL)); /* user-defined: text */
    assert_false(fy_tokenizer_is_special(tok, BL_HELLO));
    assert_int_equal(fy_tokenizer_find(tok, "Ġworld"), BL_GWORLD);
    assert_int_equal(fy_tokenizer_find(tok, "<|im_end|>"), BL_IM_END);
    assert_int_equal(fy_tokenizer_find(tok, "nope"), -1);
    assert_string_equal(fy_tokenizer_piece(tok, BL_GWORLD), "Ġworld");
    assert_null(fy_tokenizer_piece(tok, BL_N_VOCAB));

    const char *b;
    size_t len;
    fy_tokenizer_token_bytes(tok, BL_GWORLD, false, &b, &len);
    assert_int_equal(len, 6);
    assert_memory_equal(b, " world", 6);
    fy_tokenizer_token_bytes(tok, BL_IM_END, false, &b, &len);
    assert_int_equal(len, 0);
    fy_tokenizer_token_bytes(tok, BL_IM_END, true, &b, &len);
    assert_int_equal(len, strlen("<|im_end|>"));
    assert_memory_equal(b, "<|im_end|>", len);
    fy_tokenizer_token_bytes(tok, -5, true, &b, &len);
    assert_int_equal(len, 0);

    /* add_bos only adds what the model wants */
    int32_t ids[8];
    size_t n;
    assert_int_equal(fy_tokenizer_encode(tok, "hello", 5, true, false, ids, 8, &n), FY_OK);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], BL_EOT);
    assert_int_equal(ids[1], BL_HELLO);
    fy_tokenizer_destroy(tok);

    tok = tiny_bytelevel_tok("smollm"); /* add_bos_token false */
    assert_false(fy_tokenizer_wants_bos(tok));
    assert_int_equal(fy_tokenizer_encode(tok, "hello", 5, true, false, ids, 8, &n), FY_OK);
    assert_int_equal(n, 1);
    fy_tokenizer_destroy(tok);
}

static void test_encode_no_space(void **state)
{
    (void)state;
    fy_tokenizer_t *tok = tiny_bytelevel_tok("smollm");
    int32_t ids[4] = {-7, -7, -7, -7};
    size_t n = 0;
    const char *text = "hello world world";
    assert_int_equal(fy_tokenizer_encode(tok, text, strlen(text), false, false, ids, 2, &n), FY_ERR_NO_SPACE);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], BL_HELLO);
    assert_int_equal(ids[1], BL_GWORLD);
    assert_int_equal(ids[2], -7); /* nothing written past max_tokens */
    n = 0;
    assert_int_equal(fy_tokenizer_encode(tok, text, strlen(text), false, false, NULL, 0, &n), FY_ERR_NO_SPACE);
    assert_int_equal(n, 3);
    assert_int_equal(fy_tokenizer_encode(tok, "", 0, false, false, NULL, 0, &n), FY_OK);
    assert_int_equal(n, 0);
    assert_int_equal(fy_tokenizer_encode(tok, NULL, 3, false, false, ids, 4, &n), FY_ERR_INVALID);

    /* decode truncates to cap - 1 and still reports the full length */
    const int32_t hw[] = {BL_HELLO, BL_GWORLD};
    char out[6];
    assert_int_equal(fy_tokenizer_decode(tok, hw, 2, false, out, sizeof(out)), 11);
    assert_string_equal(out, "hello");
    fy_tokenizer_destroy(tok);
}

static void test_bytelevel_round_trip(void **state)
{
    (void)state;
    fy_tokenizer_t *tok = tiny_bytelevel_tok("smollm");
    round_trip_all(tok, false);
    /* random bytes, all 256 values */
    uint64_t rng = SEED;
    char buf[2048];
    for (int round = 0; round < 50; round++) {
        size_t len = 1 + fy_test_rand_u64(&rng) % sizeof(buf);
        for (size_t i = 0; i < len; i++) buf[i] = (char)fy_test_rand_u64(&rng);
        check_round_trip(tok, buf, len);
    }
    fy_tokenizer_destroy(tok);
}

/* ---- tiny SPM GGUF --------------------------------------------------------------- */

/* <unk>, <s>, </s>, 256 byte tokens, then these, merged by score (highest
 * first): the order worked out for "hello world" is ll, or, he, hell,
 * hello, ▁hello, ld, ▁w, ▁wor, ▁world. */
static const struct {
    const char *text;
    float score;
} k_spm_vocab[] = {
    {SP, -1},         {"h", -100},   {"e", -100},         {"l", -100},       {"o", -100},  {"w", -100},
    {"r", -100},      {"d", -100},   {"he", -10},         {"ll", -5},        {"hell", -8}, {"hello", -9},
    {SP "hello", -3}, {SP "w", -20}, {"or", -6},          {SP "wor", -7},    {"ld", -11},  {SP "world", -4},
    {"el", -30},      {SP SP, -50},  {"<|im_start|>", 0}, {"<|im_end|>", 0},
};
enum {
    SPM_UNK,
    SPM_BOS,
    SPM_EOS,
    SPM_BYTE0,
    SPM_SP = SPM_BYTE0 + 256,
    SPM_H,
    SPM_E,
    SPM_L,
    SPM_O,
    SPM_W,
    SPM_R,
    SPM_D,
    SPM_HE,
    SPM_LL,
    SPM_HELL,
    SPM_HELLO,
    SPM_SP_HELLO,
    SPM_SP_W,
    SPM_OR,
    SPM_SP_WOR,
    SPM_LD,
    SPM_SP_WORLD,
    SPM_EL,
    SPM_SP_SP,
    SPM_IM_START,
    SPM_IM_END,
    SPM_N_VOCAB
};

static fy_gw_t *tiny_spm(const tiny_opts_t *o)
{
    static char byte_names[256][8];
    const char *tokens[SPM_N_VOCAB + 3];
    int32_t types[SPM_N_VOCAB + 3];
    float scores[SPM_N_VOCAB + 3];
    tokens[SPM_UNK] = "<unk>";
    tokens[SPM_BOS] = "<s>";
    tokens[SPM_EOS] = "</s>";
    types[SPM_UNK] = 2;
    types[SPM_BOS] = types[SPM_EOS] = 3;
    scores[SPM_UNK] = scores[SPM_BOS] = scores[SPM_EOS] = 0;
    for (int b = 0; b < 256; b++) {
        snprintf(byte_names[b], sizeof(byte_names[b]), "<0x%02X>", b);
        tokens[SPM_BYTE0 + b] = byte_names[b];
        types[SPM_BYTE0 + b] = 6;
        scores[SPM_BYTE0 + b] = 0;
    }
    for (size_t i = 0; i < FY_ARRAY_LEN(k_spm_vocab); i++) {
        tokens[SPM_SP + i] = k_spm_vocab[i].text;
        types[SPM_SP + i] = 1;
        scores[SPM_SP + i] = k_spm_vocab[i].score;
    }
    types[SPM_IM_START] = types[SPM_IM_END] = 3;
    size_t n = SPM_N_VOCAB;
    if (o->junction) {
        tokens[n] = "o" SP "w";
        types[n] = 1;
        scores[n++] = -2;
    }
    if (o->user) { /* as Gemma 3's: raw text, score 0 */
        static const char *const k_user[] = {"  ", "<b>"};
        for (size_t i = 0; i < FY_ARRAY_LEN(k_user); i++) {
            tokens[n] = k_user[i];
            types[n] = 4;
            scores[n++] = 0;
        }
    }

    fy_gw_t *w = fy_gw_new();
    if (o->model) fy_gw_str(w, "tokenizer.ggml.model", o->model);
    if (!o->omit_tokens) fy_gw_str_arr(w, "tokenizer.ggml.tokens", tokens, n);
    if (!o->omit_scores) fy_gw_f32_arr(w, "tokenizer.ggml.scores", scores, n);
    fy_gw_i32_arr(w, "tokenizer.ggml.token_type", types, o->n_types ? o->n_types : n);
    fy_gw_u32(w, "tokenizer.ggml.bos_token_id", SPM_BOS);
    fy_gw_u32(w, "tokenizer.ggml.eos_token_id", SPM_EOS);
    fy_gw_u32(w, "tokenizer.ggml.unknown_token_id", SPM_UNK);
    return w;
}

static const tiny_opts_t k_spm_default = {.model = "llama"};

static fy_tokenizer_t *tiny_spm_tok(void)
{
    fy_tokenizer_t *tok = NULL;
    assert_int_equal(tok_from_gw(tiny_spm(&k_spm_default), &tok), FY_OK);
    return tok;
}

static void test_spm_ids(void **state)
{
    (void)state;
    fy_tokenizer_t *tok = tiny_spm_tok();
    assert_int_equal(fy_tokenizer_kind(tok), FY_TOKENIZER_SPM);
    assert_true(fy_tokenizer_wants_bos(tok)); /* the default of "llama" models */
    EXPECT(tok, "hello world", false, SPM_SP_HELLO, SPM_SP_WORLD);
    EXPECT(tok, "hell", false, SPM_SP, SPM_HELL);
    EXPECT(tok, "lll", false, SPM_SP, SPM_LL, SPM_L); /* equal scores: leftmost first */
    EXPECT(tok, " hello", false, SPM_SP, SPM_SP_HELLO);
    /* not in the vocabulary: byte tokens */
    EXPECT(tok, "h\xc3\xa9", false, SPM_SP, SPM_H, SPM_BYTE0 + 0xc3, SPM_BYTE0 + 0xa9);
    EXPECT(tok, "\xff", false, SPM_SP, SPM_BYTE0 + 0xff);
    /* a text that spells a control or byte token is still text */
    EXPECT(tok, "<0x41>", false, SPM_SP, SPM_BYTE0 + '<', SPM_BYTE0 + '0', SPM_BYTE0 + 'x', SPM_BYTE0 + '4',
           SPM_BYTE0 + '1', SPM_BYTE0 + '>');

    int32_t ids[8];
    size_t n;
    assert_int_equal(fy_tokenizer_encode(tok, "hello", 5, true, false, ids, 8, &n), FY_OK);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], SPM_BOS);
    assert_int_equal(ids[1], SPM_SP_HELLO);

    /* decoding drops the space the encoder put in front, once */
    const int32_t hw[] = {SPM_BOS, SPM_SP_HELLO, SPM_SP_WORLD};
    char out[64];
    assert_int_equal(fy_tokenizer_decode(tok, hw, 3, false, out, sizeof(out)), 11);
    assert_string_equal(out, "hello world");
    assert_int_equal(fy_tokenizer_decode(tok, hw, 3, true, out, sizeof(out)), 15);
    assert_string_equal(out, "<s> hello world");
    fy_tokenizer_destroy(tok);
}

/* Merging word by word is a shortcut taken only when no token crosses a
 * word start; here one does, and the whole text is merged as one. */
static void test_spm_junction(void **state)
{
    (void)state;
    fy_tokenizer_t *tok = tiny_spm_tok();
    EXPECT(tok, "o world", false, SPM_SP, SPM_O, SPM_SP_WORLD);
    fy_tokenizer_destroy(tok);

    tiny_opts_t o = k_spm_default;
    o.junction = true;
    assert_int_equal(tok_from_gw(tiny_spm(&o), &tok), FY_OK);
    EXPECT(tok, "o world", false, SPM_SP, SPM_N_VOCAB, SPM_OR, SPM_LD); /* o▁w (-2) beats ▁wor (-7) */
    EXPECT(tok, "hello world", false, SPM_SP_HELLO, SPM_SP_WORLD);
    check_round_trip(tok, "o world, so wow", 15);
    fy_tokenizer_destroy(tok);
}

static void test_spm_special(void **state)
{
    (void)state;
    fy_tokenizer_t *tok = tiny_spm_tok();
    /* as llama.cpp: each text run after a special token gets its own "▁" */
    EXPECT(tok, "<|im_start|>hello<|im_end|>", true, SPM_IM_START, SPM_SP_HELLO, SPM_IM_END);
    EXPECT(tok, "<s>hello", true, SPM_BOS, SPM_SP_HELLO);
    int32_t ids[64];
    size_t n;
    assert_int_equal(fy_tokenizer_encode(tok, "<s>", 3, false, false, ids, 64, &n), FY_OK);
    assert_int_equal(n, 4); /* ▁ < s > */
    for (size_t i = 0; i < n; i++) assert_int_not_equal(ids[i], SPM_BOS);
    assert_true(fy_tokenizer_is_eog(tok, SPM_EOS));
    assert_true(fy_tokenizer_is_eog(tok, SPM_IM_END));
    assert_false(fy_tokenizer_is_eog(tok, SPM_BOS));
    fy_tokenizer_destroy(tok);
}

/*
 * User-defined tokens are text: matched whole in any text (parse_special
 * or not), before the model runs, and decoded as written even when
 * specials are not rendered.  Before: "  " was two "▁" and "<b>" three
 * characters, and a "  " token decoded to nothing.
 */
static void test_spm_user_defined(void **state)
{
    (void)state;
    enum { USER_2SP = SPM_N_VOCAB, USER_B };
    fy_tokenizer_t *tok = NULL;
    assert_int_equal(tok_from_gw(tiny_spm(&(tiny_opts_t){.model = "llama", .user = true}), &tok), FY_OK);
    for (int parse_special = 0; parse_special < 2; parse_special++) {
        /* each run of text after a matched token gets its own "▁", as in llama.cpp */
        EXPECT(tok, "hello  world", parse_special, SPM_SP_HELLO, USER_2SP, SPM_SP_WORLD);
        EXPECT(tok, "<b>hello", parse_special, USER_B, SPM_SP_HELLO);
        EXPECT(tok, "   ", parse_special, USER_2SP, SPM_SP_SP); /* longest first, then "▁" + "▁" */
    }
    assert_false(fy_tokenizer_is_special(tok, USER_2SP));
    assert_false(fy_tokenizer_is_special(tok, USER_B));
    assert_true(fy_tokenizer_is_special(tok, SPM_IM_START));
    /* control tokens still only with parse_special */
    EXPECT(tok, "<|im_start|>", true, SPM_IM_START);
    int32_t ids[64];
    size_t n;
    assert_int_equal(fy_tokenizer_encode(tok, "<|im_start|>", 12, false, false, ids, 64, &n), FY_OK);
    for (size_t i = 0; i < n; i++) assert_int_not_equal(ids[i], SPM_IM_START);

    const int32_t text[] = {SPM_SP_HELLO, USER_2SP, USER_B, SPM_SP_WORLD};
    char out[64];
    size_t len = fy_tokenizer_decode(tok, text, FY_ARRAY_LEN(text), false, out, sizeof(out));
    assert_string_equal(out, "hello  <b> world");
    assert_int_equal(stream_decode(tok, text, FY_ARRAY_LEN(text), false, out, sizeof(out)), len);
    assert_memory_equal(out, "hello  <b> world", len);
    fy_tokenizer_destroy(tok);
}

static void test_spm_round_trip(void **state)
{
    (void)state;
    fy_tokenizer_t *tok = tiny_spm_tok();
    round_trip_all(tok, false);
    uint64_t rng = SEED;
    char buf[1024];
    for (int round = 0; round < 50; round++) {
        size_t len = 1 + fy_test_rand_u64(&rng) % sizeof(buf);
        for (size_t i = 0; i < len; i++) {
            /* SPM turns a typed "▁" into a space: keep it out */
            buf[i] = (char)fy_test_rand_u64(&rng);
            if (i >= 2 && memcmp(buf + i - 2, SP, 3) == 0) buf[i] = 'x';
        }
        check_round_trip(tok, buf, len);
    }
    fy_tokenizer_destroy(tok);
}

/* ---- streaming ------------------------------------------------------------------- */

static size_t push(fy_detok_t *d, int32_t id, char *out) { return fy_detok_push(d, id, out, FY_DETOK_MAX_OUT); }

static void test_detok_hold_back(void **state)
{
    (void)state;
    char out[FY_DETOK_MAX_OUT];
    fy_detok_t d;

    /* byte-level: "€" (e2 82 ac) as three byte tokens */
    fy_tokenizer_t *tok = tiny_bytelevel_tok("smollm");
    fy_detok_init(&d, tok, false);
    assert_int_equal(push(&d, 0xe2, out), 0);
    assert_int_equal(push(&d, 0x82, out), 0);
    assert_int_equal(push(&d, 0xac, out), 3);
    assert_memory_equal(out, "\xe2\x82\xac", 3);
    /* a byte that can never start valid UTF-8 goes straight out */
    assert_int_equal(push(&d, 0xff, out), 1);
    assert_int_equal(push(&d, 0x80, out), 1);
    /* a held lead byte that the next token cannot continue is let go with it */
    assert_int_equal(push(&d, 0xe2, out), 0);
    assert_int_equal(push(&d, BL_HELLO, out), 6);
    assert_memory_equal(out, "\xe2hello", 6);
    /* e0 80 can never be valid (overlong): not held */
    assert_int_equal(push(&d, 0xe0, out), 0);
    assert_int_equal(push(&d, 0x80, out), 2);
    /* a truncated sequence at the end comes out at flush */
    assert_int_equal(push(&d, 0xf0, out), 0);
    assert_int_equal(push(&d, 0x9f, out), 0);
    assert_int_equal(push(&d, 0x98, out), 0);
    assert_int_equal(fy_detok_flush(&d, out, sizeof(out)), 3);
    assert_memory_equal(out, "\xf0\x9f\x98", 3);
    assert_int_equal(fy_detok_flush(&d, out, sizeof(out)), 0);
    /* specials: nothing unless asked for */
    assert_int_equal(push(&d, BL_IM_END, out), 0);
    fy_detok_init(&d, tok, true);
    assert_int_equal(push(&d, BL_IM_END, out), strlen("<|im_end|>"));
    fy_tokenizer_destroy(tok);

    /* SPM: byte tokens, and the leading space dropped only at the start */
    tok = tiny_spm_tok();
    fy_detok_init(&d, tok, false);
    assert_int_equal(push(&d, SPM_BOS, out), 0);
    assert_int_equal(push(&d, SPM_SP_HELLO, out), 5);
    assert_memory_equal(out, "hello", 5);
    assert_int_equal(push(&d, SPM_BYTE0 + 0xe2, out), 0);
    assert_int_equal(push(&d, SPM_BYTE0 + 0x82, out), 0);
    assert_int_equal(push(&d, SPM_BYTE0 + 0xac, out), 3);
    assert_int_equal(push(&d, SPM_SP_WORLD, out), 6);
    assert_memory_equal(out, " world", 6);
    fy_tokenizer_destroy(tok);
}

/* Streaming equals whole decoding for every prefix split of a text. */
static void test_detok_matches_decode(void **state)
{
    (void)state;
    fy_tokenizer_t *toks[2] = {tiny_bytelevel_tok("smollm"), tiny_spm_tok()};
    for (int k = 0; k < 2; k++) {
        for (size_t i = 0; i < FY_ARRAY_LEN(k_round_trip_texts); i++) {
            const char *t = k_round_trip_texts[i].s;
            int32_t ids[512];
            size_t n;
            assert_int_equal(fy_tokenizer_encode(toks[k], t, k_round_trip_texts[i].len, true, false, ids, 512, &n),
                             FY_OK);
            for (int render = 0; render < 2; render++) {
                char whole[2048], streamed[2048];
                size_t wl = fy_tokenizer_decode(toks[k], ids, n, render, whole, sizeof(whole));
                size_t sl = stream_decode(toks[k], ids, n, render, streamed, sizeof(streamed));
                assert_int_equal(sl, wl);
                assert_memory_equal(streamed, whole, wl);
            }
        }
    }
    fy_tokenizer_destroy(toks[0]);
    fy_tokenizer_destroy(toks[1]);
}

/* ---- tokenizer.json -------------------------------------------------------------- */

/* SmolLM2's layout: Digits then ByteLevel; merges in both spellings. */
static const char k_json_bytelevel[] =
    "{\"version\": \"1.0\","
    " \"added_tokens\": ["
    "  {\"id\": 12, \"content\": \"<|endoftext|>\", \"special\": true},"
    "  {\"id\": 13, \"content\": \"<|im_start|>\", \"special\": true},"
    "  {\"id\": 14, \"content\": \"<|im_end|>\", \"special\": true}],"
    " \"normalizer\": null,"
    " \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": ["
    "  {\"type\": \"Digits\", \"individual_digits\": true},"
    "  {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, \"use_regex\": true}]},"
    " \"post_processor\": null,"
    " \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true},"
    " \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, \"byte_fallback\": false,"
    "  \"vocab\": {\"h\": 0, \"e\": 1, \"l\": 2, \"o\": 3, \"\\u0120\": 4, \"w\": 5, \"r\": 6, \"d\": 7,"
    "   \"1\": 8, \"2\": 9, \"he\": 10, \"ll\": 11, \"<|endoftext|>\": 12, \"hell\": 15, \"hello\": 16,"
    "   \"\\u0120w\": 17, \"or\": 18, \"\\u0120wor\": 19, \"ld\": 20, \"\\u0120world\": 21, \"12\": 22},"
    "  \"merges\": [\"h e\", \"l l\", [\"he\", \"ll\"], [\"hell\", \"o\"], \"\\u0120 w\", \"o r\","
    "   \"\\u0120w or\", \"l d\", \"\\u0120wor ld\", \"1 2\"]}}";

static void test_json_bytelevel(void **state)
{
    (void)state;
    fy_tokenizer_t *tok = NULL;
    assert_int_equal(tok_from_json_text(k_json_bytelevel, NULL, &tok), FY_OK);
    assert_int_equal(fy_tokenizer_kind(tok), FY_TOKENIZER_BPE_BYTE);
    assert_int_equal(fy_tokenizer_vocab_size(tok), 23);
    EXPECT(tok, "hello world", false, 16, 21);
    EXPECT(tok, "hell", false, 15);
    EXPECT(tok, "12", false, 8, 9); /* Digits split before BPE: "1 2" never applies */
    EXPECT(tok, "<|im_start|>hello<|im_end|>", true, 13, 16, 14);
    assert_int_equal(fy_tokenizer_bos(tok), -1);
    assert_int_equal(fy_tokenizer_eos(tok), 12); /* no config: found by name */
    assert_false(fy_tokenizer_wants_bos(tok));
    assert_true(fy_tokenizer_is_special(tok, 13));
    assert_true(fy_tokenizer_is_eog(tok, 14));
    const int32_t ids[] = {13, 16, 21, 14};
    char out[64];
    assert_int_equal(fy_tokenizer_decode(tok, ids, 4, false, out, sizeof(out)), 11);
    assert_string_equal(out, "hello world");
    fy_tokenizer_destroy(tok);

    /* tokenizer_config.json: bos/eos as string or {content}, add_bos_token */
    const char *config = "{\"bos_token\": {\"content\": \"<|im_start|>\", \"lstrip\": false},"
                         " \"eos_token\": \"<|im_end|>\", \"add_bos_token\": true}";
    assert_int_equal(tok_from_json_text(k_json_bytelevel, config, &tok), FY_OK);
    assert_int_equal(fy_tokenizer_bos(tok), 13);
    assert_int_equal(fy_tokenizer_eos(tok), 14);
    assert_true(fy_tokenizer_wants_bos(tok));
    int32_t got[8];
    size_t n;
    assert_int_equal(fy_tokenizer_encode(tok, "hello", 5, true, false, got, 8, &n), FY_OK);
    assert_int_equal(n, 2);
    assert_int_equal(got[0], 13);
    fy_tokenizer_destroy(tok);

    /* an added token that is not special is user-defined: text, matched
     * with or without parse_special, decoded as written (as Hugging Face
     * does; before, only with parse_special and decoded to nothing) */
    static const char k_last_added[] = "\"special\": true}],";
    const char *at = strstr(k_json_bytelevel, k_last_added);
    assert_non_null(at);
    char json[sizeof(k_json_bytelevel) + 128];
    snprintf(json, sizeof(json), "%.*s\"special\": true}, {\"id\": 23, \"content\": \"  \", \"special\": false}],%s",
             (int)(at - k_json_bytelevel), k_json_bytelevel, at + strlen(k_last_added));
    assert_int_equal(tok_from_json_text(json, NULL, &tok), FY_OK);
    assert_int_equal(fy_tokenizer_vocab_size(tok), 24);
    EXPECT(tok, "hello  world", false, 16, 23, 5, 18, 20);
    EXPECT(tok, "hello  world", true, 16, 23, 5, 18, 20);
    assert_false(fy_tokenizer_is_special(tok, 23));
    const int32_t spaced[] = {16, 23, 5, 18, 20};
    assert_int_equal(fy_tokenizer_decode(tok, spaced, 5, false, out, sizeof(out)), 12);
    assert_string_equal(out, "hello  world");
    fy_tokenizer_destroy(tok);
}

/* Llama-2's layout: Prepend and Replace normalizers, byte fallback, <s> from the template. */
static const char k_json_spm[] =
    "{\"added_tokens\": ["
    "  {\"id\": 0, \"content\": \"<unk>\", \"special\": true},"
    "  {\"id\": 1, \"content\": \"<s>\", \"special\": true},"
    "  {\"id\": 2, \"content\": \"</s>\", \"special\": true}],"
    " \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": ["
    "  {\"type\": \"Prepend\", \"prepend\": \"\\u2581\"},"
    "  {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\\u2581\"}]},"
    " \"pre_tokenizer\": null,"
    " \"post_processor\": {\"type\": \"TemplateProcessing\","
    "  \"single\": [{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}},"
    "             {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}],"
    "  \"pair\": [], \"special_tokens\": {}},"
    " \"decoder\": {\"type\": \"Sequence\", \"decoders\": ["
    "  {\"type\": \"Replace\", \"pattern\": {\"String\": \"\\u2581\"}, \"content\": \" \"},"
    "  {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"},"
    "  {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]},"
    " \"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"byte_fallback\": true, \"fuse_unk\": true,"
    "  \"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2, \"<0xC3>\": 3, \"<0xA9>\": 4, \"\\u2581\": 5,"
    "   \"h\": 6, \"i\": 7, \"\\u2581h\": 8, \"\\u2581hi\": 9, \"hi\": 10},"
    "  \"merges\": [\"\\u2581 h\", \"\\u2581h i\", \"h i\"]}}";

static void test_json_spm(void **state)
{
    (void)state;
    fy_tokenizer_t *tok = NULL;
    assert_int_equal(tok_from_json_text(k_json_spm, NULL, &tok), FY_OK);
    assert_int_equal(fy_tokenizer_kind(tok), FY_TOKENIZER_SPM);
    assert_int_equal(fy_tokenizer_bos(tok), 1);
    assert_int_equal(fy_tokenizer_eos(tok), 2);
    assert_true(fy_tokenizer_wants_bos(tok));
    EXPECT(tok, "hi hi", false, 9, 9); /* ranks: "▁ h" before "h i" */
    EXPECT(tok, "hihi", false, 9, 10);
    EXPECT(tok, "\xc3\xa9", false, 5, 3, 4); /* byte fallback */
    EXPECT(tok, "\xc3\xbc", false, 5, 3, 0); /* no <0xBC>: unknown */
    EXPECT(tok, "<s>hi", true, 1, 9);
    const int32_t ids[] = {1, 9, 9, 5, 3, 4};
    char out[64];
    assert_int_equal(fy_tokenizer_decode(tok, ids, 6, false, out, sizeof(out)), 8);
    assert_string_equal(out, "hi hi \xc3\xa9");
    fy_tokenizer_destroy(tok);
}

/* ---- bad input ------------------------------------------------------------------- */

static void expect_gguf_fault(fy_gw_t *w, fy_status_t want, const char *log_part)
{
    fy_tokenizer_t *tok = NULL;
    fy_test_log_begin();
    fy_status_t st = tok_from_gw(w, &tok);
    fy_test_log_end();
    if (st != want || !fy_test_log_has(log_part, NULL))
        fail_msg("status %d (want %d), log: %s", (int)st, (int)want, fy_test_log_text());
    assert_null(tok); /* set only on success */
}

static void test_gguf_faults(void **state)
{
    (void)state;
    tiny_opts_t o = k_bl_default;
    o.model = NULL;
    expect_gguf_fault(tiny_bytelevel(&o), FY_ERR_FORMAT, "no tokenizer.ggml.model");
    o = k_bl_default;
    o.model = "bert";
    expect_gguf_fault(tiny_bytelevel(&o), FY_ERR_UNSUPPORTED, "unsupported tokenizer model 'bert'");
    o = k_bl_default;
    o.omit_tokens = true;
    expect_gguf_fault(tiny_bytelevel(&o), FY_ERR_FORMAT, "no tokenizer.ggml.tokens");
    o = k_bl_default;
    o.omit_merges = true;
    expect_gguf_fault(tiny_bytelevel(&o), FY_ERR_FORMAT, "without tokenizer.ggml.merges");
    o = k_bl_default;
    o.extra_merge = "he zz";
    expect_gguf_fault(tiny_bytelevel(&o), FY_ERR_FORMAT, "refers to unknown token 'zz'");
    o.extra_merge = "w d"; /* both tokens, but "wd" is not */
    expect_gguf_fault(tiny_bytelevel(&o), FY_ERR_FORMAT, "not in the vocabulary");
    o.extra_merge = "hello";
    expect_gguf_fault(tiny_bytelevel(&o), FY_ERR_FORMAT, "not two tokens separated by a space");
    o = k_bl_default;
    o.n_types = 10;
    expect_gguf_fault(tiny_bytelevel(&o), FY_ERR_FORMAT, "token_type has 10 entries for 275 tokens");
    o = k_bl_default;
    o.first_type = 9;
    expect_gguf_fault(tiny_bytelevel(&o), FY_ERR_FORMAT, "token 0 has unknown token_type 9");
    o = k_bl_default;
    o.bos = 5000;
    expect_gguf_fault(tiny_bytelevel(&o), FY_ERR_FORMAT, "bos_token_id = 5000 is outside the vocabulary");
    o = k_spm_default;
    o.omit_scores = true;
    expect_gguf_fault(tiny_spm(&o), FY_ERR_FORMAT, "without tokenizer.ggml.scores");
    o = k_spm_default;
    o.n_types = SPM_N_VOCAB - 1;
    expect_gguf_fault(tiny_spm(&o), FY_ERR_FORMAT, "token_type has");

    fy_gw_t *w = fy_gw_new(); /* tokens of the wrong type: gguf.c names the fault */
    fy_gw_str(w, "tokenizer.ggml.model", "gpt2");
    fy_gw_u32(w, "tokenizer.ggml.tokens", 7);
    expect_gguf_fault(w, FY_ERR_FORMAT, "tokenizer.ggml.tokens");
}

static void expect_json_fault(const char *json, const char *config, fy_status_t want, const char *log_part)
{
    fy_tokenizer_t *tok = NULL;
    fy_test_log_begin();
    fy_status_t st = tok_from_json_text(json, config, &tok);
    fy_test_log_end();
    if (st != want || !fy_test_log_has(log_part, NULL))
        fail_msg("status %d (want %d), log: %s", (int)st, (int)want, fy_test_log_text());
    assert_null(tok);
}

static void test_json_faults(void **state)
{
    (void)state;
    fy_tokenizer_t *tok = NULL;
    fy_test_log_begin();
    assert_int_equal(fy_tokenizer_from_json(fy_test_path("absent.json"), NULL, &tok), FY_ERR_IO);
    fy_test_log_end();
    assert_true(fy_test_log_has("absent.json", "cannot open", NULL));

    expect_json_fault("{\"model\": ", NULL, FY_ERR_FORMAT, "tokenizer.json:1:");
    expect_json_fault("[1, 2]", NULL, FY_ERR_FORMAT, "not a json object");
    expect_json_fault("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", NULL, FY_ERR_UNSUPPORTED,
                      "unsupported model type 'WordPiece'");
    expect_json_fault("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}", NULL, FY_ERR_FORMAT,
                      "vocab object and a merges array");
    expect_json_fault("{\"pre_tokenizer\": {\"type\": \"ByteLevel\"},"
                      " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 2}, \"merges\": []}}",
                      NULL, FY_ERR_FORMAT, "no token has id 1");
    expect_json_fault("{\"pre_tokenizer\": {\"type\": \"ByteLevel\"},"
                      " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": -4}, \"merges\": []}}",
                      NULL, FY_ERR_FORMAT, "no valid id");
    expect_json_fault("{\"pre_tokenizer\": {\"type\": \"ByteLevel\"},"
                      " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a c\"]}}",
                      NULL, FY_ERR_FORMAT, "refers to unknown token 'c'");
    expect_json_fault("{\"pre_tokenizer\": {\"type\": \"ByteLevel\"},"
                      " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [42]}}",
                      NULL, FY_ERR_FORMAT, "merge 0 is neither");
    expect_json_fault("{\"pre_tokenizer\": {\"type\": \"Whitespace\"},"
                      " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
                      NULL, FY_ERR_UNSUPPORTED, "cannot tell byte-level bpe from sentencepiece-style bpe");
    expect_json_fault("{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"ByteLevel\"},"
                      " {\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, \"behavior\": \"Removed\"}]},"
                      " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
                      NULL, FY_ERR_UNSUPPORTED, "unsupported Split behavior 'Removed'");
    expect_json_fault("{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"ByteLevel\"},"
                      " {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(a\"}, \"behavior\": \"Isolated\"}]},"
                      " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
                      NULL, FY_ERR_FORMAT, "pre-tokenizer regex '(a'");
    expect_json_fault(k_json_bytelevel, "{\"bos_token\": \"<nope>\"}", FY_ERR_FORMAT,
                      "bos_token '<nope>' is not in the vocabulary");
}

/* Every allocation during creation may fail: each failure unwinds cleanly
 * (ASan's leak check watches), and with enough allocations it succeeds. */
typedef fy_status_t (*make_fn)(const void *arg, fy_tokenizer_t **tok_p);

static void alloc_failure_loop(const char *what, make_fn make, const void *arg)
{
    const char *text = "hello world <|im_end|> and a longer tail of text";
    int32_t want[64], got[64];
    size_t n_want, n_got;
    fy_tokenizer_t *tok = NULL;
    assert_int_equal(make(arg, &tok), FY_OK);
    assert_int_equal(fy_tokenizer_encode(tok, text, strlen(text), false, true, want, 64, &n_want), FY_OK);

    fy_test_log_begin(); /* each failure logs a line */
    /* encoding allocates its scratch per call */
    for (long n = 1;; n++) {
        fy_mem_fail_after(n);
        fy_status_t st = fy_tokenizer_encode(tok, text, strlen(text), false, true, got, 64, &n_got);
        fy_mem_fail_after(0);
        if (st == FY_OK) break;
        assert_int_equal(st, FY_ERR_NOMEM);
        assert_true(n < 1000);
    }
    assert_int_equal(n_got, n_want);
    assert_memory_equal(got, want, n_want * sizeof(*want));
    fy_tokenizer_destroy(tok);

    for (long n = 1;; n++) {
        tok = NULL;
        fy_mem_fail_after(n);
        fy_status_t st = make(arg, &tok);
        fy_mem_fail_after(0);
        if (st == FY_OK) {
            fy_test_log_end();
            assert_non_null(tok);
            expect_ids(tok, text, true, want, n_want);
            fy_tokenizer_destroy(tok);
            fprintf(stderr, "note: %s: creation succeeds from %ld allocations on\n", what, n);
            return;
        }
        if (st != FY_ERR_NOMEM) {
            fy_test_log_end();
            fail_msg("%s: failing allocation %ld gave status %d", what, n, (int)st);
        }
        assert_null(tok);
        assert_true(n < 10000);
    }
}

/* The file is opened before the loop: the loop tests the tokenizer only. */
static fy_status_t make_from_gguf(const void *gguf, fy_tokenizer_t **tok_p)
{
    return fy_tokenizer_from_gguf(gguf, tok_p);
}

static fy_status_t make_from_json(const void *arg, fy_tokenizer_t **tok_p)
{
    (void)arg;
    return fy_tokenizer_from_json(fy_test_path("alloc.json"), fy_test_path("alloc_config.json"), tok_p);
}

static void test_alloc_failure(void **state)
{
    (void)state;
    fy_gw_t *writers[2] = {tiny_bytelevel(&k_bl_default), tiny_spm(&k_spm_default)};
    for (int k = 0; k < 2; k++) {
        const char *path = fy_test_path("alloc.gguf");
        assert_true(fy_gw_write(writers[k], path));
        fy_gw_free(writers[k]);
        fy_gguf_t *gguf;
        assert_int_equal(fy_gguf_open(path, &gguf), FY_OK);
        alloc_failure_loop(k ? "gguf spm" : "gguf byte-level", make_from_gguf, gguf);
        fy_gguf_close(gguf);
    }
    const char *config = "{\"eos_token\": \"<|im_end|>\"}";
    assert_true(fy_test_write_file(fy_test_path("alloc.json"), k_json_bytelevel, strlen(k_json_bytelevel)));
    assert_true(fy_test_write_file(fy_test_path("alloc_config.json"), config, strlen(config)));
    alloc_failure_loop("json", make_from_json, NULL);
}

/* ---- the default model (SmolLM2-135M-Instruct) --------------------------------------- */

static fy_tokenizer_t *default_tok(void)
{
    const char *path = fy_test_default_model();
    if (!path) return NULL;
    fy_gguf_t *gguf;
    assert_int_equal(fy_gguf_open(path, &gguf), FY_OK);
    fy_tokenizer_t *tok = NULL;
    assert_int_equal(fy_tokenizer_from_gguf(gguf, &tok), FY_OK);
    fy_gguf_close(gguf);
    return tok;
}

/* Expected ids from llama.cpp: llama-tokenize -m MODEL -p TEXT --ids --log-disable */
static void test_default_model_ids(void **state)
{
    (void)state;
    fy_tokenizer_t *tok = default_tok();
    if (!tok) skip();
    assert_int_equal(fy_tokenizer_kind(tok), FY_TOKENIZER_BPE_BYTE);
    assert_int_equal(fy_tokenizer_vocab_size(tok), 49152);
    assert_int_equal(fy_tokenizer_bos(tok), 1);
    assert_int_equal(fy_tokenizer_eos(tok), 2);
    assert_false(fy_tokenizer_wants_bos(tok));
    assert_true(fy_tokenizer_is_eog(tok, 2));  /* <|im_end|> */
    assert_true(fy_tokenizer_is_eog(tok, 0));  /* <|endoftext|> */
    assert_false(fy_tokenizer_is_eog(tok, 1)); /* <|im_start|> */

    EXPECT(tok, "Hello world", false, 19556, 905);
    EXPECT(tok, "12345", false, 33, 34, 35, 36, 37);
    EXPECT(tok, "Hello, world! How are you?", false, 19556, 28, 905, 17, 1073, 359, 346, 47);
    EXPECT(tok, " Hello", false, 38699);
    EXPECT(tok, "   multiple   spaces  ", false, 256, 2701, 256, 5600, 256);
    EXPECT(tok, "line one\nline two\n\n", false, 1311, 582, 198, 1311, 827, 1116);
    EXPECT(tok, "\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c", false, /* 你好，世界 */
           18645, 250, 48392, 138, 12831, 7906, 240, 178, 239, 230);
    EXPECT(tok, "I like \xf0\x9f\xa6\x99 and \xf0\x9f\x98\x80", false, /* 🦙, 😀 */
           57, 702, 15107, 116, 243, 284, 40303, 218);
    EXPECT(tok, "don't stop 3.14", false, 12420, 982, 2853, 216, 35, 30, 33, 36);
    EXPECT(tok, "\tTabs\tand\r\nCRLF", false, 197, 68, 7366, 197, 397, 201, 198, 9088, 60, 54);
    EXPECT(tok, "<|im_start|>user\nHi<|im_end|>", true, 1, 4093, 198, 26843, 2);
    EXPECT(tok, "<|im_start|>user\nHi<|im_end|>", false, 44, 108, 306, 79, 3738, 108, 46, 4093, 198, 26843, 44, 108,
           306, 79, 486, 108, 46);
    /* bytes SmolLM2 has no token for become U+FFFD (llama.cpp does the same) */
    EXPECT(tok, "\xff\xfe", false, 24211, 24211);
    fy_tokenizer_destroy(tok);
}

static void test_default_model_round_trip(void **state)
{
    (void)state;
    fy_tokenizer_t *tok = default_tok();
    if (!tok) skip();
    round_trip_all(tok, true);
    fy_tokenizer_destroy(tok);
}

/* English-like text of len bytes, the same every run. */
static char *make_english(size_t len, uint64_t seed)
{
    static const char *const words[] = {
        "the",     "quick",      "brown",  "fox",    "jumps",      "over",     "lazy",    "dog",         "inference",
        "prefill", "decode",     "tokens", "and",    "of",         "to",       "in",      "is",          "that",
        "for",     "it",         "with",   "as",     "was",        "on",       "be",      "Transformer", "attention",
        "cache",   "blocks",     "were",   "moved",  "between",    "machines", "quickly", "2024",        "GPU",
        "latency", "throughput", "(see",   "below)", "\"quoted\"", "it's",     "we'll"};
    char *text = fy_malloc(len + 32);
    assert_non_null(text);
    size_t n = 0;
    while (n < len) {
        const char *w = words[fy_test_rand_u64(&seed) % FY_ARRAY_LEN(words)];
        size_t l = strlen(w);
        memcpy(text + n, w, l);
        n += l;
        uint64_t r = fy_test_rand_u64(&seed) % 24;
        text[n++] = r == 0 ? '.' : r == 1 ? ',' : r == 2 ? '\n' : ' ';
        if (r < 2) text[n++] = ' ';
    }
    text[len] = '\0';
    return text;
}

/* 100 KB in well under 100 ms (optimized build); generous bounds here so
 * sanitizer builds pass, while a quadratic merge would still blow them. */
static void test_default_model_speed(void **state)
{
    (void)state;
    fy_tokenizer_t *tok = default_tok();
    if (!tok) skip();
    size_t len = 100 * 1000, n = 0, cap = len;
    char *text = make_english(len, SEED);
    int32_t *ids = fy_calloc(cap, sizeof(*ids));
    assert_non_null(ids);
    double best = 1e9;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = fy_now_s();
        assert_int_equal(fy_tokenizer_encode(tok, text, len, false, false, ids, cap, &n), FY_OK);
        best = FY_MIN(best, fy_now_s() - t0);
    }
    fprintf(stderr, "note: encoded %zu bytes into %zu tokens in %.2f ms (%.1f MB/s)\n", len, n, best * 1e3,
            (double)len / best / 1e6);
    assert_true(best < 1.0);

    /* one 100 KB piece (no spaces): merging must not be quadratic */
    memset(text, 'a', len);
    double t0 = fy_now_s();
    assert_int_equal(fy_tokenizer_encode(tok, text, len, false, false, ids, cap, &n), FY_OK);
    double one_piece = fy_now_s() - t0;
    fprintf(stderr, "note: a single %zu-byte piece took %.2f ms\n", len, one_piece * 1e3);
    assert_true(one_piece < 2.0);
    fy_free(ids);
    fy_free(text);
    fy_tokenizer_destroy(tok);
}

/* A 32,768-token prompt: counted, capped, and decoded back. */
static void test_default_model_long_prompt(void **state)
{
    (void)state;
    fy_tokenizer_t *tok = default_tok();
    if (!tok) skip();
    size_t len = 200 * 1000, need = 0, n = 0, max = 32768;
    char *text = make_english(len, SEED + 1);
    assert_int_equal(fy_tokenizer_encode(tok, text, len, false, false, NULL, 0, &need), FY_ERR_NO_SPACE);
    assert_true(need > max);
    int32_t *ids = fy_calloc(max, sizeof(*ids));
    assert_non_null(ids);
    assert_int_equal(fy_tokenizer_encode(tok, text, len, false, false, ids, max, &n), FY_ERR_NO_SPACE);
    assert_int_equal(n, need);
    /* the first 32,768 tokens decode to a prefix of the text */
    char *out = fy_malloc(len + 1);
    assert_non_null(out);
    size_t out_len = fy_tokenizer_decode(tok, ids, max, false, out, len + 1);
    assert_true(out_len < len);
    assert_memory_equal(out, text, out_len);
    fy_free(out);
    fy_free(ids);
    fy_free(text);
    fy_tokenizer_destroy(tok);
}

/* ---- every built-in model against Hugging Face's tokenizers ------------------------ */

/* The built-in models' files: $FERRY_MODEL and $FERRY_GEMMA_MODEL, or their
 * usual paths; NULL where absent. */
static const char *builtin_model_path(int k)
{
    const char *path = NULL;
    if (k == 0) return fy_test_default_model();
    path = getenv("FERRY_GEMMA_MODEL");
    if (!path) path = "models/gemma-3-270m-q4_k_m.gguf";
    if (access(path, R_OK) != 0) {
        fprintf(stderr, "note: %s not present (run 'make model MODEL=gemma3-270m'); skipping it\n", path);
        return NULL;
    }
    return path;
}

#define N_BUILTIN 2

static fy_tokenizer_t *tok_from_model(const char *path)
{
    fy_gguf_t *gguf;
    assert_int_equal(fy_gguf_open(path, &gguf), FY_OK);
    fy_tokenizer_t *tok = NULL;
    assert_int_equal(fy_tokenizer_from_gguf(gguf, &tok), FY_OK);
    fy_gguf_close(gguf);
    return tok;
}

static json_t *load_json(const char *path)
{
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    if (!j) fail_msg("%s: %s (line %d)", path, err.text, err.line);
    return j;
}

/* The text with its control characters escaped, for a failure message. */
static const char *escaped(const char *s, char *buf, size_t cap)
{
    size_t n = 0;
    for (; *s && n + 5 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c >= 0x20 && c != '\\')
            buf[n++] = (char)c;
        else
            n += (size_t)snprintf(buf + n, cap - n, c == '\n' ? "\\n" : c == '\t' ? "\\t" : "\\x%02x", c);
    }
    buf[n] = '\0';
    return buf;
}

/*
 * tests/data/tok_corpus.json (whitespace runs, code, CJK, emoji, mixed
 * scripts, specials written as text) gives, for every built-in model, the
 * ids Hugging Face's tokenizers gives over the model's own vocabulary
 * (tests/tok_oracle.py wrote tests/data/tok_expected.json), and decodes
 * back to itself.  Before user-defined tokens were honoured: SmolLM2
 * 275/275, Gemma 3 115/275.
 */
static void test_models_match_oracle(void **state)
{
    (void)state;
    json_t *corpus = load_json("tests/data/tok_corpus.json");
    json_t *expected = load_json("tests/data/tok_expected.json");
    size_t n_texts = json_array_size(corpus);
    assert_true(n_texts >= 200);
    int tested = 0;
    for (int k = 0; k < N_BUILTIN; k++) {
        const char *path = builtin_model_path(k);
        if (!path) continue;
        const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
        json_t *want_all = json_object_get(expected, base);
        if (!json_is_array(want_all) || json_array_size(want_all) != n_texts)
            fail_msg("tok_expected.json has no ids for %s (run tests/tok_oracle.py)", base);
        fy_tokenizer_t *tok = tok_from_model(path);
        size_t ok = 0, shown = 0;
        for (size_t i = 0; i < n_texts; i++) {
            const char *text = json_string_value(json_array_get(corpus, i));
            size_t len = strlen(text), n = 0;
            json_t *want = json_array_get(want_all, i);
            int32_t ids[1024];
            assert_int_equal(fy_tokenizer_encode(tok, text, len, false, false, ids, FY_ARRAY_LEN(ids), &n), FY_OK);
            bool same = n == json_array_size(want);
            for (size_t j = 0; j < n && same; j++) same = ids[j] == json_integer_value(json_array_get(want, j));
            ok += same;
            if (!same && shown++ < 8) {
                char buf[256], got[512];
                size_t at = 0;
                for (size_t j = 0; j < n && at < 400; j++)
                    at += (size_t)snprintf(got + at, sizeof(got) - at, " %d", ids[j]);
                got[at] = '\0';
                char *w = json_dumps(want, JSON_COMPACT);
                fprintf(stderr, "%s: '%s': got%s, want %s\n", base, escaped(text, buf, sizeof(buf)), got, w);
                free(w);
            }
            /* lossless: every corpus text's bytes have tokens in both models */
            char out[4096];
            size_t out_len = fy_tokenizer_decode(tok, ids, n, false, out, sizeof(out));
            if (out_len != len || memcmp(out, text, len) != 0) {
                char buf[256];
                fail_msg("%s: '%s' decodes to %zu bytes", base, escaped(text, buf, sizeof(buf)), out_len);
            }
        }
        fprintf(stderr, "note: %s: %zu of %zu corpus texts give the oracle's ids\n", base, ok, n_texts);
        assert_int_equal(ok, n_texts);
        fy_tokenizer_destroy(tok);
        tested++;
    }
    json_decref(expected);
    json_decref(corpus);
    if (!tested) skip();
}

/*
 * Untrusted text never becomes a control token: each of every built-in
 * model's special tokens, written as text (alone, inside text, after
 * whitespace a user-defined token takes), gives no special token unless
 * parse_special asks, and then exactly that token.
 */
static void test_models_no_control_from_text(void **state)
{
    (void)state;
    int tested = 0;
    for (int k = 0; k < N_BUILTIN; k++) {
        const char *path = builtin_model_path(k);
        if (!path) continue;
        fy_tokenizer_t *tok = tok_from_model(path);
        int32_t n_vocab = fy_tokenizer_vocab_size(tok), n_special = 0;
        for (int32_t id = 0; id < n_vocab; id++) {
            if (!fy_tokenizer_is_special(tok, id)) continue;
            const char *piece = fy_tokenizer_piece(tok, id);
            if (!piece[0]) continue;
            n_special++;
            char text[256];
            int32_t ids[256];
            size_t n = 0;
            for (int form = 0; form < 3; form++) {
                snprintf(text, sizeof(text), form == 0 ? "%s" : form == 1 ? "x%sy" : "\n\n  %s\t", piece);
                assert_int_equal(fy_tokenizer_encode(tok, text, strlen(text), false, false, ids, 256, &n), FY_OK);
                for (size_t i = 0; i < n; i++)
                    if (fy_tokenizer_is_special(tok, ids[i]))
                        fail_msg("'%s' as text gave special token %d '%s'", text, ids[i],
                                 fy_tokenizer_piece(tok, ids[i]));
            }
            assert_int_equal(fy_tokenizer_encode(tok, piece, strlen(piece), false, true, ids, 256, &n), FY_OK);
            assert_int_equal(n, 1);
            assert_string_equal(fy_tokenizer_piece(tok, ids[0]), piece); /* the token, or its first twin */
        }
        static const char *const k_markers[] = {"<start_of_turn>", "<end_of_turn>", "<|im_start|>", "<|im_end|>",
                                                "<bos>",           "<eos>",         "<|endoftext|>"};
        int found = 0;
        for (size_t m = 0; m < FY_ARRAY_LEN(k_markers); m++) {
            int32_t id = fy_tokenizer_find(tok, k_markers[m]);
            if (id < 0) continue;
            found++;
            assert_true(fy_tokenizer_is_special(tok, id));
        }
        assert_true(found >= 2 && n_special >= 3);
        fy_tokenizer_destroy(tok);
        tested++;
    }
    if (!tested) skip();
}

/*
 * Matching a special token costs a few binary searches, not a pass over
 * every token that starts with the same byte: 100 KB of "<" (Gemma has
 * 6,300 special tokens starting with "<") took 21 s with parse_special
 * before, 0.1 s after.
 */
static void test_models_special_match_speed(void **state)
{
    (void)state;
    int tested = 0;
    size_t len = 100 * 1000;
    char *text = fy_malloc(len);
    int32_t *ids = fy_calloc(len + 1, sizeof(*ids));
    assert_non_null(text);
    assert_non_null(ids);
    for (int k = 0; k < N_BUILTIN; k++) {
        const char *path = builtin_model_path(k);
        if (!path) continue;
        fy_tokenizer_t *tok = tok_from_model(path);
        for (int form = 0; form < 2; form++) {
            static const char k_near[] = "<unused1<start_of_tur<|im_star<b"; /* near misses */
            for (size_t i = 0; i < len; i++) text[i] = form == 0 ? '<' : k_near[i % (sizeof(k_near) - 1)];
            for (int parse_special = 0; parse_special < 2; parse_special++) {
                size_t n = 0;
                double t0 = fy_now_s();
                assert_int_equal(fy_tokenizer_encode(tok, text, len, false, parse_special, ids, len + 1, &n), FY_OK);
                double took = fy_now_s() - t0;
                fprintf(stderr, "note: %s: 100 KB of %s, parse_special %d: %.1f ms\n", strrchr(path, '/') + 1,
                        form ? "near misses" : "'<'", parse_special, took * 1e3);
                assert_true(took < 3.0);
            }
        }
        fy_tokenizer_destroy(tok);
        tested++;
    }
    fy_free(ids);
    fy_free(text);
    if (!tested) skip();
}

static int teardown(void **state)
{
    (void)state;
    fy_test_tmpdir_remove();
    return 0;
}

/*
 * A raw completion prompt (fy_prompt_text) with parse_special: a
 * hand-written chat prompt gives the template's markers as the control
 * tokens they are, with exactly the ids Hugging Face's tokenizers gives
 * (tests/tok_oracle.py's tokenizer with the CONTROL tokens added as
 * special: vLLM's /v1/completions); without, the markers are text and no
 * special token comes out.  Before /v1/completions parsed them, SmolLM2's
 * prompt was 28 tokens instead of the oracle's 10.
 */
static void test_models_prompt_text_special(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        int32_t want[16];
        size_t n_want, n_plain;
    } k_cases[N_BUILTIN] = {
        {"<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
         {1, 4093, 198, 6004, 2, 198, 1, 520, 9531, 198},
         10,
         28},
        /* Gemma wants BOS: the oracle's 9 after it */
        {"<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
         {2, 105, 2364, 107, 2202, 106, 107, 105, 4368, 107},
         10,
         28},
    };
    int tested = 0;
    for (int k = 0; k < N_BUILTIN; k++) {
        const char *path = builtin_model_path(k);
        if (!path) continue;
        fy_model_t *m;
        assert_int_equal(fy_model_load(path, &m), FY_OK);
        const fy_tokenizer_t *tok = fy_model_tokenizer(m);
        const char *text = k_cases[k].text;
        int32_t *ids = NULL, n = 0;
        assert_int_equal(fy_prompt_text(m, text, strlen(text), true, &ids, &n), FY_OK);
        assert_int_equal(n, (int32_t)k_cases[k].n_want);
        for (int32_t i = 0; i < n; i++)
            if (ids[i] != k_cases[k].want[i])
                fail_msg("%s: id %d is %d, the oracle's %d", path, i, ids[i], k_cases[k].want[i]);
        fy_free(ids);
        /* plain text: the same prompt fy_prompt_tokens makes of it */
        assert_int_equal(fy_prompt_text(m, text, strlen(text), false, &ids, &n), FY_OK);
        assert_int_equal(n, (int32_t)k_cases[k].n_plain);
        for (int32_t i = fy_tokenizer_wants_bos(tok) ? 1 : 0; i < n; i++)
            if (fy_tokenizer_is_special(tok, ids[i])) fail_msg("%s: plain text gave special token %d", path, ids[i]);
        int32_t *old = NULL, n_old = 0;
        assert_int_equal(fy_prompt_tokens(m, NULL, text, false, &old, &n_old), FY_OK);
        assert_int_equal(n_old, n);
        assert_memory_equal(old, ids, (size_t)n * sizeof(int32_t));
        fy_free(old);
        fy_free(ids);
        /* nothing to tokenize is refused, not an empty prompt */
        assert_int_equal(fy_prompt_text(m, "", 0, true, &ids, &n),
                         fy_tokenizer_wants_bos(tok) ? FY_OK : FY_ERR_INVALID);
        if (fy_tokenizer_wants_bos(tok)) fy_free(ids);
        fy_model_destroy(m);
        tested++;
    }
    if (!tested) skip();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bytelevel_ids),
        cmocka_unit_test(test_bytelevel_pre),
        cmocka_unit_test(test_bytelevel_special),
        cmocka_unit_test(test_bytelevel_queries),
        cmocka_unit_test(test_encode_no_space),
        cmocka_unit_test(test_bytelevel_round_trip),
        cmocka_unit_test(test_spm_ids),
        cmocka_unit_test(test_spm_junction),
        cmocka_unit_test(test_spm_special),
        cmocka_unit_test(test_spm_user_defined),
        cmocka_unit_test(test_spm_round_trip),
        cmocka_unit_test(test_detok_hold_back),
        cmocka_unit_test(test_detok_matches_decode),
        cmocka_unit_test(test_json_bytelevel),
        cmocka_unit_test(test_json_spm),
        cmocka_unit_test(test_gguf_faults),
        cmocka_unit_test(test_json_faults),
        cmocka_unit_test(test_alloc_failure),
        cmocka_unit_test(test_default_model_ids),
        cmocka_unit_test(test_default_model_round_trip),
        cmocka_unit_test(test_default_model_speed),
        cmocka_unit_test(test_default_model_long_prompt),
        cmocka_unit_test(test_models_match_oracle),
        cmocka_unit_test(test_models_no_control_from_text),
        cmocka_unit_test(test_models_special_match_speed),
        cmocka_unit_test(test_models_prompt_text_special),
    };
    fprintf(stderr, "note: seed 0x%x\n", SEED);
    return cmocka_run_group_tests(tests, NULL, teardown);
}

/*
 * fuzz_grammar.c - the grammar compilers (grammar/json_schema.c,
 * grammar/grammar_regex.c, grammar/grammar_gbnf.c: JSON Schema,
 * json_object, regex, choice list, GBNF)
 * on any text, and a few steps of the matcher and its mask.
 *
 * Input: the first byte picks the kind (mod 5), the next 8 bytes drive
 * which tokens are taken, the rest is the source.  Checks: a refused
 * source comes with a message; a compiled one gives a matcher whose mask
 * over a small vocabulary (every byte, some multi-byte pieces, EOS) is
 * exactly the tokens accept_token takes, with EOS exactly when complete;
 * up to 8 tokens are taken from the mask and undone by rollback to the
 * same mask; the mask is never empty (every byte is a token).  Seeds: the schemas, regexes and choices of mkseeds.c.
 *
 * Not here: the default model's vocabulary (test_grammar checks the mask
 * against brute force on it).
 */
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "common/mem.h"
#include "grammar/token_trie.h"
#include "tests/fuzz/util.h"

static fy_token_trie_t *g_trie;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fz_quiet_log();
    static const char *const pieces[] = {"{\"", "\":", "\"",   "ab",  "true", ", \"", "}",    "12", "-1.", "\xc3\xa9",
                                         " ",   "\n ", "null", "\"}", "[{",   "},{",  "a\"b", "e+", "x"};
    enum { NP = sizeof(pieces) / sizeof(pieces[0]), N = 256 + NP + 1 };
    static uint8_t single[256];
    static const uint8_t *bytes[N];
    static uint32_t len[N];
    for (int i = 0; i < 256; i++) single[i] = (uint8_t)i, bytes[i] = &single[i], len[i] = 1;
    for (int i = 0; i < NP; i++)
        bytes[256 + i] = (const uint8_t *)pieces[i], len[256 + i] = (uint32_t)strlen(pieces[i]);
    bytes[N - 1] = (const uint8_t *)"", len[N - 1] = 0;
    int32_t eos = N - 1;
    if (fy_token_trie_create(N, bytes, len, NULL, &eos, 1, &g_trie) != FY_OK) abort();
    return 0;
}

static bool bit(const uint32_t *m, int32_t id) { return (m[id >> 5] >> (id & 31)) & 1; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 9) return 0;
    fy_grammar_kind_t kind = (fy_grammar_kind_t)(data[0] % FY_GRAMMAR_KIND_COUNT);
    const uint8_t *pick = data + 1;
    char err[FY_GRAMMAR_ERR_LEN];
    fy_grammar_t *g = NULL;
    fy_status_t st = fy_grammar_compile(kind, (const char *)data + 9, size - 9, &g, err, sizeof(err));
    if (st != FY_OK) {
        FZ_CHECK(err[0] != '\0', "%s refused without a message (%s)", fy_grammar_kind_str(kind), fy_status_str(st));
        FZ_CHECK(g == NULL, "a refused grammar was handed out");
        return 0;
    }
    fy_gmatch_t *m = NULL;
    if (fy_gmatch_create(g, &m) != FY_OK) { /* a start state past the matcher's limits */
        fy_grammar_unref(g);
        return 0;
    }
    const fy_token_trie_t *t = g_trie;
    uint32_t mask[16] = {0}, again[16] = {0}; /* 9 words used */
    size_t words = fy_token_trie_mask_words(g_trie);
    int taken = 0;
    for (int s = 0; s < 8; s++) {
        if (fy_gmatch_mask(m, t, mask) != FY_OK) break; /* a matcher limit: refused, not wrong */
        for (int32_t id = 0; id < t->n_vocab; id++) {
            bool ok = fy_gmatch_accept_token(m, t, id) == FY_OK;
            if (ok) FZ_CHECK(fy_gmatch_rollback(m, 1) == FY_OK, "rollback after token %d", id);
            FZ_CHECK(ok == bit(mask, id), "token %d: mask %d, accept %d", id, bit(mask, id), ok);
        }
        FZ_CHECK(bit(mask, t->eog[0]) == fy_gmatch_is_complete(m), "eos %d, complete %d", bit(mask, t->eog[0]),
                 fy_gmatch_is_complete(m));
        int32_t n = 0;
        for (size_t w = 0; w < words; w++) n += __builtin_popcount(mask[w]);
        FZ_CHECK(n > 0, "a live matcher allows no token (complete %d)", fy_gmatch_is_complete(m));
        int32_t k = pick[s] % n, id = 0;
        for (; id < t->n_vocab; id++)
            if (bit(mask, id) && k-- == 0) break;
        FZ_CHECK(fy_gmatch_accept_token(m, t, id) == FY_OK, "masked token %d refused", id);
        taken++;
    }
    /* undo everything: the start mask again */
    if (taken && fy_gmatch_rollback(m, taken) == FY_OK) {
        fy_gmatch_t *fresh;
        if (fy_gmatch_create(g, &fresh) == FY_OK) {
            if (fy_gmatch_mask(fresh, t, mask) == FY_OK && fy_gmatch_mask(m, t, again) == FY_OK)
                FZ_CHECK(!memcmp(mask, again, sizeof(mask)), "rollback to the start gives another mask");
            fy_gmatch_destroy(fresh);
        }
    }
    fy_gmatch_destroy(m);
    fy_grammar_unref(g);
    return 0;
}

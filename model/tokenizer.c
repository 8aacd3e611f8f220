/*
 * tokenizer.c - byte-level BPE and SentencePiece-style BPE, loaded from
 * GGUF metadata or from a Hugging Face tokenizer.json.
 *
 * Encoding runs in four stages:
 *   1. user-defined tokens (Gemma's runs of spaces, tabs and newlines, its
 *      HTML tags), and with parse_special control tokens too, are cut out
 *      of the raw text first (leftmost, longest match), leaving plain
 *      fragments, as llama.cpp and Hugging Face's added tokens do;
 *   2. SPM fragments are normalized ("▁" for spaces, a "▁" prefix);
 *   3. the pre-tokenizer regexes (PCRE2) cut each fragment into pieces,
 *      keeping both the matches and the gaps between them;
 *   4. each piece is merged with BPE over a linked list of symbols and a
 *      binary heap of candidate pairs (O(n log n) per piece).  Byte-level
 *      pieces are first spelled in GPT-2's byte-to-unicode alphabet; SPM
 *      symbols that are not in the vocabulary become <0xXX> byte tokens.
 * Invalid UTF-8 is never dropped: the regexes run with
 * PCRE2_MATCH_INVALID_UTF, so invalid bytes land in the gaps and are
 * encoded as bytes like anything else (only a byte the vocabulary has no
 * token for becomes U+FFFD, see spell_bytes()).
 *
 * Not here: WordPiece and Unigram models, Unicode normalization (NFC),
 * chat templates.
 */
#define PCRE2_CODE_UNIT_WIDTH 8

#include "model/tokenizer.h"

#include <assert.h>
#include <errno.h>
#include <jansson.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/mem.h"

#define TOK_MAX_VOCAB (1 << 24) /* keeps ids, offsets and ranks far from int32 limits */
#define TOK_MAX_MERGES (1 << 26)
#define TOK_MAX_TOKEN_LEN (1 << 16) /* longer vocabulary strings mean a corrupt file */
#define TOK_MAX_REGEX 8
#define TOK_LOG_CHARS 48       /* token text quoted in log lines is cut to this */
#define TOK_MAX_TEXT (1 << 28) /* symbols and offsets are int32: 6 bytes per byte must fit */

#define SPM_SPACE "\xe2\x96\x81" /* U+2581, SentencePiece's visible space */
#define SPM_SPACE_LEN 3

/* Token types, numbered as GGUF's tokenizer.ggml.token_type. */
typedef enum tok_type {
    TOK_UNDEFINED = 0,
    TOK_NORMAL = 1,
    TOK_UNKNOWN = 2,
    TOK_CONTROL = 3,
    TOK_USER_DEFINED = 4,
    TOK_UNUSED = 5,
    TOK_BYTE = 6,
    TOK_TYPE_COUNT
} tok_type_t;

typedef struct tok_entry {
    const char *text; /* NUL-terminated copy in text_pool; may hold NULs itself */
    uint32_t len;
    const char *bytes; /* what the token decodes to: text_pool or bytes_pool */
    uint32_t n_bytes;
    float score;  /* SPM merge priority (GGUF "llama" models) */
    uint8_t type; /* tok_type_t */
    bool eog;
} tok_entry_t;

/* One BPE merge: the pair (left, right) of token ids becomes id. */
typedef struct merge_slot {
    uint64_t key; /* left << 32 | right; MERGE_EMPTY when free */
    int32_t rank;
    int32_t id;
} merge_slot_t;

#define MERGE_EMPTY UINT64_MAX

/* A token in the text index.  The tag (high bits of the hash) settles
 * most probes without touching the token's text, which is a cache miss. */
typedef struct index_slot {
    int32_t id; /* -1 when free */
    uint32_t tag;
} index_slot_t;

/* Tokens matched as whole strings in the text before the model runs. */
typedef struct special_set {
    int32_t *ids;     /* sorted by text (bytes, a prefix first); a repeated text's first id last */
    uint32_t at[257]; /* ids[at[c] .. at[c + 1]) start with byte c */
    uint32_t max_len; /* of the longest */
} special_set_t;

typedef enum spm_prefix {
    SPM_PREFIX_NONE,
    SPM_PREFIX_ALWAYS, /* every plain fragment (llama.cpp, HF Prepend normalizer) */
    SPM_PREFIX_FIRST,  /* only a fragment at the start of the text (HF Metaspace "first") */
} spm_prefix_t;

struct fy_tokenizer {
    fy_tokenizer_kind_t kind;
    int32_t n_vocab;
    tok_entry_t *tokens; /* [n_vocab] */
    char *text_pool;     /* the token strings, each NUL-terminated */
    size_t text_used, text_size;
    char *bytes_pool; /* decoded bytes of plain and byte tokens (the others decode to their text) */
    size_t bytes_used, bytes_size;

    index_slot_t *index; /* open addressing over token text */
    size_t index_mask;

    merge_slot_t *merges; /* open addressing over (left, right) */
    size_t merge_mask;
    bool merge_by_score; /* GGUF SPM: a pair merges when its concatenation is a token */
    bool ignore_merges;  /* a piece that is a whole token is taken as is */
    bool spm_words;      /* SPM: merge word by word, see vocab_has_junction() */

    special_set_t user;     /* user-defined tokens: matched in any text */
    special_set_t specials; /* those and control and unknown tokens: matched with parse_special */
    int32_t byte_tok[256];  /* token of each byte: its GPT-2 character, or <0xXX> */
    int32_t ascii_tok[128]; /* SPM: token of each ASCII character, to skip the index */
    char byte_char[256][2]; /* byte-level: GPT-2's character for each byte, as UTF-8 */
    uint8_t byte_char_len[256];
    uint8_t byte_spell[256][3]; /* byte-level: the bytes encoded for each byte, see spell_bytes() */
    uint8_t byte_spell_len[256];

    int32_t bos, eos;
    int32_t unk; /* for text nothing else spells; only a token of type unknown */
    bool add_bos;
    spm_prefix_t spm_prefix;
    bool spm_prefix_unless_space; /* Metaspace: no prefix when the text starts with a space */
    bool spm_replace_space;
    bool byte_prefix_space; /* ByteLevel add_prefix_space */

    pcre2_general_context *pcre_gctx; /* routes PCRE2's allocations through fy_malloc */
    pcre2_code *regex[TOK_MAX_REGEX];
    size_t n_regex;
};

/* ---- small helpers ------------------------------------------------------------ */

static int log_len(size_t len) { return (int)FY_MIN(len, (size_t)TOK_LOG_CHARS); }

/* Length of the valid UTF-8 sequence at s (1..4), or 0 when s[0] starts none. */
static size_t utf8_valid_len(const uint8_t *s, size_t n)
{
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    size_t need;
    uint8_t lo = 0x80, hi = 0xbf; /* allowed range of the second byte */
    if (c >= 0xc2 && c <= 0xdf) {
        need = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
        need = 3;
        if (c == 0xe0) lo = 0xa0;
        if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        need = 4;
        if (c == 0xf0) lo = 0x90;
        if (c == 0xf4) hi = 0x8f;
    } else {
        return 0;
    }
    if (n < need || s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < need; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    return need;
}

/* The code point of a valid sequence of length len (from utf8_valid_len). */
static uint32_t utf8_decode(const uint8_t *s, size_t len)
{
    switch (len) {
    case 1: return s[0];
    case 2: return (uint32_t)(s[0] & 0x1f) << 6 | (s[1] & 0x3f);
    case 3: return (uint32_t)(s[0] & 0x0f) << 12 | (uint32_t)(s[1] & 0x3f) << 6 | (s[2] & 0x3f);
    default:
        return (uint32_t)(s[0] & 0x07) << 18 | (uint32_t)(s[1] & 0x3f) << 12 | (uint32_t)(s[2] & 0x3f) << 6 |
               (s[3] & 0x3f);
    }
}

static size_t utf8_encode(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | cp >> 12);
        out[1] = (char)(0x80 | (cp >> 6 & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | cp >> 18);
    out[1] = (char)(0x80 | (cp >> 12 & 0x3f));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3f));
    out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/*
 * GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves,
 * the other 68 bytes (controls, space, NBSP, soft hyphen) are moved, in
 * order, to U+0100 and up, so that every byte is a visible character.
 */
static bool gpt2_byte_is_printable(unsigned b)
{
    return (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
}

#define GPT2_CP_LIMIT (256 + 68) /* code points the table uses are below this */

static void gpt2_byte_table(uint32_t cp_of_byte[256])
{
    uint32_t next = 256;
    for (unsigned b = 0; b < 256; b++) cp_of_byte[b] = gpt2_byte_is_printable(b) ? b : next++;
}

/* "<0xXX>" (upper-case hex, as SentencePiece writes it) -> the byte, or -1. */
static int spm_byte_value(const char *s, size_t len)
{
    if (len != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* FNV-1a over a ‖ b, so that a merge's result can be looked up unjoined. */
static uint64_t hash_bytes2(const char *a, size_t alen, const char *b, size_t blen)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < alen; i++) h = (h ^ (uint8_t)a[i]) * 0x100000001b3ull;
    for (size_t i = 0; i < blen; i++) h = (h ^ (uint8_t)b[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static size_t table_size_for(size_t n)
{
    size_t size = 16;
    while (size < 2 * n) size *= 2;
    return size;
}

/* ---- vocabulary ----------------------------------------------------------------- */

/* Not text: never made from text unless asked (parse_special), rendered
 * only when asked.  User-defined tokens are text: "  " is Gemma's token
 * for two spaces, made from any text and always decoded. */
static bool type_is_special(uint8_t type) { return type == TOK_UNKNOWN || type == TOK_CONTROL || type == TOK_UNUSED; }

/* Tokens that plain text may turn into; specials and bytes only come
 * from parse_special and from byte fallback. */
static bool type_is_plain(uint8_t type) { return type == TOK_NORMAL || type == TOK_UNDEFINED; }

/* What is matched whole in the text: user-defined tokens always, control
 * and unknown ones only with parse_special (llama.cpp's
 * tokenizer_st_partition, Hugging Face's added tokens). */
static bool type_is_matched(uint8_t type, bool parse_special)
{
    return type == TOK_USER_DEFINED || (parse_special && (type == TOK_CONTROL || type == TOK_UNKNOWN));
}

static int32_t index_find2(const fy_tokenizer_t *tok, const char *a, size_t alen, const char *b, size_t blen)
{
    size_t len = alen + blen;
    uint64_t h = hash_bytes2(a, alen, b, blen);
    uint32_t tag = (uint32_t)(h >> 32);
    for (size_t i = h & tok->index_mask;; i = (i + 1) & tok->index_mask) {
        const index_slot_t *slot = &tok->index[i];
        if (slot->id < 0) return -1;
        if (slot->tag != tag) continue;
        const tok_entry_t *t = &tok->tokens[slot->id];
        if (t->len == len && memcmp(t->text, a, alen) == 0 && (blen == 0 || memcmp(t->text + alen, b, blen) == 0))
            return slot->id;
    }
}

static int32_t index_find(const fy_tokenizer_t *tok, const char *s, size_t len)
{
    return index_find2(tok, s, len, NULL, 0);
}

static int32_t find_plain(const fy_tokenizer_t *tok, const char *s, size_t len)
{
    int32_t id = index_find(tok, s, len);
    return id >= 0 && type_is_plain(tok->tokens[id].type) ? id : -1;
}

/* Room for n tokens, and for n_strings strings of text_bytes bytes in all
 * (tokenizer.json may give an id twice: vocab, then added_tokens). */
static fy_status_t vocab_alloc(fy_tokenizer_t *tok, int32_t n, size_t n_strings, size_t text_bytes, const char *src)
{
    tok->n_vocab = n;
    tok->tokens = fy_calloc((size_t)n, sizeof(*tok->tokens));
    tok->text_size = text_bytes + n_strings; /* + a NUL each */
    tok->text_pool = fy_malloc(tok->text_size);
    if (!tok->tokens || !tok->text_pool) {
        fy_error("tokenizer: %s: out of memory for %d tokens", src, n);
        return FY_ERR_NOMEM;
    }
    return FY_OK;
}

/* Copies text into the pool; the caller has counted it in vocab_alloc. */
static void vocab_set(fy_tokenizer_t *tok, int32_t id, const char *text, size_t len, uint8_t type, float score)
{
    tok_entry_t *t = &tok->tokens[id];
    char *dst = tok->text_pool + tok->text_used;
    assert(tok->text_used + len + 1 <= tok->text_size);
    memcpy(dst, text, len);
    dst[len] = '\0';
    tok->text_used += len + 1;
    t->text = dst;
    t->len = (uint32_t)len;
    t->type = type;
    t->score = score;
}

/* Builds the text -> id index.  A string that appears twice keeps its
 * first id, as the lookups must be deterministic. */
static fy_status_t vocab_index(fy_tokenizer_t *tok, const char *src)
{
    size_t size = table_size_for((size_t)tok->n_vocab);
    tok->index = fy_malloc(size * sizeof(*tok->index));
    if (!tok->index) {
        fy_error("tokenizer: %s: out of memory for the token index", src);
        return FY_ERR_NOMEM;
    }
    for (size_t i = 0; i < size; i++) tok->index[i].id = -1;
    tok->index_mask = size - 1;
    int32_t dups = 0, first_dup = -1;
    for (int32_t id = 0; id < tok->n_vocab; id++) {
        const tok_entry_t *t = &tok->tokens[id];
        if (t->len == 0) continue; /* never matched, never produced */
        if (index_find(tok, t->text, t->len) >= 0) {
            if (dups++ == 0) first_dup = id;
            continue;
        }
        uint64_t h = hash_bytes2(t->text, t->len, NULL, 0);
        size_t i = h & tok->index_mask;
        while (tok->index[i].id >= 0) i = (i + 1) & tok->index_mask;
        tok->index[i] = (index_slot_t){.id = id, .tag = (uint32_t)(h >> 32)};
    }
    if (dups)
        fy_warn("tokenizer: %s: %d tokens repeat an earlier token's text (first: id %d); lookups use the "
                "first",
                src, dups, first_dup);
    return FY_OK;
}

/* ---- merges ----------------------------------------------------------------------- */

static fy_status_t merges_alloc(fy_tokenizer_t *tok, size_t n, const char *src)
{
    if (n > TOK_MAX_MERGES) {
        fy_error("tokenizer: %s: %zu merges (ferry takes up to %d)", src, n, TOK_MAX_MERGES);
        return FY_ERR_FORMAT;
    }
    size_t size = table_size_for(n);
    tok->merges = fy_malloc(size * sizeof(*tok->merges));
    if (!tok->merges) {
        fy_error("tokenizer: %s: out of memory for %zu merges", src, n);
        return FY_ERR_NOMEM;
    }
    for (size_t i = 0; i < size; i++) tok->merges[i].key = MERGE_EMPTY;
    tok->merge_mask = size - 1;
    return FY_OK;
}

static bool merge_find(const fy_tokenizer_t *tok, int32_t left, int32_t right, int32_t *rank_p, int32_t *id_p)
{
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    for (size_t i = hash_u64(key) & tok->merge_mask;; i = (i + 1) & tok->merge_mask) {
        const merge_slot_t *m = &tok->merges[i];
        if (m->key == MERGE_EMPTY) return false;
        if (m->key == key) {
            *rank_p = m->rank;
            *id_p = m->id;
            return true;
        }
    }
}

/*
 * Adds merge number rank, "a b".  Both halves and their concatenation
 * must be tokens (Hugging Face refuses such files too).  A pair listed
 * twice keeps its first, lower rank.
 */
static fy_status_t merge_add(fy_tokenizer_t *tok, size_t rank, const char *a, size_t alen, const char *b, size_t blen,
                             const char *src)
{
    int32_t left = index_find(tok, a, alen);
    int32_t right = index_find(tok, b, blen);
    if (left < 0 || right < 0) {
        const char *bad = left < 0 ? a : b;
        size_t bad_len = left < 0 ? alen : blen;
        fy_error("tokenizer: %s: merge %zu ('%.*s' '%.*s') refers to unknown token '%.*s'", src, rank, log_len(alen), a,
                 log_len(blen), b, log_len(bad_len), bad);
        return FY_ERR_FORMAT;
    }
    int32_t id = index_find2(tok, a, alen, b, blen);
    if (id < 0) {
        fy_error("tokenizer: %s: merge %zu ('%.*s' '%.*s') makes a token that is not in the vocabulary", src, rank,
                 log_len(alen), a, log_len(blen), b);
        return FY_ERR_FORMAT;
    }
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    size_t i = hash_u64(key) & tok->merge_mask;
    while (tok->merges[i].key != MERGE_EMPTY && tok->merges[i].key != key) i = (i + 1) & tok->merge_mask;
    if (tok->merges[i].key == key) return FY_OK;
    tok->merges[i] = (merge_slot_t){.key = key, .rank = (int32_t)rank, .id = id};
    return FY_OK;
}

/* "a b" as GGUF and older tokenizer.json files write a merge.  The split is
 * at the first space after the first byte, so a half may itself be " ". */
static fy_status_t merge_add_joined(fy_tokenizer_t *tok, size_t rank, const char *s, size_t len, const char *src)
{
    const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
    if (!sp) {
        fy_error("tokenizer: %s: merge %zu ('%.*s') is not two tokens separated by a space", src, rank, log_len(len),
                 s);
        return FY_ERR_FORMAT;
    }
    size_t alen = (size_t)(sp - s);
    return merge_add(tok, rank, s, alen, sp + 1, len - alen - 1, src);
}

/* ---- pre-tokenizer regexes ------------------------------------------------------ */

static void *pcre_malloc(PCRE2_SIZE size, void *data)
{
    (void)data;
    return fy_malloc(size);
}

static void pcre_free(void *ptr, void *data)
{
    (void)data;
    fy_free(ptr);
}

/* Compiles one pre-tokenizer regex (or, with literal, a plain string). */
static fy_status_t regex_add(fy_tokenizer_t *tok, const char *pattern, size_t len, bool literal, const char *src)
{
    if (tok->n_regex == TOK_MAX_REGEX) {
        fy_error("tokenizer: %s: more than %d pre-tokenizer splits", src, TOK_MAX_REGEX);
        return FY_ERR_UNSUPPORTED;
    }
    pcre2_compile_context *cctx = pcre2_compile_context_create(tok->pcre_gctx);
    if (!cctx) {
        fy_error("tokenizer: %s: out of memory compiling a pre-tokenizer regex", src);
        return FY_ERR_NOMEM;
    }
    uint32_t options = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : 0);
    int err;
    PCRE2_SIZE err_off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, len, options, &err, &err_off, cctx);
    pcre2_compile_context_free(cctx);
    if (!re) {
        if (err == PCRE2_ERROR_HEAP_FAILED) {
            fy_error("tokenizer: %s: out of memory compiling a pre-tokenizer regex", src);
            return FY_ERR_NOMEM;
        }
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof(msg));
        fy_error("tokenizer: %s: pre-tokenizer regex '%.*s': %s at offset %zu", src, log_len(len), pattern,
                 (const char *)msg, (size_t)err_off);
        return FY_ERR_FORMAT;
    }
    /* Best effort: without JIT (unsupported CPU, no memory) the
     * interpreter gives the same matches, only slower. */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    tok->regex[tok->n_regex++] = re;
    return FY_OK;
}

static fy_status_t regex_add_str(fy_tokenizer_t *tok, const char *pattern, const char *src)
{
    return regex_add(tok, pattern, strlen(pattern), false, src);
}

/* The regexes of the pre-tokenizers ferry knows, as llama.cpp and the
 * models' tokenizer.json files write them. */
#define RX_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define RX_DIGIT "\\p{N}"
#define RX_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RX_LLAMA3                                                                                                      \
    RX_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"         \
                    "\\s+(?!\\S)|\\s+"
#define RX_QWEN2                                                                                                       \
    RX_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"              \
                    "\\s+(?!\\S)|\\s+"

typedef struct pre_group {
    const char *regex[2]; /* applied in order; NULL-terminated */
    bool ignore_merges;
    bool add_bos; /* llama.cpp's default when add_bos_token is absent */
} pre_group_t;

enum { PRE_GPT2, PRE_DIGITS_GPT2, PRE_LLAMA3, PRE_QWEN2 };

static const pre_group_t k_pre_groups[] = {
    [PRE_GPT2] = {{RX_GPT2, NULL}, false, false},
    [PRE_DIGITS_GPT2] = {{RX_DIGIT, RX_GPT2}, false, false},
    [PRE_LLAMA3] = {{RX_LLAMA3, NULL}, true, true},
    [PRE_QWEN2] = {{RX_QWEN2, NULL}, false, false},
};

/* tokenizer.ggml.pre values, grouped as llama.cpp groups them. */
static const struct {
    const char *name;
    int group;
} k_pre_names[] = {
    {"default", PRE_GPT2},
    {"gpt-2", PRE_GPT2},
    {"phi-2", PRE_GPT2},
    {"mpt", PRE_GPT2},
    {"olmo", PRE_GPT2},
    {"jais", PRE_GPT2},
    {"gigachat", PRE_GPT2},
    {"jina-es", PRE_GPT2},
    {"jina-de", PRE_GPT2},
    {"jina-v2-es", PRE_GPT2},
    {"jina-v2-de", PRE_GPT2},
    {"exaone4", PRE_GPT2},
    {"trillion", PRE_GPT2},
    {"granite-docling", PRE_GPT2},
    {"smollm", PRE_DIGITS_GPT2},
    {"starcoder", PRE_DIGITS_GPT2},
    {"refact", PRE_DIGITS_GPT2},
    {"command-r", PRE_DIGITS_GPT2},
    {"codeshell", PRE_DIGITS_GPT2},
    {"exaone", PRE_DIGITS_GPT2},
    {"minerva-7b", PRE_DIGITS_GPT2},
    {"llama3", PRE_LLAMA3},
    {"llama-v3", PRE_LLAMA3},
    {"llama-bpe", PRE_LLAMA3},
    {"falcon3", PRE_LLAMA3},
    {"pixtral", PRE_LLAMA3},
    {"qwen2", PRE_QWEN2},
    {"deepseek-r1-qwen", PRE_QWEN2},
    {"stablelm2", PRE_QWEN2},
    {"megrez", PRE_QWEN2},
};

/* ---- creation and the parts both sources share ---------------------------------- */

static fy_tokenizer_t *tok_new(fy_tokenizer_kind_t kind, const char *src)
{
    fy_tokenizer_t *tok = fy_calloc(1, sizeof(*tok));
    if (!tok) {
        fy_error("tokenizer: %s: out of memory", src);
        return NULL;
    }
    tok->kind = kind;
    tok->bos = tok->eos = tok->unk = -1;
    for (int b = 0; b < 256; b++) tok->byte_tok[b] = -1;
    tok->pcre_gctx = pcre2_general_context_create(pcre_malloc, pcre_free, NULL);
    if (!tok->pcre_gctx) {
        fy_error("tokenizer: %s: out of memory", src);
        fy_free(tok);
        return NULL;
    }
    return tok;
}

void fy_tokenizer_destroy(fy_tokenizer_t *tok)
{
    if (!tok) return;
    for (size_t i = 0; i < tok->n_regex; i++) pcre2_code_free(tok->regex[i]);
    pcre2_general_context_free(tok->pcre_gctx);
    fy_free(tok->user.ids);
    fy_free(tok->specials.ids);
    fy_free(tok->merges);
    fy_free(tok->index);
    fy_free(tok->bytes_pool);
    fy_free(tok->text_pool);
    fy_free(tok->tokens);
    fy_free(tok);
}

/* What each token decodes to, computed once so decoding is a lookup. */
static fy_status_t build_token_bytes(fy_tokenizer_t *tok, const char *src)
{
    /* Decoded bytes are never longer than the text: GPT-2 characters
     * (1-2 bytes) become one byte, "▁" (3 bytes) one space. */
    tok->bytes_size = tok->text_used ? tok->text_used : 1;
    tok->bytes_pool = fy_malloc(tok->bytes_size);
    if (!tok->bytes_pool) {
        fy_error("tokenizer: %s: out of memory for decoded tokens", src);
        return FY_ERR_NOMEM;
    }
    int16_t byte_of_cp[GPT2_CP_LIMIT];
    uint32_t cp_of_byte[256];
    gpt2_byte_table(cp_of_byte);
    memset(byte_of_cp, 0xff, sizeof(byte_of_cp));
    for (int b = 0; b < 256; b++) byte_of_cp[cp_of_byte[b]] = (int16_t)b;

    for (int32_t id = 0; id < tok->n_vocab; id++) {
        tok_entry_t *t = &tok->tokens[id];
        const uint8_t *s = (const uint8_t *)t->text;
        if (t->type == TOK_UNUSED) {
            t->bytes = "";
            t->n_bytes = 0;
            continue;
        }
        if (type_is_special(t->type) || t->type == TOK_USER_DEFINED) { /* as written, as llama.cpp does */
            t->bytes = t->text;
            t->n_bytes = t->len;
            continue;
        }
        char *out = tok->bytes_pool + tok->bytes_used;
        size_t n = 0;
        int byte = t->type == TOK_BYTE ? spm_byte_value(t->text, t->len) : -1;
        if (byte >= 0) {
            out[n++] = (char)byte;
        } else if (tok->kind == FY_TOKENIZER_BPE_BYTE) {
            for (size_t i = 0; i < t->len;) {
                size_t l = utf8_valid_len(s + i, t->len - i);
                uint32_t cp = l ? utf8_decode(s + i, l) : UINT32_MAX;
                if (cp < GPT2_CP_LIMIT && byte_of_cp[cp] >= 0) {
                    out[n++] = (char)byte_of_cp[cp];
                } else { /* not from the byte alphabet: keep as written */
                    l = l ? l : 1;
                    memcpy(out + n, s + i, l);
                    n += l;
                }
                i += l;
            }
        } else {
            for (size_t i = 0; i < t->len;) {
                if (t->len - i >= SPM_SPACE_LEN && memcmp(s + i, SPM_SPACE, SPM_SPACE_LEN) == 0) {
                    out[n++] = ' ';
                    i += SPM_SPACE_LEN;
                } else {
                    out[n++] = (char)s[i++];
                }
            }
        }
        t->bytes = out;
        t->n_bytes = (uint32_t)n;
        tok->bytes_used += n;
    }
    return FY_OK;
}

/* Byte order of a and b; a prefix comes first. */
static int text_cmp(const char *a, size_t alen, const char *b, size_t blen)
{
    int c = memcmp(a, b, FY_MIN(alen, blen));
    return c ? c : alen < blen ? -1 : alen > blen;
}

typedef struct special_ref {
    const char *text;
    uint32_t len;
    int32_t id;
} special_ref_t;

static int special_ref_cmp(const void *pa, const void *pb)
{
    const special_ref_t *a = pa, *b = pb;
    int c = text_cmp(a->text, a->len, b->text, b->len);
    return c ? c : a->id > b->id ? -1 : a->id < b->id; /* the first id last: special_match() takes it */
}

/* The tokens matched whole in text (type_is_matched), bucketed by their
 * first byte. */
static fy_status_t build_special_set(fy_tokenizer_t *tok, special_set_t *set, bool parse_special, const char *src)
{
    size_t n = 0;
    for (int32_t id = 0; id < tok->n_vocab; id++) {
        const tok_entry_t *t = &tok->tokens[id];
        if (t->len && type_is_matched(t->type, parse_special)) n++;
    }
    special_ref_t *refs = fy_calloc(n ? n : 1, sizeof(*refs));
    set->ids = fy_calloc(n ? n : 1, sizeof(*set->ids));
    if (!refs || !set->ids) {
        fy_free(refs);
        fy_error("tokenizer: %s: out of memory for special tokens", src);
        return FY_ERR_NOMEM;
    }
    size_t k = 0;
    for (int32_t id = 0; id < tok->n_vocab; id++) {
        const tok_entry_t *t = &tok->tokens[id];
        if (t->len && type_is_matched(t->type, parse_special))
            refs[k++] = (special_ref_t){.text = t->text, .len = t->len, .id = id};
    }
    qsort(refs, n, sizeof(*refs), special_ref_cmp);
    size_t at = 0;
    for (unsigned c = 0; c < 256; c++) {
        set->at[c] = (uint32_t)at;
        while (at < n && (uint8_t)refs[at].text[0] == c) {
            set->ids[at] = refs[at].id;
            set->max_len = FY_MAX(set->max_len, refs[at].len);
            at++;
        }
    }
    set->at[256] = (uint32_t)n;
    fy_free(refs);
    return FY_OK;
}

static fy_status_t build_specials(fy_tokenizer_t *tok, const char *src)
{
    fy_status_t st = build_special_set(tok, &tok->user, false, src);
    return st == FY_OK ? build_special_set(tok, &tok->specials, true, src) : st;
}

/* End of generation: EOS and the end-of-turn tokens chat models use.
 * Gemma's <start_of_turn> too: its template never opens a turn inside an
 * answer, so a model that emits one has ended its turn without saying so. */
static void mark_eog(fy_tokenizer_t *tok)
{
    static const char *const k_end_of_turn[] = {"<|im_end|>",    "<|eot_id|>",      "<|end|>",        "<|endoftext|>",
                                                "<end_of_turn>", "<|end_of_text|>", "<start_of_turn>"};
    if (tok->eos >= 0) tok->tokens[tok->eos].eog = true;
    for (size_t i = 0; i < FY_ARRAY_LEN(k_end_of_turn); i++) {
        int32_t id = index_find(tok, k_end_of_turn[i], strlen(k_end_of_turn[i]));
        if (id >= 0) tok->tokens[id].eog = true;
    }
}

/*
 * Byte-level vocabularies may lack the characters of rare bytes (SmolLM2
 * lacks 21: some controls, C0, C1, F1, F2, F5-FF).  Such a byte is encoded
 * as U+FFFD, as llama.cpp encodes all invalid UTF-8 (and it drops these
 * bytes): the text changes, but nothing is lost silently and no token
 * outside the text (an unknown or control token) takes its place.
 */
static void spell_bytes(fy_tokenizer_t *tok)
{
    static const uint8_t k_replacement[3] = {0xef, 0xbf, 0xbd}; /* U+FFFD */
    bool can_replace = true;
    for (int i = 0; i < 3; i++) can_replace &= tok->byte_tok[k_replacement[i]] >= 0;
    for (int b = 0; b < 256; b++) {
        if (tok->byte_tok[b] >= 0 || !can_replace) {
            tok->byte_spell[b][0] = (uint8_t)b;
            tok->byte_spell_len[b] = 1;
        } else {
            memcpy(tok->byte_spell[b], k_replacement, 3);
            tok->byte_spell_len[b] = 3;
        }
    }
}

static void find_byte_tokens(fy_tokenizer_t *tok)
{
    if (tok->kind == FY_TOKENIZER_BPE_BYTE) {
        uint32_t cp_of_byte[256];
        gpt2_byte_table(cp_of_byte);
        for (int b = 0; b < 256; b++) {
            tok->byte_char_len[b] = (uint8_t)utf8_encode(cp_of_byte[b], tok->byte_char[b]);
            tok->byte_tok[b] = find_plain(tok, tok->byte_char[b], tok->byte_char_len[b]);
        }
        spell_bytes(tok);
    } else {
        for (int c = 0; c < 128; c++) {
            char ch = (char)c;
            tok->ascii_tok[c] = find_plain(tok, &ch, 1);
        }
        for (int b = 0; b < 256; b++) {
            char name[8];
            snprintf(name, sizeof(name), "<0x%02X>", b);
            int32_t id = index_find(tok, name, 6);
            if (id >= 0 && (tok->tokens[id].type == TOK_BYTE || type_is_plain(tok->tokens[id].type)))
                tok->byte_tok[b] = id;
        }
    }
}

static bool is_spm_space(const char *s, size_t len)
{
    return len >= SPM_SPACE_LEN && memcmp(s, SPM_SPACE, SPM_SPACE_LEN) == 0;
}

/* Whether s[at] starts a "▁" that follows other text: where a word starts. */
static bool spm_word_start(const char *s, size_t len, size_t at)
{
    if (at == 0 || !is_spm_space(s + at, len - at)) return false;
    return !(at >= SPM_SPACE_LEN && is_spm_space(s + at - SPM_SPACE_LEN, SPM_SPACE_LEN));
}

/*
 * Whether some token spans the start of a word ("x▁").  When none does,
 * no merge can cross one, and BPE over each word gives exactly what BPE
 * over the whole text gives, with a small heap that stays in cache
 * instead of one the size of the text.  SentencePiece vocabularies have
 * no such token (pieces never hold a space after other text).
 */
static bool vocab_has_junction(const fy_tokenizer_t *tok)
{
    for (int32_t id = 0; id < tok->n_vocab; id++) {
        const tok_entry_t *t = &tok->tokens[id];
        for (size_t i = 1; i < t->len; i++)
            if (spm_word_start(t->text, t->len, i)) return true;
    }
    return false;
}

/* Everything derived from the loaded vocabulary; the index exists already. */
static fy_status_t tok_finish(fy_tokenizer_t *tok, const char *src)
{
    fy_status_t st = build_token_bytes(tok, src);
    if (st == FY_OK) st = build_specials(tok, src);
    if (st != FY_OK) return st;
    find_byte_tokens(tok);
    mark_eog(tok);
    /* The unknown token stands in for text; a control token (SmolLM2 names
     * <|endoftext|> as unknown_token_id) must never come out of text. */
    if (tok->unk >= 0 && tok->tokens[tok->unk].type != TOK_UNKNOWN) tok->unk = -1;
    for (int32_t id = 0; id < tok->n_vocab && tok->unk < 0; id++)
        if (tok->tokens[id].type == TOK_UNKNOWN) tok->unk = id;
    /* ignore_merges looks at the whole piece, so the piece must stay whole */
    tok->spm_words = tok->kind == FY_TOKENIZER_SPM && !tok->ignore_merges && !vocab_has_junction(tok);
    if (tok->add_bos && tok->bos < 0) {
        fy_warn("tokenizer: %s: the model asks for bos but names no bos token; none is added", src);
        tok->add_bos = false;
    }
    return FY_OK;
}

/* ---- encoding ------------------------------------------------------------------------ */

/* A run of text in the piece being merged; symbols form a linked list. */
typedef struct bpe_sym {
    uint32_t off; /* into the piece */
    uint32_t len; /* 0 once merged into its left neighbour */
    int32_t prev, next;
    int32_t id; /* the token this text is, or -1 */
} bpe_sym_t;

/* A pair of neighbours that could merge. */
typedef struct bpe_cand {
    double key;   /* lower merges first: the merge rank, or minus the token's score */
    int32_t left; /* symbol indices; ties go to the leftmost pair */
    int32_t right;
    uint32_t len; /* left.len + right.len when queued; any other sum means stale */
    int32_t id;   /* the merged token */
} bpe_cand_t;

/* Per-call scratch: encoding never touches the (shared) tokenizer. */
typedef struct enc {
    const fy_tokenizer_t *tok;
    int32_t *out;
    size_t cap;
    size_t n; /* ids produced, including those past cap */
    bpe_sym_t *syms;
    size_t syms_cap;
    bpe_cand_t *heap;
    size_t heap_cap, heap_n;
    char *piece; /* a byte-level piece spelled in GPT-2 characters */
    size_t piece_cap;
    char *norm; /* a normalized fragment */
    size_t norm_cap;
    pcre2_match_data *md;
} enc_t;

static void emit(enc_t *e, int32_t id)
{
    if (e->n < e->cap) e->out[e->n] = id;
    e->n++;
}

static bool grow(void **buf, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return true;
    size_t n = FY_MAX(need, *cap * 2), bytes;
    if (!fy_mul_size(n, elem, &bytes)) return false;
    void *p = fy_realloc(*buf, bytes);
    if (!p) return false;
    *buf = p;
    *cap = n;
    return true;
}

static bool cand_before(const bpe_cand_t *a, const bpe_cand_t *b)
{
    return a->key < b->key || (a->key == b->key && a->left < b->left);
}

/* false: out of memory */
static bool heap_push(enc_t *e, bpe_cand_t c)
{
    if (!grow((void **)&e->heap, &e->heap_cap, e->heap_n + 1, sizeof(*e->heap))) return false;
    size_t i = e->heap_n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!cand_before(&c, &e->heap[parent])) break;
        e->heap[i] = e->heap[parent];
        i = parent;
    }
    e->heap[i] = c;
    return true;
}

static bpe_cand_t heap_pop(enc_t *e)
{
    bpe_cand_t top = e->heap[0];
    bpe_cand_t last = e->heap[--e->heap_n];
    size_t i = 0, n = e->heap_n;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= n) break;
        if (child + 1 < n && cand_before(&e->heap[child + 1], &e->heap[child])) child++;
        if (!cand_before(&e->heap[child], &last)) break;
        e->heap[i] = e->heap[child];
        i = child;
    }
    if (n) e->heap[i] = last;
    return top;
}

/* Queues the pair (l, r) if it can merge; false: out of memory. */
static bool bpe_try_pair(enc_t *e, const char *text, int32_t l, int32_t r)
{
    if (l < 0 || r < 0) return true;
    const fy_tokenizer_t *tok = e->tok;
    const bpe_sym_t *a = &e->syms[l], *b = &e->syms[r];
    bpe_cand_t c = {.left = l, .right = r, .len = a->len + b->len};
    if (tok->merge_by_score) {
        c.id = find_plain(tok, text + a->off, c.len);
        if (c.id < 0) return true;
        c.key = -(double)tok->tokens[c.id].score;
    } else {
        int32_t rank;
        if (a->id < 0 || b->id < 0 || !merge_find(tok, a->id, b->id, &rank, &c.id)) return true;
        c.key = rank;
    }
    return heap_push(e, c);
}

/*
 * Merges the n symbols e->syms[0..n) of text, best pair first, then
 * emits their tokens.  Symbols that are not tokens fall back to byte
 * tokens, or to the unknown token where the vocabulary lacks those.
 */
static fy_status_t bpe_merge_emit(enc_t *e, const char *text, size_t n, bool byte_fallback)
{
    const fy_tokenizer_t *tok = e->tok;
    bool ok = true;
    e->heap_n = 0;
    for (size_t i = 1; i < n && ok; i++) ok = bpe_try_pair(e, text, (int32_t)i - 1, (int32_t)i);
    while (ok && e->heap_n) {
        bpe_cand_t c = heap_pop(e);
        bpe_sym_t *a = &e->syms[c.left], *b = &e->syms[c.right];
        if (a->len == 0 || b->len == 0 || a->len + b->len != c.len) continue;
        a->len += b->len;
        a->id = c.id;
        b->len = 0;
        a->next = b->next;
        if (b->next >= 0) e->syms[b->next].prev = c.left;
        ok = bpe_try_pair(e, text, a->prev, c.left) && bpe_try_pair(e, text, c.left, a->next);
    }
    if (!ok) {
        fy_error("tokenizer: out of memory merging a piece of %zu symbols", n);
        return FY_ERR_NOMEM;
    }
    for (int32_t i = 0; i >= 0; i = e->syms[i].next) {
        const bpe_sym_t *s = &e->syms[i];
        if (s->id >= 0) {
            emit(e, s->id);
            continue;
        }
        /* byte-level: the symbol is one GPT-2 character whose byte has no
         * token, and U+FFFD had none either (see spell_bytes()) */
        if (!byte_fallback) {
            if (tok->unk >= 0) emit(e, tok->unk);
            continue;
        }
        for (uint32_t k = 0; k < s->len; k++) {
            int32_t id = tok->byte_tok[(uint8_t)text[s->off + k]];
            if (id < 0) id = tok->unk;
            if (id >= 0) emit(e, id);
        }
    }
    return FY_OK;
}

/* Room for n symbols, and for their first candidate pairs (merges add more). */
static fy_status_t enc_reserve(enc_t *e, size_t n_syms)
{
    if (!grow((void **)&e->syms, &e->syms_cap, n_syms, sizeof(*e->syms)) ||
        !grow((void **)&e->heap, &e->heap_cap, n_syms, sizeof(*e->heap))) {
        fy_error("tokenizer: out of memory encoding a piece of %zu symbols", n_syms);
        return FY_ERR_NOMEM;
    }
    return FY_OK;
}

/* A byte-level piece: each byte becomes its GPT-2 character, then BPE. */
static fy_status_t encode_piece_bytes(enc_t *e, const uint8_t *p, size_t len)
{
    const fy_tokenizer_t *tok = e->tok;
    size_t n_syms = 0; /* a byte is spelled by 1 or 3 bytes, each a character of 1 or 2 */
    for (size_t i = 0; i < len; i++) n_syms += tok->byte_spell_len[p[i]];
    fy_status_t st = enc_reserve(e, n_syms);
    if (st != FY_OK) return st;
    if (!grow((void **)&e->piece, &e->piece_cap, 2 * n_syms, 1)) {
        fy_error("tokenizer: out of memory encoding a piece of %zu bytes", len);
        return FY_ERR_NOMEM;
    }
    uint32_t off = 0;
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        for (uint8_t k = 0; k < tok->byte_spell_len[p[i]]; k++, n++) {
            uint8_t b = tok->byte_spell[p[i]][k];
            memcpy(e->piece + off, tok->byte_char[b], tok->byte_char_len[b]);
            e->syms[n] = (bpe_sym_t){.off = off,
                                     .len = tok->byte_char_len[b],
                                     .prev = (int32_t)n - 1,
                                     .next = (int32_t)n + 1,
                                     .id = tok->byte_tok[b]};
            off += tok->byte_char_len[b];
        }
    }
    e->syms[n - 1].next = -1;
    if (tok->ignore_merges) {
        int32_t id = find_plain(tok, e->piece, off);
        if (id >= 0) {
            emit(e, id);
            return FY_OK;
        }
    }
    return bpe_merge_emit(e, e->piece, n, false);
}

/* An SPM piece: one symbol per UTF-8 character (or invalid byte), then BPE. */
static fy_status_t encode_piece_chars(enc_t *e, const char *s, size_t len)
{
    const fy_tokenizer_t *tok = e->tok;
    fy_status_t st = enc_reserve(e, len);
    if (st != FY_OK) return st;
    if (tok->ignore_merges) {
        int32_t id = find_plain(tok, s, len);
        if (id >= 0) {
            emit(e, id);
            return FY_OK;
        }
    }
    size_t n = 0;
    for (size_t off = 0; off < len; n++) {
        uint8_t c = (uint8_t)s[off];
        size_t l = c < 0x80 ? 1 : utf8_valid_len((const uint8_t *)s + off, len - off);
        if (!l) l = 1;
        int32_t id = c < 0x80 ? tok->ascii_tok[c] : find_plain(tok, s + off, l);
        e->syms[n] = (bpe_sym_t){
            .off = (uint32_t)off, .len = (uint32_t)l, .prev = (int32_t)n - 1, .next = (int32_t)n + 1, .id = id};
        off += l;
    }
    e->syms[n - 1].next = -1;
    return bpe_merge_emit(e, s, n, true);
}

static fy_status_t encode_piece(enc_t *e, const char *s, size_t len)
{
    if (e->tok->kind == FY_TOKENIZER_BPE_BYTE) return encode_piece_bytes(e, (const uint8_t *)s, len);
    if (!e->tok->spm_words) return encode_piece_chars(e, s, len);
    fy_status_t st = FY_OK;
    size_t word = 0;
    for (size_t i = 1; i < len && st == FY_OK; i++) {
        if (spm_word_start(s, len, i)) {
            st = encode_piece_chars(e, s + word, i - word);
            word = i;
        }
    }
    return st == FY_OK ? encode_piece_chars(e, s + word, len - word) : st;
}

/*
 * Splits s with regex number level into its matches and the gaps between
 * them (Hugging Face's "Isolated" behaviour), and passes each part on to
 * the next regex; after the last one the parts are pieces for BPE.
 */
static fy_status_t split(enc_t *e, const char *s, size_t len, size_t level)
{
    const fy_tokenizer_t *tok = e->tok;
    if (level == tok->n_regex) return encode_piece(e, s, len);
    fy_status_t st = FY_OK;
    size_t pos = 0, gap = 0;
    while (pos < len && st == FY_OK) {
        int rc = pcre2_match(tok->regex[level], (PCRE2_SPTR)s, len, pos, 0, e->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof(msg));
            fy_error("tokenizer: pre-tokenizer regex %zu failed on a %zu-byte piece: %s", level, len,
                     (const char *)msg);
            /* otherwise a limit of the regex engine, which the built-in
             * regexes have never reached (they are linear) */
            return rc == PCRE2_ERROR_NOMEMORY ? FY_ERR_NOMEM : FY_ERR_INVALID;
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        size_t start = ov[0], end = ov[1];
        if (end == start) { /* an empty match splits nothing: look again one character on */
            size_t l = utf8_valid_len((const uint8_t *)s + start, len - start);
            pos = start + (l ? l : 1);
            continue;
        }
        if (start > gap) st = split(e, s + gap, start - gap, level + 1);
        if (st == FY_OK) st = split(e, s + start, end - start, level + 1);
        pos = gap = end;
    }
    if (st == FY_OK && gap < len) st = split(e, s + gap, len - gap, level + 1);
    return st;
}

/* A run of plain text between special tokens; at_start: it opens the text. */
static fy_status_t encode_fragment(enc_t *e, const char *s, size_t len, bool at_start)
{
    const fy_tokenizer_t *tok = e->tok;
    bool prefix = false;
    if (tok->kind == FY_TOKENIZER_SPM) {
        prefix = tok->spm_prefix == SPM_PREFIX_ALWAYS || (tok->spm_prefix == SPM_PREFIX_FIRST && at_start);
        if (tok->spm_prefix_unless_space && s[0] == ' ') prefix = false;
    } else {
        prefix = tok->byte_prefix_space && s[0] != ' ';
    }
    size_t spaces = 0;
    if (tok->kind == FY_TOKENIZER_SPM && tok->spm_replace_space)
        for (size_t i = 0; i < len; i++) spaces += s[i] == ' ';
    if (!prefix && !spaces) return split(e, s, len, 0);

    const char *space = tok->kind == FY_TOKENIZER_SPM ? SPM_SPACE : " ";
    size_t space_len = tok->kind == FY_TOKENIZER_SPM ? SPM_SPACE_LEN : 1;
    size_t need = (prefix ? space_len : 0) + len + spaces * (space_len - 1);
    if (!grow((void **)&e->norm, &e->norm_cap, need, 1)) {
        fy_error("tokenizer: out of memory normalizing %zu bytes", len);
        return FY_ERR_NOMEM;
    }
    size_t n = 0;
    if (prefix) {
        memcpy(e->norm, space, space_len);
        n = space_len;
    }
    for (size_t i = 0; i < len; i++) {
        if (spaces && s[i] == ' ') {
            memcpy(e->norm + n, space, space_len);
            n += space_len;
        } else {
            e->norm[n++] = s[i];
        }
    }
    return split(e, e->norm, n, 0);
}

/*
 * The longest token of set at s, or -1.  The last token not after the key
 * (s, cut to the longest token) in byte order is the longest match when
 * it is a prefix of the key; when it is not, no match is longer than what
 * it shares with the key, so the key is cut to that and the search runs
 * again.  A few binary searches, where a scan would compare each of
 * Gemma's 6,000 "<unused…>" tokens at every "<".
 */
static int32_t special_match(const fy_tokenizer_t *tok, const special_set_t *set, const char *s, size_t len,
                             size_t *match_len_p)
{
    uint8_t c = (uint8_t)s[0];
    uint32_t first = set->at[c], end = set->at[c + 1];
    size_t key = FY_MIN(len, (size_t)set->max_len);
    while (first < end && key > 0) {
        uint32_t lo = first, hi = end; /* the first token after the key */
        while (lo < hi) {
            uint32_t mid = lo + (hi - lo) / 2;
            const tok_entry_t *t = &tok->tokens[set->ids[mid]];
            if (text_cmp(t->text, t->len, s, key) <= 0)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo == first) return -1;
        const tok_entry_t *t = &tok->tokens[set->ids[lo - 1]];
        size_t shared = 0;
        while (shared < t->len && shared < key && t->text[shared] == s[shared]) shared++;
        if (shared == t->len) {
            *match_len_p = t->len;
            return set->ids[lo - 1];
        }
        key = shared; /* < key: t is no prefix of the key, and not after it */
        end = lo - 1; /* what comes after t comes after the shorter key too */
    }
    return -1;
}

static fy_status_t encode_text(enc_t *e, const char *text, size_t len, bool parse_special)
{
    const fy_tokenizer_t *tok = e->tok;
    const special_set_t *set = parse_special ? &tok->specials : &tok->user;
    fy_status_t st = FY_OK;
    size_t frag = 0; /* start of the plain text not yet encoded */
    if (set->at[256] > 0) {
        for (size_t i = 0; i < len && st == FY_OK;) {
            size_t match_len;
            int32_t id = special_match(tok, set, text + i, len - i, &match_len);
            if (id < 0) {
                i++;
                continue;
            }
            if (i > frag) st = encode_fragment(e, text + frag, i - frag, frag == 0);
            emit(e, id);
            i += match_len;
            frag = i;
        }
    }
    if (st == FY_OK && frag < len) st = encode_fragment(e, text + frag, len - frag, frag == 0);
    return st;
}

fy_status_t fy_tokenizer_encode(const fy_tokenizer_t *tok, const char *text, size_t len, bool add_bos,
                                bool parse_special, int32_t *tokens, size_t max_tokens, size_t *n_p)
{
    if (!tok || (!text && len) || (!tokens && max_tokens) || !n_p) return FY_ERR_INVALID;
    if (len > TOK_MAX_TEXT) {
        fy_error("tokenizer: text of %zu bytes is longer than the %d bytes one call encodes", len, TOK_MAX_TEXT);
        return FY_ERR_INVALID;
    }
    enc_t e = {.tok = tok, .out = tokens, .cap = max_tokens};
    if (add_bos && tok->add_bos) emit(&e, tok->bos);
    fy_status_t st = FY_OK;
    if (len) {
        e.md = pcre2_match_data_create(1, tok->pcre_gctx); /* only the whole match's offsets */
        if (!e.md) {
            fy_error("tokenizer: out of memory encoding %zu bytes", len);
            return FY_ERR_NOMEM;
        }
        st = encode_text(&e, text, len, parse_special);
        pcre2_match_data_free(e.md);
        fy_free(e.norm);
        fy_free(e.piece);
        fy_free(e.heap);
        fy_free(e.syms);
    }
    if (st != FY_OK) return st;
    *n_p = e.n;
    return e.n > max_tokens ? FY_ERR_NO_SPACE : FY_OK;
}

/* ---- decoding ------------------------------------------------------------------------ */

size_t fy_tokenizer_max_token_text(const fy_tokenizer_t *tok)
{
    /* a byte is dropped when it has no token, is not spelled as U+FFFD
     * (byte-level, spell_bytes()) and there is no unknown token */
    for (int b = 0; b < 256 && tok->unk < 0; b++)
        if (tok->byte_tok[b] < 0 && !(tok->kind == FY_TOKENIZER_BPE_BYTE && tok->byte_spell_len[b] == 3)) return 0;
    size_t most = 4;
    for (int32_t id = 0; id < tok->n_vocab; id++) {
        const tok_entry_t *t = &tok->tokens[id];
        most = FY_MAX(most, (size_t)FY_MAX(t->len, t->n_bytes));
    }
    return most;
}

void fy_tokenizer_token_bytes(const fy_tokenizer_t *tok, int32_t id, bool render_special, const char **bytes_p,
                              size_t *len_p)
{
    *bytes_p = "";
    *len_p = 0;
    if (id < 0 || id >= tok->n_vocab) return;
    const tok_entry_t *t = &tok->tokens[id];
    if (type_is_special(t->type) && !render_special) return;
    *bytes_p = t->bytes;
    *len_p = t->n_bytes;
}

/* A token's output bytes in a stream; the first non-empty one of an SPM
 * stream loses the space the encoder put in front of the text. */
static void stream_bytes(const fy_tokenizer_t *tok, int32_t id, bool render_special, bool *at_start,
                         const char **bytes_p, size_t *len_p)
{
    fy_tokenizer_token_bytes(tok, id, render_special, bytes_p, len_p);
    if (*len_p == 0 || !*at_start) return;
    *at_start = false;
    if (tok->kind == FY_TOKENIZER_SPM && tok->spm_prefix != SPM_PREFIX_NONE && (*bytes_p)[0] == ' ') {
        (*bytes_p)++;
        (*len_p)--;
    }
}

size_t fy_tokenizer_decode(const fy_tokenizer_t *tok, const int32_t *tokens, size_t n, bool render_special, char *out,
                           size_t cap)
{
    size_t total = 0;
    bool at_start = true;
    for (size_t i = 0; i < n; i++) {
        const char *b;
        size_t len;
        stream_bytes(tok, tokens[i], render_special, &at_start, &b, &len);
        if (cap && total < cap - 1) memcpy(out + total, b, FY_MIN(len, cap - 1 - total));
        total += len;
    }
    if (cap) out[FY_MIN(total, cap - 1)] = '\0';
    return total;
}

void fy_detok_init(fy_detok_t *d, const fy_tokenizer_t *tok, bool render_special)
{
    d->tok = tok;
    d->render_special = render_special;
    d->at_start = true;
    d->n_held = 0;
}

/*
 * How many bytes at the end of s[0..n) are the start of a UTF-8 sequence
 * that the next bytes could still complete.  A sequence that can never
 * be valid is not held: holding it would only delay the same bytes.
 */
static size_t utf8_incomplete_tail(const uint8_t *s, size_t n)
{
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        const uint8_t *lead = s + n - k;
        if ((*lead & 0xc0) == 0x80) continue; /* continuation: the lead is further back */
        size_t need = *lead >= 0xc2 && *lead <= 0xdf   ? 2
                      : *lead >= 0xe0 && *lead <= 0xef ? 3
                      : *lead >= 0xf0 && *lead <= 0xf4 ? 4
                                                       : 0;
        if (need <= k) return 0;
        if (k >= 2) { /* the second byte's range depends on the lead */
            uint8_t lo = *lead == 0xe0 ? 0xa0 : *lead == 0xf0 ? 0x90 : 0x80;
            uint8_t hi = *lead == 0xed ? 0x9f : *lead == 0xf4 ? 0x8f : 0xbf;
            if (lead[1] < lo || lead[1] > hi) return 0;
        }
        return k;
    }
    return 0;
}

size_t fy_detok_push(fy_detok_t *d, int32_t id, char *out, size_t cap)
{
    const char *b;
    size_t len;
    stream_bytes(d->tok, id, d->render_special, &d->at_start, &b, &len);
    /* the stream so far ends with held ‖ b; only its last 3 bytes can be held */
    size_t total = d->n_held + len;
    uint8_t tail[3];
    size_t n_tail = FY_MIN(total, sizeof(tail));
    for (size_t i = 0; i < n_tail; i++) {
        size_t at = total - n_tail + i;
        tail[i] = at < d->n_held ? d->held[at] : (uint8_t)b[at - d->n_held];
    }
    size_t hold = utf8_incomplete_tail(tail, n_tail);
    size_t ready = total - hold, n = 0;
    size_t from_held = FY_MIN((size_t)d->n_held, ready);
    n = FY_MIN(from_held, cap);
    memcpy(out, d->held, n);
    if (ready > from_held) {
        size_t more = FY_MIN(ready - from_held, cap - n);
        memcpy(out + n, b, more);
        n += more;
    }
    memcpy(d->held, tail + n_tail - hold, hold);
    d->n_held = (uint8_t)hold;
    return n;
}

size_t fy_detok_flush(fy_detok_t *d, char *out, size_t cap)
{
    size_t n = FY_MIN((size_t)d->n_held, cap);
    memcpy(out, d->held, n);
    d->n_held = 0;
    return n;
}

/* ---- queries ------------------------------------------------------------------------- */

fy_tokenizer_kind_t fy_tokenizer_kind(const fy_tokenizer_t *tok) { return tok->kind; }
int32_t fy_tokenizer_vocab_size(const fy_tokenizer_t *tok) { return tok->n_vocab; }
int32_t fy_tokenizer_bos(const fy_tokenizer_t *tok) { return tok->bos; }
int32_t fy_tokenizer_eos(const fy_tokenizer_t *tok) { return tok->eos; }
bool fy_tokenizer_wants_bos(const fy_tokenizer_t *tok) { return tok->add_bos; }

bool fy_tokenizer_is_eog(const fy_tokenizer_t *tok, int32_t id)
{
    return id >= 0 && id < tok->n_vocab && tok->tokens[id].eog;
}

bool fy_tokenizer_is_special(const fy_tokenizer_t *tok, int32_t id)
{
    return id >= 0 && id < tok->n_vocab && type_is_special(tok->tokens[id].type);
}

int32_t fy_tokenizer_find(const fy_tokenizer_t *tok, const char *text) { return index_find(tok, text, strlen(text)); }

const char *fy_tokenizer_piece(const fy_tokenizer_t *tok, int32_t id)
{
    return id >= 0 && id < tok->n_vocab ? tok->tokens[id].text : NULL;
}

/* ---- GGUF ---------------------------------------------------------------------------- */

static fy_status_t gguf_load_vocab(fy_tokenizer_t *tok, const fy_gguf_t *gguf, const char *src)
{
    fy_str_t *texts = NULL;
    int32_t *types = NULL;
    float *scores = NULL;
    uint64_t n = 0, n_types = 0, n_scores = 0;

    fy_status_t st = fy_gguf_get_str_arr(gguf, "tokenizer.ggml.tokens", &texts, &n);
    if (st == FY_ERR_NOT_FOUND) fy_error("tokenizer: %s: no tokenizer.ggml.tokens array", src);
    if (st != FY_OK) return st == FY_ERR_NOT_FOUND ? FY_ERR_FORMAT : st;
    if (n == 0 || n > TOK_MAX_VOCAB) {
        fy_error("tokenizer: %s: tokenizer.ggml.tokens has %llu tokens (ferry takes 1 to %d)", src,
                 (unsigned long long)n, TOK_MAX_VOCAB);
        st = FY_ERR_FORMAT;
        goto out;
    }
    st = fy_gguf_get_i32_arr(gguf, "tokenizer.ggml.token_type", &types, &n_types);
    if (st == FY_ERR_NOT_FOUND) {
        st = FY_OK; /* every token normal */
    } else if (st != FY_OK) {
        goto out;
    } else if (n_types != n) {
        fy_error("tokenizer: %s: tokenizer.ggml.token_type has %llu entries for %llu tokens", src,
                 (unsigned long long)n_types, (unsigned long long)n);
        st = FY_ERR_FORMAT;
        goto out;
    }
    st = fy_gguf_get_f32_arr(gguf, "tokenizer.ggml.scores", &scores, &n_scores);
    if (st == FY_ERR_NOT_FOUND && tok->kind == FY_TOKENIZER_SPM) {
        fy_error("tokenizer: %s: sentencepiece model without tokenizer.ggml.scores", src);
        st = FY_ERR_FORMAT;
        goto out;
    } else if (st == FY_ERR_NOT_FOUND) {
        st = FY_OK;
    } else if (st != FY_OK) {
        goto out;
    } else if (n_scores != n) {
        fy_error("tokenizer: %s: tokenizer.ggml.scores has %llu entries for %llu tokens", src,
                 (unsigned long long)n_scores, (unsigned long long)n);
        st = FY_ERR_FORMAT;
        goto out;
    }

    size_t text_bytes = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (texts[i].len > TOK_MAX_TOKEN_LEN) {
            fy_error("tokenizer: %s: token %llu is %llu bytes long", src, (unsigned long long)i,
                     (unsigned long long)texts[i].len);
            st = FY_ERR_FORMAT;
            goto out;
        }
        if (types && (types[i] < 0 || types[i] >= TOK_TYPE_COUNT)) {
            fy_error("tokenizer: %s: token %llu has unknown token_type %d", src, (unsigned long long)i, types[i]);
            st = FY_ERR_FORMAT;
            goto out;
        }
        text_bytes += texts[i].len;
    }
    st = vocab_alloc(tok, (int32_t)n, n, text_bytes, src);
    if (st != FY_OK) goto out;
    for (uint64_t i = 0; i < n; i++)
        vocab_set(tok, (int32_t)i, texts[i].ptr, texts[i].len, types ? (uint8_t)types[i] : TOK_NORMAL,
                  scores ? scores[i] : 0.0f);
    st = vocab_index(tok, src);
out:
    fy_free(scores);
    fy_free(types);
    fy_free(texts);
    return st;
}

static fy_status_t gguf_load_merges(fy_tokenizer_t *tok, const fy_gguf_t *gguf, const char *src)
{
    fy_str_t *merges;
    uint64_t n;
    fy_status_t st = fy_gguf_get_str_arr(gguf, "tokenizer.ggml.merges", &merges, &n);
    if (st == FY_ERR_NOT_FOUND) fy_error("tokenizer: %s: byte-level bpe model without tokenizer.ggml.merges", src);
    if (st != FY_OK) return st == FY_ERR_NOT_FOUND ? FY_ERR_FORMAT : st;
    st = merges_alloc(tok, n, src);
    for (uint64_t i = 0; i < n && st == FY_OK; i++) st = merge_add_joined(tok, i, merges[i].ptr, merges[i].len, src);
    fy_free(merges);
    return st;
}

/* tokenizer.ggml.pre selects the regexes; add_bos_p gets the group's default. */
static fy_status_t gguf_load_pre(fy_tokenizer_t *tok, const fy_gguf_t *gguf, bool *add_bos_p, const char *src)
{
    fy_str_t pre;
    int group = -1;
    fy_status_t st = fy_gguf_get_str(gguf, "tokenizer.ggml.pre", &pre);
    if (st == FY_ERR_NOT_FOUND) {
        fy_warn("tokenizer: %s: no tokenizer.ggml.pre; using the gpt-2 pre-tokenizer", src);
        group = PRE_GPT2;
        st = FY_OK;
    } else if (st != FY_OK) {
        return st;
    }
    for (size_t i = 0; group < 0 && i < FY_ARRAY_LEN(k_pre_names); i++)
        if (fy_str_eq(pre, k_pre_names[i].name)) group = k_pre_names[i].group;
    if (group < 0) {
        fy_warn("tokenizer: %s: unknown tokenizer.ggml.pre '%.*s'; using the gpt-2 pre-tokenizer", src,
                log_len(pre.len), pre.ptr);
        group = PRE_GPT2;
    }
    const pre_group_t *g = &k_pre_groups[group];
    for (size_t i = 0; i < FY_ARRAY_LEN(g->regex) && g->regex[i] && st == FY_OK; i++)
        st = regex_add_str(tok, g->regex[i], src);
    tok->ignore_merges = g->ignore_merges;
    *add_bos_p = g->add_bos;
    return st;
}

/* An optional token id key; out of range is a fault. */
static fy_status_t gguf_token_id(const fy_tokenizer_t *tok, const fy_gguf_t *gguf, const char *key, int32_t *id_p,
                                 const char *src)
{
    uint32_t v;
    fy_status_t st = fy_gguf_get_u32(gguf, key, &v);
    if (st == FY_ERR_NOT_FOUND) return FY_OK;
    if (st != FY_OK) return st;
    if (v >= (uint32_t)tok->n_vocab) {
        fy_error("tokenizer: %s: %s = %u is outside the vocabulary of %d tokens", src, key, v, tok->n_vocab);
        return FY_ERR_FORMAT;
    }
    *id_p = (int32_t)v;
    return FY_OK;
}

static fy_status_t gguf_bool(const fy_gguf_t *gguf, const char *key, bool *value_p)
{
    fy_status_t st = fy_gguf_get_bool(gguf, key, value_p);
    return st == FY_ERR_NOT_FOUND ? FY_OK : st;
}

fy_status_t fy_tokenizer_from_gguf(const fy_gguf_t *gguf, fy_tokenizer_t **tok_p)
{
    const char *src = fy_gguf_path(gguf);
    fy_str_t model;
    fy_status_t st = fy_gguf_get_str(gguf, "tokenizer.ggml.model", &model);
    if (st == FY_ERR_NOT_FOUND) {
        fy_error("tokenizer: %s: no tokenizer.ggml.model", src);
        return FY_ERR_FORMAT;
    }
    if (st != FY_OK) return st;
    fy_tokenizer_kind_t kind;
    if (fy_str_eq(model, "gpt2")) {
        kind = FY_TOKENIZER_BPE_BYTE;
    } else if (fy_str_eq(model, "llama")) {
        kind = FY_TOKENIZER_SPM;
    } else {
        fy_error("tokenizer: %s: unsupported tokenizer model '%.*s' (ferry reads 'gpt2' and 'llama')", src,
                 log_len(model.len), model.ptr);
        return FY_ERR_UNSUPPORTED;
    }
    fy_tokenizer_t *tok = tok_new(kind, src);
    if (!tok) return FY_ERR_NOMEM;

    bool add_bos = kind == FY_TOKENIZER_SPM;
    int32_t eot = -1; /* end of turn, named by some converters */
    st = gguf_load_vocab(tok, gguf, src);
    if (st != FY_OK) goto fail;
    if (kind == FY_TOKENIZER_BPE_BYTE) {
        st = gguf_load_merges(tok, gguf, src);
        if (st == FY_OK) st = gguf_load_pre(tok, gguf, &add_bos, src);
    } else {
        bool add_space_prefix = true;
        tok->merge_by_score = true;
        tok->spm_replace_space = true;
        st = gguf_bool(gguf, "tokenizer.ggml.add_space_prefix", &add_space_prefix);
        tok->spm_prefix = add_space_prefix ? SPM_PREFIX_ALWAYS : SPM_PREFIX_NONE;
    }
    if (st == FY_OK) st = gguf_token_id(tok, gguf, "tokenizer.ggml.bos_token_id", &tok->bos, src);
    if (st == FY_OK) st = gguf_token_id(tok, gguf, "tokenizer.ggml.eos_token_id", &tok->eos, src);
    if (st == FY_OK) st = gguf_token_id(tok, gguf, "tokenizer.ggml.unknown_token_id", &tok->unk, src);
    if (st == FY_OK) st = gguf_token_id(tok, gguf, "tokenizer.ggml.eot_token_id", &eot, src);
    if (st == FY_OK) st = gguf_bool(gguf, "tokenizer.ggml.add_bos_token", &add_bos);
    if (st != FY_OK) goto fail;
    tok->add_bos = add_bos;
    st = tok_finish(tok, src);
    if (st != FY_OK) goto fail;
    if (eot >= 0) tok->tokens[eot].eog = true;
    *tok_p = tok;
    return FY_OK;
fail:
    fy_tokenizer_destroy(tok);
    return st;
}

/* ---- tokenizer.json -------------------------------------------------------------------- */

/*
 * jansson allocates with malloc: its allocator hooks are process-wide, and
 * ferry keeps no global state beyond logging.  The json tree lives only
 * while the tokenizer is built; everything kept is copied into fy_malloc
 * memory.
 */

static const char *json_type_of(const json_t *node) { return json_string_value(json_object_get(node, "type")); }

/* Whether node, or a component of a Sequence under it, has the given type. */
static bool json_has_type(const json_t *node, const char *type)
{
    if (!json_is_object(node)) return false;
    const char *t = json_type_of(node);
    if (t && strcmp(t, type) == 0) return true;
    static const char *const k_lists[] = {"pretokenizers", "normalizers", "decoders", "processors"};
    for (size_t i = 0; i < FY_ARRAY_LEN(k_lists); i++) {
        const json_t *list = json_object_get(node, k_lists[i]);
        size_t k;
        const json_t *item;
        json_array_foreach(list, k, item) if (json_has_type(item, type)) return true;
    }
    return false;
}

static bool json_str_is(const json_t *node, const char *s)
{
    return json_is_string(node) && json_string_length(node) == strlen(s) && strcmp(json_string_value(node), s) == 0;
}

/* A boolean member, or def when it is absent or null. */
static bool json_flag(const json_t *obj, const char *key, bool def)
{
    const json_t *v = json_object_get(obj, key);
    return json_is_boolean(v) ? json_is_true(v) : def;
}

static fy_status_t json_unsupported(const char *src, const char *what, const char *type)
{
    fy_error("tokenizer: %s: unsupported %s '%s'", src, what, type ? type : "(no type)");
    return FY_ERR_UNSUPPORTED;
}

static bool json_is_prepend_space(const json_t *node)
{
    const char *type = json_type_of(node);
    return type && strcmp(type, "Prepend") == 0 && json_str_is(json_object_get(node, "prepend"), SPM_SPACE);
}

static bool json_is_replace_space(const json_t *node)
{
    const char *type = json_type_of(node);
    return type && strcmp(type, "Replace") == 0 &&
           json_str_is(json_object_get(json_object_get(node, "pattern"), "String"), " ") &&
           json_str_is(json_object_get(node, "content"), SPM_SPACE);
}

/* Whether the normalizer writes spaces as "▁", as Llama-2's does. */
static bool json_normalizer_is_spm(const json_t *node)
{
    size_t i;
    const json_t *item;
    json_array_foreach(json_object_get(node, "normalizers"), i, item) if (json_normalizer_is_spm(item)) return true;
    return json_is_prepend_space(node) || json_is_replace_space(node);
}

static fy_status_t json_normalizer(fy_tokenizer_t *tok, const json_t *node, const char *src)
{
    if (!node || json_is_null(node)) return FY_OK;
    const char *type = json_type_of(node);
    if (type && strcmp(type, "Sequence") == 0) {
        size_t i;
        const json_t *item;
        json_array_foreach(json_object_get(node, "normalizers"), i, item)
        {
            fy_status_t st = json_normalizer(tok, item, src);
            if (st != FY_OK) return st;
        }
        return FY_OK;
    }
    if (json_is_prepend_space(node)) {
        tok->spm_prefix = SPM_PREFIX_ALWAYS;
        return FY_OK;
    }
    if (json_is_replace_space(node)) {
        tok->spm_replace_space = true;
        return FY_OK;
    }
    if (type && (strcmp(type, "NFC") == 0 || strcmp(type, "NFKC") == 0)) {
        fy_warn("tokenizer: %s: %s normalizer not applied; text is taken as already normalized", src, type);
        return FY_OK;
    }
    return json_unsupported(src, "normalizer", type);
}

static fy_status_t json_pre_tokenizer(fy_tokenizer_t *tok, const json_t *node, const char *src)
{
    if (!node || json_is_null(node)) return FY_OK;
    const char *type = json_type_of(node);
    if (!type) return json_unsupported(src, "pre_tokenizer", NULL);
    if (strcmp(type, "Sequence") == 0) {
        size_t i;
        const json_t *item;
        json_array_foreach(json_object_get(node, "pretokenizers"), i, item)
        {
            fy_status_t st = json_pre_tokenizer(tok, item, src);
            if (st != FY_OK) return st;
        }
        return FY_OK;
    }
    if (strcmp(type, "ByteLevel") == 0) {
        tok->byte_prefix_space = json_flag(node, "add_prefix_space", true);
        return json_flag(node, "use_regex", true) ? regex_add_str(tok, RX_GPT2, src) : FY_OK;
    }
    if (strcmp(type, "Digits") == 0)
        return regex_add_str(tok, json_flag(node, "individual_digits", false) ? "\\p{N}" : "\\p{N}+", src);
    if (strcmp(type, "Split") == 0) {
        const json_t *pattern = json_object_get(node, "pattern");
        const json_t *regex = json_object_get(pattern, "Regex");
        const json_t *literal = json_object_get(pattern, "String");
        const json_t *p = json_is_string(regex) ? regex : literal;
        if (!json_is_string(p)) {
            fy_error("tokenizer: %s: Split pre_tokenizer without a Regex or String pattern", src);
            return FY_ERR_FORMAT;
        }
        if (!json_str_is(json_object_get(node, "behavior"), "Isolated"))
            return json_unsupported(src, "Split behavior", json_string_value(json_object_get(node, "behavior")));
        if (json_flag(node, "invert", false)) return json_unsupported(src, "Split option", "invert");
        return regex_add(tok, json_string_value(p), json_string_length(p), p == literal, src);
    }
    if (strcmp(type, "Metaspace") == 0) {
        const json_t *scheme = json_object_get(node, "prepend_scheme");
        const json_t *repl = json_object_get(node, "replacement");
        if (repl && !json_str_is(repl, SPM_SPACE))
            return json_unsupported(src, "Metaspace replacement", json_string_value(repl));
        tok->spm_replace_space = true;
        tok->spm_prefix_unless_space = true;
        if (json_str_is(scheme, "first"))
            tok->spm_prefix = SPM_PREFIX_FIRST;
        else if (json_str_is(scheme, "never"))
            tok->spm_prefix = SPM_PREFIX_NONE;
        else if (json_str_is(scheme, "always") || json_flag(node, "add_prefix_space", true))
            tok->spm_prefix = SPM_PREFIX_ALWAYS;
        /* split: each "▁" starts a new piece */
        return json_flag(node, "split", true) ? regex_add_str(tok, SPM_SPACE "[^" SPM_SPACE "]*", src) : FY_OK;
    }
    return json_unsupported(src, "pre_tokenizer", type);
}

static fy_status_t json_token_id(const json_t *v, const char *what, const char *src, int32_t *id_p)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= TOK_MAX_VOCAB) {
        fy_error("tokenizer: %s: %s has no valid id (0 to %d)", src, what, TOK_MAX_VOCAB - 1);
        return FY_ERR_FORMAT;
    }
    *id_p = (int32_t)json_integer_value(v);
    return FY_OK;
}

/* Fills the vocabulary from model.vocab and added_tokens. */
static fy_status_t json_load_vocab(fy_tokenizer_t *tok, json_t *vocab, const json_t *added, bool byte_fallback,
                                   const char *src)
{
    int32_t n = 0;
    size_t text_bytes = 0, n_strings = json_object_size(vocab) + json_array_size(added);
    const char *key;
    const json_t *value, *item;
    size_t i;
    json_object_foreach(vocab, key, value)
    {
        int32_t id;
        fy_status_t st = json_token_id(value, "a vocab entry", src, &id);
        if (st != FY_OK) return st;
        n = FY_MAX(n, id + 1);
        text_bytes += strlen(key);
    }
    json_array_foreach(added, i, item)
    {
        int32_t id;
        fy_status_t st = json_token_id(json_object_get(item, "id"), "an added token", src, &id);
        if (st != FY_OK) return st;
        if (!json_is_string(json_object_get(item, "content"))) {
            fy_error("tokenizer: %s: added token %d has no content", src, id);
            return FY_ERR_FORMAT;
        }
        n = FY_MAX(n, id + 1);
        text_bytes += json_string_length(json_object_get(item, "content"));
    }
    if (n == 0) {
        fy_error("tokenizer: %s: empty vocabulary", src);
        return FY_ERR_FORMAT;
    }
    fy_status_t st = vocab_alloc(tok, n, n_strings, text_bytes, src);
    if (st != FY_OK) return st;
    json_object_foreach(vocab, key, value)
    {
        int32_t id = (int32_t)json_integer_value(value);
        size_t len = strlen(key);
        if (tok->tokens[id].text) {
            fy_error("tokenizer: %s: vocab gives id %d to both '%.*s' and '%.*s'", src, id,
                     log_len(tok->tokens[id].len), tok->tokens[id].text, log_len(len), key);
            return FY_ERR_FORMAT;
        }
        if (len > TOK_MAX_TOKEN_LEN) {
            fy_error("tokenizer: %s: token %d is %zu bytes long", src, id, len);
            return FY_ERR_FORMAT;
        }
        bool is_byte = byte_fallback && spm_byte_value(key, len) >= 0;
        vocab_set(tok, id, key, len, is_byte ? TOK_BYTE : TOK_NORMAL, 0.0f);
    }
    /* Added tokens come after, so they override a vocab entry with their id. */
    json_array_foreach(added, i, item)
    {
        int32_t id = (int32_t)json_integer_value(json_object_get(item, "id"));
        const json_t *content = json_object_get(item, "content");
        size_t len = json_string_length(content);
        if (len > TOK_MAX_TOKEN_LEN) {
            fy_error("tokenizer: %s: added token %d is %zu bytes long", src, id, len);
            return FY_ERR_FORMAT;
        }
        uint8_t type = json_flag(item, "special", false) ? TOK_CONTROL : TOK_USER_DEFINED;
        vocab_set(tok, id, json_string_value(content), len, type, 0.0f);
    }
    for (int32_t id = 0; id < n; id++) {
        if (!tok->tokens[id].text) {
            fy_error("tokenizer: %s: no token has id %d (ids must run from 0 to %d)", src, id, n - 1);
            return FY_ERR_FORMAT;
        }
    }
    return vocab_index(tok, src);
}

static fy_status_t json_load_merges(fy_tokenizer_t *tok, const json_t *merges, const char *src)
{
    fy_status_t st = merges_alloc(tok, json_array_size(merges), src);
    size_t i;
    const json_t *m;
    json_array_foreach(merges, i, m)
    {
        if (st != FY_OK) break;
        if (json_is_string(m)) {
            st = merge_add_joined(tok, i, json_string_value(m), json_string_length(m), src);
        } else if (json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            const json_t *a = json_array_get(m, 0), *b = json_array_get(m, 1);
            st = merge_add(tok, i, json_string_value(a), json_string_length(a), json_string_value(b),
                           json_string_length(b), src);
        } else {
            fy_error("tokenizer: %s: merge %zu is neither \"a b\" nor [a, b]", src, i);
            st = FY_ERR_FORMAT;
        }
    }
    return st;
}

/* A token named by a string, or by {"content": string} as tokenizer_config writes it. */
static fy_status_t json_named_token(const fy_tokenizer_t *tok, const json_t *node, const char *what, const char *src,
                                    int32_t *id_p)
{
    if (json_is_object(node)) node = json_object_get(node, "content");
    if (!node || json_is_null(node)) return FY_OK;
    if (!json_is_string(node)) {
        fy_error("tokenizer: %s: %s is not a string", src, what);
        return FY_ERR_FORMAT;
    }
    int32_t id = index_find(tok, json_string_value(node), json_string_length(node));
    if (id < 0) {
        fy_error("tokenizer: %s: %s '%.*s' is not in the vocabulary", src, what, log_len(json_string_length(node)),
                 json_string_value(node));
        return FY_ERR_FORMAT;
    }
    *id_p = id;
    return FY_OK;
}

/* BOS from a TemplateProcessing post-processor whose single-sequence
 * template opens with a special token (as Llama-2 and Llama-3 write it). */
static fy_status_t json_post_processor(fy_tokenizer_t *tok, const json_t *node, const char *src)
{
    const char *type = json_type_of(node);
    if (type && strcmp(type, "Sequence") == 0) {
        size_t i;
        const json_t *item;
        json_array_foreach(json_object_get(node, "processors"), i, item)
        {
            fy_status_t st = json_post_processor(tok, item, src);
            if (st != FY_OK) return st;
        }
        return FY_OK;
    }
    if (!type || strcmp(type, "TemplateProcessing") != 0) return FY_OK;
    const json_t *first = json_object_get(json_array_get(json_object_get(node, "single"), 0), "SpecialToken");
    if (!first) return FY_OK;
    fy_status_t st = json_named_token(tok, json_object_get(first, "id"), "post_processor token", src, &tok->bos);
    if (st == FY_OK) tok->add_bos = tok->bos >= 0;
    return st;
}

static fy_status_t json_config(fy_tokenizer_t *tok, const json_t *config, const char *src)
{
    fy_status_t st = json_named_token(tok, json_object_get(config, "bos_token"), "bos_token", src, &tok->bos);
    if (st == FY_OK) st = json_named_token(tok, json_object_get(config, "eos_token"), "eos_token", src, &tok->eos);
    if (st != FY_OK) return st;
    const json_t *add_bos = json_object_get(config, "add_bos_token");
    if (json_is_boolean(add_bos)) tok->add_bos = json_is_true(add_bos);
    return FY_OK;
}

static fy_status_t json_build(const json_t *root, const json_t *config, const char *src, const char *config_src,
                              fy_tokenizer_t **tok_p)
{
    const json_t *model = json_object_get(root, "model");
    json_t *vocab = json_object_get(model, "vocab"); /* not const: jansson's iterators take json_t * */
    const json_t *merges = json_object_get(model, "merges");
    const json_t *added = json_object_get(root, "added_tokens");
    const json_t *normalizer = json_object_get(root, "normalizer");
    const json_t *pre = json_object_get(root, "pre_tokenizer");
    const json_t *decoder = json_object_get(root, "decoder");
    const char *model_type = json_type_of(model);
    if (model_type && strcmp(model_type, "BPE") != 0) return json_unsupported(src, "model type", model_type);
    if (!json_is_object(vocab) || !json_is_array(merges)) {
        fy_error("tokenizer: %s: model needs a vocab object and a merges array", src);
        return FY_ERR_FORMAT;
    }
    if (added && !json_is_array(added)) {
        fy_error("tokenizer: %s: added_tokens is not an array", src);
        return FY_ERR_FORMAT;
    }
    if (json_is_string(json_object_get(model, "continuing_subword_prefix")) ||
        json_is_string(json_object_get(model, "end_of_word_suffix")))
        return json_unsupported(src, "bpe option", "continuing_subword_prefix/end_of_word_suffix");

    bool byte_fallback = json_flag(model, "byte_fallback", false);
    bool byte_level = json_has_type(pre, "ByteLevel") || json_has_type(decoder, "ByteLevel");
    bool spm = byte_fallback || json_has_type(pre, "Metaspace") || json_has_type(decoder, "Metaspace") ||
               json_normalizer_is_spm(normalizer);
    if (byte_level == spm) {
        fy_error("tokenizer: %s: cannot tell byte-level bpe from sentencepiece-style bpe (%s)", src,
                 byte_level ? "signs of both" : "signs of neither");
        return FY_ERR_UNSUPPORTED;
    }
    fy_tokenizer_t *tok = tok_new(byte_level ? FY_TOKENIZER_BPE_BYTE : FY_TOKENIZER_SPM, src);
    if (!tok) return FY_ERR_NOMEM;
    tok->ignore_merges = json_flag(model, "ignore_merges", false);

    fy_status_t st = json_load_vocab(tok, vocab, added, byte_fallback && spm, src);
    if (st == FY_OK) st = json_load_merges(tok, merges, src);
    if (st == FY_OK) st = json_normalizer(tok, normalizer, src);
    if (st == FY_OK) st = json_pre_tokenizer(tok, pre, src);
    if (st == FY_OK) st = json_named_token(tok, json_object_get(model, "unk_token"), "unk_token", src, &tok->unk);
    if (st == FY_OK && tok->unk >= 0) tok->tokens[tok->unk].type = TOK_UNKNOWN;
    if (st == FY_OK) st = json_post_processor(tok, json_object_get(root, "post_processor"), src);
    if (st == FY_OK && config) st = json_config(tok, config, config_src);
    if (st != FY_OK) goto fail;
    if (tok->eos < 0) { /* without a config, the usual names */
        static const char *const k_eos[] = {"</s>", "<|end_of_text|>", "<|endoftext|>"};
        for (size_t i = 0; i < FY_ARRAY_LEN(k_eos) && tok->eos < 0; i++) {
            int32_t id = index_find(tok, k_eos[i], strlen(k_eos[i]));
            if (id >= 0 && (type_is_special(tok->tokens[id].type) || tok->tokens[id].type == TOK_USER_DEFINED))
                tok->eos = id;
        }
    }
    st = tok_finish(tok, src);
    if (st != FY_OK) goto fail;
    *tok_p = tok;
    return FY_OK;
fail:
    fy_tokenizer_destroy(tok);
    return st;
}

static fy_status_t json_read(const char *path, json_t **root_p)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fy_error("tokenizer: %s: cannot open: %s", path, strerror(errno));
        return FY_ERR_IO;
    }
    json_error_t err;
    json_t *root = json_loadf(f, JSON_ALLOW_NUL, &err);
    fclose(f);
    if (!root) {
        fy_error("tokenizer: %s:%d:%d: %s", path, err.line, err.column, err.text);
        return FY_ERR_FORMAT;
    }
    if (!json_is_object(root)) {
        fy_error("tokenizer: %s: not a json object", path);
        json_decref(root);
        return FY_ERR_FORMAT;
    }
    *root_p = root;
    return FY_OK;
}

fy_status_t fy_tokenizer_from_json(const char *json_path, const char *config_path, fy_tokenizer_t **tok_p)
{
    json_t *root = NULL, *config = NULL;
    fy_status_t st = json_read(json_path, &root);
    if (st == FY_OK && config_path) st = json_read(config_path, &config);
    if (st == FY_OK) st = json_build(root, config, json_path, config_path, tok_p);
    json_decref(config);
    json_decref(root);
    return st;
}

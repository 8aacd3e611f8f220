/*
 * grammar.h - structured outputs: grammars over bytes, the matcher that
 * follows one through generated text, and the token mask it gives the
 * sampler.
 *
 * A grammar is a context-free grammar over BYTES (rules of alternatives of
 * sequences of byte sets and rule references; literals, UTF-8 codepoint
 * classes and bounded or unbounded repetition are lowered to those).  It
 * is compiled from a response_format: a JSON Schema (json_schema.c), any
 * JSON object ("json_object"), a regular expression or a list of choices
 * (grammar_regex.c), or a GBNF text grammar (grammar_gbnf.c).  A compiled grammar is immutable and may be shared
 * between threads and requests (it is reference-counted; the cache below
 * hands out references).
 *
 * A matcher (fy_gmatch_t, one per request) follows the grammar byte by
 * byte as a set of pushdown stacks (llama.cpp's stack set; the stacks are
 * hash-consed, so equal stacks are one, and a state is an interned set of
 * stack tops).  It memoizes the transition of every (state, byte) it has
 * met and the mask of every state it has masked, so a state met again (a
 * string's next character, an array's next item) costs a table lookup;
 * the memo is bounded and flushed when full.  The mask walks a trie of
 * the vocabulary's byte strings (token_trie.h) from the current state,
 * descending only into bytes the grammar can take: its cost is what can
 * follow, not the vocabulary.
 *
 * EOS: the end-of-generation tokens (fy_token_trie's eog list) are in the
 * mask exactly when the grammar is complete; accepting one ends the
 * matcher.  Special/control tokens are never in the mask.
 *
 * Not here: wiring into the engine, the sampler, the wire or the HTTP API
 * (response_format parsing is the caller's: it picks the compile function
 * by kind); a matcher is used by one thread at a time.
 */
#ifndef FY_GRAMMAR_H
#define FY_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "grammar/token_trie.h"

/* Limits: input beyond these is refused with a message, never a crash or
 * an exponential blow-up. */
#define FY_GRAMMAR_MAX_SOURCE (256 * 1024) /* bytes of schema, regex or choice text */
#define FY_GRAMMAR_MAX_RULES 65536
#define FY_GRAMMAR_MAX_ELEMS (1 << 20)
#define FY_GRAMMAR_MAX_DEPTH 64     /* nesting of schemas / regex groups while compiling */
#define FY_GRAMMAR_MAX_REPEAT 10000 /* m and n of {m,n}, minItems/maxItems, min/maxLength */
#define FY_GRAMMAR_MAX_CHOICES 4096
#define FY_GRAMMAR_ERR_LEN 256 /* size the caller's message buffer with this */

/* JSON whitespace allowed between tokens of JSON the grammars here emit:
 * nothing, one space, or a newline and up to this many spaces/tabs (as
 * llama.cpp's json-schema-to-grammar); unbounded whitespace would let a
 * model loop forever inside valid JSON. */
#define FY_GRAMMAR_JSON_WS_MAX 20

typedef struct fy_grammar fy_grammar_t;

typedef enum fy_grammar_kind {
    FY_GRAMMAR_JSON_SCHEMA = 0, /* source: a JSON Schema document */
    FY_GRAMMAR_JSON_OBJECT,     /* source ignored: any JSON object */
    FY_GRAMMAR_REGEX,           /* source: a regular expression, matched whole */
    FY_GRAMMAR_CHOICE,          /* source: a JSON array of strings; output is one of them, verbatim */
    FY_GRAMMAR_GBNF,            /* source: a llama.cpp GBNF grammar, start rule "root" */
    FY_GRAMMAR_KIND_COUNT
} fy_grammar_kind_t;

const char *fy_grammar_kind_str(fy_grammar_kind_t kind);

/* The compiler for a generation's structured output (genspec.h's
 * FY_GEN_GRAMMAR_*, an int here to keep this header free of it); false
 * for none or an unknown value. */
bool fy_grammar_kind_of_gen(int gen_kind, fy_grammar_kind_t *kind_p);

/* Compiles src (len bytes, need not be NUL-terminated) of the given kind.
 * On failure returns FY_ERR_INVALID (malformed input, limits) or
 * FY_ERR_UNSUPPORTED (a keyword or construct not handled, named in the
 * message) and writes a one-line message to err (err_cap bytes, may be
 * NULL); nothing is logged (the message is the client's).  On success
 * *g_p holds one reference. */
fy_status_t fy_grammar_compile(fy_grammar_kind_t kind, const char *src, size_t len, fy_grammar_t **g_p, char *err,
                               size_t err_cap);
/* The same for a JSON Schema already parsed (a jansson json_t *). */
fy_status_t fy_grammar_from_json_schema(const void *schema_json, fy_grammar_t **g_p, char *err, size_t err_cap);

fy_grammar_t *fy_grammar_ref(fy_grammar_t *g);
void fy_grammar_unref(fy_grammar_t *g); /* accepts NULL; frees at the last reference */

/* Size of the compiled form (for logs and tests). */
int32_t fy_grammar_n_rules(const fy_grammar_t *g);
int32_t fy_grammar_n_elems(const fy_grammar_t *g);
/* The grammar in GBNF-like text, for debugging; fy_free() it. */
char *fy_grammar_dump(const fy_grammar_t *g);

/* ---- matcher ------------------------------------------------------------------------------------------------ */

typedef struct fy_gmatch fy_gmatch_t;

#define FY_GMATCH_HISTORY 256 /* tokens fy_gmatch_rollback can undo */

/* A matcher at the grammar's start; holds a reference on g. */
fy_status_t fy_gmatch_create(fy_grammar_t *g, fy_gmatch_t **m_p);
void fy_gmatch_destroy(fy_gmatch_t *m); /* accepts NULL */

/* Byte level.  accept_byte advances and returns true, or returns false and
 * leaves the state as it was; accept_bytes is all or nothing. */
bool fy_gmatch_can_accept_byte(fy_gmatch_t *m, uint8_t byte);
bool fy_gmatch_accept_byte(fy_gmatch_t *m, uint8_t byte);
bool fy_gmatch_accept_bytes(fy_gmatch_t *m, const void *bytes, size_t len);
/* The text so far is a whole sentence of the grammar (EOS may follow). */
bool fy_gmatch_is_complete(const fy_gmatch_t *m);
/* An end-of-generation token was accepted: nothing more is. */
bool fy_gmatch_is_ended(const fy_gmatch_t *m);

/* Token level.  mask: (fy_token_trie_n_vocab(t) + 31) / 32 words, bit
 * (id % 32) of word id / 32 set when token id may come next: its bytes
 * take the grammar somewhere alive, or it is an EOG token and the grammar
 * is complete.  After the matcher has ended only the EOG tokens are set.
 * An all-zero mask cannot happen for a grammar compiled here over a
 * vocabulary that has every single byte as a token. */
fy_status_t fy_gmatch_mask(fy_gmatch_t *m, const fy_token_trie_t *t, uint32_t *mask);
/* Advances by token id's bytes (or ends, for an EOG token when complete;
 * once ended, only EOG tokens are taken, changing nothing) and records the
 * step for rollback.  FY_ERR_INVALID when the token is not allowed (state
 * unchanged): exactly the tokens fy_gmatch_mask leaves out. */
fy_status_t fy_gmatch_accept_token(fy_gmatch_t *m, const fy_token_trie_t *t, int32_t id);
/* Undoes the last n accepted tokens (speculative decoding: drop the
 * rejected draft).  FY_ERR_INVALID when fewer than n are remembered
 * (at most FY_GMATCH_HISTORY; byte-level accepts clear the history). */
fy_status_t fy_gmatch_rollback(fy_gmatch_t *m, int32_t n);
/* Tokens fy_gmatch_rollback can undo now. */
int32_t fy_gmatch_history(const fy_gmatch_t *m);
/* An independent matcher in src's state (same grammar, history included). */
fy_status_t fy_gmatch_clone(const fy_gmatch_t *src, fy_gmatch_t **m_p);

/* Memo statistics (tests and the benchmark). */
typedef struct fy_gmatch_stats {
    int64_t n_states;  /* interned states now */
    int64_t n_nodes;   /* stack nodes now */
    int64_t mask_hits; /* masks served from the memo */
    int64_t mask_miss; /* masks computed by a trie walk */
    int64_t walked;    /* trie nodes visited by those walks */
    int64_t flushes;   /* times the memo was full and rebuilt */
} fy_gmatch_stats_t;
void fy_gmatch_stats(const fy_gmatch_t *m, fy_gmatch_stats_t *s);

/* ---- compiled-grammar cache ------------------------------------------------------------------------------- */

/* Maps (kind, source text) to a compiled grammar, least recently used
 * out first; thread-safe.  Failures are not cached. */
typedef struct fy_grammar_cache fy_grammar_cache_t;

fy_status_t fy_grammar_cache_create(int32_t capacity, fy_grammar_cache_t **c_p);
void fy_grammar_cache_destroy(fy_grammar_cache_t *c); /* accepts NULL; grammars handed out live on */
/* As fy_grammar_compile, through the cache: *g_p holds a reference the
 * caller unrefs.  *hit_p (may be NULL) says whether it was cached. */
fy_status_t fy_grammar_cache_get(fy_grammar_cache_t *c, fy_grammar_kind_t kind, const char *src, size_t len,
                                 fy_grammar_t **g_p, bool *hit_p, char *err, size_t err_cap);

#endif /* FY_GRAMMAR_H */

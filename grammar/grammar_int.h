/*
 * grammar_int.h - inside the grammar engine: the builder the compilers
 * (json_schema.c, grammar_regex.c, grammar_gbnf.c) write an expression tree with, and the
 * compiled form grammar.c matches.
 *
 * A compiler makes expression nodes (literal, byte set, codepoint ranges,
 * sequence, alternation, rule reference, repetition) and named rules whose
 * bodies are nodes; gb_finish lowers them to flat alternatives of byte
 * sets and references, checks them (no left recursion, every rule can
 * finish) and returns the grammar.  Node constructors given a failed
 * node (-1) return -1, so a compiler checks once at the end; the first
 * error's message is kept.
 *
 * Not here: matching (grammar.c), any input syntax.
 */
#ifndef FY_GRAMMAR_INT_H
#define FY_GRAMMAR_INT_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>

#include "grammar/grammar.h"

/* ---- compiled form ---------------------------------------------------------------------------------------- */

enum { GE_END = 0, GE_SET, GE_REF };

typedef struct gelem {
    uint8_t type; /* GE_* */
    int32_t v;    /* GE_SET: byte-set index; GE_REF: rule */
} gelem_t;

typedef struct grule {
    int32_t alt_first, n_alts; /* into fy_grammar.alts */
    char *name;
} grule_t;

struct fy_grammar {
    int refs;
    gelem_t *elems; /* alternatives, each ending in GE_END */
    int32_t n_elems;
    int32_t *alts; /* start element of each alternative */
    int32_t n_alts;
    grule_t *rules;
    int32_t n_rules;
    int32_t root;
    uint32_t (*sets)[8]; /* 256-bit byte sets */
    int32_t n_sets;
};

/* ---- builder ------------------------------------------------------------------------------------------------ */

typedef struct gb gb_t;

gb_t *gb_create(void);
void gb_destroy(gb_t *b);
/* Records the first error (later ones are dropped); always returns -1. */
int32_t gb_fail(gb_t *b, fy_status_t st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
bool gb_failed(const gb_t *b);

int32_t gb_empty(gb_t *b);
int32_t gb_lit(gb_t *b, const char *s, size_t n);
int32_t gb_str(gb_t *b, const char *s); /* gb_lit of a C string */
/* bytes in set (256 bits) */
int32_t gb_bytes(gb_t *b, const uint32_t set[8]);
/* codepoints: n pairs lo, hi (inclusive); negate takes the complement in
 * U+0000..U+10FFFF; surrogates never match.  Lowered to UTF-8. */
int32_t gb_cps(gb_t *b, const uint32_t *ranges, int32_t n, bool negate);
int32_t gb_seq(gb_t *b, const int32_t *kids, int32_t n);
int32_t gb_alt(gb_t *b, const int32_t *kids, int32_t n);
/* Variadic forms, terminated by GB_NONE. */
#define GB_NONE (-2)
int32_t gb_seqv(gb_t *b, ...);
int32_t gb_altv(gb_t *b, ...);
/* x{min,max}; max -1 is unbounded.  Refused above FY_GRAMMAR_MAX_REPEAT. */
int32_t gb_rep(gb_t *b, int32_t x, int32_t min, int32_t max);

/* A named rule, its body set later (so rules can refer to themselves). */
int32_t gb_rule(gb_t *b, const char *name);
void gb_rule_set(gb_t *b, int32_t rule, int32_t body);
int32_t gb_ref(gb_t *b, int32_t rule);
/* A rule whose body is node, referenced: gives a shared sub-expression one
 * place in the grammar. */
int32_t gb_share(gb_t *b, const char *name, int32_t node);

/* Lowers, checks and returns the grammar with root as its start rule; on
 * failure the message of the first error goes to err. */
fy_status_t gb_finish(gb_t *b, int32_t root, fy_grammar_t **g_p, char *err, size_t err_cap);
/* The recorded error, for a compiler that gives up before gb_finish. */
fy_status_t gb_error(const gb_t *b, char *err, size_t err_cap);

/* JSON pieces shared by the compilers. */
int32_t gb_json_ws(gb_t *b);     /* FY_GRAMMAR_JSON_WS_MAX-bounded whitespace */
int32_t gb_json_char(gb_t *b);   /* one character of a JSON string's content, escapes included */
int32_t gb_json_string(gb_t *b); /* any JSON string, quotes included */
int32_t gb_json_value(gb_t *b);  /* any JSON value */
int32_t gb_json_object(gb_t *b); /* any JSON object */

/* Compilers (the kinds of fy_grammar_compile). */
fy_status_t fy_json_schema_compile(gb_t *b, const void *schema, int32_t *root_p);
fy_status_t fy_regex_compile(gb_t *b, const char *re, size_t len, bool json_string, int32_t *root_p);
fy_status_t fy_choice_compile(gb_t *b, const char *src, size_t len, int32_t *root_p);
fy_status_t fy_gbnf_compile(gb_t *b, const char *src, size_t len, int32_t *root_p);

#endif /* FY_GRAMMAR_INT_H */

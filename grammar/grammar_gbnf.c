/*
 * grammar_gbnf.c - llama.cpp's GBNF text grammars to grammars
 * (grammar_int.h's builder).
 *
 *     root  ::= "{" ws pair ("," ws pair)* "}"   # the start rule is root
 *     pair  ::= [a-z]+ ":" ws ( "yes" | "no" )
 *     ws    ::= [ \t\n]{0,8}
 *
 * Rules are `name ::= alternatives`; a rule ends where the next
 * `name ::=` begins (a newline outside parentheses ends a sequence, as
 * in llama.cpp).  Items: "literals" and [classes] over codepoints (escapes
 * \n \r \t \\ \" \] \- \xHH \uHHHH \UHHHHHHHH, as codepoints), `.` (any
 * codepoint), rule names (letters, digits, '-', '_'), groups, and the
 * postfixes * + ? {m} {m,} {m,n}.  # starts a comment.  A rule used but
 * not defined, a second definition, or no root is an error; left
 * recursion is refused when the grammar is checked.
 *
 * Not here: llama.cpp's token references (<[id]>) and its `!` negation of
 * tokens; matching (grammar.c).
 */
#include <stdio.h>
#include <string.h>

#include "grammar/grammar_int.h"
#include "common/mem.h"

typedef struct gname {
    const char *p;
    size_t n;
    int32_t rule;
    bool defined;
} gname_t;

typedef struct gp {
    gb_t *b;
    const char *start, *p, *end;
    gname_t *names;
    int32_t n_names, cap_names;
    int depth;
} gp_t;

static int32_t gp_fail(gp_t *g, fy_status_t st, const char *what)
{
    int line = 1;
    for (const char *q = g->start; q < g->p && q < g->end; q++) line += *q == '\n';
    return gb_fail(g->b, st, "gbnf: %s (line %d)", what, line);
}

/* Skips spaces, tabs and comments; newlines too when nested. */
static void skip(gp_t *g, bool newlines)
{
    while (g->p < g->end) {
        char c = *g->p;
        if (c == '#') {
            while (g->p < g->end && *g->p != '\n') g->p++;
        } else if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
            g->p++;
        } else {
            break;
        }
    }
}

static bool name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

static int32_t name_rule(gp_t *g, const char *p, size_t n)
{
    for (int32_t i = 0; i < g->n_names; i++)
        if (g->names[i].n == n && !memcmp(g->names[i].p, p, n)) return i;
    if (g->n_names == g->cap_names) {
        int32_t c = g->cap_names ? g->cap_names * 2 : 32;
        gname_t *q = fy_realloc(g->names, (size_t)c * sizeof(*q));
        if (!q) return gb_fail(g->b, FY_ERR_NOMEM, "gbnf: out of memory");
        g->names = q;
        g->cap_names = c;
    }
    char name[64];
    snprintf(name, sizeof(name), "%.*s", (int)(n < 63 ? n : 63), p);
    int32_t r = gb_rule(g->b, name);
    if (r < 0) return -1;
    g->names[g->n_names] = (gname_t){p, n, r, false};
    return g->n_names++;
}

/* A codepoint of a literal or class, escapes included; -1 on error. */
static int32_t gp_char(gp_t *g)
{
    if (g->p >= g->end) return gp_fail(g, FY_ERR_INVALID, "unexpected end");
    unsigned char c = (unsigned char)*g->p++;
    if (c == '\\') {
        if (g->p >= g->end) return gp_fail(g, FY_ERR_INVALID, "trailing \\");
        char e = *g->p++;
        int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (digits) {
            uint32_t v = 0;
            for (int i = 0; i < digits; i++) {
                if (g->p >= g->end) return gp_fail(g, FY_ERR_INVALID, "short hex escape");
                char h = *g->p++;
                int d = h >= '0' && h <= '9'                     ? h - '0'
                        : (h | 0x20) >= 'a' && (h | 0x20) <= 'f' ? (h | 0x20) - 'a' + 10
                                                                 : -1;
                if (d < 0) return gp_fail(g, FY_ERR_INVALID, "bad hex escape");
                v = v * 16 + (uint32_t)d;
            }
            if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
                return gp_fail(g, FY_ERR_INVALID, "escape outside Unicode");
            return (int32_t)v;
        }
        switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-': return e;
        }
        return gp_fail(g, FY_ERR_INVALID, "unknown escape");
    }
    if (c < 0x80) return c;
    /* UTF-8 */
    int n = c >= 0xF0 && c < 0xF5 ? 3 : c >= 0xE0 && c < 0xF0 ? 2 : c >= 0xC2 && c < 0xE0 ? 1 : -1;
    if (n < 0) return gp_fail(g, FY_ERR_INVALID, "not UTF-8");
    uint32_t v = c & (0x3Fu >> n);
    for (int i = 0; i < n; i++) {
        if (g->p >= g->end || ((unsigned char)*g->p & 0xC0) != 0x80) return gp_fail(g, FY_ERR_INVALID, "not UTF-8");
        v = v << 6 | ((unsigned char)*g->p++ & 0x3F);
    }
    if ((n == 2 && v < 0x800) || (n == 3 && (v < 0x10000 || v > 0x10FFFF)) || (v >= 0xD800 && v <= 0xDFFF))
        return gp_fail(g, FY_ERR_INVALID, "not UTF-8");
    return (int32_t)v;
}

static int32_t gp_alts(gp_t *g);

static int32_t gp_literal(gp_t *g)
{
    int32_t kids[256], n = 0, acc = -3;
    while (g->p < g->end && *g->p != '"') {
        if (*g->p == '\n') return gp_fail(g, FY_ERR_INVALID, "newline in a literal");
        int32_t c = gp_char(g);
        if (c < 0) return -1;
        uint32_t r[2] = {(uint32_t)c, (uint32_t)c};
        if (n == 256) {
            int32_t s = gb_seq(g->b, kids, n);
            acc = acc == -3 ? s : gb_seqv(g->b, acc, s, GB_NONE);
            n = 0;
        }
        kids[n++] = gb_cps(g->b, r, 1, false);
    }
    if (g->p >= g->end) return gp_fail(g, FY_ERR_INVALID, "unterminated literal");
    g->p++;
    int32_t s = gb_seq(g->b, kids, n);
    return acc == -3 ? s : gb_seqv(g->b, acc, s, GB_NONE);
}

static int32_t gp_class(gp_t *g)
{
    uint32_t r[512];
    int32_t n = 0;
    bool negate = false;
    if (g->p < g->end && *g->p == '^') negate = true, g->p++;
    while (g->p < g->end && *g->p != ']') {
        int32_t lo = gp_char(g), hi;
        if (lo < 0) return -1;
        hi = lo;
        if (g->p + 1 < g->end && *g->p == '-' && g->p[1] != ']') {
            g->p++;
            if ((hi = gp_char(g)) < 0) return -1;
            if (hi < lo) return gp_fail(g, FY_ERR_INVALID, "range out of order");
        }
        if (n == 256) return gp_fail(g, FY_ERR_INVALID, "class of more than 256 ranges");
        r[2 * n] = (uint32_t)lo, r[2 * n + 1] = (uint32_t)hi;
        n++;
    }
    if (g->p >= g->end) return gp_fail(g, FY_ERR_INVALID, "unterminated [");
    g->p++;
    return gb_cps(g->b, r, n, negate);
}

static bool gp_int(gp_t *g, int32_t *v)
{
    if (g->p >= g->end || *g->p < '0' || *g->p > '9') return false;
    int64_t x = 0;
    while (g->p < g->end && *g->p >= '0' && *g->p <= '9') {
        x = x * 10 + (*g->p++ - '0');
        if (x > FY_GRAMMAR_MAX_REPEAT) x = FY_GRAMMAR_MAX_REPEAT + 1;
    }
    *v = (int32_t)x;
    return true;
}

static int32_t gp_seq(gp_t *g)
{
    int32_t kids[256], n = 0, acc = -3;
    for (;;) {
        skip(g, g->depth > 0);
        if (g->p >= g->end) break;
        char c = *g->p;
        int32_t item;
        if (c == '"') {
            g->p++;
            item = gp_literal(g);
        } else if (c == '[') {
            g->p++;
            item = gp_class(g);
        } else if (c == '.') {
            g->p++;
            uint32_t all[2] = {0, 0x10FFFF};
            item = gb_cps(g->b, all, 1, false);
        } else if (c == '(') {
            g->p++;
            if (++g->depth > FY_GRAMMAR_MAX_DEPTH) return gp_fail(g, FY_ERR_INVALID, "groups nested too deeply");
            item = gp_alts(g);
            g->depth--;
            if (item < 0) return -1;
            skip(g, true);
            if (g->p >= g->end || *g->p != ')') return gp_fail(g, FY_ERR_INVALID, "missing )");
            g->p++;
        } else if (name_char(c)) {
            const char *s = g->p;
            while (g->p < g->end && name_char(*g->p)) g->p++;
            const char *after = g->p;
            skip(g, false);
            if (g->end - g->p >= 3 && !memcmp(g->p, "::=", 3)) { /* the next rule begins */
                g->p = s;
                break;
            }
            g->p = after;
            int32_t k = name_rule(g, s, (size_t)(after - s));
            item = k < 0 ? -1 : gb_ref(g->b, g->names[k].rule);
        } else if (c == '<' || c == '!') {
            return gp_fail(g, FY_ERR_UNSUPPORTED, "token references (<[id]>, !) are not supported");
        } else {
            break; /* | ) newline: the caller's */
        }
        if (item < 0) return -1;
        /* postfixes */
        while (g->p < g->end) {
            int32_t min, max;
            char q = *g->p;
            if (q == '*')
                min = 0, max = -1, g->p++;
            else if (q == '+')
                min = 1, max = -1, g->p++;
            else if (q == '?')
                min = 0, max = 1, g->p++;
            else if (q == '{') {
                g->p++;
                skip(g, false);
                if (!gp_int(g, &min)) return gp_fail(g, FY_ERR_INVALID, "bad {m,n}");
                max = min;
                skip(g, false);
                if (g->p < g->end && *g->p == ',') {
                    g->p++;
                    skip(g, false);
                    if (!gp_int(g, &max)) max = -1;
                    skip(g, false);
                }
                if (g->p >= g->end || *g->p != '}') return gp_fail(g, FY_ERR_INVALID, "bad {m,n}");
                g->p++;
                if (min > FY_GRAMMAR_MAX_REPEAT || max > FY_GRAMMAR_MAX_REPEAT || (max >= 0 && max < min))
                    return gp_fail(g, FY_ERR_INVALID, "repetition count out of range");
            } else {
                break;
            }
            item = gb_rep(g->b, item, min, max);
        }
        if (n == 256) {
            int32_t s = gb_seq(g->b, kids, n);
            acc = acc == -3 ? s : gb_seqv(g->b, acc, s, GB_NONE);
            n = 0;
        }
        kids[n++] = item;
    }
    int32_t s = gb_seq(g->b, kids, n);
    return acc == -3 ? s : gb_seqv(g->b, acc, s, GB_NONE);
}

static int32_t gp_alts(gp_t *g)
{
    int32_t kids[64], n = 0, acc = -3;
    for (;;) {
        int32_t s = gp_seq(g);
        if (s < 0) return -1;
        if (n == 64) {
            int32_t a = gb_alt(g->b, kids, n);
            acc = acc == -3 ? a : gb_altv(g->b, acc, a, GB_NONE);
            n = 0;
        }
        kids[n++] = s;
        skip(g, g->depth > 0);
        if (g->p < g->end && *g->p == '|') {
            g->p++;
            skip(g, true); /* an alternative may start on the next line */
            continue;
        }
        break;
    }
    int32_t a = gb_alt(g->b, kids, n);
    return acc == -3 ? a : gb_altv(g->b, acc, a, GB_NONE);
}

fy_status_t fy_gbnf_compile(gb_t *b, const char *src, size_t len, int32_t *root_p)
{
    gp_t g = {b, src, src, src + len, NULL, 0, 0, 0};
    int32_t root = -1;
    while (!gb_failed(b)) {
        skip(&g, true);
        if (g.p >= g.end) break;
        const char *s = g.p;
        while (g.p < g.end && name_char(*g.p)) g.p++;
        if (g.p == s) {
            gp_fail(&g, FY_ERR_INVALID, "expected a rule name");
            break;
        }
        size_t n = (size_t)(g.p - s);
        skip(&g, false);
        if (g.end - g.p < 3 || memcmp(g.p, "::=", 3)) {
            gp_fail(&g, FY_ERR_INVALID, "expected ::= after the rule name");
            break;
        }
        g.p += 3;
        int32_t k = name_rule(&g, s, n);
        if (k < 0) break;
        if (g.names[k].defined) {
            gp_fail(&g, FY_ERR_INVALID, "a rule defined twice");
            break;
        }
        g.names[k].defined = true;
        int32_t body = gp_alts(&g);
        gb_rule_set(b, g.names[k].rule, body);
        if (n == 4 && !memcmp(s, "root", 4)) root = g.names[k].rule;
        skip(&g, false);
        if (!gb_failed(b) && g.p < g.end && *g.p != '\n') gp_fail(&g, FY_ERR_INVALID, "unexpected character");
    }
    for (int32_t i = 0; i < g.n_names && !gb_failed(b); i++) {
        if (!g.names[i].defined) {
            char msg[96];
            snprintf(msg, sizeof(msg), "rule '%.*s' is used but not defined",
                     (int)(g.names[i].n < 64 ? g.names[i].n : 64), g.names[i].p);
            gb_fail(b, FY_ERR_INVALID, "gbnf: %s", msg);
        }
    }
    if (!gb_failed(b) && root < 0) gb_fail(b, FY_ERR_INVALID, "gbnf: no rule named root");
    fy_free(g.names);
    *root_p = root;
    return gb_error(b, NULL, 0);
}

/*
 * grammar_regex.c - regular expressions and choice lists to grammars
 * (grammar_int.h's builder).
 *
 * The regex subset: literals (UTF-8), escapes (\d \w \s and their
 * negations, \n \r \t \f \v \0, \xHH, \uHHHH, \u{H..}, escaped
 * punctuation), classes [...] with ranges and negation, '.', groups
 * (...), (?:...), (?<name>...), (?P<name>...), alternation, quantifiers
 * ? * + {m} {m,} {m,n} (a lazy '?' after one changes nothing for a whole
 * match and is accepted).  The whole text must match: '^' at the start
 * and '$' at the end are accepted and change nothing.  Refused by name:
 * backreferences, lookaround, word boundaries, inline flags, unicode
 * properties, possessive quantifiers, anchors inside.  A repetition of
 * something that can match empty under * or + (such as (a*)*) is refused
 * when the grammar is checked (left recursion).
 *
 * In json_string mode (JSON Schema "pattern") the text is the content of
 * a JSON string: characters that JSON escapes are matched in their
 * escaped form, and the pattern is a search (unanchored sides may hold
 * any characters), as ECMA-262 has it.
 *
 * Not here: matching (grammar.c).
 */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "grammar/grammar_int.h"
#include "common/mem.h"

typedef struct rx {
    gb_t *b;
    const unsigned char *start, *p, *end;
    bool json;
    int depth;
} rx_t;

static int32_t rx_fail(rx_t *r, fy_status_t st, const char *what)
{
    return gb_fail(r->b, st, "regex: %s (at offset %ld)", what, (long)(r->p - r->start));
}

static int32_t unsupported(rx_t *r, const char *what)
{
    char msg[128];
    snprintf(msg, sizeof(msg), "%s is not supported", what);
    return rx_fail(r, FY_ERR_UNSUPPORTED, msg);
}

/* One UTF-8 codepoint from the pattern; -1 if malformed. */
static int32_t next_cp(rx_t *r)
{
    if (r->p >= r->end) return -1;
    uint32_t c = *r->p++;
    if (c < 0x80) return (int32_t)c;
    int n = c >= 0xF0 && c < 0xF5 ? 3 : c >= 0xE0 ? 2 : c >= 0xC2 && c < 0xE0 ? 1 : -1;
    if (n < 0 || c >= 0xF5) return -1;
    c &= 0x3F >> n;
    for (int i = 0; i < n; i++) {
        if (r->p >= r->end || (*r->p & 0xC0) != 0x80) return -1;
        c = c << 6 | (*r->p++ & 0x3F);
    }
    if ((n == 2 && c < 0x800) || (n == 3 && (c < 0x10000 || c > 0x10FFFF)) || (c >= 0xD800 && c <= 0xDFFF)) return -1;
    return (int32_t)c;
}

/* A growable list of codepoint ranges. */
typedef struct cls {
    uint32_t r[512];
    int32_t n;
} cls_t;

static bool cls_add(cls_t *c, uint32_t lo, uint32_t hi)
{
    if (c->n >= 256) return false;
    c->r[2 * c->n] = lo;
    c->r[2 * c->n + 1] = hi;
    c->n++;
    return true;
}

/* \d \w \s (negated when upper case) into c; false if not a class escape. */
static bool class_escape(int32_t e, cls_t *c, bool *neg)
{
    *neg = e >= 'A' && e <= 'Z';
    switch (e | 0x20) {
    case 'd': return cls_add(c, '0', '9');
    case 'w': return cls_add(c, '0', '9') && cls_add(c, 'A', 'Z') && cls_add(c, 'a', 'z') && cls_add(c, '_', '_');
    case 's': return cls_add(c, ' ', ' ') && cls_add(c, '\t', '\r');
    }
    return false;
}

static int32_t hexval(rx_t *r, int n)
{
    int32_t v = 0;
    for (int i = 0; i < n; i++) {
        if (r->p >= r->end) return -1;
        int c = *r->p++, d = c >= '0' && c <= '9'                     ? c - '0'
                             : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10
                                                                      : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* A single-codepoint escape after '\': its codepoint, or -1 (error set). */
static int32_t char_escape(rx_t *r, int32_t e)
{
    switch (e) {
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case 'f': return '\f';
    case 'v': return '\v';
    case '0': return 0;
    case 'x': {
        int32_t v = hexval(r, 2);
        return v < 0 ? rx_fail(r, FY_ERR_INVALID, "\\x needs two hex digits") : v;
    }
    case 'u': {
        int32_t v;
        if (r->p < r->end && *r->p == '{') {
            r->p++;
            v = 0;
            int n = 0;
            while (r->p < r->end && *r->p != '}' && n < 7) {
                int32_t d = hexval(r, 1);
                if (d < 0) return rx_fail(r, FY_ERR_INVALID, "bad \\u{...}");
                v = v * 16 + d;
                n++;
            }
            if (r->p >= r->end || *r->p != '}' || n == 0 || v > 0x10FFFF)
                return rx_fail(r, FY_ERR_INVALID, "bad \\u{...}");
            r->p++;
        } else {
            v = hexval(r, 4);
        }
        if (v < 0 || (v >= 0xD800 && v <= 0xDFFF)) return rx_fail(r, FY_ERR_INVALID, "bad \\u escape");
        return v;
    }
    case 'b': return unsupported(r, "a word boundary (\\b)");
    case 'B': return unsupported(r, "a word boundary (\\B)");
    case 'p':
    case 'P': return unsupported(r, "a unicode property (\\p)");
    case 'A':
    case 'z':
    case 'Z': return unsupported(r, "an anchor escape");
    }
    if (e >= '1' && e <= '9') return unsupported(r, "a backreference");
    if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z')) return unsupported(r, "this escape");
    return e; /* escaped punctuation stands for itself */
}

/* A codepoint set as a node; in json mode as its JSON-escaped text. */
static int32_t set_node(rx_t *r, cls_t *c, bool negate)
{
    gb_t *b = r->b;
    if (!r->json) return gb_cps(b, c->r, c->n, negate);
    /* take '"', '\' and controls out; '"' and '\' come back escaped */
    static const uint32_t special[] = {0, 0x1F, '"', '"', '\\', '\\'};
    int32_t kids[3], nk = 0;
    /* does the set hold '"' / '\'? (decided on the ranges) */
    bool has_q = false, has_bs = false;
    for (int32_t i = 0; i < c->n; i++) {
        has_q |= c->r[2 * i] <= '"' && '"' <= c->r[2 * i + 1];
        has_bs |= c->r[2 * i] <= '\\' && '\\' <= c->r[2 * i + 1];
    }
    if (negate) has_q = !has_q, has_bs = !has_bs;
    /* base minus the specials: intersect by negating the union of the
     * complement and the specials */
    cls_t u = {0};
    if (negate) {
        u = *c;
    } else {
        /* complement of c */
        uint32_t next = 0;
        cls_t sorted = *c;
        for (int32_t i = 1; i < sorted.n; i++) /* insertion sort: few ranges */
            for (int32_t k = i; k > 0 && sorted.r[2 * k] < sorted.r[2 * (k - 1)]; k--) {
                uint32_t t0 = sorted.r[2 * k], t1 = sorted.r[2 * k + 1];
                sorted.r[2 * k] = sorted.r[2 * (k - 1)], sorted.r[2 * k + 1] = sorted.r[2 * (k - 1) + 1];
                sorted.r[2 * (k - 1)] = t0, sorted.r[2 * (k - 1) + 1] = t1;
            }
        for (int32_t i = 0; i < sorted.n; i++) {
            if (sorted.r[2 * i] > next && !cls_add(&u, next, sorted.r[2 * i] - 1))
                return rx_fail(r, FY_ERR_INVALID, "class too big");
            if (sorted.r[2 * i + 1] + 1 > next) next = sorted.r[2 * i + 1] + 1;
        }
        if (next <= 0x10FFFF && !cls_add(&u, next, 0x10FFFF)) return rx_fail(r, FY_ERR_INVALID, "class too big");
    }
    for (int i = 0; i < 3; i++)
        if (!cls_add(&u, special[2 * i], special[2 * i + 1])) return rx_fail(r, FY_ERR_INVALID, "class too big");
    kids[nk++] = gb_cps(b, u.r, u.n, true);
    if (has_q) kids[nk++] = gb_str(b, "\\\"");
    if (has_bs) kids[nk++] = gb_str(b, "\\\\");
    return gb_alt(b, kids, nk);
}

/* One literal codepoint as a node (JSON-escaped in json mode). */
static int32_t lit_cp(rx_t *r, uint32_t c)
{
    char buf[8];
    if (r->json && (c == '"' || c == '\\' || c < 0x20)) {
        static const char esc[] = "btn\0fr";
        if (c == '"' || c == '\\')
            snprintf(buf, sizeof(buf), "\\%c", (char)c);
        else if (c >= 8 && c <= 13 && c != 11)
            snprintf(buf, sizeof(buf), "\\%c", esc[c - 8]);
        else
            snprintf(buf, sizeof(buf), "\\u%04x", c);
        return gb_str(r->b, buf);
    }
    uint32_t rg[2] = {c, c};
    return gb_cps(r->b, rg, 1, false);
}

static int32_t parse_class(rx_t *r)
{
    cls_t c = {0};
    bool negate = false;
    if (r->p < r->end && *r->p == '^') negate = true, r->p++;
    bool first = true;
    for (;;) {
        if (r->p >= r->end) return rx_fail(r, FY_ERR_INVALID, "unterminated [");
        if (*r->p == ']' && !first) {
            r->p++;
            break;
        }
        first = false;
        if (r->p + 1 < r->end && r->p[0] == '[' && r->p[1] == ':') return unsupported(r, "a POSIX class ([:name:])");
        int32_t lo = next_cp(r);
        if (lo < 0) return rx_fail(r, FY_ERR_INVALID, "not UTF-8");
        if (lo == '\\') {
            int32_t e = next_cp(r);
            if (e < 0) return rx_fail(r, FY_ERR_INVALID, "trailing \\");
            bool neg;
            cls_t sub = {0};
            if (class_escape(e, &sub, &neg)) {
                if (neg) return unsupported(r, "a negated class escape inside [...]");
                for (int32_t i = 0; i < sub.n; i++)
                    if (!cls_add(&c, sub.r[2 * i], sub.r[2 * i + 1]))
                        return rx_fail(r, FY_ERR_INVALID, "class too big");
                continue;
            }
            if (e == 'b')
                e = '\b', lo = 8;
            else if ((lo = char_escape(r, e)) < 0)
                return -1;
        }
        int32_t hi = lo;
        if (r->p + 1 < r->end && *r->p == '-' && r->p[1] != ']') {
            r->p++;
            hi = next_cp(r);
            if (hi < 0) return rx_fail(r, FY_ERR_INVALID, "not UTF-8");
            if (hi == '\\') {
                int32_t e = next_cp(r);
                if (e < 0 || (hi = char_escape(r, e)) < 0) return rx_fail(r, FY_ERR_INVALID, "bad range end");
            }
            if (hi < lo) return rx_fail(r, FY_ERR_INVALID, "range out of order");
        }
        if (!cls_add(&c, (uint32_t)lo, (uint32_t)hi)) return rx_fail(r, FY_ERR_INVALID, "class too big");
    }
    return set_node(r, &c, negate);
}

static int32_t parse_alt(rx_t *r);

static int32_t parse_atom(rx_t *r)
{
    int32_t c = next_cp(r);
    if (c < 0) return rx_fail(r, FY_ERR_INVALID, "not UTF-8");
    switch (c) {
    case '(': {
        if (r->p < r->end && *r->p == '?') {
            r->p++;
            if (r->p < r->end && *r->p == ':') {
                r->p++;
            } else if (r->p < r->end && (*r->p == '=' || *r->p == '!')) {
                return unsupported(r, "lookahead");
            } else if (r->p + 1 < r->end && *r->p == '<' && (r->p[1] == '=' || r->p[1] == '!')) {
                return unsupported(r, "lookbehind");
            } else if (r->p < r->end && (*r->p == '<' || *r->p == 'P')) {
                if (*r->p == 'P') r->p++;
                if (r->p >= r->end || *r->p != '<') return unsupported(r, "this group");
                while (r->p < r->end && *r->p != '>') r->p++;
                if (r->p >= r->end) return rx_fail(r, FY_ERR_INVALID, "unterminated group name");
                r->p++;
            } else {
                return unsupported(r, "an inline flag or special group");
            }
        }
        if (++r->depth > FY_GRAMMAR_MAX_DEPTH) return rx_fail(r, FY_ERR_INVALID, "groups nested too deeply");
        int32_t inner = parse_alt(r);
        r->depth--;
        if (r->p >= r->end || *r->p != ')') return rx_fail(r, FY_ERR_INVALID, "missing )");
        r->p++;
        return inner;
    }
    case '[': return parse_class(r);
    case '.': {
        cls_t nl = {0};
        cls_add(&nl, '\n', '\n');
        return set_node(r, &nl, true);
    }
    case '\\': {
        int32_t e = next_cp(r);
        if (e < 0) return rx_fail(r, FY_ERR_INVALID, "trailing \\");
        cls_t cl = {0};
        bool neg;
        if (class_escape(e, &cl, &neg)) return set_node(r, &cl, neg);
        int32_t v = char_escape(r, e);
        return v < 0 ? -1 : lit_cp(r, (uint32_t)v);
    }
    case '^': return unsupported(r, "'^' inside the expression");
    case '$': return unsupported(r, "'$' inside the expression");
    case '*':
    case '+':
    case '?': return rx_fail(r, FY_ERR_INVALID, "a quantifier with nothing to repeat");
    case ')': return rx_fail(r, FY_ERR_INVALID, "unbalanced )");
    }
    return lit_cp(r, (uint32_t)c);
}

static bool parse_int(rx_t *r, int32_t *v)
{
    if (r->p >= r->end || *r->p < '0' || *r->p > '9') return false;
    int64_t x = 0;
    while (r->p < r->end && *r->p >= '0' && *r->p <= '9') {
        x = x * 10 + (*r->p++ - '0');
        if (x > FY_GRAMMAR_MAX_REPEAT) x = FY_GRAMMAR_MAX_REPEAT + 1;
    }
    *v = (int32_t)x;
    return true;
}

static int32_t parse_seq(rx_t *r)
{
    gb_t *b = r->b;
    int32_t kids[256] = {0}, n = 0;
    int32_t acc = -3; /* sequences longer than kids[] are folded */
    while (r->p < r->end && *r->p != '|' && *r->p != ')') {
        if (*r->p == '$' && r->p + 1 == r->end && r->depth == 0) {
            r->p++;
            break;
        }
        int32_t atom = parse_atom(r);
        if (atom < 0) return -1;
        while (r->p < r->end) {
            int32_t min, max;
            unsigned char q = *r->p;
            if (q == '*')
                min = 0, max = -1, r->p++;
            else if (q == '+')
                min = 1, max = -1, r->p++;
            else if (q == '?')
                min = 0, max = 1, r->p++;
            else if (q == '{') {
                const unsigned char *save = r->p;
                r->p++;
                if (!parse_int(r, &min)) { /* not a quantifier: a literal '{' */
                    r->p = save;
                    break;
                }
                max = min;
                if (r->p < r->end && *r->p == ',') {
                    r->p++;
                    if (!parse_int(r, &max)) max = -1;
                }
                if (r->p >= r->end || *r->p != '}') return rx_fail(r, FY_ERR_INVALID, "bad {m,n}");
                r->p++;
                if (min > FY_GRAMMAR_MAX_REPEAT || max > FY_GRAMMAR_MAX_REPEAT || (max >= 0 && max < min))
                    return rx_fail(r, FY_ERR_INVALID, "repetition count out of range");
            } else {
                break;
            }
            if (r->p < r->end && *r->p == '?')
                r->p++; /* lazy: same language */
            else if (r->p < r->end && *r->p == '+')
                return unsupported(r, "a possessive quantifier");
            atom = gb_rep(b, atom, min, max);
        }
        if (n == 256) {
            acc = acc == -3 ? gb_seq(b, kids, n) : gb_seqv(b, acc, gb_seq(b, kids, n), GB_NONE);
            n = 0;
        }
        kids[n++] = atom;
    }
    int32_t s = gb_seq(b, kids, n);
    return acc == -3 ? s : gb_seqv(b, acc, s, GB_NONE);
}

static int32_t parse_alt(rx_t *r)
{
    gb_t *b = r->b;
    int32_t first = parse_seq(r);
    if (first < 0 || r->p >= r->end || *r->p != '|') return first;
    int32_t acc[64], n = 0, out = -3;
    acc[n++] = first;
    while (r->p < r->end && *r->p == '|') {
        r->p++;
        int32_t s = parse_seq(r);
        if (s < 0) return -1;
        if (n == 64) {
            int32_t a = gb_alt(b, acc, n);
            out = out == -3 ? a : gb_altv(b, out, a, GB_NONE);
            n = 0;
        }
        acc[n++] = s;
    }
    int32_t a = gb_alt(b, acc, n);
    return out == -3 ? a : gb_altv(b, out, a, GB_NONE);
}

fy_status_t fy_regex_compile(gb_t *b, const char *re, size_t len, bool json_string, int32_t *root_p)
{
    rx_t r = {b, (const unsigned char *)re, (const unsigned char *)re, (const unsigned char *)re + len, json_string, 0};
    bool start_anchor = len > 0 && re[0] == '^';
    bool end_anchor = len > 0 && re[len - 1] == '$' && !(len > 1 && re[len - 2] == '\\');
    if (start_anchor) r.p++;
    int32_t body = parse_alt(&r);
    if (body >= 0 && r.p < r.end) body = rx_fail(&r, FY_ERR_INVALID, "unbalanced )");
    if (body >= 0 && json_string) { /* a search: the unanchored sides take any characters */
        int32_t any = gb_rep(b, gb_json_char(b), 0, -1);
        if (!start_anchor) body = gb_seqv(b, any, body, GB_NONE);
        if (!end_anchor) body = gb_seqv(b, body, gb_rep(b, gb_json_char(b), 0, -1), GB_NONE);
    }
    *root_p = body;
    return gb_error(b, NULL, 0);
}

/* ---- choices ---------------------------------------------------------------------------------------------- */

fy_status_t fy_choice_compile(gb_t *b, const char *src, size_t len, int32_t *root_p)
{
    json_error_t je;
    json_t *doc = json_loadb(src, len, 0, &je);
    if (!doc) {
        gb_fail(b, FY_ERR_INVALID, "choice: not JSON: %s", je.text);
        return gb_error(b, NULL, 0);
    }
    size_t n = json_is_array(doc) ? json_array_size(doc) : 0;
    if (n == 0 || n > FY_GRAMMAR_MAX_CHOICES) {
        gb_fail(b, FY_ERR_INVALID, "choice: not an array of 1 to %d strings", FY_GRAMMAR_MAX_CHOICES);
        json_decref(doc);
        return gb_error(b, NULL, 0);
    }
    int32_t *kids = fy_malloc(n * sizeof(int32_t));
    if (!kids) {
        json_decref(doc);
        gb_fail(b, FY_ERR_NOMEM, "choice: out of memory");
        return gb_error(b, NULL, 0);
    }
    size_t i;
    json_t *v;
    json_array_foreach(doc, i, v)
    {
        kids[i] = json_is_string(v) ? gb_lit(b, json_string_value(v), json_string_length(v))
                                    : gb_fail(b, FY_ERR_INVALID, "choice: entry %zu is not a string", i);
    }
    int32_t root = gb_rule(b, "root");
    gb_rule_set(b, root, gb_alt(b, kids, (int32_t)n));
    fy_free(kids);
    json_decref(doc);
    *root_p = root;
    return gb_error(b, NULL, 0);
}

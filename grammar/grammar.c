/*
 * grammar.c - the grammar engine (see grammar.h): the builder's lowering
 * and checks, the matcher over bytes, the token mask, the cache.
 *
 * Matching: a stack is a chain of nodes (pos, parent) where pos is the
 * element to match next in its frame; the top node's element is always a
 * byte set.  Nodes are hash-consed in the matcher's store, so a stack is
 * identified by its top node's id, and a state (the set of live stacks
 * plus "a stack has finished": the grammar is complete) is an interned,
 * sorted array of top ids.  A reference in tail position does not keep
 * its frame (tail calls), so a loop such as a string's characters comes
 * back to the same state.  Advancing by a byte: every stack whose top set
 * holds the byte moves past it and is expanded (frames end and pop,
 * references push their alternatives) to new tops; expansion is deduped
 * on (pos, parent), so ambiguity cannot multiply stacks.  Left recursion
 * is refused when compiling, so expansion ends.
 *
 * Not here: input syntaxes (json_schema.c, grammar_regex.c,
 * grammar_gbnf.c), the trie
 * (token_trie.c).
 */
#include "grammar/grammar_int.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/genspec.h"
#include "common/log.h"
#include "common/mem.h"
#include "common/strbuf.h"

/* ======================================================================================================== */
/* builder                                                                                                  */
/* ======================================================================================================== */

enum { GN_EMPTY, GN_LIT, GN_SET, GN_CPS, GN_SEQ, GN_ALT, GN_REF, GN_REP };

typedef struct gnode {
    uint8_t kind;
    int32_t a, b, c;
    int32_t helper; /* rule made for this node while lowering, or -1 */
    int32_t item;   /* rule made for it as a repeated item, or -1 */
} gnode_t;

typedef struct brule {
    char *name;
    int32_t body;
} brule_t;

typedef uint32_t gset_t[8];

#define VEC(T)                                                                                                         \
    struct {                                                                                                           \
        T *v;                                                                                                          \
        int64_t n, cap;                                                                                                \
    }

struct gb {
    VEC(gnode_t) nodes;
    VEC(int32_t) kids;
    VEC(char) bytes;
    VEC(uint32_t) cps;
    VEC(brule_t) rules;
    VEC(gset_t) sets;
    /* lowering output */
    VEC(gelem_t) elems;
    VEC(int32_t) alts;
    VEC(int32_t) alt_rule;
    VEC(gelem_t) scratch;
    int32_t *rule_alt_first, *rule_n_alts;
    /* shared JSON rules, -1 until made */
    int32_t j_ws, j_char, j_string, j_value, j_object, j_number;
    fy_status_t st;
    char err[FY_GRAMMAR_ERR_LEN];
};

static bool vec_grow(void **v, int64_t *cap, int64_t need, size_t elem, int64_t limit)
{
    if (need <= *cap) return true;
    if (need > limit) return false;
    int64_t c = *cap ? *cap * 2 : 64;
    while (c < need) c *= 2;
    if (c > limit) c = limit;
    void *p = fy_realloc(*v, (size_t)c * elem);
    if (!p) return false;
    *v = p;
    *cap = c;
    return true;
}

#define VEC_PUSH(b, vec, val, limit, what)                                                                             \
    (vec_grow((void **)&(vec).v, &(vec).cap, (vec).n + 1, sizeof(*(vec).v), (limit))                                   \
         ? ((vec).v[(vec).n] = (val), (int32_t)(vec).n++)                                                              \
         : gb_fail((b), FY_ERR_INVALID, "grammar: too many %s (at most %lld)", (what), (long long)(limit)))

gb_t *gb_create(void)
{
    gb_t *b = fy_calloc(1, sizeof(*b));
    if (!b) return NULL;
    b->j_ws = b->j_char = b->j_string = b->j_value = b->j_object = b->j_number = -1;
    return b;
}

void gb_destroy(gb_t *b)
{
    if (!b) return;
    for (int64_t i = 0; i < b->rules.n; i++) fy_free(b->rules.v[i].name);
    fy_free(b->nodes.v);
    fy_free(b->kids.v);
    fy_free(b->bytes.v);
    fy_free(b->cps.v);
    fy_free(b->rules.v);
    fy_free(b->sets.v);
    fy_free(b->elems.v);
    fy_free(b->alts.v);
    fy_free(b->alt_rule.v);
    fy_free(b->scratch.v);
    fy_free(b->rule_alt_first);
    fy_free(b->rule_n_alts);
    fy_free(b);
}

int32_t gb_fail(gb_t *b, fy_status_t st, const char *fmt, ...)
{
    if (b->st == FY_OK) {
        b->st = st;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(b->err, sizeof(b->err), fmt, ap);
        va_end(ap);
    }
    return -1;
}

bool gb_failed(const gb_t *b) { return b->st != FY_OK; }

fy_status_t gb_error(const gb_t *b, char *err, size_t err_cap)
{
    if (err && err_cap) snprintf(err, err_cap, "%s", b->st ? b->err : "");
    return b->st;
}

static int32_t node_new(gb_t *b, uint8_t kind, int32_t a, int32_t bb, int32_t c)
{
    if (b->st) return -1;
    gnode_t n = {kind, a, bb, c, -1, -1};
    return VEC_PUSH(b, b->nodes, n, FY_GRAMMAR_MAX_ELEMS, "expression nodes");
}

int32_t gb_empty(gb_t *b) { return node_new(b, GN_EMPTY, 0, 0, 0); }

int32_t gb_lit(gb_t *b, const char *s, size_t n)
{
    if (b->st) return -1;
    if (n == 0) return gb_empty(b);
    if (n > FY_GRAMMAR_MAX_SOURCE) return gb_fail(b, FY_ERR_INVALID, "grammar: literal of %zu bytes", n);
    int64_t off = b->bytes.n;
    if (!vec_grow((void **)&b->bytes.v, &b->bytes.cap, off + (int64_t)n, 1, 64 << 20))
        return gb_fail(b, FY_ERR_INVALID, "grammar: too much literal text");
    memcpy(b->bytes.v + off, s, n);
    b->bytes.n += (int64_t)n;
    return node_new(b, GN_LIT, (int32_t)off, (int32_t)n, 0);
}

int32_t gb_str(gb_t *b, const char *s) { return gb_lit(b, s, strlen(s)); }

static int32_t set_intern(gb_t *b, const uint32_t set[8])
{
    for (int64_t i = b->sets.n - 1; i >= 0 && i >= b->sets.n - 64; i--)
        if (!memcmp(b->sets.v[i], set, 32)) return (int32_t)i;
    for (int64_t i = 0; i < b->sets.n - 64; i++)
        if (!memcmp(b->sets.v[i], set, 32)) return (int32_t)i;
    if (b->st) return -1;
    if (!vec_grow((void **)&b->sets.v, &b->sets.cap, b->sets.n + 1, 32, 4096))
        return gb_fail(b, FY_ERR_INVALID, "grammar: more than 4096 distinct byte sets");
    memcpy(b->sets.v[b->sets.n], set, 32);
    return (int32_t)b->sets.n++;
}

int32_t gb_bytes(gb_t *b, const uint32_t set[8])
{
    int32_t s = set_intern(b, set);
    return s < 0 ? -1 : node_new(b, GN_SET, s, 0, 0);
}

static int cmp_range(const void *x, const void *y)
{
    const uint32_t *a = x, *c = y;
    return a[0] < c[0] ? -1 : a[0] > c[0];
}

int32_t gb_cps(gb_t *b, const uint32_t *ranges, int32_t n, bool negate)
{
    if (b->st) return -1;
    if (n < 0 || n > 65536) return gb_fail(b, FY_ERR_INVALID, "grammar: %d codepoint ranges", n);
    /* sorted, merged, clipped to U+10FFFF, then complemented if asked */
    uint32_t *r = fy_malloc(((size_t)n + 1) * 2 * sizeof(uint32_t));
    if (!r) return gb_fail(b, FY_ERR_NOMEM, "grammar: out of memory");
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        uint32_t lo = ranges[2 * i], hi = ranges[2 * i + 1];
        if (hi > 0x10FFFF) hi = 0x10FFFF;
        if (lo > hi) continue;
        r[2 * m] = lo;
        r[2 * m + 1] = hi;
        m++;
    }
    qsort(r, (size_t)m, 2 * sizeof(uint32_t), cmp_range);
    int32_t k = 0;
    for (int32_t i = 0; i < m; i++) {
        if (k && r[2 * i] <= r[2 * (k - 1) + 1] + 1) {
            if (r[2 * i + 1] > r[2 * (k - 1) + 1]) r[2 * (k - 1) + 1] = r[2 * i + 1];
        } else {
            r[2 * k] = r[2 * i];
            r[2 * k + 1] = r[2 * i + 1];
            k++;
        }
    }
    if (negate) {
        uint32_t *c = fy_malloc(((size_t)k + 1) * 2 * sizeof(uint32_t));
        if (!c) {
            fy_free(r);
            return gb_fail(b, FY_ERR_NOMEM, "grammar: out of memory");
        }
        int32_t j = 0;
        uint32_t next = 0;
        for (int32_t i = 0; i < k; i++) {
            if (r[2 * i] > next) {
                c[2 * j] = next;
                c[2 * j + 1] = r[2 * i] - 1;
                j++;
            }
            next = r[2 * i + 1] + 1;
        }
        if (next <= 0x10FFFF) {
            c[2 * j] = next;
            c[2 * j + 1] = 0x10FFFF;
            j++;
        }
        fy_free(r);
        r = c;
        k = j;
    }
    int64_t off = b->cps.n;
    if (!vec_grow((void **)&b->cps.v, &b->cps.cap, off + 2 * k, sizeof(uint32_t), 16 << 20)) {
        fy_free(r);
        return gb_fail(b, FY_ERR_INVALID, "grammar: too many codepoint ranges");
    }
    if (k) memcpy(b->cps.v + off, r, (size_t)k * 2 * sizeof(uint32_t));
    b->cps.n += 2 * k;
    fy_free(r);
    return node_new(b, GN_CPS, (int32_t)off, k, 0);
}

static int32_t list_node(gb_t *b, uint8_t kind, const int32_t *kids, int32_t n)
{
    if (b->st) return -1;
    for (int32_t i = 0; i < n; i++)
        if (kids[i] < 0) return -1;
    if (kind == GN_SEQ && n == 1) return kids[0];
    if (kind == GN_ALT && n == 1) return kids[0];
    if (n == 0) return kind == GN_SEQ ? gb_empty(b) : gb_fail(b, FY_ERR_INVALID, "grammar: a choice of nothing");
    int64_t off = b->kids.n;
    if (!vec_grow((void **)&b->kids.v, &b->kids.cap, off + n, sizeof(int32_t), FY_GRAMMAR_MAX_ELEMS))
        return gb_fail(b, FY_ERR_INVALID, "grammar: too many expression nodes");
    memcpy(b->kids.v + off, kids, (size_t)n * sizeof(int32_t));
    b->kids.n += n;
    return node_new(b, kind, (int32_t)off, n, 0);
}

int32_t gb_seq(gb_t *b, const int32_t *kids, int32_t n) { return list_node(b, GN_SEQ, kids, n); }
int32_t gb_alt(gb_t *b, const int32_t *kids, int32_t n) { return list_node(b, GN_ALT, kids, n); }

static int32_t list_v(gb_t *b, uint8_t kind, va_list ap)
{
    int32_t kids[64], n = 0;
    for (int32_t k; (k = va_arg(ap, int32_t)) != GB_NONE;) {
        if (n == 64) return gb_fail(b, FY_ERR_INTERNAL, "grammar: too many arguments");
        kids[n++] = k;
    }
    return list_node(b, kind, kids, n);
}

int32_t gb_seqv(gb_t *b, ...)
{
    va_list ap;
    va_start(ap, b);
    int32_t r = list_v(b, GN_SEQ, ap);
    va_end(ap);
    return r;
}

int32_t gb_altv(gb_t *b, ...)
{
    va_list ap;
    va_start(ap, b);
    int32_t r = list_v(b, GN_ALT, ap);
    va_end(ap);
    return r;
}

int32_t gb_rep(gb_t *b, int32_t x, int32_t min, int32_t max)
{
    if (x < 0 || b->st) return -1;
    if (min < 0 || min > FY_GRAMMAR_MAX_REPEAT || max > FY_GRAMMAR_MAX_REPEAT || (max >= 0 && max < min))
        return gb_fail(b, FY_ERR_INVALID, "grammar: repetition {%d,%d} outside 0..%d", min, max, FY_GRAMMAR_MAX_REPEAT);
    if (min == 1 && max == 1) return x;
    return node_new(b, GN_REP, x, min, max);
}

int32_t gb_rule(gb_t *b, const char *name)
{
    if (b->st) return -1;
    brule_t r = {fy_strdup(name ? name : "r"), -1};
    if (!r.name) return gb_fail(b, FY_ERR_NOMEM, "grammar: out of memory");
    int32_t id = VEC_PUSH(b, b->rules, r, FY_GRAMMAR_MAX_RULES, "rules");
    if (id < 0) fy_free(r.name);
    return id;
}

void gb_rule_set(gb_t *b, int32_t rule, int32_t body)
{
    if (rule >= 0 && rule < b->rules.n) b->rules.v[rule].body = body;
}

int32_t gb_ref(gb_t *b, int32_t rule) { return rule < 0 ? -1 : node_new(b, GN_REF, rule, 0, 0); }

int32_t gb_share(gb_t *b, const char *name, int32_t node)
{
    if (node < 0) return -1;
    int32_t r = gb_rule(b, name);
    gb_rule_set(b, r, node);
    return gb_ref(b, r);
}

/* ---- shared JSON pieces ---------------------------------------------------------------------------------- */

static void set_add(uint32_t set[8], int lo, int hi)
{
    for (int c = lo; c <= hi; c++) set[c >> 5] |= 1u << (c & 31);
}

static int32_t byte_class(gb_t *b, const char *spec)
{
    /* spec: pairs of lo, hi characters */
    uint32_t set[8] = {0};
    for (; spec[0] && spec[1]; spec += 2) set_add(set, (unsigned char)spec[0], (unsigned char)spec[1]);
    return gb_bytes(b, set);
}

int32_t gb_json_ws(gb_t *b)
{
    if (b->j_ws < 0) {
        int32_t nl =
            gb_seqv(b, gb_str(b, "\n"), gb_rep(b, byte_class(b, "  \t\t"), 0, FY_GRAMMAR_JSON_WS_MAX), GB_NONE);
        int32_t r = gb_rule(b, "ws");
        gb_rule_set(b, r, gb_altv(b, gb_empty(b), gb_str(b, " "), nl, GB_NONE));
        b->j_ws = r;
    }
    return gb_ref(b, b->j_ws);
}

int32_t gb_json_char(gb_t *b)
{
    if (b->j_char < 0) {
        static const uint32_t plain[] = {0x20, 0x21, 0x23, 0x5B, 0x5D, 0x10FFFF};
        int32_t hex = byte_class(b, "09afAF");
        int32_t esc = gb_seqv(b, gb_str(b, "\\"),
                              gb_altv(b, byte_class(b, "\"\"\\\\//bbffnnrrtt"),
                                      gb_seqv(b, gb_str(b, "u"), gb_rep(b, hex, 4, 4), GB_NONE), GB_NONE),
                              GB_NONE);
        int32_t r = gb_rule(b, "char");
        gb_rule_set(b, r, gb_altv(b, gb_cps(b, plain, 3, false), esc, GB_NONE));
        b->j_char = r;
    }
    return gb_ref(b, b->j_char);
}

int32_t gb_json_string(gb_t *b)
{
    if (b->j_string < 0) {
        int32_t r = gb_rule(b, "string");
        gb_rule_set(b, r, gb_seqv(b, gb_str(b, "\""), gb_rep(b, gb_json_char(b), 0, -1), gb_str(b, "\""), GB_NONE));
        b->j_string = r;
    }
    return gb_ref(b, b->j_string);
}

static int32_t json_number(gb_t *b)
{
    if (b->j_number < 0) {
        int32_t d = byte_class(b, "09");
        int32_t intpart =
            gb_altv(b, gb_str(b, "0"), gb_seqv(b, byte_class(b, "19"), gb_rep(b, d, 0, 15), GB_NONE), GB_NONE);
        int32_t frac = gb_seqv(b, gb_str(b, "."), gb_rep(b, d, 1, 16), GB_NONE);
        int32_t exp =
            gb_seqv(b, byte_class(b, "eeEE"), gb_rep(b, byte_class(b, "++--"), 0, 1), gb_rep(b, d, 1, 3), GB_NONE);
        int32_t r = gb_rule(b, "number");
        gb_rule_set(
            b, r,
            gb_seqv(b, gb_rep(b, gb_str(b, "-"), 0, 1), intpart, gb_rep(b, frac, 0, 1), gb_rep(b, exp, 0, 1), GB_NONE));
        b->j_number = r;
    }
    return gb_ref(b, b->j_number);
}

int32_t gb_json_value(gb_t *b)
{
    if (b->j_value < 0) {
        int32_t value = gb_rule(b, "value");
        b->j_value = value;
        int32_t object = gb_rule(b, "object");
        b->j_object = object;
        int32_t array = gb_rule(b, "array");
        int32_t ws = gb_json_ws(b);
        int32_t member =
            gb_share(b, "member", gb_seqv(b, gb_json_string(b), ws, gb_str(b, ":"), ws, gb_ref(b, value), ws, GB_NONE));
        int32_t more_m = gb_rep(b, gb_seqv(b, gb_str(b, ","), ws, member, GB_NONE), 0, -1);
        gb_rule_set(b, object,
                    gb_seqv(b, gb_str(b, "{"), ws, gb_rep(b, gb_seqv(b, member, more_m, GB_NONE), 0, 1), gb_str(b, "}"),
                            GB_NONE));
        int32_t item = gb_seqv(b, gb_ref(b, value), ws, GB_NONE);
        int32_t more_i = gb_rep(b, gb_seqv(b, gb_str(b, ","), ws, item, GB_NONE), 0, -1);
        gb_rule_set(b, array,
                    gb_seqv(b, gb_str(b, "["), ws, gb_rep(b, gb_seqv(b, item, more_i, GB_NONE), 0, 1), gb_str(b, "]"),
                            GB_NONE));
        gb_rule_set(b, value,
                    gb_altv(b, gb_ref(b, object), gb_ref(b, array), gb_json_string(b), json_number(b),
                            gb_str(b, "true"), gb_str(b, "false"), gb_str(b, "null"), GB_NONE));
    }
    return gb_ref(b, b->j_value);
}

int32_t gb_json_object(gb_t *b)
{
    if (gb_json_value(b) < 0) return -1;
    return gb_ref(b, b->j_object);
}

/* ======================================================================================================== */
/* lowering                                                                                                 */
/* ======================================================================================================== */

/* UTF-8 byte-range sequences for codepoints lo..hi (regex-syntax's
 * Utf8Sequences): each call of emit gets n ranges, one per byte. */
typedef struct useq {
    uint8_t lo[4], hi[4];
    int n;
} useq_t;

static int utf8_enc(uint32_t c, uint8_t *o)
{
    if (c < 0x80) {
        o[0] = (uint8_t)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (uint8_t)(0xC0 | c >> 6);
        o[1] = (uint8_t)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (uint8_t)(0xE0 | c >> 12);
        o[1] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | c >> 18);
    o[1] = (uint8_t)(0x80 | ((c >> 12) & 0x3F));
    o[2] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
    o[3] = (uint8_t)(0x80 | (c & 0x3F));
    return 4;
}

static void utf8_split(uint32_t lo, uint32_t hi, useq_t *out, int *n_out, int cap)
{
    if (lo > hi || *n_out >= cap) return;
    if (lo <= 0xD7FF && hi >= 0xD800) { /* surrogates never */
        utf8_split(lo, 0xD7FF, out, n_out, cap);
        if (hi > 0xDFFF) utf8_split(0xE000, hi, out, n_out, cap);
        return;
    }
    if (lo >= 0xD800 && lo <= 0xDFFF) {
        if (hi > 0xDFFF) utf8_split(0xE000, hi, out, n_out, cap);
        return;
    }
    static const uint32_t maxes[] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++) {
        if (lo <= maxes[i] && hi > maxes[i]) {
            utf8_split(lo, maxes[i], out, n_out, cap);
            utf8_split(maxes[i] + 1, hi, out, n_out, cap);
            return;
        }
    }
    if (hi < 0x80) {
        out[*n_out] = (useq_t){{(uint8_t)lo}, {(uint8_t)hi}, 1};
        (*n_out)++;
        return;
    }
    for (int i = 1; i < 4; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                utf8_split(lo, lo | m, out, n_out, cap);
                utf8_split((lo | m) + 1, hi, out, n_out, cap);
                return;
            }
            if ((hi & m) != m) {
                utf8_split(lo, (hi & ~m) - 1, out, n_out, cap);
                utf8_split(hi & ~m, hi, out, n_out, cap);
                return;
            }
        }
    }
    useq_t s;
    int n = utf8_enc(lo, s.lo);
    utf8_enc(hi, s.hi);
    s.n = n;
    out[(*n_out)++] = s;
}

static int32_t single_byte_set(gb_t *b, uint8_t c)
{
    uint32_t set[8] = {0};
    set[c >> 5] |= 1u << (c & 31);
    return set_intern(b, set);
}

static void emit(gb_t *b, gelem_t e)
{
    if (b->st) return;
    VEC_PUSH(b, b->scratch, e, FY_GRAMMAR_MAX_ELEMS, "grammar elements");
}

static int32_t helper_rule(gb_t *b, int32_t node, const char *name, int32_t body)
{
    if (b->nodes.v[node].helper >= 0) return b->nodes.v[node].helper;
    int32_t r = gb_rule(b, name);
    gb_rule_set(b, r, body);
    if (r >= 0) b->nodes.v[node].helper = r;
    return r;
}

/* The codepoint set of node as a rule: its one-byte ranges as one set, and
 * one alternative per multi-byte sequence. */
static int32_t cps_body(gb_t *b, int32_t node)
{
    gnode_t n = b->nodes.v[node];
    int cap = 64 + 8 * n.b;
    useq_t *seqs = fy_malloc((size_t)cap * sizeof(*seqs));
    int32_t *kids = fy_malloc(((size_t)cap + 1) * sizeof(int32_t));
    if (!seqs || !kids) {
        fy_free(seqs);
        fy_free(kids);
        return gb_fail(b, FY_ERR_NOMEM, "grammar: out of memory");
    }
    int ns = 0;
    for (int32_t i = 0; i < n.b; i++) utf8_split(b->cps.v[n.a + 2 * i], b->cps.v[n.a + 2 * i + 1], seqs, &ns, cap);
    uint32_t ascii[8] = {0};
    bool any_ascii = false;
    int32_t nk = 0;
    for (int i = 0; i < ns; i++) {
        if (seqs[i].n == 1) {
            set_add(ascii, seqs[i].lo[0], seqs[i].hi[0]);
            any_ascii = true;
            continue;
        }
        int32_t parts[4];
        for (int j = 0; j < seqs[i].n; j++) {
            uint32_t set[8] = {0};
            set_add(set, seqs[i].lo[j], seqs[i].hi[j]);
            parts[j] = gb_bytes(b, set);
        }
        kids[nk++] = gb_seq(b, parts, seqs[i].n);
    }
    if (any_ascii || nk == 0) kids[nk++] = gb_bytes(b, ascii); /* an empty set matches nothing */
    int32_t body = gb_alt(b, kids, nk);
    fy_free(seqs);
    fy_free(kids);
    return body;
}

static void lower_node(gb_t *b, int32_t node, int depth);

static int32_t item_ref(gb_t *b, int32_t x)
{
    /* a repeated item that is one element stays inline; anything bigger
     * becomes a rule, so that copies of it cost one element each */
    gnode_t n = b->nodes.v[x];
    if (n.kind == GN_SET || n.kind == GN_REF || n.kind == GN_ALT || n.kind == GN_CPS || (n.kind == GN_LIT && n.b == 1))
        return x; /* one element already */
    int32_t r = n.item;
    if (r < 0) {
        r = gb_rule(b, "item");
        gb_rule_set(b, r, x);
        if (r < 0) return -1;
        b->nodes.v[x].item = r;
    }
    return gb_ref(b, r);
}

static void lower_node(gb_t *b, int32_t node, int depth)
{
    if (b->st) return;
    if (depth > 10000) {
        gb_fail(b, FY_ERR_INVALID, "grammar: expression nested too deeply");
        return;
    }
    gnode_t n = b->nodes.v[node];
    switch (n.kind) {
    case GN_EMPTY: return;
    case GN_LIT:
        for (int32_t i = 0; i < n.b; i++) emit(b, (gelem_t){GE_SET, single_byte_set(b, (uint8_t)b->bytes.v[n.a + i])});
        return;
    case GN_SET: emit(b, (gelem_t){GE_SET, n.a}); return;
    case GN_CPS: {
        if (n.b >= 1 && b->cps.v[n.a + 2 * n.b - 1] < 0x80) { /* ASCII only: one set */
            uint32_t set[8] = {0};
            for (int32_t i = 0; i < n.b; i++) set_add(set, (int)b->cps.v[n.a + 2 * i], (int)b->cps.v[n.a + 2 * i + 1]);
            emit(b, (gelem_t){GE_SET, set_intern(b, set)});
            return;
        }
        int32_t r = b->nodes.v[node].helper;
        if (r < 0) r = helper_rule(b, node, "cps", cps_body(b, node));
        emit(b, (gelem_t){GE_REF, r});
        return;
    }
    case GN_SEQ:
        for (int32_t i = 0; i < n.b; i++) lower_node(b, b->kids.v[n.a + i], depth + 1);
        return;
    case GN_ALT: emit(b, (gelem_t){GE_REF, helper_rule(b, node, "alt", node)}); return;
    case GN_REF: emit(b, (gelem_t){GE_REF, n.a}); return;
    case GN_REP: {
        int32_t x = n.a, min = n.b, max = n.c;
        if (max == 0) return;
        int32_t item = item_ref(b, x);
        if (item < 0) return;
        for (int32_t i = 0; i < min; i++) lower_node(b, item, depth + 1);
        if (max == min) return;
        int32_t r = b->nodes.v[node].helper;
        if (r < 0) {
            if (max < 0) { /* R ::= item R | empty */
                r = gb_rule(b, "star");
                gb_rule_set(b, r, gb_altv(b, gb_seqv(b, item, gb_ref(b, r), GB_NONE), gb_empty(b), GB_NONE));
            } else { /* O_k ::= item O_{k-1} | empty, O_1 ::= item | empty */
                r = gb_rule(b, "opt");
                gb_rule_set(b, r, gb_altv(b, item, gb_empty(b), GB_NONE));
                for (int32_t k = 2; k <= max - min && !b->st; k++) {
                    int32_t o = gb_rule(b, "opt");
                    gb_rule_set(b, o, gb_altv(b, gb_seqv(b, item, gb_ref(b, r), GB_NONE), gb_empty(b), GB_NONE));
                    r = o;
                }
            }
            if (r < 0) return;
            b->nodes.v[node].helper = r;
        }
        emit(b, (gelem_t){GE_REF, r});
        return;
    }
    }
}

static void lower_alt(gb_t *b, int32_t rule, int32_t node)
{
    b->scratch.n = 0;
    lower_node(b, node, 0);
    emit(b, (gelem_t){GE_END, 0});
    if (b->st) return;
    /* an alternative through an empty byte set can never finish: left
     * in, the mask could lead into it and then allow nothing; out, a rule
     * left with no alternatives is reported by the productivity check */
    static const uint32_t zero[8];
    for (int64_t i = 0; i < b->scratch.n; i++)
        if (b->scratch.v[i].type == GE_SET && !memcmp(b->sets.v[b->scratch.v[i].v], zero, 32)) return;
    int32_t start = (int32_t)b->elems.n;
    if (!vec_grow((void **)&b->elems.v, &b->elems.cap, b->elems.n + b->scratch.n, sizeof(gelem_t),
                  FY_GRAMMAR_MAX_ELEMS)) {
        gb_fail(b, FY_ERR_INVALID, "grammar: more than %d elements", FY_GRAMMAR_MAX_ELEMS);
        return;
    }
    memcpy(b->elems.v + b->elems.n, b->scratch.v, (size_t)b->scratch.n * sizeof(gelem_t));
    b->elems.n += b->scratch.n;
    VEC_PUSH(b, b->alts, start, FY_GRAMMAR_MAX_ELEMS, "alternatives");
    VEC_PUSH(b, b->alt_rule, rule, FY_GRAMMAR_MAX_ELEMS, "alternatives");
}

/* ---- checks ------------------------------------------------------------------------------------------------ */

/* For every rule, whether it derives the empty string (nullable) or some
 * string at all (productive): a worklist over "elements not yet known". */
static bool *rule_fixpoint(gb_t *b, bool productive)
{
    int32_t nr = (int32_t)b->rules.n, na = (int32_t)b->alts.n;
    bool *mark = fy_calloc((size_t)nr + 1, 1);
    int32_t *need = fy_calloc((size_t)na + 1, sizeof(int32_t));
    int32_t *occ_n = fy_calloc((size_t)nr + 1, sizeof(int32_t));
    int32_t *occ_off = fy_calloc((size_t)nr + 2, sizeof(int32_t));
    int32_t *queue = fy_malloc(((size_t)nr + 1) * sizeof(int32_t));
    int32_t *occ = NULL;
    if (!mark || !need || !occ_n || !occ_off || !queue) goto fail;
    int64_t total = 0;
    for (int32_t a = 0; a < na; a++)
        for (int32_t p = b->alts.v[a]; b->elems.v[p].type != GE_END; p++)
            if (b->elems.v[p].type == GE_REF) occ_n[b->elems.v[p].v]++, total++;
    occ = fy_malloc(((size_t)total + 1) * sizeof(int32_t));
    if (!occ) goto fail;
    for (int32_t r = 0; r < nr; r++) occ_off[r + 1] = occ_off[r] + occ_n[r];
    memset(occ_n, 0, (size_t)nr * sizeof(int32_t));
    int32_t qn = 0;
    for (int32_t a = 0; a < na; a++) {
        bool never = false;
        for (int32_t p = b->alts.v[a]; b->elems.v[p].type != GE_END; p++) {
            gelem_t e = b->elems.v[p];
            if (e.type == GE_REF) {
                occ[occ_off[e.v] + occ_n[e.v]++] = a;
                need[a]++;
            } else if (!productive) {
                never = true; /* a byte is never empty */
            } else {
                static const uint32_t zero[8];
                if (!memcmp(b->sets.v[e.v], zero, 32)) never = true;
            }
        }
        if (never) need[a] = -1;
        int32_t r = b->alt_rule.v[a];
        if (need[a] == 0 && !mark[r]) mark[r] = true, queue[qn++] = r;
    }
    for (int32_t qi = 0; qi < qn; qi++) {
        int32_t r = queue[qi];
        for (int32_t k = occ_off[r]; k < occ_off[r + 1]; k++) {
            int32_t a = occ[k];
            if (need[a] > 0 && --need[a] == 0) {
                int32_t ra = b->alt_rule.v[a];
                if (!mark[ra]) mark[ra] = true, queue[qn++] = ra;
            }
        }
    }
    fy_free(need);
    fy_free(occ_n);
    fy_free(occ_off);
    fy_free(queue);
    fy_free(occ);
    return mark;
fail:
    fy_free(mark);
    fy_free(need);
    fy_free(occ_n);
    fy_free(occ_off);
    fy_free(queue);
    fy_free(occ);
    gb_fail(b, FY_ERR_NOMEM, "grammar: out of memory");
    return NULL;
}

/* Left recursion: a cycle through references each preceded only by
 * nullable elements.  Iterative depth-first search with colours. */
static void check_left_recursion(gb_t *b, const bool *nullable)
{
    int32_t nr = (int32_t)b->rules.n;
    uint8_t *colour = fy_calloc((size_t)nr + 1, 1);
    int32_t *stack_r = fy_malloc(((size_t)nr + 1) * sizeof(int32_t));
    int32_t *stack_a = fy_malloc(((size_t)nr + 1) * sizeof(int32_t)); /* alt index within rule */
    int32_t *stack_p = fy_malloc(((size_t)nr + 1) * sizeof(int32_t)); /* element within alt */
    if (!colour || !stack_r || !stack_a || !stack_p) {
        gb_fail(b, FY_ERR_NOMEM, "grammar: out of memory");
        goto out;
    }
    for (int32_t s = 0; s < nr && !b->st; s++) {
        if (colour[s]) continue;
        int32_t sp = 0;
        stack_r[0] = s, stack_a[0] = 0, stack_p[0] = -1;
        colour[s] = 1;
        while (sp >= 0 && !b->st) {
            int32_t r = stack_r[sp];
            int32_t first = b->rule_alt_first[r], na = b->rule_n_alts[r];
            /* the next left-corner reference of r */
            int32_t next = -1;
            while (stack_a[sp] < na) {
                int32_t start = b->alts.v[first + stack_a[sp]];
                int32_t p = stack_p[sp] < 0 ? start : stack_p[sp] + 1;
                if (stack_p[sp] >= 0) { /* continue only past a nullable reference */
                    gelem_t prev = b->elems.v[stack_p[sp]];
                    if (!(prev.type == GE_REF && nullable[prev.v])) p = -1;
                }
                if (p >= 0 && b->elems.v[p].type == GE_REF) {
                    stack_p[sp] = p;
                    next = b->elems.v[p].v;
                    break;
                }
                stack_a[sp]++;
                stack_p[sp] = -1;
            }
            if (next < 0) {
                colour[r] = 2;
                sp--;
                continue;
            }
            if (colour[next] == 1) {
                gb_fail(b, FY_ERR_INVALID,
                        "grammar: rule '%s' is left-recursive (or repeats something that can be empty)",
                        b->rules.v[next].name);
                break;
            }
            if (colour[next] == 0) {
                colour[next] = 1;
                sp++;
                stack_r[sp] = next, stack_a[sp] = 0, stack_p[sp] = -1;
            }
        }
    }
out:
    fy_free(colour);
    fy_free(stack_r);
    fy_free(stack_a);
    fy_free(stack_p);
}

static void check_productive(gb_t *b, int32_t root, const bool *productive)
{
    int32_t nr = (int32_t)b->rules.n;
    if (!productive[root]) {
        gb_fail(b, FY_ERR_INVALID, "grammar: matches no text at all");
        return;
    }
    bool *seen = fy_calloc((size_t)nr + 1, 1);
    int32_t *q = fy_malloc(((size_t)nr + 1) * sizeof(int32_t));
    if (!seen || !q) {
        gb_fail(b, FY_ERR_NOMEM, "grammar: out of memory");
        goto out;
    }
    int32_t qn = 0;
    q[qn++] = root;
    seen[root] = true;
    for (int32_t i = 0; i < qn && !b->st; i++) {
        int32_t r = q[i];
        if (!productive[r]) {
            gb_fail(b, FY_ERR_INVALID, "grammar: rule '%s' can never finish", b->rules.v[r].name);
            break;
        }
        for (int32_t a = b->rule_alt_first[r]; a < b->rule_alt_first[r] + b->rule_n_alts[r]; a++)
            for (int32_t p = b->alts.v[a]; b->elems.v[p].type != GE_END; p++)
                if (b->elems.v[p].type == GE_REF && !seen[b->elems.v[p].v]) {
                    seen[b->elems.v[p].v] = true;
                    q[qn++] = b->elems.v[p].v;
                }
    }
out:
    fy_free(seen);
    fy_free(q);
}

fy_status_t gb_finish(gb_t *b, int32_t root, fy_grammar_t **g_p, char *err, size_t err_cap)
{
    if (!b->st && (root < 0 || root >= b->rules.n)) gb_fail(b, FY_ERR_INTERNAL, "grammar: no start rule");
    /* lower every rule, those made while lowering included; a rule's
     * alternatives are contiguous because rules are lowered one at a time */
    for (int64_t r = 0; r < b->rules.n && !b->st; r++) {
        int32_t body = b->rules.v[r].body;
        if (body < 0) {
            gb_fail(b, FY_ERR_INTERNAL, "grammar: rule '%s' has no body", b->rules.v[r].name);
            break;
        }
        if (b->nodes.v[body].kind == GN_ALT) {
            gnode_t n = b->nodes.v[body];
            for (int32_t i = 0; i < n.b && !b->st; i++) lower_alt(b, (int32_t)r, b->kids.v[n.a + i]);
        } else {
            lower_alt(b, (int32_t)r, body);
        }
    }
    fy_grammar_t *g = NULL;
    bool *nullable = NULL, *productive = NULL;
    int32_t nr = (int32_t)b->rules.n;
    if (!b->st) {
        b->rule_alt_first = fy_calloc((size_t)nr + 1, sizeof(int32_t));
        b->rule_n_alts = fy_calloc((size_t)nr + 1, sizeof(int32_t));
        if (!b->rule_alt_first || !b->rule_n_alts) gb_fail(b, FY_ERR_NOMEM, "grammar: out of memory");
    }
    if (!b->st) {
        for (int32_t a = (int32_t)b->alts.n - 1; a >= 0; a--) b->rule_alt_first[b->alt_rule.v[a]] = a;
        for (int32_t a = 0; a < b->alts.n; a++) b->rule_n_alts[b->alt_rule.v[a]]++;
        nullable = rule_fixpoint(b, false);
    }
    if (!b->st) check_left_recursion(b, nullable);
    if (!b->st) productive = rule_fixpoint(b, true);
    if (!b->st) check_productive(b, root, productive);
    fy_free(nullable);
    fy_free(productive);
    if (!b->st) {
        g = fy_calloc(1, sizeof(*g));
        if (g) {
            g->refs = 1;
            g->n_elems = (int32_t)b->elems.n;
            g->n_alts = (int32_t)b->alts.n;
            g->n_rules = nr;
            g->n_sets = (int32_t)b->sets.n;
            g->root = root;
            g->elems = fy_malloc((size_t)g->n_elems * sizeof(gelem_t) + 1);
            g->alts = fy_malloc((size_t)g->n_alts * sizeof(int32_t) + 1);
            g->rules = fy_calloc((size_t)nr + 1, sizeof(grule_t));
            g->sets = fy_malloc((size_t)g->n_sets * 32 + 1);
        }
        if (!g || !g->elems || !g->alts || !g->rules || !g->sets) {
            gb_fail(b, FY_ERR_NOMEM, "grammar: out of memory");
        } else {
            memcpy(g->elems, b->elems.v, (size_t)g->n_elems * sizeof(gelem_t));
            memcpy(g->alts, b->alts.v, (size_t)g->n_alts * sizeof(int32_t));
            if (g->n_sets) memcpy(g->sets, b->sets.v, (size_t)g->n_sets * 32); /* none for an empty language */
            for (int32_t r = 0; r < nr; r++) {
                g->rules[r].alt_first = b->rule_alt_first[r];
                g->rules[r].n_alts = b->rule_n_alts[r];
                g->rules[r].name = b->rules.v[r].name;
                b->rules.v[r].name = NULL;
            }
        }
    }
    if (b->st) {
        if (g) {
            g->refs = 1;
            fy_grammar_unref(g);
        }
        return gb_error(b, err, err_cap);
    }
    *g_p = g;
    return FY_OK;
}

/* ======================================================================================================== */
/* grammars                                                                                                 */
/* ======================================================================================================== */

bool fy_grammar_kind_of_gen(int gen_kind, fy_grammar_kind_t *kind_p)
{
    switch (gen_kind) {
    case FY_GEN_GRAMMAR_JSON_SCHEMA: *kind_p = FY_GRAMMAR_JSON_SCHEMA; return true;
    case FY_GEN_GRAMMAR_JSON_OBJECT: *kind_p = FY_GRAMMAR_JSON_OBJECT; return true;
    case FY_GEN_GRAMMAR_REGEX: *kind_p = FY_GRAMMAR_REGEX; return true;
    case FY_GEN_GRAMMAR_CHOICE: *kind_p = FY_GRAMMAR_CHOICE; return true;
    default: return false;
    }
}

const char *fy_grammar_kind_str(fy_grammar_kind_t kind)
{
    switch (kind) {
    case FY_GRAMMAR_JSON_SCHEMA: return "json_schema";
    case FY_GRAMMAR_JSON_OBJECT: return "json_object";
    case FY_GRAMMAR_REGEX: return "regex";
    case FY_GRAMMAR_CHOICE: return "choice";
    case FY_GRAMMAR_GBNF: return "gbnf";
    case FY_GRAMMAR_KIND_COUNT: break;
    }
    return "?";
}

fy_grammar_t *fy_grammar_ref(fy_grammar_t *g)
{
    if (g) __atomic_add_fetch(&g->refs, 1, __ATOMIC_RELAXED);
    return g;
}

void fy_grammar_unref(fy_grammar_t *g)
{
    if (!g || __atomic_sub_fetch(&g->refs, 1, __ATOMIC_ACQ_REL) > 0) return;
    if (g->rules)
        for (int32_t r = 0; r < g->n_rules; r++) fy_free(g->rules[r].name);
    fy_free(g->rules);
    fy_free(g->elems);
    fy_free(g->alts);
    fy_free(g->sets);
    fy_free(g);
}

int32_t fy_grammar_n_rules(const fy_grammar_t *g) { return g->n_rules; }
int32_t fy_grammar_n_elems(const fy_grammar_t *g) { return g->n_elems; }

static fy_status_t compile_with(gb_t *b, fy_grammar_kind_t kind, const char *src, size_t len, const void *json,
                                int32_t *root_p)
{
    switch (kind) {
    case FY_GRAMMAR_JSON_SCHEMA: {
        if (json) return fy_json_schema_compile(b, json, root_p);
        json_error_t je;
        json_t *doc = json_loadb(src, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
        if (!doc) {
            gb_fail(b, FY_ERR_INVALID, "json_schema: not JSON: %s (line %d, column %d)", je.text, je.line, je.column);
            return b->st;
        }
        fy_status_t st = fy_json_schema_compile(b, doc, root_p);
        json_decref(doc);
        return st;
    }
    case FY_GRAMMAR_JSON_OBJECT: {
        int32_t r = gb_rule(b, "root");
        gb_rule_set(b, r, gb_json_object(b));
        *root_p = r;
        return b->st;
    }
    case FY_GRAMMAR_REGEX: {
        int32_t r = -1;
        fy_status_t st = fy_regex_compile(b, src, len, false, &r);
        if (st) return st;
        int32_t root = gb_rule(b, "root");
        gb_rule_set(b, root, r);
        *root_p = root;
        return b->st;
    }
    case FY_GRAMMAR_CHOICE: return fy_choice_compile(b, src, len, root_p);
    case FY_GRAMMAR_GBNF: return fy_gbnf_compile(b, src, len, root_p);
    case FY_GRAMMAR_KIND_COUNT: break;
    }
    gb_fail(b, FY_ERR_INVALID, "grammar: unknown kind %d", (int)kind);
    return b->st;
}

/* (the matcher's STATE_MAX_TOPS and ADVANCE_MAX_WORK, below) */
#define START_LIMIT_MSG                                                                                                \
    "its start is beyond the matcher's limits: more than 4096 alternatives alive at once (or 16384 expansions), "      \
    "such as a choice among that many; make it smaller"
static fy_status_t gmatch_start(fy_grammar_t *g, fy_gmatch_t **m_p);

static fy_status_t compile(fy_grammar_kind_t kind, const char *src, size_t len, const void *json, fy_grammar_t **g_p,
                           char *err, size_t err_cap)
{
    if (err && err_cap) err[0] = '\0';
    if ((int)kind < 0 || kind >= FY_GRAMMAR_KIND_COUNT) {
        if (err) snprintf(err, err_cap, "grammar: unknown kind %d", (int)kind);
        return FY_ERR_INVALID;
    }
    if (!json && len > FY_GRAMMAR_MAX_SOURCE) {
        if (err)
            snprintf(err, err_cap, "%s: %zu bytes (at most %d)", fy_grammar_kind_str(kind), len, FY_GRAMMAR_MAX_SOURCE);
        return FY_ERR_INVALID;
    }
    gb_t *b = gb_create();
    if (!b) {
        if (err) snprintf(err, err_cap, "grammar: out of memory");
        return FY_ERR_NOMEM;
    }
    int32_t root = -1;
    fy_status_t st = compile_with(b, kind, src ? src : "", src ? len : 0, json, &root);
    if (!st && !b->st)
        st = gb_finish(b, root, g_p, err, err_cap);
    else
        st = gb_error(b, err, err_cap);
    gb_destroy(b);
    /* a matcher can start on it (where the worker's would fail) */
    fy_gmatch_t *m = NULL;
    fy_status_t ms = st ? FY_OK : gmatch_start(*g_p, &m);
    fy_gmatch_destroy(m);
    if (ms) {
        fy_grammar_unref(*g_p);
        *g_p = NULL;
        if (err) snprintf(err, err_cap, "%s: %s", fy_grammar_kind_str(kind), START_LIMIT_MSG);
        return ms;
    }
    return st;
}

fy_status_t fy_grammar_compile(fy_grammar_kind_t kind, const char *src, size_t len, fy_grammar_t **g_p, char *err,
                               size_t err_cap)
{
    return compile(kind, src, len, NULL, g_p, err, err_cap);
}

fy_status_t fy_grammar_from_json_schema(const void *schema_json, fy_grammar_t **g_p, char *err, size_t err_cap)
{
    return compile(FY_GRAMMAR_JSON_SCHEMA, NULL, 0, schema_json, g_p, err, err_cap);
}

/* ---- dump ------------------------------------------------------------------------------------------------- */

static void dump_set(fy_strbuf_t *s, const uint32_t set[8])
{
    int n = 0;
    for (int c = 0; c < 256; c++) n += (set[c >> 5] >> (c & 31)) & 1;
    if (n == 1) {
        for (int c = 0; c < 256; c++)
            if ((set[c >> 5] >> (c & 31)) & 1) {
                if (c >= 0x21 && c < 0x7f && c != '"' && c != '\\')
                    fy_strbuf_printf(s, "\"%c\"", c);
                else
                    fy_strbuf_printf(s, "\"\\x%02X\"", c);
            }
        return;
    }
    fy_strbuf_printf(s, "[");
    for (int c = 0; c < 256;) {
        if (!((set[c >> 5] >> (c & 31)) & 1)) {
            c++;
            continue;
        }
        int e = c;
        while (e + 1 < 256 && ((set[(e + 1) >> 5] >> ((e + 1) & 31)) & 1)) e++;
        if (c >= 0x21 && c < 0x7f && c != ']' && c != '\\' && c != '-')
            fy_strbuf_printf(s, "%c", c);
        else
            fy_strbuf_printf(s, "\\x%02X", c);
        if (e > c) {
            fy_strbuf_printf(s, "-");
            if (e >= 0x21 && e < 0x7f && e != ']' && e != '\\' && e != '-')
                fy_strbuf_printf(s, "%c", e);
            else
                fy_strbuf_printf(s, "\\x%02X", e);
        }
        c = e + 1;
    }
    fy_strbuf_printf(s, "]");
}

char *fy_grammar_dump(const fy_grammar_t *g)
{
    fy_strbuf_t s = {0};
    for (int32_t r = 0; r < g->n_rules; r++) {
        fy_strbuf_printf(&s, "%s%s-%d ::=", r == g->root ? "root:" : "", g->rules[r].name, r);
        for (int32_t a = 0; a < g->rules[r].n_alts; a++) {
            if (a) fy_strbuf_printf(&s, " |");
            int32_t p = g->alts[g->rules[r].alt_first + a];
            if (g->elems[p].type == GE_END) fy_strbuf_printf(&s, " \"\"");
            for (; g->elems[p].type != GE_END; p++) {
                fy_strbuf_printf(&s, " ");
                if (g->elems[p].type == GE_REF)
                    fy_strbuf_printf(&s, "%s-%d", g->rules[g->elems[p].v].name, g->elems[p].v);
                else
                    dump_set(&s, g->sets[g->elems[p].v]);
            }
        }
        fy_strbuf_printf(&s, "\n");
    }
    return fy_strbuf_take(&s, NULL);
}

/* ======================================================================================================== */
/* matcher                                                                                                  */
/* ======================================================================================================== */

/* Memo bounds: past these the store is rebuilt with only the states the
 * matcher still needs (the current one and its history). */
#define STORE_MAX_NODES (1 << 20)
#define STORE_MAX_STATES (1 << 14)
#define STORE_MAX_TRANS 4096 /* 256-entry transition tables (1 KiB each) */
#define MASK_SLOTS 64
#define ADVANCE_MAX_WORK (1 << 14) /* expansions per byte */
#define STATE_MAX_TOPS 4096        /* stacks alive at once */

#define T_UNKNOWN (-2)
#define T_DEAD (-1)

typedef struct gstate {
    int64_t top_off;
    int32_t n_top;
    int32_t trans; /* table index or -1 */
    int32_t mask;  /* mask slot or -1 */
    uint32_t hash;
    uint8_t complete;
} gstate_t;

typedef struct hist {
    int32_t state;
    bool ended;
} hist_t;

struct fy_gmatch {
    fy_grammar_t *g;
    /* stack nodes, hash-consed */
    int32_t *npos, *npar;
    int32_t n_nodes, cap_nodes;
    int32_t *nhash; /* [nhash_mask + 1] node ids or -1 */
    uint32_t nhash_mask;
    /* states, interned */
    gstate_t *states;
    int32_t n_states, cap_states;
    int32_t *tops;
    int64_t n_tops, cap_tops;
    int32_t *shash;
    uint32_t shash_mask;
    /* transitions: table t is trans[256 t .. 256 t + 255] */
    int32_t *trans;
    int32_t n_trans, cap_trans;
    /* masks of states, MASK_SLOTS of them, round robin */
    const fy_token_trie_t *mask_trie;
    uint32_t *masks;
    int32_t mask_owner[MASK_SLOTS];
    int32_t mask_next;
    /* scratch for advancing */
    int64_t *work;
    int32_t cap_work;
    uint64_t *vkeys; /* visited (pos, parent) of this advance, by generation */
    uint32_t *vgen, gen;
    uint32_t vmask;
    int32_t *tmp;
    int32_t cap_tmp;
    /* where the walk is: (next child, end, state) per depth */
    int32_t *wi, *we, *ws;
    int32_t cap_walk;
    /* the matcher */
    int32_t cur;
    bool ended;
    hist_t hist[FY_GMATCH_HISTORY];
    int32_t hist_head, n_hist;
    fy_gmatch_stats_t stats;
    bool broken; /* a limit was hit: everything refused from here */
};

static inline uint32_t mix32(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return (uint32_t)x;
}

static bool grow32(int32_t **p, int32_t *cap, int64_t need)
{
    if (need <= *cap) return true;
    int64_t c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    if (c > INT32_MAX / 2) return false;
    int32_t *q = fy_realloc(*p, (size_t)c * sizeof(int32_t));
    if (!q) return false;
    *p = q;
    *cap = (int32_t)c;
    return true;
}

static void store_free(fy_gmatch_t *m)
{
    fy_free(m->npos);
    fy_free(m->npar);
    fy_free(m->nhash);
    fy_free(m->states);
    fy_free(m->tops);
    fy_free(m->shash);
    fy_free(m->trans);
    m->npos = m->npar = m->nhash = m->tops = m->shash = m->trans = NULL;
    m->states = NULL;
    m->n_nodes = m->cap_nodes = m->n_states = m->cap_states = m->n_trans = m->cap_trans = 0;
    m->n_tops = m->cap_tops = 0;
    m->nhash_mask = m->shash_mask = 0;
    for (int i = 0; i < MASK_SLOTS; i++) m->mask_owner[i] = -1;
}

static bool store_init(fy_gmatch_t *m)
{
    m->nhash_mask = 1023;
    m->shash_mask = 255;
    m->nhash = fy_malloc(1024 * sizeof(int32_t));
    m->shash = fy_malloc(256 * sizeof(int32_t));
    if (!m->nhash || !m->shash) return false;
    memset(m->nhash, 0xff, 1024 * sizeof(int32_t));
    memset(m->shash, 0xff, 256 * sizeof(int32_t));
    for (int i = 0; i < MASK_SLOTS; i++) m->mask_owner[i] = -1;
    return true;
}

static bool nhash_grow(fy_gmatch_t *m)
{
    uint32_t size = (m->nhash_mask + 1) * 2;
    int32_t *h = fy_malloc((size_t)size * sizeof(int32_t));
    if (!h) return false;
    memset(h, 0xff, (size_t)size * sizeof(int32_t));
    for (int32_t i = 0; i < m->n_nodes; i++) {
        uint32_t k = mix32((uint64_t)(uint32_t)m->npos[i] << 32 | (uint32_t)m->npar[i]) & (size - 1);
        while (h[k] >= 0) k = (k + 1) & (size - 1);
        h[k] = i;
    }
    fy_free(m->nhash);
    m->nhash = h;
    m->nhash_mask = size - 1;
    return true;
}

/* The node (pos, parent), made if new; -1 when out of memory. */
static int32_t cons(fy_gmatch_t *m, int32_t pos, int32_t parent)
{
    uint32_t k = mix32((uint64_t)(uint32_t)pos << 32 | (uint32_t)parent) & m->nhash_mask;
    for (int32_t id; (id = m->nhash[k]) >= 0; k = (k + 1) & m->nhash_mask)
        if (m->npos[id] == pos && m->npar[id] == parent) return id;
    if ((int64_t)(m->n_nodes + 1) * 2 > (int64_t)m->nhash_mask + 1) {
        if (!nhash_grow(m)) return -1;
        return cons(m, pos, parent);
    }
    int32_t cap = m->cap_nodes;
    if (!grow32(&m->npos, &cap, m->n_nodes + 1)) return -1;
    cap = m->cap_nodes;
    if (!grow32(&m->npar, &cap, m->n_nodes + 1)) return -1;
    m->cap_nodes = cap;
    int32_t id = m->n_nodes++;
    m->npos[id] = pos;
    m->npar[id] = parent;
    m->nhash[k] = id;
    return id;
}

static uint32_t tops_hash(const int32_t *t, int32_t n, bool complete)
{
    uint64_t h = complete ? 0x9e3779b97f4a7c15ull : 0x1234567ull;
    for (int32_t i = 0; i < n; i++) h = (h ^ (uint32_t)t[i]) * 0x100000001b3ull;
    return mix32(h ^ (uint64_t)n);
}

static bool shash_grow(fy_gmatch_t *m)
{
    uint32_t size = (m->shash_mask + 1) * 2;
    int32_t *h = fy_malloc((size_t)size * sizeof(int32_t));
    if (!h) return false;
    memset(h, 0xff, (size_t)size * sizeof(int32_t));
    for (int32_t i = 0; i < m->n_states; i++) {
        uint32_t k = m->states[i].hash & (size - 1);
        while (h[k] >= 0) k = (k + 1) & (size - 1);
        h[k] = i;
    }
    fy_free(m->shash);
    m->shash = h;
    m->shash_mask = size - 1;
    return true;
}

/* The state of sorted, distinct tops t; -1 when out of memory. */
static int32_t intern(fy_gmatch_t *m, const int32_t *t, int32_t n, bool complete)
{
    uint32_t h = tops_hash(t, n, complete);
    uint32_t k = h & m->shash_mask;
    for (int32_t id; (id = m->shash[k]) >= 0; k = (k + 1) & m->shash_mask) {
        const gstate_t *s = &m->states[id];
        if (s->hash == h && s->n_top == n && s->complete == complete &&
            (n == 0 || !memcmp(m->tops + s->top_off, t, (size_t)n * sizeof(int32_t))))
            return id;
    }
    if ((int64_t)(m->n_states + 1) * 2 > (int64_t)m->shash_mask + 1) {
        if (!shash_grow(m)) return -1;
        return intern(m, t, n, complete);
    }
    if (m->n_states == m->cap_states) {
        int32_t c = m->cap_states ? m->cap_states * 2 : 64;
        gstate_t *s = fy_realloc(m->states, (size_t)c * sizeof(gstate_t));
        if (!s) return -1;
        m->states = s;
        m->cap_states = c;
    }
    if (m->n_tops + n > m->cap_tops) {
        int64_t c = m->cap_tops ? m->cap_tops : 1024;
        while (c < m->n_tops + n) c *= 2;
        int32_t *p = fy_realloc(m->tops, (size_t)c * sizeof(int32_t));
        if (!p) return -1;
        m->tops = p;
        m->cap_tops = c;
    }
    if (n) memcpy(m->tops + m->n_tops, t, (size_t)n * sizeof(int32_t));
    int32_t id = m->n_states++;
    m->states[id] = (gstate_t){m->n_tops, n, -1, -1, h, complete};
    m->n_tops += n;
    m->shash[k] = id;
    return id;
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* Visited (pos, parent) of one advance: true if already seen. */
static bool visited(fy_gmatch_t *m, int32_t pos, int32_t parent)
{
    uint64_t key = (uint64_t)(uint32_t)pos << 32 | (uint32_t)parent;
    uint32_t k = mix32(key) & m->vmask;
    while (m->vgen[k] == m->gen) {
        if (m->vkeys[k] == key) return true;
        k = (k + 1) & m->vmask;
    }
    m->vgen[k] = m->gen;
    m->vkeys[k] = key;
    return false;
}

/* Expands the work list into m->tmp (tops); returns the number of tops or
 * -1 on a limit or out of memory; *complete set when a stack finished. */
static int32_t expand(fy_gmatch_t *m, int32_t n_work, bool *complete)
{
    const fy_grammar_t *g = m->g;
    int32_t nt = 0, done = 0;
    if (++m->gen == 0) { /* generation wrapped: clear */
        memset(m->vgen, 0, ((size_t)m->vmask + 1) * sizeof(uint32_t));
        m->gen = 1;
    }
    while (n_work > 0) {
        if (++done > ADVANCE_MAX_WORK) return -1;
        int64_t w = m->work[--n_work];
        int32_t pos = (int32_t)(w >> 32), par = (int32_t)(uint32_t)w;
        if (visited(m, pos, par)) continue;
        gelem_t e = g->elems[pos];
        if (e.type == GE_END) {
            if (par < 0)
                *complete = true;
            else
                m->work[n_work++] = (int64_t)m->npos[par] << 32 | (uint32_t)m->npar[par];
        } else if (e.type == GE_SET) {
            int32_t id = cons(m, pos, par);
            if (id < 0 || nt >= STATE_MAX_TOPS) return -1;
            m->tmp[nt++] = id;
        } else {
            int32_t cont = par;
            if (g->elems[pos + 1].type != GE_END && (cont = cons(m, pos + 1, par)) < 0) return -1;
            const grule_t *r = &g->rules[e.v];
            if (n_work + r->n_alts > m->cap_work) {
                int32_t c = m->cap_work;
                while (c < n_work + r->n_alts) c *= 2;
                int64_t *p = fy_realloc(m->work, (size_t)c * sizeof(int64_t));
                if (!p) return -1;
                m->work = p;
                m->cap_work = c;
            }
            for (int32_t a = r->n_alts - 1; a >= 0; a--)
                m->work[n_work++] = (int64_t)g->alts[r->alt_first + a] << 32 | (uint32_t)cont;
        }
    }
    if (nt > 1) {
        qsort(m->tmp, (size_t)nt, sizeof(int32_t), cmp_i32);
        int32_t k = 1;
        for (int32_t i = 1; i < nt; i++)
            if (m->tmp[i] != m->tmp[k - 1]) m->tmp[k++] = m->tmp[i];
        nt = k;
    }
    return nt;
}

/* The state after byte c from state s: T_DEAD, or -3 on a limit. */
static int32_t advance(fy_gmatch_t *m, int32_t s, uint8_t c)
{
    const fy_grammar_t *g = m->g;
    int32_t n_work = 0;
    const gstate_t *st = &m->states[s];
    for (int32_t i = 0; i < st->n_top; i++) {
        int32_t id = m->tops[st->top_off + i];
        int32_t pos = m->npos[id];
        const uint32_t *set = g->sets[g->elems[pos].v];
        if (!((set[c >> 5] >> (c & 31)) & 1)) continue;
        if (n_work == m->cap_work) {
            int64_t *p = fy_realloc(m->work, (size_t)m->cap_work * 2 * sizeof(int64_t));
            if (!p) return -3;
            m->work = p;
            m->cap_work *= 2;
        }
        m->work[n_work++] = (int64_t)(pos + 1) << 32 | (uint32_t)m->npar[id];
    }
    if (n_work == 0) return T_DEAD;
    bool complete = false;
    int32_t nt = expand(m, n_work, &complete);
    if (nt < 0) return -3;
    if (nt == 0 && !complete) return T_DEAD;
    int32_t t = intern(m, m->tmp, nt, complete);
    return t < 0 ? -3 : t;
}

/* Memoized transition; T_DEAD also when a limit is hit (m->broken set). */
static inline int32_t step(fy_gmatch_t *m, int32_t s, uint8_t c)
{
    int32_t tr = m->states[s].trans;
    if (tr >= 0) {
        int32_t t = m->trans[(size_t)tr * 256 + c];
        if (t != T_UNKNOWN) return t;
    } else {
        if (m->n_trans == m->cap_trans) {
            int32_t cap = m->cap_trans ? m->cap_trans * 2 : 16;
            int32_t *p = fy_realloc(m->trans, (size_t)cap * 256 * sizeof(int32_t));
            if (!p) {
                m->broken = true;
                return T_DEAD;
            }
            m->trans = p;
            m->cap_trans = cap;
        }
        tr = m->n_trans++;
        for (int i = 0; i < 256; i++) m->trans[(size_t)tr * 256 + i] = T_UNKNOWN;
        m->states[s].trans = tr;
    }
    int32_t t = advance(m, s, c);
    if (t == -3) {
        m->broken = true;
        return T_DEAD;
    }
    m->trans[(size_t)tr * 256 + c] = t;
    return t;
}

/* ---- state export / import (clone and memo rebuild) ----------------------------------------------------------- */

/* A state as positions: complete, n stacks, then per stack its depth and
 * the positions from the top down. */
static bool export_state(const fy_gmatch_t *m, int32_t s, int32_t **buf, int32_t *n, int32_t *cap)
{
    const gstate_t *st = &m->states[s];
    if (!grow32(buf, cap, (int64_t)*n + 2)) return false;
    (*buf)[(*n)++] = st->complete;
    (*buf)[(*n)++] = st->n_top;
    for (int32_t i = 0; i < st->n_top; i++) {
        int32_t d = 0;
        for (int32_t id = m->tops[st->top_off + i]; id >= 0; id = m->npar[id]) d++;
        if (!grow32(buf, cap, (int64_t)*n + 1 + d)) return false;
        (*buf)[(*n)++] = d;
        for (int32_t id = m->tops[st->top_off + i]; id >= 0; id = m->npar[id]) (*buf)[(*n)++] = m->npos[id];
    }
    return true;
}

static int32_t import_state(fy_gmatch_t *m, const int32_t *buf, int32_t *at)
{
    bool complete = buf[(*at)++];
    int32_t n = buf[(*at)++];
    if (!grow32(&m->tmp, &m->cap_tmp, n + 1)) return -1;
    for (int32_t i = 0; i < n; i++) {
        int32_t d = buf[(*at)++];
        int32_t par = -1;
        for (int32_t j = d - 1; j >= 0; j--)
            if ((par = cons(m, buf[*at + j], par)) < 0) return -1;
        *at += d;
        m->tmp[i] = par;
    }
    qsort(m->tmp, (size_t)n, sizeof(int32_t), cmp_i32);
    return intern(m, m->tmp, n, complete);
}

/* Moves the states src needs (current, history) into m's store, which is
 * emptied first (m may be src: the memo rebuild). */
static bool adopt(fy_gmatch_t *m, const fy_gmatch_t *src)
{
    int32_t *buf = NULL, n = 0, cap = 0;
    bool ok = export_state(src, src->cur, &buf, &n, &cap);
    for (int32_t i = 0; i < src->n_hist && ok; i++)
        ok = export_state(src, src->hist[(src->hist_head + i) % FY_GMATCH_HISTORY].state, &buf, &n, &cap);
    hist_t hist[FY_GMATCH_HISTORY];
    int32_t n_hist = src->n_hist;
    for (int32_t i = 0; i < n_hist; i++) hist[i] = src->hist[(src->hist_head + i) % FY_GMATCH_HISTORY];
    bool ended = src->ended;
    if (!ok) {
        fy_free(buf);
        return false;
    }
    store_free(m);
    if (!store_init(m)) {
        fy_free(buf);
        return false;
    }
    int32_t at = 0;
    m->cur = import_state(m, buf, &at);
    ok = m->cur >= 0;
    for (int32_t i = 0; i < n_hist && ok; i++) {
        m->hist[i].state = import_state(m, buf, &at);
        m->hist[i].ended = hist[i].ended;
        ok = m->hist[i].state >= 0;
    }
    m->hist_head = 0;
    m->n_hist = n_hist;
    m->ended = ended;
    fy_free(buf);
    return ok;
}

static void maybe_flush(fy_gmatch_t *m)
{
    if (m->n_nodes < STORE_MAX_NODES && m->n_states < STORE_MAX_STATES && m->n_trans < STORE_MAX_TRANS) return;
    m->stats.flushes++;
    if (!adopt(m, m)) m->broken = true;
}

/* ---- public ---------------------------------------------------------------------------------------------------- */

static fy_status_t gmatch_new(fy_grammar_t *g, fy_gmatch_t **m_p)
{
    fy_gmatch_t *m = fy_calloc(1, sizeof(*m));
    if (!m) goto nomem;
    m->g = fy_grammar_ref(g);
    m->cap_work = 256;
    m->work = fy_malloc((size_t)m->cap_work * sizeof(int64_t));
    m->vmask = (1u << 15) - 1; /* twice ADVANCE_MAX_WORK */
    m->vkeys = fy_malloc(((size_t)m->vmask + 1) * sizeof(uint64_t));
    m->vgen = fy_calloc((size_t)m->vmask + 1, sizeof(uint32_t));
    m->cap_tmp = STATE_MAX_TOPS;
    m->tmp = fy_malloc((size_t)m->cap_tmp * sizeof(int32_t));
    if (!m->work || !m->vkeys || !m->vgen || !m->tmp || !store_init(m)) goto nomem;
    *m_p = m;
    return FY_OK;
nomem:
    fy_gmatch_destroy(m);
    fy_error("grammar: out of memory for a matcher");
    return FY_ERR_NOMEM;
}

/* A matcher at g's start; FY_ERR_INVALID (nothing logged) when the start
 * state is beyond the matcher's limits.  What compile() checks and
 * fy_gmatch_create does: one function, so a grammar that compiles
 * (the router's check, docs/protocol.md) is one every worker can run. */
static fy_status_t gmatch_start(fy_grammar_t *g, fy_gmatch_t **m_p)
{
    fy_gmatch_t *m;
    fy_status_t st = gmatch_new(g, &m);
    if (st) return st;
    int32_t n_work = 0;
    const grule_t *r = &g->rules[g->root];
    int64_t *w = r->n_alts > m->cap_work ? fy_realloc(m->work, (size_t)r->n_alts * sizeof(int64_t)) : m->work;
    if (!w) {
        fy_gmatch_destroy(m);
        fy_error("grammar: out of memory for a matcher");
        return FY_ERR_NOMEM;
    }
    m->work = w;
    if (r->n_alts > m->cap_work) m->cap_work = r->n_alts;
    for (int32_t a = r->n_alts - 1; a >= 0; a--)
        m->work[n_work++] = (int64_t)g->alts[r->alt_first + a] << 32 | 0xffffffffu;
    bool complete = false;
    int32_t nt = expand(m, n_work, &complete);
    if (nt >= 0) m->cur = intern(m, m->tmp, nt, complete);
    if (nt < 0 || m->cur < 0) {
        fy_gmatch_destroy(m);
        return FY_ERR_INVALID;
    }
    *m_p = m;
    return FY_OK;
}

fy_status_t fy_gmatch_create(fy_grammar_t *g, fy_gmatch_t **m_p)
{
    fy_status_t st = gmatch_start(g, m_p);
    if (st == FY_ERR_INVALID) fy_error("grammar: %s", START_LIMIT_MSG);
    return st;
}

void fy_gmatch_destroy(fy_gmatch_t *m)
{
    if (!m) return;
    store_free(m);
    fy_free(m->masks);
    fy_free(m->work);
    fy_free(m->vkeys);
    fy_free(m->vgen);
    fy_free(m->tmp);
    fy_free(m->wi);
    fy_free(m->we);
    fy_free(m->ws);
    fy_grammar_unref(m->g);
    fy_free(m);
}

fy_status_t fy_gmatch_clone(const fy_gmatch_t *src, fy_gmatch_t **m_p)
{
    fy_gmatch_t *m;
    fy_status_t st = gmatch_new(src->g, &m);
    if (st) return st;
    if (!adopt(m, src)) {
        fy_gmatch_destroy(m);
        fy_error("grammar: out of memory cloning a matcher");
        return FY_ERR_NOMEM;
    }
    m->broken = src->broken;
    *m_p = m;
    return FY_OK;
}

bool fy_gmatch_can_accept_byte(fy_gmatch_t *m, uint8_t byte)
{
    if (m->ended || m->broken) return false;
    maybe_flush(m);
    return !m->broken && step(m, m->cur, byte) >= 0;
}

bool fy_gmatch_accept_byte(fy_gmatch_t *m, uint8_t byte) { return fy_gmatch_accept_bytes(m, &byte, 1); }

bool fy_gmatch_accept_bytes(fy_gmatch_t *m, const void *bytes, size_t len)
{
    if (m->ended || m->broken) return false;
    maybe_flush(m);
    int32_t s = m->cur;
    for (size_t i = 0; i < len && s >= 0; i++) s = step(m, s, ((const uint8_t *)bytes)[i]);
    if (s < 0) return false;
    m->cur = s;
    m->n_hist = 0;
    return true;
}

bool fy_gmatch_is_complete(const fy_gmatch_t *m) { return !m->broken && (m->ended || m->states[m->cur].complete); }
bool fy_gmatch_is_ended(const fy_gmatch_t *m) { return m->ended; }

static void push_hist(fy_gmatch_t *m)
{
    int32_t at = (m->hist_head + m->n_hist) % FY_GMATCH_HISTORY;
    m->hist[at] = (hist_t){m->cur, m->ended};
    if (m->n_hist < FY_GMATCH_HISTORY)
        m->n_hist++;
    else
        m->hist_head = (m->hist_head + 1) % FY_GMATCH_HISTORY;
}

fy_status_t fy_gmatch_accept_token(fy_gmatch_t *m, const fy_token_trie_t *t, int32_t id)
{
    if (m->broken || id < 0 || id >= t->n_vocab) return FY_ERR_INVALID;
    if (m->ended && !fy_token_trie_is_eog(t, id)) return FY_ERR_INVALID;
    maybe_flush(m);
    if (fy_token_trie_is_eog(t, id)) { /* ends (again, once ended: what the mask allows) */
        if (!m->ended && !m->states[m->cur].complete) return FY_ERR_INVALID;
        push_hist(m);
        m->ended = true;
        return FY_OK;
    }
    const uint8_t *p = t->tok_bytes[id];
    if (!p) return FY_ERR_INVALID;
    int32_t s = m->cur;
    for (uint32_t i = 0; i < t->tok_len[id] && s >= 0; i++) s = step(m, s, p[i]);
    if (s < 0) return FY_ERR_INVALID;
    push_hist(m);
    m->cur = s;
    return FY_OK;
}

fy_status_t fy_gmatch_rollback(fy_gmatch_t *m, int32_t n)
{
    if (n < 0 || n > m->n_hist) return FY_ERR_INVALID;
    for (int32_t i = 0; i < n; i++) {
        hist_t h = m->hist[(m->hist_head + m->n_hist - 1) % FY_GMATCH_HISTORY];
        m->n_hist--;
        m->cur = h.state;
        m->ended = h.ended;
    }
    return FY_OK;
}

int32_t fy_gmatch_history(const fy_gmatch_t *m) { return m->n_hist; }

void fy_gmatch_stats(const fy_gmatch_t *m, fy_gmatch_stats_t *s)
{
    *s = m->stats;
    s->n_states = m->n_states;
    s->n_nodes = m->n_nodes;
}

static void set_eog(const fy_token_trie_t *t, uint32_t *mask)
{
    for (int32_t i = 0; i < t->n_eog; i++) mask[t->eog[i] >> 5] |= 1u << (t->eog[i] & 31);
}

fy_status_t fy_gmatch_mask(fy_gmatch_t *m, const fy_token_trie_t *t, uint32_t *mask)
{
    size_t words = fy_token_trie_mask_words(t);
    memset(mask, 0, words * sizeof(uint32_t));
    if (m->ended) {
        set_eog(t, mask);
        return FY_OK;
    }
    if (m->broken) return FY_ERR_INVALID;
    maybe_flush(m);
    if (m->mask_trie != t) { /* masks are per vocabulary */
        fy_free(m->masks);
        m->masks = fy_malloc(words * MASK_SLOTS * sizeof(uint32_t));
        int32_t cap = t->max_len + 2;
        fy_free(m->wi);
        fy_free(m->we);
        fy_free(m->ws);
        m->wi = fy_malloc((size_t)cap * sizeof(int32_t));
        m->we = fy_malloc((size_t)cap * sizeof(int32_t));
        m->ws = fy_malloc((size_t)cap * sizeof(int32_t));
        m->mask_trie = NULL;
        for (int i = 0; i < MASK_SLOTS; i++) {
            if (m->mask_owner[i] >= 0 && m->mask_owner[i] < m->n_states) m->states[m->mask_owner[i]].mask = -1;
            m->mask_owner[i] = -1;
        }
        if (!m->masks || !m->wi || !m->we || !m->ws) {
            fy_error("grammar: out of memory for masks");
            return FY_ERR_NOMEM;
        }
        m->mask_trie = t;
        m->cap_walk = cap;
    }
    int32_t s0 = m->cur;
    int32_t slot = m->states[s0].mask;
    if (slot >= 0) {
        memcpy(mask, m->masks + (size_t)slot * words, words * sizeof(uint32_t));
        m->stats.mask_hits++;
        return FY_OK;
    }
    /* depth-first over the trie: a child is entered only when the grammar
     * takes its byte from the parent's state */
    const fy_trie_node_t *nodes = t->nodes;
    int32_t *wi = m->wi, *we = m->we, *ws = m->ws;
    int32_t d = 0;
    int64_t walked = 0;
    wi[0] = 1, we[0] = nodes[0].end, ws[0] = s0;
    while (d >= 0) {
        int32_t i = wi[d];
        if (i >= we[d]) {
            d--;
            continue;
        }
        const fy_trie_node_t *nd = &nodes[i];
        wi[d] = nd->end;
        walked++;
        int32_t s = ws[d];
        int32_t tr = m->states[s].trans;
        int32_t ns = tr >= 0 ? m->trans[(size_t)tr * 256 + nd->byte] : T_UNKNOWN;
        if (ns == T_UNKNOWN) ns = step(m, s, nd->byte);
        if (ns < 0) continue;
        for (int32_t k = 0; k < nd->tok_count; k++) {
            int32_t id = t->toks[nd->tok_first + k];
            mask[id >> 5] |= 1u << (id & 31);
        }
        if (i + 1 < nd->end) {
            d++;
            wi[d] = i + 1, we[d] = nd->end, ws[d] = ns;
        }
    }
    if (m->states[s0].complete) set_eog(t, mask);
    m->stats.mask_miss++;
    m->stats.walked += walked;
    if (m->broken) return FY_ERR_INVALID;
    slot = m->mask_next;
    m->mask_next = (m->mask_next + 1) % MASK_SLOTS;
    if (m->mask_owner[slot] >= 0 && m->mask_owner[slot] < m->n_states) m->states[m->mask_owner[slot]].mask = -1;
    m->mask_owner[slot] = s0;
    m->states[s0].mask = slot;
    memcpy(m->masks + (size_t)slot * words, mask, words * sizeof(uint32_t));
    return FY_OK;
}

/* ======================================================================================================== */
/* cache                                                                                                    */
/* ======================================================================================================== */

typedef struct centry {
    uint64_t hash;
    fy_grammar_kind_t kind;
    char *src;
    size_t len;
    fy_grammar_t *g;
    uint64_t used;
} centry_t;

struct fy_grammar_cache {
    pthread_mutex_t lock;
    centry_t *e;
    int32_t cap, n;
    uint64_t clock;
};

fy_status_t fy_grammar_cache_create(int32_t capacity, fy_grammar_cache_t **c_p)
{
    if (capacity < 1 || capacity > 1 << 16) {
        fy_error("grammar: cache of %d entries (1 to 65536)", capacity);
        return FY_ERR_INVALID;
    }
    fy_grammar_cache_t *c = fy_calloc(1, sizeof(*c));
    if (c) c->e = fy_calloc((size_t)capacity, sizeof(centry_t));
    if (!c || !c->e) {
        fy_free(c);
        fy_error("grammar: out of memory for a cache");
        return FY_ERR_NOMEM;
    }
    pthread_mutex_init(&c->lock, NULL);
    c->cap = capacity;
    *c_p = c;
    return FY_OK;
}

void fy_grammar_cache_destroy(fy_grammar_cache_t *c)
{
    if (!c) return;
    for (int32_t i = 0; i < c->n; i++) {
        fy_free(c->e[i].src);
        fy_grammar_unref(c->e[i].g);
    }
    pthread_mutex_destroy(&c->lock);
    fy_free(c->e);
    fy_free(c);
}

static uint64_t fnv(fy_grammar_kind_t kind, const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull ^ (uint64_t)kind;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
    return h;
}

fy_status_t fy_grammar_cache_get(fy_grammar_cache_t *c, fy_grammar_kind_t kind, const char *src, size_t len,
                                 fy_grammar_t **g_p, bool *hit_p, char *err, size_t err_cap)
{
    if (!src) src = "", len = 0;
    if (kind == FY_GRAMMAR_JSON_OBJECT) len = 0; /* the source does not matter */
    uint64_t h = fnv(kind, src, len);
    pthread_mutex_lock(&c->lock);
    for (int32_t i = 0; i < c->n; i++) {
        centry_t *e = &c->e[i];
        if (e->hash == h && e->kind == kind && e->len == len && !memcmp(e->src, src, len)) {
            e->used = ++c->clock;
            *g_p = fy_grammar_ref(e->g);
            pthread_mutex_unlock(&c->lock);
            if (hit_p) *hit_p = true;
            if (err && err_cap) err[0] = '\0';
            return FY_OK;
        }
    }
    pthread_mutex_unlock(&c->lock);
    /* compiled outside the lock: a slow schema does not hold up others
     * (two threads may both compile one; the second insert is dropped) */
    fy_grammar_t *g;
    fy_status_t st = fy_grammar_compile(kind, src, len, &g, err, err_cap);
    if (st) return st;
    if (hit_p) *hit_p = false;
    char *copy = fy_malloc(len + 1);
    if (!copy) { /* not cached; still a grammar */
        *g_p = g;
        return FY_OK;
    }
    memcpy(copy, src, len);
    pthread_mutex_lock(&c->lock);
    int32_t at = -1;
    for (int32_t i = 0; i < c->n; i++)
        if (c->e[i].hash == h && c->e[i].kind == kind && c->e[i].len == len && !memcmp(c->e[i].src, src, len)) at = -2;
    if (at == -1) {
        if (c->n < c->cap) {
            at = c->n++;
        } else {
            at = 0;
            for (int32_t i = 1; i < c->n; i++)
                if (c->e[i].used < c->e[at].used) at = i;
            fy_free(c->e[at].src);
            fy_grammar_unref(c->e[at].g);
        }
        c->e[at] = (centry_t){h, kind, copy, len, fy_grammar_ref(g), ++c->clock};
        copy = NULL;
    }
    pthread_mutex_unlock(&c->lock);
    fy_free(copy);
    *g_p = g;
    return FY_OK;
}

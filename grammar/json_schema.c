/*
 * json_schema.c - a JSON Schema (as jansson parsed it) to a grammar of the
 * JSON text that satisfies it (grammar_int.h's builder).
 *
 * Handled: type (one or a list), properties (emitted in schema order;
 * required ones always, optional ones may be left out), required,
 * additionalProperties (false or absent: only the declared properties;
 * true or a schema on an object without properties: any keys, values of
 * that schema; beside properties the extra keys are not generated, which
 * still satisfies the schema), items, minItems, maxItems, enum, const,
 * anyOf and oneOf (alternatives; oneOf's "exactly one" is not enforced),
 * allOf of one schema, $ref to any local JSON pointer ("#", "#/$defs/X",
 * "#/definitions/X": what Pydantic writes; recursion allowed), string
 * minLength/maxLength, pattern (grammar_regex.c, ECMA-262 search
 * semantics: unanchored sides may hold any text), format date, time,
 * date-time and uuid, and a lower bound of 0 or 1 on integers (0 on
 * numbers) by minimum/exclusiveMinimum.  A keyword that would constrain
 * the value and is not enforced here (the list refused[]: maximum,
 * patternProperties, not, if, ...) is refused by name; every other one
 * is ignored, as JSON Schema says of keywords a validator does not know:
 * annotations (title, description, default, examples, $comment, ...),
 * OpenAI's "strict", vendor keys (x-order, any x-...).  Numbers have at
 * most 16 integer and 16 fraction digits, whitespace is bounded
 * (FY_GRAMMAR_JSON_WS_MAX).
 *
 * Not here: validation of documents against a schema (the grammar makes
 * them valid as they are generated).
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "grammar/grammar_int.h"
#include "common/mem.h"

typedef struct jref {
    char *ref;
    int32_t rule;
} jref_t;

typedef struct js {
    gb_t *b;
    json_t *root;
    jref_t *refs;
    int32_t n_refs, cap_refs;
    int depth;
} js_t;

/* The keywords of drafts 4 to 2020-12 that constrain a value and that
 * nothing here enforces: each is refused by name (docs/protocol.md lists
 * them), since ignoring one would let through text the schema forbids. */
static const char *const refused[] = {"maximum",
                                      "exclusiveMaximum",
                                      "multipleOf",
                                      "uniqueItems",
                                      "contains",
                                      "minContains",
                                      "maxContains",
                                      "prefixItems",
                                      "additionalItems",
                                      "unevaluatedItems",
                                      "patternProperties",
                                      "propertyNames",
                                      "minProperties",
                                      "maxProperties",
                                      "dependentRequired",
                                      "dependentSchemas",
                                      "dependencies",
                                      "unevaluatedProperties",
                                      "not",
                                      "if",
                                      "then",
                                      "else",
                                      "$dynamicRef",
                                      "$recursiveRef",
                                      NULL};
static const char *const handled[] = {"type",
                                      "properties",
                                      "required",
                                      "additionalProperties",
                                      "items",
                                      "minItems",
                                      "maxItems",
                                      "enum",
                                      "const",
                                      "anyOf",
                                      "oneOf",
                                      "allOf",
                                      "$ref",
                                      "minLength",
                                      "maxLength",
                                      "pattern",
                                      "format",
                                      "minimum",
                                      "exclusiveMinimum",
                                      NULL};

static bool in(const char *const *list, const char *k)
{
    for (; *list; list++)
        if (!strcmp(*list, k)) return true;
    return false;
}

static int32_t fail(js_t *j, fy_status_t st, const char *path, const char *fmt, const char *arg)
{
    char msg[FY_GRAMMAR_ERR_LEN];
    snprintf(msg, sizeof(msg), fmt, arg);
    return gb_fail(j->b, st, "json_schema: %s (at %s)", msg, path[0] ? path : "the root");
}

static int32_t schema(js_t *j, json_t *s, const char *path);

/* The JSON text of v, compact, as a literal. */
static int32_t json_literal(js_t *j, json_t *v, const char *path)
{
    char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!text) return fail(j, FY_ERR_INVALID, path, "%s cannot be written as JSON", "a value");
    int32_t n = gb_lit(j->b, text, strlen(text));
    free(text);
    return n;
}

static void subpath(char *out, size_t cap, const char *path, const char *key)
{
    snprintf(out, cap, "%s/%s", path, key);
}

/* ---- $ref ------------------------------------------------------------------------------------------------- */

static json_t *resolve(js_t *j, const char *ref)
{
    if (ref[0] != '#') return NULL;
    json_t *at = j->root;
    const char *p = ref + 1;
    if (*p == '\0') return at;
    if (*p != '/') return NULL;
    char seg[256];
    while (*p == '/' && at) {
        p++;
        size_t n = 0;
        while (*p && *p != '/') {
            char c = *p++;
            if (c == '~' && (*p == '0' || *p == '1')) c = *p++ == '0' ? '~' : '/';
            if (n + 1 >= sizeof(seg)) return NULL;
            seg[n++] = c;
        }
        seg[n] = '\0';
        if (json_is_object(at)) {
            at = json_object_get(at, seg);
        } else if (json_is_array(at)) {
            char *end;
            unsigned long i = strtoul(seg, &end, 10);
            at = (*end || !n) ? NULL : json_array_get(at, i);
        } else {
            at = NULL;
        }
    }
    return at;
}

static int32_t ref_rule(js_t *j, const char *ref, const char *path)
{
    for (int32_t i = 0; i < j->n_refs; i++)
        if (!strcmp(j->refs[i].ref, ref)) return gb_ref(j->b, j->refs[i].rule);
    json_t *target = resolve(j, ref);
    if (!target) {
        if (ref[0] != '#')
            return fail(j, FY_ERR_UNSUPPORTED, path, "$ref '%.100s' is not supported (only local '#/...')", ref);
        return fail(j, FY_ERR_INVALID, path, "$ref '%.100s' points at nothing", ref);
    }
    if (j->n_refs == j->cap_refs) {
        int32_t c = j->cap_refs ? j->cap_refs * 2 : 16;
        jref_t *p = fy_realloc(j->refs, (size_t)c * sizeof(*p));
        if (!p) return gb_fail(j->b, FY_ERR_NOMEM, "json_schema: out of memory");
        j->refs = p;
        j->cap_refs = c;
    }
    /* the name is the last segment: dumps read as the schema does */
    const char *name = strrchr(ref, '/');
    int32_t rule = gb_rule(j->b, name ? name + 1 : "root");
    char *copy = fy_strdup(ref);
    if (rule < 0 || !copy) {
        fy_free(copy);
        return gb_fail(j->b, FY_ERR_NOMEM, "json_schema: out of memory");
    }
    j->refs[j->n_refs++] = (jref_t){copy, rule};
    gb_rule_set(j->b, rule, schema(j, target, ref));
    return gb_ref(j->b, rule);
}

/* ---- types ------------------------------------------------------------------------------------------------ */

static int32_t digits(gb_t *b, const char *cls, int min, int max)
{
    uint32_t set[8] = {0};
    for (; cls[0] && cls[1]; cls += 2)
        for (int c = (unsigned char)cls[0]; c <= (unsigned char)cls[1]; c++) set[c >> 5] |= 1u << (c & 31);
    return gb_rep(b, gb_bytes(b, set), min, max);
}

/* Lower bound of minimum / exclusiveMinimum as an integer (for integers)
 * or "non-negative" (for numbers): 0 none, 1 ">= 0", 2 ">= 1". */
static int lower_bound(js_t *j, json_t *s, bool integer, const char *path)
{
    json_t *mn = json_object_get(s, "minimum"), *ex = json_object_get(s, "exclusiveMinimum");
    if (ex && json_is_boolean(ex))
        return fail(j, FY_ERR_UNSUPPORTED, path, "keyword '%s' as a boolean is not supported", "exclusiveMinimum"), -1;
    if ((mn && !json_is_number(mn)) || (ex && !json_is_number(ex)))
        return fail(j, FY_ERR_INVALID, path, "%s is not a number",
                    mn && !json_is_number(mn) ? "minimum" : "exclusiveMinimum"),
               -1;
    if (!mn && !ex) return 0;
    double lo = mn ? json_number_value(mn) : -INFINITY;
    if (ex) {
        double e = json_number_value(ex);
        if (integer)
            e = floor(e) + 1;
        else if (e >= 0)
            return fail(j, FY_ERR_UNSUPPORTED, path, "keyword '%s' on a number is not supported", "exclusiveMinimum"),
                   -1;
        if (e > lo) lo = e;
    }
    if (integer) lo = ceil(lo);
    if (lo == 0) return 1;
    if (integer && lo == 1) return 2;
    return fail(j, FY_ERR_UNSUPPORTED, path, "keyword '%s' is supported only as a bound of 0 (or 1 on integers)",
                mn ? "minimum" : "exclusiveMinimum"),
           -1;
}

static int32_t integer(js_t *j, json_t *s, const char *path)
{
    gb_t *b = j->b;
    int lb = lower_bound(j, s, true, path);
    if (lb < 0) return -1;
    int32_t pos = gb_seqv(b, digits(b, "19", 1, 1), digits(b, "09", 0, 15), GB_NONE);
    if (lb == 2) return pos;
    int32_t nat = gb_altv(b, gb_str(b, "0"), pos, GB_NONE);
    if (lb == 1) return nat;
    return gb_seqv(b, gb_rep(b, gb_str(b, "-"), 0, 1), nat, GB_NONE);
}

static int32_t number(js_t *j, json_t *s, const char *path)
{
    gb_t *b = j->b;
    int lb = lower_bound(j, s, false, path);
    if (lb < 0) return -1;
    int32_t nat =
        gb_altv(b, gb_str(b, "0"), gb_seqv(b, digits(b, "19", 1, 1), digits(b, "09", 0, 15), GB_NONE), GB_NONE);
    int32_t frac = gb_seqv(b, gb_str(b, "."), digits(b, "09", 1, 16), GB_NONE);
    int32_t exp = gb_seqv(b, digits(b, "eeEE", 1, 1), digits(b, "++--", 0, 1), digits(b, "09", 1, 3), GB_NONE);
    return gb_seqv(b, lb ? gb_empty(b) : gb_rep(b, gb_str(b, "-"), 0, 1), nat, gb_rep(b, frac, 0, 1),
                   gb_rep(b, exp, 0, 1), GB_NONE);
}

static int32_t count(js_t *j, json_t *s, const char *key, int32_t dflt, const char *path)
{
    json_t *v = json_object_get(s, key);
    if (!v) return dflt;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > FY_GRAMMAR_MAX_REPEAT) {
        char msg[64];
        snprintf(msg, sizeof(msg), "%s must be an integer in 0..%d", key, FY_GRAMMAR_MAX_REPEAT);
        return fail(j, FY_ERR_INVALID, path, "%s", msg), -2;
    }
    return (int32_t)json_integer_value(v);
}

static int32_t quoted(gb_t *b, int32_t inner) { return gb_seqv(b, gb_str(b, "\""), inner, gb_str(b, "\""), GB_NONE); }

static int32_t format(js_t *j, const char *f, const char *path)
{
    gb_t *b = j->b;
    int32_t d2 = digits(b, "09", 2, 2);
    (void)d2;
    int32_t date = gb_seqv(b, digits(b, "09", 4, 4), gb_str(b, "-"),
                           gb_altv(b, gb_seqv(b, gb_str(b, "0"), digits(b, "19", 1, 1), GB_NONE),
                                   gb_seqv(b, gb_str(b, "1"), digits(b, "02", 1, 1), GB_NONE), GB_NONE),
                           gb_str(b, "-"),
                           gb_altv(b, gb_seqv(b, gb_str(b, "0"), digits(b, "19", 1, 1), GB_NONE),
                                   gb_seqv(b, digits(b, "12", 1, 1), digits(b, "09", 1, 1), GB_NONE),
                                   gb_seqv(b, gb_str(b, "3"), digits(b, "01", 1, 1), GB_NONE), GB_NONE),
                           GB_NONE);
    int32_t hh = gb_altv(b, gb_seqv(b, digits(b, "01", 1, 1), digits(b, "09", 1, 1), GB_NONE),
                         gb_seqv(b, gb_str(b, "2"), digits(b, "03", 1, 1), GB_NONE), GB_NONE);
    int32_t mm = gb_seqv(b, digits(b, "05", 1, 1), digits(b, "09", 1, 1), GB_NONE);
    int32_t zone =
        gb_altv(b, gb_str(b, "Z"), gb_seqv(b, digits(b, "++--", 1, 1), hh, gb_str(b, ":"), mm, GB_NONE), GB_NONE);
    int32_t time = gb_seqv(b, hh, gb_str(b, ":"), mm, gb_str(b, ":"), mm,
                           gb_rep(b, gb_seqv(b, gb_str(b, "."), digits(b, "09", 1, 6), GB_NONE), 0, 1), zone, GB_NONE);
    if (!strcmp(f, "date")) return quoted(b, date);
    if (!strcmp(f, "time")) return quoted(b, time);
    if (!strcmp(f, "date-time")) return quoted(b, gb_seqv(b, date, gb_str(b, "T"), time, GB_NONE));
    if (!strcmp(f, "uuid")) {
        int32_t h4 = digits(b, "09afAF", 4, 4);
        return quoted(b, gb_seqv(b, digits(b, "09afAF", 8, 8), gb_str(b, "-"), h4, gb_str(b, "-"), h4, gb_str(b, "-"),
                                 h4, gb_str(b, "-"), digits(b, "09afAF", 12, 12), GB_NONE));
    }
    return fail(j, FY_ERR_UNSUPPORTED, path, "format '%.64s' is not supported (date, time, date-time, uuid are)", f);
}

static int32_t string(js_t *j, json_t *s, const char *path)
{
    gb_t *b = j->b;
    json_t *fmt = json_object_get(s, "format"), *pat = json_object_get(s, "pattern");
    int32_t min = count(j, s, "minLength", 0, path), max = count(j, s, "maxLength", -1, path);
    if (min == -2 || max == -2) return -1;
    int n_kinds = (fmt != NULL) + (pat != NULL) + (min > 0 || max >= 0);
    if (n_kinds > 1)
        return fail(j, FY_ERR_UNSUPPORTED, path, "%s",
                    "only one of format, pattern and minLength/maxLength at once is supported");
    if (fmt) {
        if (!json_is_string(fmt)) return fail(j, FY_ERR_INVALID, path, "%s", "format is not a string");
        return format(j, json_string_value(fmt), path);
    }
    if (pat) {
        if (!json_is_string(pat)) return fail(j, FY_ERR_INVALID, path, "%s", "pattern is not a string");
        int32_t r = -1;
        if (fy_regex_compile(b, json_string_value(pat), json_string_length(pat), true, &r)) return -1;
        return quoted(b, r);
    }
    if (max >= 0 && max < min) return fail(j, FY_ERR_INVALID, path, "%s", "maxLength is below minLength");
    if (min > 0 || max >= 0) return quoted(b, gb_rep(b, gb_json_char(b), min, max));
    return gb_json_string(b);
}

static int32_t array(js_t *j, json_t *s, const char *path)
{
    gb_t *b = j->b;
    char sub[512];
    int32_t min = count(j, s, "minItems", 0, path), max = count(j, s, "maxItems", -1, path);
    if (min == -2 || max == -2) return -1;
    if (max >= 0 && max < min) return fail(j, FY_ERR_INVALID, path, "%s", "maxItems is below minItems");
    json_t *items = json_object_get(s, "items");
    if (json_is_array(items)) /* drafts 4 to 7's tuple: one schema per position */
        return fail(j, FY_ERR_UNSUPPORTED, path, "keyword '%s' as an array (a tuple) is not supported", "items");
    subpath(sub, sizeof(sub), path, "items");
    int32_t item = items ? schema(j, items, sub) : gb_json_value(b);
    int32_t ws = gb_json_ws(b);
    if (max == 0) return gb_seqv(b, gb_str(b, "["), ws, gb_str(b, "]"), GB_NONE);
    int32_t one = gb_share(b, "item", gb_seqv(b, item, ws, GB_NONE));
    int32_t more =
        gb_rep(b, gb_seqv(b, gb_str(b, ","), ws, one, GB_NONE), min > 0 ? min - 1 : 0, max < 0 ? -1 : max - 1);
    int32_t list = gb_seqv(b, one, more, GB_NONE);
    if (min == 0) list = gb_rep(b, list, 0, 1);
    return gb_seqv(b, gb_str(b, "["), ws, list, gb_str(b, "]"), GB_NONE);
}

static int32_t object(js_t *j, json_t *s, const char *path)
{
    gb_t *b = j->b;
    char sub[512];
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *addl = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props)) return fail(j, FY_ERR_INVALID, path, "%s", "properties is not an object");
    if (req && !json_is_array(req)) return fail(j, FY_ERR_INVALID, path, "%s", "required is not an array");
    if (addl && !json_is_boolean(addl) && !json_is_object(addl))
        return fail(j, FY_ERR_INVALID, path, "%s", "additionalProperties is not a boolean or a schema");
    int32_t ws = gb_json_ws(b);
    size_t n = props ? json_object_size(props) : 0;
    size_t i;
    json_t *v;
    json_array_foreach(req, i, v)
    {
        if (!json_is_string(v)) return fail(j, FY_ERR_INVALID, path, "%s", "required holds a non-string");
        if (!props || !json_object_get(props, json_string_value(v)))
            return fail(j, FY_ERR_UNSUPPORTED, path, "required property '%.64s' is not in properties",
                        json_string_value(v));
    }
    if (n == 0) {
        if (addl && !json_is_false(addl)) { /* a map: any keys, values of the schema */
            subpath(sub, sizeof(sub), path, "additionalProperties");
            int32_t val = json_is_true(addl) ? gb_json_value(b) : schema(j, addl, sub);
            int32_t kv = gb_share(b, "kv", gb_seqv(b, gb_json_string(b), ws, gb_str(b, ":"), ws, val, ws, GB_NONE));
            int32_t list = gb_seqv(b, kv, gb_rep(b, gb_seqv(b, gb_str(b, ","), ws, kv, GB_NONE), 0, -1), GB_NONE);
            return gb_seqv(b, gb_str(b, "{"), ws, gb_rep(b, list, 0, 1), gb_str(b, "}"), GB_NONE);
        }
        return gb_seqv(b, gb_str(b, "{"), ws, gb_str(b, "}"), GB_NONE);
    }
    /* first_k: properties k.. with none written yet; rest_k: with one
     * written (each is preceded by a comma).  Built from the end. */
    int32_t *kv = fy_malloc(n * sizeof(int32_t));
    bool *required = fy_calloc(n, sizeof(bool));
    if (!kv || !required) {
        fy_free(kv);
        fy_free(required);
        return gb_fail(b, FY_ERR_NOMEM, "json_schema: out of memory");
    }
    const char *key;
    size_t k = 0;
    json_object_foreach(props, key, v)
    {
        json_t *name = json_string(key);
        char *enc = name ? json_dumps(name, JSON_ENCODE_ANY) : NULL;
        json_decref(name);
        if (!enc) {
            kv[k++] = gb_fail(b, FY_ERR_INVALID, "json_schema: property name is not UTF-8 (at %s)", path);
            continue;
        }
        char p2[512];
        snprintf(p2, sizeof(p2), "%s/properties/%s", path, key);
        int32_t val = schema(j, v, p2);
        kv[k] = gb_share(b, key, gb_seqv(b, gb_lit(b, enc, strlen(enc)), ws, gb_str(b, ":"), ws, val, ws, GB_NONE));
        free(enc);
        json_array_foreach(req, i, v) if (!strcmp(json_string_value(v), key)) required[k] = true;
        k++;
    }
    int32_t first = gb_empty(b), rest = gb_empty(b);
    for (size_t q = n; q-- > 0 && !gb_failed(b);) {
        int32_t with_comma = gb_seqv(b, gb_str(b, ","), ws, kv[q], rest, GB_NONE);
        int32_t new_rest = required[q] ? with_comma : gb_altv(b, with_comma, rest, GB_NONE);
        int32_t here = gb_seqv(b, kv[q], rest, GB_NONE);
        int32_t new_first = required[q] ? here : gb_altv(b, here, first, GB_NONE);
        rest = gb_share(b, "rest", new_rest);
        first = gb_share(b, "first", new_first);
    }
    fy_free(kv);
    fy_free(required);
    return gb_seqv(b, gb_str(b, "{"), ws, first, gb_str(b, "}"), GB_NONE);
}

static int32_t typed(js_t *j, json_t *s, const char *type, const char *path)
{
    gb_t *b = j->b;
    if (!strcmp(type, "null")) return gb_str(b, "null");
    if (!strcmp(type, "boolean")) return gb_altv(b, gb_str(b, "true"), gb_str(b, "false"), GB_NONE);
    if (!strcmp(type, "integer")) return integer(j, s, path);
    if (!strcmp(type, "number")) return number(j, s, path);
    if (!strcmp(type, "string")) return string(j, s, path);
    if (!strcmp(type, "array")) return array(j, s, path);
    if (!strcmp(type, "object")) return object(j, s, path);
    return fail(j, FY_ERR_INVALID, path, "unknown type '%.64s'", type);
}

static bool has_any(json_t *s, const char *const *keys)
{
    for (; *keys; keys++)
        if (json_object_get(s, *keys)) return true;
    return false;
}

static int32_t alternatives(js_t *j, json_t *list, const char *key, const char *path)
{
    if (!json_is_array(list) || json_array_size(list) == 0)
        return fail(j, FY_ERR_INVALID, path, "%s is not a non-empty array", key);
    if (json_array_size(list) > FY_GRAMMAR_MAX_CHOICES)
        return fail(j, FY_ERR_INVALID, path, "%s has too many entries", key);
    size_t n = json_array_size(list);
    int32_t *kids = fy_malloc(n * sizeof(int32_t));
    if (!kids) return gb_fail(j->b, FY_ERR_NOMEM, "json_schema: out of memory");
    size_t i;
    json_t *v;
    json_array_foreach(list, i, v)
    {
        char sub[512];
        snprintf(sub, sizeof(sub), "%s/%s/%zu", path, key, i);
        kids[i] = !strcmp(key, "enum") ? json_literal(j, v, sub) : schema(j, v, sub);
    }
    int32_t r = gb_alt(j->b, kids, (int32_t)n);
    fy_free(kids);
    return r;
}

static int32_t schema(js_t *j, json_t *s, const char *path)
{
    gb_t *b = j->b;
    if (gb_failed(b)) return -1;
    if (json_is_true(s)) return gb_json_value(b);
    if (json_is_false(s)) return fail(j, FY_ERR_INVALID, path, "%s", "the schema 'false' matches nothing");
    if (!json_is_object(s)) return fail(j, FY_ERR_INVALID, path, "%s", "a schema must be an object or a boolean");
    if (j->depth >= FY_GRAMMAR_MAX_DEPTH) return fail(j, FY_ERR_INVALID, path, "nested deeper than %s", "64");
    const char *key;
    json_t *v;
    int n_valid = 0;
    json_object_foreach(s, key, v)
    {
        if (in(refused, key))
            return fail(j, FY_ERR_UNSUPPORTED, path,
                        "keyword '%.64s' is not supported (it constrains the value and the grammar cannot enforce it)",
                        key);
        if (in(handled, key)) n_valid++; /* else an annotation or a keyword no draft has: no constraint */
    }
    j->depth++;
    int32_t r;
    static const char *const alone[] = {"$ref", "anyOf", "oneOf", "allOf", "enum", "const", NULL};
    const char *which = NULL;
    for (int i = 0; alone[i]; i++)
        if (json_object_get(s, alone[i])) which = which ? which : alone[i];
    if (which && n_valid > 1) {
        /* "type" beside enum/const is only a restatement; anything else
         * would have to be intersected */
        bool only_type =
            n_valid == 2 && json_object_get(s, "type") && (!strcmp(which, "enum") || !strcmp(which, "const"));
        if (!only_type) {
            j->depth--;
            return fail(j, FY_ERR_UNSUPPORTED, path, "keyword '%s' beside other validation keywords is not supported",
                        which);
        }
    }
    if ((v = json_object_get(s, "$ref"))) {
        r = json_is_string(v) ? ref_rule(j, json_string_value(v), path)
                              : fail(j, FY_ERR_INVALID, path, "%s", "$ref is not a string");
    } else if ((v = json_object_get(s, "const"))) {
        r = json_literal(j, v, path);
    } else if ((v = json_object_get(s, "enum"))) {
        r = alternatives(j, v, "enum", path);
    } else if ((v = json_object_get(s, "anyOf"))) {
        r = alternatives(j, v, "anyOf", path);
    } else if ((v = json_object_get(s, "oneOf"))) {
        r = alternatives(j, v, "oneOf", path);
    } else if ((v = json_object_get(s, "allOf"))) {
        char sub[512];
        subpath(sub, sizeof(sub), path, "allOf/0");
        r = json_is_array(v) && json_array_size(v) == 1
                ? schema(j, json_array_get(v, 0), sub)
                : fail(j, FY_ERR_UNSUPPORTED, path, "keyword '%s' is supported only with one schema", "allOf");
    } else if ((v = json_object_get(s, "type"))) {
        if (json_is_string(v)) {
            r = typed(j, s, json_string_value(v), path);
        } else if (json_is_array(v) && json_array_size(v) > 0 && json_array_size(v) <= 8) {
            int32_t kids[8];
            size_t i;
            json_t *t;
            r = 0;
            json_array_foreach(v, i, t)
            {
                kids[i] = json_is_string(t) ? typed(j, s, json_string_value(t), path)
                                            : fail(j, FY_ERR_INVALID, path, "%s", "type holds a non-string");
            }
            r = gb_alt(b, kids, (int32_t)json_array_size(v));
        } else {
            r = fail(j, FY_ERR_INVALID, path, "%s", "type is not a string or a list of 1 to 8 strings");
        }
    } else {
        static const char *const obj_kw[] = {"properties", "required", "additionalProperties", NULL};
        static const char *const arr_kw[] = {"items", "minItems", "maxItems", NULL};
        static const char *const str_kw[] = {"minLength", "maxLength", "pattern", "format", NULL};
        static const char *const num_kw[] = {"minimum", "exclusiveMinimum", NULL};
        if (has_any(s, obj_kw))
            r = object(j, s, path);
        else if (has_any(s, arr_kw))
            r = array(j, s, path);
        else if (has_any(s, str_kw))
            r = string(j, s, path);
        else if (has_any(s, num_kw))
            r = number(j, s, path);
        else
            r = gb_json_value(b);
    }
    j->depth--;
    return r;
}

fy_status_t fy_json_schema_compile(gb_t *b, const void *doc, int32_t *root_p)
{
    js_t j = {.b = b, .root = (json_t *)doc};
    int32_t root = gb_rule(b, "root");
    gb_rule_set(b, root, schema(&j, j.root, ""));
    for (int32_t i = 0; i < j.n_refs; i++) fy_free(j.refs[i].ref);
    fy_free(j.refs);
    *root_p = root;
    return gb_error(b, NULL, 0);
}

/*
 * test_grammar.c - the grammar engine (grammar/grammar.h): each JSON
 * Schema construct, json_object, regexes and choices by texts they must
 * accept and refuse; refusals naming the keyword; limits; the token mask
 * against brute force (every token tried through accept_token) on a tiny
 * vocabulary and on the default model's; rollback and clone; and random
 * schemas whose completions, sampled uniformly from the mask token by
 * token, must parse and validate (by a validator here, and by Python's
 * jsonschema when $FERRY_PYTHON has it).
 *
 * Not here: the fuzzing (tests/fuzz/fuzz_grammar.c), the speed
 * (ferry bench-grammar).
 */
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "model/gguf.h"
#include "grammar/grammar.h"
#include "common/mem.h"
#include "tests/testutil.h"
#include "grammar/token_trie.h"
#include "model/tokenizer.h"

#define SEED 0x6a5d17u

/* ---- helpers ------------------------------------------------------------------------------------------------ */

static fy_grammar_t *compile_ok(fy_grammar_kind_t kind, const char *src)
{
    char err[FY_GRAMMAR_ERR_LEN];
    fy_grammar_t *g = NULL;
    fy_status_t st = fy_grammar_compile(kind, src, src ? strlen(src) : 0, &g, err, sizeof(err));
    if (st) fprintf(stderr, "compile %s failed: %s\nsource: %s\n", fy_grammar_kind_str(kind), err, src);
    assert_int_equal(st, FY_OK);
    return g;
}

static bool matches(fy_grammar_t *g, const char *text)
{
    fy_gmatch_t *m;
    assert_int_equal(fy_gmatch_create(g, &m), FY_OK);
    bool ok = fy_gmatch_accept_bytes(m, text, strlen(text)) && fy_gmatch_is_complete(m);
    fy_gmatch_destroy(m);
    return ok;
}

typedef struct tcase {
    const char *src;
    const char *yes[8];
    const char *no[8];
} tcase_t;

static void run_cases(fy_grammar_kind_t kind, const tcase_t *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        fy_grammar_t *g = compile_ok(kind, cases[i].src);
        for (int k = 0; k < 8 && cases[i].yes[k]; k++) {
            if (!matches(g, cases[i].yes[k])) {
                char *d = fy_grammar_dump(g);
                fprintf(stderr, "%s\nshould accept: %s\ngrammar:\n%s\n", cases[i].src, cases[i].yes[k], d);
                fy_free(d);
                fail();
            }
        }
        for (int k = 0; k < 8 && cases[i].no[k]; k++) {
            if (matches(g, cases[i].no[k])) {
                fprintf(stderr, "%s\nshould refuse: %s\n", cases[i].src, cases[i].no[k]);
                fail();
            }
        }
        fy_grammar_unref(g);
    }
}

static fy_token_trie_t *tiny_trie(void);

/* ---- JSON Schema -------------------------------------------------------------------------------------------- */

static void test_schema_scalars(void **state)
{
    (void)state;
    static const tcase_t cases[] = {
        {"{\"type\":\"string\"}",
         {"\"\"", "\"abc\"", "\"a\\\"b\"", "\"\\u00e9\\n\"", "\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\""},
         {"abc", "\"a", "\"\\x\"", "\"a\nb\"", "\"\xc3\"", "\"\xed\xa0\x80\"", "\"\\u12\""}},
        {"{\"type\":\"integer\"}",
         {"0", "-7", "123456", "1234567890123456"},
         {"01", "1.5", "-", "+1", "1e3", "12345678901234567"}},
        {"{\"type\":\"number\"}", {"0", "-0.5", "3.25e-7", "1E+10", "12"}, {"01", ".5", "1.", "1e", "--1", "NaN"}},
        {"{\"type\":\"boolean\"}", {"true", "false"}, {"True", "1", "tru"}},
        {"{\"type\":\"null\"}", {"null"}, {"nul", "None"}},
        {"{\"type\":[\"integer\",\"null\"]}", {"5", "null"}, {"\"5\""}},
        {"{\"enum\":[\"red\",\"green\",3,null,{\"a\":1}]}",
         {"\"red\"", "\"green\"", "3", "null", "{\"a\":1}"},
         {"\"blue\"", "red", "4"}},
        {"{\"const\":\"x\\\"y\"}", {"\"x\\\"y\""}, {"\"xy\""}},
        {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}",
         {"\"ab\"", "\"abc\"", "\"\xc3\xa9\xc3\xa9\"", "\"\\n\\t\""},
         {"\"a\"", "\"abcd\""}},
        {"{\"type\":\"string\",\"format\":\"date\"}",
         {"\"2024-02-29\"", "\"1999-12-31\""},
         {"\"2024-13-01\"", "\"2024-1-01\"", "\"24-01-01\""}},
        {"{\"type\":\"string\",\"format\":\"date-time\"}",
         {"\"2024-02-29T12:30:00Z\"", "\"2024-02-29T23:59:59.123+02:00\""},
         {"\"2024-02-29 12:30:00Z\"", "\"2024-02-29T24:00:00Z\""}},
        {"{\"type\":\"string\",\"format\":\"uuid\"}",
         {"\"123e4567-e89b-12d3-a456-426614174000\""},
         {"\"123e4567e89b12d3a456426614174000\""}},
        {"{\"type\":\"string\",\"pattern\":\"^[a-z]+@[a-z]+\\\\.com$\"}",
         {"\"ab@cd.com\""},
         {"\"ab@cd.org\"", "\"Ab@cd.com\""}},
        {"{\"type\":\"string\",\"pattern\":\"ab\"}", {"\"ab\"", "\"xxabyy\""}, {"\"a\"", "\"ba\""}},
        {"{\"type\":\"integer\",\"minimum\":0}", {"0", "17"}, {"-1"}},
        {"{\"type\":\"integer\",\"exclusiveMinimum\":0}", {"1", "17"}, {"0", "-1"}},
        {"{\"type\":\"number\",\"minimum\":0}", {"0", "0.5"}, {"-0.5"}},
        {"{\"type\":\"integer\",\"title\":\"T\",\"description\":\"d\",\"default\":3,\"examples\":[1]}", {"3"}, {"x"}},
        {"true", {"1", "\"s\"", "{\"a\":[1,{}]}", "null"}, {"", "{"}},
    };
    run_cases(FY_GRAMMAR_JSON_SCHEMA, cases, FY_ARRAY_LEN(cases));
}

/* Keywords that constrain nothing (annotations, OpenAI's "strict", vendor
 * keys, keywords no draft has) are ignored, as JSON Schema says: a tool's
 * parameters as OpenAI's and Pydantic's clients write them compile, and
 * the structure is still enforced (issue 35: 'strict' and 'x-order' were
 * refused by name, so tool_choice "required" answered 400). */
static void test_schema_ignored_keywords(void **state)
{
    (void)state;
    static const tcase_t cases[] = {
        {"{\"type\":\"object\",\"strict\":true,\"title\":\"Weather\",\"description\":\"d\",\"$comment\":\"c\","
         "\"x-order\":[\"city\"],\"properties\":{\"city\":{\"type\":\"string\",\"title\":\"City\",\"x-order\":0,"
         "\"examples\":[\"Paris\"],\"default\":\"Paris\",\"x-vendor-hint\":{\"not\":{}}},\"days\":{\"type\":"
         "\"integer\","
         "\"minimum\":1,\"deprecated\":false,\"readOnly\":false,\"contentMediaType\":\"text/plain\"}},"
         "\"required\":[\"city\",\"days\"],\"additionalProperties\":false}",
         {"{\"city\":\"Paris\",\"days\":3}"},
         {"{\"city\":\"Paris\"}", "{\"city\":\"Paris\",\"days\":0}", "{\"city\":1,\"days\":3}",
          "{\"city\":\"Paris\",\"days\":3,\"x\":1}"}},
        /* beside a keyword that must stand alone, an ignored one is no company */
        {"{\"$ref\":\"#/$defs/"
         "c\",\"strict\":true,\"$defs\":{\"c\":{\"enum\":[\"a\",\"b\"],\"x-enum-names\":[\"A\",\"B\"]}}}",
         {"\"a\"", "\"b\""},
         {"\"c\""}},
        {"{\"anyOf\":[{\"type\":\"null\"},{\"type\":\"boolean\"}],\"x-nullable\":true,\"$anchor\":\"n\"}",
         {"null", "true"},
         {"1"}},
        {"{\"type\":\"string\",\"strict\":false,\"nonsense-keyword\":[1,2]}", {"\"s\""}, {"1"}},
    };
    run_cases(FY_GRAMMAR_JSON_SCHEMA, cases, FY_ARRAY_LEN(cases));
}

static void test_schema_objects(void **state)
{
    (void)state;
    static const tcase_t cases[] = {
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}},"
         "\"required\":[\"a\",\"b\"]}",
         {"{\"a\":1,\"b\":\"x\"}", "{ \"a\" : 1 , \"b\" : \"x\" }", "{\n  \"a\": 1,\n  \"b\": \"x\"\n}"},
         {"{\"b\":\"x\",\"a\":1}", "{\"a\":1}", "{\"a\":1,\"b\":\"x\",\"c\":2}", "{\"a\":1,,\"b\":\"x\"}",
          "{\"a\":1,\"b\":\"x\",}"}},
        /* optional properties may be absent, in schema order */
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"integer\"},"
         "\"c\":{\"type\":\"integer\"}},\"required\":[\"b\"]}",
         {"{\"b\":1}", "{\"a\":0,\"b\":1}", "{\"b\":1,\"c\":2}", "{\"a\":0,\"b\":1,\"c\":2}"},
         {"{}", "{\"a\":0}", "{\"c\":2,\"b\":1}", "{,\"b\":1}"}},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"integer\"}}}",
         {"{}", "{\"a\":1}", "{\"b\":2}", "{\"a\":1,\"b\":2}"},
         {"{\"a\":1,}", "{,}", "{\"b\":2,\"a\":1}"}},
        /* a map */
        {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}",
         {"{}", "{\"x\":1}", "{\"x\":1,\"y\":-2}"},
         {"{\"x\":\"1\"}", "{\"x\":1,}"}},
        {"{\"type\":\"object\"}", {"{}"}, {"[]"}},
        {"{\"type\":\"object\",\"additionalProperties\":true}", {"{}", "{\"k\":[1,\"v\"]}"}, {"[]"}},
        /* whitespace is bounded */
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"null\"}},\"required\":[\"a\"]}",
         {"{\"a\":null}", "{\n                    \"a\":null}"},
         {"{\n                     \"a\":null}", "{  \"a\":null}", "{\"a\":null}\n"}},
    };
    run_cases(FY_GRAMMAR_JSON_SCHEMA, cases, FY_ARRAY_LEN(cases));
}

static void test_schema_arrays_refs(void **state)
{
    (void)state;
    static const tcase_t cases[] = {
        {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}",
         {"[]", "[1]", "[1, 2,3]", "[ 1 ]"},
         {"[1,]", "[,]", "[\"a\"]", "["}},
        {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2,\"maxItems\":3}",
         {"[1,2]", "[1,2,3]"},
         {"[]", "[1]", "[1,2,3,4]"}},
        {"{\"type\":\"array\",\"maxItems\":0}", {"[]"}, {"[1]"}},
        {"{\"type\":\"array\"}", {"[]", "[1,\"a\",null,[{}]]"}, {"[1,]"}},
        {"{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\"}]}", {"1", "\"a\""}, {"null"}},
        {"{\"oneOf\":[{\"type\":\"boolean\"},{\"type\":\"null\"}]}", {"true", "null"}, {"1"}},
        {"{\"allOf\":[{\"type\":\"boolean\"}]}", {"true"}, {"1"}},
        /* Pydantic: $defs, $ref, title, Optional as anyOf with null, enums as $defs */
        {"{\"$defs\":{\"Color\":{\"enum\":[\"red\",\"blue\"],\"title\":\"Color\",\"type\":\"string\"},"
         "\"Item\":{\"properties\":{\"name\":{\"title\":\"Name\",\"type\":\"string\"},\"color\":{\"$ref\":\"#/$defs/"
         "Color\"},"
         "\"tags\":{\"anyOf\":[{\"items\":{\"type\":\"string\"},\"type\":\"array\"},{\"type\":\"null\"}],\"default\":"
         "null,"
         "\"title\":\"Tags\"}},\"required\":[\"name\",\"color\"],\"title\":\"Item\",\"type\":\"object\"}},"
         "\"properties\":{\"items\":{\"items\":{\"$ref\":\"#/$defs/Item\"},\"title\":\"Items\",\"type\":\"array\"}},"
         "\"required\":[\"items\"],\"title\":\"Order\",\"type\":\"object\",\"additionalProperties\":false}",
         {"{\"items\":[]}", "{\"items\":[{\"name\":\"a\",\"color\":\"red\"}]}",
          "{\"items\":[{\"name\":\"a\",\"color\":\"blue\",\"tags\":null},{\"name\":\"b\",\"color\":\"red\",\"tags\":["
          "\"x\"]}]}"},
         {"{\"items\":[{\"name\":\"a\",\"color\":\"green\"}]}", "{\"items\":[{\"name\":\"a\"}]}"}},
        /* recursion through $ref, and definitions */
        {"{\"definitions\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
         "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/definitions/node\"}}},\"required\":[\"v\"]}},"
         "\"$ref\":\"#/definitions/node\"}",
         {"{\"v\":1}", "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[{\"v\":3}]},{\"v\":4}]}"},
         {"{\"kids\":[]}", "{\"v\":1,\"kids\":[{}]}"}},
        {"{\"type\":\"object\",\"properties\":{\"next\":{\"$ref\":\"#\"}}}",
         {"{}", "{\"next\":{\"next\":{}}}"},
         {"{\"next\":1}"}},
    };
    run_cases(FY_GRAMMAR_JSON_SCHEMA, cases, FY_ARRAY_LEN(cases));
}

static void test_json_object(void **state)
{
    (void)state;
    static const tcase_t cases[] = {
        {NULL,
         {"{}", "{\"a\":1}", "{\"a\":[1,2,{\"b\":null}],\"c\":\"\\u0041\",\"d\":-1.5e3,\"e\":true}", "{ \"a\" : { } }"},
         {"[]", "1", "\"s\"", "{\"a\"}", "{\"a\":}", "{a:1}", "{\"a\":1,}", "{\"a\":01}"}},
    };
    run_cases(FY_GRAMMAR_JSON_OBJECT, cases, FY_ARRAY_LEN(cases));
}

static void test_regex(void **state)
{
    (void)state;
    static const tcase_t cases[] = {
        {"abc", {"abc"}, {"ab", "abcd", ""}},
        {"", {""}, {"a"}},
        {"^a(b|cd)*e$", {"ae", "abe", "acdbe"}, {"ace", "a"}},
        {"[0-9]{3}-[0-9]{2,4}", {"123-45", "123-4567"}, {"12-45", "123-4", "123-45678"}},
        {"\\d+(\\.\\d+)?", {"1", "12.5"}, {"1.", ".5", "a"}},
        {"[^abc]x?", {"d", "dx", "\xc3\xa9"}, {"a", "dxx"}},
        {"\\w+\\s\\w+", {"ab_1 cd"}, {"ab  cd", "ab-cd"}},
        {".+", {"a", "\xe2\x82\xac"}, {"", "\n", "\xff"}},
        {"(?:yes|no)|maybe", {"yes", "no", "maybe"}, {"yesno"}},
        {"(?<word>[A-Z][a-z]*)!", {"Hello!"}, {"hello!"}},
        {"a{2}b{1,}c{0,1}", {"aab", "aabbbc"}, {"ab", "aa"}},
        {"\\x41\\u00e9\\.\\[", {"A\xc3\xa9.["}, {"Ae.["}},
        {"[\\d.-]+", {"-1.5"}, {"a"}},
        {"x*?y+?", {"y", "xxy"}, {"x"}},
        {"[\xce\xb1-\xcf\x89]+", {"\xce\xb1\xce\xb2\xcf\x89"}, {"a"}},
    };
    run_cases(FY_GRAMMAR_REGEX, cases, FY_ARRAY_LEN(cases));
}

static void test_choice(void **state)
{
    (void)state;
    static const tcase_t cases[] = {
        {"[\"positive\",\"negative\",\"neutral\",\"n/a\"]",
         {"positive", "negative", "neutral", "n/a"},
         {"pos", "positive ", "\"positive\""}},
        {"[\"\",\"x\"]", {"", "x"}, {"y"}},
    };
    run_cases(FY_GRAMMAR_CHOICE, cases, FY_ARRAY_LEN(cases));
}

static void test_gbnf(void **state)
{
    (void)state;
    static const tcase_t cases[] = {
        {"root ::= \"a\" b* # comment\nb ::= [b-d] | \"xy\"\n", {"a", "abxyd"}, {"", "ab x", "ax"}},
        {"root   ::= (\"yes\" | \"no\")  \".\"?  [\\u00e9a-c]{1,3}\n",
         {"yesa", "no.\xc3\xa9"
                  "cc"},
         {"yes", "yesaaaa"}},
        {"root ::= item (\",\" item){0,2}\nitem ::= [0-9]+ | \"\\\"q\\\"\"\n", {"1", "12,\"q\",3"}, {"1,2,3,4", "1,"}},
        {"root ::= ( \"a\"\n  | \"b\" )\n", {"a", "b"}, {"ab"}},
        {"root ::= [^a\\n] .\n", {"bb", "b\n"}, {"ab", "\nb"}},
        {"root ::= \"\\x41\\u00e9\\t\"\n", {"A\xc3\xa9\t"}, {"A\xe9\t"}},
    };
    run_cases(FY_GRAMMAR_GBNF, cases, FY_ARRAY_LEN(cases));
    static const struct {
        const char *src, *words;
    } bad[] = {
        {"root ::= a\n", "rule 'a' is used but not defined"},
        {"item ::= \"a\"\n", "no rule named root"},
        {"root ::= root \"a\" | \"b\"\n", "left-recursive"},
        {"root ::= \"a\"\nroot ::= \"b\"\n", "defined twice"},
        {"root ::= <[1]>\n", "token references"},
        {"root ::= \"a\\q\"\n", "unknown escape"},
        {"root ::= (\"a\"\n", "missing )"},
        {"root = \"a\"\n", "expected ::="},
        {"root ::= \"a\"{3,1}\n", "out of range"},
    };
    for (size_t i = 0; i < FY_ARRAY_LEN(bad); i++) {
        char err[FY_GRAMMAR_ERR_LEN] = "";
        fy_grammar_t *g = NULL;
        fy_status_t st = fy_grammar_compile(FY_GRAMMAR_GBNF, bad[i].src, strlen(bad[i].src), &g, err, sizeof(err));
        if (st == FY_OK || !strstr(err, bad[i].words)) {
            fprintf(stderr, "%s: got '%s', want '...%s...'\n", bad[i].src, err, bad[i].words);
            fail();
        }
    }
    /* llama.cpp's json.gbnf accepts what json_object does */
    static const char json_gbnf[] =
        "root ::= object\nvalue ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
        "object ::= \"{\" ws ( string \":\" ws value (\",\" ws string \":\" ws value)* )? \"}\" ws\n"
        "array ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n"
        "string ::= \"\\\"\" ( [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) )* "
        "\"\\\"\" ws\n"
        "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9]{1,3})? ws\n"
        "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";
    fy_grammar_t *g = compile_ok(FY_GRAMMAR_GBNF, json_gbnf);
    assert_true(matches(g, "{\"a\": [1, -2.5e3, \"x\\n\", {\"b\": null}], \"c\": true}"));
    assert_false(matches(g, "{\"a\": [1,]}"));
    fy_grammar_unref(g);
}

/* ---- refusals and limits ------------------------------------------------------------------------------------ */

typedef struct refusal {
    fy_grammar_kind_t kind;
    const char *src;
    fy_status_t st;
    const char *words; /* the message must hold this */
} refusal_t;

static void test_refusals(void **state)
{
    (void)state;
    static const refusal_t cases[] = {
        {FY_GRAMMAR_JSON_SCHEMA, "{\"type\":\"object\",\"patternProperties\":{}}", FY_ERR_UNSUPPORTED,
         "keyword 'patternProperties' is not supported"},
        {FY_GRAMMAR_JSON_SCHEMA, "{\"type\":\"array\",\"uniqueItems\":true}", FY_ERR_UNSUPPORTED, "'uniqueItems'"},
        {FY_GRAMMAR_JSON_SCHEMA, "{\"type\":\"array\",\"prefixItems\":[]}", FY_ERR_UNSUPPORTED, "'prefixItems'"},
        {FY_GRAMMAR_JSON_SCHEMA, "{\"type\":\"integer\",\"maximum\":5}", FY_ERR_UNSUPPORTED, "'maximum'"},
        {FY_GRAMMAR_JSON_SCHEMA, "{\"type\":\"integer\",\"multipleOf\":5}", FY_ERR_UNSUPPORTED, "'multipleOf'"},
        {FY_GRAMMAR_JSON_SCHEMA, "{\"type\":\"integer\",\"minimum\":5}", FY_ERR_UNSUPPORTED, "'minimum'"},
        {FY_GRAMMAR_JSON_SCHEMA, "{\"type\":\"object\",\"minProperties\":1}", FY_ERR_UNSUPPORTED, "'minProperties'"},
        {FY_GRAMMAR_JSON_SCHEMA, "{\"not\":{\"type\":\"string\"}}", FY_ERR_UNSUPPORTED, "'not'"},
        {FY_GRAMMAR_JSON_SCHEMA, "{\"if\":{},\"then\":{}}", FY_ERR_UNSUPPORTED, "'if'"},
        {FY_GRAMMAR_JSON_SCHEMA, "{\"allOf\":[{},{}]}", FY_ERR_UNSUPPORTED, "'allOf'"},
        {FY_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"email\"}", FY_ERR_UNSUPPORTED, "format 'email'"},
        {FY_GRAMMAR_JSON_SCHEMA, "{\"$ref\":\"http://x/y.json\"}", FY_ERR_UNSUPPORTED, "$ref 'http://x/y.json'"},
        {FY_GRAMMAR_JSON_SCHEMA, "{\"$ref\":\"#/$defs/missing\"}", FY_ERR_INVALID, "points at nothing"},
        {FY_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", FY_ERR_UNSUPPORTED, "backreference"},
        {FY_GRAMMAR_JSON_SCHEMA, "{\"type\":\"strin\"}", FY_ERR_INVALID, "unknown type 'strin'"},
        {FY_GRAMMAR_JSON_SCHEMA, "{\"type\":\"object\",\"properties\":{},\"required\":[\"a\"]}", FY_ERR_UNSUPPORTED,
         "'a'"},
        {FY_GRAMMAR_JSON_SCHEMA, "{\"enum\":[]}", FY_ERR_INVALID, "enum"},
        {FY_GRAMMAR_JSON_SCHEMA, "false", FY_ERR_INVALID, "matches nothing"},
        {FY_GRAMMAR_JSON_SCHEMA, "{\"type\":", FY_ERR_INVALID, "not JSON"},
        {FY_GRAMMAR_JSON_SCHEMA, "{\"type\":\"array\",\"maxItems\":100000}", FY_ERR_INVALID, "maxItems"},
        {FY_GRAMMAR_JSON_SCHEMA, "{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#\"}},\"required\":[\"a\"]}",
         FY_ERR_INVALID, "matches no text"},
        {FY_GRAMMAR_JSON_SCHEMA,
         "{\"anyOf\":[{\"type\":\"null\"},{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#/anyOf/"
         "1\"}},\"required\":[\"a\"]}]}",
         FY_ERR_INVALID, "never finish"},
        {FY_GRAMMAR_JSON_SCHEMA, "{\"type\":\"array\",\"items\":[{},{}]}", FY_ERR_UNSUPPORTED, "'items' as an array"},
        {FY_GRAMMAR_JSON_SCHEMA, "{\"type\":\"object\",\"dependentRequired\":{\"a\":[\"b\"]}}", FY_ERR_UNSUPPORTED,
         "'dependentRequired'"},
        {FY_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"x-order\":1,\"propertyNames\":{}}", FY_ERR_UNSUPPORTED,
         "'propertyNames'"},
        {FY_GRAMMAR_JSON_SCHEMA,
         "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"number\",\"exclusiveMaximum\":3}}}",
         FY_ERR_UNSUPPORTED, "keyword 'exclusiveMaximum' is not supported (it constrains"},
        {FY_GRAMMAR_REGEX, "(?=a)b", FY_ERR_UNSUPPORTED, "lookahead"},
        {FY_GRAMMAR_REGEX, "(?<!a)b", FY_ERR_UNSUPPORTED, "lookbehind"},
        {FY_GRAMMAR_REGEX, "a\\bb", FY_ERR_UNSUPPORTED, "word boundary"},
        {FY_GRAMMAR_REGEX, "(a)\\1", FY_ERR_UNSUPPORTED, "backreference"},
        {FY_GRAMMAR_REGEX, "(?i)a", FY_ERR_UNSUPPORTED, "inline flag"},
        {FY_GRAMMAR_REGEX, "\\p{L}", FY_ERR_UNSUPPORTED, "unicode property"},
        {FY_GRAMMAR_REGEX, "a++", FY_ERR_UNSUPPORTED, "possessive"},
        {FY_GRAMMAR_REGEX, "a^b", FY_ERR_UNSUPPORTED, "'^' inside"},
        {FY_GRAMMAR_REGEX, "(a*)*", FY_ERR_INVALID, "left-recursive"},
        {FY_GRAMMAR_REGEX, "a[^\\x00-\\u{10FFFF}]|b", FY_ERR_INVALID, "can never finish"},
        {FY_GRAMMAR_REGEX, "[^\\x00-\\u{10FFFF}]", FY_ERR_INVALID, "matches no text"},
        {FY_GRAMMAR_REGEX, "(ab", FY_ERR_INVALID, "missing )"},
        {FY_GRAMMAR_REGEX, "a{3,2}", FY_ERR_INVALID, "out of range"},
        {FY_GRAMMAR_REGEX, "a{99999}", FY_ERR_INVALID, "out of range"},
        {FY_GRAMMAR_REGEX, "[]", FY_ERR_INVALID, "unterminated"},
        {FY_GRAMMAR_REGEX, "*a", FY_ERR_INVALID, "nothing to repeat"},
        {FY_GRAMMAR_REGEX, "\xff", FY_ERR_INVALID, "UTF-8"},
        {FY_GRAMMAR_CHOICE, "[]", FY_ERR_INVALID, "1 to"},
        {FY_GRAMMAR_CHOICE, "[\"a\",1]", FY_ERR_INVALID, "entry 1"},
        {FY_GRAMMAR_CHOICE, "{\"a\":1}", FY_ERR_INVALID, "array"},
    };
    for (size_t i = 0; i < FY_ARRAY_LEN(cases); i++) {
        char err[FY_GRAMMAR_ERR_LEN] = "";
        fy_grammar_t *g = NULL;
        fy_status_t st = fy_grammar_compile(cases[i].kind, cases[i].src, strlen(cases[i].src), &g, err, sizeof(err));
        if (st != cases[i].st || !strstr(err, cases[i].words)) {
            fprintf(stderr, "%s: got %s '%s', want %s '...%s...'\n", cases[i].src, fy_status_str(st), err,
                    fy_status_str(cases[i].st), cases[i].words);
            fail();
        }
        assert_null(g);
    }
}

static void test_limits(void **state)
{
    (void)state;
    char err[FY_GRAMMAR_ERR_LEN];
    fy_grammar_t *g = NULL;
    /* nesting */
    size_t cap = 200 * 40;
    char *s = fy_malloc(cap);
    assert_non_null(s);
    size_t n = 0;
    for (int i = 0; i < 100; i++) n += (size_t)snprintf(s + n, cap - n, "{\"type\":\"array\",\"items\":");
    n += (size_t)snprintf(s + n, cap - n, "true");
    for (int i = 0; i < 100; i++) s[n++] = '}';
    assert_int_equal(fy_grammar_compile(FY_GRAMMAR_JSON_SCHEMA, s, n, &g, err, sizeof(err)), FY_ERR_INVALID);
    assert_non_null(strstr(err, "nested deeper"));
    /* regex groups */
    n = 0;
    for (int i = 0; i < 100; i++) s[n++] = '(';
    s[n++] = 'a';
    for (int i = 0; i < 100; i++) s[n++] = ')';
    assert_int_equal(fy_grammar_compile(FY_GRAMMAR_REGEX, s, n, &g, err, sizeof(err)), FY_ERR_INVALID);
    assert_non_null(strstr(err, "nested too deeply"));
    fy_free(s);
    /* source size */
    size_t big = FY_GRAMMAR_MAX_SOURCE + 1;
    s = fy_malloc(big);
    assert_non_null(s);
    memset(s, 'a', big);
    assert_int_equal(fy_grammar_compile(FY_GRAMMAR_REGEX, s, big, &g, err, sizeof(err)), FY_ERR_INVALID);
    fy_free(s);
    /* products of repetitions stay linear, and the element cap holds */
    assert_int_equal(fy_grammar_compile(FY_GRAMMAR_REGEX, "((a{1000}){1000}){1000}", 23, &g, err, sizeof(err)), FY_OK);
    assert_true(fy_grammar_n_elems(g) < 20000);
    fy_grammar_unref(g);
    /* ambiguity does not multiply stacks: (a|a|a)* over 2,000 a's */
    g = compile_ok(FY_GRAMMAR_REGEX, "(a|a|aa|a*b)*c");
    fy_gmatch_t *m;
    assert_int_equal(fy_gmatch_create(g, &m), FY_OK);
    for (int i = 0; i < 2000; i++) assert_true(fy_gmatch_accept_byte(m, 'a'));
    assert_true(fy_gmatch_accept_byte(m, 'c'));
    assert_true(fy_gmatch_is_complete(m));
    fy_gmatch_destroy(m);
    fy_grammar_unref(g);
    /* deep json_object nesting: memory grows per level, no crash */
    g = compile_ok(FY_GRAMMAR_JSON_OBJECT, NULL);
    assert_int_equal(fy_gmatch_create(g, &m), FY_OK);
    assert_true(fy_gmatch_accept_bytes(m, "{\"a\":", 5));
    /* deep enough that the memo fills and is rebuilt (more states than
     * it keeps), across tokens so that rollback crosses a rebuild */
    fy_token_trie_t *t = tiny_trie();
    for (int i = 0; i < 20000; i++) assert_int_equal(fy_gmatch_accept_token(m, t, '['), FY_OK);
    for (int i = 0; i < 19990; i++) assert_true(fy_gmatch_accept_byte(m, ']'));
    for (int i = 0; i < 10; i++) assert_int_equal(fy_gmatch_accept_token(m, t, ']'), FY_OK);
    fy_gmatch_stats_t st;
    fy_gmatch_stats(m, &st);
    assert_true(st.flushes > 0);
    assert_int_equal(fy_gmatch_rollback(m, 10), FY_OK);
    assert_true(fy_gmatch_accept_bytes(m, "]]]]]]]]]]", 10));
    assert_false(fy_gmatch_accept_byte(m, ']'));
    assert_true(fy_gmatch_accept_byte(m, '}'));
    assert_true(fy_gmatch_is_complete(m));
    fy_token_trie_destroy(t);
    fy_gmatch_destroy(m);
    fy_grammar_unref(g);
}

static void test_cache(void **state)
{
    (void)state;
    fy_grammar_cache_t *c;
    assert_int_equal(fy_grammar_cache_create(2, &c), FY_OK);
    const char *a = "{\"type\":\"integer\"}", *b = "{\"type\":\"string\"}", *d = "{\"type\":\"boolean\"}";
    fy_grammar_t *g1, *g2, *g3;
    bool hit;
    char err[FY_GRAMMAR_ERR_LEN];
    assert_int_equal(fy_grammar_cache_get(c, FY_GRAMMAR_JSON_SCHEMA, a, strlen(a), &g1, &hit, err, sizeof(err)), FY_OK);
    assert_false(hit);
    assert_int_equal(fy_grammar_cache_get(c, FY_GRAMMAR_JSON_SCHEMA, a, strlen(a), &g2, &hit, err, sizeof(err)), FY_OK);
    assert_true(hit);
    assert_ptr_equal(g1, g2);
    /* the kind is part of the key */
    fy_status_t st = fy_grammar_cache_get(c, FY_GRAMMAR_REGEX, a, strlen(a), &g3, &hit, err, sizeof(err));
    if (st) fprintf(stderr, "%s\n", err);
    assert_int_equal(st, FY_OK);
    assert_false(hit);
    assert_ptr_not_equal(g1, g3);
    fy_grammar_unref(g3);
    /* LRU: b evicts the regex, d evicts a... after a was used last? a used before regex: a goes */
    assert_int_equal(fy_grammar_cache_get(c, FY_GRAMMAR_JSON_SCHEMA, b, strlen(b), &g3, &hit, err, sizeof(err)), FY_OK);
    fy_grammar_unref(g3);
    assert_int_equal(fy_grammar_cache_get(c, FY_GRAMMAR_JSON_SCHEMA, d, strlen(d), &g3, &hit, err, sizeof(err)), FY_OK);
    fy_grammar_unref(g3);
    assert_int_equal(fy_grammar_cache_get(c, FY_GRAMMAR_JSON_SCHEMA, a, strlen(a), &g3, &hit, err, sizeof(err)), FY_OK);
    assert_false(hit);
    fy_grammar_unref(g3);
    /* failures are reported, not cached */
    assert_int_equal(fy_grammar_cache_get(c, FY_GRAMMAR_JSON_SCHEMA, "{\"not\":{}}", 10, &g3, &hit, err, sizeof(err)),
                     FY_ERR_UNSUPPORTED);
    assert_non_null(strstr(err, "'not'"));
    fy_grammar_cache_destroy(c);
    /* grammars handed out outlive the cache */
    assert_true(matches(g1, "42"));
    fy_grammar_unref(g1);
    fy_grammar_unref(g2);
}

/* Threads sharing a cache smaller than their set of schemas: every get
 * gives the right grammar while others evict it. */
static fy_grammar_cache_t *g_shared;

static void *cache_worker(void *arg)
{
    uint64_t rng = (uint64_t)(uintptr_t)arg;
    static const char *const srcs[] = {"{\"type\":\"integer\"}", "{\"type\":\"string\"}", "{\"type\":\"boolean\"}",
                                       "{\"type\":\"null\"}",    "{\"enum\":[1,2]}",      "{\"const\":\"k\"}"};
    static const char *const texts[] = {"42", "\"s\"", "true", "null", "2", "\"k\""};
    for (int i = 0; i < 300; i++) {
        int k = (int)(fy_test_rand_u64(&rng) % 6);
        fy_grammar_t *g;
        char err[FY_GRAMMAR_ERR_LEN];
        if (fy_grammar_cache_get(g_shared, FY_GRAMMAR_JSON_SCHEMA, srcs[k], strlen(srcs[k]), &g, NULL, err,
                                 sizeof(err)))
            return (void *)1;
        fy_gmatch_t *m;
        bool ok = fy_gmatch_create(g, &m) == FY_OK;
        fy_grammar_unref(g); /* the matcher keeps it alive through an eviction */
        if (!ok) return (void *)1;
        ok = fy_gmatch_accept_bytes(m, texts[k], strlen(texts[k])) && fy_gmatch_is_complete(m);
        fy_gmatch_destroy(m);
        if (!ok) return (void *)1;
    }
    return NULL;
}

static void test_cache_threads(void **state)
{
    (void)state;
    assert_int_equal(fy_grammar_cache_create(3, &g_shared), FY_OK);
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&th[i], NULL, cache_worker, (void *)(uintptr_t)(SEED + i)), 0);
    for (int i = 0; i < 4; i++) {
        void *rv;
        assert_int_equal(pthread_join(th[i], &rv), 0);
        assert_null(rv);
    }
    fy_grammar_cache_destroy(g_shared);
    g_shared = NULL;
}

/* ---- masks -------------------------------------------------------------------------------------------------- */

/* A tiny vocabulary: every byte, some multi-byte pieces, a special and EOS. */
static fy_token_trie_t *tiny_trie(void)
{
    static const char *const pieces[] = {"{\"", "\":", "\"", "ab",  "abc",      "true", "tr", "ue",    ", \"",
                                         "}",   "1",   "12", "-1.", "\xc3\xa9", "\xc3", " ",  "\n ",   "null",
                                         "\"}", "\"]", "[{", "},{", "a\"b",     "e+",   "x",  "\"a\"", "red"};
    enum { NP = sizeof(pieces) / sizeof(pieces[0]) };
    int32_t n = 256 + NP + 2;
    const uint8_t *bytes[256 + NP + 2];
    uint32_t len[256 + NP + 2];
    bool skip[256 + NP + 2] = {0};
    static uint8_t single[256];
    for (int i = 0; i < 256; i++) {
        single[i] = (uint8_t)i;
        bytes[i] = &single[i];
        len[i] = 1;
    }
    for (int i = 0; i < NP; i++) {
        bytes[256 + i] = (const uint8_t *)pieces[i];
        len[256 + i] = (uint32_t)strlen(pieces[i]);
    }
    bytes[256 + NP] = (const uint8_t *)"<special>"; /* never allowed */
    len[256 + NP] = 9;
    skip[256 + NP] = true;
    bytes[256 + NP + 1] = (const uint8_t *)""; /* EOS */
    len[256 + NP + 1] = 0;
    int32_t eos = 256 + NP + 1;
    fy_token_trie_t *t;
    assert_int_equal(fy_token_trie_create(n, bytes, len, skip, &eos, 1, &t), FY_OK);
    return t;
}

static fy_token_trie_t *g_real; /* the default model's, or NULL */

static fy_token_trie_t *real_trie(void)
{
    if (g_real) return g_real;
    const char *path = fy_test_default_model();
    if (!path) return NULL;
    fy_gguf_t *gguf;
    assert_int_equal(fy_gguf_open(path, &gguf), FY_OK);
    fy_tokenizer_t *tok;
    assert_int_equal(fy_tokenizer_from_gguf(gguf, &tok), FY_OK);
    fy_gguf_close(gguf);
    assert_int_equal(fy_token_trie_from_tokenizer(tok, &g_real), FY_OK);
    fy_tokenizer_destroy(tok);
    return g_real;
}

static bool bit(const uint32_t *mask, int32_t id) { return (mask[id >> 5] >> (id & 31)) & 1; }

/* mask == {t : accept_token(t) succeeds}, via accept + rollback */
static void check_mask(fy_gmatch_t *m, const fy_token_trie_t *t, const uint32_t *mask)
{
    for (int32_t id = 0; id < t->n_vocab; id++) {
        fy_status_t st = fy_gmatch_accept_token(m, t, id);
        bool ok = st == FY_OK;
        if (ok) assert_int_equal(fy_gmatch_rollback(m, 1), FY_OK);
        if (ok != bit(mask, id)) {
            fprintf(stderr, "token %d (%.*s): mask says %d, accept says %d\n", id, (int)t->tok_len[id],
                    t->tok_bytes[id] ? (const char *)t->tok_bytes[id] : "", bit(mask, id), ok);
            fail();
        }
    }
}

/* Picks a token uniformly from the mask; -1 if empty. */
static int32_t pick(const uint32_t *mask, int32_t n_vocab, uint64_t *rng)
{
    int32_t n = 0;
    for (int32_t w = 0; w < (n_vocab + 31) / 32; w++) n += __builtin_popcount(mask[w]);
    if (n == 0) return -1;
    int32_t k = (int32_t)(fy_test_rand_u64(rng) % (uint64_t)n);
    for (int32_t id = 0; id < n_vocab; id++)
        if (bit(mask, id) && k-- == 0) return id;
    return -1;
}

static const char *const g_mask_schemas[] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":6},\"n\":{\"type\":\"integer\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"red\",\"abc\"]},\"maxItems\":3},\"ok\":{\"type\":\"boolean\"}}"
    ","
    "\"required\":[\"name\",\"n\"]}",
    "{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"number\"},{\"type\":\"null\"},{\"type\":\"string\","
    "\"format\":\"date\"}]},\"maxItems\":4}",
};

static void mask_vs_brute(const fy_token_trie_t *t, fy_grammar_t *g, uint64_t *rng, int steps)
{
    fy_gmatch_t *m;
    assert_int_equal(fy_gmatch_create(g, &m), FY_OK);
    size_t words = fy_token_trie_mask_words(t);
    uint32_t *mask = fy_malloc(words * sizeof(uint32_t));
    assert_non_null(mask);
    for (int s = 0; s < steps && !fy_gmatch_is_ended(m); s++) {
        assert_int_equal(fy_gmatch_mask(m, t, mask), FY_OK);
        check_mask(m, t, mask);
        /* EOS exactly when complete; specials never */
        for (int32_t i = 0; i < t->n_eog; i++) assert_int_equal(bit(mask, t->eog[i]), fy_gmatch_is_complete(m));
        int32_t id = pick(mask, t->n_vocab, rng);
        assert_true(id >= 0);
        assert_int_equal(fy_gmatch_accept_token(m, t, id), FY_OK);
    }
    fy_free(mask);
    fy_gmatch_destroy(m);
}

static void test_mask_tiny(void **state)
{
    (void)state;
    fy_token_trie_t *t = tiny_trie();
    uint64_t rng = SEED;
    for (size_t i = 0; i < FY_ARRAY_LEN(g_mask_schemas); i++) {
        fy_grammar_t *g = compile_ok(FY_GRAMMAR_JSON_SCHEMA, g_mask_schemas[i]);
        for (int rep = 0; rep < 20; rep++) mask_vs_brute(t, g, &rng, 60);
        fy_grammar_unref(g);
    }
    fy_grammar_t *g = compile_ok(FY_GRAMMAR_JSON_OBJECT, NULL);
    for (int rep = 0; rep < 20; rep++) mask_vs_brute(t, g, &rng, 60);
    fy_grammar_unref(g);
    g = compile_ok(FY_GRAMMAR_REGEX, "(ab|[a-c]\\d)+x?");
    for (int rep = 0; rep < 10; rep++) mask_vs_brute(t, g, &rng, 30);
    fy_grammar_unref(g);
    fy_token_trie_destroy(t);
}

static void test_mask_real(void **state)
{
    (void)state;
    const fy_token_trie_t *t = real_trie();
    if (!t) skip();
    uint64_t rng = SEED + 1;
    for (size_t i = 0; i < FY_ARRAY_LEN(g_mask_schemas); i++) {
        fy_grammar_t *g = compile_ok(FY_GRAMMAR_JSON_SCHEMA, g_mask_schemas[i]);
        for (int rep = 0; rep < 3; rep++) mask_vs_brute(t, g, &rng, 12);
        fy_grammar_unref(g);
    }
    fy_grammar_t *g = compile_ok(FY_GRAMMAR_JSON_OBJECT, NULL);
    mask_vs_brute(t, g, &rng, 12);
    fy_grammar_unref(g);
}

static void test_rollback_clone(void **state)
{
    (void)state;
    fy_token_trie_t *t = tiny_trie();
    fy_grammar_t *g = compile_ok(FY_GRAMMAR_JSON_OBJECT, NULL);
    fy_gmatch_t *m, *c;
    assert_int_equal(fy_gmatch_create(g, &m), FY_OK);
    fy_grammar_unref(g); /* the matcher holds its own reference */
    int32_t lbrace = '{', q = '"', a = 'a';
    assert_int_equal(fy_gmatch_accept_token(m, t, lbrace), FY_OK);
    assert_int_equal(fy_gmatch_accept_token(m, t, q), FY_OK);
    assert_int_equal(fy_gmatch_accept_token(m, t, a), FY_OK);
    assert_int_equal(fy_gmatch_accept_token(m, t, '\n'), FY_ERR_INVALID); /* no raw newline inside a key */
    assert_int_equal(fy_gmatch_history(m), 3);
    assert_int_equal(fy_gmatch_clone(m, &c), FY_OK);
    assert_int_equal(fy_gmatch_rollback(m, 2), FY_OK);
    assert_int_equal(fy_gmatch_accept_token(m, t, '}'), FY_OK);
    assert_true(fy_gmatch_is_complete(m));
    assert_int_equal(fy_gmatch_rollback(m, 5), FY_ERR_INVALID);
    /* the clone went on from "{\"a" */
    assert_false(fy_gmatch_is_complete(c));
    assert_true(fy_gmatch_accept_bytes(c, "\":1}", 4));
    assert_true(fy_gmatch_is_complete(c));
    assert_int_equal(fy_gmatch_rollback(c, 3), FY_ERR_INVALID); /* byte accepts cleared the history */
    /* EOS only when complete, and then nothing else */
    int32_t eos = t->eog[0];
    assert_int_equal(fy_gmatch_accept_token(m, t, eos), FY_OK);
    assert_true(fy_gmatch_is_ended(m));
    assert_int_equal(fy_gmatch_accept_token(m, t, ' '), FY_ERR_INVALID);
    assert_int_equal(fy_gmatch_accept_token(m, t, eos), FY_OK); /* as the mask says */
    assert_int_equal(fy_gmatch_rollback(m, 1), FY_OK);
    assert_true(fy_gmatch_is_ended(m));
    uint32_t mask[16];
    assert_int_equal(fy_gmatch_mask(m, t, mask), FY_OK);
    assert_true(bit(mask, eos));
    assert_false(bit(mask, ' '));
    assert_int_equal(fy_gmatch_rollback(m, 1), FY_OK);
    assert_false(fy_gmatch_is_ended(m));
    fy_gmatch_destroy(c);
    fy_gmatch_destroy(m);
    fy_token_trie_destroy(t);
}

/* ---- random schemas ---------------------------------------------------------------------------------------------- */

static uint32_t rnd(uint64_t *rng, uint32_t n) { return (uint32_t)(fy_test_rand_u64(rng) % n); }

static json_t *gen_schema(uint64_t *rng, int depth, json_t *defs, int *n_defs);

static json_t *gen_leaf(uint64_t *rng)
{
    switch (rnd(rng, 9)) {
    case 0: return json_pack("{s:s}", "type", "integer");
    case 1: return json_pack("{s:s, s:i}", "type", "integer", "minimum", 0);
    case 2: return json_pack("{s:s}", "type", "number");
    case 3: return json_pack("{s:s}", "type", "boolean");
    case 4: return json_pack("{s:s, s:i, s:i}", "type", "string", "minLength", 1, "maxLength", 8);
    case 5: return json_pack("{s:s, s:s}", "type", "string", "format", rnd(rng, 2) ? "date" : "uuid");
    case 6: return json_pack("{s:[s,s,i,n]}", "enum", "red", "gr\"een", 7);
    case 7: return json_pack("{s:s, s:s}", "type", "string", "title", "Plain");
    default: return json_pack("{s:s}", "type", "null");
    }
}

static json_t *gen_schema(uint64_t *rng, int depth, json_t *defs, int *n_defs)
{
    uint32_t k = depth >= 3 ? 0 : rnd(rng, 6);
    switch (k) {
    case 1: { /* object */
        json_t *props = json_object(), *req = json_array();
        int n = 1 + (int)rnd(rng, 4);
        for (int i = 0; i < n; i++) {
            char name[16];
            snprintf(name, sizeof(name), "p%d_%u", i, rnd(rng, 100));
            json_object_set_new(props, name, gen_schema(rng, depth + 1, defs, n_defs));
            if (rnd(rng, 2)) json_array_append_new(req, json_string(name));
        }
        return json_pack("{s:s, s:o, s:o, s:b, s:s}", "type", "object", "properties", props, "required", req,
                         "additionalProperties", 0, "title", "Obj");
    }
    case 2: /* array */
        return json_pack("{s:s, s:o, s:i, s:i}", "type", "array", "items", gen_schema(rng, depth + 1, defs, n_defs),
                         "minItems", (int)rnd(rng, 2), "maxItems", 2 + (int)rnd(rng, 2));
    case 3: /* anyOf of distinct types (oneOf-safe) */
        return json_pack("{s:[{s:s},{s:s, s:i}]}", "anyOf", "type", "null", "type", "array", "maxItems", 2);
    case 4: { /* a $def and its $ref, as Pydantic writes them */
        char name[16];
        snprintf(name, sizeof(name), "Def%d", (*n_defs)++);
        json_object_set_new(defs, name, gen_schema(rng, depth + 1, defs, n_defs));
        char ref[40];
        snprintf(ref, sizeof(ref), "#/$defs/%s", name);
        return json_pack("{s:s}", "$ref", ref);
    }
    case 5: /* a map */ return json_pack("{s:s, s:o}", "type", "object", "additionalProperties", gen_leaf(rng));
    default: return gen_leaf(rng);
    }
}

/* A validator for what gen_schema writes. */
static bool utf8_len(const char *s, size_t *n)
{
    *n = 0;
    for (; *s; s++)
        if (((unsigned char)*s & 0xC0) != 0x80) (*n)++;
    return true;
}

static bool valid(json_t *root, json_t *s, json_t *v)
{
    json_t *x;
    if ((x = json_object_get(s, "$ref"))) {
        const char *name = strrchr(json_string_value(x), '/') + 1;
        return valid(root, json_object_get(json_object_get(root, "$defs"), name), v);
    }
    if ((x = json_object_get(s, "enum"))) {
        size_t i;
        json_t *e;
        json_array_foreach(x, i, e) if (json_equal(e, v)) return true;
        return false;
    }
    if ((x = json_object_get(s, "anyOf"))) {
        size_t i;
        json_t *e;
        json_array_foreach(x, i, e) if (valid(root, e, v)) return true;
        return false;
    }
    const char *type = json_string_value(json_object_get(s, "type"));
    if (!strcmp(type, "null")) return json_is_null(v);
    if (!strcmp(type, "boolean")) return json_is_boolean(v);
    if (!strcmp(type, "integer")) {
        if (!json_is_integer(v)) return false;
        return !json_object_get(s, "minimum") || json_integer_value(v) >= 0;
    }
    if (!strcmp(type, "number")) return json_is_number(v);
    if (!strcmp(type, "string")) {
        if (!json_is_string(v)) return false;
        const char *str = json_string_value(v), *f = json_string_value(json_object_get(s, "format"));
        size_t n;
        utf8_len(str, &n);
        if (json_object_get(s, "minLength") && n < (size_t)json_integer_value(json_object_get(s, "minLength")))
            return false;
        if (json_object_get(s, "maxLength") && n > (size_t)json_integer_value(json_object_get(s, "maxLength")))
            return false;
        if (f && !strcmp(f, "date")) {
            int y, mo, d;
            char tail;
            return strlen(str) == 10 && sscanf(str, "%4d-%2d-%2d%c", &y, &mo, &d, &tail) == 3 && mo >= 1 && mo <= 12 &&
                   d >= 1 && d <= 31;
        }
        if (f && !strcmp(f, "uuid")) {
            if (strlen(str) != 36) return false;
            for (int i = 0; i < 36; i++) {
                bool dash = i == 8 || i == 13 || i == 18 || i == 23;
                if (dash != (str[i] == '-')) return false;
                if (!dash && !strchr("0123456789abcdefABCDEF", str[i])) return false;
            }
        }
        return true;
    }
    if (!strcmp(type, "array")) {
        if (!json_is_array(v)) return false;
        size_t n = json_array_size(v);
        if (json_object_get(s, "minItems") && n < (size_t)json_integer_value(json_object_get(s, "minItems")))
            return false;
        if (json_object_get(s, "maxItems") && n > (size_t)json_integer_value(json_object_get(s, "maxItems")))
            return false;
        json_t *items = json_object_get(s, "items");
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) if (items && !valid(root, items, e)) return false;
        return true;
    }
    if (!strcmp(type, "object")) {
        if (!json_is_object(v)) return false;
        json_t *props = json_object_get(s, "properties"), *addl = json_object_get(s, "additionalProperties");
        size_t i;
        json_t *e;
        json_array_foreach(json_object_get(s, "required"), i,
                           e) if (!json_object_get(v, json_string_value(e))) return false;
        const char *key;
        json_object_foreach(v, key, e)
        {
            json_t *ps = props ? json_object_get(props, key) : NULL;
            if (ps) {
                if (!valid(root, ps, e)) return false;
            } else if (json_is_false(addl) || !addl) {
                return false;
            } else if (json_is_object(addl) && !valid(root, addl, e)) {
                return false;
            }
        }
        return true;
    }
    return false;
}

static void test_random_schemas(void **state)
{
    (void)state;
    const fy_token_trie_t *t = real_trie();
    fy_token_trie_t *own = NULL;
    if (!t) {
        fprintf(stderr, "note: default model absent: random completions over the tiny vocabulary\n");
        t = own = tiny_trie();
    }
    const char *py = getenv("FERRY_PYTHON");
    bool have_py = false;
    if (py && access(py, X_OK) == 0) {
        char cmd[512];
        snprintf(cmd, sizeof(cmd), "'%s' -c 'import jsonschema' 2>/dev/null", py);
        have_py = system(cmd) == 0;
    }
    if (!have_py)
        fprintf(stderr, "note: $FERRY_PYTHON has no jsonschema: completions checked by the validator here only\n");
    json_t *pairs = json_array();
    uint64_t rng = SEED + 2;
    size_t words = fy_token_trie_mask_words(t);
    uint32_t *mask = fy_malloc(words * sizeof(uint32_t));
    char *text = fy_malloc(1 << 16);
    assert_non_null(mask);
    assert_non_null(text);
    int finished = 0, n_schemas = 60;
    for (int si = 0; si < n_schemas; si++) {
        json_t *defs = json_object();
        int n_defs = 0;
        json_t *body = gen_schema(&rng, 0, defs, &n_defs);
        json_t *s = body;
        if (n_defs) json_object_set(s, "$defs", defs);
        json_decref(defs);
        char err[FY_GRAMMAR_ERR_LEN];
        fy_grammar_t *g = NULL;
        if (fy_grammar_from_json_schema(s, &g, err, sizeof(err)) != FY_OK) {
            char *d = json_dumps(s, JSON_COMPACT);
            fprintf(stderr, "schema %d: %s\n%s\n", si, err, d);
            free(d);
            fail();
        }
        for (int rep = 0; rep < 3; rep++) {
            fy_gmatch_t *m;
            assert_int_equal(fy_gmatch_create(g, &m), FY_OK);
            size_t n = 0;
            int steps = 0;
            while (!fy_gmatch_is_ended(m) && steps++ < 3000) {
                assert_int_equal(fy_gmatch_mask(m, t, mask), FY_OK);
                int32_t id = pick(mask, t->n_vocab, &rng);
                assert_true(id >= 0);
                assert_int_equal(fy_gmatch_accept_token(m, t, id), FY_OK);
                if (!fy_token_trie_is_eog(t, id) && n + t->tok_len[id] < (1 << 16) - 1) {
                    memcpy(text + n, t->tok_bytes[id], t->tok_len[id]);
                    n += t->tok_len[id];
                }
            }
            text[n] = '\0';
            if (!fy_gmatch_is_ended(m)) { /* ran long: not a failure of the grammar */
                fy_gmatch_destroy(m);
                continue;
            }
            finished++;
            json_error_t je;
            json_t *v = json_loadb(text, n, JSON_DECODE_ANY, &je);
            char *d = json_dumps(s, JSON_COMPACT);
            if (!v || !valid(s, s, v)) {
                fprintf(stderr, "schema %s\ncompletion %s\n%s\n", d, text, v ? "does not validate" : je.text);
                fail();
            }
            json_array_append_new(pairs, json_pack("{s:O, s:O}", "schema", s, "instance", v));
            free(d);
            json_decref(v);
            fy_gmatch_destroy(m);
        }
        fy_grammar_unref(g);
        json_decref(s);
    }
    fprintf(stderr, "note: %d completions finished and validated\n", finished);
    assert_true(finished >= n_schemas); /* most of the 3 per schema */
    if (have_py) {
        const char *path = fy_test_path("pairs.json");
        assert_int_equal(json_dump_file(pairs, path, JSON_COMPACT), 0);
        char cmd[1024];
        snprintf(cmd, sizeof(cmd),
                 "'%s' -c 'import json,sys,jsonschema\n"
                 "ps=json.load(open(sys.argv[1]))\n"
                 "for p in ps: jsonschema.validate(p[\"instance\"], p[\"schema\"])\n"
                 "print(\"jsonschema: %%d completions valid\" %% len(ps))' '%s'",
                 py, path);
        assert_int_equal(system(cmd), 0);
    }
    json_decref(pairs);
    fy_free(mask);
    fy_free(text);
    fy_token_trie_destroy(own);
}

static void test_alloc_failure(void **state)
{
    (void)state;
    /* every allocation of compile + a few masks failing in turn unwinds cleanly */
    const char *src = g_mask_schemas[0];
    fy_token_trie_t *t = tiny_trie();
    uint32_t mask[16];
    fy_test_log_begin(); /* each failure logs its line */
    for (long n = 1; n < 4000; n++) {
        fy_mem_fail_after(n);
        fy_grammar_t *g = NULL;
        fy_gmatch_t *m = NULL;
        char err[FY_GRAMMAR_ERR_LEN];
        fy_status_t st = fy_grammar_compile(FY_GRAMMAR_JSON_SCHEMA, src, strlen(src), &g, err, sizeof(err));
        if (!st) st = fy_gmatch_create(g, &m);
        for (int k = 0; !st && k < 4; k++) {
            st = fy_gmatch_mask(m, t, mask);
            if (!st) st = fy_gmatch_accept_token(m, t, k == 0 ? 256 : '1'); /* {" then digits */
        }
        fy_mem_fail_after(0);
        fy_gmatch_destroy(m);
        fy_grammar_unref(g);
        if (st == FY_OK) break;
    }
    fy_test_log_end();
    fy_token_trie_destroy(t);
}

/* issue 32, item 11: a regex of 5,000 alternatives (what a worker's
 * matcher cannot start on: more stacks alive at once than it follows)
 * is refused by the compiler, which the router runs at the door and the
 * workers run again, with the limit named; 4,000 compile and their
 * matcher starts and takes a whole one.  The same for GBNF and a deep
 * nesting of optional parts: refused or run, never a crash. */
static void test_matcher_start_limit(void **state)
{
    (void)state;
    char err[FY_GRAMMAR_ERR_LEN];
    fy_grammar_t *g = NULL;
    size_t cap = 64 * 1024, n;
    char *s = fy_malloc(cap);
    assert_non_null(s);
    static const int counts[] = {5000, 4000};
    for (int k = 0; k < 2; k++) {
        n = 0;
        for (int i = 0; i < counts[k]; i++) n += (size_t)snprintf(s + n, cap - n, "%s%d", i ? "|" : "", i);
        assert_true(n < 32768); /* within a generation's grammar bytes: only the matcher's limit refuses it */
        fy_status_t st = fy_grammar_compile(FY_GRAMMAR_REGEX, s, n, &g, err, sizeof(err));
        print_message("%d alternatives (%zu bytes): %s %s\n", counts[k], n, fy_status_str(st), st ? err : "");
        if (k == 0) {
            assert_int_equal(st, FY_ERR_INVALID);
            assert_null(g);
            assert_non_null(strstr(err, "matcher's limits"));
            continue;
        }
        assert_int_equal(st, FY_OK);
        fy_gmatch_t *m;
        assert_int_equal(fy_gmatch_create(g, &m), FY_OK);
        assert_true(fy_gmatch_accept_bytes(m, "3999", 4));
        assert_true(fy_gmatch_is_complete(m));
        fy_gmatch_destroy(m);
        fy_grammar_unref(g);
        g = NULL;
    }
    /* GBNF: the same choice as a rule */
    n = (size_t)snprintf(s, cap, "root ::= ");
    for (int i = 0; i < 5000; i++) n += (size_t)snprintf(s + n, cap - n, "%s\"%d\"", i ? " | " : "", i);
    assert_int_equal(fy_grammar_compile(FY_GRAMMAR_GBNF, s, n, &g, err, sizeof(err)), FY_ERR_INVALID);
    assert_non_null(strstr(err, "matcher's limits"));
    /* 20,000 optional parts in a row: many alive at the start */
    n = 0;
    for (int i = 0; i < 20000 && n + 3 < cap; i++) n += (size_t)snprintf(s + n, cap - n, "a?");
    fy_status_t st = fy_grammar_compile(FY_GRAMMAR_REGEX, s, n, &g, err, sizeof(err));
    print_message("20000 optional parts: %s %s\n", fy_status_str(st), st ? err : "");
    assert_int_equal(st, FY_ERR_INVALID);
    fy_free(s);
}

static void test_compile_time(void **state)
{
    (void)state;
    const char *src = g_mask_schemas[0];
    double t0 = fy_now_s();
    for (int i = 0; i < 100; i++) fy_grammar_unref(compile_ok(FY_GRAMMAR_JSON_SCHEMA, src));
    double ms = (fy_now_s() - t0) * 1e3 / 100;
    fprintf(stderr, "note: compile %.3f ms\n", ms);
    assert_true(ms < 20);
}

static int teardown(void **state)
{
    (void)state;
    fy_token_trie_destroy(g_real);
    g_real = NULL;
    fy_test_tmpdir_remove();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schema_scalars),
        cmocka_unit_test(test_schema_ignored_keywords),
        cmocka_unit_test(test_schema_objects),
        cmocka_unit_test(test_schema_arrays_refs),
        cmocka_unit_test(test_json_object),
        cmocka_unit_test(test_regex),
        cmocka_unit_test(test_choice),
        cmocka_unit_test(test_gbnf),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_matcher_start_limit),
        cmocka_unit_test(test_cache),
        cmocka_unit_test(test_cache_threads),
        cmocka_unit_test(test_mask_tiny),
        cmocka_unit_test(test_mask_real),
        cmocka_unit_test(test_rollback_clone),
        cmocka_unit_test(test_random_schemas),
        cmocka_unit_test(test_alloc_failure),
        cmocka_unit_test(test_compile_time),
    };
    fprintf(stderr, "note: seed 0x%x\n", SEED);
    return cmocka_run_group_tests(tests, NULL, teardown);
}

/*
 * test_tools.c - tool calls and structured outputs at the HTTP door,
 * without a cluster: the model's output parsed into tool calls (Hermes
 * <tool_call> blocks, SmolLM2's arrays, Llama 3 JSON; good, malformed,
 * several calls, text around), what a growing text may stream as
 * content, the request's tools and tool_choice checked, the JSON Schema
 * that enforces "required" and a named function, and request bodies
 * through router/http_parse.c with the default model: the genspec's
 * grammar for response_format, guided_* and tool_choice, the 400s naming
 * their field, and SmolLM2's tool prompt in the rendered prompt.
 * (tests/test_chat.c renders tools through Qwen's and Llama 3's own
 * templates; tests/test_http.c runs tool calls through a cluster.)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <sodium.h>

#include "http_parse.h"
#include "mem.h"
#include "model.h"
#include "testutil.h"
#include "tokenizer.h"
#include "tools.h"

/* ---- output parsing ------------------------------------------------------ */

/* Parses text and checks the calls' names and arguments ("name" "args"
 * pairs, NULL-terminated) and the content's length. */
static void expect_calls(fy_tool_format_t fmt, const char *text, size_t content_len, ...)
{
    json_t *calls = NULL;
    size_t clen = 12345;
    assert_int_equal(fy_tools_parse(fmt, text, strlen(text), &calls, &clen), FY_OK);
    va_list ap;
    va_start(ap, content_len);
    size_t k = 0;
    for (const char *name; (name = va_arg(ap, const char *)); k++) {
        const char *args = va_arg(ap, const char *);
        json_t *c = json_array_get(calls, k);
        assert_non_null(c);
        const char *id = json_string_value(json_object_get(c, "id"));
        assert_non_null(id);
        assert_true(!strncmp(id, "call_", 5) && strlen(id) == 29);
        assert_string_equal(json_string_value(json_object_get(c, "type")), "function");
        json_t *fn = json_object_get(c, "function");
        assert_string_equal(json_string_value(json_object_get(fn, "name")), name);
        assert_string_equal(json_string_value(json_object_get(fn, "arguments")), args);
    }
    va_end(ap);
    if (json_array_size(calls) != k) print_message("%s: %zu calls\n", text, json_array_size(calls));
    assert_int_equal(json_array_size(calls), k);
    assert_int_equal(clen, content_len);
    json_decref(calls);
}

static void test_parse_hermes(void **state)
{
    (void)state;
    const fy_tool_format_t H = FY_TOOL_FORMAT_HERMES;
    expect_calls(H, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", 0,
                 "get_weather", "{\"city\":\"Paris\"}", NULL);
    /* text before is content; two calls; arguments given as JSON text; order kept */
    const char *two =
        "Let me check.\n<tool_call>{\"name\": \"a\", \"arguments\": {\"z\": 1, \"y\": [true]}}</tool_call>\n"
        "<tool_call>{\"name\": \"b\", \"arguments\": \"{\\\"q\\\": null}\"}</tool_call>";
    expect_calls(H, two, 14, "a", "{\"z\":1,\"y\":[true]}", "b", "{\"q\":null}", NULL);
    /* SmolLM2's: an array in one block; "parameters" as Llama names them */
    expect_calls(
        H,
        "<tool_call>[{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", \"parameters\": {\"x\": 2}}]</tool_call>",
        0, "a", "{}", "b", "{\"x\":2}", NULL);
    /* no arguments: none; cut short of its close but whole JSON: still a call */
    expect_calls(H, "<tool_call>{\"name\": \"now\"}", 0, "now", "{}", NULL);
    /* malformed: no calls, all of it content */
    const char *bad[] = {
        "<tool_call>{\"name\": \"a\", \"arguments\": {\"x\": </tool_call>", /* broken JSON */
        "<tool_call>{\"arguments\": {}}</tool_call>",                       /* no name */
        "<tool_call>{\"name\": \"\", \"arguments\": {}}</tool_call>",       /* empty name */
        "<tool_call>{\"name\": 3}</tool_call>",                             /* name not a string */
        "<tool_call>{\"name\": \"a\", \"arguments\": [1]}</tool_call>",     /* arguments not an object */
        "<tool_call>{\"name\": \"a\", \"arguments\": \"{oops\"}</tool_call>",
        "<tool_call>\"just a string\"</tool_call>",
        "<tool_call>[]</tool_call>",                                            /* SmolLM2's "no call" */
        "<tool_call>{\"name\": \"a\"}</tool_call><tool_call>{bad}</tool_call>", /* one bad: none */
        "no call here at all",
        "<tool_call",
        "",
    };
    for (size_t i = 0; i < FY_ARRAY_LEN(bad); i++) expect_calls(H, bad[i], strlen(bad[i]), NULL);
    /* text between and after calls is not content (vLLM's hermes parser drops it too) */
    expect_calls(H, "<tool_call>{\"name\": \"a\"}</tool_call> and <tool_call>{\"name\": \"b\"}</tool_call> done", 0,
                 "a", "{}", "b", "{}", NULL);
    /* bytes that are not UTF-8 around a call: the call still parses */
    expect_calls(H, "\xff\xfe<tool_call>{\"name\": \"a\"}</tool_call>", 2, "a", "{}", NULL);
}

static void test_parse_llama3(void **state)
{
    (void)state;
    const fy_tool_format_t L = FY_TOOL_FORMAT_LLAMA3;
    expect_calls(L, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", 0, "get_weather",
                 "{\"city\":\"Paris\"}", NULL);
    expect_calls(L, " <|python_tag|>{\"name\": \"a\", \"parameters\": {}}", 0, "a", "{}", NULL);
    expect_calls(L, "{\"name\": \"a\", \"parameters\": {\"x\": 1}}; {\"name\": \"b\", \"arguments\": {}}\n", 0, "a",
                 "{\"x\":1}", "b", "{}", NULL);
    const char *bad[] = {
        "The weather is fine.",
        "Sure: {\"name\": \"a\", \"parameters\": {}}",
        "{\"name\": \"a\", \"parameters\": ",
        "{\"name\": \"a\"} trailing words",
        "{\"parameters\": {}}",
        "[{\"name\": \"a\"}]",
        "{}",
        "   ",
    };
    for (size_t i = 0; i < FY_ARRAY_LEN(bad); i++) expect_calls(L, bad[i], strlen(bad[i]), NULL);
}

static void test_parse_forced(void **state)
{
    (void)state;
    json_t *calls = NULL;
    const char *args = "{\"city\": \"Paris\", \"days\": 3}";
    assert_int_equal(fy_tools_parse_forced(FY_TOOL_CHOICE_NAMED, "get_weather", args, strlen(args), &calls), FY_OK);
    assert_int_equal(json_array_size(calls), 1);
    json_t *fn = json_object_get(json_array_get(calls, 0), "function");
    assert_string_equal(json_string_value(json_object_get(fn, "name")), "get_weather");
    assert_string_equal(json_string_value(json_object_get(fn, "arguments")), "{\"city\":\"Paris\",\"days\":3}");
    json_decref(calls);
    const char *req = "[{\"name\": \"a\", \"parameters\": {\"x\": 1}}, {\"name\": \"b\", \"parameters\": {}}]";
    assert_int_equal(fy_tools_parse_forced(FY_TOOL_CHOICE_REQUIRED, NULL, req, strlen(req), &calls), FY_OK);
    assert_int_equal(json_array_size(calls), 2);
    json_decref(calls);
    /* what a grammar would not have let through (cut short by max_tokens, say): no calls */
    const char *bad[] = {"{\"city\": \"Par", "[]", "[{\"name\": \"a\", \"parameters\": 3}]", "nope", ""};
    for (size_t i = 0; i < FY_ARRAY_LEN(bad); i++) {
        assert_int_equal(fy_tools_parse_forced(i ? FY_TOOL_CHOICE_REQUIRED : FY_TOOL_CHOICE_NAMED, "f", bad[i],
                                               strlen(bad[i]), &calls),
                         FY_OK);
        assert_int_equal(json_array_size(calls), 0);
        json_decref(calls);
    }
}

static void test_content_prefix(void **state)
{
    (void)state;
    const fy_tool_format_t H = FY_TOOL_FORMAT_HERMES, L = FY_TOOL_FORMAT_LLAMA3;
    static const struct {
        fy_tool_format_t f;
        const char *text;
        size_t n;
    } cases[] = {
        {H, "Hello", 5},
        {H, "Hello <", 6},
        {H, "Hello <tool_c", 6},
        {H, "Hello <tool_call>{", 6},
        {H, "Hello <tx", 9},
        {H, "a<tool_call", 1},
        {H, "", 0},
        {H, "<", 0},
        {L, "", 0},
        {L, "  \n", 0},
        {L, " {\"name\"", 0},
        {L, "Hello", 5},
        {L, "<|python", 0},
        {L, "  Hi", 4},
    };
    for (size_t i = 0; i < FY_ARRAY_LEN(cases); i++) {
        size_t n = fy_tools_content_prefix(cases[i].f, cases[i].text, strlen(cases[i].text));
        if (n != cases[i].n) print_message("case %zu '%s': %zu\n", i, cases[i].text, n);
        assert_int_equal(n, cases[i].n);
    }
}

/* ---- the request ------------------------------------------------------------- */

#define WEATHER_TOOL                                                                                                   \
    "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather\", "                \
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": "        \
    "[\"city\"]}}}"
#define TIME_TOOL "{\"type\": \"function\", \"function\": {\"name\": \"now\"}}"

static fy_status_t tools_req(const char *body, fy_tools_req_t *t, const char **param_p)
{
    json_t *o = json_loads(body, 0, NULL);
    assert_non_null(o);
    char err[256];
    *param_p = NULL;
    fy_status_t st = fy_tools_request(o, t, param_p, err, sizeof(err));
    if (st) assert_true(strlen(err) > 0);
    json_decref(o);
    return st;
}

static void test_tools_request(void **state)
{
    (void)state;
    fy_tools_req_t t;
    const char *param;
    assert_int_equal(tools_req("{}", &t, &param), FY_OK);
    assert_int_equal(t.choice, FY_TOOL_CHOICE_NONE);
    assert_null(t.tools);
    assert_int_equal(tools_req("{\"tools\": [" WEATHER_TOOL "]}", &t, &param), FY_OK);
    assert_int_equal(t.choice, FY_TOOL_CHOICE_AUTO);
    assert_true(t.parallel);
    fy_tools_req_clear(&t);
    assert_int_equal(tools_req("{\"tools\": [" WEATHER_TOOL "], \"tool_choice\": \"none\"}", &t, &param), FY_OK);
    assert_int_equal(t.choice, FY_TOOL_CHOICE_NONE);
    fy_tools_req_clear(&t);
    assert_int_equal(tools_req("{\"tools\": [" WEATHER_TOOL
                               "], \"tool_choice\": \"required\", \"parallel_tool_calls\": false}",
                               &t, &param),
                     FY_OK);
    assert_int_equal(t.choice, FY_TOOL_CHOICE_REQUIRED);
    assert_false(t.parallel);
    fy_tools_req_clear(&t);
    assert_int_equal(tools_req("{\"tools\": [" WEATHER_TOOL ", " TIME_TOOL "], \"tool_choice\": {\"type\": "
                               "\"function\", \"function\": {\"name\": \"now\"}}}",
                               &t, &param),
                     FY_OK);
    assert_int_equal(t.choice, FY_TOOL_CHOICE_NAMED);
    assert_string_equal(t.named, "now");
    fy_tools_req_clear(&t);
    static const struct {
        const char *body, *param;
    } bad[] = {
        {"{\"tools\": {}}", "tools"},
        {"{\"tools\": [3]}", "tools"},
        {"{\"tools\": [{\"type\": \"code\", \"function\": {\"name\": \"a\"}}]}", "tools"},
        {"{\"tools\": [{\"type\": \"function\"}]}", "tools"},
        {"{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"has space\"}}]}", "tools"},
        {"{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"\"}}]}", "tools"},
        {"{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": "
         "\"a123456789012345678901234567890123456789012345678901234567890123456789\"}}]}",
         "tools"},
        {"{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a\", \"parameters\": []}}]}", "tools"},
        {"{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a\", \"description\": 1}}]}", "tools"},
        {"{\"tools\": [" TIME_TOOL ", " TIME_TOOL "]}", "tools"},
        {"{\"tool_choice\": \"required\"}", "tool_choice"},
        {"{\"tool_choice\": \"auto\"}", "tool_choice"},
        {"{\"tools\": [" TIME_TOOL "], \"tool_choice\": \"sometimes\"}", "tool_choice"},
        {"{\"tools\": [" TIME_TOOL "], \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"x\"}}}",
         "tool_choice"},
        {"{\"tools\": [" TIME_TOOL "], \"tool_choice\": {\"function\": {\"name\": \"now\"}}}", "tool_choice"},
        {"{\"tools\": [" TIME_TOOL "], \"parallel_tool_calls\": 1}", "parallel_tool_calls"},
    };
    for (size_t i = 0; i < FY_ARRAY_LEN(bad); i++) {
        if (tools_req(bad[i].body, &t, &param) != FY_ERR_INVALID) print_message("accepted: %s\n", bad[i].body);
        assert_null(t.tools);
        assert_non_null(param);
        assert_string_equal(param, bad[i].param);
    }
}

static json_t *schema_of(const char *body, fy_status_t want)
{
    fy_tools_req_t t;
    const char *param;
    assert_int_equal(tools_req(body, &t, &param), FY_OK);
    char *s = NULL, err[256];
    assert_int_equal(fy_tools_schema(&t, &s, err, sizeof(err)), want);
    fy_tools_req_clear(&t);
    if (want) return NULL;
    json_t *j = json_loads(s, 0, NULL);
    assert_non_null(j);
    fy_free(s);
    return j;
}

static void test_tools_schema(void **state)
{
    (void)state;
    json_t *s = schema_of("{\"tools\": [" WEATHER_TOOL ", " TIME_TOOL "], \"tool_choice\": \"required\"}", FY_OK);
    json_t *want = json_loads(
        "{\"type\": \"array\", \"minItems\": 1, \"items\": {\"anyOf\": ["
        "{\"type\": \"object\", \"properties\": {\"name\": {\"const\": \"get_weather\"}, \"parameters\": {\"type\": "
        "\"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}, \"required\": "
        "[\"name\", \"parameters\"]},"
        "{\"type\": \"object\", \"properties\": {\"name\": {\"const\": \"now\"}, \"parameters\": {\"type\": "
        "\"object\", \"properties\": {}}}, \"required\": [\"name\", \"parameters\"]}]}}",
        0, NULL);
    assert_true(json_equal(s, want));
    json_decref(want);
    json_decref(s);
    s = schema_of("{\"tools\": [" WEATHER_TOOL "], \"tool_choice\": \"required\", \"parallel_tool_calls\": false}",
                  FY_OK);
    assert_int_equal(json_integer_value(json_object_get(s, "maxItems")), 1);
    json_decref(s);
    s = schema_of("{\"tools\": [" TIME_TOOL ", " WEATHER_TOOL "], \"tool_choice\": {\"type\": \"function\", "
                  "\"function\": {\"name\": \"get_weather\"}}}",
                  FY_OK);
    assert_string_equal(json_string_value(json_object_get(s, "type")), "object");
    assert_non_null(json_object_get(json_object_get(s, "properties"), "city"));
    json_decref(s);
    /* $defs move to the root, where "#/$defs/..." points once nested; a clash is refused */
    const char *defs_tool = "{\"type\": \"function\", \"function\": {\"name\": \"d%d\", \"parameters\": {\"type\": "
                            "\"object\", \"properties\": {\"p\": {\"$ref\": \"#/$defs/P\"}}, \"$defs\": {\"P\": "
                            "{\"type\": \"%s\"}}}}}";
    char body[1024], t1[300], t2[300];
    snprintf(t1, sizeof(t1), defs_tool, 1, "string");
    snprintf(t2, sizeof(t2), defs_tool, 2, "string");
    snprintf(body, sizeof(body), "{\"tools\": [%s, %s], \"tool_choice\": \"required\"}", t1, t2);
    s = schema_of(body, FY_OK);
    assert_string_equal(json_string_value(json_object_get(json_object_get(json_object_get(s, "$defs"), "P"), "type")),
                        "string");
    json_t *p0 = json_object_get(
        json_object_get(json_array_get(json_object_get(json_object_get(s, "items"), "anyOf"), 0), "properties"),
        "parameters");
    assert_null(json_object_get(p0, "$defs"));
    json_decref(s);
    snprintf(t2, sizeof(t2), defs_tool, 2, "integer");
    snprintf(body, sizeof(body), "{\"tools\": [%s, %s], \"tool_choice\": \"required\"}", t1, t2);
    schema_of(body, FY_ERR_INVALID);
}

/* ---- request bodies with the default model ------------------------------------------- */

static fy_model_t *M;
static fy_http_front_t F;
static char MODEL_ID[64];

static int setup_model(void **state)
{
    (void)state;
    const char *path = fy_test_default_model();
    if (path && fy_model_load(path, &M) == FY_OK) {
        fy_model_id(M, MODEL_ID, sizeof(MODEL_ID));
        F = (fy_http_front_t){.model = M,
                              .model_id = MODEL_ID,
                              .served = "smol",
                              .max_ctx = fy_model_config(M)->max_ctx,
                              .default_max_tokens = 64};
    }
    return 0;
}

static int teardown_model(void **state)
{
    (void)state;
    fy_model_destroy(M);
    return 0;
}

/* Parses body (chat or not); on FY_OK *g is filled (free g->ids). */
static fy_status_t parse(const char *body, bool chat, fy_http_gen_t *g, fy_http_fault_t *f)
{
    fy_status_t st = fy_http_parse_generation(&F, body, strlen(body), chat, g, f);
    if (st == FY_ERR_INVALID) assert_true(f->status == 400 && strlen(f->msg) > 0);
    return st;
}

static void expect_grammar(const char *body, bool chat, fy_gen_grammar_t kind, const char *grammar)
{
    fy_http_gen_t *g = fy_calloc(1, sizeof(*g));
    fy_http_fault_t f;
    fy_status_t st = parse(body, chat, g, &f);
    if (st) print_message("%s: %s\n", body, f.msg);
    assert_int_equal(st, FY_OK);
    assert_int_equal(g->gen.grammar_kind, kind);
    if (grammar) {
        assert_string_equal(g->gen.grammar, grammar);
        assert_int_equal(g->gen.grammar_len, (int32_t)strlen(grammar));
    }
    fy_free(g->ids);
    fy_free(g);
}

static void expect_refused(const char *body, bool chat, const char *param)
{
    fy_http_gen_t *g = fy_calloc(1, sizeof(*g));
    fy_http_fault_t f;
    fy_status_t st = parse(body, chat, g, &f);
    if (st != FY_ERR_INVALID) print_message("accepted: %s\n", body);
    assert_int_equal(st, FY_ERR_INVALID);
    if (!f.param || strcmp(f.param, param)) print_message("%s: param %s (%s)\n", body, f.param, f.msg);
    assert_non_null(f.param);
    assert_string_equal(f.param, param);
    fy_free(g);
}

#define CHAT(extra) "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"}]" extra "}"
#define COMPL(extra) "{\"prompt\": \"The sky\"" extra "}"

static void test_structured_outputs(void **state)
{
    (void)state;
    if (!M) skip();
    expect_grammar(CHAT(""), true, FY_GEN_GRAMMAR_NONE, NULL);
    expect_grammar(CHAT(", \"response_format\": {\"type\": \"text\"}"), true, FY_GEN_GRAMMAR_NONE, NULL);
    expect_grammar(CHAT(", \"response_format\": {\"type\": \"json_object\"}"), true, FY_GEN_GRAMMAR_JSON_OBJECT, "");
    /* the schema compact, its members in the order given (not sorted) */
    expect_grammar(CHAT(", \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"w\", "
                        "\"strict\": true, \"schema\": {\"type\": \"object\", \"properties\": {\"zeta\": {\"type\": "
                        "\"string\"}, \"alpha\": {\"type\": \"integer\"}}, \"required\": [\"zeta\", \"alpha\"]}}}"),
                   true, FY_GEN_GRAMMAR_JSON_SCHEMA,
                   "{\"type\":\"object\",\"properties\":{\"zeta\":{\"type\":\"string\"},\"alpha\":{\"type\":"
                   "\"integer\"}},\"required\":[\"zeta\",\"alpha\"]}");
    expect_grammar(COMPL(", \"response_format\": {\"type\": \"json_object\"}"), false, FY_GEN_GRAMMAR_JSON_OBJECT, "");
    expect_grammar(COMPL(", \"guided_json\": {\"type\": \"integer\"}"), false, FY_GEN_GRAMMAR_JSON_SCHEMA,
                   "{\"type\":\"integer\"}");
    expect_grammar(COMPL(", \"guided_json\": \"{\\\"type\\\": \\\"boolean\\\"}\""), false, FY_GEN_GRAMMAR_JSON_SCHEMA,
                   "{\"type\":\"boolean\"}");
    expect_grammar(COMPL(", \"guided_regex\": \"[0-9]{3}\""), false, FY_GEN_GRAMMAR_REGEX, "[0-9]{3}");
    expect_grammar(CHAT(", \"guided_choice\": [\"yes\", \"no\"]"), true, FY_GEN_GRAMMAR_CHOICE, "[\"yes\",\"no\"]");
    expect_grammar(CHAT(", \"structured_outputs\": {\"choice\": [\"a\"]}"), true, FY_GEN_GRAMMAR_CHOICE, "[\"a\"]");
    expect_grammar(CHAT(", \"structured_outputs\": {\"regex\": \"a+\"}"), true, FY_GEN_GRAMMAR_REGEX, "a+");
    expect_grammar(CHAT(", \"structured_outputs\": {\"json\": {\"type\": \"null\"}}"), true, FY_GEN_GRAMMAR_JSON_SCHEMA,
                   "{\"type\":\"null\"}");
    expect_refused(CHAT(", \"response_format\": \"json\""), true, "response_format");
    expect_refused(CHAT(", \"response_format\": {\"type\": \"yaml\"}"), true, "response_format");
    expect_refused(CHAT(", \"response_format\": {\"type\": \"json_schema\"}"), true, "response_format");
    expect_refused(CHAT(", \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"x\"}}"), true,
                   "response_format");
    expect_refused(CHAT(", \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"schema\": {}, "
                        "\"strict\": \"yes\"}}"),
                   true, "response_format");
    expect_refused(COMPL(", \"guided_json\": \"not json\""), false, "guided_json");
    expect_refused(COMPL(", \"guided_json\": [1]"), false, "guided_json");
    expect_refused(COMPL(", \"guided_regex\": \"\""), false, "guided_regex");
    expect_refused(COMPL(", \"guided_regex\": 5"), false, "guided_regex");
    expect_refused(COMPL(", \"guided_choice\": []"), false, "guided_choice");
    expect_refused(COMPL(", \"guided_choice\": [\"a\", 1]"), false, "guided_choice");
    expect_refused(COMPL(", \"guided_grammar\": \"root ::= x\""), false, "guided_grammar");
    expect_refused(COMPL(", \"structured_outputs\": {\"grammar\": \"root ::= x\"}"), false, "structured_outputs");
    /* two at once */
    expect_refused(COMPL(", \"response_format\": {\"type\": \"json_object\"}, \"guided_regex\": \"a\""), false,
                   "guided_regex");
    expect_refused(COMPL(", \"guided_json\": {}, \"guided_choice\": [\"a\"]"), false, "guided_choice");
    /* over 32 KiB as compact JSON */
    size_t big = FY_GEN_MAX_GRAMMAR + 100;
    char *body = fy_malloc(big + 200);
    int n = snprintf(body, 200, "{\"prompt\": \"x\", \"guided_json\": {\"description\": \"");
    memset(body + n, 'a', big);
    strcpy(body + n + big, "\"}}");
    expect_refused(body, false, "guided_json");
    fy_free(body);
}

static void test_tool_requests(void **state)
{
    (void)state;
    if (!M) skip();
    expect_grammar(CHAT(", \"tools\": [" WEATHER_TOOL "]"), true, FY_GEN_GRAMMAR_NONE, NULL);
    expect_grammar(CHAT(", \"tools\": [" WEATHER_TOOL "], \"tool_choice\": {\"type\": \"function\", \"function\": "
                        "{\"name\": \"get_weather\"}}"),
                   true, FY_GEN_GRAMMAR_JSON_SCHEMA,
                   "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}");
    fy_http_gen_t *g = fy_calloc(1, sizeof(*g));
    fy_http_fault_t f;
    assert_int_equal(parse(CHAT(", \"tools\": [" WEATHER_TOOL "], \"tool_choice\": \"required\""), true, g, &f), FY_OK);
    assert_int_equal(g->gen.grammar_kind, FY_GEN_GRAMMAR_JSON_SCHEMA);
    assert_int_equal(g->tool_choice, FY_TOOL_CHOICE_REQUIRED);
    json_t *s = json_loads(g->gen.grammar, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(s, "type")), "array");
    json_decref(s);
    fy_free(g->ids);
    /* SmolLM2's template has no tool syntax: its tool prompt is in the system message */
    assert_int_equal(parse(CHAT(", \"tools\": [" WEATHER_TOOL "]"), true, g, &f), FY_OK);
    assert_int_equal(g->tool_choice, FY_TOOL_CHOICE_AUTO);
    assert_int_equal(g->tool_format, FY_TOOL_FORMAT_HERMES);
    const fy_tokenizer_t *tok = fy_model_tokenizer(M);
    size_t cap = (size_t)g->n_prompt * 64 + 1;
    char *text = fy_malloc(cap);
    fy_tokenizer_decode(tok, g->ids, (size_t)g->n_prompt, true, text, cap);
    assert_non_null(strstr(text, "<|im_start|>system\nYou are an expert in composing functions."));
    assert_non_null(strstr(text, "<tools>[{\"name\": \"get_weather\", \"description\": \"Weather\""));
    assert_non_null(strstr(text, "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n"));
    fy_free(g->ids);
    /* a conversation with a call and its result: the call as <tool_call>[...], the result a user turn */
    const char *conv =
        "{\"tools\": [" WEATHER_TOOL "], \"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, "
        "{\"role\": \"user\", \"content\": \"Paris?\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": "
        "[{\"id\": \"call_1\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": "
        "\"{\\\"city\\\": \\\"Paris\\\"}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": \"call_1\", \"content\": "
        "\"21 C\"}, {\"role\": \"tool\", \"tool_call_id\": \"call_1\", \"content\": \"sunny\"}]}";
    assert_int_equal(parse(conv, true, g, &f), FY_OK);
    fy_tokenizer_decode(tok, g->ids, (size_t)g->n_prompt, true, text, cap);
    fy_free(text);
    cap = (size_t)g->n_prompt * 64 + 1;
    text = fy_malloc(cap);
    fy_tokenizer_decode(tok, g->ids, (size_t)g->n_prompt, true, text, cap);
    assert_non_null(strstr(text, "]</tool_call>\n\nBe brief.<|im_end|>"));
    assert_non_null(strstr(text, "<|im_start|>assistant\n<tool_call>[{\"name\": \"get_weather\", \"arguments\": "
                                 "{\"city\": \"Paris\"}}]</tool_call><|im_end|>"));
    assert_non_null(strstr(text, "<|im_start|>user\n<tool_response>\n21 C\n</tool_response>\n<tool_response>\nsunny\n"
                                 "</tool_response><|im_end|>\n<|im_start|>assistant\n"));
    fy_free(text);
    fy_free(g->ids);
    fy_free(g);
    /* what is refused, and the field named */
    expect_refused(COMPL(", \"tools\": [" WEATHER_TOOL "]"), false, "tools");
    expect_refused(CHAT(", \"tools\": [" WEATHER_TOOL "], \"tool_choice\": \"required\", \"response_format\": "
                        "{\"type\": \"json_object\"}"),
                   true, "tool_choice");
    expect_refused(CHAT(", \"tools\": [" WEATHER_TOOL "], \"tool_choice\": {\"type\": \"function\", \"function\": "
                        "{\"name\": \"get_weather\"}}, \"guided_regex\": \"x\""),
                   true, "tool_choice");
    expect_refused(CHAT(", \"tool_choice\": \"required\""), true, "tool_choice");
    expect_refused(CHAT(", \"functions\": [{\"name\": \"a\"}]"), true, "functions");
    static const char *const bad_msgs[] = {
        "[{\"role\": \"tool\", \"content\": \"x\"}]",                      /* no tool_call_id */
        "[{\"role\": \"tool\", \"tool_call_id\": 3, \"content\": \"x\"}]", /* not a string */
        "[{\"role\": \"tool\", \"tool_call_id\": \"c\"}]",                 /* no content */
        "[{\"role\": \"user\", \"content\": \"x\", \"tool_calls\": []}]",  /* calls on a user */
        "[{\"role\": \"assistant\", \"content\": null}]",                  /* nothing at all */
        "[{\"role\": \"assistant\", \"tool_calls\": []}]",                 /* empty calls */
        "[{\"role\": \"assistant\", \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"a\", "
        "\"arguments\": \"{}\"}}]}]", /* no id */
        "[{\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"c\", \"type\": \"code\", \"function\": {\"name\": "
        "\"a\", \"arguments\": \"{}\"}}]}]",
        "[{\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"c\", \"type\": \"function\", \"function\": {\"name\": "
        "\"a\", \"arguments\": \"{not json\"}}]}]",
        "[{\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"c\", \"type\": \"function\", \"function\": {\"name\": "
        "\"a\", \"arguments\": {\"x\": 1}}}]}]", /* arguments must be JSON text */
        "[{\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"c\", \"type\": \"function\", \"function\": {"
        "\"arguments\": \"{}\"}}]}]",
        "[{\"role\": \"function\", \"content\": \"x\"}]",
    };
    for (size_t i = 0; i < FY_ARRAY_LEN(bad_msgs); i++) {
        char body[1024];
        snprintf(body, sizeof(body), "{\"messages\": %s}", bad_msgs[i]);
        expect_refused(body, true, "messages");
    }
}

int main(void)
{
    if (sodium_init() < 0) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_hermes),       cmocka_unit_test(test_parse_llama3),
        cmocka_unit_test(test_parse_forced),       cmocka_unit_test(test_content_prefix),
        cmocka_unit_test(test_tools_request),      cmocka_unit_test(test_tools_schema),
        cmocka_unit_test(test_structured_outputs), cmocka_unit_test(test_tool_requests),
    };
    return cmocka_run_group_tests(tests, setup_model, teardown_model);
}

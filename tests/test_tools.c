/*
 * test_tools.c - tool calls and structured outputs at the HTTP door:
 * the model's output parsed into tool calls (Hermes <tool_call> blocks,
 * SmolLM2's arrays, Llama 3 JSON, Mistral's [TOOL_CALLS]; good,
 * malformed, cut short, several calls, unknown names, one call only,
 * text around), what a growing text may stream as content, the text fed
 * in random pieces giving what it gives whole (content and each call's
 * deltas), the request's tools and tool_choice checked, the JSON Schema
 * that enforces "required" and a named function, and request bodies
 * through router/http_parse.c with the default model: the genspec's
 * grammar for response_format, guided_* and tool_choice, the 400s naming
 * their field, and SmolLM2's tool prompt in the rendered prompt.  Then a
 * tiny model the test writes, with a Hermes-style template that renders
 * tools, calls and results, served by a cluster: the tools in the
 * rendered prompt (/tokenize), required (one call only) and named
 * choices forcing calls whose arguments hold to their schema, auto, and
 * every answer the same whole and streamed (deltas joined as a client
 * joins them).  (tests/test_chat.c renders tools through Qwen's and
 * Llama 3's own templates; tests/test_http.c runs tool calls through a
 * cluster of the default model.)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>
#include <sodium.h>

#include "tests/cluster_util.h"
#include "tests/gguf_writer.h"
#include "router/http_parse.h"
#include "common/mem.h"
#include "model/model.h"
#include "tests/testutil.h"
#include "tests/tinymodel.h"
#include "model/tokenizer.h"
#include "router/tools.h"

/* ---- output parsing ------------------------------------------------------ */

/* Parses text (names: the known tools, NULL: any) and checks the calls'
 * names and arguments ("name" "args" pairs, NULL-terminated) and the
 * content's length. */
static void expect_calls_in(fy_tool_format_t fmt, const char *names, bool parallel, const char *text,
                            size_t content_len, va_list ap)
{
    json_t *calls = NULL;
    size_t clen = 12345;
    assert_int_equal(fy_tools_parse(fmt, names, parallel, text, strlen(text), &calls, &clen), FY_OK);
    size_t k = 0;
    for (const char *name; (name = va_arg(ap, const char *)); k++) {
        const char *args = va_arg(ap, const char *);
        json_t *c = json_array_get(calls, k);
        assert_non_null(c);
        const char *id = json_string_value(json_object_get(c, "id"));
        assert_non_null(id);
        if (fmt == FY_TOOL_FORMAT_MISTRAL) /* Mistral's templates want 9 letters and digits */
            assert_true(strlen(id) == 9 &&
                        strspn(id, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") == 9);
        else
            assert_true(!strncmp(id, "call_", 5) && strlen(id) == 29);
        assert_string_equal(json_string_value(json_object_get(c, "type")), "function");
        json_t *fn = json_object_get(c, "function");
        assert_string_equal(json_string_value(json_object_get(fn, "name")), name);
        assert_string_equal(json_string_value(json_object_get(fn, "arguments")), args);
    }
    if (json_array_size(calls) != k) print_message("%s: %zu calls\n", text, json_array_size(calls));
    assert_int_equal(json_array_size(calls), k);
    if (clen != content_len) print_message("%s: content %zu\n", text, clen);
    assert_int_equal(clen, content_len);
    json_decref(calls);
}

static void expect_calls(fy_tool_format_t fmt, const char *text, size_t content_len, ...)
{
    va_list ap;
    va_start(ap, content_len);
    expect_calls_in(fmt, NULL, true, text, content_len, ap);
    va_end(ap);
}

static void expect_calls_of(fy_tool_format_t fmt, const char *names, bool parallel, const char *text,
                            size_t content_len, ...)
{
    va_list ap;
    va_start(ap, content_len);
    expect_calls_in(fmt, names, parallel, text, content_len, ap);
    va_end(ap);
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
    expect_calls(H, two, 13, "a", "{\"z\":1,\"y\":[true]}", "b", "{\"q\":null}", NULL);
    /* SmolLM2's: an array in one block; "parameters" as Llama names them */
    expect_calls(
        H,
        "<tool_call>[{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", \"parameters\": {\"x\": 2}}]</tool_call>",
        0, "a", "{}", "b", "{\"x\":2}", NULL);
    /* no arguments: none; cut short of its close but whole JSON: still a call */
    expect_calls(H, "<tool_call>{\"name\": \"now\"}", 0, "now", "{}", NULL);
    /* malformed: no calls, all of it content */
    const char *bad[] = {
        "<tool_call>{\"arguments\": {}}</tool_call>",                   /* no name */
        "<tool_call>{\"name\": \"\", \"arguments\": {}}</tool_call>",   /* empty name */
        "<tool_call>{\"name\": 3}</tool_call>",                         /* name not a string */
        "<tool_call>{\"name\": \"a\", \"arguments\": [1]}</tool_call>", /* arguments not an object */
        "<tool_call>{\"name\": \"a\", \"arguments\": \"{oops\"}</tool_call>",
        "<tool_call>\"just a string\"</tool_call>",
        "<tool_call>[]</tool_call>", /* SmolLM2's "no call" */
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
    /* a call goes out once its arguments begin: broken after that, it keeps what it had (as a
     * call cut by max_tokens does); a bad block after a good one is dropped */
    expect_calls(H, "<tool_call>{\"name\": \"a\", \"arguments\": {\"x\": </tool_call>", 0, "a", "{\"x\":", NULL);
    expect_calls(H, "<tool_call>{\"name\": \"a\"}</tool_call><tool_call>{bad}</tool_call>", 0, "a", "{}", NULL);
    /* a bad block before any call is content, and the text goes on being read */
    expect_calls(H, "<tool_call>{bad}</tool_call> <tool_call>{\"name\": \"b\"}</tool_call>", 28, "b", "{}", NULL);
    /* arguments before the name, arguments as JSON text, members the parser does not know */
    expect_calls(H, "<tool_call>{\"arguments\": {\"a\": [1, 2.5e3, -0, null]}, \"id\": 7, \"name\": \"f\"}</tool_call>",
                 0, "f", "{\"a\":[1,2.5e3,-0,null]}", NULL);
    expect_calls(H, "<tool_call>{\"arguments\": \"{\\\"q\\\": 1}\", \"name\": \"f\"}</tool_call>", 0, "f", "{\"q\":1}",
                 NULL);
    /* strings keep their bytes and escapes; markers inside them are text */
    expect_calls(
        H, "<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"a b\\n\\u00e9 </tool_call> \xc3\xa9\"}}</tool_call>",
        0, "f", "{\"s\":\"a b\\n\\u00e9 </tool_call> \xc3\xa9\"}", NULL);
    /* what jansson would refuse is not a call: a lone surrogate, a control byte, an integer past 64 bits */
    const char *refused[] = {
        "<tool_call>{\"name\": \"f\", \"id\": \"\\ud800\"}</tool_call>",
        "<tool_call>{\"name\": \"f\", \"id\": \"\x01\"}</tool_call>",
        "<tool_call>{\"name\": \"f\", \"id\": 123456789012345678901234}</tool_call>",
        "<tool_call>{\"name\": \"f\", \"id\": 1e999}</tool_call>",
        "<tool_call>{\"name\": \"f\", \"id\": \"\xc0\xaf\"}</tool_call>",
    };
    for (size_t i = 0; i < FY_ARRAY_LEN(refused); i++) expect_calls(H, refused[i], strlen(refused[i]), NULL);
}

/* vLLM's choice: a call of a function the request does not offer is not a call. */
static void test_parse_names(void **state)
{
    (void)state;
    const fy_tool_format_t H = FY_TOOL_FORMAT_HERMES;
    const char *names = "get_weather\0now\0";
    const char *unknown = "Sure.\n<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>";
    expect_calls_of(H, names, true, unknown, strlen(unknown), NULL);
    expect_calls_of(H, names, true, "<tool_call>{\"name\": \"now\"}</tool_call>", 0, "now", "{}", NULL);
    /* an unknown one after a call is dropped with the text between calls */
    expect_calls_of(H, names, true,
                    "<tool_call>{\"name\": \"now\"}</tool_call><tool_call>{\"name\": \"nope\"}</tool_call>", 0, "now",
                    "{}", NULL);
    /* in an array, one unknown name fails the rest */
    expect_calls_of(H, names, true, "<tool_call>[{\"name\": \"now\"}, {\"name\": \"x\"}]</tool_call>", 0, "now", "{}",
                    NULL);
    const char *bob = "{\"name\": \"Bob\", \"parameters\": {\"age\": 3}}";
    expect_calls_of(FY_TOOL_FORMAT_LLAMA3, names, true, bob, strlen(bob), NULL);
    /* parallel_tool_calls false: the first call only */
    const char *two = "<tool_call>{\"name\": \"now\"}</tool_call>\n<tool_call>{\"name\": \"get_weather\"}</tool_call>";
    expect_calls_of(H, names, false, two, 0, "now", "{}", NULL);
    expect_calls_of(H, names, true, two, 0, "now", "{}", "get_weather", "{}", NULL);
    expect_calls_of(H, names, false, "<tool_call>[{\"name\": \"now\"}, {\"name\": \"get_weather\"}]</tool_call>", 0,
                    "now", "{}", NULL);
    expect_calls_of(FY_TOOL_FORMAT_LLAMA3, names, false, "{\"name\": \"now\"}; {\"name\": \"now\"}", 0, "now", "{}",
                    NULL);
}

static void test_parse_mistral(void **state)
{
    (void)state;
    const fy_tool_format_t M = FY_TOOL_FORMAT_MISTRAL;
    expect_calls(M, "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]", 0,
                 "get_weather", "{\"city\":\"Paris\"}", NULL);
    /* the marker is a control token, often not in the text: a bare array opening the answer */
    expect_calls(M, " [{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", \"arguments\": {\"x\": 1}}]", 0, "a",
                 "{}", "b", "{\"x\":1}", NULL);
    expect_calls(M, "Let me look.[TOOL_CALLS][{\"name\": \"a\"}]", 12, "a", "{}", NULL);
    const char *bad[] = {"[1, 2]", "[TOOL_CALLS] nothing", "Sure: [{\"name\": \"a\"}]", "[]", "[TOOL", "[link](x)"};
    for (size_t i = 0; i < FY_ARRAY_LEN(bad); i++) expect_calls(M, bad[i], strlen(bad[i]), NULL);
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
        "{\"parameters\": {}}",
        "[{\"name\": \"a\"}]",
        "{}",
        "   ",
    };
    for (size_t i = 0; i < FY_ARRAY_LEN(bad); i++) expect_calls(L, bad[i], strlen(bad[i]), NULL);
    /* what follows a call that is not another is dropped */
    expect_calls(L, "{\"name\": \"a\"} trailing words", 0, "a", "{}", NULL);
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
    /* cut short by max_tokens: the call with the arguments it had (the finish reason says "length") */
    const char *cut = "{\"city\": \"Par";
    assert_int_equal(fy_tools_parse_forced(FY_TOOL_CHOICE_NAMED, "get_weather", cut, strlen(cut), &calls), FY_OK);
    assert_int_equal(json_array_size(calls), 1);
    fn = json_object_get(json_array_get(calls, 0), "function");
    assert_string_equal(json_string_value(json_object_get(fn, "arguments")), "{\"city\":\"Par");
    json_decref(calls);
    /* what a grammar would not have let through: no calls */
    const char *bad[] = {"", "[]", "[{\"name\": \"a\", \"parameters\": 3}]", "nope", ""};
    for (size_t i = 0; i < FY_ARRAY_LEN(bad); i++) {
        assert_int_equal(fy_tools_parse_forced(i ? FY_TOOL_CHOICE_REQUIRED : FY_TOOL_CHOICE_NAMED, "f", bad[i],
                                               strlen(bad[i]), &calls),
                         FY_OK);
        assert_int_equal(json_array_size(calls), 0);
        json_decref(calls);
    }
}

/* What a growing text may stream as content. */
static void test_content_prefix(void **state)
{
    (void)state;
    const fy_tool_format_t H = FY_TOOL_FORMAT_HERMES, L = FY_TOOL_FORMAT_LLAMA3, M = FY_TOOL_FORMAT_MISTRAL;
    static const struct {
        fy_tool_format_t f;
        const char *text;
        size_t n;
    } cases[] = {
        {H, "Hello", 5},
        {H, "Hello <", 5}, /* (white space before a call is not content: held too) */
        {H, "Hello <tool_c", 5},
        {H, "Hello <tool_call>{", 5},
        {H, "Hello <tx", 9},
        {H, "a<tool_call", 1},
        {H, "", 0},
        {H, "<", 0},
        {H, "<tool_call>{\"name\": 1", 21}, /* not a call after all: content */
        {L, "", 0},
        {L, "  \n", 0},
        {L, " {\"name\"", 0},
        {L, "Hello", 5},
        {L, "<|python", 0},
        {L, "  Hi", 4},
        {M, "[", 0},
        {M, " [{", 0},
        {M, "[TOOL_CA", 0},
        {M, "[1", 2},
        {M, "Hi [TOOL_CALLS]", 2},
    };
    for (size_t i = 0; i < FY_ARRAY_LEN(cases); i++) {
        fy_tools_stream_t *s;
        assert_int_equal(fy_tools_stream_create(FY_TOOL_CHOICE_AUTO, cases[i].f, NULL, NULL, true, &s), FY_OK);
        assert_int_equal(fy_tools_stream_feed(s, cases[i].text, strlen(cases[i].text), false), FY_OK);
        size_t n = fy_tools_stream_content(s, cases[i].text);
        if (n != cases[i].n) print_message("case %zu '%s': %zu\n", i, cases[i].text, n);
        assert_int_equal(n, cases[i].n);
        fy_tools_stream_destroy(s);
    }
}

/* The text fed in random pieces gives what it gives whole: the content
 * streamed never shrinks nor passes the final content, and each call's
 * deltas (a first with id, type, name and "" arguments, then fragments)
 * join into the whole parse's calls. */
static void check_split(fy_tool_choice_t choice, fy_tool_format_t fmt, const char *names, const char *text,
                        unsigned seed)
{
    size_t len = strlen(text), clen = 0;
    json_t *whole = NULL;
    if (choice == FY_TOOL_CHOICE_AUTO)
        assert_int_equal(fy_tools_parse(fmt, names, true, text, len, &whole, &clen), FY_OK);
    else
        assert_int_equal(fy_tools_parse_forced(choice, names, text, len, &whole), FY_OK);
    for (int round = 0; round < 20; round++) {
        fy_tools_stream_t *s;
        assert_int_equal(
            fy_tools_stream_create(choice, fmt, names, choice == FY_TOOL_CHOICE_AUTO ? names : NULL, true, &s), FY_OK);
        json_t *got = json_array();
        size_t at = 0, shown = 0;
        while (at < len) {
            at += 1 + (size_t)(rand_r(&seed) % (round < 10 ? 3 : 17));
            if (at > len) at = len;
            assert_int_equal(fy_tools_stream_feed(s, text, at, false), FY_OK);
            size_t c = fy_tools_stream_content(s, text);
            assert_true(c >= shown && c <= at);
            shown = c;
            json_t *d = fy_tools_stream_deltas(s);
            size_t k;
            json_t *e;
            json_array_foreach(d, k, e)
            {
                size_t idx = (size_t)json_integer_value(json_object_get(e, "index"));
                json_t *fn = json_object_get(e, "function");
                if (json_object_get(e, "id")) { /* a call's first delta */
                    assert_int_equal(idx, json_array_size(got));
                    assert_string_equal(json_string_value(json_object_get(e, "type")), "function");
                    assert_string_equal(json_string_value(json_object_get(fn, "arguments")), "");
                    json_array_append_new(got, json_pack("{s:O, s:O, s:s}", "id", json_object_get(e, "id"), "name",
                                                         json_object_get(fn, "name"), "arguments", ""));
                    continue;
                }
                json_t *g = json_array_get(got, idx);
                assert_non_null(g);
                assert_null(json_object_get(fn, "name"));
                char *joined = NULL;
                assert_true(asprintf(&joined, "%s%s", json_string_value(json_object_get(g, "arguments")),
                                     json_string_value(json_object_get(fn, "arguments"))) > 0);
                json_object_set_new(g, "arguments", json_string(joined));
                free(joined);
            }
            json_decref(d);
        }
        assert_int_equal(fy_tools_stream_feed(s, text, len, true), FY_OK);
        size_t c = fy_tools_stream_content(s, text);
        assert_true(c >= shown);
        if (choice == FY_TOOL_CHOICE_AUTO) assert_int_equal(c, clen);
        json_t *d = fy_tools_stream_deltas(s);
        assert_int_equal(json_array_size(d), 0); /* (the end adds no call: it was read as it came) */
        json_decref(d);
        assert_int_equal(json_array_size(got), json_array_size(whole));
        for (size_t k = 0; k < json_array_size(whole); k++) {
            json_t *w = json_object_get(json_array_get(whole, k), "function"), *g = json_array_get(got, k);
            assert_string_equal(json_string_value(json_object_get(g, "name")),
                                json_string_value(json_object_get(w, "name")));
            assert_string_equal(json_string_value(json_object_get(g, "arguments")),
                                json_string_value(json_object_get(w, "arguments")));
        }
        json_decref(got);
        fy_tools_stream_destroy(s);
    }
    json_decref(whole);
}

static void test_stream_split(void **state)
{
    (void)state;
    unsigned seed = 17;
    print_message("seed %u\n", seed);
    const fy_tool_format_t H = FY_TOOL_FORMAT_HERMES, L = FY_TOOL_FORMAT_LLAMA3, M = FY_TOOL_FORMAT_MISTRAL;
    static const struct {
        fy_tool_choice_t c;
        fy_tool_format_t f;
        const char *names, *text;
    } cases[] = {
        {FY_TOOL_CHOICE_AUTO, H, NULL,
         "I will check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": "
         "[1, 2.5, -3e2], \"x\": {\"y\": null, \"z\": \"a \\\"q\\\" "
         "</tool_call>\"}}}\n</tool_call>\n<tool_call>{\"name\": "
         "\"now\"}</tool_call>"},
        {FY_TOOL_CHOICE_AUTO, H, NULL,
         "<tool_call>[{\"name\": \"a\", \"arguments\": {\"k\": 10}}, {\"arguments\": "
         "\"{\\\"u\\\": true}\", \"name\": \"b\"}]</tool_call>"},
        {FY_TOOL_CHOICE_AUTO, H, "now\0",
         "<tool_call>{bad}</tool_call> <tool_call>{\"name\": \"zz\"}</tool_call>"
         "<tool_call>{\"name\": \"now\", \"arguments\": {\"n\": 12345"},
        {FY_TOOL_CHOICE_AUTO, H, NULL, "Just text, with a < and a <tool and <tool_cal."},
        {FY_TOOL_CHOICE_AUTO, L, NULL, "  {\"name\": \"a\", \"parameters\": {\"v\": 0.5}} ; {\"name\": \"b\"}"},
        {FY_TOOL_CHOICE_AUTO, L, NULL, "{\"name\": \"a\", \"parameters\": 5}"},
        {FY_TOOL_CHOICE_AUTO, M, NULL,
         "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"s\": \"\\u00e9\\ud83d\\ude00\"}}]"},
        {FY_TOOL_CHOICE_AUTO, M, NULL, "[not a call] then [TOOL_CALLS][{\"name\": \"b\"}]"},
        {FY_TOOL_CHOICE_REQUIRED, H, NULL, "[{\"name\": \"a\", \"parameters\": {\"q\": [true, false]}}]"},
        {FY_TOOL_CHOICE_NAMED, H, "f", "{\"city\": \"Paris\", \"n\": -0.25E+3}"},
        {FY_TOOL_CHOICE_NAMED, H, "f", "{\"city\": \"Par"},
        /* characters of several bytes split between pieces go out whole; one broken ends the call */
        {FY_TOOL_CHOICE_NAMED, H, "f", "{\"city\": \"Z\xc3\xbcrich \xf0\x9f\x98\x80\"}"},
        {FY_TOOL_CHOICE_NAMED, H, "f",
         "{\"city\": \"P\xdc"
         "aris\"}"},
    };
    for (size_t i = 0; i < FY_ARRAY_LEN(cases); i++)
        check_split(cases[i].c, cases[i].f, cases[i].names, cases[i].text, seed + (unsigned)i);
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
    fy_free(g->tool_names);
    g->tool_names = NULL;
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
    fy_free(g->tool_names);
    g->tool_names = NULL;
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
    fy_free(g->tool_names);
    g->tool_names = NULL;
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
    fy_free(g->tool_names);
    g->tool_names = NULL;
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

/* ---- a tiny model with a tool-aware template, served ----------------------- */

/* A Hermes/Qwen-style template: the tools as JSON in the system turn, an
 * assistant's calls as <tool_call> blocks, tool results as a user turn. */
static const char TINY_TEMPLATE[] =
    "{%- if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n{% endif %}"
    "# Tools\n<tools>{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}{{ '\\n' }}</tools>\n"
    "Call them as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n"
    "{% elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n{% endif %}"
    "{%- for message in messages %}"
    "{% if message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% elif message.role == 'assistant' %}<|im_start|>assistant\n"
    "{% for tc in message.tool_calls %}<tool_call>\n"
    "{\"name\": \"{{ tc.function.name }}\", \"arguments\": {{ tc.function.arguments | tojson }}}\n</tool_call>"
    "{% endfor %}<|im_end|>\n"
    "{% elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n"
    "</tool_response><|im_end|>\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/* Bounded arguments (an enum, an integer, nothing else), so that a
 * random model under the grammar ends well within max_tokens. */
#define TINY_TOOLS                                                                                                     \
    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather\", "    \
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"enum\": [\"Paris\", \"Rome\"]}, \"days\": "  \
    "{\"type\": \"integer\"}}, \"required\": [\"city\"], \"additionalProperties\": false}}}, "                         \
    "{\"type\": \"function\", \"function\": {\"name\": \"now\", \"parameters\": {\"type\": \"object\", "               \
    "\"properties\": {}, \"additionalProperties\": false}}}]"
#define TINY_USER "\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"}]"

static int g_port;

static tc_http_resp_t post(const char *path, const char *body)
{
    int fd = tc_http_dial(g_port, 60);
    assert_true(fd >= 0);
    tc_http_send(fd, "POST", path, NULL, "application/json", body, strlen(body));
    tc_http_resp_t r;
    tc_http_read(fd, &r);
    close(fd);
    if (r.status != 200) print_message("%s: %d %s\n", path, r.status, r.body ? r.body : "");
    assert_int_equal(r.status, 200);
    return r;
}

/* A call's arguments hold to get_weather's or now's schema. */
static void expect_valid_args(const char *name, const char *args)
{
    json_t *a = json_loads(args, 0, NULL);
    if (!json_is_object(a)) fail_msg("%s's arguments are not an object: %s", name, args);
    const char *k;
    json_t *v;
    json_object_foreach(a, k, v)
    {
        bool ok = !strcmp(name, "get_weather") &&
                  ((!strcmp(k, "city") && json_is_string(v) &&
                    (!strcmp(json_string_value(v), "Paris") || !strcmp(json_string_value(v), "Rome"))) ||
                   (!strcmp(k, "days") && json_is_integer(v)));
        if (!ok) fail_msg("%s's arguments break its schema: %s", name, args);
    }
    if (!strcmp(name, "get_weather") && !json_object_get(a, "city")) fail_msg("no city: %s", args);
    json_decref(a);
}

/* A stream's content and calls, joined as a client joins them, checking
 * the deltas' shape on the way: a call's first delta has its id, type
 * and name and "" arguments, then only arguments follow.  Returns the
 * finish reason; *arg_deltas_p counts the arguments' fragments. */
static const char *join_stream(const char *body, char *content, size_t cap, json_t *calls, int *arg_deltas_p)
{
    static char fin[32];
    fin[0] = content[0] = 0;
    *arg_deltas_p = 0;
    for (const char *d = strstr(body, "data: {"); d; d = strstr(d + 1, "data: {")) {
        json_t *c = json_loadb(d + 6, strcspn(d + 6, "\n"), 0, NULL);
        assert_non_null(c);
        json_t *ch = json_array_get(json_object_get(c, "choices"), 0), *delta = json_object_get(ch, "delta");
        const char *t = json_string_value(json_object_get(delta, "content"));
        if (t) strncat(content, t, cap - strlen(content) - 1);
        json_t *tc = json_object_get(delta, "tool_calls");
        for (size_t k = 0; k < json_array_size(tc); k++) {
            json_t *e = json_array_get(tc, k), *fn = json_object_get(e, "function");
            size_t idx = (size_t)json_integer_value(json_object_get(e, "index"));
            const char *more = json_string_value(json_object_get(fn, "arguments"));
            assert_non_null(more);
            if (json_object_get(e, "id")) {
                assert_int_equal(idx, json_array_size(calls));
                assert_true(!strncmp(json_string_value(json_object_get(e, "id")), "call_", 5));
                assert_string_equal(json_string_value(json_object_get(e, "type")), "function");
                assert_string_equal(more, "");
                json_array_append_new(calls,
                                      json_pack("{s:O, s:s}", "name", json_object_get(fn, "name"), "arguments", ""));
                continue;
            }
            json_t *g = json_array_get(calls, idx);
            assert_non_null(g);
            assert_null(json_object_get(fn, "name"));
            char joined[8192];
            snprintf(joined, sizeof(joined), "%s%s", json_string_value(json_object_get(g, "arguments")), more);
            json_object_set_new(g, "arguments", json_string(joined));
            (*arg_deltas_p)++;
        }
        const char *f = json_string_value(json_object_get(ch, "finish_reason"));
        if (f) snprintf(fin, sizeof(fin), "%s", f);
        json_decref(c);
    }
    assert_non_null(strstr(body, "data: [DONE]"));
    return fin;
}

/* body (without its closing brace) asked whole and streamed: the same
 * calls, content and finish reason; the whole answer returned. */
static json_t *ask_both(const char *body, bool forced)
{
    char b[4096];
    snprintf(b, sizeof(b), "%s}", body);
    tc_http_resp_t r = post("/v1/chat/completions", b);
    json_t *j = json_loads(r.body, 0, NULL);
    assert_non_null(j);
    tc_http_free(&r);
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0), *m = json_object_get(c0, "message");
    json_t *calls = json_object_get(m, "tool_calls");
    const char *fin = json_string_value(json_object_get(c0, "finish_reason"));
    if (forced) {
        if (json_array_size(calls) < 1) fail_msg("no tool call: %s", json_dumps(j, 0));
        assert_string_equal(fin, "tool_calls");
        assert_true(json_is_null(json_object_get(m, "content")));
    }
    for (size_t k = 0; k < json_array_size(calls); k++) {
        json_t *c = json_array_get(calls, k), *fn = json_object_get(c, "function");
        const char *id = json_string_value(json_object_get(c, "id"));
        assert_true(id && !strncmp(id, "call_", 5) && strlen(id) == 29);
        assert_string_equal(json_string_value(json_object_get(c, "type")), "function");
        if (forced || !strcmp(fin, "tool_calls"))
            expect_valid_args(json_string_value(json_object_get(fn, "name")),
                              json_string_value(json_object_get(fn, "arguments")));
    }
    snprintf(b, sizeof(b), "%s, \"stream\": true}", body);
    r = post("/v1/chat/completions", b);
    char content[8192];
    json_t *got = json_array();
    int arg_deltas;
    const char *sfin = join_stream(r.body, content, sizeof(content), got, &arg_deltas);
    tc_http_free(&r);
    assert_string_equal(sfin, fin);
    const char *wc = json_string_value(json_object_get(m, "content"));
    assert_string_equal(content, wc ? wc : "");
    assert_int_equal(json_array_size(got), json_array_size(calls));
    for (size_t k = 0; k < json_array_size(calls); k++) {
        json_t *w = json_object_get(json_array_get(calls, k), "function"), *g = json_array_get(got, k);
        assert_true(json_equal(json_object_get(w, "name"), json_object_get(g, "name")));
        assert_true(json_equal(json_object_get(w, "arguments"), json_object_get(g, "arguments")));
    }
    /* the arguments came as they were generated, not whole at the end */
    if (json_array_size(calls)) assert_true(arg_deltas >= 2);
    json_decref(got);
    return j;
}

/* The tokens of a /tokenize answer as text (the tiny model's tokens are
 * bytes, 256 and up the specials). */
static void tokenize_text(const char *body, char *out, size_t cap)
{
    tc_http_resp_t r = post("/tokenize", body);
    json_t *j = json_loads(r.body, 0, NULL);
    tc_http_free(&r);
    json_t *toks = json_object_get(j, "tokens");
    assert_true(json_array_size(toks) > 0);
    json_t *req = json_pack("{s:O}", "tokens", toks);
    char *req_body = json_dumps(req, 0);
    json_decref(req);
    r = post("/detokenize", req_body);
    free(req_body);
    json_t *d = json_loads(r.body, 0, NULL);
    snprintf(out, cap, "%s", json_string_value(json_object_get(d, "prompt")));
    json_decref(d);
    json_decref(j);
    tc_http_free(&r);
}

static void test_tiny_served(void **state)
{
    (void)state;
    if (!tc_bins_available()) skip();
    char path[512];
    snprintf(path, sizeof(path), "%s/tiny-tools.gguf", fy_test_tmpdir());
    fy_tiny_cfg_t cfg;
    fy_tiny_cfg_default(&cfg);
    cfg.max_ctx = 2048;
    cfg.chat_template = TINY_TEMPLATE;
    fy_tiny_model_t tm;
    fy_tiny_init(&tm, &cfg);
    assert_true(fy_tiny_write_gguf(&tm, path, GW_F32));
    fy_tiny_free(&tm);
    g_port = tc_free_port();
    char http[96], model[600];
    snprintf(http, sizeof(http), "router.http=http://127.0.0.1:%d", g_port);
    snprintf(model, sizeof(model), "model.path=%s", path);
    tc_opts_t o = {.n_prefill = 1, .n_decode = 1, .model = path, .common = {http, model}};
    tc_cluster_t c;
    tc_start(&c, &o);

    /* the tools reach the template, and a conversation with a call and its result renders */
    char text[16384];
    tokenize_text("{" TINY_USER ", " TINY_TOOLS "}", text, sizeof(text));
    assert_non_null(strstr(text, "<|im_start|>system\n# Tools\n<tools>\n{\"type\": \"function\", \"function\": "
                                 "{\"name\": \"get_weather\""));
    assert_non_null(strstr(text, "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n"));
    tokenize_text("{\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"}, {\"role\": \"assistant\", "
                  "\"content\": null, \"tool_calls\": [{\"id\": \"call_1\", \"type\": \"function\", \"function\": "
                  "{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}}]}, {\"role\": "
                  "\"tool\", \"tool_call_id\": \"call_1\", \"content\": \"21 C\"}], " TINY_TOOLS "}",
                  text, sizeof(text));
    assert_non_null(strstr(text, "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                                 "{\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n"));
    assert_non_null(strstr(text, "<|im_start|>user\n<tool_response>\n21 C\n</tool_response><|im_end|>\n"
                                 "<|im_start|>assistant\n"));

    /* required, one call only: the grammar forces a call that parses and holds to its schema */
    json_t *j = ask_both("{" TINY_USER ", " TINY_TOOLS ", \"tool_choice\": \"required\", \"parallel_tool_calls\": "
                         "false, \"max_tokens\": 600, \"temperature\": 0",
                         true);
    json_t *calls =
        json_object_get(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message"), "tool_calls");
    assert_int_equal(json_array_size(calls), 1);
    json_decref(j);
    /* sampled too, with its seed */
    j = ask_both("{" TINY_USER ", " TINY_TOOLS ", \"tool_choice\": \"required\", \"parallel_tool_calls\": false, "
                 "\"max_tokens\": 600, \"temperature\": 1, \"seed\": 5",
                 true);
    json_decref(j);
    /* a named function: its arguments */
    j = ask_both("{" TINY_USER ", " TINY_TOOLS ", \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": "
                 "\"get_weather\"}}, \"max_tokens\": 600, \"temperature\": 0",
                 true);
    calls = json_object_get(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message"), "tool_calls");
    assert_int_equal(json_array_size(calls), 1);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(json_array_get(calls, 0), "function"), "name")),
        "get_weather");
    json_decref(j);
    /* cut by max_tokens inside the arguments: the call as far as it went, finish_reason "length" */
    j = ask_both("{" TINY_USER ", " TINY_TOOLS ", \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": "
                 "\"get_weather\"}}, \"max_tokens\": 3, \"temperature\": 0",
                 false);
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(c0, "finish_reason")), "length");
    assert_int_equal(json_array_size(json_object_get(json_object_get(c0, "message"), "tool_calls")), 1);
    json_decref(j);
    /* two samples: each choice's calls are its own, from index 0 */
    tc_http_resp_t r = post("/v1/chat/completions",
                            "{" TINY_USER ", " TINY_TOOLS ", \"tool_choice\": \"required\", \"parallel_tool_calls\": "
                            "false, \"max_tokens\": 600, \"temperature\": 1, \"seed\": 9, \"n\": 2, \"stream\": true}");
    int heads[2] = {0, 0}, fins[2] = {0, 0};
    for (const char *d = strstr(r.body, "data: {"); d; d = strstr(d + 1, "data: {")) {
        json_t *ck = json_loadb(d + 6, strcspn(d + 6, "\n"), 0, NULL);
        json_t *ch = json_array_get(json_object_get(ck, "choices"), 0);
        json_int_t ci = json_integer_value(json_object_get(ch, "index"));
        assert_true(ci == 0 || ci == 1);
        json_t *tc = json_object_get(json_object_get(ch, "delta"), "tool_calls");
        for (size_t k = 0; k < json_array_size(tc); k++) {
            json_t *e = json_array_get(tc, k);
            assert_int_equal(json_integer_value(json_object_get(e, "index")), 0);
            if (json_object_get(e, "id")) heads[ci]++;
        }
        const char *f = json_string_value(json_object_get(ch, "finish_reason"));
        if (f) {
            assert_string_equal(f, "tool_calls");
            fins[ci]++;
        }
        json_decref(ck);
    }
    tc_http_free(&r);
    assert_true(heads[0] == 1 && heads[1] == 1 && fins[0] == 1 && fins[1] == 1);
    /* auto: whatever the random model says, whole and streamed agree */
    for (int q = 0; q < 2; q++) {
        char b[2048];
        snprintf(b, sizeof(b), "{" TINY_USER ", " TINY_TOOLS ", \"max_tokens\": 40, \"temperature\": %d, \"seed\": %d",
                 q, q);
        json_decref(ask_both(b, false));
    }
    /* the conversation goes on after the tool's result */
    j = ask_both("{\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"}, {\"role\": \"assistant\", "
                 "\"content\": null, \"tool_calls\": [{\"id\": \"call_1\", \"type\": \"function\", \"function\": "
                 "{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}}]}, {\"role\": "
                 "\"tool\", \"tool_call_id\": \"call_1\", \"content\": \"21 C\"}], " TINY_TOOLS
                 ", \"max_tokens\": 8, \"temperature\": 0",
                 false);
    json_decref(j);
    tc_stop(&c);
}

/* The template's syntax picks the format calls are read in: a model file
 * per template, written here, through router/http_parse.c. */
static void test_format_of_template(void **state)
{
    (void)state;
    static const char MISTRAL_LIKE[] =
        "{{ bos_token }}{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}"
        "{% for m in messages %}{% if m.role == 'user' %}[INST]{{ m.content }}[/INST]"
        "{% elif m.tool_calls %}[TOOL_CALLS]{{ m.tool_calls | tojson }}{% else %}{{ m.content }}{% endif %}"
        "{% endfor %}";
    static const char LLAMA3_LIKE[] =
        "{% if tools %}<|im_start|>ipython tools: {{ tools | tojson }}<|im_end|>{% endif %}"
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.tool_calls %}<|python_tag|>"
        "{{ m.tool_calls[0].function | tojson }}{% else %}{{ m.content }}{% endif %}<|im_end|>{% endfor %}"
        "<|im_start|>assistant\n";
    static const struct {
        const char *tmpl;
        fy_tool_format_t fmt;
    } cases[] = {
        {TINY_TEMPLATE, FY_TOOL_FORMAT_HERMES},
        {MISTRAL_LIKE, FY_TOOL_FORMAT_MISTRAL},
        {LLAMA3_LIKE, FY_TOOL_FORMAT_LLAMA3},
        {NULL, FY_TOOL_FORMAT_HERMES}, /* ChatML: SmolLM2's tool prompt, answered in <tool_call> */
    };
    for (size_t i = 0; i < FY_ARRAY_LEN(cases); i++) {
        char path[512];
        snprintf(path, sizeof(path), "%s/tiny-format-%zu.gguf", fy_test_tmpdir(), i);
        fy_tiny_cfg_t cfg;
        fy_tiny_cfg_default(&cfg);
        cfg.max_ctx = 2048;
        cfg.chat_template = cases[i].tmpl;
        fy_tiny_model_t tm;
        fy_tiny_init(&tm, &cfg);
        assert_true(fy_tiny_write_gguf(&tm, path, GW_F32));
        fy_tiny_free(&tm);
        fy_model_t *m;
        assert_int_equal(fy_model_load(path, &m), FY_OK);
        fy_http_front_t f = {
            .model = m, .model_id = "tiny", .served = "tiny", .max_ctx = 2048, .default_max_tokens = 8};
        fy_http_gen_t *g = fy_calloc(1, sizeof(*g));
        fy_http_fault_t fault;
        const char *body = "{" TINY_USER ", " TINY_TOOLS "}";
        fy_status_t st = fy_http_parse_generation(&f, body, strlen(body), true, g, &fault);
        if (st) print_message("template %zu: %s\n", i, fault.msg);
        assert_int_equal(st, FY_OK);
        assert_int_equal(g->tool_format, cases[i].fmt);
        assert_non_null(g->tool_names);
        assert_string_equal(g->tool_names, "get_weather");
        assert_string_equal(g->tool_names + strlen("get_weather") + 1, "now");
        fy_free(g->ids);
        fy_free(g->tool_names);
        fy_free(g);
        fy_model_destroy(m);
    }
}

/* Faults the door named wrongly or not at all (issue 35, what two peer
 * projects' OpenAI test suites found): each case's status, param, code
 * and words; every case is tried, then the test fails listing those that
 * differ. */
static void test_door_faults(void **state)
{
    (void)state;
    if (!M) skip();
    static const struct {
        const char *body;
        bool chat;
        uint16_t status; /* 0: accepted */
        const char *param, *code, *words;
    } cases[] = {
        /* stream_options only with stream true, as OpenAI and vLLM */
        {COMPL(", \"stream_options\": {\"include_usage\": true}"), false, 400, "stream_options", NULL,
         "'stream': true"},
        {CHAT(", \"stream\": false, \"stream_options\": {}"), true, 400, "stream_options", NULL, "'stream': true"},
        {COMPL(", \"stream\": true, \"stream_options\": {\"include_usage\": true}"), false, 0, NULL, NULL, NULL},
        {COMPL(", \"stream_options\": null"), false, 0, NULL, NULL, NULL},
        /* an unknown model: OpenAI's 404 and code */
        {COMPL(", \"model\": \"gpt-4\""), false, 404, "model", "model_not_found", "'gpt-4' does not exist"},
        {CHAT(", \"model\": \"gpt-4\""), true, 404, "model", "model_not_found", "serves 'smol'"},
        {COMPL(", \"model\": \"smol\""), false, 0, NULL, NULL, NULL},
        /* an integer beyond int64: named, even after a real beyond it */
        {COMPL(", \"seed\": 18446744073709551616"), false, 400, "seed", NULL, "64-bit"},
        {COMPL(", \"temperature\": 1e30, \"seed\": 9223372036854775808"), false, 400, "seed", NULL, "64-bit"},
        {CHAT(", \"seed\": -99999999999999999999"), true, 400, "seed", NULL, "64-bit"},
        {COMPL(", \"logit_bias\": {\"5\": 99999999999999999999}"), false, 400, "logit_bias", NULL, "64-bit"},
        {COMPL(", \"seed\": 9223372036854775807"), false, 0, NULL, NULL, NULL},
        {COMPL(", \"seed\": 1e999"), false, 400, NULL, NULL, "malformed JSON"},
        /* the roles the refusal lists are the roles served */
        {"{\"messages\": [{\"role\": \"wizard\", \"content\": \"x\"}]}", true, 400, "messages", NULL,
         "system, developer, user, assistant or tool"},
        {"{\"messages\": [{\"role\": \"developer\", \"content\": \"x\"}, {\"role\": \"user\", \"content\": \"y\"}]}",
         true, 0, NULL, NULL, NULL},
    };
    int wrong = 0;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        fy_http_gen_t *g = fy_calloc(1, sizeof(*g));
        fy_http_fault_t f;
        fy_status_t st = fy_http_parse_generation(&F, cases[i].body, strlen(cases[i].body), cases[i].chat, g, &f);
        bool ok;
        if (!cases[i].status) {
            ok = st == FY_OK;
            fy_free(g->ids);
            fy_free(g->tool_names);
        } else {
            ok = st == FY_ERR_INVALID && f.status == cases[i].status &&
                 (cases[i].param ? f.param && !strcmp(f.param, cases[i].param) : !f.param) &&
                 (cases[i].code ? f.code && !strcmp(f.code, cases[i].code) : !f.code) && strstr(f.msg, cases[i].words);
        }
        if (!ok) {
            print_message("%s: %s %d param %s code %s '%s'; want %d param %s code %s '...%s...'\n", cases[i].body,
                          fy_status_str(st), st ? f.status : 0, st && f.param ? f.param : "null",
                          st && f.code ? f.code : "null", st ? f.msg : "", cases[i].status,
                          cases[i].param ? cases[i].param : "null", cases[i].code ? cases[i].code : "null",
                          cases[i].words ? cases[i].words : "");
            wrong++;
        }
        fy_free(g);
    }
    assert_int_equal(wrong, 0);
    /* prompt logprobs over their bound on a chat with tools: refused, and
     * the tools' names parsed before it freed (a leak LeakSanitizer saw
     * in fuzz_http's seed chat-tools-plp-over; make asan runs this) */
    size_t cap = 6400 * 3 + 512, k = 0;
    char *big = fy_malloc(cap);
    k += (size_t)snprintf(big + k, cap - k, "{\"messages\": [{\"role\": \"user\", \"content\": \"");
    for (int i = 0; i < 6400; i++) k += (size_t)snprintf(big + k, cap - k, "hi ");
    snprintf(big + k, cap - k,
             "\"}], \"prompt_logprobs\": 20, \"tools\": [{\"type\": \"function\", \"function\": {\"name\": "
             "\"get_time\", \"parameters\": {\"type\": \"object\", \"properties\": {}}}}]}");
    fy_http_gen_t *g = fy_calloc(1, sizeof(*g));
    fy_http_fault_t f;
    assert_int_equal(fy_http_parse_generation(&F, big, strlen(big), true, g, &f), FY_ERR_INVALID);
    assert_string_equal(f.param, "prompt_logprobs");
    assert_null(g->tool_names);
    fy_free(g);
    fy_free(big);
}

int main(void)
{
    if (sodium_init() < 0) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_hermes),  cmocka_unit_test(test_parse_llama3),
        cmocka_unit_test(test_parse_names),   cmocka_unit_test(test_parse_mistral),
        cmocka_unit_test(test_parse_forced),  cmocka_unit_test(test_content_prefix),
        cmocka_unit_test(test_stream_split),  cmocka_unit_test(test_tools_request),
        cmocka_unit_test(test_tools_schema),  cmocka_unit_test(test_structured_outputs),
        cmocka_unit_test(test_tool_requests), cmocka_unit_test(test_door_faults),
        cmocka_unit_test(test_tiny_served),   cmocka_unit_test(test_format_of_template),
    };
    return cmocka_run_group_tests(tests, setup_model, teardown_model);
}

/*
 * fuzz_tools.c - router/tools.c on any bytes: the model's text parsed
 * into tool calls (the model's output is untrusted), whole and as it
 * grows, and the request's tools and tool_choice with the schema that
 * enforces them.  The first byte picks what runs (modulo 8: 0 Hermes, 1
 * Llama 3, 2 a required choice's output, 3 a named one's, 4 a request
 * body, 5 Mistral, 6 Hermes knowing two names and one call only, 7
 * Llama 3 knowing two names); the rest is the input.
 *
 * Checks: every call has an id, type "function", a non-empty name, and
 * arguments that are the JSON text of an object when the parser says
 * they are whole; the content is within the text, and all of it when
 * there is no call; the text fed in pieces (cut at points drawn from the
 * input itself) streams content that never shrinks nor passes what has
 * been fed nor the final content, and deltas that join into the whole
 * parse's calls, name for name and argument byte for byte.  A request
 * accepted names a known choice, and its schema (required, named) is
 * JSON that parses.
 */
#include <jansson.h>
#include <sodium.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "router/tools.h"
#include "tests/fuzz/util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fz_quiet_log();
    if (sodium_init() < 0) abort();
    return 0;
}

static void check_calls(const fy_tools_stream_t *s, json_t *calls)
{
    FZ_CHECK(json_is_array(calls), "calls are not an array");
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c)
    {
        const char *id = json_string_value(json_object_get(c, "id"));
        FZ_CHECK(id && id[0], "call %zu has no id", i);
        FZ_CHECK(!strcmp(json_string_value(json_object_get(c, "type")), "function"), "call %zu's type", i);
        json_t *fn = json_object_get(c, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        FZ_CHECK(name && name[0], "call %zu has no name", i);
        const char *args = json_string_value(json_object_get(fn, "arguments"));
        FZ_CHECK(args, "call %zu has no arguments", i);
        if (!fy_tools_stream_call_complete(s, i)) continue;
        json_t *a = json_loads(args, 0, NULL);
        FZ_CHECK(json_is_object(a), "call %zu's arguments are not an object: %s", i, args);
        json_decref(a);
    }
}

/* text parsed whole, then fed in pieces: the same content and calls */
static void output(fy_tool_choice_t choice, fy_tool_format_t fmt, const char *names, bool parallel, const char *text,
                   size_t len)
{
    const char *named = choice == FY_TOOL_CHOICE_NAMED ? "fn" : NULL;
    fy_tools_stream_t *w, *s;
    if (fy_tools_stream_create(choice, fmt, named, names, parallel, &w) != FY_OK) return;
    if (fy_tools_stream_feed(w, text, len, true) != FY_OK) {
        fy_tools_stream_destroy(w);
        return;
    }
    json_t *calls = fy_tools_stream_calls(w);
    size_t clen = fy_tools_stream_content(w, text), n = fy_tools_stream_n_calls(w);
    if (!calls) goto out_w;
    check_calls(w, calls);
    FZ_CHECK(clen <= len, "content %zu of %zu bytes", clen, len);
    FZ_CHECK(n || clen == len, "no call, yet content %zu of %zu", clen, len);
    if (!parallel) FZ_CHECK(n <= 1, "%zu calls without parallel calls", n);
    if (choice == FY_TOOL_CHOICE_NAMED) FZ_CHECK(n <= 1, "a named choice made %zu calls", n);
    if (fy_tools_stream_create(choice, fmt, named, names, parallel, &s) != FY_OK) goto out_calls;
    json_t *got = json_array();
    uint32_t h = 2166136261u; /* cut points drawn from the input (FNV-1a) */
    for (size_t i = 0; i < len; i++) h = (h ^ (uint8_t)text[i]) * 16777619u;
    size_t at = 0, shown = 0;
    for (bool last = false; !last;) {
        h = h * 1103515245u + 12345u;
        at += 1 + (h >> 16) % 9;
        if (at >= len) at = len, last = true;
        if (fy_tools_stream_feed(s, text, at, last) != FY_OK) goto out_s;
        size_t c = fy_tools_stream_content(s, text);
        FZ_CHECK(c >= shown && c <= at, "content %zu after %zu, with %zu bytes fed", c, shown, at);
        FZ_CHECK(c <= clen, "streamed %zu bytes of content; the whole text has %zu", c, clen);
        shown = c;
        json_t *d = fy_tools_stream_deltas(s);
        if (!d) goto out_s;
        size_t k;
        json_t *e;
        json_array_foreach(d, k, e)
        {
            size_t idx = (size_t)json_integer_value(json_object_get(e, "index"));
            const char *more = json_string_value(json_object_get(json_object_get(e, "function"), "arguments"));
            FZ_CHECK(more, "a delta without arguments");
            if (json_object_get(e, "id")) {
                FZ_CHECK(idx == json_array_size(got), "call %zu began as call %zu", json_array_size(got), idx);
                FZ_CHECK(!more[0], "a call's first delta has arguments");
                json_array_append_new(got, json_pack("{s:O, s:s}", "name",
                                                     json_object_get(json_object_get(e, "function"), "name"),
                                                     "arguments", ""));
                continue;
            }
            json_t *g = json_array_get(got, idx);
            FZ_CHECK(g, "arguments for call %zu before it began", idx);
            size_t have = json_string_length(json_object_get(g, "arguments")), add = strlen(more);
            char *joined = fy_malloc(have + add + 1);
            if (!joined) continue;
            memcpy(joined, json_string_value(json_object_get(g, "arguments")), have);
            memcpy(joined + have, more, add + 1);
            json_object_set_new(g, "arguments", json_stringn(joined, have + add));
            fy_free(joined);
        }
        json_decref(d);
    }
    FZ_CHECK(fy_tools_stream_content(s, text) == clen, "content %zu streamed, %zu whole",
             fy_tools_stream_content(s, text), clen);
    FZ_CHECK(json_array_size(got) == n, "%zu calls streamed, %zu whole", json_array_size(got), n);
    for (size_t k = 0; k < n; k++) {
        json_t *wf = json_object_get(json_array_get(calls, k), "function"), *g = json_array_get(got, k);
        FZ_CHECK(json_equal(json_object_get(wf, "name"), json_object_get(g, "name")), "call %zu's name", k);
        FZ_CHECK(json_equal(json_object_get(wf, "arguments"), json_object_get(g, "arguments")),
                 "call %zu's arguments: streamed %s, whole %s", k, json_string_value(json_object_get(g, "arguments")),
                 json_string_value(json_object_get(wf, "arguments")));
    }
out_s:
    json_decref(got);
    fy_tools_stream_destroy(s);
out_calls:
    json_decref(calls);
out_w:
    fy_tools_stream_destroy(w);
}

static void request(const char *text, size_t len)
{
    json_t *o = json_loadb(text, len, 0, NULL);
    if (!json_is_object(o)) {
        json_decref(o);
        return;
    }
    fy_tools_req_t t;
    const char *param = NULL;
    char err[256];
    if (fy_tools_request(o, &t, &param, err, sizeof(err)) == FY_OK) {
        FZ_CHECK(t.choice >= FY_TOOL_CHOICE_NONE && t.choice <= FY_TOOL_CHOICE_NAMED, "choice %d", (int)t.choice);
        FZ_CHECK(t.choice == FY_TOOL_CHOICE_NONE || t.tools, "a choice without tools");
        if (t.choice == FY_TOOL_CHOICE_REQUIRED || t.choice == FY_TOOL_CHOICE_NAMED) {
            char *s = NULL;
            if (fy_tools_schema(&t, &s, err, sizeof(err)) == FY_OK) {
                json_t *j = json_loads(s, 0, NULL);
                FZ_CHECK(json_is_object(j), "the schema does not parse: %s", s);
                json_decref(j);
                fy_free(s);
            }
        }
        if (t.tools) {
            char *p = fy_tools_system_prompt(&t);
            FZ_CHECK(!p || strstr(p, "<tools>"), "the tool prompt has no tools");
            fy_free(p);
        }
        fy_tools_req_clear(&t);
    } else {
        FZ_CHECK(param && err[0], "a refusal names no field");
    }
    json_decref(o);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    static const char names[] = "get_weather\0a\0";
    switch (data[0] % 8) {
    case 0: output(FY_TOOL_CHOICE_AUTO, FY_TOOL_FORMAT_HERMES, NULL, true, text, len); break;
    case 1: output(FY_TOOL_CHOICE_AUTO, FY_TOOL_FORMAT_LLAMA3, NULL, true, text, len); break;
    case 2: output(FY_TOOL_CHOICE_REQUIRED, FY_TOOL_FORMAT_HERMES, NULL, true, text, len); break;
    case 3: output(FY_TOOL_CHOICE_NAMED, FY_TOOL_FORMAT_HERMES, NULL, true, text, len); break;
    case 4: request(text, len); break;
    case 5: output(FY_TOOL_CHOICE_AUTO, FY_TOOL_FORMAT_MISTRAL, NULL, true, text, len); break;
    case 6: output(FY_TOOL_CHOICE_AUTO, FY_TOOL_FORMAT_HERMES, names, false, text, len); break;
    default: output(FY_TOOL_CHOICE_AUTO, FY_TOOL_FORMAT_LLAMA3, names, true, text, len); break;
    }
    return 0;
}

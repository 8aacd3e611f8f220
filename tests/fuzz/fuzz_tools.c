/*
 * fuzz_tools.c - router/tools.c on any bytes: the model's text parsed
 * into tool calls (the model's output is untrusted), the streaming
 * guess of what is content, and the request's tools and tool_choice
 * with the schema that enforces them.  The first byte picks what runs
 * (modulo 5: 0 Hermes, 1 Llama 3, 2 a required choice's output, 3 a
 * named one's, 4 a request body); the rest is the input.
 *
 * Checks: every call has an id "call_...", type "function", a non-empty
 * name and arguments that are the JSON text of an object; the content is
 * within the text, and all of it when there is no call; text streamed as
 * content while it grew (fy_tools_content_prefix of each of its
 * prefixes) never reaches into what the whole text gives as a call.  A
 * request accepted names a known choice, and its schema (required,
 * named) is JSON that parses.
 */
#include <jansson.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mem.h"
#include "tools.h"
#include "util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fz_quiet_log();
    if (sodium_init() < 0) abort();
    return 0;
}

static void check_calls(json_t *calls)
{
    FZ_CHECK(json_is_array(calls), "calls are not an array");
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c)
    {
        const char *id = json_string_value(json_object_get(c, "id"));
        FZ_CHECK(id && !strncmp(id, "call_", 5), "call %zu has no id", i);
        FZ_CHECK(!strcmp(json_string_value(json_object_get(c, "type")), "function"), "call %zu's type", i);
        json_t *fn = json_object_get(c, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        FZ_CHECK(name && name[0], "call %zu has no name", i);
        const char *args = json_string_value(json_object_get(fn, "arguments"));
        FZ_CHECK(args, "call %zu has no arguments", i);
        json_t *a = json_loads(args, 0, NULL);
        FZ_CHECK(json_is_object(a), "call %zu's arguments are not an object: %s", i, args);
        json_decref(a);
    }
}

static void output(fy_tool_format_t fmt, const char *text, size_t len)
{
    json_t *calls = NULL;
    size_t clen = 0;
    if (fy_tools_parse(fmt, text, len, &calls, &clen) != FY_OK) return;
    check_calls(calls);
    FZ_CHECK(clen <= len, "content %zu of %zu bytes", clen, len);
    FZ_CHECK(json_array_size(calls) || clen == len, "no call, yet content %zu of %zu", clen, len);
    /* what streamed as the text grew stays within the final content */
    size_t last = 0;
    for (size_t k = 0; k <= len; k += 1 + k / 8) {
        size_t p = fy_tools_content_prefix(fmt, text, k);
        FZ_CHECK(p <= k, "prefix %zu of %zu bytes", p, k);
        if (json_array_size(calls)) FZ_CHECK(p <= clen, "streamed %zu bytes of a text whose content is %zu", p, clen);
        if (p > last) last = p;
    }
    json_decref(calls);
}

static void forced(fy_tool_choice_t choice, const char *text, size_t len)
{
    json_t *calls = NULL;
    if (fy_tools_parse_forced(choice, "fn", text, len, &calls) != FY_OK) return;
    check_calls(calls);
    if (choice == FY_TOOL_CHOICE_NAMED) FZ_CHECK(json_array_size(calls) <= 1, "a named choice made several calls");
    json_decref(calls);
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
    switch (data[0] % 5) {
    case 0: output(FY_TOOL_FORMAT_HERMES, text, len); break;
    case 1: output(FY_TOOL_FORMAT_LLAMA3, text, len); break;
    case 2: forced(FY_TOOL_CHOICE_REQUIRED, text, len); break;
    case 3: forced(FY_TOOL_CHOICE_NAMED, text, len); break;
    default: request(text, len); break;
    }
    return 0;
}

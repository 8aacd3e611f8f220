/*
 * tools.h - tool calling for chat completions (OpenAI's "tools"): the
 * request's tools and tool_choice checked, the JSON Schema that enforces
 * a required or named choice through the grammar engine, the tool prompt
 * ferry writes for templates that have no tool syntax of their own, and
 * the model's output parsed back into OpenAI tool_calls by the model
 * family's format.  router/http_parse.c and router/http.c call it;
 * tests/fuzz/fuzz_tools.c feeds the output parsers arbitrary bytes (the
 * model's text is untrusted).
 *
 * Not here: rendering (model/chat.c renders 'tools' and messages' tool
 * calls for templates that do), HTTP, the grammar engine.
 */
#ifndef FY_TOOLS_H
#define FY_TOOLS_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "status.h"

#define FY_TOOL_NAME_MAX 64 /* bytes of a function's name (OpenAI's) */
#define FY_TOOLS_MAX 128    /* tools per request (OpenAI's) */

typedef enum fy_tool_choice {
    FY_TOOL_CHOICE_NONE = 0, /* no tools, or tool_choice "none": the output is text */
    FY_TOOL_CHOICE_AUTO,     /* the model may call: its text is parsed in the family's format */
    FY_TOOL_CHOICE_REQUIRED, /* the grammar forces a JSON array of {"name", "parameters"} */
    FY_TOOL_CHOICE_NAMED,    /* the grammar forces the named function's arguments object */
} fy_tool_choice_t;

typedef enum fy_tool_format {
    FY_TOOL_FORMAT_HERMES = 0, /* <tool_call>{"name", "arguments"}</tool_call>, one per call, or a JSON
                                * array of calls inside one (SmolLM2's) */
    FY_TOOL_FORMAT_LLAMA3,     /* the whole answer {"name", "parameters"} (after <|python_tag|>), calls
                                * separated by ';' */
} fy_tool_format_t;

/* What a chat completion asks of tools. */
typedef struct fy_tools_req {
    json_t *tools; /* the "tools" array as given, checked (one reference); NULL: none */
    fy_tool_choice_t choice;
    char named[FY_TOOL_NAME_MAX + 1]; /* NAMED: the function */
    bool parallel;                    /* parallel_tool_calls (default true) */
} fy_tools_req_t;

/* Reads "tools", "tool_choice" and "parallel_tool_calls" of body (a chat
 * completion).  FY_OK: *t filled (fy_tools_req_clear frees it);
 * FY_ERR_INVALID: *param_p names the field and err says why, *t empty. */
fy_status_t fy_tools_request(json_t *body, fy_tools_req_t *t, const char **param_p, char *err, size_t err_cap);
void fy_tools_req_clear(fy_tools_req_t *t); /* accepts an empty one */

/* The JSON Schema that forces t's choice (REQUIRED: an array of
 * {"name": const, "parameters": that tool's schema} with at least one
 * item, at most one without parallel calls; NAMED: the function's
 * parameters), as compact JSON text with its members in the order given.
 * FY_OK: *schema_p is fy_free'd by the caller; FY_ERR_INVALID: two tools
 * define the same $defs name differently (err says which); FY_ERR_NOMEM. */
fy_status_t fy_tools_schema(const fy_tools_req_t *t, char **schema_p, char *err, size_t err_cap);

/* The system text that tells a model whose template has no tool syntax
 * of t's tools and how to call them (SmolLM2's tool prompt: <tools>
 * JSON </tools> and <tool_call>[...]</tool_call>); fy_free'd, NULL when
 * out of memory. */
char *fy_tools_system_prompt(const fy_tools_req_t *t);
/* An assistant's tool_calls (OpenAI's array, checked) as that prompt's
 * format writes them; fy_free'd, NULL when out of memory. */
char *fy_tools_calls_text(json_t *tool_calls);

/* The model's text (len bytes, any bytes) in format fmt.  FY_OK: *calls_p
 * is a new JSON array of OpenAI tool calls ({"id", "type": "function",
 * "function": {"name", "arguments": JSON text}}), empty when the text
 * holds no well-formed call (then all of it is content), and
 * *content_len_p the bytes of text before the first call that are the
 * answer's content; FY_ERR_NOMEM. */
fy_status_t fy_tools_parse(fy_tool_format_t fmt, const char *text, size_t len, json_t **calls_p, size_t *content_len_p);
/* The text a grammar forced for choice (REQUIRED or NAMED, named: the
 * function): FY_OK with *calls_p as above (empty when the text is not
 * the JSON the grammar allows, e.g. cut short by max_tokens). */
fy_status_t fy_tools_parse_forced(fy_tool_choice_t choice, const char *named, const char *text, size_t len,
                                  json_t **calls_p);
/* While the text still grows: how many of its first bytes are content
 * for sure (no call can begin inside them), to stream as they come. */
size_t fy_tools_content_prefix(fy_tool_format_t fmt, const char *text, size_t len);

#endif /* FY_TOOLS_H */

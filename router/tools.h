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

#include "common/status.h"

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
    FY_TOOL_FORMAT_MISTRAL,    /* [TOOL_CALLS] [{"name", "arguments"}, ...] (the marker is a control token,
                                * so the array may also open the answer bare) */
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

/* The tools' names, each NUL-terminated, one after the other, then an
 * empty one ("a\0b\0\0"): what the parsers take as the known names;
 * fy_free'd, NULL when out of memory. */
char *fy_tools_names(const fy_tools_req_t *t);

/*
 * The model's text parsed into tool calls as it grows (router/tools.c
 * says how).  A stream reads the answer in its family's format (choice
 * AUTO) or as the JSON a grammar forced (REQUIRED: an array of {"name",
 * "parameters"}; NAMED: named's arguments).  Feeding the whole text at
 * once or in pieces gives the same content and calls: a call goes out
 * (its id and name) once its name is known and its arguments begin,
 * then its arguments as they come (white space outside strings left
 * out); a call whose name is not in names (NULL: any) is not a call
 * (its text is content, vLLM's choice); a call cut short keeps the
 * arguments it had; without parallel calls the first call is the only
 * one.  Text before the first call is content (trailing white space
 * left out); text between and after calls is dropped; with no call at
 * the end, all of the text is content.
 */
typedef struct fy_tools_stream fy_tools_stream_t;

/* names: fy_tools_names' list (copied; NULL: any name).  FY_OK: *s_p is
 * fy_tools_stream_destroy'ed by the caller; FY_ERR_NOMEM. */
fy_status_t fy_tools_stream_create(fy_tool_choice_t choice, fy_tool_format_t fmt, const char *named, const char *names,
                                   bool parallel, fy_tools_stream_t **s_p);
void fy_tools_stream_destroy(fy_tools_stream_t *s); /* accepts NULL */
/* Reads text (len bytes: all of the answer so far, each feed's text
 * extending the last's); done: the answer ended.  FY_OK or FY_ERR_NOMEM. */
fy_status_t fy_tools_stream_feed(fy_tools_stream_t *s, const char *text, size_t len, bool done);
/* How many first bytes of text are content for sure (never fewer than
 * before); at the end, the content's length. */
size_t fy_tools_stream_content(const fy_tools_stream_t *s, const char *text);
size_t fy_tools_stream_n_calls(const fy_tools_stream_t *s);
/* Call i's arguments are whole (a JSON object's text). */
bool fy_tools_stream_call_complete(const fy_tools_stream_t *s, size_t i);
/* The calls so far as OpenAI's message.tool_calls ({"id", "type":
 * "function", "function": {"name", "arguments"}}), a new array; NULL
 * when out of memory. */
json_t *fy_tools_stream_calls(const fy_tools_stream_t *s);
/* What is new since the last call, as OpenAI's stream sends it: a new
 * array of tool_calls delta entries, each for a chunk of its own (a
 * call's first: {"index", "id", "type", "function": {"name",
 * "arguments": ""}}; then {"index", "function": {"arguments": more}});
 * NULL when out of memory. */
json_t *fy_tools_stream_deltas(fy_tools_stream_t *s);

/* The whole text at once (a stream fed once): FY_OK with *calls_p a new
 * array as fy_tools_stream_calls (empty: no call, all of the text
 * content) and *content_len_p the content's bytes; FY_ERR_NOMEM. */
fy_status_t fy_tools_parse(fy_tool_format_t fmt, const char *names, bool parallel, const char *text, size_t len,
                           json_t **calls_p, size_t *content_len_p);
/* The text a grammar forced for choice (REQUIRED or NAMED, named: the
 * function), likewise. */
fy_status_t fy_tools_parse_forced(fy_tool_choice_t choice, const char *named, const char *text, size_t len,
                                  json_t **calls_p);

#endif /* FY_TOOLS_H */

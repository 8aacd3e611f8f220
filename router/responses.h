/*
 * responses.h - OpenAI's Responses API (POST /v1/responses) on chat
 * completions' path: a Responses body is translated into a chat
 * completion's (input items to messages, instructions to a system
 * message first, max_output_tokens, text.format to response_format,
 * function tools and tool_choice to chat's) and parsed by
 * fy_http_parse_generation, so it runs exactly what a chat completion
 * runs; its faults name the Responses field.  The answer goes back as a
 * response object (output items: a message with output_text, or
 * function_call items) or as the Responses stream's events.
 *
 * ferry keeps no responses: previous_response_id, conversation and
 * background are refused, store is ignored (the answer says "store":
 * false), as vLLM does without its store.  docs/protocol.md lists what
 * is taken and what is refused.
 *
 * Thread rules: a fy_responses_t belongs to one request; router/http.c
 * calls the output functions under the router's lock, one at a time.
 * Not here: HTTP, the generation itself (router/http.c), tool-call
 * parsing (router/tools.h).
 */
#ifndef FY_RESPONSES_H
#define FY_RESPONSES_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "common/status.h"
#include "router/http_parse.h"

/* One request's Responses side: what its answer echoes, and a stream's
 * events so far. */
typedef struct fy_responses fy_responses_t;

/* Parses body (len bytes) of POST /v1/responses.  FY_OK: *g as
 * fy_http_parse_generation fills it (a chat completion's, n 1) and *rs_p
 * the caller's (fy_responses_free); FY_ERR_INVALID: *fault names the
 * Responses field at fault, *rs_p NULL; FY_ERR_NOMEM. */
fy_status_t fy_responses_parse(const fy_http_front_t *f, const char *body, size_t len, fy_http_gen_t *g,
                               fy_responses_t **rs_p, fy_http_fault_t *fault);
void fy_responses_free(fy_responses_t *rs); /* accepts NULL */
/* The response's id ("resp_" and 24 hex digits). */
const char *fy_responses_id(const fy_responses_t *rs);

/* The whole answer: content (len bytes: the text before any call),
 * calls (chat's message.tool_calls, borrowed; NULL or empty: none),
 * finish (chat's finish_reason: "length" makes the response incomplete)
 * and usage (chat's usage object, borrowed).  A new response object;
 * NULL when out of memory. */
json_t *fy_responses_whole(fy_responses_t *rs, const char *content, size_t len, json_t *calls, const char *finish,
                           json_t *usage);

/* A stream's events go out through write (false: out of memory). */
typedef bool (*fy_responses_write_fn)(void *arg, const char *s, size_t n);

/* More content (len bytes, 0: none): the first call sends
 * response.created and response.in_progress, content opens the message
 * item and goes as response.output_text.delta. */
void fy_responses_stream_text(fy_responses_t *rs, const char *text, size_t len, fy_responses_write_fn write, void *arg);
/* Chat's tool_calls deltas (fy_tools_stream_deltas, borrowed): a call's
 * first opens a function_call item (closing the message or the call
 * before it), the others go as response.function_call_arguments.delta. */
void fy_responses_stream_calls(fy_responses_t *rs, json_t *deltas, fy_responses_write_fn write, void *arg);
/* The end: open items close and response.completed (finish "length":
 * response.incomplete) carries the whole response with usage (chat's,
 * borrowed); error non-NULL: the generation failed, response.failed
 * says why. */
void fy_responses_stream_end(fy_responses_t *rs, const char *finish, json_t *usage, const char *error,
                             fy_responses_write_fn write, void *arg);

#endif /* FY_RESPONSES_H */

/*
 * chat.h - the chat template of a model, applied to a list of messages.
 *
 * Models ship their prompt format as a Jinja2 template (GGUF key
 * tokenizer.chat_template, or chat_template in tokenizer_config.json).
 * ferry interprets the subset of Jinja2 that real chat templates use
 * (SmolLM2, Llama-2, Llama-3, Mistral, Zephyr, Qwen2, Phi-3, Gemma):
 * for/if/elif/else/set, expressions with the usual operators, loop
 * variables, a few filters and tests, raise_exception().  A template that
 * uses something outside that subset fails at creation with an error that
 * names the construct and its position, never silently.
 *
 * With no template (NULL) ferry uses ChatML.
 */
#ifndef FY_CHAT_H
#define FY_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "common/status.h"

typedef struct fy_chat_msg {
    const char *role;    /* "system", "user", "assistant", "tool", ... */
    const char *content; /* UTF-8; NULL: None (an assistant's turn of tool calls alone) */
} fy_chat_msg_t;

typedef struct fy_chat_template fy_chat_template_t;

/* Parses src (NULL: ChatML).  bos_token and eos_token are the strings the
 * template sees as bos_token/eos_token (may be NULL: empty). */
fy_status_t fy_chat_template_create(const char *src, const char *bos_token, const char *eos_token,
                                    fy_chat_template_t **tmpl_p);
void fy_chat_template_destroy(fy_chat_template_t *tmpl); /* accepts NULL */

/* The source of a template ferry carries for models that ship none:
 * "chatml" (the default) or "gemma" (Gemma 3's own); NULL for other names. */
const char *fy_chat_template_builtin(const char *name);

/* Renders the template for msgs.  add_generation_prompt opens the
 * assistant's turn.  On success *out_p is a NUL-terminated string the
 * caller frees with fy_free().  Errors (raise_exception, a type error, a
 * runaway loop) are logged and returned as FY_ERR_INVALID. */
fy_status_t fy_chat_template_apply(const fy_chat_template_t *tmpl, const fy_chat_msg_t *msgs, size_t n_msgs,
                                   bool add_generation_prompt, char **out_p);

/* The same with tools_json (NULL: the template sees no 'tools') the
 * JSON array of tool definitions a template renders (OpenAI's shape:
 * [{"type": "function", "function": {"name", "description",
 * "parameters"}}]) and extra (NULL, or [n_msgs] each NULL or a JSON
 * object whose members join that message as the template sees it:
 * tool_calls, tool_call_id, name); JSON that does not parse is
 * FY_ERR_INVALID (logged). */
fy_status_t fy_chat_template_apply_tools(const fy_chat_template_t *tmpl, const fy_chat_msg_t *msgs,
                                         const char *const *extra, size_t n_msgs, const char *tools_json,
                                         bool add_generation_prompt, char **out_p);

/* The same with vars_json (NULL: none) a JSON object whose members the
 * template sees as variables of its own (a request's chat_template_kwargs:
 * Qwen3's enable_thinking, ...); messages, tools, add_generation_prompt,
 * bos_token and eos_token are the caller's and win over a member of the
 * same name.  JSON that is not an object is FY_ERR_INVALID (logged). */
fy_status_t fy_chat_template_apply_vars(const fy_chat_template_t *tmpl, const fy_chat_msg_t *msgs,
                                        const char *const *extra, size_t n_msgs, const char *tools_json,
                                        const char *vars_json, bool add_generation_prompt, char **out_p);

/* The template's source (normalized), for callers that pick a format by
 * what it mentions (a tool-call syntax). */
const char *fy_chat_template_source(const fy_chat_template_t *tmpl);

#endif /* FY_CHAT_H */

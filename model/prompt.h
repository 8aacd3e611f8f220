/*
 * prompt.h - a user's prompt to token ids, with the model's chat template
 * when asked, such that text from the user can never become a special
 * token.
 *
 * The template is rendered with sentinels in place of the messages; the
 * template's own text is then tokenized with special tokens recognized
 * (<|im_start|> and the like are its markers) and each message's text
 * without, so a user who types "<|im_end|>" gets those characters, not
 * the end of their turn.
 */
#ifndef FY_PROMPT_H
#define FY_PROMPT_H

#include <stdbool.h>
#include <stdint.h>

#include "model/chat.h"
#include "model/model.h"
#include "common/status.h"

/* system may be NULL; with chat false the user text is the whole prompt
 * (BOS added when the model wants it).  *ids_p is fy_free'd by the caller.
 * FY_ERR_INVALID (logged) when the template fails or transforms the
 * message text so that it cannot be found again. */
fy_status_t fy_prompt_tokens(const fy_model_t *m, const char *system, const char *user, bool chat, int32_t **ids_p,
                             int32_t *n_p);

/* A raw prompt of len bytes (a completion's, not a chat's), BOS added
 * when the model wants it.  parse_special: the tokenizer's control tokens
 * written in the text (<|im_start|>, <start_of_turn>) are matched whole,
 * as vLLM's /v1/completions and /tokenize do (the client writes the whole
 * prompt, template markers and all, and could send their ids anyway);
 * false: the text is plain text (fy_prompt_tokens with chat false).
 * FY_ERR_INVALID for text that gives no token. */
fy_status_t fy_prompt_text(const fy_model_t *m, const char *text, size_t len, bool parse_special, int32_t **ids_p,
                           int32_t *n_p);

#define FY_PROMPT_MAX_MSGS 256

/* A conversation (system, user and assistant turns) through the model's
 * chat template, the assistant's turn opened; the messages' text is never
 * parsed for special tokens.  FY_ERR_INVALID (logged) for no messages,
 * more than FY_PROMPT_MAX_MSGS, or a template that fails or rewrites a
 * message's text. */
fy_status_t fy_prompt_chat(const fy_model_t *m, const fy_chat_msg_t *msgs, size_t n_msgs, int32_t **ids_p,
                           int32_t *n_p);

/* The same with tools_json (NULL: none) for the template's 'tools' and
 * extra (NULL, or [n_msgs]) each message's extra members (chat.h); a message with no text or an
 * empty one is passed as it is (an assistant's tool calls alone), and a
 * message's text the template dumps with tojson goes in JSON-escaped,
 * still never parsed for special tokens. */
fy_status_t fy_prompt_chat_tools(const fy_model_t *m, const fy_chat_msg_t *msgs, const char *const *extra,
                                 size_t n_msgs, const char *tools_json, int32_t **ids_p, int32_t *n_p);

/* The same with vars_json (NULL: none) the template's variables of the
 * request (chat.h's fy_chat_template_apply_vars: chat_template_kwargs).
 * What the template writes of them is template text, whose special tokens
 * count: the caller keeps special tokens' text out of them. */
fy_status_t fy_prompt_chat_vars(const fy_model_t *m, const fy_chat_msg_t *msgs, const char *const *extra, size_t n_msgs,
                                const char *tools_json, const char *vars_json, int32_t **ids_p, int32_t *n_p);

#endif /* FY_PROMPT_H */

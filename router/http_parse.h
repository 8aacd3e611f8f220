/*
 * http_parse.h - OpenAI request bodies to generations: what router/http.c
 * runs for POST /v1/completions and /v1/chat/completions between the
 * bytes and the router (and for /tokenize and /detokenize), as a function of its own so that a fuzz target
 * (tests/fuzz/fuzz_http.c) drives exactly the code the router runs.
 */
#ifndef FY_HTTP_PARSE_H
#define FY_HTTP_PARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "common/genspec.h"
#include "model/model.h"
#include "common/status.h"
#include "router/reasoning.h"
#include "router/tools.h"

#define FY_HTTP_MAX_N 16 /* samples per request ("n") */
/* A completion's prompt array: at most this many prompts, and at most
 * FY_HTTP_MAX_CHOICES choices (prompts times n) in one answer */
#define FY_HTTP_MAX_PROMPTS 32
#define FY_HTTP_MAX_CHOICES 64

/* What the parsing needs to know of the server. */
typedef struct fy_http_front {
    const fy_model_t *model; /* its tokenizer and chat template */
    const char *model_id;    /* accepted as "model", besides served */
    const char *served;      /* the name the API serves the model under */
    int32_t max_ctx;         /* tokens of context */
    /* a prompt's text (chat: its messages' text together) longer than
     * this cannot fit the context and is refused before it is tokenized
     * (max_ctx times fy_tokenizer_max_token_text); 0: no bound */
    size_t max_prompt_bytes;
    int64_t default_max_tokens; /* chat completions without max_tokens */
    /* structured outputs are compiled here first, so a schema the workers
     * would refuse is a 400 naming its field (NULL: compiled uncached) */
    struct fy_grammar_cache *grammars;
    /* router.reasoning_parser: how chat answers split into reasoning and
     * content (AUTO: by the model's template; NONE in a zeroed front) */
    fy_reasoning_parser_t reasoning_parser;
} fy_http_front_t;

/* Why a body was refused: an HTTP status (400, 404), an OpenAI error type,
 * the parameter at fault (NULL: none) and a message. */
typedef struct fy_http_fault {
    uint16_t status;
    const char *type, *param;
    const char *code; /* OpenAI's error code ("context_length_exceeded"), or NULL */
    char msg[384];
    char param_buf[64]; /* param, when it is a name read from the body (an integer beyond int64's) */
} fy_http_fault_t;

/* An accepted body. */
typedef struct fy_http_gen {
    fy_genspec_t gen;
    int n;
    bool stream, include_usage, max_tokens_set;
    int32_t truncate; /* truncate_prompt_tokens: the prompt keeps its last this many tokens; 0: all */
    json_int_t top_logprobs;
    /* completions' echo: the prompt comes back before the completion (its
     * logprobs too, with logprobs); echo_only: max_tokens 0, the prompt
     * alone (the cluster generates one token, which the answer leaves out) */
    bool echo, echo_only;
    /* the client asked for prompt_logprobs (gen.prompt_logprobs is also
     * set for echo with logprobs) with this many alternatives */
    bool prompt_logprobs;
    int32_t prompt_top;
    int32_t *ids; /* [n_prompt] the prompt's token ids (fy_free) */
    int32_t n_prompt;
    /* a completion's prompt array (OpenAI's and vLLM's): n_prompts prompts,
     * their ids one after another in ids (n_prompt in all), prompt_len[p]
     * tokens each; choice p * n + k is prompt p's k-th sample.  One prompt
     * (chat, or a completion's single prompt): n_prompts 1 */
    int n_prompts;
    int32_t prompt_len[FY_HTTP_MAX_PROMPTS];
    /* chat with tools: how the output becomes tool calls (router/tools.h) */
    fy_tool_choice_t tool_choice;
    fy_tool_format_t tool_format;
    char tool_named[FY_TOOL_NAME_MAX + 1];
    char *tool_names; /* the tools' names (fy_tools_names; fy_free); NULL: no tools */
    bool tool_parallel;
    /* chat: the parser its answer is split by (NONE: all of it content),
     * AUTO resolved by the rendered prompt; include_reasoning (vLLM's,
     * default true) false leaves the reasoning out of the answer */
    fy_reasoning_parser_t reasoning;
    bool include_reasoning;
} fy_http_gen_t;

/* The most prompt logprob entries (prompt tokens times one plus the
 * alternatives) one request may ask for: bounds the answer's size. */
#define FY_HTTP_MAX_PLP_ENTRIES (1 << 17)

/* Parses body (len bytes, not NUL-terminated) of a completion (chat:
 * a chat completion).  FY_OK: *g is filled and g->ids is the caller's;
 * FY_ERR_INVALID: *fault says why (nothing to free); FY_ERR_NOMEM. */
fy_status_t fy_http_parse_generation(const fy_http_front_t *f, const char *body, size_t len, bool chat,
                                     fy_http_gen_t *g, fy_http_fault_t *fault);

/* An accepted /tokenize or /detokenize body. */
typedef struct fy_http_tok {
    int32_t *ids;    /* [n] token ids, each below the vocabulary's size (fy_free) */
    int32_t n;       /* 0 or more */
    bool token_strs; /* tokenize: "return_token_strs" */
} fy_http_tok_t;

/* POST /tokenize: {"prompt": text, "add_special_tokens"} or {"messages",
 * "add_generation_prompt"} (rendered as a chat completion's), with
 * "model" and "return_token_strs".  FY_OK: t->ids is the caller's;
 * FY_ERR_INVALID: *fault says why; FY_ERR_NOMEM. */
fy_status_t fy_http_parse_tokenize(const fy_http_front_t *f, const char *body, size_t len, fy_http_tok_t *t,
                                   fy_http_fault_t *fault);
/* POST /detokenize: {"model", "tokens": [ids]}; the same contract. */
fy_status_t fy_http_parse_detokenize(const fy_http_front_t *f, const char *body, size_t len, fy_http_tok_t *t,
                                     fy_http_fault_t *fault);

#endif /* FY_HTTP_PARSE_H */

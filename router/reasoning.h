/*
 * reasoning.h - a thinking model's answer split into its reasoning and its
 * content, as vLLM's reasoning parsers split it: the text of a
 * <think> ... </think> block is the reasoning (reasoning_content), what
 * follows is the content.
 *
 * Two parsers, named as vLLM names them:
 *   deepseek_r1  the answer begins inside the thinking (DeepSeek-R1's
 *                template opens <think> in the prompt): everything up to
 *                </think> is reasoning, a <think> the answer begins with
 *                is dropped, and an answer without </think> is reasoning
 *                alone;
 *   qwen3        the answer thinks only when it begins (after white
 *                space) with <think>; otherwise, and with Qwen3's
 *                enable_thinking false, all of it is content.
 * Which one a request gets (router.reasoning_parser, auto by the template
 * and the rendered prompt) is router/http_parse.c's business.
 *
 * The splitter is fed the whole answer so far, each feed's text extending
 * the last's; feeding it at once or in pieces cut anywhere (a tag split
 * across tokens) gives the same reasoning and content: what may be the
 * start of a tag is held back until the next bytes or the end say.  It
 * allocates nothing and reads no byte past len (the text is the model's,
 * untrusted; fuzzed by tests/fuzz/fuzz_reasoning.c).
 *
 * Thread rules: none of its own; a splitter is one sample's, used under
 * the lock its owner holds (the router's).
 */
#ifndef FY_REASONING_H
#define FY_REASONING_H

#include <stdbool.h>
#include <stddef.h>

typedef enum fy_reasoning_parser {
    FY_REASONING_NONE = 0, /* no splitting: all of the answer is content */
    FY_REASONING_DEEPSEEK_R1,
    FY_REASONING_QWEN3,
    FY_REASONING_AUTO, /* configuration only: by the model's template (http_parse.c) */
} fy_reasoning_parser_t;

/* "none", "deepseek_r1", "qwen3", "auto" to a parser; false for another name. */
bool fy_reasoning_parser_of(const char *name, fy_reasoning_parser_t *p_p);
const char *fy_reasoning_parser_name(fy_reasoning_parser_t p);

/* The model's template knows thinking blocks (it mentions <think> or
 * </think>):
 * what router.reasoning_parser "auto" switches the splitting on for. */
bool fy_reasoning_template_thinks(const char *template_src);

/* The rendered prompt's text (len bytes: its end is enough) leaves the
 * answer inside a thinking block: its last tag is an open <think>. */
bool fy_reasoning_prompt_opens(const char *text, size_t len);

typedef struct fy_reasoning {
    fy_reasoning_parser_t parser;
    int state;           /* reasoning.c's: before the answer shows, thinking, content */
    size_t think_from;   /* the reasoning begins here */
    size_t think_to;     /* and is sure up to here */
    size_t content_from; /* once thinking is over: the content begins here */
} fy_reasoning_t;

/* p: DEEPSEEK_R1 or QWEN3 (NONE: every byte content). */
void fy_reasoning_init(fy_reasoning_t *r, fy_reasoning_parser_t p);
/* Reads text (len bytes: all of the answer so far); done: it ended. */
void fy_reasoning_feed(fy_reasoning_t *r, const char *text, size_t len, bool done);
/* The reasoning sure so far: text[*from_p, *to_p) (empty: none yet). */
void fy_reasoning_span(const fy_reasoning_t *r, size_t *from_p, size_t *to_p);
/* Where the content begins in the text; false while none can be (the
 * answer is still thinking, or its first bytes may yet open <think>). */
bool fy_reasoning_content_from(const fy_reasoning_t *r, size_t *from_p);
/* The answer thought (a reasoning, even an empty one, was opened). */
bool fy_reasoning_thought(const fy_reasoning_t *r);

#endif /* FY_REASONING_H */

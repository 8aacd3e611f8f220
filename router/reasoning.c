/*
 * reasoning.c - a thinking model's answer split into reasoning and
 * content (see reasoning.h).
 *
 * Three states: START (nothing but white space and what may begin
 * <think> has come), THINK (up to </think>), CONTENT (the rest).  The
 * tags are ASCII, and a held-back tail is a proper prefix of one, so
 * every cut falls between whole UTF-8 characters of the model's text.
 *
 * Not here: which parser a request gets (router/http_parse.c), the JSON
 * the split becomes (router/http.c).
 */
#include "router/reasoning.h"

#include <string.h>

#define OPEN "<think>"
#define CLOSE "</think>"
#define OPEN_LEN (sizeof(OPEN) - 1)
#define CLOSE_LEN (sizeof(CLOSE) - 1)

enum { ST_START, ST_THINK, ST_CONTENT };

static const char *const names[] = {"none", "deepseek_r1", "qwen3", "auto"};

bool fy_reasoning_parser_of(const char *name, fy_reasoning_parser_t *p_p)
{
    for (size_t i = 0; name && i < sizeof(names) / sizeof(*names); i++)
        if (!strcmp(name, names[i])) {
            *p_p = (fy_reasoning_parser_t)i;
            return true;
        }
    return false;
}

const char *fy_reasoning_parser_name(fy_reasoning_parser_t p)
{
    return (size_t)p < sizeof(names) / sizeof(*names) ? names[p] : "?";
}

bool fy_reasoning_template_thinks(const char *src)
{
    return src && (strstr(src, OPEN) || strstr(src, CLOSE)); /* (an older R1 template only strips </think>) */
}

/* The last occurrence of tag (n bytes) in text[0, len), or NULL. */
static const char *last_of(const char *text, size_t len, const char *tag, size_t n)
{
    const char *last = NULL;
    for (const char *p = text; len >= n && (p = memmem(p, len - (size_t)(p - text), tag, n)); p++) {
        last = p;
        if ((size_t)(p - text) + n >= len) break;
    }
    return last;
}

bool fy_reasoning_prompt_opens(const char *text, size_t len)
{
    const char *open = last_of(text, len, OPEN, OPEN_LEN), *close = last_of(text, len, CLOSE, CLOSE_LEN);
    return open && (!close || close < open);
}

void fy_reasoning_init(fy_reasoning_t *r, fy_reasoning_parser_t p)
{
    memset(r, 0, sizeof(*r));
    r->parser = p == FY_REASONING_DEEPSEEK_R1 || p == FY_REASONING_QWEN3 ? p : FY_REASONING_NONE;
    r->state = r->parser == FY_REASONING_NONE ? ST_CONTENT : ST_START;
}

static bool space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

void fy_reasoning_feed(fy_reasoning_t *r, const char *text, size_t len, bool done)
{
    if (r->state == ST_START) {
        size_t ws = 0;
        while (ws < len && space(text[ws])) ws++;
        size_t rest = len - ws, m = rest < OPEN_LEN ? rest : OPEN_LEN;
        bool opens = !memcmp(text + ws, OPEN, m); /* so far, what the answer has is <think>'s beginning */
        if (opens && rest < OPEN_LEN && !done) return;
        if (opens && rest >= OPEN_LEN) {
            r->think_from = ws + OPEN_LEN;
        } else if (r->parser == FY_REASONING_DEEPSEEK_R1) {
            r->think_from = 0; /* the prompt opened the thinking */
        } else {
            r->state = ST_CONTENT; /* qwen3: no <think>, no thinking */
            r->content_from = 0;
            return;
        }
        r->think_to = r->think_from;
        r->state = ST_THINK;
    }
    if (r->state != ST_THINK || len < r->think_to) return;
    const char *hit = memmem(text + r->think_to, len - r->think_to, CLOSE, CLOSE_LEN);
    if (hit) {
        r->think_to = (size_t)(hit - text);
        r->content_from = r->think_to + CLOSE_LEN;
        r->state = ST_CONTENT;
        return;
    }
    size_t keep = len; /* less what may be the beginning of </think> */
    for (size_t k = CLOSE_LEN - 1; !done && k > 0; k--)
        if (len - r->think_to >= k && !memcmp(text + len - k, CLOSE, k)) {
            keep = len - k;
            break;
        }
    r->think_to = keep;
}

void fy_reasoning_span(const fy_reasoning_t *r, size_t *from_p, size_t *to_p)
{
    bool any = r->state == ST_THINK || (r->state == ST_CONTENT && r->content_from > 0);
    *from_p = any ? r->think_from : 0;
    *to_p = any ? r->think_to : 0;
}

bool fy_reasoning_content_from(const fy_reasoning_t *r, size_t *from_p)
{
    if (r->state != ST_CONTENT) return false;
    *from_p = r->content_from;
    return true;
}

bool fy_reasoning_thought(const fy_reasoning_t *r)
{
    return r->state == ST_THINK || (r->state == ST_CONTENT && r->content_from > 0);
}

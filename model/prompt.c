/*
 * prompt.c - prompts to token ids (see prompt.h).
 */
#include "model/prompt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/chat.h"
#include "common/log.h"
#include "common/mem.h"
#include "model/tokenizer.h"

/* Bytes no chat template writes and no tokenizer merges across. */
#define SENT_OPEN "\x01\x02fy-msg-"
#define SENT_CLOSE "\x02\x01"
#define SENT_OPEN_JSON "\\u0001\\u0002fy-msg-" /* the same through tojson */
#define SENT_CLOSE_JSON "\\u0002\\u0001"

typedef struct ids {
    int32_t *v;
    size_t n, cap;
} ids_t;

static fy_status_t append(const fy_tokenizer_t *tok, ids_t *o, const char *text, size_t len, bool bos, bool special)
{
    size_t need = len + 2; /* a token is at least one byte, and BOS */
    if (o->n + need > o->cap) {
        size_t cap = (o->n + need) * 2 + 16;
        int32_t *v = fy_realloc(o->v, cap * sizeof(int32_t));
        if (!v) return FY_ERR_NOMEM;
        o->v = v;
        o->cap = cap;
    }
    size_t n = 0;
    fy_status_t st = fy_tokenizer_encode(tok, text, len, bos, special, o->v + o->n, o->cap - o->n, &n);
    if (st == FY_OK) o->n += n;
    return st;
}

static fy_status_t finish(ids_t *o, fy_status_t st, int32_t **ids_p, int32_t *n_p);

fy_status_t fy_prompt_tokens(const fy_model_t *m, const char *system, const char *user, bool chat, int32_t **ids_p,
                             int32_t *n_p)
{
    if (!chat) return fy_prompt_text(m, user, strlen(user), false, ids_p, n_p);
    fy_chat_msg_t msgs[2];
    size_t nm = 0;
    if (system) msgs[nm++] = (fy_chat_msg_t){"system", system};
    msgs[nm++] = (fy_chat_msg_t){"user", user};
    return fy_prompt_chat(m, msgs, nm, ids_p, n_p);
}

fy_status_t fy_prompt_text(const fy_model_t *m, const char *text, size_t len, bool parse_special, int32_t **ids_p,
                           int32_t *n_p)
{
    ids_t o = {0};
    fy_status_t st = append(fy_model_tokenizer(m), &o, text, len, true, parse_special);
    return finish(&o, st, ids_p, n_p);
}

fy_status_t fy_prompt_chat(const fy_model_t *m, const fy_chat_msg_t *in, size_t nm, int32_t **ids_p, int32_t *n_p)
{
    return fy_prompt_chat_tools(m, in, NULL, nm, NULL, ids_p, n_p);
}

/* A message's text as json.dumps writes it inside its quotes (the
 * template's tojson put a sentinel there): fy_malloc'd, or NULL. */
static char *json_escaped(const char *s)
{
    size_t n = strlen(s);
    char *o = fy_malloc(n * 6 + 1), *w = o;
    if (!o) return NULL;
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        const char *named = *c == '"'    ? "\\\""
                            : *c == '\\' ? "\\\\"
                            : *c == '\n' ? "\\n"
                            : *c == '\r' ? "\\r"
                            : *c == '\t' ? "\\t"
                            : *c == '\b' ? "\\b"
                            : *c == '\f' ? "\\f"
                                         : NULL;
        if (named)
            w += sprintf(w, "%s", named);
        else if (*c < 0x20)
            w += sprintf(w, "\\u%04x", *c);
        else
            *w++ = (char)*c;
    }
    *w = 0;
    return o;
}

fy_status_t fy_prompt_chat_tools(const fy_model_t *m, const fy_chat_msg_t *in, const char *const *extra, size_t nm,
                                 const char *tools_json, int32_t **ids_p, int32_t *n_p)
{
    return fy_prompt_chat_vars(m, in, extra, nm, tools_json, NULL, ids_p, n_p);
}

fy_status_t fy_prompt_chat_vars(const fy_model_t *m, const fy_chat_msg_t *in, const char *const *extra, size_t nm,
                                const char *tools_json, const char *vars_json, int32_t **ids_p, int32_t *n_p)
{
    const fy_tokenizer_t *tok = fy_model_tokenizer(m);
    ids_t o = {0};
    fy_status_t st;
    if (nm < 1 || nm > FY_PROMPT_MAX_MSGS) {
        fy_error("prompt: %zu messages (1 to %d)", nm, FY_PROMPT_MAX_MSGS);
        return FY_ERR_INVALID;
    }
    /* each message's text replaced by a sentinel naming its index (an
     * empty or absent text stays as it is: there is nothing to protect,
     * and templates test it for truth) */
    fy_chat_msg_t msgs[FY_PROMPT_MAX_MSGS];
    char sent[FY_PROMPT_MAX_MSGS][32];
    int seen[FY_PROMPT_MAX_MSGS] = {0};
    for (size_t i = 0; i < nm; i++) {
        snprintf(sent[i], sizeof(sent[i]), SENT_OPEN "%zu" SENT_CLOSE, i);
        bool text = in[i].content && in[i].content[0];
        msgs[i] = (fy_chat_msg_t){in[i].role, text ? sent[i] : in[i].content};
    }
    char *r = NULL;
    if ((st = fy_chat_template_apply_vars(fy_model_chat_template(m), msgs, extra, nm, tools_json, vars_json, true, &r)))
        return finish(&o, st, ids_p, n_p);
    /* template text (special tokens on) between the messages (special off);
     * BOS where the model wants one, unless the template wrote it already
     * (Gemma's and Llama's begin with {{ bos_token }}: two BOS would be
     * a prompt the model never saw).  A sentinel may also come back as
     * tojson wrote it (Llama 3.1 dumps a tool result's text), and then the
     * message's text goes in as JSON too. */
    const char *p = r;
    int32_t bos = fy_tokenizer_bos(tok);
    const char *bos_text = bos >= 0 ? fy_tokenizer_piece(tok, bos) : NULL;
    bool first = !(bos_text && bos_text[0] && !strncmp(r, bos_text, strlen(bos_text)));
    for (;;) {
        const char *s = strstr(p, SENT_OPEN), *sj = strstr(p, SENT_OPEN_JSON);
        bool js = sj && (!s || sj < s);
        if (js) s = sj;
        size_t seg = s ? (size_t)(s - p) : strlen(p);
        if ((st = append(tok, &o, p, seg, first, true))) break;
        first = false;
        if (!s) break;
        const char *open = js ? SENT_OPEN_JSON : SENT_OPEN, *close = js ? SENT_CLOSE_JSON : SENT_CLOSE;
        char *k;
        unsigned long idx = strtoul(s + strlen(open), &k, 10);
        if (idx >= nm || k == s + strlen(open) || strncmp(k, close, strlen(close)) || msgs[idx].content != sent[idx]) {
            st = FY_ERR_INVALID;
            break;
        }
        char *esc = js ? json_escaped(in[idx].content) : NULL;
        const char *text = js ? esc : in[idx].content;
        st = text ? append(tok, &o, text, strlen(text), false, false) : FY_ERR_NOMEM;
        fy_free(esc);
        if (st) break;
        seen[idx]++;
        p = k + strlen(close);
    }
    fy_free(r);
    for (size_t i = 0; i < nm && st == FY_OK; i++) /* every message's text, once */
        if (msgs[i].content == sent[i] && seen[i] != 1) st = FY_ERR_INVALID;
    if (st == FY_ERR_INVALID) fy_error("prompt: the chat template changed or dropped a message's text");
    return finish(&o, st, ids_p, n_p);
}

static fy_status_t finish(ids_t *po, fy_status_t st, int32_t **ids_p, int32_t *n_p)
{
    ids_t o = *po;
    if (st) {
        fy_free(o.v);
        if (st != FY_ERR_INVALID) fy_error("prompt: cannot tokenize: %s", fy_status_str(st));
        return st;
    }
    if (o.n == 0) {
        fy_free(o.v);
        fy_error("prompt: empty");
        return FY_ERR_INVALID;
    }
    *ids_p = o.v;
    *n_p = (int32_t)o.n;
    return FY_OK;
}

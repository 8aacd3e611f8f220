/*
 * prompt.c - prompts to token ids (see prompt.h).
 */
#include "prompt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "log.h"
#include "mem.h"
#include "tokenizer.h"

/* Bytes no chat template writes and no tokenizer merges across. */
#define SENT_OPEN "\x01\x02fy-msg-"
#define SENT_CLOSE "\x02\x01"

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
    if (!chat) {
        ids_t o = {0};
        fy_status_t st = append(fy_model_tokenizer(m), &o, user, strlen(user), true, false);
        return finish(&o, st, ids_p, n_p);
    }
    fy_chat_msg_t msgs[2];
    size_t nm = 0;
    if (system) msgs[nm++] = (fy_chat_msg_t){"system", system};
    msgs[nm++] = (fy_chat_msg_t){"user", user};
    return fy_prompt_chat(m, msgs, nm, ids_p, n_p);
}

fy_status_t fy_prompt_chat(const fy_model_t *m, const fy_chat_msg_t *in, size_t nm, int32_t **ids_p, int32_t *n_p)
{
    const fy_tokenizer_t *tok = fy_model_tokenizer(m);
    ids_t o = {0};
    fy_status_t st;
    if (nm < 1 || nm > FY_PROMPT_MAX_MSGS) {
        fy_error("prompt: %zu messages (1 to %d)", nm, FY_PROMPT_MAX_MSGS);
        return FY_ERR_INVALID;
    }
    /* each message's text replaced by a sentinel naming its index */
    fy_chat_msg_t msgs[FY_PROMPT_MAX_MSGS];
    char sent[FY_PROMPT_MAX_MSGS][32];
    for (size_t i = 0; i < nm; i++) {
        snprintf(sent[i], sizeof(sent[i]), SENT_OPEN "%zu" SENT_CLOSE, i);
        msgs[i] = (fy_chat_msg_t){in[i].role, sent[i]};
    }
    char *r = NULL;
    if ((st = fy_chat_template_apply(fy_model_chat_template(m), msgs, nm, true, &r))) return finish(&o, st, ids_p, n_p);
    /* template text (special tokens on) between the messages (special off);
     * BOS where the model wants one, unless the template wrote it already
     * (Gemma's and Llama's begin with {{ bos_token }}: two BOS would be
     * a prompt the model never saw) */
    const char *p = r;
    int32_t bos = fy_tokenizer_bos(tok);
    const char *bos_text = bos >= 0 ? fy_tokenizer_piece(tok, bos) : NULL;
    bool first = !(bos_text && bos_text[0] && !strncmp(r, bos_text, strlen(bos_text)));
    size_t seen = 0;
    for (;;) {
        const char *s = strstr(p, SENT_OPEN);
        size_t seg = s ? (size_t)(s - p) : strlen(p);
        if ((st = append(tok, &o, p, seg, first, true))) break;
        first = false;
        if (!s) break;
        char *k;
        unsigned long idx = strtoul(s + strlen(SENT_OPEN), &k, 10);
        if (idx >= nm || k == s + strlen(SENT_OPEN) || strncmp(k, SENT_CLOSE, strlen(SENT_CLOSE))) {
            st = FY_ERR_INVALID;
            break;
        }
        const char *text = in[idx].content;
        if ((st = append(tok, &o, text, strlen(text), false, false))) break;
        seen++;
        p = k + strlen(SENT_CLOSE);
    }
    fy_free(r);
    if (st == FY_OK && seen != nm) st = FY_ERR_INVALID; /* every message, once */
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

/*
 * prompt.c - prompts to token ids (see prompt.h).
 */
#include "prompt.h"

#include <stdio.h>
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

fy_status_t fy_prompt_tokens(const fy_model_t *m, const char *system, const char *user, bool chat, int32_t **ids_p,
                             int32_t *n_p)
{
    const fy_tokenizer_t *tok = fy_model_tokenizer(m);
    ids_t o = {0};
    fy_status_t st;
    if (!chat) {
        st = append(tok, &o, user, strlen(user), true, false);
        goto done;
    }
    const char *texts[2];
    fy_chat_msg_t msgs[2];
    size_t nm = 0;
    if (system) texts[nm] = system, msgs[nm++] = (fy_chat_msg_t){"system", SENT_OPEN "0" SENT_CLOSE};
    texts[nm] = user, msgs[nm] = (fy_chat_msg_t){"user", nm ? SENT_OPEN "1" SENT_CLOSE : SENT_OPEN "0" SENT_CLOSE};
    nm++;
    char *r = NULL;
    if ((st = fy_chat_template_apply(fy_model_chat_template(m), msgs, nm, true, &r))) goto done;
    /* template text (special tokens on) between the messages (special off) */
    const char *p = r;
    bool first = true;
    size_t seen = 0;
    for (;;) {
        const char *s = strstr(p, SENT_OPEN);
        size_t seg = s ? (size_t)(s - p) : strlen(p);
        if ((st = append(tok, &o, p, seg, first, true))) break;
        first = false;
        if (!s) break;
        const char *k = s + strlen(SENT_OPEN);
        unsigned idx = (unsigned)(*k - '0');
        if (idx >= nm || strncmp(k + 1, SENT_CLOSE, strlen(SENT_CLOSE))) {
            st = FY_ERR_INVALID;
            break;
        }
        if ((st = append(tok, &o, texts[idx], strlen(texts[idx]), false, false))) break;
        seen++;
        p = k + 1 + strlen(SENT_CLOSE);
    }
    fy_free(r);
    if (st == FY_OK && seen != nm) st = FY_ERR_INVALID;
    if (st == FY_ERR_INVALID) fy_error("prompt: the chat template changed or dropped a message's text");
done:
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

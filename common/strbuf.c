/* strbuf.c - a growing string with a sticky out-of-memory flag. */
#include "common/strbuf.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/mem.h"

/* the first allocation: a line or two of a report without growing */
#define STRBUF_MIN 1024

void fy_strbuf_reserve(fy_strbuf_t *b, size_t more)
{
    if (b->oom) return;
    size_t need;
    if (!fy_add_size(b->len, more, &need) || !fy_add_size(need, 1, &need)) {
        b->oom = true;
        return;
    }
    if (b->p && need <= b->cap) return;
    size_t cap = b->cap ? b->cap : STRBUF_MIN;
    while (cap < need) cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    char *p = fy_realloc(b->p, cap);
    if (!p) {
        b->oom = true;
        return;
    }
    p[b->len] = '\0';
    b->p = p;
    b->cap = cap;
}

void fy_strbuf_append(fy_strbuf_t *b, const char *s, size_t n)
{
    fy_strbuf_reserve(b, n);
    if (b->oom) return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void fy_strbuf_puts(fy_strbuf_t *b, const char *s) { fy_strbuf_append(b, s, strlen(s)); }

void fy_strbuf_vprintf(fy_strbuf_t *b, const char *fmt, va_list ap)
{
    if (b->oom) return;
    va_list again;
    va_copy(again, ap);
    /* into the room there is; a second time only when it did not fit */
    size_t room = b->p ? b->cap - b->len : 0;
    int n = vsnprintf(b->p ? b->p + b->len : NULL, room, fmt, ap);
    if (n >= 0 && (size_t)n >= room) {
        fy_strbuf_reserve(b, (size_t)n);
        if (!b->oom) vsnprintf(b->p + b->len, b->cap - b->len, fmt, again);
    }
    va_end(again);
    if (b->oom || n < 0) {
        if (b->p) b->p[b->len] = '\0'; /* a failed or cut-short format wrote past len */
        return;
    }
    b->len += (size_t)n;
}

void fy_strbuf_printf(fy_strbuf_t *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fy_strbuf_vprintf(b, fmt, ap);
    va_end(ap);
}

void fy_strbuf_fail(fy_strbuf_t *b) { b->oom = true; }

char *fy_strbuf_take(fy_strbuf_t *b, size_t *len_p)
{
    if (!b->p) fy_strbuf_reserve(b, 0);
    if (b->oom) {
        fy_strbuf_free(b);
        return NULL;
    }
    char *p = b->p;
    if (len_p) *len_p = b->len;
    *b = (fy_strbuf_t){0};
    return p;
}

void fy_strbuf_free(fy_strbuf_t *b)
{
    fy_free(b->p);
    *b = (fy_strbuf_t){0};
}

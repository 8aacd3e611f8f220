/*
 * strbuf.h - a growing NUL-terminated string: appends, printf-appends,
 * and an out-of-memory flag that sticks, so a caller writes a whole
 * report or page and checks once at the end (fy_strbuf_take).
 *
 * Memory comes from common/mem.h (fy_realloc), so tests can fail it.
 * After a failed allocation every later append does nothing and
 * fy_strbuf_take frees what there was and returns NULL: the caller reports
 * the failure, and frees nothing itself.
 *
 * Not for: the wire (common/msg.h writes msgpack) or hot paths (it
 * allocates).  No locking: one thread uses a buffer.
 */
#ifndef FY_STRBUF_H
#define FY_STRBUF_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

/* Start with {0}.  p is NULL until the first append or reserve, then
 * NUL-terminated at len; callers may read p, len and oom, never write
 * them. */
typedef struct fy_strbuf {
    char *p;
    size_t len, cap;
    bool oom; /* an allocation failed: appends since did nothing */
} fy_strbuf_t;

/* Room for more bytes (and the NUL) without another allocation. */
void fy_strbuf_reserve(fy_strbuf_t *b, size_t more);
/* Appends n bytes of s (NULs included: len counts them). */
void fy_strbuf_append(fy_strbuf_t *b, const char *s, size_t n);
void fy_strbuf_puts(fy_strbuf_t *b, const char *s);
/* A format that fails (an encoding error) appends nothing. */
void fy_strbuf_printf(fy_strbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void fy_strbuf_vprintf(fy_strbuf_t *b, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));

/* Marks the text failed, for a caller whose own allocation for it failed
 * (the text would be incomplete): appends do nothing from now on and
 * fy_strbuf_take returns NULL. */
void fy_strbuf_fail(fy_strbuf_t *b);

/* The text, the caller's to fy_free ("" when nothing was appended), and
 * its length in *len_p (may be NULL); NULL when an allocation failed, the
 * text freed.  Either way b is {0} again. */
char *fy_strbuf_take(fy_strbuf_t *b, size_t *len_p);
/* Frees the text; b is {0} again.  Safe after fy_strbuf_take. */
void fy_strbuf_free(fy_strbuf_t *b);

#endif /* FY_STRBUF_H */

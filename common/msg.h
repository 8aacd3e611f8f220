/*
 * msg.h - ferry's wire messages: msgpack maps {v, type, ...}.
 *
 * Every control message between the router, the workers and clients is
 * one msgpack map carrying the protocol version "v" and a "type" string;
 * docs/protocol.md lists each type and its fields.  This file is the
 * codec only: a writer that builds maps, and a reader that checks a
 * buffer's structure before anything looks at it and then hands out
 * fields with their types and ranges checked.  It knows nothing of
 * sockets.
 *
 * The reader's errors are sticky: a handler asks for every field it needs
 * and checks fy_msgr_ok() once; the first failure is kept, with a message
 * naming the field and what was wrong, ready to be sent back.
 */
#ifndef FY_MSG_H
#define FY_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

#include "common/status.h"

#define FY_PROTO_VERSION 1
#define FY_MSG_MAX_DEPTH 8 /* nesting of maps and arrays */
#define FY_MSG_MAX_KEYS 64 /* entries in one map */
#define FY_MSG_TYPE_MAX 32 /* bytes of a type name */
#define FY_MSG_ERR_MAX 256

/* ---- writing ------------------------------------------------------------------------------ */

typedef struct fy_msgw {
    char *buf;
    size_t len, cap;
    msgpack_packer pk;
    size_t map_at[FY_MSG_MAX_DEPTH]; /* offset of each open map's header */
    uint32_t map_n[FY_MSG_MAX_DEPTH];
    int depth;
    bool failed; /* out of memory or misuse; fy_msgw_finish reports it */
} fy_msgw_t;

/* Starts a message: the top-level map with "v" and "type". */
void fy_msgw_init(fy_msgw_t *w, const char *type);
void fy_msgw_u64(fy_msgw_t *w, const char *key, uint64_t v);
void fy_msgw_i64(fy_msgw_t *w, const char *key, int64_t v);
void fy_msgw_f64(fy_msgw_t *w, const char *key, double v);
void fy_msgw_bool(fy_msgw_t *w, const char *key, bool v);
void fy_msgw_str(fy_msgw_t *w, const char *key, const char *s); /* NUL-terminated */
void fy_msgw_strn(fy_msgw_t *w, const char *key, const char *s, size_t n);
void fy_msgw_bin(fy_msgw_t *w, const char *key, const void *p, size_t n);
void fy_msgw_i32s(fy_msgw_t *w, const char *key, const int32_t *v, int32_t n);
void fy_msgw_u64s(fy_msgw_t *w, const char *key, const uint64_t *v, int32_t n);
void fy_msgw_f32s(fy_msgw_t *w, const char *key, const float *v, int32_t n);
void fy_msgw_strs(fy_msgw_t *w, const char *key, const char *const *v, int32_t n);
/* A nested map under key, closed by fy_msgw_map_end. */
void fy_msgw_map_begin(fy_msgw_t *w, const char *key);
void fy_msgw_map_end(fy_msgw_t *w);
/* Closes the message.  On success *buf_p (fy_free it) and *len_p hold the
 * bytes and the writer is empty; on failure (FY_ERR_NOMEM, or FY_ERR_INTERNAL
 * for unbalanced maps) nothing is returned.  Either way w needs no freeing. */
fy_status_t fy_msgw_finish(fy_msgw_t *w, void **buf_p, size_t *len_p);
/* Drops an unfinished message. */
void fy_msgw_discard(fy_msgw_t *w);

/* ---- reading ------------------------------------------------------------------------------ */

typedef enum fy_msg_need {
    FY_OPT = 0, /* absent: the default */
    FY_REQ = 1, /* absent: an error */
} fy_msg_need_t;

typedef struct fy_msgr {
    msgpack_unpacked u;
    const msgpack_object *root, *cur; /* cur: the map fields are read from */
    const msgpack_object *stack[FY_MSG_MAX_DEPTH];
    int depth;
    char type[FY_MSG_TYPE_MAX + 1];
    bool ok;
    fy_status_t status; /* of the first error */
    char err[FY_MSG_ERR_MAX];
} fy_msgr_t;

/*
 * Checks and unpacks one message: a single msgpack map (nothing after it)
 * whose every length and count fits in the buffer, nested at most
 * FY_MSG_MAX_DEPTH deep, maps of at most FY_MSG_MAX_KEYS string keys
 * without duplicates, "v" equal to FY_PROTO_VERSION and a "type" string.
 * FY_ERR_FORMAT (r->err says why) or FY_ERR_MISMATCH for another version.
 * Call fy_msgr_free afterwards in every case.
 */
fy_status_t fy_msgr_parse(fy_msgr_t *r, const void *buf, size_t len);
void fy_msgr_free(fy_msgr_t *r);

static inline bool fy_msgr_ok(const fy_msgr_t *r) { return r->ok; }
static inline const char *fy_msgr_type(const fy_msgr_t *r) { return r->type; }
/* Records an error of the caller's (a cross-field check); the first one stays. */
void fy_msgr_fail(fy_msgr_t *r, fy_status_t st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
bool fy_msgr_has(const fy_msgr_t *r, const char *key);
/* The field is there and not nil (an optional field's nil reads as absent). */
bool fy_msgr_present(const fy_msgr_t *r, const char *key);
/* Entries of the array under key; 0 when absent, not an array, or after an error. */
int32_t fy_msgr_count(const fy_msgr_t *r, const char *key);

/* Field getters: the value, or def when the field is absent (FY_OPT) or
 * anything failed (then r records why, naming the field). */
uint64_t fy_msgr_u64(fy_msgr_t *r, const char *key, fy_msg_need_t need, uint64_t def, uint64_t lo, uint64_t hi);
int64_t fy_msgr_i64(fy_msgr_t *r, const char *key, fy_msg_need_t need, int64_t def, int64_t lo, int64_t hi);
double fy_msgr_f64(fy_msgr_t *r, const char *key, fy_msg_need_t need, double def, double lo, double hi);
bool fy_msgr_bool(fy_msgr_t *r, const char *key, fy_msg_need_t need, bool def);
/* Copies a string of at most cap - 1 bytes, NUL-terminated, without NUL
 * bytes inside; absent optional: def copied (NULL: empty).  Returns its length. */
size_t fy_msgr_str(fy_msgr_t *r, const char *key, fy_msg_need_t need, const char *def, char *buf, size_t cap);
/* A string or bin field in place (not NUL-terminated), at most max bytes. */
const void *fy_msgr_bytes(fy_msgr_t *r, const char *key, fy_msg_need_t need, size_t max, size_t *len_p);
/* An array of integers in [lo, hi], at most cap of them, into out; returns the count. */
int32_t fy_msgr_i32s(fy_msgr_t *r, const char *key, fy_msg_need_t need, int32_t *out, int32_t cap, int32_t lo,
                     int32_t hi);
int32_t fy_msgr_u64s(fy_msgr_t *r, const char *key, fy_msg_need_t need, uint64_t *out, int32_t cap);
int32_t fy_msgr_f32s(fy_msgr_t *r, const char *key, fy_msg_need_t need, float *out, int32_t cap);
/* An array of strings: at most cap, each at most max_len bytes; pointers
 * into the message (valid until fy_msgr_free) with their lengths. */
int32_t fy_msgr_strs(fy_msgr_t *r, const char *key, fy_msg_need_t need, const char **out, size_t *lens, int32_t cap,
                     size_t max_len);
/* Reads the following fields from the nested map under key; false (and,
 * when required, an error) if it is absent or not a map. */
bool fy_msgr_enter(fy_msgr_t *r, const char *key, fy_msg_need_t need);
void fy_msgr_leave(fy_msgr_t *r);

#endif /* FY_MSG_H */

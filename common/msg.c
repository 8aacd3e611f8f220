/*
 * msg.c - the msgpack codec of ferry's wire messages (see msg.h).
 *
 * Writing goes through msgpack-c's packer into a growing buffer; a map's
 * header is written as map32 with a zero count and patched when the map
 * closes, so callers never count their fields.
 *
 * Reading first walks the raw bytes with a bounded scanner: every str,
 * bin and ext length and every array and map count must fit in what is
 * left of the buffer (an element takes at least one byte), and nesting is
 * bounded.  Only then does msgpack-c unpack it, so a five-byte header
 * claiming four billion elements is refused before msgpack-c would
 * allocate for them.
 */
#include "common/msg.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/mem.h"

/* ---- writing ------------------------------------------------------------------------------ */

static int w_write(void *data, const char *buf, size_t len)
{
    fy_msgw_t *w = data;
    if (w->failed) return -1;
    if (w->len + len > w->cap) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap < w->len + len) cap *= 2;
        char *b = fy_realloc(w->buf, cap);
        if (!b) {
            w->failed = true;
            return -1;
        }
        w->buf = b;
        w->cap = cap;
    }
    memcpy(w->buf + w->len, buf, len);
    w->len += len;
    return 0;
}

static void w_key(fy_msgw_t *w, const char *key)
{
    if (w->depth < 1) {
        w->failed = true;
        return;
    }
    w->map_n[w->depth - 1]++;
    size_t n = strlen(key);
    msgpack_pack_str(&w->pk, n);
    msgpack_pack_str_body(&w->pk, key, n);
}

static void w_open_map(fy_msgw_t *w)
{
    if (w->depth >= FY_MSG_MAX_DEPTH) {
        w->failed = true;
        return;
    }
    w->map_at[w->depth] = w->len;
    w->map_n[w->depth] = 0;
    w->depth++;
    const char hdr[5] = {(char)0xdf, 0, 0, 0, 0};
    w_write(w, hdr, sizeof(hdr));
}

void fy_msgw_init(fy_msgw_t *w, const char *type)
{
    memset(w, 0, sizeof(*w));
    msgpack_packer_init(&w->pk, w, w_write);
    w_open_map(w);
    fy_msgw_u64(w, "v", FY_PROTO_VERSION);
    fy_msgw_str(w, "type", type);
}

void fy_msgw_u64(fy_msgw_t *w, const char *key, uint64_t v)
{
    w_key(w, key);
    msgpack_pack_uint64(&w->pk, v);
}

void fy_msgw_i64(fy_msgw_t *w, const char *key, int64_t v)
{
    w_key(w, key);
    msgpack_pack_int64(&w->pk, v);
}

void fy_msgw_f64(fy_msgw_t *w, const char *key, double v)
{
    w_key(w, key);
    msgpack_pack_double(&w->pk, v);
}

void fy_msgw_bool(fy_msgw_t *w, const char *key, bool v)
{
    w_key(w, key);
    if (v)
        msgpack_pack_true(&w->pk);
    else
        msgpack_pack_false(&w->pk);
}

void fy_msgw_strn(fy_msgw_t *w, const char *key, const char *s, size_t n)
{
    w_key(w, key);
    msgpack_pack_str(&w->pk, n);
    msgpack_pack_str_body(&w->pk, s, n);
}

void fy_msgw_str(fy_msgw_t *w, const char *key, const char *s) { fy_msgw_strn(w, key, s ? s : "", s ? strlen(s) : 0); }

void fy_msgw_bin(fy_msgw_t *w, const char *key, const void *p, size_t n)
{
    w_key(w, key);
    msgpack_pack_bin(&w->pk, n);
    msgpack_pack_bin_body(&w->pk, p, n);
}

void fy_msgw_i32s(fy_msgw_t *w, const char *key, const int32_t *v, int32_t n)
{
    w_key(w, key);
    msgpack_pack_array(&w->pk, (size_t)n);
    for (int32_t i = 0; i < n; i++) msgpack_pack_int32(&w->pk, v[i]);
}

void fy_msgw_u64s(fy_msgw_t *w, const char *key, const uint64_t *v, int32_t n)
{
    w_key(w, key);
    msgpack_pack_array(&w->pk, (size_t)n);
    for (int32_t i = 0; i < n; i++) msgpack_pack_uint64(&w->pk, v[i]);
}

void fy_msgw_f32s(fy_msgw_t *w, const char *key, const float *v, int32_t n)
{
    w_key(w, key);
    msgpack_pack_array(&w->pk, (size_t)n);
    for (int32_t i = 0; i < n; i++) msgpack_pack_float(&w->pk, v[i]);
}

void fy_msgw_strs(fy_msgw_t *w, const char *key, const char *const *v, int32_t n)
{
    w_key(w, key);
    msgpack_pack_array(&w->pk, (size_t)n);
    for (int32_t i = 0; i < n; i++) {
        size_t len = strlen(v[i]);
        msgpack_pack_str(&w->pk, len);
        msgpack_pack_str_body(&w->pk, v[i], len);
    }
}

void fy_msgw_map_begin(fy_msgw_t *w, const char *key)
{
    w_key(w, key);
    w_open_map(w);
}

static void w_close_map(fy_msgw_t *w)
{
    if (w->depth < 1) {
        w->failed = true;
        return;
    }
    w->depth--;
    if (w->failed) return;
    uint32_t n = w->map_n[w->depth];
    unsigned char *h = (unsigned char *)w->buf + w->map_at[w->depth] + 1;
    h[0] = (unsigned char)(n >> 24);
    h[1] = (unsigned char)(n >> 16);
    h[2] = (unsigned char)(n >> 8);
    h[3] = (unsigned char)n;
}

void fy_msgw_map_end(fy_msgw_t *w)
{
    if (w->depth < 2) { /* the top-level map closes in finish */
        w->failed = true;
        return;
    }
    w_close_map(w);
}

void fy_msgw_discard(fy_msgw_t *w)
{
    fy_free(w->buf);
    memset(w, 0, sizeof(*w));
}

fy_status_t fy_msgw_finish(fy_msgw_t *w, void **buf_p, size_t *len_p)
{
    fy_status_t st = FY_OK;
    if (w->depth != 1) st = FY_ERR_INTERNAL;
    if (st == FY_OK) w_close_map(w);
    if (st == FY_OK && w->failed) st = FY_ERR_NOMEM;
    if (st != FY_OK) {
        fy_msgw_discard(w);
        return st;
    }
    *buf_p = w->buf;
    *len_p = w->len;
    memset(w, 0, sizeof(*w));
    return FY_OK;
}

/* ---- the structural scan ---------------------------------------------------------------------- */

static uint64_t be(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = v << 8 | p[i];
    return v;
}

/* Walks one msgpack value tree over buf[len]: every length and count
 * fits in what is left, depth bounded, no ext types.  Returns the bytes
 * the tree took, 0 on error (msg says why). */
static size_t scan(const unsigned char *buf, size_t len, char *msg, size_t cap)
{
    uint64_t left[FY_MSG_MAX_DEPTH + 1]; /* elements still to read at each open level */
    int depth = 0;
    size_t off = 0;
    left[0] = 1;
    for (;;) {
        while (depth >= 0 && left[depth] == 0) depth--;
        if (depth < 0) return off;
        left[depth]--;
        if (off >= len) goto truncated;
        unsigned c = buf[off++];
        uint64_t n = 0; /* payload bytes to skip */
        uint64_t elems = 0;
        bool container = false;
        if (c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3) {
            n = 0;
        } else if (c >= 0x80 && c <= 0x8f) {
            container = true, elems = 2 * (uint64_t)(c & 0x0f);
        } else if (c >= 0x90 && c <= 0x9f) {
            container = true, elems = c & 0x0f;
        } else if (c >= 0xa0 && c <= 0xbf) {
            n = c & 0x1f;
        } else {
            int w = 0; /* width of the length or count field */
            switch (c) {
            case 0xc4:
            case 0xd9: w = 1; break;
            case 0xc5:
            case 0xda: w = 2; break;
            case 0xc6:
            case 0xdb: w = 4; break;
            case 0xca: n = 4; break;
            case 0xcb: n = 8; break;
            case 0xcc:
            case 0xd0: n = 1; break;
            case 0xcd:
            case 0xd1: n = 2; break;
            case 0xce:
            case 0xd2: n = 4; break;
            case 0xcf:
            case 0xd3: n = 8; break;
            case 0xdc: container = true, w = 2; break;
            case 0xdd: container = true, w = 4; break;
            case 0xde: container = true, w = 2; break;
            case 0xdf: container = true, w = 4; break;
            default: snprintf(msg, cap, "byte %zu: type 0x%02x is not used by the protocol", off - 1, c); return 0;
            }
            if (w) {
                if (len - off < (size_t)w) goto truncated;
                uint64_t v = be(buf + off, w);
                off += (size_t)w;
                if (container)
                    elems = (c == 0xde || c == 0xdf) ? 2 * v : v;
                else
                    n = v;
            }
        }
        if (container) {
            if (elems > len - off) {
                snprintf(msg, cap, "byte %zu: %llu elements claimed, %zu bytes left", off, (unsigned long long)elems,
                         len - off);
                return 0;
            }
            if (elems) {
                if (depth + 1 > FY_MSG_MAX_DEPTH) {
                    snprintf(msg, cap, "nested deeper than %d", FY_MSG_MAX_DEPTH);
                    return 0;
                }
                left[++depth] = elems;
            }
        } else {
            if (n > len - off) goto truncated;
            off += (size_t)n;
        }
    }
truncated:
    snprintf(msg, cap, "truncated at byte %zu of %zu", off, len);
    return 0;
}

/* ---- reading ------------------------------------------------------------------------------ */

void fy_msgr_fail(fy_msgr_t *r, fy_status_t st, const char *fmt, ...)
{
    if (!r->ok) return;
    r->ok = false;
    r->status = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err, sizeof(r->err), fmt, ap);
    va_end(ap);
}

/* key is n bytes long */
static bool key_is(const msgpack_object *k, const char *key, size_t n)
{
    /* n == 0 first: msgpack-c gives an empty string a NULL pointer, which memcmp may not take */
    return k->type == MSGPACK_OBJECT_STR && k->via.str.size == n && (n == 0 || !memcmp(k->via.str.ptr, key, n));
}

/* Maps: string keys, at most FY_MSG_MAX_KEYS, no key twice, all the way down. */
static bool check_maps(fy_msgr_t *r, const msgpack_object *o, int depth)
{
    if (depth > FY_MSG_MAX_DEPTH) {
        fy_msgr_fail(r, FY_ERR_FORMAT, "malformed message: nested deeper than %d", FY_MSG_MAX_DEPTH);
        return false;
    }
    if (o->type == MSGPACK_OBJECT_ARRAY) {
        for (uint32_t i = 0; i < o->via.array.size; i++)
            if (!check_maps(r, &o->via.array.ptr[i], depth + 1)) return false;
    } else if (o->type == MSGPACK_OBJECT_MAP) {
        const msgpack_object_map *m = &o->via.map;
        if (m->size > FY_MSG_MAX_KEYS) {
            fy_msgr_fail(r, FY_ERR_FORMAT, "malformed message: a map of %u entries (at most %d)", m->size,
                         FY_MSG_MAX_KEYS);
            return false;
        }
        for (uint32_t i = 0; i < m->size; i++) {
            const msgpack_object *k = &m->ptr[i].key;
            if (k->type != MSGPACK_OBJECT_STR) {
                fy_msgr_fail(r, FY_ERR_FORMAT, "malformed message: a map key is not a string");
                return false;
            }
            for (uint32_t j = 0; j < i; j++) {
                const msgpack_object *kj = &m->ptr[j].key;
                if (kj->via.str.size == k->via.str.size &&
                    (k->via.str.size == 0 || !memcmp(kj->via.str.ptr, k->via.str.ptr, k->via.str.size))) {
                    fy_msgr_fail(r, FY_ERR_FORMAT, "malformed message: key '%.*s' appears twice",
                                 (int)(k->via.str.size > 32 ? 32 : k->via.str.size), k->via.str.ptr);
                    return false;
                }
            }
            if (!check_maps(r, &m->ptr[i].val, depth + 1)) return false;
        }
    }
    return true;
}

static const msgpack_object *field(const fy_msgr_t *r, const char *key)
{
    if (!r->cur) return NULL;
    const msgpack_object_map *m = &r->cur->via.map;
    size_t n = strlen(key);
    for (uint32_t i = 0; i < m->size; i++)
        if (key_is(&m->ptr[i].key, key, n)) return &m->ptr[i].val;
    return NULL;
}

fy_status_t fy_msgr_parse(fy_msgr_t *r, const void *buf, size_t len)
{
    memset(r, 0, sizeof(*r));
    r->ok = true;
    msgpack_unpacked_init(&r->u);
    char why[160];
    if (!buf || len == 0) {
        fy_msgr_fail(r, FY_ERR_FORMAT, "malformed message: empty");
        return r->status;
    }
    size_t used = scan(buf, len, why, sizeof(why));
    if (used == 0) {
        fy_msgr_fail(r, FY_ERR_FORMAT, "malformed message: %s", why);
        return r->status;
    }
    if (used != len) {
        fy_msgr_fail(r, FY_ERR_FORMAT, "malformed message: %zu bytes after the message", len - used);
        return r->status;
    }
    size_t off = 0;
    msgpack_unpack_return ret = msgpack_unpack_next(&r->u, buf, len, &off);
    if (ret != MSGPACK_UNPACK_SUCCESS || off != len) {
        fy_msgr_fail(r, ret == MSGPACK_UNPACK_NOMEM_ERROR ? FY_ERR_NOMEM : FY_ERR_FORMAT,
                     "malformed message: msgpack unpack failed (%d)", (int)ret);
        return r->status;
    }
    r->root = &r->u.data;
    if (r->root->type != MSGPACK_OBJECT_MAP) {
        fy_msgr_fail(r, FY_ERR_FORMAT, "malformed message: not a map");
        return r->status;
    }
    if (!check_maps(r, r->root, 0)) return r->status;
    r->cur = r->root;
    const msgpack_object *v = field(r, "v");
    if (!v || v->type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
        fy_msgr_fail(r, FY_ERR_FORMAT, "malformed message: no protocol version \"v\"");
        return r->status;
    }
    if (v->via.u64 != FY_PROTO_VERSION) {
        fy_msgr_fail(r, FY_ERR_MISMATCH, "protocol version %llu; this side speaks %d", (unsigned long long)v->via.u64,
                     FY_PROTO_VERSION);
        return r->status;
    }
    const msgpack_object *t = field(r, "type");
    if (!t || t->type != MSGPACK_OBJECT_STR || t->via.str.size == 0 || t->via.str.size > FY_MSG_TYPE_MAX) {
        fy_msgr_fail(r, FY_ERR_FORMAT, "malformed message: no \"type\" string (1 to %d bytes)", FY_MSG_TYPE_MAX);
        return r->status;
    }
    for (uint32_t i = 0; i < t->via.str.size; i++) {
        char c = t->via.str.ptr[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) {
            fy_msgr_fail(r, FY_ERR_FORMAT, "malformed message: type name with a byte outside [a-z0-9_]");
            return r->status;
        }
    }
    memcpy(r->type, t->via.str.ptr, t->via.str.size);
    r->type[t->via.str.size] = 0;
    return FY_OK;
}

void fy_msgr_free(fy_msgr_t *r)
{
    msgpack_unpacked_destroy(&r->u);
    r->root = r->cur = NULL;
}

bool fy_msgr_has(const fy_msgr_t *r, const char *key) { return field(r, key) != NULL; }

bool fy_msgr_present(const fy_msgr_t *r, const char *key)
{
    const msgpack_object *o = field(r, key);
    return o && o->type != MSGPACK_OBJECT_NIL;
}

int32_t fy_msgr_count(const fy_msgr_t *r, const char *key)
{
    const msgpack_object *o = r->ok ? field(r, key) : NULL;
    if (!o || o->type != MSGPACK_OBJECT_ARRAY) return 0;
    return o->via.array.size > INT32_MAX ? INT32_MAX : (int32_t)o->via.array.size;
}

/* The field, or NULL when absent (an error if required) or after an error. */
static const msgpack_object *get(fy_msgr_t *r, const char *key, fy_msg_need_t need)
{
    if (!r->ok) return NULL;
    const msgpack_object *o = field(r, key);
    if (!o && need == FY_REQ) fy_msgr_fail(r, FY_ERR_FORMAT, "field '%s' is missing", key);
    if (o && o->type == MSGPACK_OBJECT_NIL && need == FY_OPT) return NULL; /* nil: absent */
    return o;
}

static bool as_u64(const msgpack_object *o, uint64_t *v)
{
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        *v = o->via.u64;
        return true;
    }
    return false;
}

static bool as_i64(const msgpack_object *o, int64_t *v)
{
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= INT64_MAX) {
        *v = (int64_t)o->via.u64;
        return true;
    }
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        *v = o->via.i64;
        return true;
    }
    return false;
}

static bool as_f64(const msgpack_object *o, double *v)
{
    int64_t i;
    if (o->type == MSGPACK_OBJECT_FLOAT32 || o->type == MSGPACK_OBJECT_FLOAT64) {
        *v = o->via.f64;
        return true;
    }
    if (as_i64(o, &i)) {
        *v = (double)i;
        return true;
    }
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        *v = (double)o->via.u64;
        return true;
    }
    return false;
}

uint64_t fy_msgr_u64(fy_msgr_t *r, const char *key, fy_msg_need_t need, uint64_t def, uint64_t lo, uint64_t hi)
{
    const msgpack_object *o = get(r, key, need);
    if (!o) return def;
    uint64_t v;
    if (!as_u64(o, &v) || v < lo || v > hi) {
        fy_msgr_fail(r, FY_ERR_FORMAT, "field '%s' must be an integer in [%llu, %llu]", key, (unsigned long long)lo,
                     (unsigned long long)hi);
        return def;
    }
    return v;
}

int64_t fy_msgr_i64(fy_msgr_t *r, const char *key, fy_msg_need_t need, int64_t def, int64_t lo, int64_t hi)
{
    const msgpack_object *o = get(r, key, need);
    if (!o) return def;
    int64_t v;
    if (!as_i64(o, &v) || v < lo || v > hi) {
        fy_msgr_fail(r, FY_ERR_FORMAT, "field '%s' must be an integer in [%lld, %lld]", key, (long long)lo,
                     (long long)hi);
        return def;
    }
    return v;
}

double fy_msgr_f64(fy_msgr_t *r, const char *key, fy_msg_need_t need, double def, double lo, double hi)
{
    const msgpack_object *o = get(r, key, need);
    if (!o) return def;
    double v;
    if (!as_f64(o, &v) || !(v >= lo && v <= hi)) { /* NaN fails too */
        fy_msgr_fail(r, FY_ERR_FORMAT, "field '%s' must be a number in [%g, %g]", key, lo, hi);
        return def;
    }
    return v;
}

bool fy_msgr_bool(fy_msgr_t *r, const char *key, fy_msg_need_t need, bool def)
{
    const msgpack_object *o = get(r, key, need);
    if (!o) return def;
    if (o->type != MSGPACK_OBJECT_BOOLEAN) {
        fy_msgr_fail(r, FY_ERR_FORMAT, "field '%s' must be true or false", key);
        return def;
    }
    return o->via.boolean;
}

const void *fy_msgr_bytes(fy_msgr_t *r, const char *key, fy_msg_need_t need, size_t max, size_t *len_p)
{
    *len_p = 0;
    const msgpack_object *o = get(r, key, need);
    if (!o) return NULL;
    const char *p;
    size_t n;
    if (o->type == MSGPACK_OBJECT_STR) {
        p = o->via.str.ptr, n = o->via.str.size;
    } else if (o->type == MSGPACK_OBJECT_BIN) {
        p = o->via.bin.ptr, n = o->via.bin.size;
    } else {
        fy_msgr_fail(r, FY_ERR_FORMAT, "field '%s' must be a string or bytes", key);
        return NULL;
    }
    if (n > max) {
        fy_msgr_fail(r, FY_ERR_FORMAT, "field '%s' is %zu bytes; at most %zu", key, n, max);
        return NULL;
    }
    *len_p = n;
    return n ? p : "";
}

size_t fy_msgr_str(fy_msgr_t *r, const char *key, fy_msg_need_t need, const char *def, char *buf, size_t cap)
{
    const msgpack_object *o = get(r, key, need);
    if (!o || !r->ok) {
        snprintf(buf, cap, "%s", def ? def : "");
        return strlen(buf);
    }
    if (o->type != MSGPACK_OBJECT_STR) {
        fy_msgr_fail(r, FY_ERR_FORMAT, "field '%s' must be a string", key);
        snprintf(buf, cap, "%s", def ? def : "");
        return strlen(buf);
    }
    size_t n = o->via.str.size;
    if (n >= cap || (n && memchr(o->via.str.ptr, 0, n))) {
        fy_msgr_fail(r, FY_ERR_FORMAT, "field '%s' must be a string of at most %zu bytes without NUL", key, cap - 1);
        snprintf(buf, cap, "%s", def ? def : "");
        return strlen(buf);
    }
    memcpy(buf, o->via.str.ptr, n);
    buf[n] = 0;
    return n;
}

static const msgpack_object_array *get_array(fy_msgr_t *r, const char *key, fy_msg_need_t need, int32_t cap)
{
    const msgpack_object *o = get(r, key, need);
    if (!o) return NULL;
    if (o->type != MSGPACK_OBJECT_ARRAY) {
        fy_msgr_fail(r, FY_ERR_FORMAT, "field '%s' must be an array", key);
        return NULL;
    }
    if (o->via.array.size > (uint32_t)cap) {
        fy_msgr_fail(r, FY_ERR_FORMAT, "field '%s' has %u entries; at most %d", key, o->via.array.size, cap);
        return NULL;
    }
    return &o->via.array;
}

int32_t fy_msgr_i32s(fy_msgr_t *r, const char *key, fy_msg_need_t need, int32_t *out, int32_t cap, int32_t lo,
                     int32_t hi)
{
    const msgpack_object_array *a = get_array(r, key, need, cap);
    if (!a) return 0;
    for (uint32_t i = 0; i < a->size; i++) {
        int64_t v;
        if (!as_i64(&a->ptr[i], &v) || v < lo || v > hi) {
            fy_msgr_fail(r, FY_ERR_FORMAT, "field '%s': entry %u must be an integer in [%d, %d]", key, i, lo, hi);
            return 0;
        }
        out[i] = (int32_t)v;
    }
    return (int32_t)a->size;
}

int32_t fy_msgr_u64s(fy_msgr_t *r, const char *key, fy_msg_need_t need, uint64_t *out, int32_t cap)
{
    const msgpack_object_array *a = get_array(r, key, need, cap);
    if (!a) return 0;
    for (uint32_t i = 0; i < a->size; i++) {
        if (!as_u64(&a->ptr[i], &out[i])) {
            fy_msgr_fail(r, FY_ERR_FORMAT, "field '%s': entry %u must be a non-negative integer", key, i);
            return 0;
        }
    }
    return (int32_t)a->size;
}

int32_t fy_msgr_f32s(fy_msgr_t *r, const char *key, fy_msg_need_t need, float *out, int32_t cap)
{
    const msgpack_object_array *a = get_array(r, key, need, cap);
    if (!a) return 0;
    for (uint32_t i = 0; i < a->size; i++) {
        double v;
        if (!as_f64(&a->ptr[i], &v)) {
            fy_msgr_fail(r, FY_ERR_FORMAT, "field '%s': entry %u must be a number", key, i);
            return 0;
        }
        out[i] = (float)v;
    }
    return (int32_t)a->size;
}

int32_t fy_msgr_strs(fy_msgr_t *r, const char *key, fy_msg_need_t need, const char **out, size_t *lens, int32_t cap,
                     size_t max_len)
{
    const msgpack_object_array *a = get_array(r, key, need, cap);
    if (!a) return 0;
    for (uint32_t i = 0; i < a->size; i++) {
        const msgpack_object *o = &a->ptr[i];
        if (o->type != MSGPACK_OBJECT_STR || o->via.str.size > max_len || o->via.str.size == 0) {
            fy_msgr_fail(r, FY_ERR_FORMAT, "field '%s': entry %u must be a string of 1 to %zu bytes", key, i, max_len);
            return 0;
        }
        out[i] = o->via.str.ptr;
        lens[i] = o->via.str.size;
    }
    return (int32_t)a->size;
}

bool fy_msgr_enter(fy_msgr_t *r, const char *key, fy_msg_need_t need)
{
    const msgpack_object *o = get(r, key, need);
    if (!o) return false;
    if (o->type != MSGPACK_OBJECT_MAP) {
        fy_msgr_fail(r, FY_ERR_FORMAT, "field '%s' must be a map", key);
        return false;
    }
    if (r->depth >= FY_MSG_MAX_DEPTH) {
        fy_msgr_fail(r, FY_ERR_INTERNAL, "field '%s': maps entered too deep", key);
        return false;
    }
    r->stack[r->depth++] = r->cur;
    r->cur = o;
    return true;
}

void fy_msgr_leave(fy_msgr_t *r)
{
    if (r->depth > 0) r->cur = r->stack[--r->depth];
}

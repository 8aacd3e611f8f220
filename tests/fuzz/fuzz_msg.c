/*
 * fuzz_msg.c - the msgpack message reader (common/msg.c): the structural
 * scan and unpack of fy_msgr_parse, then every typed getter on every field
 * of every map the message holds, with ranges and capacities taken from
 * the input's last bytes, so that each type check and range check runs
 * on each kind of value.
 *
 * Checks: parse fails with FY_ERR_FORMAT or FY_ERR_MISMATCH and a reason,
 * or gives a map with a valid type name; each getter's value lies inside
 * the range it was given, strings come back NUL-terminated without NUL
 * inside and shorter than their buffer, arrays no longer than their
 * capacity; errors stay sticky (a failed reader keeps its first error);
 * and the message, packed again with msgpack-c, parses again to the same
 * type.  Seeds: the messages of docs/protocol.md as the project's writers
 * build them (fy_msgw, fy_genspec_write, fy_msg_error).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "common/msg.h"
#include "tests/fuzz/util.h"

#define CAP 64

static volatile uint8_t g_sink;

typedef struct limits {
    uint64_t ulo, uhi;
    int64_t ilo, ihi;
    double dlo, dhi;
    int32_t i32lo, i32hi, cap;
    size_t max, strcap;
} limits_t;

static void get_limits(fz_in_t *in, limits_t *l)
{
    l->ulo = fz_u8(in) & 1 ? fz_u64(in) : 0;
    l->uhi = fz_u8(in) & 1 ? fz_u64(in) : UINT64_MAX;
    l->ilo = fz_u8(in) & 1 ? (int64_t)fz_u64(in) : INT64_MIN;
    l->ihi = fz_u8(in) & 1 ? (int64_t)fz_u64(in) : INT64_MAX;
    l->dlo = fz_u8(in) & 1 ? fz_f64(in) : -1e300;
    l->dhi = fz_u8(in) & 1 ? fz_f64(in) : 1e300;
    l->i32lo = (int32_t)fz_u32(in);
    l->i32hi = (int32_t)fz_u32(in);
    l->cap = fz_u8(in) % (CAP + 1);
    l->max = fz_u8(in);
    l->strcap = 1 + fz_u8(in) % 64;
}

static void read_map(fy_msgr_t *r, const limits_t *l, int depth)
{
    const msgpack_object_map *m = &r->cur->via.map;
    for (uint32_t i = 0; i < m->size; i++) {
        const msgpack_object *k = &m->ptr[i].key;
        if (k->type != MSGPACK_OBJECT_STR) continue;
        char *key = fz_strndup(k->via.str.ptr, k->via.str.size);
        for (int need = 0; need < 2; need++) {
            fy_msg_need_t nd = need ? FY_REQ : FY_OPT;
            r->ok = true; /* errors are sticky: start each getter afresh */
            uint64_t u = fy_msgr_u64(r, key, nd, l->ulo, l->ulo, l->uhi);
            FZ_CHECK(!r->ok || u == l->ulo || (u >= l->ulo && u <= l->uhi), "u64 %llu outside its range",
                     (unsigned long long)u);
            r->ok = true;
            int64_t v = fy_msgr_i64(r, key, nd, l->ilo, l->ilo, l->ihi);
            FZ_CHECK(!r->ok || v == l->ilo || (v >= l->ilo && v <= l->ihi), "i64 %lld outside its range", (long long)v);
            r->ok = true;
            double d = fy_msgr_f64(r, key, nd, 0, l->dlo, l->dhi);
            FZ_CHECK(!r->ok || d == 0 || (d >= l->dlo && d <= l->dhi), "f64 %g outside [%g, %g]", d, l->dlo, l->dhi);
            r->ok = true;
            (void)fy_msgr_bool(r, key, nd, false);
            r->ok = true;
            char buf[65];
            size_t n = fy_msgr_str(r, key, nd, "dflt", buf, l->strcap);
            FZ_CHECK(n < l->strcap && strlen(buf) == n, "string of %zu bytes in a %zu-byte buffer", n, l->strcap);
            r->ok = true;
            size_t len;
            const void *p = fy_msgr_bytes(r, key, nd, l->max, &len);
            FZ_CHECK(!p || len <= l->max, "%zu bytes, at most %zu asked", len, l->max);
            if (p && len) g_sink ^= (uint8_t)(((const uint8_t *)p)[0] ^ ((const uint8_t *)p)[len - 1]);
            int32_t i32[CAP];
            uint64_t u64[CAP];
            float f32[CAP];
            const char *strs[CAP];
            size_t lens[CAP];
            r->ok = true;
            int32_t c = fy_msgr_i32s(r, key, nd, i32, l->cap, l->i32lo, l->i32hi);
            FZ_CHECK(c >= 0 && c <= l->cap, "%d ints, capacity %d", c, l->cap);
            for (int32_t j = 0; r->ok && j < c; j++)
                FZ_CHECK(i32[j] >= l->i32lo && i32[j] <= l->i32hi, "int %d outside [%d, %d]", i32[j], l->i32lo,
                         l->i32hi);
            r->ok = true;
            c = fy_msgr_u64s(r, key, nd, u64, l->cap);
            FZ_CHECK(c >= 0 && c <= l->cap, "%d u64s, capacity %d", c, l->cap);
            r->ok = true;
            c = fy_msgr_f32s(r, key, nd, f32, l->cap);
            FZ_CHECK(c >= 0 && c <= l->cap, "%d floats, capacity %d", c, l->cap);
            r->ok = true;
            c = fy_msgr_strs(r, key, nd, strs, lens, l->cap, l->max);
            FZ_CHECK(c >= 0 && c <= l->cap, "%d strings, capacity %d", c, l->cap);
            for (int32_t j = 0; r->ok && j < c; j++)
                FZ_CHECK(lens[j] >= 1 && lens[j] <= l->max, "string of %zu bytes, 1 to %zu asked", lens[j], l->max);
            /* a failure is kept, and later ones do not replace it */
            r->ok = true;
            fy_msgr_fail(r, FY_ERR_INVALID, "first");
            (void)fy_msgr_u64(r, key, FY_REQ, 0, 1, 0);
            FZ_CHECK(!r->ok && r->status == FY_ERR_INVALID && !strcmp(r->err, "first"), "errors are not sticky");
        }
        r->ok = true;
        FZ_CHECK(fy_msgr_has(r, key) || memchr(k->via.str.ptr, 0, k->via.str.size), "key '%s' not found", key);
        if (depth < FY_MSG_MAX_DEPTH && fy_msgr_enter(r, key, FY_OPT)) {
            read_map(r, l, depth + 1);
            fy_msgr_leave(r);
        }
        free(key);
    }
    r->ok = true;
}

/* The message packed again by msgpack-c parses again, to the same type. */
static void repack(const fy_msgr_t *r)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_object(&pk, *r->root);
    fy_msgr_t r2;
    fy_status_t st = fy_msgr_parse(&r2, sb.data, sb.size);
    FZ_CHECK(st == FY_OK, "the message packed again does not parse: %s", r2.err);
    FZ_CHECK(!strcmp(r2.type, r->type), "type '%s' became '%s'", r->type, r2.type);
    fy_msgr_free(&r2);
    msgpack_sbuffer_destroy(&sb);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fz_quiet_log();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* the last 64 bytes (when there are more than 64) also set the getters' limits */
    fz_in_t in = {size > 64 ? data + size - 64 : data, size > 64 ? 64 : 0};
    limits_t l;
    get_limits(&in, &l);
    fy_msgr_t r;
    fy_status_t st = fy_msgr_parse(&r, data, size);
    FZ_CHECK(st == FY_OK || st == FY_ERR_FORMAT || st == FY_ERR_MISMATCH, "parse returned %s", fy_status_str(st));
    FZ_CHECK(st == FY_OK || (!r.ok && r.err[0]), "a refusal without a reason");
    if (st == FY_OK) {
        size_t tl = strlen(r.type);
        FZ_CHECK(tl >= 1 && tl <= FY_MSG_TYPE_MAX && strspn(r.type, "abcdefghijklmnopqrstuvwxyz0123456789_") == tl,
                 "type '%s'", r.type);
        repack(&r);
        read_map(&r, &l, 0);
        FZ_CHECK(r.cur == r.root && r.depth == 0, "enter and leave do not balance");
    }
    fy_msgr_free(&r);
    return 0;
}

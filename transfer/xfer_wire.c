/*
 * xfer_wire.c - the byte formats of transfer/: layout descriptor, target
 * blob, handshake messages.  Pure functions over bytes: no UCX, no state.
 * Explicit little-endian so that the format does not depend on the
 * compiler's struct layout or the host's byte order.
 */
#include "transfer/xfer_wire.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "common/mem.h"

/* ---- little-endian helpers ------------------------------------------------------------------- */

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* FNV-1a: catches corruption in transit, not forgery (see xfer.h). */
static uint64_t fnv1a(const uint8_t *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* Copies a string into a fixed field, NUL-padded, so that bytes after the
 * NUL of the source never travel. */
static void put_str(uint8_t *p, const char *s, size_t cap)
{
    size_t n = strnlen(s, cap - 1);
    memcpy(p, s, n);
    memset(p + n, 0, cap - n);
}

static bool get_str(const uint8_t *p, size_t cap, char *out)
{
    if (!memchr(p, 0, cap)) return false;
    memcpy(out, p, cap);
    return true;
}

/* ---- layout ---------------------------------------------------------------------------------- */

void fy_xfer_layout_whole(fy_xfer_layout_t *l)
{
    l->tp = l->pp = 1;
    l->tp_rank = l->stage = l->layer0 = l->kv_head0 = 0;
    l->model_layers = l->n_layers;
    l->model_kv_heads = l->n_kv_heads;
}

const char *fy_xfer_layout_diff(const fy_xfer_layout_t *a, const fy_xfer_layout_t *b)
{
    if (strncmp(a->model_id, b->model_id, sizeof(a->model_id))) return "model_id";
    if (a->dtype != b->dtype) return "dtype";
    if (a->block_size != b->block_size) return "block_size";
    if (a->n_layers != b->n_layers) return "n_layers";
    if (a->n_kv_heads != b->n_kv_heads) return "n_kv_heads";
    if (a->head_dim != b->head_dim) return "head_dim";
    if (a->order != b->order) return "order";
    if (a->scale_format != b->scale_format) return "scale_format";
    if (a->block_bytes != b->block_bytes) return "block_bytes";
    if (a->n_groups != b->n_groups) return "n_groups";
    if (a->groups != b->groups) return "groups";
    if (a->tp != b->tp) return "tp";
    if (a->pp != b->pp) return "pp";
    if (a->tp_rank != b->tp_rank) return "tp_rank";
    if (a->stage != b->stage) return "stage";
    if (a->layer0 != b->layer0) return "layer0";
    if (a->kv_head0 != b->kv_head0) return "kv_head0";
    if (a->model_layers != b->model_layers) return "model_layers";
    if (a->model_kv_heads != b->model_kv_heads) return "model_kv_heads";
    return NULL;
}

bool fy_xfer_layout_explain(const fy_xfer_layout_t *here, const fy_xfer_layout_t *peer, char *buf, size_t cap)
{
    const char *f = fy_xfer_layout_diff(here, peer);
    if (!f) return false;
    if (!strcmp(f, "model_id")) {
        snprintf(buf, cap, "kv layout mismatch: model_id is '%.64s' here, '%.64s' at the peer", here->model_id,
                 peer->model_id);
    } else if (!strcmp(f, "block_bytes")) {
        snprintf(buf, cap, "kv layout mismatch: block_bytes is %" PRIu64 " here, %" PRIu64 " at the peer",
                 here->block_bytes, peer->block_bytes);
    } else {
        int32_t h = 0, p = 0;
        if (!strcmp(f, "dtype"))
            h = here->dtype, p = peer->dtype;
        else if (!strcmp(f, "block_size"))
            h = here->block_size, p = peer->block_size;
        else if (!strcmp(f, "n_layers"))
            h = here->n_layers, p = peer->n_layers;
        else if (!strcmp(f, "n_kv_heads"))
            h = here->n_kv_heads, p = peer->n_kv_heads;
        else if (!strcmp(f, "head_dim"))
            h = here->head_dim, p = peer->head_dim;
        else if (!strcmp(f, "order"))
            h = here->order, p = peer->order;
        else if (!strcmp(f, "n_groups"))
            h = here->n_groups, p = peer->n_groups;
        else if (!strcmp(f, "groups")) /* the same count, grouped differently (kv.sliding_groups, windows) */
            h = (int32_t)here->groups, p = (int32_t)peer->groups;
        else if (!strcmp(f, "scale_format"))
            h = here->scale_format, p = peer->scale_format;
        else if (!strcmp(f, "tp"))
            h = here->tp, p = peer->tp;
        else if (!strcmp(f, "pp"))
            h = here->pp, p = peer->pp;
        else if (!strcmp(f, "tp_rank"))
            h = here->tp_rank, p = peer->tp_rank;
        else if (!strcmp(f, "stage"))
            h = here->stage, p = peer->stage;
        else if (!strcmp(f, "layer0"))
            h = here->layer0, p = peer->layer0;
        else if (!strcmp(f, "kv_head0"))
            h = here->kv_head0, p = peer->kv_head0;
        else if (!strcmp(f, "model_layers"))
            h = here->model_layers, p = peer->model_layers;
        else
            h = here->model_kv_heads, p = peer->model_kv_heads;
        snprintf(buf, cap, "kv layout mismatch: %s is %d here, %d at the peer", f, h, p);
    }
    return true;
}

void fy_xfer_layout_pack(const fy_xfer_layout_t *l, uint8_t out[FY_XFER_LAYOUT_WIRE_LEN])
{
    put_str(out, l->model_id, sizeof(l->model_id));
    uint8_t *p = out + sizeof(l->model_id);
    const int32_t v[7] = {l->dtype, l->block_size, l->n_layers, l->n_kv_heads, l->head_dim, l->order, l->scale_format};
    for (int i = 0; i < 7; i++) put_u32(p + 4 * i, (uint32_t)v[i]);
    put_u64(p + 28, l->block_bytes);
    put_u32(p + 36, (uint32_t)l->n_groups);
    put_u32(p + 40, l->groups);
    const int32_t s[8] = {l->tp,     l->pp,       l->tp_rank,      l->stage,
                          l->layer0, l->kv_head0, l->model_layers, l->model_kv_heads};
    for (int i = 0; i < 8; i++) put_u32(p + 44 + 4 * i, (uint32_t)s[i]);
}

void fy_xfer_layout_unpack(const uint8_t in[FY_XFER_LAYOUT_WIRE_LEN], fy_xfer_layout_t *l)
{
    memcpy(l->model_id, in, sizeof(l->model_id));
    l->model_id[sizeof(l->model_id) - 1] = '\0'; /* callers check termination first; this is belt and braces */
    const uint8_t *p = in + sizeof(l->model_id);
    l->dtype = (int32_t)get_u32(p);
    l->block_size = (int32_t)get_u32(p + 4);
    l->n_layers = (int32_t)get_u32(p + 8);
    l->n_kv_heads = (int32_t)get_u32(p + 12);
    l->head_dim = (int32_t)get_u32(p + 16);
    l->order = (int32_t)get_u32(p + 20);
    l->scale_format = (int32_t)get_u32(p + 24);
    l->block_bytes = get_u64(p + 28);
    l->n_groups = (int32_t)get_u32(p + 36);
    l->groups = get_u32(p + 40);
    int32_t *s[8] = {&l->tp,     &l->pp,       &l->tp_rank,      &l->stage,
                     &l->layer0, &l->kv_head0, &l->model_layers, &l->model_kv_heads};
    for (int i = 0; i < 8; i++) *s[i] = (int32_t)get_u32(p + 44 + 4 * i);
}

/* ---- target blob ----------------------------------------------------------------------------- */
/*
 *   0  "FYXT"
 *   4  u8 version, 3 reserved bytes (zero)
 *   8  u32 addr_len, u32 rkey_len
 *  16  u64 arena_base, u64 arena_bytes, u64 block_bytes
 *  40  name[64], NUL-terminated
 * 104  addr[addr_len], rkey[rkey_len]
 * end  u64 FNV-1a of every byte before it
 */
#define BLOB_HDR 104
static const uint8_t blob_magic[4] = {'F', 'Y', 'X', 'T'};

fy_status_t fy_xfer_blob_build(const fy_xfer_target_t *t, uint8_t **blob_p, size_t *len_p)
{
    if (t->addr_len == 0 || t->addr_len > FY_XFER_MAX_ADDR_LEN || t->rkey_len == 0 ||
        t->rkey_len > FY_XFER_MAX_RKEY_LEN) {
        fy_error("xfer: worker address (%u bytes) or rkey (%u bytes) out of bounds", t->addr_len, t->rkey_len);
        return FY_ERR_INTERNAL;
    }
    size_t len = BLOB_HDR + (size_t)t->addr_len + t->rkey_len + 8;
    uint8_t *b = fy_calloc(1, len);
    if (!b) return FY_ERR_NOMEM;
    memcpy(b, blob_magic, 4);
    b[4] = FY_XFER_WIRE_VERSION;
    put_u32(b + 8, t->addr_len);
    put_u32(b + 12, t->rkey_len);
    put_u64(b + 16, t->arena_base);
    put_u64(b + 24, t->arena_bytes);
    put_u64(b + 32, t->block_bytes);
    put_str(b + 40, t->name, FY_XFER_NAME_LEN);
    memcpy(b + BLOB_HDR, t->addr, t->addr_len);
    memcpy(b + BLOB_HDR + t->addr_len, t->rkey, t->rkey_len);
    put_u64(b + len - 8, fnv1a(b, len - 8));
    *blob_p = b;
    *len_p = len;
    return FY_OK;
}

fy_status_t fy_xfer_blob_parse(const void *blob, size_t len, fy_xfer_target_t *t_p)
{
    const uint8_t *b = blob;
    if (!b || len < BLOB_HDR + 8) {
        fy_error("xfer: target descriptor: %zu bytes, shorter than its %d-byte header", len, BLOB_HDR + 8);
        return FY_ERR_FORMAT;
    }
    if (memcmp(b, blob_magic, 4)) {
        fy_error("xfer: target descriptor: bad magic (not a ferry transfer target)");
        return FY_ERR_FORMAT;
    }
    if (b[4] != FY_XFER_WIRE_VERSION) {
        fy_error("xfer: target descriptor: version %u, this side reads version %d", b[4], FY_XFER_WIRE_VERSION);
        return FY_ERR_FORMAT;
    }
    fy_xfer_target_t t;
    memset(&t, 0, sizeof(t));
    t.addr_len = get_u32(b + 8);
    t.rkey_len = get_u32(b + 12);
    if (t.addr_len == 0 || t.addr_len > FY_XFER_MAX_ADDR_LEN || t.rkey_len == 0 || t.rkey_len > FY_XFER_MAX_RKEY_LEN) {
        fy_error("xfer: target descriptor: worker address of %u bytes or rkey of %u bytes out of bounds", t.addr_len,
                 t.rkey_len);
        return FY_ERR_FORMAT;
    }
    size_t want = BLOB_HDR + (size_t)t.addr_len + t.rkey_len + 8;
    if (len != want) {
        fy_error("xfer: target descriptor: %zu bytes, its fields say %zu", len, want);
        return FY_ERR_FORMAT;
    }
    if (get_u64(b + len - 8) != fnv1a(b, len - 8)) {
        fy_error("xfer: target descriptor: checksum mismatch (corrupted in transit)");
        return FY_ERR_FORMAT;
    }
    t.arena_base = get_u64(b + 16);
    t.arena_bytes = get_u64(b + 24);
    t.block_bytes = get_u64(b + 32);
    if (t.block_bytes == 0 || t.arena_bytes == 0 || t.arena_bytes % t.block_bytes ||
        t.arena_bytes / t.block_bytes > INT32_MAX || t.arena_base + t.arena_bytes < t.arena_base) {
        fy_error("xfer: target descriptor: arena of %" PRIu64 " bytes at 0x%" PRIx64 " in blocks of %" PRIu64
                 " bytes is not a valid arena",
                 t.arena_bytes, t.arena_base, t.block_bytes);
        return FY_ERR_FORMAT;
    }
    if (!get_str(b + 40, FY_XFER_NAME_LEN, t.name)) {
        fy_error("xfer: target descriptor: name is not NUL-terminated");
        return FY_ERR_FORMAT;
    }
    t.addr = b + BLOB_HDR;
    t.rkey = b + BLOB_HDR + t.addr_len;
    *t_p = t;
    return FY_OK;
}

/* ---- handshake messages ---------------------------------------------------------------------- */
/*
 * hello:  u8 version, u8 type (1), u8 mem, u8 flags, 4 reserved | u64 cookie | name[64] | layout
 * reply:  u8 version, u8 type (2), u8 ok, u8 mem, u8 flags, 3 reserved | u64 cookie | layout | message[160]
 *
 * mem (fy_xfer_mem_t) and flags (bit 0: this side's UCX supports CUDA
 * memory; the other bits zero) came after version 3 in bytes it sent as
 * zero: zero reads as "unstated" (host, moved directly) and "no CUDA".
 */
enum { MSG_HELLO = 1, MSG_REPLY = 2 };
#define FLAG_UCX_CUDA 1u

const char *fy_xfer_mem_name(fy_xfer_mem_t m)
{
    switch (m) {
    case FY_XFER_MEM_UNSTATED: return "unstated";
    case FY_XFER_MEM_HOST: return "direct host";
    case FY_XFER_MEM_CUDA: return "direct cuda";
    case FY_XFER_MEM_STAGED: return "staged";
    }
    return "?";
}

bool fy_xfer_mem_explain(fy_xfer_mem_t here, bool here_cuda, fy_xfer_mem_t peer, bool peer_cuda, char *buf, size_t cap)
{
    if (here == FY_XFER_MEM_CUDA && !peer_cuda) {
        snprintf(buf, cap,
                 "kv memory mismatch: direct cuda here, and the peer (%s) has a UCX without CUDA memory support; set "
                 "worker.kv_transfer = staged here (or give the peer a UCX with cuda transports)",
                 fy_xfer_mem_name(peer));
        return true;
    }
    if (peer == FY_XFER_MEM_CUDA && !here_cuda) {
        snprintf(buf, cap,
                 "kv memory mismatch: the peer is direct cuda, and this side (%s) has a UCX without CUDA memory "
                 "support; set worker.kv_transfer = staged at the peer (or give this side a UCX with cuda transports)",
                 fy_xfer_mem_name(here));
        return true;
    }
    return false;
}

static fy_status_t get_mem(uint8_t mem, uint8_t flags, const char *what, fy_xfer_mem_t *m_p, bool *cuda_p)
{
    if (mem > FY_XFER_MEM_STAGED || (flags & ~FLAG_UCX_CUDA)) {
        fy_warn("xfer: %s malformed (memory %u, flags 0x%x)", what, mem, flags);
        return FY_ERR_FORMAT;
    }
    *m_p = (fy_xfer_mem_t)mem;
    *cuda_p = (flags & FLAG_UCX_CUDA) != 0;
    return FY_OK;
}

void fy_xfer_hello_pack(const fy_xfer_hello_t *h, uint8_t out[FY_XFER_HELLO_LEN])
{
    memset(out, 0, FY_XFER_HELLO_LEN);
    out[0] = FY_XFER_WIRE_VERSION;
    out[1] = MSG_HELLO;
    out[2] = (uint8_t)h->mem;
    out[3] = h->ucx_cuda ? FLAG_UCX_CUDA : 0;
    put_u64(out + 8, h->cookie);
    put_str(out + 16, h->name, FY_XFER_NAME_LEN);
    fy_xfer_layout_pack(&h->layout, out + 16 + FY_XFER_NAME_LEN);
}

static fy_status_t check_header(const uint8_t *b, size_t len, size_t want, int type, const char *what)
{
    if (len < 2) {
        fy_warn("xfer: %s of %zu bytes: too short", what, len);
        return FY_ERR_FORMAT;
    }
    if (b[0] != FY_XFER_WIRE_VERSION) {
        fy_warn("xfer: %s in protocol version %u; this side speaks version %d", what, b[0], FY_XFER_WIRE_VERSION);
        return FY_ERR_MISMATCH;
    }
    if (b[1] != type || len != want) {
        fy_warn("xfer: %s malformed (type %u, %zu bytes; want type %d, %zu bytes)", what, b[1], len, type, want);
        return FY_ERR_FORMAT;
    }
    return FY_OK;
}

fy_status_t fy_xfer_hello_unpack(const void *buf, size_t len, fy_xfer_hello_t *h_p)
{
    const uint8_t *b = buf;
    fy_status_t st = check_header(b, len, FY_XFER_HELLO_LEN, MSG_HELLO, "hello");
    if (st != FY_OK) return st;
    fy_xfer_hello_t h;
    if ((st = get_mem(b[2], b[3], "hello", &h.mem, &h.ucx_cuda)) != FY_OK) return st;
    h.cookie = get_u64(b + 8);
    const uint8_t *lw = b + 16 + FY_XFER_NAME_LEN;
    if (!get_str(b + 16, FY_XFER_NAME_LEN, h.name) || !memchr(lw, 0, sizeof(h.layout.model_id))) {
        fy_warn("xfer: hello malformed (unterminated name or model id)");
        return FY_ERR_FORMAT;
    }
    fy_xfer_layout_unpack(lw, &h.layout);
    *h_p = h;
    return FY_OK;
}

void fy_xfer_reply_pack(const fy_xfer_reply_t *r, uint8_t out[FY_XFER_REPLY_LEN])
{
    memset(out, 0, FY_XFER_REPLY_LEN);
    out[0] = FY_XFER_WIRE_VERSION;
    out[1] = MSG_REPLY;
    out[2] = r->ok ? 1 : 0;
    out[3] = (uint8_t)r->mem;
    out[4] = r->ucx_cuda ? FLAG_UCX_CUDA : 0;
    put_u64(out + 8, r->cookie);
    fy_xfer_layout_pack(&r->layout, out + 16);
    put_str(out + 16 + FY_XFER_LAYOUT_WIRE_LEN, r->message, FY_XFER_MSG_LEN);
}

fy_status_t fy_xfer_reply_unpack(const void *buf, size_t len, fy_xfer_reply_t *r_p)
{
    const uint8_t *b = buf;
    fy_status_t st = check_header(b, len, FY_XFER_REPLY_LEN, MSG_REPLY, "handshake reply");
    if (st != FY_OK) return st;
    fy_xfer_reply_t r;
    if ((st = get_mem(b[3], b[4], "handshake reply", &r.mem, &r.ucx_cuda)) != FY_OK) return st;
    r.ok = b[2] == 1;
    r.cookie = get_u64(b + 8);
    if (b[2] > 1 || !memchr(b + 16, 0, sizeof(r.layout.model_id)) ||
        !get_str(b + 16 + FY_XFER_LAYOUT_WIRE_LEN, FY_XFER_MSG_LEN, r.message)) {
        fy_warn("xfer: handshake reply malformed (bad flag, unterminated model id or message)");
        return FY_ERR_FORMAT;
    }
    fy_xfer_layout_unpack(b + 16, &r.layout);
    *r_p = r;
    return FY_OK;
}

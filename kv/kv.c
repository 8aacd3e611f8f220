/*
 * kv.c - the KV block manager: tiers of fixed-size blocks with O(1)
 * allocate and free, refcounted sharing, copy-on-write, a keyed-hash
 * prefix index with an LRU of evictable blocks, demotion of evicted prefix
 * blocks down the tiers (device -> host -> disk) and promotion back on a
 * hit, swapping of whole sequences, and admission promises.
 *
 * Each tier is the same structure: per-block state, refcount and name, a
 * free stack, a doubly linked LRU list of cached blocks (head = least
 * recently used) and an open-addressing index from name to block.
 */
#include "kv/kv.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kv/kvplan.h"
#include "common/log.h"
#include "common/mem.h"

fy_status_t fy_kv_layout_init(fy_kv_layout_t *lay, int32_t n_layers, int32_t n_kv_heads, int32_t head_dim,
                              int32_t block_size, fy_dtype_t dtype)
{
    if (block_size != 8 && block_size != 16 && block_size != 32) {
        fy_error("kv: block size %d is not one of 8, 16, 32", block_size);
        return FY_ERR_INVALID;
    }
    if (dtype != FY_DTYPE_F32 && dtype != FY_DTYPE_F16 && !fy_kv_dtype_scaled(dtype)) {
        fy_error("kv: dtype %s is not supported for the kv cache (f32, f16, fp8, int8)", fy_dtype_name(dtype));
        return FY_ERR_INVALID;
    }
    if (n_layers < 1 || n_kv_heads < 1 || head_dim < 1) {
        fy_error("kv: bad shape %d layers, %d kv heads, head size %d", n_layers, n_kv_heads, head_dim);
        return FY_ERR_INVALID;
    }
    fy_kv_layout_t l = {
        .n_layers = n_layers,
        .n_kv_heads = n_kv_heads,
        .head_dim = head_dim,
        .block_size = block_size,
        .dtype = dtype,
    };
    l.elem_bytes = (size_t)fy_dtype_info(dtype)->block_bytes;
    l.row_bytes = (size_t)head_dim * l.elem_bytes + (fy_kv_dtype_scaled(dtype) ? sizeof(float) : 0);
    l.head_bytes = (size_t)block_size * l.row_bytes;
    l.kv_bytes = l.head_bytes * (size_t)n_kv_heads;
    l.layer_bytes = 2 * l.kv_bytes;
    l.block_bytes = l.layer_bytes * (size_t)n_layers;
    if (n_layers > FY_KV_MAX_LAYERS) {
        fy_error("kv: %d layers (at most %d)", n_layers, FY_KV_MAX_LAYERS);
        return FY_ERR_INVALID;
    }
    l.n_groups = 1;
    l.group_layers = n_layers;
    for (int32_t i = 0; i < n_layers; i++) l.layer_slot[i] = (uint16_t)i;
    *lay = l;
    return FY_OK;
}

static int32_t gcd32(int32_t a, int32_t b)
{
    while (b) {
        int32_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

fy_status_t fy_kv_layout_make(fy_kv_layout_t *lay, int32_t n_layers, int32_t n_kv_heads, int32_t head_dim,
                              int32_t block_size, fy_dtype_t dtype, const int32_t *window)
{
    fy_status_t st = fy_kv_layout_init(lay, n_layers, n_kv_heads, head_dim, block_size, dtype);
    return st || !window ? st : fy_kv_layout_set_windows(lay, window);
}

fy_status_t fy_kv_layout_set_windows(fy_kv_layout_t *lay, const int32_t *window)
{
    int32_t n = lay->n_layers;
    /* the distinct windows, global (0) first, then ascending; and how many
     * layers each has */
    int32_t win[FY_KV_MAX_LAYERS] = {0}, cnt[FY_KV_MAX_LAYERS] = {0}, n_win = 0;
    for (int32_t i = 0; i < n; i++) {
        if (window[i] < 0) {
            fy_error("kv: layer %d has window %d", i, window[i]);
            return FY_ERR_INVALID;
        }
        int32_t k = 0;
        while (k < n_win && win[k] != window[i]) k++;
        if (k == n_win) win[n_win] = window[i], cnt[n_win++] = 0;
        cnt[k]++;
    }
    for (int32_t a = 1; a < n_win; a++) /* insertion sort: 0 sorts first */
        for (int32_t b = a; b > 0 && win[b] < win[b - 1]; b--) {
            int32_t t = win[b];
            win[b] = win[b - 1], win[b - 1] = t;
            t = cnt[b], cnt[b] = cnt[b - 1], cnt[b - 1] = t;
        }
    fy_kv_layout_t l = *lay;
    if (n_win == 1) { /* one window for every layer: one group, as before */
        l.n_groups = 1;
        l.group_layers = n;
        l.group_window[0] = win[0];
        for (int32_t i = 0; i < n; i++) l.layer_group[i] = 0, l.layer_slot[i] = (uint16_t)i;
    } else {
        int32_t p = cnt[0];
        for (int32_t k = 1; k < n_win; k++) p = gcd32(p, cnt[k]);
        l.group_layers = p;
        l.n_groups = n / p;
        int32_t g0 = 0;
        for (int32_t k = 0; k < n_win; k++) {
            int32_t j = 0;
            for (int32_t i = 0; i < n; i++) {
                if (window[i] != win[k]) continue;
                l.layer_group[i] = (uint16_t)(g0 + j / p);
                l.layer_slot[i] = (uint16_t)(j % p);
                j++;
            }
            for (int32_t g = g0; g < g0 + cnt[k] / p; g++) l.group_window[g] = win[k];
            g0 += cnt[k] / p;
        }
    }
    l.block_bytes = l.layer_bytes * (size_t)l.group_layers;
    *lay = l;
    return FY_OK;
}

uint32_t fy_kv_layout_groups_digest(const fy_kv_layout_t *lay)
{
    if (lay->n_groups == 1 && lay->group_window[0] == 0) return 0;
    uint32_t h = 2166136261u; /* FNV-1a */
    for (int32_t i = 0; i < lay->n_layers; i++) {
        uint32_t v[3] = {lay->layer_group[i], lay->layer_slot[i], (uint32_t)lay->group_window[lay->layer_group[i]]};
        for (int k = 0; k < 3; k++)
            for (int b = 0; b < 4; b++) h = (h ^ ((v[k] >> (8 * b)) & 0xff)) * 16777619u;
    }
    return h ? h : 1;
}

int64_t fy_kv_blocks_held(const fy_kv_layout_t *lay, int64_t n, int32_t step)
{
    return fy_kv_blocks_needed(lay, n, 0, step, INT64_MAX);
}

void fy_kv_row_write(const fy_kv_layout_t *lay, const float *x, void *row)
{
    const int32_t n = lay->head_dim;
    if (!fy_kv_dtype_scaled(lay->dtype)) {
        fy_quantize_row(lay->dtype, x, row, n);
        return;
    }
    float amax = 0.0f;
    for (int32_t i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
    const float qmax = lay->dtype == FY_DTYPE_FP8 ? 448.0f : 127.0f;
    float scale = amax / qmax, inv = amax > 0.0f ? qmax / amax : 0.0f;
    memcpy(row, &scale, sizeof(scale));
    uint8_t *q = (uint8_t *)row + sizeof(float);
    if (lay->dtype == FY_DTYPE_FP8) {
        for (int32_t i = 0; i < n; i++) q[i] = fy_fp32_to_fp8(x[i] * inv);
    } else {
        for (int32_t i = 0; i < n; i++) {
            float v = fmaxf(-127.0f, fminf(127.0f, roundf(x[i] * inv)));
            q[i] = (uint8_t)(int8_t)v;
        }
    }
}

void fy_kv_row_read(const fy_kv_layout_t *lay, const void *row, float *x)
{
    const int32_t n = lay->head_dim;
    if (!fy_kv_dtype_scaled(lay->dtype)) {
        fy_dequantize_row(lay->dtype, row, x, n);
        return;
    }
    float scale;
    memcpy(&scale, row, sizeof(scale));
    const uint8_t *q = (const uint8_t *)row + sizeof(float);
    if (lay->dtype == FY_DTYPE_FP8) {
        for (int32_t i = 0; i < n; i++) x[i] = scale * fy_fp8_to_fp32(q[i]);
    } else {
        for (int32_t i = 0; i < n; i++) x[i] = scale * (float)(int8_t)q[i];
    }
}

const char *fy_kv_tier_name(fy_kv_tier_t t)
{
    switch (t) {
    case FY_KV_DEVICE: return "device";
    case FY_KV_HOST: return "host";
    case FY_KV_DISK: return "disk";
    case FY_KV_TIERS: break;
    }
    return "?";
}

/* ---- keyed hashing ---------------------------------------------------------------------- */

struct fy_kv_hasher {
    /* the keyed BLAKE2b state before any message: copied per hash, so each
     * block name costs one compression, not two */
    crypto_generichash_blake2b_state base;
};

_Static_assert(FY_KV_HASH_BYTES >= crypto_generichash_blake2b_BYTES_MIN, "hash length");

fy_status_t fy_kv_hasher_for(const uint8_t *secret, size_t len, fy_kv_hasher_t **h_p)
{
    return len ? fy_kv_hasher_create(secret, len, h_p) : fy_kv_hasher_create_random(h_p);
}

fy_status_t fy_kv_hasher_create(const uint8_t *secret, size_t len, fy_kv_hasher_t **h_p)
{
    if (len < 16 || len > crypto_generichash_blake2b_KEYBYTES_MAX) {
        fy_error("kv: the prefix-cache secret must be 16 to %d bytes, not %zu",
                 (int)crypto_generichash_blake2b_KEYBYTES_MAX, len);
        return FY_ERR_INVALID;
    }
    if (sodium_init() < 0) {
        fy_error("kv: libsodium failed to initialize");
        return FY_ERR_INTERNAL;
    }
    fy_kv_hasher_t *h = fy_aligned_alloc(64, sizeof(*h));
    if (!h) {
        fy_error("kv: out of memory");
        return FY_ERR_NOMEM;
    }
    crypto_generichash_blake2b_init(&h->base, secret, len, FY_KV_HASH_BYTES);
    *h_p = h;
    return FY_OK;
}

fy_status_t fy_kv_hasher_create_random(fy_kv_hasher_t **h_p)
{
    if (sodium_init() < 0) {
        fy_error("kv: libsodium failed to initialize");
        return FY_ERR_INTERNAL;
    }
    uint8_t key[32];
    randombytes_buf(key, sizeof(key));
    fy_status_t st = fy_kv_hasher_create(key, sizeof(key), h_p);
    sodium_memzero(key, sizeof(key));
    return st;
}

void fy_kv_hasher_destroy(fy_kv_hasher_t *h)
{
    if (!h) return;
    sodium_memzero(h, sizeof(*h));
    fy_free(h);
}

static void put_len(crypto_generichash_blake2b_state *st, uint64_t len)
{
    uint8_t l[8];
    for (int i = 0; i < 8; i++) l[i] = (uint8_t)(len >> (8 * i)); /* little-endian length prefix */
    crypto_generichash_blake2b_update(st, l, 8);
}

static void put_field(crypto_generichash_blake2b_state *st, const void *p, uint64_t len)
{
    put_len(st, len);
    if (len) crypto_generichash_blake2b_update(st, p, len);
}

static void put_str(crypto_generichash_blake2b_state *st, const char *s)
{
    if (!s) {
        put_len(st, UINT64_MAX); /* absent differs from "": a length no string has */
        return;
    }
    put_field(st, s, strlen(s));
}

static void put_int(crypto_generichash_blake2b_state *st, int64_t v)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)v >> (8 * i));
    put_field(st, b, 8);
}

void fy_kv_ns_make(const fy_kv_hasher_t *h, const char *tenant, const char *model_id, const fy_kv_layout_t *lay,
                   const char *adapter, fy_kv_ns_t *ns_p)
{
    crypto_generichash_blake2b_state st __attribute__((aligned(64)));
    memcpy(&st, &h->base, sizeof(st));
    put_str(&st, "ferry kv namespace v1");
    put_str(&st, tenant);
    put_str(&st, model_id);
    put_int(&st, lay->n_layers);
    put_int(&st, lay->n_kv_heads);
    put_int(&st, lay->head_dim);
    put_int(&st, lay->block_size);
    put_str(&st, fy_dtype_name(lay->dtype));
    put_int(&st, lay->n_groups);
    for (int32_t i = 0; lay->n_groups > 1 && i < lay->n_layers; i++)
        put_int(&st, (int64_t)lay->layer_group[i] << 32 | lay->group_window[lay->layer_group[i]]);
    put_str(&st, adapter);
    crypto_generichash_blake2b_final(&st, ns_p->digest.b, FY_KV_HASH_BYTES);
}

void fy_kv_hash_block(const fy_kv_hasher_t *h, const fy_kv_ns_t *ns, const fy_kv_hash_t *parent, const int32_t *tokens,
                      int32_t block_size, fy_kv_hash_t *out)
{
    crypto_generichash_blake2b_state st __attribute__((aligned(64)));
    memcpy(&st, &h->base, sizeof(st));
    /* fixed-size fields, so no separators are needed: ns (16), a marker
     * telling the first block from the others, parent (16), tokens */
    uint8_t head[1 + 2 * FY_KV_HASH_BYTES];
    memcpy(head, ns->digest.b, FY_KV_HASH_BYTES);
    head[FY_KV_HASH_BYTES] = parent ? 1 : 0;
    if (parent)
        memcpy(head + FY_KV_HASH_BYTES + 1, parent->b, FY_KV_HASH_BYTES);
    else
        memset(head + FY_KV_HASH_BYTES + 1, 0, FY_KV_HASH_BYTES);
    crypto_generichash_blake2b_update(&st, head, sizeof(head));
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    crypto_generichash_blake2b_update(&st, (const uint8_t *)tokens, (size_t)block_size * 4);
#else
    for (int32_t i = 0; i < block_size; i++) {
        uint8_t b[4] = {(uint8_t)tokens[i], (uint8_t)(tokens[i] >> 8), (uint8_t)(tokens[i] >> 16),
                        (uint8_t)(tokens[i] >> 24)};
        crypto_generichash_blake2b_update(&st, b, 4);
    }
#endif
    crypto_generichash_blake2b_final(&st, out->b, FY_KV_HASH_BYTES);
}

/* ---- one tier ------------------------------------------------------------------------------ */

enum { BLOCK_FREE = 0, BLOCK_USED, BLOCK_CACHED };

typedef struct tier {
    int32_t n;
    int32_t *ref;        /* [n] */
    uint8_t *state;      /* [n] */
    uint8_t *named;      /* [n] listed in the index */
    fy_kv_hash_t *name;  /* [n] */
    uint16_t *filled;    /* [n] token slots written (device tier: waste) */
    int32_t *free_stack; /* [n] */
    int32_t n_free;
    int32_t *prev, *next; /* [n] LRU links of cached blocks; -1 ends */
    int32_t head, tail;   /* head: least recently used */
    int32_t n_cached, n_used;
    int32_t *index; /* [index_mask + 1] block ids, -1 empty */
    uint32_t index_mask;
    uint64_t hits, evictions;
} tier_t;

static fy_status_t tier_init(tier_t *t, int32_t n)
{
    memset(t, 0, sizeof(*t));
    t->head = t->tail = -1;
    if (n <= 0) return FY_OK;
    uint32_t cap = 16;
    while (cap < 2u * (uint32_t)n) cap *= 2;
    t->ref = fy_calloc((size_t)n, sizeof(int32_t));
    t->state = fy_calloc((size_t)n, 1);
    t->named = fy_calloc((size_t)n, 1);
    t->name = fy_calloc((size_t)n, sizeof(fy_kv_hash_t));
    t->filled = fy_calloc((size_t)n, sizeof(uint16_t));
    t->free_stack = fy_malloc((size_t)n * sizeof(int32_t));
    t->prev = fy_malloc((size_t)n * sizeof(int32_t));
    t->next = fy_malloc((size_t)n * sizeof(int32_t));
    t->index = fy_malloc((size_t)cap * sizeof(int32_t));
    if (!t->ref || !t->state || !t->named || !t->name || !t->filled || !t->free_stack || !t->prev || !t->next ||
        !t->index)
        return FY_ERR_NOMEM;
    t->n = n;
    t->index_mask = cap - 1;
    for (uint32_t i = 0; i < cap; i++) t->index[i] = -1;
    /* lowest ids on top, so a fresh tier hands out 0, 1, 2, ... */
    for (int32_t i = 0; i < n; i++) t->free_stack[i] = n - 1 - i;
    t->n_free = n;
    return FY_OK;
}

static void tier_deinit(tier_t *t)
{
    fy_free(t->ref), fy_free(t->state), fy_free(t->named), fy_free(t->name), fy_free(t->filled);
    fy_free(t->free_stack), fy_free(t->prev), fy_free(t->next), fy_free(t->index);
    memset(t, 0, sizeof(*t));
}

static uint32_t bucket(const tier_t *t, const fy_kv_hash_t *h)
{
    uint64_t x; /* keyed BLAKE2b output: any 8 bytes are uniform */
    memcpy(&x, h->b, 8);
    return (uint32_t)x & t->index_mask;
}

static int32_t index_find(const tier_t *t, const fy_kv_hash_t *h)
{
    if (!t->n) return -1;
    for (uint32_t i = bucket(t, h);; i = (i + 1) & t->index_mask) {
        int32_t b = t->index[i];
        if (b < 0) return -1;
        if (!memcmp(t->name[b].b, h->b, FY_KV_HASH_BYTES)) return b;
    }
}

/* named: NAME_PRIMARY for a block of group 0 (its name is the prefix
 * name routers compute), NAME_DERIVED for the other groups' blocks */
enum { NAME_PRIMARY = 1, NAME_DERIVED = 2 };

static void index_add(tier_t *t, int32_t b, const fy_kv_hash_t *h, uint8_t kind)
{
    t->name[b] = *h;
    t->named[b] = kind;
    uint32_t i = bucket(t, h);
    while (t->index[i] >= 0) i = (i + 1) & t->index_mask;
    t->index[i] = b;
}

static void index_remove(tier_t *t, int32_t b)
{
    uint32_t i = bucket(t, &t->name[b]);
    while (t->index[i] != b) i = (i + 1) & t->index_mask;
    /* backward-shift deletion keeps probe chains intact without tombstones */
    uint32_t j = i;
    for (;;) {
        j = (j + 1) & t->index_mask;
        int32_t c = t->index[j];
        if (c < 0) break;
        uint32_t home = bucket(t, &t->name[c]);
        /* c may move to i if its home is not in the cyclic range (i, j] */
        bool in_range = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!in_range) {
            t->index[i] = c;
            i = j;
        }
    }
    t->index[i] = -1;
    t->named[b] = 0;
}

static void lru_push_tail(tier_t *t, int32_t b)
{
    t->prev[b] = t->tail;
    t->next[b] = -1;
    if (t->tail >= 0)
        t->next[t->tail] = b;
    else
        t->head = b;
    t->tail = b;
    t->n_cached++;
}

static void lru_remove(tier_t *t, int32_t b)
{
    if (t->prev[b] >= 0)
        t->next[t->prev[b]] = t->next[b];
    else
        t->head = t->next[b];
    if (t->next[b] >= 0)
        t->prev[t->next[b]] = t->prev[b];
    else
        t->tail = t->prev[b];
    t->n_cached--;
}

/* FREE -> USED */
static int32_t take_free(tier_t *t)
{
    int32_t b = t->free_stack[--t->n_free];
    t->state[b] = BLOCK_USED;
    t->ref[b] = 1;
    t->filled[b] = 0;
    t->n_used++;
    return b;
}

/* USED (last reference) or CACHED -> FREE, dropping its name */
static void make_free(tier_t *t, int32_t b)
{
    if (t->state[b] == BLOCK_CACHED)
        lru_remove(t, b);
    else
        t->n_used--;
    if (t->named[b]) index_remove(t, b);
    t->state[b] = BLOCK_FREE;
    t->ref[b] = 0;
    t->free_stack[t->n_free++] = b;
}

/* CACHED -> USED (a prefix hit takes it) */
static void take_cached(tier_t *t, int32_t b)
{
    lru_remove(t, b);
    t->state[b] = BLOCK_USED;
    t->ref[b] = 1;
    t->n_used++;
}

/* ---- the manager --------------------------------------------------------------------------------- */

/* free + used + cached == total for every tier: each count is kept by its
 * own transitions, so this checks them.  Debug builds (sanitizer builds
 * define FY_DEBUG) check after every operation that changes the books;
 * fy_kvm_stats exports it as a figure. */
#ifdef FY_DEBUG
#define CHECK_BOOKS(m) kvm_books_assert(m)
#else
#define CHECK_BOOKS(m) ((void)0)
#endif

#define DISK_SUM_BYTES 16

struct fy_kvm {
    fy_kv_layout_t lay;
    tier_t tier[FY_KV_TIERS];
    char *host_arena;
    int disk_fd;
    /* each disk slot's keyed BLAKE2b of what was written there (the key is
     * this process's, the sums in its memory): a slot read back that does
     * not match is dropped, never served */
    uint8_t disk_key[crypto_generichash_KEYBYTES];
    uint8_t (*disk_sum)[DISK_SUM_BYTES];
    uint64_t disk_bad;
    fy_kv_copy_fn copy;
    void *copy_arg;
    const fy_kv_hasher_t *hasher;
    bool prefix_caching;
    int32_t watermark_blocks;
    int32_t max_step;
    int32_t promised;
    /* figures */
    uint64_t queries, query_tokens, hit_blocks, hit_tokens, cow_copies;
    uint64_t swap_out_blocks, swap_in_blocks, demotions, promotions, slid_blocks, evicted_blocks;
};

const fy_kv_layout_t *fy_kvm_layout(const fy_kvm_t *m) { return &m->lay; }

static bool books_balance(const fy_kvm_t *m)
{
    for (int t = 0; t < FY_KV_TIERS; t++) {
        const tier_t *T = &m->tier[t];
        if (T->n_free + T->n_used + T->n_cached != T->n || T->n_free < 0 || T->n_used < 0 || T->n_cached < 0)
            return false;
    }
    return m->promised >= 0;
}

#ifdef FY_DEBUG
static void kvm_books_assert(const fy_kvm_t *m)
{
    if (!books_balance(m)) {
        fy_error("kv: books out of balance");
        abort();
    }
}
#endif

fy_status_t fy_kv_disk_dir_check(const char *dir, char *why, size_t cap)
{
    struct stat st;
    if (!dir || !*dir) {
        snprintf(why, cap, "is empty");
        return FY_ERR_INVALID;
    }
    if (lstat(dir, &st) != 0) {
        snprintf(why, cap, "cannot be read: %s", strerror(errno));
        return FY_ERR_INVALID;
    }
    if (S_ISLNK(st.st_mode)) {
        snprintf(why, cap, "is a symbolic link; name the directory itself");
        return FY_ERR_INVALID;
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(why, cap, "is not a directory");
        return FY_ERR_INVALID;
    }
    if (st.st_uid != geteuid() && st.st_uid != 0) {
        snprintf(why, cap, "is owned by uid %d, neither this process's (%d) nor root", (int)st.st_uid, (int)geteuid());
        return FY_ERR_INVALID;
    }
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX)) {
        snprintf(why, cap, "is writable by %s without the sticky bit (mode %04o): others could replace what we create",
                 st.st_mode & S_IWOTH ? "everyone" : "its group", (unsigned)(st.st_mode & 07777));
        return FY_ERR_INVALID;
    }
    return FY_OK;
}

/*
 * The disk tier's file: in a fresh private folder (mkdtemp, 0700) under
 * dir, created exclusively and never through a link, then unlinked with
 * its folder at once: nobody can plant a link to a victim file where it
 * will be, and its space goes back when the process ends, however it
 * ends.
 */
static fy_status_t open_disk(fy_kvm_t *m, const char *dir, int32_t slots)
{
    char why[200], sub[4096];
    if (fy_kv_disk_dir_check(dir, why, sizeof(why)) != FY_OK) {
        fy_error("kv: disk tier: kv.disk_dir '%s' %s", dir, why);
        return FY_ERR_INVALID;
    }
    int k = snprintf(sub, sizeof(sub), "%s/ferry-kv-XXXXXX", dir);
    if (k < 0 || (size_t)k >= sizeof(sub)) {
        fy_error("kv: disk tier: kv.disk_dir '%.64s...' is too long", dir);
        return FY_ERR_INVALID;
    }
    if (sodium_init() < 0) return FY_ERR_INTERNAL;
    if (!mkdtemp(sub)) {
        fy_error("kv: disk tier: cannot create a folder in %s: %m", dir);
        return FY_ERR_IO;
    }
    int dfd = open(sub, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (dfd < 0 || fstat(dfd, &st) != 0 || st.st_uid != geteuid() || (st.st_mode & 077)) {
        fy_error("kv: disk tier: the folder %s is not this process's private folder after creating it", sub);
        if (dfd >= 0) close(dfd);
        rmdir(sub);
        return FY_ERR_IO;
    }
    m->disk_fd = openat(dfd, "blocks", O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (m->disk_fd < 0) fy_error("kv: disk tier: cannot create %s/blocks: %m", sub);
    unlinkat(dfd, "blocks", 0);
    close(dfd);
    rmdir(sub);
    if (m->disk_fd < 0) return FY_ERR_IO;
    if (ftruncate(m->disk_fd, (off_t)slots * (off_t)m->lay.block_bytes) != 0) {
        fy_error("kv: disk tier: cannot size its file in %s to %d blocks: %m", dir, slots);
        return FY_ERR_IO;
    }
    m->disk_sum = fy_calloc((size_t)slots, sizeof(*m->disk_sum));
    if (!m->disk_sum) return FY_ERR_NOMEM;
    randombytes_buf(m->disk_key, sizeof(m->disk_key));
    return FY_OK;
}

/* The keyed sum of a block's bytes. */
static void disk_sum(const fy_kvm_t *m, const void *block, uint8_t out[DISK_SUM_BYTES])
{
    crypto_generichash(out, DISK_SUM_BYTES, block, m->lay.block_bytes, m->disk_key, sizeof(m->disk_key));
}

fy_status_t fy_kvm_create(const fy_kvm_params_t *p, fy_kvm_t **m_p)
{
    if (p->n_device_blocks < 1 || p->n_host_blocks < 0 || !p->copy || !p->hasher ||
        (p->n_host_blocks > 0 && !p->host_arena) || p->watermark < 0.0f || p->watermark >= 1.0f ||
        p->layout.block_bytes == 0) {
        fy_error("kv: bad manager parameters (%d device blocks, %d host blocks, watermark %g)", p->n_device_blocks,
                 p->n_host_blocks, (double)p->watermark);
        return FY_ERR_INVALID;
    }
    int32_t disk_slots = 0;
    if (p->disk_dir && p->disk_bytes > 0) {
        if (p->n_ranks > 1) {
            fy_error("kv: a disk tier with %d ranks: the manager reads and writes only rank 0's host arena, so the "
                     "other ranks' slices would be lost (not built)",
                     p->n_ranks);
            return FY_ERR_UNSUPPORTED;
        }
        if (p->n_host_blocks == 0) {
            fy_error("kv: a disk tier needs a host tier to stage through");
            return FY_ERR_INVALID;
        }
        int64_t s = p->disk_bytes / (int64_t)p->layout.block_bytes;
        disk_slots = s > INT32_MAX / 2 ? INT32_MAX / 2 : (int32_t)s;
        if (disk_slots < 1) {
            fy_error("kv: disk tier of %lld bytes holds no %zu-byte block", (long long)p->disk_bytes,
                     p->layout.block_bytes);
            return FY_ERR_INVALID;
        }
    }
    fy_kvm_t *m = fy_calloc(1, sizeof(*m));
    if (!m) goto nomem;
    m->disk_fd = -1;
    m->lay = p->layout;
    m->host_arena = p->host_arena;
    m->copy = p->copy;
    m->copy_arg = p->copy_arg;
    m->hasher = p->hasher;
    m->prefix_caching = p->prefix_caching;
    m->watermark_blocks = fy_kv_watermark_pages(p->watermark, p->n_device_blocks);
    m->max_step = p->max_step_tokens > 0 ? p->max_step_tokens : 0;
    int32_t n[FY_KV_TIERS] = {p->n_device_blocks, p->n_host_blocks, disk_slots};
    for (int t = 0; t < FY_KV_TIERS; t++)
        if (tier_init(&m->tier[t], n[t]) != FY_OK) goto nomem;
    fy_status_t dst = disk_slots ? open_disk(m, p->disk_dir, disk_slots) : FY_OK;
    if (dst != FY_OK) {
        fy_kvm_destroy(m);
        return dst;
    }
    *m_p = m;
    return FY_OK;
nomem:
    fy_kvm_destroy(m);
    fy_error("kv: out of memory for a manager of %d device blocks", p->n_device_blocks);
    return FY_ERR_NOMEM;
}

void fy_kvm_destroy(fy_kvm_t *m)
{
    if (!m) return;
    for (int t = 0; t < FY_KV_TIERS; t++) tier_deinit(&m->tier[t]);
    if (m->disk_fd >= 0) close(m->disk_fd);
    fy_free(m->disk_sum);
    sodium_memzero(m->disk_key, sizeof(m->disk_key));
    fy_free(m);
}

static char *host_block(const fy_kvm_t *m, int32_t b) { return m->host_arena + (size_t)b * m->lay.block_bytes; }

/* Blocks of a tier that an allocation can take: free, or cached (evictable). */
static int32_t takeable(const fy_kvm_t *m, fy_kv_tier_t t) { return m->tier[t].n_free + m->tier[t].n_cached; }

static int32_t alloc_block(fy_kvm_t *m, fy_kv_tier_t t);

/* Moves block b's name from tier `from` to block nb of tier `to`. */
static void move_name(fy_kvm_t *m, fy_kv_tier_t from, int32_t b, fy_kv_tier_t to, int32_t nb)
{
    fy_kv_hash_t h = m->tier[from].name[b];
    uint8_t kind = m->tier[from].named[b];
    index_remove(&m->tier[from], b);
    index_add(&m->tier[to], nb, &h, kind);
}

/* The least recently used cached block of tier t leaves it: its contents
 * go one tier down when there is room there, else its name is dropped. */
static void evict_one(fy_kvm_t *m, fy_kv_tier_t t)
{
    tier_t *T = &m->tier[t];
    int32_t b = T->head;
    T->evictions++;
    fy_kv_tier_t below = (fy_kv_tier_t)(t + 1);
    if (below < FY_KV_TIERS && m->tier[below].n > 0 && takeable(m, below) > 0) {
        int32_t nb = alloc_block(m, below);
        bool ok = true;
        if (below == FY_KV_HOST) {
            ok = m->copy(m->copy_arg, FY_KV_HOST, &nb, FY_KV_DEVICE, &b, 1) == FY_OK;
        } else {
            ssize_t w = pwrite(m->disk_fd, host_block(m, b), m->lay.block_bytes, (off_t)nb * (off_t)m->lay.block_bytes);
            if (w != (ssize_t)m->lay.block_bytes) {
                fy_warn("kv: disk tier: write failed (%s); dropping the block", w < 0 ? strerror(errno) : "short");
                ok = false;
            } else {
                disk_sum(m, host_block(m, b), m->disk_sum[nb]);
            }
        }
        if (ok) {
            move_name(m, t, b, below, nb);
            /* the demoted copy is cached below: an evictable name, no owner */
            tier_t *B = &m->tier[below];
            B->state[nb] = BLOCK_CACHED;
            B->ref[nb] = 0;
            B->n_used--;
            lru_push_tail(B, nb);
            m->demotions++;
        } else {
            make_free(&m->tier[below], nb);
        }
    }
    make_free(T, b);
}

/* A block of tier t with refcount 1, evicting if no block is free; the
 * caller checked takeable(). */
static int32_t alloc_block(fy_kvm_t *m, fy_kv_tier_t t)
{
    tier_t *T = &m->tier[t];
    if (T->n_free == 0) evict_one(m, t);
    return take_free(T);
}

/* Device blocks an allocation may take: what is takeable, less what is
 * promised to requests other than resv's. */
static int32_t available(const fy_kvm_t *m, const fy_kv_resv_t *resv)
{
    int32_t others = m->promised - (resv ? resv->blocks : 0);
    return takeable(m, FY_KV_DEVICE) - others;
}

static void draw(fy_kvm_t *m, fy_kv_resv_t *resv, int32_t n)
{
    if (!resv) return;
    int32_t k = resv->blocks < n ? resv->blocks : n;
    resv->blocks -= k;
    m->promised -= k;
}

static void unref(fy_kvm_t *m, fy_kv_tier_t t, int32_t b)
{
    tier_t *T = &m->tier[t];
    if (--T->ref[b] > 0) return;
    if (T->named[b]) {
        T->state[b] = BLOCK_CACHED;
        T->n_used--;
        lru_push_tail(T, b);
    } else {
        T->ref[b] = 1; /* make_free expects a used block with its reference */
        make_free(T, b);
    }
}

/* ---- sequences ------------------------------------------------------------------------------------ */

static int32_t *grp(const fy_block_table_t *bt, int32_t g) { return fy_block_table_group(bt, g); }

/* Drops a table entry's reference, if it holds one (-1: dropped or evicted). */
static void unref_entry(fy_kvm_t *m, fy_block_table_t *bt, int32_t *entry)
{
    if (*entry >= 0) unref(m, bt->tier, *entry);
    *entry = -1;
}

int32_t fy_block_table_held(const fy_block_table_t *bt)
{
    int32_t n = 0;
    for (int32_t g = 0; g < bt->n_groups; g++)
        for (int32_t i = bt->lo[g]; i < bt->n_blocks; i++) n += grp(bt, g)[i] >= 0;
    return n;
}

/* The first block of group g that a query at position pos sees. */
static int32_t first_seen(const fy_kvm_t *m, int32_t g, int32_t pos)
{
    int32_t w = m->lay.group_window[g];
    return w && pos - w + 1 > 0 ? (pos - w + 1) / m->lay.block_size : 0;
}

/* Where group g's copy of prefix block i is named: the prefix name itself
 * for group 0, and for the others that name with g folded into its first
 * bytes.  Names are keyed hashes, so a derived name meets another block's
 * name only by a 2^-128 chance, and it hashes to its own index bucket. */
static void group_name(const fy_kv_hash_t *h, int32_t g, fy_kv_hash_t *out)
{
    *out = *h;
    out->b[0] ^= (uint8_t)g;
    out->b[1] ^= (uint8_t)(g >> 8);
}

fy_status_t fy_kvm_seq_init(fy_kvm_t *m, fy_block_table_t *bt, int32_t max_tokens, const fy_kv_ns_t *ns)
{
    int32_t bs = m->lay.block_size, ng = m->lay.n_groups;
    if (max_tokens < 1 || max_tokens > (INT32_MAX - bs)) {
        fy_error("kv: a sequence of %d tokens", max_tokens);
        return FY_ERR_INVALID;
    }
    int32_t max_blocks = (max_tokens + bs - 1) / bs;
    memset(bt, 0, sizeof(*bt));
    bt->blocks = fy_malloc((size_t)max_blocks * (size_t)ng * sizeof(int32_t));
    bt->lo = fy_calloc((size_t)ng, sizeof(int32_t));
    bt->hashes = fy_malloc((size_t)max_blocks * sizeof(fy_kv_hash_t));
    if (!bt->blocks || !bt->lo || !bt->hashes) {
        fy_free(bt->blocks);
        fy_free(bt->lo);
        fy_free(bt->hashes);
        memset(bt, 0, sizeof(*bt));
        fy_error("kv: out of memory for a block table of %d blocks", max_blocks);
        return FY_ERR_NOMEM;
    }
    for (size_t i = 0; i < (size_t)max_blocks * (size_t)ng; i++) bt->blocks[i] = -1;
    bt->n_groups = ng;
    bt->name_limit = INT32_MAX;
    bt->max_blocks = max_blocks;
    bt->block_size = bs;
    bt->tier = FY_KV_DEVICE;
    if (ns) bt->ns = *ns;
    return FY_OK;
}

void fy_kvm_seq_deinit(fy_block_table_t *bt)
{
    fy_free(bt->blocks);
    fy_free(bt->lo);
    fy_free(bt->hashes);
    memset(bt, 0, sizeof(*bt));
}

/* Names of the full blocks among the first n tokens, computed once. */
static void hash_upto(const fy_kvm_t *m, fy_block_table_t *bt, const int32_t *tokens, int32_t n)
{
    int32_t bs = bt->block_size, full = n / bs;
    if (full > bt->max_blocks) full = bt->max_blocks;
    for (int32_t i = bt->n_hashed; i < full; i++)
        fy_kv_hash_block(m->hasher, &bt->ns, i ? &bt->hashes[i - 1] : NULL, tokens + (size_t)i * bs, bs,
                         &bt->hashes[i]);
    if (full > bt->n_hashed) bt->n_hashed = full;
}

/* Sliding groups drop the blocks before what a query at position pos
 * sees.  Dropped blocks that went back to the pool (free, or cached under
 * their names) go back into resv's promise. */
static void slide(fy_kvm_t *m, fy_block_table_t *bt, int32_t pos, fy_kv_resv_t *resv)
{
    int32_t before = takeable(m, FY_KV_DEVICE), dropped = 0;
    for (int32_t g = 0; g < bt->n_groups; g++) {
        int32_t lo = first_seen(m, g, pos), *t = grp(bt, g);
        if (lo <= bt->lo[g]) continue;
        for (int32_t i = bt->lo[g]; i < lo && i < bt->n_blocks; i++) {
            dropped += t[i] >= 0;
            unref_entry(m, bt, &t[i]);
        }
        bt->lo[g] = lo;
    }
    m->slid_blocks += (uint64_t)dropped;
    int32_t back = takeable(m, FY_KV_DEVICE) - before;
    if (resv && bt->tier == FY_KV_DEVICE && back > 0) {
        resv->blocks += back;
        m->promised += back;
    }
}

/* While a lookup pins blocks of several tiers, a table slot holds the
 * tier and the block: device ids as they are, host ids below -1, disk ids
 * below INT32_MIN / 2 (tier sizes are capped well under those ranges);
 * -1 is an empty slot. */
static int32_t loc_encode(fy_kv_tier_t t, int32_t b)
{
    return t == FY_KV_DEVICE ? b : t == FY_KV_HOST ? -2 - b : INT32_MIN / 2 - b;
}

static int32_t loc_decode(int32_t v, fy_kv_tier_t *t)
{
    if (v >= 0) return *t = FY_KV_DEVICE, v;
    if (v > INT32_MIN / 2) return *t = FY_KV_HOST, -2 - v;
    return *t = FY_KV_DISK, INT32_MIN / 2 - v;
}

/* Takes a reference on a block found in the index (cached -> used). */
static void pin(tier_t *T, int32_t b)
{
    if (T->state[b] == BLOCK_CACHED)
        take_cached(T, b);
    else
        T->ref[b]++;
}

/* Copies a pinned host block hb into a new device block, which takes over
 * its name; the host block is freed.  On failure (-1) the pin is let go. */
static int32_t promote_host(fy_kvm_t *m, int32_t hb)
{
    tier_t *D = &m->tier[FY_KV_DEVICE], *H = &m->tier[FY_KV_HOST];
    int32_t db = -1;
    if (available(m, NULL) >= 1) {
        db = alloc_block(m, FY_KV_DEVICE);
        if (m->copy(m->copy_arg, FY_KV_DEVICE, &db, FY_KV_HOST, &hb, 1) != FY_OK) {
            unref(m, FY_KV_DEVICE, db);
            db = -1;
        }
    }
    if (db < 0) {
        unref(m, FY_KV_HOST, hb); /* still named: back to the host LRU */
        return -1;
    }
    move_name(m, FY_KV_HOST, hb, FY_KV_DEVICE, db);
    make_free(H, hb);
    D->filled[db] = (uint16_t)m->lay.block_size;
    m->promotions++;
    return db;
}

/* Reads a pinned disk slot kb into a new host block, which takes over its
 * name; the slot is freed.  On failure (-1) the pin is let go (and an
 * unreadable slot dropped). */
static int32_t stage_disk(fy_kvm_t *m, int32_t kb)
{
    tier_t *K = &m->tier[FY_KV_DISK];
    if (takeable(m, FY_KV_HOST) < 1) {
        unref(m, FY_KV_DISK, kb);
        return -1;
    }
    int32_t hb = alloc_block(m, FY_KV_HOST);
    ssize_t r = pread(m->disk_fd, host_block(m, hb), m->lay.block_bytes, (off_t)kb * (off_t)m->lay.block_bytes);
    uint8_t sum[DISK_SUM_BYTES];
    bool ok = r == (ssize_t)m->lay.block_bytes;
    if (!ok) {
        fy_warn("kv: disk tier: read failed (%s); dropping the block", r < 0 ? strerror(errno) : "short");
    } else {
        disk_sum(m, host_block(m, hb), sum);
        if (sodium_memcmp(sum, m->disk_sum[kb], sizeof(sum)) != 0) {
            m->disk_bad++;
            fy_warn("kv: disk tier: slot %d does not hold what was written there (its checksum differs); dropping "
                    "the block: the prompt is computed from there",
                    kb);
            ok = false;
        }
    }
    if (!ok) {
        unref(m, FY_KV_HOST, hb);
        make_free(K, kb);
        return -1;
    }
    move_name(m, FY_KV_DISK, kb, FY_KV_HOST, hb);
    make_free(K, kb);
    return hb;
}

/* A pinned prefix block of tier t, as a device block (-1: no room; the
 * pin is let go). */
static int32_t bring_to_device(fy_kvm_t *m, fy_kv_tier_t t, int32_t b)
{
    if (t == FY_KV_DISK && (b = stage_disk(m, b)) < 0) return -1;
    return t == FY_KV_DEVICE ? b : promote_host(m, b);
}

/* Group g's copy of prefix block i, in whichever tier names it (-1: none). */
static int32_t find_any(const fy_kvm_t *m, const fy_block_table_t *bt, int32_t g, int32_t i, fy_kv_tier_t *t_p)
{
    fy_kv_hash_t nm;
    group_name(&bt->hashes[i], g, &nm);
    for (fy_kv_tier_t t = FY_KV_DEVICE; t < FY_KV_TIERS; t++) {
        int32_t b = index_find(&m->tier[t], &nm);
        if (b >= 0) return *t_p = t, b;
    }
    return -1;
}

/* Whether every group has the blocks a query at k * block_size reads,
 * among prefix blocks [from, k) (the blocks before `from` are known). */
static bool prefix_found(const fy_kvm_t *m, const fy_block_table_t *bt, int32_t k, int32_t from)
{
    fy_kv_tier_t t;
    for (int32_t g = 0; g < bt->n_groups; g++) {
        int32_t lo = first_seen(m, g, k * bt->block_size);
        for (int32_t i = lo > from ? lo : from; i < k; i++)
            if (find_any(m, bt, g, i, &t) < 0) return false;
    }
    return true;
}

/* Lets go of table entries [from, to) of every group: device blocks and
 * pinned blocks of any tier. */
static void unpin_range(fy_kvm_t *m, fy_block_table_t *bt, int32_t from, int32_t to)
{
    for (int32_t g = 0; g < bt->n_groups; g++) {
        int32_t *t = grp(bt, g);
        for (int32_t i = from; i < to; i++) {
            if (t[i] == -1) continue;
            fy_kv_tier_t tier;
            int32_t b = loc_decode(t[i], &tier);
            unref(m, tier, b);
            t[i] = -1;
        }
    }
}

fy_status_t fy_kvm_seq_lookup(fy_kvm_t *m, fy_block_table_t *bt, const int32_t *tokens, int32_t n, int32_t *hit_p)
{
    if (bt->n_blocks || bt->tier != FY_KV_DEVICE || n < 0) {
        fy_error("kv: prefix lookup on a table that is not empty");
        return FY_ERR_INVALID;
    }
    m->queries++;
    m->query_tokens += (uint64_t)(n > 0 ? n : 0);
    int32_t bs = bt->block_size, hit = 0, ng = bt->n_groups;
    bool sliding = false;
    for (int32_t g = 0; g < ng; g++) sliding |= m->lay.group_window[g] > 0;
    if (m->prefix_caching && n > 1) {
        int32_t want = (n - 1) / bs; /* at least one token is left to compute */
        if (want > bt->max_blocks) want = bt->max_blocks;
        /* the longest run of blocks the global groups hold (names are
         * computed only as far as the prefix is found: the caller may go on
         * with other tokens after the hit), then the longest hit within it
         * whose windows the sliding groups hold */
        int32_t k = 0;
        fy_kv_tier_t t = FY_KV_DEVICE;
        for (; k < want; k++) {
            hash_upto(m, bt, tokens, (k + 1) * bs);
            bool all = true;
            for (int32_t g = 0; g < ng && all; g++)
                if (!m->lay.group_window[g]) all = find_any(m, bt, g, k, &t) >= 0;
            if (!all) break;
        }
        if (sliding)
            while (k > 0 && !prefix_found(m, bt, k, 0)) k--;
        /* pin every block of the hit wherever it is, so that promoting one
         * cannot evict another from a lower tier */
        for (int32_t g = 0; g < ng && k > 0; g++) {
            int32_t *tab = grp(bt, g);
            bt->lo[g] = first_seen(m, g, k * bs);
            for (int32_t i = bt->lo[g]; i < k; i++) {
                int32_t b = find_any(m, bt, g, i, &t);
                pin(&m->tier[t], b);
                tab[i] = loc_encode(t, b);
            }
        }
        bt->n_blocks = k;
        /* then bring them to the device in order; where there is no room
         * the hit ends before that block (without sliding groups) or is
         * given up (a shorter hit would need window blocks not pinned) */
        for (int32_t i = 0; i < k; i++) {
            bool ok = true;
            for (int32_t g = 0; g < ng; g++) {
                int32_t *tab = grp(bt, g);
                if (i < bt->lo[g]) continue;
                fy_kv_tier_t from;
                int32_t b = loc_decode(tab[i], &from), db = ok ? bring_to_device(m, from, b) : -1;
                if (db < 0) {
                    if (ok) tab[i] = -1; /* bring_to_device let its pin go */
                    ok = false;
                    continue;
                }
                m->tier[from].hits++;
                tab[i] = db;
            }
            if (!ok) {
                int32_t keep = sliding ? 0 : i;
                unpin_range(m, bt, keep, k);
                k = keep;
                break;
            }
        }
        if (k == 0) memset(bt->lo, 0, (size_t)ng * sizeof(int32_t));
        hit = k;
        bt->n_blocks = hit;
        bt->n_named = hit;
        bt->n_hashed = hit;
        m->hit_blocks += (uint64_t)hit;
        m->hit_tokens += (uint64_t)hit * (uint64_t)bs;
    }
    bt->n_tokens = hit * bs;
    if (hit_p) *hit_p = hit * bs;
    CHECK_BOOKS(m);
    return FY_OK;
}

/* fy_kvm_seq_reserve after any slide: copy-on-write of the block the next
 * token goes into, in every group, and new blocks from each group's
 * window on. */
static fy_status_t reserve(fy_kvm_t *m, fy_block_table_t *bt, int32_t n_tokens, fy_kv_resv_t *resv)
{
    int32_t bs = bt->block_size, ng = bt->n_groups;
    int32_t need = (n_tokens + bs - 1) / bs;
    if (need > bt->max_blocks) return FY_ERR_INVALID;
    tier_t *D = &m->tier[FY_KV_DEVICE];
    /* the block the next token goes into must be this sequence's alone
     * and not a named (immutable) prefix block */
    int32_t cur = bt->n_tokens / bs, n_cow = 0, grow = 0;
    bool writes = n_tokens > bt->n_tokens && cur < bt->n_blocks;
    for (int32_t g = 0; g < ng; g++) {
        int32_t *t = grp(bt, g), from = bt->n_blocks > bt->lo[g] ? bt->n_blocks : bt->lo[g];
        if (writes && cur >= bt->lo[g] && (D->ref[t[cur]] > 1 || D->named[t[cur]])) n_cow++;
        if (need > from) grow += need - from;
    }
    if (grow + n_cow > available(m, resv)) return FY_ERR_NO_SPACE;
    for (int32_t g = 0; g < ng && n_cow; g++) {
        int32_t *t = grp(bt, g);
        if (cur < bt->lo[g] || !(D->ref[t[cur]] > 1 || D->named[t[cur]])) continue;
        int32_t old = t[cur], nb = alloc_block(m, FY_KV_DEVICE);
        draw(m, resv, 1);
        fy_status_t st = m->copy(m->copy_arg, FY_KV_DEVICE, &nb, FY_KV_DEVICE, &old, 1);
        if (st != FY_OK) {
            unref(m, FY_KV_DEVICE, nb);
            return st;
        }
        D->filled[nb] = D->filled[old];
        unref(m, FY_KV_DEVICE, old);
        t[cur] = nb;
        if (bt->n_named > cur) bt->n_named = cur;
        m->cow_copies++;
    }
    for (int32_t g = 0; g < ng; g++) {
        int32_t *t = grp(bt, g);
        for (int32_t i = bt->n_blocks > bt->lo[g] ? bt->n_blocks : bt->lo[g]; i < need; i++) {
            t[i] = alloc_block(m, FY_KV_DEVICE);
            draw(m, resv, 1);
        }
    }
    if (need > bt->n_blocks) bt->n_blocks = need;
    CHECK_BOOKS(m);
    return FY_OK;
}

fy_status_t fy_kvm_seq_reserve(fy_kvm_t *m, fy_block_table_t *bt, int32_t n_tokens, fy_kv_resv_t *resv)
{
    if (bt->tier != FY_KV_DEVICE) {
        fy_error("kv: reserve on a swapped-out sequence");
        return FY_ERR_INVALID;
    }
    return reserve(m, bt, n_tokens, resv);
}

fy_status_t fy_kvm_seq_reserve_from(fy_kvm_t *m, fy_block_table_t *bt, int32_t n_tokens, int32_t from,
                                    fy_kv_resv_t *resv)
{
    if (bt->tier != FY_KV_DEVICE || from < bt->n_tokens || from > n_tokens) {
        fy_error("kv: reserve from position %d of a sequence of %d tokens (%d written)", from, n_tokens, bt->n_tokens);
        return FY_ERR_INVALID;
    }
    if ((n_tokens + bt->block_size - 1) / bt->block_size > bt->max_blocks) return FY_ERR_INVALID;
    slide(m, bt, from, resv);
    return reserve(m, bt, n_tokens, resv);
}

/* Where group g's reserved slots begin: the first block not cached, or
 * its window's first block. */
static int32_t slots_from(const fy_block_table_t *bt, int32_t g)
{
    int32_t first = bt->n_tokens / bt->block_size;
    return first > bt->lo[g] ? first : bt->lo[g];
}

fy_status_t fy_kvm_seq_reserve_slots(fy_kvm_t *m, fy_block_table_t *bt, int32_t n_tokens, int32_t slots,
                                     fy_kv_resv_t *resv)
{
    int32_t bs = bt->block_size, need = (int32_t)(((int64_t)n_tokens + bs - 1) / bs);
    if (bt->tier != FY_KV_DEVICE || n_tokens <= bt->n_tokens || bt->n_tokens % bs || slots < 1 ||
        bt->n_blocks > bt->n_tokens / bs || need > bt->max_blocks) {
        fy_error("kv: %d slots for a sequence of %d tokens (%d written, room for %d blocks)", slots, n_tokens,
                 bt->n_tokens, bt->max_blocks);
        return FY_ERR_INVALID;
    }
    slide(m, bt, n_tokens, resv);
    int32_t grow = 0;
    for (int32_t g = 0; g < bt->n_groups; g++) {
        int32_t from = slots_from(bt, g);
        grow += need - from < slots ? (need - from > 0 ? need - from : 0) : slots;
    }
    if (grow > available(m, resv)) return FY_ERR_NO_SPACE;
    for (int32_t g = 0; g < bt->n_groups; g++) {
        int32_t from = slots_from(bt, g), *t = grp(bt, g);
        for (int32_t i = from; i < need && i < from + slots; i++) {
            t[i] = alloc_block(m, FY_KV_DEVICE);
            draw(m, resv, 1);
        }
    }
    bt->n_blocks = need;
    CHECK_BOOKS(m);
    return FY_OK;
}

/* Whether sorted kept[n] holds i. */
static bool kept_has(const int32_t *kept, int32_t n, int32_t i)
{
    int32_t lo = 0, hi = n;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (kept[mid] < i)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && kept[lo] == i;
}

fy_status_t fy_kvm_seq_place(fy_kvm_t *m, fy_block_table_t *bt, const int32_t *kept, int32_t n_kept, fy_kv_resv_t *resv)
{
    int32_t nb = bt->n_blocks, first = bt->n_tokens / bt->block_size;
    const char *why = NULL;
    int32_t at = -1, grp_bad = -1;
    if (bt->tier != FY_KV_DEVICE || n_kept < 1 || n_kept > nb || kept[n_kept - 1] != nb - 1)
        why = "the prompt's last block is not the last kept";
    for (int32_t k = 0; k < n_kept && !why; k++)
        if (kept[k] < 0 || kept[k] >= nb || (k && kept[k] <= kept[k - 1])) why = "out of order or range", at = k;
    for (int32_t g = 0; g < bt->n_groups && !why; g++) {
        const int32_t *t = grp(bt, g);
        int32_t from = slots_from(bt, g), have = 0, want = 0;
        while (from + have < nb && t[from + have] >= 0) have++;
        for (int32_t i = from + have; i < nb && !why; i++)
            if (t[i] >= 0) why = "the reserved blocks are not where fy_kvm_seq_reserve_slots put them", grp_bad = g;
        for (int32_t k = 0; k < n_kept; k++) {
            int32_t i = kept[k];
            if (i >= from)
                want++;
            else if (i >= bt->lo[g] && t[i] < 0)
                why = "a kept cached block is not here", at = k, grp_bad = g;
        }
        if (want > have && !why) why = "more kept blocks than reserved", grp_bad = g;
    }
    if (why) {
        fy_error("kv: placing %d kept blocks of a %d-block prompt (%d cached): %s (entry %d, kv group %d)", n_kept, nb,
                 first, why, at, grp_bad);
        return FY_ERR_INVALID;
    }
    int32_t before = takeable(m, FY_KV_DEVICE), gap = -1, lo_min = INT32_MAX;
    for (int32_t g = 0; g < bt->n_groups; g++) {
        int32_t *t = grp(bt, g), from = slots_from(bt, g), have = 0, k0 = 0;
        if (bt->lo[g] < lo_min) lo_min = bt->lo[g];
        while (from + have < nb && t[from + have] >= 0) have++;
        while (k0 < n_kept && kept[k0] < from) k0++;
        int32_t want = n_kept - k0;
        /* the reserved blocks the sender did not fill go back (fresh, never
         * written); then, last first, reserved block j moves to the j-th
         * kept index from `from` on, which is at or after it: every entry
         * above is empty or already placed */
        for (int32_t s = from + want; s < from + have; s++) unref_entry(m, bt, &t[s]);
        for (int32_t j = want - 1; j >= 0; j--) {
            int32_t b = t[from + j];
            t[from + j] = -1;
            t[kept[k0 + j]] = b;
        }
        for (int32_t i = bt->lo[g]; i < from; i++)
            if (t[i] >= 0 && !kept_has(kept, n_kept, i)) {
                unref_entry(m, bt, &t[i]);
                m->evicted_blocks++;
            }
    }
    for (int32_t i = lo_min; i < nb; i++)
        if (!kept_has(kept, n_kept, i)) {
            if (gap < 0) gap = i;
            bt->n_evicted++;
        }
    if (gap >= 0 && bt->name_limit > gap) bt->name_limit = gap;
    int32_t back = takeable(m, FY_KV_DEVICE) - before;
    if (resv && back > 0) {
        resv->blocks += back;
        m->promised += back;
    }
    CHECK_BOOKS(m);
    return FY_OK;
}

void fy_kvm_seq_commit(fy_kvm_t *m, fy_block_table_t *bt, const int32_t *tokens, int32_t n, fy_kv_resv_t *resv)
{
    int32_t bs = bt->block_size, ng = bt->n_groups;
    if (n > bt->n_blocks * bs) n = bt->n_blocks * bs; /* a caller bug; never write past the table */
    tier_t *D = &m->tier[FY_KV_DEVICE];
    for (int32_t b = bt->n_tokens / bs; b * bs < n; b++) {
        int32_t f = n - b * bs < bs ? n - b * bs : bs;
        for (int32_t g = 0; g < ng && bt->tier == FY_KV_DEVICE; g++) {
            int32_t id = b >= bt->lo[g] ? grp(bt, g)[b] : -1;
            if (id >= 0 && D->filled[id] < f) D->filled[id] = (uint16_t)f;
        }
    }
    if (n > bt->n_tokens) bt->n_tokens = n;
    if (m->prefix_caching && bt->tier == FY_KV_DEVICE) {
        hash_upto(m, bt, tokens, n);
        int32_t full = n / bs < bt->name_limit ? n / bs : bt->name_limit;
        for (int32_t i = bt->n_named; i < full; i++) {
            for (int32_t g = 0; g < ng; g++) {
                if (i < bt->lo[g]) continue;
                int32_t b = grp(bt, g)[i];
                if (b < 0 || D->named[b]) continue;
                /* a name lives in one tier at a time: the device copy wins;
                 * an identical block already named on the device keeps its
                 * name */
                fy_kv_hash_t nm;
                group_name(&bt->hashes[i], g, &nm);
                if (index_find(D, &nm) >= 0) continue;
                for (fy_kv_tier_t t = FY_KV_HOST; t < FY_KV_TIERS; t++) {
                    int32_t o = index_find(&m->tier[t], &nm);
                    if (o >= 0 && m->tier[t].state[o] == BLOCK_CACHED) make_free(&m->tier[t], o);
                }
                index_add(D, b, &nm, g ? NAME_DERIVED : NAME_PRIMARY);
            }
        }
        if (full > bt->n_named) bt->n_named = full;
    }
    /* after naming: a full block a sliding group drops stays cached under
     * its name for later prefix hits */
    slide(m, bt, bt->n_tokens, resv);
    CHECK_BOOKS(m);
}

void fy_kvm_seq_truncate(fy_kvm_t *m, fy_block_table_t *bt, int32_t n)
{
    int32_t bs = bt->block_size, ng = bt->n_groups;
    if (n < 0) n = 0;
    int32_t keep = (n + bs - 1) / bs;
    for (int32_t g = 0; g < ng; g++)
        if (bt->lo[g] > first_seen(m, g, n))
            fy_error("kv: truncating to %d tokens, behind what group %d already dropped (block %d)", n, g, bt->lo[g]);
    /* later blocks first, as in release */
    for (int32_t i = bt->n_blocks - 1; i >= keep; i--)
        for (int32_t g = 0; g < ng; g++)
            if (i >= bt->lo[g]) unref_entry(m, bt, &grp(bt, g)[i]);
    if (bt->n_blocks > keep) bt->n_blocks = keep;
    if (bt->n_tokens > n) bt->n_tokens = n;
    if (bt->n_hashed > n / bs) bt->n_hashed = n / bs;
    if (bt->n_named > n / bs) bt->n_named = n / bs;
    if (bt->tier == FY_KV_DEVICE && keep > 0 && n % bs) {
        tier_t *D = &m->tier[FY_KV_DEVICE];
        for (int32_t g = 0; g < ng; g++) {
            int32_t last = keep - 1 >= bt->lo[g] ? grp(bt, g)[keep - 1] : -1;
            if (last >= 0 && D->ref[last] == 1 && !D->named[last]) D->filled[last] = (uint16_t)(n % bs);
        }
    }
}

int32_t fy_kvm_seq_rollback(fy_kvm_t *m, fy_block_table_t *bt, int32_t n, fy_kv_resv_t *resv, int32_t owed)
{
    int32_t before = takeable(m, FY_KV_DEVICE);
    fy_kvm_seq_truncate(m, bt, n);
    int32_t back = takeable(m, FY_KV_DEVICE) - before;
    if (!resv || bt->tier != FY_KV_DEVICE || back <= 0) return 0;
    if (back > owed) back = owed;
    if (back <= 0) return 0;
    resv->blocks += back;
    m->promised += back;
    CHECK_BOOKS(m);
    return back;
}

fy_status_t fy_kvm_seq_evict(fy_kvm_t *m, fy_block_table_t *bt, const int32_t *blocks, int32_t n, fy_kv_resv_t *resv)
{
    int32_t cur = bt->n_tokens / bt->block_size; /* the block the next token goes into, or past the last */
    for (int32_t k = 0; k < n; k++) {
        int32_t i = blocks[k];
        bool held = false;
        for (int32_t g = 0; g < bt->n_groups && i >= 0 && i < cur; g++) held |= i >= bt->lo[g] && grp(bt, g)[i] >= 0;
        bool again = false;
        for (int32_t j = 0; j < k && !again; j++) again = blocks[j] == i;
        if (i < 0 || i >= cur || !held || again) {
            fy_error("kv: cannot evict block %d of a sequence of %d tokens (%s)", i, bt->n_tokens,
                     i < 0 || i >= cur ? "not a full block before the one being written"
                     : again           ? "asked twice"
                                       : "already gone");
            return FY_ERR_INVALID;
        }
    }
    int32_t before = takeable(m, FY_KV_DEVICE);
    for (int32_t k = 0; k < n; k++) {
        for (int32_t g = 0; g < bt->n_groups; g++) {
            int32_t *e = &grp(bt, g)[blocks[k]];
            if (blocks[k] < bt->lo[g] || *e < 0) continue;
            unref_entry(m, bt, e);
            m->evicted_blocks++;
        }
        bt->n_evicted++;
    }
    if (n > 0 && bt->name_limit > cur) bt->name_limit = cur;
    int32_t back = takeable(m, FY_KV_DEVICE) - before;
    if (resv && bt->tier == FY_KV_DEVICE && back > 0) {
        resv->blocks += back;
        m->promised += back;
    }
    CHECK_BOOKS(m);
    return FY_OK;
}

fy_status_t fy_kvm_seq_fork(fy_kvm_t *m, const fy_block_table_t *src, fy_block_table_t *dst)
{
    if (dst->n_blocks || dst->max_blocks < src->n_blocks || src->tier != FY_KV_DEVICE ||
        dst->n_groups != src->n_groups) {
        fy_error("kv: fork into a table that is not empty or too small, or from a swapped-out one");
        return FY_ERR_INVALID;
    }
    tier_t *D = &m->tier[FY_KV_DEVICE];
    for (int32_t g = 0; g < src->n_groups; g++) {
        const int32_t *s = grp(src, g);
        int32_t *d = grp(dst, g);
        for (int32_t i = src->lo[g]; i < src->n_blocks; i++) {
            d[i] = s[i];
            if (s[i] >= 0) D->ref[s[i]]++;
        }
        dst->lo[g] = src->lo[g];
    }
    memcpy(dst->hashes, src->hashes, (size_t)src->n_hashed * sizeof(fy_kv_hash_t));
    dst->n_blocks = src->n_blocks;
    dst->n_tokens = src->n_tokens;
    dst->n_hashed = src->n_hashed;
    dst->n_named = src->n_named;
    dst->name_limit = src->name_limit;
    dst->n_evicted = src->n_evicted;
    dst->ns = src->ns;
    dst->tier = FY_KV_DEVICE;
    return FY_OK;
}

void fy_kvm_seq_release(fy_kvm_t *m, fy_block_table_t *bt)
{
    /* later blocks first, so they reach the LRU list first and are evicted
     * before the prefix blocks that more requests share */
    for (int32_t i = bt->n_blocks - 1; i >= 0; i--)
        for (int32_t g = 0; g < bt->n_groups; g++)
            if (i >= bt->lo[g]) unref_entry(m, bt, &grp(bt, g)[i]);
    if (bt->lo) memset(bt->lo, 0, (size_t)bt->n_groups * sizeof(int32_t));
    bt->n_blocks = 0;
    bt->n_tokens = bt->n_hashed = bt->n_named = bt->n_evicted = 0;
    bt->name_limit = INT32_MAX;
    bt->tier = FY_KV_DEVICE;
    CHECK_BOOKS(m);
}

/* The blocks a table holds, as (group, index) positions into its blocks[]:
 * pos[] gets fy_block_table_held entries. */
static int32_t held_positions(const fy_block_table_t *bt, size_t *pos)
{
    int32_t n = 0;
    for (int32_t g = 0; g < bt->n_groups; g++)
        for (int32_t i = bt->lo[g]; i < bt->n_blocks; i++)
            if (grp(bt, g)[i] >= 0) pos[n++] = (size_t)g * (size_t)bt->max_blocks + (size_t)i;
    return n;
}

fy_status_t fy_kvm_seq_swap_out(fy_kvm_t *m, fy_block_table_t *bt)
{
    if (m->tier[FY_KV_HOST].n == 0) return FY_ERR_UNSUPPORTED;
    if (bt->tier != FY_KV_DEVICE) return FY_ERR_INVALID;
    int32_t n = fy_block_table_held(bt);
    if (takeable(m, FY_KV_HOST) < n) return FY_ERR_NO_SPACE;
    size_t cnt = (size_t)(n ? n : 1);
    int32_t *hb = fy_malloc(cnt * 2 * sizeof(int32_t));
    size_t *pos = fy_malloc(cnt * sizeof(size_t));
    if (!hb || !pos) {
        fy_free(hb);
        fy_free(pos);
        fy_error("kv: out of memory swapping out %d blocks", n);
        return FY_ERR_NOMEM;
    }
    int32_t *db = hb + cnt;
    held_positions(bt, pos);
    for (int32_t i = 0; i < n; i++) {
        hb[i] = alloc_block(m, FY_KV_HOST);
        db[i] = bt->blocks[pos[i]];
    }
    fy_status_t st = n ? m->copy(m->copy_arg, FY_KV_HOST, hb, FY_KV_DEVICE, db, n) : FY_OK;
    if (st != FY_OK) {
        for (int32_t i = 0; i < n; i++) unref(m, FY_KV_HOST, hb[i]);
        fy_free(hb);
        fy_free(pos);
        return st;
    }
    for (int32_t i = 0; i < n; i++) {
        unref(m, FY_KV_DEVICE, db[i]);
        bt->blocks[pos[i]] = hb[i];
    }
    fy_free(hb);
    fy_free(pos);
    bt->tier = FY_KV_HOST;
    bt->n_named = 0; /* host copies are private; names stay with the device blocks */
    m->swap_out_blocks += (uint64_t)n;
    CHECK_BOOKS(m);
    return FY_OK;
}

fy_status_t fy_kvm_seq_swap_in(fy_kvm_t *m, fy_block_table_t *bt, fy_kv_resv_t *resv)
{
    if (bt->tier != FY_KV_HOST) return FY_ERR_INVALID;
    tier_t *D = &m->tier[FY_KV_DEVICE];
    int32_t n = fy_block_table_held(bt), bs = bt->block_size;
    size_t cnt = (size_t)(n ? n : 1);
    int32_t *db = fy_malloc(cnt * sizeof(int32_t) * 3);
    size_t *pos = fy_malloc(cnt * sizeof(size_t));
    if (!db || !pos) {
        fy_free(db);
        fy_free(pos);
        fy_error("kv: out of memory swapping in %d blocks", n);
        return FY_ERR_NOMEM;
    }
    int32_t *src = db + cnt, *dst = db + 2 * cnt, n_copy = 0;
    held_positions(bt, pos);
    /* full blocks still named on the device are shared, not copied: pin
     * them all before allocating, so no allocation can evict one */
    for (int32_t k = 0; k < n; k++) {
        int32_t g = (int32_t)(pos[k] / (size_t)bt->max_blocks), i = (int32_t)(pos[k] % (size_t)bt->max_blocks);
        db[k] = -1;
        if (m->prefix_caching && i < bt->n_hashed && (i + 1) * bs <= bt->n_tokens) {
            fy_kv_hash_t nm;
            group_name(&bt->hashes[i], g, &nm);
            int32_t b = index_find(D, &nm);
            if (b >= 0) {
                pin(D, b);
                db[k] = b;
            }
        }
        if (db[k] < 0) n_copy++;
    }
    if (n_copy > available(m, resv)) {
        for (int32_t k = 0; k < n; k++)
            if (db[k] >= 0) unref(m, FY_KV_DEVICE, db[k]);
        fy_free(db);
        fy_free(pos);
        return FY_ERR_NO_SPACE;
    }
    n_copy = 0;
    for (int32_t k = 0; k < n; k++) {
        if (db[k] >= 0) continue;
        db[k] = alloc_block(m, FY_KV_DEVICE);
        draw(m, resv, 1);
        src[n_copy] = bt->blocks[pos[k]];
        dst[n_copy++] = db[k];
    }
    fy_status_t st = n_copy ? m->copy(m->copy_arg, FY_KV_DEVICE, dst, FY_KV_HOST, src, n_copy) : FY_OK;
    if (st != FY_OK) {
        for (int32_t k = 0; k < n; k++) unref(m, FY_KV_DEVICE, db[k]);
        fy_free(db);
        fy_free(pos);
        return st;
    }
    for (int32_t k = 0; k < n; k++) {
        int32_t i = (int32_t)(pos[k] % (size_t)bt->max_blocks);
        int32_t f = bt->n_tokens - i * bs < bs ? bt->n_tokens - i * bs : bs;
        if (D->filled[db[k]] < f) D->filled[db[k]] = (uint16_t)f;
        unref(m, FY_KV_HOST, bt->blocks[pos[k]]);
        bt->blocks[pos[k]] = db[k];
    }
    fy_free(db);
    fy_free(pos);
    bt->tier = FY_KV_DEVICE;
    /* leading blocks whose every held copy is named */
    bt->n_named = 0;
    for (int32_t i = 0; i < bt->n_blocks; i++) {
        bool named = true;
        for (int32_t g = 0; g < bt->n_groups && named; g++)
            if (i >= bt->lo[g] && grp(bt, g)[i] >= 0) named = D->named[grp(bt, g)[i]] != 0;
        if (!named) break;
        bt->n_named = i + 1;
    }
    m->swap_in_blocks += (uint64_t)n;
    CHECK_BOOKS(m);
    return FY_OK;
}

/* ---- admission ------------------------------------------------------------------------------------ */

int32_t fy_kvm_blocks_for(const fy_kvm_t *m, int32_t prompt_tokens, int32_t max_tokens, int32_t cached_tokens)
{
    return fy_kvm_blocks_for_capped(m, prompt_tokens, max_tokens, cached_tokens, INT32_MAX);
}

int32_t fy_kvm_blocks_for_capped(const fy_kvm_t *m, int32_t prompt_tokens, int32_t max_tokens, int32_t cached_tokens,
                                 int32_t cap)
{
    int64_t need = fy_kv_blocks_needed(&m->lay, (int64_t)prompt_tokens + max_tokens, cached_tokens, m->max_step, cap);
    return need > INT32_MAX ? INT32_MAX : (int32_t)need;
}

fy_status_t fy_kvm_admit(fy_kvm_t *m, int32_t blocks, fy_kv_resv_t *resv)
{
    if (blocks < 0) return FY_ERR_INVALID;
    if ((int64_t)blocks > (int64_t)takeable(m, FY_KV_DEVICE) - m->promised - m->watermark_blocks)
        return FY_ERR_NO_SPACE;
    m->promised += blocks;
    resv->blocks += blocks;
    return FY_OK;
}

void fy_kvm_resv_release(fy_kvm_t *m, fy_kv_resv_t *resv)
{
    m->promised -= resv->blocks;
    resv->blocks = 0;
}

int32_t fy_kvm_admittable(const fy_kvm_t *m)
{
    int64_t n = (int64_t)takeable(m, FY_KV_DEVICE) - m->promised - m->watermark_blocks;
    return n < 0 ? 0 : (int32_t)n;
}

int32_t fy_kvm_capacity(const fy_kvm_t *m)
{
    int32_t n = m->tier[FY_KV_DEVICE].n - m->watermark_blocks;
    return n < 0 ? 0 : n;
}

void fy_kvm_foreach_name(const fy_kvm_t *m, fy_kv_tier_t tier, void (*fn)(void *arg, const fy_kv_hash_t *h), void *arg)
{
    const tier_t *T = &m->tier[tier];
    for (int32_t b = 0; b < T->n; b++)
        if (T->named[b] == NAME_PRIMARY) fn(arg, &T->name[b]);
}

/* ---- figures ---------------------------------------------------------------------------------------- */

void fy_kvm_stats(const fy_kvm_t *m, fy_kvm_stats_t *o)
{
    memset(o, 0, sizeof(*o));
    for (int t = 0; t < FY_KV_TIERS; t++) {
        const tier_t *T = &m->tier[t];
        o->tier[t] = (fy_kvm_tier_stats_t){T->n, T->n_free, T->n_used, T->n_cached, T->hits, T->evictions};
    }
    const tier_t *D = &m->tier[FY_KV_DEVICE];
    uint64_t slots = 0, filled = 0;
    for (int32_t b = 0; b < D->n; b++) {
        if (D->state[b] != BLOCK_USED) continue;
        slots += (uint64_t)m->lay.block_size;
        filled += D->filled[b];
    }
    o->balanced = books_balance(m);
    o->usage = D->n ? (double)D->n_used / D->n : 0.0;
    o->waste = slots ? (double)(slots - filled) / (double)slots : 0.0;
    o->promised = m->promised;
    o->queries = m->queries;
    o->query_tokens = m->query_tokens;
    o->hit_blocks = m->hit_blocks;
    o->hit_tokens = m->hit_tokens;
    o->cow_copies = m->cow_copies;
    o->swap_out_blocks = m->swap_out_blocks;
    o->swap_in_blocks = m->swap_in_blocks;
    o->demotions = m->demotions;
    o->promotions = m->promotions;
    o->disk_bad_blocks = m->disk_bad;
    o->slid_blocks = m->slid_blocks;
    o->evicted_blocks = m->evicted_blocks;
    for (int32_t g = 0; g < m->lay.n_groups; g++) {
        if (m->lay.group_window[g])
            o->groups_sliding++;
        else
            o->groups_global++;
    }
}

int32_t fy_kvm_n_free(const fy_kvm_t *m, fy_kv_tier_t t) { return m->tier[t].n_free; }

int32_t fy_kvm_refcount(const fy_kvm_t *m, fy_kv_tier_t t, int32_t b) { return m->tier[t].ref[b]; }

fy_status_t fy_kvm_check(const fy_kvm_t *m)
{
#define BAD(...)                                                                                                       \
    do {                                                                                                               \
        char m_[200];                                                                                                  \
        snprintf(m_, sizeof(m_), __VA_ARGS__);                                                                         \
        fy_error("kv: invariant broken in the %s tier: %s", fy_kv_tier_name((fy_kv_tier_t)t), m_);                     \
        return FY_ERR_INTERNAL;                                                                                        \
    } while (0)
    for (int t = 0; t < FY_KV_TIERS; t++) {
        const tier_t *T = &m->tier[t];
        int32_t n_free = 0, n_used = 0, n_cached = 0, n_named = 0;
        for (int32_t b = 0; b < T->n; b++) {
            switch (T->state[b]) {
            case BLOCK_FREE:
                n_free++;
                if (T->ref[b] != 0 || T->named[b]) BAD("free block %d has references or a name", b);
                break;
            case BLOCK_USED:
                n_used++;
                if (T->ref[b] < 1) BAD("used block %d has refcount %d", b, T->ref[b]);
                break;
            case BLOCK_CACHED:
                n_cached++;
                if (T->ref[b] != 0 || !T->named[b]) BAD("cached block %d has references or no name", b);
                break;
            default: BAD("block %d in state %d", b, T->state[b]);
            }
            if (T->named[b]) {
                n_named++;
                if (index_find(T, &T->name[b]) != b) BAD("block %d is named but the index does not find it", b);
            }
        }
        if (n_free != T->n_free || n_used != T->n_used || n_cached != T->n_cached)
            BAD("counted %d free, %d used, %d cached; books say %d, %d, %d", n_free, n_used, n_cached, T->n_free,
                T->n_used, T->n_cached);
        if (n_free + n_used + n_cached != T->n)
            BAD("free + used + cached = %d, not %d", n_free + n_used + n_cached, T->n);
        for (int32_t i = 0; i < T->n_free; i++)
            if (T->state[T->free_stack[i]] != BLOCK_FREE) BAD("free stack holds block %d, not free", T->free_stack[i]);
        int32_t walked = 0, prev = -1;
        for (int32_t b = T->head; b >= 0; prev = b, b = T->next[b]) {
            if (T->state[b] != BLOCK_CACHED || T->prev[b] != prev || ++walked > T->n)
                BAD("lru list corrupt at block %d", b);
        }
        if (walked != T->n_cached || prev != T->tail) BAD("lru list holds %d blocks, not %d", walked, T->n_cached);
        int32_t in_index = 0;
        for (uint32_t i = 0; T->n && i <= T->index_mask; i++) {
            int32_t b = T->index[i];
            if (b < 0) continue;
            in_index++;
            if (b >= T->n || !T->named[b]) BAD("index slot %u holds block %d without a name", i, b);
        }
        if (in_index != n_named) BAD("index holds %d names, blocks hold %d", in_index, n_named);
    }
    if (m->promised < 0) {
        fy_error("kv: invariant broken: %d blocks promised", m->promised);
        return FY_ERR_INTERNAL;
    }
#undef BAD
    return FY_OK;
}

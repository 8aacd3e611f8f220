/* gguf_writer.c - GGUF v3 serializer for tests. */
#include "tests/gguf_writer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct buf {
    uint8_t *p;
    size_t len, cap;
} buf_t;

typedef struct tensor {
    char *name;
    uint32_t type;
    int n_dims;
    int64_t ne[8]; /* room for invalid files with too many dims */
    uint8_t *data;
    size_t nbytes;
} tensor_t;

struct fy_gw {
    uint32_t version;
    uint32_t alignment;
    uint64_t n_kv;
    buf_t kv;
    tensor_t *t;
    size_t n_t;
    buf_t out;
};

static void put(buf_t *b, const void *p, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->len + n) cap *= 2;
        b->p = realloc(b->p, cap);
        if (!b->p) abort();
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, p, n); /* p may be NULL for nothing (a file without metadata) */
    b->len += n;
}

static void put_u32(buf_t *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(buf_t *b, uint64_t v) { put(b, &v, 8); }
static void put_str(buf_t *b, const char *s)
{
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}

fy_gw_t *fy_gw_new(void)
{
    fy_gw_t *w = calloc(1, sizeof(*w));
    if (!w) abort();
    w->version = 3;
    w->alignment = 32;
    return w;
}

void fy_gw_free(fy_gw_t *w)
{
    if (!w) return;
    for (size_t i = 0; i < w->n_t; i++) {
        free(w->t[i].name);
        free(w->t[i].data);
    }
    free(w->t);
    free(w->kv.p);
    free(w->out.p);
    free(w);
}

void fy_gw_set_version(fy_gw_t *w, uint32_t version) { w->version = version; }

static void key(fy_gw_t *w, const char *k, uint32_t type)
{
    put_str(&w->kv, k);
    put_u32(&w->kv, type);
    w->n_kv++;
}

void fy_gw_set_alignment(fy_gw_t *w, uint32_t alignment)
{
    w->alignment = alignment;
    fy_gw_u32(w, "general.alignment", alignment);
}

void fy_gw_u32(fy_gw_t *w, const char *k, uint32_t v)
{
    key(w, k, 4);
    put_u32(&w->kv, v);
}
void fy_gw_i32(fy_gw_t *w, const char *k, int32_t v)
{
    key(w, k, 5);
    put(&w->kv, &v, 4);
}
void fy_gw_f32(fy_gw_t *w, const char *k, float v)
{
    key(w, k, 6);
    put(&w->kv, &v, 4);
}
void fy_gw_bool(fy_gw_t *w, const char *k, bool v)
{
    uint8_t b = v;
    key(w, k, 7);
    put(&w->kv, &b, 1);
}
void fy_gw_str(fy_gw_t *w, const char *k, const char *v)
{
    key(w, k, 8);
    put_str(&w->kv, v);
}

void fy_gw_str_arr(fy_gw_t *w, const char *k, const char *const *v, size_t n)
{
    key(w, k, 9);
    put_u32(&w->kv, 8);
    put_u64(&w->kv, n);
    for (size_t i = 0; i < n; i++) put_str(&w->kv, v[i]);
}

void fy_gw_f32_arr(fy_gw_t *w, const char *k, const float *v, size_t n)
{
    key(w, k, 9);
    put_u32(&w->kv, 6);
    put_u64(&w->kv, n);
    put(&w->kv, v, 4 * n);
}

void fy_gw_i32_arr(fy_gw_t *w, const char *k, const int32_t *v, size_t n)
{
    key(w, k, 9);
    put_u32(&w->kv, 5);
    put_u64(&w->kv, n);
    put(&w->kv, v, 4 * n);
}

void fy_gw_tensor_take(fy_gw_t *w, const char *name, uint32_t type, int n_dims, const int64_t *ne, void *data,
                       size_t nbytes)
{
    w->t = realloc(w->t, (w->n_t + 1) * sizeof(*w->t));
    if (!w->t) abort();
    tensor_t *t = &w->t[w->n_t++];
    memset(t, 0, sizeof(*t));
    t->name = strdup(name);
    t->type = type;
    if (n_dims > 8) abort();
    t->n_dims = n_dims;
    for (int i = 0; i < n_dims; i++) t->ne[i] = ne[i];
    t->data = data;
    if (!t->name || !t->data) abort();
    t->nbytes = nbytes;
}

void fy_gw_tensor(fy_gw_t *w, const char *name, uint32_t type, int n_dims, const int64_t *ne, const void *data,
                  size_t nbytes)
{
    void *copy = malloc(nbytes ? nbytes : 1);
    if (!copy) abort();
    memcpy(copy, data, nbytes);
    fy_gw_tensor_take(w, name, type, n_dims, ne, copy, nbytes);
}

/* The header and tensor infos, padded to the alignment, into w->out. */
static void put_head(fy_gw_t *w)
{
    buf_t *b = &w->out;
    b->len = 0;
    put_u32(b, 0x46554747u);
    put_u32(b, w->version);
    put_u64(b, w->n_t);
    put_u64(b, w->n_kv);
    put(b, w->kv.p, w->kv.len);
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        tensor_t *t = &w->t[i];
        put_str(b, t->name);
        put_u32(b, (uint32_t)t->n_dims);
        for (int d = 0; d < t->n_dims; d++) put_u64(b, (uint64_t)t->ne[d]);
        put_u32(b, t->type);
        put_u64(b, off);
        off += t->nbytes;
        off = (off + w->alignment - 1) / w->alignment * w->alignment;
    }
    static const uint8_t zeros[4096];
    while (b->len % w->alignment) put(b, zeros, 1);
}

const uint8_t *fy_gw_bytes(fy_gw_t *w, size_t *len_p)
{
    buf_t *b = &w->out;
    static const uint8_t zeros[4096];
    put_head(w);
    for (size_t i = 0; i < w->n_t; i++) {
        put(b, w->t[i].data, w->t[i].nbytes);
        while (b->len % w->alignment) put(b, zeros, 1);
    }
    *len_p = b->len;
    return b->p;
}

/* the bytes fy_gw_bytes makes, streamed: a model of gigabytes is not
 * copied into one buffer first */
bool fy_gw_write(fy_gw_t *w, const char *path)
{
    static const uint8_t zeros[4096];
    put_head(w);
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    bool ok = fwrite(w->out.p, 1, w->out.len, f) == w->out.len;
    for (size_t i = 0; ok && i < w->n_t; i++) {
        size_t pad = (w->alignment - w->t[i].nbytes % w->alignment) % w->alignment;
        ok = fwrite(w->t[i].data, 1, w->t[i].nbytes, f) == w->t[i].nbytes && fwrite(zeros, 1, pad, f) == pad;
    }
    return fclose(f) == 0 && ok;
}

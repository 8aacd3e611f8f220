/*
 * gguf.c - GGUF reader.  Layout (all little-endian):
 *   "GGUF" u32 version, u64 n_tensors, u64 n_kv,
 *   n_kv x { string key, u32 type, value },
 *   n_tensors x { string name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset },
 *   padding to general.alignment (default 32), tensor data.
 * A string is u64 length + bytes; an array is u32 elem type + u64 count + elems.
 * Every read goes through a cursor that checks the bytes left.
 */
#include "model/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/mem.h"

#define GGUF_MAGIC 0x46554747u /* "GGUF" */
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_KEY_LEN 65535
#define GGUF_MAX_NAME_LEN 1024
#define GGUF_MAX_ARRAY_DEPTH 2 /* arrays of arrays are allowed one level deep */
#define GGUF_MAX_ELEMS (INT64_C(1) << 48)

typedef struct gguf_kv {
    fy_str_t key;
    fy_gguf_type_t type;
    const uint8_t *value;    /* the encoded value (for arrays: the first element) */
    fy_gguf_type_t arr_type; /* arrays only */
    uint64_t arr_n;          /* arrays only */
} gguf_kv_t;

struct fy_gguf {
    char *path;
    int fd;
    const uint8_t *map;
    uint64_t size;
    uint32_t version;
    uint64_t n_kv;
    gguf_kv_t *kv;
    uint64_t n_tensors;
    fy_gguf_tensor_t *tensors;
    uint64_t alignment;
    uint64_t data_offset;
};

typedef struct cursor {
    const uint8_t *base;
    uint64_t size;
    uint64_t pos;
    const char *path;
} cursor_t;

/* ggml type ids: name, block elements, block bytes (0: unknown to ferry) */
static const struct {
    const char *name;
    int supported_dtype; /* -1 if ferry cannot use it */
} g_ggml_types[] = {
    [0] = {"f32", FY_DTYPE_F32},
    [1] = {"f16", FY_DTYPE_F16},
    [2] = {"q4_0", FY_DTYPE_Q4_0},
    [3] = {"q4_1", FY_DTYPE_Q4_1},
    [4] = {"q4_2 (removed)", -1},
    [5] = {"q4_3 (removed)", -1},
    [6] = {"q5_0", FY_DTYPE_Q5_0},
    [7] = {"q5_1", FY_DTYPE_Q5_1},
    [8] = {"q8_0", FY_DTYPE_Q8_0},
    [9] = {"q8_1", -1},
    [10] = {"q2_k", FY_DTYPE_Q2_K},
    [11] = {"q3_k", FY_DTYPE_Q3_K},
    [12] = {"q4_k", FY_DTYPE_Q4_K},
    [13] = {"q5_k", FY_DTYPE_Q5_K},
    [14] = {"q6_k", FY_DTYPE_Q6_K},
    [15] = {"q8_k", -1},
    [16] = {"iq2_xxs", -1},
    [17] = {"iq2_xs", -1},
    [18] = {"iq3_xxs", -1},
    [19] = {"iq1_s", -1},
    [20] = {"iq4_nl", FY_DTYPE_IQ4_NL},
    [21] = {"iq3_s", -1},
    [22] = {"iq2_s", -1},
    [23] = {"iq4_xs", -1},
    [24] = {"i8", -1},
    [25] = {"i16", -1},
    [26] = {"i32", -1},
    [27] = {"i64", -1},
    [28] = {"f64", -1},
    [29] = {"iq1_m", -1},
    [30] = {"bf16", FY_DTYPE_BF16},
};

const char *fy_gguf_ggml_type_name(uint32_t t)
{
    if (t < FY_ARRAY_LEN(g_ggml_types) && g_ggml_types[t].name) return g_ggml_types[t].name;
    return "unknown";
}

bool fy_str_eq(fy_str_t s, const char *cstr)
{
    size_t n = strlen(cstr);
    return s.len == n && memcmp(s.ptr, cstr, n) == 0;
}

static const char *type_name(fy_gguf_type_t t)
{
    static const char *names[] = {"uint8", "int8",   "uint16", "int16",  "uint32", "int32",  "float32",
                                  "bool",  "string", "array",  "uint64", "int64",  "float64"};
    return (unsigned)t < FY_GGUF_TYPE_COUNT ? names[t] : "invalid";
}

static uint64_t scalar_size(fy_gguf_type_t t)
{
    switch (t) {
    case FY_GGUF_TYPE_UINT8:
    case FY_GGUF_TYPE_INT8:
    case FY_GGUF_TYPE_BOOL: return 1;
    case FY_GGUF_TYPE_UINT16:
    case FY_GGUF_TYPE_INT16: return 2;
    case FY_GGUF_TYPE_UINT32:
    case FY_GGUF_TYPE_INT32:
    case FY_GGUF_TYPE_FLOAT32: return 4;
    case FY_GGUF_TYPE_UINT64:
    case FY_GGUF_TYPE_INT64:
    case FY_GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

static bool cur_read(cursor_t *c, void *dst, uint64_t n)
{
    if (n > c->size - c->pos) return false;
    memcpy(dst, c->base + c->pos, n);
    c->pos += n;
    return true;
}

static bool cur_skip(cursor_t *c, uint64_t n)
{
    if (n > c->size - c->pos) return false;
    c->pos += n;
    return true;
}

static bool cur_u32(cursor_t *c, uint32_t *v) { return cur_read(c, v, 4); }
static bool cur_u64(cursor_t *c, uint64_t *v) { return cur_read(c, v, 8); }

static bool cur_str(cursor_t *c, fy_str_t *s, uint64_t max_len)
{
    uint64_t len;
    if (!cur_u64(c, &len) || len > max_len || len > c->size - c->pos) return false;
    s->ptr = (const char *)(c->base + c->pos);
    s->len = len;
    c->pos += len;
    return true;
}

#define FAIL(g, ...)                                                                                                   \
    do {                                                                                                               \
        char msg_[256];                                                                                                \
        snprintf(msg_, sizeof(msg_), __VA_ARGS__);                                                                     \
        fy_error("gguf: %s: %s", (g)->path, msg_);                                                                     \
        return FY_ERR_FORMAT;                                                                                          \
    } while (0)

/* Skips one value of type t (arrays recursively, bounded depth). */
static fy_status_t skip_value(fy_gguf_t *g, cursor_t *c, fy_gguf_type_t t, int depth, const char *key)
{
    if (t == FY_GGUF_TYPE_STRING) {
        fy_str_t s;
        if (!cur_str(c, &s, UINT64_MAX)) FAIL(g, "metadata '%s': string runs past end of file", key);
        return FY_OK;
    }
    if (t == FY_GGUF_TYPE_ARRAY) {
        uint32_t et;
        uint64_t n;
        if (depth >= GGUF_MAX_ARRAY_DEPTH) FAIL(g, "metadata '%s': arrays nested too deep", key);
        if (!cur_u32(c, &et) || !cur_u64(c, &n)) FAIL(g, "metadata '%s': array header runs past end of file", key);
        if (et >= FY_GGUF_TYPE_COUNT) FAIL(g, "metadata '%s': invalid array element type %u", key, et);
        uint64_t es = scalar_size((fy_gguf_type_t)et);
        if (es) {
            if (n > (c->size - c->pos) / es)
                FAIL(g, "metadata '%s': array of %llu elements runs past end of file", key, (unsigned long long)n);
            c->pos += n * es;
            return FY_OK;
        }
        /* strings or nested arrays: each takes at least 8 bytes, so a count
         * larger than that bound is already known to be a lie */
        if (n > (c->size - c->pos) / 8)
            FAIL(g, "metadata '%s': array of %llu elements runs past end of file", key, (unsigned long long)n);
        for (uint64_t i = 0; i < n; i++) {
            fy_status_t st = skip_value(g, c, (fy_gguf_type_t)et, depth + 1, key);
            if (st != FY_OK) return st;
        }
        return FY_OK;
    }
    uint64_t sz = scalar_size(t);
    if (!sz) FAIL(g, "metadata '%s': invalid value type %u", key, (unsigned)t);
    if (!cur_skip(c, sz)) FAIL(g, "metadata '%s': value runs past end of file", key);
    return FY_OK;
}

static const gguf_kv_t *find_kv(const fy_gguf_t *g, const char *key)
{
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (fy_str_eq(g->kv[i].key, key)) return &g->kv[i];
    return NULL;
}

static fy_status_t parse(fy_gguf_t *g)
{
    cursor_t c = {.base = g->map, .size = g->size, .pos = 0, .path = g->path};
    uint32_t magic;
    if (!cur_u32(&c, &magic)) FAIL(g, "file too short for a gguf header (%llu bytes)", (unsigned long long)g->size);
    if (magic != GGUF_MAGIC) FAIL(g, "not a gguf file (bad magic 0x%08x)", magic);
    if (!cur_u32(&c, &g->version)) FAIL(g, "truncated header");
    if (g->version != 2 && g->version != 3)
        FAIL(g, "unsupported gguf version %u (ferry reads versions 2 and 3)", g->version);
    if (!cur_u64(&c, &g->n_tensors) || !cur_u64(&c, &g->n_kv)) FAIL(g, "truncated header");
    /* each kv takes >= 8+4+1 bytes and each tensor record >= 8+4+4+8 bytes */
    if (g->n_kv > g->size / 13) FAIL(g, "absurd metadata count %llu", (unsigned long long)g->n_kv);
    if (g->n_tensors > g->size / 24) FAIL(g, "absurd tensor count %llu", (unsigned long long)g->n_tensors);

    g->kv = fy_calloc(g->n_kv ? g->n_kv : 1, sizeof(*g->kv));
    g->tensors = fy_calloc(g->n_tensors ? g->n_tensors : 1, sizeof(*g->tensors));
    if (!g->kv || !g->tensors) {
        fy_error("gguf: %s: out of memory reading the header", g->path);
        return FY_ERR_NOMEM;
    }

    for (uint64_t i = 0; i < g->n_kv; i++) {
        gguf_kv_t *kv = &g->kv[i];
        uint32_t t;
        if (!cur_str(&c, &kv->key, GGUF_MAX_KEY_LEN))
            FAIL(g, "metadata key %llu runs past end of file or is too long", (unsigned long long)i);
        if (!cur_u32(&c, &t)) FAIL(g, "metadata key %llu: truncated", (unsigned long long)i);
        char key[128];
        snprintf(key, sizeof(key), "%.*s", (int)FY_MIN(kv->key.len, 100), kv->key.ptr);
        if (t >= FY_GGUF_TYPE_COUNT) FAIL(g, "metadata '%s': invalid value type %u", key, t);
        kv->type = (fy_gguf_type_t)t;
        if (kv->type == FY_GGUF_TYPE_ARRAY) {
            uint64_t start = c.pos;
            uint32_t et;
            if (!cur_u32(&c, &et) || !cur_u64(&c, &kv->arr_n))
                FAIL(g, "metadata '%s': array header runs past end of file", key);
            if (et >= FY_GGUF_TYPE_COUNT) FAIL(g, "metadata '%s': invalid array element type %u", key, et);
            kv->arr_type = (fy_gguf_type_t)et;
            kv->value = c.base + c.pos;
            c.pos = start;
        } else {
            kv->value = c.base + c.pos;
        }
        fy_status_t st = skip_value(g, &c, kv->type, 0, key);
        if (st != FY_OK) return st;
        for (uint64_t j = 0; j < i; j++)
            if (g->kv[j].key.len == kv->key.len && !memcmp(g->kv[j].key.ptr, kv->key.ptr, kv->key.len))
                FAIL(g, "metadata key '%s' appears twice", key);
    }

    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv_t *al = find_kv(g, "general.alignment");
    if (al) {
        uint32_t a;
        if (al->type != FY_GGUF_TYPE_UINT32) FAIL(g, "general.alignment is not a uint32");
        memcpy(&a, al->value, 4);
        if (a == 0 || (a & (a - 1)) || a > (1u << 20))
            FAIL(g, "general.alignment %u is not a power of two up to 1 MiB", a);
        g->alignment = a;
    }

    for (uint64_t i = 0; i < g->n_tensors; i++) {
        fy_gguf_tensor_t *t = &g->tensors[i];
        if (!cur_str(&c, &t->name, GGUF_MAX_NAME_LEN))
            FAIL(g, "tensor record %llu: name runs past end of file or is too long", (unsigned long long)i);
        char name[128];
        snprintf(name, sizeof(name), "%.*s", (int)FY_MIN(t->name.len, 100), t->name.ptr);
        if (!cur_u32(&c, &t->n_dims)) FAIL(g, "tensor '%s': truncated record", name);
        if (t->n_dims == 0 || t->n_dims > FY_GGUF_MAX_DIMS)
            FAIL(g, "tensor '%s': %u dimensions (1 to %d allowed)", name, t->n_dims, FY_GGUF_MAX_DIMS);
        int64_t elems = 1;
        for (int d = 0; d < FY_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            uint64_t ne;
            if (!cur_u64(&c, &ne)) FAIL(g, "tensor '%s': truncated record", name);
            if (ne == 0 || ne > (uint64_t)GGUF_MAX_ELEMS)
                FAIL(g, "tensor '%s': absurd dimension %u = %llu", name, d, (unsigned long long)ne);
            t->ne[d] = (int64_t)ne;
            if (__builtin_mul_overflow(elems, (int64_t)ne, &elems) || elems > GGUF_MAX_ELEMS)
                FAIL(g, "tensor '%s': absurd size (element count overflows)", name);
        }
        if (!cur_u32(&c, &t->ggml_type) || !cur_u64(&c, &t->offset)) FAIL(g, "tensor '%s': truncated record", name);
        for (uint64_t j = 0; j < i; j++)
            if (g->tensors[j].name.len == t->name.len && !memcmp(g->tensors[j].name.ptr, t->name.ptr, t->name.len))
                FAIL(g, "tensor '%s' appears twice", name);
    }

    g->data_offset = FY_ALIGN_UP(c.pos, g->alignment);
    if (g->data_offset > g->size && g->n_tensors > 0) FAIL(g, "file ends before the tensor data");

    for (uint64_t i = 0; i < g->n_tensors; i++) {
        fy_gguf_tensor_t *t = &g->tensors[i];
        char name[128];
        snprintf(name, sizeof(name), "%.*s", (int)FY_MIN(t->name.len, 100), t->name.ptr);
        if (t->offset % g->alignment)
            FAIL(g, "tensor '%s': data offset %llu is not a multiple of the alignment %llu", name,
                 (unsigned long long)t->offset, (unsigned long long)g->alignment);
        int dt = t->ggml_type < FY_ARRAY_LEN(g_ggml_types) && g_ggml_types[t->ggml_type].name
                     ? g_ggml_types[t->ggml_type].supported_dtype
                     : -1;
        if (dt < 0) continue; /* reported by whoever needs this tensor */
        t->supported = true;
        t->dtype = (fy_dtype_t)dt;
        size_t row;
        if (fy_dtype_row_bytes(t->dtype, t->ne[0], &row) != FY_OK)
            FAIL(g, "tensor '%s': row of %lld elements is not a whole number of %s blocks", name, (long long)t->ne[0],
                 fy_dtype_name(t->dtype));
        uint64_t bytes = row;
        for (int d = 1; d < FY_GGUF_MAX_DIMS; d++)
            if (__builtin_mul_overflow(bytes, (uint64_t)t->ne[d], &bytes))
                FAIL(g, "tensor '%s': absurd size (byte count overflows)", name);
        uint64_t start;
        if (__builtin_add_overflow(g->data_offset, t->offset, &start) || start > g->size || bytes > g->size - start)
            FAIL(g, "tensor '%s' (%llu bytes at offset %llu) ends past the end of the file (%llu bytes): truncated?",
                 name, (unsigned long long)bytes, (unsigned long long)t->offset, (unsigned long long)g->size);
        t->offset = start;
        t->nbytes = bytes;
        t->data = g->map + start;
    }
    return FY_OK;
}

fy_status_t fy_gguf_open(const char *path, fy_gguf_t **gguf_p)
{
    fy_status_t st = FY_ERR_NOMEM;
    fy_gguf_t *g = fy_calloc(1, sizeof(*g));
    if (!g) goto err;
    g->fd = -1;
    g->path = fy_strdup(path);
    if (!g->path) goto err_free;

    g->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (g->fd < 0) {
        fy_error("gguf: %s: cannot open: %m", path);
        st = FY_ERR_IO;
        goto err_free;
    }
    struct stat sb;
    if (fstat(g->fd, &sb) != 0) {
        fy_error("gguf: %s: cannot stat: %m", path);
        st = FY_ERR_IO;
        goto err_close;
    }
    if (!S_ISREG(sb.st_mode)) {
        fy_error("gguf: %s: not a regular file", path);
        st = FY_ERR_IO;
        goto err_close;
    }
    g->size = (uint64_t)sb.st_size;
    if (g->size < 24) {
        fy_error("gguf: %s: file too short for a gguf header (%llu bytes)", path, (unsigned long long)g->size);
        st = FY_ERR_FORMAT;
        goto err_close;
    }
    void *map = mmap(NULL, g->size, PROT_READ, MAP_PRIVATE, g->fd, 0);
    if (map == MAP_FAILED) {
        fy_error("gguf: %s: cannot map: %m", path);
        st = FY_ERR_IO;
        goto err_close;
    }
    g->map = map;
    st = parse(g);
    if (st != FY_OK) goto err_close; /* fy_gguf_close unmaps */
    *gguf_p = g;
    return FY_OK;

err_close:
    fy_gguf_close(g);
    return st;
err_free:
    fy_free(g->path);
    fy_free(g);
err:
    if (st == FY_ERR_NOMEM) fy_error("gguf: %s: out of memory", path);
    return st;
}

void fy_gguf_close(fy_gguf_t *g)
{
    if (!g) return;
    if (g->map) munmap((void *)g->map, g->size);
    if (g->fd >= 0) close(g->fd);
    fy_free(g->kv);
    fy_free(g->tensors);
    fy_free(g->path);
    fy_free(g);
}

size_t fy_gguf_drop(const fy_gguf_t *g, const void *p, size_t len)
{
    return g ? fy_mem_drop_file_pages(g->map, g->size, p, len) : 0;
}

const char *fy_gguf_path(const fy_gguf_t *g) { return g->path; }
uint32_t fy_gguf_version(const fy_gguf_t *g) { return g->version; }
uint64_t fy_gguf_file_size(const fy_gguf_t *g) { return g->size; }
uint64_t fy_gguf_n_tensors(const fy_gguf_t *g) { return g->n_tensors; }

const fy_gguf_tensor_t *fy_gguf_tensor(const fy_gguf_t *g, uint64_t i)
{
    return i < g->n_tensors ? &g->tensors[i] : NULL;
}

const fy_gguf_tensor_t *fy_gguf_find_tensor(const fy_gguf_t *g, const char *name)
{
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (fy_str_eq(g->tensors[i].name, name)) return &g->tensors[i];
    return NULL;
}

bool fy_gguf_has_key(const fy_gguf_t *g, const char *key) { return find_kv(g, key) != NULL; }

fy_gguf_type_t fy_gguf_key_type(const fy_gguf_t *g, const char *key)
{
    const gguf_kv_t *kv = find_kv(g, key);
    return kv ? kv->type : FY_GGUF_TYPE_COUNT;
}

/* Reads an integer value of any width as int64 (uint64 above INT64_MAX fails). */
static bool read_int(fy_gguf_type_t t, const uint8_t *p, int64_t *v)
{
    switch (t) {
    case FY_GGUF_TYPE_UINT8: *v = *p; return true;
    case FY_GGUF_TYPE_INT8: *v = (int8_t)*p; return true;
    case FY_GGUF_TYPE_BOOL: *v = *p != 0; return true;
    case FY_GGUF_TYPE_UINT16: {
        uint16_t x;
        memcpy(&x, p, 2);
        *v = x;
        return true;
    }
    case FY_GGUF_TYPE_INT16: {
        int16_t x;
        memcpy(&x, p, 2);
        *v = x;
        return true;
    }
    case FY_GGUF_TYPE_UINT32: {
        uint32_t x;
        memcpy(&x, p, 4);
        *v = x;
        return true;
    }
    case FY_GGUF_TYPE_INT32: {
        int32_t x;
        memcpy(&x, p, 4);
        *v = x;
        return true;
    }
    case FY_GGUF_TYPE_INT64: {
        int64_t x;
        memcpy(&x, p, 8);
        *v = x;
        return true;
    }
    case FY_GGUF_TYPE_UINT64: {
        uint64_t x;
        memcpy(&x, p, 8);
        if (x > (uint64_t)INT64_MAX) return false;
        *v = (int64_t)x;
        return true;
    }
    default: return false;
    }
}

static fy_status_t wrong_type(const fy_gguf_t *g, const char *key, const char *want, fy_gguf_type_t got)
{
    fy_error("gguf: %s: metadata '%s' should be %s but is %s", g->path, key, want, type_name(got));
    return FY_ERR_FORMAT;
}

fy_status_t fy_gguf_get_u32(const fy_gguf_t *g, const char *key, uint32_t *value_p)
{
    const gguf_kv_t *kv = find_kv(g, key);
    if (!kv) return FY_ERR_NOT_FOUND;
    int64_t v;
    if (kv->type == FY_GGUF_TYPE_BOOL || !read_int(kv->type, kv->value, &v))
        return wrong_type(g, key, "an integer", kv->type);
    if (v < 0 || v > UINT32_MAX) {
        fy_error("gguf: %s: metadata '%s' = %lld is out of range", g->path, key, (long long)v);
        return FY_ERR_FORMAT;
    }
    *value_p = (uint32_t)v;
    return FY_OK;
}

fy_status_t fy_gguf_get_f32(const fy_gguf_t *g, const char *key, float *value_p)
{
    const gguf_kv_t *kv = find_kv(g, key);
    if (!kv) return FY_ERR_NOT_FOUND;
    if (kv->type == FY_GGUF_TYPE_FLOAT32) {
        memcpy(value_p, kv->value, 4);
    } else if (kv->type == FY_GGUF_TYPE_FLOAT64) {
        double d;
        memcpy(&d, kv->value, 8);
        *value_p = (float)d;
    } else {
        int64_t v;
        if (kv->type == FY_GGUF_TYPE_BOOL || !read_int(kv->type, kv->value, &v))
            return wrong_type(g, key, "a number", kv->type);
        *value_p = (float)v;
    }
    return FY_OK;
}

fy_status_t fy_gguf_get_bool(const fy_gguf_t *g, const char *key, bool *value_p)
{
    const gguf_kv_t *kv = find_kv(g, key);
    if (!kv) return FY_ERR_NOT_FOUND;
    if (kv->type != FY_GGUF_TYPE_BOOL) return wrong_type(g, key, "a bool", kv->type);
    *value_p = *kv->value != 0;
    return FY_OK;
}

fy_status_t fy_gguf_get_str(const fy_gguf_t *g, const char *key, fy_str_t *value_p)
{
    const gguf_kv_t *kv = find_kv(g, key);
    if (!kv) return FY_ERR_NOT_FOUND;
    if (kv->type != FY_GGUF_TYPE_STRING) return wrong_type(g, key, "a string", kv->type);
    uint64_t len;
    memcpy(&len, kv->value, 8);
    value_p->ptr = (const char *)kv->value + 8;
    value_p->len = len;
    return FY_OK;
}

static fy_status_t get_arr(const fy_gguf_t *g, const char *key, const gguf_kv_t **kv_p)
{
    const gguf_kv_t *kv = find_kv(g, key);
    if (!kv) return FY_ERR_NOT_FOUND;
    if (kv->type != FY_GGUF_TYPE_ARRAY) return wrong_type(g, key, "an array", kv->type);
    *kv_p = kv;
    return FY_OK;
}

fy_status_t fy_gguf_get_str_arr(const fy_gguf_t *g, const char *key, fy_str_t **values_p, uint64_t *n_p)
{
    const gguf_kv_t *kv;
    fy_status_t st = get_arr(g, key, &kv);
    if (st != FY_OK) return st;
    if (kv->arr_type != FY_GGUF_TYPE_STRING) return wrong_type(g, key, "an array of strings", kv->arr_type);
    fy_str_t *out = fy_calloc(kv->arr_n ? kv->arr_n : 1, sizeof(*out));
    if (!out) {
        fy_error("gguf: %s: out of memory reading '%s'", g->path, key);
        return FY_ERR_NOMEM;
    }
    const uint8_t *p = kv->value; /* validated at open */
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        uint64_t len;
        memcpy(&len, p, 8);
        out[i].ptr = (const char *)p + 8;
        out[i].len = len;
        p += 8 + len;
    }
    *values_p = out;
    *n_p = kv->arr_n;
    return FY_OK;
}

fy_status_t fy_gguf_get_f32_arr(const fy_gguf_t *g, const char *key, float **values_p, uint64_t *n_p)
{
    const gguf_kv_t *kv;
    fy_status_t st = get_arr(g, key, &kv);
    if (st != FY_OK) return st;
    if (kv->arr_type != FY_GGUF_TYPE_FLOAT32 && kv->arr_type != FY_GGUF_TYPE_FLOAT64)
        return wrong_type(g, key, "an array of floats", kv->arr_type);
    float *out = fy_calloc(kv->arr_n ? kv->arr_n : 1, sizeof(*out));
    if (!out) {
        fy_error("gguf: %s: out of memory reading '%s'", g->path, key);
        return FY_ERR_NOMEM;
    }
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        if (kv->arr_type == FY_GGUF_TYPE_FLOAT32) {
            memcpy(&out[i], kv->value + 4 * i, 4);
        } else {
            double d;
            memcpy(&d, kv->value + 8 * i, 8);
            out[i] = (float)d;
        }
    }
    *values_p = out;
    *n_p = kv->arr_n;
    return FY_OK;
}

fy_status_t fy_gguf_get_i32_arr(const fy_gguf_t *g, const char *key, int32_t **values_p, uint64_t *n_p)
{
    const gguf_kv_t *kv;
    fy_status_t st = get_arr(g, key, &kv);
    if (st != FY_OK) return st;
    uint64_t es = scalar_size(kv->arr_type);
    if (!es || kv->arr_type == FY_GGUF_TYPE_FLOAT32 || kv->arr_type == FY_GGUF_TYPE_FLOAT64)
        return wrong_type(g, key, "an array of integers", kv->arr_type);
    int32_t *out = fy_calloc(kv->arr_n ? kv->arr_n : 1, sizeof(*out));
    if (!out) {
        fy_error("gguf: %s: out of memory reading '%s'", g->path, key);
        return FY_ERR_NOMEM;
    }
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        int64_t v;
        if (!read_int(kv->arr_type, kv->value + es * i, &v) || v < INT32_MIN || v > INT32_MAX) {
            fy_error("gguf: %s: metadata '%s'[%llu] is out of int32 range", g->path, key, (unsigned long long)i);
            fy_free(out);
            return FY_ERR_FORMAT;
        }
        out[i] = (int32_t)v;
    }
    *values_p = out;
    *n_p = kv->arr_n;
    return FY_OK;
}

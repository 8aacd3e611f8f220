/*
 * safetensors.c - safetensors reader.  A file is: u64 header length N
 * (little-endian), N bytes of JSON { name: {dtype, shape, data_offsets:
 * [begin, end]}, "__metadata__": {...} }, then the data; offsets are
 * relative to the end of the header.
 */
#include "model/safetensors.h"

#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/mem.h"

#define ST_MAX_HEADER (100u << 20) /* the format's own limit */
#define ST_MAX_FILES 1024

typedef struct st_file {
    char *path;
    int fd;
    const uint8_t *map;
    uint64_t size;
} st_file_t;

struct fy_safetensors {
    st_file_t *files;
    int n_files;
    fy_st_tensor_t *tensors;
    int64_t n_tensors, cap_tensors;
};

static const struct {
    const char *name;
    int bytes;
    int dtype; /* -1: not usable by ferry */
} g_types[] = {
    {"F64", 8, -1}, {"F32", 4, FY_DTYPE_F32}, {"F16", 2, FY_DTYPE_F16}, {"BF16", 2, FY_DTYPE_BF16},
    {"I64", 8, -1}, {"I32", 4, -1},           {"I16", 2, -1},           {"I8", 1, -1},
    {"U8", 1, -1},  {"BOOL", 1, -1},          {"F8_E4M3", 1, -1},       {"F8_E5M2", 1, -1},
    {"U16", 2, -1}, {"U32", 4, -1},           {"U64", 8, -1},
};

static fy_status_t map_file(const char *path, st_file_t *f)
{
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (f->fd < 0) {
        fy_error("safetensors: %s: cannot open: %m", path);
        return FY_ERR_IO;
    }
    struct stat sb;
    if (fstat(f->fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fy_error("safetensors: %s: not a regular file", path);
        return FY_ERR_IO;
    }
    f->size = (uint64_t)sb.st_size;
    if (f->size < 8) {
        fy_error("safetensors: %s: file too short for a header (%llu bytes)", path, (unsigned long long)f->size);
        return FY_ERR_FORMAT;
    }
    void *m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, f->fd, 0);
    if (m == MAP_FAILED) {
        fy_error("safetensors: %s: cannot map: %m", path);
        return FY_ERR_IO;
    }
    f->map = m;
    return FY_OK;
}

static fy_status_t add_tensor(fy_safetensors_t *st, const char *path, const char *name, json_t *desc,
                              const st_file_t *f, uint64_t data_start)
{
#define BAD(...)                                                                                                       \
    do {                                                                                                               \
        char m_[256];                                                                                                  \
        snprintf(m_, sizeof(m_), __VA_ARGS__);                                                                         \
        fy_error("safetensors: %s: tensor '%s': %s", path, name, m_);                                                  \
        return FY_ERR_FORMAT;                                                                                          \
    } while (0)
    if (!json_is_object(desc)) BAD("entry is not an object");
    json_t *jd = json_object_get(desc, "dtype");
    json_t *js = json_object_get(desc, "shape");
    json_t *jo = json_object_get(desc, "data_offsets");
    if (!json_is_string(jd)) BAD("missing or non-string dtype");
    if (!json_is_array(js)) BAD("missing or non-array shape");
    if (!json_is_array(jo) || json_array_size(jo) != 2) BAD("data_offsets is not [begin, end]");
    const char *dname = json_string_value(jd);
    int ti = -1;
    for (size_t i = 0; i < FY_ARRAY_LEN(g_types); i++)
        if (!strcmp(dname, g_types[i].name)) ti = (int)i;
    if (ti < 0) BAD("unknown dtype '%s'", dname);
    size_t nd = json_array_size(js);
    if (nd > FY_ST_MAX_DIMS) BAD("%zu dimensions (at most %d)", nd, FY_ST_MAX_DIMS);
    uint64_t elems = 1;
    int64_t shape[FY_ST_MAX_DIMS] = {0};
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(js, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0) BAD("shape[%zu] is not a non-negative integer", i);
        shape[i] = (int64_t)json_integer_value(d);
        if (__builtin_mul_overflow(elems, (uint64_t)shape[i], &elems) || elems > (UINT64_C(1) << 48))
            BAD("absurd shape (element count overflows)");
    }
    json_t *jb = json_array_get(jo, 0), *je = json_array_get(jo, 1);
    if (!json_is_integer(jb) || !json_is_integer(je) || json_integer_value(jb) < 0 ||
        json_integer_value(je) < json_integer_value(jb))
        BAD("data_offsets are not integers with begin <= end");
    uint64_t b = (uint64_t)json_integer_value(jb), e = (uint64_t)json_integer_value(je);
    uint64_t avail = f->size - data_start;
    if (e > avail)
        BAD("data ends at byte %llu past the end of the data (%llu bytes): truncated?", (unsigned long long)e,
            (unsigned long long)avail);
    if (e - b != elems * (uint64_t)g_types[ti].bytes)
        BAD("holds %llu bytes but shape and dtype %s need %llu", (unsigned long long)(e - b), dname,
            (unsigned long long)(elems * (uint64_t)g_types[ti].bytes));
#undef BAD
    if (st->n_tensors == st->cap_tensors) {
        int64_t cap = st->cap_tensors ? st->cap_tensors * 2 : 256;
        fy_st_tensor_t *t = fy_realloc(st->tensors, (size_t)cap * sizeof(*t));
        if (!t) goto nomem;
        st->tensors = t;
        st->cap_tensors = cap;
    }
    fy_st_tensor_t *t = &st->tensors[st->n_tensors];
    memset(t, 0, sizeof(*t));
    t->name = fy_strdup(name);
    if (!t->name) goto nomem;
    st->n_tensors++;
    t->dtype_name = g_types[ti].name;
    t->supported = g_types[ti].dtype >= 0;
    t->dtype = t->supported ? (fy_dtype_t)g_types[ti].dtype : FY_DTYPE_F32;
    t->n_dims = (int)nd;
    memcpy(t->shape, shape, sizeof(shape));
    t->nbytes = e - b;
    t->data = f->map + data_start + b;
    t->file = f->path;
    return FY_OK;
nomem:
    fy_error("safetensors: %s: out of memory", path);
    return FY_ERR_NOMEM;
}

static fy_status_t parse_file(fy_safetensors_t *st, st_file_t *f)
{
    uint64_t hlen;
    memcpy(&hlen, f->map, 8);
    if (hlen > ST_MAX_HEADER || hlen > f->size - 8) {
        fy_error("safetensors: %s: header length %llu is larger than the file or 100 MiB", f->path,
                 (unsigned long long)hlen);
        return FY_ERR_FORMAT;
    }
    json_error_t jerr;
    json_t *root = json_loadb((const char *)f->map + 8, hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        fy_error("safetensors: %s: header is not valid json: %s (line %d)", f->path, jerr.text, jerr.line);
        return FY_ERR_FORMAT;
    }
    fy_status_t status = FY_OK;
    if (!json_is_object(root)) {
        fy_error("safetensors: %s: header is not a json object", f->path);
        status = FY_ERR_FORMAT;
    }
    const char *name;
    json_t *desc;
    json_object_foreach(root, name, desc)
    {
        if (status != FY_OK) break;
        if (!strcmp(name, "__metadata__")) continue;
        if (fy_safetensors_find(st, name)) {
            fy_error("safetensors: %s: tensor '%s' appears in two files", f->path, name);
            status = FY_ERR_FORMAT;
            break;
        }
        status = add_tensor(st, f->path, name, desc, f, 8 + hlen);
    }
    json_decref(root);
    return status;
}

static fy_status_t open_one(fy_safetensors_t *st, const char *path)
{
    if (st->n_files >= ST_MAX_FILES) {
        fy_error("safetensors: %s: more than %d shards", path, ST_MAX_FILES);
        return FY_ERR_FORMAT;
    }
    st_file_t *f = &st->files[st->n_files];
    memset(f, 0, sizeof(*f));
    f->fd = -1;
    f->path = fy_strdup(path);
    st->n_files++;
    if (!f->path) {
        fy_error("safetensors: %s: out of memory", path);
        return FY_ERR_NOMEM;
    }
    fy_status_t status = map_file(path, f);
    if (status != FY_OK) return status;
    return parse_file(st, f);
}

static fy_status_t open_index(fy_safetensors_t *st, const char *dir, const char *index_path)
{
    json_error_t jerr;
    json_t *root = json_load_file(index_path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        fy_error("safetensors: %s: not valid json: %s (line %d)", index_path, jerr.text, jerr.line);
        return FY_ERR_FORMAT;
    }
    fy_status_t status = FY_OK;
    json_t *map = json_object_get(root, "weight_map");
    if (!json_is_object(map)) {
        fy_error("safetensors: %s: no weight_map object", index_path);
        status = FY_ERR_FORMAT;
        goto out;
    }
    /* open each distinct shard once, in order of first mention */
    const char *name;
    json_t *file;
    json_object_foreach(map, name, file)
    {
        if (!json_is_string(file)) {
            fy_error("safetensors: %s: weight_map['%s'] is not a file name", index_path, name);
            status = FY_ERR_FORMAT;
            goto out;
        }
        const char *fn = json_string_value(file);
        if (strchr(fn, '/') || !strcmp(fn, "..") || !fn[0]) {
            fy_error("safetensors: %s: shard name '%s' is not a plain file name", index_path, fn);
            status = FY_ERR_FORMAT;
            goto out;
        }
        char path[PATH_MAX];
        snprintf(path, sizeof(path), "%s/%s", dir, fn);
        bool seen = false;
        for (int i = 0; i < st->n_files; i++)
            if (!strcmp(st->files[i].path, path)) seen = true;
        if (seen) continue;
        status = open_one(st, path);
        if (status != FY_OK) goto out;
    }
    json_object_foreach(map, name, file)
    {
        const fy_st_tensor_t *t = fy_safetensors_find(st, name);
        if (!t) {
            fy_error("safetensors: %s: tensor '%s' is not in its shard %s", index_path, name, json_string_value(file));
            status = FY_ERR_FORMAT;
            goto out;
        }
    }
out:
    json_decref(root);
    return status;
}

fy_status_t fy_safetensors_open(const char *path, fy_safetensors_t **st_p)
{
    fy_safetensors_t *st = fy_calloc(1, sizeof(*st));
    if (st) st->files = fy_calloc(ST_MAX_FILES, sizeof(*st->files));
    if (!st || !st->files) {
        fy_free(st);
        fy_error("safetensors: %s: out of memory", path);
        return FY_ERR_NOMEM;
    }
    fy_status_t status;
    struct stat sb;
    if (stat(path, &sb) != 0) {
        fy_error("safetensors: %s: %m", path);
        status = FY_ERR_NOT_FOUND;
    } else if (S_ISDIR(sb.st_mode)) {
        char p[PATH_MAX];
        snprintf(p, sizeof(p), "%s/model.safetensors.index.json", path);
        if (access(p, F_OK) == 0) {
            status = open_index(st, path, p);
        } else {
            snprintf(p, sizeof(p), "%s/model.safetensors", path);
            if (access(p, F_OK) == 0) {
                status = open_one(st, p);
            } else {
                fy_error("safetensors: %s: no model.safetensors or model.safetensors.index.json", path);
                status = FY_ERR_NOT_FOUND;
            }
        }
    } else {
        status = open_one(st, path);
    }
    if (status != FY_OK) {
        fy_safetensors_close(st);
        return status;
    }
    *st_p = st;
    return FY_OK;
}

void fy_safetensors_close(fy_safetensors_t *st)
{
    if (!st) return;
    for (int64_t i = 0; i < st->n_tensors; i++) fy_free((void *)st->tensors[i].name);
    fy_free(st->tensors);
    for (int i = 0; i < st->n_files; i++) {
        st_file_t *f = &st->files[i];
        if (f->map) munmap((void *)f->map, f->size);
        if (f->fd >= 0) close(f->fd);
        fy_free(f->path);
    }
    fy_free(st->files);
    fy_free(st);
}

size_t fy_safetensors_drop(const fy_safetensors_t *st, const void *p, size_t len)
{
    size_t n = 0;
    for (int i = 0; st && i < st->n_files; i++)
        n += fy_mem_drop_file_pages(st->files[i].map, st->files[i].size, p, len);
    return n;
}

const fy_st_tensor_t *fy_safetensors_find(const fy_safetensors_t *st, const char *name)
{
    for (int64_t i = 0; i < st->n_tensors; i++)
        if (!strcmp(st->tensors[i].name, name)) return &st->tensors[i];
    return NULL;
}

int64_t fy_safetensors_n_tensors(const fy_safetensors_t *st) { return st->n_tensors; }

const fy_st_tensor_t *fy_safetensors_tensor(const fy_safetensors_t *st, int64_t i)
{
    return i >= 0 && i < st->n_tensors ? &st->tensors[i] : NULL;
}

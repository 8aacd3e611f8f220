/*
 * fuzz_safetensors.c - the safetensors reader (model/safetensors.c): one
 * .safetensors file, or, when the input holds FZ_SEP, a sharded folder:
 * model.safetensors.index.json, then the shards, written as
 * model-0000K-of-0000N.safetensors (the seeds' index names them so).
 *
 * Checks: fy_safetensors_open fails with a status a file can cause, or
 * every tensor it lists has at most FY_ST_MAX_DIMS dimensions, as many
 * bytes as its shape times its element size, readable to the last (the
 * files are heap copies of their exact size, util.h), is found by its
 * name, and is the only one with that name.
 */
#include <stdio.h>
#include <string.h>

#include "common/mem.h"
#include "model/safetensors.h"
#include "tests/fuzz/util.h"

#define MAX_SHARDS 6

static volatile uint8_t g_sink;

static int dtype_bytes(const char *name)
{
    static const struct {
        const char *name;
        int bytes;
    } k[] = {{"F64", 8}, {"F32", 4},  {"F16", 2},     {"BF16", 2},    {"I64", 8}, {"I32", 4}, {"I16", 2}, {"I8", 1},
             {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"U16", 2}, {"U32", 4}, {"U64", 8}};
    for (size_t i = 0; i < FY_ARRAY_LEN(k); i++)
        if (!strcmp(k[i].name, name)) return k[i].bytes;
    return -1;
}

static void check(const fy_safetensors_t *st)
{
    int64_t n = fy_safetensors_n_tensors(st);
    FZ_CHECK(n >= 0, "%lld tensors", (long long)n);
    for (int64_t i = 0; i < n; i++) {
        const fy_st_tensor_t *t = fy_safetensors_tensor(st, i);
        FZ_CHECK(t && t->name && t->dtype_name && t->file, "tensor %lld incomplete", (long long)i);
        FZ_CHECK(t->n_dims >= 0 && t->n_dims <= FY_ST_MAX_DIMS, "'%s' has %d dims", t->name, t->n_dims);
        int eb = dtype_bytes(t->dtype_name);
        FZ_CHECK(eb > 0, "'%s' has dtype '%s'", t->name, t->dtype_name);
        uint64_t elems = 1;
        for (int d = 0; d < t->n_dims; d++) {
            FZ_CHECK(t->shape[d] >= 0, "'%s' shape[%d] = %lld", t->name, d, (long long)t->shape[d]);
            elems *= (uint64_t)t->shape[d];
        }
        FZ_CHECK(t->nbytes == elems * (uint64_t)eb, "'%s': %llu bytes for %llu elements of %d", t->name,
                 (unsigned long long)t->nbytes, (unsigned long long)elems, eb);
        FZ_CHECK(fy_safetensors_find(st, t->name) == t, "'%s' not found by its name (or listed twice)", t->name);
        if (t->nbytes) {
            const uint8_t *p = t->data;
            g_sink ^= (uint8_t)(p[0] ^ p[t->nbytes - 1]);
        }
    }
    FZ_CHECK(fy_safetensors_tensor(st, n) == NULL && fy_safetensors_tensor(st, -1) == NULL, "tensor out of range");
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fz_quiet_log();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_part_t parts[MAX_SHARDS + 1];
    size_t n = fz_split(data, size, FZ_SEP, parts, MAX_SHARDS + 1);
    const char *path;
    char name[64];
    if (n == 1) {
        path = fz_write("one.safetensors", data, size);
    } else {
        fz_unlink("one.safetensors"); /* so that an index cannot name what an earlier input left */
        fz_write("model.safetensors.index.json", parts[0].p, parts[0].n);
        for (size_t k = 1; k < n; k++) {
            snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", k, n - 1);
            fz_write(name, parts[k].p, parts[k].n);
        }
        path = fz_dir();
    }
    fy_safetensors_t *st = NULL;
    fy_status_t s = fy_safetensors_open(path, &st);
    FZ_CHECK(s == FY_OK || s == FY_ERR_FORMAT || s == FY_ERR_IO || s == FY_ERR_NOT_FOUND,
             "fy_safetensors_open returned %s", fy_status_str(s));
    if (s == FY_OK) {
        check(st);
        fy_safetensors_close(st);
    }
    if (n > 1) { /* shard names depend on the count: leave no file for the next input */
        for (size_t k = 1; k < n; k++) {
            snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", k, n - 1);
            fz_unlink(name);
        }
    }
    return 0;
}

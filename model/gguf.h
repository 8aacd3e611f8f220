/*
 * gguf.h - a bounds-checked reader of GGUF v2/v3 files (llama.cpp's model
 * format), over a read-only mmap.
 *
 * fy_gguf_open() walks and validates the whole header once: every string,
 * array and tensor record must lie inside the file, counts and dimensions
 * must be sane, tensor data must be aligned and in bounds.  After that the
 * accessors cannot read out of bounds.  Strings are views (fy_str_t) into
 * the mapping, not NUL-terminated.  It knows nothing of models; model.c
 * interprets the keys and tensors.
 */
#ifndef FY_GGUF_H
#define FY_GGUF_H

#include <stdbool.h>
#include <stdint.h>

#include "common/dtype.h"
#include "common/status.h"

typedef struct fy_gguf fy_gguf_t;

typedef struct fy_str {
    const char *ptr; /* not NUL-terminated */
    uint64_t len;
} fy_str_t;

bool fy_str_eq(fy_str_t s, const char *cstr);

typedef enum fy_gguf_type {
    FY_GGUF_TYPE_UINT8 = 0,
    FY_GGUF_TYPE_INT8 = 1,
    FY_GGUF_TYPE_UINT16 = 2,
    FY_GGUF_TYPE_INT16 = 3,
    FY_GGUF_TYPE_UINT32 = 4,
    FY_GGUF_TYPE_INT32 = 5,
    FY_GGUF_TYPE_FLOAT32 = 6,
    FY_GGUF_TYPE_BOOL = 7,
    FY_GGUF_TYPE_STRING = 8,
    FY_GGUF_TYPE_ARRAY = 9,
    FY_GGUF_TYPE_UINT64 = 10,
    FY_GGUF_TYPE_INT64 = 11,
    FY_GGUF_TYPE_FLOAT64 = 12,
    FY_GGUF_TYPE_COUNT
} fy_gguf_type_t;

#define FY_GGUF_MAX_DIMS 4

typedef struct fy_gguf_tensor {
    fy_str_t name;
    uint32_t n_dims;
    int64_t ne[FY_GGUF_MAX_DIMS]; /* ne[0] is the contiguous dimension; unused dims are 1 */
    uint32_t ggml_type;           /* the type id as stored */
    bool supported;               /* ggml_type maps to an fy_dtype_t */
    fy_dtype_t dtype;             /* valid when supported */
    uint64_t offset;              /* from the start of the file */
    uint64_t nbytes;              /* valid when supported */
    const void *data;             /* into the mapping; valid when supported */
} fy_gguf_tensor_t;

/* Maps and validates path.  On failure logs "gguf: PATH: fault" once and
 * returns FY_ERR_IO (cannot open/map) or FY_ERR_FORMAT (malformed). */
fy_status_t fy_gguf_open(const char *path, fy_gguf_t **gguf_p);
void fy_gguf_close(fy_gguf_t *gguf); /* accepts NULL */

const char *fy_gguf_path(const fy_gguf_t *gguf);
uint32_t fy_gguf_version(const fy_gguf_t *gguf);
uint64_t fy_gguf_file_size(const fy_gguf_t *gguf);
/* The bytes [p, p + len) of the file's mapping are read no more: its whole
 * pages leave resident memory (fy_mem_drop_file_pages); 0 when the range
 * is not in this file's mapping.  Returns the bytes dropped. */
size_t fy_gguf_drop(const fy_gguf_t *gguf, const void *p, size_t len);
uint64_t fy_gguf_n_tensors(const fy_gguf_t *gguf);
const fy_gguf_tensor_t *fy_gguf_tensor(const fy_gguf_t *gguf, uint64_t i);
const fy_gguf_tensor_t *fy_gguf_find_tensor(const fy_gguf_t *gguf, const char *name);
/* The GGML name of a type id ("q5_k", ...), or "unknown". */
const char *fy_gguf_ggml_type_name(uint32_t ggml_type);

/* Metadata.  Each getter returns FY_ERR_NOT_FOUND when the key is absent
 * and FY_ERR_FORMAT (logged) when it holds the wrong type or a value that
 * does not fit. */
bool fy_gguf_has_key(const fy_gguf_t *gguf, const char *key);
/* The key's value type (FY_GGUF_TYPE_ARRAY for arrays), FY_GGUF_TYPE_COUNT
 * when absent; logs nothing, so a caller can accept more than one type. */
fy_gguf_type_t fy_gguf_key_type(const fy_gguf_t *gguf, const char *key);
fy_status_t fy_gguf_get_u32(const fy_gguf_t *gguf, const char *key, uint32_t *value_p);
fy_status_t fy_gguf_get_f32(const fy_gguf_t *gguf, const char *key, float *value_p);
fy_status_t fy_gguf_get_bool(const fy_gguf_t *gguf, const char *key, bool *value_p);
fy_status_t fy_gguf_get_str(const fy_gguf_t *gguf, const char *key, fy_str_t *value_p);
/* Arrays, copied into new buffers the caller frees with fy_free().  Integer
 * arrays of any width convert to int32 when every value fits. */
fy_status_t fy_gguf_get_str_arr(const fy_gguf_t *gguf, const char *key, fy_str_t **values_p, uint64_t *n_p);
fy_status_t fy_gguf_get_f32_arr(const fy_gguf_t *gguf, const char *key, float **values_p, uint64_t *n_p);
fy_status_t fy_gguf_get_i32_arr(const fy_gguf_t *gguf, const char *key, int32_t **values_p, uint64_t *n_p);

#endif /* FY_GGUF_H */

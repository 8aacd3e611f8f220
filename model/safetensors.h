/*
 * safetensors.h - reader of Hugging Face safetensors weights: a single
 * model.safetensors, or shards listed by model.safetensors.index.json.
 *
 * Each file is mmapped read-only and its JSON header (parsed with jansson)
 * validated once: dtypes known, shapes sane, every tensor's byte range
 * inside the file and equal to its shape times its element size.
 * Only F32, F16 and BF16 tensors can be used; others are listed with
 * supported = false so the caller can name them in an error.
 */
#ifndef FY_SAFETENSORS_H
#define FY_SAFETENSORS_H

#include <stdbool.h>
#include <stdint.h>

#include "common/dtype.h"
#include "common/status.h"

#define FY_ST_MAX_DIMS 4

typedef struct fy_st_tensor {
    const char *name;
    const char *dtype_name; /* as written: "F32", "BF16", "I64", ... */
    bool supported;
    fy_dtype_t dtype; /* valid when supported */
    int n_dims;
    int64_t shape[FY_ST_MAX_DIMS]; /* outermost first, as in the file */
    uint64_t nbytes;
    const void *data;
    const char *file; /* the shard it lives in */
} fy_st_tensor_t;

typedef struct fy_safetensors fy_safetensors_t;

/* path: a .safetensors file, or a folder holding model.safetensors or
 * model.safetensors.index.json.  Logs "safetensors: FILE: fault" and
 * returns FY_ERR_IO / FY_ERR_FORMAT / FY_ERR_NOT_FOUND on failure. */
fy_status_t fy_safetensors_open(const char *path, fy_safetensors_t **st_p);
void fy_safetensors_close(fy_safetensors_t *st); /* accepts NULL */

const fy_st_tensor_t *fy_safetensors_find(const fy_safetensors_t *st, const char *name);
int64_t fy_safetensors_n_tensors(const fy_safetensors_t *st);
/* As fy_gguf_drop, over every file of the checkpoint. */
size_t fy_safetensors_drop(const fy_safetensors_t *st, const void *p, size_t len);
const fy_st_tensor_t *fy_safetensors_tensor(const fy_safetensors_t *st, int64_t i);

#endif /* FY_SAFETENSORS_H */

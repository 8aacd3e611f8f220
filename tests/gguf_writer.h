/*
 * gguf_writer.h - builds GGUF v3 files for tests (tiny models, tokenizers,
 * corrupt files).  Written independently of model/gguf.c, from the format
 * description, so that the reader is checked against a second opinion.
 * Aborts on allocation failure: it is test code.
 */
#ifndef FY_GGUF_WRITER_H
#define FY_GGUF_WRITER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct fy_gw fy_gw_t;

/* ggml type ids used by the tests */
enum {
    GW_F32 = 0,
    GW_F16 = 1,
    GW_Q4_0 = 2,
    GW_Q4_1 = 3,
    GW_Q5_0 = 6,
    GW_Q5_1 = 7,
    GW_Q8_0 = 8,
    GW_Q2_K = 10,
    GW_Q3_K = 11,
    GW_Q4_K = 12,
    GW_Q5_K = 13,
    GW_Q6_K = 14,
    GW_IQ4_NL = 20,
    GW_BF16 = 30
};

fy_gw_t *fy_gw_new(void);
void fy_gw_free(fy_gw_t *w);
void fy_gw_set_version(fy_gw_t *w, uint32_t version);
void fy_gw_set_alignment(fy_gw_t *w, uint32_t alignment); /* also writes general.alignment */

void fy_gw_u32(fy_gw_t *w, const char *key, uint32_t v);
void fy_gw_i32(fy_gw_t *w, const char *key, int32_t v);
void fy_gw_f32(fy_gw_t *w, const char *key, float v);
void fy_gw_bool(fy_gw_t *w, const char *key, bool v);
void fy_gw_str(fy_gw_t *w, const char *key, const char *v);
void fy_gw_str_arr(fy_gw_t *w, const char *key, const char *const *v, size_t n);
void fy_gw_f32_arr(fy_gw_t *w, const char *key, const float *v, size_t n);
void fy_gw_i32_arr(fy_gw_t *w, const char *key, const int32_t *v, size_t n);

/* A tensor with ne[0] contiguous; data is copied (nbytes of it). */
void fy_gw_tensor(fy_gw_t *w, const char *name, uint32_t ggml_type, int n_dims, const int64_t *ne, const void *data,
                  size_t nbytes);

/* fy_gw_tensor that takes data (malloc'd; freed with w) instead of a copy. */
void fy_gw_tensor_take(fy_gw_t *w, const char *name, uint32_t ggml_type, int n_dims, const int64_t *ne, void *data,
                       size_t nbytes);

/* The serialized file; valid until the next call on w. */
const uint8_t *fy_gw_bytes(fy_gw_t *w, size_t *len_p);
bool fy_gw_write(fy_gw_t *w, const char *path);

#endif /* FY_GGUF_WRITER_H */

/*
 * tinymodel.h - tiny random-weight Llama models that the tests write
 * themselves (fixed seed), as GGUF files and as Hugging Face folders, plus
 * a plain double-precision reference forward pass to check ferry against.
 *
 * Weights are kept in Hugging Face order (Q/K rows as the model defines
 * them, rotary pairs (i, i + d/2)).  The GGUF writer permutes Q/K rows the
 * way llama.cpp's converter does, so both files must give the same logits.
 */
#ifndef FY_TINYMODEL_H
#define FY_TINYMODEL_H

#include <stdbool.h>
#include <stdint.h>

typedef struct fy_tiny_cfg {
    int n_layers, dim, n_heads, n_kv_heads, ffn, max_ctx;
    float theta, eps;
    bool tied;
    uint64_t seed;
} fy_tiny_cfg_t;

/* 2 layers, dim 64, 4 heads / 2 kv heads of 16, ffn 96, ctx 256 */
void fy_tiny_cfg_default(fy_tiny_cfg_t *c);

typedef struct fy_tiny_layer {
    float *attn_norm, *wq, *wk, *wv, *wo, *ffn_norm, *wg, *wu, *wd;
} fy_tiny_layer_t;

typedef struct fy_tiny_model {
    fy_tiny_cfg_t c;
    int vocab; /* 256 byte tokens + <|endoftext|> + <|im_start|> + <|im_end|> */
    int head_dim;
    float *embd, *out_norm, *output; /* output == embd when tied */
    fy_tiny_layer_t *L;
} fy_tiny_model_t;

void fy_tiny_init(fy_tiny_model_t *m, const fy_tiny_cfg_t *c);
void fy_tiny_free(fy_tiny_model_t *m);

/* Replaces every matrix by its round trip through ggml type t (so the
 * reference sees exactly the weights a quantized file holds). */
void fy_tiny_roundtrip(fy_tiny_model_t *m, uint32_t ggml_type);

/* Writes the model; matrices in ggml_type (GW_F32 ...), norms in f32. */
bool fy_tiny_write_gguf(const fy_tiny_model_t *m, const char *path, uint32_t ggml_type);
/* Writes a model of shape c (any size: no float copy of it is kept) whose
 * every matrix, the token embedding included, is uniform random values
 * quantized to ggml_type a row at a time; norms are ones.  For speed
 * measurements (tests/mkbench.c), where the values do not matter but must
 * stay finite and of a realistic scale. */
bool fy_tiny_write_random_gguf(const fy_tiny_cfg_t *c, const char *path, uint32_t ggml_type);
/* Writes config.json, model.safetensors (dtype "F32", "F16" or "BF16"),
 * tokenizer.json into dir (created); shards > 1 writes an index and that
 * many shard files. */
bool fy_tiny_write_hf(const fy_tiny_model_t *m, const char *dir, const char *dtype, int shards);

/* Reference logits [n, vocab] for tokens [n] at positions 0..n-1. */
void fy_tiny_reference(const fy_tiny_model_t *m, const int32_t *tokens, int n, double *logits);

/* Relative error ||a - b|| / ||b|| of n values. */
double fy_rel_err(const float *a, const double *b, long n);

#endif /* FY_TINYMODEL_H */

/*
 * model.h - a Llama-family decoder: its configuration, its weights as
 * tensors in host memory (the mmap of the model file), its tokenizer and
 * chat template.
 *
 * Loaded from a GGUF file (llama architecture) or a Hugging Face folder
 * (config.json + safetensors + tokenizer.json).  Loading checks every
 * tensor the forward pass needs for presence, type and exact shape, and
 * the hyper-parameters for sanity, and names the file and the fault when
 * something is wrong.  The model is read-only after loading; the forward
 * pass lives in engine/runner.c and reads the weights through a backend.
 */
#ifndef FY_MODEL_H
#define FY_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "chat.h"
#include "dtype.h"
#include "rope.h"
#include "status.h"
#include "tokenizer.h"

typedef struct fy_model_config {
    char arch[32];
    char name[128];
    int32_t n_layers;
    int32_t dim;        /* residual width */
    int32_t n_heads;    /* query heads */
    int32_t n_kv_heads; /* key/value heads (grouped-query attention) */
    int32_t head_dim;
    int32_t ffn_dim;
    int32_t vocab_size;
    int32_t max_ctx; /* trained context length */
    float rope_theta;
    float norm_eps;
    fy_rope_style_t rope_style;
    bool tied_embeddings; /* output head shares the token embedding */
} fy_model_config_t;

typedef struct fy_layer_weights {
    fy_tensor_t attn_norm; /* (dim) */
    fy_tensor_t wq;        /* (n_heads * head_dim rows, dim) */
    fy_tensor_t wk;        /* (n_kv_heads * head_dim rows, dim) */
    fy_tensor_t wv;        /* (n_kv_heads * head_dim rows, dim) */
    fy_tensor_t wo;        /* (dim rows, n_heads * head_dim) */
    fy_tensor_t ffn_norm;  /* (dim) */
    fy_tensor_t w_gate;    /* (ffn_dim rows, dim) */
    fy_tensor_t w_up;      /* (ffn_dim rows, dim) */
    fy_tensor_t w_down;    /* (dim rows, ffn_dim) */
} fy_layer_weights_t;

typedef struct fy_model_weights {
    fy_tensor_t tok_embd;       /* (vocab rows, dim) */
    fy_tensor_t out_norm;       /* (dim) */
    fy_tensor_t output;         /* (vocab rows, dim); the same data as tok_embd when tied */
    fy_layer_weights_t *layers; /* [n_layers] */
} fy_model_weights_t;

typedef struct fy_model fy_model_t;

/* path: a .gguf file or a Hugging Face model folder.  On failure one error
 * line names the file and the fault; returns FY_ERR_IO, FY_ERR_FORMAT,
 * FY_ERR_UNSUPPORTED, FY_ERR_NOT_FOUND or FY_ERR_NOMEM. */
fy_status_t fy_model_load(const char *path, fy_model_t **model_p);
void fy_model_destroy(fy_model_t *model); /* accepts NULL */

const fy_model_config_t *fy_model_config(const fy_model_t *model);
/* Weights in host memory, valid while the model lives. */
const fy_model_weights_t *fy_model_weights(const fy_model_t *model);
const fy_tokenizer_t *fy_model_tokenizer(const fy_model_t *model);
/* The model's chat template (ChatML when the model has none). */
const fy_chat_template_t *fy_model_chat_template(const fy_model_t *model);
/* A name for these exact weights (at most 63 bytes), the same in every process that loads
 * the same model: its name and a digest of its shape, tensor types and a
 * sample of weight bytes ("SmolLM2-135M@3f9a...").  Two processes compare
 * it before exchanging KV, and it is part of every prefix-cache name. */
void fy_model_id(const fy_model_t *model, char *buf, size_t cap);
/* Bytes of weights one decode step reads (all layers plus the output
 * head; the embedding row is negligible). */
size_t fy_model_weight_bytes_per_token(const fy_model_t *model);
/* One-line human description: name, shapes, weight types, size. */
void fy_model_describe(const fy_model_t *model, char *buf, size_t cap);

/* Checks a configuration for sane, mutually consistent values (limits far
 * beyond any real model); logs the fault with path as context. */
fy_status_t fy_model_config_check(const fy_model_config_t *cfg, const char *path);

#endif /* FY_MODEL_H */

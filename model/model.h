/*
 * model.h - a decoder-only transformer: its configuration, its
 * description (the choices of its architecture and each layer's attention
 * window and rotation), its weights as tensors in host memory (the mmap of
 * the model file), its tokenizer and chat template.
 *
 * Architectures: llama (and mistral, and any llama-family file with a
 * sliding window), qwen2, qwen3, gemma3, from a GGUF file or a Hugging
 * Face folder (config.json + safetensors + tokenizer.json).  What differs
 * between them is data, not code: a row of fy_arch_traits_t per
 * architecture and a fy_layer_config_t per layer, which engine/runner.c's
 * one forward pass reads.  Loading checks every tensor the forward pass
 * needs for presence, type and exact shape, and the hyper-parameters for
 * sanity, and names the file and the fault when something is wrong;
 * fy_model_inspect describes a file ferry cannot run and lists why.  The
 * model is read-only after loading.
 *
 * Not here: the forward pass (engine/runner.c), the kernels (kernels/).
 */
#ifndef FY_MODEL_H
#define FY_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/chat.h"
#include "common/dtype.h"
#include "model/rope.h"
#include "common/status.h"
#include "model/tokenizer.h"

typedef enum fy_arch {
    FY_ARCH_LLAMA = 0, /* llama, mistral */
    FY_ARCH_QWEN2,
    FY_ARCH_QWEN3,
    FY_ARCH_GEMMA3,
    FY_ARCH_COUNT
} fy_arch_t;

typedef enum fy_ffn_act {
    FY_ACT_SILU = 0,  /* SwiGLU: silu(gate) * up */
    FY_ACT_GELU_TANH, /* GeGLU: gelu_tanh(gate) * up */
} fy_ffn_act_t;

/* What one architecture's forward pass does differently: the choices the
 * runner reads (one row per architecture in model.c). */
typedef struct fy_arch_traits {
    const char *name;          /* "llama", "qwen2", "qwen3", "gemma3" */
    bool qkv_bias;             /* the Q, K, V projections add biases (qwen2) */
    bool qk_norm;              /* RMSNorm over each Q and K head before RoPE (qwen3, gemma3) */
    bool post_norms;           /* RMSNorm of the attention and MLP outputs before each residual add (gemma3) */
    bool norm_plus_one;        /* norms scale by (1 + w) in Hugging Face checkpoints (gemma3): 1 is added to
                                * the weights at load; GGUF files hold 1 + w already (llama.cpp's converter) */
    bool embed_scale;          /* embeddings times sqrt(dim) (gemma3) */
    fy_ffn_act_t act;          /* the MLP's gate activation */
    fy_rope_style_t gguf_rope; /* the rotary convention of its GGUF files (llama's Q/K rows are permuted) */
} fy_arch_traits_t;

/* The traits of an architecture. */
const fy_arch_traits_t *fy_arch_traits(fy_arch_t arch);

/* One layer's attention: its window and its rotation. */
typedef struct fy_layer_config {
    int32_t window; /* sliding window: the last `window` positions, itself included; 0: global */
    fy_rope_t rope; /* base, scaling and convention; freq_factors lives as long as the model */
} fy_layer_config_t;

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
    int32_t max_ctx;  /* trained context length */
    float rope_theta; /* the global layers' rope base */
    float norm_eps;
    fy_rope_style_t rope_style;
    bool tied_embeddings; /* output head shares the token embedding */
    /* the description the runner reads */
    fy_arch_t arch_id;
    fy_arch_traits_t traits;
    float embed_scale;              /* embeddings are multiplied by this (1: not at all) */
    float attn_scale;               /* attention scores are q.k times this: 1 / sqrt(head_dim) unless the model
                                      * says otherwise (gemma3's query_pre_attn_scalar) */
    const fy_layer_config_t *layer; /* [n_layers], owned by the model */
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
    /* by architecture (data NULL where it has none) */
    fy_tensor_t bq, bk, bv;     /* (n_heads * head_dim), (n_kv_heads * head_dim) x 2: qkv_bias */
    fy_tensor_t q_norm, k_norm; /* (head_dim): qk_norm */
    fy_tensor_t post_attn_norm; /* (dim): post_norms */
    fy_tensor_t post_ffn_norm;  /* (dim): post_norms */
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
/* A backend made its own copy of weight t (packed, sliced or uploaded to
 * a device) and this process reads t's host bytes no more: where they
 * are the file's mapping, their pages leave resident memory (read again
 * from the file if anything does touch them).  Without this a CPU worker
 * held a 4.4 GB file twice (the mapping and its packed copy).  Returns
 * the bytes dropped. */
size_t fy_model_drop_host(const fy_model_t *model, const fy_tensor_t *t);

/*
 * A description of the model at path for people (`ferry info`): its
 * shape, its architecture's choices, each layer's window and rotation, its
 * tensor types, tokenizer and template, and whether ferry runs it; where it
 * does not, every reason found (an unknown architecture, unsupported tensor
 * types, missing or misshapen tensors, unsupported rope scaling) rather than
 * the first.  FY_OK with *report_p (free with fy_free) whenever the file
 * could be read as a model container at all; otherwise the loader's error
 * (logged).
 */
fy_status_t fy_model_inspect(const char *path, char **report_p);

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

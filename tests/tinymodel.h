/*
 * tinymodel.h - tiny random-weight models that the tests write themselves
 * (fixed seed), of every architecture ferry runs (llama, with a sliding
 * window and rope scaling; qwen2; qwen3; gemma3), as GGUF files and as
 * Hugging Face folders, plus a plain double-precision reference forward
 * pass to check ferry against.
 *
 * Weights are kept in Hugging Face order (Q/K rows as the model defines
 * them, rotary pairs (i, i + d/2)) and norms as the multiplier the model
 * applies.  The GGUF writer permutes a llama's Q/K rows the way llama.cpp's
 * converter does, and the HF writer stores a Gemma's norms as w - 1 (its
 * checkpoints scale by 1 + w), so every file must give the same logits.
 * The reference is written from the papers' and transformers' definitions,
 * not from ferry's code.
 */
#ifndef FY_TINYMODEL_H
#define FY_TINYMODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "model/model.h"

typedef enum fy_tiny_rope_scaling {
    FY_TINY_ROPE_NONE = 0,
    FY_TINY_ROPE_LINEAR, /* rope_factor */
    FY_TINY_ROPE_LLAMA3, /* rope_factor, rope_low, rope_high, rope_orig_ctx */
} fy_tiny_rope_scaling_t;

typedef struct fy_tiny_cfg {
    int n_layers, dim, n_heads, n_kv_heads, ffn, max_ctx;
    float theta, eps;
    bool tied;
    uint64_t seed;
    /* the architecture (default llama, none of what follows) */
    fy_arch_t arch;
    int head_dim;          /* 0: dim / n_heads */
    int window;            /* the sliding layers' window; 0: every layer global */
    int swa_period;        /* layer l global when (l + 1) % period == 0; 0: every layer slides (gemma3's default 6) */
    bool write_pattern;    /* write the period into the file (else the reader must know the architecture's) */
    bool layer_types;      /* HF: name each layer's kind in layer_types instead of a period */
    int max_window_layers; /* qwen HF: layers from this one on slide (use_sliding_window) */
    float local_theta;     /* gemma3: the sliding layers' rope base (10000) */
    float query_scalar;    /* gemma3: query_pre_attn_scalar; 0: head_dim (scale 1 / sqrt(head_dim)) */
    bool multimodal;       /* HF gemma3: Gemma3ForConditionalGeneration, text_config, language_model.* names */
    bool mistral;          /* llama written as a Mistral file (GGUF "mistral", MistralForCausalLM) */
    bool add_bos;          /* GGUF tokenizer.ggml.add_bos_token (BOS is <|im_start|>, 257) */
    const char *chat_template;           /* GGUF tokenizer.chat_template; NULL: none (ferry's default, ChatML) */
    fy_tiny_rope_scaling_t rope_scaling; /* of the global layers */
    float rope_factor, rope_low, rope_high;
    int rope_orig_ctx;
} fy_tiny_cfg_t;

/* llama, 2 layers, dim 64, 4 heads / 2 kv heads of 16, ffn 96, ctx 256 */
void fy_tiny_cfg_default(fy_tiny_cfg_t *c);
/* The default shape as arch, with that architecture's own choices switched
 * on (gemma3: 6 layers, window 7 with its period of 6, local base 10000,
 * global base 1e6, tied; qwen3: head size 32, not dim / heads). */
void fy_tiny_cfg_arch(fy_tiny_cfg_t *c, fy_arch_t arch);

typedef struct fy_tiny_layer {
    float *attn_norm, *wq, *wk, *wv, *wo, *ffn_norm, *wg, *wu, *wd;
    float *bq, *bk, *bv;                   /* qwen2 */
    float *q_norm, *k_norm;                /* qwen3, gemma3 */
    float *post_attn_norm, *post_ffn_norm; /* gemma3 */
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

/* How fy_tiny_write_random_gguf_as writes a random model. */
typedef struct fy_tiny_random {
    uint32_t type; /* every matrix's ggml type */
    /* llama.cpp's Q4_K_M mix instead of type: Q4_K, and Q6_K for the
     * output head (the embedding when tied) and for attn_v and ffn_down of
     * the layers its use_more_bits picks */
    bool q4_k_m;
    /* rows of the embedding and output head; the byte-level tokenizer's 259
     * when smaller (ids past the tokenizer's are valid model ids, as in a
     * real model whose matrices are padded) */
    int vocab;
    /* each matrix made of blocks drawn at random from a pool of 4096
     * quantized random blocks: a model of real size (Llama-3-8B's layers,
     * a 128k vocabulary) in about the time its bytes take to copy */
    bool pooled;
    /* the tokenizer lists every row of vocab: the byte tokenizer's 259
     * tokens, then "<unused_N>" of type UNUSED, as a real model's padded
     * vocabulary does; llama.cpp refuses a file whose token list is shorter
     * than its embedding (what the llama.cpp comparisons need) */
    bool full_vocab;
} fy_tiny_random_t;

void fy_tiny_random_default(fy_tiny_random_t *r, uint32_t ggml_type);
/* fy_tiny_write_random_gguf with r's types, vocabulary and writer, for a
 * llama or (c->arch) a gemma3 shape, c->head_dim honoured (gemma3's q/k
 * norms and post-norms are ones, like the other norms). */
bool fy_tiny_write_random_gguf_as(const fy_tiny_cfg_t *c, const char *path, const fy_tiny_random_t *r);
/* Writes config.json, model.safetensors (dtype "F32", "F16" or "BF16"),
 * tokenizer.json into dir (created); shards > 1 writes an index and that
 * many shard files. */
bool fy_tiny_write_hf(const fy_tiny_model_t *m, const char *dir, const char *dtype, int shards);

/* Layer l's window (0: global) as the model defines it. */
int fy_tiny_layer_window(const fy_tiny_model_t *m, int l);

/* Reference logits [n, vocab] for tokens [n] at positions 0..n-1. */
void fy_tiny_reference(const fy_tiny_model_t *m, const int32_t *tokens, int n, double *logits);

/* Relative error ||a - b|| / ||b|| of n values. */
double fy_rel_err(const float *a, const double *b, long n);

#endif /* FY_TINYMODEL_H */

/*
 * runner.h - the model runner: one forward pass of a model (any
 * architecture model.h describes) over a batch of sequences, reading and
 * writing K/V through each sequence's block table.
 *
 * A batch mixes sequences freely: a prompt chunk (many tokens), a decode
 * step (one token), a speculative verification (k + 1 tokens).  Each
 * entry says how many of its last tokens want logits.  The runner owns the
 * device copies of the weights, the KV arena and every work buffer, all
 * allocated at creation: a forward pass allocates nothing.
 *
 * The runner does not own block tables or the block pool: its caller (the
 * generate loop now, the engine's scheduler later) reserves blocks before
 * calling forward.  Not thread-safe: one engine thread drives it.
 */
#ifndef FY_RUNNER_H
#define FY_RUNNER_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "kv.h"
#include "model.h"
#include "status.h"

typedef struct fy_runner_params {
    int32_t max_batch_tokens; /* tokens per forward (prefill chunk + decodes) */
    int32_t max_seqs;         /* sequences per forward */
    int32_t max_logits;       /* logit rows per forward */
    int32_t max_ctx;          /* longest sequence; 0: the model's trained context */
    int32_t n_kv_blocks;      /* blocks of block_size tokens of every layer in the device KV arena (with KV
                                 groups, the pool counts n_groups pages for each); 0: from kv_mem or
                                 kv_mem_fraction */
    int64_t kv_mem;           /* device KV budget in bytes, when n_kv_blocks is 0 */
    double kv_mem_fraction;   /* else this share of the device memory free after the weights */
    int32_t n_host_blocks;    /* blocks of every layer in the host tier (0: none) */
    int32_t block_size;       /* tokens per block: 8, 16, 32 */
    fy_dtype_t kv_dtype;      /* f32 or f16 */
    bool kv_one_group;        /* one KV group of every layer: sliding layers keep all their blocks
                                 (kv.sliding_groups = false; the layout before groups) */
} fy_runner_params_t;

/* Defaults: 512-token batches, 64 sequences, f16 KV in 16-token blocks,
 * the arena 90% of the device memory left free after the weights. */
void fy_runner_params_default(fy_runner_params_t *p);

typedef struct fy_runner fy_runner_t;

typedef struct fy_forward_seq {
    const fy_block_table_t *bt; /* blocks reserved for kv_len tokens */
    const int32_t *tokens;      /* [n_tokens] new tokens */
    int32_t n_tokens;
    int32_t pos;      /* position of tokens[0]: tokens already in the KV cache */
    int32_t n_logits; /* logits for the last n_logits of the new tokens (0..n_tokens) */
    float *scores;    /* H2O (evict.h): adds the attention mass each of its blocks received in this pass
                         (all layers and heads, its query rows) into scores[block]; NULL: none */
} fy_forward_seq_t;

/* The model and backend must outlive the runner. */
fy_status_t fy_runner_create(const fy_model_t *model, fy_backend_t *be, const fy_runner_params_t *params,
                             fy_runner_t **runner_p);
void fy_runner_destroy(fy_runner_t *runner); /* accepts NULL */

/*
 * A runner for a speculative draft on the target's backend, with its own
 * KV arena and work buffers (the backend's work buffers are sized for
 * both).  draft_model NULL (or the target's model): a self-draft of the
 * target's first n_layers layers plus its final norm and output head,
 * borrowing the target's device weights (no copy; the target must
 * outlive it).  Otherwise a separate model of the same vocabulary, all
 * its layers (n_layers 0 or its layer count).  FY_ERR_INVALID (logged)
 * for a vocabulary mismatch or a bad layer count.
 */
fy_status_t fy_runner_create_draft(fy_runner_t *target, const fy_model_t *draft_model, int32_t n_layers,
                                   const fy_runner_params_t *params, fy_runner_t **runner_p);
/* Layers this runner computes (fewer than the model's for a self-draft). */
int32_t fy_runner_n_layers(const fy_runner_t *runner);

const fy_kv_layout_t *fy_runner_kv_layout(const fy_runner_t *runner);
const fy_runner_params_t *fy_runner_params(const fy_runner_t *runner);
const fy_model_t *fy_runner_model(const fy_runner_t *runner);
void *fy_runner_kv_arena(fy_runner_t *runner);

/* The KV layout a runner of the first n_layers layers of model with
 * params p uses: KV groups by window unless p->kv_one_group. */
fy_status_t fy_runner_layout_for(const fy_model_t *model, int32_t n_layers, const fy_runner_params_t *p,
                                 fy_kv_layout_t *lay_p);

/* Block manager parameters for this runner's arenas: layout, block
 * counts, host arena and the copy callback (the runner's backend).  The
 * caller sets the hasher and the policy fields, then fy_kvm_create. */
void fy_runner_kvm_params(fy_runner_t *runner, fy_kvm_params_t *params);

/*
 * Runs one forward pass.  logits (host memory) receives, for each sequence
 * in order, n_logits rows of vocab_size floats.  Token ids are checked
 * against the vocabulary and positions against the block tables:
 * FY_ERR_INVALID (logged) and nothing written on bad input.
 */
fy_status_t fy_runner_forward(fy_runner_t *runner, const fy_forward_seq_t *seqs, int32_t n_seqs, float *logits);

#endif /* FY_RUNNER_H */

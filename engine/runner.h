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
 * The runner does not own block tables or the block pool: its caller
 * reserves blocks before calling forward: the engine's planner
 * (sched.c, for the target model; spec_step.c for the draft model), or a bench
 * command or tools/cmp_devices.c driving a runner directly.  Not
 * thread-safe: one thread drives it (the engine's).
 *
 * Ranks (tp, pp > 1).  A runner can be one rank of a group (group.h) that
 * serves the model together: tp ranks per pipeline stage split the
 * attention heads (KV heads too, or each rank keeps the one KV head its
 * query heads read when the model has fewer KV heads than ranks) and the
 * MLP's intermediate dimension, and the rows of the o- and
 * down-projections, gathering what each needs with fy_group_allreduce_f32
 * (or summing partial projections: tp_partial_sums); pp stages split the
 * layers, each holding the KV of its own layers.  Rank 0 (stage 0, tensor rank 0) is the
 * runner the engine drives: it alone has a block manager, and every
 * operation that touches the KV arena (fy_runner_forward, the block
 * manager's copy callback) is first broadcast to the other ranks, which
 * apply it with the same block ids to their own slice of the pool
 * (fy_runner_follow), so no shard can run out of blocks before the
 * others.  Rank 0 also holds the embeddings, the final norm and the output
 * head and computes every logit.  Every element is computed as one rank
 * computes it, so logits are the single rank's bits (with
 * tp_partial_sums they are not: tests/test_parallel.c measures by how
 * much).
 */
#ifndef FY_RUNNER_H
#define FY_RUNNER_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "engine/group.h"
#include "kv/kv.h"
#include "model/model.h"
#include "common/status.h"

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
    /* ranks: tensor-parallel ranks per stage and pipeline stages (0 and 1
     * mean 1); tp * pp > 1 needs a group of tp * pp ranks, whose rank
     * (fy_group_rank: stage * tp + tp_rank) is this runner's place.  Every
     * rank is created with the same parameters. */
    int32_t tp;
    int32_t pp;
    /* how tp ranks combine the o- and down-projections.  false (default):
     * exactly as one rank: each rank gathers the whole input (every head's
     * attention output, the whole MLP activation) and computes its rows of
     * the output, which are then gathered, so every element is the one
     * rank's dot product bit for bit and greedy output equals one rank's.
     * true: each rank multiplies its input columns and the partial sums are
     * added across ranks (Megatron's row-parallel layer: half the traffic,
     * but another summation order; on SmolLM2 logits move by up to ~1.5,
     * since the 8-bit activations of later layers round differently) */
    bool tp_partial_sums;
    /* a group whose arenas rank 0 must reach (a worker's transfer engine
     * puts into and reads from every rank's KV): rank r's device arena is
     * kv_arenas + r * kv_arena_stride, in a shared mapping made before the
     * group forked (fy_runner_group_arena_bytes sizes the stride); NULL:
     * each rank allocates its own */
    void *kv_arenas;
    size_t kv_arena_stride;
    /* for tests only, honoured by the group's last rank (a follower) alone:
     * its pool is sized pool_skew blocks larger (unequal pools, which
     * creation must refuse); it fails its forward pass after
     * fail_after_forwards of them (0: never), reporting FY_ERR_NO_SPACE
     * through fy_group_done as a rank whose allocation failed would */
    int32_t pool_skew;
    int32_t fail_after_forwards;
    /* recorded decode steps (CUDA graphs; worker.cuda_graphs): 0 off; 1 a
     * decode batch (every sequence one token, its logits wanted) runs as
     * the next bucket of 1, 2, 4, .. max_seqs sequences, padded, recorded
     * once per bucket and replayed, where the backend records
     * (fy_backend_graph_begin); 2 pads such batches on every backend (for
     * tests: a padded batch gives the unpadded batch's logits) */
    int32_t graphs;
    /* for precision measurements (`ferry bench-prec`): the weight classes
     * (FY_RUNNER_F32_*) whose quantized matrices are dequantized to f32 at
     * creation, so their matmuls take f32 activations instead of 8-bit
     * ones (the same weight values; 4 bytes per weight and slower).  0: none,
     * the default.  A single rank only. */
    uint32_t f32_weights;
} fy_runner_params_t;

enum {
    FY_RUNNER_F32_QKV = 1u << 0,     /* wq, wk, wv */
    FY_RUNNER_F32_O = 1u << 1,       /* wo */
    FY_RUNNER_F32_GATE_UP = 1u << 2, /* w_gate, w_up */
    FY_RUNNER_F32_DOWN = 1u << 3,    /* w_down */
    FY_RUNNER_F32_HEAD = 1u << 4,    /* the output head */
    FY_RUNNER_F32_ALL = (1u << 5) - 1,
};

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

/* The model and backend must outlive the runner.  A single rank: params
 * must ask for tp = pp = 1. */
fy_status_t fy_runner_create(const fy_model_t *model, fy_backend_t *be, const fy_runner_params_t *params,
                             fy_runner_t **runner_p);

/*
 * Whether model can be split as params' tp and pp ask: heads divisible by
 * tp, KV heads divisible by tp or dividing it, the MLP's width and the
 * model's width divisible by tp (with tp_partial_sums, every column slice
 * of the o- and down-projections on a whole quantization block), at least
 * pp layers, no more than 64 ranks.
 * FY_ERR_INVALID, logged naming the counts or the tensor, otherwise.  Call
 * before spawning a group; fy_runner_create_rank checks it too.
 */
fy_status_t fy_runner_check_shape(const fy_model_t *model, const fy_runner_params_t *params);

/* What a group for runners of params must carry: its size, each rank's
 * slot (one stage's activations) and the command area (the largest
 * broadcast batch).  FY_ERR_INVALID (logged) for a bad shape. */
fy_status_t fy_runner_group_params(const fy_model_t *model, const fy_runner_params_t *params, fy_group_params_t *gp_p);

/* The most bytes a rank's device arena takes in a group for params (the
 * largest stage's block of every layer times the block count the ranks
 * agree on), rounded up to a page: kv_arena_stride.  FY_ERR_INVALID
 * (logged) for a budget that holds no block. */
fy_status_t fy_runner_group_arena_bytes(const fy_model_t *model, const fy_runner_params_t *params, size_t *bytes_p);

/*
 * One rank of a group (group NULL: fy_runner_create).  Every rank of the
 * group calls it with the same parameters; the ranks compare their pools'
 * block counts and refuse unequal ones (FY_ERR_INVALID, logged on rank 0
 * naming the ranks and counts).  Sizing from kv_mem_fraction alone is
 * refused in a group: each rank would measure free memory at another
 * moment.  Rank 0's runner is driven as a single runner is; the others
 * run fy_runner_follow.  The group must outlive the runner.
 */
fy_status_t fy_runner_create_rank(const fy_model_t *model, fy_backend_t *be, const fy_runner_params_t *params,
                                  fy_group_t *group, fy_runner_t **runner_p);

/*
 * A rank other than 0: applies rank 0's commands (forward passes, block
 * copies, timing reports) to its own shard until the group is destroyed
 * (FY_OK) or fails (that status; a command that fails here breaks the
 * group, so rank 0 is never left waiting).  Each command's bytes are
 * checked before use.
 */
fy_status_t fy_runner_follow(fy_runner_t *runner);

/* Where a rank's time went (nanoseconds), since creation or the last
 * reset.  compute is the forward passes' time less the rest; allreduce
 * the time in the tensor ranks' collectives (fy_group_allreduce_f32 of
 * partial sums, or fy_group_allgather when gathering); wait the time a stage spent
 * receiving activations (the previous stage's, or for rank 0 the last
 * stage's hidden rows): pipeline bubbles; send the time handing them on. */
typedef struct fy_runner_timing {
    uint64_t forwards;
    uint64_t compute_ns;
    uint64_t allreduce_ns;
    uint64_t wait_ns;
    uint64_t send_ns;
    uint64_t graph_steps; /* forward passes run as a recorded step (recorded or replayed) */
    uint64_t pad_rows;    /* padding rows those steps (or, with graphs = 2, padded ones) computed */
} fy_runner_timing_t;

/* Rank 0 (or a single runner): every rank's counters into out[0..n_ranks)
 * (a report command for the others), then resets them all when reset is
 * set.  FY_ERR_PEER when the group is broken. */
fy_status_t fy_runner_timing(fy_runner_t *runner, fy_runner_timing_t *out, int32_t n_ranks, bool reset);
/* Recorded decode steps on (1) or off (0) from the next forward pass on
 * (fy_runner_params_t.graphs; benchmarks compare the two).  Main thread. */
void fy_runner_set_graphs(fy_runner_t *runner, int32_t graphs);
/* For precision measurements: while set, each forward pass copies the
 * residual stream x ([n_tokens, dim] of the batch, in batch order) after
 * each layer's attention into attn + (l * max_tokens) * dim and after its
 * MLP into mlp + (l * max_tokens) * dim (host memory, n_layers x
 * max_batch_tokens x dim floats each), syncing the backend after every
 * layer.  NULL, NULL: off (the default).  A single rank only; turns
 * recorded steps off (fy_runner_set_graphs 0). */
void fy_runner_set_taps(fy_runner_t *runner, float *attn, float *mlp);
/* Ranks of this runner's group (1 alone). */
int32_t fy_runner_n_ranks(const fy_runner_t *runner);
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
/* fy_kv_pool_blocks over the layout a runner of the first n_layers
 * layers of model (0: every layer) with params p keeps
 * (fy_runner_layout_for): the n_kv_blocks that admit
 * `requests` requests of `tokens` tokens at once, with the block
 * manager's step (p->max_batch_tokens; 0: sliding groups counted whole,
 * for a caller that reserves whole sequences itself) and watermark.  -1
 * (logged) when it cannot be. */
int32_t fy_runner_pool_blocks(const fy_model_t *model, int32_t n_layers, const fy_runner_params_t *p, int64_t tokens,
                              int32_t requests, int32_t step, float watermark);
const fy_model_t *fy_runner_model(const fy_runner_t *runner);
void *fy_runner_kv_arena(fy_runner_t *runner);

/* The KV layout a runner of the first n_layers layers of model with
 * params p uses: KV groups by window unless p->kv_one_group.  With p->tp
 * or p->pp > 1, rank 0's (its stage's layers, its KV heads): the layout
 * its block manager keeps; every stage's grouping is the same (one group
 * of every layer when the stages' windows would group differently). */
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
 * FY_ERR_INVALID (logged) and nothing written on bad input.  Rank 0 of a
 * group: a rank that fails makes it fail (logged naming the rank), and
 * from then on every call fails at once with FY_ERR_PEER; scores must be
 * NULL (H2O is not sharded).
 */
fy_status_t fy_runner_forward(fy_runner_t *runner, const fy_forward_seq_t *seqs, int32_t n_seqs, float *logits);

#endif /* FY_RUNNER_H */

/*
 * backend.h - the compute backend: an ops table plus a context, behind an
 * opaque handle (ggml-backend's shape).  Callers (the model runner) see
 * only these functions; each backend lives in its own folder: cpu/, in
 * every build, and cuda/, compiled by nvcc with CUDA=1 (FY_HAVE_CUDA is
 * defined for backend.c alone, which picks a backend by name).  The CUDA
 * backend's host-side plans (cuda_plan.h, cuda_attn.h) are plain C beside
 * this file, in every build, so tests/test_cuda.c checks them without a
 * GPU.
 *
 * Memory.  "Device" pointers are what fy_backend_alloc returns: host
 * memory for the CPU backend, GPU memory for CUDA.  Every compute op takes
 * device pointers.  Weights are made device-resident once with
 * fy_backend_upload (the CPU backend aliases the mmap: no copy).
 *
 * Batches.  A forward pass runs one batch of tokens from one or more
 * sequences.  fy_backend_set_batch hands the backend the batch's metadata
 * (positions, KV slots, per-sequence block tables) once; the ops that need
 * it (embed, rope, kv_write, attention) then read it from the backend's
 * copy, so the CUDA backend uploads it once per step, not once per op.
 *
 * Determinism.  Every op computes each output element in one fixed order,
 * whatever the thread count or batch composition, so the same request
 * gives the same bits alone or in a batch.
 *
 * All ops return FY_OK or a backend error (already logged).
 */
#ifndef FY_BACKEND_H
#define FY_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"
#include "kv/kv.h"
#include "model/rope.h"
#include "common/status.h"

typedef struct fy_backend fy_backend_t;

typedef struct fy_backend_params {
    int n_threads;   /* CPU: worker threads including the caller; 0 = one per core */
    const char *isa; /* CPU: "auto" (default), "avx512vnni", "avxvnni", "avx2" or "scalar" */
    bool no_repack;  /* CPU: use matmul weights in their file layout */
    bool attn_bf16;  /* CPU: prefill attention in bf16 arithmetic where the CPU has AVX512_BF16 (worker.attn) */
    /* CPU: two-pass activations: each 8-bit activation row's rounding error
     * is quantized to 8 bits again and every quantized matmul multiplies
     * both (about 15 bits; the exact model's next-token distribution to
     * about 1e-6 nats instead of 4e-3, at twice the integer work; also
     * FY_CPU_ACT=q8x2).  BENCHMARKS.md, issue 33. */
    bool act_q8x2;
} fy_backend_params_t;

/* One sequence of a batch: its query tokens are rows [q_start, q_start +
 * n_q) of the batch, at positions kv_len - n_q .. kv_len - 1; their K/V
 * are written this step and attention reads tokens [0, kv_len) of the
 * sequence through its block table. */
typedef struct fy_attn_seq {
    int32_t q_start;
    int32_t n_q;
    int32_t kv_len;
    int32_t n_blocks;
    /* [n_groups][n_blocks]: group g's table at block_table + g * group_stride
     * (host pointer in set_batch's argument; the backend's copy packs the
     * groups, group_stride = n_blocks).  An entry of -1 is a block that is
     * gone: dropped before a layer's window, or evicted (StreamingLLM, H2O)
     * anywhere in the table.  Kernels never read it; its positions are
     * masked as if outside the window. */
    const int32_t *block_table;
    int32_t group_stride;
} fy_attn_seq_t;

typedef struct fy_batch_meta {
    int32_t n_tokens;
    const int32_t *tokens; /* [n_tokens] */
    const int32_t *pos;    /* [n_tokens] position of each token in its sequence */
    const int32_t *slots;  /* [n_groups][n_tokens] KV slot in each group: block * block_size + offset */
    int32_t n_seqs;
    const fy_attn_seq_t *seqs; /* [n_seqs] */
    int32_t n_groups;          /* KV groups (kv.h): the layout's n_groups; 0 reads as 1 */
} fy_batch_meta_t;

/* Reservation made once at start-up so the ops never allocate. */
typedef struct fy_backend_reserve {
    int32_t max_tokens; /* rows per op (batch tokens) */
    int32_t max_row;    /* widest matmul input (elements) */
    int32_t max_seqs;   /* sequences per batch */
    int32_t max_blocks; /* total block-table entries per batch, all groups */
    int32_t n_groups;   /* KV groups (slots per token); 0 reads as 1 */
    int32_t max_kv_len; /* longest sequence */
    int32_t n_heads;    /* query heads of attention */
    int32_t head_dim;
    int32_t n_kv_heads; /* KV heads (how far the CUDA backend splits a decode row's context); 0 reads as n_heads */
} fy_backend_reserve_t;

/* What a runner will ask of a backend, checked once when a worker or
 * generator starts, so that a configuration the backend cannot serve is
 * refused then and not at the first forward pass. */
typedef struct fy_backend_needs {
    int32_t n_heads, n_kv_heads, head_dim; /* the model's attention */
    fy_dtype_t kv_dtype;                   /* kv.dtype */
    bool attn_scores;                      /* H2O (kv.evict = h2o) */
} fy_backend_needs_t;

typedef enum fy_copy_kind {
    FY_COPY_H2D = 0,
    FY_COPY_D2H,
    FY_COPY_D2D,
    FY_COPY_H2H,
} fy_copy_kind_t;

/* name: "cpu" or "cuda" (where this build has it).  Logs and fails for
 * unknown names, and for "cuda" where no GPU can be used. */
fy_status_t fy_backend_create(const char *name, const fy_backend_params_t *params, fy_backend_t **be_p);
/* What a worker's --device / worker.device asks for: "cpu" (NULL means cpu)
 * or "cuda".  "cuda" where the build has no CUDA backend or the machine no
 * usable GPU logs a warning naming the reason and creates the CPU backend. */
fy_status_t fy_backend_create_device(const char *device, const fy_backend_params_t *params, fy_backend_t **be_p);
/* Can fy_backend_create("cuda") succeed here?  If not, why (may be NULL)
 * gets the reason. */
bool fy_backend_cuda_usable(char *why, size_t cap);
void fy_backend_destroy(fy_backend_t *be); /* accepts NULL */
/* "cpu/avx2 x2 threads" and the like. */
const char *fy_backend_describe(const fy_backend_t *be);

fy_status_t fy_backend_reserve(fy_backend_t *be, const fy_backend_reserve_t *r);
/* FY_OK when the backend can run everything n asks; else
 * FY_ERR_UNSUPPORTED with why (cap bytes) naming what it cannot do and
 * what to change.  Logs nothing: the caller words the refusal. */
fy_status_t fy_backend_check(fy_backend_t *be, const fy_backend_needs_t *n, char *why, size_t cap);

/* ---- memory ---- */
fy_status_t fy_backend_alloc(fy_backend_t *be, size_t bytes, void **ptr_p);
void fy_backend_free(fy_backend_t *be, void *ptr); /* accepts NULL */
/* Is what fy_backend_alloc returns device memory (the CUDA backend's GPU
 * memory), which the CPU, and a UCX without CUDA support, cannot read or
 * write?  False for the CPU backend (its "device" memory is host memory).
 * The KV transfer asks it to choose how blocks move between workers
 * (worker.kv_transfer, worker/xstage.h). */
bool fy_backend_device_memory(const fy_backend_t *be);
/* Device memory in bytes: total and what is free now (for the CPU backend,
 * system memory and what the kernel reports available). */
fy_status_t fy_backend_mem_info(fy_backend_t *be, int64_t *total_p, int64_t *free_p);
/* Host memory the backend copies to and from fastest (pinned beside a GPU):
 * the KV host tier and transfer staging buffers. */
fy_status_t fy_backend_alloc_host(fy_backend_t *be, size_t bytes, void **ptr_p);
void fy_backend_free_host(fy_backend_t *be, void *ptr); /* accepts NULL */
fy_status_t fy_backend_memcpy(fy_backend_t *be, void *dst, const void *src, size_t bytes, fy_copy_kind_t kind);
/* How a weight will be used, so the backend can lay it out for that use. */
typedef enum fy_tensor_use {
    FY_USE_MATMUL = 0, /* right operand of fy_backend_matmul */
    FY_USE_ROWS,       /* rows read one at a time (embedding lookup) */
    FY_USE_VECTOR,     /* a 1-d parameter (norm weights) */
} fy_tensor_use_t;

/* A device-resident tensor for a host one; release with
 * fy_backend_release_tensor.  The CPU backend aliases host->data, or for
 * matmul weights makes a copy with rows interleaved for its kernels.  The
 * CUDA backend copies matmul and rows weights as stored, and uploads of
 * the same host tensor (tied embeddings: the table for rows, the head for
 * matmul) share one device copy until the last is released: host memory
 * must not be rewritten with other weights of the same type and shape
 * while a device tensor made from it is alive. */
fy_status_t fy_backend_upload(fy_backend_t *be, const fy_tensor_t *host, fy_tensor_use_t use, fy_tensor_t *dev_p);
void fy_backend_release_tensor(fy_backend_t *be, fy_tensor_t *dev);
/* Copies n whole KV blocks: dst_arena[dst[i]] = src_arena[src[i]] (both
 * may be the same arena; block ids are host arrays; kind says which side is
 * device memory). */
fy_status_t fy_backend_copy_blocks(fy_backend_t *be, const fy_kv_layout_t *lay, void *dst_arena, const void *src_arena,
                                   const int32_t *dst, const int32_t *src, int32_t n, fy_copy_kind_t kind);

/* ---- batch ---- */
fy_status_t fy_backend_set_batch(fy_backend_t *be, const fy_batch_meta_t *meta);

/* ---- compute (device pointers) ---- */
/* out[t] = table row tokens[t], as f32.  out: [n_tokens, dim] */
fy_status_t fy_backend_embed(fy_backend_t *be, const fy_tensor_t *table, float *out);
/* For each of n_w weights w[i] (rows, in): y[i][t] = w[i] . x[t] over the
 * n rows of x ([n, in]); all w[i] share x and its width.  y[i]: [n, rows_i]. */
fy_status_t fy_backend_matmul(fy_backend_t *be, int n_w, const fy_tensor_t *const *w, const float *x, int32_t n,
                              float *const *y);
/* rmsnorm(x, norm) into h, then the matmul of h by the n_w weights w (as
 * fy_backend_matmul: y[i]: [n, rows_i]), in one op: the same bits as
 * fy_backend_rmsnorm followed by fy_backend_matmul (the CPU backend
 * normalizes and quantizes each row in one pass and dispatches once; a
 * backend without the fused op runs the two).  x, h: [n, dim]; h may alias
 * x and is left holding the normalized rows. */
fy_status_t fy_backend_rmsnorm_matmul(fy_backend_t *be, const float *x, const fy_tensor_t *norm, float eps, int n_w,
                                      const fy_tensor_t *const *w, int32_t n, float *h, float *const *y);
/* y[t] = x[t] / rms(x[t]) * w; x, y: [n, dim]; may alias. w: f32 (dim). */
fy_status_t fy_backend_rmsnorm(fy_backend_t *be, const float *x, const fy_tensor_t *w, int32_t n, float eps, float *y);
/* Rotary embedding of q [n_tokens, n_heads, head_dim] and k [n_tokens,
 * n_kv_heads, head_dim] in place, at the batch's positions, turned as rope
 * says (rope.h: convention, base, linear and per-frequency scaling; its
 * freq_factors are host memory, read during the call). */
fy_status_t fy_backend_rope(fy_backend_t *be, float *q, float *k, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                            const fy_rope_t *rope);
/* out = silu(gate) * up, elementwise; n elements; out may alias gate. */
fy_status_t fy_backend_swiglu(fy_backend_t *be, const float *gate, const float *up, float *out, size_t n);
/* out = gelu_tanh(gate) * up, elementwise (GELU with the tanh
 * approximation, written gate * sigmoid(2u), u = sqrt(2/pi) (g + 0.044715 g^3),
 * which is 0.5 g (1 + tanh u) without its cancellation); n elements; out may
 * alias gate. */
fy_status_t fy_backend_geglu(fy_backend_t *be, const float *gate, const float *up, float *out, size_t n);
/* x += y; n elements */
fy_status_t fy_backend_add(fy_backend_t *be, float *x, const float *y, size_t n);
/* x[t] += b for each of the n rows of x ([n, b->ne[0]]); b: an f32 vector
 * uploaded with FY_USE_VECTOR (the biases of a projection). */
fy_status_t fy_backend_add_bias(fy_backend_t *be, float *x, const fy_tensor_t *b, int32_t n);
/* x *= s; n elements */
fy_status_t fy_backend_scale(fy_backend_t *be, float *x, float s, size_t n);
/* dst[i] = src[rows[i]] for i < n; rows of dim floats; rows is a host array. */
fy_status_t fy_backend_get_rows(fy_backend_t *be, const float *src, const int32_t *rows, int32_t n, int32_t dim,
                                float *dst);
/* Writes k, v ([n_tokens, n_kv_heads, head_dim]) of one layer into the
 * arena at the batch's slots.  A slot of -1 writes nothing: the padding
 * rows of a batch shaped for a recorded graph (fy_backend_graph_begin). */
fy_status_t fy_backend_kv_write(fy_backend_t *be, const fy_kv_layout_t *lay, void *arena, int32_t layer, const float *k,
                                const float *v);
/* Causal paged attention of one layer for the whole batch: out[t, h] =
 * softmax(scale * q[t, h] . K) V over the sequence's tokens the query at
 * position p sees, K/V of kv head h / (n_heads / n_kv_heads).  window 0:
 * positions 0..p (global); window W > 0: positions p - W + 1 .. p, the last
 * W including p itself (a key at j is masked when p - j >= W, as llama.cpp's
 * LLAMA_SWA_TYPE_STANDARD and Hugging Face's sliding_window_overlay), and
 * blocks wholly before the window are never read.  Positions in evicted
 * blocks (block-table entry -1) take no part either.  A query that sees no
 * key at all (every visible block evicted; the engine always keeps the
 * current token's block, so only a caller bug does this) gets zeros, not
 * NaN.  scale is usually 1 / sqrt(head_dim).  q, out: [n_tokens, n_heads,
 * head_dim]. */
fy_status_t fy_backend_attention(fy_backend_t *be, const fy_kv_layout_t *lay, const void *arena, int32_t layer,
                                 int32_t n_heads, float scale, int32_t window, const float *q, float *out);
/* H2O: while set, each attention call adds into scores[s * stride + i] the
 * attention mass (the softmax weights, summed over the query heads and over
 * sequence s's query rows of this batch) that the keys of block i of
 * sequence s received in that layer; i indexes the sequence's logical
 * blocks (0 .. n_blocks-1; with several KV groups every group's layers add
 * into the same entry i).  Every query row of the batch counts, prefill
 * chunks included; a row adds n_heads in all (each head's weights sum to
 * 1; a head that sees no key, all its blocks evicted, adds 0).  Blocks no
 * row saw (evicted, before every window, past kv_len) get nothing added.  NULL: off (the default; no cost).  Host
 * memory, valid until unset.  set_batch turns it off (a new batch has
 * other sequences, and a draft model's batch must not add to the target's
 * scores): set it after each set_batch whose attention it should measure;
 * stride must be at least every sequence's n_blocks.  The CPU backend
 * computes it inside its attention pass (no second read of K) and adds in
 * a fixed order: the same bits for any thread count.  The CUDA backend
 * gathers it on the device in a pass of its own and adds it into scores
 * at fy_backend_sync (and when scores are unset or a batch is set). */
fy_status_t fy_backend_set_attn_scores(fy_backend_t *be, float *scores, int32_t stride);
fy_status_t fy_backend_sync(fy_backend_t *be);

/* ---- recorded steps (CUDA graphs; optional) ----
 * A run of ops issued the same way step after step, with only the
 * contents of the batch metadata changing (same shapes, same pointers),
 * can be recorded once and replayed, saving the launch cost of each op.
 * After set_batch, fy_backend_graph_begin(be, owner, shape, &replay):
 *   - a recording of (owner, shape) exists: *replay = true; the caller
 *     issues no ops and calls graph_end, which launches it;
 *   - else recording starts: *replay = false; the caller issues the ops
 *     as usual (they are recorded, nothing runs) and graph_end
 *     instantiates the recording and launches it (keep false: an op
 *     failed while recording; the recording is dropped, nothing runs,
 *     and graph_end answers FY_ERR_UNSUPPORTED).
 * Between begin and end only compute ops (embed .. attention): no sync,
 * memcpy, copy_blocks, set_batch, set_attn_scores, upload or alloc.
 * FY_ERR_UNSUPPORTED from begin: no graphs here (the CPU backend, profiling
 * on, or recordings failed before): run the ops directly.  From end after
 * a recording: the recording failed and nothing ran (an op refused to be
 * recorded, or failed): run the ops directly; the backend records no more.
 * A recording refers to the memory it was made with: every free, release
 * and reserve drops all recordings.  Main thread, like every op. */
fy_status_t fy_backend_graph_begin(fy_backend_t *be, const void *owner, int32_t shape, bool *replay_p);
/* Does this backend record steps (and is profiling off)? */
bool fy_backend_graphs(const fy_backend_t *be);
fy_status_t fy_backend_graph_end(fy_backend_t *be, bool keep);

/* ---- profiling: wall time per op, synchronizing after each op when on ---- */
typedef enum fy_backend_op {
    FY_OP_EMBED = 0,
    FY_OP_MATMUL,
    FY_OP_RMSNORM,
    FY_OP_ROPE,
    FY_OP_SWIGLU,
    FY_OP_ADD,
    FY_OP_GET_ROWS,
    FY_OP_KV_WRITE,
    FY_OP_ATTENTION,
    FY_OP_COPY, /* memcpy and copy_blocks */
    FY_OP_GEGLU,
    FY_OP_BIAS,
    FY_OP_SCALE,
    FY_OP_COUNT
} fy_backend_op_t;

typedef struct fy_backend_profile {
    uint64_t ns[FY_OP_COUNT];
    uint64_t calls[FY_OP_COUNT];
} fy_backend_profile_t;

void fy_backend_profile_enable(fy_backend_t *be, bool on); /* also resets the counters */
void fy_backend_profile_get(const fy_backend_t *be, fy_backend_profile_t *out);
const char *fy_backend_op_name(fy_backend_op_t op);

#endif /* FY_BACKEND_H */

/*
 * kv.h - the paged KV cache: its memory layout, and the block manager
 * that owns every block of every tier.
 *
 * Layout.  A KV arena is an array of blocks; each block holds block_size
 * tokens of every layer, ordered
 *     [layer][k | v][kv_head][token_in_block][head_dim]
 * ("block-major").  One block is one contiguous byte range, so shipping a
 * run of blocks is one put, and a prefill chunk that fills whole blocks can
 * be sent as soon as its last layer is done (docs/architecture.md says why
 * this order).  Attention reads K/V only through a sequence's block table.
 *
 * Tiers.  The device tier is the arena the kernels read (GPU memory for
 * CUDA, host memory for the CPU backend).  An optional host tier (pinned
 * host memory beside a GPU) holds sequences swapped out by preemption and
 * prefix blocks demoted from the device; an optional disk tier (one file,
 * size-bounded) takes prefix blocks evicted from the host tier.  The
 * manager accounts for block ids only; bytes move through a copy callback
 * the engine wires to its backend (device <-> host), and host <-> disk is
 * plain file I/O on the host arena.  common/ never touches device memory.
 *
 * Block states.  Every block of a tier is exactly one of: free; used
 * (referenced by one or more sequences, refcount > 0); cached (refcount 0,
 * full, named in the prefix index, on the LRU list, evictable).  The
 * invariant free + used + cached == total holds after every operation
 * (fy_kvm_check verifies it and every refcount by a full scan).
 *
 * Prefix cache.  A full block is named by a chained keyed hash
 *     h_i = BLAKE2b_key(ns, h_{i-1}, tokens of block i)
 * where key is the deployment's secret and ns digests, length-prefixed,
 * the tenant, the model, the KV layout and dtype and the adapter: clients
 * can neither predict nor collide names, and a tenant never receives a
 * block computed for another.  The namespace comes from the server side
 * (the API key's tenant), never from a client field.
 *
 * Sequences share blocks by refcount (fork for parallel sampling), and a
 * write to a shared block copies it first (copy-on-write).  Not
 * thread-safe: the engine thread owns the manager.
 */
#ifndef FY_KV_H
#define FY_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"
#include "common/status.h"

/* ---- layout ------------------------------------------------------------------------------ */

/*
 * KV groups.  Models that mix sliding-window and global layers (Gemma 3:
 * five local layers per global one) keep the two kinds in separate block
 * tables, as vLLM's hybrid KV manager does: the layers are split into
 * groups of group_layers layers of one window each, a page (what the pool
 * hands out; "block" below) holds block_size tokens of one group's layers,
 * and a sequence has one block table per group.  A sliding group drops
 * the blocks that lie wholly before its window while the sequence runs, so
 * it holds at most ceil((W - 1 + step) / block_size) + 1 blocks; a global
 * group keeps everything.  group_layers is the gcd of the layer counts of
 * each window, so every page has the same size and one pool serves all
 * groups.  A model whose layers all share one window has one group of
 * every layer: the layout every model had before groups.
 */
#define FY_KV_MAX_LAYERS 1024

typedef struct fy_kv_layout {
    int32_t n_layers;
    int32_t n_kv_heads;
    int32_t head_dim;
    int32_t block_size; /* tokens per block: 8, 16 or 32 */
    fy_dtype_t dtype;   /* element type of K and V: f32, f16, fp8 or int8 */
    /* derived, in bytes */
    size_t elem_bytes;
    size_t row_bytes;   /* one token of one head: head_dim elements, plus its scale for fp8/int8 */
    size_t head_bytes;  /* one head of one block: block_size rows */
    size_t kv_bytes;    /* all K (or all V) heads of one layer of one block */
    size_t layer_bytes; /* K and V of one layer of one block */
    size_t block_bytes; /* one block (page): group_layers layers */
    /* groups (fy_kv_layout_set_windows; one group of every layer without) */
    int32_t n_groups;
    int32_t group_layers;
    int32_t group_window[FY_KV_MAX_LAYERS]; /* [n_groups] 0: global */
    uint16_t layer_group[FY_KV_MAX_LAYERS]; /* [n_layers] the group of each layer */
    uint16_t layer_slot[FY_KV_MAX_LAYERS];  /* [n_layers] its place in the group's pages */
} fy_kv_layout_t;

/*
 * Scaled rows.  For fp8 (e4m3) and int8 each row (one token of one K or V
 * head) is [f32 scale][head_dim one-byte codes], x = scale * decode(code):
 * the scale is per head and per token, set when the token is written, so a
 * block never needs requantizing as it fills, and blocks stay
 * self-contained bytes for prefix caching, copy-on-write, swapping and
 * transfer.  int8: scale = max|x| / 127, codes rounded to nearest;
 * fp8: scale = max|x| / 448, codes e4m3 rounded to nearest even.
 * FY_KV_SCALE_ROW_F32 names this format in the transfer layout descriptor
 * (0 there means unscaled f16/f32 rows).
 */
#define FY_KV_SCALE_NONE 0
#define FY_KV_SCALE_ROW_F32 1

static inline bool fy_kv_dtype_scaled(fy_dtype_t dtype) { return dtype == FY_DTYPE_FP8 || dtype == FY_DTYPE_I8; }
static inline int32_t fy_kv_scale_format(const fy_kv_layout_t *lay)
{
    return fy_kv_dtype_scaled(lay->dtype) ? FY_KV_SCALE_ROW_F32 : FY_KV_SCALE_NONE;
}
/* The reference row codec: x[head_dim] into one row of lay's format, and
 * back.  For f32/f16 a plain conversion. */
void fy_kv_row_write(const fy_kv_layout_t *lay, const float *x, void *row);
void fy_kv_row_read(const fy_kv_layout_t *lay, const void *row, float *x);

/* Fills lay with one group of every layer; FY_ERR_INVALID (logged) for
 * unsupported sizes or dtypes. */
fy_status_t fy_kv_layout_init(fy_kv_layout_t *lay, int32_t n_layers, int32_t n_kv_heads, int32_t head_dim,
                              int32_t block_size, fy_dtype_t dtype);

/* Groups the layers by window (window[n_layers], 0 global): global groups
 * first, then sliding ones by window, each in layer order.  With every
 * window equal the layout stays one group.  FY_ERR_INVALID (logged) for a
 * negative window. */
fy_status_t fy_kv_layout_set_windows(fy_kv_layout_t *lay, const int32_t *window);

/* A worker's layout, the one rule for it: fy_kv_layout_init, then grouped
 * by window[n_layers] (the model's layers' windows) unless window is NULL
 * (kv.sliding_groups false, or a draft's one group).  The runner (for each
 * rank's stage and heads) and the router (the whole model, to count blocks
 * as workers do) both call it, so their block counts and names agree. */
fy_status_t fy_kv_layout_make(fy_kv_layout_t *lay, int32_t n_layers, int32_t n_kv_heads, int32_t head_dim,
                              int32_t block_size, fy_dtype_t dtype, const int32_t *window);

/* A digest of the grouping (each layer's group and place, each group's
 * window) for the transfer layout descriptor; 0 for one group of every
 * layer in order with no window. */
uint32_t fy_kv_layout_groups_digest(const fy_kv_layout_t *lay);

/* Byte offset of (block, layer, k or v, head, token 0) in an arena: the
 * block is one of the layer's group. */
static inline size_t fy_kv_offset(const fy_kv_layout_t *lay, int32_t block, int32_t layer, int is_v, int32_t head)
{
    return (size_t)block * lay->block_bytes + (size_t)lay->layer_slot[layer] * lay->layer_bytes +
           (size_t)is_v * lay->kv_bytes + (size_t)head * lay->head_bytes;
}

/* KV bytes one token takes across all layers (before any block of a
 * sliding group is dropped). */
static inline size_t fy_kv_bytes_per_token(const fy_kv_layout_t *lay)
{
    return lay->block_bytes * (size_t)lay->n_groups / (size_t)lay->block_size;
}

/* Blocks (pages) a sequence of n tokens holds at most: every block of the
 * global groups, and of a sliding group the blocks a step of up to `step`
 * new tokens can see. */
int64_t fy_kv_blocks_held(const fy_kv_layout_t *lay, int64_t n, int32_t step);

/* ---- prefix names ------------------------------------------------------------------------- */

#define FY_KV_HASH_BYTES 16

typedef struct fy_kv_hash {
    uint8_t b[FY_KV_HASH_BYTES];
} fy_kv_hash_t;

/* A namespace: what, besides the tokens, decides a block's contents. */
typedef struct fy_kv_ns {
    fy_kv_hash_t digest;
} fy_kv_ns_t;

/* Keyed hashing state made once from the deployment's secret. */
typedef struct fy_kv_hasher fy_kv_hasher_t;

/* secret: at least 16 bytes (at most 64); every process of a deployment
 * must use the same one for prefix-aware routing to work. */
fy_status_t fy_kv_hasher_create(const uint8_t *secret, size_t len, fy_kv_hasher_t **h_p);
/* With a fresh random secret: for a process whose cache nobody else names. */
fy_status_t fy_kv_hasher_create_random(fy_kv_hasher_t **h_p);
/* The deployment's hasher: keyed by secret (fy_cluster_prefix_secret's),
 * or, with len 0, a random key private to the process. */
fy_status_t fy_kv_hasher_for(const uint8_t *secret, size_t len, fy_kv_hasher_t **h_p);
void fy_kv_hasher_destroy(fy_kv_hasher_t *h);

/* The namespace of (tenant, model, layout, adapter); adapter may be NULL.
 * Each field is length-prefixed, so different tuples never serialize to
 * the same bytes. */
void fy_kv_ns_make(const fy_kv_hasher_t *h, const char *tenant, const char *model_id, const fy_kv_layout_t *lay,
                   const char *adapter, fy_kv_ns_t *ns_p);

/* h = H(ns, parent, tokens[block_size]); parent NULL for the first block. */
void fy_kv_hash_block(const fy_kv_hasher_t *h, const fy_kv_ns_t *ns, const fy_kv_hash_t *parent, const int32_t *tokens,
                      int32_t block_size, fy_kv_hash_t *out);

/* ---- the block manager ---------------------------------------------------------------------- */

typedef enum fy_kv_tier { FY_KV_DEVICE = 0, FY_KV_HOST, FY_KV_DISK, FY_KV_TIERS } fy_kv_tier_t;

const char *fy_kv_tier_name(fy_kv_tier_t tier);

/* Copies n whole blocks: dst_tier block dst[i] <- src_tier block src[i].
 * Tiers are device or host (the manager does disk I/O itself). */
typedef fy_status_t (*fy_kv_copy_fn)(void *arg, fy_kv_tier_t dst_tier, const int32_t *dst, fy_kv_tier_t src_tier,
                                     const int32_t *src, int32_t n);

/* The share of device blocks admission keeps free unless told otherwise
 * (fy_runner_kvm_params; a pool for a context must count it:
 * fy_kv_pool_blocks). */
#define FY_KVM_WATERMARK 0.01f

typedef struct fy_kvm_params {
    fy_kv_layout_t layout;
    int32_t n_device_blocks;
    int32_t n_host_blocks; /* 0: no host tier */
    void *host_arena;      /* n_host_blocks * block_bytes of host memory (the caller's; pinned beside a GPU) */
    const char *disk_dir;  /* NULL: no disk tier; else an existing folder (fy_kv_disk_dir_check) where the
                              tier's file is made in a private folder of its own, both unlinked at once */
    int64_t disk_bytes;    /* size bound of the disk tier */
    fy_kv_copy_fn copy;    /* device <-> host, and within a tier (copy-on-write); required */
    void *copy_arg;
    const fy_kv_hasher_t *hasher; /* required; outlives the manager */
    bool prefix_caching;          /* false: full blocks are never named or kept after release */
    float watermark;              /* share of device blocks admission keeps free (0.01 = 1%) */
    int32_t max_step_tokens;      /* most tokens one forward pass adds to a sequence (sliding groups'
                                     admission bound); 0: unbounded (sliding groups counted whole) */
    int32_t n_ranks;              /* ranks whose arenas copy touches (a rank group: rank 0's manager for
                                     all); 0 and 1 mean one.  A disk tier is refused with more: the
                                     manager would write only host_arena, rank 0's, to disk */
} fy_kvm_params_t;

typedef struct fy_kvm fy_kvm_t;

fy_status_t fy_kvm_create(const fy_kvm_params_t *params, fy_kvm_t **m_p);
/* Every sequence must have been released. */
void fy_kvm_destroy(fy_kvm_t *m); /* accepts NULL */
const fy_kv_layout_t *fy_kvm_layout(const fy_kvm_t *m);

/* ---- sequences (block tables) ---- */

/* The blocks of one sequence, one table per KV group: token t of group g
 * lives in block blocks[g * max_blocks + t / block_size] at slot
 * t % block_size.  Group 0 comes first, so for a one-group layout blocks[]
 * is the plain table.  A sliding group holds blocks [lo[g], n_blocks); the
 * entries before lo[g] are -1 (dropped: no query can see them).  Blocks
 * evicted by a KV budget (fy_kvm_seq_evict) are -1 too, anywhere before
 * the block being written; kernels skip -1 entries.  Arrays are sized at
 * init for the longest sequence allowed, so growing never allocates. */
typedef struct fy_block_table {
    int32_t *blocks; /* [n_groups * max_blocks] */
    int32_t *lo;     /* [n_groups] first block each group holds */
    int32_t n_groups;
    int32_t n_blocks;   /* blocks of the sequence (per group) */
    int32_t max_blocks; /* capacity */
    int32_t n_tokens;   /* tokens whose K/V are written */
    int32_t block_size;
    fy_kv_tier_t tier; /* where its blocks are: device, or host while swapped out */
    fy_kv_ns_t ns;
    fy_kv_hash_t *hashes; /* [max_blocks] names of the leading full blocks */
    int32_t n_hashed;     /* leading blocks with hashes[] computed */
    int32_t n_named;      /* leading blocks named in the prefix index (theirs or found there) */
    int32_t name_limit;   /* blocks from this one on are never named: their K/V were computed after an
                             eviction, so they are not the K/V of the full prefix (INT32_MAX: none) */
    int32_t n_evicted;    /* blocks (rows of every group) evicted by fy_kvm_seq_evict */
} fy_block_table_t;

/* Group g's table. */
static inline int32_t *fy_block_table_group(const fy_block_table_t *bt, int32_t g)
{
    return bt->blocks + (size_t)g * (size_t)bt->max_blocks;
}

/* The slot (block * block_size + offset) of token t in group g,
 * lo[g] * block_size <= t < n_blocks * block_size. */
static inline int32_t fy_block_table_slot(const fy_block_table_t *bt, int32_t g, int32_t t)
{
    return fy_block_table_group(bt, g)[t / bt->block_size] * bt->block_size + t % bt->block_size;
}

/* Blocks held over all groups. */
int32_t fy_block_table_held(const fy_block_table_t *bt);

/* Whether some KV group holds logical block i (not dropped by a sliding
 * window in every group, not evicted). */
static inline bool fy_block_table_holds(const fy_block_table_t *bt, int32_t i)
{
    for (int32_t g = 0; g < bt->n_groups; g++)
        if (i >= bt->lo[g] && i < bt->n_blocks && fy_block_table_group(bt, g)[i] >= 0) return true;
    return false;
}

/* A promise of blocks made at admission, drawn from as blocks are taken. */
typedef struct fy_kv_resv {
    int32_t blocks;
} fy_kv_resv_t;

fy_status_t fy_kvm_seq_init(fy_kvm_t *m, fy_block_table_t *bt, int32_t max_tokens, const fy_kv_ns_t *ns);
/* The table must hold no blocks (release it first). */
void fy_kvm_seq_deinit(fy_block_table_t *bt);

/*
 * Attaches the longest cached prefix of tokens[n] to an empty table, block
 * by block, from any tier (host and disk hits are promoted to the device),
 * at most (n - 1) / block_size blocks so at least one token is left to
 * compute.  A hit of k blocks needs every block of the global groups
 * before k, and of each sliding group only the blocks a query at position
 * k * block_size sees.  Sets bt->n_tokens to the tokens found; *hit_p (may be NULL)
 * too.  Counts a prefix query of n tokens.
 */
fy_status_t fy_kvm_seq_lookup(fy_kvm_t *m, fy_block_table_t *bt, const int32_t *tokens, int32_t n, int32_t *hit_p);

/* Makes room for n_tokens tokens in total and makes the block that the
 * next token goes into exclusive (copy-on-write of a shared block).  All or
 * nothing: FY_ERR_NO_SPACE (no free or evictable block), FY_ERR_INVALID
 * (past max_tokens, or swapped out).  resv (may be NULL) is drawn from. */
fy_status_t fy_kvm_seq_reserve(fy_kvm_t *m, fy_block_table_t *bt, int32_t n_tokens, fy_kv_resv_t *resv);
/* fy_kvm_seq_reserve when the first query to run is at position `from`
 * (>= bt->n_tokens), not bt->n_tokens: a decode worker reserving blocks
 * that a transfer fills reads them first from the prompt's end.  Sliding
 * groups first drop what a query at `from` cannot see (into resv, as
 * fy_kvm_seq_commit does) and get blocks only from their window on. */
fy_status_t fy_kvm_seq_reserve_from(fy_kvm_t *m, fy_block_table_t *bt, int32_t n_tokens, int32_t from,
                                    fy_kv_resv_t *resv);

/*
 * Reserving for a prompt whose K/V arrive after a KV budget evicted some
 * of it (evict.h): which blocks the sender keeps is not known yet, only
 * that at most `slots` of them lie at or after the first block not cached
 * here (bt->n_tokens / block_size; bt->n_tokens must be a whole number of
 * blocks, as a lookup leaves it).  Sliding groups drop what a query at
 * n_tokens cannot see; each group then gets min(slots, its blocks from
 * there to n_tokens) blocks at the front of that range, the rest of its
 * entries stay -1, and bt->n_blocks covers n_tokens.  fy_kvm_seq_place
 * moves the blocks where the sender's kept blocks belong.  All or nothing;
 * FY_ERR_NO_SPACE, FY_ERR_INVALID as fy_kvm_seq_reserve.
 */
fy_status_t fy_kvm_seq_reserve_slots(fy_kvm_t *m, fy_block_table_t *bt, int32_t n_tokens, int32_t slots,
                                     fy_kv_resv_t *resv);

/*
 * After fy_kvm_seq_reserve_slots, once the sender says which of the
 * prompt's blocks it kept: kept[0..n_kept) are logical block indexes,
 * ascending, the last one the prompt's last block.  Each group's reserved
 * blocks move, in order, to its kept indexes from the first uncached
 * block (or its window) on; cached blocks not kept are evicted (counted,
 * and no block from the first one not kept on is named: its K/V came from
 * an evicted context); reserved blocks left over go back.  Blocks back in
 * the pool go into resv's promise.  FY_ERR_INVALID (logged, nothing
 * changed) when kept is out of order or range, leaves out the last block,
 * names a cached block not here, or gives a group more blocks than it
 * reserved.  Before fy_kvm_seq_commit of the prompt.
 */
fy_status_t fy_kvm_seq_place(fy_kvm_t *m, fy_block_table_t *bt, const int32_t *kept, int32_t n_kept,
                             fy_kv_resv_t *resv);

/* Records that tokens [bt->n_tokens, n) are written (tokens holds the whole
 * sequence so far), names the blocks that became full, and has sliding
 * groups drop the blocks that no query at position n or later can see.
 * A dropped block that goes back to the pool goes back into resv's
 * promise (may be NULL), so what admission promised a request covers its
 * whole run although its sliding groups take new blocks as they go. */
void fy_kvm_seq_commit(fy_kvm_t *m, fy_block_table_t *bt, const int32_t *tokens, int32_t n, fy_kv_resv_t *resv);

/* Keeps the first n tokens (rolling back speculative tokens); blocks no
 * longer needed go back.  n must not go behind what the last commit let
 * sliding groups drop (logged as a caller bug, and the table is cut to
 * what it still holds). */
void fy_kvm_seq_truncate(fy_kvm_t *m, fy_block_table_t *bt, int32_t n);

/* fy_kvm_seq_truncate for a speculative step that reserved from resv:
 * the device blocks the truncation makes takeable again go back into
 * resv's promise, at most `owed` of them (what the step drew from it), so
 * rolling back never shrinks what admission promised the request.
 * Returns how many blocks went back into the promise. */
int32_t fy_kvm_seq_rollback(fy_kvm_t *m, fy_block_table_t *bt, int32_t n, fy_kv_resv_t *resv, int32_t owed);

/* dst (an initialized, empty table) shares all of src's blocks. */
fy_status_t fy_kvm_seq_fork(fy_kvm_t *m, const fy_block_table_t *src, fy_block_table_t *dst);

/* Returns every block: named blocks whose last reference goes stay cached
 * (evictable, later blocks of the sequence evicted first); others are
 * freed.  The table is empty afterwards. */
void fy_kvm_seq_release(fy_kvm_t *m, fy_block_table_t *bt);

/*
 * KV eviction (StreamingLLM, H2O): drops this sequence's reference to
 * blocks[0..n) (logical block indexes, every group's copy), which must be
 * full blocks before the one the next token goes into and not evicted
 * yet; their entries become -1.  A block shared with other sequences or
 * named in the prefix cache keeps its contents: only this reference
 * goes.  From here on the sequence names no block at or after the one
 * being written (their K/V will be computed without the evicted tokens,
 * so they are not the K/V of the full prefix).  Blocks that go back to the
 * pool go back into resv's promise (may be NULL).  FY_ERR_INVALID (logged,
 * nothing changed) for an index out of range, repeated, already evicted,
 * or not yet full.
 */
fy_status_t fy_kvm_seq_evict(fy_kvm_t *m, fy_block_table_t *bt, const int32_t *blocks, int32_t n, fy_kv_resv_t *resv);

/* Preemption by swapping: moves a sequence's blocks to the host tier and
 * back.  FY_ERR_NO_SPACE (nothing changed) when the other tier is full;
 * FY_ERR_UNSUPPORTED without a host tier. */
fy_status_t fy_kvm_seq_swap_out(fy_kvm_t *m, fy_block_table_t *bt);
fy_status_t fy_kvm_seq_swap_in(fy_kvm_t *m, fy_block_table_t *bt, fy_kv_resv_t *resv);

/* ---- admission ---- */

/* Device blocks a request needs at most: prompt plus max_tokens, less the
 * blocks its cached prefix already covers; for a sliding group no more
 * than its window and one step hold at once (fy_kv_blocks_held). */
int32_t fy_kvm_blocks_for(const fy_kvm_t *m, int32_t prompt_tokens, int32_t max_tokens, int32_t cached_tokens);
/* Promises blocks to a request if free plus evictable blocks, less what is
 * promised to others and the watermark, cover them: then later allocations
 * drawing from the promise cannot fail.  FY_ERR_NO_SPACE otherwise. */
/* fy_kvm_blocks_for for a sequence that never holds more than cap blocks
 * in any group (a KV budget, evict.h); INT32_MAX: no cap. */
int32_t fy_kvm_blocks_for_capped(const fy_kvm_t *m, int32_t prompt_tokens, int32_t max_tokens, int32_t cached_tokens,
                                 int32_t cap);
fy_status_t fy_kvm_admit(fy_kvm_t *m, int32_t blocks, fy_kv_resv_t *resv);
/* Returns what is left of a promise (when the request ends). */
void fy_kvm_resv_release(fy_kvm_t *m, fy_kv_resv_t *resv);
/* Blocks fy_kvm_admit could still promise now (a load figure). */
int32_t fy_kvm_admittable(const fy_kvm_t *m);
/* The most one request can ever be promised: every device block less the
 * watermark.  A request needing more is refused at once, not queued. */
int32_t fy_kvm_capacity(const fy_kvm_t *m);

/* Calls fn with the name of every block of group 0 of a tier that is in
 * the prefix index (cached or in use): what a router's prefix digest is
 * built from (the other groups' blocks of a prefix carry derived names). */
void fy_kvm_foreach_name(const fy_kvm_t *m, fy_kv_tier_t tier, void (*fn)(void *arg, const fy_kv_hash_t *h), void *arg);

/* ---- figures ---- */

typedef struct fy_kvm_tier_stats {
    int32_t total, free, used, cached;
    uint64_t hits;      /* prefix blocks found in this tier */
    uint64_t evictions; /* cached blocks pushed out of this tier */
} fy_kvm_tier_stats_t;

typedef struct fy_kvm_stats {
    fy_kvm_tier_stats_t tier[FY_KV_TIERS];
    bool balanced;                  /* free + used + cached == total in every tier */
    double usage;                   /* device blocks used / total */
    double waste;                   /* unfilled token slots / slots of used device blocks */
    int32_t promised;               /* device blocks promised at admission, not yet taken */
    uint64_t queries, query_tokens; /* prefix lookups, and the tokens they asked about */
    uint64_t hit_blocks, hit_tokens;
    uint64_t cow_copies;
    uint64_t swap_out_blocks, swap_in_blocks;
    uint64_t demotions, promotions;
    uint64_t disk_bad_blocks;              /* disk blocks dropped when read back: their checksum differed */
    uint64_t slid_blocks;                  /* blocks sliding groups dropped while their sequences ran */
    uint64_t evicted_blocks;               /* blocks KV budgets evicted (fy_kvm_seq_evict; each group's copy) */
    int32_t groups_global, groups_sliding; /* the layout's KV groups */
} fy_kvm_stats_t;

void fy_kvm_stats(const fy_kvm_t *m, fy_kvm_stats_t *out);

/* Whether dir may hold a disk tier: a directory (not a link to one), owned
 * by this process's user or root, not writable by others without the
 * sticky bit.  FY_ERR_INVALID with why ("is not a directory") otherwise. */
fy_status_t fy_kv_disk_dir_check(const char *dir, char *why, size_t cap);
int32_t fy_kvm_n_free(const fy_kvm_t *m, fy_kv_tier_t tier);
int32_t fy_kvm_refcount(const fy_kvm_t *m, fy_kv_tier_t tier, int32_t block);
/* Full scan: states, refcounts, free list, LRU list and index agree, and
 * free + used + cached == total in each tier.  FY_ERR_INTERNAL (logged). */
fy_status_t fy_kvm_check(const fy_kvm_t *m);

#endif /* FY_KV_H */

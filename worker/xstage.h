/*
 * xstage.h - (worker/: it joins the backend and transfer/) KV transfer staged through pinned host memory: how a worker
 * moves KV blocks when UCX cannot read or write its KV pool itself (a
 * CUDA pool with a UCX built without CUDA transports, as Debian's 1.13).
 *
 * worker.kv_transfer says how (fy_xstage_choose):
 *   direct  UCX reads and writes the KV pool itself (host memory, or CUDA
 *           memory when UCX supports it: fy_xfer_ucx_cuda);
 *   staged  UCX only ever sees a pinned host staging area of
 *           worker.kv_staging_blocks blocks (fy_backend_alloc_host): a
 *           prefill worker copies finished blocks device-to-host into
 *           staging slots and puts them from there; a decode worker
 *           receives into staging slots and copies them host-to-device into
 *           the blocks it reserved before it adopts the sequence;
 *   auto    direct for a host pool or a UCX with CUDA memory, else staged.
 * On the CPU backend "device" memory is host memory, so a forced staged
 * mode runs this very code with memcpy copies (tests/test_cluster.c).
 *
 * The staging area is a pool of slots, each one block's bytes, taken and
 * given back one by one:
 *   - a sender (prefill) takes what is free, up to half the pool per batch,
 *     copies, and puts with fy_xgroup_job_put_then, whose release gives the
 *     slots back as soon as UCX no longer reads them (send completion, not
 *     the job's end): a prompt of any length flows through a pool of any
 *     size, and while one batch is on the wire the next is copied (on the
 *     CUDA backend the copy runs on its copy stream and the engine thread
 *     waits for it; it does not overlap the next forward pass);
 *   - a receiver (decode) takes, at reservation, one slot for every block
 *     the prefill worker will send, all or none (the prefill worker writes
 *     into them with no flow control back), and gives them back when the
 *     lease ends: adopted (after the copy), expired, released, or the
 *     router forgot it.  A reservation that finds too few free slots is
 *     refused ("kv staging exhausted").
 * Every slot returns to the pool however a job ends; fy_xstage_stats' free
 * count is what tests and /metrics watch.
 *
 * Threading: take and give from any thread (a mutex); the copies and the
 * queue pump on the thread that owns the backend's stream (the engine
 * thread).  The wake function runs on whichever thread gave slots back.
 *
 * The CUDA path (cudaHostAlloc'd staging, copies on the backend's copy
 * stream) first ran on an H200 on 2026-11-28 (tools/gpu_check.sh step 6:
 * a staged prefill and decode worker answered every prompt).
 */
#ifndef FY_XSTAGE_H
#define FY_XSTAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "kv/kv.h"
#include "common/status.h"
#include "transfer/xfer.h"
#include "transfer/xgroup.h"

/* What worker.kv_transfer asks for ("auto", "direct", "staged"), for a KV
 * pool that is device memory or not (fy_backend_device_memory) and a UCX
 * that supports CUDA memory or not (fy_xfer_ucx_cuda): the memory the
 * transfer engine registers.  Pure.  FY_ERR_INVALID for an unknown
 * value, FY_ERR_UNSUPPORTED for "direct" on device memory without a CUDA
 * UCX; why gets one line naming worker.kv_transfer and the reason, on
 * success what was chosen and why. */
fy_status_t fy_xstage_choose(const char *asked, bool device_memory, bool ucx_cuda, fy_xfer_mem_t *mem_p, char *why,
                             size_t cap);

/* The blocks a staging area gets by default when worker.kv_staging_blocks
 * is 0: a prefill worker 64 (two batches of 32 in flight: 23.6 MB for
 * SmolLM2-135M, 128 MiB for Llama-3-8B's 2 MiB blocks of 16 tokens);
 * a decode worker enough for max_seqs prompts of max_prompt_blocks each
 * (a whole context's blocks, every KV group), at most 4096 blocks (8 GiB
 * for Llama-3-8B) unless one prompt needs more; neither more than the
 * pool. */
int32_t fy_xstage_default_slots(bool decode, int32_t pool_blocks, int32_t max_seqs, int32_t max_prompt_blocks);

/* Copies n whole blocks; the backend's copy_blocks by default. */
typedef fy_status_t (*fy_xstage_copy_fn)(void *arg, const fy_kv_layout_t *lay, void *dst_arena, const void *src_arena,
                                         const int32_t *dst, const int32_t *src, int32_t n, fy_copy_kind_t kind);

typedef struct fy_xstage_params {
    fy_backend_t *be;          /* allocates the pinned staging memory; copies */
    const fy_kv_layout_t *lay; /* the pool's layout (block_bytes); outlives the stage */
    void *pool;                /* the KV pool (the runner's arena) */
    int32_t n_slots;           /* >= 1 */
    fy_xstage_copy_fn copy;    /* NULL: fy_backend_copy_blocks; tests make copies fail with their own */
    void *copy_arg;
} fy_xstage_params_t;

typedef struct fy_xstage fy_xstage_t;

/* Allocates n_slots * block_bytes of host memory (fy_backend_alloc_host;
 * pinned beside a GPU).  Logged errors; *s_p on success only. */
fy_status_t fy_xstage_create(const fy_xstage_params_t *p, fy_xstage_t **s_p);
/* Accepts NULL.  Every slot must be back (a transfer engine registered
 * over the area must be gone): logged as an error otherwise. */
void fy_xstage_destroy(fy_xstage_t *s);
void *fy_xstage_base(fy_xstage_t *s); /* the area to register (fy_xfer_params_t.arena, FY_XFER_MEM_STAGED) */
size_t fy_xstage_bytes(const fy_xstage_t *s);
int32_t fy_xstage_slots(const fy_xstage_t *s);

/* Wake-up when slots come back after a take found too few: wake(arg) on
 * the giving thread, outside the stage's lock.  Set before any take. */
void fy_xstage_set_wake(fy_xstage_t *s, void (*wake)(void *arg), void *arg);

/* Takes up to want free slots into slots[] (all: want or none); returns
 * how many.  Any thread. */
int32_t fy_xstage_take(fy_xstage_t *s, int32_t want, bool all, int32_t *slots);
/* Gives slots back; any thread.  A slot not taken, or given twice, is
 * logged and ignored (a bug, never a double entry in the pool). */
void fy_xstage_give(fy_xstage_t *s, const int32_t *slots, int32_t n);

/* Pool blocks -> staging slots (device-to-host), and staging slots -> pool
 * blocks (host-to-device); the copy's error, logged with what failed. */
fy_status_t fy_xstage_out(fy_xstage_t *s, const int32_t *blocks, const int32_t *slots, int32_t n);
fy_status_t fy_xstage_in(fy_xstage_t *s, const int32_t *slots, const int32_t *blocks, int32_t n);

/* ---- a sender's queue ---------------------------------------------------------------------- */

/* Blocks of one transfer waiting for staging slots, in order (engine thread). */
typedef struct fy_xstage_queue {
    int32_t *src, *dst; /* pool blocks -> destination blocks */
    int32_t head, n, cap;
} fy_xstage_queue_t;

fy_status_t fy_xstage_queue_push(fy_xstage_queue_t *q, const int32_t *src, const int32_t *dst, int32_t n);
static inline int32_t fy_xstage_queue_left(const fy_xstage_queue_t *q) { return q->n - q->head; }
void fy_xstage_queue_clear(fy_xstage_queue_t *q); /* frees; the queue may be pushed to again */

/* Moves what the pool lets from the queue into the job: takes free slots
 * (at most half the pool per batch), copies the blocks into them, and
 * puts them with a release that gives the slots back.  FY_OK with blocks
 * still queued when the pool ran dry (the wake-up says when to call
 * again); else the copy's or the put's error (the slots of that batch
 * are back, the job must be aborted).  *sent_p (may be NULL) adds the
 * blocks handed to the job. */
fy_status_t fy_xstage_pump(fy_xstage_t *s, fy_xstage_queue_t *q, fy_xgroup_job_t *job, int64_t *sent_p);

/* ---- statistics ---------------------------------------------------------------------------- */

typedef struct fy_xstage_stats {
    int32_t slots, free;
    int32_t low;            /* the fewest free slots there have been */
    uint64_t waits;         /* takes that found fewer free slots than they wanted */
    uint64_t exhausted;     /* all-or-none takes refused (decode: reservations) */
    uint64_t copy_failures; /* copies that failed (either way) */
    uint64_t blocks_out;    /* blocks copied pool -> staging */
    uint64_t blocks_in;     /* blocks copied staging -> pool */
} fy_xstage_stats_t;

void fy_xstage_stats(fy_xstage_t *s, fy_xstage_stats_t *out); /* any thread; NULL: zeros */

#endif /* FY_XSTAGE_H */

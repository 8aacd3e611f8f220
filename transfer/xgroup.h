/*
 * xgroup.h - the KV data plane of a worker whose model is served by a
 * rank group (tensor/pipeline parallel, docs/parallel.md): one transfer
 * engine (fy_xfer_t) per rank, over that rank's arena, and transfers that
 * fan out into one fy_xfer job per (source rank, destination rank) pair
 * that share bytes.
 *
 * Every rank's KV arena of a worker's group lies in one shared mapping
 * made before the group forked (fy_engine_build.shared_arenas), so rank 0
 * (the process with the sockets and the scheduler) drives every rank's
 * engine: a decode group publishes one descriptor holding each rank's
 * target blob, and a prefill group puts each rank's slice of each block
 * into the destination rank that holds those layers and heads
 * (reshard.h).  Pairs whose layouts are equal (matched shapes) send whole
 * blocks, runs of consecutive blocks coalesced into one put; others send
 * pieces, one put per piece and block.  A single process is a group of
 * one, whose descriptor is its rank's plain blob, so one-rank workers of
 * earlier versions interoperate unchanged.
 *
 * Why rank 0 drives the followers' arenas instead of each follower running
 * its own engine: the followers' loop is synchronous with rank 0's
 * commands (forward passes, block copies), while transfers run beside
 * them and end on their own; with the arenas in rank 0's address space a
 * transfer needs no command to the ranks and no completion channel back,
 * and one lease, one job, one callback cover all ranks.  This holds for
 * ranks on one host (on a GPU host, the ranks' device memory would be
 * opened through CUDA IPC handles the same way); ranks on several hosts
 * would need an engine per rank and a completion message per pair (as
 * NIXL's per-rank agents do).
 *
 * Not here: which blocks move (the workers), the shard arithmetic
 * (reshard.h), UCX itself (xfer.h).
 */
#ifndef FY_XGROUP_H
#define FY_XGROUP_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "transfer/xfer.h"

#define FY_XGROUP_MAX_RANKS 64

/* ---- the group descriptor ---------------------------------------------------------------------- */

/* A parsed group descriptor: blobs point into the bytes it came from. */
typedef struct fy_xgroup_desc {
    int32_t tp, pp, n; /* n = tp * pp, 2..64 */
    const uint8_t *blob[FY_XGROUP_MAX_RANKS];
    size_t blob_len[FY_XGROUP_MAX_RANKS];
} fy_xgroup_desc_t;

/* Is this a group descriptor (its magic), rather than one rank's plain blob? */
int fy_xgroup_desc_is(const void *buf, size_t len);
/* Builds "FYXG", version, tp, pp, then each rank's blob with its length,
 * into a fresh fy_malloc buffer.  FY_ERR_INVALID for a bad shape or an
 * empty or oversized blob. */
fy_status_t fy_xgroup_desc_build(const fy_xgroup_desc_t *d, uint8_t **buf_p, size_t *len_p);
/* Untrusted bytes: FY_ERR_FORMAT (logged at debug level) unless the magic,
 * version, shape (tp, pp in 1..64, tp * pp in 2..64), every length and the
 * end add up exactly.  The blobs themselves are parsed by the engine that
 * uses them.  *d_p is set on success only. */
fy_status_t fy_xgroup_desc_parse(const void *buf, size_t len, fy_xgroup_desc_t *d_p);

/* ---- the group's engines ------------------------------------------------------------------------- */

typedef struct fy_xgroup_params {
    int32_t tp, pp;          /* this worker's shape (1, 1: one process) */
    fy_xfer_layout_t layout; /* rank 0's layout; the others' are derived (fy_xfer_layout_for_rank) */
    void *arenas;            /* rank r's arena at arenas + r * arena_stride */
    size_t arena_stride;     /* bytes between ranks' arenas (any value for one rank) */
    int32_t n_pages;         /* blocks (pages) in every rank's arena */
    const char *transports;  /* as fy_xfer_params_t */
    const char *net_devices;
    double connect_timeout_s;
    fy_xfer_errmode_t err_mode;
    fy_xfer_mem_t mem; /* what every rank's arena is (xfer.h); a staging area (FY_XFER_MEM_STAGED) only
                        * for one rank: node.c refuses worker.kv_transfer = staged with tp * pp > 1 */
} fy_xgroup_params_t;

typedef struct fy_xgroup fy_xgroup_t;

/* One fy_xfer_t per rank, each over its own arena with its own layout.
 * Logged errors; *g_p set on success only. */
fy_status_t fy_xgroup_create(const fy_xgroup_params_t *p, fy_xgroup_t **g_p);
/* Accepts NULL.  Every unfinished job ends with FY_ERR_CANCELLED first. */
void fy_xgroup_destroy(fy_xgroup_t *g);
int32_t fy_xgroup_n_ranks(const fy_xgroup_t *g);
fy_xfer_t *fy_xgroup_rank(fy_xgroup_t *g, int32_t rank);
const fy_xfer_layout_t *fy_xgroup_layout(const fy_xgroup_t *g, int32_t rank);

/* What a prefill worker needs to put into this group: one rank's plain
 * blob (fy_xfer_target_desc), or the group descriptor.  *blob_p lives as
 * long as g.  g NULL (a worker shutting down): FY_ERR_CANCELLED, as for
 * fy_xgroup_job_begin; stats and health accept NULL too. */
fy_status_t fy_xgroup_target_desc(fy_xgroup_t *g, const void **blob_p, size_t *len_p);

/* ---- jobs -------------------------------------------------------------------------------------- */

typedef struct fy_xgroup_job fy_xgroup_job_t;

/*
 * A transfer into the target that blob describes (a plain blob: one
 * process holding the whole model; a group descriptor: its ranks).  For
 * every local rank and destination rank that share bytes, a fy_xfer job
 * (each connects and runs the layout handshake on its own).  One process
 * to one process is exactly fy_xfer_job_begin.  FY_ERR_FORMAT for a
 * descriptor that does not parse, FY_ERR_MISMATCH (logged with the
 * reason) when the shapes cannot be mapped (reshard.h); no job and no
 * callback then.  cb runs once, when every pair's job has ended, with
 * the first failure ("rank 1 -> 2: ..."), on some transfer thread.
 */
fy_status_t fy_xgroup_job_begin(fy_xgroup_t *g, const void *blob, size_t len, double deadline, fy_xfer_done_fn cb,
                                void *arg, fy_xgroup_job_t **job_p);
/* Queues local blocks src[i] -> destination blocks dst[i] on every pair
 * (whole blocks or pieces); an error fails the job, as fy_xfer_job_put. */
fy_status_t fy_xgroup_job_put(fy_xgroup_job_t *j, const int32_t *src, const int32_t *dst, int32_t n);
/* As fy_xgroup_job_put, then release(arg) once no put of this call on
 * any pair reads its source any more (fy_xfer_job_put_then on each pair;
 * the last pair's release calls it, on its transfer thread, or on the
 * caller's before this returns when every pair had already let go).
 * release runs exactly once whatever this returns: an error from a pair
 * fails the job, and release follows once the pairs that took the call
 * let go (at once, on the caller's thread, when none took it). */
fy_status_t fy_xgroup_job_put_then(fy_xgroup_job_t *j, const int32_t *src, const int32_t *dst, int32_t n,
                                   fy_xfer_release_fn release, void *arg);
/* Bytes one block puts over all pairs (replicated heads counted once). */
uint64_t fy_xgroup_job_block_bytes(const fy_xgroup_job_t *j);
/* As fy_xfer_job_extend, finish and abort, on every pair; the contract of
 * xfer.h holds for the group job as a whole. */
void fy_xgroup_job_extend(fy_xgroup_job_t *j, double deadline);
void fy_xgroup_job_finish(fy_xgroup_job_t *j);
void fy_xgroup_job_abort(fy_xgroup_job_t *j);

/* Summed over the ranks' engines. */
void fy_xgroup_stats(fy_xgroup_t *g, fy_xfer_stats_t *out);
/* fy_xfer_health of every rank's engine: the worst status, the longest wait. */
fy_status_t fy_xgroup_health(fy_xgroup_t *g, double now, double timeout_s, double *waited_p);

#endif /* FY_XGROUP_H */

/*
 * xfer.h - the KV data plane: one-sided UCX puts of KV blocks from this
 * process's arena into a peer's arena.
 *
 * A prefill worker computes KV blocks into its own arena (one contiguous
 * host buffer of n_blocks * block_bytes bytes, block b at
 * [b * block_bytes, (b + 1) * block_bytes)); a decode worker has reserved
 * blocks in its arena for the request and hands out a target descriptor
 * (fy_xfer_target_desc).  The prefill side opens a job on that descriptor,
 * queues (source block, destination block) pairs, and finishes the job:
 * runs of blocks consecutive on both sides go as one ucp_put_nbx, then
 * ucp_ep_flush_nbx (put completion alone does not mean the bytes are at the
 * target), then the job's callback reports success.
 *
 * Both sides of a connection compare their KV layout descriptors field by
 * field before any put is issued; a mismatch refuses the connection and
 * names the field (TensorRT-LLM #6507 shows what a silent layout mismatch
 * does: wrong text, no error).
 *
 * Threading.  Each fy_xfer_t owns one UCX worker (UCS_THREAD_MODE_SINGLE)
 * and one thread that progresses it; every public function only queues
 * work for that thread, so all of them may be called from any thread.  An
 * idle thread sleeps on the worker's event fd, and it also serves as the
 * put target: with TCP, puts land only while the target progresses, and
 * this thread always does.  Callbacks run on that thread and must not
 * block or call fy_xfer_destroy.
 *
 * Not here: which blocks to send (the block manager and the workers'
 * lease protocol), and how the target descriptor travels (control
 * messages).  The descriptor authenticates nothing: whoever can put one in
 * front of fy_xfer_job_begin can make this process write to that address.
 * The control channel has to be trusted for that.
 */
#ifndef FY_XFER_H
#define FY_XFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* ---- the layout descriptor ----------------------------------------------------------------- */

/* The KV layout descriptor both sides exchange and compare at connection
 * time.  It travels serialized (fixed little-endian, versioned), never as
 * this struct. */
typedef struct fy_xfer_layout {
    char model_id[64];  /* NUL-terminated; the caller fills it (model name + a digest) */
    int32_t dtype;      /* fy_dtype_t of K/V elements */
    int32_t block_size; /* tokens per block */
    int32_t n_layers, n_kv_heads, head_dim;
    int32_t order;        /* 1 = block-major [layer][k|v][kv_head][token][head_dim] */
    int32_t scale_format; /* 0 = no quantization scales; other values reserved for fp8/int8 KV */
    uint64_t block_bytes; /* bytes of one block in the arena */
    int32_t n_groups;     /* KV groups (kv.h): block tables per sequence, each block of one group */
    uint32_t groups;      /* digest of which layer is in which group, at which place, with which window
                             (fy_kv_layout_groups_digest); 0 for one group of every layer */
    /* the shard: a rank of a tensor/pipeline-parallel group holds layers
     * [layer0, layer0 + n_layers) and KV heads [kv_head0, kv_head0 +
     * n_kv_heads) of a model of model_layers layers and model_kv_heads KV
     * heads; one process is tp = pp = 1, rank 0, everything */
    int32_t tp, pp, tp_rank, stage;
    int32_t layer0, kv_head0;
    int32_t model_layers, model_kv_heads;
} fy_xfer_layout_t;

/* A layout's shard fields for one process holding the whole model. */
void fy_xfer_layout_whole(fy_xfer_layout_t *l);

#define FY_XFER_ORDER_BLOCK_MAJOR 1

/* NULL when equal, else the name of the first field that differs, in
 * declaration order ("block_size").  model_id compares up to its NUL. */
const char *fy_xfer_layout_diff(const fy_xfer_layout_t *a, const fy_xfer_layout_t *b);

/* ---- the transfer engine --------------------------------------------------------------------- */

/* How endpoints handle a peer's failure (UCX's ucp_err_handling_mode_t).
 * PEER: a target that dies fails its jobs at once (FY_ERR_PEER), and puts
 * stuck past a deadline are cancelled by closing their endpoint by force.
 * UCX 1.13's shared-memory transports (posix, sysv) cannot detect a peer's
 * failure, so under PEER UCX never picks them: two processes on one host
 * talk over TCP loopback, even with transports "sm" (that fails to
 * connect: "no peer failure handler").
 * NONE: UCX may use shared memory (sysv for messages; for the puts,
 * memcpy into an arena fy_xfer allocated, else cma), three to four times
 * faster than TCP loopback on one host; a dead target is noticed only by
 * the handshake timeout and the job deadlines, and healthy peers are
 * closed gracefully.  Both sides of a connection should use the same mode
 * (the initiator's decides the connection's). */
typedef enum fy_xfer_errmode {
    FY_XFER_ERRMODE_PEER = 0, /* the default */
    FY_XFER_ERRMODE_NONE,
} fy_xfer_errmode_t;

/* What the registered arena is and how KV leaves or reaches it (the
 * worker's worker.kv_transfer; worker/xstage.h decides).  It travels in
 * the handshake, so that a pair that cannot work is refused by name
 * (fy_xfer_mem_explain). */
typedef enum fy_xfer_mem {
    FY_XFER_MEM_UNSTATED = 0, /* a peer's handshake from before this field: read as FY_XFER_MEM_HOST */
    FY_XFER_MEM_HOST = 1,     /* direct: the arena is the KV pool, in host memory */
    FY_XFER_MEM_CUDA = 2,     /* direct: the arena is the KV pool, in CUDA device memory; registered with
                               * UCS_MEMORY_TYPE_CUDA, which needs a UCX with CUDA memory support */
    FY_XFER_MEM_STAGED = 3,   /* the arena is a host staging area; the KV pool is elsewhere (device memory),
                               * copied through it by the caller (xstage.h) */
} fy_xfer_mem_t;

/* "direct host", "direct cuda", "staged" ("unstated" for 0). */
const char *fy_xfer_mem_name(fy_xfer_mem_t m);

/* Can this UCX register and move CUDA device memory?  ucp_context_query's
 * memory types (UCP_ATTR_FIELD_MEMORY_TYPES) of a context made with the
 * given transports (as fy_xfer_params_t.transports; NULL: UCX's choice)
 * hold UCS_MEMORY_TYPE_CUDA: it does when UCX was built with CUDA and its
 * cuda_copy (or cuda_ipc, gdr_copy) transports load.  Debian 12's UCX 1.13
 * is built without.  Makes and drops a UCX context (milliseconds). */
bool fy_xfer_ucx_cuda(const char *transports);

/* Do two sides of a connection agree on how KV moves?  here/peer: each
 * side's fy_xfer_mem_t; *_cuda: whether each side's UCX supports CUDA
 * memory.  A side whose arena is CUDA memory moved directly needs the
 * other side's UCX to support CUDA memory too (a put out of or into
 * device memory runs through both UCXs' memory-type handling); everything
 * else (host to host, staged to anything with host memory at both ends)
 * agrees.  The rule is conservative: over InfiniBand with GPUDirect RDMA a
 * UCX without CUDA could still put into a remote GPU's memory; ferry
 * refuses it rather than find out at the first put.  False when they
 * agree; else true, with one line naming both sides into buf
 * ("kv memory mismatch: direct cuda here, the peer's UCX has no CUDA
 * memory support (it is staged); set worker.kv_transfer = staged ..."). */
bool fy_xfer_mem_explain(fy_xfer_mem_t here, bool here_cuda, fy_xfer_mem_t peer, bool peer_cuda, char *buf, size_t cap);

typedef struct fy_xfer_params {
    fy_xfer_layout_t layout;
    void *arena;              /* this process's KV arena (or staging area, FY_XFER_MEM_STAGED); the caller
                               * owns it and keeps it alive until fy_xfer_destroy returns.  NULL: fy_xfer
                               * allocates it through UCX (see fy_xfer_arena), host memory only */
    fy_xfer_mem_t mem;        /* what arena is; 0 reads as FY_XFER_MEM_HOST.  FY_XFER_MEM_CUDA where this UCX
                               * has no CUDA memory support (fy_xfer_ucx_cuda) fails with FY_ERR_UNSUPPORTED */
    size_t arena_bytes;       /* a non-zero multiple of layout.block_bytes */
    const char *transports;   /* NULL: UCX's choice (UCX_TLS from the environment still applies); else the
                               * UCX_TLS list for this context, e.g. "tcp" or "sm,self" */
    const char *net_devices;  /* NULL: UCX's choice (every interface, or UCX_NET_DEVICES from the
                               * environment); else the UCX_NET_DEVICES list, e.g. "lo": the network
                               * devices whose addresses UCX listens on and connects from
                               * (fy_xfer_devices_for derives it from an address) */
    double connect_timeout_s; /* handshake deadline; <= 0 means 5 s */
    fy_xfer_errmode_t err_mode;
} fy_xfer_params_t;

/*
 * The UCX network devices for a process whose control address is url
 * ("tcp://HOST:PORT", "ipc:///path"): the interface that holds HOST's
 * address (a loopback address, or ipc, gives the loopback interface),
 * followed on non-loopback hosts by every RDMA port of the host
 * (/sys/class/infiniband, "mlx5_0:1"), so that binding to an interface
 * never turns RDMA off.  A wildcard host ("*", "0.0.0.0", "::") gives ""
 * (every interface).  FY_ERR_INVALID, logged, when no interface holds the
 * address or the URL has no host; FY_ERR_NO_SPACE when cap is too small.
 * buf is written only on success.
 */
fy_status_t fy_xfer_devices_for(const char *url, char *buf, size_t cap);

typedef struct fy_xfer fy_xfer_t;

/* Creates the UCX context and worker, registers the arena (ucp_mem_map),
 * packs its rkey and starts the progress thread. */
fy_status_t fy_xfer_create(const fy_xfer_params_t *p, fy_xfer_t **x_p);
/* Accepts NULL.  Every unfinished job first ends with
 * cb(arg, FY_ERR_CANCELLED, "transfer engine shut down"), also those whose
 * caller has not yet called finish or abort (it must not call them any
 * more).  Connections that are up are flushed first, for at most 2 s
 * (the target is then done with every put: xfer.c, shutdown_flush, says
 * why it must be), then closed by force (FY_XFER_ERRMODE_PEER) or
 * gracefully, waiting at most 2 s (NONE). */
void fy_xfer_destroy(fy_xfer_t *x);

/* The arena: params.arena, or the one UCX allocated when that was NULL
 * (ucp_mem_map with UCP_MEM_MAP_ALLOCATE; freed by fy_xfer_destroy).  An
 * allocated arena lives in shared memory when a shared-memory transport
 * is enabled, and then a peer on the same host puts into it with memcpy
 * instead of a cross-process copy (cma): a put target (decode worker)
 * should let fy_xfer allocate its KV arena.  Its initial contents are
 * unspecified. */
void *fy_xfer_arena(fy_xfer_t *x);

/* This process as a put target: an opaque, versioned blob (UCX worker
 * address, packed rkey of the arena, arena base address and size,
 * block_bytes, a name for log lines, a checksum).  Valid for the life of x;
 * *blob_p points into x.  The peer parses it as untrusted bytes. */
fy_status_t fy_xfer_target_desc(fy_xfer_t *x, const void **blob_p, size_t *len_p);

/* ---- jobs ------------------------------------------------------------------------------------ */

/* message: NULL on success, else one line saying why (it lives only during the call). */
typedef void (*fy_xfer_done_fn)(void *arg, fy_status_t st, const char *message);
typedef struct fy_xfer_job fy_xfer_job_t;

/* Opens a transfer to one target (a blob from the peer's
 * fy_xfer_target_desc).  deadline: CLOCK_MONOTONIC seconds (absolute, on
 * fy_now_s's clock: common/clock.h); past it no new put is issued and the
 * job fails with FY_ERR_TIMEOUT.  The first job to a target connects and
 * runs the layout handshake (bounded by connect_timeout_s as well); later
 * jobs reuse the connection.  A blob that does not parse gives FY_ERR_FORMAT and no job
 * (cb is never called then). */
fy_status_t fy_xfer_job_begin(fy_xfer_t *x, const void *target_blob, size_t len, double deadline, fy_xfer_done_fn cb,
                              void *arg, fy_xfer_job_t **job_p);
/* Queues puts: local block src[i] -> remote block dst[i], i < n.  Runs
 * consecutive in both are coalesced into one put (within one call).  Block
 * ids are range-checked against both arenas: an id out of range returns
 * FY_ERR_INVALID, queues nothing of this call, and also fails the job with
 * FY_ERR_INVALID (a transfer with a hole in it must not report success).
 * FY_ERR_NOMEM likewise fails the job. */
fy_status_t fy_xfer_job_put(fy_xfer_job_t *j, const int32_t *src, const int32_t *dst, int32_t n);
/* A piece of a block (transfer/reshard.h makes them): len bytes at
 * src_off of a local block land at dst_off of a remote block; dst_rank
 * says which rank of the destination group (the caller's job goes to
 * that rank's target). */
typedef struct fy_xfer_piece {
    int32_t dst_rank;
    uint64_t src_off, len;
    uint64_t dst_off;
} fy_xfer_piece_t;

/* Queues puts of one piece of each block: [piece->src_off, + len) of local
 * block src[i] -> [piece->dst_off, + len) of remote block dst[i], i < n,
 * one put each; between ranks of different shapes (the handshake accepts
 * them when reshard.h can map them) the only puts there are.  Checks as
 * fy_xfer_job_put, and the piece within both blocks. */
fy_status_t fy_xfer_job_put_piece(fy_xfer_job_t *j, const int32_t *src, const int32_t *dst, int32_t n,
                                  const fy_xfer_piece_t *piece);

/* Runs once the puts of one fy_xfer_job_put_then call no longer read
 * their source blocks (transfer thread, or the caller's, see below). */
typedef void (*fy_xfer_release_fn)(void *arg);

/* As fy_xfer_job_put (piece NULL) or fy_xfer_job_put_piece, and then
 * release(arg) exactly once, when every put of this call has completed
 * locally (UCX's send completion: the source may be overwritten; not yet
 * remote completion, which the job's flush gives), or was never issued
 * because the job failed, or at the latest before the job's cb runs.
 * Staging buffers go back to their pool this way while the job goes on
 * (xstage.h: a ring smaller than one prompt's blocks).  release runs on
 * the transfer thread, never inside a UCX callback.  One exception to
 * "exactly once": when this returns an error, release is never called
 * (nothing was queued; the caller still owns the source).  Under
 * FY_XFER_ERRMODE_NONE a job whose puts UCX still holds past its grace
 * (xfer.h's contract) releases them when its cb runs: a put to that
 * abandoned peer may still read the source afterwards (what it sends
 * then goes to a peer given up on). */
fy_status_t fy_xfer_job_put_then(fy_xfer_job_t *j, const int32_t *src, const int32_t *dst, int32_t n,
                                 const fy_xfer_piece_t *piece, fy_xfer_release_fn release, void *arg);
/* Moves the job's deadline later (an earlier one is ignored): the target's
 * lease was renewed.  Only between begin and finish/abort (or until cb
 * runs, if that is first), from any thread, one at a time. */
void fy_xfer_job_extend(fy_xfer_job_t *j, double deadline);
/* No more puts: flush, then cb(arg, FY_OK, NULL) once everything is at the target. */
void fy_xfer_job_finish(fy_xfer_job_t *j);
/* Gives up: cb(arg, FY_ERR_CANCELLED, ...) once the puts already issued
 * have completed or failed (unless the job had already failed: then that
 * error). */
void fy_xfer_job_abort(fy_xfer_job_t *j);
/* Contract: the caller calls exactly one of finish/abort per job and must
 * not touch j afterwards; cb runs exactly once per job, on the transfer
 * thread, never before that call (an earlier error is remembered, later
 * puts are ignored, and the error is what cb reports).  After cb returns
 * the job is freed.  When cb has run, no put of the job is in flight any
 * more, so the source blocks may be reused.  A job whose finish/abort has
 * been called gets its cb by its deadline plus a grace of
 * FY_XFER_GRACE_S: puts stuck past that have their connection closed by
 * force.  Under FY_XFER_ERRMODE_NONE UCX cannot cancel (it refuses a
 * forced close), so there the connection is abandoned instead and cb runs
 * while UCX still holds the request (in practice the flush: shared-memory
 * puts copy before they return); the job's memory is kept until UCX lets
 * go or fy_xfer_destroy. */
#define FY_XFER_GRACE_S 1.0

/* ---- statistics ------------------------------------------------------------------------------ */

typedef struct fy_xfer_stats {
    uint64_t jobs_ok, jobs_failed;
    uint64_t puts;            /* ucp_put_nbx calls (after coalescing) */
    uint64_t bytes;           /* bytes put */
    uint64_t layout_refusals; /* handshakes refused for a layout mismatch, as initiator or target */
    uint64_t peers_connected; /* handshakes that succeeded (as initiator) */
    uint64_t peer_failures;   /* connections lost, handshakes timed out, connections closed by force */
    uint64_t mem_refusals;    /* handshakes refused because the sides' memory cannot meet (fy_xfer_mem_explain) */
} fy_xfer_stats_t;

void fy_xfer_stats(fy_xfer_t *x, fy_xfer_stats_t *out); /* any thread */

/* Whether the transfer thread still answers, for a health check called
 * now and then by one thread (a worker's engine tick): each call whose
 * last ping was answered sends a new one (a wake-up of the thread) and
 * returns FY_OK; a ping unanswered for more than timeout_s gives
 * FY_ERR_TIMEOUT, and once fy_xfer_destroy has begun FY_ERR_CANCELLED.
 * *waited_p: how long the unanswered ping has waited (0 when none). */
fy_status_t fy_xfer_health(fy_xfer_t *x, double now, double timeout_s, double *waited_p);

#endif /* FY_XFER_H */

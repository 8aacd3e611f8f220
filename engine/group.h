/*
 * group.h - a rank group: the processes that serve one model together
 * (tensor and pipeline parallel ranks), and the collectives they use.
 *
 * On the CPU the ranks are processes on one host, forked from rank 0
 * before it starts any thread, sharing one anonymous shared-memory
 * segment: a command area rank 0 broadcasts into, one slot per rank for
 * reductions and point-to-point transfers, and a status word per rank.
 * Waits spin briefly, then sleep on a futex in the segment, so ranks that
 * share cores do not burn them.  A GPU backend would fill the same calls
 * with NCCL; nothing above this file knows how the bytes move.
 *
 * Ranks are numbered stage * tp + tp_rank (pipeline stage outer, tensor
 * rank inner).  Every collective is called by every rank it names, in the
 * same order; results are identical bits on every rank (fixed summation
 * order), so ranks that start equal stay equal.
 *
 * Failure: a rank that dies, or calls fy_group_abort, breaks the group:
 * every wait in every other rank returns FY_ERR_PEER (logged once, naming
 * the rank and why), and every later call returns it at once.  Rank 0
 * notices a dead child by its pid (waitpid), children notice a dead rank
 * 0 by their parent changing; a peer that does not arrive within the
 * group's timeout is counted dead too (except in fy_group_wait_cmd, where
 * followers may idle for ever).
 *
 * Not here: what the ranks compute (runner.c splits the model), who
 * schedules (rank 0's engine), transfer between groups (transfer/).
 */
#ifndef FY_GROUP_H
#define FY_GROUP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/status.h"

typedef struct fy_group fy_group_t;

typedef struct fy_group_params {
    int32_t n_ranks;    /* 2..64 */
    size_t slot_bytes;  /* each rank's slot: the largest reduction or transfer */
    size_t cmd_bytes;   /* the command area: the largest broadcast */
    int32_t timeout_ms; /* a peer that does not arrive within this is dead (0: 30000) */
} fy_group_params_t;

/*
 * Creates the segment and forks n_ranks - 1 children.  Returns in every
 * process: *rank_p is 0 in the caller, 1..n_ranks-1 in the children, and
 * *g_p that process's handle.  Call before the process starts threads (a
 * child has only the forking thread).  On failure nothing is forked, or
 * the children already forked are killed and reaped.
 */
fy_status_t fy_group_spawn(const fy_group_params_t *p, fy_group_t **g_p, int32_t *rank_p);

/*
 * Rank 0: asks the others to leave (they see FY_ERR_CANCELLED from
 * fy_group_wait_cmd), waits up to the timeout for them, kills what is
 * left, reaps, unmaps.  Other ranks: unmaps (then _exit).  Accepts NULL.
 */
void fy_group_destroy(fy_group_t *g);

int32_t fy_group_rank(const fy_group_t *g);
int32_t fy_group_size(const fy_group_t *g);
pid_t fy_group_pid(const fy_group_t *g, int32_t rank); /* rank 0's view; 0 elsewhere */

/* Every rank of the group. */
fy_status_t fy_group_barrier(fy_group_t *g);

/*
 * Commands, rank 0 to every other rank: rank 0 posts len bytes; the others
 * wait (without a timeout) and receive a pointer into the command area,
 * valid until their next fy_group_done.  Then every rank (rank 0 too)
 * calls fy_group_done with its own status; rank 0's fy_group_done returns
 * the first failing rank's status (and its rank in *bad_rank_p, -1 if
 * none), the others' return FY_OK or the group's breakage.
 * (group.c: bad_rank_p may be NULL; when the group breaks, rank 0's
 * returns FY_ERR_PEER with the breaking rank in *bad_rank_p.  Rank 0's
 * wait in fy_group_done has the group's timeout: a command that runs
 * longer on a follower counts it as stuck.  Rank 0 posts the next command
 * only after its fy_group_done: FY_ERR_INVALID otherwise.)
 */
fy_status_t fy_group_post_cmd(fy_group_t *g, const void *buf, size_t len);
fy_status_t fy_group_wait_cmd(fy_group_t *g, const void **buf_p, size_t *len_p);
fy_status_t fy_group_done(fy_group_t *g, fy_status_t mine, int32_t *bad_rank_p);

/*
 * Sum of x[0..n) over ranks first..first+count-1 (the caller among them),
 * written back into x on each of them: identical bits on every rank (the
 * sum runs in rank order), n * 4 <= slot_bytes.
 */
fy_status_t fy_group_allreduce_f32(fy_group_t *g, int32_t first, int32_t count, float *x, size_t n);

/*
 * Gather over ranks first..first+count-1 (the caller among them): each
 * holds mine [rows, piece_bytes], row-major, and every one of them gets
 * all [rows, count * piece_bytes] with rank first + k's piece at byte
 * column k * piece_bytes of each row: the pieces' bytes, unchanged, on
 * every rank.  Pieces are of one size, rows * piece_bytes <= slot_bytes;
 * mine and all must not overlap.  rows 1 is the plain all-gather of
 * contiguous pieces; more rows gather column blocks of a matrix (tensor
 * ranks' slices of a batch's activations) without a transpose on either
 * side: each piece is copied once into its rank's slot and once out of it
 * into each rank's rows.
 */
fy_status_t fy_group_allgather(fy_group_t *g, int32_t first, int32_t count, const void *mine, size_t rows,
                               size_t piece_bytes, void *all);

/* Point to point: src sends, dst receives len bytes (len <= slot_bytes);
 * a send returns once dst holds the bytes. */
fy_status_t fy_group_send(fy_group_t *g, int32_t dst, const void *buf, size_t len);
fy_status_t fy_group_recv(fy_group_t *g, int32_t src, void *buf, size_t len);

/* Breaks the group: every rank's waits return FY_ERR_PEER naming this rank
 * and why.
 * (group.c: a rank calls its group from one thread at a time; a follower
 * waiting in any call that rank 0's fy_group_destroy leaves unfinishable
 * gets FY_ERR_CANCELLED, like fy_group_wait_cmd; two ranks that call
 * different collectives, or different sizes, at the same point break the
 * group, the one that sees it returning FY_ERR_MISMATCH.) */
void fy_group_abort(fy_group_t *g, const char *why);
bool fy_group_broken(const fy_group_t *g);
/* For rank 0 between collectives (a worker's tick: a rank can die while
 * the group is idle, and nothing else would look): reaps followers that
 * ended, breaking the group for them, then FY_OK or FY_ERR_PEER with the
 * reason copied into why ("rank 2 (pid 1234) died: killed by signal 9").
 * From the thread that drives the group. */
fy_status_t fy_group_poll(fy_group_t *g, char *why, size_t cap);

#endif /* FY_GROUP_H */

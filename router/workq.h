/*
 * workq.h - the router's parse workers: threads of their own, with a
 * bounded queue, that tokenize and parse what clients send (HTTP bodies,
 * nng generate messages), so that the threads that carry /health, the
 * workers' events and their heartbeats never wait behind a long prompt.
 *
 * Two lanes: quick jobs (small bodies, whose parsing takes milliseconds)
 * and the others.  Every worker takes a quick job first, and one more
 * thread takes quick jobs only, so that a flood of long prompts delays a
 * short one by at most one quick job's time, never by a long one's.  A
 * job that does not fit its lane (its capacity of jobs waiting: deep for
 * the quick lane, where a burst of ordinary requests waits milliseconds,
 * shallow for the other, where each waits for whole prompts) is refused
 * at once (the caller answers 503/overloaded).  The workers run at a lower
 * scheduling priority than the process's other threads (nice + 5), so
 * that on a busy machine a flood of prompts takes the CPU the rest
 * leaves.
 */
#ifndef FY_WORKQ_H
#define FY_WORKQ_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"

typedef struct fy_workq fy_workq_t;

/* Runs a job: run true on a worker thread; false when the queue is being
 * destroyed before the job ran (the job answers its client that the
 * server is stopping and lets go of what it holds). */
typedef void (*fy_workq_fn)(void *arg, bool run);

/* A body of at most this many bytes is a quick job. */
#define FY_WORKQ_QUICK_BYTES (32 * 1024)

/* threads general workers and one quick-only; quick_cap jobs wait in the
 * quick lane at most, cap in the other. */
fy_status_t fy_workq_create(int32_t threads, int32_t quick_cap, int32_t cap, fy_workq_t **q_p);
/* Queues fn(arg, true) in its lane.  FY_ERR_OVERLOADED when capacity jobs
 * already wait there, FY_ERR_CANCELLED once destroy has begun: fn is not
 * called and the caller keeps arg.  Never blocks beyond the queue's own
 * lock. */
fy_status_t fy_workq_push(fy_workq_t *q, bool quick, fy_workq_fn fn, void *arg);
/* Jobs waiting (not yet started), both lanes. */
int32_t fy_workq_waiting(fy_workq_t *q);
/* New jobs refused (FY_ERR_CANCELLED) from now on; the running ones
 * finish; the threads are joined; those still waiting get fn(arg, false)
 * on this thread.  The queue stays valid for fy_workq_push (which
 * refuses) until destroyed.  Accepts NULL; a second call does nothing. */
void fy_workq_stop(fy_workq_t *q);
/* fy_workq_stop, then frees it: no push may come after.  Accepts NULL. */
void fy_workq_destroy(fy_workq_t *q);

#endif /* FY_WORKQ_H */

/*
 * threadpool.h - a fork-join pool for the CPU kernels.
 *
 * fy_threadpool_run() splits [0, n_items) into chunks that the caller and
 * the workers claim from an atomic counter, and returns when all are done.
 * Workers spin briefly between jobs (a decode step issues hundreds of
 * small ops back to back; waking a sleeping thread costs more than most
 * of them) and then sleep on a condition variable.
 *
 * Which thread runs a chunk varies, so a kernel must compute each output
 * element entirely within one item: then results do not depend on the
 * thread count.  One job at a time: run() is called from one thread.
 */
#ifndef FY_THREADPOOL_H
#define FY_THREADPOOL_H

#include <stdint.h>

#include "common/status.h"

typedef struct fy_threadpool fy_threadpool_t;

/* Processes items [begin, end); thread is 0 for the caller, 1.. for workers. */
typedef void (*fy_threadpool_fn)(void *arg, int64_t begin, int64_t end, int thread);

/* n_threads counts the caller: 1 means no worker threads. */
fy_status_t fy_threadpool_create(int n_threads, fy_threadpool_t **tp_p);
void fy_threadpool_destroy(fy_threadpool_t *tp); /* accepts NULL */
/* chunk: items per claim (>= 1). */
void fy_threadpool_run(fy_threadpool_t *tp, int64_t n_items, int64_t chunk, fy_threadpool_fn fn, void *arg);

#endif /* FY_THREADPOOL_H */

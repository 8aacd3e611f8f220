/*
 * threadpool.c - spin-then-sleep fork-join pool.
 *
 * A job is published as one 64-bit word: generation (32 bits), next chunk
 * (16 bits), chunk count (16 bits).  Threads claim chunks by compare-and-
 * swap on that word, so a claim is valid for the job it names or fails:
 * a worker that was descheduled and wakes up late can never claim work of
 * a later job, and the caller never waits for a worker that has not
 * claimed anything.  That matters on a loaded machine, where a busy-wait
 * for every worker to acknowledge every job turns each op into a
 * scheduler time slice.  The caller waits only for chunks claimed but not
 * finished (done counter), yielding the CPU if that takes long.
 */
#include "kernels/cpu/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "common/log.h"
#include "common/mem.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

#define SPIN_ROUNDS 4000 /* pauses before an idle worker sleeps (tens of microseconds) */
#define WAIT_ROUNDS 256  /* pauses before the caller yields while chunks finish */
#define MAX_CHUNKS 0xffff

#define CLAIM(gen, next, n) (((uint64_t)(gen) << 32) | ((uint64_t)(next) << 16) | (uint64_t)(n))
#define CLAIM_GEN(c) ((uint32_t)((c) >> 32))
#define CLAIM_NEXT(c) ((uint32_t)(((c) >> 16) & 0xffff))
#define CLAIM_N(c) ((uint32_t)((c)&0xffff))

typedef struct worker {
    struct fy_threadpool *tp;
    int index;
    pthread_t thread;
} worker_t;

struct fy_threadpool {
    int n_threads;
    worker_t *workers; /* [n_threads - 1] */
    int n_started;

    /* the current job: written before its claim word is published and not
     * changed until all its chunks are done */
    fy_threadpool_fn fn;
    void *arg;
    int64_t n_items, chunk;

    _Atomic uint64_t claim;
    _Atomic uint32_t done; /* chunks finished in the current job */
    uint32_t gen;          /* caller only */

    _Atomic int sleepers;
    _Atomic bool stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

/* Claims and runs chunks of the job whose generation is gen, until none
 * is left. */
static void work(fy_threadpool_t *tp, uint32_t gen, int thread)
{
    uint64_t c = atomic_load_explicit(&tp->claim, memory_order_acquire);
    for (;;) {
        if (CLAIM_GEN(c) != gen || CLAIM_NEXT(c) >= CLAIM_N(c)) return;
        if (!atomic_compare_exchange_weak_explicit(&tp->claim, &c, c + (1u << 16), memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        /* the job is pinned until this chunk is counted done */
        int64_t b = (int64_t)CLAIM_NEXT(c) * tp->chunk;
        int64_t e = b + tp->chunk < tp->n_items ? b + tp->chunk : tp->n_items;
        tp->fn(tp->arg, b, e, thread);
        atomic_fetch_add_explicit(&tp->done, 1, memory_order_release);
        c = atomic_load_explicit(&tp->claim, memory_order_acquire);
    }
}

static void *worker_main(void *p)
{
    worker_t *w = p;
    fy_threadpool_t *tp = w->tp;
    uint32_t seen = 0;
    for (;;) {
        int spins = 0;
        uint64_t c;
        while (CLAIM_GEN(c = atomic_load_explicit(&tp->claim, memory_order_acquire)) == seen) {
            if (atomic_load(&tp->stop)) return NULL;
            if (++spins < SPIN_ROUNDS) {
                cpu_relax();
                continue;
            }
            /* seq_cst on sleepers and claim: either the caller sees this
             * sleeper after publishing, or this thread sees the new job */
            pthread_mutex_lock(&tp->mu);
            atomic_fetch_add(&tp->sleepers, 1);
            while (CLAIM_GEN(atomic_load(&tp->claim)) == seen && !atomic_load(&tp->stop))
                pthread_cond_wait(&tp->cv, &tp->mu);
            atomic_fetch_sub(&tp->sleepers, 1);
            pthread_mutex_unlock(&tp->mu);
            spins = 0;
        }
        seen = CLAIM_GEN(c);
        work(tp, seen, w->index);
    }
}

fy_status_t fy_threadpool_create(int n_threads, fy_threadpool_t **tp_p)
{
    if (n_threads < 1 || n_threads > 1024) {
        fy_error("threadpool: %d threads requested (1 to 1024)", n_threads);
        return FY_ERR_INVALID;
    }
    fy_threadpool_t *tp = fy_calloc(1, sizeof(*tp));
    if (!tp) goto nomem;
    tp->n_threads = n_threads;
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->cv, NULL);
    if (n_threads > 1) {
        tp->workers = fy_calloc((size_t)n_threads - 1, sizeof(*tp->workers));
        if (!tp->workers) goto nomem;
    }
    for (int i = 0; i < n_threads - 1; i++) {
        worker_t *w = &tp->workers[i];
        w->tp = tp;
        w->index = i + 1;
        int rc = pthread_create(&w->thread, NULL, worker_main, w);
        if (rc != 0) {
            fy_error("threadpool: cannot start thread %d: error %d", i + 1, rc);
            fy_threadpool_destroy(tp);
            return FY_ERR_INTERNAL;
        }
        tp->n_started++;
    }
    *tp_p = tp;
    return FY_OK;
nomem:
    fy_threadpool_destroy(tp);
    fy_error("threadpool: out of memory");
    return FY_ERR_NOMEM;
}

void fy_threadpool_destroy(fy_threadpool_t *tp)
{
    if (!tp) return;
    pthread_mutex_lock(&tp->mu);
    atomic_store(&tp->stop, true);
    pthread_cond_broadcast(&tp->cv);
    pthread_mutex_unlock(&tp->mu);
    for (int i = 0; i < tp->n_started; i++) pthread_join(tp->workers[i].thread, NULL);
    pthread_cond_destroy(&tp->cv);
    pthread_mutex_destroy(&tp->mu);
    fy_free(tp->workers);
    fy_free(tp);
}

void fy_threadpool_run(fy_threadpool_t *tp, int64_t n_items, int64_t chunk, fy_threadpool_fn fn, void *arg)
{
    if (n_items <= 0) return;
    if (chunk < 1) chunk = 1;
    if (tp->n_threads == 1 || n_items <= chunk) {
        fn(arg, 0, n_items, 0);
        return;
    }
    int64_t n_chunks = (n_items + chunk - 1) / chunk;
    if (n_chunks > MAX_CHUNKS) {
        chunk = (n_items + MAX_CHUNKS - 1) / MAX_CHUNKS;
        n_chunks = (n_items + chunk - 1) / chunk;
    }
    tp->fn = fn;
    tp->arg = arg;
    tp->n_items = n_items;
    tp->chunk = chunk;
    atomic_store_explicit(&tp->done, 0, memory_order_relaxed);
    tp->gen++;
    if (tp->gen == 0) tp->gen = 1; /* workers start having seen generation 0 */
    atomic_store(&tp->claim, CLAIM(tp->gen, 0, n_chunks));
    if (atomic_load(&tp->sleepers) > 0) {
        pthread_mutex_lock(&tp->mu);
        pthread_cond_broadcast(&tp->cv);
        pthread_mutex_unlock(&tp->mu);
    }
    work(tp, tp->gen, 0);
    int spins = 0;
    while (atomic_load_explicit(&tp->done, memory_order_acquire) < (uint32_t)n_chunks) {
        if (++spins < WAIT_ROUNDS) {
            cpu_relax();
        } else {
            sched_yield(); /* a worker holding a chunk may need this core */
            spins = 0;
        }
    }
}

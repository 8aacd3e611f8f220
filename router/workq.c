/*
 * workq.c - a fixed set of threads over two bounded rings of jobs
 * (workq.h): general workers take the quick lane first, one thread takes
 * only it.
 */
#include "router/workq.h"

#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/log.h"
#include "common/mem.h"

#define NICE_STEP 5 /* below the process's other threads: /health and events first */

typedef struct job {
    fy_workq_fn fn;
    void *arg;
} job_t;

typedef struct lane {
    job_t *ring;
    int32_t cap, head, n;
} lane_t;

struct fy_workq {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    lane_t lane[2]; /* [0] quick, [1] the others */
    bool stop, joined;
    pthread_t *th;
    int32_t n_th;
};

static bool lane_pop(fy_workq_t *q, int i, job_t *j)
{
    lane_t *l = &q->lane[i];
    if (!l->n) return false;
    *j = l->ring[l->head];
    l->head = (l->head + 1) % l->cap;
    l->n--;
    return true;
}

static void *worker(fy_workq_t *q, bool quick_only)
{
    /* per thread on Linux: only this one runs nicer */
    id_t tid = (id_t)syscall(SYS_gettid);
    if (setpriority(PRIO_PROCESS, tid, getpriority(PRIO_PROCESS, tid) + NICE_STEP) != 0)
        fy_debug("workq: cannot lower a parse worker's priority; it runs at the process's");
    pthread_mutex_lock(&q->mu);
    for (;;) {
        job_t j;
        if (q->stop) break;
        if (lane_pop(q, 0, &j) || (!quick_only && lane_pop(q, 1, &j))) {
            pthread_mutex_unlock(&q->mu);
            j.fn(j.arg, true);
            pthread_mutex_lock(&q->mu);
            continue;
        }
        pthread_cond_wait(&q->cv, &q->mu);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

static void *general_main(void *arg) { return worker(arg, false); }
static void *quick_main(void *arg) { return worker(arg, true); }

fy_status_t fy_workq_create(int32_t threads, int32_t quick_cap, int32_t cap, fy_workq_t **q_p)
{
    *q_p = NULL;
    if (threads < 1 || quick_cap < 1 || cap < 1) return FY_ERR_INVALID;
    fy_workq_t *q = fy_calloc(1, sizeof(*q));
    if (!q) return FY_ERR_NOMEM;
    q->lane[0].ring = fy_calloc((size_t)quick_cap, sizeof(job_t));
    q->lane[1].ring = fy_calloc((size_t)cap, sizeof(job_t));
    q->lane[0].cap = quick_cap;
    q->lane[1].cap = cap;
    q->th = fy_calloc((size_t)threads + 1, sizeof(pthread_t));
    if (!q->lane[0].ring || !q->lane[1].ring || !q->th) {
        fy_free(q->lane[0].ring);
        fy_free(q->lane[1].ring);
        fy_free(q->th);
        fy_free(q);
        return FY_ERR_NOMEM;
    }
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    for (; q->n_th < threads + 1; q->n_th++)
        if (pthread_create(&q->th[q->n_th], NULL, q->n_th < threads ? general_main : quick_main, q)) {
            fy_error("workq: cannot start parse worker %d of %d", q->n_th + 1, threads + 1);
            fy_workq_destroy(q);
            return FY_ERR_INTERNAL;
        }
    *q_p = q;
    return FY_OK;
}

fy_status_t fy_workq_push(fy_workq_t *q, bool quick, fy_workq_fn fn, void *arg)
{
    fy_status_t st = FY_OK;
    lane_t *l = &q->lane[quick ? 0 : 1];
    pthread_mutex_lock(&q->mu);
    if (q->stop) {
        st = FY_ERR_CANCELLED;
    } else if (l->n >= l->cap) {
        st = FY_ERR_OVERLOADED;
    } else {
        l->ring[(l->head + l->n) % l->cap] = (job_t){fn, arg};
        l->n++;
        /* every waiter: a quick-only thread cannot take a general job */
        pthread_cond_broadcast(&q->cv);
    }
    pthread_mutex_unlock(&q->mu);
    return st;
}

int32_t fy_workq_waiting(fy_workq_t *q)
{
    pthread_mutex_lock(&q->mu);
    int32_t n = q->lane[0].n + q->lane[1].n;
    pthread_mutex_unlock(&q->mu);
    return n;
}

void fy_workq_stop(fy_workq_t *q)
{
    if (!q) return;
    pthread_mutex_lock(&q->mu);
    bool joined = q->joined;
    q->stop = q->joined = true;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    if (joined) return;
    for (int32_t i = 0; i < q->n_th; i++) pthread_join(q->th[i], NULL);
    /* no thread left: what still waits is told so */
    for (;;) {
        job_t j;
        pthread_mutex_lock(&q->mu);
        bool got = lane_pop(q, 0, &j) || lane_pop(q, 1, &j);
        pthread_mutex_unlock(&q->mu);
        if (!got) break;
        j.fn(j.arg, false);
    }
}

void fy_workq_destroy(fy_workq_t *q)
{
    if (!q) return;
    fy_workq_stop(q);
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
    fy_free(q->lane[0].ring);
    fy_free(q->lane[1].ring);
    fy_free(q->th);
    fy_free(q);
}

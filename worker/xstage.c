/* xstage.c - KV through pinned host staging slots (xstage.h). */
#include "worker/xstage.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "common/mem.h"

fy_status_t fy_xstage_choose(const char *asked, bool device_memory, bool ucx_cuda, fy_xfer_mem_t *mem_p, char *why,
                             size_t cap)
{
    const char *a = asked && *asked ? asked : "auto";
    const char *pool = device_memory ? "device memory" : "host memory";
    const char *ucx = ucx_cuda ? "UCX has CUDA memory support" : "UCX has no CUDA memory support";
    if (!strcmp(a, "staged")) {
        *mem_p = FY_XFER_MEM_STAGED;
        snprintf(why, cap, "worker.kv_transfer = staged: the kv pool (%s) moves through pinned host staging", pool);
        return FY_OK;
    }
    if (!strcmp(a, "direct")) {
        if (device_memory && !ucx_cuda) {
            snprintf(why, cap,
                     "worker.kv_transfer = direct: the kv pool is device memory and this UCX has no CUDA memory "
                     "support (no cuda_copy/cuda_ipc transports); use staged or auto");
            return FY_ERR_UNSUPPORTED;
        }
        *mem_p = device_memory ? FY_XFER_MEM_CUDA : FY_XFER_MEM_HOST;
        snprintf(why, cap, "worker.kv_transfer = direct: UCX moves the kv pool (%s) itself", pool);
        return FY_OK;
    }
    if (!strcmp(a, "auto")) {
        *mem_p = !device_memory ? FY_XFER_MEM_HOST : ucx_cuda ? FY_XFER_MEM_CUDA : FY_XFER_MEM_STAGED;
        snprintf(why, cap, "worker.kv_transfer = auto: the kv pool is %s%s%s: %s", pool, device_memory ? " and " : "",
                 device_memory ? ucx : "", fy_xfer_mem_name(*mem_p));
        return FY_OK;
    }
    snprintf(why, cap, "worker.kv_transfer: '%.32s' is not auto, direct or staged", a);
    return FY_ERR_INVALID;
}

int32_t fy_xstage_default_slots(bool decode, int32_t pool_blocks, int32_t max_seqs, int32_t max_prompt_blocks)
{
    int64_t n = 64;
    if (decode) { /* max_seqs whole-context prompts, at most 4096 blocks, but always one */
        int64_t one = max_prompt_blocks > 0 ? max_prompt_blocks : 1;
        n = (int64_t)(max_seqs > 0 ? max_seqs : 1) * one;
        if (n > 4096) n = 4096 > one ? 4096 : one;
    }
    if (n > pool_blocks) n = pool_blocks;
    return n < 1 ? 1 : (int32_t)n;
}

struct fy_xstage {
    fy_backend_t *be;
    const fy_kv_layout_t *lay;
    void *pool;
    uint8_t *area;
    int32_t n_slots;
    fy_xstage_copy_fn copy;
    void *copy_arg;
    void (*wake)(void *arg);
    void *wake_arg;
    pthread_mutex_t mu; /* the free list, taken flags and stats below */
    int32_t *free_list;
    int32_t n_free;
    uint8_t *taken;
    bool hungry; /* a take found too few since the last wake-up */
    fy_xstage_stats_t st;
};

static fy_status_t backend_copy(void *arg, const fy_kv_layout_t *lay, void *dst_arena, const void *src_arena,
                                const int32_t *dst, const int32_t *src, int32_t n, fy_copy_kind_t kind)
{
    return fy_backend_copy_blocks(arg, lay, dst_arena, src_arena, dst, src, n, kind);
}

fy_status_t fy_xstage_create(const fy_xstage_params_t *p, fy_xstage_t **s_p)
{
    size_t bytes;
    if (!p || !p->be || !p->lay || !p->pool || p->n_slots < 1 || p->lay->block_bytes == 0 ||
        !fy_mul_size((size_t)p->n_slots, p->lay->block_bytes, &bytes)) {
        fy_error("xstage: a staging area needs a backend, a kv layout, the pool and at least one slot (%d)",
                 p ? p->n_slots : 0);
        return FY_ERR_INVALID;
    }
    fy_xstage_t *s = fy_calloc(1, sizeof(*s));
    if (!s) return FY_ERR_NOMEM;
    s->be = p->be;
    s->lay = p->lay;
    s->pool = p->pool;
    s->n_slots = p->n_slots;
    s->copy = p->copy ? p->copy : backend_copy;
    s->copy_arg = p->copy ? p->copy_arg : p->be;
    pthread_mutex_init(&s->mu, NULL);
    s->free_list = fy_malloc((size_t)p->n_slots * sizeof(int32_t));
    s->taken = fy_calloc((size_t)p->n_slots, 1);
    fy_status_t st = s->free_list && s->taken ? fy_backend_alloc_host(p->be, bytes, (void **)&s->area) : FY_ERR_NOMEM;
    if (st != FY_OK) {
        fy_error("xstage: cannot allocate %d staging blocks (%zu bytes of pinned host memory): %s", p->n_slots, bytes,
                 fy_status_str(st));
        s->area = NULL;
        fy_xstage_destroy(s);
        return st;
    }
    for (int32_t i = 0; i < p->n_slots; i++) s->free_list[i] = p->n_slots - 1 - i; /* slot 0 first */
    s->n_free = p->n_slots;
    s->st.slots = s->st.free = s->st.low = p->n_slots;
    *s_p = s;
    return FY_OK;
}

void fy_xstage_destroy(fy_xstage_t *s)
{
    if (!s) return;
    if (s->free_list && s->n_free != s->n_slots)
        fy_error("xstage: %d of %d staging blocks still taken at shutdown", s->n_slots - s->n_free, s->n_slots);
    if (s->area) fy_backend_free_host(s->be, s->area);
    pthread_mutex_destroy(&s->mu);
    fy_free(s->free_list);
    fy_free(s->taken);
    fy_free(s);
}

void *fy_xstage_base(fy_xstage_t *s) { return s->area; }
size_t fy_xstage_bytes(const fy_xstage_t *s) { return (size_t)s->n_slots * s->lay->block_bytes; }
int32_t fy_xstage_slots(const fy_xstage_t *s) { return s->n_slots; }

void fy_xstage_set_wake(fy_xstage_t *s, void (*wake)(void *arg), void *arg)
{
    s->wake = wake;
    s->wake_arg = arg;
}

int32_t fy_xstage_take(fy_xstage_t *s, int32_t want, bool all, int32_t *slots)
{
    if (want <= 0) return 0;
    pthread_mutex_lock(&s->mu);
    int32_t got = 0;
    if (s->n_free < want) {
        s->st.waits++;
        if (all) s->st.exhausted++;
        s->hungry = true;
    }
    if (!all || s->n_free >= want) {
        got = want < s->n_free ? want : s->n_free;
        for (int32_t i = 0; i < got; i++) {
            int32_t k = s->free_list[--s->n_free];
            s->taken[k] = 1;
            slots[i] = k;
        }
    }
    s->st.free = s->n_free;
    if (s->n_free < s->st.low) s->st.low = s->n_free;
    pthread_mutex_unlock(&s->mu);
    return got;
}

void fy_xstage_give(fy_xstage_t *s, const int32_t *slots, int32_t n)
{
    if (n <= 0) return;
    pthread_mutex_lock(&s->mu);
    for (int32_t i = 0; i < n; i++) {
        int32_t k = slots[i];
        if (k < 0 || k >= s->n_slots || !s->taken[k]) {
            fy_error("xstage: staging block %d given back but not taken (of %d)", k, s->n_slots);
            continue;
        }
        s->taken[k] = 0;
        s->free_list[s->n_free++] = k;
    }
    s->st.free = s->n_free;
    bool wake = s->hungry && s->wake;
    s->hungry = false;
    pthread_mutex_unlock(&s->mu);
    if (wake) s->wake(s->wake_arg);
}

static fy_status_t copy_checked(fy_xstage_t *s, bool out, const int32_t *blocks, const int32_t *slots, int32_t n)
{
    for (int32_t i = 0; i < n; i++)
        if (slots[i] < 0 || slots[i] >= s->n_slots || blocks[i] < 0) {
            fy_error("xstage: copying block %d %s staging block %d of %d", blocks[i], out ? "into" : "from", slots[i],
                     s->n_slots);
            return FY_ERR_INVALID;
        }
    fy_status_t st = out ? s->copy(s->copy_arg, s->lay, s->area, s->pool, slots, blocks, n, FY_COPY_D2H)
                         : s->copy(s->copy_arg, s->lay, s->pool, s->area, blocks, slots, n, FY_COPY_H2D);
    pthread_mutex_lock(&s->mu);
    if (st != FY_OK)
        s->st.copy_failures++;
    else if (out)
        s->st.blocks_out += (uint64_t)n;
    else
        s->st.blocks_in += (uint64_t)n;
    pthread_mutex_unlock(&s->mu);
    if (st != FY_OK)
        fy_error("xstage: copying %d kv blocks %s staging failed: %s", n, out ? "into" : "out of", fy_status_str(st));
    return st;
}

fy_status_t fy_xstage_out(fy_xstage_t *s, const int32_t *blocks, const int32_t *slots, int32_t n)
{
    return copy_checked(s, true, blocks, slots, n);
}

fy_status_t fy_xstage_in(fy_xstage_t *s, const int32_t *slots, const int32_t *blocks, int32_t n)
{
    return copy_checked(s, false, blocks, slots, n);
}

/* ---- a sender's queue ---------------------------------------------------------------------- */

fy_status_t fy_xstage_queue_push(fy_xstage_queue_t *q, const int32_t *src, const int32_t *dst, int32_t n)
{
    if (n <= 0) return FY_OK;
    if (q->head > 0 && q->head == q->n) q->head = q->n = 0; /* drained: start over */
    if (q->n + n > q->cap) {
        int32_t cap = q->cap ? q->cap : 64;
        while (cap < q->n + n) cap *= 2;
        int32_t *ns = fy_realloc(q->src, (size_t)cap * sizeof(int32_t));
        if (!ns) return FY_ERR_NOMEM;
        q->src = ns;
        int32_t *nd = fy_realloc(q->dst, (size_t)cap * sizeof(int32_t));
        if (!nd) return FY_ERR_NOMEM;
        q->dst = nd;
        q->cap = cap;
    }
    memcpy(q->src + q->n, src, (size_t)n * sizeof(int32_t));
    memcpy(q->dst + q->n, dst, (size_t)n * sizeof(int32_t));
    q->n += n;
    return FY_OK;
}

void fy_xstage_queue_clear(fy_xstage_queue_t *q)
{
    fy_free(q->src);
    fy_free(q->dst);
    *q = (fy_xstage_queue_t){0};
}

/* A batch's slots, given back when its puts let go of them. */
typedef struct batch {
    fy_xstage_t *s;
    int32_t n;
    int32_t slots[];
} batch_t;

static void batch_release(void *arg)
{
    batch_t *b = arg;
    fy_xstage_give(b->s, b->slots, b->n);
    fy_free(b);
}

fy_status_t fy_xstage_pump(fy_xstage_t *s, fy_xstage_queue_t *q, fy_xgroup_job_t *job, int64_t *sent_p)
{
    int32_t per = s->n_slots > 1 ? s->n_slots / 2 : 1; /* one batch on the wire while the next is copied */
    while (fy_xstage_queue_left(q) > 0) {
        int32_t want = fy_xstage_queue_left(q) < per ? fy_xstage_queue_left(q) : per;
        batch_t *b = fy_malloc(sizeof(*b) + (size_t)want * sizeof(int32_t));
        if (!b) return FY_ERR_NOMEM;
        b->s = s;
        b->n = fy_xstage_take(s, want, false, b->slots);
        if (b->n == 0) { /* the wake-up calls again */
            fy_free(b);
            return FY_OK;
        }
        fy_status_t st = fy_xstage_out(s, q->src + q->head, b->slots, b->n);
        if (st != FY_OK) {
            batch_release(b);
            return st;
        }
        int32_t n = b->n; /* b may be gone once put_then returns */
        if ((st = fy_xgroup_job_put_then(job, b->slots, q->dst + q->head, n, batch_release, b)) != FY_OK)
            return st; /* its release gives the slots back */
        q->head += n;
        if (sent_p) *sent_p += n;
    }
    return FY_OK;
}

void fy_xstage_stats(fy_xstage_t *s, fy_xstage_stats_t *out)
{
    if (!s) {
        *out = (fy_xstage_stats_t){0};
        return;
    }
    pthread_mutex_lock(&s->mu);
    *out = s->st;
    pthread_mutex_unlock(&s->mu);
}

/*
 * test_xstage.c - KV staged through host staging slots (worker/xstage.h):
 * which path worker.kv_transfer picks for each pool and UCX; the slot pool
 * (all or none, partial takes, wake-ups, a slot given twice); a transfer
 * of many more blocks than the ring holds, through a real UCX pair, whose
 * bytes arrive exactly and whose slots all come back; a copy that fails;
 * a target that dies mid-transfer.  On the CPU backend, whose "device"
 * memory is host memory: the copies are its memcpy.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "common/clock.h"
#include "common/mem.h"
#include "tests/testutil.h"
#include "transfer/xfer.h"
#include "transfer/xgroup.h"
#include "worker/xstage.h"

#define BB 256u   /* bytes of a block */
#define N_POOL 64 /* the sender's pool blocks */
#define N_DST 80  /* the receiver's arena blocks */
#define N_SLOTS 3 /* the sender's staging slots: far fewer than a transfer's blocks */
#define N_MOVE 40

/* ---- which path ---------------------------------------------------------------------------- */

static void test_choose(void **state)
{
    const struct {
        const char *asked;
        bool dev, cuda;
        fy_status_t st;
        fy_xfer_mem_t mem;
    } cases[] = {
        {"auto", false, false, FY_OK, FY_XFER_MEM_HOST},
        {"auto", false, true, FY_OK, FY_XFER_MEM_HOST},
        {"auto", true, false, FY_OK, FY_XFER_MEM_STAGED},
        {"auto", true, true, FY_OK, FY_XFER_MEM_CUDA},
        {NULL, true, false, FY_OK, FY_XFER_MEM_STAGED},
        {"direct", false, false, FY_OK, FY_XFER_MEM_HOST},
        {"direct", true, true, FY_OK, FY_XFER_MEM_CUDA},
        {"direct", true, false, FY_ERR_UNSUPPORTED, 0},
        {"staged", false, false, FY_OK, FY_XFER_MEM_STAGED},
        {"staged", true, true, FY_OK, FY_XFER_MEM_STAGED},
        {"gpu", false, false, FY_ERR_INVALID, 0},
    };
    for (size_t k = 0; k < FY_ARRAY_LEN(cases); k++) {
        fy_xfer_mem_t mem = (fy_xfer_mem_t)99;
        char why[256] = "";
        fy_status_t st = fy_xstage_choose(cases[k].asked, cases[k].dev, cases[k].cuda, &mem, why, sizeof(why));
        if (st != cases[k].st || (st == FY_OK && mem != cases[k].mem))
            fail_msg("case %zu (%s, device %d, cuda %d): %s, %s: %s", k, cases[k].asked ? cases[k].asked : "NULL",
                     cases[k].dev, cases[k].cuda, fy_status_str(st), fy_xfer_mem_name(mem), why);
        assert_non_null(strstr(why, "worker.kv_transfer")); /* every answer names the key */
    }
    char why[256];
    fy_xfer_mem_t mem;
    assert_int_equal(fy_xstage_choose("direct", true, false, &mem, why, sizeof(why)), FY_ERR_UNSUPPORTED);
    assert_non_null(strstr(why, "no CUDA memory support"));
    /* defaults: a ring for a sender, whole prompts for a receiver; never past the pool */
    assert_int_equal(fy_xstage_default_slots(false, 1000, 8, 100), 64);
    assert_int_equal(fy_xstage_default_slots(false, 10, 8, 100), 10);
    assert_int_equal(fy_xstage_default_slots(true, 100000, 8, 100), 800);
    assert_int_equal(fy_xstage_default_slots(true, 100000, 64, 512), 4096);
    assert_int_equal(fy_xstage_default_slots(true, 300, 8, 100), 300);
    assert_int_equal(fy_xstage_default_slots(true, 100000, 64, 8192), 8192); /* one long-context prompt always fits */
}

/* ---- the slot pool ------------------------------------------------------------------------- */

typedef struct wake {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n;
} wake_t;

static void on_wake(void *arg)
{
    wake_t *w = arg;
    pthread_mutex_lock(&w->mu);
    w->n++;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Waits until the wake count passes seen (or 5 s); the count then. */
static int wake_wait(wake_t *w, int seen)
{
    struct timespec ts;
    fy_deadline_in(CLOCK_REALTIME, 5, &ts);
    pthread_mutex_lock(&w->mu);
    while (w->n <= seen)
        if (pthread_cond_timedwait(&w->cv, &w->mu, &ts)) break;
    int n = w->n;
    pthread_mutex_unlock(&w->mu);
    return n;
}

static fy_kv_layout_t g_lay = {.block_bytes = BB};

static fy_xstage_t *stage_open(fy_backend_t *be, void *pool, int32_t slots, fy_xstage_copy_fn copy, void *arg)
{
    fy_xstage_params_t p = {.be = be, .lay = &g_lay, .pool = pool, .n_slots = slots, .copy = copy, .copy_arg = arg};
    fy_xstage_t *s = NULL;
    assert_int_equal(fy_xstage_create(&p, &s), FY_OK);
    return s;
}

static void test_pool(void **state)
{
    fy_backend_t *be;
    assert_int_equal(fy_backend_create("cpu", NULL, &be), FY_OK);
    assert_false(fy_backend_device_memory(be)); /* the CPU backend's "device" memory is host memory */
    uint8_t *pool = fy_calloc(N_POOL, BB);
    fy_xstage_params_t bad = {.be = be, .lay = &g_lay, .pool = pool, .n_slots = 0};
    fy_xstage_t *s = NULL;
    fy_test_log_begin();
    assert_int_equal(fy_xstage_create(&bad, &s), FY_ERR_INVALID);
    fy_test_log_end();
    s = stage_open(be, pool, 4, NULL, NULL);
    assert_int_equal(fy_xstage_slots(s), 4);
    assert_int_equal(fy_xstage_bytes(s), 4 * BB);
    wake_t w = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    fy_xstage_set_wake(s, on_wake, &w);
    int32_t a[8], b[8];
    assert_int_equal(fy_xstage_take(s, 5, true, a), 0); /* all or none: none */
    assert_int_equal(fy_xstage_take(s, 3, true, a), 3);
    assert_int_equal(fy_xstage_take(s, 3, false, b), 1); /* what is left */
    fy_xstage_stats_t st;
    fy_xstage_stats(s, &st);
    assert_int_equal(st.free, 0);
    assert_int_equal(st.low, 0);
    assert_int_equal(st.exhausted, 1);
    assert_int_equal(st.waits, 2);
    /* every slot a different one */
    int32_t all[4] = {a[0], a[1], a[2], b[0]};
    for (int i = 0; i < 4; i++)
        for (int k = i + 1; k < 4; k++) assert_int_not_equal(all[i], all[k]);
    assert_int_equal(w.n, 0);
    fy_xstage_give(s, a, 2); /* a take went hungry: wake */
    assert_int_equal(w.n, 1);
    fy_xstage_give(s, a + 2, 1); /* nobody hungry since: no wake */
    assert_int_equal(w.n, 1);
    fy_test_log_begin();
    fy_xstage_give(s, a, 1); /* given twice: logged and ignored */
    int32_t junk = 99;
    fy_xstage_give(s, &junk, 1);
    assert_true(fy_test_log_has("given back but not taken", NULL));
    fy_test_log_end();
    fy_xstage_give(s, b, 1);
    fy_xstage_stats(s, &st);
    assert_int_equal(st.free, 4);
    /* copies both ways, block for block */
    for (int i = 0; i < N_POOL * (int)BB; i++) pool[i] = (uint8_t)(i * 7 + 3);
    int32_t blocks[2] = {9, 2}, slots[2] = {3, 0}, back[2] = {40, 41};
    assert_int_equal(fy_xstage_out(s, blocks, slots, 2), FY_OK);
    assert_memory_equal((uint8_t *)fy_xstage_base(s) + 3 * BB, pool + 9 * BB, BB);
    assert_memory_equal((uint8_t *)fy_xstage_base(s), pool + 2 * BB, BB);
    assert_int_equal(fy_xstage_in(s, slots, back, 2), FY_OK);
    assert_memory_equal(pool + 40 * BB, pool + 9 * BB, BB);
    assert_memory_equal(pool + 41 * BB, pool + 2 * BB, BB);
    fy_test_log_begin();
    int32_t out_of_range = 4;
    assert_int_equal(fy_xstage_out(s, blocks, &out_of_range, 1), FY_ERR_INVALID);
    fy_test_log_end();
    fy_xstage_stats(s, &st);
    assert_int_equal(st.blocks_out, 2);
    assert_int_equal(st.blocks_in, 2);
    fy_xstage_destroy(s);
    fy_free(pool);
    fy_backend_destroy(be);
}

/* ---- through UCX ----------------------------------------------------------------------------- */

/* a log capture safe for the transfer threads (testutil's is not) */
static pthread_mutex_t g_log_lock = PTHREAD_MUTEX_INITIALIZER;
static char g_log[16384];
static size_t g_log_len;

static void log_sink(fy_log_level_t level, const char *line, void *arg)
{
    pthread_mutex_lock(&g_log_lock);
    size_t n = strlen(line);
    if (g_log_len + n + 2 < sizeof(g_log)) {
        memcpy(g_log + g_log_len, line, n);
        g_log_len += n;
        g_log[g_log_len++] = '\n';
        g_log[g_log_len] = '\0';
    }
    pthread_mutex_unlock(&g_log_lock);
}

static void log_begin(void)
{
    pthread_mutex_lock(&g_log_lock);
    g_log_len = 0;
    g_log[0] = '\0';
    pthread_mutex_unlock(&g_log_lock);
    fy_log_set_sink(log_sink, NULL);
}

static void log_end(void) { fy_log_set_sink(NULL, NULL); }

static bool log_has(const char *s)
{
    pthread_mutex_lock(&g_log_lock);
    bool r = strstr(g_log, s) != NULL;
    pthread_mutex_unlock(&g_log_lock);
    return r;
}

typedef struct done {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int calls;
    fy_status_t st;
    char msg[256];
    fy_xstage_t *stage;
    int32_t free_at_cb; /* the staging area's free slots when cb ran */
} done_t;

static void on_done(void *arg, fy_status_t st, const char *message)
{
    done_t *d = arg;
    fy_xstage_stats_t ss;
    fy_xstage_stats(d->stage, &ss);
    pthread_mutex_lock(&d->mu);
    d->calls++;
    d->st = st;
    d->free_at_cb = ss.free;
    snprintf(d->msg, sizeof(d->msg), "%s", message ? message : "");
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
}

static fy_status_t done_wait(done_t *d, double timeout_s)
{
    struct timespec ts;
    fy_deadline_in(CLOCK_REALTIME, timeout_s, &ts);
    pthread_mutex_lock(&d->mu);
    while (d->calls == 0)
        if (pthread_cond_timedwait(&d->cv, &d->mu, &ts)) break;
    int calls = d->calls;
    fy_status_t st = d->st;
    pthread_mutex_unlock(&d->mu);
    if (calls == 0) fail_msg("the job's callback did not run");
    return st;
}

static fy_xgroup_t *engine_open(void *arena, int32_t blocks, fy_xfer_mem_t mem)
{
    fy_xgroup_params_t p = {.tp = 1,
                            .pp = 1,
                            .arenas = arena,
                            .n_pages = blocks,
                            .transports = "tcp",
                            .net_devices = "lo",
                            .connect_timeout_s = 5,
                            .mem = mem};
    snprintf(p.layout.model_id, sizeof(p.layout.model_id), "xstage-test");
    p.layout.block_size = 4;
    p.layout.n_layers = 2;
    p.layout.n_kv_heads = 1;
    p.layout.head_dim = 8;
    p.layout.order = FY_XFER_ORDER_BLOCK_MAJOR;
    p.layout.block_bytes = BB;
    p.layout.n_groups = 1;
    fy_xfer_layout_whole(&p.layout);
    fy_xgroup_t *g = NULL;
    assert_int_equal(fy_xgroup_create(&p, &g), FY_OK);
    return g;
}

/* A copy that works n times, then fails. */
typedef struct flaky {
    fy_backend_t *be;
    int ok_left;
} flaky_t;

static fy_status_t flaky_copy(void *arg, const fy_kv_layout_t *lay, void *dst_arena, const void *src_arena,
                              const int32_t *dst, const int32_t *src, int32_t n, fy_copy_kind_t kind)
{
    flaky_t *f = arg;
    if (f->ok_left-- <= 0) return FY_ERR_IO;
    return fy_backend_copy_blocks(f->be, lay, dst_arena, src_arena, dst, src, n, kind);
}

typedef enum { RUN_OK, RUN_COPY_FAILS, RUN_TARGET_DIES } run_kind_t;

/* N_MOVE blocks through N_SLOTS staging slots into a receiver: as the
 * prefill worker pumps (pump, wait for a wake-up, pump again). */
static void run_transfer(run_kind_t kind)
{
    fy_backend_t *be;
    assert_int_equal(fy_backend_create("cpu", NULL, &be), FY_OK);
    uint8_t *pool = fy_malloc(N_POOL * BB), *dst = fy_calloc(N_DST, BB);
    uint64_t seed = 0x57a9e;
    for (size_t i = 0; i < N_POOL * BB; i++) pool[i] = (uint8_t)fy_test_rand_u64(&seed);
    flaky_t fl = {.be = be, .ok_left = 3};
    fy_xstage_t *s = stage_open(be, pool, N_SLOTS, kind == RUN_COPY_FAILS ? flaky_copy : NULL, &fl);
    wake_t w = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    fy_xstage_set_wake(s, on_wake, &w);
    fy_xgroup_t *tx = engine_open(fy_xstage_base(s), N_SLOTS, FY_XFER_MEM_STAGED);
    fy_xgroup_t *rx = engine_open(dst, N_DST, FY_XFER_MEM_HOST);
    const void *blob;
    size_t len;
    assert_int_equal(fy_xgroup_target_desc(rx, &blob, &len), FY_OK);
    uint8_t *copy = fy_malloc(len); /* the receiver may go before the job is done with its blob */
    memcpy(copy, blob, len);
    done_t d = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .stage = s};
    fy_xgroup_job_t *j;
    assert_int_equal(fy_xgroup_job_begin(tx, copy, len, fy_now_s() + 30, on_done, &d, &j), FY_OK);
    int32_t src[N_MOVE], to[N_MOVE];
    for (int32_t i = 0; i < N_MOVE; i++) {
        src[i] = (i * 7) % N_POOL; /* scattered on both sides */
        to[i] = (i * 13 + 5) % N_DST;
    }
    fy_xstage_queue_t q = {0};
    assert_int_equal(fy_xstage_queue_push(&q, src, to, N_MOVE / 2), FY_OK);
    assert_int_equal(fy_xstage_queue_push(&q, src + N_MOVE / 2, to + N_MOVE / 2, N_MOVE - N_MOVE / 2), FY_OK);
    int64_t sent = 0;
    int seen = 0, rounds = 0;
    fy_status_t st = FY_OK;
    if (kind == RUN_COPY_FAILS) log_begin();
    while (fy_xstage_queue_left(&q) > 0 && rounds++ < 1000) {
        if ((st = fy_xstage_pump(s, &q, j, &sent)) != FY_OK) break;
        if (kind == RUN_TARGET_DIES && rx && sent >= 8) { /* some have gone, most have not */
            fy_xgroup_destroy(rx);
            rx = NULL;
        }
        if (fy_xstage_queue_left(&q) > 0) seen = wake_wait(&w, seen);
    }
    if (kind == RUN_COPY_FAILS) {
        log_end();
        assert_true(log_has("copying 1 kv blocks into staging failed"));
        assert_int_equal(st, FY_ERR_IO);
        fy_xstage_stats_t ss;
        fy_xstage_stats(s, &ss);
        assert_int_equal(ss.copy_failures, 1);
        fy_xgroup_job_abort(j); /* what the prefill worker does (ship_fail) */
        assert_int_equal(done_wait(&d, 10), FY_ERR_CANCELLED);
    } else {
        assert_int_equal(st, FY_OK);
        assert_int_equal(fy_xstage_queue_left(&q), 0);
        assert_int_equal(sent, N_MOVE);
        fy_xgroup_job_finish(j);
        fy_status_t js = done_wait(&d, 20);
        if (kind == RUN_OK) {
            assert_int_equal(js, FY_OK);
            for (int32_t i = 0; i < N_MOVE; i++)
                if (memcmp(dst + (size_t)to[i] * BB, pool + (size_t)src[i] * BB, BB))
                    fail_msg("block %d -> %d did not arrive as it was", src[i], to[i]);
            fy_xstage_stats_t ss;
            fy_xstage_stats(s, &ss);
            assert_int_equal(ss.blocks_out, N_MOVE);
            assert_true(ss.waits > 0); /* the ring ran dry and was woken */
            print_message("%d blocks through %d staging slots: %d wake-ups, %d pumps\n", N_MOVE, N_SLOTS, seen, rounds);
        } else {
            print_message("target died mid-transfer: %s (%s)\n", d.msg, fy_status_str(js));
            assert_int_not_equal(js, FY_OK);
        }
    }
    /* whatever the end, every slot was back before the job's callback */
    assert_int_equal(d.free_at_cb, N_SLOTS);
    fy_xstage_queue_clear(&q);
    /* the receiver first: puts of an aborted job may still be on their way
     * to it, and UCX's put handler aborts the process when the sender's
     * endpoint is gone before it could answer (Endpoint timeout) */
    fy_xgroup_destroy(rx);
    fy_xgroup_destroy(tx);
    fy_xstage_destroy(s);
    fy_free(copy);
    fy_free(pool);
    fy_free(dst);
    fy_backend_destroy(be);
}

static void test_through_ucx(void **state) { run_transfer(RUN_OK); }
static void test_copy_fails(void **state) { run_transfer(RUN_COPY_FAILS); }
static void test_target_dies(void **state) { run_transfer(RUN_TARGET_DIES); }

/* A CUDA arena needs a UCX with CUDA memory: refused at creation where it
 * has none (Debian's 1.13), naming the way out. */
static void test_cuda_arena_refused(void **state)
{
    if (fy_xfer_ucx_cuda("tcp")) {
        print_message("skipped: this UCX has CUDA memory support\n");
        skip();
    }
    static uint8_t arena[4 * BB];
    fy_xfer_params_t p = {.arena = arena, .arena_bytes = sizeof(arena), .transports = "tcp", .mem = FY_XFER_MEM_CUDA};
    snprintf(p.layout.model_id, sizeof(p.layout.model_id), "xstage-test");
    p.layout.block_size = 4, p.layout.n_layers = 2, p.layout.n_kv_heads = 1, p.layout.head_dim = 8;
    p.layout.order = FY_XFER_ORDER_BLOCK_MAJOR, p.layout.block_bytes = BB, p.layout.n_groups = 1;
    fy_xfer_layout_whole(&p.layout);
    fy_xfer_t *x = NULL;
    fy_test_log_begin();
    assert_int_equal(fy_xfer_create(&p, &x), FY_ERR_UNSUPPORTED);
    assert_true(fy_test_log_has("worker.kv_transfer = staged", NULL));
    fy_test_log_end();
    assert_null(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_choose),      cmocka_unit_test(test_pool),
        cmocka_unit_test(test_through_ucx), cmocka_unit_test(test_copy_fails),
        cmocka_unit_test(test_target_dies), cmocka_unit_test(test_cuda_arena_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_xfer.c - the UCX KV transfer: two fy_xfer_t in one process (each
 * with its own UCX context, worker and thread) play prefill and decode.
 * Bytes arrive exactly where asked and nowhere else, runs coalesce, over
 * TCP and over UCX's default (shared memory); layout mismatches are
 * refused by name; hostile descriptors are refused without a crash; dead
 * targets, deadlines, aborts and bad block ids end jobs with the right
 * status; every callback runs exactly once.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#include "common/clock.h"
#include "kv/kvplan.h"
#include "common/mem.h"
#include "transfer/reshard.h"
#include "tests/testutil.h"
#include "transfer/xfer.h"
#include "transfer/xgroup.h"
#include "transfer/xfer_wire.h"

#define SEED 0x5eedf00dull

/* ---- a log capture safe for the transfer threads (testutil's is not) ------------------------ */

static pthread_mutex_t g_log_lock = PTHREAD_MUTEX_INITIALIZER;
static char g_log[32768];
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
    if (getenv("FERRY_TEST_VERBOSE")) fprintf(stderr, "[captured] %s\n", line);
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

/* ---- completions ---------------------------------------------------------------------------- */

typedef struct done {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int calls;
    fy_status_t st;
    char msg[256];
} done_t;

static void done_init(done_t *d)
{
    pthread_mutex_init(&d->lock, NULL);
    pthread_cond_init(&d->cond, NULL);
    d->calls = 0;
    d->st = FY_OK;
    d->msg[0] = '\0';
}

static void done_fini(done_t *d)
{
    pthread_mutex_destroy(&d->lock);
    pthread_cond_destroy(&d->cond);
}

static void on_done(void *arg, fy_status_t st, const char *message)
{
    done_t *d = arg;
    pthread_mutex_lock(&d->lock);
    d->calls++;
    d->st = st;
    snprintf(d->msg, sizeof(d->msg), "%s", message ? message : "");
    if (st != FY_OK && !message) snprintf(d->msg, sizeof(d->msg), "(error without a message)");
    pthread_cond_broadcast(&d->cond);
    pthread_mutex_unlock(&d->lock);
}

/* Waits for the callback (no sleeping: a condition variable with a deadline). */
static fy_status_t done_wait(done_t *d, double timeout_s)
{
    struct timespec ts;
    fy_deadline_in(CLOCK_REALTIME, timeout_s, &ts);
    pthread_mutex_lock(&d->lock);
    while (d->calls == 0)
        if (pthread_cond_timedwait(&d->cond, &d->lock, &ts)) break;
    int calls = d->calls;
    fy_status_t st = d->st;
    pthread_mutex_unlock(&d->lock);
    if (calls == 0) fail_msg("callback not called within %.1f s", timeout_s);
    return st;
}

static int done_calls(done_t *d)
{
    pthread_mutex_lock(&d->lock);
    int c = d->calls;
    pthread_mutex_unlock(&d->lock);
    return c;
}

/* ---- engines ------------------------------------------------------------------------------- */

typedef struct side {
    uint8_t *arena;
    bool own; /* arena from fy_aligned_alloc; else fy_xfer allocated it */
    size_t bytes;
    int32_t n_blocks;
    uint64_t block_bytes;
    fy_xfer_t *x;
} side_t;

static fy_xfer_layout_t small_layout(int32_t block_size)
{
    fy_xfer_layout_t l = {.dtype = 1,
                          .block_size = block_size,
                          .n_layers = 2,
                          .n_kv_heads = 2,
                          .head_dim = 16,
                          .order = FY_XFER_ORDER_BLOCK_MAJOR};
    snprintf(l.model_id, sizeof(l.model_id), "tiny-test-model/0123abcd");
    l.block_bytes = (uint64_t)2 * l.n_layers * l.n_kv_heads * (uint64_t)block_size * l.head_dim * 2;
    fy_xfer_layout_whole(&l);
    return l;
}

/* tls "sm" means shared memory, which UCX 1.13 offers only without peer
 * failure detection (see fy_xfer_errmode_t).  ucx_arena: fy_xfer
 * allocates the arena (shared memory under "sm": puts are memcpy). */
static void side_open_as(side_t *s, const fy_xfer_layout_t *l, int32_t n_blocks, const char *tls, uint8_t fill,
                         bool ucx_arena)
{
    memset(s, 0, sizeof(*s));
    s->n_blocks = n_blocks;
    s->block_bytes = l->block_bytes;
    s->bytes = (size_t)n_blocks * l->block_bytes;
    s->own = !ucx_arena;
    if (s->own) {
        s->arena = fy_aligned_alloc(4096, s->bytes);
        assert_non_null(s->arena);
    }
    fy_xfer_params_t p = {
        .layout = *l, .arena = s->arena, .arena_bytes = s->bytes, .transports = tls, .connect_timeout_s = 5};
    if (tls && !strcmp(tls, "sm")) p.err_mode = FY_XFER_ERRMODE_NONE;
    fy_status_t st = fy_xfer_create(&p, &s->x);
    if (st != FY_OK) fail_msg("fy_xfer_create(%s): %s", tls ? tls : "default", fy_status_str(st));
    s->arena = fy_xfer_arena(s->x);
    if (!s->own) assert_true(((uintptr_t)s->arena & 63) == 0);
    memset(s->arena, fill, s->bytes);
}

static void side_open(side_t *s, const fy_xfer_layout_t *l, int32_t n_blocks, const char *tls, uint8_t fill)
{
    side_open_as(s, l, n_blocks, tls, fill, false);
}

static void side_close(side_t *s)
{
    fy_xfer_destroy(s->x);
    if (s->own) fy_free(s->arena);
    s->x = NULL;
    s->arena = NULL;
}

static void fill_random(side_t *s, uint64_t *rng)
{
    for (size_t i = 0; i + 8 <= s->bytes; i += 8) {
        uint64_t v = fy_test_rand_u64(rng);
        memcpy(s->arena + i, &v, 8);
    }
}

static uint8_t *block(side_t *s, int32_t b) { return s->arena + (size_t)b * s->block_bytes; }

/* Runs one job: src[i] -> dst[i], in `calls` put calls; returns its status. */
static fy_status_t run_job(side_t *from, side_t *to, const int32_t *src, const int32_t *dst, int32_t n, int calls)
{
    const void *blob;
    size_t len;
    assert_int_equal(fy_xfer_target_desc(to->x, &blob, &len), FY_OK);
    done_t d;
    done_init(&d);
    fy_xfer_job_t *j;
    assert_int_equal(fy_xfer_job_begin(from->x, blob, len, fy_now_s() + 20, on_done, &d, &j), FY_OK);
    int32_t per = (n + calls - 1) / calls;
    for (int32_t i = 0; i < n; i += per)
        assert_int_equal(fy_xfer_job_put(j, src + i, dst + i, FY_MIN(per, n - i)), FY_OK);
    fy_xfer_job_finish(j);
    fy_status_t st = done_wait(&d, 30);
    if (st != FY_OK) fprintf(stderr, "job failed: %s: %s\n", fy_status_str(st), d.msg);
    assert_int_equal(done_calls(&d), 1);
    done_fini(&d);
    return st;
}

/* Checks dst blocks hold exactly the source blocks, and every other
 * destination block still holds the fill byte. */
static void verify(side_t *from, side_t *to, const int32_t *src, const int32_t *dst, int32_t n, uint8_t fill)
{
    bool *hit = calloc((size_t)to->n_blocks, 1);
    for (int32_t i = 0; i < n; i++) {
        hit[dst[i]] = true;
        if (memcmp(block(from, src[i]), block(to, dst[i]), from->block_bytes))
            fail_msg("block %d -> %d: bytes differ", src[i], dst[i]);
    }
    for (int32_t b = 0; b < to->n_blocks; b++) {
        if (hit[b]) continue;
        for (size_t k = 0; k < to->block_bytes; k++)
            if (block(to, b)[k] != fill) fail_msg("untargeted block %d was written (byte %zu)", b, k);
    }
    free(hit);
}

static int32_t count_runs(const int32_t *src, const int32_t *dst, int32_t n)
{
    int32_t r = 0;
    for (int32_t i = 0; i < n; i++)
        if (i == 0 || src[i] != src[i - 1] + 1 || dst[i] != dst[i - 1] + 1) r++;
    return r;
}

/* ---- transfers ----------------------------------------------------------------------------- */

static void transfer_over(const char *tls, bool ucx_arena)
{
    uint64_t rng = SEED;
    fy_xfer_layout_t l = small_layout(16);
    side_t pf, dc;
    side_open(&pf, &l, 64, tls, 0);
    side_open_as(&dc, &l, 96, tls, 0xA5, ucx_arena);
    fill_random(&pf, &rng);

    /* scattered: 20 blocks to a random choice of destination blocks */
    int32_t perm[96];
    for (int32_t i = 0; i < 96; i++) perm[i] = i;
    for (int32_t i = 95; i > 0; i--) {
        int32_t k = (int32_t)(fy_test_rand_u64(&rng) % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[k];
        perm[k] = t;
    }
    int32_t src[64], dst[64];
    for (int32_t i = 0; i < 20; i++) src[i] = (int32_t)(fy_test_rand_u64(&rng) % 64), dst[i] = perm[i];
    fy_xfer_stats_t s0, s1;
    fy_xfer_stats(pf.x, &s0);
    assert_int_equal(run_job(&pf, &dc, src, dst, 20, 3), FY_OK);
    fy_xfer_stats(pf.x, &s1);
    verify(&pf, &dc, src, dst, 20, 0xA5);
    assert_int_equal(s1.jobs_ok - s0.jobs_ok, 1);
    assert_int_equal(s1.bytes - s0.bytes, 20 * l.block_bytes);

    /* consecutive runs, as a decode pool hands them out: 4, 1, 16, 3 blocks */
    memset(dc.arena, 0xA5, dc.bytes);
    int32_t n = 0;
    const int32_t runs[][3] = {{0, 10, 4}, {4, 20, 1}, {5, 40, 16}, {21, 90, 3}};
    for (size_t r = 0; r < FY_ARRAY_LEN(runs); r++)
        for (int32_t k = 0; k < runs[r][2]; k++) src[n] = runs[r][0] + k, dst[n] = runs[r][1] + k, n++;
    fy_xfer_stats(pf.x, &s0);
    assert_int_equal(run_job(&pf, &dc, src, dst, n, 1), FY_OK);
    fy_xfer_stats(pf.x, &s1);
    verify(&pf, &dc, src, dst, n, 0xA5);
    assert_int_equal(s1.puts - s0.puts, count_runs(src, dst, n));
    assert_true(s1.puts - s0.puts < (uint64_t)n);

    /* the whole arena in one put */
    memset(dc.arena, 0xA5, dc.bytes);
    for (int32_t i = 0; i < 64; i++) src[i] = i, dst[i] = 32 + i;
    fy_xfer_stats(pf.x, &s0);
    assert_int_equal(run_job(&pf, &dc, src, dst, 64, 1), FY_OK);
    fy_xfer_stats(pf.x, &s1);
    verify(&pf, &dc, src, dst, 64, 0xA5);
    assert_int_equal(s1.puts - s0.puts, 1);

    /* four jobs at once, to disjoint destinations, put from another thread's view: interleaved */
    memset(dc.arena, 0xA5, dc.bytes);
    const void *blob;
    size_t len;
    assert_int_equal(fy_xfer_target_desc(dc.x, &blob, &len), FY_OK);
    done_t d[4];
    fy_xfer_job_t *j[4];
    for (int k = 0; k < 4; k++) {
        done_init(&d[k]);
        assert_int_equal(fy_xfer_job_begin(pf.x, blob, len, fy_now_s() + 20, on_done, &d[k], &j[k]), FY_OK);
    }
    int32_t all_src[64], all_dst[64];
    for (int32_t i = 0; i < 64; i++) {
        int k = i % 4;
        all_src[i] = i;
        all_dst[i] = 95 - i;
        assert_int_equal(fy_xfer_job_put(j[k], &all_src[i], &all_dst[i], 1), FY_OK);
    }
    for (int k = 0; k < 4; k++) fy_xfer_job_finish(j[k]);
    for (int k = 0; k < 4; k++) {
        assert_int_equal(done_wait(&d[k], 30), FY_OK);
        assert_int_equal(done_calls(&d[k]), 1);
        done_fini(&d[k]);
    }
    verify(&pf, &dc, all_src, all_dst, 64, 0xA5);

    /* one connection served every job; nothing was refused or lost */
    fy_xfer_stats(pf.x, &s1);
    assert_int_equal(s1.peers_connected, 1);
    assert_int_equal(s1.jobs_failed, 0);
    assert_int_equal(s1.peer_failures, 0);
    assert_int_equal(s1.layout_refusals, 0);

    /* and the other way round: the decode side can be an initiator too */
    for (int32_t i = 0; i < 8; i++) src[i] = 88 + i, dst[i] = i;
    memset(pf.arena, 0, 8 * l.block_bytes);
    assert_int_equal(run_job(&dc, &pf, src, dst, 8, 2), FY_OK);
    for (int32_t i = 0; i < 8; i++) assert_memory_equal(block(&pf, i), block(&dc, 88 + i), l.block_bytes);

    side_close(&pf);
    side_close(&dc);
}

static void test_transfer_default(void **state) { transfer_over(NULL, false); }
static void test_transfer_tcp(void **state) { transfer_over("tcp", false); }
static void test_transfer_shm(void **state) { transfer_over("sm", false); }
static void test_transfer_tcp_ucx_arena(void **state) { transfer_over("tcp", true); }
static void test_transfer_shm_ucx_arena(void **state) { transfer_over("sm", true); }

/* ---- layout mismatch ------------------------------------------------------------------------- */

static void test_layout_mismatch(void **state)
{
    fy_xfer_layout_t l16 = small_layout(16), l32 = small_layout(32);
    side_t pf, dc;
    side_open(&pf, &l16, 8, "tcp", 0x11);
    side_open(&dc, &l32, 8, "tcp", 0xA5);
    log_begin();
    const void *blob;
    size_t len;
    assert_int_equal(fy_xfer_target_desc(dc.x, &blob, &len), FY_OK);
    for (int round = 0; round < 2; round++) {
        done_t d;
        done_init(&d);
        fy_xfer_job_t *j;
        assert_int_equal(fy_xfer_job_begin(pf.x, blob, len, fy_now_s() + 10, on_done, &d, &j), FY_OK);
        int32_t src[4] = {0, 1, 2, 3}, dst[4] = {0, 1, 2, 3};
        assert_int_equal(fy_xfer_job_put(j, src, dst, 4), FY_OK);
        fy_xfer_job_finish(j);
        assert_int_equal(done_wait(&d, 10), FY_ERR_MISMATCH);
        if (!strstr(d.msg, "block_size is 16 here, 32 at the peer")) fail_msg("message: %s", d.msg);
        assert_int_equal(done_calls(&d), 1);
        done_fini(&d);
    }
    log_end();
    assert_true(log_has("block_size is 32 here, 16 at the peer")); /* the target's one line */
    fy_xfer_stats_t s;
    fy_xfer_stats(pf.x, &s);
    assert_int_equal(s.layout_refusals, 1); /* the second job failed on the remembered refusal */
    assert_int_equal(s.puts, 0);
    assert_int_equal(s.jobs_failed, 2);
    fy_xfer_stats(dc.x, &s);
    assert_int_equal(s.layout_refusals, 1);
    for (size_t i = 0; i < dc.bytes; i++)
        if (dc.arena[i] != 0xA5) fail_msg("byte %zu of the refusing target was written", i);
    side_close(&pf);
    side_close(&dc);

    /* a different model id is named too */
    fy_xfer_layout_t other = small_layout(16);
    snprintf(other.model_id, sizeof(other.model_id), "another-model/ffff");
    side_open(&pf, &l16, 4, NULL, 0x11);
    side_open(&dc, &other, 4, NULL, 0xA5);
    log_begin();
    int32_t a = 0;
    fy_status_t st = run_job(&pf, &dc, &a, &a, 1, 1);
    log_end();
    assert_int_equal(st, FY_ERR_MISMATCH);
    assert_true(log_has("model_id"));
    assert_int_equal(dc.arena[0], 0xA5);
    side_close(&pf);
    side_close(&dc);
}

static void test_layout_diff(void **state)
{
    fy_xfer_layout_t a = small_layout(16), b = a;
    assert_null(fy_xfer_layout_diff(&a, &b));
    /* bytes after the NUL do not count */
    b.model_id[sizeof(b.model_id) - 1] = 'x';
    b.model_id[sizeof(b.model_id) - 1] = '\0';
    assert_null(fy_xfer_layout_diff(&a, &b));
    b = a, b.dtype = 0;
    assert_string_equal(fy_xfer_layout_diff(&a, &b), "dtype");
    b = a, b.block_size = 32;
    assert_string_equal(fy_xfer_layout_diff(&a, &b), "block_size");
    b = a, b.n_layers = 3;
    assert_string_equal(fy_xfer_layout_diff(&a, &b), "n_layers");
    b = a, b.n_kv_heads = 1;
    assert_string_equal(fy_xfer_layout_diff(&a, &b), "n_kv_heads");
    b = a, b.head_dim = 8;
    assert_string_equal(fy_xfer_layout_diff(&a, &b), "head_dim");
    b = a, b.order = 2;
    assert_string_equal(fy_xfer_layout_diff(&a, &b), "order");
    b = a, b.scale_format = 1;
    assert_string_equal(fy_xfer_layout_diff(&a, &b), "scale_format");
    b = a, b.block_bytes++;
    assert_string_equal(fy_xfer_layout_diff(&a, &b), "block_bytes");
    b = a, b.model_id[0] = 'T';
    assert_string_equal(fy_xfer_layout_diff(&a, &b), "model_id");
    /* two fields differ: the first in declaration order is named */
    b = a, b.head_dim = 8, b.block_size = 8;
    assert_string_equal(fy_xfer_layout_diff(&a, &b), "block_size");

    /* the wire form round-trips and is little-endian */
    uint8_t w[FY_XFER_LAYOUT_WIRE_LEN];
    a.block_bytes = 0x0102030405060708ull;
    fy_xfer_layout_pack(&a, w);
    fy_xfer_layout_t c;
    fy_xfer_layout_unpack(w, &c);
    assert_null(fy_xfer_layout_diff(&a, &c));
    assert_int_equal(w[64 + 28], 0x08);
    assert_int_equal(w[64 + 4], 16); /* block_size */

    /* handshake messages: right lengths only */
    fy_xfer_hello_t h = {.cookie = 7, .name = "me", .layout = a}, h2;
    uint8_t hw[FY_XFER_HELLO_LEN];
    fy_xfer_hello_pack(&h, hw);
    log_begin();
    assert_int_equal(fy_xfer_hello_unpack(hw, sizeof(hw), &h2), FY_OK);
    assert_int_equal(h2.cookie, 7);
    for (size_t n = 0; n < sizeof(hw); n++) assert_int_not_equal(fy_xfer_hello_unpack(hw, n, &h2), FY_OK);
    hw[0] = 9;
    assert_int_equal(fy_xfer_hello_unpack(hw, sizeof(hw), &h2), FY_ERR_MISMATCH);
    fy_xfer_reply_t r = {.cookie = 9, .ok = false, .layout = a, .message = "no"}, r2;
    uint8_t rw[FY_XFER_REPLY_LEN];
    fy_xfer_reply_pack(&r, rw);
    assert_int_equal(fy_xfer_reply_unpack(rw, sizeof(rw), &r2), FY_OK);
    assert_false(r2.ok);
    assert_string_equal(r2.message, "no");
    for (size_t n = 0; n < sizeof(rw); n++) assert_int_not_equal(fy_xfer_reply_unpack(rw, n, &r2), FY_OK);
    assert_int_not_equal(fy_xfer_reply_unpack(hw, sizeof(hw), &r2), FY_OK); /* a hello is not a reply */
    memset(rw + 16 + FY_XFER_LAYOUT_WIRE_LEN, 'x', FY_XFER_MSG_LEN);        /* unterminated message */
    assert_int_equal(fy_xfer_reply_unpack(rw, sizeof(rw), &r2), FY_ERR_FORMAT);

    /* how each side's KV moves: carried both ways; a peer from before the
     * field (zero bytes) reads as unstated, no CUDA; values past the enum
     * or unknown flags are malformed */
    fy_xfer_hello_t hm = {.cookie = 3, .name = "st", .layout = a, .mem = FY_XFER_MEM_STAGED, .ucx_cuda = true};
    fy_xfer_hello_pack(&hm, hw);
    assert_int_equal(fy_xfer_hello_unpack(hw, sizeof(hw), &h2), FY_OK);
    assert_int_equal(h2.mem, FY_XFER_MEM_STAGED);
    assert_true(h2.ucx_cuda);
    hw[2] = hw[3] = 0; /* what version 3 sent */
    assert_int_equal(fy_xfer_hello_unpack(hw, sizeof(hw), &h2), FY_OK);
    assert_int_equal(h2.mem, FY_XFER_MEM_UNSTATED);
    assert_false(h2.ucx_cuda);
    hw[2] = 4;
    assert_int_equal(fy_xfer_hello_unpack(hw, sizeof(hw), &h2), FY_ERR_FORMAT);
    hw[2] = 1, hw[3] = 2;
    assert_int_equal(fy_xfer_hello_unpack(hw, sizeof(hw), &h2), FY_ERR_FORMAT);
    fy_xfer_reply_t rm = {.cookie = 4, .ok = true, .layout = a, .mem = FY_XFER_MEM_CUDA, .ucx_cuda = true};
    fy_xfer_reply_pack(&rm, rw);
    assert_int_equal(fy_xfer_reply_unpack(rw, sizeof(rw), &r2), FY_OK);
    assert_int_equal(r2.mem, FY_XFER_MEM_CUDA);
    assert_true(r2.ucx_cuda);
    rw[3] = rw[4] = 0;
    assert_int_equal(fy_xfer_reply_unpack(rw, sizeof(rw), &r2), FY_OK);
    assert_int_equal(r2.mem, FY_XFER_MEM_UNSTATED);
    rw[3] = 9;
    assert_int_equal(fy_xfer_reply_unpack(rw, sizeof(rw), &r2), FY_ERR_FORMAT);
    log_end();

    /* which pairs meet: direct cuda needs CUDA in the other side's UCX */
    char why[256];
    assert_false(fy_xfer_mem_explain(FY_XFER_MEM_STAGED, false, FY_XFER_MEM_HOST, false, why, sizeof(why)));
    assert_false(fy_xfer_mem_explain(FY_XFER_MEM_HOST, false, FY_XFER_MEM_STAGED, false, why, sizeof(why)));
    assert_false(fy_xfer_mem_explain(FY_XFER_MEM_CUDA, true, FY_XFER_MEM_STAGED, true, why, sizeof(why)));
    assert_false(fy_xfer_mem_explain(FY_XFER_MEM_CUDA, true, FY_XFER_MEM_CUDA, true, why, sizeof(why)));
    assert_true(fy_xfer_mem_explain(FY_XFER_MEM_CUDA, true, FY_XFER_MEM_STAGED, false, why, sizeof(why)));
    assert_non_null(strstr(why, "kv memory mismatch: direct cuda here"));
    assert_non_null(strstr(why, "(staged)"));
    assert_true(fy_xfer_mem_explain(FY_XFER_MEM_HOST, false, FY_XFER_MEM_CUDA, true, why, sizeof(why)));
    assert_non_null(strstr(why, "the peer is direct cuda"));
    assert_non_null(strstr(why, "worker.kv_transfer = staged"));
    assert_string_equal(fy_xfer_mem_name(FY_XFER_MEM_HOST), "direct host");
}

/* put_then: each call's release runs once its puts let go of their
 * source, before the job's callback, also when the job failed or was
 * aborted before they were issued. */
typedef struct rel {
    pthread_mutex_t lock;
    int n;
    int before_cb; /* releases counted when the job's callback ran */
} rel_t;

static void on_release(void *arg)
{
    rel_t *r = arg;
    pthread_mutex_lock(&r->lock);
    r->n++;
    pthread_mutex_unlock(&r->lock);
}

static rel_t *g_rel; /* for on_done_rel */
static void on_done_rel(void *arg, fy_status_t st, const char *message)
{
    pthread_mutex_lock(&g_rel->lock);
    g_rel->before_cb = g_rel->n;
    pthread_mutex_unlock(&g_rel->lock);
    on_done(arg, st, message);
}

static int rel_count(rel_t *r)
{
    pthread_mutex_lock(&r->lock);
    int n = r->n;
    pthread_mutex_unlock(&r->lock);
    return n;
}

static void test_put_then(void **state)
{
    uint64_t rng = SEED ^ 0x7;
    fy_xfer_layout_t l = small_layout(16);
    side_t pf, dc;
    side_open(&pf, &l, 32, "tcp", 0);
    side_open(&dc, &l, 32, "tcp", 0xA5);
    fill_random(&pf, &rng);
    const void *blob;
    size_t len;
    assert_int_equal(fy_xfer_target_desc(dc.x, &blob, &len), FY_OK);
    rel_t r = {.lock = PTHREAD_MUTEX_INITIALIZER};
    g_rel = &r;
    done_t d;
    done_init(&d);
    fy_xfer_job_t *j;
    /* whole blocks, a piece, and nothing at all: three releases, all before the callback */
    assert_int_equal(fy_xfer_job_begin(pf.x, blob, len, fy_now_s() + 20, on_done_rel, &d, &j), FY_OK);
    int32_t src[4] = {1, 2, 3, 9}, dst[4] = {5, 6, 7, 20};
    assert_int_equal(fy_xfer_job_put_then(j, src, dst, 4, NULL, on_release, &r), FY_OK);
    fy_xfer_piece_t pc = {.src_off = 8, .len = 32, .dst_off = 64};
    int32_t ps = 11, pd = 30;
    assert_int_equal(fy_xfer_job_put_then(j, &ps, &pd, 1, &pc, on_release, &r), FY_OK);
    assert_int_equal(fy_xfer_job_put_then(j, NULL, NULL, 0, NULL, on_release, &r), FY_OK);
    /* refused calls queue nothing and never release */
    log_begin();
    int32_t far = 40;
    assert_int_equal(fy_xfer_job_put_then(j, &far, dst, 1, NULL, on_release, &r), FY_ERR_INVALID);
    log_end();
    fy_xfer_job_finish(j);
    assert_int_equal(done_wait(&d, 20), FY_ERR_INVALID); /* the refused call fails the job, as job_put's would */
    assert_int_equal(r.before_cb, 3);
    assert_int_equal(rel_count(&r), 3);
    done_fini(&d);
    /* a clean job: the bytes arrive; the releases ran before the callback */
    r.n = 0;
    done_init(&d);
    assert_int_equal(fy_xfer_job_begin(pf.x, blob, len, fy_now_s() + 20, on_done_rel, &d, &j), FY_OK);
    assert_int_equal(fy_xfer_job_put_then(j, src, dst, 4, NULL, on_release, &r), FY_OK);
    assert_int_equal(fy_xfer_job_put_then(j, &ps, &pd, 1, &pc, on_release, &r), FY_OK);
    fy_xfer_job_finish(j);
    assert_int_equal(done_wait(&d, 20), FY_OK);
    assert_int_equal(r.before_cb, 2);
    for (int i = 0; i < 4; i++) assert_memory_equal(block(&dc, dst[i]), block(&pf, src[i]), dc.block_bytes);
    assert_memory_equal(block(&dc, 30) + 64, block(&pf, 11) + 8, 32);
    assert_int_equal(block(&dc, 30)[63], 0xA5); /* the piece and nothing around it */
    assert_int_equal(block(&dc, 30)[96], 0xA5);
    done_fini(&d);
    /* aborted at once (puts possibly never issued): released all the same */
    r.n = 0;
    done_init(&d);
    assert_int_equal(fy_xfer_job_begin(pf.x, blob, len, fy_now_s() + 20, on_done_rel, &d, &j), FY_OK);
    assert_int_equal(fy_xfer_job_put_then(j, src, dst, 4, NULL, on_release, &r), FY_OK);
    fy_xfer_job_abort(j);
    assert_int_equal(done_wait(&d, 20), FY_ERR_CANCELLED);
    assert_int_equal(r.before_cb, 1);
    done_fini(&d);
    g_rel = NULL;
    side_close(&pf);
    side_close(&dc);
}

/* ---- hostile target descriptors ------------------------------------------------------------- */

/* ---- re-sharding between rank groups ------------------------------------------------------ */

typedef struct model_shape {
    int32_t layers, heads, kv_heads, head_dim, block_size;
} model_shape_t;

/* rank's layout in a tp x pp group of model m (f16 K/V): the runner's splits */
static fy_xfer_layout_t rank_layout(const model_shape_t *m, int32_t tp, int32_t pp, int32_t rank)
{
    fy_xfer_layout_t l = {.dtype = 1, .block_size = m->block_size, .head_dim = m->head_dim, .order = 1, .n_groups = 1};
    snprintf(l.model_id, sizeof(l.model_id), "reshard-model");
    int32_t q0, nq, kv0, nkv, first, count;
    assert_int_equal(fy_kv_tp_heads(m->heads, m->kv_heads, tp, rank % tp, &q0, &nq, &kv0, &nkv), FY_OK);
    assert_int_equal(fy_kv_pp_layers(m->layers, pp, rank / tp, &first, &count), FY_OK);
    l.tp = tp, l.pp = pp, l.tp_rank = rank % tp, l.stage = rank / tp;
    l.layer0 = first, l.n_layers = count, l.kv_head0 = kv0, l.n_kv_heads = nkv;
    l.model_layers = m->layers, l.model_kv_heads = m->kv_heads;
    l.block_bytes = (uint64_t)2 * (uint64_t)count * (uint64_t)nkv * (uint64_t)m->block_size * (uint64_t)m->head_dim * 2;
    return l;
}

/* the byte a block holds at (layer, k|v, head, i) of the whole model */
static uint8_t kv_byte(int32_t layer, int32_t kv, int32_t head, uint64_t i)
{
    uint64_t x = ((uint64_t)layer * 131 + (uint64_t)kv * 71 + (uint64_t)head * 29 + i * 7) * 0x9E3779B97F4A7C15ull;
    return (uint8_t)(x >> 56);
}

/* a rank's block filled from the whole model's */
static uint8_t *rank_block(const fy_xfer_layout_t *l, uint64_t hb)
{
    uint8_t *b = fy_malloc(l->block_bytes);
    assert_non_null(b);
    uint64_t at = 0;
    for (int32_t layer = 0; layer < l->n_layers; layer++)
        for (int32_t kv = 0; kv < 2; kv++)
            for (int32_t h = 0; h < l->n_kv_heads; h++)
                for (uint64_t i = 0; i < hb; i++) b[at++] = kv_byte(l->layer0 + layer, kv, l->kv_head0 + h, i);
    assert_true(at == l->block_bytes);
    return b;
}

/* Every source rank of shape a puts its pieces into zeroed blocks of the
 * ranks of shape b; each destination must then hold its own slice, every
 * byte written exactly once.  Returns the number of pieces in all. */
static int32_t reshard_round(const model_shape_t *m, int32_t tp_a, int32_t pp_a, int32_t tp_b, int32_t pp_b)
{
    int32_t na = tp_a * pp_a, nb = tp_b * pp_b, total = 0;
    uint64_t hb = (uint64_t)m->block_size * (uint64_t)m->head_dim * 2;
    fy_xfer_layout_t dst[64];
    uint8_t *got[64], *writes[64];
    for (int32_t d = 0; d < nb; d++) {
        dst[d] = rank_layout(m, tp_b, pp_b, d);
        got[d] = fy_calloc(1, dst[d].block_bytes);
        writes[d] = fy_calloc(1, dst[d].block_bytes);
        assert_true(got[d] && writes[d]);
    }
    fy_xfer_piece_t pieces[2048];
    for (int32_t s = 0; s < na; s++) {
        fy_xfer_layout_t src = rank_layout(m, tp_a, pp_a, s);
        uint8_t *sb = rank_block(&src, hb);
        int32_t n;
        assert_int_equal(fy_xfer_reshard_plan(&src, dst, nb, pieces, (int32_t)FY_ARRAY_LEN(pieces), &n), FY_OK);
        for (int32_t i = 0; i < n; i++) {
            const fy_xfer_piece_t *p = &pieces[i];
            assert_true(p->dst_rank >= 0 && p->dst_rank < nb);
            assert_true(p->len > 0 && p->src_off + p->len <= src.block_bytes &&
                        p->dst_off + p->len <= dst[p->dst_rank].block_bytes);
            memcpy(got[p->dst_rank] + p->dst_off, sb + p->src_off, p->len);
            for (uint64_t j = 0; j < p->len; j++) writes[p->dst_rank][p->dst_off + j]++;
        }
        total += n;
        fy_free(sb);
    }
    for (int32_t d = 0; d < nb; d++) {
        uint8_t *want = rank_block(&dst[d], hb);
        for (uint64_t j = 0; j < dst[d].block_bytes; j++)
            if (writes[d][j] != 1 || got[d][j] != want[j])
                fail_msg("tp %d x pp %d -> tp %d x pp %d: rank %d byte %llu written %d times, %s", tp_a, pp_a, tp_b,
                         pp_b, d, (unsigned long long)j, writes[d][j], got[d][j] == want[j] ? "right" : "wrong");
        fy_free(want);
        fy_free(got[d]);
        fy_free(writes[d]);
    }
    return total;
}

static void test_reshard(void **state)
{
    /* SmolLM2's shape (30 layers, 9 heads over 3 KV heads), 8-token blocks */
    const model_shape_t sm = {.layers = 30, .heads = 9, .kv_heads = 3, .head_dim = 64, .block_size = 8};
    /* whole to whole: one piece */
    assert_int_equal(reshard_round(&sm, 1, 1, 1, 1), 1);
    /* the shapes: tp 1 -> tp 3 (one-to-many), pp 2 -> tp 1 (many-to-one: each stage one piece),
     * tp 3 x pp 2 -> tp 1, and back */
    reshard_round(&sm, 1, 1, 3, 1);
    assert_int_equal(reshard_round(&sm, 1, 2, 1, 1), 2);
    reshard_round(&sm, 3, 2, 1, 1);
    reshard_round(&sm, 1, 1, 3, 2);
    reshard_round(&sm, 3, 1, 1, 2);
    reshard_round(&sm, 1, 3, 3, 2);
    /* KV heads kept on several ranks: 9 ranks hold 3 copies of each */
    reshard_round(&sm, 1, 1, 9, 1);
    reshard_round(&sm, 9, 1, 3, 1);
    reshard_round(&sm, 9, 1, 1, 2);
    /* Gemma 3 270M's shape: 1 KV head, 4 query heads */
    const model_shape_t g3 = {.layers = 18, .heads = 4, .kv_heads = 1, .head_dim = 256, .block_size = 16};
    reshard_round(&g3, 2, 1, 4, 1);
    reshard_round(&g3, 4, 2, 1, 3);

    /* refused: another model, a different element format, a rank that is
     * not where its number says, a whole group missing a rank, KV groups */
    fy_xfer_layout_t src = rank_layout(&sm, 1, 1, 0), dst[3];
    for (int32_t d = 0; d < 3; d++) dst[d] = rank_layout(&sm, 3, 1, d);
    char why[240];
    assert_int_equal(fy_xfer_reshard_check(&src, dst, 3, why, sizeof(why)), FY_OK);
    fy_xfer_layout_t bad[3];
    memcpy(bad, dst, sizeof(bad));
    snprintf(bad[1].model_id, sizeof(bad[1].model_id), "another-model");
    assert_int_equal(fy_xfer_reshard_check(&src, bad, 3, why, sizeof(why)), FY_ERR_MISMATCH);
    assert_non_null(strstr(why, "destination rank 1 serves 'another-model'"));
    memcpy(bad, dst, sizeof(bad));
    bad[2].dtype = 0;
    assert_int_equal(fy_xfer_reshard_check(&src, bad, 3, why, sizeof(why)), FY_ERR_MISMATCH);
    assert_non_null(strstr(why, "stores kv differently"));
    memcpy(bad, dst, sizeof(bad));
    bad[1].tp_rank = 2;
    assert_int_equal(fy_xfer_reshard_check(&src, bad, 3, why, sizeof(why)), FY_ERR_MISMATCH);
    assert_non_null(strstr(why, "is not rank 1 of its group"));
    assert_int_equal(fy_xfer_reshard_check(&src, dst, 2, why, sizeof(why)), FY_ERR_MISMATCH);
    assert_non_null(strstr(why, "2 destination ranks for a group of tp 3 x pp 1"));
    memcpy(bad, dst, sizeof(bad));
    bad[0].kv_head0 = 2; /* rank 0 claiming rank 2's head */
    assert_int_equal(fy_xfer_reshard_check(&src, bad, 3, why, sizeof(why)), FY_ERR_MISMATCH);
    assert_non_null(strstr(why, "is not rank 0 of its group"));
    fy_xfer_layout_t off = src;
    off.layer0 = 1, off.n_layers = 29, off.block_bytes = src.block_bytes / 30 * 29; /* a stage that is no stage */
    assert_int_equal(fy_xfer_reshard_check(&off, dst, 3, why, sizeof(why)), FY_ERR_MISMATCH);
    assert_non_null(strstr(why, "is not its rank's"));
    fy_xfer_layout_t grouped = src;
    grouped.n_groups = 6;
    assert_int_equal(fy_xfer_reshard_check(&grouped, dst, 3, why, sizeof(why)), FY_ERR_MISMATCH);
    assert_non_null(strstr(why, "kv groups"));
    /* whole models grouped alike may move */
    fy_xfer_layout_t whole = src;
    whole.n_groups = 6, whole.groups = 0x1234u;
    assert_int_equal(fy_xfer_reshard_check(&whole, &whole, 1, why, sizeof(why)), FY_OK);
    /* KV groups (a page is one group's layers): ranks that hold the same
     * bytes take whole pages (Gemma's one KV head on every tensor rank),
     * others are refused; a pipeline stage of a grouped model cannot be
     * derived */
    const model_shape_t g1 = {.layers = 18, .heads = 4, .kv_heads = 1, .head_dim = 256, .block_size = 16};
    fy_xfer_layout_t gw = rank_layout(&g1, 1, 1, 0), gr[4];
    gw.n_groups = 6, gw.groups = 0x77u, gw.block_bytes = 3 * 2 * 16 * 256 * 2; /* a page of 3 layers */
    for (int32_t r = 0; r < 4; r++) assert_int_equal(fy_xfer_layout_for_rank(&gw, 4, 1, r, &gr[r]), FY_OK);
    assert_true(gr[3].block_bytes == gw.block_bytes && gr[3].n_groups == 6 && gr[3].tp_rank == 3);
    assert_true(fy_xfer_layout_same_data(&gw, &gr[2]));
    fy_xfer_piece_t pg[8];
    int32_t n;
    assert_int_equal(fy_xfer_reshard_plan(&gw, gr, 4, pg, 8, &n), FY_OK); /* one page to each replica */
    assert_int_equal(n, 4);
    for (int32_t k = 0; k < 4; k++)
        assert_true(pg[k].dst_rank == k && pg[k].src_off == 0 && pg[k].dst_off == 0 && pg[k].len == gw.block_bytes);
    assert_int_equal(fy_xfer_reshard_plan(&gr[1], &gw, 1, pg, 8, &n), FY_OK); /* a replica does not send */
    assert_int_equal(n, 0);
    assert_int_equal(fy_xfer_reshard_plan(&gr[0], &gw, 1, pg, 8, &n), FY_OK);
    assert_int_equal(n, 1);
    fy_xfer_layout_t stage;
    fy_test_log_begin();
    assert_int_equal(fy_xfer_layout_for_rank(&gw, 1, 2, 1, &stage), FY_ERR_MISMATCH);
    assert_true(fy_test_log_has("cannot be derived from a layout of 6 kv groups", NULL));
    fy_test_log_end();
    const model_shape_t g2 = {.layers = 12, .heads = 8, .kv_heads = 2, .head_dim = 64, .block_size = 16};
    fy_xfer_layout_t hw = rank_layout(&g2, 1, 1, 0), hr[2];
    hw.n_groups = 2, hw.groups = 0x99u;
    for (int32_t r = 0; r < 2; r++) assert_int_equal(fy_xfer_layout_for_rank(&hw, 2, 1, r, &hr[r]), FY_OK);
    assert_true(hr[1].block_bytes * 2 == hw.block_bytes && hr[1].kv_head0 == 1);
    assert_int_equal(fy_xfer_reshard_check(&hw, hr, 2, why, sizeof(why)), FY_ERR_MISMATCH); /* heads split */
    assert_non_null(strstr(why, "holding the same layers and heads grouped alike"));
    /* too small a piece array */
    fy_xfer_piece_t one[1];
    fy_test_log_begin();
    assert_int_equal(fy_xfer_reshard_plan(&src, dst, 3, one, 1, &n), FY_ERR_NO_SPACE);
    assert_int_equal(fy_xfer_reshard_plan(&src, bad, 3, one, 1, &n), FY_ERR_MISMATCH);
    fy_test_log_end();
    /* a mismatch of shapes is refused at the handshake, naming the field */
    fy_xfer_layout_t a = rank_layout(&sm, 3, 1, 1), b = a;
    b.tp = 1;
    assert_true(fy_xfer_layout_explain(&a, &b, why, sizeof(why)));
    assert_string_equal(why, "kv layout mismatch: tp is 3 here, 1 at the peer");
    uint8_t w[FY_XFER_LAYOUT_WIRE_LEN];
    fy_xfer_layout_pack(&a, w);
    fy_xfer_layout_unpack(w, &b);
    assert_null(fy_xfer_layout_diff(&a, &b));
}

/* Real puts between groups of different shapes over UCX (tcp): each
 * source rank opens a job to each destination rank it feeds and puts its
 * pieces of a few blocks to scattered destination blocks; every
 * destination block must then hold its rank's slice of the model's
 * block, and untargeted blocks stay untouched.  Also: whole blocks to a
 * rank of another shape fail the job (only pieces go there), and a shape
 * re-sharding cannot map is refused at the handshake. */
static void reshard_over_ucx(const model_shape_t *m, int32_t tp_a, int32_t pp_a, int32_t tp_b, int32_t pp_b)
{
    enum { NB = 8, MOVE = 3 };
    int32_t na = tp_a * pp_a, nb = tp_b * pp_b;
    uint64_t hb = (uint64_t)m->block_size * (uint64_t)m->head_dim * 2;
    side_t src[8], dst[8];
    fy_xfer_layout_t ls[8], ld[8];
    const int32_t sblk[MOVE] = {1, 2, 6}, dblk[MOVE] = {5, 0, 3};
    for (int32_t s = 0; s < na; s++) {
        ls[s] = rank_layout(m, tp_a, pp_a, s);
        side_open(&src[s], &ls[s], NB, "tcp", 0);
        uint8_t *b = rank_block(&ls[s], hb);
        for (int32_t k = 0; k < MOVE; k++) memcpy(block(&src[s], sblk[k]), b, ls[s].block_bytes);
        fy_free(b);
    }
    for (int32_t d = 0; d < nb; d++) {
        ld[d] = rank_layout(m, tp_b, pp_b, d);
        side_open(&dst[d], &ld[d], NB, "tcp", 0xA5);
    }
    fy_xfer_piece_t pieces[512];
    for (int32_t s = 0; s < na; s++) {
        int32_t n;
        assert_int_equal(fy_xfer_reshard_plan(&ls[s], ld, nb, pieces, (int32_t)FY_ARRAY_LEN(pieces), &n), FY_OK);
        for (int32_t d = 0; d < nb; d++) {
            int32_t mine = 0;
            for (int32_t i = 0; i < n; i++) mine += pieces[i].dst_rank == d;
            if (!mine) continue;
            const void *blob;
            size_t len;
            assert_int_equal(fy_xfer_target_desc(dst[d].x, &blob, &len), FY_OK);
            done_t dn;
            done_init(&dn);
            fy_xfer_job_t *j;
            assert_int_equal(fy_xfer_job_begin(src[s].x, blob, len, fy_now_s() + 20, on_done, &dn, &j), FY_OK);
            for (int32_t i = 0; i < n; i++)
                if (pieces[i].dst_rank == d)
                    assert_int_equal(fy_xfer_job_put_piece(j, sblk, dblk, MOVE, &pieces[i]), FY_OK);
            fy_xfer_job_finish(j);
            fy_status_t st = done_wait(&dn, 30);
            if (st != FY_OK) fail_msg("rank %d -> rank %d: %s: %s", s, d, fy_status_str(st), dn.msg);
            done_fini(&dn);
        }
    }
    for (int32_t d = 0; d < nb; d++) {
        uint8_t *want = rank_block(&ld[d], hb);
        for (int32_t b = 0; b < NB; b++) {
            bool moved = b == dblk[0] || b == dblk[1] || b == dblk[2];
            for (uint64_t k = 0; k < ld[d].block_bytes; k++)
                if (block(&dst[d], b)[k] != (moved ? want[k] : 0xA5))
                    fail_msg("tp %d x pp %d -> tp %d x pp %d over UCX: rank %d block %d byte %llu", tp_a, pp_a, tp_b,
                             pp_b, d, b, (unsigned long long)k);
        }
        fy_free(want);
    }
    if (na * nb > 1 && fy_xfer_layout_diff(&ls[0], &ld[0])) { /* whole blocks into another shape: refused */
        const void *blob;
        size_t len;
        assert_int_equal(fy_xfer_target_desc(dst[0].x, &blob, &len), FY_OK);
        done_t dn;
        done_init(&dn);
        fy_xfer_job_t *j;
        assert_int_equal(fy_xfer_job_begin(src[0].x, blob, len, fy_now_s() + 20, on_done, &dn, &j), FY_OK);
        assert_int_equal(fy_xfer_job_put(j, sblk, dblk, 1), FY_OK);
        fy_xfer_job_finish(j);
        assert_int_equal(done_wait(&dn, 30), FY_ERR_MISMATCH);
        assert_non_null(strstr(dn.msg, "only pieces"));
        done_fini(&dn);
    }
    for (int32_t s = 0; s < na; s++) side_close(&src[s]);
    for (int32_t d = 0; d < nb; d++) side_close(&dst[d]);
}

static void test_reshard_ucx(void **state)
{
    const model_shape_t sm = {.layers = 6, .heads = 9, .kv_heads = 3, .head_dim = 16, .block_size = 4};
    reshard_over_ucx(&sm, 1, 1, 3, 1); /* prefill tp 1 -> decode tp 3 */
    reshard_over_ucx(&sm, 1, 2, 1, 1); /* prefill pp 2 -> decode tp 1 */
    reshard_over_ucx(&sm, 3, 2, 1, 2); /* tp 3 x pp 2 -> pp 2 */
    /* bad pieces: past either block, or a block id past either arena: refused, and the job fails */
    fy_xfer_layout_t la = rank_layout(&sm, 1, 1, 0), lb = rank_layout(&sm, 3, 1, 0);
    side_t s, d;
    const void *blob;
    size_t len;
    done_t dn;
    fy_xfer_job_t *j;
    side_open(&s, &la, 4, "tcp", 0);
    side_open(&d, &lb, 4, "tcp", 0xA5);
    assert_int_equal(fy_xfer_target_desc(d.x, &blob, &len), FY_OK);
    const fy_xfer_piece_t bad[] = {
        {.dst_rank = 0, .src_off = la.block_bytes - 8, .len = 16, .dst_off = 0}, /* past the source block */
        {.dst_rank = 0, .src_off = 0, .len = 16, .dst_off = lb.block_bytes - 8}, /* past the target block */
        {.dst_rank = 0, .src_off = 0, .len = 0, .dst_off = 0},                   /* empty */
        {.dst_rank = 0, .src_off = 0, .len = 16, .dst_off = 0},                  /* fine, but block 4 (below) */
    };
    /* one good piece first: the connection is made and answered before any job fails (UCX 1.13
     * asserts when an endpoint whose handshake reply is still connecting fails at close) */
    int32_t one = 1;
    done_init(&dn);
    assert_int_equal(fy_xfer_job_begin(s.x, blob, len, fy_now_s() + 20, on_done, &dn, &j), FY_OK);
    assert_int_equal(fy_xfer_job_put_piece(j, &one, &one, 1, &bad[3]), FY_OK);
    fy_xfer_job_finish(j);
    assert_int_equal(done_wait(&dn, 30), FY_OK);
    done_fini(&dn);
    memset(d.arena, 0xA5, d.bytes);
    for (size_t i = 0; i < FY_ARRAY_LEN(bad); i++) {
        int32_t sb = 0, db = i == 3 ? 4 : 0;
        done_init(&dn);
        fy_test_log_begin();
        assert_int_equal(fy_xfer_job_begin(s.x, blob, len, fy_now_s() + 20, on_done, &dn, &j), FY_OK);
        assert_int_equal(fy_xfer_job_put_piece(j, &sb, &db, 1, &bad[i]), FY_ERR_INVALID);
        fy_xfer_job_finish(j);
        assert_int_equal(done_wait(&dn, 30), FY_ERR_INVALID);
        fy_test_log_end();
        done_fini(&dn);
    }
    for (uint64_t k = 0; k < d.bytes; k++) assert_int_equal(d.arena[k], 0xA5);
    side_close(&s);
    side_close(&d);

    /* a shape that cannot be mapped: another model's head count at the target */
    fy_xfer_layout_t a = rank_layout(&sm, 1, 1, 0);
    const model_shape_t other = {.layers = 6, .heads = 8, .kv_heads = 2, .head_dim = 16, .block_size = 4};
    fy_xfer_layout_t b = rank_layout(&other, 2, 1, 1);
    side_open(&s, &a, 4, "tcp", 0);
    side_open(&d, &b, 4, "tcp", 0xA5);
    assert_int_equal(fy_xfer_target_desc(d.x, &blob, &len), FY_OK);
    done_init(&dn);
    fy_test_log_begin();
    assert_int_equal(fy_xfer_job_begin(s.x, blob, len, fy_now_s() + 20, on_done, &dn, &j), FY_OK);
    fy_xfer_piece_t p = {.dst_rank = 1, .src_off = 0, .len = 64, .dst_off = 0};
    int32_t zero = 0;
    assert_int_equal(fy_xfer_job_put_piece(j, &zero, &zero, 1, &p), FY_OK);
    fy_xfer_job_finish(j);
    assert_int_equal(done_wait(&dn, 30), FY_ERR_MISMATCH);
    fy_test_log_end();
    if (!strstr(dn.msg, "model_kv_heads is 3 here, 2 at the peer")) fail_msg("refusal: %s", dn.msg);
    done_fini(&dn);
    for (uint64_t k = 0; k < d.bytes; k++) assert_int_equal(d.arena[k], 0xA5);
    side_close(&s);
    side_close(&d);
}

/* ---- a rank group's engines (xgroup.h) ---------------------------------------------------- */

typedef struct xg_side {
    fy_xgroup_t *g;
    uint8_t *arenas;
    size_t stride;
    int32_t n;
    fy_xfer_layout_t lay[8];
} xg_side_t;

/* A group of tp x pp ranks of model m, each rank's arena of nb blocks at
 * arenas + r * stride (one allocation, as a worker's shared mapping),
 * filled with fill. */
static void xg_open(xg_side_t *x, const model_shape_t *m, int32_t tp, int32_t pp, int32_t nb, uint8_t fill)
{
    x->n = tp * pp;
    x->stride = 0;
    for (int32_t r = 0; r < x->n; r++) {
        x->lay[r] = rank_layout(m, tp, pp, r);
        size_t b = (size_t)nb * x->lay[r].block_bytes;
        if (b > x->stride) x->stride = b;
    }
    x->stride = (x->stride + 4095) & ~(size_t)4095;
    void *a = NULL;
    assert_int_equal(posix_memalign(&a, 4096, x->stride * (size_t)x->n), 0);
    x->arenas = a;
    memset(x->arenas, fill, x->stride * (size_t)x->n);
    fy_xgroup_params_t p = {.tp = tp,
                            .pp = pp,
                            .layout = x->lay[0],
                            .arenas = x->arenas,
                            .arena_stride = x->stride,
                            .n_pages = nb,
                            .transports = "tcp",
                            .connect_timeout_s = 10};
    if (x->n == 1) fy_xfer_layout_whole(&p.layout);
    assert_int_equal(fy_xgroup_create(&p, &x->g), FY_OK);
    for (int32_t r = 0; r < x->n; r++) assert_null(fy_xfer_layout_diff(fy_xgroup_layout(x->g, r), &x->lay[r]));
}

static void xg_close(xg_side_t *x)
{
    fy_xgroup_destroy(x->g);
    free(x->arenas);
}

static uint8_t *xg_block(xg_side_t *x, int32_t r, int32_t b)
{
    return x->arenas + (size_t)r * x->stride + (size_t)b * x->lay[r].block_bytes;
}

/* One group job from shape a into shape b: every destination rank's
 * moved blocks hold its slice of the model's block, the others are
 * untouched, and the job's bytes per block are the destination group's
 * distinct bytes. */
static void xgroup_over_ucx(const model_shape_t *m, int32_t tp_a, int32_t pp_a, int32_t tp_b, int32_t pp_b)
{
    enum { NB = 8, MOVE = 3 };
    uint64_t hb = (uint64_t)m->block_size * (uint64_t)m->head_dim * 2;
    const int32_t sblk[MOVE] = {1, 2, 6}, dblk[MOVE] = {5, 6, 3}; /* 1,2 -> 5,6: one coalesced run where whole */
    xg_side_t a, b;
    xg_open(&a, m, tp_a, pp_a, NB, 0);
    xg_open(&b, m, tp_b, pp_b, NB, 0xA5);
    for (int32_t r = 0; r < a.n; r++) {
        uint8_t *blk = rank_block(&a.lay[r], hb);
        for (int32_t k = 0; k < MOVE; k++) memcpy(xg_block(&a, r, sblk[k]), blk, a.lay[r].block_bytes);
        fy_free(blk);
    }
    const void *blob;
    size_t len;
    assert_int_equal(fy_xgroup_target_desc(b.g, &blob, &len), FY_OK);
    assert_int_equal(fy_xgroup_desc_is(blob, len), b.n > 1);
    done_t dn;
    done_init(&dn);
    fy_xgroup_job_t *j;
    assert_int_equal(fy_xgroup_job_begin(a.g, blob, len, fy_now_s() + 20, on_done, &dn, &j), FY_OK);
    uint64_t whole = (uint64_t)2 * (uint64_t)m->layers * (uint64_t)m->kv_heads * hb;
    assert_true(fy_xgroup_job_block_bytes(j) == whole);
    assert_int_equal(fy_xgroup_job_put(j, sblk, dblk, MOVE), FY_OK);
    fy_xgroup_job_finish(j);
    fy_status_t st = done_wait(&dn, 30);
    if (st != FY_OK)
        fail_msg("tp %d x pp %d -> tp %d x pp %d: %s: %s", tp_a, pp_a, tp_b, pp_b, fy_status_str(st), dn.msg);
    assert_int_equal(done_calls(&dn), 1);
    done_fini(&dn);
    for (int32_t r = 0; r < b.n; r++) {
        uint8_t *want = rank_block(&b.lay[r], hb);
        for (int32_t blk = 0; blk < NB; blk++) {
            bool moved = blk == dblk[0] || blk == dblk[1] || blk == dblk[2];
            for (uint64_t k = 0; k < b.lay[r].block_bytes; k++)
                if (xg_block(&b, r, blk)[k] != (moved ? want[k] : 0xA5))
                    fail_msg("group tp %d x pp %d -> tp %d x pp %d: rank %d block %d byte %llu", tp_a, pp_a, tp_b, pp_b,
                             r, blk, (unsigned long long)k);
        }
        fy_free(want);
    }
    xg_close(&a);
    xg_close(&b);
}

static void test_xgroup(void **state)
{
    const model_shape_t sm = {.layers = 6, .heads = 9, .kv_heads = 3, .head_dim = 16, .block_size = 4};
    xgroup_over_ucx(&sm, 1, 1, 1, 1); /* one process to one: the plain blob */
    xgroup_over_ucx(&sm, 1, 1, 3, 1); /* prefill tp 1 -> decode tp 3 */
    xgroup_over_ucx(&sm, 1, 2, 1, 1); /* prefill pp 2 -> decode tp 1 */
    xgroup_over_ucx(&sm, 3, 2, 1, 2); /* tp 3 x pp 2 -> pp 2 */
    xgroup_over_ucx(&sm, 3, 1, 3, 1); /* matched: whole blocks rank to rank */

    /* the descriptor: built and parsed back; every truncation, a bad magic,
     * version, shape, length and trailing bytes refused */
    xg_side_t d;
    xg_open(&d, &sm, 3, 1, 4, 0);
    const void *blob;
    size_t len;
    assert_int_equal(fy_xgroup_target_desc(d.g, &blob, &len), FY_OK);
    fy_xgroup_desc_t gd;
    assert_int_equal(fy_xgroup_desc_parse(blob, len, &gd), FY_OK);
    assert_int_equal(gd.tp, 3);
    assert_int_equal(gd.pp, 1);
    assert_int_equal(gd.n, 3);
    for (int32_t r = 0; r < 3; r++) {
        const void *rb;
        size_t rl;
        assert_int_equal(fy_xfer_target_desc(fy_xgroup_rank(d.g, r), &rb, &rl), FY_OK);
        assert_true(gd.blob_len[r] == rl && !memcmp(gd.blob[r], rb, rl));
    }
    uint8_t *copy = fy_malloc(len + 1);
    memcpy(copy, blob, len);
    for (size_t n = 0; n < len; n++) assert_int_equal(fy_xgroup_desc_parse(copy, n, &gd), FY_ERR_FORMAT);
    copy[len] = 0;
    assert_int_equal(fy_xgroup_desc_parse(copy, len + 1, &gd), FY_ERR_FORMAT); /* a byte past the last blob */
    const struct {
        size_t at;
        uint8_t v;
    } flips[] = {{0, 'X'}, {4, 2}, {6, 0}, {6, 65}, {7, 0}, {6, 9}, {8, 0}, {9, 0x40}};
    for (size_t k = 0; k < FY_ARRAY_LEN(flips); k++) {
        memcpy(copy, blob, len);
        copy[flips[k].at] = flips[k].v;
        if (fy_xgroup_desc_parse(copy, len, &gd) != FY_ERR_FORMAT)
            fail_msg("a descriptor with byte %zu = %u parsed", flips[k].at, flips[k].v);
    }
    fy_xgroup_desc_t bad = gd;
    bad.tp = 0;
    fy_test_log_begin();
    uint8_t *out;
    size_t out_len;
    assert_int_equal(fy_xgroup_desc_build(&bad, &out, &out_len), FY_ERR_INVALID);
    fy_test_log_end();

    /* a worker shutting down has no engines (commands posted before still run) */
    fy_test_log_begin();
    fy_xgroup_job_t *none;
    assert_int_equal(fy_xgroup_job_begin(NULL, blob, len, fy_now_s() + 5, on_done, NULL, &none), FY_ERR_CANCELLED);
    assert_int_equal(fy_xgroup_target_desc(NULL, &blob, &len), FY_ERR_CANCELLED);
    fy_test_log_end();
    assert_int_equal(fy_xgroup_target_desc(d.g, &blob, &len), FY_OK);

    /* jobs that cannot begin: no callback ever, nothing written */
    xg_side_t s;
    xg_open(&s, &sm, 1, 1, 4, 0);
    done_t dn;
    done_init(&dn);
    fy_xgroup_job_t *j;
    fy_test_log_begin();
    memcpy(copy, blob, len);
    copy[9] ^= 0x40; /* rank 0's blob length */
    assert_int_equal(fy_xgroup_job_begin(s.g, copy, len, fy_now_s() + 5, on_done, &dn, &j), FY_ERR_FORMAT);
    /* a shape re-sharding cannot map: tp 2 over 3 KV heads (nor 9 query heads) */
    assert_int_equal(fy_xgroup_desc_parse(blob, len, &gd), FY_OK);
    fy_xgroup_desc_t two = {
        .tp = 2, .pp = 1, .n = 2, .blob = {gd.blob[0], gd.blob[1]}, .blob_len = {gd.blob_len[0], gd.blob_len[1]}};
    assert_int_equal(fy_xgroup_desc_build(&two, &out, &out_len), FY_OK);
    assert_int_equal(fy_xgroup_job_begin(s.g, out, out_len, fy_now_s() + 5, on_done, &dn, &j), FY_ERR_MISMATCH);
    fy_test_log_end();
    fy_free(out);
    /* a rank's blob that does not parse: the pairs begun end, no callback */
    memcpy(copy, blob, len);
    copy[len - 1] ^= 0xFF; /* the last rank's blob checksum */
    fy_test_log_begin();
    assert_int_equal(fy_xgroup_job_begin(s.g, copy, len, fy_now_s() + 5, on_done, &dn, &j), FY_ERR_FORMAT);
    fy_test_log_end();
    usleep(100000); /* a fixed time: no callback comes within it (nor ever) */
    assert_int_equal(done_calls(&dn), 0);
    done_fini(&dn);
    for (int32_t r = 0; r < d.n; r++)
        for (uint64_t k = 0; k < 4 * d.lay[r].block_bytes; k++) assert_int_equal(xg_block(&d, r, 0)[k], 0);
    fy_free(copy);
    xg_close(&s);
    xg_close(&d);
}

static void test_bad_blobs(void **state)
{
    fy_xfer_layout_t l = small_layout(16);
    side_t pf, dc;
    side_open(&pf, &l, 4, "tcp", 0);
    side_open(&dc, &l, 4, "tcp", 0xA5);
    const void *blob;
    size_t len;
    assert_int_equal(fy_xfer_target_desc(dc.x, &blob, &len), FY_OK);
    uint8_t *copy = fy_malloc(len);
    memcpy(copy, blob, len);
    done_t d;
    done_init(&d);
    fy_xfer_job_t *j = NULL;
    log_begin();
    /* every truncation of a real blob */
    for (size_t n = 0; n < len; n++)
        if (fy_xfer_job_begin(pf.x, copy, n, fy_now_s() + 5, on_done, &d, &j) != FY_ERR_FORMAT)
            fail_msg("a blob truncated to %zu of %zu bytes was accepted", n, len);
    assert_int_equal(fy_xfer_job_begin(pf.x, NULL, 0, fy_now_s() + 5, on_done, &d, &j), FY_ERR_FORMAT);
    /* every single flipped byte */
    for (size_t i = 0; i < len; i++) {
        copy[i] ^= 0x5a;
        if (fy_xfer_job_begin(pf.x, copy, len, fy_now_s() + 5, on_done, &d, &j) != FY_ERR_FORMAT)
            fail_msg("a blob with byte %zu flipped was accepted", i);
        copy[i] ^= 0x5a;
    }
    /* random bytes of many lengths, also with a valid magic and version */
    uint64_t rng = SEED;
    uint8_t junk[1024];
    for (int k = 0; k < 2000; k++) {
        size_t n = (size_t)(fy_test_rand_u64(&rng) % sizeof(junk));
        for (size_t i = 0; i < n; i++) junk[i] = (uint8_t)fy_test_rand_u64(&rng);
        if (k % 2 && n >= 8) memcpy(junk, copy, 8);
        if (fy_xfer_job_begin(pf.x, junk, n, fy_now_s() + 5, on_done, &d, &j) != FY_ERR_FORMAT)
            fail_msg("random blob %d (%zu bytes) was accepted", k, n);
    }
    /* lengths that add up but describe an impossible arena, with a valid checksum */
    fy_xfer_target_t t;
    assert_int_equal(fy_xfer_blob_parse(copy, len, &t), FY_OK);
    uint8_t *forged;
    size_t flen;
    t.arena_bytes = t.block_bytes * 3 + 1;
    assert_int_equal(fy_xfer_blob_build(&t, &forged, &flen), FY_OK);
    assert_int_equal(fy_xfer_job_begin(pf.x, forged, flen, fy_now_s() + 5, on_done, &d, &j), FY_ERR_FORMAT);
    fy_free(forged);
    t.arena_bytes = 0;
    assert_int_equal(fy_xfer_blob_build(&t, &forged, &flen), FY_OK);
    assert_int_equal(fy_xfer_job_begin(pf.x, forged, flen, fy_now_s() + 5, on_done, &d, &j), FY_ERR_FORMAT);
    fy_free(forged);
    log_end();
    assert_true(log_has("target descriptor"));
    assert_null(j);
    assert_int_equal(done_calls(&d), 0); /* no job, no callback */
    /* the real one still works afterwards */
    int32_t a = 1, b = 2;
    assert_int_equal(run_job(&pf, &dc, &a, &b, 1, 1), FY_OK);
    fy_free(copy);
    done_fini(&d);
    side_close(&pf);
    side_close(&dc);
}

/* ---- failures ------------------------------------------------------------------------------- */

static void test_deadline_abort_range(void **state)
{
    fy_xfer_layout_t l = small_layout(16);
    side_t pf, dc;
    side_open(&pf, &l, 16, "tcp", 0x11);
    side_open(&dc, &l, 8, "tcp", 0xA5);
    const void *blob;
    size_t len;
    assert_int_equal(fy_xfer_target_desc(dc.x, &blob, &len), FY_OK);
    fy_xfer_job_t *j;
    done_t d;
    int32_t src[2] = {0, 1}, dst[2] = {0, 1};

    /* a deadline already passed: TIMEOUT, and nothing written */
    done_init(&d);
    assert_int_equal(fy_xfer_job_begin(pf.x, blob, len, fy_now_s() - 1, on_done, &d, &j), FY_OK);
    assert_int_equal(fy_xfer_job_put(j, src, dst, 2), FY_OK);
    fy_xfer_job_finish(j);
    assert_int_equal(done_wait(&d, 10), FY_ERR_TIMEOUT);
    assert_true(strstr(d.msg, "deadline") != NULL);
    assert_int_equal(dc.arena[0], 0xA5);
    done_fini(&d);

    /* a deadline moved later before it passed: the job lives past the
     * first one and completes; an earlier "extension" changes nothing */
    done_init(&d);
    memset(dc.arena, 0xA5, dc.bytes);
    assert_int_equal(fy_xfer_job_begin(pf.x, blob, len, fy_now_s() + 0.3, on_done, &d, &j), FY_OK);
    fy_xfer_job_extend(j, fy_now_s() + 30);
    fy_xfer_job_extend(j, fy_now_s() - 5);
    struct timespec pause = {0, 600 * 1000 * 1000};
    nanosleep(&pause, NULL); /* past the first deadline: what is tested is that nothing happens */
    assert_int_equal(done_calls(&d), 0);
    assert_int_equal(fy_xfer_job_put(j, src, dst, 2), FY_OK);
    fy_xfer_job_finish(j);
    assert_int_equal(done_wait(&d, 10), FY_OK);
    assert_memory_equal(block(&pf, 0), block(&dc, 0), l.block_bytes);
    done_fini(&d);

    /* abort: CANCELLED, and the callback waits for the abort */
    done_init(&d);
    assert_int_equal(fy_xfer_job_begin(pf.x, blob, len, fy_now_s() + 10, on_done, &d, &j), FY_OK);
    assert_int_equal(fy_xfer_job_put(j, src, dst, 2), FY_OK);
    fy_xfer_job_abort(j);
    assert_int_equal(done_wait(&d, 10), FY_ERR_CANCELLED);
    done_fini(&d);

    /* an error before finish is remembered; the callback still waits for finish */
    done_init(&d);
    assert_int_equal(fy_xfer_job_begin(pf.x, blob, len, fy_now_s() - 1, on_done, &d, &j), FY_OK);
    double t0 = fy_now_s();
    while (fy_now_s() < t0 + 0.2) {
        /* nothing to wait on: the point is that nothing happens; poll the counter */
        assert_int_equal(done_calls(&d), 0);
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    fy_xfer_job_finish(j);
    assert_int_equal(done_wait(&d, 10), FY_ERR_TIMEOUT);
    done_fini(&d);

    /* block ids out of range, here and at the target (8 blocks there) */
    log_begin();
    int32_t bad[][2] = {{16, 0}, {-1, 0}, {0, 8}, {0, -5}, {15, 7}};
    for (size_t k = 0; k < FY_ARRAY_LEN(bad); k++) {
        done_init(&d);
        assert_int_equal(fy_xfer_job_begin(pf.x, blob, len, fy_now_s() + 10, on_done, &d, &j), FY_OK);
        fy_status_t want = k < 4 ? FY_ERR_INVALID : FY_OK;
        assert_int_equal(fy_xfer_job_put(j, &bad[k][0], &bad[k][1], 1), want);
        fy_xfer_job_finish(j);
        assert_int_equal(done_wait(&d, 10), want);
        done_fini(&d);
    }
    /* a bad id in the middle of a call queues none of it */
    done_init(&d);
    assert_int_equal(fy_xfer_job_begin(pf.x, blob, len, fy_now_s() + 10, on_done, &d, &j), FY_OK);
    int32_t s3[3] = {2, 3, 99}, d3[3] = {2, 3, 4};
    assert_int_equal(fy_xfer_job_put(j, s3, d3, 3), FY_ERR_INVALID);
    assert_int_equal(fy_xfer_job_put(j, s3, d3, 2), FY_OK); /* ignored: the job already failed */
    fy_xfer_job_finish(j);
    assert_int_equal(done_wait(&d, 10), FY_ERR_INVALID);
    done_fini(&d);
    log_end();
    assert_true(log_has("out of range"));
    assert_int_equal(dc.arena[2 * l.block_bytes], 0xA5);
    side_close(&pf);
    side_close(&dc);
}

/* A target that goes away mid-job: the job ends with an error, by its
 * deadline, and a new target is reachable afterwards. */
static void target_dies(const char *tls, bool must_fail)
{
    fy_xfer_layout_t l = small_layout(16);
    side_t pf, dc;
    side_open(&pf, &l, 16, tls, 0x11);
    side_open(&dc, &l, 16, tls, 0xA5);
    int32_t src[4] = {0, 1, 2, 3}, dst[4] = {4, 5, 6, 7};
    assert_int_equal(run_job(&pf, &dc, src, dst, 4, 1), FY_OK); /* connected */

    const void *blob;
    size_t len;
    assert_int_equal(fy_xfer_target_desc(dc.x, &blob, &len), FY_OK);
    uint8_t *copy = fy_malloc(len);
    memcpy(copy, blob, len);
    done_t d;
    done_init(&d);
    fy_xfer_job_t *j;
    double deadline = fy_now_s() + 3;
    log_begin();
    assert_int_equal(fy_xfer_job_begin(pf.x, copy, len, deadline, on_done, &d, &j), FY_OK);
    assert_int_equal(fy_xfer_job_put(j, src, dst, 2), FY_OK);
    /* the target's arena stays allocated (a dead process's memory would be
     * gone; here the point is the connection) */
    fy_xfer_destroy(dc.x);
    dc.x = NULL;
    assert_int_equal(fy_xfer_job_put(j, src + 2, dst + 2, 2), FY_OK);
    fy_xfer_job_finish(j);
    fy_status_t st = done_wait(&d, deadline - fy_now_s() + FY_XFER_GRACE_S + 2);
    log_end();
    if (must_fail) {
        if (st != FY_ERR_PEER && st != FY_ERR_TIMEOUT) fail_msg("status %s: %s", fy_status_str(st), d.msg);
        if (st == FY_ERR_PEER && !strstr(d.msg, "/")) fail_msg("message does not name the peer: %s", d.msg);
    }
    assert_int_equal(done_calls(&d), 1);
    done_fini(&d);

    /* a new target is reachable */
    fy_free(dc.arena); /* its own: see side_open */
    side_open(&dc, &l, 16, tls, 0xA5);
    assert_int_equal(run_job(&pf, &dc, src, dst, 4, 1), FY_OK);
    verify(&pf, &dc, src, dst, 4, 0xA5);
    fy_free(copy);
    side_close(&pf);
    side_close(&dc);
}

static void test_target_dies_tcp(void **state) { target_dies("tcp", true); }
static void test_target_dies_default(void **state) { target_dies(NULL, true); }
static void test_target_dies_shm(void **state) { target_dies("sm", false); }

/* A target that never answers (its worker is never progressed): the
 * handshake times out, and no put is issued. */
static void test_handshake_timeout(void **state)
{
    ucp_config_t *cfg;
    assert_int_equal(ucp_config_read(NULL, NULL, &cfg), UCS_OK);
    assert_int_equal(ucp_config_modify(cfg, "TLS", "tcp"), UCS_OK);
    ucp_params_t up = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_RMA | UCP_FEATURE_AM};
    ucp_context_h ctx;
    assert_int_equal(ucp_init(&up, cfg, &ctx), UCS_OK);
    ucp_config_release(cfg);
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE, .thread_mode = UCS_THREAD_MODE_SINGLE};
    ucp_worker_h w;
    assert_int_equal(ucp_worker_create(ctx, &wp, &w), UCS_OK);
    static uint8_t mem[4 * 4096];
    ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
                               .address = mem,
                               .length = sizeof(mem)};
    ucp_mem_h memh;
    assert_int_equal(ucp_mem_map(ctx, &mp, &memh), UCS_OK);
    void *rkey;
    size_t rkey_len, addr_len;
    ucp_address_t *addr;
    assert_int_equal(ucp_rkey_pack(ctx, memh, &rkey, &rkey_len), UCS_OK);
    assert_int_equal(ucp_worker_get_address(w, &addr, &addr_len), UCS_OK);
    fy_xfer_target_t t = {.addr = (const uint8_t *)addr,
                          .addr_len = (uint32_t)addr_len,
                          .rkey = rkey,
                          .rkey_len = (uint32_t)rkey_len,
                          .arena_base = (uint64_t)(uintptr_t)mem,
                          .arena_bytes = sizeof(mem),
                          .block_bytes = 4096,
                          .name = "silent-target"};
    uint8_t *blob;
    size_t len;
    assert_int_equal(fy_xfer_blob_build(&t, &blob, &len), FY_OK);

    fy_xfer_layout_t l = small_layout(16);
    uint8_t *arena = fy_aligned_alloc(4096, 4 * l.block_bytes);
    fy_xfer_params_t p = {
        .layout = l, .arena = arena, .arena_bytes = 4 * l.block_bytes, .transports = "tcp", .connect_timeout_s = 0.5};
    fy_xfer_t *x;
    assert_int_equal(fy_xfer_create(&p, &x), FY_OK);
    done_t d;
    done_init(&d);
    fy_xfer_job_t *j;
    log_begin();
    double t0 = fy_now_s();
    assert_int_equal(fy_xfer_job_begin(x, blob, len, t0 + 30, on_done, &d, &j), FY_OK);
    int32_t a = 0;
    assert_int_equal(fy_xfer_job_put(j, &a, &a, 1), FY_OK);
    fy_xfer_job_finish(j);
    assert_int_equal(done_wait(&d, 10), FY_ERR_TIMEOUT);
    double took = fy_now_s() - t0;
    log_end();
    assert_true(strstr(d.msg, "handshake") != NULL);
    assert_true(took >= 0.4 && took < 3);
    fy_xfer_stats_t s;
    fy_xfer_stats(x, &s);
    assert_int_equal(s.puts, 0);
    assert_int_equal(s.peer_failures, 1);
    fy_xfer_destroy(x);
    done_fini(&d);
    fy_free(arena);
    fy_free(blob);
    ucp_worker_release_address(w, addr);
    ucp_rkey_buffer_release(rkey);
    ucp_mem_unmap(ctx, memh);
    ucp_worker_destroy(w);
    ucp_cleanup(ctx);
}

static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec * 1e-6;
}

/* Connected but idle engines sleep on their event fds: no CPU.  (Here a
 * sleep is the point of the test, not a way to wait for an event.) */
static void test_idle_uses_no_cpu(void **state)
{
    const char *tls[] = {"tcp", "sm"};
    for (size_t t = 0; t < FY_ARRAY_LEN(tls); t++) {
        fy_xfer_layout_t l = small_layout(16);
        side_t pf, dc;
        side_open(&pf, &l, 8, tls[t], 0x11);
        side_open(&dc, &l, 8, tls[t], 0xA5);
        int32_t a[2] = {0, 1};
        assert_int_equal(run_job(&pf, &dc, a, a, 2, 1), FY_OK);
        assert_int_equal(run_job(&dc, &pf, a, a, 2, 1), FY_OK);
        double c0 = cpu_seconds();
        struct timespec ts = {0, 500 * 1000 * 1000};
        nanosleep(&ts, NULL);
        double used = cpu_seconds() - c0;
        if (used > 0.05) fail_msg("%s: idle engines used %.3f s of CPU in 0.5 s", tls[t], used);
        side_close(&pf);
        side_close(&dc);
    }
}

/* Destroying the initiator ends every job, finished or not, exactly once. */
static void test_destroy_pending(void **state)
{
    fy_xfer_layout_t l = small_layout(16);
    side_t pf, dc;
    side_open(&pf, &l, 8, "tcp", 0x11);
    side_open(&dc, &l, 8, "tcp", 0xA5);
    const void *blob;
    size_t len;
    assert_int_equal(fy_xfer_target_desc(dc.x, &blob, &len), FY_OK);
    done_t d[3];
    fy_xfer_job_t *j;
    int32_t a = 0;
    for (int k = 0; k < 3; k++) {
        done_init(&d[k]);
        assert_int_equal(fy_xfer_job_begin(pf.x, blob, len, fy_now_s() + 30, on_done, &d[k], &j), FY_OK);
        assert_int_equal(fy_xfer_job_put(j, &a, &a, 1), FY_OK);
        /* job 0 never finishes, job 1 finishes, job 2 aborts */
        if (k == 1) fy_xfer_job_finish(j);
        if (k == 2) fy_xfer_job_abort(j);
    }
    assert_int_equal(done_wait(&d[1], 10), FY_OK);
    assert_int_equal(done_wait(&d[2], 10), FY_ERR_CANCELLED);
    fy_xfer_destroy(pf.x);
    pf.x = NULL;
    for (int k = 0; k < 3; k++) {
        assert_int_equal(done_calls(&d[k]), 1);
        done_fini(&d[k]);
    }
    assert_int_equal(d[0].st, FY_ERR_CANCELLED);
    side_close(&pf);
    side_close(&dc);
    fy_xfer_destroy(NULL);
}

/* Destroying the initiator flushes its connections first, so that no
 * target is still answering puts when they close (xfer.c,
 * shutdown_flush); a target that cannot answer (a stopped process) holds
 * the destroy for the flush's 2 s, no longer, and the warning names it. */
static void test_destroy_stuck_target(void **state)
{
    fy_xfer_layout_t l = small_layout(16);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {                     /* the target, in its own process so that it can be stopped */
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* stopped or not, it goes with this test */
        close(fds[0]);
        /* no cmocka assertion here: one failing would run the rest of
         * the suite in this process */
        fy_xfer_params_t p = {
            .layout = l, .arena_bytes = 8 * l.block_bytes, .transports = "tcp", .connect_timeout_s = 5};
        fy_xfer_t *x;
        const void *blob;
        size_t len;
        if (fy_xfer_create(&p, &x) != FY_OK || fy_xfer_target_desc(x, &blob, &len) != FY_OK) _exit(1);
        uint32_t n = (uint32_t)len;
        if (write(fds[1], &n, 4) != 4 || write(fds[1], blob, len) != (ssize_t)len) _exit(1);
        for (;;) pause(); /* until the parent kills it */
    }
    close(fds[1]);
    uint32_t n = 0;
    assert_int_equal(read(fds[0], &n, 4), 4);
    assert_true(n > 0 && n < 65536);
    uint8_t *blob = fy_malloc(n);
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fds[0], blob + got, n - got);
        assert_true(r > 0);
        got += (size_t)r;
    }
    close(fds[0]);
    side_t pf;
    side_open(&pf, &l, 8, "tcp", 0x11);
    int32_t a[2] = {0, 1};
    done_t d;
    fy_xfer_job_t *j;
    done_init(&d);
    assert_int_equal(fy_xfer_job_begin(pf.x, blob, n, fy_now_s() + 20, on_done, &d, &j), FY_OK);
    assert_int_equal(fy_xfer_job_put(j, a, a, 2), FY_OK);
    fy_xfer_job_finish(j);
    assert_int_equal(done_wait(&d, 20), FY_OK); /* connected, and the target answers */
    done_fini(&d);
    assert_int_equal(kill(child, SIGSTOP), 0);
    /* puts issued to the stopped target (their release says they left),
     * then an abort: the job ends without a flush */
    done_init(&d);
    rel_t r = {.lock = PTHREAD_MUTEX_INITIALIZER};
    assert_int_equal(fy_xfer_job_begin(pf.x, blob, n, fy_now_s() + 20, on_done, &d, &j), FY_OK);
    assert_int_equal(fy_xfer_job_put_then(j, a, a, 2, NULL, on_release, &r), FY_OK);
    for (int i = 0; i < 1000 && rel_count(&r) == 0; i++) usleep(10000);
    assert_int_equal(rel_count(&r), 1);
    fy_xfer_job_abort(j);
    assert_int_equal(done_wait(&d, 20), FY_ERR_CANCELLED);
    done_fini(&d);
    log_begin();
    double t0 = fy_now_s();
    fy_xfer_destroy(pf.x);
    double took = fy_now_s() - t0;
    log_end();
    pf.x = NULL;
    kill(child, SIGKILL);
    int wst;
    assert_int_equal(waitpid(child, &wst, 0), child);
    if (took < 1.9 || took > 8) fail_msg("destroy took %.2f s: the flush's bound is 2 s", took);
    assert_true(log_has("did not confirm its puts within 2 s of shutting down"));
    fy_free(blob);
    side_close(&pf);
}

static void test_bad_params(void **state)
{
    fy_xfer_layout_t l = small_layout(16);
    uint8_t *arena = fy_aligned_alloc(4096, 4 * l.block_bytes);
    fy_xfer_t *x = (fy_xfer_t *)0x1;
    log_begin();
    fy_xfer_params_t p = {.layout = l, .arena = arena, .arena_bytes = 4 * l.block_bytes - 1};
    assert_int_equal(fy_xfer_create(&p, &x), FY_ERR_INVALID);
    p.arena_bytes = 0;
    assert_int_equal(fy_xfer_create(&p, &x), FY_ERR_INVALID);
    p.arena_bytes = 4 * l.block_bytes;
    p.layout.block_bytes = 0;
    assert_int_equal(fy_xfer_create(&p, &x), FY_ERR_INVALID);
    p.layout = l;
    memset(p.layout.model_id, 'm', sizeof(p.layout.model_id));
    assert_int_equal(fy_xfer_create(&p, &x), FY_ERR_INVALID);
    p.layout = l;
    p.transports = "no-such-transport";
    assert_int_not_equal(fy_xfer_create(&p, &x), FY_OK);
    log_end();
    assert_ptr_equal(x, (fy_xfer_t *)0x1); /* out-params untouched on failure */
    fy_free(arena);
}

/* ---- where UCX listens ------------------------------------------------------------------------ */

/* The local addresses of this process's listening TCP sockets, one per
 * line ("127.0.0.1", "192.0.2.2", "::1"), from /proc/net/tcp{,6} matched
 * against the socket inodes in /proc/self/fd. */
static int listening_addrs(char (*out)[64], int cap)
{
    unsigned long inodes[1024];
    int n_in = 0;
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)) && n_in < 1024) {
        char path[300], target[64];
        snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
        ssize_t k = readlink(path, target, sizeof(target) - 1);
        if (k <= 0) continue;
        target[k] = '\0';
        unsigned long ino;
        if (sscanf(target, "socket:[%lu]", &ino) == 1) inodes[n_in++] = ino;
    }
    closedir(d);
    int n = 0;
    for (int v6 = 0; v6 < 2; v6++) {
        FILE *f = fopen(v6 ? "/proc/net/tcp6" : "/proc/net/tcp", "r");
        if (!f) continue;
        char line[512];
        while (fgets(line, sizeof(line), f)) {
            char local[64];
            unsigned st;
            unsigned long ino;
            if (sscanf(line, " %*d: %63[0-9A-Fa-f:] %*s %x %*s %*s %*s %*s %*s %lu", local, &st, &ino) != 3) continue;
            if (st != 0x0A) continue; /* LISTEN */
            bool mine = false;
            for (int i = 0; i < n_in; i++) mine |= inodes[i] == ino;
            if (!mine || n >= cap) continue;
            /* the kernel prints the address as 32-bit words in host order */
            uint8_t a[16];
            int words = v6 ? 4 : 1;
            for (int w = 0; w < words; w++) {
                uint32_t x;
                sscanf(local + 8 * w, "%8x", &x);
                memcpy(a + 4 * w, &x, 4);
            }
            inet_ntop(v6 ? AF_INET6 : AF_INET, a, out[n++], 64);
        }
        fclose(f);
    }
    return n;
}

static bool is_loopback_text(const char *a)
{
    return !strncmp(a, "127.", 4) || !strcmp(a, "::1") || !strncmp(a, "::ffff:127.", 11);
}

/* A non-loopback IPv4 address of this host, or false. */
static bool other_address(char *buf, size_t cap)
{
    struct ifaddrs *ifs, *i;
    bool found = false;
    if (getifaddrs(&ifs)) return false;
    for (i = ifs; i && !found; i = i->ifa_next)
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && !(i->ifa_flags & IFF_LOOPBACK) &&
            (i->ifa_flags & IFF_UP))
            found = inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, buf, (socklen_t)cap) != NULL;
    freeifaddrs(ifs);
    return found;
}

static void test_devices_for(void **state)
{
    char b[256] = "untouched";
    assert_int_equal(fy_xfer_devices_for("tcp://127.0.0.1:7420", b, sizeof(b)), FY_OK);
    assert_string_equal(b, "lo");
    assert_int_equal(fy_xfer_devices_for("ipc:///tmp/ferry.sock", b, sizeof(b)), FY_OK);
    assert_string_equal(b, "lo");
    assert_int_equal(fy_xfer_devices_for("tcp://[::1]:7420", b, sizeof(b)), FY_OK);
    assert_string_equal(b, "lo");
    assert_int_equal(fy_xfer_devices_for("tcp://localhost:7420", b, sizeof(b)), FY_OK);
    assert_string_equal(b, "lo");
    assert_int_equal(fy_xfer_devices_for("tcp://0.0.0.0:7420", b, sizeof(b)), FY_OK);
    assert_string_equal(b, ""); /* a wildcard: every interface */
    char other[64], url[128];
    if (other_address(other, sizeof(other))) {
        snprintf(url, sizeof(url), "tcp://%s:7420", other);
        assert_int_equal(fy_xfer_devices_for(url, b, sizeof(b)), FY_OK);
        assert_true(*b && strncmp(b, "lo", 2) != 0);
    }
    strcpy(b, "untouched");
    log_begin();
    assert_int_equal(fy_xfer_devices_for("tcp://198.51.100.77:7420", b, sizeof(b)), FY_ERR_INVALID);
    assert_true(log_has("no network interface has the address"));
    assert_int_equal(fy_xfer_devices_for("tcp://[::1:7420", b, sizeof(b)), FY_ERR_INVALID);
    assert_int_equal(fy_xfer_devices_for("tcp://127.0.0.1:1", b, 2), FY_ERR_NO_SPACE);
    log_end();
    assert_string_equal(b, "untouched"); /* written only on success */
}

/* A transfer engine told to use the loopback interface listens there and
 * nowhere else, and still moves blocks; without the list UCX listens on
 * every interface (what workers did with a loopback configuration). */
static void test_listens_where_told(void **state)
{
    char other[64];
    fy_xfer_layout_t l = small_layout(16);
    char devs[256];
    assert_int_equal(fy_xfer_devices_for("tcp://127.0.0.1:7420", devs, sizeof(devs)), FY_OK);
    side_t a, b;
    char addrs[64][64];
    for (int pass = 0; pass < 2; pass++) {
        bool bound = pass == 1;
        for (int k = 0; k < 2; k++) {
            side_t *s = k ? &b : &a;
            memset(s, 0, sizeof(*s));
            s->n_blocks = 16;
            s->block_bytes = l.block_bytes;
            s->bytes = 16 * l.block_bytes;
            s->own = true;
            s->arena = fy_aligned_alloc(4096, s->bytes);
            memset(s->arena, k ? 0 : 0x3C, s->bytes);
            fy_xfer_params_t p = {.layout = l,
                                  .arena = s->arena,
                                  .arena_bytes = s->bytes,
                                  .transports = "tcp",
                                  .net_devices = bound ? devs : NULL,
                                  .connect_timeout_s = 5};
            assert_int_equal(fy_xfer_create(&p, &s->x), FY_OK);
        }
        int n = listening_addrs(addrs, 64);
        int non_lo = 0;
        for (int i = 0; i < n; i++) non_lo += !is_loopback_text(addrs[i]);
        if (bound) {
            assert_true(n > 0);
            if (non_lo) fail_msg("bound to lo, yet listening on %d other address(es), e.g. %s", non_lo, addrs[0]);
            int32_t src[4] = {0, 1, 2, 3}, dst[4] = {8, 9, 10, 11};
            assert_int_equal(run_job(&a, &b, src, dst, 4, 1), FY_OK);
            for (int i = 0; i < 4; i++) assert_memory_equal(block(&a, src[i]), block(&b, dst[i]), l.block_bytes);
        } else if (other_address(other, sizeof(other))) {
            assert_true(non_lo > 0); /* the old behaviour, which the test above rules out */
        } else {
            fprintf(stderr, "note: no non-loopback interface here: only the bound case is checked\n");
        }
        side_close(&a);
        side_close(&b);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_diff),
        cmocka_unit_test(test_reshard),
        cmocka_unit_test(test_reshard_ucx),
        cmocka_unit_test(test_xgroup),
        cmocka_unit_test(test_put_then),
        cmocka_unit_test(test_bad_params),
        cmocka_unit_test(test_devices_for),
        cmocka_unit_test(test_listens_where_told),
        cmocka_unit_test(test_transfer_default),
        cmocka_unit_test(test_transfer_tcp),
        cmocka_unit_test(test_transfer_shm),
        cmocka_unit_test(test_transfer_tcp_ucx_arena),
        cmocka_unit_test(test_transfer_shm_ucx_arena),
        cmocka_unit_test(test_layout_mismatch),
        cmocka_unit_test(test_bad_blobs),
        cmocka_unit_test(test_deadline_abort_range),
        cmocka_unit_test(test_target_dies_tcp),
        cmocka_unit_test(test_target_dies_default),
        cmocka_unit_test(test_target_dies_shm),
        cmocka_unit_test(test_handshake_timeout),
        cmocka_unit_test(test_destroy_pending),
        cmocka_unit_test(test_destroy_stuck_target),
        cmocka_unit_test(test_idle_uses_no_cpu),
    };
    if (getenv("FERRY_TEST_DEBUG")) fy_log_set_level(FY_LOG_DEBUG);
    fprintf(stderr, "test_xfer: seed 0x%llx\n", (unsigned long long)SEED);
    return cmocka_run_group_tests(tests, NULL, NULL);
}

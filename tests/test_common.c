/*
 * test_common.c - common/'s small utilities: the clocks (common/clock.h:
 * monotonic seconds and nanoseconds agree and never go back, the wall
 * clock's epoch milliseconds, condition-variable deadlines carried into
 * whole seconds on either clock) and the string builder (common/strbuf.h:
 * appends and formats past its first allocation, and every allocation
 * failure reported once, at the end, with nothing freed twice).
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/envelope.h"
#include "common/mem.h"
#include "common/strbuf.h"
#include "tests/testutil.h"

/* ---- clock ---- */

static double ts_s(const struct timespec *ts) { return (double)ts->tv_sec + (double)ts->tv_nsec * 1e-9; }

static void test_now_monotonic(void **state)
{
    (void)state;
    double s0 = fy_now_s();
    uint64_t n0 = fy_now_ns();
    /* the same clock in two units */
    assert_true(fabs((double)n0 * 1e-9 - s0) < 0.05);
    double s = s0;
    uint64_t n = n0;
    for (int i = 0; i < 100000; i++) {
        double s2 = fy_now_s();
        uint64_t n2 = fy_now_ns();
        assert_true(s2 >= s);
        assert_true(n2 >= n);
        s = s2, n = n2;
    }
    struct timespec nap = {.tv_sec = 0, .tv_nsec = 20 * 1000000};
    while (nanosleep(&nap, &nap) == -1 && errno == EINTR) {}
    assert_true(fy_now_s() - s0 >= 0.020);
    assert_true(fy_now_ns() - n0 >= 20u * 1000000u);
    /* and it is CLOCK_MONOTONIC, which bench/run.c's clock_nanosleep and
     * the etcd client's condition variable take as the same time */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    assert_true(fabs(ts_s(&ts) - fy_now_s()) < 0.05);
}

static void test_wall_ms(void **state)
{
    (void)state;
    time_t before = time(NULL);
    int64_t ms = fy_wall_ms();
    time_t after = time(NULL);
    assert_true(ms >= (int64_t)before * 1000 && ms < ((int64_t)after + 1) * 1000);
    /* envelopes' time is the same clock */
    int64_t env = (int64_t)fy_env_now_ms();
    assert_true(env >= ms && env - ms < 5000);
}

static void test_deadline_in(void **state)
{
    (void)state;
    static const clockid_t clocks[2] = {CLOCK_REALTIME, CLOCK_MONOTONIC};
    /* fractions that carry into the next second from any tv_nsec, whole
     * seconds, none */
    static const double waits[] = {0, 1e-9, 0.010, 0.25, 0.5, 0.75, 0.999999999, 1.0, 1.5, 2, 90, 3600.125};
    for (int c = 0; c < 2; c++)
        for (size_t i = 0; i < FY_ARRAY_LEN(waits); i++)
            for (int rep = 0; rep < 200; rep++) { /* tv_nsec lands all over the second */
                struct timespec before, after, d;
                clock_gettime(clocks[c], &before);
                fy_deadline_in(clocks[c], waits[i], &d);
                clock_gettime(clocks[c], &after);
                if (d.tv_nsec < 0 || d.tv_nsec >= 1000000000L)
                    fail_msg("clock %d, %.9f s: tv_nsec %ld out of range", c, waits[i], d.tv_nsec);
                /* in integer nanoseconds: a double of 1e9 s keeps only
                 * about a hundred nanoseconds */
                int64_t dn = (int64_t)d.tv_sec * 1000000000 + d.tv_nsec;
                int64_t bn = (int64_t)before.tv_sec * 1000000000 + before.tv_nsec;
                int64_t an = (int64_t)after.tv_sec * 1000000000 + after.tv_nsec;
                int64_t want = (int64_t)(waits[i] * 1e9 + 0.5);
                if (dn - bn < want - 1 || dn - an > want + 1)
                    fail_msg("clock %d, %.9f s: the deadline is %lld ns after the call's start, %lld ns after its "
                             "end",
                             c, waits[i], (long long)(dn - bn), (long long)(dn - an));
            }
    /* a wait on a condition variable of each clock ends at its deadline */
    for (int c = 0; c < 2; c++) {
        pthread_condattr_t ca;
        pthread_cond_t cv;
        pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
        assert_int_equal(pthread_condattr_init(&ca), 0);
        assert_int_equal(pthread_condattr_setclock(&ca, clocks[c]), 0);
        assert_int_equal(pthread_cond_init(&cv, &ca), 0);
        double t0 = fy_now_s();
        struct timespec d;
        fy_deadline_in(clocks[c], 0.05, &d);
        pthread_mutex_lock(&mu);
        int rc;
        while ((rc = pthread_cond_timedwait(&cv, &mu, &d)) == 0) {}
        pthread_mutex_unlock(&mu);
        double took = fy_now_s() - t0;
        assert_int_equal(rc, ETIMEDOUT);
        if (took < 0.045 || took > 5) fail_msg("clock %d: a wait of 0.05 s took %.3f s", c, took);
        pthread_cond_destroy(&cv);
        pthread_condattr_destroy(&ca);
    }
}

/* ---- strbuf ---- */

static void test_strbuf_append_printf(void **state)
{
    (void)state;
    fy_strbuf_t b = {0};
    assert_null(b.p);
    fy_strbuf_puts(&b, "ab");
    fy_strbuf_append(&b, "c\0d", 3); /* bytes, a NUL among them */
    fy_strbuf_printf(&b, "[%d|%-4s|%.2f]", 42, "x", 0.5);
    fy_strbuf_puts(&b, "");
    static const char want[] = "abc\0d[42|x   |0.50]";
    assert_int_equal(b.len, sizeof(want) - 1);
    assert_memory_equal(b.p, want, sizeof(want)); /* the NUL after len too */
    assert_false(b.oom);
    size_t len = 0;
    char *s = fy_strbuf_take(&b, &len);
    assert_non_null(s);
    assert_int_equal(len, sizeof(want) - 1);
    assert_memory_equal(s, want, sizeof(want));
    assert_null(b.p); /* taken: the buffer is {0} again, and reusable */
    assert_int_equal(b.len, 0);
    assert_int_equal(b.cap, 0);
    fy_free(s);
    /* nothing appended: an empty string, the caller's to free */
    s = fy_strbuf_take(&b, &len);
    assert_non_null(s);
    assert_string_equal(s, "");
    assert_int_equal(len, 0);
    fy_free(s);
    fy_strbuf_free(&b); /* harmless on an empty buffer */
    fy_strbuf_free(&b);
}

static void test_strbuf_growth(void **state)
{
    (void)state;
    /* appends and formats past the first allocation, many times over,
     * against the same text built by hand */
    enum { N = 3000 };
    char *want = fy_malloc(N * 16 + 20000);
    assert_non_null(want);
    size_t wn = 0;
    fy_strbuf_t b = {0};
    for (int i = 0; i < N; i++) {
        if (i % 3 == 0) {
            fy_strbuf_printf(&b, "%d,", i);
            wn += (size_t)sprintf(want + wn, "%d,", i);
        } else {
            char piece[16];
            int k = snprintf(piece, sizeof(piece), "<%x>", (unsigned)i);
            fy_strbuf_append(&b, piece, (size_t)k);
            memcpy(want + wn, piece, (size_t)k);
            wn += (size_t)k;
        }
        assert_int_equal(b.len, wn);
        assert_true(b.cap > b.len);
    }
    /* one format longer than all the room left: formatted again after
     * the buffer grows */
    char big[9001];
    memset(big, 'q', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    size_t cap_before = b.cap;
    fy_strbuf_printf(&b, "{%s}", big);
    wn += (size_t)sprintf(want + wn, "{%s}", big);
    assert_true(b.cap > cap_before);
    /* and one that fills the room to the last byte before the NUL */
    size_t room = b.cap - b.len - 1;
    char *fill = fy_malloc(room + 1);
    assert_non_null(fill);
    memset(fill, 'z', room);
    fill[room] = '\0';
    cap_before = b.cap;
    fy_strbuf_printf(&b, "%s", fill);
    want = fy_realloc(want, wn + room + 1);
    assert_non_null(want);
    memcpy(want + wn, fill, room + 1);
    wn += room;
    fy_free(fill);
    assert_int_equal(b.cap, cap_before);
    assert_int_equal(b.len, b.cap - 1);
    assert_false(b.oom);
    size_t len;
    char *s = fy_strbuf_take(&b, &len);
    assert_int_equal(len, wn);
    assert_int_equal(strlen(s), wn);
    assert_memory_equal(s, want, wn + 1);
    fy_free(s);
    fy_free(want);
}

/* The same text, built with fy_strbuf_*, under failure injection. */
static void build_report(fy_strbuf_t *b)
{
    for (int i = 0; i < 400; i++) {
        fy_strbuf_printf(b, "line %d: ", i);
        fy_strbuf_puts(b, "a fairly long value to make the buffer grow");
        fy_strbuf_append(b, "\n", 1);
    }
}

static void test_strbuf_alloc_failure(void **state)
{
    (void)state;
    fy_strbuf_t ref = {0};
    build_report(&ref);
    size_t ref_len;
    char *want = fy_strbuf_take(&ref, &ref_len);
    assert_non_null(want);
    int failed = 0, built = 0;
    for (long k = 1; k < 12; k++) {
        fy_mem_fail_after(k);
        fy_strbuf_t b = {0};
        build_report(&b);
        bool oom = b.oom;
        size_t len = 0;
        char *s = fy_strbuf_take(&b, &len);
        fy_mem_fail_after(0);
        /* the flag stuck from the first failure to the end, and take
         * freed the text (ASan and glibc catch a second free below) */
        assert_true(!s == oom);
        assert_null(b.p);
        assert_false(b.oom);
        fy_strbuf_free(&b);
        if (s) {
            assert_int_equal(len, ref_len);
            assert_memory_equal(s, want, ref_len + 1);
            built++;
        } else {
            failed++;
        }
        fy_free(s);
    }
    assert_true(failed > 0 && built > 0); /* both paths were taken */
    /* a failure after appends were made: what was there is dropped */
    fy_strbuf_t b = {0};
    fy_strbuf_puts(&b, "kept until the failure");
    fy_mem_fail_after(1);
    char big[4096];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    fy_strbuf_printf(&b, "%s", big); /* past the first 1 KiB: a realloc, which fails */
    fy_mem_fail_after(0);
    assert_true(b.oom);
    assert_string_equal(b.p, "kept until the failure"); /* still terminated where it was */
    fy_strbuf_puts(&b, "more");                         /* sticky: nothing now, though memory is back */
    assert_true(b.oom);
    assert_int_equal(b.len, strlen("kept until the failure"));
    assert_null(fy_strbuf_take(&b, NULL));
    assert_null(b.p);
    fy_strbuf_free(&b);
    /* a caller's own allocation for the text failed: the same */
    fy_strbuf_puts(&b, "x");
    fy_strbuf_fail(&b);
    fy_strbuf_puts(&b, "y");
    assert_int_equal(b.len, 1);
    assert_null(fy_strbuf_take(&b, NULL));
    fy_free(want);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_now_monotonic), cmocka_unit_test(test_wall_ms),
        cmocka_unit_test(test_deadline_in),   cmocka_unit_test(test_strbuf_append_printf),
        cmocka_unit_test(test_strbuf_growth), cmocka_unit_test(test_strbuf_alloc_failure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_common.c - common/'s small utilities: the clocks (common/clock.h:
 * monotonic seconds and nanoseconds agree and never go back, the wall
 * clock's epoch milliseconds, condition-variable deadlines carried into
 * whole seconds on either clock).
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "envelope.h"
#include "mem.h"
#include "testutil.h"

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_now_monotonic),
        cmocka_unit_test(test_wall_ms),
        cmocka_unit_test(test_deadline_in),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

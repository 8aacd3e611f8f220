/* clock.c - the monotonic clock, the wall clock's epoch milliseconds and
 * condition-variable deadlines. */
#include "common/clock.h"

double fy_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

uint64_t fy_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int64_t fy_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void fy_deadline_in(clockid_t clock, double s, struct timespec *deadline)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    /* whole seconds apart from the fraction, so a long wait loses no
     * nanoseconds to a double's rounding */
    time_t whole = (time_t)s;
    long ns = ts.tv_nsec + (long)((s - (double)whole) * 1e9);
    ts.tv_sec += whole + ns / 1000000000L;
    ts.tv_nsec = ns % 1000000000L;
    *deadline = ts;
}

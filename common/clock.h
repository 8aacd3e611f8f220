/*
 * clock.h - the project's clocks.  Durations, deadlines and timestamps
 * that stay inside a process come from CLOCK_MONOTONIC (fy_now_s,
 * fy_now_ns), so a wall-clock step (NTP, an operator's date) never
 * stretches a timeout or makes a measured interval negative.  A wait on a
 * condition variable takes its deadline on the variable's own clock
 * (fy_deadline_in): CLOCK_MONOTONIC where pthread_condattr_setclock chose
 * it, the wall clock for a default one.
 *
 * The wall clock (CLOCK_REALTIME) has one use of its own: times that
 * another host reads, such as the signing time of an etcd membership
 * record, which a reader on another machine compares with its own clock
 * (fy_wall_ms).  It is kept a distinct function so that no duration is
 * taken from it by mistake.
 *
 * Envelopes' time (fy_env_now_ms, common/envelope.h) is fy_wall_ms too.
 * Not here: log lines' timestamps (common/log.c formats the wall clock's
 * timespec itself, async-signal-safely in the crash handler).
 *
 * Thread-safe; no state.
 */
#ifndef FY_CLOCK_H
#define FY_CLOCK_H

#include <stdint.h>
#include <time.h>

/* CLOCK_MONOTONIC, seconds (since an arbitrary start, the boot). */
double fy_now_s(void);
/* CLOCK_MONOTONIC, nanoseconds: intervals summed over many short calls
 * (profiles, spin limits) without a double's rounding. */
uint64_t fy_now_ns(void);

/* CLOCK_REALTIME, milliseconds since the Unix epoch: for times another
 * host reads (see above); never for a duration. */
int64_t fy_wall_ms(void);

/* *deadline = the clock's time s seconds from now (s >= 0), the
 * absolute time pthread_cond_timedwait takes.  clock is the condition
 * variable's: CLOCK_REALTIME for a default one, CLOCK_MONOTONIC for one
 * made with pthread_condattr_setclock. */
void fy_deadline_in(clockid_t clock, double s, struct timespec *deadline);

#endif /* FY_CLOCK_H */

/*
 * stats.h - the order statistics every bench command uses: a qsort
 * comparator for doubles, the median (the mean of the middle two for an
 * even count) and the upper median.  Static inline, so each command file stays one
 * translation unit.  The clock is common/clock.h's fy_now_s.
 */
#ifndef FY_BENCH_STATS_H
#define FY_BENCH_STATS_H

#include <stdlib.h>

static inline int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts v[0..n) in place; n > 0. */
static inline double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The upper median, v[n / 2] (0 for none); sorts v[0..n) in place: the
 * figures of bench-ttft and bench-grammar have always used it. */
static inline double median_upper(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n ? v[n / 2] : 0;
}

#endif /* FY_BENCH_STATS_H */

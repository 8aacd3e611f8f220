/*
 * cpuset.c - CPU lists: parse, count, apply (see cpuset.h).
 * Not here: choosing which CPUs a role gets (the configuration does).
 */
#include "common/cpuset.h"

#include <errno.h>
#include <sched.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"

static bool parse_num(const char **s, long *v_p)
{
    const char *p = *s;
    if (*p < '0' || *p > '9') return false;
    long v = 0;
    while (*p >= '0' && *p <= '9') {
        v = v * 10 + (*p++ - '0');
        if (v >= FY_CPUSET_MAX) return false;
    }
    *s = p;
    *v_p = v;
    return true;
}

fy_status_t fy_cpuset_parse(const char *what, const char *s, fy_cpuset_t *set_p)
{
    fy_cpuset_t set = {0};
    const char *p = s ? s : "";
    for (;;) {
        while (*p == ' ') p++;
        long lo, hi;
        if (!parse_num(&p, &lo)) goto bad;
        hi = lo;
        if (*p == '-') {
            p++;
            if (!parse_num(&p, &hi) || hi < lo) goto bad;
        }
        for (long c = lo; c <= hi; c++) set.bits[c / 64] |= 1ull << (c % 64);
        while (*p == ' ') p++;
        if (!*p) break;
        if (*p++ != ',') goto bad;
    }
    *set_p = set;
    return FY_OK;
bad:
    fy_error("%s = '%s': expected a CPU list such as 0-3,8 (CPUs below %d, ranges low-high)", what, s ? s : "",
             FY_CPUSET_MAX);
    return FY_ERR_INVALID;
}

int fy_cpuset_count(const fy_cpuset_t *set)
{
    int n = 0;
    for (int i = 0; i < FY_CPUSET_MAX / 64; i++) n += __builtin_popcountll(set->bits[i]);
    return n;
}

fy_status_t fy_cpuset_apply(const char *what, const fy_cpuset_t *set)
{
    cpu_set_t allowed, want;
    if (sched_getaffinity(0, sizeof(allowed), &allowed)) {
        fy_error("%s: sched_getaffinity: %s", what, strerror(errno));
        return FY_ERR_IO;
    }
    CPU_ZERO(&want);
    for (int c = 0; c < FY_CPUSET_MAX && c < CPU_SETSIZE; c++) {
        if (!(set->bits[c / 64] >> (c % 64) & 1)) continue;
        if (!CPU_ISSET(c, &allowed)) {
            fy_error("%s: CPU %d is not one this process may use (this machine has %ld online; taskset and cgroup "
                     "cpusets narrow it)",
                     what, c, sysconf(_SC_NPROCESSORS_ONLN));
            return FY_ERR_INVALID;
        }
        CPU_SET(c, &want);
    }
    if (!CPU_COUNT(&want)) {
        fy_error("%s: an empty CPU list", what);
        return FY_ERR_INVALID;
    }
    if (sched_setaffinity(0, sizeof(want), &want)) {
        fy_error("%s: sched_setaffinity: %s", what, strerror(errno));
        return FY_ERR_IO;
    }
    return FY_OK;
}

int fy_cpuset_usable(void)
{
    cpu_set_t s;
    if (!sched_getaffinity(0, sizeof(s), &s) && CPU_COUNT(&s) > 0) return CPU_COUNT(&s);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/*
 * cpuset.h - the CPUs a worker runs on: "0-3,8" lists as people write them
 * for taskset and cgroups' cpuset.cpus, parsed, applied to the process,
 * and counted.
 *
 * A prefill or decode worker with `cpus` set pins itself (every thread it
 * starts after inherits the mask), so prefill and decode pools get cores of
 * their own as they would get machines of their own in a datacenter.
 *
 * Not here: NUMA memory placement (the process's pages follow first touch).
 */
#ifndef FY_CPUSET_H
#define FY_CPUSET_H

#include <stdint.h>

#include "common/status.h"

#define FY_CPUSET_MAX 1024 /* CPU numbers 0..FY_CPUSET_MAX-1 */

typedef struct fy_cpuset {
    uint64_t bits[FY_CPUSET_MAX / 64];
} fy_cpuset_t;

/* "3", "0-3", "0-3,8,10-11": numbers below FY_CPUSET_MAX, ranges low-high,
 * no empty item.  FY_ERR_INVALID, logged naming `what`, for anything else. */
fy_status_t fy_cpuset_parse(const char *what, const char *s, fy_cpuset_t *set_p);
int fy_cpuset_count(const fy_cpuset_t *set);
/* Pins the calling process (its threads started afterwards inherit it).
 * A CPU this machine does not have, or one outside the cgroup's cpuset, is
 * FY_ERR_INVALID naming `what`; the mask is then unchanged. */
fy_status_t fy_cpuset_apply(const char *what, const fy_cpuset_t *set);
/* CPUs the calling thread may run on (its affinity mask: taskset, cgroup
 * cpusets), at least 1; what "one thread per core" means for a process. */
int fy_cpuset_usable(void);

#endif /* FY_CPUSET_H */

/*
 * authcost.h - `ferry-bench auth`: the control plane's envelope cost, per
 * message and per request round trip (authcost.c).
 */
#ifndef FY_BENCH_AUTHCOST_H
#define FY_BENCH_AUTHCOST_H

/* argv[0] is "auth"; returns the exit status. */
int fy_bench_auth_main(int argc, char **argv);

#endif /* FY_BENCH_AUTHCOST_H */

/*
 * bench_group.c - `ferry bench-group`: the rank group's collectives
 * (engine/group.h) on this host, for 2, 3 and 4 ranks by default.
 *
 *   all-reduce  f32 vectors from 576 floats (one token of SmolLM2-135M's
 *               hidden dim) to 4 MiB: median latency over reps and the
 *               bytes reduced per second (the vector's bytes over the
 *               median), against memcpy of the same bytes in this
 *               process in the same run (the reference: the least a
 *               reduction that must move the vector can cost);
 *   all-gather  the same vectors as the all-reduce's result, each rank
 *               contributing 1/ranks of them (rows 1): median latency
 *               against the same memcpy; the tensor ranks' gathers move
 *               these bytes, where they used to all-reduce with zeros;
 *   barrier     median latency;
 *   send/recv   rank 0 to rank 1, 64 KiB to 4 MiB: median time of a send
 *               that returns once rank 1 holds the bytes, and bytes per
 *               second; the other ranks wait in a barrier meanwhile.
 *
 * Every rank runs the same loop (SPMD); rank 0 times its own calls and
 * prints.  The reps are timed one by one and the median taken, so a
 * preempted rep (ranks share cores) moves the figure little.
 * Not here: what a sharded forward pass costs (bench-batch with ranks).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tools/cli.h"
#include "common/clock.h"
#include "tools/commands.h"
#include "engine/group.h"
#include "common/log.h"
#include "common/mem.h"
#include "bench/stats.h"

enum { MAX_RANK_SETS = 8, MAX_REPS = 100000 };

static const size_t AR_FLOATS[] = {576, 4096, 16384, 65536, 262144, 1048576}; /* 2.3 KiB .. 4 MiB */
static const size_t P2P_BYTES[] = {65536, 1048576, 4194304};
#define SLOT_BYTES ((size_t)4 << 20)

/* reps for a size: about 256 MiB moved, within [20, base] */
static int reps_for(size_t bytes, int base)
{
    size_t r = ((size_t)256 << 20) / (bytes ? bytes : 1);
    return (int)FY_MAX((size_t)20, FY_MIN(r, (size_t)base));
}

static void usage(FILE *f)
{
    fprintf(f, "usage: ferry bench-group [options]\n"
               "  the rank group's collectives between processes on this host: all-reduce latency and\n"
               "  bandwidth (576 floats to 4 MiB) against memcpy of the same bytes, all-gather of the\n"
               "  same results, barrier latency,\n"
               "  send/recv bandwidth\n"
               "  --ranks LIST   group sizes to measure, 2..64 (default 2,3,4)\n"
               "  --reps N       reps of the smallest sizes (default 2000; large sizes use fewer,\n"
               "                 at least 20); the figure is the median\n"
               "  -h, --help\n");
}

/* memcpy of each all-reduce size in this process: the reference */
static void memcpy_ref(double *ref_s, int base)
{
    size_t max = AR_FLOATS[FY_ARRAY_LEN(AR_FLOATS) - 1] * sizeof(float);
    char *a = fy_malloc(max), *b = fy_malloc(max);
    double *t = fy_malloc(sizeof(double) * (size_t)base);
    if (!a || !b || !t) {
        for (size_t k = 0; k < FY_ARRAY_LEN(AR_FLOATS); k++) ref_s[k] = 0;
        goto out;
    }
    memset(a, 1, max);
    memset(b, 2, max);
    for (size_t k = 0; k < FY_ARRAY_LEN(AR_FLOATS); k++) {
        size_t bytes = AR_FLOATS[k] * sizeof(float);
        int reps = reps_for(bytes, base);
        for (int i = 0; i < reps; i++) {
            double t0 = fy_now_s();
            memcpy(b, a, bytes);
            __asm__ __volatile__("" ::"r"(b) : "memory"); /* keep the copy */
            t[i] = fy_now_s() - t0;
        }
        ref_s[k] = median(t, reps);
    }
out:
    fy_free(a);
    fy_free(b);
    fy_free(t);
}

typedef struct figures {
    double ar_s[FY_ARRAY_LEN(AR_FLOATS)];
    double ag_s[FY_ARRAY_LEN(AR_FLOATS)]; /* all-gather of (floats / ranks) * ranks floats */
    double barrier_s;
    double p2p_s[FY_ARRAY_LEN(P2P_BYTES)];
} figures_t;

/* Every rank runs this; rank 0's timings land in *f. */
static fy_status_t run_rank(fy_group_t *g, int base, figures_t *f)
{
    int32_t rank = fy_group_rank(g), n = fy_group_size(g);
    float *x = fy_malloc(SLOT_BYTES);
    char *buf = fy_malloc(SLOT_BYTES);
    float *all = fy_malloc(SLOT_BYTES);
    double *t = fy_malloc(sizeof(double) * (size_t)base);
    fy_status_t st = FY_ERR_NOMEM;
    if (!x || !buf || !all || !t) goto out;
    for (size_t i = 0; i < SLOT_BYTES / sizeof(float); i++) x[i] = (float)(rank + 1) * 1e-3f;
    memset(buf, rank, SLOT_BYTES);

    for (size_t k = 0; k < FY_ARRAY_LEN(AR_FLOATS); k++) {
        size_t nf = AR_FLOATS[k];
        int reps = reps_for(nf * sizeof(float), base);
        for (int i = 0; i < 3; i++) /* warm-up: pages, caches */
            if ((st = fy_group_allreduce_f32(g, 0, n, x, nf)) != FY_OK) goto out;
        for (int i = 0; i < reps; i++) {
            double t0 = fy_now_s();
            if ((st = fy_group_allreduce_f32(g, 0, n, x, nf)) != FY_OK) goto out;
            t[i] = fy_now_s() - t0;
            /* keep the values finite: they grow n-fold every rep (identically on every rank) */
            if (x[0] > 1e30f)
                for (size_t j = 0; j < nf; j++) x[j] = 1e-3f;
        }
        f->ar_s[k] = median(t, reps);
    }

    for (size_t k = 0; k < FY_ARRAY_LEN(AR_FLOATS); k++) {
        size_t piece = AR_FLOATS[k] / (size_t)n * sizeof(float);
        int reps = reps_for(piece * (size_t)n, base);
        for (int i = 0; i < 3 + reps; i++) { /* three warm-up calls first */
            double t0 = fy_now_s();
            if ((st = fy_group_allgather(g, 0, n, x, 1, piece, all)) != FY_OK) goto out;
            if (i >= 3) t[i - 3] = fy_now_s() - t0;
        }
        f->ag_s[k] = median(t, reps);
    }

    for (int i = 0; i < base; i++) {
        double t0 = fy_now_s();
        if ((st = fy_group_barrier(g)) != FY_OK) goto out;
        t[i] = fy_now_s() - t0;
    }
    f->barrier_s = median(t, base);

    for (size_t k = 0; k < FY_ARRAY_LEN(P2P_BYTES); k++) {
        size_t bytes = P2P_BYTES[k];
        int reps = reps_for(bytes, base);
        for (int i = 0; i < reps + 2; i++) {
            double t0 = fy_now_s();
            if (rank == 0)
                st = fy_group_send(g, 1, buf, bytes);
            else if (rank == 1)
                st = fy_group_recv(g, 0, buf, bytes);
            else
                st = FY_OK;
            if (st != FY_OK) goto out;
            if (i >= 2) t[i - 2] = fy_now_s() - t0;
        }
        f->p2p_s[k] = median(t, reps);
        if ((st = fy_group_barrier(g)) != FY_OK) goto out;
    }
    st = FY_OK;
out:
    fy_free(x);
    fy_free(buf);
    fy_free(all);
    fy_free(t);
    return st;
}

int fy_cmd_bench_group(int argc, char **argv)
{
    static const struct option opts[] = {
        {"ranks", required_argument, 0, 'r'}, {"reps", required_argument, 0, 'n'}, {"help", no_argument, 0, 'h'}, {0}};
    int sets[MAX_RANK_SETS] = {2, 3, 4}, n_sets = 3;
    long base = 2000;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'r':
            if (!fy_cli_parse_int_list("--ranks", optarg, 2, 64, sets, MAX_RANK_SETS, &n_sets)) return 2;
            break;
        case 'n':
            if (!fy_cli_parse_int("--reps", optarg, 20, MAX_REPS, &base)) return 2;
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!fy_cli_no_operands("bench-group", argc, argv, usage)) return 2;

    double ref_s[FY_ARRAY_LEN(AR_FLOATS)];
    memcpy_ref(ref_s, (int)base);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    printf("bench-group: %ld CPUs; medians over reps; memcpy in one process is the reference\n", cpus);

    figures_t all[MAX_RANK_SETS];
    memset(all, 0, sizeof(all));
    for (int s = 0; s < n_sets; s++) {
        fflush(stdout); /* the children must not inherit unwritten output */
        fy_group_params_t p = {.n_ranks = sets[s], .slot_bytes = SLOT_BYTES, .cmd_bytes = 64, .timeout_ms = 60000};
        fy_group_t *g;
        int32_t rank;
        if (fy_group_spawn(&p, &g, &rank) != FY_OK) return 1;
        figures_t f;
        memset(&f, 0, sizeof(f));
        fy_status_t st = run_rank(g, (int)base, &f);
        if (rank != 0) {
            if (st != FY_OK) fy_group_abort(g, fy_status_str(st));
            const void *cmd;
            size_t len;
            fy_group_wait_cmd(g, &cmd, &len); /* until rank 0 destroys the group */
            fy_group_destroy(g);
            _exit(st == FY_OK ? 0 : 1);
        }
        fy_group_destroy(g);
        if (st != FY_OK) {
            fprintf(stderr, "bench-group: %d ranks: %s\n", sets[s], fy_status_str(st));
            return 1;
        }
        all[s] = f;
    }

    printf("\nall-reduce (f32, sum over every rank, rank order)\n");
    printf("%6s %9s %10s %12s %10s %12s %10s %8s\n", "ranks", "floats", "bytes", "median_us", "GB/s", "memcpy_us",
           "memcpy_GB/s", "x_memcpy");
    for (int s = 0; s < n_sets; s++)
        for (size_t k = 0; k < FY_ARRAY_LEN(AR_FLOATS); k++) {
            double bytes = (double)AR_FLOATS[k] * sizeof(float), ar = all[s].ar_s[k], ref = ref_s[k];
            printf("%6d %9zu %10.0f %12.2f %10.2f %12.2f %10.2f %8.1f\n", sets[s], AR_FLOATS[k], bytes, ar * 1e6,
                   bytes / ar / 1e9, ref * 1e6, ref > 0 ? bytes / ref / 1e9 : 0.0, ref > 0 ? ar / ref : 0.0);
        }
    printf("\nall-gather (rows 1, each rank's piece floats / ranks; memcpy of the floats is the reference)\n");
    printf("%6s %9s %10s %12s %10s %12s %8s %8s\n", "ranks", "floats", "bytes", "median_us", "GB/s", "memcpy_us",
           "x_memcpy", "x_allred");
    for (int s = 0; s < n_sets; s++)
        for (size_t k = 0; k < FY_ARRAY_LEN(AR_FLOATS); k++) {
            size_t nf = AR_FLOATS[k] / (size_t)sets[s] * (size_t)sets[s];
            double bytes = (double)nf * sizeof(float), ag = all[s].ag_s[k], ref = ref_s[k];
            printf("%6d %9zu %10.0f %12.2f %10.2f %12.2f %8.1f %8.2f\n", sets[s], nf, bytes, ag * 1e6, bytes / ag / 1e9,
                   ref * 1e6, ref > 0 ? ag / ref : 0.0, ag / all[s].ar_s[k]);
        }
    printf("\nbarrier (every rank)\n%6s %12s\n", "ranks", "median_us");
    for (int s = 0; s < n_sets; s++) printf("%6d %12.2f\n", sets[s], all[s].barrier_s * 1e6);
    printf("\nsend/recv (rank 0 to rank 1; a send returns once rank 1 holds the bytes)\n");
    printf("%6s %10s %12s %10s\n", "ranks", "bytes", "median_us", "GB/s");
    for (int s = 0; s < n_sets; s++)
        for (size_t k = 0; k < FY_ARRAY_LEN(P2P_BYTES); k++)
            printf("%6d %10zu %12.2f %10.2f\n", sets[s], P2P_BYTES[k], all[s].p2p_s[k] * 1e6,
                   (double)P2P_BYTES[k] / all[s].p2p_s[k] / 1e9);
    return 0;
}

/*
 * bench_xfer.c - `ferry bench-xfer`: KV transfer throughput of transfer/
 * between two processes, against ucx_perftest's ucp_put_bw as the
 * reference for what UCX itself does on the same transport.
 *
 * The payload is the KV of one prompt (default: 2,048 tokens of
 * SmolLM2-135M, 30 layers x 3 KV heads x 64, f16, 16-token blocks: 128
 * blocks of 368,640 bytes, 47.2 MB).  For each transport the command forks
 * the prefill side (the initiator), which forks the decode side (the put
 * target: it sends its target descriptor up a pipe, and lets fy_xfer
 * allocate its arena, as a decode worker should).  Each job puts every
 * block and waits for its flush; the figure is the median over --reps
 * jobs, after one warm-up job that also makes the connection.  Then
 * ucx_perftest runs with the same transport.  Destination patterns:
 *   contiguous  all blocks in one run: one put;
 *   runs        runs of 2 to 6 consecutive blocks, as a decode worker's
 *               block pool hands them out after some churn;
 *   scattered   no two destination blocks adjacent: one put per block.
 * The destination bytes are checked after the last job of each pattern.
 * No model file is needed: the shape comes from the options.
 */
#include <errno.h>
#include <getopt.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tools/cli.h"
#include "common/clock.h"
#include "tools/commands.h"
#include "common/log.h"
#include "common/mem.h"
#include "transfer/xfer.h"
#include "bench/stats.h"

#define MAX_TLS 8

typedef struct shape {
    long layers, kv_heads, head_dim, block_size, tokens;
    uint64_t block_bytes;
    int32_t n_blocks;      /* blocks of the prompt: the source arena */
    int32_t target_blocks; /* the decode arena: room to scatter into */
    bool target_own_arena; /* the target brings a malloc'd arena instead of fy_xfer's */
} shape_t;

typedef struct pattern {
    const char *name;
    int32_t *src, *dst; /* [n_blocks] */
    int32_t n_puts;
} pattern_t;

/* ---- deterministic contents: both processes can compute block b ------------------------------ */

static uint64_t mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void fill_block(uint8_t *p, int32_t b, uint64_t bytes)
{
    for (uint64_t i = 0; i < bytes; i += 8) {
        uint64_t v = mix(((uint64_t)b << 40) ^ i ^ 0x5eedull);
        memcpy(p + i, &v, FY_MIN(8, bytes - i));
    }
}

/* ---- pipes --------------------------------------------------------------------------------- */

static bool write_all(int fd, const void *buf, size_t n)
{
    const uint8_t *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

static bool read_all(int fd, void *buf, size_t n)
{
    uint8_t *p = buf;
    while (n) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        p += r;
        n -= (size_t)r;
    }
    return true;
}

/* shared memory is only usable without peer failure detection (xfer.h) */
static bool is_shm(const char *tls)
{
    return !strstr(tls, "tcp") && (strstr(tls, "sm") || strstr(tls, "posix") || strstr(tls, "sysv") ||
                                   strstr(tls, "cma") || strstr(tls, "shm"));
}

static fy_xfer_layout_t make_layout(const shape_t *s)
{
    fy_xfer_layout_t l = {.dtype = 1 /* f16 */,
                          .block_size = (int32_t)s->block_size,
                          .n_layers = (int32_t)s->layers,
                          .n_kv_heads = (int32_t)s->kv_heads,
                          .head_dim = (int32_t)s->head_dim,
                          .order = FY_XFER_ORDER_BLOCK_MAJOR,
                          .block_bytes = s->block_bytes};
    snprintf(l.model_id, sizeof(l.model_id), "bench-xfer/%ldx%ldx%ld", s->layers, s->kv_heads, s->head_dim);
    fy_xfer_layout_whole(&l);
    return l;
}

/* The prefill side brings its own arena (*arena_p set on return, fy_free
 * it); the decode side lets fy_xfer allocate one (*arena_p NULL: see
 * fy_xfer_arena), as a decode worker should. */
static fy_status_t open_side(const shape_t *s, const char *tls, int32_t blocks, bool own, uint8_t **arena_p,
                             fy_xfer_t **x_p)
{
    size_t bytes = (size_t)blocks * s->block_bytes;
    uint8_t *arena = NULL;
    if (own && !(arena = fy_aligned_alloc(4096, bytes))) {
        fy_error("bench-xfer: out of memory for a %zu-byte arena", bytes);
        return FY_ERR_NOMEM;
    }
    fy_xfer_params_t p = {.layout = make_layout(s),
                          .arena = arena,
                          .arena_bytes = bytes,
                          .transports = tls,
                          .connect_timeout_s = 10,
                          .err_mode = is_shm(tls) ? FY_XFER_ERRMODE_NONE : FY_XFER_ERRMODE_PEER};
    fy_status_t st = fy_xfer_create(&p, x_p);
    if (st != FY_OK) {
        fy_free(arena);
        return st;
    }
    memset(fy_xfer_arena(*x_p), 0, bytes); /* touch every page before timing */
    *arena_p = arena;
    return FY_OK;
}

/* Each side on its own core where there are two: the target on cpu 0, the
 * initiator on the last.  Left to the scheduler, TCP throughput on the
 * 2-core test machine averaged 2.4-3.3 GB/s over quiet runs, pinned
 * 3.6-3.9.  Workers on different cores or hosts are the real deployment;
 * ucx_perftest is pinned the same way (-c). */
static int g_ncpu;

static void pin(int cpu)
{
    if (g_ncpu < 2) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof(set), &set)) perror("bench-xfer: sched_setaffinity");
}

/* ---- the target process ---------------------------------------------------------------------- */

enum { CMD_CLEAR = 'C', CMD_VERIFY = 'V', CMD_QUIT = 'Q' };

/* Serves the parent: its descriptor up `up`, then clear/verify commands
 * from `down` until it closes. */
static int target_main(const shape_t *s, const char *tls, int down, int up)
{
    uint8_t *own;
    fy_xfer_t *x;
    if (open_side(s, tls, s->target_blocks, s->target_own_arena, &own, &x) != FY_OK) return 1;
    uint8_t *arena = fy_xfer_arena(x);
    const void *blob;
    size_t len;
    fy_xfer_target_desc(x, &blob, &len);
    uint32_t len32 = (uint32_t)len;
    int rc = 1;
    uint8_t *want = fy_malloc(s->block_bytes);
    int32_t *pairs = fy_malloc(2 * (size_t)s->n_blocks * sizeof(int32_t));
    if (!want || !pairs || !write_all(up, &len32, 4) || !write_all(up, blob, len)) goto out;
    for (;;) {
        char c;
        if (!read_all(down, &c, 1) || c == CMD_QUIT) break;
        char ok = 'Y';
        if (c == CMD_CLEAR) {
            memset(arena, 0, (size_t)s->target_blocks * s->block_bytes);
        } else if (c == CMD_VERIFY) {
            if (!read_all(down, pairs, 2 * (size_t)s->n_blocks * sizeof(int32_t))) break;
            for (int32_t i = 0; i < s->n_blocks && ok == 'Y'; i++) {
                fill_block(want, pairs[i], s->block_bytes);
                if (memcmp(want, arena + (size_t)pairs[s->n_blocks + i] * s->block_bytes, s->block_bytes)) ok = 'N';
            }
        }
        if (!write_all(up, &ok, 1)) break;
    }
    rc = 0;
out:
    fy_free(want);
    fy_free(pairs);
    fy_xfer_destroy(x);
    fy_free(own);
    return rc;
}

/* ---- patterns ------------------------------------------------------------------------------ */

static uint64_t rnd(uint64_t *s)
{
    *s += 0x9e3779b97f4a7c15ull;
    return mix(*s);
}

static int32_t count_puts(const int32_t *src, const int32_t *dst, int32_t n)
{
    int32_t r = 0;
    for (int32_t i = 0; i < n; i++)
        if (i == 0 || src[i] != src[i - 1] + 1 || dst[i] != dst[i - 1] + 1) r++;
    return r;
}

/* Destination runs of lo..hi blocks, each followed by a gap of at least
 * one block, used in shuffled order; the sources are 0..n-1 in order. */
static bool make_runs(pattern_t *p, int32_t n, int32_t lo, int32_t hi, uint64_t seed)
{
    int32_t *len = fy_malloc((size_t)n * sizeof(int32_t)), *order = fy_malloc((size_t)n * sizeof(int32_t));
    if (!len || !order) {
        fy_free(len);
        fy_free(order);
        return false;
    }
    int32_t nr = 0, total = 0;
    while (total < n) {
        int32_t l = lo + (int32_t)(rnd(&seed) % (uint64_t)(hi - lo + 1));
        if (l > n - total) l = n - total;
        len[nr++] = l;
        total += l;
    }
    /* run k's slot starts at k * (hi + 1), which leaves a gap after every
     * run; the slots are handed out in shuffled order */
    for (int32_t k = 0; k < nr; k++) order[k] = k;
    for (int32_t k = nr - 1; k > 0; k--) {
        int32_t m = (int32_t)(rnd(&seed) % (uint64_t)(k + 1)), t = order[k];
        order[k] = order[m];
        order[m] = t;
    }
    int32_t i = 0;
    for (int32_t k = 0; k < nr; k++)
        for (int32_t b = 0; b < len[k]; b++, i++) {
            p->src[i] = i;
            p->dst[i] = order[k] * (hi + 1) + b;
        }
    p->n_puts = count_puts(p->src, p->dst, n);
    fy_free(len);
    fy_free(order);
    return true;
}

/* ---- ucx_perftest ------------------------------------------------------------------------------ */

static const char *find_perftest(void)
{
    static const char *paths[] = {"/usr/bin/ucx_perftest", "/usr/local/bin/ucx_perftest"};
    for (size_t i = 0; i < FY_ARRAY_LEN(paths); i++)
        if (access(paths[i], X_OK) == 0) return paths[i];
    return NULL;
}

/* the UCX setting transfer/ makes for itself (xfer.c), so that the
 * reference runs the same UCX configuration */
#define PERF_ENV "UCX_TCP_TX_SEG_SIZE=${UCX_TCP_TX_SEG_SIZE:-64k}"
/* At most this many puts in flight.  Unbounded (ucx_perftest's default),
 * 47 MB puts over TCP pile up in UCX's software RMA and it measured
 * 0.06-0.25 GB/s, against 4 GB/s bounded; ferry has one job in flight. */
#define PERF_OUTSTANDING 8

/* One client run against a fresh server; bandwidth in GB/s (1e9), or < 0. */
static double perftest_once(const char *bin, const char *tls, uint64_t size, long iters, int port)
{
    fflush(NULL); /* or the child's freopen writes our buffered output again */
    pid_t srv = fork();
    if (srv < 0) return -1;
    if (srv == 0) {
        setenv("UCX_TLS", tls, 1);
        if (!getenv("UCX_TCP_TX_SEG_SIZE")) setenv("UCX_TCP_TX_SEG_SIZE", "64k", 1);
        char p[16];
        snprintf(p, sizeof(p), "%d", port);
        if (!freopen("/dev/null", "w", stdout) || !freopen("/dev/null", "w", stderr)) _exit(127);
        if (g_ncpu >= 2)
            execl(bin, bin, "-p", p, "-c", "0", (char *)NULL);
        else
            execl(bin, bin, "-p", p, (char *)NULL);
        _exit(127);
    }
    double gbps = -1;
    char cmd[512], client_cpu[16] = "";
    if (g_ncpu >= 2) snprintf(client_cpu, sizeof(client_cpu), "-c %d", g_ncpu - 1);
    snprintf(cmd, sizeof(cmd),
             "UCX_TLS='%s' %s timeout 60 %s 127.0.0.1 -p %d -t ucp_put_bw -O %d -s %llu -n %ld -w %ld %s 2>&1", tls,
             PERF_ENV, bin, port, PERF_OUTSTANDING, (unsigned long long)size, iters, FY_MAX(5, iters / 10), client_cpu);
    /* the server needs a moment to listen: retry a refused connection */
    for (int attempt = 0; attempt < 20 && gbps < 0; attempt++) {
        struct timespec ts = {0, 150 * 1000 * 1000};
        nanosleep(&ts, NULL);
        FILE *f = popen(cmd, "r");
        if (!f) break;
        char line[512];
        bool refused = false;
        while (fgets(line, sizeof(line), f)) {
            double it, p50, avg, overall, bw_avg, bw_overall;
            if (sscanf(line, " Final: %lf %lf %lf %lf %lf %lf", &it, &p50, &avg, &overall, &bw_avg, &bw_overall) == 6)
                gbps = bw_overall * 1048576.0 / 1e9; /* ucx_perftest's MB are MiB */
            if (strstr(line, "refused") || strstr(line, "connect")) refused = true;
        }
        pclose(f);
        if (!refused) break;
    }
    kill(srv, SIGTERM);
    waitpid(srv, NULL, 0);
    return gbps;
}

/* Two runs: a short one to learn the rate, then one of about `secs`, at
 * least PERF_MIN_ITERS long (over TCP a few 47 MB puts gave anything from
 * 0.07 to 2.5 GB/s from one run of the same command to the next). */
#define PERF_MIN_ITERS 30
static double perftest(const char *bin, const char *tls, uint64_t size, double secs, int *port)
{
    long iters = FY_MAX(8L, (long)((256ull << 20) / size));
    double g = perftest_once(bin, tls, size, iters, (*port)++);
    if (g <= 0) return g;
    iters = (long)(secs * g * 1e9 / (double)size);
    iters = FY_MIN(FY_MAX(iters, (long)PERF_MIN_ITERS), 1000000L);
    return perftest_once(bin, tls, size, iters, (*port)++);
}

/* ---- the prefill side ------------------------------------------------------------------------ */

typedef struct waiter {
    volatile int done; /* written by the transfer thread; read after a pipe wake-up */
    fy_status_t st;
    char msg[256];
    int fd[2]; /* the callback writes a byte: the main thread blocks on it */
} waiter_t;

static void on_done(void *arg, fy_status_t st, const char *message)
{
    waiter_t *w = arg;
    w->st = st;
    snprintf(w->msg, sizeof(w->msg), "%s", message ? message : "");
    w->done = 1;
    char c = 1;
    if (write(w->fd[1], &c, 1) < 0) perror("bench-xfer: pipe");
}

static fy_status_t run_job(fy_xfer_t *x, const void *blob, size_t len, const pattern_t *p, int32_t n, waiter_t *w,
                           double *secs_p)
{
    fy_xfer_job_t *j;
    w->done = 0;
    double t0 = fy_now_s();
    fy_status_t st = fy_xfer_job_begin(x, blob, len, t0 + 30, on_done, w, &j);
    if (st != FY_OK) return st;
    st = fy_xfer_job_put(j, p->src, p->dst, n);
    fy_xfer_job_finish(j);
    char c;
    if (!read_all(w->fd[0], &c, 1)) return FY_ERR_IO;
    double t1 = fy_now_s();
    if (st == FY_OK) st = w->st;
    if (st != FY_OK) fy_error("bench-xfer: %s job failed: %s: %s", p->name, fy_status_str(st), w->msg);
    *secs_p = t1 - t0;
    return st;
}

static char g_lanes[256];

static void lane_sink(fy_log_level_t level, const char *line, void *arg)
{
    const char *s = strstr(line, "xfer: connected to ");
    if (s && (s = strstr(s, " over ")))
        snprintf(g_lanes, sizeof(g_lanes), "%s", s + 6);
    else if (level <= FY_LOG_WARN)
        fprintf(stderr, "%s\n", line);
}

typedef struct row {
    const char *tls, *pattern;
    double put_bytes, ferry_gbps, perf_gbps;
    bool verified;
} row_t;

typedef struct result {
    double put_bytes, ferry_gbps;
    char verified;
} result_t;

/* The initiator process for one transport: forks the target, runs every
 * pattern, and writes one result_t per pattern to `out`. */
static int initiator_main(const shape_t *s, const char *tls, const pattern_t *pats, int n_pats, int reps, int out)
{
    int down[2], up[2];
    if (pipe(down) || pipe(up)) {
        perror("bench-xfer: pipe");
        return 1;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        perror("bench-xfer: fork");
        return 1;
    }
    if (pid == 0) {
        close(down[1]);
        close(up[0]);
        pin(0);
        _exit(target_main(s, tls, down[0], up[1]));
    }
    close(down[0]);
    close(up[1]);
    pin(g_ncpu - 1); /* before the transfer thread starts: it inherits this */
    int rc = 1;
    uint8_t *arena = NULL, *blob = NULL;
    fy_xfer_t *x = NULL;
    waiter_t w = {.fd = {-1, -1}};
    double *secs = fy_calloc((size_t)reps, sizeof(double));
    uint32_t len = 0;
    if (!secs || pipe(w.fd)) goto out;
    if (!read_all(up[0], &len, 4) || len == 0 || len > (1u << 20) || !(blob = fy_malloc(len)) ||
        !read_all(up[0], blob, len)) {
        fy_error("bench-xfer: the target process (%s) did not send its descriptor", tls);
        goto out;
    }
    if (open_side(s, tls, s->n_blocks, true, &arena, &x) != FY_OK) goto out;
    for (int32_t b = 0; b < s->n_blocks; b++) fill_block(arena + (size_t)b * s->block_bytes, b, s->block_bytes);

    for (int k = 0; k < n_pats; k++) {
        const pattern_t *p = &pats[k];
        char c = CMD_CLEAR, ok;
        if (!write_all(down[1], &c, 1) || !read_all(up[0], &ok, 1)) goto out;
        double t;
        g_lanes[0] = '\0';
        fy_log_level_t lvl = fy_log_get_level();
        if (k == 0) { /* the warm-up connects: catch the transports UCX chose */
            fy_log_set_sink(lane_sink, NULL);
            fy_log_set_level(FY_LOG_DEBUG);
        }
        fy_status_t st = run_job(x, blob, len, p, s->n_blocks, &w, &t); /* warm-up */
        if (k == 0) {
            fy_log_set_level(lvl);
            fy_log_set_sink(NULL, NULL);
            printf("%s: ferry's connection uses %s (peer failure %s)\n", tls, g_lanes[0] ? g_lanes : "?",
                   is_shm(tls) ? "not detected: UCX 1.13 shm needs that" : "detected");
        }
        for (int r = 0; r < reps && st == FY_OK; r++) st = run_job(x, blob, len, p, s->n_blocks, &w, &secs[r]);
        if (st != FY_OK) goto out;
        qsort(secs, (size_t)reps, sizeof(double), cmp_double);
        double med = reps % 2 ? secs[reps / 2] : 0.5 * (secs[reps / 2 - 1] + secs[reps / 2]);
        c = CMD_VERIFY;
        if (!write_all(down[1], &c, 1) || !write_all(down[1], p->src, (size_t)s->n_blocks * sizeof(int32_t)) ||
            !write_all(down[1], p->dst, (size_t)s->n_blocks * sizeof(int32_t)) || !read_all(up[0], &ok, 1))
            goto out;
        result_t res = {.put_bytes = (double)s->n_blocks * (double)s->block_bytes / p->n_puts,
                        .ferry_gbps = (double)s->n_blocks * (double)s->block_bytes / med / 1e9,
                        .verified = ok};
        if (ok != 'Y') fy_error("bench-xfer: %s, %s: destination bytes differ from the source", tls, p->name);
        if (!write_all(out, &res, sizeof(res))) goto out;
    }
    rc = 0;
out:
    if (x) fy_xfer_destroy(x);
    fy_free(arena);
    fy_free(blob);
    fy_free(secs);
    if (w.fd[0] >= 0) close(w.fd[0]);
    if (w.fd[1] >= 0) close(w.fd[1]);
    char q = CMD_QUIT;
    if (!write_all(down[1], &q, 1)) { /* the target is gone already */
    }
    close(down[1]);
    close(up[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status)) {
        fy_error("bench-xfer: the target process (%s) failed", tls);
        rc = 1;
    }
    fflush(NULL);
    return rc;
}

/* One transport: ferry in two fresh processes, then ucx_perftest.  This
 * process never initializes UCX, so every run starts from the same state
 * and nothing is forked from a process with a transfer thread. */
static int bench_transport(const shape_t *s, const char *tls, const pattern_t *pats, int n_pats, int reps,
                           const char *perf_bin, double perf_secs, int *port, row_t *rows, int *n_rows)
{
    int res[2];
    if (pipe(res)) {
        perror("bench-xfer: pipe");
        return 1;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        perror("bench-xfer: fork");
        return 1;
    }
    if (pid == 0) {
        close(res[0]);
        int rc = initiator_main(s, tls, pats, n_pats, reps, res[1]);
        fflush(NULL);
        _exit(rc);
    }
    close(res[1]);
    int first = *n_rows;
    result_t r;
    for (int k = 0; k < n_pats && read_all(res[0], &r, sizeof(r)); k++)
        rows[(*n_rows)++] = (row_t){.tls = tls,
                                    .pattern = pats[k].name,
                                    .put_bytes = r.put_bytes,
                                    .ferry_gbps = r.ferry_gbps,
                                    .perf_gbps = -1,
                                    .verified = r.verified == 'Y'};
    close(res[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    int rc = WIFEXITED(status) && WEXITSTATUS(status) == 0 && *n_rows - first == n_pats ? 0 : 1;
    if (rc) fy_error("bench-xfer: the %s run failed", tls);
    /* the reference, with the same transport and ferry's mean put size;
     * after ferry's processes are gone so that the two never share cores */
    if (perf_bin)
        for (int k = first; k < *n_rows; k++)
            rows[k].perf_gbps = perftest(perf_bin, tls, (uint64_t)rows[k].put_bytes, perf_secs, port);
    return rc;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ferry bench-xfer [--layers 30] [--kv-heads 3] [--head-dim 64] [--block-size 16] [--tokens 2048]\n"
            "                        [--reps 10] [--transports sm,tcp] [--perftest-secs 1] [--no-perftest]\n"
            "                        [--target-arena ucx|own]\n"
            "  KV transfer throughput between two processes over UCX (the KV of one f16 prompt),\n"
            "  against ucx_perftest -t ucp_put_bw at the same mean put size.\n"
            "  --target-arena own: the target registers a malloc'd arena instead of letting fy_xfer\n"
            "  allocate it; over shared memory the puts then go through cma (process_vm_writev)\n");
}

int fy_cmd_bench_xfer(int argc, char **argv)
{
    enum { O_LAYERS = 256, O_HEADS, O_DIM, O_BS, O_TOKENS, O_REPS, O_TLS, O_PSECS, O_NOPERF, O_ARENA };
    static const struct option opts[] = {
        {"layers", required_argument, 0, O_LAYERS},
        {"kv-heads", required_argument, 0, O_HEADS},
        {"head-dim", required_argument, 0, O_DIM},
        {"block-size", required_argument, 0, O_BS},
        {"tokens", required_argument, 0, O_TOKENS},
        {"reps", required_argument, 0, O_REPS},
        {"transports", required_argument, 0, O_TLS},
        {"perftest-secs", required_argument, 0, O_PSECS},
        {"no-perftest", no_argument, 0, O_NOPERF},
        {"target-arena", required_argument, 0, O_ARENA},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    shape_t s = {.layers = 30, .kv_heads = 3, .head_dim = 64, .block_size = 16, .tokens = 2048};
    long reps = 10;
    double perf_secs = 1;
    bool no_perf = false;
    char tls_buf[256] = "sm,tcp";
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case O_LAYERS:
            if (!fy_cli_parse_int("--layers", optarg, 1, 1024, &s.layers)) return 2;
            break;
        case O_HEADS:
            if (!fy_cli_parse_int("--kv-heads", optarg, 1, 1024, &s.kv_heads)) return 2;
            break;
        case O_DIM:
            if (!fy_cli_parse_int("--head-dim", optarg, 1, 4096, &s.head_dim)) return 2;
            break;
        case O_BS:
            if (!fy_cli_parse_int("--block-size", optarg, 1, 1024, &s.block_size)) return 2;
            break;
        case O_TOKENS:
            if (!fy_cli_parse_int("--tokens", optarg, 1, 1 << 20, &s.tokens)) return 2;
            break;
        case O_REPS:
            if (!fy_cli_parse_int("--reps", optarg, 1, 10000, &reps)) return 2;
            break;
        case O_TLS: snprintf(tls_buf, sizeof(tls_buf), "%s", optarg); break;
        case O_PSECS:
            if (!fy_cli_parse_float("--perftest-secs", optarg, 0.05, 60, &perf_secs)) return 2;
            break;
        case O_NOPERF: no_perf = true; break;
        case O_ARENA:
            if (strcmp(optarg, "ucx") && strcmp(optarg, "own")) {
                fprintf(stderr, "ferry: --target-arena expects ucx or own\n");
                return 2;
            }
            s.target_own_arena = !strcmp(optarg, "own");
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!fy_cli_no_operands("bench-xfer", argc, argv, usage)) return 2;
    s.block_bytes = (uint64_t)2 * (uint64_t)s.layers * (uint64_t)s.kv_heads * (uint64_t)s.block_size *
                    (uint64_t)s.head_dim * 2; /* K and V, f16 */
    s.n_blocks = (int32_t)((s.tokens + s.block_size - 1) / s.block_size);
    const char *tls[MAX_TLS];
    int n_tls = 0;
    for (char *save, *t = strtok_r(tls_buf, ",", &save); t && n_tls < MAX_TLS; t = strtok_r(NULL, ",", &save))
        tls[n_tls++] = t;

    /* patterns over the same source blocks 0..n-1 */
    pattern_t pats[3] = {{.name = "contiguous"}, {.name = "runs 2-6"}, {.name = "scattered"}};
    int rc = 1;
    for (int k = 0; k < 3; k++) {
        pats[k].src = fy_malloc((size_t)s.n_blocks * sizeof(int32_t));
        pats[k].dst = fy_malloc((size_t)s.n_blocks * sizeof(int32_t));
        if (!pats[k].src || !pats[k].dst) goto out;
    }
    for (int32_t i = 0; i < s.n_blocks; i++) pats[0].src[i] = i, pats[0].dst[i] = i;
    pats[0].n_puts = 1;
    if (!make_runs(&pats[1], s.n_blocks, 2, 6, 42) || !make_runs(&pats[2], s.n_blocks, 1, 1, 43)) goto out;
    /* the decode arena: as many blocks as the patterns reach */
    for (int k = 0; k < 3; k++)
        for (int32_t i = 0; i < s.n_blocks; i++) s.target_blocks = FY_MAX(s.target_blocks, pats[k].dst[i] + 1);
    if ((double)s.block_bytes * (s.n_blocks + s.target_blocks) > 16e9) {
        fprintf(stderr, "ferry: bench-xfer: %d blocks of %llu bytes is too much memory for this benchmark\n",
                s.n_blocks + s.target_blocks, (unsigned long long)s.block_bytes);
        goto out;
    }

    const char *perf_bin = no_perf ? NULL : find_perftest();
    g_ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN);
    printf("ferry bench-xfer: %d blocks of %llu bytes (%ld tokens: %ld layers x %ld kv heads x %ld, f16, %ld-token "
           "blocks) = %.1f MB a job; median of %ld jobs, each flushed%s\n",
           s.n_blocks, (unsigned long long)s.block_bytes, s.tokens, s.layers, s.kv_heads, s.head_dim, s.block_size,
           (double)s.n_blocks * (double)s.block_bytes / 1e6, reps,
           g_ncpu >= 2 ? "; target on cpu 0, initiator on the last cpu (ucx_perftest too)" : "");
    if (!no_perf && !perf_bin) printf("ucx_perftest not found (Debian package ucx-utils): ferry's figures only\n");
    if (perf_bin)
        printf("reference: %s -t ucp_put_bw -O %d at ferry's mean put size for ~%g s, UCX_TLS the same, "
               "UCX_TCP_TX_SEG_SIZE as ferry sets it (64k)\n",
               perf_bin, PERF_OUTSTANDING, perf_secs);

    row_t rows[MAX_TLS * 3];
    int n_rows = 0;
    int port = 20000 + (int)(getpid() % 20000);
    rc = 0;
    for (int t = 0; t < n_tls; t++)
        rc |= bench_transport(&s, tls[t], pats, 3, (int)reps, perf_bin, perf_secs, &port, rows, &n_rows);

    printf("\n| transport | pattern | put size | ferry GB/s | ucx_perftest GB/s | ratio |\n");
    printf("|---|---|---:|---:|---:|---:|\n");
    for (int k = 0; k < n_rows; k++) {
        const row_t *r = &rows[k];
        char perf[32] = "n/a", ratio[32] = "n/a";
        if (r->perf_gbps > 0) {
            snprintf(perf, sizeof(perf), "%.2f", r->perf_gbps);
            snprintf(ratio, sizeof(ratio), "%.0f%%", 100 * r->ferry_gbps / r->perf_gbps);
        } else if (perf_bin) {
            snprintf(perf, sizeof(perf), "failed");
        }
        printf("| %s | %s | %.0f KB | %.2f%s | %s | %s |\n", r->tls, r->pattern, r->put_bytes / 1e3, r->ferry_gbps,
               r->verified ? "" : " (BYTES WRONG)", perf, ratio);
        if (!r->verified) rc = 1;
    }
    printf("\nput size: the mean bytes per put after coalescing (ucx_perftest runs at that size); "
           "GB/s = 1e9 bytes/s; destination bytes %s.\n",
           rc ? "NOT all verified" : "verified after the last job of each pattern");
    /* A fairer reference per transport.  ucx_perftest puts one
     * message-sized buffer over and over: over shared memory, below the
     * cache size it measures cache-to-cache copies, not the memory traffic
     * of a 47 MB job, so the job-size (contiguous) figure is the one to
     * compare with.  Over TCP the stack, not the cache, bounds it, and its
     * 47 MB figure swings between runs (UCX 1.13's software RMA stalls with
     * large puts queued), so its best figure is the one to compare with. */
    for (int t = 0; t < n_tls && perf_bin; t++) {
        const row_t *ref = NULL;
        for (int k = 0; k < n_rows; k++) {
            if (rows[k].tls != tls[t] || rows[k].perf_gbps <= 0) continue;
            if (is_shm(tls[t]) ? !strcmp(rows[k].pattern, "contiguous") : !ref || rows[k].perf_gbps > ref->perf_gbps)
                ref = &rows[k];
        }
        if (!ref) continue;
        printf("%s against ucx_perftest's %s (%.2f GB/s at %.0f KB):", tls[t],
               is_shm(tls[t]) ? "figure at the job size, out of cache as ferry's jobs are" : "best figure",
               ref->perf_gbps, ref->put_bytes / 1e3);
        for (int k = 0; k < n_rows; k++)
            if (rows[k].tls == tls[t]) printf(" %s %.0f%%", rows[k].pattern, 100 * rows[k].ferry_gbps / ref->perf_gbps);
        printf("\n");
    }
out:
    for (int k = 0; k < 3; k++) {
        fy_free(pats[k].src);
        fy_free(pats[k].dst);
    }
    return rc;
}

/*
 * chaos.c - `ferry chaos`: a local cluster under steady load, its
 * processes killed in turn, and after every fault the checks an operator
 * cares about: every request ended (a result or an error) within a bound,
 * the cluster is healthy again within a bound, and every worker's KV
 * blocks (used, promised, leased) are back to zero once the load pauses.
 *
 * It starts `ferry serve` itself on free loopback ports in a fresh run
 * folder (the configuration given with -c, plus --set overrides), drives
 * it with HTTP clients (streamed and whole answers, mixed lengths), and
 * runs rounds of one fault each, in turn:
 *
 *   kill-prefill   SIGKILL a prefill worker (skipped when colocated)
 *   kill-decode    SIGKILL a decode worker
 *   kill-router    SIGKILL the router
 *   burst          16 streams in flight, then SIGKILL a decode worker:
 *                  many generations ending at once (what once wedged the
 *                  router's HTTP threads for good)
 *   stop-decode    SIGSTOP a decode worker past the router's health
 *                  timeout, then SIGCONT: a stuck process, not a dead one
 *   kill-rank      SIGKILL one follower rank of a worker whose model a
 *                  rank group serves (worker.tp/pp; skipped without one):
 *                  the worker goes out of service, exits, and is started
 *                  again with its whole group
 *   stop-etcd      SIGSTOP etcd (cluster.etcd; skipped without it) for
 *                  cluster.etcd_ttl + 2 s, then SIGCONT: every lease
 *                  expires; routers and workers that hear each other serve
 *                  on, and register again
 *   flood          16 clients send prompts of almost router.max_body
 *                  bytes (max_tokens 1) to the HTTP API, and 8 clients
 *                  holding the deployment's secret prompts of almost
 *                  1 MiB to the nng client port, for FLOOD_S
 *                  seconds while the load runs: the router must keep its
 *                  pid (serve kills a router whose /health stalls), every
 *                  flood request must get an answer, and short streamed
 *                  requests' time to first token during the flood is
 *                  recorded beside the same just before it
 *
 * With cluster.etcd in the configuration, etcd (which `ferry serve`
 * starts) gets a free loopback port too, and with serve.routers = N the
 * load goes to every router in turn (configs/chaos-etcd.ini: two).
 *
 * A request "ends" when the server answers (any status, or a stream that
 * reaches [DONE]), when the connection fails at once (the router is down:
 * refused), or when the connection is cut mid-answer; only the router's
 * own death may cut an answer, so a cut in any other round is a failure.
 * A request still open at its deadline is "hung": always a failure.
 *
 * Everything listens on 127.0.0.1; every loop is bounded in count and
 * time; only the processes it started are signalled, by pid (children of
 * its own `ferry serve`, found in /proc).
 *
 * Not here: faults inside one process (see the tests), network partitions
 * (tests/test_netns.c), more than one host.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "tools/cli.h"
#include "common/cluster.h"
#include "router/client.h"
#include "common/clock.h"
#include "tools/commands.h"
#include "common/config.h"
#include "common/metrics.h"
#include "common/mem.h"
#include "common/wire.h"

#define MAX_CLIENTS 32
#define MAX_SETS 64
#define MAX_WORKERS 32
#define BURST 16
#define RESP_CAP (1 << 20)

enum {
    K_KILL_PREFILL,
    K_KILL_DECODE,
    K_KILL_ROUTER,
    K_BURST,
    K_STOP_DECODE,
    K_KILL_RANK,
    K_STOP_ETCD,
    K_FLOOD,
    N_KINDS
};
static const char *const KIND_NAMES[N_KINDS] = {"kill-prefill", "kill-decode", "kill-router", "burst",
                                                "stop-decode",  "kill-rank",   "stop-etcd",   "flood"};

/* how a request ended */
enum { O_OK, O_HTTP_ERROR, O_STREAM_ERROR, O_REFUSED, O_CUT, O_HUNG, N_OUTCOMES };
static const char *const OUTCOME_NAMES[N_OUTCOMES] = {"ok", "http_error", "stream_error", "refused", "cut", "hung"};

static void nap(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* ---- a tiny HTTP/1.1 client over one socket (the router closes after each answer) ---------------- */

typedef struct http_res {
    int status;   /* -1: no answer */
    bool refused; /* connect failed */
    bool cut;     /* the connection ended mid-answer */
    bool timed_out;
    char *body; /* NUL-terminated, fy_free */
    size_t len;
    double t_first; /* first byte of the answer (mono) */
} http_res_t;

/* One request; on return res->body holds what arrived (status line and
 * headers stripped).  headers_seen lets a caller know the answer started. */
static void http_do(int port, const char *method, const char *path, const char *body, double deadline,
                    volatile int *started, http_res_t *res)
{
    memset(res, 0, sizeof(*res));
    res->status = -1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        res->refused = true;
        return;
    }
    struct sockaddr_in a = {
        .sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(fd, (struct sockaddr *)&a, sizeof(a))) {
        res->refused = true;
        close(fd);
        return;
    }
    char head[512];
    size_t blen = body ? strlen(body) : 0;
    int hl = snprintf(head, sizeof(head),
                      "%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n%s"
                      "Content-Length: %zu\r\n\r\n",
                      method, path, port, body ? "Content-Type: application/json\r\n" : "", blen);
    if (send(fd, head, (size_t)hl, MSG_NOSIGNAL) != hl ||
        (blen && send(fd, body, blen, MSG_NOSIGNAL) != (ssize_t)blen)) {
        res->cut = true;
        close(fd);
        return;
    }
    char *buf = fy_malloc(RESP_CAP + 1);
    size_t n = 0;
    if (!buf) {
        close(fd);
        return;
    }
    for (;;) {
        double left = deadline - fy_now_s();
        if (left <= 0) {
            res->timed_out = true;
            break;
        }
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int pr = poll(&p, 1, (int)(left * 1000) + 1);
        if (pr < 0 && errno == EINTR) continue;
        if (pr <= 0) continue; /* the loop sees the deadline */
        ssize_t k = recv(fd, buf + n, RESP_CAP - n, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            if (k < 0) res->cut = true; /* reset */
            break;
        }
        if (n == 0) {
            res->t_first = fy_now_s();
            if (started) *started = 1;
        }
        n += (size_t)k;
        if (n == RESP_CAP) break;
    }
    close(fd);
    buf[n] = '\0';
    int st = 0;
    char *hend = strstr(buf, "\r\n\r\n");
    if (sscanf(buf, "HTTP/1.%*d %d", &st) == 1 && hend) {
        res->status = st;
        size_t off = (size_t)(hend + 4 - buf);
        memmove(buf, buf + off, n - off + 1);
        n -= off;
    } else if (!res->timed_out) {
        res->cut = true; /* it ended before a status line and headers */
    }
    res->body = buf;
    res->len = n;
}

/* ---- the cluster ------------------------------------------------------------------------------- */

typedef struct chaos {
    /* settings */
    const char *config;
    const char *sets[MAX_SETS];
    int n_sets;
    int rounds, clients;
    int kv_budget; /* not zero: every other request asks for this KV budget (kv.evict must be on) */
    double recover_s, request_s, stop_s, load_s;
    uint64_t seed;
    const char *json_path;
    bool verbose;
    /* the cluster */
    char dir[256];
    pid_t serve;
    int http_port, prefill_metrics, decode_metrics, serve_metrics;
    int n_prefill, n_decode;
    int n_routers; /* serve.routers: router i's HTTP on http_port + 2i */
    bool etcd;     /* cluster.etcd: serve runs etcd (stop-etcd can run) */
    double etcd_ttl_s;
    double lease_s; /* router.lease: how long an orphaned lease can hold blocks */
    /* load */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool paused, stop;
    int in_flight;
    int round_kind;                             /* what the current round is; -1 before the first */
    bool has_ranks;                             /* some worker's model is served by a rank group (kill-rank can run) */
    uint32_t kinds;                             /* --faults: the kinds of rounds to run, a bit each (0: all) */
    uint64_t outcomes[N_KINDS + 1][N_OUTCOMES]; /* [N_KINDS]: before the first fault */
    uint64_t requests;
    pthread_t threads[MAX_CLIENTS];
    /* results */
    double recover[1024];
    int n_recover;
    int64_t leaked_blocks;
    /* flood rounds: short streams' time to the first token, before and during */
    double ttft_before[256], ttft_during[256];
    int n_before, n_during;
    int64_t max_body;
    int router_port;  /* router 0's client (nng) port */
    char secret[512]; /* the deployment's secret: the nng flood's clients hold it */
    int failures;
    char first_failure[512];
} chaos_t;

static void fail(chaos_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void fail(chaos_t *c, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "ferry: chaos: FAILED: %s\n", msg);
    if (!c->failures++) snprintf(c->first_failure, sizeof(c->first_failure), "%s", msg);
}

/*
 * A free loopback port, with the count - 1 ports after it free as well,
 * drawn at random below the kernel's ephemeral range: a port bound to 0
 * and closed came from that range, where any process's next connect()
 * could take it before serve's children bind it (1 start in 4 failed).
 * Another run can still draw the same ports; main starts again then.
 */
static int free_ports(int count)
{
    static uint64_t rng;
    if (!rng) rng = ((uint64_t)getpid() << 32 ^ (uint64_t)(fy_now_s() * 1e6)) | 1;
    int lo = 10000, hi = 32768; /* the ephemeral range's usual start; the kernel's own when it says */
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        int a = 0, b = 0;
        if (fscanf(f, "%d %d", &a, &b) == 2 && a > lo + 2 * count) hi = a;
        fclose(f);
    }
    for (int tries = 0; tries < 200; tries++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        int base = lo + (int)(rng % (uint64_t)(hi - lo - count));
        bool ok = true;
        for (int i = 0; ok && i < count; i++) {
            int f2 = socket(AF_INET, SOCK_STREAM, 0);
            struct sockaddr_in b = {.sin_family = AF_INET,
                                    .sin_port = htons((uint16_t)(base + i)),
                                    .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
            ok = f2 >= 0 && bind(f2, (struct sockaddr *)&b, sizeof(b)) == 0;
            if (f2 >= 0) close(f2);
        }
        if (ok) return base;
    }
    return -1;
}

static bool add_set(chaos_t *c, char *storage, size_t cap, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static bool add_set(chaos_t *c, char *storage, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(storage, cap, fmt, ap);
    va_end(ap);
    if (k < 0 || (size_t)k >= cap || c->n_sets >= MAX_SETS) return false;
    c->sets[c->n_sets++] = storage;
    return true;
}

/* Starts `ferry serve` (this binary) with every address on a free loopback port. */
static bool start_cluster(chaos_t *c)
{
    static char sets[16][256];
    int ns = 0;
    /* the counts the cluster will run with: the file, then every --set */
    fy_config_t *cfg;
    if (fy_config_create(&cfg) || fy_config_load(cfg, c->config)) return false;
    for (int i = 0; i < c->n_sets; i++) fy_config_set(cfg, c->sets[i]);
    int64_t np = 0, nd = 0, nr = 1;
    int32_t shape[4] = {0}; /* prefill tp, pp, decode tp, pp */
    const char *etcd = NULL;
    bool counts = !fy_conf_int(cfg, "prefill", "count", &np) && !fy_conf_int(cfg, "decode", "count", &nd) &&
                  !fy_conf_int(cfg, "serve", "routers", &nr) && !fy_conf_string(cfg, "cluster", "etcd", &etcd) &&
                  !fy_conf_duration(cfg, "cluster", "etcd_ttl", &c->etcd_ttl_s) &&
                  !fy_conf_duration(cfg, "router", "lease", &c->lease_s) &&
                  !fy_conf_size(cfg, "router", "max_body", &c->max_body) &&
                  !fy_cluster_ranks(cfg, "prefill", &shape[0], &shape[1]) &&
                  !fy_cluster_ranks(cfg, "decode", &shape[2], &shape[3]);
    c->etcd = etcd && *etcd;
    const char *secret = NULL; /* kv.secret_file, else the one serve makes in its run_dir (set below) */
    if (!fy_conf_string(cfg, "kv", "secret_file", &secret) && secret && *secret)
        snprintf(c->secret, sizeof(c->secret), "%s", secret);
    else
        snprintf(c->secret, sizeof(c->secret), "%s/run/kv.secret", c->dir);
    fy_config_destroy(cfg);
    if (!counts) return false;
    c->n_routers = (int)nr;
    /* one run of ports, no two roles' overlapping: router i listens on each
     * router address + 2i (client, events and HTTP blocks of 2N), then
     * serve's metrics, etcd's client and peer ports, the workers' blocks */
    int n2 = 2 * c->n_routers, base = free_ports(3 * n2 + 3 + 4 * MAX_WORKERS);
    if (base < 0) {
        fprintf(stderr, "ferry: chaos: no free loopback ports\n");
        return false;
    }
    int router = base, events = base + n2, etcd_port = base + 3 * n2 + 1;
    int pl = base + 3 * n2 + 3, dl = pl + MAX_WORKERS;
    c->http_port = base + 2 * n2;
    c->serve_metrics = base + 3 * n2;
    c->prefill_metrics = dl + MAX_WORKERS;
    c->decode_metrics = c->prefill_metrics + MAX_WORKERS;
    c->router_port = router;
    bool ok = add_set(c, sets[ns++], 256, "router.listen=tcp://127.0.0.1:%d", router) &&
              add_set(c, sets[ns++], 256, "router.events=tcp://127.0.0.1:%d", events) &&
              (!c->etcd || add_set(c, sets[ns++], 256, "cluster.etcd=http://127.0.0.1:%d", etcd_port)) &&
              add_set(c, sets[ns++], 256, "router.http=http://127.0.0.1:%d", c->http_port) &&
              add_set(c, sets[ns++], 256, "prefill.listen=tcp://127.0.0.1:%d", pl) &&
              add_set(c, sets[ns++], 256, "decode.listen=tcp://127.0.0.1:%d", dl) &&
              add_set(c, sets[ns++], 256, "prefill.metrics=http://127.0.0.1:%d", c->prefill_metrics) &&
              add_set(c, sets[ns++], 256, "decode.metrics=http://127.0.0.1:%d", c->decode_metrics) &&
              add_set(c, sets[ns++], 256, "serve.metrics=http://127.0.0.1:%d", c->serve_metrics) &&
              add_set(c, sets[ns++], 256, "serve.run_dir=%s/run", c->dir);
    if (!ok) {
        fprintf(stderr, "ferry: chaos: too many --set options\n");
        return false;
    }
    int64_t pre = (int64_t)shape[0] * shape[1], dec = (int64_t)shape[2] * shape[3];
    c->has_ranks = (np > 0 && pre > 1) || (nd > 0 && dec > 1);
    c->n_prefill = (int)np;
    c->n_decode = (int)nd;

    char self[512], log[512];
    ssize_t k = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (k <= 0) return false;
    self[k] = '\0';
    snprintf(log, sizeof(log), "%s/serve.log", c->dir);
    const char *argv[2 * MAX_SETS + 8];
    int na = 0;
    argv[na++] = self;
    argv[na++] = "serve";
    argv[na++] = "-c";
    argv[na++] = c->config;
    for (int i = 0; i < c->n_sets; i++) argv[na++] = "--set", argv[na++] = c->sets[i];
    argv[na] = NULL;
    pid_t pid = fork();
    if (pid < 0) return false;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM); /* a chaos run that dies stops its cluster */
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644); /* a failed start's log stays */
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(self, (char *const *)argv);
        _exit(127);
    }
    c->serve = pid;
    fprintf(stderr,
            "ferry: chaos: cluster in %s (%d router(s)%s, %d prefill, %d decode), HTTP on 127.0.0.1:%d, serve pid %d\n",
            c->dir, c->n_routers, c->etcd ? " and etcd" : "", c->n_prefill, c->n_decode, c->http_port, (int)pid);
    return true;
}

/* Router i answers /health 200 with every worker up. */
static bool router_healthy(chaos_t *c, int i)
{
    http_res_t r;
    http_do(c->http_port + 2 * i, "GET", "/health", NULL, fy_now_s() + 2, NULL, &r);
    bool ok = false;
    if (r.status == 200 && r.body) {
        json_t *j = json_loads(r.body, 0, NULL);
        if (j) {
            json_t *p = json_object_get(j, "prefill_up"), *d = json_object_get(j, "decode_up");
            ok = json_is_integer(p) && json_is_integer(d) && json_integer_value(p) == c->n_prefill &&
                 json_integer_value(d) == c->n_decode;
            json_decref(j);
        }
    }
    fy_free(r.body);
    return ok;
}

/* Every router answers /health 200 with every worker up. */
static bool healthy(chaos_t *c)
{
    bool ok = true;
    for (int i = 0; i < c->n_routers && ok; i++) ok = router_healthy(c, i);
    return ok;
}

/* ferry serve's own /health: every child running (ready), and none of
 * them is the process `gone` (the victim of a kill, until replaced). */
static bool children_running(chaos_t *c, pid_t gone)
{
    http_res_t r;
    http_do(c->serve_metrics, "GET", "/health", NULL, fy_now_s() + 2, NULL, &r);
    bool ok = false;
    if (r.status == 200 && r.body) {
        json_t *j = json_loads(r.body, 0, NULL);
        json_t *kids = j ? json_object_get(j, "children") : NULL;
        ok = json_is_array(kids) && json_array_size(kids) > 0;
        size_t i;
        json_t *k;
        json_array_foreach(kids, i, k)
        {
            const char *state = json_string_value(json_object_get(k, "state"));
            ok &= state && !strcmp(state, "running");
            if (gone > 0) ok &= json_integer_value(json_object_get(k, "pid")) != gone;
        }
        json_decref(j);
    }
    fy_free(r.body);
    return ok;
}

/* Watches the cluster from a fault on: the moment the supervisor has every
 * child running again (the victim replaced) and the router sees every
 * worker. */
typedef struct watch {
    chaos_t *c;
    pid_t gone;                            /* the killed process; 0 for a stop */
    double t_fault, deadline, t_recovered; /* t_recovered 0: not within the deadline */
    pthread_t t;
    bool running;
} watch_t;

static void *watch_main(void *arg)
{
    watch_t *w = arg;
    while (fy_now_s() < w->deadline) {
        if (children_running(w->c, w->gone) && healthy(w->c)) {
            w->t_recovered = fy_now_s();
            break;
        }
        nap(0.1);
    }
    return NULL;
}

static bool wait_healthy(chaos_t *c, double timeout_s)
{
    double end = fy_now_s() + timeout_s;
    while (fy_now_s() < end) {
        int status;
        if (waitpid(c->serve, &status, WNOHANG) == c->serve) {
            c->serve = -1;
            fprintf(stderr, "ferry: chaos: ferry serve exited (status 0x%x); see %s/serve.log\n", status, c->dir);
            return false;
        }
        if (healthy(c)) return true;
        nap(0.1);
    }
    return false;
}

/* The value of a sample line "name{labels} value" (labels as rendered), or 0 when absent. */
static double metric(const char *text, const char *series)
{
    double v = 0;
    return fy_metrics_sample(text, series, &v) == FY_OK ? v : 0;
}

/* Blocks a worker still holds for requests: used + promised, and its
 * leased blocks; -1 when its /metrics does not answer. */
static int64_t held_blocks(int port, char *what, size_t cap)
{
    http_res_t r;
    http_do(port, "GET", "/metrics", NULL, fy_now_s() + 3, NULL, &r);
    if (r.status != 200 || !r.body) {
        fy_free(r.body);
        return -1;
    }
    double used = metric(r.body, "ferry:kv_blocks{tier=\"device\",state=\"used\"}");
    double promised = metric(r.body, "ferry:kv_blocks{tier=\"device\",state=\"promised\"}");
    double leased = metric(r.body, "ferry:kv_leased_blocks");
    double running = metric(r.body, "ferry:engine_num_requests_running");
    snprintf(what, cap, "used %.0f, promised %.0f, leased %.0f, running %.0f", used, promised, leased, running);
    fy_free(r.body);
    return (int64_t)(used + promised + leased + running);
}

/* Every worker's blocks back to zero (the load is paused). */
static bool blocks_back(chaos_t *c, double timeout_s)
{
    double end = fy_now_s() + timeout_s;
    char what[256] = "";
    int64_t total = 0;
    for (;;) {
        total = 0;
        bool answered = true;
        for (int role = 0; role < 2; role++) {
            int n = role ? c->n_decode : c->n_prefill, base = role ? c->decode_metrics : c->prefill_metrics;
            for (int i = 0; i < n; i++) {
                char w[160];
                int64_t h = held_blocks(base + i, w, sizeof(w));
                if (h < 0) {
                    answered = false;
                    snprintf(what, sizeof(what), "%s-%d: /metrics does not answer", role ? "decode" : "prefill", i);
                }
                if (h > 0) {
                    total += h;
                    snprintf(what, sizeof(what), "%s-%d: %s", role ? "decode" : "prefill", i, w);
                }
            }
        }
        if (answered && total == 0) return true;
        if (fy_now_s() > end) break;
        nap(0.2);
    }
    fail(c, "blocks still held %.0f s after the load stopped: %s", timeout_s, what);
    c->leaked_blocks += total;
    return false;
}

/* pids whose parent is ppid and that are not zombies, into out[0..cap) */
static int children_of(pid_t ppid, pid_t *out, int cap)
{
    DIR *d = opendir("/proc");
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < cap) {
        pid_t pid = (pid_t)atoi(e->d_name);
        if (pid <= 0) continue;
        char path[64], buf[1024];
        snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        bool got = fgets(buf, sizeof(buf), f) != NULL;
        fclose(f);
        char *rp = got ? strrchr(buf, ')') : NULL;
        int parent = -1;
        char state = 0;
        if (rp && sscanf(rp + 1, " %c %d", &state, &parent) == 2 && parent == (int)ppid && state != 'Z') out[n++] = pid;
    }
    closedir(d);
    return n;
}

/* The k-th (modulo their count) running child of our `ferry serve` whose
 * program is exe ("ferry-decode"), or -1. */
static pid_t find_child(chaos_t *c, const char *exe, int k)
{
    pid_t kids[MAX_WORKERS * 4], found[MAX_WORKERS];
    int nk = children_of(c->serve, kids, MAX_WORKERS * 4), n = 0;
    for (int i = 0; i < nk && n < MAX_WORKERS; i++) {
        char path[64], buf[4096];
        snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)kids[i]);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t len = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[len] = '\0';
        const char *base = strrchr(buf, '/');
        base = base ? base + 1 : buf;
        if (!strcmp(base, exe)) found[n++] = kids[i];
    }
    if (n == 0) return -1;
    return found[k % n];
}

/* ---- load ------------------------------------------------------------------------------------------ */

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static const char *const WORDS[] = {"river",  "stone",  "light",  "engine", "paper",  "cloud",  "garden", "signal",
                                    "market", "window", "winter", "copper", "forest", "bridge", "orbit",  "letter"};

static char *make_body(uint64_t *rng, bool stream, int max_tokens, int kv_budget)
{
    char prompt[2048];
    size_t n = 0;
    int words = 4 + (int)(rng_next(rng) % 120);
    for (int i = 0; i < words && n + 16 < sizeof(prompt); i++)
        n += (size_t)snprintf(prompt + n, sizeof(prompt) - n, "%s%s", i ? " " : "",
                              WORDS[rng_next(rng) % (sizeof(WORDS) / sizeof(WORDS[0]))]);
    json_t *o = json_pack("{s:s, s:i, s:b, s:b, s:f}", "prompt", prompt, "max_tokens", max_tokens, "stream", stream,
                          "ignore_eos", 1, "temperature", 0.0);
    if (o && kv_budget && rng_next(rng) % 2) json_object_set_new(o, "kv_budget", json_integer(kv_budget));
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

static int classify(const http_res_t *r, bool stream)
{
    if (r->timed_out) return O_HUNG;
    if (r->refused) return O_REFUSED;
    if (r->status < 0) return O_CUT;
    if (r->status != 200) return r->cut ? O_CUT : O_HTTP_ERROR;
    if (!stream) return r->cut || !strstr(r->body, "\"choices\"") ? O_CUT : O_OK;
    if (!strstr(r->body, "data: [DONE]")) return O_CUT;
    return strstr(r->body, "data: {\"error\"") ? O_STREAM_ERROR : O_OK;
}

static void record(chaos_t *c, int outcome, int kind_at_start)
{
    pthread_mutex_lock(&c->mu);
    int k = kind_at_start < 0 ? N_KINDS : kind_at_start;
    c->outcomes[k][outcome]++;
    c->requests++;
    c->in_flight--;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (outcome == O_HUNG) fail(c, "a request was still open after %.0f s", c->request_s);
    if (outcome == O_CUT && kind_at_start != K_KILL_ROUTER)
        fail(c, "an answer was cut with no terminal event in a %s round",
             kind_at_start < 0 ? "start-up" : KIND_NAMES[kind_at_start]);
}

/* One request, counted from its start to its end.  Returns the outcome. */
static int one_request(chaos_t *c, uint64_t *rng, bool stream, int max_tokens, volatile int *started)
{
    pthread_mutex_lock(&c->mu);
    c->in_flight++;
    int kind = c->round_kind;
    pthread_mutex_unlock(&c->mu);
    char *body = make_body(rng, stream, max_tokens, c->kv_budget);
    http_res_t r;
    int port = c->http_port + 2 * (int)(rng_next(rng) % (uint64_t)c->n_routers); /* every router in turn */
    http_do(port, "POST", "/v1/completions", body, fy_now_s() + c->request_s, started, &r);
    int o = body ? classify(&r, stream) : O_HTTP_ERROR;
    if (c->verbose && o != O_OK)
        fprintf(stderr, "ferry: chaos: %s (status %d): %.200s\n", OUTCOME_NAMES[o], r.status, r.body ? r.body : "");
    free(body);
    fy_free(r.body);
    record(c, o, kind);
    return o;
}

static void *load_main(void *arg)
{
    chaos_t *c = arg;
    uint64_t rng;
    pthread_mutex_lock(&c->mu);
    rng = c->seed * 0x9e3779b97f4a7c15ull + (uint64_t)(uintptr_t)pthread_self();
    pthread_mutex_unlock(&c->mu);
    if (!rng) rng = 1;
    for (;;) {
        pthread_mutex_lock(&c->mu);
        while (c->paused && !c->stop) pthread_cond_wait(&c->cv, &c->mu);
        bool stop = c->stop;
        pthread_mutex_unlock(&c->mu);
        if (stop) break;
        int o = one_request(c, &rng, rng_next(&rng) & 1, 4 + (int)(rng_next(&rng) % 60), NULL);
        if (o == O_REFUSED || o == O_HTTP_ERROR) nap(0.05); /* the router is down or shedding: not a spin */
    }
    return NULL;
}

static void set_paused(chaos_t *c, bool paused)
{
    pthread_mutex_lock(&c->mu);
    c->paused = paused;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* Pauses the load and waits for every request in flight to end. */
static bool drain(chaos_t *c)
{
    set_paused(c, true);
    struct timespec ts;
    fy_deadline_in(CLOCK_REALTIME, c->request_s + 10, &ts);
    pthread_mutex_lock(&c->mu);
    int rc = 0;
    while (c->in_flight > 0 && rc == 0) rc = pthread_cond_timedwait(&c->cv, &c->mu, &ts);
    int left = c->in_flight;
    pthread_mutex_unlock(&c->mu);
    if (left) fail(c, "%d requests still in flight after the load paused", left);
    return left == 0;
}

/* ---- faults ------------------------------------------------------------------------------------------ */

typedef struct burst_arg {
    chaos_t *c;
    uint64_t rng;
    volatile int started;
} burst_arg_t;

static void *burst_main(void *arg)
{
    burst_arg_t *b = arg;
    one_request(b->c, &b->rng, true, 200, &b->started);
    return NULL;
}

static bool signal_child(chaos_t *c, const char *exe, int k, int sig, pid_t *pid_p)
{
    pid_t pid = find_child(c, exe, k);
    if (pid <= 0) {
        fail(c, "no live %s to signal", exe);
        return false;
    }
    if (kill(pid, sig)) {
        fail(c, "kill(%d, %d): %s", (int)pid, sig, strerror(errno));
        return false;
    }
    if (pid_p) *pid_p = pid;
    return true;
}

/* SIGKILL a follower rank (a child of a prefill or decode worker); the
 * worker is what must be replaced: *worker_p. */
static bool kill_rank(chaos_t *c, int k, pid_t *worker_p)
{
    static const char *const exes[2] = {"ferry-decode", "ferry-prefill"};
    for (int t = 0; t < 2 * MAX_WORKERS; t++) {
        pid_t w = find_child(c, exes[(k + t) % 2], k + t / 2);
        pid_t ranks[64];
        int n = w > 0 ? children_of(w, ranks, 64) : 0;
        if (n == 0) continue;
        pid_t victim = ranks[(unsigned)k % (unsigned)n];
        if (kill(victim, SIGKILL)) {
            fail(c, "kill(%d, SIGKILL): %s", (int)victim, strerror(errno));
            return false;
        }
        *worker_p = w;
        return true;
    }
    fail(c, "no worker with follower ranks to kill one of");
    return false;
}

static void watch_start(chaos_t *c, watch_t *w, pid_t gone, double t_fault)
{
    *w = (watch_t){.c = c, .gone = gone, .t_fault = t_fault, .deadline = t_fault + c->recover_s};
    w->running = pthread_create(&w->t, NULL, watch_main, w) == 0;
}

/* ---- the flood round ---- */

#define FLOOD_S 5
#define FLOOD_CLIENTS 16    /* over HTTP */
#define FLOOD_NNG_CLIENTS 8 /* over the nng client port, with the deployment's secret */

typedef struct flood {
    chaos_t *c;
    char *body;   /* a prompt of almost router.max_body bytes */
    char *prompt; /* one of almost FY_WIRE_MAX_PROMPT_BYTES for the nng clients */
    double until;
    int answered, hung;
    int nng_answered, nng_hung, nng_errors;
} flood_t;

/* An authenticated nng client sending prompts of almost the largest
 * message the client port takes (max_tokens 1), as the attack
 * did: the router refuses them by length, or runs them; either way each
 * gets its answer and health, heartbeats and events never wait behind
 * them (router.parse_threads). */
static void *flood_nng_main(void *arg)
{
    flood_t *f = arg;
    chaos_t *c = f->c;
    char url[64];
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", c->router_port);
    fy_client_t *cl = NULL;
    if (fy_client_create(url, c->secret, c->request_s, &cl) != FY_OK) {
        __atomic_add_fetch(&f->nng_errors, 1, __ATOMIC_RELAXED);
        return NULL;
    }
    fy_client_req_t req = {.prompt = f->prompt};
    fy_genspec_default(&req.gen);
    req.gen.max_tokens = 1;
    while (fy_now_s() < f->until) {
        fy_client_stream_t st;
        char err[256];
        double t0 = fy_now_s();
        fy_status_t s = fy_client_generate(cl, &req, &st, err, sizeof(err));
        bool ended = s != FY_OK && s != FY_ERR_TIMEOUT;
        while (s == FY_OK && !ended && fy_now_s() - t0 < c->request_s) {
            fy_client_update_t u;
            if (fy_client_poll(cl, &st, 1.0, &u) != FY_OK) break;
            ended = u.done;
        }
        __atomic_add_fetch(ended ? &f->nng_answered : &f->nng_hung, 1, __ATOMIC_RELAXED);
        if (!ended) break; /* a hung one is counted; the next would wait behind it */
    }
    fy_client_destroy(cl);
    return NULL;
}

static void *flood_main(void *arg)
{
    flood_t *f = arg;
    while (fy_now_s() < f->until) {
        http_res_t r;
        http_do(f->c->http_port, "POST", "/v1/completions", f->body, fy_now_s() + f->c->request_s, NULL, &r);
        __atomic_add_fetch(r.timed_out ? &f->hung : &f->answered, 1, __ATOMIC_RELAXED);
        fy_free(r.body);
        if (r.refused) nap(0.05);
    }
    return NULL;
}

/* A short streamed completion's time to its first token: to the first
 * event that carries text (-1: none, or the stream did not end well). */
static double probe_ttft(chaos_t *c)
{
    static const char req[] =
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: "
        "application/json\r\nContent-Length: 67\r\n\r\n{\"prompt\":\"The river\",\"max_tokens\":4,"
        "\"stream\":true,\"temperature\":0}";
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {
        .sin_family = AF_INET, .sin_port = htons((uint16_t)c->http_port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    double t0 = fy_now_s(), first = -1, end = t0 + c->request_s;
    char b[8192];
    size_t n = 0;
    if (fd >= 0 && !connect(fd, (struct sockaddr *)&a, sizeof(a)) &&
        send(fd, req, sizeof(req) - 1, MSG_NOSIGNAL) == (ssize_t)sizeof(req) - 1) {
        while (fy_now_s() < end && n + 1 < sizeof(b)) {
            struct pollfd p = {.fd = fd, .events = POLLIN};
            if (poll(&p, 1, 100) <= 0) continue;
            ssize_t k = recv(fd, b + n, sizeof(b) - 1 - n, 0);
            if (k <= 0) break;
            n += (size_t)k;
            b[n] = 0;
            if (first < 0 && strstr(b, "\"text\"")) first = fy_now_s() - t0;
        }
    }
    if (fd >= 0) close(fd);
    b[n] = 0;
    return strstr(b, "data: [DONE]") && !strstr(b, "data: {\"error\"") ? first : -1;
}

static double median(double *v, int n)
{
    if (n <= 0) return 0;
    double t[256];
    memcpy(t, v, (size_t)n * sizeof(double));
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            double x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    return t[n / 2];
}

static void flood_round(chaos_t *c, int r, pid_t *pid_p)
{
    pid_t router = find_child(c, "ferry-router", 0);
    *pid_p = router;
    for (int i = 0; i < 3 && c->n_before < 256; i++) {
        double t = probe_ttft(c);
        if (t >= 0) c->ttft_before[c->n_before++] = t;
    }
    flood_t f = {.c = c, .until = fy_now_s() + FLOOD_S};
    size_t len = c->max_body > 4096 ? (size_t)c->max_body - 256 : 4096;
    f.body = fy_malloc(len + 64);
    if (!f.body) return;
    size_t n = (size_t)snprintf(f.body, len, "{\"max_tokens\":1,\"prompt\":\"");
    for (unsigned i = 0; n + 16 < len; i++) n += (size_t)snprintf(f.body + n, len - n, "%s ", WORDS[i * 7 % 16]);
    snprintf(f.body + n, len + 64 - n, "\"}");
    size_t plen = FY_WIRE_MAX_PROMPT_BYTES - 4096;
    f.prompt = fy_malloc(plen + 1);
    if (!f.prompt) {
        fy_free(f.body);
        return;
    }
    for (size_t k = 0, i = 0; k < plen; i++) {
        const char *w = WORDS[i * 5 % 16];
        for (; *w && k < plen; w++) f.prompt[k++] = *w;
        if (k < plen) f.prompt[k++] = ' ';
    }
    f.prompt[plen] = 0;
    pthread_t t[FLOOD_CLIENTS + FLOOD_NNG_CLIENTS];
    int nt = 0;
    for (; nt < FLOOD_CLIENTS; nt++)
        if (pthread_create(&t[nt], NULL, flood_main, &f)) break;
    for (int k = 0; k < FLOOD_NNG_CLIENTS && nt == FLOOD_CLIENTS + k; k++)
        if (!pthread_create(&t[nt], NULL, flood_nng_main, &f)) nt++;
    nap(0.5);
    while (fy_now_s() < f.until - 0.5 && c->n_during < 256) {
        double p = probe_ttft(c);
        if (p >= 0) c->ttft_during[c->n_during++] = p;
    }
    for (int i = 0; i < nt; i++) pthread_join(t[i], NULL);
    fy_free(f.body);
    fy_free(f.prompt);
    pid_t after = find_child(c, "ferry-router", 0);
    if (router <= 0 || after != router)
        fail(c, "round %d (flood): the router was replaced (pid %d, now %d): serve killed it or it died", r,
             (int)router, (int)after);
    if (f.hung) fail(c, "round %d (flood): %d flood requests got no answer within %.0f s", r, f.hung, c->request_s);
    if (f.nng_hung)
        fail(c, "round %d (flood): %d flood requests on the nng port got no answer within %.0f s", r, f.nng_hung,
             c->request_s);
    if (f.nng_errors)
        fail(c, "round %d (flood): %d nng flood clients could not connect with %s", r, f.nng_errors, c->secret);
    fprintf(stderr,
            "ferry: chaos: flood: %d large prompts answered over HTTP, %d over nng; short streams %.0f ms before, "
            "%.0f ms during\n",
            f.answered, f.nng_answered, median(c->ttft_before, c->n_before) * 1e3,
            median(c->ttft_during, c->n_during) * 1e3);
}

/* One round: load for a while, the fault, more load, then the checks. */
static void round_run(chaos_t *c, int r, int kind, uint64_t *rng)
{
    pthread_mutex_lock(&c->mu);
    c->round_kind = kind;
    pthread_mutex_unlock(&c->mu);
    set_paused(c, false);
    nap(c->load_s);
    int victim = (int)(rng_next(rng) % 64);
    pid_t pid = -1;
    watch_t w = {0};
    switch (kind) {
    case K_KILL_PREFILL:
    case K_KILL_DECODE:
    case K_KILL_ROUTER: {
        const char *exe = kind == K_KILL_PREFILL  ? "ferry-prefill"
                          : kind == K_KILL_DECODE ? "ferry-decode"
                                                  : "ferry-router";
        double t = fy_now_s();
        if (signal_child(c, exe, victim, SIGKILL, &pid)) watch_start(c, &w, pid, t);
        break;
    }
    case K_BURST: {
        burst_arg_t b[BURST];
        pthread_t t[BURST];
        int n = 0;
        for (int i = 0; i < BURST; i++) {
            b[i] = (burst_arg_t){.c = c, .rng = rng_next(rng) | 1};
            if (!pthread_create(&t[i], NULL, burst_main, &b[i]))
                n++;
            else
                break;
        }
        /* the burst is streaming (or has ended) before the kill */
        double until = fy_now_s() + 30;
        for (;;) {
            int s = 0;
            for (int i = 0; i < n; i++) s += b[i].started;
            if (s == n || fy_now_s() > until) break;
            nap(0.05);
        }
        double tk = fy_now_s();
        if (signal_child(c, "ferry-decode", victim, SIGKILL, &pid)) watch_start(c, &w, pid, tk);
        for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
        /* the router must still answer at once, with a status */
        http_res_t h;
        http_do(c->http_port, "GET", "/health", NULL, fy_now_s() + 5, NULL, &h);
        if (h.status < 0) fail(c, "round %d: the router's /health does not answer after the burst", r);
        fy_free(h.body);
        break;
    }
    case K_KILL_RANK: {
        double t = fy_now_s();
        if (kill_rank(c, victim, &pid)) watch_start(c, &w, pid, t);
        break;
    }
    case K_STOP_ETCD:
        if (signal_child(c, "etcd", 0, SIGSTOP, &pid)) { /* past every lease */
            nap(c->etcd_ttl_s + 2);
            kill(pid, SIGCONT);
            watch_start(c, &w, 0, fy_now_s());
        }
        break;
    case K_FLOOD:
        flood_round(c, r, &pid);
        watch_start(c, &w, 0, fy_now_s());
        break;
    case K_STOP_DECODE:
        if (signal_child(c, "ferry-decode", victim, SIGSTOP, &pid)) {
            nap(c->stop_s);
            kill(pid, SIGCONT);
            watch_start(c, &w, 0, fy_now_s());
        }
        break;
    }
    nap(c->load_s); /* load goes on against the damaged cluster */
    bool drained = drain(c);
    if (w.running) pthread_join(w.t, NULL);
    bool up = w.t_recovered > 0;
    double rec = up ? w.t_recovered - w.t_fault : c->recover_s;
    if (!up)
        fail(c, "round %d (%s): not healthy %.0f s after the fault", r, KIND_NAMES[kind], c->recover_s);
    else if (c->n_recover < (int)(sizeof(c->recover) / sizeof(c->recover[0])))
        c->recover[c->n_recover++] = rec;
    /* a lease whose router died is held until it expires; sequences whose
     * client is gone end within the request bound */
    bool back = up && blocks_back(c, c->lease_s + 20);
    char healthy_s[64];
    snprintf(healthy_s, sizeof(healthy_s), up ? "healthy after %.2f s" : "NOT healthy after %.0f s", rec);
    fprintf(stderr, "ferry: chaos: round %d %-12s pid %-7d %s, %s, blocks %s\n", r, KIND_NAMES[kind], (int)pid,
            drained ? "all requests ended" : "REQUESTS LEFT", healthy_s, back ? "back" : "NOT BACK");
}

/* ---- the command ---------------------------------------------------------------------------------- */

static void summary(chaos_t *c, double wall)
{
    uint64_t tot[N_OUTCOMES] = {0};
    for (int k = 0; k <= N_KINDS; k++)
        for (int o = 0; o < N_OUTCOMES; o++) tot[o] += c->outcomes[k][o];
    double mx = 0, sum = 0;
    for (int i = 0; i < c->n_recover; i++) {
        sum += c->recover[i];
        if (c->recover[i] > mx) mx = c->recover[i];
    }
    printf("chaos: %d rounds, %llu requests in %.0f s: ", c->rounds, (unsigned long long)c->requests, wall);
    for (int o = 0; o < N_OUTCOMES; o++)
        printf("%s%s %llu", o ? ", " : "", OUTCOME_NAMES[o], (unsigned long long)tot[o]);
    printf("\nchaos: healthy again after mean %.2f s, max %.2f s; blocks leaked %lld; %s\n",
           c->n_recover ? sum / c->n_recover : 0, mx, (long long)c->leaked_blocks,
           c->failures ? c->first_failure : "every check passed");
    if (c->n_during)
        printf("chaos: flood: short streams' time to first token, median %.0f ms before the flood (%d), %.0f ms "
               "during it (%d)\n",
               median(c->ttft_before, c->n_before) * 1e3, c->n_before, median(c->ttft_during, c->n_during) * 1e3,
               c->n_during);
    printf("%-14s", "round kind");
    for (int o = 0; o < N_OUTCOMES; o++) printf(" %12s", OUTCOME_NAMES[o]);
    printf("\n");
    for (int k = 0; k <= N_KINDS; k++) {
        printf("%-14s", k == N_KINDS ? "(start-up)" : KIND_NAMES[k]);
        for (int o = 0; o < N_OUTCOMES; o++) printf(" %12llu", (unsigned long long)c->outcomes[k][o]);
        printf("\n");
    }
    if (!c->json_path) return;
    json_t *j = json_object(), *by = json_object();
    json_object_set_new(j, "rounds", json_integer(c->rounds));
    json_object_set_new(j, "requests", json_integer((json_int_t)c->requests));
    json_object_set_new(j, "wall_s", json_real(wall));
    for (int k = 0; k <= N_KINDS; k++) {
        json_t *row = json_object();
        for (int o = 0; o < N_OUTCOMES; o++)
            json_object_set_new(row, OUTCOME_NAMES[o], json_integer((json_int_t)c->outcomes[k][o]));
        json_object_set_new(by, k == N_KINDS ? "start-up" : KIND_NAMES[k], row);
    }
    json_object_set_new(j, "outcomes", by);
    json_object_set_new(j, "recover_mean_s", json_real(c->n_recover ? sum / c->n_recover : 0));
    json_object_set_new(j, "recover_max_s", json_real(mx));
    json_object_set_new(j, "leaked_blocks", json_integer(c->leaked_blocks));
    if (c->n_during)
        json_object_set_new(j, "flood_ttft_ms",
                            json_pack("{s:f, s:f, s:i, s:i}", "before", median(c->ttft_before, c->n_before) * 1e3,
                                      "during", median(c->ttft_during, c->n_during) * 1e3, "probes_before", c->n_before,
                                      "probes_during", c->n_during));
    json_object_set_new(j, "failures", json_integer(c->failures));
    json_object_set_new(j, "first_failure", json_string(c->first_failure));
    if (json_dump_file(j, c->json_path, JSON_INDENT(2)))
        fprintf(stderr, "ferry: chaos: cannot write %s\n", c->json_path);
    json_decref(j);
}

static void usage(FILE *f)
{
    fprintf(
        f, "usage: ferry chaos [-c CONFIG] [--rounds N] [--clients N] [--seed S] [--kv-budget N] [--faults LIST]\n"
           "                   [--set section.key=value]...\n"
           "                   [--recover S] [--request-timeout S] [--stop S] [--load S] [--json FILE] [-v]\n"
           "  kill a local cluster's processes under load, round after round, and check that every request\n"
           "  ends, the cluster recovers and every KV block comes back\n"
           "  -c, --config FILE         the cluster's configuration (default configs/local.ini)\n"
           "      --rounds N            rounds of faults (default 5)\n"
           "  -C, --clients N           load clients, one request in flight each (default 4)\n"
           "      --seed S              which worker each fault hits (default 1)\n"
           "      --kv-budget N         every other request asks for a KV budget of N tokens (kv.evict on)\n"
           "      --set SECTION.KEY=V   override a key of the configuration (repeatable)\n"
           "      --recover S           a round fails when the cluster is not healthy S seconds after (default 60)\n"
           "      --request-timeout S   a request still open after S seconds is hung: a failure (default 90)\n"
           "      --stop S              how long a stopped (SIGSTOP) process stays stopped (default 4)\n"
           "      --load S              seconds of load before each fault and after it (default 1.5)\n"
           "      --faults LIST         the kinds of rounds, in turn (default every kind that applies): kill-prefill,\n"
           "                            kill-decode, kill-router, burst, stop-decode, kill-rank, stop-etcd, flood\n"
           "      --json FILE           the outcomes as JSON\n"
           "  -v, --verbose             a line for every request that did not end well\n"
           "  -h, --help\n");
}

int fy_cmd_chaos(int argc, char **argv)
{
    chaos_t *c = fy_calloc(1, sizeof(*c));
    if (!c) return 1;
    c->config = "configs/local.ini";
    c->rounds = 5;
    c->clients = 4;
    c->recover_s = 60;
    c->request_s = 90;
    c->stop_s = 4;
    c->load_s = 1.5;
    c->seed = 1;
    c->round_kind = -1;
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"rounds", required_argument, NULL, 'r'},
        {"clients", required_argument, NULL, 'C'},
        {"seed", required_argument, NULL, 's'},
        {"kv-budget", required_argument, NULL, 'B'},
        {"set", required_argument, NULL, 'S'},
        {"recover", required_argument, NULL, 'R'},
        {"request-timeout", required_argument, NULL, 'T'},
        {"stop", required_argument, NULL, 'P'},
        {"load", required_argument, NULL, 'L'},
        {"json", required_argument, NULL, 'j'},
        {"faults", required_argument, NULL, 'F'},
        {"verbose", no_argument, NULL, 'v'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int o;
    long v;
    double d;
    optind = 1;
    while ((o = getopt_long(argc, argv, "c:C:vh", opts, NULL)) != -1) {
        switch (o) {
        case 'c': c->config = optarg; break;
        case 'r':
            if (!fy_cli_parse_int("--rounds", optarg, 1, 100000, &v)) goto bad;
            c->rounds = (int)v;
            break;
        case 'C':
            if (!fy_cli_parse_int("--clients", optarg, 1, MAX_CLIENTS, &v)) goto bad;
            c->clients = (int)v;
            break;
        case 's':
            if (!fy_cli_parse_u64("--seed", optarg, &c->seed)) goto bad;
            break;
        case 'B':
            if (!fy_cli_parse_int("--kv-budget", optarg, 1, 1 << 20, &v)) goto bad;
            c->kv_budget = (int)v;
            break;
        case 'S':
            if (c->n_sets >= MAX_SETS - 16) {
                fprintf(stderr, "ferry: chaos: too many --set options\n");
                goto bad;
            }
            c->sets[c->n_sets++] = optarg;
            break;
        case 'R':
            if (!fy_cli_parse_float("--recover", optarg, 1, 3600, &d)) goto bad;
            c->recover_s = d;
            break;
        case 'T':
            if (!fy_cli_parse_float("--request-timeout", optarg, 1, 3600, &d)) goto bad;
            c->request_s = d;
            break;
        case 'P':
            if (!fy_cli_parse_float("--stop", optarg, 0.1, 600, &d)) goto bad;
            c->stop_s = d;
            break;
        case 'L':
            if (!fy_cli_parse_float("--load", optarg, 0, 600, &d)) goto bad;
            c->load_s = d;
            break;
        case 'j': c->json_path = optarg; break;
        case 'F': {
            char list[256];
            snprintf(list, sizeof(list), "%s", optarg);
            for (char *save = NULL, *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                int k = 0;
                while (k < N_KINDS && strcmp(t, KIND_NAMES[k])) k++;
                if (k == N_KINDS) {
                    fprintf(stderr, "ferry: chaos: --faults: no fault '%s'\n", t);
                    goto bad;
                }
                c->kinds |= 1u << k;
            }
            break;
        }
        case 'v': c->verbose = true; break;
        case 'h':
            usage(stdout);
            fy_free(c);
            return 0;
        default: goto bad;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "ferry: chaos: unexpected argument '%s'\n", argv[optind]);
        goto bad;
    }
    if (access(c->config, R_OK)) {
        fprintf(stderr, "ferry: chaos: cannot read the configuration %s: %s\n", c->config, strerror(errno));
        fy_free(c);
        return 2;
    }
    snprintf(c->dir, sizeof(c->dir), "/tmp/ferry-chaos-XXXXXX");
    if (!mkdtemp(c->dir)) {
        fprintf(stderr, "ferry: chaos: mkdtemp: %s\n", strerror(errno));
        fy_free(c);
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->paused = true;
    double t0 = fy_now_s();
    int rc = 1;
    int n_threads = 0;
    /* a port drawn free can be taken before serve's children bind it (by
     * another run): serve exits at start-up, and a start on other ports
     * follows, 4 tries in all */
    int n_sets = c->n_sets;
    for (int attempt = 1;; attempt++) {
        c->n_sets = n_sets; /* the ports of the try before go */
        if (!start_cluster(c)) goto out;
        if (wait_healthy(c, 180)) break;
        if (c->serve < 0 && attempt < 4) {
            fprintf(stderr, "ferry: chaos: start %d failed (a port taken?); starting again on other ports\n", attempt);
            continue;
        }
        fail(c, "the cluster did not become healthy within 180 s (see %s)", c->dir);
        goto out;
    }
    for (; n_threads < c->clients; n_threads++)
        if (pthread_create(&c->threads[n_threads], NULL, load_main, c)) break;
    uint64_t rng = c->seed | 1;
    int kinds[N_KINDS], nk = 0;
    for (int k = 0; k < N_KINDS; k++)
        if ((k != K_KILL_PREFILL || c->n_prefill > 0) && (k != K_KILL_RANK || c->has_ranks) &&
            (k != K_STOP_ETCD || c->etcd) && (!c->kinds || (c->kinds >> k & 1)))
            kinds[nk++] = k;
    if (nk == 0) {
        fail(c, "no fault of --faults can run on this cluster (kill-rank needs worker.tp or pp above 1, stop-etcd "
                "cluster.etcd)");
        goto out;
    }
    for (int r = 1; r <= c->rounds; r++) round_run(c, r, kinds[(r - 1) % nk], &rng);
    rc = c->failures ? 1 : 0;
out:
    pthread_mutex_lock(&c->mu);
    c->stop = true;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < n_threads; i++) pthread_join(c->threads[i], NULL);
    if (c->serve > 0) {
        /* a clean stop is part of the run: serve must end within its grace */
        kill(c->serve, SIGTERM);
        double end = fy_now_s() + 60;
        int status = 0;
        pid_t w = 0;
        while ((w = waitpid(c->serve, &status, WNOHANG)) == 0 && fy_now_s() < end) nap(0.1);
        if (w != c->serve) {
            fail(c, "ferry serve did not stop within 60 s of SIGTERM");
            kill(c->serve, SIGKILL);
            waitpid(c->serve, &status, 0);
            rc = 1;
        } else if (!WIFEXITED(status) || WEXITSTATUS(status)) {
            fprintf(stderr, "ferry: chaos: ferry serve ended with status 0x%x\n", status);
        }
    }
    summary(c, fy_now_s() - t0);
    if (c->failures) fprintf(stderr, "ferry: chaos: logs are in %s\n", c->dir);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    rc = c->failures ? 1 : rc;
    fy_free(c);
    return rc;
bad:
    usage(stderr);
    fy_free(c);
    return 2;
}

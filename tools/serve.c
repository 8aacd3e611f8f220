/*
 * serve.c - `ferry serve`: a whole local cluster from one configuration:
 * the router, prefill.count prefill and decode.count decode workers, each
 * a child process (bin/ferry-router, -prefill, -decode next to this
 * binary), supervised by tools/supervise.c.
 *
 * The children read one resolved configuration (the file plus every
 * --set, written to RUN_DIR/cluster.ini) and their own name and address:
 * worker i of a role listens on the role's listen port + i.  The
 * deployment's secret (prefix-block names, the control plane's keys) is
 * created in RUN_DIR once, mode 0600.
 *
 * Start-up: each child reports "ready" on a pipe it inherits once its
 * listeners are bound (supervise.h, "Readiness"), and the cluster is ready
 * when every child has and the router sees every worker.  A pipe rather
 * than a port that answers, because a port can answer for someone else: a
 * cluster left running on the same ports would answer for ours while our
 * router failed to bind.  A child that fails before its first report
 * (a bad --set value, a port taken, a missing model) stops the whole
 * cluster, its error lines repeated on our stderr: it would fail the same
 * way on every restart.
 *
 * Running: a child that exits is restarted with backoff, forever; a
 * router or worker whose /health stops answering for serve.health_timeout
 * is killed and restarted (supervise.h, "Liveness").  serve.metrics
 * serves our own /health and /metrics: each child's state and restarts.
 *
 * With cluster.etcd: serve.routers routers (router i on each of the
 * router's addresses' port + 2i), and, when the first etcd endpoint is on
 * this host's loopback and serve.etcd_data is not empty, etcd itself as a
 * child (its data in serve.etcd_data, by default RUN_DIR/etcd; its peer
 * port the client port + 1), stopped last, and restarted only after
 * serve.etcd_health_timeout of silence (120 s): routers and workers serve
 * on through an etcd outage, while a restart would lose every lease.
 *
 * Stopping (SIGINT, SIGTERM): the routers first, with serve.stop_grace to
 * drain its requests (router.drain_timeout) and a margin to end the rest,
 * then the workers.  With --prompt, a first request is sent once the
 * cluster is ready, and with --once the cluster stops after it.
 *
 * Not here: the supervision itself (supervise.c), the children.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <sodium.h>

#include "tools/cli.h"
#include "router/client.h"
#include "common/clock.h"
#include "common/cluster.h"
#include "tools/commands.h"
#include "common/config.h"
#include "tools/serve_config.h"
#include "rpc/etcd.h"
#include "rpc/httpd.h"
#include "common/log.h"
#include "common/mem.h"
#include "common/metrics.h"
#include "tools/supervise.h"

#define MAX_CHILDREN 64
#define ROUTER_STOP_MARGIN_S 5.0 /* after its drain, for the router to end what is left and exit */
#define N_STATES 5               /* fy_sup_state_t */
#define USAGE "-c FILE [--set section.key=value]... [--prompt TEXT [--chat] [-n N]] [--once]"

static fy_sup_t *g_sup; /* for the signal handler */

static void on_signal(int sig)
{
    if (g_sup) fy_sup_request_stop(g_sup);
}

/* One child's series in our /metrics. */
typedef struct child_series {
    fy_metric_t *up, *restarts, *kills, *restart_in, *state[N_STATES];
} child_series_t;

typedef struct serve {
    fy_sup_t *sup;
    char router_url[256];
    char secret[PATH_MAX]; /* the deployment's secret: its own clients authenticate with it */
    int n_prefill, n_decode, n_children;
    bool ready;
    double t_start, ready_timeout;
    /* our /health and /metrics: the poll callback copies the supervisor's
     * view here; the HTTP thread reads only this */
    fy_httpd_t *http;
    fy_metrics_t *reg;
    child_series_t series[MAX_CHILDREN];
    fy_metric_t *cluster_ready;
    pthread_mutex_t mu;
    fy_sup_info_t info[MAX_CHILDREN]; /* under mu */
    bool info_ready;                  /* under mu */
    /* the first request */
    const char *prompt;
    bool chat, once;
    int32_t max_tokens;
    pthread_t first;
    bool first_started;
    int first_rc;
} serve_t;

static void *first_request(void *arg)
{
    serve_t *s = arg;
    fy_client_t *c;
    s->first_rc = 1;
    if (fy_client_create(s->router_url, s->secret, 10, &c) == FY_OK) {
        fy_client_req_t req = {.prompt = s->prompt, .chat = s->chat};
        fy_genspec_default(&req.gen);
        req.gen.max_tokens = s->max_tokens;
        fy_client_stream_t sm;
        char err[256];
        fy_status_t st = fy_client_generate(c, &req, &sm, err, sizeof(err));
        int32_t n_prompt = sm.n_prompt;
        if (st) {
            fprintf(stderr, "ferry: serve: the first request was refused: %s\n", err);
        } else {
            printf("%s\n--\n", s->prompt);
            fy_cli_answer_t answer = {.out = stdout};
            for (;;) {
                fy_client_update_t u;
                if ((st = fy_client_poll(c, &sm, 1.0, &u))) {
                    fprintf(stderr, "ferry: serve: polling the first request: %s\n", u.message);
                    break;
                }
                fy_cli_answer_put(&answer, u.text, u.text_len);
                if (!u.done) continue;
                fy_cli_answer_end(&answer); /* the summary below starts a line of its own */
                if (u.error) {
                    fprintf(stderr, "ferry: serve: the first request failed: %s\n", u.message);
                } else {
                    const fy_client_timings_t *t = &u.timings;
                    fprintf(stderr,
                            "ferry: serve: first request: %d prompt tokens, finish %s; ttft %.3f s (prefill %.3f, "
                            "kv transfer %.3f s for %.2f MB), e2e %.3f s\n",
                            n_prompt, u.finish, t->ttft_s, t->prefill_compute_s, t->transfer_s,
                            (double)t->transfer_bytes / 1e6, t->e2e_s);
                    s->first_rc = 0;
                }
                break;
            }
        }
        fy_client_destroy(c);
    }
    if (s->once) fy_sup_request_stop(s->sup);
    return NULL;
}

/* Copies the supervisor's view of every child for /health and /metrics. */
static void snapshot(serve_t *s)
{
    fy_sup_info_t info[MAX_CHILDREN];
    for (int i = 0; i < s->n_children; i++) {
        fy_sup_info(s->sup, i, &info[i]);
        child_series_t *m = &s->series[i];
        fy_metric_set(m->up, info[i].state == FY_SUP_RUNNING);
        fy_metric_set(m->restarts, info[i].restarts);
        fy_metric_set(m->kills, info[i].health_kills);
        fy_metric_set(m->restart_in, info[i].restart_in_s);
        for (int st = 0; st < N_STATES; st++) fy_metric_set(m->state[st], (int)info[i].state == st);
    }
    fy_metric_set(s->cluster_ready, s->ready);
    pthread_mutex_lock(&s->mu);
    memcpy(s->info, info, (size_t)s->n_children * sizeof(info[0]));
    s->info_ready = s->ready;
    pthread_mutex_unlock(&s->mu);
}

/* Every poll_s from the supervisor's loop: is the cluster up yet? */
static void on_poll(void *arg, fy_sup_t *sup)
{
    serve_t *s = arg;
    snapshot(s);
    if (s->ready) return;
    /* every child said ready on its own pipe: the ports are ours */
    bool ok = true;
    for (int i = 0; i < s->n_children && ok; i++) ok = fy_sup_state(sup, i) == FY_SUP_RUNNING;
    if (ok) {
        fy_client_t *c;
        fy_client_status_t st;
        ok = fy_client_create(s->router_url, s->secret, 0.5, &c) == FY_OK;
        if (ok) {
            ok = fy_client_status(c, &st) == FY_OK && st.prefill_up >= s->n_prefill && st.decode_up >= s->n_decode;
            fy_client_destroy(c);
        }
    }
    if (!ok) {
        if (fy_now_s() - s->t_start > s->ready_timeout) {
            fprintf(stderr, "ferry: serve: the cluster is not up after %.0f s (see the logs); stopping\n",
                    s->ready_timeout);
            s->first_rc = 1;
            fy_sup_request_stop(sup);
        }
        return;
    }
    s->ready = true;
    snapshot(s);
    fprintf(stderr, "ferry: serve: cluster ready in %.1f s: router at %s, %d prefill and %d decode workers\n",
            fy_now_s() - s->t_start, s->router_url, s->n_prefill, s->n_decode);
    if (s->prompt) {
        if (pthread_create(&s->first, NULL, first_request, s) == 0) s->first_started = true;
    } else if (s->once) {
        fy_sup_request_stop(sup);
    }
}

/* ---- our own /health and /metrics ---------------------------------------------------------- */

/* nng thread: 200 when the cluster came up and every child runs, else 503
 * naming the first that does not; every child's state either way. */
static void on_health(void *arg, const char *path, fy_http_reply_t *reply)
{
    serve_t *s = arg;
    fy_sup_info_t info[MAX_CHILDREN];
    pthread_mutex_lock(&s->mu);
    memcpy(info, s->info, (size_t)s->n_children * sizeof(info[0]));
    bool ready = s->info_ready;
    pthread_mutex_unlock(&s->mu);
    json_t *kids = json_array();
    char reason[160] = "";
    if (!ready) snprintf(reason, sizeof(reason), "the cluster is starting");
    for (int i = 0; i < s->n_children; i++) {
        const fy_sup_info_t *k = &info[i];
        if (!reason[0] && k->state != FY_SUP_RUNNING)
            snprintf(reason, sizeof(reason), "%s: %s", k->name, fy_sup_state_str(k->state));
        json_t *o =
            json_pack("{s:s, s:s, s:i, s:i, s:i, s:f, s:f, s:s}", "name", k->name, "state", fy_sup_state_str(k->state),
                      "pid", (int)k->pid, "restarts", k->restarts, "health_kills", k->health_kills, "up_s", k->up_s,
                      "restart_in_s", k->restart_in_s, "last_exit", k->last_exit);
        if (o) json_array_append_new(kids, o);
    }
    json_t *body = json_pack("{s:s, s:o}", "status", reason[0] ? "unavailable" : "ok", "children", kids);
    if (body && reason[0]) json_object_set_new(body, "reason", json_string(reason));
    char *text = body ? json_dumps(body, JSON_COMPACT | JSON_REAL_PRECISION(6)) : NULL;
    json_decref(body);
    char *copy = text ? fy_strdup(text) : NULL;
    free(text);
    if (!copy) {
        fy_httpd_reply_error(reply, 500, "internal", "out of memory");
        return;
    }
    reply->status = reason[0] ? 503 : 200;
    reply->content_type = "application/json";
    reply->body = copy;
    reply->body_len = strlen(copy);
    reply->body_owned = 1;
}

/* nng thread */
static void on_metrics(void *arg, const char *path, fy_http_reply_t *reply)
{
    serve_t *s = arg;
    fy_httpd_reply_metrics(reply, s->reg);
}

/* The series of every child added so far (docs/operations.md, "ferry serve"). */
static fy_status_t metrics_setup(serve_t *s, const char *served)
{
    fy_status_t st =
        fy_metrics_create_labeled((const char *const[]){"model_name", served, "role", "serve", NULL}, &s->reg);
    if (!st)
        st = fy_metrics_gauge(s->reg, "ferry:serve_cluster_ready",
                              "1 once every child was ready and the router saw every worker", NULL, &s->cluster_ready);
    for (int i = 0; i < s->n_children && !st; i++) {
        fy_sup_info_t k;
        fy_sup_info(s->sup, i, &k);
        child_series_t *m = &s->series[i];
        const char *l[] = {"child", k.name, NULL};
        st = fy_metrics_gauge(s->reg, "ferry:serve_child_up", "1 while the child runs and said it is ready", l, &m->up);
        if (!st)
            st = fy_metrics_counter(s->reg, "ferry:serve_child_restarts_total", "Restarts of the child", l,
                                    &m->restarts);
        if (!st)
            st = fy_metrics_counter(s->reg, "ferry:serve_child_health_kills_total",
                                    "SIGKILLs of the child for a silent /health or a start past serve.start_timeout", l,
                                    &m->kills);
        if (!st)
            st = fy_metrics_gauge(s->reg, "ferry:serve_child_restart_in_seconds",
                                  "Seconds until the child's restart while it backs off, else 0", l, &m->restart_in);
        for (int j = 0; j < N_STATES && !st; j++) {
            const char *ls[] = {"child", k.name, "state", fy_sup_state_str((fy_sup_state_t)j), NULL};
            st = fy_metrics_gauge(s->reg, "ferry:serve_child_state", "1 for the child's state, 0 for the others", ls,
                                  &m->state[j]);
        }
    }
    return st;
}

/* snprintf that reports truncation (a path too long) */
static bool fmt(char *out, size_t cap, const char *f, ...) __attribute__((format(printf, 3, 4)));

static bool fmt(char *out, size_t cap, const char *f, ...)
{
    va_list ap;
    va_start(ap, f);
    int n = vsnprintf(out, cap, f, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= cap) {
        fprintf(stderr, "ferry: serve: a path or setting is too long: %.60s...\n", out);
        return false;
    }
    return true;
}

static int mkdir_p(const char *dir)
{
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof(tmp), "%s", dir);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0755) && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(tmp, 0755) && errno != EEXIST ? -1 : 0;
}

/* Each run starts its children's logs afresh: the previous run's file
 * becomes path.1 (an older .1 goes), so old errors never mix with new
 * ones.  A file that cannot be moved is appended to, with a warning. */
static void rotate_log(const char *path)
{
    char old[PATH_MAX];
    if (!fmt(old, sizeof(old), "%s.1", path)) return;
    if (rename(path, old) && errno != ENOENT)
        fprintf(stderr, "ferry: serve: cannot move %s to %s (%s): this run appends to it\n", path, old,
                strerror(errno));
}

static void usage(FILE *f)
{
    fprintf(f, "usage: ferry serve " USAGE "\n"
               "  a router, prefill.count prefill and decode.count decode workers from one configuration,\n"
               "  each its own process, supervised: restarted when they exit or their /health goes silent\n"
               "  -c, --config FILE      the cluster's configuration (relative paths in it: to its folder); every\n"
               "                         key: `ferry config --markdown`, or docs/operations.md's key reference\n"
               "      --set S.KEY=VALUE  override a key (repeatable, applied in order; relative paths in it: to the\n"
               "                         working directory)\n"
               "      --spec SPEC        short for --set decode.spec=SPEC\n"
               "      --prompt TEXT      once the cluster is ready, send this prompt and stream the answer\n"
               "      --chat             apply the model's chat template to --prompt\n"
               "  -n, --max-tokens N     the answer's length at most (default 128)\n"
               "      --once             stop the cluster after the first answer\n"
               "  -h, --help\n");
}

/* Takes --prompt/--once/... (ours) and hands -c/--set/--spec, in order,
 * to cargv (the cluster's, for fy_cluster_config; cargv[0] is set).
 * 0: parsed; -1: --help answered; else the exit status. */
static int parse_serve(int argc, char **argv, serve_t *s, char **cargv, int cap, int *cargc_p)
{
    enum { O_PROMPT = 256, O_CHAT, O_ONCE, O_SET, O_SPEC };
    static const struct option opts[] = {
        {"config", required_argument, 0, 'c'},
        {"set", required_argument, 0, O_SET},
        {"spec", required_argument, 0, O_SPEC},
        {"prompt", required_argument, 0, O_PROMPT},
        {"chat", no_argument, 0, O_CHAT},
        {"once", no_argument, 0, O_ONCE},
        {"max-tokens", required_argument, 0, 'n'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    int cargc = 0, c;
    bool have_config = false;
    long n;
    cargv[cargc++] = "ferry serve";
    optind = 1;
    while ((c = getopt_long(argc, argv, "c:n:h", opts, NULL)) != -1) {
        switch (c) {
        case O_PROMPT: s->prompt = optarg; break;
        case O_CHAT: s->chat = true; break;
        case O_ONCE: s->once = true; break;
        case 'n':
            if (!fy_cli_parse_int("--max-tokens", optarg, 1, 1 << 20, &n)) return 2;
            s->max_tokens = (int32_t)n;
            break;
        case 'c':
        case O_SET:
        case O_SPEC:
            if (cargc + 3 > cap) {
                fprintf(stderr, "ferry: serve: too many arguments\n");
                return 2;
            }
            have_config |= c == 'c';
            cargv[cargc++] = c == 'c' ? "-c" : c == O_SET ? "--set" : "--spec";
            cargv[cargc++] = optarg;
            break;
        case 'h': usage(stdout); return -1;
        default: usage(stderr); return 2;
        }
    }
    if (!fy_cli_no_operands("serve", argc, argv, usage)) return 2;
    if (!have_config) {
        fprintf(stderr, "ferry: serve: needs -c FILE, the cluster's configuration: the model, the router's and the "
                        "workers' addresses, how many workers (configs/local.ini is one to start from)\n");
        usage(stderr);
        return 2;
    }
    cargv[cargc] = NULL;
    *cargc_p = cargc;
    return 0;
}

/* the openssl CLI with argv in dir; its output into dir/openssl.log */
static bool run_openssl(const char *dir, char *const *argv)
{
    pid_t pid = fork();
    if (pid < 0) return false;
    if (pid == 0) {
        char logp[PATH_MAX];
        if (chdir(dir) || snprintf(logp, sizeof(logp), "openssl.log") < 0 || !freopen(logp, "a", stdout)) _exit(126);
        dup2(1, 2);
        umask(077);
        execvp("openssl", argv);
        _exit(127);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return false;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static bool write_small(const char *dir, const char *name, const char *text)
{
    char p[PATH_MAX];
    if (!fmt(p, sizeof(p), "%s/%s", dir, name)) return false;
    FILE *f = fopen(p, "w");
    if (!f) return false;
    bool ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok;
}

#define ETCD_TLS_USERS 2
static const char *const ETCD_TLS_USER[ETCD_TLS_USERS] = {"ferry-router", "ferry-worker"};

/* serve.etcd_tls: in dir (0700, files 0600): a CA, etcd's server
 * certificate for 127.0.0.1 (also clientAuth: etcd's JSON gateway dials
 * its own gRPC port with it under --client-cert-auth) and a client
 * certificate per user (CN = ETCD_TLS_USER[i]), each made once: a restart
 * keeps them (running children hold them).  P-256 keys, 10 years: the CA
 * key never leaves this folder. */
static fy_status_t make_etcd_pki(const char *dir)
{
    if (mkdir(dir, 0700) && errno != EEXIST) {
        fprintf(stderr, "ferry: serve: serve.etcd_tls: cannot create %s: %s\n", dir, strerror(errno));
        return FY_ERR_IO;
    }
    struct stat sb;
    if (lstat(dir, &sb) || !S_ISDIR(sb.st_mode) || sb.st_uid != geteuid() || (sb.st_mode & 077)) {
        fprintf(stderr, "ferry: serve: serve.etcd_tls: %s must be a folder of this user's alone (mode 700)\n", dir);
        return FY_ERR_INVALID;
    }
    char p[PATH_MAX];
    if (!fmt(p, sizeof(p), "%s/ca.pem", dir)) return FY_ERR_INVALID;
    if (!access(p, R_OK)) return FY_OK; /* made before */
    char *ca[] = {
        "openssl", "req",  "-x509",      "-newkey", "ec",   "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout",
        "ca.key",  "-out", "ca.pem.new", "-days",   "3650", "-subj",    "/CN=ferry-etcd-ca",       NULL};
    bool ok = write_small(dir, "server.ext", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n") &&
              write_small(dir, "client.ext", "extendedKeyUsage=clientAuth\n") && run_openssl(dir, ca);
    for (int i = -1; ok && i < ETCD_TLS_USERS; i++) {
        const char *who = i < 0 ? "server" : ETCD_TLS_USER[i];
        char key[96], csr[96], pem[96], subj[96];
        snprintf(key, sizeof(key), "%s.key", who);
        snprintf(csr, sizeof(csr), "%s.csr", who);
        snprintf(pem, sizeof(pem), "%s.pem", who);
        /* clients: O=, no CN: with auth on, etcd 3.4's JSON gateway refuses a certificate with a CN */
        snprintf(subj, sizeof(subj), i < 0 ? "/CN=%s" : "/O=%s", i < 0 ? "ferry-etcd" : who);
        char *req[] = {"openssl", "req",     "-newkey", "ec",   "-pkeyopt", "ec_paramgen_curve:P-256",
                       "-nodes",  "-keyout", key,       "-out", csr,        "-subj",
                       subj,      NULL};
        char *sign[] = {"openssl",    "x509",
                        "-req",       "-in",
                        csr,          "-CA",
                        "ca.pem.new", "-CAkey",
                        "ca.key",     "-CAcreateserial",
                        "-out",       pem,
                        "-days",      "3650",
                        "-extfile",   i < 0 ? "server.ext" : "client.ext",
                        NULL};
        ok = run_openssl(dir, req) && run_openssl(dir, sign);
    }
    char np[PATH_MAX];
    if (ok) ok = fmt(np, sizeof(np), "%s/ca.pem.new", dir) && !rename(np, p); /* last: the mark of a whole set */
    if (!ok) {
        fprintf(stderr,
                "ferry: serve: serve.etcd_tls: making the CA and certificates in %s failed (see "
                "openssl.log there; is openssl installed?)\n",
                dir);
        return FY_ERR_IO;
    }
    return FY_OK;
}

/* a random password (hex) into dir/NAME.password, 0600, made once */
static bool make_password(const char *dir, const char *name, char out[65])
{
    char p[PATH_MAX];
    if (!fmt(p, sizeof(p), "%s/%s.password", dir, name)) return false;
    int fd = open(p, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n = read(fd, out, 64);
        close(fd);
        if (n != 64) return false;
        out[64] = 0;
        return true;
    }
    uint8_t r[32];
    randombytes_buf(r, sizeof(r));
    sodium_bin2hex(out, 65, r, sizeof(r));
    sodium_memzero(r, sizeof(r));
    fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    bool ok = fd >= 0 && write(fd, out, 64) == 64;
    if (fd >= 0) ok = !close(fd) && ok;
    return ok;
}

/* serve.etcd_tls's RBAC, once (the mark: pki/rbac.done): runs etcd by
 * itself (argv), and through its gateway with the routers' certificate
 * (before auth is on, any certificate of the CA may) adds root (a random
 * password it keeps), a role ferry-CLUSTER with readwrite on
 * /ferry/CLUSTER/ alone, the users ETCD_TLS_USER with random passwords
 * (pki/USER.password) in that role, and turns auth on; then stops it.
 * etcd's prefix model has no finer grant that fits: a worker writes its
 * own record and a router its own and its tag, all under that prefix. */
static fy_status_t setup_rbac(const char *pki, char *const *argv, const char *client, const char *cluster)
{
    char mark[PATH_MAX];
    if (!fmt(mark, sizeof(mark), "%s/rbac.done", pki)) return FY_ERR_INVALID;
    if (!access(mark, F_OK)) return FY_OK;
    pid_t pid = fork();
    if (pid < 0) return FY_ERR_INTERNAL;
    if (pid == 0) {
        char logp[PATH_MAX];
        if (fmt(logp, sizeof(logp), "%s/etcd-setup.log", pki) && freopen(logp, "a", stdout)) dup2(1, 2);
        execv(argv[0], argv);
        _exit(127);
    }
    fy_etcd_tls_t t = {.ca = ""};
    fy_etcd_t *e = NULL;
    fy_status_t st = fmt(t.ca, sizeof(t.ca), "%s/ca.pem", pki) &&
                             fmt(t.cert, sizeof(t.cert), "%s/%s.pem", pki, ETCD_TLS_USER[0]) &&
                             fmt(t.key, sizeof(t.key), "%s/%s.key", pki, ETCD_TLS_USER[0])
                         ? fy_etcd_create_tls(client, &t, 1.0, &e)
                         : FY_ERR_INVALID;
    fy_etcd_kvs_t k = {0};
    double t0 = fy_now_s();
    while (!st && fy_etcd_range_prefix(e, "/", &k)) { /* until it answers */
        if (fy_now_s() - t0 > 30) st = FY_ERR_TIMEOUT;
        struct timespec ts = {.tv_nsec = 100000000};
        nanosleep(&ts, NULL);
    }
    fy_etcd_kvs_free(&k);
    char pw[65] = "", json[1024], role[160], b64k[256], b64e[256], pfx[160];
    snprintf(role, sizeof(role), "ferry-%s", cluster);
    snprintf(pfx, sizeof(pfx), "/ferry/%s/", cluster);
    sodium_bin2base64(b64k, sizeof(b64k), (const uint8_t *)pfx, strlen(pfx), sodium_base64_VARIANT_ORIGINAL);
    pfx[strlen(pfx) - 1] = '0'; /* the range's end: '/' + 1 */
    sodium_bin2base64(b64e, sizeof(b64e), (const uint8_t *)pfx, strlen(pfx), sodium_base64_VARIANT_ORIGINAL);
    const char *step = "reaching it";
#define POST(what, path, ...)                                                                                          \
    if (!st) {                                                                                                         \
        step = what;                                                                                                   \
        snprintf(json, sizeof(json), __VA_ARGS__);                                                                     \
        st = fy_etcd_post(e, path, json);                                                                              \
    }
    if (!st && !make_password(pki, "root", pw)) st = FY_ERR_IO;
    POST("adding root", "/v3/auth/user/add", "{\"name\":\"root\",\"password\":\"%s\"}", pw);
    POST("granting root", "/v3/auth/user/grant", "{\"user\":\"root\",\"role\":\"root\"}");
    POST("adding the role", "/v3/auth/role/add", "{\"name\":\"%s\"}", role);
    POST("granting the role", "/v3/auth/role/grant",
         "{\"name\":\"%s\",\"perm\":{\"permType\":\"READWRITE\",\"key\":\"%s\",\"range_end\":\"%s\"}}", role, b64k,
         b64e);
    for (int u = 0; u < ETCD_TLS_USERS; u++) {
        if (!st && !make_password(pki, ETCD_TLS_USER[u], pw)) st = FY_ERR_IO;
        POST("adding a user", "/v3/auth/user/add", "{\"name\":\"%s\",\"password\":\"%s\"}", ETCD_TLS_USER[u], pw);
        POST("granting a user", "/v3/auth/user/grant", "{\"user\":\"%s\",\"role\":\"%s\"}", ETCD_TLS_USER[u], role);
    }
    POST("enabling auth", "/v3/auth/enable", "{}");
#undef POST
    sodium_memzero(pw, sizeof(pw));
    sodium_memzero(json, sizeof(json));
    if (st)
        fprintf(stderr,
                "ferry: serve: serve.etcd_tls: setting up etcd's users failed at %s: %s (etcd's log: "
                "%s/etcd-setup.log)\n",
                step, e ? fy_etcd_last_error(e) : "no client", pki);
    fy_etcd_destroy(e);
    kill(pid, SIGTERM);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {}
    if (!st) {
        int fd = open(mark, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
        if (fd < 0 || close(fd)) st = FY_ERR_IO;
    }
    return st;
}

/* etcd as a child (cluster.etcd on this host's loopback): stopped last,
 * after the workers; probed on its own /health, with a timeout of its own.
 * pki: serve.etcd_tls's folder (NULL: plain http): TLS on the client
 * port, --client-cert-auth, and /health on plain http at port + 2
 * (--listen-metrics-urls: the probe holds no certificate). */
static fy_status_t add_etcd(serve_t *s, const char *endpoints, const char *data, const char *run_dir,
                            const char *log_dir, double health_timeout, const char *pki, const char *cluster_name)
{
    char first[256], host[200], dir[PATH_MAX], client[256], peer[256], cluster[300], logp[PATH_MAX];
    char cert[PATH_MAX], key[PATH_MAX], ca[PATH_MAX], metrics[256];
    snprintf(first, sizeof(first), "%.*s", (int)strcspn(endpoints, ","), endpoints);
    const char *hp = !strncmp(first, "http://", 7) ? first + 7 : !strncmp(first, "https://", 8) ? first + 8 : first;
    const char *colon = strrchr(hp, ':');
    int port = colon ? atoi(colon + 1) : 0;
    snprintf(host, sizeof(host), "%.*s", colon ? (int)(colon - hp) : 0, hp);
    if (port <= 0 || port >= 65535 || (strcmp(host, "127.0.0.1") && strcmp(host, "localhost"))) {
        fprintf(stderr,
                "ferry: serve: cluster.etcd = '%s' is not on this host's loopback: etcd is not ours to start "
                "(serve.etcd_data = \"\" says so quietly)\n",
                endpoints);
        return FY_OK;
    }
    if (!fmt(dir, sizeof(dir), "%s/etcd", run_dir)) return FY_ERR_INVALID;
    if (data) snprintf(dir, sizeof(dir), "%s", data);
    snprintf(client, sizeof(client), "%s://%s:%d", pki ? "https" : "http", host, port);
    snprintf(metrics, sizeof(metrics), "http://%s:%d", host, port + 2);
    snprintf(peer, sizeof(peer), "http://%s:%d", host, port + 1);
    if (pki && (!fmt(cert, sizeof(cert), "%s/server.pem", pki) || !fmt(key, sizeof(key), "%s/server.key", pki) ||
                !fmt(ca, sizeof(ca), "%s/ca.pem", pki)))
        return FY_ERR_INVALID;
    snprintf(cluster, sizeof(cluster), "ferry-etcd=%s", peer);
    if (!fmt(logp, sizeof(logp), "%s/etcd.log", log_dir)) return FY_ERR_INVALID;
    char exe[PATH_MAX] = "";
    const char *path = getenv("PATH");
    for (const char *d = path ? path : "/usr/bin:/bin"; *d && !exe[0];) {
        size_t n = strcspn(d, ":");
        if (snprintf(exe, sizeof(exe), "%.*s/etcd", (int)n, d) >= (int)sizeof(exe) || access(exe, X_OK)) exe[0] = 0;
        d += n + (d[n] == ':');
    }
    if (!exe[0]) {
        fprintf(stderr, "ferry: serve: cluster.etcd is on this host but etcd is not installed (make deps installs "
                        "etcd-server; or serve.etcd_data = \"\" to run it yourself)\n");
        return FY_ERR_NOT_FOUND;
    }
    char *argv[] = {exe,          "--name",
                    "ferry-etcd", "--data-dir",
                    dir,          "--listen-client-urls",
                    client,       "--advertise-client-urls",
                    client,       "--listen-peer-urls",
                    peer,         "--initial-advertise-peer-urls",
                    peer,         "--initial-cluster",
                    cluster,      "--log-level",
                    "warn",       NULL,
                    NULL,         NULL,
                    NULL,         NULL,
                    NULL,         NULL,
                    NULL,         NULL,
                    NULL,         NULL};
    if (pki) {
        char **a = argv + 17;
        *a++ = "--cert-file", *a++ = cert, *a++ = "--key-file", *a++ = key, *a++ = "--trusted-ca-file", *a++ = ca;
        *a++ = "--client-cert-auth", *a++ = "--listen-metrics-urls", *a++ = metrics;
    }
    if (pki && setup_rbac(pki, argv, client, cluster_name)) return FY_ERR_IO;
    int idx;
    rotate_log(logp);
    if (fy_sup_add(s->sup, "etcd", argv, logp, true, &idx) || fy_sup_set_health(s->sup, idx, pki ? metrics : client) ||
        fy_sup_set_health_timeout(s->sup, idx, health_timeout) || fy_sup_set_stop(s->sup, idx, 2, -1))
        return FY_ERR_INVALID;
    return FY_OK;
}

int fy_cmd_serve(int argc, char **argv)
{
    serve_t s = {.max_tokens = 128, .first_rc = 0};
    char *cargv[256];
    int cargc = 0;
    int prc = parse_serve(argc, argv, &s, cargv, 256, &cargc);
    if (prc) return prc < 0 ? 0 : prc;
    fy_config_t *cfg;
    fy_status_t st = fy_cluster_config(cargc, cargv, USAGE, &cfg);
    if (st == FY_ERR_CANCELLED) return 0;
    if (st) return 2;
    pthread_mutex_init(&s.mu, NULL);
    int rc = 1;
    /* every key read once, here (serve_config.h); cfg is kept to be added to and written out */
    fy_serve_conf_t *sc = fy_calloc(1, sizeof(*sc));
    if (!sc || fy_serve_conf_read(cfg, sc)) goto out;
    const char *run_dir = sc->run_dir, *logs = sc->logs, *secret = sc->secret, *router_listen = sc->router_listen;
    const char *router_http = sc->router_http, *p_listen = sc->p_listen, *d_listen = sc->d_listen;
    const char *p_metrics = sc->p_metrics, *d_metrics = sc->d_metrics, *serve_metrics = sc->serve_metrics;
    const char *etcd = sc->etcd, *etcd_data = sc->etcd_data, *router_events = sc->router_events;
    const char *cluster_name = sc->cluster_name;
    int64_t n_prefill = sc->n_prefill, n_decode = sc->n_decode, max_restarts = sc->max_restarts;
    int64_t n_routers = sc->n_routers;
    double backoff = sc->backoff, backoff_max = sc->backoff_max, window = sc->window, grace = sc->grace;
    double health_timeout = sc->health_timeout, start_timeout = sc->start_timeout;
    double etcd_health_timeout = sc->etcd_health_timeout;
    bool etcd_tls = sc->etcd_tls;
    if (etcd_tls && (strncmp(etcd, "https://127.0.0.1:", 18) || strchr(etcd, ',') || (etcd_data && !*etcd_data))) {
        fprintf(stderr,
                "ferry: serve: serve.etcd_tls = true needs cluster.etcd = https://127.0.0.1:PORT (one endpoint, not "
                "'%s') and an etcd of serve's own (serve.etcd_data not empty): it sets up that etcd's TLS\n",
                etcd);
        goto out;
    }
    /* the routers' HTTPS files, checked once here (each router checks them
     * again): a missing or open key is refused before anything starts */
    fy_httpd_limits_t router_lim = sc->router_lim;
    if (fy_httpd_limits_check(&router_lim)) goto out;
    bool router_tls = router_lim.tls_cert[0] != 0;
    if (n_routers > 1 && !*etcd) {
        fprintf(stderr, "ferry: serve: serve.routers = %lld needs cluster.etcd: routers find workers there\n",
                (long long)n_routers);
        goto out;
    }
    if (backoff_max < backoff) {
        fprintf(stderr, "ferry: serve: serve.restart_backoff_max (%g s) is below serve.restart_backoff (%g s)\n",
                backoff_max, backoff);
        goto out;
    }
    s.n_prefill = (int)n_prefill;
    s.n_decode = (int)n_decode;
    s.ready_timeout = start_timeout;
    snprintf(s.router_url, sizeof(s.router_url), "%s", router_listen);
    if (mkdir_p(run_dir)) {
        fprintf(stderr, "ferry: serve: cannot create %s: %s\n", run_dir, strerror(errno));
        goto out;
    }
    char path[PATH_MAX], log_dir[PATH_MAX], set[512];
    snprintf(log_dir, sizeof(log_dir), "%s", logs ? logs : "");
    if (!logs) snprintf(log_dir, sizeof(log_dir), "%s/logs", run_dir);
    if (mkdir_p(log_dir)) {
        fprintf(stderr, "ferry: serve: cannot create %s: %s\n", log_dir, strerror(errno));
        goto out;
    }
    if (!secret || !*secret) {
        if (!fmt(path, sizeof(path), "%s/kv.secret", run_dir) || !fmt(set, sizeof(set), "kv.secret_file=%s", path) ||
            fy_config_set(cfg, set))
            goto out;
        secret = path;
    }
    if (fy_cluster_make_secret(secret)) goto out; /* O_EXCL, 0600; an existing one must be the owner's alone */
    /* serve.etcd_tls: the CA for everyone (cluster.ini); each child's certificate by --set below */
    char pki[PATH_MAX], set_ecert[2][PATH_MAX + 32], set_ekey[2][PATH_MAX + 32], set_euser[2][64],
        set_epw[2][PATH_MAX + 40];
    if (etcd_tls) {
        if (!fmt(pki, sizeof(pki), "%s/etcd-pki", run_dir) || make_etcd_pki(pki) ||
            !fmt(set, sizeof(set), "cluster.etcd_ca=%s/ca.pem", pki) || fy_config_set(cfg, set))
            goto out;
        for (int u = 0; u < ETCD_TLS_USERS; u++)
            if (!fmt(set_ecert[u], sizeof(set_ecert[u]), "cluster.etcd_cert=%s/%s.pem", pki, ETCD_TLS_USER[u]) ||
                !fmt(set_ekey[u], sizeof(set_ekey[u]), "cluster.etcd_key=%s/%s.key", pki, ETCD_TLS_USER[u]) ||
                !fmt(set_euser[u], sizeof(set_euser[u]), "cluster.etcd_user=%s", ETCD_TLS_USER[u]) ||
                !fmt(set_epw[u], sizeof(set_epw[u]), "cluster.etcd_password_file=%s/%s.password", pki,
                     ETCD_TLS_USER[u]))
                goto out;
    }
    snprintf(s.secret, sizeof(s.secret), "%s", secret);
    char conf[PATH_MAX];
    if (!fmt(conf, sizeof(conf), "%s/cluster.ini", run_dir) || fy_config_write(cfg, conf)) goto out;

    /* the role binaries live next to this one */
    char self[PATH_MAX], bindir[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (len <= 0) {
        fprintf(stderr, "ferry: serve: cannot find this binary: %s\n", strerror(errno));
        goto out;
    }
    self[len] = 0;
    snprintf(bindir, sizeof(bindir), "%s", self);
    char *slash = strrchr(bindir, '/');
    if (slash) *slash = 0;

    fy_sup_params_t sp;
    fy_sup_params_default(&sp);
    sp.max_restarts = (int)max_restarts;
    sp.restart_backoff_s = backoff;
    sp.restart_backoff_max_s = backoff_max;
    sp.restart_window_s = window;
    sp.stop_grace_s = grace;
    sp.health_timeout_s = health_timeout;
    sp.health_interval_s = health_timeout > 0 && health_timeout / 4 < 1 ? health_timeout / 4 : 1;
    sp.start_timeout_s = start_timeout;
    sp.fatal_startup = true;
    sp.log_echo_mark = ": error: "; /* common/log.h's "TIME NAME: error: ..." */
    if (fy_sup_create(&sp, &s.sup)) goto out;
    char bin[PATH_MAX], logp[PATH_MAX], name[64], addr[256], set_name[128], set_addr[320], maddr[256], set_maddr[320];
    if (!fmt(bin, sizeof(bin), "%s/ferry-router", bindir)) goto out;
    /* the router drains its requests for serve.stop_grace when stopped,
     * and has ROUTER_STOP_MARGIN_S more to end the rest and exit */
    char set_drain[64];
    snprintf(set_drain, sizeof(set_drain), "router.drain_timeout=%g", grace);
    int idx;
    if (*etcd && (!etcd_data || *etcd_data) &&
        add_etcd(&s, etcd, etcd_data, run_dir, log_dir, etcd_health_timeout, etcd_tls ? pki : NULL, cluster_name))
        goto out;
    for (int r = 0; r < n_routers; r++) {
        /* router r: every address of the router's at port + 2r */
        char rname[32], sets[3][320], a[256];
        const char *base[3] = {router_listen, router_events, router_http};
        const char *key[3] = {"listen", "events", "http"};
        snprintf(rname, sizeof(rname), r ? "router-%d" : "router", r);
        char *rargv[20] = {bin, "-c", conf, "--set", set_drain};
        int na = 5;
        for (int k = 0; k < 3 && r > 0; k++) {
            if (!*base[k]) continue;
            if (!fy_cluster_addr_plus(base[k], 2 * r, a, sizeof(a))) {
                fprintf(stderr, "ferry: serve: router.%s = '%s': expected tcp://HOST:PORT or ipc://PATH\n", key[k],
                        base[k]);
                goto out;
            }
            snprintf(sets[k], sizeof(sets[k]), "router.%s=%s", key[k], a);
            rargv[na++] = "--set", rargv[na++] = sets[k];
        }
        if (etcd_tls) {
            rargv[na++] = "--set", rargv[na++] = set_ecert[0], rargv[na++] = "--set", rargv[na++] = set_ekey[0];
            rargv[na++] = "--set", rargv[na++] = set_euser[0], rargv[na++] = "--set", rargv[na++] = set_epw[0];
        }
        rargv[na] = NULL;
        char rhttp[256] = "";
        if (*router_http && !fy_cluster_addr_plus(router_http, 2 * r, rhttp, sizeof(rhttp))) goto out;
        if (!fmt(logp, sizeof(logp), "%s/%s.log", log_dir, rname)) goto out;
        rotate_log(logp);
        /* the probe speaks plain HTTP: a router behind TLS is watched for its exit alone */
        if (fy_sup_add(s.sup, rname, rargv, logp, true, &idx) || fy_sup_set_ready(s.sup, idx, FY_CLUSTER_READY_ENV) ||
            (*rhttp && !router_tls && fy_sup_set_health(s.sup, idx, rhttp)) ||
            fy_sup_set_stop(s.sup, idx, 0, grace + ROUTER_STOP_MARGIN_S))
            goto out;
    }
    if (!*router_http && health_timeout > 0)
        fprintf(stderr, "ferry: serve: router.http is empty: a wedged router goes unnoticed (only its exit is seen)\n");
    else if (router_tls && health_timeout > 0)
        fprintf(stderr, "ferry: serve: router.http speaks HTTPS (router.tls_cert) and the health probe plain HTTP: a "
                        "wedged router goes unnoticed (only its exit is seen)\n");
    for (int role = 0; role < 2; role++) {
        const char *rname = role ? "decode" : "prefill", *base = role ? d_listen : p_listen;
        const char *mbase = role ? d_metrics : p_metrics;
        int count = role ? s.n_decode : s.n_prefill;
        if (count > 0 && !(mbase && *mbase) && health_timeout > 0)
            fprintf(stderr,
                    "ferry: serve: %s.metrics is empty: a wedged %s worker goes unnoticed (only its exit is "
                    "seen)\n",
                    rname, rname);
        for (int i = 0; i < count; i++) {
            snprintf(name, sizeof(name), "%s-%d", rname, i);
            if (!fy_cluster_addr_plus(base, i, addr, sizeof(addr))) {
                fprintf(stderr, "ferry: serve: %s.listen = '%s': expected tcp://HOST:PORT or ipc://PATH\n", rname,
                        base);
                goto out;
            }
            if (!fmt(bin, sizeof(bin), "%s/ferry-%s", bindir, rname) ||
                !fmt(logp, sizeof(logp), "%s/%s.log", log_dir, name) ||
                !fmt(set_name, sizeof(set_name), "worker.name=%s", name) ||
                !fmt(set_addr, sizeof(set_addr), "%s.listen=%s", rname, addr))
                goto out;
            /* worker i serves /metrics on the role's metrics port + i */
            if (mbase && *mbase &&
                (!fy_cluster_addr_plus(mbase, i, maddr, sizeof(maddr)) || !strncmp(mbase, "ipc://", 6))) {
                fprintf(stderr, "ferry: serve: %s.metrics = '%s': expected http://HOST:PORT\n", rname, mbase);
                goto out;
            }
            if (mbase && *mbase && !fmt(set_maddr, sizeof(set_maddr), "%s.metrics=%s", rname, maddr)) goto out;
            char *wargv[18] = {bin, "-c", conf, "--set", set_name, "--set", set_addr, NULL};
            int nw = 7;
            if (mbase && *mbase) wargv[nw++] = "--set", wargv[nw++] = set_maddr;
            if (etcd_tls) {
                wargv[nw++] = "--set", wargv[nw++] = set_ecert[1], wargv[nw++] = "--set", wargv[nw++] = set_ekey[1];
                wargv[nw++] = "--set", wargv[nw++] = set_euser[1], wargv[nw++] = "--set", wargv[nw++] = set_epw[1];
            }
            wargv[nw] = NULL;
            rotate_log(logp);
            if (fy_sup_add(s.sup, name, wargv, logp, false, &idx) ||
                fy_sup_set_ready(s.sup, idx, FY_CLUSTER_READY_ENV) ||
                (mbase && *mbase && fy_sup_set_health(s.sup, idx, maddr)) || fy_sup_set_stop(s.sup, idx, 1, -1))
                goto out;
        }
    }
    s.n_children = fy_sup_count(s.sup);
    if (metrics_setup(&s, sc->served)) goto out;
    if (serve_metrics && *serve_metrics) { /* before any child: a port taken is our own start-up error */
        if (fy_httpd_create(serve_metrics, &s.http) || fy_httpd_route(s.http, "/health", on_health, &s) ||
            fy_httpd_route(s.http, "/metrics", on_metrics, &s)) {
            fprintf(stderr, "ferry: serve: cannot serve serve.metrics = '%s' (the error is above)\n", serve_metrics);
            goto out;
        }
    }
    snapshot(&s);
    g_sup = s.sup;
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    s.t_start = fy_now_s();
    if (fy_sup_start(s.sup)) goto out;
    fprintf(stderr, "ferry: serve: started %d router(s)%s and %d prefill and %d decode workers; logs in %s%s%s\n",
            (int)n_routers, *etcd ? " (membership in etcd)" : "", s.n_prefill, s.n_decode, log_dir,
            s.http ? "; our /health and /metrics on " : "", s.http ? serve_metrics : "");
    st = fy_sup_run(s.sup, on_poll, &s, 0.2);
    if (s.first_started) pthread_join(s.first, NULL);
    rc = st == FY_OK ? s.first_rc : 1;
    if (st == FY_ERR_PEER)
        fprintf(stderr, "ferry: serve: stopped: a child could not start or run (its error is above; logs in %s)\n",
                log_dir);
    else
        fprintf(stderr, "ferry: serve: cluster stopped\n");
out:
    g_sup = NULL;
    fy_httpd_destroy(s.http); /* its callbacks read the supervisor's names */
    fy_sup_destroy(s.sup);
    fy_metrics_destroy(s.reg);
    fy_config_destroy(cfg);
    fy_free(sc);
    pthread_mutex_destroy(&s.mu);
    return rc;
}

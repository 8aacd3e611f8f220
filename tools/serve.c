/*
 * serve.c - `ferry serve`: a whole local cluster from one configuration:
 * the router, prefill.count prefill workers and decode.count decode
 * workers, each a child process (bin/ferry-router, -prefill, -decode next
 * to this binary), supervised by tools/supervise.c: a crashed child is
 * reported and restarted; Ctrl-C or SIGTERM stops them all in order.
 *
 * The children read one resolved configuration (the file plus every
 * --set, written to RUN_DIR/cluster.ini) and their own name and address:
 * worker i of a role listens on the role's listen port + i.  The
 * deployment's secret (prefix-block names, the control plane's keys) is
 * created in RUN_DIR once, mode 0600.
 * With --prompt, a first request is sent when every worker is up, and
 * with --once the cluster stops after it.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "client.h"
#include "cluster.h"
#include "config.h"
#include "log.h"
#include "mem.h"
#include "supervise.h"

#define MAX_CHILDREN 64

static fy_sup_t *g_sup; /* for the signal handler */

static void on_signal(int sig)
{
    if (g_sup) fy_sup_request_stop(g_sup);
}

typedef struct serve {
    fy_sup_t *sup;
    char router_url[256];
    char secret[PATH_MAX]; /* the deployment's secret: its own clients authenticate with it */
    int n_prefill, n_decode;
    bool ready;
    double t_start, ready_timeout;
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
            for (;;) {
                fy_client_update_t u;
                if ((st = fy_client_poll(c, &sm, 1.0, &u))) {
                    fprintf(stderr, "ferry: serve: polling the first request: %s\n", u.message);
                    break;
                }
                fwrite(u.text, 1, u.text_len, stdout);
                fflush(stdout);
                if (!u.done) continue;
                printf("\n");
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

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Every poll_s from the supervisor's loop: is the cluster up yet? */
static void on_poll(void *arg, fy_sup_t *sup)
{
    serve_t *s = arg;
    if (s->ready) return;
    fy_client_t *c;
    fy_client_status_t st;
    if (fy_client_create(s->router_url, s->secret, 0.5, &c) != FY_OK) return;
    bool ok = fy_client_status(c, &st) == FY_OK && st.prefill_up >= s->n_prefill && st.decode_up >= s->n_decode;
    fy_client_destroy(c);
    if (!ok) {
        if (mono() - s->t_start > s->ready_timeout) {
            fprintf(stderr, "ferry: serve: the cluster is not up after %.0f s (see the logs); stopping\n",
                    s->ready_timeout);
            s->first_rc = 1;
            fy_sup_request_stop(sup);
        }
        return;
    }
    s->ready = true;
    fprintf(stderr, "ferry: serve: cluster ready in %.1f s: router at %s, %d prefill and %d decode workers\n",
            mono() - s->t_start, s->router_url, s->n_prefill, s->n_decode);
    if (s->prompt) {
        if (pthread_create(&s->first, NULL, first_request, s) == 0) s->first_started = true;
    } else if (s->once) {
        fy_sup_request_stop(sup);
    }
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

/* Splits --prompt/--once/... (ours) from -c/--set (the cluster's). */
int fy_cmd_serve(int argc, char **argv)
{
    serve_t s = {.max_tokens = 128, .ready_timeout = 120, .first_rc = 0};
    char *cargv[256];
    int cargc = 0;
    cargv[cargc++] = "ferry serve";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long n;
        if (!strcmp(a, "--prompt") && v) {
            s.prompt = v, i++;
        } else if (!strcmp(a, "--chat")) {
            s.chat = true;
        } else if (!strcmp(a, "--once")) {
            s.once = true;
        } else if ((!strcmp(a, "-n") || !strcmp(a, "--max-tokens")) && v) {
            if (!fy_cli_parse_int("--max-tokens", v, 1, 1 << 20, &n)) return 2;
            s.max_tokens = (int32_t)n, i++;
        } else if (cargc < 250) {
            cargv[cargc++] = argv[i];
        }
    }
    fy_config_t *cfg;
    fy_status_t st = fy_cluster_config(cargc, cargv,
                                       "-c FILE [--set section.key=value]... [--prompt TEXT [--chat] [-n N]] [--once]",
                                       &cfg);
    if (st == FY_ERR_CANCELLED) return 0;
    if (st) return 2;
    int rc = 1;
    const char *run_dir, *logs, *secret, *router_listen, *p_listen, *d_listen, *p_metrics, *d_metrics;
    int64_t n_prefill, n_decode, max_restarts;
    double backoff, grace;
    if (fy_config_string(cfg, "serve", "run_dir", "run", &run_dir) ||
        fy_config_string(cfg, "serve", "logs", NULL, &logs) ||
        fy_config_int(cfg, "serve", "max_restarts", 5, -1, 1000, &max_restarts) ||
        fy_config_duration(cfg, "serve", "restart_backoff", 0.5, 0, 3600, &backoff) ||
        fy_config_duration(cfg, "serve", "stop_grace", 10, 0, 3600, &grace) ||
        fy_config_string(cfg, "kv", "secret_file", NULL, &secret) ||
        fy_config_string(cfg, "router", "listen", "tcp://127.0.0.1:7400", &router_listen) ||
        fy_config_string(cfg, "prefill", "listen", "tcp://127.0.0.1:7410", &p_listen) ||
        fy_config_string(cfg, "decode", "listen", "tcp://127.0.0.1:7420", &d_listen) ||
        fy_config_string(cfg, "prefill", "metrics", NULL, &p_metrics) ||
        fy_config_string(cfg, "decode", "metrics", NULL, &d_metrics) ||
        fy_config_int(cfg, "prefill", "count", 1, 0, 16, &n_prefill) ||
        fy_config_int(cfg, "decode", "count", 1, 1, 16, &n_decode))
        goto out;
    s.n_prefill = (int)n_prefill;
    s.n_decode = (int)n_decode;
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
    sp.stop_grace_s = grace;
    if (fy_sup_create(&sp, &s.sup)) goto out;
    char bin[PATH_MAX], logp[PATH_MAX], name[64], addr[256], set_name[128], set_addr[320], maddr[256], set_maddr[320];
    if (!fmt(bin, sizeof(bin), "%s/ferry-router", bindir) || !fmt(logp, sizeof(logp), "%s/router.log", log_dir))
        goto out;
    char *rargv[] = {bin, "-c", conf, NULL};
    if (fy_sup_add(s.sup, "router", rargv, logp, true, NULL)) goto out;
    for (int role = 0; role < 2; role++) {
        const char *rname = role ? "decode" : "prefill", *base = role ? d_listen : p_listen;
        const char *mbase = role ? d_metrics : p_metrics;
        int count = role ? s.n_decode : s.n_prefill;
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
                fprintf(stderr, "ferry: serve: %s.metrics = '%s': expected tcp://HOST:PORT\n", rname, mbase);
                goto out;
            }
            if (mbase && *mbase && !fmt(set_maddr, sizeof(set_maddr), "%s.metrics=%s", rname, maddr)) goto out;
            char *wargv[] = {bin, "-c", conf, "--set", set_name, "--set", set_addr, NULL, NULL, NULL};
            if (mbase && *mbase) wargv[7] = "--set", wargv[8] = set_maddr;
            if (fy_sup_add(s.sup, name, wargv, logp, false, NULL)) goto out;
        }
    }
    g_sup = s.sup;
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    s.t_start = mono();
    if (fy_sup_start(s.sup)) goto out;
    fprintf(stderr, "ferry: serve: started the router and %d prefill and %d decode workers; logs in %s\n",
            s.n_prefill, s.n_decode, log_dir);
    st = fy_sup_run(s.sup, on_poll, &s, 0.2);
    if (s.first_started) pthread_join(s.first, NULL);
    rc = st == FY_OK ? s.first_rc : 1;
    fprintf(stderr, "ferry: serve: cluster stopped\n");
out:
    g_sup = NULL;
    fy_sup_destroy(s.sup);
    fy_config_destroy(cfg);
    return rc;
}

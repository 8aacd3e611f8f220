/*
 * cluster_util.c - a ferry cluster of real processes for tests (see
 * cluster_util.h).
 */
#include <dirent.h>
#include "tests/cluster_util.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "kernels/backend.h"
#include "common/clock.h"
#include "common/cluster.h"
#include "common/metrics.h"
#include "engine/engine.h"
#include "rpc/etcd.h"
#include "common/mem.h"
#include "model/model.h"
#include "engine/runner.h"
#include "tests/testutil.h"

/* a command a worker does not answer within this is retried elsewhere or
 * failed: a sanitizer build (FY_DEBUG) on a loaded 2-core machine has
 * missed 5 s (test_loopback_same_tokens in the full ASan run at load 8) */
#ifdef FY_DEBUG
#define TC_COMMAND_TIMEOUT "15s"
#else
#define TC_COMMAND_TIMEOUT "5s"
#endif

const char *tc_model(void) { return fy_test_default_model(); }

bool tc_bins_available(void)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/ferry-router", fy_test_bindir());
    if (access(path, X_OK)) {
        print_message("skipped: %s is not built\n", path);
        return false;
    }
    return true;
}

bool tc_available(void) { return tc_bins_available() && tc_model() != NULL; }

static pid_t spawn(const char *const *wrap, char *const argv[], const char *log)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid != 0) return pid;
    /* the child: dies with the test, writes to its log */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
    }
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    char *full[64];
    int n = 0;
    for (int i = 0; wrap && wrap[i] && n < 40; i++) full[n++] = (char *)wrap[i];
    for (int i = 0; argv[i] && n < 63; i++) full[n++] = argv[i];
    full[n] = NULL;
    execvp(full[0], full);
    fprintf(stderr, "exec %s: %s\n", full[0], strerror(errno));
    _exit(127);
}

static void add_proc(tc_cluster_t *c, const char *name, const char *const *wrap, char *const argv[])
{
    tc_proc_t *p = &c->procs[c->n_procs++];
    char log[sizeof(p->log)];
    snprintf(p->name, sizeof(p->name), "%s", name);
    size_t off = 0;
    for (int i = 0; argv[i]; i++) {
        size_t l = strlen(argv[i]) + 1;
        assert_true(off + l <= sizeof(p->args));
        memcpy(p->args + off, argv[i], l);
        off += l;
        p->n_args++;
    }
    p->wrap = wrap;
    if (snprintf(log, sizeof(log), "%s/%s.log", c->dir, name) >= (int)sizeof(log)) fail_msg("path too long");
    memcpy(p->log, log, sizeof(log));
    p->pid = spawn(wrap, argv, p->log);
    assert_true(p->pid > 0);
}

void tc_print_logs(const tc_cluster_t *c)
{
    for (int i = 0; i < c->n_procs; i++) {
        size_t len;
        char *t = fy_test_read_file(c->procs[i].log, &len);
        /* the last 16 KiB of each: the end is where things went wrong (and
         * cmocka's print_message would cut a long log short) */
        const char *tail = t && len > 16384 ? t + len - 16384 : t;
        printf("---- %s (pid %d)%s ----\n%s\n", c->procs[i].name, (int)c->procs[i].pid,
               t && len > 16384 ? ", last 16 KiB" : "", tail ? tail : "(no log)");
        fflush(stdout);
        fy_free(t);
    }
}

void tc_status(tc_cluster_t *c, fy_client_status_t *s)
{
    fy_status_t st = fy_client_status(c->client, s);
    if (st) {
        tc_print_logs(c);
        fail_msg("router status: %s", fy_status_str(st));
    }
}

void tc_start(tc_cluster_t *c, const tc_opts_t *o)
{
    memset(c, 0, sizeof(*c));
    /* each cluster its own directory: two may run at once */
    static int seq;
    const char *tmp = fy_test_tmpdir();
    assert_true(strlen(tmp) < sizeof(c->dir) - 64);
    snprintf(c->dir, sizeof(c->dir), "%s/c%d", tmp, seq++);
    assert_int_equal(mkdir(c->dir, 0700), 0);
    c->n_prefill = o->n_prefill;
    c->n_decode = o->n_decode;
    if (o->router_url)
        snprintf(c->router_url, sizeof(c->router_url), "%s", o->router_url);
    else
        snprintf(c->router_url, sizeof(c->router_url), "ipc://%s/router", c->dir);
    if (o->events_url)
        snprintf(c->events_url, sizeof(c->events_url), "%s", o->events_url);
    else
        snprintf(c->events_url, sizeof(c->events_url), "ipc://%s/events", c->dir);
    char *secret = c->secret;
    snprintf(c->secret, sizeof(c->secret), "%s/kv.secret", c->dir);
    assert_int_equal(fy_cluster_make_secret(secret), FY_OK);
    snprintf(c->conf, sizeof(c->conf), "%s/cluster.ini", c->dir);
    FILE *f = fopen(c->conf, "w");
    assert_non_null(f);
    fprintf(f,
            "[model]\npath = %s\n[kv]\nsecret_file = %s\n"
            "[router]\nlisten = %s\nevents = %s\nhealth_timeout = 2s\nlease = 60s\ncommand_timeout = %s\n"
            "client_timeout = 120s\n"
            "[prefill]\ncount = %d\nthreads = 1\nkv_mem = 48MiB\nmax_seqs = 8\nmax_batch_tokens = %d\n"
            "[decode]\ncount = %d\nthreads = 1\nkv_mem = 48MiB\nmax_seqs = 32\nmax_batch_tokens = 128\n"
            "[worker]\nheartbeat = 100ms\n",
            o->model ? o->model : tc_model(), secret, c->router_url, c->events_url, TC_COMMAND_TIMEOUT, o->n_prefill,
            TC_PREFILL_STEP, o->n_decode);
    fclose(f);
    char bin[512];
    char *argv[64]; /* 3 + 2 + 2 + 2 * 16 common + 2 + 2 * 8 per worker + NULL */
    char sets[20][640];
    int na;
    /* the router */
    snprintf(bin, sizeof(bin), "%s/ferry-router", fy_test_bindir());
    na = 0;
    argv[na++] = bin, argv[na++] = "-c", argv[na++] = c->conf;
    for (int k = 0; k < 16 && o->common[k]; k++) argv[na++] = "--set", argv[na++] = (char *)o->common[k];
    argv[na] = NULL;
    if (!o->no_router) add_proc(c, "router", o->wrap[0], argv);
    snprintf(c->router_urls[0], sizeof(c->router_urls[0]), "%s", c->router_url);
    c->n_routers = o->n_routers > 1 ? o->n_routers : 1;
    assert_true(c->n_routers <= TC_MAX_ROUTERS);
    for (int r = 1; r < c->n_routers && !o->no_router; r++) {
        char rs[3][640], name[32];
        snprintf(name, sizeof(name), "router-%d", r);
        snprintf(c->router_urls[r], sizeof(c->router_urls[r]), "ipc://%s/router-%d", c->dir, r);
        snprintf(rs[0], sizeof(rs[0]), "router.listen=%s", c->router_urls[r]);
        snprintf(rs[1], sizeof(rs[1]), "router.events=ipc://%s/events-%d", c->dir, r);
        snprintf(rs[2], sizeof(rs[2]), "cluster.router_name=%s", name);
        na = 0;
        argv[na++] = bin, argv[na++] = "-c", argv[na++] = c->conf;
        for (int k = 0; k < 16 && o->common[k]; k++) argv[na++] = "--set", argv[na++] = (char *)o->common[k];
        for (int k = 0; k < 3; k++) argv[na++] = "--set", argv[na++] = rs[k];
        argv[na] = NULL;
        add_proc(c, name, o->wrap[0], argv);
    }
    /* the workers */
    for (int w = 0; w < o->n_prefill + o->n_decode; w++) {
        bool decode = w >= o->n_prefill;
        int idx = decode ? w - o->n_prefill : w;
        char name[32];
        snprintf(name, sizeof(name), "%s-%d", decode ? "decode" : "prefill", idx);
        snprintf(bin, sizeof(bin), "%s/ferry-%s", fy_test_bindir(), decode ? "decode" : "prefill");
        int ns = 0;
        na = 0;
        argv[na++] = bin, argv[na++] = "-c", argv[na++] = c->conf;
        snprintf(sets[ns], sizeof(sets[ns]), "worker.name=%s", name);
        argv[na++] = "--set", argv[na++] = sets[ns++];
        if (o->worker_url[w])
            snprintf(sets[ns], sizeof(sets[ns]), "%s.listen=%s", decode ? "decode" : "prefill", o->worker_url[w]);
        else
            snprintf(sets[ns], sizeof(sets[ns]), "%s.listen=ipc://%s/%s", decode ? "decode" : "prefill", c->dir, name);
        argv[na++] = "--set", argv[na++] = sets[ns++];
        for (int k = 0; k < 16 && o->common[k]; k++) argv[na++] = "--set", argv[na++] = (char *)o->common[k];
        if (o->metrics) {
            c->metrics_port[w] = tc_free_port();
            snprintf(sets[ns], sizeof(sets[ns]), "%s.metrics=http://127.0.0.1:%d", decode ? "decode" : "prefill",
                     c->metrics_port[w]);
            argv[na++] = "--set", argv[na++] = sets[ns++];
        }
        for (int k = 0; k < 8 && o->per_worker[w][k]; k++)
            argv[na++] = "--set", argv[na++] = (char *)o->per_worker[w][k];
        argv[na] = NULL;
        add_proc(c, name, o->wrap[w + 1], argv);
    }
    if (o->no_router) return;
    assert_int_equal(fy_client_create(c->router_url, c->secret, 5.0, &c->client), FY_OK);
    double t0 = fy_now_s();
    for (;;) {
        fy_client_status_t s;
        fy_status_t sst = fy_client_status(c->client, &s);
        if (sst == FY_OK && s.prefill_up == o->n_prefill && s.decode_up == o->n_decode) break;
        static double last_said;
        if (fy_now_s() - last_said > 10) { /* what it waits for, now and then */
            last_said = fy_now_s();
            if (sst)
                print_message("waiting for the router: %s\n", fy_status_str(sst));
            else
                print_message("waiting for the workers: %d prefill and %d decode up\n", s.prefill_up, s.decode_up);
        }
        for (int i = 0; i < c->n_procs; i++) {
            int status;
            if (waitpid(c->procs[i].pid, &status, WNOHANG) == c->procs[i].pid) {
                c->procs[i].pid = 0;
                tc_print_logs(c);
                fail_msg("%s exited during start-up (status 0x%x)", c->procs[i].name, status);
            }
        }
        if (fy_now_s() - t0 > 60) {
            tc_print_logs(c);
            fail_msg("the cluster did not come up within 60 s");
        }
        usleep(50000);
    }
}

void tc_kill(tc_cluster_t *c, const char *name)
{
    for (int i = 0; i < c->n_procs; i++) {
        tc_proc_t *p = &c->procs[i];
        if (strcmp(p->name, name) || !p->pid) continue;
        kill(p->pid, SIGKILL);
        waitpid(p->pid, NULL, 0);
        p->pid = 0;
        p->killed = true;
        return;
    }
    fail_msg("no process %s to kill", name);
}

void tc_restart(tc_cluster_t *c, const char *name)
{
    for (int i = 0; i < c->n_procs; i++) {
        tc_proc_t *p = &c->procs[i];
        if (strcmp(p->name, name)) continue;
        assert_int_equal(p->pid, 0);
        char *argv[64];
        char *a = p->args;
        for (int k = 0; k < p->n_args && k < 63; k++, a += strlen(a) + 1) argv[k] = a;
        argv[p->n_args < 63 ? p->n_args : 63] = NULL;
        p->pid = spawn(p->wrap, argv, p->log);
        assert_true(p->pid > 0);
        p->killed = false;
        return;
    }
    fail_msg("no process %s to restart", name);
}

int tc_children_of(pid_t ppid, pid_t *out, int cap)
{
    int n = 0;
    DIR *d = opendir("/proc");
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)) && n < cap) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        char path[300], buf[512];
        snprintf(path, sizeof(path), "/proc/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t k = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[k] = 0;
        const char *paren = strrchr(buf, ')');
        int parent = 0;
        char st = 0;
        if (paren && sscanf(paren + 1, " %c %d", &st, &parent) == 2 && parent == (int)ppid && st != 'Z')
            out[n++] = (pid_t)atoi(e->d_name);
    }
    closedir(d);
    return n;
}

bool tc_alive(tc_cluster_t *c, const char *name)
{
    for (int i = 0; i < c->n_procs; i++) {
        tc_proc_t *p = &c->procs[i];
        if (strcmp(p->name, name) || !p->pid) continue;
        int status;
        if (waitpid(p->pid, &status, WNOHANG) == p->pid) {
            p->pid = 0;
            return false;
        }
        return true;
    }
    return false;
}

void tc_stop(tc_cluster_t *c)
{
    fy_client_destroy(c->client);
    c->client = NULL;
    /* workers first, then the router */
    for (int i = c->n_procs - 1; i >= 0; i--)
        if (c->procs[i].pid) kill(c->procs[i].pid, SIGTERM);
    double t0 = fy_now_s();
    bool bad = false;
    char why[512] = "";
    for (int i = 0; i < c->n_procs; i++) {
        tc_proc_t *p = &c->procs[i];
        if (!p->pid) continue;
        int status = 0;
        pid_t r;
        while ((r = waitpid(p->pid, &status, WNOHANG)) == 0 && fy_now_s() - t0 < 20) usleep(20000);
        if (r == 0) {
            kill(p->pid, SIGKILL);
            waitpid(p->pid, &status, 0);
            bad = true;
            snprintf(why + strlen(why), sizeof(why) - strlen(why), " %s did not stop;", p->name);
        } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            bad = true;
            snprintf(why + strlen(why), sizeof(why) - strlen(why), " %s ended with status 0x%x;", p->name, status);
        }
        p->pid = 0;
    }
    if (bad) {
        tc_print_logs(c);
        fail_msg("unclean shutdown:%s", why);
    }
}

bool tc_wait_admittable(tc_cluster_t *c, const char *name, int32_t want, double timeout_s)
{
    double t0 = fy_now_s();
    int32_t last = -1;
    for (;;) {
        fy_client_status_t s;
        tc_status(c, &s);
        for (int i = 0; i < s.n_workers; i++)
            if (!strcmp(s.workers[i].name, name)) last = s.workers[i].admittable;
        if (last == want) return true;
        if (fy_now_s() - t0 > timeout_s) {
            print_message("%s: %d blocks admittable, expected %d\n", name, last, want);
            return false;
        }
        usleep(50000);
    }
}

void tc_collect(tc_cluster_t *c, fy_client_stream_t *s, tc_result_t *res, int n, double timeout_s)
{
#ifdef FY_DEBUG
    /* a sanitizer build computes several times slower: a prompt retried on
     * another prefill worker under UBSan at load 5 outlived 120 s */
    timeout_s *= 3;
#endif
    double t0 = fy_now_s();
    int left = n;
    for (int i = 0; i < n; i++) left -= res[i].done;
    while (left > 0) {
        for (int i = 0; i < n; i++) {
            if (res[i].done) continue;
            fy_client_update_t u;
            fy_status_t st = fy_client_poll(c->client, &s[i], 0.02, &u);
            if (st) {
                tc_print_logs(c);
                fail_msg("request %llu: poll failed: %s (%s)", (unsigned long long)s[i].id, fy_status_str(st),
                         u.message);
            }
            for (int32_t k = 0; k < u.n_tokens && res[i].n < 2048; k++) res[i].tokens[res[i].n++] = u.tokens[k];
            if (u.done) {
                res[i].done = true;
                res[i].error = u.error;
                snprintf(res[i].message, sizeof(res[i].message), "%s", u.message);
                snprintf(res[i].finish, sizeof(res[i].finish), "%s", u.finish);
                res[i].timings = u.timings;
                left--;
            }
        }
        if (fy_now_s() - t0 > timeout_s) {
            tc_print_logs(c);
            fail_msg("%d requests still running after %.0f s", left, timeout_s);
        }
    }
}

typedef struct ref_ctx {
    tc_result_t *res;
} ref_ctx_t;

static void on_ref(void *arg, const fy_event_t *ev)
{
    tc_result_t *r = arg;
    if (ev->kind == FY_EVENT_TOKEN && r->n < 2048) r->tokens[r->n++] = ev->token;
    if (ev->kind == FY_EVENT_FINISH || ev->kind == FY_EVENT_ERROR) {
        r->done = true;
        r->error = ev->kind == FY_EVENT_ERROR ? ev->status : FY_OK;
        snprintf(r->finish, sizeof(r->finish), "%s", fy_finish_reason_str(ev->reason));
    }
}

void tc_reference(const char *model, int32_t *const *prompts, const int32_t *lens, const int32_t *max_tokens, int n,
                  tc_result_t *res)
{
    tc_reference_opts(model, prompts, lens, max_tokens, n, NULL, res);
}

void tc_reference_opts(const char *model, int32_t *const *prompts, const int32_t *lens, const int32_t *max_tokens,
                       int n, const tc_ref_opts_t *o, tc_result_t *res)
{
    fy_model_t *m;
    fy_backend_t *be;
    fy_runner_t *r;
    fy_kv_hasher_t *h;
    fy_kvm_t *kvm;
    fy_engine_t *e;
    assert_int_equal(fy_model_load(model, &m), FY_OK);
    fy_backend_params_t bp = {.n_threads = 1};
    assert_int_equal(fy_backend_create("cpu", &bp, &be), FY_OK);
    fy_runner_params_t rp;
    fy_runner_params_default(&rp);
    rp.max_ctx = 4096;
    rp.kv_mem = 96 << 20;
    rp.max_seqs = rp.max_logits = 16;
    assert_int_equal(fy_runner_create(m, be, &rp, &r), FY_OK);
    assert_int_equal(fy_kv_hasher_create_random(&h), FY_OK);
    fy_kvm_params_t kp;
    fy_runner_kvm_params(r, &kp);
    kp.hasher = h;
    assert_int_equal(fy_kvm_create(&kp, &kvm), FY_OK);
    fy_engine_params_t ep;
    fy_engine_params_default(&ep);
    ep.max_num_seqs = 16;
    ep.max_num_batched_tokens = 512;
    ep.max_waiting = n + 1;
    if (o) ep.evict = o->evict;
    if (o && o->max_batch_tokens) ep.max_num_batched_tokens = o->max_batch_tokens;
    assert_int_equal(fy_engine_create(r, kvm, fy_model_tokenizer(m), &ep, &e), FY_OK);
    for (int i = 0; i < n; i++) {
        memset(&res[i], 0, sizeof(res[i]));
        fy_genspec_t q;
        fy_genspec_default(&q);
        q.max_tokens = max_tokens[i];
        q.ignore_eos = true;
        if (o && o->kv_budget) q.kv_budget = o->kv_budget[i];
        uint64_t id;
        assert_int_equal(fy_engine_submit(e, prompts[i], lens[i], &q, NULL, on_ref, &res[i], &id), FY_OK);
        for (int k = 0; o && k < 1000000 && !fy_engine_idle(e); k++) assert_int_equal(fy_engine_step(e), FY_OK);
    }
    for (int k = 0; k < 1000000 && !fy_engine_idle(e); k++) assert_int_equal(fy_engine_step(e), FY_OK);
    for (int i = 0; i < n; i++) assert_true(res[i].done && res[i].error == FY_OK);
    fy_engine_destroy(e);
    fy_kvm_destroy(kvm);
    fy_kv_hasher_destroy(h);
    fy_runner_destroy(r);
    fy_backend_destroy(be);
    fy_model_destroy(m);
}

int tc_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

int tc_http(int port, const char *method, const char *path, char **body_p)
{
    if (body_p) *body_p = NULL;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {
        .sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    char req[512];
    int n = snprintf(req, sizeof(req), "%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n%s\r\n", method,
                     path, port, strcmp(method, "POST") ? "" : "Content-Length: 0\r\n");
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) || write(fd, req, (size_t)n) != n) {
        close(fd);
        return -1;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = fy_malloc(cap);
    assert_non_null(buf);
    double t0 = fy_now_s();
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) < 0 || fy_now_s() - t0 > 5) break;
        if (!p.revents) continue;
        if (len + 1 == cap) {
            cap *= 2;
            buf = fy_realloc(buf, cap);
            assert_non_null(buf);
        }
        ssize_t r = read(fd, buf + len, cap - len - 1);
        if (r <= 0) break;
        len += (size_t)r;
    }
    close(fd);
    buf[len] = 0;
    int status = -1;
    if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1) status = -1;
    char *body = strstr(buf, "\r\n\r\n");
    if (body_p && body) {
        *body_p = fy_strdup(body + 4);
        assert_non_null(*body_p);
    }
    fy_free(buf);
    return status;
}

double tc_metric(const char *text, const char *series)
{
    double v = 0;
    if (fy_metrics_sample(text, series, &v) != FY_OK) fail_msg("no series %s in the metrics", series);
    return v;
}

int tc_http_dial(int port, double timeout_s)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {
        .sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(fd, (struct sockaddr *)&a, sizeof(a))) {
        close(fd);
        return -1;
    }
    struct timeval tv = {.tv_sec = (time_t)timeout_s,
                         .tv_usec = (suseconds_t)((timeout_s - (double)(time_t)timeout_s) * 1e6)};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

void tc_http_send(int fd, const char *method, const char *path, const char *key, const char *ctype, const char *body,
                  size_t len)
{
    char head[1024];
    int n = snprintf(head, sizeof(head),
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s%s%s%s%s%s"
                     "Content-Length: %zu\r\n\r\n",
                     method, path, key ? "Authorization: Bearer " : "", key ? key : "", key ? "\r\n" : "",
                     ctype ? "Content-Type: " : "", ctype ? ctype : "", ctype ? "\r\n" : "", len);
    const char *parts[2] = {head, body};
    size_t lens[2] = {(size_t)n, body ? len : 0};
    for (int i = 0; i < 2; i++) {
        const char *p = parts[i];
        size_t left = lens[i];
        while (left) {
            ssize_t k = send(fd, p, left, MSG_NOSIGNAL);
            if (k <= 0) return; /* the server may refuse a huge body before reading it all */
            p += k;
            left -= (size_t)k;
        }
    }
}

/* Undoes chunked transfer encoding in place; returns the decoded length. */
static size_t unchunk(char *b, size_t n)
{
    size_t in = 0, out = 0;
    while (in < n) {
        char *end;
        unsigned long sz = strtoul(b + in, &end, 16);
        char *crlf = memmem(b + in, n - in, "\r\n", 2);
        if (!crlf || end > crlf) break;
        in = (size_t)(crlf - b) + 2;
        if (sz == 0 || in + sz > n) {
            if (sz && in < n) { /* a cut-off last chunk: keep what came */
                memmove(b + out, b + in, n - in);
                out += n - in;
            }
            break;
        }
        memmove(b + out, b + in, sz);
        out += sz;
        in += sz + 2;
    }
    b[out] = 0;
    return out;
}

int tc_http_read(int fd, tc_http_resp_t *r)
{
    memset(r, 0, sizeof(*r));
    size_t cap = 1 << 16, n = 0;
    char *buf = fy_malloc(cap);
    assert_non_null(buf);
    char *hend = NULL;
    long clen = -1;
    bool chunked = false;
    for (;;) {
        if (n + 4096 > cap) {
            buf = fy_realloc(buf, cap *= 2);
            assert_non_null(buf);
        }
        ssize_t k = recv(fd, buf + n, cap - n - 1, 0);
        if (k <= 0) break;
        n += (size_t)k;
        buf[n] = 0;
        if (!hend && (hend = strstr(buf, "\r\n\r\n"))) {
            const char *cl = strcasestr(buf, "\r\nContent-Length:");
            if (cl && cl < hend) clen = atol(cl + 17);
            const char *te = strcasestr(buf, "\r\nTransfer-Encoding: chunked");
            chunked = te && te < hend;
        }
        if (hend && clen >= 0 && n >= (size_t)(hend + 4 - buf) + (size_t)clen) break;
        if (hend && chunked && n >= 5 && !memcmp(buf + n - 5, "0\r\n\r\n", 5)) break;
    }
    buf[n] = 0;
    if (sscanf(buf, "HTTP/1.%*d %d", &r->status) != 1) r->status = -1;
    hend = strstr(buf, "\r\n\r\n");
    size_t hl = hend ? (size_t)(hend - buf) : n;
    snprintf(r->head, sizeof(r->head), "%.*s", (int)hl, buf);
    r->len = hend ? n - hl - 4 : 0;
    r->body = fy_malloc(r->len + 1);
    assert_non_null(r->body);
    memcpy(r->body, hend ? hend + 4 : "", r->len);
    r->body[r->len] = 0;
    if (chunked) r->len = unchunk(r->body, r->len);
    fy_free(buf);
    return r->status;
}

void tc_http_free(tc_http_resp_t *r)
{
    fy_free(r->body);
    r->body = NULL;
}

/* ---- etcd ---- */

bool tc_etcd_available(void)
{
    const char *path = getenv("PATH");
    char buf[1024];
    snprintf(buf, sizeof(buf), "%s", path ? path : "/usr/bin:/bin");
    for (char *save, *d = strtok_r(buf, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        char p[1200];
        snprintf(p, sizeof(p), "%s/etcd", d);
        if (!access(p, X_OK)) return true;
    }
    print_message("skipped: etcd is not installed (make deps installs etcd-server)\n");
    return false;
}

void tc_etcd_certs(const char *dir, const char *const *names, int n) { tc_etcd_certs_ip(dir, "127.0.0.1", names, n); }

void tc_etcd_certs_ip(const char *dir, const char *ip, const char *const *names, int n)
{
    mkdir(dir, 0700);
    /* P-256 keys: quick to make; SAN IP:127.0.0.1 (curl checks it against the URL); the server's also
     * clientAuth: etcd's JSON gateway dials etcd's gRPC port with it under --client-cert-auth); clients'
     * with O=NAME and no CN: with auth on, etcd 3.4's gateway refuses a certificate with a CN */
    char cmd[4096];
    int k = snprintf(cmd, sizeof(cmd),
                     "set -e; cd '%s'; umask 077; o() { openssl \"$@\" >>openssl.log 2>&1; }; "
                     "K='-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes'; "
                     "o req -x509 $K -keyout ca.key -out ca.pem -days 2 -subj /CN=test-ca; "
                     "printf 'subjectAltName=IP:%s\\nextendedKeyUsage=serverAuth,clientAuth\\n' >server.ext; "
                     "o req $K -keyout server.key -out server.csr -subj /CN=etcd; "
                     "o x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 "
                     "-extfile server.ext; printf 'extendedKeyUsage=clientAuth\\n' >client.ext; "
                     "for u in",
                     dir, ip);
    for (int i = 0; i < n; i++) k += snprintf(cmd + k, sizeof(cmd) - (size_t)k, " '%s'", names[i]);
    snprintf(cmd + k, sizeof(cmd) - (size_t)k,
             "; do o req $K -keyout \"$u.key\" -out \"$u.csr\" -subj \"/O=$u\"; "
             "o x509 -req -in \"$u.csr\" -CA ca.pem -CAkey ca.key -CAcreateserial -out \"$u.pem\" -days 2 "
             "-extfile client.ext; done");
    int rc = system(cmd);
    if (rc != 0) fail_msg("making test certificates in %s failed (%d; see openssl.log there)", dir, rc);
}

fy_etcd_tls_t tc_etcd_tls_of(const char *certs, const char *name)
{
    fy_etcd_tls_t t = {.ca = ""};
    snprintf(t.ca, sizeof(t.ca), "%s/ca.pem", certs);
    if (name) {
        snprintf(t.cert, sizeof(t.cert), "%s/%s.pem", certs, name);
        snprintf(t.key, sizeof(t.key), "%s/%s.key", certs, name);
    }
    return t;
}

void tc_etcd_start_tls(tc_etcd_t *e, const char *dir, const char *certs)
{
    tc_etcd_start_tls_on(e, dir, certs, "127.0.0.1");
}

void tc_etcd_start_tls_on(tc_etcd_t *e, const char *dir, const char *certs, const char *host)
{
    memset(e, 0, sizeof(*e));
    e->port = tc_free_port();
    do e->peer_port = tc_free_port();
    while (e->peer_port == e->port);
    snprintf(e->host, sizeof(e->host), "%s", host);
    snprintf(e->url, sizeof(e->url), "https://%s:%d", host, e->port);
    snprintf(e->dir, sizeof(e->dir), "%s/etcd", dir);
    snprintf(e->log, sizeof(e->log), "%s/etcd.log", dir);
    snprintf(e->certs, sizeof(e->certs), "%s", certs);
    tc_etcd_spawn(e);
}

void tc_etcd_spawn(tc_etcd_t *e)
{
    char client[96], peer[96], cluster[128];
    char cert[600], key[600], ca[600];
    snprintf(cert, sizeof(cert), "%s/server.pem", e->certs);
    snprintf(key, sizeof(key), "%s/server.key", e->certs);
    snprintf(ca, sizeof(ca), "%s/ca.pem", e->certs);
    snprintf(client, sizeof(client), "%s://%s:%d", e->certs[0] ? "https" : "http", e->host, e->port);
    snprintf(peer, sizeof(peer), "http://%s:%d", e->host, e->peer_port);
    snprintf(cluster, sizeof(cluster), "t=%s", peer);
    pid_t parent = getpid();
    e->pid = fork();
    assert_true(e->pid >= 0);
    if (e->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        FILE *f = freopen(e->log, "a", stdout);
        if (f) dup2(1, 2);
        execlp("etcd", "etcd", "--name", "t", "--data-dir", e->dir, "--listen-client-urls", client,
               "--advertise-client-urls", client, "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
               "--initial-cluster", cluster, "--log-level", "warn", e->certs[0] ? "--cert-file" : NULL, cert,
               "--key-file", key, "--trusted-ca-file", ca, "--client-cert-auth", (char *)NULL);
        _exit(127);
    }
    /* up when a range answers */
    fy_etcd_t *c;
    fy_etcd_tls_t tls = tc_etcd_tls_of(e->certs, "root");
    assert_int_equal(fy_etcd_create_tls(e->url, e->certs[0] ? &tls : NULL, 0.5, &c), FY_OK);
    double t0 = fy_now_s();
    fy_etcd_kvs_t k = {0};
    while (fy_etcd_range_prefix(c, "/", &k) != FY_OK) {
        if (fy_now_s() - t0 > 20) fail_msg("etcd did not answer within 20 s (%s)", fy_etcd_last_error(c));
        usleep(50000);
    }
    fy_etcd_kvs_free(&k);
    fy_etcd_destroy(c);
}

void tc_etcd_start(tc_etcd_t *e, const char *dir, const char *host)
{
    memset(e, 0, sizeof(*e));
    e->port = tc_free_port();
    do e->peer_port = tc_free_port();
    while (e->peer_port == e->port);
    snprintf(e->host, sizeof(e->host), "%s", host);
    snprintf(e->url, sizeof(e->url), "http://%s:%d", host, e->port);
    snprintf(e->dir, sizeof(e->dir), "%s/etcd", dir);
    snprintf(e->log, sizeof(e->log), "%s/etcd.log", dir);
    tc_etcd_spawn(e);
}

static void rbac_post(fy_etcd_t *c, const char *path, const char *json)
{
    if (fy_etcd_post(c, path, json) != FY_OK) fail_msg("etcd %s %s: %s", path, json, fy_etcd_last_error(c));
}

void tc_etcd_rbac(tc_etcd_t *e, const char *cluster, const char *const *users, int n)
{
    fy_etcd_tls_t admin = tc_etcd_tls_of(e->certs, "root");
    fy_etcd_t *c;
    assert_int_equal(fy_etcd_create_tls(e->url, &admin, 2.0, &c), FY_OK);
    char json[1024], pfx[128], b64k[200], b64e[200], role[128], path[700];
    snprintf(role, sizeof(role), "ferry-%s", cluster);
    snprintf(pfx, sizeof(pfx), "/ferry/%s/", cluster);
    sodium_bin2base64(b64k, sizeof(b64k), (const uint8_t *)pfx, strlen(pfx), sodium_base64_VARIANT_ORIGINAL);
    pfx[strlen(pfx) - 1] = '0';
    sodium_bin2base64(b64e, sizeof(b64e), (const uint8_t *)pfx, strlen(pfx), sodium_base64_VARIANT_ORIGINAL);
    rbac_post(c, "/v3/auth/user/add", "{\"name\":\"root\",\"password\":\"root-pass-0123456789\"}");
    rbac_post(c, "/v3/auth/user/grant", "{\"user\":\"root\",\"role\":\"root\"}");
    snprintf(json, sizeof(json), "{\"name\":\"%s\"}", role);
    rbac_post(c, "/v3/auth/role/add", json);
    snprintf(json, sizeof(json),
             "{\"name\":\"%s\",\"perm\":{\"permType\":\"READWRITE\",\"key\":\"%s\",\"range_end\":\"%s\"}}", role, b64k,
             b64e);
    rbac_post(c, "/v3/auth/role/grant", json);
    for (int i = 0; i < n; i++) {
        char pw[64];
        snprintf(pw, sizeof(pw), "%s-pass-0123456789", users[i]);
        snprintf(json, sizeof(json), "{\"name\":\"%s\",\"password\":\"%s\"}", users[i], pw);
        rbac_post(c, "/v3/auth/user/add", json);
        snprintf(json, sizeof(json), "{\"user\":\"%s\",\"role\":\"%s\"}", users[i], role);
        rbac_post(c, "/v3/auth/user/grant", json);
        snprintf(path, sizeof(path), "%s/%s.password", e->certs, users[i]);
        assert_true(fy_test_write_file(path, pw, strlen(pw)));
        assert_int_equal(chmod(path, 0600), 0);
    }
    rbac_post(c, "/v3/auth/enable", "{}");
    fy_etcd_destroy(c);
}

void tc_etcd_kill(tc_etcd_t *e)
{
    if (e->pid <= 0) return;
    kill(e->pid, SIGKILL);
    waitpid(e->pid, NULL, 0);
    e->pid = 0;
}

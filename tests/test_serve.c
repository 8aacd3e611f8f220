/*
 * test_serve.c - `ferry serve` as an operator runs it, on loopback ports:
 * without -c it says what it needs; a bad --set value stops it with the
 * child's own error on its stderr (and a second run, logs started afresh,
 * only its own); a second cluster on the ports of a
 * running one exits naming the address instead of reporting the other's
 * cluster as its own; a worker killed again and again keeps coming back;
 * a SIGSTOPped (wedged) worker and router are killed and restarted; its
 * own /health and /metrics report all of it; SIGTERM stops the router
 * first, with its drain time on its command line.
 *
 * Every wait is on a condition (a line in serve's stderr, a state in its
 * /health, an exit) with a deadline.  Tests that need the model or the
 * binaries skip without them.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "common/clock.h"
#include "tests/cluster_util.h"
#include "common/mem.h"
#include "model/model.h"
#include "model/prompt.h"
#include "tests/testutil.h"

#define START_DEADLINE_S 90.0 /* model loads on a loaded 2-core machine */

/* ---- a `ferry serve` process ----------------------------------------------------------------- */

typedef struct proc {
    pid_t pid;
    char err[PATH_MAX]; /* its stdout and stderr */
} proc_t;

/* bin/ferry CMD ARGS..., its stdout and stderr into one file, dying with
 * the test */
static void ferry_spawn(proc_t *p, const char *name, const char *cmd, const char *const *args)
{
    snprintf(p->err, sizeof(p->err), "%s", fy_test_path(name));
    unlink(p->err);
    char ferry[PATH_MAX];
    snprintf(ferry, sizeof(ferry), "%s/ferry", fy_test_bindir());
    char *argv[40];
    int n = 0;
    argv[n++] = ferry;
    argv[n++] = (char *)cmd;
    for (int i = 0; args[i] && n < 39; i++) argv[n++] = (char *)args[i];
    argv[n] = NULL;
    pid_t parent = getpid();
    p->pid = fork();
    assert_true(p->pid >= 0);
    if (p->pid) return;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    int fd = open(p->err, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
    }
    execv(ferry, argv);
    _exit(127);
}

/* bin/ferry serve ARGS... */
static void serve_spawn(proc_t *p, const char *name, const char *const *args) { ferry_spawn(p, name, "serve", args); }

static char *read_text(const char *path)
{
    char *t = fy_test_read_file(path, NULL);
    return t ? t : fy_strdup("");
}

/* The process's wait status once it ends; fails after timeout_s (and
 * kills it). */
static int serve_wait(proc_t *p, double timeout_s)
{
    int fd = (int)syscall(SYS_pidfd_open, p->pid, 0);
    assert_true(fd >= 0);
    double deadline = fy_now_s() + timeout_s;
    for (;;) {
        double left = deadline - fy_now_s();
        if (left <= 0) break;
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, (int)(left * 1000) + 1) > 0) break;
    }
    close(fd);
    int st;
    if (waitpid(p->pid, &st, WNOHANG) == p->pid) return st;
    kill(p->pid, SIGKILL);
    waitpid(p->pid, &st, 0);
    char *t = read_text(p->err);
    fail_msg("ferry serve did not end within %.0f s; its output:\n%s", timeout_s, t);
    return -1;
}

/* Waits until the process's output holds text; fails (with the output)
 * when it ends first or after timeout_s. */
static void wait_text(proc_t *p, const char *text, double timeout_s)
{
    double deadline = fy_now_s() + timeout_s;
    for (;;) {
        char *t = read_text(p->err);
        bool found = strstr(t, text) != NULL;
        int st;
        bool ended = !found && waitpid(p->pid, &st, WNOHANG) == p->pid;
        if (found) {
            fy_free(t);
            return;
        }
        if (ended || fy_now_s() > deadline)
            fail_msg("no '%s' from ferry serve (%s); its output:\n%s", text, ended ? "it exited" : "timed out", t);
        fy_free(t);
        struct timespec ts = {.tv_nsec = 50000000};
        nanosleep(&ts, NULL); /* polling a file: no event to wait on */
    }
}

/* True when one line of text holds every one of the strings. */
static bool line_has(const char *text, const char *a, const char *b)
{
    for (const char *l = text; l && *l;) {
        const char *nl = strchr(l, '\n');
        size_t len = nl ? (size_t)(nl - l) : strlen(l);
        char line[2048];
        snprintf(line, sizeof(line), "%.*s", (int)(len < sizeof(line) ? len : sizeof(line) - 1), l);
        if (strstr(line, a) && (!b || strstr(line, b))) return true;
        l = nl ? nl + 1 : NULL;
    }
    return false;
}

/* ---- a cluster configuration ----------------------------------------------------------------- */

typedef struct ports {
    int router, events, http, prefill, decode, p_metrics, d_metrics, serve;
} ports_t;

static void pick_ports(ports_t *p)
{
    int *all[] = {&p->router, &p->events, &p->http, &p->prefill, &p->decode, &p->p_metrics, &p->d_metrics, &p->serve};
    for (size_t i = 0; i < FY_ARRAY_LEN(all); i++) {
        bool dup;
        do { /* tc_free_port may hand out one twice */
            *all[i] = tc_free_port();
            dup = false;
            for (size_t j = 0; j < i; j++) dup |= *all[j] == *all[i];
        } while (dup);
    }
}

/* One prefill and one decode worker on the ports, small caches. */
static const char *write_ini(const char *name, const ports_t *p)
{
    char model[PATH_MAX];
    if (!realpath(tc_model(), model)) fail_msg("model %s: %s", tc_model(), strerror(errno));
    char text[4096];
    int n = snprintf(text, sizeof(text),
                     "[model]\npath = %s\n"
                     "[router]\nlisten = tcp://127.0.0.1:%d\nevents = tcp://127.0.0.1:%d\nhttp = http://127.0.0.1:%d\n"
                     "[prefill]\ncount = 1\nlisten = tcp://127.0.0.1:%d\nmetrics = http://127.0.0.1:%d\nthreads = 1\n"
                     "kv_mem = 32MiB\nmax_seqs = 4\n"
                     "[decode]\ncount = 1\nlisten = tcp://127.0.0.1:%d\nmetrics = http://127.0.0.1:%d\nthreads = 1\n"
                     "kv_mem = 32MiB\nmax_seqs = 4\n"
                     "[serve]\nstop_grace = 5s\n",
                     model, p->router, p->events, p->http, p->prefill, p->p_metrics, p->decode, p->d_metrics);
    assert_true(n > 0 && (size_t)n < sizeof(text));
    const char *path = fy_test_path(name);
    assert_true(fy_test_write_file(path, text, (size_t)n));
    return path;
}

/* ---- its /health ----------------------------------------------------------------------------- */

typedef struct kid {
    char state[16];
    int pid, restarts, health_kills;
} kid_t;

/* serve's /health: the HTTP status, and the named child's entry (state
 * "" when absent or unanswered). */
static int serve_health(int port, const char *name, kid_t *k)
{
    memset(k, 0, sizeof(*k));
    char *body = NULL;
    int code = tc_http(port, "GET", "/health", &body);
    json_t *j = body ? json_loads(body, 0, NULL) : NULL;
    json_t *kids = json_object_get(j, "children");
    for (size_t i = 0; i < json_array_size(kids); i++) {
        json_t *o = json_array_get(kids, i);
        if (strcmp(json_string_value(json_object_get(o, "name")) ?: "", name)) continue;
        snprintf(k->state, sizeof(k->state), "%s", json_string_value(json_object_get(o, "state")) ?: "");
        k->pid = (int)json_integer_value(json_object_get(o, "pid"));
        k->restarts = (int)json_integer_value(json_object_get(o, "restarts"));
        k->health_kills = (int)json_integer_value(json_object_get(o, "health_kills"));
    }
    json_decref(j);
    fy_free(body);
    return code;
}

/* Waits until the named child runs as a process other than old_pid. */
static void wait_back(proc_t *p, int port, const char *name, int old_pid, kid_t *k, double timeout_s)
{
    double deadline = fy_now_s() + timeout_s;
    for (;;) {
        serve_health(port, name, k);
        if (!strcmp(k->state, "running") && k->pid && k->pid != old_pid) return;
        if (fy_now_s() > deadline) {
            char *t = read_text(p->err);
            fail_msg("%s did not come back within %.0f s (state '%s', pid %d); serve's output:\n%s", name, timeout_s,
                     k->state, k->pid, t);
        }
        struct timespec ts = {.tv_nsec = 50000000};
        nanosleep(&ts, NULL);
    }
}

static bool pid_gone(int pid) { return kill(pid, 0) < 0 && errno == ESRCH; }

/* ---- tests ----------------------------------------------------------------------------------- */

static void test_usage(void **state)
{
    if (!fy_test_have_bin("ferry")) skip();
    const char *none[] = {NULL}, *once[] = {"--once", "--set", "decode.count=1", NULL};
    const char *const *cases[] = {none, once};
    for (int i = 0; i < 2; i++) {
        proc_t p;
        serve_spawn(&p, "usage.out", cases[i]);
        int st = serve_wait(&p, 30);
        char *t = read_text(p.err);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 2 || !strstr(t, "needs -c FILE") ||
            !strstr(t, "usage: ferry serve -c FILE"))
            fail_msg("case %d: wait status 0x%x, output:\n%s", i, st, t);
        fy_free(t);
    }
}

static void test_bad_setting(void **state)
{
    if (!fy_test_have_bin("ferry") || !tc_available()) skip();
    ports_t ports;
    pick_ports(&ports);
    const char *ini = write_ini("bad.ini", &ports);
    char run[PATH_MAX + 32];
    snprintf(run, sizeof(run), "serve.run_dir=%s/run-bad", fy_test_tmpdir());
    /* twice in the same run folder: the second run's logs start afresh,
     * the first's kept as NAME.log.1, and only the second's error echoed */
    const char *bad[] = {"lots", "heaps"};
    for (int i = 0; i < 2; i++) {
        char set[64], want[64];
        snprintf(set, sizeof(set), "decode.kv_mem=%s", bad[i]);
        snprintf(want, sizeof(want), "'%s' is not a size", bad[i]);
        const char *args[] = {"-c", ini, "--set", run, "--set", set, NULL};
        proc_t p;
        serve_spawn(&p, "bad.out", args);
        int st = serve_wait(&p, START_DEADLINE_S);
        char *t = read_text(p.err);
        if (!WIFEXITED(st) || WEXITSTATUS(st) == 0 || !line_has(t, "decode.kv_mem", want) ||
            !line_has(t, "decode-0 (pid", "before it was ready: it cannot start") || strstr(t, "cluster ready") ||
            strstr(t, "restarting") || (i == 1 && strstr(t, "'lots'")))
            fail_msg("run %d: wait status 0x%x, output:\n%s", i, st, t);
        fy_free(t);
    }
    char path[PATH_MAX + 64];
    snprintf(path, sizeof(path), "%s/run-bad/logs/decode-0.log", fy_test_tmpdir());
    char *now = read_text(path);
    snprintf(path, sizeof(path), "%s/run-bad/logs/decode-0.log.1", fy_test_tmpdir());
    char *before = read_text(path);
    if (!strstr(now, "'heaps'") || strstr(now, "'lots'") || !strstr(before, "'lots'") || strstr(before, "'heaps'"))
        fail_msg("decode-0.log:\n%s\ndecode-0.log.1:\n%s", now, before);
    fy_free(now);
    fy_free(before);
}

/* One cluster, several lives. */
static void test_cluster(void **state)
{
    if (!fy_test_have_bin("ferry") || !tc_available()) skip();
    ports_t ports;
    pick_ports(&ports);
    const char *ini = write_ini("a.ini", &ports);
    char run_a[PATH_MAX + 32], metrics[64];
    snprintf(run_a, sizeof(run_a), "serve.run_dir=%s/run-a", fy_test_tmpdir());
    snprintf(metrics, sizeof(metrics), "serve.metrics=http://127.0.0.1:%d", ports.serve);
    const char *args[] = {"-c",    ini,
                          "--set", run_a,
                          "--set", metrics,
                          "--set", "serve.health_timeout=3s",
                          "--set", "serve.restart_backoff=50ms",
                          "--set", "serve.restart_backoff_max=200ms",
                          NULL};
    proc_t a;
    serve_spawn(&a, "a.out", args);
    wait_text(&a, "cluster ready", START_DEADLINE_S);
    kid_t router, prefill, decode;
    assert_int_equal(serve_health(ports.serve, "router", &router), 200);
    serve_health(ports.serve, "prefill-0", &prefill);
    serve_health(ports.serve, "decode-0", &decode);
    assert_string_equal(router.state, "running");
    assert_true(router.pid > 0 && prefill.pid > 0 && decode.pid > 0);

    /* `ferry request` with its stdout and stderr in one file (a pipe, a
     * log): the answer ends its line before the summary, which once
     * followed the answer's last word on the same line (stdout fully
     * buffered, its final newline written at exit) */
    char conf[PATH_MAX + 32];
    snprintf(conf, sizeof(conf), "%s/run-a/cluster.ini", fy_test_tmpdir());
    const char *req_args[] = {"-c", conf, "-p", "The capital of France is", "-n", "6", "--ignore-eos", NULL};
    proc_t q;
    ferry_spawn(&q, "request.out", "request", req_args);
    int qst = serve_wait(&q, 60);
    char *qt = read_text(q.err);
    if (!WIFEXITED(qst) || WEXITSTATUS(qst) != 0 || !strstr(qt, "\nferry: request "))
        fail_msg("ferry request: wait status 0x%x, output:\n%s", qst, qt);
    fy_free(qt);

    /* the router drains for serve.stop_grace when told to stop */
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/cmdline", router.pid);
    char cmd[4096];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    ssize_t len = read(fd, cmd, sizeof(cmd) - 1); /* /proc gives it in one read */
    close(fd);
    assert_true(len > 0);
    cmd[len] = '\0';
    bool drain = false;
    for (ssize_t i = 0; i < len; i += (ssize_t)strlen(cmd + i) + 1) drain |= !strcmp(cmd + i, "router.drain_timeout=5");
    if (!drain) fail_msg("the router's command line has no router.drain_timeout=5");

    /* a second cluster on the same ports: it must fail, naming the
     * address, and never call the first one's answers its own */
    char run_b[PATH_MAX + 32];
    snprintf(run_b, sizeof(run_b), "serve.run_dir=%s/run-b", fy_test_tmpdir());
    const char *args_b[] = {"-c", ini, "--set", run_b, "--once", NULL};
    proc_t b;
    serve_spawn(&b, "b.out", args_b);
    int st = serve_wait(&b, START_DEADLINE_S);
    char *t = read_text(b.err);
    if (!WIFEXITED(st) || WEXITSTATUS(st) == 0 || !line_has(t, "tcp://127.0.0.1:", "Address in use") ||
        !strstr(t, "it cannot start") || strstr(t, "cluster ready"))
        fail_msg("the second cluster: wait status 0x%x, output:\n%s", st, t);
    fy_free(t);
    kid_t again;
    assert_int_equal(serve_health(ports.serve, "router", &again), 200);
    assert_int_equal(again.pid, router.pid);

    /* a worker killed six times in quick succession keeps coming back */
    int pid = prefill.pid;
    for (int i = 0; i < 6; i++) {
        assert_int_equal(kill(pid, SIGKILL), 0);
        wait_back(&a, ports.serve, "prefill-0", pid, &prefill, 60);
        pid = prefill.pid;
    }
    assert_int_equal(prefill.restarts, 6);
    assert_int_equal(prefill.health_kills, 0);
    char *body = NULL;
    assert_int_equal(tc_http(ports.serve, "GET", "/metrics", &body), 200);
    assert_true(tc_metric(body, "ferry:serve_child_restarts_total{child=\"prefill-0\"}") == 6);
    assert_true(tc_metric(body, "ferry:serve_child_state{child=\"prefill-0\",state=\"running\"}") == 1);
    fy_free(body);

    /* wedged: a stopped decode worker, then a stopped router, are killed
     * and restarted */
    assert_int_equal(kill(decode.pid, SIGSTOP), 0);
    wait_back(&a, ports.serve, "decode-0", decode.pid, &again, 60);
    assert_int_equal(again.health_kills, 1);
    assert_int_equal(again.restarts, 1);
    assert_true(pid_gone(decode.pid));
    assert_int_equal(kill(router.pid, SIGSTOP), 0);
    wait_back(&a, ports.serve, "router", router.pid, &again, 60);
    assert_int_equal(again.health_kills, 1);
    assert_true(pid_gone(router.pid));
    t = read_text(a.err);
    if (!line_has(t, "decode-0 (pid", "had not answered /health for") ||
        !line_has(t, "router (pid", "had not answered /health for"))
        fail_msg("serve's output:\n%s", t);
    fy_free(t);
    wait_text(&a, "cluster ready", 1); /* still the one line */

    /* SIGTERM: the router goes first, then the workers */
    assert_int_equal(kill(a.pid, SIGTERM), 0);
    st = serve_wait(&a, 60);
    t = read_text(a.err);
    const char *r = strstr(t, "stopped router"), *p0 = strstr(t, "stopped prefill-0"),
               *d0 = strstr(t, "stopped decode-0");
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || !r || !p0 || !d0 || r > p0 || r > d0)
        fail_msg("stopping: wait status 0x%x, output:\n%s", st, t);
    fy_free(t);
}

/* A decode worker of three tensor ranks (decode.tp = 3) under ferry
 * serve: one follower rank SIGKILLed, the worker exits (status 3) and
 * serve starts the whole group again; `ferry request --status` lists it
 * up with its three ranks and a request is answered. */
static void test_rank_group_restarted(void **state)
{
    if (!fy_test_have_bin("ferry") || !tc_available()) skip();
    ports_t ports;
    pick_ports(&ports);
    const char *ini = write_ini("g.ini", &ports);
    char run[PATH_MAX + 32], metrics[64];
    snprintf(run, sizeof(run), "serve.run_dir=%s/run-g", fy_test_tmpdir());
    snprintf(metrics, sizeof(metrics), "serve.metrics=http://127.0.0.1:%d", ports.serve);
    const char *args[] = {"-c",    ini,           "--set", run, "--set", metrics, "--set", "serve.restart_backoff=50ms",
                          "--set", "decode.tp=3", NULL};
    proc_t g;
    serve_spawn(&g, "g.out", args);
    wait_text(&g, "cluster ready", START_DEADLINE_S);
    kid_t decode, again;
    serve_health(ports.serve, "decode-0", &decode);
    assert_true(decode.pid > 0);
    pid_t ranks[8];
    assert_int_equal(tc_children_of(decode.pid, ranks, 8), 2);
    assert_int_equal(kill(ranks[0], SIGKILL), 0);
    wait_back(&g, ports.serve, "decode-0", decode.pid, &again, 60);
    assert_int_equal(again.restarts, 1);
    assert_true(pid_gone(decode.pid) && pid_gone(ranks[0]) && pid_gone(ranks[1]));
    pid_t fresh[8];
    assert_int_equal(tc_children_of(again.pid, fresh, 8), 2);
    char *t = read_text(g.err);
    if (!line_has(t, "decode-0 (pid", "exited with status 3")) fail_msg("serve's output:\n%s", t);
    fy_free(t);
    char cmd[2 * PATH_MAX];
    snprintf(cmd, sizeof(cmd), "%s/ferry request -r tcp://127.0.0.1:%d --secret %s/run-g/kv.secret --status >%s 2>&1",
             fy_test_bindir(), ports.router, fy_test_tmpdir(), fy_test_path("status.out"));
    double t0 = fy_now_s();
    int rc = -1;
    for (;;) { /* until the router has the new incarnation up */
        rc = system(cmd);
        t = read_text(fy_test_path("status.out"));
        if ((rc == 0 && line_has(t, "decode-0", "up")) || fy_now_s() - t0 > 30) break;
        fy_free(t);
        struct timespec ts = {.tv_nsec = 100000000};
        nanosleep(&ts, NULL);
    }
    if (rc != 0 || !line_has(t, "decode-0", "3 ranks") || !line_has(t, "prefill-0", "1 rank,"))
        fail_msg("ferry request --status: status %d, output:\n%s", rc, t);
    fy_free(t);
    snprintf(cmd, sizeof(cmd),
             "%s/ferry request -r tcp://127.0.0.1:%d --secret %s/run-g/kv.secret -p hello -n 4 >%s 2>&1",
             fy_test_bindir(), ports.router, fy_test_tmpdir(), fy_test_path("req.out"));
    rc = system(cmd);
    t = read_text(fy_test_path("req.out"));
    if (rc != 0 || !strstr(t, "generated tokens: 4")) fail_msg("ferry request: status %d, output:\n%s", rc, t);
    fy_free(t);
    assert_int_equal(kill(g.pid, SIGTERM), 0);
    int st = serve_wait(&g, 60);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    for (int i = 0; i < 2; i++) assert_true(pid_gone(fresh[i]));
    fy_test_tmpdir_remove();
}

/* A prompt file of exactly n tokens of the default model: common words,
 * one token each. */
static const char *words_prompt(int n, const char *name)
{
    fy_model_t *m;
    assert_int_equal(fy_model_load(tc_model(), &m), FY_OK);
    static const char *const words[] = {" the", " of", " and", " to", " in", " is", " it", " that"};
    size_t cap = (size_t)n * 8 + 16, len = 0;
    char *text = fy_malloc(cap);
    assert_non_null(text);
    int32_t *ids = NULL, got = 0;
    for (int i = 0; i < n * 2 && got < n; i++) {
        len += (size_t)snprintf(text + len, cap - len, "%s", words[i % FY_ARRAY_LEN(words)]);
        assert_true(len < cap);
        assert_int_equal(fy_prompt_tokens(m, NULL, text, false, &ids, &got), FY_OK);
        fy_free(ids);
    }
    fy_model_destroy(m);
    if (got != n) fail_msg("no prompt of exactly %d tokens (%d)", n, got);
    const char *path = fy_test_path(name);
    assert_true(fy_test_write_file(path, text, len));
    fy_free(text);
    return path;
}

/* Workers whose kv_mem holds exactly their ctx's blocks (1024 tokens of
 * 8, 128 blocks) once started and then never admitted a prompt that
 * filled the context: admission keeps 1% of the pages free.  Now such a
 * worker is refused at start, naming the keys; with one block more, a
 * prompt that fills the context is served (issue 33). */
static void test_pool_holds_the_context(void **state)
{
    if (!fy_test_have_bin("ferry") || !tc_available()) skip();
    ports_t ports;
    pick_ports(&ports);
    const char *ini = write_ini("pool.ini", &ports);
    char run[PATH_MAX + 32];
    snprintf(run, sizeof(run), "serve.run_dir=%s/run-pool", fy_test_tmpdir());
    /* SmolLM2 at f16: 30 layers of 3 kv heads of 64, 23,040 bytes a token */
    const int64_t block = 8 * 23040;
    char pm[64], dm[64];
    snprintf(pm, sizeof(pm), "prefill.kv_mem=%lld", (long long)(128 * block));
    snprintf(dm, sizeof(dm), "decode.kv_mem=%lld", (long long)(128 * block));
    const char *args[] = {
        "-c",    ini, "--set", run, "--set", "kv.block_size=8", "--set", "prefill.ctx=1024", "--set", "decode.ctx=1024",
        "--set", pm,  "--set", dm,  NULL};
    proc_t p;
    serve_spawn(&p, "pool.out", args);
    int st = serve_wait(&p, START_DEADLINE_S);
    char *t = read_text(p.err);
    if (!WIFEXITED(st) || WEXITSTATUS(st) == 0 || strstr(t, "cluster ready") ||
        !line_has(t, ".kv_mem: its pool of 128 kv blocks admits 127 pages", "ctx = 1024 tokens needs 128") ||
        !line_has(t, "raise ", "ctx to 1016"))
        fail_msg("kv_mem of 128 blocks for ctx 1024: wait status 0x%x, output:\n%s", st, t);
    fy_free(t);

    snprintf(pm, sizeof(pm), "prefill.kv_mem=%lld", (long long)(129 * block));
    snprintf(dm, sizeof(dm), "decode.kv_mem=%lld", (long long)(129 * block));
    serve_spawn(&p, "pool2.out", args);
    wait_text(&p, "cluster ready", START_DEADLINE_S);
    const char *file = words_prompt(1016, "pool-1016.txt");
    char cmd[3 * PATH_MAX];
    snprintf(cmd, sizeof(cmd),
             "%s/ferry request -r tcp://127.0.0.1:%d --secret %s/run-pool/kv.secret -f %s -n 8 --ignore-eos --timeout "
             "120 >%s 2>&1",
             fy_test_bindir(), ports.router, fy_test_tmpdir(), file, fy_test_path("pool-req.out"));
    int rc = system(cmd);
    t = read_text(fy_test_path("pool-req.out"));
    if (rc != 0 || !strstr(t, "generated tokens: 8")) fail_msg("ferry request: status %d, output:\n%s", rc, t);
    fy_free(t);
    assert_int_equal(kill(p.pid, SIGTERM), 0);
    st = serve_wait(&p, 60);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* cluster.etcd on loopback with serve.routers = 2: etcd runs as a child,
 * both routers serve, and on SIGTERM the routers stop first, etcd last.
 * tls (serve.etcd_tls): the same over TLS with client certificates serve
 * made; a client with the CA but no certificate reads and writes nothing,
 * one with the routers' certificate lists the members. */
static void etcd_two_routers(bool tls)
{
    if (!fy_test_have_bin("ferry") || !tc_available()) skip();
    if (system("command -v etcd >/dev/null 2>&1")) {
        print_message("skipped: etcd is not installed (make deps installs etcd-server)\n");
        skip();
    }
    ports_t ports;
    pick_ports(&ports);
    const char *ini = write_ini("e.ini", &ports);
    char run[PATH_MAX + 32], metrics[64], etcd[96];
    snprintf(run, sizeof(run), "serve.run_dir=%s/run-e", fy_test_tmpdir());
    snprintf(metrics, sizeof(metrics), "serve.metrics=http://127.0.0.1:%d", ports.serve);
    int etcd_port = tc_free_port();
    snprintf(etcd, sizeof(etcd), "cluster.etcd=%s://127.0.0.1:%d", tls ? "https" : "http", etcd_port);
    const char *args[] = {"-c",    ini,
                          "--set", run,
                          "--set", metrics,
                          "--set", etcd,
                          "--set", "serve.routers=2",
                          "--set", "cluster.etcd_ttl=2s",
                          "--set", tls ? "serve.etcd_tls=true" : "serve.etcd_tls=false",
                          NULL};
    proc_t e;
    serve_spawn(&e, "e.out", args);
    wait_text(&e, "cluster ready", START_DEADLINE_S);
    kid_t k;
    const char *kids[] = {"etcd", "router", "router-1", "prefill-0", "decode-0"};
    for (size_t i = 0; i < FY_ARRAY_LEN(kids); i++) {
        serve_health(ports.serve, kids[i], &k);
        if (strcmp(k.state, "running")) fail_msg("%s is '%s', not running", kids[i], k.state);
    }
    /* router-1 (each address's port + 2) finds the workers through etcd;
     * `ferry request` given a dead router first moves on to it */
    char cmd[2 * PATH_MAX];
    snprintf(cmd, sizeof(cmd),
             "%s/ferry request -r tcp://127.0.0.1:%d,tcp://127.0.0.1:%d --secret %s/run-e/kv.secret -p hello -n 4 "
             ">%s 2>&1",
             fy_test_bindir(), tc_free_port(), ports.router + 2, fy_test_tmpdir(), fy_test_path("req.out"));
    double t0 = fy_now_s();
    int rc = -1;
    while ((rc = system(cmd)) != 0 && fy_now_s() - t0 < 30) { /* until router-1 has seen both workers */
        struct timespec ts = {.tv_nsec = 200000000};
        nanosleep(&ts, NULL);
    }
    char *t = read_text(fy_test_path("req.out"));
    if (rc != 0 || !strstr(t, "trying tcp://127.0.0.1:")) fail_msg("ferry request: status %d, output:\n%s", rc, t);
    fy_free(t);
    if (tls) {
        char pki[PATH_MAX];
        snprintf(pki, sizeof(pki), "%s/run-e/etcd-pki", fy_test_tmpdir());
        fy_etcd_tls_t anon = tc_etcd_tls_of(pki, NULL), router = tc_etcd_tls_of(pki, "ferry-router");
        fy_etcd_t *c;
        fy_etcd_kvs_t kv = {0};
        assert_int_equal(fy_etcd_create_tls(etcd + strlen("cluster.etcd="), &anon, 1.0, &c), FY_OK);
        assert_int_equal(fy_etcd_range_prefix(c, "/ferry/", &kv), FY_ERR_PEER);
        assert_int_equal(fy_etcd_put(c, "/ferry/ferry/routers/x", "{}", 2, 0), FY_ERR_PEER);
        print_message("without a certificate: %s\n", fy_etcd_last_error(c));
        fy_etcd_destroy(c);
        /* the routers' certificate without its user: etcd's RBAC says no */
        assert_int_equal(fy_etcd_create_tls(etcd + strlen("cluster.etcd="), &router, 1.0, &c), FY_OK);
        assert_int_not_equal(fy_etcd_range_prefix(c, "/ferry/", &kv), FY_OK);
        print_message("a certificate without a user: %s\n", fy_etcd_last_error(c));
        fy_etcd_destroy(c);
        /* with the user serve made: /ferry/ferry/ yes, outside it no */
        char pwp[PATH_MAX + 32], *pw;
        snprintf(pwp, sizeof(pwp), "%s/ferry-router.password", pki);
        assert_non_null(pw = read_text(pwp));
        snprintf(router.user, sizeof(router.user), "ferry-router");
        snprintf(router.password, sizeof(router.password), "%s", pw);
        fy_free(pw);
        assert_int_equal(fy_etcd_create_tls(etcd + strlen("cluster.etcd="), &router, 1.0, &c), FY_OK);
        assert_int_not_equal(fy_etcd_put(c, "/elsewhere", "x", 1, 0), FY_OK);
        assert_non_null(strstr(fy_etcd_last_error(c), "permission denied"));
        assert_int_equal(fy_etcd_range_prefix(c, "/ferry/ferry/", &kv), FY_OK);
        int n_routers = 0;
        for (int i = 0; i < kv.n; i++) n_routers += strstr(kv.kv[i].key, "/routers/") != NULL;
        assert_int_equal(n_routers, 2);
        fy_etcd_kvs_free(&kv);
        fy_etcd_destroy(c);
        struct stat sb;
        char key[PATH_MAX + 32];
        assert_int_equal(stat(pki, &sb), 0);
        assert_int_equal(sb.st_mode & 077, 0);
        static const char *const secret_files[] = {"ca.key", "ferry-worker.key", "ferry-worker.password",
                                                   "root.password"};
        for (size_t i = 0; i < FY_ARRAY_LEN(secret_files); i++) {
            snprintf(key, sizeof(key), "%s/%s", pki, secret_files[i]);
            assert_int_equal(stat(key, &sb), 0);
            if (sb.st_mode & 077) fail_msg("%s: mode %04o", key, (unsigned)(sb.st_mode & 07777));
        }
    }
    assert_int_equal(kill(e.pid, SIGTERM), 0);
    int st = serve_wait(&e, 60);
    t = read_text(e.err);
    const char *r = strstr(t, "stopped router-1"), *d0 = strstr(t, "stopped decode-0"), *et = strstr(t, "stopped etcd");
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || !r || !d0 || !et || r > d0 || d0 > et)
        fail_msg("stopping: wait status 0x%x, output:\n%s", st, t);
    fy_free(t);
    fy_test_tmpdir_remove();
}

static void test_etcd_two_routers(void **state) { etcd_two_routers(false); }

static void test_etcd_tls(void **state) { etcd_two_routers(true); }

/* A router behind TLS (router.tls_cert): serve's health probe speaks
 * plain HTTP, which a TLS port never answers, so serve must not probe it
 * (it would SIGKILL a healthy router every serve.health_timeout); it says
 * so at start, and the router stays up and serves HTTPS. */
static void test_tls_router_not_probed(void **state)
{
    (void)state;
    if (!fy_test_have_bin("ferry") || !tc_available()) skip();
    ports_t ports;
    pick_ports(&ports);
    const char *ini = write_ini("tls.ini", &ports);
    char certs[PATH_MAX], run[PATH_MAX + 32], metrics[64], http[64], cert[PATH_MAX + 32], key[PATH_MAX + 32];
    snprintf(certs, sizeof(certs), "%s/pki", fy_test_tmpdir());
    tc_etcd_certs(certs, NULL, 0);
    snprintf(run, sizeof(run), "serve.run_dir=%s/run-tls", fy_test_tmpdir());
    snprintf(metrics, sizeof(metrics), "serve.metrics=http://127.0.0.1:%d", ports.serve);
    snprintf(http, sizeof(http), "router.http=https://127.0.0.1:%d", ports.http);
    snprintf(cert, sizeof(cert), "router.tls_cert=%s/server.pem", certs);
    snprintf(key, sizeof(key), "router.tls_key=%s/server.key", certs);
    const char *args[] = {"-c",    ini,  "--set", run,  "--set", metrics, "--set", "serve.health_timeout=2s",
                          "--set", http, "--set", cert, "--set", key,     "--set", "prefill.count=0",
                          NULL};
    proc_t p;
    serve_spawn(&p, "tls.out", args);
    wait_text(&p, "cluster ready", START_DEADLINE_S);
    char *t = read_text(p.err);
    if (!strstr(t, "router.http speaks HTTPS")) fail_msg("serve did not say the router is not probed:\n%s", t);
    fy_free(t);
    sleep(5); /* more than twice the health timeout */
    kid_t router;
    assert_int_equal(serve_health(ports.serve, "router", &router), 200);
    if (strcmp(router.state, "running") || router.restarts || router.health_kills) {
        t = read_text(p.err);
        fail_msg("the TLS router: state '%s', %d restarts, %d health kills; serve's output:\n%s", router.state,
                 router.restarts, router.health_kills, t);
    }
    char cmd[PATH_MAX * 2];
    snprintf(cmd, sizeof(cmd), "curl -sS -f --max-time 20 --cacert %s/ca.pem https://127.0.0.1:%d/health >/dev/null",
             certs, ports.http);
    assert_int_equal(system(cmd), 0);
    kill(p.pid, SIGTERM);
    int st = serve_wait(&p, 60);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_usage),
        cmocka_unit_test(test_bad_setting),
        cmocka_unit_test(test_cluster),
        cmocka_unit_test(test_etcd_two_routers),
        cmocka_unit_test(test_etcd_tls),
        cmocka_unit_test(test_rank_group_restarted),
        cmocka_unit_test(test_tls_router_not_probed),
        cmocka_unit_test(test_pool_holds_the_context),
    };
    const char *only = getenv("FY_TEST_FILTER"); /* e.g. FY_TEST_FILTER=test_etcd* */
    if (only) cmocka_set_test_filter(only);
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    fy_test_tmpdir_remove();
    return rc;
}

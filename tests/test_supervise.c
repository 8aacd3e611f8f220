/*
 * test_supervise.c - the child-process supervisor, with /bin/sh children:
 * restarts with backoff, giving up (and an essential child ending the
 * run), stopping within the grace period (SIGKILL for a child that ignores
 * SIGTERM), a stop requested from a signal handler, Ctrl-C to the
 * supervisor's process group, a second stop request cutting the grace
 * short, children dying with a SIGKILLed supervisor,
 * exec failures named by child, log files, stdin and inherited
 * descriptors, and no zombies after any of it.
 *
 * Every wait is on an event (a FIFO the children write to, a pidfd, the
 * supervisor's own poll callback) with a deadline, never a fixed sleep.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mem.h"
#include "testutil.h"

/* tools/ objects are linked into bin/ferry only, not into libferry.a */
#include "supervise.c"

#define DEADLINE_S 10.0

static double now(void) { return now_s(); }

static void assert_no_children(void)
{
    int st;
    pid_t r = waitpid(-1, &st, WNOHANG);
    if (r != -1 || errno != ECHILD) fail_msg("a child is left: waitpid(-1) gave %d (errno %d)", (int)r, errno);
}

static bool gone(pid_t pid) { return kill(pid, 0) < 0 && errno == ESRCH; }

static fy_sup_t *make_sup(double backoff, double backoff_max, int max_restarts, double grace)
{
    fy_sup_params_t p;
    fy_sup_params_default(&p);
    p.restart_backoff_s = backoff;
    p.restart_backoff_max_s = backoff_max;
    p.max_restarts = max_restarts;
    p.restart_window_s = 60;
    p.stop_grace_s = grace;
    fy_sup_t *s = NULL;
    assert_int_equal(fy_sup_create(&p, &s), FY_OK);
    return s;
}

static int add_sh(fy_sup_t *s, const char *name, const char *script, const char *arg, bool essential)
{
    char *argv[] = {"/bin/sh", "-c", (char *)script, "sh", (char *)arg, NULL};
    int idx = -1;
    assert_int_equal(fy_sup_add(s, name, argv, NULL, essential, &idx), FY_OK);
    return idx;
}

/* ---- a FIFO the children report "ready PID" lines to ------------------------------------------ */

typedef struct fifo {
    char path[512];
    int rd, wr; /* our own writer keeps the reader from seeing end of file */
    char buf[4096];
    size_t len;
} fifo_t;

static void fifo_open(fifo_t *f, const char *name)
{
    memset(f, 0, sizeof(*f));
    snprintf(f->path, sizeof(f->path), "%s", fy_test_path(name));
    unlink(f->path);
    assert_int_equal(mkfifo(f->path, 0600), 0);
    f->rd = open(f->path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    f->wr = open(f->path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    assert_true(f->rd >= 0 && f->wr >= 0);
}

static void fifo_close(fifo_t *f)
{
    close(f->rd);
    close(f->wr);
    unlink(f->path);
}

/* Waits for n "ready PID" lines; their pids go to pids. */
static void fifo_wait_ready(fifo_t *f, pid_t *pids, int n)
{
    double deadline = now() + DEADLINE_S;
    int got = 0;
    while (got < n) {
        char *nl;
        while (got < n && (nl = memchr(f->buf, '\n', f->len))) {
            *nl = '\0';
            int pid = 0;
            if (sscanf(f->buf, "ready %d", &pid) != 1) fail_msg("unexpected line from a child: '%s'", f->buf);
            pids[got++] = pid;
            size_t used = (size_t)(nl + 1 - f->buf);
            memmove(f->buf, nl + 1, f->len - used);
            f->len -= used;
        }
        if (got == n) break;
        double t = now();
        if (t >= deadline) fail_msg("only %d of %d children became ready within %g s", got, n, DEADLINE_S);
        struct pollfd pfd = {.fd = f->rd, .events = POLLIN};
        poll(&pfd, 1, timeout_ms(deadline, t));
        ssize_t r = read(f->rd, f->buf + f->len, sizeof(f->buf) - 1 - f->len);
        if (r > 0) f->len += (size_t)r;
    }
}

/* Waits for pid (our child) to end; its wait status. */
static int wait_pid(pid_t pid)
{
    int fd = (int)syscall(SYS_pidfd_open, pid, 0);
    assert_true(fd >= 0);
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    double t = now(), deadline = t + DEADLINE_S;
    while (poll(&pfd, 1, timeout_ms(deadline, t)) < 0 && errno == EINTR) t = now();
    close(fd);
    int st;
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r != pid) fail_msg("pid %d did not end within %g s", (int)pid, DEADLINE_S);
    return st;
}

/* ---- restarts -------------------------------------------------------------------------------- */

typedef struct watch {
    double deadline;
    bool timed_out;
    int a, b; /* child indexes */
    int want_restarts;
    double failed_at;
} watch_t;

static void until_both_failed(void *arg, fy_sup_t *s)
{
    watch_t *w = arg;
    if (fy_sup_state(s, w->a) == FY_SUP_FAILED && fy_sup_state(s, w->b) == FY_SUP_FAILED) {
        w->failed_at = now();
        fy_sup_request_stop(s);
    } else if (now() > w->deadline) {
        w->timed_out = true;
        fy_sup_request_stop(s);
    }
}

static void test_restart_backoff(void **state)
{
    fy_sup_t *s = make_sup(0.05, 0.15, 3, 2);
    int quitter = add_sh(s, "quitter", "exit 3", NULL, false);
    int killed = add_sh(s, "killed", "kill -9 $$", NULL, false);
    char *sleeper_argv[] = {"sleep", "30", NULL}; /* found through PATH */
    int sleeper = -1;
    assert_int_equal(fy_sup_add(s, "sleeper", sleeper_argv, NULL, true, &sleeper), FY_OK);
    assert_int_equal(fy_sup_count(s), 3);
    assert_int_equal(fy_sup_state(s, quitter), FY_SUP_DOWN);
    fy_test_log_begin();
    double t0 = now();
    assert_int_equal(fy_sup_start(s), FY_OK);
    pid_t sleeper_pid = fy_sup_pid(s, sleeper);
    assert_true(sleeper_pid > 0);
    watch_t w = {.deadline = t0 + DEADLINE_S, .a = quitter, .b = killed};
    assert_int_equal(fy_sup_run(s, until_both_failed, &w, 0.01), FY_OK);
    fy_test_log_end();
    assert_false(w.timed_out);
    /* three restarts, 0.05 + 0.1 + 0.15 (capped) s apart at least, then it stays down */
    assert_int_equal(fy_sup_restarts(s, quitter), 3);
    assert_int_equal(fy_sup_restarts(s, killed), 3);
    assert_int_equal(fy_sup_state(s, quitter), FY_SUP_FAILED);
    assert_int_equal(fy_sup_pid(s, quitter), 0);
    assert_true(w.failed_at - t0 >= 0.3 - 1e-3);
    assert_true(fy_test_log_has("supervise: quitter (pid ", "exited with status 3; restarting in 0.05 s", NULL));
    assert_true(fy_test_log_has("quitter (pid ", "exited with status 3; restarting in 0.1 s", NULL));
    assert_true(fy_test_log_has("quitter (pid ", "exited with status 3; restarting in 0.15 s", NULL));
    assert_true(fy_test_log_has("quitter (pid ", "exited with status 3; 3 restarts within 60 s, leaving it down", NULL));
    assert_true(fy_test_log_has("killed (pid ", "killed by signal 9 (SIGKILL); restarting in 0.05 s", NULL));
    assert_true(fy_test_log_has("killed (pid ", "killed by signal 9 (SIGKILL); 3 restarts", "leaving it down", NULL));
    /* the run's end stopped the sleeper, which never restarted */
    assert_true(fy_test_log_has("stopped sleeper", "killed by signal 15 (SIGTERM)", NULL));
    assert_int_equal(fy_sup_restarts(s, sleeper), 0);
    assert_int_equal(fy_sup_pid(s, sleeper), 0);
    assert_true(gone(sleeper_pid));
    fy_sup_destroy(s);
    assert_no_children();
}

static void until_restarts(void *arg, fy_sup_t *s)
{
    watch_t *w = arg;
    if (fy_sup_restarts(s, w->a) >= w->want_restarts || now() > w->deadline) {
        w->timed_out = fy_sup_restarts(s, w->a) < w->want_restarts;
        fy_sup_request_stop(s);
    }
}

static void test_unlimited_restarts(void **state)
{
    fy_sup_t *s = make_sup(0.001, 0.004, -1, 1);
    int idx = add_sh(s, "flappy", "exit 1", NULL, true);
    fy_test_log_begin();
    assert_int_equal(fy_sup_start(s), FY_OK);
    watch_t w = {.deadline = now() + DEADLINE_S, .a = idx, .want_restarts = 40};
    assert_int_equal(fy_sup_run(s, until_restarts, &w, 0.005), FY_OK);
    assert_true(fy_test_log_has("flappy", "restarting in 0.004 s", NULL)); /* the cap */
    assert_false(fy_test_log_has("leaving it down", NULL));
    fy_test_log_end();
    assert_false(w.timed_out);
    assert_true(fy_sup_restarts(s, idx) >= 40);
    fy_sup_destroy(s);
    assert_no_children();
}

static void deadline_only(void *arg, fy_sup_t *s)
{
    watch_t *w = arg;
    if (now() > w->deadline) {
        w->timed_out = true;
        fy_sup_request_stop(s);
    }
}

static void test_essential_gives_up(void **state)
{
    fy_sup_t *s = make_sup(0.01, 0.02, 2, 2);
    char *argv[] = {"sleep", "30", NULL};
    int bystander = -1;
    assert_int_equal(fy_sup_add(s, "bystander", argv, NULL, false, &bystander), FY_OK);
    int core = add_sh(s, "core", "kill -9 $$", NULL, true);
    fy_test_log_begin();
    assert_int_equal(fy_sup_start(s), FY_OK);
    pid_t bpid = fy_sup_pid(s, bystander);
    watch_t w = {.deadline = now() + DEADLINE_S};
    assert_int_equal(fy_sup_run(s, deadline_only, &w, 0.05), FY_ERR_PEER);
    fy_test_log_end();
    assert_false(w.timed_out);
    assert_int_equal(fy_sup_restarts(s, core), 2);
    assert_int_equal(fy_sup_state(s, core), FY_SUP_FAILED);
    assert_true(fy_test_log_has("core (pid ", "2 restarts within 60 s, leaving it down", NULL));
    assert_true(fy_test_log_has("core is essential: stopping everything", NULL));
    assert_true(fy_test_log_has("stopped bystander (pid ", NULL));
    assert_int_equal(fy_sup_state(s, bystander), FY_SUP_DOWN);
    assert_true(gone(bpid));
    assert_no_children();
    /* max_restarts 0: the first crash is final */
    fy_sup_destroy(s);
    s = make_sup(0.01, 0.02, 0, 2);
    core = add_sh(s, "core", "exit 7", NULL, true);
    fy_test_log_begin();
    assert_int_equal(fy_sup_start(s), FY_OK);
    w.deadline = now() + DEADLINE_S;
    assert_int_equal(fy_sup_run(s, deadline_only, &w, 0.05), FY_ERR_PEER);
    assert_true(fy_test_log_has("core (pid ", "exited with status 7; restarts are off, leaving it down", NULL));
    fy_test_log_end();
    assert_int_equal(fy_sup_restarts(s, core), 0);
    fy_sup_destroy(s);
    assert_no_children();
}

/* ---- stopping -------------------------------------------------------------------------------- */

static void test_stop_all_grace(void **state)
{
    fifo_t f;
    fifo_open(&f, "ready-grace");
    fy_sup_t *s = make_sup(0.01, 0.02, 3, 0.3);
    int polite = add_sh(s, "polite", "echo \"ready $$\" > \"$1\"; exec sleep 30", f.path, false);
    int stubborn = add_sh(s, "stubborn", "trap '' TERM; echo \"ready $$\" > \"$1\"; exec sleep 30", f.path, false);
    assert_int_equal(fy_sup_start(s), FY_OK);
    pid_t pids[2];
    fifo_wait_ready(&f, pids, 2);
    pid_t p_polite = fy_sup_pid(s, polite), p_stubborn = fy_sup_pid(s, stubborn);
    assert_true((pids[0] == p_polite && pids[1] == p_stubborn) || (pids[1] == p_polite && pids[0] == p_stubborn));
    fy_test_log_begin();
    double t0 = now();
    fy_sup_stop_all(s);
    double took = now() - t0;
    fy_test_log_end();
    if (took < 0.3 - 1e-3 || took > 2.3) fail_msg("stop_all took %.3f s with a 0.3 s grace", took);
    char line[128];
    snprintf(line, sizeof(line), "stubborn (pid %d) did not stop within 0.3 s of SIGTERM; sending SIGKILL",
             (int)p_stubborn);
    assert_true(fy_test_log_has(line, NULL));
    assert_true(fy_test_log_has("stopped stubborn", "killed by signal 9 (SIGKILL)", NULL));
    assert_true(fy_test_log_has("stopped polite", "killed by signal 15 (SIGTERM)", NULL));
    assert_true(gone(p_polite) && gone(p_stubborn));
    assert_int_equal(fy_sup_pid(s, polite), 0);
    assert_int_equal(fy_sup_state(s, stubborn), FY_SUP_DOWN);
    assert_no_children();

    /* children that stop at once do not wait out a long grace; and the
     * supervisor starts again after a stop */
    fy_sup_destroy(s);
    s = make_sup(0.01, 0.02, 3, 20);
    add_sh(s, "a", "echo \"ready $$\" > \"$1\"; exec sleep 30", f.path, false);
    add_sh(s, "b", "echo \"ready $$\" > \"$1\"; exec sleep 30", f.path, false);
    for (int round = 0; round < 2; round++) {
        assert_int_equal(fy_sup_start(s), FY_OK);
        fifo_wait_ready(&f, pids, 2);
        t0 = now();
        fy_sup_stop_all(s);
        took = now() - t0;
        if (took > 2) fail_msg("stop_all took %.3f s for children that stop on SIGTERM", took);
        assert_true(gone(pids[0]) && gone(pids[1]));
    }
    fy_sup_destroy(s);
    assert_no_children();
    fifo_close(&f);
}

static fy_sup_t *g_sup;

static void on_stop_signal(int sig)
{
    (void)sig;
    fy_sup_request_stop(g_sup);
}

/* Waits for any process (not only a child of ours) to end. */
static bool wait_gone(pid_t pid)
{
    int fd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (fd < 0) return errno == ESRCH;
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    double t = now(), deadline = t + DEADLINE_S;
    int r;
    while ((r = poll(&pfd, 1, timeout_ms(deadline, t))) < 0 && errno == EINTR) t = now();
    close(fd);
    return r == 1;
}

/* A child's helpers die with it, even one forked after the SIGTERM (which
 * the group signal cannot have reached) or left behind by a crash. */
static void until_backoff(void *arg, fy_sup_t *s)
{
    watch_t *w = arg;
    if (fy_sup_state(s, w->a) == FY_SUP_BACKOFF || now() > w->deadline) {
        w->timed_out = fy_sup_state(s, w->a) != FY_SUP_BACKOFF;
        fy_sup_request_stop(s);
    }
}

static void test_grandchildren(void **state)
{
    fifo_t f;
    fifo_open(&f, "ready-grandchildren");
    fy_sup_t *s = make_sup(5, 5, 3, 5);
    const char *script = "trap 'sleep 30 & echo \"ready $!\" > \"$1\"; exit 0' TERM;"
                         "sleep 30 & echo \"ready $!\" > \"$1\"; wait";
    int parent = add_sh(s, "parent", script, f.path, false);
    int crasher = add_sh(s, "crasher", "sleep 30 & echo \"ready $!\" > \"$1\"; wait", f.path, false);
    assert_int_equal(fy_sup_start(s), FY_OK);
    pid_t helpers[2];
    fifo_wait_ready(&f, helpers, 2);
    pid_t crasher_pid = fy_sup_pid(s, crasher);
    pid_t orphan = getpgid(helpers[0]) == crasher_pid ? helpers[0] : helpers[1];
    pid_t sibling = orphan == helpers[0] ? helpers[1] : helpers[0];
    assert_int_equal(getpgid(orphan), crasher_pid);
    assert_int_equal(getpgid(sibling), fy_sup_pid(s, parent));
    /* the crasher dies; its helper must go with it, not wait for a stop
     * (which would not signal a child in backoff) */
    assert_int_equal(kill(crasher_pid, SIGUSR1), 0);
    fy_test_log_begin();
    watch_t w = {.deadline = now() + DEADLINE_S, .a = crasher};
    assert_int_equal(fy_sup_run(s, until_backoff, &w, 0.01), FY_OK);
    assert_true(fy_test_log_has("crasher (pid ", "killed by signal 10 (SIGUSR1); restarting in 5 s", NULL));
    fy_test_log_end();
    assert_false(w.timed_out);
    if (!wait_gone(orphan)) fail_msg("helper %d outlived its crashed parent", (int)orphan);
    /* the run's end stopped the parent, whose trap forked one more helper */
    pid_t late;
    fifo_wait_ready(&f, &late, 1);
    if (!wait_gone(sibling)) fail_msg("helper %d outlived its parent", (int)sibling);
    if (!wait_gone(late)) fail_msg("helper %d, forked after SIGTERM, outlived its parent", (int)late);
    fy_sup_destroy(s);
    fifo_close(&f);
    assert_no_children();
}

/* A stop request during the grace period (Ctrl-C twice) cuts it short, and
 * a stopped child does not sit on its SIGTERM. */
static void test_stop_escalation(void **state)
{
    fifo_t f;
    fifo_open(&f, "ready-escalate");
    fy_sup_t *s = make_sup(0.01, 0.02, 3, 20);
    int stubborn = add_sh(s, "stubborn", "trap '' TERM; echo \"ready $$\" > \"$1\"; exec sleep 30", f.path, false);
    int frozen = add_sh(s, "frozen", "echo \"ready $$\" > \"$1\"; exec sleep 30", f.path, false);
    assert_int_equal(fy_sup_start(s), FY_OK);
    pid_t pids[2];
    fifo_wait_ready(&f, pids, 2);
    pid_t p_stubborn = fy_sup_pid(s, stubborn), p_frozen = fy_sup_pid(s, frozen);
    assert_int_equal(kill(p_frozen, SIGSTOP), 0);
    siginfo_t si;
    assert_int_equal(waitid(P_PID, (id_t)p_frozen, &si, WSTOPPED | WNOWAIT), 0);
    g_sup = s;
    struct sigaction sa = {.sa_handler = on_stop_signal}, old;
    sigemptyset(&sa.sa_mask);
    assert_int_equal(sigaction(SIGALRM, &sa, &old), 0);
    struct itimerval it = {.it_value = {.tv_sec = 0, .tv_usec = 200000}};
    fy_test_log_begin();
    double t0 = now();
    assert_int_equal(setitimer(ITIMER_REAL, &it, NULL), 0);
    fy_sup_stop_all(s);
    double took = now() - t0;
    fy_test_log_end();
    sigaction(SIGALRM, &old, NULL);
    if (took < 0.19 || took > 3) fail_msg("stop_all took %.3f s; asked again at 0.2 s with a 20 s grace", took);
    assert_true(fy_test_log_has("stopped frozen", "killed by signal 15 (SIGTERM)", NULL));
    assert_true(fy_test_log_has("asked again to stop", NULL));
    assert_true(fy_test_log_has("stubborn (pid ", "sending SIGKILL", NULL));
    assert_true(fy_test_log_has("stopped stubborn", "killed by signal 9 (SIGKILL)", NULL));
    assert_true(gone(p_stubborn) && gone(p_frozen));
    g_sup = NULL;
    fy_sup_destroy(s);
    assert_no_children();
    fifo_close(&f);
}

static void test_stop_from_signal_handler(void **state)
{
    fy_sup_t *s = make_sup(0.01, 0.02, 3, 2);
    char *argv[] = {"sleep", "30", NULL};
    int idx = -1;
    assert_int_equal(fy_sup_add(s, "sleeper", argv, NULL, true, &idx), FY_OK);
    assert_int_equal(fy_sup_start(s), FY_OK);
    pid_t pid = fy_sup_pid(s, idx);
    g_sup = s;
    struct sigaction sa = {.sa_handler = on_stop_signal}, old;
    sigemptyset(&sa.sa_mask);
    assert_int_equal(sigaction(SIGALRM, &sa, &old), 0);
    struct itimerval it = {.it_value = {.tv_sec = 0, .tv_usec = 300000}};
    struct rusage r0, r1;
    getrusage(RUSAGE_SELF, &r0);
    double t0 = now();
    assert_int_equal(setitimer(ITIMER_REAL, &it, NULL), 0);
    /* no poll callback: nothing but the signal can end this */
    assert_int_equal(fy_sup_run(s, NULL, NULL, 0), FY_OK);
    double took = now() - t0;
    getrusage(RUSAGE_SELF, &r1);
    sigaction(SIGALRM, &old, NULL);
    if (took < 0.29 || took > 3) fail_msg("run ended after %.3f s, the signal came at 0.3 s", took);
    /* it slept in poll rather than spinning */
    double cpu = (double)(r1.ru_utime.tv_sec - r0.ru_utime.tv_sec + r1.ru_stime.tv_sec - r0.ru_stime.tv_sec) +
                 (double)(r1.ru_utime.tv_usec - r0.ru_utime.tv_usec + r1.ru_stime.tv_usec - r0.ru_stime.tv_usec) * 1e-6;
    if (cpu > 0.1) fail_msg("run used %.3f s of CPU waiting 0.3 s", cpu);
    assert_true(gone(pid));
    /* the request sticks: a later run returns at once */
    assert_int_equal(fy_sup_start(s), FY_OK);
    assert_int_equal(fy_sup_run(s, NULL, NULL, 0), FY_OK);
    assert_int_equal(fy_sup_pid(s, idx), 0);
    fy_sup_destroy(s);
    g_sup = NULL;
    assert_no_children();
}

/* A supervisor in a process group of its own, as a shell runs a foreground
 * job; Ctrl-C is SIGINT to that whole group. */
static void test_ctrl_c(void **state)
{
    fifo_t f;
    fifo_open(&f, "ready-ctrl-c");
    const char *record = fy_test_path("ctrl-c.rec");
    unlink(record);
    pid_t helper = fork();
    assert_true(helper >= 0);
    if (helper == 0) {
        setpgid(0, 0);
        fy_sup_t *s = make_sup(0.01, 0.02, 3, 5);
        const char *script = "trap 'echo INT $$ >> \"$1\"; exit 1' INT; trap 'echo TERM $$ >> \"$1\"; exit 0' TERM;"
                             "echo \"ready $$\" > \"$0\"; sleep 30 & wait";
        for (int i = 0; i < 2; i++) {
            char *argv[] = {"/bin/sh", "-c", (char *)script, f.path, (char *)record, NULL};
            if (fy_sup_add(s, i ? "worker-1" : "worker-0", argv, NULL, false, NULL) != FY_OK) _exit(2);
        }
        g_sup = s;
        struct sigaction sa = {.sa_handler = on_stop_signal};
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, NULL);
        if (fy_sup_start(s) != FY_OK) _exit(3);
        fy_status_t st = fy_sup_run(s, NULL, NULL, 0);
        fy_sup_destroy(s);
        _exit(st == FY_OK ? 0 : 4);
    }
    setpgid(helper, helper); /* whichever of us gets there first */
    pid_t pids[2];
    fifo_wait_ready(&f, pids, 2);
    assert_int_equal(kill(-helper, SIGINT), 0);
    int st = wait_pid(helper);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    /* each child was stopped by the supervisor's SIGTERM, none got the SIGINT */
    char *rec = fy_test_read_file(record, NULL);
    assert_non_null(rec);
    for (int i = 0; i < 2; i++) {
        char want[32];
        snprintf(want, sizeof(want), "TERM %d\n", (int)pids[i]);
        if (!strstr(rec, want)) fail_msg("child %d did not record TERM: '%s'", (int)pids[i], rec);
        assert_true(gone(pids[i]));
    }
    if (strstr(rec, "INT")) fail_msg("a child got the SIGINT: '%s'", rec);
    fy_free(rec);
    fifo_close(&f);
    assert_no_children();
}

/* The supervisor dies of SIGKILL; its children must die with it. */
static void test_children_die_with_supervisor(void **state)
{
    fifo_t f;
    fifo_open(&f, "ready-pdeath");
    /* orphans come to us, so we can see how they died */
    assert_int_equal(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
    pid_t helper = fork();
    assert_true(helper >= 0);
    if (helper == 0) {
        fy_sup_t *s = make_sup(0.01, 0.02, 3, 5);
        for (int i = 0; i < 3; i++) {
            char *argv[] = {"/bin/sh", "-c", "trap '' TERM; echo \"ready $$\" > \"$0\"; exec sleep 30", f.path, NULL};
            if (fy_sup_add(s, "orphan", argv, NULL, false, NULL) != FY_OK) _exit(2);
        }
        if (fy_sup_start(s) != FY_OK) _exit(3);
        fy_sup_run(s, NULL, NULL, 0); /* until killed */
        _exit(4);
    }
    pid_t pids[3];
    fifo_wait_ready(&f, pids, 3);
    assert_int_equal(kill(helper, SIGKILL), 0);
    int st = wait_pid(helper);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    for (int i = 0; i < 3; i++) {
        st = wait_pid(pids[i]);
        if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL) fail_msg("orphan %d: wait status 0x%x", (int)pids[i], st);
    }
    assert_int_equal(prctl(PR_SET_CHILD_SUBREAPER, 0), 0);
    fifo_close(&f);
    assert_no_children();
}

/* ---- exec failures, logs, descriptors -------------------------------------------------------- */

static void test_exec_failures(void **state)
{
    char *sleeper[] = {"sleep", "30", NULL};
    struct {
        const char *argv0, *log, *status_msg;
        fy_status_t want;
    } cases[] = {
        {"/nonexistent/ferry-ghost", NULL, "cannot execute '/nonexistent/ferry-ghost': No such file or directory",
         FY_ERR_NOT_FOUND},
        {"ferry-no-such-binary-xyz", NULL, "cannot execute 'ferry-no-such-binary-xyz': No such file or directory (searched PATH)",
         FY_ERR_NOT_FOUND},
        {NULL /* a file that is not executable */, NULL, "Permission denied", FY_ERR_IO},
        {"/bin/true", "/nonexistent-dir/ghost.log", "cannot open its log /nonexistent-dir/ghost.log", FY_ERR_NOT_FOUND},
    };
    const char *plain = fy_test_path("not-executable");
    assert_true(fy_test_write_file(plain, "#!/bin/sh\n", 10));
    chmod(plain, 0644);
    for (size_t i = 0; i < FY_ARRAY_LEN(cases); i++) {
        fy_sup_t *s = make_sup(0.01, 0.02, 3, 2);
        int first = -1;
        assert_int_equal(fy_sup_add(s, "sleeper", sleeper, NULL, false, &first), FY_OK);
        char *argv[] = {(char *)(cases[i].argv0 ? cases[i].argv0 : plain), NULL};
        assert_int_equal(fy_sup_add(s, "ghost", argv, cases[i].log, false, NULL), FY_OK);
        fy_test_log_begin();
        fy_status_t st = fy_sup_start(s);
        bool named = fy_test_log_has("supervise: ghost: ", cases[i].status_msg, NULL);
        bool others = fy_test_log_has("ghost could not be started; stopping the others", NULL);
        fy_test_log_end();
        if (st != cases[i].want || !named || !others)
            fail_msg("case %zu: status %d, log:\n%s", i, st, fy_test_log_text());
        assert_int_equal(fy_sup_pid(s, first), 0); /* all or nothing */
        assert_no_children();
        /* run refuses a supervisor that did not start */
        fy_test_log_begin();
        assert_int_equal(fy_sup_run(s, NULL, NULL, 0), FY_ERR_INVALID);
        fy_test_log_end();
        fy_sup_destroy(s);
    }

    /* a binary that disappears while it runs: the restart fails and counts
     * as a crash; essential, so the run ends */
    const char *vanish = fy_test_path("vanish.sh");
    const char script[] = "#!/bin/sh\nrm -f \"$0\"\nexit 1\n";
    assert_true(fy_test_write_file(vanish, script, sizeof(script) - 1));
    chmod(vanish, 0755);
    fy_sup_t *s = make_sup(0.01, 0.02, 2, 2);
    char *argv[] = {(char *)vanish, NULL};
    int idx = -1;
    assert_int_equal(fy_sup_add(s, "vanish", argv, NULL, true, &idx), FY_OK);
    fy_test_log_begin();
    assert_int_equal(fy_sup_start(s), FY_OK);
    watch_t w = {.deadline = now() + DEADLINE_S};
    assert_int_equal(fy_sup_run(s, deadline_only, &w, 0.05), FY_ERR_PEER);
    assert_true(fy_test_log_has("vanish (pid ", "exited with status 1; restarting in 0.01 s", NULL));
    assert_true(fy_test_log_has("supervise: vanish: cannot execute", "No such file or directory", NULL));
    assert_true(fy_test_log_has("supervise: vanish could not be restarted; restarting in 0.02 s", NULL));
    assert_true(fy_test_log_has("vanish could not be restarted; 2 restarts", "leaving it down", NULL));
    fy_test_log_end();
    assert_false(w.timed_out);
    assert_int_equal(fy_sup_restarts(s, idx), 2);
    fy_sup_destroy(s);
    assert_no_children();
}

static void until_failed(void *arg, fy_sup_t *s)
{
    watch_t *w = arg;
    if (fy_sup_state(s, w->a) == FY_SUP_FAILED || now() > w->deadline) {
        w->timed_out = fy_sup_state(s, w->a) != FY_SUP_FAILED;
        fy_sup_request_stop(s);
    }
}

static void test_log_stdin_fds(void **state)
{
    const char *log = fy_test_path("child.log");
    assert_true(fy_test_write_file(log, "earlier\n", 8));
    /* a descriptor of ours without close-on-exec must not reach the child
     * (listed from the shell itself: a $(...) would add its own pipe) */
    int leak = open("/dev/null", O_RDONLY);
    assert_true(leak >= 3);
    /* nor an ignored signal */
    struct sigaction ign = {.sa_handler = SIG_IGN}, old;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGUSR1, &ign, &old);
    fy_sup_t *s = make_sup(0.01, 0.02, 0, 2);
    char *argv[] = {"/bin/sh", "-c",
                    "echo out; echo err >&2; read x; echo \"read [$x] $?\"; echo fds; ls /proc/$$/fd;"
                    "grep SigIgn /proc/$$/status",
                    NULL};
    int idx = -1;
    assert_int_equal(fy_sup_add(s, "talker", argv, log, false, &idx), FY_OK);
    fy_test_log_begin();
    assert_int_equal(fy_sup_start(s), FY_OK);
    watch_t w = {.deadline = now() + DEADLINE_S, .a = idx};
    assert_int_equal(fy_sup_run(s, until_failed, &w, 0.01), FY_OK);
    assert_true(fy_test_log_has("talker (pid ", "exited with status 0; restarts are off, leaving it down", NULL));
    fy_test_log_end();
    assert_false(w.timed_out);
    sigaction(SIGUSR1, &old, NULL);
    close(leak);
    char *text = fy_test_read_file(log, NULL);
    assert_non_null(text);
    /* standard signals only: glibc keeps 32 and 33 to itself, and a test
     * harness may hand them down ignored */
    const char *sigign = strstr(text, "SigIgn:\t");
    unsigned long long ignored = sigign ? strtoull(sigign + 8, NULL, 16) : ~0ULL;
    if (!strstr(text, "earlier\nout\n") || !strstr(text, "err\n") || !strstr(text, "read [] 1\n") ||
        !strstr(text, "fds\n0\n1\n2\nSigIgn") || (ignored & 0x7fffffffULL))
        fail_msg("child log:\n%s", text);
    fy_free(text);
    fy_sup_destroy(s);
    assert_no_children();
}

/* ---- arguments and allocation failure -------------------------------------------------------- */

static void test_arguments(void **state)
{
    fy_sup_params_t p;
    fy_sup_t *s = NULL;
    fy_test_log_begin();
    fy_sup_params_default(&p);
    p.restart_backoff_s = -1;
    assert_int_equal(fy_sup_create(&p, &s), FY_ERR_INVALID);
    fy_sup_params_default(&p);
    p.restart_backoff_max_s = 0.1; /* below the first delay */
    assert_int_equal(fy_sup_create(&p, &s), FY_ERR_INVALID);
    fy_sup_params_default(&p);
    p.max_restarts = -2;
    assert_int_equal(fy_sup_create(&p, &s), FY_ERR_INVALID);
    fy_sup_params_default(&p);
    p.restart_window_s = 0;
    assert_int_equal(fy_sup_create(&p, &s), FY_ERR_INVALID);
    assert_true(fy_test_log_has("supervise: bad parameters", NULL));
    assert_null(s);
    s = make_sup(0.01, 0.02, 1, 1);
    char *ok[] = {"sleep", "30", NULL}, *empty0[] = {"", NULL}, *none[] = {NULL};
    assert_int_equal(fy_sup_add(s, "", ok, NULL, false, NULL), FY_ERR_INVALID);
    assert_int_equal(fy_sup_add(s, NULL, ok, NULL, false, NULL), FY_ERR_INVALID);
    char longname[80];
    memset(longname, 'n', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    assert_int_equal(fy_sup_add(s, longname, ok, NULL, false, NULL), FY_ERR_INVALID);
    assert_int_equal(fy_sup_add(s, "x", NULL, NULL, false, NULL), FY_ERR_INVALID);
    assert_int_equal(fy_sup_add(s, "x", empty0, NULL, false, NULL), FY_ERR_INVALID);
    assert_int_equal(fy_sup_add(s, "x", none, NULL, false, NULL), FY_ERR_INVALID);
    assert_int_equal(fy_sup_count(s), 0);
    int idx = -1;
    assert_int_equal(fy_sup_add(s, "x", ok, NULL, false, &idx), FY_OK);
    assert_int_equal(idx, 0);
    assert_int_equal(fy_sup_run(s, NULL, NULL, 0), FY_ERR_INVALID); /* not started */
    assert_int_equal(fy_sup_start(s), FY_OK);
    assert_int_equal(fy_sup_add(s, "y", ok, NULL, false, NULL), FY_ERR_INVALID); /* while running */
    assert_true(fy_test_log_has("children are added before fy_sup_start", NULL));
    assert_int_equal(fy_sup_run(s, deadline_only, NULL, 0), FY_ERR_INVALID); /* a callback needs an interval */
    fy_test_log_end();
    assert_int_equal(fy_sup_pid(s, 5), 0);
    assert_int_equal(fy_sup_restarts(s, -1), 0);
    assert_int_equal(fy_sup_state(s, 9), FY_SUP_DOWN);
    fy_sup_destroy(s); /* stops the running child */
    fy_sup_destroy(NULL);
    assert_no_children();
}

static void test_alloc_failure(void **state)
{
    char *argv[] = {"/bin/sh", "-c", "exit 0", NULL};
    bool completed = false;
    fy_test_log_begin();
    for (long n = 1; n < 200 && !completed; n++) {
        fy_sup_params_t p;
        fy_sup_params_default(&p);
        fy_mem_fail_after(n);
        fy_sup_t *s = NULL;
        fy_status_t st = fy_sup_create(&p, &s);
        if (st != FY_OK) {
            assert_int_equal(st, FY_ERR_NOMEM);
            continue;
        }
        int added = 0;
        for (int i = 0; i < 12; i++) {
            st = fy_sup_add(s, "c", argv, i % 2 ? "/dev/null" : NULL, false, NULL);
            if (st == FY_OK)
                added++;
            else
                assert_int_equal(st, FY_ERR_NOMEM);
        }
        assert_int_equal(fy_sup_count(s), added);
        fy_sup_destroy(s);
        completed = added == 12;
    }
    fy_mem_fail_after(0);
    fy_test_log_end();
    assert_true(completed);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_restart_backoff),
        cmocka_unit_test(test_unlimited_restarts),
        cmocka_unit_test(test_essential_gives_up),
        cmocka_unit_test(test_stop_all_grace),
        cmocka_unit_test(test_stop_escalation),
        cmocka_unit_test(test_grandchildren),
        cmocka_unit_test(test_stop_from_signal_handler),
        cmocka_unit_test(test_ctrl_c),
        cmocka_unit_test(test_children_die_with_supervisor),
        cmocka_unit_test(test_exec_failures),
        cmocka_unit_test(test_log_stdin_fds),
        cmocka_unit_test(test_arguments),
        cmocka_unit_test(test_alloc_failure),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    fy_test_tmpdir_remove();
    return rc;
}

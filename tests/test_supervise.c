/*
 * test_supervise.c - the child-process supervisor, with /bin/sh children:
 * restarts with backoff, giving up (and an essential child ending the
 * run), stopping within the grace period (SIGKILL for a child that ignores
 * SIGTERM), a stop requested from a signal handler, Ctrl-C to the
 * supervisor's process group, a second stop request cutting the grace
 * short, children dying with a SIGKILLed supervisor,
 * exec failures named by child, log files, stdin and inherited
 * descriptors, and no zombies after any of it.  Then readiness reports
 * and start-up failures (with the child's error lines repeated), health
 * probes against a small HTTP child (this binary run again with
 * --http-child) that is SIGSTOPped briefly (left alone) or for good
 * (killed and restarted), a supervisor that is itself stopped, restarts
 * that never give up, and the stop order by stages.
 *
 * Every wait is on an event (a FIFO the children write to, a pidfd, the
 * supervisor's own poll callback) with a deadline, never a fixed sleep.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/cluster.h"
#include "common/mem.h"
#include "tests/testutil.h"

/* tools/ objects are linked into bin/ferry only, not into libferry.a */
#include "tools/supervise.c"

#define DEADLINE_S 10.0

static void assert_no_children(void)
{
    int st;
    pid_t r = waitpid(-1, &st, WNOHANG);
    if (r != -1 || errno != ECHILD) fail_msg("a child is left: waitpid(-1) gave %d (errno %d)", (int)r, errno);
}

static bool gone(pid_t pid) { return kill(pid, 0) < 0 && errno == ESRCH; }

static fy_sup_t *make_sup_p(const fy_sup_params_t *p)
{
    fy_sup_t *s = NULL;
    assert_int_equal(fy_sup_create(p, &s), FY_OK);
    return s;
}

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
    double deadline = fy_now_s() + DEADLINE_S;
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
        double t = fy_now_s();
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
    double t = fy_now_s(), deadline = t + DEADLINE_S;
    while (poll(&pfd, 1, timeout_ms(deadline, t)) < 0 && errno == EINTR) t = fy_now_s();
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
        w->failed_at = fy_now_s();
        fy_sup_request_stop(s);
    } else if (fy_now_s() > w->deadline) {
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
    double t0 = fy_now_s();
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
    assert_true(
        fy_test_log_has("quitter (pid ", "exited with status 3; 3 restarts within 60 s, leaving it down", NULL));
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
    if (fy_sup_restarts(s, w->a) >= w->want_restarts || fy_now_s() > w->deadline) {
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
    watch_t w = {.deadline = fy_now_s() + DEADLINE_S, .a = idx, .want_restarts = 40};
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
    if (fy_now_s() > w->deadline) {
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
    watch_t w = {.deadline = fy_now_s() + DEADLINE_S};
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
    w.deadline = fy_now_s() + DEADLINE_S;
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
    double t0 = fy_now_s();
    fy_sup_stop_all(s);
    double took = fy_now_s() - t0;
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
        t0 = fy_now_s();
        fy_sup_stop_all(s);
        took = fy_now_s() - t0;
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
    double t = fy_now_s(), deadline = t + DEADLINE_S;
    int r;
    while ((r = poll(&pfd, 1, timeout_ms(deadline, t))) < 0 && errno == EINTR) t = fy_now_s();
    close(fd);
    return r == 1;
}

/* A child's helpers die with it, even one forked after the SIGTERM (which
 * the group signal cannot have reached) or left behind by a crash. */
static void until_backoff(void *arg, fy_sup_t *s)
{
    watch_t *w = arg;
    if (fy_sup_state(s, w->a) == FY_SUP_BACKOFF || fy_now_s() > w->deadline) {
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
    watch_t w = {.deadline = fy_now_s() + DEADLINE_S, .a = crasher};
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
    double t0 = fy_now_s();
    assert_int_equal(setitimer(ITIMER_REAL, &it, NULL), 0);
    fy_sup_stop_all(s);
    double took = fy_now_s() - t0;
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
    double t0 = fy_now_s();
    assert_int_equal(setitimer(ITIMER_REAL, &it, NULL), 0);
    /* no poll callback: nothing but the signal can end this */
    assert_int_equal(fy_sup_run(s, NULL, NULL, 0), FY_OK);
    double took = fy_now_s() - t0;
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
        {"ferry-no-such-binary-xyz", NULL,
         "cannot execute 'ferry-no-such-binary-xyz': No such file or directory (searched PATH)", FY_ERR_NOT_FOUND},
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
    watch_t w = {.deadline = fy_now_s() + DEADLINE_S};
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
    if (fy_sup_state(s, w->a) == FY_SUP_FAILED || fy_now_s() > w->deadline) {
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
    watch_t w = {.deadline = fy_now_s() + DEADLINE_S, .a = idx};
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

/* ---- readiness and start-up failures ---------------------------------------------------------- */

/* A script's line that reports readiness on the inherited pipe (dash takes
 * no descriptor above 9 in a redirection: the pipe is opened again) */
#define SAY_READY "echo ready > /proc/self/fd/$" FY_CLUSTER_READY_ENV ";"

static int add_ready_sh(fy_sup_t *s, const char *name, const char *script, const char *log)
{
    char *argv[] = {"/bin/sh", "-c", (char *)script, NULL};
    int idx = -1;
    assert_int_equal(fy_sup_add(s, name, argv, log, false, &idx), FY_OK);
    assert_int_equal(fy_sup_set_ready(s, idx, FY_CLUSTER_READY_ENV), FY_OK);
    return idx;
}

static void until_running(void *arg, fy_sup_t *s)
{
    watch_t *w = arg;
    if (fy_sup_state(s, w->a) == FY_SUP_RUNNING || fy_now_s() > w->deadline) {
        w->timed_out = fy_sup_state(s, w->a) != FY_SUP_RUNNING;
        fy_sup_request_stop(s);
    }
}

static void test_ready(void **state)
{
    fy_sup_params_t p;
    fy_sup_params_default(&p);
    p.fatal_startup = true;
    p.stop_grace_s = 2;
    fy_sup_t *s = make_sup_p(&p);
    int slow = add_ready_sh(s, "slow", "sleep 0.3;" SAY_READY "exec sleep 30", NULL);
    int plain = add_sh(s, "plain", "exec sleep 30", NULL, false); /* no report: running at once */
    assert_int_equal(fy_sup_start(s), FY_OK);
    assert_int_equal(fy_sup_state(s, slow), FY_SUP_STARTING);
    assert_string_equal(fy_sup_state_str(fy_sup_state(s, slow)), "starting");
    assert_int_equal(fy_sup_state(s, plain), FY_SUP_RUNNING);
    pid_t pid = fy_sup_pid(s, slow);
    assert_true(pid > 0); /* it runs */
    fy_test_log_begin();
    watch_t w = {.deadline = fy_now_s() + DEADLINE_S, .a = slow};
    assert_int_equal(fy_sup_run(s, until_running, &w, 0.01), FY_OK);
    char line[64];
    snprintf(line, sizeof(line), "slow (pid %d) is ready", (int)pid);
    assert_true(fy_test_log_has(line, NULL));
    fy_test_log_end();
    assert_false(w.timed_out);
    fy_sup_info_t info;
    fy_sup_info(s, slow, &info);
    assert_string_equal(info.name, "slow");
    assert_int_equal(info.restarts, 0);
    fy_sup_info(s, 99, &info);
    assert_string_equal(info.name, "");
    fy_sup_destroy(s);
    assert_no_children();
}

/* A child that fails before it is ready stops everything, its error lines
 * (and only those, and only this run's) in our log. */
static void test_startup_failure(void **state)
{
    const char *log = fy_test_path("bad.log");
    assert_true(fy_test_write_file(log, "bad: error: an error of an earlier run\n", 39));
    fy_sup_params_t p;
    fy_sup_params_default(&p);
    p.fatal_startup = true;
    p.log_echo_mark = ": error: ";
    p.restart_backoff_s = p.restart_backoff_max_s = 0.01;
    fy_sup_t *s = make_sup_p(&p);
    int ok = add_ready_sh(s, "ok", SAY_READY "exec sleep 30", NULL);
    int bad = add_ready_sh(s, "bad",
                           "sleep 0.2; echo 'bad: info: loading'; echo 'bad: error: config: x.y = zz: not a number';"
                           "echo 'bad: error: start-up failed: invalid argument'; exit 1",
                           log);
    assert_int_equal(fy_sup_start(s), FY_OK);
    fy_test_log_begin();
    watch_t w = {.deadline = fy_now_s() + DEADLINE_S};
    assert_int_equal(fy_sup_run(s, deadline_only, &w, 0.05), FY_ERR_PEER);
    fy_test_log_end();
    const char *text = fy_test_log_text();
    if (!fy_test_log_has("bad (pid ", "exited with status 1 before it was ready: it cannot start; stopping everything",
                         NULL) ||
        !fy_test_log_has("bad's log: bad: error: config: x.y = zz: not a number", NULL) ||
        !fy_test_log_has("bad's log: bad: error: start-up failed: invalid argument", NULL) ||
        fy_test_log_has("loading", NULL) || fy_test_log_has("earlier run", NULL) ||
        !fy_test_log_has("stopped ok", NULL) || fy_test_log_has("restarting", NULL))
        fail_msg("log:\n%s", text);
    assert_false(w.timed_out);
    assert_int_equal(fy_sup_state(s, bad), FY_SUP_FAILED);
    assert_int_equal(fy_sup_state(s, ok), FY_SUP_DOWN);
    assert_int_equal(fy_sup_restarts(s, bad), 0);
    fy_sup_destroy(s);
    assert_no_children();

    /* one that never says ready within start_timeout_s: killed, and a
     * start-up failure too */
    p.start_timeout_s = 0.3;
    s = make_sup_p(&p);
    int stuck = add_ready_sh(s, "stuck", "exec sleep 30", NULL);
    assert_int_equal(fy_sup_start(s), FY_OK);
    fy_test_log_begin();
    double t0 = fy_now_s();
    w.deadline = t0 + DEADLINE_S;
    assert_int_equal(fy_sup_run(s, deadline_only, &w, 0.05), FY_ERR_PEER);
    double took = fy_now_s() - t0;
    assert_true(fy_test_log_has("stuck (pid ", "was not ready 0.3 s after its start; killing it (SIGKILL)", NULL));
    assert_true(fy_test_log_has("stuck (pid ", "killed by signal 9 (SIGKILL) before it was ready", NULL));
    fy_test_log_end();
    if (took < 0.3 - 1e-3) fail_msg("killed after %.3f s, the limit is 0.3 s", took);
    fy_sup_info_t info;
    fy_sup_info(s, stuck, &info);
    assert_int_equal(info.health_kills, 1);
    assert_int_equal(info.state, FY_SUP_FAILED);
    assert_non_null(strstr(info.last_exit, "killed by signal 9 (SIGKILL): it was not ready"));
    fy_sup_destroy(s);
    assert_no_children();

    /* a child that said ready and exited at once is no start-up failure,
     * nor is any failure without fatal_startup: both are restarted */
    p.start_timeout_s = 0;
    for (int fatal = 1; fatal >= 0; fatal--) {
        p.fatal_startup = fatal;
        s = make_sup_p(&p);
        int idx = add_ready_sh(s, "brief", fatal ? SAY_READY "exit 0" : "exit 1", NULL);
        assert_int_equal(fy_sup_start(s), FY_OK);
        fy_test_log_begin();
        w = (watch_t){.deadline = fy_now_s() + DEADLINE_S, .a = idx, .want_restarts = 3};
        assert_int_equal(fy_sup_run(s, until_restarts, &w, 0.01), FY_OK);
        assert_true(fy_test_log_has(
            "brief (pid ", fatal ? "exited with status 0; restarting" : "exited with status 1; restarting", NULL));
        fy_test_log_end();
        assert_false(w.timed_out);
        fy_sup_destroy(s);
        assert_no_children();
    }
}

/* ---- health probes --------------------------------------------------------------------------- */

/* The child: an HTTP server on 127.0.0.1:port answering 503 to anything
 * (a 503 is a sign of life), ready once it listens. */
static int http_child(const char *port_arg)
{
    int port = atoi(port_arg);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in a = {
        .sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) || listen(fd, 64)) {
        perror("http child");
        return 1;
    }
    fy_cluster_notify_ready();
    static const char answer[] = "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    for (;;) {
        int c = accept(fd, NULL, NULL);
        if (c < 0) continue;
        char buf[1024];
        if (read(c, buf, sizeof(buf)) > 0 && write(c, answer, sizeof(answer) - 1)) {}
        close(c);
    }
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

static char g_self[512]; /* this binary */

static int add_http_child(fy_sup_t *s, const char *name, int port)
{
    char ps[16], url[64];
    snprintf(ps, sizeof(ps), "%d", port);
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", port);
    char *argv[] = {g_self, "--http-child", ps, NULL};
    int idx = -1;
    assert_int_equal(fy_sup_add(s, name, argv, NULL, false, &idx), FY_OK);
    assert_int_equal(fy_sup_set_ready(s, idx, FY_CLUSTER_READY_ENV), FY_OK);
    assert_int_equal(fy_sup_set_health(s, idx, url), FY_OK);
    return idx;
}

typedef struct wedge {
    int idx, phase;
    double deadline, t_mark, t_stopped, t_killed;
    pid_t first, second;
    char fail[256];
} wedge_t;

/* 0: wait until ready; 1: stopped for 0.5 s; 2: running again for 3 s,
 * longer than the 2 s health timeout: must be left alone; 3: stopped for
 * good: must be killed and come back as a new process. */
static void wedge_cb(void *arg, fy_sup_t *s)
{
    wedge_t *w = arg;
    double t = fy_now_s();
    fy_sup_info_t info;
    fy_sup_info(s, w->idx, &info);
    if (t > w->deadline) {
        snprintf(w->fail, sizeof(w->fail), "phase %d not over within the deadline (state %s)", w->phase,
                 fy_sup_state_str(info.state));
        fy_sup_request_stop(s);
        return;
    }
    switch (w->phase) {
    case 0:
        if (info.state != FY_SUP_RUNNING) return;
        w->first = info.pid;
        assert_int_equal(kill(w->first, SIGSTOP), 0);
        w->t_mark = t;
        w->phase = 1;
        return;
    case 1:
        if (t - w->t_mark < 0.5) return;
        assert_int_equal(kill(w->first, SIGCONT), 0);
        w->t_mark = t;
        w->phase = 2;
        return;
    case 2:
        if (info.pid != w->first || info.health_kills) {
            snprintf(w->fail, sizeof(w->fail), "killed for a 0.5 s stop (pid %d, kills %d)", (int)info.pid,
                     info.health_kills);
            fy_sup_request_stop(s);
            return;
        }
        if (t - w->t_mark < 3.0) return;
        assert_int_equal(kill(w->first, SIGSTOP), 0);
        w->t_stopped = t;
        w->phase = 3;
        return;
    case 3:
        if (info.health_kills && !w->t_killed) w->t_killed = t;
        if (info.state != FY_SUP_RUNNING || info.pid == w->first) return;
        w->second = info.pid;
        fy_sup_request_stop(s);
        return;
    }
}

static void test_health_wedge(void **state)
{
    fy_sup_params_t p;
    fy_sup_params_default(&p);
    p.fatal_startup = true;
    p.health_timeout_s = 2;
    p.health_interval_s = 0.1;
    p.restart_backoff_s = p.restart_backoff_max_s = 0.01;
    p.stop_grace_s = 2;
    fy_sup_t *s = make_sup_p(&p);
    wedge_t w = {.idx = add_http_child(s, "web", free_port()), .deadline = fy_now_s() + 30};
    assert_int_equal(fy_sup_start(s), FY_OK);
    fy_test_log_begin();
    assert_int_equal(fy_sup_run(s, wedge_cb, &w, 0.05), FY_OK);
    fy_test_log_end();
    if (w.fail[0]) fail_msg("%s; log:\n%s", w.fail, fy_test_log_text());
    char line[64];
    snprintf(line, sizeof(line), "web (pid %d) had not answered /health for ", (int)w.first);
    assert_true(fy_test_log_has(line, "(http://127.0.0.1:", "killing it (SIGKILL)", NULL));
    snprintf(line, sizeof(line), "web (pid %d) killed by signal 9 (SIGKILL); restarting", (int)w.first);
    assert_true(fy_test_log_has(line, NULL));
    /* not before its time: 2 s of silence (less the probe it had pending) */
    if (w.t_killed - w.t_stopped < 2.0 - 0.2) fail_msg("killed %.3f s after the stop", w.t_killed - w.t_stopped);
    assert_true(gone(w.first));
    fy_sup_info_t info;
    fy_sup_info(s, w.idx, &info);
    assert_int_equal(info.health_kills, 1);
    assert_int_equal(info.restarts, 1);
    assert_non_null(strstr(info.last_exit, "it had not answered /health for "));
    fy_sup_destroy(s);
    assert_no_children();
}

/* A child with a health timeout of its own (fy_sup_set_health_timeout,
 * as serve gives etcd): stopped together with one under the supervisor's
 * 1 s, only the other is killed; it is left alone for its own 4 s. */
typedef struct own {
    int short_idx, long_idx, phase;
    pid_t short_pid, long_pid;
    double t_stop, deadline;
    char fail[256];
} own_t;

static void own_cb(void *arg, fy_sup_t *s)
{
    own_t *o = arg;
    double t = fy_now_s();
    fy_sup_info_t a, b;
    fy_sup_info(s, o->short_idx, &a);
    fy_sup_info(s, o->long_idx, &b);
    if (t > o->deadline) {
        snprintf(o->fail, sizeof(o->fail), "phase %d not over within the deadline", o->phase);
        fy_sup_request_stop(s);
        return;
    }
    if (o->phase == 0) {
        if (a.state != FY_SUP_RUNNING || b.state != FY_SUP_RUNNING) return;
        o->short_pid = a.pid;
        o->long_pid = b.pid;
        assert_int_equal(kill(o->short_pid, SIGSTOP), 0);
        assert_int_equal(kill(o->long_pid, SIGSTOP), 0);
        o->t_stop = t;
        o->phase = 1;
        return;
    }
    if (b.health_kills || b.pid != o->long_pid) {
        snprintf(o->fail, sizeof(o->fail), "the child with a 4 s health timeout was killed %.2f s after its stop",
                 t - o->t_stop);
        fy_sup_request_stop(s);
        return;
    }
    if (t - o->t_stop < 3.0) return; /* past the short one's 1 s, short of the long one's 4 s */
    if (a.health_kills != 1) snprintf(o->fail, sizeof(o->fail), "the other child: %d kills", a.health_kills);
    kill(o->long_pid, SIGCONT);
    fy_sup_request_stop(s);
}

static void test_health_own_timeout(void **state)
{
    fy_sup_params_t p;
    fy_sup_params_default(&p);
    p.fatal_startup = true;
    p.health_timeout_s = 1;
    p.health_interval_s = 0.1;
    p.restart_backoff_s = p.restart_backoff_max_s = 0.01;
    p.stop_grace_s = 2;
    fy_sup_t *s = make_sup_p(&p);
    own_t o = {.short_idx = add_http_child(s, "short", free_port()),
               .long_idx = add_http_child(s, "long", free_port()),
               .deadline = fy_now_s() + 30};
    assert_int_equal(fy_sup_set_health_timeout(s, o.long_idx, 4), FY_OK);
    assert_int_equal(fy_sup_set_health_timeout(s, o.long_idx, -1), FY_ERR_INVALID);
    assert_int_equal(fy_sup_start(s), FY_OK);
    fy_test_log_begin();
    assert_int_equal(fy_sup_run(s, own_cb, &o, 0.05), FY_OK);
    fy_test_log_end();
    if (o.fail[0]) fail_msg("%s; log:\n%s", o.fail, fy_test_log_text());
    fy_sup_destroy(s);
    assert_no_children();
}

/* The supervisor itself is stopped (Ctrl-Z, a debugger) for longer than
 * the health timeout: its children did nothing wrong. */
static void own_stall_cb(void *arg, fy_sup_t *s)
{
    fifo_t *f = arg;
    static bool said;
    if (!said && fy_sup_state(s, 0) == FY_SUP_RUNNING) {
        char line[32];
        int n = snprintf(line, sizeof(line), "ready %d\n", (int)getpid());
        if (write(f->wr, line, (size_t)n) != n) _exit(5);
        said = true;
    }
}

static void on_term(int sig) { fy_sup_request_stop(g_sup); }

static void test_supervisor_stopped(void **state)
{
    fifo_t f;
    fifo_open(&f, "ready-stall");
    int port = free_port();
    pid_t helper = fork();
    assert_true(helper >= 0);
    if (helper == 0) {
        fy_sup_params_t p;
        fy_sup_params_default(&p);
        p.health_timeout_s = 1;
        p.health_interval_s = 0.1;
        fy_sup_t *s = make_sup_p(&p);
        add_http_child(s, "web", port);
        g_sup = s;
        struct sigaction sa = {.sa_handler = on_term};
        sigemptyset(&sa.sa_mask);
        sigaction(SIGTERM, &sa, NULL);
        if (fy_sup_start(s) != FY_OK) _exit(3);
        fy_sup_run(s, own_stall_cb, &f, 0.02);
        fy_sup_info_t info;
        fy_sup_info(s, 0, &info);
        fy_sup_destroy(s);
        _exit(info.health_kills == 0 && info.restarts == 0 ? 0 : 4);
    }
    pid_t pid;
    fifo_wait_ready(&f, &pid, 1);
    assert_int_equal(pid, helper);
    assert_int_equal(kill(helper, SIGSTOP), 0);
    struct timespec ts = {.tv_sec = 2, .tv_nsec = 500000000}; /* the stimulus: a 2.5 s stop */
    nanosleep(&ts, NULL);
    assert_int_equal(kill(helper, SIGCONT), 0);
    ts = (struct timespec){.tv_sec = 1, .tv_nsec = 500000000}; /* longer than the health timeout */
    nanosleep(&ts, NULL);
    assert_int_equal(kill(helper, SIGTERM), 0);
    int st = wait_pid(helper);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("the supervisor's wait status 0x%x (4: it killed its child)", st);
    fifo_close(&f);
    assert_no_children();
}

/* ---- restarts that never give up ------------------------------------------------------------- */

typedef struct killer {
    fifo_t *f;
    int idx, kills, want;
    pid_t last;
    double deadline;
    bool timed_out;
    double delays[16];
} killer_t;

/* kills the child each time it is back, want times */
static void killer_cb(void *arg, fy_sup_t *s)
{
    killer_t *k = arg;
    if (fy_now_s() > k->deadline) {
        k->timed_out = true;
        fy_sup_request_stop(s);
        return;
    }
    pid_t pid = fy_sup_pid(s, k->idx);
    if (!pid || pid == k->last || fy_sup_state(s, k->idx) != FY_SUP_RUNNING) return;
    if (k->kills == k->want) {
        fy_sup_request_stop(s);
        return;
    }
    k->last = pid;
    assert_int_equal(kill(pid, SIGKILL), 0);
    k->kills++;
}

static void test_restarts_forever(void **state)
{
    fy_sup_params_t p;
    fy_sup_params_default(&p); /* no limit by default */
    assert_int_equal(p.max_restarts, -1);
    p.restart_backoff_s = 0.01;
    p.restart_backoff_max_s = 0.04;
    p.restart_window_s = 5;
    fy_sup_t *s = make_sup_p(&p);
    killer_t k = {.idx = add_ready_sh(s, "worker", SAY_READY "exec sleep 30", NULL),
                  .want = 8,
                  .deadline = fy_now_s() + DEADLINE_S * 2};
    assert_int_equal(fy_sup_start(s), FY_OK);
    fy_test_log_begin();
    assert_int_equal(fy_sup_run(s, killer_cb, &k, 0.01), FY_OK);
    fy_test_log_end();
    assert_false(k.timed_out);
    assert_int_equal(fy_sup_restarts(s, k.idx), 8);
    /* doubled to the cap and held there */
    assert_true(fy_test_log_has("worker (pid ", "killed by signal 9 (SIGKILL); restarting in 0.01 s", NULL));
    assert_true(fy_test_log_has("worker (pid ", "killed by signal 9 (SIGKILL); restarting in 0.02 s", NULL));
    assert_true(fy_test_log_has("worker (pid ", "killed by signal 9 (SIGKILL); restarting in 0.04 s", NULL));
    assert_false(fy_test_log_has("leaving it down", NULL));
    fy_sup_destroy(s);
    assert_no_children();
}

/* ---- stop order ------------------------------------------------------------------------------ */

static void test_stop_stages(void **state)
{
    fifo_t f;
    fifo_open(&f, "ready-stages");
    const char *rec = fy_test_path("stages.rec");
    unlink(rec);
    fy_sup_t *s = make_sup(0.01, 0.02, 3, 5);
    /* stage 0 takes its time to drain, then exits; the workers record
     * when their SIGTERM came */
    const char *router = "trap 'echo TERM router >> \"$2\"; sleep 0.3; echo EXIT router >> \"$2\"; exit 0' TERM;"
                         "echo \"ready $$\" > \"$1\"; sleep 30 & wait";
    const char *worker = "trap 'echo TERM worker >> \"$2\"; exit 0' TERM; echo \"ready $$\" > \"$1\"; sleep 30 & wait";
    int idx[3];
    for (int i = 0; i < 3; i++) {
        char *argv[] = {"/bin/sh", "-c", (char *)(i ? worker : router), "sh", f.path, (char *)rec, NULL};
        assert_int_equal(fy_sup_add(s, i ? "worker" : "router", argv, NULL, false, &idx[i]), FY_OK);
        assert_int_equal(fy_sup_set_stop(s, idx[i], i ? 1 : 0, i ? -1 : 3), FY_OK);
    }
    assert_int_equal(fy_sup_set_stop(s, 9, 0, 1), FY_ERR_INVALID);
    assert_int_equal(fy_sup_start(s), FY_OK);
    assert_int_equal(fy_sup_set_stop(s, idx[0], 0, 1), FY_ERR_INVALID); /* not while it runs */
    pid_t pids[3];
    fifo_wait_ready(&f, pids, 3);
    fy_test_log_begin();
    fy_sup_stop_all(s);
    fy_test_log_end();
    char *text = fy_test_read_file(rec, NULL);
    assert_non_null(text);
    if (strcmp(text, "TERM router\nEXIT router\nTERM worker\nTERM worker\n")) fail_msg("the order:\n%s", text);
    fy_free(text);
    assert_no_children();

    /* a router that ignores SIGTERM gets SIGKILL after its own grace, and
     * only then do the workers hear of the stop */
    unlink(rec);
    fy_sup_destroy(s);
    s = make_sup(0.01, 0.02, 3, 5);
    router = "trap 'echo TERM router >> \"$2\"' TERM; echo \"ready $$\" > \"$1\"; while :; do sleep 30 & wait; done";
    for (int i = 0; i < 2; i++) {
        char *argv[] = {"/bin/sh", "-c", (char *)(i ? worker : router), "sh", f.path, (char *)rec, NULL};
        assert_int_equal(fy_sup_add(s, i ? "worker" : "router", argv, NULL, false, &idx[i]), FY_OK);
        assert_int_equal(fy_sup_set_stop(s, idx[i], i ? 1 : 0, i ? -1 : 0.3), FY_OK);
    }
    assert_int_equal(fy_sup_start(s), FY_OK);
    fifo_wait_ready(&f, pids, 2);
    fy_test_log_begin();
    double t0 = fy_now_s();
    fy_sup_stop_all(s);
    double took = fy_now_s() - t0;
    assert_true(fy_test_log_has("router (pid ", "did not stop within 0.3 s of SIGTERM; sending SIGKILL", NULL));
    assert_true(fy_test_log_has("stopped worker", "exited with status 0", NULL));
    fy_test_log_end();
    if (took < 0.3 - 1e-3 || took > 4) fail_msg("stopping took %.3f s", took);
    text = fy_test_read_file(rec, NULL);
    assert_non_null(text);
    if (strcmp(text, "TERM router\nTERM worker\n")) fail_msg("the order:\n%s\nlog:\n%s", text, fy_test_log_text());
    fy_free(text);
    fy_sup_destroy(s);
    fifo_close(&f);
    assert_no_children();
}

static void test_option_arguments(void **state)
{
    fy_sup_t *s = make_sup(0.01, 0.02, 1, 1);
    int idx = add_sh(s, "x", "exit 0", NULL, false);
    fy_test_log_begin();
    assert_int_equal(fy_sup_set_ready(s, idx, "9LIVES"), FY_ERR_INVALID);
    assert_int_equal(fy_sup_set_ready(s, idx, "A-B"), FY_ERR_INVALID);
    assert_int_equal(fy_sup_set_ready(s, idx, ""), FY_ERR_INVALID);
    assert_int_equal(fy_sup_set_ready(s, 3, "OK"), FY_ERR_INVALID);
    assert_int_equal(fy_sup_set_health(s, idx, "127.0.0.1:80"), FY_ERR_INVALID);
    assert_int_equal(fy_sup_set_health(s, idx, "http://127.0.0.1"), FY_ERR_INVALID);
    assert_int_equal(fy_sup_set_health(s, idx, "http://127.0.0.1:80/v1"), FY_ERR_INVALID);
    assert_int_equal(fy_sup_set_health(s, idx, "http://:80"), FY_ERR_INVALID);
    assert_int_equal(fy_sup_set_health(s, idx, "http://127.0.0.1:8x"), FY_ERR_INVALID);
    assert_int_equal(fy_sup_set_health(s, idx, "http://no.such.host.invalid:80"), FY_ERR_INVALID);
    assert_true(fy_test_log_has("health URL 'http://127.0.0.1:8x': expected http://HOST:PORT", NULL));
    assert_int_equal(fy_sup_set_stop(s, idx, -1, 1), FY_ERR_INVALID);
    fy_test_log_end();
    assert_int_equal(fy_sup_set_ready(s, idx, "FERRY_READY_FD"), FY_OK);
    assert_int_equal(fy_sup_set_health(s, idx, "http://127.0.0.1:80/"), FY_OK);
    assert_int_equal(fy_sup_set_health(s, idx, "tcp://[::1]:80"), FY_OK);
    assert_int_equal(fy_sup_set_health(s, idx, NULL), FY_OK);
    fy_sup_destroy(s);
    fy_sup_params_t p;
    fy_sup_params_default(&p);
    p.health_interval_s = 0;
    fy_test_log_begin();
    assert_int_equal(fy_sup_create(&p, &s), FY_ERR_INVALID);
    fy_test_log_end();
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--http-child")) return http_child(argv[2]);
    ssize_t n = readlink("/proc/self/exe", g_self, sizeof(g_self) - 1);
    if (n <= 0) return 1;
    g_self[n] = '\0';
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
        cmocka_unit_test(test_ready),
        cmocka_unit_test(test_startup_failure),
        cmocka_unit_test(test_health_wedge),
        cmocka_unit_test(test_health_own_timeout),
        cmocka_unit_test(test_supervisor_stopped),
        cmocka_unit_test(test_restarts_forever),
        cmocka_unit_test(test_stop_stages),
        cmocka_unit_test(test_option_arguments),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    fy_test_tmpdir_remove();
    return rc;
}

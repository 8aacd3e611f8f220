/*
 * supervise.c - the child-process supervisor behind `ferry serve`.
 *
 * fork + exec rather than posix_spawn, because the child must ask for
 * PR_SET_PDEATHSIG between the two.  Signals stay blocked across fork so
 * that none of the caller's handlers (which may write to our self-pipe)
 * runs in the child before it has reset every disposition to the default.
 * The run loop sleeps in poll(2) on one pidfd per child plus a self-pipe;
 * supervise.h explains the process groups, the restart policy and what
 * the caller must leave alone.
 */
#include "supervise.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "mem.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434 /* the same number on every architecture */
#endif
#ifndef SYS_close_range
#define SYS_close_range 436
#endif
#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

/* fy_sup_request_stop runs in signal handlers */
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "the stop flag must be lock-free");

#define SUP_MAX_CHILDREN 256
#define SUP_MAX_ARGS 4096
#define SUP_NAME_MAX 63
#define SUP_RING_UNLIMITED 32 /* enough restarts to remember for the doubling with no limit */
#define SUP_KILL_WAIT_S 5.0   /* how long a SIGKILLed child may take to die */
#define SUP_BLIND_TICK_S 0.1  /* the check interval for a child without a pidfd */

typedef struct child {
    char name[SUP_NAME_MAX + 1];
    char **argv; /* NULL-terminated copy */
    char *log_path;
    bool essential;
    fy_sup_state_t state;
    pid_t pid;         /* 0 unless RUNNING */
    int pidfd;         /* -1 when pidfd_open is not available */
    double restart_at; /* when BACKOFF */
    int restarts;
    double *recent; /* ring of the latest restart times */
    int ring_cap, ring_n, ring_next;
} child_t;

struct fy_sup {
    fy_sup_params_t p;
    child_t *kids;
    int n, cap;
    struct pollfd *pfds; /* cap + 1: the self-pipe and one per child */
    int wake[2];         /* self-pipe: fy_sup_request_stop writes, the run loop polls */
    _Atomic int stop;    /* stop requests so far */
    bool started;
    bool essential_failed;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* poll(2) timeout for a deadline, rounded up so we never wake early and spin */
static int timeout_ms(double deadline, double t)
{
    if (!isfinite(deadline)) return -1;
    double ms = ceil((deadline - t) * 1e3);
    if (ms <= 0) return 0;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

static const char *sig_name(int sig)
{
    switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGXCPU: return "SIGXCPU";
    case SIGSYS: return "SIGSYS";
    }
    return "?";
}

/* "exited with status 3", "killed by signal 11 (SIGSEGV, core dumped)";
 * status -1: it was reaped by someone else */
static void describe_exit(int status, char *buf, size_t cap)
{
    if (status == -1)
        snprintf(buf, cap, "exited, status unknown (reaped elsewhere, or SIGCHLD is ignored)");
    else if (WIFEXITED(status))
        snprintf(buf, cap, "exited with status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(buf, cap, "killed by signal %d (%s%s)", WTERMSIG(status), sig_name(WTERMSIG(status)),
                 WCOREDUMP(status) ? ", core dumped" : "");
    else
        snprintf(buf, cap, "ended with wait status 0x%x", (unsigned)status);
}

/* ---- spawning -------------------------------------------------------------------------------- */

/* The executable for argv0: as given when it holds a '/', else the first
 * executable regular file in PATH.  0 or an errno. */
static int resolve(const char *argv0, char *buf, size_t cap)
{
    if (strchr(argv0, '/')) {
        if (strlen(argv0) >= cap) return ENAMETOOLONG;
        strcpy(buf, argv0);
        return 0;
    }
    const char *path = getenv("PATH");
    if (!path || !*path) path = "/usr/local/bin:/usr/bin:/bin";
    int err = ENOENT;
    for (const char *p = path;;) {
        const char *colon = strchrnul(p, ':');
        int dl = (int)(colon - p);
        int n = dl ? snprintf(buf, cap, "%.*s/%s", dl, p, argv0) : snprintf(buf, cap, "./%s", argv0);
        if (n > 0 && (size_t)n < cap) {
            struct stat st;
            if (access(buf, X_OK) == 0 && stat(buf, &st) == 0 && S_ISREG(st.st_mode)) return 0;
            if (errno == EACCES) err = EACCES;
        }
        if (!*colon) break;
        p = colon + 1;
    }
    return err;
}

/* fd onto target, leaving it open across exec */
static int move_fd(int fd, int target)
{
    if (fd == target) return fcntl(fd, F_SETFD, 0);
    return dup2(fd, target) < 0 ? -1 : 0;
}

/* In the forked child: async-signal-safe calls only (the parent may have
 * threads).  Signals are blocked on entry. */
__attribute__((noreturn)) static void child_exec(const char *path, char *const argv[], int devnull, int logfd,
                                                 int errfd, pid_t parent)
{
    /* the parent's handlers must not run here, and its ignored signals
     * would stay ignored across exec */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof(dfl));
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; sig++)
        if (sig != SIGKILL && sig != SIGSTOP) sigaction(sig, &dfl, NULL);
    if (setpgid(0, 0) < 0) goto fail;
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0) goto fail;
    /* a parent that died before prctl will never send the death signal */
    if (getppid() != parent) _exit(127);
    if (move_fd(devnull, 0) < 0) goto fail;
    if (logfd >= 0 && (move_fd(logfd, 1) < 0 || move_fd(logfd, 2) < 0)) goto fail;
    /* leave the child nothing of ours beyond 0-2 (listening sockets held by
     * a child would outlive the supervisor's own); errfd is already
     * close-on-exec.  Kernels before 5.11 lack this; nothing else breaks */
    syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    execv(path, argv);
fail:;
    int err = errno;
    if (write(errfd, &err, sizeof(err))) {
    }
    _exit(127);
}

static fy_status_t errno_status(int err) { return err == ENOENT ? FY_ERR_NOT_FOUND : FY_ERR_IO; }

/* Starts k; on failure logs why, naming it. */
static fy_status_t spawn(child_t *k)
{
    char path[PATH_MAX];
    int err = resolve(k->argv[0], path, sizeof(path));
    if (err) {
        fy_error("supervise: %s: cannot execute '%s': %s%s", k->name, k->argv[0], strerror(err),
                 strchr(k->argv[0], '/') ? "" : " (searched PATH)");
        return errno_status(err);
    }
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull < 0) {
        fy_error("supervise: %s: cannot open /dev/null: %m", k->name);
        return FY_ERR_IO;
    }
    int logfd = -1;
    if (k->log_path) {
        logfd = open(k->log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        if (logfd < 0) {
            err = errno;
            fy_error("supervise: %s: cannot open its log %s: %m", k->name, k->log_path);
            close(devnull);
            return errno_status(err);
        }
    }
    int ep[2];
    if (pipe2(ep, O_CLOEXEC) < 0) {
        fy_error("supervise: %s: pipe: %m", k->name);
        close(devnull);
        if (logfd >= 0) close(logfd);
        return FY_ERR_IO;
    }
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) child_exec(path, k->argv, devnull, logfd, ep[1], parent);
    err = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    close(ep[1]);
    close(devnull);
    if (logfd >= 0) close(logfd);
    if (pid < 0) {
        close(ep[0]);
        errno = err;
        fy_error("supervise: %s: fork: %m", k->name);
        return FY_ERR_IO;
    }
    /* end of file: exec worked (the pipe closed with it); an int: its errno */
    int child_err = 0;
    ssize_t r;
    do r = read(ep[0], &child_err, sizeof(child_err));
    while (r < 0 && errno == EINTR);
    close(ep[0]);
    if (r == (ssize_t)sizeof(child_err)) {
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
        }
        fy_error("supervise: %s: cannot execute '%s': %s", k->name, path, strerror(child_err));
        return errno_status(child_err);
    }
    k->pid = pid;
    k->pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (k->pidfd < 0) fy_debug("supervise: %s: no pidfd (%m); checking it every %g s", k->name, SUP_BLIND_TICK_S);
    k->state = FY_SUP_RUNNING;
    fy_info("supervise: started %s (pid %d)", k->name, (int)pid);
    return FY_OK;
}

/* ---- exits and restarts ---------------------------------------------------------------------- */

/* Reaps k if it has exited: true and its wait status (-1: lost).  What is
 * left of its process group goes with it: a helper it forked (even one
 * forked after our SIGTERM) must neither become an orphan nor hold on to
 * what the restarted child needs, such as its port.  The group's id cannot
 * have been reused: Linux keeps a pid allocated while it names a group. */
static bool reap(child_t *k, int *status_p)
{
    int st = 0;
    pid_t r = waitpid(k->pid, &st, WNOHANG);
    if (r == 0 || (r < 0 && errno != ECHILD)) return false;
    *status_p = r < 0 ? -1 : st;
    if (k->pidfd >= 0) close(k->pidfd);
    k->pidfd = -1;
    if (kill(-k->pid, SIGKILL) == 0) fy_debug("supervise: %s: killed what was left of its process group", k->name);
    return true;
}

static int recent_restarts(const fy_sup_t *s, const child_t *k, double t)
{
    int n = 0;
    for (int i = 0; i < k->ring_n; i++)
        if (k->recent[i] > t - s->p.restart_window_s) n++;
    return n;
}

/* k went down unasked at time t (how: what happened, for the log line). */
static void on_crash(fy_sup_t *s, child_t *k, pid_t pid, const char *how, double t)
{
    char who[SUP_NAME_MAX + 32];
    if (pid > 0)
        snprintf(who, sizeof(who), "%s (pid %d)", k->name, (int)pid);
    else
        snprintf(who, sizeof(who), "%s", k->name);
    k->pid = 0;
    int recent = recent_restarts(s, k, t);
    if (s->p.max_restarts >= 0 && recent >= s->p.max_restarts) {
        k->state = FY_SUP_FAILED;
        if (s->p.max_restarts == 0)
            fy_error("supervise: %s %s; restarts are off, leaving it down", who, how);
        else
            fy_error("supervise: %s %s; %d restarts within %g s, leaving it down", who, how, recent,
                     s->p.restart_window_s);
        if (k->essential) {
            fy_error("supervise: %s is essential: stopping everything", k->name);
            s->essential_failed = true;
        }
        return;
    }
    double delay = s->p.restart_backoff_s * ldexp(1.0, recent < 60 ? recent : 60);
    if (delay > s->p.restart_backoff_max_s) delay = s->p.restart_backoff_max_s;
    k->state = FY_SUP_BACKOFF;
    k->restart_at = t + delay;
    fy_warn("supervise: %s %s; restarting in %.3g s", who, how, delay);
}

static void restart(fy_sup_t *s, child_t *k, double t)
{
    k->recent[k->ring_next] = t;
    k->ring_next = (k->ring_next + 1) % k->ring_cap;
    if (k->ring_n < k->ring_cap) k->ring_n++;
    k->restarts++;
    if (spawn(k) != FY_OK) on_crash(s, k, 0, "could not be restarted", t);
}

/* Sends sig to k's process group, which also reaches what it forked; to k
 * alone if it has moved itself to a group of its own. */
static void signal_child(const child_t *k, int sig)
{
    if (kill(-k->pid, sig) < 0 && errno == ESRCH) kill(k->pid, sig);
}

/* ---- public ---------------------------------------------------------------------------------- */

void fy_sup_params_default(fy_sup_params_t *p)
{
    *p = (fy_sup_params_t){
        .restart_backoff_s = 0.5,
        .restart_backoff_max_s = 30,
        .max_restarts = 5,
        .restart_window_s = 60,
        .stop_grace_s = 10,
    };
}

fy_status_t fy_sup_create(const fy_sup_params_t *p, fy_sup_t **s_p)
{
    if (!(p->restart_backoff_s >= 0 && isfinite(p->restart_backoff_s)) ||
        !(p->restart_backoff_max_s >= p->restart_backoff_s && isfinite(p->restart_backoff_max_s)) ||
        !(p->restart_window_s > 0 && isfinite(p->restart_window_s)) ||
        !(p->stop_grace_s >= 0 && p->stop_grace_s <= 86400) || p->max_restarts < -1 || p->max_restarts > 10000) {
        fy_error("supervise: bad parameters (backoff %g s, backoff max %g s, max restarts %d, window %g s, grace "
                 "%g s): need 0 <= backoff <= backoff max, -1 <= max restarts <= 10000, window > 0, "
                 "0 <= grace <= 1 day",
                 p->restart_backoff_s, p->restart_backoff_max_s, p->max_restarts, p->restart_window_s,
                 p->stop_grace_s);
        return FY_ERR_INVALID;
    }
    fy_sup_t *s = fy_calloc(1, sizeof(*s));
    if (!s) {
        fy_error("supervise: out of memory");
        return FY_ERR_NOMEM;
    }
    s->p = *p;
    if (pipe2(s->wake, O_CLOEXEC | O_NONBLOCK) < 0) {
        fy_error("supervise: pipe: %m");
        fy_free(s);
        return FY_ERR_IO;
    }
    *s_p = s;
    return FY_OK;
}

static void child_free(child_t *k)
{
    if (k->argv)
        for (char **a = k->argv; *a; a++) fy_free(*a);
    fy_free(k->argv);
    fy_free(k->log_path);
    fy_free(k->recent);
}

void fy_sup_destroy(fy_sup_t *s)
{
    if (!s) return;
    fy_sup_stop_all(s);
    for (int i = 0; i < s->n; i++) child_free(&s->kids[i]);
    fy_free(s->kids);
    fy_free(s->pfds);
    close(s->wake[0]);
    close(s->wake[1]);
    fy_free(s);
}

fy_status_t fy_sup_add(fy_sup_t *s, const char *name, char *const argv[], const char *log_path, bool essential,
                       int *index_p)
{
    size_t nl = name ? strlen(name) : 0;
    if (nl == 0 || nl > SUP_NAME_MAX) {
        fy_error("supervise: a child needs a name of 1 to %d bytes", SUP_NAME_MAX);
        return FY_ERR_INVALID;
    }
    int argc = 0;
    while (argv && argv[argc] && argc <= SUP_MAX_ARGS) argc++;
    if (argc == 0 || !argv[0][0] || argc > SUP_MAX_ARGS) {
        fy_error("supervise: %s: needs a command (1 to %d arguments, the first not empty)", name, SUP_MAX_ARGS);
        return FY_ERR_INVALID;
    }
    if (s->n >= SUP_MAX_CHILDREN) {
        fy_error("supervise: %s: more than %d children", name, SUP_MAX_CHILDREN);
        return FY_ERR_INVALID;
    }
    for (int i = 0; i < s->n; i++) {
        if (s->kids[i].state == FY_SUP_RUNNING || s->kids[i].state == FY_SUP_BACKOFF) {
            fy_error("supervise: %s: children are added before fy_sup_start (or after fy_sup_stop_all)", name);
            return FY_ERR_INVALID;
        }
    }
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 8;
        child_t *kids = fy_realloc(s->kids, (size_t)cap * sizeof(*kids));
        if (!kids) goto nomem;
        s->kids = kids;
        struct pollfd *pfds = fy_realloc(s->pfds, (size_t)(cap + 1) * sizeof(*pfds));
        if (!pfds) goto nomem; /* kids grew; cap stays, so the next add grows it again */
        s->pfds = pfds;
        s->cap = cap;
    }
    child_t k = {.essential = essential, .pidfd = -1};
    memcpy(k.name, name, nl + 1);
    k.ring_cap = s->p.max_restarts > 0 ? s->p.max_restarts : s->p.max_restarts < 0 ? SUP_RING_UNLIMITED : 1;
    k.recent = fy_calloc((size_t)k.ring_cap, sizeof(*k.recent));
    k.argv = fy_calloc((size_t)argc + 1, sizeof(*k.argv));
    if (!k.recent || !k.argv) goto nomem_child;
    for (int i = 0; i < argc; i++)
        if (!(k.argv[i] = fy_strdup(argv[i]))) goto nomem_child;
    if (log_path && !(k.log_path = fy_strdup(log_path))) goto nomem_child;
    s->kids[s->n] = k;
    if (index_p) *index_p = s->n;
    s->n++;
    return FY_OK;
nomem_child:
    child_free(&k);
nomem:
    fy_error("supervise: %s: out of memory", name);
    return FY_ERR_NOMEM;
}

fy_status_t fy_sup_start(fy_sup_t *s)
{
    for (int i = 0; i < s->n; i++) {
        child_t *k = &s->kids[i];
        if (k->state == FY_SUP_RUNNING) continue;
        k->ring_n = k->ring_next = 0; /* a fresh start forgives earlier crashes */
        k->state = FY_SUP_DOWN;
        fy_status_t st = spawn(k);
        if (st != FY_OK) {
            if (i > 0) fy_error("supervise: %s could not be started; stopping the others", k->name);
            fy_sup_stop_all(s);
            return st;
        }
    }
    s->essential_failed = false;
    s->started = true;
    return FY_OK;
}

void fy_sup_request_stop(fy_sup_t *s)
{
    int saved = errno;
    atomic_fetch_add(&s->stop, 1);
    char b = 1;
    if (write(s->wake[1], &b, 1) < 0) { /* full pipe: a wake-up is already pending */
    }
    errno = saved;
}

static void drain_wake(fy_sup_t *s)
{
    char buf[64];
    while (read(s->wake[0], buf, sizeof(buf)) > 0) {
    }
}

fy_status_t fy_sup_run(fy_sup_t *s, void (*poll_cb)(void *arg, fy_sup_t *s), void *arg, double poll_s)
{
    if (poll_cb && !(poll_s > 0 && isfinite(poll_s))) {
        fy_error("supervise: poll interval %g s: need a positive number", poll_s);
        return FY_ERR_INVALID;
    }
    if (!s->started) {
        fy_error("supervise: fy_sup_run before fy_sup_start");
        return FY_ERR_INVALID;
    }
    fy_status_t result = FY_OK;
    double next_cb = now_s() + poll_s;
    while (!atomic_load(&s->stop)) {
        double t = now_s();
        for (int i = 0; i < s->n; i++) {
            child_t *k = &s->kids[i];
            int status;
            if (k->state != FY_SUP_RUNNING || !reap(k, &status)) continue;
            char how[96];
            describe_exit(status, how, sizeof(how));
            if (atomic_load(&s->stop)) { /* e.g. the whole service got SIGTERM at once: no restart */
                fy_info("supervise: %s (pid %d) %s while stopping", k->name, (int)k->pid, how);
                k->pid = 0;
                k->state = FY_SUP_DOWN;
                continue;
            }
            on_crash(s, k, k->pid, how, t);
        }
        if (s->essential_failed) {
            result = FY_ERR_PEER;
            break;
        }
        for (int i = 0; i < s->n; i++) {
            child_t *k = &s->kids[i];
            if (k->state == FY_SUP_BACKOFF && k->restart_at <= t) restart(s, k, t);
        }
        if (s->essential_failed) { /* a restart that could not exec, past the limit */
            result = FY_ERR_PEER;
            break;
        }
        if (poll_cb && t >= next_cb) {
            poll_cb(arg, s);
            next_cb = now_s() + poll_s;
            continue; /* it may have asked us to stop */
        }
        double wake_at = poll_cb ? next_cb : INFINITY;
        int nfds = 0;
        s->pfds[nfds++] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
        for (int i = 0; i < s->n; i++) {
            child_t *k = &s->kids[i];
            if (k->state == FY_SUP_BACKOFF && k->restart_at < wake_at) wake_at = k->restart_at;
            if (k->state != FY_SUP_RUNNING) continue;
            if (k->pidfd >= 0)
                s->pfds[nfds++] = (struct pollfd){.fd = k->pidfd, .events = POLLIN};
            else if (t + SUP_BLIND_TICK_S < wake_at)
                wake_at = t + SUP_BLIND_TICK_S;
        }
        if (poll(s->pfds, (nfds_t)nfds, timeout_ms(wake_at, t)) < 0 && errno != EINTR) {
            fy_error("supervise: poll: %m");
            result = FY_ERR_IO;
            break;
        }
        drain_wake(s);
    }
    fy_sup_stop_all(s);
    return result;
}

/* Reaps whichever running children exit before deadline; returns how many
 * still run.  With requests >= 0, a stop request beyond that many ends the
 * wait early (Ctrl-C pressed again during the grace period). */
static int wait_exits(fy_sup_t *s, double deadline, int requests)
{
    for (;;) {
        int live = 0, nfds = 0;
        bool blind = false;
        if (requests >= 0) s->pfds[nfds++] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
        for (int i = 0; i < s->n; i++) {
            child_t *k = &s->kids[i];
            int status;
            if (k->state != FY_SUP_RUNNING) continue;
            if (reap(k, &status)) {
                char how[96];
                describe_exit(status, how, sizeof(how));
                fy_info("supervise: stopped %s (pid %d): %s", k->name, (int)k->pid, how);
                k->pid = 0;
                k->state = FY_SUP_DOWN;
                continue;
            }
            live++;
            if (k->pidfd >= 0)
                s->pfds[nfds++] = (struct pollfd){.fd = k->pidfd, .events = POLLIN};
            else
                blind = true;
        }
        double t = now_s();
        if (!live || t >= deadline) return live;
        if (requests >= 0 && atomic_load(&s->stop) > requests) {
            fy_warn("supervise: asked again to stop: not waiting out the grace period");
            return live;
        }
        double until = blind && t + SUP_BLIND_TICK_S < deadline ? t + SUP_BLIND_TICK_S : deadline;
        if (poll(s->pfds, (nfds_t)nfds, timeout_ms(until, t)) < 0 && errno != EINTR) {
            fy_error("supervise: poll: %m");
            return live;
        }
        if (requests >= 0) drain_wake(s);
    }
}

void fy_sup_stop_all(fy_sup_t *s)
{
    if (!s) return;
    int requests = atomic_load(&s->stop);
    int live = 0;
    for (int i = s->n - 1; i >= 0; i--) {
        child_t *k = &s->kids[i];
        if (k->state == FY_SUP_BACKOFF) k->state = FY_SUP_DOWN;
        if (k->state != FY_SUP_RUNNING) continue;
        signal_child(k, SIGTERM);
        signal_child(k, SIGCONT); /* a stopped child (SIGTTOU, SIGSTOP) would sit on its SIGTERM */
        live++;
    }
    s->started = false;
    if (!live) return;
    if (wait_exits(s, now_s() + s->p.stop_grace_s, requests) == 0) return;
    for (int i = s->n - 1; i >= 0; i--) {
        child_t *k = &s->kids[i];
        if (k->state != FY_SUP_RUNNING) continue;
        fy_warn("supervise: %s (pid %d) did not stop within %g s of SIGTERM; sending SIGKILL", k->name, (int)k->pid,
                s->p.stop_grace_s); /* or we were asked twice */
        signal_child(k, SIGKILL);
    }
    if (wait_exits(s, now_s() + SUP_KILL_WAIT_S, -1) == 0) return;
    for (int i = 0; i < s->n; i++) {
        child_t *k = &s->kids[i];
        if (k->state != FY_SUP_RUNNING) continue;
        /* stuck in the kernel; waiting longer would hang the shutdown */
        fy_error("supervise: %s (pid %d) did not die of SIGKILL within %g s; leaving it", k->name, (int)k->pid,
                 SUP_KILL_WAIT_S);
        if (k->pidfd >= 0) close(k->pidfd);
        k->pidfd = -1;
        k->pid = 0;
        k->state = FY_SUP_DOWN;
    }
}

static const child_t *kid(const fy_sup_t *s, int index)
{
    return index >= 0 && index < s->n ? &s->kids[index] : NULL;
}

pid_t fy_sup_pid(const fy_sup_t *s, int index)
{
    const child_t *k = kid(s, index);
    return k && k->state == FY_SUP_RUNNING ? k->pid : 0;
}

int fy_sup_restarts(const fy_sup_t *s, int index)
{
    const child_t *k = kid(s, index);
    return k ? k->restarts : 0;
}

fy_sup_state_t fy_sup_state(const fy_sup_t *s, int index)
{
    const child_t *k = kid(s, index);
    return k ? k->state : FY_SUP_DOWN;
}

int fy_sup_count(const fy_sup_t *s) { return s->n; }

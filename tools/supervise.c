/*
 * supervise.c - the child-process supervisor behind `ferry serve`.
 *
 * fork + exec rather than posix_spawn, because the child must ask for
 * PR_SET_PDEATHSIG between the two.  Signals stay blocked across fork so
 * that none of the caller's handlers (which may write to our self-pipe)
 * runs in the child before it has reset every disposition to the default.
 * The run loop sleeps in poll(2) on one pidfd per child, the readiness
 * pipes of starting children, the health probes in flight and a
 * self-pipe.  A health probe is a plain non-blocking socket with a fixed
 * request, advanced a step at a time by the loop: no thread, no HTTP
 * library (it reads five bytes, "HTTP/").  supervise.h explains the
 * process groups, readiness, liveness, the restart policy, the stop order
 * and what the caller must leave alone.
 *
 * Not here: what the children are (tools/serve.c).
 */
#include "tools/supervise.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"

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
#define SUP_FDS_PER_CHILD 3   /* pidfd, readiness pipe, health probe */
#define SUP_ENV_MAX 63
#define SUP_ECHO_WINDOW 16384 /* how much of a log's tail is searched for its error lines */
#define SUP_ECHO_LINES 6

extern char **environ;

typedef struct child {
    char name[SUP_NAME_MAX + 1];
    char **argv; /* NULL-terminated copy */
    char *log_path;
    bool essential;
    fy_sup_state_t state;
    pid_t pid;         /* 0 unless STARTING or RUNNING */
    int pidfd;         /* -1 when pidfd_open is not available */
    double started_at; /* of the latest spawn */
    double restart_at; /* when BACKOFF */
    double delay;      /* the latest backoff delay; 0 before the first */
    int restarts;
    double *recent; /* ring of the latest restart times */
    int ring_cap, ring_n, ring_next;
    char last_exit[128];
    /* readiness */
    char *ready_env; /* NULL: the child does not report it */
    int ready_fd;    /* our read end while STARTING, else -1 */
    char ready_buf[16];
    size_t ready_len;
    bool ever_ready;    /* since fy_sup_start */
    bool ready_at_exit; /* its report was still in the pipe when it exited */
    /* liveness */
    char *health_url;      /* NULL: no probe */
    double health_timeout; /* > 0: this child's own (fy_sup_set_health_timeout) */
    char health_host[300]; /* HOST:PORT, for the Host header */
    struct sockaddr_storage health_addr;
    socklen_t health_addr_len;
    double last_alive, next_probe, probe_started;
    int probe_fd; /* -1: no probe in flight */
    bool probe_sent;
    char probe_buf[5];
    size_t probe_got;
    bool hung; /* SIGKILLed for silence; its exit is on its way */
    char hang_why[96];
    int hang_kills;
    /* the tail of its log that is this run's */
    off_t log_start;
    /* stopping */
    int stop_stage;
    double stop_grace_s; /* < 0: the supervisor's */
} child_t;

struct fy_sup {
    fy_sup_params_t p;
    child_t *kids;
    int n, cap;
    struct pollfd *pfds; /* SUP_FDS_PER_CHILD * cap + 1: the self-pipe and each child's */
    int wake[2];         /* self-pipe: fy_sup_request_stop writes, the run loop polls */
    _Atomic int stop;    /* stop requests so far */
    bool started;
    bool essential_failed, startup_failed;
    double planned_wake; /* the run loop's latest poll deadline (for noticing our own stalls) */
};

static bool running(const child_t *k) { return k->state == FY_SUP_STARTING || k->state == FY_SUP_RUNNING; }

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
 * threads).  Signals are blocked on entry.  readyfd (or -1) is the one
 * descriptor beyond 0-2 the child keeps; envp NULL: our environment. */
__attribute__((noreturn)) static void child_exec(const char *path, char *const argv[], char *const envp[], int devnull,
                                                 int logfd, int readyfd, int errfd, pid_t parent)
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
     * a child would outlive the supervisor's own) but its readiness pipe;
     * errfd is already close-on-exec.  Kernels before 5.11 lack this;
     * nothing else breaks */
    syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC);
    if (readyfd >= 0 && fcntl(readyfd, F_SETFD, 0) < 0) goto fail;
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (envp)
        execve(path, argv, envp);
    else
        execv(path, argv);
fail:;
    int err = errno;
    if (write(errfd, &err, sizeof(err))) {}
    _exit(127);
}

/* Our environment with name=fd in place of any name=...; NULL when out of
 * memory.  Free with env_free. */
static char **env_with(const char *name, int fd)
{
    size_t n = 0, nl = strlen(name);
    while (environ && environ[n]) n++;
    char **env = fy_calloc(n + 2, sizeof(*env));
    char *var = fy_malloc(nl + 16);
    if (!env || !var) {
        fy_free(env);
        fy_free(var);
        return NULL;
    }
    snprintf(var, nl + 16, "%s=%d", name, fd);
    size_t j = 0;
    env[j++] = var;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], name, nl) || environ[i][nl] != '=') env[j++] = environ[i];
    env[j] = NULL;
    return env;
}

static void env_free(char **env)
{
    if (env) fy_free(env[0]);
    fy_free(env);
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
    off_t log_start = logfd >= 0 ? lseek(logfd, 0, SEEK_END) : 0;
    /* the readiness pipe: the write end (above 2, so that the child's own
     * dup2s onto 0-2 cannot clobber it) goes to the child alone */
    int rp[2] = {-1, -1};
    char **envp = NULL;
    if (k->ready_env) {
        if (pipe2(rp, O_CLOEXEC) < 0) {
            fy_error("supervise: %s: pipe: %m", k->name);
            goto fail_fds;
        }
        if (rp[1] < 3) {
            int hi = fcntl(rp[1], F_DUPFD_CLOEXEC, 3);
            if (hi < 0) {
                fy_error("supervise: %s: fcntl: %m", k->name);
                goto fail_fds;
            }
            close(rp[1]);
            rp[1] = hi;
        }
        if (fcntl(rp[0], F_SETFL, O_NONBLOCK) < 0) {
            fy_error("supervise: %s: fcntl: %m", k->name);
            goto fail_fds;
        }
        if (!(envp = env_with(k->ready_env, rp[1]))) {
            fy_error("supervise: %s: out of memory", k->name);
            goto fail_fds;
        }
    }
    int ep[2];
    if (pipe2(ep, O_CLOEXEC) < 0) {
        fy_error("supervise: %s: pipe: %m", k->name);
        goto fail_fds;
    }
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) child_exec(path, k->argv, envp, devnull, logfd, rp[1], ep[1], parent);
    err = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    close(ep[1]);
    close(devnull);
    if (logfd >= 0) close(logfd);
    if (rp[1] >= 0) close(rp[1]);
    env_free(envp);
    if (pid < 0) {
        close(ep[0]);
        if (rp[0] >= 0) close(rp[0]);
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
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {}
        fy_error("supervise: %s: cannot execute '%s': %s", k->name, path, strerror(child_err));
        if (rp[0] >= 0) close(rp[0]);
        return errno_status(child_err);
    }
    k->pid = pid;
    k->pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (k->pidfd < 0) fy_debug("supervise: %s: no pidfd (%m); checking it every %g s", k->name, SUP_BLIND_TICK_S);
    k->started_at = fy_now_s();
    k->ready_fd = rp[0];
    k->ready_len = 0;
    k->hung = false;
    k->probe_fd = -1;
    k->log_start = log_start > 0 ? log_start : 0;
    k->state = k->ready_env ? FY_SUP_STARTING : FY_SUP_RUNNING;
    /* without a readiness report, the health clock starts now */
    k->last_alive = k->next_probe = k->started_at;
    fy_info("supervise: started %s (pid %d)", k->name, (int)pid);
    return FY_OK;
fail_fds:
    env_free(envp);
    if (rp[0] >= 0) close(rp[0]);
    if (rp[1] >= 0) close(rp[1]);
    close(devnull);
    if (logfd >= 0) close(logfd);
    return FY_ERR_IO;
}

/* ---- readiness and liveness ------------------------------------------------------------------ */

static void probe_close(child_t *k)
{
    if (k->probe_fd >= 0) close(k->probe_fd);
    k->probe_fd = -1;
}

/* Reads what a starting child wrote on its readiness pipe; true once it
 * said "ready". */
static bool check_ready(child_t *k)
{
    while (k->ready_fd >= 0) {
        size_t room = sizeof(k->ready_buf) - k->ready_len;
        ssize_t r = room ? read(k->ready_fd, k->ready_buf + k->ready_len, room) : 0;
        if (r < 0 && errno == EINTR) continue;
        if (r > 0) {
            k->ready_len += (size_t)r;
            if (memmem(k->ready_buf, k->ready_len, "ready\n", 6)) {
                close(k->ready_fd);
                k->ready_fd = -1;
                return true;
            }
            continue;
        }
        if (r < 0 && errno == EAGAIN) return false;
        /* end of file (or a full buffer of something else): it will not
         * say ready on this pipe; its exit or start_timeout_s decide */
        if (room) fy_debug("supervise: %s closed its readiness pipe without a report", k->name);
        close(k->ready_fd);
        k->ready_fd = -1;
    }
    return false;
}

static void on_ready(fy_sup_t *s, child_t *k, double t)
{
    k->state = FY_SUP_RUNNING;
    k->ever_ready = true;
    k->last_alive = t;
    k->next_probe = t + s->p.health_interval_s;
    fy_info("supervise: %s (pid %d) is ready (%.1f s after its start)", k->name, (int)k->pid, t - k->started_at);
}

static double health_timeout(const fy_sup_t *s, const child_t *k)
{
    return k->health_timeout > 0 ? k->health_timeout : s->p.health_timeout_s;
}

static double probe_timeout(const fy_sup_t *s)
{
    double q = s->p.health_timeout_s / 4;
    return q > s->p.health_interval_s ? q : s->p.health_interval_s;
}

/* One step of k's health probe at time t: start one when due, send the
 * request once connected, read the answer's first five bytes.  Any HTTP
 * answer is a sign of life; refusals, resets and silence are not. */
static void probe_step(fy_sup_t *s, child_t *k, double t)
{
    if (k->probe_fd < 0) {
        if (t < k->next_probe) return;
        k->probe_started = t;
        k->next_probe = t + s->p.health_interval_s;
        k->probe_sent = false;
        k->probe_got = 0;
        int fd = socket(k->health_addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            fy_warn("supervise: %s: cannot open a socket to probe %s: %m", k->name, k->health_url);
            return;
        }
        if (connect(fd, (struct sockaddr *)&k->health_addr, k->health_addr_len) < 0 && errno != EINPROGRESS) {
            fy_debug("supervise: %s: probe of %s: %m", k->name, k->health_url);
            close(fd);
            return;
        }
        k->probe_fd = fd;
    }
    struct pollfd p = {.fd = k->probe_fd, .events = k->probe_sent ? POLLIN : POLLOUT};
    if (poll(&p, 1, 0) <= 0 || !p.revents) goto pending;
    if (!k->probe_sent) {
        int err = 0;
        socklen_t el = sizeof(err);
        if (getsockopt(k->probe_fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0 || err) goto done; /* refused */
        char req[400];
        int n =
            snprintf(req, sizeof(req), "GET /health HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", k->health_host);
        if (n < 0 || (size_t)n >= sizeof(req) || send(k->probe_fd, req, (size_t)n, MSG_NOSIGNAL) != n) goto done;
        k->probe_sent = true;
        goto pending;
    }
    ssize_t r = recv(k->probe_fd, k->probe_buf + k->probe_got, sizeof(k->probe_buf) - k->probe_got, 0);
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) goto pending;
    if (r <= 0) goto done; /* closed or reset without an answer */
    k->probe_got += (size_t)r;
    if (k->probe_got < sizeof(k->probe_buf)) goto pending;
    if (!memcmp(k->probe_buf, "HTTP/", 5)) k->last_alive = t;
    goto done;
pending:
    if (t - k->probe_started < probe_timeout(s)) return;
    k->next_probe = t; /* it had its time: the next one goes now */
done:
    probe_close(k);
}

/* SIGKILL for a child that is running but wedged (why: for the log). */
static void kill_hung(child_t *k, const char *why)
{
    bool probed = k->state == FY_SUP_RUNNING && k->health_url;
    fy_error("supervise: %s (pid %d) %s%s%s%s; killing it (SIGKILL)", k->name, (int)k->pid, why, probed ? " (" : "",
             probed ? k->health_url : "", probed ? ")" : "");
    snprintf(k->hang_why, sizeof(k->hang_why), "%s", why);
    if (kill(-k->pid, SIGKILL) < 0 && errno == ESRCH) kill(k->pid, SIGKILL);
    k->hung = true;
    k->hang_kills++;
    probe_close(k);
}

/* Readiness, start-up deadlines and health probes of every child at t. */
static void watch_children(fy_sup_t *s, double t)
{
    for (int i = 0; i < s->n; i++) {
        child_t *k = &s->kids[i];
        if (!running(k) || k->hung) continue;
        if (k->state == FY_SUP_STARTING) {
            if (check_ready(k)) {
                on_ready(s, k, t);
            } else if (s->p.start_timeout_s > 0 && t - k->started_at > s->p.start_timeout_s) {
                char why[96];
                snprintf(why, sizeof(why), "was not ready %.1f s after its start", s->p.start_timeout_s);
                kill_hung(k, why);
            }
            continue;
        }
        if (!k->health_url || s->p.health_timeout_s <= 0) continue;
        probe_step(s, k, t);
        if (t - k->last_alive > health_timeout(s, k)) {
            char why[96];
            snprintf(why, sizeof(why), "had not answered /health for %.1f s", t - k->last_alive);
            kill_hung(k, why);
        }
    }
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
    probe_close(k);
    /* a child may say ready and exit before we looked */
    k->ready_at_exit = k->state == FY_SUP_STARTING && check_ready(k);
    if (k->ready_fd >= 0) close(k->ready_fd);
    k->ready_fd = -1;
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

/* Repeats in our log the last lines holding log_echo_mark that k wrote to
 * its log file since its latest start. */
static void echo_log(const fy_sup_t *s, const child_t *k)
{
    if (!s->p.log_echo_mark || !*s->p.log_echo_mark || !k->log_path) return;
    int fd = open(k->log_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    struct stat st;
    char buf[SUP_ECHO_WINDOW + 1];
    ssize_t n = -1;
    off_t from = k->log_start;
    if (fstat(fd, &st) == 0 && st.st_size > from) {
        if (st.st_size - from > SUP_ECHO_WINDOW) from = st.st_size - SUP_ECHO_WINDOW;
        n = pread(fd, buf, SUP_ECHO_WINDOW, from);
    }
    close(fd);
    if (n <= 0) return;
    buf[n] = '\0';
    char *lines[SUP_ECHO_LINES];
    int found = 0;
    char *p = buf;
    if (from > k->log_start) { /* we start mid-line */
        char *nl = strchr(p, '\n');
        p = nl ? nl + 1 : buf + n;
    }
    while (*p) {
        char *nl = strchr(p, '\n');
        if (nl) *nl = '\0';
        if (strstr(p, s->p.log_echo_mark)) {
            if (found == SUP_ECHO_LINES) {
                memmove(lines, lines + 1, (SUP_ECHO_LINES - 1) * sizeof(*lines));
                found--;
            }
            lines[found++] = p;
        }
        if (!nl) break;
        p = nl + 1;
    }
    for (int i = 0; i < found; i++) fy_error("supervise: %s's log: %.400s", k->name, lines[i]);
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
    if (k->hung)
        snprintf(k->last_exit, sizeof(k->last_exit), "%s: it %s", how, k->hang_why);
    else
        snprintf(k->last_exit, sizeof(k->last_exit), "%s", how);
    if (s->p.fatal_startup && k->ready_env && !k->ever_ready) {
        k->state = FY_SUP_FAILED;
        fy_error("supervise: %s %s before it was ready: it cannot start; stopping everything", who, how);
        s->startup_failed = true;
        return;
    }
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
    /* doubled after a crash soon after the start, back to the first delay
     * after a run of restart_window_s */
    double delay = k->delay > 0 && t - k->started_at < s->p.restart_window_s ? k->delay * 2 : s->p.restart_backoff_s;
    if (delay > s->p.restart_backoff_max_s) delay = s->p.restart_backoff_max_s;
    k->delay = delay;
    k->state = FY_SUP_BACKOFF;
    k->restart_at = t + delay;
    fy_warn("supervise: %s %s; restarting in %.3g s", who, how, delay);
}

/* k was reaped with wait status status while nobody was stopping it. */
static void on_exit_unasked(fy_sup_t *s, child_t *k, int status, double t)
{
    char how[96];
    describe_exit(status, how, sizeof(how));
    if (k->ready_at_exit) on_ready(s, k, t);
    bool before_ready = k->ready_env && !k->ever_ready;
    on_crash(s, k, k->pid, how, t);
    if (before_ready || (status != -1 && WIFEXITED(status) && WEXITSTATUS(status) != 0)) echo_log(s, k);
}

static void restart(fy_sup_t *s, child_t *k, double t)
{
    k->recent[k->ring_next] = t;
    k->ring_next = (k->ring_next + 1) % k->ring_cap;
    if (k->ring_n < k->ring_cap) k->ring_n++;
    k->restarts++;
    if (spawn(k) != FY_OK) {
        k->started_at = t;
        on_crash(s, k, 0, "could not be restarted", t);
    }
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
        .max_restarts = -1,
        .restart_window_s = 60,
        .stop_grace_s = 10,
        .health_timeout_s = 10,
        .health_interval_s = 1,
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
                 p->restart_backoff_s, p->restart_backoff_max_s, p->max_restarts, p->restart_window_s, p->stop_grace_s);
        return FY_ERR_INVALID;
    }
    if (!(p->health_timeout_s >= 0 && p->health_timeout_s <= 86400) ||
        !(p->health_interval_s >= 0.001 && p->health_interval_s <= 3600) ||
        !(p->start_timeout_s >= 0 && p->start_timeout_s <= 86400)) {
        fy_error("supervise: bad parameters (health timeout %g s, health interval %g s, start timeout %g s): need "
                 "0 <= health timeout <= 1 day, 1 ms <= interval <= 1 h, 0 <= start timeout <= 1 day",
                 p->health_timeout_s, p->health_interval_s, p->start_timeout_s);
        return FY_ERR_INVALID;
    }
    fy_sup_t *s = fy_calloc(1, sizeof(*s));
    if (!s) {
        fy_error("supervise: out of memory");
        return FY_ERR_NOMEM;
    }
    s->p = *p;
    s->planned_wake = INFINITY;
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
    fy_free(k->ready_env);
    fy_free(k->health_url);
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

static bool any_running(const fy_sup_t *s)
{
    for (int i = 0; i < s->n; i++)
        if (running(&s->kids[i]) || s->kids[i].state == FY_SUP_BACKOFF) return true;
    return false;
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
    if (any_running(s)) {
        fy_error("supervise: %s: children are added before fy_sup_start (or after fy_sup_stop_all)", name);
        return FY_ERR_INVALID;
    }
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 8;
        child_t *kids = fy_realloc(s->kids, (size_t)cap * sizeof(*kids));
        if (!kids) goto nomem;
        s->kids = kids;
        struct pollfd *pfds = fy_realloc(s->pfds, ((size_t)cap * SUP_FDS_PER_CHILD + 1) * sizeof(*pfds));
        if (!pfds) goto nomem; /* kids grew; cap stays, so the next add grows it again */
        s->pfds = pfds;
        s->cap = cap;
    }
    child_t k = {.essential = essential, .pidfd = -1, .ready_fd = -1, .probe_fd = -1, .stop_grace_s = -1};
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

/* The child for a setter: one that exists and does not run. */
static child_t *settable(fy_sup_t *s, int index, const char *what)
{
    if (index < 0 || index >= s->n) {
        fy_error("supervise: %s: no child %d", what, index);
        return NULL;
    }
    child_t *k = &s->kids[index];
    if (running(k) || k->state == FY_SUP_BACKOFF) {
        fy_error("supervise: %s: %s is running; set it before fy_sup_start", k->name, what);
        return NULL;
    }
    return k;
}

fy_status_t fy_sup_set_ready(fy_sup_t *s, int index, const char *env_name)
{
    child_t *k = settable(s, index, "readiness");
    if (!k) return FY_ERR_INVALID;
    size_t n = env_name ? strlen(env_name) : 0;
    bool ok = n > 0 && n <= SUP_ENV_MAX && !(env_name[0] >= '0' && env_name[0] <= '9');
    for (size_t i = 0; ok && i < n; i++)
        ok = (env_name[i] >= 'A' && env_name[i] <= 'Z') || (env_name[i] >= 'a' && env_name[i] <= 'z') ||
             (env_name[i] >= '0' && env_name[i] <= '9') || env_name[i] == '_';
    if (!ok) {
        fy_error("supervise: %s: '%s' is not an environment variable name", k->name, env_name ? env_name : "");
        return FY_ERR_INVALID;
    }
    char *copy = fy_strdup(env_name);
    if (!copy) {
        fy_error("supervise: %s: out of memory", k->name);
        return FY_ERR_NOMEM;
    }
    fy_free(k->ready_env);
    k->ready_env = copy;
    return FY_OK;
}

fy_status_t fy_sup_set_health_timeout(fy_sup_t *s, int index, double timeout_s)
{
    child_t *k = settable(s, index, "health timeout");
    if (!k || !(timeout_s >= 0 && timeout_s <= 86400)) return FY_ERR_INVALID;
    k->health_timeout = timeout_s;
    return FY_OK;
}

fy_status_t fy_sup_set_health(fy_sup_t *s, int index, const char *url)
{
    child_t *k = settable(s, index, "health");
    if (!k) return FY_ERR_INVALID;
    if (!url) {
        fy_free(k->health_url);
        k->health_url = NULL;
        return FY_OK;
    }
    const char *rest = !strncmp(url, "http://", 7) ? url + 7 : !strncmp(url, "tcp://", 6) ? url + 6 : NULL;
    char host[256], port[16];
    const char *colon = rest ? strrchr(rest, ':') : NULL;
    size_t pl = colon ? strcspn(colon + 1, "/") : 0;
    bool ok = colon && colon > rest && pl > 0 && pl < sizeof(port) &&
              (!colon[1 + pl] || !strcmp(colon + 1 + pl, "/")) && (size_t)(colon - rest) < sizeof(host);
    if (ok) {
        const char *h = rest;
        size_t hl = (size_t)(colon - rest);
        if (h[0] == '[' && hl >= 2 && h[hl - 1] == ']') h++, hl -= 2; /* [::1] */
        memcpy(host, h, hl);
        host[hl] = '\0';
        memcpy(port, colon + 1, pl);
        port[pl] = '\0';
        ok = hl > 0 && strspn(port, "0123456789") == pl;
    }
    if (!ok) {
        fy_error("supervise: %s: health URL '%s': expected http://HOST:PORT or tcp://HOST:PORT", k->name, url);
        return FY_ERR_INVALID;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *ai;
    int rv = getaddrinfo(host, port, &hints, &ai);
    if (rv) {
        fy_error("supervise: %s: health URL '%s': %s", k->name, url, gai_strerror(rv));
        return FY_ERR_INVALID;
    }
    memcpy(&k->health_addr, ai->ai_addr, ai->ai_addrlen);
    k->health_addr_len = ai->ai_addrlen;
    freeaddrinfo(ai);
    char *copy = fy_strdup(url);
    if (!copy) {
        fy_error("supervise: %s: out of memory", k->name);
        return FY_ERR_NOMEM;
    }
    size_t ul = strlen(copy);
    if (ul && copy[ul - 1] == '/') copy[ul - 1] = '\0'; /* it is followed by /health */
    fy_free(k->health_url);
    k->health_url = copy;
    snprintf(k->health_host, sizeof(k->health_host), "%.*s", (int)(colon + 1 + pl - rest), rest);
    return FY_OK;
}

fy_status_t fy_sup_set_stop(fy_sup_t *s, int index, int stage, double grace_s)
{
    child_t *k = settable(s, index, "stop order");
    if (!k) return FY_ERR_INVALID;
    if (stage < 0 || stage > 1000 || !(grace_s <= 86400)) {
        fy_error("supervise: %s: stop stage %d, grace %g s: need 0 <= stage <= 1000, grace <= 1 day", k->name, stage,
                 grace_s);
        return FY_ERR_INVALID;
    }
    k->stop_stage = stage;
    k->stop_grace_s = grace_s < 0 ? -1 : grace_s;
    return FY_OK;
}

fy_status_t fy_sup_start(fy_sup_t *s)
{
    for (int i = 0; i < s->n; i++) {
        child_t *k = &s->kids[i];
        if (running(k)) continue;
        /* a fresh start forgives earlier crashes */
        k->ring_n = k->ring_next = 0;
        k->delay = 0;
        k->ever_ready = false;
        k->state = FY_SUP_DOWN;
        fy_status_t st = spawn(k);
        if (st != FY_OK) {
            if (i > 0) fy_error("supervise: %s could not be started; stopping the others", k->name);
            fy_sup_stop_all(s);
            return st;
        }
    }
    s->essential_failed = s->startup_failed = false;
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
    while (read(s->wake[0], buf, sizeof(buf)) > 0) {}
}

/* Were we (not the children) stopped or starved?  Then a child's silence
 * since its last answer is partly ours: its health clock starts again. */
static void check_own_stall(fy_sup_t *s, double t)
{
    if (s->p.health_timeout_s <= 0 || !isfinite(s->planned_wake)) return;
    double late = t - s->planned_wake;
    if (late <= s->p.health_timeout_s / 2) return;
    fy_warn("supervise: this process was stopped or starved for %.1f s; not holding it against the children", late);
    for (int i = 0; i < s->n; i++) {
        child_t *k = &s->kids[i];
        if (k->last_alive < t) k->last_alive = t;
        if (k->state == FY_SUP_STARTING) k->started_at += late;
        probe_close(k);
        k->next_probe = t;
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
    double next_cb = fy_now_s() + poll_s;
    s->planned_wake = INFINITY;
    while (!atomic_load(&s->stop)) {
        double t = fy_now_s();
        check_own_stall(s, t);
        for (int i = 0; i < s->n; i++) {
            child_t *k = &s->kids[i];
            int status;
            if (!running(k) || !reap(k, &status)) continue;
            if (atomic_load(&s->stop)) { /* e.g. the whole service got SIGTERM at once: no restart */
                char how[96];
                describe_exit(status, how, sizeof(how));
                fy_info("supervise: %s (pid %d) %s while stopping", k->name, (int)k->pid, how);
                k->pid = 0;
                k->state = FY_SUP_DOWN;
                continue;
            }
            on_exit_unasked(s, k, status, t);
        }
        if (s->essential_failed || s->startup_failed) {
            result = FY_ERR_PEER;
            break;
        }
        watch_children(s, t);
        for (int i = 0; i < s->n; i++) {
            child_t *k = &s->kids[i];
            if (k->state == FY_SUP_BACKOFF && k->restart_at <= t) restart(s, k, t);
        }
        if (s->essential_failed || s->startup_failed) { /* a restart that could not exec */
            result = FY_ERR_PEER;
            break;
        }
        if (poll_cb && t >= next_cb) {
            /* a callback that takes long counts as our stall: one that
             * blocks for less than health_timeout_s / 2 does no harm */
            s->planned_wake = t;
            poll_cb(arg, s);
            next_cb = fy_now_s() + poll_s;
            continue; /* it may have asked us to stop */
        }
        double wake_at = poll_cb ? next_cb : INFINITY;
        int nfds = 0;
        s->pfds[nfds++] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
        for (int i = 0; i < s->n; i++) {
            child_t *k = &s->kids[i];
            if (k->state == FY_SUP_BACKOFF && k->restart_at < wake_at) wake_at = k->restart_at;
            if (!running(k)) continue;
            if (k->pidfd >= 0)
                s->pfds[nfds++] = (struct pollfd){.fd = k->pidfd, .events = POLLIN};
            else if (t + SUP_BLIND_TICK_S < wake_at)
                wake_at = t + SUP_BLIND_TICK_S;
            if (k->hung) continue; /* its exit is all we wait for */
            if (k->state == FY_SUP_STARTING) {
                if (k->ready_fd >= 0) s->pfds[nfds++] = (struct pollfd){.fd = k->ready_fd, .events = POLLIN};
                double dl = k->started_at + s->p.start_timeout_s;
                if (s->p.start_timeout_s > 0 && dl < wake_at) wake_at = dl;
                continue;
            }
            if (!k->health_url || s->p.health_timeout_s <= 0) continue;
            double dl = k->last_alive + health_timeout(s, k);
            if (k->probe_fd >= 0) {
                s->pfds[nfds++] = (struct pollfd){.fd = k->probe_fd, .events = k->probe_sent ? POLLIN : POLLOUT};
                if (k->probe_started + probe_timeout(s) < dl) dl = k->probe_started + probe_timeout(s);
            } else if (k->next_probe < dl) {
                dl = k->next_probe;
            }
            if (dl < wake_at) wake_at = dl;
        }
        /* deadlines are checked with a strict >: wake just past them */
        if (isfinite(wake_at)) wake_at += 1e-3;
        s->planned_wake = wake_at;
        if (poll(s->pfds, (nfds_t)nfds, timeout_ms(wake_at, t)) < 0 && errno != EINTR) {
            fy_error("supervise: poll: %m");
            result = FY_ERR_IO;
            break;
        }
        drain_wake(s);
    }
    s->planned_wake = INFINITY;
    fy_sup_stop_all(s);
    return result;
}

/* Reaps whichever running children exit before deadline; returns how many
 * of stage (-1: any) still run.  With requests >= 0, a stop request beyond
 * that many ends the wait early (Ctrl-C pressed again during the grace
 * period). */
static int wait_exits(fy_sup_t *s, double deadline, int requests, int stage)
{
    for (;;) {
        int live = 0, nfds = 0;
        bool blind = false;
        if (requests >= 0) s->pfds[nfds++] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
        for (int i = 0; i < s->n; i++) {
            child_t *k = &s->kids[i];
            int status;
            if (!running(k)) continue;
            if (reap(k, &status)) {
                char how[96];
                describe_exit(status, how, sizeof(how));
                fy_info("supervise: stopped %s (pid %d): %s", k->name, (int)k->pid, how);
                k->pid = 0;
                k->state = FY_SUP_DOWN;
                continue;
            }
            if (stage < 0 || k->stop_stage == stage) live++;
            if (k->pidfd >= 0)
                s->pfds[nfds++] = (struct pollfd){.fd = k->pidfd, .events = POLLIN};
            else
                blind = true;
        }
        double t = fy_now_s();
        if (!live || t >= deadline) return live;
        if (requests >= 0 && atomic_load(&s->stop) > requests) return live;
        double until = blind && t + SUP_BLIND_TICK_S < deadline ? t + SUP_BLIND_TICK_S : deadline;
        if (poll(s->pfds, (nfds_t)nfds, timeout_ms(until, t)) < 0 && errno != EINTR) {
            fy_error("supervise: poll: %m");
            return live;
        }
        if (requests >= 0) drain_wake(s);
    }
}

static double grace_of(const fy_sup_t *s, const child_t *k)
{
    return k->stop_grace_s >= 0 ? k->stop_grace_s : s->p.stop_grace_s;
}

/* SIGKILL to every running child of stage (-1: all) and the wait for
 * them; those that outlive even that are logged and let go. */
static void kill_stage(fy_sup_t *s, int stage)
{
    bool any = false;
    for (int i = s->n - 1; i >= 0; i--) {
        child_t *k = &s->kids[i];
        if (!running(k) || (stage >= 0 && k->stop_stage != stage)) continue;
        signal_child(k, SIGKILL);
        any = true;
    }
    if (!any || wait_exits(s, fy_now_s() + SUP_KILL_WAIT_S, -1, stage) == 0) return;
    for (int i = 0; i < s->n; i++) {
        child_t *k = &s->kids[i];
        if (!running(k) || (stage >= 0 && k->stop_stage != stage)) continue;
        /* stuck in the kernel; waiting longer would hang the shutdown */
        fy_error("supervise: %s (pid %d) did not die of SIGKILL within %g s; leaving it", k->name, (int)k->pid,
                 SUP_KILL_WAIT_S);
        if (k->pidfd >= 0) close(k->pidfd);
        k->pidfd = -1;
        probe_close(k);
        if (k->ready_fd >= 0) close(k->ready_fd);
        k->ready_fd = -1;
        k->pid = 0;
        k->state = FY_SUP_DOWN;
    }
}

void fy_sup_stop_all(fy_sup_t *s)
{
    if (!s) return;
    int requests = atomic_load(&s->stop);
    s->started = false;
    for (int i = 0; i < s->n; i++) {
        child_t *k = &s->kids[i];
        if (k->state == FY_SUP_BACKOFF) k->state = FY_SUP_DOWN;
        probe_close(k);
    }
    bool cut = false; /* asked again: no more grace for anyone */
    for (int stage = -1;;) {
        /* the lowest stage above the last one that still has children running */
        int next = INT_MAX;
        for (int i = 0; i < s->n; i++)
            if (running(&s->kids[i]) && s->kids[i].stop_stage > stage && s->kids[i].stop_stage < next)
                next = s->kids[i].stop_stage;
        if (next == INT_MAX) return;
        stage = next;
        if (cut) {
            kill_stage(s, stage);
            continue;
        }
        double grace = 0;
        for (int i = s->n - 1; i >= 0; i--) {
            child_t *k = &s->kids[i];
            if (!running(k) || k->stop_stage != stage) continue;
            signal_child(k, SIGTERM);
            signal_child(k, SIGCONT); /* a stopped child (SIGTTOU, SIGSTOP) would sit on its SIGTERM */
            if (grace_of(s, k) > grace) grace = grace_of(s, k);
        }
        if (wait_exits(s, fy_now_s() + grace, requests, stage) == 0) continue;
        if (atomic_load(&s->stop) > requests) {
            fy_warn("supervise: asked again to stop: not waiting out the grace period");
            cut = true;
        }
        for (int i = s->n - 1; i >= 0; i--) {
            child_t *k = &s->kids[i];
            if (!running(k) || k->stop_stage != stage) continue;
            if (!cut)
                fy_warn("supervise: %s (pid %d) did not stop within %g s of SIGTERM; sending SIGKILL", k->name,
                        (int)k->pid, grace_of(s, k));
            else
                fy_warn("supervise: %s (pid %d): sending SIGKILL", k->name, (int)k->pid);
        }
        kill_stage(s, stage);
    }
}

static const child_t *kid(const fy_sup_t *s, int index) { return index >= 0 && index < s->n ? &s->kids[index] : NULL; }

pid_t fy_sup_pid(const fy_sup_t *s, int index)
{
    const child_t *k = kid(s, index);
    return k && running(k) ? k->pid : 0;
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

const char *fy_sup_state_str(fy_sup_state_t st)
{
    switch (st) {
    case FY_SUP_DOWN: return "down";
    case FY_SUP_STARTING: return "starting";
    case FY_SUP_RUNNING: return "running";
    case FY_SUP_BACKOFF: return "backoff";
    case FY_SUP_FAILED: return "failed";
    }
    return "?";
}

void fy_sup_info(const fy_sup_t *s, int index, fy_sup_info_t *info)
{
    memset(info, 0, sizeof(*info));
    const child_t *k = kid(s, index);
    if (!k) {
        info->name = "";
        return;
    }
    double t = fy_now_s();
    info->name = k->name;
    info->state = k->state;
    info->pid = running(k) ? k->pid : 0;
    info->restarts = k->restarts;
    info->health_kills = k->hang_kills;
    info->up_s = running(k) ? t - k->started_at : 0;
    info->restart_in_s = k->state == FY_SUP_BACKOFF && k->restart_at > t ? k->restart_at - t : 0;
    snprintf(info->last_exit, sizeof(info->last_exit), "%s", k->last_exit);
}

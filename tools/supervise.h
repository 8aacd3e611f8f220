/*
 * supervise.h - starts child processes, restarts the ones that crash, and
 * stops them all in order: the generic half of `ferry serve`, which knows
 * nothing of routers or workers.
 *
 * Lifetime.  Children never outlive the supervisor: each one asks the
 * kernel for SIGKILL when its parent dies (PR_SET_PDEATHSIG, checked
 * against a parent that died before the request), so even a SIGKILLed
 * supervisor leaves no orphans.  The kernel ties that signal to the
 * *thread* that forked, so call fy_sup_start and fy_sup_run from a thread
 * that lives as long as the children should (the main thread).  What a
 * child forks is not covered by it: a SIGKILLed supervisor leaves those
 * grandchildren running (a live one kills them: see process groups below).
 *
 * Ctrl-C.  Each child runs in its own process group.  A terminal sends
 * SIGINT (and SIGQUIT, SIGTSTP) to its foreground process group only, so
 * Ctrl-C reaches the supervisor alone; its handler calls
 * fy_sup_request_stop and the run loop stops the children itself: SIGTERM
 * to every child (stage by stage: see Stop order), a grace period,
 * SIGKILL for whatever is left, and every one reaped.  (Ctrl-Z likewise
 * stops the supervisor only; the children run on.)  Were the children in
 * the supervisor's group, each would get the SIGINT too and die at once in
 * no particular order while the supervisor restarted them.  Ignoring SIGINT
 * in the children is no answer: SIG_IGN survives exec, and a child that
 * installs its own SIGINT handler would still get it.  The cost of separate
 * groups: a child is a background job on the terminal, so it must not read
 * it (stdin is /dev/null) and, with `stty tostop`, writing to it stops the
 * child; give such children a log_path.  A child's process group is also
 * the unit we signal: stopping sends SIGTERM to the group, and once a child
 * has exited (stopped or crashed) whatever is left in its group is
 * SIGKILLed, so helpers it forked neither linger as orphans nor hold on to
 * what its restart needs.
 *
 * Exec.  A child starts with default signal dispositions (but for the two
 * that glibc reserves, which sigaction cannot touch) and an empty signal
 * mask, stdin from /dev/null, stdout and stderr inherited or appended to
 * its log file, and no other descriptor of the supervisor (all are marked
 * close-on-exec).  argv[0] without a '/' is looked up in
 * PATH.  Whether exec worked is known before fy_sup_start returns: the
 * child reports a failed exec through a close-on-exec pipe.
 *
 * Events.  The run loop sleeps in poll(2) on one pidfd per child (readable
 * when it exits), the readiness pipes and health probes below, and a
 * self-pipe that fy_sup_request_stop writes; it reaps with
 * waitpid(pid, WNOHANG), and wakes for nothing else but deadlines
 * (restarts, probes, start-up) and the caller's poll callback.  (On kernels before 5.3, with
 * no pidfd_open, it checks the children every 100 ms instead.)  Only the
 * children's own pids are waited for, so other children of the process are
 * left alone; do not reap with waitpid(-1) elsewhere, and leave SIGCHLD
 * at its default (SIG_IGN makes the kernel reap them before us, and their
 * exit status is lost).
 *
 * Readiness (fy_sup_set_ready).  A child may report that it is ready to
 * serve: it inherits the write end of a pipe, named by an environment
 * variable (FERRY_READY_FD=5), and writes "ready\n" on it once every
 * listener it has is bound (common/cluster.h, fy_cluster_notify_ready).
 * Until then it is FY_SUP_STARTING: not probed for liveness, however long
 * it takes to load.  Only the child we started holds that pipe, so a
 * "ready" proves that *our* process bound its ports, where a port that
 * answers might belong to anyone (another cluster left running).  A child
 * that exits, or is not ready within start_timeout_s, before its first
 * readiness since fy_sup_start is a start-up failure: with fatal_startup
 * the supervisor stops everything and fy_sup_run returns FY_ERR_PEER (a
 * configuration error would fail the same way on every restart); without
 * it, or for a child that was ready once, it counts as a crash.
 *
 * Liveness (fy_sup_set_health).  A child alive as a process can still be
 * wedged (threads deadlocked, SIGSTOPped).  With health_timeout_s > 0 and
 * a health URL, the run loop sends GET /health to a ready child every
 * health_interval_s (non-blocking sockets in the same poll(2), one probe
 * in flight per child, each abandoned after max(interval, timeout / 4));
 * any HTTP answer counts, a 503 included: only silence is a wedge.  A
 * child that has not answered for health_timeout_s is SIGKILLed (its
 * process group) and restarted like a crash.  A child that is stopped for
 * less than that (SIGSTOP, then SIGCONT) answers its pending probe when it
 * resumes and is left alone.  Should the supervisor itself be stopped or
 * starved for health_timeout_s / 2 (Ctrl-Z), every child's clock starts
 * again rather than all of them being killed for the supervisor's own
 * silence.  Children without a health URL are judged by their exit alone.
 *
 * Restarts.  A child that exits for any reason while the supervisor is not
 * stopping it is restarted after restart_backoff_s, doubled after every
 * crash that comes within restart_window_s of the child's start, capped
 * at restart_backoff_max_s; a child that ran for restart_window_s before
 * crashing starts over at restart_backoff_s.  With max_restarts >= 0, a
 * child that has had that many restarts within the window stays down
 * (FY_SUP_FAILED); if it is essential the supervisor then stops
 * everything and fy_sup_run returns FY_ERR_PEER.  The default is no
 * limit: it keeps trying, at most restart_backoff_max_s apart.
 *
 * Its last words.  With log_echo_mark set, a child with a log file that
 * exits with a non-zero status (or fails at start-up) has the last lines
 * holding that mark that it wrote since it started (its error lines)
 * repeated in the supervisor's own log, so they reach the operator's
 * terminal and not only the file.
 *
 * Stop order (fy_sup_set_stop).  Children stop in stages, lowest first:
 * every child of a stage gets SIGTERM, the stage waits up to the longest
 * grace of its children, SIGKILL for what is left, and only then does the
 * next stage begin.  (`ferry serve` stops the router first, giving it its
 * drain time, then the workers its requests were running on.)
 *
 * Threads.  fy_sup_request_stop is async-signal-safe and may be called from
 * any thread or signal handler; everything else belongs to one thread.
 */
#ifndef FY_SUPERVISE_H
#define FY_SUPERVISE_H

#include <stdbool.h>
#include <sys/types.h>

#include "common/status.h"

typedef struct fy_sup fy_sup_t;

typedef struct fy_sup_params {
    double restart_backoff_s;     /* first delay before restarting a crashed child (default 0.5) */
    double restart_backoff_max_s; /* the doubling stops here (default 30) */
    int max_restarts;             /* within restart_window_s (default -1: no limit); 0: never restart */
    double restart_window_s;      /* default 60 */
    double stop_grace_s;          /* SIGTERM, then SIGKILL after this (default 10); fy_sup_set_stop per child */
    double health_timeout_s;      /* silence on /health before a SIGKILL (default 10); 0: no probes */
    double health_interval_s;     /* between probes of one child (default 1) */
    double start_timeout_s;       /* a child with a ready pipe must be ready within this (default 0: no limit) */
    bool fatal_startup;           /* a start-up failure stops everything (default false) */
    const char *log_echo_mark;    /* log lines holding this are echoed on a failure (default NULL: none) */
} fy_sup_params_t;

void fy_sup_params_default(fy_sup_params_t *p);

/* FY_ERR_INVALID (logged) for parameters out of range, FY_ERR_NOMEM,
 * FY_ERR_IO (the self-pipe). */
fy_status_t fy_sup_create(const fy_sup_params_t *p, fy_sup_t **s_p);
/* Stops every child first (fy_sup_stop_all); accepts NULL. */
void fy_sup_destroy(fy_sup_t *s);

/* Adds a child, not yet started.  name (at most 63 bytes) appears in every
 * line about it.  argv is NULL-terminated and copied.  log_path NULL:
 * the child inherits stdout and stderr; otherwise both are appended to that
 * file (created 0644).  Only while no child runs (before fy_sup_start or
 * after fy_sup_stop_all).  *index_p (may be NULL) numbers children from 0
 * in the order added.  FY_ERR_INVALID (logged) or FY_ERR_NOMEM. */
fy_status_t fy_sup_add(fy_sup_t *s, const char *name, char *const argv[], const char *log_path, bool essential,
                       int *index_p);

/* Options of a child added by fy_sup_add; only while it does not run.
 * Each is FY_ERR_INVALID (logged) for a bad index or value, FY_ERR_NOMEM. */

/* The child reports readiness on a pipe whose descriptor number is in its
 * environment as env_name (a valid variable name); see Readiness. */
fy_status_t fy_sup_set_ready(fy_sup_t *s, int index, const char *env_name);
/* Probe url's GET /health for liveness (http://HOST:PORT or
 * tcp://HOST:PORT; HOST resolved now); see Liveness.  NULL: no probe. */
fy_status_t fy_sup_set_health(fy_sup_t *s, int index, const char *url);
/* This child's silence on /health before a SIGKILL (> 0), instead of
 * health_timeout_s (0: that one again); probes only with health_timeout_s > 0. */
fy_status_t fy_sup_set_health_timeout(fy_sup_t *s, int index, double timeout_s);
/* Stop stage (default 0) and grace period (< 0: stop_grace_s); see Stop
 * order. */
fy_status_t fy_sup_set_stop(fy_sup_t *s, int index, int stage, double grace_s);

/* Spawns every child that is not running, in the order added.  All or
 * nothing: when one cannot be started (its binary is missing or not
 * executable, its log file cannot be opened), the error names it and its
 * cause, the ones already started are stopped again, and the result is
 * FY_ERR_NOT_FOUND (no such binary) or FY_ERR_IO. */
fy_status_t fy_sup_start(fy_sup_t *s);

/* Supervises until fy_sup_request_stop, an essential child gives up or a
 * start-up fails (with fatal_startup):
 * reaps children and reports each exit ("prefill-1 (pid 123) killed by
 * signal 9 (SIGKILL); restarting in 0.5 s"), restarts them with backoff,
 * and calls poll_cb (may be NULL) about every poll_s seconds, first poll_s
 * after the call.  poll_cb may call fy_sup_request_stop and the read-only
 * functions below, nothing else of s.  Before returning it stops every
 * child (fy_sup_stop_all).  FY_OK after a requested stop, FY_ERR_PEER when
 * an essential child gave up or a start-up failed, FY_ERR_INVALID for a
 * bad poll_s or when not started. */
fy_status_t fy_sup_run(fy_sup_t *s, void (*poll_cb)(void *arg, fy_sup_t *s), void *arg, double poll_s);

/* Makes fy_sup_run stop everything and return.  Async-signal-safe: meant
 * for SIGINT and SIGTERM handlers.  A further request while the children
 * are being stopped cuts the grace period short (SIGKILL now): Ctrl-C
 * twice.  Requests stick: a later fy_sup_run on the same supervisor
 * returns at once (after stopping the children). */
void fy_sup_request_stop(fy_sup_t *s);

/* Stage by stage (lowest first): SIGTERM (and SIGCONT, for a stopped one)
 * to the process group of each running child of the stage, in reverse
 * order of adding, up to the stage's grace period for all of them to exit,
 * SIGKILL to the rest; every one reaped: no zombies, no orphans.  A stop
 * request arriving during a grace period ends it, and the later stages get
 * SIGKILL at once (Ctrl-C twice).  Pending restarts are cancelled.  A child that does not die even of SIGKILL within 5 s (stuck
 * in the kernel) is logged and left unreaped rather than hanging us. */
void fy_sup_stop_all(fy_sup_t *s);

typedef enum fy_sup_state {
    FY_SUP_DOWN = 0, /* not started, or stopped */
    FY_SUP_STARTING, /* running, and not yet ready (a child with a ready pipe) */
    FY_SUP_RUNNING,  /* running (and ready, for a child with a ready pipe) */
    FY_SUP_BACKOFF,  /* crashed; waiting to restart */
    FY_SUP_FAILED,   /* crashed past max_restarts, or failed at start-up; stays down */
} fy_sup_state_t;

/* "down", "starting", "running", "backoff", "failed". */
const char *fy_sup_state_str(fy_sup_state_t st);

/* One child, as the run loop last saw it. */
typedef struct fy_sup_info {
    const char *name; /* lives as long as the supervisor */
    fy_sup_state_t state;
    pid_t pid;           /* while STARTING or RUNNING, else 0 */
    int restarts;        /* since it was added */
    int health_kills;    /* SIGKILLs for a silent /health (or a start past start_timeout_s) */
    double up_s;         /* since its latest start, while it runs */
    double restart_in_s; /* while BACKOFF */
    char last_exit[128]; /* how it last ended unasked ("killed by signal 9 (SIGKILL)"), or "" */
} fy_sup_info_t;

/* The child's pid while it runs (STARTING or RUNNING), else 0. */
pid_t fy_sup_pid(const fy_sup_t *s, int index);
/* How many times the child has been restarted since it was added. */
int fy_sup_restarts(const fy_sup_t *s, int index);
fy_sup_state_t fy_sup_state(const fy_sup_t *s, int index);
int fy_sup_count(const fy_sup_t *s);
/* Everything above about one child; a zeroed info (name "") for a bad
 * index. */
void fy_sup_info(const fy_sup_t *s, int index, fy_sup_info_t *info);

#endif /* FY_SUPERVISE_H */

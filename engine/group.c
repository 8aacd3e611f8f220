/*
 * group.c - the rank group on the CPU: processes forked by rank 0 that
 * share one anonymous MAP_SHARED segment, and the collectives over it.
 *
 * The segment: a header (magic, sizes, pids, the breakage word and its
 * reason, the command sequence, one cache line per rank with its futex
 * word and its fy_group_done status, and a matrix of pair counters), then
 * the command area, then one slot per rank.
 *
 * Synchronisation is by pair counters: arrive[r][q] counts the steps rank
 * r has posted towards rank q, with a 32-bit tag naming the step (the
 * collective, its ranks and its size).  Any two ranks take part in the
 * same sequence of collectives (group.h), so a rank waits for a peer by
 * waiting until the peer's counter towards it reaches its own; disjoint
 * subgroups touch disjoint counters and never wait on each other.  Equal
 * counters with different tags mean two ranks called different
 * collectives: the group breaks instead of reducing garbage.  A rank's
 * slot may be written again only once every peer has posted as many steps
 * to it as it has to them (the last step of a collective is "done
 * reading"), which replaces a closing barrier.
 *
 * Waits spin briefly (0.25-20 us, adapting to whether spinning pays),
 * then sleep on the rank's futex word
 * (shared, not FUTEX_PRIVATE: the word is in another process's mapping
 * too) for at most GRP_NAP_MS, so that rank 0 can reap dead children and
 * the others can see rank 0 gone; whoever posts a step to a sleeping rank
 * bumps its word and wakes it.
 *
 * Not here: what the ranks compute (runner.c), threads (a rank calls its
 * group from one thread at a time).
 */
#include "engine/group.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"

enum {
    GRP_MAX_RANKS = 64,
    GRP_LINE = 64,
    GRP_REASON = 160,
    GRP_NAP_MS = 50,       /* the longest futex sleep in a timed wait: the dead-peer check period */
    GRP_IDLE_NAP_MS = 100, /* the same in fy_group_wait_cmd */
};

#define GRP_MAGIC 0x6665727279677270ull      /* "ferrygrp" */
#define GRP_MAX_AREA ((size_t)1 << 30)       /* slot_bytes, cmd_bytes: at most 1 GiB each */
#define GRP_SMALL_REDUCE ((size_t)64 * 1024) /* up to this many bytes every rank sums the whole vector */
/* The spin before sleeping adapts between these: it doubles when a spin
 * saw the wait end and halves when the rank had to sleep.  On cores of
 * its own a peer posts within microseconds and the spin saves a futex
 * round trip; on cores shared with the peer (or busy with other work) the
 * peer cannot post while this rank spins, and every spun microsecond adds
 * to the latency (bench-group: a 2-rank barrier took spin + 5 us). */
#define GRP_SPIN_MIN_NS 250
#define GRP_SPIN_MAX_NS 20000
#define GRP_SPIN_MAX_NS_CROWDED 2000 /* ranks > CPUs */
#define GRP_DEFAULT_TIMEOUT_MS 30000

/* the kinds of step, in the tags of the pair counters */
enum { STEP_BARRIER = 1, STEP_AR_IN, STEP_AR_SUM, STEP_AR_DONE, STEP_P2P, STEP_AG_IN, STEP_AG_DONE };

typedef struct grp_rank {
    _Atomic uint32_t wake;     /* futex word: bumped by whoever may unblock this rank */
    _Atomic uint32_t sleeping; /* 1 while this rank is in (or about to enter) FUTEX_WAIT */
    _Atomic uint64_t cmd_done; /* the last command this rank called fy_group_done for */
    _Atomic int32_t status;    /* its status then */
    _Atomic int32_t pid;
} __attribute__((aligned(GRP_LINE))) grp_rank_t;

typedef struct grp_hdr {
    uint64_t magic;
    int32_t n_ranks;
    int32_t timeout_ms;
    size_t slot_bytes, cmd_bytes;
    size_t off_cmd, off_slots, slot_stride, total;

    _Atomic uint32_t broken;       /* 0; 1 once some rank broke the group */
    _Atomic uint32_t broken_ready; /* 1 once broken_rank and reason are written */
    int32_t broken_rank;
    char reason[GRP_REASON];
    _Atomic uint32_t leave; /* rank 0 is destroying the group */

    _Atomic uint64_t cmd_seq; /* commands posted */
    _Atomic uint64_t cmd_len;

    grp_rank_t ranks[GRP_MAX_RANKS];
    /* [from][to]: (steps << 32) | tag of the last step; row r written by rank r only */
    _Atomic uint64_t arrive[GRP_MAX_RANKS][GRP_MAX_RANKS] __attribute__((aligned(GRP_LINE)));
} grp_hdr_t;

struct fy_group {
    grp_hdr_t *h; /* the shared segment */
    size_t map_bytes;
    int32_t rank, n;
    int32_t timeout_ms;
    int64_t spin_ns, spin_max_ns; /* the spin now, and its ceiling */
    pid_t parent;                 /* followers: rank 0's pid */
    uint64_t cmd_seen;            /* followers: the last command received */
    bool cmd_open;                /* rank 0: a command posted and not yet done */
    bool peer_logged;             /* this process has logged the breakage */
    bool reaped[GRP_MAX_RANKS];
    pid_t pids[GRP_MAX_RANKS]; /* rank 0's children */
};

/* ---- futex ------------------------------------------------------------------ */

static void futex_wait(_Atomic uint32_t *word, uint32_t val, int64_t ns)
{
    struct timespec ts = {.tv_sec = ns / 1000000000, .tv_nsec = ns % 1000000000};
    /* EAGAIN (the word moved), EINTR and ETIMEDOUT all mean: look again */
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void wake_rank(grp_hdr_t *h, int32_t q)
{
    grp_rank_t *r = &h->ranks[q];
    /* seq_cst against the waiter's sleeping = 1 then re-check: either it sees
     * our counter or we see it asleep */
    if (atomic_load(&r->sleeping)) {
        atomic_fetch_add(&r->wake, 1);
        futex_wake(&r->wake);
    }
}

static void wake_all(grp_hdr_t *h)
{
    for (int32_t q = 0; q < h->n_ranks; q++) {
        atomic_fetch_add(&h->ranks[q].wake, 1);
        futex_wake(&h->ranks[q].wake);
    }
}

/* ---- the segment's areas ------------------------------------------------------ */

static char *slot_of(const fy_group_t *g, int32_t r)
{
    return (char *)g->h + g->h->off_slots + (size_t)r * g->h->slot_stride;
}
static char *cmd_area(const fy_group_t *g) { return (char *)g->h + g->h->off_cmd; }

/* ---- breakage ------------------------------------------------------------------ */

/* Breaks the group once (the first caller's rank and reason stand);
 * true for that first caller. */
static bool grp_break(fy_group_t *g, int32_t rank, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool grp_break(fy_group_t *g, int32_t rank, const char *fmt, ...)
{
    grp_hdr_t *h = g->h;
    uint32_t zero = 0;
    bool first = atomic_compare_exchange_strong(&h->broken, &zero, 1);
    if (first) {
        va_list ap;
        va_start(ap, fmt);
        h->broken_rank = rank;
        vsnprintf(h->reason, sizeof(h->reason), fmt, ap);
        va_end(ap);
        atomic_store(&h->broken_ready, 1);
    }
    wake_all(h);
    return first;
}

typedef struct grp_want grp_want_t;
static void grp_check_peers(fy_group_t *g, const grp_want_t *w, int32_t lag);

/* The status of a call that finds the group broken: logs once per process. */
static fy_status_t grp_peer(fy_group_t *g)
{
    grp_hdr_t *h = g->h;
    if (!g->peer_logged) {
        g->peer_logged = true;
        /* rank 0 says how its dead children died, whoever saw them first */
        if (g->rank == 0) grp_check_peers(g, NULL, -1);
        /* the breaker writes the reason right after its flag; a breaker
         * killed in between leaves it unwritten */
        int64_t until = (int64_t)fy_now_ns() + 10 * 1000000;
        while (!atomic_load(&h->broken_ready) && (int64_t)fy_now_ns() < until) cpu_relax();
        if (atomic_load(&h->broken_ready))
            fy_error("group: rank %d: the group is broken: %s", (int)g->rank, h->reason);
        else
            fy_error("group: rank %d: the group is broken (no reason recorded)", (int)g->rank);
    }
    return FY_ERR_PEER;
}

/* FY_OK, or why a call must not go on: the group broken, or rank 0 leaving. */
static fy_status_t grp_state(fy_group_t *g)
{
    if (atomic_load_explicit(&g->h->broken, memory_order_acquire)) return grp_peer(g);
    if (g->rank != 0 && atomic_load_explicit(&g->h->leave, memory_order_acquire)) return FY_ERR_CANCELLED;
    return FY_OK;
}

static void describe_exit(int st, char *buf, size_t size)
{
    if (WIFSIGNALED(st))
        snprintf(buf, size, "killed by signal %d", WTERMSIG(st));
    else if (WIFEXITED(st))
        snprintf(buf, size, "exited with status %d", WEXITSTATUS(st));
    else
        snprintf(buf, size, "ended (wait status 0x%x)", st);
}

/* A rank that is not this process's child is dead when it is gone or a
 * zombie (its parent, rank 0, has not reaped it yet). */
static bool pid_dead(pid_t pid)
{
    if (pid <= 0) return false;
    if (kill(pid, 0) < 0 && errno == ESRCH) return true;
    char path[48], buf[256];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return errno == ENOENT;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *paren = strrchr(buf, ')'); /* the name may hold spaces and parentheses */
    return paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}

static int want_ready(fy_group_t *g, const grp_want_t *w, int32_t *lag_p);

/* Rank 0 reaps children that died; the others look for rank 0 gone, and
 * for the sibling lag that w waits for dead.  Breaks the group on what it
 * finds. */
static void grp_check_peers(fy_group_t *g, const grp_want_t *w, int32_t lag)
{
    if (g->rank == 0) {
        for (int32_t q = 1; q < g->n; q++) {
            if (g->reaped[q]) continue;
            int st = 0;
            pid_t r = waitpid(g->pids[q], &st, WNOHANG);
            if (r == g->pids[q]) {
                g->reaped[q] = true;
                char why[64];
                describe_exit(st, why, sizeof(why));
                if (!grp_break(g, q, "rank %d (pid %d) died: %s", (int)q, (int)g->pids[q], why))
                    fy_error("group: rank %d (pid %d) died: %s", (int)q, (int)g->pids[q], why);
            } else if (r < 0 && errno == ECHILD) {
                g->reaped[q] = true; /* reaped by someone else's waitpid(-1) */
                grp_break(g, q, "rank %d (pid %d) is gone (reaped elsewhere)", (int)q, (int)g->pids[q]);
            }
        }
    } else if (getppid() != g->parent) {
        grp_break(g, 0, "rank 0 (pid %d) died", (int)g->parent);
    } else if (lag > 0 && lag < g->n && lag != g->rank) {
        pid_t pid = atomic_load(&g->h->ranks[lag].pid);
        /* dead, and still the first rank w waits for (the counters only
         * grow: it did not post before it went) */
        int32_t now_lag = -1;
        if (pid_dead(pid) && w && want_ready(g, w, &now_lag) == 0 && now_lag == lag)
            grp_break(g, lag, "rank %d (pid %d) died", (int)lag, (int)pid);
    }
}

/* ---- pair counters ------------------------------------------------------------- */

static uint32_t step_tag(uint32_t kind, int32_t a, int32_t b, uint64_t size)
{
    /* FNV-1a over the step's description; 0 is the tag of "no step yet" */
    uint64_t v[4] = {kind, (uint64_t)(uint32_t)a, (uint64_t)(uint32_t)b, size};
    uint32_t hsh = 2166136261u;
    for (int i = 0; i < 4; i++)
        for (int k = 0; k < 8; k++) hsh = (hsh ^ (uint8_t)(v[i] >> (8 * k))) * 16777619u;
    return hsh ? hsh : 1;
}

static inline uint32_t ctr_steps(uint64_t w) { return (uint32_t)(w >> 32); }
static inline uint32_t ctr_tag(uint64_t w) { return (uint32_t)w; }

/* Posts one step tagged tag to every rank of [lo, hi) but this one, and
 * wakes those asleep. */
static void post_step(fy_group_t *g, int32_t lo, int32_t hi, uint32_t tag)
{
    grp_hdr_t *h = g->h;
    int32_t me = g->rank;
    for (int32_t q = lo; q < hi; q++) {
        if (q == me) continue;
        uint64_t w = atomic_load_explicit(&h->arrive[me][q], memory_order_relaxed);
        atomic_store(&h->arrive[me][q], ((uint64_t)(ctr_steps(w) + 1) << 32) | tag);
    }
    for (int32_t q = lo; q < hi; q++)
        if (q != me) wake_rank(h, q);
}

/* What a wait waits for. */
struct grp_want {
    int32_t lo, hi; /* the peers [lo, hi), this rank left out */
    uint32_t ahead; /* 0: each peer has posted as many steps to me as I to it; 1: one more */
    uint32_t tag;   /* ahead 1: the tag that step must carry */
    bool cmd;       /* instead: rank 0 waits for every follower's fy_group_done */
    bool idle;      /* instead: a follower waits for a command (no timeout) */
};

/* 1: the wait is over; 0: not yet (*lag_p: a rank it waits for);
 * -1: two ranks disagree on the step (the group is broken). */
static int want_ready(fy_group_t *g, const grp_want_t *w, int32_t *lag_p)
{
    grp_hdr_t *h = g->h;
    int32_t me = g->rank;
    if (w->idle) return atomic_load(&h->cmd_seq) != g->cmd_seen || atomic_load(&h->leave) ? 1 : (*lag_p = 0, 0);
    if (w->cmd) {
        uint64_t seq = atomic_load(&h->cmd_seq);
        for (int32_t q = 1; q < g->n; q++)
            if (atomic_load(&h->ranks[q].cmd_done) != seq) return *lag_p = q, 0;
        return 1;
    }
    for (int32_t q = w->lo; q < w->hi; q++) {
        if (q == me) continue;
        uint64_t theirs = atomic_load(&h->arrive[q][me]);
        uint64_t mine = atomic_load_explicit(&h->arrive[me][q], memory_order_relaxed);
        int32_t d = (int32_t)(ctr_steps(theirs) - ctr_steps(mine) - w->ahead);
        if (d < 0) return *lag_p = q, 0;
        if (d == 0) {
            uint32_t want = w->ahead ? w->tag : ctr_tag(mine);
            if (ctr_tag(theirs) != want) {
                grp_break(g, me, "ranks %d and %d called different collectives (or sizes) at the same step", (int)me,
                          (int)q);
                return -1;
            }
        }
    }
    return 1;
}

/* Waits for w: spins briefly, then sleeps on this rank's futex word,
 * checking for dead peers every GRP_NAP_MS and, unless idle, giving up
 * after the group's timeout (the laggard counts as dead). */
static fy_status_t grp_wait(fy_group_t *g, const grp_want_t *w)
{
    grp_hdr_t *h = g->h;
    grp_rank_t *mine = &h->ranks[g->rank];
    int32_t lag = -1;
    fy_status_t st;
    int r;

    /* commands take as long as their work: their waits say nothing
     * about how soon a peer posts */
    bool adapt = !w->idle && !w->cmd;
    int64_t start = (int64_t)fy_now_ns();
    for (uint32_t i = 0;; i++) {
        /* breakage first: once broken, every wait says so; rank 0 leaving
         * only ends waits that would not end otherwise */
        if (atomic_load(&h->broken)) return grp_peer(g);
        if ((r = want_ready(g, w, &lag)) != 0) {
            if (adapt && i > 0) g->spin_ns = FY_MIN(g->spin_max_ns, 2 * g->spin_ns);
            return r > 0 ? FY_OK : FY_ERR_MISMATCH;
        }
        if ((st = grp_state(g)) != FY_OK) return st;
        if ((i & 15) == 15 && (int64_t)fy_now_ns() - start >= g->spin_ns) break;
        cpu_relax();
    }
    if (adapt) g->spin_ns = FY_MAX((int64_t)GRP_SPIN_MIN_NS, g->spin_ns / 2);
    int64_t nap_ns = (int64_t)(w->idle ? GRP_IDLE_NAP_MS : GRP_NAP_MS) * 1000000;
    int64_t deadline = start + (int64_t)g->timeout_ms * 1000000;
    int64_t next_check = start + nap_ns;
    for (;;) {
        atomic_store(&mine->sleeping, 1);
        uint32_t word = atomic_load(&mine->wake);
        r = atomic_load(&h->broken) ? 0 : want_ready(g, w, &lag);
        st = r == 0 ? grp_state(g) : FY_OK;
        if (r != 0 || st != FY_OK) {
            atomic_store(&mine->sleeping, 0);
            if (st != FY_OK) return st;
            return r > 0 ? FY_OK : FY_ERR_MISMATCH;
        }
        /* not ready, just now: a peer that is gone (lag, the one waited
         * for) will never post; one that posted and then left is ready
         * above */
        int64_t now = (int64_t)fy_now_ns();
        if (now >= next_check) {
            grp_check_peers(g, w, lag);
            next_check = now + nap_ns;
            if (atomic_load(&h->broken)) continue;
        }
        if (!w->idle && now >= deadline) {
            pid_t pid = atomic_load(&h->ranks[lag].pid);
            grp_break(g, lag, "rank %d (pid %d) did not arrive within %d ms (stuck)", (int)lag, (int)pid,
                      (int)g->timeout_ms);
            continue;
        }
        int64_t nap = next_check - now;
        if (!w->idle && deadline - now < nap) nap = deadline - now;
        if (nap > 0) futex_wait(&mine->wake, word, nap);
        atomic_store(&mine->sleeping, 0);
    }
}

/* Waits until every rank of [lo, hi) has posted as many steps to this one
 * as it has to them (or, ahead 1, one more tagged tag). */
static fy_status_t wait_peers(fy_group_t *g, int32_t lo, int32_t hi, uint32_t ahead, uint32_t tag)
{
    grp_want_t w = {.lo = lo, .hi = hi, .ahead = ahead, .tag = tag};
    return grp_wait(g, &w);
}

/* Before this rank writes its slot: every peer is done reading it. */
static fy_status_t wait_slot_free(fy_group_t *g) { return wait_peers(g, 0, g->n, 0, 0); }

/* ---- spawn, destroy ------------------------------------------------------------ */

static void kill_and_reap(fy_group_t *g, int32_t upto)
{
    for (int32_t q = 1; q < upto; q++) {
        if (g->reaped[q] || g->pids[q] <= 0) continue;
        kill(g->pids[q], SIGKILL);
        while (waitpid(g->pids[q], NULL, 0) < 0 && errno == EINTR) {}
        g->reaped[q] = true;
    }
}

fy_status_t fy_group_spawn(const fy_group_params_t *p, fy_group_t **g_p, int32_t *rank_p)
{
    if (!p || !g_p || !rank_p) {
        fy_error("group: spawn: %s is NULL", !p ? "params" : !g_p ? "g_p" : "rank_p");
        return FY_ERR_INVALID;
    }
    if (p->n_ranks < 2 || p->n_ranks > GRP_MAX_RANKS) {
        fy_error("group: n_ranks %d is out of range (2..%d)", (int)p->n_ranks, GRP_MAX_RANKS);
        return FY_ERR_INVALID;
    }
    if (p->slot_bytes == 0 || p->slot_bytes > GRP_MAX_AREA) {
        fy_error("group: slot_bytes %zu is out of range (1..%zu)", p->slot_bytes, GRP_MAX_AREA);
        return FY_ERR_INVALID;
    }
    if (p->cmd_bytes == 0 || p->cmd_bytes > GRP_MAX_AREA) {
        fy_error("group: cmd_bytes %zu is out of range (1..%zu)", p->cmd_bytes, GRP_MAX_AREA);
        return FY_ERR_INVALID;
    }
    if (p->timeout_ms < 0) {
        fy_error("group: timeout_ms %d is negative", (int)p->timeout_ms);
        return FY_ERR_INVALID;
    }
    size_t off_cmd = FY_ALIGN_UP(sizeof(grp_hdr_t), (size_t)4096);
    size_t stride = FY_ALIGN_UP(p->slot_bytes, (size_t)4096);
    size_t cmd = FY_ALIGN_UP(p->cmd_bytes, (size_t)4096);
    size_t off_slots, slots, total;
    if (!fy_add_size(off_cmd, cmd, &off_slots) || !fy_mul_size(stride, (size_t)p->n_ranks, &slots) ||
        !fy_add_size(off_slots, slots, &total)) {
        fy_error("group: the segment's size overflows (slot_bytes %zu, %d ranks)", p->slot_bytes, (int)p->n_ranks);
        return FY_ERR_INVALID;
    }

    fy_group_t *g = fy_calloc(1, sizeof(*g));
    if (!g) {
        fy_error("group: out of memory for the handle");
        return FY_ERR_NOMEM;
    }
    void *seg = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (seg == MAP_FAILED) {
        fy_error("group: mmap of a %zu-byte shared segment: %m", total);
        fy_free(g);
        return FY_ERR_NOMEM;
    }
    grp_hdr_t *h = seg; /* fresh anonymous memory is zero: every counter starts at 0 */
    h->magic = GRP_MAGIC;
    h->n_ranks = p->n_ranks;
    h->timeout_ms = p->timeout_ms ? p->timeout_ms : GRP_DEFAULT_TIMEOUT_MS;
    h->slot_bytes = p->slot_bytes;
    h->cmd_bytes = p->cmd_bytes;
    h->off_cmd = off_cmd;
    h->off_slots = off_slots;
    h->slot_stride = stride;
    h->total = total;
    atomic_store(&h->ranks[0].pid, (int32_t)getpid());

    g->h = h;
    g->map_bytes = total;
    g->n = p->n_ranks;
    g->timeout_ms = h->timeout_ms;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    g->spin_max_ns = cpus > 0 && p->n_ranks > cpus ? GRP_SPIN_MAX_NS_CROWDED : GRP_SPIN_MAX_NS;
    g->spin_ns = g->spin_max_ns / 4;
    pid_t parent = getpid();
    g->pids[0] = parent;

    /* children that return through exit() would write the parent's
     * unwritten stdio buffers a second time */
    fflush(stdout);
    fflush(stderr);
    for (int32_t r = 1; r < g->n; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            fy_error("group: fork of rank %d: %m", (int)r);
            atomic_store(&h->leave, 1);
            kill_and_reap(g, r);
            munmap(seg, total);
            fy_free(g);
            return FY_ERR_IO;
        }
        if (pid == 0) {
            /* the child: dies with rank 0 (the check after prctl covers a
             * parent that died before it) */
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            g->rank = r;
            g->parent = parent;
            memset(g->pids, 0, sizeof(g->pids));
            atomic_store(&h->ranks[r].pid, (int32_t)getpid());
            if (getppid() != parent) grp_break(g, 0, "rank 0 (pid %d) died", (int)parent);
            *g_p = g;
            *rank_p = r;
            return FY_OK;
        }
        g->pids[r] = pid;
        atomic_store(&h->ranks[r].pid, (int32_t)pid);
    }
    g->rank = 0;
    g->parent = 0;
    *g_p = g;
    *rank_p = 0;
    return FY_OK;
}

void fy_group_destroy(fy_group_t *g)
{
    if (!g) return;
    grp_hdr_t *h = g->h;
    if (g->rank == 0) {
        atomic_store(&h->leave, 1);
        wake_all(h);
        /* a broken group's followers are on their way out, or stuck */
        int64_t wait_ms = atomic_load(&h->broken) ? FY_MIN(g->timeout_ms, 2000) : g->timeout_ms;
        int64_t deadline = (int64_t)fy_now_ns() + wait_ms * 1000000;
        int64_t nap_us = 200;
        for (;;) {
            bool left = false;
            for (int32_t q = 1; q < g->n; q++) {
                if (g->reaped[q]) continue;
                pid_t r = waitpid(g->pids[q], NULL, WNOHANG);
                if (r == g->pids[q] || (r < 0 && errno == ECHILD))
                    g->reaped[q] = true;
                else
                    left = true;
            }
            if (!left || (int64_t)fy_now_ns() >= deadline) break;
            struct timespec ts = {.tv_sec = 0, .tv_nsec = nap_us * 1000};
            nanosleep(&ts, NULL);
            nap_us = FY_MIN(nap_us * 2, (int64_t)20000);
        }
        for (int32_t q = 1; q < g->n; q++)
            if (!g->reaped[q])
                fy_warn("group: rank %d (pid %d) did not leave in time: killed", (int)q, (int)g->pids[q]);
        kill_and_reap(g, g->n);
    }
    munmap(g->h, g->map_bytes);
    fy_free(g);
}

int32_t fy_group_rank(const fy_group_t *g) { return g->rank; }
int32_t fy_group_size(const fy_group_t *g) { return g->n; }

pid_t fy_group_pid(const fy_group_t *g, int32_t rank)
{
    if (g->rank != 0 || rank < 0 || rank >= g->n) return 0;
    return g->pids[rank];
}

bool fy_group_broken(const fy_group_t *g) { return atomic_load(&g->h->broken) != 0; }

fy_status_t fy_group_poll(fy_group_t *g, char *why, size_t cap)
{
    if (g->rank == 0 && !atomic_load(&g->h->broken)) grp_check_peers(g, NULL, -1);
    if (!atomic_load(&g->h->broken)) return FY_OK;
    grp_peer(g); /* logs the reason once */
    if (why && cap) {
        if (atomic_load(&g->h->broken_ready))
            snprintf(why, cap, "%s", g->h->reason);
        else
            snprintf(why, cap, "rank %d broke the group (no reason recorded)", (int)g->h->broken_rank);
    }
    return FY_ERR_PEER;
}

void fy_group_abort(fy_group_t *g, const char *why)
{
    if (!g) return;
    pid_t pid = getpid();
    grp_break(g, g->rank, "rank %d (pid %d) aborted: %s", (int)g->rank, (int)pid, why ? why : "no reason given");
    g->peer_logged = true; /* the aborting rank knows why */
}

/* ---- collectives ---------------------------------------------------------------- */

fy_status_t fy_group_barrier(fy_group_t *g)
{
    fy_status_t st = grp_state(g);
    if (st != FY_OK) return st;
    uint32_t tag = step_tag(STEP_BARRIER, 0, g->n, 0);
    post_step(g, 0, g->n, tag);
    return wait_peers(g, 0, g->n, 0, 0);
}

/* dst[i] += src[i]: each element on its own, so the order of a sum over
 * ranks is the order of the calls.  Written with vectors because -O2's
 * vectorizer will not version the loop for aliasing. */
static void add_f32(float *restrict dst, const float *restrict src, size_t n)
{
    typedef float v4f __attribute__((vector_size(16)));
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        v4f a[4], b[4];
        memcpy(a, dst + i, sizeof(a));
        memcpy(b, src + i, sizeof(b));
        for (int k = 0; k < 4; k++) a[k] += b[k];
        memcpy(dst + i, a, sizeof(a));
    }
    for (; i < n; i++) dst[i] += src[i];
}

fy_status_t fy_group_allreduce_f32(fy_group_t *g, int32_t first, int32_t count, float *x, size_t n)
{
    if (count < 1 || first < 0 || first > g->n - count || g->rank < first || g->rank >= first + count) {
        fy_error("group: allreduce over ranks %d..%d (count %d) from rank %d: out of range or not its own", (int)first,
                 (int)(first + count - 1), (int)count, (int)g->rank);
        return FY_ERR_INVALID;
    }
    if (n > g->h->slot_bytes / sizeof(float)) {
        fy_error("group: allreduce of %zu floats: more than a slot holds (%zu bytes)", n, g->h->slot_bytes);
        return FY_ERR_INVALID;
    }
    if (n > 0 && !x) {
        fy_error("group: allreduce: x is NULL");
        return FY_ERR_INVALID;
    }
    fy_status_t st = grp_state(g);
    if (st != FY_OK || count == 1 || n == 0) return st;

    int32_t hi = first + count;
    if ((st = wait_slot_free(g)) != FY_OK) return st;
    float *mine = (float *)slot_of(g, g->rank);
    memcpy(mine, x, n * sizeof(float));
    post_step(g, first, hi, step_tag(STEP_AR_IN, first, count, n));
    if ((st = wait_peers(g, first, hi, 0, 0)) != FY_OK) return st;

    /* the sum runs in rank order, element by element: the same bits
     * whichever rank computes an element */
    size_t lo_i = 0, hi_i = n, per = 0;
    bool split = n * sizeof(float) > GRP_SMALL_REDUCE;
    if (split) {
        per = FY_ALIGN_UP((n + (size_t)count - 1) / (size_t)count, (size_t)16); /* whole cache lines */
        lo_i = FY_MIN(n, (size_t)(g->rank - first) * per);
        hi_i = FY_MIN(n, lo_i + per);
    }
    if (hi_i > lo_i) {
        const float *s0 = (const float *)slot_of(g, first);
        memcpy(x + lo_i, s0 + lo_i, (hi_i - lo_i) * sizeof(float));
        for (int32_t r = first + 1; r < hi; r++) {
            const float *sr = (const float *)slot_of(g, r);
            add_f32(x + lo_i, sr + lo_i, hi_i - lo_i);
        }
    }
    if (split) {
        /* my chunk of the sum goes to my slot's chunk, which only I read
         * before this step */
        if (hi_i > lo_i) memcpy(mine + lo_i, x + lo_i, (hi_i - lo_i) * sizeof(float));
        post_step(g, first, hi, step_tag(STEP_AR_SUM, first, count, n));
        if ((st = wait_peers(g, first, hi, 0, 0)) != FY_OK) return st;
        for (int32_t r = first; r < hi; r++) {
            if (r == g->rank) continue;
            size_t a = FY_MIN(n, (size_t)(r - first) * per), b = FY_MIN(n, a + per);
            if (b > a) memcpy(x + a, (const float *)slot_of(g, r) + a, (b - a) * sizeof(float));
        }
    }
    /* done reading the others' slots: they may write them again */
    post_step(g, first, hi, step_tag(STEP_AR_DONE, first, count, n));
    return FY_OK;
}

/* Copies rows pieces of piece bytes, contiguous in src, to dst's rows of
 * row bytes. */
static void place_rows(char *dst, size_t row, const char *src, size_t piece, size_t rows)
{
    if (rows == 1 || row == piece) {
        memcpy(dst, src, rows * piece);
        return;
    }
    for (size_t i = 0; i < rows; i++) memcpy(dst + i * row, src + i * piece, piece);
}

fy_status_t fy_group_allgather(fy_group_t *g, int32_t first, int32_t count, const void *mine, size_t rows,
                               size_t piece_bytes, void *all)
{
    if (count < 1 || first < 0 || first > g->n - count || g->rank < first || g->rank >= first + count) {
        fy_error("group: allgather over ranks %d..%d (count %d) from rank %d: out of range or not its own", (int)first,
                 (int)(first + count - 1), (int)count, (int)g->rank);
        return FY_ERR_INVALID;
    }
    size_t bytes;
    if (!fy_mul_size(rows, piece_bytes, &bytes) || bytes > g->h->slot_bytes) {
        fy_error("group: allgather of %zu rows of %zu bytes: more than a slot holds (%zu bytes)", rows, piece_bytes,
                 g->h->slot_bytes);
        return FY_ERR_INVALID;
    }
    if (bytes > 0 && (!mine || !all)) {
        fy_error("group: allgather: %s is NULL", !mine ? "mine" : "all");
        return FY_ERR_INVALID;
    }
    fy_status_t st = grp_state(g);
    if (st != FY_OK || bytes == 0) return st;

    size_t row = (size_t)count * piece_bytes;
    char *out = all;
    if (count == 1) {
        place_rows(out, row, mine, piece_bytes, rows);
        return FY_OK;
    }
    int32_t hi = first + count;
    /* both below 2^31 (their product is at most slot_bytes <= 1 GiB): the
     * tag tells every shape apart, so ranks that disagree on either break
     * the group */
    uint64_t shape = ((uint64_t)rows << 32) | piece_bytes;
    if ((st = wait_slot_free(g)) != FY_OK) return st;
    memcpy(slot_of(g, g->rank), mine, bytes);
    post_step(g, first, hi, step_tag(STEP_AG_IN, first, count, shape));
    /* my own piece while the others arrive, straight from mine */
    place_rows(out + (size_t)(g->rank - first) * piece_bytes, row, mine, piece_bytes, rows);
    /* each peer's piece as soon as that peer has posted it */
    for (int32_t r = first; r < hi; r++) {
        if (r == g->rank) continue;
        if ((st = wait_peers(g, r, r + 1, 0, 0)) != FY_OK) return st;
        place_rows(out + (size_t)(r - first) * piece_bytes, row, slot_of(g, r), piece_bytes, rows);
    }
    /* done reading the others' slots: they may write them again */
    post_step(g, first, hi, step_tag(STEP_AG_DONE, first, count, shape));
    return FY_OK;
}

static fy_status_t p2p_check(fy_group_t *g, const char *what, int32_t peer, const void *buf, size_t len)
{
    if (peer < 0 || peer >= g->n || peer == g->rank) {
        fy_error("group: %s from rank %d: peer rank %d is out of range or itself", what, (int)g->rank, (int)peer);
        return FY_ERR_INVALID;
    }
    if (len > g->h->slot_bytes) {
        fy_error("group: %s of %zu bytes: more than a slot holds (%zu)", what, len, g->h->slot_bytes);
        return FY_ERR_INVALID;
    }
    if (len > 0 && !buf) {
        fy_error("group: %s: buf is NULL", what);
        return FY_ERR_INVALID;
    }
    return grp_state(g);
}

fy_status_t fy_group_send(fy_group_t *g, int32_t dst, const void *buf, size_t len)
{
    fy_status_t st = p2p_check(g, "send", dst, buf, len);
    if (st != FY_OK) return st;
    if ((st = wait_slot_free(g)) != FY_OK) return st;
    if (len) memcpy(slot_of(g, g->rank), buf, len);
    post_step(g, dst, dst + 1, step_tag(STEP_P2P, g->rank, dst, len));
    return wait_peers(g, dst, dst + 1, 0, 0);
}

fy_status_t fy_group_recv(fy_group_t *g, int32_t src, void *buf, size_t len)
{
    fy_status_t st = p2p_check(g, "recv", src, buf, len);
    if (st != FY_OK) return st;
    uint32_t tag = step_tag(STEP_P2P, src, g->rank, len);
    if ((st = wait_peers(g, src, src + 1, 1, tag)) != FY_OK) return st;
    if (len) memcpy(buf, slot_of(g, src), len);
    post_step(g, src, src + 1, tag);
    return FY_OK;
}

/* ---- commands -------------------------------------------------------------------- */

fy_status_t fy_group_post_cmd(fy_group_t *g, const void *buf, size_t len)
{
    if (g->rank != 0) {
        fy_error("group: post_cmd from rank %d: only rank 0 posts commands", (int)g->rank);
        return FY_ERR_INVALID;
    }
    if (len > g->h->cmd_bytes || (len > 0 && !buf)) {
        fy_error("group: post_cmd of %zu bytes: %s", len,
                 len > g->h->cmd_bytes ? "more than cmd_bytes" : "buf is NULL");
        return FY_ERR_INVALID;
    }
    if (g->cmd_open) {
        fy_error("group: post_cmd before fy_group_done of the previous command");
        return FY_ERR_INVALID;
    }
    fy_status_t st = grp_state(g);
    if (st != FY_OK) return st;
    /* every follower called done for the previous command (rank 0's done
     * waited for it): none reads the area now */
    if (len) memcpy(cmd_area(g), buf, len);
    atomic_store(&g->h->cmd_len, len);
    atomic_fetch_add(&g->h->cmd_seq, 1);
    g->cmd_open = true;
    for (int32_t q = 1; q < g->n; q++) wake_rank(g->h, q);
    return FY_OK;
}

fy_status_t fy_group_wait_cmd(fy_group_t *g, const void **buf_p, size_t *len_p)
{
    if (g->rank == 0 || !buf_p || !len_p) {
        fy_error("group: wait_cmd: %s",
                 g->rank == 0 ? "rank 0 posts commands, it does not wait for them" : "buf_p or len_p is NULL");
        return FY_ERR_INVALID;
    }
    fy_status_t st = grp_state(g);
    if (st != FY_OK) return st;
    grp_want_t w = {.idle = true};
    if ((st = grp_wait(g, &w)) != FY_OK) return st;
    if ((st = grp_state(g)) != FY_OK) return st; /* leave: CANCELLED even with a command pending */
    g->cmd_seen = atomic_load(&g->h->cmd_seq);
    *buf_p = cmd_area(g);
    *len_p = (size_t)atomic_load(&g->h->cmd_len);
    return FY_OK;
}

fy_status_t fy_group_done(fy_group_t *g, fy_status_t mine, int32_t *bad_rank_p)
{
    grp_hdr_t *h = g->h;
    if (g->rank != 0) {
        atomic_store(&h->ranks[g->rank].status, (int32_t)mine);
        atomic_store(&h->ranks[g->rank].cmd_done, g->cmd_seen);
        wake_rank(h, 0);
        if (bad_rank_p) *bad_rank_p = -1;
        /* rank 0 may already be leaving: only breakage counts here */
        return atomic_load(&h->broken) ? grp_peer(g) : FY_OK;
    }
    g->cmd_open = false;
    fy_status_t st = grp_state(g);
    if (st == FY_OK) {
        grp_want_t w = {.cmd = true};
        st = grp_wait(g, &w);
    }
    if (st != FY_OK) {
        if (bad_rank_p) *bad_rank_p = atomic_load(&h->broken_ready) ? h->broken_rank : -1;
        return st;
    }
    int32_t bad = mine != FY_OK ? 0 : -1;
    fy_status_t res = mine;
    for (int32_t q = 1; q < g->n && bad < 0; q++) {
        fy_status_t s = (fy_status_t)atomic_load(&h->ranks[q].status);
        if (s != FY_OK) bad = q, res = s;
    }
    if (bad_rank_p) *bad_rank_p = bad;
    return res;
}

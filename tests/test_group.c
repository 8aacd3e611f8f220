/*
 * test_group.c - the rank group (engine/group.h): processes forked by
 * rank 0, commands, status aggregation, deterministic all-reduce and
 * bit-exact all-gather over the group and over disjoint subgroups at
 * once, point to point, all of them mixed without barriers, and what
 * happens when a rank aborts, dies, hangs, or rank 0 dies.
 *
 * The followers are children of the test process: they must not call
 * cmocka's asserts (a failed one would unwind into the runner inside the
 * child).  They record their checks on a board, a MAP_SHARED page made
 * before the fork, and rank 0 fails the test on any follower's failed
 * check or on a follower that never finished.
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "engine/group.h"
#include "common/mem.h"
#include "tests/testutil.h"

enum { MAX_RANKS = 64, SEED = 21 };

typedef struct board {
    _Atomic int32_t fails[MAX_RANKS];
    _Atomic int32_t finished[MAX_RANKS];
    _Atomic int32_t status[MAX_RANKS]; /* a status a follower saw, for rank 0 to check */
    _Atomic int32_t pids[MAX_RANKS];
    char msg[MAX_RANKS][160];
} board_t;

static board_t *board_new(void)
{
    void *p = mmap(NULL, sizeof(board_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(p != MAP_FAILED);
    return p;
}

static void board_fail(board_t *b, int32_t rank, int line, const char *what)
{
    if (atomic_fetch_add(&b->fails[rank], 1) == 0)
        snprintf(b->msg[rank], sizeof(b->msg[rank]), "line %d: %s (seed %d)", line, what, SEED);
}

/* A follower's check: recorded, never unwinding. */
#define CHECK(b, rank, cond)                                                                                           \
    do {                                                                                                               \
        if (!(cond)) board_fail(b, rank, __LINE__, #cond);                                                             \
    } while (0)

static void nap_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* A follower's end: waits for rank 0's destroy (wait_cmd says
 * CANCELLED), records that it got here, leaves. */
static void follower_end(board_t *b, fy_group_t *g, int32_t rank)
{
    const void *buf;
    size_t len;
    fy_status_t st = fy_group_wait_cmd(g, &buf, &len);
    CHECK(b, rank, st == FY_ERR_CANCELLED);
    atomic_store(&b->finished[rank], 1);
    fy_group_destroy(g);
    _exit(0);
}

/* A follower that saw the group break: records, leaves. */
static void follower_quit(board_t *b, fy_group_t *g, int32_t rank)
{
    atomic_store(&b->finished[rank], 1);
    fy_group_destroy(g);
    _exit(0);
}

static void assert_no_children(void)
{
    int st;
    pid_t r = waitpid(-1, &st, WNOHANG);
    if (r != -1 || errno != ECHILD) fail_msg("a child is left: waitpid(-1) gave %d (errno %d)", (int)r, errno);
}

/* After rank 0's destroy: every follower finished, no check failed, no
 * child is left (not even a zombie). */
static void board_check(board_t *b, int32_t n, const pid_t *pids)
{
    for (int32_t q = 1; q < n; q++) {
        if (atomic_load(&b->fails[q])) fail_msg("rank %d: %s", (int)q, b->msg[q]);
        if (!atomic_load(&b->finished[q])) fail_msg("rank %d did not finish (seed %d)", (int)q, SEED);
        if (pids) {
            int st;
            if (waitpid(pids[q], &st, WNOHANG) != -1 || errno != ECHILD)
                fail_msg("rank %d (pid %d) was not reaped", (int)q, (int)pids[q]);
        }
    }
    assert_no_children();
    munmap(b, sizeof(*b));
}

static fy_group_t *spawn(int32_t n, size_t slot, size_t cmd, int32_t timeout_ms, int32_t *rank_p, pid_t *pids)
{
    fy_group_params_t p = {.n_ranks = n, .slot_bytes = slot, .cmd_bytes = cmd, .timeout_ms = timeout_ms};
    fy_group_t *g = NULL;
    int32_t rank = -1;
    fy_status_t st = fy_group_spawn(&p, &g, &rank);
    if (st != FY_OK) fail_msg("spawn of %d ranks: %s", (int)n, fy_status_str(st));
    if (rank == 0) {
        assert_int_equal(fy_group_rank(g), 0);
        assert_int_equal(fy_group_size(g), n);
        for (int32_t q = 0; q < n && pids; q++) {
            pids[q] = fy_group_pid(g, q);
            assert_true(pids[q] > 0);
        }
        assert_int_equal(pids ? pids[0] : getpid(), getpid());
    }
    *rank_p = rank;
    return g;
}

/* ---- data the ranks agree on without talking ------------------------------------ */

static void fill_bytes(uint8_t *buf, size_t len, uint64_t seed)
{
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + SEED;
    for (size_t i = 0; i < len; i++) buf[i] = (uint8_t)(fy_test_rand_u64(&s) >> 56);
}

/* Floats of magnitudes 2^-20..2^20: their sum depends on its order. */
static void fill_floats(float *x, size_t n, uint64_t seed)
{
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + SEED;
    for (size_t i = 0; i < n; i++) {
        int e = (int)(fy_test_rand_u64(&s) % 41) - 20;
        x[i] = ldexpf(fy_test_rand_uniform(&s), e);
    }
}

static uint64_t vec_seed(int round, int32_t rank) { return (uint64_t)round * 1000 + (uint64_t)rank; }

/* ((x_first + x_first+1) + ...) in rank order, each input regenerated. */
static void expected_sum(float *out, float *tmp, size_t n, int32_t first, int32_t count, int round)
{
    fill_floats(out, n, vec_seed(round, first));
    for (int32_t r = first + 1; r < first + count; r++) {
        fill_floats(tmp, n, vec_seed(round, r));
        for (size_t i = 0; i < n; i++) out[i] += tmp[i];
    }
}

/* ---- commands ------------------------------------------------------------------------ */

typedef struct cmd_head {
    uint32_t round;
    int32_t fail_rank[2]; /* these ranks report failures (-1: none) */
    uint32_t payload;     /* bytes after the head, fill_bytes(round) */
} cmd_head_t;

enum { CMD_BYTES = 8192, CMD_ROUNDS = 12 };

static fy_status_t rank_failure(int32_t rank) { return rank == 1 ? FY_ERR_IO : FY_ERR_BACKEND; }

static void command_follower(board_t *b, fy_group_t *g, int32_t rank)
{
    uint8_t *want = malloc(CMD_BYTES);
    for (int i = 0; i < CMD_ROUNDS; i++) {
        const void *buf = NULL;
        size_t len = 0;
        fy_status_t st = fy_group_wait_cmd(g, &buf, &len);
        CHECK(b, rank, st == FY_OK);
        if (st != FY_OK) break;
        cmd_head_t h;
        CHECK(b, rank, len >= sizeof(h));
        memcpy(&h, buf, sizeof(h));
        CHECK(b, rank, h.round == (uint32_t)i);
        CHECK(b, rank, len == sizeof(h) + h.payload);
        fill_bytes(want, h.payload, h.round);
        CHECK(b, rank, memcmp((const uint8_t *)buf + sizeof(h), want, h.payload) == 0);
        fy_status_t mine = h.fail_rank[0] == rank || h.fail_rank[1] == rank ? rank_failure(rank) : FY_OK;
        CHECK(b, rank, fy_group_done(g, mine, NULL) == FY_OK);
    }
    free(want);
    follower_end(b, g, rank);
}

static void commands_with(int32_t n)
{
    board_t *b = board_new();
    pid_t pids[MAX_RANKS];
    int32_t rank;
    fy_group_t *g = spawn(n, 4096, CMD_BYTES, 5000, &rank, pids);
    if (rank != 0) command_follower(b, g, rank);

    uint8_t *buf = fy_malloc(CMD_BYTES);
    uint64_t s = SEED;
    for (int i = 0; i < CMD_ROUNDS; i++) {
        cmd_head_t h = {.round = (uint32_t)i, .fail_rank = {-1, -1}};
        h.payload = (uint32_t)(fy_test_rand_u64(&s) % (CMD_BYTES - sizeof(h) + 1));
        if (i == CMD_ROUNDS - 1) h.payload = CMD_BYTES - sizeof(h); /* the whole area */
        int32_t want_bad = -1;
        fy_status_t mine = FY_OK;
        if (i % 4 == 1) h.fail_rank[0] = want_bad = n - 1;                   /* the last follower fails */
        if (i % 4 == 2 && n > 2) h.fail_rank[0] = n - 1, h.fail_rank[1] = 1; /* two fail: the first counts */
        if (i % 4 == 2 && n > 2) want_bad = 1;
        if (i % 4 == 3) mine = FY_ERR_NO_SPACE, h.fail_rank[0] = 1, want_bad = 0; /* rank 0 fails first */
        memcpy(buf, &h, sizeof(h));
        fill_bytes(buf + sizeof(h), h.payload, h.round);
        assert_int_equal(fy_group_post_cmd(g, buf, sizeof(h) + h.payload), FY_OK);
        int32_t bad = 99;
        fy_status_t st = fy_group_done(g, mine, &bad);
        assert_int_equal(bad, want_bad);
        if (want_bad < 0)
            assert_int_equal(st, FY_OK);
        else
            assert_int_equal(st, want_bad == 0 ? FY_ERR_NO_SPACE : rank_failure(want_bad));
    }
    fy_free(buf);
    fy_group_destroy(g);
    board_check(b, n, pids);
}

static void test_commands(void **state)
{
    (void)state;
    commands_with(2);
    commands_with(3);
    commands_with(5);
}

/* ---- all-reduce ---------------------------------------------------------------------- */

static const size_t AR_SIZES[] = {1, 17, 576, 5000, 40000, 300000};
enum { AR_SLOT = 300000 * sizeof(float) };

/* One rank's part: every size, over [first, first + count), rounds
 * numbered from round0; checks its result against the rank-order sum. */
static int allreduce_rounds(board_t *b, fy_group_t *g, int32_t rank, int32_t first, int32_t count, int round0)
{
    size_t max = 300000;
    float *x = malloc(max * sizeof(float)), *want = malloc(max * sizeof(float)), *tmp = malloc(max * sizeof(float));
    int round = round0;
    for (size_t k = 0; k < FY_ARRAY_LEN(AR_SIZES); k++, round++) {
        size_t n = AR_SIZES[k];
        fill_floats(x, n, vec_seed(round, rank));
        fy_status_t st = fy_group_allreduce_f32(g, first, count, x, n);
        CHECK(b, rank, st == FY_OK);
        expected_sum(want, tmp, n, first, count, round);
        CHECK(b, rank, memcmp(x, want, n * sizeof(float)) == 0);
    }
    free(x);
    free(want);
    free(tmp);
    return round;
}

/* The sums of the test's data depend on their order (else the test would
 * not see a rank that sums in another). */
static void assert_order_matters(int32_t first, int32_t count, int round)
{
    if (count < 3) return; /* a + b == b + a */
    size_t n = 5000;
    float *fwd = malloc(n * sizeof(float)), *rev = malloc(n * sizeof(float)), *tmp = malloc(n * sizeof(float));
    expected_sum(fwd, tmp, n, first, count, round);
    fill_floats(rev, n, vec_seed(round, first + count - 1));
    for (int32_t r = first + count - 2; r >= first; r--) {
        fill_floats(tmp, n, vec_seed(round, r));
        for (size_t i = 0; i < n; i++) rev[i] += tmp[i];
    }
    assert_true(memcmp(fwd, rev, n * sizeof(float)) != 0);
    free(fwd);
    free(rev);
    free(tmp);
}

/* The whole group, then (n >= 4) two disjoint subgroups at once, then the
 * whole group again: the subgroups' counters must not disturb the
 * group's. */
static void allreduce_with(int32_t n)
{
    int32_t split = n / 2; /* subgroups [0, split) and [split, n) */
    assert_order_matters(0, n, 0);
    if (n >= 4) assert_order_matters(split, n - split, 100);
    board_t *b = board_new();
    pid_t pids[MAX_RANKS];
    int32_t rank;
    fy_group_t *g = spawn(n, AR_SLOT, 64, 10000, &rank, pids);
    int32_t sub_first = rank < split ? 0 : split, sub_count = rank < split ? split : n - split;
    board_t *bb = b;
    int round = allreduce_rounds(bb, g, rank, 0, n, 0);
    if (n >= 4) {
        for (int rep = 0; rep < 3; rep++) round = allreduce_rounds(bb, g, rank, sub_first, sub_count, 100 + rep * 10);
        CHECK(bb, rank, fy_group_barrier(g) == FY_OK);
        allreduce_rounds(bb, g, rank, 0, n, 200);
    }
    (void)round;
    if (rank != 0) follower_end(b, g, rank);
    assert_int_equal(atomic_load(&b->fails[0]), 0);
    fy_group_destroy(g);
    board_check(b, n, pids);
}

static void test_allreduce(void **state)
{
    (void)state;
    allreduce_with(2);
    allreduce_with(3);
    allreduce_with(5);
}

static void test_allreduce_subgroups(void **state)
{
    (void)state;
    allreduce_with(4);
    allreduce_with(6);
}

/* ---- point to point -------------------------------------------------------------------- */

enum { P2P_SLOT = 100000, P2P_ROUNDS = 20 };

static size_t p2p_len(int round, int32_t src) { return 1 + ((size_t)round * 7919 + (size_t)src * 104729) % P2P_SLOT; }

/* A ring (rank r sends to r + 1) and then disjoint pairs (0-1, 2-3, ...)
 * swapping both ways. */
static void p2p_with(int32_t n)
{
    board_t *b = board_new();
    pid_t pids[MAX_RANKS];
    int32_t rank;
    fy_group_t *g = spawn(n, P2P_SLOT, 64, 10000, &rank, pids);
    uint8_t *out = malloc(P2P_SLOT), *in = malloc(P2P_SLOT), *want = malloc(P2P_SLOT);
    int32_t next = (rank + 1) % n, prev = (rank + n - 1) % n;
    for (int round = 0; round < P2P_ROUNDS; round++) {
        size_t olen = p2p_len(round, rank), ilen = p2p_len(round, prev);
        fill_bytes(out, olen, vec_seed(round, rank));
        fill_bytes(want, ilen, vec_seed(round, prev));
        memset(in, 0, ilen);
        if (rank == 0) {
            CHECK(b, rank, fy_group_send(g, next, out, olen) == FY_OK);
            CHECK(b, rank, fy_group_recv(g, prev, in, ilen) == FY_OK);
        } else {
            CHECK(b, rank, fy_group_recv(g, prev, in, ilen) == FY_OK);
            CHECK(b, rank, fy_group_send(g, next, out, olen) == FY_OK);
        }
        CHECK(b, rank, memcmp(in, want, ilen) == 0);
    }
    int32_t mate = rank ^ 1;
    if (mate < n) {
        for (int round = 100; round < 100 + P2P_ROUNDS; round++) {
            size_t olen = p2p_len(round, rank), ilen = p2p_len(round, mate);
            fill_bytes(out, olen, vec_seed(round, rank));
            fill_bytes(want, ilen, vec_seed(round, mate));
            bool lower = rank < mate;
            CHECK(b, rank, (lower ? fy_group_send(g, mate, out, olen) : fy_group_recv(g, mate, in, ilen)) == FY_OK);
            CHECK(b, rank, (lower ? fy_group_recv(g, mate, in, ilen) : fy_group_send(g, mate, out, olen)) == FY_OK);
            CHECK(b, rank, memcmp(in, want, ilen) == 0);
        }
    }
    CHECK(b, rank, fy_group_barrier(g) == FY_OK);
    free(out);
    free(in);
    free(want);
    if (rank != 0) follower_end(b, g, rank);
    assert_int_equal(atomic_load(&b->fails[0]), 0);
    fy_group_destroy(g);
    board_check(b, n, pids);
}

static void test_send_recv(void **state)
{
    (void)state;
    p2p_with(2);
    p2p_with(3);
    p2p_with(5);
}

/* ---- all-gather ------------------------------------------------------------------------ */

/* rank's piece of a round: rows x piece bytes that the ranks agree on */
static void gather_piece(uint8_t *p, size_t rows, size_t piece, int round, int32_t rank)
{
    fill_bytes(p, rows * piece, vec_seed(round, rank));
}

/* What every rank of [first, first + count) must hold after the round's
 * all-gather: each rank's piece regenerated and placed by hand. */
static void expected_gather(uint8_t *out, uint8_t *tmp, size_t rows, size_t piece, int32_t first, int32_t count,
                            int round)
{
    size_t row = (size_t)count * piece;
    for (int32_t r = first; r < first + count; r++) {
        gather_piece(tmp, rows, piece, round, r);
        for (size_t i = 0; i < rows; i++) memcpy(out + i * row + (size_t)(r - first) * piece, tmp + i * piece, piece);
    }
}

/* One all-gather of a round over [first, first + count), checked bytewise
 * against the pieces placed by hand; all is poisoned first so a byte left
 * unwritten shows. */
static void gather_check(board_t *b, fy_group_t *g, int32_t rank, int32_t first, int32_t count, size_t rows,
                         size_t piece, int round, uint8_t *mine, uint8_t *all, uint8_t *want, uint8_t *tmp)
{
    size_t total = rows * (size_t)count * piece;
    gather_piece(mine, rows, piece, round, rank);
    memset(all, 0xa5, total);
    CHECK(b, rank, fy_group_allgather(g, first, count, mine, rows, piece, all) == FY_OK);
    expected_gather(want, tmp, rows, piece, first, count, round);
    CHECK(b, rank, memcmp(all, want, total) == 0);
}

/* rows x piece bytes: one token's slice (SmolLM2's 576 / 2 floats), odd
 * sizes, a prefill's rows, one piece filling the slot */
static const size_t AG_SHAPES[][2] = {{1, 4}, {1, 1152}, {1, 13}, {7, 13}, {128, 1152}, {3, 6144}, {1, 300000}};
enum { AG_SLOT = 300000 };

/* The whole group, then its two halves at once (a half of one rank
 * included: count 1 copies the piece), then the whole group again with no
 * barrier in between. */
static void allgather_with(int32_t n)
{
    int32_t split = n / 2; /* subgroups [0, split) and [split, n) */
    board_t *b = board_new();
    pid_t pids[MAX_RANKS];
    int32_t rank;
    fy_group_t *g = spawn(n, AG_SLOT, 64, 10000, &rank, pids);
    int32_t sub_first = rank < split ? 0 : split, sub_count = rank < split ? split : n - split;
    size_t cap = (size_t)AG_SLOT * (size_t)n;
    uint8_t *mine = malloc(AG_SLOT), *all = malloc(cap), *want = malloc(cap), *tmp = malloc(AG_SLOT);
    for (int rep = 0; rep < 3; rep++)
        for (size_t k = 0; k < FY_ARRAY_LEN(AG_SHAPES); k++) {
            int round = rep * 100 + (int)k * 3;
            size_t rows = AG_SHAPES[k][0], piece = AG_SHAPES[k][1];
            gather_check(b, g, rank, 0, n, rows, piece, round, mine, all, want, tmp);
            gather_check(b, g, rank, sub_first, sub_count, rows, piece, round + 1, mine, all, want, tmp);
            gather_check(b, g, rank, 0, n, rows, piece, round + 2, mine, all, want, tmp);
        }
    CHECK(b, rank, fy_group_barrier(g) == FY_OK);
    free(mine);
    free(all);
    free(want);
    free(tmp);
    if (rank != 0) follower_end(b, g, rank);
    if (atomic_load(&b->fails[0])) fail_msg("%d ranks: rank 0: %s", (int)n, b->msg[0]);
    fy_group_destroy(g);
    board_check(b, n, pids);
}

/* ---- a mix, without barriers ---------------------------------------------------------- */

/* n ranks run whole-group all-reduces and all-gathers, the same over the
 * halves {0..n/2-1} and {n/2..n-1} at once, and sends around each half,
 * back to back with no barrier: a rank that wrote its slot while a slower
 * rank of an earlier, wider collective still read it would corrupt
 * someone's result. */
static void mixed_with(int32_t n)
{
    enum { ROUNDS = 180, BIG = 20000 };
    board_t *b = board_new();
    pid_t pids[MAX_RANKS];
    int32_t rank;
    fy_group_t *g = spawn(n, BIG * sizeof(float), 64, 10000, &rank, pids);
    float *x = malloc(BIG * sizeof(float)), *want = malloc(BIG * sizeof(float)), *tmp = malloc(BIG * sizeof(float));
    uint8_t *in = malloc(BIG * sizeof(float)), *bytes = malloc(BIG * sizeof(float));
    size_t cap = (size_t)n * BIG * sizeof(float);
    uint8_t *all = malloc(cap), *gwant = malloc(cap);
    int32_t split = n / 2;
    int32_t first = rank < split ? 0 : split, count = rank < split ? split : n - split;
    for (int round = 0; round < ROUNDS; round++) {
        size_t len = round % 3 == 0 ? BIG : (size_t)(1 + (round * 37) % 3000);
        int op = round % 6;
        if (op == 0 || op == 1) {
            int32_t f = op == 0 ? 0 : first, c = op == 0 ? n : count;
            fill_floats(x, len, vec_seed(round, rank));
            CHECK(b, rank, fy_group_allreduce_f32(g, f, c, x, len) == FY_OK);
            expected_sum(want, tmp, len, f, c, round);
            CHECK(b, rank, memcmp(x, want, len * sizeof(float)) == 0);
        } else if (op == 2 || op == 3) {
            int32_t f = op == 2 ? 0 : first, c = op == 2 ? n : count;
            size_t rows = 1 + (size_t)round % 5, piece = len * sizeof(float) / rows;
            gather_check(b, g, rank, f, c, rows, piece, round, bytes, all, gwant, in);
        } else if (count > 1) {
            /* around the half: the first sends first, the others pass it on */
            int32_t next = first + (rank - first + 1) % count, prev = first + (rank - first + count - 1) % count;
            size_t olen = p2p_len(round, rank) % (BIG * sizeof(float)),
                   ilen = p2p_len(round, prev) % (BIG * sizeof(float));
            fill_bytes(bytes, olen, vec_seed(round, rank));
            if (rank == first) CHECK(b, rank, fy_group_send(g, next, bytes, olen) == FY_OK);
            CHECK(b, rank, fy_group_recv(g, prev, in, ilen) == FY_OK);
            if (rank != first) CHECK(b, rank, fy_group_send(g, next, bytes, olen) == FY_OK);
            fill_bytes(bytes, ilen, vec_seed(round, prev));
            CHECK(b, rank, memcmp(in, bytes, ilen) == 0);
        }
    }
    /* the halves end at different times: rank 0's destroy must not
     * cancel the slower one's sends */
    CHECK(b, rank, fy_group_barrier(g) == FY_OK);
    free(x);
    free(want);
    free(tmp);
    free(in);
    free(bytes);
    free(all);
    free(gwant);
    if (rank != 0) follower_end(b, g, rank);
    if (atomic_load(&b->fails[0])) fail_msg("%d ranks: rank 0: %s", (int)n, b->msg[0]);
    fy_group_destroy(g);
    board_check(b, n, pids);
}

static void test_allgather(void **state)
{
    (void)state;
    allgather_with(2);
    allgather_with(3);
    allgather_with(5);
}

static void test_mixed(void **state)
{
    (void)state;
    mixed_with(2);
    mixed_with(3);
    mixed_with(5);
}

/* ---- failures ---------------------------------------------------------------------------- */

/* A follower's fy_group_abort: rank 0's next wait returns FY_ERR_PEER
 * naming it; the other follower's wait for a command does too. */
static void test_abort(void **state)
{
    (void)state;
    board_t *b = board_new();
    pid_t pids[MAX_RANKS];
    int32_t rank;
    fy_group_t *g = spawn(3, 4096, 64, 5000, &rank, pids);
    if (rank != 0) {
        const void *buf;
        size_t len;
        fy_status_t st = fy_group_wait_cmd(g, &buf, &len);
        if (rank == 2) {
            CHECK(b, rank, st == FY_OK);
            fy_group_abort(g, "the weights did not load");
            CHECK(b, rank, fy_group_broken(g));
            CHECK(b, rank, fy_group_done(g, FY_OK, NULL) == FY_ERR_PEER);
            follower_quit(b, g, rank);
        }
        /* rank 1 sees the command, or (rank 2 was quicker) the breakage at once */
        CHECK(b, rank, st == FY_OK || st == FY_ERR_PEER);
        if (st == FY_OK) {
            st = fy_group_done(g, FY_OK, NULL);
            CHECK(b, rank, st == FY_OK || st == FY_ERR_PEER);
            st = fy_group_wait_cmd(g, &buf, &len);
        }
        CHECK(b, rank, st == FY_ERR_PEER);
        CHECK(b, rank, fy_group_allreduce_f32(g, 0, 3, (float[]){1}, 1) == FY_ERR_PEER);
        follower_quit(b, g, rank);
    }
    fy_test_log_begin();
    assert_int_equal(fy_group_post_cmd(g, "go", 2), FY_OK);
    int32_t bad = 99;
    double t0 = fy_now_s();
    assert_int_equal(fy_group_done(g, FY_OK, &bad), FY_ERR_PEER);
    assert_true(fy_now_s() - t0 < 3.0);
    assert_int_equal(bad, 2);
    assert_true(fy_group_broken(g));
    /* every later call at once */
    assert_int_equal(fy_group_barrier(g), FY_ERR_PEER);
    assert_int_equal(fy_group_post_cmd(g, "x", 1), FY_ERR_PEER);
    fy_test_log_end();
    assert_true(fy_test_log_has("rank 2", "aborted", "the weights did not load", NULL));
    /* logged once */
    const char *first = strstr(fy_test_log_text(), "aborted");
    assert_null(strstr(first + 1, "aborted"));
    fy_group_destroy(g);
    board_check(b, 3, pids);
}

/* SIGKILL of a follower while the others are in an all-reduce with it:
 * rank 0 and the survivor return FY_ERR_PEER within a few seconds, rank 0
 * naming the rank and the signal. */
static void test_killed_follower(void **state)
{
    (void)state;
    board_t *b = board_new();
    pid_t pids[MAX_RANKS];
    int32_t rank;
    fy_group_t *g = spawn(3, 4096, 64, 20000, &rank, pids);
    float x[64];
    for (int i = 0; i < 3; i++) {
        for (int k = 0; k < 64; k++) x[k] = 1.0f;
        CHECK(b, rank, fy_group_allreduce_f32(g, 0, 3, x, 64) == FY_OK);
        CHECK(b, rank, x[5] == 3.0f);
    }
    if (rank == 2) raise(SIGKILL);
    if (rank == 0) fy_test_log_begin();
    double t0 = fy_now_s();
    fy_status_t st = fy_group_allreduce_f32(g, 0, 3, x, 64);
    double took = fy_now_s() - t0;
    if (rank == 1) {
        CHECK(b, rank, st == FY_ERR_PEER);
        CHECK(b, rank, took < 3.0);
        CHECK(b, rank, fy_group_barrier(g) == FY_ERR_PEER);
        follower_quit(b, g, rank);
    }
    fy_test_log_end();
    assert_int_equal(st, FY_ERR_PEER);
    assert_true(took < 3.0);
    assert_true(fy_test_log_has("rank 2", "died", "killed by signal 9", NULL));
    assert_int_equal(atomic_load(&b->fails[0]), 0);
    fy_group_destroy(g);
    atomic_store(&b->finished[2], 1); /* it died on purpose */
    board_check(b, 3, pids);
}

/* A follower dies in an all-reduce of a subgroup rank 0 is not in, while
 * rank 0 is busy elsewhere (not in any group call): its partner sees it
 * dead by itself, well before the timeout. */
static void test_killed_sibling(void **state)
{
    (void)state;
    board_t *b = board_new();
    pid_t pids[MAX_RANKS];
    int32_t rank;
    fy_group_t *g = spawn(4, 4096, 64, 20000, &rank, pids);
    float x[64];
    if (rank >= 2) {
        for (int k = 0; k < 64; k++) x[k] = 1.0f;
        CHECK(b, rank, fy_group_allreduce_f32(g, 2, 2, x, 64) == FY_OK);
        if (rank == 3) raise(SIGKILL);
        double t0 = fy_now_s();
        CHECK(b, rank, fy_group_allreduce_f32(g, 2, 2, x, 64) == FY_ERR_PEER);
        CHECK(b, rank, fy_now_s() - t0 < 3.0);
        follower_quit(b, g, rank);
    }
    if (rank == 1) {
        CHECK(b, rank, fy_group_barrier(g) == FY_ERR_PEER); /* rank 0 never comes: the breakage ends it */
        follower_quit(b, g, rank);
    }
    double deadline = fy_now_s() + 5.0;
    while (!atomic_load(&b->finished[2]) && fy_now_s() < deadline) nap_ms(2); /* busy, as far as the group knows */
    assert_true(atomic_load(&b->finished[2]));
    assert_true(fy_group_broken(g));
    assert_int_equal(fy_group_barrier(g), FY_ERR_PEER);
    fy_group_destroy(g);
    atomic_store(&b->finished[3], 1); /* it died on purpose */
    board_check(b, 4, pids);
}

/* A follower that sleeps past the timeout is counted dead: the others'
 * all-reduce returns FY_ERR_PEER after about timeout_ms, and the sleeper
 * gets FY_ERR_PEER at once when it arrives. */
static void test_stuck_follower(void **state)
{
    (void)state;
    board_t *b = board_new();
    pid_t pids[MAX_RANKS];
    int32_t rank;
    const int32_t timeout = 300;
    fy_group_t *g = spawn(3, 4096, 64, timeout, &rank, pids);
    float x[16] = {0};
    if (rank == 2) {
        nap_ms(3 * timeout); /* the stuck rank: sleeping is what it is for */
        double t0 = fy_now_s();
        CHECK(b, rank, fy_group_allreduce_f32(g, 0, 3, x, 16) == FY_ERR_PEER);
        CHECK(b, rank, fy_now_s() - t0 < 1.0);
        follower_quit(b, g, rank);
    }
    if (rank == 0) fy_test_log_begin();
    double t0 = fy_now_s();
    fy_status_t st = fy_group_allreduce_f32(g, 0, 3, x, 16);
    double took = fy_now_s() - t0;
    if (rank == 1) {
        CHECK(b, rank, st == FY_ERR_PEER);
        CHECK(b, rank, took < 3.0); /* it may have started after rank 0 */
        follower_quit(b, g, rank);
    }
    fy_test_log_end();
    assert_int_equal(st, FY_ERR_PEER);
    if (took < timeout / 2e3 || took > 3.0) /* rank 1 may have started a little before it */
        fail_msg("gave up after %.0f ms (timeout %d)", took * 1e3, timeout);
    assert_true(fy_test_log_has("rank 2", "did not arrive within 300 ms", NULL));
    /* the sleeper finishes by itself (wait for it, with a deadline) */
    double deadline = fy_now_s() + 5.0;
    while (!atomic_load(&b->finished[2]) && fy_now_s() < deadline) nap_ms(5);
    fy_group_destroy(g);
    board_check(b, 3, pids);
}

/* Rank 0 dies: its followers go too.  The test forks a process that
 * becomes rank 0, kills it, and (as the orphans' subreaper) waits for
 * every follower to end, by pid. */
static void test_rank0_dies(void **state)
{
    (void)state;
    board_t *b = board_new();
    assert_int_equal(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
    pid_t leader = fork();
    assert_true(leader >= 0);
    if (leader == 0) {
        int32_t rank;
        fy_group_params_t p = {.n_ranks = 4, .slot_bytes = 4096, .cmd_bytes = 64, .timeout_ms = 5000};
        fy_group_t *g = NULL;
        if (fy_group_spawn(&p, &g, &rank) != FY_OK) _exit(2);
        if (rank != 0) {
            const void *buf;
            size_t len;
            fy_status_t st = fy_group_wait_cmd(g, &buf, &len); /* idles until rank 0 is gone */
            atomic_store(&b->status[rank], (int32_t)st);
            fy_group_destroy(g);
            _exit(3);
        }
        for (int32_t q = 0; q < 4; q++) atomic_store(&b->pids[q], (int32_t)fy_group_pid(g, q));
        atomic_store(&b->finished[0], 1);
        for (;;) pause(); /* until killed */
    }
    double deadline = fy_now_s() + 5.0;
    while (!atomic_load(&b->finished[0]) && fy_now_s() < deadline) nap_ms(2);
    assert_true(atomic_load(&b->finished[0]));
    assert_int_equal(kill(leader, SIGKILL), 0);
    int st;
    assert_int_equal(waitpid(leader, &st, 0), leader);
    /* the orphans come to this process, their subreaper: each must end */
    deadline = fy_now_s() + 5.0;
    for (int32_t q = 1; q < 4; q++) {
        pid_t pid = atomic_load(&b->pids[q]);
        assert_true(pid > 0);
        pid_t r;
        while ((r = waitpid(pid, &st, WNOHANG)) == 0 && fy_now_s() < deadline) nap_ms(5);
        if (r != pid) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            fail_msg("rank %d (pid %d) outlived rank 0 by 5 s", (int)q, (int)pid);
        }
    }
    assert_int_equal(prctl(PR_SET_CHILD_SUBREAPER, 0), 0);
    assert_no_children();
    munmap(b, sizeof(*b));
}

/* ---- parameters -------------------------------------------------------------------------- */

static void test_bad_params(void **state)
{
    (void)state;
    struct {
        fy_group_params_t p;
        const char *field;
    } bad[] = {
        {{.n_ranks = 1, .slot_bytes = 64, .cmd_bytes = 64}, "n_ranks"},
        {{.n_ranks = 65, .slot_bytes = 64, .cmd_bytes = 64}, "n_ranks"},
        {{.n_ranks = 2, .slot_bytes = 0, .cmd_bytes = 64}, "slot_bytes"},
        {{.n_ranks = 2, .slot_bytes = (size_t)1 << 40, .cmd_bytes = 64}, "slot_bytes"},
        {{.n_ranks = 2, .slot_bytes = SIZE_MAX, .cmd_bytes = 64}, "slot_bytes"},
        {{.n_ranks = 2, .slot_bytes = 64, .cmd_bytes = 0}, "cmd_bytes"},
        {{.n_ranks = 2, .slot_bytes = 64, .cmd_bytes = SIZE_MAX}, "cmd_bytes"},
        {{.n_ranks = 2, .slot_bytes = 64, .cmd_bytes = 64, .timeout_ms = -1}, "timeout_ms"},
    };
    for (size_t i = 0; i < FY_ARRAY_LEN(bad); i++) {
        fy_group_t *g = (fy_group_t *)(uintptr_t)1;
        int32_t rank = 77;
        fy_test_log_begin();
        assert_int_equal(fy_group_spawn(&bad[i].p, &g, &rank), FY_ERR_INVALID);
        fy_test_log_end();
        assert_true(g == (fy_group_t *)(uintptr_t)1);
        assert_int_equal(rank, 77);
        if (!fy_test_log_has(bad[i].field, NULL)) fail_msg("case %zu: no log naming %s", i, bad[i].field);
    }
    assert_no_children();

    /* the handle's allocation fails: nothing forked, nothing set */
    fy_group_params_t ok = {.n_ranks = 3, .slot_bytes = 64, .cmd_bytes = 64};
    fy_group_t *g0 = NULL;
    int32_t rank0 = 77;
    fy_test_log_begin();
    fy_mem_fail_after(1);
    fy_status_t st = fy_group_spawn(&ok, &g0, &rank0);
    fy_mem_fail_after(0);
    fy_test_log_end();
    assert_int_equal(st, FY_ERR_NOMEM);
    assert_null(g0);
    assert_int_equal(rank0, 77);
    assert_true(fy_test_log_has("group", "out of memory", NULL));
    assert_no_children();

    /* a group's calls refuse what is out of range, and the group goes on */
    board_t *b = board_new();
    pid_t pids[MAX_RANKS];
    int32_t rank;
    fy_group_t *g = spawn(2, 256, 64, 5000, &rank, pids);
    float x[128] = {0};
    uint8_t buf[512] = {0};
    fy_test_log_begin();
    CHECK(b, rank, fy_group_allreduce_f32(g, 0, 2, x, 65) == FY_ERR_INVALID); /* 260 bytes > 256 */
    CHECK(b, rank, fy_group_allreduce_f32(g, 1 - rank, 1, x, 4) == FY_ERR_INVALID);
    CHECK(b, rank, fy_group_allreduce_f32(g, 0, 3, x, 4) == FY_ERR_INVALID);
    CHECK(b, rank, fy_group_allreduce_f32(g, -1, 2, x, 4) == FY_ERR_INVALID);
    CHECK(b, rank, fy_group_send(g, rank, buf, 4) == FY_ERR_INVALID);
    CHECK(b, rank, fy_group_send(g, 1 - rank, buf, 257) == FY_ERR_INVALID);
    CHECK(b, rank, fy_group_recv(g, 5, buf, 4) == FY_ERR_INVALID);
    CHECK(b, rank, fy_group_allgather(g, 0, 2, buf, 3, 86, buf + 256) == FY_ERR_INVALID); /* 258 bytes > 256 */
    CHECK(b, rank, fy_group_allgather(g, 0, 2, buf, SIZE_MAX, 2, buf + 256) == FY_ERR_INVALID);
    CHECK(b, rank, fy_group_allgather(g, 1 - rank, 1, buf, 1, 4, buf + 256) == FY_ERR_INVALID);
    CHECK(b, rank, fy_group_allgather(g, 0, 2, NULL, 1, 4, buf + 256) == FY_ERR_INVALID);
    if (rank == 0) {
        CHECK(b, rank, fy_group_post_cmd(g, buf, 65) == FY_ERR_INVALID);
    } else {
        CHECK(b, rank, fy_group_post_cmd(g, buf, 4) == FY_ERR_INVALID);
    }
    fy_test_log_end();
    for (int k = 0; k < 64; k++) x[k] = (float)(rank + 1);
    CHECK(b, rank, fy_group_allreduce_f32(g, 0, 2, x, 64) == FY_OK);
    CHECK(b, rank, x[63] == 3.0f);
    memset(buf, rank + 1, 64);
    CHECK(b, rank, fy_group_allgather(g, 0, 2, buf, 1, 64, buf + 256) == FY_OK);
    CHECK(b, rank, buf[256] == 1 && buf[256 + 63] == 1 && buf[256 + 64] == 2 && buf[256 + 127] == 2);
    CHECK(b, rank, !fy_group_broken(g));
    if (rank != 0) follower_end(b, g, rank);
    assert_int_equal(atomic_load(&b->fails[0]), 0);
    fy_group_destroy(g);
    fy_group_destroy(NULL);
    board_check(b, 2, pids);
}

/* Two ranks that call different collectives at the same step break the
 * group instead of reducing garbage. */
static void test_mismatch(void **state)
{
    (void)state;
    board_t *b = board_new();
    pid_t pids[MAX_RANKS];
    int32_t rank;
    fy_group_t *g = spawn(2, 4096, 64, 5000, &rank, pids);
    float x[32] = {0};
    fy_status_t st = fy_group_allreduce_f32(g, 0, 2, x, rank == 0 ? 32 : 16);
    CHECK(b, rank, st == FY_ERR_MISMATCH || st == FY_ERR_PEER);
    CHECK(b, rank, fy_group_broken(g));
    if (rank != 0) follower_quit(b, g, rank);
    assert_int_equal(atomic_load(&b->fails[0]), 0);
    fy_group_destroy(g);
    board_check(b, 2, pids);
}

/* Ranks that call an all-gather with pieces of different sizes, or of
 * the same bytes in another shape, or an all-gather against an
 * all-reduce, break the group. */
static void test_gather_mismatch(void **state)
{
    (void)state;
    /* rank 0's call, rank 1's call: {rows, piece bytes}, or rows 0 for an all-reduce of 16 floats */
    static const size_t cases[][2][2] = {
        {{1, 64}, {1, 128}},
        {{2, 32}, {1, 64}},
        {{1, 64}, {0, 0}},
    };
    for (size_t k = 0; k < FY_ARRAY_LEN(cases); k++) {
        board_t *b = board_new();
        pid_t pids[MAX_RANKS];
        int32_t rank;
        fy_group_t *g = spawn(2, 4096, 64, 5000, &rank, pids);
        uint8_t mine[128] = {0}, all[256];
        float x[16] = {0};
        const size_t *c = cases[k][rank];
        fy_status_t st =
            c[0] ? fy_group_allgather(g, 0, 2, mine, c[0], c[1], all) : fy_group_allreduce_f32(g, 0, 2, x, 16);
        CHECK(b, rank, st == FY_ERR_MISMATCH || st == FY_ERR_PEER);
        CHECK(b, rank, fy_group_broken(g));
        if (rank != 0) follower_quit(b, g, rank);
        if (atomic_load(&b->fails[0])) fail_msg("case %zu: rank 0: %s", k, b->msg[0]);
        fy_group_destroy(g);
        board_check(b, 2, pids);
    }
}

int main(void)
{
    fy_log_set_level(FY_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_commands),
        cmocka_unit_test(test_allreduce),
        cmocka_unit_test(test_allreduce_subgroups),
        cmocka_unit_test(test_send_recv),
        cmocka_unit_test(test_allgather),
        cmocka_unit_test(test_mixed),
        cmocka_unit_test(test_abort),
        cmocka_unit_test(test_killed_follower),
        cmocka_unit_test(test_killed_sibling),
        cmocka_unit_test(test_stuck_follower),
        cmocka_unit_test(test_rank0_dies),
        cmocka_unit_test(test_bad_params),
        cmocka_unit_test(test_mismatch),
        cmocka_unit_test(test_gather_mismatch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

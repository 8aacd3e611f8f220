/*
 * test_kv.c - the KV block manager.
 *
 * The manager runs over real byte arenas (device and host tiers are host
 * memory here, the disk tier a file) with a memcpy copy callback, and the
 * tests write into every token slot a value that depends on the tenant,
 * the token and its position.  Every sequence must always read back the
 * values of its own tokens: that catches a block handed to two owners, a
 * copy-on-write that modified a block another sequence reads, a prefix hit
 * from another tenant, and a demotion or promotion that lost bytes.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/config.h"
#include "engine/engine_config.h"
#include "worker/worker_config.h"
#include "kv/kv.h"
#include "common/mem.h"
#include "tests/testutil.h"

typedef struct arenas {
    fy_kv_layout_t lay;
    char *dev, *host;
    int copies;
} arenas_t;

static fy_status_t copy_cb(void *arg, fy_kv_tier_t dt, const int32_t *dst, fy_kv_tier_t st, const int32_t *src,
                           int32_t n)
{
    arenas_t *a = arg;
    char *da = dt == FY_KV_DEVICE ? a->dev : a->host, *sa = st == FY_KV_DEVICE ? a->dev : a->host;
    for (int32_t i = 0; i < n; i++)
        memcpy(da + (size_t)dst[i] * a->lay.block_bytes, sa + (size_t)src[i] * a->lay.block_bytes, a->lay.block_bytes);
    a->copies += n;
    return FY_OK;
}

typedef struct fixture {
    arenas_t ar;
    fy_kv_hasher_t *hasher;
    fy_kvm_t *m;
    fy_kv_ns_t ns[3]; /* tenants */
} fixture_t;

/* The sliding window of fixture_open_groups' layout: ends inside a block. */
enum { WINDOW = 40 };

/* groups: 0, one layer (one group); else three layers, one global and two
 * with a window of WINDOW: three KV groups of one layer each. */
static void fixture_open_groups(fixture_t *f, int dev, int host, int disk_blocks, int bs, int groups)
{
    memset(f, 0, sizeof(*f));
    /* one head of 4 floats: 16 bytes a token, enough for a tag */
    assert_int_equal(fy_kv_layout_init(&f->ar.lay, groups ? 3 : 1, 1, 4, bs, FY_DTYPE_F32), FY_OK);
    if (groups) {
        const int32_t win[3] = {WINDOW, 0, WINDOW};
        assert_int_equal(fy_kv_layout_set_windows(&f->ar.lay, win), FY_OK);
        assert_int_equal(f->ar.lay.n_groups, 3);
    }
    f->ar.dev = calloc((size_t)dev, f->ar.lay.block_bytes);
    f->ar.host = host ? calloc((size_t)host, f->ar.lay.block_bytes) : NULL;
    const uint8_t secret[32] = "test secret, thirty-two bytes!!";
    assert_int_equal(fy_kv_hasher_create(secret, sizeof(secret), &f->hasher), FY_OK);
    const char *tenants[3] = {"alice", "bob", "carol"};
    for (int i = 0; i < 3; i++) fy_kv_ns_make(f->hasher, tenants[i], "tiny", &f->ar.lay, NULL, &f->ns[i]);
    if (disk_blocks) assert_true(mkdir(fy_test_path("kvdisk"), 0700) == 0 || errno == EEXIST); /* kv.disk_dir exists */
    fy_kvm_params_t p = {
        .layout = f->ar.lay,
        .n_device_blocks = dev,
        .n_host_blocks = host,
        .host_arena = f->ar.host,
        .disk_dir = disk_blocks ? fy_test_path("kvdisk") : NULL,
        .disk_bytes = (int64_t)disk_blocks * (int64_t)f->ar.lay.block_bytes,
        .copy = copy_cb,
        .copy_arg = &f->ar,
        .hasher = f->hasher,
        .prefix_caching = true,
        .watermark = 0.0f,
        .max_step_tokens = groups ? 16 : 0,
    };
    assert_int_equal(fy_kvm_create(&p, &f->m), FY_OK);
}

static void fixture_open(fixture_t *f, int dev, int host, int disk_blocks, int bs)
{
    fixture_open_groups(f, dev, host, disk_blocks, bs, 0);
}

static void fixture_close(fixture_t *f)
{
    fy_kvm_destroy(f->m);
    fy_kv_hasher_destroy(f->hasher);
    free(f->ar.dev);
    free(f->ar.host);
}

/* The value a token slot holds: tenant, token and position. */
static uint32_t tag(int tenant, int32_t token, int32_t pos)
{
    return (uint32_t)tenant * 1000003u ^ (uint32_t)token * 7919u ^ (uint32_t)pos * 104729u ^ 0x5bd1e995u;
}

/* The slot of position pos in group g's blocks (its first layer's). */
static uint32_t *slot_ptr_g(fixture_t *f, fy_kv_tier_t tier, const fy_block_table_t *bt, int32_t g, int32_t pos)
{
    char *arena = tier == FY_KV_DEVICE ? f->ar.dev : f->ar.host;
    int32_t b = fy_block_table_group(bt, g)[pos / bt->block_size], layer = 0;
    while (f->ar.lay.layer_group[layer] != g) layer++;
    return (uint32_t *)(arena + fy_kv_offset(&f->ar.lay, b, layer, 0, 0) + (size_t)(pos % bt->block_size) * 16);
}

typedef struct seq {
    bool live;
    int tenant;
    fy_block_table_t bt;
    int32_t tokens[600];
    int32_t n; /* tokens written (== bt.n_tokens) */
} seq_t;

/* Writes the tags of tokens [from, to) into the sequence's blocks, as a
 * forward pass writes K/V, and commits them. */
/* Writes the tags of tokens [bt.n_tokens, to) into every group's blocks,
 * as a forward pass writes K/V; no commit. */
static void write_uncommitted(fixture_t *f, seq_t *s, int32_t to)
{
    for (int32_t g = 0; g < s->bt.n_groups; g++)
        for (int32_t p = s->bt.n_tokens; p < to; p++)
            *slot_ptr_g(f, FY_KV_DEVICE, &s->bt, g, p) = tag(s->tenant, s->tokens[p], p) ^ (uint32_t)g * 0x9e3779b9u;
}

/* Writes the tags of tokens [from, to) into the sequence's blocks, as a
 * forward pass writes K/V, and commits them. */
static void write_tokens(fixture_t *f, seq_t *s, int32_t to)
{
    write_uncommitted(f, s, to);
    fy_kvm_seq_commit(f->m, &s->bt, s->tokens, to, NULL);
    s->n = to;
}

/* Every position each group holds reads this sequence's values. */
static void verify(fixture_t *f, const seq_t *s)
{
    for (int32_t g = 0; g < s->bt.n_groups; g++) {
        for (int32_t p = s->bt.lo[g] * s->bt.block_size; p < s->n; p++) {
            if (fy_block_table_group(&s->bt, g)[p / s->bt.block_size] < 0) continue; /* evicted */
            uint32_t got = *slot_ptr_g(f, s->bt.tier, &s->bt, g, p);
            uint32_t want = tag(s->tenant, s->tokens[p], p) ^ (uint32_t)g * 0x9e3779b9u;
            if (got != want)
                fail_msg("tenant %d sequence reads %08x at position %d of group %d (block %d, %s tier), wants %08x",
                         s->tenant, got, p, g, fy_block_table_group(&s->bt, g)[p / s->bt.block_size],
                         fy_kv_tier_name(s->bt.tier), want);
        }
    }
}

/* Refcounts equal the references the live tables hold; the scan agrees. */
static void check_books(fixture_t *f, seq_t *seqs, int n_seqs)
{
    assert_int_equal(fy_kvm_check(f->m), FY_OK);
    fy_kvm_stats_t st;
    fy_kvm_stats(f->m, &st);
    assert_true(st.balanced);
    for (int t = 0; t < 2; t++) {
        int32_t total = st.tier[t].total;
        int32_t *refs = calloc((size_t)(total ? total : 1), sizeof(int32_t));
        for (int i = 0; i < n_seqs; i++) {
            if (!seqs[i].live || seqs[i].bt.tier != (fy_kv_tier_t)t) continue;
            const fy_block_table_t *bt = &seqs[i].bt;
            for (int32_t g = 0; g < bt->n_groups; g++)
                for (int32_t b = bt->lo[g]; b < bt->n_blocks; b++)
                    if (fy_block_table_group(bt, g)[b] >= 0) refs[fy_block_table_group(bt, g)[b]]++;
        }
        for (int32_t b = 0; b < total; b++)
            if (refs[b] != fy_kvm_refcount(f->m, (fy_kv_tier_t)t, b))
                fail_msg("%s block %d: %d table references, refcount %d", fy_kv_tier_name((fy_kv_tier_t)t), b, refs[b],
                         fy_kvm_refcount(f->m, (fy_kv_tier_t)t, b));
        free(refs);
    }
}

/* ---- randomized operations ---------------------------------------------------------------- */

enum { N_SEQS = 24, MAX_TOK = 600 };

static void new_tokens(uint64_t *rng, seq_t *s)
{
    /* a few shared families of prefixes so that lookups hit */
    int family = (int)(fy_test_rand_u64(rng) % 4);
    int32_t shared = (int32_t)(fy_test_rand_u64(rng) % 120);
    int32_t extra = 1 + (int32_t)(fy_test_rand_u64(rng) % 100);
    for (int32_t i = 0; i < shared; i++) s->tokens[i] = family * 1000 + i;
    for (int32_t i = shared; i < shared + extra; i++) s->tokens[i] = (int32_t)(fy_test_rand_u64(rng) % 50000);
    s->n = shared + extra;
}

/* groups: the three-group layout (fixture_open_groups), where rollbacks
 * go the engine's way (speculative tokens written, rolled back, then the
 * accepted ones committed: a sliding group drops blocks only at commits) */
static void random_operations(int groups)
{
    fixture_t f;
    fixture_open_groups(&f, groups ? 160 : 96, groups ? 80 : 48, 32, 16, groups);
    seq_t *seqs = calloc(N_SEQS, sizeof(seq_t));
    uint64_t rng = 20261121;
    long ops = 0, hits = 0, cows = 0, swaps = 0, no_space = 0;
    for (; ops < 120000; ops++) {
        int i = (int)(fy_test_rand_u64(&rng) % N_SEQS);
        seq_t *s = &seqs[i];
        int op = (int)(fy_test_rand_u64(&rng) % 100);
        if (!s->live) {
            /* a new sequence: prefix lookup, then prefill the rest */
            s->tenant = (int)(fy_test_rand_u64(&rng) % 3);
            assert_int_equal(fy_kvm_seq_init(f.m, &s->bt, MAX_TOK, &f.ns[s->tenant]), FY_OK);
            new_tokens(&rng, s);
            int32_t want = s->n, hit;
            assert_int_equal(fy_kvm_seq_lookup(f.m, &s->bt, s->tokens, want, &hit), FY_OK);
            assert_true(hit < want && hit % 16 == 0);
            hits += hit > 0;
            s->n = hit;
            s->live = true;
            verify(&f, s); /* the cached prefix holds this tenant's values */
            fy_status_t st = fy_kvm_seq_reserve(f.m, &s->bt, want, NULL);
            if (st == FY_OK) {
                write_tokens(&f, s, want);
            } else {
                assert_int_equal(st, FY_ERR_NO_SPACE);
                no_space++;
            }
        } else if (s->bt.tier == FY_KV_HOST) {
            if (op < 50) {
                fy_status_t st = fy_kvm_seq_swap_in(f.m, &s->bt, NULL);
                assert_true(st == FY_OK || st == FY_ERR_NO_SPACE);
            } else {
                fy_kvm_seq_release(f.m, &s->bt);
                fy_kvm_seq_deinit(&s->bt);
                s->live = false;
            }
        } else if (op < 30) {
            /* decode a few tokens (copy-on-write if the last block is shared) */
            int32_t k = 1 + (int32_t)(fy_test_rand_u64(&rng) % 20);
            if (s->n + k <= MAX_TOK) {
                for (int32_t p = s->n; p < s->n + k; p++) s->tokens[p] = (int32_t)(fy_test_rand_u64(&rng) % 50000);
                fy_status_t st = fy_kvm_seq_reserve(f.m, &s->bt, s->n + k, NULL);
                if (st == FY_OK)
                    write_tokens(&f, s, s->n + k);
                else
                    no_space++;
            }
        } else if (op < 42) {
            /* fork into a free slot */
            int j = (int)(fy_test_rand_u64(&rng) % N_SEQS);
            seq_t *d = &seqs[j];
            if (!d->live) {
                assert_int_equal(fy_kvm_seq_init(f.m, &d->bt, MAX_TOK, &f.ns[s->tenant]), FY_OK);
                assert_int_equal(fy_kvm_seq_fork(f.m, &s->bt, &d->bt), FY_OK);
                d->tenant = s->tenant;
                d->n = s->n;
                memcpy(d->tokens, s->tokens, sizeof(int32_t) * (size_t)s->n);
                d->live = true;
                cows++;
            }
        } else if (op < 54 && !groups) {
            /* roll back speculative tokens */
            int32_t keep = s->n - (int32_t)(fy_test_rand_u64(&rng) % 8);
            if (keep < 0) keep = 0;
            fy_kvm_seq_truncate(f.m, &s->bt, keep);
            s->n = keep;
        } else if (op < 54) {
            /* a speculative step: k tokens written, some accepted */
            int32_t k = 1 + (int32_t)(fy_test_rand_u64(&rng) % 8), a = (int32_t)(fy_test_rand_u64(&rng) % (k + 1));
            if (s->n + k <= MAX_TOK && fy_kvm_seq_reserve(f.m, &s->bt, s->n + k, NULL) == FY_OK) {
                for (int32_t p = s->n; p < s->n + k; p++) s->tokens[p] = (int32_t)(fy_test_rand_u64(&rng) % 50000);
                write_uncommitted(&f, s, s->n + k);
                fy_kvm_seq_truncate(f.m, &s->bt, s->n + a);
                fy_kvm_seq_commit(f.m, &s->bt, s->tokens, s->n + a, NULL);
                s->n += a;
            }
        } else if (op < 62) {
            fy_status_t st = fy_kvm_seq_swap_out(f.m, &s->bt);
            assert_true(st == FY_OK || st == FY_ERR_NO_SPACE);
            swaps += st == FY_OK;
        } else if (op < 80) {
            fy_kvm_seq_release(f.m, &s->bt);
            fy_kvm_seq_deinit(&s->bt);
            s->live = false;
        }
        check_books(&f, seqs, N_SEQS);
        for (int k = 0; k < N_SEQS; k++)
            if (seqs[k].live) verify(&f, &seqs[k]);
    }
    fy_kvm_stats_t st;
    fy_kvm_stats(f.m, &st);
    fprintf(stderr,
            "%ld operations: %ld lookups hit, %ld forks, %ld swaps, %ld out of space; %llu cow copies, %llu "
            "demotions, %llu promotions, hits by tier %llu/%llu/%llu\n",
            ops, hits, cows, swaps, no_space, (unsigned long long)st.cow_copies, (unsigned long long)st.demotions,
            (unsigned long long)st.promotions, (unsigned long long)st.tier[0].hits, (unsigned long long)st.tier[1].hits,
            (unsigned long long)st.tier[2].hits);
    /* every path was exercised */
    assert_true(hits > 100 && cows > 100 && swaps > 100 && st.cow_copies > 50 && st.demotions > 100 &&
                st.promotions > 10 && st.tier[FY_KV_HOST].hits > 0 && st.tier[FY_KV_DISK].hits > 0);
    if (groups) fprintf(stderr, "sliding groups dropped %llu blocks\n", (unsigned long long)st.slid_blocks);
    assert_true(!groups || st.slid_blocks > 1000);
    for (int k = 0; k < N_SEQS; k++) {
        if (!seqs[k].live) continue;
        fy_kvm_seq_release(f.m, &seqs[k].bt);
        fy_kvm_seq_deinit(&seqs[k].bt);
    }
    fy_kvm_stats(f.m, &st);
    assert_int_equal(st.tier[FY_KV_DEVICE].used, 0); /* nothing leaked */
    assert_int_equal(st.tier[FY_KV_HOST].used, 0);
    assert_int_equal(st.tier[FY_KV_DEVICE].free + st.tier[FY_KV_DEVICE].cached, st.tier[FY_KV_DEVICE].total);
    assert_int_equal(fy_kvm_check(f.m), FY_OK);
    free(seqs);
    fixture_close(&f);
}

static void test_random_operations(void **state) { random_operations(0); }
static void test_random_operations_groups(void **state) { random_operations(1); }

/* ---- focused tests ---------------------------------------------------------------------------- */

static void prefill(fixture_t *f, seq_t *s, int tenant, const int32_t *tokens, int32_t n, int32_t *hit_p)
{
    s->tenant = tenant;
    assert_int_equal(fy_kvm_seq_init(f->m, &s->bt, MAX_TOK, &f->ns[tenant]), FY_OK);
    memcpy(s->tokens, tokens, sizeof(int32_t) * (size_t)n);
    assert_int_equal(fy_kvm_seq_lookup(f->m, &s->bt, tokens, n, hit_p), FY_OK);
    s->n = s->bt.n_tokens;
    s->live = true;
    verify(f, s);
    assert_int_equal(fy_kvm_seq_reserve(f->m, &s->bt, n, NULL), FY_OK);
    write_tokens(f, s, n);
}

static bool kept_contains(const int32_t *kept, int32_t n, int32_t i)
{
    for (int32_t k = 0; k < n; k++)
        if (kept[k] == i) return true;
    return false;
}

static void drop(fixture_t *f, seq_t *s)
{
    fy_kvm_seq_release(f->m, &s->bt);
    fy_kvm_seq_deinit(&s->bt);
    s->live = false;
}

static void test_tenant_isolation(void **state)
{
    fixture_t f;
    fixture_open(&f, 64, 0, 0, 16);
    int32_t prompt[100];
    for (int i = 0; i < 100; i++) prompt[i] = 500 + i;
    seq_t a = {0}, b = {0};
    int32_t hit;
    prefill(&f, &a, 0, prompt, 100, &hit);
    assert_int_equal(hit, 0);
    drop(&f, &a);
    prefill(&f, &b, 1, prompt, 100, &hit); /* same tokens, another tenant */
    assert_int_equal(hit, 0);
    drop(&f, &b);
    prefill(&f, &a, 0, prompt, 100, &hit); /* the first tenant still hits */
    assert_int_equal(hit, 96);
    drop(&f, &a);
    prefill(&f, &b, 1, prompt, 100, &hit);
    assert_int_equal(hit, 96);
    drop(&f, &b);
    /* the namespace fields are length-prefixed: "ab"+"c" is not "a"+"bc" */
    fy_kv_ns_t x, y;
    fy_kv_ns_make(f.hasher, "ab", "c", &f.ar.lay, NULL, &x);
    fy_kv_ns_make(f.hasher, "a", "bc", &f.ar.lay, NULL, &y);
    assert_memory_not_equal(&x, &y, sizeof(x));
    fy_kv_ns_make(f.hasher, "a", "bc", &f.ar.lay, "", &x); /* "" adapter is not no adapter */
    assert_memory_not_equal(&x, &y, sizeof(x));
    fy_kv_layout_t lay16 = f.ar.lay;
    lay16.dtype = FY_DTYPE_F16;
    fy_kv_ns_make(f.hasher, "a", "bc", &lay16, NULL, &x); /* the dtype is in the name */
    assert_memory_not_equal(&x, &y, sizeof(x));
    /* another deployment secret names blocks differently */
    fy_kv_hasher_t *other;
    const uint8_t secret2[32] = "another secret, 32 bytes long!!";
    assert_int_equal(fy_kv_hasher_create(secret2, sizeof(secret2), &other), FY_OK);
    fy_kv_ns_make(other, "a", "bc", &f.ar.lay, NULL, &x);
    assert_memory_not_equal(&x, &y, sizeof(x));
    fy_kv_hasher_destroy(other);
    fixture_close(&f);
}

static void test_lru_order(void **state)
{
    fixture_t f;
    fixture_open(&f, 9, 0, 0, 16);
    /* four prompts of 2 full blocks + 1 token each, released in order */
    seq_t s = {0};
    int32_t p[4][33], hit;
    for (int k = 0; k < 4; k++) {
        for (int i = 0; i < 33; i++) p[k][i] = k * 100 + i;
        prefill(&f, &s, 0, p[k], 33, &hit);
        drop(&f, &s);
    }
    /* each prompt left 2 named blocks cached (8 of 9 blocks); touching
     * prompt 0 makes it the most recently used */
    prefill(&f, &s, 0, p[0], 33, &hit);
    assert_int_equal(hit, 32);
    drop(&f, &s);
    /* taking 5 blocks (one free) evicts the two least recently used
     * prompts: 1 and 2 */
    seq_t big = {0};
    int32_t fresh[80];
    for (int i = 0; i < 80; i++) fresh[i] = 9000 + i;
    big.tenant = 0;
    assert_int_equal(fy_kvm_seq_init(f.m, &big.bt, MAX_TOK, &f.ns[0]), FY_OK);
    assert_int_equal(fy_kvm_seq_reserve(f.m, &big.bt, 80, NULL), FY_OK);
    memcpy(big.tokens, fresh, sizeof(fresh));
    write_tokens(&f, &big, 79); /* 4 full blocks named, the last one partial */
    int want[4] = {32, 0, 0, 32};
    for (int k = 0; k < 4; k++) {
        seq_t t = {0};
        t.tenant = 0;
        assert_int_equal(fy_kvm_seq_init(f.m, &t.bt, MAX_TOK, &f.ns[0]), FY_OK);
        assert_int_equal(fy_kvm_seq_lookup(f.m, &t.bt, p[k], 33, &hit), FY_OK);
        if (hit != want[k]) fail_msg("prompt %d: %d tokens cached, expected %d", k, hit, want[k]);
        drop(&f, &t);
    }
    drop(&f, &big);
    /* later blocks of a sequence are evicted before its first ones */
    fixture_close(&f);
    fixture_open(&f, 5, 0, 0, 16);
    int32_t q[65];
    for (int i = 0; i < 65; i++) q[i] = i;
    prefill(&f, &s, 0, q, 65, &hit);
    drop(&f, &s);
    assert_int_equal(fy_kvm_seq_init(f.m, &big.bt, MAX_TOK, &f.ns[0]), FY_OK);
    assert_int_equal(fy_kvm_seq_reserve(f.m, &big.bt, 48, NULL), FY_OK); /* 1 free + evicts 2 */
    seq_t t = {0};
    t.tenant = 0;
    assert_int_equal(fy_kvm_seq_init(f.m, &t.bt, MAX_TOK, &f.ns[0]), FY_OK);
    assert_int_equal(fy_kvm_seq_lookup(f.m, &t.bt, q, 65, &hit), FY_OK);
    assert_int_equal(hit, 32); /* blocks 0 and 1 survived; 2 and 3 went */
    drop(&f, &t);
    fy_kvm_seq_release(f.m, &big.bt);
    fy_kvm_seq_deinit(&big.bt);
    fixture_close(&f);
}

static void test_copy_on_write(void **state)
{
    fixture_t f;
    fixture_open(&f, 16, 0, 0, 16);
    seq_t a = {0}, b = {0};
    int32_t prompt[20], hit;
    for (int i = 0; i < 20; i++) prompt[i] = i + 1;
    prefill(&f, &a, 0, prompt, 20, &hit);
    assert_int_equal(fy_kvm_seq_init(f.m, &b.bt, MAX_TOK, &f.ns[0]), FY_OK);
    assert_int_equal(fy_kvm_seq_fork(f.m, &a.bt, &b.bt), FY_OK);
    b.tenant = 0, b.n = 20, b.live = true;
    memcpy(b.tokens, prompt, sizeof(prompt));
    assert_int_equal(fy_kvm_refcount(f.m, FY_KV_DEVICE, a.bt.blocks[1]), 2);
    /* b writes its next token: the shared partial block is copied first */
    b.tokens[20] = 777;
    assert_int_equal(fy_kvm_seq_reserve(f.m, &b.bt, 21, NULL), FY_OK);
    assert_int_not_equal(b.bt.blocks[1], a.bt.blocks[1]);
    assert_int_equal(b.bt.blocks[0], a.bt.blocks[0]); /* the full block stays shared */
    write_tokens(&f, &b, 21);
    a.tokens[20] = 888;
    assert_int_equal(fy_kvm_seq_reserve(f.m, &a.bt, 21, NULL), FY_OK);
    assert_int_equal(fy_kvm_refcount(f.m, FY_KV_DEVICE, a.bt.blocks[1]), 1); /* a's now alone: no copy */
    write_tokens(&f, &a, 21);
    verify(&f, &a);
    verify(&f, &b);
    fy_kvm_stats_t st;
    fy_kvm_stats(f.m, &st);
    assert_int_equal(st.cow_copies, 1);
    /* truncating into a named full block and writing again copies it too,
     * so the cached name keeps its contents */
    fy_kvm_seq_truncate(f.m, &a.bt, 10);
    a.n = 10;
    a.tokens[10] = 999;
    int32_t named = a.bt.blocks[0];
    assert_int_equal(fy_kvm_seq_reserve(f.m, &a.bt, 11, NULL), FY_OK);
    assert_int_not_equal(a.bt.blocks[0], named);
    write_tokens(&f, &a, 11);
    verify(&f, &a);
    verify(&f, &b);
    drop(&f, &a);
    drop(&f, &b);
    assert_int_equal(fy_kvm_check(f.m), FY_OK);
    fixture_close(&f);
}

static void test_tiers(void **state)
{
    fixture_t f;
    /* 4 device blocks, 4 host blocks, 8 disk blocks */
    fixture_open(&f, 4, 4, 8, 16);
    seq_t s = {0};
    int32_t p[6][33], hit;
    for (int k = 0; k < 6; k++) {
        for (int i = 0; i < 33; i++) p[k][i] = 100 * k + i;
        prefill(&f, &s, 0, p[k], 33, &hit); /* 2 named blocks each, pushing older ones down */
        drop(&f, &s);
    }
    fy_kvm_stats_t st;
    fy_kvm_stats(f.m, &st);
    assert_true(st.demotions >= 8);
    assert_true(st.tier[FY_KV_DISK].cached >= 2);
    /* the oldest prompt is on disk now: a hit brings it back intact */
    prefill(&f, &s, 0, p[0], 33, &hit);
    assert_int_equal(hit, 32);
    verify(&f, &s);
    drop(&f, &s);
    fy_kvm_stats(f.m, &st);
    assert_true(st.tier[FY_KV_DISK].hits >= 2);
    assert_true(st.promotions >= 2);
    /* swap a sequence out and back, sharing what is still named on the device */
    prefill(&f, &s, 1, p[5], 33, &hit);
    assert_int_equal(fy_kvm_seq_swap_out(f.m, &s.bt), FY_OK);
    assert_int_equal(s.bt.tier, FY_KV_HOST);
    verify(&f, &s);
    fy_test_log_begin();
    assert_int_equal(fy_kvm_seq_reserve(f.m, &s.bt, 40, NULL), FY_ERR_INVALID); /* not while swapped out */
    assert_true(fy_test_log_has("swapped-out", NULL));
    fy_test_log_end();
    assert_int_equal(fy_kvm_seq_swap_in(f.m, &s.bt, NULL), FY_OK);
    verify(&f, &s);
    drop(&f, &s);
    assert_int_equal(fy_kvm_check(f.m), FY_OK);
    fixture_close(&f);
    /* no host tier: swapping is refused, not faked */
    fixture_open(&f, 4, 0, 0, 16);
    prefill(&f, &s, 0, p[0], 33, &hit);
    assert_int_equal(fy_kvm_seq_swap_out(f.m, &s.bt), FY_ERR_UNSUPPORTED);
    drop(&f, &s);
    fixture_close(&f);
}

/* Pushes six 33-token prompts through 4 device and 4 host blocks: the
 * oldest ones' blocks land on the disk tier. */
static void fill_disk(fixture_t *f, int32_t p[6][33])
{
    seq_t s = {0};
    int32_t hit;
    for (int k = 0; k < 6; k++) {
        for (int i = 0; i < 33; i++) p[k][i] = 100 * k + i;
        prefill(f, &s, 0, p[k], 33, &hit);
        drop(f, &s);
    }
    fy_kvm_stats_t st;
    fy_kvm_stats(f->m, &st);
    assert_true(st.tier[FY_KV_DISK].cached >= 2);
}

/* A link planted where a disk tier's file used to go (kv.disk_dir/ferry-kv-PID.bin,
 * opened with O_CREAT | O_TRUNC through links) leads nowhere now: the
 * file is made exclusively in a fresh private folder. */
static void test_disk_tier_planted_link(void **state)
{
    (void)state;
    const char *dir = fy_test_path("kvdisk");
    assert_true(mkdir(dir, 0700) == 0 || errno == EEXIST);
    char victim[600], link[600];
    snprintf(victim, sizeof(victim), "%s", fy_test_path("victim"));
    static const char precious[] = "a file the worker must never touch";
    assert_true(fy_test_write_file(victim, precious, sizeof(precious)));
    snprintf(link, sizeof(link), "%s/ferry-kv-%ld.bin", dir, (long)getpid());
    unlink(link);
    assert_int_equal(symlink(victim, link), 0);
    fixture_t f;
    fixture_open(&f, 4, 4, 8, 16);
    int32_t p[6][33];
    fill_disk(&f, p);
    fixture_close(&f);
    char buf[256];
    int fd = open(victim, O_RDONLY);
    assert_true(fd >= 0);
    ssize_t n = read(fd, buf, sizeof(buf));
    close(fd);
    assert_int_equal(n, (ssize_t)sizeof(precious));
    assert_memory_equal(buf, precious, sizeof(precious));
    /* nothing of the tier is left in the folder: the planted link alone */
    DIR *d = opendir(dir);
    assert_non_null(d);
    int entries = 0;
    for (struct dirent *e; (e = readdir(d));) entries += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    assert_int_equal(entries, 1);
    unlink(link);
}

/* The disk tier's open file, found the way anyone with our uid could
 * find it: /proc/self/fd (its name ends "(deleted)"). */
static int disk_tier_fd(void)
{
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    int found = -1;
    for (struct dirent *e; (e = readdir(d));) {
        char path[300], target[600];
        snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(path, target, sizeof(target) - 1);
        if (n <= 0) continue;
        target[n] = '\0';
        if (strstr(target, "ferry-kv")) found = atoi(e->d_name);
    }
    closedir(d);
    assert_true(found >= 0);
    return found;
}

/* A byte flipped in every disk slot: each block read back is dropped (a
 * prefix miss, counted), never served; the prompt is computed again and
 * reads what it wrote. */
static void test_disk_tier_corruption(void **state)
{
    (void)state;
    fixture_t f;
    fixture_open(&f, 4, 4, 8, 16);
    int32_t p[6][33], hit;
    fill_disk(&f, p);
    int fd = disk_tier_fd();
    size_t bb = f.ar.lay.block_bytes;
    for (int k = 0; k < 8; k++) {
        unsigned char c;
        off_t at = (off_t)k * (off_t)bb + (off_t)(bb / 2);
        assert_int_equal(pread(fd, &c, 1, at), 1);
        c ^= 0x5a;
        assert_int_equal(pwrite(fd, &c, 1, at), 1);
    }
    /* the oldest prompt's blocks are on disk: all dropped, nothing served from there */
    seq_t s = {0};
    prefill(&f, &s, 0, p[0], 33, &hit); /* verifies what the lookup gave */
    verify(&f, &s);
    drop(&f, &s);
    fy_kvm_stats_t st;
    fy_kvm_stats(f.m, &st);
    print_message("a hit of %d tokens; %llu disk blocks dropped\n", hit, (unsigned long long)st.disk_bad_blocks);
    assert_int_equal(hit, 0);
    assert_true(st.disk_bad_blocks >= 1);
    assert_int_equal(fy_kvm_check(f.m), FY_OK);
    /* written again and read back intact: the tier still serves */
    fixture_close(&f);
    fixture_open(&f, 4, 4, 8, 16);
    fill_disk(&f, p);
    prefill(&f, &s, 0, p[0], 33, &hit);
    assert_int_equal(hit, 32);
    drop(&f, &s);
    fy_kvm_stats(f.m, &st);
    assert_int_equal(st.disk_bad_blocks, 0);
    fixture_close(&f);
}

/* kv.disk_dir refused at start, naming the key and the fault. */
static void disk_dir_refused(const char *dir, const char *host_mem, const char *fault)
{
    fy_config_t *c;
    assert_int_equal(fy_config_create(&c), FY_OK);
    char set[700];
    snprintf(set, sizeof(set), "kv.disk_dir=%s", dir);
    assert_int_equal(fy_config_set(c, set), FY_OK);
    snprintf(set, sizeof(set), "decode.host_kv_mem=%s", host_mem);
    assert_int_equal(fy_config_set(c, set), FY_OK);
    fy_engine_build_t b;
    fy_test_log_begin();
    fy_status_t st = fy_worker_build_read(c, "decode", &b);
    fy_test_log_end();
    if (st == FY_OK || !fy_test_log_has("kv.disk_dir", fault, NULL))
        fail_msg("kv.disk_dir = %s: status %s, log: %s", dir, fy_status_str(st), fy_test_log_text());
    fy_config_destroy(c);
}

static void test_disk_dir_refusals(void **state)
{
    (void)state;
    char missing[600], file[600], open_dir[600], link[600], ok[600];
    snprintf(missing, sizeof(missing), "%s", fy_test_path("no-such-dir"));
    snprintf(file, sizeof(file), "%s", fy_test_path("a-file"));
    snprintf(open_dir, sizeof(open_dir), "%s", fy_test_path("open-dir"));
    snprintf(link, sizeof(link), "%s", fy_test_path("link-dir"));
    snprintf(ok, sizeof(ok), "%s", fy_test_path("ok-dir"));
    assert_true(fy_test_write_file(file, "x", 1));
    assert_int_equal(mkdir(open_dir, 0700), 0);
    assert_int_equal(chmod(open_dir, 0777), 0); /* world-writable, no sticky bit */
    assert_int_equal(mkdir(ok, 0700), 0);
    assert_int_equal(symlink(ok, link), 0);
    disk_dir_refused(missing, "1MiB", "cannot be read");
    disk_dir_refused(file, "1MiB", "is not a directory");
    disk_dir_refused(open_dir, "1MiB", "without the sticky bit");
    disk_dir_refused(link, "1MiB", "symbolic link");
    disk_dir_refused(ok, "0", "decode.host_kv_mem");
    if (geteuid() == 0) { /* someone else's folder (root may give it away) */
        char theirs[600];
        snprintf(theirs, sizeof(theirs), "%s", fy_test_path("theirs"));
        assert_int_equal(mkdir(theirs, 0700), 0);
        assert_int_equal(chown(theirs, 65534, 65534), 0);
        disk_dir_refused(theirs, "1MiB", "owned by uid 65534");
    }
    /* sticky and world-writable (as /tmp), and our own: accepted */
    assert_int_equal(chmod(open_dir, 01777), 0);
    fy_config_t *c;
    assert_int_equal(fy_config_create(&c), FY_OK);
    char set[700];
    snprintf(set, sizeof(set), "kv.disk_dir=%s", open_dir);
    assert_int_equal(fy_config_set(c, set), FY_OK);
    assert_int_equal(fy_config_set(c, "decode.host_kv_mem=1MiB"), FY_OK);
    fy_engine_build_t b;
    assert_int_equal(fy_worker_build_read(c, "decode", &b), FY_OK);
    assert_string_equal(b.disk_dir, open_dir);
    fy_config_destroy(c);
}

/* ---- KV groups ---------------------------------------------------------------------------------------- */

/* Gemma 3's pattern (five local layers, then a global one): groups of
 * gcd(15, 3) = 3 layers, the global group first; one window for every
 * layer stays one group; nonsense is refused. */
static void test_groups_layout(void **state)
{
    fy_kv_layout_t lay, one;
    int32_t win[18];
    for (int i = 0; i < 18; i++) win[i] = i % 6 == 5 ? 0 : 512;
    assert_int_equal(fy_kv_layout_init(&lay, 18, 1, 256, 16, FY_DTYPE_F16), FY_OK);
    one = lay;
    size_t all_layers = lay.block_bytes;
    assert_int_equal(fy_kv_layout_set_windows(&lay, win), FY_OK);
    assert_int_equal(lay.n_groups, 6);
    assert_int_equal(lay.group_layers, 3);
    assert_int_equal(lay.block_bytes * 6, all_layers); /* one pool of equal pages */
    assert_int_equal(fy_kv_bytes_per_token(&lay), fy_kv_bytes_per_token(&one));
    assert_int_equal(lay.group_window[0], 0);
    for (int g = 1; g < 6; g++) assert_int_equal(lay.group_window[g], 512);
    const int global[3] = {5, 11, 17};
    for (int k = 0; k < 3; k++) {
        assert_int_equal(lay.layer_group[global[k]], 0);
        assert_int_equal(lay.layer_slot[global[k]], k);
    }
    assert_int_equal(lay.layer_group[0], 1), assert_int_equal(lay.layer_slot[0], 0);
    assert_int_equal(lay.layer_group[6], 2), assert_int_equal(lay.layer_slot[6], 2); /* 0,1,2 | 3,4,6 */
    /* every (group, slot) once */
    int seen[6][3] = {{0}};
    for (int l = 0; l < 18; l++) seen[lay.layer_group[l]][lay.layer_slot[l]]++;
    for (int g = 0; g < 6; g++)
        for (int s = 0; s < 3; s++) assert_int_equal(seen[g][s], 1);
    assert_int_not_equal(fy_kv_layout_groups_digest(&lay), 0);
    assert_int_equal(fy_kv_layout_groups_digest(&one), 0);
    /* 8k tokens: three global layers keep 512 blocks each, fifteen local
     * ones (5 groups) a window and a step: 0.21 of all-global */
    assert_int_equal(fy_kv_blocks_held(&one, 8192, 512), 512);
    assert_int_equal(fy_kv_blocks_held(&lay, 8192, 512), 512 + 5 * ((511 + 512 + 15) / 16 + 1));
    assert_int_equal(fy_kv_blocks_held(&lay, 100, 16), 6 * 7); /* short: the window holds it all */
    /* one window everywhere (Mistral): one group, and it slides */
    for (int i = 0; i < 18; i++) win[i] = 4096;
    fy_kv_layout_t m = one;
    assert_int_equal(fy_kv_layout_set_windows(&m, win), FY_OK);
    assert_int_equal(m.n_groups, 1);
    assert_int_equal(m.group_window[0], 4096);
    assert_int_equal(m.block_bytes, all_layers);
    /* 1 global + 3 local: groups of one layer */
    int32_t w4[4] = {0, 7, 7, 7};
    assert_int_equal(fy_kv_layout_init(&m, 4, 1, 4, 16, FY_DTYPE_F32), FY_OK);
    assert_int_equal(fy_kv_layout_set_windows(&m, w4), FY_OK);
    assert_int_equal(m.n_groups, 4);
    assert_int_equal(m.group_layers, 1);
    w4[2] = -1;
    fy_test_log_begin();
    assert_int_equal(fy_kv_layout_set_windows(&m, w4), FY_ERR_INVALID);
    assert_true(fy_test_log_has("window -1", NULL));
    fy_test_log_end();
}

/* A long request in a pool exactly the size of its promise: the sliding
 * groups' dropped blocks go back into the promise, so every step of a
 * 560-token run (prompt in chunks, then decode) finds its blocks; the
 * global group holds every block, a sliding one never more than its
 * window and a step. */
static void test_groups_window_and_promise(void **state)
{
    fixture_t f;
    const int32_t total = 560, prompt = 100, bs = 16;
    fixture_open_groups(&f, 64, 0, 0, bs, 1);
    int32_t need = fy_kvm_blocks_for(f.m, prompt, total - prompt, 0);
    assert_int_equal(need, total / bs + 2 * ((WINDOW - 1 + 16 + bs - 1) / bs + 1)); /* 35 + 2 x 5 */
    fy_kvm_destroy(f.m);
    fy_kvm_params_t p = {.layout = f.ar.lay,
                         .n_device_blocks = need,
                         .copy = copy_cb,
                         .copy_arg = &f.ar,
                         .hasher = f.hasher,
                         .prefix_caching = true,
                         .max_step_tokens = 16};
    assert_int_equal(fy_kvm_create(&p, &f.m), FY_OK);
    fy_kv_resv_t r = {0};
    assert_int_equal(fy_kvm_admit(f.m, need, &r), FY_OK);
    seq_t s = {0};
    assert_int_equal(fy_kvm_seq_init(f.m, &s.bt, MAX_TOK, &f.ns[0]), FY_OK);
    for (int32_t i = 0; i < total; i++) s.tokens[i] = 7 * i + 1;
    for (int32_t n = 0; n < total;) {
        int32_t k = n < prompt ? (prompt - n < 16 ? prompt - n : 16) : 1;
        if (fy_kvm_seq_reserve(f.m, &s.bt, n + k, &r) != FY_OK) fail_msg("no blocks at %d + %d tokens", n, k);
        for (int32_t g = 0; g < 3; g++) {
            int32_t w = f.ar.lay.group_window[g], held = s.bt.n_blocks - s.bt.lo[g];
            if (w ? held > (w - 1 + k + bs - 1) / bs + 1 : s.bt.lo[g] != 0)
                fail_msg("group %d holds %d blocks from %d at %d tokens", g, held, s.bt.lo[g], n + k);
        }
        write_uncommitted(&f, &s, n + k);
        fy_kvm_seq_commit(f.m, &s.bt, s.tokens, n + k, &r);
        n += k;
        s.n = n;
        verify(&f, &s);
    }
    assert_true(r.blocks >= 0);
    fy_kvm_stats_t st;
    fy_kvm_stats(f.m, &st);
    assert_true(st.slid_blocks > 2 * 25);
    assert_true(fy_block_table_held(&s.bt) < 35 + 2 * 5);
    /* a query behind what was dropped is refused by name, not read */
    fy_test_log_begin();
    fy_kvm_seq_truncate(f.m, &s.bt, 100);
    assert_true(fy_test_log_has("behind what group", NULL));
    fy_test_log_end();
    fy_kvm_seq_release(f.m, &s.bt);
    fy_kvm_seq_deinit(&s.bt);
    fy_kvm_resv_release(f.m, &r);
    /* a decode worker's reservation reads from the prompt's end: the
     * sliding groups take only their window there; a first query behind
     * what is written, or past the end, is refused */
    seq_t d = {0};
    assert_int_equal(fy_kvm_seq_init(f.m, &d.bt, MAX_TOK, &f.ns[0]), FY_OK);
    fy_test_log_begin();
    assert_int_equal(fy_kvm_seq_reserve_from(f.m, &d.bt, 100, 101, NULL), FY_ERR_INVALID);
    assert_true(fy_test_log_has("reserve from position 101", NULL));
    fy_test_log_end();
    assert_int_equal(fy_kvm_seq_reserve_from(f.m, &d.bt, 100, 100, NULL), FY_OK);
    assert_int_equal(d.bt.lo[1], (100 - WINDOW + 1) / bs);
    assert_int_equal(fy_block_table_held(&d.bt), 7 + 2 * (7 - (100 - WINDOW + 1) / bs));
    fy_kvm_seq_release(f.m, &d.bt);
    fy_kvm_seq_deinit(&d.bt);
    assert_int_equal(fy_kvm_check(f.m), FY_OK);
    fixture_close(&f);
}

/* A prefix hit needs every block of the global group but only the
 * window's blocks of the sliding ones, which the first request dropped
 * into the cache under their names; the hit reads the right values, and
 * a request of another tenant finds nothing. */
static void test_groups_prefix(void **state)
{
    fixture_t f;
    fixture_open_groups(&f, 96, 0, 0, 16, 1);
    int32_t p[260], hit;
    for (int i = 0; i < 260; i++) p[i] = 3 * i + 11;
    seq_t a = {0}, b = {0}, c = {0};
    /* a writes 200 tokens in 16-token steps: its sliding groups drop blocks */
    a.tenant = 0;
    assert_int_equal(fy_kvm_seq_init(f.m, &a.bt, MAX_TOK, &f.ns[0]), FY_OK);
    memcpy(a.tokens, p, sizeof(p));
    for (int32_t n = 0; n < 200; n += 16) {
        int32_t k = 200 - n < 16 ? 200 - n : 16;
        assert_int_equal(fy_kvm_seq_reserve(f.m, &a.bt, n + k, NULL), FY_OK);
        write_tokens(&f, &a, n + k);
    }
    assert_int_equal(a.bt.lo[0], 0);
    assert_int_equal(a.bt.lo[1], (200 - WINDOW + 1) / 16);
    drop(&f, &a);
    /* b: 12 full blocks of the same prefix and more */
    b.tenant = 0;
    assert_int_equal(fy_kvm_seq_init(f.m, &b.bt, MAX_TOK, &f.ns[0]), FY_OK);
    memcpy(b.tokens, p, sizeof(p));
    assert_int_equal(fy_kvm_seq_lookup(f.m, &b.bt, p, 260, &hit), FY_OK);
    assert_int_equal(hit, 192);
    b.n = hit;
    assert_int_equal(b.bt.lo[0], 0);
    assert_int_equal(b.bt.lo[1], (192 - WINDOW + 1) / 16); /* only what a query at 192 sees */
    assert_int_equal(fy_block_table_held(&b.bt), 12 + 2 * (12 - (192 - WINDOW + 1) / 16));
    verify(&f, &b);
    assert_int_equal(fy_kvm_seq_reserve(f.m, &b.bt, 260, NULL), FY_OK);
    write_tokens(&f, &b, 260);
    verify(&f, &b);
    drop(&f, &b);
    prefill(&f, &c, 1, p, 260, &hit);
    assert_int_equal(hit, 0);
    drop(&f, &c);
    assert_int_equal(fy_kvm_check(f.m), FY_OK);
    fixture_close(&f);
}

/* ---- KV budgets (eviction) ---------------------------------------------------------------------------- */

/* Evicting drops this sequence's references and nothing else: a block
 * another sequence shares keeps its contents and its reference; a named
 * block stays in the prefix cache; the block being written and blocks
 * already gone are refused. */
static void test_evict_blocks(void **state)
{
    fixture_t f;
    fixture_open(&f, 64, 0, 0, 16);
    int32_t p[200], hit;
    for (int i = 0; i < 200; i++) p[i] = 5 * i + 3;
    seq_t a = {0}, b = {0};
    prefill(&f, &a, 0, p, 200, &hit); /* 12 full blocks and 8 tokens */
    assert_int_equal(fy_kvm_seq_init(f.m, &b.bt, MAX_TOK, &f.ns[0]), FY_OK);
    assert_int_equal(fy_kvm_seq_fork(f.m, &a.bt, &b.bt), FY_OK);
    b.tenant = 0, b.n = 200, b.live = true;
    memcpy(b.tokens, p, sizeof(p));
    int32_t shared = a.bt.blocks[4], before = fy_kvm_refcount(f.m, FY_KV_DEVICE, shared);
    const int32_t ev[3] = {3, 4, 5};
    fy_kv_resv_t r = {0};
    assert_int_equal(fy_kvm_seq_evict(f.m, &a.bt, ev, 3, &r), FY_OK);
    assert_int_equal(a.bt.blocks[4], -1);
    assert_int_equal(a.bt.n_evicted, 3);
    assert_int_equal(fy_kvm_refcount(f.m, FY_KV_DEVICE, shared), before - 1);
    assert_int_equal(fy_block_table_held(&a.bt), 13 - 3);
    assert_int_equal(r.blocks, 0); /* b still holds them: nothing went back */
    verify(&f, &b);                /* the other sequence reads its values */
    fy_test_log_begin();
    const int32_t bad[4][2] = {{12, 1}, {4, 1}, {6, 6}, {-1, 1}};
    for (int k = 0; k < 4; k++)
        assert_int_equal(fy_kvm_seq_evict(f.m, &a.bt, bad[k], bad[k][1] == bad[k][0] ? 2 : 1, NULL), FY_ERR_INVALID);
    assert_true(fy_test_log_has("being written", NULL) && fy_test_log_has("already gone", NULL) &&
                fy_test_log_has("asked twice", NULL));
    fy_test_log_end();
    check_books(&f, (seq_t[]){a, b}, 2);
    /* b lets go: the blocks a evicted stay cached under their names */
    drop(&f, &b);
    seq_t c = {0};
    prefill(&f, &c, 0, p, 200, &hit);
    assert_int_equal(hit, 192);
    verify(&f, &c);
    drop(&f, &c);
    drop(&f, &a);
    assert_int_equal(fy_kvm_check(f.m), FY_OK);
    fixture_close(&f);
}

/* KV computed after an eviction is not the KV of the full prefix: a
 * sequence that evicted names none of the blocks it writes afterwards, so
 * a request without eviction never receives one. */
static void test_evicted_kv_never_named(void **state)
{
    fixture_t f;
    fixture_open(&f, 64, 0, 0, 16);
    int32_t p[300], hit;
    for (int i = 0; i < 300; i++) p[i] = 11 * i + 7;
    seq_t a = {0}, b = {0};
    prefill(&f, &a, 0, p, 100, &hit); /* 6 full blocks, named */
    const int32_t ev[2] = {1, 2};
    assert_int_equal(fy_kvm_seq_evict(f.m, &a.bt, ev, 2, NULL), FY_OK);
    memcpy(a.tokens, p, sizeof(p));
    for (int32_t n = 100; n < 300; n += 20) { /* the rest, computed "under eviction" */
        assert_int_equal(fy_kvm_seq_reserve(f.m, &a.bt, n + 20, NULL), FY_OK);
        write_tokens(&f, &a, n + 20);
    }
    assert_int_equal(a.bt.name_limit, 6);
    drop(&f, &a);
    /* the same 300 tokens, no eviction: only the 6 blocks from before it hit */
    prefill(&f, &b, 0, p, 300, &hit);
    assert_int_equal(hit, 96);
    verify(&f, &b);
    drop(&f, &b);
    assert_int_equal(fy_kvm_check(f.m), FY_OK);
    fixture_close(&f);
}

/*
 * A KV budget across a transfer: the sender evicted some of a prompt's
 * blocks; the receiver, which caches a prefix of it, reserved slots
 * (fy_kvm_seq_reserve_slots) without knowing which blocks survive; the
 * sender's kept blocks from the first one the receiver lacks go into the
 * slots in order, and fy_kvm_seq_place puts them where they belong.  The
 * receiver then reads every kept position's values and holds nothing
 * else, its cached blocks the sender dropped are gone, the slots it did
 * not need went back, and the books balance throughout.
 */
static void place_kept(int groups)
{
    fixture_t f;
    fixture_open_groups(&f, 256, 0, 0, 16, groups);
    uint64_t rng = 20261124 + (uint64_t)groups;
    int32_t placed = 0, cached_dropped = 0, leftover = 0;
    for (int round = 0; round < 300; round++) {
        int32_t n = 20 + (int32_t)(fy_test_rand_u64(&rng) % 380), nb = (n + 15) / 16, hit;
        int32_t tok[400];
        for (int32_t i = 0; i < n; i++) tok[i] = (int32_t)(fy_test_rand_u64(&rng) % 50000);
        /* the receiver caches a random prefix of it */
        seq_t c = {0}, a = {0}, d = {0};
        int32_t lc = (int32_t)(fy_test_rand_u64(&rng) % (uint64_t)(n + 1));
        if (lc > 0) {
            prefill(&f, &c, 0, tok, lc, &hit);
            drop(&f, &c);
        }
        /* the sender (its own namespace, the same values) runs the prompt
         * and evicts some full blocks before the last */
        a.tenant = 0;
        assert_int_equal(fy_kvm_seq_init(f.m, &a.bt, MAX_TOK, &f.ns[2]), FY_OK);
        memcpy(a.tokens, tok, sizeof(int32_t) * (size_t)n);
        assert_int_equal(fy_kvm_seq_reserve(f.m, &a.bt, n, NULL), FY_OK);
        write_tokens(&f, &a, n);
        a.live = true;
        int32_t ev[32], n_ev = 0;
        for (int32_t i = 0; i < n / 16 && i < nb - 1 && n_ev < 32; i++) {
            if (fy_block_table_holds(&a.bt, i) && fy_test_rand_u64(&rng) % 3 == 0) ev[n_ev++] = i;
        }
        assert_int_equal(fy_kvm_seq_evict(f.m, &a.bt, ev, n_ev, NULL), FY_OK);
        int32_t kept[32], n_kept = 0;
        for (int32_t i = 0; i < nb; i++) {
            if (fy_block_table_holds(&a.bt, i)) kept[n_kept++] = i;
        }
        /* the receiver: its prefix, and slots for the rest */
        d.tenant = 0;
        assert_int_equal(fy_kvm_seq_init(f.m, &d.bt, MAX_TOK, &f.ns[0]), FY_OK);
        memcpy(d.tokens, tok, sizeof(int32_t) * (size_t)n);
        assert_int_equal(fy_kvm_seq_lookup(f.m, &d.bt, tok, n, &hit), FY_OK);
        int32_t first = hit / 16, want = 0;
        for (int32_t k = 0; k < n_kept; k++) want += kept[k] >= first;
        int32_t slots = want + (int32_t)(fy_test_rand_u64(&rng) % 3);
        if (slots > nb - first) slots = nb - first;
        assert_int_equal(fy_kvm_seq_reserve_slots(f.m, &d.bt, n, slots, NULL), FY_OK);
        d.live = true;
        check_books(&f, (seq_t[]){a, d}, 2);
        /* the transfer: each group's kept blocks from its slots' start, in order */
        for (int32_t g = 0; g < d.bt.n_groups; g++) {
            const int32_t *src = fy_block_table_group(&a.bt, g), *dst = fy_block_table_group(&d.bt, g);
            int32_t from = d.bt.lo[g] > first ? d.bt.lo[g] : first, s = 0;
            assert_int_equal(a.bt.lo[g], d.bt.lo[g]);
            for (int32_t i = from; i < nb; i++) {
                if (src[i] < 0) continue;
                assert_true(dst[from + s] >= 0);
                assert_int_equal(copy_cb(&f.ar, FY_KV_DEVICE, &dst[from + s], FY_KV_DEVICE, &src[i], 1), FY_OK);
                s++;
            }
        }
        int32_t free_before = fy_kvm_n_free(f.m, FY_KV_DEVICE);
        fy_kv_resv_t r = {0};
        /* refusals change nothing */
        fy_test_log_begin();
        int32_t bad[33];
        memcpy(bad, kept, sizeof(int32_t) * (size_t)n_kept);
        if (n_kept > 1) {
            assert_int_equal(fy_kvm_seq_place(f.m, &d.bt, bad, n_kept - 1, &r), FY_ERR_INVALID); /* no last */
            bad[0] = kept[1], bad[1] = kept[0];
            assert_int_equal(fy_kvm_seq_place(f.m, &d.bt, bad, n_kept, &r), FY_ERR_INVALID); /* order */
        }
        if (n_kept < nb && slots == want) { /* one more kept block than the slots hold */
            int32_t m = 0, extra = -1;
            for (int32_t i = first; i < nb && extra < 0; i++)
                if (!kept_contains(kept, n_kept, i)) extra = i;
            if (extra >= 0) {
                for (int32_t k = 0, done = 0; k < n_kept; k++) {
                    if (!done && extra < kept[k]) bad[m++] = extra, done = 1;
                    bad[m++] = kept[k];
                }
                assert_int_equal(fy_kvm_seq_place(f.m, &d.bt, bad, m, &r), FY_ERR_INVALID);
            }
        }
        fy_test_log_end();
        assert_int_equal(fy_kvm_n_free(f.m, FY_KV_DEVICE), free_before);
        check_books(&f, (seq_t[]){a, d}, 2);
        assert_int_equal(fy_kvm_seq_place(f.m, &d.bt, kept, n_kept, &r), FY_OK);
        placed++;
        leftover += slots - want;
        for (int32_t i = 0; i < first; i++)
            cached_dropped += !kept_contains(kept, n_kept, i) && fy_block_table_group(&d.bt, 0)[i] < 0;
        fy_kvm_seq_commit(f.m, &d.bt, d.tokens, n, &r); /* what the transfer wrote */
        d.n = n;
        verify(&f, &d);
        for (int32_t g = 0; g < d.bt.n_groups; g++)
            for (int32_t i = d.bt.lo[g]; i < nb; i++)
                if ((fy_block_table_group(&d.bt, g)[i] >= 0) != kept_contains(kept, n_kept, i))
                    fail_msg("round %d: group %d block %d is %s on the receiver", round, g, i,
                             kept_contains(kept, n_kept, i) ? "missing" : "held");
        if (n_ev) assert_true(d.bt.name_limit <= ev[0]);
        check_books(&f, (seq_t[]){a, d}, 2);
        fy_kvm_resv_release(f.m, &r);
        drop(&f, &a);
        drop(&f, &d);
    }
    fprintf(stderr, "%d placements, %d cached blocks dropped, %d slots left over\n", placed, cached_dropped, leftover);
    assert_true(placed == 300 && cached_dropped > 20 && leftover > 100);
    fy_kvm_stats_t st;
    fy_kvm_stats(f.m, &st);
    assert_int_equal(st.tier[FY_KV_DEVICE].used, 0); /* nothing leaked */
    assert_int_equal(fy_kvm_check(f.m), FY_OK);
    fixture_close(&f);
}

static void test_place_kept(void **state) { place_kept(0); }
static void test_place_kept_groups(void **state) { place_kept(1); }

static void test_admission(void **state)
{
    fixture_t f;
    fixture_open(&f, 20, 0, 0, 16);
    assert_int_equal(fy_kvm_blocks_for(f.m, 100, 60, 0), 10);
    assert_int_equal(fy_kvm_blocks_for(f.m, 100, 60, 32), 8);
    fy_kv_resv_t r1 = {0}, r2 = {0}, r3 = {0};
    assert_int_equal(fy_kvm_admit(f.m, 12, &r1), FY_OK);
    assert_int_equal(fy_kvm_admit(f.m, 9, &r2), FY_ERR_NO_SPACE); /* 8 left unpromised */
    assert_int_equal(fy_kvm_admit(f.m, 8, &r2), FY_OK);
    /* an unpromised allocation cannot dip into promises */
    seq_t s = {0};
    s.tenant = 0;
    assert_int_equal(fy_kvm_seq_init(f.m, &s.bt, MAX_TOK, &f.ns[0]), FY_OK);
    assert_int_equal(fy_kvm_seq_reserve(f.m, &s.bt, 16, NULL), FY_ERR_NO_SPACE);
    /* the promised request can take all of its blocks */
    assert_int_equal(fy_kvm_seq_reserve(f.m, &s.bt, 12 * 16, &r1), FY_OK);
    assert_int_equal(r1.blocks, 0);
    fy_kvm_stats_t st;
    fy_kvm_stats(f.m, &st);
    assert_int_equal(st.promised, 8);
    fy_kvm_resv_release(f.m, &r2);
    assert_int_equal(fy_kvm_admit(f.m, 8, &r3), FY_OK);
    fy_kvm_resv_release(f.m, &r3);
    fy_kvm_seq_release(f.m, &s.bt);
    fy_kvm_seq_deinit(&s.bt);
    fy_kvm_resv_release(f.m, &r1);
    fy_kvm_stats(f.m, &st);
    assert_int_equal(st.promised, 0);
    fixture_close(&f);
}

static void test_waste_and_stats(void **state)
{
    fixture_t f;
    fixture_open(&f, 16, 0, 0, 16);
    seq_t s = {0};
    int32_t p[40], hit;
    for (int i = 0; i < 40; i++) p[i] = i;
    prefill(&f, &s, 0, p, 40, &hit); /* 3 blocks, 48 slots, 40 filled */
    fy_kvm_stats_t st;
    fy_kvm_stats(f.m, &st);
    assert_int_equal(st.tier[FY_KV_DEVICE].used, 3);
    assert_float_equal(st.usage, 3.0 / 16, 1e-9);
    assert_float_equal(st.waste, 8.0 / 48, 1e-9);
    assert_int_equal(st.queries, 1);
    assert_int_equal(st.query_tokens, 40);
    drop(&f, &s);
    prefill(&f, &s, 0, p, 40, &hit);
    fy_kvm_stats(f.m, &st);
    assert_int_equal(st.hit_blocks, 2);
    assert_int_equal(st.hit_tokens, 32);
    assert_int_equal(st.tier[FY_KV_DEVICE].hits, 2);
    drop(&f, &s);
    fixture_close(&f);
}

static void test_bad_params(void **state)
{
    fixture_t f;
    fixture_open(&f, 4, 0, 0, 16);
    fy_kvm_params_t p = {.layout = f.ar.lay, .n_device_blocks = 4, .copy = copy_cb, .hasher = f.hasher};
    fy_kvm_t *m;
    fy_test_log_begin();
    p.n_device_blocks = 0;
    assert_int_equal(fy_kvm_create(&p, &m), FY_ERR_INVALID);
    p.n_device_blocks = 4;
    p.disk_dir = "/tmp";
    p.disk_bytes = 1 << 20; /* a disk tier without a host tier */
    assert_int_equal(fy_kvm_create(&p, &m), FY_ERR_INVALID);
    assert_true(fy_test_log_has("disk tier needs a host tier", NULL));
    p.n_ranks = 3; /* a rank group's manager: the disk would hold rank 0's slices only */
    assert_int_equal(fy_kvm_create(&p, &m), FY_ERR_UNSUPPORTED);
    assert_true(fy_test_log_has("a disk tier with 3 ranks", NULL));
    p.n_ranks = 0;
    p.disk_dir = NULL;
    p.watermark = 1.5f;
    assert_int_equal(fy_kvm_create(&p, &m), FY_ERR_INVALID);
    fy_kv_hasher_t *h;
    assert_int_equal(fy_kv_hasher_create((const uint8_t *)"short", 5, &h), FY_ERR_INVALID);
    assert_true(fy_test_log_has("secret must be 16", NULL));
    char buf[64];
    fy_kv_layout_t lay;
    assert_int_equal(fy_kv_layout_init(&lay, 1, 1, 4, 12, FY_DTYPE_F32), FY_ERR_INVALID);
    (void)buf;
    fy_test_log_end();
    /* allocation failure at every step of creation unwinds */
    p.watermark = 0;
    for (int n = 1; n < 100; n++) {
        fy_mem_fail_after(n);
        fy_test_log_begin();
        fy_status_t st = fy_kvm_create(&p, &m);
        fy_test_log_end();
        fy_mem_fail_after(0);
        if (st == FY_OK) {
            fy_kvm_destroy(m);
            break;
        }
        assert_int_equal(st, FY_ERR_NOMEM);
    }
    fixture_close(&f);
}

static int teardown(void **state)
{
    fy_test_tmpdir_remove();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tenant_isolation),       cmocka_unit_test(test_lru_order),
        cmocka_unit_test(test_copy_on_write),          cmocka_unit_test(test_tiers),
        cmocka_unit_test(test_disk_tier_planted_link), cmocka_unit_test(test_disk_tier_corruption),
        cmocka_unit_test(test_disk_dir_refusals),      cmocka_unit_test(test_admission),
        cmocka_unit_test(test_waste_and_stats),        cmocka_unit_test(test_bad_params),
        cmocka_unit_test(test_random_operations),      cmocka_unit_test(test_random_operations_groups),
        cmocka_unit_test(test_groups_layout),          cmocka_unit_test(test_groups_window_and_promise),
        cmocka_unit_test(test_groups_prefix),          cmocka_unit_test(test_evict_blocks),
        cmocka_unit_test(test_evicted_kv_never_named), cmocka_unit_test(test_place_kept),
        cmocka_unit_test(test_place_kept_groups),
    };
    return cmocka_run_group_tests(tests, NULL, teardown);
}

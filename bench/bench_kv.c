/*
 * bench_kv.c - `ferry bench-kv`: the block manager's own figures.
 *   waste: 1,000 sequences of lengths uniform in 1..2048, paged at block
 *          sizes 8, 16, 32, against reserving a contiguous 2,048-token
 *          region per request;
 *   speed: blocks allocated and freed per second; prefix lookup of a
 *          32,768-token prompt that is all cached, and one that is not.
 * Only block ids move here (no KV bytes): this measures the manager.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tools/cli.h"
#include "common/clock.h"
#include "tools/commands.h"
#include "kv/kv.h"
#include "common/log.h"
#include "common/mem.h"
#include "bench/stats.h"

static fy_status_t no_copy(void *arg, fy_kv_tier_t dt, const int32_t *d, fy_kv_tier_t st, const int32_t *s, int32_t n)
{
    return FY_OK; /* no bytes in this benchmark: nothing is shared or swapped */
}

static uint64_t next(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

static fy_status_t make(const fy_kv_hasher_t *h, int bs, int32_t blocks, bool caching, fy_kvm_t **m_p)
{
    fy_kvm_params_t p = {.n_device_blocks = blocks, .copy = no_copy, .hasher = h, .prefix_caching = caching};
    /* SmolLM2-135M's KV shape, f16 */
    fy_status_t st = fy_kv_layout_init(&p.layout, 30, 3, 64, bs, FY_DTYPE_F16);
    return st ? st : fy_kvm_create(&p, m_p);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: ferry bench-kv\n"
               "  the block manager on 1,000 sequences: memory waste by block size, allocation and\n"
               "  prefix-lookup speed; it takes no options\n"
               "  -h, --help\n");
}

int fy_cmd_bench_kv(int argc, char **argv)
{
    static const struct option opts[] = {{"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (c == 'h') {
            usage(stdout);
            return 0;
        }
        usage(stderr);
        return 2;
    }
    if (!fy_cli_no_operands("bench-kv", argc, argv, usage)) return 2;
    fy_kv_hasher_t *h;
    if (fy_kv_hasher_create_random(&h) != FY_OK) return 1;
    int rc = 1;
    enum { N_SEQ = 1000, MAX_LEN = 2048 };
    static int32_t lens[N_SEQ];
    uint64_t seed = 42;
    int64_t used = 0;
    for (int i = 0; i < N_SEQ; i++) used += lens[i] = 1 + (int32_t)(next(&seed) % MAX_LEN);
    int32_t *tokens = fy_calloc(32768, sizeof(int32_t));
    fy_block_table_t *bts = fy_calloc(N_SEQ, sizeof(*bts));
    if (!tokens || !bts) goto out;

    printf("ferry bench-kv: 1,000 sequences, lengths uniform in 1..2048 (mean %.0f tokens)\n\n", (double)used / N_SEQ);
    printf("| block size | paged waste | contiguous 2048-token reservation waste |\n|---:|---:|---:|\n");
    for (int bs = 8; bs <= 32; bs *= 2) {
        fy_kvm_t *m;
        if (make(h, bs, N_SEQ * (MAX_LEN / bs), false, &m) != FY_OK) goto out;
        for (int i = 0; i < N_SEQ; i++) {
            if (fy_kvm_seq_init(m, &bts[i], MAX_LEN, NULL) || fy_kvm_seq_reserve(m, &bts[i], lens[i], NULL)) {
                fy_kvm_destroy(m);
                goto out;
            }
            fy_kvm_seq_commit(m, &bts[i], tokens, lens[i], NULL);
        }
        fy_kvm_stats_t st;
        fy_kvm_stats(m, &st);
        double contiguous = 1.0 - (double)used / ((double)N_SEQ * MAX_LEN);
        printf("| %d | %.2f%% | %.1f%% |\n", bs, 100.0 * st.waste, 100.0 * contiguous);
        for (int i = 0; i < N_SEQ; i++) {
            fy_kvm_seq_release(m, &bts[i]);
            fy_kvm_seq_deinit(&bts[i]);
        }
        fy_kvm_destroy(m);
    }

    /* allocation: a table grows one block per call, then gives all back */
    {
        enum { BLOCKS = 4096, ROUNDS = 2000 };
        fy_kvm_t *m;
        fy_block_table_t bt;
        if (make(h, 16, BLOCKS, false, &m) != FY_OK) goto out;
        if (fy_kvm_seq_init(m, &bt, BLOCKS * 16, NULL) != FY_OK) {
            fy_kvm_destroy(m);
            goto out;
        }
        double t = fy_now_s();
        for (int r = 0; r < ROUNDS; r++) {
            for (int b = 1; b <= BLOCKS; b++) fy_kvm_seq_reserve(m, &bt, b * 16, NULL);
            fy_kvm_seq_release(m, &bt);
        }
        t = fy_now_s() - t;
        printf("\nallocate + free: %.1f million blocks/s (%d rounds of %d blocks, one block per reserve call)\n",
               (double)BLOCKS * ROUNDS / t / 1e6, ROUNDS, BLOCKS);
        fy_kvm_seq_deinit(&bt);
        fy_kvm_destroy(m);
    }

    /* prefix lookup of a 32,768-token prompt */
    {
        fy_kvm_t *m;
        fy_block_table_t bt;
        fy_kv_ns_t ns, other;
        if (make(h, 16, 4096, true, &m) != FY_OK) goto out;
        fy_kv_ns_make(h, "tenant", "model", fy_kvm_layout(m), NULL, &ns);
        fy_kv_ns_make(h, "another tenant", "model", fy_kvm_layout(m), NULL, &other);
        for (int i = 0; i < 32768; i++) tokens[i] = (int32_t)(next(&seed) % 49152);
        if (fy_kvm_seq_init(m, &bt, 32768, &ns) || fy_kvm_seq_reserve(m, &bt, 32768, NULL)) {
            fy_kvm_destroy(m);
            goto out;
        }
        fy_kvm_seq_commit(m, &bt, tokens, 32768, NULL);
        fy_kvm_seq_release(m, &bt);
        enum { REPS = 200 };
        double hit_t[REPS], miss_t[REPS];
        int32_t hit = 0, miss = 0;
        for (int r = 0; r < REPS; r++) {
            bt.ns = ns;
            double t = fy_now_s();
            fy_kvm_seq_lookup(m, &bt, tokens, 32768, &hit);
            hit_t[r] = fy_now_s() - t;
            fy_kvm_seq_release(m, &bt);
            bt.ns = other;
            t = fy_now_s();
            fy_kvm_seq_lookup(m, &bt, tokens, 32768, &miss);
            miss_t[r] = fy_now_s() - t;
            fy_kvm_seq_release(m, &bt);
        }
        qsort(hit_t, REPS, sizeof(double), cmp_double);
        qsort(miss_t, REPS, sizeof(double), cmp_double);
        printf("prefix lookup, 32,768-token prompt: all cached (%d tokens found, 2,047 keyed hashes): median %.3f ms, "
               "p99 %.3f ms; other tenant (%d found): median %.4f ms\n",
               hit, hit_t[REPS / 2] * 1e3, hit_t[REPS * 99 / 100] * 1e3, miss, miss_t[REPS / 2] * 1e3);
        fy_kvm_seq_deinit(&bt);
        fy_kvm_destroy(m);
    }
    rc = 0;
out:
    if (rc) fprintf(stderr, "ferry: bench-kv failed\n");
    fy_free(tokens);
    fy_free(bts);
    fy_kv_hasher_destroy(h);
    return rc;
}

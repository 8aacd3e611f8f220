/*
 * bench_ranks.c - `ferry bench-ranks`: a sharded forward pass on this
 * host.  For each shape (tp x pp, default 1x1, 3x1, 1x2, 3x2) in one run:
 * an engine stack of that many ranks, a prompt of P tokens prefilled in
 * one pass, then N greedy decode steps through the runner; prefill and
 * decode tokens per second, the ratio to the first shape's, and each
 * rank's time split (compute, the tensor ranks' gathers or reductions,
 * waiting on the previous stage: pipeline bubbles, handing activations
 * on) in the prefill pass and per decode step.  Shapes run in turn, reps times
 * round, the best rep kept, so a neighbour's load moves every shape alike.
 *
 * On a CPU whose ranks share cores this shows what splitting costs, not a
 * speed-up: the threads are split among the ranks (--threads in all).
 * Not here: the collectives alone (bench-group).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tools/cli.h"
#include "common/clock.h"
#include "tools/commands.h"
#include "engine/engine_config.h"
#include "common/log.h"
#include "common/mem.h"
#include "model/model.h"
#include "engine/runner.h"
#include "bench/stats.h"

enum { MAX_SHAPES = 8, MAX_RANKS = 64 };

static void usage(FILE *f)
{
    fprintf(f, "usage: ferry bench-ranks [-m MODEL] [options]\n"
               "  a sharded forward pass: prefill and decode tok/s and each rank's step split, per shape\n"
               "  -m, --model PATH      the model (default " FY_CLI_DEFAULT_MODEL ")\n"
               "      --shapes LIST     tp x pp shapes, e.g. 1x1,3x1,1x2,3x2 (the default; the first is the baseline)\n"
               "  -p, --prompt N        prompt tokens, one prefill pass (default 128)\n"
               "  -n, --tokens N        decode steps (default 64)\n"
               "  -t, --threads N       CPU threads in all, split among the ranks (default 2)\n"
               "      --reps N          rounds over the shapes, the best kept (default 3)\n"
               "      --partial-sums    tp ranks add partial projections (tp_partial_sums) instead of gathering\n"
               "  -h, --help\n");
}

typedef struct shape_result {
    double prefill_tps, decode_tps;
    fy_runner_timing_t t[MAX_RANKS];  /* decode only */
    fy_runner_timing_t pt[MAX_RANKS]; /* the prefill pass of the same rep */
    int n_ranks;
} shape_result_t;

/* One rep of one shape into res (kept when its decode is the best yet). */
static int run_shape(const fy_model_t *m, int tp, int pp, int n_prompt, int n_tokens, int threads, bool partial,
                     shape_result_t *res)
{
    const fy_model_config_t *c = fy_model_config(m);
    fy_engine_build_t b;
    fy_engine_build_default(&b);
    b.threads = threads;
    b.no_engine = true;
    b.prefix_caching = false;
    fy_runner_params_t *rp = &b.runner;
    rp->max_batch_tokens = n_prompt;
    rp->max_seqs = 1;
    rp->max_logits = 1;
    rp->max_ctx = n_prompt + n_tokens + 1;
    rp->block_size = 16;
    rp->n_kv_blocks = (rp->max_ctx + 15) / 16;
    rp->tp = tp;
    rp->pp = pp;
    rp->tp_partial_sums = partial;
    fy_engine_stack_t s;
    if (fy_engine_stack_create(m, &b, &s) != FY_OK) return 1;
    int rc = 1;
    int n_ranks = fy_runner_n_ranks(s.runner);
    float *logits = fy_malloc(sizeof(float) * (size_t)c->vocab_size);
    int32_t *tok = fy_calloc((size_t)(n_prompt + n_tokens + 1), sizeof(int32_t));
    fy_block_table_t bt;
    bool bt_open = false;
    fy_runner_timing_t t[MAX_RANKS], pt[MAX_RANKS];
    if (!logits || !tok || fy_kvm_seq_init(s.kvm, &bt, rp->max_ctx, NULL) != FY_OK) goto out;
    bt_open = true;
    for (int i = 0; i < n_prompt; i++) tok[i] = 100 + (i * 37) % (c->vocab_size - 200);
    double t0 = fy_now_s(), t1 = 0;
    for (int done = 0; done < n_prompt + n_tokens;) {
        int k = done == 0 ? n_prompt : 1;
        if (fy_kvm_seq_reserve(s.kvm, &bt, done + k, NULL) != FY_OK) goto out;
        fy_forward_seq_t f = {&bt, tok + done, k, done, 1, NULL};
        if (fy_runner_forward(s.runner, &f, 1, logits) != FY_OK) goto out;
        int best = 0;
        for (int v = 1; v < c->vocab_size; v++)
            if (logits[v] > logits[best]) best = v;
        done += k;
        fy_kvm_seq_commit(s.kvm, &bt, tok, done, NULL);
        tok[done] = best;
        if (done == n_prompt) { /* the decode steps' counters from zero */
            t1 = fy_now_s();
            if (fy_runner_timing(s.runner, pt, n_ranks, true) != FY_OK) goto out;
        }
    }
    double t2 = fy_now_s();
    if (fy_runner_timing(s.runner, t, n_ranks, false) != FY_OK) goto out;
    double dtps = n_tokens / (t2 - t1);
    if (dtps > res->decode_tps) {
        res->decode_tps = dtps;
        res->prefill_tps = n_prompt / (t1 - t0);
        res->n_ranks = n_ranks;
        memcpy(res->t, t, sizeof(t[0]) * (size_t)n_ranks);
        memcpy(res->pt, pt, sizeof(pt[0]) * (size_t)n_ranks);
    }
    rc = 0;
out:
    if (bt_open) {
        fy_kvm_seq_release(s.kvm, &bt);
        fy_kvm_seq_deinit(&bt);
    }
    fy_free(logits);
    fy_free(tok);
    fy_engine_stack_destroy(&s);
    return rc;
}

int fy_cmd_bench_ranks(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},
        {"shapes", required_argument, 0, 'S'},
        {"prompt", required_argument, 0, 'p'},
        {"tokens", required_argument, 0, 'n'},
        {"threads", required_argument, 0, 't'},
        {"reps", required_argument, 0, 'r'},
        {"partial-sums", no_argument, 0, 'P'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *model = FY_CLI_DEFAULT_MODEL, *shapes = "1x1,3x1,1x2,3x2";
    long n_prompt = 128, n_tokens = 64, threads = 2, reps = 3;
    bool partial = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:p:n:t:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'S': shapes = optarg; break;
        case 'p':
            if (!fy_cli_parse_int("--prompt", optarg, 1, 4096, &n_prompt)) return 2;
            break;
        case 'n':
            if (!fy_cli_parse_int("--tokens", optarg, 1, 4096, &n_tokens)) return 2;
            break;
        case 't':
            if (!fy_cli_parse_int("--threads", optarg, 1, 256, &threads)) return 2;
            break;
        case 'r':
            if (!fy_cli_parse_int("--reps", optarg, 1, 100, &reps)) return 2;
            break;
        case 'P': partial = true; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!fy_cli_no_operands("bench-ranks", argc, argv, usage)) return 2;
    int tp[MAX_SHAPES], pp[MAX_SHAPES], n = 0;
    for (const char *s = shapes; *s;) {
        int a, b2, used;
        if (n == MAX_SHAPES || sscanf(s, "%dx%d%n", &a, &b2, &used) != 2 || a < 1 || b2 < 1 || a * b2 > MAX_RANKS ||
            (s[used] && s[used] != ',')) {
            fprintf(stderr, "ferry: --shapes expects up to %d TPxPP items like 1x1,3x1,1x2, got '%s'\n", MAX_SHAPES,
                    shapes);
            return 2;
        }
        tp[n] = a, pp[n++] = b2;
        s += used + (s[used] == ',');
    }
    fy_model_t *m = NULL;
    if (fy_model_load(model, &m) != FY_OK) return 1;
    shape_result_t *res = fy_calloc((size_t)n, sizeof(*res));
    int rc = res ? 0 : 1;
    for (long r = 0; r < reps && !rc; r++)
        for (int k = 0; k < n && !rc; k++)
            rc = run_shape(m, tp[k], pp[k], (int)n_prompt, (int)n_tokens, (int)threads, partial, &res[k]);
    if (!rc) {
        char desc[256];
        fy_model_describe(m, desc, sizeof(desc));
        printf("model: %s\n%ld prompt tokens, %ld decode steps, %ld threads in all, best of %ld%s\n\n", desc, n_prompt,
               n_tokens, threads, reps, partial ? ", partial sums" : "");
        printf("| shape | ranks | prefill tok/s | decode tok/s | decode vs %dx%d |\n|---|---|---|---|---|\n", tp[0],
               pp[0]);
        for (int k = 0; k < n; k++)
            printf("| tp %d x pp %d | %d | %.1f | %.1f | %.2fx |\n", tp[k], pp[k], res[k].n_ranks, res[k].prefill_tps,
                   res[k].decode_tps, res[k].decode_tps / res[0].decode_tps);
        for (int ph = 0; ph < 2; ph++) {
            printf(ph ? "\nper decode step, ms (compute / gather or reduce / wait: bubbles / send):\n"
                      : "\nthe prefill pass, ms (compute / gather or reduce / wait: bubbles / send):\n");
            for (int k = 0; k < n; k++) {
                printf("tp %d x pp %d:", tp[k], pp[k]);
                for (int q = 0; q < res[k].n_ranks; q++) {
                    const fy_runner_timing_t *t = ph ? &res[k].t[q] : &res[k].pt[q];
                    double f = t->forwards ? 1e-6 / (double)t->forwards : 0;
                    printf("  r%d %.2f/%.2f/%.2f/%.2f", q, (double)t->compute_ns * f, (double)t->allreduce_ns * f,
                           (double)t->wait_ns * f, (double)t->send_ns * f);
                }
                printf("\n");
            }
        }
    }
    fy_free(res);
    fy_model_destroy(m);
    return rc;
}

/*
 * bench_batch.c - `ferry bench-batch`: decode throughput and inter-token
 * latency of the serving engine at batch sizes 1, 2, 4, ... on one model.
 *
 * For each batch size B, B requests with random prompts of the same length
 * are submitted together (greedy, end of turn ignored, the same number of
 * output tokens), and the engine is stepped until they finish.  The
 * figures cover the steady state only: from the moment the last request
 * got its first token to the moment the first one finished, when every
 * step decodes exactly B tokens.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/backend.h"
#include "tools/cli.h"
#include "common/clock.h"
#include "tools/commands.h"
#include "engine/engine.h"
#include "engine/engine_config.h"
#include "kv/kv.h"
#include "common/log.h"
#include "common/mem.h"
#include "model/model.h"
#include "engine/runner.h"
#include "bench/stats.h"

#define MAX_BATCHES 16

typedef struct track {
    double *t; /* time of each token */
    int32_t n, cap;
    bool done;
} track_t;

static void on_event(void *arg, const fy_event_t *ev)
{
    track_t *k = arg;
    if (ev->kind == FY_EVENT_TOKEN && k->n < k->cap) k->t[k->n++] = fy_now_s();
    if (ev->kind != FY_EVENT_TOKEN) k->done = true;
    if (ev->kind == FY_EVENT_ERROR) fprintf(stderr, "ferry: bench-batch: request failed: %s\n", ev->message);
}

typedef struct row {
    int batch;
    double tps, itl_mean, itl_p50, itl_p95;
    int steps;
    double wall_s;             /* the steady state's steps */
    fy_backend_profile_t prof; /* the steady state's steps */
} row_t;

static int cmp_row_tps(const void *a, const void *b)
{
    return cmp_double(&((const row_t *)a)->tps, &((const row_t *)b)->tps);
}

static fy_status_t run_batch(const fy_model_t *m, int threads, const char *isa, int B, int prompt_len, int gen,
                             bool profile, row_t *row)
{
    const fy_model_config_t *c = fy_model_config(m);
    fy_engine_stack_t s = {0};
    fy_backend_t *be = NULL;
    fy_engine_t *e = NULL;
    track_t *tr = fy_calloc((size_t)B, sizeof(track_t));
    double *itls = fy_malloc((size_t)B * (size_t)gen * sizeof(double));
    int32_t *prompt = fy_malloc((size_t)prompt_len * sizeof(int32_t));
    fy_status_t st = FY_ERR_NOMEM;
    if (!tr || !itls || !prompt) goto out;
    fy_engine_build_t eb;
    fy_engine_build_default(&eb);
    eb.threads = threads;
    eb.isa = isa;
    fy_runner_params_t *rp = &eb.runner;
    rp->max_seqs = rp->max_logits = B;
    rp->max_batch_tokens = 512 > B ? 512 : B;
    rp->max_ctx = prompt_len + gen + 1;
    /* B requests of the whole context admitted at once (watermark 0, below) */
    if ((rp->n_kv_blocks = fy_runner_pool_blocks(m, 0, rp, rp->max_ctx, B, rp->max_batch_tokens, 0)) < 1) {
        st = FY_ERR_INVALID;
        goto out;
    }
    eb.prefix_caching = false; /* every prompt is computed */
    eb.watermark = 0;
    eb.engine.max_num_seqs = B;
    eb.engine.max_num_batched_tokens = rp->max_batch_tokens;
    eb.engine.max_waiting = B;
    if ((st = fy_engine_stack_create(m, &eb, &s))) goto out;
    be = s.be;
    e = s.engine;
    uint64_t seed = 99;
    for (int b = 0; b < B; b++) {
        for (int i = 0; i < prompt_len; i++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            prompt[i] = (int32_t)((seed >> 33) % (uint64_t)c->vocab_size);
        }
        tr[b].cap = gen;
        tr[b].t = itls + (size_t)b * (size_t)gen;
        fy_genspec_t req;
        fy_genspec_default(&req);
        req.max_tokens = gen;
        req.ignore_eos = true;
        uint64_t id;
        if ((st = fy_engine_submit(e, prompt, prompt_len, &req, NULL, on_event, &tr[b], &id))) goto out;
    }
    /* the profile covers the steady state only: from the step after the
     * last request's first token to the step in which one finishes (the
     * prompts' prefill chunks would otherwise dominate it at long prompts) */
    double w0 = 0;
    bool steady = false, ended = false;
    while (!fy_engine_idle(e)) {
        if ((st = fy_engine_step(e))) goto out;
        bool all_started = true, any_done = false;
        for (int b = 0; b < B; b++) all_started &= tr[b].n > 0, any_done |= tr[b].done;
        if (any_done && steady && !ended) {
            row->wall_s = fy_now_s() - w0;
            fy_backend_profile_get(be, &row->prof);
            ended = true;
        }
        if (all_started && !any_done && !steady) {
            steady = true;
            fy_backend_profile_enable(be, profile);
            w0 = fy_now_s();
        }
    }
    /* steady state: after the last first token, before the first last one */
    double t0 = 0, t1 = 1e300;
    for (int b = 0; b < B; b++) {
        if (tr[b].n < 2) {
            st = FY_ERR_INTERNAL;
            goto out;
        }
        if (tr[b].t[0] > t0) t0 = tr[b].t[0];
        if (tr[b].t[tr[b].n - 1] < t1) t1 = tr[b].t[tr[b].n - 1];
    }
    int64_t tokens = 0, n_itl = 0;
    double sum = 0;
    double *gaps = fy_malloc((size_t)B * (size_t)gen * sizeof(double));
    if (!gaps) goto out;
    for (int b = 0; b < B; b++) {
        for (int i = 1; i < tr[b].n; i++) {
            if (tr[b].t[i - 1] < t0 || tr[b].t[i] > t1) continue;
            tokens++;
            sum += gaps[n_itl++] = tr[b].t[i] - tr[b].t[i - 1];
        }
    }
    if (!ended || t1 <= t0 || n_itl < B) {
        /* the first request finished before the last one's first token:
         * every step mixed prefill chunks in, there is no decode-only window;
         * the prompts take about B * prompt / (512 - B) steps (the token
         * budget less the decoding requests' tokens) */
        fprintf(stderr,
                "ferry: bench-batch: batch %d: no steady state (a request finished before the last one started "
                "decoding); raise --gen-tokens above about %d\n",
                B, (int)(((int64_t)B * prompt_len + 511 - B) / (512 > 2 * B ? 512 - B : B)) + 16);
        fy_free(gaps);
        st = FY_ERR_INVALID;
        goto out;
    }
    qsort(gaps, (size_t)n_itl, sizeof(double), cmp_double);
    row->batch = B;
    row->tps = t1 > t0 ? (double)tokens / (t1 - t0) : 0;
    row->itl_mean = n_itl ? sum / (double)n_itl : 0;
    row->itl_p50 = n_itl ? gaps[n_itl / 2] : 0;
    row->itl_p95 = n_itl ? gaps[(n_itl * 95) / 100] : 0;
    row->steps = (int)(n_itl / B);
    fy_free(gaps);
    st = FY_OK;
out:
    fy_engine_stack_destroy(&s);
    fy_free(tr);
    fy_free(itls);
    fy_free(prompt);
    return st;
}

static void usage(FILE *f)
{
    fprintf(
        f, "usage: ferry bench-batch [-m MODEL] [--batches 1,2,4,8,16,32,64] [--prompt-tokens 64] [--gen-tokens 64]\n"
           "                         [--threads N] [--reps 1] [--isa auto|avx512vnni|avxvnni|avx2|scalar] [--profile]\n"
           "  continuous-batching decode throughput and inter-token latency at each batch size\n"
           "  -m, --model PATH       .gguf file or Hugging Face folder (default " FY_CLI_DEFAULT_MODEL ")\n"
           "      --batches LIST     batch sizes, comma-separated\n"
           "      --prompt-tokens N  each request's prompt (default 64)\n"
           "      --gen-tokens N     each request's output (default 64)\n"
           "  -t, --threads N        CPU threads (default: one per core)\n"
           "      --reps N           runs per batch size; the median is kept (default 1)\n"
           "      --isa NAME         CPU kernels (default auto)\n"
           "      --profile          where the steady state's time went, by op\n"
           "  -h, --help\n");
}

int fy_cmd_bench_batch(int argc, char **argv)
{
    enum { O_BATCHES = 256, O_PROMPT, O_GEN, O_REPS, O_ISA, O_PROFILE };
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},
        {"batches", required_argument, 0, O_BATCHES},
        {"prompt-tokens", required_argument, 0, O_PROMPT},
        {"gen-tokens", required_argument, 0, O_GEN},
        {"reps", required_argument, 0, O_REPS},
        {"isa", required_argument, 0, O_ISA},
        {"profile", no_argument, 0, O_PROFILE},
        {"threads", required_argument, 0, 't'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *model = FY_CLI_DEFAULT_MODEL;
    int batches[MAX_BATCHES] = {1, 2, 4, 8, 16, 32, 64}, n_batches = 7;
    long prompt_len = 64, gen = 64, threads = 0, reps = 1;
    const char *isa = NULL;
    bool profile = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:t:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case O_BATCHES:
            if (!fy_cli_parse_int_list("--batches", optarg, 1, 1024, batches, MAX_BATCHES, &n_batches)) return 2;
            break;
        case O_PROMPT:
            if (!fy_cli_parse_int("--prompt-tokens", optarg, 1, 8192, &prompt_len)) return 2;
            break;
        case O_GEN:
            if (!fy_cli_parse_int("--gen-tokens", optarg, 4, 8192, &gen)) return 2;
            break;
        case O_REPS:
            if (!fy_cli_parse_int("--reps", optarg, 1, 100, &reps)) return 2;
            break;
        case O_ISA: isa = optarg; break;
        case O_PROFILE: profile = true; break;
        case 't':
            if (!fy_cli_parse_int("--threads", optarg, 1, 256, &threads)) return 2;
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!fy_cli_no_operands("bench-batch", argc, argv, usage)) return 2;
    fy_model_t *m;
    if (fy_model_load(model, &m) != FY_OK) return 1;
    time_t now = time(NULL);
    char date[32];
    strftime(date, sizeof(date), "%Y-%m-%d", gmtime(&now));
    printf("ferry bench-batch, %s: decode at batch B, prompts of %ld tokens, %ld output tokens each, steady state, "
           "median of %ld\n\n",
           date, prompt_len, gen, reps);
    printf("| batch | decode tok/s | vs batch 1 | ITL mean ms | ITL p50 ms | ITL p95 ms |\n");
    printf("|---:|---:|---:|---:|---:|---:|\n");
    double base = 0;
    int rc = 0;
    for (int i = 0; i < n_batches; i++) {
        /* the repetition with the median throughput */
        row_t runs[100], row;
        for (long k = 0; k < reps && !rc; k++) {
            memset(&runs[k], 0, sizeof(runs[k]));
            if (run_batch(m, (int)threads, isa, batches[i], (int)prompt_len, (int)gen, profile, &runs[k]) != FY_OK)
                rc = 1;
        }
        if (rc) break;
        qsort(runs, (size_t)reps, sizeof(row_t), cmp_row_tps);
        row = runs[reps / 2];
        if (i == 0) base = row.tps;
        printf("| %d | %.1f | %.2fx | %.2f | %.2f | %.2f |\n", row.batch, row.tps, base > 0 ? row.tps / base : 0,
               row.itl_mean * 1e3, row.itl_p50 * 1e3, row.itl_p95 * 1e3);
        if (profile) { /* where the steady state went: ops, and the rest (engine, sampling) */
            uint64_t ops = 0;
            printf("|   | ");
            for (int op = 0; op < FY_OP_COUNT; op++) {
                ops += row.prof.ns[op];
                if (row.prof.ns[op] > row.wall_s * 1e9 * 0.01)
                    printf("%s %.0f%%, ", fy_backend_op_name((fy_backend_op_t)op),
                           100.0 * row.prof.ns[op] / (row.wall_s * 1e9));
            }
            printf("outside ops %.0f%% |\n", 100.0 * (1.0 - ops / (row.wall_s * 1e9)));
        }
        fflush(stdout);
    }
    fy_model_destroy(m);
    return rc;
}

/*
 * bench_window.c - `ferry bench-window`: what sliding-window KV groups give
 * back.  For each context length, one request runs through the real model
 * (its prompt in chunks as the engine prefills, then decode steps), once
 * with the layers in KV groups (kv.sliding_groups = true: a sliding group
 * drops the blocks before its window) and once with one table for every
 * layer (false).  Reported per request: the KV bytes held at the end
 * (decoding), the peak while it ran, and what admission promises it; then
 * how many such requests a fixed kv_mem admits at once (fy_kvm_admit until
 * it refuses).  The last logits of the two runs are compared: the groups
 * change where K/V live, never what attention reads.
 *
 * Not here: throughput (ferry bench), or a model without sliding layers
 * (both runs are then the same layout, and the tool says so).
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "kv/kv.h"
#include "common/log.h"
#include "common/mem.h"
#include "model/model.h"
#include "engine/runner.h"
#include "common/size.h"

typedef struct window_run {
    int64_t held_end, held_peak, promised; /* bytes */
    int32_t n_groups, admitted;
    float last_logit_max; /* the last position's largest logit */
    int32_t last_argmax;
} window_run_t;

static void usage(FILE *f)
{
    fprintf(f, "usage: ferry bench-window -m FILE [--context N,N,...] [--kv-mem SIZE] [--chunk N] [--decode N]\n"
               "                          [--threads N]\n"
               "  KV bytes a request holds with sliding-window layers in KV groups of their own and with\n"
               "  every block kept, and the requests a fixed kv_mem admits\n"
               "  -m, --model FILE   a model with sliding-window layers (Gemma 3, Mistral)\n"
               "  --context LIST     prompt tokens per request (default 1024,4096,8192)\n"
               "  --kv-mem SIZE      the budget admission is counted against (default 256MiB)\n"
               "  --chunk N          prompt tokens per forward pass (default 512, the engine's)\n"
               "  --decode N         decode steps after the prompt (default 16)\n"
               "  --threads N        CPU threads (default 2)\n"
               "  -h, --help\n");
}

/* Device bytes in use: used blocks times the page size. */
static int64_t used_bytes(const fy_kvm_t *m)
{
    fy_kvm_stats_t st;
    fy_kvm_stats(m, &st);
    return (int64_t)st.tier[FY_KV_DEVICE].used * (int64_t)fy_kvm_layout(m)->block_bytes;
}

static fy_status_t run_one(const fy_model_t *model, fy_backend_t *be, bool groups, int32_t context, int32_t chunk,
                           int32_t n_decode, int64_t kv_mem, window_run_t *out)
{
    const fy_model_config_t *c = fy_model_config(model);
    int32_t total = context + n_decode;
    fy_runner_params_t rp;
    fy_runner_params_default(&rp);
    rp.max_batch_tokens = chunk;
    rp.max_seqs = 1;
    rp.max_logits = 1;
    rp.max_ctx = total;
    rp.kv_one_group = !groups;
    fy_kv_layout_t lay;
    fy_status_t st = fy_runner_layout_for(model, c->n_layers, &rp, &lay);
    if (st) return st;
    /* the arena holds this one request with every block kept, and the
     * admission count below uses a kvm of kv_mem */
    int64_t pages = ((int64_t)total + lay.block_size - 1) / lay.block_size * lay.n_groups;
    rp.n_kv_blocks = (int32_t)(pages / lay.n_groups);
    fy_runner_t *r = NULL;
    fy_kv_hasher_t *h = NULL;
    fy_kvm_t *m = NULL, *budget = NULL;
    int32_t *tok = fy_malloc((size_t)total * sizeof(int32_t));
    float *logits = fy_malloc((size_t)c->vocab_size * sizeof(float));
    fy_block_table_t bt = {0};
    fy_kv_resv_t resv = {0};
    if (!tok || !logits) {
        st = FY_ERR_NOMEM;
        goto done;
    }
    if ((st = fy_runner_create(model, be, &rp, &r)) || (st = fy_kv_hasher_create_random(&h))) goto done;
    fy_kvm_params_t kp;
    fy_runner_kvm_params(r, &kp);
    kp.hasher = h;
    kp.prefix_caching = false;
    kp.watermark = 0;
    if ((st = fy_kvm_create(&kp, &m))) goto done;
    /* the promise, and how many such promises kv_mem holds */
    int32_t need = fy_kvm_blocks_for(m, context, n_decode, 0);
    out->promised = (int64_t)need * (int64_t)lay.block_bytes;
    kp.n_device_blocks = (int32_t)(kv_mem / (int64_t)lay.block_bytes);
    if (kp.n_device_blocks < 1 || (st = fy_kvm_create(&kp, &budget))) {
        if (!st) st = FY_ERR_INVALID;
        goto done;
    }
    out->admitted = 0;
    for (fy_kv_resv_t r1 = {0}; fy_kvm_admit(budget, need, &r1) == FY_OK; r1.blocks = 0) out->admitted++;
    if ((st = fy_kvm_admit(m, need, &resv))) {
        fy_error("bench-window: the arena of %lld pages does not admit its own request of %d", (long long)pages, need);
        goto done;
    }
    /* a fixed pseudo-random prompt; greedy decode */
    uint64_t s = 20261123;
    for (int32_t i = 0; i < context; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (int32_t)((s >> 33) % (uint64_t)(c->vocab_size - 10)) + 5;
    }
    if ((st = fy_kvm_seq_init(m, &bt, total, NULL))) goto done;
    out->held_peak = 0;
    for (int32_t n = 0; n < total;) {
        int32_t k = n < context ? (context - n < chunk ? context - n : chunk) : 1;
        bool last = n + k >= context;
        if ((st = fy_kvm_seq_reserve(m, &bt, n + k, &resv))) {
            fy_error("bench-window: no blocks at %d + %d tokens within the promise", n, k);
            goto done;
        }
        int64_t used = used_bytes(m);
        if (used > out->held_peak) out->held_peak = used;
        fy_forward_seq_t f = {&bt, tok + n, k, n, last ? 1 : 0, NULL};
        if ((st = fy_runner_forward(r, &f, 1, logits))) goto done;
        n += k;
        fy_kvm_seq_commit(m, &bt, tok, n, &resv);
        if (last && n < total) { /* greedy: the next token */
            int32_t best = 0;
            for (int32_t v = 1; v < c->vocab_size; v++)
                if (logits[v] > logits[best]) best = v;
            tok[n] = best;
            out->last_argmax = best;
            out->last_logit_max = logits[best];
        }
    }
    out->held_end = used_bytes(m);
    out->n_groups = lay.n_groups;
done:
    if (bt.blocks) {
        fy_kvm_seq_release(m, &bt);
        fy_kvm_seq_deinit(&bt);
    }
    if (m) fy_kvm_resv_release(m, &resv);
    fy_kvm_destroy(budget);
    fy_kvm_destroy(m);
    fy_kv_hasher_destroy(h);
    fy_runner_destroy(r);
    fy_free(tok);
    fy_free(logits);
    return st;
}

int fy_cmd_bench_window(int argc, char **argv)
{
    const char *model_path = NULL;
    int ctx[16] = {1024, 4096, 8192}, n_ctx = 3;
    long chunk = 512, n_decode = 16, threads = 2;
    int64_t kv_mem = INT64_C(256) << 20;
    enum { O_CONTEXT = 256, O_KV_MEM, O_CHUNK, O_DECODE, O_THREADS };
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},
        {"context", required_argument, 0, O_CONTEXT},
        {"kv-mem", required_argument, 0, O_KV_MEM},
        {"chunk", required_argument, 0, O_CHUNK},
        {"decode", required_argument, 0, O_DECODE},
        {"threads", required_argument, 0, O_THREADS},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "m:h", opts, NULL)) != -1) {
        switch (opt) {
        case 'm': model_path = optarg; break;
        case O_CONTEXT:
            if (!fy_cli_parse_int_list("--context", optarg, 1, 1 << 20, ctx, 16, &n_ctx)) return 2;
            break;
        case O_KV_MEM:
            if (fy_parse_size("--kv-mem", optarg, &kv_mem) != FY_OK || kv_mem < 1) return 2;
            break;
        case O_CHUNK:
            if (!fy_cli_parse_int("--chunk", optarg, 1, 1 << 16, &chunk)) return 2;
            break;
        case O_DECODE:
            if (!fy_cli_parse_int("--decode", optarg, 1, 1 << 16, &n_decode)) return 2;
            break;
        case O_THREADS:
            if (!fy_cli_parse_int("--threads", optarg, 1, 1024, &threads)) return 2;
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!fy_cli_no_operands("bench-window", argc, argv, usage)) return 2;
    if (!model_path) {
        fprintf(stderr, "ferry: bench-window needs --model\n");
        usage(stderr);
        return 2;
    }
    fy_model_t *model = NULL;
    fy_backend_t *be = NULL;
    fy_backend_params_t bp = {.n_threads = (int)threads};
    if (fy_model_load(model_path, &model) != FY_OK || fy_backend_create("cpu", &bp, &be) != FY_OK) {
        fy_model_destroy(model);
        return 1;
    }
    const fy_model_config_t *c = fy_model_config(model);
    int32_t n_sliding = 0;
    for (int32_t l = 0; l < c->n_layers; l++) n_sliding += c->layer[l].window > 0;
    char kvm_h[32];
    fy_format_size(kv_mem, kvm_h, sizeof(kvm_h));
    printf("model %s: %d layers, %d with a sliding window; f16 KV, blocks of 16, chunks of %ld, %ld decode steps\n",
           c->name, c->n_layers, n_sliding, chunk, n_decode);
    if (!n_sliding) printf("(no sliding layers: both layouts are one group of every layer)\n");
    printf("%8s  %-7s %6s  %12s %12s %12s  %8s  %s\n", "context", "groups", "tables", "held (MiB)", "peak (MiB)",
           "promise", "admitted", "in kv_mem");
    int rc = 0;
    for (int i = 0; i < n_ctx && !rc; i++) {
        window_run_t w[2] = {{0}};
        for (int g = 0; g < 2 && !rc; g++) {
            if (run_one(model, be, g == 0, ctx[i], (int32_t)chunk, (int32_t)n_decode, kv_mem, &w[g]) != FY_OK) {
                rc = 1;
                break;
            }
            printf("%8d  %-7s %6d  %12.2f %12.2f %12.2f  %8d  %s\n", ctx[i], g == 0 ? "on" : "off", w[g].n_groups,
                   (double)w[g].held_end / 1048576.0, (double)w[g].held_peak / 1048576.0,
                   (double)w[g].promised / 1048576.0, w[g].admitted, kvm_h);
        }
        if (rc) break;
        printf("%8s  held %.3f, peak %.3f, promise %.3f of every block kept; admitted x%.2f; greedy token %s\n", "",
               (double)w[0].held_end / (double)w[1].held_end, (double)w[0].held_peak / (double)w[1].held_peak,
               (double)w[0].promised / (double)w[1].promised,
               w[1].admitted ? (double)w[0].admitted / (double)w[1].admitted : 0.0,
               w[0].last_argmax == w[1].last_argmax && w[0].last_logit_max == w[1].last_logit_max ? "and logit the same"
                                                                                                  : "DIFFERS");
        if (w[0].last_argmax != w[1].last_argmax || w[0].last_logit_max != w[1].last_logit_max) rc = 1;
    }
    fy_backend_destroy(be);
    fy_model_destroy(model);
    return rc;
}

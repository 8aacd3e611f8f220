/*
 * plan.c - `ferry plan`: how much KV cache fits, for a model (its file, or
 * just its shape) and a memory budget: bytes per token and per block,
 * blocks, tokens, and requests of a given context; with --tp/--pp, per
 * rank of a tensor/pipeline-parallel group (one device each).
 */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "tools/cli.h"
#include "tools/commands.h"
#include "kv/kv.h"
#include "kv/kvplan.h"
#include "common/log.h"
#include "model/model.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: ferry plan (--model FILE | --layers L --kv-heads H --head-dim D)\n"
               "                  (--kv-mem SIZE | --mem SIZE [--weights SIZE] --mem-fraction F)\n"
               "                  [--kv-dtype f16|bf16|fp8|int8|f32] [--block-size B] [--context N]\n"
               "                  [--kv-budget N] [--tp N [--heads H]] [--pp M]\n"
               "sizes take K/M/G/T (powers of 1000) or Ki/Mi/Gi/Ti (powers of 1024), e.g. 50GiB.\n"
               "--weights defaults to the model file's weights when --model is given.\n"
               "With --tp/--pp the memory sizes are per rank (one device each) and the weights are\n"
               "divided over the ranks; --heads (query heads) is needed with --tp when no --model.\n"
               "  -m, --model FILE    the model whose KV shape to take\n"
               "  -h, --help\n");
}

static void print_bytes(const char *label, int64_t b)
{
    char h[32];
    fy_format_size(b, h, sizeof(h));
    printf("%-28s %lld (%s)\n", label, (long long)b, h);
}

int fy_cmd_plan(int argc, char **argv)
{
    fy_kv_plan_in_t in = {.block_size = 16, .elem_bytes = 2};
    const char *model = NULL, *dtype = "f16";
    int32_t windows[FY_KV_MAX_LAYERS], n_sliding = 0;
    bool weights_given = false;
    enum {
        O_LAYERS = 256,
        O_HEADS,
        O_DIM,
        O_KV_MEM,
        O_MEM,
        O_WEIGHTS,
        O_FRACTION,
        O_KVD,
        O_BS,
        O_CONTEXT,
        O_BUDGET,
        O_TP,
        O_PP,
        O_QHEADS
    };
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},
        {"layers", required_argument, 0, O_LAYERS},
        {"kv-heads", required_argument, 0, O_HEADS},
        {"head-dim", required_argument, 0, O_DIM},
        {"kv-mem", required_argument, 0, O_KV_MEM},
        {"mem", required_argument, 0, O_MEM},
        {"weights", required_argument, 0, O_WEIGHTS},
        {"mem-fraction", required_argument, 0, O_FRACTION},
        {"kv-dtype", required_argument, 0, O_KVD},
        {"block-size", required_argument, 0, O_BS},
        {"context", required_argument, 0, O_CONTEXT},
        {"kv-budget", required_argument, 0, O_BUDGET},
        {"tp", required_argument, 0, O_TP},
        {"pp", required_argument, 0, O_PP},
        {"heads", required_argument, 0, O_QHEADS},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    long l;
    double d;
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "m:h", opts, NULL)) != -1) {
        switch (opt) {
        case 'm': model = optarg; break;
        case O_LAYERS:
            if (!fy_cli_parse_int("--layers", optarg, 1, 4096, &l)) return 2;
            in.n_layers = (int32_t)l;
            break;
        case O_HEADS:
            if (!fy_cli_parse_int("--kv-heads", optarg, 1, 4096, &l)) return 2;
            in.n_kv_heads = (int32_t)l;
            break;
        case O_DIM:
            if (!fy_cli_parse_int("--head-dim", optarg, 1, 4096, &l)) return 2;
            in.head_dim = (int32_t)l;
            break;
        case O_KV_MEM:
            if (fy_parse_size("--kv-mem", optarg, &in.kv_mem) != FY_OK) return 2;
            break;
        case O_MEM:
            if (fy_parse_size("--mem", optarg, &in.mem) != FY_OK) return 2;
            break;
        case O_WEIGHTS:
            if (fy_parse_size("--weights", optarg, &in.weights) != FY_OK) return 2;
            weights_given = true;
            break;
        case O_FRACTION:
            if (!fy_cli_parse_float("--mem-fraction", optarg, 1e-6, 1.0, &d)) return 2;
            in.mem_fraction = d;
            break;
        case O_KVD:
            if (fy_kv_dtype_bytes(optarg, &in.elem_bytes) != FY_OK) return 2;
            in.scale_bytes = fy_kv_dtype_scale_bytes(optarg);
            dtype = optarg;
            break;
        case O_BS:
            if (!fy_cli_parse_int("--block-size", optarg, 1, 4096, &l)) return 2;
            in.block_size = (int32_t)l;
            break;
        case O_CONTEXT:
            if (!fy_cli_parse_int("--context", optarg, 1, 1L << 30, &l)) return 2;
            in.context = l;
            break;
        case O_BUDGET:
            if (!fy_cli_parse_int("--kv-budget", optarg, 1, 1L << 30, &l)) return 2;
            in.kv_budget = l;
            break;
        case O_TP:
            if (!fy_cli_parse_int("--tp", optarg, 1, 64, &l)) return 2;
            in.tp = (int32_t)l;
            break;
        case O_PP:
            if (!fy_cli_parse_int("--pp", optarg, 1, 64, &l)) return 2;
            in.pp = (int32_t)l;
            break;
        case O_QHEADS:
            if (!fy_cli_parse_int("--heads", optarg, 1, 4096, &l)) return 2;
            in.n_heads = (int32_t)l;
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!fy_cli_no_operands("plan", argc, argv, usage)) return 2;
    char shape[256];
    if (model) {
        fy_model_t *m;
        if (fy_model_load(model, &m) != FY_OK) return 1;
        const fy_model_config_t *c = fy_model_config(m);
        in.n_layers = c->n_layers;
        in.n_kv_heads = c->n_kv_heads;
        in.n_heads = c->n_heads;
        in.head_dim = c->head_dim;
        if (!weights_given) in.weights = (int64_t)fy_model_weight_bytes_per_token(m);
        if (!in.context) in.context = c->max_ctx;
        snprintf(shape, sizeof(shape), "%s", c->name);
        for (int32_t i = 0; i < c->n_layers && i < FY_KV_MAX_LAYERS; i++) {
            windows[i] = c->layer[i].window;
            n_sliding += windows[i] > 0;
        }
        if (n_sliding) in.windows = windows;
        fy_model_destroy(m);
    } else if (!in.n_layers || !in.n_kv_heads || !in.head_dim) {
        fprintf(stderr, "ferry: plan needs --model or all of --layers, --kv-heads, --head-dim\n");
        usage(stderr);
        return 2;
    } else {
        snprintf(shape, sizeof(shape), "shape");
    }
    if (!in.kv_mem && !in.mem) {
        fprintf(stderr, "ferry: plan needs --kv-mem, or --mem and --mem-fraction\n");
        usage(stderr);
        return 2;
    }
    if (!in.kv_mem && !in.mem_fraction) in.mem_fraction = 0.9;
    int32_t ranks = (in.tp > 1 ? in.tp : 1) * (in.pp > 1 ? in.pp : 1);
    if (ranks > 64) {
        fprintf(stderr, "ferry: plan: --tp x --pp is %d ranks; at most 64\n", ranks);
        return 2;
    }
    int64_t all_weights = in.weights;
    if (ranks > 1) in.weights /= ranks; /* each rank holds its share (embeddings and norms are copied: a bit more) */
    fy_kv_plan_t p;
    if (fy_kv_plan(&in, &p) != FY_OK) return 1;
    printf("%-28s %s: %d layers, %d kv heads x %d, kv %s, blocks of %d tokens\n", "model", shape, in.n_layers,
           in.n_kv_heads, in.head_dim, dtype, in.block_size);
    if (!in.kv_mem) {
        print_bytes("memory", in.mem);
        print_bytes(ranks > 1 ? "weights per rank" : "weights", in.weights);
        printf("%-28s %.2f of what the weights leave\n", "kv share", in.mem_fraction);
    }
    if (p.ranks > 1) {
        printf("%-28s %d (tp %d x pp %d), one device each; figures below per rank\n", "ranks", p.ranks,
               in.tp > 1 ? in.tp : 1, in.pp > 1 ? in.pp : 1);
        printf("%-28s %d of %d%s\n", "kv heads per rank", p.kv_heads_per_rank, in.n_kv_heads,
               p.kv_heads_per_rank * (in.tp > 1 ? in.tp : 1) > in.n_kv_heads ? " (replicated)" : "");
        printf("%-28s %d of %d\n", "layers per stage (most)", p.max_stage_layers, in.n_layers);
        if (!in.kv_mem) print_bytes("weights, all ranks", all_weights);
        print_bytes("kv bytes per token, all", p.bytes_per_token_all);
    }
    print_bytes("kv memory", p.kv_mem);
    print_bytes("kv bytes per token", p.bytes_per_token);
    print_bytes("kv bytes per block", p.bytes_per_block);
    printf("%-28s %lld\n", "blocks that fit", (long long)p.blocks);
    printf("%-28s %lld\n", "tokens that fit", (long long)p.tokens);
    if (in.context && (in.windows || in.kv_budget)) {
        if (in.windows)
            printf("%-28s %d of %d, in KV groups of their own (kv.sliding_groups)\n", "sliding-window layers",
                   n_sliding, in.n_layers);
        if (in.kv_budget) printf("%-28s %lld tokens (kv.evict)\n", "kv budget per request", (long long)in.kv_budget);
        print_bytes("kv held per request", p.held_per_request);
        printf("%-28s %lld\n", "requests of full context", (long long)p.requests_held);
        printf("%-28s %lld (of %lld blocks each)\n", "  every block kept", (long long)p.requests,
               (long long)p.blocks_per_request);
    } else if (in.context) {
        printf("%-28s %lld (of %lld blocks each)\n", "requests of full context", (long long)p.requests,
               (long long)p.blocks_per_request);
    }
    if (in.context) printf("%-28s %lld tokens\n", "context", (long long)in.context);
    return 0;
}

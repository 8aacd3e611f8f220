/*
 * ferry.c - the ferry command: dispatches `ferry COMMAND` to its file
 * (commands.h), and holds the two commands with no file of their own:
 * `ferry generate` runs a model on a prompt in this process and streams
 * the text; `ferry info` describes a model file.
 *
 * Not here: the option parsers the commands share (cli.c), the commands
 * with a file of their own (serve.c, request.c, plan.c, chaos.c, bench*.c).
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "tools/commands.h"
#include "model/prompt.h"
#include "tools/cli.h"
#include "common/cluster.h"
#include "engine/engine_config.h"
#include "engine/generate.h"
#include "common/log.h"
#include "common/mem.h"
#include "model/model.h"
#include "rpc/rpc.h"
#include "engine/runner.h"
#include "engine/stop.h"

/* ---- ferry generate --------------------------------------------------------------- */

static void generate_usage(FILE *f)
{
    const char *model = NULL;
    fy_conf_string(NULL, "model", "path", &model);
    fprintf(f, "usage: ferry generate [-m MODEL] (-p PROMPT | -f FILE) [options]\n"
               "  -m, --model PATH      .gguf file or Hugging Face folder (default " FY_CLI_DEFAULT_MODEL ")\n"
               "  -p, --prompt TEXT     the prompt\n"
               "  -f, --file PATH       read the prompt from a file\n"
               "  -n, --max-tokens N    tokens to generate (default 256)\n"
               "      --temp T          temperature; 0 is greedy (default 0.8)\n"
               "      --top-k K         keep the K most likely tokens; 0 is off (default 40)\n"
               "      --top-p P         nucleus sampling; 1 is off (default 0.95)\n"
               "      --min-p P         drop tokens below P times the best; 0 is off (default 0.05)\n"
               "      --seed S          sampling seed (default: random, printed)\n"
               "      --stop TEXT       stop when TEXT is generated (repeatable)\n"
               "      --chat            apply the model's chat template (a user turn)\n"
               "      --system TEXT     system message for --chat\n"
               "      --ignore-eos      keep generating past the end-of-turn token\n"
               "  -t, --threads N       CPU threads (default: one per core)\n"
               "      --isa NAME        CPU kernels: auto, avx2, scalar (default auto)\n"
               "      --device D        cpu or cuda (default cpu; cuda without a usable GPU warns and uses the cpu)\n"
               "      --ctx N           context window (default: prompt + max tokens, at most the model's)\n"
               "      --kv-dtype T      f16, f32, fp8 (e4m3) or int8 (default f16)\n"
               "      --block-size B    KV block size: 8, 16, 32 (default 16)\n"
               "      --batch N         prompt tokens per forward pass (default 512)\n"
               "      --tp N            tensor-parallel ranks: heads and the MLP split over N processes (default 1)\n"
               "      --pp M            pipeline stages: the layers split over M processes (default 1; with --tp,\n"
               "                        N x M processes; --threads are shared among them)\n"
               "      --spec S          speculative decoding: none, ngram, draft:MODEL_FILE or self:LAYERS\n"
               "                        (the target's first LAYERS layers as the draft; default none)\n"
               "      --spec-k K        proposed tokens per step at most, 1-16 (default 8)\n"
               "      --spec-ngram N    longest n-gram matched, 1-8 (default 3)\n"
               "  -v, --verbose         more logging\n"
               "  -h, --help            this text\n");
}

typedef struct gen_opts {
    const char *model;
    char *prompt;
    const char *system;
    bool chat;
    fy_gen_params_t gp;
    bool seeded;
    int threads;
    const char *isa;
    const char *device; /* "cpu" or "cuda" */
    long ctx;
    fy_dtype_t kv_dtype;
    int block_size;
    int batch;
    const char *spec; /* NULL, "none", "ngram", "draft:FILE", "self:L" */
    int tp, pp;       /* ranks: tensor-parallel, pipeline stages */
} gen_opts_t;

static bool on_text(void *arg, const char *text, size_t len)
{
    fy_cli_answer_put(arg, text, len);
    return true;
}

enum {
    O_TEMP = 256,
    O_TOPK,
    O_TOPP,
    O_MINP,
    O_SEED,
    O_STOP,
    O_CHAT,
    O_SYSTEM,
    O_IGNORE_EOS,
    O_ISA,
    O_CTX,
    O_KVD,
    O_BS,
    O_BATCH,
    O_SPEC,
    O_SPEC_K,
    O_SPEC_NGRAM,
    O_DEVICE,
    O_TP,
    O_PP,
    O_NOT_MINE
};

/* What is generated and how it is sampled: --max-tokens, the sampler,
 * --stop, --ignore-eos, the speculation's bounds.  0 taken, 2 a bad value
 * (said), O_NOT_MINE another group's option. */
static int generate_sampling_opt(int c, const char *arg, gen_opts_t *o)
{
    long l;
    double d;
    switch (c) {
    case 'n':
        if (!fy_cli_parse_int("--max-tokens", arg, 0, 1 << 20, &l)) return 2;
        o->gp.gen.max_tokens = (int32_t)l;
        return 0;
    case O_TEMP:
        if (!fy_cli_parse_float("--temp", arg, 0, 100, &d)) return 2;
        o->gp.gen.sampling.temperature = (float)d;
        return 0;
    case O_TOPK:
        if (!fy_cli_parse_int("--top-k", arg, 0, INT32_MAX, &l)) return 2;
        o->gp.gen.sampling.top_k = (int32_t)l;
        return 0;
    case O_TOPP:
        if (!fy_cli_parse_float("--top-p", arg, 1e-6, 1, &d)) return 2;
        o->gp.gen.sampling.top_p = (float)d;
        return 0;
    case O_MINP:
        if (!fy_cli_parse_float("--min-p", arg, 0, 1, &d)) return 2;
        o->gp.gen.sampling.min_p = (float)d;
        return 0;
    case O_SEED:
        if (!fy_cli_parse_u64("--seed", arg, &o->gp.gen.sampling.seed)) return 2;
        o->seeded = true;
        return 0;
    case O_STOP: {
        fy_genspec_t *g = &o->gp.gen;
        size_t len = strlen(arg);
        if (g->n_stop >= FY_GEN_MAX_STOP || len < 1 || len > FY_GEN_STOP_LEN) {
            fprintf(stderr, "ferry: at most %d --stop strings, each of 1 to %d bytes\n", FY_GEN_MAX_STOP,
                    FY_GEN_STOP_LEN);
            return 2;
        }
        memcpy(g->stop[g->n_stop++], arg, len + 1);
        return 0;
    }
    case O_IGNORE_EOS: o->gp.gen.ignore_eos = true; return 0;
    case O_SPEC_K:
        if (!fy_cli_parse_int("--spec-k", arg, 1, FY_SPEC_MAX_K, &l)) return 2;
        o->gp.spec.k_max = (int32_t)l;
        return 0;
    case O_SPEC_NGRAM:
        if (!fy_cli_parse_int("--spec-ngram", arg, 1, FY_SPEC_MAX_NGRAM, &l)) return 2;
        o->gp.spec.ngram_max = (int32_t)l;
        return 0;
    }
    return O_NOT_MINE;
}

/* Where and how the model runs: threads, kernels, device, context, the KV
 * cache's dtype and blocks, the prompt batch, the proposer.  As above. */
static int generate_engine_opt(int c, const char *arg, gen_opts_t *o)
{
    long l;
    switch (c) {
    case 't':
        if (!fy_cli_parse_int("--threads", arg, 1, 256, &l)) return 2;
        o->threads = (int)l;
        return 0;
    case O_ISA: o->isa = arg; return 0;
    case O_DEVICE:
        if (strcmp(arg, "cpu") && strcmp(arg, "cuda")) {
            fprintf(stderr, "generate: --device must be cpu or cuda, not '%s'\n", arg);
            return 2;
        }
        o->device = arg;
        return 0;
    case O_CTX:
        if (!fy_cli_parse_int("--ctx", arg, 1, 1 << 24, &l)) return 2;
        o->ctx = l;
        return 0;
    case O_KVD:
        if (fy_dtype_from_name(arg, &o->kv_dtype) != FY_OK ||
            (o->kv_dtype != FY_DTYPE_F16 && o->kv_dtype != FY_DTYPE_F32 && !fy_kv_dtype_scaled(o->kv_dtype))) {
            fprintf(stderr, "ferry: --kv-dtype expects f16, f32, fp8 or int8, got '%s'\n", arg);
            return 2;
        }
        return 0;
    case O_BS:
        if (!fy_cli_parse_int("--block-size", arg, 8, 32, &l) || (l != 8 && l != 16 && l != 32)) {
            fprintf(stderr, "ferry: --block-size expects 8, 16 or 32\n");
            return 2;
        }
        o->block_size = (int)l;
        return 0;
    case O_BATCH:
        if (!fy_cli_parse_int("--batch", arg, 1, 65536, &l)) return 2;
        o->batch = (int)l;
        return 0;
    case O_TP:
    case O_PP:
        if (!fy_cli_parse_int(c == O_TP ? "--tp" : "--pp", arg, 1, 64, &l)) return 2;
        *(c == O_TP ? &o->tp : &o->pp) = (int)l;
        return 0;
    case O_SPEC:
        if (strcmp(arg, "none") && strcmp(arg, "ngram") && strncmp(arg, "draft:", 6) && strncmp(arg, "self:", 5)) {
            fprintf(stderr, "ferry: --spec expects none, ngram, draft:MODEL_FILE or self:LAYERS, got '%s'\n", arg);
            return 2;
        }
        o->spec = arg;
        return 0;
    }
    return O_NOT_MINE;
}

/* 0: o is complete; -1: --help answered; else the exit status. */
static int parse_generate(int argc, char **argv, gen_opts_t *o)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},
        {"prompt", required_argument, 0, 'p'},
        {"file", required_argument, 0, 'f'},
        {"max-tokens", required_argument, 0, 'n'},
        {"temp", required_argument, 0, O_TEMP},
        {"top-k", required_argument, 0, O_TOPK},
        {"top-p", required_argument, 0, O_TOPP},
        {"min-p", required_argument, 0, O_MINP},
        {"seed", required_argument, 0, O_SEED},
        {"stop", required_argument, 0, O_STOP},
        {"chat", no_argument, 0, O_CHAT},
        {"system", required_argument, 0, O_SYSTEM},
        {"ignore-eos", no_argument, 0, O_IGNORE_EOS},
        {"threads", required_argument, 0, 't'},
        {"isa", required_argument, 0, O_ISA},
        {"ctx", required_argument, 0, O_CTX},
        {"device", required_argument, 0, O_DEVICE},
        {"kv-dtype", required_argument, 0, O_KVD},
        {"block-size", required_argument, 0, O_BS},
        {"batch", required_argument, 0, O_BATCH},
        {"tp", required_argument, 0, O_TP},
        {"pp", required_argument, 0, O_PP},
        {"verbose", no_argument, 0, 'v'},
        {"spec", required_argument, 0, O_SPEC},
        {"spec-k", required_argument, 0, O_SPEC_K},
        {"spec-ngram", required_argument, 0, O_SPEC_NGRAM},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *prompt_file = NULL;
    int c, rc;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:p:f:n:t:vh", opts, NULL)) != -1) {
        switch (c) {
        case 'm': o->model = optarg; break;
        case 'p':
            fy_free(o->prompt);
            if (!(o->prompt = fy_strdup(optarg))) return 1;
            break;
        case 'f': prompt_file = optarg; break;
        case O_CHAT: o->chat = true; break;
        case O_SYSTEM: o->system = optarg; break;
        case 'v': fy_log_set_level(FY_LOG_DEBUG); break;
        case 'h': generate_usage(stdout); return -1;
        case '?': generate_usage(stderr); return 2;
        default:
            if ((rc = generate_sampling_opt(c, optarg, o)) == O_NOT_MINE) rc = generate_engine_opt(c, optarg, o);
            if (rc) return rc == O_NOT_MINE ? 2 : rc;
        }
    }
    if (!fy_cli_no_operands("generate", argc, argv, generate_usage)) return 2;
    if (prompt_file) {
        fy_free(o->prompt);
        o->prompt = fy_cli_read_file(prompt_file);
        if (!o->prompt) return 1;
    }
    if (!o->prompt) {
        fprintf(stderr, "ferry: generate needs a prompt (-p TEXT or -f FILE)\n");
        generate_usage(stderr);
        return 2;
    }
    return 0;
}

/* Without -m a command runs the default model; where it is not there,
 * say which file was looked for, where, and how to get it, rather than
 * the loader's "cannot open". */
static bool default_model_here(const char *cmd, const char *path)
{
    if (access(path, F_OK) == 0) return true;
    char cwd[PATH_MAX];
    fprintf(stderr,
            "ferry: %s: no model: -m was not given, and the default, %s, is not under %s; `make model` at the "
            "repository's root fetches that file (then run ferry from there), or give -m PATH (a .gguf file or a "
            "Hugging Face folder)\n",
            cmd, path,
            path[0] == '/'             ? "/"
            : getcwd(cwd, sizeof(cwd)) ? cwd
                                       : "the working directory");
    return false;
}

/* Builds the prompt's token ids (chat template applied when asked). */
static fy_status_t tokenize_prompt(const fy_model_t *m, const gen_opts_t *o, int32_t **ids_p, int32_t *n_p)
{
    return fy_prompt_tokens(m, o->system, o->prompt, o->chat, ids_p, n_p);
}

static int cmd_generate(int argc, char **argv)
{
    /* the model, block size and KV dtype default to the key table's model.path and kv.* */
    gen_opts_t o = {.batch = 512, .tp = 1, .pp = 1};
    int32_t block_size;
    if (fy_conf_string(NULL, "model", "path", &o.model) || fy_cluster_kv(NULL, &block_size, &o.kv_dtype)) return 1;
    o.block_size = block_size;
    fy_gen_params_default(&o.gp);
    o.gp.gen.max_tokens = 256;
    o.gp.gen.sampling.temperature = 0.8f;
    o.gp.gen.sampling.top_k = 40;
    o.gp.gen.sampling.top_p = 0.95f;
    o.gp.gen.sampling.min_p = 0.05f;
    const char *def_model = o.model;
    int rc = parse_generate(argc, argv, &o);
    if (rc) {
        fy_free(o.prompt);
        return rc < 0 ? 0 : rc;
    }
    if (o.model == def_model && !default_model_here("generate", def_model)) {
        fy_free(o.prompt);
        return 1;
    }
    if (!o.seeded) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        o.gp.gen.sampling.seed = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)getpid();
    }
    fy_model_t *m = NULL;
    fy_engine_stack_t s = {0};
    int32_t *ids = NULL, n_ids = 0;
    rc = 1;
    if (fy_model_load(o.model, &m) != FY_OK) goto out;
    const fy_model_config_t *cfg = fy_model_config(m);
    if (tokenize_prompt(m, &o, &ids, &n_ids) != FY_OK) goto out;
    long ctx = o.ctx ? o.ctx : (long)n_ids + o.gp.gen.max_tokens + 1;
    if (ctx > cfg->max_ctx) ctx = cfg->max_ctx;
    if (n_ids >= ctx) {
        fy_error("generate: the prompt has %d tokens; the context window is %ld", n_ids, ctx);
        goto out;
    }
    fy_engine_build_t eb; /* fy_generate makes its own engine over the runner and block manager */
    fy_engine_build_default(&eb);
    eb.device = o.device;
    eb.threads = o.threads;
    eb.isa = o.isa;
    fy_runner_params_t *rpm = &eb.runner;
    rpm->max_batch_tokens = o.batch;
    rpm->max_seqs = 1;
    rpm->max_logits = 1 + o.gp.spec.k_max; /* a verification's rows */
    if (rpm->max_logits > o.batch) rpm->max_logits = o.batch;
    rpm->max_ctx = (int32_t)ctx;
    rpm->block_size = o.block_size;
    rpm->kv_dtype = o.kv_dtype;
    rpm->tp = o.tp;
    rpm->pp = o.pp;
    if (o.tp * o.pp > 1) {
        if (o.tp * o.pp > 64) {
            fprintf(stderr, "ferry: --tp %d x --pp %d is more than 64 ranks\n", o.tp, o.pp);
            rc = 2;
            goto out;
        }
        if (fy_runner_check_shape(m, rpm) != FY_OK) { /* said which counts do not split */
            rc = 2;
            goto out;
        }
    }
    /* a pool that admits one request of the whole context, as the block
     * manager counts it (the watermark; with KV groups, pages of each) */
    if ((rpm->n_kv_blocks = fy_runner_pool_blocks(m, 0, rpm, ctx, 1, rpm->max_batch_tokens, FY_KVM_WATERMARK)) < 1)
        goto out;
    eb.draft = o.spec && strcmp(o.spec, "ngram") && strcmp(o.spec, "none") ? o.spec : NULL;
    eb.no_engine = true;
    if (fy_engine_stack_create(m, &eb, &s) != FY_OK) goto out;
    if (o.spec && !strcmp(o.spec, "ngram")) {
        o.gp.spec.method = FY_SPEC_NGRAM;
        o.gp.spec.sampled = true; /* one request: nothing beside it to depend on */
    } else if (s.draft) {
        o.gp.spec.method = FY_SPEC_DRAFT;
        o.gp.spec.sampled = true;
        o.gp.spec.draft = fy_spec_draft_runner(s.draft);
        o.gp.spec.draft_kvm = fy_spec_draft_kvm(s.draft);
    }

    char desc[512];
    fy_model_describe(m, desc, sizeof(desc));
    fy_info("model: %s", desc);
    fy_info("backend: %s; kv: %s, %d-token blocks, %d blocks", fy_backend_describe(s.be), fy_dtype_name(o.kv_dtype),
            o.block_size, rpm->n_kv_blocks);
    if (s.group) fy_info("ranks: tp %d, pp %d (%d processes)", o.tp, o.pp, o.tp * o.pp);

    fy_gen_stats_t stats;
    fy_cli_answer_t answer = {.out = stdout};
    fy_status_t st =
        fy_generate(s.runner, s.kvm, fy_model_tokenizer(m), ids, n_ids, &o.gp, on_text, &answer, NULL, 0, &stats);
    fy_cli_answer_end(&answer); /* the summary below starts a line of its own */
    if (st != FY_OK) goto out;
    fprintf(stderr,
            "ferry: prompt tokens: %d, generated tokens: %d, prefill: %.1f tok/s (%.3f s), decode: %.1f tok/s "
            "(%.3f s), finish: %s, seed: %llu\n",
            stats.n_prompt, stats.n_generated, stats.n_prompt / (stats.prefill_s > 0 ? stats.prefill_s : 1e-9),
            stats.prefill_s,
            stats.n_generated > 1 ? (stats.n_generated - 1) / (stats.decode_s > 0 ? stats.decode_s : 1e-9) : 0.0,
            stats.decode_s, fy_finish_reason_str(stats.finish), (unsigned long long)o.gp.gen.sampling.seed);
    fy_runner_timing_t rt[64];
    int32_t n_ranks = fy_runner_n_ranks(s.runner);
    if (s.group && fy_runner_timing(s.runner, rt, n_ranks, false) == FY_OK)
        for (int32_t k = 0; k < n_ranks; k++) /* where each rank's time went: compute, collectives, bubbles */
            fprintf(stderr,
                    "ferry: rank %d (stage %d, tp rank %d): %llu passes, compute %.3f s, gathers/reductions %.3f s, "
                    "waiting on other stages %.3f s, sending %.3f s\n",
                    k, k / o.tp, k % o.tp, (unsigned long long)rt[k].forwards, rt[k].compute_ns * 1e-9,
                    rt[k].allreduce_ns * 1e-9, rt[k].wait_ns * 1e-9, rt[k].send_ns * 1e-9);
    if (o.gp.spec.method != FY_SPEC_NONE)
        fprintf(stderr,
                "ferry: speculative (%s, k up to %d): proposed %d, accepted %d (%.1f%%), %d verification steps, "
                "mean accepted length %.2f, proposing %.3f s\n",
                o.spec, o.gp.spec.k_max, stats.spec_proposed, stats.spec_accepted,
                stats.spec_proposed ? 100.0 * stats.spec_accepted / stats.spec_proposed : 0.0, stats.spec_steps,
                stats.spec_steps ? (double)stats.spec_accepted / stats.spec_steps : 0.0, stats.propose_s);
    rc = 0;
out:
    fy_engine_stack_destroy(&s);
    fy_model_destroy(m);
    fy_free(ids);
    fy_free(o.prompt);
    return rc;
}

/* ---- ferry info ----------------------------------------------------------------- */

static void info_usage(FILE *f)
{
    fprintf(f, "usage: ferry info [-m MODEL | MODEL]\n"
               "  describe a model file (.gguf) or Hugging Face folder: shape, architecture, each layer's\n"
               "  window and rope, tensor types, tokenizer, chat template, and whether ferry runs it (and\n"
               "  if not, every reason found)\n"
               "  -m, --model PATH  the model, as the other commands take it (or the one operand)\n"
               "                    (default " FY_CLI_DEFAULT_MODEL ")\n"
               "  -h, --help\n");
}

static int cmd_info(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    const char *path = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': path = optarg; break;
        case 'h': info_usage(stdout); return 0;
        default: info_usage(stderr); return 2;
        }
    }
    if (argc - optind > (path ? 0 : 1)) {
        fprintf(stderr, "ferry: info: one model at a time, not '%s' too\n", argv[path ? optind : optind + 1]);
        info_usage(stderr);
        return 2;
    }
    if (!path && optind == argc && !default_model_here("info", FY_CLI_DEFAULT_MODEL)) return 1;
    if (!path) path = optind < argc ? argv[optind] : FY_CLI_DEFAULT_MODEL;
    /* a description of anything that reads as a model file, with what
     * ferry cannot run listed, not a refusal at the first fault */
    char *report = NULL;
    if (fy_model_inspect(path, &report) != FY_OK) return 1;
    fputs(report, stdout);
    fy_free(report);
    return 0;
}

/* ---- main -------------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f, "usage: ferry COMMAND [options]\n"
               "commands:\n"
               "  serve      start a local cluster (router, prefill and decode workers) and supervise it\n"
               "  request    send a prompt to a router and stream the text\n"
               "  generate   run a model on a prompt in this process and stream the text\n"
               "  info       describe a model file\n"
               "  bench      prefill and decode speed against the memory-bandwidth bound\n"
               "  bench-batch  decode throughput and inter-token latency at batch 1 to 64\n"
               "  bench-spec   decode throughput with and without speculative decoding\n"
               "  bench-kv   block manager: waste, allocation and prefix-lookup speed\n"
               "  bench-window  KV a request holds with sliding-window KV groups and without\n"
               "  bench-evict   KV budgets (StreamingLLM, H2O): perplexity, a retrieval probe, decode speed\n"
               "  bench-prec    numerical error per approximation against an exact double-precision forward\n"
               "  bench-grammar structured outputs: token-mask time per step against a decode step\n"
               "  bench-xfer KV transfer throughput over UCX against ucx_perftest\n"
               "  bench-group  the rank group's all-reduce, barrier and send/recv against memcpy\n"
               "  bench-reshard  KV between rank groups of different shapes against whole blocks\n"
               "  bench-ranks  tensor/pipeline-parallel ranks: tok/s and each rank's step split per tp x pp shape\n"
               "  bench-ttft time to first token, disaggregated (a running cluster) against colocated\n"
               "  bench-gpu  a backend's decode steps, paged attention and matmuls against its device copy\n"
               "  cmp-devices  greedy decoding on two backends in lockstep: where their tokens first differ\n"
               "  plan       how much KV cache fits a memory budget\n"
               "  chaos      kill a local cluster's processes under load and check nothing is lost\n"
               "  config     print a configuration as the processes read it, or check one\n"
               "  key        write a client's key file (it speaks as that client only)\n"
               "run 'ferry COMMAND --help' for a command's options; 'ferry --version' names the nng linked\n");
}

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
} COMMANDS[] = {
    {"generate", cmd_generate},
    {"info", cmd_info},
    {"bench", fy_cmd_bench},
    {"bench-kv", fy_cmd_bench_kv},
    {"bench-window", fy_cmd_bench_window},
    {"bench-evict", fy_cmd_bench_evict},
    {"bench-prec", fy_cmd_bench_prec},
    {"bench-grammar", fy_cmd_bench_grammar},
    {"bench-batch", fy_cmd_bench_batch},
    {"bench-xfer", fy_cmd_bench_xfer},
    {"bench-group", fy_cmd_bench_group},
    {"bench-reshard", fy_cmd_bench_reshard},
    {"bench-ranks", fy_cmd_bench_ranks},
    {"bench-spec", fy_cmd_bench_spec},
    {"bench-ttft", fy_cmd_bench_ttft},
    {"bench-gpu", fy_cmd_bench_gpu},
    {"cmp-devices", fy_cmd_cmp_devices},
    {"plan", fy_cmd_plan},
    {"request", fy_cmd_request},
    {"serve", fy_cmd_serve},
    {"chaos", fy_cmd_chaos},
    {"config", fy_cmd_config},
    {"key", fy_cmd_key},
};

int main(int argc, char **argv)
{
    fy_log_crash_reports();
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    for (size_t i = 0; i < sizeof(COMMANDS) / sizeof(COMMANDS[0]); i++) {
        if (strcmp(cmd, COMMANDS[i].name)) continue;
        /* the command's argv[0] names it in getopt's messages ("ferry info: unrecognized option") */
        char name[64];
        snprintf(name, sizeof(name), "ferry %s", cmd);
        argv[1] = name;
        return COMMANDS[i].run(argc - 1, argv + 1);
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        /* which nng is linked: build/nng's (make deps) or the system's (rpc.h) */
        printf("ferry: nng %s%s\n", fy_rpc_nng_version(),
               fy_rpc_nng_fixed() ? "" : " (older than 1.6: nng issue 1653; make deps builds nng 1.11)");
        return 0;
    }
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "ferry: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}

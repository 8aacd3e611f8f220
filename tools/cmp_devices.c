/*
 * cmp_devices.c - `ferry cmp-devices`: greedy decoding of one model on two
 * backends in lockstep, to see whether a backend computes what the other
 * does: where their greedy tokens first differ, and how near a tie the
 * reference's logits were there.
 *
 * Both runners get the same random prompt (a fixed seed) and then, step by
 * step, the reference's (the second device's) greedy token, so that every
 * step compares the two on the same input, also after a first difference
 * (up to it, this is plain greedy generation on each).  Each step's
 * logits are compared: relative error ||a - b|| / ||b||, largest absolute
 * difference, values that are not finite, whether the argmaxes agree, and
 * the reference's top-2 margin.  A first difference at a near tie (a
 * margin below the logits' difference) is what two correct backends of
 * different arithmetic do; one at a wide margin is a wrong op.
 *
 * The verdict (exit status 0, or 1 with the reason): every logit finite,
 * every step's relative error at most --tol, and with the same device
 * named twice (the GPU check's dry run: cpu against cpu) every logit bit
 * for bit the same, since ferry's ops are deterministic.  A device that
 * cannot be made is an error, never a fallback: cuda on a machine without
 * a usable GPU fails here.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "engine/engine_config.h"
#include "kv/kv.h"
#include "common/log.h"
#include "common/mem.h"
#include "model/model.h"
#include "engine/runner.h"
#include "engine/sampler.h"

typedef struct side {
    const char *device;
    fy_engine_stack_t s;
    fy_block_table_t bt;
    bool bt_init;
    float *logits;
} side_t;

static fy_status_t side_open(side_t *d, const fy_model_t *m, int threads, int32_t cap, fy_dtype_t kv_dtype)
{
    fy_engine_build_t eb;
    fy_engine_build_default(&eb);
    eb.device = d->device;
    eb.threads = threads;
    eb.prefix_caching = false;
    eb.no_engine = true;
    eb.runner.max_seqs = eb.runner.max_logits = 1;
    eb.runner.max_ctx = cap;
    eb.runner.kv_dtype = kv_dtype;
    eb.runner.n_kv_blocks = (cap + eb.runner.block_size - 1) / eb.runner.block_size;
    fy_status_t st;
    if ((st = fy_engine_stack_create(m, &eb, &d->s))) return st;
    if ((st = fy_kvm_seq_init(d->s.kvm, &d->bt, cap, NULL))) return st;
    d->bt_init = true;
    if ((st = fy_kvm_seq_reserve(d->s.kvm, &d->bt, cap, NULL))) return st;
    d->logits = fy_malloc((size_t)fy_model_config(m)->vocab_size * sizeof(float));
    return d->logits ? FY_OK : FY_ERR_NOMEM;
}

static void side_close(side_t *d)
{
    if (d->bt_init) {
        fy_kvm_seq_release(d->s.kvm, &d->bt);
        fy_kvm_seq_deinit(&d->bt);
    }
    fy_engine_stack_destroy(&d->s);
    fy_free(d->logits);
}

/* the best and second-best logits */
static void top2(const float *l, int32_t n, int32_t *best_p, float *margin_p)
{
    int32_t b = 0, s = -1;
    for (int32_t i = 1; i < n; i++) {
        if (l[i] > l[b]) {
            s = b, b = i;
        } else if (s < 0 || l[i] > l[s]) {
            s = i;
        }
    }
    *best_p = b;
    *margin_p = s < 0 ? INFINITY : l[b] - l[s];
}

static void usage(FILE *f)
{
    fprintf(f, "usage: ferry cmp-devices -m MODEL [--devices cuda,cpu] [-n 32] [--prompt-tokens 64] [--seed S]\n"
               "                         [--tol 0.05] [--kv-dtype f16] [--threads N]\n"
               "  greedy decoding on two backends in lockstep, fed the second's tokens: where the tokens first\n"
               "  differ, the second's top-2 logit margin there, and the logits' difference at every step\n"
               "  -m, --model PATH        the model (.gguf or Hugging Face folder)\n"
               "      --devices A,B       the backend under test and the reference (default cuda,cpu); the same\n"
               "                          twice asks for logits equal bit for bit\n"
               "  -n, --steps N           decode steps compared (default 32)\n"
               "      --prompt-tokens N   random prompt ids (default 64)\n"
               "      --seed S            the prompt's seed (default 1)\n"
               "      --tol T             largest relative logit error allowed at any step (default 0.05)\n"
               "      --kv-dtype T        f16, f32, fp8 or int8 (default f16)\n"
               "  -t, --threads N         CPU threads (default one per core)\n"
               "  -h, --help\n");
}

int fy_cmd_cmp_devices(int argc, char **argv)
{
    enum { O_DEVICES = 256, O_PROMPT, O_SEED, O_TOL, O_KVD };
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},
        {"devices", required_argument, 0, O_DEVICES},
        {"steps", required_argument, 0, 'n'},
        {"prompt-tokens", required_argument, 0, O_PROMPT},
        {"seed", required_argument, 0, O_SEED},
        {"tol", required_argument, 0, O_TOL},
        {"kv-dtype", required_argument, 0, O_KVD},
        {"threads", required_argument, 0, 't'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *model = NULL;
    char devices[64] = "cuda,cpu";
    long steps = 32, n_prompt = 64, threads = 0;
    uint64_t seed = 1;
    double tol = 0.05;
    fy_dtype_t kv_dtype = FY_DTYPE_F16;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:n:t:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case O_DEVICES: snprintf(devices, sizeof(devices), "%s", optarg); break;
        case 'n':
            if (!fy_cli_parse_int("--steps", optarg, 1, 100000, &steps)) return 2;
            break;
        case O_PROMPT:
            if (!fy_cli_parse_int("--prompt-tokens", optarg, 1, 100000, &n_prompt)) return 2;
            break;
        case O_SEED:
            if (!fy_cli_parse_u64("--seed", optarg, &seed)) return 2;
            break;
        case O_TOL:
            if (!fy_cli_parse_float("--tol", optarg, 0, 1e9, &tol)) return 2;
            break;
        case O_KVD:
            if (fy_dtype_from_name(optarg, &kv_dtype) != FY_OK) {
                fprintf(stderr, "ferry cmp-devices: --kv-dtype: unknown type '%s'\n", optarg);
                return 2;
            }
            break;
        case 't':
            if (!fy_cli_parse_int("--threads", optarg, 1, 256, &threads)) return 2;
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!fy_cli_no_operands("cmp-devices", argc, argv, usage)) return 2;
    char *comma = strchr(devices, ',');
    if (!model || !comma || comma == devices || !comma[1] || strchr(comma + 1, ',')) {
        fprintf(stderr, "ferry cmp-devices: %s\n", !model ? "-m MODEL is required" : "--devices wants two names, A,B");
        usage(stderr);
        return 2;
    }
    *comma = 0;
    side_t d[2] = {{.device = devices}, {.device = comma + 1}};
    for (int i = 0; i < 2; i++) {
        char why[256] = "";
        if (strcmp(d[i].device, "cpu") && strcmp(d[i].device, "cuda")) {
            fprintf(stderr, "ferry cmp-devices: --devices: unknown device '%s' (cpu, cuda)\n", d[i].device);
            return 2;
        }
        if (!strcmp(d[i].device, "cuda") && !fy_backend_cuda_usable(why, sizeof(why))) {
            fprintf(stderr, "ferry cmp-devices: cuda is not usable here: %s\n", why);
            return 1;
        }
    }
    bool same = !strcmp(d[0].device, d[1].device);
    fy_model_t *m;
    if (fy_model_load(model, &m) != FY_OK) return 1;
    const fy_model_config_t *mc = fy_model_config(m);
    int32_t V = mc->vocab_size, cap = (int32_t)(n_prompt + steps + 1);
    int32_t *prompt = fy_malloc((size_t)n_prompt * sizeof(int32_t));
    int rc = 1;
    if (!prompt) {
        fprintf(stderr, "ferry cmp-devices: out of memory\n");
        goto out;
    }
    if (cap > mc->max_ctx) {
        fprintf(stderr, "ferry cmp-devices: %ld prompt tokens and %ld steps are past the model's context of %d\n",
                n_prompt, steps, mc->max_ctx);
        goto out;
    }
    for (int i = 0; i < 2; i++)
        if (side_open(&d[i], m, (int)threads, cap, kv_dtype) != FY_OK) goto out;
    printf("ferry cmp-devices: %s; %s (%s) against %s (%s); %ld random prompt tokens (seed %llu), %ld steps\n",
           mc->name, d[0].device, fy_backend_describe(d[0].s.be), d[1].device, fy_backend_describe(d[1].s.be), n_prompt,
           (unsigned long long)seed, steps);
    fy_rng_t rng;
    fy_rng_seed(&rng, seed);
    for (long i = 0; i < n_prompt; i++) prompt[i] = (int32_t)(fy_rng_next(&rng) % (uint64_t)V);
    /* the prompt, in chunks each runner takes; the last token's logits are step 0's */
    for (int i = 0; i < 2; i++) {
        int32_t chunk = fy_runner_params(d[i].s.runner)->max_batch_tokens;
        for (int32_t p = 0; p < n_prompt; p += chunk) {
            int32_t n = (int32_t)n_prompt - p < chunk ? (int32_t)n_prompt - p : chunk;
            fy_forward_seq_t f = {&d[i].bt, prompt + p, n, p, p + n == n_prompt ? 1 : 0, NULL};
            if (fy_runner_forward(d[i].s.runner, &f, 1, d[i].logits) != FY_OK) goto out;
        }
    }
    long agree = 0, first = -1, nonfinite = 0;
    double max_rel = 0, max_abs = 0;
    bool bitwise = true;
    printf("| step | %s token | %s token | rel err | max abs diff | %s top-2 margin |\n", d[0].device, d[1].device,
           d[1].device);
    printf("|---:|---:|---:|---:|---:|---:|\n");
    for (long k = 0; k < steps; k++) {
        const float *a = d[0].logits, *b = d[1].logits;
        double num = 0, den = 0, mabs = 0;
        for (int32_t j = 0; j < V; j++) {
            if (!isfinite(a[j]) || !isfinite(b[j])) {
                nonfinite++;
                continue;
            }
            double e = (double)a[j] - (double)b[j];
            num += e * e, den += (double)b[j] * b[j];
            if (fabs(e) > mabs) mabs = fabs(e);
        }
        double rel = den > 0 ? sqrt(num / den) : (num > 0 ? INFINITY : 0);
        if (memcmp(a, b, (size_t)V * sizeof(float))) bitwise = false;
        int32_t ta, tb;
        float ma, mb;
        top2(a, V, &ta, &ma);
        top2(b, V, &tb, &mb);
        if (ta == tb) {
            agree++;
        } else if (first < 0) {
            first = k;
            printf("first difference at step %ld: %s picks %d, %s picks %d; %s's top-2 margin %.6g, its logit of %d "
                   "over %d %.6g; %s's top-2 margin %.6g; largest logit difference there %.6g\n",
                   k, d[0].device, ta, d[1].device, tb, d[1].device, (double)mb, tb, ta, (double)(b[tb] - b[ta]),
                   d[0].device, (double)ma, mabs);
        }
        printf("| %ld | %d | %d | %.3g | %.3g | %.4g |\n", k, ta, tb, rel, mabs, (double)mb);
        if (rel > max_rel) max_rel = rel;
        if (mabs > max_abs) max_abs = mabs;
        if (k + 1 == steps) break;
        /* both take the reference's token */
        for (int i = 0; i < 2; i++) {
            fy_forward_seq_t f = {&d[i].bt, &tb, 1, (int32_t)(n_prompt + k), 1, NULL};
            if (fy_runner_forward(d[i].s.runner, &f, 1, d[i].logits) != FY_OK) goto out;
        }
    }
    printf("cmp-devices: %s vs %s: greedy tokens agree at %ld of %ld steps; first difference: %s; largest relative "
           "logit error %.3g (tolerance %g), largest absolute %.3g; values not finite: %ld; logits bit for bit "
           "equal: %s\n",
           d[0].device, d[1].device, agree, steps, first < 0 ? "none" : "above", max_rel, tol, max_abs, nonfinite,
           bitwise ? "yes" : "no");
    if (nonfinite)
        printf("cmp-devices: FAIL: %ld logits are not finite\n", nonfinite);
    else if (max_rel > tol)
        printf("cmp-devices: FAIL: relative logit error %.3g is over the tolerance %g\n", max_rel, tol);
    else if (same && !bitwise)
        printf("cmp-devices: FAIL: the same device twice must give the same bits\n");
    else {
        printf("cmp-devices: PASS\n");
        rc = 0;
    }
out:
    side_close(&d[0]);
    side_close(&d[1]);
    fy_free(prompt);
    fy_model_destroy(m);
    return rc;
}

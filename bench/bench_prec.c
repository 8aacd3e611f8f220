/*
 * bench_prec.c - `ferry bench-prec`: where ferry's numerical error enters,
 * measured on the real model against an exact forward pass.
 *
 * The reference is fy_exact_forward (engine/exact.h): a double-precision
 * forward pass over the model's own weights as the file holds them, which
 * keeps the residual stream after each layer's attention and after its MLP,
 * and its logits.
 *
 * ferry then runs the same tokens teacher-forced in chunks, as a worker
 * would, once per configuration, each switching some approximations to
 * exact: f32 KV instead of f16; f32 activations (the matrices dequantized to
 * f32 at load: fy_runner_params_t.f32_weights) for one class of matmul at
 * a time instead of 8-bit ones; all of them.  For each it prints the
 * perplexity and its excess over the exact model's, the mean KL divergence
 * of its next-token distribution from the reference's, the relative error
 * of its logits, and the relative error ||x - x_ref|| / ||x_ref|| of the
 * residual stream after attention and after the MLP of chosen layers
 * (fy_runner_set_taps).  A last row runs the default with two-pass
 * activations (fy_backend_params_t.act_q8x2).  What the last row (every switch on) leaves is the
 * f32 arithmetic itself: norms, rope tables, attention's softmax and P.V,
 * the MLP's activation.
 *
 * CPU only; any architecture model.h describes; the reference costs about
 * 2 x parameters double multiply-adds per token (SmolLM2-135M, 512
 * tokens: about a minute on 2 cores).
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/backend.h"
#include "tools/cli.h"
#include "common/clock.h"
#include "tools/commands.h"
#include "engine/exact.h"
#include "kv/kv.h"
#include "common/log.h"
#include "common/mem.h"
#include "model/model.h"
#include "engine/runner.h"
#include "model/tokenizer.h"

enum { MAX_THREADS = 64 };

static void usage(FILE *f)
{
    fprintf(f, "usage: ferry bench-prec -m FILE --text FILE [--tokens N] [--chunk N] [--threads N] [--layers LIST]\n"
               "  ferry's error against an exact double-precision forward pass over the same weights, with\n"
               "  each approximation (8-bit activations per matmul class, f16 KV) switched off in turn\n"
               "  -m, --model FILE   the model (GGUF or Hugging Face folder)\n"
               "  --text FILE        an English text (tests/data/gpl-3.0.txt); BOS is added\n"
               "  --tokens N         tokens of it, teacher-forced (default 512, at least 16)\n"
               "  --chunk N          tokens per forward pass of ferry (default 64)\n"
               "  --threads N        CPU threads, ferry's and the reference's (default 2)\n"
               "  --layers LIST      layers whose residual error is printed (default: first, middle, last)\n"
               "  -h, --help\n");
}

typedef struct conf {
    const char *name;
    fy_dtype_t kv;
    uint32_t f32;
    bool x2; /* two-pass activations (fy_backend_params_t.act_q8x2) */
} conf_t;

static const conf_t CONFS[] = {
    {"ferry (q8 activations, f16 KV)", FY_DTYPE_F16, 0, false},
    {"f32 KV", FY_DTYPE_F32, 0, false},
    {"f32 x: q, k, v", FY_DTYPE_F16, FY_RUNNER_F32_QKV, false},
    {"f32 x: o", FY_DTYPE_F16, FY_RUNNER_F32_O, false},
    {"f32 x: gate, up", FY_DTYPE_F16, FY_RUNNER_F32_GATE_UP, false},
    {"f32 x: down", FY_DTYPE_F16, FY_RUNNER_F32_DOWN, false},
    {"f32 x: output head", FY_DTYPE_F16, FY_RUNNER_F32_HEAD, false},
    {"f32 x: every matmul", FY_DTYPE_F16, FY_RUNNER_F32_ALL, false},
    {"f32 x: every matmul, f32 KV", FY_DTYPE_F32, FY_RUNNER_F32_ALL, false},
    {"two-pass activations (q8x2)", FY_DTYPE_F16, 0, true},
};

/* One configuration of ferry over tok[0..n) in chunks: its residual taps
 * ([n_layers][n][dim]) and logits ([n][vocab]). */
static fy_status_t ferry_run(const fy_model_t *m, fy_backend_t *be, const conf_t *cf, const int32_t *tok, int32_t n,
                             int32_t chunk, float *tap_attn, float *tap_mlp, float *logits, double *secs)
{
    const fy_model_config_t *c = fy_model_config(m);
    fy_runner_params_t rp;
    fy_runner_params_default(&rp);
    rp.max_batch_tokens = chunk;
    rp.max_seqs = 1;
    rp.max_logits = chunk;
    rp.max_ctx = n + 16;
    rp.n_kv_blocks = (n + rp.block_size) / rp.block_size + 1;
    rp.kv_dtype = cf->kv;
    rp.f32_weights = cf->f32;
    fy_runner_t *r = NULL;
    fy_kv_hasher_t *hs = NULL;
    fy_kvm_t *kvm = NULL;
    size_t d = (size_t)c->dim, L = (size_t)c->n_layers;
    float *ta = fy_malloc(L * (size_t)chunk * d * sizeof(float)),
          *tm = fy_malloc(L * (size_t)chunk * d * sizeof(float));
    fy_block_table_t bt;
    bool bt_init = false;
    fy_status_t st = ta && tm ? FY_OK : FY_ERR_NOMEM;
    if (st || (st = fy_runner_create(m, be, &rp, &r)) || (st = fy_kv_hasher_create_random(&hs))) goto out;
    fy_kvm_params_t kp;
    fy_runner_kvm_params(r, &kp);
    kp.hasher = hs;
    kp.prefix_caching = false;
    kp.watermark = 0;
    if ((st = fy_kvm_create(&kp, &kvm)) || (st = fy_kvm_seq_init(kvm, &bt, n + 1, NULL))) goto out;
    bt_init = true;
    fy_runner_set_taps(r, ta, tm);
    double t0 = fy_now_s();
    for (int32_t done = 0; done < n;) {
        int32_t k = n - done < chunk ? n - done : chunk;
        if ((st = fy_kvm_seq_reserve(kvm, &bt, done + k, NULL))) break;
        fy_forward_seq_t fs = {&bt, tok + done, k, done, k, NULL};
        if ((st = fy_runner_forward(r, &fs, 1, logits + (size_t)done * (size_t)c->vocab_size))) break;
        for (size_t l = 0; l < L; l++) {
            memcpy(tap_attn + (l * (size_t)n + (size_t)done) * d, ta + l * (size_t)chunk * d, (size_t)k * d * 4);
            memcpy(tap_mlp + (l * (size_t)n + (size_t)done) * d, tm + l * (size_t)chunk * d, (size_t)k * d * 4);
        }
        done += k;
        fy_kvm_seq_commit(kvm, &bt, tok, done, NULL);
    }
    *secs = fy_now_s() - t0;
    fy_kvm_seq_release(kvm, &bt);
out:
    if (bt_init) fy_kvm_seq_deinit(&bt);
    fy_kvm_destroy(kvm);
    fy_kv_hasher_destroy(hs);
    fy_runner_destroy(r);
    fy_free(ta);
    fy_free(tm);
    if (st) fy_error("bench-prec: the run '%s' failed: %s", cf->name, fy_status_str(st));
    return st;
}

static double ppl_of(const float *logits, const int32_t *tok, int32_t n, int32_t vocab)
{
    double s = 0;
    for (int32_t t = 0; t + 1 < n; t++) s -= fy_exact_log_prob(logits + (size_t)t * (size_t)vocab, vocab, tok[t + 1]);
    return exp(s / (n - 1));
}

int fy_cmd_bench_prec(int argc, char **argv)
{
    const char *model_path = NULL, *text_path = NULL;
    long n_tok = 512, chunk = 64, threads = 2;
    int layers[16], n_layers_arg = 0;
    enum { O_TEXT = 256, O_TOKENS, O_CHUNK, O_THREADS, O_LAYERS };
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},
        {"text", required_argument, 0, O_TEXT},
        {"tokens", required_argument, 0, O_TOKENS},
        {"chunk", required_argument, 0, O_CHUNK},
        {"threads", required_argument, 0, O_THREADS},
        {"layers", required_argument, 0, O_LAYERS},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "m:h", opts, NULL)) != -1) {
        switch (opt) {
        case 'm': model_path = optarg; break;
        case O_TEXT: text_path = optarg; break;
        case O_TOKENS:
            if (!fy_cli_parse_int("--tokens", optarg, 16, 1 << 16, &n_tok)) return 2;
            break;
        case O_CHUNK:
            if (!fy_cli_parse_int("--chunk", optarg, 1, 4096, &chunk)) return 2;
            break;
        case O_THREADS:
            if (!fy_cli_parse_int("--threads", optarg, 1, MAX_THREADS, &threads)) return 2;
            break;
        case O_LAYERS:
            if (!fy_cli_parse_int_list("--layers", optarg, 0, 1 << 12, layers, 16, &n_layers_arg)) return 2;
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!fy_cli_no_operands("bench-prec", argc, argv, usage)) return 2;
    if (!model_path || !text_path) {
        fprintf(stderr, "ferry: bench-prec needs --model and --text\n");
        usage(stderr);
        return 2;
    }
    char *text = fy_cli_read_file(text_path);
    if (!text) return 1;
    size_t tlen = strlen(text), n_text = 0;
    fy_model_t *m = NULL;
    fy_backend_t *be = NULL, *be2 = NULL;
    fy_backend_params_t bp = {.n_threads = (int)threads}, bp2 = {.n_threads = (int)threads, .act_q8x2 = true};
    int32_t *tok = NULL;
    float *ref_a = NULL, *ref_m = NULL, *ref_lg = NULL, *got_a = NULL, *got_m = NULL, *got_lg = NULL;
    int rc = 1;
    if (fy_model_load(model_path, &m) || fy_backend_create("cpu", &bp, &be) || fy_backend_create("cpu", &bp2, &be2))
        goto out;
    const fy_model_config_t *c = fy_model_config(m);
    tok = fy_malloc((tlen + 2) * sizeof(int32_t));
    if (!tok || fy_tokenizer_encode(fy_model_tokenizer(m), text, tlen, true, false, tok, tlen + 2, &n_text)) goto out;
    if ((size_t)n_tok > n_text || n_tok + 16 > c->max_ctx) {
        fy_error("bench-prec: %s is %zu tokens and the model's context %d; --tokens %ld asks for more", text_path,
                 n_text, c->max_ctx, n_tok);
        goto out;
    }
    for (int i = 0; i < n_layers_arg; i++)
        if (layers[i] >= c->n_layers) {
            fy_error("bench-prec: --layers: layer %d of a %d-layer model", layers[i], c->n_layers);
            goto out;
        }
    if (!n_layers_arg) {
        layers[0] = 0, layers[1] = c->n_layers / 2, layers[2] = c->n_layers - 1;
        n_layers_arg = 3;
    }
    int32_t n = (int32_t)n_tok, V = c->vocab_size;
    size_t tap = (size_t)c->n_layers * (size_t)n * (size_t)c->dim, nl = (size_t)n * (size_t)V;
    ref_a = fy_malloc(tap * 4), ref_m = fy_malloc(tap * 4), ref_lg = fy_malloc(nl * 4);
    got_a = fy_malloc(tap * 4), got_m = fy_malloc(tap * 4), got_lg = fy_malloc(nl * 4);
    if (!ref_a || !ref_m || !ref_lg || !got_a || !got_m || !got_lg) {
        fy_error("bench-prec: out of memory for %d tokens", n);
        goto out;
    }
    printf("ferry bench-prec: %s, the first %d tokens of %s (BOS included), chunks of %ld, %ld threads, %s\n", c->name,
           n, text_path, chunk, threads, fy_backend_describe(be));
    double t0 = fy_now_s();
    if (!fy_exact_forward(m, (int)threads, tok, n, ref_a, ref_m, ref_lg)) {
        fy_error("bench-prec: out of memory for the reference");
        goto out;
    }
    double ref_ppl = ppl_of(ref_lg, tok, n, V);
    printf("exact (double-precision forward, dequantized weights): perplexity %.4f (%.1f s)\n", ref_ppl,
           fy_now_s() - t0);
    printf("\n%-32s %10s %8s %10s %9s", "configuration", "perplexity", "vs exact", "KL (nats)", "logit err");
    for (int i = 0; i < n_layers_arg; i++) printf("  L%-2d attn  L%-2d mlp", layers[i], layers[i]);
    printf(" %7s\n", "s");
    for (size_t ci = 0; ci < sizeof(CONFS) / sizeof(CONFS[0]); ci++) {
        double secs = 0;
        if (ferry_run(m, CONFS[ci].x2 ? be2 : be, &CONFS[ci], tok, n, (int32_t)chunk, got_a, got_m, got_lg, &secs))
            goto out;
        double p = ppl_of(got_lg, tok, n, V), kl = 0;
        for (int32_t t = 0; t + 1 < n; t++) kl += fy_exact_kl(ref_lg + (size_t)t * V, got_lg + (size_t)t * V, V);
        printf("%-32s %10.4f %+7.3f%% %10.2e %9.2e", CONFS[ci].name, p, 100 * (p / ref_ppl - 1), kl / (n - 1),
               fy_exact_rel_err(got_lg, ref_lg, nl));
        size_t ld = (size_t)n * (size_t)c->dim;
        for (int i = 0; i < n_layers_arg; i++)
            printf("  %8.2e %8.2e",
                   fy_exact_rel_err(got_a + (size_t)layers[i] * ld, ref_a + (size_t)layers[i] * ld, ld),
                   fy_exact_rel_err(got_m + (size_t)layers[i] * ld, ref_m + (size_t)layers[i] * ld, ld));
        printf(" %7.1f\n", secs);
        fflush(stdout);
    }
    rc = 0;
out:
    fy_free(tok);
    fy_free(text);
    fy_free(ref_a), fy_free(ref_m), fy_free(ref_lg), fy_free(got_a), fy_free(got_m), fy_free(got_lg);
    fy_backend_destroy(be);
    fy_backend_destroy(be2);
    fy_model_destroy(m);
    return rc;
}

/*
 * bench_evict.c - `ferry bench-evict`: what KV budgets (evict.h) cost in
 * quality and buy in memory and speed, on the real model.
 *   quality: teacher-forced perplexity over the first N tokens of a fixed
 *            English text, with every block kept and with StreamingLLM and
 *            H2O at budgets that are fractions of N (chunks of 16 tokens,
 *            the policy applied after each, as the engine does after a
 *            commit);
 *   probe:   a fact stated at the start of a long prompt, asked for at its
 *            end, under each policy (greedy answer, and whether it holds
 *            the fact);
 *   speed:   decode tokens/s and blocks held at several context lengths,
 *            every block kept against each policy at one budget.
 * Every figure of a policy has its every-block-kept reference from the
 * same run.
 *
 * Not here: serving (ferry-bench against `ferry serve` with kv.evict), the
 * disaggregated path.
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
#include "kv/evict.h"
#include "kv/kv.h"
#include "common/log.h"
#include "common/mem.h"
#include "model/model.h"
#include "engine/runner.h"
#include "model/tokenizer.h"
#include "bench/stats.h"

enum { CHUNK = 16, SINK = 64, MAX_BUDGETS = 8, MAX_CTX = 8 };

static void usage(FILE *f)
{
    fprintf(f, "usage: ferry bench-evict -m FILE --text FILE [--tokens N] [--budgets F,F,...] [--context N,N,...]\n"
               "                         [--threads N]\n"
               "  perplexity, a retrieval probe and decode speed with KV budgets (StreamingLLM, H2O) against\n"
               "  every block kept\n"
               "  -m, --model FILE   the model (default model of `make model`)\n"
               "  --text FILE        a long English text (tests/data/gpl-3.0.txt)\n"
               "  --tokens N         tokens of it for perplexity (default 4096; 0: skip it)\n"
               "  --budgets LIST     budgets as fractions of --tokens (default 0.1,0.2,0.4)\n"
               "  --context LIST     context lengths for decode speed (default 2048,4096,8000; 0: skip); each\n"
               "                     plus 64 decode steps must fit the model's context\n"
               "  --threads N        CPU threads (default 2)\n"
               "  -h, --help\n");
}

/* The split of a budget: SINK sink tokens (less for tiny budgets); H2O
 * keeps half of the rest by score and half as the recent window. */
static fy_evict_params_t split(fy_evict_policy_t pol, int32_t budget)
{
    fy_evict_params_t p = {.policy = pol};
    if (pol == FY_EVICT_NONE) return p;
    p.sink_tokens = budget / 8 < SINK ? budget / 8 : SINK;
    int32_t rest = budget - p.sink_tokens;
    p.heavy_tokens = pol == FY_EVICT_H2O ? rest / 2 : 0;
    p.recent_tokens = rest - p.heavy_tokens;
    return p;
}

typedef struct rig {
    const fy_model_t *m;
    fy_backend_t *be;
    fy_runner_t *r;
    fy_kv_hasher_t *h;
    fy_kvm_t *kvm;
    int32_t vocab, max_ctx;
    float *logits; /* [chunk, vocab] */
    float *scores;
    int32_t *evict_buf;
    fy_evict_cand_t *evict_cand;
} rig_t;

static void rig_close(rig_t *g)
{
    fy_kvm_destroy(g->kvm);
    fy_kv_hasher_destroy(g->h);
    fy_runner_destroy(g->r);
    fy_free(g->logits);
    fy_free(g->scores);
    fy_free(g->evict_buf);
    fy_free(g->evict_cand);
    memset(g, 0, sizeof(*g));
}

static fy_status_t rig_open(rig_t *g, const fy_model_t *m, fy_backend_t *be, int32_t max_ctx, int32_t chunk)
{
    memset(g, 0, sizeof(*g));
    g->m = m, g->be = be, g->max_ctx = max_ctx;
    g->vocab = fy_model_config(m)->vocab_size;
    fy_runner_params_t rp;
    fy_runner_params_default(&rp);
    rp.max_batch_tokens = chunk;
    rp.max_seqs = 1;
    rp.max_logits = chunk;
    rp.max_ctx = max_ctx;
    fy_status_t st;
    /* one sequence of the whole context, reserved as it goes, no admission */
    if ((rp.n_kv_blocks = fy_runner_pool_blocks(m, 0, &rp, max_ctx, 1, 0, 0)) < 1) return FY_ERR_INVALID;
    if ((st = fy_runner_create(m, be, &rp, &g->r)) || (st = fy_kv_hasher_create_random(&g->h))) goto fail;
    fy_kvm_params_t kp;
    fy_runner_kvm_params(g->r, &kp);
    kp.hasher = g->h;
    kp.prefix_caching = false;
    kp.watermark = 0;
    if ((st = fy_kvm_create(&kp, &g->kvm))) goto fail;
    g->logits = fy_malloc((size_t)chunk * (size_t)g->vocab * sizeof(float));
    g->scores = fy_calloc((size_t)(max_ctx / rp.block_size + 1), sizeof(float));
    g->evict_buf = fy_calloc((size_t)(max_ctx / rp.block_size + 1), sizeof(int32_t));
    g->evict_cand = fy_calloc((size_t)(max_ctx / rp.block_size + 1), sizeof(fy_evict_cand_t));
    if (!g->logits || !g->scores || !g->evict_buf || !g->evict_cand) {
        st = FY_ERR_NOMEM;
        goto fail;
    }
    return FY_OK;
fail:
    rig_close(g);
    return st;
}

/* One sequence through the model in chunks under policy p: the tokens'
 * negative log-likelihoods (nll, or NULL) and the greedy continuation of
 * n_gen tokens (gen, or NULL); blocks held at the end; decode seconds. */
static fy_status_t run_seq(rig_t *g, const fy_evict_params_t *p, const int32_t *tok, int32_t n, int32_t chunk,
                           double *nll, int32_t *gen, int32_t n_gen, int32_t *held_p, double *decode_s)
{
    fy_block_table_t bt;
    fy_status_t st = fy_kvm_seq_init(g->kvm, &bt, n + n_gen + 1, NULL);
    if (st) return st;
    int32_t *all = fy_malloc((size_t)(n + n_gen + 1) * sizeof(int32_t));
    if (!all) {
        fy_kvm_seq_deinit(&bt);
        return FY_ERR_NOMEM;
    }
    memcpy(all, tok, (size_t)n * sizeof(int32_t));
    memset(g->scores, 0, sizeof(float) * (size_t)(g->max_ctx / 16 + 1));
    float *sc = p->policy == FY_EVICT_H2O ? g->scores : NULL;
    int32_t cap = g->max_ctx / bt.block_size + 1;
    double t_dec = 0;
    for (int32_t done = 0; done < n + n_gen && !st;) {
        bool decoding = done >= n;
        int32_t k = decoding ? 1 : (n - done < chunk ? n - done : chunk);
        int32_t want = nll ? k : (done + k == n || decoding ? 1 : 0);
        if ((st = fy_kvm_seq_reserve(g->kvm, &bt, done + k, NULL))) break;
        fy_forward_seq_t f = {&bt, all + done, k, done, want, sc};
        double t = fy_now_s();
        if ((st = fy_runner_forward(g->r, &f, 1, g->logits))) break;
        if (decoding) t_dec += fy_now_s() - t;
        for (int32_t i = 0; nll && i < k; i++) { /* row i predicts token done + i + 1 */
            if (done + i + 1 >= n) break;
            const float *lg = g->logits + (size_t)i * (size_t)g->vocab;
            float mx = lg[0];
            for (int32_t v = 1; v < g->vocab; v++) mx = lg[v] > mx ? lg[v] : mx;
            double s = 0;
            for (int32_t v = 0; v < g->vocab; v++) s += exp((double)(lg[v] - mx));
            nll[done + i + 1] = -((double)(lg[all[done + i + 1]] - mx) - log(s));
        }
        done += k;
        fy_kvm_seq_commit(g->kvm, &bt, all, done, NULL);
        int32_t ne = fy_evict_choose(p, &bt, sc, g->evict_buf, g->evict_cand, cap);
        if (ne && (st = fy_kvm_seq_evict(g->kvm, &bt, g->evict_buf, ne, NULL))) break;
        if (want && done >= n && done < n + n_gen) { /* greedy next */
            const float *lg = g->logits + (size_t)(want - 1) * (size_t)g->vocab;
            int32_t best = 0;
            for (int32_t v = 1; v < g->vocab; v++)
                if (lg[v] > lg[best]) best = v;
            all[done] = best;
            if (gen) gen[done - n] = best;
        }
    }
    if (st) fy_error("bench-evict: a run of %d + %d tokens failed: %s", n, n_gen, fy_status_str(st));
    if (held_p) *held_p = fy_block_table_held(&bt);
    if (decode_s) *decode_s = t_dec;
    fy_kvm_seq_release(g->kvm, &bt);
    fy_kvm_seq_deinit(&bt);
    fy_free(all);
    return st;
}

static const fy_evict_policy_t POLICIES[3] = {FY_EVICT_NONE, FY_EVICT_STREAMING, FY_EVICT_H2O};

static int quality(rig_t *g, const int32_t *tok, int32_t n, const double *budgets, int nb)
{
    double *nll = fy_calloc((size_t)n, sizeof(double));
    if (!nll) return 1;
    printf("\nperplexity over %d tokens of the text, chunks of %d, the policy after each\n", n, CHUNK);
    printf("%-10s %8s %8s %8s %8s  %10s %8s\n", "policy", "budget", "sink", "recent", "heavy", "perplexity", "vs full");
    double full = 0;
    for (int b = -1; b < nb; b++) {
        for (int pi = b < 0 ? 0 : 1; pi < (b < 0 ? 1 : 3); pi++) {
            int32_t budget = b < 0 ? n : (int32_t)(budgets[b] * n);
            fy_evict_params_t p = split(POLICIES[pi], budget);
            if (run_seq(g, &p, tok, n, CHUNK, nll, NULL, 0, NULL, NULL) != FY_OK) {
                fy_free(nll);
                return 1;
            }
            double s = 0;
            for (int32_t i = 1; i < n; i++) s += nll[i];
            double ppl = exp(s / (n - 1));
            if (b < 0) full = ppl;
            printf("%-10s %8d %8d %8d %8d  %10.3f %7.3fx\n", fy_evict_policy_name(p.policy), budget, p.sink_tokens,
                   p.recent_tokens, p.heavy_tokens, ppl, ppl / full);
            fflush(stdout);
        }
    }
    fy_free(nll);
    return 0;
}

static int probe(rig_t *g, const fy_tokenizer_t *tk, const int32_t *text, int32_t n_text, double budget_frac)
{
    /* the fact sits after 300 tokens of the text: past any sink */
    static const char head[] = "\n\nRemember this: the secret number is 4821.\n\n";
    static const char tail[] = "\n\nQuestion: what is the secret number?\nAnswer: the secret number is";
    int32_t a[64], c[64];
    size_t na, nc;
    if (fy_tokenizer_encode(tk, head, strlen(head), false, false, a, 64, &na) ||
        fy_tokenizer_encode(tk, tail, strlen(tail), false, false, c, 64, &nc))
        return 1;
    const int32_t pre = 300; /* text[0] is BOS */
    int32_t n = (int32_t)(na + (size_t)n_text + nc);
    int32_t *p = fy_malloc((size_t)n * sizeof(int32_t));
    if (!p) return 1;
    memcpy(p, text, (size_t)pre * sizeof(int32_t));
    memcpy(p + pre, a, na * sizeof(int32_t));
    memcpy(p + pre + na, text + pre, (size_t)(n_text - pre) * sizeof(int32_t));
    memcpy(p + na + n_text, c, nc * sizeof(int32_t));
    printf("\nretrieval probe: %d tokens of the text, \"the secret number is 4821\", %d more, the question (%d "
           "tokens in all), greedy\n",
           pre, n_text - pre, n);
    int rc = 0;
    for (int pi = 0; pi < 3 && !rc; pi++) {
        fy_evict_params_t q = split(POLICIES[pi], pi ? (int32_t)(budget_frac * n) : n);
        int32_t gen[8];
        char out[256];
        if (run_seq(g, &q, p, n, 512, NULL, gen, 8, NULL, NULL) != FY_OK) {
            rc = 1;
            break;
        }
        fy_tokenizer_decode(tk, gen, 8, false, out, sizeof(out));
        for (char *s = out; *s; s++)
            if (*s == '\n') *s = ' ';
        printf("%-10s budget %5d: \"%s\" %s\n", fy_evict_policy_name(q.policy), fy_evict_budget(&q), out,
               strstr(out, "4821") ? "(kept the fact)" : "(lost it)");
    }
    fy_free(p);
    return rc;
}

static int speed(rig_t *g, const int32_t *ctx, int nctx, double budget_frac, int vocab)
{
    printf("\ndecode speed: a context of random tokens in 512-token chunks, then 64 greedy steps (budget %.0f%%)\n",
           budget_frac * 100);
    printf("%8s %-10s %8s %10s %10s\n", "context", "policy", "budget", "held", "decode/s");
    uint64_t s = 20261123;
    for (int c = 0; c < nctx; c++) {
        int32_t n = ctx[c];
        int32_t *tok = fy_malloc((size_t)n * sizeof(int32_t));
        if (!tok) return 1;
        for (int32_t i = 0; i < n; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            tok[i] = (int32_t)((s >> 33) % (uint64_t)(vocab - 10)) + 5;
        }
        for (int pi = 0; pi < 3; pi++) {
            fy_evict_params_t q = split(POLICIES[pi], pi ? (int32_t)(budget_frac * n) : n);
            int32_t held;
            double dt;
            if (run_seq(g, &q, tok, n, 512, NULL, NULL, 64, &held, &dt) != FY_OK) {
                fy_free(tok);
                return 1;
            }
            printf("%8d %-10s %8d %10d %10.1f\n", n, fy_evict_policy_name(q.policy), fy_evict_budget(&q), held,
                   64 / dt);
            fflush(stdout);
        }
        fy_free(tok);
    }
    return 0;
}

int fy_cmd_bench_evict(int argc, char **argv)
{
    const char *model_path = NULL, *text_path = NULL;
    long n_tok = 4096, threads = 2;
    double budgets[MAX_BUDGETS] = {0.1, 0.2, 0.4};
    int nb = 3, ctx[MAX_CTX] = {2048, 4096, 8000}, nctx = 3;
    enum { O_TEXT = 256, O_TOKENS, O_BUDGETS, O_CONTEXT, O_THREADS };
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},
        {"text", required_argument, 0, O_TEXT},
        {"tokens", required_argument, 0, O_TOKENS},
        {"budgets", required_argument, 0, O_BUDGETS},
        {"context", required_argument, 0, O_CONTEXT},
        {"threads", required_argument, 0, O_THREADS},
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
            if (!fy_cli_parse_int("--tokens", optarg, 0, 1 << 20, &n_tok)) return 2;
            if (n_tok > 0 && n_tok < 64) {
                fprintf(stderr, "ferry: --tokens: 0 (no perplexity) or at least 64\n");
                return 2;
            }
            break;
        case O_BUDGETS: {
            nb = 0;
            char buf[256], *save = NULL;
            snprintf(buf, sizeof(buf), "%s", optarg);
            for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                double d;
                if (nb == MAX_BUDGETS || !fy_cli_parse_float("--budgets", t, 0.01, 1.0, &d)) return 2;
                budgets[nb++] = d;
            }
            break;
        }
        case O_CONTEXT:
            if (!fy_cli_parse_int_list("--context", optarg, 0, 1 << 20, ctx, MAX_CTX, &nctx)) return 2;
            if (nctx == 1 && ctx[0] == 0) nctx = 0;
            break;
        case O_THREADS:
            if (!fy_cli_parse_int("--threads", optarg, 1, 1024, &threads)) return 2;
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!fy_cli_no_operands("bench-evict", argc, argv, usage)) return 2;
    if (!model_path || !text_path) {
        fprintf(stderr, "ferry: bench-evict needs --model and --text\n");
        usage(stderr);
        return 2;
    }
    char *text = fy_cli_read_file(text_path);
    if (!text) return 1;
    size_t tlen = strlen(text);
    fy_model_t *m = NULL;
    fy_backend_t *be = NULL;
    fy_backend_params_t bp = {.n_threads = (int)threads};
    int32_t *tok = NULL;
    int rc = 1;
    size_t n_text = 0;
    if (fy_model_load(model_path, &m) || fy_backend_create("cpu", &bp, &be)) goto out;
    const fy_tokenizer_t *tk = fy_model_tokenizer(m);
    tok = fy_malloc((tlen + 2) * sizeof(int32_t));
    if (!tok || fy_tokenizer_encode(tk, text, tlen, true, false, tok, tlen + 2, &n_text)) goto out;
    if ((size_t)n_tok > n_text) {
        fy_error("bench-evict: %s is %zu tokens; --tokens %ld asks for more", text_path, n_text, n_tok);
        goto out;
    }
    const fy_model_config_t *c = fy_model_config(m);
    int32_t max_ctx = (int32_t)n_tok + 64 > 2048 + 128 ? (int32_t)n_tok + 64 : 2048 + 128; /* and the probe */
    for (int i = 0; i < nctx; i++) max_ctx = ctx[i] + 128 > max_ctx ? ctx[i] + 128 : max_ctx;
    if (max_ctx > c->max_ctx) max_ctx = c->max_ctx;
    printf("ferry bench-evict: %s, %zu tokens of %s, f16 KV, blocks of 16, whole-block eviction\n", c->name, n_text,
           text_path);
    rig_t g;
    if (rig_open(&g, m, be, max_ctx, 512) != FY_OK) goto out;
    for (int i = 0; i < nctx; i++)
        if (ctx[i] + 65 > c->max_ctx) {
            fy_error("bench-evict: --context %d: with 64 decode steps past the model's context of %d", ctx[i],
                     c->max_ctx);
            rig_close(&g);
            goto out;
        }
    rc = n_tok ? quality(&g, tok, (int32_t)n_tok, budgets, nb) : 0;
    if (!rc) rc = probe(&g, tk, tok, 2000 < (int32_t)n_text ? 2000 : (int32_t)n_text, 0.2);
    if (!rc && nctx) rc = speed(&g, ctx, nctx, 0.2, c->vocab_size);
    rig_close(&g);
out:
    fy_free(tok);
    fy_free(text);
    fy_backend_destroy(be);
    fy_model_destroy(m);
    return rc;
}

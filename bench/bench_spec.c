/*
 * bench_spec.c - `ferry bench-spec`: decode throughput with and without
 * speculative decoding, on the serving engine, at batch 1 and batch 8,
 * on two workloads:
 *   rewrite  chat prompts asking to rewrite a given paragraph with its
 *            typos corrected: the answer repeats most of the prompt, where
 *            n-gram lookup should shine;
 *   open     open-ended chat prompts (stories, explanations), where it
 *            should find little and must not cost much.
 * Greedy, end of turn honoured, prefix caching off.  Batch 1 runs the
 * prompts one after another, batch 8 all at once.  Decode tok/s counts the
 * tokens after each group's last first token, over the time from that
 * token to the group's last one.  Each group of prompts runs under every
 * configuration back to back, so a ratio compares runs seconds apart
 * under the same machine noise; the table gives medians over repetitions
 * and the median of the per-repetition ratios with their range.  The greedy text of every configuration is compared, token for
 * token, with the run without speculation.
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
#include "model/prompt.h"
#include "engine/runner.h"
#include "engine/spec.h"
#include "bench/stats.h"

#define N_PROMPTS 8
#define MAX_CFG 5
#define MAX_REPS 20

static const char *const REWRITE[N_PROMPTS] = {
    "The quick brown fox jumpd over the lazy dog. It was a sunny day in the village, and the childen were playing in "
    "the park near the old church. Their parents watched from the benches, talking about the harvest and the wether.",
    "Our team met on monday to dicuss the new project plan. We agreed to finish the first draft by the end of the "
    "month, and to share it with the managment team before the review. Everyone should send there notes to Anna.",
    "The library will be closed next week for renovations. During this time, books can be returned at the front "
    "desk of the town hall. We apologise for any inconvenence and thank you for your pacience.",
    "To make the bread, mix the flour, water, salt and yeast in a large bowl. Knead the dough for ten minuts until it "
    "is smooth, then let it rise in a warm place for an hour before baking it in a hot oven.",
    "The museum's new exibition shows paintings from the ninteenth century, including several works that have never "
    "been displayed in public before. Tickets are avalable online and at the entrance.",
    "Please remember that the office heating will be turned off on saturday for maintenence. If you plan to work "
    "over the weekend, bring a warm jacket or work from home if you can.",
    "The river flows from the mountains in the north to the sea in the south. Along its banks, farmers grow wheat, "
    "corn and vegetables, and small villages have stood there for hundreds of years.",
    "Thank you for your order. Your package was shiped this morning and should arive within three to five business "
    "days. You can track it with the number in the email we sent you.",
};

static const char *const OPEN[N_PROMPTS] = {
    "Write a short story about a robot who learns to paint.",
    "Explain how photosynthesis works to a ten year old.",
    "What are some good habits for staying healthy while working from home?",
    "Describe a day in the life of a lighthouse keeper in the nineteenth century.",
    "Give me three ideas for a birthday party for a seven year old.",
    "Why is the sky blue? Explain it simply.",
    "Write a poem about the ocean at night.",
    "What should I pack for a week-long hiking trip in the mountains?",
};

typedef struct track {
    int32_t *tok;
    double *t;
    int32_t n, cap;
    bool done, failed;
} track_t;

static void on_event(void *arg, const fy_event_t *ev)
{
    track_t *k = arg;
    if (ev->kind == FY_EVENT_TOKEN && k->n < k->cap) {
        k->tok[k->n] = ev->token;
        k->t[k->n++] = fy_now_s();
    }
    if (ev->kind != FY_EVENT_TOKEN) k->done = true;
    if (ev->kind == FY_EVENT_ERROR) {
        k->failed = true;
        fprintf(stderr, "ferry: bench-spec: request failed: %s\n", ev->message);
    }
}

typedef struct rig {
    fy_runner_t *r;
    fy_kvm_t *kvm;
    const fy_tokenizer_t *tok;
    int32_t *ids[2][N_PROMPTS];
    int32_t n_ids[2][N_PROMPTS];
    int32_t gen;
} rig_t;

typedef struct result {
    double tps;
    uint64_t proposed, accepted, steps;
    uint64_t tokens, fwd_steps; /* generated tokens and engine steps, prompts included */
    double propose_s;
    track_t tr[N_PROMPTS];
} result_t;

/* Decode tok/s of one group of requests that ran together. */
static void group_figures(const track_t *tr, int n, double *tokens, double *secs)
{
    double t0 = 0, t1 = 0;
    for (int i = 0; i < n; i++) {
        if (tr[i].n == 0) continue;
        if (tr[i].t[0] > t0) t0 = tr[i].t[0];
        if (tr[i].t[tr[i].n - 1] > t1) t1 = tr[i].t[tr[i].n - 1];
    }
    for (int i = 0; i < n; i++)
        for (int32_t j = 0; j < tr[i].n; j++) *tokens += tr[i].t[j] > t0;
    *secs += t1 - t0;
}

/* Runs prompts [first, first + n) of workload w together on e. */
static fy_status_t run_group(rig_t *g, fy_engine_t *e, int w, int first, int n, result_t *res, double *tokens,
                             double *secs)
{
    fy_status_t st = FY_OK;
    for (int i = first; i < first + n; i++) {
        track_t *k = &res->tr[i];
        k->n = 0;
        k->done = k->failed = false;
        fy_genspec_t rq;
        fy_genspec_default(&rq);
        rq.max_tokens = g->gen;
        uint64_t id;
        if ((st = fy_engine_submit(e, g->ids[w][i], g->n_ids[w][i], &rq, NULL, on_event, k, &id)) != FY_OK) return st;
    }
    while (st == FY_OK && !fy_engine_idle(e)) st = fy_engine_step(e);
    for (int i = first; i < first + n; i++)
        if (res->tr[i].failed) st = FY_ERR_INTERNAL;
    group_figures(res->tr + first, n, tokens, secs);
    return st;
}

/* One repetition: every group of prompts runs under every configuration
 * back to back, so each ratio compares runs a few seconds apart. */
static fy_status_t run_rep(rig_t *g, int w, int batch, const fy_spec_params_t *cfg, int n_cfg, result_t **res)
{
    fy_engine_t *e[MAX_CFG] = {0};
    double tokens[MAX_CFG] = {0}, secs[MAX_CFG] = {0};
    fy_status_t st = FY_OK;
    for (int c = 0; c < n_cfg && st == FY_OK; c++) {
        fy_engine_params_t ep;
        fy_engine_params_default(&ep);
        ep.max_num_seqs = 8;
        ep.max_num_batched_tokens = 512;
        ep.spec = cfg[c];
        st = fy_engine_create(g->r, g->kvm, g->tok, &ep, &e[c]);
    }
    for (int first = 0; first < N_PROMPTS && st == FY_OK; first += batch) {
        int n = batch < N_PROMPTS - first ? batch : N_PROMPTS - first;
        for (int c = 0; c < n_cfg && st == FY_OK; c++)
            st = run_group(g, e[c], w, first, n, res[c], &tokens[c], &secs[c]);
    }
    for (int c = 0; c < n_cfg; c++) {
        if (!e[c]) continue;
        fy_engine_stats_t es;
        fy_engine_stats(e[c], &es);
        res[c]->tps = secs[c] > 0 ? tokens[c] / secs[c] : 0;
        res[c]->proposed = es.spec_proposed;
        res[c]->accepted = es.spec_accepted;
        res[c]->steps = es.spec_steps;
        res[c]->tokens = es.generation_tokens;
        res[c]->fwd_steps = es.steps;
        res[c]->propose_s = es.propose_s;
        fy_engine_destroy(e[c]);
    }
    return st;
}

/* Prompts and the first repetition's greedy output without speculation. */
static bool dump_tokens(const char *path, const rig_t *g, int w, const result_t *off)
{
    FILE *f = fopen(path, "a");
    if (!f) {
        fprintf(stderr, "ferry: bench-spec: %s: %m\n", path);
        return false;
    }
    for (int i = 0; i < N_PROMPTS; i++) {
        fprintf(f, "P%d", w);
        for (int32_t j = 0; j < g->n_ids[w][i]; j++) fprintf(f, " %d", g->ids[w][i][j]);
        fprintf(f, "\nO%d", w);
        for (int32_t j = 0; j < off->tr[i].n; j++) fprintf(f, " %d", off->tr[i].tok[j]);
        fprintf(f, "\n");
    }
    return fclose(f) == 0;
}

static void usage(FILE *f)
{
    fprintf(
        f, "usage: ferry bench-spec [-m MODEL] [--draft self:L|draft:FILE] [--spec-k 8] [--gen-tokens 160] [--reps 3]\n"
           "                        [--batch 1|8] [--workload rewrite|open|both] [--threads N] [--isa NAME]\n"
           "                        [--dump FILE]\n"
           "  decode throughput with and without speculative decoding (n-gram and a draft model)\n"
           "  -m, --model PATH      .gguf file or Hugging Face folder (default " FY_CLI_DEFAULT_MODEL ")\n"
           "      --draft SPEC      the draft: self:LAYERS (the target's first layers) or draft:MODEL_FILE\n"
           "      --spec-k K        proposed tokens per step at most (default 8)\n"
           "      --gen-tokens N    output tokens per request (default 160)\n"
           "      --reps N          runs per figure; the median is kept (default 3)\n"
           "      --batch B         one batch size instead of 1 and 8\n"
           "      --workload W      rewrite (answers that repeat the prompt), open (stories), or both (default)\n"
           "      --dump FILE       append each prompt's tokens and its greedy output without speculation, as\n"
           "                        lines 'P<workload> ids..' and 'O<workload> ids..' (for offline proposer studies:\n"
           "                        bench/spec_oracle.py)\n"
           "  -t, --threads N       CPU threads (default: one per core)\n"
           "      --isa NAME        CPU kernels (default auto)\n"
           "  -h, --help\n");
}

int fy_cmd_bench_spec(int argc, char **argv)
{
    enum { O_DRAFT = 256, O_REPS, O_GEN, O_SPEC_K, O_ISA, O_BATCH, O_WORKLOAD, O_DUMP };
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},
        {"draft", required_argument, 0, O_DRAFT},
        {"reps", required_argument, 0, O_REPS},
        {"gen-tokens", required_argument, 0, O_GEN},
        {"spec-k", required_argument, 0, O_SPEC_K},
        {"threads", required_argument, 0, 't'},
        {"isa", required_argument, 0, O_ISA},
        {"batch", required_argument, 0, O_BATCH},
        {"workload", required_argument, 0, O_WORKLOAD},
        {"dump", required_argument, 0, O_DUMP},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *model = FY_CLI_DEFAULT_MODEL, *draft_spec = NULL, *isa = NULL, *dump = NULL;
    long reps = 3, gen = 160, threads = 0, k_max = 8, batch;
    int batches[2] = {1, 8}, n_batches = 2, workloads = 3;
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "m:t:h", opts, NULL)) != -1) {
        switch (opt) {
        case 'm': model = optarg; break;
        case O_DRAFT:
            if (strncmp(optarg, "self:", 5) && strncmp(optarg, "draft:", 6)) {
                fprintf(stderr, "ferry: --draft expects self:LAYERS or draft:MODEL_FILE\n");
                return 2;
            }
            draft_spec = optarg;
            break;
        case O_REPS:
            if (!fy_cli_parse_int("--reps", optarg, 1, MAX_REPS, &reps)) return 2;
            break;
        case O_GEN:
            if (!fy_cli_parse_int("--gen-tokens", optarg, 8, 4096, &gen)) return 2;
            break;
        case O_SPEC_K:
            if (!fy_cli_parse_int("--spec-k", optarg, 1, FY_SPEC_MAX_K, &k_max)) return 2;
            break;
        case 't':
            if (!fy_cli_parse_int("--threads", optarg, 1, 256, &threads)) return 2;
            break;
        case O_ISA: isa = optarg; break;
        case O_BATCH:
            if (!fy_cli_parse_int("--batch", optarg, 1, 8, &batch)) return 2;
            batches[0] = (int)batch;
            n_batches = 1;
            break;
        case O_DUMP: dump = optarg; break;
        case O_WORKLOAD:
            if (!strcmp(optarg, "rewrite"))
                workloads = 1;
            else if (!strcmp(optarg, "open"))
                workloads = 2;
            else if (!strcmp(optarg, "both"))
                workloads = 3;
            else {
                fprintf(stderr, "ferry: --workload expects rewrite, open or both\n");
                return 2;
            }
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!fy_cli_no_operands("bench-spec", argc, argv, usage)) return 2;
    int rc = 1;
    fy_model_t *m = NULL;
    fy_engine_stack_t s = {0};
    fy_backend_t *be = NULL;
    fy_spec_draft_t *draft = NULL;
    rig_t g = {.gen = (int32_t)gen};
    result_t *res = NULL;
    /* the worker-wide off switch logs at info; the table has the figures */
    if (fy_log_get_level() == FY_LOG_INFO) fy_log_set_level(FY_LOG_WARN);
    if (fy_model_load(model, &m) != FY_OK) goto out;
    g.tok = fy_model_tokenizer(m);
    for (int w = 0; w < 2; w++) {
        for (int i = 0; i < N_PROMPTS; i++) {
            char text[2048];
            if (w == 0)
                snprintf(text, sizeof(text), "Rewrite the following text, correcting the typos:\n\n%s", REWRITE[i]);
            else
                snprintf(text, sizeof(text), "%s", OPEN[i]);
            if (fy_prompt_tokens(m, NULL, text, true, &g.ids[w][i], &g.n_ids[w][i]) != FY_OK) goto out;
        }
    }
    fy_engine_build_t eb; /* no engine: run_rep makes one per configuration over the runner */
    fy_engine_build_default(&eb);
    eb.threads = (int)threads;
    eb.isa = isa;
    eb.runner.max_seqs = 8;
    eb.runner.max_logits = 8 + 8 * (int32_t)k_max;
    eb.runner.max_ctx = 1024;
    eb.runner.n_kv_blocks = 8 * (1024 / 16);
    eb.prefix_caching = false; /* every run computes its prompts */
    eb.draft = draft_spec;
    eb.no_engine = true;
    if (fy_engine_stack_create(m, &eb, &s) != FY_OK) goto out;
    be = s.be;
    g.r = s.runner;
    g.kvm = s.kvm;
    draft = s.draft;

    /* the configurations, off first */
    fy_spec_params_t cfg[MAX_CFG];
    const char *names[MAX_CFG];
    int n_cfg = 0;
    fy_spec_params_default(&cfg[n_cfg]);
    names[n_cfg++] = "off";
    fy_spec_params_default(&cfg[n_cfg]);
    cfg[n_cfg].method = FY_SPEC_NGRAM;
    cfg[n_cfg].lookup = FY_SPEC_LOOKUP_NGRAM;
    cfg[n_cfg].k_max = (int32_t)k_max;
    names[n_cfg++] = "ngram";
    fy_spec_params_default(&cfg[n_cfg]);
    cfg[n_cfg].method = FY_SPEC_NGRAM;
    cfg[n_cfg].lookup = FY_SPEC_LOOKUP_SUFFIX;
    cfg[n_cfg].history = 16;
    cfg[n_cfg].k_max = (int32_t)k_max;
    names[n_cfg++] = "suffix, history 16";
    fy_spec_params_default(&cfg[n_cfg]);
    cfg[n_cfg].method = FY_SPEC_NGRAM;
    cfg[n_cfg].lookup = FY_SPEC_LOOKUP_SUFFIX;
    cfg[n_cfg].history = 0;
    cfg[n_cfg].k_max = (int32_t)k_max;
    names[n_cfg++] = "suffix";
    if (draft) {
        fy_spec_params_default(&cfg[n_cfg]);
        cfg[n_cfg].method = FY_SPEC_DRAFT;
        cfg[n_cfg].k_max = (int32_t)k_max;
        cfg[n_cfg].draft = fy_spec_draft_runner(draft);
        cfg[n_cfg].draft_kvm = fy_spec_draft_kvm(draft);
        names[n_cfg++] = draft_spec;
    }
    res = fy_calloc((size_t)MAX_CFG * MAX_REPS, sizeof(result_t));
    if (!res) goto out;
    for (int c = 0; c < MAX_CFG * MAX_REPS; c++)
        for (int i = 0; i < N_PROMPTS; i++) {
            res[c].tr[i].cap = (int32_t)gen;
            res[c].tr[i].tok = fy_malloc((size_t)gen * sizeof(int32_t));
            res[c].tr[i].t = fy_malloc((size_t)gen * sizeof(double));
            if (!res[c].tr[i].tok || !res[c].tr[i].t) goto out;
        }

    time_t now = time(NULL);
    char date[32], desc[256];
    strftime(date, sizeof(date), "%Y-%m-%d", gmtime(&now));
    fy_model_describe(m, desc, sizeof(desc));
    printf("ferry bench-spec, %s: %s; %s; greedy, up to %ld tokens, k up to %ld, %d prompts per workload, "
           "%ld repetitions%s%s\n\n",
           date, desc, fy_backend_describe(be), gen, k_max, N_PROMPTS, reps, draft ? ", draft " : "",
           draft ? fy_spec_draft_describe(draft) : "");
    printf(
        "| workload | batch | speculation | decode tok/s | vs off (min-max) | accepted / proposed | mean accepted per "
        "verification | tokens per step | proposing ms | greedy text |\n");
    printf("|---|---:|---|---:|---:|---:|---:|---:|---:|---|\n");
    for (int w = 0; w < 2; w++) {
        if (!(workloads & (1 << w))) continue;
        for (int b = 0; b < n_batches; b++) {
            for (long k = 0; k < reps; k++) {
                result_t *rr[MAX_CFG];
                for (int c = 0; c < n_cfg; c++) rr[c] = &res[c * MAX_REPS + k];
                if (run_rep(&g, w, batches[b], cfg, n_cfg, rr) != FY_OK) goto out;
            }
            if (dump && !dump_tokens(dump, &g, w, res)) goto out;
            for (int c = 0; c < n_cfg; c++) {
                double tps[MAX_REPS], ratio[MAX_REPS];
                uint64_t prop = 0, acc = 0, steps = 0, toks = 0, fsteps = 0;
                double ps = 0;
                int diff_req = -1, diff_at = -1;
                for (long k = 0; k < reps; k++) {
                    result_t *r = &res[c * MAX_REPS + k], *off = &res[k];
                    tps[k] = r->tps;
                    ratio[k] = off->tps > 0 ? r->tps / off->tps : 0;
                    prop += r->proposed;
                    acc += r->accepted;
                    steps += r->steps;
                    toks += r->tokens;
                    fsteps += r->fwd_steps;
                    ps += r->propose_s;
                    for (int i = 0; i < N_PROMPTS && diff_req < 0; i++) {
                        const track_t *x = &off->tr[i], *y = &r->tr[i];
                        for (int32_t j = 0; j < x->n || j < y->n; j++) {
                            if (j >= x->n || j >= y->n || x->tok[j] != y->tok[j]) {
                                diff_req = i;
                                diff_at = j;
                                break;
                            }
                        }
                    }
                }
                char same[64];
                if (diff_req < 0)
                    snprintf(same, sizeof(same), c ? "identical" : "(reference)");
                else
                    snprintf(same, sizeof(same), "DIFFERS: prompt %d, token %d", diff_req, diff_at);
                double med = median(ratio, (int)reps); /* sorts ratio: its ends are the spread */
                printf("| %s | %d | %s | %.1f | %.2fx (%.2f-%.2f) | %.1f%% (%llu / %llu) | %.2f | %.2f | %.2f | %s |\n",
                       w ? "open" : "rewrite", batches[b], names[c], median(tps, (int)reps), med, ratio[0],
                       ratio[reps - 1], prop ? 100.0 * (double)acc / (double)prop : 0.0, (unsigned long long)acc,
                       (unsigned long long)prop, steps ? (double)acc / (double)steps : 0.0,
                       fsteps ? (double)toks / (double)fsteps : 0.0, 1e3 * ps / (double)reps, same);
                fflush(stdout);
            }
        }
    }
    rc = 0;
out:
    if (res)
        for (int c = 0; c < MAX_CFG * MAX_REPS; c++)
            for (int i = 0; i < N_PROMPTS; i++) {
                fy_free(res[c].tr[i].tok);
                fy_free(res[c].tr[i].t);
            }
    fy_free(res);
    for (int w = 0; w < 2; w++)
        for (int i = 0; i < N_PROMPTS; i++) fy_free(g.ids[w][i]);
    fy_engine_stack_destroy(&s);
    fy_model_destroy(m);
    return rc;
}

/*
 * bench_grammar.c - `ferry bench-grammar`: what structured outputs cost
 * per step (grammar/grammar.h).  On the model's vocabulary: the trie's
 * build time; a nested JSON Schema's compile time, cold and through the
 * cache; the token mask's time per step along a completion (a fixed
 * document as the model's tokenizer splits it, each step masked then
 * accepted, a fresh matcher per run as a request would have), and along
 * completions sampled uniformly from the mask (a stress case: odd text,
 * long strings); and for reference a batch-1 decode step of the same
 * model, measured in the same run.
 *
 * Not here: the sampler applying the mask (a pass over the logits), or
 * the engine's integration.
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
#include "grammar/grammar.h"
#include "common/log.h"
#include "common/mem.h"
#include "model/model.h"
#include "engine/runner.h"
#include "engine/sampler.h"
#include "grammar/token_trie.h"
#include "model/tokenizer.h"
#include "bench/stats.h"

static const char g_schema[] =
    "{\"title\":\"Order\",\"type\":\"object\",\"additionalProperties\":false,"
    "\"$defs\":{\"Tier\":{\"enum\":[\"bronze\",\"silver\",\"gold\"],\"title\":\"Tier\",\"type\":\"string\"},"
    "\"Item\":{\"type\":\"object\",\"title\":\"Item\",\"properties\":{"
    "\"sku\":{\"type\":\"string\",\"title\":\"Sku\"},\"qty\":{\"type\":\"integer\",\"minimum\":0},"
    "\"price\":{\"type\":\"number\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"hardware\",\"software\","
    "\"sale\","
    "\"gift\"]},\"maxItems\":4}},\"required\":[\"sku\",\"qty\",\"price\"]}},"
    "\"properties\":{\"order_id\":{\"type\":\"string\"},"
    "\"customer\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"tier\":{\"$ref\":\"#/$defs/"
    "Tier\"},"
    "\"since\":{\"type\":\"string\",\"format\":\"date\"}},\"required\":[\"name\",\"tier\"]},"
    "\"items\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/Item\"},\"minItems\":1},"
    "\"total\":{\"type\":\"number\"},\"status\":{\"enum\":[\"pending\",\"paid\",\"shipped\"]},"
    "\"notes\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}],\"default\":null}},"
    "\"required\":[\"order_id\",\"customer\",\"items\",\"total\",\"status\"]}";

static const char g_doc[] =
    "{\n"
    "  \"order_id\": \"A-1042\",\n"
    "  \"customer\": {\"name\": \"Ada Lovelace\", \"tier\": \"gold\", \"since\": \"2021-03-14\"},\n"
    "  \"items\": [\n"
    "    {\"sku\": \"KB-001\", \"qty\": 2, \"price\": 49.99, \"tags\": [\"hardware\", \"sale\"]},\n"
    "    {\"sku\": \"MS-204\", \"qty\": 1, \"price\": 29.5, \"tags\": [\"hardware\"]},\n"
    "    {\"sku\": \"LIC-PRO\", \"qty\": 3, \"price\": 16.66, \"tags\": [\"software\", \"gift\"]}\n"
    "  ],\n"
    "  \"total\": 178.46,\n"
    "  \"status\": \"paid\",\n"
    "  \"notes\": \"Leave the parcel at the front desk, please.\"\n"
    "}";

static void usage(FILE *f)
{
    fprintf(f, "usage: ferry bench-grammar -m FILE [--runs N] [--samples N] [--threads N]\n"
               "  token-mask time per step for a nested JSON Schema, compile time cold and cached, and a\n"
               "  batch-1 decode step of the model for reference\n"
               "  -m, --model FILE   the model (its vocabulary and, for the reference, its weights)\n"
               "  --runs N           runs over the fixed document, a fresh matcher each (default 5)\n"
               "  --samples N        completions sampled uniformly from the mask (default 5)\n"
               "  --threads N        CPU threads for the decode step (default 2)\n"
               "  -h, --help\n");
}

typedef struct step_times {
    double *t; /* seconds per mask */
    int n, cap;
} step_times_t;

static void add_time(step_times_t *s, double t)
{
    if (s->n < s->cap) s->t[s->n++] = t;
}

static void report(const char *what, step_times_t *s, double decode_s)
{
    double sum = 0, max = 0;
    for (int i = 0; i < s->n; i++) sum += s->t[i], max = s->t[i] > max ? s->t[i] : max;
    double mean = s->n ? sum / s->n : 0;
    double med = median_upper(s->t, s->n);
    printf("%-34s %6d steps  mean %8.1f us  median %7.1f us  max %8.1f us  mean/decode step %5.1f%%\n", what, s->n,
           mean * 1e6, med * 1e6, max * 1e6, 100 * mean / decode_s);
}

static double decode_step_s(const fy_model_t *model, int threads)
{
    const fy_model_config_t *c = fy_model_config(model);
    int n_prompt = 64, n_gen = 64;
    fy_runner_params_t rp;
    fy_runner_params_default(&rp);
    rp.max_batch_tokens = n_prompt;
    rp.max_seqs = 1;
    rp.max_logits = 1;
    rp.max_ctx = n_prompt + n_gen + 1;
    rp.n_kv_blocks = (rp.max_ctx + rp.block_size - 1) / rp.block_size;
    fy_engine_build_t eb;
    fy_engine_build_default(&eb);
    eb.threads = threads;
    eb.runner = rp;
    eb.prefix_caching = false;
    eb.no_engine = true;
    fy_engine_stack_t s = {0};
    if (fy_engine_stack_create(model, &eb, &s)) return -1;
    fy_block_table_t bt = {0};
    int32_t *prompt = fy_malloc((size_t)n_prompt * sizeof(int32_t));
    float *logits = fy_malloc((size_t)c->vocab_size * sizeof(float));
    double *t = fy_calloc((size_t)n_gen, sizeof(double));
    double res = -1;
    if (!prompt || !logits || !t || fy_kvm_seq_init(s.kvm, &bt, rp.max_ctx, NULL)) goto out;
    for (int i = 0; i < n_prompt; i++) prompt[i] = 100 + i * 7;
    for (int rep = 0; rep < 2; rep++) { /* the first warms caches */
        if (fy_kvm_seq_reserve(s.kvm, &bt, rp.max_ctx, NULL)) goto out;
        fy_forward_seq_t f = {&bt, prompt, n_prompt, 0, 1, NULL};
        if (fy_runner_forward(s.runner, &f, 1, logits)) goto out;
        int32_t tok = fy_argmax(logits, c->vocab_size);
        for (int i = 0; i < n_gen; i++) {
            fy_forward_seq_t d = {&bt, &tok, 1, n_prompt + i, 1, NULL};
            double a = fy_now_s();
            if (fy_runner_forward(s.runner, &d, 1, logits)) goto out;
            t[i] = fy_now_s() - a;
            tok = fy_argmax(logits, c->vocab_size);
        }
        fy_kvm_seq_release(s.kvm, &bt);
    }
    res = median_upper(t, n_gen);
out:
    if (bt.blocks) {
        fy_kvm_seq_release(s.kvm, &bt);
        fy_kvm_seq_deinit(&bt);
    }
    fy_free(prompt);
    fy_free(logits);
    fy_free(t);
    fy_engine_stack_destroy(&s);
    return res;
}

int fy_cmd_bench_grammar(int argc, char **argv)
{
    const char *model_path = NULL;
    long runs = 5, samples = 5, threads = 2;
    enum { O_RUNS = 256, O_SAMPLES, O_THREADS };
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},
        {"runs", required_argument, 0, O_RUNS},
        {"samples", required_argument, 0, O_SAMPLES},
        {"threads", required_argument, 0, O_THREADS},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "m:h", opts, NULL)) != -1) {
        switch (opt) {
        case 'm': model_path = optarg; break;
        case O_RUNS:
            if (!fy_cli_parse_int("--runs", optarg, 1, 1000, &runs)) return 2;
            break;
        case O_SAMPLES:
            if (!fy_cli_parse_int("--samples", optarg, 0, 1000, &samples)) return 2;
            break;
        case O_THREADS:
            if (!fy_cli_parse_int("--threads", optarg, 1, 1024, &threads)) return 2;
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!fy_cli_no_operands("bench-grammar", argc, argv, usage)) return 2;
    if (!model_path) {
        fprintf(stderr, "ferry: bench-grammar needs --model\n");
        usage(stderr);
        return 2;
    }
    fy_model_t *model = NULL;
    if (fy_model_load(model_path, &model) != FY_OK) return 1;
    const fy_tokenizer_t *tok = fy_model_tokenizer(model);
    int rc = 1;
    fy_token_trie_t *trie = NULL;
    fy_grammar_t *g = NULL;
    fy_grammar_cache_t *cache = NULL;
    uint32_t *mask = NULL;
    int32_t *ids = NULL;
    step_times_t doc_t = {0}, rnd_t = {0};
    char err[FY_GRAMMAR_ERR_LEN];

    double t0 = fy_now_s();
    if (fy_token_trie_from_tokenizer(tok, &trie)) goto out;
    double trie_s = fy_now_s() - t0;
    printf("vocabulary %d tokens, %d in the trie (%d nodes, longest %d bytes), %d eog; trie built in %.1f ms\n",
           trie->n_vocab, trie->n_toks, trie->n_nodes, trie->max_len, trie->n_eog, trie_s * 1e3);

    /* compile: cold (each a fresh compile), cached (a hit) */
    double cold[50], hit[50], create[50];
    for (int i = 0; i < 50; i++) {
        double a = fy_now_s();
        if (fy_grammar_compile(FY_GRAMMAR_JSON_SCHEMA, g_schema, strlen(g_schema), &g, err, sizeof(err))) {
            fprintf(stderr, "ferry: bench-grammar: %s\n", err);
            goto out;
        }
        cold[i] = fy_now_s() - a;
        fy_gmatch_t *m;
        a = fy_now_s();
        if (fy_gmatch_create(g, &m)) goto out;
        create[i] = fy_now_s() - a;
        fy_gmatch_destroy(m);
        fy_grammar_unref(g);
        g = NULL;
    }
    if (fy_grammar_cache_create(64, &cache)) goto out;
    for (int i = 0; i < 51; i++) {
        double a = fy_now_s();
        if (fy_grammar_cache_get(cache, FY_GRAMMAR_JSON_SCHEMA, g_schema, strlen(g_schema), &g, NULL, err, sizeof(err)))
            goto out;
        if (i) hit[i - 1] = fy_now_s() - a;
        fy_grammar_unref(g);
    }
    if (fy_grammar_cache_get(cache, FY_GRAMMAR_JSON_SCHEMA, g_schema, strlen(g_schema), &g, NULL, err, sizeof(err)))
        goto out;
    printf("schema %zu bytes -> %d rules, %d elements; compile cold %.3f ms, cached %.4f ms, matcher %.4f ms "
           "(medians of 50)\n",
           strlen(g_schema), fy_grammar_n_rules(g), fy_grammar_n_elems(g), median_upper(cold, 50) * 1e3,
           median_upper(hit, 50) * 1e3, median_upper(create, 50) * 1e3);

    size_t words = fy_token_trie_mask_words(trie), n_ids = 0;
    mask = fy_malloc(words * sizeof(uint32_t));
    ids = fy_malloc(4096 * sizeof(int32_t));
    doc_t.cap = rnd_t.cap = 1 << 16;
    doc_t.t = fy_malloc((size_t)doc_t.cap * sizeof(double));
    rnd_t.t = fy_malloc((size_t)rnd_t.cap * sizeof(double));
    if (!mask || !ids || !doc_t.t || !rnd_t.t) goto out;
    if (fy_tokenizer_encode(tok, g_doc, strlen(g_doc), false, false, ids, 4095, &n_ids)) goto out;
    ids[n_ids++] = trie->eog[0];

    /* the document, token by token, a fresh matcher per run */
    fy_gmatch_stats_t st_doc = {0};
    for (long r = 0; r < runs; r++) {
        fy_gmatch_t *m;
        if (fy_gmatch_create(g, &m)) goto out;
        for (size_t i = 0; i < n_ids; i++) {
            double a = fy_now_s();
            if (fy_gmatch_mask(m, trie, mask)) goto out;
            add_time(&doc_t, fy_now_s() - a);
            if (!((mask[ids[i] >> 5] >> (ids[i] & 31)) & 1) || fy_gmatch_accept_token(m, trie, ids[i])) {
                fprintf(stderr, "ferry: bench-grammar: the document's token %zu (%d) is not allowed\n", i, ids[i]);
                fy_gmatch_destroy(m);
                goto out;
            }
        }
        fy_gmatch_stats(m, &st_doc);
        fy_gmatch_destroy(m);
    }
    /* uniform samples from the mask */
    uint64_t rng = 42;
    int64_t hits = 0, misses = 0;
    for (long r = 0; r < samples; r++) {
        fy_gmatch_t *m;
        if (fy_gmatch_create(g, &m)) goto out;
        for (int step = 0; step < 400 && !fy_gmatch_is_ended(m); step++) {
            double a = fy_now_s();
            if (fy_gmatch_mask(m, trie, mask)) goto out;
            add_time(&rnd_t, fy_now_s() - a);
            int32_t n = 0;
            for (size_t w = 0; w < words; w++) n += __builtin_popcount(mask[w]);
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            int32_t k = (int32_t)((rng >> 33) % (uint64_t)n), id = 0;
            for (; id < trie->n_vocab; id++)
                if (((mask[id >> 5] >> (id & 31)) & 1) && k-- == 0) break;
            if (fy_gmatch_accept_token(m, trie, id)) goto out;
        }
        fy_gmatch_stats_t s;
        fy_gmatch_stats(m, &s);
        hits += s.mask_hits, misses += s.mask_miss;
        fy_gmatch_destroy(m);
    }

    double dec = decode_step_s(model, (int)threads);
    if (dec <= 0) goto out;
    printf("decode step (batch 1, %ld threads, context 64-128): %.3f ms (median of 64)\n", threads, dec * 1e3);
    printf("document: %zu tokens; per run %lld masks from the memo, %lld by a trie walk (%.0f nodes per walk)\n", n_ids,
           (long long)st_doc.mask_hits, (long long)st_doc.mask_miss,
           st_doc.mask_miss ? (double)st_doc.walked / (double)st_doc.mask_miss : 0.0);
    report("mask, document (fresh matcher)", &doc_t, dec);
    if (samples) {
        printf("uniform samples: %lld masks from the memo, %lld by a trie walk\n", (long long)hits, (long long)misses);
        report("mask, uniform samples", &rnd_t, dec);
    }
    rc = 0;
out:
    fy_free(doc_t.t);
    fy_free(rnd_t.t);
    fy_free(mask);
    fy_free(ids);
    fy_grammar_unref(g);
    fy_grammar_cache_destroy(cache);
    fy_token_trie_destroy(trie);
    fy_model_destroy(model);
    return rc;
}

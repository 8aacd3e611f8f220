/*
 * test_generate.c - end to end on the default model (SmolLM2-135M-Instruct
 * Q4_1): greedy generation is deterministic across runs and thread
 * counts, reads as English, seeded sampling reproduces, stop strings and
 * the chat template work, and every KV block returns to the pool.
 * Skipped with a message when the model file is absent.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "model/chat.h"
#include "engine/generate.h"
#include "common/mem.h"
#include "model/model.h"
#include "engine/runner.h"
#include "tests/testutil.h"

typedef struct run {
    int32_t tokens[256];
    int32_t n;
    char text[4096];
    size_t len;
    fy_gen_stats_t stats;
} run_t;

static bool collect(void *arg, const char *text, size_t len)
{
    run_t *r = arg;
    if (r->len + len < sizeof(r->text)) {
        memcpy(r->text + r->len, text, len);
        r->len += len;
        r->text[r->len] = '\0';
    }
    return true;
}

static fy_model_t *g_model;
static fy_kv_hasher_t *g_hasher;

static int setup(void **state)
{
    const char *path = fy_test_default_model();
    if (path && fy_model_load(path, &g_model) != FY_OK) return -1;
    return fy_kv_hasher_create_random(&g_hasher) == FY_OK ? 0 : -1;
}

static int teardown(void **state)
{
    fy_model_destroy(g_model);
    fy_kv_hasher_destroy(g_hasher);
    return 0;
}

static void tokenize(const char *text, bool special, int32_t *ids, size_t cap, size_t *n)
{
    assert_int_equal(fy_tokenizer_encode(fy_model_tokenizer(g_model), text, strlen(text), true, special, ids, cap, n),
                     FY_OK);
}

/* A single-sequence runner on the default model with its block manager. */
typedef struct engine {
    fy_backend_t *be;
    fy_runner_t *r;
    fy_kvm_t *kvm;
} engine_t;

static void engine_open(engine_t *e, int threads, int32_t batch, int32_t max_ctx, int32_t blocks)
{
    fy_backend_params_t bp = {.n_threads = threads};
    assert_int_equal(fy_backend_create("cpu", &bp, &e->be), FY_OK);
    fy_runner_params_t rp;
    fy_runner_params_default(&rp);
    rp.max_batch_tokens = batch;
    rp.max_seqs = 1;
    rp.max_logits = 1;
    rp.max_ctx = max_ctx;
    rp.n_kv_blocks = blocks;
    assert_int_equal(fy_runner_create(g_model, e->be, &rp, &e->r), FY_OK);
    fy_kvm_params_t kp;
    fy_runner_kvm_params(e->r, &kp);
    kp.hasher = g_hasher;
    assert_int_equal(fy_kvm_create(&kp, &e->kvm), FY_OK);
}

static void engine_close(engine_t *e)
{
    fy_kvm_stats_t ks;
    fy_kvm_stats(e->kvm, &ks);
    assert_int_equal(ks.tier[FY_KV_DEVICE].used, 0); /* every block back (free or cached) */
    assert_int_equal(fy_kvm_check(e->kvm), FY_OK);
    fy_kvm_destroy(e->kvm);
    fy_runner_destroy(e->r);
    fy_backend_destroy(e->be);
}

static void generate(const char *prompt, bool chat, int threads, const fy_gen_params_t *gp, run_t *out)
{
    char *rendered = NULL;
    if (chat) {
        fy_chat_msg_t msg = {"user", prompt};
        assert_int_equal(fy_chat_template_apply(fy_model_chat_template(g_model), &msg, 1, true, &rendered), FY_OK);
        prompt = rendered;
    }
    int32_t ids[1024];
    size_t n;
    tokenize(prompt, chat, ids, 1024, &n);
    fy_free(rendered);
    engine_t e;
    engine_open(&e, threads, 64 /* prompts prefill in several chunks */, 1024, 64);
    memset(out, 0, sizeof(*out));
    assert_int_equal(fy_generate(e.r, e.kvm, fy_model_tokenizer(g_model), ids, (int32_t)n, gp, collect, out,
                                 out->tokens, 256, &out->stats),
                     FY_OK);
    out->n = out->stats.n_generated < 256 ? out->stats.n_generated : 256;
    engine_close(&e);
}

static void test_tokenizer_ids(void **state)
{
    if (!g_model) skip();
    /* reference ids from llama.cpp's llama-tokenize on the same file */
    int32_t ids[64];
    size_t n;
    tokenize("Hello world! 12345", false, ids, 64, &n);
    int32_t want[] = {19556, 905, 17, 216, 33, 34, 35, 36, 37};
    assert_int_equal(n, FY_ARRAY_LEN(want));
    assert_memory_equal(ids, want, sizeof(want));
}

static void test_greedy_deterministic_across_threads(void **state)
{
    if (!g_model) skip();
    fy_gen_params_t gp;
    fy_gen_params_default(&gp);
    gp.gen.max_tokens = 48;
    gp.gen.ignore_eos = true;
    run_t *a = malloc(sizeof(run_t)), *b = malloc(sizeof(run_t));
    const char *prompt = "The capital of France is";
    generate(prompt, false, 1, &gp, a);
    assert_int_equal(a->n, 48);
    for (int threads = 1; threads <= 3; threads++) {
        generate(prompt, false, threads, &gp, b);
        assert_int_equal(b->n, a->n);
        assert_memory_equal(b->tokens, a->tokens, sizeof(int32_t) * (size_t)a->n);
        assert_string_equal(b->text, a->text);
    }
    /* the model knows this one */
    assert_non_null(strstr(a->text, "Paris"));
    free(a);
    free(b);
}

/* Letters, spaces and punctuation of English prose, and real words. */
static void assert_english(const char *text)
{
    size_t n = strlen(text), ok = 0, words = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)text[i];
        if (isalpha(c) || c == ' ' || c == '\n' || c == ',' || c == '.' || c == '\'' || c == '-') ok++;
    }
    assert_true(n > 40);
    assert_true((double)ok / (double)n > 0.9);
    const char *common[] = {" the ", " and ", " of ", " is ", " a ", " to ", " in "};
    for (size_t i = 0; i < FY_ARRAY_LEN(common); i++)
        if (strstr(text, common[i])) words++;
    assert_true(words >= 3);
}

static void test_chat_reads_as_english(void **state)
{
    if (!g_model) skip();
    fy_gen_params_t gp;
    fy_gen_params_default(&gp);
    gp.gen.max_tokens = 96;
    run_t *r = malloc(sizeof(run_t));
    generate("Explain in a few sentences why the sky is blue.", true, 2, &gp, r);
    fprintf(stderr, "chat answer: %s\n", r->text);
    assert_english(r->text);
    assert_true(strstr(r->text, "light") || strstr(r->text, "Light"));
    assert_true(r->stats.finish == FY_FINISH_EOS || r->stats.finish == FY_FINISH_LENGTH);
    free(r);
}

static void test_seeded_sampling(void **state)
{
    if (!g_model) skip();
    fy_gen_params_t gp;
    fy_gen_params_default(&gp);
    gp.gen.max_tokens = 32;
    gp.gen.ignore_eos = true;
    gp.gen.sampling =
        (fy_sampling_params_t){.temperature = 0.9f, .top_k = 50, .top_p = 0.95f, .min_p = 0.0f, .seed = 7};
    run_t *a = malloc(sizeof(run_t)), *b = malloc(sizeof(run_t)), *c = malloc(sizeof(run_t));
    generate("Once upon a time", false, 2, &gp, a);
    generate("Once upon a time", false, 1, &gp, b);
    assert_memory_equal(a->tokens, b->tokens, sizeof(int32_t) * 32);
    gp.gen.sampling.seed = 8;
    generate("Once upon a time", false, 2, &gp, c);
    assert_memory_not_equal(a->tokens, c->tokens, sizeof(int32_t) * 32);
    free(a), free(b), free(c);
}

static void test_stop_string(void **state)
{
    if (!g_model) skip();
    fy_gen_params_t gp;
    fy_gen_params_default(&gp);
    gp.gen.max_tokens = 48;
    gp.gen.ignore_eos = true;
    run_t *full = malloc(sizeof(run_t)), *cut = malloc(sizeof(run_t));
    generate("The capital of France is", false, 2, &gp, full);
    /* stop at the first line break of the greedy output */
    const char *p = strstr(full->text, "\n");
    assert_non_null(p);
    assert_true(p - full->text > 3);
    strcpy(gp.gen.stop[0], "\n");
    gp.gen.n_stop = 1;
    generate("The capital of France is", false, 2, &gp, cut);
    assert_int_equal(cut->stats.finish, FY_FINISH_STOP);
    assert_int_equal(cut->len, (size_t)(p - full->text));
    assert_memory_equal(cut->text, full->text, cut->len);
    free(full), free(cut);
}

static void test_prompt_too_long(void **state)
{
    if (!g_model) skip();
    engine_t e;
    engine_open(&e, 0, 512, 32, 2);
    int32_t ids[40];
    for (int i = 0; i < 40; i++) ids[i] = 100 + i;
    fy_gen_params_t gp;
    fy_gen_params_default(&gp);
    fy_test_log_begin();
    assert_int_equal(fy_generate(e.r, e.kvm, fy_model_tokenizer(g_model), ids, 40, &gp, NULL, NULL, NULL, 0, NULL),
                     FY_ERR_INVALID);
    assert_true(fy_test_log_has("does not fit the context", NULL));
    /* fits the context but the pool only has one block left */
    fy_block_table_t other;
    assert_int_equal(fy_kvm_seq_init(e.kvm, &other, 32, NULL), FY_OK);
    assert_int_equal(fy_kvm_seq_reserve(e.kvm, &other, 1, NULL), FY_OK);
    assert_int_equal(fy_generate(e.r, e.kvm, fy_model_tokenizer(g_model), ids, 20, &gp, NULL, NULL, NULL, 0, NULL),
                     FY_ERR_NO_SPACE);
    assert_true(fy_test_log_has("kv pool too small", NULL));
    fy_test_log_end();
    assert_int_equal(fy_kvm_n_free(e.kvm, FY_KV_DEVICE), 1);
    fy_kvm_seq_release(e.kvm, &other);
    fy_kvm_seq_deinit(&other);
    engine_close(&e);
}

/* A repeated prompt reuses its cached prefix blocks and gives the same
 * greedy tokens as computing it from scratch; another tenant's namespace
 * finds nothing. */
static void test_prefix_cache_same_tokens(void **state)
{
    if (!g_model) skip();
    engine_t e;
    engine_open(&e, 0, 64, 512, 64);
    const char *text = "You are a careful assistant. Answer briefly and precisely. The question is about geography: "
                       "which river flows through the city of Paris, and into which sea does it flow?";
    int32_t ids[256];
    size_t n;
    tokenize(text, false, ids, 256, &n);
    fy_gen_params_t gp;
    fy_gen_params_default(&gp);
    gp.gen.max_tokens = 24;
    gp.gen.ignore_eos = true;
    fy_kv_ns_t ns;
    fy_kv_ns_make(g_hasher, "other-tenant", "smollm2", fy_runner_kv_layout(e.r), NULL, &ns);
    run_t *runs = calloc(3, sizeof(run_t));
    for (int i = 0; i < 3; i++) {
        gp.ns = i == 2 ? &ns : NULL;
        assert_int_equal(fy_generate(e.r, e.kvm, fy_model_tokenizer(g_model), ids, (int32_t)n, &gp, collect, &runs[i],
                                     runs[i].tokens, 256, &runs[i].stats),
                         FY_OK);
    }
    assert_int_equal(runs[0].stats.n_cached, 0);
    assert_int_equal(runs[1].stats.n_cached, (int32_t)((n - 1) / 16 * 16));
    assert_int_equal(runs[2].stats.n_cached, 0);
    assert_memory_equal(runs[0].tokens, runs[1].tokens, sizeof(int32_t) * 24);
    assert_memory_equal(runs[0].tokens, runs[2].tokens, sizeof(int32_t) * 24);
    free(runs);
    engine_close(&e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tokenizer_ids),
        cmocka_unit_test(test_greedy_deterministic_across_threads),
        cmocka_unit_test(test_chat_reads_as_english),
        cmocka_unit_test(test_seeded_sampling),
        cmocka_unit_test(test_stop_string),
        cmocka_unit_test(test_prompt_too_long),
        cmocka_unit_test(test_prefix_cache_same_tokens),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

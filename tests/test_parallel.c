/*
 * test_parallel.c - tensor- and pipeline-parallel ranks (engine/group.h,
 * the sharded runner): logits of tp, pp and both against one runner and
 * against the double-precision reference on tiny models; greedy tokens of
 * SmolLM2 through the engine stack; shapes, unequal pools and a failing
 * rank refused or stopped cleanly, with no process left behind.
 *
 * Each stack forks its ranks from this process (fy_engine_stack_create);
 * a child never returns into cmocka (it _exits), so an assertion here runs
 * in rank 0 only.
 */
#include <errno.h>
#include <signal.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine/engine_config.h"
#include "engine/generate.h"
#include "tests/gguf_writer.h"
#include "kv/kv.h"
#include "common/mem.h"
#include "model/prompt.h"
#include "model/model.h"
#include "engine/runner.h"
#include "tests/testutil.h"
#include "tests/tinymodel.h"

#define N_PROMPT 13 /* prefilled in one chunk of 13: straddles a block of 8 */
#define N_DECODE 6  /* then one token a step */
#define N_TOK (N_PROMPT + N_DECODE)
#define CTX 64

/* No child of this process is left, running or a zombie. */
static void assert_no_children(void)
{
    errno = 0;
    pid_t p = waitpid(-1, NULL, WNOHANG);
    if (p != -1 || errno != ECHILD)
        fprintf(stderr, "a rank's process is left: waitpid -> %d (%s)\n", p, strerror(errno));
    assert_int_equal(p, -1);
    assert_int_equal(errno, ECHILD);
}

static void build_for(fy_engine_build_t *b, int tp, int pp, int32_t blocks)
{
    fy_engine_build_default(b);
    b->threads = 1;
    b->no_engine = true;
    b->prefix_caching = false;
    fy_runner_params_t *rp = &b->runner;
    rp->max_batch_tokens = 32;
    rp->max_seqs = 2;
    rp->max_logits = 32;
    rp->max_ctx = CTX;
    rp->block_size = 8;
    rp->kv_dtype = FY_DTYPE_F32;
    rp->n_kv_blocks = blocks;
    rp->tp = tp;
    rp->pp = pp;
}

/* Logits of every token of tok[N_TOK] (teacher-forced): the prompt in one
 * chunk, then one token a step; out [N_TOK, vocab]. */
static void run_logits(fy_engine_stack_t *s, const int32_t *tok, float *out)
{
    int vocab = fy_model_config(fy_runner_model(s->runner))->vocab_size;
    fy_block_table_t bt;
    assert_int_equal(fy_kvm_seq_init(s->kvm, &bt, CTX, NULL), FY_OK);
    for (int done = 0; done < N_TOK;) {
        int k = done == 0 ? N_PROMPT : 1;
        assert_int_equal(fy_kvm_seq_reserve(s->kvm, &bt, done + k, NULL), FY_OK);
        fy_forward_seq_t f = {&bt, tok + done, k, done, k, NULL};
        assert_int_equal(fy_runner_forward(s->runner, &f, 1, out + (long)done * vocab), FY_OK);
        done += k;
        fy_kvm_seq_commit(s->kvm, &bt, tok, done, NULL);
    }
    fy_kvm_seq_release(s->kvm, &bt);
    fy_kvm_seq_deinit(&bt);
}

static int argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Logits of model path with tp x pp ranks against one rank's (max |diff|
 * below bound, the same argmax in every row) and, where ref is given,
 * against the double-precision reference (relative error below ref_tol). */
static double compare_ranks(const char *path, int tp, int pp, const double *ref, double ref_tol, double bound)
{
    fy_model_t *m;
    assert_int_equal(fy_model_load(path, &m), FY_OK);
    int vocab = fy_model_config(m)->vocab_size;
    int32_t tok[N_TOK];
    uint64_t seed = 7;
    for (int i = 0; i < N_TOK; i++) tok[i] = (int32_t)(fy_test_rand_u64(&seed) % (uint64_t)vocab);
    float *one = malloc(sizeof(float) * N_TOK * (size_t)vocab), *many = malloc(sizeof(float) * N_TOK * (size_t)vocab);
    fy_engine_build_t b;
    fy_engine_stack_t s;
    build_for(&b, 1, 1, 16);
    assert_int_equal(fy_engine_stack_create(m, &b, &s), FY_OK);
    run_logits(&s, tok, one);
    fy_engine_stack_destroy(&s);
    build_for(&b, tp, pp, 16);
    assert_int_equal(fy_engine_stack_create(m, &b, &s), FY_OK);
    assert_non_null(s.group);
    run_logits(&s, tok, many);
    fy_engine_stack_destroy(&s);
    assert_no_children();
    double most = 0;
    for (long i = 0; i < (long)N_TOK * vocab; i++) {
        double d = fabs((double)one[i] - (double)many[i]);
        if (d > most) most = d;
    }
    for (int t = 0; t < N_TOK; t++)
        assert_int_equal(argmax(one + (long)t * vocab, vocab), argmax(many + (long)t * vocab, vocab));
    fprintf(stderr, "  %s tp %d pp %d: max |logit diff| vs one rank %.3g", path, tp, pp, most);
    if (ref) {
        double e1 = fy_rel_err(one, ref, (long)N_TOK * vocab), en = fy_rel_err(many, ref, (long)N_TOK * vocab);
        fprintf(stderr, ", relative error vs reference %.3g (one rank %.3g)", en, e1);
        assert_true(en < ref_tol);
    }
    fprintf(stderr, "\n");
    assert_true(most <= bound);
    free(one);
    free(many);
    fy_model_destroy(m);
    return most;
}

static double *reference_of(const fy_tiny_model_t *tm, const char *path)
{
    fy_model_t *m;
    assert_int_equal(fy_model_load(path, &m), FY_OK);
    int vocab = fy_model_config(m)->vocab_size;
    fy_model_destroy(m);
    int32_t tok[N_TOK];
    uint64_t seed = 7;
    for (int i = 0; i < N_TOK; i++) tok[i] = (int32_t)(fy_test_rand_u64(&seed) % (uint64_t)vocab);
    double *ref = malloc(sizeof(double) * N_TOK * (size_t)vocab);
    fy_tiny_reference(tm, tok, N_TOK, ref);
    return ref;
}

/* llama, f32 weights: 4 heads over 2 KV heads; tp 2 splits both, tp 4
 * replicates each KV head on two ranks; pp 2; tp 2 with pp 2. */
static void test_llama_f32(void **state)
{
    (void)state;
    fy_tiny_cfg_t c;
    fy_tiny_cfg_default(&c);
    c.n_layers = 4;
    c.seed = 101;
    fy_tiny_model_t tm;
    fy_tiny_init(&tm, &c);
    const char *path = fy_test_path("par-llama.gguf");
    assert_true(fy_tiny_write_gguf(&tm, path, GW_F32));
    double *ref = reference_of(&tm, path);
    int shapes[][2] = {{2, 1}, {4, 1}, {1, 2}, {2, 2}, {1, 4}};
    for (size_t i = 0; i < FY_ARRAY_LEN(shapes); i++) {
        double d = compare_ranks(path, shapes[i][0], shapes[i][1], ref, 1e-5, 1e-4);
        if (shapes[i][0] == 1) assert_true(d == 0); /* pp alone sums nothing differently: the same bits */
    }
    free(ref);
    fy_tiny_free(&tm);
}

/* Quantized weights (Q8_0: 32-element blocks, so the MLP is 128 wide for
 * column slices of 64), qwen2's biases split with their rows, gemma3's
 * post norms, Q/K norms and sliding windows (pp 2 groups the stages'
 * windows differently, so both take one KV group). */
static void test_archs(void **state)
{
    (void)state;
    fy_tiny_cfg_t c;
    fy_tiny_cfg_default(&c);
    c.ffn = 128;
    c.seed = 102;
    fy_tiny_model_t tm;
    fy_tiny_init(&tm, &c);
    fy_tiny_roundtrip(&tm, GW_Q8_0);
    const char *path = fy_test_path("par-q8.gguf");
    assert_true(fy_tiny_write_gguf(&tm, path, GW_Q8_0));
    double *ref = reference_of(&tm, path);
    compare_ranks(path, 2, 1, ref, 3e-2, 1e-3);
    compare_ranks(path, 2, 2, ref, 3e-2, 1e-3);
    free(ref);
    fy_tiny_free(&tm);

    fy_tiny_cfg_arch(&c, FY_ARCH_QWEN2);
    c.seed = 103;
    fy_tiny_init(&tm, &c);
    path = fy_test_path("par-qwen2.gguf");
    assert_true(fy_tiny_write_gguf(&tm, path, GW_F32));
    ref = reference_of(&tm, path);
    compare_ranks(path, 2, 1, ref, 1e-5, 1e-4);
    compare_ranks(path, 4, 1, ref, 1e-5, 1e-4);
    free(ref);
    fy_tiny_free(&tm);

    fy_tiny_cfg_arch(&c, FY_ARCH_GEMMA3);
    c.seed = 104;
    fy_tiny_init(&tm, &c);
    path = fy_test_path("par-gemma3.gguf");
    assert_true(fy_tiny_write_gguf(&tm, path, GW_F32));
    ref = reference_of(&tm, path);
    compare_ranks(path, 2, 1, ref, 1e-5, 1e-4);
    compare_ranks(path, 2, 2, ref, 1e-5, 1e-4);
    compare_ranks(path, 1, 3, ref, 1e-5, 0);
    free(ref);
    fy_tiny_free(&tm);
}

/* Shapes that do not split are refused before any process is forked,
 * naming the counts or the tensor. */
static void test_refusals(void **state)
{
    (void)state;
    fy_tiny_cfg_t c;
    fy_tiny_cfg_default(&c);
    c.dim = 96;
    c.n_heads = 6;
    c.n_kv_heads = 2;
    c.seed = 105;
    fy_tiny_model_t tm;
    fy_tiny_init(&tm, &c);
    const char *path = fy_test_path("par-6h.gguf");
    assert_true(fy_tiny_write_gguf(&tm, path, GW_Q8_0));
    fy_tiny_free(&tm);
    fy_model_t *m;
    assert_int_equal(fy_model_load(path, &m), FY_OK);
    fy_engine_build_t b;
    fy_engine_stack_t s = {0};
    struct {
        int tp, pp;
        bool partial;
        const char *says;
    } bad[] = {
        {4, 1, false, "does not divide the model's 6 attention heads"},
        {3, 1, false, "neither divides the model's 2 KV heads"},
        {2, 1, true, "attn_output (q8_0, 32-element blocks) would split into slices of 48 columns"},
        {1, 3, false, "pp 3 stages for a model of 2 layers"},
    };
    for (size_t i = 0; i < FY_ARRAY_LEN(bad); i++) {
        build_for(&b, bad[i].tp, bad[i].pp, 16);
        b.runner.tp_partial_sums = bad[i].partial;
        fy_test_log_begin();
        fy_status_t st = fy_engine_stack_create(m, &b, &s);
        fy_test_log_end();
        if (st == FY_OK) fy_engine_stack_destroy(&s);
        assert_int_equal(st, FY_ERR_INVALID);
        if (!fy_test_log_has(bad[i].says, NULL)) fprintf(stderr, "log: %s\n", fy_test_log_text());
        assert_true(fy_test_log_has(bad[i].says, NULL));
        assert_null(s.runner);
    }
    /* what ranks do not run: H2O, a pool sized from free memory */
    build_for(&b, 2, 1, 16);
    b.engine.evict.policy = FY_EVICT_H2O;
    fy_test_log_begin();
    assert_int_equal(fy_engine_stack_create(m, &b, &s), FY_ERR_UNSUPPORTED);
    fy_test_log_end();
    assert_true(fy_test_log_has("H2O", NULL));
    build_for(&b, 2, 1, 0);
    fy_test_log_begin();
    assert_int_equal(fy_engine_stack_create(m, &b, &s), FY_ERR_INVALID);
    fy_test_log_end();
    assert_true(fy_test_log_has("need a kv block count or kv_mem", NULL));
    /* refused by every rank after the fork (bad batch sizes): all of them leave */
    build_for(&b, 2, 2, 16);
    b.runner.max_seqs = 64;
    fy_test_log_begin();
    assert_int_equal(fy_engine_stack_create(m, &b, &s), FY_ERR_INVALID);
    fy_test_log_end();
    assert_true(fy_test_log_has("runner: bad parameters", NULL));
    assert_no_children();
    fy_model_destroy(m);
    assert_no_children();
}

/* One rank's pool sized differently (the test-only pool_skew): refused at
 * start, naming the ranks and counts; no process is left. */
static void test_unequal_pools(void **state)
{
    (void)state;
    fy_tiny_cfg_t c;
    fy_tiny_cfg_default(&c);
    c.seed = 106;
    fy_tiny_model_t tm;
    fy_tiny_init(&tm, &c);
    const char *path = fy_test_path("par-pools.gguf");
    assert_true(fy_tiny_write_gguf(&tm, path, GW_F32));
    fy_tiny_free(&tm);
    fy_model_t *m;
    assert_int_equal(fy_model_load(path, &m), FY_OK);
    fy_engine_build_t b;
    fy_engine_stack_t s = {0};
    build_for(&b, 2, 1, 16);
    b.runner.pool_skew = 3;
    fy_test_log_begin();
    fy_status_t st = fy_engine_stack_create(m, &b, &s);
    fy_test_log_end();
    assert_int_equal(st, FY_ERR_MISMATCH);
    assert_true(fy_test_log_has("unequal kv pools", "rank 0 has 16", "rank 1 19", NULL));
    assert_no_children();
    /* the same through pp, and a budget in bytes gives every stage the same count */
    build_for(&b, 1, 2, 0);
    b.runner.kv_mem = 1 << 20;
    assert_int_equal(fy_engine_stack_create(m, &b, &s), FY_OK);
    int32_t blocks = fy_runner_params(s.runner)->n_kv_blocks;
    assert_true(blocks > 16);
    fy_engine_stack_destroy(&s);
    assert_no_children();
    fy_model_destroy(m);
}

typedef struct outcome {
    int n_error, n_finish;
} outcome_t;

static void on_event(void *arg, const fy_event_t *ev)
{
    outcome_t *o = arg;
    if (ev->kind == FY_EVENT_ERROR) o->n_error++;
    if (ev->kind == FY_EVENT_FINISH) o->n_finish++;
}

/* A follower that fails mid-run (the test-only fail_after_forwards): rank
 * 0's forward pass fails naming it, every request ends with an error, every
 * block returns to the pool, later passes fail at once, and destroying the
 * stack leaves no process behind. */
static void test_follower_fails(void **state)
{
    (void)state;
    fy_tiny_cfg_t c;
    fy_tiny_cfg_default(&c);
    c.seed = 107;
    fy_tiny_model_t tm;
    fy_tiny_init(&tm, &c);
    const char *path = fy_test_path("par-fail.gguf");
    assert_true(fy_tiny_write_gguf(&tm, path, GW_F32));
    fy_tiny_free(&tm);
    fy_model_t *m;
    assert_int_equal(fy_model_load(path, &m), FY_OK);
    fy_engine_build_t b;
    fy_engine_stack_t s = {0};
    build_for(&b, 2, 2, 32);
    b.no_engine = false;
    b.engine.max_num_seqs = 2;
    b.engine.max_num_batched_tokens = 32;
    b.runner.fail_after_forwards = 3;
    assert_int_equal(fy_engine_stack_create(m, &b, &s), FY_OK);
    outcome_t o = {0};
    int32_t prompt[3][10];
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < 10; i++) prompt[r][i] = 3 + 17 * r + i;
    fy_genspec_t rq;
    fy_genspec_default(&rq);
    rq.max_tokens = 20;
    rq.ignore_eos = true;
    rq.sampling.temperature = 0;
    uint64_t id;
    for (int r = 0; r < 3; r++)
        assert_int_equal(fy_engine_submit(s.engine, prompt[r], 10, &rq, NULL, on_event, &o, &id), FY_OK);
    fy_test_log_begin();
    for (int steps = 0; !fy_engine_idle(s.engine) && steps < 200; steps++) fy_engine_step(s.engine);
    fy_test_log_end();
    assert_true(fy_engine_idle(s.engine));
    assert_int_equal(o.n_error, 3);
    assert_int_equal(o.n_finish, 0);
    if (!fy_test_log_has("rank 3 failed a forward pass", NULL)) fprintf(stderr, "log: %s\n", fy_test_log_text());
    assert_true(fy_test_log_has("rank 3 failed a forward pass", NULL)); /* rank 0's line; rank 3's is its own */
    fy_kvm_stats_t ks;
    fy_kvm_stats(s.kvm, &ks);
    assert_int_equal(ks.tier[FY_KV_DEVICE].free, ks.tier[FY_KV_DEVICE].total);
    assert_int_equal(fy_kvm_check(s.kvm), FY_OK);
    /* the group is out of service: a new request ends at once */
    o = (outcome_t){0};
    assert_int_equal(fy_engine_submit(s.engine, prompt[0], 10, &rq, NULL, on_event, &o, &id), FY_OK);
    fy_test_log_begin();
    for (int steps = 0; !fy_engine_idle(s.engine) && steps < 10; steps++) fy_engine_step(s.engine);
    fy_test_log_end();
    assert_int_equal(o.n_error, 1);
    fy_engine_stack_destroy(&s);
    assert_no_children();
    fy_model_destroy(m);
}

typedef struct tokens {
    int32_t tok[32];
    int n;
    bool ended;
} tokens_t;

static void on_token(void *arg, const fy_event_t *ev)
{
    tokens_t *t = arg;
    if (ev->kind == FY_EVENT_TOKEN && t->n < 32) t->tok[t->n++] = ev->token;
    if (ev->kind == FY_EVENT_FINISH || ev->kind == FY_EVENT_ERROR) t->ended = ev->kind == FY_EVENT_FINISH;
}

/* 8 greedy requests on a pool too small for them (admission on a
 * predicted output length), swap preemption: blocks go to the host tier
 * and back, and every block copy must reach every rank.  out[8]. */
static void swap_run(fy_model_t *m, int tp, int pp, tokens_t *out, uint64_t *swaps_p)
{
    fy_engine_build_t b;
    build_for(&b, tp, pp, 20);
    b.no_engine = false;
    b.prefix_caching = true;
    b.host_kv_mem = 1 << 20;
    b.runner.max_seqs = 8;
    b.runner.max_logits = 8;
    b.runner.max_batch_tokens = 64;
    b.engine.max_num_seqs = 8;
    b.engine.max_num_batched_tokens = 64;
    b.engine.preempt = FY_PREEMPT_SWAP;
    b.engine.predict_output = true;
    b.engine.predict_quantile = 0.1;
    fy_engine_stack_t s;
    assert_int_equal(fy_engine_stack_create(m, &b, &s), FY_OK);
    fy_genspec_t rq;
    fy_genspec_default(&rq);
    rq.sampling.temperature = 0;
    rq.ignore_eos = true;
    uint64_t id;
    int32_t p[8][16];
    for (int r = 0; r < 8; r++)
        for (int i = 0; i < 16; i++) p[r][i] = 3 + (r * 31 + i * 7) % 250;
    tokens_t warm[8] = {0};
    rq.max_tokens = 1; /* teach the predictor that outputs are short */
    for (int r = 0; r < 8; r++)
        assert_int_equal(fy_engine_submit(s.engine, p[r], 16, &rq, NULL, on_token, &warm[r], &id), FY_OK);
    for (int steps = 0; !fy_engine_idle(s.engine) && steps < 1000; steps++)
        assert_int_equal(fy_engine_step(s.engine), FY_OK);
    rq.max_tokens = 24;
    memset(out, 0, 8 * sizeof(*out));
    for (int r = 0; r < 8; r++)
        assert_int_equal(fy_engine_submit(s.engine, p[r], 16, &rq, NULL, on_token, &out[r], &id), FY_OK);
    for (int steps = 0; !fy_engine_idle(s.engine) && steps < 5000; steps++)
        assert_int_equal(fy_engine_step(s.engine), FY_OK);
    fy_engine_stats_t st;
    fy_engine_stats(s.engine, &st);
    *swaps_p = st.preemptions_swap;
    for (int r = 0; r < 8; r++) assert_true(out[r].ended && out[r].n == 24);
    fy_kvm_stats_t ks;
    fy_kvm_stats(s.kvm, &ks);
    assert_int_equal(ks.tier[FY_KV_DEVICE].free + ks.tier[FY_KV_DEVICE].cached, ks.tier[FY_KV_DEVICE].total);
    fy_engine_stack_destroy(&s);
    assert_no_children();
}

/* Swapping (the block manager's copies through the runner) keeps every
 * rank's shard in step: the same tokens as one rank. */
static void test_swap_copies(void **state)
{
    (void)state;
    fy_tiny_cfg_t c;
    fy_tiny_cfg_default(&c);
    c.seed = 109;
    fy_tiny_model_t tm;
    fy_tiny_init(&tm, &c);
    const char *path = fy_test_path("par-swap.gguf");
    assert_true(fy_tiny_write_gguf(&tm, path, GW_F32));
    fy_tiny_free(&tm);
    fy_model_t *m;
    assert_int_equal(fy_model_load(path, &m), FY_OK);
    tokens_t one[8], many[8];
    uint64_t swaps1, swaps;
    swap_run(m, 1, 1, one, &swaps1);
    swap_run(m, 2, 2, many, &swaps);
    fprintf(stderr, "  swap preemptions: %llu with one rank, %llu with tp 2 x pp 2\n", (unsigned long long)swaps1,
            (unsigned long long)swaps);
    assert_true(swaps > 0);
    for (int r = 0; r < 8; r++) assert_memory_equal(one[r].tok, many[r].tok, sizeof(one[r].tok));
    fy_model_destroy(m);
}

/* A rank killed outright: rank 0's next pass fails (the group saw it
 * die), and the stack still comes down with nothing left behind. */
static void test_rank_killed(void **state)
{
    (void)state;
    fy_tiny_cfg_t c;
    fy_tiny_cfg_default(&c);
    c.seed = 110;
    fy_tiny_model_t tm;
    fy_tiny_init(&tm, &c);
    const char *path = fy_test_path("par-kill.gguf");
    assert_true(fy_tiny_write_gguf(&tm, path, GW_F32));
    fy_tiny_free(&tm);
    fy_model_t *m;
    assert_int_equal(fy_model_load(path, &m), FY_OK);
    int vocab = fy_model_config(m)->vocab_size;
    fy_engine_build_t b;
    fy_engine_stack_t s;
    build_for(&b, 2, 1, 16);
    assert_int_equal(fy_engine_stack_create(m, &b, &s), FY_OK);
    pid_t victim = fy_group_pid(s.group, 1);
    assert_true(victim > 0);
    assert_int_equal(kill(victim, SIGKILL), 0);
    fy_block_table_t bt;
    assert_int_equal(fy_kvm_seq_init(s.kvm, &bt, CTX, NULL), FY_OK);
    assert_int_equal(fy_kvm_seq_reserve(s.kvm, &bt, 4, NULL), FY_OK);
    int32_t tok[4] = {5, 6, 7, 8};
    float *out = malloc(sizeof(float) * 4 * (size_t)vocab);
    fy_forward_seq_t f = {&bt, tok, 4, 0, 4, NULL};
    fy_test_log_begin();
    fy_status_t st = fy_runner_forward(s.runner, &f, 1, out);
    fy_status_t again = fy_runner_forward(s.runner, &f, 1, out);
    fy_test_log_end();
    assert_int_not_equal(st, FY_OK);
    assert_int_equal(again, FY_ERR_PEER); /* at once: the group is out of service */
    fy_kvm_seq_release(s.kvm, &bt);
    fy_kvm_seq_deinit(&bt);
    fy_engine_stack_destroy(&s);
    assert_no_children();
    free(out);
    fy_model_destroy(m);
}

/* Per-rank timing: every rank ran every forward pass; the pipeline's later
 * stage waited; the reductions took time. */
static void test_timing(void **state)
{
    (void)state;
    fy_tiny_cfg_t c;
    fy_tiny_cfg_default(&c);
    c.seed = 108;
    fy_tiny_model_t tm;
    fy_tiny_init(&tm, &c);
    const char *path = fy_test_path("par-timing.gguf");
    assert_true(fy_tiny_write_gguf(&tm, path, GW_F32));
    fy_tiny_free(&tm);
    fy_model_t *m;
    assert_int_equal(fy_model_load(path, &m), FY_OK);
    int vocab = fy_model_config(m)->vocab_size;
    fy_engine_build_t b;
    fy_engine_stack_t s = {0};
    build_for(&b, 2, 2, 16);
    assert_int_equal(fy_engine_stack_create(m, &b, &s), FY_OK);
    assert_int_equal(fy_runner_n_ranks(s.runner), 4);
    fy_runner_timing_t t[4];
    assert_int_equal(fy_runner_timing(s.runner, t, 4, true), FY_OK); /* from zero */
    int32_t tok[N_TOK];
    for (int i = 0; i < N_TOK; i++) tok[i] = i + 5;
    float *out = malloc(sizeof(float) * N_TOK * (size_t)vocab);
    run_logits(&s, tok, out);
    assert_int_equal(fy_runner_timing(s.runner, t, 4, false), FY_OK);
    for (int k = 0; k < 4; k++) {
        assert_int_equal(t[k].forwards, 1 + N_DECODE);
        assert_true(t[k].compute_ns > 0);
        assert_true(t[k].allreduce_ns > 0);
    }
    assert_true(t[2].wait_ns > 0 && t[3].wait_ns > 0); /* stage 1 waits for stage 0 */
    assert_true(t[0].wait_ns > 0);                     /* rank 0 for the last stage's rows */
    assert_true(t[0].send_ns > 0 && t[2].send_ns > 0);
    fy_engine_stack_destroy(&s);
    assert_no_children();
    free(out);
    fy_model_destroy(m);
}

/* SmolLM2 (9 heads over 3 KV heads, 30 layers): greedy tokens of tp 3, pp
 * 2 and tp 3 with pp 2 against one rank, through the engine stack. */
static void test_smollm2_greedy(void **state)
{
    (void)state;
    const char *path = fy_test_default_model();
    if (!path) {
        fprintf(stderr, "  skipped: no SmolLM2 model file\n");
        return;
    }
    fy_model_t *m;
    assert_int_equal(fy_model_load(path, &m), FY_OK);
    const char *prompts[] = {"The capital of France is", "def fibonacci(n):"};
    int shapes[][2] = {{1, 1}, {3, 1}, {1, 2}, {3, 2}};
    int32_t got[4][2][16];
    for (size_t k = 0; k < FY_ARRAY_LEN(shapes); k++) {
        fy_engine_build_t b;
        build_for(&b, shapes[k][0], shapes[k][1], 0);
        b.threads = 2;
        b.runner.max_batch_tokens = 64;
        b.runner.max_logits = 1;
        b.runner.max_seqs = 1;
        b.runner.max_ctx = 128;
        b.runner.block_size = 16;
        b.runner.kv_dtype = FY_DTYPE_F16;
        b.runner.n_kv_blocks = 8;
        fy_engine_stack_t s;
        assert_int_equal(fy_engine_stack_create(m, &b, &s), FY_OK);
        for (int p = 0; p < 2; p++) {
            int32_t *ids, n;
            assert_int_equal(fy_prompt_tokens(m, NULL, prompts[p], false, &ids, &n), FY_OK);
            fy_gen_params_t gp;
            fy_gen_params_default(&gp);
            gp.gen.max_tokens = 16;
            gp.gen.ignore_eos = true;
            gp.gen.sampling.temperature = 0;
            fy_gen_stats_t st;
            assert_int_equal(
                fy_generate(s.runner, s.kvm, fy_model_tokenizer(m), ids, n, &gp, NULL, NULL, got[k][p], 16, &st),
                FY_OK);
            assert_int_equal(st.n_generated, 16);
            fy_free(ids);
        }
        fy_engine_stack_destroy(&s);
        assert_no_children();
        for (int p = 0; p < 2; p++) {
            int same = 0;
            while (same < 16 && got[k][p][same] == got[0][p][same]) same++;
            fprintf(stderr, "  smollm2 tp %d pp %d, prompt %d: %d of 16 greedy tokens equal to one rank's\n",
                    shapes[k][0], shapes[k][1], p, same);
            assert_int_equal(same, 16);
        }
    }
    fy_model_destroy(m);
}

/* A real model's logits, teacher-forced over a fixed text, of each shape
 * (tp, pp, partial sums) against one rank's: gathering must give the
 * same bits; partial sums are measured (printed), not bounded. */
static void real_logits(const char *path, const char *text, const int (*shapes)[3], int n_shapes)
{
    fy_model_t *m;
    assert_int_equal(fy_model_load(path, &m), FY_OK);
    int vocab = fy_model_config(m)->vocab_size;
    int32_t *ids, n;
    assert_int_equal(fy_prompt_tokens(m, NULL, text, false, &ids, &n), FY_OK);
    assert_true(n >= N_TOK);
    float *one = malloc(sizeof(float) * N_TOK * (size_t)vocab), *many = malloc(sizeof(float) * N_TOK * (size_t)vocab);
    for (int k = -1; k < n_shapes; k++) {
        fy_engine_build_t b;
        build_for(&b, k < 0 ? 1 : shapes[k][0], k < 0 ? 1 : shapes[k][1], 16);
        b.runner.tp_partial_sums = k >= 0 && shapes[k][2];
        b.threads = 2;
        fy_engine_stack_t s;
        assert_int_equal(fy_engine_stack_create(m, &b, &s), FY_OK);
        run_logits(&s, ids, k < 0 ? one : many);
        fy_engine_stack_destroy(&s);
        assert_no_children();
        if (k < 0) continue;
        double most = 0, gap = 1e9;
        int flips = 0;
        for (int t = 0; t < N_TOK; t++) {
            const float *a = one + (long)t * vocab, *b2 = many + (long)t * vocab;
            for (int v = 0; v < vocab; v++) most = fmax(most, fabs((double)a[v] - (double)b2[v]));
            int i = argmax(a, vocab), j = argmax(b2, vocab);
            flips += i != j;
            float second = -1e30f;
            for (int v = 0; v < vocab; v++)
                if (v != i && a[v] > second) second = a[v];
            gap = fmin(gap, a[i] - second);
        }
        fprintf(stderr,
                "  %s tp %d pp %d%s: max |logit diff| %.3g over %d rows, %d argmax flips (smallest top-2 gap %.3g)\n",
                fy_model_config(m)->name, shapes[k][0], shapes[k][1], shapes[k][2] ? " (partial sums)" : "", most,
                N_TOK, flips, gap);
        if (!shapes[k][2]) assert_true(most == 0); /* gathering computes every element as one rank does */
    }
    free(one);
    free(many);
    fy_free(ids);
    fy_model_destroy(m);
}

static const char REAL_TEXT[] = "The capital of France is Paris, and the capital of Italy is Rome; the capital of "
                                "Spain is Madrid, and the capital of Germany is";

/* SmolLM2: 9 heads over 3 KV heads, tp 3 splits both. */
static void test_smollm2_logits(void **state)
{
    (void)state;
    const char *path = fy_test_default_model();
    if (!path) {
        fprintf(stderr, "  skipped: no SmolLM2 model file\n");
        return;
    }
    static const int shapes[][3] = {{3, 1, 0}, {1, 2, 0}, {3, 2, 0}, {3, 1, 1}};
    real_logits(path, REAL_TEXT, shapes, 4);
}

/* Gemma 3 270M: 4 heads over one KV head (tp 2 and 4 replicate it), K-quant
 * weights, post norms, sliding layers (pp 2's stages group their windows
 * differently: one KV group each). */
static void test_gemma_logits(void **state)
{
    (void)state;
    const char *path = getenv("FERRY_GEMMA_MODEL");
    if (!path) path = "models/gemma-3-270m-q4_k_m.gguf";
    if (access(path, R_OK)) {
        fprintf(stderr, "  skipped: no %s\n", path);
        return;
    }
    static const int shapes[][3] = {{2, 1, 0}, {4, 1, 0}, {1, 2, 0}, {2, 1, 1}};
    real_logits(path, REAL_TEXT, shapes, 4);
}

int main(void)
{
    fy_test_tmpdir();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_f32),      cmocka_unit_test(test_archs),
        cmocka_unit_test(test_refusals),       cmocka_unit_test(test_unequal_pools),
        cmocka_unit_test(test_follower_fails), cmocka_unit_test(test_swap_copies),
        cmocka_unit_test(test_rank_killed),    cmocka_unit_test(test_timing),
        cmocka_unit_test(test_smollm2_logits), cmocka_unit_test(test_gemma_logits),
        cmocka_unit_test(test_smollm2_greedy),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    fy_test_tmpdir_remove();
    return rc;
}

/*
 * test_engine.c - the serving engine: batch invariance (a request gives
 * the same tokens alone or among 15 others arriving at other times),
 * preemption by recompute and by swap giving the tokens of an unpreempted
 * run, cancellation and errors leaving the pool as it was, overload
 * refusals with nothing lost, exactly one terminal event per request,
 * priorities, the latency guardrail, and the engine's own thread; and
 * the one function that builds an engine, from a worker's configuration
 * (engine_config.h).
 */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "common/clock.h"
#include "common/config.h"
#include "engine/engine.h"
#include "engine/engine_config.h"
#include "worker/worker_config.h"
#include "tests/gguf_writer.h"
#include "common/mem.h"
#include "model/model.h"
#include "engine/runner.h"
#include "tests/testutil.h"
#include "tests/tinymodel.h"

#define MAX_OUT 256

typedef struct result {
    int32_t tokens[MAX_OUT];
    int32_t n;
    int terminal; /* terminal events seen: must end at exactly 1 */
    fy_event_kind_t kind;
    fy_finish_reason_t reason;
    fy_status_t status;
    char text[8192];
    size_t len;
    int32_t n_itl, n_generated, n_cached, n_preempted;
    double ttft, e2e, queue;
    pthread_mutex_t *mu; /* thread mode */
    pthread_cond_t *cv;
} result_t;

static void on_event(void *arg, const fy_event_t *ev)
{
    result_t *r = arg;
    if (r->mu) pthread_mutex_lock(r->mu);
    assert_int_equal(r->terminal, 0); /* nothing after the terminal event */
    if (ev->kind == FY_EVENT_TOKEN && r->n < MAX_OUT) r->tokens[r->n++] = ev->token;
    if (ev->len && r->len + ev->len < sizeof(r->text)) {
        memcpy(r->text + r->len, ev->text, ev->len);
        r->len += ev->len;
    }
    if (ev->kind != FY_EVENT_TOKEN) {
        r->terminal++;
        r->kind = ev->kind;
        r->reason = ev->reason;
        r->status = ev->status;
        r->n_itl = ev->timings->n_itl;
        r->n_generated = ev->timings->n_generated;
        r->n_cached = ev->timings->n_cached;
        r->n_preempted = ev->timings->n_preempted;
        r->ttft = ev->timings->ttft_s;
        r->e2e = ev->timings->e2e_s;
        r->queue = ev->timings->queue_s;
        if (r->cv) pthread_cond_broadcast(r->cv);
    }
    if (r->mu) pthread_mutex_unlock(r->mu);
}

typedef struct rig {
    fy_model_t *m;
    fy_backend_t *be;
    fy_runner_t *r;
    fy_kv_hasher_t *hasher;
    fy_kvm_t *kvm;
    fy_engine_t *e;
    int vocab;
} rig_t;

static char g_tiny[512];

static int setup(void **state)
{
    fy_tiny_cfg_t c;
    fy_tiny_cfg_default(&c);
    c.max_ctx = 1024;
    fy_tiny_model_t tm;
    fy_tiny_init(&tm, &c);
    snprintf(g_tiny, sizeof(g_tiny), "%s", fy_test_path("tiny-engine.gguf"));
    bool ok = fy_tiny_write_gguf(&tm, g_tiny, GW_Q8_0);
    fy_tiny_free(&tm);
    return ok ? 0 : -1;
}

static int teardown(void **state)
{
    fy_test_tmpdir_remove();
    return 0;
}

typedef struct rig_opts {
    const char *model;
    int32_t blocks, host_blocks, max_seqs, batch_tokens;
    int32_t disk_blocks; /* a disk tier of this many blocks in the test's folder "kvdisk"; 0: none */
    fy_engine_params_t ep;
    bool caching;
    int32_t graphs; /* the runner's: 2 pads decode batches as for recorded steps */
} rig_opts_t;

static void rig_opts(rig_opts_t *o, const char *model)
{
    memset(o, 0, sizeof(*o));
    o->model = model;
    o->blocks = 512;
    o->max_seqs = 16;
    o->batch_tokens = 256;
    o->caching = true;
    o->graphs = 1;
    fy_engine_params_default(&o->ep);
    o->ep.max_num_seqs = 16;
    o->ep.max_num_batched_tokens = 256;
}

static void rig_open(rig_t *g, const rig_opts_t *o)
{
    memset(g, 0, sizeof(*g));
    assert_int_equal(fy_model_load(o->model, &g->m), FY_OK);
    g->vocab = fy_model_config(g->m)->vocab_size;
    fy_backend_params_t bp = {.n_threads = 2};
    assert_int_equal(fy_backend_create("cpu", &bp, &g->be), FY_OK);
    fy_runner_params_t rp;
    fy_runner_params_default(&rp);
    rp.max_batch_tokens = o->batch_tokens;
    rp.max_seqs = o->max_seqs;
    rp.max_logits = o->max_seqs;
    rp.max_ctx = 1024;
    rp.n_kv_blocks = o->blocks;
    rp.n_host_blocks = o->host_blocks;
    rp.graphs = o->graphs;
    assert_int_equal(fy_runner_create(g->m, g->be, &rp, &g->r), FY_OK);
    assert_int_equal(fy_kv_hasher_create_random(&g->hasher), FY_OK);
    fy_kvm_params_t kp;
    fy_runner_kvm_params(g->r, &kp);
    kp.hasher = g->hasher;
    kp.prefix_caching = o->caching;
    kp.watermark = 0;
    if (o->disk_blocks) {
        kp.disk_dir = fy_test_path("kvdisk");
        assert_true(mkdir(kp.disk_dir, 0700) == 0 || errno == EEXIST);
        kp.disk_bytes = (int64_t)o->disk_blocks * (int64_t)kp.layout.block_bytes;
    }
    assert_int_equal(fy_kvm_create(&kp, &g->kvm), FY_OK);
    assert_int_equal(fy_engine_create(g->r, g->kvm, fy_model_tokenizer(g->m), &o->ep, &g->e), FY_OK);
}

/* Runs the engine until idle, with a bound so a hang fails instead. */
static void rig_drain(rig_t *g)
{
    for (int i = 0; i < 100000 && !fy_engine_idle(g->e); i++) assert_int_equal(fy_engine_step(g->e), FY_OK);
    assert_true(fy_engine_idle(g->e));
}

static void rig_close(rig_t *g)
{
    fy_engine_destroy(g->e);
    fy_kvm_stats_t ks;
    fy_kvm_stats(g->kvm, &ks);
    assert_int_equal(ks.tier[FY_KV_DEVICE].used, 0); /* every block back */
    assert_int_equal(ks.tier[FY_KV_HOST].used, 0);
    assert_int_equal(ks.promised, 0);
    assert_int_equal(fy_kvm_check(g->kvm), FY_OK);
    fy_kvm_destroy(g->kvm);
    fy_kv_hasher_destroy(g->hasher);
    fy_runner_destroy(g->r);
    fy_backend_destroy(g->be);
    fy_model_destroy(g->m);
}

static void make_prompt(int32_t *p, int32_t n, int vocab, uint64_t seed)
{
    for (int32_t i = 0; i < n; i++) p[i] = (int32_t)(fy_test_rand_u64(&seed) % (uint64_t)(vocab - 3));
}

enum { N_REQ = 16 };

typedef struct workload {
    int32_t prompt[N_REQ][400];
    int32_t len[N_REQ];
    fy_genspec_t rp[N_REQ];
    int arrive[N_REQ]; /* step at which each arrives */
} workload_t;

/* The long workload's spans.  Under ThreadSanitizer the real model's
 * passes run some twenty times slower: with prompts of up to 300 tokens
 * test_engine passed 13 of its 24 tests in 47 minutes on two cores
 * (2026-11-29), most of it in the two _default cases.  There the prompts
 * and answers are shorter (820 prompt and 248 answer tokens in all, not
 * 2,420 and 488): the threads, the code paths and the checks are the
 * same, and several prompts still take more than one 64-token chunk in
 * the disaggregated case.  FY_TEST_SHORT_WORKLOAD picks the short spans
 * in any build, to check them without TSan. */
#if defined(__SANITIZE_THREAD__) || defined(FY_TEST_SHORT_WORKLOAD)
enum { LONG_PROMPT_SPAN = 100, LONG_ANSWER_SPAN = 16 };
#else
enum { LONG_PROMPT_SPAN = 300, LONG_ANSWER_SPAN = 40 };
#endif

/* long: prompts of 5 to LONG_PROMPT_SPAN tokens and short answers; else
 * short prompts and long answers, the shape that runs out of blocks
 * mid-decode */
static void make_workload(workload_t *w, int vocab, bool sampled, bool long_prompts)
{
    for (int i = 0; i < N_REQ; i++) {
        w->len[i] = long_prompts ? 5 + (i * 37) % LONG_PROMPT_SPAN : 10 + (i * 7) % 30;
        make_prompt(w->prompt[i], w->len[i], vocab, 1000 + (uint64_t)i);
        fy_genspec_default(&w->rp[i]);
        w->rp[i].max_tokens = long_prompts ? 8 + (i * 13) % LONG_ANSWER_SPAN : 60 + (i * 11) % 40;
        w->rp[i].ignore_eos = true;
        if (sampled && i % 2) {
            w->rp[i].sampling = (fy_sampling_params_t){
                .temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.0f, .seed = 77 + (uint64_t)i};
        }
        w->arrive[i] = (i * 3) % 11;
    }
}

/* Each request alone, one at a time. */
static void run_alone(const char *model, const workload_t *w, result_t *res)
{
    rig_opts_t o;
    rig_opts(&o, model);
    o.caching = false;
    rig_t g;
    rig_open(&g, &o);
    for (int i = 0; i < N_REQ; i++) {
        uint64_t id;
        assert_int_equal(fy_engine_submit(g.e, w->prompt[i], w->len[i], &w->rp[i], NULL, on_event, &res[i], &id),
                         FY_OK);
        rig_drain(&g);
        assert_int_equal(res[i].terminal, 1);
        assert_int_equal(res[i].kind, FY_EVENT_FINISH);
    }
    rig_close(&g);
}

static void check_same(const result_t *a, const result_t *b)
{
    for (int i = 0; i < N_REQ; i++) {
        assert_int_equal(b[i].terminal, 1);
        if (a[i].n != b[i].n || memcmp(a[i].tokens, b[i].tokens, sizeof(int32_t) * (size_t)a[i].n))
            fail_msg("request %d: %d tokens alone, %d in the batch, or different tokens", i, a[i].n, b[i].n);
        assert_int_equal(a[i].len, b[i].len);
        assert_memory_equal(a[i].text, b[i].text, a[i].len);
    }
}

/* Batch invariance: 16 requests of different lengths, greedy and seeded,
 * arriving at different steps, give the tokens they give alone. */
static void batch_invariance(const char *model, int n_checked, int32_t graphs)
{
    workload_t *w = calloc(1, sizeof(*w));
    rig_t g;
    rig_opts_t o;
    rig_opts(&o, model);
    rig_open(&g, &o);
    make_workload(w, g.vocab, true, true);
    rig_close(&g);
    result_t *alone = calloc(N_REQ, sizeof(result_t)), *batch = calloc(N_REQ, sizeof(result_t));
    run_alone(model, w, alone);
    o.graphs = graphs;
    o.max_seqs = o.ep.max_num_seqs = 13; /* the last bucket is not a power of two */
    rig_open(&g, &o);
    int submitted = 0, max_running = 0;
    for (int step = 0; submitted < N_REQ || !fy_engine_idle(g.e); step++) {
        for (int i = 0; i < N_REQ; i++) {
            if (w->arrive[i] != step) continue;
            uint64_t id;
            assert_int_equal(fy_engine_submit(g.e, w->prompt[i], w->len[i], &w->rp[i], NULL, on_event, &batch[i], &id),
                             FY_OK);
            submitted++;
        }
        assert_int_equal(fy_engine_step(g.e), FY_OK);
        fy_engine_stats_t st;
        fy_engine_stats(g.e, &st);
        if (st.running > max_running) max_running = st.running;
        assert_true(step < 100000);
    }
    assert_true(max_running >= 8); /* they really shared steps */
    (void)n_checked;
    check_same(alone, batch);
    fy_runner_timing_t tm;
    assert_int_equal(fy_runner_timing(g.r, &tm, 1, false), FY_OK);
    assert_int_equal(tm.graph_steps, 0); /* the cpu records nothing; padded or not, it ran directly */
    if (graphs == 2)
        assert_true(tm.pad_rows > 0); /* batches of 3, 5, 6, 7, 9.. sequences ran as 4, 8, 16 */
    else
        assert_int_equal(tm.pad_rows, 0);
    rig_close(&g);
    free(w), free(alone), free(batch);
}

static void test_batch_invariance_tiny(void **state) { batch_invariance(g_tiny, N_REQ, 1); }

/* Decode batches padded to the buckets of recorded steps (CUDA graphs),
 * padding rows that write no KV and see no key: every request's tokens
 * are still its tokens alone, and every block comes back (rig_close). */
static void test_batch_invariance_padded(void **state) { batch_invariance(g_tiny, N_REQ, 2); }

static void test_batch_invariance_default(void **state)
{
    const char *m = fy_test_default_model();
    if (!m) skip();
    batch_invariance(m, N_REQ, 1);
}

/* Too few blocks for the batch: admission on a predicted output length
 * lets requests in that later run out, and preemption makes room. */
static void preemption(fy_preempt_mode_t mode)
{
    workload_t *w = calloc(1, sizeof(*w));
    rig_opts_t o;
    rig_opts(&o, g_tiny);
    rig_t g;
    rig_open(&g, &o);
    make_workload(w, g.vocab, true, false);
    rig_close(&g);
    result_t *alone = calloc(N_REQ, sizeof(result_t)), *batch = calloc(N_REQ, sizeof(result_t));
    run_alone(g_tiny, w, alone);

    o.blocks = 48; /* 16 requests grow to about 130 blocks at once */
    o.host_blocks = mode == FY_PREEMPT_SWAP ? 128 : 0;
    o.ep.preempt = mode;
    o.ep.predict_output = true;
    o.ep.predict_quantile = 0.1;
    rig_open(&g, &o);
    /* teach the predictor that outputs are short */
    int32_t p[8];
    make_prompt(p, 8, g.vocab, 5);
    result_t warm[8] = {0};
    for (int i = 0; i < 8; i++) {
        fy_genspec_t rp;
        fy_genspec_default(&rp);
        rp.max_tokens = 1;
        uint64_t id;
        assert_int_equal(fy_engine_submit(g.e, p, 8, &rp, NULL, on_event, &warm[i], &id), FY_OK);
    }
    rig_drain(&g);
    for (int i = 0; i < N_REQ; i++) {
        uint64_t id;
        assert_int_equal(fy_engine_submit(g.e, w->prompt[i], w->len[i], &w->rp[i], NULL, on_event, &batch[i], &id),
                         FY_OK);
    }
    rig_drain(&g);
    fy_engine_stats_t st;
    fy_engine_stats(g.e, &st);
    fprintf(stderr, "preemptions: %llu by recompute, %llu by swap\n", (unsigned long long)st.preemptions_recompute,
            (unsigned long long)st.preemptions_swap);
    if (mode == FY_PREEMPT_SWAP)
        assert_true(st.preemptions_swap > 0);
    else
        assert_true(st.preemptions_recompute > 0);
    int preempted = 0;
    for (int i = 0; i < N_REQ; i++) preempted += batch[i].n_preempted > 0;
    assert_true(preempted > 0);
    check_same(alone, batch);
    rig_close(&g);
    free(w), free(alone), free(batch);
}

static void test_preempt_recompute(void **state) { preemption(FY_PREEMPT_RECOMPUTE); }

/* The disk tier's file, as anyone with our uid finds it (/proc/self/fd). */
static int disk_tier_fd(void)
{
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    int found = -1;
    for (struct dirent *e; (e = readdir(d));) {
        char path[300], target[600];
        snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(path, target, sizeof(target) - 1);
        if (n <= 0) continue;
        target[n] = '\0';
        if (strstr(target, "ferry-kv")) found = atoi(e->d_name);
    }
    closedir(d);
    assert_true(found >= 0);
    return found;
}

/*
 * A disk tier whose file is overwritten behind the engine's back: the
 * first prompt's blocks went down to disk (a tight device and host tier),
 * the file's bytes are changed, and the prompt again gives the tokens of
 * an engine without any cache: every block read back is dropped on its
 * checksum and computed again, not served.
 */
static void test_disk_tier_corrupted(void **state)
{
    (void)state;
    enum { N_P = 8, LEN = 64 };
    workload_t *w = calloc(1, sizeof(*w));
    rig_opts_t o;
    rig_opts(&o, g_tiny);
    rig_t g;
    rig_open(&g, &o);
    int vocab = g.vocab;
    rig_close(&g);
    for (int i = 0; i < N_REQ; i++) {
        w->len[i] = LEN;
        make_prompt(w->prompt[i], LEN, vocab, 7000 + (uint64_t)(i % N_P));
        fy_genspec_default(&w->rp[i]);
        w->rp[i].max_tokens = 8;
    }
    result_t *alone = calloc(N_REQ, sizeof(result_t)), *got = calloc(N_REQ, sizeof(result_t));
    run_alone(g_tiny, w, alone);
    o.blocks = 12; /* a request's 5; the rest cached, pushed down as new prompts come */
    o.host_blocks = 8;
    o.disk_blocks = 64;
    o.ep.max_num_seqs = 1;
    rig_open(&g, &o);
    for (int i = 0; i < N_P; i++) { /* 4 named blocks each: the first ones end up on disk */
        uint64_t id;
        assert_int_equal(fy_engine_submit(g.e, w->prompt[i], LEN, &w->rp[i], NULL, on_event, &got[i], &id), FY_OK);
        rig_drain(&g);
    }
    fy_kvm_stats_t ks;
    fy_kvm_stats(g.kvm, &ks);
    assert_true(ks.tier[FY_KV_DISK].cached >= 4);
    int fd = disk_tier_fd();
    struct stat sb;
    assert_int_equal(fstat(fd, &sb), 0);
    unsigned char *junk = malloc((size_t)sb.st_size);
    assert_non_null(junk);
    uint64_t seed = 99;
    for (off_t k = 0; k < sb.st_size; k++) junk[k] = (unsigned char)fy_test_rand_u64(&seed);
    assert_int_equal(pwrite(fd, junk, (size_t)sb.st_size, 0), (ssize_t)sb.st_size);
    free(junk);
    /* the same prompts again, the first ones' blocks on the disk */
    for (int i = N_P; i < N_REQ; i++) {
        uint64_t id;
        assert_int_equal(fy_engine_submit(g.e, w->prompt[i], LEN, &w->rp[i], NULL, on_event, &got[i], &id), FY_OK);
        rig_drain(&g);
    }
    fy_kvm_stats(g.kvm, &ks);
    fprintf(stderr, "disk tier: %llu hits, %llu blocks dropped on their checksum\n",
            (unsigned long long)ks.tier[FY_KV_DISK].hits, (unsigned long long)ks.disk_bad_blocks);
    assert_true(ks.disk_bad_blocks >= 1);
    check_same(alone, got);
    rig_close(&g);
    free(w), free(alone), free(got);
}
static void test_preempt_swap(void **state) { preemption(FY_PREEMPT_SWAP); }

/* ---- KV budgets (evict.h) ---------------------------------------------------------------------------- */

/* Which blocks go, exactly: a sequence of 200 tokens in 16-token blocks
 * (12 full, the 13th being written). */
static void test_evict_choose(void **state)
{
    fy_block_table_t bt = {0};
    int32_t blocks[13], lo = 0;
    for (int i = 0; i < 13; i++) blocks[i] = 100 + i;
    bt.blocks = blocks, bt.lo = &lo, bt.n_groups = 1, bt.max_blocks = 13, bt.n_blocks = 13, bt.n_tokens = 200;
    bt.block_size = 16;
    int32_t out[16];
    fy_evict_cand_t cand[16];
    /* streaming: sinks 16 (block 0), recent 40 (tokens 160.. : blocks 10..12) */
    fy_evict_params_t s = {.policy = FY_EVICT_STREAMING, .sink_tokens = 16, .recent_tokens = 40};
    assert_int_equal(fy_evict_choose(&s, &bt, NULL, out, cand, 16), 9);
    for (int k = 0; k < 9; k++) assert_int_equal(out[k], 1 + k);
    /* h2o keeps the two middle blocks with the highest scores; a tie keeps the later */
    float sc[13] = {9, 1, 5, 0.5f, 7, 2, 2, 0, 1, 3, 9, 9, 9};
    fy_evict_params_t h = {.policy = FY_EVICT_H2O, .sink_tokens = 16, .recent_tokens = 40, .heavy_tokens = 32};
    assert_int_equal(fy_evict_choose(&h, &bt, sc, out, cand, 16), 7);
    const int32_t want[7] = {1, 3, 5, 6, 7, 8, 9};
    for (int k = 0; k < 7; k++) assert_int_equal(out[k], want[k]);
    sc[9] = 5; /* blocks 2 and 9 tie for the second place: the later one stays */
    assert_int_equal(fy_evict_choose(&h, &bt, sc, out, cand, 16), 7);
    assert_int_equal(out[1], 2);
    /* blocks already gone are not chosen again; within the budget, nothing goes */
    blocks[3] = blocks[5] = -1;
    assert_int_equal(fy_evict_choose(&s, &bt, NULL, out, cand, 16), 7);
    bt.n_tokens = 50, bt.n_blocks = 4;
    fy_evict_params_t big = {.policy = FY_EVICT_STREAMING, .sink_tokens = 16, .recent_tokens = 64};
    assert_int_equal(fy_evict_choose(&big, &bt, NULL, out, cand, 16), 0);
    fy_evict_params_t none = {.policy = FY_EVICT_NONE};
    assert_int_equal(fy_evict_choose(&none, &bt, NULL, out, cand, 16), 0);
    /* a request's budget scales the split; more than the deployment's is refused */
    fy_evict_params_t d = {.policy = FY_EVICT_H2O, .sink_tokens = 64, .recent_tokens = 1024, .heavy_tokens = 512}, r;
    assert_int_equal(fy_evict_budget(&d), 1600);
    assert_int_equal(fy_evict_for_budget(&d, 800, &r), FY_OK);
    assert_int_equal(r.sink_tokens, 32), assert_int_equal(r.heavy_tokens, 256), assert_int_equal(r.recent_tokens, 512);
    fy_test_log_begin();
    assert_int_equal(fy_evict_for_budget(&d, 1601, &r), FY_ERR_INVALID);
    assert_int_equal(fy_evict_for_budget(&none, 100, &r), FY_ERR_INVALID);
    assert_true(fy_test_log_has("allows 1 to 1600", NULL) && fy_test_log_has("evicts nothing", NULL));
    fy_test_log_end();
    /* the most a group holds: sinks, heavy, recent plus a step, the block being written */
    assert_int_equal(fy_evict_max_blocks(&h, 16, 256), 1 + 2 + (40 + 256 + 15) / 16 + 1);
}

/* A streaming budget through the engine: every step stays within the
 * budget's blocks, blocks go back, the tokens are the same run to run; a
 * budget larger than the context changes nothing; requests for budgets the
 * engine does not allow are refused.  kv_budget_run: the tokens of 4
 * requests of 300-token prompts and 40 greedy tokens under ep. */
static void kv_budget_run(const fy_engine_params_t *ep, int32_t kv_budget, result_t *res, uint64_t *evicted_p)
{
    rig_opts_t o;
    rig_opts(&o, g_tiny);
    o.caching = false;
    o.ep.evict = ep->evict;
    rig_t g;
    rig_open(&g, &o);
    static int32_t p[4][300];
    fy_genspec_t rp;
    fy_genspec_default(&rp);
    rp.max_tokens = 40;
    rp.ignore_eos = true;
    rp.kv_budget = kv_budget;
    for (int i = 0; i < 4; i++) {
        make_prompt(p[i], 300, g.vocab, 70 + (uint64_t)i);
        uint64_t id;
        assert_int_equal(fy_engine_submit(g.e, p[i], 300, &rp, NULL, on_event, &res[i], &id), FY_OK);
    }
    int32_t cap = fy_evict_max_blocks(&ep->evict, 16, o.ep.max_num_batched_tokens);
    for (int s = 0; s < 100000 && !fy_engine_idle(g.e); s++) {
        assert_int_equal(fy_engine_step(g.e), FY_OK);
        fy_kvm_stats_t ks;
        fy_kvm_stats(g.kvm, &ks);
        if (ep->evict.policy != FY_EVICT_NONE && ks.tier[FY_KV_DEVICE].used > 4 * cap)
            fail_msg("step %d: %d blocks in use; 4 requests of at most %d each", s, ks.tier[FY_KV_DEVICE].used, cap);
    }
    fy_kvm_stats_t ks;
    fy_kvm_stats(g.kvm, &ks);
    *evicted_p = ks.evicted_blocks;
    for (int i = 0; i < 4; i++) {
        assert_int_equal(res[i].terminal, 1);
        assert_int_equal(res[i].kind, FY_EVENT_FINISH);
        assert_int_equal(res[i].n, 40);
    }
    rig_close(&g); /* every block back */
}

static void test_kv_budget_streaming(void **state)
{
    fy_engine_params_t none, st, wide;
    fy_engine_params_default(&none);
    st = wide = none;
    st.evict = (fy_evict_params_t){.policy = FY_EVICT_STREAMING, .sink_tokens = 16, .recent_tokens = 64};
    wide.evict = (fy_evict_params_t){.policy = FY_EVICT_STREAMING, .sink_tokens = 16, .recent_tokens = 500};
    result_t a[4] = {0}, b[4] = {0}, c[4] = {0}, d[4] = {0};
    uint64_t ea, eb, ec, ed;
    kv_budget_run(&none, 0, a, &ea);
    kv_budget_run(&st, 0, b, &eb);
    kv_budget_run(&st, 0, c, &ec);
    kv_budget_run(&wide, 0, d, &ed);
    fprintf(stderr, "streaming 16 + 64: %llu blocks evicted\n", (unsigned long long)eb);
    assert_int_equal(ea, 0);
    assert_true(eb > 4 * 10);
    assert_int_equal(eb, ec);
    assert_int_equal(ed, 0); /* 340 tokens never pass a 516-token budget */
    int differ = 0;
    for (int i = 0; i < 4; i++) {
        assert_memory_equal(b[i].tokens, c[i].tokens, sizeof(int32_t) * 40); /* run to run */
        assert_memory_equal(a[i].tokens, d[i].tokens, sizeof(int32_t) * 40); /* within the budget: as none */
        differ += memcmp(a[i].tokens, b[i].tokens, sizeof(int32_t) * 40) != 0;
    }
    fprintf(stderr, "%d of 4 requests' tokens changed under the budget\n", differ);
    /* H2O: the kernel's scores pick the middle blocks; the same run to run,
     * within its budget every step, not streaming's choice */
    fy_engine_params_t h2o = none;
    h2o.evict = (fy_evict_params_t){.policy = FY_EVICT_H2O, .sink_tokens = 16, .recent_tokens = 48, .heavy_tokens = 32};
    result_t h[4] = {0}, h2[4] = {0};
    uint64_t eh, eh2;
    kv_budget_run(&h2o, 0, h, &eh);
    kv_budget_run(&h2o, 0, h2, &eh2);
    assert_true(eh > 0);
    assert_int_equal(eh, eh2);
    for (int i = 0; i < 4; i++) assert_memory_equal(h[i].tokens, h2[i].tokens, sizeof(int32_t) * 40);
    /* a request's own budget: smaller than the engine's is taken, larger refused */
    result_t e[4] = {0};
    uint64_t ee;
    kv_budget_run(&wide, 80, e, &ee);
    assert_true(ee > 0);
    rig_opts_t o;
    rig_opts(&o, g_tiny);
    o.ep.evict = wide.evict;
    rig_t g;
    rig_open(&g, &o);
    int32_t p[20] = {1, 2, 3};
    fy_genspec_t rp;
    fy_genspec_default(&rp);
    rp.kv_budget = 517;
    result_t r = {0};
    uint64_t id;
    fy_test_log_begin();
    assert_int_equal(fy_engine_submit(g.e, p, 20, &rp, NULL, on_event, &r, &id), FY_ERR_INVALID);
    assert_true(fy_test_log_has("allows 1 to 516", NULL));
    fy_test_log_end();
    rig_close(&g);
}

/*
 * Evicting requests preempted and resumed: short prompts that decode far
 * past their budget, admitted on a predicted short output into a pool
 * smaller than what each would hold without eviction.  They outgrow their
 * promises, get preempted (swapped out, or dropped and recomputed) and
 * come back within their budget's blocks (a swapped-out request asks for
 * its capped promise, not its whole length), and all finish; every block
 * returns (rig_close).
 */
static void kv_budget_preempted(fy_preempt_mode_t mode)
{
    rig_opts_t o;
    rig_opts(&o, g_tiny);
    o.caching = false;
    o.blocks = 24;
    o.host_blocks = mode == FY_PREEMPT_SWAP ? 96 : 0;
    o.batch_tokens = 32;
    o.ep.max_num_batched_tokens = 32;
    o.ep.preempt = mode;
    o.ep.predict_output = true;
    o.ep.predict_quantile = 0.1;
    o.ep.evict = (fy_evict_params_t){.policy = FY_EVICT_STREAMING, .sink_tokens = 16, .recent_tokens = 48};
    rig_t g;
    rig_open(&g, &o);
    int32_t cap = fy_evict_max_blocks(&o.ep.evict, 16, 32);
    int32_t p[6][40];
    result_t warm[8] = {0}, res[6] = {0};
    fy_genspec_t rp;
    fy_genspec_default(&rp);
    rp.max_tokens = 1;
    for (int i = 0; i < 8; i++) { /* teach the predictor that outputs are short */
        make_prompt(p[0], 8, g.vocab, 9);
        uint64_t id;
        assert_int_equal(fy_engine_submit(g.e, p[0], 8, &rp, NULL, on_event, &warm[i], &id), FY_OK);
    }
    rig_drain(&g);
    rp.max_tokens = 400; /* 440 tokens: 28 blocks without eviction, more than the pool */
    rp.ignore_eos = true;
    for (int i = 0; i < 6; i++) {
        make_prompt(p[i], 40, g.vocab, 300 + (uint64_t)i);
        uint64_t id;
        assert_int_equal(fy_engine_submit(g.e, p[i], 40, &rp, NULL, on_event, &res[i], &id), FY_OK);
    }
    for (int s = 0; s < 200000 && !fy_engine_idle(g.e); s++) {
        assert_int_equal(fy_engine_step(g.e), FY_OK);
        fy_kvm_stats_t ks;
        fy_kvm_stats(g.kvm, &ks);
        if (ks.tier[FY_KV_DEVICE].used > 6 * cap) fail_msg("step %d: %d blocks in use", s, ks.tier[FY_KV_DEVICE].used);
    }
    assert_true(fy_engine_idle(g.e));
    fy_engine_stats_t st;
    fy_engine_stats(g.e, &st);
    fy_kvm_stats_t ks;
    fy_kvm_stats(g.kvm, &ks);
    int preempted = 0;
    for (int i = 0; i < 6; i++) {
        assert_int_equal(res[i].terminal, 1);
        assert_int_equal(res[i].kind, FY_EVENT_FINISH);
        assert_int_equal(res[i].n_generated, 400);
        preempted += res[i].n_preempted > 0;
    }
    fprintf(stderr, "%s: %d of 6 evicting requests preempted (%llu by swap, %llu by recompute), %llu blocks evicted\n",
            mode == FY_PREEMPT_SWAP ? "swap" : "recompute", preempted, (unsigned long long)st.preemptions_swap,
            (unsigned long long)st.preemptions_recompute, (unsigned long long)ks.evicted_blocks);
    assert_true(preempted > 0 && ks.evicted_blocks > 6 * 20);
    assert_true(mode == FY_PREEMPT_SWAP ? st.preemptions_swap > 0 : st.preemptions_recompute > 0);
    rig_close(&g);
}

static void test_kv_budget_preempt_swap(void **state) { kv_budget_preempted(FY_PREEMPT_SWAP); }
static void test_kv_budget_preempt_recompute(void **state) { kv_budget_preempted(FY_PREEMPT_RECOMPUTE); }

/* ---- logits processing and alternatives (logits.h) ---- */

typedef struct top_rec {
    result_t r;
    int32_t first_alt[64]; /* each token's most likely alternative */
    float lp[64], first_alt_lp[64];
    int32_t n_alt[64];
} top_rec_t;

static void on_top(void *arg, const fy_event_t *ev)
{
    top_rec_t *t = arg;
    if (ev->kind == FY_EVENT_TOKEN && t->r.n < 64) {
        t->n_alt[t->r.n] = ev->n_top;
        t->lp[t->r.n] = ev->logprob;
        if (ev->n_top) t->first_alt[t->r.n] = ev->top_ids[0], t->first_alt_lp[t->r.n] = ev->top_logprobs[0];
    }
    on_event(&t->r, ev);
}

static void run_one(rig_t *g, const int32_t *p, int32_t n, const fy_genspec_t *rp, top_rec_t *t)
{
    memset(t, 0, sizeof(*t));
    uint64_t id;
    assert_int_equal(fy_engine_submit(g->e, p, n, rp, NULL, on_top, t, &id), FY_OK);
    rig_drain(g);
    assert_int_equal(t->r.terminal, 1);
    assert_int_equal(t->r.kind, FY_EVENT_FINISH);
}

/* On the tiny model, greedy: a stop token id ends the request before it
 * (finish stop, not in the text); min_tokens holds it and EOS back; a
 * bias of +100 makes a token the only choice and -100 bans one; the
 * alternatives name the greedy token first with its logprob; penalties
 * move a repetitive greedy run off its loop; an id outside the vocabulary
 * is refused by name. */
static void test_logits_processing_engine(void **state)
{
    rig_opts_t o;
    rig_opts(&o, g_tiny);
    o.caching = false;
    rig_t g;
    rig_open(&g, &o);
    int32_t p[24];
    make_prompt(p, 24, g.vocab, 404);
    fy_genspec_t rp;
    fy_genspec_default(&rp);
    rp.max_tokens = 40;
    rp.ignore_eos = true;
    static top_rec_t base, t;
    run_one(&g, p, 24, &rp, &base);
    assert_int_equal(base.r.n, 40);
    /* stop token id: the base run's 6th token */
    int32_t stop = base.r.tokens[5], first_at = 0;
    while (base.r.tokens[first_at] != stop) first_at++;
    fy_genspec_t q = rp;
    q.stop_ids[0] = stop, q.n_stop_ids = 1;
    run_one(&g, p, 24, &q, &t);
    assert_int_equal(t.r.reason, FY_FINISH_STOP);
    assert_int_equal(t.r.n, first_at); /* the tokens before it, not it */
    assert_memory_equal(t.r.tokens, base.r.tokens, sizeof(int32_t) * (size_t)first_at);
    /* min_tokens past it: the stop id is banned until then */
    q.min_tokens = first_at + 3;
    run_one(&g, p, 24, &q, &t);
    assert_true(t.r.n >= first_at + 3);
    for (int32_t i = 0; i < first_at + 3; i++) assert_int_not_equal(t.r.tokens[i], stop);
    /* +100 on one token: every greedy pick; -100 on the base's first: never first */
    fy_genspec_t b = rp;
    int32_t ids[2] = {17, base.r.tokens[0]};
    float bias[2] = {100.0f, -100.0f};
    b.logit_bias_id[0] = ids[0], b.logit_bias[0] = bias[0], b.n_logit_bias = 1;
    run_one(&g, p, 24, &b, &t);
    for (int32_t i = 0; i < t.r.n; i++) assert_int_equal(t.r.tokens[i], 17);
    b.logit_bias_id[0] = ids[1], b.logit_bias[0] = bias[1];
    run_one(&g, p, 24, &b, &t);
    assert_int_not_equal(t.r.tokens[0], base.r.tokens[0]);
    /* alternatives: greedy picks the first; its logprob is the event's */
    fy_genspec_t a = rp;
    a.logprobs = true, a.top_logprobs = 5;
    run_one(&g, p, 24, &a, &t);
    assert_memory_equal(t.r.tokens, base.r.tokens, sizeof(int32_t) * 40); /* alternatives change nothing */
    for (int32_t i = 0; i < 40; i++) {
        assert_int_equal(t.n_alt[i], 5);
        assert_int_equal(t.first_alt[i], t.r.tokens[i]);
        assert_true(fabsf(t.first_alt_lp[i] - t.lp[i]) < 1e-6f);
    }
    /* a strong repetition penalty: no generated token repeats a prompt or
     * earlier token while fresh ones are far more likely (greedy on the
     * tiny model loops otherwise) */
    int distinct_base = 0, distinct_pen = 0;
    fy_genspec_t r = rp;
    r.repetition_penalty = 10.0f, r.presence_penalty = 2.0f, r.frequency_penalty = 2.0f;
    run_one(&g, p, 24, &r, &t);
    for (int32_t i = 0; i < 40; i++) {
        bool seen_b = false, seen_p = false;
        for (int32_t j = 0; j < i; j++)
            seen_b |= base.r.tokens[j] == base.r.tokens[i], seen_p |= t.r.tokens[j] == t.r.tokens[i];
        distinct_base += !seen_b, distinct_pen += !seen_p;
    }
    fprintf(stderr, "distinct tokens in 40: %d greedy, %d with penalties\n", distinct_base, distinct_pen);
    assert_true(distinct_pen > distinct_base);
    /* ids outside the vocabulary: refused by name */
    int32_t far = g.vocab;
    fy_genspec_t bad = rp;
    bad.stop_ids[0] = far, bad.n_stop_ids = 1;
    uint64_t id;
    fy_test_log_begin();
    assert_int_equal(fy_engine_submit(g.e, p, 24, &bad, NULL, on_top, &t, &id), FY_ERR_INVALID);
    assert_true(fy_test_log_has("stop_token_ids names token", NULL));
    fy_test_log_end();
    rig_close(&g);
}

/* ---- prompt logprobs and bad words ---- */

#define PLP_N 40
#define PLP_K 5

typedef struct plp_rec {
    top_rec_t t;
    float lp[PLP_N];
    int32_t rank[PLP_N], top[PLP_N][PLP_K];
    float top_lp[PLP_N][PLP_K];
    int32_t seen[PLP_N]; /* times each position was reported */
    int32_t events, after_token;
} plp_rec_t;

static void on_plp(void *arg, const fy_event_t *ev)
{
    plp_rec_t *p = arg;
    if (ev->kind == FY_EVENT_PROMPT_LOGPROBS) {
        p->events++;
        p->after_token += p->t.r.n > 0;
        assert_int_equal(ev->n_top, PLP_K);
        assert_true(ev->first >= 1 && ev->first + ev->n_rows <= ev->n_prompt && ev->n_prompt <= PLP_N);
        for (int32_t r = 0; r < ev->n_rows; r++) {
            int32_t j = ev->first + r;
            p->lp[j] = ev->prompt_lps[r];
            p->rank[j] = ev->prompt_rank[r];
            memcpy(p->top[j], ev->top_ids + r * PLP_K, sizeof(p->top[j]));
            memcpy(p->top_lp[j], ev->top_logprobs + r * PLP_K, sizeof(p->top_lp[j]));
            p->seen[j]++;
        }
        return;
    }
    on_top(&p->t, ev);
}

static void run_plp(rig_t *g, const int32_t *p, int32_t n, const fy_genspec_t *rp, plp_rec_t *t)
{
    memset(t, 0, sizeof(*t));
    uint64_t id;
    assert_int_equal(fy_engine_submit(g->e, p, n, rp, NULL, on_plp, t, &id), FY_OK);
    rig_drain(g);
    assert_int_equal(t->t.r.terminal, 1);
    assert_int_equal(t->t.r.kind, FY_EVENT_FINISH);
}

/* Prompt logprobs against a reference: the prompt run token by token
 * through the runner (one logit row a pass), each row's log-softmax in
 * double: every prompt token from the second has its logprob (within
 * 1e-3), its rank and the top alternatives, reported before the first
 * token and exactly once, over a runner of 4 logit rows (chunks of at
 * most 4 tokens); a second identical request, whose prefix is cached,
 * still computes and reports them all (no cached tokens); the tokens
 * are those of a request without them; requests beside it in the batch
 * are unchanged. */
static void test_prompt_logprobs_engine(void **state)
{
    rig_opts_t o;
    rig_opts(&o, g_tiny);
    o.max_seqs = 4, o.ep.max_num_seqs = 4;
    rig_t g;
    rig_open(&g, &o);
    int32_t p[PLP_N], V = g.vocab;
    make_prompt(p, PLP_N, V, 4242);
    /* the reference */
    float *ref = fy_malloc((size_t)PLP_N * (size_t)V * sizeof(float));
    assert_non_null(ref);
    fy_block_table_t bt;
    assert_int_equal(fy_kvm_seq_init(g.kvm, &bt, PLP_N, NULL), FY_OK);
    for (int32_t j = 0; j < PLP_N; j++) {
        assert_int_equal(fy_kvm_seq_reserve(g.kvm, &bt, j + 1, NULL), FY_OK);
        fy_forward_seq_t f = {&bt, p + j, 1, j, 1, NULL};
        assert_int_equal(fy_runner_forward(g.r, &f, 1, ref + (size_t)j * (size_t)V), FY_OK);
        fy_kvm_seq_commit(g.kvm, &bt, p, j + 1, NULL);
    }
    fy_kvm_seq_release(g.kvm, &bt);
    fy_kvm_seq_deinit(&bt);
    fy_genspec_t rp;
    fy_genspec_default(&rp);
    rp.max_tokens = 6;
    rp.ignore_eos = true;
    static top_rec_t plain;
    run_one(&g, p, PLP_N, &rp, &plain); /* and its blocks are in the prefix cache now */
    assert_true(plain.r.n_cached > 0);
    fy_genspec_t q = rp;
    q.prompt_logprobs = true, q.prompt_top = PLP_K;
    static plp_rec_t a, b;
    for (int run = 0; run < 2; run++) {
        plp_rec_t *t = run ? &b : &a;
        run_plp(&g, p, PLP_N, &q, t);
        assert_int_equal(t->t.r.n_cached, 0); /* the prefix cache gave it nothing */
        assert_int_equal(t->after_token, 0);
        assert_true(t->events >= (PLP_N - 1 + 3) / 4); /* chunks of at most 4 rows */
        assert_memory_equal(t->t.r.tokens, plain.r.tokens, sizeof(int32_t) * 6);
        assert_int_equal(t->seen[0], 0);
        for (int32_t j = 1; j < PLP_N; j++) {
            assert_int_equal(t->seen[j], 1);
            const float *row = ref + (size_t)(j - 1) * (size_t)V;
            double mx = row[0], sum = 0;
            for (int32_t v = 1; v < V; v++) mx = row[v] > mx ? row[v] : mx;
            for (int32_t v = 0; v < V; v++) sum += exp((double)row[v] - mx);
            double lse = mx + log(sum), want = (double)row[p[j]] - lse;
            int32_t rank = 1, best = 0;
            for (int32_t v = 0; v < V; v++) {
                rank += row[v] > row[p[j]];
                if (row[v] > row[best]) best = v;
            }
            if (fabs(t->lp[j] - want) > 1e-3)
                fail_msg("prompt token %d: logprob %g, the reference %g", j, (double)t->lp[j], want);
            assert_int_equal(t->rank[j], rank);
            assert_int_equal(t->top[j][0], best);
            assert_true(fabs(t->top_lp[j][0] - ((double)row[best] - lse)) < 1e-3);
            for (int32_t k = 1; k < PLP_K; k++) assert_true(t->top_lp[j][k] <= t->top_lp[j][k - 1]);
        }
    }
    assert_memory_equal(a.lp, b.lp, sizeof(a.lp));
    assert_memory_equal(a.top, b.top, sizeof(a.top));
    /* beside others: three at once, the middle one with prompt logprobs */
    static plp_rec_t m[3];
    uint64_t id;
    for (int i = 0; i < 3; i++) {
        memset(&m[i], 0, sizeof(m[i]));
        assert_int_equal(fy_engine_submit(g.e, p, PLP_N, i == 1 ? &q : &rp, NULL, on_plp, &m[i], &id), FY_OK);
    }
    rig_drain(&g);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(m[i].t.r.kind, FY_EVENT_FINISH);
        assert_memory_equal(m[i].t.r.tokens, plain.r.tokens, sizeof(int32_t) * 6);
        assert_int_equal(m[i].events > 0, i == 1);
    }
    for (int32_t j = 1; j < PLP_N; j++) assert_true(fabsf(m[1].lp[j] - a.lp[j]) < 1e-5f);
    /* out of range: refused */
    q.prompt_top = FY_LOGITS_MAX_TOP + 1;
    fy_test_log_begin();
    assert_int_equal(fy_engine_submit(g.e, p, PLP_N, &q, NULL, on_plp, &a, &id), FY_ERR_INVALID);
    fy_test_log_end();
    fy_free(ref);
    rig_close(&g);
}

/* Bad words (vLLM's rule) on the tiny model, greedy: a one-token word
 * never comes out; a two-token word taken from the greedy output stops
 * that pair from forming (the output follows the greedy one up to it and
 * then differs); the pair's first token alone is still allowed. */
static void test_bad_words_engine(void **state)
{
    rig_opts_t o;
    rig_opts(&o, g_tiny);
    o.caching = false;
    rig_t g;
    rig_open(&g, &o);
    int32_t p[16];
    make_prompt(p, 16, g.vocab, 515);
    fy_genspec_t rp;
    fy_genspec_default(&rp);
    rp.max_tokens = 30;
    rp.ignore_eos = true;
    static top_rec_t base, t;
    run_one(&g, p, 16, &rp, &base);
    /* a pair from the output whose first token came out before it alone */
    int32_t at = 3;
    int32_t lens[2] = {2, 1}, ids[3] = {base.r.tokens[at], base.r.tokens[at + 1], base.r.tokens[0]};
    fy_genspec_t q = rp;
    memcpy(q.bad_lens, lens, sizeof(lens)), memcpy(q.bad_ids, ids, sizeof(ids));
    q.n_bad = 1;
    run_one(&g, p, 16, &q, &t);
    assert_memory_equal(t.r.tokens, base.r.tokens, sizeof(int32_t) * (size_t)(at + 1));
    assert_int_not_equal(t.r.tokens[at + 1], base.r.tokens[at + 1]);
    for (int32_t i = 1; i < t.r.n; i++) assert_false(t.r.tokens[i - 1] == ids[0] && t.r.tokens[i] == ids[1]);
    /* and a one-token word: the greedy first token, never */
    q.n_bad = 2;
    run_one(&g, p, 16, &q, &t);
    for (int32_t i = 0; i < t.r.n; i++) assert_int_not_equal(t.r.tokens[i], base.r.tokens[0]);
    /* a token outside the vocabulary: refused by name */
    int32_t far = g.vocab, one = 1;
    q.bad_lens[0] = one, q.bad_ids[0] = far, q.n_bad = 1;
    uint64_t id;
    fy_test_log_begin();
    assert_int_equal(fy_engine_submit(g.e, p, 16, &q, NULL, on_top, &t, &id), FY_ERR_INVALID);
    assert_true(fy_test_log_has("bad_words names token", NULL));
    fy_test_log_end();
    rig_close(&g);
}

/* ---- structured outputs (grammar.h) ---- */

/* One greedy request under a structured output on the tiny model: its
 * text and how it finished.  spec: n-gram speculation on. */
static void run_grammar(bool spec, fy_gen_grammar_t kind, const char *src, top_rec_t *t)
{
    rig_opts_t o;
    rig_opts(&o, g_tiny);
    o.caching = false;
    if (spec) o.ep.spec.method = FY_SPEC_NGRAM, o.ep.spec.min_accept = 0;
    rig_t g;
    rig_open(&g, &o);
    int32_t p[16];
    make_prompt(p, 16, g.vocab, 808);
    fy_genspec_t rp;
    fy_genspec_default(&rp);
    rp.max_tokens = 400;
    rp.grammar_kind = kind, rp.grammar_len = (int32_t)strlen(src);
    memcpy(rp.grammar, src, strlen(src) + 1);
    run_one(&g, p, 16, &rp, t);
    t->r.text[t->r.len] = 0;
    rig_close(&g);
}

/* The tiny model's greedy text, whatever it would say, comes out as what
 * the grammar allows and ends with EOS once the grammar is complete: a
 * bounded JSON Schema (jansson parses it and the values are the schema's),
 * a choice, a regular expression; speculation (n-gram proposals checked
 * against the grammar) gives the same tokens; a schema keyword the
 * engine does not handle is refused by name. */
static void test_structured_outputs(void **state)
{
    static top_rec_t a, b;
    const char *schema =
        "{\"type\":\"object\",\"properties\":{\"name\":{\"enum\":[\"ann\",\"bo\",\"cy\"]},"
        "\"ok\":{\"type\":\"boolean\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"x\",\"y\"]},"
        "\"maxItems\":3}},\"required\":[\"name\",\"ok\",\"tags\"],\"additionalProperties\":false}";
    run_grammar(false, FY_GEN_GRAMMAR_JSON_SCHEMA, schema, &a);
    fprintf(stderr, "json_schema: %s (%d tokens)\n", a.r.text, a.r.n);
    assert_int_equal(a.r.reason, FY_FINISH_EOS);
    json_error_t err;
    json_t *j = json_loads(a.r.text, 0, &err);
    if (!j) fail_msg("not JSON: %s (%s)", a.r.text, err.text);
    const char *name = json_string_value(json_object_get(j, "name"));
    assert_true(name && (!strcmp(name, "ann") || !strcmp(name, "bo") || !strcmp(name, "cy")));
    assert_true(json_is_boolean(json_object_get(j, "ok")));
    json_t *tags = json_object_get(j, "tags");
    assert_true(json_is_array(tags) && json_array_size(tags) <= 3);
    assert_int_equal(json_object_size(j), 3);
    json_decref(j);
    run_grammar(true, FY_GEN_GRAMMAR_JSON_SCHEMA, schema, &b);
    assert_string_equal(b.r.text, a.r.text);
    assert_int_equal(b.r.n, a.r.n);
    run_grammar(false, FY_GEN_GRAMMAR_CHOICE, "[\"yes\",\"no\",\"maybe so\"]", &a);
    fprintf(stderr, "choice: %s\n", a.r.text);
    assert_true(!strcmp(a.r.text, "yes") || !strcmp(a.r.text, "no") || !strcmp(a.r.text, "maybe so"));
    assert_int_equal(a.r.reason, FY_FINISH_EOS);
    run_grammar(false, FY_GEN_GRAMMAR_REGEX, "[0-9]{3}-[a-z]{2}", &a);
    fprintf(stderr, "regex: %s\n", a.r.text);
    assert_int_equal(a.r.len, 6);
    for (int i = 0; i < 6; i++)
        assert_true(i < 3    ? (a.r.text[i] >= '0' && a.r.text[i] <= '9')
                    : i == 3 ? a.r.text[i] == '-'
                             : (a.r.text[i] >= 'a' && a.r.text[i] <= 'z'));
    /* refused by name */
    rig_opts_t o;
    rig_opts(&o, g_tiny);
    rig_t g;
    rig_open(&g, &o);
    int32_t p[4] = {5, 6, 7, 8};
    fy_genspec_t rp;
    fy_genspec_default(&rp);
    const char *bad = "{\"type\":\"object\",\"patternProperties\":{\"^x\":{\"type\":\"string\"}}}";
    rp.grammar_kind = FY_GEN_GRAMMAR_JSON_SCHEMA, rp.grammar_len = (int32_t)strlen(bad);
    memcpy(rp.grammar, bad, strlen(bad) + 1);
    uint64_t id;
    fy_test_log_begin();
    assert_int_equal(fy_engine_submit(g.e, p, 4, &rp, NULL, on_top, &a, &id), FY_ERR_INVALID);
    assert_true(fy_test_log_has("patternProperties", NULL));
    assert_non_null(strstr(fy_engine_refusal(), "patternProperties")); /* what a worker answers with */
    /* a regex of 5,000 alternatives: beyond what the matcher starts on,
     * refused with the limit named (issue 32, item 11; the workers said
     * the prompt was too long) */
    char *alts = rp.grammar;
    size_t n = 0;
    for (int i = 0; i < 5000; i++) n += (size_t)snprintf(alts + n, 32768 - n, "%s%d", i ? "|" : "", i);
    rp.grammar_kind = FY_GEN_GRAMMAR_REGEX, rp.grammar_len = (int32_t)n;
    assert_int_equal(fy_engine_submit(g.e, p, 4, &rp, NULL, on_top, &a, &id), FY_ERR_INVALID);
    print_message("5000 alternatives: %s\n", fy_engine_refusal());
    assert_non_null(strstr(fy_engine_refusal(), "matcher's limits"));
    fy_test_log_end();
    rig_close(&g);
}

static void test_cancel_and_errors(void **state)
{
    rig_opts_t o;
    rig_opts(&o, g_tiny);
    o.caching = false; /* then "as before" means every block free */
    rig_t g;
    rig_open(&g, &o);
    int32_t p[100];
    make_prompt(p, 100, g.vocab, 3);
    fy_genspec_t rp;
    fy_genspec_default(&rp);
    rp.max_tokens = 200;
    rp.ignore_eos = true;
    result_t a = {0}, b = {0}, c = {0};
    uint64_t ida, idb, idc;
    assert_int_equal(fy_engine_submit(g.e, p, 100, &rp, NULL, on_event, &a, &ida), FY_OK);
    assert_int_equal(fy_engine_submit(g.e, p, 50, &rp, NULL, on_event, &b, &idb), FY_OK);
    for (int i = 0; i < 5; i++) assert_int_equal(fy_engine_step(g.e), FY_OK);
    assert_true(a.n > 0);
    fy_engine_cancel(g.e, ida); /* mid-stream */
    assert_int_equal(fy_engine_submit(g.e, p, 30, &rp, NULL, on_event, &c, &idc), FY_OK);
    fy_engine_cancel(g.e, idc);    /* still queued */
    fy_engine_cancel(g.e, 999999); /* unknown: ignored */
    assert_int_equal(fy_engine_step(g.e), FY_OK);
    assert_int_equal(a.terminal, 1);
    assert_int_equal(a.kind, FY_EVENT_ERROR);
    assert_int_equal(a.status, FY_ERR_CANCELLED);
    assert_int_equal(c.terminal, 1);
    assert_int_equal(c.status, FY_ERR_CANCELLED);
    fy_engine_cancel(g.e, idb);
    assert_int_equal(fy_engine_step(g.e), FY_OK);
    assert_int_equal(b.terminal, 1);
    fy_kvm_stats_t ks;
    fy_kvm_stats(g.kvm, &ks);
    assert_int_equal(ks.tier[FY_KV_DEVICE].free, ks.tier[FY_KV_DEVICE].total); /* exactly as before */
    assert_int_equal(ks.promised, 0);
    /* bad requests are refused at once and produce no event */
    result_t d = {0};
    uint64_t id;
    fy_test_log_begin();
    int32_t bad[2] = {5, g.vocab};
    assert_int_equal(fy_engine_submit(g.e, bad, 2, &rp, NULL, on_event, &d, &id), FY_ERR_INVALID);
    assert_true(fy_test_log_has("outside the vocabulary", NULL));
    int32_t *huge = calloc(2000, sizeof(int32_t));
    assert_int_equal(fy_engine_submit(g.e, huge, 2000, &rp, NULL, on_event, &d, &id), FY_ERR_INVALID);
    assert_true(fy_test_log_has("leaves no room in the context", NULL));
    free(huge);
    fy_genspec_t bad_rp = rp;
    bad_rp.max_tokens = 0;
    assert_int_equal(fy_engine_submit(g.e, p, 10, &bad_rp, NULL, on_event, &d, &id), FY_ERR_INVALID);
    bad_rp = rp;
    bad_rp.sampling.top_p = 7;
    assert_int_equal(fy_engine_submit(g.e, p, 10, &bad_rp, NULL, on_event, &d, &id), FY_ERR_INVALID);
    assert_int_equal(fy_engine_submit(g.e, p, 0, &rp, NULL, on_event, &d, &id), FY_ERR_INVALID);
    fy_test_log_end();
    assert_int_equal(d.terminal, 0);
    rig_close(&g);
    /* a request larger than the whole cache is refused, not queued forever */
    o.blocks = 4;
    rig_open(&g, &o);
    fy_test_log_begin();
    assert_int_equal(fy_engine_submit(g.e, p, 100, &rp, NULL, on_event, &d, &id), FY_ERR_INVALID);
    assert_true(fy_test_log_has("kv blocks; the cache has 4", NULL));
    fy_test_log_end();
    rig_close(&g);
}

/* A burst far beyond capacity: every request completes or is refused as
 * overloaded at once; none is lost or hangs; nothing leaks. */
static void test_overload(void **state)
{
    rig_opts_t o;
    rig_opts(&o, g_tiny);
    o.blocks = 64;
    o.ep.max_num_seqs = 4;
    o.ep.max_waiting = 12;
    rig_t g;
    rig_open(&g, &o);
    enum { BURST = 200 };
    result_t *res = calloc(BURST, sizeof(result_t));
    fy_status_t *st = calloc(BURST, sizeof(fy_status_t));
    int32_t p[40];
    make_prompt(p, 40, g.vocab, 9);
    fy_genspec_t rp;
    fy_genspec_default(&rp);
    rp.max_tokens = 16;
    rp.ignore_eos = true;
    int accepted = 0, refused = 0;
    fy_log_level_t lvl = fy_log_get_level();
    fy_log_set_level(FY_LOG_ERROR); /* 190 overload warnings are expected */
    for (int i = 0; i < BURST; i++) {
        uint64_t id;
        st[i] = fy_engine_submit(g.e, p, 10 + i % 30, &rp, NULL, on_event, &res[i], &id);
        if (st[i] == FY_OK)
            accepted++;
        else
            refused++, assert_int_equal(st[i], FY_ERR_OVERLOADED);
        if (i % 10 == 9) assert_int_equal(fy_engine_step(g.e), FY_OK); /* the engine keeps working meanwhile */
    }
    fy_log_set_level(lvl);
    rig_drain(&g);
    for (int i = 0; i < BURST; i++) {
        if (st[i] != FY_OK) {
            assert_int_equal(res[i].terminal, 0);
            continue;
        }
        assert_int_equal(res[i].terminal, 1);
        assert_int_equal(res[i].kind, FY_EVENT_FINISH);
        assert_int_equal(res[i].n, 16);
    }
    fy_engine_stats_t es;
    fy_engine_stats(g.e, &es);
    assert_int_equal(es.refused_overloaded, (uint64_t)refused);
    assert_int_equal(es.finished, (uint64_t)accepted);
    assert_true(refused > 100 && accepted >= 12);
    rig_close(&g);
    free(res), free(st);
}

static void test_priority_and_timings(void **state)
{
    rig_opts_t o;
    rig_opts(&o, g_tiny);
    o.ep.max_num_seqs = 1; /* one at a time: the queue order shows */
    rig_t g;
    rig_open(&g, &o);
    int32_t p[20];
    make_prompt(p, 20, g.vocab, 11);
    fy_genspec_t rp;
    fy_genspec_default(&rp);
    rp.max_tokens = 10;
    rp.ignore_eos = true;
    result_t low = {0}, high = {0}, first = {0};
    uint64_t id;
    assert_int_equal(fy_engine_submit(g.e, p, 20, &rp, NULL, on_event, &first, &id), FY_OK);
    assert_int_equal(fy_engine_submit(g.e, p, 20, &rp, NULL, on_event, &low, &id), FY_OK);
    rp.priority = 5;
    assert_int_equal(fy_engine_submit(g.e, p, 20, &rp, NULL, on_event, &high, &id), FY_OK);
    rig_drain(&g);
    assert_true(high.e2e < low.e2e); /* queued later, served earlier */
    assert_int_equal(first.n_itl, 9);
    assert_true(first.ttft > 0 && first.e2e >= first.ttft && first.queue >= 0);
    assert_true(high.queue < low.queue);
    rig_close(&g);
}

static void test_guardrail(void **state)
{
    rig_opts_t o;
    rig_opts(&o, g_tiny);
    o.ep.itl_target_s = 1e-7; /* unattainable: the budget must fall to its floor */
    o.ep.itl_window = 16;
    o.ep.min_prefill_budget = 16;
    rig_t g;
    rig_open(&g, &o);
    int32_t p[300];
    make_prompt(p, 300, g.vocab, 13);
    fy_genspec_t rp;
    fy_genspec_default(&rp);
    rp.max_tokens = 60;
    rp.ignore_eos = true;
    result_t res[6] = {0};
    uint64_t id;
    for (int i = 0; i < 6; i++)
        assert_int_equal(fy_engine_submit(g.e, p + i, 250, &rp, NULL, on_event, &res[i], &id), FY_OK);
    rig_drain(&g);
    fy_engine_stats_t st;
    fy_engine_stats(g.e, &st);
    assert_int_equal(st.prefill_budget, 16);
    assert_true(st.itl_p95_s > 0);
    for (int i = 0; i < 6; i++) assert_int_equal(res[i].n, 60);
    rig_close(&g);
}

/* The engine on its own thread, fed from this one. */
static void test_engine_thread(void **state)
{
    rig_opts_t o;
    rig_opts(&o, g_tiny);
    rig_t g;
    rig_open(&g, &o);
    assert_int_equal(fy_engine_start(g.e), FY_OK);
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    enum { N = 8 };
    result_t res[N];
    memset(res, 0, sizeof(res));
    int32_t p[64];
    make_prompt(p, 64, g.vocab, 17);
    fy_genspec_t rp;
    fy_genspec_default(&rp);
    rp.max_tokens = 20;
    rp.ignore_eos = true;
    for (int i = 0; i < N; i++) {
        res[i].mu = &mu, res[i].cv = &cv;
        uint64_t id;
        assert_int_equal(fy_engine_submit(g.e, p, 20 + i, &rp, NULL, on_event, &res[i], &id), FY_OK);
    }
    pthread_mutex_lock(&mu);
    for (int i = 0; i < N; i++) {
        struct timespec ts;
        fy_deadline_in(CLOCK_REALTIME, 60, &ts); /* a deadline, so a hang fails */
        while (!res[i].terminal) assert_int_equal(pthread_cond_timedwait(&cv, &mu, &ts), 0);
    }
    pthread_mutex_unlock(&mu);
    fy_engine_stop(g.e);
    for (int i = 0; i < N; i++) assert_int_equal(res[i].n, 20);
    /* requests still in the engine when it is destroyed end with an error */
    result_t late = {0};
    uint64_t id;
    assert_int_equal(fy_engine_submit(g.e, p, 20, &rp, NULL, on_event, &late, &id), FY_OK);
    rig_close(&g);
    assert_int_equal(late.terminal, 1);
    assert_int_equal(late.status, FY_ERR_CANCELLED);
}

/* fy_engine_submit must not touch the request after handing it over: the
 * engine thread may finish and free it at once.  Both threads share one
 * CPU and the submitter runs at idle priority, so the engine thread
 * preempts it the moment the submit unlocks; each request takes one
 * step.  Under ASan a read of the freed request fails this test (it did,
 * every run, before the fix). */
static void test_submit_handoff(void **state)
{
    rig_opts_t o;
    rig_opts(&o, g_tiny);
    rig_t g;
    rig_open(&g, &o);
    cpu_set_t old_set, one;
    assert_int_equal(sched_getaffinity(0, sizeof(old_set), &old_set), 0);
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu() >= 0 ? sched_getcpu() : 0, &one);
    assert_int_equal(pthread_setaffinity_np(pthread_self(), sizeof(one), &one), 0);
    assert_int_equal(fy_engine_start(g.e), FY_OK); /* its thread inherits the one CPU */
    int old_policy;
    struct sched_param old_param, idle = {0};
    assert_int_equal(pthread_getschedparam(pthread_self(), &old_policy, &old_param), 0);
    assert_int_equal(pthread_setschedparam(pthread_self(), SCHED_IDLE, &idle), 0);
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    int32_t p[8];
    make_prompt(p, 8, g.vocab, 5);
    fy_genspec_t rp;
    fy_genspec_default(&rp);
    rp.max_tokens = 1;
    rp.ignore_eos = true;
    for (int i = 0; i < 200; i++) {
        result_t *res = fy_calloc(1, sizeof(*res));
        assert_non_null(res);
        res->mu = &mu, res->cv = &cv;
        uint64_t id = 0;
        assert_int_equal(fy_engine_submit(g.e, p, 4 + i % 4, &rp, NULL, on_event, res, &id), FY_OK);
        struct timespec ts;
        fy_deadline_in(CLOCK_REALTIME, 60, &ts);
        pthread_mutex_lock(&mu);
        while (!res->terminal) assert_int_equal(pthread_cond_timedwait(&cv, &mu, &ts), 0);
        pthread_mutex_unlock(&mu);
        assert_int_equal(res->kind, FY_EVENT_FINISH);
        assert_int_equal(res->n, 1);
        assert_true(id > 0);
        fy_free(res);
    }
    assert_int_equal(pthread_setschedparam(pthread_self(), old_policy, &old_param), 0);
    assert_int_equal(pthread_setaffinity_np(pthread_self(), sizeof(old_set), &old_set), 0);
    fy_engine_stop(g.e);
    rig_close(&g);
}

/* ---- prefill in one engine, decode in another (the disaggregated path
 * without the sockets): progress events, the first token and its
 * generator, copying the prompt's blocks, adoption ---- */

typedef struct handoff {
    fy_kvm_t *kvm;
    fy_block_table_t hold; /* the prefill side keeps the prompt's blocks */
    bool held;
    int32_t first;
    float logprob;
    fy_rng_t rng;
    int progress, terminal;
    int32_t last_computed;
} handoff_t;

static void on_prefill(void *arg, const fy_event_t *ev)
{
    handoff_t *h = arg;
    if (ev->kind == FY_EVENT_PROGRESS) {
        assert_true(ev->n_computed > h->last_computed);
        h->last_computed = ev->n_computed;
        h->progress++;
        fy_kvm_seq_release(h->kvm, &h->hold);
        assert_int_equal(fy_kvm_seq_fork(h->kvm, ev->bt, &h->hold), FY_OK);
        h->held = true;
    } else if (ev->kind == FY_EVENT_TOKEN) {
        h->first = ev->token;
        h->logprob = ev->logprob;
        h->rng = *ev->rng;
    } else {
        assert_int_equal(ev->kind, FY_EVENT_FINISH);
        h->terminal++;
    }
}

typedef struct adopt_job {
    const int32_t *prompt;
    int32_t n;
    const fy_genspec_t *rp;
    fy_block_table_t *bt;
    fy_kv_resv_t *resv;
    handoff_t *h;
    result_t *res;
    fy_status_t st;
} adopt_job_t;

static void do_adopt(fy_engine_t *e, void *arg)
{
    adopt_job_t *a = arg;
    uint64_t id;
    a->st = fy_engine_adopt(e, a->prompt, a->n, a->rp, NULL, a->bt, a->resv, a->h->first, a->h->logprob, &a->h->rng,
                            on_event, a->res, &id);
}

static void disaggregated(const char *model)
{
    workload_t *w = calloc(1, sizeof(*w));
    rig_t P, D;
    rig_opts_t o;
    rig_opts(&o, model);
    o.ep.max_num_batched_tokens = 64; /* several chunks per prompt */
    rig_open(&P, &o);
    make_workload(w, P.vocab, true, true);
    result_t *alone = calloc(N_REQ, sizeof(result_t)), *dis = calloc(N_REQ, sizeof(result_t));
    run_alone(model, w, alone);
    rig_opts_t od;
    rig_opts(&od, model);
    rig_open(&D, &od);
    const fy_kv_layout_t *lay = fy_kvm_layout(P.kvm);
    char *pa = fy_runner_kv_arena(P.r), *da = fy_runner_kv_arena(D.r);
    for (int i = 0; i < N_REQ; i++) {
        /* prefill: the first token only, as a prefill worker runs it */
        handoff_t h = {.kvm = P.kvm};
        const fy_request_ctx_t pr = {.progress = true, .first_only = true};
        assert_int_equal(fy_kvm_seq_init(P.kvm, &h.hold, w->len[i] + 1, &pr.ns), FY_OK);
        uint64_t id;
        assert_int_equal(fy_engine_submit(P.e, w->prompt[i], w->len[i], &w->rp[i], &pr, on_prefill, &h, &id), FY_OK);
        rig_drain(&P);
        assert_int_equal(h.terminal, 1);
        assert_int_equal(h.last_computed, w->len[i]);
        if (w->len[i] > 64) assert_true(h.progress >= 2); /* chunked: blocks could ship early */
        /* the decode side leases blocks, the prompt's K/V are copied in */
        fy_block_table_t bt;
        fy_kv_resv_t resv = {0};
        int32_t cap = w->len[i] + w->rp[i].max_tokens;
        assert_int_equal(fy_kvm_seq_init(D.kvm, &bt, cap, &pr.ns), FY_OK);
        assert_int_equal(fy_kvm_admit(D.kvm, fy_kvm_blocks_for(D.kvm, w->len[i], w->rp[i].max_tokens, 0), &resv),
                         FY_OK);
        assert_int_equal(fy_kvm_seq_reserve(D.kvm, &bt, w->len[i], &resv), FY_OK);
        assert_int_equal(bt.n_blocks, h.hold.n_blocks);
        for (int32_t b = 0; b < bt.n_blocks; b++)
            memcpy(da + (size_t)bt.blocks[b] * lay->block_bytes, pa + (size_t)h.hold.blocks[b] * lay->block_bytes,
                   lay->block_bytes);
        fy_kvm_seq_release(P.kvm, &h.hold);
        fy_kvm_seq_deinit(&h.hold);
        fy_kvm_seq_commit(D.kvm, &bt, w->prompt[i], w->len[i], NULL);
        adopt_job_t a = {w->prompt[i], w->len[i], &w->rp[i], &bt, &resv, &h, &dis[i], FY_ERR_INTERNAL};
        assert_int_equal(fy_engine_post(D.e, do_adopt, &a), FY_OK);
        assert_int_equal(fy_engine_step(D.e), FY_OK); /* runs the post, then a step */
        assert_int_equal(a.st, FY_OK);
        assert_int_equal(bt.n_blocks, 0); /* taken over */
        assert_int_equal(resv.blocks, 0);
        fy_kvm_seq_deinit(&bt);
    }
    rig_drain(&D);
    check_same(alone, dis);
    rig_close(&P);
    rig_close(&D);
    free(w), free(alone), free(dis);
}

static void test_disaggregated_tiny(void **state) { disaggregated(g_tiny); }

static void test_disaggregated_default(void **state)
{
    const char *m = fy_test_default_model();
    if (!m) skip();
    disaggregated(m);
}

/* A tick runs on the engine thread while it idles; posts run before a step. */
static int g_ticks;
static void on_tick(void *arg) { __atomic_add_fetch((int *)arg, 1, __ATOMIC_SEQ_CST); }
static void set_flag(fy_engine_t *e, void *arg) { *(int *)arg = 1; }

static void test_post_and_tick(void **state)
{
    rig_opts_t o;
    rig_opts(&o, g_tiny);
    o.ep.tick_fn = on_tick;
    o.ep.tick_arg = &g_ticks;
    o.ep.tick_s = 0.01;
    rig_t g;
    rig_open(&g, &o);
    int flag = 0;
    assert_int_equal(fy_engine_post(g.e, set_flag, &flag), FY_OK);
    assert_false(fy_engine_idle(g.e)); /* posted work counts */
    assert_int_equal(fy_engine_step(g.e), FY_OK);
    assert_int_equal(flag, 1);
    assert_int_equal(fy_engine_start(g.e), FY_OK);
    for (int i = 0; i < 500 && __atomic_load_n(&g_ticks, __ATOMIC_SEQ_CST) < 5; i++) usleep(10000);
    assert_true(__atomic_load_n(&g_ticks, __ATOMIC_SEQ_CST) >= 5);
    fy_engine_stop(g.e);
    /* work posted before destroy still runs */
    flag = 0;
    assert_int_equal(fy_engine_post(g.e, set_flag, &flag), FY_OK);
    rig_close(&g);
    assert_int_equal(flag, 1);
}

/* ---- an engine from a configuration (engine_config.h) ---------------------------------------- */

static fy_config_t *config_of(const char *const *sets)
{
    fy_config_t *c;
    assert_int_equal(fy_config_create(&c), FY_OK);
    for (int i = 0; sets[i]; i++) assert_int_equal(fy_config_set(c, sets[i]), FY_OK);
    return c;
}

static int64_t table_int(const char *section, const char *key)
{
    int64_t v;
    assert_int_equal(fy_conf_int(NULL, section, key, &v), FY_OK);
    return v;
}

static void test_build_from_config(void **state)
{
    /* nothing set: the key table's defaults, and the table's speculative
     * defaults are the engine's own */
    fy_config_t *c = config_of((const char *const[]){NULL});
    fy_engine_build_t b;
    assert_int_equal(fy_worker_build_read(c, "prefill", &b), FY_OK);
    assert_int_equal(b.runner.max_seqs, table_int("prefill", "max_seqs"));
    assert_int_equal(b.runner.max_logits, b.runner.max_seqs);
    assert_int_equal(b.runner.max_batch_tokens, table_int("prefill", "max_batch_tokens"));
    assert_int_equal(b.engine.max_waiting, table_int("prefill", "max_waiting"));
    assert_int_equal(b.runner.kv_mem, 256 << 20);
    assert_int_equal(b.runner.block_size, table_int("kv", "block_size"));
    assert_int_equal(b.runner.kv_dtype, FY_DTYPE_F16);
    assert_int_equal(b.engine.spec.method, FY_SPEC_NONE); /* prefill workers do not speculate */
    assert_true(b.prefix_caching);
    assert_null(b.draft);
    assert_int_equal(b.hash_key_len, 0); /* no kv.secret_file: a private hasher */
    assert_int_equal(fy_worker_build_read(c, "decode", &b), FY_OK);
    fy_spec_params_t sp;
    fy_spec_params_default(&sp);
    assert_int_equal(b.engine.spec.method, FY_SPEC_NGRAM);
    assert_int_equal(b.engine.spec.k_max, sp.k_max);
    assert_int_equal(b.engine.spec.ngram_max, sp.ngram_max);
    assert_true(b.engine.spec.min_accept == sp.min_accept);
    assert_int_equal(b.engine.spec.warmup, sp.warmup);
    assert_int_equal(b.engine.spec.probe_steps, sp.probe_steps);
    assert_int_equal(b.engine.spec.batch_tokens, sp.batch_tokens);
    assert_int_equal(b.engine.spec.sampled, sp.sampled);
    assert_int_equal(table_int("decode", "spec_k"), sp.k_max);
    assert_true(fy_conf_key("decode", "spec_k")->hi == FY_SPEC_MAX_K); /* the table's ranges are the engine's */
    assert_true(fy_conf_key("decode", "spec_ngram_max")->hi == FY_SPEC_MAX_NGRAM);
    /* logit rows for verifications: max_seqs + spec_batch_tokens, at most a batch */
    assert_int_equal(b.runner.max_logits, b.runner.max_seqs + sp.batch_tokens);
    assert_int_equal(b.engine.preempt, FY_PREEMPT_RECOMPUTE);
    fy_config_destroy(c);

    /* every setting lands where it belongs, and the stack runs a request */
    c = config_of((const char *const[]){"decode.max_seqs=4", "decode.max_batch_tokens=2", "decode.kv_mem=8MiB",
                                        "decode.host_kv_mem=1MiB", "kv.block_size=8", "kv.dtype=f32",
                                        "kv.prefix_cache=false", "decode.spec=none", "decode.preempt=swap",
                                        "decode.itl_target=50ms", "decode.max_waiting=7", "decode.ctx=512",
                                        "decode.threads=2", "worker.device=cpu", NULL});
    assert_int_equal(fy_worker_build_read(c, "decode", &b), FY_OK);
    assert_int_equal(b.runner.max_batch_tokens, 4); /* raised to max_seqs */
    assert_int_equal(b.runner.max_logits, 4);
    assert_int_equal(b.runner.kv_mem, 8 << 20);
    assert_int_equal(b.host_kv_mem, 1 << 20);
    assert_int_equal(b.runner.block_size, 8);
    assert_int_equal(b.runner.kv_dtype, FY_DTYPE_F32);
    assert_int_equal(b.runner.max_ctx, 512);
    assert_false(b.prefix_caching);
    assert_int_equal(b.engine.spec.method, FY_SPEC_NONE);
    assert_int_equal(b.engine.preempt, FY_PREEMPT_SWAP);
    assert_true(b.engine.itl_target_s > 0.0499 && b.engine.itl_target_s < 0.0501);
    assert_int_equal(b.engine.max_waiting, 7);
    assert_int_equal(b.threads, 2);
    assert_string_equal(b.device, "cpu");
    fy_model_t *m;
    assert_int_equal(fy_model_load(g_tiny, &m), FY_OK);
    fy_engine_stack_t s;
    fy_log_set_level(FY_LOG_ERROR); /* no kv.secret_file: a warning, and a private hasher */
    assert_int_equal(fy_engine_stack_create(m, &b, &s), FY_OK);
    fy_log_set_level(FY_LOG_INFO);
    assert_non_null(s.be);
    assert_non_null(s.hasher);
    assert_null(s.draft);
    assert_non_null(s.engine);
    const fy_kv_layout_t *lay = fy_kvm_layout(s.kvm);
    assert_int_equal(lay->block_size, 8);
    assert_int_equal(lay->dtype, FY_DTYPE_F32);
    assert_int_equal(fy_runner_params(s.runner)->n_host_blocks, (int32_t)((1 << 20) / (int64_t)lay->block_bytes));
    assert_int_equal(fy_runner_params(s.runner)->max_seqs, 4);
    int32_t prompt[5] = {72, 101, 108, 108, 111};
    fy_genspec_t q;
    fy_genspec_default(&q);
    q.max_tokens = 4;
    q.ignore_eos = true;
    result_t r = {0};
    uint64_t id;
    assert_int_equal(fy_engine_submit(s.engine, prompt, 5, &q, NULL, on_event, &r, &id), FY_OK);
    for (int i = 0; i < 1000 && !fy_engine_idle(s.engine); i++) assert_int_equal(fy_engine_step(s.engine), FY_OK);
    assert_int_equal(r.terminal, 1);
    assert_int_equal(r.n, 4);
    fy_engine_stack_destroy(&s);
    assert_null(s.engine);
    assert_null(s.be);
    fy_config_destroy(c);

    /* a draft takes its share of kv_mem; the stack opens it and wires it in */
    c = config_of(
        (const char *const[]){"decode.spec=self:1", "decode.kv_mem=8MiB", "decode.spec_draft_kv_fraction=0.25", NULL});
    assert_int_equal(fy_worker_build_read(c, "decode", &b), FY_OK);
    assert_string_equal(b.draft, "self:1");
    assert_int_equal(b.engine.spec.method, FY_SPEC_DRAFT);
    assert_int_equal(b.runner.kv_mem, 6 << 20);
    assert_int_equal(b.draft_kv_mem, 2 << 20);
    b.hash_key_len = 0; /* a private hasher */
    assert_int_equal(fy_engine_stack_create(m, &b, &s), FY_OK);
    assert_non_null(s.draft);
    assert_non_null(s.engine);
    fy_engine_stack_destroy(&s);
    fy_config_destroy(c);

    /* bad values are named, and nothing is built */
    static const struct {
        const char *set, *msg;
    } bad[] = {
        {"decode.spec=bogus", "decode.spec = 'bogus': expected none, ngram, draft:MODEL_FILE or self:LAYERS"},
        {"decode.preempt=later", "expected recompute or swap"},
        {"worker.device=gpu", "expected cpu or cuda"},
        {"decode.max_seqs=0", "an integer in [1, 1024]"},
        {"kv.block_size=12", "expected 8, 16 or 32"},
        {"kv.dtype=bf16", "expected f16, f32, fp8 or int8"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        c = config_of((const char *const[]){bad[i].set, NULL});
        fy_engine_build_t keep = {.threads = -7};
        fy_test_log_begin();
        assert_int_equal(fy_worker_build_read(c, "decode", &keep), FY_ERR_INVALID);
        fy_test_log_end();
        if (!fy_test_log_has(bad[i].msg, NULL))
            fail_msg("%s: no '%s' in:\n%s", bad[i].set, bad[i].msg, fy_test_log_text());
        assert_int_equal(keep.threads, -7); /* untouched */
        fy_config_destroy(c);
    }

    /* a stack that fails part-way undoes what it made (ASan checks) */
    fy_engine_build_default(&b);
    /* a bounded arena: the default (0.9 of the memory left free) takes
     * most of this machine's RAM for a moment, and under ASan with other
     * work running the kernel killed the test for it */
    b.runner.kv_mem = 4 << 20;
    b.draft = "self:9"; /* more layers than the target has */
    fy_engine_stack_t untouched = {.engine = (fy_engine_t *)&untouched};
    fy_test_log_begin();
    assert_int_not_equal(fy_engine_stack_create(m, &b, &untouched), FY_OK);
    fy_test_log_end();
    assert_ptr_equal(untouched.engine, (fy_engine_t *)&untouched);
    fy_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_invariance_tiny),
        cmocka_unit_test(test_batch_invariance_padded),
        cmocka_unit_test(test_batch_invariance_default),
        cmocka_unit_test(test_preempt_recompute),
        cmocka_unit_test(test_preempt_swap),
        cmocka_unit_test(test_disk_tier_corrupted),
        cmocka_unit_test(test_cancel_and_errors),
        cmocka_unit_test(test_overload),
        cmocka_unit_test(test_priority_and_timings),
        cmocka_unit_test(test_guardrail),
        cmocka_unit_test(test_engine_thread),
        cmocka_unit_test(test_submit_handoff),
        cmocka_unit_test(test_disaggregated_tiny),
        cmocka_unit_test(test_disaggregated_default),
        cmocka_unit_test(test_post_and_tick),
        cmocka_unit_test(test_build_from_config),
        cmocka_unit_test(test_evict_choose),
        cmocka_unit_test(test_kv_budget_streaming),
        cmocka_unit_test(test_kv_budget_preempt_swap),
        cmocka_unit_test(test_kv_budget_preempt_recompute),
        cmocka_unit_test(test_logits_processing_engine),
        cmocka_unit_test(test_prompt_logprobs_engine),
        cmocka_unit_test(test_bad_words_engine),
        cmocka_unit_test(test_structured_outputs),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

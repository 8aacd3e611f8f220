/*
 * test_gemma.c - the real Gemma 3 270M Q4_K_M file (`make model
 * MODEL=gemma3-270m`; $FERRY_GEMMA_MODEL): its description (18 layers, a
 * window of 512 on five of every six, local and global rope bases), its
 * tokenizer and chat prompt, ferry's logits against an independent numpy
 * forward pass (tests/gemma_ref.py, gguf-py's dequantizers) over a prompt
 * longer than the window, greedy output that reads as English and is the
 * same at any thread count, chunking or batch position, a chat answer, and
 * teacher-forced perplexity (BENCHMARKS.md).  Everything skips with a
 * message where the file is absent; the numpy comparison also where
 * $FERRY_PYTHON (make test's venv with gguf-py) is.
 *
 * The file is the pretrained model (google/gemma-3-270m), not the
 * instruction-tuned one: it completes text well, and answers a chat turn
 * after an example turn, but it never learned to end its turn.
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "engine/generate.h"
#include "kv/kv.h"
#include "common/mem.h"
#include "model/model.h"
#include "model/prompt.h"
#include "engine/runner.h"
#include "tests/testutil.h"

static fy_model_t *g_model;
static const char *g_path;
static fy_kv_hasher_t *g_hasher;

/* The same text test_model.c measures SmolLM2's KV formats with. */
static const char PPL_TEXT[] =
    "The river that runs past the old mill has changed its course three times in living memory. "
    "The first time was after the great flood, when the water cut a new channel through the "
    "meadow and left the mill wheel standing in a field of mud. The miller, a patient man, "
    "spent two summers digging a race to bring the water back, and for a while the wheel turned "
    "again. Then a dry decade came, the river shrank to a stream, and the village began to buy "
    "its flour from the town. Children who grew up in those years remember fishing for eels in "
    "the pools that were left, and the smell of the drying weed along the banks. The second "
    "change came with the railway. The engineers needed a straight line for the embankment, so "
    "they moved the river instead of the track, and the new bed they dug was lined with stone. "
    "It was a fine piece of work, and people came from miles around to see the water run "
    "between the walls. The third time nobody planned at all. A beaver family arrived one spring, "
    "built a dam below the bridge, and within a year the meadow was a marsh full of birds. The "
    "council argued for months about whether to remove the dam. In the end they left it, and "
    "now the marsh is the reason visitors come: herons stand in the shallows at dawn, and in "
    "the evening the air is loud with frogs. The mill is a museum. Its wheel no longer turns, "
    "but the guide will tell you, if you ask, that the river has not finished with the village yet.";

static int setup(void **state)
{
    g_path = getenv("FERRY_GEMMA_MODEL");
    if (!g_path) g_path = "models/gemma-3-270m-q4_k_m.gguf";
    if (access(g_path, R_OK) != 0) {
        fprintf(stderr, "note: %s not present (run 'make model MODEL=gemma3-270m'); skipping\n", g_path);
        g_model = NULL;
    } else if (fy_model_load(g_path, &g_model) != FY_OK) {
        return -1;
    }
    return fy_kv_hasher_create_random(&g_hasher) == FY_OK ? 0 : -1;
}

static int teardown(void **state)
{
    fy_model_destroy(g_model);
    fy_kv_hasher_destroy(g_hasher);
    fy_test_tmpdir_remove();
    return 0;
}

typedef struct engine {
    fy_backend_t *be;
    fy_runner_t *r;
    fy_kvm_t *kvm;
} engine_t;

static void engine_open(engine_t *e, int threads, int32_t batch, int32_t max_seqs, int32_t max_logits)
{
    fy_backend_params_t bp = {.n_threads = threads};
    assert_int_equal(fy_backend_create("cpu", &bp, &e->be), FY_OK);
    fy_runner_params_t rp;
    fy_runner_params_default(&rp);
    rp.max_batch_tokens = batch;
    rp.max_seqs = max_seqs;
    rp.max_logits = max_logits;
    rp.max_ctx = 1024;
    rp.n_kv_blocks = 3 * 1024 / 16;
    assert_int_equal(fy_runner_create(g_model, e->be, &rp, &e->r), FY_OK);
    fy_kvm_params_t kp;
    fy_runner_kvm_params(e->r, &kp);
    kp.hasher = g_hasher;
    kp.prefix_caching = false;
    assert_int_equal(fy_kvm_create(&kp, &e->kvm), FY_OK);
}

static void engine_close(engine_t *e)
{
    fy_kvm_stats_t ks;
    fy_kvm_stats(e->kvm, &ks);
    assert_int_equal(ks.tier[FY_KV_DEVICE].used, 0);
    fy_kvm_destroy(e->kvm);
    fy_runner_destroy(e->r);
    fy_backend_destroy(e->be);
}

static void tokenize(const char *text, int32_t *ids, size_t cap, size_t *n)
{
    assert_int_equal(fy_tokenizer_encode(fy_model_tokenizer(g_model), text, strlen(text), true, false, ids, cap, n),
                     FY_OK);
}

/* A prompt past the window: the text twice (about 640 tokens). */
static size_t long_prompt(int32_t *ids, size_t cap)
{
    char *text = malloc(2 * sizeof(PPL_TEXT) + 2);
    snprintf(text, 2 * sizeof(PPL_TEXT) + 2, "%s %s", PPL_TEXT, PPL_TEXT);
    size_t n;
    tokenize(text, ids, cap, &n);
    free(text);
    assert_true(n > 600 && n <= cap);
    return n;
}

/*
 * Runs ids through one sequence in prefill chunks of at most `chunk`,
 * asking logits for the positions in rows (ascending, n_rows of them) into
 * out [n_rows, vocab].  A forward's logits are its last rows, so a chunk
 * ends where a run of wanted rows does.
 */
static void run_rows(engine_t *e, const int32_t *ids, int32_t n, int32_t chunk, const int32_t *rows, int n_rows,
                     float *out)
{
    const int32_t vocab = fy_model_config(g_model)->vocab_size;
    fy_block_table_t bt;
    assert_int_equal(fy_kvm_seq_init(e->kvm, &bt, 1024, NULL), FY_OK);
    int got = 0;
    for (int32_t done = 0; done < n;) {
        int32_t k = n - done < chunk ? n - done : chunk, want = 0;
        if (got < n_rows && rows[got] < done + k) {
            int32_t last = got; /* the end of the run of consecutive rows from rows[got] */
            while (last + 1 < n_rows && rows[last + 1] == rows[last] + 1) last++;
            if (rows[last] + 1 - done < k) k = rows[last] + 1 - done;
            want = done + k - rows[got];
        }
        assert_int_equal(fy_kvm_seq_reserve(e->kvm, &bt, done + k, NULL), FY_OK);
        float dummy;
        fy_forward_seq_t f = {&bt, ids + done, k, done, want, NULL};
        assert_int_equal(fy_runner_forward(e->r, &f, 1, want ? out + (size_t)got * vocab : &dummy), FY_OK);
        got += want;
        done += k;
    }
    assert_int_equal(got, n_rows);
    fy_kvm_seq_release(e->kvm, &bt);
    fy_kvm_seq_deinit(&bt);
}

/* ---- the file ------------------------------------------------------------------------- */

static void test_description(void **state)
{
    if (!g_model) skip();
    const fy_model_config_t *c = fy_model_config(g_model);
    assert_string_equal(c->arch, "gemma3");
    assert_int_equal(c->arch_id, FY_ARCH_GEMMA3);
    assert_int_equal(c->n_layers, 18);
    assert_int_equal(c->dim, 640);
    assert_int_equal(c->n_heads, 4);
    assert_int_equal(c->n_kv_heads, 1);
    assert_int_equal(c->head_dim, 256);
    assert_int_equal(c->vocab_size, 262144);
    assert_true(c->tied_embeddings);
    assert_float_equal(c->embed_scale, sqrtf(640.0f), 0);
    assert_float_equal(c->attn_scale, 1.0f / 16, 0);
    for (int l = 0; l < 18; l++) {
        bool global = (l + 1) % 6 == 0;
        assert_int_equal(c->layer[l].window, global ? 0 : 512);
        assert_float_equal(c->layer[l].rope.theta, global ? 1e6f : 10000.0f, 0);
        assert_int_equal(c->layer[l].rope.style, FY_ROPE_NEOX);
    }
    char *report = NULL;
    assert_int_equal(fy_model_inspect(g_path, &report), FY_OK);
    assert_non_null(strstr(report, "ferry runs it: yes"));
    assert_non_null(strstr(report, "0-4      sliding window 512, rope base 10000 neox"));
    fy_free(report);
}

static void test_tokens_and_chat_prompt(void **state)
{
    if (!g_model) skip();
    const fy_tokenizer_t *tok = fy_model_tokenizer(g_model);
    int32_t ids[64];
    size_t n;
    tokenize("The capital of France is", ids, 64, &n);
    const int32_t want[] = {2, 818, 5279, 529, 7001, 563}; /* <bos> The ▁capital ▁of ▁France ▁is */
    assert_int_equal(n, FY_ARRAY_LEN(want));
    assert_memory_equal(ids, want, sizeof(want));
    int32_t sot = fy_tokenizer_find(tok, "<start_of_turn>"), eot = fy_tokenizer_find(tok, "<end_of_turn>");
    assert_int_equal(sot, 105);
    assert_int_equal(eot, 106);
    assert_true(fy_tokenizer_is_eog(tok, eot) && fy_tokenizer_is_eog(tok, sot) && fy_tokenizer_is_eog(tok, 1));
    /* one BOS, turn markers as single tokens, the model's turn opened */
    int32_t *p, np;
    assert_int_equal(fy_prompt_tokens(g_model, NULL, "hi", true, &p, &np), FY_OK);
    const int32_t chat[] = {2, 105, 2364, 107, 2202, 106, 107, 105, 4368, 107}; /* ... user \n hi ... model \n */
    assert_int_equal(np, FY_ARRAY_LEN(chat));
    assert_memory_equal(p, chat, sizeof(chat));
    fy_free(p);
}

/* ---- against an independent implementation --------------------------------------------- */

static void test_matches_numpy_reference(void **state)
{
    if (!g_model) skip();
    const char *py = getenv("FERRY_PYTHON");
    if (!py || access(py, X_OK) != 0 || access("tests/gemma_ref.py", R_OK) != 0) {
        fprintf(stderr, "note: no $FERRY_PYTHON with gguf-py (make pyenv) or no tests/gemma_ref.py; skipping\n");
        skip();
    }
    int32_t ids[1024];
    int32_t n = (int32_t)long_prompt(ids, 1024);
    /* the first rows, and the last 40: past the window of 512 */
    int32_t rows[56];
    int n_rows = 0;
    for (int i = 0; i < 16; i++) rows[n_rows++] = i;
    for (int i = n - 40; i < n; i++) rows[n_rows++] = i;
    const int32_t vocab = fy_model_config(g_model)->vocab_size;
    float *lg = malloc(sizeof(float) * (size_t)n_rows * vocab);
    engine_t e;
    engine_open(&e, 2, 64, 1, 64);
    run_rows(&e, ids, n, 64, rows, n_rows, lg);
    engine_close(&e);
    const char *dump = fy_test_path("gemma-logits.bin");
    FILE *f = fopen(dump, "wb");
    assert_non_null(f);
    int32_t m = n_rows;
    fwrite(&n, 4, 1, f), fwrite(ids, 4, (size_t)n, f), fwrite(&m, 4, 1, f), fwrite(rows, 4, (size_t)m, f);
    fwrite(lg, 4, (size_t)m * vocab, f);
    assert_int_equal(fclose(f), 0);
    free(lg);
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "'%s' tests/gemma_ref.py '%s' '%s' 2>&1", py, g_path, dump);
    FILE *pipe = popen(cmd, "r");
    assert_non_null(pipe);
    char line[512];
    double err = -1, late = -1, late_global = -1;
    int top1 = -1, total = -1;
    while (fgets(line, sizeof(line), pipe)) {
        fputs(line, stderr);
        sscanf(line, "rel_err %lf", &err);
        sscanf(line, "rel_err_late %lf", &late);
        sscanf(line, "rel_err_late_global %lf", &late_global);
        sscanf(line, "top1 %d %d", &top1, &total);
    }
    assert_int_equal(pclose(pipe), 0);
    /* ferry multiplies 8-bit activations: a few percent from float64 */
    assert_true(err >= 0 && err < 0.05);
    assert_true(late >= 0 && late < 0.05);
    /* and the window is the model's: without it the late rows move further off */
    assert_true(late_global > 2 * late);
    assert_int_equal(total, n_rows);
    assert_true(top1 >= total - 2);
}

/* ---- determinism --------------------------------------------------------------------- */

/* The last rows of a prompt past the window: the same bits whatever the
 * prefill chunking, the thread count, or the batch the sequence is in. */
static void test_same_bits_across_chunks_threads_batches(void **state)
{
    if (!g_model) skip();
    int32_t ids[1024];
    int32_t n = (int32_t)long_prompt(ids, 1024);
    const int32_t vocab = fy_model_config(g_model)->vocab_size;
    int32_t rows[4] = {n - 4, n - 3, n - 2, n - 1};
    float *a = malloc(sizeof(float) * 4 * (size_t)vocab), *b = malloc(sizeof(float) * 4 * (size_t)vocab);
    engine_t e;
    engine_open(&e, 1, 256, 3, 8);
    run_rows(&e, ids, n, 256, rows, 4, a);
    engine_close(&e);
    engine_open(&e, 2, 64, 3, 8);
    run_rows(&e, ids, n, 64, rows, 4, b);
    assert_memory_equal(a, b, sizeof(float) * 4 * (size_t)vocab);

    /* the same sequence's last token decoded beside two others: one
     * mid-prompt, one decoding at another position */
    fy_block_table_t bt[3];
    const int32_t lens[3] = {n, 37, 300};
    for (int s = 0; s < 3; s++) {
        assert_int_equal(fy_kvm_seq_init(e.kvm, &bt[s], 1024, NULL), FY_OK);
        assert_int_equal(fy_kvm_seq_reserve(e.kvm, &bt[s], lens[s], NULL), FY_OK);
    }
    float dummy;
    for (int32_t done = 0; done < n - 1;) { /* the long one, all but its last token */
        int32_t k = n - 1 - done < 64 ? n - 1 - done : 64;
        fy_forward_seq_t f = {&bt[0], ids + done, k, done, 0, NULL};
        assert_int_equal(fy_runner_forward(e.r, &f, 1, &dummy), FY_OK);
        done += k;
    }
    for (int32_t done = 0; done < 299;) { /* the third: 299 tokens of the prompt's middle */
        int32_t k = 299 - done < 64 ? 299 - done : 64;
        fy_forward_seq_t f = {&bt[2], ids + 100 + done, k, done, 0, NULL};
        assert_int_equal(fy_runner_forward(e.r, &f, 1, &dummy), FY_OK);
        done += k;
    }
    fy_forward_seq_t mixed[3] = {{&bt[1], ids + 7, 37, 0, 0, NULL},
                                 {&bt[0], ids + n - 1, 1, n - 1, 1, NULL},
                                 {&bt[2], ids + 399, 1, 299, 1, NULL}};
    float *lg = malloc(sizeof(float) * 2 * (size_t)vocab);
    assert_int_equal(fy_runner_forward(e.r, mixed, 3, lg), FY_OK);
    assert_memory_equal(lg, a + 3 * (size_t)vocab, sizeof(float) * (size_t)vocab);
    for (int s = 0; s < 3; s++) fy_kvm_seq_release(e.kvm, &bt[s]), fy_kvm_seq_deinit(&bt[s]);
    engine_close(&e);
    free(a), free(b), free(lg);
}

typedef struct run {
    int32_t tokens[128];
    char text[2048];
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

static void generate(const int32_t *ids, int32_t n, int threads, int max_tokens, bool ignore_eos, run_t *out)
{
    engine_t e;
    engine_open(&e, threads, 64, 1, 1);
    fy_gen_params_t gp;
    fy_gen_params_default(&gp);
    gp.gen.max_tokens = max_tokens;
    gp.gen.ignore_eos = ignore_eos;
    memset(out, 0, sizeof(*out));
    assert_int_equal(
        fy_generate(e.r, e.kvm, fy_model_tokenizer(g_model), ids, n, &gp, collect, out, out->tokens, 128, &out->stats),
        FY_OK);
    engine_close(&e);
}

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
    assert_true(words >= 2);
}

static void test_greedy_english_and_deterministic(void **state)
{
    if (!g_model) skip();
    int32_t ids[64];
    size_t n;
    tokenize("The capital of France is Paris. The capital of Germany is", ids, 64, &n);
    run_t *a = malloc(sizeof(run_t)), *b = malloc(sizeof(run_t));
    generate(ids, (int32_t)n, 1, 48, true, a);
    generate(ids, (int32_t)n, 2, 48, true, b);
    fprintf(stderr, "greedy: %s\n", a->text);
    assert_int_equal(a->stats.n_generated, 48);
    assert_memory_equal(a->tokens, b->tokens, sizeof(int32_t) * 48);
    assert_string_equal(a->text, b->text);
    assert_true(!strncmp(a->text, " Berlin", 7));
    tokenize("Once upon a time, in a small village by the sea,", ids, 64, &n);
    generate(ids, (int32_t)n, 2, 64, true, a);
    fprintf(stderr, "story: %s\n", a->text);
    assert_english(a->text);
    free(a), free(b);
}

/* Through the chat template: after one example turn the pretrained model
 * answers the next question in the same form. */
static void test_chat_answer(void **state)
{
    if (!g_model) skip();
    const fy_chat_msg_t msgs[] = {{"user", "What is the capital of Italy?"},
                                  {"assistant", "The capital of Italy is Rome."},
                                  {"user", "What is the capital of France?"}};
    int32_t *ids, n;
    assert_int_equal(fy_prompt_chat(g_model, msgs, FY_ARRAY_LEN(msgs), &ids, &n), FY_OK);
    run_t *r = malloc(sizeof(run_t));
    generate(ids, n, 2, 16, false, r);
    fprintf(stderr, "chat answer: %s\n", r->text);
    assert_true(!strncmp(r->text, "The capital of France is Paris.", 31));
    fy_free(ids);
    free(r);
}

/* ---- perplexity ------------------------------------------------------------------------- */

/* Teacher-forced perplexity of the text, prefill in chunks of 64 with
 * logits for every token, f16 KV in 16-token blocks (BENCHMARKS.md). */
static void test_perplexity(void **state)
{
    if (!g_model) skip();
    int32_t ids[512];
    size_t n;
    tokenize(PPL_TEXT, ids, 512, &n);
    const int32_t vocab = fy_model_config(g_model)->vocab_size;
    float *lg = malloc(sizeof(float) * 64 * (size_t)vocab);
    engine_t e;
    engine_open(&e, 2, 64, 1, 64);
    fy_block_table_t bt;
    assert_int_equal(fy_kvm_seq_init(e.kvm, &bt, 1024, NULL), FY_OK);
    double nll = 0;
    for (size_t done = 0; done < n - 1;) {
        int32_t k = n - 1 - done < 64 ? (int32_t)(n - 1 - done) : 64;
        assert_int_equal(fy_kvm_seq_reserve(e.kvm, &bt, (int32_t)done + k, NULL), FY_OK);
        fy_forward_seq_t f = {&bt, ids + done, k, (int32_t)done, k, NULL};
        assert_int_equal(fy_runner_forward(e.r, &f, 1, lg), FY_OK);
        for (int i = 0; i < k; i++) {
            const float *l = lg + (size_t)i * vocab;
            double mx = l[0], sum = 0;
            for (int v = 1; v < vocab; v++) mx = l[v] > mx ? l[v] : mx;
            for (int v = 0; v < vocab; v++) sum += exp(l[v] - mx);
            nll += log(sum) + mx - l[ids[done + i + 1]];
        }
        done += (size_t)k;
        fy_kvm_seq_commit(e.kvm, &bt, ids, (int32_t)done, NULL);
    }
    fy_kvm_seq_release(e.kvm, &bt);
    fy_kvm_seq_deinit(&bt);
    engine_close(&e);
    free(lg);
    double ppl = exp(nll / (double)(n - 1));
    fprintf(stderr, "gemma3 270m q4_k_m: perplexity %.4f over %zu tokens (f16 kv)\n", ppl, n);
    assert_true(isfinite(ppl) && ppl > 1 && ppl < 60);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_description),
        cmocka_unit_test(test_tokens_and_chat_prompt),
        cmocka_unit_test(test_matches_numpy_reference),
        cmocka_unit_test(test_same_bits_across_chunks_threads_batches),
        cmocka_unit_test(test_greedy_english_and_deterministic),
        cmocka_unit_test(test_chat_answer),
        cmocka_unit_test(test_perplexity),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

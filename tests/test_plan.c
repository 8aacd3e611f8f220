/*
 * test_plan.c - the capacity planner: size parsing, the textbook worked
 * examples, and `ferry plan` itself.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kvplan.h"
#include "common/mem.h"
#include "tests/testutil.h"

static void test_parse_size(void **state)
{
    struct {
        const char *s;
        int64_t want;
    } ok[] = {
        {"4096", 4096},
        {"1K", 1000},
        {"1KB", 1000},
        {"1Ki", 1024},
        {"1KiB", 1024},
        {"1.5Ki", 1536},
        {"512M", 512000000},
        {"50GiB", INT64_C(53687091200)},
        {"50Gi", INT64_C(53687091200)},
        {"2T", INT64_C(2000000000000)},
        {"0", 0},
        {"1B", 1},
    };
    for (size_t i = 0; i < FY_ARRAY_LEN(ok); i++) {
        int64_t v = -1;
        assert_int_equal(fy_parse_size("test", ok[i].s, &v), FY_OK);
        if (v != ok[i].want) fail_msg("'%s' parsed as %lld, not %lld", ok[i].s, (long long)v, (long long)ok[i].want);
    }
    const char *bad[] = {"", "abc", "-5G", "5Q", "1e99", "5 G", " 5", "5GiBB", "nan", "inf"};
    fy_test_log_begin();
    for (size_t i = 0; i < FY_ARRAY_LEN(bad); i++) {
        int64_t v;
        if (fy_parse_size("--kv-mem", bad[i], &v) == FY_OK) fail_msg("'%s' parsed", bad[i]);
    }
    assert_true(fy_test_log_has("--kv-mem", "is not a size", NULL));
    fy_test_log_end();
    char buf[32];
    fy_format_size(INT64_C(53687091200), buf, sizeof(buf));
    assert_string_equal(buf, "50.0 GiB");
    fy_format_size(100, buf, sizeof(buf));
    assert_string_equal(buf, "100 B");
}

static void test_worked_examples(void **state)
{
    /* Llama-2-7B: 32 layers, 32 kv heads of 128; 0.5 MiB a token in f16;
     * 50 GiB give 6,400 blocks of 16 and 102,400 tokens */
    fy_kv_plan_in_t in = {.n_layers = 32,
                          .n_kv_heads = 32,
                          .head_dim = 128,
                          .elem_bytes = 2,
                          .block_size = 16,
                          .kv_mem = INT64_C(50) << 30,
                          .context = 4096};
    fy_kv_plan_t p;
    assert_int_equal(fy_kv_plan(&in, &p), FY_OK);
    assert_int_equal(p.bytes_per_token, 524288);
    assert_int_equal(p.bytes_per_block, 8388608);
    assert_int_equal(p.blocks, 6400);
    assert_int_equal(p.tokens, 102400);
    assert_int_equal(p.blocks_per_request, 256);
    assert_int_equal(p.requests, 25);
    /* Llama-3-70B: 80 layers, 8 kv heads of 128: 327,680 bytes a token in
     * f16, half that in fp8 */
    fy_kv_plan_in_t l3 = {.n_layers = 80,
                          .n_kv_heads = 8,
                          .head_dim = 128,
                          .elem_bytes = 2,
                          .block_size = 16,
                          .kv_mem = INT64_C(40) << 30};
    assert_int_equal(fy_kv_plan(&l3, &p), FY_OK);
    assert_int_equal(p.bytes_per_token, 327680);
    assert_int_equal(fy_kv_dtype_bytes("fp8", &l3.elem_bytes), FY_OK);
    assert_int_equal(fy_kv_plan(&l3, &p), FY_OK);
    assert_int_equal(p.bytes_per_token, 163840);
    /* with the per-row f32 scale the fp8 cache really has: 128 + 4 bytes a row */
    l3.scale_bytes = fy_kv_dtype_scale_bytes("fp8");
    assert_int_equal(fy_kv_plan(&l3, &p), FY_OK);
    assert_int_equal(p.bytes_per_token, 168960);
    assert_int_equal(fy_kv_dtype_scale_bytes("f16"), 0);
    /* SmolLM2-135M: 30 layers, 3 kv heads of 64: 23,040 bytes a token */
    fy_kv_plan_in_t sm = {.n_layers = 30,
                          .n_kv_heads = 3,
                          .head_dim = 64,
                          .elem_bytes = 2,
                          .block_size = 16,
                          .mem = INT64_C(24) << 30,
                          .weights = 96576768,
                          .mem_fraction = 0.5};
    assert_int_equal(fy_kv_plan(&sm, &p), FY_OK);
    assert_int_equal(p.bytes_per_token, 23040);
    assert_int_equal(p.kv_mem, (int64_t)((double)((INT64_C(24) << 30) - 96576768) * 0.5));
    /* Gemma 3 270M: 15 layers with a 512-token window, 3 global; at 8k a
     * sliding layer holds its window and a 512-token step, 65 blocks of 16 */
    int32_t win[18];
    for (int i = 0; i < 18; i++) win[i] = i % 6 == 5 ? 0 : 512;
    fy_kv_plan_in_t g3 = {.n_layers = 18,
                          .n_kv_heads = 1,
                          .head_dim = 256,
                          .elem_bytes = 2,
                          .block_size = 16,
                          .kv_mem = INT64_C(1) << 30,
                          .context = 8192,
                          .windows = win,
                          .step = 512};
    assert_int_equal(fy_kv_plan(&g3, &p), FY_OK);
    assert_int_equal(p.bytes_per_token, 18432);
    const int64_t layer_block = 2 * 256 * 2 * 16; /* K and V of one layer, one block */
    assert_int_equal(p.held_per_request, (3 * 512 + 15 * 65) * layer_block);
    assert_int_equal(p.requests, 7);
    assert_int_equal(p.requests_held, (INT64_C(1) << 30) / ((3 * 512 + 15 * 65) * layer_block));
    g3.windows = NULL; /* all global: the same as every block kept */
    assert_int_equal(fy_kv_plan(&g3, &p), FY_OK);
    assert_int_equal(p.held_per_request, 512 * 18 * layer_block);
    /* a KV budget of 1,638 tokens (20% of 8k): its blocks, a step, and three for the parts' rounding */
    g3.kv_budget = 1638;
    assert_int_equal(fy_kv_plan(&g3, &p), FY_OK);
    assert_int_equal(p.held_per_request, ((1638 + 512 + 15) / 16 + 3) * 18 * layer_block);
    assert_true(p.requests_held >= 3 * p.requests);
    g3.kv_budget = -1;
    fy_test_log_begin();
    assert_int_equal(fy_kv_plan(&g3, &p), FY_ERR_INVALID);
    fy_test_log_end();
    g3.kv_budget = 0;
    /* nonsense is refused */
    fy_test_log_begin();
    sm.weights = INT64_C(25) << 30;
    assert_int_equal(fy_kv_plan(&sm, &p), FY_ERR_INVALID);
    assert_true(fy_test_log_has("leave no memory", NULL));
    in.n_layers = 0;
    assert_int_equal(fy_kv_plan(&in, &p), FY_ERR_INVALID);
    int32_t b;
    assert_int_equal(fy_kv_dtype_bytes("fp4", &b), FY_ERR_INVALID);
    fy_test_log_end();
}

/* Runs bin/ferry with args; returns its stdout (fy_free it) and exit status. */
static char *run_ferry(const char *args, int *status_p)
{
    const char *bin = getenv("FERRY_BIN");
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "%s/ferry %s 2>&1", bin ? bin : "bin", args);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char *out = fy_calloc(1, 65536);
    size_t n = fread(out, 1, 65535, p);
    out[n] = '\0';
    int st = pclose(p);
    *status_p = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return out;
}

/* Tensor and pipeline ranks: heads split or replicated, stages of layers,
 * the fullest rank bounding the block count. */
static void test_ranks(void **state)
{
    int32_t q0, nq, kv0, nkv, first, count;
    /* SmolLM2: 9 query heads over 3 KV heads */
    assert_int_equal(fy_kv_tp_heads(9, 3, 3, 2, &q0, &nq, &kv0, &nkv), FY_OK);
    assert_true(q0 == 6 && nq == 3 && kv0 == 2 && nkv == 1);
    /* 9 ranks: one query head each, its KV head copied to the 3 ranks that read it */
    assert_int_equal(fy_kv_tp_heads(9, 3, 9, 5, &q0, &nq, &kv0, &nkv), FY_OK);
    assert_true(q0 == 5 && nq == 1 && kv0 == 1 && nkv == 1);
    /* Gemma 3 270M: 4 heads, 1 KV head, 2 ranks: replicated */
    assert_int_equal(fy_kv_tp_heads(4, 1, 2, 1, &q0, &nq, &kv0, &nkv), FY_OK);
    assert_true(q0 == 2 && nq == 2 && kv0 == 0 && nkv == 1);
    /* 8 heads, 4 KV heads, 4 ranks: split */
    assert_int_equal(fy_kv_tp_heads(8, 4, 4, 3, &q0, &nq, &kv0, &nkv), FY_OK);
    assert_true(q0 == 6 && nq == 2 && kv0 == 3 && nkv == 1);
    fy_test_log_begin();
    assert_int_equal(fy_kv_tp_heads(9, 3, 2, 0, &q0, &nq, &kv0, &nkv), FY_ERR_INVALID);
    assert_true(fy_test_log_has("9 query heads do not split over 2 ranks", NULL));
    assert_int_equal(fy_kv_tp_heads(12, 4, 6, 0, &q0, &nq, &kv0, &nkv), FY_ERR_INVALID); /* 4 kv heads, 6 ranks */
    assert_true(fy_test_log_has("4 kv heads neither split", NULL));
    assert_int_equal(fy_kv_pp_layers(3, 4, 0, &first, &count), FY_ERR_INVALID);
    fy_test_log_end();
    /* 30 layers in 4 stages: 8, 8, 7, 7 */
    int32_t want_first[] = {0, 8, 16, 23}, want_count[] = {8, 8, 7, 7};
    for (int32_t s = 0; s < 4; s++) {
        assert_int_equal(fy_kv_pp_layers(30, 4, s, &first, &count), FY_OK);
        assert_int_equal(first, want_first[s]);
        assert_int_equal(count, want_count[s]);
    }
    /* SmolLM2 shape, f16, 16-token blocks: tp 3 x pp 2 holds 15 layers of
     * one KV head per rank: 2 x 15 x 1 x 64 x 2 = 3840 bytes a token */
    fy_kv_plan_in_t sm = {.n_layers = 30,
                          .n_heads = 9,
                          .n_kv_heads = 3,
                          .head_dim = 64,
                          .elem_bytes = 2,
                          .block_size = 16,
                          .kv_mem = INT64_C(1) << 30,
                          .context = 8192};
    fy_kv_plan_t one, p;
    assert_int_equal(fy_kv_plan(&sm, &one), FY_OK);
    assert_int_equal(one.ranks, 1);
    assert_int_equal(one.bytes_per_token, 23040);
    sm.tp = 3;
    sm.pp = 2;
    assert_int_equal(fy_kv_plan(&sm, &p), FY_OK);
    assert_int_equal(p.ranks, 6);
    assert_int_equal(p.kv_heads_per_rank, 1);
    assert_int_equal(p.max_stage_layers, 15);
    assert_int_equal(p.bytes_per_token, 3840);
    assert_int_equal(p.bytes_per_token_all, 23040);               /* nothing replicated: the same bytes, spread */
    assert_int_equal(p.blocks, (INT64_C(1) << 30) / (3840 * 16)); /* about 6x one rank's */
    /* 29 layers in 2 stages: the 15-layer stage bounds both */
    sm.n_layers = 29;
    assert_int_equal(fy_kv_plan(&sm, &p), FY_OK);
    assert_int_equal(p.bytes_per_token, 2 * 15 * 64 * 2);
    assert_int_equal(p.bytes_per_token_all, 2 * 29 * 3 * 64 * 2);
    /* 9 ranks: each KV head kept by 3 of them, 3x the bytes in all */
    sm.n_layers = 30;
    sm.tp = 9;
    sm.pp = 1;
    assert_int_equal(fy_kv_plan(&sm, &p), FY_OK);
    assert_int_equal(p.bytes_per_token_all, 3 * 23040);
    sm.tp = 2;
    fy_test_log_begin();
    assert_int_equal(fy_kv_plan(&sm, &p), FY_ERR_INVALID);
    fy_test_log_end();
}

static void test_plan_command(void **state)
{
    int st;
    char *out = run_ferry("plan --layers 32 --kv-heads 32 --head-dim 128 --kv-mem 50GiB --context 4096", &st);
    assert_int_equal(st, 0);
    assert_non_null(strstr(out, "524288 (512.0 KiB)"));
    assert_non_null(strstr(out, "blocks that fit              6400"));
    assert_non_null(strstr(out, "tokens that fit              102400"));
    fy_free(out);
    out = run_ferry("plan --layers 80 --kv-heads 8 --head-dim 128 --kv-mem 40GiB --kv-dtype fp8", &st);
    assert_int_equal(st, 0);
    assert_non_null(strstr(out, "168960")); /* 80 x 8 x 2 rows of 128 one-byte elements and a 4-byte scale */
    fy_free(out);
    out = run_ferry("plan --layers 32 --kv-heads 32 --head-dim 128 --kv-mem 50QiB", &st);
    assert_int_equal(st, 2);
    assert_non_null(strstr(out, "'50QiB' is not a size"));
    fy_free(out);
    out = run_ferry("plan --kv-mem 1G", &st);
    assert_int_equal(st, 2);
    assert_non_null(strstr(out, "needs --model or"));
    fy_free(out);
    out = run_ferry("plan --layers 30 --kv-heads 3 --heads 9 --head-dim 64 --kv-mem 1GiB --tp 3 --pp 2", &st);
    assert_int_equal(st, 0);
    assert_non_null(strstr(out, "ranks                        6 (tp 3 x pp 2)"));
    assert_non_null(strstr(out, "kv heads per rank            1 of 3"));
    assert_non_null(strstr(out, "layers per stage (most)      15 of 30"));
    assert_non_null(strstr(out, "kv bytes per token           3840"));
    fy_free(out);
    out = run_ferry("plan --layers 30 --kv-heads 3 --heads 9 --head-dim 64 --kv-mem 1GiB --tp 2", &st);
    assert_int_equal(st, 1);
    assert_non_null(strstr(out, "9 query heads do not split over 2 ranks"));
    fy_free(out);
    out = run_ferry("plan --layers 30 --kv-heads 3 --head-dim 64 --kv-mem 1GiB --tp 3", &st);
    assert_int_equal(st, 1);
    assert_non_null(strstr(out, "needs the query head count"));
    fy_free(out);
    const char *model = fy_test_default_model();
    if (model) {
        char args[512];
        snprintf(args, sizeof(args), "plan -m %s --kv-mem 1GiB --context 8192", model);
        out = run_ferry(args, &st);
        assert_int_equal(st, 0);
        assert_non_null(strstr(out, "23040"));
        fy_free(out);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_size),
        cmocka_unit_test(test_worked_examples),
        cmocka_unit_test(test_ranks),
        cmocka_unit_test(test_plan_command),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_genspec.c - one truth for the ranges of generation parameters:
 * for values on and around every boundary, fy_genspec_check (what the
 * router's HTTP door asks) accepts exactly what the wire reader (what a
 * worker asks) accepts, after the values' trip through a float.  Issue 13:
 * top_p in [1e-9, 1e-6) and top_k in (2^24, 2^30] used to pass HTTP and
 * fail at the worker.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/genspec.h"
#include "common/mem.h"
#include "tests/testutil.h"

#define CAP 1000 /* max_tokens cap on both sides */

/* Does the wire take g? */
static bool wire_takes(const fy_genspec_t *g)
{
    fy_msgw_t w;
    fy_msgw_init(&w, "t");
    fy_genspec_write(&w, g);
    void *buf;
    size_t len;
    assert_int_equal(fy_msgw_finish(&w, &buf, &len), FY_OK);
    fy_msgr_t r;
    assert_int_equal(fy_msgr_parse(&r, buf, len), FY_OK);
    fy_genspec_t back;
    fy_genspec_default(&back);
    fy_genspec_read(&r, &back, CAP);
    bool ok = fy_msgr_ok(&r);
    fy_msgr_free(&r);
    fy_free(buf);
    return ok;
}

typedef enum {
    F_TEMP,
    F_TOP_P,
    F_TOP_K,
    F_MIN_P,
    F_MAX_TOKENS,
    F_PRIORITY,
    F_KV_BUDGET,
    F_PRESENCE,
    F_FREQUENCY,
    F_REPETITION,
    F_MIN_TOKENS,
    F_TOP_LOGPROBS,
} field_t;

static const char *const NAMES[] = {"temperature",
                                    "top_p",
                                    "top_k",
                                    "min_p",
                                    "max_tokens",
                                    "priority",
                                    "kv_budget",
                                    "presence_penalty",
                                    "frequency_penalty",
                                    "repetition_penalty",
                                    "min_tokens",
                                    "top_logprobs"};

static void set(fy_genspec_t *g, field_t f, double v)
{
    switch (f) {
    case F_TEMP: g->sampling.temperature = (float)v; break;
    case F_TOP_P: g->sampling.top_p = (float)v; break; /* as the HTTP door stores it */
    case F_TOP_K: g->sampling.top_k = (int32_t)v; break;
    case F_MIN_P: g->sampling.min_p = (float)v; break;
    case F_MAX_TOKENS: g->max_tokens = (int32_t)v; break;
    case F_PRIORITY: g->priority = (int32_t)v; break;
    case F_KV_BUDGET: g->kv_budget = (int32_t)v; break;
    case F_PRESENCE: g->presence_penalty = (float)v; break;
    case F_FREQUENCY: g->frequency_penalty = (float)v; break;
    case F_REPETITION: g->repetition_penalty = (float)v; break;
    case F_MIN_TOKENS: g->min_tokens = (int32_t)v; break;
    case F_TOP_LOGPROBS: g->top_logprobs = (int32_t)v; break;
    }
}

static void test_check_agrees_with_wire(void **state)
{
    (void)state;
    static const struct {
        field_t f;
        double v;
        bool ok;
    } cases[] = {
        {F_TEMP, -1e-3, false},
        {F_TEMP, 0, true},
        {F_TEMP, 1e-38, true},
        {F_TEMP, 100, true},
        {F_TEMP, 100.01, false},
        {F_TEMP, NAN, false},
        {F_TEMP, INFINITY, false},
        {F_TOP_P, 1e-9, false},
        {F_TOP_P, 5e-7, false},
        {F_TOP_P, 9.9999999e-7, true},
        /* its float is 1e-6f */ {F_TOP_P, 1e-6, true},
        {F_TOP_P, 0.5, true},
        {F_TOP_P, 1, true},
        {F_TOP_P, 1.001, false},
        {F_TOP_P, 0, false},
        {F_TOP_K, -1, false},
        {F_TOP_K, 0, true},
        {F_TOP_K, 1 << 24, true},
        {F_TOP_K, (1 << 24) + 1, false},
        {F_TOP_K, 1 << 30, false},
        {F_MIN_P, -0.01, false},
        {F_MIN_P, 0, true},
        {F_MIN_P, 1, true},
        {F_MIN_P, 1.01, false},
        {F_MAX_TOKENS, 0, false},
        {F_MAX_TOKENS, 1, true},
        {F_MAX_TOKENS, CAP, true},
        {F_MAX_TOKENS, CAP + 1, false},
        {F_PRIORITY, -1000000, true},
        {F_PRIORITY, 1000000, true},
        {F_PRIORITY, 1000001, false},
        {F_PRIORITY, -1000001, false},
        {F_KV_BUDGET, -1, false},
        {F_KV_BUDGET, 0, true},
        {F_KV_BUDGET, 1 << 24, true},
        {F_KV_BUDGET, (1 << 24) + 1, false},
        {F_PRESENCE, -2, true},
        {F_PRESENCE, 2, true},
        {F_PRESENCE, 2.001, false},
        {F_PRESENCE, NAN, false},
        {F_FREQUENCY, -2.001, false},
        {F_FREQUENCY, 1.5, true},
        {F_REPETITION, 0, false},
        {F_REPETITION, 1e-6, true},
        {F_REPETITION, 10, true},
        {F_REPETITION, 10.01, false},
        {F_MIN_TOKENS, -1, false},
        {F_MIN_TOKENS, 10, true}, /* max_tokens is 10 */
        {F_MIN_TOKENS, 11, false},
        {F_TOP_LOGPROBS, -1, false},
        {F_TOP_LOGPROBS, 20, true},
        {F_TOP_LOGPROBS, 21, false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        fy_genspec_t g;
        fy_genspec_default(&g);
        g.max_tokens = 10;
        set(&g, cases[i].f, cases[i].v);
        const char *field = NULL;
        char why[160] = "";
        bool checked = fy_genspec_check(&g, CAP, &field, why, sizeof(why)) == FY_OK;
        bool wire = wire_takes(&g);
        if (checked != cases[i].ok || wire != cases[i].ok)
            fail_msg("%s = %.9g: check says %s, the wire says %s, expected %s (%s)", NAMES[cases[i].f], cases[i].v,
                     checked ? "ok" : "no", wire ? "ok" : "no", cases[i].ok ? "ok" : "no", why);
        if (!checked) {
            assert_string_equal(field, NAMES[cases[i].f]);
            assert_non_null(strstr(why, NAMES[cases[i].f]));
        }
    }
}

static void test_stop_strings(void **state)
{
    (void)state;
    fy_genspec_t g;
    fy_genspec_default(&g);
    const char *field;
    char why[160];
    g.n_stop = 2;
    memset(g.stop[0], 'x', FY_GEN_STOP_LEN);
    g.stop[0][FY_GEN_STOP_LEN] = 0;
    snprintf(g.stop[1], sizeof(g.stop[1]), "\n");
    assert_int_equal(fy_genspec_check(&g, CAP, &field, why, sizeof(why)), FY_OK);
    assert_true(wire_takes(&g));
    g.stop[1][0] = 0; /* an empty one */
    assert_int_equal(fy_genspec_check(&g, CAP, &field, why, sizeof(why)), FY_ERR_INVALID);
    assert_string_equal(field, "stop");
    g.n_stop = FY_GEN_MAX_STOP + 1;
    assert_int_equal(fy_genspec_check(&g, CAP, &field, why, sizeof(why)), FY_ERR_INVALID);
    assert_string_equal(field, "stop");
}

/* Every logits-processing field survives the wire; a bias outside -100 to
 * 100, a negative token id or a count past its cap is refused on both
 * sides, by name. */
static void test_logits_fields(void **state)
{
    (void)state;
    fy_genspec_t g, back;
    fy_genspec_default(&g);
    g.max_tokens = 50;
    g.presence_penalty = 0.5f, g.frequency_penalty = -0.25f, g.repetition_penalty = 1.3f;
    g.n_logit_bias = 2;
    g.logit_bias_id[0] = 7, g.logit_bias[0] = -100;
    g.logit_bias_id[1] = 49151, g.logit_bias[1] = 12.5f;
    g.min_tokens = 5, g.top_logprobs = 3;
    g.n_stop_ids = 2, g.stop_ids[0] = 2, g.stop_ids[1] = 0;
    const char *field;
    char why[160];
    assert_int_equal(fy_genspec_check(&g, CAP, &field, why, sizeof(why)), FY_OK);
    assert_true(fy_genspec_processes_logits(&g));
    fy_msgw_t w;
    fy_msgw_init(&w, "t");
    fy_genspec_write(&w, &g);
    void *buf;
    size_t len;
    assert_int_equal(fy_msgw_finish(&w, &buf, &len), FY_OK);
    fy_msgr_t r;
    assert_int_equal(fy_msgr_parse(&r, buf, len), FY_OK);
    fy_genspec_default(&back);
    fy_genspec_read(&r, &back, CAP);
    assert_true(fy_msgr_ok(&r));
    fy_msgr_free(&r);
    fy_free(buf);
    assert_true(back.presence_penalty == 0.5f && back.frequency_penalty == -0.25f && back.repetition_penalty == 1.3f);
    assert_int_equal(back.n_logit_bias, 2);
    assert_true(back.logit_bias_id[1] == 49151 && back.logit_bias[0] == -100 && back.logit_bias[1] == 12.5f);
    assert_true(back.min_tokens == 5 && back.top_logprobs == 3 && back.n_stop_ids == 2 && back.stop_ids[0] == 2);
    fy_genspec_t d;
    fy_genspec_default(&d);
    assert_false(fy_genspec_processes_logits(&d)); /* the defaults change nothing */
    g.logit_bias[1] = 100.5f;
    assert_int_equal(fy_genspec_check(&g, CAP, &field, why, sizeof(why)), FY_ERR_INVALID);
    assert_string_equal(field, "logit_bias");
    assert_false(wire_takes(&g));
    g.logit_bias[1] = 1, g.logit_bias_id[1] = -3;
    assert_int_equal(fy_genspec_check(&g, CAP, &field, why, sizeof(why)), FY_ERR_INVALID);
    assert_false(wire_takes(&g));
    g.logit_bias_id[1] = 3, g.stop_ids[1] = -1;
    assert_int_equal(fy_genspec_check(&g, CAP, &field, why, sizeof(why)), FY_ERR_INVALID);
    assert_string_equal(field, "stop_token_ids");
    assert_false(wire_takes(&g));
}

/* prompt_logprobs and bad_words: through the wire and back; the check
 * and the reader refuse the same values, naming the field. */
static void test_prompt_logprobs_bad_words(void **state)
{
    (void)state;
    fy_genspec_t g, back;
    fy_genspec_default(&g);
    assert_false(g.prompt_logprobs);
    g.prompt_logprobs = true, g.prompt_top = 0; /* 0 alternatives is still asking */
    g.n_bad = 3, g.bad_lens[0] = 1, g.bad_lens[1] = 3, g.bad_lens[2] = 2;
    for (int32_t i = 0; i < 6; i++) g.bad_ids[i] = 100 + i;
    const char *field;
    char why[160];
    assert_int_equal(fy_genspec_check(&g, CAP, &field, why, sizeof(why)), FY_OK);
    assert_true(fy_genspec_processes_logits(&g));
    fy_msgw_t w;
    fy_msgw_init(&w, "t");
    fy_genspec_write(&w, &g);
    void *buf;
    size_t len;
    assert_int_equal(fy_msgw_finish(&w, &buf, &len), FY_OK);
    fy_msgr_t r;
    assert_int_equal(fy_msgr_parse(&r, buf, len), FY_OK);
    fy_genspec_default(&back);
    fy_genspec_read(&r, &back, CAP);
    assert_true(fy_msgr_ok(&r));
    fy_msgr_free(&r);
    fy_free(buf);
    assert_true(back.prompt_logprobs && back.prompt_top == 0 && back.n_bad == 3);
    assert_memory_equal(back.bad_lens, g.bad_lens, 3 * sizeof(int32_t));
    assert_memory_equal(back.bad_ids, g.bad_ids, 6 * sizeof(int32_t));
    /* out of range: the check names the field and the wire refuses it */
    g.prompt_top = FY_GEN_MAX_PROMPT_LOGPROBS + 1;
    assert_int_equal(fy_genspec_check(&g, CAP, &field, why, sizeof(why)), FY_ERR_INVALID);
    assert_string_equal(field, "prompt_logprobs");
    assert_false(wire_takes(&g));
    g.prompt_top = 20, g.bad_lens[1] = FY_GEN_BAD_SEQ_MAX + 1;
    assert_int_equal(fy_genspec_check(&g, CAP, &field, why, sizeof(why)), FY_ERR_INVALID);
    assert_string_equal(field, "bad_words");
    assert_false(wire_takes(&g));
    g.bad_lens[1] = 3, g.bad_ids[4] = -1;
    assert_int_equal(fy_genspec_check(&g, CAP, &field, why, sizeof(why)), FY_ERR_INVALID);
    assert_string_equal(field, "bad_words");
    assert_false(wire_takes(&g));
    /* ids and lengths that disagree, by hand */
    int32_t lens[2] = {2, 2}, ids[3] = {1, 2, 3};
    fy_msgw_init(&w, "t");
    fy_msgw_i32s(&w, "bad_words_lens", lens, 2);
    fy_msgw_i32s(&w, "bad_words_ids", ids, 3);
    assert_int_equal(fy_msgw_finish(&w, &buf, &len), FY_OK);
    assert_int_equal(fy_msgr_parse(&r, buf, len), FY_OK);
    fy_genspec_default(&back);
    fy_genspec_read(&r, &back, CAP);
    assert_false(fy_msgr_ok(&r));
    assert_non_null(strstr(r.err, "bad_words_ids"));
    assert_int_equal(back.n_bad, 0);
    fy_msgr_free(&r);
    fy_free(buf);
}

/* The one clamp of a request's length (door, decode worker, engine). */
static void test_max_tokens_clamp(void **state)
{
    (void)state;
    static fy_genspec_t g;
    fy_genspec_default(&g);
    assert_int_equal(g.max_tokens, FY_GEN_MAX_TOKENS_DEFAULT);
    assert_int_equal(fy_genspec_max_tokens(&g, 10, 2048), FY_GEN_MAX_TOKENS_DEFAULT); /* room enough */
    assert_int_equal(fy_genspec_max_tokens(&g, 2000, 2048), 48);                      /* the context's room */
    assert_int_equal(fy_genspec_max_tokens(&g, 2047, 2048), 1);
    assert_true(fy_genspec_max_tokens(&g, 2048, 2048) < 1); /* a full context: nothing */
    assert_true(fy_genspec_max_tokens(&g, 5000, 2048) < 1);
    g.max_tokens = INT32_MAX; /* no overflow at the extremes */
    assert_int_equal(fy_genspec_max_tokens(&g, 0, INT32_MAX), INT32_MAX);
    assert_true(fy_genspec_max_tokens(&g, INT32_MAX, 0) < 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_check_agrees_with_wire), cmocka_unit_test(test_stop_strings),
        cmocka_unit_test(test_logits_fields),          cmocka_unit_test(test_prompt_logprobs_bad_words),
        cmocka_unit_test(test_max_tokens_clamp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

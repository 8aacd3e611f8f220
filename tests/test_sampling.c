/*
 * test_sampling.c - the sampler (greedy, temperature, top-k, top-p,
 * min-p, seeding), stop strings over streamed text, and logits
 * processing (penalties, biases, min_tokens, top alternatives) against a
 * reference written from vLLM's definitions in double precision.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "engine/logits.h"
#include "engine/sampler.h"
#include "engine/stop.h"
#include "tests/testutil.h"

#define V 8

static void counts_for(const fy_sampling_params_t *p, const float *logits, int n_draws, int *counts)
{
    fy_sampler_t *s;
    assert_int_equal(fy_sampler_create(V, &s), FY_OK);
    fy_rng_t rng;
    fy_rng_seed(&rng, p->seed);
    memset(counts, 0, sizeof(int) * V);
    for (int i = 0; i < n_draws; i++) counts[fy_sampler_sample(s, p, &rng, logits, NULL)]++;
    fy_sampler_destroy(s);
}

static void test_greedy_and_ties(void **state)
{
    float l[V] = {0, 3, 1, 3, -1, 2, 0, 0};
    assert_int_equal(fy_argmax(l, V), 1); /* lowest id wins a tie */
    fy_sampling_params_t p;
    fy_sampling_params_default(&p);
    int c[V];
    counts_for(&p, l, 100, c);
    assert_int_equal(c[1], 100);
    p.temperature = 1.0f, p.top_k = 1;
    counts_for(&p, l, 100, c);
    assert_int_equal(c[1], 100);
}

/* At temperature 1 with no filters, draws follow softmax(logits):
 * chi-square with 7 degrees of freedom below its 0.999 quantile (24.3). */
static void test_distribution_matches_softmax(void **state)
{
    float l[V] = {0.5f, 1.0f, -0.3f, 2.0f, 0.0f, -1.0f, 1.5f, 0.2f};
    fy_sampling_params_t p = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 99};
    enum { N = 200000 };
    int c[V];
    counts_for(&p, l, N, c);
    double z = 0, chi = 0;
    for (int i = 0; i < V; i++) z += exp(l[i]);
    for (int i = 0; i < V; i++) {
        double e = N * exp(l[i]) / z;
        chi += (c[i] - e) * (c[i] - e) / e;
    }
    assert_true(chi < 24.3);
    /* temperature 0.5 sharpens: the top token gains */
    int c2[V];
    p.temperature = 0.5f;
    counts_for(&p, l, N, c2);
    assert_true(c2[3] > c[3] + N / 20);
}

static void test_filters(void **state)
{
    /* probabilities at temperature 1: token 3 ~ 0.35, 6 ~ 0.21, 1 ~ 0.13, ... */
    float l[V] = {0.5f, 1.0f, -0.3f, 2.0f, 0.0f, -1.0f, 1.5f, 0.2f};
    fy_sampling_params_t p = {.temperature = 1.0f, .top_k = 2, .top_p = 1.0f, .min_p = 0.0f, .seed = 1};
    int c[V];
    counts_for(&p, l, 10000, c);
    for (int i = 0; i < V; i++)
        if (i != 3 && i != 6) assert_int_equal(c[i], 0);
    assert_true(c[3] > c[6] && c[6] > 2000);
    /* top_p 0.5: the nucleus is {3, 6} (0.35 + 0.21 >= 0.5) */
    p.top_k = 0, p.top_p = 0.5f;
    counts_for(&p, l, 10000, c);
    for (int i = 0; i < V; i++)
        if (i != 3 && i != 6) assert_int_equal(c[i], 0);
    /* top_p 0.3: only the best token */
    p.top_p = 0.3f;
    counts_for(&p, l, 1000, c);
    assert_int_equal(c[3], 1000);
    /* min_p 0.5: tokens with p >= 0.5 p(best): 3 and 6 (e^-0.5 = 0.61) */
    p.top_p = 1.0f, p.min_p = 0.5f;
    counts_for(&p, l, 10000, c);
    for (int i = 0; i < V; i++)
        if (i != 3 && i != 6) assert_int_equal(c[i], 0);
    /* top_k larger than the vocabulary is no filter */
    p.min_p = 0.0f, p.top_k = 1000;
    counts_for(&p, l, 20000, c);
    for (int i = 0; i < V; i++) assert_true(c[i] > 0);
}

/* A small top_p over candidates of near-equal weight: the nucleus
 * prefilter's bound, (1 - top_p) / (n - 1) of the total weight, was above
 * the best candidate's own weight and emptied the list, and the pick read
 * the element before the array (fuzz_genspec found it with top_p 3e-5 and
 * min_p 0.05).  The best candidate is in every nucleus. */
static void test_small_top_p_keeps_the_best(void **state)
{
    (void)state;
    static const struct {
        float l[V];
        float top_p, min_p;
        int best;
    } cases[] = {
        {{-30.0f, 10.0f, -25.0f, 9.9f, -20.0f, -30.0f, -28.0f, -27.0f}, 0.3f, 0.05f, 1}, /* two left after min_p */
        {{1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f}, 0.1f, 0.0f, 0},               /* flat */
        {{0.5f, 0.4f, 0.45f, 0.3f, 0.35f, 0.2f, 0.5f, 0.1f}, 1e-6f, 0.0f, 0},            /* nearly flat, tie */
    };
    fy_sampler_t *s;
    assert_int_equal(fy_sampler_create(V, &s), FY_OK);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        fy_sampling_params_t p = {
            .temperature = 1.0f, .top_k = 0, .top_p = cases[i].top_p, .min_p = cases[i].min_p, .seed = 9};
        fy_rng_t rng;
        fy_rng_seed(&rng, p.seed);
        for (int k = 0; k < 100; k++) {
            float lp = 1;
            assert_int_equal(fy_sampler_sample(s, &p, &rng, cases[i].l, &lp), cases[i].best);
            assert_true(lp <= 0);
        }
        float probs[V];
        fy_sampler_probs(s, &p, cases[i].l, probs);
        assert_true(probs[cases[i].best] == 1.0f);
    }
    fy_sampler_destroy(s);
}

static void test_seeded_reproducible(void **state)
{
    float l[V] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f};
    fy_sampler_t *s;
    assert_int_equal(fy_sampler_create(V, &s), FY_OK);
    fy_sampling_params_t p = {.temperature = 1.0f, .top_k = 5, .top_p = 0.9f, .min_p = 0.0f, .seed = 1234};
    int32_t a[200], b[200], d[200];
    fy_rng_t r1, r2, r3;
    fy_rng_seed(&r1, 1234);
    fy_rng_seed(&r2, 1234);
    fy_rng_seed(&r3, 1235);
    for (int i = 0; i < 200; i++) {
        a[i] = fy_sampler_sample(s, &p, &r1, l, NULL);
        b[i] = fy_sampler_sample(s, &p, &r2, l, NULL);
        d[i] = fy_sampler_sample(s, &p, &r3, l, NULL);
    }
    assert_memory_equal(a, b, sizeof(a));
    assert_memory_not_equal(a, d, sizeof(a));
    float lp;
    fy_sampling_params_default(&p);
    fy_sampler_sample(s, &p, &r1, l, &lp);
    double z = 0;
    for (int i = 0; i < V; i++) z += exp(l[i]);
    assert_float_equal(lp, log(exp(0.8) / z), 1e-5);
    fy_sampler_destroy(s);
}

/* Temperatures too small to scale logits by (1/t overflows a float near
 * 3e-38) are greedy, as in vLLM: the pick is the argmax and its
 * log-probability finite and inside the wire's range, at every scale.
 * Before, 1/t overflowed and the pick was whatever the NaNs gave. */
static void test_tiny_temperature_is_greedy(void **state)
{
    float l[V] = {0.5f, 21.0f, -30.0f, 25.0f, 0.0f, -1.0f, 24.5f, 0.2f};
    fy_sampler_t *s;
    assert_int_equal(fy_sampler_create(V, &s), FY_OK);
    const float temps[] = {3e-38f, 1e-30f, 1e-20f, 1e-9f, 9.9e-6f};
    for (size_t i = 0; i < sizeof(temps) / sizeof(temps[0]); i++) {
        fy_sampling_params_t p = {.temperature = temps[i], .top_k = 0, .top_p = 0.9f, .min_p = 0.05f, .seed = 3};
        assert_int_equal(fy_sampling_params_check(&p), FY_OK);
        assert_true(fy_sampling_is_greedy(&p));
        fy_rng_t rng;
        fy_rng_seed(&rng, 3);
        for (int k = 0; k < 50; k++) {
            float lp = 1;
            assert_int_equal(fy_sampler_sample(s, &p, &rng, l, &lp), 3);
            assert_true(isfinite(lp) && lp <= 0 && lp >= FY_LOGPROB_MIN);
        }
        float probs[V];
        fy_sampler_probs(s, &p, l, probs);
        assert_true(probs[3] == 1.0f);
        assert_true(isfinite(fy_logprob(l, V, &p, 2)));
    }
    /* the smallest temperature that samples still gives finite log-probabilities */
    fy_sampling_params_t p = {.temperature = FY_SAMPLING_MIN_TEMP, .top_k = 0, .top_p = 1, .min_p = 0, .seed = 4};
    assert_false(fy_sampling_is_greedy(&p));
    fy_rng_t rng;
    fy_rng_seed(&rng, 4);
    float lp = 1;
    assert_int_equal(fy_sampler_sample(s, &p, &rng, l, &lp), 3);
    assert_true(isfinite(lp) && lp <= 0 && lp >= FY_LOGPROB_MIN);
    assert_true(isfinite(fy_logprob(l, V, &p, 2)) && fy_logprob(l, V, &p, 2) > FY_LOGPROB_MIN);
    fy_sampler_destroy(s);
}

static void test_params_checked(void **state)
{
    fy_sampling_params_t p;
    fy_sampling_params_default(&p);
    assert_int_equal(fy_sampling_params_check(&p), FY_OK);
    fy_test_log_begin();
    p.temperature = -1;
    assert_int_equal(fy_sampling_params_check(&p), FY_ERR_INVALID);
    assert_true(fy_test_log_has("temperature", NULL));
    fy_sampling_params_default(&p);
    p.top_p = 0;
    assert_int_equal(fy_sampling_params_check(&p), FY_ERR_INVALID);
    assert_true(fy_test_log_has("top_p", NULL));
    fy_sampling_params_default(&p);
    p.top_k = -5;
    assert_int_equal(fy_sampling_params_check(&p), FY_ERR_INVALID);
    fy_sampling_params_default(&p);
    p.min_p = NAN;
    assert_int_equal(fy_sampling_params_check(&p), FY_ERR_INVALID);
    fy_test_log_end();
}

/* ---- stop strings ---------------------------------------------------------------------- */

typedef struct sink {
    char buf[1024];
    size_t len;
} sink_t;

static void collect(void *arg, const char *text, size_t len)
{
    sink_t *s = arg;
    assert_true(s->len + len < sizeof(s->buf));
    memcpy(s->buf + s->len, text, len);
    s->len += len;
    s->buf[s->len] = '\0';
}

static bool feed_pieces(fy_stopper_t *st, const char *const *pieces, sink_t *out)
{
    for (int i = 0; pieces[i]; i++)
        if (fy_stopper_feed(st, pieces[i], strlen(pieces[i]), collect, out)) return true;
    fy_stopper_flush(st, collect, out);
    return false;
}

static void test_stop_strings(void **state)
{
    const char *stops[] = {"\n\nUser:", "END"};
    fy_stopper_t st;
    sink_t out = {0};
    assert_int_equal(fy_stopper_init(&st, stops, 2, 64), FY_OK);
    const char *p1[] = {"Hello", " there", "\n", "\nUs", "er:", " more", NULL};
    assert_true(feed_pieces(&st, p1, &out));
    assert_string_equal(out.buf, "Hello there");
    fy_stopper_deinit(&st);

    /* a partial match that turns out not to be one is released */
    assert_int_equal(fy_stopper_init(&st, stops, 2, 64), FY_OK);
    memset(&out, 0, sizeof(out));
    const char *p2[] = {"EN", "D", NULL};
    assert_true(feed_pieces(&st, p2, &out));
    assert_string_equal(out.buf, "");
    fy_stopper_deinit(&st);

    assert_int_equal(fy_stopper_init(&st, stops, 2, 64), FY_OK);
    memset(&out, 0, sizeof(out));
    const char *p3[] = {"EN", "TRY ", "\n\nUse", "d", NULL};
    assert_false(feed_pieces(&st, p3, &out));
    assert_string_equal(out.buf, "ENTRY \n\nUsed");
    fy_stopper_deinit(&st);

    /* the earliest match wins; nothing after it leaks */
    assert_int_equal(fy_stopper_init(&st, stops, 2, 64), FY_OK);
    memset(&out, 0, sizeof(out));
    const char *p4[] = {"aENDb\n\nUser:c", NULL};
    assert_true(feed_pieces(&st, p4, &out));
    assert_string_equal(out.buf, "a");
    fy_stopper_deinit(&st);

    /* no stop strings: everything passes straight through */
    assert_int_equal(fy_stopper_init(&st, NULL, 0, 64), FY_OK);
    memset(&out, 0, sizeof(out));
    const char *p5[] = {"x", "y", NULL};
    assert_false(feed_pieces(&st, p5, &out));
    assert_string_equal(out.buf, "xy");
    fy_stopper_deinit(&st);

    const char *bad[] = {""};
    fy_test_log_begin();
    assert_int_equal(fy_stopper_init(&st, bad, 1, 64), FY_ERR_INVALID);
    assert_true(fy_test_log_has("empty", NULL));
    fy_test_log_end();
}

/* ---- logits processing ---- */

#define LV 50

/* vLLM's definitions, directly: for each token of the vocabulary, its
 * count in the output and whether the prompt or the output has it. */
static void logits_reference(const fy_logits_params_t *p, const int32_t *tok, int32_t n_prompt, int32_t n_total,
                             const int32_t *eog, int32_t n_eog, const float *in, double *out)
{
    for (int32_t t = 0; t < LV; t++) {
        double l = in[t];
        for (int32_t i = 0; i < p->n_bias; i++)
            if (p->bias_ids[i] == t) l = p->bias[i] <= -100 ? -1e30 : l + p->bias[i];
        bool banned = l <= -1e30;
        if (n_total - n_prompt < p->min_tokens) {
            for (int32_t i = 0; i < n_eog; i++) banned |= eog[i] == t;
            for (int32_t i = 0; i < p->n_stop_ids; i++) banned |= p->stop_ids[i] == t;
        }
        int c = 0;
        bool seen = false;
        for (int32_t i = 0; i < n_total; i++)
            if (tok[i] == t) {
                seen = true;
                c += i >= n_prompt;
            }
        if (banned) {
            out[t] = -1e30;
            continue;
        }
        if (seen && p->repetition_penalty != 1.0f) l = l > 0 ? l / p->repetition_penalty : l * p->repetition_penalty;
        if (c > 0) l -= (double)p->frequency_penalty * c + p->presence_penalty;
        out[t] = l;
    }
}

static void test_logits_processing(void **state)
{
    (void)state;
    fy_logits_scratch_t sc;
    assert_int_equal(fy_logits_scratch_init(&sc, LV), FY_OK);
    uint64_t rng = 77;
    int32_t eog[2] = {0, 1};
    for (int round = 0; round < 2000; round++) {
        int32_t tok[64], bias_ids[6], stop_ids[3];
        float bias[6], in[LV], got[LV];
        double want[LV];
        int32_t n_total = 1 + (int32_t)(fy_test_rand_u64(&rng) % 64),
                n_prompt = (int32_t)(fy_test_rand_u64(&rng) % (uint64_t)(n_total + 1));
        for (int32_t i = 0; i < n_total; i++) tok[i] = (int32_t)(fy_test_rand_u64(&rng) % 20); /* repeats */
        for (int32_t t = 0; t < LV; t++) in[t] = (float)((double)(fy_test_rand_u64(&rng) % 2001) / 100.0 - 10.0);
        fy_logits_params_t p = {.repetition_penalty = 1.0f};
        switch (round % 5) {
        case 0: p.repetition_penalty = 0.5f + (float)(fy_test_rand_u64(&rng) % 20) / 10.0f; break;
        case 1:
            p.presence_penalty = (float)((int)(fy_test_rand_u64(&rng) % 41) - 20) / 10.0f;
            p.frequency_penalty = (float)((int)(fy_test_rand_u64(&rng) % 41) - 20) / 10.0f;
            break;
        case 2:
            p.n_bias = 6;
            for (int i = 0; i < 6; i++) {
                bias_ids[i] = (int32_t)(fy_test_rand_u64(&rng) % LV);
                bias[i] = i == 0 ? -100.0f : (float)((int)(fy_test_rand_u64(&rng) % 200) - 100) / 4.0f;
            }
            break;
        case 3:
            p.min_tokens = (int32_t)(fy_test_rand_u64(&rng) % 8);
            p.n_stop_ids = 3;
            for (int i = 0; i < 3; i++) stop_ids[i] = (int32_t)(fy_test_rand_u64(&rng) % LV);
            break;
        default: /* all of it */
            p.repetition_penalty = 1.2f, p.presence_penalty = 0.7f, p.frequency_penalty = 0.3f;
            p.n_bias = 2, bias_ids[0] = tok[0], bias[0] = 5, bias_ids[1] = 33, bias[1] = -100;
            p.min_tokens = 3, p.n_stop_ids = 1, stop_ids[0] = 7;
        }
        p.bias_ids = bias_ids, p.bias = bias, p.stop_ids = stop_ids;
        memcpy(got, in, sizeof(in));
        fy_logits_apply(&p, &sc, tok, n_prompt, n_total, eog, 2, got);
        logits_reference(&p, tok, n_prompt, n_total, eog, 2, in, want);
        for (int32_t t = 0; t < LV; t++)
            if (fabs((double)got[t] - want[t]) > 1e-4 * (1 + fabs(want[t])))
                fail_msg("round %d token %d: %g, the reference %g", round, t, (double)got[t], want[t]);
        for (int32_t t = 0; t < LV; t++) assert_int_equal(sc.count[t], 0); /* the scratch is left clean */
    }
    fy_logits_params_t off = {.repetition_penalty = 1.0f};
    assert_false(fy_logits_active(&off));
    fy_logits_scratch_deinit(&sc);
}

/* The top alternatives: the k largest, most likely first (ties to the
 * lower id), with the log-probabilities fy_logprob gives. */
static void test_logits_top(void **state)
{
    (void)state;
    float l[V] = {0, 3, 1, 3, -1, 2, 0, 0};
    int32_t ids[8];
    float lps[8];
    fy_sampling_params_t sp;
    fy_sampling_params_default(&sp);
    assert_int_equal(fy_logits_top(l, V, 0.0f, 3, ids, lps), 3);
    assert_int_equal(ids[0], 1), assert_int_equal(ids[1], 3), assert_int_equal(ids[2], 5);
    for (int k = 0; k < 3; k++) assert_true(fabsf(lps[k] - fy_logprob(l, V, &sp, ids[k])) < 1e-6f);
    sp.temperature = 0.5f;
    assert_int_equal(fy_logits_top(l, V, 0.5f, 20, ids, lps), V); /* capped by the vocabulary */
    double sum = 0;
    for (int k = 0; k < V; k++) {
        assert_true(fabsf(lps[k] - fy_logprob(l, V, &sp, ids[k])) < 1e-6f);
        if (k) assert_true(lps[k] <= lps[k - 1]);
        sum += exp(lps[k]);
    }
    assert_true(fabs(sum - 1) < 1e-5);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_and_ties),
        cmocka_unit_test(test_small_top_p_keeps_the_best),
        cmocka_unit_test(test_distribution_matches_softmax),
        cmocka_unit_test(test_filters),
        cmocka_unit_test(test_seeded_reproducible),
        cmocka_unit_test(test_tiny_temperature_is_greedy),
        cmocka_unit_test(test_params_checked),
        cmocka_unit_test(test_stop_strings),
        cmocka_unit_test(test_logits_processing),
        cmocka_unit_test(test_logits_top),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

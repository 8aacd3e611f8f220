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

#include "genspec.h"
#include "mem.h"
#include "testutil.h"

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

typedef enum { F_TEMP, F_TOP_P, F_TOP_K, F_MIN_P, F_MAX_TOKENS, F_PRIORITY, F_KV_BUDGET } field_t;

static const char *const NAMES[] = {"temperature", "top_p", "top_k", "min_p", "max_tokens", "priority", "kv_budget"};

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_check_agrees_with_wire),
        cmocka_unit_test(test_stop_strings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

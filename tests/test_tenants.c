/*
 * test_tenants.c - the API key file and per-tenant limits
 * (router/tenants.c): keys find their tenant and nothing else does,
 * limits admit and refuse as documented, and every malformed key file is
 * refused with an error naming its line.
 */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "router/tenants.h"
#include "tests/testutil.h"

static fy_tenants_t *load(const char *text, fy_status_t want)
{
    const char *path = fy_test_path("keys.txt");
    assert_true(fy_test_write_file(path, text, strlen(text)));
    fy_tenants_t *t = NULL;
    fy_test_log_begin();
    fy_status_t st = fy_tenants_load(path, &t);
    fy_test_log_end();
    if (st != want)
        fail_msg("load gave %s, expected %s: %s", fy_status_str(st), fy_status_str(want), fy_test_log_text());
    return t;
}

static void test_keys_find_tenants(void **state)
{
    (void)state;
    fy_tenants_t *t = load("# comment\n\nkey-one-0001 alpha   # trailing comment\n"
                           "key-two-0002 alpha max_concurrent=2\nkey-three-03 beta tokens_per_minute=600\n",
                           FY_OK);
    fy_tenant_t *a1 = fy_tenants_find(t, "key-one-0001", 12), *a2 = fy_tenants_find(t, "key-two-0002", 12);
    fy_tenant_t *b = fy_tenants_find(t, "key-three-03", 12);
    assert_non_null(a1);
    assert_ptr_equal(a1, a2); /* one tenant, two keys */
    assert_string_equal(fy_tenant_name(a1), "alpha");
    assert_string_equal(fy_tenant_name(b), "beta");
    assert_null(fy_tenants_find(t, "key-one-0002", 12));
    assert_null(fy_tenants_find(t, "key-one-000", 11));
    assert_null(fy_tenants_find(t, "", 0));
    fy_tenants_destroy(t);
}

static void test_limits(void **state)
{
    (void)state;
    fy_tenants_t *t = load("key-one-0001 alpha max_concurrent=2\nkey-three-03 beta tokens_per_minute=600\n", FY_OK);
    fy_tenant_t *a = fy_tenants_find(t, "key-one-0001", 12), *b = fy_tenants_find(t, "key-three-03", 12);
    double retry;
    /* concurrency: 2 at once, a third waits, one ending lets it in */
    assert_int_equal(fy_tenant_admit(a, 1, 10, 0, &retry), FY_TENANT_OK);
    assert_int_equal(fy_tenant_admit(a, 1, 10, 0, &retry), FY_TENANT_OK);
    assert_int_equal(fy_tenant_admit(a, 1, 10, 0, &retry), FY_TENANT_CONCURRENCY);
    assert_true(retry > 0);
    fy_tenant_release(a, 1, 0, 0);
    assert_int_equal(fy_tenant_admit(a, 1, 10, 0, &retry), FY_TENANT_OK);
    /* n samples count as n requests */
    fy_tenant_release(a, 2, 0, 0);
    assert_int_equal(fy_tenant_admit(a, 3, 10, 0, &retry), FY_TENANT_CONCURRENCY);
    /* tokens: a bucket of 600 refilling at 10 a second */
    assert_int_equal(fy_tenant_admit(b, 1, 500, 100.0, &retry), FY_TENANT_OK);
    assert_int_equal(fy_tenant_admit(b, 1, 200, 100.0, &retry), FY_TENANT_TOKENS);
    assert_true(retry > 9.9 && retry < 10.1); /* 100 more tokens at 10 a second */
    assert_int_equal(fy_tenant_admit(b, 1, 200, 110.5, &retry), FY_TENANT_OK);
    /* unused tokens come back at the end */
    fy_tenant_release(b, 1, 400, 110.5);
    assert_int_equal(fy_tenant_admit(b, 1, 400, 110.5, &retry), FY_TENANT_OK);
    /* more than a minute's worth never fits */
    assert_int_equal(fy_tenant_admit(b, 1, 601, 1000.0, &retry), FY_TENANT_TOKENS);
    assert_true(retry >= 60);
    fy_tenants_destroy(t);
}

static void test_bad_files(void **state)
{
    (void)state;
    static const struct {
        const char *text, *says;
    } cases[] = {
        {"short alpha\n", ":1: a key has"},
        {"key-one-0001\n", ":1: a key needs a tenant name"},
        {"key-one-0001 al/pha\n", ":1: a key needs a tenant name"},
        {"key-one-0001 alpha\nkey-one-0001 beta\n", ":2: the same key appears twice"},
        {"key-one-0001 alpha speed=3\n", ":1: unknown option 'speed'"},
        {"key-one-0001 alpha max_concurrent=x\n", ":1: 'max_concurrent=x'"},
        {"key-one-0001 alpha max_concurrent=2\nkey-two-0002 alpha max_concurrent=3\n", ":2: tenant alpha already"},
        {"# nothing but comments\n\n", "no keys"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
        fy_tenants_t *t = load(cases[i].text, FY_ERR_INVALID);
        assert_null(t);
        if (!fy_test_log_has(cases[i].says, NULL))
            fail_msg("case %zu: no '%s' in: %s", i, cases[i].says, fy_test_log_text());
    }
    fy_tenants_t *t = NULL;
    fy_test_log_begin();
    assert_int_equal(fy_tenants_load(fy_test_path("missing.txt"), &t), FY_ERR_IO);
    fy_test_log_end();
    assert_true(fy_test_log_has("missing.txt", NULL));
}

/* Keys are credentials: a file its group or others can read (or write) is refused, naming its mode. */
static void test_open_file_refused(void **state)
{
    (void)state;
    const char *path = fy_test_path("open-keys.txt");
    const char *text = "key-one-0001 alpha\n";
    assert_true(fy_test_write_file(path, text, strlen(text)));
    static const unsigned modes[] = {0640, 0604, 0644, 0660};
    for (size_t i = 0; i < sizeof(modes) / sizeof(*modes); i++) {
        assert_int_equal(chmod(path, modes[i]), 0);
        char want[16];
        snprintf(want, sizeof(want), "mode %04o", modes[i]);
        fy_tenants_t *t = NULL;
        fy_test_log_begin();
        assert_int_equal(fy_tenants_load(path, &t), FY_ERR_INVALID);
        fy_test_log_end();
        assert_null(t);
        if (!fy_test_log_has(path, want, "chmod 600", NULL)) fail_msg("no '%s' in: %s", want, fy_test_log_text());
    }
    assert_int_equal(chmod(path, 0600), 0);
    fy_tenants_t *t = load(text, FY_OK);
    fy_tenants_destroy(t);
    assert_int_equal(chmod(path, 0400), 0);
    fy_test_log_begin();
    assert_int_equal(fy_tenants_load(path, &t), FY_OK);
    fy_test_log_end();
    fy_tenants_destroy(t);
}

static int teardown(void **state)
{
    (void)state;
    fy_test_tmpdir_remove();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keys_find_tenants),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_open_file_refused),
    };
    return cmocka_run_group_tests(tests, NULL, teardown);
}

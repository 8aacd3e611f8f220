/*
 * test_config.c - INI configuration: parsing, merge order, --set, every
 * typed getter's accepted and refused values, unknown keys, malformed and
 * hostile files, allocation failure, and write + reload.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "config.h"
#include "mem.h"
#include "testutil.h"

static fy_config_t *make(const char *text)
{
    fy_config_t *c = NULL;
    assert_int_equal(fy_config_create(&c), FY_OK);
    if (text) assert_int_equal(fy_config_load_string(c, text, "t.ini"), FY_OK);
    return c;
}

static void test_parse(void **state)
{
    fy_config_t *c = make("\xEF\xBB\xBF; a comment\r\n"
                          "# another\n"
                          "[router]\n"
                          "port = 8080\n"
                          "  host=127.0.0.1   \n"
                          "\tmodel = models/m.gguf ; why this one\n"
                          "url = tcp://a:1?x=y\n"
                          "empty =\n"
                          "semi = a;b\n"
                          "\n"
                          "[prefill.0]\n"
                          "threads = 4\n"
                          "[router]\n"
                          "late = yes\n");
    assert_int_equal(fy_config_count(c), 8);
    assert_string_equal(fy_config_get(c, "router", "port"), "8080");
    assert_string_equal(fy_config_get(c, "router", "host"), "127.0.0.1");
    assert_string_equal(fy_config_get(c, "router", "model"), "models/m.gguf");
    assert_string_equal(fy_config_get(c, "router", "url"), "tcp://a:1?x=y");
    assert_string_equal(fy_config_get(c, "router", "empty"), "");
    assert_string_equal(fy_config_get(c, "router", "semi"), "a;b");
    assert_string_equal(fy_config_get(c, "prefill.0", "threads"), "4");
    assert_string_equal(fy_config_get(c, "router", "late"), "yes");
    assert_string_equal(fy_config_origin(c, "router", "port"), "t.ini:4");
    assert_string_equal(fy_config_origin(c, "prefill.0", "threads"), "t.ini:12");
    assert_null(fy_config_get(c, "router", "nope"));
    assert_null(fy_config_get(c, "nope", "port"));
    assert_null(fy_config_origin(c, "nope", "port"));
    /* an empty file and a file of comments are fine */
    assert_int_equal(fy_config_load_string(c, "", "e.ini"), FY_OK);
    assert_int_equal(fy_config_load_string(c, "; x\n\n# y\n", NULL), FY_OK);
    assert_int_equal(fy_config_count(c), 8);
    fy_config_destroy(c);
    fy_config_destroy(NULL);
}

static void test_merge_order(void **state)
{
    fy_config_t *c = make("[a]\nx = 1\ny = 1\n");
    assert_int_equal(fy_config_load_string(c, "[a]\ny = 2\nz = 2\n[b]\nw = 2\n", "second.ini"), FY_OK);
    assert_string_equal(fy_config_get(c, "a", "x"), "1");
    assert_string_equal(fy_config_get(c, "a", "y"), "2");
    assert_string_equal(fy_config_origin(c, "a", "y"), "second.ini:2");
    assert_string_equal(fy_config_get(c, "a", "z"), "2");
    assert_int_equal(fy_config_count(c), 4);
    /* --set wins over the files before it ... */
    assert_int_equal(fy_config_set(c, "a.y=3"), FY_OK);
    assert_int_equal(fy_config_set(c, " b.v =  spaced value \t"), FY_OK);
    assert_string_equal(fy_config_get(c, "a", "y"), "3");
    assert_string_equal(fy_config_origin(c, "a", "y"), "--set");
    assert_string_equal(fy_config_get(c, "b", "v"), "spaced value");
    /* ... and a later --set over an earlier one; a file after it wins again */
    assert_int_equal(fy_config_set(c, "a.y=4"), FY_OK);
    assert_string_equal(fy_config_get(c, "a", "y"), "4");
    assert_int_equal(fy_config_load_string(c, "[a]\ny = 5\n", "third.ini"), FY_OK);
    assert_string_equal(fy_config_get(c, "a", "y"), "5");
    assert_int_equal(fy_config_count(c), 5);
    /* the key is after the last dot: sections may hold dots; values may hold '=' */
    assert_int_equal(fy_config_set(c, "prefill.1.threads=x=y"), FY_OK);
    assert_string_equal(fy_config_get(c, "prefill.1", "threads"), "x=y");
    assert_int_equal(fy_config_set(c, "a.e="), FY_OK);
    assert_string_equal(fy_config_get(c, "a", "e"), "");
    fy_config_destroy(c);
}

static void test_set_errors(void **state)
{
    fy_config_t *c = make("[a]\nx = 1\n");
    char longval[FY_CONFIG_MAX_LINE + 16];
    snprintf(longval, sizeof(longval), "a.k=%0*d", FY_CONFIG_MAX_LINE, 0);
    struct {
        const char *s, *msg;
    } bad[] = {
        {"noequals", "expected section.key=value"},
        {"nodot=1", "expected section.key=value"},
        {".x=1", "not a valid section name"},
        {"a..b.x=1", "not a valid section name"},
        {"a b.x=1", "not a valid section name"},
        {"a.=1", "not a valid key"},
        {"a.x y=1", "not a valid key"},
        {"a.x:y=1", "not a valid key"},
        {"a.x=tab\tok but \x01 is not", "control character"},
        {"a.x=\xff\xfe", "invalid UTF-8"},
        {"a.x=v ; comment", "read back as a comment"},
        {"a.x=;v", "read back as a comment"},
        {longval, "value too long"},
    };
    for (size_t i = 0; i < FY_ARRAY_LEN(bad); i++) {
        fy_test_log_begin();
        fy_status_t st = fy_config_set(c, bad[i].s);
        bool logged = fy_test_log_has("config: --set", bad[i].msg, NULL);
        fy_test_log_end();
        if (st != FY_ERR_INVALID || !logged) fail_msg("--set '%s': status %d, logged %d", bad[i].s, st, logged);
    }
    /* nothing changed */
    assert_int_equal(fy_config_count(c), 1);
    assert_string_equal(fy_config_get(c, "a", "x"), "1");
    /* a value with a tab and a ';' inside a word is fine */
    assert_int_equal(fy_config_set(c, "a.x=a\tb;c"), FY_OK);
    assert_string_equal(fy_config_get(c, "a", "x"), "a\tb;c");
    fy_config_destroy(c);
}

/* Runs fn, expecting FY_ERR_INVALID and one error line with every given
 * substring. */
#define EXPECT_REFUSED(call, ...)                                                                              \
    do {                                                                                                       \
        fy_test_log_begin();                                                                                   \
        fy_status_t st_ = (call);                                                                              \
        bool has_ = fy_test_log_has(__VA_ARGS__, NULL);                                                        \
        fy_test_log_end();                                                                                     \
        if (st_ != FY_ERR_INVALID || !has_)                                                                    \
            fail_msg("%s: status %d, log:\n%s", #call, st_, fy_test_log_text());                               \
    } while (0)

static void test_int(void **state)
{
    fy_config_t *c = make("[n]\na = 42\nb = -7\nc = +3\nd = 9223372036854775807\n"
                          "x1 = 4x\nx2 = 0x10\nx3 = 99999999999999999999\nx4 =\nx5 = 1.5\nx6 = - 1\n");
    int64_t v = 0;
    assert_int_equal(fy_config_int(c, "n", "a", 0, 0, 100, &v), FY_OK);
    assert_int_equal(v, 42);
    assert_int_equal(fy_config_int(c, "n", "b", 0, -10, 10, &v), FY_OK);
    assert_int_equal(v, -7);
    assert_int_equal(fy_config_int(c, "n", "c", 0, 0, 10, &v), FY_OK);
    assert_int_equal(v, 3);
    assert_int_equal(fy_config_int(c, "n", "d", 0, INT64_MIN, INT64_MAX, &v), FY_OK);
    assert_true(v == INT64_MAX);
    assert_int_equal(fy_config_int(c, "n", "absent", 17, 0, 10, &v), FY_OK); /* the default is not checked */
    assert_int_equal(v, 17);
    /* bounds are inclusive */
    assert_int_equal(fy_config_int(c, "n", "a", 0, 42, 42, &v), FY_OK);
    v = 5;
    EXPECT_REFUSED(fy_config_int(c, "n", "a", 0, 0, 41, &v), "n.a = '42'", "(t.ini:2)", "an integer in [0, 41]");
    EXPECT_REFUSED(fy_config_int(c, "n", "b", 0, 0, 10, &v), "n.b = '-7'", "an integer in [0, 10]");
    const char *bad[] = {"x1", "x2", "x3", "x4", "x5", "x6"};
    for (size_t i = 0; i < FY_ARRAY_LEN(bad); i++) {
        char name[16];
        snprintf(name, sizeof(name), "n.%s = '", bad[i]);
        EXPECT_REFUSED(fy_config_int(c, "n", bad[i], 0, INT64_MIN, INT64_MAX, &v), name, "expected an integer");
        EXPECT_REFUSED(fy_config_int(c, "n", bad[i], 0, 1, INT64_MAX, &v), name, "expected an integer >= 1");
    }
    assert_int_equal(v, 5); /* untouched on error */
    fy_config_destroy(c);
}

static void test_double(void **state)
{
    fy_config_t *c = make("[d]\na = 1.5\nb = -2\nc = 1e3\ne = .5\n"
                          "x1 = nan\nx2 = inf\nx3 = 1.5x\nx4 = 0x1p3\nx5 =\nx6 = 1e999\nx7 = -inf\n");
    double v = 0;
    assert_int_equal(fy_config_double(c, "d", "a", 0, 0, 2, &v), FY_OK);
    assert_true(v == 1.5);
    assert_int_equal(fy_config_double(c, "d", "b", 0, -2, 2, &v), FY_OK);
    assert_true(v == -2);
    assert_int_equal(fy_config_double(c, "d", "c", 0, 0, 1e4, &v), FY_OK);
    assert_true(v == 1000);
    assert_int_equal(fy_config_double(c, "d", "e", 0, 0, 1, &v), FY_OK);
    assert_true(v == 0.5);
    assert_int_equal(fy_config_double(c, "d", "absent", 0.25, 0, 0.1, &v), FY_OK);
    assert_true(v == 0.25);
    EXPECT_REFUSED(fy_config_double(c, "d", "a", 0, 0, 1, &v), "d.a = '1.5'", "a number in [0, 1]");
    const char *bad[] = {"x1", "x2", "x3", "x4", "x5", "x6", "x7"};
    for (size_t i = 0; i < FY_ARRAY_LEN(bad); i++) {
        char name[16];
        snprintf(name, sizeof(name), "d.%s = '", bad[i]);
        EXPECT_REFUSED(fy_config_double(c, "d", bad[i], 0, -INFINITY, INFINITY, &v), name, "expected a finite number");
    }
    assert_true(v == 0.25);
    fy_config_destroy(c);
}

static void test_bool(void **state)
{
    fy_config_t *c = make("[b]\nt1 = true\nt2 = YES\nt3 = On\nt4 = 1\nf1 = false\nf2 = no\nf3 = OFF\nf4 = 0\n"
                          "x1 = 2\nx2 = yess\nx3 =\nx4 = t\n");
    const char *t[] = {"t1", "t2", "t3", "t4"}, *f[] = {"f1", "f2", "f3", "f4"};
    for (int i = 0; i < 4; i++) {
        bool v = false;
        assert_int_equal(fy_config_bool(c, "b", t[i], false, &v), FY_OK);
        assert_true(v);
        assert_int_equal(fy_config_bool(c, "b", f[i], true, &v), FY_OK);
        assert_false(v);
    }
    bool v = true;
    assert_int_equal(fy_config_bool(c, "b", "absent", false, &v), FY_OK);
    assert_false(v);
    const char *bad[] = {"x1", "x2", "x3", "x4"};
    for (size_t i = 0; i < FY_ARRAY_LEN(bad); i++) {
        char name[16];
        snprintf(name, sizeof(name), "b.%s = '", bad[i]);
        EXPECT_REFUSED(fy_config_bool(c, "b", bad[i], false, &v), name, "expected true or false");
    }
    fy_config_destroy(c);
}

static void test_size(void **state)
{
    fy_config_t *c = make("[s]\na = 4096\nb = 512M\nc = 50GiB\nd = 1.5Ki\ne = 2T\n"
                          "x1 = 12Q\nx2 = -1\nx3 =\nx4 = 5 G\n");
    int64_t v = 0;
    assert_int_equal(fy_config_size(c, "s", "a", 0, 0, INT64_MAX, &v), FY_OK);
    assert_int_equal(v, 4096);
    assert_int_equal(fy_config_size(c, "s", "b", 0, 0, INT64_MAX, &v), FY_OK);
    assert_int_equal(v, 512000000);
    assert_int_equal(fy_config_size(c, "s", "c", 0, 0, INT64_MAX, &v), FY_OK);
    assert_true(v == INT64_C(53687091200));
    assert_int_equal(fy_config_size(c, "s", "d", 0, 0, INT64_MAX, &v), FY_OK);
    assert_int_equal(v, 1536);
    assert_int_equal(fy_config_size(c, "s", "e", 0, 0, INT64_MAX, &v), FY_OK);
    assert_true(v == INT64_C(2000000000000));
    assert_int_equal(fy_config_size(c, "s", "absent", 7, 0, 1, &v), FY_OK);
    assert_int_equal(v, 7);
    EXPECT_REFUSED(fy_config_size(c, "s", "c", 0, 0, INT64_C(1) << 30, &v), "s.c = '50GiB'", "(t.ini:4)",
                   "a size in [0, 1073741824] bytes");
    const char *bad[] = {"x1", "x2", "x3", "x4"};
    for (size_t i = 0; i < FY_ARRAY_LEN(bad); i++) {
        char name[16];
        snprintf(name, sizeof(name), "s.%s", bad[i]);
        EXPECT_REFUSED(fy_config_size(c, "s", bad[i], 0, 0, INT64_MAX, &v), name, "is not a size");
    }
    assert_int_equal(v, 7);
    fy_config_destroy(c);
}

static void test_duration(void **state)
{
    fy_config_t *c = make("[t]\na = 250ms\nb = 2s\nc = 1.5m\nd = 3\ne = 1h\nf = 100us\ng = 0\nh = 2min\n"
                          "x1 = -1s\nx2 = 2 s\nx3 = 5x\nx4 = inf\nx5 =\nx6 = s\nx7 = 1e400s\nx8 = 0x10\n");
    struct {
        const char *key;
        double want;
    } ok[] = {{"a", 0.25}, {"b", 2}, {"c", 90}, {"d", 3}, {"e", 3600}, {"f", 1e-4}, {"g", 0}, {"h", 120}};
    for (size_t i = 0; i < FY_ARRAY_LEN(ok); i++) {
        double v = -1;
        assert_int_equal(fy_config_duration(c, "t", ok[i].key, 0, 0, 1e6, &v), FY_OK);
        if (fabs(v - ok[i].want) > 1e-12) fail_msg("t.%s: %g, not %g", ok[i].key, v, ok[i].want);
    }
    double v = -1;
    assert_int_equal(fy_config_duration(c, "t", "absent", 5, 0, 1, &v), FY_OK);
    assert_true(v == 5);
    EXPECT_REFUSED(fy_config_duration(c, "t", "b", 0, 0, 1, &v), "t.b = '2s'", "a duration in [0 s, 1 s]");
    EXPECT_REFUSED(fy_config_duration(c, "t", "a", 0, 0.5, 1, &v), "t.a = '250ms'", "a duration in [0.5 s, 1 s]");
    const char *bad[] = {"x1", "x2", "x3", "x4", "x5", "x6", "x7", "x8"};
    for (size_t i = 0; i < FY_ARRAY_LEN(bad); i++) {
        char name[16];
        snprintf(name, sizeof(name), "t.%s = '", bad[i]);
        EXPECT_REFUSED(fy_config_duration(c, "t", bad[i], 0, 0, INFINITY, &v), name, "expected a duration of at least 0 s");
    }
    assert_true(v == 5);
    fy_config_destroy(c);
}

static void test_string(void **state)
{
    fy_config_t *c = make("[s]\nname = decode-1\nempty =\n");
    const char *v = NULL;
    assert_int_equal(fy_config_string(c, "s", "name", "x", &v), FY_OK);
    assert_string_equal(v, "decode-1");
    assert_int_equal(fy_config_string(c, "s", "empty", "x", &v), FY_OK);
    assert_string_equal(v, "");
    assert_int_equal(fy_config_string(c, "s", "absent", "dflt", &v), FY_OK);
    assert_string_equal(v, "dflt");
    assert_int_equal(fy_config_string(c, "s", "absent", NULL, &v), FY_OK);
    assert_null(v);
    fy_config_destroy(c);
}

static void test_unknown_keys(void **state)
{
    fy_config_t *c = make("[router]\nport = 1\nprot = 2\n[prefill]\nthreads = 4\nanything = 5\n[routr]\nhost = x\n"
                          "[zzz]\nqqqqqqq = 1\n");
    assert_int_equal(fy_config_set(c, "decode.max_bach=8"), FY_OK);
    static const char *const known[] = {"router.port", "router.host", "prefill.*", "decode.max_batch"};
    fy_test_log_begin();
    assert_int_equal(fy_config_check_known(c, known, 4), FY_ERR_INVALID);
    assert_true(fy_test_log_has("unknown key 'router.prot'", "(t.ini:3)", "did you mean 'router.port'", NULL));
    assert_true(fy_test_log_has("unknown key 'routr.host'", "(t.ini:8)", "did you mean 'router.host'", NULL));
    assert_true(fy_test_log_has("unknown key 'decode.max_bach'", "(--set)", "did you mean 'decode.max_batch'", NULL));
    assert_true(fy_test_log_has("unknown key 'zzz.qqqqqqq'", "(t.ini:10)", NULL));
    assert_false(fy_test_log_has("zzz.qqqqqqq", "did you mean", NULL));
    assert_false(fy_test_log_has("prefill.", NULL));
    assert_false(fy_test_log_has("unknown key 'router.port'", NULL));
    fy_test_log_end();
    /* all known: fine; a wildcard covers a whole section but not a prefix of it */
    fy_config_t *d = make("[router]\nport = 1\n[prefill]\nx = 1\n");
    assert_int_equal(fy_config_check_known(d, known, 4), FY_OK);
    assert_int_equal(fy_config_set(d, "prefill.0.x=1"), FY_OK);
    fy_test_log_begin();
    assert_int_equal(fy_config_check_known(d, known, 4), FY_ERR_INVALID);
    assert_true(fy_test_log_has("unknown key 'prefill.0.x'", "(--set)", NULL));
    fy_test_log_end();
    fy_config_destroy(d);
    fy_config_destroy(c);
}

/* A load that must fail with status want and an error naming where. */
static void expect_bad_file(const char *text, fy_status_t want, const char *where, const char *msg)
{
    fy_config_t *c = make("[keep]\nme = 1\n");
    fy_test_log_begin();
    fy_status_t st = fy_config_load_string(c, text, "bad.ini");
    bool has = fy_test_log_has("config: ", where, msg, NULL);
    fy_test_log_end();
    if (st != want || !has) fail_msg("expected %d and '%s' '%s'; got %d, log:\n%s", want, where, msg, st,
                                     fy_test_log_text());
    /* a file merges whole or not at all */
    assert_int_equal(fy_config_count(c), 1);
    assert_string_equal(fy_config_get(c, "keep", "me"), "1");
    fy_config_destroy(c);
}

static void test_malformed(void **state)
{
    expect_bad_file("[a]\nx = 1\n[b\ny = 2\n", FY_ERR_FORMAT, "bad.ini:3:", "section header without ']': '[b'");
    expect_bad_file("[a]\nx = 1\njust words\n", FY_ERR_FORMAT, "bad.ini:3:", "expected 'key = value': 'just words'");
    expect_bad_file("[a]\nx ; = 1\n", FY_ERR_FORMAT, "bad.ini:2:", "expected 'key = value'");
    expect_bad_file("x = 1\n", FY_ERR_FORMAT, "bad.ini:1:", "key 'x' comes before any [section]");
    expect_bad_file("[a]\nhost:port = 1\n", FY_ERR_FORMAT, "bad.ini:2:", "'key: value' is not accepted");
    expect_bad_file("[a]\nx = 1\ny = 2\nx = 3\n", FY_ERR_FORMAT, "bad.ini:4:", "'a.x' is set twice (first at bad.ini:2)");
    expect_bad_file("[a]\n= 1\n", FY_ERR_FORMAT, "bad.ini:2:", "a value without a key");
    expect_bad_file("[a]\nx y = 1\n", FY_ERR_FORMAT, "bad.ini:2:", "'x y' is not a valid key");
    expect_bad_file("[a b]\nx = 1\n", FY_ERR_FORMAT, "bad.ini:2:", "section '[a b]', which is not a valid name");
    expect_bad_file("[a..b]\nx = 1\n", FY_ERR_FORMAT, "bad.ini:2:", "not a valid name");
    expect_bad_file("[aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa]\nx = 1\n",
                    FY_ERR_FORMAT, "bad.ini:2:", "longer than 48 bytes");
    char key[FY_CONFIG_MAX_KEY + 16];
    snprintf(key, sizeof(key), "[a]\n%0*d = 1\n", FY_CONFIG_MAX_KEY + 1, 0);
    expect_bad_file(key, FY_ERR_FORMAT, "bad.ini:2:", "key longer than 64 bytes");
    /* the syntax error on line 2 comes before the duplicate on line 4 */
    expect_bad_file("[a]\n[b\nx = 1\nx = 2\n", FY_ERR_FORMAT, "bad.ini:2:", "without ']'");

    /* huge lines: refused, never split into two lines */
    size_t n = 100000;
    char *huge = fy_malloc(n + 64);
    assert_non_null(huge);
    int off = snprintf(huge, 64, "[a]\nok = 1\nk = ");
    memset(huge + off, 'v', n);
    strcpy(huge + off + n, "=x\n");
    expect_bad_file(huge, FY_ERR_FORMAT, "bad.ini:3:", "line longer than 196 bytes");
    /* the longest line that fits is accepted */
    snprintf(huge, n, "[a]\nk = %0*d\n", FY_CONFIG_MAX_LINE - 4, 7);
    fy_config_t *c = make(huge);
    assert_int_equal(strlen(fy_config_get(c, "a", "k")), FY_CONFIG_MAX_LINE - 4);
    fy_config_destroy(c);
    fy_free(huge);

    /* binary garbage */
    expect_bad_file("[a]\nx = 1\ny = \x01\x02\n", FY_ERR_FORMAT, "bad.ini:3:", "a control character (byte 0x01) at column 5");
    expect_bad_file("[a]\nx = \xc3\x28\n", FY_ERR_FORMAT, "bad.ini:2:", "invalid UTF-8 (byte 0xc3) at column 5");
    expect_bad_file("[a]\nx = \xed\xa0\x80\n", FY_ERR_FORMAT, "bad.ini:2:", "invalid UTF-8");  /* a surrogate */
    expect_bad_file("[a]\nx = \xc0\xaf\n", FY_ERR_FORMAT, "bad.ini:2:", "invalid UTF-8");      /* overlong */
    expect_bad_file("[a]\nx = 1\ry = 2\n", FY_ERR_FORMAT, "bad.ini:2:", "control character");
    fy_config_t *u = make("[a]\nname = caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\n");
    assert_string_equal(fy_config_get(u, "a", "name"), "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
    fy_config_destroy(u);

    /* a NUL inside a file, through a real file */
    const char nul[] = "[a]\nx = 1\ny = a\0b\n";
    const char *path = fy_test_path("nul.ini");
    assert_true(fy_test_write_file(path, nul, sizeof(nul) - 1));
    c = make(NULL);
    fy_test_log_begin();
    assert_int_equal(fy_config_load(c, path), FY_ERR_FORMAT);
    assert_true(fy_test_log_has(path, ":3:", "a NUL byte at column 6", NULL));
    fy_test_log_end();
    assert_int_equal(fy_config_count(c), 0);

    /* random bytes: an error or a parse, never a crash, and errors name a line */
    uint64_t seed = 20240611;
    char buf[512];
    for (int iter = 0; iter < 2000; iter++) {
        size_t len = (size_t)(fy_test_rand_u64(&seed) % (sizeof(buf) - 1));
        bool printable = iter % 2;
        for (size_t i = 0; i < len; i++) {
            uint64_t r = fy_test_rand_u64(&seed);
            buf[i] = printable ? "[]=;: \n\tab.c#"[r % 14] : (char)(r % 255 + 1);
        }
        buf[len] = '\0';
        fy_test_log_begin();
        fy_status_t st = fy_config_load_string(c, buf, "rand.ini");
        bool named = fy_test_log_has("config: rand.ini:", NULL);
        fy_test_log_end();
        if (st != FY_OK && (st != FY_ERR_FORMAT || !named))
            fail_msg("seed state %llu iter %d: status %d log %s", (unsigned long long)seed, iter, st,
                     fy_test_log_text());
    }
    fy_config_destroy(c);
}

static void test_limits_and_files(void **state)
{
    /* too many entries, in one file and in all */
    size_t cap = (size_t)(FY_CONFIG_MAX_ENTRIES + 2) * 16 + 16;
    char *text = fy_malloc(cap);
    assert_non_null(text);
    size_t len = (size_t)snprintf(text, cap, "[a]\n");
    for (int i = 0; i <= FY_CONFIG_MAX_ENTRIES; i++) len += (size_t)snprintf(text + len, cap - len, "k%d = 1\n", i);
    expect_bad_file(text, FY_ERR_FORMAT, "bad.ini:4098:", "more than 4096 entries");
    len = (size_t)snprintf(text, cap, "[a]\n");
    for (int i = 0; i < FY_CONFIG_MAX_ENTRIES; i++) len += (size_t)snprintf(text + len, cap - len, "k%d = 1\n", i);
    fy_config_t *c = make(text);
    assert_int_equal(fy_config_count(c), FY_CONFIG_MAX_ENTRIES);
    fy_test_log_begin();
    assert_int_equal(fy_config_load_string(c, "[b]\nx = 1\n", "more.ini"), FY_ERR_FORMAT);
    assert_true(fy_test_log_has("more.ini", "more than 4096 entries", NULL));
    assert_int_equal(fy_config_set(c, "b.x=1"), FY_ERR_INVALID);
    assert_true(fy_test_log_has("--set b.x", "more than 4096 entries", NULL));
    fy_test_log_end();
    assert_int_equal(fy_config_set(c, "a.k7=2"), FY_OK); /* replacing is fine */
    fy_config_destroy(c);
    fy_free(text);

    /* files: missing, a directory, too large, and a good one */
    c = make(NULL);
    fy_test_log_begin();
    assert_int_equal(fy_config_load(c, fy_test_path("missing.ini")), FY_ERR_NOT_FOUND);
    assert_true(fy_test_log_has("missing.ini", "cannot open", "No such file", NULL));
    assert_int_equal(fy_config_load(c, fy_test_tmpdir()), FY_ERR_IO);
    assert_true(fy_test_log_has("cannot read", "Is a directory", NULL));
    fy_test_log_end();
    size_t big = (size_t)FY_CONFIG_MAX_FILE + 10;
    char *blob = fy_malloc(big);
    assert_non_null(blob);
    memset(blob, '\n', big);
    const char *bigpath = fy_test_path("big.ini");
    assert_true(fy_test_write_file(bigpath, blob, big));
    fy_test_log_begin();
    assert_int_equal(fy_config_load(c, bigpath), FY_ERR_FORMAT);
    assert_true(fy_test_log_has("big.ini", "larger than 1048576 bytes", NULL));
    blob[big - 1] = '\0';
    assert_int_equal(fy_config_load_string(c, blob, "big"), FY_ERR_FORMAT);
    assert_true(fy_test_log_has("big", "larger than", NULL));
    fy_test_log_end();
    fy_free(blob);
    const char *good = fy_test_path("good.ini");
    const char text2[] = "[router]\nport = 9000\n";
    assert_true(fy_test_write_file(good, text2, strlen(text2)));
    assert_int_equal(fy_config_load(c, good), FY_OK);
    assert_string_equal(fy_config_get(c, "router", "port"), "9000");
    char origin[1100];
    snprintf(origin, sizeof(origin), "%s:2", good);
    assert_string_equal(fy_config_origin(c, "router", "port"), origin);
    fy_config_destroy(c);
}

static void test_write_roundtrip(void **state)
{
    fy_config_t *c = make("[router]\nport = 8080\nurl = tcp://h:1/x?a=b\n[prefill.0]\nthreads = 4\n"
                          "[router]\nnote = caf\xc3\xa9 # not a comment\n[empty]\n");
    assert_int_equal(fy_config_set(c, "decode.kv_mem=50GiB"), FY_OK);
    assert_int_equal(fy_config_set(c, "router.port=9090"), FY_OK);
    assert_int_equal(fy_config_set(c, "prefill.0.model=a=b;c\td"), FY_OK);
    assert_int_equal(fy_config_set(c, "decode.blank="), FY_OK);
    const char *path = fy_test_path("written.ini");
    assert_int_equal(fy_config_write(c, path), FY_OK);
    fy_config_t *d = make(NULL);
    assert_int_equal(fy_config_load(d, path), FY_OK);
    assert_int_equal(fy_config_count(d), fy_config_count(c));
    static const char *const keys[][2] = {
        {"router", "port"}, {"router", "url"},    {"router", "note"},     {"prefill.0", "threads"},
        {"prefill.0", "model"}, {"decode", "kv_mem"}, {"decode", "blank"},
    };
    assert_int_equal(fy_config_count(c), (int)FY_ARRAY_LEN(keys));
    for (size_t i = 0; i < FY_ARRAY_LEN(keys); i++)
        assert_string_equal(fy_config_get(d, keys[i][0], keys[i][1]), fy_config_get(c, keys[i][0], keys[i][1]));
    /* sections come out once each, in the order first seen */
    char *out = fy_test_read_file(path, NULL);
    assert_non_null(out);
    char *r = strstr(out, "[router]"), *p = strstr(out, "[prefill.0]"), *dd = strstr(out, "[decode]");
    assert_true(r && p && dd && r < p && p < dd);
    assert_null(strstr(r + 1, "[router]"));
    fy_free(out);
    /* a second write replaces the file */
    assert_int_equal(fy_config_set(c, "router.port=1"), FY_OK);
    assert_int_equal(fy_config_write(c, path), FY_OK);
    fy_config_destroy(d);
    d = make(NULL);
    assert_int_equal(fy_config_load(d, path), FY_OK);
    assert_string_equal(fy_config_get(d, "router", "port"), "1");
    /* unwritable: an error naming the path, and no file left behind */
    fy_test_log_begin();
    assert_int_equal(fy_config_write(c, "/nonexistent-dir/x.ini"), FY_ERR_IO);
    assert_true(fy_test_log_has("/nonexistent-dir/x.ini", "No such file", NULL));
    fy_test_log_end();
    fy_config_destroy(d);
    fy_config_destroy(c);
}

/* A value that starts with ';' straight after '=' is a value (a comment
 * needs a blank before its ';'); fy_config_write wrote "key = ;..." and
 * the reload read an empty value, so ferry serve's children saw another
 * configuration than the file (fuzz_config found it). */
static void test_write_leading_semicolon(void **state)
{
    (void)state;
    fy_config_t *c = make("[kv]\ndtype =; not a comment\nx=;\ny = ok ; a comment\n");
    assert_string_equal(fy_config_get(c, "kv", "dtype"), "; not a comment");
    assert_string_equal(fy_config_get(c, "kv", "x"), ";");
    assert_string_equal(fy_config_get(c, "kv", "y"), "ok");
    const char *path = fy_test_path("semicolon.ini");
    assert_int_equal(fy_config_write(c, path), FY_OK);
    fy_config_t *d = make(NULL);
    assert_int_equal(fy_config_load(d, path), FY_OK);
    assert_int_equal(fy_config_count(d), 3);
    assert_string_equal(fy_config_get(d, "kv", "dtype"), "; not a comment");
    assert_string_equal(fy_config_get(d, "kv", "x"), ";");
    assert_string_equal(fy_config_get(d, "kv", "y"), "ok");
    fy_config_destroy(d);
    fy_config_destroy(c);
}

/* Every allocation in turn fails: each call returns FY_OK or FY_ERR_NOMEM,
 * a failed load or set leaves the configuration as it was, and nothing
 * leaks (ASan's leak check runs at exit). */
static void test_alloc_failure(void **state)
{
    const char *text = "[router]\nport = 8080\nhost = x\n[prefill.0]\nthreads = 4\n[decode]\nkv_mem = 1G\n";
    const char *path = fy_test_path("alloc.ini");
    static const char *const known[] = {"router.*", "prefill.0.threads", "decode.kv_mem", "decode.extra"};
    bool completed = false;
    fy_test_log_begin();
    for (long n = 1; n < 500 && !completed; n++) {
        fy_mem_fail_after(n);
        fy_config_t *c = NULL;
        fy_status_t st = fy_config_create(&c);
        if (st != FY_OK) {
            assert_int_equal(st, FY_ERR_NOMEM);
            assert_null(c);
            continue;
        }
        int steps = 0;
        st = fy_config_load_string(c, text, "a.ini");
        if (st == FY_OK) steps++;
        else {
            assert_int_equal(st, FY_ERR_NOMEM);
            assert_int_equal(fy_config_count(c), 0);
        }
        st = fy_config_set(c, "decode.extra=1");
        if (st == FY_OK) steps++;
        else {
            assert_int_equal(st, FY_ERR_NOMEM);
            assert_null(fy_config_get(c, "decode", "extra"));
        }
        st = fy_config_set(c, "router.port=1");
        if (st == FY_OK) steps++;
        else assert_int_equal(st, FY_ERR_NOMEM);
        if (fy_config_write(c, path) == FY_OK) {
            steps++;
            int before = fy_config_count(c);
            st = fy_config_load(c, path);
            if (st == FY_OK) steps++;
            else assert_int_equal(st, FY_ERR_NOMEM);
            assert_int_equal(fy_config_count(c), before);
        }
        assert_int_equal(fy_config_check_known(c, known, 4), FY_OK);
        int64_t v;
        assert_int_equal(fy_config_size(c, "decode", "kv_mem", 0, 0, INT64_MAX, &v), FY_OK);
        fy_config_destroy(c);
        completed = steps == 5;
    }
    fy_mem_fail_after(0);
    fy_test_log_end();
    assert_true(completed);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),          cmocka_unit_test(test_merge_order),
        cmocka_unit_test(test_set_errors),     cmocka_unit_test(test_int),
        cmocka_unit_test(test_double),         cmocka_unit_test(test_bool),
        cmocka_unit_test(test_size),           cmocka_unit_test(test_duration),
        cmocka_unit_test(test_string),         cmocka_unit_test(test_unknown_keys),
        cmocka_unit_test(test_malformed),      cmocka_unit_test(test_limits_and_files),
        cmocka_unit_test(test_write_roundtrip), cmocka_unit_test(test_write_leading_semicolon),
        cmocka_unit_test(test_alloc_failure),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    fy_test_tmpdir_remove();
    return rc;
}

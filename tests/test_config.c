/*
 * test_config.c - INI configuration: parsing, merge order, --set, every
 * typed getter's accepted and refused values, unknown keys, malformed and
 * hostile files, allocation failure, and write + reload.  The key table
 * (confkeys.c): every row sound (its default parses and lies in its
 * range), reads through it, the check with its suggestions, every file in
 * configs/ clean against it, docs/operations.md's key reference equal to
 * what it generates and every key the docs name in it; and `ferry config`
 * (printing, --check, --markdown, exit statuses), where bin/ferry is built.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/cluster.h"
#include "common/config.h"
#include "common/cpuset.h"
#include "common/mem.h"
#include "tests/testutil.h"

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
#define EXPECT_REFUSED(call, ...)                                                                                      \
    do {                                                                                                               \
        fy_test_log_begin();                                                                                           \
        fy_status_t st_ = (call);                                                                                      \
        bool has_ = fy_test_log_has(__VA_ARGS__, NULL);                                                                \
        fy_test_log_end();                                                                                             \
        if (st_ != FY_ERR_INVALID || !has_) fail_msg("%s: status %d, log:\n%s", #call, st_, fy_test_log_text());       \
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
        EXPECT_REFUSED(fy_config_duration(c, "t", bad[i], 0, 0, INFINITY, &v), name,
                       "expected a duration of at least 0 s");
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
    if (st != want || !has)
        fail_msg("expected %d and '%s' '%s'; got %d, log:\n%s", want, where, msg, st, fy_test_log_text());
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
    expect_bad_file("[a]\nx = 1\ny = 2\nx = 3\n", FY_ERR_FORMAT,
                    "bad.ini:4:", "'a.x' is set twice (first at bad.ini:2)");
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
    expect_bad_file("[a]\nx = 1\ny = \x01\x02\n", FY_ERR_FORMAT,
                    "bad.ini:3:", "a control character (byte 0x01) at column 5");
    expect_bad_file("[a]\nx = \xc3\x28\n", FY_ERR_FORMAT, "bad.ini:2:", "invalid UTF-8 (byte 0xc3) at column 5");
    expect_bad_file("[a]\nx = \xed\xa0\x80\n", FY_ERR_FORMAT, "bad.ini:2:", "invalid UTF-8"); /* a surrogate */
    expect_bad_file("[a]\nx = \xc0\xaf\n", FY_ERR_FORMAT, "bad.ini:2:", "invalid UTF-8");     /* overlong */
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
        {"router", "port"},     {"router", "url"},    {"router", "note"},  {"prefill.0", "threads"},
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

/* A file may hold "key=value" on a line of the full length: written back
 * with blanks around the '=' it would be too long to read, so it is
 * written without them (serve's cluster.ini, `ferry config`'s output). */
static void test_write_full_line(void **state)
{
    char text[FY_CONFIG_MAX_LINE + 32], value[FY_CONFIG_MAX_LINE];
    memset(value, 'x', FY_CONFIG_MAX_LINE - 5);
    value[FY_CONFIG_MAX_LINE - 5] = '\0';
    value[0] = '/'; /* absolute: a relative path would be resolved, and grow */
    snprintf(text, sizeof(text), "[model]\npath=%s\n", value); /* "path=" + value: a full line */
    fy_config_t *c = make(text);
    const char *path = fy_test_path("full.ini");
    assert_int_equal(fy_config_write(c, path), FY_OK);
    fy_config_t *d = make(NULL);
    assert_int_equal(fy_config_load(d, path), FY_OK);
    assert_string_equal(fy_config_get(d, "model", "path"), value);
    fy_config_destroy(d);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    fy_conf_print(c, f);
    fclose(f);
    d = make(NULL);
    assert_int_equal(fy_config_load_string(d, buf, "printed"), FY_OK);
    assert_string_equal(fy_config_get(d, "model", "path"), value);
    assert_non_null(strstr(buf, "; path: t.ini:2\n")); /* the origin on a line of its own */
    free(buf);
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
        if (st == FY_OK)
            steps++;
        else {
            assert_int_equal(st, FY_ERR_NOMEM);
            assert_int_equal(fy_config_count(c), 0);
        }
        st = fy_config_set(c, "decode.extra=1");
        if (st == FY_OK)
            steps++;
        else {
            assert_int_equal(st, FY_ERR_NOMEM);
            assert_null(fy_config_get(c, "decode", "extra"));
        }
        st = fy_config_set(c, "router.port=1");
        if (st == FY_OK)
            steps++;
        else
            assert_int_equal(st, FY_ERR_NOMEM);
        if (fy_config_write(c, path) == FY_OK) {
            steps++;
            int before = fy_config_count(c);
            st = fy_config_load(c, path);
            if (st == FY_OK)
                steps++;
            else
                assert_int_equal(st, FY_ERR_NOMEM);
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

/* ---- the key table (confkeys.c) ----------------------------------------------------------------- */

static bool name_ok(const char *s)
{
    if (!*s) return false;
    for (; *s; s++)
        if (!islower((unsigned char)*s) && !isdigit((unsigned char)*s) && *s != '_') return false;
    return true;
}

/* Every row: a valid, unique name, one line of help, and a default that
 * the key's own reader takes (parses, lies in the range, is a choice). */
static void test_table(void **state)
{
    int n;
    const fy_conf_key_t *keys = fy_conf_keys(&n);
    assert_true(n > 50);
    for (int i = 0; i < n; i++) {
        const fy_conf_key_t *k = &keys[i];
        char name[128];
        snprintf(name, sizeof(name), "%s.%s", k->section, k->key);
        if (!name_ok(k->section) || !name_ok(k->key)) fail_msg("%s: not a plain lowercase name", name);
        for (int j = 0; j < i; j++)
            if (!strcmp(keys[j].section, k->section) && !strcmp(keys[j].key, k->key)) fail_msg("%s: twice", name);
        assert_ptr_equal(fy_conf_key(k->section, k->key), k);
        if (!k->help || strlen(k->help) < 10 || strchr(k->help, '\n') || strchr(k->help, '|'))
            fail_msg("%s: the help must be one line without '|' (a Markdown table cell)", name);
        if (k->def_from) {
            char sec[64];
            const char *dot = strchr(k->def_from, '.');
            assert_non_null(dot);
            snprintf(sec, sizeof(sec), "%.*s", (int)(dot - k->def_from), k->def_from);
            const fy_conf_key_t *o = fy_conf_key(sec, dot + 1);
            if (!o || o->type != k->type || o->def_from || k->def)
                fail_msg("%s: its default must be a key of its type with a default of its own", name);
        }
        fy_status_t st = FY_OK;
        double v = 0;
        int64_t i64;
        bool b;
        const char *str;
        int idx;
        switch (k->type) {
        case FY_CONF_STRING:
            if (k->choices || k->lo || k->hi) fail_msg("%s: a string has no range", name);
            st = fy_conf_string(NULL, k->section, k->key, &str);
            if (!st && str != k->def) fail_msg("%s: the default read is not the table's", name);
            continue;
        case FY_CONF_ENUM:
            if (!k->choices || !k->def || k->lo || k->hi) fail_msg("%s: an enum needs choices and a default", name);
            st = fy_conf_enum(NULL, k->section, k->key, &idx);
            if (!st) st = fy_conf_string(NULL, k->section, k->key, &str);
            if (st || strcmp(str, k->def)) fail_msg("%s: default '%s' is not one of %s", name, k->def, k->choices);
            continue;
        case FY_CONF_BOOL:
            st = fy_conf_bool(NULL, k->section, k->key, &b);
            if (st || !k->def) fail_msg("%s: default '%s' is not true or false", name, k->def ? k->def : "(unset)");
            continue;
        case FY_CONF_INT:
            st = fy_conf_int(NULL, k->section, k->key, &i64);
            v = (double)i64;
            break;
        case FY_CONF_SIZE:
            st = fy_conf_size(NULL, k->section, k->key, &i64);
            v = (double)i64;
            break;
        case FY_CONF_FLOAT: st = fy_conf_float(NULL, k->section, k->key, &v); break;
        case FY_CONF_DURATION: st = fy_conf_duration(NULL, k->section, k->key, &v); break;
        }
        if (st) fail_msg("%s: default '%s' does not parse as a %s", name, k->def, fy_conf_type_str(k->type));
        if (!(k->lo <= k->hi) || v < k->lo || v > k->hi)
            fail_msg("%s: default %g outside its range [%g, %g]", name, v, k->lo, k->hi);
        if (k->choices) { /* an INT from a fixed set: each choice in range, the default one of them */
            assert_int_equal(k->type, FY_CONF_INT);
            char def[32];
            snprintf(def, sizeof(def), "%lld", (long long)i64);
            bool found = false;
            for (const char *s = k->choices; *s;) {
                size_t len = strcspn(s, "|");
                long long x = strtoll(s, NULL, 10);
                if (x < k->lo || x > k->hi) fail_msg("%s: choice %lld outside [%g, %g]", name, x, k->lo, k->hi);
                found |= len == strlen(def) && !strncmp(s, def, len);
                s += len + (s[len] == '|');
            }
            if (!found) fail_msg("%s: default %s is not one of %s", name, def, k->choices);
        }
    }
    assert_null(fy_conf_key("router", "nope"));
    assert_null(fy_conf_key("nope", "listen"));
    assert_string_equal(fy_conf_default("router", "listen"), "tcp://127.0.0.1:7400");
    assert_null(fy_conf_default("kv", "secret_file")); /* unset by default */
    assert_null(fy_conf_default("router", "nope"));
}

static void test_conf_read(void **state)
{
    fy_config_t *c = make("[router]\nlease = 5s\nretries = 11\nhttp =\n[kv]\nblock_size = 12\ndtype = int8\n"
                          "[decode]\npreempt = later\n");
    double d;
    int64_t v;
    const char *s;
    int idx;
    /* the file's value, else the table's default, else (def_from) another key's */
    assert_int_equal(fy_conf_duration(c, "router", "lease", &d), FY_OK);
    assert_true(d == 5);
    assert_int_equal(fy_conf_duration(c, "router", "health_timeout", &d), FY_OK);
    assert_true(d == 2);
    assert_int_equal(fy_conf_duration(c, "decode", "max_lease", &d), FY_OK);
    assert_true(d == 5); /* router.lease */
    assert_int_equal(fy_conf_duration(NULL, "decode", "max_lease", &d), FY_OK);
    assert_true(d == 30);
    assert_int_equal(fy_config_set(c, "decode.max_lease=750ms"), FY_OK);
    assert_int_equal(fy_conf_duration(c, "decode", "max_lease", &d), FY_OK);
    assert_true(d == 0.75);
    assert_int_equal(fy_conf_string(c, "router", "http", &s), FY_OK);
    assert_string_equal(s, "");
    assert_int_equal(fy_conf_string(c, "router", "listen", &s), FY_OK);
    assert_string_equal(s, "tcp://127.0.0.1:7400");
    assert_int_equal(fy_conf_string(c, "kv", "secret_file", &s), FY_OK);
    assert_null(s);
    /* copied into a typed struct: unset is "", a value that does not fit is refused naming the key */
    char buf[FY_CONFIG_MAX_LINE + 1] = "x";
    assert_int_equal(fy_conf_copy(c, "kv", "secret_file", buf, sizeof(buf)), FY_OK);
    assert_string_equal(buf, "");
    assert_int_equal(fy_conf_copy(c, "router", "listen", buf, sizeof(buf)), FY_OK);
    assert_string_equal(buf, "tcp://127.0.0.1:7400");
    EXPECT_REFUSED(fy_conf_copy(c, "router", "listen", buf, 20), "router.listen: 20 bytes; at most 19 fit here");
    EXPECT_REFUSED(fy_conf_copy(c, "decode", "preempt", buf, sizeof(buf)), "expected recompute or swap");
    assert_int_equal(fy_conf_size(NULL, "decode", "kv_mem", &v), FY_OK);
    assert_int_equal(v, 256 << 20);
    assert_int_equal(fy_conf_enum(c, "kv", "dtype", &idx), FY_OK);
    assert_int_equal(idx, 3);
    /* out of range, not a choice: named, with the origin and what is allowed */
    EXPECT_REFUSED(fy_conf_int(c, "router", "retries", &v), "router.retries = '11' (t.ini:3)", "an integer in [0, 10]");
    EXPECT_REFUSED(fy_conf_int(c, "kv", "block_size", &v), "kv.block_size = '12' (t.ini:6)", "expected 8, 16 or 32");
    EXPECT_REFUSED(fy_conf_enum(c, "decode", "preempt", &idx), "decode.preempt = 'later' (t.ini:9)",
                   "expected recompute or swap");
    EXPECT_REFUSED(fy_conf_string(c, "decode", "preempt", &s), "expected recompute or swap");
    assert_int_equal(fy_config_set(c, "router.lease=2h"), FY_OK);
    assert_int_equal(fy_config_set(c, "decode.max_lease=x"), FY_OK);
    EXPECT_REFUSED(fy_conf_duration(c, "decode", "max_lease", &d), "decode.max_lease = 'x' (--set)",
                   "a duration in [0.1 s, 3600 s]");
    assert_int_equal(fy_config_set(c, "decode.max_lease=1s"), FY_OK);
    assert_int_equal(fy_config_set(c, "router.lease=forever"), FY_OK);
    assert_int_equal(fy_conf_duration(c, "decode", "max_lease", &d), FY_OK); /* set: router.lease not needed */
    /* reading a key the table lacks, or as another type, is a bug: said so */
    fy_test_log_begin();
    assert_int_equal(fy_conf_int(c, "router", "nope", &v), FY_ERR_INTERNAL);
    assert_int_equal(fy_conf_int(c, "router", "lease", &v), FY_ERR_INTERNAL);
    assert_int_equal(fy_conf_enum(c, "router", "listen", &idx), FY_ERR_INTERNAL);
    fy_test_log_end();
    assert_true(fy_test_log_has("router.nope is read but is not in the key table", NULL));
    assert_true(fy_test_log_has("router.lease is of type duration in the key table, but read as int", NULL));
    fy_config_destroy(c);
    /* kv.dtype's choices are dtype names */
    static const char *const dtypes[] = {"f16", "f32", "fp8", "int8"};
    for (int i = 0; i < 4; i++) {
        char set[32];
        snprintf(set, sizeof(set), "kv.dtype=%s", dtypes[i]);
        fy_config_t *k = make(NULL);
        assert_int_equal(fy_config_set(k, set), FY_OK);
        int32_t bs;
        fy_dtype_t dt;
        assert_int_equal(fy_cluster_kv(k, &bs, &dt), FY_OK);
        assert_string_equal(fy_dtype_name(dt), dtypes[i]);
        assert_int_equal(bs, 16);
        fy_config_destroy(k);
    }
}

static void test_conf_check(void **state)
{
    fy_config_t *c = make("[decode]\nkvmem = 1G\nmax_batch = 4\nthreads = 3000\n[router]\nthreads = 2\nlease = 5x\n"
                          "[zzz]\nqqqqqqq = 1\n[prefill]\nhost_kv_mem = 1G\n[kv]\nblock_size = 32\n");
    fy_test_log_begin();
    assert_int_equal(fy_conf_check(c, false), FY_ERR_INVALID);
    fy_test_log_end();
    assert_true(fy_test_log_has("unknown key 'decode.kvmem' (t.ini:2); did you mean 'decode.kv_mem'?", NULL));
    assert_true(
        fy_test_log_has("unknown key 'decode.max_batch' (t.ini:3); did you mean 'decode.max_batch_tokens'?", NULL));
    assert_true(fy_test_log_has("unknown key 'router.threads' (t.ini:6); did you mean 'prefill.threads'?", NULL));
    assert_true(
        fy_test_log_has("unknown key 'prefill.host_kv_mem' (t.ini:11); did you mean 'decode.host_kv_mem'?", NULL));
    assert_true(fy_test_log_has("unknown section 'zzz' (t.ini:9, 1 key)", NULL));
    assert_false(fy_test_log_has("zzz", "did you mean", NULL));
    assert_false(fy_test_log_has("3000", NULL)); /* values are not looked at */
    fy_test_log_begin();
    assert_int_equal(fy_conf_check(c, true), FY_ERR_INVALID);
    fy_test_log_end();
    assert_true(fy_test_log_has("decode.threads = '3000' (t.ini:4): expected an integer in [0, 256]", NULL));
    assert_true(fy_test_log_has("router.lease = '5x' (t.ini:7): expected a duration in [0.1 s, 3600 s]", NULL));
    assert_false(fy_test_log_has("block_size", NULL));
    fy_config_destroy(c);
    c = make("[kv]\nblock_size = 8\n[decode]\nspec = self:4\n[router]\nlease = 1m\n");
    fy_test_log_begin();
    assert_int_equal(fy_conf_check(c, true), FY_OK);
    fy_test_log_end();
    assert_string_equal(fy_test_log_text(), "");
    fy_config_destroy(c);
}

/* A misspelt section is one line naming it and the nearest section, not
 * one "unknown key" line for each of its keys (a [decod] of 18 keys gave
 * 18); a section nothing is near is one line too, and keys of known
 * sections are still reported one by one. */
static void test_unknown_section(void **state)
{
    fy_config_t *c = make("[decod]\ncount = 2\nlisten = tcp://127.0.0.1:7420\nthreads = 1\nkv_mem = 256MiB\n"
                          "max_seqs = 32\nmax_batch_tokens = 256\npreempt = recompute\nspec = ngram\nspec_k = 8\n"
                          "spec_ngram_max = 3\nspec_lookup = suffix\nspec_history = 0\nspec_min_accept = 0.3\n"
                          "spec_probe_steps = 64\nspec_batch_tokens = 64\nspec_sampled = false\n"
                          "spec_draft_kv_fraction = 0.25\nmetrics = http://127.0.0.1:7520\n"
                          "[qqqqqqqq]\na = 1\nb = 2\n[router]\nlisen = x\n");
    assert_int_equal(fy_config_set(c, "decod.ctx=4"), FY_OK);
    fy_test_log_begin();
    assert_int_equal(fy_conf_check(c, true), FY_ERR_INVALID);
    fy_test_log_end();
    const char *log = fy_test_log_text();
    int lines = 0;
    for (const char *p = log; (p = strstr(p, "decod")); p++) lines += p[5] == '\'' || p[5] == '.';
    if (lines != 1) fail_msg("%d mentions of 'decod', expected 1 line:\n%s", lines, log);
    assert_true(fy_test_log_has("unknown section 'decod' (t.ini:2, 19 keys); did you mean 'decode'?", NULL));
    assert_true(fy_test_log_has("unknown section 'qqqqqqqq' (t.ini:21, 2 keys)", NULL));
    assert_false(fy_test_log_has("qqqqqqqq", "did you mean", NULL));
    assert_true(fy_test_log_has("unknown key 'router.lisen' (t.ini:24); did you mean 'router.listen'?", NULL));
    assert_false(fy_test_log_has("unknown key 'decod", NULL));
    fy_config_destroy(c);
}

/* A relative path in a file is relative to the file's folder, whatever the
 * working directory (`ferry serve -c ../configs/local.ini` from bin/); one
 * given with --set, to the working directory; both are stored absolute, so
 * a configuration written elsewhere (RUN_DIR/cluster.ini) means the same.
 * Keys that name no path, empty values and absolute paths stay as written. */
static void test_relative_paths(void **state)
{
    char tmp[PATH_MAX], cwd[PATH_MAX], want[PATH_MAX + 64], sub[PATH_MAX + 8];
    assert_non_null(realpath(fy_test_tmpdir(), tmp));
    assert_non_null(getcwd(cwd, sizeof(cwd)));
    snprintf(sub, sizeof(sub), "%s/etc", tmp);
    assert_true(mkdir(sub, 0700) == 0 || errno == EEXIST);
    const char *ini = fy_test_path("etc/rel.ini");
    const char *text = "[model]\npath = ../models/m.gguf\n[serve]\nrun_dir = run\nlogs = ./a/./b\n"
                       "etcd_data = /abs/etcd\n[kv]\nsecret_file = ..\n[cluster]\netcd_ca =\n"
                       "[decode]\nspec = draft:d.gguf\n[prefill]\nlisten = tcp://127.0.0.1:1\n";
    assert_true(fy_test_write_file(ini, text, strlen(text)));
    for (int round = 0; round < 2; round++) {
        /* the same file by an absolute name, then by a relative one from its parent folder */
        assert_int_equal(chdir(round ? tmp : cwd), 0);
        fy_config_t *c = make(NULL);
        assert_int_equal(fy_config_load(c, round ? "etc/rel.ini" : ini), FY_OK);
        snprintf(want, sizeof(want), "%s/models/m.gguf", tmp);
        assert_string_equal(fy_config_get(c, "model", "path"), want);
        snprintf(want, sizeof(want), "%s/etc/run", tmp);
        assert_string_equal(fy_config_get(c, "serve", "run_dir"), want);
        snprintf(want, sizeof(want), "%s/etc/a/./b", tmp); /* only leading ./ and ../ are taken off */
        assert_string_equal(fy_config_get(c, "serve", "logs"), want);
        assert_string_equal(fy_config_get(c, "kv", "secret_file"), tmp);
        snprintf(want, sizeof(want), "draft:%s/etc/d.gguf", tmp);
        assert_string_equal(fy_config_get(c, "decode", "spec"), want);
        assert_string_equal(fy_config_get(c, "serve", "etcd_data"), "/abs/etcd");
        assert_string_equal(fy_config_get(c, "cluster", "etcd_ca"), "");
        assert_string_equal(fy_config_get(c, "prefill", "listen"), "tcp://127.0.0.1:1");
        snprintf(want, sizeof(want), "%s:2", round ? "etc/rel.ini" : ini);
        assert_string_equal(fy_config_origin(c, "model", "path"), want); /* the file as named */
        /* --set: against the working directory */
        assert_int_equal(fy_config_set(c, "router.api_keys = keys.txt"), FY_OK);
        assert_int_equal(fy_config_set(c, "decode.spec=ngram"), FY_OK);
        snprintf(want, sizeof(want), "%s/keys.txt", round ? tmp : cwd);
        assert_string_equal(fy_config_get(c, "router", "api_keys"), want);
        assert_string_equal(fy_config_get(c, "decode", "spec"), "ngram");
        /* written and read back from another folder: the same values */
        const char *out = fy_test_path("etc/written.ini");
        assert_int_equal(fy_config_write(c, out), FY_OK);
        assert_int_equal(chdir("/"), 0);
        fy_config_t *d = make(NULL);
        assert_int_equal(fy_config_load(d, out), FY_OK);
        assert_string_equal(fy_config_get(d, "router", "api_keys"), want);
        assert_string_equal(fy_config_get(d, "model", "path"), fy_config_get(c, "model", "path"));
        fy_config_destroy(d);
        fy_config_destroy(c);
    }
    assert_int_equal(chdir(cwd), 0);
    /* text has no folder: its paths stay as written */
    fy_config_t *c = make("[model]\npath = models/m.gguf\n");
    assert_string_equal(fy_config_get(c, "model", "path"), "models/m.gguf");
    fy_config_destroy(c);
    /* a path that would not fit a written line once resolved is refused, naming the key */
    char deep[PATH_MAX + 128];
    snprintf(deep, sizeof(deep), "%s/%0120d", tmp, 0);
    assert_true(mkdir(deep, 0700) == 0 || errno == EEXIST);
    char long_ini[PATH_MAX + 160];
    snprintf(long_ini, sizeof(long_ini), "%s/l.ini", deep);
    char body[256];
    snprintf(body, sizeof(body), "[kv]\nblock_size = 16\n[model]\npath = %080d.gguf\n", 0);
    assert_true(fy_test_write_file(long_ini, body, strlen(body)));
    c = make(NULL);
    fy_test_log_begin();
    assert_int_equal(fy_config_load(c, long_ini), FY_ERR_FORMAT);
    fy_test_log_end();
    assert_true(fy_test_log_has("model.path = '0000", "l.ini:4", "the path is longer than", NULL));
    assert_int_equal(fy_config_count(c), 0); /* the file merged not at all */
    assert_int_equal(chdir(deep), 0);
    fy_test_log_begin();
    snprintf(body, sizeof(body), "model.path=%080d.gguf", 0);
    assert_int_equal(fy_config_set(c, body), FY_ERR_INVALID);
    fy_test_log_end();
    assert_int_equal(chdir(cwd), 0);
    assert_true(fy_test_log_has("model.path = '0000", "(--set)", "the path is longer than", NULL));
    fy_config_destroy(c);
}

/* Every file in configs/ is clean against the table. */
static void test_shipped_configs(void **state)
{
    glob_t g;
    if (glob("configs/*.ini", 0, NULL, &g) != 0) {
        print_message("skipped: no configs/*.ini here (run from the repository root)\n");
        skip();
    }
    for (size_t i = 0; i < g.gl_pathc; i++) {
        fy_config_t *c = make(NULL);
        fy_test_log_begin();
        fy_status_t st = fy_config_load(c, g.gl_pathv[i]);
        if (!st) st = fy_conf_check(c, true);
        fy_test_log_end();
        if (st) fail_msg("%s: %s", g.gl_pathv[i], fy_test_log_text());
        fy_config_destroy(c);
    }
    globfree(&g);
}

#define REF_BEGIN "<!-- the key reference: `ferry config --markdown`; tests/test_config.c checks it -->\n"
#define REF_END "<!-- end of the key reference -->\n"

static char *markdown(void)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    fy_conf_markdown(f);
    fclose(f);
    return buf;
}

/* `section.key` mentioned in text, where section is one of the table's:
 * each must be a key (file names like router/router.c or run/kv.secret
 * are not mentions, nor an example of an unknown key's error). */
static void check_mentions(const char *path, const char *text)
{
    static const char *const sections[] = {"model", "kv", "router", "prefill", "decode", "worker", "serve"};
    static const char *const not_keys[] = {"c", "h", "secret", "safetensors", "md", "ini", "log"};
    for (const char *p = text; *p; p++) {
        if (p > text && (isalnum((unsigned char)p[-1]) || p[-1] == '/' || p[-1] == '.' || p[-1] == '_')) continue;
        if (p - text >= 13 && !strncmp(p - 13, "unknown key '", 13)) continue; /* an example of a typo */
        for (size_t s = 0; s < FY_ARRAY_LEN(sections); s++) {
            size_t ls = strlen(sections[s]);
            if (strncmp(p, sections[s], ls) || p[ls] != '.' || !islower((unsigned char)p[ls + 1])) continue;
            const char *k = p + ls + 1;
            size_t lk = 0;
            while (islower((unsigned char)k[lk]) || isdigit((unsigned char)k[lk]) || k[lk] == '_') lk++;
            if (k[lk] == '.' || k[lk] == '/') continue; /* a path */
            char key[64];
            snprintf(key, sizeof(key), "%.*s", (int)lk, k);
            bool skip_it = false;
            for (size_t x = 0; x < FY_ARRAY_LEN(not_keys); x++) skip_it |= !strcmp(key, not_keys[x]);
            if (!skip_it && !fy_conf_key(sections[s], key))
                fail_msg("%s names '%s.%s', which is not in the key table (common/confkeys.c)", path, sections[s], key);
        }
    }
}

/* Table rows "| `section.key` | `default` |" elsewhere in the docs say
 * the table's default. */
static void check_default_rows(const char *path, const char *text)
{
    for (const char *p = strstr(text, "\n| `"); p; p = strstr(p + 1, "\n| `")) {
        char name[96], def[96];
        if (sscanf(p, "\n| `%95[a-z0-9_.]` | `%95[^`]` |", name, def) != 2) continue;
        char *dot = strchr(name, '.');
        if (!dot) continue;
        *dot = '\0';
        const fy_conf_key_t *k = fy_conf_key(name, dot + 1);
        if (!k) continue; /* check_mentions says so */
        const char *want = k->def_from ? k->def_from : k->def;
        if (!want) continue; /* unset by default: the row says what that means */
        if (strcmp(def, want))
            fail_msg("%s: the row of %s.%s says its default is '%s'; the key table says '%s'", path, name, dot + 1, def,
                     want);
    }
}

/* CPU lists (prefill.cpus, decode.cpus): what parses, what is refused by
 * name, and that applying one pins the process (in a child, so this
 * process keeps its mask) and narrows "one thread per CPU". */
static void test_cpuset(void **state)
{
    (void)state;
    fy_cpuset_t s;
    assert_int_equal(fy_cpuset_parse("t.cpus", "0-3,8, 10-11", &s), FY_OK);
    assert_int_equal(fy_cpuset_count(&s), 7);
    assert_true(s.bits[0] == 0x0d0full);
    assert_int_equal(fy_cpuset_parse("t.cpus", "1023", &s), FY_OK);
    assert_true(s.bits[15] == 1ull << 63 && fy_cpuset_count(&s) == 1);
    static const char *const bad[] = {"", ",", "1,", "3-1", "1024", "0-1024", "a", "1-", "-1", "1,,2", "1 2", "0x1"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        s.bits[0] = 42;
        assert_int_equal(fy_cpuset_parse("t.cpus", bad[i], &s), FY_ERR_INVALID);
        assert_true(s.bits[0] == 42); /* untouched on failure */
    }
    assert_int_equal(fy_cpuset_parse("t.cpus", NULL, &s), FY_ERR_INVALID);

    int usable = fy_cpuset_usable();
    assert_true(usable >= 1);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        cpu_set_t before, after;
        int first = -1;
        if (sched_getaffinity(0, sizeof(before), &before)) _exit(10);
        for (int c = 0; c < CPU_SETSIZE && first < 0; c++)
            if (CPU_ISSET(c, &before)) first = c;
        fy_cpuset_t far, one;
        char list[16];
        snprintf(list, sizeof(list), "%d", first);
        /* a CPU this process may not use: refused, the mask unchanged */
        if (fy_cpuset_parse("t.cpus", "1023", &far) || fy_cpuset_apply("t.cpus", &far) != FY_ERR_INVALID) _exit(11);
        if (sched_getaffinity(0, sizeof(after), &after) || !CPU_EQUAL(&before, &after)) _exit(12);
        if (fy_cpuset_parse("t.cpus", list, &one) || fy_cpuset_apply("t.cpus", &one)) _exit(13);
        if (sched_getaffinity(0, sizeof(after), &after) || CPU_COUNT(&after) != 1 || !CPU_ISSET(first, &after))
            _exit(14);
        _exit(fy_cpuset_usable() == 1 ? 0 : 15);
    }
    int wst = 0;
    assert_int_equal(waitpid(pid, &wst, 0), pid);
    if (!WIFEXITED(wst) || WEXITSTATUS(wst)) fail_msg("the pinning child failed (status %d)", WEXITSTATUS(wst));
}
static void test_docs(void **state)
{
    char *ops = fy_test_read_file("docs/operations.md", NULL);
    if (!ops) {
        print_message("skipped: no docs/operations.md here (run from the repository root)\n");
        skip();
    }
    char *md = markdown();
    const char *b = strstr(ops, REF_BEGIN), *e = b ? strstr(b, REF_END) : NULL;
    if (!b || !e) fail_msg("docs/operations.md lacks the key reference between '%s' and '%s'", REF_BEGIN, REF_END);
    b += strlen(REF_BEGIN);
    if ((size_t)(e - b) != strlen(md) || strncmp(b, md, strlen(md)))
        fail_msg("docs/operations.md's key reference is not the table's: replace it with `bin/ferry config "
                 "--markdown`");
    fy_free(md);
    fy_free(ops);
    glob_t g;
    assert_int_equal(glob("docs/*.md", 0, NULL, &g), 0);
    assert_int_equal(glob("configs/*.ini", GLOB_APPEND, NULL, &g), 0);
    assert_int_equal(glob("*.md", GLOB_APPEND, NULL, &g), 0);
    assert_int_equal(glob("bench/README.md", GLOB_APPEND, NULL, &g), 0);
    for (size_t i = 0; i < g.gl_pathc; i++) {
        char *t = fy_test_read_file(g.gl_pathv[i], NULL);
        assert_non_null(t);
        check_mentions(g.gl_pathv[i], t);
        check_default_rows(g.gl_pathv[i], t);
        fy_free(t);
    }
    globfree(&g);
}

/* ---- `ferry config` ---------------------------------------------------------------------------- */

typedef struct run {
    int status; /* exit status */
    char *out, *err;
} run_t;

static const char *ferry_bin(void)
{
    static char path[PATH_MAX];
    const char *b = getenv("FERRY_BIN");
    snprintf(path, sizeof(path), "%s/ferry", b && *b ? b : "bin");
    return path;
}

/* bin/ferry config ARGS... with its stdout and stderr, within 30 s; run
 * in folder dir (NULL: this one). */
static run_t run_config_at(const char *dir, const char *const *args)
{
    char bin[PATH_MAX];
    assert_non_null(realpath(ferry_bin(), bin));
    const char *out = fy_test_path("config.out"), *err = fy_test_path("config.err");
    char *argv[32];
    int n = 0;
    argv[n++] = bin;
    argv[n++] = "config";
    for (int i = 0; args[i] && n < 31; i++) argv[n++] = (char *)args[i];
    argv[n] = NULL;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (!pid) {
        int o = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600), e = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (o < 0 || e < 0) _exit(127);
        dup2(o, 1);
        dup2(e, 2);
        if (dir && chdir(dir)) _exit(127);
        execv(argv[0], argv);
        _exit(127);
    }
    int st = 0;
    for (int i = 0; i < 3000 && waitpid(pid, &st, WNOHANG) == 0; i++) {
        if (i == 2999) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            fail_msg("ferry config did not end within 30 s");
        }
        nanosleep(&(struct timespec){.tv_nsec = 10 * 1000 * 1000}, NULL);
    }
    assert_true(WIFEXITED(st));
    run_t r = {.status = WEXITSTATUS(st), .out = fy_test_read_file(out, NULL), .err = fy_test_read_file(err, NULL)};
    assert_non_null(r.out);
    assert_non_null(r.err);
    return r;
}

static run_t run_config(const char *const *args) { return run_config_at(NULL, args); }

static void run_free(run_t *r)
{
    fy_free(r->out);
    fy_free(r->err);
}

/* A line of text that holds every given part, in order. */
static bool has_line(const char *text, const char *a, const char *b)
{
    for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        size_t n = strcspn(l, "\n");
        char line[512];
        snprintf(line, sizeof(line), "%.*s", (int)n, l);
        const char *x = strstr(line, a);
        if (x && (!b || strstr(x + strlen(a), b))) return true;
    }
    return false;
}

#define EXPECT_LINE(text, a, b)                                                                                        \
    do {                                                                                                               \
        if (!has_line(text, a, b)) fail_msg("no line with '%s' then '%s' in:\n%s", a, b ? b : "", text);               \
    } while (0)

static void test_command(void **state)
{
    if (access(ferry_bin(), X_OK) || access("configs/local.ini", R_OK)) {
        print_message("skipped: %s or configs/local.ini is not here\n", ferry_bin());
        skip();
    }
    /* the effective configuration: every key, its value and where it came from */
    run_t r = run_config((const char *const[]){"-c", "configs/local.ini", "--set", "decode.kv_mem=1GiB", NULL});
    assert_int_equal(r.status, 0);
    EXPECT_LINE(r.out, "kv_mem = 1GiB", "; --set");
    EXPECT_LINE(r.out, "count = 2", "; configs/local.ini:");
    EXPECT_LINE(r.out, "max_waiting = 256", "; default");
    EXPECT_LINE(r.out, "max_lease = 30s", "; default: router.lease");
    EXPECT_LINE(r.out, "; secret_file =", "; unset (default)");
    EXPECT_LINE(r.out, "[serve]", NULL);
    int n;
    const fy_conf_key_t *keys = fy_conf_keys(&n);
    int lines = 0;
    for (const char *l = r.out; (l = strchr(l, '\n')); l++) lines += l[1] && l[1] != '[' && l[1] != '\n';
    assert_int_equal(lines, n); /* one line a key */
    /* it reads back as the same configuration */
    const char *back = fy_test_path("effective.ini");
    assert_true(fy_test_write_file(back, r.out, strlen(r.out)));
    fy_config_t *c = make(NULL);
    assert_int_equal(fy_config_load(c, back), FY_OK);
    assert_int_equal(fy_conf_check(c, true), FY_OK);
    int64_t v;
    assert_int_equal(fy_conf_size(c, "decode", "kv_mem", &v), FY_OK);
    assert_int_equal(v, INT64_C(1) << 30);
    assert_null(fy_config_get(c, "kv", "secret_file"));
    assert_string_equal(fy_config_get(c, "router", "http"), "http://127.0.0.1:8080");
    for (int i = 0; i < n; i++)
        if (keys[i].def && !fy_config_get(c, keys[i].section, keys[i].key))
            fail_msg("%s.%s is not in the printed configuration", keys[i].section, keys[i].key);
    fy_config_destroy(c);
    run_free(&r);

    /* --check: ok; or every problem and 1 */
    r = run_config((const char *const[]){"--check", "configs/local.ini", NULL});
    assert_int_equal(r.status, 0);
    EXPECT_LINE(r.out, "configs/local.ini: ok", NULL);
    run_free(&r);
    const char *bad = fy_test_path("bad.ini");
    const char *text = "[decode]\nkvmem = 1G\nthreads = 3000\n[kv]\ndtype = bf16\n";
    assert_true(fy_test_write_file(bad, text, strlen(text)));
    r = run_config((const char *const[]){"--check", bad, "--set", "worker.device=gpu", NULL});
    assert_int_equal(r.status, 1);
    assert_string_equal(r.out, "");
    EXPECT_LINE(r.err, "unknown key 'decode.kvmem'", "did you mean 'decode.kv_mem'?");
    EXPECT_LINE(r.err, "decode.threads = '3000'", "expected an integer in [0, 256]");
    EXPECT_LINE(r.err, "kv.dtype = 'bf16'", "expected f16, f32, fp8 or int8");
    EXPECT_LINE(r.err, "worker.device = 'gpu' (--set)", "expected cpu or cuda");
    EXPECT_LINE(r.err, "is not valid", NULL);
    run_free(&r);
    r = run_config((const char *const[]){"-c", bad, NULL}); /* printing refuses it the same way */
    assert_int_equal(r.status, 1);
    assert_string_equal(r.out, "");
    run_free(&r);
    text = "[decode]\nthreads 4\n";
    assert_true(fy_test_write_file(bad, text, strlen(text)));
    r = run_config((const char *const[]){"--check", bad, NULL});
    assert_int_equal(r.status, 1);
    EXPECT_LINE(r.err, "bad.ini:2", "expected 'key = value'");
    run_free(&r);

    /* --check looks at every file and folder the keys name, each fault naming the key and the file */
    char dir[PATH_MAX], model[PATH_MAX + 16], secret[PATH_MAX + 16], plain[PATH_MAX + 16], files[PATH_MAX + 16];
    assert_non_null(realpath(fy_test_tmpdir(), dir));
    snprintf(model, sizeof(model), "%s/m.gguf", dir);
    snprintf(secret, sizeof(secret), "%s/s.key", dir);
    snprintf(plain, sizeof(plain), "%s/plain", dir);
    snprintf(files, sizeof(files), "%s/files.ini", dir);
    assert_true(fy_test_write_file(model, "GGUF", 4));
    assert_true(fy_test_write_file(plain, "x", 1));
    assert_true(fy_test_write_file(secret, "0123456789abcdef0123", 20));
    assert_int_equal(chmod(secret, 0640), 0);
    text = "[model]\npath = m.gguf\n[kv]\nsecret_file = s.key\ndisk_dir = plain\n[router]\napi_keys = keys.txt\n"
           "[serve]\nrun_dir = run/a/b\n[decode]\nspec = draft:none.gguf\n";
    assert_true(fy_test_write_file(files, text, strlen(text)));
    r = run_config((const char *const[]){"--check", files, NULL});
    assert_int_equal(r.status, 1);
    EXPECT_LINE(r.err, "kv.secret_file = '/", "/s.key' (");
    EXPECT_LINE(r.err, "kv.secret_file = '/", "files.ini:4): mode 0640 lets its group or others at it");
    EXPECT_LINE(r.err, "kv.disk_dir = '/", "/plain' (");
    EXPECT_LINE(r.err, "kv.disk_dir = '/", "files.ini:5): not a folder");
    EXPECT_LINE(r.err, "router.api_keys = '/", "/keys.txt' (");
    EXPECT_LINE(r.err, "router.api_keys = '/", "files.ini:7): no such file");
    EXPECT_LINE(r.err, "decode.spec = '/", "/none.gguf' (");
    EXPECT_LINE(r.err, "decode.spec = '/", "files.ini:11): no such file");
    if (strstr(r.err, "model.path") || strstr(r.err, "run_dir")) fail_msg("a good path refused:\n%s", r.err);
    run_free(&r);
    assert_int_equal(chmod(secret, 0600), 0);
    r = run_config((const char *const[]){"--check", files, "--set", "kv.disk_dir=", "--set", "decode.spec=ngram",
                                         "--set", "router.api_keys=", NULL});
    if (r.status != 0) fail_msg("status %d:\n%s", r.status, r.err);
    EXPECT_LINE(r.out, "files.ini: ok", NULL);
    run_free(&r);
    /* printing does not look at files: a file that is not there yet is no fault of the configuration's text */
    r = run_config((const char *const[]){"-c", files, "--set", "router.api_keys=keys.txt", NULL});
    assert_int_equal(r.status, 0);
    run_free(&r);
    /* the shipped configuration from bin/: its paths are relative to configs/, not to the working directory */
    if (!access("models/SmolLM2-135M-Instruct.Q4_1.gguf", R_OK)) {
        char cfg[PATH_MAX];
        assert_non_null(realpath("configs/local.ini", cfg));
        r = run_config_at(dir, (const char *const[]){"--check", cfg, NULL});
        if (r.status != 0) fail_msg("status %d:\n%s", r.status, r.err);
        run_free(&r);
        r = run_config_at(dir, (const char *const[]){"--check", cfg, "--set", "model.path=m.gguf", NULL});
        if (r.status != 0) fail_msg("status %d:\n%s", r.status, r.err); /* --set: against the working directory */
        run_free(&r);
    }

    /* usage errors: 2 */
    static const char *const usage[][4] = {
        {"--check", NULL},        {"--bogus", NULL}, {"--markdown", "-c", "configs/local.ini"},
        {"--set", "nodot", NULL}, {"-c", NULL},
    };
    for (size_t i = 0; i < FY_ARRAY_LEN(usage); i++) {
        r = run_config(usage[i]);
        if (r.status != 2) fail_msg("ferry config %s: status %d, expected 2", usage[i][0], r.status);
        run_free(&r);
    }
    r = run_config((const char *const[]){"--check", "no/such.ini", NULL});
    assert_int_equal(r.status, 1);
    EXPECT_LINE(r.err, "no/such.ini", "cannot open");
    run_free(&r);
    r = run_config((const char *const[]){"--help", NULL});
    assert_int_equal(r.status, 0);
    EXPECT_LINE(r.out, "usage: ferry config", NULL);
    run_free(&r);

    /* --markdown is the reference */
    r = run_config((const char *const[]){"--markdown", NULL});
    assert_int_equal(r.status, 0);
    char *md = markdown();
    assert_string_equal(r.out, md);
    fy_free(md);
    run_free(&r);
}

/* A role's rank group: its own tp/pp where set, else worker.tp/pp. */
static void test_cluster_ranks(void **state)
{
    (void)state;
    int32_t tp, pp;
    assert_int_equal(fy_cluster_ranks(NULL, "decode", &tp, &pp), FY_OK);
    assert_true(tp == 1 && pp == 1);
    fy_config_t *c;
    assert_int_equal(fy_config_create(&c), FY_OK);
    assert_int_equal(fy_config_set(c, "worker.tp=2"), FY_OK);
    assert_int_equal(fy_config_set(c, "worker.pp=3"), FY_OK);
    assert_int_equal(fy_config_set(c, "prefill.tp=4"), FY_OK);
    assert_int_equal(fy_cluster_ranks(c, "prefill", &tp, &pp), FY_OK);
    assert_true(tp == 4 && pp == 3); /* its own tp, the workers' pp */
    assert_int_equal(fy_cluster_ranks(c, "decode", &tp, &pp), FY_OK);
    assert_true(tp == 2 && pp == 3);
    fy_config_destroy(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_cpuset),
        cmocka_unit_test(test_merge_order),
        cmocka_unit_test(test_set_errors),
        cmocka_unit_test(test_int),
        cmocka_unit_test(test_double),
        cmocka_unit_test(test_bool),
        cmocka_unit_test(test_size),
        cmocka_unit_test(test_duration),
        cmocka_unit_test(test_string),
        cmocka_unit_test(test_unknown_keys),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_limits_and_files),
        cmocka_unit_test(test_write_roundtrip),
        cmocka_unit_test(test_write_leading_semicolon),
        cmocka_unit_test(test_alloc_failure),
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_conf_read),
        cmocka_unit_test(test_conf_check),
        cmocka_unit_test(test_shipped_configs),
        cmocka_unit_test(test_relative_paths),
        cmocka_unit_test(test_unknown_section),
        cmocka_unit_test(test_docs),
        cmocka_unit_test(test_command),
        cmocka_unit_test(test_write_full_line),
        cmocka_unit_test(test_cluster_ranks),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    fy_test_tmpdir_remove();
    return rc;
}

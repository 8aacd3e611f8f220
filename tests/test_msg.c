/*
 * test_msg.c - the wire codec: round trips, every kind of field error
 * named, and hostile bytes (truncations, mutations, random buffers, huge
 * claimed counts) refused without crashing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/genspec.h"
#include "common/mem.h"
#include "common/msg.h"
#include "tests/testutil.h"

static void *build_sample(size_t *len)
{
    fy_msgw_t w;
    fy_msgw_init(&w, "reserve");
    fy_msgw_u64(&w, "id", 12345678901234ull);
    fy_msgw_i64(&w, "delta", -42);
    fy_msgw_f64(&w, "temp", 0.7);
    fy_msgw_bool(&w, "flag", true);
    fy_msgw_str(&w, "tenant", "acme");
    int32_t toks[5] = {1, 2, 3, 49151, 0};
    fy_msgw_i32s(&w, "tokens", toks, 5);
    uint64_t rng[4] = {1, UINT64_MAX, 3, 4};
    fy_msgw_u64s(&w, "rng", rng, 4);
    float f[2] = {0.5f, -1.25f};
    fy_msgw_f32s(&w, "f", f, 2);
    const char *stops[2] = {"\n\n", "END"};
    fy_msgw_strs(&w, "stop", stops, 2);
    unsigned char blob[3] = {0, 1, 255};
    fy_msgw_bin(&w, "target", blob, 3);
    fy_msgw_map_begin(&w, "timings");
    fy_msgw_f64(&w, "ttft", 0.25);
    fy_msgw_map_begin(&w, "inner");
    fy_msgw_u64(&w, "x", 7);
    fy_msgw_map_end(&w);
    fy_msgw_map_end(&w);
    void *buf;
    assert_int_equal(fy_msgw_finish(&w, &buf, len), FY_OK);
    return buf;
}

static void test_round_trip(void **state)
{
    size_t len;
    void *buf = build_sample(&len);
    fy_msgr_t r;
    assert_int_equal(fy_msgr_parse(&r, buf, len), FY_OK);
    assert_string_equal(fy_msgr_type(&r), "reserve");
    assert_true(fy_msgr_u64(&r, "id", FY_REQ, 0, 0, UINT64_MAX) == 12345678901234ull);
    assert_int_equal(fy_msgr_i64(&r, "delta", FY_REQ, 0, -100, 100), -42);
    assert_true(fy_msgr_f64(&r, "temp", FY_REQ, 0, 0, 2) == 0.7);
    assert_true(fy_msgr_bool(&r, "flag", FY_REQ, false));
    char s[16];
    assert_int_equal(fy_msgr_str(&r, "tenant", FY_REQ, NULL, s, sizeof(s)), 4);
    assert_string_equal(s, "acme");
    int32_t toks[8];
    assert_int_equal(fy_msgr_i32s(&r, "tokens", FY_REQ, toks, 8, 0, 49151), 5);
    assert_int_equal(toks[3], 49151);
    uint64_t rng[4];
    assert_int_equal(fy_msgr_u64s(&r, "rng", FY_REQ, rng, 4), 4);
    assert_true(rng[1] == UINT64_MAX);
    float f[2];
    assert_int_equal(fy_msgr_f32s(&r, "f", FY_REQ, f, 2), 2);
    assert_true(f[1] == -1.25f);
    const char *st[4];
    size_t sl[4];
    assert_int_equal(fy_msgr_strs(&r, "stop", FY_REQ, st, sl, 4, 64), 2);
    assert_int_equal(sl[1], 3);
    assert_memory_equal(st[1], "END", 3);
    size_t bl;
    const unsigned char *b = fy_msgr_bytes(&r, "target", FY_REQ, 16, &bl);
    assert_int_equal(bl, 3);
    assert_int_equal(b[2], 255);
    assert_true(fy_msgr_enter(&r, "timings", FY_REQ));
    assert_true(fy_msgr_f64(&r, "ttft", FY_REQ, 0, 0, 10) == 0.25);
    assert_true(fy_msgr_enter(&r, "inner", FY_REQ));
    assert_int_equal(fy_msgr_u64(&r, "x", FY_REQ, 0, 0, 10), 7);
    fy_msgr_leave(&r);
    fy_msgr_leave(&r);
    /* optional absent fields give their defaults */
    assert_int_equal(fy_msgr_u64(&r, "nope", FY_OPT, 9, 0, 10), 9);
    assert_int_equal(fy_msgr_str(&r, "nope", FY_OPT, "dflt", s, sizeof(s)), 4);
    assert_false(fy_msgr_enter(&r, "nope", FY_OPT));
    assert_true(fy_msgr_ok(&r));
    fy_msgr_free(&r);
    fy_free(buf);
}

/* Each field error is named, sticky, and keeps the first message. */
static void test_field_errors(void **state)
{
    size_t len;
    void *buf = build_sample(&len);
    struct {
        int kind;
        const char *want;
    } cases[] = {
        {0, "'missing' is missing"},
        {1, "'id' must be an integer in [0, 10]"},
        {2, "'tenant' must be an integer"},
        {3, "'tokens': entry 3 must be an integer in [0, 100]"},
        {4, "'tokens' has 5 entries; at most 2"},
        {5, "'tenant' must be a string of at most 3 bytes"},
        {6, "'temp' must be a number in [1, 2]"},
        {7, "'flag' must be a map"},
        {8, "'target' is 3 bytes; at most 2"},
        {9, "'stop': entry 0 must be a string of 1 to 1 bytes"},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        fy_msgr_t r;
        assert_int_equal(fy_msgr_parse(&r, buf, len), FY_OK);
        char s[4];
        int32_t t[8];
        size_t n;
        const char *sp[4];
        size_t sl[4];
        switch (cases[k].kind) {
        case 0: fy_msgr_u64(&r, "missing", FY_REQ, 0, 0, 1); break;
        case 1: fy_msgr_u64(&r, "id", FY_REQ, 0, 0, 10); break;
        case 2: fy_msgr_i64(&r, "tenant", FY_REQ, 0, 0, 10); break;
        case 3: fy_msgr_i32s(&r, "tokens", FY_REQ, t, 8, 0, 100); break;
        case 4: fy_msgr_i32s(&r, "tokens", FY_REQ, t, 2, 0, 100000); break;
        case 5: fy_msgr_str(&r, "tenant", FY_REQ, NULL, s, sizeof(s)); break;
        case 6: fy_msgr_f64(&r, "temp", FY_REQ, 0, 1, 2); break;
        case 7: fy_msgr_enter(&r, "flag", FY_REQ); break;
        case 8: fy_msgr_bytes(&r, "target", FY_REQ, 2, &n); break;
        case 9: fy_msgr_strs(&r, "stop", FY_REQ, sp, sl, 4, 1); break;
        }
        assert_false(fy_msgr_ok(&r));
        if (!strstr(r.err, cases[k].want)) fail_msg("case %zu: '%s' lacks '%s'", k, r.err, cases[k].want);
        /* sticky: later calls neither succeed nor overwrite the message */
        char first[FY_MSG_ERR_MAX];
        snprintf(first, sizeof(first), "%s", r.err);
        assert_int_equal(fy_msgr_u64(&r, "id", FY_REQ, 5, 0, UINT64_MAX), 5);
        assert_string_equal(r.err, first);
        fy_msgr_free(&r);
    }
    fy_free(buf);
}

static void expect_refused(const void *buf, size_t len, fy_status_t want, const char *substr)
{
    fy_msgr_t r;
    fy_status_t st = fy_msgr_parse(&r, buf, len);
    if (st != want || (substr && !strstr(r.err, substr)))
        fail_msg("got %s '%s', want %s '%s'", fy_status_str(st), r.err, fy_status_str(want), substr ? substr : "");
    fy_msgr_free(&r);
}

static void test_structure_errors(void **state)
{
    /* a map claiming 2^32-1 entries in five bytes */
    const unsigned char huge_map[] = {0xdf, 0xff, 0xff, 0xff, 0xff, 0xa1, 'v', 0x01};
    expect_refused(huge_map, sizeof(huge_map), FY_ERR_FORMAT, "elements claimed");
    /* an array claiming 65535 entries inside a small map */
    const unsigned char huge_arr[] = {0x81, 0xa1, 'a', 0xdc, 0xff, 0xff, 0x01};
    expect_refused(huge_arr, sizeof(huge_arr), FY_ERR_FORMAT, "elements claimed");
    const unsigned char str_long[] = {0x81, 0xa1, 'a', 0xdb, 0x7f, 0xff, 0xff, 0xff, 'x'};
    expect_refused(str_long, sizeof(str_long), FY_ERR_FORMAT, "truncated");
    const unsigned char not_map[] = {0x93, 1, 2, 3};
    expect_refused(not_map, sizeof(not_map), FY_ERR_FORMAT, "not a map");
    const unsigned char trailing[] = {0x80, 0x00};
    expect_refused(trailing, sizeof(trailing), FY_ERR_FORMAT, "after the message");
    const unsigned char ext[] = {0x81, 0xa1, 'a', 0xd4, 0x01, 0x00};
    expect_refused(ext, sizeof(ext), FY_ERR_FORMAT, "not used");
    const unsigned char no_v[] = {0x81, 0xa4, 't', 'y', 'p', 'e', 0xa1, 'x'};
    expect_refused(no_v, sizeof(no_v), FY_ERR_FORMAT, "no protocol version");
    const unsigned char v2[] = {0x82, 0xa1, 'v', 0x02, 0xa4, 't', 'y', 'p', 'e', 0xa1, 'x'};
    expect_refused(v2, sizeof(v2), FY_ERR_MISMATCH, "protocol version 2");
    const unsigned char dup[] = {0x83, 0xa1, 'v', 0x01, 0xa4, 't', 'y', 'p', 'e', 0xa1, 'x', 0xa1, 'v', 0x01};
    expect_refused(dup, sizeof(dup), FY_ERR_FORMAT, "appears twice");
    const unsigned char intkey[] = {0x82, 0xa1, 'v', 0x01, 0x05, 0x01};
    expect_refused(intkey, sizeof(intkey), FY_ERR_FORMAT, "not a string");
    const unsigned char badtype[] = {0x82, 0xa1, 'v', 0x01, 0xa4, 't', 'y', 'p', 'e', 0xa2, 'A', '\n'};
    expect_refused(badtype, sizeof(badtype), FY_ERR_FORMAT, "type name");
    expect_refused("", 0, FY_ERR_FORMAT, "empty");
    /* nesting past the limit */
    unsigned char deep[64];
    size_t n = 0;
    for (int i = 0; i < 20; i++) deep[n++] = 0x91; /* [[[[...]]]] */
    deep[n++] = 0x01;
    expect_refused(deep, n, FY_ERR_FORMAT, "deeper");
}

/* Every truncation of a valid message is refused; so is every single-byte
 * change that breaks its structure, and nothing crashes (ASan watches). */
static void test_truncations_and_mutations(void **state)
{
    size_t len;
    unsigned char *buf = build_sample(&len);
    for (size_t cut = 0; cut < len; cut++) {
        fy_msgr_t r;
        assert_int_not_equal(fy_msgr_parse(&r, buf, cut), FY_OK);
        fy_msgr_free(&r);
    }
    unsigned char *m = fy_malloc(len);
    uint64_t seed = 7;
    int accepted = 0;
    for (int it = 0; it < 20000; it++) {
        memcpy(m, buf, len);
        int flips = 1 + (int)(fy_test_rand_u64(&seed) % 4);
        for (int f = 0; f < flips; f++) m[fy_test_rand_u64(&seed) % len] = (unsigned char)fy_test_rand_u64(&seed);
        fy_msgr_t r;
        if (fy_msgr_parse(&r, m, len) == FY_OK) {
            accepted++;
            /* whatever survived, the getters stay in bounds */
            int32_t t[8];
            char s[8];
            size_t bl;
            fy_msgr_i32s(&r, "tokens", FY_OPT, t, 8, 0, 100);
            fy_msgr_str(&r, "tenant", FY_OPT, NULL, s, sizeof(s));
            fy_msgr_bytes(&r, "target", FY_OPT, 8, &bl);
            if (fy_msgr_enter(&r, "timings", FY_OPT)) fy_msgr_leave(&r);
        }
        fy_msgr_free(&r);
    }
    print_message("mutations: %d of 20000 still parse (changed values, same structure)\n", accepted);
    fy_free(m);
    fy_free(buf);
}

static void test_random_bytes(void **state)
{
    uint64_t seed = 11;
    unsigned char b[256];
    for (int it = 0; it < 50000; it++) {
        size_t n = fy_test_rand_u64(&seed) % sizeof(b);
        for (size_t i = 0; i < n; i++) b[i] = (unsigned char)fy_test_rand_u64(&seed);
        if (n) b[0] = (unsigned char)(0x80 | (b[0] & 0x0f)); /* mostly maps, to get past the first byte */
        fy_msgr_t r;
        fy_msgr_parse(&r, b, n);
        fy_msgr_free(&r);
    }
}

/* Empty keys: msgpack-c gives an empty string no pointer, and comparing
 * one with memcmp(NULL, ..., 0) is undefined (UBSan stops there; fuzz_error
 * found it).  One empty key is a key like any other; two are a duplicate. */
static void test_empty_keys(void **state)
{
    (void)state;
    static const unsigned char one[] = {0x83, 0xa0, 0x07, 0xa1, 'v', 0x01, 0xa4, 't', 'y', 'p', 'e', 0xa1, 'x'};
    static const unsigned char two[] = {0x84, 0xa0, 0x07, 0xa0, 0x08, 0xa1, 'v', 0x01,
                                        0xa4, 't',  'y',  'p',  'e',  0xa1, 'x'};
    /* an empty value read as a string */
    static const unsigned char val[] = {0x83, 0xa1, 'a', 0xa0, 0xa1, 'v', 0x01, 0xa4, 't', 'y', 'p', 'e', 0xa1, 'x'};
    fy_msgr_t r;
    assert_int_equal(fy_msgr_parse(&r, one, sizeof(one)), FY_OK);
    assert_true(fy_msgr_has(&r, ""));
    assert_int_equal(fy_msgr_i64(&r, "", FY_REQ, 0, 0, 10), 7);
    assert_false(fy_msgr_has(&r, "w"));
    char buf[8];
    assert_int_equal(fy_msgr_str(&r, "type", FY_REQ, NULL, buf, sizeof(buf)), 1);
    assert_true(fy_msgr_ok(&r));
    fy_msgr_free(&r);
    assert_int_equal(fy_msgr_parse(&r, val, sizeof(val)), FY_OK);
    assert_int_equal(fy_msgr_str(&r, "a", FY_REQ, "x", buf, sizeof(buf)), 0);
    assert_string_equal(buf, "");
    size_t len = 1;
    assert_non_null(fy_msgr_bytes(&r, "a", FY_REQ, 8, &len));
    assert_int_equal(len, 0);
    assert_true(fy_msgr_ok(&r));
    fy_msgr_free(&r);
    assert_int_equal(fy_msgr_parse(&r, two, sizeof(two)), FY_ERR_FORMAT);
    assert_non_null(strstr(r.err, "appears twice"));
    fy_msgr_free(&r);
}

/* Generation parameters that decode also decode after they are written
 * again, as the router forwards a client's to the workers: top_p is kept
 * as a float, and the float nearest a top_p just above 1e-6 can be just
 * below it (1e-6 is not a float), which the workers then refused
 * (fuzz_genspec found it). */
static void test_genspec_forwarded(void **state)
{
    (void)state;
    static const double top_ps[] = {1e-6, 1.0000000001e-6, 1.00000003e-6, 0.9999999999, 1.0};
    for (size_t i = 0; i < sizeof(top_ps) / sizeof(top_ps[0]); i++) {
        fy_msgw_t w;
        fy_msgw_init(&w, "generate");
        fy_msgw_f64(&w, "top_p", top_ps[i]);
        fy_msgw_f64(&w, "temperature", 99.99999999);
        void *buf;
        size_t len;
        assert_int_equal(fy_msgw_finish(&w, &buf, &len), FY_OK);
        fy_msgr_t r;
        assert_int_equal(fy_msgr_parse(&r, buf, len), FY_OK);
        fy_genspec_t g, back;
        fy_genspec_default(&g);
        fy_genspec_read(&r, &g, 1000);
        assert_true(fy_msgr_ok(&r));
        fy_msgr_free(&r);
        fy_free(buf);
        fy_msgw_init(&w, "reserve");
        fy_genspec_write(&w, &g);
        assert_int_equal(fy_msgw_finish(&w, &buf, &len), FY_OK);
        assert_int_equal(fy_msgr_parse(&r, buf, len), FY_OK);
        fy_genspec_default(&back);
        fy_genspec_read(&r, &back, 1000);
        if (!fy_msgr_ok(&r)) fail_msg("top_p %.12g: %s", top_ps[i], r.err);
        assert_true(back.sampling.top_p == g.sampling.top_p && back.sampling.temperature == g.sampling.temperature);
        fy_msgr_free(&r);
        fy_free(buf);
    }
}

static void test_writer_alloc_failure(void **state)
{
    for (long k = 1; k < 12; k++) {
        fy_mem_fail_after(k);
        size_t len;
        fy_msgw_t w;
        fy_msgw_init(&w, "x");
        for (int i = 0; i < 200; i++) fy_msgw_str(&w, "k", "a fairly long value to make the buffer grow");
        void *buf = NULL;
        fy_status_t st = fy_msgw_finish(&w, &buf, &len);
        fy_mem_fail_after(0);
        if (st == FY_OK)
            fy_free(buf);
        else
            assert_int_equal(st, FY_ERR_NOMEM);
    }
    /* unbalanced maps are a caller bug, reported */
    fy_msgw_t w;
    fy_msgw_init(&w, "x");
    fy_msgw_map_begin(&w, "m");
    void *buf;
    size_t len;
    assert_int_equal(fy_msgw_finish(&w, &buf, &len), FY_ERR_INTERNAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),       cmocka_unit_test(test_field_errors),
        cmocka_unit_test(test_structure_errors), cmocka_unit_test(test_truncations_and_mutations),
        cmocka_unit_test(test_random_bytes),     cmocka_unit_test(test_genspec_forwarded),
        cmocka_unit_test(test_empty_keys),       cmocka_unit_test(test_writer_alloc_failure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

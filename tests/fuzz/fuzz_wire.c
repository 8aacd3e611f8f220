/*
 * fuzz_wire.c - every control-plane message reader (common/wire.c) on any
 * message: the router's, the client's, the workers' and the echo
 * server's readers of all 29 messages, and the command and event headers
 * the dispatchers read first.  Each reader runs on every input, whatever
 * its type (a reader does not look at the type; its dispatcher does), under
 * a reader's bounds (a vocabulary, a context, a prompt a reply is about)
 * and without any.
 *
 * Checks: a read fails with `format` or `nomem` and a reason, and then
 * owns nothing (arrays freed: LeakSanitizer); what a reader accepts,
 * written again, parses, has the schema's type, reads back equal field
 * by field (fy_wire_equal), and writes the same bytes a second time (the
 * write-and-read-again property of fuzz_genspec.c, for every message).
 * Seeds: one example of each message, as the writers write them
 * (mkseeds.c, tests/wire_examples.c).
 */
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "tests/fuzz/util.h"
#include "common/wire.h"

/* tests/wire_examples.c's fy_test_wire_lim: the seeds read under it */
static const fy_wire_lim_t LIM = {
    .token_hi = 49151, .max_prompt = 4096, .max_ctx = 8192, .n_prompt = 40, .block_size = 16};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fz_quiet_log();
    return 0;
}

static void *write_out(const fy_wire_schema_t *s, const void *m, size_t *len)
{
    fy_msgw_t w;
    fy_wire_write(s, &w, m);
    void *buf = NULL;
    FZ_CHECK(fy_msgw_finish(&w, &buf, len) == FY_OK, "%s: cannot write what was read", fy_wire_name(s));
    return buf;
}

static void one(const fy_wire_schema_t *s, const fy_wire_lim_t *lim, const uint8_t *data, size_t size, void *m,
                void *m2)
{
    fy_msgr_t r;
    if (fy_msgr_parse(&r, data, size) != FY_OK) {
        fy_msgr_free(&r);
        return;
    }
    fy_wire_init(s, m);
    fy_status_t st = fy_wire_read(s, &r, lim, m);
    if (st != FY_OK) {
        FZ_CHECK(st == FY_ERR_FORMAT || st == FY_ERR_NOMEM, "%s: read returned %s", fy_wire_name(s), fy_status_str(st));
        FZ_CHECK(r.err[0], "%s: a refusal without a reason", fy_wire_name(s));
        fy_msgr_free(&r);
        return; /* m owns nothing: a leak is reported */
    }
    size_t len, len2;
    void *buf = write_out(s, m, &len);
    fy_msgr_t r2;
    FZ_CHECK(fy_msgr_parse(&r2, buf, len) == FY_OK, "%s: what was read, written again, does not parse: %s",
             fy_wire_name(s), r2.err);
    FZ_CHECK(fy_wire_is(s, &r2), "%s: written as '%s'", fy_wire_name(s), fy_msgr_type(&r2));
    fy_wire_init(s, m2);
    st = fy_wire_read(s, &r2, lim, m2);
    FZ_CHECK(st == FY_OK, "%s: what was read, written again, is refused: %s", fy_wire_name(s), r2.err);
    char why[160];
    FZ_CHECK(fy_wire_equal(s, m, m2, why, sizeof(why)), "%s changed through a write and a read", why);
    void *buf2 = write_out(s, m2, &len2);
    FZ_CHECK(len2 == len && !memcmp(buf, buf2, len), "%s: written twice, the bytes differ", fy_wire_name(s));
    fy_free(buf2);
    fy_wire_clear(s, m2);
    fy_msgr_free(&r2);
    fy_free(buf);
    fy_wire_clear(s, m);
    fy_msgr_free(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static _Alignas(max_align_t) char m[65536], m2[65536]; /* the largest carry a genspec (its grammar: 32 KiB) */
    for (int32_t i = 0; i < fy_wire_n_all; i++) {
        const fy_wire_schema_t *s = fy_wire_all[i];
        FZ_CHECK(fy_wire_size(s) <= sizeof(m), "%s is %zu bytes", fy_wire_name(s), fy_wire_size(s));
        one(s, &LIM, data, size, m, m2);
        one(s, NULL, data, size, m, m2);
    }
    /* the headers the dispatchers read before picking a schema */
    fy_msgr_t r;
    if (fy_msgr_parse(&r, data, size) == FY_OK) {
        fy_wire_cmd_t c = {0};
        fy_wire_ev_t e = {.id = 0};
        fy_status_t st = fy_wire_cmd_read(&r, &c);
        FZ_CHECK(st != FY_OK || c.to >= 1, "a command header with to = 0");
        r.ok = true; /* errors are sticky: start the next reader afresh */
        st = fy_wire_ev_read(&r, &e);
        FZ_CHECK(st != FY_OK || (e.inc >= 1 && strnlen(e.worker, sizeof(e.worker)) < sizeof(e.worker)),
                 "an event header with inc 0 or an unterminated worker");
    }
    fy_msgr_free(&r);
    return 0;
}

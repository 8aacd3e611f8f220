/*
 * fuzz_error.c - the error message {type: "error", id, code, message}
 * (rpc/rpc.c: fy_msg_error writes it, fy_msg_error_code maps its code
 * back to a status), read as the client library reads an error reply
 * (router/client.c, call(): the error schema's reader, whatever of it
 * could be read, a missing code "internal"; repeated here because call()
 * is a static function there).
 *
 * Checks: any message's code maps to a status that is an error (never
 * FY_OK, never out of the enum); and for every status, an error message
 * written with fy_msg_error and a message text taken from the input reads
 * back to the same status and, when the text fits the client's 256-byte
 * buffer without a NUL, to the same text.  Seeds: error messages as
 * fy_msg_error writes them (mkseeds.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "common/msg.h"
#include "rpc/rpc.h"
#include "tests/fuzz/util.h"
#include "common/wire.h"

/* router/client.c, call(): the status and text of an error reply */
static fy_status_t client_read_error(fy_msgr_t *r, char *msg, size_t cap)
{
    fy_wire_error_t e;
    fy_wire_error_init(&e);
    fy_wire_error_read(r, NULL, &e);
    snprintf(msg, cap, "%s", e.message);
    return fy_msg_error_code(e.code[0] ? e.code : "internal");
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fz_quiet_log();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char msg[256];
    fy_msgr_t r;
    if (fy_msgr_parse(&r, data, size) == FY_OK && !strcmp(fy_msgr_type(&r), "error")) {
        fy_status_t st = client_read_error(&r, msg, sizeof(msg));
        FZ_CHECK(st > FY_OK && st < FY_STATUS_COUNT, "code maps to status %d", (int)st);
        FZ_CHECK(strlen(msg) < sizeof(msg), "message overflows");
    }
    fy_msgr_free(&r);

    char *text = fz_strndup(data, size > 300 ? 300 : size);
    for (int s = 1; s < FY_STATUS_COUNT; s++) {
        fy_msgw_t w;
        fy_msg_error(&w, (uint64_t)size, (fy_status_t)s, text);
        void *buf;
        size_t len;
        FZ_CHECK(fy_msgw_finish(&w, &buf, &len) == FY_OK, "cannot write an error message");
        FZ_CHECK(fy_msgr_parse(&r, buf, len) == FY_OK, "an error message does not parse: %s", r.err);
        FZ_CHECK(!strcmp(fy_msgr_type(&r), "error"), "type '%s'", fy_msgr_type(&r));
        FZ_CHECK(fy_msgr_u64(&r, "id", FY_REQ, 0, 0, UINT64_MAX) == (uint64_t)size, "id changed");
        fy_status_t st = client_read_error(&r, msg, sizeof(msg));
        FZ_CHECK(st == (fy_status_t)s, "status %s came back as %s", fy_status_str((fy_status_t)s), fy_status_str(st));
        if (strlen(text) < sizeof(msg)) FZ_CHECK(!strcmp(msg, text), "the message text changed");
        fy_msgr_free(&r);
        fy_free(buf);
    }
    free(text);
    return 0;
}

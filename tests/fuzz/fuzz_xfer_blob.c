/*
 * fuzz_xfer_blob.c - the transfer target descriptor (transfer/xfer_wire.c,
 * fy_xfer_blob_parse): the blob a decode worker publishes so that prefill
 * workers can write KV into its arena (UCX worker address, packed rkey,
 * arena geometry, name, checksum).
 *
 * Checks: parsing fails with FY_ERR_FORMAT, or the address and rkey lie
 * inside the blob, the arena is whole blocks without wrapping around, the
 * name is NUL-terminated; and the target built again with
 * fy_xfer_blob_build parses to the same fields.  Seeds: blobs from
 * fy_xfer_blob_build (mkseeds.c).
 */
#include <string.h>

#include "common/mem.h"
#include "tests/fuzz/util.h"
#include "transfer/xfer_wire.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fz_quiet_log();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fy_xfer_target_t t;
    fy_status_t st = fy_xfer_blob_parse(data, size, &t);
    FZ_CHECK(st == FY_OK || st == FY_ERR_FORMAT, "parse returned %s", fy_status_str(st));
    if (st != FY_OK) return 0;
    const uint8_t *end = data + size;
    FZ_CHECK(t.addr >= data && t.addr_len >= 1 && t.addr_len <= (size_t)(end - t.addr), "address outside the blob");
    FZ_CHECK(t.rkey >= data && t.rkey_len >= 1 && t.rkey_len <= (size_t)(end - t.rkey), "rkey outside the blob");
    FZ_CHECK(t.block_bytes && t.arena_bytes && t.arena_bytes % t.block_bytes == 0 &&
                 t.arena_base + t.arena_bytes >= t.arena_base,
             "not an arena of whole blocks");
    FZ_CHECK(memchr(t.name, 0, sizeof(t.name)) != NULL, "name not terminated");

    uint8_t *blob;
    size_t len;
    FZ_CHECK(fy_xfer_blob_build(&t, &blob, &len) == FY_OK, "a parsed target does not build");
    fy_xfer_target_t t2;
    FZ_CHECK(fy_xfer_blob_parse(blob, len, &t2) == FY_OK, "a built blob does not parse");
    FZ_CHECK(t2.addr_len == t.addr_len && !memcmp(t2.addr, t.addr, t.addr_len) && t2.rkey_len == t.rkey_len &&
                 !memcmp(t2.rkey, t.rkey, t.rkey_len) && t2.arena_base == t.arena_base &&
                 t2.arena_bytes == t.arena_bytes && t2.block_bytes == t.block_bytes && !strcmp(t2.name, t.name),
             "the target changed through a build and a parse");
    fy_free(blob);
    return 0;
}

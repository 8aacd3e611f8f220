/*
 * fuzz_xgroup_desc.c - a rank group's target descriptor
 * (transfer/xgroup.c, fy_xgroup_desc_parse): what a decode worker of
 * several ranks publishes instead of one blob, each rank's blob with its
 * length, behind a magic, a version and the group's shape.
 *
 * Checks: parsing fails with FY_ERR_FORMAT, or the shape is a group
 * (tp, pp in 1..64, 2..64 ranks), every blob is non-empty and lies
 * inside the input, the blobs tile it to its end; and the descriptor
 * built again from the parsed fields is the input byte for byte.  Seeds:
 * descriptors of real blobs (mkseeds.c).
 */
#include <string.h>

#include "common/mem.h"
#include "tests/fuzz/util.h"
#include "transfer/xgroup.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fz_quiet_log();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fy_xgroup_desc_t d;
    fy_status_t st = fy_xgroup_desc_parse(data, size, &d);
    FZ_CHECK(st == FY_OK || st == FY_ERR_FORMAT, "parse returned %s", fy_status_str(st));
    if (st != FY_OK) return 0;
    FZ_CHECK(fy_xgroup_desc_is(data, size), "a descriptor without the magic parsed");
    FZ_CHECK(d.tp >= 1 && d.pp >= 1 && d.tp <= 64 && d.pp <= 64 && d.n == d.tp * d.pp && d.n >= 2 &&
                 d.n <= FY_XGROUP_MAX_RANKS,
             "shape tp %d x pp %d, %d ranks", d.tp, d.pp, d.n);
    const uint8_t *end = data + size, *at = data + 8;
    for (int32_t r = 0; r < d.n; r++) {
        FZ_CHECK(d.blob[r] == at + 4 && d.blob_len[r] >= 1 && d.blob_len[r] <= (size_t)(end - d.blob[r]),
                 "rank %d's blob outside the input or out of order", r);
        at = d.blob[r] + d.blob_len[r];
    }
    FZ_CHECK(at == end, "bytes after the last blob");
    uint8_t *buf;
    size_t len;
    FZ_CHECK(fy_xgroup_desc_build(&d, &buf, &len) == FY_OK, "a parsed descriptor does not build");
    FZ_CHECK(len == size && !memcmp(buf, data, size), "the descriptor changed through a parse and a build");
    fy_free(buf);
    return 0;
}

/*
 * fuzz_xfer_hello.c - the transfer handshake (transfer/xfer_wire.c): the
 * hello a prefill worker sends when it connects (cookie, name, its KV
 * layout descriptor) and the reply of the decode worker (cookie, accepted
 * or not, its layout, a refusal text).  An input is read as a hello, as a
 * reply, and (its first 200 bytes) as two packed layouts to compare.
 *
 * Checks: each unpack fails with FY_ERR_FORMAT or FY_ERR_MISMATCH or gives
 * NUL-terminated strings, and packed again unpacks to the same fields;
 * explaining the difference of two layouts gives a NUL-terminated line
 * exactly when they differ.  Seeds: fy_xfer_hello_pack and
 * fy_xfer_reply_pack output (mkseeds.c).
 */
#include <string.h>

#include "tests/fuzz/util.h"
#include "transfer/xfer_wire.h"

static bool layout_eq(const fy_xfer_layout_t *a, const fy_xfer_layout_t *b)
{
    return !strcmp(a->model_id, b->model_id) && a->dtype == b->dtype && a->block_size == b->block_size &&
           a->n_layers == b->n_layers && a->n_kv_heads == b->n_kv_heads && a->head_dim == b->head_dim &&
           a->order == b->order && a->scale_format == b->scale_format && a->block_bytes == b->block_bytes &&
           a->n_groups == b->n_groups && a->groups == b->groups && a->tp == b->tp && a->pp == b->pp &&
           a->tp_rank == b->tp_rank && a->stage == b->stage && a->layer0 == b->layer0 && a->kv_head0 == b->kv_head0 &&
           a->model_layers == b->model_layers && a->model_kv_heads == b->model_kv_heads;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fz_quiet_log();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fy_xfer_hello_t h;
    fy_status_t st = fy_xfer_hello_unpack(data, size, &h);
    FZ_CHECK(st == FY_OK || st == FY_ERR_FORMAT || st == FY_ERR_MISMATCH, "hello unpack: %s", fy_status_str(st));
    if (st == FY_OK) {
        FZ_CHECK(memchr(h.name, 0, sizeof(h.name)) && memchr(h.layout.model_id, 0, sizeof(h.layout.model_id)),
                 "unterminated string in a hello");
        uint8_t out[FY_XFER_HELLO_LEN];
        fy_xfer_hello_pack(&h, out);
        fy_xfer_hello_t h2;
        FZ_CHECK(fy_xfer_hello_unpack(out, sizeof(out), &h2) == FY_OK, "a packed hello does not unpack");
        FZ_CHECK(h2.cookie == h.cookie && !strcmp(h2.name, h.name) && layout_eq(&h2.layout, &h.layout),
                 "a hello changed through a pack and an unpack");
    }
    fy_xfer_reply_t r;
    st = fy_xfer_reply_unpack(data, size, &r);
    FZ_CHECK(st == FY_OK || st == FY_ERR_FORMAT || st == FY_ERR_MISMATCH, "reply unpack: %s", fy_status_str(st));
    if (st == FY_OK) {
        FZ_CHECK(memchr(r.message, 0, sizeof(r.message)) && memchr(r.layout.model_id, 0, sizeof(r.layout.model_id)),
                 "unterminated string in a reply");
        uint8_t out[FY_XFER_REPLY_LEN];
        fy_xfer_reply_pack(&r, out);
        fy_xfer_reply_t r2;
        FZ_CHECK(fy_xfer_reply_unpack(out, sizeof(out), &r2) == FY_OK, "a packed reply does not unpack");
        FZ_CHECK(r2.cookie == r.cookie && r2.ok == r.ok && !strcmp(r2.message, r.message) &&
                     layout_eq(&r2.layout, &r.layout),
                 "a reply changed through a pack and an unpack");
    }
    if (size >= 2 * FY_XFER_LAYOUT_WIRE_LEN) {
        fy_xfer_layout_t a, b;
        fy_xfer_layout_unpack(data, &a);
        fy_xfer_layout_unpack(data + FY_XFER_LAYOUT_WIRE_LEN, &b);
        char line[200];
        memset(line, 'x', sizeof(line));
        bool differ = fy_xfer_layout_explain(&a, &b, line, sizeof(line));
        FZ_CHECK(differ == !layout_eq(&a, &b), "explain says %s, the fields say otherwise",
                 differ ? "differ" : "equal");
        if (differ) FZ_CHECK(memchr(line, 0, sizeof(line)) != NULL, "explanation not terminated");
    }
    return 0;
}

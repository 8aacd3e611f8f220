/*
 * xfer_wire.h - transfer/'s own byte formats (internal to transfer/): the
 * serialized layout descriptor, the target blob, and the two handshake
 * active messages.  Everything is fixed little-endian and starts with a
 * version; every decoder takes (buf, len) of untrusted bytes and checks
 * every length before use.  No UCX here, so the parsers are testable and
 * fuzzable on their own.
 */
#ifndef FY_XFER_WIRE_H
#define FY_XFER_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "transfer/xfer.h"

#define FY_XFER_WIRE_VERSION 3 /* 2: the layout carries the KV groups; 3: and the rank's shard */
#define FY_XFER_NAME_LEN 64    /* peer names in blobs and hellos, NUL-padded */
/* model_id[64], 7 x i32, u64, i32 n_groups, u32 groups, 8 x i32 shard */
#define FY_XFER_LAYOUT_WIRE_LEN 140
#define FY_XFER_MSG_LEN 160 /* refusal text in a reply, NUL-padded */
/* bounds on the UCX pieces of a blob: real ones are tens to hundreds of
 * bytes; the bound keeps a hostile length from asking for gigabytes */
#define FY_XFER_MAX_ADDR_LEN 65536
#define FY_XFER_MAX_RKEY_LEN 65536

/* A parsed target blob; addr and rkey point into the blob it came from. */
typedef struct fy_xfer_target {
    const uint8_t *addr; /* UCX worker address */
    uint32_t addr_len;
    const uint8_t *rkey; /* packed rkey of the arena */
    uint32_t rkey_len;
    uint64_t arena_base, arena_bytes, block_bytes;
    char name[FY_XFER_NAME_LEN]; /* NUL-terminated */
} fy_xfer_target_t;

/* Builds a blob into a fresh fy_malloc buffer. */
fy_status_t fy_xfer_blob_build(const fy_xfer_target_t *t, uint8_t **blob_p, size_t *len_p);
/* Parses untrusted bytes; FY_ERR_FORMAT with one log line naming the
 * fault otherwise. */
fy_status_t fy_xfer_blob_parse(const void *blob, size_t len, fy_xfer_target_t *t_p);

void fy_xfer_layout_pack(const fy_xfer_layout_t *l, uint8_t out[FY_XFER_LAYOUT_WIRE_LEN]);
void fy_xfer_layout_unpack(const uint8_t in[FY_XFER_LAYOUT_WIRE_LEN], fy_xfer_layout_t *l);
/* "kv layout mismatch: block_size is 16 here, 32 at the peer"; false when equal. */
bool fy_xfer_layout_explain(const fy_xfer_layout_t *here, const fy_xfer_layout_t *peer, char *buf, size_t cap);

/* Handshake messages (active messages; id in the UCX AM id space). */
#define FY_XFER_AM_HELLO 0x4659 /* "FY" */
#define FY_XFER_AM_REPLY 0x465A
#define FY_XFER_HELLO_LEN (8 + 8 + FY_XFER_NAME_LEN + FY_XFER_LAYOUT_WIRE_LEN)
#define FY_XFER_REPLY_LEN (8 + 8 + FY_XFER_LAYOUT_WIRE_LEN + FY_XFER_MSG_LEN)

/* Both messages also say how each side's KV moves (mem, a fy_xfer_mem_t)
 * and whether its UCX supports CUDA memory (ucx_cuda), in bytes that
 * version 3 reserved as zero: a peer from before them reads as
 * FY_XFER_MEM_UNSTATED (host memory, moved directly) without CUDA, which
 * is what it was, so old and new peers still connect.  Values past
 * FY_XFER_MEM_STAGED are refused as malformed. */
typedef struct fy_xfer_hello {
    uint64_t cookie;             /* the initiator's id for the connection, echoed in the reply */
    char name[FY_XFER_NAME_LEN]; /* the initiator, for log lines */
    fy_xfer_layout_t layout;
    fy_xfer_mem_t mem; /* the initiator's: how its source blocks are read */
    bool ucx_cuda;
} fy_xfer_hello_t;

typedef struct fy_xfer_reply {
    uint64_t cookie;
    bool ok;
    fy_xfer_mem_t mem; /* the target's: what its arena is */
    bool ucx_cuda;
    fy_xfer_layout_t layout;       /* the target's */
    char message[FY_XFER_MSG_LEN]; /* the target's refusal, NUL-terminated; "" when ok */
} fy_xfer_reply_t;

void fy_xfer_hello_pack(const fy_xfer_hello_t *h, uint8_t out[FY_XFER_HELLO_LEN]);
fy_status_t fy_xfer_hello_unpack(const void *buf, size_t len, fy_xfer_hello_t *h_p);
void fy_xfer_reply_pack(const fy_xfer_reply_t *r, uint8_t out[FY_XFER_REPLY_LEN]);
fy_status_t fy_xfer_reply_unpack(const void *buf, size_t len, fy_xfer_reply_t *r_p);

#endif /* FY_XFER_WIRE_H */

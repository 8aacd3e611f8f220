/*
 * envelope.h - the control plane's authenticated envelope: who sent a
 * message, in which order, and a keyed MAC proving the sender holds the
 * deployment's secret.
 *
 * Every message on every nng socket of a cluster (client calls and their
 * replies, the router's commands, the workers' events) travels as
 *
 *   "FYE" 1 | kind | role | name length, name | incarnation | channel | sequence | time (ms)
 *         | [reply: the answered request's channel and sequence] | tag (16 B) | payload
 *
 * integers big-endian.  The tag is BLAKE2b-128 keyed with the control-plane
 * key (derived from kv.secret_file with crypto_kdf, a context of its own:
 * never the prefix-cache naming key) over every header byte before it and
 * the payload.  A channel is one sending socket (random, 64 bits); its
 * sequence numbers start at 1.  A receiver keeps a window per channel
 * (the highest sequence seen and a 64-bit bitmap of those below it, as
 * IPsec does), so messages sent from several threads may arrive a little
 * out of order, and none is accepted twice; a channel it has not seen must
 * be fresh (time within FY_ENV_FRESH_MS of now, after the receiver's start
 * and after anything it forgot).  See docs/protocol.md ("Authentication").
 *
 * Pure byte handling and libsodium: no sockets (rpc/rpc.c uses it),
 * no nng header.
 */
#ifndef FY_ENVELOPE_H
#define FY_ENVELOPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define FY_ENV_VERSION 1
#define FY_ENV_KEY_BYTES 32
#define FY_ENV_TAG_BYTES 16
#define FY_ENV_NAME_MAX 63    /* bytes of a sender's name, printable ASCII */
#define FY_ENV_MAX_HEADER 160 /* bytes before the payload, at most */
#define FY_ENV_WINDOW 64      /* sequence numbers a channel may arrive out of order by */
#define FY_ENV_SKEW_MS 2000   /* clock difference between hosts tolerated */
#define FY_ENV_FRESH_MS 60000 /* how old the first message of an unknown channel may be */

typedef enum fy_env_kind {
    FY_ENV_MSG = 1,     /* a request or a pushed message */
    FY_ENV_REPLY = 2,   /* a reply, bound to the request it answers */
    FY_ENV_REFUSAL = 3, /* a server's answer to a request it could not authenticate: no tag */
} fy_env_kind_t;

typedef enum fy_env_role {
    FY_ROLE_CLIENT = 1,
    FY_ROLE_ROUTER = 2,
    FY_ROLE_PREFILL = 3,
    FY_ROLE_DECODE = 4,
} fy_env_role_t;

/* Why a message was refused; FY_ENV_OK when it was not. */
typedef enum fy_env_fault {
    FY_ENV_OK = 0,
    FY_ENV_FORMAT,   /* not an envelope, another version, a malformed header */
    FY_ENV_MAC,      /* the tag does not verify: another secret, or altered bytes */
    FY_ENV_STALE,    /* its time is outside the window, or before this receiver started */
    FY_ENV_REPLAY,   /* its sequence number was seen already, or is behind the window */
    FY_ENV_IDENTITY, /* authentic, but this sender may not send it here */
    FY_ENV_N_FAULTS
} fy_env_fault_t;

/* "ok", "format", "mac", "stale", "replay", "identity" (the metric's label). */
const char *fy_env_fault_str(fy_env_fault_t f);
/* In words, for log lines: "bad MAC (another secret, or altered bytes)". */
const char *fy_env_fault_words(fy_env_fault_t f);
/* "client", "router", "prefill", "decode"; "?" for anything else. */
const char *fy_env_role_str(int role);

typedef struct fy_env_key {
    uint8_t k[FY_ENV_KEY_BYTES];
} fy_env_key_t;

/* A process's credentials: the control-plane key and who it is.  Copied by
 * value into each socket; wipe with fy_env_auth_wipe. */
typedef struct fy_env_auth {
    fy_env_key_t key;
    fy_env_role_t role;
    char name[FY_ENV_NAME_MAX + 1];
    uint64_t inc; /* the process's incarnation: random, never 0 */
} fy_env_auth_t;

/* Derives the control-plane key from the deployment's secret (16 to 64
 * bytes, as kv.secret_file holds) and fills a: role, name (printable
 * ASCII, 1 to 63 bytes) and inc (0: a random one). */
fy_status_t fy_env_auth_init(fy_env_auth_t *a, const uint8_t *secret, size_t len, fy_env_role_t role, const char *name,
                             uint64_t inc);
void fy_env_auth_wipe(fy_env_auth_t *a);

/* One envelope's header, as written or as read. */
typedef struct fy_env_hdr {
    fy_env_kind_t kind;
    int role;
    char name[FY_ENV_NAME_MAX + 1];
    uint64_t inc, chan, seq, ts_ms;
    uint64_t re_chan, re_seq; /* FY_ENV_REPLY: the request answered */
    fy_env_fault_t reason;    /* FY_ENV_REFUSAL: why */
} fy_env_hdr_t;

/* Milliseconds since the Unix epoch (CLOCK_REALTIME): envelopes' time. */
uint64_t fy_env_now_ms(void);
/* A random nonzero 64-bit id: a new channel. */
uint64_t fy_env_random_id(void);

/* Bytes of h's header (tag included): what goes before the payload. */
size_t fy_env_header_bytes(const fy_env_hdr_t *h);
/* Writes h (FY_ENV_MSG or FY_ENV_REPLY) and its tag over the payload into
 * out, which holds fy_env_header_bytes(h) bytes. */
void fy_env_seal(const fy_env_key_t *key, const fy_env_hdr_t *h, const void *payload, size_t len, uint8_t *out);
/* A whole refusal (no tag, no payload) into out; its length, or 0 when out is too small. */
size_t fy_env_refusal(const fy_env_hdr_t *h, fy_env_fault_t reason, uint8_t *out, size_t cap);

/* Reads the header of buf without checking the tag: FY_ENV_OK with *h and
 * *off_p (where the payload starts) set, else FY_ENV_FORMAT.  Every length
 * is checked against len; a refusal must end where its header does. */
fy_env_fault_t fy_env_parse(const void *buf, size_t len, fy_env_hdr_t *h, size_t *off_p);
/* fy_env_parse, then the tag (in constant time): FY_ENV_OK only for a
 * message or reply sealed with key.  Refusals are FY_ENV_FORMAT here. */
fy_env_fault_t fy_env_open(const fy_env_key_t *key, const void *buf, size_t len, fy_env_hdr_t *h, size_t *off_p);

/* ---- replay protection: what a receiver remembers of its senders ---- */

typedef struct fy_env_guard fy_env_guard_t;

/* Remembers up to capacity channels (the least recently heard is
 * forgotten first); start_ms is the receiver's start: nothing older than
 * it (less FY_ENV_SKEW_MS) is accepted. */
fy_status_t fy_env_guard_create(int capacity, uint64_t start_ms, fy_env_guard_t **g_p);
void fy_env_guard_destroy(fy_env_guard_t *g); /* accepts NULL */
/* An authenticated header (fy_env_open said FY_ENV_OK): FY_ENV_OK and
 * remembered, or FY_ENV_STALE, FY_ENV_REPLAY, or FY_ENV_IDENTITY (a known
 * channel now claimed by another sender).  Thread-safe. */
fy_env_fault_t fy_env_guard_admit(fy_env_guard_t *g, const fy_env_hdr_t *h, uint64_t now_ms);

#endif /* FY_ENVELOPE_H */

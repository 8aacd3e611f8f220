/*
 * envelope.h - the control plane's authenticated envelope: who sent a
 * message, in which order, and a keyed MAC proving the sender holds the
 * deployment's secret.
 *
 * Every message on every nng socket of a cluster (client calls and their
 * replies, the router's commands, the workers' events) travels as
 *
 *   "FYE" 2 | kind | role | name length, name | to role | to name length, to name
 *         | incarnation | to incarnation | channel | sequence | time (ms)
 *         | [reply: the answered request's channel and sequence] | tag (16 B) | payload
 *
 * integers big-endian.  The kind's top bit (FY_ENV_KIND_AEAD) says the
 * payload is encrypted: then the tag is XChaCha20-Poly1305's over the
 * header before it (associated data) and the ciphertext, under the
 * AEAD key of the same identity (below); else it is the BLAKE2b MAC and
 * the payload travels in clear.  "to" is the receiver's identity (role, name, and
 * its incarnation or 0 for any): a receiver takes only what is addressed
 * to itself, so a message captured on its way to one router cannot be
 * replayed to another.  A client that does not know its router's identity
 * yet asks with a hello (kind 4, "to" empty, no payload), which the
 * server's socket answers itself.
 *
 * Keys are per identity: the control-plane key (derived from
 * kv.secret_file with crypto_kdf, a context of its own: never the
 * prefix-cache naming key) keys BLAKE2b over role || name to give each
 * identity's key.  Routers and workers hold the deployment's secret and
 * so can derive every identity's key; a client holds only its own (a
 * client key file, `ferry key --client NAME`).  The tag is BLAKE2b-128,
 * keyed with the key of the client end when one end is a client (either
 * way), else with the sender's key, over every header byte before it and
 * the payload: a client key cannot speak as a router or a worker, nor as
 * another client.  The AEAD key of an identity is crypto_kdf's subkey of
 * its key under a context of its own ("fyaead01"): never the MAC key, and
 * a client derives its own from its key file while it cannot derive
 * another's.  The nonce is incarnation | channel | sequence (24 bytes,
 * all in the header): see envelope.c for why it never repeats under one
 * key.  A channel is one sending socket (random, 64 bits); its
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

#include "common/status.h"

#define FY_ENV_VERSION 2
#define FY_ENV_KIND_AEAD 0x80 /* in the kind byte: the payload is encrypted (XChaCha20-Poly1305) */
#define FY_ENV_KEY_BYTES 32
#define FY_ENV_TAG_BYTES 16
#define FY_ENV_NAME_MAX 63    /* bytes of a sender's name, printable ASCII */
#define FY_ENV_MAX_HEADER 224 /* bytes before the payload, at most (207 with two 63-byte names) */
#define FY_ENV_WINDOW 64      /* sequence numbers a channel may arrive out of order by */
#define FY_ENV_SKEW_MS 2000   /* clock difference between hosts tolerated */
#define FY_ENV_FRESH_MS 60000 /* how old the first message of an unknown channel may be */

typedef enum fy_env_kind {
    FY_ENV_MSG = 1,     /* a request or a pushed message */
    FY_ENV_REPLY = 2,   /* a reply, bound to the request it answers */
    FY_ENV_REFUSAL = 3, /* a server's answer to a request it could not authenticate: no tag */
    FY_ENV_HELLO = 4,   /* a client asks the server who it is: "to" empty, no payload */
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
    FY_ENV_CLEAR,    /* authentic, but its payload is in clear where cluster.encrypt requires encryption */
    FY_ENV_N_FAULTS
} fy_env_fault_t;

/* "ok", "format", "mac", "stale", "replay", "identity", "clear" (the metric's label). */
const char *fy_env_fault_str(fy_env_fault_t f);
/* In words, for log lines: "bad MAC (another secret, or altered bytes)". */
const char *fy_env_fault_words(fy_env_fault_t f);
/* "client", "router", "prefill", "decode"; "?" for anything else. */
const char *fy_env_role_str(int role);

typedef struct fy_env_key {
    uint8_t k[FY_ENV_KEY_BYTES];
} fy_env_key_t;

/* cluster.encrypt: when a socket encrypts payloads.  AUTO (the zero
 * value): on every connection whose address is not loopback (a dialer
 * judges by its URL, a listener by each message's remote address);
 * ALWAYS: on every connection; OFF: never of its own accord (a reply to
 * an encrypted request is still encrypted).  A receiver requires
 * encryption where it would encrypt itself: a clear message with a
 * payload from such a peer is refused (FY_ENV_CLEAR). */
typedef enum fy_env_crypt {
    FY_ENV_CRYPT_AUTO = 0,
    FY_ENV_CRYPT_ALWAYS = 1,
    FY_ENV_CRYPT_OFF = 2,
} fy_env_crypt_t;

/* Whether policy c encrypts (and requires encryption) on a connection
 * whose peer is on loopback (or not). */
static inline bool fy_env_crypt_wanted(fy_env_crypt_t c, bool loopback)
{
    return c == FY_ENV_CRYPT_ALWAYS || (c == FY_ENV_CRYPT_AUTO && !loopback);
}

/* A process's credentials: its identity's key and who it is, and the
 * control-plane key when it holds the deployment's secret.  Copied by
 * value into each socket; wipe with fy_env_auth_wipe. */
typedef struct fy_env_auth {
    fy_env_key_t key; /* this identity's (role, name) */
    fy_env_key_t ctl; /* the control-plane key: every identity's key derives from it (master only) */
    bool master;      /* holds ctl: a router or a worker; false: a client with its key file */
    fy_env_role_t role;
    char name[FY_ENV_NAME_MAX + 1];
    uint64_t inc;         /* the process's incarnation: random, never 0 */
    fy_env_crypt_t crypt; /* cluster.encrypt (the init functions set AUTO) */
} fy_env_auth_t;

/* Derives the control-plane key from the deployment's secret (16 to 64
 * bytes, as kv.secret_file holds) and this identity's key from it, and
 * fills a: role, name (printable ASCII, 1 to 63 bytes) and inc (0: a
 * random one). */
fy_status_t fy_env_auth_init(fy_env_auth_t *a, const uint8_t *secret, size_t len, fy_env_role_t role, const char *name,
                             uint64_t inc);
/* A client's credentials from its key alone (a client key file): it can
 * seal and open only what is between it and a server. */
fy_status_t fy_env_auth_client(fy_env_auth_t *a, const fy_env_key_t *key, const char *name, uint64_t inc);
void fy_env_auth_wipe(fy_env_auth_t *a);

/* The key of identity (role, name): keyed BLAKE2b-256 under ctl over
 * "fyid" | role | name. */
void fy_env_identity_key(const fy_env_key_t *ctl, int role, const char *name, fy_env_key_t *out);
/* The AEAD key of the identity whose key is id: crypto_kdf subkey 1 of id
 * under the context "fyaead01" (one-way: it does not give id back). */
void fy_env_aead_key(const fy_env_key_t *id, fy_env_key_t *out);

/* ---- client key files: "ferry-client-key 1 NAME HEX\n" (HEX: the key, 64 lowercase hex digits) ---- */

#define FY_ENV_KEYFILE_MAGIC "ferry-client-key 1 "
#define FY_ENV_KEYFILE_MAX 160 /* bytes of a key file, at most */

/* The file's text for (name, key) into out; its length, 0 when it does not fit. */
size_t fy_env_keyfile_format(const char *name, const fy_env_key_t *key, char *out, size_t cap);
/* Reads a key file's bytes: FY_OK with name and key, else FY_ERR_FORMAT
 * (a line that is not exactly the format: nothing else is taken). */
fy_status_t fy_env_keyfile_parse(const void *buf, size_t len, char name[FY_ENV_NAME_MAX + 1], fy_env_key_t *key);

/* An identity a message is addressed to: role (0: nobody yet, a hello),
 * name, incarnation (0: any). */
typedef struct fy_env_peer {
    int role;
    char name[FY_ENV_NAME_MAX + 1];
    uint64_t inc;
} fy_env_peer_t;

/* One envelope's header, as written or as read. */
typedef struct fy_env_hdr {
    fy_env_kind_t kind;
    int role;
    char name[FY_ENV_NAME_MAX + 1];
    fy_env_peer_t to; /* the receiver; empty (role 0, no name, inc 0) only in a hello */
    uint64_t inc, chan, seq, ts_ms;
    uint64_t re_chan, re_seq; /* FY_ENV_REPLY: the request answered */
    fy_env_fault_t reason;    /* FY_ENV_REFUSAL: why */
    bool aead;                /* the payload is (to be) encrypted: FY_ENV_MSG and FY_ENV_REPLY only (else ignored) */
} fy_env_hdr_t;

/* Milliseconds since the Unix epoch (CLOCK_REALTIME): envelopes' time. */
uint64_t fy_env_now_ms(void);
/* A random nonzero 64-bit id: a new channel. */
uint64_t fy_env_random_id(void);

/* Bytes of h's header (tag included): what goes before the payload. */
size_t fy_env_header_bytes(const fy_env_hdr_t *h);
/* Writes h (FY_ENV_MSG or FY_ENV_REPLY) and its tag over the payload into
 * out, which holds fy_env_header_bytes(h) bytes; key is the identity's
 * key.  h->aead: the payload is encrypted in place under the AEAD key
 * derived from key, the tag is the AEAD's; else it is left as it is and
 * the tag is the MAC. */
void fy_env_seal(const fy_env_key_t *key, const fy_env_hdr_t *h, void *payload, size_t len, uint8_t *out);
/* A whole refusal (no tag, no payload) into out; its length, or 0 when out is too small. */
size_t fy_env_refusal(const fy_env_hdr_t *h, fy_env_fault_t reason, uint8_t *out, size_t cap);

/* Reads the header of buf without checking the tag: FY_ENV_OK with *h and
 * *off_p (where the payload starts) set, else FY_ENV_FORMAT.  Every length
 * is checked against len; a refusal must end where its header does. */
fy_env_fault_t fy_env_parse(const void *buf, size_t len, fy_env_hdr_t *h, size_t *off_p);
/* fy_env_parse, then the tag (in constant time): FY_ENV_OK only for a
 * message or reply sealed with key.  Refusals are FY_ENV_FORMAT here.  An
 * encrypted payload (h->aead) is decrypted in place when it is authentic;
 * when it is not, the payload's bytes may be overwritten (zeros): never
 * with anything of the plaintext. */
fy_env_fault_t fy_env_open(const fy_env_key_t *key, void *buf, size_t len, fy_env_hdr_t *h, size_t *off_p);

/* ---- sealing and opening with a process's credentials ---- */

/* Identity keys a master derived, remembered (a small table; thread-safe). */
typedef struct fy_env_keys fy_env_keys_t;
fy_status_t fy_env_keys_create(fy_env_keys_t **k_p);
void fy_env_keys_destroy(fy_env_keys_t *k); /* accepts NULL */

/* The key that seals h: the client end's if either end is a client, else
 * the sender's.  False when a cannot have it (a client asked for another
 * identity's key).  keys may be NULL (no table: derived each time). */
bool fy_env_key_of(const fy_env_auth_t *a, fy_env_keys_t *keys, const fy_env_hdr_t *h, fy_env_key_t *out);
/* fy_env_seal under fy_env_key_of(h); false (nothing written) when a has no such key. */
bool fy_env_seal_as(const fy_env_auth_t *a, fy_env_keys_t *keys, const fy_env_hdr_t *h, void *payload, size_t len,
                    uint8_t *out);
/* Opens what a received: FY_ENV_FORMAT as fy_env_parse; FY_ENV_MAC when
 * the tag is not the one fy_env_key_of gives (or a cannot have that
 * key); FY_ENV_IDENTITY when it is authentic but addressed to someone
 * else (its "to" is not a's role and name, and a's incarnation or 0; an
 * empty "to" only in a hello).  An encrypted payload is decrypted in
 * place, as fy_env_open does. */
fy_env_fault_t fy_env_open_as(const fy_env_auth_t *a, fy_env_keys_t *keys, void *buf, size_t len, fy_env_hdr_t *h,
                              size_t *off_p);

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

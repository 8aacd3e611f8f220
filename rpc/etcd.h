/*
 * etcd.h - cluster membership through etcd (cluster.etcd): a small client
 * of etcd's v3 JSON gateway, the registration record, and the membership
 * thread every router and worker runs.
 *
 * The client speaks HTTP/1.1 with libcurl and JSON with jansson: lease
 * grant, keepalive and revoke, put, delete and range of a key prefix (keys
 * and values base64, as the gateway wants).  Several endpoints may be
 * given (http://a:2379,http://b:2379): a call tries each in turn, starting
 * with the last one that answered.  What etcd answers is untrusted bytes:
 * the parsers (fy_etcd_parse_*, fy_member_read) check every type and
 * length and have a fuzz target (tests/fuzz/fuzz_etcd.c).
 *
 * Membership: a process registers its record (fy_member_t, JSON) under
 * /ferry/<cluster>/<dir>/<name>, attached to a lease it keeps alive, and
 * reads the prefix it watches every watch round; a process that dies
 * disappears from the others' view when its lease expires.  Every record
 * is signed: a keyed BLAKE2b MAC (a key derived from the deployment's
 * secret, kv.secret_file, with a KDF context of its own) over its etcd key,
 * all of its fields and the time it was signed; a reader acts only on
 * records that verify and are neither older than FY_MEMBER_MAX_AGE(ttl)
 * nor from further in the future than FY_MEMBER_SKEW_S.  Whoever can reach
 * etcd without the secret can delete records but not forge one: a process
 * whose own record vanishes or changes writes it again in its next round,
 * and peers that still hear each other over nng do not drop each other
 * for a record's absence alone (router.c, node.c).  A router claims its
 * tag exclusively (/ferry/<cluster>/tags/<tag>, an etcd transaction).  Not here:
 * what a router or worker does with a member (router.c, node.c), and any
 * consensus of our own (etcd is the store).
 */
#ifndef FY_ETCD_H
#define FY_ETCD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/netconf.h"
#include "common/status.h"

/* ---- the JSON gateway's answers (untrusted input) ---- */

#define FY_ETCD_MAX_KEY 512        /* bytes of a key we accept */
#define FY_ETCD_MAX_VALUE 4096     /* bytes of a value we accept */
#define FY_ETCD_MAX_KVS 1024       /* keys in one range answer */
#define FY_ETCD_MAX_BODY (1 << 22) /* bytes of one answer */

typedef struct fy_etcd_kv {
    char key[FY_ETCD_MAX_KEY + 1]; /* NUL-terminated; a key holding NUL is refused */
    uint8_t *value;                /* value_len bytes, NUL-terminated past them */
    size_t value_len;
} fy_etcd_kv_t;

typedef struct fy_etcd_kvs {
    fy_etcd_kv_t *kv;
    int n;
} fy_etcd_kvs_t;

void fy_etcd_kvs_free(fy_etcd_kvs_t *k); /* accepts an empty one */

/* A /v3/kv/range answer: on success *out_p holds the pairs (the caller
 * frees it with fy_etcd_kvs_free); otherwise err names what is wrong. */
fy_status_t fy_etcd_parse_range(const void *json, size_t len, fy_etcd_kvs_t *out_p, char *err, size_t cap);
/* A /v3/lease/grant or /v3/lease/keepalive answer (the latter inside
 * "result"): the lease id and its TTL in seconds, 0 when etcd no longer
 * knows the lease (keepalive of an expired one). */
fy_status_t fy_etcd_parse_lease(const void *json, size_t len, int64_t *id_p, int64_t *ttl_p, char *err, size_t cap);
/* Any other answer (put, delete, revoke): FY_OK unless it is an error
 * object, whose message goes into err. */
fy_status_t fy_etcd_parse_ok(const void *json, size_t len, char *err, size_t cap);
/* A /v3/kv/txn answer: whether the comparison held, and (failure branch
 * of one range) the pairs it read (the caller frees *out_p). */
fy_status_t fy_etcd_parse_txn(const void *json, size_t len, bool *succeeded_p, fy_etcd_kvs_t *out_p, char *err,
                              size_t cap);

/* ---- the client ---- */

typedef struct fy_etcd fy_etcd_t;

/* endpoints: "http://host:port[,http://host:port]..." (the scheme may be
 * left out); each call gives up after timeout_s per endpoint. */
fy_status_t fy_etcd_create(const char *endpoints, double timeout_s, fy_etcd_t **e_p);

/* Checks tls (fy_etcd_tls_t, read by fy_netconf_etcd_tls in
 * common/netconf.h) against the endpoints, each refusal naming its key: a
 * file that cannot be opened or is not a regular file; a key file that is
 * not the owner's alone (as the secret file); a cert without a key or a
 * key without a cert; an https endpoint without a CA; a CA or cert with
 * an http endpoint (it would never be used); a user without a password or
 * one without a user, a password over http, or one with a byte that is
 * not printable or is '"' or '\\'.  The caller wipes the password when
 * it is refused. */
fy_status_t fy_etcd_tls_check(const fy_etcd_tls_t *tls, const char *endpoints);
/* fy_etcd_create with TLS (tls may be NULL: none); tls is copied. */
fy_status_t fy_etcd_create_tls(const char *endpoints, const fy_etcd_tls_t *tls, double timeout_s, fy_etcd_t **e_p);
/* POSTs json to a gateway path (e.g. /v3/auth/user/add): FY_OK unless it
 * failed or etcd answered an error (fy_etcd_last_error says which). */
fy_status_t fy_etcd_post(fy_etcd_t *e, const char *path, const char *json);
void fy_etcd_destroy(fy_etcd_t *e); /* accepts NULL */
/* The last failure's cause, for a log line (valid until the next call). */
const char *fy_etcd_last_error(const fy_etcd_t *e);
fy_status_t fy_etcd_grant(fy_etcd_t *e, int64_t ttl_s, int64_t *id_p);
/* *ttl_p: the lease's TTL after the renewal, 0 when it has expired. */
fy_status_t fy_etcd_keepalive(fy_etcd_t *e, int64_t id, int64_t *ttl_p);
fy_status_t fy_etcd_revoke(fy_etcd_t *e, int64_t id);
/* lease 0: none */
fy_status_t fy_etcd_put(fy_etcd_t *e, const char *key, const void *value, size_t len, int64_t lease);
fy_status_t fy_etcd_delete(fy_etcd_t *e, const char *key);
/* Every key beginning with prefix (the caller frees *out_p). */
fy_status_t fy_etcd_range_prefix(fy_etcd_t *e, const char *prefix, fy_etcd_kvs_t *out_p);
/* Puts key = value under lease if the key does not exist; otherwise
 * *created_p is false and *held_p holds what is there (the caller frees
 * it).  One etcd transaction. */
fy_status_t fy_etcd_create_key(fy_etcd_t *e, const char *key, const void *value, size_t len, int64_t lease,
                               bool *created_p, fy_etcd_kvs_t *held_p);

/* ---- the registration record ---- */

#define FY_MEMBER_VERSION 2
#define FY_MEMBER_KEY_BYTES 32
#define FY_MEMBER_MAC_BYTES 32
/* a record signed longer ago than this is refused (its owner signs it
 * again every TTL); FY_MEMBER_SKEW_S: the clocks' disagreement allowed */
#define FY_MEMBER_SKEW_S 30.0
#define FY_MEMBER_MAX_AGE(ttl_s) (3 * (ttl_s) + FY_MEMBER_SKEW_S)

typedef struct fy_member {
    char kind[16];    /* "router", "prefill" or "decode" */
    char name[64];    /* unique in the cluster; the last part of its key */
    uint64_t inc;     /* the process's incarnation (a new one per start) */
    char addr[256];   /* router: where workers push events; worker: its command address */
    char client[256]; /* router: its client address (ferry request); worker: "" */
    char http[256];   /* the process's HTTP address (/health), "" when none */
    uint32_t tag;     /* router: the high 32 bits of every request id it makes (1..2^20-1); worker: 0 */
    char model[64];   /* the model id (fy_model_id) */
    uint64_t layout;  /* fy_member_layout_hash of the KV layout */
    char version[32]; /* ferry's version */
    int64_t ts_ms;    /* when it was signed (Unix time, ms) */
    uint8_t mac[FY_MEMBER_MAC_BYTES];
} fy_member_t;

/* The membership key from the deployment's secret (16 to 64 bytes). */
fy_status_t fy_member_key(const uint8_t *secret, size_t len, uint8_t key[FY_MEMBER_KEY_BYTES]);
/* The record as JSON, its ts and mac as they are (NUL-terminated; the
 * caller fy_frees *json_p). */
fy_status_t fy_member_write(const fy_member_t *m, char **json_p, size_t *len_p);
/* Signs m for etcd key at now_ms (sets ts_ms and mac), then writes it. */
fy_status_t fy_member_sign(fy_member_t *m, const uint8_t key[FY_MEMBER_KEY_BYTES], const char *etcd_key, int64_t now_ms,
                           char **json_p, size_t *len_p);
/* Reads a record; every field is checked (type, length, range, kind).
 * It says nothing of who wrote it: fy_member_verify does. */
fy_status_t fy_member_read(const void *buf, size_t len, fy_member_t *m, char *err, size_t cap);
/* FY_OK when m's MAC verifies for etcd key under key, and it was signed
 * no more than max_age_s before now_ms nor more than FY_MEMBER_SKEW_S
 * after; otherwise FY_ERR_MISMATCH and err says which. */
fy_status_t fy_member_verify(const fy_member_t *m, const uint8_t key[FY_MEMBER_KEY_BYTES], const char *etcd_key,
                             int64_t now_ms, double max_age_s, char *err, size_t cap);
/* FY_OK when m serves model with layout; otherwise FY_ERR_MISMATCH and
 * err says which differs, naming the member. */
fy_status_t fy_member_compatible(const fy_member_t *m, const char *model, uint64_t layout, char *err, size_t cap);
/* A 64-bit digest of the KV layout's fields that both sides of a transfer
 * must agree on. */
uint64_t fy_member_layout_hash(int32_t block_size, int32_t dtype, int32_t n_layers, int32_t n_kv_heads,
                               int32_t head_dim, uint64_t block_bytes, uint64_t groups);

/* ---- the membership thread ---- */

typedef struct fy_membership fy_membership_t;

/* After every watch round that reached etcd: the compatible members under
 * the watched prefix (this process excluded), on the membership thread. */
typedef void (*fy_members_fn)(void *arg, const fy_member_t *live, int n);

typedef struct fy_membership_params {
    const char *endpoints; /* cluster.etcd */
    fy_etcd_tls_t tls;     /* cluster.etcd_ca, etcd_cert, etcd_key (fy_netconf_etcd_tls); zero: none */
    const char *cluster;   /* cluster.name */
    const char *dir;       /* where this process registers: "routers", "workers/prefill", "workers/decode" */
    const char *watch;     /* the prefix it watches under the cluster: "workers/" or "routers/" */
    fy_member_t self;
    uint8_t key[FY_MEMBER_KEY_BYTES]; /* fy_member_key: signs this record, verifies the others */
    struct fy_metric *refused;        /* optional: counts records refused (each once) */
    double ttl_s;                     /* the lease's TTL (cluster.etcd_ttl) */
    double poll_s;                    /* the watch round (cluster.etcd_poll) */
    fy_members_fn fn;
    /* optional: the record's lease expired (etcd lost us for longer than
     * the TTL: the others saw this process leave), called before it
     * registers again, on the membership thread */
    void (*lost)(void *arg);
    void *arg;
} fy_membership_params_t;

/* p's endpoints, cluster, ttl_s, poll_s, tls and key from m (read once at
 * start: fy_netconf_members), the TLS settings checked against the
 * endpoints (fy_etcd_tls_check) and the key derived from the deployment's
 * secret (fy_member_key): what a router and a worker do alike.  p's
 * strings point into m.  On failure (logged) p's TLS settings and key are
 * wiped; on success the caller wipes them after fy_membership_start. */
fy_status_t fy_membership_params_conf(fy_membership_params_t *p, const fy_member_conf_t *m);

/* Registers once, then starts the thread; etcd need not be up (the
 * thread keeps trying, and the process serves on what it knew last).  A
 * router whose tag another router holds in etcd: FY_ERR_MISMATCH, logged. */
fy_status_t fy_membership_start(const fy_membership_params_t *p, fy_membership_t **m_p);
/* Stops the thread and revokes the lease (the record goes at once). */
void fy_membership_stop(fy_membership_t *m); /* accepts NULL */
/* Whether the record is registered under a live lease now. */
bool fy_membership_registered(fy_membership_t *m);
/* Records refused so far (each distinct one once). */
uint64_t fy_membership_refused(fy_membership_t *m);

#endif /* FY_ETCD_H */

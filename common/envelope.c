/*
 * envelope.c - the control plane's authenticated envelope (see
 * envelope.h): key derivation, sealing, parsing and verifying, and the
 * receivers' replay windows.
 *
 * Not here: sockets (rpc/rpc.c), what a message says (msg.h), who may
 * send what (the router and the workers check identities).
 */
#include "common/envelope.h"

#include <pthread.h>
#include <string.h>
#include <time.h>

#include <sodium.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"

static const uint8_t MAGIC[3] = {'F', 'Y', 'E'};

/* crypto_kdf's context for the control-plane key: 8 bytes of its own, so no
 * other key taken from kv.secret_file (the prefix-cache hasher keys BLAKE2b
 * with the raw secret) can coincide with it */
static const char KDF_CTX[crypto_kdf_CONTEXTBYTES + 1] = "fyctlpl1";
#define KDF_SUBKEY_ID 1

/* crypto_kdf's context for an identity's AEAD key, taken from its MAC key:
 * the two are never the same key */
static const char AEAD_CTX[crypto_kdf_CONTEXTBYTES + 1] = "fyaead01";
#define AEAD_SUBKEY_ID 1

static const char *const FAULTS[FY_ENV_N_FAULTS] = {"ok", "format", "mac", "stale", "replay", "identity", "clear"};
static const char *const FAULT_WORDS[FY_ENV_N_FAULTS] = {
    "ok",
    "not an envelope (a client or peer without authentication, or garbage)",
    "bad MAC (another secret, or altered bytes)",
    "stale (its time is outside the window or before this process started: clocks apart, or a replay)",
    "replayed (a sequence number seen before, or behind the window)",
    "sender not allowed (its role or name does not fit the message)",
    "not encrypted (a clear payload from a peer off loopback: set cluster.encrypt alike everywhere)",
};

const char *fy_env_fault_str(fy_env_fault_t f) { return f >= 0 && f < FY_ENV_N_FAULTS ? FAULTS[f] : "?"; }
const char *fy_env_fault_words(fy_env_fault_t f) { return f >= 0 && f < FY_ENV_N_FAULTS ? FAULT_WORDS[f] : "?"; }

const char *fy_env_role_str(int role)
{
    switch (role) {
    case FY_ROLE_CLIENT: return "client";
    case FY_ROLE_ROUTER: return "router";
    case FY_ROLE_PREFILL: return "prefill";
    case FY_ROLE_DECODE: return "decode";
    default: return "?";
    }
}

static bool role_ok(int role) { return role >= FY_ROLE_CLIENT && role <= FY_ROLE_DECODE; }

/* crypto's domain for identity keys: "fyid" | role | name under the control-plane key */
static const uint8_t ID_DOMAIN[4] = {'f', 'y', 'i', 'd'};

static bool name_ok(const char *s, size_t n)
{
    if (n < 1 || n > FY_ENV_NAME_MAX) return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x21 || (unsigned char)s[i] > 0x7e) return false;
    return true;
}

uint64_t fy_env_now_ms(void) { return (uint64_t)fy_wall_ms(); }

uint64_t fy_env_random_id(void)
{
    uint64_t v = 0;
    if (sodium_init() < 0) return 0;
    while (!v) randombytes_buf(&v, sizeof(v));
    return v;
}

fy_status_t fy_env_auth_init(fy_env_auth_t *a, const uint8_t *secret, size_t len, fy_env_role_t role, const char *name,
                             uint64_t inc)
{
    if (len < 16 || len > 64) {
        fy_error("auth: the deployment's secret must be 16 to 64 bytes, not %zu", len);
        return FY_ERR_INVALID;
    }
    size_t nl = name ? strlen(name) : 0;
    if (!role_ok(role) || !name_ok(name ? name : "", nl)) {
        fy_error("auth: '%s' cannot name a sender (1 to %d printable ASCII characters, no spaces)", name ? name : "",
                 FY_ENV_NAME_MAX);
        return FY_ERR_INVALID;
    }
    if (sodium_init() < 0) {
        fy_error("auth: libsodium failed to initialize");
        return FY_ERR_INTERNAL;
    }
    uint8_t master[crypto_kdf_KEYBYTES];
    crypto_generichash(master, sizeof(master), secret, len, NULL, 0);
    crypto_kdf_derive_from_key(a->ctl.k, FY_ENV_KEY_BYTES, KDF_SUBKEY_ID, KDF_CTX, master);
    sodium_memzero(master, sizeof(master));
    a->master = true;
    fy_env_identity_key(&a->ctl, role, name, &a->key);
    a->role = role;
    memcpy(a->name, name, nl + 1);
    a->inc = inc;
    while (!a->inc) randombytes_buf(&a->inc, sizeof(a->inc));
    a->crypt = FY_ENV_CRYPT_AUTO;
    return FY_OK;
}

fy_status_t fy_env_auth_client(fy_env_auth_t *a, const fy_env_key_t *key, const char *name, uint64_t inc)
{
    size_t nl = name ? strlen(name) : 0;
    if (!name_ok(name ? name : "", nl)) {
        fy_error("auth: '%s' cannot name a client (1 to %d printable ASCII characters, no spaces)", name ? name : "",
                 FY_ENV_NAME_MAX);
        return FY_ERR_INVALID;
    }
    if (sodium_init() < 0) {
        fy_error("auth: libsodium failed to initialize");
        return FY_ERR_INTERNAL;
    }
    memset(a, 0, sizeof(*a));
    a->key = *key;
    a->master = false;
    a->role = FY_ROLE_CLIENT;
    memcpy(a->name, name, nl + 1);
    a->inc = inc;
    while (!a->inc) randombytes_buf(&a->inc, sizeof(a->inc));
    return FY_OK;
}

void fy_env_auth_wipe(fy_env_auth_t *a) { sodium_memzero(a, sizeof(*a)); }

void fy_env_identity_key(const fy_env_key_t *ctl, int role, const char *name, fy_env_key_t *out)
{
    uint8_t r = (uint8_t)role;
    crypto_generichash_blake2b_state st;
    crypto_generichash_blake2b_init(&st, ctl->k, FY_ENV_KEY_BYTES, FY_ENV_KEY_BYTES);
    crypto_generichash_blake2b_update(&st, ID_DOMAIN, sizeof(ID_DOMAIN));
    crypto_generichash_blake2b_update(&st, &r, 1);
    crypto_generichash_blake2b_update(&st, (const uint8_t *)name, strlen(name));
    crypto_generichash_blake2b_final(&st, out->k, FY_ENV_KEY_BYTES);
    sodium_memzero(&st, sizeof(st));
}

void fy_env_aead_key(const fy_env_key_t *id, fy_env_key_t *out)
{
    crypto_kdf_derive_from_key(out->k, FY_ENV_KEY_BYTES, AEAD_SUBKEY_ID, AEAD_CTX, id->k);
}

/* ---- client key files ---------------------------------------------------------------------------- */

size_t fy_env_keyfile_format(const char *name, const fy_env_key_t *key, char *out, size_t cap)
{
    size_t nl = strlen(name);
    if (!name_ok(name, nl)) return 0;
    char hex[2 * FY_ENV_KEY_BYTES + 1];
    sodium_bin2hex(hex, sizeof(hex), key->k, FY_ENV_KEY_BYTES);
    int n = snprintf(out, cap, "%s%s %s\n", FY_ENV_KEYFILE_MAGIC, name, hex);
    sodium_memzero(hex, sizeof(hex));
    return n > 0 && (size_t)n < cap ? (size_t)n : 0;
}

static int hexval(uint8_t c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; }

fy_status_t fy_env_keyfile_parse(const void *buf, size_t len, char name[FY_ENV_NAME_MAX + 1], fy_env_key_t *key)
{
    const uint8_t *b = buf;
    size_t ml = sizeof(FY_ENV_KEYFILE_MAGIC) - 1;
    if (len > FY_ENV_KEYFILE_MAX || len < ml || memcmp(b, FY_ENV_KEYFILE_MAGIC, ml)) return FY_ERR_FORMAT;
    if (b[len - 1] == '\n') len--; /* one line, its newline optional */
    size_t i = ml, nl = 0;
    while (i + nl < len && b[i + nl] != ' ') nl++;
    if (!name_ok((const char *)b + i, nl) || len != i + nl + 1 + 2 * FY_ENV_KEY_BYTES) return FY_ERR_FORMAT;
    const uint8_t *h = b + i + nl + 1;
    fy_env_key_t k;
    for (int j = 0; j < FY_ENV_KEY_BYTES; j++) {
        int hi = hexval(h[2 * j]), lo = hexval(h[2 * j + 1]);
        if (hi < 0 || lo < 0) {
            sodium_memzero(&k, sizeof(k));
            return FY_ERR_FORMAT;
        }
        k.k[j] = (uint8_t)(hi << 4 | lo);
    }
    memcpy(name, b + i, nl);
    name[nl] = 0;
    *key = k;
    sodium_memzero(&k, sizeof(k));
    return FY_OK;
}

/* ---- bytes ------------------------------------------------------------------------------------- */

static uint8_t *put64(uint8_t *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--) *p++ = (uint8_t)(v >> (8 * i));
    return p;
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = v << 8 | p[i];
    return v;
}

/* Bytes from the start to the tag (or to the reason of a refusal). */
static size_t fixed_bytes(const fy_env_hdr_t *h, size_t name_len, size_t to_len)
{
    return 7 + name_len + 2 + to_len + 40 + (h->kind == FY_ENV_REPLY ? 16 : 0);
}

size_t fy_env_header_bytes(const fy_env_hdr_t *h)
{
    return fixed_bytes(h, strlen(h->name), strlen(h->to.name)) + (h->kind == FY_ENV_REFUSAL ? 1 : FY_ENV_TAG_BYTES);
}

/* Whether h's payload is encrypted: only a message's or a reply's can be
 * (a hello and a refusal carry none). */
static bool aead_of(const fy_env_hdr_t *h) { return h->aead && (h->kind == FY_ENV_MSG || h->kind == FY_ENV_REPLY); }

/* Everything before the tag; returns where the tag goes. */
static uint8_t *write_header(const fy_env_hdr_t *h, uint8_t *p)
{
    size_t nl = strlen(h->name), tl = strlen(h->to.name);
    memcpy(p, MAGIC, 3);
    p[3] = FY_ENV_VERSION;
    p[4] = (uint8_t)(h->kind | (aead_of(h) ? FY_ENV_KIND_AEAD : 0));
    p[5] = (uint8_t)h->role;
    p[6] = (uint8_t)nl;
    memcpy(p + 7, h->name, nl);
    p += 7 + nl;
    p[0] = (uint8_t)h->to.role;
    p[1] = (uint8_t)tl;
    memcpy(p + 2, h->to.name, tl);
    p += 2 + tl;
    p = put64(p, h->inc);
    p = put64(p, h->to.inc);
    p = put64(p, h->chan);
    p = put64(p, h->seq);
    p = put64(p, h->ts_ms);
    if (h->kind == FY_ENV_REPLY) {
        p = put64(p, h->re_chan);
        p = put64(p, h->re_seq);
    }
    return p;
}

static void mac(const fy_env_key_t *key, const uint8_t *hdr, size_t hlen, const void *payload, size_t len,
                uint8_t tag[FY_ENV_TAG_BYTES])
{
    crypto_generichash_blake2b_state st;
    crypto_generichash_blake2b_init(&st, key->k, FY_ENV_KEY_BYTES, FY_ENV_TAG_BYTES);
    crypto_generichash_blake2b_update(&st, hdr, hlen);
    if (len) crypto_generichash_blake2b_update(&st, payload, len);
    crypto_generichash_blake2b_final(&st, tag, FY_ENV_TAG_BYTES);
}

/* The AEAD's nonce: incarnation | channel | sequence, as the header
 * carries them.  It never repeats under one key.  A key is one identity's
 * (a client end's, or a router's or a worker's own), and everyone who
 * seals with it picks a random nonzero incarnation per process and a
 * random nonzero channel per sending socket, whose sequence numbers count
 * up from 1 and are taken once per message (rpc.c takes a new one for
 * every seal, resends included); so a repeat needs two sockets sealing
 * under one key to draw the same 128 random bits.  That is why it is
 * XChaCha20 (24-byte nonces) and not ChaCha20-IETF: 12 bytes would hold
 * the channel and 32 bits of sequence only, leaving 64 random bits (a
 * birthday bound of 2^32 sockets of one identity, restarts included) and
 * a sequence that could wrap. */
static void aead_nonce(const fy_env_hdr_t *h, uint8_t n[crypto_aead_xchacha20poly1305_ietf_NPUBBYTES])
{
    put64(put64(put64(n, h->inc), h->chan), h->seq);
}

void fy_env_seal(const fy_env_key_t *key, const fy_env_hdr_t *h, void *payload, size_t len, uint8_t *out)
{
    uint8_t *tag = write_header(h, out);
    if (!aead_of(h)) {
        mac(key, out, (size_t)(tag - out), payload, len, tag);
        return;
    }
    fy_env_key_t ek;
    uint8_t nonce[crypto_aead_xchacha20poly1305_ietf_NPUBBYTES];
    fy_env_aead_key(key, &ek);
    aead_nonce(h, nonce);
    crypto_aead_xchacha20poly1305_ietf_encrypt_detached(payload, tag, NULL, payload, len, out, (size_t)(tag - out),
                                                        NULL, nonce, ek.k);
    sodium_memzero(&ek, sizeof(ek));
}

size_t fy_env_refusal(const fy_env_hdr_t *h, fy_env_fault_t reason, uint8_t *out, size_t cap)
{
    fy_env_hdr_t r = *h;
    r.kind = FY_ENV_REFUSAL; /* in clear: it carries nothing to hide */
    size_t need = fy_env_header_bytes(&r);
    if (need > cap) return 0;
    uint8_t *p = write_header(&r, out);
    *p = (uint8_t)reason;
    return need;
}

fy_env_fault_t fy_env_parse(const void *buf, size_t len, fy_env_hdr_t *h, size_t *off_p)
{
    const uint8_t *b = buf;
    if (len < 7 || memcmp(b, MAGIC, 3) || b[3] != FY_ENV_VERSION) return FY_ENV_FORMAT;
    fy_env_hdr_t x;
    memset(&x, 0, sizeof(x));
    x.kind = (fy_env_kind_t)(b[4] & ~FY_ENV_KIND_AEAD);
    x.aead = b[4] & FY_ENV_KIND_AEAD;
    x.role = b[5];
    size_t nl = b[6];
    if ((x.kind != FY_ENV_MSG && x.kind != FY_ENV_REPLY && x.kind != FY_ENV_REFUSAL && x.kind != FY_ENV_HELLO) ||
        (x.aead && x.kind != FY_ENV_MSG && x.kind != FY_ENV_REPLY) || !role_ok(x.role) || nl > FY_ENV_NAME_MAX)
        return FY_ENV_FORMAT;
    if (len < 7 + nl + 2 || !name_ok((const char *)b + 7, nl)) return FY_ENV_FORMAT;
    const uint8_t *t = b + 7 + nl;
    size_t tl = t[1];
    x.to.role = t[0];
    /* "to": a role and a name, or nothing at all (a hello's, or a refusal of one) */
    if (tl > FY_ENV_NAME_MAX || (tl ? !role_ok(x.to.role) : x.to.role != 0)) return FY_ENV_FORMAT;
    size_t fixed = fixed_bytes(&x, nl, tl), end = fixed + (x.kind == FY_ENV_REFUSAL ? 1 : FY_ENV_TAG_BYTES);
    if (len < end || (tl && !name_ok((const char *)t + 2, tl))) return FY_ENV_FORMAT;
    memcpy(x.name, b + 7, nl);
    x.name[nl] = 0;
    memcpy(x.to.name, t + 2, tl);
    x.to.name[tl] = 0;
    const uint8_t *p = t + 2 + tl;
    x.inc = get64(p);
    x.to.inc = get64(p + 8);
    x.chan = get64(p + 16);
    x.seq = get64(p + 24);
    x.ts_ms = get64(p + 32);
    if (x.kind == FY_ENV_REPLY) {
        x.re_chan = get64(p + 40);
        x.re_seq = get64(p + 48);
    }
    if (!x.inc || !x.chan || !x.seq) return FY_ENV_FORMAT;
    if (!tl && x.to.inc) return FY_ENV_FORMAT;
    if (x.kind == FY_ENV_HELLO && (tl || len != end)) return FY_ENV_FORMAT; /* a hello: nobody yet, nothing said */
    if (x.kind == FY_ENV_REFUSAL) {
        x.reason = (fy_env_fault_t)b[fixed];
        if (len != end || x.reason <= FY_ENV_OK || x.reason >= FY_ENV_N_FAULTS) return FY_ENV_FORMAT;
    }
    *h = x;
    *off_p = end;
    return FY_ENV_OK;
}

fy_env_fault_t fy_env_open(const fy_env_key_t *key, void *buf, size_t len, fy_env_hdr_t *h, size_t *off_p)
{
    fy_env_hdr_t x;
    size_t off;
    fy_env_fault_t f = fy_env_parse(buf, len, &x, &off);
    if (f) return f;
    if (x.kind == FY_ENV_REFUSAL) return FY_ENV_FORMAT;
    uint8_t *b = buf;
    size_t tag_at = off - FY_ENV_TAG_BYTES;
    if (x.aead) { /* verified before anything is decrypted (libsodium's detached open) */
        fy_env_key_t ek;
        uint8_t nonce[crypto_aead_xchacha20poly1305_ietf_NPUBBYTES];
        fy_env_aead_key(key, &ek);
        aead_nonce(&x, nonce);
        int rc = crypto_aead_xchacha20poly1305_ietf_decrypt_detached(b + off, NULL, b + off, len - off, b + tag_at, b,
                                                                     tag_at, nonce, ek.k);
        sodium_memzero(&ek, sizeof(ek));
        if (rc) return FY_ENV_MAC;
    } else {
        uint8_t tag[FY_ENV_TAG_BYTES];
        mac(key, b, tag_at, b + off, len - off, tag);
        if (sodium_memcmp(tag, b + tag_at, FY_ENV_TAG_BYTES)) return FY_ENV_MAC;
    }
    *h = x;
    *off_p = off;
    return FY_ENV_OK;
}

/* ---- sealing and opening with credentials ------------------------------------------------------- */

#define KEYS_SLOTS 256 /* identities a receiver remembers keys of (direct-mapped) */

typedef struct key_slot {
    bool used;
    uint8_t role;
    char name[FY_ENV_NAME_MAX + 1];
    fy_env_key_t key;
} key_slot_t;

struct fy_env_keys {
    pthread_mutex_t mu;
    key_slot_t slot[KEYS_SLOTS];
};

fy_status_t fy_env_keys_create(fy_env_keys_t **k_p)
{
    fy_env_keys_t *k = fy_calloc(1, sizeof(*k));
    if (!k) return FY_ERR_NOMEM;
    pthread_mutex_init(&k->mu, NULL);
    *k_p = k;
    return FY_OK;
}

void fy_env_keys_destroy(fy_env_keys_t *k)
{
    if (!k) return;
    pthread_mutex_destroy(&k->mu);
    sodium_memzero(k->slot, sizeof(k->slot));
    fy_free(k);
}

/* The key of (role, name) for a: its own, or derived from ctl (remembered in keys). */
static bool key_for(const fy_env_auth_t *a, fy_env_keys_t *keys, int role, const char *name, fy_env_key_t *out)
{
    if (role == (int)a->role && !strcmp(name, a->name)) {
        *out = a->key;
        return true;
    }
    if (!a->master) return false;
    if (!keys) {
        fy_env_identity_key(&a->ctl, role, name, out);
        return true;
    }
    uint32_t h = 2166136261u ^ (uint32_t)role; /* FNV-1a: a table index, nothing secret */
    for (const char *c = name; *c; c++) h = (h ^ (uint8_t)*c) * 16777619u;
    key_slot_t *s = &keys->slot[h % KEYS_SLOTS];
    pthread_mutex_lock(&keys->mu);
    if (!s->used || s->role != (uint8_t)role || strcmp(s->name, name)) {
        fy_env_identity_key(&a->ctl, role, name, &s->key);
        s->used = true;
        s->role = (uint8_t)role;
        snprintf(s->name, sizeof(s->name), "%s", name);
    }
    *out = s->key;
    pthread_mutex_unlock(&keys->mu);
    return true;
}

bool fy_env_key_of(const fy_env_auth_t *a, fy_env_keys_t *keys, const fy_env_hdr_t *h, fy_env_key_t *out)
{
    if (h->role == FY_ROLE_CLIENT) return key_for(a, keys, FY_ROLE_CLIENT, h->name, out);
    if (h->to.role == FY_ROLE_CLIENT) return key_for(a, keys, FY_ROLE_CLIENT, h->to.name, out);
    return key_for(a, keys, h->role, h->name, out);
}

bool fy_env_seal_as(const fy_env_auth_t *a, fy_env_keys_t *keys, const fy_env_hdr_t *h, void *payload, size_t len,
                    uint8_t *out)
{
    fy_env_key_t k;
    if (!fy_env_key_of(a, keys, h, &k)) return false;
    fy_env_seal(&k, h, payload, len, out);
    sodium_memzero(&k, sizeof(k));
    return true;
}

fy_env_fault_t fy_env_open_as(const fy_env_auth_t *a, fy_env_keys_t *keys, void *buf, size_t len, fy_env_hdr_t *h,
                              size_t *off_p)
{
    fy_env_hdr_t x;
    size_t off;
    fy_env_fault_t f = fy_env_parse(buf, len, &x, &off);
    if (f) return f;
    if (x.kind == FY_ENV_REFUSAL) return FY_ENV_FORMAT;
    fy_env_key_t k;
    if (!fy_env_key_of(a, keys, &x, &k)) return FY_ENV_MAC; /* a client: not between it and us */
    f = fy_env_open(&k, buf, len, &x, &off);
    sodium_memzero(&k, sizeof(k));
    if (f) return f;
    bool to_me = x.kind == FY_ENV_HELLO
                     ? !x.to.role
                     : x.to.role == (int)a->role && !strcmp(x.to.name, a->name) && (!x.to.inc || x.to.inc == a->inc);
    if (!to_me) return FY_ENV_IDENTITY;
    *h = x;
    *off_p = off;
    return FY_ENV_OK;
}

/* ---- replay windows -------------------------------------------------------------------------------- */

typedef struct chan_ent {
    uint64_t chan, inc;
    uint8_t role;
    uint8_t name_digest[8]; /* the sender's name, as a short digest */
    uint64_t top;           /* highest sequence accepted */
    uint64_t bits;          /* bit i: top - i was accepted */
    uint64_t last_ts;       /* its latest message's time */
    uint64_t used;          /* when it was last heard (a counter), for forgetting */
    int32_t next;           /* hash chain; -1 ends */
} chan_ent_t;

struct fy_env_guard {
    pthread_mutex_t mu;
    chan_ent_t *ents; /* [cap] */
    int32_t *buckets; /* [n_buckets] */
    int cap, n, n_buckets;
    uint64_t start_ms;
    uint64_t floor_ms; /* the newest time of any forgotten channel: new ones must be later */
    uint64_t clock;
};

fy_status_t fy_env_guard_create(int capacity, uint64_t start_ms, fy_env_guard_t **g_p)
{
    if (capacity < 1 || capacity > (1 << 20)) return FY_ERR_INVALID;
    fy_env_guard_t *g = fy_calloc(1, sizeof(*g));
    int nb = 1;
    while (nb < 2 * capacity) nb <<= 1;
    if (g) {
        g->ents = fy_calloc((size_t)capacity, sizeof(*g->ents));
        g->buckets = fy_malloc((size_t)nb * sizeof(int32_t));
    }
    if (!g || !g->ents || !g->buckets) {
        if (g) {
            fy_free(g->ents);
            fy_free(g->buckets);
        }
        fy_free(g);
        return FY_ERR_NOMEM;
    }
    for (int i = 0; i < nb; i++) g->buckets[i] = -1;
    g->cap = capacity;
    g->n_buckets = nb;
    g->start_ms = start_ms;
    pthread_mutex_init(&g->mu, NULL);
    *g_p = g;
    return FY_OK;
}

void fy_env_guard_destroy(fy_env_guard_t *g)
{
    if (!g) return;
    pthread_mutex_destroy(&g->mu);
    fy_free(g->ents);
    fy_free(g->buckets);
    fy_free(g);
}

static uint32_t bucket_of(const fy_env_guard_t *g, uint64_t chan)
{
    uint64_t h = chan * 0x9e3779b97f4a7c15ull;
    return (uint32_t)(h >> 32) & (uint32_t)(g->n_buckets - 1);
}

static void name_digest(const char *name, uint8_t out[8])
{
    crypto_generichash(out, 8, (const unsigned char *)name, strlen(name), NULL, 0);
}

/* Frees a slot: the least recently heard channel is forgotten (and the
 * floor rises to its newest time, so its old messages stay refused). */
static int32_t slot_take(fy_env_guard_t *g)
{
    if (g->n < g->cap) return g->n++;
    int32_t lru = 0;
    for (int32_t i = 1; i < g->cap; i++)
        if (g->ents[i].used < g->ents[lru].used) lru = i;
    chan_ent_t *e = &g->ents[lru];
    int32_t *pp = &g->buckets[bucket_of(g, e->chan)];
    while (*pp != lru) pp = &g->ents[*pp].next;
    *pp = e->next;
    if (e->last_ts > g->floor_ms) g->floor_ms = e->last_ts;
    return lru;
}

fy_env_fault_t fy_env_guard_admit(fy_env_guard_t *g, const fy_env_hdr_t *h, uint64_t now_ms)
{
    /* the clock checks every message passes: not from the future, not from before this receiver */
    if (h->ts_ms > now_ms + FY_ENV_SKEW_MS) return FY_ENV_STALE;
    if (h->ts_ms + FY_ENV_SKEW_MS < g->start_ms) return FY_ENV_STALE;
    uint8_t dig[8];
    name_digest(h->name, dig);
    pthread_mutex_lock(&g->mu);
    fy_env_fault_t f = FY_ENV_OK;
    uint32_t b = bucket_of(g, h->chan);
    int32_t i = g->buckets[b];
    while (i >= 0 && g->ents[i].chan != h->chan) i = g->ents[i].next;
    if (i < 0) { /* a channel not heard from (or forgotten): only a fresh message opens it */
        if (h->ts_ms + FY_ENV_FRESH_MS < now_ms || h->ts_ms <= g->floor_ms) {
            f = FY_ENV_STALE;
        } else {
            i = slot_take(g);
            chan_ent_t *e = &g->ents[i];
            *e = (chan_ent_t){.chan = h->chan,
                              .inc = h->inc,
                              .role = (uint8_t)h->role,
                              .top = h->seq,
                              .bits = 1,
                              .last_ts = h->ts_ms,
                              .used = ++g->clock,
                              .next = g->buckets[b]};
            memcpy(e->name_digest, dig, sizeof(dig));
            g->buckets[b] = i;
        }
        pthread_mutex_unlock(&g->mu);
        return f;
    }
    chan_ent_t *e = &g->ents[i];
    if (e->inc != h->inc || e->role != h->role || memcmp(e->name_digest, dig, sizeof(dig))) {
        f = FY_ENV_IDENTITY; /* one channel, two senders: not one of ours */
    } else if (h->seq > e->top) {
        uint64_t shift = h->seq - e->top;
        e->bits = shift >= 64 ? 1 : e->bits << shift | 1;
        e->top = h->seq;
    } else {
        uint64_t back = e->top - h->seq;
        if (back >= FY_ENV_WINDOW || (e->bits >> back & 1))
            f = FY_ENV_REPLAY;
        else
            e->bits |= 1ull << back;
    }
    if (!f) {
        if (h->ts_ms > e->last_ts) e->last_ts = h->ts_ms;
        e->used = ++g->clock;
    }
    pthread_mutex_unlock(&g->mu);
    return f;
}

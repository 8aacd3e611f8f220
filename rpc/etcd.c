/*
 * etcd.c - the etcd v3 JSON gateway client, the registration record and
 * the membership thread (see etcd.h).
 *
 * Why polling a range rather than /v3/watch: a watch round is one small
 * range of the prefix, which answers "who is there now" directly, needs
 * no revision bookkeeping to resume after etcd was away or compacted, and
 * costs etcd one read per process per round (cluster.etcd_poll, 250 ms by
 * default); a streaming watch would tell of a change sooner by at most
 * that round.
 */
#include "rpc/etcd.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"
#include "common/metrics.h"
#include "common/version.h"

/* ---- parsing ------------------------------------------------------------------------------------- */

#define ERR(...) (err && cap ? (void)snprintf(err, cap, __VA_ARGS__) : (void)0)

void fy_etcd_kvs_free(fy_etcd_kvs_t *k)
{
    if (!k) return;
    for (int i = 0; i < k->n; i++) fy_free(k->kv[i].value);
    fy_free(k->kv);
    k->kv = NULL;
    k->n = 0;
}

static json_t *parse_json(const void *buf, size_t len, char *err, size_t cap)
{
    if (len > FY_ETCD_MAX_BODY) {
        ERR("answer of %zu bytes, more than %d", len, FY_ETCD_MAX_BODY);
        return NULL;
    }
    json_error_t je;
    json_t *j = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
    if (!j) {
        ERR("not JSON: %s", je.text);
        return NULL;
    }
    if (!json_is_object(j)) {
        ERR("not a JSON object");
        json_decref(j);
        return NULL;
    }
    return j;
}

/* an error object ({"error": ..., "code": N, "message": ...}) */
static bool is_error(json_t *j, char *err, size_t cap)
{
    json_t *e = json_object_get(j, "error");
    if (!e) return false;
    json_t *m = json_object_get(j, "message");
    const char *s = json_is_string(m) ? json_string_value(m) : json_is_string(e) ? json_string_value(e) : "?";
    ERR("etcd: %.200s", s);
    return true;
}

/* The gateway writes 64-bit integers as strings; a number is taken too. */
static bool get_i64(json_t *j, int64_t *v)
{
    if (json_is_integer(j)) {
        *v = json_integer_value(j);
        return true;
    }
    if (!json_is_string(j)) return false;
    const char *s = json_string_value(j);
    size_t n = json_string_length(j);
    if (n == 0 || n > 20) return false;
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (errno || end != s + n) return false;
    *v = x;
    return true;
}

/* base64 in, bytes out (NUL-terminated); max: bytes allowed */
static bool b64_decode(json_t *j, size_t max, uint8_t **out_p, size_t *len_p)
{
    if (!json_is_string(j)) return false;
    const char *s = json_string_value(j);
    size_t n = json_string_length(j);
    if (n > (max + 2) / 3 * 4) return false;
    uint8_t *out = fy_malloc(n / 4 * 3 + 4);
    if (!out) return false;
    size_t len = 0;
    if (sodium_base642bin(out, n / 4 * 3 + 3, s, n, NULL, &len, NULL, sodium_base64_VARIANT_ORIGINAL) != 0 ||
        len > max) {
        fy_free(out);
        return false;
    }
    out[len] = 0;
    *out_p = out;
    *len_p = len;
    return true;
}

/* the pairs of a range answer's object (its "kvs") */
static fy_status_t kvs_of(json_t *j, fy_etcd_kvs_t *out_p, char *err, size_t cap)
{
    fy_status_t st = FY_ERR_FORMAT;
    fy_etcd_kvs_t k = {0};
    json_t *kvs = json_object_get(j, "kvs");
    if (!kvs) { /* no key under the prefix: the gateway leaves "kvs" out */
        st = FY_OK;
        goto out;
    }
    if (!json_is_array(kvs)) {
        ERR("\"kvs\" is not an array");
        goto out;
    }
    size_t n = json_array_size(kvs);
    if (n > FY_ETCD_MAX_KVS) {
        ERR("%zu keys, more than %d", n, FY_ETCD_MAX_KVS);
        goto out;
    }
    if (n && !(k.kv = fy_calloc(n, sizeof(*k.kv)))) {
        st = FY_ERR_NOMEM;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(kvs, i);
        if (!json_is_object(e)) {
            ERR("kvs[%zu] is not an object", i);
            goto out;
        }
        uint8_t *key = NULL, *val = NULL;
        size_t klen = 0, vlen = 0;
        if (!b64_decode(json_object_get(e, "key"), FY_ETCD_MAX_KEY, &key, &klen) || klen == 0 || memchr(key, 0, klen)) {
            fy_free(key);
            ERR("kvs[%zu].key: not base64 of 1..%d bytes without NUL", i, FY_ETCD_MAX_KEY);
            goto out;
        }
        memcpy(k.kv[k.n].key, key, klen + 1);
        fy_free(key);
        json_t *v = json_object_get(e, "value");
        if (!v) { /* an empty value is left out too */
            if (!(val = fy_calloc(1, 1))) {
                st = FY_ERR_NOMEM;
                goto out;
            }
        } else if (!b64_decode(v, FY_ETCD_MAX_VALUE, &val, &vlen)) {
            ERR("kvs[%zu].value: not base64 of at most %d bytes", i, FY_ETCD_MAX_VALUE);
            goto out;
        }
        k.kv[k.n].value = val;
        k.kv[k.n].value_len = vlen;
        k.n++;
    }
    st = FY_OK;
out:
    if (st == FY_OK)
        *out_p = k;
    else
        fy_etcd_kvs_free(&k);
    return st;
}

fy_status_t fy_etcd_parse_range(const void *json, size_t len, fy_etcd_kvs_t *out_p, char *err, size_t cap)
{
    json_t *j = parse_json(json, len, err, cap);
    if (!j) return FY_ERR_FORMAT;
    fy_status_t st = is_error(j, err, cap) ? FY_ERR_PEER : kvs_of(j, out_p, err, cap);
    json_decref(j);
    return st;
}

fy_status_t fy_etcd_parse_txn(const void *json, size_t len, bool *succeeded_p, fy_etcd_kvs_t *out_p, char *err,
                              size_t cap)
{
    json_t *j = parse_json(json, len, err, cap);
    if (!j) return FY_ERR_FORMAT;
    fy_status_t st = FY_ERR_FORMAT;
    fy_etcd_kvs_t k = {0};
    if (is_error(j, err, cap)) {
        st = FY_ERR_PEER;
        goto out;
    }
    json_t *ok = json_object_get(j, "succeeded"); /* false is left out */
    if (ok && !json_is_boolean(ok)) {
        ERR("\"succeeded\" is not a boolean");
        goto out;
    }
    bool succeeded = ok && json_is_true(ok);
    json_t *rs = json_object_get(j, "responses");
    if (rs && !json_is_array(rs)) {
        ERR("\"responses\" is not an array");
        goto out;
    }
    if (!succeeded) { /* the failure branch: one range */
        json_t *r = json_object_get(json_array_get(rs, 0), "response_range");
        if (!json_is_object(r)) {
            ERR("a failed transaction without its range");
            goto out;
        }
        if ((st = kvs_of(r, &k, err, cap))) goto out;
    }
    *succeeded_p = succeeded;
    *out_p = k;
    st = FY_OK;
out:
    json_decref(j);
    return st;
}

fy_status_t fy_etcd_parse_lease(const void *json, size_t len, int64_t *id_p, int64_t *ttl_p, char *err, size_t cap)
{
    json_t *j = parse_json(json, len, err, cap);
    if (!j) return FY_ERR_FORMAT;
    fy_status_t st = FY_ERR_FORMAT;
    if (is_error(j, err, cap)) {
        st = FY_ERR_PEER;
        goto out;
    }
    json_t *o = json_object_get(j, "result"); /* keepalive streams its answers, each in "result" */
    if (!o) o = j;
    if (!json_is_object(o)) {
        ERR("\"result\" is not an object");
        goto out;
    }
    json_t *e = json_object_get(o, "error");
    if (json_is_string(e) && json_string_length(e)) {
        ERR("etcd: %.200s", json_string_value(e));
        st = FY_ERR_PEER;
        goto out;
    }
    int64_t id = 0, ttl = 0;
    if (!get_i64(json_object_get(o, "ID"), &id) || id == 0) {
        ERR("no lease \"ID\"");
        goto out;
    }
    json_t *t = json_object_get(o, "TTL"); /* left out when 0: the lease is gone */
    if (t && (!get_i64(t, &ttl) || ttl < 0 || ttl > 1000000000)) {
        ERR("\"TTL\" is not a count of seconds");
        goto out;
    }
    *id_p = id;
    *ttl_p = ttl;
    st = FY_OK;
out:
    json_decref(j);
    return st;
}

fy_status_t fy_etcd_parse_ok(const void *json, size_t len, char *err, size_t cap)
{
    json_t *j = parse_json(json, len, err, cap);
    if (!j) return FY_ERR_FORMAT;
    fy_status_t st = is_error(j, err, cap) ? FY_ERR_PEER : FY_OK;
    json_decref(j);
    return st;
}

/* ---- the record ----------------------------------------------------------------------------------- */

static const char *const KINDS[] = {"router", "prefill", "decode"};

/* crypto_kdf's context for the membership key: 8 bytes of its own, so it
 * never coincides with the control-plane key (envelope.c) or the prefix
 * hasher's, all taken from the same secret */
static const char MEMBER_KDF_CTX[crypto_kdf_CONTEXTBYTES + 1] = "fymembr1";

fy_status_t fy_member_key(const uint8_t *secret, size_t len, uint8_t key[FY_MEMBER_KEY_BYTES])
{
    if (len < 16 || len > 64) {
        fy_error("etcd: the deployment's secret must be 16 to 64 bytes, not %zu", len);
        return FY_ERR_INVALID;
    }
    if (sodium_init() < 0) return FY_ERR_INTERNAL;
    uint8_t master[crypto_kdf_KEYBYTES];
    crypto_generichash(master, sizeof(master), secret, len, NULL, 0);
    crypto_kdf_derive_from_key(key, FY_MEMBER_KEY_BYTES, 1, MEMBER_KDF_CTX, master);
    sodium_memzero(master, sizeof(master));
    return FY_OK;
}

fy_status_t fy_membership_params_conf(fy_membership_params_t *p, const fy_member_conf_t *m)
{
    p->endpoints = m->etcd;
    p->cluster = m->cluster;
    p->ttl_s = m->ttl_s;
    p->poll_s = m->poll_s;
    p->tls = m->tls;
    fy_status_t st = fy_etcd_tls_check(&p->tls, p->endpoints);
    if (!st) st = fy_member_key(m->secret, m->secret_len, p->key);
    if (st) {
        sodium_memzero(&p->tls, sizeof(p->tls));
        sodium_memzero(p->key, sizeof(p->key));
    }
    return st;
}

/* the record as JSON, sorted and compact; with_mac false: what the MAC covers */
static fy_status_t write_json(const fy_member_t *m, bool with_mac, char **json_p, size_t *len_p)
{
    char inc[17], layout[17], mac[2 * FY_MEMBER_MAC_BYTES + 1];
    snprintf(inc, sizeof(inc), "%016" PRIx64, m->inc);
    snprintf(layout, sizeof(layout), "%016" PRIx64, m->layout);
    sodium_bin2hex(mac, sizeof(mac), m->mac, sizeof(m->mac));
    json_t *j =
        json_pack("{s:i,s:s,s:s,s:s,s:s,s:s,s:s,s:I,s:s,s:s,s:s,s:I}", "v", FY_MEMBER_VERSION, "kind", m->kind, "name",
                  m->name, "inc", inc, "addr", m->addr, "client", m->client, "http", m->http, "tag", (json_int_t)m->tag,
                  "model", m->model, "layout", layout, "version", m->version, "ts", (json_int_t)m->ts_ms);
    if (!j) return FY_ERR_NOMEM;
    if (with_mac && json_object_set_new(j, "mac", json_string(mac))) {
        json_decref(j);
        return FY_ERR_NOMEM;
    }
    char *s = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(j);
    if (!s) return FY_ERR_NOMEM;
    char *out = fy_strdup(s);
    free(s);
    if (!out) return FY_ERR_NOMEM;
    *json_p = out;
    *len_p = strlen(out);
    return FY_OK;
}

fy_status_t fy_member_write(const fy_member_t *m, char **json_p, size_t *len_p)
{
    return write_json(m, true, json_p, len_p);
}

/* keyed BLAKE2b over the etcd key, a NUL, and the record without its mac */
static fy_status_t member_mac(const fy_member_t *m, const uint8_t key[FY_MEMBER_KEY_BYTES], const char *etcd_key,
                              uint8_t out[FY_MEMBER_MAC_BYTES])
{
    char *json;
    size_t len;
    fy_status_t st = write_json(m, false, &json, &len);
    if (st) return st;
    crypto_generichash_state h;
    crypto_generichash_init(&h, key, FY_MEMBER_KEY_BYTES, FY_MEMBER_MAC_BYTES);
    crypto_generichash_update(&h, (const uint8_t *)etcd_key, strlen(etcd_key) + 1);
    crypto_generichash_update(&h, (const uint8_t *)json, len);
    crypto_generichash_final(&h, out, FY_MEMBER_MAC_BYTES);
    fy_free(json);
    return FY_OK;
}

fy_status_t fy_member_sign(fy_member_t *m, const uint8_t key[FY_MEMBER_KEY_BYTES], const char *etcd_key, int64_t now_ms,
                           char **json_p, size_t *len_p)
{
    m->ts_ms = now_ms;
    fy_status_t st = member_mac(m, key, etcd_key, m->mac);
    return st ? st : write_json(m, true, json_p, len_p);
}

fy_status_t fy_member_verify(const fy_member_t *m, const uint8_t key[FY_MEMBER_KEY_BYTES], const char *etcd_key,
                             int64_t now_ms, double max_age_s, char *err, size_t cap)
{
    uint8_t mac[FY_MEMBER_MAC_BYTES];
    fy_status_t st = member_mac(m, key, etcd_key, mac);
    if (st) return st;
    if (sodium_memcmp(mac, m->mac, sizeof(mac))) {
        ERR("bad MAC (not signed with this deployment's secret, or altered)");
        return FY_ERR_MISMATCH;
    }
    double age = (double)(now_ms - m->ts_ms) / 1e3;
    if (age > max_age_s) {
        ERR("signed %.1f s ago, more than %.1f s: stale (replayed, or its owner stopped signing)", age, max_age_s);
        return FY_ERR_MISMATCH;
    }
    if (-age > FY_MEMBER_SKEW_S) {
        ERR("signed %.1f s in the future, more than the %.0f s of clock skew allowed", -age, FY_MEMBER_SKEW_S);
        return FY_ERR_MISMATCH;
    }
    return FY_OK;
}

/* a string field of 1..cap-1 printable bytes (or 0.. when empty is allowed) */
static bool get_str(json_t *j, const char *field, bool empty_ok, char *out, size_t cap, char *err, size_t ecap)
{
    json_t *v = json_object_get(j, field);
    if (!json_is_string(v)) {
        if (err && ecap) snprintf(err, ecap, "\"%s\" is missing or not a string", field);
        return false;
    }
    size_t n = json_string_length(v);
    const char *s = json_string_value(v);
    bool ok = n < cap && (empty_ok || n > 0);
    for (size_t i = 0; ok && i < n; i++) ok = (unsigned char)s[i] >= 0x20 && (unsigned char)s[i] < 0x7f;
    if (!ok) {
        if (err && ecap)
            snprintf(err, ecap, "\"%s\" is not %s printable ASCII of at most %zu bytes", field,
                     empty_ok ? "" : "non-empty", cap - 1);
        return false;
    }
    memcpy(out, s, n + 1);
    return true;
}

static bool get_hex64(json_t *j, const char *field, uint64_t *out, char *err, size_t cap)
{
    json_t *v = json_object_get(j, field);
    const char *s = json_is_string(v) ? json_string_value(v) : "";
    size_t n = json_is_string(v) ? json_string_length(v) : 0;
    bool ok = n == 16;
    for (size_t i = 0; ok && i < n; i++) ok = (s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f');
    if (!ok) {
        ERR("\"%s\" is not 16 lowercase hex digits", field);
        return false;
    }
    *out = strtoull(s, NULL, 16);
    return true;
}

fy_status_t fy_member_read(const void *buf, size_t len, fy_member_t *out, char *err, size_t cap)
{
    if (len > FY_ETCD_MAX_VALUE) {
        ERR("record of %zu bytes, more than %d", len, FY_ETCD_MAX_VALUE);
        return FY_ERR_FORMAT;
    }
    json_t *j = parse_json(buf, len, err, cap);
    if (!j) return FY_ERR_FORMAT;
    fy_status_t st = FY_ERR_FORMAT;
    fy_member_t m = {0};
    json_t *v = json_object_get(j, "v");
    if (!json_is_integer(v)) {
        ERR("\"v\" is missing or not an integer");
        goto out;
    }
    if (json_integer_value(v) != FY_MEMBER_VERSION) {
        ERR("record version %" JSON_INTEGER_FORMAT ", this ferry reads %d", json_integer_value(v), FY_MEMBER_VERSION);
        st = FY_ERR_UNSUPPORTED;
        goto out;
    }
    if (!get_str(j, "kind", false, m.kind, sizeof(m.kind), err, cap) ||
        !get_str(j, "name", false, m.name, sizeof(m.name), err, cap) ||
        !get_str(j, "addr", false, m.addr, sizeof(m.addr), err, cap) ||
        !get_str(j, "client", true, m.client, sizeof(m.client), err, cap) ||
        !get_str(j, "http", true, m.http, sizeof(m.http), err, cap) ||
        !get_str(j, "model", false, m.model, sizeof(m.model), err, cap) ||
        !get_str(j, "version", false, m.version, sizeof(m.version), err, cap) ||
        !get_hex64(j, "inc", &m.inc, err, cap) || !get_hex64(j, "layout", &m.layout, err, cap))
        goto out;
    json_t *ts = json_object_get(j, "ts"), *mac = json_object_get(j, "mac");
    if (!json_is_integer(ts) || json_integer_value(ts) < 0) {
        ERR("\"ts\" is missing or not a time in ms");
        goto out;
    }
    m.ts_ms = json_integer_value(ts);
    size_t mac_len = 0;
    if (!json_is_string(mac) || json_string_length(mac) != 2 * FY_MEMBER_MAC_BYTES ||
        sodium_hex2bin(m.mac, sizeof(m.mac), json_string_value(mac), json_string_length(mac), NULL, &mac_len, NULL) ||
        mac_len != FY_MEMBER_MAC_BYTES) {
        ERR("\"mac\" is missing or not %d hex digits", 2 * FY_MEMBER_MAC_BYTES);
        goto out;
    }
    for (const char *c = json_string_value(mac); *c; c++)
        if (*c >= 'A' && *c <= 'F') { /* one spelling: a record reads back as it was written */
            ERR("\"mac\" is not lowercase hex");
            goto out;
        }
    int kind = -1;
    for (int i = 0; i < 3; i++)
        if (!strcmp(m.kind, KINDS[i])) kind = i;
    if (kind < 0) {
        ERR("\"kind\" is '%s', not router, prefill or decode", m.kind);
        goto out;
    }
    for (const char *c = m.name; *c; c++)
        if (*c == '/') {
            ERR("\"name\" '%s' holds a '/'", m.name);
            goto out;
        }
    json_t *t = json_object_get(j, "tag");
    if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= (1 << 20) ||
        (kind == 0) != (json_integer_value(t) != 0)) {
        ERR("\"tag\" is not %s", kind == 0 ? "an integer in 1..2^20-1" : "0");
        goto out;
    }
    m.tag = (uint32_t)json_integer_value(t);
    if (!m.inc) {
        ERR("\"inc\" is 0");
        goto out;
    }
    *out = m;
    st = FY_OK;
out:
    json_decref(j);
    return st;
}

fy_status_t fy_member_compatible(const fy_member_t *m, const char *model, uint64_t layout, char *err, size_t cap)
{
    if (strcmp(m->model, model)) {
        ERR("%s %s serves model %s; this one serves %s", m->kind, m->name, m->model, model);
        return FY_ERR_MISMATCH;
    }
    if (m->layout != layout) {
        ERR("%s %s has KV layout %016" PRIx64 "; this one has %016" PRIx64, m->kind, m->name, m->layout, layout);
        return FY_ERR_MISMATCH;
    }
    return FY_OK;
}

uint64_t fy_member_layout_hash(int32_t block_size, int32_t dtype, int32_t n_layers, int32_t n_kv_heads,
                               int32_t head_dim, uint64_t block_bytes, uint64_t groups)
{
    uint64_t f[] = {(uint64_t)block_size, (uint64_t)dtype, (uint64_t)n_layers, (uint64_t)n_kv_heads, (uint64_t)head_dim,
                    block_bytes,          groups};
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a over the fields' bytes */
    for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++)
        for (int b = 0; b < 8; b++) {
            h ^= (f[i] >> (8 * b)) & 0xff;
            h *= 0x100000001b3ull;
        }
    return h;
}

/* ---- the client ----------------------------------------------------------------------------------- */

#define MAX_ENDPOINTS 8

struct fy_etcd {
    CURL *curl;
    fy_etcd_tls_t tls;
    char *ep[MAX_ENDPOINTS];
    int n_ep, cur;
    long timeout_ms;
    char token[512]; /* etcd's auth token (tls.user) */
    long code;       /* the last answer's HTTP status */
    char *body;
    size_t body_len, body_cap;
    bool body_over;
    char err[256];
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

/* One of the TLS files (what: its key): a regular file this process can
 * open; a private key also the owner's alone (someone who reads it is
 * this process to etcd).  O_NONBLOCK: a FIFO is refused, never waited on. */
static fy_status_t tls_file_ok(const char *path, const char *what, bool secret)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        fy_error("%s %s: cannot open: %m", what, path);
        return errno == ENOENT ? FY_ERR_NOT_FOUND : FY_ERR_IO;
    }
    struct stat sb;
    fy_status_t st = FY_OK;
    if (fstat(fd, &sb)) {
        fy_error("%s %s: cannot stat: %m", what, path);
        st = FY_ERR_IO;
    } else if (!S_ISREG(sb.st_mode)) {
        fy_error("%s %s: not a regular file", what, path);
        st = FY_ERR_INVALID;
    } else if (secret && sb.st_uid != geteuid() && sb.st_uid != 0) {
        fy_error("%s %s: owned by uid %u, not by this user (uid %u) or root; someone else could replace it", what, path,
                 (unsigned)sb.st_uid, (unsigned)geteuid());
        st = FY_ERR_INVALID;
    } else if (secret && (sb.st_mode & 077)) {
        fy_error("%s %s: mode %04o lets its group or others read this process's etcd identity; it must be the "
                 "owner's alone (chmod 600 %s)",
                 what, path, (unsigned)(sb.st_mode & 07777), path);
        st = FY_ERR_INVALID;
    } else if (sb.st_size == 0) {
        fy_error("%s %s: empty; a PEM file was expected", what, path);
        st = FY_ERR_FORMAT;
    }
    close(fd);
    return st;
}

fy_status_t fy_etcd_tls_check(const fy_etcd_tls_t *t, const char *endpoints)
{
    bool https = false, http = false;
    for (const char *s = endpoints ? endpoints : ""; *s;) {
        while (*s == ' ' || *s == ',') s++;
        if (!*s) break;
        if (!strncmp(s, "https://", 8))
            https = true;
        else
            http = true; /* "http://" or no scheme (http) */
        s += strcspn(s, ",");
    }
    fy_status_t st;
    if (t->ca[0] && (st = tls_file_ok(t->ca, "cluster.etcd_ca", false))) return st;
    if (t->cert[0] && (st = tls_file_ok(t->cert, "cluster.etcd_cert", false))) return st;
    if (t->key[0] && (st = tls_file_ok(t->key, "cluster.etcd_key", true))) return st;
    if (!t->cert[0] != !t->key[0]) {
        fy_error("%s is set but %s is not: a client certificate needs both",
                 t->cert[0] ? "cluster.etcd_cert" : "cluster.etcd_key",
                 t->cert[0] ? "cluster.etcd_key" : "cluster.etcd_cert");
        return FY_ERR_INVALID;
    }
    if (https && !t->ca[0]) {
        fy_error("cluster.etcd '%s' has an https endpoint but cluster.etcd_ca is empty: etcd's certificate would be "
                 "checked against no CA of this deployment's",
                 endpoints);
        return FY_ERR_INVALID;
    }
    if (!t->user[0] != !t->password[0]) {
        fy_error("%s is set but %s is not: etcd's password auth needs both",
                 t->user[0] ? "cluster.etcd_user" : "cluster.etcd_password_file",
                 t->user[0] ? "cluster.etcd_password_file" : "cluster.etcd_user");
        return FY_ERR_INVALID;
    }
    if (http && t->user[0]) {
        fy_error("cluster.etcd_password_file is set but cluster.etcd '%s' has an http endpoint: the password would "
                 "cross the network in the clear (use https://)",
                 endpoints);
        return FY_ERR_INVALID;
    }
    for (const char *c = t->password; *c; c++)
        if ((unsigned char)*c < 0x21 || (unsigned char)*c > 0x7e || *c == '"' || *c == '\\') {
            fy_error("cluster.etcd_password_file: the password must be printable ASCII without spaces, '\"' or '\\' "
                     "(the error names no byte of it)");
            return FY_ERR_FORMAT;
        }
    if (http && (t->ca[0] || t->cert[0])) {
        fy_error("%s is set but cluster.etcd '%s' has an http endpoint: it would go without TLS (use https://)",
                 t->cert[0] ? "cluster.etcd_cert" : "cluster.etcd_ca", endpoints);
        return FY_ERR_INVALID;
    }
    return FY_OK;
}

fy_status_t fy_etcd_create(const char *endpoints, double timeout_s, fy_etcd_t **e_p)
{
    return fy_etcd_create_tls(endpoints, NULL, timeout_s, e_p);
}

fy_status_t fy_etcd_create_tls(const char *endpoints, const fy_etcd_tls_t *tls, double timeout_s, fy_etcd_t **e_p)
{
    pthread_once(&curl_once, curl_init_once);
    fy_etcd_t *e = fy_calloc(1, sizeof(*e));
    if (!e) return FY_ERR_NOMEM;
    if (tls) e->tls = *tls;
    e->timeout_ms = (long)(timeout_s * 1000);
    if (e->timeout_ms < 50) e->timeout_ms = 50;
    const char *s = endpoints ? endpoints : "";
    while (*s) {
        const char *c = strchr(s, ',');
        size_t n = c ? (size_t)(c - s) : strlen(s);
        while (n && *s == ' ') s++, n--;
        while (n && s[n - 1] == ' ') n--;
        if (n) {
            if (e->n_ep == MAX_ENDPOINTS) {
                fy_error("cluster.etcd: more than %d endpoints", MAX_ENDPOINTS);
                fy_etcd_destroy(e);
                return FY_ERR_INVALID;
            }
            bool scheme = (n > 7 && !strncmp(s, "http://", 7)) || (n > 8 && !strncmp(s, "https://", 8));
            char *ep = fy_malloc(n + 8);
            if (!ep) {
                fy_etcd_destroy(e);
                return FY_ERR_NOMEM;
            }
            snprintf(ep, n + 8, "%s%.*s", scheme ? "" : "http://", (int)n, s);
            while (ep[0] && ep[strlen(ep) - 1] == '/') ep[strlen(ep) - 1] = 0;
            e->ep[e->n_ep++] = ep;
        }
        s += n;
        if (c)
            s = c + 1;
        else
            break;
    }
    if (!e->n_ep) {
        fy_error("cluster.etcd: no endpoint in '%s'", endpoints ? endpoints : "");
        fy_etcd_destroy(e);
        return FY_ERR_INVALID;
    }
    if (!(e->curl = curl_easy_init())) {
        fy_etcd_destroy(e);
        return FY_ERR_NOMEM;
    }
    *e_p = e;
    return FY_OK;
}

void fy_etcd_destroy(fy_etcd_t *e)
{
    if (!e) return;
    if (e->curl) curl_easy_cleanup(e->curl);
    sodium_memzero(&e->tls, sizeof(e->tls));
    sodium_memzero(e->token, sizeof(e->token));
    for (int i = 0; i < e->n_ep; i++) fy_free(e->ep[i]);
    fy_free(e->body);
    fy_free(e);
}

const char *fy_etcd_last_error(const fy_etcd_t *e) { return e->err; }

static size_t on_body(char *p, size_t size, size_t n, void *arg)
{
    fy_etcd_t *e = arg;
    size_t len = size * n;
    if (e->body_len + len + 1 > FY_ETCD_MAX_BODY) {
        e->body_over = true;
        return 0; /* curl stops the transfer */
    }
    if (e->body_len + len + 1 > e->body_cap) {
        size_t cap = (e->body_len + len + 1) * 2;
        char *b = fy_realloc(e->body, cap);
        if (!b) return 0;
        e->body = b;
        e->body_cap = cap;
    }
    memcpy(e->body + e->body_len, p, len);
    e->body_len += len;
    e->body[e->body_len] = 0;
    return len;
}

/* POSTs a JSON body to path at the first endpoint that answers; on
 * success e->body holds the answer and e->code its status. */
static fy_status_t call_once(fy_etcd_t *e, const char *path, const char *json)
{
    for (int k = 0; k < e->n_ep; k++) {
        int i = (e->cur + k) % e->n_ep;
        char url[512];
        snprintf(url, sizeof(url), "%s%s", e->ep[i], path);
        e->body_len = 0;
        e->body_over = false;
        curl_easy_reset(e->curl);
        struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
        char auth[sizeof(e->token) + 32];
        if (e->token[0]) {
            snprintf(auth, sizeof(auth), "Authorization: %s", e->token);
            h = curl_slist_append(h, auth);
        }
        curl_easy_setopt(e->curl, CURLOPT_URL, url);
        curl_easy_setopt(e->curl, CURLOPT_HTTPHEADER, h);
        curl_easy_setopt(e->curl, CURLOPT_POSTFIELDS, json);
        curl_easy_setopt(e->curl, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(e->curl, CURLOPT_WRITEDATA, e);
        curl_easy_setopt(e->curl, CURLOPT_TIMEOUT_MS, e->timeout_ms);
        curl_easy_setopt(e->curl, CURLOPT_CONNECTTIMEOUT_MS, e->timeout_ms);
        curl_easy_setopt(e->curl, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(e->curl, CURLOPT_PROTOCOLS_STR, "http,https");
        /* verification is curl's default; the CA is this deployment's, not the system's store */
        if (e->tls.ca[0]) curl_easy_setopt(e->curl, CURLOPT_CAINFO, e->tls.ca);
        if (e->tls.cert[0]) {
            curl_easy_setopt(e->curl, CURLOPT_SSLCERT, e->tls.cert);
            curl_easy_setopt(e->curl, CURLOPT_SSLKEY, e->tls.key);
        }
        CURLcode rc = curl_easy_perform(e->curl);
        long code = 0;
        curl_easy_getinfo(e->curl, CURLINFO_RESPONSE_CODE, &code);
        curl_slist_free_all(h);
        sodium_memzero(auth, sizeof(auth));
        if (rc == CURLE_OK && code >= 200 && code < 500) { /* 4xx: etcd's error object, parsed by the caller */
            e->cur = i;
            e->code = code;
            if (!e->body) on_body((char *)"", 1, 0, e);
            return e->body ? FY_OK : FY_ERR_NOMEM;
        }
        if (e->body_over)
            snprintf(e->err, sizeof(e->err), "%.200s: answer longer than %d bytes", url, FY_ETCD_MAX_BODY);
        else if (rc != CURLE_OK)
            snprintf(e->err, sizeof(e->err), "%.160s: %.90s", url, curl_easy_strerror(rc));
        else
            snprintf(e->err, sizeof(e->err), "%.200s: HTTP %ld", url, code);
    }
    return FY_ERR_PEER;
}

/* etcd's token for tls.user: from /v3/auth/authenticate, into e->token */
static fy_status_t authenticate(fy_etcd_t *e)
{
    char json[sizeof(e->tls.user) + sizeof(e->tls.password) + 64];
    snprintf(json, sizeof(json), "{\"name\":\"%s\",\"password\":\"%s\"}", e->tls.user, e->tls.password);
    e->token[0] = 0;
    fy_status_t st = call_once(e, "/v3/auth/authenticate", json);
    sodium_memzero(json, sizeof(json));
    if (st) return st;
    json_t *j = parse_json(e->body, e->body_len, e->err, sizeof(e->err));
    if (!j) return FY_ERR_FORMAT;
    if (is_error(j, e->err, sizeof(e->err))) {
        json_decref(j);
        return FY_ERR_PEER;
    }
    const char *tok = json_string_value(json_object_get(j, "token"));
    if (!tok || !*tok || strlen(tok) >= sizeof(e->token) || strpbrk(tok, "\r\n")) {
        snprintf(e->err, sizeof(e->err), "authenticate as %s: no usable token in etcd's answer", e->tls.user);
        json_decref(j);
        return FY_ERR_FORMAT;
    }
    snprintf(e->token, sizeof(e->token), "%s", tok);
    json_decref(j);
    return FY_OK;
}

/* call_once, authenticated where tls.user is set: a token is fetched
 * first, and once more when etcd answers 401 (it expired, or etcd
 * restarted) */
static fy_status_t call(fy_etcd_t *e, const char *path, const char *json)
{
    if (!e->tls.user[0]) return call_once(e, path, json);
    for (int k = 0; k < 2; k++) {
        fy_status_t st = e->token[0] ? FY_OK : authenticate(e);
        if (st) return st;
        st = call_once(e, path, json);
        if (st || e->code != 401) return st;
        e->token[0] = 0;
    }
    return FY_OK; /* the second 401: etcd's error object, for the caller */
}

fy_status_t fy_etcd_post(fy_etcd_t *e, const char *path, const char *json)
{
    fy_status_t st = call(e, path, json);
    if (!st) st = fy_etcd_parse_ok(e->body, e->body_len, e->err, sizeof(e->err));
    return st;
}

static char *b64(const void *p, size_t n)
{
    size_t cap = sodium_base64_encoded_len(n, sodium_base64_VARIANT_ORIGINAL);
    char *s = fy_malloc(cap);
    if (s) sodium_bin2base64(s, cap, p, n, sodium_base64_VARIANT_ORIGINAL);
    return s;
}

static fy_status_t call_ok(fy_etcd_t *e, const char *path, const char *json)
{
    fy_status_t st = call(e, path, json);
    if (!st) st = fy_etcd_parse_ok(e->body, e->body_len, e->err, sizeof(e->err));
    return st;
}

fy_status_t fy_etcd_grant(fy_etcd_t *e, int64_t ttl_s, int64_t *id_p)
{
    char json[64];
    snprintf(json, sizeof(json), "{\"TTL\":%lld}", (long long)ttl_s);
    int64_t id, ttl;
    fy_status_t st = call(e, "/v3/lease/grant", json);
    if (!st) st = fy_etcd_parse_lease(e->body, e->body_len, &id, &ttl, e->err, sizeof(e->err));
    if (!st && ttl <= 0) {
        snprintf(e->err, sizeof(e->err), "lease granted with TTL %lld", (long long)ttl);
        st = FY_ERR_FORMAT;
    }
    if (!st) *id_p = id;
    return st;
}

fy_status_t fy_etcd_keepalive(fy_etcd_t *e, int64_t id, int64_t *ttl_p)
{
    char json[64];
    snprintf(json, sizeof(json), "{\"ID\":\"%lld\"}", (long long)id);
    int64_t rid, ttl;
    fy_status_t st = call(e, "/v3/lease/keepalive", json);
    if (!st) st = fy_etcd_parse_lease(e->body, e->body_len, &rid, &ttl, e->err, sizeof(e->err));
    if (!st && rid != id) {
        snprintf(e->err, sizeof(e->err), "keepalive of lease %lld answered for %lld", (long long)id, (long long)rid);
        st = FY_ERR_FORMAT;
    }
    if (!st) *ttl_p = ttl;
    return st;
}

fy_status_t fy_etcd_revoke(fy_etcd_t *e, int64_t id)
{
    char json[64];
    snprintf(json, sizeof(json), "{\"ID\":\"%lld\"}", (long long)id);
    return call_ok(e, "/v3/lease/revoke", json);
}

fy_status_t fy_etcd_put(fy_etcd_t *e, const char *key, const void *value, size_t len, int64_t lease)
{
    char *k = b64(key, strlen(key)), *v = b64(value, len), *json = NULL;
    fy_status_t st = FY_ERR_NOMEM;
    if (k && v) {
        size_t cap = strlen(k) + strlen(v) + 96;
        if ((json = fy_malloc(cap))) {
            snprintf(json, cap, "{\"key\":\"%s\",\"value\":\"%s\",\"lease\":\"%lld\"}", k, v, (long long)lease);
            st = call_ok(e, "/v3/kv/put", json);
        }
    }
    fy_free(k);
    fy_free(v);
    fy_free(json);
    return st;
}

fy_status_t fy_etcd_delete(fy_etcd_t *e, const char *key)
{
    char *k = b64(key, strlen(key)), *json = NULL;
    fy_status_t st = FY_ERR_NOMEM;
    if (k && (json = fy_malloc(strlen(k) + 32))) {
        sprintf(json, "{\"key\":\"%s\"}", k);
        st = call_ok(e, "/v3/kv/deleterange", json);
    }
    fy_free(k);
    fy_free(json);
    return st;
}

fy_status_t fy_etcd_range_prefix(fy_etcd_t *e, const char *prefix, fy_etcd_kvs_t *out_p)
{
    size_t n = strlen(prefix);
    if (!n || n > FY_ETCD_MAX_KEY) return FY_ERR_INVALID;
    char end[FY_ETCD_MAX_KEY + 1];
    memcpy(end, prefix, n);
    end[n - 1]++; /* the range [prefix, prefix with its last byte + 1) */
    char *k = b64(prefix, n), *r = b64(end, n), *json = NULL;
    fy_status_t st = FY_ERR_NOMEM;
    if (k && r && (json = fy_malloc(strlen(k) + strlen(r) + 64))) {
        sprintf(json, "{\"key\":\"%s\",\"range_end\":\"%s\"}", k, r);
        st = call(e, "/v3/kv/range", json);
        if (!st) st = fy_etcd_parse_range(e->body, e->body_len, out_p, e->err, sizeof(e->err));
    }
    fy_free(k);
    fy_free(r);
    fy_free(json);
    return st;
}

fy_status_t fy_etcd_create_key(fy_etcd_t *e, const char *key, const void *value, size_t len, int64_t lease,
                               bool *created_p, fy_etcd_kvs_t *held_p)
{
    char *k = b64(key, strlen(key)), *v = b64(value, len), *json = NULL;
    fy_status_t st = FY_ERR_NOMEM;
    if (k && v) {
        size_t cap = 2 * strlen(k) + strlen(v) + 320;
        if ((json = fy_malloc(cap))) {
            snprintf(json, cap,
                     "{\"compare\":[{\"key\":\"%s\",\"target\":\"CREATE\",\"result\":\"EQUAL\",\"create_revision\":"
                     "\"0\"}],\"success\":[{\"request_put\":{\"key\":\"%s\",\"value\":\"%s\",\"lease\":\"%lld\"}}],"
                     "\"failure\":[{\"request_range\":{\"key\":\"%s\"}}]}",
                     k, k, v, (long long)lease, k);
            st = call(e, "/v3/kv/txn", json);
            if (!st) st = fy_etcd_parse_txn(e->body, e->body_len, created_p, held_p, e->err, sizeof(e->err));
        }
    }
    fy_free(k);
    fy_free(v);
    fy_free(json);
    return st;
}

/* ---- the membership thread ------------------------------------------------------------------------ */

#define MAX_REFUSED 64

struct fy_membership {
    fy_membership_params_t p;
    char cluster[128], dir[64], watch[64];
    char key[512], prefix[512], all[512], tag_key[512];
    char *record; /* as last signed and put */
    size_t record_len;
    double signed_at; /* monotonic: the record is signed again every TTL */
    fy_etcd_t *etcd;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop, registered, up, ever_up, conflict, displaced;
    int64_t lease;
    double last_keepalive;
    uint64_t n_refused_total; /* under mu */
    /* records refused, so that each is logged once (by key and content) */
    struct {
        char key[FY_ETCD_MAX_KEY + 1];
        uint64_t digest;
    } refused[MAX_REFUSED];
    int n_refused;
};

static void etcd_failed(fy_membership_t *m, const char *what)
{
    if (m->up || !m->ever_up) /* once per outage */
        fy_warn("etcd: %s failed: %s; serving on the last known membership, retrying", what,
                fy_etcd_last_error(m->etcd));
    m->up = false;
    m->ever_up = true;
}

static void etcd_answered(fy_membership_t *m)
{
    if (!m->up && m->ever_up) fy_info("etcd: reachable again");
    m->up = m->ever_up = true;
}

static void set_registered(fy_membership_t *m, bool r)
{
    pthread_mutex_lock(&m->mu);
    m->registered = r;
    pthread_mutex_unlock(&m->mu);
}

/* signs the record anew (a fresh time) into m->record */
static fy_status_t sign_record(fy_membership_t *m, double now)
{
    char *json;
    size_t len;
    fy_status_t st = fy_member_sign(&m->p.self, m->p.key, m->key, fy_wall_ms(), &json, &len);
    if (st) return st;
    fy_free(m->record);
    m->record = json;
    m->record_len = len;
    m->signed_at = now;
    return FY_OK;
}

/* the lease is gone (expired while etcd was away, or revoked): register anew */
static void lease_lost(fy_membership_t *m)
{
    fy_warn("etcd: lease %llx expired; registering %s again", (unsigned long long)m->lease, m->key);
    m->lease = 0;
    set_registered(m, false);
    if (m->p.lost) m->p.lost(m->p.arg);
}

/* puts the record (signed anew) under the lease; a lease etcd no longer
 * knows means registering anew */
static void put_record(fy_membership_t *m, double now, const char *why)
{
    if (sign_record(m, now)) return;
    if (fy_etcd_put(m->etcd, m->key, m->record, m->record_len, m->lease)) {
        if (strstr(fy_etcd_last_error(m->etcd), "lease not found")) {
            etcd_answered(m);
            lease_lost(m);
        } else {
            etcd_failed(m, why);
        }
        return;
    }
    etcd_answered(m);
}

/* A router's tag, claimed under lease: created if absent, or taken over
 * when what is there is this router's own signed record.  FY_ERR_MISMATCH:
 * another holds it. */
static fy_status_t claim_tag(fy_membership_t *m, int64_t lease)
{
    fy_member_t self = m->p.self;
    char *json;
    size_t len;
    fy_status_t st = fy_member_sign(&self, m->p.key, m->tag_key, fy_wall_ms(), &json, &len);
    if (st) return st;
    bool created = false;
    fy_etcd_kvs_t held = {0};
    st = fy_etcd_create_key(m->etcd, m->tag_key, json, len, lease, &created, &held);
    if (!st && !created) {
        fy_member_t h;
        char err[256] = "the key is empty";
        bool ours =
            held.n == 1 && !fy_member_read(held.kv[0].value, held.kv[0].value_len, &h, err, sizeof(err)) &&
            !fy_member_verify(&h, m->p.key, m->tag_key, fy_wall_ms(), FY_MEMBER_MAX_AGE(m->p.ttl_s), err, sizeof(err));
        if (ours && !strcmp(h.name, self.name) && h.inc == self.inc) { /* ours, from an earlier lease */
            st = fy_etcd_put(m->etcd, m->tag_key, json, len, lease);
        } else {
            if (!m->conflict) {
                if (ours)
                    fy_error("etcd: router tag %05x is held by router %s (incarnation %016llx): a second router with "
                             "this tag is refused",
                             (unsigned)self.tag, h.name, (unsigned long long)h.inc);
                else
                    fy_error("etcd: router tag %05x is held by a record that is not this router's (%s): a second "
                             "router with this tag is refused",
                             (unsigned)self.tag, err);
            }
            m->conflict = true;
            st = FY_ERR_MISMATCH;
        }
    }
    fy_etcd_kvs_free(&held);
    fy_free(json);
    if (!st) m->conflict = false;
    return st;
}

static fy_status_t keep_registered(fy_membership_t *m, double now)
{
    int64_t ttl = (int64_t)(m->p.ttl_s + 0.999);
    if (m->lease && now - m->last_keepalive >= m->p.ttl_s / 3) {
        int64_t left = 0;
        if (fy_etcd_keepalive(m->etcd, m->lease, &left)) {
            etcd_failed(m, "lease keepalive");
            return FY_ERR_PEER;
        }
        etcd_answered(m);
        m->last_keepalive = now;
        if (left <= 0) lease_lost(m); /* expired while etcd was away */
    }
    if (m->lease) return FY_OK; /* the record is kept (and signed anew) by the watch round */
    int64_t id;
    if (fy_etcd_grant(m->etcd, ttl, &id)) {
        etcd_failed(m, "lease grant");
        return FY_ERR_PEER;
    }
    fy_status_t st = m->p.self.tag ? claim_tag(m, id) : FY_OK;
    if (st == FY_ERR_MISMATCH) {
        fy_etcd_revoke(m->etcd, id);
        return st;
    }
    if (!st) st = sign_record(m, now);
    if (!st && (st = fy_etcd_put(m->etcd, m->key, m->record, m->record_len, id))) etcd_failed(m, "registration");
    if (st) {
        fy_etcd_revoke(m->etcd, id);
        return st;
    }
    etcd_answered(m);
    m->lease = id;
    m->last_keepalive = now;
    set_registered(m, true);
    fy_info("etcd: registered %s (lease %llx, %llds)", m->key, (unsigned long long)id, (long long)ttl);
    return FY_OK;
}

static uint64_t digest(const void *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ ((const uint8_t *)p)[i]) * 0x100000001b3ull;
    return h;
}

/* logs and counts a refused record once (per key and content) */
static void refuse(fy_membership_t *m, const fy_etcd_kv_t *kv, const char *why)
{
    uint64_t d = digest(kv->value, kv->value_len);
    for (int i = 0; i < m->n_refused; i++)
        if (!strcmp(m->refused[i].key, kv->key) && m->refused[i].digest == d) return;
    fy_error("etcd: record %s refused: %s", kv->key, why);
    int i = m->n_refused < MAX_REFUSED ? m->n_refused++ : (int)(d % MAX_REFUSED);
    snprintf(m->refused[i].key, sizeof(m->refused[i].key), "%s", kv->key);
    m->refused[i].digest = d;
    pthread_mutex_lock(&m->mu);
    m->n_refused_total++;
    pthread_mutex_unlock(&m->mu);
    if (m->p.refused) fy_metric_inc(m->p.refused);
}

static void watch_round(fy_membership_t *m)
{
    fy_etcd_kvs_t kvs = {0};
    if (fy_etcd_range_prefix(m->etcd, m->all, &kvs)) { /* the cluster's records: ours and those we watch */
        etcd_failed(m, "watch");
        return;
    }
    etcd_answered(m);
    fy_member_t *live = kvs.n ? fy_calloc((size_t)kvs.n, sizeof(*live)) : NULL;
    int n = 0;
    if (kvs.n && !live) {
        fy_etcd_kvs_free(&kvs);
        return;
    }
    bool own_seen = false, own_same = false;
    size_t plen = strlen(m->prefix);
    int64_t now_ms = fy_wall_ms();
    for (int i = 0; i < kvs.n; i++) {
        fy_member_t r;
        char err[256];
        if (!strcmp(kvs.kv[i].key, m->key)) {
            own_seen = true;
            own_same = kvs.kv[i].value_len == m->record_len && !memcmp(kvs.kv[i].value, m->record, m->record_len);
            /* a newer process of this name (a restart while this one was
             * stopped): its record stands; fighting over the key would
             * only flap it every round */
            if (!own_same && !fy_member_read(kvs.kv[i].value, kvs.kv[i].value_len, &r, err, sizeof(err)) &&
                !fy_member_verify(&r, m->p.key, m->key, now_ms, FY_MEMBER_MAX_AGE(m->p.ttl_s), err, sizeof(err)) &&
                r.inc != m->p.self.inc && r.ts_ms > m->p.self.ts_ms) {
                if (!m->displaced)
                    fy_error("etcd: %s now holds the record of another process of this name (incarnation %016llx, "
                             "signed later): not writing over it",
                             m->key, (unsigned long long)r.inc);
                m->displaced = true;
                own_same = true;
            } else {
                m->displaced = false;
            }
            continue;
        }
        if (strncmp(kvs.kv[i].key, m->prefix, plen)) continue; /* not a record we watch */
        const char *last = strrchr(kvs.kv[i].key, '/');
        if (fy_member_read(kvs.kv[i].value, kvs.kv[i].value_len, &r, err, sizeof(err)) ||
            fy_member_verify(&r, m->p.key, kvs.kv[i].key, now_ms, FY_MEMBER_MAX_AGE(m->p.ttl_s), err, sizeof(err))) {
            refuse(m, &kvs.kv[i], err);
            continue;
        }
        if (strcmp(last ? last + 1 : "", r.name)) {
            snprintf(err, sizeof(err), "its name '%s' is not its key's", r.name);
            refuse(m, &kvs.kv[i], err);
            continue;
        }
        if (!strcmp(r.name, m->p.self.name) && r.inc == m->p.self.inc) continue; /* this process */
        if (fy_member_compatible(&r, m->p.self.model, m->p.self.layout, err, sizeof(err))) {
            refuse(m, &kvs.kv[i], err);
            continue;
        }
        live[n++] = r;
    }
    fy_etcd_kvs_free(&kvs);
    if (!own_seen) m->displaced = false;        /* gone: ours to write again */
    if (m->lease && (!own_seen || !own_same)) { /* deleted or overwritten by someone else: ours again at once */
        fy_warn("etcd: this process's record %s was %s; writing it again", m->key,
                own_seen ? "changed by someone else" : "deleted");
        put_record(m, fy_now_s(), "record rewrite");
    } else if (m->lease && !m->displaced && fy_now_s() - m->signed_at >= m->p.ttl_s) {
        put_record(m, fy_now_s(), "record refresh"); /* signed anew every TTL: never stale to readers */
    }
    m->p.fn(m->p.arg, live, n);
    fy_free(live);
}

static void *membership_main(void *arg)
{
    fy_membership_t *m = arg;
    pthread_mutex_lock(&m->mu);
    while (!m->stop) {
        pthread_mutex_unlock(&m->mu);
        keep_registered(m, fy_now_s());
        watch_round(m);
        pthread_mutex_lock(&m->mu);
        if (m->stop) break;
        struct timespec ts;
        fy_deadline_in(CLOCK_MONOTONIC, m->p.poll_s, &ts);
        pthread_cond_timedwait(&m->cv, &m->mu, &ts);
    }
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

static bool path_part_ok(const char *s)
{
    if (!*s) return false;
    for (; *s; s++)
        if ((unsigned char)*s <= 0x20 || (unsigned char)*s >= 0x7f) return false;
    return true;
}

fy_status_t fy_membership_start(const fy_membership_params_t *p, fy_membership_t **m_p)
{
    if (!path_part_ok(p->cluster) || strchr(p->cluster, '/')) {
        fy_error("cluster.name '%s': one path part of printable ASCII, no '/'", p->cluster);
        return FY_ERR_INVALID;
    }
    if (!path_part_ok(p->self.name) || strchr(p->self.name, '/')) {
        fy_error("name '%s': one path part of printable ASCII, no '/'", p->self.name);
        return FY_ERR_INVALID;
    }
    fy_membership_t *m = fy_calloc(1, sizeof(*m));
    if (!m) return FY_ERR_NOMEM;
    m->p = *p;
    snprintf(m->key, sizeof(m->key), "/ferry/%s/%s/%s", p->cluster, p->dir, p->self.name);
    snprintf(m->prefix, sizeof(m->prefix), "/ferry/%s/%s", p->cluster, p->watch);
    snprintf(m->all, sizeof(m->all), "/ferry/%s/", p->cluster);
    snprintf(m->tag_key, sizeof(m->tag_key), "/ferry/%s/tags/%05x", p->cluster, (unsigned)p->self.tag);
    snprintf(m->p.self.version, sizeof(m->p.self.version), "%s", FY_VERSION);
    fy_status_t st = sign_record(m, fy_now_s());
    if (!st) st = fy_etcd_create_tls(p->endpoints, &p->tls, p->ttl_s / 3 > 1 ? 1 : p->ttl_s / 3, &m->etcd);
    if (st) {
        fy_free(m->record);
        fy_free(m);
        return st;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&m->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&m->mu, NULL);
    /* the first registration here: a router whose tag is taken does not start */
    if (keep_registered(m, fy_now_s()) == FY_ERR_MISMATCH || pthread_create(&m->th, NULL, membership_main, m)) {
        st = m->conflict ? FY_ERR_MISMATCH : FY_ERR_INTERNAL;
        fy_etcd_destroy(m->etcd);
        fy_free(m->record);
        pthread_cond_destroy(&m->cv);
        pthread_mutex_destroy(&m->mu);
        sodium_memzero(m->p.key, sizeof(m->p.key));
        sodium_memzero(&m->p.tls, sizeof(m->p.tls));
        fy_free(m);
        return st;
    }
    fy_info("etcd: %s registers as %s and watches %s every %.0f ms", p->endpoints, m->key, m->prefix, p->poll_s * 1e3);
    *m_p = m;
    return FY_OK;
}

void fy_membership_stop(fy_membership_t *m)
{
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->stop = true;
    pthread_cond_signal(&m->cv);
    pthread_mutex_unlock(&m->mu);
    pthread_join(m->th, NULL);
    if (m->lease && fy_etcd_revoke(m->etcd, m->lease))
        fy_warn("etcd: revoking lease of %s failed (%s); it expires by itself", m->key, fy_etcd_last_error(m->etcd));
    fy_etcd_destroy(m->etcd);
    fy_free(m->record);
    pthread_cond_destroy(&m->cv);
    pthread_mutex_destroy(&m->mu);
    sodium_memzero(m->p.key, sizeof(m->p.key));
    sodium_memzero(&m->p.tls, sizeof(m->p.tls));
    fy_free(m);
}

bool fy_membership_registered(fy_membership_t *m)
{
    pthread_mutex_lock(&m->mu);
    bool r = m->registered;
    pthread_mutex_unlock(&m->mu);
    return r;
}

uint64_t fy_membership_refused(fy_membership_t *m)
{
    pthread_mutex_lock(&m->mu);
    uint64_t n = m->n_refused_total;
    pthread_mutex_unlock(&m->mu);
    return n;
}

/*
 * test_etcd.c - membership through etcd (cluster.etcd, rpc/etcd.h): the
 * parsers of the gateway's answers and of the registration record on good
 * and bad input; the client against a real etcd the test starts on
 * loopback ports (and against none: the failure is a status, not a
 * crash); and a cluster of 2 routers, 2 prefill and 2 decode workers
 * that find each other there: one router killed with SIGKILL under load
 * (the other's requests go on without an error, the dead one's end at the
 * workers and every block comes back), a decode worker killed and
 * restarted (it rejoins), etcd killed for 10 s and SIGSTOPped past every
 * lease (serving goes on, no stream ends; the registrations come back
 * with it), router-1 SIGSTOPped for 4 s (no worker taken for dead, its
 * stream goes on), and records that are malformed or for another model
 * or KV layout, refused by name.
 *
 * Attacks through etcd by someone without the secret: forged, foreign-
 * keyed, copied and garbled records refused and counted once; a forged
 * router record with a real router's tag gets 0 events; deleted or
 * overwritten records are written again within a few watch rounds while
 * their streams go on; a second router with a held tag does not start.
 *
 * Tests that need etcd skip with a message where etcd-server is not
 * installed (`make deps` installs it).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "common/clock.h"
#include "common/cluster.h"
#include "common/config.h"
#include "common/netconf.h"
#include "tests/cluster_util.h"
#include "rpc/etcd.h"
#include "common/mem.h"
#include "rpc/rpc.h"
#include "tests/testutil.h"

/* ---- the parsers ---- */

static fy_status_t range_of(const char *json, fy_etcd_kvs_t *k, char *err)
{
    return fy_etcd_parse_range(json, strlen(json), k, err, 256);
}

static void test_parse_range(void **state)
{
    fy_etcd_kvs_t k = {0};
    char err[256] = "";
    /* two keys ("/a/b" = "xx", "/a/c" with an empty value, left out) */
    assert_int_equal(range_of("{\"header\":{\"revision\":\"2\"},\"kvs\":[{\"key\":\"L2EvYg==\",\"value\":\"eHg=\","
                              "\"lease\":\"7\"},{\"key\":\"L2EvYw==\"}],\"count\":\"2\"}",
                              &k, err),
                     FY_OK);
    assert_int_equal(k.n, 2);
    assert_string_equal(k.kv[0].key, "/a/b");
    assert_int_equal(k.kv[0].value_len, 2);
    assert_memory_equal(k.kv[0].value, "xx", 3);
    assert_int_equal(k.kv[1].value_len, 0);
    fy_etcd_kvs_free(&k);
    /* nothing under the prefix: no "kvs" */
    assert_int_equal(range_of("{\"header\":{}}", &k, err), FY_OK);
    assert_int_equal(k.n, 0);
    /* etcd's error object */
    assert_int_equal(range_of("{\"error\":\"x\",\"code\":3,\"message\":\"illegal base64\"}", &k, err), FY_ERR_PEER);
    assert_non_null(strstr(err, "illegal base64"));
    /* malformed: each says what */
    static const struct {
        const char *json, *why;
    } bad[] = {
        {"", "not JSON"},
        {"[1]", "not a JSON object"},
        {"{\"kvs\":{}}", "not an array"},
        {"{\"kvs\":[1]}", "kvs[0] is not an object"},
        {"{\"kvs\":[{\"value\":\"eHg=\"}]}", "kvs[0].key"},
        {"{\"kvs\":[{\"key\":\"!!!!\"}]}", "kvs[0].key"},
        {"{\"kvs\":[{\"key\":\"\"}]}", "kvs[0].key"},
        {"{\"kvs\":[{\"key\":\"YQBi\"}]}", "kvs[0].key"}, /* "a\0b" */
        {"{\"kvs\":[{\"key\":\"YQ==\",\"value\":5}]}", "kvs[0].value"},
        {"{\"kvs\":[{\"key\":\"YQ==\",\"value\":\"e\"}]}", "kvs[0].value"},
        {"{\"kvs\":[],\"kvs\":[]}", "not JSON"}, /* duplicate keys */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = 0;
        fy_status_t st = range_of(bad[i].json, &k, err);
        if (st != FY_ERR_FORMAT || !strstr(err, bad[i].why))
            fail_msg("'%s': %s, '%s' (wanted '%s')", bad[i].json, fy_status_str(st), err, bad[i].why);
    }
    /* a value past the limit */
    size_t big = FY_ETCD_MAX_VALUE * 2;
    char *json = fy_malloc(big + 64);
    int n = sprintf(json, "{\"kvs\":[{\"key\":\"YQ==\",\"value\":\"");
    memset(json + n, 'A', big);
    strcpy(json + n + big, "\"}]}");
    assert_int_equal(range_of(json, &k, err), FY_ERR_FORMAT);
    assert_non_null(strstr(err, "at most"));
    fy_free(json);
}

static void test_parse_lease(void **state)
{
    int64_t id, ttl;
    char err[256];
    const char *grant = "{\"header\":{},\"ID\":\"2324035578623626757\",\"TTL\":\"5\"}";
    assert_int_equal(fy_etcd_parse_lease(grant, strlen(grant), &id, &ttl, err, sizeof(err)), FY_OK);
    assert_true(id == 2324035578623626757LL);
    assert_int_equal(ttl, 5);
    const char *alive = "{\"result\":{\"header\":{},\"ID\":\"12\",\"TTL\":\"3\"}}";
    assert_int_equal(fy_etcd_parse_lease(alive, strlen(alive), &id, &ttl, err, sizeof(err)), FY_OK);
    assert_int_equal(id, 12);
    assert_int_equal(ttl, 3);
    const char *gone = "{\"result\":{\"header\":{},\"ID\":\"12\"}}"; /* an expired lease: no TTL */
    assert_int_equal(fy_etcd_parse_lease(gone, strlen(gone), &id, &ttl, err, sizeof(err)), FY_OK);
    assert_int_equal(ttl, 0);
    static const char *const bad[] = {
        "{}",
        "{\"ID\":\"x\"}",
        "{\"ID\":\"0\"}",
        "{\"ID\":\"1\",\"TTL\":\"-1\"}",
        "{\"ID\":\"1\",\"TTL\":[]}",
        "{\"result\":3}",
        "{\"ID\":\"99999999999999999999\"}",
        "{\"ID\":\"12a\"}",
        "nul",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (fy_etcd_parse_lease(bad[i], strlen(bad[i]), &id, &ttl, err, sizeof(err)) != FY_ERR_FORMAT)
            fail_msg("'%s' taken", bad[i]);
    const char *e = "{\"error\":\"lease not found\",\"code\":5,\"message\":\"etcdserver: requested lease not found\"}";
    assert_int_equal(fy_etcd_parse_lease(e, strlen(e), &id, &ttl, err, sizeof(err)), FY_ERR_PEER);
    assert_non_null(strstr(err, "lease not found"));
    const char *re = "{\"result\":{\"error\":\"stopped\"}}";
    assert_int_equal(fy_etcd_parse_lease(re, strlen(re), &id, &ttl, err, sizeof(err)), FY_ERR_PEER);
}

static fy_member_t a_member(void)
{
    fy_member_t m = {.inc = 0x1234, .layout = 0xabcdef, .tag = 0};
    snprintf(m.kind, sizeof(m.kind), "decode");
    snprintf(m.name, sizeof(m.name), "decode-0");
    snprintf(m.addr, sizeof(m.addr), "tcp://10.0.0.2:7500");
    snprintf(m.http, sizeof(m.http), "http://10.0.0.2:9100");
    snprintf(m.model, sizeof(m.model), "smollm2-abc");
    snprintf(m.version, sizeof(m.version), "0.1.0");
    return m;
}

/* the record with one field replaced (value: raw JSON; NULL: removed) */
static char *member_with(const char *field, const char *value)
{
    fy_member_t m = a_member();
    char *json;
    size_t len;
    assert_int_equal(fy_member_write(&m, &json, &len), FY_OK);
    json_t *j = json_loads(json, 0, NULL);
    fy_free(json);
    assert_non_null(j);
    if (value) {
        json_t *v = json_loads(value, JSON_DECODE_ANY, NULL);
        assert_non_null(v);
        json_object_set_new(j, field, v);
    } else {
        json_object_del(j, field);
    }
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return s;
}

static void test_member_record(void **state)
{
    fy_member_t m = a_member(), r;
    char *json, err[256];
    size_t len;
    assert_int_equal(fy_member_write(&m, &json, &len), FY_OK);
    assert_int_equal(fy_member_read(json, len, &r, err, sizeof(err)), FY_OK);
    assert_string_equal(r.name, "decode-0");
    assert_string_equal(r.addr, m.addr);
    assert_true(r.inc == m.inc && r.layout == m.layout && r.tag == 0);
    fy_free(json);
    /* a router carries a tag; a worker none */
    m.tag = 77;
    snprintf(m.kind, sizeof(m.kind), "router");
    assert_int_equal(fy_member_write(&m, &json, &len), FY_OK);
    assert_int_equal(fy_member_read(json, len, &r, err, sizeof(err)), FY_OK);
    assert_int_equal(r.tag, 77);
    fy_free(json);
    static const struct {
        const char *field, *value, *why;
    } bad[] = {
        {"v", NULL, "\"v\""},
        {"v", "1", "record version 1, this ferry reads 2"},
        {"kind", "\"janitor\"", "\"kind\" is 'janitor'"},
        {"kind", "\"router\"", "\"tag\""}, /* a router without a tag */
        {"name", "\"\"", "\"name\""},
        {"name", "\"a/b\"", "holds a '/'"},
        {"name", "\"a\\u0001\"", "\"name\""},
        {"name", "7", "\"name\""},
        {"addr", NULL, "\"addr\""},
        {"model", "\"0123456789012345678901234567890123456789012345678901234567890123456789\"", "\"model\""},
        {"inc", "\"12\"", "\"inc\""},
        {"inc", "\"0000000000000000\"", "\"inc\" is 0"},
        {"layout", "\"ABCDEF0123456789\"", "\"layout\""},
        {"tag", "5", "\"tag\""},
        {"tag", "-1", "\"tag\""},
        {"version", NULL, "\"version\""},
        {"ts", NULL, "\"ts\""},
        {"ts", "-5", "\"ts\""},
        {"ts", "\"12\"", "\"ts\""},
        {"mac", NULL, "\"mac\""},
        {"mac", "\"00\"", "\"mac\""},
        {"mac", "\"zz00000000000000000000000000000000000000000000000000000000000000\"", "\"mac\""},
        {"mac", "\"AB00000000000000000000000000000000000000000000000000000000000000\"", "lowercase"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *s = member_with(bad[i].field, bad[i].value);
        err[0] = 0;
        fy_status_t st = fy_member_read(s, strlen(s), &r, err, sizeof(err));
        if (!st || !strstr(err, bad[i].why))
            fail_msg("%s: %s, '%s' (wanted '%s')", s, fy_status_str(st), err, bad[i].why);
        free(s);
    }
    assert_int_equal(fy_member_read("[]", 2, &r, err, sizeof(err)), FY_ERR_FORMAT);
    /* another model or layout: refused by name */
    m = a_member();
    assert_int_equal(fy_member_compatible(&m, "smollm2-abc", 0xabcdef, err, sizeof(err)), FY_OK);
    assert_int_equal(fy_member_compatible(&m, "gemma", 0xabcdef, err, sizeof(err)), FY_ERR_MISMATCH);
    assert_non_null(strstr(err, "decode decode-0 serves model smollm2-abc; this one serves gemma"));
    assert_int_equal(fy_member_compatible(&m, "smollm2-abc", 1, err, sizeof(err)), FY_ERR_MISMATCH);
    assert_non_null(strstr(err, "decode decode-0 has KV layout 0000000000abcdef"));
    assert_true(fy_member_layout_hash(16, 1, 30, 3, 64, 1000, 0) != fy_member_layout_hash(32, 1, 30, 3, 64, 1000, 0));
}

/* the membership a router and a worker start from their configuration
 * (fy_netconf_members, then fy_membership_params_conf): the key is
 * fy_member_key of kv.secret_file's bytes, the rest cluster.*'s; without
 * cluster.etcd nothing else is read; a TLS setting the endpoints refuse or
 * a short secret leaves no key or password behind */
static void test_membership_from_config(void **state)
{
    (void)state;
    uint8_t secret[40], want[FY_MEMBER_KEY_BYTES];
    for (size_t i = 0; i < sizeof(secret); i++) secret[i] = (uint8_t)(i * 7 + 1);
    char sf[512], shortf[512], text[2048];
    snprintf(sf, sizeof(sf), "%s", fy_test_path("member.secret"));
    snprintf(shortf, sizeof(shortf), "%s", fy_test_path("short.secret"));
    assert_true(fy_test_write_file(sf, secret, sizeof(secret)));
    assert_true(fy_test_write_file(shortf, secret, 8));
    assert_int_equal(fy_member_key(secret, sizeof(secret), want), FY_OK);

    fy_config_t *c = NULL;
    fy_member_conf_t m;
    fy_membership_params_t p;
    assert_int_equal(fy_config_create(&c), FY_OK);
    snprintf(text, sizeof(text),
             "[cluster]\netcd = http://127.0.0.1:1\nname = blue\netcd_ttl = 7s\netcd_poll = 250ms\n"
             "[kv]\nsecret_file = %s\n",
             sf);
    assert_int_equal(fy_config_load_string(c, text, "t"), FY_OK);
    assert_int_equal(fy_netconf_members(c, &m), FY_OK);
    assert_string_equal(m.etcd, "http://127.0.0.1:1");
    assert_string_equal(m.cluster, "blue");
    assert_int_equal(m.secret_len, sizeof(secret));
    memset(&p, 0, sizeof(p));
    assert_int_equal(fy_membership_params_conf(&p, &m), FY_OK);
    assert_string_equal(p.endpoints, "http://127.0.0.1:1");
    assert_string_equal(p.cluster, "blue");
    assert_true(p.ttl_s == 7.0 && p.poll_s == 0.25);
    assert_memory_equal(p.key, want, sizeof(want));
    /* an https endpoint without cluster.etcd_ca: refused, nothing kept */
    snprintf(m.etcd, sizeof(m.etcd), "https://127.0.0.1:1");
    snprintf(m.tls.user, sizeof(m.tls.user), "root");
    snprintf(m.tls.password, sizeof(m.tls.password), "hunter2");
    memset(&p, 0, sizeof(p));
    assert_int_not_equal(fy_membership_params_conf(&p, &m), FY_OK);
    static const fy_membership_params_t zero;
    assert_memory_equal(p.key, zero.key, sizeof(p.key));
    assert_memory_equal(&p.tls, &zero.tls, sizeof(p.tls));
    /* a secret too short for a key */
    m.secret_len = 8;
    snprintf(m.etcd, sizeof(m.etcd), "http://127.0.0.1:1");
    memset(m.tls.password, 0, sizeof(m.tls.password));
    memset(m.tls.user, 0, sizeof(m.tls.user));
    assert_int_equal(fy_membership_params_conf(&p, &m), FY_ERR_INVALID);
    assert_memory_equal(p.key, zero.key, sizeof(p.key));
    fy_netconf_members_wipe(&m);
    assert_int_equal(m.secret_len, 0);
    assert_int_equal(m.secret[0], 0);
    fy_config_destroy(c);

    /* without cluster.etcd: not even the secret file is read */
    assert_int_equal(fy_config_create(&c), FY_OK);
    assert_int_equal(fy_config_load_string(c, "[kv]\nsecret_file = /nonexistent/kv.secret\n", "t"), FY_OK);
    assert_int_equal(fy_netconf_members(c, &m), FY_OK);
    assert_string_equal(m.etcd, "");
    assert_int_equal(m.secret_len, 0);
    fy_config_destroy(c);
    /* with it, a secret file too short is refused naming it, m wiped */
    assert_int_equal(fy_config_create(&c), FY_OK);
    snprintf(text, sizeof(text), "[cluster]\netcd = http://127.0.0.1:1\n[kv]\nsecret_file = %s\n", shortf);
    assert_int_equal(fy_config_load_string(c, text, "t"), FY_OK);
    fy_test_log_begin();
    assert_int_equal(fy_netconf_members(c, &m), FY_ERR_FORMAT);
    fy_test_log_end();
    assert_true(fy_test_log_has("kv.secret_file", "short.secret", "at least 16", NULL));
    assert_string_equal(m.etcd, "");
    fy_config_destroy(c);
}

/* a record signed, then checked: any field changed, another key, another
 * etcd key, too old or from the future: refused, each by its cause */
static void test_member_signed(void **state)
{
    uint8_t secret[32], key[FY_MEMBER_KEY_BYTES], other[FY_MEMBER_KEY_BYTES];
    memset(secret, 7, sizeof(secret));
    assert_int_equal(fy_member_key(secret, sizeof(secret), key), FY_OK);
    secret[0] ^= 1;
    assert_int_equal(fy_member_key(secret, sizeof(secret), other), FY_OK);
    assert_int_equal(fy_member_key(secret, 8, other), FY_ERR_INVALID); /* a secret too short */
    const char *ek = "/ferry/t/workers/decode/decode-0";
    int64_t now = 1700000000000;
    fy_member_t m = a_member(), r;
    char *json, err[256];
    size_t len;
    assert_int_equal(fy_member_sign(&m, key, ek, now, &json, &len), FY_OK);
    assert_int_equal(fy_member_read(json, len, &r, err, sizeof(err)), FY_OK);
    assert_int_equal(r.ts_ms, now);
    assert_int_equal(fy_member_verify(&r, key, ek, now + 1000, 10, err, sizeof(err)), FY_OK);
    /* another secret, another key in etcd (a record copied elsewhere) */
    assert_int_equal(fy_member_verify(&r, other, ek, now, 10, err, sizeof(err)), FY_ERR_MISMATCH);
    assert_non_null(strstr(err, "bad MAC"));
    assert_int_equal(fy_member_verify(&r, key, "/ferry/t/workers/prefill/decode-0", now, 10, err, sizeof(err)),
                     FY_ERR_MISMATCH);
    /* too old; from too far in the future */
    assert_int_equal(fy_member_verify(&r, key, ek, now + 11000, 10, err, sizeof(err)), FY_ERR_MISMATCH);
    assert_non_null(strstr(err, "stale"));
    assert_int_equal(
        fy_member_verify(&r, key, ek, now - (int64_t)(FY_MEMBER_SKEW_S * 1000) - 1000, 10, err, sizeof(err)),
        FY_ERR_MISMATCH);
    assert_non_null(strstr(err, "in the future"));
    /* every field is covered: one changed in the JSON fails the MAC */
    json_t *j = json_loads(json, 0, NULL);
    assert_non_null(j);
    const char *fields[] = {"kind", "name", "inc", "addr", "client", "http", "tag", "model", "layout", "version", "ts"};
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        json_t *c = json_deep_copy(j);
        const char *f = fields[i];
        if (!strcmp(f, "tag")) { /* a router's record with a tag, the worker's without: both read */
            json_object_set_new(c, "kind", json_string("router"));
            json_object_set_new(c, "tag", json_integer(5));
        } else if (!strcmp(f, "ts")) {
            json_object_set_new(c, "ts", json_integer(now + 1));
        } else if (!strcmp(f, "inc") || !strcmp(f, "layout")) {
            json_object_set_new(c, f, json_string("00000000000000ff"));
        } else if (!strcmp(f, "kind")) {
            json_object_set_new(c, f, json_string("prefill"));
        } else {
            json_object_set_new(c, f, json_string("x"));
        }
        char *t = json_dumps(c, JSON_COMPACT);
        json_decref(c);
        assert_int_equal(fy_member_read(t, strlen(t), &r, err, sizeof(err)), FY_OK);
        if (fy_member_verify(&r, key, ek, now, 10, err, sizeof(err)) != FY_ERR_MISMATCH)
            fail_msg("a record with \"%s\" changed verifies: %s", f, t);
        free(t);
    }
    json_decref(j);
    fy_free(json);
    /* a transaction's answers */
    bool ok = false;
    fy_etcd_kvs_t k = {0};
    const char *won = "{\"header\":{},\"succeeded\":true,\"responses\":[{\"response_put\":{}}]}";
    assert_int_equal(fy_etcd_parse_txn(won, strlen(won), &ok, &k, err, sizeof(err)), FY_OK);
    assert_true(ok && k.n == 0);
    const char *lost = "{\"header\":{},\"responses\":[{\"response_range\":{\"kvs\":[{\"key\":\"YQ==\",\"value\":"
                       "\"Yg==\"}],\"count\":\"1\"}}]}";
    assert_int_equal(fy_etcd_parse_txn(lost, strlen(lost), &ok, &k, err, sizeof(err)), FY_OK);
    assert_true(!ok && k.n == 1 && !strcmp(k.kv[0].key, "a") && !strcmp((char *)k.kv[0].value, "b"));
    fy_etcd_kvs_free(&k);
    const char *bad[] = {"{\"succeeded\":1}", "{\"responses\":{}}", "{\"responses\":[]}",
                         "{\"responses\":[{\"response_range\":{\"kvs\":7}}]}"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(fy_etcd_parse_txn(bad[i], strlen(bad[i]), &ok, &k, err, sizeof(err)), FY_ERR_FORMAT);
}

/* ---- a real etcd ---- */

static void test_client(void **state)
{
    if (!tc_etcd_available()) skip();
    tc_etcd_t e;
    tc_etcd_start(&e, fy_test_tmpdir(), "127.0.0.1");
    fy_etcd_t *c;
    /* a dead endpoint first: the call goes on to the live one */
    char eps[160];
    snprintf(eps, sizeof(eps), "127.0.0.1:%d, %s", tc_free_port(), e.url);
    assert_int_equal(fy_etcd_create(eps, 1.0, &c), FY_OK);
    int64_t lease, ttl;
    assert_int_equal(fy_etcd_grant(c, 5, &lease), FY_OK);
    assert_int_equal(fy_etcd_put(c, "/ferry/t/workers/decode/a", "{}", 2, lease), FY_OK);
    assert_int_equal(fy_etcd_put(c, "/ferry/t/workers/prefill/b", "x", 1, 0), FY_OK);
    assert_int_equal(fy_etcd_put(c, "/ferry/u/workers/decode/c", "y", 1, 0), FY_OK);
    fy_etcd_kvs_t k = {0};
    assert_int_equal(fy_etcd_range_prefix(c, "/ferry/t/workers/", &k), FY_OK);
    assert_int_equal(k.n, 2);
    assert_string_equal(k.kv[0].key, "/ferry/t/workers/decode/a");
    assert_string_equal((char *)k.kv[0].value, "{}");
    fy_etcd_kvs_free(&k);
    assert_int_equal(fy_etcd_keepalive(c, lease, &ttl), FY_OK);
    assert_int_equal(ttl, 5);
    /* the lease goes, and its key with it; a keepalive then says 0 */
    assert_int_equal(fy_etcd_revoke(c, lease), FY_OK);
    assert_int_equal(fy_etcd_range_prefix(c, "/ferry/t/workers/decode/", &k), FY_OK);
    assert_int_equal(k.n, 0);
    assert_int_equal(fy_etcd_keepalive(c, lease, &ttl), FY_OK);
    assert_int_equal(ttl, 0);
    assert_int_equal(fy_etcd_delete(c, "/ferry/t/workers/prefill/b"), FY_OK);
    assert_int_equal(fy_etcd_range_prefix(c, "/ferry/t/", &k), FY_OK);
    assert_int_equal(k.n, 0);
    /* a put under a lease etcd does not know: etcd's error, as a status */
    assert_int_equal(fy_etcd_put(c, "/x", "y", 1, 12345), FY_ERR_PEER);
    assert_non_null(strstr(fy_etcd_last_error(c), "lease not found"));
    /* etcd gone: every call fails with a cause, none hangs past its timeout */
    tc_etcd_kill(&e);
    double t0 = fy_now_s();
    assert_int_equal(fy_etcd_range_prefix(c, "/ferry/", &k), FY_ERR_PEER);
    assert_int_equal(fy_etcd_grant(c, 5, &lease), FY_ERR_PEER);
    print_message("etcd down: %s\n", fy_etcd_last_error(c));
    assert_non_null(strstr(fy_etcd_last_error(c), "127.0.0.1"));
    assert_true(fy_now_s() - t0 < 5);
    fy_etcd_destroy(c);
    assert_int_equal(fy_etcd_create(" , ", 1.0, &c), FY_ERR_INVALID);
}

/* what a membership thread last listed */
typedef struct seen {
    pthread_mutex_t mu;
    char names[8][64];
    int n, rounds;
} seen_t;

static void on_seen(void *arg, const fy_member_t *live, int n)
{
    seen_t *s = arg;
    pthread_mutex_lock(&s->mu);
    s->n = 0;
    for (int i = 0; i < n && s->n < 8; i++) snprintf(s->names[s->n++], sizeof(s->names[0]), "%s", live[i].name);
    s->rounds++;
    pthread_mutex_unlock(&s->mu);
}

static bool seen_has(seen_t *s, const char *name)
{
    pthread_mutex_lock(&s->mu);
    bool has = false;
    for (int i = 0; i < s->n; i++) has |= !strcmp(s->names[i], name);
    pthread_mutex_unlock(&s->mu);
    return has;
}

static int seen_rounds(seen_t *s)
{
    pthread_mutex_lock(&s->mu);
    int r = s->rounds;
    pthread_mutex_unlock(&s->mu);
    return r;
}

static fy_membership_params_t params_for(const char *endpoints, const char *kind, const char *name, uint32_t tag,
                                         const uint8_t *key, seen_t *s)
{
    fy_membership_params_t p = {.endpoints = endpoints,
                                .cluster = "m",
                                .dir = !strcmp(kind, "router") ? "routers" : "workers/decode",
                                .watch = !strcmp(kind, "router") ? "workers/" : "routers/",
                                .ttl_s = 2,
                                .poll_s = 0.05,
                                .fn = on_seen,
                                .arg = s};
    p.self = a_member();
    snprintf(p.self.kind, sizeof(p.self.kind), "%s", kind);
    snprintf(p.self.name, sizeof(p.self.name), "%s", name);
    p.self.tag = tag;
    p.self.inc = 0x1000 + tag;
    memcpy(p.key, key, FY_MEMBER_KEY_BYTES);
    return p;
}

/* the value under key now ("" when none) */
static void value_of(fy_etcd_t *ec, const char *key, char *out, size_t cap)
{
    fy_etcd_kvs_t k = {0};
    assert_int_equal(fy_etcd_range_prefix(ec, key, &k), FY_OK);
    out[0] = 0;
    for (int i = 0; i < k.n; i++)
        if (!strcmp(k.kv[i].key, key)) snprintf(out, cap, "%s", (char *)k.kv[i].value);
    fy_etcd_kvs_free(&k);
}

/* waits up to timeout_s for key's value to be want (NULL: anything but
 * "" or not_want); the seconds it took */
static double wait_value(fy_etcd_t *ec, const char *key, const char *not_want, double timeout_s)
{
    double t0 = fy_now_s();
    char v[FY_ETCD_MAX_VALUE + 1];
    for (;;) {
        value_of(ec, key, v, sizeof(v));
        if (v[0] && (!not_want || strcmp(v, not_want))) return fy_now_s() - t0;
        if (fy_now_s() - t0 > timeout_s) fail_msg("%s not written again within %.1f s", key, timeout_s);
        usleep(10000);
    }
}

/* Membership against a real etcd, as an attacker without the secret meets
 * it: records it forges or garbles are refused and counted once; records
 * it deletes or overwrites are written again at once; a second router with
 * a tag already held does not start. */
static void test_membership_attacks(void **state)
{
    if (!tc_etcd_available()) skip();
    tc_etcd_t e;
    tc_etcd_start(&e, fy_test_tmpdir(), "127.0.0.1");
    uint8_t secret[32], key[FY_MEMBER_KEY_BYTES];
    memset(secret, 3, sizeof(secret));
    assert_int_equal(fy_member_key(secret, sizeof(secret), key), FY_OK);
    seen_t sr = {.mu = PTHREAD_MUTEX_INITIALIZER}, sw = {.mu = PTHREAD_MUTEX_INITIALIZER};
    fy_membership_params_t pr = params_for(e.url, "router", "r0", 0x123, key, &sr);
    fy_membership_params_t pw = params_for(e.url, "decode", "w0", 0, key, &sw);
    fy_membership_t *mr, *mw;
    assert_int_equal(fy_membership_start(&pr, &mr), FY_OK);
    assert_int_equal(fy_membership_start(&pw, &mw), FY_OK);
    double t0 = fy_now_s();
    while (!(seen_has(&sr, "w0") && seen_has(&sw, "r0"))) {
        if (fy_now_s() - t0 > 10) fail_msg("the router and the worker did not see each other");
        usleep(10000);
    }
    fy_etcd_t *ec;
    assert_int_equal(fy_etcd_create(e.url, 1.0, &ec), FY_OK);
    char err[256];

    /* a forged router record carrying the real router's tag, and the
     * forger's address: unsigned, then signed with another secret, then
     * a real signed record replayed under another key; and garbage */
    fy_member_t f = pr.self;
    snprintf(f.name, sizeof(f.name), "evil");
    snprintf(f.addr, sizeof(f.addr), "tcp://127.0.0.1:1");
    char *json;
    size_t len;
    assert_int_equal(fy_member_write(&f, &json, &len), FY_OK);
    assert_int_equal(fy_etcd_put(ec, "/ferry/m/routers/evil", json, len, 0), FY_OK);
    fy_free(json);
    uint8_t other[FY_MEMBER_KEY_BYTES], secret2[32];
    memset(secret2, 4, sizeof(secret2));
    assert_int_equal(fy_member_key(secret2, sizeof(secret2), other), FY_OK);
    snprintf(f.name, sizeof(f.name), "evil2");
    assert_int_equal(fy_member_sign(&f, other, "/ferry/m/routers/evil2", fy_wall_ms(), &json, &len), FY_OK);
    assert_int_equal(fy_etcd_put(ec, "/ferry/m/routers/evil2", json, len, 0), FY_OK);
    fy_free(json);
    char real[FY_ETCD_MAX_VALUE + 1];
    value_of(ec, "/ferry/m/routers/r0", real, sizeof(real));
    assert_true(real[0]);
    assert_int_equal(fy_etcd_put(ec, "/ferry/m/routers/r0copy", real, strlen(real), 0), FY_OK);
    assert_int_equal(fy_etcd_put(ec, "/ferry/m/routers/junk", "{\"v\":2", 6, 0), FY_OK);
    int r0 = seen_rounds(&sw);
    while (seen_rounds(&sw) < r0 + 10) usleep(10000); /* ten rounds: each record counted once */
    assert_true(seen_has(&sw, "r0"));
    assert_false(seen_has(&sw, "evil") || seen_has(&sw, "evil2") || seen_has(&sw, "r0copy"));
    assert_int_equal(fy_membership_refused(mw), 4);
    print_message("forged, foreign-keyed, copied and garbled router records: 4 refused, 0 listed\n");

    /* a second router with a tag the first holds: refused at its start */
    seen_t s2 = {.mu = PTHREAD_MUTEX_INITIALIZER};
    fy_membership_params_t p2 = params_for(e.url, "router", "r1", 0x123, key, &s2);
    fy_membership_t *m2 = NULL;
    assert_int_equal(fy_membership_start(&p2, &m2), FY_ERR_MISMATCH);
    assert_null(m2);
    /* another tag is fine */
    p2.self.tag = 0x124;
    assert_int_equal(fy_membership_start(&p2, &m2), FY_OK);

    /* its worker record deleted: written again within a few rounds, under
     * the same lease; overwritten by someone else: the same */
    const char *wk = "/ferry/m/workers/decode/w0";
    char mine[FY_ETCD_MAX_VALUE + 1];
    value_of(ec, wk, mine, sizeof(mine));
    assert_int_equal(fy_etcd_delete(ec, wk), FY_OK);
    double took = wait_value(ec, wk, NULL, 2.0);
    print_message("a deleted worker record was back after %.3f s\n", took);
    assert_true(fy_membership_registered(mw));
    assert_int_equal(fy_etcd_put(ec, wk, real, strlen(real), 0), FY_OK); /* a router's record there */
    took = wait_value(ec, wk, real, 2.0);
    print_message("an overwritten worker record was its own again after %.3f s\n", took);
    while (!seen_has(&sr, "w0")) usleep(10000);

    /* a newer process of the same name (w0 restarted while the old one
     * still runs, or was stopped): its record stands, no flapping */
    seen_t sn = {.mu = PTHREAD_MUTEX_INITIALIZER};
    fy_membership_params_t pn = params_for(e.url, "decode", "w0", 0, key, &sn);
    pn.self.inc = 0x2000;
    fy_membership_t *mn;
    assert_int_equal(fy_membership_start(&pn, &mn), FY_OK);
    for (double t1 = fy_now_s();; usleep(10000)) { /* its record written: the old w0 sees it from now on */
        fy_member_t cur;
        value_of(ec, wk, mine, sizeof(mine));
        if (!fy_member_read(mine, strlen(mine), &cur, err, sizeof(err)) && cur.inc == 0x2000) break;
        if (fy_now_s() - t1 > 5) fail_msg("the second w0's record was not written within 5 s");
    }
    int theirs = 0, samples = 0;
    for (double t1 = fy_now_s(); fy_now_s() - t1 < 1.0; samples++) {
        fy_member_t cur;
        value_of(ec, wk, mine, sizeof(mine));
        if (!fy_member_read(mine, strlen(mine), &cur, err, sizeof(err)) && cur.inc == 0x2000) theirs++;
        usleep(10000);
    }
    print_message("a second process named w0: its record held in %d of %d samples over 1 s\n", theirs, samples);
    assert_int_equal(theirs, samples);
    fy_membership_stop(mn);

    /* the router stops: its tag goes with its lease */
    fy_membership_stop(mr);
    value_of(ec, "/ferry/m/tags/00123", mine, sizeof(mine));
    assert_string_equal(mine, "");
    fy_membership_stop(m2);
    fy_membership_stop(mw);
    fy_etcd_destroy(ec);
    tc_etcd_kill(&e);
}

/* ---- a cluster of two routers ---- */

static void make_prompt(int32_t *p, int32_t n, uint64_t seed)
{
    for (int32_t i = 0; i < n; i++) p[i] = 100 + (int32_t)(fy_test_rand_u64(&seed) % 40000);
}

static fy_client_stream_t submit(fy_client_t *cl, const int32_t *p, int32_t n, int32_t max_tokens)
{
    fy_client_req_t q = {.tokens = p, .n_tokens = n};
    fy_genspec_default(&q.gen);
    q.gen.max_tokens = max_tokens;
    q.gen.ignore_eos = true;
    fy_client_stream_t s;
    char err[256];
    fy_status_t st = fy_client_generate(cl, &q, &s, err, sizeof(err));
    if (st) fail_msg("generate refused: %s (%s)", err, fy_status_str(st));
    return s;
}

/* waits until the router behind cl sees np prefill and nd decode workers up */
static double wait_up(tc_cluster_t *c, fy_client_t *cl, int np, int nd, double timeout_s)
{
    double t0 = fy_now_s();
    for (;;) {
        fy_client_status_t s;
        if (fy_client_status(cl, &s) == FY_OK && s.prefill_up == np && s.decode_up == nd) return fy_now_s() - t0;
        if (fy_now_s() - t0 > timeout_s) {
            tc_print_logs(c);
            fail_msg("the router did not see %d prefill and %d decode workers up within %.0f s", np, nd, timeout_s);
        }
        usleep(20000);
    }
}

static bool log_has(const tc_cluster_t *c, const char *proc, const char *what)
{
    for (int i = 0; i < c->n_procs; i++) {
        if (strcmp(c->procs[i].name, proc)) continue;
        size_t len;
        char *t = fy_test_read_file(c->procs[i].log, &len);
        bool has = t && strstr(t, what);
        fy_free(t);
        return has;
    }
    return false;
}

static void wait_log(const tc_cluster_t *c, const char *proc, const char *what, double timeout_s)
{
    double t0 = fy_now_s();
    while (!log_has(c, proc, what)) {
        if (fy_now_s() - t0 > timeout_s) {
            tc_print_logs(c);
            fail_msg("%s never logged '%s'", proc, what);
        }
        usleep(50000);
    }
}

/* collects through another router's client */
static void collect_on(tc_cluster_t *c, fy_client_t *cl, fy_client_stream_t *s, tc_result_t *r, int n, double t)
{
    fy_client_t *keep = c->client;
    c->client = cl;
    tc_collect(c, s, r, n, t);
    c->client = keep;
}

/* every decode worker's admittable blocks as the router behind cl sees them */
static void admittable(fy_client_t *cl, int32_t adm[2])
{
    fy_client_status_t s;
    assert_int_equal(fy_client_status(cl, &s), FY_OK);
    for (int i = 0; i < s.n_workers; i++)
        if (s.workers[i].decode) adm[!strcmp(s.workers[i].name, "decode-1")] = s.workers[i].admittable;
}

enum { N_EACH = 4 };

/* events delivered to a forger's socket */
static atomic_int forged_events;

static void on_forged(void *arg, const fy_env_hdr_t *from, const void *buf, size_t len)
{
    (void)arg, (void)from, (void)buf, (void)len;
    atomic_fetch_add(&forged_events, 1);
}

static void test_two_routers(void **state)
{
    if (!tc_etcd_available() || !tc_available()) skip();
    tc_etcd_t e;
    tc_etcd_start(&e, fy_test_tmpdir(), "127.0.0.1");
    char set_etcd[128];
    snprintf(set_etcd, sizeof(set_etcd), "cluster.etcd=%s", e.url);
    tc_cluster_t c;
    tc_opts_t o = {.n_prefill = 2,
                   .n_decode = 2,
                   .n_routers = 2,
                   .common = {set_etcd, "cluster.name=t", "cluster.etcd_ttl=2s", "cluster.etcd_poll=100ms"}};
    double t_start = fy_now_s();
    tc_start(&c, &o);
    fy_client_t *c1;
    assert_int_equal(fy_client_create(c.router_urls[1], c.secret, 5.0, &c1), FY_OK);
    wait_up(&c, c1, 2, 2, 30);
    print_message("2 routers, 2 prefill, 2 decode workers up through etcd in %.2f s\n", fy_now_s() - t_start);
    int32_t adm0[2];
    admittable(c1, adm0);

    /* records the routers must refuse, each by name: signed (with the
     * deployment's key, as a process of another build would) but for
     * another model or KV layout, and junk */
    uint8_t key[FY_MEMBER_KEY_BYTES];
    size_t slen;
    uint8_t *sec = (uint8_t *)fy_test_read_file(c.secret, &slen);
    assert_non_null(sec);
    assert_int_equal(fy_member_key(sec, slen, key), FY_OK);
    fy_free(sec);
    fy_etcd_t *ec;
    assert_int_equal(fy_etcd_create(e.url, 1.0, &ec), FY_OK);
    fy_etcd_kvs_t k = {0};
    assert_int_equal(fy_etcd_range_prefix(ec, "/ferry/t/workers/decode/decode-0", &k), FY_OK);
    assert_int_equal(k.n, 1);
    fy_member_t real, m;
    char err[256];
    assert_int_equal(fy_member_read(k.kv[0].value, k.kv[0].value_len, &real, err, sizeof(err)), FY_OK);
    fy_etcd_kvs_free(&k);
    assert_int_equal(fy_etcd_put(ec, "/ferry/t/workers/decode/junk", "not json", 8, 0), FY_OK);
    m = real;
    snprintf(m.name, sizeof(m.name), "other");
    snprintf(m.model, sizeof(m.model), "another-model");
    char *json;
    size_t len;
    assert_int_equal(fy_member_sign(&m, key, "/ferry/t/workers/decode/other", fy_wall_ms(), &json, &len), FY_OK);
    assert_int_equal(fy_etcd_put(ec, "/ferry/t/workers/decode/other", json, len, 0), FY_OK);
    fy_free(json);
    m = real;
    snprintf(m.name, sizeof(m.name), "skewed");
    m.layout ^= 1;
    assert_int_equal(fy_member_sign(&m, key, "/ferry/t/workers/decode/skewed", fy_wall_ms(), &json, &len), FY_OK);
    assert_int_equal(fy_etcd_put(ec, "/ferry/t/workers/decode/skewed", json, len, 0), FY_OK);
    fy_free(json);
    wait_log(&c, "router-1", "record /ferry/t/workers/decode/junk refused: not JSON", 5);
    wait_log(&c, "router-1", "decode other serves model another-model", 5);
    wait_log(&c, "router-1", "decode skewed has KV layout", 5);
    wait_log(&c, "router", "decode skewed has KV layout", 5);
    fy_client_status_t st;
    assert_int_equal(fy_client_status(c1, &st), FY_OK);
    assert_int_equal(st.decode_up, 2); /* none of them joined */
    assert_int_equal(fy_etcd_delete(ec, "/ferry/t/workers/decode/junk"), FY_OK);
    assert_int_equal(fy_etcd_delete(ec, "/ferry/t/workers/decode/other"), FY_OK);
    assert_int_equal(fy_etcd_delete(ec, "/ferry/t/workers/decode/skewed"), FY_OK);

    /* an attacker who reaches etcd but holds no secret: a router record
     * with router-1's tag and its own address (the workers must send it
     * nothing), then router-1's and every worker's records deleted while
     * router-1 streams (the streams go on; the records come back) */
    forged_events = 0;
    fy_env_auth_t fa;
    assert_int_equal(fy_cluster_auth_file(c.secret, FY_ROLE_ROUTER, "forger", 0xf0f0, &fa), FY_OK);
    char forger_url[64];
    snprintf(forger_url, sizeof(forger_url), "tcp://127.0.0.1:%d", tc_free_port());
    fy_pull_t *forger;
    assert_int_equal(fy_pull_create(forger_url, &fa, FY_RPC_FROM(FY_ROLE_PREFILL) | FY_RPC_FROM(FY_ROLE_DECODE),
                                    on_forged, NULL, &forger),
                     FY_OK);
    assert_int_equal(fy_etcd_range_prefix(ec, "/ferry/t/routers/router-1", &k), FY_OK);
    assert_int_equal(k.n, 1);
    fy_member_t r1rec;
    assert_int_equal(fy_member_read(k.kv[0].value, k.kv[0].value_len, &r1rec, err, sizeof(err)), FY_OK);
    fy_etcd_kvs_free(&k);
    m = r1rec;
    snprintf(m.name, sizeof(m.name), "forger");
    snprintf(m.addr, sizeof(m.addr), "%s", forger_url);
    m.inc = 0xf0f0;
    assert_int_equal(fy_member_write(&m, &json, &len), FY_OK); /* its MAC is r1's: it does not verify */
    assert_int_equal(fy_etcd_put(ec, "/ferry/t/routers/forger", json, len, 0), FY_OK);
    fy_free(json);
    wait_log(&c, "decode-0", "record /ferry/t/routers/forger refused: bad MAC", 5);
    int32_t pa[N_EACH][48];
    fy_client_stream_t sa[N_EACH];
    tc_result_t ra[N_EACH];
    memset(ra, 0, sizeof(ra));
    for (int i = 0; i < N_EACH; i++) {
        make_prompt(pa[i], 48, 500 + (uint64_t)i);
        sa[i] = submit(c1, pa[i], 48, 96);
    }
    for (int32_t got = 0; got < 2;) {
        fy_client_update_t u;
        assert_int_equal(fy_client_poll(c1, &sa[0], 0.5, &u), FY_OK);
        got += u.n_tokens;
    }
    const char *victims[] = {"/ferry/t/routers/router-1", "/ferry/t/workers/decode/decode-0",
                             "/ferry/t/workers/decode/decode-1", "/ferry/t/workers/prefill/prefill-0",
                             "/ferry/t/workers/prefill/prefill-1"};
    double t_del = fy_now_s();
    for (size_t i = 0; i < sizeof(victims) / sizeof(victims[0]); i++)
        assert_int_equal(fy_etcd_delete(ec, victims[i]), FY_OK);
    double back = 0;
    for (size_t i = 0; i < sizeof(victims) / sizeof(victims[0]); i++) {
        char v[FY_ETCD_MAX_VALUE + 1];
        for (;;) {
            value_of(ec, victims[i], v, sizeof(v));
            if (v[0]) break;
            if (fy_now_s() - t_del > 1.0) { /* 10 watch rounds */
                tc_print_logs(&c);
                fail_msg("%s not registered again 1 s after its deletion", victims[i]);
            }
            usleep(10000);
        }
        if (fy_now_s() - t_del > back) back = fy_now_s() - t_del;
    }
    collect_on(&c, c1, sa, ra, N_EACH, 60);
    for (int i = 0; i < N_EACH; i++)
        if (ra[i].error) fail_msg("request %d after the records' deletion: %s", i, ra[i].message);
    print_message("attack through etcd: %d events reached a forged router record with router-1's tag; all 5 "
                  "deleted records were back within %.3f s; %d streams went on to their end\n",
                  (int)forged_events, back, N_EACH);
    assert_int_equal(forged_events, 0);
    fy_pull_destroy(forger);
    fy_env_auth_wipe(&fa);
    assert_int_equal(fy_etcd_delete(ec, "/ferry/t/routers/forger"), FY_OK);
    assert_int_equal(fy_client_status(c1, &st), FY_OK);
    assert_int_equal(st.decode_up, 2);

    /* load on both routers; then router 0 dies */
    int32_t p[N_EACH * 2][48];
    for (int i = 0; i < N_EACH * 2; i++) make_prompt(p[i], 48, 1000 + (uint64_t)i);
    fy_client_stream_t s0[N_EACH], s1[N_EACH];
    tc_result_t r0[N_EACH], r1[N_EACH];
    memset(r0, 0, sizeof(r0));
    memset(r1, 0, sizeof(r1));
    for (int i = 0; i < N_EACH; i++) {
        s0[i] = submit(c.client, p[i], 48, 1500);
        s1[i] = submit(c1, p[N_EACH + i], 48, 64);
    }
    assert_true(s0[0].id >> 32 != s1[0].id >> 32); /* each router's ids carry its tag */
    int32_t seen = 0;
    double t0 = fy_now_s();
    while (seen < 4 && fy_now_s() - t0 < 60) {
        fy_client_update_t u;
        assert_int_equal(fy_client_poll(c.client, &s0[0], 0.5, &u), FY_OK);
        seen += u.n_tokens;
    }
    assert_true(seen >= 4);
    double t_kill = fy_now_s();
    tc_kill(&c, "router");
    collect_on(&c, c1, s1, r1, N_EACH, 60);
    for (int i = 0; i < N_EACH; i++) {
        if (r1[i].error) fail_msg("request %d on the surviving router failed: %s", i, r1[i].message);
        assert_int_equal(r1[i].n, 64);
    }
    /* the dead router's requests end at the workers: every block comes back */
    double t_back = 0;
    for (;;) {
        int32_t adm[2];
        admittable(c1, adm);
        if (adm[0] == adm0[0] && adm[1] == adm0[1]) {
            t_back = fy_now_s() - t_kill;
            break;
        }
        if (fy_now_s() - t_kill > 15) {
            tc_print_logs(&c);
            fail_msg("decode pools at %d and %d blocks, %d and %d before", adm[0], adm[1], adm0[0], adm0[1]);
        }
        usleep(20000);
    }
    print_message("router killed: its requests ended at the workers and their blocks were back in %.2f s "
                  "(cluster.etcd_ttl 2 s)\n",
                  t_back);
    wait_log(&c, "decode-0", "its router is gone", 5);
    /* the lease (2 s), a watch round, and a margin for the workers to end
     * the requests: 2.5 s, or three times that where every process runs
     * under a sanitizer (ASan on a loaded machine took 5.5 and 8.6 s,
     * UBSan 7.8 s; FY_DEBUG marks every sanitizer build, UBSan has no
     * predefined macro of its own) */
#ifdef FY_DEBUG
    const double margin = 7.5;
#else
    const double margin = 2.5;
#endif
    assert_true(t_back < 2.0 + 0.5 + margin);

    /* a decode worker killed is dropped; restarted, it rejoins */
    tc_kill(&c, "decode-1");
    wait_up(&c, c1, 2, 1, 10);
    double t_restart = fy_now_s();
    tc_restart(&c, "decode-1");
    double t_join = wait_up(&c, c1, 2, 2, 60);
    print_message("decode-1 restarted: placed on again %.2f s after its start\n", fy_now_s() - t_restart);
    (void)t_join;
    fy_client_stream_t s = submit(c1, p[0], 48, 8);
    tc_result_t r = {0};
    collect_on(&c, c1, &s, &r, 1, 60);
    assert_int_equal(r.error, FY_OK);

    /* etcd away for 10 s: serving goes on on the last known membership */
    tc_etcd_kill(&e);
    double t_down = fy_now_s();
    int served = 0;
    while (fy_now_s() - t_down < 10) {
        fy_client_stream_t sd = submit(c1, p[served % (N_EACH * 2)], 48, 16);
        tc_result_t rd = {0};
        collect_on(&c, c1, &sd, &rd, 1, 30);
        if (rd.error) fail_msg("request with etcd down failed: %s", rd.message);
        served++;
        usleep(200000);
    }
    assert_int_equal(fy_client_status(c1, &st), FY_OK);
    assert_int_equal(st.decode_up, 2);
    assert_int_equal(st.prefill_up, 2);
    print_message("etcd down for 10 s: %d requests served\n", served);
    wait_log(&c, "router-1", "serving on the last known membership", 1); /* keepalive or watch: what failed first */
    tc_etcd_spawn(&e);
    /* every live process is registered again */
    double t_up = fy_now_s();
    for (;;) {
        assert_int_equal(fy_etcd_range_prefix(ec, "/ferry/t/", &k), FY_OK);
        int n = 0;
        for (int i = 0; i < k.n; i++) n += !strncmp(k.kv[i].key, "/ferry/t/tags/", 14) ? 0 : 1;
        fy_etcd_kvs_free(&k);
        if (n == 5) break; /* router-1 and 4 workers (its tag aside) */
        if (fy_now_s() - t_up > 15) {
            tc_print_logs(&c);
            fail_msg("%d records in etcd 15 s after it came back, 5 expected", n);
        }
        usleep(50000);
    }
    wait_log(&c, "router-1", "etcd: reachable again", 5);
    s = submit(c1, p[1], 48, 8);
    memset(&r, 0, sizeof(r));
    collect_on(&c, c1, &s, &r, 1, 60);
    assert_int_equal(r.error, FY_OK);

    /* etcd stopped (SIGSTOP) past every lease while router-1 streams:
     * routers and workers still hear each other, so nothing ends; when it
     * runs again, every lease has expired and everyone registers again */
    for (int i = 0; i < N_EACH; i++) { /* long enough to outlast the stop and the re-registration */
        sa[i] = submit(c1, pa[i], 48, 600);
        memset(&ra[i], 0, sizeof(ra[i]));
    }
    assert_int_equal(kill(e.pid, SIGSTOP), 0);
    double t_stop = fy_now_s();
    int served_stopped = 0;
    while (fy_now_s() - t_stop < 4.0) { /* cluster.etcd_ttl is 2 s */
        fy_client_stream_t sd = submit(c1, p[served_stopped % (N_EACH * 2)], 48, 16);
        tc_result_t rd = {0};
        collect_on(&c, c1, &sd, &rd, 1, 30);
        if (rd.error) {
            kill(e.pid, SIGCONT);
            fail_msg("request with etcd stopped failed: %s", rd.message);
        }
        served_stopped++;
    }
    assert_int_equal(kill(e.pid, SIGCONT), 0);
    double stopped_for = fy_now_s() - t_stop, t_cont = fy_now_s();
    while (fy_now_s() - t_cont < 2.0) { /* and while the leases expire and everyone registers again */
        fy_client_stream_t sd = submit(c1, p[served_stopped % (N_EACH * 2)], 48, 16);
        tc_result_t rd = {0};
        collect_on(&c, c1, &sd, &rd, 1, 30);
        if (rd.error) fail_msg("request after etcd ran again failed: %s", rd.message);
        served_stopped++;
    }
    t_up = t_cont;
    for (;;) {
        assert_int_equal(fy_etcd_range_prefix(ec, "/ferry/t/", &k), FY_OK);
        int n = 0;
        for (int i = 0; i < k.n; i++) n += !strncmp(k.kv[i].key, "/ferry/t/tags/", 14) ? 0 : 1;
        fy_etcd_kvs_free(&k);
        if (n == 5) break;
        if (fy_now_s() - t_up > 15) {
            tc_print_logs(&c);
            fail_msg("%d records in etcd 15 s after it ran again, 5 expected", n);
        }
        usleep(50000);
    }
    double t_back_all = fy_now_s() - t_up;
    collect_on(&c, c1, sa, ra, N_EACH, 90);
    for (int i = 0; i < N_EACH; i++)
        if (ra[i].error) fail_msg("stream %d across the etcd stop failed: %s", i, ra[i].message);
    print_message("etcd stopped for %.1f s (leases of 2 s): %d streams across it and %d requests during it and "
                  "after it ended without an error; all 5 records registered again (checked %.2f s after SIGCONT)\n",
                  stopped_for, N_EACH, served_stopped, t_back_all);
    assert_int_equal(fy_client_status(c1, &st), FY_OK);
    assert_int_equal(st.decode_up, 2);
    assert_int_equal(st.prefill_up, 2);

    /* router-1 stopped for 4 s (router.health_timeout is 2 s, its lease
     * 2 s): when it runs again it must not take its workers for dead
     * (they were not silent: it was), and its stream goes on; the
     * workers keep its requests (it held its connections) */
    pid_t r1pid = 0;
    for (int i = 0; i < c.n_procs; i++)
        if (!strcmp(c.procs[i].name, "router-1")) r1pid = c.procs[i].pid;
    assert_true(r1pid > 0);
    int down_before = 0, down_after = 0;
    {
        size_t ll;
        char *t = NULL;
        for (int i = 0; i < c.n_procs; i++)
            if (!strcmp(c.procs[i].name, "router-1")) t = fy_test_read_file(c.procs[i].log, &ll);
        for (char *q = t; q && (q = strstr(q, " is down: ")); q++) down_before++;
        fy_free(t);
    }
    s = submit(c1, p[2], 48, 256);
    memset(&r, 0, sizeof(r));
    for (int32_t got = 0; got < 2;) {
        fy_client_update_t u;
        assert_int_equal(fy_client_poll(c1, &s, 0.5, &u), FY_OK);
        got += u.n_tokens;
    }
    assert_int_equal(kill(r1pid, SIGSTOP), 0);
    usleep(4000000); /* a fixed time: the stop must outlast router.health_timeout and the lease (2 s each) */
    assert_int_equal(kill(r1pid, SIGCONT), 0);
    collect_on(&c, c1, &s, &r, 1, 60);
    {
        size_t ll;
        char *t = NULL;
        for (int i = 0; i < c.n_procs; i++)
            if (!strcmp(c.procs[i].name, "router-1")) t = fy_test_read_file(c.procs[i].log, &ll);
        for (char *q = t; q && (q = strstr(q, " is down: ")); q++) down_after++;
        fy_free(t);
    }
    print_message("router-1 stopped 4 s: %d worker(s) declared down after it, its stream: %s\n",
                  down_after - down_before, r.error ? r.message : "ended without an error");
    if (r.error || down_after != down_before) {
        tc_print_logs(&c);
        fail_msg("router-1 stopped 4 s: %d worker(s) declared down, stream: %s", down_after - down_before,
                 r.error ? r.message : "ok");
    }
    wait_log(&c, "router-1", "did not run for", 1);
    wait_up(&c, c1, 2, 2, 10);
    s = submit(c1, p[3], 48, 8);
    memset(&r, 0, sizeof(r));
    collect_on(&c, c1, &s, &r, 1, 60);
    if (r.error) {
        tc_print_logs(&c);
        fail_msg("after router-1 ran again: %s", r.message);
    }
    double t_pools = fy_now_s();
    for (int32_t adm[2] = {-1, -1}; adm[0] != adm0[0] || adm[1] != adm0[1];) { /* no block leaked */
        admittable(c1, adm);
        if (fy_now_s() - t_pools > 10)
            fail_msg("decode pools at %d and %d blocks, %d and %d at the start", adm[0], adm[1], adm0[0], adm0[1]);
        usleep(20000);
    }
    fy_etcd_destroy(ec);
    fy_client_destroy(c1);
    tc_stop(&c);
    tc_etcd_kill(&e);
}

/* cluster.etcd_ca, etcd_cert, etcd_key: etcd with TLS and --client-cert-auth.
 * A router and a worker holding certificates of the deployment's CA list
 * each other; a client without a certificate, with one of another CA
 * (even under the same name), or trusting the system's CAs instead of the
 * deployment's cannot read or write /ferry/. */
static void test_tls(void **state)
{
    if (!tc_etcd_available()) skip();
    char certs[300], other[300];
    snprintf(certs, sizeof(certs), "%s/pki", fy_test_tmpdir());
    snprintf(other, sizeof(other), "%s/other-pki", fy_test_tmpdir());
    static const char *const names[] = {"root", "ferry-router", "ferry-worker"};
    tc_etcd_certs(certs, names, 3);
    tc_etcd_certs(other, names, 3);
    tc_etcd_t e;
    tc_etcd_start_tls(&e, fy_test_tmpdir(), certs);

    uint8_t secret[32], key[FY_MEMBER_KEY_BYTES];
    memset(secret, 5, sizeof(secret));
    assert_int_equal(fy_member_key(secret, sizeof(secret), key), FY_OK);
    seen_t sr = {.mu = PTHREAD_MUTEX_INITIALIZER}, sw = {.mu = PTHREAD_MUTEX_INITIALIZER};
    fy_membership_params_t pr = params_for(e.url, "router", "r0", 0x321, key, &sr);
    fy_membership_params_t pw = params_for(e.url, "decode", "w0", 0, key, &sw);
    pr.tls = tc_etcd_tls_of(certs, "ferry-router");
    pw.tls = tc_etcd_tls_of(certs, "ferry-worker");
    assert_int_equal(fy_etcd_tls_check(&pr.tls, e.url), FY_OK);
    fy_membership_t *mr, *mw;
    assert_int_equal(fy_membership_start(&pr, &mr), FY_OK);
    assert_int_equal(fy_membership_start(&pw, &mw), FY_OK);
    double t0 = fy_now_s();
    while (!(seen_has(&sr, "w0") && seen_has(&sw, "r0")) && fy_now_s() - t0 < 10) usleep(20000);
    assert_true(seen_has(&sr, "w0"));
    assert_true(seen_has(&sw, "r0"));
    assert_true(fy_membership_registered(mr) && fy_membership_registered(mw));

    /* the ones etcd refuses: each read and write of /ferry/ fails */
    struct {
        const char *what;
        fy_etcd_tls_t tls;
        bool with_tls;
    } bad[] = {
        {"no client certificate", tc_etcd_tls_of(certs, NULL), true},
        {"a certificate of another CA", tc_etcd_tls_of(other, "ferry-router"), true},
        {"the system's CAs", {.ca = ""}, false},
    };
    /* another CA's certificate, presented with the right CA for the server */
    snprintf(bad[1].tls.ca, sizeof(bad[1].tls.ca), "%s/ca.pem", certs);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        fy_etcd_t *c;
        assert_int_equal(fy_etcd_create_tls(e.url, bad[i].with_tls ? &bad[i].tls : NULL, 1.0, &c), FY_OK);
        fy_etcd_kvs_t k = {0};
        fy_status_t rd = fy_etcd_range_prefix(c, "/ferry/", &k);
        fy_etcd_kvs_free(&k);
        fy_status_t wr = fy_etcd_put(c, "/ferry/m/routers/r0", "{}", 2, 0);
        fy_status_t del = fy_etcd_delete(c, "/ferry/m/workers/decode/w0");
        print_message("%s: read %s, write %s (%s)\n", bad[i].what, fy_status_str(rd), fy_status_str(wr),
                      fy_etcd_last_error(c));
        if (rd != FY_ERR_PEER || wr != FY_ERR_PEER || del != FY_ERR_PEER)
            fail_msg("%s: read %s, write %s, delete %s: etcd let it in", bad[i].what, fy_status_str(rd),
                     fy_status_str(wr), fy_status_str(del));
        fy_etcd_destroy(c);
    }
    /* and nothing of theirs landed: both records are still there, signed,
     * in lists both threads made after those attempts */
    int rr = seen_rounds(&sr), rw = seen_rounds(&sw);
    for (double t1 = fy_now_s(); seen_rounds(&sr) < rr + 2 || seen_rounds(&sw) < rw + 2; usleep(10000))
        if (fy_now_s() - t1 > 5) fail_msg("the membership threads did not list again within 5 s");
    assert_true(seen_has(&sr, "w0"));
    assert_true(seen_has(&sw, "r0"));
    assert_int_equal(fy_membership_refused(mr), 0);
    assert_int_equal(fy_membership_refused(mw), 0);
    fy_membership_stop(mw);
    fy_membership_stop(mr);
    tc_etcd_kill(&e);
}

static void post_ok(fy_etcd_t *c, const char *path, const char *json)
{
    if (fy_etcd_post(c, path, json) != FY_OK) fail_msg("%s %s: %s", path, json, fy_etcd_last_error(c));
}

/* etcd's RBAC on top of the certificates (cluster.etcd_user,
 * etcd_password_file): users ferry-router and ferry-worker hold
 * readwrite on /ferry/m/ alone.  They list each other; a client with a
 * certificate but no user (etcd's gateway takes no user from a
 * certificate once auth is on), a wrong password, or a user writing
 * outside /ferry/m/ is refused. */
static void test_rbac(void **state)
{
    if (!tc_etcd_available()) skip();
    char certs[300];
    snprintf(certs, sizeof(certs), "%s/pki", fy_test_tmpdir());
    static const char *const names[] = {"root", "ferry-router", "ferry-worker"};
    tc_etcd_certs(certs, names, 3);
    tc_etcd_t e;
    tc_etcd_start_tls(&e, fy_test_tmpdir(), certs);
    fy_etcd_tls_t admin = tc_etcd_tls_of(certs, "root");
    fy_etcd_t *c;
    assert_int_equal(fy_etcd_create_tls(e.url, &admin, 1.0, &c), FY_OK);
    post_ok(c, "/v3/auth/user/add", "{\"name\":\"root\",\"password\":\"root-pass-0123456789\"}");
    post_ok(c, "/v3/auth/user/grant", "{\"user\":\"root\",\"role\":\"root\"}");
    post_ok(c, "/v3/auth/role/add", "{\"name\":\"ferry-m\"}");
    /* /ferry/m/ up to /ferry/m0 ('/' + 1): the prefix (base64) */
    post_ok(c, "/v3/auth/role/grant",
            "{\"name\":\"ferry-m\",\"perm\":{\"permType\":\"READWRITE\",\"key\":\"L2ZlcnJ5L20v\","
            "\"range_end\":\"L2ZlcnJ5L20w\"}}");
    for (int i = 1; i < 3; i++) {
        char json[256];
        snprintf(json, sizeof(json), "{\"name\":\"%s\",\"password\":\"%s-pass-0123456789\"}", names[i], names[i]);
        post_ok(c, "/v3/auth/user/add", json);
        snprintf(json, sizeof(json), "{\"user\":\"%s\",\"role\":\"ferry-m\"}", names[i]);
        post_ok(c, "/v3/auth/user/grant", json);
    }
    post_ok(c, "/v3/auth/enable", "{}");
    /* now the certificate alone is no user */
    fy_etcd_kvs_t k = {0};
    assert_int_not_equal(fy_etcd_range_prefix(c, "/ferry/", &k), FY_OK);
    print_message("a certificate without a user: %s\n", fy_etcd_last_error(c));
    assert_int_not_equal(fy_etcd_put(c, "/ferry/m/routers/x", "{}", 2, 0), FY_OK);
    fy_etcd_destroy(c);

    uint8_t secret[32], key[FY_MEMBER_KEY_BYTES];
    memset(secret, 6, sizeof(secret));
    assert_int_equal(fy_member_key(secret, sizeof(secret), key), FY_OK);
    seen_t sr = {.mu = PTHREAD_MUTEX_INITIALIZER}, sw = {.mu = PTHREAD_MUTEX_INITIALIZER};
    fy_membership_params_t pr = params_for(e.url, "router", "r0", 0x231, key, &sr);
    fy_membership_params_t pw = params_for(e.url, "decode", "w0", 0, key, &sw);
    pr.tls = tc_etcd_tls_of(certs, "ferry-router");
    pw.tls = tc_etcd_tls_of(certs, "ferry-worker");
    snprintf(pr.tls.user, sizeof(pr.tls.user), "ferry-router");
    snprintf(pr.tls.password, sizeof(pr.tls.password), "ferry-router-pass-0123456789");
    snprintf(pw.tls.user, sizeof(pw.tls.user), "ferry-worker");
    snprintf(pw.tls.password, sizeof(pw.tls.password), "ferry-worker-pass-0123456789");
    fy_membership_t *mr, *mw;
    assert_int_equal(fy_membership_start(&pr, &mr), FY_OK);
    assert_int_equal(fy_membership_start(&pw, &mw), FY_OK);
    double t0 = fy_now_s();
    while (!(seen_has(&sr, "w0") && seen_has(&sw, "r0")) && fy_now_s() - t0 < 10) usleep(20000);
    assert_true(seen_has(&sr, "w0"));
    assert_true(seen_has(&sw, "r0"));

    /* the router's user: in /ferry/m/ yes, elsewhere no */
    assert_int_equal(fy_etcd_create_tls(e.url, &pr.tls, 1.0, &c), FY_OK);
    assert_int_equal(fy_etcd_range_prefix(c, "/ferry/m/", &k), FY_OK);
    assert_true(k.n >= 2);
    fy_etcd_kvs_free(&k);
    assert_int_equal(fy_etcd_put(c, "/ferry/other/routers/x", "{}", 2, 0), FY_ERR_PEER);
    print_message("outside its prefix: %s\n", fy_etcd_last_error(c));
    assert_non_null(strstr(fy_etcd_last_error(c), "permission denied"));
    assert_int_equal(fy_etcd_range_prefix(c, "/", &k), FY_ERR_PEER);
    fy_etcd_destroy(c);
    /* tokens expire (etcd restarts, --auth-token-ttl): a client fetches a new
     * one on the 401.  auth off and on again drops every token etcd gave */
    fy_etcd_t *rc;
    assert_int_equal(fy_etcd_create_tls(e.url, &pr.tls, 1.0, &rc), FY_OK);
    assert_int_equal(fy_etcd_range_prefix(rc, "/ferry/m/", &k), FY_OK); /* it holds a token now */
    fy_etcd_kvs_free(&k);
    fy_etcd_tls_t root = admin;
    snprintf(root.user, sizeof(root.user), "root");
    snprintf(root.password, sizeof(root.password), "root-pass-0123456789");
    assert_int_equal(fy_etcd_create_tls(e.url, &root, 1.0, &c), FY_OK);
    post_ok(c, "/v3/auth/disable", "{}");
    fy_etcd_destroy(c);
    assert_int_equal(fy_etcd_create_tls(e.url, &admin, 1.0, &c), FY_OK);
    post_ok(c, "/v3/auth/enable", "{}");
    fy_etcd_destroy(c);
    if (fy_etcd_range_prefix(rc, "/ferry/m/", &k) != FY_OK)
        fail_msg("after the token was dropped: %s", fy_etcd_last_error(rc));
    assert_true(k.n >= 2);
    fy_etcd_kvs_free(&k);
    fy_etcd_destroy(rc);
    /* a wrong password */
    fy_etcd_tls_t wrong = pr.tls;
    snprintf(wrong.password, sizeof(wrong.password), "not-the-password-0123");
    assert_int_equal(fy_etcd_create_tls(e.url, &wrong, 1.0, &c), FY_OK);
    assert_int_not_equal(fy_etcd_range_prefix(c, "/ferry/m/", &k), FY_OK);
    print_message("a wrong password: %s\n", fy_etcd_last_error(c));
    fy_etcd_destroy(c);
    fy_membership_stop(mw);
    fy_membership_stop(mr);
    tc_etcd_kill(&e);
}

/* The refusals at start, each naming its key. */
static void test_tls_config(void **state)
{
    const char *d = fy_test_tmpdir();
    char certs[300], path[400];
    snprintf(certs, sizeof(certs), "%s/pki", d);
    static const char *const names[] = {"ferry-router"};
    tc_etcd_certs(certs, names, 1);
    const char *https = "https://127.0.0.1:2379", *http = "http://127.0.0.1:2379";
    fy_etcd_tls_t ok = tc_etcd_tls_of(certs, "ferry-router");
    assert_int_equal(fy_etcd_tls_check(&ok, https), FY_OK);
    fy_etcd_tls_t none = {.ca = ""};
    assert_int_equal(fy_etcd_tls_check(&none, http), FY_OK); /* today's default */
    assert_int_equal(fy_etcd_tls_check(&none, "127.0.0.1:2379"), FY_OK);

    typedef struct {
        const char *why;
        fy_etcd_tls_t t;
        const char *endpoints;
        fy_status_t st;
        const char *key, *says;
    } tls_case_t;
    tls_case_t cases[12];
    int n = 0;
    cases[n] = (tls_case_t){"https without a CA", none, https, FY_ERR_INVALID, "cluster.etcd_ca", "https"};
    n++;
    cases[n] = (tls_case_t){"cert without key", ok, https, FY_ERR_INVALID, "cluster.etcd_key", "needs both"};
    cases[n].t.key[0] = 0;
    n++;
    cases[n] = (tls_case_t){"key without cert", ok, https, FY_ERR_INVALID, "cluster.etcd_key", "needs both"};
    cases[n].t.cert[0] = 0;
    n++;
    cases[n] = (tls_case_t){"certificate over http", ok, http, FY_ERR_INVALID, "cluster.etcd_cert", "http"};
    n++;
    cases[n] = (tls_case_t){"missing CA file", ok, https, FY_ERR_NOT_FOUND, "cluster.etcd_ca", "cannot open"};
    snprintf(cases[n].t.ca, sizeof(cases[n].t.ca), "%s/nope.pem", certs);
    n++;
    cases[n] = (tls_case_t){"key readable by others", ok, https, FY_ERR_INVALID, "cluster.etcd_key", "0644"};
    snprintf(path, sizeof(path), "%s/open.key", certs);
    {
        char *pem = fy_test_read_file(ok.key, NULL);
        assert_non_null(pem);
        assert_true(fy_test_write_file(path, pem, strlen(pem)));
        fy_free(pem);
        assert_int_equal(chmod(path, 0644), 0);
    }
    snprintf(cases[n].t.key, sizeof(cases[n].t.key), "%s", path);
    n++;
    cases[n] = (tls_case_t){"a FIFO as the key", ok, https, FY_ERR_INVALID, "cluster.etcd_key", "regular"};
    char fifo[400];
    snprintf(fifo, sizeof(fifo), "%s/fifo.key", certs);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    snprintf(cases[n].t.key, sizeof(cases[n].t.key), "%s", fifo);
    n++;
    cases[n] = (tls_case_t){"a directory as the CA", ok, https, FY_ERR_INVALID, "cluster.etcd_ca", "regular"};
    snprintf(cases[n].t.ca, sizeof(cases[n].t.ca), "%s", certs);
    n++;
    cases[n] = (tls_case_t){"a user without a password",  ok,          https, FY_ERR_INVALID,
                            "cluster.etcd_password_file", "needs both"};
    snprintf(cases[n].t.user, sizeof(cases[n].t.user), "ferry-router");
    n++;
    cases[n] =
        (tls_case_t){"a password over http", none, http, FY_ERR_INVALID, "cluster.etcd_password_file", "in the clear"};
    snprintf(cases[n].t.user, sizeof(cases[n].t.user), "ferry-router");
    snprintf(cases[n].t.password, sizeof(cases[n].t.password), "0123456789abcdef");
    n++;
    cases[n] =
        (tls_case_t){"a quote in the password", ok, https, FY_ERR_FORMAT, "cluster.etcd_password_file", "printable"};
    snprintf(cases[n].t.user, sizeof(cases[n].t.user), "ferry-router");
    snprintf(cases[n].t.password, sizeof(cases[n].t.password), "0123456789\"abcdef");
    n++;
    for (int i = 0; i < n; i++) {
        fy_test_log_begin();
        fy_status_t st = fy_etcd_tls_check(&cases[i].t, cases[i].endpoints);
        fy_test_log_end();
        if (st != cases[i].st || !fy_test_log_has(cases[i].key, cases[i].says, NULL))
            fail_msg("%s: %s, log '%s' (wanted %s naming %s, '%s')", cases[i].why, fy_status_str(st),
                     fy_test_log_text(), fy_status_str(cases[i].st), cases[i].key, cases[i].says);
    }
}

static int teardown(void **state)
{
    fy_test_tmpdir_remove();
    return 0;
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_range),
        cmocka_unit_test(test_parse_lease),
        cmocka_unit_test(test_member_record),
        cmocka_unit_test(test_member_signed),
        cmocka_unit_test(test_membership_from_config),
        cmocka_unit_test_teardown(test_client, teardown),
        cmocka_unit_test_teardown(test_membership_attacks, teardown),
        cmocka_unit_test_teardown(test_two_routers, teardown),
        cmocka_unit_test_teardown(test_tls, teardown),
        cmocka_unit_test_teardown(test_tls_config, teardown),
        cmocka_unit_test_teardown(test_rbac, teardown),
    };
    const char *only = getenv("FY_TEST_FILTER");
    if (only) cmocka_set_test_filter(only);
    return cmocka_run_group_tests(tests, NULL, NULL);
}

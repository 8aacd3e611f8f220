/*
 * test_etcd.c - membership through etcd (cluster.etcd, rpc/etcd.h): the
 * parsers of the gateway's answers and of the registration record on good
 * and bad input; the client against a real etcd the test starts on
 * loopback ports (and against none: the failure is a status, not a
 * crash); and a cluster of 2 routers, 2 prefill and 2 decode workers
 * that find each other there: one router killed with SIGKILL under load
 * (the other's requests go on without an error, the dead one's end at the
 * workers and every block comes back), a decode worker killed and
 * restarted (it rejoins), etcd stopped for 10 s (serving goes on; the
 * registrations come back with it), and records that are malformed or
 * for another model or KV layout, refused by name.
 *
 * Tests that need etcd skip with a message where etcd-server is not
 * installed (`make deps` installs it).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "cluster_util.h"
#include "etcd.h"
#include "mem.h"
#include "testutil.h"

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
        {"v", "2", "record version 2"},
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
    double t0 = tc_now();
    assert_int_equal(fy_etcd_range_prefix(c, "/ferry/", &k), FY_ERR_PEER);
    assert_int_equal(fy_etcd_grant(c, 5, &lease), FY_ERR_PEER);
    print_message("etcd down: %s\n", fy_etcd_last_error(c));
    assert_non_null(strstr(fy_etcd_last_error(c), "127.0.0.1"));
    assert_true(tc_now() - t0 < 5);
    fy_etcd_destroy(c);
    assert_int_equal(fy_etcd_create(" , ", 1.0, &c), FY_ERR_INVALID);
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
    double t0 = tc_now();
    for (;;) {
        fy_client_status_t s;
        if (fy_client_status(cl, &s) == FY_OK && s.prefill_up == np && s.decode_up == nd) return tc_now() - t0;
        if (tc_now() - t0 > timeout_s) {
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
    double t0 = tc_now();
    while (!log_has(c, proc, what)) {
        if (tc_now() - t0 > timeout_s) {
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
    double t_start = tc_now();
    tc_start(&c, &o);
    fy_client_t *c1;
    assert_int_equal(fy_client_create(c.router_urls[1], c.secret, 5.0, &c1), FY_OK);
    wait_up(&c, c1, 2, 2, 30);
    print_message("2 routers, 2 prefill, 2 decode workers up through etcd in %.2f s\n", tc_now() - t_start);
    int32_t adm0[2];
    admittable(c1, adm0);

    /* records the routers must refuse, each by name */
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
    assert_int_equal(fy_member_write(&m, &json, &len), FY_OK);
    assert_int_equal(fy_etcd_put(ec, "/ferry/t/workers/decode/other", json, len, 0), FY_OK);
    fy_free(json);
    m = real;
    snprintf(m.name, sizeof(m.name), "skewed");
    m.layout ^= 1;
    assert_int_equal(fy_member_write(&m, &json, &len), FY_OK);
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
    double t0 = tc_now();
    while (seen < 4 && tc_now() - t0 < 60) {
        fy_client_update_t u;
        assert_int_equal(fy_client_poll(c.client, &s0[0], 0.5, &u), FY_OK);
        seen += u.n_tokens;
    }
    assert_true(seen >= 4);
    double t_kill = tc_now();
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
            t_back = tc_now() - t_kill;
            break;
        }
        if (tc_now() - t_kill > 15) {
            tc_print_logs(&c);
            fail_msg("decode pools at %d and %d blocks, %d and %d before", adm[0], adm[1], adm0[0], adm0[1]);
        }
        usleep(20000);
    }
    print_message("router killed: its requests ended at the workers and their blocks were back in %.2f s "
                  "(cluster.etcd_ttl 2 s)\n",
                  t_back);
    wait_log(&c, "decode-0", "its router is gone", 5);
    assert_true(t_back < 2.0 + 0.5 + 2.5);

    /* a decode worker killed is dropped; restarted, it rejoins */
    tc_kill(&c, "decode-1");
    wait_up(&c, c1, 2, 1, 10);
    double t_restart = tc_now();
    tc_restart(&c, "decode-1");
    double t_join = wait_up(&c, c1, 2, 2, 60);
    print_message("decode-1 restarted: placed on again %.2f s after its start\n", tc_now() - t_restart);
    (void)t_join;
    fy_client_stream_t s = submit(c1, p[0], 48, 8);
    tc_result_t r = {0};
    collect_on(&c, c1, &s, &r, 1, 60);
    assert_int_equal(r.error, FY_OK);

    /* etcd away for 10 s: serving goes on on the last known membership */
    tc_etcd_kill(&e);
    double t_down = tc_now();
    int served = 0;
    while (tc_now() - t_down < 10) {
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
    double t_up = tc_now();
    for (;;) {
        assert_int_equal(fy_etcd_range_prefix(ec, "/ferry/t/", &k), FY_OK);
        int n = k.n;
        fy_etcd_kvs_free(&k);
        if (n == 5) break; /* router-1 and 4 workers */
        if (tc_now() - t_up > 15) {
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

    /* router-1 stopped past its lease: the workers drop its requests, and
     * when it runs again it ends them with an error, registers anew and
     * serves */
    pid_t r1pid = 0;
    for (int i = 0; i < c.n_procs; i++)
        if (!strcmp(c.procs[i].name, "router-1")) r1pid = c.procs[i].pid;
    assert_true(r1pid > 0);
    s = submit(c1, p[2], 48, 1500);
    memset(&r, 0, sizeof(r));
    for (int32_t got = 0; got < 2;) {
        fy_client_update_t u;
        assert_int_equal(fy_client_poll(c1, &s, 0.5, &u), FY_OK);
        got += u.n_tokens;
    }
    assert_int_equal(kill(r1pid, SIGSTOP), 0);
    wait_log(&c, "decode-0", "router router-1 is gone", 10);
    assert_int_equal(kill(r1pid, SIGCONT), 0);
    collect_on(&c, c1, &s, &r, 1, 30);
    /* whichever it noticed first: its workers silent past router.health_timeout, or its lease gone */
    if (r.error != FY_ERR_PEER) fail_msg("the request through the stopped router: %s", r.message);
    print_message("router-1 stopped 3+ s: its request ended with '%s'\n", r.message);
    wait_log(&c, "router-1", "expired; registering /ferry/t/routers/router-1 again", 5);
    wait_up(&c, c1, 2, 2, 10);
    s = submit(c1, p[3], 48, 8);
    memset(&r, 0, sizeof(r));
    collect_on(&c, c1, &s, &r, 1, 60);
    if (r.error) {
        tc_print_logs(&c);
        fail_msg("after re-registering: %s", r.message);
    }
    double t_pools = tc_now();
    for (int32_t adm[2] = {-1, -1}; adm[0] != adm0[0] || adm[1] != adm0[1];) { /* no block leaked */
        admittable(c1, adm);
        if (tc_now() - t_pools > 10)
            fail_msg("decode pools at %d and %d blocks, %d and %d at the start", adm[0], adm[1], adm0[0], adm0[1]);
        usleep(20000);
    }
    fy_etcd_destroy(ec);
    fy_client_destroy(c1);
    tc_stop(&c);
    tc_etcd_kill(&e);
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
        cmocka_unit_test_teardown(test_client, teardown),
        cmocka_unit_test_teardown(test_two_routers, teardown),
    };
    const char *only = getenv("FY_TEST_FILTER");
    if (only) cmocka_set_test_filter(only);
    return cmocka_run_group_tests(tests, NULL, NULL);
}

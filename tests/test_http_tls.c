/*
 * test_http_tls.c - the router's OpenAI API behind TLS (router.tls_cert,
 * tls_key): a cluster of real processes (a router and one decode worker)
 * whose router.http is https://127.0.0.1:PORT, with a CA and a
 * certificate for 127.0.0.1 made at test time by the openssl CLI (no
 * private key is committed):
 *
 *   - a completion and a streamed completion with libcurl, verified
 *     against the CA: the events arrive one by one (several writes), the
 *     streamed text equals the whole answer's;
 *   - the `openai` Python package over https (tests/openai_tls_check.py):
 *     a completion, a streamed chat; without the CA it refuses the server;
 *   - plain HTTP to the port: no HTTP answer, the connection closed, and
 *     the router serves the next client;
 *   - ferry-router refuses to start with a key file that is missing, or
 *     readable by its group, naming router.tls_key, and with https:// and
 *     no certificate naming router.tls_cert; ferry serve refuses an open
 *     key before it starts anything;
 *   - ferry-bench loads the https door with --cacert (and is refused
 *     without it).
 */
#include <arpa/inet.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "common/clock.h"
#include "tests/cluster_util.h"
#include "common/mem.h"
#include "tests/testutil.h"

static tc_cluster_t C;
static int PORT;
static char URL[64], CA[600], CERT[600], KEY[600];

static int setup(void **state)
{
    (void)state;
    if (!tc_available()) return 0;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    char certs[560];
    snprintf(certs, sizeof(certs), "%s/pki", fy_test_tmpdir());
    tc_etcd_certs(certs, NULL, 0); /* ca.pem; server.pem, server.key for IP 127.0.0.1 */
    snprintf(CA, sizeof(CA), "%s/ca.pem", certs);
    snprintf(CERT, sizeof(CERT), "%s/server.pem", certs);
    snprintf(KEY, sizeof(KEY), "%s/server.key", certs);
    PORT = tc_free_port();
    snprintf(URL, sizeof(URL), "https://127.0.0.1:%d", PORT);
    static char http[128], cert[640], key[640];
    snprintf(http, sizeof(http), "router.http=%s", URL);
    snprintf(cert, sizeof(cert), "router.tls_cert=%s", CERT);
    snprintf(key, sizeof(key), "router.tls_key=%s", KEY);
    tc_opts_t o = {.n_prefill = 0, .n_decode = 1, .common = {http, cert, key, "decode.kv_mem=64MiB"}};
    tc_start(&C, &o);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (C.n_procs) tc_stop(&C);
    curl_global_cleanup();
    fy_test_tmpdir_remove();
    return 0;
}

typedef struct got {
    char *buf;
    size_t len, cap;
    int writes;
} got_t;

static size_t on_data(char *p, size_t sz, size_t n, void *arg)
{
    got_t *g = arg;
    size_t k = sz * n;
    if (g->len + k + 1 > g->cap) {
        g->cap = (g->len + k + 1) * 2;
        g->buf = realloc(g->buf, g->cap);
    }
    memcpy(g->buf + g->len, p, k);
    g->len += k;
    g->buf[g->len] = 0;
    g->writes++;
    return k;
}

/* POST body to URL+path over https, verified against CA: the status and the body */
static long post(const char *path, const char *body, got_t *g)
{
    char u[128];
    snprintf(u, sizeof(u), "%s%s", URL, path);
    *g = (got_t){0};
    CURL *h = curl_easy_init();
    struct curl_slist *hd = curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_setopt(h, CURLOPT_URL, u);
    curl_easy_setopt(h, CURLOPT_NOPROXY, "*");
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 120000L);
    curl_easy_setopt(h, CURLOPT_CAINFO, CA);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, g);
    CURLcode cc = curl_easy_perform(h);
    if (cc != CURLE_OK) fail_msg("POST %s: %s", u, curl_easy_strerror(cc));
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(hd);
    curl_easy_cleanup(h);
    return status;
}

static void test_curl_https(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    got_t g;
    assert_int_equal(
        post("/v1/completions", "{\"prompt\": \"Once upon a time\", \"max_tokens\": 6, \"temperature\": 0}", &g), 200);
    json_error_t e;
    json_t *j = json_loads(g.buf, 0, &e);
    assert_non_null(j);
    const char *text = json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text"));
    assert_non_null(text);
    got_t s;
    assert_int_equal(post("/v1/completions",
                          "{\"prompt\": \"Once upon a time\", \"max_tokens\": 6, \"temperature\": 0, \"stream\": true}",
                          &s),
                     200);
    char joined[1024] = "";
    size_t k = 0;
    int events = 0;
    for (char *p = s.buf; (p = strstr(p, "data: {")); p += 6) {
        json_t *c = json_loadb(p + 6, strcspn(p + 6, "\n"), 0, &e);
        assert_non_null(c);
        const char *t = json_string_value(json_object_get(json_array_get(json_object_get(c, "choices"), 0), "text"));
        if (t) k += (size_t)snprintf(joined + k, sizeof(joined) - k, "%s", t);
        json_decref(c);
        events++;
    }
    assert_non_null(strstr(s.buf, "data: [DONE]"));
    assert_string_equal(joined, text);
    /* events went out as they were made: curl was handed them in several reads */
    print_message("streamed over TLS: %d events in %d reads\n", events, s.writes);
    assert_true(events >= 2 && s.writes >= 2);
    json_decref(j);
    free(g.buf);
    free(s.buf);
}

static void test_openai_python_https(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    const char *venv = getenv("FERRY_OPENAI_VENV") ? getenv("FERRY_OPENAI_VENV") : "build/openai-venv";
    char cmd[2048];
    snprintf(cmd, sizeof(cmd),
             "[ -x %s/bin/python ] && %s/bin/python -c 'import openai' 2>/dev/null || "
             "{ python3 -m venv %s && %s/bin/pip install -q openai; } >/dev/null 2>&1",
             venv, venv, venv, venv);
    if (system(cmd) != 0) {
        print_message("the openai package cannot be installed here (no PyPI?): skipped\n");
        skip();
    }
    snprintf(cmd, sizeof(cmd), "%s/bin/python tests/openai_tls_check.py %s/v1 %s any-key", venv, URL, CA);
    assert_int_equal(system(cmd), 0);
}

/* plain HTTP to the TLS port: no HTTP answer, closed at once; the router goes on */
static void test_plain_http_refused(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {
        .sin_family = AF_INET, .sin_port = htons((uint16_t)PORT), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    const char req[] = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    assert_int_equal(send(fd, req, sizeof(req) - 1, MSG_NOSIGNAL), (ssize_t)(sizeof(req) - 1));
    char buf[4096];
    size_t len = 0;
    double t0 = fy_now_s();
    bool closed = false;
    while (!closed && fy_now_s() - t0 < 5) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0) continue;
        ssize_t n = recv(fd, buf + len, sizeof(buf) - 1 - len, 0);
        if (n <= 0)
            closed = true;
        else
            len += (size_t)n;
    }
    close(fd);
    assert_true(closed);
    assert_null(memmem(buf, len, "HTTP/1.", 7));
    got_t g;
    assert_int_equal(post("/tokenize", "{\"prompt\": \"still serving\"}", &g), 200);
    free(g.buf);
}

/* ferry-router with extra settings: its exit status; its output in out */
static int router_run(const char *set1, const char *set2, char *out, size_t cap)
{
    char cmd[4096], log[640];
    snprintf(log, sizeof(log), "%s/refused.log", C.dir);
    snprintf(cmd, sizeof(cmd),
             "timeout 60 %s/ferry-router -c %s --set router.listen=ipc://%s/r2 --set router.events=ipc://%s/e2 "
             "--set router.http=https://127.0.0.1:%d --set '%s' --set '%s' >%s 2>&1",
             getenv("FERRY_BIN") ? getenv("FERRY_BIN") : "bin", C.conf, C.dir, C.dir, tc_free_port(), set1, set2, log);
    int rc = system(cmd);
    size_t n = 0;
    char *t = fy_test_read_file(log, &n);
    snprintf(out, cap, "%s", t ? t : "");
    fy_free(t);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void test_router_refuses_bad_tls(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    char out[8192], s1[700], s2[700];
    snprintf(s1, sizeof(s1), "router.tls_cert=%s", CERT);
    snprintf(s2, sizeof(s2), "router.tls_key=%s/none.key", C.dir);
    int rc = router_run(s1, s2, out, sizeof(out));
    print_message("missing key: exit %d\n", rc);
    assert_true(rc != 0 && rc != 124);
    if (!strstr(out, "router.tls_key") || !strstr(out, "none.key")) fail_msg("no router.tls_key in:\n%s", out);
    /* a copy of the key its group can read */
    char open_key[640];
    snprintf(open_key, sizeof(open_key), "%s/open.key", C.dir);
    size_t n;
    char *k = fy_test_read_file(KEY, &n);
    assert_true(fy_test_write_file(open_key, k, n));
    fy_free(k);
    chmod(open_key, 0644);
    snprintf(s2, sizeof(s2), "router.tls_key=%s", open_key);
    rc = router_run(s1, s2, out, sizeof(out));
    assert_true(rc != 0 && rc != 124);
    if (!strstr(out, "router.tls_key") || !strstr(out, "mode 0644")) fail_msg("no router.tls_key in:\n%s", out);
    /* https:// without a certificate */
    rc = router_run("router.tls_cert=", "router.tls_key=", out, sizeof(out));
    assert_true(rc != 0 && rc != 124);
    if (!strstr(out, "router.tls_cert")) fail_msg("no router.tls_cert in:\n%s", out);
}

/* ferry-bench loads the https door with --cacert; without it the router is not trusted */
static void test_bench_https(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    const char *bin = getenv("FERRY_BIN") ? getenv("FERRY_BIN") : "bin";
    char cmd[2048], json[640];
    snprintf(json, sizeof(json), "%s/bench.json", C.dir);
    snprintf(cmd, sizeof(cmd),
             "timeout 120 %s/ferry-bench --backend http --url %s --cacert %s -n 6 -C 3 --input-len 8 --output-len 4 "
             "--no-progress --json %s >%s/bench.out 2>&1",
             bin, URL, CA, json, C.dir);
    assert_int_equal(system(cmd), 0);
    json_error_t e;
    json_t *j = json_load_file(json, 0, &e);
    if (!j) fail_msg("%s: %s", json, e.text);
    char *dump = json_dumps(j, JSON_COMPACT);
    /* every request completed, none failed */
    if (!strstr(dump, "\"n_ok\":6") || !strstr(dump, "\"n_failed\":0")) fail_msg("ferry-bench's report: %.2000s", dump);
    free(dump);
    json_decref(j);
    snprintf(cmd, sizeof(cmd),
             "timeout 120 %s/ferry-bench --backend http --url %s -n 2 --input-len 8 --output-len 4 --no-progress "
             "--json %s >%s/bench.out 2>&1",
             bin, URL, json, C.dir);
    unlink(json);
    int rc = system(cmd);
    j = json_load_file(json, 0, &e);
    assert_true(rc != 0 || j); /* refused at once, or a report of failures */
    if (j) {
        dump = json_dumps(j, JSON_COMPACT);
        if (!strstr(dump, "\"n_ok\":0")) fail_msg("served without the CA: %.2000s", dump);
        free(dump);
        json_decref(j);
    }
}

/* ferry serve refuses a key its group can read before it starts anything */
static void test_serve_refuses_open_key(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    char open_key[640], cmd[4096], out[640];
    snprintf(open_key, sizeof(open_key), "%s/serve-open.key", C.dir);
    size_t n;
    char *k = fy_test_read_file(KEY, &n);
    assert_true(fy_test_write_file(open_key, k, n));
    fy_free(k);
    chmod(open_key, 0640);
    snprintf(out, sizeof(out), "%s/serve.out", C.dir);
    snprintf(cmd, sizeof(cmd),
             "timeout 60 %s/ferry serve -c %s --set serve.run_dir=%s/serve-run --set router.tls_cert=%s "
             "--set router.tls_key=%s >%s 2>&1",
             getenv("FERRY_BIN") ? getenv("FERRY_BIN") : "bin", C.conf, C.dir, CERT, open_key, out);
    int rc = system(cmd);
    char *t = fy_test_read_file(out, &n);
    assert_non_null(t);
    if (!WIFEXITED(rc) || WEXITSTATUS(rc) == 0 || WEXITSTATUS(rc) == 124 || !strstr(t, "router.tls_key") ||
        !strstr(t, "mode 0640"))
        fail_msg("ferry serve with an open key: status %d:\n%s", rc, t);
    fy_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_curl_https),         cmocka_unit_test(test_openai_python_https),
        cmocka_unit_test(test_plain_http_refused), cmocka_unit_test(test_router_refuses_bad_tls),
        cmocka_unit_test(test_bench_https),        cmocka_unit_test(test_serve_refuses_open_key),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

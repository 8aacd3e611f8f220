/*
 * test_https.c - the HTTP server (rpc/httpd.h) with TLS, on loopback,
 * with a CA and a server certificate made at test time by the openssl
 * CLI (tc_etcd_certs: no private key is committed).  libcurl (OpenSSL)
 * is the client, libmicrohttpd (GnuTLS) the server:
 *
 *   - a whole answer and a kept-alive second request on the same
 *     connection, verified against the CA; a client without the CA
 *     refuses the server, one asking for TLS 1.3 alone is served;
 *   - a streamed answer whose chunks arrive as they are written (each
 *     one flushed through TLS, not held until the end); a client that
 *     leaves while its answer waits is noticed at once;
 *   - plain HTTP to the TLS port: no HTTP answer, the connection closed,
 *     and the server serves the next client;
 *   - a client that opens TCP and never finishes its handshake (nothing
 *     sent, or half a ClientHello) is closed at the header timeout; at
 *     the connection cap such connections make room for a newcomer;
 *   - router.tls_min_version 1.3 refuses a TLS 1.2 client;
 *   - the keys refused at start, each naming itself: a missing key file,
 *     one its group can read, a file that is no PEM key, a key that is
 *     not the certificate's, a certificate without a key, https:// with
 *     no certificate.
 */
#include <arpa/inet.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/config.h"
#include "common/clock.h"
#include "common/cluster.h"
#include "tests/cluster_util.h"
#include "rpc/httpd.h"
#include "common/mem.h"
#include "tests/testutil.h"

static char g_certs[512];
static char g_other_ca[600]; /* another deployment's CA */

static const char *cert_path(const char *name)
{
    static char b[4][600];
    static int i;
    char *p = b[i++ % 4];
    snprintf(p, sizeof(b[0]), "%s/%s", g_certs, name);
    return p;
}

static int setup(void **state)
{
    (void)state;
    snprintf(g_certs, sizeof(g_certs), "%s/pki", fy_test_tmpdir());
    tc_etcd_certs(g_certs, NULL, 0); /* ca.pem; server.pem and server.key for IP 127.0.0.1 */
    char other[560];
    snprintf(other, sizeof(other), "%s/other", fy_test_tmpdir());
    tc_etcd_certs(other, NULL, 0);
    snprintf(g_other_ca, sizeof(g_other_ca), "%s/ca.pem", other);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    curl_global_cleanup();
    fy_test_tmpdir_remove();
    return 0;
}

/* ---- the server ---- */

typedef struct streamer {
    fy_httpd_req_t *r;
    pthread_t th;
} streamer_t;

static streamer_t g_st;
static atomic_int g_ended;

static atomic_int g_gone, g_held;
static fy_httpd_req_t *g_held_r;

static void on_end(void *arg, bool complete)
{
    (void)arg;
    if (!complete) atomic_fetch_add(&g_gone, 1);
    atomic_fetch_add(&g_ended, 1);
}

/* three SSE events 400 ms apart, from another thread */
static void *stream_main(void *arg)
{
    streamer_t *s = arg;
    assert_int_equal(fy_httpd_stream_begin(s->r, 200, "text/event-stream", NULL), FY_OK);
    for (int i = 0; i < 3; i++) {
        char ev[64];
        int n = snprintf(ev, sizeof(ev), "data: chunk %d\n\n", i);
        assert_int_equal(fy_httpd_stream_write(s->r, ev, (size_t)n), FY_OK);
        usleep(400000);
    }
    fy_httpd_stream_end(s->r);
    return NULL;
}

static void on_post(void *arg, fy_httpd_req_t *r)
{
    if (!strcmp(arg, "echo")) {
        size_t len;
        const char *b = fy_httpd_req_body(r, &len);
        fy_httpd_answer(r, 200, "text/plain", NULL, b, len);
        return;
    }
    fy_httpd_hold(r, on_end, NULL);
    if (!strcmp(arg, "hold")) { /* never answered: the client leaves */
        g_held_r = r;
        atomic_fetch_add(&g_held, 1);
        return;
    }
    g_st.r = r;
    assert_int_equal(pthread_create(&g_st.th, NULL, stream_main, &g_st), 0);
}

static void on_health(void *arg, const char *path, fy_http_reply_t *reply)
{
    (void)arg;
    (void)path;
    reply->body = "ok";
    reply->body_len = 2;
}

static fy_httpd_limits_t tls_limits(double header_timeout_s)
{
    fy_httpd_limits_t l;
    fy_httpd_limits_default(&l);
    l.header_timeout_s = header_timeout_s;
    l.section = "router";
    snprintf(l.tls_cert, sizeof(l.tls_cert), "%s", cert_path("server.pem"));
    snprintf(l.tls_key, sizeof(l.tls_key), "%s", cert_path("server.key"));
    return l;
}

static fy_httpd_t *start(const fy_httpd_limits_t *l, char *url, size_t cap)
{
    int port = tc_free_port();
    snprintf(url, cap, "https://127.0.0.1:%d", port);
    fy_httpd_t *h;
    assert_int_equal(fy_httpd_create_with(url, l, &h), FY_OK);
    assert_true(fy_httpd_tls(h));
    assert_int_equal(fy_httpd_handle(h, "POST", "/echo", 1 << 16, on_post, "echo"), FY_OK);
    assert_int_equal(fy_httpd_handle(h, "POST", "/stream", 1 << 16, on_post, "stream"), FY_OK);
    assert_int_equal(fy_httpd_handle(h, "POST", "/hold", 1 << 16, on_post, "hold"), FY_OK);
    assert_int_equal(fy_httpd_route(h, "/health", on_health, NULL), FY_OK);
    return h;
}

/* ---- the client ---- */

typedef struct got {
    char buf[8192];
    size_t len;
    double t_first[8]; /* when each write of the body came */
    int n_writes;
} got_t;

static size_t on_data(char *p, size_t sz, size_t n, void *arg)
{
    got_t *g = arg;
    size_t k = sz * n;
    if (g->n_writes < 8) g->t_first[g->n_writes] = fy_now_s();
    g->n_writes++;
    if (g->len + k < sizeof(g->buf)) {
        memcpy(g->buf + g->len, p, k);
        g->len += k;
        g->buf[g->len] = 0;
    }
    return k;
}

/* POST body (GET when NULL) to url+path on handle h; the curl code and the status */
static CURLcode fetch(CURL *h, const char *url, const char *path, const char *body, const char *ca, long tls_ver,
                      long *status, got_t *g)
{
    char u[256];
    snprintf(u, sizeof(u), "%s%s", url, path);
    memset(g, 0, sizeof(*g));
    curl_easy_setopt(h, CURLOPT_URL, u);
    curl_easy_setopt(h, CURLOPT_NOPROXY, "*");
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 10000L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, g);
    curl_easy_setopt(h, CURLOPT_CAINFO, ca);
    curl_easy_setopt(h, CURLOPT_CAPATH, NULL);
    curl_easy_setopt(h, CURLOPT_SSLVERSION, tls_ver);
    if (body)
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    else
        curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
    CURLcode cc = curl_easy_perform(h);
    *status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, status);
    return cc;
}

/* A whole answer, the connection kept alive for a second; the CA checked. */
static void test_answers_and_keepalive(void **state)
{
    (void)state;
    fy_httpd_limits_t l = tls_limits(10);
    char url[64];
    fy_httpd_t *h = start(&l, url, sizeof(url));
    CURL *c = curl_easy_init();
    got_t g;
    long status;
    assert_int_equal(
        fetch(c, url, "/echo", "the prompt text", cert_path("ca.pem"), CURL_SSLVERSION_TLSv1_2, &status, &g), CURLE_OK);
    assert_int_equal(status, 200);
    assert_string_equal(g.buf, "the prompt text");
    assert_int_equal(fetch(c, url, "/health", NULL, cert_path("ca.pem"), CURL_SSLVERSION_TLSv1_2, &status, &g),
                     CURLE_OK);
    assert_int_equal(status, 200);
    assert_string_equal(g.buf, "ok");
    long connects = -1;
    curl_easy_getinfo(c, CURLINFO_NUM_CONNECTS, &connects);
    assert_int_equal(connects, 0); /* the second request went on the first's connection */
    curl_easy_cleanup(c);
    /* TLS 1.3 alone from the client: served */
    c = curl_easy_init();
    assert_int_equal(fetch(c, url, "/health", NULL, cert_path("ca.pem"), CURL_SSLVERSION_TLSv1_3, &status, &g),
                     CURLE_OK);
    assert_int_equal(status, 200);
    curl_easy_cleanup(c);
    /* a client that trusts another CA refuses the server */
    c = curl_easy_init();
    CURLcode cc = fetch(c, url, "/health", NULL, g_other_ca, CURL_SSLVERSION_TLSv1_2, &status, &g);
    print_message("a client without the CA: %s\n", curl_easy_strerror(cc));
    assert_true(cc == CURLE_PEER_FAILED_VERIFICATION || cc == CURLE_SSL_CONNECT_ERROR);
    curl_easy_cleanup(c);
    fy_httpd_destroy(h);
}

/* Each SSE event reaches the client when it is written, not at the end. */
static void test_streamed(void **state)
{
    (void)state;
    fy_httpd_limits_t l = tls_limits(10);
    char url[64];
    fy_httpd_t *h = start(&l, url, sizeof(url));
    atomic_store(&g_ended, 0);
    CURL *c = curl_easy_init();
    got_t g;
    long status;
    double t0 = fy_now_s();
    assert_int_equal(fetch(c, url, "/stream", "{}", cert_path("ca.pem"), CURL_SSLVERSION_TLSv1_2, &status, &g),
                     CURLE_OK);
    double t1 = fy_now_s();
    pthread_join(g_st.th, NULL);
    assert_int_equal(status, 200);
    assert_string_equal(g.buf, "data: chunk 0\n\ndata: chunk 1\n\ndata: chunk 2\n\n");
    /* the whole took three pauses; the first event came well before the end */
    assert_true(t1 - t0 >= 1.1);
    assert_true(g.n_writes >= 3);
    assert_true(t1 - g.t_first[0] >= 0.7);
    for (int i = 0; i < 50 && atomic_load(&g_ended) < 1; i++) usleep(20000);
    assert_int_equal(atomic_load(&g_ended), 1);
    curl_easy_cleanup(c);
    fy_httpd_destroy(h);
}

static int connect_to(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {
        .sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    return fd;
}

/* Reads fd until the server closes it (or limit_s): the bytes, and when it closed (-1: still open). */
static double read_to_close(int fd, double limit_s, char *buf, size_t cap, size_t *len_p)
{
    double t0 = fy_now_s();
    size_t len = 0;
    while (fy_now_s() - t0 < limit_s) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 50) <= 0) continue;
        ssize_t n = recv(fd, buf + len, cap - 1 - len, 0);
        if (n <= 0) {
            buf[len] = 0;
            *len_p = len;
            return fy_now_s() - t0;
        }
        len += (size_t)n;
        if (len >= cap - 1) len = 0; /* only the end matters */
    }
    buf[len] = 0;
    *len_p = len;
    return -1;
}

/* A client that leaves while its answer waits is noticed at once over
 * TLS too (its FIN under the TLS records): the request ends, not complete. */
static void test_gone_while_held(void **state)
{
    (void)state;
    fy_httpd_limits_t l = tls_limits(10);
    char url[64];
    fy_httpd_t *h = start(&l, url, sizeof(url));
    atomic_store(&g_ended, 0);
    atomic_store(&g_gone, 0);
    atomic_store(&g_held, 0);
    CURL *c = curl_easy_init();
    got_t g;
    char u[128];
    snprintf(u, sizeof(u), "%s/hold", url);
    memset(&g, 0, sizeof(g));
    curl_easy_setopt(c, CURLOPT_URL, u);
    curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_CAINFO, cert_path("ca.pem"));
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, "{}");
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &g);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 800L); /* the client gives up */
    double t0 = fy_now_s();
    assert_int_equal(curl_easy_perform(c), CURLE_OPERATION_TIMEDOUT);
    curl_easy_cleanup(c); /* closes the connection */
    double t_closed = fy_now_s();
    assert_int_equal(atomic_load(&g_held), 1);
    for (int i = 0; i < 200 && atomic_load(&g_ended) < 1; i++) usleep(5000);
    double t_end = fy_now_s();
    print_message("held request over TLS: client left after %.2f s, noticed %.3f s later\n", t_closed - t0,
                  t_end - t_closed);
    assert_int_equal(atomic_load(&g_ended), 1);
    assert_int_equal(atomic_load(&g_gone), 1);
    assert_true(t_end - t_closed < 0.5);
    fy_httpd_destroy(h);
}

/* Plain HTTP to the TLS port gets no HTTP answer and is closed; the server goes on. */
static void test_plain_http_refused(void **state)
{
    (void)state;
    fy_httpd_limits_t l = tls_limits(10);
    char url[64];
    fy_httpd_t *h = start(&l, url, sizeof(url));
    int fd = connect_to(fy_httpd_port(h));
    const char req[] = "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 15\r\n\r\nthe prompt text";
    assert_int_equal(send(fd, req, sizeof(req) - 1, MSG_NOSIGNAL), (ssize_t)(sizeof(req) - 1));
    char buf[4096];
    size_t len;
    double t = read_to_close(fd, 5, buf, sizeof(buf), &len);
    close(fd);
    assert_true(t >= 0 && t < 2); /* closed at once, not at a timeout */
    assert_null(memmem(buf, len, "HTTP/1.", 7));
    assert_null(memmem(buf, len, "the prompt text", 15));
    CURL *c = curl_easy_init();
    got_t g;
    long status;
    assert_int_equal(fetch(c, url, "/health", NULL, cert_path("ca.pem"), CURL_SSLVERSION_TLSv1_2, &status, &g),
                     CURLE_OK);
    assert_int_equal(status, 200);
    curl_easy_cleanup(c);
    fy_httpd_destroy(h);
}

/* A handshake never finished is closed at the header timeout (1 s here):
 * one client sends nothing, one the first bytes of a ClientHello. */
static void test_stalled_handshake(void **state)
{
    (void)state;
    fy_httpd_limits_t l = tls_limits(1);
    l.idle_timeout_s = 30; /* not the idle timeout's doing */
    char url[64];
    fy_httpd_t *h = start(&l, url, sizeof(url));
    int fds[2];
    double t0 = fy_now_s();
    fds[0] = connect_to(fy_httpd_port(h));
    fds[1] = connect_to(fy_httpd_port(h));
    /* a TLS record header announcing a 512-byte handshake, and 4 bytes of it */
    const unsigned char hello[] = {0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc};
    assert_int_equal(send(fds[1], hello, sizeof(hello), MSG_NOSIGNAL), (ssize_t)sizeof(hello));
    for (int i = 0; i < 2; i++) {
        char buf[256];
        size_t len;
        double t = read_to_close(fds[i], 6, buf, sizeof(buf), &len);
        if (t >= 0) t = fy_now_s() - t0;
        print_message("stalled handshake %d: closed after %.2f s\n", i, t);
        assert_true(t >= 0.5 && t < 3.5);
        close(fds[i]);
    }
    fy_httpd_stats_t s;
    fy_httpd_stats(h, &s);
    assert_true(s.timed_out >= 2);
    fy_httpd_destroy(h);
}

/* At the connection cap, connections still in their handshake make room
 * for a newcomer as idle ones do: four held open, then a client served. */
static void test_cap_evicts_handshakes(void **state)
{
    (void)state;
    fy_httpd_limits_t l = tls_limits(30);
    l.max_connections = 4;
    char url[64];
    fy_httpd_t *h = start(&l, url, sizeof(url));
    int fds[4];
    for (int i = 0; i < 4; i++) fds[i] = connect_to(fy_httpd_port(h));
    fy_httpd_stats_t s;
    for (int i = 0; i < 100; i++) { /* the server has taken them all */
        fy_httpd_stats(h, &s);
        if (s.open == 4) break;
        usleep(10000);
    }
    assert_int_equal(s.open, 4);
    CURL *c = curl_easy_init();
    got_t g;
    long status;
    assert_int_equal(fetch(c, url, "/health", NULL, cert_path("ca.pem"), CURL_SSLVERSION_TLSv1_2, &status, &g),
                     CURLE_OK);
    assert_int_equal(status, 200);
    curl_easy_cleanup(c);
    fy_httpd_stats(h, &s);
    assert_true(s.evicted >= 1);
    for (int i = 0; i < 4; i++) close(fds[i]);
    fy_httpd_destroy(h);
}

/* router.tls_min_version 1.3: a client that offers 1.2 at most is refused. */
static void test_min_version(void **state)
{
    (void)state;
    fy_config_t *cfg;
    assert_int_equal(fy_config_create(&cfg), FY_OK);
    char kv[700];
    snprintf(kv, sizeof(kv), "router.tls_cert=%s", cert_path("server.pem"));
    assert_int_equal(fy_config_set(cfg, kv), FY_OK);
    snprintf(kv, sizeof(kv), "router.tls_key=%s", cert_path("server.key"));
    assert_int_equal(fy_config_set(cfg, kv), FY_OK);
    assert_int_equal(fy_config_set(cfg, "router.tls_min_version=1.3"), FY_OK);
    fy_httpd_limits_t l;
    assert_int_equal(fy_netconf_httpd(cfg, "router", &l), FY_OK);
    assert_int_equal(fy_httpd_limits_check(&l), FY_OK);
    assert_int_equal(l.tls_min, 13);
    char url[64];
    fy_httpd_t *h = start(&l, url, sizeof(url));
    CURL *c = curl_easy_init();
    got_t g;
    long status;
    curl_easy_setopt(c, CURLOPT_SSLVERSION, 0L);
    /* at most TLS 1.2 */
    char u[128];
    snprintf(u, sizeof(u), "%s/health", url);
    memset(&g, 0, sizeof(g));
    curl_easy_setopt(c, CURLOPT_URL, u);
    curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
    curl_easy_setopt(c, CURLOPT_CAINFO, cert_path("ca.pem"));
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &g);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 10000L);
    curl_easy_setopt(c, CURLOPT_SSLVERSION, (long)(CURL_SSLVERSION_TLSv1_2 | CURL_SSLVERSION_MAX_TLSv1_2));
    assert_int_not_equal(curl_easy_perform(c), CURLE_OK);
    curl_easy_cleanup(c);
    c = curl_easy_init();
    assert_int_equal(fetch(c, url, "/health", NULL, cert_path("ca.pem"), CURL_SSLVERSION_TLSv1_2, &status, &g),
                     CURLE_OK);
    assert_int_equal(status, 200);
    curl_easy_cleanup(c);
    fy_httpd_destroy(h);
    fy_config_destroy(cfg);
}

/* what fy_netconf_httpd and fy_httpd_limits_check make of router.tls_cert=cert
 * and tls_key=key, as a router or `ferry serve` does before it starts */
static fy_status_t read_tls(const char *cert, const char *key, fy_httpd_limits_t *l)
{
    fy_config_t *cfg;
    assert_int_equal(fy_config_create(&cfg), FY_OK);
    char kv[700];
    snprintf(kv, sizeof(kv), "router.tls_cert=%s", cert);
    assert_int_equal(fy_config_set(cfg, kv), FY_OK);
    snprintf(kv, sizeof(kv), "router.tls_key=%s", key);
    assert_int_equal(fy_config_set(cfg, kv), FY_OK);
    fy_test_log_begin();
    fy_status_t st = fy_netconf_httpd(cfg, "router", l);
    if (!st) st = fy_httpd_limits_check(l);
    fy_test_log_end();
    fy_config_destroy(cfg);
    return st;
}

static void test_refused_at_start(void **state)
{
    (void)state;
    fy_httpd_limits_t l;
    assert_int_equal(read_tls(cert_path("server.pem"), cert_path("server.key"), &l), FY_OK);
    assert_string_equal(l.tls_cert, cert_path("server.pem"));
    assert_int_equal(l.tls_min, 12);
    /* no key file */
    assert_int_equal(read_tls(cert_path("server.pem"), cert_path("nothing.key"), &l), FY_ERR_INVALID);
    assert_true(fy_test_log_has("router.tls_key", "nothing.key", "cannot open", NULL));
    /* a key its group can read */
    const char *open_key = cert_path("open.key");
    size_t n;
    char *k = fy_test_read_file(cert_path("server.key"), &n);
    assert_non_null(k);
    assert_true(fy_test_write_file(open_key, k, n));
    chmod(open_key, 0640);
    assert_int_equal(read_tls(cert_path("server.pem"), open_key, &l), FY_ERR_INVALID);
    assert_true(fy_test_log_has("router.tls_key", "mode 0640", NULL));
    /* a key file that holds a certificate; a certificate file that holds a key */
    assert_int_equal(read_tls(cert_path("server.pem"), cert_path("ca.pem"), &l), FY_ERR_INVALID);
    assert_true(fy_test_log_has("router.tls_key", "no PEM private key", NULL));
    assert_int_equal(read_tls(cert_path("server.key"), cert_path("server.key"), &l), FY_ERR_INVALID);
    assert_true(fy_test_log_has("router.tls_cert", "no PEM certificate", NULL));
    /* a PEM-looking key that is not one */
    const char *junk = cert_path("junk.key");
    const char jk[] = "-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n";
    assert_true(fy_test_write_file(junk, jk, sizeof(jk) - 1));
    assert_int_equal(read_tls(cert_path("server.pem"), junk, &l), FY_OK); /* the files pass; GnuTLS refuses it */
    fy_httpd_t *h;
    char url[64];
    snprintf(url, sizeof(url), "https://127.0.0.1:%d", tc_free_port());
    fy_test_log_begin();
    assert_int_equal(fy_httpd_create_with(url, &l, &h), FY_ERR_INVALID);
    fy_test_log_end();
    assert_true(fy_test_log_has("router.tls_cert", "router.tls_key", "refused by the TLS library", NULL));
    /* the CA's key: a good key, not the certificate's */
    assert_int_equal(read_tls(cert_path("server.pem"), cert_path("ca.key"), &l), FY_OK);
    fy_test_log_begin();
    assert_int_equal(fy_httpd_create_with(url, &l, &h), FY_ERR_INVALID);
    fy_test_log_end();
    assert_true(fy_test_log_has("router.tls_cert", "router.tls_key", "refused by the TLS library", NULL));
    /* a certificate alone */
    assert_int_equal(read_tls(cert_path("server.pem"), "", &l), FY_ERR_INVALID);
    assert_true(fy_test_log_has("router.tls_cert is set but router.tls_key is not", NULL));
    /* https:// with no certificate */
    fy_test_log_begin();
    assert_int_equal(fy_httpd_create(url, &h), FY_ERR_INVALID);
    fy_test_log_end();
    assert_true(fy_test_log_has("https://", "tls_cert is empty", NULL));
    fy_free(k);
}

/* ferry serve gives router r port + 2r on an https:// router.http too */
static void test_addr_plus_https(void **state)
{
    (void)state;
    char out[64];
    assert_true(fy_cluster_addr_plus("https://127.0.0.1:8443", 2, out, sizeof(out)));
    assert_string_equal(out, "https://127.0.0.1:8445");
    assert_false(fy_cluster_addr_plus("ftp://127.0.0.1:21", 1, out, sizeof(out)));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_answers_and_keepalive), cmocka_unit_test(test_streamed),
        cmocka_unit_test(test_plain_http_refused),    cmocka_unit_test(test_stalled_handshake),
        cmocka_unit_test(test_min_version),           cmocka_unit_test(test_refused_at_start),
        cmocka_unit_test(test_addr_plus_https),       cmocka_unit_test(test_cap_evicts_handshakes),
        cmocka_unit_test(test_gone_while_held),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

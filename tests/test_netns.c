/*
 * test_netns.c - the cluster across "hosts": the router, a prefill worker
 * and a decode worker each in its own network namespace, joined by veth
 * pairs on a bridge (in a namespace of its own), so nng and UCX really
 * go over TCP between addresses that only meet through the bridge.  The
 * test creates and removes the namespaces, and skips with a message where
 * it lacks the rights (not root, no ip(8), no netns support).  And the
 * control plane's privacy: a capture of every interface of the three
 * namespaces (raw packet sockets the test opens itself) while a request
 * runs holds none of its prompt's tokens, text or generated tokens with
 * cluster.encrypt = auto; with off it does hold the prompt's tokens
 * (proof that the capture sees the traffic).  The router's OpenAI door
 * is reached from another namespace with its veth captured: behind
 * router.tls_cert no prompt text crosses it.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/capture_util.h"
#include "tests/cluster_util.h"
#include "common/mem.h"
#include "tests/testutil.h"

static char g_ns[4][32]; /* router, prefill, decode, bridge */
static char g_if[3][16];
static int g_subnet;
static bool g_made;

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int sh(const char *fmt, ...)
{
    char cmd[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    int rc = system(cmd);
    return rc == -1 ? -1 : WEXITSTATUS(rc);
}

static void net_down(void)
{
    if (!g_made) return;
    for (int i = 0; i < 4; i++) sh("ip netns del %s 2>/dev/null", g_ns[i]);
    g_made = false;
}

/* The three namespaces on one bridge, made once for every test: this
 * process joins the router's, and nng's threads, started there, cannot
 * follow it into another; false (and a message) if this host cannot. */
static bool net_up(void)
{
    static int done; /* 1: up, -1: cannot */
    if (done) return done > 0;
    done = -1;
    if (geteuid() != 0) {
        print_message("skipped: network namespaces need root\n");
        return false;
    }
    if (sh("ip -V >/dev/null 2>&1") != 0) {
        print_message("skipped: ip(8) (iproute2) is not installed\n");
        return false;
    }
    int id = (int)(getpid() % 10000);
    g_subnet = 16 + (int)(getpid() % 200);
    const char *roles = "rpdb";
    for (int i = 0; i < 4; i++) snprintf(g_ns[i], sizeof(g_ns[i]), "fy%d%c", id, roles[i]);
    for (int i = 0; i < 3; i++) snprintf(g_if[i], sizeof(g_if[i]), "fy%d%c", id, roles[i]);
    if (sh("ip netns add %s 2>/dev/null", g_ns[3]) != 0) {
        print_message("skipped: cannot create a network namespace here\n");
        return false;
    }
    g_made = true;
    int bad = 0;
    bad |= sh("ip -n %s link set lo up", g_ns[3]);
    bad |= sh("ip -n %s link add br0 type bridge && ip -n %s link set br0 up", g_ns[3], g_ns[3]);
    for (int i = 0; i < 3 && !bad; i++) {
        bad |= sh("ip netns add %s && ip -n %s link set lo up", g_ns[i], g_ns[i]);
        bad |= sh("ip link add %s type veth peer name %sb", g_if[i], g_if[i]);
        bad |= sh("ip link set %s netns %s && ip link set %sb netns %s", g_if[i], g_ns[i], g_if[i], g_ns[3]);
        bad |= sh("ip -n %s link set %sb master br0 && ip -n %s link set %sb up", g_ns[3], g_if[i], g_ns[3], g_if[i]);
        bad |= sh("ip -n %s addr add 10.213.%d.%d/24 dev %s && ip -n %s link set %s up", g_ns[i], g_subnet, i + 1,
                  g_if[i], g_ns[i], g_if[i]);
    }
    if (bad) {
        net_down();
        print_message("skipped: could not build the veth/bridge network (see the messages above)\n");
        return false;
    }
    done = 1;
    return true;
}

/* This process (the client) joins the router's namespace. */
static bool join(const char *ns)
{
    char path[128];
    snprintf(path, sizeof(path), "/var/run/netns/%s", ns);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    bool ok = setns(fd, CLONE_NEWNET) == 0;
    close(fd);
    return ok;
}

/* with_etcd: no router address in the workers' configuration; etcd runs
 * on the router's host and every process finds the others there.  tls:
 * that etcd with TLS, client certificates and RBAC, each process with
 * its role's certificate and etcd user (cluster.etcd_ca, etcd_cert,
 * etcd_key, etcd_user, etcd_password_file) */
static void three_hosts(bool with_etcd, bool tls)
{
    enum { N = 6 };
    static int32_t prompts[N][400];
    int32_t lens[N], max_tokens[N], *pp[N];
    uint64_t seed = 42;
    for (int i = 0; i < N; i++) {
        lens[i] = 20 + 70 * i;
        for (int32_t k = 0; k < lens[i]; k++) prompts[i][k] = 100 + (int32_t)(fy_test_rand_u64(&seed) % 40000);
        max_tokens[i] = 10;
        pp[i] = prompts[i];
    }
    static tc_result_t ref[N], got[N];
    tc_reference(tc_model(), pp, lens, max_tokens, N, ref);
    assert_true(join(g_ns[0]));

    char router[64], events[64], purl[64], durl[64];
    snprintf(router, sizeof(router), "tcp://10.213.%d.1:7400", g_subnet);
    snprintf(events, sizeof(events), "tcp://10.213.%d.1:7401", g_subnet);
    snprintf(purl, sizeof(purl), "tcp://10.213.%d.2:7410", g_subnet);
    snprintf(durl, sizeof(durl), "tcp://10.213.%d.3:7420", g_subnet);
    /* UCX picks the interface itself (its address lists loopback too, and
     * it does not try that for a peer in another namespace) */
    const char *wr[] = {"ip", "netns", "exec", g_ns[0], NULL};
    const char *wp[] = {"ip", "netns", "exec", g_ns[1], NULL};
    const char *wd[] = {"ip", "netns", "exec", g_ns[2], NULL};
    tc_opts_t o = {.n_prefill = 1,
                   .n_decode = 1,
                   .router_url = router,
                   .events_url = events,
                   .worker_url = {purl, durl},
                   .common = {"worker.transports=tcp"},
                   .wrap = {wr, wp, wd}};
    tc_etcd_t e = {0};
    char set_etcd[128], certs[300], sets[9][400];
    if (with_etcd) { /* started from here: in the router's namespace, on its address */
        char host[32];
        snprintf(host, sizeof(host), "10.213.%d.1", g_subnet);
        if (tls) {
            static const char *const names[] = {"root", "ferry-router", "ferry-worker"};
            snprintf(certs, sizeof(certs), "%s/pki", fy_test_tmpdir());
            tc_etcd_certs_ip(certs, host, names, 3);
            tc_etcd_start_tls_on(&e, fy_test_tmpdir(), certs, host);
            tc_etcd_rbac(&e, "ferry", names + 1, 2);
            snprintf(sets[0], sizeof(sets[0]), "cluster.etcd_ca=%s/ca.pem", certs);
            for (int r = 0; r < 2; r++) { /* the router's in per_router, the workers' in per_worker */
                const char *u = names[1 + r];
                snprintf(sets[1 + 4 * r], sizeof(sets[0]), "cluster.etcd_cert=%s/%s.pem", certs, u);
                snprintf(sets[2 + 4 * r], sizeof(sets[0]), "cluster.etcd_key=%s/%s.key", certs, u);
                snprintf(sets[3 + 4 * r], sizeof(sets[0]), "cluster.etcd_user=%s", u);
                snprintf(sets[4 + 4 * r], sizeof(sets[0]), "cluster.etcd_password_file=%s/%s.password", certs, u);
            }
        } else
            tc_etcd_start(&e, fy_test_tmpdir(), host);
        snprintf(set_etcd, sizeof(set_etcd), "cluster.etcd=%s", e.url);
        o.common[1] = set_etcd;
        o.common[2] = "cluster.etcd_poll=100ms";
        o.per_worker[0][0] = o.per_worker[1][0] = "router.events=tcp://10.213.0.9:1"; /* the workers must not need it */
        if (tls) { /* everyone: the CA and the router's user; the workers: theirs (a later --set wins) */
            for (int k = 0; k < 5; k++) o.common[3 + k] = sets[k];
            for (int w = 0; w < 2; w++)
                for (int k = 0; k < 4; k++) o.per_worker[w][1 + k] = sets[5 + k];
        }
    }
    tc_cluster_t c;
    tc_start(&c, &o);
    fy_client_stream_t s[N];
    memset(got, 0, sizeof(got));
    for (int i = 0; i < N; i++) {
        fy_client_req_t q = {.tokens = prompts[i], .n_tokens = lens[i]};
        fy_genspec_default(&q.gen);
        q.gen.max_tokens = max_tokens[i];
        q.gen.ignore_eos = true;
        char err[256];
        assert_int_equal(fy_client_generate(c.client, &q, &s[i], err, sizeof(err)), FY_OK);
    }
    tc_collect(&c, s, got, N, 180);
    int64_t bytes = 0;
    for (int i = 0; i < N; i++) {
        if (got[i].error) fail_msg("request %d: %s", i, got[i].message);
        if (got[i].n != ref[i].n || memcmp(got[i].tokens, ref[i].tokens, sizeof(int32_t) * (size_t)ref[i].n))
            fail_msg("request %d: different tokens across namespaces", i);
        bytes += got[i].timings.transfer_bytes;
    }
    print_message("%d requests across three namespaces%s, %.1f MB of KV over UCX/TCP\n", N,
                  !with_etcd ? ""
                  : tls      ? " (membership through etcd with TLS, client certificates and RBAC)"
                             : " (membership through etcd)",
                  (double)bytes / 1e6);
    assert_true(bytes > 0);
    tc_stop(&c);
    tc_etcd_kill(&e);
}

/* ---- capture: AF_PACKET sockets, one per namespace, read on a thread ---- */

#define CAP_MAX (256u << 20) /* bytes kept at most */

typedef struct capture {
    int fd[3];
    pthread_t th;
    atomic_bool stop;
    uint8_t *buf;
    size_t len, cap;
    uint64_t frames, kept_out; /* frames read; bytes not kept (over CAP_MAX) */
    uint64_t drops;            /* frames the kernel dropped (the socket's queue full) */
} capture_t;

static void *capture_main(void *arg)
{
    capture_t *c = arg;
    static uint8_t frame[1 << 16];
    while (!atomic_load(&c->stop)) {
        fd_set rd;
        FD_ZERO(&rd);
        int top = -1;
        for (int i = 0; i < 3; i++) FD_SET(c->fd[i], &rd), top = c->fd[i] > top ? c->fd[i] : top;
        struct timeval tv = {.tv_sec = 0, .tv_usec = 100000};
        if (select(top + 1, &rd, NULL, NULL, &tv) <= 0) continue;
        for (int i = 0; i < 3; i++) {
            if (!FD_ISSET(c->fd[i], &rd)) continue;
            ssize_t n = recv(c->fd[i], frame, sizeof(frame), MSG_DONTWAIT);
            if (n <= 0) continue;
            c->frames++;
            if (c->len + (size_t)n > CAP_MAX) {
                c->kept_out += (uint64_t)n;
                continue;
            }
            if (c->len + (size_t)n > c->cap) {
                size_t nc = c->cap ? 2 * c->cap : 1u << 20;
                while (nc < c->len + (size_t)n) nc *= 2;
                uint8_t *b = realloc(c->buf, nc);
                if (!b) {
                    c->kept_out += (uint64_t)n;
                    continue;
                }
                c->buf = b, c->cap = nc;
            }
            memcpy(c->buf + c->len, frame, (size_t)n);
            c->len += (size_t)n;
        }
    }
    return NULL;
}

/* A raw socket on every interface of each of the three hosts' namespaces
 * (made in the namespace, it stays there), read from now on; this thread
 * is back in the router's namespace after. */
static void capture_start(capture_t *c)
{
    memset(c, 0, sizeof(*c));
    for (int i = 0; i < 3; i++) {
        assert_true(join(g_ns[i]));
        c->fd[i] = socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, htons(ETH_P_ALL));
        if (c->fd[i] < 0) fail_msg("a raw packet socket in %s: %s", g_ns[i], strerror(errno));
        int big = 64 << 20;
        setsockopt(c->fd[i], SOL_SOCKET, SO_RCVBUFFORCE, &big, sizeof(big));
    }
    assert_true(join(g_ns[0]));
    assert_int_equal(pthread_create(&c->th, NULL, capture_main, c), 0);
}

static void capture_stop(capture_t *c)
{
    atomic_store(&c->stop, true);
    pthread_join(c->th, NULL);
    for (int i = 0; i < 3; i++) { /* the kernel's count of frames it could not queue to us */
        struct tpacket_stats st;
        socklen_t sl = sizeof(st);
        if (!getsockopt(c->fd[i], SOL_PACKET, PACKET_STATISTICS, &st, &sl)) c->drops += st.tp_drops;
        close(c->fd[i]);
    }
}

/* msgpack's int as fy_msgw_i32s writes it (the smallest form) */
static size_t mp_int(int32_t v, uint8_t *out)
{
    if (v >= 0 && v < 128) return out[0] = (uint8_t)v, 1;
    if (v >= 0 && v < 256) return out[0] = 0xcc, out[1] = (uint8_t)v, 2;
    if (v >= 0 && v < 65536) return out[0] = 0xcd, out[1] = (uint8_t)(v >> 8), out[2] = (uint8_t)v, 3;
    out[0] = v >= 0 ? 0xce : 0xd2;
    for (int i = 0; i < 4; i++) out[1 + i] = (uint8_t)((uint32_t)v >> (24 - 8 * i));
    return 5;
}

/* How many times the msgpack form of tokens[0..n) occurs in the capture. */
static int count_tokens(const capture_t *c, const int32_t *tokens, int n)
{
    uint8_t needle[5 * 64];
    size_t nl = 0;
    for (int i = 0; i < n && i < 64; i++) nl += mp_int(tokens[i], needle + nl);
    int k = 0;
    for (const uint8_t *p = c->buf, *e = c->buf + c->len; p && (p = memmem(p, (size_t)(e - p), needle, nl)); p++) k++;
    return k;
}

static int count_text(const capture_t *c, const char *text)
{
    int k = 0;
    size_t tl = strlen(text);
    for (const uint8_t *p = c->buf, *e = c->buf + c->len; p && (p = memmem(p, (size_t)(e - p), text, tl)); p++) k++;
    return k;
}

/* One cluster across the three namespaces with cluster.encrypt = mode; a
 * request with distinctive prompt tokens and one with a distinctive text,
 * under capture.  auto: nothing of either in the capture, nor any
 * generated token; off: the prompt's tokens (the router's command to the
 * prefill worker) and the generated ones (the decode worker's events) are
 * there.  The test's own client
 * keeps auto (it dials the router's address, not loopback): its requests
 * and the router's answers are encrypted in both runs. */
static void capture_run(const char *mode)
{
    assert_true(join(g_ns[0]));
    char router[64], events[64], purl[64], durl[64], set_mode[64];
    snprintf(router, sizeof(router), "tcp://10.213.%d.1:7402", g_subnet);
    snprintf(events, sizeof(events), "tcp://10.213.%d.1:7403", g_subnet);
    snprintf(purl, sizeof(purl), "tcp://10.213.%d.2:7412", g_subnet);
    snprintf(durl, sizeof(durl), "tcp://10.213.%d.3:7422", g_subnet);
    snprintf(set_mode, sizeof(set_mode), "cluster.encrypt=%s", mode);
    const char *wr[] = {"ip", "netns", "exec", g_ns[0], NULL};
    const char *wp[] = {"ip", "netns", "exec", g_ns[1], NULL};
    const char *wd[] = {"ip", "netns", "exec", g_ns[2], NULL};
    tc_opts_t o = {.n_prefill = 1,
                   .n_decode = 1,
                   .router_url = router,
                   .events_url = events,
                   .worker_url = {purl, durl},
                   .common = {"worker.transports=tcp", set_mode},
                   .wrap = {wr, wp, wd}};
    /* tokens no tokenizer run would give in this order: 100 of them, from 1000 up */
    static int32_t prompt[100];
    uint64_t seed = 0x5eed0f32;
    for (int k = 0; k < 100; k++) prompt[k] = 1000 + (int32_t)(fy_test_rand_u64(&seed) % 30000);
    static const char text[] = "Quixotic zebras juggle ultramarine pomegranates beside xylophones";
    capture_t cap;
    capture_start(&cap);
    tc_cluster_t c;
    tc_start(&c, &o);
    fy_client_stream_t s[2];
    fy_client_req_t q[2] = {{.tokens = prompt, .n_tokens = 100}, {.prompt = text}};
    for (int i = 0; i < 2; i++) {
        fy_genspec_default(&q[i].gen);
        q[i].gen.max_tokens = 8;
        q[i].gen.ignore_eos = true;
        char err[256];
        assert_int_equal(fy_client_generate(c.client, &q[i], &s[i], err, sizeof(err)), FY_OK);
    }
    static tc_result_t got[2];
    memset(got, 0, sizeof(got));
    tc_collect(&c, s, got, 2, 180);
    tc_stop(&c);
    capture_stop(&cap);
    for (int i = 0; i < 2; i++)
        if (got[i].error || got[i].n < 2) fail_msg("request %d: %s", i, got[i].message);
    int in_prompt = count_tokens(&cap, prompt + 40, 12), in_text = count_text(&cap, "ultramarine pomegranates");
    /* generated tokens: each goes from the decode worker to the router in a "token" event, as
     * "token": ID (a bare ID of a byte or three turns up by chance in 6 MB of KV and ciphertext) */
    int in_out = 0;
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < got[i].n; k++) {
            uint8_t needle[16] = "\xa5token";
            size_t nl = 6 + mp_int(got[i].tokens[k], needle + 6);
            for (const uint8_t *p = cap.buf, *e = cap.buf + cap.len; p && (p = memmem(p, (size_t)(e - p), needle, nl));
                 p++)
                in_out++;
        }
    print_message("cluster.encrypt=%s: %llu frames, %.1f MB captured (%llu bytes not kept, %llu frames dropped); "
                  "the prompt's tokens %d times, its text %d times, generated tokens %d times\n",
                  mode, (unsigned long long)cap.frames, (double)cap.len / 1e6, (unsigned long long)cap.kept_out,
                  (unsigned long long)cap.drops, in_prompt, in_text, in_out);
    if (!strcmp(mode, "off")) {
        if (!in_prompt || !in_out)
            fail_msg("with cluster.encrypt=off the capture holds no prompt or no generated tokens: it sees nothing");
    } else {
        if (in_prompt || in_text || in_out) fail_msg("with cluster.encrypt=%s the capture holds plaintext", mode);
        /* and it saw everything: nothing dropped or left out where a leak could hide */
        if (cap.kept_out || cap.drops) fail_msg("the capture missed frames: the check proves nothing");
        assert_true(cap.len > 0);
    }
    free(cap.buf);
}

static void test_capture_encrypted(void **state)
{
    if (!tc_available()) skip();
    if (!net_up()) skip();
    capture_run("off"); /* first: the capture sees the prompt in clear */
    capture_run("auto");
}

/* The router's OpenAI door reached from another "host" (a client in the
 * prefill's namespace, curl), a decode worker in the third; the router's
 * veth captured (capture_util.h) for the door's port while a completion
 * goes through.  Over HTTPS (router.tls_cert) the prompt's text must not
 * be among the captured bytes; over plain HTTP it must be (so the
 * capture sees what it should, and the HTTPS check can fail). */
static void door_capture(bool tls)
{
    assert_true(join(g_ns[0]));
    char router[64], events[64], durl[64], http[96], certs[300], set_cert[400], set_key[400], ca[400];
    snprintf(router, sizeof(router), "tcp://10.213.%d.1:7400", g_subnet);
    snprintf(events, sizeof(events), "tcp://10.213.%d.1:7401", g_subnet);
    snprintf(durl, sizeof(durl), "tcp://10.213.%d.3:7420", g_subnet);
    snprintf(http, sizeof(http), "router.http=%s://10.213.%d.1:8080", tls ? "https" : "http", g_subnet);
    const char *wr[] = {"ip", "netns", "exec", g_ns[0], NULL};
    const char *wd[] = {"ip", "netns", "exec", g_ns[2], NULL};
    tc_opts_t o = {.n_prefill = 0,
                   .n_decode = 1,
                   .router_url = router,
                   .events_url = events,
                   .worker_url = {durl},
                   .common = {"worker.transports=tcp", http},
                   .wrap = {wr, wd}};
    if (tls) { /* a certificate for the router's address */
        char host[32];
        snprintf(host, sizeof(host), "10.213.%d.1", g_subnet);
        snprintf(certs, sizeof(certs), "%s/door-pki", fy_test_tmpdir());
        tc_etcd_certs_ip(certs, host, NULL, 0);
        snprintf(set_cert, sizeof(set_cert), "router.tls_cert=%s/server.pem", certs);
        snprintf(set_key, sizeof(set_key), "router.tls_key=%s/server.key", certs);
        snprintf(ca, sizeof(ca), "--cacert %s/ca.pem", certs);
        o.common[2] = set_cert;
        o.common[3] = set_key;
    }
    tc_cluster_t c;
    tc_start(&c, &o);
    tc_cap_t *cap = tc_cap_start(g_if[0], 8080);
    if (!cap) fail_msg("cannot capture on %s", g_if[0]);
    static const char secret[] = "the purple elephant whispers ferry-door-7731";
    char out[512];
    snprintf(out, sizeof(out), "%s/door.out", fy_test_tmpdir());
    int rc = sh(
        "ip netns exec %s curl -sS -f --max-time 120 %s %s://10.213.%d.1:8080/v1/completions "
        "-H 'Content-Type: application/json' -d '{\"prompt\": \"%s\", \"max_tokens\": 12, \"ignore_eos\": true}' >%s",
        g_ns[1], tls ? ca : "", tls ? "https" : "http", g_subnet, secret, out);
    size_t len, n;
    int segments;
    char *bytes = tc_cap_stop(cap, &len, &segments);
    char *answer = fy_test_read_file(out, &n);
    if (rc != 0 || !answer || !strstr(answer, "\"choices\"")) {
        tc_print_logs(&c);
        fail_msg("the completion from the client's namespace failed (curl %d): %s", rc, answer ? answer : "");
    }
    bool seen = memmem(bytes, len, secret, strlen(secret)) != NULL;
    /* the answer's text too, as the JSON has it */
    char text[256] = "";
    const char *t = strstr(answer, "\"text\":\"");
    if (t) snprintf(text, sizeof(text), "%.*s", (int)strcspn(t + 8, "\""), t + 8);
    bool text_seen = strlen(text) >= 6 && memmem(bytes, len, text, strlen(text)) != NULL;
    print_message("%s door: %d segments, %zu bytes captured on the router's veth; the prompt %s among them, the "
                  "answer's text ('%s') %s\n",
                  tls ? "HTTPS" : "plain HTTP", segments, len, seen ? "IS" : "is not", text,
                  text_seen ? "IS" : "is not");
    assert_true(len > strlen(secret));
    if (tls && (seen || text_seen))
        fail_msg("the prompt or the answer crossed the wire in the clear behind router.tls_cert");
    if (!tls && !seen) fail_msg("the capture missed the plain-HTTP prompt: it would not see a leak either");
    if (!tls && strlen(text) >= 6 && !text_seen) fail_msg("the capture missed the plain-HTTP answer '%s'", text);
    fy_free(answer);
    fy_free(bytes);
    tc_stop(&c);
}

static void test_door_plain_http_capture(void **state)
{
    if (!tc_available()) skip();
    if (!net_up()) skip();
    door_capture(false);
}

static void test_door_https_capture(void **state)
{
    if (!tc_available()) skip();
    if (!net_up()) skip();
    door_capture(true);
}

static void test_three_hosts(void **state)
{
    if (!tc_available()) skip();
    if (!net_up()) skip();
    three_hosts(false, false);
}

static void test_three_hosts_etcd(void **state)
{
    if (!tc_available() || !tc_etcd_available()) skip();
    if (!net_up()) skip();
    three_hosts(true, false);
}

static void test_three_hosts_etcd_tls(void **state)
{
    if (!tc_available() || !tc_etcd_available()) skip();
    if (!net_up()) skip();
    three_hosts(true, true);
}

static int teardown(void **state)
{
    fy_test_tmpdir_remove();
    return 0;
}

static int group_teardown(void **state)
{
    net_down();
    return 0;
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_three_hosts, teardown),
        cmocka_unit_test_teardown(test_three_hosts_etcd, teardown),
        cmocka_unit_test_teardown(test_three_hosts_etcd_tls, teardown),
        cmocka_unit_test_teardown(test_capture_encrypted, teardown),
        cmocka_unit_test_teardown(test_door_plain_http_capture, teardown),
        cmocka_unit_test_teardown(test_door_https_capture, teardown),
    };
    const char *only = getenv("FY_TEST_FILTER");
    if (only) cmocka_set_test_filter(only);
    return cmocka_run_group_tests(tests, NULL, group_teardown);
}

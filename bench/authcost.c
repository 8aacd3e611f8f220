/*
 * authcost.c - `ferry-bench auth`: what the control plane's envelope
 * (common/envelope.h) costs, in clear with its MAC and encrypted
 * (cluster.encrypt: XChaCha20-Poly1305).  Per message: sealing, opening
 * (parse and tag check; encrypted: and decryption) and the replay guard,
 * at payload sizes a control message has (200 B: a command or a poll;
 * 2 KiB: a reserve with a prompt; 64 KiB: a long prompt or a load report
 * with a big digest).  Per round trip: one request and its reply over nng
 * req/rep, bare (the reference) and with the envelope sealed and opened
 * on both sides, MAC or AEAD (the same raw sockets, so the difference is
 * the envelope alone), and through fy_rpc (the sockets ferry uses, which
 * add their own slots and callbacks) with cluster.encrypt auto (clear on
 * loopback) and always.
 *
 * Not here: the load harness (ferry_bench.c), anything about models.
 */
#include "bench/authcost.h"

#include <arpa/inet.h>
#include <getopt.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>

#include "common/clock.h"
#include "common/envelope.h"
#include "common/mem.h"
#include "rpc/rpc.h"
#include "bench/stats.h"

static const uint8_t SECRET[32] = "ferry-bench auth: a test secret";

/* This thread's CPU time: the per-message costs are work done, whatever
 * else shares the machine (a busy host deschedules the thread, which wall
 * time would count). */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A loopback TCP port that was free a moment ago (0 if none). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof(a);
    int port = 0;
    if (fd >= 0 && !bind(fd, (struct sockaddr *)&a, sizeof(a)) && !getsockname(fd, (struct sockaddr *)&a, &l))
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

/* ---- per message ---- */

static void per_message(const fy_env_auth_t *me, size_t size, int reps, bool aead)
{
    size_t cap = FY_ENV_MAX_HEADER + size;
    uint8_t *buf = fy_malloc(cap);
    if (!buf) return;
    for (size_t i = 0; i < size; i++) buf[FY_ENV_MAX_HEADER + i] = (uint8_t)(i * 131u);
    fy_env_hdr_t h;
    memset(&h, 0, sizeof(h));
    h.kind = FY_ENV_MSG;
    h.role = me->role;
    snprintf(h.name, sizeof(h.name), "%s", me->name);
    h.inc = me->inc;
    h.chan = 1;
    h.ts_ms = fy_env_now_ms();
    h.aead = aead;
    size_t hl = fy_env_header_bytes(&h);
    uint8_t *msg = buf + FY_ENV_MAX_HEADER - hl; /* header right before the payload */
    fy_env_guard_t *g;
    if (fy_env_guard_create(1024, h.ts_ms, &g)) {
        fy_free(buf);
        return;
    }
    volatile size_t sink = 0;
    double t0 = cpu_s();
    for (int r = 0; r < reps; r++) {
        h.seq = (uint64_t)r + 1;
        fy_env_seal(&me->key, &h, msg + hl, size, msg);
    }
    double t_seal = (cpu_s() - t0) / reps;
    fy_env_hdr_t o;
    size_t off;
    double t_open;
    t0 = cpu_s();
    if (!aead) {
        for (int r = 0; r < reps; r++) sink += fy_env_open(&me->key, msg, hl + size, &o, &off) == FY_ENV_OK ? off : 0;
        t_open = (cpu_s() - t0) / reps;
    } else { /* opening decrypts in place: each open follows a seal of its own, whose time is taken off */
        for (int r = 0; r < reps; r++) {
            h.seq = (uint64_t)r + 1;
            fy_env_seal(&me->key, &h, msg + hl, size, msg);
            sink += fy_env_open(&me->key, msg, hl + size, &o, &off) == FY_ENV_OK ? off : 0;
        }
        t_open = (cpu_s() - t0) / reps - t_seal;
        if (sink < (size_t)reps * hl) printf("  (an encrypted message did not open)\n");
    }
    t0 = cpu_s();
    for (int r = 0; r < reps; r++) {
        o.seq = (uint64_t)r + 1;
        sink += fy_env_guard_admit(g, &o, o.ts_ms);
    }
    double t_guard = (cpu_s() - t0) / reps;
    /* the reference: copying the payload once, as every send already does */
    uint8_t *copy = fy_malloc(size ? size : 1);
    t0 = cpu_s();
    for (int r = 0; r < reps && copy; r++) {
        memcpy(copy, msg + hl, size);
        sink += copy[r % (size ? size : 1)];
    }
    double t_copy = (cpu_s() - t0) / reps;
    (void)sink;
    printf("  %-4s %6zu B   seal %8.0f ns   open %8.0f ns   guard %5.0f ns   seal+open+guard %8.0f ns   "
           "(%5.2f GB/s; a memcpy of the payload: %6.0f ns)\n",
           aead ? "aead" : "mac", size, t_seal * 1e9, t_open * 1e9, t_guard * 1e9, (t_seal + t_open + t_guard) * 1e9,
           2.0 * (double)size / ((t_seal + t_open) * 1e9), t_copy * 1e9);
    fy_free(copy);
    fy_env_guard_destroy(g);
    fy_free(buf);
}

/* ---- per round trip ---- */

typedef struct raw_server {
    nng_socket sk;
    pthread_t t;
    bool sealed; /* with the envelope (its replies encrypted when the request was) */
    fy_env_auth_t me;
    fy_env_keys_t *keys; /* the clients' keys, derived once, as rpc.c's server keeps them */
    fy_env_guard_t *guard;
} raw_server_t;

/* Echoes each request; sealed: opens, checks and seals the reply as fy_rpc would. */
static void *raw_server_main(void *arg)
{
    raw_server_t *s = arg;
    uint64_t seq = 0;
    for (;;) {
        nng_msg *m;
        if (nng_recvmsg(s->sk, &m, 0)) return NULL;
        if (s->sealed) {
            fy_env_hdr_t h;
            size_t off;
            uint8_t *b = nng_msg_body(m);
            size_t len = nng_msg_len(m);
            if (fy_env_open_as(&s->me, s->keys, b, len, &h, &off) ||
                fy_env_guard_admit(s->guard, &h, fy_env_now_ms())) {
                nng_msg_free(m);
                return NULL;
            }
            fy_env_hdr_t r;
            memset(&r, 0, sizeof(r));
            r.kind = FY_ENV_REPLY;
            r.role = s->me.role;
            snprintf(r.name, sizeof(r.name), "%s", s->me.name);
            r.to = (fy_env_peer_t){.role = h.role, .inc = h.inc};
            snprintf(r.to.name, sizeof(r.to.name), "%s", h.name);
            r.inc = s->me.inc;
            r.chan = 2;
            r.seq = ++seq;
            r.ts_ms = fy_env_now_ms();
            r.re_chan = h.chan;
            r.re_seq = h.seq;
            r.aead = h.aead;
            size_t rh = fy_env_header_bytes(&r);
            nng_msg *out;
            if (nng_msg_alloc(&out, rh + len - off)) return NULL;
            uint8_t *ob = nng_msg_body(out);
            memcpy(ob + rh, b + off, len - off);
            fy_env_seal_as(&s->me, s->keys, &r, ob + rh, len - off, ob);
            nng_msg_free(m);
            m = out;
        }
        if (nng_sendmsg(s->sk, m, 0)) {
            nng_msg_free(m);
            return NULL;
        }
    }
}

/* One round trip on a raw req socket; sealed: the client side of the envelope too (aead: encrypted). */
static bool raw_call(nng_socket sk, const fy_env_auth_t *me, bool sealed, bool aead, uint64_t seq,
                     const uint8_t *payload, size_t size)
{
    nng_msg *m;
    fy_env_hdr_t h;
    memset(&h, 0, sizeof(h));
    size_t hl = 0;
    if (sealed) {
        h.kind = FY_ENV_MSG;
        h.role = me->role;
        snprintf(h.name, sizeof(h.name), "%s", me->name);
        h.to = (fy_env_peer_t){.role = FY_ROLE_ROUTER, .name = "router"}; /* the raw server's identity */
        h.inc = me->inc;
        h.chan = 3;
        h.seq = seq;
        h.ts_ms = fy_env_now_ms();
        h.aead = aead;
        hl = fy_env_header_bytes(&h);
    }
    if (nng_msg_alloc(&m, hl + size)) return false;
    uint8_t *b = nng_msg_body(m);
    memcpy(b + hl, payload, size);
    if (sealed) fy_env_seal(&me->key, &h, b + hl, size, b);
    if (nng_sendmsg(sk, m, 0)) {
        nng_msg_free(m);
        return false;
    }
    if (nng_recvmsg(sk, &m, 0)) return false;
    bool ok = true;
    if (sealed) {
        fy_env_hdr_t r;
        size_t off;
        ok = fy_env_open(&me->key, nng_msg_body(m), nng_msg_len(m), &r, &off) == FY_ENV_OK && r.re_seq == seq &&
             r.aead == aead && nng_msg_len(m) - off == size;
    } else {
        ok = nng_msg_len(m) == size;
    }
    nng_msg_free(m);
    return ok;
}

static void fy_rpc_echo(void *arg, fy_rpc_call_t *call, const fy_env_hdr_t *from, const void *msg, size_t len)
{
    (void)arg, (void)from;
    fy_rpc_reply(call, msg, len);
}

static void summarize(const char *what, double *lat, int n)
{
    qsort(lat, (size_t)n, sizeof(double), cmp_double);
    double sum = 0;
    for (int i = 0; i < n; i++) sum += lat[i];
    printf("    %-34s mean %7.1f us   p50 %7.1f us   p99 %7.1f us\n", what, sum / n * 1e6, lat[n / 2] * 1e6,
           lat[(int)(n * 0.99)] * 1e6);
}

/* One URL per variant: a base URL's "-V" forms (ipc), or free TCP ports. */
static void variant_url(const char *base, int v, char *out, size_t cap)
{
    if (!strncmp(base, "ipc://", 6))
        snprintf(out, cap, "%s-%d", base, v);
    else
        snprintf(out, cap, "tcp://127.0.0.1:%d", free_port());
}

enum { V_RAW = 3, V_ALL = 5 }; /* raw: bare, MAC, AEAD; then fy_rpc with cluster.encrypt auto and always */

/*
 * The variants run side by side, in alternating blocks of 50 calls, so
 * that whatever else the machine does falls on all of them alike: a raw
 * req/rep pair bare (the reference), the same with the envelope (MAC) and
 * with the envelope encrypted (AEAD), and fy_rpc's server and client with
 * cluster.encrypt auto (on loopback: the MAC) and always (AEAD).
 */
static fy_status_t round_trips(const char *base, const fy_env_auth_t *client, const fy_env_auth_t *router, size_t size,
                               int reps)
{
    enum { BLOCK = 50 };
    uint8_t *payload = fy_malloc(size ? size : 1);
    double *lat[V_ALL];
    bool have_lat = true;
    for (int v = 0; v < V_ALL; v++) have_lat &= (lat[v] = fy_malloc((size_t)reps * sizeof(double))) != NULL;
    raw_server_t srv[V_RAW];
    memset(srv, 0, sizeof(srv));
    nng_socket cs[V_RAW];
    bool up[V_RAW] = {false}, dialed[V_RAW] = {false};
    fy_rpc_server_t *rsrv[2] = {NULL, NULL};
    fy_rpc_client_t *rc[2] = {NULL, NULL};
    fy_status_t st = payload && have_lat ? FY_OK : FY_ERR_NOMEM;
    for (size_t i = 0; i < size; i++) payload[i] = (uint8_t)i;
    char url[V_ALL][160];
    for (int v = 0; v < V_ALL; v++) variant_url(base, v, url[v], sizeof(url[v]));
    printf("  %zu B over %s:\n", size, !strncmp(base, "ipc://", 6) ? "ipc" : "tcp loopback");
    for (int v = 0; v < V_RAW && !st; v++) {
        srv[v].sealed = v > 0;
        srv[v].me = *router;
        if (fy_env_keys_create(&srv[v].keys) || fy_env_guard_create(64, fy_env_now_ms(), &srv[v].guard) ||
            nng_rep0_open(&srv[v].sk) || nng_listen(srv[v].sk, url[v], NULL, 0) ||
            pthread_create(&srv[v].t, NULL, raw_server_main, &srv[v])) {
            fprintf(stderr, "ferry-bench auth: cannot serve %s\n", url[v]);
            st = FY_ERR_IO;
            break;
        }
        up[v] = true;
        if (nng_req0_open(&cs[v]) || nng_dial(cs[v], url[v], NULL, 0))
            st = FY_ERR_IO;
        else
            dialed[v] = true;
    }
    for (int k = 0; k < 2 && !st; k++) { /* k = 1: cluster.encrypt = always on both ends */
        fy_env_auth_t r = *router, c = *client;
        r.crypt = c.crypt = k ? FY_ENV_CRYPT_ALWAYS : FY_ENV_CRYPT_AUTO;
        st = fy_rpc_server_create(url[V_RAW + k], 8, &r, FY_RPC_FROM(FY_ROLE_CLIENT), fy_rpc_echo, NULL, &rsrv[k]);
        if (!st) st = fy_rpc_client_create(url[V_RAW + k], &c, &rc[k]);
        fy_env_auth_wipe(&r);
        fy_env_auth_wipe(&c);
    }
    uint64_t seq = 0;
    for (int r = -reps / 10; r < reps && !st; r += BLOCK) { /* r < 0: warm-up */
        for (int v = 0; v < V_ALL && !st; v++) {
            for (int k = 0; k < BLOCK && !st; k++) {
                double t0 = fy_now_s();
                if (v < V_RAW) {
                    if (!raw_call(cs[v], client, v > 0, v == 2, ++seq, payload, size)) st = FY_ERR_PEER;
                } else {
                    void *rep;
                    size_t rl;
                    st = fy_rpc_call(rc[v - V_RAW], payload, size, 10.0, &rep, &rl);
                    if (!st) fy_free(rep);
                }
                if (r + k >= 0 && r + k < reps) lat[v][r + k] = fy_now_s() - t0;
            }
        }
    }
    for (int k = 0; k < 2; k++) {
        fy_rpc_client_destroy(rc[k]);
        fy_rpc_server_destroy(rsrv[k]);
    }
    for (int v = 0; v < V_RAW; v++) {
        if (dialed[v]) nng_close(cs[v]);
        if (up[v]) {
            nng_close(srv[v].sk);
            pthread_join(srv[v].t, NULL);
        }
        fy_env_guard_destroy(srv[v].guard);
        fy_env_keys_destroy(srv[v].keys);
    }
    if (!st) {
        summarize("raw nng req/rep, bare (reference)", lat[0], reps);
        summarize("raw nng req/rep, envelope (MAC)", lat[1], reps);
        summarize("raw nng req/rep, envelope (AEAD)", lat[2], reps);
        summarize("fy_rpc, encrypt=auto (MAC here)", lat[3], reps);
        summarize("fy_rpc, encrypt=always (AEAD)", lat[4], reps);
    }
    fy_free(payload);
    for (int v = 0; v < V_ALL; v++) fy_free(lat[v]);
    return st;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: ferry-bench auth [--reps N] [--rtt-reps N]\n"
               "  the control-plane envelope's cost per message and per request round trip\n"
               "      --reps N      messages sealed and opened per size (default 200000)\n"
               "      --rtt-reps N  round trips per variant (default 3000)\n"
               "  -h, --help\n");
}

int fy_bench_auth_main(int argc, char **argv)
{
    enum { O_REPS = 256, O_RTT_REPS };
    static const struct option opts[] = {
        {"reps", required_argument, 0, O_REPS},
        {"rtt-reps", required_argument, 0, O_RTT_REPS},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    int reps = 200000, rtt_reps = 3000;
    char *end;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case O_REPS:
        case O_RTT_REPS: {
            long v = strtol(optarg, &end, 10);
            if (end == optarg || *end || v < 100 || v > 100000000) {
                fprintf(stderr, "ferry-bench auth: --%s expects an integer from 100 to 100000000, got '%s'\n",
                        c == O_REPS ? "reps" : "rtt-reps", optarg);
                return 2;
            }
            *(c == O_REPS ? &reps : &rtt_reps) = (int)v;
            break;
        }
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "ferry-bench auth: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    fy_env_auth_t client, router;
    if (fy_env_auth_init(&client, SECRET, sizeof(SECRET), FY_ROLE_CLIENT, "ferry-bench", 0) ||
        fy_env_auth_init(&router, SECRET, sizeof(SECRET), FY_ROLE_ROUTER, "router", 0))
        return 1;
    static const size_t sizes[] = {200, 2048, 65536};
    printf("per message (one thread's CPU time; mac: BLAKE2b-128 keyed, aead: XChaCha20-Poly1305 with its key "
           "derived per message; libsodium):\n");
    for (int a = 0; a < 2; a++)
        for (int k = 0; k < 3; k++) per_message(&router, sizes[k], sizes[k] > 8192 ? reps / 20 : reps, a == 1);
    char dir[] = "/tmp/ferry-bench-auth-XXXXXX", url[128];
    if (!mkdtemp(dir)) {
        perror("ferry-bench auth: mkdtemp");
        return 1;
    }
    printf("per request round trip (client and server threads in this process; %d calls of each variant, "
           "interleaved in blocks of 50):\n",
           rtt_reps);
    int rc = 0;
    for (int t = 0; t < 2 && !rc; t++) {
        for (int k = 0; k < 3 && !rc; k++) {
            if (t == 0)
                snprintf(url, sizeof(url), "ipc://%s/s%d", dir, k);
            else
                snprintf(url, sizeof(url), "tcp://");
            if (round_trips(url, &client, &router, sizes[k], rtt_reps)) rc = 1;
        }
    }
    char sock[200];
    for (int k = 0; k < 3; k++)
        for (int v = 0; v < V_ALL; v++) {
            snprintf(sock, sizeof(sock), "%s/s%d-%d", dir, k, v);
            remove(sock);
        }
    remove(dir);
    fy_env_auth_wipe(&client);
    fy_env_auth_wipe(&router);
    return rc;
}

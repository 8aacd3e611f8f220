/*
 * test_auth.c - the control plane's authentication where the processes
 * meet it.  A decode worker, driven by this test playing its router with
 * the deployment's secret, takes commands only from a router role holding
 * that secret: commands without an envelope, sealed with another secret,
 * sent as another role, replayed byte for byte or altered in one byte are
 * refused and counted (its /metrics); a release without the worker's
 * incarnation in "to" is refused; a reserve asking for an hour gets the
 * worker's decode.max_lease; every event it sends names itself as the
 * envelope does.  Secret and API-key files that their group or others can
 * read stop the router and the workers at start with an error naming the
 * file and its mode; the secret is created O_EXCL, 0600, never through a
 * planted link.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/pipeline0/push.h>
#include <nng/protocol/reqrep0/req.h>

#include "common/clock.h"
#include "common/cluster.h"
#include "tests/cluster_util.h"
#include "common/envelope.h"
#include "common/mem.h"
#include "common/msg.h"
#include "rpc/rpc.h"
#include "tests/testutil.h"
#include "common/wire.h"

/* ---- the test as the worker's router ---- */

typedef struct seen {
    pthread_mutex_t mu;
    int loads;
    uint64_t inc;
    char name[64], listen[256];
    int32_t leases;        /* the latest load report's */
    uint64_t bad_commands; /* the latest load report's */
    int wrong_sender;      /* events whose worker/inc fields are not the envelope's sender */
    int n_reserved[16];    /* by request id */
    double lease_s[16];    /* what the worker granted, by request id */
    double t_reserved[16];
    int n_expired[16];
    double t_expired[16];
    int n_errors;
    char last_error[256];
} seen_t;

static void on_event(void *arg, const fy_env_hdr_t *from, const void *buf, size_t len)
{
    seen_t *s = arg;
    fy_msgr_t r;
    if (fy_msgr_parse(&r, buf, len)) {
        fy_msgr_free(&r);
        return;
    }
    char worker[64] = "", type[40];
    snprintf(type, sizeof(type), "%s", fy_msgr_type(&r));
    fy_msgr_str(&r, "worker", FY_OPT, "", worker, sizeof(worker));
    uint64_t inc = fy_msgr_u64(&r, "inc", FY_OPT, 0, 0, UINT64_MAX);
    uint64_t id = fy_msgr_u64(&r, "id", FY_OPT, 0, 0, UINT64_MAX);
    double now = fy_now_s();
    pthread_mutex_lock(&s->mu);
    if (strcmp(worker, from->name) || inc != from->inc || from->role != FY_ROLE_DECODE) s->wrong_sender++;
    if (!strcmp(type, "load")) {
        s->loads++;
        s->inc = inc;
        snprintf(s->name, sizeof(s->name), "%s", worker);
        fy_msgr_str(&r, "listen", FY_OPT, "", s->listen, sizeof(s->listen));
        s->leases = (int32_t)fy_msgr_i64(&r, "leases", FY_OPT, -1, -1, 1 << 20);
        s->bad_commands = fy_msgr_u64(&r, "bad_commands", FY_OPT, 0, 0, UINT64_MAX);
    } else if (!strcmp(type, "reserved") && id < 16) {
        s->n_reserved[id]++;
        s->lease_s[id] = fy_msgr_f64(&r, "lease_s", FY_OPT, -1, -1, 1e9);
        s->t_reserved[id] = now;
    } else if (!strcmp(type, "lease_expired") && id < 16) {
        s->n_expired[id]++;
        s->t_expired[id] = now;
    } else if (!strcmp(type, "error")) {
        s->n_errors++;
        fy_msgr_str(&r, "message", FY_OPT, "", s->last_error, sizeof(s->last_error));
    }
    pthread_mutex_unlock(&s->mu);
    fy_msgr_free(&r);
}

/* Waits (deadline_s) until cond holds of s; false past it. */
static bool wait_for(seen_t *s, bool (*cond)(seen_t *, void *), void *arg, double deadline_s)
{
    double t0 = fy_now_s();
    for (;;) {
        pthread_mutex_lock(&s->mu);
        bool ok = cond(s, arg);
        pthread_mutex_unlock(&s->mu);
        if (ok) return true;
        if (fy_now_s() - t0 > deadline_s) return false;
        usleep(10000);
    }
}

static bool has_load(seen_t *s, void *arg) { return s->loads > *(int *)arg; }
static bool has_no_lease(seen_t *s, void *arg) { return s->loads > *(int *)arg && s->leases == 0; }
static bool has_reserved(seen_t *s, void *arg) { return s->n_reserved[*(int *)arg] > 0; }
static bool has_expired(seen_t *s, void *arg) { return s->n_expired[*(int *)arg] > 0; }
static bool has_error(seen_t *s, void *arg) { return s->n_errors > *(int *)arg; }

/* A reserve command for request id (to: 0 leaves the field out). */
static size_t reserve_cmd(uint64_t to, uint64_t id, double lease_s, uint8_t *out, size_t cap)
{
    fy_msgw_t w;
    fy_msgw_init(&w, "reserve");
    if (to) fy_msgw_u64(&w, "to", to);
    fy_msgw_u64(&w, "rid", id);
    fy_msgw_u64(&w, "id", id);
    fy_msgw_str(&w, "tenant", "");
    int32_t toks[20];
    for (int i = 0; i < 20; i++) toks[i] = 100 + i * 7;
    fy_msgw_i32s(&w, "tokens", toks, 20);
    fy_msgw_i64(&w, "max_tokens", 4);
    fy_msgw_f64(&w, "lease_s", lease_s);
    void *buf;
    size_t len;
    assert_int_equal(fy_msgw_finish(&w, &buf, &len), FY_OK);
    assert_true(len <= cap);
    memcpy(out, buf, len);
    fy_free(buf);
    return len;
}

static size_t release_cmd(uint64_t to, uint64_t id, uint8_t *out, size_t cap)
{
    fy_msgw_t w;
    fy_msgw_init(&w, "release");
    if (to) fy_msgw_u64(&w, "to", to);
    fy_msgw_u64(&w, "id", id);
    void *buf;
    size_t len;
    assert_int_equal(fy_msgw_finish(&w, &buf, &len), FY_OK);
    assert_true(len <= cap);
    memcpy(out, buf, len);
    fy_free(buf);
    return len;
}

static double refused_metric(int port, const char *reason)
{
    char *body = NULL, series[128];
    assert_int_equal(tc_http(port, "GET", "/metrics", &body), 200);
    snprintf(series, sizeof(series), "ferry:control_messages_refused_total{reason=\"%s\"}", reason);
    double v = tc_metric(body, series);
    fy_free(body);
    return v;
}

static void test_decode_worker_commands(void **state)
{
    if (!tc_available()) skip();
    tc_cluster_t c;
    tc_opts_t o = {.n_prefill = 0,
                   .n_decode = 1,
                   .no_router = true,
                   .metrics = true,
                   .common = {"decode.max_lease=1500ms", "decode.kv_mem=32MiB"}};
    tc_start(&c, &o);
    seen_t s = {.mu = PTHREAD_MUTEX_INITIALIZER};
    fy_env_auth_t router, decode, wrong;
    assert_int_equal(fy_cluster_auth_file(c.secret, FY_ROLE_ROUTER, "router", 0, &router), FY_OK);
    assert_int_equal(fy_cluster_auth_file(c.secret, FY_ROLE_DECODE, "test-decode", 0, &decode), FY_OK);
    static const uint8_t other[32] = "not this deployment's secret...";
    assert_int_equal(fy_env_auth_init(&wrong, other, sizeof(other), FY_ROLE_ROUTER, "router", 0), FY_OK);
    fy_pull_t *events;
    assert_int_equal(fy_pull_create(c.events_url, &router, FY_RPC_FROM(FY_ROLE_DECODE), on_event, &s, &events), FY_OK);
    int zero = 0;
    if (!wait_for(&s, has_load, &zero, 60)) {
        tc_print_logs(&c);
        fail_msg("no load report from the decode worker within 60 s");
    }
    pthread_mutex_lock(&s.mu);
    uint64_t inc = s.inc;
    char listen[256];
    snprintf(listen, sizeof(listen), "%s", s.listen);
    pthread_mutex_unlock(&s.mu);
    fy_env_peer_t to_worker = {.role = FY_ROLE_DECODE};
    snprintf(to_worker.name, sizeof(to_worker.name), "%s", s.name);
    fy_push_t *cmd;
    assert_int_equal(fy_push_create(listen, 64, &router, &to_worker, &cmd), FY_OK);
    uint8_t m[2048], copy[2048];
    size_t n;

    /* 1. a reserve asking for an hour gets the worker's cap (1.5 s) */
    n = reserve_cmd(inc, 7, 3600, m, sizeof(m));
    assert_int_equal(fy_push_send(cmd, m, n), FY_OK);
    int id = 7;
    if (!wait_for(&s, has_reserved, &id, 20)) {
        tc_print_logs(&c);
        fail_msg("no reservation for request 7");
    }
    assert_true(s.lease_s[7] > 1.4 && s.lease_s[7] < 1.6);
    /* 2. a release without "to" is refused: the lease stays, and expires on its own */
    int errs = s.n_errors;
    n = release_cmd(0, 7, m, sizeof(m));
    assert_int_equal(fy_push_send(cmd, m, n), FY_OK);
    assert_true(wait_for(&s, has_error, &errs, 10));
    print_message("release without 'to': %s\n", s.last_error);
    assert_non_null(strstr(s.last_error, "'to'"));
    if (!wait_for(&s, has_expired, &id, 10)) {
        tc_print_logs(&c);
        fail_msg("the lease of request 7 did not expire: released without 'to', or not capped at 1.5 s");
    }
    double held = s.t_expired[7] - s.t_reserved[7];
    print_message("the lease asked for 3600 s lasted %.2f s\n", held);
    assert_true(held > 1.0 && held < 10.0);

    /* 3. forged commands straight at the command socket */
    nng_socket raw;
    assert_int_equal(nng_push0_open(&raw), 0);
    nng_socket_set_ms(raw, NNG_OPT_SENDTIMEO, 10000);
    assert_int_equal(nng_dial(raw, listen, NULL, 0), 0);
    n = reserve_cmd(inc, 8, 30, m, sizeof(m)); /* no envelope */
    assert_int_equal(nng_send(raw, m, n, 0), 0);
    n = reserve_cmd(inc, 8, 30, m, sizeof(m)); /* another secret */
    n = fy_test_seal(&wrong, &to_worker, 31, 1, 0, m, n, m);
    assert_int_equal(nng_send(raw, m, n, 0), 0);
    n = reserve_cmd(inc, 8, 30, m, sizeof(m)); /* the right secret, but not a router */
    n = fy_test_seal(&decode, &to_worker, 32, 1, 0, m, n, m);
    assert_int_equal(nng_send(raw, m, n, 0), 0);
    n = reserve_cmd(inc, 9, 30, m, sizeof(m)); /* the real thing, captured */
    n = fy_test_seal(&router, &to_worker, 33, 1, 0, m, n, m);
    memcpy(copy, m, n);
    assert_int_equal(nng_send(raw, m, n, 0), 0);
    id = 9;
    assert_true(wait_for(&s, has_reserved, &id, 20));
    assert_int_equal(nng_send(raw, copy, n, 0), 0); /* replayed */
    copy[n - 3] ^= 0x01;                            /* one byte of the payload altered */
    assert_int_equal(nng_send(raw, copy, n, 0), 0);
    double t0 = fy_now_s();
    int port = c.metrics_port[0];
    while (refused_metric(port, "format") < 1 || refused_metric(port, "mac") < 2 ||
           refused_metric(port, "identity") < 1 || refused_metric(port, "replay") < 1) {
        if (fy_now_s() - t0 > 20) {
            tc_print_logs(&c);
            fail_msg("the worker did not count every forged command");
        }
        usleep(50000);
    }
    nng_close(raw);
    /* a release that names the worker ends the lease at once */
    n = release_cmd(inc, 9, m, sizeof(m));
    assert_int_equal(fy_push_send(cmd, m, n), FY_OK);
    int loads = s.loads;
    assert_true(wait_for(&s, has_no_lease, &loads, 10)); /* a load report after the release */
    pthread_mutex_lock(&s.mu);
    assert_int_equal(s.leases, 0);
    assert_int_equal(s.n_reserved[8], 0); /* no forged reserve made a lease */
    assert_int_equal(s.n_reserved[9], 1); /* the replay made none either */
    assert_int_equal(s.n_expired[9], 0);
    assert_int_equal(s.wrong_sender, 0);
    pthread_mutex_unlock(&s.mu);
    fy_push_destroy(cmd);
    fy_pull_destroy(events);
    fy_env_auth_wipe(&router);
    fy_env_auth_wipe(&decode);
    fy_env_auth_wipe(&wrong);
    tc_stop(&c);
}

/* ---- client keys (issue 32 item 3) ---- */

/* payload as "who" (role, name, inc) to "to", sealed with whatever key
 * holder has for it (fy_test_seal), on the raw socket sk; for a req socket
 * (reply set) the answer: 1 answered, 0 refused (*reason), -1 nothing. */
static int forge(nng_socket sk, const fy_env_auth_t *holder, int role, const char *name, uint64_t inc,
                 const fy_env_peer_t *to, uint64_t chan, const void *payload, size_t len, bool reply,
                 fy_env_fault_t *reason)
{
    fy_env_auth_t as = *holder; /* a client's key under another identity: its own key is all it has */
    as.role = (fy_env_role_t)role;
    snprintf(as.name, sizeof(as.name), "%s", name);
    as.inc = inc;
    if (holder->master) /* the secret: the key of that identity, as every holder of it could derive */
        fy_env_identity_key(&holder->ctl, role, name, &as.key);
    uint8_t m[4096];
    size_t n = fy_test_seal(&as, to, chan, 1, 0, payload, len, m);
    fy_env_auth_wipe(&as);
    assert_int_equal(nng_send(sk, m, n, 0), 0);
    if (!reply) return -1;
    void *r;
    size_t rl;
    if (nng_recv(sk, &r, &rl, NNG_FLAG_ALLOC)) return -1;
    fy_env_hdr_t h;
    size_t off;
    int got = -1;
    if (fy_env_parse(r, rl, &h, &off) == FY_ENV_OK) {
        got = h.kind == FY_ENV_REPLY;
        if (h.kind == FY_ENV_REFUSAL && reason) *reason = h.reason;
    }
    nng_free(r, rl);
    return got;
}

static size_t msgw_bytes(fy_msgw_t *w, uint8_t *out, size_t cap)
{
    void *buf;
    size_t len;
    assert_int_equal(fy_msgw_finish(w, &buf, &len), FY_OK);
    assert_true(len <= cap);
    memcpy(out, buf, len);
    fy_free(buf);
    return len;
}

static size_t load_as(const char *name, uint64_t inc, const char *model, uint8_t *out, size_t cap)
{
    fy_msgw_t w;
    fy_msgw_init(&w, "load");
    fy_msgw_str(&w, "worker", name);
    fy_msgw_u64(&w, "inc", inc);
    fy_msgw_str(&w, "role", "decode");
    fy_msgw_str(&w, "listen", "ipc:///nonexistent/fake-decode");
    fy_msgw_str(&w, "model", model);
    fy_msgw_i64(&w, "block_size", 16);
    fy_msgw_i64(&w, "max_seqs", 32);
    fy_msgw_i64(&w, "total_blocks", 100000);
    fy_msgw_i64(&w, "admittable", 100000);
    fy_msgw_i64(&w, "capacity", 100000);
    return msgw_bytes(&w, out, cap);
}

static bool listed(tc_cluster_t *c, const char *name)
{
    fy_client_status_t st;
    tc_status(c, &st);
    for (int i = 0; i < st.n_workers; i++)
        if (!strcmp(st.workers[i].name, name)) return true;
    return false;
}

/* Runs bin/ferry with args (NULL-terminated); its exit status. */
static int run_ferry(const char *const *args)
{
    char path[600];
    const char *dir = getenv("FERRY_BIN");
    snprintf(path, sizeof(path), "%s/ferry", dir && *dir ? dir : "bin");
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char *argv[24];
        int n = 0;
        argv[n++] = path;
        for (int i = 0; args[i] && n < 23; i++) argv[n++] = (char *)args[i];
        argv[n] = NULL;
        int fd = open("/dev/null", O_WRONLY);
        if (fd >= 0) dup2(fd, 1), close(fd);
        execv(path, argv);
        _exit(127);
    }
    int ws;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : 128;
}

/* Every `ferry request` user held the deployment's secret, and with it
 * could read and cancel other clients' requests, end and start work on
 * the workers, and pose as a worker.  With a client key file (`ferry key
 * --client NAME`), each of those attacks is refused (mac: the client has
 * no key for that identity); the same forgery with the secret, what a
 * client held before, is accepted (the control).  The key file itself
 * works for its own requests (`ferry request --key`). */
static void test_client_key_attacks(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    tc_cluster_t c;
    tc_opts_t o = {.n_prefill = 1, .n_decode = 1, .metrics = true};
    tc_start(&c, &o);
    char alice_key[600], mallory_key[600];
    snprintf(alice_key, sizeof(alice_key), "%s/alice.key", c.dir);
    snprintf(mallory_key, sizeof(mallory_key), "%s/mallory.key", c.dir);
    const char *ka[] = {"key", "--client", "alice", "-o", alice_key, "--secret", c.secret, NULL};
    const char *km[] = {"key", "--client", "mallory", "-o", mallory_key, "--secret", c.secret, NULL};
    assert_int_equal(run_ferry(ka), 0);
    assert_int_equal(run_ferry(km), 0);
    assert_int_not_equal(run_ferry(ka), 0); /* never overwritten */
    struct stat sb;
    assert_int_equal(stat(alice_key, &sb), 0);
    assert_int_equal(sb.st_mode & 07777, 0600);
    /* a key file is a client's only: no router, no worker starts with one */
    fy_env_auth_t alice, mallory, root, x;
    fy_test_log_begin();
    assert_int_equal(fy_cluster_auth_file(alice_key, FY_ROLE_ROUTER, "router", 0, &x), FY_ERR_INVALID);
    fy_test_log_end();
    assert_true(fy_test_log_has(alice_key, "speaks only as a client", NULL));
    assert_int_equal(fy_cluster_auth_file(alice_key, FY_ROLE_CLIENT, "ignored", 0, &alice), FY_OK);
    assert_string_equal(alice.name, "alice"); /* the file names the client */
    assert_false(alice.master);
    assert_int_equal(fy_cluster_auth_file(mallory_key, FY_ROLE_CLIENT, "ignored", 0, &mallory), FY_OK);
    assert_int_equal(fy_cluster_auth_file(c.secret, FY_ROLE_CLIENT, "mallory", 0, &root), FY_OK);
    /* the key file works: ferry request --key, end to end */
    const char *rq[] = {"request", "-r", c.router_url, "--key", alice_key, "-p", "hello", "-n", "2", "-q", NULL};
    assert_int_equal(run_ferry(rq), 0);
    /* alice's long request, through her key */
    fy_rpc_client_t *ac;
    assert_int_equal(fy_rpc_client_create(c.router_url, &alice, &ac), FY_OK);
    int32_t toks[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    fy_wire_generate_t g;
    fy_wire_generate_init(&g);
    g.has_tokens = true, g.tokens = toks, g.n_tokens = 8;
    g.gen.max_tokens = 8192;
    g.gen.ignore_eos = true;
    fy_msgw_t w;
    fy_wire_generate_write(&w, &g);
    uint8_t buf[4096];
    size_t n = msgw_bytes(&w, buf, sizeof(buf));
    void *rep;
    size_t rl;
    assert_int_equal(fy_rpc_call(ac, buf, n, 10.0, &rep, &rl), FY_OK);
    fy_msgr_t r;
    assert_int_equal(fy_msgr_parse(&r, rep, rl), FY_OK);
    uint64_t id = fy_msgr_u64(&r, "id", FY_REQ, 0, 0, UINT64_MAX);
    if (!fy_msgr_ok(&r) || !id) {
        char msg[256] = "";
        fy_msgr_str(&r, "message", FY_OPT, "", msg, sizeof(msg));
        fail_msg("generate answered %s: %s", fy_msgr_type(&r), msg);
    }
    fy_msgr_free(&r);
    fy_free(rep);

    nng_socket rq_sk, ev_sk, cmd_sk;
    assert_int_equal(nng_req0_open(&rq_sk), 0);
    nng_socket_set_ms(rq_sk, NNG_OPT_RECVTIMEO, 10000);
    assert_int_equal(nng_dial(rq_sk, c.router_url, NULL, 0), 0);
    assert_int_equal(nng_push0_open(&ev_sk), 0);
    assert_int_equal(nng_dial(ev_sk, c.events_url, NULL, 0), 0);
    char cmd_url[600];
    snprintf(cmd_url, sizeof(cmd_url), "ipc://%s/decode-0", c.dir);
    assert_int_equal(nng_push0_open(&cmd_sk), 0);
    assert_int_equal(nng_dial(cmd_sk, cmd_url, NULL, 0), 0);
    const fy_env_peer_t to_router = {.role = FY_ROLE_ROUTER, .name = "router"};
    const fy_env_peer_t to_decode = {.role = FY_ROLE_DECODE, .name = "decode-0"};
    fy_client_status_t s0;
    tc_status(&c, &s0);
    fy_test_log_begin();
    /* 1. poll and cancel alice's request, in her name (her incarnation sniffed) */
    fy_wire_poll_t pm = {.id = id, .wait_s = 0};
    fy_wire_poll_write(&w, &pm);
    size_t np = msgw_bytes(&w, buf, sizeof(buf));
    uint8_t poll[512];
    memcpy(poll, buf, np);
    fy_env_fault_t why = FY_ENV_OK;
    int polled = forge(rq_sk, &mallory, FY_ROLE_CLIENT, "alice", alice.inc, &to_router, 101, poll, np, true, &why);
    assert_int_equal(polled, 0);
    assert_int_equal(why, FY_ENV_MAC);
    fy_wire_cancel_t cm = {.id = id};
    fy_wire_cancel_write(&w, &cm);
    size_t nc = msgw_bytes(&w, buf, sizeof(buf));
    int cancelled = forge(rq_sk, &mallory, FY_ROLE_CLIENT, "alice", alice.inc, &to_router, 102, buf, nc, true, &why);
    assert_int_equal(cancelled, 0);
    /* the control: the secret reads alice's request */
    int polled_root = forge(rq_sk, &root, FY_ROLE_CLIENT, "alice", alice.inc, &to_router, 103, poll, np, true, &why);
    /* 2. the router's voice to the decode worker: release and reserve */
    n = release_cmd(1, id, buf, sizeof(buf));
    forge(cmd_sk, &mallory, FY_ROLE_ROUTER, "router", 1, &to_decode, 104, buf, n, false, NULL);
    n = reserve_cmd(1, 4242, 30, buf, sizeof(buf));
    forge(cmd_sk, &mallory, FY_ROLE_ROUTER, "router", 1, &to_decode, 105, buf, n, false, NULL);
    /* 3. a load report in the decode worker's name, and a fake decode worker */
    n = load_as("decode-0", 77, "not-this-model", buf, sizeof(buf));
    forge(ev_sk, &mallory, FY_ROLE_DECODE, "decode-0", 77, &to_router, 106, buf, n, false, NULL);
    n = load_as("fake-decode", 78, "not-this-model", buf, sizeof(buf));
    forge(ev_sk, &mallory, FY_ROLE_DECODE, "fake-decode", 78, &to_router, 107, buf, n, false, NULL);
    /* the control: the secret registers a fake decode worker */
    n = load_as("fake-decode-root", 79, "not-this-model", buf, sizeof(buf));
    forge(ev_sk, &root, FY_ROLE_DECODE, "fake-decode-root", 79, &to_router, 108, buf, n, false, NULL);
    double t0 = fy_now_s();
    while (!listed(&c, "fake-decode-root") && fy_now_s() - t0 < 20) usleep(50000);
    int port = c.metrics_port[1]; /* decode-0's */
    t0 = fy_now_s();
    while (refused_metric(port, "mac") < 2 && fy_now_s() - t0 < 20) usleep(50000);
    fy_test_log_end();
    fy_client_status_t s1;
    tc_status(&c, &s1);
    int worker_mac = (int)refused_metric(port, "mac");
    bool fake = listed(&c, "fake-decode"), fake_root = listed(&c, "fake-decode-root");
    print_message("with a client key: poll of another's request %s, cancel %s, release/reserve to the worker: %d of 2 "
                  "refused (mac), load as decode-0 and a fake decode worker: %llu refused (mac), fake worker listed: "
                  "%s\n",
                  polled ? "answered" : "refused", cancelled ? "answered" : "refused", worker_mac,
                  (unsigned long long)(s1.refused_messages[FY_ENV_MAC] - s0.refused_messages[FY_ENV_MAC]),
                  fake ? "yes" : "no");
    print_message("with the secret (before): poll of another's request %s, fake worker listed: %s\n",
                  polled_root == 1 ? "answered" : "refused", fake_root ? "yes" : "no");
    assert_int_equal(worker_mac, 2);
    assert_true(s1.refused_messages[FY_ENV_MAC] - s0.refused_messages[FY_ENV_MAC] >= 4); /* 2 calls, 2 events */
    assert_false(fake);
    assert_int_equal(polled_root, 1);
    assert_true(fake_root);
    /* alice's request was neither cancelled nor released: she still reads it */
    fy_wire_poll_write(&w, &pm);
    n = msgw_bytes(&w, buf, sizeof(buf));
    assert_int_equal(fy_rpc_call(ac, buf, n, 10.0, &rep, &rl), FY_OK);
    assert_int_equal(fy_msgr_parse(&r, rep, rl), FY_OK);
    assert_string_not_equal(fy_msgr_type(&r), "error");
    fy_msgr_free(&r);
    fy_free(rep);
    fy_wire_cancel_t own = {.id = id};
    fy_wire_cancel_write(&w, &own);
    n = msgw_bytes(&w, buf, sizeof(buf));
    assert_int_equal(fy_rpc_call(ac, buf, n, 10.0, &rep, &rl), FY_OK);
    fy_free(rep);
    nng_close(rq_sk);
    nng_close(ev_sk);
    nng_close(cmd_sk);
    fy_rpc_client_destroy(ac);
    /* a key file others can read is refused as the secret is, naming it */
    assert_int_equal(chmod(alice_key, 0644), 0);
    fy_test_log_begin();
    assert_int_equal(fy_cluster_auth_file(alice_key, FY_ROLE_CLIENT, "x", 0, &x), FY_ERR_INVALID);
    fy_test_log_end();
    assert_true(fy_test_log_has("client key file", alice_key, "mode 0644", NULL));
    fy_env_auth_wipe(&alice);
    fy_env_auth_wipe(&mallory);
    fy_env_auth_wipe(&root);
    tc_stop(&c);
}

/* Issue 32 item 5 on the real processes: 40 connections holding 8 MiB
 * frames grew the router 20 -> 340 MiB, 80 grew a decode worker 648 ->
 * 1,288 MiB.  Now the router's client port refuses frames over its
 * largest message at once and takes at most 32 connections that have not
 * authenticated, closed at its deadline (10 s); the decode worker's
 * command port takes at most 16 (30 s). */
static void test_preauth_memory_processes(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    tc_cluster_t c;
    tc_opts_t o = {.n_prefill = 1, .n_decode = 1};
    tc_start(&c, &o);
    int router_pid = 0, decode_pid = 0;
    for (int i = 0; i < c.n_procs; i++) {
        if (!strcmp(c.procs[i].name, "router")) router_pid = (int)c.procs[i].pid;
        if (!strcmp(c.procs[i].name, "decode-0")) decode_pid = (int)c.procs[i].pid;
    }
    assert_true(router_pid > 0 && decode_pid > 0);
    assert_int_equal(strncmp(c.router_url, "ipc://", 6), 0);
    char cmd_path[600];
    snprintf(cmd_path, sizeof(cmd_path), "%s/decode-0", c.dir);
    enum { NR = 40, ND = 80 };
    static int fds[ND];
    /* the router: 8 MiB frames (over the client port's largest message) */
    long r0 = fy_test_rss_kib(router_pid);
    for (int i = 0; i < NR; i++) fds[i] = fy_test_hold_frame(c.router_url + 6, 0x30, (8u << 20) - 1, (8u << 20) - 2);
    int r_open_big = fy_test_wait_open_at_most(fds, NR, 0);
    long r_big = fy_test_rss_kib(router_pid) - r0;
    for (int i = 0; i < NR; i++)
        if (fds[i] >= 0) close(fds[i]);
    /* and 1 MiB frames (under it): at most FY_RPC_PENDING held */
    r0 = fy_test_rss_kib(router_pid);
    for (int i = 0; i < NR; i++) fds[i] = fy_test_hold_frame(c.router_url + 6, 0x30, 1u << 20, (1u << 20) - 1);
    int r_open_small = fy_test_wait_open_at_most(fds, NR, FY_RPC_PENDING);
    long r_small = fy_test_rss_kib(router_pid) - r0;
    for (int i = 0; i < NR; i++)
        if (fds[i] >= 0) close(fds[i]);
    /* the decode worker's command port: 80 connections with 8 MiB frames */
    long d0 = fy_test_rss_kib(decode_pid);
    for (int i = 0; i < ND; i++) fds[i] = fy_test_hold_frame(cmd_path, 0x50, (8u << 20) - 1, (8u << 20) - 2);
    int d_open = fy_test_wait_open_at_most(fds, ND, 15);
    long d_big = fy_test_rss_kib(decode_pid) - d0;
    for (int i = 0; i < ND; i++)
        if (fds[i] >= 0) close(fds[i]);
    print_message("router: %d connections with 8 MiB frames: %d held, RSS +%ld KiB; with 1 MiB frames: %d held, RSS "
                  "+%ld KiB\n",
                  NR, r_open_big, r_big, r_open_small, r_small);
    print_message("decode worker: %d connections with 8 MiB frames: %d held, RSS +%ld KiB\n", ND, d_open, d_big);
    assert_int_equal(r_open_big, 0);
    assert_true(r_big < 32 * 1024);
    assert_true(r_open_small <= FY_RPC_PENDING);
    assert_true(r_small < (FY_RPC_PENDING + 16) * 1024);
    /* the decode port's largest command (an adopt's kept logits, 2^20 in
     * wire.c's table) is not below 8 MiB: the cap on unauthenticated
     * connections (16, one of them the router's) bounds it, for 30 s */
    assert_true(d_open < 16);
    assert_true(d_big < 16 * 8 * 1024 + 16 * 1024);
    /* and the cluster still serves */
    const char *rq[] = {"request", "-r", c.router_url, "--secret", c.secret, "-p", "hello", "-n", "2", "-q", NULL};
    assert_int_equal(run_ferry(rq), 0);
    tc_stop(&c);
}

/* ---- files others can read ---- */

/* Runs a daemon to its end (60 s at most); its exit status, its log in log. */
static int run_daemon(const char *bin, const char *conf, const char *const *sets, const char *log)
{
    char path[600];
    const char *dir = getenv("FERRY_BIN");
    snprintf(path, sizeof(path), "%s/%s", dir && *dir ? dir : "bin", bin);
    pid_t parent = getpid(), pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        char *argv[16];
        int na = 0;
        argv[na++] = path, argv[na++] = "-c", argv[na++] = (char *)conf;
        for (int i = 0; sets && sets[i] && na < 14; i++) argv[na++] = "--set", argv[na++] = (char *)sets[i];
        argv[na] = NULL;
        execv(path, argv);
        _exit(127);
    }
    double t0 = fy_now_s();
    int status;
    while (waitpid(pid, &status, WNOHANG) == 0) {
        if (fy_now_s() - t0 > 60) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            fail_msg("%s did not stop by itself", bin);
        }
        usleep(20000);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void expect_log(const char *log, const char *a, const char *b)
{
    size_t len;
    char *t = fy_test_read_file(log, &len);
    assert_non_null(t);
    if (!strstr(t, a) || !strstr(t, b)) fail_msg("the log lacks '%s' and '%s':\n%s", a, b, t);
    fy_free(t);
}

static void test_open_files_refused_at_start(void **state)
{
    if (!tc_available()) skip();
    char dir[256], secret[320], keys[320], conf[320], log[320];
    snprintf(dir, sizeof(dir), "%s", fy_test_tmpdir());
    snprintf(secret, sizeof(secret), "%s/kv.secret", dir);
    snprintf(keys, sizeof(keys), "%s/keys.txt", dir);
    snprintf(conf, sizeof(conf), "%s/c.ini", dir);
    snprintf(log, sizeof(log), "%s/daemon.log", dir);
    assert_int_equal(fy_cluster_make_secret(secret), FY_OK);
    const char *k = "key-for-tests-0001 alpha\n";
    assert_true(fy_test_write_file(keys, k, strlen(k)));
    FILE *f = fopen(conf, "w");
    assert_non_null(f);
    fprintf(f,
            "[model]\npath = %s\n[kv]\nsecret_file = %s\n[router]\nlisten = ipc://%s/r\nevents = ipc://%s/e\n"
            "http = http://127.0.0.1:%d\n[decode]\nlisten = ipc://%s/d\nkv_mem = 32MiB\nthreads = 1\n",
            tc_model(), secret, dir, dir, tc_free_port(), dir);
    fclose(f);
    /* the secret readable by the group: the router and a worker refuse it */
    assert_int_equal(chmod(secret, 0640), 0);
    assert_int_equal(run_daemon("ferry-router", conf, NULL, log), 1);
    expect_log(log, secret, "mode 0640");
    assert_int_equal(run_daemon("ferry-decode", conf, NULL, log), 1);
    expect_log(log, secret, "mode 0640");
    /* the key file readable by everyone: the router refuses it */
    assert_int_equal(chmod(secret, 0600), 0);
    assert_int_equal(chmod(keys, 0644), 0);
    char set_keys[400];
    snprintf(set_keys, sizeof(set_keys), "router.api_keys=%s", keys);
    const char *sets[] = {set_keys, NULL};
    assert_int_equal(run_daemon("ferry-router", conf, sets, log), 1);
    expect_log(log, keys, "mode 0644");
    fy_test_tmpdir_remove();
}

static void test_secret_file(void **state)
{
    const char *dir = fy_test_tmpdir();
    char path[320], link[320], target[320];
    snprintf(path, sizeof(path), "%s/kv.secret", dir);
    /* made once, the owner's alone, 32 bytes; made again: kept as it is */
    assert_int_equal(fy_cluster_make_secret(path), FY_OK);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_mode & 07777, 0600);
    assert_int_equal(sb.st_size, 32);
    size_t len;
    char *before = fy_test_read_file(path, &len);
    assert_int_equal(fy_cluster_make_secret(path), FY_OK);
    char *after = fy_test_read_file(path, &len);
    assert_memory_equal(before, after, 32);
    fy_free(before);
    fy_free(after);
    fy_env_auth_t a;
    assert_int_equal(fy_cluster_auth_file(path, FY_ROLE_ROUTER, "router", 0, &a), FY_OK);
    /* others can read it, or write it: refused, naming the file and the mode */
    for (int k = 0; k < 3; k++) {
        mode_t modes[3] = {0640, 0604, 0620};
        assert_int_equal(chmod(path, modes[k]), 0);
        char want[16];
        snprintf(want, sizeof(want), "mode %04o", (unsigned)modes[k]);
        fy_test_log_begin();
        assert_int_equal(fy_cluster_make_secret(path), FY_ERR_INVALID);
        assert_int_equal(fy_cluster_auth_file(path, FY_ROLE_ROUTER, "router", 0, &a), FY_ERR_INVALID);
        fy_test_log_end();
        assert_true(fy_test_log_has(path, want, "chmod 600", NULL));
    }
    /* too short to be a secret */
    snprintf(path, sizeof(path), "%s/short.secret", dir);
    assert_true(fy_test_write_file(path, "0123456789", 10));
    fy_test_log_begin();
    assert_int_equal(fy_cluster_make_secret(path), FY_ERR_FORMAT);
    fy_test_log_end();
    /* a link planted where the secret goes: nothing is written through it */
    snprintf(link, sizeof(link), "%s/planted.secret", dir);
    snprintf(target, sizeof(target), "%s/attacker-reads-this", dir);
    assert_int_equal(symlink(target, link), 0);
    fy_test_log_begin();
    assert_int_not_equal(fy_cluster_make_secret(link), FY_OK);
    fy_test_log_end();
    assert_int_equal(access(target, F_OK), -1);
    fy_env_auth_wipe(&a);
    fy_test_tmpdir_remove();
}

/* fy_cluster_auth_file(path) in a child that gets 3 s: its status, or -1
 * when it blocked (killed by the alarm). */
static int auth_file_in_child(const char *path)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        alarm(3);
        fy_env_auth_t a;
        fy_status_t st = fy_cluster_auth_file(path, FY_ROLE_ROUTER, "router", 0, &a);
        _exit(st == FY_OK ? 0 : 10 + (int)-st);
    }
    int ws;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
}

/* Issue 32 item 13: a FIFO blocked open() forever, a file over 64 bytes
 * was cut to its first 64 silently, and a file owned by another user was
 * taken.  Each is refused now, naming kv.secret_file, the path and why. */
static void test_secret_file_kinds(void **state)
{
    (void)state;
    const char *dir = fy_test_tmpdir();
    char path[320];
    fy_env_auth_t a;
    /* a FIFO: refused at once, not waited on */
    snprintf(path, sizeof(path), "%s/fifo.secret", dir);
    assert_int_equal(mkfifo(path, 0600), 0);
    double t0 = fy_now_s();
    int rc = auth_file_in_child(path);
    assert_int_not_equal(rc, -1); /* before the fix: blocked in open() until the alarm */
    assert_int_not_equal(rc, 0);
    assert_true(fy_now_s() - t0 < 2.0);
    fy_test_log_begin();
    assert_int_equal(fy_cluster_auth_file(path, FY_ROLE_ROUTER, "router", 0, &a), FY_ERR_INVALID);
    fy_test_log_end();
    assert_true(fy_test_log_has("kv.secret_file", path, "not a regular file", "FIFO", NULL));
    /* 65 bytes: refused naming the size, never cut to the first 64 */
    char big[65];
    memset(big, 'k', sizeof(big));
    snprintf(path, sizeof(path), "%s/long.secret", dir);
    assert_true(fy_test_write_file(path, big, sizeof(big)));
    assert_int_equal(chmod(path, 0600), 0);
    fy_test_log_begin();
    assert_int_equal(fy_cluster_auth_file(path, FY_ROLE_ROUTER, "router", 0, &a), FY_ERR_FORMAT);
    fy_test_log_end();
    assert_true(fy_test_log_has("kv.secret_file", path, "65 bytes", "at most 64", NULL));
    /* exactly 64: taken */
    assert_true(fy_test_write_file(path, big, 64));
    assert_int_equal(chmod(path, 0600), 0);
    assert_int_equal(fy_cluster_auth_file(path, FY_ROLE_ROUTER, "router", 0, &a), FY_OK);
    /* owned by another user (only root can make one): refused naming the owner */
    if (geteuid() == 0) {
        assert_int_equal(chown(path, 4321, 4321), 0);
        fy_test_log_begin();
        assert_int_equal(fy_cluster_auth_file(path, FY_ROLE_ROUTER, "router", 0, &a), FY_ERR_INVALID);
        fy_test_log_end();
        assert_true(fy_test_log_has("kv.secret_file", path, "owned by uid 4321", NULL));
    }
    fy_env_auth_wipe(&a);
    fy_test_tmpdir_remove();
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_secret_file),
        cmocka_unit_test(test_secret_file_kinds),
        cmocka_unit_test(test_open_files_refused_at_start),
        cmocka_unit_test(test_decode_worker_commands),
        cmocka_unit_test(test_client_key_attacks),
        cmocka_unit_test(test_preauth_memory_processes),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    fy_test_tmpdir_remove();
    return rc;
}

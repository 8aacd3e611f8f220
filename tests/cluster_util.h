/*
 * cluster_util.h - a ferry cluster of real processes for tests: a router,
 * prefill and decode workers (bin/ferry-*), each logging to a file, all
 * killed if the test dies; a client to it; the reference tokens of the
 * single-process engine to compare against.
 */
#ifndef FY_CLUSTER_UTIL_H
#define FY_CLUSTER_UTIL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "router/client.h"
#include "rpc/etcd.h"
#include "kv/evict.h"

#define TC_MAX_PROCS 8
#define TC_MAX_ROUTERS 2
/* prefill.max_batch_tokens of tc_start's clusters.  A worker answers
 * commands between engine steps, and a sanitizer build's step is several
 * times slower (ASan prefill of SmolLM2 on one CPU: 47 against 311 tok/s
 * in release, 2026-11-29): at 256 tokens, two prefill workers sharing a
 * CPU took 11 s a step and missed the 15-s command timeout
 * (test_loopback_same_tokens), so sanitizer builds step 64 tokens. */
#ifdef FY_DEBUG
#define TC_PREFILL_STEP 64
#else
#define TC_PREFILL_STEP 256
#endif

typedef struct tc_proc {
    char name[32];
    char log[512];
    pid_t pid;
    bool killed;     /* by the test, on purpose */
    char args[4096]; /* its command line, NUL-separated, for tc_restart */
    int n_args;
    const char *const *wrap;
} tc_proc_t;

typedef struct tc_cluster {
    char dir[256];
    char conf[512];
    char router_url[512], events_url[512];
    char router_urls[TC_MAX_ROUTERS][512]; /* [0] is router_url; more with n_routers */
    int n_routers;
    char secret[512]; /* the deployment's secret file (kv.secret_file) */
    tc_proc_t procs[TC_MAX_PROCS];
    int n_procs;
    int n_prefill, n_decode;
    int metrics_port[TC_MAX_PROCS]; /* per worker (prefill 0.., then decode 0..); 0: none */
    fy_client_t *client;
} tc_cluster_t;

typedef struct tc_opts {
    int n_prefill, n_decode;
    const char *model; /* the model file; NULL: the default model (tc_model) */
    /* extra "section.key=value" settings for every process, and per worker
     * (indexed prefill 0.., then decode 0..) */
    const char *common[16];
    const char *per_worker[TC_MAX_PROCS][8];
    /* addresses: NULL for ipc:// in the test's directory */
    const char *router_url, *events_url;
    const char *worker_url[TC_MAX_PROCS];
    const char *const *wrap[TC_MAX_PROCS + 1]; /* [0] router, then workers */
    bool metrics;                              /* every worker serves /metrics and /health on a free loopback port */
    bool no_router; /* workers only: the test plays the router on events_url (no client, no wait) */
    /* routers (0: 1): more than one needs cluster.etcd in common; router i
     * > 0 is named "router-i", listens on ipc://DIR/router-i and takes
     * events on ipc://DIR/events-i */
    int n_routers;
} tc_opts_t;

/* The binaries' directory ($FERRY_BIN or bin) and the default model, or
 * false (with a message) when either is missing: the test then skips. */
bool tc_available(void);
/* The binaries alone (for a test that writes its own model). */
bool tc_bins_available(void);
const char *tc_model(void);

/* Starts the processes and waits (up to a minute) until every worker has
 * reported to the router; fails the test otherwise, printing the logs.
 * With no_router, starts the workers and returns at once. */
void tc_start(tc_cluster_t *c, const tc_opts_t *o);
/* SIGTERM to all, a clean exit expected from every process the test did
 * not kill; SIGKILL after a deadline (a failure). */
void tc_stop(tc_cluster_t *c);
/* kill -9 of one process by name ("prefill-0"); the test expects it dead. */
void tc_kill(tc_cluster_t *c, const char *name);
bool tc_alive(tc_cluster_t *c, const char *name);
/* The live (not zombie) children of ppid, into out[0..cap): a worker's
 * follower ranks (worker.tp/pp).  Returns how many. */
int tc_children_of(pid_t ppid, pid_t *out, int cap);
/* Starts a process the test killed again, with the same command line. */
void tc_restart(tc_cluster_t *c, const char *name);
void tc_print_logs(const tc_cluster_t *c);

/* Router status; fails the test if the router does not answer. */
void tc_status(tc_cluster_t *c, fy_client_status_t *s);
/* Waits until the named worker's admittable blocks equal want (the router
 * sees load reports every heartbeat); false after timeout_s. */
bool tc_wait_admittable(tc_cluster_t *c, const char *name, int32_t want, double timeout_s);

/* One request's outcome. */
typedef struct tc_result {
    int32_t tokens[2048];
    int32_t n;
    bool done;
    fy_status_t error;
    char message[256];
    char finish[16];
    fy_client_timings_t timings;
} tc_result_t;

/* Polls every stream until all are done (deadline timeout_s; the test
 * fails past it). */
void tc_collect(tc_cluster_t *c, fy_client_stream_t *s, tc_result_t *res, int n, double timeout_s);

/* The single-process engine's greedy tokens for each prompt (batch
 * invariance makes one batched run equal to each alone). */
void tc_reference(const char *model, int32_t *const *prompts, const int32_t *lens, const int32_t *max_tokens, int n,
                  tc_result_t *res);

/* tc_reference under a KV budget: the engine's eviction (evict.h), each
 * request's kv_budget (NULL: the engine's), and one request at a time in
 * prompt chunks of max_batch_tokens (0: 512), so that the points where
 * eviction runs are those of a worker serving them one by one. */
typedef struct tc_ref_opts {
    fy_evict_params_t evict;
    const int32_t *kv_budget;
    int32_t max_batch_tokens;
} tc_ref_opts_t;
void tc_reference_opts(const char *model, int32_t *const *prompts, const int32_t *lens, const int32_t *max_tokens,
                       int n, const tc_ref_opts_t *o, tc_result_t *res);

/* A TCP port on 127.0.0.1 that was free a moment ago. */
int tc_free_port(void);
/* One HTTP/1.1 request over a plain socket to 127.0.0.1:port (5 s
 * deadline).  Returns the status code (-1 when no answer); *body_p (may be
 * NULL) gets the body, NUL-terminated, to fy_free. */
int tc_http(int port, const char *method, const char *path, char **body_p);
/* A raw HTTP/1.1 client for tests that need more than tc_http: a
 * connected socket to 127.0.0.1:port (its reads time out after
 * timeout_s; -1 when nobody listens), one request written on it (key:
 * a bearer token or NULL; ctype NULL: no Content-Type), and a whole
 * response read back (headers, then Content-Length bytes, chunked
 * encoding undone, or to the close).  tc_http_read returns the status
 * (-1: no answer) and fills *r; tc_http_free lets go of it. */
typedef struct tc_http_resp {
    int status;
    char head[4096];
    char *body; /* NUL-terminated, chunked encoding removed */
    size_t len;
} tc_http_resp_t;
int tc_http_dial(int port, double timeout_s);
void tc_http_send(int fd, const char *method, const char *path, const char *key, const char *ctype, const char *body,
                  size_t len);
int tc_http_read(int fd, tc_http_resp_t *r);
void tc_http_free(tc_http_resp_t *r);

/* The value of the first sample of Prometheus text that matches series:
 * the name, and any of its labels ("ferry:kv_blocks{tier=\"device\",state=\"used\"}"
 * matches whatever model_name and role the sample also carries;
 * fy_metrics_sample).  Fails the test when no sample matches. */
double tc_metric(const char *text, const char *series);

/* etcd for cluster.etcd tests: a single member on host's free ports (as
 * tc_free_port finds them on loopback), its data and log under dir, dying
 * with the test.  tc_etcd_available says (with a message) whether etcd is
 * installed; tc_etcd_start waits until it answers; tc_etcd_kill is
 * SIGKILL; tc_etcd_spawn starts a killed one again on the same ports and
 * data. */
typedef struct tc_etcd {
    pid_t pid;
    int port, peer_port;
    char host[64], url[96], dir[512], log[600];
    char certs[512]; /* tc_etcd_start_tls: the CA and certificates here (tc_etcd_certs) */
} tc_etcd_t;
bool tc_etcd_available(void);
void tc_etcd_start(tc_etcd_t *e, const char *dir, const char *host);
/* Makes with the openssl CLI, in dir (created 0700): a CA (ca.pem,
 * ca.key), etcd's server certificate for IP 127.0.0.1 (server.pem,
 * server.key) and a client certificate per name (NAME.pem, NAME.key,
 * O=NAME, no CN: etcd 3.4's gateway refuses one with a CN once auth is
 * on); keys mode 0600. */
void tc_etcd_certs(const char *dir, const char *const *names, int n);
/* the same with etcd's certificate for IP ip */
void tc_etcd_certs_ip(const char *dir, const char *ip, const char *const *names, int n);
/* etcd on https://127.0.0.1 with certs (tc_etcd_certs'): its certificate
 * server.pem, --client-cert-auth against ca.pem (a client without a
 * certificate of that CA cannot connect); waits with certs/root.pem
 * (which tc_etcd_certs must have made). */
void tc_etcd_start_tls(tc_etcd_t *e, const char *dir, const char *certs);
/* the same on host (an IP tc_etcd_certs_ip made the certificate for) */
void tc_etcd_start_tls_on(tc_etcd_t *e, const char *dir, const char *certs, const char *host);
/* etcd's RBAC on a tc_etcd_start_tls one: root, a role ferry-CLUSTER with
 * readwrite on /ferry/CLUSTER/ alone, and each user (password in
 * certs/USER.password, mode 0600) in it; then auth on. */
void tc_etcd_rbac(tc_etcd_t *e, const char *cluster, const char *const *users, int n);
/* certs' files for a client NAME (ca.pem, NAME.pem, NAME.key) */
fy_etcd_tls_t tc_etcd_tls_of(const char *certs, const char *name);
void tc_etcd_spawn(tc_etcd_t *e);
void tc_etcd_kill(tc_etcd_t *e);

#endif /* FY_CLUSTER_UTIL_H */

/*
 * run.h - sending a workload to a server and timing every request.
 *
 * Two clients: the router's nng/msgpack protocol (router/client.h; one
 * thread and one client per request in flight, each long-polling its
 * stream) and the OpenAI HTTP API (libcurl's multi interface on one
 * thread, streaming server-sent events).  Times are taken on the client
 * when bytes arrive: TTFT is the first token's arrival less the send
 * time.  Tokens reach the client in chunks (a long poll returns every
 * token the router holds; an SSE event may carry several), so the
 * inter-token latencies recorded are the gaps between chunks, and each
 * chunk's token count is kept beside its time.
 *
 * A run is bounded: at most the workload's requests, none started after
 * duration_s, each given up (and cancelled) after timeout_s.  Every
 * request of the workload ends with a result, sent or not.
 */
#ifndef FY_BENCH_RUN_H
#define FY_BENCH_RUN_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "bench/workload.h"

typedef enum fy_bench_proto {
    FY_BENCH_PROTO_NNG = 0,
    FY_BENCH_PROTO_HTTP,
} fy_bench_proto_t;

typedef struct fy_bench_target {
    fy_bench_proto_t proto;
    const char *url;         /* nng: tcp://host:port or ipc://path; http: http://host:port (no path) */
    bool chat;               /* http: /v1/chat/completions, else /v1/completions; nng: the chat template */
    const char *model;       /* http: the "model" field; NULL: the first of GET /v1/models */
    const char *api_key;     /* http: Authorization: Bearer KEY; NULL: none */
    const char *secret_file; /* nng: the deployment's secret (kv.secret_file) that authenticates each call */
    const char *ca_file;     /* https: the CA (PEM) the router's certificate is verified against; NULL: the system's */
    bool ignore_eos;         /* ask for exactly n_out tokens */
} fy_bench_target_t;

typedef struct fy_bench_run_params {
    int32_t max_concurrency;        /* requests in flight at most; 0: FY_BENCH_MAX_INFLIGHT */
    double timeout_s;               /* per request, from its send */
    double duration_s;              /* 0: no limit; else nothing is sent after it */
    bool progress;                  /* a live line on stderr */
    const char *label;              /* for the progress line */
    const volatile int *abort_flag; /* when it becomes non-zero the run ends its requests and returns; may be NULL */
} fy_bench_run_params_t;

#define FY_BENCH_MAX_INFLIGHT 1024
#define FY_BENCH_KIND_LEN 24

/* One request's timings, seconds from the run's start (-1: never). */
typedef struct fy_bench_result {
    double sched_s;   /* when it was due */
    double sent_s;    /* when its first byte went out */
    double first_s;   /* first token arrived */
    double end_s;     /* the last byte of its answer (or the error) arrived */
    int32_t n_in;     /* prompt tokens: the server's count, else the workload's */
    int32_t n_out;    /* tokens received */
    int32_t n_cached; /* prompt tokens the server found cached (nng: the larger of the prefill and decode
                         workers' counts; http: usage.prompt_tokens_details.cached_tokens); -1: not said */
    bool server_counted_in;
    bool ok;                       /* finished with every token asked for (or a natural stop) */
    char error[FY_BENCH_KIND_LEN]; /* kind when not ok: overloaded, timeout, http_503, not_sent, ... */
    char message[160];
    int32_t n_chunks, cap_chunks;
    double *chunk_s;  /* [cap_chunks] arrival of each chunk that carried tokens */
    int32_t *chunk_n; /* [cap_chunks] tokens in it */
} fy_bench_result_t;

/* Results for every request of w, with room for their chunks (made
 * before the run: nothing is allocated per token while it runs). */
fy_status_t fy_bench_results_create(const fy_bench_workload_t *w, fy_bench_result_t **res_p);
void fy_bench_results_destroy(fy_bench_result_t *res, int32_t n); /* accepts NULL */

/*
 * Runs w against t: conversation i starts at at[i] seconds (from
 * fy_bench_arrivals).  Fills res[w->n_reqs] and *duration_p (from the
 * start to the last request's end).  Returns an error only when the run
 * could not happen at all (no client could be made); failed requests are
 * results, not errors.
 */
fy_status_t fy_bench_run(const fy_bench_target_t *t, const fy_bench_workload_t *w, const double *at,
                         const fy_bench_run_params_t *p, fy_bench_result_t *res, double *duration_p);

/* Refuses any address whose host is not loopback (127.0.0.0/8, ::1,
 * localhost) unless allow_remote; ipc:// and inproc:// are local. */
fy_status_t fy_bench_check_address(const char *url, bool allow_remote, char *err, size_t cap);

#endif /* FY_BENCH_RUN_H */

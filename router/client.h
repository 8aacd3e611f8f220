/*
 * client.h - talking to a router: submit a generation, poll its tokens,
 * cancel it, read the cluster's status.  Used by `ferry request`, `ferry
 * serve`'s first request and readiness check, the tests and the load
 * harness.  Blocking calls with timeouts; one client per thread.
 *
 * A client proves on every call that it holds its identity's key: a
 * client key file (`ferry key --client NAME`), or the deployment's secret
 * (kv.secret_file, the same file as the router's: the operator's tools);
 * each client is its own identity, and may poll and cancel only the
 * requests it made.
 */
#ifndef FY_CLIENT_H
#define FY_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/envelope.h"
#include "common/genspec.h"
#include "common/status.h"

typedef struct fy_client fy_client_t;

/* secret_file: a client key file, or the deployment's secret
 * (fy_cluster_secret_path says where a configuration keeps it); refused,
 * naming the file, when it is missing, short, or readable by others. */
fy_status_t fy_client_create(const char *router_url, const char *secret_file, double timeout_s, fy_client_t **c_p);
void fy_client_destroy(fy_client_t *c); /* accepts NULL */

typedef struct fy_client_req {
    const char *prompt;    /* text (tokenized by the router), or */
    const int32_t *tokens; /* token ids */
    int32_t n_tokens;
    bool chat;          /* apply the model's chat template */
    const char *system; /* system message with chat; may be NULL */
    fy_genspec_t gen;
    double deadline_s; /* 0: the router's default */
} fy_client_req_t;

/* One request's stream: its id and how much of it has been received. */
typedef struct fy_client_stream {
    uint64_t id;
    int32_t n_prompt;
    int32_t from;     /* tokens received */
    size_t from_text; /* text bytes received */
} fy_client_stream_t;

/* On success *s names the request (nothing received yet).  Errors from
 * the router (overloaded, invalid) come back as their status with the
 * router's message in err (may be NULL). */
fy_status_t fy_client_generate(fy_client_t *c, const fy_client_req_t *req, fy_client_stream_t *s, char *err,
                               size_t err_cap);

typedef struct fy_client_timings {
    double queue_s, reserve_s, prefill_queue_s, prefill_compute_s, transfer_s, transfer_tail_s, prefill_total_s,
        first_token_s, ttft_s, e2e_s;
    int64_t transfer_bytes;
    int32_t cached_prefill, cached_decode, retries;
} fy_client_timings_t;

/* What one poll brought: new tokens and text (owned by the client, valid
 * until the next poll), and the end when done. */
typedef struct fy_client_update {
    const int32_t *tokens;
    int32_t n_tokens;
    const char *text;
    size_t text_len;
    bool done;
    fy_status_t error; /* FY_OK when finished normally */
    char message[256]; /* the error's message */
    char finish[16];   /* the finish reason */
    fy_client_timings_t timings;
    int32_t n_prompt;
    char state[16]; /* queued, reserving, prefilling, adopting, decoding, done */
} fy_client_update_t;

/* Waits up to wait_s for tokens after those s has received, then returns
 * what arrived (u's buffers belong to c, valid until its next poll) and
 * advances s.  Any number of streams can be polled through one client. */
fy_status_t fy_client_poll(fy_client_t *c, fy_client_stream_t *s, double wait_s, fy_client_update_t *u);
fy_status_t fy_client_cancel(fy_client_t *c, uint64_t id);

#define FY_CLIENT_MAX_WORKERS 64

typedef struct fy_client_worker {
    char name[64];
    bool up, decode;
    int32_t assigned;   /* requests the router placed there, not yet done */
    int32_t admittable; /* decode: blocks it could still promise (last report) */
    int32_t total_blocks;
    int32_t pending_tokens; /* prefill: prompt tokens of its unfinished jobs */
    int32_t ranks;          /* processes of its rank group (tp * pp; 1: one) */
    bool out_of_service;    /* it says it serves nothing (a rank died); not up */
} fy_client_worker_t;

typedef struct fy_client_status {
    int32_t prefill_up, decode_up, requests, queued;
    uint64_t completed, failed, refused, retried, bad_events;
    uint64_t refused_messages[FY_ENV_N_FAULTS]; /* control messages the router refused, by fault (0 unused) */
    char model[64];                             /* the model's id: its name and a hash of its weights */
    char served_model[128];                     /* its name in the API ("": a router that does not say) */
    int32_t n_workers;
    fy_client_worker_t workers[FY_CLIENT_MAX_WORKERS];
} fy_client_status_t;

fy_status_t fy_client_status(fy_client_t *c, fy_client_status_t *s);

#endif /* FY_CLIENT_H */

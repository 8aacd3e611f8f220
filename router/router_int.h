/*
 * router_int.h - the router's in-process interface, for its HTTP front
 * door (http.c).  Not a public API: the router's own threads and the
 * front door's callbacks share one lock, and these functions say which
 * of them expect it held.
 *
 * A front-door request is submitted with a watch function that the
 * router calls (under its lock) whenever the request has new tokens or
 * has ended; the front door reads them through fy_router_view and lets
 * go with fy_router_detach, which cancels the request in the cluster
 * (its blocks freed) when the client went away first.
 */
#ifndef FY_ROUTER_INT_H
#define FY_ROUTER_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/genspec.h"
#include "common/metrics.h"
#include "model/model.h"
#include "router/router_config.h"
#include "common/status.h"

typedef struct router router_t;
typedef void (*fy_router_watch_fn)(void *arg);

void fy_router_lock(router_t *R);
void fy_router_unlock(router_t *R);

/* Fixed after start-up: no lock needed. */
const fy_model_t *fy_router_model(const router_t *R);
const char *fy_router_model_id(const router_t *R);
int32_t fy_router_max_ctx(const router_t *R);
const fy_router_conf_t *fy_router_conf(const router_t *R); /* read once at start: router_config.h */
/* Bytes of prompt text that cannot fit max_ctx tokens, and more (0: no
 * such bound): refused before tokenizing. */
size_t fy_router_max_prompt_bytes(const router_t *R);

/* Lock NOT held (or held: the queue's lock nests inside).  Hands
 * fn(arg, true) to the router's parse workers (router.parse_threads),
 * away from the threads that carry /health and the workers' events; a
 * job of at most FY_WORKQ_QUICK_BYTES bytes (the body's) goes in the
 * quick lane (router/workq.h);
 * fn(arg, false) when the router stops before it ran.  FY_ERR_OVERLOADED
 * when router.parse_queue jobs already wait, FY_ERR_CANCELLED when the
 * router is stopping: fn is not called. */
fy_status_t fy_router_offload(router_t *R, size_t bytes, void (*fn)(void *arg, bool run), void *arg);

/*
 * Queues a request; lock NOT held.  ids (fy_malloc'd) are taken in every
 * case.  tenant names the prefix-cache namespace (the API key's tenant).
 * deadline_s <= 0: the router's request_timeout.  watch(arg) is called
 * under the lock on every change until fy_router_detach.  Errors:
 * FY_ERR_INVALID (prompt too long), FY_ERR_OVERLOADED (queue full),
 * FY_ERR_NOMEM; err says which.
 */
fy_status_t fy_router_submit(router_t *R, const char *tenant, int32_t *ids, int32_t n, const fy_genspec_t *gen,
                             double deadline_s, fy_router_watch_fn watch, void *arg, uint64_t *id_p, char *err,
                             size_t err_cap);

/* The same with the lock held (from a watch function); the request is
 * placed at the router's next housekeeping tick. */
fy_status_t fy_router_submit_locked(router_t *R, const char *tenant, int32_t *ids, int32_t n, const fy_genspec_t *gen,
                                    double deadline_s, fy_router_watch_fn watch, void *arg, uint64_t *id_p, char *err,
                                    size_t err_cap);

/* A request's output so far; pointers valid while the lock is held. */
typedef struct fy_router_view {
    const int32_t *tokens;
    const float *logprobs; /* NULL unless asked for */
    int32_t n_tokens;
    /* top_logprobs: token i's alternatives are top_ids[i * top_k ..] and
     * top_logprobs[i * top_k ..], n_top[i] of them (top_k 0: none) */
    int32_t top_k;
    const int32_t *top_ids;
    const float *top_logprobs;
    const uint8_t *n_top;
    /* the prompt, and with prompt_logprobs, once all have arrived
     * (plp_ready): prompt token i's logprob plp[i] and rank plp_rank[i]
     * (i >= 1), its alternatives plp_ids[i * plp_k ..] and plp_tlps[i *
     * plp_k ..] */
    const int32_t *prompt_tokens;
    bool plp_ready;
    int32_t plp_k;
    const float *plp;
    const int32_t *plp_rank, *plp_ids;
    const float *plp_tlps;
    const char *text;
    size_t text_len;
    int32_t n_prompt;
    int32_t cached; /* prompt tokens found in a prefix cache */
    bool done;
    fy_status_t error; /* when done: FY_OK, or what failed */
    const char *message;
    const char *finish;                        /* when done without error: length, stop, eos, context */
    double t_arrive, t_sched, t_first, t_done; /* CLOCK_MONOTONIC; 0 when not yet */
} fy_router_view_t;

/* Lock held.  False when no such request. */
bool fy_router_view(router_t *R, uint64_t id, fy_router_view_t *v);
/* Lock held.  Stops watching; cancel ends a running request (its workers
 * let go of its blocks).  The request is forgotten once done (at the
 * router's next tick: a watch function may call this). */
void fy_router_detach(router_t *R, uint64_t id, bool cancel);
/* Lock held.  The longest sequence (prompt and completion) the pool
 * takes: the smallest context (ROLE.ctx) among the workers up that a
 * request may land on (prefill and decode workers; colocated: decode
 * workers), at most the model's (fy_router_max_ctx); with none up, the
 * last such answer (the model's before any worker reported).  The HTTP
 * door's max_model_len; a longer request is refused before any worker is
 * asked. */
int32_t fy_router_pool_ctx(router_t *R);
/* Lock held.  Workers reporting and compatible, by role. */
void fy_router_workers_up(router_t *R, int *prefill_up, int *decode_up, bool *colocated);

/* The router's metrics registry (its series are updated as requests
 * move); refresh (lock held) sets the gauges before a render. */
fy_metrics_t *fy_router_metrics(router_t *R);
void fy_router_metrics_refresh(router_t *R);
/* Any thread.  vLLM's request_max_num_generation_tokens: one observation
 * per client request that finished, the most tokens any of its samples
 * generated.  The router observes it for requests submitted without a
 * watch (nng clients: one sample each); a front door, whose request may
 * be several samples, calls this once every sample is done. */
void fy_router_observe_max_generation(router_t *R, int32_t n_tokens);

/*
 * A front door (router/http.c is the one there is), handed to
 * fy_router_run by the process's main, so that the router core calls it
 * through these and never includes it: the front door uses the router,
 * not the other way round.
 */
typedef struct fy_router_door {
    /* Started by the router after its sockets, stopped before them.  No
     * address configured: *h_p = NULL, FY_OK. */
    fy_status_t (*start)(router_t *R, void **h_p);
    /* Lock held.  From now on new generations are refused (503 with
     * Retry-After) and /health says 503 "draining"; running ones go on.
     * Accepts NULL. */
    void (*drain)(void *h);
    /* Lock held.  Generations whose answer is not yet all out (0 for NULL). */
    int32_t (*live)(const void *h);
    /* Lock NOT held.  Ends what is left (streams with their terminal
     * events, others with an error body), lets the server write it, and
     * stops.  Accepts NULL. */
    void (*stop)(void *h);
} fy_router_door_t;

/* The whole router process (fy_router_main) with door as its front door
 * (NULL: none).  Returns the process exit status. */
int fy_router_run(int argc, char **argv, const fy_router_door_t *door);

#endif /* FY_ROUTER_INT_H */

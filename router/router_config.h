/*
 * router_config.h - what a router reads from its configuration, once at
 * start, into a typed struct: its own keys (router.*), the cluster's it
 * follows (model.path, prefill.count, kv.*, decode.max_batch_tokens,
 * cluster.*) and its front door's (router.http and the HTTP server's
 * limits).  After start-up the router and its front door (http.c) read
 * only this struct; nothing in router/ but router_config.c sees the
 * configuration object (`make layers` checks it).
 *
 * Threading: fy_router_conf_read fills the caller's struct; the router
 * keeps it, fixed after start-up, for its threads to read without a lock.
 */
#ifndef FY_ROUTER_CONFIG_H
#define FY_ROUTER_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"
#include "common/netconf.h"
#include "common/status.h"

struct fy_config; /* common/config.h: router_config.c alone reads one */

typedef struct fy_router_conf {
    char model_path[FY_CONF_VALUE_MAX]; /* model.path */
    char listen[FY_CONF_VALUE_MAX];     /* router.listen: clients over nng */
    char events[FY_CONF_VALUE_MAX];     /* router.events: the workers' events */
    double health_timeout, request_timeout, prefill_timeout, command_timeout, breaker_cooldown, forget_after;
    double lease_s, client_timeout, drain_timeout; /* router.*, seconds */
    int64_t max_queue, parse_threads, parse_queue, retries, prefill_queue_tokens;
    double prefix_weight;
    int64_t n_prefill;                         /* prefill.count: 0 colocated */
    int32_t block_size;                        /* kv.block_size */
    fy_dtype_t dtype;                          /* kv.dtype */
    bool sliding_groups;                       /* kv.sliding_groups */
    int64_t step;                              /* decode.max_batch_tokens */
    int evict;                                 /* kv.evict's index (fy_evict_policy_t) */
    int64_t sink, recent, heavy;               /* kv.sink_tokens, recent_tokens, heavy_tokens */
    uint8_t prefix_key[FY_NETCONF_SECRET_MAX]; /* kv.secret_file's bytes, for the prefix hasher */
    size_t prefix_key_len;                     /* 0: not set (warned: names private to this process) */
    char secret_file[FY_CONF_VALUE_MAX];       /* kv.secret_file: the control plane's credentials */
    int encrypt;                               /* cluster.encrypt's index */
    char router_name[FY_CONF_VALUE_MAX];       /* cluster.router_name */
    fy_member_conf_t members;                  /* cluster.etcd and the rest of its membership */
    char served[128];                          /* router.served_model_name, else model.path's base */
    /* the front door (http.c) */
    char http[FY_CONF_VALUE_MAX];         /* router.http: "" none */
    char api_keys[FY_CONF_VALUE_MAX];     /* router.api_keys */
    char cors_origins[FY_CONF_VALUE_MAX]; /* router.cors_origins */
    int64_t max_body, default_max_tokens;
    char reasoning_parser[FY_CONF_VALUE_MAX];
    double retry_after;
    fy_httpd_limits_t http_lim; /* router.http_* and tls_* (fy_netconf_httpd) */
} fy_router_conf_t;

/* Every key above from c into *rc, in the order the router used to read
 * them; the secrets are read from their files here.  FY_ERR_INVALID (or
 * the file reader's status) logged, naming the key or file, as the
 * getters refuse; *rc is wiped then.  The caller wipes the secrets
 * (fy_router_conf_wipe_secrets) once it has made its hasher, credentials
 * and membership from them. */
fy_status_t fy_router_conf_read(const struct fy_config *c, fy_router_conf_t *rc);
void fy_router_conf_wipe_secrets(fy_router_conf_t *rc);

/* A router's start: its configuration from argv (fy_cluster_config: -c
 * FILE, --set section.key=value, usage for --help), read into *rc
 * (fy_router_conf_read), then freed: nothing after holds it.  *loaded
 * says whether the configuration itself loaded (false: a bad file or
 * argument, or --help: FY_ERR_CANCELLED); a key refused after it did is a
 * start-up failure. */
fy_status_t fy_router_conf_load(int argc, char **argv, const char *usage, fy_router_conf_t *rc, bool *loaded);

#endif /* FY_ROUTER_CONFIG_H */

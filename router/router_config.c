/*
 * router_config.c - a router's configuration, read once at start (see
 * router_config.h).
 */
#include "router/router_config.h"

#include <sodium.h>
#include <string.h>

#include "common/cluster.h"
#include "common/config.h"

fy_status_t fy_router_conf_read(const fy_config_t *c, fy_router_conf_t *rc)
{
    memset(rc, 0, sizeof(*rc));
    fy_status_t st;
    if ((st = fy_conf_copy(c, "model", "path", rc->model_path, sizeof(rc->model_path))) ||
        (st = fy_conf_copy(c, "router", "listen", rc->listen, sizeof(rc->listen))) ||
        (st = fy_conf_copy(c, "router", "events", rc->events, sizeof(rc->events))) ||
        (st = fy_conf_duration(c, "router", "health_timeout", &rc->health_timeout)) ||
        (st = fy_conf_duration(c, "router", "request_timeout", &rc->request_timeout)) ||
        (st = fy_conf_duration(c, "router", "prefill_timeout", &rc->prefill_timeout)) ||
        (st = fy_conf_duration(c, "router", "command_timeout", &rc->command_timeout)) ||
        (st = fy_conf_duration(c, "router", "breaker_cooldown", &rc->breaker_cooldown)) ||
        (st = fy_conf_duration(c, "router", "forget_after", &rc->forget_after)) ||
        (st = fy_conf_duration(c, "router", "lease", &rc->lease_s)) ||
        (st = fy_conf_duration(c, "router", "client_timeout", &rc->client_timeout)) ||
        (st = fy_conf_duration(c, "router", "drain_timeout", &rc->drain_timeout)) ||
        (st = fy_conf_int(c, "router", "max_queue", &rc->max_queue)) ||
        (st = fy_conf_int(c, "router", "parse_threads", &rc->parse_threads)) ||
        (st = fy_conf_int(c, "router", "parse_queue", &rc->parse_queue)) ||
        (st = fy_conf_int(c, "router", "retries", &rc->retries)) ||
        (st = fy_conf_int(c, "router", "prefill_queue_tokens", &rc->prefill_queue_tokens)) ||
        (st = fy_conf_float(c, "router", "prefix_weight", &rc->prefix_weight)) ||
        (st = fy_conf_int(c, "prefill", "count", &rc->n_prefill)) ||
        (st = fy_cluster_kv(c, &rc->block_size, &rc->dtype)) ||
        (st = fy_conf_bool(c, "kv", "sliding_groups", &rc->sliding_groups)) ||
        (st = fy_conf_int(c, "decode", "max_batch_tokens", &rc->step)) ||
        (st = fy_conf_enum(c, "kv", "evict", &rc->evict)) || (st = fy_conf_int(c, "kv", "sink_tokens", &rc->sink)) ||
        (st = fy_conf_int(c, "kv", "recent_tokens", &rc->recent)) ||
        (st = fy_conf_int(c, "kv", "heavy_tokens", &rc->heavy)) ||
        /* the deployment's hasher: the workers name blocks with the same key */
        (st = fy_cluster_prefix_secret(c, rc->prefix_key, sizeof(rc->prefix_key), &rc->prefix_key_len)) ||
        (st = fy_conf_copy(c, "cluster", "router_name", rc->router_name, sizeof(rc->router_name))) ||
        (st = fy_conf_copy(c, "kv", "secret_file", rc->secret_file, sizeof(rc->secret_file))) ||
        (st = fy_conf_enum(c, "cluster", "encrypt", &rc->encrypt)) ||
        (st = fy_cluster_served_model_name(c, rc->served, sizeof(rc->served))) ||
        (st = fy_conf_copy(c, "router", "http", rc->http, sizeof(rc->http))) ||
        (st = fy_conf_copy(c, "router", "api_keys", rc->api_keys, sizeof(rc->api_keys))) ||
        (st = fy_conf_copy(c, "router", "cors_origins", rc->cors_origins, sizeof(rc->cors_origins))) ||
        (st = fy_conf_size(c, "router", "max_body", &rc->max_body)) ||
        (st = fy_conf_int(c, "router", "default_max_tokens", &rc->default_max_tokens)) ||
        (st = fy_conf_copy(c, "router", "reasoning_parser", rc->reasoning_parser, sizeof(rc->reasoning_parser))) ||
        (st = fy_conf_duration(c, "router", "retry_after", &rc->retry_after)) ||
        (st = fy_netconf_httpd(c, "router", &rc->http_lim)) || (st = fy_netconf_members(c, &rc->members))) {
        sodium_memzero(rc, sizeof(*rc));
        return st;
    }
    return FY_OK;
}

void fy_router_conf_wipe_secrets(fy_router_conf_t *rc)
{
    sodium_memzero(rc->prefix_key, sizeof(rc->prefix_key));
    rc->prefix_key_len = 0;
    fy_netconf_members_wipe(&rc->members);
}

fy_status_t fy_router_conf_load(int argc, char **argv, const char *usage, fy_router_conf_t *rc, bool *loaded)
{
    fy_config_t *cfg = NULL;
    fy_status_t st = fy_cluster_config(argc, argv, usage, &cfg);
    *loaded = st == FY_OK;
    if (st) return st;
    st = fy_router_conf_read(cfg, rc);
    fy_config_destroy(cfg);
    return st;
}

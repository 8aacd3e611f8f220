/*
 * serve_config.h - what `ferry serve` reads from the cluster's
 * configuration, once at start, into a typed struct (serve.*, the
 * addresses it gives its children, the routers' HTTP limits and the
 * served model's name).  serve.c reads only this struct; it still holds
 * the configuration itself to add the settings it made (kv.secret_file,
 * cluster.etcd_ca) and write RUN_DIR/cluster.ini for its children, but
 * reads no key from it (`make layers` checks it).
 *
 * Threading: plain functions over the caller's struct.
 */
#ifndef FY_SERVE_CONFIG_H
#define FY_SERVE_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "common/netconf.h"
#include "common/status.h"

struct fy_config;

/* A key's value: buf, or NULL (the *_p members) for a key unset without a
 * default, as fy_conf_string gives it. */
typedef struct fy_serve_conf {
    const char *run_dir, *logs, *secret, *router_listen, *router_http, *p_listen, *d_listen, *p_metrics, *d_metrics;
    const char *serve_metrics, *etcd, *etcd_data, *router_events, *cluster_name;
    int64_t n_prefill, n_decode, max_restarts, n_routers;
    double backoff, backoff_max, window, grace, health_timeout, start_timeout, etcd_health_timeout;
    bool etcd_tls;
    fy_httpd_limits_t router_lim; /* router.http_* and tls_* (fy_netconf_httpd) */
    char served[128];             /* router.served_model_name, else model.path's base */
    char buf[14][FY_CONF_VALUE_MAX];
} fy_serve_conf_t;

/* Every key above from c into *sc, in the order serve read them, with the
 * getters' errors naming the key (logged).  Not to be copied: its strings
 * point into it. */
fy_status_t fy_serve_conf_read(const struct fy_config *c, fy_serve_conf_t *sc);

#endif /* FY_SERVE_CONFIG_H */

/*
 * serve_config.c - `ferry serve`'s configuration, read once at start (see
 * serve_config.h).
 */
#include "tools/serve_config.h"

#include <string.h>

#include "common/cluster.h"
#include "common/config.h"

/* section.key into sc's next buffer; *p_p NULL where the key is unset
 * without a default */
static fy_status_t str(const fy_config_t *c, const char *section, const char *key, fy_serve_conf_t *sc, int *next,
                       const char **p_p)
{
    const char *v;
    fy_status_t st = fy_conf_string(c, section, key, &v);
    if (st) return st;
    if (!v) {
        *p_p = NULL;
        return FY_OK;
    }
    if (*next >= (int)(sizeof(sc->buf) / sizeof(sc->buf[0]))) return FY_ERR_INTERNAL; /* a bug: buf is too short */
    char *b = sc->buf[(*next)++];
    if ((st = fy_conf_copy(c, section, key, b, sizeof(sc->buf[0])))) return st;
    *p_p = b;
    return FY_OK;
}

fy_status_t fy_serve_conf_read(const fy_config_t *c, fy_serve_conf_t *sc)
{
    memset(sc, 0, sizeof(*sc));
    int n = 0;
    fy_status_t st;
    if ((st = str(c, "serve", "run_dir", sc, &n, &sc->run_dir)) || (st = str(c, "serve", "logs", sc, &n, &sc->logs)) ||
        (st = fy_conf_int(c, "serve", "max_restarts", &sc->max_restarts)) ||
        (st = fy_conf_duration(c, "serve", "restart_backoff", &sc->backoff)) ||
        (st = fy_conf_duration(c, "serve", "restart_backoff_max", &sc->backoff_max)) ||
        (st = fy_conf_duration(c, "serve", "restart_window", &sc->window)) ||
        (st = fy_conf_duration(c, "serve", "stop_grace", &sc->grace)) ||
        (st = fy_conf_duration(c, "serve", "health_timeout", &sc->health_timeout)) ||
        (st = fy_conf_duration(c, "serve", "etcd_health_timeout", &sc->etcd_health_timeout)) ||
        (st = fy_conf_duration(c, "serve", "start_timeout", &sc->start_timeout)) ||
        (st = str(c, "serve", "metrics", sc, &n, &sc->serve_metrics)) ||
        (st = str(c, "kv", "secret_file", sc, &n, &sc->secret)) ||
        (st = str(c, "router", "listen", sc, &n, &sc->router_listen)) ||
        (st = str(c, "router", "http", sc, &n, &sc->router_http)) ||
        (st = str(c, "prefill", "listen", sc, &n, &sc->p_listen)) ||
        (st = str(c, "decode", "listen", sc, &n, &sc->d_listen)) ||
        (st = str(c, "prefill", "metrics", sc, &n, &sc->p_metrics)) ||
        (st = str(c, "decode", "metrics", sc, &n, &sc->d_metrics)) ||
        (st = fy_conf_int(c, "prefill", "count", &sc->n_prefill)) ||
        (st = fy_conf_int(c, "decode", "count", &sc->n_decode)) ||
        (st = fy_conf_int(c, "serve", "routers", &sc->n_routers)) ||
        (st = str(c, "serve", "etcd_data", sc, &n, &sc->etcd_data)) ||
        (st = str(c, "cluster", "etcd", sc, &n, &sc->etcd)) ||
        (st = str(c, "router", "events", sc, &n, &sc->router_events)) ||
        (st = fy_conf_bool(c, "serve", "etcd_tls", &sc->etcd_tls)) ||
        (st = str(c, "cluster", "name", sc, &n, &sc->cluster_name)) ||
        (st = fy_netconf_httpd(c, "router", &sc->router_lim)))
        return st;
    return fy_cluster_served_model_name(c, sc->served, sizeof(sc->served));
}

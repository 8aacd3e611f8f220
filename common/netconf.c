/*
 * netconf.c - the HTTP server's and the etcd client's settings from the
 * configuration (netconf.h).
 */
#include "common/netconf.h"

#include <sodium.h>
#include <stdio.h>
#include <string.h>

#include "common/cluster.h"
#include "common/config.h"
#include "common/log.h"

/* SECTION.tls_* (the router's alone has them): both or neither, paths that fit */
static fy_status_t tls_read(const fy_config_t *c, const char *section, fy_httpd_limits_t *l)
{
    const char *cert, *key;
    int minv;
    fy_status_t st;
    if ((st = fy_conf_string(c, section, "tls_cert", &cert)) || (st = fy_conf_string(c, section, "tls_key", &key)) ||
        (st = fy_conf_enum(c, section, "tls_min_version", &minv)))
        return st;
    l->tls_min = minv == 1 ? 13 : 12;
    if (!*cert && !*key) return FY_OK;
    if (!*cert || !*key) {
        fy_error("%s.%s is set but %s.%s is not: HTTPS needs both", section, *cert ? "tls_cert" : "tls_key", section,
                 *cert ? "tls_key" : "tls_cert");
        return FY_ERR_INVALID;
    }
    if (strlen(cert) >= sizeof(l->tls_cert) || strlen(key) >= sizeof(l->tls_key)) {
        fy_error("%s.%s: path longer than %zu bytes", section,
                 strlen(cert) >= sizeof(l->tls_cert) ? "tls_cert" : "tls_key", sizeof(l->tls_cert) - 1);
        return FY_ERR_INVALID;
    }
    snprintf(l->tls_cert, sizeof(l->tls_cert), "%s", cert);
    snprintf(l->tls_key, sizeof(l->tls_key), "%s", key);
    return FY_OK;
}

/* SECTION.http_* in force; c NULL: the key table's defaults (confkeys.c). */
static fy_status_t limits_read(const fy_config_t *c, const char *section, fy_httpd_limits_t *l)
{
    double header_s, idle_s;
    int64_t conns, hdr;
    fy_status_t st;
    if ((st = fy_conf_duration(c, section, "http_header_timeout", &header_s)) ||
        (st = fy_conf_duration(c, section, "http_idle_timeout", &idle_s)) ||
        (st = fy_conf_int(c, section, "http_max_connections", &conns)) ||
        (st = fy_conf_size(c, section, "http_max_header", &hdr)))
        return st;
    l->header_timeout_s = header_s;
    l->idle_timeout_s = idle_s;
    l->max_connections = (int32_t)conns;
    l->max_header = hdr;
    l->section = !strcmp(section, "router") ? "router" : "worker";
    return c && !strcmp(section, "router") ? tls_read(c, section, l) : FY_OK;
}

void fy_httpd_limits_default(fy_httpd_limits_t *l)
{
    *l = (fy_httpd_limits_t){.threads = 1, .tls_min = 12, .section = "worker"};
    limits_read(NULL, "worker", l); /* cannot fail but for a broken table, which it logs */
}

fy_status_t fy_netconf_httpd(const fy_config_t *c, const char *section, fy_httpd_limits_t *l)
{
    fy_httpd_limits_default(l);
    return limits_read(c, section, l);
}

/* printable ASCII without spaces, '"' or '\\': what goes into etcd's JSON as it is */
static bool json_safe(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x21 || (unsigned char)*s > 0x7e || *s == '"' || *s == '\\') return false;
    return true;
}

fy_status_t fy_netconf_etcd_tls(const fy_config_t *c, fy_etcd_tls_t *t)
{
    static const char *const KEYS[3] = {"etcd_ca", "etcd_cert", "etcd_key"};
    char *dst[3] = {t->ca, t->cert, t->key};
    memset(t, 0, sizeof(*t));
    for (int i = 0; i < 3; i++) {
        const char *v = NULL;
        fy_status_t st = fy_conf_string(c, "cluster", KEYS[i], &v);
        if (st) return st;
        if (v && strlen(v) >= FY_ETCD_PATH_MAX) {
            fy_error("cluster.%s: a path of at most %d bytes", KEYS[i], FY_ETCD_PATH_MAX - 1);
            return FY_ERR_INVALID;
        }
        snprintf(dst[i], FY_ETCD_PATH_MAX, "%s", v ? v : "");
    }
    const char *user = NULL, *pwf = NULL;
    fy_status_t st;
    if ((st = fy_conf_string(c, "cluster", "etcd_user", &user)) ||
        (st = fy_conf_string(c, "cluster", "etcd_password_file", &pwf)))
        return st;
    if (user && strlen(user) >= sizeof(t->user)) {
        fy_error("cluster.etcd_user: at most %zu bytes", sizeof(t->user) - 1);
        return FY_ERR_INVALID;
    }
    snprintf(t->user, sizeof(t->user), "%s", user ? user : "");
    if (!json_safe(t->user)) {
        fy_error("cluster.etcd_user '%s': printable ASCII without '\"' or '\\' only", t->user);
        return FY_ERR_INVALID;
    }
    if (pwf && *pwf) {
        size_t n = 0;
        if ((st = fy_cluster_read_secret_file(pwf, "cluster.etcd_password_file", (uint8_t *)t->password,
                                              FY_ETCD_PASSWORD_MAX, &n)))
            return st;
        t->password[n] = 0;
        if (n && t->password[n - 1] == '\n') t->password[--n] = 0;
        if (strlen(t->password) != n) {
            sodium_memzero(t->password, sizeof(t->password));
            fy_error("cluster.etcd_password_file %s: a NUL byte in the password", pwf);
            return FY_ERR_FORMAT;
        }
    }
    return FY_OK;
}

_Static_assert(FY_CONF_VALUE_MAX == FY_CONFIG_MAX_LINE + 1, "a configuration value fits FY_CONF_VALUE_MAX");
_Static_assert(FY_NETCONF_SECRET_MAX == FY_CLUSTER_SECRET_MAX, "the secret fits fy_member_conf_t");

fy_status_t fy_netconf_members(const fy_config_t *c, fy_member_conf_t *m)
{
    memset(m, 0, sizeof(*m));
    fy_status_t st = fy_conf_copy(c, "cluster", "etcd", m->etcd, sizeof(m->etcd));
    if (st || !m->etcd[0]) return st;
    if ((st = fy_conf_copy(c, "cluster", "name", m->cluster, sizeof(m->cluster))) ||
        (st = fy_conf_duration(c, "cluster", "etcd_ttl", &m->ttl_s)) ||
        (st = fy_conf_duration(c, "cluster", "etcd_poll", &m->poll_s)) || (st = fy_netconf_etcd_tls(c, &m->tls)) ||
        (st = fy_cluster_secret(c, m->secret, sizeof(m->secret), &m->secret_len)))
        fy_netconf_members_wipe(m);
    return st;
}

void fy_netconf_members_wipe(fy_member_conf_t *m) { sodium_memzero(m, sizeof(*m)); }

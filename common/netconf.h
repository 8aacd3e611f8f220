/*
 * netconf.h - the network settings a process reads from its configuration
 * once, as typed structs: the HTTP server's limits and HTTPS files
 * (SECTION.http_*, router.tls_*) and the etcd client's TLS and password
 * (cluster.etcd_ca, etcd_cert, etcd_key, etcd_user, etcd_password_file).
 *
 * Why here: rpc/ (the HTTP server, the etcd client) takes these structs
 * and never sees fy_config_t; the router, the workers and `ferry serve`
 * read them here and hand them down (docs/architecture.md, "Configuration
 * is read once").  What is checked here is what the keys alone say
 * (ranges, lengths, a certificate without its key, the password's bytes);
 * the files themselves (modes, owners, PEM contents) are checked by the
 * layer that opens them: fy_httpd_limits_check, fy_etcd_tls_check.
 *
 * Threading: plain functions over the caller's structs.
 */
#ifndef FY_NETCONF_H
#define FY_NETCONF_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

struct fy_config; /* common/config.h: only the readers take one, and rpc/ never includes it */

/* ---- the HTTP server ---- */

typedef struct fy_httpd_limits {
    double header_timeout_s; /* request line, headers and body complete within this */
    double idle_timeout_s;   /* nothing moving either way for this long: closed */
    int32_t max_connections; /* served at once (further capped by the descriptor limit) */
    int64_t max_header;      /* bytes of request line and headers */
    int32_t threads;         /* the server's event threads */
    /* TLS: empty tls_cert, plain HTTP.  The files are checked by fy_httpd_limits_check (rpc/httpd.h). */
    char tls_cert[512];  /* PEM: the server's certificate, then its chain */
    char tls_key[512];   /* PEM: its private key */
    int tls_min;         /* lowest TLS version: 12 (1.2) or 13 (1.3) */
    const char *section; /* names the keys in errors ("router"); a string literal */
} fy_httpd_limits_t;

/* The key table's defaults of worker.http_* (common/confkeys.c), 1 thread. */
void fy_httpd_limits_default(fy_httpd_limits_t *l);
/* SECTION.http_header_timeout, http_idle_timeout, http_max_connections and
 * http_max_header in force (SECTION "router" or "worker"), 1 thread; for
 * "router" also tls_cert, tls_key (both or neither, paths that fit) and
 * tls_min_version.  FY_ERR_INVALID (logged, naming the key) for a value
 * out of range. */
fy_status_t fy_netconf_httpd(const struct fy_config *c, const char *section, fy_httpd_limits_t *l);

/* ---- the etcd client ---- */

/* TLS towards etcd (cluster.etcd_ca, etcd_cert, etcd_key): PEM file paths,
 * "" for none.  With a CA the server's certificate is verified against it
 * (and its name or IP against the endpoint's); with cert and key this
 * process presents a client certificate (etcd --client-cert-auth takes
 * its CN as the user, whose roles RBAC checks). */
#define FY_ETCD_PATH_MAX 512
/* user and password (cluster.etcd_user, etcd_password_file's content):
 * etcd's RBAC through its JSON gateway, which takes no user from a client
 * certificate once auth is on: each call carries a token from
 * /v3/auth/authenticate, made again when etcd answers 401. */
#define FY_ETCD_PASSWORD_MAX 128
typedef struct fy_etcd_tls {
    char ca[FY_ETCD_PATH_MAX], cert[FY_ETCD_PATH_MAX], key[FY_ETCD_PATH_MAX];
    char user[128], password[FY_ETCD_PASSWORD_MAX + 1];
} fy_etcd_tls_t;
/* cluster.etcd_* into t, the password read from etcd_password_file (the
 * owner's alone, as the secret file; a trailing newline dropped).  A path
 * too long, a user with a byte that is not printable or is '"' or '\\', or
 * a NUL in the password is refused, naming the key (the password wiped).
 * What the keys mean together with cluster.etcd's endpoints, and the
 * files, fy_etcd_tls_check (rpc/etcd.h) checks. */
fy_status_t fy_netconf_etcd_tls(const struct fy_config *c, fy_etcd_tls_t *t);

/* ---- membership in etcd ---- */

/* A configuration value's bytes with its NUL (common/config.h's
 * FY_CONFIG_MAX_LINE + 1; netconf.c asserts it): a string key copied into
 * a typed struct never loses a byte. */
#define FY_CONF_VALUE_MAX 197
#define FY_NETCONF_SECRET_MAX 64 /* common/cluster.h's FY_CLUSTER_SECRET_MAX */

/* What a router's or a worker's membership in etcd reads: cluster.etcd's
 * endpoints ("": no etcd, and nothing else is read), cluster.name,
 * etcd_ttl, etcd_poll, the TLS settings (fy_netconf_etcd_tls) and the
 * deployment's secret (kv.secret_file's bytes) from which the membership
 * key is derived; rpc/etcd.h's fy_membership_params_conf takes it. */
typedef struct fy_member_conf {
    char etcd[FY_CONF_VALUE_MAX];
    char cluster[FY_CONF_VALUE_MAX];
    double ttl_s, poll_s;
    fy_etcd_tls_t tls;
    uint8_t secret[FY_NETCONF_SECRET_MAX];
    size_t secret_len; /* 0: kv.secret_file is not set */
} fy_member_conf_t;

/* Reads m (above) once at start.  FY_ERR_INVALID, FY_ERR_IO or
 * FY_ERR_FORMAT (logged, naming the key or the file) as
 * fy_netconf_etcd_tls and the secret file's reader refuse; m is wiped
 * then.  The caller wipes m (fy_netconf_members_wipe) once the membership
 * started. */
fy_status_t fy_netconf_members(const struct fy_config *c, fy_member_conf_t *m);
/* Wipes m's secret and etcd password. */
void fy_netconf_members_wipe(fy_member_conf_t *m);

#endif

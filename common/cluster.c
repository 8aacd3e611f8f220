/*
 * cluster.c - configuration shared by every process of a deployment
 * (see cluster.h).
 */
#include "common/cluster.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "common/log.h"
#include "common/mem.h"

static void cluster_usage(FILE *f, const char *prog, const char *usage)
{
    fprintf(f,
            "usage: %s %s\n"
            "  -c, --config FILE      the cluster's configuration (relative paths in it: to its folder); every\n"
            "                         key: `ferry config --markdown`, or docs/operations.md's key reference\n"
            "      --set S.KEY=VALUE  override a key (repeatable; files and overrides apply in order; relative paths\n"
            "                         in it: to the working directory)\n"
            "%s"
            "  -h, --help\n",
            prog, usage,
            strstr(usage, "--spec") ? "      --spec SPEC        short for --set decode.spec=SPEC (the proposer)\n"
                                    : "");
}

fy_status_t fy_cluster_config(int argc, char **argv, const char *usage, fy_config_t **cfg_p)
{
    enum { O_SET = 256, O_SPEC };
    static const struct option opts[] = {
        {"config", required_argument, 0, 'c'},
        {"set", required_argument, 0, O_SET},
        {"spec", required_argument, 0, O_SPEC},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    fy_config_t *c;
    fy_status_t st = fy_config_create(&c);
    if (st) return st;
    const char *prog = argc > 0 ? argv[0] : "ferry";
    int o;
    optind = 0; /* glibc: start afresh, whoever parsed an argv before */
    while (st == FY_OK && (o = getopt_long(argc, argv, "+c:h", opts, NULL)) != -1) {
        switch (o) {
        case 'c': st = fy_config_load(c, optarg); break;
        case O_SET: st = fy_config_set(c, optarg); break;
        case O_SPEC: { /* the decode worker's proposer: --set decode.spec=V */
            char set[512];
            if ((size_t)snprintf(set, sizeof(set), "decode.spec=%s", optarg) >= sizeof(set)) {
                fprintf(stderr, "%s: --spec value too long\n", prog);
                st = FY_ERR_INVALID;
            } else {
                st = fy_config_set(c, set);
            }
            break;
        }
        case 'h':
            cluster_usage(stdout, prog, usage);
            st = FY_ERR_CANCELLED;
            break;
        default: /* getopt_long said what */ cluster_usage(stderr, prog, usage); st = FY_ERR_INVALID;
        }
    }
    if (st == FY_OK && optind < argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", prog, argv[optind]);
        cluster_usage(stderr, prog, usage);
        st = FY_ERR_INVALID;
    }
    if (st == FY_OK) st = fy_conf_check(c, false); /* every key in the table (confkeys.c) */
    if (st) {
        fy_config_destroy(c);
        return st;
    }
    *cfg_p = c;
    return FY_OK;
}

/* Reads a secret file (what: "kv.secret_file", "client key file", for the
 * error lines): a regular file (a FIFO or a device would block or never
 * end: refused, never waited on), owned by this user or root (as ssh
 * requires of a private key), that its owner alone may read or write, of
 * 16 to max bytes (a longer one is refused, never cut).  O_NONBLOCK: the
 * open of a FIFO returns at once, and fstat refuses it.  Links are
 * followed: Kubernetes mounts a secret as a link into ..data/. */
#define READ_SECRET_MAX 256 /* bytes of the largest secret file: a client key file */

static fy_status_t read_secret_max(const char *path, const char *what, uint8_t *buf, size_t max, size_t *len_p)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        fy_error("%s %s: cannot open: %m", what, path);
        return errno == ENOENT ? FY_ERR_NOT_FOUND : FY_ERR_IO;
    }
    struct stat sb;
    if (fstat(fd, &sb)) {
        fy_error("%s %s: cannot stat: %m", what, path);
        close(fd);
        return FY_ERR_IO;
    }
    if (!S_ISREG(sb.st_mode)) {
        fy_error("%s %s: not a regular file (%s); a secret must be a plain file", what, path,
                 S_ISFIFO(sb.st_mode)                         ? "a FIFO"
                 : S_ISDIR(sb.st_mode)                        ? "a directory"
                 : S_ISCHR(sb.st_mode) || S_ISBLK(sb.st_mode) ? "a device"
                 : S_ISSOCK(sb.st_mode)                       ? "a socket"
                                                              : "not a file");
        close(fd);
        return FY_ERR_INVALID;
    }
    if (sb.st_uid != geteuid() && sb.st_uid != 0) {
        fy_error("%s %s: owned by uid %u, not by this user (uid %u) or root; someone else could replace it "
                 "(chown it, or make your own)",
                 what, path, (unsigned)sb.st_uid, (unsigned)geteuid());
        close(fd);
        return FY_ERR_INVALID;
    }
    if (sb.st_mode & 077) {
        fy_error("%s %s: mode %04o lets its group or others at it; it must be the owner's alone "
                 "(chmod 600 %s)",
                 what, path, (unsigned)(sb.st_mode & 07777), path);
        close(fd);
        return FY_ERR_INVALID;
    }
    if (sb.st_size > (off_t)max) {
        fy_error("%s %s: %lld bytes; at most %zu are allowed (nothing is cut off a secret)", what, path,
                 (long long)sb.st_size, max);
        close(fd);
        return FY_ERR_FORMAT;
    }
    /* one byte more than allowed: a file that grew after fstat is caught too */
    uint8_t tmp[READ_SECRET_MAX + 1];
    size_t n = 0;
    if (max > READ_SECRET_MAX) max = READ_SECRET_MAX;
    while (n <= max) {
        ssize_t r = read(fd, tmp + n, sizeof(tmp) - n); /* n <= max < sizeof(tmp) */
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            fy_error("%s %s: cannot read: %m", what, path);
            close(fd);
            sodium_memzero(tmp, sizeof(tmp));
            return FY_ERR_IO;
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    close(fd);
    if (n <= max) memcpy(buf, tmp, n);
    sodium_memzero(tmp, sizeof(tmp));
    if (n > max) {
        fy_error("%s %s: more than %zu bytes; at most %zu are allowed (nothing is cut off a secret)", what, path, max,
                 max);
        return FY_ERR_FORMAT;
    }
    if (n < 16) {
        fy_error("%s %s: %zu bytes; at least 16 are needed", what, path, n);
        return FY_ERR_FORMAT;
    }
    *len_p = n;
    return FY_OK;
}

fy_status_t fy_cluster_read_secret_file(const char *path, const char *what, uint8_t *buf, size_t max, size_t *len_p)
{
    return read_secret_max(path, what, buf, max, len_p);
}

/* The deployment's secret: 16 to FY_CLUSTER_SECRET_MAX bytes. */
static fy_status_t read_secret(const char *path, uint8_t *buf, size_t cap, size_t *len_p)
{
    return read_secret_max(path, "kv.secret_file", buf, cap < FY_CLUSTER_SECRET_MAX ? cap : FY_CLUSTER_SECRET_MAX,
                           len_p);
}

fy_status_t fy_cluster_secret(const fy_config_t *cfg, uint8_t *key, size_t cap, size_t *n_p)
{
    const char *path;
    fy_status_t st = fy_conf_string(cfg, "kv", "secret_file", &path);
    if (st) return st;
    if (!path || !*path) {
        *n_p = 0;
        return FY_OK;
    }
    return read_secret(path, key, cap, n_p);
}

fy_status_t fy_cluster_make_secret(const char *path)
{
    uint8_t key[64];
    size_t n;
    if (sodium_init() < 0) return FY_ERR_INTERNAL;
    /* O_EXCL: never write through a file (or a link) someone else put there */
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 && errno == EEXIST) { /* one made earlier: use it if it is sound */
        fy_status_t st = read_secret(path, key, sizeof(key), &n);
        sodium_memzero(key, sizeof(key));
        return st;
    }
    if (fd < 0) {
        fy_error("kv secret %s: cannot create: %m", path);
        return FY_ERR_IO;
    }
    randombytes_buf(key, 32);
    ssize_t w = write(fd, key, 32);
    sodium_memzero(key, sizeof(key));
    if (w != 32 || close(fd) != 0) {
        fy_error("kv secret %s: cannot write: %m", path);
        if (w != 32) close(fd);
        unlink(path);
        return FY_ERR_IO;
    }
    return FY_OK;
}

bool fy_cluster_secret_path(const fy_config_t *cfg, char *out, size_t cap)
{
    const char *path = NULL, *run_dir = NULL;
    if (fy_conf_string(cfg, "kv", "secret_file", &path) == FY_OK && path && *path)
        return (size_t)snprintf(out, cap, "%s", path) < cap;
    if (fy_conf_string(cfg, "serve", "run_dir", &run_dir) != FY_OK || !run_dir) return false;
    return (size_t)snprintf(out, cap, "%s/kv.secret", run_dir) < cap;
}

fy_status_t fy_cluster_auth_file(const char *path, fy_env_role_t role, const char *name, uint64_t inc,
                                 fy_env_auth_t *auth_p)
{
    /* a client key file is longer than any secret: read up to its size, then tell them apart */
    uint8_t buf[FY_ENV_KEYFILE_MAX];
    size_t n;
    const char *what = role == FY_ROLE_CLIENT ? "secret or client key file" : "kv.secret_file";
    fy_status_t st = read_secret_max(path, what, buf, sizeof(buf), &n);
    if (st) return st;
    size_t ml = sizeof(FY_ENV_KEYFILE_MAGIC) - 1;
    fy_env_auth_t a;
    if (n >= ml && !memcmp(buf, FY_ENV_KEYFILE_MAGIC, ml)) {
        char kname[FY_ENV_NAME_MAX + 1];
        fy_env_key_t key;
        st = fy_env_keyfile_parse(buf, n, kname, &key);
        sodium_memzero(buf, sizeof(buf));
        if (st) {
            fy_error("client key file %s: not a key file as `ferry key --client NAME` writes it "
                     "(\"%sNAME HEX\", one line)",
                     path, FY_ENV_KEYFILE_MAGIC);
            return FY_ERR_FORMAT;
        }
        if (role != FY_ROLE_CLIENT) {
            sodium_memzero(&key, sizeof(key));
            fy_error("client key file %s: a client's key speaks only as a client, not as %s; give the "
                     "deployment's secret (kv.secret_file)",
                     path, fy_env_role_str(role));
            return FY_ERR_INVALID;
        }
        st = fy_env_auth_client(&a, &key, kname, inc); /* the file names the client */
        sodium_memzero(&key, sizeof(key));
    } else if (n > FY_CLUSTER_SECRET_MAX) {
        sodium_memzero(buf, sizeof(buf));
        fy_error("%s %s: %zu bytes; at most %d are allowed (nothing is cut off a secret)", what, path, n,
                 FY_CLUSTER_SECRET_MAX);
        return FY_ERR_FORMAT;
    } else {
        st = fy_env_auth_init(&a, buf, n, role, name, inc);
        sodium_memzero(buf, sizeof(buf));
    }
    if (st) return st;
    *auth_p = a;
    fy_env_auth_wipe(&a);
    return FY_OK;
}

fy_status_t fy_cluster_write_client_key(const char *secret_path, const char *name, const char *out_path)
{
    uint8_t key[FY_CLUSTER_SECRET_MAX];
    size_t n;
    fy_status_t st = read_secret(secret_path, key, sizeof(key), &n);
    if (st) return st;
    fy_env_auth_t a;
    st = fy_env_auth_init(&a, key, n, FY_ROLE_CLIENT, name, 0);
    sodium_memzero(key, sizeof(key));
    if (st) return st;
    char text[FY_ENV_KEYFILE_MAX];
    size_t len = fy_env_keyfile_format(a.name, &a.key, text, sizeof(text));
    fy_env_auth_wipe(&a);
    if (!len) return FY_ERR_INTERNAL;
    /* O_EXCL | O_NOFOLLOW: never write through a file or a link someone else put there */
    int fd = open(out_path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        fy_error("client key file %s: cannot create: %m%s", out_path,
                 errno == EEXIST ? " (it is never overwritten: remove it first)" : "");
        sodium_memzero(text, sizeof(text));
        return errno == EEXIST ? FY_ERR_INVALID : FY_ERR_IO;
    }
    ssize_t w = write(fd, text, len);
    sodium_memzero(text, sizeof(text));
    if (w != (ssize_t)len || close(fd) != 0) {
        fy_error("client key file %s: cannot write: %m", out_path);
        if (w != (ssize_t)len) close(fd);
        unlink(out_path);
        return FY_ERR_IO;
    }
    return FY_OK;
}

fy_status_t fy_cluster_auth(const char *path, int crypt, fy_env_role_t role, const char *name, uint64_t inc,
                            fy_env_auth_t *auth_p)
{
    if (!path || !*path) {
        fy_error("kv.secret_file is not set: the control plane needs the deployment's secret, the same file for "
                 "every process of the cluster (`ferry serve` makes RUN_DIR/kv.secret)");
        return FY_ERR_INVALID;
    }
    fy_status_t st = fy_cluster_auth_file(path, role, name, inc, auth_p);
    if (st) return st;
    auth_p->crypt = (fy_env_crypt_t)crypt; /* the table's choices, in enum order */
    return FY_OK;
}

fy_status_t fy_cluster_prefix_secret(const fy_config_t *cfg, uint8_t *key, size_t cap, size_t *n_p)
{
    fy_status_t st = fy_cluster_secret(cfg, key, cap, n_p);
    if (!st && !*n_p) fy_warn("kv.secret_file is not set: prefix-block names are private to this process");
    return st;
}

fy_status_t fy_cluster_ranks(const fy_config_t *cfg, const char *role, int32_t *tp_p, int32_t *pp_p)
{
    int64_t tp, pp, role_tp, role_pp;
    fy_status_t st;
    if ((st = fy_conf_int(cfg, "worker", "tp", &tp)) || (st = fy_conf_int(cfg, "worker", "pp", &pp)) ||
        (st = fy_conf_int(cfg, role, "tp", &role_tp)) || (st = fy_conf_int(cfg, role, "pp", &role_pp)))
        return st;
    *tp_p = (int32_t)(role_tp ? role_tp : tp);
    *pp_p = (int32_t)(role_pp ? role_pp : pp);
    return FY_OK;
}

fy_status_t fy_cluster_kv(const fy_config_t *cfg, int32_t *block_size_p, fy_dtype_t *dtype_p)
{
    int64_t bs;
    const char *dt;
    fy_dtype_t d;
    fy_status_t st = fy_conf_int(cfg, "kv", "block_size", &bs);
    if (!st) st = fy_conf_string(cfg, "kv", "dtype", &dt); /* one of the table's choices, each a dtype's name */
    if (st) return st;
    if (fy_dtype_from_name(dt, &d)) {
        fy_error("config: kv.dtype = '%s': the key table allows a name that is not a dtype", dt);
        return FY_ERR_INTERNAL;
    }
    *block_size_p = (int32_t)bs;
    *dtype_p = d;
    return FY_OK;
}

bool fy_cluster_addr_plus(const char *base, int i, char *out, size_t cap)
{
    const char *colon = strrchr(base, ':');
    bool tcp = !strncmp(base, "tcp://", 6), http = !strncmp(base, "http://", 7), https = !strncmp(base, "https://", 8);
    if ((tcp || http || https) && colon && colon > base + (tcp ? 6 : http ? 7 : 8)) {
        char *end;
        long port = strtol(colon + 1, &end, 10);
        if (*end || port < 1 || port + i > 65535) return false;
        return snprintf(out, cap, "%.*s:%ld", (int)(colon - base), base, port + i) < (int)cap;
    }
    if (!strncmp(base, "ipc://", 6)) return snprintf(out, cap, "%s-%d", base, i) < (int)cap;
    return false;
}

void fy_cluster_notify_ready(void)
{
    const char *v = getenv(FY_CLUSTER_READY_ENV);
    if (!v) return;
    char *end;
    errno = 0;
    long fd = strtol(v, &end, 10);
    if (errno || end == v || *end || fd < 0 || fd > INT_MAX) {
        fy_warn("%s='%s' is not a descriptor; not reporting readiness", FY_CLUSTER_READY_ENV, v);
        unsetenv(FY_CLUSTER_READY_ENV);
        return;
    }
    unsetenv(FY_CLUSTER_READY_ENV);
    static const char msg[] = "ready\n";
    ssize_t n;
    do n = write((int)fd, msg, sizeof(msg) - 1);
    while (n < 0 && errno == EINTR);
    if (n != (ssize_t)sizeof(msg) - 1) fy_warn("cannot report readiness on descriptor %ld: %m", fd);
    close((int)fd);
}

void fy_cluster_raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl)) {
        fy_warn("cannot read the descriptor limit: %s", strerror(errno));
        return;
    }
    if (rl.rlim_cur == rl.rlim_max) return;
    rlim_t was = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl))
        fy_warn("cannot raise the descriptor limit from %llu to %llu: %s", (unsigned long long)was,
                (unsigned long long)rl.rlim_max, strerror(errno));
    else
        fy_debug("descriptor limit raised from %llu to %llu", (unsigned long long)was, (unsigned long long)rl.rlim_max);
}

fy_status_t fy_cluster_served_model_name(const fy_config_t *cfg, char *out, size_t cap)
{
    const char *served = fy_conf_default("router", "served_model_name"), *path = fy_conf_default("model", "path");
    fy_status_t st;
    if (cfg && ((st = fy_conf_string(cfg, "router", "served_model_name", &served)) ||
                (st = fy_conf_string(cfg, "model", "path", &path))))
        return st;
    if (!cap) return FY_ERR_INVALID;
    if (served && *served) {
        snprintf(out, cap, "%s", served);
        return FY_OK;
    }
    path = path ? path : "";
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    snprintf(out, cap, "%s", base);
    size_t l = strlen(out);
    if (l > 5 && !strcmp(out + l - 5, ".gguf")) out[l - 5] = 0;
    return FY_OK;
}

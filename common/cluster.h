/*
 * cluster.h - what every process of a ferry deployment reads the same way:
 * the keys a cluster configuration may hold, the command line that loads
 * one ("-c FILE --set section.key=value ..."), the deployment's secret (for
 * prefix-block names and the control plane's credentials), and the KV
 * layout settings.
 *
 * One table of known keys for all processes (common/confkeys.c), so one
 * file configures the router, the workers and `ferry serve` alike, and a
 * typo anywhere is refused everywhere.
 */
#ifndef FY_CLUSTER_H
#define FY_CLUSTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/config.h"
#include "common/dtype.h"
#include "common/envelope.h"
#include "common/status.h"

/* Loads -c FILE (at most one, optional when defaults suffice) and every
 * --set assignment from argv (getopt_long), in order, then checks that
 * every key is in the key table (values are checked where they are
 * read).  --spec V is short for --set decode.spec=V (a decode worker's
 * speculative proposer).  -h/--help prints "usage: PROG USAGE" and the
 * options on stdout and returns FY_ERR_CANCELLED (exit 0); an unknown
 * option or an operand prints the same on stderr and returns
 * FY_ERR_INVALID (exit 2).  argv[0] names the program in messages. */
fy_status_t fy_cluster_config(int argc, char **argv, const char *usage, fy_config_t **cfg_p);

#define FY_CLUSTER_SECRET_MAX 64 /* bytes of the deployment's secret, at most */

/* The deployment's secret (kv.secret_file: 16 to FY_CLUSTER_SECRET_MAX
 * bytes; cap at least that) into key, its length in *n_p; *n_p = 0
 * without kv.secret_file.  Refused with an error naming the file: not a
 * regular file (a FIFO is never waited on), owned by someone other than
 * this user or root, readable or writable by its group or others (naming
 * the mode), or longer than the maximum (naming its size: never cut).
 * The caller wipes key. */
fy_status_t fy_cluster_secret(const fy_config_t *cfg, uint8_t *key, size_t cap, size_t *n_p);
/* fy_cluster_secret for naming prefix blocks: without kv.secret_file
 * (*n_p = 0) it warns that names are private to this process, so the
 * router and workers cannot share them. */
fy_status_t fy_cluster_prefix_secret(const fy_config_t *cfg, uint8_t *key, size_t cap, size_t *n_p);

/* Creates path (O_EXCL, mode 0600) holding 32 random bytes, or, when it
 * exists, checks that it is a usable secret (regular, at least 16 bytes,
 * readable by its owner only). */
fy_status_t fy_cluster_make_secret(const char *path);

/* Reads a secret file as fy_cluster_secret does (what names it in the
 * errors: "cluster.etcd_password_file"): 16 to max bytes (at most 256). */
fy_status_t fy_cluster_read_secret_file(const char *path, const char *what, uint8_t *buf, size_t max, size_t *len_p);

/* Where the deployment's secret is: kv.secret_file, else serve.run_dir +
 * "/kv.secret", the file `ferry serve` makes.  cfg NULL: the defaults
 * ("run/kv.secret").  False if it does not fit in cap. */
bool fy_cluster_secret_path(const fy_config_t *cfg, char *out, size_t cap);

/* The control plane's credentials of this process (envelope.h): the keys
 * derived from the secret file at path, with role, name and incarnation
 * (0: a random one).  The file is checked as fy_cluster_secret does.  For
 * role client, path may also be a client key file (`ferry key`): the
 * client is then the one the file names (name is not used), holding its
 * own key only; a key file for any other role is refused. */
fy_status_t fy_cluster_auth_file(const char *path, fy_env_role_t role, const char *name, uint64_t inc,
                                 fy_env_auth_t *auth_p);
/* Writes a client key file for name at out_path (created O_EXCL,
 * O_NOFOLLOW, mode 0600; never overwritten), from the deployment's secret
 * at secret_path: what `ferry key --client NAME` does. */
fy_status_t fy_cluster_write_client_key(const char *secret_path, const char *name, const char *out_path);

/* The same from kv.secret_file's path, which a router and workers must
 * have ("" or NULL: refused, naming the key), with cluster.encrypt's
 * policy, its index among the key's choices (fy_cluster_auth_file leaves
 * auto); both read once at start into the process's typed struct. */
fy_status_t fy_cluster_auth(const char *secret_file, int encrypt, fy_env_role_t role, const char *name, uint64_t inc,
                            fy_env_auth_t *auth_p);

/* The name the deployment serves its model under: router.served_model_name,
 * else the file name of model.path without ".gguf" (as llama.cpp's server
 * names it).  Every process reads it the same way, so the router's API and
 * the model_name label on every process's metrics agree.  Truncated to
 * cap; cfg NULL: the defaults. */
fy_status_t fy_cluster_served_model_name(const fy_config_t *cfg, char *out, size_t cap);

/* A role's rank group ("prefill" or "decode"): its own tp and pp where
 * set, else worker.tp and worker.pp (cfg NULL: the defaults, 1 and 1).
 * The one place the rule lives: workers and `ferry chaos` call it. */
fy_status_t fy_cluster_ranks(const fy_config_t *cfg, const char *role, int32_t *tp_p, int32_t *pp_p);

/* kv.block_size and kv.dtype (cfg NULL: their defaults). */
fy_status_t fy_cluster_kv(const fy_config_t *cfg, int32_t *block_size_p, fy_dtype_t *dtype_p);

/* The environment variable through which a supervisor (`ferry serve`)
 * hands a child the write end of its readiness pipe. */
#define FY_CLUSTER_READY_ENV "FERRY_READY_FD"

/* Tells the supervisor that started this process, if any, that it is
 * ready: every listener is bound.  Writes "ready\n" on the descriptor
 * named by $FERRY_READY_FD, closes it and unsets the variable; nothing
 * when the variable is absent (a process started by hand).  A failure is
 * logged (the supervisor then sees the process as never ready). */
void fy_cluster_notify_ready(void);

/* Worker i's address from its role's base address: "tcp://host:port"
 * (or "http://host:port", "https://host:port") -> the same with port + i, "ipc:///p" ->
 * "ipc:///p-i".  False for anything else, a port past 65535, or out too
 * small. */
bool fy_cluster_addr_plus(const char *base, int i, char *out, size_t cap);

/* Raises this process's soft limit on open descriptors to the hard limit
 * (a server's connections, sockets and files all take one), logging the
 * new limit at debug level and a failure as a warning.  Call at start. */
void fy_cluster_raise_nofile(void);

#endif /* FY_CLUSTER_H */

/*
 * worker_config.h - what a worker builds, read from its configuration once
 * at start: the typed fy_engine_build_t the engine's builder takes
 * (engine/engine_config.h), so nothing in engine/ or kv/ reads
 * configuration keys.
 */
#ifndef FY_WORKER_CONFIG_H
#define FY_WORKER_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "common/netconf.h"
#include "engine/engine_config.h"
#include "common/status.h"

struct fy_config; /* common/config.h: worker_config.c alone reads one */

/*
 * What a worker of role ("prefill" or "decode") builds, from c through the
 * key table: ROLE.threads, kv_mem, max_seqs, max_batch_tokens (at least
 * max_seqs), max_waiting, ctx, tp and pp (fy_cluster_ranks); kv.block_size,
 * dtype, prefix_cache, sliding_groups, evict and the prefix hasher's secret
 * (kv.secret_file, copied into the build); worker.device, isa, attn and
 * cuda_graphs; for decode also host_kv_mem and the disk tier, preempt,
 * itl_target and the speculative decoding of decode.spec* (a draft takes
 * decode.spec_draft_kv_fraction of kv_mem).  String members point into c,
 * which must outlive the build.  The caller adds the engine's tick.
 * FY_ERR_INVALID (logged, naming the key) for a bad value; *b_p is set on
 * success only.
 */
fy_status_t fy_worker_build_read(const struct fy_config *c, const char *role, fy_engine_build_t *b_p);

/*
 * Everything a worker node (node.c) and its role read, once at start: the
 * engine's build (fy_worker_build_read, its strings copied in here), the
 * node's addresses and timings, its credentials' file, the name its
 * metrics carry, its membership in etcd and its metrics server's limits;
 * for a decode worker decode.max_lease.  After start-up node.c and the
 * roles (decode/, prefill/) read only this struct (fy_node_conf).
 * Not to be copied: eb's strings point into it.
 */
typedef struct fy_node_conf {
    char cpus[FY_CONF_VALUE_MAX];       /* ROLE.cpus: "" not pinned */
    char model_path[FY_CONF_VALUE_MAX]; /* model.path */
    char name[FY_CONF_VALUE_MAX];       /* worker.name: "" ROLE-PID */
    char listen[FY_CONF_VALUE_MAX];     /* ROLE.listen: the routers' commands */
    char events[FY_CONF_VALUE_MAX];     /* router.events: the one router's, without etcd */
    char transports[FY_CONF_VALUE_MAX], net_devices[FY_CONF_VALUE_MAX]; /* worker.*: UCX's */
    char metrics[FY_CONF_VALUE_MAX];                                    /* ROLE.metrics: "" none */
    char kv_transfer[FY_CONF_VALUE_MAX];                                /* worker.kv_transfer */
    double heartbeat, stall;                                            /* worker.heartbeat, stall_timeout */
    int64_t staging_blocks;                                             /* worker.kv_staging_blocks */
    fy_engine_build_t eb; /* its hash_key is the deployment's secret: wiped once the stack holds it */
    char device[FY_CONF_VALUE_MAX], isa[FY_CONF_VALUE_MAX], disk_dir[FY_CONF_VALUE_MAX], draft[FY_CONF_VALUE_MAX];
    char secret_file[FY_CONF_VALUE_MAX]; /* kv.secret_file: the control plane's credentials */
    int encrypt;                         /* cluster.encrypt's index */
    char served[128];                    /* router.served_model_name, else model.path's base */
    bool prefix_cache;                   /* kv.prefix_cache */
    fy_member_conf_t members;            /* cluster.etcd and the rest of its membership */
    fy_httpd_limits_t http_lim;          /* worker.http_*: read where ROLE.metrics is set */
    double max_lease;                    /* decode.max_lease: a decode worker's */
} fy_node_conf_t;

/* nc from c for a worker of role ("prefill" or "decode"), every key in
 * the order the node used to read them, with the same errors naming the
 * key (FY_ERR_INVALID and the like, logged); nc is wiped on failure. */
fy_status_t fy_node_conf_read(const struct fy_config *c, const char *role, fy_node_conf_t *nc);
/* Wipes nc's secrets (the engine build's hash key, the membership's). */
void fy_node_conf_wipe_secrets(fy_node_conf_t *nc);
/* A worker's start: its configuration from argv (fy_cluster_config with
 * usage), read into *nc, then freed: nothing after holds it.  *loaded says
 * whether the configuration itself loaded (false: a bad file or argument,
 * or --help: FY_ERR_CANCELLED); a key refused after it did is a start-up
 * failure. */
fy_status_t fy_node_conf_load(int argc, char **argv, const char *usage, const char *role, fy_node_conf_t *nc,
                              bool *loaded);

#endif /* FY_WORKER_CONFIG_H */

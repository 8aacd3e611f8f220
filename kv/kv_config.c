/* kv_config.c - the deployment's prefix-block hasher, from its config. */
#include "kv.h"

#include <sodium.h>

#include "cluster.h"
#include "log.h"

fy_status_t fy_kv_hasher_from_config(const fy_config_t *cfg, fy_kv_hasher_t **h_p)
{
    uint8_t key[64];
    size_t n;
    fy_status_t st = fy_cluster_secret(cfg, key, sizeof(key), &n);
    if (st) return st;
    if (n == 0) { /* a process on its own: nobody else names its blocks */
        fy_warn("kv.secret_file is not set: prefix-block names are private to this process");
        return fy_kv_hasher_create_random(h_p);
    }
    st = fy_kv_hasher_create(key, n, h_p);
    sodium_memzero(key, sizeof(key));
    return st;
}

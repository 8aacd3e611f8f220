/*
 * fuzz_etcd.c - what etcd's JSON gateway answers (rpc/etcd.c): the range
 * answer (keys and values base64), the lease grant and keepalive answers,
 * the error object, and the registration record a peer wrote
 * (fy_member_read).  Every input goes to each parser.
 *
 * Checks: a range answer read whole has keys of 1..FY_ETCD_MAX_KEY bytes
 * without NUL and values within FY_ETCD_MAX_VALUE, NUL-terminated; a
 * lease has a non-zero id and a TTL >= 0; a record read whole writes back
 * (fy_member_write) and reads again to the same record.  Seeds: answers
 * of a real etcd 3.4 and records as ferry writes them (mkseeds.c).
 */
#include <stdio.h>
#include <string.h>

#include "etcd.h"
#include "mem.h"
#include "util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fz_quiet_log();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[256];
    fy_etcd_kvs_t k = {0};
    if (fy_etcd_parse_range(data, size, &k, err, sizeof(err)) == FY_OK) {
        FZ_CHECK(k.n >= 0 && k.n <= FY_ETCD_MAX_KVS, "%d keys", k.n);
        for (int i = 0; i < k.n; i++) {
            size_t kl = strlen(k.kv[i].key);
            FZ_CHECK(kl >= 1 && kl <= FY_ETCD_MAX_KEY, "key of %zu bytes", kl);
            FZ_CHECK(k.kv[i].value_len <= FY_ETCD_MAX_VALUE, "value of %zu bytes", k.kv[i].value_len);
            FZ_CHECK(k.kv[i].value[k.kv[i].value_len] == 0, "value not NUL-terminated");
            fy_member_t m;
            (void)fy_member_read(k.kv[i].value, k.kv[i].value_len, &m, err, sizeof(err));
        }
        fy_etcd_kvs_free(&k);
    }
    int64_t id = 0, ttl = 0;
    if (fy_etcd_parse_lease(data, size, &id, &ttl, err, sizeof(err)) == FY_OK)
        FZ_CHECK(id != 0 && ttl >= 0, "lease %lld with TTL %lld", (long long)id, (long long)ttl);
    (void)fy_etcd_parse_ok(data, size, err, sizeof(err));
    fy_member_t m, m2;
    if (fy_member_read(data, size, &m, err, sizeof(err)) == FY_OK) {
        char *json;
        size_t len;
        FZ_CHECK(fy_member_write(&m, &json, &len) == FY_OK, "a record read does not write");
        FZ_CHECK(fy_member_read(json, len, &m2, err, sizeof(err)) == FY_OK, "a record written does not read: %s", err);
        FZ_CHECK(!memcmp(&m, &m2, sizeof(m)), "a record does not read back the same");
        fy_free(json);
    }
    return 0;
}

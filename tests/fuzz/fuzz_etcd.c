/*
 * fuzz_etcd.c - what etcd's JSON gateway answers (rpc/etcd.c): the range
 * answer (keys and values base64), the lease grant and keepalive answers,
 * the error object, and the registration record a peer wrote
 * (fy_member_read).  Every input goes to each parser.
 *
 * Also the transaction answer of a router's tag claim
 * (fy_etcd_parse_txn), and every record read is verified (fy_member_verify,
 * the key of FZ_MEMBER_SECRET) as its etcd key would say.
 *
 * Checks: a range answer read whole has keys of 1..FY_ETCD_MAX_KEY bytes
 * without NUL and values within FY_ETCD_MAX_VALUE, NUL-terminated; a
 * lease has a non-zero id and a TTL >= 0; a record read whole writes back
 * (fy_member_write) and reads again to the same record, and verifies the
 * same before and after; a lost transaction holds what a range holds.
 * Seeds: answers of a real etcd 3.4 and records as ferry signs them
 * (mkseeds.c).
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rpc/etcd.h"
#include "common/mem.h"
#include "tests/fuzz/util.h"

static uint8_t key[FY_MEMBER_KEY_BYTES];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fz_quiet_log();
    if (fy_member_key((const uint8_t *)FZ_MEMBER_SECRET, strlen(FZ_MEMBER_SECRET), key)) abort();
    return 0;
}

/* verifies a record read under the etcd key its name and kind give */
static fy_status_t verify(const fy_member_t *m)
{
    char ek[256], err[256];
    snprintf(ek, sizeof(ek), "/ferry/t/%s/%s", !strcmp(m->kind, "router") ? "routers" : "workers/decode", m->name);
    return fy_member_verify(m, key, ek, 1700000001000, 30, err, sizeof(err));
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
            if (fy_member_read(k.kv[i].value, k.kv[i].value_len, &m, err, sizeof(err)) == FY_OK) (void)verify(&m);
        }
        fy_etcd_kvs_free(&k);
    }
    bool won = false;
    if (fy_etcd_parse_txn(data, size, &won, &k, err, sizeof(err)) == FY_OK) {
        FZ_CHECK(!won || k.n == 0, "a won transaction with %d keys", k.n);
        for (int i = 0; i < k.n; i++) FZ_CHECK(k.kv[i].value[k.kv[i].value_len] == 0, "value not NUL-terminated");
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
        FZ_CHECK(verify(&m) == verify(&m2), "a record verifies differently written back");
        fy_free(json);
    }
    return 0;
}

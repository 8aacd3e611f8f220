/*
 * tenants.h - API keys, the tenants they belong to, and per-tenant limits.
 *
 * The key file (router.api_keys) has one key a line:
 *
 *     KEY TENANT [max_concurrent=N] [tokens_per_minute=N]
 *
 * with '#' comments and blank lines.  Several keys may name one tenant;
 * the limits are the tenant's (the first line that sets one wins, a
 * later different value is an error).  Keys are kept only as BLAKE2b
 * digests and compared in constant time.  The tenant of the key, never
 * anything the client writes, names the request's prefix-cache
 * namespace.
 *
 * Limits: requests running at once, and tokens a minute as a bucket of
 * tokens_per_minute that refills continuously; a request is charged its
 * prompt plus max_tokens for each sample when it starts and refunded what
 * it did not generate when it ends.  Not thread-safe: the router's lock
 * covers every call.
 */
#ifndef FY_TENANTS_H
#define FY_TENANTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct fy_tenants fy_tenants_t;
typedef struct fy_tenant fy_tenant_t;

/* Reads the key file; errors name the file and line.  A file its group or
 * others may read or write is refused (FY_ERR_INVALID), naming its mode. */
fy_status_t fy_tenants_load(const char *path, fy_tenants_t **t_p);
void fy_tenants_destroy(fy_tenants_t *t); /* accepts NULL */

/* The tenant of a key, or NULL. */
fy_tenant_t *fy_tenants_find(fy_tenants_t *t, const char *key, size_t len);
const char *fy_tenant_name(const fy_tenant_t *t);

typedef enum fy_tenant_verdict {
    FY_TENANT_OK = 0,
    FY_TENANT_CONCURRENCY, /* max_concurrent requests running */
    FY_TENANT_TOKENS,      /* the minute's tokens are spent */
} fy_tenant_verdict_t;

/* Admits a request of n_requests samples costing tokens, or says why
 * not and how many seconds until it could be (*retry_s). */
fy_tenant_verdict_t fy_tenant_admit(fy_tenant_t *t, int32_t n_requests, int64_t tokens, double now, double *retry_s);
/* A request admitted earlier ends: unused tokens go back. */
void fy_tenant_release(fy_tenant_t *t, int32_t n_requests, int64_t unused_tokens, double now);

#endif /* FY_TENANTS_H */

/*
 * fuzz_tenants.c - API-key files (router/tenants.c): an input is a key
 * file (written with mode 0600).
 *
 * Checks: fy_tenants_load refuses the file (invalid, io) or loads it, and
 * then every key line of the file finds its own tenant by name, a key not
 * in the file finds none, and admitting and releasing requests with the
 * tenant's limits gives verdicts whose retry delay is finite and not
 * negative.  Seeds: key files as test_tenants.c writes them.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "router/tenants.h"
#include "tests/fuzz/util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fz_quiet_log();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fz_write("api_keys", data, size);
    fy_tenants_t *t = NULL;
    fy_status_t st = fy_tenants_load(path, &t);
    FZ_CHECK(st == FY_OK || st == FY_ERR_INVALID || st == FY_ERR_IO, "fy_tenants_load returned %s", fy_status_str(st));
    if (st != FY_OK) return 0;
    /* every line "KEY TENANT ..." before a '#', read as the loader reads a
     * line (up to a NUL byte in it) */
    fy_tenant_t *any = NULL;
    for (const uint8_t *p = data, *end = data + size; p < end;) {
        const uint8_t *nl = memchr(p, '\n', (size_t)(end - p));
        char *line = fz_strndup(p, nl ? (size_t)(nl - p) : (size_t)(end - p));
        p = nl ? nl + 1 : end;
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        char *save = NULL, *key = strtok_r(line, " \t\r", &save);
        if (!key) {
            free(line);
            continue;
        }
        char *name = strtok_r(NULL, " \t\r", &save);
        FZ_CHECK(name != NULL, "a key line without a tenant was accepted");
        fy_tenant_t *x = fy_tenants_find(t, key, strlen(key));
        FZ_CHECK(x != NULL, "key '%s' of the file finds no tenant", key);
        FZ_CHECK(!strcmp(fy_tenant_name(x), name), "key '%s' finds tenant '%s', not '%s'", key, fy_tenant_name(x),
                 name);
        any = x;
        free(line);
    }
    FZ_CHECK(!fy_tenants_find(t, "not-a-key-of-this-file-\x01", 24), "a stranger's key finds a tenant");
    FZ_CHECK(!fy_tenants_find(t, (const char *)data, 0), "the empty key finds a tenant");
    if (!any) { /* every key came after a NUL byte on a line longer than the line limit: see docs/fuzzing.md */
        fy_tenants_destroy(t);
        return 0;
    }

    double now = 1000, retry = -1;
    for (int i = 0; i < 4; i++) {
        int64_t cost = (int64_t)1 << (i * 12);
        fy_tenant_verdict_t v = fy_tenant_admit(any, 1 + i, cost, now, &retry);
        FZ_CHECK(v == FY_TENANT_OK || v == FY_TENANT_CONCURRENCY || v == FY_TENANT_TOKENS, "verdict %d", (int)v);
        FZ_CHECK(isfinite(retry) && retry >= 0 && (v != FY_TENANT_OK || retry == 0), "retry after %g s", retry);
        if (v == FY_TENANT_OK) fy_tenant_release(any, 1 + i, cost / 2, now + 0.5);
        now += 1;
    }
    fy_tenants_destroy(t);
    return 0;
}

/*
 * tenants.c - API keys to tenants, per-tenant limits (see tenants.h).
 */
#include "router/tenants.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <sodium.h>

#include "common/log.h"
#include "common/mem.h"

#define KEY_MIN 8
#define KEY_MAX 256
#define LINE_MAX_BYTES 1024

struct fy_tenant {
    char name[64];
    int32_t max_concurrent;    /* 0: no limit */
    int64_t tokens_per_minute; /* 0: no limit */
    int32_t running;
    double bucket, t_bucket;
};

typedef struct key {
    uint8_t digest[crypto_generichash_BYTES];
    fy_tenant_t *tenant;
} key_t_;

struct fy_tenants {
    key_t_ *keys;
    int n_keys;
    fy_tenant_t **tenants;
    int n_tenants;
};

static void digest(const char *key, size_t len, uint8_t *out)
{
    crypto_generichash(out, crypto_generichash_BYTES, (const unsigned char *)key, len, NULL, 0);
}

static bool name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > 63) return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("_.-", s[i])) return false;
    return true;
}

static fy_tenant_t *tenant_get(fy_tenants_t *t, const char *name)
{
    for (int i = 0; i < t->n_tenants; i++)
        if (!strcmp(t->tenants[i]->name, name)) return t->tenants[i];
    fy_tenant_t **v = fy_realloc(t->tenants, (size_t)(t->n_tenants + 1) * sizeof(*v));
    if (!v) return NULL;
    t->tenants = v;
    fy_tenant_t *x = fy_calloc(1, sizeof(*x));
    if (!x) return NULL;
    snprintf(x->name, sizeof(x->name), "%s", name);
    x->t_bucket = -1;
    t->tenants[t->n_tenants++] = x;
    return x;
}

/* One "name=value" limit of a key line. */
static fy_status_t set_limit(fy_tenant_t *x, const char *opt, const char *path, int line)
{
    const char *eq = strchr(opt, '=');
    char *end;
    errno = 0;
    long long v = eq ? strtoll(eq + 1, &end, 10) : -1;
    if (!eq || errno || *end || v < 0 || v > (1LL << 40)) {
        fy_error("%s:%d: '%s' is not max_concurrent=N or tokens_per_minute=N", path, line, opt);
        return FY_ERR_INVALID;
    }
    size_t kl = (size_t)(eq - opt);
    int64_t *slot64 = NULL;
    int32_t *slot32 = NULL;
    if (kl == 14 && !strncmp(opt, "max_concurrent", kl)) {
        if (v > 1 << 20) v = 1 << 20;
        slot32 = &x->max_concurrent;
    } else if (kl == 17 && !strncmp(opt, "tokens_per_minute", kl)) {
        slot64 = &x->tokens_per_minute;
    } else {
        fy_error("%s:%d: unknown option '%.*s' (max_concurrent, tokens_per_minute)", path, line, (int)kl, opt);
        return FY_ERR_INVALID;
    }
    long long cur = slot32 ? *slot32 : *slot64;
    if (cur && cur != v) {
        fy_error("%s:%d: tenant %s already has %.*s=%lld", path, line, x->name, (int)kl, opt, cur);
        return FY_ERR_INVALID;
    }
    if (slot32)
        *slot32 = (int32_t)v;
    else
        *slot64 = v;
    return FY_OK;
}

fy_status_t fy_tenants_load(const char *path, fy_tenants_t **t_p)
{
    FILE *f = fopen(path, "re");
    if (!f) {
        fy_error("api keys: cannot open %s: %m", path);
        return FY_ERR_IO;
    }
    /* keys are credentials: a file others can read (or rewrite) is refused,
     * as ssh refuses such a private key */
    struct stat sb;
    if (fstat(fileno(f), &sb)) {
        fy_error("api keys: cannot stat %s: %m", path);
        fclose(f);
        return FY_ERR_IO;
    }
    if (sb.st_mode & 077) {
        fy_error("api keys: %s has mode %04o: its group or others can get at the keys; it must be the owner's alone "
                 "(chmod 600 %s)",
                 path, (unsigned)(sb.st_mode & 07777), path);
        fclose(f);
        return FY_ERR_INVALID;
    }
    if (sodium_init() < 0) {
        fclose(f);
        return FY_ERR_INTERNAL;
    }
    fy_tenants_t *t = fy_calloc(1, sizeof(*t));
    fy_status_t st = t ? FY_OK : FY_ERR_NOMEM;
    char buf[LINE_MAX_BYTES + 2];
    int line = 0;
    while (st == FY_OK && fgets(buf, sizeof(buf), f)) {
        line++;
        size_t len = strlen(buf);
        if (len > LINE_MAX_BYTES) {
            fy_error("%s:%d: line longer than %d bytes", path, line, LINE_MAX_BYTES);
            st = FY_ERR_INVALID;
            break;
        }
        char *hash = strchr(buf, '#');
        if (hash) *hash = 0;
        char *save = NULL, *key = strtok_r(buf, " \t\r\n", &save);
        if (!key) continue;
        char *name = strtok_r(NULL, " \t\r\n", &save);
        size_t kl = strlen(key);
        if (kl < KEY_MIN || kl > KEY_MAX) {
            fy_error("%s:%d: a key has %d to %d characters", path, line, KEY_MIN, KEY_MAX);
            st = FY_ERR_INVALID;
            break;
        }
        if (!name || !name_ok(name)) {
            fy_error("%s:%d: a key needs a tenant name of 1 to 63 letters, digits, '_', '.', '-'", path, line);
            st = FY_ERR_INVALID;
            break;
        }
        uint8_t d[crypto_generichash_BYTES];
        digest(key, kl, d);
        sodium_memzero(key, kl);
        for (int i = 0; i < t->n_keys; i++) {
            if (!sodium_memcmp(t->keys[i].digest, d, sizeof(d))) {
                fy_error("%s:%d: the same key appears twice", path, line);
                st = FY_ERR_INVALID;
            }
        }
        if (st) break;
        fy_tenant_t *x = tenant_get(t, name);
        key_t_ *k = x ? fy_realloc(t->keys, (size_t)(t->n_keys + 1) * sizeof(*k)) : NULL;
        if (!k) {
            st = FY_ERR_NOMEM;
            break;
        }
        t->keys = k;
        memcpy(t->keys[t->n_keys].digest, d, sizeof(d));
        t->keys[t->n_keys++].tenant = x;
        for (char *opt; st == FY_OK && (opt = strtok_r(NULL, " \t\r\n", &save));) st = set_limit(x, opt, path, line);
    }
    sodium_memzero(buf, sizeof(buf));
    if (st == FY_OK && ferror(f)) {
        fy_error("api keys: cannot read %s", path);
        st = FY_ERR_IO;
    }
    fclose(f);
    if (st == FY_OK && t->n_keys == 0) {
        fy_error("%s: no keys (a key file with no keys would lock everyone out)", path);
        st = FY_ERR_INVALID;
    }
    if (st) {
        fy_tenants_destroy(t);
        return st;
    }
    fy_info("api keys: %d keys for %d tenants from %s", t->n_keys, t->n_tenants, path);
    *t_p = t;
    return FY_OK;
}

void fy_tenants_destroy(fy_tenants_t *t)
{
    if (!t) return;
    for (int i = 0; i < t->n_tenants; i++) fy_free(t->tenants[i]);
    fy_free(t->tenants);
    if (t->keys) sodium_memzero(t->keys, (size_t)t->n_keys * sizeof(*t->keys));
    fy_free(t->keys);
    fy_free(t);
}

fy_tenant_t *fy_tenants_find(fy_tenants_t *t, const char *key, size_t len)
{
    if (len < KEY_MIN || len > KEY_MAX) return NULL;
    uint8_t d[crypto_generichash_BYTES];
    digest(key, len, d);
    fy_tenant_t *found = NULL;
    for (int i = 0; i < t->n_keys; i++) /* every key compared: the time does not say which matched */
        if (!sodium_memcmp(t->keys[i].digest, d, sizeof(d))) found = t->keys[i].tenant;
    return found;
}

const char *fy_tenant_name(const fy_tenant_t *t) { return t->name; }

static void refill(fy_tenant_t *t, double now)
{
    double cap = (double)t->tokens_per_minute;
    if (t->t_bucket < 0) {
        t->bucket = cap;
    } else if (now > t->t_bucket) {
        t->bucket += (now - t->t_bucket) * cap / 60.0;
        if (t->bucket > cap) t->bucket = cap;
    }
    t->t_bucket = now;
}

fy_tenant_verdict_t fy_tenant_admit(fy_tenant_t *t, int32_t n_requests, int64_t tokens, double now, double *retry_s)
{
    *retry_s = 0;
    if (t->max_concurrent && t->running + n_requests > t->max_concurrent) {
        *retry_s = 1;
        return FY_TENANT_CONCURRENCY;
    }
    if (t->tokens_per_minute) {
        refill(t, now);
        if ((double)tokens > t->bucket) {
            double rate = (double)t->tokens_per_minute / 60.0;
            /* more than a whole minute's worth never fits: say a minute */
            *retry_s = tokens > t->tokens_per_minute ? 60.0 : ((double)tokens - t->bucket) / rate;
            return FY_TENANT_TOKENS;
        }
        t->bucket -= (double)tokens;
    }
    t->running += n_requests;
    return FY_TENANT_OK;
}

void fy_tenant_release(fy_tenant_t *t, int32_t n_requests, int64_t unused_tokens, double now)
{
    t->running -= n_requests;
    if (t->tokens_per_minute && unused_tokens > 0) {
        refill(t, now);
        t->bucket += (double)unused_tokens;
        if (t->bucket > (double)t->tokens_per_minute) t->bucket = (double)t->tokens_per_minute;
    }
}

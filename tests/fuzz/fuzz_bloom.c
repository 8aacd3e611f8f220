/*
 * fuzz_bloom.c - the prefix-cache digest in load reports (kv/bloom.h):
 * the "bloom" field of a load message as the router reads it (a string or
 * bin of at most FY_BLOOM_MAX_BYTES, accepted when its size is a power of
 * two from 64: the rule of router.c's on_load, repeated here because it is
 * inline in that handler), then probed and extended as the router and the
 * workers do.
 *
 * Checks: probing an accepted digest with any block name reads inside it
 * (an exact-size heap copy, as the router keeps it); every name added is
 * found afterwards (no false negatives); and every size fy_bloom_bytes_for
 * gives is one the router accepts.  Seeds: load reports with digests built
 * by fy_bloom_add (mkseeds.c).
 */
#include <stdlib.h>
#include <string.h>

#include "kv/bloom.h"
#include "common/mem.h"
#include "common/msg.h"
#include "tests/fuzz/util.h"

static volatile uint8_t g_sink;

/* router.c, on_load: what the router takes as a digest */
static bool router_accepts(size_t len) { return len >= 64 && !(len & (len - 1)); }

static uint64_t mix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fz_quiet_log();
    for (int64_t n = 0; n < (int64_t)1 << 20; n = n * 3 + 1)
        FZ_CHECK(router_accepts(fy_bloom_bytes_for(n)) && fy_bloom_bytes_for(n) <= FY_BLOOM_MAX_BYTES,
                 "fy_bloom_bytes_for(%lld) = %u, which the router refuses", (long long)n, fy_bloom_bytes_for(n));
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fy_msgr_t r;
    if (fy_msgr_parse(&r, data, size) != FY_OK) {
        fy_msgr_free(&r);
        return 0;
    }
    size_t len = 0;
    const void *bloom = fy_msgr_bytes(&r, "bloom", FY_OPT, FY_BLOOM_MAX_BYTES, &len);
    uint64_t seed = fy_msgr_u64(&r, "seed", FY_OPT, 1, 0, UINT64_MAX);
    if (!fy_msgr_ok(&r) || !bloom || !router_accepts(len)) {
        fy_msgr_free(&r);
        return 0;
    }
    uint8_t *bits = malloc(len);
    if (!bits) abort();
    memcpy(bits, bloom, len);
    fy_msgr_free(&r);

    enum { N = 64 };
    fy_kv_hash_t h[N];
    for (int i = 0; i < N; i++)
        for (size_t k = 0; k < sizeof(h[i].b); k += 8) {
            uint64_t v = mix(&seed);
            memcpy(h[i].b + k, &v, FY_MIN(8, sizeof(h[i].b) - k));
        }
    for (int i = 0; i < N; i++) g_sink ^= (uint8_t)fy_bloom_has(bits, (uint32_t)len, &h[i]);
    for (int i = 0; i < N; i += 2) fy_bloom_add(bits, (uint32_t)len, &h[i]);
    for (int i = 0; i < N; i += 2) FZ_CHECK(fy_bloom_has(bits, (uint32_t)len, &h[i]), "name %d added, not found", i);
    free(bits);
    return 0;
}

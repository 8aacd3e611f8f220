/*
 * bloom.h - a Bloom filter over prefix-block names, the compact digest of
 * a worker's prefix cache that its load reports carry to the router.
 *
 * Block names are already keyed hashes (uniform bits), so the k probe
 * positions come straight from the name by double hashing; nothing is
 * rehashed.  A false positive makes the router over-estimate a worker's
 * cached prefix (it then computes a block it thought was cached); there
 * are no false negatives.
 */
#ifndef FY_BLOOM_H
#define FY_BLOOM_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "kv/kv.h"
#include "common/wire.h"

#define FY_BLOOM_K 5
#define FY_BLOOM_MAX_BYTES FY_WIRE_BLOOM_MAX_BYTES

/* Bytes for n names at about 1% false positives (10 bits each), a power
 * of two from 64 to FY_BLOOM_MAX_BYTES. */
static inline uint32_t fy_bloom_bytes_for(int64_t n)
{
    uint32_t bytes = 64;
    while (bytes < FY_BLOOM_MAX_BYTES && (int64_t)bytes * 8 < 10 * n) bytes *= 2;
    return bytes;
}

static inline void fy_bloom_probe(const fy_kv_hash_t *h, uint64_t *a, uint64_t *b)
{
    memcpy(a, h->b, 8);
    memcpy(b, h->b + 8, 8);
    *b |= 1; /* odd: the probes cover every bit of a power-of-two table */
}

/* bytes must be a power of two */
static inline void fy_bloom_add(uint8_t *bits, uint32_t bytes, const fy_kv_hash_t *h)
{
    uint64_t a, b, mask = (uint64_t)bytes * 8 - 1;
    fy_bloom_probe(h, &a, &b);
    for (int i = 0; i < FY_BLOOM_K; i++) {
        uint64_t bit = (a + (uint64_t)i * b) & mask;
        bits[bit >> 3] |= (uint8_t)(1u << (bit & 7));
    }
}

static inline bool fy_bloom_has(const uint8_t *bits, uint32_t bytes, const fy_kv_hash_t *h)
{
    uint64_t a, b, mask = (uint64_t)bytes * 8 - 1;
    fy_bloom_probe(h, &a, &b);
    for (int i = 0; i < FY_BLOOM_K; i++) {
        uint64_t bit = (a + (uint64_t)i * b) & mask;
        if (!(bits[bit >> 3] & (1u << (bit & 7)))) return false;
    }
    return true;
}

#endif /* FY_BLOOM_H */

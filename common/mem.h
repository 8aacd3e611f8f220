/*
 * mem.h - allocation wrappers.
 *
 * Every allocation in ferry goes through these so that tests can make the
 * N-th allocation fail and check that each failure path unwinds cleanly.
 * They do not log: the caller that sees NULL reports what it was
 * allocating.  Hot paths (engine step, kernels) allocate nothing; their
 * buffers are made at start-up.
 */
#ifndef FY_MEM_H
#define FY_MEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

void *fy_malloc(size_t size);
void *fy_calloc(size_t count, size_t size); /* NULL on overflow too */
void *fy_realloc(void *ptr, size_t size);
/* align must be a power of two and a multiple of sizeof(void *). */
void *fy_aligned_alloc(size_t align, size_t size);
char *fy_strdup(const char *s);
char *fy_strndup(const char *s, size_t n);
void fy_free(void *ptr); /* accepts NULL */

/* Drops from memory the whole pages of [p, p + len) that lie inside map
 * (a read-only, private mapping of a file, of map_size bytes): a backend
 * copied those bytes (packed, or to a device) and the process reads them
 * no more, so they stop counting in its resident memory.  A later read
 * faults them in again from the file: never wrong, only slower.  Nothing
 * outside the mapping is touched (an anonymous page dropped would be
 * zeroed).  Returns the bytes dropped. */
size_t fy_mem_drop_file_pages(const void *map, size_t map_size, const void *p, size_t len);

/* Tests: the n-th allocation from now fails, and every one after it until
 * fy_mem_fail_after(0) turns injection off. */
void fy_mem_fail_after(long n);

/* Overflow-checked size arithmetic: false on overflow, *out untouched. */
static inline bool fy_mul_size(size_t a, size_t b, size_t *out)
{
    size_t r;
    if (__builtin_mul_overflow(a, b, &r)) return false;
    *out = r;
    return true;
}

static inline bool fy_add_size(size_t a, size_t b, size_t *out)
{
    size_t r;
    if (__builtin_add_overflow(a, b, &r)) return false;
    *out = r;
    return true;
}

#define FY_ALIGN_UP(x, a) (((x) + ((a)-1)) & ~((__typeof__(x))(a)-1))
#define FY_MIN(a, b) ((a) < (b) ? (a) : (b))
#define FY_MAX(a, b) ((a) > (b) ? (a) : (b))
#define FY_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#endif /* FY_MEM_H */

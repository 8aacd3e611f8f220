/* mem.c - allocation wrappers with failure injection for tests. */
#include "common/mem.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static _Atomic long g_fail_after; /* 0: off; 1: next one fails */

void fy_mem_fail_after(long n) { g_fail_after = n; }

static bool should_fail(void)
{
    long n = atomic_load(&g_fail_after);
    if (n <= 0) return false;
    if (n == 1) return true; /* stays at 1: all later allocations fail too */
    atomic_fetch_sub(&g_fail_after, 1);
    return false;
}

void *fy_malloc(size_t size)
{
    if (should_fail()) return NULL;
    return malloc(size ? size : 1);
}

void *fy_calloc(size_t count, size_t size)
{
    size_t total;
    if (!fy_mul_size(count, size, &total) || should_fail()) return NULL;
    return calloc(total ? total : 1, 1);
}

void *fy_realloc(void *ptr, size_t size)
{
    if (should_fail()) return NULL;
    return realloc(ptr, size ? size : 1);
}

void *fy_aligned_alloc(size_t align, size_t size)
{
    void *p = NULL;
    if (should_fail()) return NULL;
    if (posix_memalign(&p, align, size ? size : align) != 0) return NULL;
    return p;
}

char *fy_strndup(const char *s, size_t n)
{
    size_t len = strnlen(s, n);
    char *d = fy_malloc(len + 1);
    if (!d) return NULL;
    memcpy(d, s, len);
    d[len] = '\0';
    return d;
}

char *fy_strdup(const char *s) { return fy_strndup(s, strlen(s)); }

void fy_free(void *ptr) { free(ptr); }

size_t fy_mem_drop_file_pages(const void *map, size_t map_size, const void *p, size_t len)
{
    uintptr_t m0 = (uintptr_t)map, m1 = m0 + map_size, a = (uintptr_t)p, b = a + len;
    if (!map || !p || a < m0 || b > m1 || b < a) return 0;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    a = (a + page - 1) & ~(page - 1); /* whole pages only: a neighbour's bytes stay */
    b &= ~(page - 1);
    if (b <= a || madvise((void *)a, b - a, MADV_DONTNEED)) return 0;
    return b - a;
}

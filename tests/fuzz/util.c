/*
 * util.c - helpers shared by the fuzz targets (see util.h).
 */
#include "tests/fuzz/util.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/log.h"

/* ---- log ------------------------------------------------------------------------------------------ */

static void drop_line(fy_log_level_t level, const char *line, void *arg) { (void)level, (void)line, (void)arg; }

void fz_quiet_log(void)
{
    const char *v = getenv("FUZZ_LOG");
    if (v && !strcmp(v, "1")) return;
    fy_log_set_level(FY_LOG_DEBUG); /* every line is still formatted */
    fy_log_set_sink(drop_line, NULL);
}

/* ---- scratch folder ------------------------------------------------------------------------------- */

static char g_dir[256];

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

static void rm_dir(void)
{
    if (g_dir[0]) nftw(g_dir, rm_one, 8, FTW_DEPTH | FTW_PHYS);
}

const char *fz_dir(void)
{
    if (g_dir[0]) return g_dir;
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR");
    if (!base || !base[0]) base = "/tmp";
    snprintf(g_dir, sizeof(g_dir), "%s/ferry-fuzz-XXXXXX", base);
    if (!mkdtemp(g_dir)) {
        fprintf(stderr, "fuzz: cannot make a folder under %s: %s\n", base, strerror(errno));
        abort();
    }
    atexit(rm_dir);
    return g_dir;
}

const char *fz_write(const char *name, const void *data, size_t len)
{
    static char paths[4][512];
    static int next;
    char *path = paths[next++ & 3];
    snprintf(path, sizeof(paths[0]), "%s/%s", fz_dir(), name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        fprintf(stderr, "fuzz: cannot create %s: %s\n", path, strerror(errno));
        abort();
    }
    const uint8_t *p = data;
    while (len) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            fprintf(stderr, "fuzz: cannot write %s: %s\n", path, strerror(errno));
            abort();
        }
        p += n;
        len -= (size_t)n;
    }
    close(fd);
    return path;
}

void fz_unlink(const char *name)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", fz_dir(), name);
    unlink(path);
}

char *fz_strndup(const void *p, size_t n)
{
    char *s = malloc(n + 1);
    if (!s) abort();
    if (n) memcpy(s, p, n);
    s[n] = 0;
    return s;
}

size_t fz_split(const uint8_t *data, size_t size, const char *sep, fz_part_t *parts, size_t max)
{
    size_t ls = strlen(sep), n = 0;
    const uint8_t *p = data, *end = data + size;
    while (n + 1 < max) {
        const uint8_t *hit = ls && (size_t)(end - p) >= ls ? memmem(p, (size_t)(end - p), sep, ls) : NULL;
        if (!hit) break;
        parts[n++] = (fz_part_t){p, (size_t)(hit - p)};
        p = hit + ls;
    }
    parts[n++] = (fz_part_t){p, (size_t)(end - p)};
    return n;
}

/* ---- numbers off an input --------------------------------------------------------------------------- */

static uint64_t take(fz_in_t *in, size_t bytes)
{
    uint64_t v = 0;
    for (size_t i = 0; i < bytes; i++) {
        uint8_t b = 0;
        if (in->n) {
            b = *in->p++;
            in->n--;
        }
        v |= (uint64_t)b << (8 * i);
    }
    return v;
}

uint8_t fz_u8(fz_in_t *in) { return (uint8_t)take(in, 1); }
uint32_t fz_u32(fz_in_t *in) { return (uint32_t)take(in, 4); }
uint64_t fz_u64(fz_in_t *in) { return take(in, 8); }

double fz_f64(fz_in_t *in)
{
    uint64_t v = take(in, 8);
    double d;
    memcpy(&d, &v, sizeof(d));
    return d;
}

/* ---- the default model ------------------------------------------------------------------------------ */

const char *fz_default_model(void)
{
    const char *m = getenv("FERRY_MODEL");
    if (!m || !m[0]) m = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (access(m, R_OK) != 0) {
        fprintf(stderr, "fuzz: skipped: this target needs the default model (%s: %s; make model)\n", m,
                strerror(errno));
        exit(FZ_SKIP);
    }
    return m;
}

/* ---- checks ------------------------------------------------------------------------------------------ */

void fz_fail(const char *file, int line, const char *cond, const char *fmt, ...)
{
    fprintf(stderr, "\nfuzz: property broken at %s:%d: %s\nfuzz: ", file, line, cond);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    abort();
}

/* ---- file maps as exact heap copies ------------------------------------------------------------------- */
/*
 * gguf.c and safetensors.c map their files read-only.  A real mapping
 * rounds up to a page, so a parser that reads a few bytes past the end of
 * a small file reads zeros and nothing notices.  This definition of mmap
 * takes precedence over libc's (and over the sanitizer's interceptor,
 * which is weak) for the whole program: a private read-only map of a
 * small regular file from offset 0 becomes a heap copy of exactly the
 * file's size, which AddressSanitizer guards.  Everything else goes to
 * the kernel unchanged.
 */
#define COPY_MAX ((size_t)16 << 20)
#define MAX_COPIES 64

static struct {
    void *p;
    size_t len;
} g_copies[MAX_COPIES];

static void *sys_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    return (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
}

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    struct stat sb;
    if (addr || fd < 0 || prot != PROT_READ || flags != MAP_PRIVATE || off != 0 || len == 0 || len > COPY_MAX ||
        fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || (size_t)sb.st_size != len)
        return sys_mmap(addr, len, prot, flags, fd, off);
    int slot = -1;
    for (int i = 0; i < MAX_COPIES && slot < 0; i++)
        if (!g_copies[i].p) slot = i;
    if (slot < 0) return sys_mmap(addr, len, prot, flags, fd, off);
    void *p = NULL;
    if (posix_memalign(&p, 64, len) != 0) {
        errno = ENOMEM;
        return MAP_FAILED;
    }
    size_t got = 0;
    while (got < len) {
        ssize_t n = pread(fd, (char *)p + got, len - got, (off_t)got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            free(p);
            errno = EIO;
            return MAP_FAILED;
        }
        got += (size_t)n;
    }
    g_copies[slot].p = p;
    g_copies[slot].len = len;
    return p;
}

int munmap(void *addr, size_t len)
{
    for (int i = 0; i < MAX_COPIES; i++) {
        if (g_copies[i].p == addr && addr) {
            if (g_copies[i].len != len) {
                fprintf(stderr, "fuzz: munmap of %zu bytes of a %zu-byte map\n", len, g_copies[i].len);
                abort();
            }
            free(addr);
            g_copies[i].p = NULL;
            return 0;
        }
    }
    return (int)syscall(SYS_munmap, addr, len);
}

/* testutil.c - shared helpers for the tests. */
#include "tests/testutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/config.h"
#include "common/envelope.h"
#include "common/mem.h"

#define LOG_CAP (64 * 1024)
/* lines arrive from any thread (nng's, the transfer's, the engine's) */
static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_log[LOG_CAP];
static size_t g_log_len;

static void sink(fy_log_level_t level, const char *line, void *arg)
{
    (void)level;
    (void)arg;
    size_t n = strlen(line);
    pthread_mutex_lock(&g_log_mu);
    if (g_log_len + n + 2 < LOG_CAP) {
        memcpy(g_log + g_log_len, line, n);
        g_log_len += n;
        g_log[g_log_len++] = '\n';
        g_log[g_log_len] = '\0';
    }
    pthread_mutex_unlock(&g_log_mu);
    if (getenv("FERRY_TEST_VERBOSE")) fprintf(stderr, "[captured] %s\n", line);
}

void fy_test_log_begin(void)
{
    pthread_mutex_lock(&g_log_mu);
    g_log_len = 0;
    g_log[0] = '\0';
    pthread_mutex_unlock(&g_log_mu);
    fy_log_set_sink(sink, NULL);
}

void fy_test_log_end(void) { fy_log_set_sink(NULL, NULL); }

const char *fy_test_log_text(void) { return g_log; }

bool fy_test_log_has(const char *first, ...)
{
    pthread_mutex_lock(&g_log_mu);
    bool found = false;
    const char *line = g_log;
    while (*line) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        char buf[2048];
        snprintf(buf, sizeof(buf), "%.*s", (int)len, line);
        bool all = true;
        va_list ap;
        va_start(ap, first);
        for (const char *s = first; s; s = va_arg(ap, const char *))
            if (!strstr(buf, s)) all = false;
        va_end(ap);
        if (all) {
            found = true;
            break;
        }
        line += len + (end ? 1 : 0);
    }
    pthread_mutex_unlock(&g_log_mu);
    return found;
}

static char g_tmpdir[512];

const char *fy_test_tmpdir(void)
{
    if (g_tmpdir[0]) return g_tmpdir;
    const char *base = getenv("TMPDIR");
    snprintf(g_tmpdir, sizeof(g_tmpdir), "%s/ferry-test-XXXXXX", base ? base : "/tmp");
    if (!mkdtemp(g_tmpdir)) {
        perror("mkdtemp");
        abort();
    }
    return g_tmpdir;
}

static void remove_tree(const char *path)
{
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char sub[1024];
            snprintf(sub, sizeof(sub), "%s/%s", path, e->d_name);
            struct stat sb;
            if (lstat(sub, &sb) == 0 && S_ISDIR(sb.st_mode))
                remove_tree(sub);
            else
                unlink(sub);
        }
        closedir(d);
        rmdir(path);
    }
}

void fy_test_tmpdir_remove(void)
{
    if (!g_tmpdir[0]) return;
    remove_tree(g_tmpdir);
    g_tmpdir[0] = '\0';
}

const char *fy_test_path(const char *name)
{
    static char bufs[8][1024];
    static int next;
    char *b = bufs[next++ % 8];
    snprintf(b, sizeof(bufs[0]), "%s/%s", fy_test_tmpdir(), name);
    return b;
}

const char *fy_test_default_model(void)
{
    const char *p = getenv("FERRY_MODEL");
    if (!p) p = fy_conf_default("model", "path");
    if (access(p, R_OK) != 0) {
        fprintf(stderr, "note: default model %s not present (run 'make model'); skipping\n", p);
        return NULL;
    }
    /* absolute: a configuration file written elsewhere (a test's folder)
     * resolves a relative model.path against its own folder */
    static char abs[PATH_MAX];
    return realpath(p, abs) ? abs : p;
}

char *fy_test_read_file(const char *path, size_t *len_p)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = fy_malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fy_free(buf);
        buf = NULL;
    }
    fclose(f);
    if (!buf) return NULL;
    buf[n] = '\0';
    if (len_p) *len_p = (size_t)n;
    return buf;
}

bool fy_test_write_file(const char *path, const void *data, size_t len)
{
    /* the owner's alone (0600), as secret and key files must be */
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return false;
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        close(fd);
        return false;
    }
    bool ok = fwrite(data, 1, len, f) == len;
    return fclose(f) == 0 && ok;
}

uint64_t fy_test_rand_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

float fy_test_rand_uniform(uint64_t *s)
{
    return (float)((fy_test_rand_u64(s) >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

size_t fy_test_seal(const fy_env_auth_t *a, const fy_env_peer_t *to, uint64_t chan, uint64_t seq, uint64_t ts_ms,
                    const void *payload, size_t len, uint8_t *out)
{
    fy_env_hdr_t h;
    memset(&h, 0, sizeof(h));
    h.kind = FY_ENV_MSG;
    h.role = a->role;
    snprintf(h.name, sizeof(h.name), "%s", a->name);
    if (to) h.to = *to;
    h.inc = a->inc;
    h.chan = chan;
    h.seq = seq;
    h.ts_ms = ts_ms ? ts_ms : fy_env_now_ms();
    h.aead = a->crypt == FY_ENV_CRYPT_ALWAYS;
    size_t hl = fy_env_header_bytes(&h);
    memmove(out + hl, payload, len);
    /* the key the receiver expects; a client forging for another identity has only its own */
    if (!fy_env_seal_as(a, NULL, &h, out + hl, len, out)) fy_env_seal(&a->key, &h, out + hl, len, out);
    return hl + len;
}

long fy_test_rss_kib(int pid)
{
    char path[64];
    if (pid)
        snprintf(path, sizeof(path), "/proc/%d/status", pid);
    else
        snprintf(path, sizeof(path), "/proc/self/status");
    FILE *f = fopen(path, "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof(line), f))
        if (!strncmp(line, "VmRSS:", 6)) kib = strtol(line + 6, NULL, 10);
    if (f) fclose(f);
    return kib;
}

int fy_test_hold_frame(const char *path, int proto, uint64_t announced, size_t sent)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
        if (fd >= 0) close(fd);
        return -1;
    }
    struct timeval tv = {.tv_sec = 2};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    uint8_t hello[8] = {0, 'S', 'P', 0, (uint8_t)(proto >> 8), (uint8_t)proto, 0, 0}; /* the SP header */
    uint8_t peer[8];
    if (send(fd, hello, 8, MSG_NOSIGNAL) != 8 || recv(fd, peer, 8, MSG_WAITALL) != 8) {
        close(fd);
        return -1;
    }
    uint8_t hdr[9] = {1}; /* ipc: a message, then its length */
    for (int i = 0; i < 8; i++) hdr[1 + i] = (uint8_t)(announced >> (56 - 8 * i));
    if (send(fd, hdr, 9, MSG_NOSIGNAL) != 9) {
        close(fd);
        return -1;
    }
    static uint8_t junk[1 << 16];
    memset(junk, 0x5a, sizeof(junk));
    for (size_t done = 0; done < sent;) {
        size_t n = sent - done < sizeof(junk) ? sent - done : sizeof(junk);
        ssize_t w = send(fd, junk, n, MSG_NOSIGNAL);
        if (w <= 0) break; /* closed on us: the frame was refused */
        done += (size_t)w;
    }
    return fd;
}

int fy_test_still_open(const int *fds, int n)
{
    int open = 0;
    for (int i = 0; i < n; i++) {
        if (fds[i] < 0) continue;
        char b;
        ssize_t r = recv(fds[i], &b, 1, MSG_DONTWAIT);
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) open++;
    }
    return open;
}

int fy_test_wait_open_at_most(const int *fds, int n, int most)
{
    int open = fy_test_still_open(fds, n);
    for (double t0 = fy_now_s(); open > most && fy_now_s() - t0 < 5; open = fy_test_still_open(fds, n)) usleep(20000);
    return open;
}

const char *fy_test_bindir(void)
{
    const char *b = getenv("FERRY_BIN");
    return b && *b ? b : "bin";
}

bool fy_test_have_bin(const char *name)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", fy_test_bindir(), name);
    if (access(path, X_OK)) {
        print_message("skipped: %s is not built\n", path);
        return false;
    }
    return true;
}

fy_test_run_t fy_test_run(const char *prog, const char *const *args, double deadline_s)
{
    char out_path[4096], err_path[4096];
    snprintf(out_path, sizeof(out_path), "%s", fy_test_path("stdout"));
    snprintf(err_path, sizeof(err_path), "%s", fy_test_path("stderr"));
    char *argv[62];
    int n = 0;
    argv[n++] = (char *)prog;
    for (int i = 0; args[i] && n < 61; i++) argv[n++] = (char *)args[i];
    argv[n] = NULL;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int o = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int e = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int in = open("/dev/null", O_RDONLY);
        if (o < 0 || e < 0 || in < 0) _exit(126);
        dup2(o, 1);
        dup2(e, 2);
        dup2(in, 0);
        execv(prog, argv);
        _exit(127);
    }
    int fd = (int)syscall(SYS_pidfd_open, pid, 0); /* readable once the child has exited */
    assert_true(fd >= 0);
    double deadline = fy_now_s() + deadline_s;
    for (double left; (left = deadline - fy_now_s()) > 0;) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, (int)(left * 1000) + 1) > 0) break;
    }
    close(fd);
    int st = 0;
    if (waitpid(pid, &st, WNOHANG) != pid) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        fail_msg("%s %s did not end within %.0f s", prog, args[0] ? args[0] : "", deadline_s);
    }
    fy_test_run_t r = {.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1};
    r.out = fy_test_read_file(out_path, NULL);
    r.err = fy_test_read_file(err_path, NULL);
    if (!r.out) r.out = fy_strdup("");
    if (!r.err) r.err = fy_strdup("");
    assert_non_null(r.out);
    assert_non_null(r.err);
    return r;
}

void fy_test_run_free(fy_test_run_t *r)
{
    fy_free(r->out);
    fy_free(r->err);
    r->out = r->err = NULL;
}

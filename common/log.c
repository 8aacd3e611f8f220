/* log.c - leveled one-line logging to stderr or a sink (log.h). */
#include "common/log.h"

#include <errno.h>
#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static _Atomic int g_level = FY_LOG_INFO;
/* The sink is called under g_sink_mu: once fy_log_set_sink returns, the old
 * sink is not running and never runs again (threads log at any time). */
static pthread_mutex_t g_sink_mu = PTHREAD_MUTEX_INITIALIZER;
static fy_log_sink_fn g_sink;
static void *g_sink_arg;
static _Atomic int g_have_sink;
static char g_prefix[64]; /* empty: the program's name */

void fy_log_set_level(fy_log_level_t level) { g_level = (int)level; }

fy_log_level_t fy_log_get_level(void) { return (fy_log_level_t)g_level; }

void fy_log_set_sink(fy_log_sink_fn sink, void *arg)
{
    pthread_mutex_lock(&g_sink_mu);
    g_sink = sink;
    g_sink_arg = arg;
    g_have_sink = sink != NULL;
    pthread_mutex_unlock(&g_sink_mu);
}

void fy_log_set_prefix(const char *prefix) { snprintf(g_prefix, sizeof(g_prefix), "%s", prefix ? prefix : ""); }

static const char *level_name(fy_log_level_t level)
{
    switch (level) {
    case FY_LOG_ERROR: return "error";
    case FY_LOG_WARN: return "warning";
    case FY_LOG_INFO: return "info";
    case FY_LOG_DEBUG: return "debug";
    }
    return "?";
}

void fy_log(fy_log_level_t level, const char *fmt, ...)
{
    if ((int)level > g_level) return;
    int saved_errno = errno; /* for a %m in fmt */
    char line[1024], stamp[32];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t k = strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(stamp + k, sizeof(stamp) - k, ".%03dZ", (int)(ts.tv_nsec / 1000000));
    int n = snprintf(line, sizeof(line), "%s %s: %s: ", stamp, g_prefix[0] ? g_prefix : program_invocation_short_name,
                     level_name(level));
    if (n < 0) return;
    va_list ap;
    va_start(ap, fmt);
    errno = saved_errno;
    vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
    va_end(ap);
    if (g_have_sink) {
        pthread_mutex_lock(&g_sink_mu);
        fy_log_sink_fn sink = g_sink;
        if (sink) sink(level, line, g_sink_arg);
        pthread_mutex_unlock(&g_sink_mu);
        if (sink) {
            errno = saved_errno;
            return;
        }
    }
    /* one fputs per line: stdio locks the stream, so lines never interleave */
    size_t len = strlen(line);
    if (len + 1 < sizeof(line)) {
        line[len] = '\n';
        line[len + 1] = '\0';
    }
    fputs(line, stderr);
    errno = saved_errno; /* logging is no event to the caller */
}

/* ---- crash reports ------------------------------------------------------------------------------------------- */

/* Only what is safe in a signal handler from here on: write(2), no stdio,
 * no locks, no allocation (backtrace() is called once at install time so
 * that libgcc is loaded then, not in the handler). */

static void put_s(char *buf, size_t cap, size_t *k, const char *s)
{
    while (*s && *k + 1 < cap) buf[(*k)++] = *s++;
}

static void put_u(char *buf, size_t cap, size_t *k, unsigned long long v, int base)
{
    char d[24];
    int n = 0;
    do d[n++] = "0123456789abcdef"[v % (unsigned)base], v /= (unsigned)base;
    while (v && n < (int)sizeof(d));
    while (n && *k + 1 < cap) buf[(*k)++] = d[--n];
}

static void put_2(char *buf, size_t cap, size_t *k, unsigned v, const char *after)
{
    if (v < 10) put_s(buf, cap, k, "0");
    put_u(buf, cap, k, v, 10);
    put_s(buf, cap, k, after);
}

/* fy_log's stamp ("2025-06-01T12:00:00.123Z ") by arithmetic: the civil
 * date of a day number is Howard Hinnant's civil_from_days */
static void put_stamp(char *buf, size_t cap, size_t *k, time_t t, long ms)
{
    long long days = (long long)t / 86400, sec = (long long)t % 86400;
    long long z = days + 719468, era = z / 146097;
    unsigned doe = (unsigned)(z - era * 146097);
    unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100), mp = (5 * doy + 2) / 153;
    unsigned d = doy - (153 * mp + 2) / 5 + 1, m = mp < 10 ? mp + 3 : mp - 9;
    long long y = (long long)yoe + era * 400 + (m <= 2);
    put_u(buf, cap, k, (unsigned long long)y, 10);
    put_s(buf, cap, k, "-");
    put_2(buf, cap, k, m, "-");
    put_2(buf, cap, k, d, "T");
    put_2(buf, cap, k, (unsigned)(sec / 3600), ":");
    put_2(buf, cap, k, (unsigned)(sec / 60 % 60), ":");
    put_2(buf, cap, k, (unsigned)(sec % 60), ".");
    if (ms < 100) put_s(buf, cap, k, "0");
    put_2(buf, cap, k, (unsigned)ms, "Z ");
}

static const char *signal_name(int sig)
{
    switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGILL: return "SIGILL";
    case SIGFPE: return "SIGFPE";
    case SIGABRT: return "SIGABRT";
    }
    return "?";
}

static void on_fatal_signal(int sig, siginfo_t *si, void *uctx)
{
    (void)uctx;
    int saved_errno = errno;
    char line[256];
    size_t k = 0;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* async-signal-safe, unlike gmtime_r and strftime */
    put_stamp(line, sizeof(line), &k, ts.tv_sec, ts.tv_nsec / 1000000);
    put_s(line, sizeof(line), &k, g_prefix[0] ? g_prefix : program_invocation_short_name);
    put_s(line, sizeof(line), &k, ": error: fatal signal ");
    put_u(line, sizeof(line), &k, (unsigned)sig, 10);
    put_s(line, sizeof(line), &k, " (");
    put_s(line, sizeof(line), &k, signal_name(sig));
    put_s(line, sizeof(line), &k, ")");
    if (si && si->si_code > 0 && sig != SIGABRT) { /* a fault, not a kill(2): the address it touched */
        put_s(line, sizeof(line), &k, " at address 0x");
        put_u(line, sizeof(line), &k, (unsigned long long)(uintptr_t)si->si_addr, 16);
    } else if (si && si->si_code <= 0) {
        put_s(line, sizeof(line), &k, " sent by pid ");
        put_u(line, sizeof(line), &k, (unsigned long long)si->si_pid, 10);
    }
    put_s(line, sizeof(line), &k, "; the stack, innermost first (addr2line -f -e BINARY OFFSET):\n");
    ssize_t wr = write(STDERR_FILENO, line, k);
    void *frames[64];
    int n = backtrace(frames, 64);
    backtrace_symbols_fd(frames, n, STDERR_FILENO);
    (void)wr;
    errno = saved_errno;
    /* the default action next (SA_RESETHAND restored it): a fault repeats
     * when this returns, a sent signal is raised again; either way the
     * process ends by the signal, with its core where cores are kept */
    if (!si || si->si_code <= 0 || sig == SIGABRT) raise(sig);
}

void fy_log_crash_reports(void)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    (void)on_fatal_signal; /* not installed: the sanitizer's own report is better */
    return;
#else
    static char alt[64 * 1024]; /* a stack overflow still gets its report */
    void *warm[1];
    (void)backtrace(warm, 1);
    stack_t ss = {.ss_sp = alt, .ss_size = sizeof(alt)};
    (void)sigaltstack(&ss, NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_fatal_signal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    const int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) (void)sigaction(sigs[i], &sa, NULL);
#endif
}

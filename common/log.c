/* log.c - leveled one-line logging to stderr or a sink (log.h). */
#include "log.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

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

/* log.c - leveled one-line logging to stderr or a sink. */
#include "log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

static _Atomic int g_level = FY_LOG_INFO;
/* The sink is called under g_sink_mu: once fy_log_set_sink returns, the old
 * sink is not running and never runs again (threads log at any time). */
static pthread_mutex_t g_sink_mu = PTHREAD_MUTEX_INITIALIZER;
static fy_log_sink_fn g_sink;
static void *g_sink_arg;
static _Atomic int g_have_sink;
static char g_prefix[64] = "ferry";

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

void fy_log_set_prefix(const char *prefix)
{
    snprintf(g_prefix, sizeof(g_prefix), "%s", prefix ? prefix : "ferry");
}

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
    char line[1024];
    int n = snprintf(line, sizeof(line), "%s: %s: ", g_prefix, level_name(level));
    if (n < 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
    va_end(ap);
    if (g_have_sink) {
        pthread_mutex_lock(&g_sink_mu);
        fy_log_sink_fn sink = g_sink;
        if (sink) sink(level, line, g_sink_arg);
        pthread_mutex_unlock(&g_sink_mu);
        if (sink) return;
    }
    /* one fputs per line: stdio locks the stream, so lines never interleave */
    size_t len = strlen(line);
    if (len + 1 < sizeof(line)) {
        line[len] = '\n';
        line[len + 1] = '\0';
    }
    fputs(line, stderr);
}

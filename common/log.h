/*
 * log.h - one line per event to stderr, with a level.
 *
 * A line is "TIME NAME: LEVEL: MESSAGE": TIME in UTC, ISO 8601 with
 * milliseconds (2025-06-01T12:00:00.123Z), NAME the process's (its role,
 * "router" or "decode-1", once it has set one; the program's name until
 * then), LEVEL error, warning, info or debug.  `ferry serve` finds a
 * child's errors by ": error: " (tools/serve.c).  Messages are lowercase
 * and name the exact cause ("gguf: model.gguf: tensor
 * 'blk.0.attn_q.weight' ends past the end of the file").  The level, the
 * name and an optional sink (tests capture lines with it) are the only
 * global state in ferry besides what main() owns.
 */
#ifndef FY_LOG_H
#define FY_LOG_H

typedef enum fy_log_level {
    FY_LOG_ERROR = 0,
    FY_LOG_WARN,
    FY_LOG_INFO,
    FY_LOG_DEBUG,
} fy_log_level_t;

/* Receives each formatted line, time and name included (no trailing newline). */
typedef void (*fy_log_sink_fn)(fy_log_level_t level, const char *line, void *arg);

void fy_log_set_level(fy_log_level_t level);
fy_log_level_t fy_log_get_level(void);
/* Lines go to sink instead of stderr; NULL restores stderr.  The sink runs
 * under the logger's lock (one line at a time, from any thread) and must
 * not log; once this returns, the previous sink is not running. */
void fy_log_set_sink(fy_log_sink_fn sink, void *arg);
/* The name on every line, e.g. the process's role ("decode-1"); copied;
 * NULL: the program's name again. */
void fy_log_set_prefix(const char *prefix);

/* A serving process's crash report: on SIGSEGV, SIGBUS, SIGILL, SIGFPE or
 * SIGABRT, one error line ("NAME: error: fatal signal 11 (SIGSEGV) at
 * address 0x...", stamped as fy_log stamps) and the stack as "BINARY(+OFFSET)" lines for addr2line,
 * on stderr (the handler writes with write(2) only; in the main thread
 * on a stack of its own, so an overflow there is reported too);
 * then the signal's default action, so the process still ends by it and
 * leaves its core.  A router that died in a chaos round with no core and no
 * trace is why.  Not installed in ASan and TSan builds (their reports are
 * better).  Call once, early in main. */
void fy_log_crash_reports(void);

void fy_log(fy_log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define fy_error(...) fy_log(FY_LOG_ERROR, __VA_ARGS__)
#define fy_warn(...) fy_log(FY_LOG_WARN, __VA_ARGS__)
#define fy_info(...) fy_log(FY_LOG_INFO, __VA_ARGS__)
#define fy_debug(...)                                                                                                  \
    do {                                                                                                               \
        if (fy_log_get_level() >= FY_LOG_DEBUG) fy_log(FY_LOG_DEBUG, __VA_ARGS__);                                     \
    } while (0)

#endif /* FY_LOG_H */

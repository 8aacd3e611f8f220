/*
 * testutil.h - shared helpers for ferry's cmocka tests: log capture,
 * temporary directories, the default model's path, a fixed seed, a
 * program's run with a deadline.
 */
#ifndef FY_TESTUTIL_H
#define FY_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/log.h"

/* Captures log lines (all levels) until fy_test_log_end(); the text of the
 * captured lines, newline-separated, is in fy_test_log_text() (read it
 * after fy_test_log_end() where other threads may still log). */
void fy_test_log_begin(void);
void fy_test_log_end(void);
const char *fy_test_log_text(void);
/* True when a captured line contains every one of the given substrings
 * (NULL-terminated list). */
bool fy_test_log_has(const char *first, ...);

/* A fresh directory under $TMPDIR; removed with its files by
 * fy_test_tmpdir_remove.  Returns a static buffer. */
const char *fy_test_tmpdir(void);
void fy_test_tmpdir_remove(void);
/* path = tmpdir/name, in a static rotating buffer. */
const char *fy_test_path(const char *name);

/* The default model's path ($FERRY_MODEL, else models/SmolLM2-...gguf), or
 * NULL (with a message) when the file is absent. */
const char *fy_test_default_model(void);

/* Reads a whole file; fy_free() the result. */
char *fy_test_read_file(const char *path, size_t *len_p);
/* Writes a whole file, mode 0600 (a fresh file; an existing one keeps its mode). */
bool fy_test_write_file(const char *path, const void *data, size_t len);

/* Deterministic random numbers for tests (splitmix64). */
uint64_t fy_test_rand_u64(uint64_t *state);
float fy_test_rand_uniform(uint64_t *state); /* [-1, 1) */

/* Where the binaries are: $FERRY_BIN, else "bin". */
const char *fy_test_bindir(void);
/* True when fy_test_bindir()/name is an executable; else says it is skipped. */
bool fy_test_have_bin(const char *name);

/* A program's run: its exit status (-1: ended by a signal), what it
 * wrote to stdout and to stderr (NUL-terminated; fy_test_run_free). */
typedef struct fy_test_run {
    int status;
    char *out, *err;
} fy_test_run_t;
/* Runs prog (a path) with args as its argv[1..] (NULL-terminated, at most
 * 60), stdin from /dev/null, stdout and stderr into files of the test's
 * directory; a run still going after deadline_s is killed and fails the
 * test, naming prog and args[0]. */
fy_test_run_t fy_test_run(const char *prog, const char *const *args, double deadline_s);
void fy_test_run_free(fy_test_run_t *r);

/* VmRSS of process pid (0: this one) in KiB; -1 if unknown. */
long fy_test_rss_kib(int pid);
/* An nng ipc connection to path that says it is a peer of SP protocol
 * proto (0x30 req0, 0x50 push0) and announces a frame of announced bytes,
 * sending up to sent of them: what an attacker holds open.  Its socket,
 * or -1 when refused at once. */
int fy_test_hold_frame(const char *path, int proto, uint64_t announced, size_t sent);
/* How many of fds the far end still holds open (a closed one reads EOF). */
int fy_test_still_open(const int *fds, int n);
/* Waits (up to 5 s) until at most most of fds are still open: the far end
 * has closed what it refuses; the count then. */
int fy_test_wait_open_at_most(const int *fds, int n, int most);

struct fy_env_auth;
struct fy_env_peer;
/* payload as identity a sends it to "to" (NULL: nobody) on channel chan
 * as its seq-th message, sealed at ts_ms (0: now) with the key the
 * receiver expects (a's own when a cannot have that one), into out
 * (payload may lie in out); the envelope's length; encrypted when
 * a->crypt is always.  For tests that forge, replay and misaddress. */
size_t fy_test_seal(const struct fy_env_auth *a, const struct fy_env_peer *to, uint64_t chan, uint64_t seq,
                    uint64_t ts_ms, const void *payload, size_t len, uint8_t *out);

#endif /* FY_TESTUTIL_H */

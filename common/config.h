/*
 * config.h - ferry's configuration: INI files plus --set overrides, read
 * back through typed getters that refuse malformed values.
 *
 * A configuration is a flat set of (section, key) -> value entries.  Files
 * and --set assignments merge in the order they are given, a later value
 * replacing an earlier one, and every entry remembers where it came from
 * (file:line or --set) so that errors point at it.  inih does the parsing;
 * this module adds the bounds, the checks and the types.  It is not a
 * schema: each program lists the keys it knows (fy_config_check_known) and
 * reads each one with its default and range.
 *
 * Syntax (inih's, narrowed so that nothing is read in a surprising way):
 *
 *     ; a comment            (also # at the start of a line)
 *     [router]               section: letters, digits, '_', '-', '.'
 *     port = 8080            key: letters, digits, '_', '-'
 *     model = m.gguf ; why   " ;" (whitespace, then ';') starts a comment
 *
 * Values are literal: no quotes, no escapes.  Indentation is ignored, so
 * there are no continuation lines (inih would otherwise read an indented
 * "key = value" as more of the previous value).  'key: value' is refused,
 * and so is a key given twice in one file or a key before any [section].
 * A file that fails to parse changes nothing: it merges whole or not at all.
 *
 * Limits, so bad input gets a clear error and never unbounded memory: a
 * line holds at most FY_CONFIG_MAX_LINE bytes (the line buffer of the inih
 * build, less room for "\r\n"), so a value is bounded by it too; a file at
 * most FY_CONFIG_MAX_FILE bytes; a configuration at most
 * FY_CONFIG_MAX_ENTRIES entries.  Bytes must be UTF-8 without control
 * characters (tabs allowed).
 *
 * Not thread-safe; meant to be filled and read at start-up.
 */
#ifndef FY_CONFIG_H
#define FY_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "status.h"

#define FY_CONFIG_MAX_LINE 196
#define FY_CONFIG_MAX_SECTION 48
#define FY_CONFIG_MAX_KEY 64
#define FY_CONFIG_MAX_ENTRIES 4096
#define FY_CONFIG_MAX_FILE (1 << 20)

typedef struct fy_config fy_config_t;

/* An empty configuration.  FY_ERR_NOMEM (logged). */
fy_status_t fy_config_create(fy_config_t **c_p);
void fy_config_destroy(fy_config_t *c); /* accepts NULL */

/* Merges the file at path into c; its values replace earlier ones.  On any
 * error c is unchanged and one error line names path:line and the fault.
 * FY_ERR_NOT_FOUND (no such file), FY_ERR_IO, FY_ERR_FORMAT, FY_ERR_NOMEM. */
fy_status_t fy_config_load(fy_config_t *c, const char *path);
/* The same from memory; name stands for the file in errors and origins
 * (NULL: "<string>"). */
fy_status_t fy_config_load_string(fy_config_t *c, const char *text, const char *name);

/* Applies one "section.key=value" override (the --set option).  The key is
 * what follows the last '.' before '=', so sections may hold dots
 * ("prefill.0.threads=4").  Space around the key and the value is dropped.
 * The value must survive fy_config_write and a reload: bounded by
 * FY_CONFIG_MAX_LINE, no control characters, no ';' that would start a
 * comment.  FY_ERR_INVALID (logged, naming the problem) or FY_ERR_NOMEM;
 * c is unchanged on error. */
fy_status_t fy_config_set(fy_config_t *c, const char *assignment);

/* The value of section.key, or NULL when absent.  The string belongs to c
 * and lives until c next changes or is destroyed. */
const char *fy_config_get(const fy_config_t *c, const char *section, const char *key);
/* Where section.key was last set ("configs/local.ini:12", "--set"), or NULL. */
const char *fy_config_origin(const fy_config_t *c, const char *section, const char *key);

/*
 * Typed getters.  Absent: *out = def and FY_OK.  Present but malformed or
 * outside [lo, hi]: FY_ERR_INVALID, *out untouched, and one error line
 * naming section.key, the value, where it came from and what was expected
 * ("config: router.port = '80x' (local.ini:3): expected an integer in
 * [1, 65535]").  def itself is not range-checked: it is the program's.
 */
/* Decimal, optional sign. */
fy_status_t fy_config_int(const fy_config_t *c, const char *section, const char *key, int64_t def, int64_t lo,
                          int64_t hi, int64_t *out);
/* strtod syntax; NaN and infinities refused. */
fy_status_t fy_config_double(const fy_config_t *c, const char *section, const char *key, double def, double lo,
                             double hi, double *out);
/* true/false, yes/no, on/off, 1/0, in any case. */
fy_status_t fy_config_bool(const fy_config_t *c, const char *section, const char *key, bool def, bool *out);
/* Bytes, through fy_parse_size: 4096, 512M (10^6), 50GiB or 50Gi (2^30);
 * K/M/G/T and KiB/MiB/GiB/TiB. */
fy_status_t fy_config_size(const fy_config_t *c, const char *section, const char *key, int64_t def, int64_t lo,
                           int64_t hi, int64_t *out);
/* Seconds: a number with an optional unit us, ms, s, m (minutes) or h;
 * "250ms", "2s", "1.5m", a bare number is seconds.  Never negative. */
fy_status_t fy_config_duration(const fy_config_t *c, const char *section, const char *key, double def_s,
                               double lo_s, double hi_s, double *out_s);
/* The raw value (owned by c, as for fy_config_get), or def. */
fy_status_t fy_config_string(const fy_config_t *c, const char *section, const char *key, const char *def,
                             const char **out);

/* Every key in c must match one of known: an exact "section.key", or
 * "section.*" for every key of that section.  Each one that matches none is
 * logged with its origin (and the closest known name when one is near), and
 * the result is FY_ERR_INVALID: typos never pass silently. */
fy_status_t fy_config_check_known(const fy_config_t *c, const char *const *known, int n_known);

/* Writes the whole merged configuration as INI text that fy_config_load
 * reads back to the same entries (sections in the order first seen).  The
 * file is written beside path and renamed over it, so a reader never sees
 * half of it.  FY_ERR_IO (logged) or FY_ERR_NOMEM. */
fy_status_t fy_config_write(const fy_config_t *c, const char *path);

/* Number of entries (tests, diagnostics). */
int fy_config_count(const fy_config_t *c);

#endif /* FY_CONFIG_H */

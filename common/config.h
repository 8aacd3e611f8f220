/*
 * config.h - ferry's configuration: INI files plus --set overrides, read
 * back through typed getters that refuse malformed values.
 *
 * A configuration is a flat set of (section, key) -> value entries.  Files
 * and --set assignments merge in the order they are given, a later value
 * replacing an earlier one, and every entry remembers where it came from
 * (file:line or --set) so that errors point at it.  inih does the parsing;
 * this module adds the bounds, the checks and the types.
 *
 * The schema is one table (common/confkeys.c): every key a ferry process
 * reads, with its type, default, allowed range and a line of help.
 * Processes read their keys through fy_conf_* (below), which take the
 * default and the range from the table, so that no default is written
 * anywhere else; `ferry config` prints and checks files against it, and
 * the key reference in docs/operations.md is generated from it.  The
 * lower fy_config_* getters, which take a default and a range, remain for
 * the table's own use and for tests.
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
#include <stdio.h>

#include "common/status.h"

/* model.path's default (the key table, confkeys.c; commands' usage text) */
#define FY_DEFAULT_MODEL_PATH "models/SmolLM2-135M-Instruct.Q4_1.gguf"

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
 * A relative path in a key that names a file or folder (fy_conf_path_at:
 * model.path, kv.secret_file, serve.run_dir, ...) is resolved against the
 * folder that holds the file (the working directory for a pipe) and
 * stored absolute, so it means the same from any working directory and
 * in a configuration written elsewhere (RUN_DIR/cluster.ini).
 * FY_ERR_NOT_FOUND (no such file), FY_ERR_IO, FY_ERR_FORMAT, FY_ERR_NOMEM. */
fy_status_t fy_config_load(fy_config_t *c, const char *path);
/* The same from memory; name stands for the file in errors and origins
 * (NULL: "<string>").  Text has no folder: its paths stay as written. */
fy_status_t fy_config_load_string(fy_config_t *c, const char *text, const char *name);

/* Applies one "section.key=value" override (the --set option).  The key is
 * what follows the last '.' before '=', so sections may hold dots
 * ("prefill.0.threads=4").  Space around the key and the value is dropped.
 * The value must survive fy_config_write and a reload: bounded by
 * FY_CONFIG_MAX_LINE, no control characters, no ';' that would start a
 * comment.  A relative path in a key that names one is resolved against
 * the working directory, as the user typing it means it, and stored
 * absolute.  FY_ERR_INVALID (logged, naming the problem) or FY_ERR_NOMEM;
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
fy_status_t fy_config_duration(const fy_config_t *c, const char *section, const char *key, double def_s, double lo_s,
                               double hi_s, double *out_s);
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

/* ---- the schema: every key, its type, default and range ---------------------------------------- */

typedef enum fy_conf_type {
    FY_CONF_STRING,   /* any text (an address, a path, a name) */
    FY_CONF_INT,      /* decimal integer in [lo, hi]; with choices, one of them */
    FY_CONF_FLOAT,    /* number in [lo, hi] */
    FY_CONF_BOOL,     /* true/false, yes/no, on/off, 1/0 */
    FY_CONF_SIZE,     /* bytes in [lo, hi]: 4096, 512M, 50GiB */
    FY_CONF_DURATION, /* seconds in [lo, hi]: 250ms, 2s, 1.5m */
    FY_CONF_ENUM,     /* one of choices */
} fy_conf_type_t;

/* What a string key's value names, for resolving relative paths and for
 * `ferry config --check` (what it must find there). */
typedef enum fy_conf_path {
    FY_PATH_NONE,   /* not a path */
    FY_PATH_FILE,   /* a file that must exist (a certificate, a CA) */
    FY_PATH_SECRET, /* a file that must exist, be ours (or root's) and the owner's alone (mode 0600) */
    FY_PATH_MODEL,  /* a model: a file or a folder that must exist */
    FY_PATH_DIR,    /* a folder that must exist */
    FY_PATH_MADE,   /* a folder ferry makes when it is missing */
} fy_conf_path_t;

typedef struct fy_conf_key {
    const char *section, *key;
    fy_conf_type_t type;
    /* the default as a file would write it; NULL: unset (help says what
     * that means: "unset: RUN_DIR/logs") */
    const char *def;
    /* unset means this other key's value ("router.lease"); def is NULL */
    const char *def_from;
    double lo, hi;       /* INT, FLOAT, SIZE, DURATION: the allowed range */
    const char *choices; /* ENUM, or INT with a fixed set: "recompute|swap", "8|16|32" */
    const char *help;    /* one line */
    fy_conf_path_t path; /* STRING: what the value names; a relative one is resolved (fy_config_load) */
} fy_conf_key_t;

/* The table, in the order of the reference (section by section). */
const fy_conf_key_t *fy_conf_keys(int *n_p);
/* section.key's row, or NULL when the table has none. */
const fy_conf_key_t *fy_conf_key(const char *section, const char *key);
/* The table's default of section.key as text ("models/...gguf", "16"),
 * for a command's own option that defaults to a key's value; NULL for a
 * key unset by default or not in the table. */
const char *fy_conf_default(const char *section, const char *key);
/* Where the file or folder a value of section.key names begins in it: 0
 * for a path key (fy_conf_key_t.path), 6 for decode.spec's
 * "draft:MODEL_FILE"; -1 when the value names none (another key, an empty
 * value, spec = ngram). */
int fy_conf_path_at(const char *section, const char *key, const char *value);
/* "string", "int", "float", "bool", "size", "duration", "enum". */
const char *fy_conf_type_str(fy_conf_type_t t);

/*
 * The value of section.key in force: c's, else the table's default (c may
 * be NULL: the default alone).  A value that is malformed or outside the
 * table's range is FY_ERR_INVALID, *out untouched, with one error line
 * naming section.key, the value, its origin and the allowed range (the
 * fy_config_* messages above).  A key that is not in the table, or is read
 * as another type than the table's, is a bug: FY_ERR_INTERNAL, logged.
 */
/* STRING or ENUM (the choice's text); NULL for a key unset without a default. */
fy_status_t fy_conf_string(const fy_config_t *c, const char *section, const char *key, const char **out);
fy_status_t fy_conf_int(const fy_config_t *c, const char *section, const char *key, int64_t *out);
fy_status_t fy_conf_float(const fy_config_t *c, const char *section, const char *key, double *out);
fy_status_t fy_conf_bool(const fy_config_t *c, const char *section, const char *key, bool *out);
fy_status_t fy_conf_size(const fy_config_t *c, const char *section, const char *key, int64_t *out);
fy_status_t fy_conf_duration(const fy_config_t *c, const char *section, const char *key, double *out_s);
/* STRING or ENUM copied into out (cap bytes; FY_CONFIG_MAX_LINE + 1 holds
 * any value): "" for a key unset without a default; a value longer than
 * cap - 1 is FY_ERR_INVALID, logged naming section.key.  For the typed
 * structs a process reads once at start (docs/architecture.md). */
fy_status_t fy_conf_copy(const fy_config_t *c, const char *section, const char *key, char *out, size_t cap);
/* ENUM: the index of the value among the choices ("recompute|swap": 0, 1). */
fy_status_t fy_conf_enum(const fy_config_t *c, const char *section, const char *key, int *out);

/* Every key of c must be in the table: each one that is not is logged with
 * its origin and a suggestion when one is near (a typo or two away, or the
 * same key in another section).  With values, every known key's value is
 * also checked against its type and range, each bad one logged.
 * FY_ERR_INVALID when anything was logged. */
fy_status_t fy_conf_check(const fy_config_t *c, bool values);

/* The key reference as Markdown (docs/operations.md holds this text). */
void fy_conf_markdown(FILE *f);
/* Every key of the table as INI text: its value in force and, after it,
 * where it came from (file:line, --set, default); keys unset without a
 * default are written commented out.  c may be NULL (the defaults). */
void fy_conf_print(const fy_config_t *c, FILE *f);

#endif /* FY_CONFIG_H */

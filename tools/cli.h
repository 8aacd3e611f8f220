/*
 * cli.h - the option-value parsers every ferry subcommand shares
 * (tools/cli.c): integers, numbers, lists, files, each refused with a
 * message naming the option and the range.
 *
 * Not here: the subcommands themselves (commands.h), the cluster's
 * -c/--set command line (common/cluster.h).
 */
#ifndef FY_CLI_H
#define FY_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/config.h"

/* The model a command runs when given none (`make model` fetches it). */
#define FY_CLI_DEFAULT_MODEL FY_DEFAULT_MODEL_PATH /* the key table's model.path (config.h) */

/* Parse option values; print "ferry: OPT expects ..." and return false on
 * error; *out is set on success only. */
bool fy_cli_parse_int(const char *opt, const char *s, long lo, long hi, long *out);
bool fy_cli_parse_float(const char *opt, const char *s, double lo, double hi, double *out);
bool fy_cli_parse_u64(const char *opt, const char *s, uint64_t *out);
/* A comma-separated list of at most cap integers in [lo, hi] ("1,2,4");
 * *n_p is set on success only. */
bool fy_cli_parse_int_list(const char *opt, const char *s, long lo, long hi, int *out, int cap, int *n_p);
/* After getopt_long: true if no operand is left (optind == argc); else
 * "ferry: CMD: unexpected argument 'X'", usage(stderr), and false (the
 * command then exits 2). */
bool fy_cli_no_operands(const char *cmd, int argc, char **argv, void (*usage)(FILE *));
/* A whole file as a NUL-terminated string (fy_free it); NULL and a message on error. */
char *fy_cli_read_file(const char *path);

/* An answer streamed to out (stdout) with a summary on stderr after it.
 * The answer ends its own line before the summary: a newline only where
 * its text did not end with one, and out flushed, so that the summary
 * starts a line even where stdout and stderr share a pipe or a file
 * (stdout is then fully buffered and would otherwise be written after
 * it). */
typedef struct fy_cli_answer {
    FILE *out;
    bool mid_line; /* the text so far does not end with a newline */
} fy_cli_answer_t;
/* Writes len bytes of the answer and flushes (the user watches it grow). */
void fy_cli_answer_put(fy_cli_answer_t *a, const char *text, size_t len);
/* Ends the answer's line where it is open, and flushes. */
void fy_cli_answer_end(fy_cli_answer_t *a);

#endif /* FY_CLI_H */

/* cli.h - helpers shared by the ferry subcommands (tools/). */
#ifndef FY_CLI_H
#define FY_CLI_H

#include <stdbool.h>
#include <stdint.h>

/* Parse option values; print "ferry: OPT expects ..." and return false on error. */
bool fy_cli_parse_int(const char *opt, const char *s, long lo, long hi, long *out);
bool fy_cli_parse_float(const char *opt, const char *s, double lo, double hi, double *out);
bool fy_cli_parse_u64(const char *opt, const char *s, uint64_t *out);
/* A comma-separated list of at most cap integers in [lo, hi] ("1,2,4");
 * *n_p is set on success only. */
bool fy_cli_parse_int_list(const char *opt, const char *s, long lo, long hi, int *out, int cap, int *n_p);
/* A whole file as a NUL-terminated string (fy_free it); NULL and a message on error. */
char *fy_cli_read_file(const char *path);

int fy_cmd_bench(int argc, char **argv);
int fy_cmd_plan(int argc, char **argv);
int fy_cmd_bench_kv(int argc, char **argv);
int fy_cmd_bench_batch(int argc, char **argv);
int fy_cmd_request(int argc, char **argv);
int fy_cmd_serve(int argc, char **argv);
int fy_cmd_bench_ttft(int argc, char **argv);
int fy_cmd_bench_xfer(int argc, char **argv);
int fy_cmd_bench_spec(int argc, char **argv);
int fy_cmd_chaos(int argc, char **argv);
int fy_cmd_config(int argc, char **argv);

#endif /* FY_CLI_H */

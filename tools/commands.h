/*
 * commands.h - the ferry subcommands that tools/ferry.c dispatches to,
 * one file each in tools/ (the bench commands in bench/).  Each takes its own argv (argv[0] is the
 * subcommand's name), parses it with getopt_long, answers -h/--help with
 * its usage on stdout and exit status 0, refuses an unknown option with
 * the usage on stderr and status 2, and returns the process's exit status.
 */
#ifndef FY_COMMANDS_H
#define FY_COMMANDS_H

int fy_cmd_bench(int argc, char **argv);
int fy_cmd_plan(int argc, char **argv);
int fy_cmd_bench_kv(int argc, char **argv);
int fy_cmd_bench_window(int argc, char **argv);
int fy_cmd_bench_evict(int argc, char **argv);
int fy_cmd_bench_prec(int argc, char **argv);
int fy_cmd_bench_grammar(int argc, char **argv);
int fy_cmd_bench_batch(int argc, char **argv);
int fy_cmd_request(int argc, char **argv);
int fy_cmd_serve(int argc, char **argv);
int fy_cmd_bench_ttft(int argc, char **argv);
int fy_cmd_bench_xfer(int argc, char **argv);
int fy_cmd_bench_group(int argc, char **argv);
int fy_cmd_bench_ranks(int argc, char **argv);
int fy_cmd_bench_spec(int argc, char **argv);
int fy_cmd_bench_reshard(int argc, char **argv);
int fy_cmd_bench_gpu(int argc, char **argv);
int fy_cmd_cmp_devices(int argc, char **argv);
int fy_cmd_chaos(int argc, char **argv);
int fy_cmd_config(int argc, char **argv);
int fy_cmd_key(int argc, char **argv);

#endif /* FY_COMMANDS_H */

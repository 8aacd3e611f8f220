/*
 * config_cmd.c - `ferry config`: a configuration as the processes would
 * read it, without starting anything.
 *
 *   ferry config [-c FILE]... [--set section.key=value]...   every key, its value in force and where it came from
 *   ferry config --check FILE [--set section.key=value]...   validate: exit 0 good, 1 not, 2 usage
 *   ferry config --markdown                                   the key reference (docs/operations.md)
 *
 * Files and --set apply in the order given, as for every process.  A
 * check reports every unknown key (with the closest known one) and every
 * bad value (naming the key and what it takes), not just the first.
 *
 * Not here: the table (common/confkeys.c), parsing and checking (config.c).
 */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "tools/cli.h"
#include "tools/commands.h"
#include "common/config.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: ferry config [-c FILE]... [--set section.key=value]...   the effective configuration\n"
               "       ferry config --check FILE [--set section.key=value]...   validate a configuration\n"
               "       ferry config --markdown                                   the key reference\n"
               "  -c, --config FILE   a configuration file (several merge in order; FILE alone means the same)\n"
               "      --set K=V       override one key, after the files before it\n"
               "      --check         validate only: every unknown key and bad value, or 'ok'; exit 1 if any\n"
               "      --markdown      every key with its type, default, range and meaning, as Markdown\n"
               "  -h, --help          this text\n"
               "exit status: 0 good, 1 a file or value is not, 2 a usage error\n");
}

int fy_cmd_config(int argc, char **argv)
{
    enum { O_SET = 256, O_CHECK, O_MARKDOWN };
    static const struct option opts[] = {
        {"config", required_argument, 0, 'c'}, {"set", required_argument, 0, O_SET},
        {"check", no_argument, 0, O_CHECK},    {"markdown", no_argument, 0, O_MARKDOWN},
        {"help", no_argument, 0, 'h'},         {0, 0, 0, 0},
    };
    /* in order: the files and the --set assignments apply as given */
    const char *args[256];
    bool is_set[256];
    int n_args = 0, n_files = 0, opt;
    bool check = false, markdown = false;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "-c:h", opts, NULL)) != -1) {
        switch (opt) {
        case 1: /* a bare FILE: the same as -c FILE */
        case 'c':
        case O_SET:
            if (n_args == (int)(sizeof(args) / sizeof(args[0]))) {
                fprintf(stderr, "ferry config: too many files and --set options\n");
                return 2;
            }
            is_set[n_args] = opt == O_SET;
            n_files += opt != O_SET;
            args[n_args++] = optarg;
            break;
        case O_CHECK: check = true; break;
        case O_MARKDOWN: markdown = true; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (markdown) {
        if (check || n_args) {
            fprintf(stderr, "ferry config: --markdown takes no file, --set or --check\n");
            usage(stderr);
            return 2;
        }
        fy_conf_markdown(stdout);
        return 0;
    }
    if (check && !n_files) {
        fprintf(stderr, "ferry config: --check needs the file to check\n");
        usage(stderr);
        return 2;
    }
    fy_config_t *c;
    if (fy_config_create(&c)) return 1;
    int rc = 0;
    for (int i = 0; i < n_args && !rc; i++) {
        if (!is_set[i]) {
            if (fy_config_load(c, args[i])) rc = 1; /* the error names the file and line */
        } else if (fy_config_set(c, args[i])) {
            rc = 2; /* a malformed --set is the command line's fault */
        }
    }
    if (!rc && fy_conf_check(c, true)) rc = 1;
    const char *what = "the configuration";
    for (int i = 0; i < n_args && n_files == 1; i++)
        if (!is_set[i]) what = args[i];
    if (rc == 1)
        fprintf(stderr, "ferry config: %s is not valid (see above)\n", what);
    else if (!rc && check)
        printf("%s: ok (%d keys set, every one known and valid)\n", what, fy_config_count(c));
    else if (!rc)
        fy_conf_print(c, stdout);
    fy_config_destroy(c);
    return rc;
}

/*
 * config_cmd.c - `ferry config`: a configuration as the processes would
 * read it, without starting anything.
 *
 *   ferry config [-c FILE]... [--set section.key=value]...   every key, its value in force and where it came from
 *   ferry config --check FILE [--set section.key=value]...   validate: exit 0 good, 1 not, 2 usage
 *   ferry config --markdown                                   the key reference (docs/operations.md)
 *
 * Files and --set apply in the order given, as for every process.  A
 * check reports every unknown key (with the closest known one), every
 * bad value (naming the key and what it takes) and every file or folder
 * a key names that is missing, of the wrong kind, or (a secret) open to
 * its group or others, not just the first.
 *
 * Not here: the table (common/confkeys.c), parsing and checking (config.c).
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tools/cli.h"
#include "tools/commands.h"
#include "common/config.h"
#include "common/log.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: ferry config [-c FILE]... [--set section.key=value]...   the effective configuration\n"
               "       ferry config --check FILE [--set section.key=value]...   validate a configuration\n"
               "       ferry config --markdown                                   the key reference\n"
               "  -c, --config FILE   a configuration file (several merge in order; FILE alone means the same)\n"
               "      --set K=V       override one key, after the files before it\n"
               "      --check         validate only: every unknown key, bad value, and file or folder a key names\n"
               "                      that is missing or open to others (a secret), or 'ok'; exit 1 if any\n"
               "      --markdown      every key with its type, default, range and meaning, as Markdown\n"
               "  -h, --help          this text\n"
               "exit status: 0 good, 1 a file or value is not, 2 a usage error\n");
}

/* A folder ferry makes (serve.run_dir): where it is missing, the nearest
 * folder above it that exists must let us make it.  Empty: fine. */
static const char *cannot_make(const char *path)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof(dir), "%s", path);
    for (;;) {
        char *slash = strrchr(dir, '/');
        if (!slash)
            snprintf(dir, sizeof(dir), ".");
        else if (slash == dir)
            dir[1] = '\0';
        else
            *slash = '\0';
        struct stat sb;
        if (stat(dir, &sb) == 0) {
            if (!S_ISDIR(sb.st_mode)) return "cannot be made: a file of that name is in its way";
            return access(dir, W_OK | X_OK) ? "is missing, and the folder above it is not writable" : NULL;
        }
        if (!strcmp(dir, ".") || !strcmp(dir, "/")) return "cannot be made";
    }
}

/* What is wrong with the file or folder a key of the given kind names,
 * or NULL: the rules of the code that opens it (cluster.c's secret
 * reader, the router's API keys, the TLS and etcd files). */
static const char *path_fault(fy_conf_path_t kind, const char *path, char *why, size_t cap)
{
    struct stat sb;
    if (stat(path, &sb)) {
        if (errno == ENOENT && kind == FY_PATH_MADE) return cannot_make(path);
        snprintf(why, cap, "%s", errno == ENOENT ? "no such file or folder" : strerror(errno));
        return why;
    }
    bool dir = S_ISDIR(sb.st_mode), reg = S_ISREG(sb.st_mode);
    switch (kind) {
    case FY_PATH_DIR:
    case FY_PATH_MADE:
        if (!dir) return "not a folder";
        break;
    case FY_PATH_MODEL:
        if (!dir && !reg) return "neither a file nor a folder";
        break;
    case FY_PATH_FILE:
    case FY_PATH_SECRET:
        if (!reg) return "not a plain file";
        break;
    case FY_PATH_NONE: break;
    }
    if (access(path, R_OK)) return "not readable by this user";
    if (kind != FY_PATH_SECRET) return NULL;
    if (sb.st_uid != geteuid() && sb.st_uid != 0) {
        snprintf(why, cap, "owned by uid %u, not by this user (uid %u) or root", (unsigned)sb.st_uid,
                 (unsigned)geteuid());
        return why;
    }
    if (sb.st_mode & 077) {
        snprintf(why, cap, "mode %04o lets its group or others at it; it must be the owner's alone (chmod 600 %s)",
                 (unsigned)(sb.st_mode & 07777), path);
        return why;
    }
    return NULL;
}

/* Every file and folder the configuration names, as the processes would
 * open them: each fault logged naming the key, the path and where the
 * value came from.  The number of faults. */
static int check_files(const fy_config_t *c)
{
    int n, bad = 0;
    const fy_conf_key_t *keys = fy_conf_keys(&n);
    for (int i = 0; i < n; i++) {
        const fy_conf_key_t *k = &keys[i];
        const char *v = fy_config_get(c, k->section, k->key);
        const char *origin = v ? fy_config_origin(c, k->section, k->key) : "default";
        if (!v) v = k->def;
        int at = v ? fy_conf_path_at(k->section, k->key, v) : -1;
        if (at < 0) continue;
        char why[192];
        const char *fault = path_fault(at ? FY_PATH_FILE : k->path, v + at, why, sizeof(why));
        if (!fault) continue;
        bool model = k->path == FY_PATH_MODEL && !strcmp(v, FY_DEFAULT_MODEL_PATH);
        fy_error("config: %s.%s = '%s' (%s): %s%s", k->section, k->key, v + at, origin, fault,
                 model ? " (`make model` fetches the default model)" : "");
        bad++;
    }
    return bad;
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
    if (!rc && check && check_files(c)) rc = 1;
    const char *what = "the configuration";
    for (int i = 0; i < n_args && n_files == 1; i++)
        if (!is_set[i]) what = args[i];
    if (rc == 1)
        fprintf(stderr, "ferry config: %s is not valid (see above)\n", what);
    else if (!rc && check)
        printf("%s: ok (%d keys set, every one known and valid, every file it names in place)\n", what,
               fy_config_count(c));
    else if (!rc)
        fy_conf_print(c, stdout);
    fy_config_destroy(c);
    return rc;
}

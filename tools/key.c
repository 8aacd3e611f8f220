/*
 * key.c - `ferry key --client NAME -o FILE`: a client's key file, derived
 * from the deployment's secret, for `ferry request --key FILE`.
 *
 * A client key authenticates its holder as client NAME and as nothing
 * else: it cannot speak as a router or a worker, nor as another client
 * (docs/protocol.md, "Authentication").  Give each user or program its
 * own NAME: the router lets a client poll and cancel only the requests
 * that client made.  Not here: the derivation (common/envelope.c), the
 * file's checks (common/cluster.c).
 */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "tools/cli.h"
#include "common/cluster.h"
#include "tools/commands.h"
#include "common/config.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: ferry key --client NAME -o FILE [-c CONFIG | --secret FILE]\n"
               "  --client NAME       the client's name (1 to 63 printable characters, no spaces)\n"
               "  -o, --out FILE      the key file to write (mode 0600; never overwritten)\n"
               "  -c, --config FILE   take the secret's path from a cluster's configuration (kv.secret_file)\n"
               "      --secret FILE   the deployment's secret (default kv.secret_file, or run/kv.secret)\n"
               "  -h, --help          this text\n"
               "the holder of FILE speaks as client NAME only: `ferry request --key FILE`\n");
}

int fy_cmd_key(int argc, char **argv)
{
    enum { O_CLIENT = 256, O_SECRET };
    static const struct option opts[] = {
        {"client", required_argument, 0, O_CLIENT},
        {"out", required_argument, 0, 'o'},
        {"config", required_argument, 0, 'c'},
        {"secret", required_argument, 0, O_SECRET},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *name = NULL, *out = NULL, *config = NULL, *secret = NULL;
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "o:c:h", opts, NULL)) != -1) {
        switch (opt) {
        case O_CLIENT: name = optarg; break;
        case 'o': out = optarg; break;
        case 'c': config = optarg; break;
        case O_SECRET: secret = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!fy_cli_no_operands("key", argc, argv, usage)) return 2;
    if (!name || !out) {
        fprintf(stderr, "ferry key: give --client NAME and -o FILE\n");
        usage(stderr);
        return 2;
    }
    char secret_buf[4096];
    if (!secret) {
        fy_config_t *cfg = NULL;
        if (config) {
            char *cargv[] = {"ferry key", "-c", (char *)config, NULL};
            if (fy_cluster_config(3, cargv, "", &cfg) != FY_OK) return 2;
        }
        if (fy_cluster_secret_path(cfg, secret_buf, sizeof(secret_buf))) secret = secret_buf;
        fy_config_destroy(cfg);
        if (!secret) {
            fprintf(stderr, "ferry key: no secret: give --secret FILE or -c CONFIG\n");
            return 2;
        }
    }
    fy_status_t st = fy_cluster_write_client_key(secret, name, out);
    if (st) {
        fprintf(stderr, "ferry key: no key written (see above)\n");
        return 1;
    }
    printf("wrote %s: client '%s' (ferry request --key %s)\n", out, name, out);
    return 0;
}

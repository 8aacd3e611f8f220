/*
 * request.c - `ferry request`: send one prompt to a router and stream the
 * text back, then a summary (timings of each phase) on stderr.
 */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/cli.h"
#include "router/client.h"
#include "common/cluster.h"
#include "tools/commands.h"
#include "common/log.h"
#include "common/mem.h"

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) { interrupted = 1; }

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ferry request [-c CONFIG] [-r ADDR] [--key FILE] (-p PROMPT | -f FILE) [options]\n"
            "       ferry request [-c CONFIG] [-r ADDR] [--key FILE] --status\n"
            "  -c, --config FILE     take the router's address and the secret's path from a cluster's configuration\n"
            "  -r, --router ADDR     the router's client address (default router.listen, or tcp://127.0.0.1:7400);\n"
            "                        ADDR,ADDR...: several routers of one cluster (cluster.etcd), tried in turn\n"
            "                        while one cannot be reached or goes away before the answer began\n"
            "      --key FILE        this client's key file (`ferry key --client NAME` writes it), which\n"
            "                        authenticates every call as that client and nothing else\n"
            "      --secret FILE     the deployment's secret instead (the operator's: it speaks for anyone; default\n"
            "                        kv.secret_file, or RUN_DIR/kv.secret as `ferry serve` makes it: run/kv.secret)\n"
            "  -p, --prompt TEXT     the prompt\n"
            "  -f, --file PATH       read the prompt from a file\n"
            "      --chat            apply the model's chat template (a user turn)\n"
            "      --system TEXT     system message for --chat\n"
            "  -n, --max-tokens N    tokens to generate (default 128)\n"
            "      --temp T          temperature (default 0: greedy)\n"
            "      --top-k K, --top-p P, --min-p P, --seed S\n"
            "      --stop TEXT       stop string (up to 8)\n"
            "      --ignore-eos      keep going past the end of turn\n"
            "      --priority N      larger runs first\n"
            "      --timeout S       give up after S seconds (default 300)\n"
            "      --status          print the cluster's state and exit\n"
            "  -q, --quiet           no summary on stderr\n"
            "  -h, --help\n");
}

static int print_status(fy_client_t *c)
{
    fy_client_status_t s;
    fy_status_t st = fy_client_status(c, &s);
    if (st) {
        fprintf(stderr, "ferry: request: %s\n",
                st == FY_ERR_MISMATCH ? "the router refused the request as unauthenticated (another secret?)"
                                      : fy_status_str(st));
        return 1;
    }
    /* the name clients ask for first; the id (name and hash) says which weights */
    printf("model %s (id %s): %d prefill and %d decode workers up; %d requests (%d queued); %llu completed, %llu "
           "failed, %llu refused, %llu retried\n",
           s.served_model[0] ? s.served_model : s.model, s.model, s.prefill_up, s.decode_up, s.requests, s.queued,
           (unsigned long long)s.completed, (unsigned long long)s.failed, (unsigned long long)s.refused,
           (unsigned long long)s.retried);
    for (int32_t i = 0; i < s.n_workers; i++) {
        const fy_client_worker_t *w = &s.workers[i];
        printf("  %-24s %-7s %-14s %d rank%s, %d assigned\n", w->name, w->decode ? "decode" : "prefill",
               w->out_of_service ? "out of service"
               : w->up           ? "up"
                                 : "down",
               w->ranks, w->ranks == 1 ? "" : "s", w->assigned);
    }
    return 0;
}

/* One try on one router.  *next_p: it failed in a way another router
 * may not (unreachable, or gone before the answer began). */
static int request_on(const char *router, const char *secret, double call_timeout, fy_client_req_t *reqp, bool status,
                      bool quiet, double timeout, bool *next_p)
{
    fy_client_req_t req = *reqp;
    fy_client_t *cl;
    if (fy_client_create(router, secret, call_timeout, &cl) != FY_OK) {
        fprintf(stderr,
                "ferry: request: cannot use the key or secret %s (see above); give --key FILE, --secret FILE or -c "
                "CONFIG\n",
                secret);
        return 1;
    }
    int rc = 0;
    if (status) {
        rc = print_status(cl);
        *next_p = rc != 0;
        goto out;
    }
    req.deadline_s = timeout;
    char err[256] = "";
    fy_client_stream_t sm;
    fy_status_t st = fy_client_generate(cl, &req, &sm, err, sizeof(err));
    uint64_t id = sm.id;
    int32_t n_prompt = sm.n_prompt;
    if (st) {
        fprintf(stderr, "ferry: request refused: %s (%s)\n", err, fy_status_str(st));
        *next_p = st == FY_ERR_PEER || st == FY_ERR_TIMEOUT; /* not reached, or no answer */
        rc = 1;
        goto out;
    }
    struct sigaction sa = {.sa_handler = on_sigint};
    sigaction(SIGINT, &sa, NULL);
    int32_t generated = 0;
    fy_cli_answer_t answer = {.out = stdout};
    for (;;) {
        if (interrupted) {
            fy_client_cancel(cl, id);
            fprintf(stderr, "\nferry: request %llu cancelled\n", (unsigned long long)id);
            rc = 130;
            break;
        }
        fy_client_update_t upd;
        st = fy_client_poll(cl, &sm, 0.25, &upd);
        if (st) {
            fprintf(stderr, "\nferry: request %llu: %s (%s)\n", (unsigned long long)id, upd.message, fy_status_str(st));
            *next_p = generated == 0; /* the router went away before any text: another may answer all of it */
            rc = 1;
            break;
        }
        generated += upd.n_tokens;
        fy_cli_answer_put(&answer, upd.text, upd.text_len);
        if (!upd.done) continue;
        fy_cli_answer_end(&answer); /* the summary below starts a line of its own */
        const fy_client_timings_t *t = &upd.timings;
        if (upd.error) {
            fprintf(stderr, "ferry: request %llu failed: %s (%s)\n", (unsigned long long)id, upd.message,
                    fy_status_str(upd.error));
            rc = 1;
        } else if (!quiet) {
            fprintf(stderr,
                    "ferry: request %llu: prompt tokens: %d, generated tokens: %d, finish: %s; ttft %.3f s (queue "
                    "%.3f, reserve %.3f, prefill queue %.3f, prefill %.3f with %d tokens cached, transfer tail %.3f "
                    "of %.3f for %.1f MB, first token %.3f), e2e %.3f s%s\n",
                    (unsigned long long)id, n_prompt, generated, upd.finish, t->ttft_s, t->queue_s, t->reserve_s,
                    t->prefill_queue_s, t->prefill_compute_s, t->cached_prefill, t->transfer_tail_s, t->transfer_s,
                    (double)t->transfer_bytes / 1e6, t->first_token_s, t->e2e_s, t->retries ? " (retried)" : "");
        }
        break;
    }
out:
    fy_client_destroy(cl);
    return rc;
}

int fy_cmd_request(int argc, char **argv)
{
    enum {
        O_CHAT = 256,
        O_SYSTEM,
        O_TEMP,
        O_TOPK,
        O_TOPP,
        O_MINP,
        O_SEED,
        O_STOP,
        O_IGN,
        O_PRIO,
        O_TIMEOUT,
        O_STATUS,
        O_SECRET,
        O_KEY
    };
    static const struct option opts[] = {
        {"router", required_argument, 0, 'r'},
        {"prompt", required_argument, 0, 'p'},
        {"file", required_argument, 0, 'f'},
        {"max-tokens", required_argument, 0, 'n'},
        {"chat", no_argument, 0, O_CHAT},
        {"system", required_argument, 0, O_SYSTEM},
        {"temp", required_argument, 0, O_TEMP},
        {"top-k", required_argument, 0, O_TOPK},
        {"top-p", required_argument, 0, O_TOPP},
        {"min-p", required_argument, 0, O_MINP},
        {"seed", required_argument, 0, O_SEED},
        {"stop", required_argument, 0, O_STOP},
        {"ignore-eos", no_argument, 0, O_IGN},
        {"priority", required_argument, 0, O_PRIO},
        {"timeout", required_argument, 0, O_TIMEOUT},
        {"status", no_argument, 0, O_STATUS},
        {"quiet", no_argument, 0, 'q'},
        {"help", no_argument, 0, 'h'},
        {"config", required_argument, 0, 'c'},
        {"secret", required_argument, 0, O_SECRET},
        {"key", required_argument, 0, O_KEY},
        {0, 0, 0, 0},
    };
    const char *router = NULL, *file = NULL, *secret = NULL, *config = NULL;
    char *prompt_file = NULL;
    fy_client_req_t req = {0};
    fy_genspec_default(&req.gen);
    double timeout = 300, d;
    long v;
    uint64_t u;
    bool status = false, quiet = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "c:r:p:f:n:qh", opts, NULL)) != -1) {
        switch (c) {
        case 'c': config = optarg; break;
        case O_SECRET:
        case O_KEY: secret = optarg; break; /* the loader tells a key file from a secret by its first line */
        case 'r': router = optarg; break;
        case 'p': req.prompt = optarg; break;
        case 'f': file = optarg; break;
        case 'n':
            if (!fy_cli_parse_int("--max-tokens", optarg, 1, 1 << 20, &v)) return 2;
            req.gen.max_tokens = (int32_t)v;
            break;
        case O_CHAT: req.chat = true; break;
        case O_SYSTEM: req.system = optarg; break;
        case O_TEMP:
            if (!fy_cli_parse_float("--temp", optarg, 0, 100, &d)) return 2;
            req.gen.sampling.temperature = (float)d;
            break;
        case O_TOPK:
            if (!fy_cli_parse_int("--top-k", optarg, 0, 1 << 24, &v)) return 2;
            req.gen.sampling.top_k = (int32_t)v;
            break;
        case O_TOPP:
            if (!fy_cli_parse_float("--top-p", optarg, 1e-6, 1, &d)) return 2;
            req.gen.sampling.top_p = (float)d;
            break;
        case O_MINP:
            if (!fy_cli_parse_float("--min-p", optarg, 0, 1, &d)) return 2;
            req.gen.sampling.min_p = (float)d;
            break;
        case O_SEED:
            if (!fy_cli_parse_u64("--seed", optarg, &u)) return 2;
            req.gen.sampling.seed = u;
            break;
        case O_STOP:
            if (req.gen.n_stop == FY_GEN_MAX_STOP || strlen(optarg) == 0 || strlen(optarg) > FY_GEN_STOP_LEN) {
                fprintf(stderr, "ferry: request: at most %d stop strings of 1 to %d bytes\n", FY_GEN_MAX_STOP,
                        FY_GEN_STOP_LEN);
                return 2;
            }
            snprintf(req.gen.stop[req.gen.n_stop++], FY_GEN_STOP_LEN + 1, "%s", optarg);
            break;
        case O_IGN: req.gen.ignore_eos = true; break;
        case O_PRIO:
            if (!fy_cli_parse_int("--priority", optarg, -1000000, 1000000, &v)) return 2;
            req.gen.priority = (int32_t)v;
            break;
        case O_TIMEOUT:
            if (!fy_cli_parse_float("--timeout", optarg, 0.1, 86400, &timeout)) return 2;
            break;
        case O_STATUS: status = true; break;
        case 'q': quiet = true; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!fy_cli_no_operands("request", argc, argv, usage)) return 2;
    if (!status && !!req.prompt == !!file) {
        fprintf(stderr, "ferry: request needs one prompt, -p TEXT or -f FILE (or --status)\n");
        usage(stderr);
        return 2;
    }
    if (file) {
        if (!(prompt_file = fy_cli_read_file(file))) return 1;
        req.prompt = prompt_file;
    }
    if (req.gen.sampling.temperature > 0 && req.gen.sampling.seed == 0) req.gen.sampling.seed = (uint64_t)getpid();
    /* the address and the secret: flags first, then the configuration, then the key table's defaults */
    fy_config_t *cfg = NULL;
    char secret_buf[4096], router_buf[512];
    if (config) {
        char *cargv[] = {"ferry request", "-c", (char *)config, NULL};
        if (fy_cluster_config(3, cargv, "", &cfg) != FY_OK) {
            fy_free(prompt_file);
            return 2;
        }
    }
    const char *listen = NULL;
    if (!router && fy_conf_string(cfg, "router", "listen", &listen) == FY_OK && listen) {
        snprintf(router_buf, sizeof(router_buf), "%s", listen);
        router = router_buf;
    }
    if (!secret && fy_cluster_secret_path(cfg, secret_buf, sizeof(secret_buf))) secret = secret_buf;
    fy_config_destroy(cfg);
    if (!router || !secret) {
        fprintf(stderr, "ferry: request: give the router's address (-r) and a client key (--key) or the secret\n");
        fy_free(prompt_file);
        return 2;
    }
    /* several routers: each in turn, while one cannot be reached or dies
     * before any text came back (a router's requests die with it) */
    char routers[8][512];
    int n_routers = 0;
    for (const char *r = router; *r && n_routers < 8;) {
        size_t n = strcspn(r, ",");
        if (n && n < sizeof(routers[0])) snprintf(routers[n_routers++], sizeof(routers[0]), "%.*s", (int)n, r);
        r += n + (r[n] == ',');
    }
    if (!n_routers) {
        fprintf(stderr, "ferry: request: no router address in '%s'\n", router);
        fy_free(prompt_file);
        return 2;
    }
    int rc = 1;
    for (int k = 0; k < n_routers; k++) {
        bool next = false;
        rc = request_on(routers[k], secret, n_routers > 1 ? 3.0 : 10.0, &req, status, quiet, timeout, &next);
        if (!next || k + 1 == n_routers) break;
        fprintf(stderr, "ferry: request: router %s failed; trying %s\n", routers[k], routers[k + 1]);
    }
    fy_free(prompt_file);
    return rc;
}

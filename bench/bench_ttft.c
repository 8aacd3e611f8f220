/*
 * bench_ttft.c - `ferry bench-ttft`: time to first token, disaggregated
 * against colocated, for prompts of several lengths, one request at a
 * time (no queueing behind other requests: the phases themselves).
 *
 * Disaggregated: requests to a running cluster's router; the router's own
 * breakdown of each request (router queue and reservation, prefill queue
 * and compute on the prefill worker, the transfer's tail after compute,
 * and the first token's way back through adoption) and the client's
 * wall-clock TTFT.  Colocated: the same prompts through one in-process
 * engine with the same thread count as a prefill worker, TTFT measured
 * from submit to the first token's event.  Prompts are random tokens,
 * different for every repetition, so no prefix cache helps either side.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/backend.h"
#include "tools/cli.h"
#include "router/client.h"
#include "common/clock.h"
#include "tools/commands.h"
#include "engine/engine.h"
#include "engine/engine_config.h"
#include "kv/kv.h"
#include "common/log.h"
#include "common/mem.h"
#include "model/model.h"
#include "engine/runner.h"
#include "bench/stats.h"

#define MAX_LENS 8
#define MAX_REPS 64

static void make_prompt(int32_t *p, int32_t n, uint64_t seed)
{
    for (int32_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = 100 + (int32_t)((seed >> 33) % 40000);
    }
}

typedef struct first {
    double t;
    bool done;
} first_t;

static void on_event(void *arg, const fy_event_t *ev)
{
    first_t *f = arg;
    if (ev->kind == FY_EVENT_TOKEN && f->t == 0) f->t = fy_now_s();
    if (ev->kind == FY_EVENT_FINISH || ev->kind == FY_EVENT_ERROR) f->done = true;
}

/* TTFT of each prompt through one in-process engine. */
static fy_status_t colocated(const char *model, int threads, int32_t *const *prompts, const int32_t *lens, int n,
                             double *ttft)
{
    fy_model_t *m = NULL;
    fy_engine_stack_t s = {0};
    fy_engine_t *e = NULL;
    fy_status_t st;
    if ((st = fy_model_load(model, &m))) goto out;
    fy_engine_build_t eb;
    fy_engine_build_default(&eb);
    eb.threads = threads;
    eb.runner.max_seqs = eb.runner.max_logits = 8;
    eb.runner.kv_mem = 256 << 20;
    eb.runner.max_ctx = 8192;
    eb.prefix_caching = false;
    eb.engine.max_num_seqs = 8;
    if ((st = fy_engine_stack_create(m, &eb, &s))) goto out;
    e = s.engine;
    for (int i = 0; i < n; i++) {
        fy_genspec_t q;
        fy_genspec_default(&q);
        q.max_tokens = 1;
        first_t f = {0};
        double t0 = fy_now_s();
        uint64_t id;
        if ((st = fy_engine_submit(e, prompts[i], lens[i], &q, NULL, on_event, &f, &id))) goto out;
        while (!f.done)
            if ((st = fy_engine_step(e))) goto out;
        ttft[i] = f.t - t0;
    }
out:
    fy_engine_stack_destroy(&s);
    fy_model_destroy(m);
    return st;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ferry bench-ttft [-r ROUTER] [--secret FILE] [-m MODEL] [--prompt-tokens 128,512,2048] [--reps 5]\n"
            "                        [--threads N]\n"
            "  time to first token through a running cluster (its phases) against one in-process engine\n"
            "  -r, --router ADDR        the router's client address (default tcp://127.0.0.1:7400)\n"
            "      --secret FILE        the deployment's secret (default run/kv.secret)\n"
            "  -m, --model PATH         the colocated engine's model (default " FY_CLI_DEFAULT_MODEL ")\n"
            "      --prompt-tokens LIST prompt lengths, comma-separated\n"
            "      --reps N             requests per length (default 5)\n"
            "  -t, --threads N          the colocated engine's threads; match prefill.threads (default 1)\n"
            "  -h, --help\n");
}

int fy_cmd_bench_ttft(int argc, char **argv)
{
    enum { O_SECRET = 256, O_PROMPT, O_REPS };
    static const struct option opts[] = {
        {"router", required_argument, 0, 'r'},
        {"model", required_argument, 0, 'm'},
        {"secret", required_argument, 0, O_SECRET},
        {"prompt-tokens", required_argument, 0, O_PROMPT},
        {"reps", required_argument, 0, O_REPS},
        {"threads", required_argument, 0, 't'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *router = fy_conf_default("router", "listen"), *model = FY_CLI_DEFAULT_MODEL;
    const char *secret = "run/kv.secret";
    int32_t lens[MAX_LENS] = {128, 512, 2048};
    int n_lens = 3, l[MAX_LENS];
    long reps = 5, threads = 1;
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "r:m:t:h", opts, NULL)) != -1) {
        switch (opt) {
        case 'r': router = optarg; break;
        case 'm': model = optarg; break;
        case O_SECRET: secret = optarg; break;
        case O_PROMPT:
            if (!fy_cli_parse_int_list("--prompt-tokens", optarg, 1, 8000, l, MAX_LENS, &n_lens)) return 2;
            for (int k = 0; k < n_lens; k++) lens[k] = l[k];
            break;
        case O_REPS:
            if (!fy_cli_parse_int("--reps", optarg, 1, MAX_REPS, &reps)) return 2;
            break;
        case 't':
            if (!fy_cli_parse_int("--threads", optarg, 1, 256, &threads)) return 2;
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!fy_cli_no_operands("bench-ttft", argc, argv, usage)) return 2;
    fy_client_t *c;
    if (fy_client_create(router, secret, 10, &c) != FY_OK) return 1;
    fy_client_status_t cs;
    if (fy_client_status(c, &cs) != FY_OK || !cs.prefill_up || !cs.decode_up) {
        fprintf(stderr, "ferry: bench-ttft: no cluster at %s (start one with: bin/ferry serve -c configs/local.ini)\n",
                router);
        fy_client_destroy(c);
        return 1;
    }
    time_t now = time(NULL);
    char date[32];
    strftime(date, sizeof(date), "%Y-%m-%d", gmtime(&now));
    printf("ferry bench-ttft, %s: one request at a time, median of %ld; disaggregated through %s (%d prefill, %d "
           "decode workers), colocated in-process with %ld thread(s)\n\n",
           date, reps, router, cs.prefill_up, cs.decode_up, threads);
    printf("| prompt | colocated TTFT ms | disaggregated TTFT ms | ratio | router queue+reserve | prefill queue | "
           "prefill compute | transfer tail | first token back | KV MB |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    int rc = 0;
    for (int li = 0; li < n_lens && !rc; li++) {
        int32_t *prompts[MAX_REPS], plens[MAX_REPS];
        double col[MAX_REPS], dis[MAX_REPS], q[MAX_REPS], pq[MAX_REPS], pc[MAX_REPS], tail[MAX_REPS], back[MAX_REPS],
            mb[MAX_REPS];
        for (int k = 0; k < reps; k++) {
            prompts[k] = fy_malloc((size_t)lens[li] * sizeof(int32_t));
            make_prompt(prompts[k], lens[li], (uint64_t)(li * 1000 + k + 1) ^ (uint64_t)now);
            plens[k] = lens[li];
        }
        for (int k = 0; k < reps && !rc; k++) {
            fy_client_req_t req = {.tokens = prompts[k], .n_tokens = lens[li]};
            fy_genspec_default(&req.gen);
            req.gen.max_tokens = 1;
            req.gen.ignore_eos = true;
            fy_client_stream_t s;
            char err[256];
            double t0 = fy_now_s();
            if (fy_client_generate(c, &req, &s, err, sizeof(err)) != FY_OK) {
                fprintf(stderr, "ferry: bench-ttft: refused: %s\n", err);
                rc = 1;
                break;
            }
            double t_first = 0;
            for (;;) {
                fy_client_update_t u;
                if (fy_client_poll(c, &s, 1.0, &u) != FY_OK || (u.done && u.error)) {
                    fprintf(stderr, "ferry: bench-ttft: request failed: %s\n", u.message);
                    rc = 1;
                    break;
                }
                if (u.n_tokens && t_first == 0) t_first = fy_now_s();
                if (!u.done) continue;
                const fy_client_timings_t *t = &u.timings;
                dis[k] = t_first - t0;
                q[k] = t->queue_s + t->reserve_s;
                pq[k] = t->prefill_queue_s;
                pc[k] = t->prefill_compute_s;
                tail[k] = t->transfer_tail_s;
                back[k] = t->first_token_s;
                mb[k] = (double)t->transfer_bytes / 1e6;
                break;
            }
        }
        if (!rc && colocated(model, (int)threads, prompts, plens, (int)reps, col) != FY_OK) rc = 1;
        if (!rc) {
            double mc = median_upper(col, (int)reps), md = median_upper(dis, (int)reps);
            printf("| %d | %.1f | %.1f | %.2fx | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", lens[li], mc * 1e3,
                   md * 1e3, md / mc, median_upper(q, (int)reps) * 1e3, median_upper(pq, (int)reps) * 1e3,
                   median_upper(pc, (int)reps) * 1e3, median_upper(tail, (int)reps) * 1e3,
                   median_upper(back, (int)reps) * 1e3, median_upper(mb, (int)reps));
            fflush(stdout);
        }
        for (int k = 0; k < reps; k++) fy_free(prompts[k]);
    }
    fy_client_destroy(c);
    return rc;
}

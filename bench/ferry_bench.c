/*
 * ferry_bench.c - `ferry-bench`: the load-test harness.  Builds a
 * workload from a seed (synthetic, trace or ShareGPT), sends it to a
 * ferry router over nng or to any OpenAI-compatible server over HTTP at
 * one or several request rates, and reports throughput, latency
 * percentiles and goodput under SLOs (table on stdout, live progress on
 * stderr, JSON with every request, PNG charts through gnuplot).
 * `ferry-bench echo` runs the trivial server the harness is tested
 * against.  It is a client: it knows the router only through its
 * protocol.
 */
#include <curl/curl.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench/authcost.h"
#include "common/clock.h"
#include "bench/echo.h"
#include "common/log.h"
#include "common/mem.h"
#include "bench/report.h"
#include "bench/run.h"
#include "bench/workload.h"

#define MAX_RATES 32

static volatile int interrupted;

static void on_signal(int sig) { interrupted = 1; }

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ferry-bench [options]         load a server, report throughput, latency and goodput\n"
            "       ferry-bench echo [options]    a trivial server to load (ferry-bench echo --help)\n"
            "       ferry-bench auth [options]    what the control plane's authentication costs per message\n"
            "target:\n"
            "  -b, --backend nng|http   the router's nng protocol (default) or the OpenAI HTTP API\n"
            "  -u, --url ADDR           default tcp://127.0.0.1:7400 (nng), http://127.0.0.1:8080 (http;\n"
            "                           https://HOST:PORT for a router with router.tls_cert);\n"
            "                           nng: ADDR,ADDR... routers of one cluster (cluster.etcd), client thread k\n"
            "                           on router k mod N, moving on when one is unreachable or dies\n"
            "      --chat               /v1/chat/completions (http) or the chat template (nng)\n"
            "      --model NAME         the \"model\" field (http; default: the first model GET /v1/models lists)\n"
            "      --api-key KEY        Authorization: Bearer KEY (http; or FERRY_BENCH_API_KEY)\n"
            "      --secret FILE        the deployment's secret that authenticates nng calls\n"
            "                           (default: run/kv.secret, where `ferry serve` puts it)\n"
            "      --cacert FILE        https: verify the router against this CA (PEM) instead of the\n"
            "                           system's store\n"
            "      --no-ignore-eos      let answers end early (default: exactly the output length)\n"
            "      --allow-remote       allow an address that is not loopback (refused otherwise)\n"
            "workload (lengths are N, LO-HI uniform, or @FILE of 'LENGTH [WEIGHT]' lines):\n"
            "  -n, --num-requests N     requests in all (default 100)\n"
            "      --input-len L        prompt tokens (default 128)\n"
            "      --output-len L       output tokens (default 128)\n"
            "      --class IN/OUT[/W]   a request class with weight W (repeatable; replaces the two above)\n"
            "      --prefix-groups G    G groups sharing a prefix of --prefix-len tokens each\n"
            "      --prefix-len P\n"
            "      --turns T            conversations of T turns that resend their history\n"
            "      --think-time D       between a turn's answer and the next turn (default 0)\n"
            "      --trace FILE         JSONL trace (timestamp ms or arrival_s; input_length or prompt;\n"
            "                           output_length; hash_ids) replayed at its own times\n"
            "      --trace-block N      tokens per hash id (default 512)   --trace-speed X  time scale\n"
            "      --sharegpt FILE      ShareGPT conversations: first human turn, reply length / 4\n"
            "      --seed S             (default 1)\n"
            "arrivals:\n"
            "  -r, --rate R[,R...]      requests per second, Poisson; several rates: a sweep;\n"
            "                           inf: all at once (closed loop with --concurrency); default inf;\n"
            "                           point k of a sweep draws its prompts with seed + k\n"
            "      --burstiness K       gamma arrivals with shape K (1: Poisson; <1 burstier)\n"
            "  -C, --concurrency N      requests in flight at most (default %d)\n"
            "bounds:\n"
            "      --duration D         send nothing after D (e.g. 120s); default none\n"
            "      --timeout D          each request's limit (default 300s)\n"
            "report:\n"
            "      --slo LIST           ttft=500ms,tpot=50ms,e2e=10s: goodput counts requests meeting all\n"
            "      --json FILE          every figure and every request's timings\n"
            "      --plot DIR           PNG charts (gnuplot): latency CDFs, throughput and goodput vs rate\n"
            "      --label TEXT         a name for this run in the report\n"
            "      --no-progress        no live line on stderr\n"
            "  -h, --help\n",
            FY_BENCH_MAX_INFLIGHT);
}

/* "500ms", "2s", "1.5m", or seconds. */
static bool parse_dur(const char *opt, const char *s, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || !(v >= 0) || !isfinite(v)) goto bad;
    if (!strcmp(end, "ms"))
        v *= 1e-3;
    else if (!strcmp(end, "m"))
        v *= 60;
    else if (*end && strcmp(end, "s"))
        goto bad;
    *out = v;
    return true;
bad:
    fprintf(stderr, "ferry-bench: %s expects a duration (500ms, 2s, 1.5m), got '%s'\n", opt, s);
    return false;
}

static bool parse_long(const char *opt, const char *s, long lo, long hi, long *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "ferry-bench: %s expects an integer from %ld to %ld, got '%s'\n", opt, lo, hi, s);
        return false;
    }
    *out = v;
    return true;
}

static int parse_rates(const char *s, double *rates)
{
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", s);
    int n = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        double v;
        char *end;
        if (!strcmp(t, "inf") || !strcmp(t, "max"))
            v = 0;
        else {
            v = strtod(t, &end);
            if (end == t || *end || !(v > 0) || !isfinite(v)) {
                fprintf(stderr, "ferry-bench: --rate: '%s' is not a positive number or inf\n", t);
                return -1;
            }
        }
        if (n == MAX_RATES) {
            fprintf(stderr, "ferry-bench: --rate: at most %d rates\n", MAX_RATES);
            return -1;
        }
        rates[n++] = v;
    }
    if (!n) fprintf(stderr, "ferry-bench: --rate: no rate given\n");
    return n ? n : -1;
}

/* ---- echo -------------------------------------------------------------------------------------- */

static void echo_usage(FILE *f)
{
    fprintf(f, "usage: ferry-bench echo [--nng URL [--secret FILE]] [--http PORT] [--ttft D] [--itl D]\n"
               "                        [--fail-every N] [--api-key KEY] [--threads N] [--for D]\n"
               "  --secret FILE: the deployment's secret its nng clients hold (default run/kv.secret)\n"
               "  answers every request with max_tokens words; HTTP on 127.0.0.1 (port 0: any free one);\n"
               "  runs until SIGINT/SIGTERM or for D\n"
               "  -h, --help\n");
}

static int cmd_echo(int argc, char **argv)
{
    enum { O_NNG = 256, O_HTTP, O_TTFT, O_ITL, O_FAIL, O_KEY, O_THREADS, O_FOR, O_SECRET };
    static const struct option opts[] = {
        {"nng", required_argument, 0, O_NNG},
        {"http", required_argument, 0, O_HTTP},
        {"ttft", required_argument, 0, O_TTFT},
        {"itl", required_argument, 0, O_ITL},
        {"fail-every", required_argument, 0, O_FAIL},
        {"api-key", required_argument, 0, O_KEY},
        {"threads", required_argument, 0, O_THREADS},
        {"for", required_argument, 0, O_FOR},
        {"secret", required_argument, 0, O_SECRET},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    fy_bench_echo_params_t p = {.secret_file = "run/kv.secret"};
    double for_s = 0;
    long v;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case O_NNG: p.nng_url = optarg; break;
        case O_HTTP:
            if (!parse_long("--http", optarg, 0, 65535, &v)) return 2;
            p.http = true;
            p.http_port = (int)v;
            break;
        case O_TTFT:
            if (!parse_dur("--ttft", optarg, &p.ttft_s)) return 2;
            break;
        case O_ITL:
            if (!parse_dur("--itl", optarg, &p.itl_s)) return 2;
            break;
        case O_FAIL:
            if (!parse_long("--fail-every", optarg, 0, 1000000, &v)) return 2;
            p.fail_every = (int32_t)v;
            break;
        case O_KEY: p.api_key = optarg; break;
        case O_SECRET: p.secret_file = optarg; break;
        case O_THREADS:
            if (!parse_long("--threads", optarg, 1, 64, &v)) return 2;
            p.threads = (int)v;
            break;
        case O_FOR:
            if (!parse_dur("--for", optarg, &for_s)) return 2;
            break;
        case 'h': echo_usage(stdout); return 0;
        default: echo_usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "ferry-bench echo: unexpected argument '%s'\n", argv[optind]);
        echo_usage(stderr);
        return 2;
    }
    if (!p.nng_url && !p.http) {
        fprintf(stderr, "ferry-bench echo: give --nng URL, --http PORT or both\n");
        return 2;
    }
    char err[256];
    if (p.nng_url && fy_bench_check_address(p.nng_url, false, err, sizeof(err))) {
        fprintf(stderr, "ferry-bench echo: %s\n", err);
        return 2;
    }
    fy_bench_echo_t *e;
    fy_status_t st = fy_bench_echo_create(&p, &e);
    if (st) {
        fprintf(stderr, "ferry-bench echo: cannot start: %s\n", fy_status_str(st));
        return 1;
    }
    printf("echo: nng %s, http %s%d\n", p.nng_url ? p.nng_url : "-", p.http ? "127.0.0.1:" : "-",
           p.http ? fy_bench_echo_http_port(e) : 0);
    fflush(stdout);
    double t0 = fy_now_s();
    while (!interrupted) {
        usleep(100000);
        if (for_s > 0 && fy_now_s() - t0 > for_s) break;
    }
    fprintf(stderr, "echo: %llu requests served, %llu refused\n", (unsigned long long)fy_bench_echo_served(e),
            (unsigned long long)fy_bench_echo_refused(e));
    fy_bench_echo_destroy(e);
    return 0;
}

/* ---- load -------------------------------------------------------------------------------------- */

typedef struct opts {
    fy_bench_target_t target;
    const char *url;
    bool allow_remote, progress;
    fy_bench_synth_t synth;
    const char *input_len, *output_len;
    const char *classes[FY_BENCH_MAX_CLASSES];
    int n_classes;
    const char *trace, *sharegpt;
    fy_bench_trace_opts_t trace_opts;
    double rates[MAX_RATES];
    int n_rates;
    double burstiness;
    fy_bench_run_params_t run;
    fy_bench_slo_t slo;
    const char *json, *plot, *label;
} opts_t;

static json_t *json_config(const opts_t *o, int argc, char **argv, const fy_bench_workload_t *w)
{
    json_t *cmd = json_array();
    for (int i = 0; cmd && i < argc; i++) json_array_append_new(cmd, json_string(argv[i]));
    char date[32];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", &tm);
    char host[256] = "";
    gethostname(host, sizeof(host) - 1);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int64_t in = 0, out = 0;
    for (int32_t i = 0; i < w->n_reqs; i++) in += w->reqs[i].n_in, out += w->reqs[i].n_out;
    return json_pack("{s:s, s:o, s:s, s:s, s:I, s:{s:s, s:s, s:b, s:b}, s:{s:s, s:i, s:i, s:I, s:I, s:I, s:i, "
                     "s:i, s:i, s:f}, s:{s:f, s:i, s:f, s:f}, s:o}",
                     "tool", "ferry-bench", "command", cmd ? cmd : json_null(), "date", date, "host", host, "cpus",
                     (json_int_t)ncpu, "target", "backend", o->target.proto == FY_BENCH_PROTO_HTTP ? "http" : "nng",
                     "url", o->url, "chat", o->target.chat, "ignore_eos", o->target.ignore_eos, "workload", "source",
                     o->trace      ? o->trace
                     : o->sharegpt ? o->sharegpt
                                   : "synthetic",
                     "requests", w->n_reqs, "conversations", w->n_convs, "seed", (json_int_t)o->synth.seed,
                     "input_tokens", (json_int_t)in, "output_tokens", (json_int_t)out, "prefix_groups",
                     o->synth.prefix_groups, "prefix_len", o->synth.prefix_len, "turns", o->synth.turns, "think_s",
                     o->synth.think_s, "arrivals", "burstiness", o->burstiness, "concurrency", o->run.max_concurrency,
                     "timeout_s", o->run.timeout_s, "duration_s", o->run.duration_s, "slo", fy_bench_json_slo(&o->slo));
}

enum {
    O_CHAT = 256,
    O_MODEL,
    O_KEY,
    O_NOEOS,
    O_REMOTE,
    O_IN,
    O_OUT,
    O_CLASS,
    O_PG,
    O_PL,
    O_TURNS,
    O_THINK,
    O_TRACE,
    O_TBLOCK,
    O_TSPEED,
    O_SHAREGPT,
    O_SEED,
    O_BURST,
    O_DURATION,
    O_TIMEOUT,
    O_SLO,
    O_JSON,
    O_PLOT,
    O_LABEL,
    O_NOPROG,
    O_SECRET,
    O_CACERT,
    O_NOT_MINE
};

/* A positive finite number. */
static bool parse_positive(const char *opt, const char *s, double *out)
{
    char *end;
    double d = strtod(s, &end);
    if (end == s || *end || !(d > 0) || !isfinite(d)) {
        fprintf(stderr, "ferry-bench: %s expects a positive number, got '%s'\n", opt, s);
        return false;
    }
    *out = d;
    return true;
}

/* The workload's options (what is sent): 0 taken, 2 a bad value (said),
 * O_NOT_MINE another group's option. */
static int load_workload_opt(int c, const char *arg, opts_t *o)
{
    long v;
    switch (c) {
    case 'n':
        if (!parse_long("--num-requests", arg, 1, 10000000, &v)) return 2;
        o->synth.n_requests = (int32_t)v;
        o->trace_opts.max_requests = (int32_t)v;
        return 0;
    case O_IN: o->input_len = arg; return 0;
    case O_OUT: o->output_len = arg; return 0;
    case O_CLASS:
        if (o->n_classes == FY_BENCH_MAX_CLASSES) {
            fprintf(stderr, "ferry-bench: at most %d --class\n", FY_BENCH_MAX_CLASSES);
            return 2;
        }
        o->classes[o->n_classes++] = arg;
        return 0;
    case O_PG:
        if (!parse_long("--prefix-groups", arg, 1, 1000000, &v)) return 2;
        o->synth.prefix_groups = (int32_t)v;
        return 0;
    case O_PL:
        if (!parse_long("--prefix-len", arg, 1, FY_BENCH_MAX_LEN, &v)) return 2;
        o->synth.prefix_len = (int32_t)v;
        return 0;
    case O_TURNS:
        if (!parse_long("--turns", arg, 1, 1000, &v)) return 2;
        o->synth.turns = (int32_t)v;
        return 0;
    case O_THINK: return parse_dur("--think-time", arg, &o->synth.think_s) ? 0 : 2;
    case O_TRACE: o->trace = arg; return 0;
    case O_TBLOCK:
        if (!parse_long("--trace-block", arg, 1, 1 << 20, &v)) return 2;
        o->trace_opts.block_tokens = (int32_t)v;
        return 0;
    case O_TSPEED: return parse_positive("--trace-speed", arg, &o->trace_opts.time_scale) ? 0 : 2;
    case O_SHAREGPT: o->sharegpt = arg; return 0;
    case O_SEED: {
        char *end;
        unsigned long long s = strtoull(arg, &end, 10);
        if (end == arg || *end) {
            fprintf(stderr, "ferry-bench: --seed expects an integer\n");
            return 2;
        }
        o->synth.seed = o->trace_opts.seed = s;
        return 0;
    }
    }
    return O_NOT_MINE;
}

/* The target's, the arrivals' and the report's options.  As above. */
static int load_run_opt(int c, const char *arg, opts_t *o)
{
    char err[512];
    long v;
    switch (c) {
    case 'b':
        if (!strcmp(arg, "nng"))
            o->target.proto = FY_BENCH_PROTO_NNG;
        else if (!strcmp(arg, "http") || !strcmp(arg, "openai"))
            o->target.proto = FY_BENCH_PROTO_HTTP;
        else {
            fprintf(stderr, "ferry-bench: --backend is nng or http, not '%s'\n", arg);
            return 2;
        }
        return 0;
    case 'u': o->url = arg; return 0;
    case O_CHAT: o->target.chat = true; return 0;
    case O_MODEL: o->target.model = arg; return 0;
    case O_KEY: o->target.api_key = arg; return 0;
    case O_SECRET: o->target.secret_file = arg; return 0;
    case O_CACERT: o->target.ca_file = arg; return 0;
    case O_NOEOS: o->target.ignore_eos = false; return 0;
    case O_REMOTE: o->allow_remote = true; return 0;
    case 'r': return (o->n_rates = parse_rates(arg, o->rates)) < 0 ? 2 : 0;
    case O_BURST: return parse_positive("--burstiness", arg, &o->burstiness) ? 0 : 2;
    case 'C':
        if (!parse_long("--concurrency", arg, 1, FY_BENCH_MAX_INFLIGHT, &v)) return 2;
        o->run.max_concurrency = (int32_t)v;
        return 0;
    case O_DURATION: return parse_dur("--duration", arg, &o->run.duration_s) ? 0 : 2;
    case O_TIMEOUT:
        if (!parse_dur("--timeout", arg, &o->run.timeout_s)) return 2;
        if (o->run.timeout_s <= 0) {
            fprintf(stderr, "ferry-bench: --timeout must be positive\n");
            return 2;
        }
        return 0;
    case O_SLO:
        if (fy_bench_slo_parse(arg, &o->slo, err, sizeof(err))) {
            fprintf(stderr, "ferry-bench: %s\n", err);
            return 2;
        }
        return 0;
    case O_JSON: o->json = arg; return 0;
    case O_PLOT: o->plot = arg; return 0;
    case O_LABEL: o->label = arg; return 0;
    case O_NOPROG: o->progress = false; return 0;
    }
    return O_NOT_MINE;
}

/* The options' combinations, the address and the defaults that depend on
 * them: 0 or the exit status (said). */
static int load_check(opts_t *o)
{
    char err[512];
    if (!o->url) o->url = o->target.proto == FY_BENCH_PROTO_HTTP ? "http://127.0.0.1:8080" : "tcp://127.0.0.1:7400";
    if (o->target.proto == FY_BENCH_PROTO_HTTP && strncmp(o->url, "http://", 7) && strncmp(o->url, "https://", 8)) {
        fprintf(stderr, "ferry-bench: the http backend needs an http:// address, not '%s'\n", o->url);
        return 2;
    }
    if (o->target.ca_file && strncmp(o->url, "https://", 8)) {
        fprintf(stderr, "ferry-bench: --cacert is for an https:// address, not '%s'\n", o->url);
        return 2;
    }
    if (o->target.ca_file && access(o->target.ca_file, R_OK)) {
        fprintf(stderr, "ferry-bench: --cacert %s: %s\n", o->target.ca_file, strerror(errno));
        return 2;
    }
    if (o->target.proto == FY_BENCH_PROTO_NNG && !strncmp(o->url, "http", 4)) {
        fprintf(stderr, "ferry-bench: '%s' is an HTTP address: add --backend http\n", o->url);
        return 2;
    }
    if (fy_bench_check_address(o->url, o->allow_remote, err, sizeof(err))) {
        fprintf(stderr, "ferry-bench: %s\n", err);
        return 2;
    }
    if (!o->target.api_key) o->target.api_key = getenv("FERRY_BENCH_API_KEY");
    if (!o->target.secret_file) o->target.secret_file = "run/kv.secret";
    o->target.url = o->url;
    if ((o->trace != NULL) + (o->sharegpt != NULL) > 1 ||
        ((o->trace || o->sharegpt) && (o->n_classes || o->input_len || o->synth.prefix_groups || o->synth.turns > 1))) {
        fprintf(stderr, "ferry-bench: --trace, --sharegpt and the synthetic options exclude each other\n");
        return 2;
    }
    if ((o->synth.prefix_groups > 0) != (o->synth.prefix_len > 0)) {
        fprintf(stderr, "ferry-bench: --prefix-groups and --prefix-len go together\n");
        return 2;
    }
    if (o->n_classes && (o->input_len || o->output_len)) {
        fprintf(stderr, "ferry-bench: --class replaces --input-len and --output-len: give one or the other\n");
        return 2;
    }
    o->run.progress = o->progress;
    o->run.abort_flag = &interrupted;
    return 0;
}

/* 0: o is complete; -1: --help answered; else the exit status. */
static int load_parse(int argc, char **argv, opts_t *o)
{
    static const struct option lo[] = {
        {"backend", required_argument, 0, 'b'},
        {"proto", required_argument, 0, 'b'},
        {"url", required_argument, 0, 'u'},
        {"chat", no_argument, 0, O_CHAT},
        {"model", required_argument, 0, O_MODEL},
        {"api-key", required_argument, 0, O_KEY},
        {"secret", required_argument, 0, O_SECRET},
        {"cacert", required_argument, 0, O_CACERT},
        {"no-ignore-eos", no_argument, 0, O_NOEOS},
        {"allow-remote", no_argument, 0, O_REMOTE},
        {"num-requests", required_argument, 0, 'n'},
        {"input-len", required_argument, 0, O_IN},
        {"output-len", required_argument, 0, O_OUT},
        {"class", required_argument, 0, O_CLASS},
        {"prefix-groups", required_argument, 0, O_PG},
        {"prefix-len", required_argument, 0, O_PL},
        {"turns", required_argument, 0, O_TURNS},
        {"think-time", required_argument, 0, O_THINK},
        {"trace", required_argument, 0, O_TRACE},
        {"trace-block", required_argument, 0, O_TBLOCK},
        {"trace-speed", required_argument, 0, O_TSPEED},
        {"sharegpt", required_argument, 0, O_SHAREGPT},
        {"seed", required_argument, 0, O_SEED},
        {"rate", required_argument, 0, 'r'},
        {"burstiness", required_argument, 0, O_BURST},
        {"concurrency", required_argument, 0, 'C'},
        {"duration", required_argument, 0, O_DURATION},
        {"timeout", required_argument, 0, O_TIMEOUT},
        {"slo", required_argument, 0, O_SLO},
        {"json", required_argument, 0, O_JSON},
        {"plot", required_argument, 0, O_PLOT},
        {"label", required_argument, 0, O_LABEL},
        {"no-progress", no_argument, 0, O_NOPROG},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    int c, rc;
    optind = 1;
    while ((c = getopt_long(argc, argv, "b:u:n:r:C:h", lo, NULL)) != -1) {
        switch (c) {
        case 'h': usage(stdout); return -1;
        case '?':
            if (optopt == 'c')
                fprintf(stderr, "ferry-bench: the concurrency is -C (--concurrency); -c is no option here\n");
            usage(stderr);
            return 2;
        default:
            if ((rc = load_workload_opt(c, optarg, o)) == O_NOT_MINE) rc = load_run_opt(c, optarg, o);
            if (rc) return rc == O_NOT_MINE ? 2 : rc;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "ferry-bench: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    return load_check(o);
}

/* The workload, once: every rate sends the same requests (a sweep's
 * synthetic points draw their own prompts of the same lengths). */
static fy_status_t load_workload(opts_t *o, fy_bench_workload_t **w_p, char *err, size_t cap)
{
    fy_status_t st = FY_OK;
    if (o->trace) return fy_bench_workload_trace(o->trace, &o->trace_opts, w_p, err, cap);
    if (o->sharegpt) {
        int32_t out = 0;
        if (o->output_len) {
            fy_bench_len_t l;
            if ((st = fy_bench_len_parse(o->output_len, &l, err, cap)) == FY_OK) {
                if (l.kind != FY_BENCH_LEN_FIXED) {
                    snprintf(err, cap, "--output-len with --sharegpt must be one number");
                    st = FY_ERR_INVALID;
                }
                out = l.lo;
                fy_bench_len_free(&l);
            }
        }
        return st ? st : fy_bench_workload_sharegpt(o->sharegpt, o->synth.n_requests, out, w_p, err, cap);
    }
    char spec[512]; /* without --class: one class from --input-len / --output-len */
    const char *classes[FY_BENCH_MAX_CLASSES];
    int n_classes = o->n_classes;
    memcpy(classes, o->classes, sizeof(classes));
    if (!n_classes) {
        snprintf(spec, sizeof(spec), "%s/%s", o->input_len ? o->input_len : "128",
                 o->output_len ? o->output_len : "128");
        classes[n_classes++] = spec;
    }
    for (int i = 0; i < n_classes && !st; i++) {
        st = fy_bench_class_parse(classes[i], &o->synth.classes[i], err, cap);
        if (!st) o->synth.n_classes = i + 1;
    }
    return st ? st : fy_bench_workload_synth(&o->synth, w_p, err, cap);
}

/* What a sweep keeps of each point it ran. */
typedef struct sweep {
    fy_bench_summary_t sums[MAX_RATES];
    fy_bench_result_t *res[MAX_RATES];
    int32_t n_res[MAX_RATES];
    int n_done;
    json_t *runs; /* with --json: one object per point */
} sweep_t;

/* Point k of the sweep: its workload (a synthetic sweep's own prompts),
 * its arrivals at at, the run, its summary and report: 0 or 1. */
static int load_point(opts_t *o, int k, fy_bench_workload_t **w, double *at, sweep_t *sw)
{
    char err[512];
    if (k > 0 && !o->trace && !o->sharegpt) {
        /* each point of a sweep its own prompts (same lengths), so none finds the
         * previous point's prompts in a prefix cache */
        fy_bench_workload_t *w2;
        fy_bench_synth_t sp = o->synth;
        sp.seed = o->synth.seed + (uint64_t)k;
        if (fy_bench_workload_synth(&sp, &w2, err, sizeof(err))) {
            fprintf(stderr, "ferry-bench: %s\n", err);
            return 1;
        }
        fy_bench_workload_destroy(*w);
        *w = w2;
    }
    fy_bench_arrivals(*w, o->rates[k], o->burstiness, o->synth.seed, at);
    if (fy_bench_results_create(*w, &sw->res[k])) return 1;
    sw->n_res[k] = (*w)->n_reqs;
    char label[128];
    if (o->rates[k] > 0)
        snprintf(label, sizeof(label), "%s%s%g req/s", o->label ? o->label : "", o->label ? " " : "", o->rates[k]);
    else
        snprintf(label, sizeof(label), "%s%smax rate", o->label ? o->label : "", o->label ? " " : "");
    o->run.label = label;
    double dur = 0;
    fy_status_t st = fy_bench_run(&o->target, *w, at, &o->run, sw->res[k], &dur);
    o->run.label = NULL;
    if (st) {
        fprintf(stderr, "ferry-bench: the run could not happen: %s\n", fy_status_str(st));
        return 1;
    }
    if (fy_bench_summarize(sw->res[k], (*w)->n_reqs, dur, o->rates[k], fy_bench_closed_loop(*w, o->rates[k]), &o->slo,
                           &sw->sums[k]))
        return 1;
    sw->n_done = k + 1;
    fy_bench_print_summary(stdout, o->label, &sw->sums[k], &o->slo);
    fflush(stdout);
    int rc = sw->sums[k].n_ok == 0 ? 1 : 0;
    if (o->json) {
        json_t *j = fy_bench_json_run(&sw->sums[k], *w, sw->res[k], &o->slo);
        if (!j || json_array_append_new(sw->runs, j)) rc = 1;
    }
    return rc;
}

/* The sweep's table, --json and --plot: 0 or 1. */
static int load_report(const opts_t *o, int argc, char **argv, const fy_bench_workload_t *w, sweep_t *sw)
{
    int rc = 0;
    if (sw->n_done > 1) {
        printf("\n");
        fy_bench_print_sweep(stdout, sw->sums, sw->n_done, &o->slo);
    }
    if (interrupted) fprintf(stderr, "ferry-bench: interrupted\n");
    if (o->json && sw->n_done) {
        json_t *root = json_config(o, argc, argv, w);
        if (!root || json_object_set(root, "runs", sw->runs) || json_dump_file(root, o->json, JSON_INDENT(1))) {
            fprintf(stderr, "ferry-bench: cannot write %s\n", o->json);
            rc = 1;
        } else {
            fprintf(stderr, "ferry-bench: wrote %s\n", o->json);
        }
        json_decref(root);
    }
    if (o->plot && sw->n_done) {
        if (fy_bench_plot(o->plot, sw->sums, sw->res, sw->n_res, sw->n_done))
            rc = 1;
        else
            fprintf(stderr, "ferry-bench: charts in %s\n", o->plot);
    }
    return rc;
}

static int cmd_load(int argc, char **argv)
{
    opts_t o = {.progress = true, .burstiness = 1.0, .n_rates = 1};
    o.target.ignore_eos = true;
    o.synth = (fy_bench_synth_t){.n_requests = 100, .turns = 1, .seed = 1};
    o.run.timeout_s = 300;
    o.trace_opts.time_scale = 1;
    int rc = load_parse(argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;
    char err[512];
    fy_bench_workload_t *w = NULL;
    if (load_workload(&o, &w, err, sizeof(err))) {
        fprintf(stderr, "ferry-bench: %s\n", err);
        for (int i = 0; i < o.synth.n_classes; i++) fy_bench_class_free(&o.synth.classes[i]);
        return 2;
    }
    if (w->timed && o.rates[0] == 0 && o.n_rates == 1)
        fprintf(stderr, "ferry-bench: replaying %s at its own times\n", o.trace);
    sweep_t sw = {.runs = json_array()};
    double *at = fy_malloc((size_t)w->n_convs * sizeof(double));
    if (!at || !sw.runs) {
        fprintf(stderr, "ferry-bench: out of memory\n");
        rc = 2;
        goto out;
    }
    for (int k = 0; k < o.n_rates && !interrupted; k++) {
        int prc = load_point(&o, k, &w, at, &sw);
        rc |= prc;
        if (prc && sw.n_done <= k) break; /* the point did not run */
    }
    rc |= load_report(&o, argc, argv, w, &sw);
out:
    for (int i = 0; i < o.synth.n_classes; i++) fy_bench_class_free(&o.synth.classes[i]);
    json_decref(sw.runs);
    for (int k = 0; k < MAX_RATES; k++)
        if (sw.res[k]) fy_bench_results_destroy(sw.res[k], w->n_reqs);
    fy_free(at);
    fy_bench_workload_destroy(w);
    return rc;
}

int main(int argc, char **argv)
{
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    fy_log_set_level(FY_LOG_WARN);
    if (curl_global_init(CURL_GLOBAL_DEFAULT)) {
        fprintf(stderr, "ferry-bench: curl does not initialize\n");
        return 1;
    }
    int rc;
    char name[64]; /* a subcommand's argv[0], for getopt's messages */
    if (argc > 1 && (!strcmp(argv[1], "echo") || !strcmp(argv[1], "auth"))) {
        bool echo = !strcmp(argv[1], "echo");
        snprintf(name, sizeof(name), "ferry-bench %s", argv[1]);
        argv[1] = name;
        rc = echo ? cmd_echo(argc - 1, argv + 1) : fy_bench_auth_main(argc - 1, argv + 1);
    } else {
        rc = cmd_load(argc, argv);
    }
    curl_global_cleanup();
    return rc;
}

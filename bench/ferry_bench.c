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
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "authcost.h"
#include "echo.h"
#include "log.h"
#include "mem.h"
#include "report.h"
#include "run.h"
#include "workload.h"

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
            "  -u, --url ADDR           default tcp://127.0.0.1:7400 (nng), http://127.0.0.1:8080 (http)\n"
            "      --chat               /v1/chat/completions (http) or the chat template (nng)\n"
            "      --model NAME         the \"model\" field (http; default \"default\")\n"
            "      --api-key KEY        Authorization: Bearer KEY (http; or FERRY_BENCH_API_KEY)\n"
            "      --secret FILE        the deployment's secret that authenticates nng calls\n"
            "                           (default: run/kv.secret, where `ferry serve` puts it)\n"
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
            "  -c, --concurrency N      requests in flight at most (default %d)\n"
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
    if (!strcmp(end, "ms")) v *= 1e-3;
    else if (!strcmp(end, "m")) v *= 60;
    else if (*end && strcmp(end, "s")) goto bad;
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
        if (!strcmp(t, "inf") || !strcmp(t, "max")) v = 0;
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

static int cmd_echo(int argc, char **argv)
{
    enum { O_NNG = 256, O_HTTP, O_TTFT, O_ITL, O_FAIL, O_KEY, O_THREADS, O_FOR, O_SECRET };
    static const struct option opts[] = {
        {"nng", required_argument, 0, O_NNG},       {"http", required_argument, 0, O_HTTP},
        {"ttft", required_argument, 0, O_TTFT},     {"itl", required_argument, 0, O_ITL},
        {"fail-every", required_argument, 0, O_FAIL}, {"api-key", required_argument, 0, O_KEY},
        {"threads", required_argument, 0, O_THREADS}, {"for", required_argument, 0, O_FOR},
        {"secret", required_argument, 0, O_SECRET}, {"help", no_argument, 0, 'h'},
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
        case O_TTFT: if (!parse_dur("--ttft", optarg, &p.ttft_s)) return 2; break;
        case O_ITL: if (!parse_dur("--itl", optarg, &p.itl_s)) return 2; break;
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
        case O_FOR: if (!parse_dur("--for", optarg, &for_s)) return 2; break;
        case 'h':
            printf("usage: ferry-bench echo [--nng URL [--secret FILE]] [--http PORT] [--ttft D] [--itl D]\n"
                   "                        [--fail-every N] [--api-key KEY] [--threads N] [--for D]\n"
                   "  --secret FILE: the deployment's secret its nng clients hold (default run/kv.secret)\n"
                   "  answers every request with max_tokens words; HTTP on 127.0.0.1 (port 0: any free one);\n"
                   "  runs until SIGINT/SIGTERM or for D\n");
            return 0;
        default: return 2;
        }
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
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (!interrupted) {
        usleep(100000);
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (for_s > 0 && (double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) * 1e-9 > for_s) break;
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
                     (json_int_t)ncpu, "target", "backend",
                     o->target.proto == FY_BENCH_PROTO_HTTP ? "http" : "nng", "url", o->url, "chat", o->target.chat,
                     "ignore_eos", o->target.ignore_eos, "workload", "source",
                     o->trace ? o->trace : o->sharegpt ? o->sharegpt : "synthetic", "requests", w->n_reqs,
                     "conversations", w->n_convs, "seed", (json_int_t)o->synth.seed, "input_tokens", (json_int_t)in,
                     "output_tokens", (json_int_t)out, "prefix_groups", o->synth.prefix_groups, "prefix_len",
                     o->synth.prefix_len, "turns", o->synth.turns, "think_s", o->synth.think_s, "arrivals",
                     "burstiness", o->burstiness, "concurrency", o->run.max_concurrency, "timeout_s",
                     o->run.timeout_s, "duration_s", o->run.duration_s, "slo", fy_bench_json_slo(&o->slo));
}

static int cmd_load(int argc, char **argv)
{
    enum {
        O_CHAT = 256, O_MODEL, O_KEY, O_NOEOS, O_REMOTE, O_IN, O_OUT, O_CLASS, O_PG, O_PL, O_TURNS, O_THINK,
        O_TRACE, O_TBLOCK, O_TSPEED, O_SHAREGPT, O_SEED, O_BURST, O_DURATION, O_TIMEOUT, O_SLO, O_JSON, O_PLOT,
        O_LABEL, O_NOPROG, O_SECRET
    };
    static const struct option lo[] = {
        {"backend", required_argument, 0, 'b'},     {"proto", required_argument, 0, 'b'},
        {"url", required_argument, 0, 'u'},         {"chat", no_argument, 0, O_CHAT},
        {"model", required_argument, 0, O_MODEL},   {"api-key", required_argument, 0, O_KEY},
        {"secret", required_argument, 0, O_SECRET},
        {"no-ignore-eos", no_argument, 0, O_NOEOS}, {"allow-remote", no_argument, 0, O_REMOTE},
        {"num-requests", required_argument, 0, 'n'}, {"input-len", required_argument, 0, O_IN},
        {"output-len", required_argument, 0, O_OUT}, {"class", required_argument, 0, O_CLASS},
        {"prefix-groups", required_argument, 0, O_PG}, {"prefix-len", required_argument, 0, O_PL},
        {"turns", required_argument, 0, O_TURNS},   {"think-time", required_argument, 0, O_THINK},
        {"trace", required_argument, 0, O_TRACE},   {"trace-block", required_argument, 0, O_TBLOCK},
        {"trace-speed", required_argument, 0, O_TSPEED}, {"sharegpt", required_argument, 0, O_SHAREGPT},
        {"seed", required_argument, 0, O_SEED},     {"rate", required_argument, 0, 'r'},
        {"burstiness", required_argument, 0, O_BURST}, {"concurrency", required_argument, 0, 'c'},
        {"duration", required_argument, 0, O_DURATION}, {"timeout", required_argument, 0, O_TIMEOUT},
        {"slo", required_argument, 0, O_SLO},       {"json", required_argument, 0, O_JSON},
        {"plot", required_argument, 0, O_PLOT},     {"label", required_argument, 0, O_LABEL},
        {"no-progress", no_argument, 0, O_NOPROG},  {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    opts_t o = {.progress = true, .burstiness = 1.0, .n_rates = 1};
    o.target.ignore_eos = true;
    o.synth = (fy_bench_synth_t){.n_requests = 100, .turns = 1, .seed = 1};
    o.run.timeout_s = 300;
    o.trace_opts.time_scale = 1;
    char err[512];
    long v;
    double d;
    int c, rc = 2;
    const char *classes[FY_BENCH_MAX_CLASSES];
    int n_classes = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "b:u:n:r:c:h", lo, NULL)) != -1) {
        switch (c) {
        case 'b':
            if (!strcmp(optarg, "nng")) o.target.proto = FY_BENCH_PROTO_NNG;
            else if (!strcmp(optarg, "http") || !strcmp(optarg, "openai")) o.target.proto = FY_BENCH_PROTO_HTTP;
            else {
                fprintf(stderr, "ferry-bench: --backend is nng or http, not '%s'\n", optarg);
                return 2;
            }
            break;
        case 'u': o.url = optarg; break;
        case O_CHAT: o.target.chat = true; break;
        case O_MODEL: o.target.model = optarg; break;
        case O_KEY: o.target.api_key = optarg; break;
        case O_SECRET: o.target.secret_file = optarg; break;
        case O_NOEOS: o.target.ignore_eos = false; break;
        case O_REMOTE: o.allow_remote = true; break;
        case 'n':
            if (!parse_long("--num-requests", optarg, 1, 10000000, &v)) return 2;
            o.synth.n_requests = (int32_t)v;
            o.trace_opts.max_requests = (int32_t)v;
            break;
        case O_IN: o.input_len = optarg; break;
        case O_OUT: o.output_len = optarg; break;
        case O_CLASS:
            if (n_classes == FY_BENCH_MAX_CLASSES) {
                fprintf(stderr, "ferry-bench: at most %d --class\n", FY_BENCH_MAX_CLASSES);
                return 2;
            }
            classes[n_classes++] = optarg;
            break;
        case O_PG:
            if (!parse_long("--prefix-groups", optarg, 1, 1000000, &v)) return 2;
            o.synth.prefix_groups = (int32_t)v;
            break;
        case O_PL:
            if (!parse_long("--prefix-len", optarg, 1, FY_BENCH_MAX_LEN, &v)) return 2;
            o.synth.prefix_len = (int32_t)v;
            break;
        case O_TURNS:
            if (!parse_long("--turns", optarg, 1, 1000, &v)) return 2;
            o.synth.turns = (int32_t)v;
            break;
        case O_THINK: if (!parse_dur("--think-time", optarg, &o.synth.think_s)) return 2; break;
        case O_TRACE: o.trace = optarg; break;
        case O_TBLOCK:
            if (!parse_long("--trace-block", optarg, 1, 1 << 20, &v)) return 2;
            o.trace_opts.block_tokens = (int32_t)v;
            break;
        case O_TSPEED: {
            char *end;
            d = strtod(optarg, &end);
            if (end == optarg || *end || !(d > 0) || !isfinite(d)) {
                fprintf(stderr, "ferry-bench: --trace-speed expects a positive number\n");
                return 2;
            }
            o.trace_opts.time_scale = d;
            break;
        }
        case O_SHAREGPT: o.sharegpt = optarg; break;
        case O_SEED: {
            char *end;
            unsigned long long s = strtoull(optarg, &end, 10);
            if (end == optarg || *end) {
                fprintf(stderr, "ferry-bench: --seed expects an integer\n");
                return 2;
            }
            o.synth.seed = o.trace_opts.seed = s;
            break;
        }
        case 'r':
            if ((o.n_rates = parse_rates(optarg, o.rates)) < 0) return 2;
            break;
        case O_BURST: {
            char *end;
            d = strtod(optarg, &end);
            if (end == optarg || *end || !(d > 0) || !isfinite(d)) {
                fprintf(stderr, "ferry-bench: --burstiness expects a positive number\n");
                return 2;
            }
            o.burstiness = d;
            break;
        }
        case 'c':
            if (!parse_long("--concurrency", optarg, 1, FY_BENCH_MAX_INFLIGHT, &v)) return 2;
            o.run.max_concurrency = (int32_t)v;
            break;
        case O_DURATION: if (!parse_dur("--duration", optarg, &o.run.duration_s)) return 2; break;
        case O_TIMEOUT:
            if (!parse_dur("--timeout", optarg, &o.run.timeout_s)) return 2;
            if (o.run.timeout_s <= 0) {
                fprintf(stderr, "ferry-bench: --timeout must be positive\n");
                return 2;
            }
            break;
        case O_SLO:
            if (fy_bench_slo_parse(optarg, &o.slo, err, sizeof(err))) {
                fprintf(stderr, "ferry-bench: %s\n", err);
                return 2;
            }
            break;
        case O_JSON: o.json = optarg; break;
        case O_PLOT: o.plot = optarg; break;
        case O_LABEL: o.label = optarg; break;
        case O_NOPROG: o.progress = false; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "ferry-bench: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!o.url) o.url = o.target.proto == FY_BENCH_PROTO_HTTP ? "http://127.0.0.1:8080" : "tcp://127.0.0.1:7400";
    if (o.target.proto == FY_BENCH_PROTO_HTTP && strncmp(o.url, "http://", 7) && strncmp(o.url, "https://", 8)) {
        fprintf(stderr, "ferry-bench: the http backend needs an http:// address, not '%s'\n", o.url);
        return 2;
    }
    if (o.target.proto == FY_BENCH_PROTO_NNG && !strncmp(o.url, "http", 4)) {
        fprintf(stderr, "ferry-bench: '%s' is an HTTP address: add --backend http\n", o.url);
        return 2;
    }
    if (fy_bench_check_address(o.url, o.allow_remote, err, sizeof(err))) {
        fprintf(stderr, "ferry-bench: %s\n", err);
        return 2;
    }
    if (!o.target.api_key) o.target.api_key = getenv("FERRY_BENCH_API_KEY");
    if (!o.target.secret_file) o.target.secret_file = "run/kv.secret";
    o.target.url = o.url;
    if ((o.trace != NULL) + (o.sharegpt != NULL) > 1 ||
        ((o.trace || o.sharegpt) && (n_classes || o.input_len || o.synth.prefix_groups || o.synth.turns > 1))) {
        fprintf(stderr, "ferry-bench: --trace, --sharegpt and the synthetic options exclude each other\n");
        return 2;
    }
    if ((o.synth.prefix_groups > 0) != (o.synth.prefix_len > 0)) {
        fprintf(stderr, "ferry-bench: --prefix-groups and --prefix-len go together\n");
        return 2;
    }
    if (n_classes && (o.input_len || o.output_len)) {
        fprintf(stderr, "ferry-bench: --class replaces --input-len and --output-len: give one or the other\n");
        return 2;
    }
    o.run.progress = o.progress;
    o.run.abort_flag = &interrupted;

    /* the workload, once: every rate sends the same requests */
    fy_bench_workload_t *w = NULL;
    fy_status_t st = FY_OK;
    if (o.trace) {
        st = fy_bench_workload_trace(o.trace, &o.trace_opts, &w, err, sizeof(err));
    } else if (o.sharegpt) {
        int32_t out = 0;
        if (o.output_len) {
            fy_bench_len_t l;
            if ((st = fy_bench_len_parse(o.output_len, &l, err, sizeof(err))) == FY_OK) {
                if (l.kind != FY_BENCH_LEN_FIXED) {
                    snprintf(err, sizeof(err), "--output-len with --sharegpt must be one number");
                    st = FY_ERR_INVALID;
                }
                out = l.lo;
                fy_bench_len_free(&l);
            }
        }
        if (!st) st = fy_bench_workload_sharegpt(o.sharegpt, o.synth.n_requests, out, &w, err, sizeof(err));
    } else {
        char spec[512]; /* without --class: one class from --input-len / --output-len */
        if (!n_classes) {
            snprintf(spec, sizeof(spec), "%s/%s", o.input_len ? o.input_len : "128",
                     o.output_len ? o.output_len : "128");
            classes[n_classes++] = spec;
        }
        for (int i = 0; i < n_classes && !st; i++) {
            st = fy_bench_class_parse(classes[i], &o.synth.classes[i], err, sizeof(err));
            if (!st) o.synth.n_classes = i + 1;
        }
        if (!st) st = fy_bench_workload_synth(&o.synth, &w, err, sizeof(err));
    }
    if (st) {
        fprintf(stderr, "ferry-bench: %s\n", err);
        for (int i = 0; i < o.synth.n_classes; i++) fy_bench_class_free(&o.synth.classes[i]);
        return 2;
    }
    if (w->timed && o.rates[0] == 0 && o.n_rates == 1)
        fprintf(stderr, "ferry-bench: replaying %s at its own times\n", o.trace);

    fy_bench_summary_t sums[MAX_RATES];
    fy_bench_result_t *res[MAX_RATES] = {0};
    int32_t n_res[MAX_RATES];
    double *at = fy_malloc((size_t)w->n_convs * sizeof(double));
    json_t *runs = json_array();
    int n_done = 0;
    if (!at || !runs) {
        fprintf(stderr, "ferry-bench: out of memory\n");
        goto out;
    }
    rc = 0;
    for (int k = 0; k < o.n_rates && !interrupted; k++) {
        if (k > 0 && !o.trace && !o.sharegpt) {
            /* each point of a sweep its own prompts (same lengths), so none finds the
             * previous point's prompts in a prefix cache */
            fy_bench_workload_t *w2;
            fy_bench_synth_t sp = o.synth;
            sp.seed = o.synth.seed + (uint64_t)k;
            if (fy_bench_workload_synth(&sp, &w2, err, sizeof(err))) {
                fprintf(stderr, "ferry-bench: %s\n", err);
                rc = 1;
                break;
            }
            fy_bench_workload_destroy(w);
            w = w2;
        }
        fy_bench_arrivals(w, o.rates[k], o.burstiness, o.synth.seed, at);
        if ((st = fy_bench_results_create(w, &res[k]))) {
            rc = 1;
            break;
        }
        n_res[k] = w->n_reqs;
        char label[128];
        if (o.rates[k] > 0) snprintf(label, sizeof(label), "%s%s%g req/s", o.label ? o.label : "", o.label ? " " : "", o.rates[k]);
        else snprintf(label, sizeof(label), "%s%smax rate", o.label ? o.label : "", o.label ? " " : "");
        o.run.label = label;
        double dur = 0;
        st = fy_bench_run(&o.target, w, at, &o.run, res[k], &dur);
        if (st) {
            fprintf(stderr, "ferry-bench: the run could not happen: %s\n", fy_status_str(st));
            rc = 1;
            break;
        }
        if ((st = fy_bench_summarize(res[k], w->n_reqs, dur, o.rates[k], &o.slo, &sums[k]))) {
            rc = 1;
            break;
        }
        n_done = k + 1;
        fy_bench_print_summary(stdout, o.label, &sums[k], &o.slo);
        fflush(stdout);
        if (sums[k].n_ok == 0) rc = 1;
        if (o.json) {
            json_t *j = fy_bench_json_run(&sums[k], w, res[k], &o.slo);
            if (!j || json_array_append_new(runs, j)) rc = 1;
        }
    }
    if (n_done > 1) {
        printf("\n");
        fy_bench_print_sweep(stdout, sums, n_done, &o.slo);
    }
    if (interrupted) fprintf(stderr, "ferry-bench: interrupted\n");
    if (o.json && n_done) {
        json_t *root = json_config(&o, argc, argv, w);
        if (!root || json_object_set(root, "runs", runs) || json_dump_file(root, o.json, JSON_INDENT(1))) {
            fprintf(stderr, "ferry-bench: cannot write %s\n", o.json);
            rc = 1;
        } else {
            fprintf(stderr, "ferry-bench: wrote %s\n", o.json);
        }
        json_decref(root);
    }
    if (o.plot && n_done) {
        if (fy_bench_plot(o.plot, sums, res, n_res, n_done)) rc = 1;
        else fprintf(stderr, "ferry-bench: charts in %s\n", o.plot);
    }
out:
    for (int i = 0; i < o.synth.n_classes; i++) fy_bench_class_free(&o.synth.classes[i]);
    json_decref(runs);
    for (int k = 0; k < MAX_RATES; k++)
        if (res[k]) fy_bench_results_destroy(res[k], w->n_reqs);
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
    if (argc > 1 && !strcmp(argv[1], "echo")) rc = cmd_echo(argc - 1, argv + 1);
    else if (argc > 1 && !strcmp(argv[1], "auth")) rc = fy_bench_auth_main(argc - 1, argv + 1);
    else rc = cmd_load(argc, argv);
    curl_global_cleanup();
    return rc;
}

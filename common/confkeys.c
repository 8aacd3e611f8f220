/*
 * confkeys.c - the configuration schema: every key a ferry process reads
 * (router, prefill and decode workers, `ferry serve`, `ferry chaos`,
 * `ferry request`), with its type, default, allowed range and one line of
 * help; and the two renderings of it, the Markdown key reference
 * (docs/operations.md) and the effective configuration (`ferry config`).
 *
 * The defaults are written here and nowhere else: a process asks
 * fy_conf_* (config.c) for a key and gets the file's value or this
 * default.  A default is written as a file would write it, so it is
 * checked by the same parser as a file's value (tests/test_config.c
 * checks that each one parses and lies in its range).
 *
 * Not here: parsing and typed reading (config.c), the meaning of a key
 * (the code that reads it).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/config.h"
#include "common/mem.h"

#define KIB 1024.0
#define MIB (1024.0 * KIB)
#define TIB (1024.0 * 1024.0 * MIB)

/* Row makers, one per type: section, key, default, range or choices, help. */
#define STR(s, k, d, h)                                                                                                \
    {                                                                                                                  \
        s, k, FY_CONF_STRING, d, NULL, 0, 0, NULL, h, FY_PATH_NONE                                                     \
    }
/* A string that names a file or folder (kind: fy_conf_path_t): a relative
 * one is resolved against the folder of the file that sets it. */
#define PATH(s, k, d, kind, h)                                                                                         \
    {                                                                                                                  \
        s, k, FY_CONF_STRING, d, NULL, 0, 0, NULL, h, kind                                                             \
    }
#define INT(s, k, d, lo, hi, h)                                                                                        \
    {                                                                                                                  \
        s, k, FY_CONF_INT, d, NULL, lo, hi, NULL, h, FY_PATH_NONE                                                      \
    }
#define FLT(s, k, d, lo, hi, h)                                                                                        \
    {                                                                                                                  \
        s, k, FY_CONF_FLOAT, d, NULL, lo, hi, NULL, h, FY_PATH_NONE                                                    \
    }
#define BOOL(s, k, d, h)                                                                                               \
    {                                                                                                                  \
        s, k, FY_CONF_BOOL, d, NULL, 0, 0, NULL, h, FY_PATH_NONE                                                       \
    }
#define SIZE(s, k, d, lo, hi, h)                                                                                       \
    {                                                                                                                  \
        s, k, FY_CONF_SIZE, d, NULL, lo, hi, NULL, h, FY_PATH_NONE                                                     \
    }
#define DUR(s, k, d, lo, hi, h)                                                                                        \
    {                                                                                                                  \
        s, k, FY_CONF_DURATION, d, NULL, lo, hi, NULL, h, FY_PATH_NONE                                                 \
    }
#define ENUM(s, k, d, ch, h)                                                                                           \
    {                                                                                                                  \
        s, k, FY_CONF_ENUM, d, NULL, 0, 0, ch, h, FY_PATH_NONE                                                         \
    }

/* The keys both worker roles read from their own section. */
#define ROLE_KEYS(S)                                                                                                   \
    STR(S, "metrics", NULL,                                                                                            \
        "GET /metrics and /health (tcp:// or http://HOST:PORT); `ferry serve` gives worker i "                         \
        "port + i; unset or empty: none"),                                                                             \
        INT(S, "threads", "0", 0, 256, "CPU threads of the engine; 0: one per CPU it may run on (see cpus)"),          \
        STR(S, "cpus", "",                                                                                             \
            "CPUs the role's workers run on, as taskset writes them (0-3,8): prefill and decode pools on cores of "    \
            "their own; empty: any"),                                                                                  \
        SIZE(S, "kv_mem", "256MiB", MIB, TIB, "device memory for the KV cache (a draft model's share included)"),      \
        INT(S, "max_seqs", "32", 1, 1024, "sequences in the running batch at most"),                                   \
        INT(S, "max_batch_tokens", "512", 1, 65536, "tokens per forward pass at most (raised to max_seqs if below)"),  \
        INT(S, "max_waiting", "256", 0, 1 << 20, "requests queued in the engine before new ones are refused"),         \
        INT(S, "ctx", "0", 0, 1 << 20,                                                                                 \
            "longest sequence in tokens; 0: the model's trained context (a warning at start names the longest "        \
            "request kv_mem admits); a ctx that kv_mem cannot admit is refused at start; the router's door takes "     \
            "the smallest ctx of the workers up (max_model_len)"),                                                     \
        INT(S, "tp", "0", 0, 64, "tensor-parallel ranks of this role's workers; 0: worker.tp"),                        \
        INT(S, "pp", "0", 0, 64, "pipeline stages of this role's workers; 0: worker.pp")

static const fy_conf_key_t KEYS[] = {
    PATH("model", "path", FY_DEFAULT_MODEL_PATH, FY_PATH_MODEL,
         "the model: a .gguf file or a Hugging Face folder (the router loads its tokenizer, the workers all of it)"),

    {"kv", "block_size", FY_CONF_INT, "16", NULL, 8, 32, "8|16|32",
     "tokens per KV block; every process of a cluster must agree", FY_PATH_NONE},
    ENUM("kv", "dtype", "f16", "f16|f32|fp8|int8",
         "KV cache element type; fp8 (e4m3) and int8 keep a scale per token and head (about 0.53x of f16)"),
    PATH("kv", "secret_file", NULL, FY_PATH_SECRET,
         "the deployment's secret (mode 0600, 16 bytes or more): keys prefix-block names and authenticates every "
         "control-plane message; unset: `ferry serve` makes RUN_DIR/kv.secret, the router and workers refuse to start"),
    BOOL("kv", "prefix_cache", "true", "false: workers keep no prompt blocks for later requests"),
    BOOL("kv", "sliding_groups", "true",
         "sliding-window layers in KV groups of their own that give blocks back as the window moves; false: one "
         "table for all layers, every block kept (every process of a cluster must agree)"),
    ENUM("kv", "evict", "none", "none|streaming|h2o",
         "KV eviction for long contexts: streaming keeps sink and recent tokens, h2o also the heavy hitters (the "
         "blocks that got the most attention); whole blocks, at their original positions"),
    INT("kv", "sink_tokens", "64", 0, 1 << 20, "eviction: the first tokens, always kept"),
    INT("kv", "recent_tokens", "1024", 1, 1 << 20, "eviction: the last tokens, always kept"),
    INT("kv", "heavy_tokens", "512", 0, 1 << 20, "h2o: middle tokens kept by accumulated attention"),
    PATH("kv", "disk_dir", "", FY_PATH_DIR,
         "decode workers' disk tier, under their host tier (decode.host_kv_mem): an existing folder of ours or "
         "root's, not writable by others without the sticky bit; each worker makes a private file there, unlinked "
         "at once; empty: none"),
    SIZE("kv", "disk_bytes", "1GiB", 0, 1024 * TIB, "the disk tier's size, in whole blocks (with kv.disk_dir)"),

    STR("router", "listen", "tcp://127.0.0.1:7400", "the router's client address (ferry request, ferry-bench)"),
    STR("router", "events", "tcp://127.0.0.1:7401",
        "where workers push tokens, completions and load reports (the router listens, workers connect)"),
    STR("router", "http", "", "the OpenAI-compatible HTTP API and the router's /health and /metrics; empty: none"),
    PATH("router", "api_keys", "", FY_PATH_SECRET,
         "file of \"KEY TENANT [max_concurrent=N] [tokens_per_minute=N]\" lines, mode 0600; empty: no keys asked"),
    STR("router", "served_model_name", "",
        "the model's name in the HTTP API and the model_name label on every process's metrics; empty: the model "
        "file's name"),
    SIZE("router", "max_body", "1MiB", KIB, 64 * MIB, "HTTP request bodies at most; beyond it 413"),
    STR("router", "cors_origins", "",
        "origins browsers may call the HTTP API from: \"*\" or a comma-separated list (https://app.example, ...); "
        "empty: none"),
    INT("router", "default_max_tokens", "1024", 1, 1 << 20,
        "max_tokens of chat completions that give none (completions default to 16, as OpenAI's)"),
    ENUM("router", "reasoning_parser", "auto", "auto|none|deepseek_r1|qwen3",
         "how chat answers split into reasoning (reasoning_content) and content, as vLLM's parsers do: auto when the "
         "model's chat template writes `<think>` (deepseek_r1 if the rendered prompt opens `<think>`, else qwen3); "
         "none: "
         "all content"),
    DUR("router", "retry_after", "1s", 0, 3600, "the Retry-After of HTTP 503 answers"),
    DUR("router", "health_timeout", "2s", 0.05, 3600, "a worker silent this long is down"),
    DUR("router", "request_timeout", "600s", 0.1, 86400, "a request's deadline when the client gives none"),
    DUR("router", "prefill_timeout", "60s", 0.1, 3600,
        "a prefill whose worker reports no new prompt tokens for this long fails"),
    DUR("router", "command_timeout", "10s", 0.05, 3600, "a worker's answer to a command must come within this"),
    DUR("router", "breaker_cooldown", "5s", 0.05, 3600,
        "a worker that let a command time out gets no new requests for this long, then one trial request (doubling "
        "up to 16 times this while trials time out)"),
    DUR("router", "forget_after", "300s", 0.1, 86400 * 30,
        "a worker down this long with nothing of it in flight loses its slot in the router's table of 64"),
    DUR("router", "lease", "30s", 0.1, 3600,
        "how long a decode worker holds blocks for an incoming prompt; renewed while the prefill goes on"),
    DUR("router", "client_timeout", "30s", 0.5, 86400, "a client that stops polling is cancelled"),
    DUR("router", "drain_timeout", "10s", 0, 3600,
        "on SIGINT/SIGTERM running requests get this long, then end with an error; keep it below serve.stop_grace"),
    INT("router", "max_queue", "256", 0, 1 << 20, "requests waiting for placement before new ones are refused"),
    INT("router", "parse_threads", "2", 1, 64,
        "threads that parse and tokenize clients' prompts (HTTP and nng), plus one for bodies of at most 32 KiB; "
        "apart from /health and the workers' events"),
    INT("router", "parse_queue", "8", 1, 4096,
        "bodies over 32 KiB waiting for a parse thread before new ones are refused at once (HTTP 503 with "
        "Retry-After, nng overloaded); smaller ones wait up to router.max_queue"),
    INT("router", "retries", "1", 0, 10,
        "tries of a request on another worker after its prefill failed or a worker let a command time out (never "
        "after a token reached the client)"),
    INT("router", "prefill_queue_tokens", "4096", 1, 1 << 24,
        "prompt tokens queued at a prefill worker before requests wait in the router"),
    FLT("router", "prefix_weight", "1", 0, 1e6,
        "placement: weight of a prefill worker's queued tokens (in blocks) against its cached prompt blocks"),
    DUR("router", "http_header_timeout", "10s", 0.1, 3600,
        "a request's line, headers and body must arrive within this"),
    DUR("router", "http_idle_timeout", "30s", 1, 86400, "an HTTP connection where nothing moves this long is closed"),
    INT("router", "http_max_connections", "512", 1, 1 << 20,
        "HTTP connections served at once; beyond it idle ones make room, 503 when all are busy"),
    SIZE("router", "http_max_header", "16KiB", KIB, MIB, "bytes of request line and headers; beyond it 431"),
    PATH("router", "tls_cert", "", FY_PATH_FILE,
         "PEM file of the OpenAI API's certificate (then its chain): set, router.http speaks HTTPS only (needs "
         "router.tls_key); empty: plain HTTP"),
    PATH("router", "tls_key", "", FY_PATH_SECRET,
         "PEM file of router.tls_cert's private key: the owner's alone (mode 600), as the secret file"),
    ENUM("router", "tls_min_version", "1.2", "1.2|1.3",
         "the lowest TLS version router.http accepts (1.2 for clients without 1.3; 1.3 is preferred either way)"),

    INT("prefill", "count", "1", 0, 16,
        "prefill workers `ferry serve` starts; 0: colocated (the router sends whole requests to decode workers)"),
    STR("prefill", "listen", "tcp://127.0.0.1:7410",
        "a prefill worker's command address; `ferry serve` gives worker i port + i"),
    ROLE_KEYS("prefill"),

    INT("decode", "count", "1", 1, 16, "decode workers `ferry serve` starts"),
    STR("decode", "listen", "tcp://127.0.0.1:7420",
        "a decode worker's command address; `ferry serve` gives worker i port + i"),
    ROLE_KEYS("decode"),
    SIZE("decode", "host_kv_mem", "0", 0, TIB, "host memory for KV blocks swapped out by preemption; 0: none"),
    ENUM("decode", "preempt", "recompute", "recompute|swap",
         "what preemption does with a request's blocks: drop them (recompute) or move them to host memory (swap)"),
    DUR("decode", "itl_target", "0s", 0, 60,
        "p95 inter-token latency above which the prefill budget of a step shrinks; 0: off"),
    {"decode", "max_lease", FY_CONF_DURATION, NULL, "router.lease", 0.1, 3600, NULL,
     "no lease lasts longer, whatever a reserve asks", FY_PATH_NONE},
    STR("decode", "spec", "ngram",
        "speculative decoding: none, ngram, draft:MODEL_FILE or self:LAYERS (the target's first layers)"),
    INT("decode", "spec_k", "8", 1, 16, "proposed tokens per step at most; adapted per request"),
    INT("decode", "spec_ngram_max", "3", 1, 8, "longest suffix the n-gram lookup matches"),
    ENUM("decode", "spec_lookup", "suffix", "suffix|ngram",
         "how spec = ngram looks up: longest match sized by confidence (suffix), or the last n tokens (ngram)"),
    INT("decode", "spec_history", "0", 0, 1024,
        "finished requests' texts the suffix lookup keeps and searches, each for its own tenant only; 0: none"),
    FLT("decode", "spec_min_accept", "0.3", 0, 1,
        "acceptance below this turns speculation off (request, worker), probed again later"),
    INT("decode", "spec_warmup", "16", 1, 1 << 20, "proposed tokens before an acceptance rate is judged"),
    INT("decode", "spec_probe_steps", "64", 1, 1 << 20, "steps speculation stays off before a probe"),
    INT("decode", "spec_batch_tokens", "64", 0, 1 << 20, "tokens per step with proposals at most; 0: no cap"),
    BOOL("decode", "spec_cost_aware", "true",
         "proposals only while the step costs the engine measures say they raise tokens per second; false: as many "
         "as each request's controller allows, whatever the timing"),
    BOOL("decode", "spec_sampled", "false",
         "sampled requests speculate without asking (their seeds then depend on the load)"),
    FLT("decode", "spec_draft_kv_fraction", "0.25", 0.01, 0.9, "share of kv_mem a draft model's cache takes"),

    STR("worker", "name", NULL, "the worker's name in logs, metrics and the router; unset: ROLE-PID"),
    DUR("worker", "heartbeat", "200ms", 0.01, 60, "between load reports to the router"),
    DUR("worker", "stall_timeout", "10s", 0.01, 3600,
        "/health says 503 when the engine has not ticked, or the transfer thread answered no ping, for this long; a "
        "rank of the worker's group that does not arrive this long breaks the group (out of service)"),
    STR("worker", "transports", NULL, "UCX transports (UCX_TLS); unset or empty: UCX's choice"),
    STR("worker", "net_devices", NULL,
        "UCX network devices (UCX_NET_DEVICES, e.g. eth0,mlx5_0:1); unset: the listen address's interface"),
    ENUM("worker", "kv_transfer", "auto", "auto|direct|staged",
         "how KV blocks move between workers: direct (UCX reads and writes the KV pool), staged (through pinned host "
         "staging blocks, copied device-to-host and host-to-device), auto (direct for a host pool or a UCX with CUDA "
         "memory, else staged); staged is refused with worker.tp or worker.pp above 1"),
    INT("worker", "kv_staging_blocks", "0", 0, 1 << 20,
        "staged KV transfer: blocks of pinned host staging memory; 0: 64 on a prefill worker, enough for max_seqs "
        "whole-context prompts (at most 4096, at least one prompt) on a decode worker, neither more than the KV pool"),
    INT("worker", "tp", "1", 1, 64,
        "tensor-parallel ranks per worker (processes sharing one model's heads and MLP, and its KV pages); "
        "docs/parallel.md"),
    INT("worker", "pp", "1", 1, 64, "pipeline stages per worker (processes each holding a range of layers)"),
    STR("worker", "isa", NULL, "CPU kernels: auto, avx2, scalar...; unset: the best this CPU runs"),
    ENUM("worker", "attn", "f32", "f32|bf16",
         "CPU prefill attention arithmetic: f32 (the reference) or bf16 (perplexity within 1%; CPUs with avx512_bf16, "
         "elsewhere f32 with a log line; FY_CPU_ATTN overrides)"),
    ENUM("worker", "device", "cpu", "cpu|cuda", "compute device; cuda without a usable GPU warns and uses the cpu"),
    BOOL("worker", "cuda_graphs", "true",
         "cuda: decode steps as recorded CUDA graphs, one per batch-size bucket (1, 2, 4, .. max_seqs; batches "
         "padded to it); false: every kernel launched one by one"),
    DUR("worker", "http_header_timeout", "10s", 0.1, 3600, "the metrics server's router.http_header_timeout"),
    DUR("worker", "http_idle_timeout", "30s", 1, 86400, "the metrics server's router.http_idle_timeout"),
    INT("worker", "http_max_connections", "512", 1, 1 << 20, "the metrics server's router.http_max_connections"),
    SIZE("worker", "http_max_header", "16KiB", KIB, MIB, "the metrics server's router.http_max_header"),

    PATH("serve", "run_dir", "run", FY_PATH_MADE,
         "the resolved configuration (cluster.ini), the KV secret and the logs"),
    PATH("serve", "logs", NULL, FY_PATH_MADE, "each child's log file; unset: RUN_DIR/logs"),
    STR("serve", "metrics", NULL,
        "`ferry serve`'s own /health and /metrics (tcp:// or http://HOST:PORT); unset or empty: none"),
    DUR("serve", "stop_grace", "10s", 0, 3600,
        "SIGTERM: the router drains this long (router.drain_timeout), then the workers get as long"),
    DUR("serve", "health_timeout", "10s", 0, 3600,
        "a child whose /health is silent this long is killed and restarted; 0: no probes"),
    DUR("serve", "start_timeout", "120s", 1, 86400, "a child must report ready within this (model load included)"),
    DUR("serve", "restart_backoff", "500ms", 0, 3600,
        "first delay before restarting a child that exited; doubles on quick crashes"),
    DUR("serve", "restart_backoff_max", "30s", 0, 3600, "the restart delay's cap"),
    DUR("serve", "restart_window", "60s", 0.001, 86400,
        "a crash this soon after the start doubles the delay; a longer run resets it"),
    INT("serve", "max_restarts", "-1", -1, 1000, "-1: never give up; N: leave a child down after N restarts"),
    INT("serve", "routers", "1", 1, 16,
        "routers `ferry serve` starts (more than one needs cluster.etcd); router i listens on each of the router's "
        "addresses' port + 2i"),
    PATH("serve", "etcd_data", NULL, FY_PATH_MADE,
         "with cluster.etcd on this host's loopback, `ferry serve` runs etcd with its data here; unset: RUN_DIR/etcd; "
         "empty: etcd is someone else's to run"),
    BOOL("serve", "etcd_tls", "false",
         "the etcd `ferry serve` runs: TLS with a CA made in RUN_DIR/etcd-pki, --client-cert-auth (a process "
         "without a certificate of that CA cannot connect), and RBAC: users ferry-router and ferry-worker (random "
         "passwords there) with readwrite on /ferry/CLUSTER/ alone; each child gets its certificate, user and "
         "password file; needs cluster.etcd = https://127.0.0.1:PORT and /health on http at PORT + 2"),
    DUR("serve", "etcd_health_timeout", "120s", 0, 86400,
        "silence on etcd's /health before `ferry serve` restarts it (0: serve.health_timeout); longer than the "
        "others': a restart loses every lease, and routers and workers serve on through an etcd outage"),

    STR("cluster", "etcd", "",
        "etcd endpoints (http://HOST:PORT[,...]): routers and workers find each other there; empty: one router at "
        "router.events"),
    STR("cluster", "name", "ferry", "the cluster's name: its records live under /ferry/NAME/ in etcd"),
    DUR("cluster", "etcd_ttl", "3s", 2, 3600,
        "the lease on a process's record: a process that dies leaves the cluster this long after"),
    DUR("cluster", "etcd_poll", "250ms", 0.01, 60, "between reads of the membership (a watch round)"),
    STR("cluster", "router_name", NULL, "a router's name in etcd and in its messages; unset: router-HOST-PID"),
    ENUM("cluster", "encrypt", "auto", "auto|always|off",
         "whether control-plane payloads (prompts, tokens, commands, events) are encrypted on the nng sockets "
         "(XChaCha20-Poly1305 under a per-identity key): auto on every connection whose address is not loopback, "
         "always on every one, off never of its own accord; a process that encrypts a connection refuses a clear "
         "payload on it (a reply to an encrypted request is encrypted whatever this says); the same on every "
         "process. The UCX KV transfer is not covered"),
    PATH("cluster", "etcd_ca", "", FY_PATH_FILE,
         "PEM file of the CA that signed etcd's server certificate: an https:// endpoint is verified against it "
         "(required with https); empty: none"),
    PATH("cluster", "etcd_cert", "", FY_PATH_FILE,
         "PEM file of this process's client certificate, presented to etcd (with --client-cert-auth etcd lets no "
         "one without a certificate of its CA connect; the etcd user is cluster.etcd_user, and etcd 3.4's gateway "
         "refuses a certificate with a CN once auth is on); needs cluster.etcd_key and https endpoints; empty: none"),
    STR("cluster", "etcd_user", "",
        "the etcd user this process authenticates as (etcd's RBAC; its JSON gateway ignores a certificate's CN "
        "once auth is on, so a password it is); needs cluster.etcd_password_file and https endpoints; empty: none"),
    PATH("cluster", "etcd_password_file", "", FY_PATH_SECRET,
         "the file holding cluster.etcd_user's password (16 to 128 printable bytes, a final newline dropped; the "
         "owner's alone, as the secret file); empty: none"),
    PATH("cluster", "etcd_key", "", FY_PATH_SECRET,
         "PEM file of the client certificate's private key: the owner's alone (mode 600), as the secret file; "
         "empty: none"),
};

const fy_conf_key_t *fy_conf_keys(int *n_p)
{
    *n_p = (int)FY_ARRAY_LEN(KEYS);
    return KEYS;
}

const fy_conf_key_t *fy_conf_key(const char *section, const char *key)
{
    for (size_t i = 0; i < FY_ARRAY_LEN(KEYS); i++)
        if (!strcmp(KEYS[i].key, key) && !strcmp(KEYS[i].section, section)) return &KEYS[i];
    return NULL;
}

const char *fy_conf_default(const char *section, const char *key)
{
    const fy_conf_key_t *k = fy_conf_key(section, key);
    return k ? k->def : NULL;
}

int fy_conf_path_at(const char *section, const char *key, const char *value)
{
    const fy_conf_key_t *k = fy_conf_key(section, key);
    if (!k || !value || !*value) return -1;
    if (k->path != FY_PATH_NONE) return 0;
    /* the draft model of speculative decoding */
    if (!strcmp(section, "decode") && !strcmp(key, "spec") && !strncmp(value, "draft:", 6) && value[6]) return 6;
    return -1;
}

const char *fy_conf_type_str(fy_conf_type_t t)
{
    switch (t) {
    case FY_CONF_STRING: return "string";
    case FY_CONF_INT: return "int";
    case FY_CONF_FLOAT: return "float";
    case FY_CONF_BOOL: return "bool";
    case FY_CONF_SIZE: return "size";
    case FY_CONF_DURATION: return "duration";
    case FY_CONF_ENUM: return "enum";
    }
    return "?";
}

/* ---- rendering --------------------------------------------------------------------------------- */

/* 1048576 -> "1MiB": the largest binary unit that divides it. */
static void fmt_size(double b, char *out, size_t cap)
{
    static const char *const units[] = {"TiB", "GiB", "MiB", "KiB"};
    for (int i = 0; i < 4; i++) {
        double u = pow(1024.0, 4 - i);
        if (b >= u && fmod(b, u) == 0) {
            snprintf(out, cap, "%.0f%s", b / u, units[i]);
            return;
        }
    }
    snprintf(out, cap, "%.0f", b);
}

/* 3600 -> "1h", 0.05 -> "50ms", 30 -> "30s". */
static void fmt_duration(double s, char *out, size_t cap)
{
    if (s >= 3600 && fmod(s, 3600) == 0)
        snprintf(out, cap, "%gh", s / 3600);
    else if (s > 0 && s < 1)
        snprintf(out, cap, "%gms", s * 1000);
    else
        snprintf(out, cap, "%gs", s);
}

static void fmt_bound(const fy_conf_key_t *k, double v, char *out, size_t cap)
{
    if (k->type == FY_CONF_SIZE)
        fmt_size(v, out, cap);
    else if (k->type == FY_CONF_DURATION)
        fmt_duration(v, out, cap);
    else if (k->type == FY_CONF_INT)
        snprintf(out, cap, "%.0f", v);
    else
        snprintf(out, cap, "%g", v);
}

/* What values the key takes: "0 to 16", "1MiB to 1TiB", "recompute, swap". */
static void fmt_range(const fy_conf_key_t *k, char *out, size_t cap)
{
    out[0] = '\0';
    if (k->choices) {
        size_t n = 0;
        for (const char *s = k->choices; *s && n + 3 < cap; s++) {
            if (*s == '|') {
                out[n++] = ',';
                out[n++] = ' ';
            } else {
                out[n++] = *s;
            }
        }
        out[n] = '\0';
        return;
    }
    if (k->type == FY_CONF_BOOL) {
        snprintf(out, cap, "true, false");
        return;
    }
    if (k->type == FY_CONF_STRING || k->type == FY_CONF_ENUM) return;
    char lo[32], hi[32];
    fmt_bound(k, k->lo, lo, sizeof(lo));
    fmt_bound(k, k->hi, hi, sizeof(hi));
    snprintf(out, cap, "%s to %s", lo, hi);
}

void fy_conf_markdown(FILE *f)
{
    const char *section = "";
    for (size_t i = 0; i < FY_ARRAY_LEN(KEYS); i++) {
        const fy_conf_key_t *k = &KEYS[i];
        if (strcmp(k->section, section)) {
            section = k->section;
            fprintf(f, "%s### [%s]\n\n| key | type | default | range | meaning |\n|---|---|---|---|---|\n",
                    i ? "\n" : "", section);
        }
        char range[128], def[160];
        fmt_range(k, range, sizeof(range));
        if (k->def_from)
            snprintf(def, sizeof(def), "`%s`", k->def_from);
        else if (!k->def)
            snprintf(def, sizeof(def), "unset");
        else if (!*k->def)
            snprintf(def, sizeof(def), "empty");
        else
            snprintf(def, sizeof(def), "`%s`", k->def);
        /* "path": a relative one is resolved against its file's folder (docs/operations.md) */
        fprintf(f, "| `%s.%s` | %s | %s | %s | %s |\n", k->section, k->key,
                k->path != FY_PATH_NONE ? "path" : fy_conf_type_str(k->type), def, range, k->help);
    }
}

void fy_conf_print(const fy_config_t *c, FILE *f)
{
    const char *section = "";
    fprintf(f, "; the effective configuration: every key, its value in force and where it came from\n");
    for (size_t i = 0; i < FY_ARRAY_LEN(KEYS); i++) {
        const fy_conf_key_t *k = &KEYS[i];
        if (strcmp(k->section, section)) {
            section = k->section;
            fprintf(f, "\n[%s]\n", section);
        }
        const char *v = c ? fy_config_get(c, k->section, k->key) : NULL, *origin = "default";
        char from[96];
        if (v) {
            origin = fy_config_origin(c, k->section, k->key);
        } else if (k->def_from) {
            char sec[FY_CONFIG_MAX_SECTION + 1];
            const char *dot = strchr(k->def_from, '.');
            snprintf(sec, sizeof(sec), "%.*s", (int)(dot - k->def_from), k->def_from);
            const fy_conf_key_t *o = fy_conf_key(sec, dot + 1);
            v = c ? fy_config_get(c, sec, dot + 1) : NULL;
            if (!v && o) v = o->def;
            snprintf(from, sizeof(from), "default: %s", k->def_from);
            origin = from;
        } else {
            v = k->def;
        }
        char line[FY_CONFIG_MAX_LINE + 8], note[160];
        bool tight = v && strlen(k->key) + 3 + strlen(v) > FY_CONFIG_MAX_LINE; /* as fy_config_write */
        if (v)
            snprintf(line, sizeof(line), "%s%s=%s%s", k->key, tight ? "" : " ",
                     v[0] == ';' || !v[0] || tight ? "" : " ", v);
        else
            snprintf(line, sizeof(line), "; %s =", k->key);
        snprintf(note, sizeof(note), "%s%s%s", v ? "" : "unset (", origin, v ? "" : ")");
        /* the origin after the value where the line stays readable back, else on a line of its own */
        if ((strlen(line) < 40 ? 40 : strlen(line)) + 3 + strlen(note) <= FY_CONFIG_MAX_LINE)
            fprintf(f, "%-40s ; %s\n", line, note);
        else
            fprintf(f, "; %s: %s\n%s\n", k->key, note, line);
    }
}

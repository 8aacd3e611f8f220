/*
 * workload.h - what ferry-bench sends: the requests (prompt text, prompt
 * and output lengths) and when (arrival times), all drawn from a seed
 * before the run, so two runs with the same arguments send the same
 * bytes at the same offsets.
 *
 * Synthetic prompts are words from a fixed list of 256 common English
 * words, each one token with its leading space in GPT-2-style byte BPE
 * vocabularies (checked for SmolLM2: 256 words, 256 tokens), so a prompt
 * of N words is N tokens there and is also plain text any OpenAI server
 * accepts.  Servers report the prompt tokens they counted; the report
 * uses those where it has them.
 *
 * Not here: sending (run.h) and statistics (report.h).
 */
#ifndef FY_BENCH_WORKLOAD_H
#define FY_BENCH_WORKLOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* ---- random numbers (splitmix64: small, seedable, good enough here) ---- */

typedef struct fy_bench_rng {
    uint64_t s;
} fy_bench_rng_t;

void fy_bench_rng_seed(fy_bench_rng_t *r, uint64_t seed, uint64_t stream);

/* ---- lengths: "N", "LO-HI" (uniform, inclusive) or "@FILE" ---- */

typedef enum fy_bench_len_kind {
    FY_BENCH_LEN_FIXED = 0,
    FY_BENCH_LEN_UNIFORM,
    FY_BENCH_LEN_EMPIRICAL, /* a file: one "VALUE [WEIGHT]" a line, '#' comments */
} fy_bench_len_kind_t;

typedef struct fy_bench_len {
    fy_bench_len_kind_t kind;
    int32_t lo, hi;
    int32_t n;     /* empirical: values */
    int32_t *vals; /* [n] */
    double *cum;   /* [n] cumulative weights, the last one 1 */
} fy_bench_len_t;

/* Lengths are 1 to FY_BENCH_MAX_LEN.  On error err says why (the file
 * and line for a distribution file). */
#define FY_BENCH_MAX_LEN 1000000
fy_status_t fy_bench_len_parse(const char *spec, fy_bench_len_t *l, char *err, size_t cap);
void fy_bench_len_free(fy_bench_len_t *l);
int32_t fy_bench_len_draw(const fy_bench_len_t *l, fy_bench_rng_t *r);

/* A request class: "IN/OUT[/WEIGHT]", e.g. "480-544/16/1". */
typedef struct fy_bench_class {
    fy_bench_len_t in, out;
    double weight;
} fy_bench_class_t;

fy_status_t fy_bench_class_parse(const char *spec, fy_bench_class_t *c, char *err, size_t cap);
void fy_bench_class_free(fy_bench_class_t *c);

/* ---- the workload ---- */

typedef struct fy_bench_req {
    char *text; /* the prompt, or in a conversation this turn's new user text */
    size_t text_len;
    int32_t n_in;  /* prompt tokens it stands for (words; bytes/4 for given text) */
    int32_t n_out; /* max_tokens */
    int32_t group; /* shared-prefix group, -1 for none */
    int32_t conv, turn;
} fy_bench_req_t;

/* A conversation: n_turns requests from reqs[first] on, each sent when
 * the previous one ended plus the think time, its prompt the whole
 * history (earlier prompts and answers) and then its own text.  A
 * single request is a conversation of one turn. */
typedef struct fy_bench_conv {
    double at_s; /* from a trace; -1 when the arrival process decides */
    int32_t first, n_turns;
} fy_bench_conv_t;

typedef struct fy_bench_workload {
    fy_bench_req_t *reqs;
    int32_t n_reqs;
    fy_bench_conv_t *convs;
    int32_t n_convs;
    double think_s;
    bool timed; /* convs carry arrival times */
} fy_bench_workload_t;

#define FY_BENCH_MAX_CLASSES 8

typedef struct fy_bench_synth {
    int32_t n_requests;
    int32_t n_classes; /* at least 1 */
    fy_bench_class_t classes[FY_BENCH_MAX_CLASSES];
    int32_t prefix_groups; /* 0: no shared prefix */
    int32_t prefix_len;    /* tokens of each group's prefix, before the request's own n_in */
    int32_t turns;         /* 1: single requests */
    double think_s;
    uint64_t seed;
} fy_bench_synth_t;

/* Synthetic requests; requests are placed in prefix groups round robin. */
fy_status_t fy_bench_workload_synth(const fy_bench_synth_t *p, fy_bench_workload_t **w_p, char *err, size_t cap);

typedef struct fy_bench_trace_opts {
    int32_t max_requests; /* 0: every line */
    int32_t block_tokens; /* tokens per hash id (Mooncake traces: 512) */
    double time_scale;    /* arrival times are multiplied by it (0.5: twice as fast) */
    uint64_t seed;
} fy_bench_trace_opts_t;

/*
 * A JSONL trace, one request a line:
 *   arrival: "timestamp" (milliseconds, as Mooncake's traces) or "arrival_s" (seconds)
 *   prompt:  "prompt" (text) or "input_length" / "input_len" / "prompt_len" (tokens),
 *            with optional "hash_ids" ([int]: blocks of block_tokens shared by every line naming the id)
 *   output:  "output_length" / "output_len" / "max_tokens"
 * Blank lines are skipped; anything else wrong is an error naming the line.
 */
fy_status_t fy_bench_workload_trace(const char *path, const fy_bench_trace_opts_t *o, fy_bench_workload_t **w_p,
                                    char *err, size_t cap);

/* A ShareGPT file (a JSON array of {conversations: [{from, value}]}):
 * the first human turn is the prompt; the output length is out_len, or
 * when 0 the first reply's bytes / 4 (no tokenizer here), at least 1. */
fy_status_t fy_bench_workload_sharegpt(const char *path, int32_t max_requests, int32_t out_len,
                                       fy_bench_workload_t **w_p, char *err, size_t cap);

void fy_bench_workload_destroy(fy_bench_workload_t *w); /* accepts NULL */

/* Arrival time of each conversation (at[n_convs], seconds from the start,
 * non-decreasing): rate > 0: gamma inter-arrival times with shape
 * burstiness (1: Poisson) and mean 1/rate; rate == 0: the trace's times
 * when it has them, else all at 0 (closed loop: the concurrency limit
 * paces them). */
void fy_bench_arrivals(const fy_bench_workload_t *w, double rate, double burstiness, uint64_t seed, double *at);
/* Whether a run of w at rate is a closed loop: rate 0 and no trace times,
 * every request due at once and sent as a slot frees (no schedule). */
bool fy_bench_closed_loop(const fy_bench_workload_t *w, double rate);

/* The word list (exposed for the tests and the echo server). */
#define FY_BENCH_N_WORDS 256
const char *fy_bench_word(int32_t i);

#endif /* FY_BENCH_WORKLOAD_H */

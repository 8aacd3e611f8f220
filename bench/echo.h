/*
 * echo.h - a trivial server for ferry-bench to load: it speaks the
 * router's nng protocol (generate, poll, cancel, status) and the OpenAI
 * HTTP API (/v1/completions and /v1/chat/completions, streaming or not),
 * and answers every request with max_tokens words, at once or paced
 * (first token after ttft_s, then one every itl_s).  It does no
 * inference: it is what the harness's own tests run against, and the
 * ceiling measurement (how fast the harness itself can go).
 *
 * HTTP listens on 127.0.0.1 only.  Not a model of a real server's
 * behaviour beyond the wire formats.
 */
#ifndef FY_BENCH_ECHO_H
#define FY_BENCH_ECHO_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"

typedef struct fy_bench_echo_params {
    const char *nng_url;     /* NULL: no nng side */
    const char *secret_file; /* nng: the deployment's secret its clients hold (required with nng_url) */
    bool http;               /* serve HTTP */
    int http_port;           /* 0: any free port */
    double ttft_s, itl_s;    /* pacing; 0 and 0: every token at once */
    int32_t fail_every;      /* every N-th request refused (overloaded / HTTP 429); 0: never */
    const char *api_key;     /* HTTP: require Authorization: Bearer KEY; NULL: none (copied) */
    int threads;             /* HTTP: polling threads when unpaced (0: 1) */
} fy_bench_echo_params_t;

typedef struct fy_bench_echo fy_bench_echo_t;

fy_status_t fy_bench_echo_create(const fy_bench_echo_params_t *p, fy_bench_echo_t **e_p);
void fy_bench_echo_destroy(fy_bench_echo_t *e); /* accepts NULL */
int fy_bench_echo_http_port(const fy_bench_echo_t *e);
/* Requests accepted (not refused) so far, both protocols. */
uint64_t fy_bench_echo_served(const fy_bench_echo_t *e);
uint64_t fy_bench_echo_refused(const fy_bench_echo_t *e);

#endif /* FY_BENCH_ECHO_H */

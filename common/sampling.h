/*
 * sampling.h - a request's sampling parameters: the type every layer
 * passes along (HTTP parsing, the wire's generation parameters, the
 * engine), their defaults and their checks.
 *
 * Not here: the sampler that applies them to logits (engine/sampler.c).
 */
#ifndef FY_SAMPLING_H
#define FY_SAMPLING_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"

/* Temperatures below this are greedy (vLLM's _SAMPLING_EPS): 1/t of a
 * tiny temperature overflows, and the distribution it would give is the
 * argmax anyway. */
#define FY_SAMPLING_MIN_TEMP 1e-5f
/* The lowest log-probability reported (the wire's range starts there). */
#define FY_LOGPROB_MIN -1e30f

typedef struct fy_sampling_params {
    float temperature; /* below FY_SAMPLING_MIN_TEMP (0 included): greedy */
    int32_t top_k;     /* 0: off */
    float top_p;       /* 1: off */
    float min_p;       /* 0: off; drop tokens below min_p * p(best) */
    uint64_t seed;
} fy_sampling_params_t;

void fy_sampling_params_default(fy_sampling_params_t *p); /* greedy */
/* Range checks; logs the offending field. */
fy_status_t fy_sampling_params_check(const fy_sampling_params_t *p);

/* Greedy parameters: temperature below FY_SAMPLING_MIN_TEMP, or top_k 1. */
bool fy_sampling_is_greedy(const fy_sampling_params_t *p);

#endif /* FY_SAMPLING_H */

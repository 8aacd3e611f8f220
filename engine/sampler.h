/*
 * sampler.h - turning logits into the next token: greedy, temperature,
 * top-k, top-p, min-p, with a per-request seeded generator.
 *
 * A seeded request draws only from its own generator, and the candidate
 * order is fixed (by logit, ties by token id), so it produces the same
 * tokens whatever runs beside it.  The sampler's scratch space is
 * allocated once at creation.
 */
#ifndef FY_SAMPLER_H
#define FY_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/sampling.h"
#include "common/status.h"

/* xoshiro256** seeded through splitmix64. */
typedef struct fy_rng {
    uint64_t s[4];
} fy_rng_t;

void fy_rng_seed(fy_rng_t *rng, uint64_t seed);
uint64_t fy_rng_next(fy_rng_t *rng);
double fy_rng_uniform(fy_rng_t *rng); /* [0, 1) */

typedef struct fy_sampler fy_sampler_t;

fy_status_t fy_sampler_create(int32_t vocab_size, fy_sampler_t **s_p);
void fy_sampler_destroy(fy_sampler_t *s); /* accepts NULL */

/* Picks a token from logits [vocab_size] (not modified).  logprob_p, if
 * not NULL, receives the log-probability of the pick under the
 * temperature-scaled full distribution (0 for greedy... it is computed
 * from the raw logits then). */
int32_t fy_sampler_sample(fy_sampler_t *s, const fy_sampling_params_t *p, fy_rng_t *rng, const float *logits,
                          float *logprob_p);

/* The distribution fy_sampler_sample draws from, as probabilities over
 * the whole vocabulary (zero outside the kept candidates; a point mass on
 * the argmax for greedy parameters): probs [vocab_size].  What
 * speculative decoding's rejection sampler compares draft and target by. */
void fy_sampler_probs(fy_sampler_t *s, const fy_sampling_params_t *p, const float *logits, float *probs);

/* log-probability of id under the temperature-scaled full distribution
 * (what fy_sampler_sample reports in *logprob_p). */
float fy_logprob(const float *logits, int32_t n, const fy_sampling_params_t *p, int32_t id);

/* Index of the largest logit (lowest id on ties). */
int32_t fy_argmax(const float *logits, int32_t n);

#endif /* FY_SAMPLER_H */

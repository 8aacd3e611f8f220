/*
 * exact.h - an exact forward pass, to measure ferry's numerical error
 * against (`ferry bench-prec`, tests/test_model.c).
 *
 * A double-precision forward pass over a model's own weights as its file
 * holds them (each matrix dequantized exactly to f32, every product and sum
 * in double): RMSNorm, projections and biases, Q/K norms, rope with double
 * angles, causal attention (the layer's window) with an exact softmax over
 * unrounded K and V, the gated MLP, post-norms, the final norm and the
 * output head, for any architecture model.h describes.  It is written from
 * the model's description, not from the kernels, and runs layer after
 * layer over all the tokens at once (no KV cache).  Cost: about 2 x the
 * parameters double multiply-adds per token (SmolLM2-135M: about 0.2 s per
 * token on one core).  Any thread; allocates as it goes.
 */
#ifndef FY_EXACT_H
#define FY_EXACT_H

#include <stdbool.h>
#include <stdint.h>

#include "model/model.h"

/* tok[0..n) at positions 0..n-1 on n_threads threads: the residual stream
 * after each layer's attention (tap_attn) and after its MLP (tap_mlp),
 * [n_layers][n][dim] each (either may be NULL), and the logits [n][vocab],
 * all rounded to float at the end.  False when out of memory (logged). */
bool fy_exact_forward(const fy_model_t *m, int n_threads, const int32_t *tok, int64_t n, float *tap_attn,
                      float *tap_mlp, float *logits);

/* KL(p_ref || p) in nats of the next-token distributions of two logit
 * rows, in double. */
double fy_exact_kl(const float *ref, const float *got, int32_t vocab);
/* log p(y) of a logit row, in double. */
double fy_exact_log_prob(const float *logits, int32_t vocab, int32_t y);
/* ||a - b|| / ||b|| over n values, in double. */
double fy_exact_rel_err(const float *a, const float *b, size_t n);

#endif /* FY_EXACT_H */

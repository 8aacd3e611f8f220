/*
 * rope.h - rotary position embedding: its two conventions and the
 * parameters of one layer's rotation.  Shared by the model (which knows
 * which convention its weights use and each layer's base and scaling) and
 * the kernels (which apply it).
 *
 * Not here: the per-batch angle tables (the backends keep their own).
 */
#ifndef FY_ROPE_H
#define FY_ROPE_H

#include <math.h>
#include <stdint.h>

typedef enum fy_rope_style {
    FY_ROPE_NORM = 0, /* rotate adjacent pairs (x[2i], x[2i+1]): GGUF llama, whose Q/K rows are permuted */
    FY_ROPE_NEOX,     /* rotate halves (x[i], x[i + d/2]): Hugging Face, and GGUF qwen2, qwen3, gemma3 */
} fy_rope_style_t;

/*
 * One layer's rotation.  Pair i of a head of d dimensions turns by
 * pos * inv_freq(i), inv_freq(i) = theta^(-2i/d) * freq_scale / freq_factors[i]:
 * freq_scale < 1 is linear position interpolation (rope_scaling "linear",
 * factor = 1 / freq_scale), freq_factors the per-frequency divisors of
 * Llama 3's scaling (GGUF's rope_freqs tensor, or computed from
 * config.json's rope_scaling "llama3").
 */
typedef struct fy_rope {
    fy_rope_style_t style;
    float theta;               /* base */
    float freq_scale;          /* 1: no linear scaling */
    const float *freq_factors; /* [d / 2] host memory, or NULL (all 1) */
} fy_rope_t;

/* inv_freq(i) in double; with freq_scale 1 and no factors exactly
 * theta^(-2i/d), so unscaled layers keep the bits they always had. */
static inline double fy_rope_inv_freq(const fy_rope_t *r, int32_t i, int32_t d)
{
    double f = pow((double)r->theta, -2.0 * i / d);
    if (r->freq_scale != 1.0f) f *= (double)r->freq_scale;
    if (r->freq_factors) f /= (double)r->freq_factors[i];
    return f;
}

/* Do a and b turn every pair by the same angle (style aside)? */
static inline int fy_rope_same_angles(const fy_rope_t *a, const fy_rope_t *b)
{
    return a->theta == b->theta && a->freq_scale == b->freq_scale && a->freq_factors == b->freq_factors;
}

#endif /* FY_ROPE_H */

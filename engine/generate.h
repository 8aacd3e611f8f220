/*
 * generate.h - one request from prompt to finished text, on the serving
 * engine with a batch of one: chunked prefill (reusing the prefix cache),
 * then decoding that samples, detokenizes as a stream and stops on end of
 * turn, a stop string or max_tokens.  The path of `ferry generate` and of
 * many tests.  Every block is released before fy_generate returns.
 */
#ifndef FY_GENERATE_H
#define FY_GENERATE_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"
#include "kv/kv.h"
#include "engine/runner.h"
#include "engine/sampler.h"
#include "common/status.h"
#include "model/tokenizer.h"

typedef struct fy_gen_params {
    fy_genspec_t gen;      /* the request (sampling, max_tokens, stop strings, ...): the serving path's type */
    const fy_kv_ns_t *ns;  /* prefix-cache namespace (the tenant's); NULL: the zero namespace */
    int32_t prefill_chunk; /* prompt tokens per forward; 0: the runner's batch size */
    fy_spec_params_t spec; /* speculative decoding (default none); the runner needs
                            * max_logits >= spec.k_max + 1 to use it fully */
} fy_gen_params_t;

void fy_gen_params_default(fy_gen_params_t *p);

typedef struct fy_gen_stats {
    int32_t n_prompt;
    int32_t n_generated;
    int32_t n_cached; /* prompt tokens found in the prefix cache */
    double prefill_s; /* prompt processing up to the first token's logits */
    double decode_s;  /* everything after */
    fy_finish_reason_t finish;
    /* speculative decoding: proposed and accepted tokens, verification
     * steps, seconds spent proposing */
    int32_t spec_proposed, spec_accepted, spec_steps;
    double propose_s;
} fy_gen_stats_t;

/* Receives text as it becomes final; return false to stop generating. */
typedef bool (*fy_gen_text_fn)(void *arg, const char *text, size_t len);

/*
 * Generates from prompt[n_prompt], reusing cached prefix blocks of kvm.
 * out_tokens (may be NULL) receives up to max_out generated ids.  Returns
 * FY_ERR_NO_SPACE when the pool cannot hold the prompt, FY_ERR_INVALID for
 * bad input; on every path all blocks are released (named full blocks stay
 * in the prefix cache).
 */
fy_status_t fy_generate(fy_runner_t *runner, fy_kvm_t *kvm, const fy_tokenizer_t *tok, const int32_t *prompt,
                        int32_t n_prompt, const fy_gen_params_t *params, fy_gen_text_fn on_text, void *arg,
                        int32_t *out_tokens, int32_t max_out, fy_gen_stats_t *stats_p);

#endif /* FY_GENERATE_H */

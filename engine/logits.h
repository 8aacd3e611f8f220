/*
 * logits.h - what a request does to its logits before the sampler sees
 * them (vLLM's definitions), and the top alternatives it reports.
 *
 *   repetition penalty r (1: off): every token of the prompt or the output
 *       so far has its logit divided by r when positive, multiplied when
 *       not (CTRL's rule, as vLLM and llama.cpp apply it);
 *   frequency penalty f, presence penalty p (0: off): a token generated c
 *       times so far loses f * c + p * (c > 0) (OpenAI's rule, over the
 *       output only);
 *   logit bias: added to the token's logit; -100 (or less) bans it;
 *   min_tokens: until that many tokens are out, the end-of-generation
 *       tokens and the stop token ids cannot be drawn;
 *   bad words (vLLM's NoBadWordsLogitsProcessor): token sequences the
 *       output must not contain: a one-token sequence is always banned,
 *       a longer one's last token is banned whenever the output so far
 *       ends with all its other tokens;
 *   allowed token ids (vLLM's allowed_token_ids): every other token is
 *       banned.
 *
 * The order is vLLM's: the allowed tokens, the bias and the minimum length
 * first, then the penalties, then the bad words.  Cost: one pass over the
 * request's tokens per step (counts in a scratch array of the
 * vocabulary's size, reset afterwards), plus the bias entries and the bad
 * words' tokens; a pass over the vocabulary only with allowed tokens.
 *
 * Not here: drawing the token (sampler.h), stop strings (stop.h), the
 * engine's bookkeeping of which requests process their logits (engine.c).
 */
#ifndef FY_LOGITS_H
#define FY_LOGITS_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"

#define FY_LOGITS_MAX_BIAS 300    /* bias entries a request may give */
#define FY_LOGITS_MAX_STOP_IDS 16 /* stop token ids */
#define FY_LOGITS_MAX_TOP 20      /* alternatives reported per token */
#define FY_LOGITS_MAX_BAD 64      /* bad word sequences */
#define FY_LOGITS_MAX_BAD_IDS 512 /* their tokens in all */

typedef struct fy_logits_params {
    const int32_t *allowed_ids; /* [n_allowed] the only tokens that may be drawn; n_allowed 0: every token */
    int32_t n_allowed;
    float presence_penalty, frequency_penalty; /* 0: off */
    float repetition_penalty;                  /* 1: off; above 0 */
    const int32_t *bias_ids;                   /* [n_bias] token ids */
    const float *bias;                         /* [n_bias] added to their logits; <= -100: banned */
    int32_t n_bias;
    int32_t min_tokens;      /* end tokens (eog and stop_ids) banned while fewer are out */
    const int32_t *stop_ids; /* [n_stop_ids] tokens that end a request (banned under min_tokens) */
    int32_t n_stop_ids;
    const int32_t *bad_lens; /* [n_bad] each bad word's tokens, at least 1 */
    const int32_t *bad_ids;  /* [sum of bad_lens] the sequences, one after another */
    int32_t n_bad;
} fy_logits_params_t;

/* Whether p changes anything (a default p is off: repetition 1, the rest 0). */
bool fy_logits_active(const fy_logits_params_t *p);

/* Per-engine scratch: one counter per vocabulary entry, all zero between calls. */
typedef struct fy_logits_scratch {
    int32_t *count; /* [vocab] */
    int32_t vocab;
} fy_logits_scratch_t;

fy_status_t fy_logits_scratch_init(fy_logits_scratch_t *s, int32_t vocab);
void fy_logits_scratch_deinit(fy_logits_scratch_t *s);

/*
 * Applies p to one row of logits [s->vocab] of a sequence whose tokens
 * are tokens[0..n_total), the first n_prompt its prompt; eog[n_eog] are
 * the model's end-of-generation tokens (banned with the stop ids while
 * fewer than min_tokens are out).  Token ids out of the vocabulary are
 * skipped (the engine refuses them at submission).
 */
void fy_logits_apply(const fy_logits_params_t *p, fy_logits_scratch_t *s, const int32_t *tokens, int32_t n_prompt,
                     int32_t n_total, const int32_t *eog, int32_t n_eog, float *logits);

/*
 * A prompt token's log-probability under a raw row of logits [vocab]
 * (temperature 1, no processing: vLLM's prompt logprobs), and its rank
 * (1 + the tokens strictly more likely); with k > 0 also the row's k most
 * likely tokens into ids and logprobs (as fy_logits_top at temperature 1),
 * from the same normaliser: one exponential per vocabulary entry.
 */
float fy_logits_token_logprob(const float *logits, int32_t vocab, int32_t token, int32_t k, int32_t *ids,
                              float *logprobs, int32_t *rank_p);

/*
 * The k most likely tokens of a row under the temperature-scaled
 * distribution (temperature below the sampler's minimum: 1, as
 * fy_logprob): ids and log-probabilities, most likely first, ties by
 * lower id.  k at most 64; returns how many were written (k, or the
 * vocabulary if smaller).
 */
int32_t fy_logits_top(const float *logits, int32_t vocab, float temperature, int32_t k, int32_t *ids, float *logprobs);

#endif /* FY_LOGITS_H */

/*
 * spec.h - speculative decoding's parts that the engine drives: the
 * proposers (n-gram lookup in the request's own text, and a draft model
 * with its own paged KV), the verification rules (greedy prefix match,
 * rejection sampling), and the adaptive controller that sets how many
 * tokens a request proposes and turns speculation off when it does not
 * pay.
 *
 * The engine owns the step: it asks for proposals, runs the target over
 * the k proposed tokens plus one in the same forward pass as the other
 * sequences' decode tokens, verifies, and rolls the KV of rejected tokens
 * back.  This module holds no request state beyond what its functions
 * take, and allocates nothing except in fy_spec_draft_open.
 * docs/speculative.md gives the design and the figures.
 */
#ifndef FY_SPEC_H
#define FY_SPEC_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "common/genspec.h"
#include "kv/kv.h"
#include "model/model.h"
#include "engine/runner.h"
#include "engine/sampler.h"
#include "common/status.h"

#define FY_SPEC_MAX_K 16 /* proposed tokens per step at most */
#define FY_SPEC_MAX_NGRAM 8
#define FY_SPEC_SUFFIX_MATCH 32 /* longest suffix the suffix lookup matches */
#define FY_SPEC_SUFFIX_CANDS 64 /* occurrences of the matched suffix it weighs at most */

/* fy_spec_method_t (none, ngram, draft, or a request's default) is in
 * genspec.h: a request names it on the wire. */

/* How the ngram method looks tokens up (decode.spec_lookup). */
typedef enum fy_spec_lookup {
    FY_SPEC_LOOKUP_SUFFIX, /* longest match, most frequent continuation, confidence-sized (issue 19) */
    FY_SPEC_LOOKUP_NGRAM,  /* last n tokens, most recent occurrence, rate-sized (issue 8) */
} fy_spec_lookup_t;

typedef struct fy_spec_params {
    fy_spec_method_t method; /* the deployment's proposer: none, ngram or draft */
    fy_spec_lookup_t lookup; /* the ngram method's lookup */
    /* suffix lookup: finished requests' texts kept per tenant (KV
     * namespace) and proposed from, for requests of that tenant only;
     * 0: a request's own text only */
    int32_t history;
    int32_t k_max;       /* proposed tokens per step at most, 1..FY_SPEC_MAX_K */
    int32_t ngram_max;   /* longest suffix matched, 1..FY_SPEC_MAX_NGRAM (matching tries n = max .. 1) */
    double min_accept;   /* acceptance rate below which speculation turns off (request or worker), 0..1 */
    int32_t warmup;      /* proposed tokens before a rate is judged */
    int32_t probe_steps; /* decode steps speculation stays off before it is tried again */
    /* tokens per step (decodes plus proposals) up to which a verification
     * step costs about what a plain decode step costs: proposals are cut
     * to fit, so a batch large enough to be compute-bound speculates
     * little or not at all; 0: no limit */
    int32_t batch_tokens;
    /* hand out proposal tokens only while they raise the expected tokens
     * per second of the step, by the step costs the engine measures (what
     * makes compute-bound batches back off); false: every request that
     * speculates proposes what its controller allows (timing-independent,
     * for tests) */
    bool cost_aware;
    /* speculate for sampled requests that do not ask for it themselves:
     * their text is then distributed as the target's, but which tokens a
     * seed gives depends on when speculation ran, so on what ran beside
     * them; off, a seeded request gives the same tokens whatever the load */
    bool sampled;
    /* FY_SPEC_DRAFT: the draft's runner and block manager (fy_spec_draft_open);
     * they must outlive the engine */
    fy_runner_t *draft;
    fy_kvm_t *draft_kvm;
} fy_spec_params_t;

/* none, suffix lookup without history; k_max 8, ngram_max 3, min_accept 0.3, warmup 16, probe_steps 64,
 * batch_tokens 64, cost_aware, sampled false (docs/speculative.md says why) */
void fy_spec_params_default(fy_spec_params_t *p);
/* Range checks, and a draft for FY_SPEC_DRAFT; logs the offending field. */
fy_status_t fy_spec_params_check(const fy_spec_params_t *p);

/* ---- proposers ---- */

/*
 * N-gram proposal: finds the most recent earlier occurrence of the last n
 * tokens of tokens[n_tokens] (n from ngram_max down to 1, the first n that
 * matches wins) and copies up to k of the tokens that followed it into
 * out.  Returns how many (0: no match).
 */
int32_t fy_spec_ngram_propose(const int32_t *tokens, int32_t n_tokens, int32_t ngram_max, int32_t k, int32_t *out);

/*
 * Suffix lookup (after SuffixDecoding, Oliaro et al. 2024): the longest
 * suffix of tokens[n_tokens] (up to FY_SPEC_SUFFIX_MATCH tokens) that
 * occurs earlier in that text or in any of the n_src other texts, then,
 * over those occurrences (the FY_SPEC_SUFFIX_CANDS first in the order:
 * the request's own text from its end backwards, then src[0], src[1],
 * .. each from its end backwards), the continuation a suffix tree's walk
 * from the match would take: at each position the token most of the
 * still-live occurrences continue with (a tie goes to the earliest
 * occurrence in that order), keeping only the occurrences that agree.
 * Up to k tokens go to out; freq[i] (may be NULL) gets the share of the
 * live occurrences that continued with out[i].  *match_p (may be NULL):
 * the matched length (0: none); *own_p (may be NULL): whether the
 * request's own text holds an occurrence of that match.  Returns how many tokens were proposed.
 * Costs one pass over the texts, no allocation.
 */
typedef struct fy_spec_text {
    const int32_t *tokens;
    int32_t n;
} fy_spec_text_t;

int32_t fy_spec_suffix_propose(const int32_t *tokens, int32_t n_tokens, const fy_spec_text_t *src, int32_t n_src,
                               int32_t k, int32_t *out, float *freq, int32_t *match_p, bool *own_p);

/*
 * A request's estimate of how likely a suffix proposal's tokens are to be
 * accepted: the first token's rate by the matched length (1, 2-3, 4-7,
 * 8+: a one-token match is a guess, a long one a copy) and by where the
 * match is (the request's own text, or only other texts), and one rate for
 * every later token (copies run on or break at an edit), each a ratio of
 * decayed counts from a prior.  What the engine sizes proposals by,
 * instead of one rate to the power of the position.
 */
typedef struct fy_spec_est {
    float first_ok[8], first_n[8]; /* [own text: 0-3, other texts only: 4-7] */
    float next_ok, next_n;
} fy_spec_est_t;

void fy_spec_est_init(fy_spec_est_t *s);
/* gain[i]: the probability that tokens 0..i are all accepted */
void fy_spec_est_gains(const fy_spec_est_t *s, int32_t match, bool own, const float *freq, int32_t n, float *gain);
/* After a verification: `accepted` of `proposed` tokens matched at `match`. */
void fy_spec_est_note(fy_spec_est_t *s, int32_t match, bool own, int32_t proposed, int32_t accepted);

/*
 * Recent finished requests' texts per tenant, for the suffix lookup: a
 * fixed arena of n_texts slots of at most max_tokens tokens each (the
 * tail of a longer text), reused oldest first.  A tenant is a KV
 * namespace digest: fy_spec_hist_texts gives only that tenant's texts, so
 * a proposal never carries another tenant's tokens.  Engine thread only.
 */
typedef struct fy_spec_hist fy_spec_hist_t;

fy_status_t fy_spec_hist_create(int32_t n_texts, int32_t max_tokens, fy_spec_hist_t **h_p);
void fy_spec_hist_destroy(fy_spec_hist_t *h); /* accepts NULL */
void fy_spec_hist_add(fy_spec_hist_t *h, const fy_kv_ns_t *tenant, const int32_t *tokens, int32_t n);
/* Up to max of the tenant's texts, newest first, into out (valid until the
 * next fy_spec_hist_add); returns how many. */
int32_t fy_spec_hist_texts(const fy_spec_hist_t *h, const fy_kv_ns_t *tenant, fy_spec_text_t *out, int32_t max);

/* ---- verification ---- */

/*
 * Greedy verification is the engine's: accept the draft while it equals
 * the target's argmax.  Sampled verification (Leviathan et al. 2023,
 * Chen et al. 2023): for i = 0 .. k-1, draft[i] is accepted with
 * probability min(1, p_i(x) / q_i(x)); the first rejection draws the
 * replacement from max(0, p_i - q_i) normalized; when all k are accepted
 * the last token is drawn from p_k.  The accepted tokens are then
 * distributed exactly as the target's own samples.
 *
 * p: k + 1 rows of target probabilities (fy_sampler_probs), q: k rows of
 * draft probabilities, or NULL when the draft was a point mass (n-gram).
 * out receives the accepted tokens then the final one; returns how many
 * were accepted (0..k; out holds that plus one).  scratch: [vocab].
 * Draws only from rng.
 */
int32_t fy_spec_verify_sampled(const float *const *p, const float *const *q, const int32_t *draft, int32_t k,
                               int32_t vocab, fy_rng_t *rng, float *scratch, int32_t *out);

/* ---- adaptive control ---- */

/* One request's (or a worker's) speculation state. */
typedef struct fy_spec_ctl {
    int32_t k;         /* tokens to propose next */
    int32_t off_steps; /* > 0: off for this many more steps, then probed with k = 1 */
    double rate;       /* recent acceptance per proposed token (moving average) */
    int32_t judged;    /* proposed tokens since the last (re)start: judged from warmup on */
    int32_t judged_ok; /* of which accepted */
    int32_t window;    /* proposed tokens the rate averages over (32; a worker's: longer) */
    uint64_t proposed, accepted, verifies, disabled;
} fy_spec_ctl_t;

void fy_spec_ctl_init(fy_spec_ctl_t *c, const fy_spec_params_t *p);
/* Tokens to propose this step (0: off; counts an off step down). */
int32_t fy_spec_ctl_want(fy_spec_ctl_t *c);
/* After a verification of `proposed` tokens of which `accepted` passed:
 * the rate moves, k becomes about twice the expected accepted run,
 * 2 / (1 - rate), within [1, k_max]; a rate under min_accept past the
 * warmup turns speculation off for probe_steps steps.  Returns true when
 * it just turned off. */
bool fy_spec_ctl_update(fy_spec_ctl_t *c, const fy_spec_params_t *p, int32_t proposed, int32_t accepted);

/* ---- the draft model ---- */

typedef struct fy_spec_draft fy_spec_draft_t;

/*
 * Opens a draft for the target runner from "draft:FILE" (a model file
 * sharing the target's vocabulary) or "self:L" (the target's first L
 * layers with its final norm and output head, sharing its weights), with
 * a KV arena of kv_mem bytes (0: as many blocks as the target's, and at
 * least what the target's max_seqs requests of its context take in the
 * draft's own KV groups: fy_runner_pool_blocks) in the
 * target's block size and dtype, on the target's backend.  Errors name
 * the fault (FY_ERR_INVALID for a bad spec or a vocabulary mismatch).
 * The target runner and hasher must outlive the draft.
 */
fy_status_t fy_spec_draft_open(const char *spec, fy_runner_t *target, int64_t kv_mem, const fy_kv_hasher_t *hasher,
                               fy_spec_draft_t **d_p);
void fy_spec_draft_destroy(fy_spec_draft_t *d); /* accepts NULL */
fy_runner_t *fy_spec_draft_runner(fy_spec_draft_t *d);
fy_kvm_t *fy_spec_draft_kvm(fy_spec_draft_t *d);
/* "self:12 (12 of 30 layers)" or "draft:path (n layers)" */
const char *fy_spec_draft_describe(const fy_spec_draft_t *d);

#endif /* FY_SPEC_H */

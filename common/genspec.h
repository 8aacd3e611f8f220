/*
 * genspec.h - what a client asks of one generation (sampling, length,
 * stop strings, priority), as it travels in messages from the client to
 * the router and from the router to the workers.
 *
 * One struct with fixed storage, so a request carries its parameters by
 * value, and one pair of functions to put it into and read it out of a
 * message with every range checked (msg.h's sticky errors).
 */
#ifndef FY_GENSPEC_H
#define FY_GENSPEC_H

#include <stdbool.h>
#include <stdint.h>

#include "common/msg.h"
#include "common/sampling.h"

#define FY_GEN_MAX_STOP 8
#define FY_GEN_STOP_LEN 64 /* bytes per stop string on the wire */

/*
 * The range of every parameter, the one truth for the wire (a worker
 * refuses a message outside them with `format`) and for the router's
 * HTTP door (which answers 400 before anything is spent).  Floats are
 * bounds on the stored float: a double is in range exactly when its float
 * is, so no value passes one check and fails the other.
 */
#define FY_GEN_TEMPERATURE_MAX 100.0f
#define FY_GEN_TOP_P_MIN 1e-6f
#define FY_GEN_TOP_K_MAX (1 << 24)     /* 0: off */
#define FY_GEN_PRIORITY_MAX 1000000    /* and -FY_GEN_PRIORITY_MAX */
#define FY_GEN_KV_BUDGET_MAX (1 << 24) /* tokens; the engine refuses more than its deployment allows */
#define FY_GEN_PENALTY_MAX 2.0f        /* presence and frequency penalties: -2 to 2 (OpenAI's) */
#define FY_GEN_REP_PENALTY_MAX 10.0f   /* repetition penalty: above 0 to 10; 1 is off (vLLM's) */
#define FY_GEN_REP_PENALTY_MIN 1e-6f   /* (a float: what travels) */
#define FY_GEN_MAX_LOGIT_BIAS 300      /* logit_bias entries (OpenAI's limit) */
#define FY_GEN_LOGIT_BIAS_MAX 100.0f   /* and -100 (bans the token) */
#define FY_GEN_MAX_TOP_LOGPROBS 20     /* alternatives per token (OpenAI's) */
#define FY_GEN_MAX_STOP_IDS 16         /* stop_token_ids */
#define FY_GEN_MAX_GRAMMAR 32768       /* bytes of a structured output's source (a schema, a regex, choices) */
#define FY_GEN_MAX_PROMPT_LOGPROBS 20  /* prompt_logprobs: alternatives per prompt token (vLLM's) */
#define FY_GEN_MAX_BAD_SEQS 64         /* bad_words: token sequences (a word tokenized two ways: 32 words) */
#define FY_GEN_MAX_BAD_TOKENS 512      /* bad_words: their tokens in all */
#define FY_GEN_BAD_SEQ_MAX 32          /* bad_words: tokens in one sequence */
#define FY_GEN_MAX_ALLOWED_IDS 1024    /* allowed_token_ids */

/* Structured outputs: what constrains the text (grammar/grammar.h compiles it). */
typedef enum fy_gen_grammar {
    FY_GEN_GRAMMAR_NONE = 0,
    FY_GEN_GRAMMAR_JSON_SCHEMA, /* grammar: a JSON Schema document */
    FY_GEN_GRAMMAR_JSON_OBJECT, /* any JSON object (grammar empty) */
    FY_GEN_GRAMMAR_REGEX,       /* grammar: a regular expression the whole output matches */
    FY_GEN_GRAMMAR_CHOICE,      /* grammar: a JSON array of strings, the output one of them */
} fy_gen_grammar_t;

const char *fy_gen_grammar_str(fy_gen_grammar_t k); /* "none", "json_schema", "json_object", "regex", "choice" */

/* Speculative decoding, as a request asks for it (engine/spec.h has the rest). */
typedef enum fy_spec_method {
    FY_SPEC_DEFAULT = 0, /* whatever the deployment uses */
    FY_SPEC_NONE,        /* no speculation */
    FY_SPEC_NGRAM,       /* prompt lookup: the tokens that followed the last n tokens earlier in the text */
    FY_SPEC_DRAFT,       /* a draft model (a separate file, or the target's first layers) */
} fy_spec_method_t;

const char *fy_spec_method_str(fy_spec_method_t m); /* "default", "none", "ngram", "draft" */
/* "none", "ngram", "draft" (and "default" when allow_default); FY_ERR_INVALID otherwise (not logged). */
fy_status_t fy_spec_method_parse(const char *s, bool allow_default, fy_spec_method_t *m_p);

typedef struct fy_genspec {
    fy_sampling_params_t sampling;
    int32_t max_tokens;
    int32_t n_stop;
    char stop[FY_GEN_MAX_STOP][FY_GEN_STOP_LEN + 1];
    bool ignore_eos;
    bool logprobs;
    int32_t priority;
    fy_spec_method_t spec; /* the request's proposer; default: the decode worker's */
    int32_t kv_budget;     /* KV tokens kept (kv.evict), [0, FY_GEN_KV_BUDGET_MAX]; 0: the deployment's */
    /* logits processing (vLLM's definitions): presence and frequency
     * penalties over the generated tokens, the repetition penalty over the
     * prompt's and the generated ones, a bias per token id */
    float presence_penalty, frequency_penalty, repetition_penalty;
    int32_t n_logit_bias;
    int32_t logit_bias_id[FY_GEN_MAX_LOGIT_BIAS];
    float logit_bias[FY_GEN_MAX_LOGIT_BIAS];
    int32_t min_tokens;   /* EOS, stop token ids and stop strings are held back until this many, [0, max_tokens] */
    int32_t top_logprobs; /* alternatives reported with each token's logprob, [0, FY_GEN_MAX_TOP_LOGPROBS] */
    int32_t n_stop_ids;
    int32_t stop_ids[FY_GEN_MAX_STOP_IDS]; /* token ids that end the request (finish reason stop) */
    /* structured output: the kind and its source text (not NUL-terminated
     * on the wire; kept with a NUL here) */
    fy_gen_grammar_t grammar_kind;
    int32_t grammar_len;
    char grammar[FY_GEN_MAX_GRAMMAR + 1];
    /* prompt_logprobs (vLLM's): each prompt token's log-probability given
     * the tokens before it, its rank, and prompt_top alternatives
     * [0, FY_GEN_MAX_PROMPT_LOGPROBS]; computed where the prompt runs,
     * which then takes nothing from its prefix cache for that prompt */
    bool prompt_logprobs;
    int32_t prompt_top;
    /* bad_words (vLLM's): token sequences that must not be generated; the
     * i-th is bad_lens[i] tokens of bad_ids, in order (logits.h) */
    int32_t n_bad;
    int32_t bad_lens[FY_GEN_MAX_BAD_SEQS];
    int32_t bad_ids[FY_GEN_MAX_BAD_TOKENS];
    /* allowed_token_ids (vLLM's): with n_allowed above 0, only these
     * tokens may be generated (every other one banned, end of turn too) */
    int32_t n_allowed;
    int32_t allowed_ids[FY_GEN_MAX_ALLOWED_IDS];
    /* include_stop_str_in_output (vLLM's): the stop string that ended the
     * text is part of it */
    bool include_stop;
    /* skip_special_tokens false (vLLM's): special tokens' text (<|im_end|>)
     * is part of the output; by default it is left out */
    bool render_special;
} fy_genspec_t;

/* Whether g changes the logits the sampler sees (penalties, a bias, a
 * minimum length, stop token ids, bad words, allowed tokens). */
bool fy_genspec_processes_logits(const fy_genspec_t *g);

/* greedy, FY_GEN_MAX_TOKENS_DEFAULT tokens, no stop strings, priority 0,
 * no penalties (repetition 1) */
#define FY_GEN_MAX_TOKENS_DEFAULT 128
void fy_genspec_default(fy_genspec_t *g);
/* The tokens g may generate after an n_prompt-token prompt in a context of
 * max_ctx: its max_tokens, at most the room the context leaves.  The one
 * clamp of a request's length: the door applies it to a max_tokens the
 * client left out, a decode worker to its reservation, the engine to every
 * request.  Below 1 when the prompt fills the context. */
int32_t fy_genspec_max_tokens(const fy_genspec_t *g, int32_t n_prompt, int32_t max_ctx);
/* Adds the fields to an open message, as common/wire.c's table of them
 * says (docs/protocol.md, "Generation parameters"): the sampler's always,
 * the rest where they differ from the default. */
void fy_genspec_write(fy_msgw_t *w, const fy_genspec_t *g);
/* Reads them by the same table (absent ones keep g's values); errors land
 * in r and name the field.  max_tokens must be in [1, max_tokens_cap]. */
void fy_genspec_read(fy_msgr_t *r, fy_genspec_t *g, int32_t max_tokens_cap);
/* Every field of g in the ranges above (temperature 0 to its max, top_p
 * FY_GEN_TOP_P_MIN to 1, top_k 0 to its max, min_p 0 to 1, max_tokens 1
 * to max_tokens_cap, stop strings 1 to FY_GEN_STOP_LEN bytes without a
 * NUL, priority within its max, a known spec, penalties and biases
 * within theirs, min_tokens at most max_tokens, token ids not negative:
 * the vocabulary is the engine's to check; prompt_top within its max; bad
 * words' sequences 1 to FY_GEN_BAD_SEQ_MAX tokens, their lengths adding up
 * to the tokens held), else FY_ERR_INVALID with
 * *field_p naming the first field at fault ("top_p") and err saying why.
 * Not logged. */
fy_status_t fy_genspec_check(const fy_genspec_t *g, int32_t max_tokens_cap, const char **field_p, char *err,
                             size_t err_cap);
/* The stop strings as the pointer array the engine takes. */
int32_t fy_genspec_stops(const fy_genspec_t *g, const char **out);

#endif /* FY_GENSPEC_H */

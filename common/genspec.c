/*
 * genspec.c - generation parameters on the wire (see genspec.h).
 */
#include "common/genspec.h"

#include <stdio.h>
#include <string.h>

const char *fy_spec_method_str(fy_spec_method_t m)
{
    switch (m) {
    case FY_SPEC_DEFAULT: return "default";
    case FY_SPEC_NONE: return "none";
    case FY_SPEC_NGRAM: return "ngram";
    case FY_SPEC_DRAFT: return "draft";
    }
    return "?";
}

fy_status_t fy_spec_method_parse(const char *s, bool allow_default, fy_spec_method_t *m_p)
{
    static const fy_spec_method_t all[] = {FY_SPEC_DEFAULT, FY_SPEC_NONE, FY_SPEC_NGRAM, FY_SPEC_DRAFT};
    for (size_t i = allow_default ? 0 : 1; i < sizeof(all) / sizeof(all[0]); i++) {
        if (!strcmp(s, fy_spec_method_str(all[i]))) {
            *m_p = all[i];
            return FY_OK;
        }
    }
    return FY_ERR_INVALID;
}

const char *fy_gen_grammar_str(fy_gen_grammar_t k)
{
    switch (k) {
    case FY_GEN_GRAMMAR_NONE: return "none";
    case FY_GEN_GRAMMAR_JSON_SCHEMA: return "json_schema";
    case FY_GEN_GRAMMAR_JSON_OBJECT: return "json_object";
    case FY_GEN_GRAMMAR_REGEX: return "regex";
    case FY_GEN_GRAMMAR_CHOICE: return "choice";
    }
    return "?";
}

void fy_genspec_default(fy_genspec_t *g)
{
    memset(g, 0, sizeof(*g));
    fy_sampling_params_default(&g->sampling);
    g->max_tokens = FY_GEN_MAX_TOKENS_DEFAULT;
    g->repetition_penalty = 1.0f;
}

int32_t fy_genspec_max_tokens(const fy_genspec_t *g, int32_t n_prompt, int32_t max_ctx)
{
    int64_t room = (int64_t)max_ctx - n_prompt;
    return g->max_tokens < room ? g->max_tokens : (int32_t)(room > INT32_MIN ? room : INT32_MIN);
}

bool fy_genspec_processes_logits(const fy_genspec_t *g)
{
    return g->presence_penalty != 0 || g->frequency_penalty != 0 || g->repetition_penalty != 1.0f ||
           g->n_logit_bias > 0 || g->min_tokens > 0 || g->n_stop_ids > 0 || g->n_bad > 0 || g->n_allowed > 0;
}

fy_status_t fy_genspec_check(const fy_genspec_t *g, int32_t max_tokens_cap, const char **field_p, char *err,
                             size_t err_cap)
{
    const fy_sampling_params_t *s = &g->sampling;
    const char *f = NULL;
    /* written as "in range" tests, so a NaN is out of every one */
    if (!(s->temperature >= 0 && s->temperature <= FY_GEN_TEMPERATURE_MAX)) {
        f = "temperature";
        snprintf(err, err_cap, "'temperature' is %g; it must be between 0 and %g", (double)s->temperature,
                 (double)FY_GEN_TEMPERATURE_MAX);
    } else if (!(s->top_p >= FY_GEN_TOP_P_MIN && s->top_p <= 1)) {
        f = "top_p";
        snprintf(err, err_cap, "'top_p' is %g; it must be between %g and 1", (double)s->top_p,
                 (double)FY_GEN_TOP_P_MIN);
    } else if (s->top_k < 0 || s->top_k > FY_GEN_TOP_K_MAX) {
        f = "top_k";
        snprintf(err, err_cap, "'top_k' is %d; it must be between 0 (off) and %d", s->top_k, FY_GEN_TOP_K_MAX);
    } else if (!(s->min_p >= 0 && s->min_p <= 1)) {
        f = "min_p";
        snprintf(err, err_cap, "'min_p' is %g; it must be between 0 and 1", (double)s->min_p);
    } else if (g->max_tokens < 1 || g->max_tokens > max_tokens_cap) {
        f = "max_tokens";
        snprintf(err, err_cap, "'max_tokens' is %d; it must be between 1 and %d", g->max_tokens, max_tokens_cap);
    } else if (g->n_stop < 0 || g->n_stop > FY_GEN_MAX_STOP) {
        f = "stop";
        snprintf(err, err_cap, "%d stop strings; at most %d", g->n_stop, FY_GEN_MAX_STOP);
    } else if (g->priority < -FY_GEN_PRIORITY_MAX || g->priority > FY_GEN_PRIORITY_MAX) {
        f = "priority";
        snprintf(err, err_cap, "'priority' is %d; it must be between %d and %d", g->priority, -FY_GEN_PRIORITY_MAX,
                 FY_GEN_PRIORITY_MAX);
    } else if (g->kv_budget < 0 || g->kv_budget > FY_GEN_KV_BUDGET_MAX) {
        f = "kv_budget";
        snprintf(err, err_cap, "'kv_budget' is %d; it must be between 0 and %d", g->kv_budget, FY_GEN_KV_BUDGET_MAX);
    } else if (g->spec < FY_SPEC_DEFAULT || g->spec > FY_SPEC_DRAFT) {
        f = "spec";
        snprintf(err, err_cap, "unknown speculative method %d", (int)g->spec);
    } else if (!(g->presence_penalty >= -FY_GEN_PENALTY_MAX && g->presence_penalty <= FY_GEN_PENALTY_MAX)) {
        f = "presence_penalty";
        snprintf(err, err_cap, "'presence_penalty' is %g; it must be between -2 and 2", (double)g->presence_penalty);
    } else if (!(g->frequency_penalty >= -FY_GEN_PENALTY_MAX && g->frequency_penalty <= FY_GEN_PENALTY_MAX)) {
        f = "frequency_penalty";
        snprintf(err, err_cap, "'frequency_penalty' is %g; it must be between -2 and 2", (double)g->frequency_penalty);
    } else if (!(g->repetition_penalty >= FY_GEN_REP_PENALTY_MIN && g->repetition_penalty <= FY_GEN_REP_PENALTY_MAX)) {
        f = "repetition_penalty";
        snprintf(err, err_cap, "'repetition_penalty' is %g; it must be above 0 and at most %g (1: off)",
                 (double)g->repetition_penalty, (double)FY_GEN_REP_PENALTY_MAX);
    } else if (g->n_logit_bias < 0 || g->n_logit_bias > FY_GEN_MAX_LOGIT_BIAS) {
        f = "logit_bias";
        snprintf(err, err_cap, "%d logit_bias entries; at most %d", g->n_logit_bias, FY_GEN_MAX_LOGIT_BIAS);
    } else if (g->min_tokens < 0 || g->min_tokens > g->max_tokens) {
        f = "min_tokens";
        snprintf(err, err_cap, "'min_tokens' is %d; it must be between 0 and max_tokens (%d)", g->min_tokens,
                 g->max_tokens);
    } else if (g->top_logprobs < 0 || g->top_logprobs > FY_GEN_MAX_TOP_LOGPROBS) {
        f = "top_logprobs";
        snprintf(err, err_cap, "'top_logprobs' is %d; it must be between 0 and %d", g->top_logprobs,
                 FY_GEN_MAX_TOP_LOGPROBS);
    } else if (g->n_stop_ids < 0 || g->n_stop_ids > FY_GEN_MAX_STOP_IDS) {
        f = "stop_token_ids";
        snprintf(err, err_cap, "%d stop_token_ids; at most %d", g->n_stop_ids, FY_GEN_MAX_STOP_IDS);
    } else if (g->prompt_top < 0 || g->prompt_top > FY_GEN_MAX_PROMPT_LOGPROBS) {
        f = "prompt_logprobs";
        snprintf(err, err_cap, "'prompt_logprobs' is %d; it must be between 0 and %d", g->prompt_top,
                 FY_GEN_MAX_PROMPT_LOGPROBS);
    } else if (g->n_bad < 0 || g->n_bad > FY_GEN_MAX_BAD_SEQS) {
        f = "bad_words";
        snprintf(err, err_cap, "%d bad word sequences; at most %d", g->n_bad, FY_GEN_MAX_BAD_SEQS);
    } else if (g->n_allowed < 0 || g->n_allowed > FY_GEN_MAX_ALLOWED_IDS) {
        f = "allowed_token_ids";
        snprintf(err, err_cap, "%d allowed_token_ids; at most %d", g->n_allowed, FY_GEN_MAX_ALLOWED_IDS);
    }
    for (int32_t i = 0; !f && i < g->n_allowed; i++)
        if (g->allowed_ids[i] < 0) {
            f = "allowed_token_ids";
            snprintf(err, err_cap, "allowed_token_ids: %d is not a token id", g->allowed_ids[i]);
        }
    for (int32_t i = 0, total = 0; !f && i < g->n_bad; i++) {
        if (g->bad_lens[i] < 1 || g->bad_lens[i] > FY_GEN_BAD_SEQ_MAX ||
            (total += g->bad_lens[i]) > FY_GEN_MAX_BAD_TOKENS) {
            f = "bad_words";
            snprintf(err, err_cap, "bad_words: each word is 1 to %d tokens, %d tokens in all at most",
                     FY_GEN_BAD_SEQ_MAX, FY_GEN_MAX_BAD_TOKENS);
            break;
        }
        for (int32_t j = total - g->bad_lens[i]; !f && j < total; j++)
            if (g->bad_ids[j] < 0) {
                f = "bad_words";
                snprintf(err, err_cap, "bad_words: %d is not a token id", g->bad_ids[j]);
            }
    }
    if (!f && (g->grammar_kind < FY_GEN_GRAMMAR_NONE || g->grammar_kind > FY_GEN_GRAMMAR_CHOICE || g->grammar_len < 0 ||
               g->grammar_len > FY_GEN_MAX_GRAMMAR || memchr(g->grammar, 0, (size_t)g->grammar_len))) {
        f = "response_format";
        snprintf(err, err_cap, "a structured output's source holds at most %d bytes, and no NUL byte",
                 FY_GEN_MAX_GRAMMAR);
    }
    for (int32_t i = 0; !f && i < g->n_logit_bias; i++)
        if (g->logit_bias_id[i] < 0 ||
            !(g->logit_bias[i] >= -FY_GEN_LOGIT_BIAS_MAX && g->logit_bias[i] <= FY_GEN_LOGIT_BIAS_MAX)) {
            f = "logit_bias";
            snprintf(err, err_cap, "logit_bias: token %d with bias %g; ids are token ids, biases -100 to 100",
                     g->logit_bias_id[i], (double)g->logit_bias[i]);
        }
    for (int32_t i = 0; !f && i < g->n_stop_ids; i++)
        if (g->stop_ids[i] < 0) {
            f = "stop_token_ids";
            snprintf(err, err_cap, "stop_token_ids: %d is not a token id", g->stop_ids[i]);
        }
    for (int32_t i = 0; !f && i < g->n_stop; i++) {
        size_t n = strnlen(g->stop[i], FY_GEN_STOP_LEN + 1);
        if (n < 1 || n > FY_GEN_STOP_LEN) {
            f = "stop";
            snprintf(err, err_cap, "each stop string has 1 to %d bytes, and no NUL byte", FY_GEN_STOP_LEN);
        }
    }
    if (!f) return FY_OK;
    *field_p = f;
    return FY_ERR_INVALID;
}

int32_t fy_genspec_stops(const fy_genspec_t *g, const char **out)
{
    for (int32_t i = 0; i < g->n_stop; i++) out[i] = g->stop[i];
    return g->n_stop;
}

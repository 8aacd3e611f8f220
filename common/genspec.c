/*
 * genspec.c - generation parameters on the wire (see genspec.h).
 */
#include "genspec.h"

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

void fy_genspec_write(fy_msgw_t *w, const fy_genspec_t *g)
{
    fy_msgw_f64(w, "temperature", g->sampling.temperature);
    fy_msgw_i64(w, "top_k", g->sampling.top_k);
    fy_msgw_f64(w, "top_p", g->sampling.top_p);
    fy_msgw_f64(w, "min_p", g->sampling.min_p);
    fy_msgw_u64(w, "seed", g->sampling.seed);
    fy_msgw_i64(w, "max_tokens", g->max_tokens);
    const char *stops[FY_GEN_MAX_STOP];
    int32_t n = fy_genspec_stops(g, stops);
    if (n) fy_msgw_strs(w, "stop", stops, n);
    if (g->ignore_eos) fy_msgw_bool(w, "ignore_eos", true);
    if (g->logprobs) fy_msgw_bool(w, "logprobs", true);
    if (g->priority) fy_msgw_i64(w, "priority", g->priority);
    if (g->spec != FY_SPEC_DEFAULT) fy_msgw_str(w, "spec", fy_spec_method_str(g->spec));
    if (g->kv_budget) fy_msgw_i64(w, "kv_budget", g->kv_budget);
    if (g->presence_penalty != 0) fy_msgw_f64(w, "presence_penalty", g->presence_penalty);
    if (g->frequency_penalty != 0) fy_msgw_f64(w, "frequency_penalty", g->frequency_penalty);
    if (g->repetition_penalty != 1.0f) fy_msgw_f64(w, "repetition_penalty", g->repetition_penalty);
    if (g->n_logit_bias) {
        fy_msgw_i32s(w, "logit_bias_ids", g->logit_bias_id, g->n_logit_bias);
        fy_msgw_f32s(w, "logit_bias", g->logit_bias, g->n_logit_bias);
    }
    if (g->min_tokens) fy_msgw_i64(w, "min_tokens", g->min_tokens);
    if (g->top_logprobs) fy_msgw_i64(w, "top_logprobs", g->top_logprobs);
    if (g->n_stop_ids) fy_msgw_i32s(w, "stop_token_ids", g->stop_ids, g->n_stop_ids);
    if (g->grammar_kind != FY_GEN_GRAMMAR_NONE) {
        fy_msgw_str(w, "grammar_kind", fy_gen_grammar_str(g->grammar_kind));
        fy_msgw_strn(w, "grammar", g->grammar, (size_t)g->grammar_len);
    }
    if (g->prompt_logprobs) fy_msgw_i64(w, "prompt_logprobs", g->prompt_top);
    if (g->n_bad) {
        int32_t total = 0;
        for (int32_t i = 0; i < g->n_bad; i++) total += g->bad_lens[i];
        fy_msgw_i32s(w, "bad_words_lens", g->bad_lens, g->n_bad);
        fy_msgw_i32s(w, "bad_words_ids", g->bad_ids, total);
    }
    if (g->n_allowed) fy_msgw_i32s(w, "allowed_token_ids", g->allowed_ids, g->n_allowed);
    if (g->include_stop) fy_msgw_bool(w, "include_stop", true);
    if (g->render_special) fy_msgw_bool(w, "render_special", true);
}

void fy_genspec_read(fy_msgr_t *r, fy_genspec_t *g, int32_t max_tokens_cap)
{
    g->sampling.temperature =
        (float)fy_msgr_f64(r, "temperature", FY_OPT, g->sampling.temperature, 0, FY_GEN_TEMPERATURE_MAX);
    g->sampling.top_k = (int32_t)fy_msgr_i64(r, "top_k", FY_OPT, g->sampling.top_k, 0, FY_GEN_TOP_K_MAX);
    /* the bound is a float: top_p is kept and forwarded as a float, and 1e-6
     * is not one (the float nearest a top_p of 1e-6 is just below it) */
    g->sampling.top_p = (float)fy_msgr_f64(r, "top_p", FY_OPT, g->sampling.top_p, FY_GEN_TOP_P_MIN, 1);
    g->sampling.min_p = (float)fy_msgr_f64(r, "min_p", FY_OPT, g->sampling.min_p, 0, 1);
    g->sampling.seed = fy_msgr_u64(r, "seed", FY_OPT, g->sampling.seed, 0, UINT64_MAX);
    g->max_tokens = (int32_t)fy_msgr_i64(r, "max_tokens", FY_OPT, g->max_tokens, 1, max_tokens_cap);
    const char *s[FY_GEN_MAX_STOP];
    size_t len[FY_GEN_MAX_STOP];
    if (fy_msgr_has(r, "stop")) {
        int32_t n = fy_msgr_strs(r, "stop", FY_OPT, s, len, FY_GEN_MAX_STOP, FY_GEN_STOP_LEN);
        for (int32_t i = 0; i < n && fy_msgr_ok(r); i++) {
            if (memchr(s[i], 0, len[i])) {
                fy_msgr_fail(r, FY_ERR_FORMAT, "field 'stop': entry %d holds a NUL byte", i);
                break;
            }
            memcpy(g->stop[i], s[i], len[i]);
            g->stop[i][len[i]] = 0;
        }
        if (fy_msgr_ok(r)) g->n_stop = n;
    }
    g->ignore_eos = fy_msgr_bool(r, "ignore_eos", FY_OPT, g->ignore_eos);
    g->logprobs = fy_msgr_bool(r, "logprobs", FY_OPT, g->logprobs);
    g->priority = (int32_t)fy_msgr_i64(r, "priority", FY_OPT, g->priority, -FY_GEN_PRIORITY_MAX, FY_GEN_PRIORITY_MAX);
    g->kv_budget = (int32_t)fy_msgr_i64(r, "kv_budget", FY_OPT, g->kv_budget, 0, FY_GEN_KV_BUDGET_MAX);
    g->presence_penalty =
        (float)fy_msgr_f64(r, "presence_penalty", FY_OPT, g->presence_penalty, -FY_GEN_PENALTY_MAX, FY_GEN_PENALTY_MAX);
    g->frequency_penalty = (float)fy_msgr_f64(r, "frequency_penalty", FY_OPT, g->frequency_penalty, -FY_GEN_PENALTY_MAX,
                                              FY_GEN_PENALTY_MAX);
    g->repetition_penalty = (float)fy_msgr_f64(r, "repetition_penalty", FY_OPT, g->repetition_penalty,
                                               FY_GEN_REP_PENALTY_MIN, FY_GEN_REP_PENALTY_MAX);
    if (fy_msgr_has(r, "logit_bias_ids") || fy_msgr_has(r, "logit_bias")) {
        int32_t ids[FY_GEN_MAX_LOGIT_BIAS];
        float b[FY_GEN_MAX_LOGIT_BIAS];
        int32_t ni = fy_msgr_i32s(r, "logit_bias_ids", FY_REQ, ids, FY_GEN_MAX_LOGIT_BIAS, 0, INT32_MAX);
        int32_t nb = fy_msgr_f32s(r, "logit_bias", FY_REQ, b, FY_GEN_MAX_LOGIT_BIAS);
        if (fy_msgr_ok(r) && ni != nb)
            fy_msgr_fail(r, FY_ERR_FORMAT, "%d logit_bias_ids for %d logit_bias values", ni, nb);
        for (int32_t i = 0; i < nb && fy_msgr_ok(r); i++)
            if (!(b[i] >= -FY_GEN_LOGIT_BIAS_MAX && b[i] <= FY_GEN_LOGIT_BIAS_MAX))
                fy_msgr_fail(r, FY_ERR_FORMAT, "field 'logit_bias': entry %d is out of -100 to 100", i);
        if (fy_msgr_ok(r)) {
            memcpy(g->logit_bias_id, ids, (size_t)ni * sizeof(int32_t));
            memcpy(g->logit_bias, b, (size_t)nb * sizeof(float));
            g->n_logit_bias = ni;
        }
    }
    g->min_tokens = (int32_t)fy_msgr_i64(r, "min_tokens", FY_OPT, g->min_tokens, 0, g->max_tokens);
    g->top_logprobs = (int32_t)fy_msgr_i64(r, "top_logprobs", FY_OPT, g->top_logprobs, 0, FY_GEN_MAX_TOP_LOGPROBS);
    if (fy_msgr_has(r, "stop_token_ids")) {
        int32_t ids[FY_GEN_MAX_STOP_IDS];
        int32_t n = fy_msgr_i32s(r, "stop_token_ids", FY_OPT, ids, FY_GEN_MAX_STOP_IDS, 0, INT32_MAX);
        if (fy_msgr_ok(r)) {
            memcpy(g->stop_ids, ids, (size_t)n * sizeof(int32_t));
            g->n_stop_ids = n;
        }
    }
    if (fy_msgr_has(r, "grammar_kind")) {
        char kind[16];
        fy_msgr_str(r, "grammar_kind", FY_OPT, NULL, kind, sizeof(kind));
        fy_gen_grammar_t k = FY_GEN_GRAMMAR_NONE;
        while (fy_msgr_ok(r) && k <= FY_GEN_GRAMMAR_CHOICE && strcmp(kind, fy_gen_grammar_str(k))) k++;
        if (fy_msgr_ok(r) && k > FY_GEN_GRAMMAR_CHOICE)
            fy_msgr_fail(r, FY_ERR_FORMAT,
                         "field 'grammar_kind': '%s' is not none, json_schema, json_object, regex "
                         "or choice",
                         kind);
        size_t glen = 0;
        const char *src = fy_msgr_bytes(r, "grammar", FY_OPT, FY_GEN_MAX_GRAMMAR, &glen);
        if (!src) glen = 0;
        if (fy_msgr_ok(r) && src && memchr(src, 0, glen))
            fy_msgr_fail(r, FY_ERR_FORMAT, "field 'grammar' holds a NUL byte");
        if (fy_msgr_ok(r)) {
            g->grammar_kind = k;
            g->grammar_len = (int32_t)glen;
            if (glen) memcpy(g->grammar, src, glen);
            g->grammar[glen] = 0;
        }
    }
    if (fy_msgr_has(r, "prompt_logprobs")) {
        int32_t k = (int32_t)fy_msgr_i64(r, "prompt_logprobs", FY_OPT, 0, 0, FY_GEN_MAX_PROMPT_LOGPROBS);
        if (fy_msgr_ok(r)) {
            g->prompt_logprobs = true;
            g->prompt_top = k;
        }
    }
    if (fy_msgr_has(r, "bad_words_lens") || fy_msgr_has(r, "bad_words_ids")) {
        int32_t lens[FY_GEN_MAX_BAD_SEQS], ids[FY_GEN_MAX_BAD_TOKENS];
        int32_t nl = fy_msgr_i32s(r, "bad_words_lens", FY_REQ, lens, FY_GEN_MAX_BAD_SEQS, 1, FY_GEN_BAD_SEQ_MAX);
        int32_t ni = fy_msgr_i32s(r, "bad_words_ids", FY_REQ, ids, FY_GEN_MAX_BAD_TOKENS, 0, INT32_MAX);
        int32_t total = 0;
        for (int32_t i = 0; i < nl && fy_msgr_ok(r); i++) total += lens[i];
        if (fy_msgr_ok(r) && total != ni)
            fy_msgr_fail(r, FY_ERR_FORMAT, "field 'bad_words_ids': %d ids for sequences of %d tokens in all", ni,
                         total);
        if (fy_msgr_ok(r)) {
            memcpy(g->bad_lens, lens, (size_t)nl * sizeof(int32_t));
            memcpy(g->bad_ids, ids, (size_t)ni * sizeof(int32_t));
            g->n_bad = nl;
        }
    }
    if (fy_msgr_has(r, "allowed_token_ids")) {
        int32_t n = fy_msgr_i32s(r, "allowed_token_ids", FY_OPT, g->allowed_ids, FY_GEN_MAX_ALLOWED_IDS, 0, INT32_MAX);
        if (fy_msgr_ok(r)) g->n_allowed = n;
    }
    g->include_stop = fy_msgr_bool(r, "include_stop", FY_OPT, g->include_stop);
    g->render_special = fy_msgr_bool(r, "render_special", FY_OPT, g->render_special);
    if (fy_msgr_has(r, "spec")) {
        char buf[16];
        fy_msgr_str(r, "spec", FY_OPT, NULL, buf, sizeof(buf));
        fy_spec_method_t m;
        if (fy_msgr_ok(r) && fy_spec_method_parse(buf, true, &m) != FY_OK)
            fy_msgr_fail(r, FY_ERR_FORMAT, "field 'spec': '%s' is not default, none, ngram or draft", buf);
        else if (fy_msgr_ok(r))
            g->spec = m;
    }
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

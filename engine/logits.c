/* logits.c - logits processing and top alternatives (logits.h). */
#include "engine/logits.h"

#include <math.h>
#include <string.h>

#include "common/mem.h"
#include "common/sampling.h"

/* A banned token's logit: far below any real one, yet finite (exp of it
 * less the row's maximum is 0, and no arithmetic meets an infinity). */
#define BANNED (-1e30f)

bool fy_logits_active(const fy_logits_params_t *p)
{
    return p->presence_penalty != 0 || p->frequency_penalty != 0 || p->repetition_penalty != 1.0f || p->n_bias > 0 ||
           p->min_tokens > 0 || p->n_bad > 0 || p->n_allowed > 0;
}

fy_status_t fy_logits_scratch_init(fy_logits_scratch_t *s, int32_t vocab)
{
    s->count = fy_calloc((size_t)vocab, sizeof(int32_t));
    s->vocab = vocab;
    return s->count ? FY_OK : FY_ERR_NOMEM;
}

void fy_logits_scratch_deinit(fy_logits_scratch_t *s)
{
    fy_free(s->count);
    s->count = NULL;
}

static void penalize(const fy_logits_params_t *p, fy_logits_scratch_t *s, const int32_t *tokens, int32_t n_prompt,
                     int32_t n_total, float *logits);

void fy_logits_apply(const fy_logits_params_t *p, fy_logits_scratch_t *s, const int32_t *tokens, int32_t n_prompt,
                     int32_t n_total, const int32_t *eog, int32_t n_eog, float *logits)
{
    int32_t V = s->vocab;
    if (p->n_allowed > 0) { /* marks in the scratch counters, zero again after */
        for (int32_t i = 0; i < p->n_allowed; i++)
            if (p->allowed_ids[i] >= 0 && p->allowed_ids[i] < V) s->count[p->allowed_ids[i]] = 1;
        for (int32_t t = 0; t < V; t++)
            if (!s->count[t]) logits[t] = BANNED;
        for (int32_t i = 0; i < p->n_allowed; i++)
            if (p->allowed_ids[i] >= 0 && p->allowed_ids[i] < V) s->count[p->allowed_ids[i]] = 0;
    }
    for (int32_t i = 0; i < p->n_bias; i++) {
        int32_t t = p->bias_ids[i];
        if (t < 0 || t >= V) continue;
        logits[t] = p->bias[i] <= -100.0f ? BANNED : logits[t] + p->bias[i];
    }
    if (n_total - n_prompt < p->min_tokens) {
        for (int32_t i = 0; i < n_eog; i++)
            if (eog[i] >= 0 && eog[i] < V) logits[eog[i]] = BANNED;
        for (int32_t i = 0; i < p->n_stop_ids; i++)
            if (p->stop_ids[i] >= 0 && p->stop_ids[i] < V) logits[p->stop_ids[i]] = BANNED;
    }
    bool rep = p->repetition_penalty != 1.0f, pf = p->presence_penalty != 0 || p->frequency_penalty != 0;
    if (rep || pf) penalize(p, s, tokens, n_prompt, n_total, logits);
    /* bad words: a sequence whose tokens but the last end the output bans its last */
    const int32_t *seq = p->bad_ids, *out = tokens + n_prompt;
    int32_t n_out = n_total - n_prompt;
    for (int32_t i = 0; i < p->n_bad; seq += p->bad_lens[i++]) {
        int32_t len = p->bad_lens[i], last = seq[len - 1];
        if (last < 0 || last >= V || len - 1 > n_out) continue;
        if (!memcmp(out + n_out - (len - 1), seq, (size_t)(len - 1) * sizeof(int32_t))) logits[last] = BANNED;
    }
}

static void penalize(const fy_logits_params_t *p, fy_logits_scratch_t *s, const int32_t *tokens, int32_t n_prompt,
                     int32_t n_total, float *logits)
{
    int32_t V = s->vocab, *count = s->count;
    bool rep = p->repetition_penalty != 1.0f;
    /* counts: the output's occurrences, plus a mark (-1 ... below zero)
     * for a prompt token the output has not repeated */
    for (int32_t i = n_prompt; i < n_total; i++)
        if (tokens[i] >= 0 && tokens[i] < V) count[tokens[i]]++;
    if (rep)
        for (int32_t i = 0; i < n_prompt; i++)
            if (tokens[i] >= 0 && tokens[i] < V && count[tokens[i]] == 0) count[tokens[i]] = -1;
    /* each distinct token once: the first time it is met its count is
     * used and cleared */
    for (int32_t i = 0; i < n_total; i++) {
        int32_t t = tokens[i];
        if (t < 0 || t >= V || count[t] == 0) continue;
        int32_t c = count[t] > 0 ? count[t] : 0;
        count[t] = 0;
        float l = logits[t];
        if (l <= BANNED) continue;
        if (rep) l = l > 0 ? l / p->repetition_penalty : l * p->repetition_penalty;
        if (c > 0) l -= p->frequency_penalty * (float)c + p->presence_penalty;
        logits[t] = l;
    }
}

/* The k largest of a row by insertion (k is small), ties to the lower id;
 * k at most 64 and the vocabulary; returns k. */
static int32_t top_ids(const float *logits, int32_t vocab, int32_t k, int32_t *ids)
{
    if (k > 64) k = 64;
    if (k > vocab) k = vocab;
    if (k < 1) return 0;
    int32_t n = 0;
    for (int32_t i = 0; i < vocab; i++) {
        float l = logits[i];
        if (n == k && !(l > logits[ids[n - 1]])) continue;
        int32_t j = n < k ? n++ : k - 1;
        while (j > 0 && l > logits[ids[j - 1]]) {
            ids[j] = ids[j - 1];
            j--;
        }
        ids[j] = i;
    }
    return n;
}

static float clamp_lp(double lp) { return lp > FY_LOGPROB_MIN ? (float)lp : FY_LOGPROB_MIN; }

float fy_logits_token_logprob(const float *logits, int32_t vocab, int32_t token, int32_t k, int32_t *ids,
                              float *logprobs, int32_t *rank_p)
{
    float mx = logits[0], l = logits[token];
    int32_t above = 0;
    for (int32_t i = 1; i < vocab; i++)
        if (logits[i] > mx) mx = logits[i];
    double sum = 0.0;
    for (int32_t i = 0; i < vocab; i++) {
        sum += exp((double)logits[i] - mx);
        above += logits[i] > l;
    }
    double lse = log(sum);
    int32_t n = top_ids(logits, vocab, k, ids);
    for (int32_t j = 0; j < n; j++) logprobs[j] = clamp_lp((double)logits[ids[j]] - mx - lse);
    *rank_p = above + 1;
    return clamp_lp((double)l - mx - lse);
}

int32_t fy_logits_top(const float *logits, int32_t vocab, float temperature, int32_t k, int32_t *ids, float *logprobs)
{
    int32_t n = top_ids(logits, vocab, k, ids);
    if (n < 1) return 0;
    double t = temperature >= FY_SAMPLING_MIN_TEMP ? (double)temperature : 1.0;
    float mx = logits[ids[0]];
    double sum = 0.0;
    for (int32_t i = 0; i < vocab; i++) sum += exp(((double)logits[i] - mx) / t);
    double lse = log(sum);
    for (int32_t j = 0; j < n; j++) logprobs[j] = clamp_lp(((double)logits[ids[j]] - mx) / t - lse);
    return n;
}

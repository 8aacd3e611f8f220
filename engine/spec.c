/*
 * spec.c - proposers, verification rules and the adaptive controller of
 * speculative decoding (see spec.h; the engine drives them).
 */
#include "engine/spec.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/mem.h"
#include "model/tokenizer.h"

void fy_spec_params_default(fy_spec_params_t *p)
{
    *p = (fy_spec_params_t){
        .method = FY_SPEC_NONE,
        .lookup = FY_SPEC_LOOKUP_SUFFIX,
        .history = 0,
        .k_max = 8,
        .ngram_max = 3,
        .min_accept = 0.3,
        .warmup = 16,
        .probe_steps = 64,
        .batch_tokens = 64,
        .cost_aware = true,
    };
}

fy_status_t fy_spec_params_check(const fy_spec_params_t *p)
{
    const char *bad = NULL;
    if (p->method == FY_SPEC_DEFAULT || p->method > FY_SPEC_DRAFT)
        bad = "method must be none, ngram or draft";
    else if (p->k_max < 1 || p->k_max > FY_SPEC_MAX_K)
        bad = "k_max must be in [1, 16]";
    else if (p->ngram_max < 1 || p->ngram_max > FY_SPEC_MAX_NGRAM)
        bad = "ngram_max must be in [1, 8]";
    else if (!(p->min_accept >= 0 && p->min_accept <= 1))
        bad = "min_accept must be in [0, 1]";
    else if (p->warmup < 1 || p->probe_steps < 1)
        bad = "warmup and probe_steps must be at least 1";
    else if (p->lookup != FY_SPEC_LOOKUP_SUFFIX && p->lookup != FY_SPEC_LOOKUP_NGRAM)
        bad = "lookup must be suffix or ngram";
    else if (p->history < 0 || p->history > 1024)
        bad = "history must be in [0, 1024]";
    else if (p->batch_tokens < 0)
        bad = "batch_tokens must not be negative";
    else if (p->method == FY_SPEC_DRAFT && (!p->draft || !p->draft_kvm))
        bad = "the draft method needs a draft model";
    if (bad) {
        fy_error("speculative decoding: %s", bad);
        return FY_ERR_INVALID;
    }
    return FY_OK;
}

/* ---- n-gram lookup ---------------------------------------------------------------------------- */

int32_t fy_spec_ngram_propose(const int32_t *t, int32_t n_tokens, int32_t ngram_max, int32_t k, int32_t *out)
{
    if (k < 1 || n_tokens < 2) return 0;
    for (int32_t n = ngram_max < n_tokens - 1 ? ngram_max : n_tokens - 1; n >= 1; n--) {
        const int32_t *suffix = t + n_tokens - n;
        /* the most recent earlier occurrence: the text being rewritten
         * right now is nearest */
        for (int32_t s = n_tokens - n - 1; s >= 0; s--) {
            if (t[s] != suffix[0] || memcmp(t + s, suffix, (size_t)n * sizeof(int32_t))) continue;
            int32_t from = s + n, m = n_tokens - from < k ? n_tokens - from : k;
            memcpy(out, t + from, (size_t)m * sizeof(int32_t));
            return m;
        }
    }
    return 0;
}

/* ---- suffix lookup --------------------------------------------------------------------------------- */

typedef struct cand {
    const int32_t *t; /* the text */
    int32_t n;        /* its tokens */
    int32_t at;       /* where the occurrence's continuation starts */
} cand_t;

/* Adds src's occurrences of the suffix q[-m..) ending before limit, from
 * the end backwards: a longer match than *best restarts the set. */
static void suffix_scan(const int32_t *q, int32_t nq, const int32_t *src, int32_t n_src, int32_t limit, int32_t *best,
                        cand_t *c, int32_t *nc)
{
    int32_t last = q[nq - 1];
    for (int32_t at = limit; at >= 1; at--) {
        if (src[at - 1] != last) continue;
        int32_t cap = nq < at ? nq : at, m = 1;
        if (cap > FY_SPEC_SUFFIX_MATCH) cap = FY_SPEC_SUFFIX_MATCH;
        while (m < cap && src[at - 1 - m] == q[nq - 1 - m]) m++;
        if (m < *best) continue;
        if (m > *best) {
            *best = m;
            *nc = 0;
        }
        if (*nc < FY_SPEC_SUFFIX_CANDS) c[(*nc)++] = (cand_t){src, n_src, at};
    }
}

int32_t fy_spec_suffix_propose(const int32_t *t, int32_t n_tokens, const fy_spec_text_t *src, int32_t n_src, int32_t k,
                               int32_t *out, float *freq, int32_t *match_p, bool *own_p)
{
    cand_t c[FY_SPEC_SUFFIX_CANDS];
    int32_t nc = 0, best = 0;
    if (match_p) *match_p = 0;
    if (own_p) *own_p = false;
    if (k < 1 || n_tokens < 1) return 0;
    /* own text: occurrences whose continuation starts before the end */
    suffix_scan(t, n_tokens, t, n_tokens, n_tokens - 1, &best, c, &nc);
    for (int32_t s = 0; s < n_src; s++)
        if (src[s].n > 0) suffix_scan(t, n_tokens, src[s].tokens, src[s].n, src[s].n - 1, &best, c, &nc);
    if (best == 0) return 0;
    if (match_p) *match_p = best;
    if (own_p) *own_p = c[0].t == t; /* the own text's occurrences come first */
    int32_t n = 0;
    for (; n < k; n++) {
        /* the token most live occurrences continue with; ties: the first */
        int32_t pick = -1, pick_votes = 0, live = 0;
        for (int32_t i = 0; i < nc; i++) {
            if (c[i].at + n >= c[i].n) continue;
            live++;
            int32_t tok = c[i].t[c[i].at + n], votes = 0;
            bool seen = false;
            for (int32_t j = 0; j < i && !seen; j++) seen = c[j].at + n < c[j].n && c[j].t[c[j].at + n] == tok;
            if (seen) continue;
            for (int32_t j = i; j < nc; j++) votes += c[j].at + n < c[j].n && c[j].t[c[j].at + n] == tok;
            if (votes > pick_votes) {
                pick = tok;
                pick_votes = votes;
            }
        }
        if (live == 0) break;
        out[n] = pick;
        if (freq) freq[n] = (float)pick_votes / (float)live;
        int32_t kept = 0;
        for (int32_t i = 0; i < nc; i++)
            if (c[i].at + n < c[i].n && c[i].t[c[i].at + n] == pick) c[kept++] = c[i];
        nc = kept;
    }
    return n;
}

static int est_bucket(int32_t match, bool own)
{
    return (own ? 0 : 4) + (match <= 1 ? 0 : match <= 3 ? 1 : match <= 7 ? 2 : 3);
}

void fy_spec_est_init(fy_spec_est_t *s)
{
    /* priors worth 4 proposals each: a one-token match is a guess, a long
     * match a copy (BENCHMARKS.md, issue 19: 13-57% against 80-100%) */
    static const float prior[8] = {0.45f, 0.65f, 0.8f, 0.9f, 0.3f, 0.45f, 0.6f, 0.75f};
    for (int b = 0; b < 8; b++) {
        s->first_n[b] = 4.0f;
        s->first_ok[b] = 4.0f * prior[b];
    }
    s->next_n = 4.0f;
    s->next_ok = 4.0f * 0.85f;
}

void fy_spec_est_gains(const fy_spec_est_t *s, int32_t match, bool own, const float *freq, int32_t n, float *gain)
{
    int b = est_bucket(match, own);
    float g = s->first_ok[b] / s->first_n[b], next = s->next_ok / s->next_n;
    for (int32_t i = 0; i < n; i++) {
        g *= (i ? next : 1.0f) * (freq ? freq[i] : 1.0f);
        gain[i] = g;
    }
}

/* counts decay so that about the last 32 outcomes count */
static void est_count(float *ok, float *n, float hits, float tries)
{
    if (*n > 32.0f) {
        *ok *= 32.0f / *n;
        *n = 32.0f;
    }
    *ok += hits;
    *n += tries;
}

void fy_spec_est_note(fy_spec_est_t *s, int32_t match, bool own, int32_t proposed, int32_t accepted)
{
    if (proposed < 1) return;
    int b = est_bucket(match, own);
    est_count(&s->first_ok[b], &s->first_n[b], accepted > 0, 1.0f);
    /* later tokens were tried only after their predecessor passed */
    if (accepted > 0 && proposed > 1) {
        float tries = (float)(accepted < proposed ? accepted : proposed - 1);
        float hits = (float)(accepted < proposed ? accepted - 1 : proposed - 1);
        est_count(&s->next_ok, &s->next_n, hits, tries);
    }
}

/* ---- tenants' recent texts ------------------------------------------------------------------------- */

struct fy_spec_hist {
    int32_t n_texts, max_tokens;
    int32_t next;       /* the slot reused next (oldest) */
    uint64_t clock;     /* adds so far */
    fy_kv_ns_t *tenant; /* [n_texts] */
    uint64_t *stamp;    /* [n_texts] add order; 0: empty */
    int32_t *n;         /* [n_texts] */
    int32_t *tokens;    /* [n_texts, max_tokens] */
};

fy_status_t fy_spec_hist_create(int32_t n_texts, int32_t max_tokens, fy_spec_hist_t **h_p)
{
    if (n_texts < 1 || max_tokens < 1) return FY_ERR_INVALID;
    fy_spec_hist_t *h = fy_calloc(1, sizeof(*h));
    if (!h) return FY_ERR_NOMEM;
    h->n_texts = n_texts;
    h->max_tokens = max_tokens;
    h->tenant = fy_calloc((size_t)n_texts, sizeof(*h->tenant));
    h->stamp = fy_calloc((size_t)n_texts, sizeof(*h->stamp));
    h->n = fy_calloc((size_t)n_texts, sizeof(*h->n));
    h->tokens = fy_malloc((size_t)n_texts * (size_t)max_tokens * sizeof(int32_t));
    if (!h->tenant || !h->stamp || !h->n || !h->tokens) {
        fy_spec_hist_destroy(h);
        return FY_ERR_NOMEM;
    }
    *h_p = h;
    return FY_OK;
}

void fy_spec_hist_destroy(fy_spec_hist_t *h)
{
    if (!h) return;
    fy_free(h->tenant);
    fy_free(h->stamp);
    fy_free(h->n);
    fy_free(h->tokens);
    fy_free(h);
}

void fy_spec_hist_add(fy_spec_hist_t *h, const fy_kv_ns_t *tenant, const int32_t *tokens, int32_t n)
{
    if (n < 2) return;
    if (n > h->max_tokens) { /* the tail: what was generated last */
        tokens += n - h->max_tokens;
        n = h->max_tokens;
    }
    int32_t s = h->next;
    h->next = (s + 1) % h->n_texts;
    h->tenant[s] = *tenant;
    h->stamp[s] = ++h->clock;
    h->n[s] = n;
    memcpy(h->tokens + (size_t)s * (size_t)h->max_tokens, tokens, (size_t)n * sizeof(int32_t));
}

int32_t fy_spec_hist_texts(const fy_spec_hist_t *h, const fy_kv_ns_t *tenant, fy_spec_text_t *out, int32_t max)
{
    int32_t m = 0;
    /* slots were filled round-robin: newest is just before next */
    for (int32_t i = 1; i <= h->n_texts && m < max; i++) {
        int32_t s = (h->next - i + h->n_texts) % h->n_texts;
        if (!h->stamp[s] || memcmp(&h->tenant[s], tenant, sizeof(*tenant))) continue;
        out[m++] = (fy_spec_text_t){h->tokens + (size_t)s * (size_t)h->max_tokens, h->n[s]};
    }
    return m;
}

/* ---- rejection sampling ------------------------------------------------------------------------ */

/* Draws from w[vocab] / sum(w); sum > 0. */
static int32_t draw(const float *w, int32_t vocab, double sum, fy_rng_t *rng)
{
    double r = fy_rng_uniform(rng) * sum, acc = 0.0;
    int32_t last = 0;
    for (int32_t i = 0; i < vocab; i++) {
        if (w[i] <= 0.0f) continue;
        acc += w[i];
        last = i;
        if (r < acc) return i;
    }
    return last; /* rounding left r at the very end */
}

int32_t fy_spec_verify_sampled(const float *const *p, const float *const *q, const int32_t *draft, int32_t k,
                               int32_t vocab, fy_rng_t *rng, float *scratch, int32_t *out)
{
    for (int32_t i = 0; i < k; i++) {
        int32_t x = draft[i];
        double px = p[i][x], qx = q ? q[i][x] : 1.0;
        /* qx > 0: the draft drew x from q (or proposed it outright) */
        double u = fy_rng_uniform(rng);
        if (qx > 0.0 && u * qx < px) { /* u < min(1, px / qx) */
            out[i] = x;
            continue;
        }
        /* rejected: the residual max(0, p - q), normalized */
        double sum = 0.0;
        for (int32_t v = 0; v < vocab; v++) {
            float d = p[i][v] - (q ? q[i][v] : (v == x ? 1.0f : 0.0f));
            scratch[v] = d > 0.0f ? d : 0.0f;
            sum += scratch[v];
        }
        if (sum <= 0.0) { /* p == q up to rounding: any draw from p is right */
            out[i] = draw(p[i], vocab, 1.0, rng);
        } else {
            out[i] = draw(scratch, vocab, sum, rng);
        }
        return i;
    }
    double sum = 0.0;
    for (int32_t v = 0; v < vocab; v++) sum += p[k][v];
    out[k] = draw(p[k], vocab, sum, rng);
    return k;
}

/* ---- adaptive control ----------------------------------------------------------------------------- */

void fy_spec_ctl_init(fy_spec_ctl_t *c, const fy_spec_params_t *p)
{
    memset(c, 0, sizeof(*c));
    c->k = p->k_max < 4 ? p->k_max : 4;
    c->rate = 1.0;
    c->window = 32;
}

int32_t fy_spec_ctl_want(fy_spec_ctl_t *c)
{
    if (c->off_steps > 0) {
        if (--c->off_steps == 0) {
            /* probe: start small, judge afresh */
            c->k = 1;
            c->judged = c->judged_ok = 0;
            c->rate = 1.0;
        }
        return 0;
    }
    return c->k;
}

bool fy_spec_ctl_update(fy_spec_ctl_t *c, const fy_spec_params_t *p, int32_t proposed, int32_t accepted)
{
    if (proposed <= 0) return false;
    c->proposed += (uint64_t)proposed;
    c->accepted += (uint64_t)accepted;
    c->verifies++;
    c->judged += proposed;
    c->judged_ok += accepted;
    /* the plain ratio until a window of tokens is seen, then a moving
     * average over roughly the last window */
    int32_t window = c->window > 0 ? c->window : 32;
    if (c->judged <= window) {
        c->rate = (double)c->judged_ok / c->judged;
    } else {
        double w = (double)proposed / window;
        if (w > 1.0) w = 1.0;
        c->rate += w * ((double)accepted / proposed - c->rate);
    }
    /* about twice the expected run of accepted tokens, 1 / (1 - rate): a
     * verification token costs a small fraction of a step while decode is
     * bandwidth-bound (batch_tokens guards the rest), so proposing past
     * the expected run is cheap, stopping short of it is not */
    double r = c->rate < 0.95 ? c->rate : 0.95;
    int32_t k = (int32_t)ceil(2.0 / (1.0 - r));
    c->k = k < 1 ? 1 : k > p->k_max ? p->k_max : k;
    if (c->judged >= p->warmup && c->rate < p->min_accept) {
        c->off_steps = p->probe_steps;
        c->disabled++;
        return true;
    }
    return false;
}

/* ---- the draft model ------------------------------------------------------------------------------- */

struct fy_spec_draft {
    fy_model_t *model; /* NULL for a self-draft */
    fy_runner_t *r;
    fy_kvm_t *kvm;
    char desc[320];
};

fy_status_t fy_spec_draft_open(const char *spec, fy_runner_t *target, int64_t kv_mem, const fy_kv_hasher_t *hasher,
                               fy_spec_draft_t **d_p)
{
    const fy_model_t *tm = fy_runner_model(target);
    int32_t layers = 0;
    const char *file = NULL;
    if (!strncmp(spec, "self:", 5)) {
        char *end;
        errno = 0;
        long l = strtol(spec + 5, &end, 10);
        if (errno || end == spec + 5 || *end || l < 1 || l > fy_runner_n_layers(target)) {
            fy_error("speculative decoding: '%s': self:L needs L in [1, %d] (the target's layers)", spec,
                     fy_runner_n_layers(target));
            return FY_ERR_INVALID;
        }
        layers = (int32_t)l;
    } else if (!strncmp(spec, "draft:", 6) && spec[6]) {
        file = spec + 6;
    } else {
        fy_error("speculative decoding: '%s': a draft is draft:MODEL_FILE or self:LAYERS", spec);
        return FY_ERR_INVALID;
    }
    fy_spec_draft_t *d = fy_calloc(1, sizeof(*d));
    if (!d) return FY_ERR_NOMEM;
    fy_status_t st;
    if (file && (st = fy_model_load(file, &d->model)) != FY_OK) goto fail;
    if (d->model) {
        /* the same vocabulary by size and by the tokens that end a turn */
        const fy_tokenizer_t *a = fy_model_tokenizer(tm), *b = fy_model_tokenizer(d->model);
        if (fy_model_config(d->model)->vocab_size != fy_model_config(tm)->vocab_size ||
            fy_tokenizer_eos(a) != fy_tokenizer_eos(b)) {
            fy_error("speculative decoding: draft %s does not share the target's vocabulary (%d tokens against %d)",
                     file, fy_model_config(d->model)->vocab_size, fy_model_config(tm)->vocab_size);
            st = FY_ERR_INVALID;
            goto fail;
        }
    }
    fy_runner_params_t rp = *fy_runner_params(target);
    rp.n_host_blocks = 0;
    if (kv_mem > 0) { /* the runner sizes the arena from the bytes */
        rp.n_kv_blocks = 0;
        rp.kv_mem = kv_mem;
    } else { /* at least the target's sequences of its whole context, in the draft's own KV groups (a target's
                pool sized for sliding groups holds too few blocks for a draft of global layers) */
        const fy_model_t *dm = d->model ? d->model : tm;
        int32_t want = fy_runner_pool_blocks(dm, layers, &rp, rp.max_ctx, rp.max_seqs, rp.max_batch_tokens, 0);
        if (want < 1) {
            st = FY_ERR_INVALID;
            goto fail;
        }
        if (want > rp.n_kv_blocks) rp.n_kv_blocks = want;
    }
    if ((st = fy_runner_create_draft(target, d->model, layers, &rp, &d->r)) != FY_OK) goto fail;
    fy_kvm_params_t kp;
    fy_runner_kvm_params(d->r, &kp);
    kp.hasher = hasher;
    kp.prefix_caching = false; /* draft KV lives only as long as its request */
    kp.watermark = 0;
    if ((st = fy_kvm_create(&kp, &d->kvm)) != FY_OK) goto fail;
    const fy_model_config_t *dc = fy_model_config(d->model ? d->model : tm);
    if (d->model)
        snprintf(d->desc, sizeof(d->desc), "draft:%s (%d layers, %d kv blocks)", file, dc->n_layers,
                 fy_runner_params(d->r)->n_kv_blocks);
    else
        snprintf(d->desc, sizeof(d->desc), "self:%d (%d of %d layers, shared weights, %d kv blocks)", layers, layers,
                 dc->n_layers, fy_runner_params(d->r)->n_kv_blocks);
    *d_p = d;
    return FY_OK;
fail:
    fy_spec_draft_destroy(d);
    return st;
}

void fy_spec_draft_destroy(fy_spec_draft_t *d)
{
    if (!d) return;
    fy_kvm_destroy(d->kvm);
    fy_runner_destroy(d->r);
    fy_model_destroy(d->model);
    fy_free(d);
}

fy_runner_t *fy_spec_draft_runner(fy_spec_draft_t *d) { return d->r; }
fy_kvm_t *fy_spec_draft_kvm(fy_spec_draft_t *d) { return d->kvm; }
const char *fy_spec_draft_describe(const fy_spec_draft_t *d) { return d->desc; }

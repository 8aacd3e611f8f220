/* sampler.c - sampling from logits. */
#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/mem.h"

typedef struct cand {
    float logit;
    int32_t id;
} cand_t;

struct fy_sampler {
    int32_t vocab;
    cand_t *c; /* [vocab] */
    double *p; /* [vocab] */
};

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void fy_rng_seed(fy_rng_t *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t fy_rng_next(fy_rng_t *r)
{
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

double fy_rng_uniform(fy_rng_t *r) { return (double)(fy_rng_next(r) >> 11) * (1.0 / 9007199254740992.0); }

fy_status_t fy_sampler_create(int32_t vocab, fy_sampler_t **s_p)
{
    if (vocab < 1) return FY_ERR_INVALID;
    fy_sampler_t *s = fy_calloc(1, sizeof(*s));
    if (s) {
        s->c = fy_malloc((size_t)vocab * sizeof(cand_t));
        s->p = fy_malloc((size_t)vocab * sizeof(double));
    }
    if (!s || !s->c || !s->p) {
        fy_sampler_destroy(s);
        fy_error("sampler: out of memory for a vocabulary of %d", vocab);
        return FY_ERR_NOMEM;
    }
    s->vocab = vocab;
    *s_p = s;
    return FY_OK;
}

void fy_sampler_destroy(fy_sampler_t *s)
{
    if (!s) return;
    fy_free(s->c);
    fy_free(s->p);
    fy_free(s);
}

int32_t fy_argmax(const float *x, int32_t n)
{
    /* the running maximum in a register, not reloaded through x[best] */
    int32_t best = 0;
    float bv = x[0];
    for (int32_t i = 1; i < n; i++) {
        if (x[i] > bv) {
            bv = x[i];
            best = i;
        }
    }
    return best;
}

/* descending by logit, ties by ascending id: a total order, so the result
 * does not depend on the sort algorithm */
static int cand_cmp(const void *a, const void *b)
{
    const cand_t *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static bool cand_before(const cand_t *x, const cand_t *y)
{
    return x->logit > y->logit || (x->logit == y->logit && x->id < y->id);
}

/* Moves the k best candidates to the front (unordered), quickselect. */
static void select_top(cand_t *c, int32_t n, int32_t k)
{
    int32_t lo = 0, hi = n - 1;
    while (lo < hi) {
        cand_t pivot = c[lo + (hi - lo) / 2];
        int32_t i = lo, j = hi;
        while (i <= j) {
            while (cand_before(&c[i], &pivot)) i++;
            while (cand_before(&pivot, &c[j])) j--;
            if (i <= j) {
                cand_t t = c[i];
                c[i] = c[j];
                c[j] = t;
                i++;
                j--;
            }
        }
        if (k - 1 <= j)
            hi = j;
        else if (k - 1 >= i)
            lo = i;
        else
            break;
    }
}

/* Callers pass a temperature of at least FY_SAMPLING_MIN_TEMP (or 1 for
 * greedy).  A token far below the best one can still have a log-probability
 * beyond a float's range at small temperatures: it is clamped to
 * FY_LOGPROB_MIN rather than becoming -inf, which neither msgpack's range
 * checks nor JSON carry. */
static float full_logprob(const float *logits, int32_t n, float temp, int32_t id)
{
    double t = temp >= FY_SAMPLING_MIN_TEMP ? (double)temp : 1.0;
    float mx = logits[fy_argmax(logits, n)];
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++) sum += exp(((double)logits[i] - mx) / t);
    double lp = ((double)logits[id] - mx) / t - log(sum);
    return lp > FY_LOGPROB_MIN ? (float)lp : FY_LOGPROB_MIN;
}

/* The candidates sampling draws from: c[0, n) with unnormalized weights
 * s->p[0, n) summing to *total_p (temperature, top-k, min-p, top-p
 * applied).  Not for greedy parameters. */
static int32_t candidates(fy_sampler_t *s, const fy_sampling_params_t *p, const float *logits, double *total_p)
{
    int32_t V = s->vocab;
    float inv_t = 1.0f / p->temperature;
    cand_t *c = s->c;
    for (int32_t i = 0; i < V; i++) c[i] = (cand_t){logits[i] * inv_t, i};
    int32_t n = V;
    bool sorted = false;
    if (p->top_k > 0 && p->top_k < n) {
        select_top(c, n, p->top_k);
        n = p->top_k;
        qsort(c, (size_t)n, sizeof(cand_t), cand_cmp);
        sorted = true;
    }
    float mx = c[0].logit;
    for (int32_t i = 1; i < n; i++)
        if (c[i].logit > mx) mx = c[i].logit;
    double total = 0.0;
    for (int32_t i = 0; i < n; i++) total += (s->p[i] = exp((double)(c[i].logit - mx)));
    if (p->min_p > 0.0f) {
        /* the best candidate has weight exp(0) = 1 */
        double cut = (double)p->min_p;
        int32_t m = 0;
        total = 0.0;
        for (int32_t i = 0; i < n; i++) {
            if (s->p[i] >= cut) {
                c[m] = c[i];
                s->p[m] = s->p[i];
                total += s->p[m++];
            }
        }
        n = m;
    }
    if (p->top_p < 1.0f && n > 1) {
        if (!sorted) {
            /* a token with probability below (1 - top_p) / (n - 1) can
             * never be inside the nucleus (llama2.c's observation), except
             * the best one, which always is: for a small top_p over
             * near-equal weights the bound exceeds the best weight (1) */
            double cut = (1.0 - (double)p->top_p) / (double)(n - 1) * total;
            if (cut > 1.0) cut = 1.0;
            int32_t m = 0;
            for (int32_t i = 0; i < n; i++)
                if (s->p[i] >= cut) c[m++] = c[i];
            n = m;
            qsort(c, (size_t)n, sizeof(cand_t), cand_cmp);
            for (int32_t i = 0; i < n; i++) s->p[i] = exp((double)(c[i].logit - mx));
        }
        double acc = 0.0, want = (double)p->top_p * total;
        int32_t keep = n;
        for (int32_t i = 0; i < n; i++) {
            acc += s->p[i];
            if (acc >= want) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
        total = 0.0;
        for (int32_t i = 0; i < n; i++) total += s->p[i];
    }
    *total_p = total;
    return n;
}

int32_t fy_sampler_sample(fy_sampler_t *s, const fy_sampling_params_t *p, fy_rng_t *rng, const float *logits,
                          float *logprob_p)
{
    int32_t V = s->vocab;
    if (fy_sampling_is_greedy(p)) {
        int32_t best = fy_argmax(logits, V);
        if (logprob_p) *logprob_p = full_logprob(logits, V, 1.0f, best);
        return best;
    }
    cand_t *c = s->c;
    double total;
    int32_t n = candidates(s, p, logits, &total);
    double r = fy_rng_uniform(rng) * total;
    int32_t pick = c[n - 1].id;
    double acc = 0.0;
    for (int32_t i = 0; i < n; i++) {
        acc += s->p[i];
        if (r < acc) {
            pick = c[i].id;
            break;
        }
    }
    if (logprob_p) *logprob_p = full_logprob(logits, V, p->temperature, pick);
    return pick;
}

void fy_sampler_probs(fy_sampler_t *s, const fy_sampling_params_t *p, const float *logits, float *probs)
{
    int32_t V = s->vocab;
    memset(probs, 0, (size_t)V * sizeof(float));
    if (fy_sampling_is_greedy(p)) {
        probs[fy_argmax(logits, V)] = 1.0f;
        return;
    }
    double total;
    int32_t n = candidates(s, p, logits, &total);
    for (int32_t i = 0; i < n; i++) probs[s->c[i].id] = (float)(s->p[i] / total);
}

float fy_logprob(const float *logits, int32_t n, const fy_sampling_params_t *p, int32_t id)
{
    return full_logprob(logits, n, fy_sampling_is_greedy(p) ? 1.0f : p->temperature, id);
}

/*
 * test_spec.c - speculative decoding: greedy output token for token the
 * same with speculation off, with n-gram lookup and with draft models
 * (self-draft and a separate file), alone and in a batch, on the tiny and
 * the default model; a verification step's logits bit-identical to
 * one-at-a-time decoding; the rejection sampler's output distribution
 * against the target's (chi-square, fixed seed, with a wrong sampler as
 * the control that must fail); the n-gram proposer, the suffix lookup
 * against a brute-force reference, its tenant isolation, and the adaptive
 * controller; both KV pools holding exactly what their sequences need
 * after every step, and every block back at the end; a step's accepted
 * run streamed as one (every token but its last says more follow, and
 * the next token of the request comes from the same step).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "engine/engine.h"
#include "common/genspec.h"
#include "tests/gguf_writer.h"
#include "common/mem.h"
#include "model/model.h"
#include "model/prompt.h"
#include "engine/runner.h"
#include "engine/spec.h"
#include "tests/testutil.h"
#include "tests/tinymodel.h"

#define SEED 20261121ull
#define MAX_OUT 160
#define N_REQ 6

static char g_tiny[512], g_tiny_spec[520];

static int setup(void **state)
{
    fy_tiny_cfg_t c;
    fy_tiny_cfg_default(&c);
    c.n_layers = 4;
    c.max_ctx = 1024;
    fy_tiny_model_t tm;
    fy_tiny_init(&tm, &c);
    snprintf(g_tiny, sizeof(g_tiny), "%s", fy_test_path("tiny-spec.gguf"));
    bool ok = fy_tiny_write_gguf(&tm, g_tiny, GW_Q8_0);
    fy_tiny_free(&tm);
    snprintf(g_tiny_spec, sizeof(g_tiny_spec), "draft:%s", g_tiny);
    return ok ? 0 : -1;
}

static int teardown(void **state)
{
    fy_test_tmpdir_remove();
    return 0;
}

/* ---- the suffix lookup ---------------------------------------------------------------------------- */

/* Brute force: the longest suffix (at most FY_SPEC_SUFFIX_MATCH) that
 * occurs with a continuation, every occurrence listed by memcmp in the
 * documented order, then the majority walk with its tie rule. */
static int32_t suffix_reference(const int32_t *t, int32_t n, const fy_spec_text_t *src, int32_t n_src, int32_t k,
                                int32_t *out, float *freq, int32_t *match_p, bool *own_p)
{
    const int32_t *ct[FY_SPEC_SUFFIX_CANDS];
    int32_t cn[FY_SPEC_SUFFIX_CANDS], cat[FY_SPEC_SUFFIX_CANDS], nc = 0, m;
    for (m = n < FY_SPEC_SUFFIX_MATCH ? n : FY_SPEC_SUFFIX_MATCH; m >= 1 && nc == 0; m--) {
        const int32_t *suf = t + n - m;
        for (int32_t s = -1; s < n_src; s++) {
            const int32_t *x = s < 0 ? t : src[s].tokens;
            int32_t xn = s < 0 ? n : src[s].n;
            for (int32_t at = xn - 1; at >= m; at--)
                if (!memcmp(x + at - m, suf, (size_t)m * sizeof(int32_t)) && nc < FY_SPEC_SUFFIX_CANDS) {
                    ct[nc] = x;
                    cn[nc] = xn;
                    cat[nc++] = at;
                }
        }
    }
    *match_p = nc ? m + 1 : 0;
    *own_p = false;
    for (int32_t i = 0; i < nc; i++) *own_p |= ct[i] == t;
    int32_t np = 0;
    while (nc > 0 && np < k) {
        int32_t live = 0, pick = -1, best = 0;
        for (int32_t i = 0; i < nc; i++) {
            if (cat[i] + np >= cn[i]) continue;
            live++;
            int32_t tok = ct[i][cat[i] + np], votes = 0;
            for (int32_t j = 0; j < nc; j++) votes += cat[j] + np < cn[j] && ct[j][cat[j] + np] == tok;
            if (votes > best) { /* strictly more: the first in order keeps a tie */
                best = votes;
                pick = tok;
            }
        }
        if (!live) break;
        out[np] = pick;
        freq[np++] = (float)best / (float)live;
        int32_t kept = 0;
        for (int32_t i = 0; i < nc; i++)
            if (cat[i] + np - 1 < cn[i] && ct[i][cat[i] + np - 1] == pick) {
                ct[kept] = ct[i];
                cn[kept] = cn[i];
                cat[kept++] = cat[i];
            }
        nc = kept;
    }
    return np;
}

static void test_suffix_propose(void **state)
{
    uint64_t s = SEED;
    int32_t text[4][400];
    fy_spec_text_t src[3];
    for (int it = 0; it < 3000; it++) {
        /* small alphabets make long and many matches; the request's text
         * may end with a stretch copied from another (what a rewrite does) */
        int32_t alpha = 2 + (int32_t)(fy_test_rand_u64(&s) % 6), n_src = (int32_t)(fy_test_rand_u64(&s) % 4);
        int32_t len[4];
        for (int32_t x = 0; x <= n_src; x++) {
            len[x] = 1 + (int32_t)(fy_test_rand_u64(&s) % 400);
            for (int32_t j = 0; j < len[x]; j++) text[x][j] = (int32_t)(fy_test_rand_u64(&s) % (uint64_t)alpha);
            if (x > 0 && len[x] > 60 && len[0] > 60 && fy_test_rand_u64(&s) % 2)
                memcpy(text[0] + len[0] - 50, text[x] + 5, 50 * sizeof(int32_t));
        }
        for (int32_t x = 0; x < n_src; x++) src[x] = (fy_spec_text_t){text[x + 1], len[x + 1]};
        int32_t k = 1 + (int32_t)(fy_test_rand_u64(&s) % FY_SPEC_MAX_K);
        int32_t got[FY_SPEC_MAX_K], want[FY_SPEC_MAX_K], gm = -1, wm = -1;
        float gf[FY_SPEC_MAX_K], wf[FY_SPEC_MAX_K];
        bool own;
        int32_t ng = fy_spec_suffix_propose(text[0], len[0], src, n_src, k, got, gf, &gm, &own);
        bool wown;
        int32_t nw = suffix_reference(text[0], len[0], src, n_src, k, want, wf, &wm, &wown);
        if (ng != nw || gm != wm || own != wown || memcmp(got, want, (size_t)ng * sizeof(int32_t)) ||
            memcmp(gf, wf, (size_t)ng * sizeof(float)))
            fail_msg("seed %llu, iteration %d: proposed %d (match %d), reference %d (match %d)",
                     (unsigned long long)SEED, it, ng, gm, nw, wm);
    }
    /* the copy in progress is continued: "7 8 9 1 2 3 7 8" -> 9 1 2 3 */
    int32_t t[] = {7, 8, 9, 1, 2, 3, 7, 8}, out[4];
    float f[4];
    int32_t m;
    assert_int_equal(fy_spec_suffix_propose(t, 8, NULL, 0, 4, out, f, &m, NULL), 4);
    assert_int_equal(m, 2);
    assert_int_equal(out[0], 9);
    assert_int_equal(out[3], 3);
    assert_true(f[0] == 1.0f);
    /* nothing to match: nothing proposed */
    int32_t u[] = {1, 2, 3};
    assert_int_equal(fy_spec_suffix_propose(u, 3, NULL, 0, 4, out, f, &m, NULL), 0);
    assert_int_equal(m, 0);
}

/* A tenant's history never reaches another tenant: tenant B's texts hold
 * tokens 1000.. that appear nowhere in A's, and A's request ends with
 * tokens B's texts continue; no proposal A gets holds a token it has not
 * itself seen. */
static void test_suffix_tenants(void **state)
{
    uint64_t s = SEED + 1;
    fy_spec_hist_t *h;
    assert_int_equal(fy_spec_hist_create(4, 64, &h), FY_OK);
    fy_kv_ns_t a = {{{1}}}, b = {{{2}}};
    int32_t ta[3][100], tb[3][100], req[40];
    for (int i = 0; i < 3; i++) {
        for (int j = 0; j < 100; j++) {
            ta[i][j] = (int32_t)(fy_test_rand_u64(&s) % 50);
            tb[i][j] = j % 10 < 3 ? (int32_t)(fy_test_rand_u64(&s) % 50) : 1000 + (int32_t)(fy_test_rand_u64(&s) % 50);
        }
        fy_spec_hist_add(h, &b, tb[i], 100);
        fy_spec_hist_add(h, &a, ta[i], 100); /* the slots cycle: only the newest 4 stay */
    }
    fy_spec_text_t src[8];
    assert_int_equal(fy_spec_hist_texts(h, &b, src, 8), 2);
    assert_true(src[0].n == 64 && src[0].tokens[63] == tb[2][99]); /* newest first, the tail kept */
    int32_t n = fy_spec_hist_texts(h, &a, src, 8);
    assert_int_equal(n, 2);
    int32_t hits = 0;
    for (int it = 0; it < 300; it++) {
        /* a request of A whose text ends like a stretch of B's */
        for (int j = 0; j < 40; j++) req[j] = (int32_t)(fy_test_rand_u64(&s) % 50);
        int32_t at = 40 + (int32_t)(fy_test_rand_u64(&s) % 50), len = 1 + (int32_t)(fy_test_rand_u64(&s) % 3);
        memcpy(req + 40 - len, tb[2] + at - len, (size_t)len * sizeof(int32_t));
        int32_t out[FY_SPEC_MAX_K], m;
        int32_t np = fy_spec_suffix_propose(req, 40, src, n, FY_SPEC_MAX_K, out, NULL, &m, NULL);
        for (int32_t i = 0; i < np; i++) {
            bool own = false;
            for (int j = 0; j < 40; j++) own |= req[j] == out[i];
            if (out[i] >= 1000 && !own) fail_msg("iteration %d: tenant A was proposed B's token %d", it, out[i]);
        }
        /* B's own lookups do find those continuations (the control) */
        fy_spec_text_t bs[8];
        int32_t nb = fy_spec_hist_texts(h, &b, bs, 8);
        np = fy_spec_suffix_propose(req, 40, bs, nb, FY_SPEC_MAX_K, out, NULL, &m, NULL);
        for (int32_t i = 0; i < np; i++) hits += out[i] >= 1000;
    }
    assert_true(hits > 0);
    fy_spec_hist_destroy(h);
}

/* ---- the n-gram proposer ------------------------------------------------------------------------ */

static void test_ngram_propose(void **state)
{
    int32_t out[8];
    /* "a b c d a b" -> after the earlier "a b": c d a b */
    int32_t t1[] = {1, 2, 3, 4, 1, 2};
    assert_int_equal(fy_spec_ngram_propose(t1, 6, 3, 4, out), 4);
    assert_int_equal(out[0], 3);
    assert_int_equal(out[1], 4);
    assert_int_equal(out[2], 1);
    assert_int_equal(out[3], 2);
    /* k bounds it */
    assert_int_equal(fy_spec_ngram_propose(t1, 6, 3, 1, out), 1);
    assert_int_equal(out[0], 3);
    /* the longest n wins: "9 2" occurs once followed by 7; "2" most recently followed by 5 */
    int32_t t2[] = {9, 2, 7, 8, 2, 5, 6, 9, 2};
    assert_int_equal(fy_spec_ngram_propose(t2, 9, 2, 1, out), 1);
    assert_int_equal(out[0], 7);
    assert_int_equal(fy_spec_ngram_propose(t2, 9, 1, 1, out), 1);
    assert_int_equal(out[0], 5);
    /* no earlier occurrence */
    int32_t t3[] = {1, 2, 3, 4};
    assert_int_equal(fy_spec_ngram_propose(t3, 4, 3, 4, out), 0);
    /* the most recent occurrence is the one right before the suffix: 5 5 5 -> 5 */
    int32_t t4[] = {5, 5, 5};
    assert_int_equal(fy_spec_ngram_propose(t4, 3, 2, 4, out), 1);
    assert_int_equal(out[0], 5);
    assert_int_equal(fy_spec_ngram_propose(t4, 1, 2, 4, out), 0);
}

/* ---- the adaptive controller ---------------------------------------------------------------------- */

static void test_ctl(void **state)
{
    fy_spec_params_t p;
    fy_spec_params_default(&p);
    p.k_max = 6;
    p.min_accept = 0.5;
    p.warmup = 8;
    p.probe_steps = 5;
    fy_spec_ctl_t c;
    fy_spec_ctl_init(&c, &p);
    int32_t k = fy_spec_ctl_want(&c);
    assert_true(k >= 1 && k <= 6);
    /* full accepts grow k up to k_max */
    for (int i = 0; i < 10; i++) assert_false(fy_spec_ctl_update(&c, &p, fy_spec_ctl_want(&c), c.k));
    assert_int_equal(fy_spec_ctl_want(&c), 6);
    /* rejections bring k down with the rate */
    for (int i = 0; i < 8; i++) fy_spec_ctl_update(&c, &p, 6, 3);
    k = fy_spec_ctl_want(&c);
    assert_true(k >= 2 && k <= 5);
    /* a run of rejections turns it off once the rate falls under 0.5 */
    bool off = false;
    for (int i = 0; i < 40 && !off; i++) off = fy_spec_ctl_update(&c, &p, fy_spec_ctl_want(&c), 0);
    assert_true(off);
    assert_int_equal(c.disabled, 1);
    /* off for probe_steps steps, then probed with k = 1 */
    for (int i = 0; i < 5; i++) assert_int_equal(fy_spec_ctl_want(&c), 0);
    assert_int_equal(fy_spec_ctl_want(&c), 1);
    /* the probe is judged afresh: good acceptance keeps it on */
    for (int i = 0; i < 20; i++) assert_false(fy_spec_ctl_update(&c, &p, fy_spec_ctl_want(&c), c.k));
    assert_true(fy_spec_ctl_want(&c) > 1);
}

/* ---- the rejection sampler -------------------------------------------------------------------------- */

enum { V = 6, TRIALS = 100000 };

/* chi-square of counts against probabilities p over V cells */
static double chi2(const long *count, const float *p, long n)
{
    double x = 0;
    for (int v = 0; v < V; v++) {
        double e = p[v] * (double)n;
        if (e > 0)
            x += (count[v] - e) * (count[v] - e) / e;
        else if (count[v])
            return INFINITY;
    }
    return x;
}

static int32_t draw_from(const float *q, fy_rng_t *rng)
{
    double r = fy_rng_uniform(rng), acc = 0;
    for (int v = 0; v < V; v++) {
        acc += q[v];
        if (r < acc) return v;
    }
    return V - 1;
}

/* 99.9% quantile of chi-square with 5 degrees of freedom */
#define CHI2_5_999 20.515

static void test_rejection_sampler(void **state)
{
    /* target and draft disagree a lot; the draft puts mass where the
     * target has none (token 5) and misses token 4 */
    static const float p0[V] = {0.30f, 0.05f, 0.20f, 0.15f, 0.30f, 0.00f};
    static const float q0[V] = {0.10f, 0.40f, 0.20f, 0.20f, 0.00f, 0.10f};
    static const float p1[V] = {0.05f, 0.05f, 0.50f, 0.10f, 0.10f, 0.20f};
    static const float q1[V] = {0.30f, 0.10f, 0.10f, 0.30f, 0.10f, 0.10f};
    static const float p2[V] = {0.10f, 0.20f, 0.30f, 0.10f, 0.20f, 0.10f};
    const float *p[3] = {p0, p1, p2}, *q[2] = {q0, q1};
    float scratch[V];
    fy_rng_t rng, drng;
    fy_rng_seed(&rng, SEED);
    fy_rng_seed(&drng, SEED + 1);
    long c0[V] = {0}, c1[V] = {0}, wrong[V] = {0}, subtle[V] = {0}, n1 = 0, acc = 0;
    for (long t = 0; t < TRIALS; t++) {
        int32_t d[2] = {draw_from(q0, &drng), draw_from(q1, &drng)}, out[3];
        int32_t a = fy_spec_verify_sampled(p, q, d, 2, V, &rng, scratch, out);
        assert_true(a >= 0 && a <= 2);
        acc += a;
        c0[out[0]]++;
        if (a >= 1) { /* the token after an accepted first one comes from p1 */
            c1[out[1]]++;
            n1++;
        }
        wrong[d[0]]++; /* the control: taking the draft as it is */
        /* a subtler control: the rejection test right, but the
         * replacement drawn from p instead of the residual */
        if (fy_rng_uniform(&drng) * q0[d[0]] < p0[d[0]])
            subtle[d[0]]++;
        else
            subtle[draw_from(p0, &drng)]++;
    }
    double x0 = chi2(c0, p0, TRIALS), x1 = chi2(c1, p1, n1), xw = chi2(wrong, p0, TRIALS);
    double xs = chi2(subtle, p0, TRIALS);
    printf("rejection sampler: chi2 position 0 %.2f, position 1 %.2f (%ld samples); controls: always accept %.1f, "
           "replacement from p %.1f; %.3f accepted per step (seed %llu)\n",
           x0, x1, n1, xw, xs, (double)acc / TRIALS, (unsigned long long)SEED);
    assert_true(x0 < CHI2_5_999);
    assert_true(x1 < CHI2_5_999);
    /* the test can tell a wrong sampler */
    assert_true(xw > 100 * CHI2_5_999);
    assert_true(xs > 10 * CHI2_5_999);
    /* the first position is accepted with probability sum min(p, q) = 0.5 */
    assert_true(n1 > (long)(0.49 * TRIALS) && n1 < (long)(0.51 * TRIALS));

    /* a point-mass draft (n-gram): accepted with probability p(x) */
    long cp[V] = {0};
    int32_t x = 2;
    long accepted = 0;
    for (long t = 0; t < TRIALS; t++) {
        int32_t out[2];
        int32_t a = fy_spec_verify_sampled(p, NULL, &x, 1, V, &rng, scratch, out);
        accepted += a;
        cp[out[0]]++;
    }
    double xp = chi2(cp, p0, TRIALS);
    printf("point-mass draft: chi2 %.2f, accepted %.4f (p(x) = 0.2)\n", xp, (double)accepted / TRIALS);
    assert_true(xp < CHI2_5_999);
    assert_true(fabs((double)accepted / TRIALS - 0.2) < 0.01);
    /* a point mass on a token the target never draws is always rejected */
    x = 5;
    for (int t = 0; t < 1000; t++) {
        int32_t out[2];
        assert_int_equal(fy_spec_verify_sampled(p, NULL, &x, 1, V, &rng, scratch, out), 0);
        assert_true(out[0] != 5);
    }
}

/* ---- engine rigs ----------------------------------------------------------------------------------- */

typedef struct result {
    int32_t tokens[MAX_OUT];
    int32_t n;
    int terminal;
    fy_event_kind_t kind;
    int32_t n_proposed, n_accepted;
    int32_t n_more; /* tokens whose event said more of the step follow */
    bool prev_more; /* the last token's */
    long prev_step; /* and the step it came in */
} result_t;

static long g_step; /* the engine steps rig_drain made */

static void on_event(void *arg, const fy_event_t *ev)
{
    result_t *r = arg;
    assert_int_equal(r->terminal, 0);
    if (ev->kind == FY_EVENT_TOKEN) { /* more: the request's next token is of the same step */
        if (r->n > 0 && r->prev_more && g_step != r->prev_step)
            fail_msg("token %d said more follow in step %ld; the next came in step %ld", r->n - 1, r->prev_step,
                     g_step);
        if (r->n > 0 && !r->prev_more && g_step == r->prev_step)
            fail_msg("token %d was its step's last, yet token %d came in the same step", r->n - 1, r->n);
        r->prev_more = ev->more;
        r->prev_step = g_step;
        r->n_more += ev->more;
    }
    if (ev->kind == FY_EVENT_TOKEN && r->n < MAX_OUT) r->tokens[r->n++] = ev->token;
    if (ev->kind != FY_EVENT_TOKEN) {
        r->terminal++;
        r->kind = ev->kind;
        r->n_proposed = ev->timings->n_spec_proposed;
        r->n_accepted = ev->timings->n_spec_accepted;
    }
}

typedef struct rig {
    fy_model_t *m;
    fy_backend_t *be;
    fy_runner_t *r;
    fy_kv_hasher_t *hasher;
    fy_kvm_t *kvm;
    fy_spec_draft_t *draft;
    fy_engine_t *e;
    int vocab;
} rig_t;

/* spec: NULL (none), "ngram", "suffix", or a draft ("self:L", "draft:FILE") */
static void rig_open(rig_t *g, const char *model, const char *spec, const fy_spec_params_t *sp_in, int32_t blocks)
{
    memset(g, 0, sizeof(*g));
    assert_int_equal(fy_model_load(model, &g->m), FY_OK);
    g->vocab = fy_model_config(g->m)->vocab_size;
    fy_backend_params_t bp = {.n_threads = 2};
    assert_int_equal(fy_backend_create("cpu", &bp, &g->be), FY_OK);
    fy_runner_params_t rp;
    fy_runner_params_default(&rp);
    rp.max_batch_tokens = 256;
    rp.max_seqs = 8;
    rp.max_logits = 64;
    rp.max_ctx = 1024;
    rp.n_kv_blocks = blocks;
    assert_int_equal(fy_runner_create(g->m, g->be, &rp, &g->r), FY_OK);
    assert_int_equal(fy_kv_hasher_create_random(&g->hasher), FY_OK);
    fy_kvm_params_t kp;
    fy_runner_kvm_params(g->r, &kp);
    kp.hasher = g->hasher;
    kp.prefix_caching = false;
    kp.watermark = 0;
    assert_int_equal(fy_kvm_create(&kp, &g->kvm), FY_OK);
    fy_engine_params_t ep;
    fy_engine_params_default(&ep);
    ep.max_num_seqs = 8;
    ep.max_num_batched_tokens = 256;
    if (sp_in) ep.spec = *sp_in;
    if (spec && !strcmp(spec, "ngram")) { /* issue 8's lookup */
        ep.spec.method = FY_SPEC_NGRAM;
        ep.spec.lookup = FY_SPEC_LOOKUP_NGRAM;
    } else if (spec && !strcmp(spec, "suffix")) { /* with the tenant's history: alone, requests see earlier ones */
        ep.spec.method = FY_SPEC_NGRAM;
        ep.spec.lookup = FY_SPEC_LOOKUP_SUFFIX;
        ep.spec.history = 16;
    } else if (spec) {
        assert_int_equal(fy_spec_draft_open(spec, g->r, 0, g->hasher, &g->draft), FY_OK);
        ep.spec.method = FY_SPEC_DRAFT;
        ep.spec.draft = fy_spec_draft_runner(g->draft);
        ep.spec.draft_kvm = fy_spec_draft_kvm(g->draft);
    }
    assert_int_equal(fy_engine_create(g->r, g->kvm, fy_model_tokenizer(g->m), &ep, &g->e), FY_OK);
}

/* Steps until idle, checking after every step that both caches hold
 * exactly what the running requests need. */
static void rig_drain(rig_t *g)
{
    for (int i = 0; i < 100000 && !fy_engine_idle(g->e); i++) {
        g_step++;
        assert_int_equal(fy_engine_step(g->e), FY_OK);
        assert_int_equal(fy_engine_check(g->e), FY_OK);
    }
    assert_true(fy_engine_idle(g->e));
}

static void rig_close(rig_t *g, fy_engine_stats_t *st_p)
{
    if (st_p) fy_engine_stats(g->e, st_p);
    fy_engine_destroy(g->e);
    fy_kvm_stats_t ks;
    fy_kvm_stats(g->kvm, &ks);
    assert_int_equal(ks.tier[FY_KV_DEVICE].used, 0); /* every block back */
    assert_int_equal(ks.tier[FY_KV_DEVICE].free, ks.tier[FY_KV_DEVICE].total);
    assert_int_equal(ks.promised, 0);
    assert_int_equal(fy_kvm_check(g->kvm), FY_OK);
    if (g->draft) {
        fy_kvm_stats(fy_spec_draft_kvm(g->draft), &ks);
        assert_int_equal(ks.tier[FY_KV_DEVICE].used, 0);
        assert_int_equal(ks.tier[FY_KV_DEVICE].free, ks.tier[FY_KV_DEVICE].total);
        assert_int_equal(fy_kvm_check(fy_spec_draft_kvm(g->draft)), FY_OK);
    }
    fy_spec_draft_destroy(g->draft);
    fy_kvm_destroy(g->kvm);
    fy_kv_hasher_destroy(g->hasher);
    fy_runner_destroy(g->r);
    fy_backend_destroy(g->be);
    fy_model_destroy(g->m);
}

typedef struct workload {
    int32_t prompt[N_REQ][200];
    int32_t len[N_REQ];
    fy_genspec_t rp[N_REQ];
} workload_t;

/* Prompts that repeat a phrase (text to copy) and random ones, of
 * different lengths; greedy, or seeded sampling when sampled. */
static void make_workload(workload_t *w, int vocab, int32_t max_tokens, bool sampled)
{
    uint64_t s = SEED;
    for (int i = 0; i < N_REQ; i++) {
        int32_t n = 20 + 23 * i % 120, phrase = 5 + i;
        for (int32_t j = 0; j < n; j++)
            w->prompt[i][j] = i % 2 && j >= phrase ? w->prompt[i][j % phrase]
                                                   : (int32_t)(fy_test_rand_u64(&s) % (uint64_t)(vocab - 3));
        w->len[i] = n;
        fy_genspec_default(&w->rp[i]);
        w->rp[i].max_tokens = max_tokens - 7 * i;
        w->rp[i].ignore_eos = true;
        if (sampled)
            w->rp[i].sampling =
                (fy_sampling_params_t){.temperature = 0.3f, .top_k = 0, .top_p = 0.95f, .seed = SEED + (uint64_t)i};
    }
}

/* Runs the workload on a fresh rig, each request alone or all at once. */
static void run(const char *model, const char *spec, const fy_spec_params_t *sp, const workload_t *w, int n_req,
                bool batch, result_t *res, fy_engine_stats_t *st)
{
    rig_t g;
    rig_open(&g, model, spec, sp, 512);
    memset(res, 0, sizeof(result_t) * (size_t)n_req);
    for (int i = 0; i < n_req; i++) {
        uint64_t id;
        assert_int_equal(fy_engine_submit(g.e, w->prompt[i], w->len[i], &w->rp[i], NULL, on_event, &res[i], &id),
                         FY_OK);
        if (!batch) rig_drain(&g);
    }
    rig_drain(&g);
    for (int i = 0; i < n_req; i++) {
        assert_int_equal(res[i].terminal, 1);
        assert_int_equal(res[i].kind, FY_EVENT_FINISH);
    }
    rig_close(&g, st);
}

static void check_same(const char *what, const result_t *a, const result_t *b, int n_req)
{
    for (int i = 0; i < n_req; i++) {
        int32_t at = -1;
        for (int32_t j = 0; j < a[i].n && j < b[i].n && at < 0; j++)
            if (a[i].tokens[j] != b[i].tokens[j]) at = j;
        if (a[i].n != b[i].n || at >= 0)
            fail_msg("%s: request %d: %d tokens without speculation, %d with; first difference at %d", what, i, a[i].n,
                     b[i].n, at);
    }
}

static void report(const char *what, const fy_engine_stats_t *st)
{
    printf("%-28s proposed %5llu, accepted %5llu (%5.1f%%), %4llu verifications, mean accepted %.2f, "
           "request offs %llu, worker offs %llu\n",
           what, (unsigned long long)st->spec_proposed, (unsigned long long)st->spec_accepted,
           st->spec_proposed ? 100.0 * (double)st->spec_accepted / (double)st->spec_proposed : 0.0,
           (unsigned long long)st->spec_steps,
           st->spec_steps ? (double)st->spec_accepted / (double)st->spec_steps : 0.0,
           (unsigned long long)st->spec_request_offs, (unsigned long long)st->spec_worker_offs);
}

/* Greedy output with each proposer, alone and batched, equals the
 * output without speculation; proposals were both accepted and
 * rejected, so both paths ran. */
static void greedy_identity(const char *model, int n_req, int32_t max_tokens, const char *const *specs, int n_specs)
{
    workload_t *w = calloc(1, sizeof(*w));
    rig_t g;
    rig_open(&g, model, NULL, NULL, 64);
    make_workload(w, g.vocab, max_tokens, false);
    rig_close(&g, NULL);
    result_t *ref = calloc(N_REQ, sizeof(result_t)), *got = calloc(N_REQ, sizeof(result_t));
    fy_engine_stats_t st;
    run(model, NULL, NULL, w, n_req, false, ref, &st);
    assert_int_equal(st.spec_proposed, 0);
    for (int i = 0; i < n_req; i++) assert_int_equal(ref[i].n_more, 0); /* a token a step */
    fy_spec_params_t sp;
    fy_spec_params_default(&sp);
    sp.min_accept = 0;     /* never off: every step verifies */
    sp.cost_aware = false; /* and proposes, however the steps are timed */
    for (int s = 0; s < n_specs; s++) {
        for (int batch = 0; batch < 2; batch++) {
            char what[600];
            snprintf(what, sizeof(what), "%s %s", specs[s], batch ? "batched" : "alone");
            const char *name = strrchr(what, '/') ? strrchr(what, '/') + 1 : what;
            run(model, specs[s], &sp, w, n_req, batch, got, &st);
            report(name, &st);
            check_same(name, ref, got, n_req);
            assert_true(st.spec_accepted > 0);
            /* accepted runs went out as runs: each accepted token but
             * those past a request's end said more follow */
            int64_t more = 0;
            for (int i = 0; i < n_req; i++) more += got[i].n_more;
            assert_true(more > 0 && more <= (int64_t)st.spec_accepted);
            if (strncmp(specs[s], "draft:", 6))
                assert_true(st.spec_accepted < st.spec_proposed);
            else
                assert_true(st.spec_accepted == st.spec_proposed); /* the same model as its own draft */
        }
    }
    free(w);
    free(ref);
    free(got);
}

static void test_greedy_identity_tiny(void **state)
{
    const char *specs[] = {"ngram", "suffix", "self:1", "self:3", g_tiny_spec};
    greedy_identity(g_tiny, N_REQ, 120, specs, 5);
}

static void test_greedy_identity_default(void **state)
{
    const char *model = fy_test_default_model();
    if (!model) skip();
    const char *specs[] = {"ngram", "suffix", "self:20"};
    greedy_identity(model, 3, 40, specs, 3);
}

/* Chat prompts on the default model, one a rewrite (the answer copies the
 * prompt) and one open: the same greedy text with the suffix lookup (and
 * issue 8's n-gram lookup) as without speculation, end of turn honoured;
 * the rewrite accepts most of what is proposed. */
static void test_greedy_chat_default(void **state)
{
    const char *model = fy_test_default_model();
    if (!model) skip();
    static const char *const prompts[2] = {
        "Rewrite the following text, correcting the typos:\n\nThe quick brown fox jumpd over the lazy dog. It was a "
        "sunny day in the village, and the childen were playing in the park near the old church.",
        "Write a short story about a robot who learns to paint.",
    };
    workload_t *w = calloc(1, sizeof(*w));
    fy_model_t *m;
    assert_int_equal(fy_model_load(model, &m), FY_OK);
    for (int i = 0; i < 2; i++) {
        int32_t *ids, n;
        assert_int_equal(fy_prompt_tokens(m, NULL, prompts[i], true, &ids, &n), FY_OK);
        assert_true(n <= 200);
        memcpy(w->prompt[i], ids, (size_t)n * sizeof(int32_t));
        w->len[i] = n;
        fy_free(ids);
        fy_genspec_default(&w->rp[i]);
        w->rp[i].max_tokens = 48;
    }
    fy_model_destroy(m);
    result_t ref[2], got[2];
    fy_engine_stats_t st;
    run(model, NULL, NULL, w, 2, false, ref, &st);
    fy_spec_params_t sp;
    fy_spec_params_default(&sp);
    sp.min_accept = 0;
    sp.cost_aware = false;
    const char *specs[] = {"suffix", "ngram"};
    for (int s = 0; s < 2; s++) {
        run(model, specs[s], &sp, w, 2, false, got, &st);
        char what[64];
        snprintf(what, sizeof(what), "chat %s", specs[s]);
        report(what, &st);
        check_same(what, ref, got, 2);
        assert_true(got[0].n_accepted * 2 > got[0].n_proposed); /* the rewrite copies */
    }
    free(w);
}

/* Sampled requests with each proposer finish, are reproducible for the
 * same seed and batch, and leave both pools as they were. */
static void test_sampled(void **state)
{
    workload_t *w = calloc(1, sizeof(*w));
    rig_t g;
    rig_open(&g, g_tiny, NULL, NULL, 64);
    make_workload(w, g.vocab, 100, true);
    rig_close(&g, NULL);
    result_t *a = calloc(N_REQ, sizeof(result_t)), *b = calloc(N_REQ, sizeof(result_t));
    fy_spec_params_t sp;
    fy_spec_params_default(&sp);
    sp.min_accept = 0;
    sp.cost_aware = false;
    sp.sampled = true;
    const char *specs[] = {"ngram", "self:2", g_tiny_spec};
    for (int s = 0; s < 3; s++) {
        fy_engine_stats_t st;
        run(g_tiny, specs[s], &sp, w, N_REQ, true, a, &st);
        report(s == 2 ? "sampled draft:FILE" : specs[s], &st);
        assert_true(st.spec_proposed > 0 && st.spec_accepted > 0);
        run(g_tiny, specs[s], &sp, w, N_REQ, true, b, &st);
        check_same("sampled, run twice", a, b, N_REQ);
        for (int i = 0; i < N_REQ; i++) assert_int_equal(a[i].n, w->rp[i].max_tokens);
    }
    free(w);
    free(a);
    free(b);
}

/* A verification step computes each token's logits with the same bits
 * as decoding them one at a time (9 tokens: the 512-bit two-group matmul
 * runs for 8 tokens or more, the 256-bit one for a single token). */
static void verify_bits(const char *model)
{
    rig_t g;
    rig_open(&g, model, NULL, NULL, 64);
    enum { P = 40, K = 9 };
    int32_t toks[P + K];
    uint64_t s = SEED;
    for (int i = 0; i < P + K; i++) toks[i] = (int32_t)(fy_test_rand_u64(&s) % (uint64_t)(g.vocab - 3));
    fy_block_table_t a, b;
    assert_int_equal(fy_kvm_seq_init(g.kvm, &a, 1024, NULL), FY_OK);
    assert_int_equal(fy_kvm_seq_init(g.kvm, &b, 1024, NULL), FY_OK);
    float *one = malloc(sizeof(float) * (size_t)K * (size_t)g.vocab);
    float *many = malloc(sizeof(float) * (size_t)K * (size_t)g.vocab);
    float *last = malloc(sizeof(float) * (size_t)g.vocab);
    /* the prompt in both tables */
    fy_block_table_t *bts[2] = {&a, &b};
    for (int t = 0; t < 2; t++) {
        assert_int_equal(fy_kvm_seq_reserve(g.kvm, bts[t], P, NULL), FY_OK);
        fy_forward_seq_t f = {.bt = bts[t], .tokens = toks, .n_tokens = P, .pos = 0, .n_logits = 1};
        assert_int_equal(fy_runner_forward(g.r, &f, 1, last), FY_OK);
        fy_kvm_seq_commit(g.kvm, bts[t], toks, P, NULL);
    }
    /* K tokens one at a time in a, all at once in b */
    for (int i = 0; i < K; i++) {
        assert_int_equal(fy_kvm_seq_reserve(g.kvm, &a, P + i + 1, NULL), FY_OK);
        fy_forward_seq_t f = {.bt = &a, .tokens = toks + P + i, .n_tokens = 1, .pos = P + i, .n_logits = 1};
        assert_int_equal(fy_runner_forward(g.r, &f, 1, one + (size_t)i * (size_t)g.vocab), FY_OK);
        fy_kvm_seq_commit(g.kvm, &a, toks, P + i + 1, NULL);
    }
    assert_int_equal(fy_kvm_seq_reserve(g.kvm, &b, P + K, NULL), FY_OK);
    fy_forward_seq_t f = {.bt = &b, .tokens = toks + P, .n_tokens = K, .pos = P, .n_logits = K};
    assert_int_equal(fy_runner_forward(g.r, &f, 1, many), FY_OK);
    for (int i = 0; i < K; i++)
        if (memcmp(one + (size_t)i * (size_t)g.vocab, many + (size_t)i * (size_t)g.vocab,
                   sizeof(float) * (size_t)g.vocab))
            fail_msg("%s: token %d of a %d-token verification differs from decoding it alone", model, i, K);
    fy_kvm_seq_release(g.kvm, &a);
    fy_kvm_seq_release(g.kvm, &b);
    fy_kvm_seq_deinit(&a);
    fy_kvm_seq_deinit(&b);
    free(one);
    free(many);
    free(last);
    rig_close(&g, NULL);
}

static void test_verify_bits(void **state)
{
    verify_bits(g_tiny);
    const char *model = fy_test_default_model();
    if (model) verify_bits(model);
}

/* A request overrides the deployment's proposer; a draft where there is
 * none is refused. */
static void test_request_override(void **state)
{
    workload_t *w = calloc(1, sizeof(*w));
    rig_t g;
    rig_open(&g, g_tiny, NULL, NULL, 64);
    make_workload(w, g.vocab, 60, false);
    rig_close(&g, NULL);
    result_t res[2];
    fy_engine_stats_t st;
    fy_spec_params_t sp;
    fy_spec_params_default(&sp);
    sp.cost_aware = false;
    /* none deployed, ngram asked */
    rig_open(&g, g_tiny, NULL, &sp, 512);
    memset(res, 0, sizeof(res));
    w->rp[1].spec = FY_SPEC_NGRAM;
    uint64_t id;
    assert_int_equal(fy_engine_submit(g.e, w->prompt[1], w->len[1], &w->rp[1], NULL, on_event, &res[0], &id), FY_OK);
    w->rp[1].spec = FY_SPEC_DRAFT;
    fy_test_log_begin();
    assert_int_equal(fy_engine_submit(g.e, w->prompt[1], w->len[1], &w->rp[1], NULL, on_event, &res[1], &id),
                     FY_ERR_INVALID);
    fy_test_log_end();
    assert_true(fy_test_log_has("no draft model", NULL));
    rig_drain(&g);
    assert_true(res[0].n_proposed > 0);
    rig_close(&g, &st);
    assert_true(st.spec_proposed > 0);
    /* ngram deployed, none asked */
    rig_open(&g, g_tiny, "ngram", &sp, 512);
    memset(res, 0, sizeof(res));
    w->rp[1].spec = FY_SPEC_NONE;
    assert_int_equal(fy_engine_submit(g.e, w->prompt[1], w->len[1], &w->rp[1], NULL, on_event, &res[0], &id), FY_OK);
    rig_drain(&g);
    rig_close(&g, &st);
    assert_int_equal(st.spec_proposed, 0);
    assert_int_equal(res[0].n_proposed, 0);
    /* a sampled request speculates by default only where the deployment
     * says sampled requests may (its seed then no longer fixes its tokens
     * under load); asking for it explicitly always works */
    w->rp[1].sampling = (fy_sampling_params_t){.temperature = 0.3f, .top_p = 1.0f, .seed = 5};
    for (int ask = 0; ask < 2; ask++) {
        rig_open(&g, g_tiny, "ngram", &sp, 512);
        memset(res, 0, sizeof(res));
        w->rp[1].spec = ask ? FY_SPEC_NGRAM : FY_SPEC_DEFAULT;
        assert_int_equal(fy_engine_submit(g.e, w->prompt[1], w->len[1], &w->rp[1], NULL, on_event, &res[0], &id),
                         FY_OK);
        rig_drain(&g);
        rig_close(&g, &st);
        if (ask)
            assert_true(res[0].n_proposed > 0);
        else
            assert_int_equal(res[0].n_proposed, 0);
    }
    free(w);
}

/* Low acceptance turns speculation off for requests and for the worker;
 * a batch with no room under batch_tokens proposes nothing. */
static void test_backoff(void **state)
{
    workload_t *w = calloc(1, sizeof(*w));
    rig_t g;
    rig_open(&g, g_tiny, NULL, NULL, 64);
    make_workload(w, g.vocab, 100, false);
    rig_close(&g, NULL);
    result_t *res = calloc(N_REQ, sizeof(result_t));
    fy_spec_params_t sp;
    fy_spec_params_default(&sp);
    sp.min_accept = 0.99;
    sp.probe_steps = 8;
    sp.cost_aware = false;
    fy_engine_stats_t st;
    run(g_tiny, "self:1", &sp, w, N_REQ, true, res, &st);
    report("self:1, min_accept 0.99", &st);
    assert_true(st.spec_request_offs > 0);
    assert_true(st.spec_worker_offs > 0);
    /* 6 decoding requests and a budget of 6 tokens: nothing to spare */
    fy_spec_params_default(&sp);
    sp.min_accept = 0;
    sp.batch_tokens = N_REQ;
    for (int i = 0; i < N_REQ; i++) w->rp[i].max_tokens = 40;
    rig_open(&g, g_tiny, "ngram", &sp, 512);
    uint64_t id;
    memset(res, 0, sizeof(result_t) * N_REQ);
    for (int i = 0; i < N_REQ; i++)
        assert_int_equal(fy_engine_submit(g.e, w->prompt[i], w->len[i], &w->rp[i], NULL, on_event, &res[i], &id),
                         FY_OK);
    rig_drain(&g);
    rig_close(&g, &st);
    report("ngram, batch_tokens 6", &st);
    assert_int_equal(st.spec_proposed, 0);
    free(w);
    free(res);
}

/* Bad specifications are refused with the reason. */
static void test_bad_input(void **state)
{
    rig_t g;
    rig_open(&g, g_tiny, NULL, NULL, 64);
    fy_spec_draft_t *d = NULL;
    const char *bad[] = {"self:0", "self:5", "self:x", "self:", "draft:", "gibberish", "draft:/nonexistent/file.gguf"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        fy_test_log_begin();
        assert_int_not_equal(fy_spec_draft_open(bad[i], g.r, 0, g.hasher, &d), FY_OK);
        fy_test_log_end();
        assert_null(d);
        assert_true(strlen(fy_test_log_text()) > 0);
    }
    fy_spec_params_t sp;
    fy_spec_params_default(&sp);
    sp.method = FY_SPEC_DRAFT; /* without a draft */
    fy_test_log_begin();
    assert_int_equal(fy_spec_params_check(&sp), FY_ERR_INVALID);
    sp.method = FY_SPEC_NGRAM;
    sp.k_max = 17;
    assert_int_equal(fy_spec_params_check(&sp), FY_ERR_INVALID);
    fy_test_log_end();
    fy_spec_method_t m;
    assert_int_equal(fy_spec_method_parse("ngram", false, &m), FY_OK);
    assert_int_equal(m, FY_SPEC_NGRAM);
    assert_int_equal(fy_spec_method_parse("default", false, &m), FY_ERR_INVALID);
    assert_int_equal(fy_spec_method_parse("default", true, &m), FY_OK);
    rig_close(&g, NULL);
}

/* The per-request proposer on the wire: written when set, read back,
 * absent means the worker's default, anything else refused naming the field. */
static void test_genspec_spec(void **state)
{
    static const char *vals[] = {"none", "ngram", "draft", "default", "bogus", "ngramngramngramngramngram"};
    for (int i = 0; i < 7; i++) {
        fy_msgw_t w;
        fy_msgw_init(&w, "t");
        fy_genspec_t g;
        fy_genspec_default(&g);
        if (i < 3) {
            g.spec = (fy_spec_method_t)(FY_SPEC_NONE + i);
            fy_genspec_write(&w, &g);
        } else if (i < 6) {
            fy_genspec_write(&w, &g);
            fy_msgw_str(&w, "spec", vals[i]);
        } else {
            fy_genspec_write(&w, &g); /* absent */
        }
        void *buf;
        size_t len;
        assert_int_equal(fy_msgw_finish(&w, &buf, &len), FY_OK);
        fy_msgr_t r;
        assert_int_equal(fy_msgr_parse(&r, buf, len), FY_OK);
        fy_genspec_t back;
        fy_genspec_default(&back);
        fy_genspec_read(&r, &back, 1000);
        if (i < 4 || i == 6) {
            assert_true(fy_msgr_ok(&r));
            assert_int_equal(back.spec, i < 3 ? FY_SPEC_NONE + i : FY_SPEC_DEFAULT);
        } else {
            assert_false(fy_msgr_ok(&r));
        }
        fy_msgr_free(&r);
        fy_free(buf);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ngram_propose),
        cmocka_unit_test(test_suffix_propose),
        cmocka_unit_test(test_suffix_tenants),
        cmocka_unit_test(test_ctl),
        cmocka_unit_test(test_rejection_sampler),
        cmocka_unit_test(test_verify_bits),
        cmocka_unit_test(test_greedy_identity_tiny),
        cmocka_unit_test(test_sampled),
        cmocka_unit_test(test_request_override),
        cmocka_unit_test(test_backoff),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_genspec_spec),
        cmocka_unit_test(test_greedy_identity_default),
        cmocka_unit_test(test_greedy_chat_default),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

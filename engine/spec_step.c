/*
 * spec_step.c - speculative decoding's part of the engine's step:
 * proposals (n-gram, suffix lookup, draft model), the forward pass's cost
 * model that sizes them, and verification (engine_int.h; the proposers
 * themselves are spec.c).
 */
#include "engine/engine_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"

/* Gives back the target blocks reserved for proposals beyond the first m
 * (all of them at m = 0 ... the decode token's stay). */
static void spec_shrink(fy_engine_t *e, request_t *q, int32_t m)
{
    q->spec_drawn -= fy_kvm_seq_rollback(e->kvm, &q->bt, q->n_computed + 1 + m, &q->resv, q->spec_drawn);
    q->spec_k = m;
    q->sched = 1 + m;
    if (q->dbt.blocks) fy_kvm_seq_truncate(e->p.spec.draft_kvm, &q->dbt, q->d_computed);
}

/* Picks the draft's token from one row of draft logits: its argmax for a
 * greedy request, else a draw from its distribution (kept for the
 * verification in the request's slot). */
static int32_t draft_pick(fy_engine_t *e, request_t *q, const float *lg, int32_t j)
{
    if (q->qslot < 0) return fy_argmax(lg, e->vocab);
    float *qp = e->qprobs + ((size_t)q->qslot * (size_t)e->p.spec.k_max + (size_t)j) * (size_t)e->vocab;
    fy_sampler_probs(e->sampler, &q->sampling, lg, qp);
    double r = fy_rng_uniform(&q->drng), acc = 0.0;
    int32_t pick = -1;
    for (int32_t v = 0; v < e->vocab; v++) {
        if (qp[v] <= 0.0f) continue;
        pick = v;
        acc += qp[v];
        if (r < acc) break;
    }
    return pick;
}

/*
 * Runs the draft model for the n requests in e->dreq, each wanting
 * e->dk[i] tokens: first the tokens its draft KV lacks (the whole text
 * the first time, then what the last verification accepted, in chunks
 * that fit the draft's batch), whose last logits give the first
 * proposal, then one token a pass.  Proposals land at tokens[n_total ..].
 * A request whose draft KV cannot grow, or whose pass fails, proposes
 * nothing.
 */
static void draft_propose(fy_engine_t *e, int32_t n)
{
    fy_runner_t *dr = e->p.spec.draft;
    fy_kvm_t *dk = e->p.spec.draft_kvm;
    const fy_runner_params_t *dp = fy_runner_params(dr);
    int32_t max_k = 0;
    for (int32_t i = 0; i < n; i++) {
        request_t *q = e->dreq[i];
        /* KV for the text, then for proposals 1 .. k-1 */
        if (!q->dbt.blocks && fy_kvm_seq_init(dk, &q->dbt, q->cap, NULL) != FY_OK) {
            e->dk[i] = 0;
            continue;
        }
        if (fy_kvm_seq_reserve(dk, &q->dbt, q->n_total + e->dk[i] - 1, NULL) != FY_OK) {
            eng_draft_drop(e, q); /* the draft pool is full: start over later */
            e->dk[i] = 0;
            continue;
        }
        if (e->dk[i] > max_k) max_k = e->dk[i];
    }
    /* catch up: the first proposal comes from the last known token */
    for (;;) {
        int32_t nf = 0, tokens = 0;
        for (int32_t i = 0; i < n && nf < dp->max_seqs; i++) {
            request_t *q = e->dreq[i];
            if (e->dk[i] <= 0 || q->d_computed >= q->n_total) continue;
            int32_t rem = q->n_total - q->d_computed, take = rem;
            if (take > dp->max_batch_tokens - tokens) take = dp->max_batch_tokens - tokens;
            if (take <= 0) break;
            e->dfwd_req[nf] = q;
            e->dfwd[nf++] = (fy_forward_seq_t){.bt = &q->dbt,
                                               .tokens = q->tokens + q->d_computed,
                                               .n_tokens = take,
                                               .pos = q->d_computed,
                                               .n_logits = take == rem ? 1 : 0};
            tokens += take;
        }
        if (nf == 0) break;
        if (fy_runner_forward(dr, e->dfwd, nf, e->logits) != FY_OK) {
            for (int32_t i = 0; i < n; i++) {
                if (e->dk[i] > 0) eng_draft_drop(e, e->dreq[i]);
                e->dk[i] = 0;
            }
            return;
        }
        int32_t row = 0;
        for (int32_t f = 0; f < nf; f++) {
            request_t *q = e->dfwd_req[f];
            q->d_computed += e->dfwd[f].n_tokens;
            fy_kvm_seq_commit(dk, &q->dbt, q->tokens, q->d_computed, NULL);
            if (e->dfwd[f].n_logits)
                q->tokens[q->n_total] = draft_pick(e, q, e->logits + (size_t)row++ * (size_t)e->vocab, 0);
        }
    }
    /* then one token a pass: proposal j feeds proposal j + 1 */
    for (int32_t j = 1; j < max_k; j++) {
        int32_t nf = 0;
        for (int32_t i = 0; i < n; i++) {
            request_t *q = e->dreq[i];
            if (e->dk[i] <= j) continue;
            int32_t pos = q->n_total + j - 1;
            e->dfwd_req[nf] = q;
            e->dfwd[nf++] =
                (fy_forward_seq_t){.bt = &q->dbt, .tokens = q->tokens + pos, .n_tokens = 1, .pos = pos, .n_logits = 1};
        }
        if (nf == 0) break;
        double td = fy_now_s();
        fy_status_t st = fy_runner_forward(dr, e->dfwd, nf, e->logits);
        td = fy_now_s() - td;
        e->dcost = e->dcost > 0 ? e->dcost + 0.2 * (td - e->dcost) : td;
        if (st != FY_OK) {
            /* keep what was proposed so far */
            for (int32_t i = 0; i < n; i++)
                if (e->dk[i] > j) e->dk[i] = j;
            break;
        }
        for (int32_t f = 0; f < nf; f++) {
            request_t *q = e->dfwd_req[f];
            q->d_computed = q->n_total + j;
            fy_kvm_seq_commit(dk, &q->dbt, q->tokens, q->d_computed, NULL);
            q->tokens[q->n_total + j] = draft_pick(e, q, e->logits + (size_t)f * (size_t)e->vocab, j);
        }
    }
}

/* Seconds a forward pass of n tokens takes, from the passes measured so
 * far (moving averages per token count); a count not seen yet is scaled
 * from the nearest one seen by a prior in which each token adds a quarter
 * of a one-token pass (measured at batch 1 on a 2-vCPU Zen 5). */
static double prior_cost(int32_t n) { return 1.0 + 0.25 * (n - 1); }

static double step_cost(const fy_engine_t *e, int32_t n)
{
    if (n < 1) n = 1;
    if (n < COST_N && e->cost_n[n]) return e->cost[n];
    int32_t top = n < COST_N ? n : COST_N - 1;
    for (int32_t a = top; a >= 1; a--)
        if (e->cost_n[a]) return e->cost[a] * prior_cost(n) / prior_cost(a);
    for (int32_t b = top; b < COST_N; b++)
        if (e->cost_n[b]) return e->cost[b] * prior_cost(n) / prior_cost(b);
    return prior_cost(n) * 1e-3;
}

void eng_cost_note(fy_engine_t *e, int32_t n, double s)
{
    if (n < 1 || n >= COST_N) return;
    e->cost[n] = e->cost_n[n] ? e->cost[n] + 0.2 * (s - e->cost[n]) : s;
    if (e->cost_n[n] < UINT32_MAX) e->cost_n[n]++;
}

/* The request's proposals come from the suffix lookup (sized by its own
 * confidence), not issue 8's n-gram lookup or a draft. */
static bool suffix_lookup(const fy_engine_t *e, const request_t *q)
{
    return q->spec == FY_SPEC_NGRAM && e->p.spec.lookup == FY_SPEC_LOOKUP_SUFFIX;
}

/*
 * After scheduling: gives decoding requests that speculate their
 * proposals.  Tokens are handed out one at a time, each to the request
 * most likely to have it accepted (its acceptance rate to the power of
 * its next position), while the expected tokens the step emits per
 * second of its (measured) cost still grow: cheap while a step is
 * bandwidth-bound, not at all once the batch makes it compute-bound, so
 * speculation backs off by itself.  Also bounded by the step's token
 * budget, its logit rows and batch_tokens.  Each request's extra blocks
 * come from its own promise; one that cannot get them just decodes.
 * Never preempts.
 */
void eng_spec_plan(fy_engine_t *e, int32_t budget)
{
    const fy_spec_params_t *sp = &e->p.spec;
    for (int32_t i = 0; i < e->n_running; i++) e->running[i]->spec_k = 0;
    if (fy_spec_ctl_want(&e->wctl) == 0) return; /* the worker's speculation is off for now */
    double t0 = fy_now_s();
    int32_t rows = 0, tokens = 0;
    for (int32_t i = 0; i < e->n_running; i++) {
        request_t *q = e->running[i];
        if (q->sched <= 0) continue;
        tokens += q->sched;
        rows += eng_plp_rows(q) ? q->sched : q->n_computed + q->sched == q->n_total;
    }
    int32_t spare = e->logit_rows - rows;
    if (spare > budget) spare = budget;
    if (sp->batch_tokens > 0 && spare > sp->batch_tokens - tokens) spare = sp->batch_tokens - tokens;
    /* candidates and how many tokens each could take */
    int32_t nc = 0, slots = 0;
    for (int32_t i = 0; i < e->n_running && spare > 0 && nc < 64; i++) {
        request_t *q = e->running[i];
        if (q->spec == FY_SPEC_NONE || q->sched != 1 || q->n_total - q->n_computed != 1) continue;
        int32_t k = fy_spec_ctl_want(&q->ctl);
        if (k > q->max_tokens - q->n_generated - 1) k = q->max_tokens - q->n_generated - 1;
        if (k > e->max_ctx - q->n_total) k = e->max_ctx - q->n_total;
        if (k <= 0) continue;
        if (q->spec == FY_SPEC_NGRAM && sp->lookup == FY_SPEC_LOOKUP_SUFFIX) {
            /* sized by its own confidence, not the controller's k */
            fy_spec_text_t src[SPEC_HIST_MAX];
            float freq[FY_SPEC_MAX_K];
            int32_t ns = e->hist ? fy_spec_hist_texts(e->hist, &q->bt.ns, src, SPEC_HIST_MAX) : 0;
            int32_t kk =
                sp->k_max < q->max_tokens - q->n_generated - 1 ? sp->k_max : q->max_tokens - q->n_generated - 1;
            if (kk > e->max_ctx - q->n_total) kk = e->max_ctx - q->n_total;
            k = fy_spec_suffix_propose(q->tokens, q->n_total, src, ns, kk, q->tokens + q->n_total, freq, &q->spec_match,
                                       &q->spec_own);
            if (k == 0) continue;
            fy_spec_est_gains(&q->est, q->spec_match, q->spec_own, freq, k, q->spec_gain);
        } else if (q->spec == FY_SPEC_NGRAM) {
            k = fy_spec_ngram_propose(q->tokens, q->n_total, sp->ngram_max, k, q->tokens + q->n_total);
            if (k == 0) continue;
        } else {
            q->qslot = -1;
            if (!fy_sampling_is_greedy(&q->sampling)) {
                if (slots == SPEC_QSLOTS) continue;
                q->qslot = slots++;
            }
        }
        e->dreq[nc] = q;
        e->dk[nc] = k; /* the most it may take */
        q->spec_k = 0;
        nc++;
    }
    /* hand out tokens while they pay */
    double G = rows, g_next[64];
    int32_t draft_k = 0;
    double dcost = e->dcost > 0 ? e->dcost : 0.5 * step_cost(e, 1);
    for (int32_t c = 0; c < nc; c++) {
        double a = suffix_lookup(e, e->dreq[c]) ? e->dreq[c]->spec_gain[0] : e->dreq[c]->ctl.rate;
        g_next[c] = a < 0.02 ? 0.02 : a > 0.98 ? 0.98 : a;
    }
    for (int32_t T = tokens; spare > 0;) {
        int32_t best = -1;
        for (int32_t c = 0; c < nc; c++)
            if (e->dreq[c]->spec_k < e->dk[c] && (best < 0 || g_next[c] > g_next[best])) best = c;
        if (best < 0) break;
        request_t *q = e->dreq[best];
        bool draft = q->spec == FY_SPEC_DRAFT;
        double before = step_cost(e, T) + dcost * draft_k;
        double after = step_cost(e, T + 1) + dcost * (draft && q->spec_k + 1 > draft_k ? q->spec_k + 1 : draft_k);
        double g = g_next[best];
        if (sp->cost_aware && (G + g) * before <= G * after) break;
        q->spec_k++;
        if (draft && q->spec_k > draft_k) draft_k = q->spec_k;
        G += g;
        T++;
        spare--;
        if (suffix_lookup(e, q)) {
            if (q->spec_k < e->dk[best]) g_next[best] = q->spec_gain[q->spec_k];
        } else {
            double a = q->ctl.rate < 0.02 ? 0.02 : q->ctl.rate > 0.98 ? 0.98 : q->ctl.rate;
            g_next[best] *= a;
        }
    }
    /* blocks for the proposals; the draft runs for those that use one */
    int32_t nd = 0;
    for (int32_t c = 0; c < nc; c++) {
        request_t *q = e->dreq[c];
        int32_t m = q->spec_k;
        q->spec_k = 0;
        if (m == 0) continue;
        int32_t before = q->resv.blocks;
        if (fy_kvm_seq_reserve(e->kvm, &q->bt, q->n_computed + 1 + m, &q->resv) != FY_OK) continue;
        q->spec_drawn = before - q->resv.blocks;
        q->spec_k = m;
        q->sched = 1 + m;
        if (q->spec == FY_SPEC_DRAFT) {
            e->dreq[nd] = q;
            e->dk[nd++] = m;
        }
    }
    if (nd > 0) {
        draft_propose(e, nd);
        for (int32_t i = 0; i < nd; i++)
            if (e->dk[i] < e->dreq[i]->spec_k) spec_shrink(e, e->dreq[i], e->dk[i]);
    }
    e->st.propose_s += fy_now_s() - t0;
}

/*
 * Verifies q's proposals against the target's k + 1 rows of logits,
 * keeps the K/V of the accepted ones (rolling back the rest in both
 * caches), adapts, and streams the accepted tokens and the one the target
 * gives after them.  Greedy: the proposals are kept while they equal the
 * argmax, so the text is the target's own.  Sampled: rejection sampling,
 * so the text is distributed as the target's.
 */
void eng_spec_verify(fy_engine_t *e, request_t *q, float *lg, double t)
{
    int32_t k = q->spec_k, V = e->vocab, base = q->n_total;
    const int32_t *draft = q->tokens + base;
    int32_t out[FY_SPEC_MAX_K + 1];
    float lp[FY_SPEC_MAX_K + 1] = {0};
    int32_t a = 0;
    /* structured output: row i is masked in the grammar's state after the
     * first i proposals; a proposal it does not allow ends the masking
     * (verification rejects it there: it is out of that row's mask) */
    if (q->gm) {
        int32_t taken = 0;
        for (int32_t i = 0; i <= k; i++) {
            if (eng_grammar_mask(e, q, lg + (size_t)i * (size_t)V) != FY_OK) {
                (void)fy_gmatch_rollback(q->gm, taken);
                eng_end_error(e, q, FY_ERR_INTERNAL, "the structured output's mask failed");
                return;
            }
            if (i == k || fy_gmatch_accept_token(q->gm, e->trie, draft[i]) != FY_OK) break;
            taken++;
        }
        (void)fy_gmatch_rollback(q->gm, taken); /* on_token takes the accepted ones for good */
    }
    if (fy_sampling_is_greedy(&q->sampling)) {
        for (;;) {
            out[a] = fy_argmax(lg + (size_t)a * (size_t)V, V);
            if (a == k || out[a] != draft[a]) break;
            a++;
        }
    } else {
        const float *p[FY_SPEC_MAX_K + 1], *qq[FY_SPEC_MAX_K];
        for (int32_t i = 0; i <= k; i++) {
            float *row = e->probs + (size_t)i * (size_t)V;
            fy_sampler_probs(e->sampler, &q->sampling, lg + (size_t)i * (size_t)V, row);
            p[i] = row;
        }
        for (int32_t i = 0; i < k && q->qslot >= 0; i++)
            qq[i] = e->qprobs + ((size_t)q->qslot * (size_t)e->p.spec.k_max + (size_t)i) * (size_t)V;
        a = fy_spec_verify_sampled(p, q->qslot >= 0 ? qq : NULL, draft, k, V, &q->rng, e->scratch, out);
    }
    if (q->logprobs)
        for (int32_t i = 0; i <= a; i++) lp[i] = fy_logprob(lg + (size_t)i * (size_t)V, V, &q->sampling, out[i]);
    /* K/V stays for the decode token and the accepted proposals */
    q->n_computed = base + a;
    q->sched = 0;
    q->spec_k = 0;
    fy_kvm_seq_rollback(e->kvm, &q->bt, q->n_computed, &q->resv, q->spec_drawn);
    q->spec_drawn = 0;
    fy_kvm_seq_commit(e->kvm, &q->bt, q->tokens, q->n_computed, &q->resv);
    eng_kv_evict(e, q);
    if (q->dbt.blocks) {
        if (q->d_computed > q->n_computed) q->d_computed = q->n_computed;
        fy_kvm_seq_truncate(e->p.spec.draft_kvm, &q->dbt, q->d_computed);
    }
    if (suffix_lookup(e, q)) {
        fy_spec_est_note(&q->est, q->spec_match, q->spec_own, k, a);
        fy_spec_est_note(&e->west, q->spec_match, q->spec_own, k, a);
    }
    e->st.spec_proposed += (uint64_t)k;
    e->st.spec_accepted += (uint64_t)a;
    e->st.spec_steps++;
    if (fy_spec_ctl_update(&q->ctl, &e->p.spec, k, a)) {
        e->st.spec_request_offs++;
        fy_debug("engine: request %llu: acceptance %.2f under %.2f; speculation off for %d steps",
                 (unsigned long long)q->id, q->ctl.rate, e->p.spec.min_accept, e->p.spec.probe_steps);
    }
    if (fy_spec_ctl_update(&e->wctl, &e->p.spec, k, a)) {
        e->st.spec_worker_offs++;
        fy_info("engine: acceptance %.2f under %.2f across requests; speculation off for %d steps", e->wctl.rate,
                e->p.spec.min_accept, e->p.spec.probe_steps);
    }
    /* the run goes out as one step: every token but the last says more
     * follow, so a stream can carry them in one chunk (vLLM's one output
     * per step); a token that ends q ends the run, and its end event
     * tells the receiver as much */
    for (int32_t i = 0; i <= a; i++) {
        q->step_more = i < a;
        if (!eng_on_token(e, q, out[i], lp[i], t)) return;
    }
}

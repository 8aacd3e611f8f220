/*
 * sched.c - the engine's plan for a step: admission, chunked prefill
 * under the token and prefill budgets, preemption, KV eviction and the
 * inter-token-latency guardrail (engine_int.h).
 */
#include "engine/engine_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"

static int cmp_running(const void *a, const void *b)
{
    const request_t *x = *(request_t *const *)a, *y = *(request_t *const *)b;
    return eng_before(x, y) ? -1 : eng_before(y, x) ? 1 : 0;
}

/* Output tokens admission plans for: max_tokens, or a quantile of recent
 * output lengths when prediction is on (never more than max_tokens). */
static int32_t planned_output(const fy_engine_t *e, const request_t *q)
{
    int32_t left = q->max_tokens - q->n_generated;
    if (!e->p.predict_output || e->out_n < 8) return left;
    int32_t s[OUTPUT_RING];
    memcpy(s, e->out_ring, (size_t)e->out_n * sizeof(int32_t));
    for (int32_t i = 1; i < e->out_n; i++) /* insertion sort: at most 128 */
        for (int32_t j = i; j > 0 && s[j - 1] > s[j]; j--) {
            int32_t t = s[j];
            s[j] = s[j - 1];
            s[j - 1] = t;
        }
    int32_t k = (int32_t)ceil(e->p.predict_quantile * e->out_n) - 1;
    int32_t pred = s[k < 0 ? 0 : k] - q->n_generated;
    if (pred < 1) pred = 1;
    return pred < left ? pred : left;
}

/* Blocks a request's promise must cover from here: its known tokens and
 * the output it plans for, less the full blocks it already holds. */
static int32_t blocks_needed(const fy_engine_t *e, const request_t *q)
{
    return fy_kvm_blocks_for_capped(e->kvm, q->n_total, planned_output(e, q), q->n_computed, q->kv_cap);
}

/* A request past its KV budget drops the blocks its policy does not keep
 * (after a commit: the blocks it names are the full prefix's). */
void eng_kv_evict(fy_engine_t *e, request_t *q)
{
    if (q->evict.policy == FY_EVICT_NONE) return;
    int32_t n = fy_evict_choose(&q->evict, &q->bt, q->scores, e->evict_buf, e->evict_cand, e->evict_cap);
    if (n > 0) (void)fy_kvm_seq_evict(e->kvm, &q->bt, e->evict_buf, n, &q->resv); /* refusal: logged, a bug */
}

static void preempt(fy_engine_t *e, request_t *q)
{
    eng_unlink_request(e, q); /* from running */
    fy_kvm_resv_release(e->kvm, &q->resv);
    eng_draft_drop(e, q);
    q->timings.n_preempted++;
    if (e->p.preempt == FY_PREEMPT_SWAP && fy_kvm_seq_swap_out(e->kvm, &q->bt) == FY_OK) {
        q->state = RQ_SWAPPED;
        eng_list_insert(&e->swapped, q);
        e->n_swapped++;
        e->st.preemptions_swap++;
        return;
    }
    /* recompute: the full blocks stay in the prefix cache for the retry */
    fy_kvm_seq_release(e->kvm, &q->bt);
    q->n_computed = 0;
    q->looked_up = false;
    q->state = RQ_WAITING;
    eng_list_insert(&e->waiting, q);
    e->n_waiting++;
    pthread_mutex_lock(&e->mu);
    e->queued++;
    pthread_mutex_unlock(&e->mu);
    e->st.preemptions_recompute++;
}

/* Schedules k tokens of running request i, preempting from the end of the
 * running set (lowest priority, latest) until its blocks fit.  Returns
 * false when the request itself left the running set. */
static bool schedule(fy_engine_t *e, int32_t i, int32_t k)
{
    request_t *q = e->running[i];
    for (;;) {
        fy_status_t st = fy_kvm_seq_reserve(e->kvm, &q->bt, q->n_computed + k, &q->resv);
        if (st == FY_OK) break;
        if (st != FY_ERR_NO_SPACE) { /* a bug, not a shortage: end the request, keep serving */
            eng_end_error(e, q, st, "kv cache reservation failed");
            return false;
        }
        request_t *victim = e->running[e->n_running - 1];
        if (victim == q && e->n_running == 1) {
            /* alone and still out of blocks: it would come back forever */
            eng_end_error(e, q, FY_ERR_NO_SPACE, "the kv cache cannot hold this request");
            return false;
        }
        preempt(e, victim);
        if (victim == q) return false;
    }
    q->sched = k;
    if (q->t_sched == 0) q->t_sched = fy_now_s();
    return true;
}

/* Swapped-out requests come back first, while their promise fits.
 * Returns the requests that came back. */
static int32_t admit_swapped(fy_engine_t *e)
{
    int32_t n = 0;
    while (e->swapped && e->n_running < e->p.max_num_seqs) {
        request_t *q = e->swapped;
        /* a budgeted request's promise is capped as at its admission: its
         * whole length might never fit again */
        if (fy_kvm_admit(e->kvm, fy_kvm_blocks_for_capped(e->kvm, q->n_total, planned_output(e, q), 0, q->kv_cap),
                         &q->resv) != FY_OK)
            break;
        if (fy_kvm_seq_swap_in(e->kvm, &q->bt, &q->resv) != FY_OK) {
            fy_kvm_resv_release(e->kvm, &q->resv);
            break;
        }
        eng_list_remove(&e->swapped, q);
        e->n_swapped--;
        q->state = RQ_RUNNING;
        e->running[e->n_running++] = q;
        n++;
    }
    return n;
}

/* Whether q's next chunk is prompt rows whose logprobs it reports (every
 * row of the chunk wants logits). */
bool eng_plp_rows(const request_t *q) { return q->plp && !q->plp_done && q->n_computed < q->n_prompt; }

/* Admits waiting requests while their promise, a first chunk and its
 * logit rows fit, and schedules that chunk.  Returns the requests taken
 * in. */
static int32_t admit_waiting(fy_engine_t *e, int32_t *budget, int32_t *prefill_left, int32_t *rows_left)
{
    int32_t n = 0;
    while (e->waiting && e->n_running<e->p.max_num_seqs && * budget> 0 && *prefill_left > 0 && *rows_left > 0) {
        request_t *q = e->waiting;
        if (!q->looked_up) {
            int32_t hit = 0;
            /* prompt logprobs need every prompt row's logits: no cached prefix */
            if ((!q->plp || q->plp_done) && fy_kvm_seq_lookup(e->kvm, &q->bt, q->tokens, q->n_total, &hit) != FY_OK) {
                eng_end_error(e, q, FY_ERR_INTERNAL, "prefix lookup failed");
                continue;
            }
            q->n_computed = hit;
            if (q->timings.n_preempted == 0) q->timings.n_cached = hit;
            q->looked_up = true;
        }
        if (fy_kvm_admit(e->kvm, blocks_needed(e, q), &q->resv) != FY_OK) {
            /* let the prefix go back to the cache while it waits */
            fy_kvm_seq_release(e->kvm, &q->bt);
            q->n_computed = 0;
            q->looked_up = false;
            break;
        }
        eng_list_remove(&e->waiting, q);
        e->n_waiting--;
        pthread_mutex_lock(&e->mu);
        e->queued--;
        pthread_mutex_unlock(&e->mu);
        q->state = RQ_RUNNING;
        e->running[e->n_running++] = q;
        n++;
        int32_t k = q->n_total - q->n_computed;
        if (k > *budget) k = *budget;
        if (k > 1 && k > *prefill_left) k = *prefill_left;
        if (eng_plp_rows(q) && k > *rows_left) k = *rows_left;
        if (schedule(e, e->n_running - 1, k)) {
            *budget -= k;
            *rows_left -= eng_plp_rows(q) ? k : 1;
            if (q->n_total - q->n_computed > 1) *prefill_left -= k;
        }
    }
    return n;
}

void eng_guardrail(fy_engine_t *e, float itl)
{
    if (e->p.itl_target_s <= 0) return;
    int32_t w = e->p.itl_window;
    e->itl_ring[e->itl_pos] = itl;
    e->itl_pos = (e->itl_pos + 1) % w;
    if (e->itl_n < w) e->itl_n++;
    e->itl_since_change++;
}

static double itl_p95(fy_engine_t *e)
{
    if (e->itl_n == 0) return 0.0;
    memcpy(e->itl_scratch, e->itl_ring, (size_t)e->itl_n * sizeof(float));
    int32_t n = e->itl_n, k = (int32_t)ceil(0.95 * n) - 1;
    /* quickselect for the k-th smallest */
    float *a = e->itl_scratch;
    int32_t lo = 0, hi = n - 1;
    while (lo < hi) {
        float pivot = a[(lo + hi) / 2];
        int32_t i = lo, j = hi;
        while (i <= j) {
            while (a[i] < pivot) i++;
            while (a[j] > pivot) j--;
            if (i <= j) {
                float t = a[i];
                a[i++] = a[j];
                a[j--] = t;
            }
        }
        if (k <= j)
            hi = j;
        else if (k >= i)
            lo = i;
        else
            break;
    }
    return a[k];
}

/* Halve the prompt tokens a step may take when p95 inter-token latency is
 * over target; give back a sixteenth at a time when it is comfortably
 * under.  Changes wait for a quarter window of fresh samples. */
void eng_adjust_budget(fy_engine_t *e)
{
    if (e->p.itl_target_s <= 0 || e->itl_since_change < e->p.itl_window / 4) return;
    double p95 = itl_p95(e);
    e->st.itl_p95_s = p95;
    int32_t max = e->p.max_num_batched_tokens, b = e->prefill_budget;
    if (p95 > e->p.itl_target_s && b > e->p.min_prefill_budget) {
        b = b / 2 > e->p.min_prefill_budget ? b / 2 : e->p.min_prefill_budget;
    } else if (p95 < 0.8 * e->p.itl_target_s && b < max) {
        b += max / 16 > 1 ? max / 16 : 1;
        if (b > max) b = max;
    } else {
        return;
    }
    fy_debug("engine: p95 inter-token latency %.1f ms; prompt tokens per step %d -> %d", p95 * 1e3, e->prefill_budget,
             b);
    e->prefill_budget = b;
    e->itl_since_change = 0;
}

/* The step's plan: takes swapped and waiting requests in, sets every
 * running request's tokens this step (decodes first, then prompt chunks
 * within the budgets, proposals last) and writes the batch the runner
 * computes into plan (whose arrays hold max_num_seqs). */
void eng_plan(fy_engine_t *e, eng_plan_t *plan)
{
    uint64_t preempted = e->st.preemptions_swap + e->st.preemptions_recompute;
    int32_t admitted = admit_swapped(e);
    qsort(e->running, (size_t)e->n_running, sizeof(request_t *), cmp_running);
    int32_t budget = e->p.max_num_batched_tokens, prefill_left = e->prefill_budget;
    /* logit rows: one for each request scheduled (at most max_num_seqs,
     * which the runner's rows cover), a chunk's worth for prompt logprobs,
     * which take only rows no later running request could need */
    int32_t rows_left = e->logit_rows;
    /* running requests in priority order; a token for every decoding
     * request is set aside before prompt chunks take the rest */
    int32_t decodes = 0;
    for (int32_t i = 0; i < e->n_running; i++) {
        e->running[i]->sched = 0;
        decodes += e->running[i]->n_total - e->running[i]->n_computed == 1;
    }
    for (int32_t i = 0; i < e->n_running; i++) {
        request_t *q = e->running[i];
        int32_t k = q->n_total - q->n_computed;
        bool decode = k == 1;
        if (decode) {
            decodes--;
        } else {
            if (k > budget - decodes) k = budget - decodes;
            if (k > prefill_left) k = prefill_left;
            if (eng_plp_rows(q) && k > rows_left - (e->n_running - i - 1)) k = rows_left - (e->n_running - i - 1);
        }
        if (k <= 0) continue;
        if (!schedule(e, i, k)) {
            /* q left the running set: preempted (it was the last) or failed */
            if (i < e->n_running && e->running[i] != q) i--;
            continue;
        }
        rows_left -= eng_plp_rows(q) ? k : 1;
        budget -= k;
        if (!decode) prefill_left -= k;
    }
    admitted += admit_waiting(e, &budget, &prefill_left, &rows_left);
    eng_spec_plan(e, budget);

    *plan = (eng_plan_t){.seqs = plan->seqs,
                         .reqs = plan->reqs,
                         .n_admitted = admitted,
                         .n_preempted = (int32_t)(e->st.preemptions_swap + e->st.preemptions_recompute - preempted)};
    for (int32_t i = 0; i < e->n_running; i++) {
        request_t *q = e->running[i];
        if (q->sched <= 0) continue;
        int32_t n_logits = q->spec_k > 0                            ? q->spec_k + 1
                           : eng_plp_rows(q)                        ? q->sched
                           : q->n_computed + q->sched == q->n_total ? 1
                                                                    : 0;
        plan->reqs[plan->n] = q;
        plan->seqs[plan->n++] = (fy_forward_seq_t){
            .bt = &q->bt,
            .tokens = q->tokens + q->n_computed,
            .n_tokens = q->sched,
            .pos = q->n_computed,
            .n_logits = n_logits,
            .scores = q->scores,
        };
        plan->n_tokens += q->sched;
        plan->n_rows += n_logits;
        if (q->n_total - q->n_computed > 1) plan->n_prefill += q->sched;
    }
}

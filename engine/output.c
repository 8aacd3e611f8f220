/*
 * output.c - a step's logits into tokens and events: prompt logprobs,
 * logits processing, the structured output's mask, sampling, alternatives,
 * stop strings and streaming (engine_int.h).
 */
#include "engine/engine_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/mem.h"

/* Structured output: the tokens q's grammar does not allow next (and any
 * logit past the tokenizer's vocabulary) cannot be drawn from row lg. */
fy_status_t eng_grammar_mask(fy_engine_t *e, request_t *q, float *lg)
{
    fy_status_t st = fy_gmatch_mask(q->gm, e->trie, e->gmask);
    if (st != FY_OK) return st;
    int32_t n = fy_token_trie_n_vocab(e->trie);
    for (int32_t w = 0; w * 32 < n; w++) {
        uint32_t m = e->gmask[w];
        if (m == UINT32_MAX) continue;
        for (int32_t b = 0; b < 32 && w * 32 + b < n; b++)
            if (!(m >> b & 1u)) lg[w * 32 + b] = FY_LOGPROB_MIN;
    }
    for (int32_t i = n; i < e->vocab; i++) lg[i] = FY_LOGPROB_MIN;
    return FY_OK;
}

/* A token was sampled for q: stream it (with n_top alternatives), and
 * end q if it is done (then false: q is gone). */
bool eng_on_token_top(fy_engine_t *e, request_t *q, int32_t tok, float logprob, const int32_t *top_ids,
                      const float *top_lps, int32_t n_top, double t)
{
    if (q->t_first == 0) {
        q->t_first = t;
    } else {
        float itl = (float)(t - q->t_last);
        if (q->timings.n_itl < q->max_tokens) q->itl[q->timings.n_itl++] = itl;
        eng_guardrail(e, itl);
    }
    q->t_last = t;
    /* structured output: the token moves the grammar on (it was drawn
     * from its mask; an adopted first token is checked here) */
    if (q->gm && fy_gmatch_accept_token(q->gm, e->trie, tok) != FY_OK) {
        eng_end_error(e, q, FY_ERR_INVALID, "a token the structured output does not allow");
        return false;
    }
    if (q->gm && fy_gmatch_is_ended(q->gm) && !q->defer_stops) { /* its end token, whatever ignore_eos says */
        eng_end_request(e, q, FY_EVENT_FINISH, FY_FINISH_EOS, FY_OK, NULL);
        return false;
    }
    /* min_tokens: nothing ends it earlier (the logits banned the end
     * tokens; stop strings are not looked for: vLLM's rule) */
    bool may_stop = q->n_generated >= q->lp.min_tokens;
    if (!q->ignore_eos && may_stop && fy_tokenizer_is_eog(e->tok, tok)) {
        eng_end_request(e, q, FY_EVENT_FINISH, FY_FINISH_EOS, FY_OK, NULL);
        return false;
    }
    for (int32_t i = 0; i < q->lp.n_stop_ids && may_stop && !q->defer_stops; i++)
        if (tok == q->lp.stop_ids[i]) { /* like an end token: not part of the text */
            eng_end_request(e, q, FY_EVENT_FINISH, FY_FINISH_STOP, FY_OK, NULL);
            return false;
        }
    q->tokens[q->n_total++] = tok;
    q->n_generated++;
    e->st.generation_tokens++;
    char piece[FY_DETOK_MAX_OUT];
    size_t n = fy_detok_push(&q->detok, tok, piece, sizeof(piece));
    q->n_out = 0;
    bool stopped = false;
    if (may_stop) {
        stopped = fy_stopper_feed(&q->stopper, piece, n, eng_emit_text, q);
    } else {
        fy_stopper_flush(&q->stopper, eng_emit_text, q);
        eng_emit_text(q, piece, n);
    }
    fy_event_t ev = {.kind = FY_EVENT_TOKEN,
                     .id = q->id,
                     .token = tok,
                     .logprob = logprob,
                     .text = q->out,
                     .len = q->n_out,
                     .rng = &q->rng,
                     .top_ids = top_ids,
                     .top_logprobs = top_lps,
                     .n_top = n_top,
                     .more = q->step_more};
    q->cb(q->cb_arg, &ev);
    if (stopped)
        eng_end_request(e, q, FY_EVENT_FINISH, FY_FINISH_STOP, FY_OK, NULL);
    else if (q->n_generated >= q->max_tokens)
        eng_end_request(e, q, FY_EVENT_FINISH, FY_FINISH_LENGTH, FY_OK, NULL);
    else if (q->n_total >= e->max_ctx)
        eng_end_request(e, q, FY_EVENT_FINISH, FY_FINISH_CONTEXT, FY_OK, NULL);
    else
        return true;
    return false;
}

bool eng_on_token(fy_engine_t *e, request_t *q, int32_t tok, float logprob, double t)
{
    return eng_on_token_top(e, q, tok, logprob, NULL, NULL, 0, t);
}

/* Reports the prompt logprobs of q's chunk this step: rows [n_rows, vocab]
 * of raw logits, row r the distribution of token n_computed + r + 1 (the
 * prompt's tokens only; a last row past them is the first token's). */
static void plp_report(fy_engine_t *e, request_t *q, const float *logits, int32_t n_rows)
{
    int32_t first = q->n_computed + 1, n = q->n_prompt - first;
    if (n > n_rows) n = n_rows;
    int32_t k = q->plp_top;
    for (int32_t r = 0; r < n; r++) {
        const float *lg = logits + (size_t)r * (size_t)e->vocab;
        e->plp_lps[r] =
            fy_logits_token_logprob(lg, e->vocab, q->tokens[first + r], k, e->plp_ids + (size_t)r * (size_t)k,
                                    e->plp_tlps + (size_t)r * (size_t)k, &e->plp_rank[r]);
    }
    if (first + n >= q->n_prompt) q->plp_done = true;
    if (n < 1) return;
    fy_event_t ev = {.kind = FY_EVENT_PROMPT_LOGPROBS,
                     .id = q->id,
                     .token = -1,
                     .first = first,
                     .n_rows = n,
                     .prompt_lps = e->plp_lps,
                     .prompt_rank = e->plp_rank,
                     .top_ids = e->plp_ids,
                     .top_logprobs = e->plp_tlps,
                     .n_top = k,
                     .n_prompt = q->n_prompt};
    q->cb(q->cb_arg, &ev);
}

/* After the forward pass: every planned request's rows of logits (the
 * plan's n_rows rows of the vocabulary, in the plan's order; processed in
 * place) become its tokens and events (verification, prompt logprobs, KV
 * commit and eviction, progress, logits processing, the grammar's mask,
 * sampling, alternatives); t is when the pass ended. */
void eng_outputs(fy_engine_t *e, const eng_plan_t *plan, float *logits, double t)
{
    int32_t row = 0;
    for (int32_t i = 0; i < plan->n; i++) {
        request_t *q = plan->reqs[i];
        if (q->spec_k > 0) {
            float *lg = logits + (size_t)row * (size_t)e->vocab;
            row += q->spec_k + 1;
            eng_spec_verify(e, q, lg, t); /* may end it */
            continue;
        }
        int32_t before = q->n_computed, n_rows = plan->seqs[i].n_logits;
        if (eng_plp_rows(q)) {
            plp_report(e, q, logits + (size_t)row * (size_t)e->vocab, n_rows);
            row += n_rows - 1; /* the last row: the first token's, when the chunk ends the prompt */
        }
        q->n_computed += q->sched;
        q->sched = 0;
        if (before < q->n_prompt)
            e->st.computed_prompt_tokens +=
                (uint64_t)((q->n_computed < q->n_prompt ? q->n_computed : q->n_prompt) - before);
        fy_kvm_seq_commit(e->kvm, &q->bt, q->tokens, q->n_computed, &q->resv);
        eng_kv_evict(e, q);
        if (q->progress && before < q->n_prompt) {
            fy_event_t ev = {.kind = FY_EVENT_PROGRESS,
                             .id = q->id,
                             .token = -1,
                             .bt = &q->bt,
                             .n_computed = q->n_computed,
                             .n_prompt = q->n_prompt,
                             .kv_scores = q->scores};
            q->cb(q->cb_arg, &ev);
        }
        if (n_rows == 0) continue;
        if (q->n_computed < q->n_total) { /* a prompt-logprobs chunk short of the prompt's end */
            row++;
            continue;
        }
        float *lg = logits + (size_t)row++ * (size_t)e->vocab;
        if (q->lp_on)
            fy_logits_apply(&q->lp, &e->lscratch, q->tokens, q->n_prompt, q->n_total, e->trie->eog, e->trie->n_eog, lg);
        if (q->gm && eng_grammar_mask(e, q, lg) != FY_OK) {
            eng_end_error(e, q, FY_ERR_INTERNAL, "the structured output's mask failed");
            continue;
        }
        float lp = 0.0f;
        int32_t tok = fy_sampler_sample(e->sampler, &q->sampling, &q->rng, lg, q->logprobs ? &lp : NULL);
        int32_t n_top =
            q->top_logprobs
                ? fy_logits_top(lg, e->vocab, fy_sampling_is_greedy(&q->sampling) ? 1.0f : q->sampling.temperature,
                                q->top_logprobs, e->top_ids, e->top_lps)
                : 0;
        (void)eng_on_token_top(e, q, tok, lp, e->top_ids, e->top_lps, n_top, t);
    }
}

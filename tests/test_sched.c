/*
 * test_sched.c - the engine's step cut at its seams and driven without a
 * model or a runner: an engine made by eng_create with no runner over a
 * real KV manager (a small arena), requests submitted as any caller
 * submits them, eng_plan's plans checked (admission by priority then
 * arrival, chunked prefill under the token budget with every decode's
 * token set aside, preemption of the latest request by recompute and by
 * swap with its blocks all back in the pool, a swapped request's
 * readmission where it stopped, the guardrail's prompt budget following
 * the inter-token latency it observes, prompt-logprobs chunks cut to the
 * logit rows, n-gram proposals planned), and logits written by hand into
 * eng_outputs (their verification, stop strings, max_tokens, the end of
 * turn, a structured output's mask).  The tokenizer is the tiny models'
 * byte-level one (token b is byte b; 258 <|im_end|> ends a turn), read
 * from a GGUF this test writes; no weights are loaded.  Each test takes
 * milliseconds.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/engine_int.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "tests/gguf_writer.h"
#include "tests/testutil.h"
#include "tests/tinymodel.h"

enum { VOCAB = 259, EOT = 258, BS = 8, MAX_CTX = 256, MAX_STEPS = 400 };

static fy_tokenizer_t *g_tok;

/* One request's side: what the fake model makes it say, and what came back. */
typedef struct result {
    const char *script; /* the model's favourite token is script[n] (then 'x'); NULL: 'x' */
    int32_t n;          /* tokens streamed */
    int terminal;
    fy_event_kind_t kind;
    fy_finish_reason_t reason;
    fy_status_t status;
    int32_t n_preempted;
    int32_t plp_first[8], plp_rows[8], n_plp; /* prompt logprobs events */
    char text[512];
    size_t len;
} result_t;

static void on_event(void *arg, const fy_event_t *ev)
{
    result_t *r = arg;
    assert_int_equal(r->terminal, 0); /* nothing after the terminal event */
    if (ev->len) {
        assert_true(r->len + ev->len < sizeof(r->text));
        memcpy(r->text + r->len, ev->text, ev->len);
        r->len += ev->len;
    }
    if (ev->kind == FY_EVENT_TOKEN) r->n++;
    if (ev->kind == FY_EVENT_PROMPT_LOGPROBS && r->n_plp < 8) {
        for (int32_t i = 0; i < ev->n_rows; i++) assert_true(ev->prompt_lps[i] <= 0.0f);
        r->plp_first[r->n_plp] = ev->first;
        r->plp_rows[r->n_plp++] = ev->n_rows;
    }
    if (ev->kind == FY_EVENT_FINISH || ev->kind == FY_EVENT_ERROR) {
        r->terminal++;
        r->kind = ev->kind;
        r->reason = ev->reason;
        r->status = ev->status;
        r->n_preempted = ev->timings->n_preempted;
    }
}

typedef struct fix {
    fy_kv_layout_t lay;
    uint8_t *dev, *host;
    fy_kv_hasher_t *hasher;
    fy_kvm_t *kvm;
    fy_engine_t *e;
    float *logits; /* [max_seqs rows, VOCAB] the fake forward pass's */
    double t;      /* the clock eng_outputs is told */
    double dt;     /* seconds a step takes */
    /* the last plan's requests by their results (the plan's own request
     * pointers last only until eng_outputs, which frees those it ends) */
    const result_t *who[16];
} fix_t;

static fy_status_t copy_blocks(void *arg, fy_kv_tier_t dt, const int32_t *dst, fy_kv_tier_t st, const int32_t *src,
                               int32_t n)
{
    fix_t *f = arg;
    for (int32_t i = 0; i < n; i++) {
        uint8_t *d = (dt == FY_KV_DEVICE ? f->dev : f->host) + (size_t)dst[i] * f->lay.block_bytes;
        const uint8_t *s = (st == FY_KV_DEVICE ? f->dev : f->host) + (size_t)src[i] * f->lay.block_bytes;
        memcpy(d, s, f->lay.block_bytes);
    }
    return FY_OK;
}

/* An engine of p (max_num_seqs, max_num_batched_tokens and the rest) with
 * no runner, over dev device blocks (host ones for swapping) of BS tokens. */
static void fix_open(fix_t *f, const fy_engine_params_t *p, int32_t dev, int32_t host)
{
    memset(f, 0, sizeof(*f));
    assert_int_equal(fy_kv_layout_init(&f->lay, 1, 1, 4, BS, FY_DTYPE_F32), FY_OK);
    f->dev = calloc((size_t)dev, f->lay.block_bytes);
    f->host = host ? calloc((size_t)host, f->lay.block_bytes) : NULL;
    const uint8_t secret[32] = "test_sched secret, 32 bytes long";
    assert_int_equal(fy_kv_hasher_create(secret, sizeof(secret), &f->hasher), FY_OK);
    fy_kvm_params_t kp = {.layout = f->lay,
                          .n_device_blocks = dev,
                          .n_host_blocks = host,
                          .host_arena = f->host,
                          .copy = copy_blocks,
                          .copy_arg = f,
                          .hasher = f->hasher,
                          .prefix_caching = true,
                          .watermark = 0.0f};
    assert_int_equal(fy_kvm_create(&kp, &f->kvm), FY_OK);
    fy_runner_params_t rp = {.max_batch_tokens = p->max_num_batched_tokens,
                             .max_seqs = p->max_num_seqs,
                             .max_logits = p->max_num_seqs,
                             .max_ctx = MAX_CTX,
                             .block_size = BS};
    assert_int_equal(eng_create(NULL, &rp, VOCAB, f->kvm, g_tok, p, &f->e), FY_OK);
    /* it plans and takes outputs; it has no forward pass to step or start */
    assert_int_equal(fy_engine_step(f->e), FY_ERR_INVALID);
    assert_int_equal(fy_engine_start(f->e), FY_ERR_INVALID);
    f->logits = calloc((size_t)p->max_num_seqs * VOCAB, sizeof(float));
    f->t = 1000.0;
    f->dt = 0.01;
}

static void fix_close(fix_t *f)
{
    fy_engine_destroy(f->e);
    fy_kvm_stats_t ks;
    fy_kvm_stats(f->kvm, &ks);
    assert_int_equal(ks.tier[FY_KV_DEVICE].used, 0); /* every request's blocks went back */
    assert_int_equal(ks.promised, 0);
    fy_kvm_destroy(f->kvm);
    fy_kv_hasher_destroy(f->hasher);
    free(f->dev);
    free(f->host);
    free(f->logits);
}

static void params(fy_engine_params_t *p, int32_t seqs, int32_t tokens)
{
    fy_engine_params_default(p);
    p->max_num_seqs = seqs;
    p->max_num_batched_tokens = tokens;
}

/* Submits a prompt of n tokens (printable bytes, distinct per salt, so no
 * two prompts share a cached prefix). */
static void submit(fix_t *f, int32_t n, int32_t priority, int32_t max_tokens, int salt, result_t *r)
{
    int32_t prompt[MAX_CTX];
    for (int32_t i = 0; i < n; i++) prompt[i] = 33 + (salt * 31 + i * 7) % 90;
    fy_genspec_t g;
    fy_genspec_default(&g);
    g.priority = priority;
    g.max_tokens = max_tokens;
    g.ignore_eos = true;
    assert_int_equal(fy_engine_submit(f->e, prompt, n, &g, NULL, on_event, r, NULL), FY_OK);
}

static void submit_gen(fix_t *f, const char *prompt_text, const fy_genspec_t *g, result_t *r)
{
    int32_t prompt[64];
    int32_t n = (int32_t)strlen(prompt_text);
    for (int32_t i = 0; i < n; i++) prompt[i] = (uint8_t)prompt_text[i];
    assert_int_equal(fy_engine_submit(f->e, prompt, n, g, NULL, on_event, r, NULL), FY_OK);
}

/* The step as fy_engine_step runs it, the runner's pass replaced by rows
 * of logits whose highest value is each request's script: the inbox, the
 * plan, the outputs, the guardrail.  Returns the plan (its requests: f->who). */
static const eng_plan_t *step(fix_t *f)
{
    fy_engine_t *e = f->e;
    eng_take_inbox(e);
    eng_plan(e, &e->plan);
    const eng_plan_t *plan = &e->plan;
    assert_true(plan->n_rows <= e->logit_rows); /* what the runner can write */
    int32_t row = 0, tokens = 0, rows = 0;
    for (int32_t i = 0; i < plan->n; i++) {
        const request_t *q = plan->reqs[i];
        assert_ptr_equal(plan->seqs[i].bt, &q->bt);
        assert_int_equal(plan->seqs[i].pos, q->n_computed);
        assert_int_equal(plan->seqs[i].n_tokens, q->sched);
        tokens += plan->seqs[i].n_tokens;
        rows += plan->seqs[i].n_logits;
        const result_t *r = q->cb_arg;
        assert_true(i < 16);
        f->who[i] = r;
        for (int32_t j = 0; j < plan->seqs[i].n_logits; j++, row++) {
            float *lg = f->logits + (size_t)row * VOCAB;
            /* a slope, so the best token a mask allows is the highest byte */
            for (int32_t v = 0; v < VOCAB; v++) lg[v] = (float)v * 1e-3f;
            /* a verification's row j follows j accepted proposals; other
             * rows before the last are prompt rows, not the next token's */
            int32_t at = r->n + (q->spec_k > 0 ? j : 0);
            char c = r->script && at < (int32_t)strlen(r->script) ? r->script[at] : 'x';
            if (q->spec_k == 0 && j < plan->seqs[i].n_logits - 1) c = '#';
            int32_t want = c == '\1' ? EOT : (uint8_t)c; /* \1 in a script: the end of turn */
            lg[want] = 10.0f;
        }
    }
    assert_int_equal(plan->n_tokens, tokens);
    assert_int_equal(plan->n_rows, rows);
    assert_true(plan->n_tokens <= e->p.max_num_batched_tokens);
    f->t += f->dt;
    eng_outputs(e, plan, f->logits, f->t);
    eng_adjust_budget(e);
    assert_int_equal(fy_engine_check(e), FY_OK);
    return plan;
}

/* Where r's request is in the last plan; -1: not in it. */
static int32_t find(const fix_t *f, const result_t *r)
{
    for (int32_t i = 0; i < f->e->plan.n; i++)
        if (f->who[i] == r) return i;
    return -1;
}

static request_t *req_of(fy_engine_t *e, const result_t *r)
{
    for (int32_t i = 0; i < e->n_running; i++)
        if (e->running[i]->cb_arg == r) return e->running[i];
    for (request_t *q = e->waiting; q; q = q->next)
        if (q->cb_arg == r) return q;
    for (request_t *q = e->swapped; q; q = q->next)
        if (q->cb_arg == r) return q;
    return NULL;
}

/* ---- the plan -------------------------------------------------------------------------------------- */

/* Two places: the higher priority first, then the earlier arrival; a
 * place that frees goes to the earliest of the waiting ones of the next
 * priority. */
static void test_admission_order(void **state)
{
    (void)state;
    fix_t f;
    fy_engine_params_t p;
    params(&p, 2, 64);
    fix_open(&f, &p, 64, 0);
    result_t a = {0}, b = {0}, c = {0}, d = {0};
    submit(&f, 10, 0, 4, 1, &a);
    submit(&f, 10, 1, 1, 2, &b);
    submit(&f, 10, 1, 4, 3, &c);
    submit(&f, 10, 0, 4, 4, &d);
    const eng_plan_t *plan = step(&f);
    assert_int_equal(plan->n, 2);
    assert_int_equal(plan->n_admitted, 2);
    assert_ptr_equal(f.who[0], &b);
    assert_ptr_equal(f.who[1], &c);
    assert_int_equal(plan->n_tokens, 20);
    assert_int_equal(plan->n_prefill, 20);
    assert_int_equal(plan->n_rows, 2); /* the prompts' last rows */
    assert_int_equal(b.terminal, 1);   /* one token: done */
    assert_int_equal(b.reason, FY_FINISH_LENGTH);
    assert_int_equal(req_of(f.e, &a)->state, RQ_WAITING);
    assert_int_equal(req_of(f.e, &d)->state, RQ_WAITING);
    /* b's place: a, which came before d */
    plan = step(&f);
    assert_int_equal(plan->n, 2);
    assert_int_equal(plan->n_admitted, 1);
    assert_ptr_equal(f.who[0], &c);
    assert_int_equal(plan->seqs[0].n_tokens, 1);
    assert_ptr_equal(f.who[1], &a);
    assert_int_equal(plan->seqs[1].n_tokens, 10);
    assert_int_equal(req_of(f.e, &d)->state, RQ_WAITING);
    for (int i = 0; i < MAX_STEPS && !(a.terminal && c.terminal && d.terminal); i++) step(&f);
    assert_int_equal(a.n, 4);
    assert_int_equal(c.n, 4);
    assert_int_equal(d.n, 4);
    fix_close(&f);
}

/* A long prompt goes in chunks of the step's tokens; a later one comes in
 * with what a chunk leaves; a higher-priority prompt running first leaves
 * every decoding request its token. */
static void test_chunked_prefill(void **state)
{
    (void)state;
    fix_t f;
    fy_engine_params_t p;
    params(&p, 4, 16);
    fix_open(&f, &p, 64, 0);
    result_t a = {0}, b = {0}, c = {0};
    submit(&f, 40, 0, 8, 1, &a);
    const eng_plan_t *plan = step(&f);
    assert_int_equal(plan->n, 1);
    assert_int_equal(plan->seqs[0].n_tokens, 16);
    assert_int_equal(plan->seqs[0].pos, 0);
    assert_int_equal(plan->seqs[0].n_logits, 0); /* short of the prompt's end: no row */
    assert_int_equal(plan->n_prefill, 16);
    assert_int_equal(a.n, 0);
    submit(&f, 3, 0, 8, 2, &b);
    plan = step(&f); /* a takes the whole step: b waits */
    assert_int_equal(plan->n, 1);
    assert_int_equal(plan->seqs[0].n_tokens, 16);
    assert_int_equal(plan->seqs[0].pos, 16);
    assert_int_equal(plan->n_admitted, 0);
    plan = step(&f); /* a's last 8, then b's 3 in what is left */
    assert_int_equal(plan->n, 2);
    assert_int_equal(plan->n_admitted, 1);
    assert_int_equal(plan->seqs[0].n_tokens, 8);
    assert_int_equal(plan->seqs[0].n_logits, 1);
    assert_ptr_equal(f.who[1], &b);
    assert_int_equal(plan->seqs[1].n_tokens, 3);
    assert_int_equal(plan->n_prefill, 11);
    assert_int_equal(a.n, 1);
    assert_int_equal(b.n, 1);
    plan = step(&f); /* two decodes */
    assert_int_equal(plan->n_tokens, 2);
    assert_int_equal(plan->n_prefill, 0);
    submit(&f, 30, 5, 8, 3, &c);
    plan = step(&f); /* c comes in behind the decodes: 14 */
    assert_int_equal(find(&f, &c), 2);
    assert_int_equal(plan->seqs[2].n_tokens, 14);
    plan = step(&f); /* c runs first now, and leaves a and b their tokens */
    assert_int_equal(find(&f, &c), 0);
    assert_int_equal(plan->seqs[0].n_tokens, 14);
    assert_int_equal(plan->seqs[find(&f, &a)].n_tokens, 1);
    assert_int_equal(plan->seqs[find(&f, &b)].n_tokens, 1);
    assert_int_equal(plan->n_tokens, 16);
    for (int i = 0; i < MAX_STEPS && !(a.terminal && b.terminal && c.terminal); i++) step(&f);
    assert_int_equal(a.n, 8);
    assert_int_equal(b.n, 8);
    assert_int_equal(c.n, 8);
    fix_close(&f);
}

/* Admission on predicted output lengths (eight finished one-token
 * requests: a prediction of one token) lets three requests in whose whole
 * length the pool cannot hold; when it runs out, the latest one is
 * preempted (not the one before it), its blocks and promise all back
 * (by recompute to the pool, where a and b take them at once; by swap to
 * the host tier), and it comes back as soon as a's end frees blocks,
 * while b still runs: by swap where it stopped.  All give all their
 * tokens, and the earliest is never preempted. */
static void preempt_case(fy_preempt_mode_t mode)
{
    fix_t f;
    fy_engine_params_t p;
    params(&p, 4, 32);
    p.predict_output = true;
    p.preempt = mode;
    fix_open(&f, &p, 6, mode == FY_PREEMPT_SWAP ? 12 : 0); /* 48 tokens on the device */
    result_t warm[8] = {0};
    for (int i = 0; i < 8; i++) submit(&f, 4, 0, 1, 10 + i, &warm[i]);
    for (int i = 0; i < 8 && !warm[7].terminal; i++) step(&f);
    assert_int_equal(warm[7].terminal, 1);
    /* 7 + 12 and 7 + 25 tokens: 3 and 4 blocks of the 6; a promise of 1 */
    result_t a = {0}, b = {0}, c = {0};
    submit(&f, 7, 0, 12, 1, &a);
    submit(&f, 7, 0, 25, 2, &b);
    submit(&f, 7, 0, 25, 3, &c);
    const eng_plan_t *plan = step(&f);
    assert_int_equal(plan->n_admitted, 3);
    bool preempted = false;
    int32_t n_preempted = 0; /* over the plans: each counts its own step's */
    for (int i = 0; i < MAX_STEPS && !preempted; i++) {
        plan = step(&f);
        preempted = plan->n_preempted > 0;
        n_preempted += plan->n_preempted;
    }
    assert_true(preempted);
    assert_int_equal(plan->n_preempted, 1);
    assert_int_equal(plan->n, 2);
    assert_ptr_equal(f.who[0], &a);
    assert_ptr_equal(f.who[1], &b); /* c, the latest, went */
    request_t *qc = req_of(f.e, &c);
    assert_non_null(qc);
    fy_kvm_stats_t ks;
    fy_kvm_stats(f.kvm, &ks);
    /* the device holds a's and b's blocks, and of c's only cached ones */
    assert_int_equal(ks.tier[FY_KV_DEVICE].used, req_of(f.e, &a)->bt.n_blocks + req_of(f.e, &b)->bt.n_blocks);
    assert_int_equal(qc->resv.blocks, 0);
    int32_t c_computed = qc->n_computed;
    if (mode == FY_PREEMPT_SWAP) {
        assert_int_equal(qc->state, RQ_SWAPPED);
        assert_int_equal(f.e->n_swapped, 1);
        assert_int_equal(qc->bt.tier, FY_KV_HOST);
        assert_int_equal(ks.tier[FY_KV_HOST].used, qc->bt.n_blocks);
        assert_true(c_computed > 7);
    } else {
        assert_int_equal(qc->state, RQ_WAITING);
        assert_int_equal(qc->bt.n_blocks, 0);
        assert_int_equal(c_computed, 0);
    }
    /* c comes back, by swap where it stopped */
    bool back = false;
    for (int i = 0; i < MAX_STEPS && !(a.terminal && b.terminal && c.terminal); i++) {
        plan = step(&f);
        n_preempted += plan->n_preempted;
        int32_t k = find(&f, &c);
        if (back || k < 0) continue;
        back = true;
        assert_true(plan->n_admitted >= 1);
        assert_int_equal(a.terminal, 1); /* a's blocks made room ... */
        assert_int_equal(b.terminal, 0); /* ... and c did not wait for b */
        if (mode == FY_PREEMPT_SWAP) {
            assert_int_equal(plan->seqs[k].pos, c_computed);
            assert_int_equal(plan->seqs[k].n_tokens, 1);
        }
    }
    assert_true(back);
    result_t *all[3] = {&a, &b, &c};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(all[i]->kind, FY_EVENT_FINISH);
        assert_int_equal(all[i]->reason, FY_FINISH_LENGTH);
        assert_int_equal(all[i]->n, i ? 25 : 12);
    }
    assert_int_equal(a.n_preempted, 0);
    assert_true(c.n_preempted >= 1);
    fy_engine_stats_t st;
    fy_engine_stats(f.e, &st);
    assert_int_equal(mode == FY_PREEMPT_SWAP ? st.preemptions_swap : st.preemptions_recompute,
                     b.n_preempted + c.n_preempted);
    assert_int_equal(n_preempted, b.n_preempted + c.n_preempted);
    fix_close(&f);
}

static void test_preempt_recompute(void **state)
{
    (void)state;
    preempt_case(FY_PREEMPT_RECOMPUTE);
}

static void test_preempt_swap(void **state)
{
    (void)state;
    preempt_case(FY_PREEMPT_SWAP);
}

/* The guardrail: steps of 100 ms against a target of 50 ms halve the
 * prompt tokens a step may take, down to the floor, and a long prompt
 * coming in then goes in chunks of that budget; steps of 1 ms give it
 * back a sixteenth of the step's tokens at a time. */
static void test_guardrail(void **state)
{
    (void)state;
    fix_t f;
    fy_engine_params_t p;
    params(&p, 4, 64);
    p.itl_target_s = 0.05;
    p.itl_window = 8;
    p.min_prefill_budget = 4;
    fix_open(&f, &p, 64, 0);
    result_t a = {0}, b = {0};
    submit(&f, 4, 0, 200, 1, &a);
    f.dt = 0.1;
    int32_t last = f.e->prefill_budget, changes = 0;
    assert_int_equal(last, 64);
    for (int i = 0; i < 40; i++) {
        step(&f);
        int32_t now = f.e->prefill_budget;
        if (now != last) {
            assert_int_equal(now, last / 2 > 4 ? last / 2 : 4);
            changes++;
        }
        last = now;
    }
    assert_int_equal(last, 4);
    assert_int_equal(changes, 4); /* 64 -> 32 -> 16 -> 8 -> 4 */
    assert_true(f.e->st.itl_p95_s > 0.05);
    submit(&f, 30, 0, 4, 2, &b);
    const eng_plan_t *plan = step(&f);
    int32_t k = find(&f, &b);
    assert_true(k >= 0);
    assert_int_equal(plan->seqs[k].n_tokens, 4);
    assert_int_equal(plan->n_prefill, 4);
    plan = step(&f); /* and its next chunk, running */
    k = find(&f, &b);
    assert_int_equal(plan->seqs[k].pos, 4);
    assert_int_equal(plan->seqs[k].n_tokens, 4);
    f.dt = 0.001;
    changes = 0;
    for (int i = 0; i < 120 && last < 64; i++) {
        step(&f);
        int32_t now = f.e->prefill_budget;
        if (now != last) {
            assert_int_equal(now, last + 4);
            changes++;
        }
        last = now;
    }
    assert_int_equal(last, 64);
    assert_int_equal(changes, 15);
    fy_engine_cancel(f.e, req_of(f.e, &a)->id);
    for (int i = 0; i < MAX_STEPS && !(a.terminal && b.terminal); i++) step(&f);
    assert_int_equal(a.kind, FY_EVENT_ERROR);
    assert_int_equal(a.status, FY_ERR_CANCELLED);
    assert_int_equal(b.n, 4);
    fix_close(&f);
}

/* Prompt logprobs want a row for every prompt token: their chunks are cut
 * to the logit rows the runner has (here 4), each row reported once, and
 * the last row of the last chunk gives the first token. */
static void test_prompt_logprobs(void **state)
{
    (void)state;
    fix_t f;
    fy_engine_params_t p;
    params(&p, 4, 64);
    fix_open(&f, &p, 64, 0);
    result_t r = {0};
    fy_genspec_t g;
    fy_genspec_default(&g);
    g.prompt_logprobs = true;
    g.max_tokens = 2;
    submit_gen(&f, "0123456789", &g, &r);
    const int32_t chunk[3] = {4, 4, 2}, rows[3] = {4, 4, 2};
    for (int i = 0; i < 3; i++) {
        const eng_plan_t *plan = step(&f);
        assert_int_equal(plan->n, 1);
        assert_int_equal(plan->seqs[0].n_tokens, chunk[i]);
        assert_int_equal(plan->seqs[0].n_logits, rows[i]);
    }
    assert_int_equal(r.n_plp, 3);
    const int32_t first[3] = {1, 5, 9}, reported[3] = {4, 4, 1}; /* prompt tokens 1..9 */
    for (int i = 0; i < 3; i++) {
        assert_int_equal(r.plp_first[i], first[i]);
        assert_int_equal(r.plp_rows[i], reported[i]);
    }
    assert_int_equal(r.n, 1);
    const eng_plan_t *plan = step(&f); /* then a decode of one row */
    assert_int_equal(plan->seqs[0].n_logits, 1);
    assert_int_equal(r.terminal, 1);
    assert_int_equal(r.n, 2);
    assert_memory_equal(r.text, "xx", 2);
    fix_close(&f);
}

/* N-gram speculation planned and verified without a model: a decode
 * takes its proposals (k + 1 tokens, k + 1 rows); rows that agree with
 * them accept them all and give a bonus token, a row that disagrees keeps
 * the proposals before it and its own token, and the rest's K/V is
 * rolled back (fy_engine_check after every step). */
static void test_speculation(void **state)
{
    (void)state;
    fix_t f;
    fy_engine_params_t p;
    params(&p, 8, 64);
    p.spec.method = FY_SPEC_NGRAM;
    p.spec.lookup = FY_SPEC_LOOKUP_NGRAM;
    p.spec.cost_aware = false;
    fix_open(&f, &p, 64, 0);
    result_t r = {.script = "cabcabXab"};
    fy_genspec_t g;
    fy_genspec_default(&g);
    g.max_tokens = 16;
    submit_gen(&f, "abcabcab", &g, &r);
    const eng_plan_t *plan = step(&f); /* the prompt, and 'c' */
    assert_int_equal(plan->n_rows, 1);
    assert_int_equal(r.n, 1);
    plan = step(&f); /* 'c' and "abc" proposed after "abcabcabc": all taken, and 'a' */
    int32_t k = plan->seqs[0].n_logits - 1;
    assert_int_equal(k, 3);
    assert_int_equal(plan->seqs[0].n_tokens, k + 1);
    assert_int_equal(plan->n_tokens, k + 1);
    assert_int_equal(plan->n_rows, k + 1);
    assert_int_equal(plan->n_prefill, 0);
    assert_int_equal(r.n, 5);
    assert_int_equal(f.e->st.spec_proposed, 3);
    assert_int_equal(f.e->st.spec_accepted, 3);
    plan = step(&f); /* proposals "bca..." against 'b', 'X': one taken, and 'X' */
    int32_t k2 = plan->seqs[0].n_logits - 1;
    assert_true(k2 >= 2);
    assert_int_equal(r.n, 7);
    assert_int_equal(f.e->st.spec_proposed, (uint64_t)(3 + k2));
    assert_int_equal(f.e->st.spec_accepted, 4);
    assert_int_equal(req_of(f.e, &r)->n_computed, 8 + 6); /* the K/V of what was taken, not of the rest */
    for (int i = 0; i < 32 && !r.terminal; i++) step(&f);
    assert_int_equal(r.reason, FY_FINISH_LENGTH);
    assert_int_equal(r.n, 16);
    assert_memory_equal(r.text, "cabcabXab", 9);
    fix_close(&f);
}

/* ---- the outputs ---------------------------------------------------------------------------------- */

/* Stop strings, max_tokens, the end of turn and a structured output's
 * mask, on logits written by hand. */
static void test_outputs(void **state)
{
    (void)state;
    fix_t f;
    fy_engine_params_t p;
    params(&p, 8, 64);
    fix_open(&f, &p, 64, 0);
    fy_genspec_t g;
    result_t stop = {.script = "hello world"}, len = {.script = "abcdef"}, eot = {.script = "ok\1more"},
             choice = {.script = "maybe"}, keep = {.script = "hello world"};
    fy_genspec_default(&g);
    g.n_stop = 1;
    strcpy(g.stop[0], "lo w");
    submit_gen(&f, "hi", &g, &stop);
    g.include_stop = true;
    submit_gen(&f, "hi", &g, &keep);
    fy_genspec_default(&g);
    g.max_tokens = 3;
    submit_gen(&f, "go", &g, &len);
    fy_genspec_default(&g);
    submit_gen(&f, "go", &g, &eot);
    fy_genspec_default(&g);
    g.grammar_kind = FY_GEN_GRAMMAR_CHOICE;
    strcpy(g.grammar, "[\"yes\",\"no\"]");
    g.grammar_len = (int32_t)strlen(g.grammar);
    submit_gen(&f, "ok?", &g, &choice);
    for (int i = 0; i < 64 && !(stop.terminal && keep.terminal && len.terminal && eot.terminal && choice.terminal); i++)
        step(&f);
    assert_int_equal(stop.reason, FY_FINISH_STOP);
    assert_int_equal(stop.len, 3);
    assert_memory_equal(stop.text, "hel", 3);
    assert_int_equal(keep.reason, FY_FINISH_STOP);
    assert_int_equal(keep.len, 7);
    assert_memory_equal(keep.text, "hello w", 7);
    assert_int_equal(len.reason, FY_FINISH_LENGTH);
    assert_int_equal(len.n, 3);
    assert_int_equal(len.len, 3);
    assert_memory_equal(len.text, "abc", 3);
    assert_int_equal(eot.reason, FY_FINISH_EOS);
    assert_int_equal(eot.len, 2);
    assert_memory_equal(eot.text, "ok", 2);
    /* 'm' is out of the mask; the best the mask allows is 'y' (the slope) */
    assert_int_equal(choice.kind, FY_EVENT_FINISH);
    assert_int_equal(choice.reason, FY_FINISH_EOS);
    assert_int_equal(choice.len, 3);
    assert_memory_equal(choice.text, "yes", 3);
    fix_close(&f);
}

static int setup(void **state)
{
    (void)state;
    fy_tiny_cfg_t c;
    fy_tiny_cfg_default(&c);
    c.n_layers = 1;
    c.dim = 8;
    c.n_heads = 1;
    c.n_kv_heads = 1;
    c.ffn = 8;
    const char *path = fy_test_path("tok.gguf");
    if (!fy_tiny_write_random_gguf(&c, path, GW_F32)) return 1;
    fy_gguf_t *gguf;
    if (fy_gguf_open(path, &gguf) != FY_OK) return 1;
    fy_status_t st = fy_tokenizer_from_gguf(gguf, &g_tok);
    fy_gguf_close(gguf);
    return st == FY_OK ? 0 : 1;
}

static int teardown(void **state)
{
    (void)state;
    fy_tokenizer_destroy(g_tok);
    fy_test_tmpdir_remove();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_admission_order),   cmocka_unit_test(test_chunked_prefill),
        cmocka_unit_test(test_preempt_recompute), cmocka_unit_test(test_preempt_swap),
        cmocka_unit_test(test_guardrail),         cmocka_unit_test(test_prompt_logprobs),
        cmocka_unit_test(test_speculation),       cmocka_unit_test(test_outputs),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

/* generate.c - the single-sequence generation loop. */
#include "engine/generate.h"

#include <string.h>
#include <time.h>

#include "engine/engine.h"
#include "common/log.h"
#include "common/mem.h"

void fy_gen_params_default(fy_gen_params_t *p)
{
    memset(p, 0, sizeof(*p));
    fy_genspec_default(&p->gen);
    fy_spec_params_default(&p->spec);
}

typedef struct gen_ctx {
    fy_engine_t *engine;
    uint64_t id;
    fy_gen_text_fn on_text;
    void *arg;
    int32_t *out;
    int32_t max_out, n_out;
    bool done, cancelled;
    fy_status_t status;
    fy_gen_stats_t stats;
} gen_ctx_t;

static void on_event(void *p, const fy_event_t *ev)
{
    gen_ctx_t *g = p;
    if (ev->kind == FY_EVENT_TOKEN && g->out && g->n_out < g->max_out) g->out[g->n_out++] = ev->token;
    if (ev->len && g->on_text && !g->cancelled && !g->on_text(g->arg, ev->text, ev->len)) {
        g->cancelled = true;
        fy_engine_cancel(g->engine, g->id);
    }
    if (ev->kind == FY_EVENT_TOKEN) return;
    const fy_request_timings_t *t = ev->timings;
    g->done = true;
    g->stats.n_prompt = t->n_prompt;
    g->stats.n_generated = t->n_generated;
    g->stats.n_cached = t->n_cached;
    g->stats.prefill_s = t->ttft_s > 0 ? t->ttft_s : t->e2e_s;
    g->stats.decode_s = t->e2e_s - g->stats.prefill_s;
    if (ev->kind == FY_EVENT_FINISH) {
        g->stats.finish = ev->reason;
    } else if (g->cancelled && ev->status == FY_ERR_CANCELLED) {
        g->stats.finish = FY_FINISH_CALLBACK;
    } else {
        g->status = ev->status;
        fy_error("generate: %s", ev->message);
    }
}

fy_status_t fy_generate(fy_runner_t *r, fy_kvm_t *kvm, const fy_tokenizer_t *tok, const int32_t *prompt,
                        int32_t n_prompt, const fy_gen_params_t *gp, fy_gen_text_fn on_text, void *arg,
                        int32_t *out_tokens, int32_t max_out, fy_gen_stats_t *stats_p)
{
    const fy_runner_params_t *rp = fy_runner_params(r);
    if (n_prompt >= rp->max_ctx) {
        fy_error("generate: prompt of %d tokens does not fit the context of %d", n_prompt, rp->max_ctx);
        return FY_ERR_INVALID;
    }
    fy_engine_params_t ep;
    fy_engine_params_default(&ep);
    ep.max_num_seqs = 1;
    ep.max_waiting = 1;
    ep.max_num_batched_tokens =
        gp->prefill_chunk > 0 && gp->prefill_chunk < rp->max_batch_tokens ? gp->prefill_chunk : rp->max_batch_tokens;
    ep.spec = gp->spec;
    gen_ctx_t g = {.on_text = on_text, .arg = arg, .out = out_tokens, .max_out = max_out};
    fy_status_t st = fy_engine_create(r, kvm, tok, &ep, &g.engine);
    if (st != FY_OK) return st;
    fy_request_ctx_t ctx = {0};
    if (gp->ns) ctx.ns = *gp->ns;
    if ((st = fy_engine_submit(g.engine, prompt, n_prompt, &gp->gen, &ctx, on_event, &g, &g.id)) != FY_OK) goto out;
    while (!g.done) {
        fy_engine_stats_t es;
        if ((st = fy_engine_step(g.engine)) != FY_OK && !g.done) break;
        fy_engine_stats(g.engine, &es);
        if (!g.done && es.running == 0) {
            /* not admitted, and nothing of ours runs that could free blocks:
             * the pool is held by others */
            fy_error("generate: kv pool too small for a %d-token prompt (%d blocks free)", n_prompt,
                     fy_kvm_n_free(kvm, FY_KV_DEVICE));
            fy_engine_cancel(g.engine, g.id);
            fy_engine_step(g.engine);
            st = FY_ERR_NO_SPACE;
            goto out;
        }
    }
    if (st == FY_OK) st = g.status;
    if (st == FY_OK && stats_p) {
        fy_engine_stats_t es;
        fy_engine_stats(g.engine, &es);
        g.stats.spec_proposed = (int32_t)es.spec_proposed;
        g.stats.spec_accepted = (int32_t)es.spec_accepted;
        g.stats.spec_steps = (int32_t)es.spec_steps;
        g.stats.propose_s = es.propose_s;
        *stats_p = g.stats;
    }
out:
    fy_engine_destroy(g.engine);
    return st;
}

/* generate.c - the single-sequence generation loop. */
#include "generate.h"

#include <string.h>
#include <time.h>

#include "log.h"
#include "mem.h"
#include "prefill.h"
#include "stop.h"

const char *fy_finish_reason_str(fy_finish_reason_t r)
{
    switch (r) {
    case FY_FINISH_NONE: return "none";
    case FY_FINISH_LENGTH: return "length";
    case FY_FINISH_STOP: return "stop";
    case FY_FINISH_EOS: return "eos";
    case FY_FINISH_CONTEXT: return "context";
    case FY_FINISH_CALLBACK: return "callback";
    }
    return "?";
}

void fy_gen_params_default(fy_gen_params_t *p)
{
    memset(p, 0, sizeof(*p));
    fy_sampling_params_default(&p->sampling);
    p->max_tokens = 128;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct emit_ctx {
    fy_gen_text_fn fn;
    void *arg;
    bool cancelled;
} emit_ctx_t;

static void emit(void *p, const char *text, size_t len)
{
    emit_ctx_t *e = p;
    if (!e->cancelled && e->fn && !e->fn(e->arg, text, len)) e->cancelled = true;
}

fy_status_t fy_generate(fy_runner_t *r, fy_kvm_t *kvm, const fy_tokenizer_t *tok, const int32_t *prompt,
                        int32_t n_prompt, const fy_gen_params_t *gp, fy_gen_text_fn on_text, void *arg,
                        int32_t *out_tokens, int32_t max_out, fy_gen_stats_t *stats_p)
{
    const fy_runner_params_t *rp = fy_runner_params(r);
    int32_t vocab = fy_model_config(fy_runner_model(r))->vocab_size;
    fy_status_t st = fy_sampling_params_check(&gp->sampling);
    if (st != FY_OK) return st;
    if (n_prompt < 1 || gp->max_tokens < 0) {
        fy_error("generate: %d prompt tokens, max_tokens %d", n_prompt, gp->max_tokens);
        return FY_ERR_INVALID;
    }
    if (n_prompt >= rp->max_ctx) {
        fy_error("generate: prompt of %d tokens does not fit the context of %d", n_prompt, rp->max_ctx);
        return FY_ERR_INVALID;
    }
    fy_gen_stats_t stats = {.n_prompt = n_prompt};
    fy_block_table_t bt = {0};
    fy_sampler_t *sampler = NULL;
    float *logits = NULL;
    int32_t *hist = NULL; /* prompt and generated tokens: what the cache holds */
    fy_stopper_t stopper;
    bool have_stopper = false;
    fy_kv_ns_t zero_ns = {0};
    if ((st = fy_kvm_seq_init(kvm, &bt, rp->max_ctx, gp->ns ? gp->ns : &zero_ns))) return st;
    if ((st = fy_sampler_create(vocab, &sampler))) goto out;
    logits = fy_malloc((size_t)vocab * sizeof(float));
    hist = fy_malloc((size_t)rp->max_ctx * sizeof(int32_t));
    if (!logits || !hist) {
        fy_error("generate: out of memory for logits");
        st = FY_ERR_NOMEM;
        goto out;
    }
    memcpy(hist, prompt, (size_t)n_prompt * sizeof(int32_t));
    if ((st = fy_stopper_init(&stopper, gp->stop, gp->n_stop, FY_DETOK_MAX_OUT))) goto out;
    have_stopper = true;

    fy_rng_t rng;
    fy_rng_seed(&rng, gp->sampling.seed);
    fy_detok_t detok;
    fy_detok_init(&detok, tok, false);
    emit_ctx_t ec = {on_text, arg, false};

    /* cached prefix, then the rest of the prompt in chunks; logits only
     * for the last prompt token */
    double t0 = now_s();
    if ((st = fy_kvm_seq_lookup(kvm, &bt, prompt, n_prompt, &stats.n_cached))) goto out;
    if ((st = fy_prefill_run(r, kvm, &bt, prompt, n_prompt, gp->prefill_chunk, NULL, NULL, NULL, logits))) goto out;
    stats.prefill_s = now_s() - t0;
    t0 = now_s();

    char piece[FY_DETOK_MAX_OUT];
    for (int32_t i = 0; i < gp->max_tokens; i++) {
        int32_t id = fy_sampler_sample(sampler, &gp->sampling, &rng, logits, NULL);
        if (!gp->ignore_eos && fy_tokenizer_is_eog(tok, id)) {
            stats.finish = FY_FINISH_EOS;
            break;
        }
        if (out_tokens && stats.n_generated < max_out) out_tokens[stats.n_generated] = id;
        stats.n_generated++;
        size_t n = fy_detok_push(&detok, id, piece, sizeof(piece));
        if (fy_stopper_feed(&stopper, piece, n, emit, &ec)) {
            stats.finish = FY_FINISH_STOP;
            break;
        }
        if (ec.cancelled) {
            stats.finish = FY_FINISH_CALLBACK;
            break;
        }
        if (i + 1 == gp->max_tokens) {
            stats.finish = FY_FINISH_LENGTH;
            break;
        }
        if (bt.n_tokens + 1 > rp->max_ctx) {
            stats.finish = FY_FINISH_CONTEXT;
            break;
        }
        if ((st = fy_kvm_seq_reserve(kvm, &bt, bt.n_tokens + 1, NULL))) {
            if (st == FY_ERR_NO_SPACE) fy_error("generate: kv pool exhausted after %d tokens", bt.n_tokens);
            goto out;
        }
        fy_forward_seq_t f = {&bt, &id, 1, bt.n_tokens, 1};
        if ((st = fy_runner_forward(r, &f, 1, logits))) goto out;
        hist[bt.n_tokens] = id;
        fy_kvm_seq_commit(kvm, &bt, hist, bt.n_tokens + 1);
    }
    if (gp->max_tokens == 0) stats.finish = FY_FINISH_LENGTH;
    if (stats.finish != FY_FINISH_STOP) {
        size_t n = fy_detok_flush(&detok, piece, sizeof(piece));
        if (fy_stopper_feed(&stopper, piece, n, emit, &ec))
            stats.finish = FY_FINISH_STOP;
        else
            fy_stopper_flush(&stopper, emit, &ec);
    }
    stats.decode_s = now_s() - t0;
    if (stats_p) *stats_p = stats;
out:
    fy_kvm_seq_release(kvm, &bt);
    fy_kvm_seq_deinit(&bt);
    if (have_stopper) fy_stopper_deinit(&stopper);
    fy_free(logits);
    fy_free(hist);
    fy_sampler_destroy(sampler);
    return st;
}

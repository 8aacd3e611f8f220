/*
 * fuzz_genspec.c - the generation-parameters decoder (common/genspec.c,
 * fy_genspec_read) on any message, as the router and the workers read it
 * from generate, reserve and prefill messages.
 *
 * Checks: a message that decodes cleanly gives parameters that pass the
 * sampler's own check (fy_sampling_params_check), max_tokens inside
 * [1, cap], at most FY_GEN_MAX_STOP stop strings of 1 to FY_GEN_STOP_LEN
 * bytes without NUL, and a known speculation method; written again with
 * fy_genspec_write they decode to the same parameters; and the sampler,
 * given them, picks a token inside the vocabulary with a log-probability
 * that is a number.  Seeds: fy_genspec_write's messages (mkseeds.c).
 */
#include <math.h>
#include <string.h>

#include "common/genspec.h"
#include "common/mem.h"
#include "engine/sampler.h"
#include "tests/fuzz/util.h"

#define VOCAB 16
#define CAP 4096

static fy_sampler_t *g_sampler;

static void same(const fy_genspec_t *a, const fy_genspec_t *b)
{
    FZ_CHECK(a->sampling.temperature == b->sampling.temperature && a->sampling.top_k == b->sampling.top_k &&
                 a->sampling.top_p == b->sampling.top_p && a->sampling.min_p == b->sampling.min_p &&
                 a->sampling.seed == b->sampling.seed,
             "sampling parameters changed through a write and a read");
    FZ_CHECK(a->max_tokens == b->max_tokens && a->n_stop == b->n_stop && a->ignore_eos == b->ignore_eos &&
                 a->logprobs == b->logprobs && a->priority == b->priority && a->spec == b->spec,
             "generation parameters changed through a write and a read");
    for (int32_t i = 0; i < a->n_stop; i++) FZ_CHECK(!strcmp(a->stop[i], b->stop[i]), "stop string %d changed", i);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fz_quiet_log();
    if (fy_sampler_create(VOCAB, &g_sampler) != FY_OK) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fy_msgr_t r;
    if (fy_msgr_parse(&r, data, size) != FY_OK) {
        fy_msgr_free(&r);
        return 0;
    }
    fy_genspec_t g;
    fy_genspec_default(&g);
    fy_genspec_read(&r, &g, CAP);
    bool ok = fy_msgr_ok(&r);
    fy_msgr_free(&r);
    if (!ok) return 0;

    FZ_CHECK(fy_sampling_params_check(&g.sampling) == FY_OK, "decoded sampling parameters fail the sampler's check");
    FZ_CHECK(g.max_tokens >= 1 && g.max_tokens <= CAP, "max_tokens %d", g.max_tokens);
    FZ_CHECK(g.n_stop >= 0 && g.n_stop <= FY_GEN_MAX_STOP, "%d stop strings", g.n_stop);
    for (int32_t i = 0; i < g.n_stop; i++) {
        size_t l = strnlen(g.stop[i], FY_GEN_STOP_LEN + 1);
        FZ_CHECK(l >= 1 && l <= FY_GEN_STOP_LEN, "stop string of %zu bytes", l);
    }
    FZ_CHECK(g.spec >= FY_SPEC_DEFAULT && g.spec <= FY_SPEC_DRAFT, "spec %d", (int)g.spec);
    FZ_CHECK(g.priority >= -1000000 && g.priority <= 1000000, "priority %d", g.priority);

    fy_msgw_t w;
    fy_msgw_init(&w, "generate");
    fy_genspec_write(&w, &g);
    void *buf;
    size_t len;
    FZ_CHECK(fy_msgw_finish(&w, &buf, &len) == FY_OK, "cannot write the parameters back");
    fy_genspec_t g2;
    fy_genspec_default(&g2);
    FZ_CHECK(fy_msgr_parse(&r, buf, len) == FY_OK, "written parameters do not parse: %s", r.err);
    fy_genspec_read(&r, &g2, CAP);
    FZ_CHECK(fy_msgr_ok(&r), "written parameters do not decode: %s", r.err);
    fy_msgr_free(&r);
    fy_free(buf);
    same(&g, &g2);

    static const float logits[VOCAB] = {1.5f,  -2.0f, 0.25f, 3.0f,  3.0f,   -1e30f, 0.0f,  2.5f,
                                        -0.5f, 1.0f,  7.0f,  -7.0f, 0.125f, 2.0f,   -3.0f, 6.5f};
    fy_rng_t rng;
    fy_rng_seed(&rng, g.sampling.seed);
    float lp = 0;
    int32_t id = fy_sampler_sample(g_sampler, &g.sampling, &rng, logits, &lp);
    FZ_CHECK(id >= 0 && id < VOCAB, "sampled token %d", id);
    FZ_CHECK(!isnan(lp) && lp <= 0, "log-probability %g for token %d (temperature %g)", (double)lp, id,
             (double)g.sampling.temperature);
    return 0;
}

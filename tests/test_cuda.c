/*
 * test_cuda.c - the CUDA backend against the CPU backend (the reference),
 * op by op on random inputs, outputs poisoned with NaN before each op,
 * tolerances per dtype; and --device cuda falling back to the CPU.
 *
 * The op comparisons need a GPU: without one they skip with a message
 * ("no CUDA device: ...").  The fallback case runs everywhere.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cuda_attn.h"
#include "mem.h"
#include "testutil.h"

#define SEED 20240909u
#define DIM 256
#define HIDDEN 512
#define N_HEADS 8
#define N_KV 2
#define HD 64
#define BS 16
#define N_BLOCKS 40
#define VOCAB 300

/* ---- fallback (runs on every machine) ----------------------------------------------- */

static void test_device_fallback(void **state)
{
    char why[192] = "";
    bool usable = fy_backend_cuda_usable(why, sizeof(why));
    fy_backend_t *be = NULL;
    fy_backend_params_t bp = {.n_threads = 1};
    fy_test_log_begin();
    assert_int_equal(fy_backend_create_device("cuda", &bp, &be), FY_OK);
    fy_test_log_end();
    if (usable) {
        assert_memory_equal(fy_backend_describe(be), "cuda/", 5);
    } else {
        printf("no CUDA device: %s (the fallback is what runs)\n", why);
        assert_memory_equal(fy_backend_describe(be), "cpu/", 4);
        assert_true(fy_test_log_has("cuda requested but unavailable", "falling back to the cpu", NULL));
        assert_true(why[0] != 0);
        /* asking for cuda by backend name, not device, fails instead of falling back */
        fy_backend_t *none = NULL;
        fy_test_log_begin();
        assert_int_not_equal(fy_backend_create("cuda", &bp, &none), FY_OK);
        fy_test_log_end();
        assert_null(none);
    }
    fy_backend_destroy(be);
    be = NULL;
    assert_int_equal(fy_backend_create_device(NULL, &bp, &be), FY_OK);
    assert_memory_equal(fy_backend_describe(be), "cpu/", 4);
    fy_backend_destroy(be);
    fy_test_log_begin();
    assert_int_equal(fy_backend_create_device("tpu", &bp, &be), FY_ERR_INVALID);
    fy_test_log_end();
}

/* ---- op comparisons (need a GPU) ---------------------------------------------------- */

typedef struct pair {
    fy_backend_t *cpu, *gpu;
    uint32_t rng;
} pair_t;

static float frand(pair_t *p)
{
    p->rng = p->rng * 1664525u + 1013904223u;
    return ((float)(p->rng >> 8) / 16777216.0f) * 2.0f - 1.0f;
}

static void fill(pair_t *p, float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++) x[i] = frand(p) * scale;
}

/* a device buffer holding host data (or NaN where data is NULL) */
static float *dev_floats(fy_backend_t *be, const float *data, size_t n)
{
    void *d = NULL;
    assert_int_equal(fy_backend_alloc(be, n * sizeof(float), &d), FY_OK);
    float *tmp = fy_malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) tmp[i] = data ? data[i] : NAN;
    assert_int_equal(fy_backend_memcpy(be, d, tmp, n * sizeof(float), FY_COPY_H2D), FY_OK);
    fy_free(tmp);
    return d;
}

static void fetch(fy_backend_t *be, float *host, const float *dev, size_t n)
{
    assert_int_equal(fy_backend_sync(be), FY_OK);
    assert_int_equal(fy_backend_memcpy(be, host, dev, n * sizeof(float), FY_COPY_D2H), FY_OK);
}

/* every element finite and within atol + rtol * |ref| */
static void expect_close(const char *what, const float *ref, const float *got, size_t n, float atol, float rtol)
{
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i]))
            fail_msg("%s: element %zu is %f (poisoned output not written?) seed %u", what, i, got[i], SEED);
        double err = fabs((double)got[i] - ref[i]) - (atol + rtol * fabs(ref[i]));
        if (err > worst) worst = err, at = i;
    }
    if (worst > 0)
        fail_msg("%s: element %zu is %g, the cpu says %g (atol %g, rtol %g) seed %u", what, at, got[at], ref[at], atol,
                 rtol, SEED);
}

static int setup_pair(void **state)
{
    char why[192] = "";
    if (!fy_backend_cuda_usable(why, sizeof(why))) {
        *state = NULL;
        return 0;
    }
    pair_t *p = calloc(1, sizeof(*p));
    fy_backend_params_t bp = {.n_threads = 2};
    if (fy_backend_create("cpu", &bp, &p->cpu) || fy_backend_create("cuda", &bp, &p->gpu)) return -1;
    fy_backend_reserve_t r = {.max_tokens = 32,
                              .max_row = HIDDEN,
                              .max_seqs = 4,
                              .max_blocks = N_BLOCKS,
                              .max_kv_len = 300,
                              .n_heads = N_HEADS,
                              .head_dim = HD};
    if (fy_backend_reserve(p->cpu, &r) || fy_backend_reserve(p->gpu, &r)) return -1;
    p->rng = SEED;
    *state = p;
    return 0;
}

static int teardown_pair(void **state)
{
    pair_t *p = *state;
    if (!p) return 0;
    fy_backend_destroy(p->cpu);
    fy_backend_destroy(p->gpu);
    free(p);
    return 0;
}

#define NEED_GPU(p)                                                                                                    \
    do {                                                                                                               \
        if (!(p)) {                                                                                                    \
            char why_[192] = "";                                                                                       \
            fy_backend_cuda_usable(why_, sizeof(why_));                                                                \
            printf("no CUDA device: %s; skipping\n", why_);                                                            \
            skip();                                                                                                    \
        }                                                                                                              \
    } while (0)

/* Two sequences: one prefilling 20 tokens after 100 cached, one decoding at 257 (past a segment). */
static const int32_t q_counts[2] = {20, 1}, kv_lens[2] = {120, 258};

static void set_batch_both(pair_t *p, int32_t *n_tokens_p)
{
    static int32_t tokens[32], pos[32], slots[32], bt0[N_BLOCKS / 2], bt1[N_BLOCKS / 2]; /* disjoint */
    static fy_attn_seq_t seqs[2];
    for (int i = 0; i < N_BLOCKS / 2; i++) bt0[i] = 2 * i + 1, bt1[i] = N_BLOCKS - 2 - 2 * i; /* scattered */
    int32_t *bts[2] = {bt0, bt1}, n = 0;
    for (int s = 0; s < 2; s++) {
        seqs[s] = (fy_attn_seq_t){n, q_counts[s], kv_lens[s], (kv_lens[s] + BS - 1) / BS, bts[s], 0};
        for (int i = 0; i < q_counts[s]; i++, n++) {
            pos[n] = kv_lens[s] - q_counts[s] + i;
            tokens[n] = (int32_t)((p->rng = p->rng * 1664525u + 1013904223u) >> 8) % VOCAB;
            slots[n] = bts[s][pos[n] / BS] * BS + pos[n] % BS;
        }
    }
    fy_batch_meta_t m = {n, tokens, pos, slots, 2, seqs, 1};
    assert_int_equal(fy_backend_set_batch(p->cpu, &m), FY_OK);
    assert_int_equal(fy_backend_set_batch(p->gpu, &m), FY_OK);
    *n_tokens_p = n;
}

static void test_elementwise(void **state)
{
    pair_t *p = *state;
    NEED_GPU(p);
    int32_t n;
    set_batch_both(p, &n);
    size_t e = (size_t)n * DIM;
    float *x = fy_malloc(e * sizeof(float)), *y = fy_malloc(e * sizeof(float)), *w = fy_malloc(DIM * sizeof(float));
    float *ref = fy_malloc(e * sizeof(float)), *got = fy_malloc(e * sizeof(float));
    fill(p, x, e, 3.0f);
    fill(p, y, e, 3.0f);
    fill(p, w, DIM, 1.0f);
    fy_tensor_t wt = {FY_DTYPE_F32, {DIM, 1}, DIM * sizeof(float), DIM * sizeof(float), w, 0}, wc, wg;
    assert_int_equal(fy_backend_upload(p->cpu, &wt, FY_USE_VECTOR, &wc), FY_OK);
    assert_int_equal(fy_backend_upload(p->gpu, &wt, FY_USE_VECTOR, &wg), FY_OK);

    /* rmsnorm */
    memcpy(ref, x, e * sizeof(float));
    assert_int_equal(fy_backend_rmsnorm(p->cpu, ref, &wc, n, 1e-5f, ref), FY_OK);
    float *xd = dev_floats(p->gpu, x, e), *od = dev_floats(p->gpu, NULL, e), *yd = dev_floats(p->gpu, y, e);
    assert_int_equal(fy_backend_rmsnorm(p->gpu, xd, &wg, n, 1e-5f, od), FY_OK);
    fetch(p->gpu, got, od, e);
    expect_close("rmsnorm", ref, got, e, 1e-5f, 1e-5f);

    /* swiglu into a poisoned output */
    assert_int_equal(fy_backend_swiglu(p->cpu, x, y, ref, e), FY_OK);
    assert_int_equal(fy_backend_swiglu(p->gpu, xd, yd, od, e), FY_OK);
    fetch(p->gpu, got, od, e);
    expect_close("swiglu", ref, got, e, 1e-6f, 1e-5f);

    /* geglu (GELU-tanh gated) into a poisoned output */
    assert_int_equal(fy_backend_geglu(p->cpu, x, y, ref, e), FY_OK);
    assert_int_equal(fy_backend_geglu(p->gpu, xd, yd, od, e), FY_OK);
    fetch(p->gpu, got, od, e);
    expect_close("geglu", ref, got, e, 1e-6f, 1e-5f);

    /* scale, then a bias over rows of DIM, in place on a copy of y */
    float *sd = dev_floats(p->gpu, y, e);
    memcpy(ref, y, e * sizeof(float));
    assert_int_equal(fy_backend_scale(p->cpu, ref, 25.3f, e), FY_OK);
    assert_int_equal(fy_backend_scale(p->gpu, sd, 25.3f, e), FY_OK);
    fetch(p->gpu, got, sd, e);
    expect_close("scale", ref, got, e, 0, 0);
    assert_int_equal(fy_backend_add_bias(p->cpu, ref, &wc, n), FY_OK);
    assert_int_equal(fy_backend_add_bias(p->gpu, sd, &wg, n), FY_OK);
    fetch(p->gpu, got, sd, e);
    expect_close("add_bias", ref, got, e, 0, 0);
    fy_backend_free(p->gpu, sd);

    /* rmsnorm per head: rows of HD inside rows of DIM (Q/K norms) */
    fy_tensor_t ht = {FY_DTYPE_F32, {HD, 1}, HD * sizeof(float), HD * sizeof(float), w, 0}, hc, hg;
    assert_int_equal(fy_backend_upload(p->cpu, &ht, FY_USE_VECTOR, &hc), FY_OK);
    assert_int_equal(fy_backend_upload(p->gpu, &ht, FY_USE_VECTOR, &hg), FY_OK);
    memcpy(ref, x, e * sizeof(float));
    assert_int_equal(fy_backend_rmsnorm(p->cpu, ref, &hc, n * (DIM / HD), 1e-6f, ref), FY_OK);
    assert_int_equal(fy_backend_rmsnorm(p->gpu, xd, &hg, n * (DIM / HD), 1e-6f, od), FY_OK);
    fetch(p->gpu, got, od, e);
    expect_close("rmsnorm per head", ref, got, e, 1e-5f, 1e-5f);
    fy_backend_release_tensor(p->cpu, &hc);
    fy_backend_release_tensor(p->gpu, &hg);

    /* add in place */
    memcpy(ref, x, e * sizeof(float));
    assert_int_equal(fy_backend_add(p->cpu, ref, y, e), FY_OK);
    assert_int_equal(fy_backend_add(p->gpu, xd, yd, e), FY_OK);
    fetch(p->gpu, got, xd, e);
    expect_close("add", ref, got, e, 0, 0);

    /* rope, both styles, plain and scaled (linear, and Llama 3's
     * per-frequency factors): q [n, N_HEADS, HD] and k [n, N_KV, HD] */
    float factors[HD / 2];
    for (int i = 0; i < HD / 2; i++) factors[i] = 1.0f + (float)i / 4;
    for (int variant = 0; variant < 4; variant++) {
        fy_rope_style_t style = variant % 2 ? FY_ROPE_NEOX : FY_ROPE_NORM;
        fy_rope_t rope = {style, variant < 2 ? 10000.0f : 500000.0f, variant < 2 ? 1.0f : 0.125f,
                          variant == 3 ? factors : NULL};
        size_t nq = (size_t)n * N_HEADS * HD, nk = (size_t)n * N_KV * HD;
        float *q = fy_malloc(nq * sizeof(float)), *k = fy_malloc(nk * sizeof(float));
        float *gq = fy_malloc(nq * sizeof(float)), *gk = fy_malloc(nk * sizeof(float));
        fill(p, q, nq, 1.0f);
        fill(p, k, nk, 1.0f);
        float *qd = dev_floats(p->gpu, q, nq), *kd = dev_floats(p->gpu, k, nk);
        assert_int_equal(fy_backend_rope(p->cpu, q, k, N_HEADS, N_KV, HD, &rope), FY_OK);
        assert_int_equal(fy_backend_rope(p->gpu, qd, kd, N_HEADS, N_KV, HD, &rope), FY_OK);
        fetch(p->gpu, gq, qd, nq);
        fetch(p->gpu, gk, kd, nk);
        expect_close("rope q", q, gq, nq, 1e-5f, 1e-5f);
        expect_close("rope k", k, gk, nk, 1e-5f, 1e-5f);
        fy_backend_free(p->gpu, qd);
        fy_backend_free(p->gpu, kd);
        fy_free(q), fy_free(k), fy_free(gq), fy_free(gk);
    }

    /* get_rows, in place as the runner compacts logits */
    int32_t rows[3] = {2, 5, 5};
    memcpy(ref, x, e * sizeof(float));
    fetch(p->gpu, got, xd, e); /* the gpu's x (after add) as the reference input */
    memcpy(ref, got, e * sizeof(float));
    assert_int_equal(fy_backend_get_rows(p->cpu, ref, rows, 3, DIM, ref), FY_OK);
    assert_int_equal(fy_backend_get_rows(p->gpu, xd, rows, 3, DIM, xd), FY_OK);
    fetch(p->gpu, got, xd, 3 * DIM);
    expect_close("get_rows", ref, got, 3 * DIM, 0, 0);

    fy_backend_release_tensor(p->cpu, &wc);
    fy_backend_release_tensor(p->gpu, &wg);
    fy_backend_free(p->gpu, xd), fy_backend_free(p->gpu, yd), fy_backend_free(p->gpu, od);
    fy_free(x), fy_free(y), fy_free(w), fy_free(ref), fy_free(got);
}

/* embed and matmul for every weight dtype: the GPU holds bf16, so the
 * tolerance is bf16's (8 bits of mantissa) over the dot product */
static void test_embed_matmul(void **state)
{
    pair_t *p = *state;
    NEED_GPU(p);
    int32_t n;
    set_batch_both(p, &n);
    const fy_dtype_t types[] = {FY_DTYPE_F32,  FY_DTYPE_F16,  FY_DTYPE_Q8_0,   FY_DTYPE_Q4_0, FY_DTYPE_Q4_1,
                                FY_DTYPE_Q5_0, FY_DTYPE_Q5_1, FY_DTYPE_IQ4_NL, FY_DTYPE_Q2_K, FY_DTYPE_Q3_K,
                                FY_DTYPE_Q4_K, FY_DTYPE_Q5_K, FY_DTYPE_Q6_K}; /* DIM is whole 256-element blocks */
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
        fy_dtype_t dt = types[ti];
        size_t rb;
        assert_int_equal(fy_dtype_row_bytes(dt, DIM, &rb), FY_OK);
        char *wq = fy_malloc(rb * VOCAB);
        float *wf = fy_malloc((size_t)DIM * VOCAB * sizeof(float));
        fill(p, wf, (size_t)DIM * VOCAB, 0.5f);
        for (int r = 0; r < VOCAB; r++) fy_quantize_row(dt, wf + (size_t)r * DIM, wq + (size_t)r * rb, DIM);
        fy_tensor_t host = {dt, {DIM, VOCAB}, rb, rb * VOCAB, wq, 0}, ec, eg, mc, mg;
        assert_int_equal(fy_backend_upload(p->cpu, &host, FY_USE_ROWS, &ec), FY_OK);
        assert_int_equal(fy_backend_upload(p->gpu, &host, FY_USE_ROWS, &eg), FY_OK);
        assert_int_equal(fy_backend_upload(p->cpu, &host, FY_USE_MATMUL, &mc), FY_OK);
        assert_int_equal(fy_backend_upload(p->gpu, &host, FY_USE_MATMUL, &mg), FY_OK);

        size_t e = (size_t)n * DIM, o = (size_t)n * VOCAB;
        float *ref = fy_malloc(o * sizeof(float)), *got = fy_malloc(o * sizeof(float));
        float *od = dev_floats(p->gpu, NULL, e);
        assert_int_equal(fy_backend_embed(p->cpu, &ec, ref), FY_OK);
        assert_int_equal(fy_backend_embed(p->gpu, &eg, od), FY_OK);
        fetch(p->gpu, got, od, e);
        expect_close(fy_dtype_name(dt), ref, got, e, 0, 1.0f / 128); /* bf16 rounding of each element */

        float *x = fy_malloc(e * sizeof(float));
        fill(p, x, e, 1.0f);
        float *xd = dev_floats(p->gpu, x, e), *yd = dev_floats(p->gpu, NULL, o);
        const fy_tensor_t *wc[1] = {&mc}, *wg[1] = {&mg};
        float *yc[1] = {ref}, *yg[1] = {yd};
        assert_int_equal(fy_backend_matmul(p->cpu, 1, wc, x, n, yc), FY_OK);
        assert_int_equal(fy_backend_matmul(p->gpu, 1, wg, xd, n, yg), FY_OK);
        fetch(p->gpu, got, yd, o);
        /* the cpu quantizes activations to 8 bits for quantized weights; the gpu rounds both to bf16 */
        expect_close(fy_dtype_name(dt), ref, got, o, 0.08f, 0.02f);

        fy_backend_release_tensor(p->cpu, &ec), fy_backend_release_tensor(p->gpu, &eg);
        fy_backend_release_tensor(p->cpu, &mc), fy_backend_release_tensor(p->gpu, &mg);
        fy_backend_free(p->gpu, od), fy_backend_free(p->gpu, xd), fy_backend_free(p->gpu, yd);
        fy_free(wq), fy_free(wf), fy_free(ref), fy_free(got), fy_free(x);
    }
}

/* kv_write then attention over a paged cache whose blocks are scattered,
 * for f32 and f16 KV: a prefill chunk and a decode token past a segment */
static void test_kv_attention(void **state)
{
    pair_t *p = *state;
    NEED_GPU(p);
    for (int f16 = 0; f16 < 2; f16++) {
        fy_kv_layout_t lay;
        assert_int_equal(fy_kv_layout_init(&lay, 2, N_KV, HD, BS, f16 ? FY_DTYPE_F16 : FY_DTYPE_F32), FY_OK);
        size_t bytes = lay.block_bytes * N_BLOCKS, nfl = bytes / sizeof(float);
        /* the same random history in both arenas (valid values for either dtype) */
        float *hist = fy_malloc(bytes);
        if (f16) {
            uint16_t *h = (uint16_t *)hist;
            for (size_t i = 0; i < bytes / 2; i++) h[i] = fy_fp32_to_fp16(frand(p));
        } else {
            fill(p, hist, nfl, 1.0f);
        }
        void *ac = NULL, *ag = NULL;
        assert_int_equal(fy_backend_alloc(p->cpu, bytes, &ac), FY_OK);
        assert_int_equal(fy_backend_alloc(p->gpu, bytes, &ag), FY_OK);
        memcpy(ac, hist, bytes);
        assert_int_equal(fy_backend_memcpy(p->gpu, ag, hist, bytes, FY_COPY_H2D), FY_OK);

        int32_t n;
        set_batch_both(p, &n);
        size_t nq = (size_t)n * N_HEADS * HD, nk = (size_t)n * N_KV * HD;
        float *q = fy_malloc(nq * sizeof(float)), *k = fy_malloc(nk * sizeof(float)),
              *v = fy_malloc(nk * sizeof(float));
        fill(p, q, nq, 1.0f), fill(p, k, nk, 1.0f), fill(p, v, nk, 1.0f);
        float *qd = dev_floats(p->gpu, q, nq), *kd = dev_floats(p->gpu, k, nk), *vd = dev_floats(p->gpu, v, nk);
        assert_int_equal(fy_backend_kv_write(p->cpu, &lay, ac, 1, k, v), FY_OK);
        assert_int_equal(fy_backend_kv_write(p->gpu, &lay, ag, 1, kd, vd), FY_OK);
        /* the arenas must now be bit-identical */
        float *back = fy_malloc(bytes);
        fetch(p->gpu, back, ag, nfl);
        assert_memory_equal(back, ac, bytes);

        float *ref = fy_malloc(nq * sizeof(float)), *got = fy_malloc(nq * sizeof(float));
        float *od = dev_floats(p->gpu, NULL, nq);
        /* global, then sliding windows that cut through blocks and
         * segments, and one longer than every sequence; a query scale */
        const int32_t windows[] = {0, 1, 7, 40, 300, 100000};
        for (size_t wi = 0; wi < sizeof(windows) / sizeof(windows[0]); wi++) {
            float scale = wi == 3 ? 0.0625f : 1.0f / sqrtf((float)HD);
            assert_int_equal(fy_backend_attention(p->cpu, &lay, ac, 1, N_HEADS, scale, windows[wi], q, ref), FY_OK);
            assert_int_equal(fy_backend_attention(p->gpu, &lay, ag, 1, N_HEADS, scale, windows[wi], qd, od), FY_OK);
            fetch(p->gpu, got, od, nq);
            char what[64];
            snprintf(what, sizeof(what), "attention %s window %d", f16 ? "f16" : "f32", windows[wi]);
            expect_close(what, ref, got, nq, 1e-4f, 1e-3f);
        }

        /* block copies device -> host and back, on the copy stream */
        int32_t src[3] = {1, 2, 3}, dst[3] = {0, 5, 6};
        void *hc = NULL;
        assert_int_equal(fy_backend_alloc_host(p->gpu, bytes, &hc), FY_OK);
        assert_int_equal(fy_backend_copy_blocks(p->gpu, &lay, hc, ag, dst, src, 3, FY_COPY_D2H), FY_OK);
        for (int i = 0; i < 3; i++)
            assert_memory_equal((char *)hc + (size_t)dst[i] * lay.block_bytes,
                                (char *)ac + (size_t)src[i] * lay.block_bytes, lay.block_bytes);
        assert_int_equal(fy_backend_copy_blocks(p->gpu, &lay, ag, hc, src, dst, 3, FY_COPY_H2D), FY_OK);
        fetch(p->gpu, back, ag, nfl);
        assert_memory_equal(back, ac, bytes);
        fy_backend_free_host(p->gpu, hc);

        fy_backend_free(p->cpu, ac), fy_backend_free(p->gpu, ag);
        fy_backend_free(p->gpu, qd), fy_backend_free(p->gpu, kd), fy_backend_free(p->gpu, vd);
        fy_backend_free(p->gpu, od);
        fy_free(hist), fy_free(q), fy_free(k), fy_free(v), fy_free(back), fy_free(ref), fy_free(got);
    }
}

/* ---- the attention plans (pure host code: run on every machine) ---------------------- */

static void test_attn_plan(void **state)
{
    (void)state;
    /* tiles: at most ROWS query rows, within the accumulators, as many as fit */
    const int32_t hds[] = {64, 80, 128, 256, 512};
    for (size_t i = 0; i < sizeof(hds) / sizeof(hds[0]); i++) {
        for (int32_t G = 1; G <= 40; G++) {
            int32_t qt = fy_cuda_attn_qt(G, hds[i]);
            if (G > FY_CUDA_ATTN_ROWS) {
                assert_int_equal(qt, 0);
                continue;
            }
            assert_true(qt * G <= FY_CUDA_ATTN_ROWS);
            assert_true((int64_t)qt * G * hds[i] <= (int64_t)FY_CUDA_ATTN_THREADS * FY_CUDA_ATTN_ACC);
            if (qt > 0 && qt < FY_CUDA_ATTN_ROWS / G) /* one more token would not fit the accumulators */
                assert_true((int64_t)(qt + 1) * G * hds[i] > (int64_t)FY_CUDA_ATTN_THREADS * FY_CUDA_ATTN_ACC);
        }
    }
    assert_int_equal(fy_cuda_attn_qt(4, 128), 8); /* Llama-3-8B: a decode row and seven more per tile */
    assert_int_equal(fy_cuda_attn_qt(8, 256), 4);
    assert_int_equal(fy_cuda_attn_qt(32, 512), 0);
    /* shared memory: Gemma's head size 256 with 8 heads per kv head needs the
     * opt-in above 48 KB, which an A100 (163 KB) and an H100 (227 KB) give */
    size_t gemma = fy_cuda_attn_smem(8, 4, 256), llama = fy_cuda_attn_smem(4, 8, 128);
    assert_true(gemma > 48 * 1024 && gemma < 163 * 1024);
    assert_true(llama < 163 * 1024);
    /* the K rows are padded by one float: the layout the kernel carves */
    assert_int_equal(llama, (size_t)(32 * 128 + 32 * 129 + 32 * 128 + 32 * 32 + 3 * 32) * 4 + 8 * 4);

    /* splits: two blocks per multiprocessor over the kv heads, bounded */
    assert_int_equal(fy_cuda_attn_splits(132, 8), 33); /* H100 SXM, Llama-3-8B */
    assert_int_equal(fy_cuda_attn_splits(108, 8), 27); /* A100 */
    assert_int_equal(fy_cuda_attn_splits(132, 1), FY_CUDA_ATTN_MAX_SPLITS);
    assert_int_equal(fy_cuda_attn_splits(0, 0), 2);
    assert_int_equal(fy_cuda_attn_splits(1, 64), 1);
    /* segments: a multiple of MIN_SEG, never more than splits of them, and
     * only for rows of decode and verification */
    for (int32_t splits = 1; splits <= FY_CUDA_ATTN_MAX_SPLITS; splits += 7) {
        for (int32_t kv = 1; kv <= 140000; kv = kv * 5 / 4 + 1) {
            for (int32_t nq = 1; nq <= FY_CUDA_SPLIT_MAX_Q + 1; nq += 4) {
                int32_t seg = fy_cuda_attn_seg_len(kv, nq, splits);
                if (nq > FY_CUDA_SPLIT_MAX_Q) {
                    assert_int_equal(seg, 0);
                    continue;
                }
                assert_true(seg >= FY_CUDA_ATTN_MIN_SEG);
                assert_int_equal(seg % FY_CUDA_ATTN_MIN_SEG, 0);
                assert_true((kv + seg - 1) / seg <= splits);
                if (kv <= FY_CUDA_ATTN_MIN_SEG || splits == 1) assert_true(seg >= kv); /* one segment */
                assert_int_equal(seg % fy_cuda_attn_chunk(128), 0);
                assert_int_equal(seg % fy_cuda_attn_chunk(256), 0);
            }
        }
    }
    assert_int_equal(fy_cuda_attn_seg_len(4096, 1, 33), 128); /* 32 segments of 128 */
    assert_int_equal(fy_cuda_attn_seg_len(100, 1, 33), 64);
    assert_int_equal(fy_cuda_attn_seg_len(1, 1, 33), 64); /* one segment, still merged */
    assert_int_equal(fy_cuda_attn_seg_len(64, 8, 33), 64);
    assert_int_equal(fy_cuda_attn_seg_len(4096, 9, 33), 0); /* a prefill chunk is not split */

    /* partial scratch: decode rows only, whatever the context.  Llama-3.1-8B
     * at 131k context, 512 batch tokens, 256 sequences on an H100: the old
     * worst case (every row, ctx / 256 segments) was 4 GiB */
    int32_t st = fy_cuda_attn_split_tokens(512, 256);
    assert_int_equal(st, 512);
    assert_int_equal(fy_cuda_attn_split_tokens(8192, 16), 16 * FY_CUDA_SPLIT_MAX_Q);
    size_t part = fy_cuda_attn_part_bytes(st, 32, fy_cuda_attn_splits(132, 8), 128);
    assert_int_equal(part, (size_t)512 * 32 * 33 * 130 * 4);
    assert_true(part < (size_t)300 << 20);

    /* what the kernels refuse, naming what to change */
    char buf[192];
    const size_t h100 = 227 * 1024;
    assert_null(fy_cuda_attn_unsupported(32, 8, 128, FY_DTYPE_F16, h100, buf, sizeof(buf)));
    assert_null(fy_cuda_attn_unsupported(32, 8, 128, FY_DTYPE_FP8, h100, buf, sizeof(buf)));
    assert_null(fy_cuda_attn_unsupported(32, 8, 128, FY_DTYPE_I8, h100, buf, sizeof(buf)));
    assert_null(fy_cuda_attn_unsupported(4, 1, 256, FY_DTYPE_F32, h100, buf, sizeof(buf)));
    const char *w = fy_cuda_attn_unsupported(32, 8, 128, FY_DTYPE_Q8_0, h100, buf, sizeof(buf));
    assert_non_null(w);
    assert_non_null(strstr(w, "kv.dtype = q8_0"));
    assert_non_null(fy_cuda_attn_unsupported(64, 1, 128, FY_DTYPE_F16, h100, buf, sizeof(buf))); /* G 64 */
    assert_non_null(fy_cuda_attn_unsupported(8, 3, 128, FY_DTYPE_F16, h100, buf, sizeof(buf)));  /* uneven GQA */
    assert_non_null(fy_cuda_attn_unsupported(8, 2, 513, FY_DTYPE_F16, h100, buf, sizeof(buf)));  /* odd, too wide */
    assert_non_null(fy_cuda_attn_unsupported(8, 2, 1024, FY_DTYPE_F16, h100, buf, sizeof(buf)));
    w = fy_cuda_attn_unsupported(8, 1, 256, FY_DTYPE_F16, 48 * 1024, buf, sizeof(buf)); /* a device without opt-in */
    assert_non_null(w);
    assert_non_null(strstr(w, "shared memory"));
}

/* ---- attention across shapes, formats, groups and evictions (need a GPU) ----------- */

typedef struct attn_case {
    const char *name;
    int32_t n_heads, n_kv, hd;
    fy_dtype_t dtype;
    bool groups; /* layer 0 global, layer 1 a 32-token window: two KV groups */
} attn_case_t;

/* prefill chunk (not split), decode past several segments, a verification
 * of 3 rows (split), a short decode (one segment) */
#define AC_SEQS 4
static const int32_t ac_nq[AC_SEQS] = {20, 1, 3, 1}, ac_kv[AC_SEQS] = {120, 258, 700, 40};
#define AC_WINDOW 32
#define AC_POOL 160

static void reserve_both(pair_t *p, const fy_backend_reserve_t *r)
{
    assert_int_equal(fy_backend_reserve(p->cpu, r), FY_OK);
    assert_int_equal(fy_backend_reserve(p->gpu, r), FY_OK);
}

static void reserve_default(pair_t *p)
{
    fy_backend_reserve_t r = {.max_tokens = 32,
                              .max_row = HIDDEN,
                              .max_seqs = 4,
                              .max_blocks = N_BLOCKS,
                              .max_kv_len = 300,
                              .n_heads = N_HEADS,
                              .head_dim = HD};
    reserve_both(p, &r);
}

static void attention_case(pair_t *p, const attn_case_t *ac)
{
    fy_kv_layout_t lay;
    assert_int_equal(fy_kv_layout_init(&lay, 2, ac->n_kv, ac->hd, BS, ac->dtype), FY_OK);
    if (ac->groups) {
        const int32_t win[2] = {0, AC_WINDOW};
        assert_int_equal(fy_kv_layout_set_windows(&lay, win), FY_OK);
        assert_int_equal(lay.n_groups, 2);
    }
    const int32_t NG = lay.n_groups;
    fy_backend_reserve_t r = {.max_tokens = 32,
                              .max_row = HIDDEN,
                              .max_seqs = AC_SEQS,
                              .max_blocks = AC_POOL,
                              .n_groups = NG,
                              .max_kv_len = 704,
                              .n_heads = ac->n_heads,
                              .head_dim = ac->hd,
                              .n_kv_heads = ac->n_kv};
    reserve_both(p, &r);

    /* a history of valid rows in every block (scaled formats need real scales) */
    size_t bytes = lay.block_bytes * AC_POOL, n_rows = bytes / lay.row_bytes;
    char *hist = fy_malloc(bytes);
    float *row = fy_malloc((size_t)ac->hd * sizeof(float));
    for (size_t i = 0; i < n_rows; i++) {
        fill(p, row, (size_t)ac->hd, i % 7 == 3 ? 4.0f : 1.0f);
        fy_kv_row_write(&lay, row, hist + i * lay.row_bytes);
    }
    void *ac_a = NULL, *ag = NULL;
    assert_int_equal(fy_backend_alloc(p->cpu, bytes, &ac_a), FY_OK);
    assert_int_equal(fy_backend_alloc(p->gpu, bytes, &ag), FY_OK);
    memcpy(ac_a, hist, bytes);
    assert_int_equal(fy_backend_memcpy(p->gpu, ag, hist, bytes, FY_COPY_H2D), FY_OK);

    /* tables: every (sequence, group) its own scattered blocks; in the
     * global group blocks 5..12 of the long sequence are evicted (-1); in
     * the sliding group the blocks wholly before a sequence's first query
     * row's window are dropped (-1), as the engine drops them */
    static int32_t bt[AC_SEQS][2][48], tokens[32], pos[32], slots[2][32];
    static fy_attn_seq_t seqs[AC_SEQS];
    int32_t next = 0, n = 0;
    for (int s = 0; s < AC_SEQS; s++) {
        int32_t nb = (ac_kv[s] + BS - 1) / BS, first = ac_kv[s] - ac_nq[s];
        for (int g = 0; g < NG; g++) {
            for (int32_t b = 0; b < nb; b++) {
                bt[s][g][b] = (next * 37 + 11) % AC_POOL; /* 37 is prime to the pool: a permutation */
                next++;
                bool evicted = g == 0 && s == 2 && b >= 5 && b <= 12;
                bool dropped = g == 1 && (b + 1) * BS <= first - AC_WINDOW + 1;
                if (evicted || dropped) bt[s][g][b] = -1;
            }
        }
        seqs[s] = (fy_attn_seq_t){n, ac_nq[s], ac_kv[s], nb, &bt[s][0][0], 48};
        for (int32_t i = 0; i < ac_nq[s]; i++, n++) {
            pos[n] = first + i;
            tokens[n] = (int32_t)((frand(p) * 0.5f + 0.5f) * (VOCAB - 1));
            for (int g = 0; g < NG; g++) slots[g][n] = bt[s][g][pos[n] / BS] * BS + pos[n] % BS;
        }
    }
    /* slots is [n_groups][n_tokens]: pack group 1 right after group 0's n */
    int32_t packed[64];
    for (int g = 0; g < NG; g++) memcpy(packed + g * n, slots[g], (size_t)n * sizeof(int32_t));
    fy_batch_meta_t m = {n, tokens, pos, packed, AC_SEQS, seqs, NG};
    assert_int_equal(fy_backend_set_batch(p->cpu, &m), FY_OK);
    assert_int_equal(fy_backend_set_batch(p->gpu, &m), FY_OK);
    /* H2O scores on both, over both layers */
    const int32_t stride = 48;
    float *sc_c = calloc((size_t)AC_SEQS * stride, sizeof(float)),
          *sc_g = calloc((size_t)AC_SEQS * stride, sizeof(float));
    assert_int_equal(fy_backend_set_attn_scores(p->cpu, sc_c, stride), FY_OK);
    assert_int_equal(fy_backend_set_attn_scores(p->gpu, sc_g, stride), FY_OK);

    size_t nq = (size_t)n * ac->n_heads * ac->hd, nk = (size_t)n * ac->n_kv * ac->hd;
    float *q = fy_malloc(nq * sizeof(float)), *k = fy_malloc(nk * sizeof(float)), *v = fy_malloc(nk * sizeof(float));
    float *ref = fy_malloc(nq * sizeof(float)), *got = fy_malloc(nq * sizeof(float));
    char *back = fy_malloc(bytes);
    float *od = dev_floats(p->gpu, NULL, nq);
    for (int32_t layer = 0; layer < 2; layer++) {
        fill(p, q, nq, 1.0f), fill(p, k, nk, 1.5f), fill(p, v, nk, 1.0f);
        float *qd = dev_floats(p->gpu, q, nq), *kd = dev_floats(p->gpu, k, nk), *vd = dev_floats(p->gpu, v, nk);
        assert_int_equal(fy_backend_kv_write(p->cpu, &lay, ac_a, layer, k, v), FY_OK);
        assert_int_equal(fy_backend_kv_write(p->gpu, &lay, ag, layer, kd, vd), FY_OK);
        assert_int_equal(fy_backend_sync(p->gpu), FY_OK);
        assert_int_equal(fy_backend_memcpy(p->gpu, back, ag, bytes, FY_COPY_D2H), FY_OK);
        if (memcmp(back, ac_a, bytes)) fail_msg("%s: kv_write layer %d: the arenas differ", ac->name, layer);
        int32_t window = lay.group_window[lay.layer_group[layer]];
        float scale = 1.0f / sqrtf((float)ac->hd);
        assert_int_equal(fy_backend_attention(p->cpu, &lay, ac_a, layer, ac->n_heads, scale, window, q, ref), FY_OK);
        assert_int_equal(fy_backend_attention(p->gpu, &lay, ag, layer, ac->n_heads, scale, window, qd, od), FY_OK);
        fetch(p->gpu, got, od, nq);
        char what[96];
        snprintf(what, sizeof(what), "%s layer %d (window %d)", ac->name, layer, window);
        expect_close(what, ref, got, nq, 1e-4f, 1e-3f);
        fy_backend_free(p->gpu, qd), fy_backend_free(p->gpu, kd), fy_backend_free(p->gpu, vd);
    }
    assert_int_equal(fy_backend_sync(p->cpu), FY_OK);
    assert_int_equal(fy_backend_sync(p->gpu), FY_OK);
    char what[96];
    snprintf(what, sizeof(what), "%s h2o scores", ac->name);
    expect_close(what, sc_c, sc_g, (size_t)AC_SEQS * stride, 1e-4f, 1e-3f);
    /* each row hands out n_heads of mass per layer, all of it to blocks it sees */
    double total = 0;
    for (size_t i = 0; i < (size_t)AC_SEQS * stride; i++) total += sc_g[i];
    assert_true(fabs(total - 2.0 * n * ac->n_heads) < 1e-3 * n * ac->n_heads);
    for (int32_t b = 5; b <= 12 && !ac->groups; b++) assert_true(sc_g[2 * stride + b] == 0.0f); /* evicted */
    assert_int_equal(fy_backend_set_attn_scores(p->gpu, NULL, 0), FY_OK);
    assert_int_equal(fy_backend_set_attn_scores(p->cpu, NULL, 0), FY_OK);

    fy_backend_free(p->cpu, ac_a), fy_backend_free(p->gpu, ag), fy_backend_free(p->gpu, od);
    fy_free(hist), fy_free(row), fy_free(q), fy_free(k), fy_free(v), fy_free(ref), fy_free(got), fy_free(back);
    free(sc_c), free(sc_g);
}

static void test_attention_shapes(void **state)
{
    pair_t *p = *state;
    NEED_GPU(p);
    const attn_case_t cases[] = {
        {"f16 G4 hd64", 8, 2, 64, FY_DTYPE_F16, false},
        {"f32 G1 hd64 groups", 4, 4, 64, FY_DTYPE_F32, true},
        {"f16 G4 hd128 (llama-3-8b)", 32, 8, 128, FY_DTYPE_F16, false},
        {"f16 G8 hd128 groups", 16, 2, 128, FY_DTYPE_F16, true},
        {"fp8 G4 hd128", 32, 8, 128, FY_DTYPE_FP8, false},
        {"int8 G4 hd128 groups", 32, 8, 128, FY_DTYPE_I8, true},
        {"f16 G4 hd256 groups (gemma)", 4, 1, 256, FY_DTYPE_F16, true},
        {"f16 G8 hd256 (68 KB opt-in)", 8, 1, 256, FY_DTYPE_F16, false},
        {"fp8 G8 hd256 groups", 8, 1, 256, FY_DTYPE_FP8, true},
        {"int8 G2 hd66 (byte loads)", 4, 2, 66, FY_DTYPE_I8, false},
        {"f16 G2 hd76 (unaligned rows)", 4, 2, 76, FY_DTYPE_F16, true},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        attention_case(p, &cases[i]);
        fy_backend_needs_t needs = {cases[i].n_heads, cases[i].n_kv, cases[i].hd, cases[i].dtype, true};
        char why[256] = "";
        assert_int_equal(fy_backend_check(p->gpu, &needs, why, sizeof(why)), FY_OK);
    }
    reserve_default(p);
    /* what the kernels cannot run is refused when a worker starts, in words */
    fy_backend_needs_t wide = {64, 1, 128, FY_DTYPE_F16, false};
    char why[256] = "";
    assert_int_equal(fy_backend_check(p->gpu, &wide, why, sizeof(why)), FY_ERR_UNSUPPORTED);
    assert_non_null(strstr(why, "64 query heads per kv head"));
    assert_int_equal(fy_backend_check(p->cpu, &wide, why, sizeof(why)), FY_OK);
}

/* copy_blocks device to device inside one arena: the targets held other
 * bytes before, hold the sources' after, and nothing else moved */
static void test_copy_blocks_d2d(void **state)
{
    pair_t *p = *state;
    NEED_GPU(p);
    fy_kv_layout_t lay;
    assert_int_equal(fy_kv_layout_init(&lay, 2, N_KV, HD, BS, FY_DTYPE_F16), FY_OK);
    size_t bytes = lay.block_bytes * N_BLOCKS, bb = lay.block_bytes;
    unsigned char *h = fy_malloc(bytes), *back = fy_malloc(bytes);
    for (size_t i = 0; i < bytes; i++) h[i] = (unsigned char)(i * 131 + i / bb * 7 + 1);
    void *ag = NULL;
    assert_int_equal(fy_backend_alloc(p->gpu, bytes, &ag), FY_OK);
    assert_int_equal(fy_backend_memcpy(p->gpu, ag, h, bytes, FY_COPY_H2D), FY_OK);
    /* a run (3, 4, 5 -> 20, 21, 22) and scattered ones, one of them backwards */
    int32_t src[5] = {3, 4, 5, 9, 30}, dst[5] = {20, 21, 22, 1, 8};
    for (int i = 0; i < 5; i++) assert_memory_not_equal(h + (size_t)src[i] * bb, h + (size_t)dst[i] * bb, bb);
    assert_int_equal(fy_backend_copy_blocks(p->gpu, &lay, ag, ag, dst, src, 5, FY_COPY_D2D), FY_OK);
    assert_int_equal(fy_backend_memcpy(p->gpu, back, ag, bytes, FY_COPY_D2H), FY_OK);
    for (int i = 0; i < 5; i++) memcpy(h + (size_t)dst[i] * bb, h + (size_t)src[i] * bb, bb);
    assert_memory_equal(back, h, bytes);
    fy_backend_free(p->gpu, ag);
    fy_free(h), fy_free(back);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_fallback), cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_embed_matmul),    cmocka_unit_test(test_kv_attention),
        cmocka_unit_test(test_attn_plan),       cmocka_unit_test(test_attention_shapes),
        cmocka_unit_test(test_copy_blocks_d2d),
    };
    return cmocka_run_group_tests(tests, setup_pair, teardown_pair);
}

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_fallback),
        cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_embed_matmul),
        cmocka_unit_test(test_kv_attention),
    };
    return cmocka_run_group_tests(tests, setup_pair, teardown_pair);
}

/*
 * test_cuda.c - the CUDA backend against the CPU backend (the reference),
 * op by op on random inputs, outputs poisoned with NaN before each op,
 * tolerances per dtype; and --device cuda falling back to the CPU.
 *
 * The op comparisons need a GPU: without one they skip with a message
 * ("no CUDA device: ...").  The fallback case runs everywhere.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/cuda_attn.h"
#include "kernels/cuda_plan.h"
#include "kernels/cuda_qblock.h"
#include "common/mem.h"
#include "tests/testutil.h"

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

/* ---- the weights' host-side plan and block reading (run everywhere) ------------------ */

/* every type the GPU holds weights in; the quantized ones first */
static const fy_dtype_t g_wtypes[] = {FY_DTYPE_Q8_0,   FY_DTYPE_Q4_0, FY_DTYPE_Q4_1, FY_DTYPE_Q5_0, FY_DTYPE_Q5_1,
                                      FY_DTYPE_IQ4_NL, FY_DTYPE_Q2_K, FY_DTYPE_Q3_K, FY_DTYPE_Q4_K, FY_DTYPE_Q5_K,
                                      FY_DTYPE_Q6_K,   FY_DTYPE_F32,  FY_DTYPE_F16,  FY_DTYPE_BF16};
#define N_WTYPES (sizeof(g_wtypes) / sizeof(g_wtypes[0]))

static uint32_t g_qrng = SEED;

static float qrand(void)
{
    g_qrng = g_qrng * 1664525u + 1013904223u;
    return ((float)(g_qrng >> 8) / 16777216.0f) * 2.0f - 1.0f;
}

/* rows x in random weights in [-0.5, 0.5) stored as dt: *rb_p bytes a row */
static uint8_t *random_weight(fy_dtype_t dt, int64_t rows, int64_t in, size_t *rb_p)
{
    size_t rb;
    assert_int_equal(fy_dtype_row_bytes(dt, in, &rb), FY_OK);
    uint8_t *q = fy_malloc(rb * (size_t)rows);
    float *f = fy_malloc((size_t)in * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < in; i++) f[i] = 0.5f * qrand();
        fy_quantize_row(dt, f, q + (size_t)r * rb, in);
    }
    fy_free(f);
    *rb_p = rb;
    return q;
}

static void test_plan_types_paths(void **state)
{
    for (int t = 0; t < FY_DTYPE_COUNT; t++)
        assert_int_equal(fy_cuda_weight_type((fy_dtype_t)t), t != FY_DTYPE_FP8 && t != FY_DTYPE_I8);
    assert_false(fy_cuda_weight_type(FY_DTYPE_COUNT));
    for (size_t i = 0; i < N_WTYPES; i++) {
        fy_dtype_t t = g_wtypes[i];
        bool q = fy_dtype_is_quantized(t);
        for (int32_t n = 1; n <= FY_CUDA_MMV_MAX_N; n++)
            assert_int_equal(fy_cuda_mm_path(t, n), q ? FY_CUDA_MM_VEC_Q8 : FY_CUDA_MM_VEC_F);
        for (int32_t n = FY_CUDA_MMV_MAX_N + 1; n < 600; n += 37)
            assert_int_equal(fy_cuda_mm_path(t, n), t == FY_DTYPE_BF16 ? FY_CUDA_MM_GEMM_BF16 : FY_CUDA_MM_GEMM_TILED);
    }
    /* launch shapes: a warp per row, whole warps; one thread per element */
    fy_cuda_launch_t l = fy_cuda_mmv_launch(1);
    assert_int_equal(l.grid, 1), assert_int_equal(l.block, 32 * FY_CUDA_MMV_WARPS);
    l = fy_cuda_mmv_launch(1025);
    assert_int_equal(l.grid, (1025 + FY_CUDA_MMV_WARPS - 1) / FY_CUDA_MMV_WARPS);
    assert_true((int64_t)l.grid * FY_CUDA_MMV_WARPS >= 1025 && (int64_t)(l.grid - 1) * FY_CUDA_MMV_WARPS < 1025);
    l = fy_cuda_elem_launch(0);
    assert_int_equal(l.grid, 1);
    l = fy_cuda_elem_launch((int64_t)64 * 14336);
    assert_int_equal(l.block % 32, 0);
    assert_int_equal((int64_t)l.grid * l.block, (int64_t)64 * 14336);
}

static void test_plan_weight_check(void **state)
{
    char why[160];
    size_t rb;
    assert_int_equal(fy_dtype_row_bytes(FY_DTYPE_Q4_K, 512, &rb), FY_OK);
    static uint8_t data[8 * 288];
    fy_tensor_t t = {FY_DTYPE_Q4_K, {512, 8}, rb, rb * 8, data, 0};
    assert_int_equal(fy_cuda_weight_check(&t, why, sizeof(why)), FY_OK);
    fy_tensor_t bad = t;
    bad.row_bytes = rb + 2; /* rows with padding: not as the type stores them */
    assert_int_equal(fy_cuda_weight_check(&bad, why, sizeof(why)), FY_ERR_INVALID);
    assert_non_null(strstr(why, "rows of 290 bytes (expected 288)"));
    bad = t;
    bad.nbytes = rb * 7;
    assert_int_equal(fy_cuda_weight_check(&bad, why, sizeof(why)), FY_ERR_INVALID);
    bad = t;
    bad.data = NULL;
    assert_int_equal(fy_cuda_weight_check(&bad, why, sizeof(why)), FY_ERR_INVALID);
    assert_non_null(strstr(why, "no data"));
    bad = t;
    bad.ne[0] = 500; /* not whole super-blocks */
    assert_int_equal(fy_cuda_weight_check(&bad, why, sizeof(why)), FY_ERR_INVALID);
    assert_non_null(strstr(why, "not whole blocks"));
    bad = t;
    bad.dtype = FY_DTYPE_FP8;
    assert_int_equal(fy_cuda_weight_check(&bad, why, sizeof(why)), FY_ERR_UNSUPPORTED);
    assert_non_null(strstr(why, "fp8 has no GPU kernel"));
}

static void test_plan_scratch_tiles(void **state)
{
    /* Llama-3-8B: widest input 14336 (ffn down), 512 batch tokens */
    fy_backend_reserve_t r = {.max_tokens = 512,
                              .max_row = 14336,
                              .max_seqs = 8,
                              .max_blocks = 64,
                              .max_kv_len = 8192,
                              .n_heads = 32,
                              .head_dim = 128};
    fy_cuda_wscratch_t w;
    assert_int_equal(fy_cuda_wscratch_plan(&r, &w), FY_OK);
    assert_int_equal(w.xd_off % 16, 0);
    assert_true(w.xd_off >= (size_t)FY_CUDA_MMV_MAX_N * 14336);
    assert_int_equal(w.xq_bytes, w.xd_off + (size_t)FY_CUDA_MMV_MAX_N * (14336 / 32) * sizeof(float));
    assert_int_equal(w.tile_rows_max, 1152); /* 16M elements / 14336 = 1170, down to a multiple of 64 */
    assert_int_equal(w.tile_bytes, (size_t)1152 * 14336 * 2);
    assert_int_equal(fy_cuda_tile_rows(w.tile_bytes, 14336), 1152);
    /* a narrower weight fills the same tile with more rows, never past it or the cap */
    int64_t tr = fy_cuda_tile_rows(w.tile_bytes, 4096);
    assert_true(tr % FY_CUDA_TILE_ALIGN == 0 && tr * 4096 * 2 <= (int64_t)w.tile_bytes && tr <= FY_CUDA_TILE_MAX_ROWS);
    assert_int_equal(fy_cuda_tile_rows(w.tile_bytes, 64), FY_CUDA_TILE_MAX_ROWS);
    assert_int_equal(fy_cuda_tile_rows(100, 64), 0);          /* not one row */
    assert_int_equal(fy_cuda_tile_rows(64 * 2 * 10, 64), 10); /* fewer than 64 rows: not rounded away */
    /* a model whose rows are odd: a width that is not a multiple of 32 still gets whole q8 blocks */
    r.max_row = 1000;
    assert_int_equal(fy_cuda_wscratch_plan(&r, &w), FY_OK);
    assert_int_equal(w.xq_bytes, w.xd_off + (size_t)FY_CUDA_MMV_MAX_N * 32 * sizeof(float));
    assert_true(w.xd_off >= (size_t)FY_CUDA_MMV_MAX_N * 1024);
    /* decode-only reservations need no tile */
    r.max_tokens = FY_CUDA_MMV_MAX_N;
    assert_int_equal(fy_cuda_wscratch_plan(&r, &w), FY_OK);
    assert_int_equal(w.tile_bytes, 0);
    r.max_row = 0;
    assert_int_equal(fy_cuda_wscratch_plan(&r, &w), FY_ERR_INVALID);
    /* the tiles of the output head (128256 rows) cover every row once, in order */
    const int64_t rows = 128256, per = 1152;
    int64_t next = 0, n = fy_cuda_tile_count(rows, per);
    assert_int_equal(n, (rows + per - 1) / per);
    for (int64_t k = 0; k < n; k++) {
        int64_t r0, nr;
        fy_cuda_tile(rows, per, k, &r0, &nr);
        assert_int_equal(r0, next);
        assert_true(nr > 0 && nr <= per);
        next = r0 + nr;
    }
    assert_int_equal(next, rows);
}

static void test_plan_staging(void **state)
{
    const size_t sizes[] = {
        1, 4095, 4096, FY_CUDA_STAGE_BYTES - 1, FY_CUDA_STAGE_BYTES, FY_CUDA_STAGE_BYTES + 1, (size_t)100 << 20};
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        size_t bytes = sizes[si], next = 0, chunks = fy_cuda_stage_chunks(bytes);
        assert_int_equal(chunks, (bytes + FY_CUDA_STAGE_BYTES - 1) / FY_CUDA_STAGE_BYTES);
        for (size_t k = 0; k < chunks; k++) {
            size_t off, len;
            fy_cuda_stage_chunk(bytes, k, &off, &len);
            assert_int_equal(off, next);
            assert_true(len > 0 && len <= FY_CUDA_STAGE_BYTES);
            next = off + len;
            /* the slices of every thread count: contiguous, page-aligned, the chunk exactly */
            for (int th = 1; th <= FY_CUDA_STAGE_MAX_THREADS; th++) {
                size_t at = 0;
                for (int i = 0; i < th; i++) {
                    size_t so, sn;
                    fy_cuda_stage_slice(len, th, i, &so, &sn);
                    assert_int_equal(so, at);
                    assert_true(so % 4096 == 0 || sn == 0);
                    at = so + sn;
                }
                assert_int_equal(at, len);
            }
        }
        assert_int_equal(next, bytes);
    }
    assert_int_equal(fy_cuda_stage_chunks(0), 0);
    assert_int_equal(fy_cuda_stage_threads(1000, 16), 1);
    assert_int_equal(fy_cuda_stage_threads(FY_CUDA_STAGE_BYTES, 16), FY_CUDA_STAGE_MAX_THREADS);
    assert_int_equal(fy_cuda_stage_threads(FY_CUDA_STAGE_BYTES, 2), 2);
    assert_int_equal(fy_cuda_stage_threads(FY_CUDA_STAGE_BYTES, 0), FY_CUDA_STAGE_MAX_THREADS); /* unknown: the cap */
}

static void test_plan_share(void **state)
{
    fy_cuda_share_table_t tab = {0};
    static uint8_t a[68 * 120], b[68 * 120]; /* the Q8_0 tensor below: 120 rows of 68 bytes */
    for (size_t i = 0; i < sizeof(a); i++) a[i] = (uint8_t)i, b[i] = (uint8_t)(i * 7);
    fy_tensor_t ta = {FY_DTYPE_Q8_0, {64, 120}, 34 * 2, 34 * 2 * 120, a, 0};
    int dev_a, dev_b, many[100];
    assert_null(fy_cuda_share_find(&tab, &ta));
    assert_int_equal(fy_cuda_share_add(&tab, &ta, &dev_a), FY_OK);
    /* the output head tied to the embedding: the same host tensor again */
    fy_tensor_t tied = ta;
    fy_cuda_shared_t *e = fy_cuda_share_find(&tab, &tied);
    assert_non_null(e);
    assert_ptr_equal(e->dev, &dev_a);
    e->refs++;
    /* not the same tensor: another type, shape or address, or the bytes rewritten */
    fy_tensor_t other = ta;
    other.dtype = FY_DTYPE_Q4_0;
    assert_null(fy_cuda_share_find(&tab, &other));
    other = ta;
    other.ne[1] = 60;
    other.nbytes /= 2;
    assert_null(fy_cuda_share_find(&tab, &other));
    other = ta;
    other.data = b;
    assert_null(fy_cuda_share_find(&tab, &other));
    a[0] ^= 1;
    assert_null(fy_cuda_share_find(&tab, &ta));
    a[0] ^= 1;
    size_t last = ta.row_bytes * 120 - 1;
    a[last] ^= 1;
    assert_null(fy_cuda_share_find(&tab, &ta));
    a[last] ^= 1;
    assert_non_null(fy_cuda_share_find(&tab, &ta));
    /* more entries than the first allocation holds */
    fy_tensor_t tb = {FY_DTYPE_F16, {16, 4}, 32, 128, b, 0};
    assert_int_equal(fy_cuda_share_add(&tab, &tb, &dev_b), FY_OK);
    for (int i = 0; i < 100; i++) {
        fy_tensor_t ti = {FY_DTYPE_F32, {1, 1}, 4, 4, b + 4 * i, 0};
        assert_int_equal(fy_cuda_share_add(&tab, &ti, &many[i]), FY_OK);
    }
    assert_int_equal(tab.n, 102);
    /* released twice before the copy goes; a tensor never shared is not found */
    assert_int_equal(fy_cuda_share_drop(&tab, &dev_a), 1);
    assert_non_null(fy_cuda_share_find(&tab, &ta));
    assert_int_equal(fy_cuda_share_drop(&tab, &dev_a), 0);
    assert_null(fy_cuda_share_find(&tab, &ta));
    assert_int_equal(fy_cuda_share_drop(&tab, &dev_a), -1);
    assert_ptr_equal(fy_cuda_share_find(&tab, &tb)->dev, &dev_b); /* the others survive the removal */
    for (int i = 0; i < 100; i++) assert_int_equal(fy_cuda_share_drop(&tab, &many[i]), 0);
    assert_int_equal(fy_cuda_share_drop(&tab, &dev_b), 0);
    assert_int_equal(tab.n, 0);
    fy_cuda_share_free(&tab);
    assert_null(tab.e);
}

/* q8 activation rows as the quantize kernel makes them (a block's amax, its scale, each quant) */
static void emu_quantize_q8(const float *x, int32_t n, int32_t in, int8_t *xq, float *xd)
{
    for (int64_t bi = 0; bi < (int64_t)n * in / 32; bi++) {
        float amax = 0.0f;
        for (int l = 0; l < 32; l++) amax = fmaxf(amax, fabsf(x[32 * bi + l]));
        float d = fyq_q8_scale(amax), id = fyq_q8_inv(d);
        for (int l = 0; l < 32; l++) xq[32 * bi + l] = (int8_t)fyq_q8_round(x[32 * bi + l], id);
        xd[bi] = d;
    }
}

/* the warp's shuffle tree (xor 16, 8, 4, 2, 1), lane 0's result */
static float emu_warp_sum(float *v)
{
    for (int o = 16; o > 0; o /= 2) {
        float nv[32];
        for (int l = 0; l < 32; l++) nv[l] = v[l] + v[l ^ o];
        memcpy(v, nv, sizeof(nv));
    }
    return v[0];
}

/* mmv_q8_kernel and mmv_f_kernel, lane by lane */
static void emu_mmv(fy_dtype_t t, const uint8_t *w, size_t rb, int64_t rows, int32_t in, const float *x,
                    const int8_t *xq, const float *xd, int32_t n, float *y)
{
    const int32_t nb = in / 32;
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *row = w + (size_t)r * rb;
        for (int32_t tk = 0; tk < n; tk++) {
            float lane[32] = {0};
            for (int l = 0; l < 32; l++) {
                if (fy_dtype_is_quantized(t)) {
                    for (int32_t b = l; b < nb; b += 32) {
                        fyq_sub_t sb;
                        fyq_sub_load(t, row, b, &sb);
                        int32_t xw[8];
                        memcpy(xw, xq + (size_t)tk * in + (size_t)b * 32, sizeof(xw));
                        lane[l] += fyq_sub_dot(&sb, xw, xd[(size_t)tk * nb + b], fyq_needs_xsum(t));
                    }
                } else {
                    for (int32_t k = l; k < in; k += 32) lane[l] += fyq_deq(t, row, k) * x[(size_t)tk * in + k];
                }
            }
            y[(size_t)tk * rows + r] = emu_warp_sum(lane);
        }
    }
}

/* Every type: fyq_deq gives fy_dequantize_row's bits; a decoded block
 * rebuilds the same values; and the vector kernels' arithmetic, run lane
 * by lane here, agrees with the CPU backend's matmul to the reordering of
 * f32 sums (the integer sums are exact on both sides). */
static void test_qblock_reading(void **state)
{
    fy_backend_t *cpu = NULL;
    fy_backend_params_t bp = {.n_threads = 2};
    assert_int_equal(fy_backend_create("cpu", &bp, &cpu), FY_OK);
    fy_backend_reserve_t res = {.max_tokens = 8,
                                .max_row = 4096,
                                .max_seqs = 1,
                                .max_blocks = 1,
                                .max_kv_len = 16,
                                .n_heads = 1,
                                .head_dim = 64};
    assert_int_equal(fy_backend_reserve(cpu, &res), FY_OK);
    for (int i = 0; i < 16; i++) assert_int_equal(fyq_iq4nl((uint32_t)i), fy_iq4nl_values[i]);
    for (size_t ti = 0; ti < N_WTYPES; ti++) {
        const fy_dtype_t dt = g_wtypes[ti];
        const bool quant = fy_dtype_is_quantized(dt);
        /* K-quants: 4096; 32-element types: a width that is not whole 256s and an odd count of blocks */
        const int32_t widths[2] = {4096, fy_dtype_info(dt)->block_elems == 256 ? 2816 : quant ? 1056 : 1000};
        for (int wi = 0; wi < 2; wi++) {
            const int32_t in = widths[wi], n = 3;
            const int64_t rows = 37;
            size_t rb;
            uint8_t *w = random_weight(dt, rows, in, &rb);
            float *ref = fy_malloc((size_t)in * sizeof(float));
            double *absw = fy_calloc((size_t)rows * in, sizeof(double));
            for (int64_t r = 0; r < rows; r++) {
                const uint8_t *row = w + (size_t)r * rb;
                fy_dequantize_row(dt, row, ref, in);
                for (int32_t k = 0; k < in; k++) {
                    float got = fyq_deq(dt, row, k);
                    if (memcmp(&got, &ref[k], sizeof(float)) != 0)
                        fail_msg("%s: element %d of row %lld is %.9g, dequantize_row says %.9g", fy_dtype_name(dt), k,
                                 (long long)r, got, ref[k]);
                    absw[(size_t)r * in + k] = fabs(ref[k]);
                }
                for (int32_t b = 0; quant && b < in / 32; b++) {
                    fyq_sub_t sb;
                    fyq_sub_load(dt, row, b, &sb);
                    for (int l = 0; l < 32; l++) {
                        float a = sb.a[l / 16], e = sb.e[l / 16];
                        int q = (int8_t)(uint8_t)(sb.q[l / 4] >> (8 * (l % 4)));
                        float v = a * (float)q + e + sb.c;
                        float bound = 4 * FLT_EPSILON * (fabsf(a * (float)q) + fabsf(e) + fabsf(sb.c)) + 1e-30f;
                        if (!(fabsf(v - ref[32 * b + l]) <= bound))
                            fail_msg("%s: block %d element %d decodes to %.9g, dequantize_row says %.9g",
                                     fy_dtype_name(dt), b, l, v, ref[32 * b + l]);
                    }
                }
            }
            float *x = fy_malloc((size_t)n * in * sizeof(float));
            for (size_t i = 0; i < (size_t)n * in; i++) x[i] = qrand();
            int8_t *xq = fy_malloc((size_t)n * in);
            float *xd = fy_malloc((size_t)n * (in / 32 + 1) * sizeof(float));
            if (quant) emu_quantize_q8(x, n, in, xq, xd);
            float *got = fy_malloc((size_t)n * rows * sizeof(float)),
                  *want = fy_malloc((size_t)n * rows * sizeof(float));
            emu_mmv(dt, w, rb, rows, in, x, xq, xd, n, got);
            fy_tensor_t host = {dt, {in, rows}, rb, rb * (size_t)rows, w, 0}, dev;
            assert_int_equal(fy_backend_upload(cpu, &host, FY_USE_MATMUL, &dev), FY_OK);
            const fy_tensor_t *wl[1] = {&dev};
            float *yl[1] = {want};
            assert_int_equal(fy_backend_matmul(cpu, 1, wl, x, n, yl), FY_OK);
            /* |w| . |x|: the scale of every rounding; quantized: 8 (blocks + 64) roundings of it, the 8 for the
             * scale and minimum parts of a weight (up to 4 |w| here) on both sides; float: 2 (in + 64) */
            for (int32_t tk = 0; tk < n; tk++) {
                for (int64_t r = 0; r < rows; r++) {
                    double A = 0;
                    for (int32_t k = 0; k < in; k++) A += absw[(size_t)r * in + k] * fabs(x[(size_t)tk * in + k]);
                    double tol = (quant ? 8.0 * (in / 32 + 64) : 2.0 * (in + 64)) * ldexp(1.0, -24) * A;
                    size_t i = (size_t)tk * rows + (size_t)r;
                    if (!(fabs((double)got[i] - want[i]) <= tol))
                        fail_msg("%s width %d: row %lld token %d is %.9g, the cpu backend says %.9g (tolerance %g)",
                                 fy_dtype_name(dt), in, (long long)r, tk, got[i], want[i], tol);
                }
            }
            fy_backend_release_tensor(cpu, &dev);
            fy_free(w), fy_free(ref), fy_free(absw), fy_free(x), fy_free(xq), fy_free(xd), fy_free(got), fy_free(want);
        }
    }
    fy_backend_destroy(cpu);
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

/* embed and matmul for every weight dtype at the batch's 21 tokens (the
 * GEMM on bf16 tiles) against the CPU's own arithmetic (q8 activations for
 * quantized weights): a loose tolerance for bf16's 8 bits of mantissa over
 * the dot product; test_quant_matmul compares like with like */
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
        expect_close(fy_dtype_name(dt), ref, got, e, 0, 0); /* the stored rows, dequantized as the cpu does */

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

/* ---- weights as stored, on the GPU (need one) ------------------------------------------ */

#define SKIP_WITHOUT_GPU()                                                                                             \
    do {                                                                                                               \
        char why_[192] = "";                                                                                           \
        if (!fy_backend_cuda_usable(why_, sizeof(why_))) {                                                             \
            printf("no CUDA device: %s; skipping\n", why_);                                                            \
            skip();                                                                                                    \
        }                                                                                                              \
    } while (0)

static float bf16_round(float v) { return fy_bf16_to_fp32(fy_fp32_to_bf16(v)); }

/* One weight of a matmul call, uploaded four ways: as stored to the GPU and
 * to the CPU backend, and as f32 tensors of its bf16-rounded values and of
 * their magnitudes to the CPU backend (the prefill reference and the scale
 * of the tolerance). */
typedef struct qweight {
    int64_t rows;
    uint8_t *q;
    float *wf, *wa;
    fy_tensor_t g, c, cf, ca;
} qweight_t;

static void qweight_make(fy_backend_t *cpu, fy_backend_t *gpu, fy_dtype_t dt, int64_t rows, int32_t in, qweight_t *w)
{
    size_t rb;
    w->rows = rows;
    w->q = random_weight(dt, rows, in, &rb);
    w->wf = fy_malloc((size_t)rows * in * sizeof(float));
    w->wa = fy_malloc((size_t)rows * in * sizeof(float));
    for (int64_t r = 0; r < rows; r++) fy_dequantize_row(dt, w->q + (size_t)r * rb, w->wf + (size_t)r * in, in);
    for (size_t i = 0; i < (size_t)rows * in; i++) w->wf[i] = bf16_round(w->wf[i]), w->wa[i] = fabsf(w->wf[i]);
    fy_tensor_t h = {dt, {in, rows}, rb, rb * (size_t)rows, w->q, 0};
    fy_tensor_t hf = {FY_DTYPE_F32, {in, rows}, (size_t)in * 4, (size_t)in * 4 * (size_t)rows, w->wf, 0};
    fy_tensor_t ha = hf;
    ha.data = w->wa;
    assert_int_equal(fy_backend_upload(gpu, &h, FY_USE_MATMUL, &w->g), FY_OK);
    assert_int_equal(fy_backend_upload(cpu, &h, FY_USE_MATMUL, &w->c), FY_OK);
    assert_int_equal(fy_backend_upload(cpu, &hf, FY_USE_MATMUL, &w->cf), FY_OK);
    assert_int_equal(fy_backend_upload(cpu, &ha, FY_USE_MATMUL, &w->ca), FY_OK);
}

static void qweight_drop(fy_backend_t *cpu, fy_backend_t *gpu, qweight_t *w)
{
    fy_backend_release_tensor(gpu, &w->g);
    fy_backend_release_tensor(cpu, &w->c);
    fy_backend_release_tensor(cpu, &w->cf);
    fy_backend_release_tensor(cpu, &w->ca);
    fy_free(w->q), fy_free(w->wf), fy_free(w->wa);
}

/*
 * Matmul of every weight type as the runner calls it (3 weights for
 * q/k/v, 2 for gate/up; in = 4096, and a width that is not whole 256s
 * where the type allows), for n = 1, 3, 8 (the vector kernels) and 9, 64
 * (the GEMM on dequantized tiles; Q4_K also as a head of 9000 rows, more
 * than one tile holds), each against the CPU backend doing the
 * same arithmetic:
 *  - n <= 8: the CPU backend on the same stored weights and x.  For the
 *    quantized types both sides quantize x to q8 per 32 with the same
 *    bits and sum each block's integers exactly; for F32/F16/BF16 both
 *    multiply in f32.  What differs is the order of f32 operations.
 *  - n > 8: the CPU backend's f32 matmul of the weights dequantized and
 *    rounded to bf16 and of x rounded to bf16, which is what the GPU
 *    multiplies (bf16 products are exact in f32): again only the order of
 *    the f32 sums differs.
 * Tolerance, with A = |W'| . |x| per element (the CPU's f32 matmul of the
 * magnitudes): reordering in f32 moves a sum of in terms by at most
 * (in - 1) 2^-24 A on each side, so 2 (in + 64) 2^-24 A; for the quantized
 * types at n <= 8 only the in / 32 block terms are summed in f32, so
 * 8 (in / 32 + 64) 2^-24 A (8: each block's float parts, scale and
 * minimum, reach 4 |w| for these weights).  A 32-element block read
 * wrongly moves a row by about 1 (these weights and x), hundreds of
 * tolerances at n <= 8 and one or two for the GEMM.
 */
static void test_quant_matmul(void **state)
{
    SKIP_WITHOUT_GPU();
    fy_backend_t *cpu = NULL, *gpu = NULL;
    fy_backend_params_t bp = {.n_threads = 0};
    assert_int_equal(fy_backend_create("cpu", &bp, &cpu), FY_OK);
    assert_int_equal(fy_backend_create("cuda", &bp, &gpu), FY_OK);
    fy_backend_reserve_t res = {.max_tokens = 64,
                                .max_row = 4096,
                                .max_seqs = 1,
                                .max_blocks = 1,
                                .max_kv_len = 16,
                                .n_heads = 1,
                                .head_dim = 64};
    assert_int_equal(fy_backend_reserve(cpu, &res), FY_OK);
    assert_int_equal(fy_backend_reserve(gpu, &res), FY_OK);
    const int32_t ns[] = {1, 3, 8, 9, 64};
    /* both vector kernels (FY_CUDA_MMV, read at each call): lanes, and staged through shared memory */
    for (size_t vi = 0, ti = 0; vi < 2; vi += ti == N_WTYPES - 1, ti = (ti + 1) % N_WTYPES) {
        setenv("FY_CUDA_MMV", vi ? "staged" : "lanes", 1);
        const fy_dtype_t dt = g_wtypes[ti];
        const bool quant = fy_dtype_is_quantized(dt);
        /* Q4_K also as an output head of 9000 rows: three tiles of the GEMM (4096 rows of 4096 each) */
        for (int call = 0; call < (dt == FY_DTYPE_Q4_K ? 3 : 2); call++) {
            const int n_w = call == 2 ? 1 : call ? 2 : 3;
            const int32_t in = call == 1 ? (fy_dtype_info(dt)->block_elems == 256 ? 2816 : quant ? 1056 : 1000) : 4096;
            const int64_t rows[3] = {call == 2 ? 9000 : call ? 1000 : 1024, call ? 1000 : 256, 250};
            qweight_t w[3];
            for (int i = 0; i < n_w; i++) qweight_make(cpu, gpu, dt, rows[i], in, &w[i]);
            const fy_tensor_t *gw[3], *cw[3], *cfw[3], *caw[3];
            for (int i = 0; i < n_w; i++) gw[i] = &w[i].g, cw[i] = &w[i].c, cfw[i] = &w[i].cf, caw[i] = &w[i].ca;
            for (size_t ni = 0; ni < sizeof(ns) / sizeof(ns[0]); ni++) {
                const int32_t n = ns[ni];
                const bool vec = n <= FY_CUDA_MMV_MAX_N;
                if (vi && !vec) continue; /* the GEMM does not depend on FY_CUDA_MMV */
                size_t e = (size_t)n * in;
                float *x = fy_malloc(e * sizeof(float)), *xb = fy_malloc(e * sizeof(float));
                float *xa = fy_malloc(e * sizeof(float));
                for (size_t i = 0; i < e; i++) {
                    x[i] = qrand();
                    xb[i] = bf16_round(x[i]);
                    xa[i] = fabsf(vec ? x[i] : xb[i]);
                }
                float *xd = dev_floats(gpu, x, e);
                float *yd[3], *ref[3], *amag[3], *got[3];
                for (int i = 0; i < n_w; i++) {
                    size_t o = (size_t)n * rows[i];
                    yd[i] = dev_floats(gpu, NULL, o);
                    ref[i] = fy_malloc(o * sizeof(float));
                    amag[i] = fy_malloc(o * sizeof(float));
                    got[i] = fy_malloc(o * sizeof(float));
                }
                assert_int_equal(fy_backend_matmul(gpu, n_w, gw, xd, n, yd), FY_OK);
                if (vec)
                    assert_int_equal(fy_backend_matmul(cpu, n_w, cw, x, n, ref), FY_OK);
                else
                    assert_int_equal(fy_backend_matmul(cpu, n_w, cfw, xb, n, ref), FY_OK);
                assert_int_equal(fy_backend_matmul(cpu, n_w, caw, xa, n, amag), FY_OK);
                const double f = (quant && vec ? 8.0 * (in / 32 + 64) : 2.0 * (in + 64)) * ldexp(1.0, -24);
                for (int i = 0; i < n_w; i++) {
                    size_t o = (size_t)n * rows[i];
                    fetch(gpu, got[i], yd[i], o);
                    for (size_t k = 0; k < o; k++) {
                        double tol = f * amag[i][k] + 1e-6;
                        if (!isfinite(got[i][k]) || !(fabs((double)got[i][k] - ref[i][k]) <= tol))
                            fail_msg("matmul %s (%s), %d weights of width %d, n %d: weight %d row %lld token %lld is "
                                     "%.9g, the cpu says %.9g (tolerance %g) seed %u",
                                     fy_dtype_name(dt), getenv("FY_CUDA_MMV"), n_w, in, n, i, (long long)(k % rows[i]),
                                     (long long)(k / rows[i]), got[i][k], ref[i][k], tol, SEED);
                    }
                    fy_backend_free(gpu, yd[i]);
                    fy_free(ref[i]), fy_free(amag[i]), fy_free(got[i]);
                }
                fy_backend_free(gpu, xd);
                fy_free(x), fy_free(xb), fy_free(xa);
            }
            for (int i = 0; i < n_w; i++) qweight_drop(cpu, gpu, &w[i]);
        }
    }
    unsetenv("FY_CUDA_MMV");
    fy_backend_destroy(cpu);
    fy_backend_destroy(gpu);
}

/* The embedding lookup of every type reads the stored rows: bit for bit
 * the CPU's dequantized rows.  A tied output head is the same device copy
 * and outlives neither use: the table still reads right after the head
 * is released. */
static void test_quant_embed(void **state)
{
    pair_t *p = *state;
    NEED_GPU(p);
    int32_t n;
    set_batch_both(p, &n);
    for (size_t ti = 0; ti < N_WTYPES; ti++) {
        const fy_dtype_t dt = g_wtypes[ti];
        const bool quant = fy_dtype_is_quantized(dt);
        const int32_t dims[2] = {512, fy_dtype_info(dt)->block_elems == 256 ? 768 : quant ? 544 : 500};
        for (int di = 0; di < 2; di++) {
            const int32_t dim = dims[di];
            size_t rb, e = (size_t)n * dim;
            uint8_t *tab = random_weight(dt, VOCAB, dim, &rb);
            fy_tensor_t host = {dt, {dim, VOCAB}, rb, rb * VOCAB, tab, 0}, ec, eg, head;
            assert_int_equal(fy_backend_upload(p->cpu, &host, FY_USE_ROWS, &ec), FY_OK);
            assert_int_equal(fy_backend_upload(p->gpu, &host, FY_USE_ROWS, &eg), FY_OK);
            assert_int_equal(fy_backend_upload(p->gpu, &host, FY_USE_MATMUL, &head), FY_OK);
            assert_ptr_equal(head.data, eg.data); /* tied: one device copy */
            float *ref = fy_malloc(e * sizeof(float)), *got = fy_malloc(e * sizeof(float));
            float *od = dev_floats(p->gpu, NULL, e);
            assert_int_equal(fy_backend_embed(p->cpu, &ec, ref), FY_OK);
            for (int pass = 0; pass < 2; pass++) {
                assert_int_equal(fy_backend_embed(p->gpu, &eg, od), FY_OK);
                fetch(p->gpu, got, od, e);
                for (size_t i = 0; i < e; i++)
                    if (memcmp(&got[i], &ref[i], sizeof(float)) != 0)
                        fail_msg("embed %s dim %d%s: element %zu is %.9g, the cpu says %.9g", fy_dtype_name(dt), dim,
                                 pass ? " after the tied head was released" : "", i, got[i], ref[i]);
                if (pass == 0) fy_backend_release_tensor(p->gpu, &head);
            }
            fy_backend_release_tensor(p->cpu, &ec);
            fy_backend_release_tensor(p->gpu, &eg);
            fy_backend_free(p->gpu, od);
            fy_free(tab), fy_free(ref), fy_free(got);
        }
    }
}

/* A weight larger than the staging buffers together arrives byte for byte;
 * a second upload of the same host tensor takes no device memory and the
 * copy goes with the last release; weights the device cannot hold are
 * refused, naming why. */
static void test_quant_upload(void **state)
{
    SKIP_WITHOUT_GPU();
    fy_backend_t *gpu = NULL;
    fy_backend_params_t bp = {.n_threads = 0};
    assert_int_equal(fy_backend_create("cuda", &bp, &gpu), FY_OK);
    const int64_t in = 4096, rows = 5000; /* 82 MB of f32: 5 chunks through 3 buffers */
    const size_t bytes = (size_t)in * rows * 4, slack = (size_t)16 << 20;
    float *w = fy_malloc(bytes);
    for (size_t i = 0; i < bytes / 4; i++) w[i] = qrand();
    fy_tensor_t host = {FY_DTYPE_F32, {in, rows}, (size_t)in * 4, bytes, w, 0}, a, b;
    int64_t total, free0, free1, free2, free3;
    assert_int_equal(fy_backend_mem_info(gpu, &total, &free0), FY_OK);
    assert_int_equal(fy_backend_upload(gpu, &host, FY_USE_MATMUL, &a), FY_OK);
    assert_int_equal(fy_backend_mem_info(gpu, &total, &free1), FY_OK);
    assert_true(free1 <= free0 - (int64_t)bytes + (int64_t)slack);
    assert_int_equal(fy_backend_upload(gpu, &host, FY_USE_ROWS, &b), FY_OK);
    assert_ptr_equal(a.data, b.data);
    assert_int_equal(fy_backend_mem_info(gpu, &total, &free2), FY_OK);
    assert_true(free2 >= free1 - (int64_t)slack);
    float *back = fy_malloc(bytes);
    assert_int_equal(fy_backend_memcpy(gpu, back, a.data, bytes, FY_COPY_D2H), FY_OK);
    assert_memory_equal(back, w, bytes);
    fy_backend_release_tensor(gpu, &a);
    memset(back, 0, bytes);
    assert_int_equal(fy_backend_memcpy(gpu, back, b.data, bytes, FY_COPY_D2H), FY_OK);
    assert_memory_equal(back, w, bytes);
    fy_backend_release_tensor(gpu, &b);
    assert_int_equal(fy_backend_mem_info(gpu, &total, &free3), FY_OK);
    assert_true(free3 >= free1 + (int64_t)bytes - (int64_t)slack);

    /* refused: a type with no kernel, rows that are not as the type stores them */
    static uint8_t fp8[64 * 8];
    fy_tensor_t bad = {FY_DTYPE_FP8, {64, 8}, 64, sizeof(fp8), fp8, 0}, d;
    fy_test_log_begin();
    assert_int_equal(fy_backend_upload(gpu, &bad, FY_USE_MATMUL, &d), FY_ERR_UNSUPPORTED);
    fy_test_log_end();
    assert_true(fy_test_log_has("cannot upload for matmul", "fp8 has no GPU kernel", NULL));
    bad = (fy_tensor_t){FY_DTYPE_Q8_0, {64, 4}, 80, 320, fp8, 0};
    fy_test_log_begin();
    assert_int_equal(fy_backend_upload(gpu, &bad, FY_USE_ROWS, &d), FY_ERR_INVALID);
    fy_test_log_end();
    assert_true(fy_test_log_has("cannot upload for rows", "rows of 80 bytes (expected 68)", NULL));
    fy_free(w), fy_free(back);
    fy_backend_destroy(gpu);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_fallback),   cmocka_unit_test(test_plan_types_paths),
        cmocka_unit_test(test_plan_weight_check), cmocka_unit_test(test_plan_scratch_tiles),
        cmocka_unit_test(test_plan_staging),      cmocka_unit_test(test_plan_share),
        cmocka_unit_test(test_qblock_reading),    cmocka_unit_test(test_attn_plan),
        cmocka_unit_test(test_elementwise),       cmocka_unit_test(test_embed_matmul),
        cmocka_unit_test(test_kv_attention),      cmocka_unit_test(test_attention_shapes),
        cmocka_unit_test(test_copy_blocks_d2d),   cmocka_unit_test(test_quant_matmul),
        cmocka_unit_test(test_quant_embed),       cmocka_unit_test(test_quant_upload),
    };
    return cmocka_run_group_tests(tests, setup_pair, teardown_pair);
}

/*
 * test_kernels.c - the kernel layer: quantized formats against blocks
 * worked out by hand, half-precision conversions, scalar against AVX2
 * inner loops on identical inputs, paged attention against contiguous
 * attention for every block size, and the thread pool.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/backend.h"
#include "common/clock.h"
#include "kernels/cpu/cpu_kernels.h"
#include "common/dtype.h"
#include "kv/kv.h"
#include "common/mem.h"
#include "bench/stats.h" /* bench/: cmp_double */
#include "tests/testutil.h"
#include "kernels/cpu/threadpool.h"

/* ---- formats ------------------------------------------------------------------------ */

static void test_fp16_known_values(void **state)
{
    assert_int_equal(fy_fp32_to_fp16(1.0f), 0x3c00);
    assert_int_equal(fy_fp32_to_fp16(-2.0f), 0xc000);
    assert_int_equal(fy_fp32_to_fp16(0.5f), 0x3800);
    assert_int_equal(fy_fp32_to_fp16(65504.0f), 0x7bff);
    assert_int_equal(fy_fp32_to_fp16(65520.0f), 0x7c00); /* rounds up to inf */
    assert_int_equal(fy_fp32_to_fp16(1e9f), 0x7c00);
    assert_int_equal(fy_fp32_to_fp16(5.9604645e-8f), 0x0001);        /* smallest subnormal */
    assert_int_equal(fy_fp32_to_fp16(2.9802322e-8f), 0x0000);        /* half of it: ties to even */
    assert_int_equal(fy_fp32_to_fp16(1.0f + 1.0f / 2048), 0x3c00);   /* tie, to even */
    assert_int_equal(fy_fp32_to_fp16(1.0f + 3.0f / 2048), 0x3c02);   /* tie, to even (up) */
    assert_true(fy_fp16_to_fp32(0x7e00) != fy_fp16_to_fp32(0x7e00)); /* NaN */
    assert_float_equal(fy_fp16_to_fp32(0x3555), 0.33325195f, 0);
    /* every finite half survives the round trip */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue; /* NaN payloads */
        assert_int_equal(fy_fp32_to_fp16(fy_fp16_to_fp32((uint16_t)h)), h);
    }
}

/* Every fp8 e4m3 code decodes to the value its bits say and encodes back
 * to itself (NaN to NaN); rounding is to nearest even, saturating. */
static void test_fp8_e4m3_codec(void **state)
{
    for (int b = 0; b < 256; b++) {
        int sign = b >> 7, e = (b >> 3) & 15, m = b & 7;
        float v = fy_fp8_to_fp32((uint8_t)b);
        if (e == 15 && m == 7) {
            assert_true(isnan(v));
            assert_int_equal(fy_fp32_to_fp8(v) & 0x7f, 0x7f);
            continue;
        }
        double want = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
        if (sign) want = -want;
        assert_true((double)v == want);
        assert_int_equal(fy_fp32_to_fp8(v), b);
    }
    assert_true(fy_fp8_to_fp32(0x7e) == 448.0f);
    assert_true(fy_fp8_to_fp32(0x01) == 0x1p-9f); /* smallest subnormal */
    assert_true(fy_fp8_to_fp32(0x08) == 0x1p-6f); /* smallest normal */
    assert_int_equal(fy_fp32_to_fp8(1e9f), 0x7e); /* saturates */
    assert_int_equal(fy_fp32_to_fp8(-INFINITY), 0xfe);
    assert_int_equal(fy_fp32_to_fp8(464.0f), 0x7e);
    assert_int_equal(fy_fp32_to_fp8(0x1p-11f), 0x00);     /* below half the smallest subnormal */
    assert_int_equal(fy_fp32_to_fp8(0x1p-10f), 0x00);     /* half: ties to even (0) */
    assert_int_equal(fy_fp32_to_fp8(3 * 0x1p-10f), 0x02); /* 1.5 ulp: ties to even (2) */
    assert_int_equal(fy_fp32_to_fp8(1.0625f), 0x38);      /* 1 + 1/16: tie, to even 1.0 */
    assert_int_equal(fy_fp32_to_fp8(1.1875f), 0x3a);      /* 1 + 3/16: tie, to even 1.25 */
    assert_int_equal(fy_fp32_to_fp8(15.5f),
                     0x58); /* 15.5: tie between 15 (0x57) and 16, to even: carries into the exponent */
    /* every float between two neighbours rounds to the nearer one */
    uint64_t s = 11;
    for (int i = 0; i < 100000; i++) {
        float x = fy_test_rand_uniform(&s) * 500.0f;
        float y = fy_fp8_to_fp32(fy_fp32_to_fp8(x));
        float ax = fabsf(x);
        if (ax >= 448.0f) {
            assert_true(fabsf(y) == 448.0f);
            continue;
        }
        /* the error is at most half a step: 2^(e-3)/2 for normals, 2^-10 for subnormals */
        int ex;
        frexpf(ax, &ex);
        double half = ax < 0x1p-6f ? 0x1p-10 : ldexp(1.0, ex - 1 - 3) / 2;
        assert_true(fabs((double)y - x) <= half);
    }
    (void)state;
}

/* Scaled KV rows: int8 error at most half a step (max|x| / 254) per
 * element, fp8 within 1/16 of the magnitude (3 mantissa bits), an all-zero
 * row stays zero, and the row is [f32 scale][codes]. */
static void test_kv_scaled_rows(void **state)
{
    const int hd = 64;
    fy_kv_layout_t l8, lf;
    assert_int_equal(fy_kv_layout_init(&l8, 2, 3, hd, 16, FY_DTYPE_I8), FY_OK);
    assert_int_equal(fy_kv_layout_init(&lf, 2, 3, hd, 16, FY_DTYPE_FP8), FY_OK);
    assert_int_equal(l8.row_bytes, hd + 4);
    assert_int_equal(lf.row_bytes, hd + 4);
    assert_int_equal(lf.block_bytes, (size_t)2 * 2 * 3 * 16 * (hd + 4));
    /* what the transfer descriptor carries: a peer of another format is refused */
    fy_kv_layout_t l16;
    assert_int_equal(fy_kv_layout_init(&l16, 2, 3, hd, 16, FY_DTYPE_F16), FY_OK);
    assert_int_equal(fy_kv_scale_format(&l16), FY_KV_SCALE_NONE);
    assert_int_equal(fy_kv_scale_format(&lf), FY_KV_SCALE_ROW_F32);
    assert_int_equal(fy_kv_scale_format(&l8), FY_KV_SCALE_ROW_F32);
    fy_kv_layout_t bad;
    assert_int_equal(fy_kv_layout_init(&bad, 2, 3, hd, 16, FY_DTYPE_Q8_0), FY_ERR_INVALID);
    float x[64], y[64];
    char row[68];
    uint64_t s = 5;
    for (int rep = 0; rep < 200; rep++) {
        float mag = rep % 3 == 0 ? 1e-3f : rep % 3 == 1 ? 1.0f : 300.0f;
        float amax = 0;
        for (int i = 0; i < hd; i++) x[i] = fy_test_rand_uniform(&s) * mag, amax = fmaxf(amax, fabsf(x[i]));
        if (rep == 7) memset(x, 0, sizeof(x)), amax = 0;
        fy_kv_row_write(&l8, x, row);
        float sc;
        memcpy(&sc, row, 4);
        assert_true(sc == amax / 127.0f);
        fy_kv_row_read(&l8, row, y);
        for (int i = 0; i < hd; i++) assert_true(fabsf(y[i] - x[i]) <= amax / 254.0f * 1.0001f + 1e-30f);
        fy_kv_row_write(&lf, x, row);
        fy_kv_row_read(&lf, row, y);
        for (int i = 0; i < hd; i++)
            assert_true(fabsf(y[i] - x[i]) <= fabsf(x[i]) / 16.0f * 1.0001f + amax * 0x1p-10f / 448.0f * 1.01f);
        if (rep == 7)
            for (int i = 0; i < hd; i++) assert_true(y[i] == 0.0f);
    }
    (void)state;
}

static void test_bf16(void **state)
{
    assert_int_equal(fy_fp32_to_bf16(1.0f), 0x3f80);
    assert_float_equal(fy_bf16_to_fp32(0x4049), 3.140625f, 0);
    assert_int_equal(fy_fp32_to_bf16(fy_fp32_from_bits(0x3f808000)), 0x3f80); /* tie to even */
    assert_int_equal(fy_fp32_to_bf16(fy_fp32_from_bits(0x3f818000)), 0x3f82);
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7f80) == 0x7f80 && (h & 0x7f)) continue;
        assert_int_equal(fy_fp32_to_bf16(fy_bf16_to_fp32((uint16_t)h)), h);
    }
}

static void test_q8_0_by_hand(void **state)
{
    fy_block_q8_0_t b;
    b.d = 0x3800; /* 0.5 */
    for (int i = 0; i < 32; i++) b.qs[i] = (int8_t)(i - 16);
    float out[32];
    fy_dequantize_row(FY_DTYPE_Q8_0, &b, out, 32);
    for (int i = 0; i < 32; i++) assert_float_equal(out[i], 0.5f * (i - 16), 0);
}

static void test_q4_0_by_hand(void **state)
{
    fy_block_q4_0_t b;
    b.d = 0x4000; /* 2.0 */
    for (int i = 0; i < 16; i++) b.qs[i] = (uint8_t)(i | ((15 - i) << 4));
    float out[32];
    fy_dequantize_row(FY_DTYPE_Q4_0, &b, out, 32);
    /* element i (i < 16) is the low nibble, element i + 16 the high one; x = d (q - 8) */
    for (int i = 0; i < 16; i++) {
        assert_float_equal(out[i], 2.0f * (i - 8), 0);
        assert_float_equal(out[i + 16], 2.0f * (15 - i - 8), 0);
    }
    assert_float_equal(out[0], -16.0f, 0);
    assert_float_equal(out[31], -16.0f, 0);
    assert_float_equal(out[16], 14.0f, 0);
}

static void test_q4_1_by_hand(void **state)
{
    fy_block_q4_1_t b;
    b.d = 0x3400; /* 0.25 */
    b.m = 0xbc00; /* -1.0 */
    for (int i = 0; i < 16; i++) b.qs[i] = (uint8_t)((i % 16) | (3 << 4));
    float out[32];
    fy_dequantize_row(FY_DTYPE_Q4_1, &b, out, 32);
    for (int i = 0; i < 16; i++) {
        assert_float_equal(out[i], 0.25f * i - 1.0f, 0);
        assert_float_equal(out[i + 16], 0.25f * 3 - 1.0f, 0);
    }
    assert_float_equal(out[15], 2.75f, 0);
}

static void test_quantize_roundtrip_error(void **state)
{
    uint64_t s = 3;
    float x[256], y[256];
    for (int i = 0; i < 256; i++) x[i] = fy_test_rand_uniform(&s);
    struct {
        fy_dtype_t t;
        double tol; /* relative L2 error bound */
    } cases[] = {{FY_DTYPE_Q8_0, 0.01},
                 {FY_DTYPE_Q4_0, 0.15},
                 {FY_DTYPE_Q4_1, 0.12},
                 {FY_DTYPE_F16, 1e-3},
                 {FY_DTYPE_BF16, 8e-3}};
    for (size_t c = 0; c < FY_ARRAY_LEN(cases); c++) {
        char buf[1024];
        fy_quantize_row(cases[c].t, x, buf, 256);
        fy_dequantize_row(cases[c].t, buf, y, 256);
        double num = 0, den = 0;
        for (int i = 0; i < 256; i++) num += (x[i] - y[i]) * (x[i] - y[i]), den += x[i] * x[i];
        assert_true(sqrt(num / den) < cases[c].tol);
    }
    size_t rb;
    assert_int_equal(fy_dtype_row_bytes(FY_DTYPE_Q4_1, 33, &rb), FY_ERR_INVALID);
    assert_int_equal(fy_dtype_row_bytes(FY_DTYPE_Q4_1, 64, &rb), FY_OK);
    assert_int_equal(rb, 40);
}

/* ---- scalar against AVX2 ------------------------------------------------------------ */

static void test_isa_kernels_agree(void **state)
{
    if (!fy_cpu_has_avx2()) skip();
    const fy_cpu_kernels_t *S = &fy_cpu_kernels_scalar, *A = &fy_cpu_kernels_avx2;
    uint64_t s = 17;
    enum { N = 1632 }; /* 51 blocks: groups of 8 and a tail */
    float *x = malloc(N * sizeof(float)), *w = malloc(N * sizeof(float));
    void *ms = fy_aligned_alloc(64, fy_q8a_bytes(N)), *ma = fy_aligned_alloc(64, fy_q8a_bytes(N));
    memset(ms, 0, fy_q8a_bytes(N)), memset(ma, 0, fy_q8a_bytes(N));
    fy_q8a_t qs = fy_q8a_at(ms, N), qa = fy_q8a_at(ma, N);
    char *wq = malloc(N * 4);
    for (int rep = 0; rep < 50; rep++) {
        float scale = rep % 2 ? 1000.0f : 0.01f;
        for (int i = 0; i < N; i++) x[i] = fy_test_rand_uniform(&s) * scale, w[i] = fy_test_rand_uniform(&s);
        if (rep == 3) memset(x, 0, 32 * sizeof(float)); /* an all-zero block */
        S->quantize_q8a(x, &qs, N);
        A->quantize_q8a(x, &qa, N);
        assert_memory_equal(ms, ma, fy_q8a_bytes(N)); /* same rounding, same bits */
        for (int t = 0; t < FY_DTYPE_COUNT; t++) {
            if (!S->vec_dot[t]) continue; /* fp8, int8: KV element types, never weights */
            if (N % fy_dtype_info((fy_dtype_t)t)->block_elems) continue; /* K-quants: test_quant.c */
            fy_quantize_row((fy_dtype_t)t, w, wq, N);
            const void *xin = fy_dtype_is_quantized((fy_dtype_t)t) ? (const void *)&qs : (const void *)x;
            float a = S->vec_dot[t](wq, xin, N), b = A->vec_dot[t](wq, xin, N);
            /* bound by the magnitudes summed, not the (possibly cancelled) result */
            double mag = 0;
            float wd[N];
            fy_dequantize_row((fy_dtype_t)t, wq, wd, N);
            for (int i = 0; i < N; i++) mag += fabs((double)wd[i] * x[i]);
            assert_true(fabs((double)a - b) <= 1e-5 * mag + 1e-30);
        }
    }
    /* fp8 and int8 KV rows: every code, and the same bits as the reference */
    {
        fy_kv_layout_t lay;
        char row[4 + 256];
        float sc = 0.37f, r1[256], r2[256], r3[256];
        memcpy(row, &sc, 4);
        for (int i = 0; i < 256; i++) row[4 + i] = (char)(i * 37 % 256);
        for (int fp8 = 0; fp8 < 2; fp8++) {
            assert_int_equal(fy_kv_layout_init(&lay, 1, 1, 256, 16, fp8 ? FY_DTYPE_FP8 : FY_DTYPE_I8), FY_OK);
            fy_kv_row_read(&lay, row, r1);
            S->kv_row_read(row, fp8, r2, 256);
            A->kv_row_read(row, fp8, r3, 256);
            assert_memory_equal(r1, r2, sizeof(r1));
            assert_memory_equal(r1, r3, sizeof(r1));
            A->kv_row_read(row, fp8, r3, 13); /* a tail shorter than a vector */
            assert_memory_equal(r1, r3, 13 * sizeof(float));
        }
    }
    /* f16 conversion */
    float xv[100];
    uint16_t h1[100], h2[100];
    for (int i = 0; i < 100; i++) xv[i] = fy_test_rand_uniform(&s);
    S->f32_to_f16(xv, h1, 100);
    A->f32_to_f16(xv, h2, 100);
    assert_memory_equal(h1, h2, sizeof(h1));
    /* gated activations (SwiGLU, GELU-tanh): exp8's polynomial against expf,
     * over gates from the flat tails to the steep middle, and a tail
     * shorter than a vector */
    {
        enum { NE = 1003 };
        float g[NE], u[NE], o1[NE], o2[NE];
        for (int i = 0; i < NE; i++) g[i] = (float)(i - NE / 2) / 25.0f, u[i] = fy_test_rand_uniform(&s);
        for (int act = 0; act < 2; act++) {
            (act ? S->geglu : S->swiglu)(g, u, o1, NE);
            (act ? A->geglu : A->swiglu)(g, u, o2, NE);
            for (int i = 0; i < NE; i++) assert_float_equal(o1[i], o2[i], 2e-6 * (fabsf(o1[i]) + 1e-6f));
        }
        /* GELU-tanh itself against its textbook form, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
        for (int i = 0; i < NE; i++) u[i] = 1.0f;
        S->geglu(g, u, o1, NE);
        for (int i = 0; i < NE; i++) {
            double gx = g[i], want = 0.5 * gx * (1 + tanh(sqrt(2 / M_PI) * (gx + 0.044715 * gx * gx * gx)));
            assert_true(fabs(o1[i] - want) <= 1e-6 * (fabs(want) + 1e-6));
        }
    }
    /* attention blocks: two blocks in a row, so the rescaling runs too */
    for (int kt = 0; kt < 2; kt++) {
        fy_dtype_t t = kt ? FY_DTYPE_F16 : FY_DTYPE_F32;
        enum { G = 3, HD = 64, NK = 13 };
        float q[G * HD], kf[NK * HD], vf[NK * HD];
        uint16_t kh[NK * HD], vh[NK * HD];
        for (int i = 0; i < G * HD; i++) q[i] = fy_test_rand_uniform(&s);
        for (int i = 0; i < NK * HD; i++) kf[i] = fy_test_rand_uniform(&s) * 3, vf[i] = fy_test_rand_uniform(&s);
        S->f32_to_f16(kf, kh, NK * HD);
        S->f32_to_f16(vf, vh, NK * HD);
        const void *kk = kt ? (const void *)kh : kf, *vv = kt ? (const void *)vh : vf;
        float m1[G], l1[G], a1[G * HD], m2[G], l2[G], a2[G * HD], b1[G], b2[G], m0[G], l0[G];
        for (int g = 0; g < G; g++) m1[g] = m2[g] = -INFINITY, l1[g] = l2[g] = 0;
        memset(a1, 0, sizeof(a1)), memset(a2, 0, sizeof(a2));
        for (int rep = 0; rep < 2; rep++) {
            memcpy(m0, m2, sizeof(m0)), memcpy(l0, l2, sizeof(l0));
            S->attn_block[t](q, G, kk, vv, NK - rep * 4, HD, 0.125f, m1, l1, a1, b1);
            A->attn_block[t](q, G, kk, vv, NK - rep * 4, HD, 0.125f, m2, l2, a2, b2);
            /* the block's own sum (H2O) is its share of l in the new frame */
            for (int g = 0; g < G; g++) {
                assert_float_equal(b1[g], b2[g], 1e-5 * b1[g]);
                assert_float_equal(b2[g], l2[g] - l0[g] * expf(m0[g] - m2[g]), 1e-5 * l2[g]);
            }
        }
        for (int g = 0; g < G; g++) {
            assert_float_equal(m1[g], m2[g], 1e-5);
            assert_float_equal(l1[g], l2[g], 1e-5 * l1[g]);
        }
        for (int i = 0; i < G * HD; i++) assert_float_equal(a1[i], a2[i], 1e-5 * (1 + fabsf(a1[i])));
    }
    free(x), free(w), free(wq);
    fy_free(ms), fy_free(ma);
}

/* Packed (x8) gemm kernels of every table this machine runs equal the
 * plain row dots of the scalar table on the same inputs. */
static void test_packed_gemm_matches_rows(void **state)
{
    const char *isas[] = {"avx2", "avxvnni", "avx512vnni"};
    fy_dtype_t types[] = {FY_DTYPE_Q4_0, FY_DTYPE_Q4_1, FY_DTYPE_Q8_0};
    enum { ROWS = 24, N = 1632, TOK = 7 }; /* 3 groups; 51 blocks; a token group of 4 and a tail of 3 */
    uint64_t s = 23;
    float *w = malloc(sizeof(float) * ROWS * N), *x = malloc(sizeof(float) * TOK * N);
    for (int i = 0; i < ROWS * N; i++) w[i] = fy_test_rand_uniform(&s);
    for (int i = 0; i < TOK * N; i++) x[i] = fy_test_rand_uniform(&s) * (i % 7 ? 1.0f : 30.0f);
    char *mem = fy_aligned_alloc(64, fy_q8a_bytes(N) * TOK);
    fy_q8a_t xq[TOK];
    for (int t = 0; t < TOK; t++) {
        xq[t] = fy_q8a_at(mem + (size_t)t * fy_q8a_bytes(N), N);
        fy_cpu_kernels_scalar.quantize_q8a(x + (size_t)t * N, &xq[t], N);
    }
    int ran = 0;
    for (size_t i = 0; i < FY_ARRAY_LEN(isas); i++) {
        const fy_cpu_kernels_t *k = fy_cpu_kernels_pick(isas[i]);
        if (!k) continue;
        for (size_t ti = 0; ti < FY_ARRAY_LEN(types); ti++) {
            fy_dtype_t t = types[ti];
            size_t rb;
            assert_int_equal(fy_dtype_row_bytes(t, N, &rb), FY_OK);
            char *plain = malloc(rb * ROWS), *packed = malloc(rb * ROWS);
            for (int r = 0; r < ROWS; r++) fy_quantize_row(t, w + (size_t)r * N, plain + r * rb, N);
            for (int g = 0; g < ROWS / 8; g++) fy_pack_x8(t, plain + g * 8 * rb, rb, N / 32, packed + g * 8 * rb);
            float y[TOK * ROWS];
            for (int g = 0; g < ROWS / 8; g++) k->gemm_x8[t](packed + g * 8 * rb, N / 32, xq, TOK, y + g * 8, ROWS);
            for (int tok = 0; tok < TOK; tok++) {
                for (int r = 0; r < ROWS; r++) {
                    float want = fy_cpu_kernels_scalar.vec_dot[t](plain + r * rb, &xq[tok], N);
                    float got = y[tok * ROWS + r];
                    if (fabsf(got - want) > 1e-4f * (1.0f + fabsf(want)))
                        fail_msg("%s %s row %d token %d: %g, want %g", isas[i], fy_dtype_name(t), r, tok, got, want);
                }
            }
            /* one token alone gives the same bits as within the group */
            float y1[8];
            k->gemm_x8[t](packed, N / 32, &xq[5], 1, y1, 8);
            assert_memory_equal(y1, y + 5 * ROWS, sizeof(y1));
            /* two groups per wide vector give the same bits as one by one */
            if (k->gemm_x16[t]) {
                float y2[TOK * ROWS];
                k->gemm_x16[t](packed, packed + 8 * rb, N / 32, xq, TOK, y2, ROWS);
                k->gemm_x8[t](packed + 16 * rb, N / 32, xq, TOK, y2 + 16, ROWS);
                assert_memory_equal(y2, y, sizeof(y2));
            }

            free(plain), free(packed);
            ran++;
        }
    }
    free(w), free(x), fy_free(mem);
    if (!ran) skip();
}

/* ---- paged attention ------------------------------------------------------------------ */

typedef struct attn_case {
    int n_seqs;
    int len[4]; /* tokens in the cache after this step */
    int n_q[4]; /* of which queried this step */
} attn_case_t;

enum { REF_MAX_POS = 1024 };

/* Contiguous reference over the same (possibly f16-rounded) K/V: the query
 * at pos sees keys s with s <= pos and, for a window W > 0, pos - s < W
 * (Hugging Face's sliding_window_overlay: kv_idx > q_idx - W), less the
 * positions gone[s] (evicted; gone may be NULL).  A head that sees nothing
 * outputs zeros.  w (may be NULL): [n_heads][pos + 1] the softmax weights
 * (0 where masked). */
static void ref_attention(const float *q, const float *K, const float *V, int n_heads, int n_kv, int hd, int window,
                          double scale, int pos, const unsigned char *gone, double *out, double *w)
{
    int group = n_heads / n_kv, lo = 0;
    while (window && lo <= pos && !(lo > pos - window)) lo++;
    assert_true(pos < REF_MAX_POS);
    for (int h = 0; h < n_heads; h++) {
        int kh = h / group;
        double mx = -INFINITY, sum = 0, sc[REF_MAX_POS];
        for (int s = 0; s <= pos; s++) {
            sc[s] = -INFINITY;
            if (s < lo || (gone && gone[s])) continue;
            double d = 0;
            for (int i = 0; i < hd; i++) d += (double)q[h * hd + i] * K[((size_t)s * n_kv + kh) * hd + i];
            sc[s] = d * scale;
            if (sc[s] > mx) mx = sc[s];
        }
        for (int s = 0; s <= pos; s++) sum += (sc[s] = sc[s] == -INFINITY ? 0 : exp(sc[s] - mx));
        for (int i = 0; i < hd; i++) {
            double a = 0;
            for (int s = 0; s <= pos; s++) a += sc[s] * V[((size_t)s * n_kv + kh) * hd + i];
            out[h * hd + i] = sum > 0 ? a / sum : 0;
        }
        for (int s = 0; w && s <= pos; s++) w[(size_t)h * (pos + 1) + s] = sum > 0 ? sc[s] / sum : 0;
    }
}

/* Which blocks of a sequence are evicted (-1 in its table): never one that
 * holds a query of this step (from kept_from on), as in the engine, which
 * keeps the current token's block. */
typedef enum evict {
    EVICT_NONE = 0,
    EVICT_MIDDLE, /* one block half way */
    EVICT_START,  /* the first two (no attention sink) */
    EVICT_RUNS,   /* runs of three adjacent blocks, one kept between runs */
    EVICT_STREAM, /* StreamingLLM: all but the first block and the last two before the queries */
    EVICT_RANDOM, /* two in five, scattered */
    EVICT_COUNT
} evict_t;

static bool block_evicted(evict_t e, int b, int kept_from, uint64_t seed)
{
    if (b >= kept_from) return false;
    switch (e) {
    case EVICT_MIDDLE: return b == kept_from / 2;
    case EVICT_START: return b < 2;
    case EVICT_RUNS: return b % 4 != 0;
    case EVICT_STREAM: return b >= 1 && b < kept_from - 2;
    case EVICT_RANDOM: {
        uint64_t h = seed * 0x9e3779b97f4a7c15ull + (uint64_t)b;
        return fy_test_rand_u64(&h) % 5 < 2;
    }
    default: return false;
    }
}

/* What a case checks besides the output against the reference. */
typedef struct attn_opts {
    evict_t evict;
    /* H2O: runs the attention again with scores on, checks the same
     * output bits and each block's mass against the reference's weights */
    bool scores;
    float *keep_scores; /* may be NULL: [n_seqs][ATTN_STRIDE] the scores */
    bool no_ref;        /* the caller compares the kept output with another run's instead */
} attn_opts_t;

enum { ATTN_STRIDE = 160 }; /* block-table entries per sequence in these tests (1024 tokens of 8, and spare) */

/* window 0: global; scale 0: 1 / sqrt(head_dim); o may be NULL.  With a
 * window, the block-table entries of blocks wholly before every query's
 * window are pointed at a block of NaNs: reading one would show in the
 * output.  So is the block an evicted entry (-1) would address. */
static void run_attention_case(fy_backend_t *be, int bs, fy_dtype_t kvt, const attn_case_t *c, uint64_t seed,
                               int window, float scale, float *keep, const attn_opts_t *o)
{
    const int n_heads = 6, n_kv = 2, hd = 32, n_layers = 2, layer = 1;
    const attn_opts_t none = {0};
    if (!o) o = &none;
    fy_kv_layout_t lay;
    assert_int_equal(fy_kv_layout_init(&lay, n_layers, n_kv, hd, bs, kvt), FY_OK);
    int total_blocks = 0;
    for (int s = 0; s < c->n_seqs; s++) total_blocks += (c->len[s] + bs - 1) / bs;
    int n_blocks = total_blocks + 8, poison = n_blocks; /* one more block: NaNs in the layer attended */
    char *mem = calloc((size_t)n_blocks + 2, lay.block_bytes), *arena = mem + lay.block_bytes;
    memset(mem, 0xff, lay.block_bytes); /* block -1: NaNs */
    memset(arena + fy_kv_offset(&lay, poison, layer, 0, 0), 0xff, lay.layer_bytes);
    if (!scale) scale = 1.0f / sqrtf((float)hd);
    /* a shuffled block order so that block tables are not the identity */
    int *perm = malloc(sizeof(int) * n_blocks);
    for (int i = 0; i < n_blocks; i++) perm[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        int j = (int)(fy_test_rand_u64(&seed) % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    int32_t tables[4][ATTN_STRIDE];
    unsigned char *gone[4]; /* per position: in an evicted block */
    fy_attn_seq_t seqs[4];
    int used = 0, n_tok = 0;
    for (int s = 0; s < c->n_seqs; s++) {
        int nb = (c->len[s] + bs - 1) / bs;
        assert_true(nb <= ATTN_STRIDE);
        for (int b = 0; b < nb; b++) tables[s][b] = perm[used++];
        seqs[s] = (fy_attn_seq_t){n_tok, c->n_q[s], c->len[s], nb, tables[s], 0};
        n_tok += c->n_q[s];
    }
    /* full K/V of every sequence (f16-rounded when the cache is f16;
     * through the row codec for fp8/int8, the originals kept in K0/V0) */
    float *K[4], *V[4], *K0[4], *V0[4];
    char row[4 + 32 * 4];
    for (int s = 0; s < c->n_seqs; s++) {
        size_t n = (size_t)c->len[s] * n_kv * hd;
        K[s] = malloc(n * sizeof(float)), V[s] = malloc(n * sizeof(float));
        K0[s] = malloc(n * sizeof(float)), V0[s] = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) {
            K[s][i] = fy_test_rand_uniform(&seed) * 2, V[s][i] = fy_test_rand_uniform(&seed);
            if (kvt == FY_DTYPE_F16) {
                K[s][i] = fy_fp16_to_fp32(fy_fp32_to_fp16(K[s][i]));
                V[s][i] = fy_fp16_to_fp32(fy_fp32_to_fp16(V[s][i]));
            }
        }
        memcpy(K0[s], K[s], n * sizeof(float)), memcpy(V0[s], V[s], n * sizeof(float));
        if (fy_kv_dtype_scaled(kvt)) {
            for (size_t i = 0; i < n; i += (size_t)hd) {
                fy_kv_row_write(&lay, K[s] + i, row), fy_kv_row_read(&lay, row, K[s] + i);
                fy_kv_row_write(&lay, V[s] + i, row), fy_kv_row_read(&lay, row, V[s] + i);
            }
        }
    }
    /* earlier tokens: written one batch per sequence, as earlier steps would */
    for (int s = 0; s < c->n_seqs; s++) {
        int old = c->len[s] - c->n_q[s];
        if (!old) continue;
        int32_t *tok = calloc((size_t)old, sizeof(int32_t)), *pos = malloc(sizeof(int32_t) * old),
                *slot = malloc(sizeof(int32_t) * old);
        for (int t = 0; t < old; t++) pos[t] = t, slot[t] = tables[s][t / bs] * bs + t % bs;
        fy_attn_seq_t one = {0, old, old, (old + bs - 1) / bs, tables[s], 0};
        fy_batch_meta_t m = {old, tok, pos, slot, 1, &one, 1};
        assert_int_equal(fy_backend_set_batch(be, &m), FY_OK);
        assert_int_equal(fy_backend_kv_write(be, &lay, arena, layer, K[s], V[s]), FY_OK);
        free(tok), free(pos), free(slot);
    }
    /* blocks wholly before the first query's window hold nothing it may read */
    for (int s = 0; s < c->n_seqs && window; s++) {
        int lo = c->len[s] - c->n_q[s] - window + 1;
        for (int b = 0; (b + 1) * bs <= lo; b++) tables[s][b] = poison;
    }
    /* evicted blocks: gone from the table, anywhere before the queries */
    for (int s = 0; s < c->n_seqs; s++) {
        gone[s] = calloc((size_t)c->len[s], 1);
        int kept_from = (c->len[s] - c->n_q[s]) / bs;
        for (int b = 0; b < kept_from; b++) {
            if (!block_evicted(o->evict, b, kept_from, seed + (uint64_t)s)) continue;
            tables[s][b] = -1;
            for (int i = b * bs; i < (b + 1) * bs; i++) gone[s][i] = 1;
        }
    }
    /* this step: the new tokens of every sequence in one batch */
    int32_t *tok = calloc((size_t)n_tok, sizeof(int32_t)), *pos = malloc(sizeof(int32_t) * n_tok),
            *slot = malloc(sizeof(int32_t) * n_tok);
    float *kn = malloc(sizeof(float) * n_tok * n_kv * hd), *vn = malloc(sizeof(float) * n_tok * n_kv * hd);
    float *q = malloc(sizeof(float) * n_tok * n_heads * hd), *out = malloc(sizeof(float) * n_tok * n_heads * hd);
    for (int s = 0, t = 0; s < c->n_seqs; s++) {
        for (int i = 0; i < c->n_q[s]; i++, t++) {
            int p = c->len[s] - c->n_q[s] + i;
            pos[t] = p;
            slot[t] = tables[s][p / bs] * bs + p % bs;
            memcpy(kn + (size_t)t * n_kv * hd, K[s] + (size_t)p * n_kv * hd, sizeof(float) * n_kv * hd);
            memcpy(vn + (size_t)t * n_kv * hd, V[s] + (size_t)p * n_kv * hd, sizeof(float) * n_kv * hd);
        }
    }
    for (int i = 0; i < n_tok * n_heads * hd; i++) q[i] = fy_test_rand_uniform(&seed);
    fy_batch_meta_t m = {n_tok, tok, pos, slot, c->n_seqs, seqs, 1};
    assert_int_equal(fy_backend_set_batch(be, &m), FY_OK);
    assert_int_equal(fy_backend_kv_write(be, &lay, arena, layer, kn, vn), FY_OK);
    assert_int_equal(fy_backend_attention(be, &lay, arena, layer, n_heads, scale, window, q, out), FY_OK);
    if (keep) memcpy(keep, out, sizeof(float) * n_tok * n_heads * hd);
    /* H2O: the same attention with scores on gives the same bits, and the
     * scores sum each block's softmax weights (checked below) */
    float *scores = NULL;
    if (o->scores) {
        float *out2 = malloc(sizeof(float) * n_tok * n_heads * hd);
        scores = calloc((size_t)c->n_seqs * ATTN_STRIDE, sizeof(float));
        assert_int_equal(fy_backend_set_attn_scores(be, scores, ATTN_STRIDE), FY_OK);
        assert_int_equal(fy_backend_attention(be, &lay, arena, layer, n_heads, scale, window, q, out2), FY_OK);
        assert_memory_equal(out, out2, sizeof(float) * n_tok * n_heads * hd);
        assert_int_equal(fy_backend_set_attn_scores(be, NULL, 0), FY_OK);
        if (o->keep_scores) memcpy(o->keep_scores, scores, sizeof(float) * c->n_seqs * ATTN_STRIDE);
        free(out2);
    }
    double ref[6 * 32], err2 = 0, ref2 = 0, mass_err = 0, *w = malloc(sizeof(double) * n_heads * REF_MAX_POS);
    for (int s = 0, t = 0; s < c->n_seqs && !o->no_ref; s++) {
        double want[ATTN_STRIDE] = {0};
        for (int i = 0; i < c->n_q[s]; i++, t++) {
            /* exact against the stored (rounded) K/V */
            ref_attention(q + (size_t)t * n_heads * hd, K[s], V[s], n_heads, n_kv, hd, window, scale, pos[t], gone[s],
                          ref, w);
            for (int j = 0; j < n_heads * hd; j++) {
                double g = out[(size_t)t * n_heads * hd + j];
                if (!(fabs(g - ref[j]) <= 1e-5 * (1 + fabs(ref[j]))))
                    fail_msg("%s: block %d, window %d, evict %d, seq %d, token %d, elem %d: %g vs %g",
                             fy_dtype_name(kvt), bs, window, o->evict, s, t, j, g, ref[j]);
            }
            for (int h = 0; h < n_heads; h++)
                for (int k = 0; k <= pos[t]; k++) want[k / bs] += w[(size_t)h * (pos[t] + 1) + k];
            /* and close to the unquantized K/V (the quantization's error:
             * eviction changes nothing there) */
            if (o->evict) continue;
            ref_attention(q + (size_t)t * n_heads * hd, K0[s], V0[s], n_heads, n_kv, hd, window, scale, pos[t], gone[s],
                          ref, NULL);
            for (int j = 0; j < n_heads * hd; j++) {
                double d = out[(size_t)t * n_heads * hd + j] - ref[j];
                err2 += d * d, ref2 += ref[j] * ref[j];
            }
        }
        /* every block's mass as the reference's weights sum it; nothing
         * added for evicted blocks or past the sequence; each row's heads
         * add one each */
        for (int b = 0; scores && b < ATTN_STRIDE; b++) {
            double got = scores[s * ATTN_STRIDE + b];
            if (want[b] > 0 && fabs(got - want[b]) / want[b] > mass_err) mass_err = fabs(got - want[b]) / want[b];
            if (!(fabs(got - want[b]) <= 1e-4 * want[b] + 1e-30) || (b < c->len[s] / bs && gone[s][b * bs] && got))
                fail_msg("%s: block %d, window %d, evict %d, seq %d: block %d's mass %.9g vs %.9g", fy_dtype_name(kvt),
                         bs, window, o->evict, s, b, got, want[b]);
        }
        double total = 0;
        for (int b = 0; scores && b < ATTN_STRIDE; b++) total += scores[s * ATTN_STRIDE + b];
        if (scores && !(fabs(total - (double)n_heads * c->n_q[s]) <= 1e-5 * n_heads * c->n_q[s]))
            fail_msg("seq %d: the masses add to %.9g, not %d heads x %d rows", s, total, n_heads, c->n_q[s]);
    }
    /* relative (Frobenius) error of the output against f32 K/V */
    double rel = sqrt(err2 / (ref2 + 1e-30));
    double tol = kvt == FY_DTYPE_FP8 ? 0.05 : kvt == FY_DTYPE_I8 ? 0.01 : 1e-3;
    if (getenv("FY_TEST_VERBOSE"))
        fprintf(stderr, "%s block %d: rel err %.3g, block masses %.3g\n", fy_dtype_name(kvt), bs, rel, mass_err);
    if (rel > tol)
        fail_msg("%s: block %d: relative error %.3g > %.3g against f32 K/V", fy_dtype_name(kvt), bs, rel, tol);
    /* the other layer's slots of the touched blocks stay untouched */
    for (int b = 0; b < n_blocks; b++) {
        const char *l0 = arena + fy_kv_offset(&lay, b, 0, 0, 0);
        for (size_t i = 0; i < lay.layer_bytes; i++) assert_int_equal(l0[i], 0);
    }
    for (int s = 0; s < c->n_seqs; s++) free(K[s]), free(V[s]), free(K0[s]), free(V0[s]), free(gone[s]);
    free(tok), free(pos), free(slot), free(kn), free(vn), free(q), free(out), free(mem), free(perm), free(w);
    free(scores);
}

static void test_paged_attention_matches_contiguous(void **state)
{
    fy_backend_t *be;
    fy_backend_params_t bp = {.n_threads = 2};
    assert_int_equal(fy_backend_create("cpu", &bp, &be), FY_OK);
    fy_backend_reserve_t r = {.max_tokens = 512,
                              .max_row = 256,
                              .max_seqs = 4,
                              .max_blocks = 256,
                              .max_kv_len = 512,
                              .n_heads = 6,
                              .head_dim = 32};
    assert_int_equal(fy_backend_reserve(be, &r), FY_OK);
    const attn_case_t cases[] = {
        {1, {1}, {1}},                         /* first token */
        {1, {7}, {7}},                         /* prefill inside one block */
        {1, {33}, {33}},                       /* prefill straddling blocks */
        {1, {100}, {1}},                       /* decode at a long position */
        {3, {8, 9, 16}, {1, 1, 1}},            /* decode batch at block edges */
        {4, {15, 17, 31, 64}, {15, 1, 4, 30}}, /* mixed prefill, decode, chunk */
        {2, {32, 65}, {32, 33}},               /* chunked prefill after a cached prefix */
    };
    int bss[] = {8, 16, 32};
    fy_dtype_t kvts[] = {FY_DTYPE_F32, FY_DTYPE_F16, FY_DTYPE_FP8, FY_DTYPE_I8};
    const attn_opts_t h2o = {.scores = true}; /* and H2O's per-block masses */
    for (size_t b = 0; b < 3; b++)
        for (size_t k = 0; k < FY_ARRAY_LEN(kvts); k++)
            for (size_t c = 0; c < FY_ARRAY_LEN(cases); c++)
                run_attention_case(be, bss[b], kvts[k], &cases[c], 1000 + c, 0, 0, NULL, &h2o);
    fy_backend_destroy(be);
}

/*
 * Sliding windows: a query at p sees p - W + 1 .. p.  Windows of 1 (itself
 * only), ones that end inside a block and inside a 64-position segment,
 * exactly a block, and longer than the sequence; prefill, decode (split
 * into segments over two threads) and mixed batches past several segments;
 * a query scale other than 1 / sqrt(d).  Blocks before the window are
 * poisoned with NaNs, so a kernel that read one would fail.
 */
static void test_sliding_window_attention(void **state)
{
    fy_backend_t *be;
    fy_backend_params_t bp = {.n_threads = 2};
    assert_int_equal(fy_backend_create("cpu", &bp, &be), FY_OK);
    fy_backend_reserve_t r = {.max_tokens = 512,
                              .max_row = 256,
                              .max_seqs = 4,
                              .max_blocks = 256,
                              .max_kv_len = 512,
                              .n_heads = 6,
                              .head_dim = 32};
    assert_int_equal(fy_backend_reserve(be, &r), FY_OK);
    const attn_case_t cases[] = {
        {1, {45}, {45}},                         /* a prompt */
        {1, {150}, {150}},                       /* a prompt over three segments */
        {1, {200}, {1}},                         /* decode far past the window */
        {1, {129}, {7}},                         /* a chunk that starts a segment */
        {3, {70, 16, 131}, {1, 1, 1}},           /* decodes at block and segment edges */
        {4, {15, 97, 180, 64}, {15, 1, 40, 30}}, /* mixed prefill, decode, chunk */
    };
    const int windows[] = {1, 5, 16, 37, 64, 100, 1000};
    int bss[] = {8, 16, 32};
    fy_dtype_t kvts[] = {FY_DTYPE_F32, FY_DTYPE_F16, FY_DTYPE_FP8, FY_DTYPE_I8};
    const attn_opts_t h2o = {.scores = true}; /* and H2O's per-block masses */
    for (size_t b = 0; b < 3; b++)
        for (size_t k = 0; k < FY_ARRAY_LEN(kvts); k++)
            for (size_t c = 0; c < FY_ARRAY_LEN(cases); c++)
                for (size_t w = 0; w < FY_ARRAY_LEN(windows); w++)
                    run_attention_case(be, bss[b], kvts[k], &cases[c], 2000 + c, windows[w], w == 3 ? 0.0625f : 0, NULL,
                                       &h2o);
    /* a window longer than the sequence gives the global result bit for
     * bit, scores included */
    enum { KEEP = 86 * 6 * 32, KEEP_SC = 4 * ATTN_STRIDE };
    float *global = malloc(sizeof(float) * KEEP), *wide = malloc(sizeof(float) * KEEP);
    float *gsc = malloc(sizeof(float) * KEEP_SC), *wsc = malloc(sizeof(float) * KEEP_SC);
    for (size_t b = 0; b < 3; b++) {
        run_attention_case(be, bss[b], FY_DTYPE_F16, &cases[5], 77, 0, 0, global,
                           &(attn_opts_t){.scores = true, .keep_scores = gsc});
        run_attention_case(be, bss[b], FY_DTYPE_F16, &cases[5], 77, 181, 0, wide,
                           &(attn_opts_t){.scores = true, .keep_scores = wsc});
        assert_memory_equal(global, wide, sizeof(float) * KEEP);
        assert_memory_equal(gsc, wsc, sizeof(float) * KEEP_SC);
    }
    free(global), free(wide), free(gsc), free(wsc);
    fy_backend_destroy(be);
}

static fy_backend_t *attn_backend(int n_threads, int32_t max_tokens, int32_t max_kv_len, int32_t n_heads,
                                  int32_t head_dim)
{
    fy_backend_t *be;
    fy_backend_params_t bp = {.n_threads = n_threads};
    assert_int_equal(fy_backend_create("cpu", &bp, &be), FY_OK);
    fy_backend_reserve_t r = {.max_tokens = max_tokens,
                              .max_row = 256,
                              .max_seqs = 16,
                              .max_blocks = 16 * (max_kv_len / 8 + 1),
                              .max_kv_len = max_kv_len,
                              .n_heads = n_heads,
                              .head_dim = head_dim};
    assert_int_equal(fy_backend_reserve(be, &r), FY_OK);
    return be;
}

/*
 * Evicted blocks (-1 in a block table: StreamingLLM's sinks and recent
 * window, H2O's heavy hitters) anywhere before the queries: one in the
 * middle, the first ones, adjacent runs, all but a sink and the latest,
 * scattered; with and without sliding windows; decodes far into the
 * context (split into 64-position segments over two threads), a prefill
 * chunk and mixed batches.  The output matches the reference with those
 * positions masked; a -1 entry would address a block of NaNs.  One and two
 * threads give the same bits, outputs and H2O scores alike.
 */
static void test_evicted_blocks_attention(void **state)
{
    fy_backend_t *be[2] = {attn_backend(1, 1024, 1024, 6, 32), attn_backend(2, 1024, 1024, 6, 32)};
    const attn_case_t cases[] = {
        {1, {700}, {1}},                         /* decode far in: 11 segments */
        {3, {130, 257, 400}, {1, 1, 1}},         /* decodes at several lengths */
        {1, {300}, {24}},                        /* a prefill chunk after a long prefix */
        {4, {64, 200, 96, 150}, {1, 20, 1, 11}}, /* mixed */
    };
    const int windows[] = {0, 37, 300};
    int bss[] = {8, 16, 32};
    fy_dtype_t kvts[] = {FY_DTYPE_F32, FY_DTYPE_F16, FY_DTYPE_FP8, FY_DTYPE_I8};
    enum { KEEP = 64 * 6 * 32, KEEP_SC = 4 * ATTN_STRIDE };
    float *out[2], *sc[2];
    for (int i = 0; i < 2; i++) out[i] = malloc(sizeof(float) * KEEP), sc[i] = malloc(sizeof(float) * KEEP_SC);
    for (size_t b = 0; b < FY_ARRAY_LEN(bss); b++)
        for (size_t k = 0; k < FY_ARRAY_LEN(kvts); k++)
            for (size_t c = 0; c < FY_ARRAY_LEN(cases); c++)
                for (size_t w = 0; w < FY_ARRAY_LEN(windows); w++)
                    for (int e = EVICT_MIDDLE; e < EVICT_COUNT; e++) {
                        uint64_t seed = 3000 + c * 100 + (uint64_t)e;
                        for (int i = 0; i < 2; i++) {
                            memset(sc[i], 0, sizeof(float) * KEEP_SC);
                            run_attention_case(
                                be[i], bss[b], kvts[k], &cases[c], seed, windows[w], 0, out[i],
                                &(attn_opts_t){
                                    .evict = (evict_t)e, .scores = true, .keep_scores = sc[i], .no_ref = i == 1});
                        }
                        int n_tok = 0;
                        for (int s = 0; s < cases[c].n_seqs; s++) n_tok += cases[c].n_q[s];
                        assert_memory_equal(out[0], out[1], sizeof(float) * n_tok * 6 * 32);
                        assert_memory_equal(sc[0], sc[1], sizeof(float) * cases[c].n_seqs * ATTN_STRIDE);
                    }
    for (int i = 0; i < 2; i++) free(out[i]), free(sc[i]), fy_backend_destroy(be[i]);
}

/* Random K/V for tokens [0, len) of a sequence through kv_write, in
 * batches of at most max_tokens. */
static void write_kv(fy_backend_t *be, const fy_kv_layout_t *lay, char *arena, int layer, const int32_t *table, int len,
                     int max_tokens, uint64_t *seed)
{
    size_t row = (size_t)lay->n_kv_heads * lay->head_dim;
    int32_t *tok = calloc((size_t)max_tokens, sizeof(int32_t)), *pos = malloc(sizeof(int32_t) * max_tokens),
            *slot = malloc(sizeof(int32_t) * max_tokens);
    float *k = malloc(sizeof(float) * max_tokens * row), *v = malloc(sizeof(float) * max_tokens * row);
    for (int t0 = 0; t0 < len; t0 += max_tokens) {
        int n = len - t0 < max_tokens ? len - t0 : max_tokens;
        for (int t = 0; t < n; t++)
            pos[t] = t0 + t, slot[t] = table[(t0 + t) / lay->block_size] * lay->block_size + (t0 + t) % lay->block_size;
        for (size_t i = 0; i < (size_t)n * row; i++)
            k[i] = fy_test_rand_uniform(seed) * 2, v[i] = fy_test_rand_uniform(seed);
        fy_attn_seq_t one = {0, n, t0 + n, (t0 + n + lay->block_size - 1) / lay->block_size, table, 0};
        fy_batch_meta_t m = {n, tok, pos, slot, 1, &one, 1};
        assert_int_equal(fy_backend_set_batch(be, &m), FY_OK);
        assert_int_equal(fy_backend_kv_write(be, lay, arena, layer, k, v), FY_OK);
    }
    free(tok), free(pos), free(slot), free(k), free(v);
}

/*
 * The bf16 tile kernel's error bound for one query row, per output element,
 * against exact arithmetic over the stored K/V (bound[h * hd + d]).  With u
 * = 2^-9 (bf16's rounding to nearest) each score q . k scale moves by at
 * most D = (2u + u^2) scale sum |q_d k_d| from rounding q and k, plus f32
 * sums (hd 2^-24 of the same); so each weight exp(s - m) moves by a factor
 * within e^{+-D}, and rounding it to bf16 adds (1 +- u): every weight w_i
 * gets a factor (1 + eta_i), |eta_i| <= eta = e^D (1 + u) - 1.  Numerator
 * and normaliser use the same rounded weights, so the normalised weights
 * move by at most w_i 2 eta / (1 - eta), and V's rounding adds u |v_i|:
 * |out - ref| <= (2 eta + u (1 + eta)) / (1 - eta) sum_i w_i |v_id|, plus
 * 1e-6 relative for the f32 exp and sums.
 */
static void bf16_attention_bound(const float *q, const float *K, const float *V, int n_heads, int n_kv, int hd,
                                 int window, double scale, int pos, double *bound)
{
    const double u = 1.0 / 512;
    int group = n_heads / n_kv, lo = window && pos - window + 1 > 0 ? pos - window + 1 : 0;
    static double w[REF_MAX_POS];
    for (int h = 0; h < n_heads; h++) {
        int kh = h / group;
        double mx = -INFINITY, sum = 0, D = 0;
        for (int s = lo; s <= pos; s++) {
            double d = 0, a = 0;
            for (int i = 0; i < hd; i++) {
                double x = (double)q[h * hd + i] * K[((size_t)s * n_kv + kh) * hd + i];
                d += x, a += fabs(x);
            }
            w[s] = d * scale;
            mx = w[s] > mx ? w[s] : mx;
            a *= scale * (2 * u + u * u + hd * 0x1p-24);
            D = a > D ? a : D;
        }
        for (int s = lo; s <= pos; s++) sum += (w[s] = exp(w[s] - mx));
        double eta = exp(D) * (1 + u) - 1, f = (2 * eta + u * (1 + eta)) / (1 - eta);
        for (int i = 0; i < hd; i++) {
            double a = 0;
            for (int s = lo; s <= pos; s++) a += w[s] / sum * fabs(V[((size_t)s * n_kv + kh) * hd + i]);
            bound[h * hd + i] = f * a + 1e-6 * (1 + a);
        }
    }
}

/*
 * The tiled prefill kernel (TILE_ROWS query rows per K/V block read)
 * against the one-row walk (FY_CPU_ATTN=rows) on the models' own head
 * shapes: SmolLM2's 9 heads over 3 KV heads of 64, Gemma 3's 4 over 1 of
 * 256, and plain multi-head; every block size and KV dtype; a prompt's
 * first chunk, a chunk after a cached prefix, both straddling blocks and
 * tiles, beside a decoding sequence; global and sliding-window layers.
 * Bit for bit (each row's arithmetic is the walk's), and against the
 * double-precision reference over the stored K/V.  The bf16 tiles
 * (FY_CPU_ATTN=bf16, where the CPU has AVX512_BF16) against the same
 * reference within bf16_attention_bound's derived bound.
 */
static void test_tiled_attention_matches_rows(void **state)
{
    (void)state;
    const struct {
        int n_heads, n_kv, hd;
    } shapes[] = {{9, 3, 64}, {4, 1, 256}, {4, 4, 64}};
    const int bss[] = {8, 16, 32}, windows[] = {0, 37};
    const fy_dtype_t kvts[] = {FY_DTYPE_F32, FY_DTYPE_F16, FY_DTYPE_FP8, FY_DTYPE_I8};
    enum { NS = 3, MAXLEN = 420 };
    const int len[NS] = {77, 45 + 130, 400}, n_q[NS] = {77, 130, 1}; /* first chunk, chunk after a prefix, decode */
    fy_backend_t *be[3];
    const char *attn[3] = {"rows", "tiles", "bf16"};
    const int n_be = fy_cpu_has_avx512bf16() ? 3 : 2;
    if (n_be < 3) printf("test_tiled_attention_matches_rows: no avx512_bf16 here, bf16 tiles not tested\n");
    for (int i = 0; i < n_be; i++) {
        setenv("FY_CPU_ATTN", attn[i], 1);
        be[i] = attn_backend(2, MAXLEN * NS, MAXLEN, 9, 256);
    }
    unsetenv("FY_CPU_ATTN");
    double worst = 0; /* bf16: the largest error as a share of its bound */
    uint64_t seed = 4242;
    for (size_t sh = 0; sh < FY_ARRAY_LEN(shapes); sh++)
        for (size_t b = 0; b < FY_ARRAY_LEN(bss); b++)
            for (size_t k = 0; k < FY_ARRAY_LEN(kvts); k++)
                for (size_t w = 0; w < FY_ARRAY_LEN(windows); w++) {
                    const int H = shapes[sh].n_heads, KV = shapes[sh].n_kv, HD = shapes[sh].hd, bs = bss[b];
                    fy_kv_layout_t lay;
                    assert_int_equal(fy_kv_layout_init(&lay, 1, KV, HD, bs, kvts[k]), FY_OK);
                    int32_t tables[NS][MAXLEN / 8 + 1], nb_all = 0;
                    for (int s = 0; s < NS; s++)
                        for (int i = 0; i < (len[s] + bs - 1) / bs; i++) tables[s][i] = nb_all++;
                    char *arena = calloc((size_t)nb_all, lay.block_bytes);
                    /* K/V of every position, as stored (rounded through the cache's dtype) */
                    float *K[NS], *V[NS];
                    for (int s = 0; s < NS; s++) {
                        size_t n = (size_t)len[s] * KV * HD;
                        K[s] = malloc(n * sizeof(float)), V[s] = malloc(n * sizeof(float));
                        for (size_t i = 0; i < n; i++)
                            K[s][i] = fy_test_rand_uniform(&seed) * 2 - 1, V[s][i] = fy_test_rand_uniform(&seed);
                        int32_t *tok = calloc((size_t)len[s], sizeof(int32_t)), *pos = malloc(sizeof(int32_t) * len[s]),
                                *slot = malloc(sizeof(int32_t) * len[s]);
                        for (int t = 0; t < len[s]; t++) pos[t] = t, slot[t] = tables[s][t / bs] * bs + t % bs;
                        fy_attn_seq_t one = {0, len[s], len[s], (len[s] + bs - 1) / bs, tables[s], 0};
                        fy_batch_meta_t m = {len[s], tok, pos, slot, 1, &one, 1};
                        assert_int_equal(fy_backend_set_batch(be[0], &m), FY_OK);
                        assert_int_equal(fy_backend_kv_write(be[0], &lay, arena, 0, K[s], V[s]), FY_OK);
                        char row[4 + 256 * 4];
                        for (size_t i = 0; i < n; i += (size_t)HD) {
                            if (kvts[k] == FY_DTYPE_F16) {
                                for (int d = 0; d < HD; d++) {
                                    K[s][i + d] = fy_fp16_to_fp32(fy_fp32_to_fp16(K[s][i + d]));
                                    V[s][i + d] = fy_fp16_to_fp32(fy_fp32_to_fp16(V[s][i + d]));
                                }
                            } else if (fy_kv_dtype_scaled(kvts[k])) {
                                fy_kv_row_write(&lay, K[s] + i, row), fy_kv_row_read(&lay, row, K[s] + i);
                                fy_kv_row_write(&lay, V[s] + i, row), fy_kv_row_read(&lay, row, V[s] + i);
                            }
                        }
                        free(tok), free(pos), free(slot);
                    }
                    /* this step: the three sequences' query rows in one batch */
                    fy_attn_seq_t seqs[NS];
                    int n_tok = 0;
                    for (int s = 0; s < NS; s++) {
                        seqs[s] = (fy_attn_seq_t){n_tok, n_q[s], len[s], (len[s] + bs - 1) / bs, tables[s], 0};
                        n_tok += n_q[s];
                    }
                    int32_t *tok = calloc((size_t)n_tok, sizeof(int32_t)), *pos = malloc(sizeof(int32_t) * n_tok),
                            *slot = malloc(sizeof(int32_t) * n_tok);
                    for (int s = 0, t = 0; s < NS; s++)
                        for (int i = 0; i < n_q[s]; i++, t++) {
                            pos[t] = len[s] - n_q[s] + i;
                            slot[t] = tables[s][pos[t] / bs] * bs + pos[t] % bs;
                        }
                    size_t nq = (size_t)n_tok * H * HD;
                    float *q = malloc(nq * sizeof(float)), *out[3] = {0};
                    for (size_t i = 0; i < nq; i++) q[i] = fy_test_rand_uniform(&seed) * 2 - 1;
                    fy_batch_meta_t m = {n_tok, tok, pos, slot, NS, seqs, 1};
                    for (int i = 0; i < n_be; i++) {
                        out[i] = malloc(nq * sizeof(float));
                        assert_int_equal(fy_backend_set_batch(be[i], &m), FY_OK);
                        assert_int_equal(fy_backend_attention(be[i], &lay, arena, 0, H, 1.0f / sqrtf((float)HD),
                                                              windows[w], q, out[i]),
                                         FY_OK);
                    }
                    if (memcmp(out[0], out[1], nq * sizeof(float)))
                        fail_msg("%d/%d heads of %d, %s, block %d, window %d: tiles and rows differ", H, KV, HD,
                                 fy_dtype_name(kvts[k]), bs, windows[w]);
                    double ref[9 * 256], bound[9 * 256];
                    for (int s = 0, t = 0; s < NS; s++)
                        for (int i = 0; i < n_q[s]; i++, t++) {
                            ref_attention(q + (size_t)t * H * HD, K[s], V[s], H, KV, HD, windows[w],
                                          1.0 / sqrt((double)HD), pos[t], NULL, ref, NULL);
                            for (int j = 0; j < H * HD; j++) {
                                double g = out[1][(size_t)t * H * HD + j];
                                if (!(fabs(g - ref[j]) <= 1e-5 * (1 + fabs(ref[j]))))
                                    fail_msg("%s block %d window %d: seq %d row %d elem %d: %g vs %g",
                                             fy_dtype_name(kvts[k]), bs, windows[w], s, i, j, g, ref[j]);
                            }
                            if (n_be < 3) continue;
                            bf16_attention_bound(q + (size_t)t * H * HD, K[s], V[s], H, KV, HD, windows[w],
                                                 1.0 / sqrt((double)HD), pos[t], bound);
                            for (int j = 0; j < H * HD; j++) {
                                double e = fabs(out[2][(size_t)t * H * HD + j] - ref[j]);
                                if (!(e <= bound[j]))
                                    fail_msg("bf16: %d/%d heads of %d, %s block %d window %d: seq %d row %d elem %d: "
                                             "%g vs %g (bound %g)",
                                             H, KV, HD, fy_dtype_name(kvts[k]), bs, windows[w], s, i, j,
                                             out[2][(size_t)t * H * HD + j], ref[j], bound[j]);
                                worst = e / bound[j] > worst ? e / bound[j] : worst;
                            }
                        }
                    for (int s = 0; s < NS; s++) free(K[s]), free(V[s]);
                    free(tok), free(pos), free(slot), free(q), free(arena);
                    for (int i = 0; i < n_be; i++) free(out[i]);
                }
    if (n_be == 3) printf("bf16 tiles: largest error %.3f of the derived bound\n", worst);
    for (int i = 0; i < n_be; i++) fy_backend_destroy(be[i]);
}

/*
 * H2O scores of a long prefill chunk whose rows of masses do not fit the
 * scratch at once (several passes of tokens) equal, bit for bit, those the
 * same queries add one decode step at a time: the additions into each
 * entry go in token and kv-head order whatever the passes, threads or
 * batch.  Several layers add into the same entries.
 */
static void test_attention_scores_passes(void **state)
{
    enum { LEN = 2800, NQ = 512, H = 6, KV = 6, HD = 32, BS = 8, NB = (LEN + BS - 1) / BS };
    fy_backend_t *be = attn_backend(2, NQ, LEN, H, HD);
    fy_kv_layout_t lay;
    assert_int_equal(fy_kv_layout_init(&lay, 2, KV, HD, BS, FY_DTYPE_F16), FY_OK);
    char *arena = calloc(NB, lay.block_bytes);
    int32_t *table = malloc(sizeof(int32_t) * NB);
    for (int b = 0; b < NB; b++) table[b] = (b * 37) % NB;
    uint64_t seed = 5;
    for (int layer = 0; layer < 2; layer++) write_kv(be, &lay, arena, layer, table, LEN, NQ, &seed);
    for (int b = 100; b < 300; b += 3) table[b] = -1; /* some evicted */
    float *q = malloc(sizeof(float) * NQ * H * HD), *out = malloc(sizeof(float) * NQ * H * HD);
    for (int i = 0; i < NQ * H * HD; i++) q[i] = fy_test_rand_uniform(&seed);
    float *batch = calloc(NB, sizeof(float)), *steps = calloc(NB, sizeof(float));
    int32_t *tok = calloc(NQ, sizeof(int32_t)), *pos = malloc(sizeof(int32_t) * NQ),
            *slot = malloc(sizeof(int32_t) * NQ);
    for (int t = 0; t < NQ; t++) pos[t] = LEN - NQ + t, slot[t] = table[pos[t] / BS] * BS + pos[t] % BS;
    /* the chunk: rows of 512 tokens x 6 kv heads x 350 blocks exceed the 2^20 floats of scratch */
    fy_attn_seq_t seq = {0, NQ, LEN, NB, table, 0};
    fy_batch_meta_t m = {NQ, tok, pos, slot, 1, &seq, 1};
    assert_int_equal(fy_backend_set_batch(be, &m), FY_OK);
    assert_int_equal(fy_backend_set_attn_scores(be, batch, NB), FY_OK);
    for (int layer = 0; layer < 2; layer++)
        assert_int_equal(fy_backend_attention(be, &lay, arena, layer, H, 0.125f, 0, q, out), FY_OK);
    /* the same rows one at a time, layer by layer as a decode step runs them */
    float *steps2 = calloc(NB, sizeof(float));
    for (int layer = 0; layer < 2; layer++) {
        for (int t = 0; t < NQ; t++) {
            fy_attn_seq_t one = {0, 1, pos[t] + 1, NB, table, 0};
            fy_batch_meta_t m1 = {1, tok, pos + t, slot + t, 1, &one, 1};
            assert_int_equal(fy_backend_set_batch(be, &m1), FY_OK);
            assert_int_equal(fy_backend_set_attn_scores(be, layer ? steps2 : steps, NB), FY_OK);
            assert_int_equal(fy_backend_attention(be, &lay, arena, layer, H, 0.125f, 0, q + (size_t)t * H * HD, out),
                             FY_OK);
        }
    }
    /* both layers into one array: each entry is layer 0's sum, then layer 1's rows added on */
    double total = 0, total2 = 0;
    for (int b = 0; b < NB; b++) total += steps[b], total2 += steps2[b];
    assert_float_equal(total, (double)H * NQ, 1e-4 * H * NQ);
    assert_float_equal(total2, (double)H * NQ, 1e-4 * H * NQ);
    for (int b = 0; b < NB; b++) {
        assert_float_equal(batch[b], steps[b] + steps2[b], 1e-5 * (steps[b] + steps2[b]) + 1e-30);
        if (b >= 100 && b < 300 && (b - 100) % 3 == 0) assert_true(batch[b] == 0);
    }
    /* one layer alone: bit for bit */
    memset(batch, 0, sizeof(float) * NB);
    assert_int_equal(fy_backend_set_batch(be, &m), FY_OK);
    assert_int_equal(fy_backend_set_attn_scores(be, batch, NB), FY_OK);
    assert_int_equal(fy_backend_attention(be, &lay, arena, 0, H, 0.125f, 0, q, out), FY_OK);
    assert_memory_equal(batch, steps, sizeof(float) * NB);
    free(steps2);
    free(arena), free(table), free(q), free(out), free(batch), free(steps), free(tok), free(pos), free(slot);
    fy_backend_destroy(be);
}

/*
 * The API's edges: scores before any batch or with a stride short of a
 * sequence's blocks are refused; set_batch turns them off; a row whose
 * every visible key is evicted (which the engine never lets happen) gets
 * zeros, not NaN, and adds no mass.
 */
static void test_attention_scores_api(void **state)
{
    enum { H = 6, KV = 2, HD = 32, BS = 16, LEN = 40, NB = 3 };
    fy_backend_t *be = attn_backend(1, 64, 64, H, HD);
    fy_test_log_begin();
    float sc[2 * 4] = {0};
    assert_int_equal(fy_backend_set_attn_scores(be, sc, 4), FY_ERR_INVALID);
    assert_true(fy_test_log_has("before any batch", NULL));
    fy_test_log_end();
    fy_kv_layout_t lay;
    assert_int_equal(fy_kv_layout_init(&lay, 1, KV, HD, BS, FY_DTYPE_F32), FY_OK);
    char *arena = calloc(8, lay.block_bytes);
    int32_t t0[NB] = {0, 1, 2}, t1[NB] = {3, 4, 5};
    uint64_t seed = 9;
    write_kv(be, &lay, arena, 0, t0, LEN, 64, &seed);
    write_kv(be, &lay, arena, 0, t1, LEN, 64, &seed);
    /* sequence 0 sees 36..39 (window 4), all in its block 2, evicted;
     * sequence 1 keeps its blocks */
    int32_t gone0[NB] = {0, 1, -1};
    fy_attn_seq_t seqs[2] = {{0, 1, LEN, NB, gone0, 0}, {1, 1, LEN, NB, t1, 0}};
    int32_t tok[2] = {0}, pos[2] = {LEN - 1, LEN - 1}, slot[2] = {2 * BS + 7, 5 * BS + 7};
    fy_batch_meta_t m = {2, tok, pos, slot, 2, seqs, 1};
    float q[2 * H * HD], out[2 * H * HD];
    for (int i = 0; i < 2 * H * HD; i++) q[i] = fy_test_rand_uniform(&seed);
    assert_int_equal(fy_backend_set_batch(be, &m), FY_OK);
    fy_test_log_begin();
    assert_int_equal(fy_backend_set_attn_scores(be, sc, NB - 1), FY_ERR_INVALID);
    assert_true(fy_test_log_has("stride 2", "3 blocks", NULL));
    assert_int_equal(fy_backend_set_attn_scores(be, sc, -1), FY_ERR_INVALID);
    fy_test_log_end();
    assert_int_equal(fy_backend_set_attn_scores(be, sc, 4), FY_OK);
    assert_int_equal(fy_backend_attention(be, &lay, arena, 0, H, 0.125f, 4, q, out), FY_OK);
    for (int i = 0; i < H * HD; i++) assert_true(out[i] == 0.0f);
    for (int i = H * HD; i < 2 * H * HD; i++) assert_true(isfinite(out[i]) && out[i] != 0.0f);
    for (int b = 0; b < 4; b++) assert_true(sc[b] == 0.0f);
    assert_true(sc[4] == 0.0f && sc[5] == 0.0f && sc[7] == 0.0f);
    assert_float_equal(sc[6], H, 1e-5); /* sequence 1's row saw only its block 2 */
    /* set_batch turns the scores off */
    assert_int_equal(fy_backend_set_batch(be, &m), FY_OK);
    assert_int_equal(fy_backend_attention(be, &lay, arena, 0, H, 0.125f, 4, q, out), FY_OK);
    assert_float_equal(sc[6], H, 1e-5);
    /* two threads (split into segments) give the same zeros */
    fy_backend_t *be2 = attn_backend(2, 64, 64, H, HD);
    assert_int_equal(fy_backend_set_batch(be2, &m), FY_OK);
    float out2[2 * H * HD];
    assert_int_equal(fy_backend_attention(be2, &lay, arena, 0, H, 0.125f, 4, q, out2), FY_OK);
    assert_memory_equal(out, out2, sizeof(out));
    fy_backend_destroy(be2);
    /* the CUDA backend refuses them, by name, and accepts off */
    if (fy_backend_cuda_usable(NULL, 0)) {
        fy_backend_t *gpu;
        assert_int_equal(fy_backend_create("cuda", NULL, &gpu), FY_OK);
        assert_int_equal(fy_backend_set_attn_scores(gpu, NULL, 0), FY_OK);
        fy_test_log_begin();
        assert_int_equal(fy_backend_set_attn_scores(gpu, sc, 4), FY_ERR_UNSUPPORTED);
        assert_true(fy_test_log_has("H2O", "not on the GPU", NULL));
        fy_test_log_end();
        fy_backend_destroy(gpu);
    }
    free(arena);
    fy_backend_destroy(be);
}

/*
 * What H2O scores cost the attention op: SmolLM2-135M's shape (9 heads, 3
 * KV heads of 64, f16 KV in blocks of 16), a decode step of 1 and of 16
 * sequences at 2048 tokens of context, one and two threads; off and on
 * interleaved (each first in every other round), the median and the
 * fastest of each.
 * Printed, not asserted (a loaded machine says nothing about the code).
 * FY_TEST_BENCH=1 takes more rounds.
 */
static void test_attention_scores_overhead(void **state)
{
    enum { H = 9, KV = 3, HD = 64, BS = 16, CTX = 2048, NB = CTX / BS, MAXB = 16, MAX_REPS = 101 };
    const int reps = getenv("FY_TEST_BENCH") ? MAX_REPS : 7;
    for (int threads = 1; threads <= 2; threads++) {
        fy_backend_t *be = attn_backend(threads, CTX, CTX, H, HD);
        fy_kv_layout_t lay;
        assert_int_equal(fy_kv_layout_init(&lay, 1, KV, HD, BS, FY_DTYPE_F16), FY_OK);
        char *arena = calloc((size_t)MAXB * NB, lay.block_bytes);
        int32_t *tables = malloc(sizeof(int32_t) * MAXB * NB);
        uint64_t seed = 21;
        for (int i = 0; i < MAXB * NB; i++) tables[i] = (int32_t)((i * 7919) % (MAXB * NB)); /* scattered */
        for (int s = 0; s < MAXB; s++) write_kv(be, &lay, arena, 0, tables + s * NB, CTX, CTX, &seed);
        float *q = malloc(sizeof(float) * MAXB * H * HD), *out = malloc(sizeof(float) * MAXB * H * HD);
        float *scores = calloc((size_t)MAXB * NB, sizeof(float));
        for (int i = 0; i < MAXB * H * HD; i++) q[i] = fy_test_rand_uniform(&seed);
        const int batches[] = {1, 16};
        for (size_t bi = 0; bi < FY_ARRAY_LEN(batches); bi++) {
            int n = batches[bi];
            fy_attn_seq_t seqs[MAXB];
            int32_t tok[MAXB] = {0}, pos[MAXB], slot[MAXB];
            for (int s = 0; s < n; s++) {
                seqs[s] = (fy_attn_seq_t){s, 1, CTX, NB, tables + s * NB, 0};
                pos[s] = CTX - 1, slot[s] = tables[s * NB + NB - 1] * BS + BS - 1;
            }
            fy_batch_meta_t m = {n, tok, pos, slot, n, seqs, 1};
            double t[2][MAX_REPS];
            for (int r = 0; r < reps; r++) {
                for (int k = 0; k < 2; k++) {
                    int on = k ^ (r & 1);
                    assert_int_equal(fy_backend_set_batch(be, &m), FY_OK);
                    if (on) assert_int_equal(fy_backend_set_attn_scores(be, scores, NB), FY_OK);
                    double t0 = 1e3 * fy_now_s();
                    for (int layer = 0; layer < 5; layer++) /* five calls per figure, as a step runs one per layer */
                        assert_int_equal(fy_backend_attention(be, &lay, arena, 0, H, 0.125f, 0, q, out), FY_OK);
                    t[on][r] = (1e3 * fy_now_s() - t0) / 5;
                }
            }
            qsort(t[0], (size_t)reps, sizeof(double), cmp_double);
            qsort(t[1], (size_t)reps, sizeof(double), cmp_double);
            double off = t[0][reps / 2], on = t[1][reps / 2];
            fprintf(stderr,
                    "h2o scores: attention of %2d x %d-token decode (%d heads, %d kv, f16, block %d, %d thread%s): "
                    "median %.3f ms off, %.3f ms on (%+.1f%%); fastest %.3f, %.3f (%+.1f%%); %d rounds\n",
                    n, CTX, H, KV, BS, threads, threads > 1 ? "s" : "", off, on, 100 * (on - off) / off, t[0][0],
                    t[1][0], 100 * (t[1][0] - t[0][0]) / t[0][0], reps);
        }
        free(arena), free(tables), free(q), free(out), free(scores);
        fy_backend_destroy(be);
    }
}

/*
 * Not a check, a figure (the bits are compared, the times only printed):
 * a 256-row prompt chunk after a cached prefix, through the one-row walk
 * and the tiled kernel in alternation (BENCHMARKS.md, issue 19).
 * FY_TEST_BENCH=1 takes 31 rounds instead of 5.
 */
static void test_tiled_attention_speed(void **state)
{
    (void)state;
    enum { H = 9, KV = 3, HD = 64, BS = 16, NQ = 256, MAX_REPS = 31 };
    const int reps = getenv("FY_TEST_BENCH") ? MAX_REPS : 5, ctxs[] = {512, 2048};
    const int n_be = fy_cpu_has_avx512bf16() ? 3 : 2; /* rows, tiles, bf16 tiles */
    for (int threads = 1; threads <= 2; threads++) {
        fy_backend_t *be[3];
        const char *attn[3] = {"rows", "tiles", "bf16"};
        for (int i = 0; i < n_be; i++) {
            setenv("FY_CPU_ATTN", attn[i], 1);
            be[i] = attn_backend(threads, NQ, 2048, H, HD);
        }
        unsetenv("FY_CPU_ATTN");
        for (size_t ci = 0; ci < FY_ARRAY_LEN(ctxs); ci++) {
            const int ctx = ctxs[ci], nb = ctx / BS;
            fy_kv_layout_t lay;
            assert_int_equal(fy_kv_layout_init(&lay, 1, KV, HD, BS, FY_DTYPE_F16), FY_OK);
            char *arena = calloc((size_t)nb, lay.block_bytes);
            int32_t *table = malloc(sizeof(int32_t) * nb), tok[NQ] = {0}, pos[NQ], slot[NQ];
            uint64_t seed = 19;
            for (int i = 0; i < nb; i++) table[i] = (int32_t)((i * 97) % nb); /* scattered */
            write_kv(be[0], &lay, arena, 0, table, ctx, NQ, &seed);
            float *q = malloc(sizeof(float) * NQ * H * HD), *out[3];
            for (int i = 0; i < 3; i++) out[i] = malloc(sizeof(float) * NQ * H * HD);
            for (int i = 0; i < NQ * H * HD; i++) q[i] = fy_test_rand_uniform(&seed) * 2 - 1;
            fy_attn_seq_t seq = {0, NQ, ctx, nb, table, 0};
            for (int t = 0; t < NQ; t++) pos[t] = ctx - NQ + t, slot[t] = table[pos[t] / BS] * BS + pos[t] % BS;
            fy_batch_meta_t m = {NQ, tok, pos, slot, 1, &seq, 1};
            double t[3][MAX_REPS];
            for (int r = 0; r < reps; r++) {
                for (int k = 0; k < n_be; k++) {
                    int i = (k + r) % n_be; /* each configuration first in turn */
                    assert_int_equal(fy_backend_set_batch(be[i], &m), FY_OK);
                    double t0 = 1e3 * fy_now_s();
                    assert_int_equal(fy_backend_attention(be[i], &lay, arena, 0, H, 0.125f, 0, q, out[i]), FY_OK);
                    t[i][r] = 1e3 * fy_now_s() - t0;
                }
            }
            assert_memory_equal(out[0], out[1], sizeof(float) * NQ * H * HD);
            qsort(t[0], (size_t)reps, sizeof(double), cmp_double);
            qsort(t[1], (size_t)reps, sizeof(double), cmp_double);
            qsort(t[2], (size_t)reps, sizeof(double), cmp_double);
            double flop = 0;
            for (int i = 0; i < NQ; i++) flop += 4.0 * (pos[i] + 1) * H * HD;
            fprintf(stderr,
                    "tiled attention: %d-row chunk at %d-%d (%d heads, %d kv of %d, f16, block %d, %d thread%s): "
                    "median %.3f ms rows, %.3f ms tiles (%.2fx, %.1f GFLOP/s); fastest %.3f, %.3f (%.2fx); %d rounds\n",
                    NQ, ctx - NQ, ctx, H, KV, HD, BS, threads, threads > 1 ? "s" : "", t[0][reps / 2], t[1][reps / 2],
                    t[0][reps / 2] / t[1][reps / 2], flop / t[1][reps / 2] * 1e-6, t[0][0], t[1][0], t[0][0] / t[1][0],
                    reps);
            if (n_be == 3)
                fprintf(stderr, "tiled attention: bf16 tiles median %.3f ms (%.2fx the f32 tiles, %.1f GFLOP/s)\n",
                        t[2][reps / 2], t[1][reps / 2] / t[2][reps / 2], flop / t[2][reps / 2] * 1e-6);
            free(arena), free(table), free(q), free(out[0]), free(out[1]), free(out[2]);
        }
        for (int i = 0; i < n_be; i++) fy_backend_destroy(be[i]);
    }
}

/*
 * The int8 VNNI decode block kernel (fy_attn_block_i8_vnni) over int8 KV
 * rows against the double-precision reference over the same stored rows
 * and the unquantized query, on SmolLM2's, Gemma 3's and a one-head
 * group's shapes, walking a context in blocks of 8, 16 and 32 with a
 * ragged last block.  Bound: the stored K and V are exact inputs, so the
 * error comes from quantizing q (score i moves by at most
 * D_i = scale sum_d |q_d - qs qc_d| |k_id|, computed from the codes
 * used) and f32 rounding (the int32 dot is exact; scales 4 roundings,
 * exp 1e-6 relative); each weight moves by a factor within
 * e^{+-D} (1 +- 1e-6), so |out - ref| <= 2 eta / (1 - eta) sum w |v|
 * with eta = e^D (1 + 1e-6) - 1, plus the f32 sums over n keys
 * (n 2^-24 sum w |v|).
 */
static void test_i8_vnni_attention(void **state)
{
    (void)state;
    if (!__builtin_cpu_supports("avx512vnni") || !__builtin_cpu_supports("avx512bw")) {
        printf("no avx512_vnni here: int8 attention kernel not tested\n");
        skip();
    }
    const struct {
        int G, hd;
    } shapes[] = {{3, 64}, {4, 256}, {1, 64}};
    const int bss[] = {8, 16, 32}, lens[] = {1, 13, 300};
    uint64_t seed = 1919;
    double worst = 0;
    for (size_t sh = 0; sh < FY_ARRAY_LEN(shapes); sh++)
        for (size_t b = 0; b < FY_ARRAY_LEN(bss); b++)
            for (size_t li = 0; li < FY_ARRAY_LEN(lens); li++) {
                const int G = shapes[sh].G, hd = shapes[sh].hd, bs = bss[b], n = lens[li];
                fy_kv_layout_t lay;
                assert_int_equal(fy_kv_layout_init(&lay, 1, 1, hd, bs, FY_DTYPE_I8), FY_OK);
                char *kr = malloc(lay.row_bytes * n), *vr = malloc(lay.row_bytes * n);
                float *K = malloc(sizeof(float) * n * hd), *V = malloc(sizeof(float) * n * hd);
                float *x = malloc(sizeof(float) * hd), *q = malloc(sizeof(float) * G * hd);
                for (int i = 0; i < n; i++) {
                    for (int d = 0; d < hd; d++) x[d] = fy_test_rand_uniform(&seed) * (1 + (i % 7));
                    fy_kv_row_write(&lay, x, kr + lay.row_bytes * i),
                        fy_kv_row_read(&lay, kr + lay.row_bytes * i, K + (size_t)i * hd);
                    for (int d = 0; d < hd; d++) x[d] = fy_test_rand_uniform(&seed);
                    fy_kv_row_write(&lay, x, vr + lay.row_bytes * i),
                        fy_kv_row_read(&lay, vr + lay.row_bytes * i, V + (size_t)i * hd);
                }
                for (int i = 0; i < G * hd; i++) q[i] = fy_test_rand_uniform(&seed) * 2;
                int8_t qc[4 * 256];
                float qs[4], m[4], l[4], acc[4 * 256];
                int32_t qsum[4];
                fy_attn_q8_quantize(q, G, hd, qc, qs, qsum);
                for (int g = 0; g < G; g++) m[g] = -INFINITY, l[g] = 0;
                memset(acc, 0, sizeof(acc));
                const float scale = 1.0f / sqrtf((float)hd);
                for (int b0 = 0; b0 < n; b0 += bs) {
                    int nk = n - b0 < bs ? n - b0 : bs;
                    fy_attn_block_i8_vnni(qc, qs, qsum, G, kr + lay.row_bytes * b0, vr + lay.row_bytes * b0,
                                          lay.row_bytes, nk, hd, scale, m, l, acc);
                }
                for (int g = 0; g < G; g++) {
                    double sc[300], mx = -INFINITY, sum = 0, D = 0;
                    for (int i = 0; i < n; i++) {
                        double dot = 0, dq = 0;
                        for (int d = 0; d < hd; d++) {
                            double kk = K[(size_t)i * hd + d], qq = q[g * hd + d];
                            dot += qq * kk, dq += fabs(qq - (double)qs[g] * qc[g * hd + d]) * fabs(kk);
                        }
                        sc[i] = dot * scale;
                        mx = sc[i] > mx ? sc[i] : mx;
                        double Di = dq * scale + 4 * 0x1p-24 * fabs(sc[i]);
                        D = Di > D ? Di : D;
                    }
                    for (int i = 0; i < n; i++) sum += (sc[i] = exp(sc[i] - mx));
                    double eta = exp(D) * (1 + 1e-6) - 1;
                    for (int d = 0; d < hd; d++) {
                        double r = 0, a = 0;
                        for (int i = 0; i < n; i++)
                            r += sc[i] / sum * V[(size_t)i * hd + d], a += sc[i] / sum * fabs(V[(size_t)i * hd + d]);
                        double bound = 2 * eta / (1 - eta) * a + (n + 8) * 0x1p-24 * a + 1e-7;
                        double got = acc[g * hd + d] / l[g], err = fabs(got - r);
                        if (!(err <= bound))
                            fail_msg("int8 vnni: G %d hd %d block %d len %d head %d dim %d: %g vs %g (bound %g)", G, hd,
                                     bs, n, g, d, got, r, bound);
                        worst = err / bound > worst ? err / bound : worst;
                    }
                }
                free(kr), free(vr), free(K), free(V), free(x), free(q);
            }
    printf("int8 vnni attention: largest error %.3f of the derived bound\n", worst);
}

/*
 * Decode attention at batch 32 x 2,048 context on SmolLM2's shape (3 KV
 * heads, 3 query heads each, head size 64, blocks of 16), one thread, one
 * layer's worth of block calls: the f32 block kernel on f32 and f16 rows,
 * on int8 rows dequantized first (today's int8 path), and the int8 VNNI
 * kernel on the rows in place.  Speed only printed (alternating, median).
 */
static void test_decode_attention_speed(void **state)
{
    (void)state;
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") || !__builtin_cpu_supports("f16c")) skip();
    /* the VNNI row needs AVX-512; on an AVX2 host the other three run with
     * the AVX2 kernels, the ones decode uses there */
    const bool vnni = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
    enum { B = 32, CTX = 2048, KV = 3, G = 3, HD = 64, BS = 16, MAX_REPS = 15 };
    const int NK = vnni ? 4 : 3;
    const int reps = getenv("FY_TEST_BENCH") ? MAX_REPS : 3;
    const fy_cpu_kernels_t *kt = vnni ? &fy_cpu_kernels_avx512vnni : &fy_cpu_kernels_avx2;
    fy_kv_layout_t li8;
    assert_int_equal(fy_kv_layout_init(&li8, 1, 1, HD, BS, FY_DTYPE_I8), FY_OK);
    const size_t rows = (size_t)B * KV * CTX;
    float *kf = malloc(sizeof(float) * rows * HD), *vf = malloc(sizeof(float) * rows * HD);
    uint16_t *kh = malloc(2 * rows * HD), *vh = malloc(2 * rows * HD);
    char *k8 = malloc(li8.row_bytes * rows), *v8 = malloc(li8.row_bytes * rows);
    uint64_t seed = 32;
    for (size_t i = 0; i < rows * HD; i++) kf[i] = fy_test_rand_uniform(&seed), vf[i] = fy_test_rand_uniform(&seed);
    kt->f32_to_f16(kf, kh, (int64_t)(rows * HD)), kt->f32_to_f16(vf, vh, (int64_t)(rows * HD));
    for (size_t i = 0; i < rows; i++)
        fy_kv_row_write(&li8, kf + i * HD, k8 + i * li8.row_bytes),
            fy_kv_row_write(&li8, vf + i * HD, v8 + i * li8.row_bytes);
    float *q = malloc(sizeof(float) * B * KV * G * HD), *out = malloc(sizeof(float) * B * KV * G * HD);
    for (int i = 0; i < B * KV * G * HD; i++) q[i] = fy_test_rand_uniform(&seed);
    float dq[64 * HD] __attribute__((aligned(64)));
    const char *names[4] = {"f32 kv", "f16 kv", "int8 kv dequantized + f32", "int8 kv vnni"};
    double t[4][MAX_REPS];
    for (int r = 0; r < reps; r++)
        for (int kk = 0; kk < NK; kk++) {
            const int kind = (kk + r) % NK;
            double t0 = 1e3 * fy_now_s();
            for (int s = 0; s < B * KV; s++) {
                const float *qs_ = q + (size_t)s * G * HD;
                float m[G], l[G], *acc = out + (size_t)s * G * HD;
                int8_t qc[G * HD];
                float qsc[G];
                int32_t qsum[G];
                for (int g = 0; g < G; g++) m[g] = -INFINITY, l[g] = 0;
                memset(acc, 0, sizeof(float) * G * HD);
                if (kind == 3) fy_attn_q8_quantize(qs_, G, HD, qc, qsc, qsum);
                for (int b0 = 0; b0 < CTX; b0 += BS) {
                    size_t row0 = (size_t)s * CTX + b0;
                    if (kind == 0)
                        kt->attn_block[FY_DTYPE_F32](qs_, G, kf + row0 * HD, vf + row0 * HD, BS, HD, 0.125f, m, l, acc,
                                                     NULL);
                    else if (kind == 1)
                        kt->attn_block[FY_DTYPE_F16](qs_, G, kh + row0 * HD, vh + row0 * HD, BS, HD, 0.125f, m, l, acc,
                                                     NULL);
                    else if (kind == 2) {
                        for (int i = 0; i < BS; i++) {
                            kt->kv_row_read(k8 + (row0 + i) * li8.row_bytes, 0, dq + (size_t)i * HD, HD);
                            kt->kv_row_read(v8 + (row0 + i) * li8.row_bytes, 0, dq + (size_t)(32 + i) * HD, HD);
                        }
                        kt->attn_block[FY_DTYPE_F32](qs_, G, dq, dq + 32 * HD, BS, HD, 0.125f, m, l, acc, NULL);
                    } else
                        fy_attn_block_i8_vnni(qc, qsc, qsum, G, k8 + row0 * li8.row_bytes, v8 + row0 * li8.row_bytes,
                                              li8.row_bytes, BS, HD, 0.125f, m, l, acc);
                }
            }
            t[kind][r] = 1e3 * fy_now_s() - t0;
        }
    for (int kk = 0; kk < NK; kk++) qsort(t[kk], (size_t)reps, sizeof(double), cmp_double);
    for (int kk = 0; kk < NK; kk++)
        fprintf(stderr,
                "decode attention, batch %d x %d context (%d kv heads x %d, head %d, block %d, 1 thread, one layer, "
                "%s kernels): %s median %.3f ms (%.2fx f32 kv, %.2fx int8 dequantized); %d rounds\n",
                B, CTX, KV, G, HD, BS, vnni ? "avx512vnni" : "avx2", names[kk], t[kk][reps / 2],
                t[0][reps / 2] / t[kk][reps / 2], t[2][reps / 2] / t[kk][reps / 2], reps);
    free(kf), free(vf), free(kh), free(vh), free(k8), free(v8), free(q), free(out);
}

/* ---- thread pool ------------------------------------------------------------------------ */

typedef struct tp_job {
    _Atomic int *hits;
    _Atomic long sum;
} tp_job_t;

static void tp_fn(void *arg, int64_t b, int64_t e, int thread)
{
    tp_job_t *j = arg;
    long s = 0;
    for (int64_t i = b; i < e; i++) {
        atomic_fetch_add(&j->hits[i], 1);
        s += i;
    }
    atomic_fetch_add(&j->sum, s);
}

static void test_threadpool_runs_every_item_once(void **state)
{
    enum { N = 10000 };
    _Atomic int *hits = calloc(N, sizeof(*hits));
    for (int threads = 1; threads <= 4; threads++) {
        fy_threadpool_t *tp;
        assert_int_equal(fy_threadpool_create(threads, &tp), FY_OK);
        for (int rep = 0; rep < 2000; rep++) {
            int64_t n = 1 + rep * 7 % N, chunk = 1 + rep % 13;
            for (int64_t i = 0; i < n; i++) hits[i] = 0;
            tp_job_t j = {hits, 0};
            fy_threadpool_run(tp, n, chunk, tp_fn, &j);
            assert_int_equal(j.sum, n * (n - 1) / 2);
            for (int64_t i = 0; i < n; i++) assert_int_equal(hits[i], 1);
        }
        /* more chunks than the claim word holds: the pool widens them */
        tp_job_t j = {hits, 0};
        for (int64_t i = 0; i < N; i++) hits[i] = 0;
        fy_threadpool_run(tp, N, 1, tp_fn, &j);
        assert_int_equal(j.sum, (long)N * (N - 1) / 2);
        fy_threadpool_destroy(tp);
    }
    free(hits);
    fy_threadpool_t *tp;
    fy_test_log_begin();
    assert_int_equal(fy_threadpool_create(0, &tp), FY_ERR_INVALID);
    fy_test_log_end();
}

static void test_backend_rejects_bad_params(void **state)
{
    fy_backend_t *be;
    fy_test_log_begin();
    fy_backend_params_t bp = {.isa = "sse9"};
    assert_int_equal(fy_backend_create("cpu", &bp, &be), FY_ERR_INVALID);
    assert_true(fy_test_log_has("unknown isa", "sse9", NULL));
    assert_int_equal(fy_backend_create("tpu", NULL, &be), FY_ERR_INVALID);
    assert_true(fy_test_log_has("unknown backend", "tpu", NULL));
    fy_backend_params_t many = {.n_threads = 100000};
    assert_int_equal(fy_backend_create("cpu", &many, &be), FY_ERR_INVALID);
    fy_test_log_end();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp16_known_values),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_q8_0_by_hand),
        cmocka_unit_test(test_q4_0_by_hand),
        cmocka_unit_test(test_q4_1_by_hand),
        cmocka_unit_test(test_quantize_roundtrip_error),
        cmocka_unit_test(test_isa_kernels_agree),
        cmocka_unit_test(test_packed_gemm_matches_rows),
        cmocka_unit_test(test_paged_attention_matches_contiguous),
        cmocka_unit_test(test_sliding_window_attention),
        cmocka_unit_test(test_evicted_blocks_attention),
        cmocka_unit_test(test_tiled_attention_matches_rows),
        cmocka_unit_test(test_attention_scores_passes),
        cmocka_unit_test(test_attention_scores_api),
        cmocka_unit_test(test_attention_scores_overhead),
        cmocka_unit_test(test_tiled_attention_speed),
        cmocka_unit_test(test_i8_vnni_attention),
        cmocka_unit_test(test_decode_attention_speed),
        cmocka_unit_test(test_fp8_e4m3_codec),
        cmocka_unit_test(test_kv_scaled_rows),
        cmocka_unit_test(test_threadpool_runs_every_item_once),
        cmocka_unit_test(test_backend_rejects_bad_params),
    };
    const char *only = getenv("FY_TEST_FILTER"); /* e.g. FY_TEST_FILTER=test_decode_attention_speed */
    if (only) cmocka_set_test_filter(only);
    return cmocka_run_group_tests(tests, NULL, NULL);
}

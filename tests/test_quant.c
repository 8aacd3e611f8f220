/*
 * test_quant.c - the GGUF weight types beyond Q8_0/Q4_0/Q4_1 (Q5_0, Q5_1,
 * IQ4_NL, Q2_K..Q6_K) and the older ones beside them:
 *   - dequantization bit for bit against gguf-py's numpy dequantizers
 *     (an independent implementation; skipped with a message where the
 *     venv of `make pyenv` is missing);
 *   - every vec_dot of every instruction-set table this CPU runs against
 *     the dequantized row in double precision;
 *   - matmul and embedding through the CPU backend, for one token and for
 *     several, against the same reference;
 *   - rows that are not whole blocks refused at load, naming the tensor.
 * Not here: the older types' hand-worked blocks and the packed gemm
 * kernels (test_kernels.c), whole models (test_model.c).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_kernels.h"
#include "common/dtype.h"
#include "model/gguf.h"
#include "tests/gguf_writer.h"
#include "common/mem.h"
#include "tests/testutil.h"

typedef struct qtype {
    fy_dtype_t t;
    const char *gguf_name; /* gguf-py's GGMLQuantizationType name */
    uint32_t ggml;         /* GGUF type id */
    int d_off;             /* byte offset of the fp16 scale in a block */
    int m_off;             /* of the fp16 minimum (or its scale), -1 if none */
} qtype_t;

static const qtype_t g_types[] = {
    {FY_DTYPE_Q8_0, "Q8_0", GW_Q8_0, 0, -1},   {FY_DTYPE_Q4_0, "Q4_0", GW_Q4_0, 0, -1},
    {FY_DTYPE_Q4_1, "Q4_1", GW_Q4_1, 0, 2},    {FY_DTYPE_Q5_0, "Q5_0", GW_Q5_0, 0, -1},
    {FY_DTYPE_Q5_1, "Q5_1", GW_Q5_1, 0, 2},    {FY_DTYPE_IQ4_NL, "IQ4_NL", GW_IQ4_NL, 0, -1},
    {FY_DTYPE_Q2_K, "Q2_K", GW_Q2_K, 80, 82},  {FY_DTYPE_Q3_K, "Q3_K", GW_Q3_K, 108, -1},
    {FY_DTYPE_Q4_K, "Q4_K", GW_Q4_K, 0, 2},    {FY_DTYPE_Q5_K, "Q5_K", GW_Q5_K, 0, 2},
    {FY_DTYPE_Q6_K, "Q6_K", GW_Q6_K, 208, -1},
};
#define N_TYPES ((int)FY_ARRAY_LEN(g_types))

static const char *const g_isas[] = {"scalar", "avx2", "avxvnni", "avx512vnni"};

/* A finite fp16 of any other bit pattern; now and then a special one. */
static uint16_t rand_fp16(uint64_t *s)
{
    static const uint16_t special[] = {0x0000, 0x8000, 0x0001, 0x83ff, 0x7bff, 0xfbff, 0x3c00};
    uint64_t r = fy_test_rand_u64(s);
    if (r % 16 == 0) return special[(r >> 8) % FY_ARRAY_LEN(special)];
    uint16_t h = (uint16_t)(r >> 16);
    if ((h & 0x7c00) == 0x7c00) h &= (uint16_t)~0x4000; /* inf/NaN exponent: make it finite */
    return h;
}

/* n random blocks of q: every byte random, then finite fp16 scales. */
static void rand_blocks(const qtype_t *q, uint8_t *blk, int64_t nblocks, uint64_t *s)
{
    int bb = fy_dtype_info(q->t)->block_bytes;
    for (int64_t i = 0; i < nblocks * bb; i++) blk[i] = (uint8_t)fy_test_rand_u64(s);
    for (int64_t i = 0; i < nblocks; i++) {
        uint16_t h = rand_fp16(s);
        memcpy(blk + i * bb + q->d_off, &h, 2);
        if (q->m_off >= 0) {
            h = rand_fp16(s);
            memcpy(blk + i * bb + q->m_off, &h, 2);
        }
    }
}

/* ---- dequantization against gguf-py ------------------------------------------------- */

/* $FERRY_PYTHON, else the venv `make pyenv` builds; NULL when neither runs */
static const char *test_python(void)
{
    const char *p = getenv("FERRY_PYTHON");
    if (p && *p) return access(p, X_OK) == 0 ? p : NULL;
    return access("build/pyenv/bin/python", X_OK) == 0 ? "build/pyenv/bin/python" : NULL;
}

static int run_argv(char *const argv[])
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        execv(argv[0], argv);
        _exit(127);
    }
    int st;
    if (waitpid(pid, &st, 0) != pid) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_dequant_matches_gguf_py(void **state)
{
    const char *py = test_python();
    const char *script = "tests/gguf_dequant.py";
    if (!py || access(script, R_OK)) {
        fprintf(stderr,
                "note: gguf-py not available (no %s, or not run from the repository root; "
                "make pyenv builds it); skipping the comparison with gguf-py\n",
                py ? script : "build/pyenv/bin/python or $FERRY_PYTHON");
        skip();
    }
    enum { NB_32 = 4096, NB_256 = 512 }; /* 128 Ki elements per type */
    uint64_t s = 0x51ed;
    uint8_t *blk[N_TYPES];
    int64_t nel[N_TYPES];
    char *argv[N_TYPES + 3];
    char args[N_TYPES][512];
    argv[0] = (char *)py, argv[1] = (char *)script;
    for (int i = 0; i < N_TYPES; i++) {
        const fy_dtype_info_t *info = fy_dtype_info(g_types[i].t);
        int64_t nb = info->block_elems == FY_QK ? NB_32 : NB_256;
        nel[i] = nb * info->block_elems;
        blk[i] = malloc((size_t)(nb * info->block_bytes));
        rand_blocks(&g_types[i], blk[i], nb, &s);
        char name[64];
        snprintf(name, sizeof(name), "blocks-%s", g_types[i].gguf_name);
        assert_true(fy_test_write_file(fy_test_path(name), blk[i], (size_t)(nb * info->block_bytes)));
        snprintf(args[i], sizeof(args[i]), "%s:%s:%s.f32", g_types[i].gguf_name, fy_test_path(name),
                 fy_test_path(name));
        argv[2 + i] = args[i];
    }
    argv[2 + N_TYPES] = NULL;
    int rc = run_argv(argv);
    if (rc == 3) {
        fprintf(stderr, "note: %s cannot import gguf-py or numpy (make pyenv); skipping\n", py);
        for (int i = 0; i < N_TYPES; i++) free(blk[i]);
        skip();
    }
    assert_int_equal(rc, 0);
    float *mine = malloc(sizeof(float) * (size_t)NB_32 * FY_QK);
    for (int i = 0; i < N_TYPES; i++) {
        char name[64];
        snprintf(name, sizeof(name), "blocks-%s.f32", g_types[i].gguf_name);
        size_t len;
        float *theirs = (float *)fy_test_read_file(fy_test_path(name), &len);
        assert_non_null(theirs);
        assert_int_equal(len, (size_t)nel[i] * sizeof(float));
        fy_dequantize_row(g_types[i].t, blk[i], mine, nel[i]);
        int bad = 0;
        for (int64_t e = 0; e < nel[i]; e++) {
            if (fy_fp32_to_bits(mine[e]) == fy_fp32_to_bits(theirs[e])) continue;
            int be = fy_dtype_info(g_types[i].t)->block_elems;
            if (bad++ < 5)
                fprintf(stderr, "%s: block %lld element %lld: ferry %a (0x%08x), gguf-py %a (0x%08x)\n",
                        g_types[i].gguf_name, (long long)(e / be), (long long)(e % be), (double)mine[e],
                        fy_fp32_to_bits(mine[e]), (double)theirs[e], fy_fp32_to_bits(theirs[e]));
        }
        if (bad) fail_msg("%s: %d of %lld values differ from gguf-py's", g_types[i].gguf_name, bad, (long long)nel[i]);
        fy_free(theirs);
        free(blk[i]);
    }
    free(mine);
}

/* ---- dot products against the dequantized row ------------------------------------------ */

/* A row of n elements of q: random blocks (kind 0) or floats through the
 * reference quantizer (kind 1), whose scales are realistic. */
static void make_row(const qtype_t *q, int kind, int64_t n, uint64_t *s, void *row)
{
    const fy_dtype_info_t *info = fy_dtype_info(q->t);
    if (kind == 0) {
        rand_blocks(q, row, n / info->block_elems, s);
        return;
    }
    float *f = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) f[i] = fy_test_rand_uniform(s) * (i / 256 % 3 ? 0.05f : 3.0f);
    fy_quantize_row(q->t, f, row, n);
    free(f);
}

/* The exact dot of the dequantized row with the quantized activation
 * (what the kernels compute, in double), and the magnitude of its terms:
 * sum |x'| (|d part| + |min part|), the row dequantized once with its
 * minimum's scale zeroed and once with its scale zeroed.  A kernel
 * multiplies the two parts separately, so its rounding is relative to
 * their sizes, which may be far above the (cancelled) weight. */
static void ref_dot(const qtype_t *q, const void *row, const fy_q8a_t *xa, int64_t n, double *dot_p, double *mag_p)
{
    const fy_dtype_info_t *info = fy_dtype_info(q->t);
    size_t rb = (size_t)(n / info->block_elems * info->block_bytes);
    float *w = malloc(sizeof(float) * (size_t)n), *wd = malloc(sizeof(float) * (size_t)n),
          *wm = malloc(sizeof(float) * (size_t)n);
    uint8_t *tmp = malloc(rb);
    fy_dequantize_row(q->t, row, w, n);
    memcpy(tmp, row, rb);
    if (q->m_off >= 0)
        for (int64_t b = 0; b < n / info->block_elems; b++) memset(tmp + b * info->block_bytes + q->m_off, 0, 2);
    fy_dequantize_row(q->t, tmp, wd, n);
    memcpy(tmp, row, rb);
    for (int64_t b = 0; b < n / info->block_elems; b++) memset(tmp + b * info->block_bytes + q->d_off, 0, 2);
    fy_dequantize_row(q->t, tmp, wm, n);
    double dot = 0, mag = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = (double)xa->d[i / FY_QK] * xa->qs[i];
        dot += (double)w[i] * x;
        mag += (fabs((double)wd[i]) + (q->m_off >= 0 ? fabs((double)wm[i]) : 0)) * fabs(x);
    }
    free(w), free(wd), free(wm), free(tmp);
    *dot_p = dot;
    *mag_p = mag;
}

/*
 * Tolerance: the integer block sums are exact (|sum| < 2^24 even for
 * Q6_K's 32 x 32 x 127 x 128), so only float rounding is left: a block's
 * scale products (2-3 roundings of 2^-24) and the accumulation, at worst
 * one rounding per block in sequence (the scalar kernel; vector kernels
 * add fewer per lane), each relative to at most the magnitude of the
 * terms.  So |kernel - exact| <= (n / 32 + 8) * 2^-24 * magnitude; twice
 * that is asserted.
 */
static double dot_tol(int64_t n, double mag) { return (double)(n / FY_QK + 8) * 0x1p-23 * mag + 1e-37; }

static int64_t test_len(fy_dtype_t t)
{
    /* 51 blocks of 32 (groups of 8 and a tail), or 9 super-blocks */
    return fy_dtype_info(t)->block_elems == FY_QK ? 1632 : 2304;
}

static void test_vec_dot_all_isas(void **state)
{
    enum { NMAX = 2304 };
    uint64_t s = 77;
    float *x = malloc(sizeof(float) * NMAX);
    void *mem = fy_aligned_alloc(64, fy_q8a_bytes(NMAX));
    uint8_t *row = malloc(NMAX * 2);
    int tables = 0;
    for (size_t k = 0; k < FY_ARRAY_LEN(g_isas); k++) {
        const fy_cpu_kernels_t *K = fy_cpu_kernels_pick(g_isas[k]);
        if (!K) continue;
        tables++;
        for (int ti = 0; ti < N_TYPES; ti++) {
            const qtype_t *q = &g_types[ti];
            int64_t n = test_len(q->t);
            assert_non_null(K->vec_dot[q->t]);
            for (int rep = 0; rep < 40; rep++) {
                for (int64_t i = 0; i < n; i++) x[i] = fy_test_rand_uniform(&s) * (rep % 3 ? 1.0f : 100.0f);
                if (rep == 5) memset(x + 64, 0, 32 * sizeof(float)); /* an all-zero activation block */
                fy_q8a_t xa = fy_q8a_at(mem, n);
                K->quantize_q8a(x, &xa, n);
                make_row(q, rep % 2, n, &s, row);
                double want, mag;
                ref_dot(q, row, &xa, n, &want, &mag);
                float got = K->vec_dot[q->t](row, &xa, n);
                if (!(fabs((double)got - want) <= dot_tol(n, mag)))
                    fail_msg("%s %s rep %d: %.9g, want %.9g (magnitude %.3g, tolerance %.3g)", g_isas[k],
                             fy_dtype_name(q->t), rep, (double)got, want, mag, dot_tol(n, mag));
            }
        }
    }
    assert_true(tables >= 1);
    free(x), free(row), fy_free(mem);
}

/* ---- matmul and embedding through the backend --------------------------------------- */

static fy_backend_t *make_backend(const char *isa, int64_t max_row, bool no_repack)
{
    fy_backend_t *be;
    fy_backend_params_t bp = {.n_threads = 2, .isa = isa, .no_repack = no_repack};
    if (fy_backend_create("cpu", &bp, &be) != FY_OK) return NULL;
    fy_backend_reserve_t r = {.max_tokens = 16,
                              .max_row = (int32_t)max_row,
                              .max_seqs = 1,
                              .max_blocks = 4,
                              .max_kv_len = 64,
                              .n_heads = 1,
                              .head_dim = 32};
    assert_int_equal(fy_backend_reserve(be, &r), FY_OK);
    return be;
}

/*
 * Three weights of different types in one call (as Q4_K_M files mix
 * them: Q5_0/Q4_K/Q6_K side by side), with row counts that are and are
 * not multiples of 8, for 1, 5 and 9 tokens; every output against the
 * double-precision reference on the activation the kernels see, and each
 * token's outputs the same bits whatever batch it is in.
 */
static void test_matmul_mixed_types(void **state)
{
    enum { N = 2048, TOK = 9 };
    static const int rows[3] = {24, 13, 16};
    uint64_t s = 99;
    float *x = malloc(sizeof(float) * N * TOK);
    for (int i = 0; i < N * TOK; i++) x[i] = fy_test_rand_uniform(&s) * (i % 5 ? 1.0f : 8.0f);
    char *xqm = fy_aligned_alloc(64, fy_q8a_bytes(N) * TOK);
    fy_q8a_t xa[TOK];
    for (int t = 0; t < TOK; t++) {
        xa[t] = fy_q8a_at(xqm + (size_t)t * fy_q8a_bytes(N), N);
        fy_cpu_kernels_scalar.quantize_q8a(x + (size_t)t * N, &xa[t], N);
    }
    int ran = 0;
    for (size_t k = 0; k < FY_ARRAY_LEN(g_isas); k++) {
        if (!fy_cpu_kernels_pick(g_isas[k])) continue;
        for (int repack = 0; repack < 2; repack++) {
            fy_backend_t *be = make_backend(g_isas[k], N, repack == 0);
            assert_non_null(be);
            for (int t0 = 0; t0 < N_TYPES; t0++) {
                const qtype_t *q[3] = {&g_types[t0], &g_types[(t0 + 4) % N_TYPES], &g_types[(t0 + 7) % N_TYPES]};
                fy_tensor_t host[3], dev[3];
                uint8_t *wdata[3];
                for (int i = 0; i < 3; i++) {
                    size_t rb;
                    assert_int_equal(fy_dtype_row_bytes(q[i]->t, N, &rb), FY_OK);
                    wdata[i] = malloc(rb * (size_t)rows[i]);
                    for (int r = 0; r < rows[i]; r++) make_row(q[i], (r + i) % 2, N, &s, wdata[i] + rb * (size_t)r);
                    host[i] = (fy_tensor_t){q[i]->t, {N, rows[i]}, rb, rb * (size_t)rows[i], wdata[i], 0};
                    assert_int_equal(fy_backend_upload(be, &host[i], FY_USE_MATMUL, &dev[i]), FY_OK);
                }
                const fy_tensor_t *w[3] = {&dev[0], &dev[1], &dev[2]};
                float *y1[3], *yn[3];
                for (int i = 0; i < 3; i++) {
                    y1[i] = malloc(sizeof(float) * (size_t)rows[i] * TOK);
                    yn[i] = malloc(sizeof(float) * (size_t)rows[i] * TOK);
                }
                /* one token at a time, then 5, then 9 at once */
                for (int t = 0; t < TOK; t++) {
                    float *yt[3] = {y1[0] + t * rows[0], y1[1] + t * rows[1], y1[2] + t * rows[2]};
                    assert_int_equal(fy_backend_matmul(be, 3, w, x + (size_t)t * N, 1, yt), FY_OK);
                }
                for (int nt = 5; nt <= TOK; nt += 4) {
                    assert_int_equal(fy_backend_matmul(be, 3, w, x, nt, yn), FY_OK);
                    for (int i = 0; i < 3; i++)
                        if (memcmp(y1[i], yn[i], sizeof(float) * (size_t)rows[i] * nt))
                            fail_msg("%s: %s rows differ between 1 and %d tokens", g_isas[k], fy_dtype_name(q[i]->t),
                                     nt);
                }
                for (int i = 0; i < 3; i++) {
                    for (int t = 0; t < TOK; t++) {
                        for (int r = 0; r < rows[i]; r++) {
                            double want, mag;
                            ref_dot(q[i], wdata[i] + host[i].row_bytes * (size_t)r, &xa[t], N, &want, &mag);
                            double got = yn[i][t * rows[i] + r];
                            if (!(fabs(got - want) <= dot_tol(N, mag)))
                                fail_msg("%s%s: %s row %d token %d: %.9g, want %.9g (tolerance %.3g)", g_isas[k],
                                         repack ? " packed" : "", fy_dtype_name(q[i]->t), r, t, got, want,
                                         dot_tol(N, mag));
                        }
                    }
                    fy_backend_release_tensor(be, &dev[i]);
                    free(wdata[i]), free(y1[i]), free(yn[i]);
                }
            }
            fy_backend_destroy(be);
            ran++;
        }
    }
    assert_true(ran >= 2);
    free(x), fy_free(xqm);
}

/* Embedding rows of every type are the reference dequantizer's bits. */
static void test_embed_rows(void **state)
{
    enum { DIM = 512, VOCAB = 40, NT = 6 };
    fy_backend_t *be = make_backend(NULL, DIM, false);
    assert_non_null(be);
    uint64_t s = 5;
    int32_t tok[NT] = {0, 39, 7, 7, 21, 1}, pos[NT], slot[NT], table[4] = {0, 1, 2, 3};
    for (int i = 0; i < NT; i++) pos[i] = i, slot[i] = i;
    fy_attn_seq_t seq = {0, NT, NT, 1, table, 0};
    fy_batch_meta_t m = {NT, tok, pos, slot, 1, &seq, 1};
    assert_int_equal(fy_backend_set_batch(be, &m), FY_OK);
    float *out = malloc(sizeof(float) * DIM * NT), *want = malloc(sizeof(float) * DIM);
    for (int ti = 0; ti < N_TYPES; ti++) {
        const qtype_t *q = &g_types[ti];
        size_t rb;
        assert_int_equal(fy_dtype_row_bytes(q->t, DIM, &rb), FY_OK);
        uint8_t *data = malloc(rb * VOCAB);
        for (int r = 0; r < VOCAB; r++) make_row(q, r % 2, DIM, &s, data + rb * r);
        fy_tensor_t host = {q->t, {DIM, VOCAB}, rb, rb * VOCAB, data, 0}, dev;
        assert_int_equal(fy_backend_upload(be, &host, FY_USE_ROWS, &dev), FY_OK);
        assert_int_equal(fy_backend_embed(be, &dev, out), FY_OK);
        for (int t = 0; t < NT; t++) {
            fy_dequantize_row(q->t, data + rb * tok[t], want, DIM);
            if (memcmp(want, out + t * DIM, sizeof(float) * DIM))
                fail_msg("%s: embedding of token %d differs from the dequantized row", fy_dtype_name(q->t), tok[t]);
        }
        fy_backend_release_tensor(be, &dev);
        free(data);
    }
    free(out), free(want);
    fy_backend_destroy(be);
}

/* ---- bad input ---------------------------------------------------------------------- */

/* A tensor whose rows are not whole blocks is refused when the file is
 * opened, naming the tensor, its row length and its type. */
static void test_partial_block_rows_refused(void **state)
{
    for (int ti = 0; ti < N_TYPES; ti++) {
        const qtype_t *q = &g_types[ti];
        const fy_dtype_info_t *info = fy_dtype_info(q->t);
        int64_t ne[2] = {info->block_elems + 32 + (info->block_elems == FY_QK ? 16 : 0), 4}; /* 80 or 288 */
        size_t bytes = (size_t)(ne[0] / info->block_elems + 1) * (size_t)info->block_bytes * 4;
        uint8_t *zeros = calloc(1, bytes);
        fy_gw_t *w = fy_gw_new();
        fy_gw_str(w, "general.architecture", "llama");
        int64_t ok_ne[2] = {info->block_elems, 2};
        fy_gw_tensor(w, "blk.0.ffn_up.weight", q->ggml, 2, ok_ne, zeros, (size_t)info->block_bytes * 2);
        fy_gw_tensor(w, "blk.0.ffn_down.weight", q->ggml, 2, ne, zeros, bytes);
        char name[64];
        snprintf(name, sizeof(name), "partial-%s.gguf", q->gguf_name);
        const char *path = fy_test_path(name);
        assert_true(fy_gw_write(w, path));
        fy_gw_free(w);
        free(zeros);
        fy_gguf_t *g = NULL;
        fy_test_log_begin();
        assert_int_equal(fy_gguf_open(path, &g), FY_ERR_FORMAT);
        fy_test_log_end();
        assert_null(g);
        char what[64];
        snprintf(what, sizeof(what), "row of %lld elements", (long long)ne[0]);
        if (!fy_test_log_has(name, "blk.0.ffn_down.weight", what, fy_dtype_name(q->t), NULL))
            fail_msg("%s: no error naming the tensor: %s", q->gguf_name, fy_test_log_text());
    }
    /* and a whole one of each type opens */
    for (int ti = 0; ti < N_TYPES; ti++) {
        const fy_dtype_info_t *info = fy_dtype_info(g_types[ti].t);
        uint8_t *zeros = calloc(1, (size_t)info->block_bytes * 6);
        fy_gw_t *w = fy_gw_new();
        int64_t ne[2] = {2 * info->block_elems, 3};
        fy_gw_tensor(w, "t", g_types[ti].ggml, 2, ne, zeros, (size_t)info->block_bytes * 6);
        const char *path = fy_test_path("whole.gguf");
        assert_true(fy_gw_write(w, path));
        fy_gw_free(w);
        free(zeros);
        fy_gguf_t *g = NULL;
        assert_int_equal(fy_gguf_open(path, &g), FY_OK);
        const fy_gguf_tensor_t *t = fy_gguf_find_tensor(g, "t");
        assert_non_null(t);
        assert_true(t->supported);
        assert_int_equal(t->dtype, g_types[ti].t);
        assert_int_equal(t->nbytes, (size_t)info->block_bytes * 6);
        fy_gguf_close(g);
    }
}

/* A K-quant matrix handed to matmul with rows that are not whole
 * super-blocks (the loader never makes one) is refused, not half-read. */
static void test_matmul_refuses_partial_blocks(void **state)
{
    fy_backend_t *be = make_backend(NULL, 1024, true);
    assert_non_null(be);
    static uint8_t blocks[4 * 144];
    float x[288], y[2];
    memset(x, 0, sizeof(x));
    fy_tensor_t t = {FY_DTYPE_Q4_K, {288, 2}, 2 * 144, 4 * 144, blocks, 0};
    const fy_tensor_t *w[1] = {&t};
    float *ys[1] = {y};
    fy_test_log_begin();
    assert_int_equal(fy_backend_matmul(be, 1, w, x, 1, ys), FY_ERR_INVALID);
    fy_test_log_end();
    assert_true(fy_test_log_has("288", "q4_k", "256-element blocks", NULL));
    fy_backend_destroy(be);
}

/* Names and sizes as GGUF has them. */
static void test_type_table(void **state)
{
    static const struct {
        fy_dtype_t t;
        const char *name;
        int elems, bytes;
    } want[] = {{FY_DTYPE_Q5_0, "q5_0", 32, 22},     {FY_DTYPE_Q5_1, "q5_1", 32, 24},
                {FY_DTYPE_IQ4_NL, "iq4_nl", 32, 18}, {FY_DTYPE_Q2_K, "q2_k", 256, 84},
                {FY_DTYPE_Q3_K, "q3_k", 256, 110},   {FY_DTYPE_Q4_K, "q4_k", 256, 144},
                {FY_DTYPE_Q5_K, "q5_k", 256, 176},   {FY_DTYPE_Q6_K, "q6_k", 256, 210}};
    for (size_t i = 0; i < FY_ARRAY_LEN(want); i++) {
        const fy_dtype_info_t *info = fy_dtype_info(want[i].t);
        assert_string_equal(info->name, want[i].name);
        assert_int_equal(info->block_elems, want[i].elems);
        assert_int_equal(info->block_bytes, want[i].bytes);
        assert_true(fy_dtype_is_quantized(want[i].t));
        fy_dtype_t back;
        assert_int_equal(fy_dtype_from_name(want[i].name, &back), FY_OK);
        assert_int_equal(back, want[i].t);
        size_t rb;
        assert_int_equal(fy_dtype_row_bytes(want[i].t, want[i].elems * 3, &rb), FY_OK);
        assert_int_equal(rb, (size_t)want[i].bytes * 3);
        assert_int_equal(fy_dtype_row_bytes(want[i].t, want[i].elems + 16, &rb), FY_ERR_INVALID);
    }
    for (int ti = 0; ti < N_TYPES; ti++) /* GGUF's ids name the same types */
        assert_string_equal(fy_gguf_ggml_type_name(g_types[ti].ggml), fy_dtype_name(g_types[ti].t));
}

/* The reference quantizers write blocks whose round trip is close: the
 * relative L2 error of random uniform rows, bounded by each type's step
 * (half a step over the range, relative to a uniform's RMS of 1/sqrt(3)):
 * 5 bits about 2.5%, 4 bits 5-6%, 3 bits about 15%, 2 bits about 30%,
 * with room for the coarser 6-bit scales of the K-quants. */
static void test_quantize_roundtrip(void **state)
{
    static const struct {
        fy_dtype_t t;
        double tol;
    } cases[] = {{FY_DTYPE_Q5_0, 0.05}, {FY_DTYPE_Q5_1, 0.05}, {FY_DTYPE_IQ4_NL, 0.10}, {FY_DTYPE_Q2_K, 0.45},
                 {FY_DTYPE_Q3_K, 0.22}, {FY_DTYPE_Q4_K, 0.10}, {FY_DTYPE_Q5_K, 0.05},   {FY_DTYPE_Q6_K, 0.025}};
    enum { N = 4096 };
    uint64_t s = 8;
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
    uint8_t *buf = malloc(N * 2);
    for (int i = 0; i < N; i++) x[i] = fy_test_rand_uniform(&s) * (i / 512 % 2 ? 0.01f : 1.0f);
    for (size_t c = 0; c < FY_ARRAY_LEN(cases); c++) {
        fy_quantize_row(cases[c].t, x, buf, N);
        fy_dequantize_row(cases[c].t, buf, y, N);
        double num = 0, den = 0;
        for (int i = 0; i < N; i++) num += (double)(x[i] - y[i]) * (x[i] - y[i]), den += (double)x[i] * x[i];
        double rel = sqrt(num / den);
        if (getenv("FY_TEST_VERBOSE")) fprintf(stderr, "%s: round trip %.4f\n", fy_dtype_name(cases[c].t), rel);
        if (!(rel < cases[c].tol))
            fail_msg("%s: round trip error %.4f >= %.4f", fy_dtype_name(cases[c].t), rel, cases[c].tol);
    }
    /* all zero stays zero */
    memset(x, 0, sizeof(float) * N);
    for (size_t c = 0; c < FY_ARRAY_LEN(cases); c++) {
        fy_quantize_row(cases[c].t, x, buf, N);
        fy_dequantize_row(cases[c].t, buf, y, N);
        for (int i = 0; i < N; i++) assert_true(y[i] == 0.0f);
    }
    free(x), free(y), free(buf);
}

/*
 * Issue 19: fy_backend_rmsnorm_matmul against fy_backend_rmsnorm then
 * fy_backend_matmul: the same bits, for every weight type the CPU matmul
 * takes (the quantized ones, two per call as qkv and gate/up share their
 * input, and f32/f16/bf16), packed and row layouts, 1 and 2 threads, 1, 3
 * and 9 tokens, row counts that are and are not multiples of 8, two
 * widths, and the normalized rows written over the input (h == x, as the
 * output head does).
 */
static void test_rmsnorm_matmul_matches_ops(void **state)
{
    enum { TOK = 9, MAXN = 768 };
    static const int widths[2] = {512, 768}, rows[2] = {24, 13}, toks[3] = {1, 3, 9};
    static const fy_dtype_t plain[3] = {FY_DTYPE_F32, FY_DTYPE_F16, FY_DTYPE_BF16};
    uint64_t s = 1919;
    float *x = malloc(sizeof(float) * MAXN * TOK), *nw = malloc(sizeof(float) * MAXN);
    float *h1 = malloc(sizeof(float) * MAXN * TOK), *h2 = malloc(sizeof(float) * MAXN * TOK);
    for (int i = 0; i < MAXN * TOK; i++) x[i] = fy_test_rand_uniform(&s) * (i % 5 ? 1.0f : 8.0f);
    for (int i = 0; i < MAXN; i++) nw[i] = 0.5f + fy_test_rand_uniform(&s);
    const char *isa = fy_cpu_kernels_pick("avx512vnni") ? "avx512vnni"
                      : fy_cpu_kernels_pick("avx2")     ? "avx2"
                                                        : "scalar";
    int checked = 0;
    for (int threads = 1; threads <= 2; threads++) {
        for (int repack = 0; repack < 2; repack++) {
            fy_backend_t *be;
            fy_backend_params_t bp = {.n_threads = threads, .isa = isa, .no_repack = repack == 0};
            assert_int_equal(fy_backend_create("cpu", &bp, &be), FY_OK);
            fy_backend_reserve_t r = {.max_tokens = 16,
                                      .max_row = MAXN,
                                      .max_seqs = 1,
                                      .max_blocks = 4,
                                      .max_kv_len = 64,
                                      .n_heads = 1,
                                      .head_dim = 32};
            assert_int_equal(fy_backend_reserve(be, &r), FY_OK);
            for (int wi = 0; wi < 2; wi++) {
                const int N = widths[wi];
                fy_tensor_t nh = {FY_DTYPE_F32, {N, 1}, sizeof(float) * (size_t)N, sizeof(float) * (size_t)N, nw, 0};
                fy_tensor_t norm;
                assert_int_equal(fy_backend_upload(be, &nh, FY_USE_VECTOR, &norm), FY_OK);
                for (int ti = 0; ti < N_TYPES + 3; ti++) {
                    /* two weights of one call: this type and another */
                    fy_dtype_t t[2] = {ti < N_TYPES ? g_types[ti].t : plain[ti - N_TYPES],
                                       ti < N_TYPES ? g_types[(ti + 3) % N_TYPES].t : plain[(ti - N_TYPES + 1) % 3]};
                    fy_tensor_t host[2], dev[2];
                    void *wdata[2];
                    float *y1[2], *y2[2];
                    for (int i = 0; i < 2; i++) {
                        size_t rb;
                        assert_int_equal(fy_dtype_row_bytes(t[i], N, &rb), FY_OK);
                        wdata[i] = malloc(rb * (size_t)rows[i]);
                        float *f = malloc(sizeof(float) * (size_t)N);
                        for (int rr = 0; rr < rows[i]; rr++) {
                            for (int e = 0; e < N; e++) f[e] = fy_test_rand_uniform(&s) * (e / 256 % 3 ? 0.05f : 3.0f);
                            fy_quantize_row(t[i], f, (char *)wdata[i] + rb * (size_t)rr, N);
                        }
                        free(f);
                        host[i] = (fy_tensor_t){t[i], {N, rows[i]}, rb, rb * (size_t)rows[i], wdata[i], 0};
                        assert_int_equal(fy_backend_upload(be, &host[i], FY_USE_MATMUL, &dev[i]), FY_OK);
                        y1[i] = malloc(sizeof(float) * (size_t)rows[i] * TOK);
                        y2[i] = malloc(sizeof(float) * (size_t)rows[i] * TOK);
                    }
                    const fy_tensor_t *w[2] = {&dev[0], &dev[1]};
                    for (int k = 0; k < 3; k++) {
                        const int n = toks[k];
                        assert_int_equal(fy_backend_rmsnorm(be, x, &norm, n, 1e-5f, h1), FY_OK);
                        assert_int_equal(fy_backend_matmul(be, 2, w, h1, n, y1), FY_OK);
                        for (int alias = 0; alias < 2; alias++) {
                            memset(h2, 0xff, sizeof(float) * (size_t)N * n);
                            if (alias) memcpy(h2, x, sizeof(float) * (size_t)N * n);
                            assert_int_equal(
                                fy_backend_rmsnorm_matmul(be, alias ? h2 : x, &norm, 1e-5f, 2, w, n, h2, y2), FY_OK);
                            if (memcmp(h1, h2, sizeof(float) * (size_t)N * n))
                                fail_msg("%s x%d: normalized rows differ (%s, width %d, %d tokens)", isa, threads,
                                         fy_dtype_name(t[0]), N, n);
                            for (int i = 0; i < 2; i++)
                                if (memcmp(y1[i], y2[i], sizeof(float) * (size_t)rows[i] * n))
                                    fail_msg("%s x%d%s: %s outputs differ from rmsnorm then matmul (width %d, %d "
                                             "tokens%s)",
                                             isa, threads, repack ? " packed" : "", fy_dtype_name(t[i]), N, n,
                                             alias ? ", in place" : "");
                            checked++;
                        }
                    }
                    for (int i = 0; i < 2; i++) {
                        fy_backend_release_tensor(be, &dev[i]);
                        free(wdata[i]), free(y1[i]), free(y2[i]);
                    }
                }
                fy_backend_release_tensor(be, &norm);
            }
            /* a norm of another width than the weights' is refused */
            fy_tensor_t nh = {FY_DTYPE_F32, {256, 1}, 1024, 1024, nw, 0}, norm;
            assert_int_equal(fy_backend_upload(be, &nh, FY_USE_VECTOR, &norm), FY_OK);
            size_t rb;
            assert_int_equal(fy_dtype_row_bytes(FY_DTYPE_Q8_0, 512, &rb), FY_OK);
            void *wd = calloc(8, rb);
            fy_tensor_t wh = {FY_DTYPE_Q8_0, {512, 8}, rb, rb * 8, wd, 0}, wdv;
            assert_int_equal(fy_backend_upload(be, &wh, FY_USE_MATMUL, &wdv), FY_OK);
            const fy_tensor_t *w1[1] = {&wdv};
            float *y1[1] = {h1};
            assert_int_equal(fy_backend_rmsnorm_matmul(be, x, &norm, 1e-5f, 1, w1, 1, h2, y1), FY_ERR_INVALID);
            fy_backend_release_tensor(be, &wdv);
            fy_backend_release_tensor(be, &norm);
            free(wd);
            fy_backend_destroy(be);
        }
    }
    assert_int_equal(checked, 2 * 2 * 2 * (N_TYPES + 3) * 3 * 2);
    free(x), free(nw), free(h1), free(h2);
}

static int teardown(void **state)
{
    fy_test_tmpdir_remove();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_type_table),
        cmocka_unit_test(test_dequant_matches_gguf_py),
        cmocka_unit_test(test_quantize_roundtrip),
        cmocka_unit_test(test_vec_dot_all_isas),
        cmocka_unit_test(test_matmul_mixed_types),
        cmocka_unit_test(test_rmsnorm_matmul_matches_ops),
        cmocka_unit_test(test_embed_rows),
        cmocka_unit_test(test_matmul_refuses_partial_blocks),
        cmocka_unit_test(test_partial_block_rows_refused),
    };
    return cmocka_run_group_tests(tests, NULL, teardown);
}

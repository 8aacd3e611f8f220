/*
 * cpu_kernels.h - the inner loops of the CPU backend, one table per
 * instruction set (scalar; AVX2+FMA+F16C; the same with AVX-VNNI or
 * AVX512-VNNI integer dot products), picked at run time.
 *
 * Quantized weights are multiplied straight from their GGUF blocks: the
 * activation row is quantized once to 8 bits per 32-element block (an f32
 * scale d and d * sum(q) per block), and each weight block contributes an
 * integer dot product times two scales (plus min * d * sum(q) for Q4_1 and
 * Q5_1).  No dequantized copy of any weight matrix exists.
 *
 * K-quants (Q2_K..Q6_K, super-blocks of 256) use the same activation rows:
 * a super-block is 8 activation blocks, its weight sub-block scales (6 or
 * 8 bits, per 16 or 32) are folded into each block's integer sum, and the
 * 8 sums are scaled by 8 floats at once.  Why not llama.cpp's q8_K (one
 * scale per 256 and sums per 16, which lets a super-block accumulate in
 * integers): one matmul call quantizes its input once for all its weights,
 * and a K-quant file mixes types in one call (Q4_K/Q6_K/Q5_0/Q8_0 for Q,
 * K, V); a second activation format would mean a second quantization, and
 * the per-32 scale is the more accurate one.  The price is a float
 * multiply-add per 32 columns, which the measured kernels afford (Q4_K
 * and Q6_K decode at 85-100% of the bandwidth bound, the 2-, 3- and 5-bit
 * types at 70-77%, closer to compute-bound; BENCHMARKS.md, issue 15).  The
 * per-16 sums of the activation's quants
 * (isum16) serve the types whose offsets or minimums change every 16.
 *
 * Packed weights.  At upload the backend re-lays quantized matrices whose
 * row count is a multiple of 8 as "x8" blocks: one 32-column block of 8
 * consecutive rows, the 8 scales together, then the quants interleaved 4
 * bytes per row.  A 32-byte load then holds 4 quants of each of the 8
 * rows, so an integer dot against 4 activation bytes broadcast to all
 * lanes accumulates row r in lane r: no horizontal sums, one vector load
 * for 8 scales.  Same bytes as the file (a copy, not a dequantization);
 * this is the layout llama.cpp's CPU "repack" buffers use for the same
 * reason.  Every quantized weight type has one (the structs below); the
 * K-quants' are per super-block and also reorder bits within the block
 * where that saves the kernel shifts.
 */
#ifndef FY_CPU_KERNELS_H
#define FY_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"

/* An activation row quantized to 8 bits, as a structure of arrays so that
 * the scales of 8 consecutive blocks load as one vector: block b holds
 * qs[32 b .. 32 b + 31] ~= x / d[b], and s[b] = d[b] * sum of those 32.
 * isum16 serves the K-quants whose scales (or offsets) change every 16
 * elements: their packed kernels take the offset off per 16. */
typedef struct fy_q8a {
    float *d;        /* [n / 32] */
    float *s;        /* [n / 32] */
    int32_t *isum;   /* [n / 32] sum of the block's quants */
    int32_t *isum16; /* [n / 16] sum of each 16 quants */
    int8_t *qs;      /* [n] */
} fy_q8a_t;

/* Bytes a row of n elements takes in a workspace (64-byte aligned parts). */
size_t fy_q8a_bytes(int64_t n);
/* Lays out a row of n elements at mem (64-byte aligned, fy_q8a_bytes(n) long). */
fy_q8a_t fy_q8a_at(void *mem, int64_t n);

/* 8 rows x 32 columns of a packed matrix (see above): quants of row r,
 * columns 4c .. 4c + 3 of the block's 32, at qs[32 c + 4 r] (for Q4 each
 * byte holds column j in its low nibble and j + 16 in its high one, as in
 * GGUF) */
typedef struct fy_block_q4_0x8 {
    uint16_t d[8];
    uint8_t qs[128];
} fy_block_q4_0x8_t;

typedef struct fy_block_q4_1x8 {
    uint16_t d[8];
    uint16_t m[8];
    uint8_t qs[128];
} fy_block_q4_1x8_t;

typedef struct fy_block_q8_0x8 {
    uint16_t d[8];
    int8_t qs[256];
} fy_block_q8_0x8_t;

/* Q5_0/Q5_1: as Q4_0x8/Q4_1x8, plus the fifth bits of the 8 rows
 * rearranged so that one shift and one mask give them for each 32-byte
 * load: bit s of qh[4 r + k] is that of row r's element 4 s + k (s < 8:
 * the low nibbles of load s, then the high nibbles of load s - 4). */
typedef struct fy_block_q5_0x8 {
    uint16_t d[8];
    uint8_t qh[32];
    uint8_t qs[128];
} fy_block_q5_0x8_t;

typedef struct fy_block_q5_1x8 {
    uint16_t d[8];
    uint16_t m[8];
    uint8_t qh[32];
    uint8_t qs[128];
} fy_block_q5_1x8_t;

typedef struct fy_block_iq4_nlx8 {
    uint16_t d[8];
    uint8_t qs[128]; /* as Q4_0x8's; the indices go through the table in the kernel */
} fy_block_iq4_nlx8_t;

/*
 * K-quants: one super-block (256 columns) of 8 rows.  Quant bytes are
 * interleaved 4 per row as above, each 32-byte load holding the same 4
 * byte positions of the 8 rows' arrays; per-row scales are stored
 * transposed, row r in lane r: the 6-bit packed ones (Q3_K, Q4_K, Q5_K)
 * as their three 32-bit words ([word][row]) to be unpacked 8 rows at a
 * time, the 8-bit ones (Q2_K, Q6_K) as [scale][row] bytes.
 */
typedef struct fy_block_q2_kx8 {
    uint16_t d[8], dmin[8];
    uint8_t scales[8][8][2]; /* [sub-block][row]: the scale bytes of its two halves */
    uint8_t qs[8][2][32];    /* [c][h]: bytes 32 h + 4 c .. + 3 of each row's qs */
} fy_block_q2_kx8_t;

/* Q3_K's 3-bit quants v_s = q + 4 of sub-blocks s = 0..7 of one column,
 * regrouped so that all 8 come out of 3 bytes with few shifts:
 *   b0 = v0 | v1 << 3 | (v6 & 3) << 6,  b1 = v2 | v3 << 3 | (v7 & 3) << 6,
 *   b2 = v4 | v5 << 3 | (v6 >> 2) << 6 | (v7 >> 2) << 7
 * (the same 24 bits as the file's two qs bytes and one hmask byte) */
typedef struct fy_block_q3_kx8 {
    uint16_t d[8];
    uint32_t scales[3][8];
    uint8_t q[8][3][32]; /* [c][b0, b1, b2]: columns 4 c .. 4 c + 3 of each row */
} fy_block_q3_kx8_t;

typedef struct fy_block_q4_kx8 {
    uint16_t d[8], dmin[8];
    uint32_t scales[3][8];
    uint8_t qs[4][8][32]; /* [j2][c]: bytes 32 j2 + 4 c .. + 3 of each row's qs */
} fy_block_q4_kx8_t;

typedef struct fy_block_q5_kx8 {
    uint16_t d[8], dmin[8];
    uint32_t scales[3][8];
    uint8_t qh[8][32];    /* [c]: bytes 4 c .. 4 c + 3 of each row's qh */
    uint8_t qs[4][8][32]; /* as q4_kx8 */
} fy_block_q5_kx8_t;

/* Q6_K's quants in the order the kernel reads them (one stream, which the
 * hardware prefetcher follows): for each h and c, bytes 64 h + 4 c .. + 3
 * and 64 h + 32 + 4 c .. + 3 of each row's ql, then 32 h + 4 c .. + 3 of
 * its qh; these hold the 4 sub-blocks 4 h .. 4 h + 3 of columns 4 c .. */
typedef struct fy_block_q6_kx8 {
    uint16_t d[8];
    int8_t scales[16][8];
    uint8_t q[2][8][3][32]; /* [h][c][ql low half, ql high half, qh] */
} fy_block_q6_kx8_t;

_Static_assert(sizeof(fy_block_q4_0x8_t) == 8 * sizeof(fy_block_q4_0_t), "x8 keeps the size");
_Static_assert(sizeof(fy_block_q5_0x8_t) == 8 * sizeof(fy_block_q5_0_t), "x8 keeps the size");
_Static_assert(sizeof(fy_block_q5_1x8_t) == 8 * sizeof(fy_block_q5_1_t), "x8 keeps the size");
_Static_assert(sizeof(fy_block_iq4_nlx8_t) == 8 * sizeof(fy_block_iq4_nl_t), "x8 keeps the size");
_Static_assert(sizeof(fy_block_q2_kx8_t) == 8 * sizeof(fy_block_q2_k_t), "x8 keeps the size");
_Static_assert(sizeof(fy_block_q3_kx8_t) == 8 * sizeof(fy_block_q3_k_t), "x8 keeps the size");
_Static_assert(sizeof(fy_block_q4_kx8_t) == 8 * sizeof(fy_block_q4_k_t), "x8 keeps the size");
_Static_assert(sizeof(fy_block_q5_kx8_t) == 8 * sizeof(fy_block_q5_k_t), "x8 keeps the size");
_Static_assert(sizeof(fy_block_q6_kx8_t) == 8 * sizeof(fy_block_q6_k_t), "x8 keeps the size");
_Static_assert(sizeof(fy_block_q4_1x8_t) == 8 * sizeof(fy_block_q4_1_t), "x8 keeps the size");
_Static_assert(sizeof(fy_block_q8_0x8_t) == 8 * sizeof(fy_block_q8_0_t), "x8 keeps the size");

#define FY_CPU_PACK_X8 1 /* fy_tensor_t.packing of a packed matrix */

/* Re-lays 8 consecutive rows of a quantized matrix (nb 32-element blocks
 * per row, rows row_bytes apart) as x8 blocks at dst: nb of them, or nb / 8
 * for the K-quants. */
void fy_pack_x8(fy_dtype_t dtype, const void *src, size_t row_bytes, int64_t nb, void *dst);

/* y[t * ldy + r] = row r of an 8-row packed group (nb 32-element blocks) . x[t],
 * for t < n_tok.  Each token's result is computed the same way whatever
 * n_tok is. */
typedef void (*fy_gemm_x8_fn)(const void *w, int64_t nb, const fy_q8a_t *x, int n_tok, float *y, int64_t ldy);

/* The same for two consecutive 8-row groups at once (w1 = w0 + one group),
 * y[t * ldy + r] for r < 16; worth it where wide vectors double the work
 * per instruction, that is for several tokens (prefill, batched decode).
 * Each row's arithmetic equals gemm_x8's, so either gives the same bits. */
typedef void (*fy_gemm_x16_fn)(const void *w0, const void *w1, int64_t nb, const fy_q8a_t *x, int n_tok, float *y,
                               int64_t ldy);

/* dot of one weight row (n elements of dtype) with one activation row:
 * a const fy_q8a_t * for quantized dtypes, a const float * otherwise. */
typedef float (*fy_vec_dot_fn)(const void *w, const void *x, int64_t n);

/* One K/V block of online-softmax attention for the G query heads that
 * share a KV head.  q: [G][hd]; k, v: nk <= 32 rows of hd elements (f32 or
 * f16, by the table entry); scores are q . k * scale.  m, l: [G] running
 * maximum score and sum of exp(score - m); acc: [G][hd] running sum of
 * exp(score - m) * v.  Start with m = -inf, l = 0, acc = 0; the output is
 * acc / l.  G <= FY_ATTN_MAX_GROUP.  bsum: NULL, or [G] set to these nk
 * keys' sum of exp(score - m) with m as it is after the call (the block's
 * share of l, summed on its own: H2O's per-block attention mass without a
 * cancelling l_after - l_before; l itself is summed as without bsum). */
#define FY_ATTN_MAX_GROUP 32
typedef void (*fy_attn_block_fn)(const float *q, int G, const void *k, const void *v, int nk, int hd, float scale,
                                 float *m, float *l, float *acc, float *bsum);

/* One K/V block for a tile of nr query rows of one sequence, G heads each
 * (prefill chunks: the block is read and converted once for every row).
 * q[r]: row r's [G][hd] query; k, v: the block's first rows (f32 or f16,
 * by the table entry); row r sees keys [vis[2r], vis[2r + 1]) of them,
 * never an empty range; m, l: [nr][G], acc: [nr][G][hd] as attn_block's.
 * Each row's arithmetic is attn_block's over the keys it sees, operation
 * for operation: the same bits in any tile, or through attn_block.  work:
 * 64-byte aligned, 2 * 32 * hd floats.  hd % 8 == 0. */
typedef void (*fy_attn_tile_fn)(const float *const *q, int nr, int G, const void *k, const void *v, int nk, int hd,
                                float scale, const int32_t *vis, float *m, float *l, float *acc, float *work);

/* The tile in bf16 arithmetic (cpu_attn_avx512bf16.c; FY_CPU_ATTN=bf16):
 * Q, K, V and the softmax weights rounded to bf16 (8-bit mantissa), dot
 * products and sums in f32; not the f32 kernels' bits, but within the
 * bound test_kernels derives.  hd % 32 == 0; only where
 * fy_cpu_has_avx512bf16(). */
void fy_attn_tile_bf16_f32(const float *const *q, int nr, int G, const void *k, const void *v, int nk, int hd,
                           float scale, const int32_t *vis, float *m, float *l, float *acc, float *work);
void fy_attn_tile_bf16_f16(const float *const *q, int nr, int G, const void *k, const void *v, int nk, int hd,
                           float scale, const int32_t *vis, float *m, float *l, float *acc, float *work);
int fy_cpu_has_avx512bf16(void);

/* Decode attention over one block of int8 KV rows read in place
 * (cpu_attn_i8_avx512vnni.c, AVX512-VNNI CPUs; the row walk's under
 * FY_CPU_ATTN=int8).  fy_attn_q8_quantize: q [G][hd] into codes qc [G][hd] with one
 * scale qs[g] = max |q| / 127 and the codes' sum qsum[g] a head, once per
 * (token, kv head).  fy_attn_block_i8_vnni: k, v point at a block's first
 * rows ([f32 scale][hd codes], row_bytes apart), nk <= 32; m, l, acc as
 * attn_block's.  hd % 64 == 0. */
void fy_attn_q8_quantize(const float *q, int G, int hd, int8_t *qc, float *qs, int32_t *qsum);
void fy_attn_block_i8_vnni(const int8_t *qc, const float *qs, const int32_t *qsum, int G, const void *k, const void *v,
                           size_t row_bytes, int nk, int hd, float scale, float *m, float *l, float *acc);

typedef struct fy_cpu_kernels {
    const char *name;
    /* x (n floats, n % 32 == 0) into the row y */
    void (*quantize_q8a)(const float *x, const fy_q8a_t *y, int64_t n);
    fy_vec_dot_fn vec_dot[FY_DTYPE_COUNT];
    fy_gemm_x8_fn gemm_x8[FY_DTYPE_COUNT];   /* NULL: no packed path */
    fy_gemm_x16_fn gemm_x16[FY_DTYPE_COUNT]; /* NULL: gemm_x8 for every token count */
    /* by KV dtype (f32, f16); hd must be a multiple of 8 for the vector tables */
    fy_attn_block_fn attn_block[FY_DTYPE_COUNT];
    /* by KV dtype (f32, f16); NULL where the table has none (scalar) */
    fy_attn_tile_fn attn_tile[FY_DTYPE_COUNT];
    /* y = x / rms(x) * w over one row of n (y may alias x) */
    void (*rmsnorm)(const float *x, const float *w, int64_t n, float eps, float *y);
    /* out = silu(gate) * up over n elements (out may alias gate) */
    void (*swiglu)(const float *gate, const float *up, float *out, int64_t n);
    /* out = gelu_tanh(gate) * up = gate * sigmoid(2u) * up, u = sqrt(2/pi)
     * (gate + 0.044715 gate^3), over n elements (out may alias gate) */
    void (*geglu)(const float *gate, const float *up, float *out, int64_t n);
    /* f16 <-> f32 rows (KV writes) */
    void (*f32_to_f16)(const float *x, uint16_t *y, int64_t n);
    /* one fp8 (fp8 != 0) or int8 KV row, [f32 scale][n codes] (kv.h), into
     * n floats; the same bits as fy_kv_row_read */
    void (*kv_row_read)(const void *row, int fp8, float *x, int64_t n);
} fy_cpu_kernels_t;

extern const fy_cpu_kernels_t fy_cpu_kernels_scalar;
extern const fy_cpu_kernels_t fy_cpu_kernels_avx2;
extern const fy_cpu_kernels_t fy_cpu_kernels_avxvnni;
extern const fy_cpu_kernels_t fy_cpu_kernels_avx512vnni;

/* The best table this machine runs, or the one named ("scalar", "avx2",
 * "avxvnni", "avx512vnni"; NULL or "auto" for the best); NULL if the
 * machine lacks what the named one needs. */
const fy_cpu_kernels_t *fy_cpu_kernels_pick(const char *name);
/* Does this machine run the AVX2 table (AVX2, FMA and F16C)? */
int fy_cpu_has_avx2(void);

#endif /* FY_CPU_KERNELS_H */

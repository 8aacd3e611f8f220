/*
 * cpu_scalar.c - portable C versions of the CPU inner loops: the fallback
 * on machines without AVX2, and the reference the AVX2 versions are
 * tested against.
 */
#include <math.h>
#include <string.h>

#include "common/mem.h"

#include "kernels/cpu/cpu_kernels.h"

size_t fy_q8a_bytes(int64_t n)
{
    size_t nb = (size_t)n / FY_QK;
    return 3 * FY_ALIGN_UP(nb * sizeof(float), 64) + FY_ALIGN_UP(2 * nb * sizeof(int32_t), 64) +
           FY_ALIGN_UP((size_t)n, 64);
}

fy_q8a_t fy_q8a_at(void *mem, int64_t n)
{
    size_t nb = (size_t)n / FY_QK, fb = FY_ALIGN_UP(nb * sizeof(float), 64);
    size_t hb = FY_ALIGN_UP(2 * nb * sizeof(int32_t), 64);
    char *p = mem;
    return (fy_q8a_t){.d = (float *)p,
                      .s = (float *)(p + fb),
                      .isum = (int32_t *)(p + 2 * fb),
                      .isum16 = (int32_t *)(p + 3 * fb),
                      .qs = (int8_t *)(p + 3 * fb + hb)};
}

/* out[32 c + 4 r + k] = row r's byte off + 4 c + k, for c < 8 */
static void interleave8(uint8_t *out, const uint8_t *const *rows, size_t off)
{
    for (int c = 0; c < 8; c++)
        for (int r = 0; r < 8; r++) memcpy(out + 32 * c + 4 * r, rows[r] + off + 4 * c, 4);
}

/* Q5_0/Q5_1's fifth bits: bit s of out[4 r + k] is bit 4 s + k of row r's qh */
static void q5_planes(uint8_t *out, const uint8_t *const *qh)
{
    memset(out, 0, 32);
    for (int r = 0; r < 8; r++) {
        uint32_t h;
        memcpy(&h, qh[r], 4);
        for (int s = 0; s < 8; s++)
            for (int k = 0; k < 4; k++) out[4 * r + k] |= (uint8_t)(((h >> (4 * s + k)) & 1) << s);
    }
}

/* the 32-element types of fy_pack_x8 that carry fifth bits or a table */
static void pack_x8_32(fy_dtype_t dtype, const char *rows, size_t row_bytes, int64_t nb, void *dst)
{
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *qs[8], *qh[8];
        uint16_t *d, *m = NULL;
        uint8_t *oqh = NULL, *oqs;
        for (int r = 0; r < 8; r++) {
            const char *blk = rows + (size_t)r * row_bytes;
            if (dtype == FY_DTYPE_Q5_0) {
                const fy_block_q5_0_t *in = (const fy_block_q5_0_t *)blk + b;
                qs[r] = in->qs, qh[r] = in->qh;
            } else if (dtype == FY_DTYPE_Q5_1) {
                const fy_block_q5_1_t *in = (const fy_block_q5_1_t *)blk + b;
                qs[r] = in->qs, qh[r] = in->qh;
            } else {
                qs[r] = ((const fy_block_iq4_nl_t *)blk + b)->qs;
            }
        }
        if (dtype == FY_DTYPE_Q5_0) {
            fy_block_q5_0x8_t *out = (fy_block_q5_0x8_t *)dst + b;
            d = out->d, oqh = out->qh, oqs = out->qs;
        } else if (dtype == FY_DTYPE_Q5_1) {
            fy_block_q5_1x8_t *out = (fy_block_q5_1x8_t *)dst + b;
            d = out->d, m = out->m, oqh = out->qh, oqs = out->qs;
        } else {
            fy_block_iq4_nlx8_t *out = (fy_block_iq4_nlx8_t *)dst + b;
            d = out->d, oqs = out->qs;
        }
        for (int r = 0; r < 8; r++) {
            const char *blk = rows + (size_t)r * row_bytes;
            int bb = fy_dtype_info(dtype)->block_bytes;
            memcpy(&d[r], blk + b * bb, 2); /* d leads every block */
            if (m) memcpy(&m[r], blk + b * bb + 2, 2);
            for (int c = 0; c < 4; c++) memcpy(oqs + 32 * c + 4 * r, qs[r] + 4 * c, 4);
        }
        if (oqh) q5_planes(oqh, qh);
    }
}

static void pack_x8_k(fy_dtype_t dtype, const char *rows, size_t row_bytes, int64_t nsb, void *dst)
{
    for (int64_t i = 0; i < nsb; i++) {
        const uint8_t *p[8];
        switch (dtype) {
        case FY_DTYPE_Q2_K: {
            fy_block_q2_kx8_t *out = (fy_block_q2_kx8_t *)dst + i;
            for (int r = 0; r < 8; r++) {
                const fy_block_q2_k_t *in = (const fy_block_q2_k_t *)(rows + (size_t)r * row_bytes) + i;
                out->d[r] = in->d, out->dmin[r] = in->dmin;
                for (int s = 0; s < 16; s++) out->scales[s / 2][r][s % 2] = in->scales[s];
                p[r] = in->qs;
            }
            for (int c = 0; c < 8; c++)
                for (int h = 0; h < 2; h++)
                    for (int r = 0; r < 8; r++) memcpy(out->qs[c][h] + 4 * r, p[r] + 32 * h + 4 * c, 4);
            break;
        }
        case FY_DTYPE_Q3_K: {
            fy_block_q3_kx8_t *out = (fy_block_q3_kx8_t *)dst + i;
            for (int r = 0; r < 8; r++) {
                const fy_block_q3_k_t *in = (const fy_block_q3_k_t *)(rows + (size_t)r * row_bytes) + i;
                out->d[r] = in->d;
                for (int w = 0; w < 3; w++) memcpy(&out->scales[w][r], in->scales + 4 * w, 4);
                for (int l = 0; l < 32; l++) {
                    int v[8]; /* q + 4 of sub-block s at column l */
                    for (int s = 0; s < 8; s++)
                        v[s] = ((in->qs[32 * (s / 4) + l] >> (2 * (s % 4))) & 3) | (((in->hmask[l] >> s) & 1) << 2);
                    uint8_t *o = out->q[l / 4][0] + 4 * r + l % 4;
                    o[0] = (uint8_t)(v[0] | v[1] << 3 | (v[6] & 3) << 6);
                    o[32] = (uint8_t)(v[2] | v[3] << 3 | (v[7] & 3) << 6);
                    o[64] = (uint8_t)(v[4] | v[5] << 3 | (v[6] >> 2) << 6 | (v[7] >> 2) << 7);
                }
            }
            break;
        }
        case FY_DTYPE_Q4_K: {
            fy_block_q4_kx8_t *out = (fy_block_q4_kx8_t *)dst + i;
            for (int r = 0; r < 8; r++) {
                const fy_block_q4_k_t *in = (const fy_block_q4_k_t *)(rows + (size_t)r * row_bytes) + i;
                out->d[r] = in->d, out->dmin[r] = in->dmin;
                for (int w = 0; w < 3; w++) memcpy(&out->scales[w][r], in->scales + 4 * w, 4);
                p[r] = in->qs;
            }
            for (int j2 = 0; j2 < 4; j2++) interleave8(out->qs[j2][0], p, (size_t)32 * j2);
            break;
        }
        case FY_DTYPE_Q5_K: {
            fy_block_q5_kx8_t *out = (fy_block_q5_kx8_t *)dst + i;
            const uint8_t *qh[8];
            for (int r = 0; r < 8; r++) {
                const fy_block_q5_k_t *in = (const fy_block_q5_k_t *)(rows + (size_t)r * row_bytes) + i;
                out->d[r] = in->d, out->dmin[r] = in->dmin;
                for (int w = 0; w < 3; w++) memcpy(&out->scales[w][r], in->scales + 4 * w, 4);
                p[r] = in->qs, qh[r] = in->qh;
            }
            interleave8(out->qh[0], qh, 0);
            for (int j2 = 0; j2 < 4; j2++) interleave8(out->qs[j2][0], p, (size_t)32 * j2);
            break;
        }
        case FY_DTYPE_Q6_K: {
            fy_block_q6_kx8_t *out = (fy_block_q6_kx8_t *)dst + i;
            const uint8_t *qh[8];
            for (int r = 0; r < 8; r++) {
                const fy_block_q6_k_t *in = (const fy_block_q6_k_t *)(rows + (size_t)r * row_bytes) + i;
                out->d[r] = in->d;
                for (int s = 0; s < 16; s++) out->scales[s][r] = in->scales[s];
                p[r] = in->ql, qh[r] = in->qh;
            }
            for (int h = 0; h < 2; h++) {
                for (int c = 0; c < 8; c++) {
                    for (int r = 0; r < 8; r++) {
                        memcpy(out->q[h][c][0] + 4 * r, p[r] + 64 * h + 4 * c, 4);
                        memcpy(out->q[h][c][1] + 4 * r, p[r] + 64 * h + 32 + 4 * c, 4);
                        memcpy(out->q[h][c][2] + 4 * r, qh[r] + 32 * h + 4 * c, 4);
                    }
                }
            }
            break;
        }
        default: break;
        }
    }
}

void fy_pack_x8(fy_dtype_t dtype, const void *src, size_t row_bytes, int64_t nb, void *dst)
{
    const char *rows = src;
    switch (dtype) {
    case FY_DTYPE_Q5_0:
    case FY_DTYPE_Q5_1:
    case FY_DTYPE_IQ4_NL: pack_x8_32(dtype, rows, row_bytes, nb, dst); return;
    case FY_DTYPE_Q2_K:
    case FY_DTYPE_Q3_K:
    case FY_DTYPE_Q4_K:
    case FY_DTYPE_Q5_K:
    case FY_DTYPE_Q6_K: pack_x8_k(dtype, rows, row_bytes, nb / 8, dst); return;
    default: break;
    }
    for (int64_t b = 0; b < nb; b++) {
        for (int r = 0; r < 8; r++) {
            const char *blk = rows + (size_t)r * row_bytes;
            switch (dtype) {
            case FY_DTYPE_Q4_0: {
                const fy_block_q4_0_t *in = (const fy_block_q4_0_t *)blk + b;
                fy_block_q4_0x8_t *out = (fy_block_q4_0x8_t *)dst + b;
                out->d[r] = in->d;
                for (int c = 0; c < 4; c++) memcpy(out->qs + 32 * c + 4 * r, in->qs + 4 * c, 4);
                break;
            }
            case FY_DTYPE_Q4_1: {
                const fy_block_q4_1_t *in = (const fy_block_q4_1_t *)blk + b;
                fy_block_q4_1x8_t *out = (fy_block_q4_1x8_t *)dst + b;
                out->d[r] = in->d;
                out->m[r] = in->m;
                for (int c = 0; c < 4; c++) memcpy(out->qs + 32 * c + 4 * r, in->qs + 4 * c, 4);
                break;
            }
            case FY_DTYPE_Q8_0: {
                const fy_block_q8_0_t *in = (const fy_block_q8_0_t *)blk + b;
                fy_block_q8_0x8_t *out = (fy_block_q8_0x8_t *)dst + b;
                out->d[r] = in->d;
                for (int c = 0; c < 8; c++) memcpy(out->qs + 32 * c + 4 * r, in->qs + 4 * c, 4);
                break;
            }
            default: break;
            }
        }
    }
}

static void quantize_q8a(const float *x, const fy_q8a_t *y, int64_t n)
{
    for (int64_t b = 0; b < n / FY_QK; b++) {
        const float *xb = x + b * FY_QK;
        float amax = 0.0f;
        for (int j = 0; j < FY_QK; j++) amax = fmaxf(amax, fabsf(xb[j]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum[2] = {0, 0};
        for (int j = 0; j < FY_QK; j++) {
            int q = (int)nearbyintf(xb[j] * id); /* to nearest even, as AVX2's cvtps */
            y->qs[b * FY_QK + j] = (int8_t)q;
            sum[j / 16] += q;
        }
        y->d[b] = d;
        y->s[b] = d * (float)(sum[0] + sum[1]);
        y->isum[b] = sum[0] + sum[1];
        y->isum16[2 * b] = sum[0];
        y->isum16[2 * b + 1] = sum[1];
    }
}

static float dot_q8_0(const void *w, const void *x, int64_t n)
{
    const fy_block_q8_0_t *wb = w;
    const fy_q8a_t *xa = x;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / FY_QK; b++) {
        const int8_t *xq = xa->qs + b * FY_QK;
        int isum = 0;
        for (int j = 0; j < FY_QK; j++) isum += wb[b].qs[j] * xq[j];
        sum += fy_fp16_to_fp32(wb[b].d) * xa->d[b] * (float)isum;
    }
    return sum;
}

static float dot_q4_0(const void *w, const void *x, int64_t n)
{
    const fy_block_q4_0_t *wb = w;
    const fy_q8a_t *xa = x;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / FY_QK; b++) {
        const int8_t *xq = xa->qs + b * FY_QK;
        int isum = 0;
        for (int j = 0; j < FY_QK / 2; j++) {
            isum += ((wb[b].qs[j] & 0x0f) - 8) * xq[j];
            isum += ((wb[b].qs[j] >> 4) - 8) * xq[j + FY_QK / 2];
        }
        sum += fy_fp16_to_fp32(wb[b].d) * xa->d[b] * (float)isum;
    }
    return sum;
}

static float dot_q4_1(const void *w, const void *x, int64_t n)
{
    const fy_block_q4_1_t *wb = w;
    const fy_q8a_t *xa = x;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / FY_QK; b++) {
        const int8_t *xq = xa->qs + b * FY_QK;
        int isum = 0;
        for (int j = 0; j < FY_QK / 2; j++) {
            isum += (wb[b].qs[j] & 0x0f) * xq[j];
            isum += (wb[b].qs[j] >> 4) * xq[j + FY_QK / 2];
        }
        sum += fy_fp16_to_fp32(wb[b].d) * xa->d[b] * (float)isum + fy_fp16_to_fp32(wb[b].m) * xa->s[b];
    }
    return sum;
}

/* 5-bit quant j of a Q5_0/Q5_1 block (0..31) */
static inline int q5_at(const uint8_t *qs, uint32_t qh, int j)
{
    int lo = j < 16 ? qs[j] & 0x0f : qs[j - 16] >> 4;
    return lo | (int)(((qh >> j) & 1) << 4);
}

static float dot_q5_0(const void *w, const void *x, int64_t n)
{
    const fy_block_q5_0_t *wb = w;
    const fy_q8a_t *xa = x;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / FY_QK; b++) {
        const int8_t *xq = xa->qs + b * FY_QK;
        uint32_t qh;
        memcpy(&qh, wb[b].qh, 4);
        int isum = 0;
        for (int j = 0; j < FY_QK; j++) isum += (q5_at(wb[b].qs, qh, j) - 16) * xq[j];
        sum += fy_fp16_to_fp32(wb[b].d) * xa->d[b] * (float)isum;
    }
    return sum;
}

static float dot_q5_1(const void *w, const void *x, int64_t n)
{
    const fy_block_q5_1_t *wb = w;
    const fy_q8a_t *xa = x;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / FY_QK; b++) {
        const int8_t *xq = xa->qs + b * FY_QK;
        uint32_t qh;
        memcpy(&qh, wb[b].qh, 4);
        int isum = 0;
        for (int j = 0; j < FY_QK; j++) isum += q5_at(wb[b].qs, qh, j) * xq[j];
        sum += fy_fp16_to_fp32(wb[b].d) * xa->d[b] * (float)isum + fy_fp16_to_fp32(wb[b].m) * xa->s[b];
    }
    return sum;
}

static float dot_iq4_nl(const void *w, const void *x, int64_t n)
{
    const fy_block_iq4_nl_t *wb = w;
    const fy_q8a_t *xa = x;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / FY_QK; b++) {
        const int8_t *xq = xa->qs + b * FY_QK;
        int isum = 0;
        for (int j = 0; j < FY_QK / 2; j++) {
            isum += fy_iq4nl_values[wb[b].qs[j] & 0x0f] * xq[j];
            isum += fy_iq4nl_values[wb[b].qs[j] >> 4] * xq[j + FY_QK / 2];
        }
        sum += fy_fp16_to_fp32(wb[b].d) * xa->d[b] * (float)isum;
    }
    return sum;
}

/*
 * K-quants: a super-block of 256 is 8 activation blocks of 32.  Each
 * activation block's integer sum folds in the weights' small scales (per
 * 16 or 32, all integers), and is scaled by the super-block's d and the
 * activation block's d; minimums come in through the activation's
 * per-block sums (per 32) or a per-16 integer sum of its quants.
 */
static float dot_q2_k(const void *w, const void *x, int64_t n)
{
    const fy_block_q2_k_t *wb = w;
    const fy_q8a_t *xa = x;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / FY_QK_K; i++) {
        float d = fy_fp16_to_fp32(wb[i].d), dmin = fy_fp16_to_fp32(wb[i].dmin);
        for (int j = 0; j < 8; j++) {
            int64_t b = i * 8 + j;
            const int8_t *xq = xa->qs + b * FY_QK;
            int isum = 0, msum = 0;
            for (int h = 0; h < 2; h++) {
                uint8_t sc = wb[i].scales[2 * j + h];
                int qx = 0, xs = 0;
                for (int l = 16 * h; l < 16 * h + 16; l++) {
                    int e = 32 * j + l;
                    qx += ((wb[i].qs[32 * (e / 128) + l] >> (2 * (j % 4))) & 3) * xq[l];
                    xs += xq[l];
                }
                isum += (sc & 0xf) * qx;
                msum += (sc >> 4) * xs;
            }
            sum += d * xa->d[b] * (float)isum - dmin * xa->d[b] * (float)msum;
        }
    }
    return sum;
}

static float dot_q3_k(const void *w, const void *x, int64_t n)
{
    const fy_block_q3_k_t *wb = w;
    const fy_q8a_t *xa = x;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / FY_QK_K; i++) {
        uint8_t sc[16];
        fy_k3_scales(wb[i].scales, sc);
        float d = fy_fp16_to_fp32(wb[i].d);
        for (int j = 0; j < 8; j++) {
            int64_t b = i * 8 + j;
            const int8_t *xq = xa->qs + b * FY_QK;
            int isum = 0;
            for (int h = 0; h < 2; h++) {
                int qx = 0;
                for (int l = 16 * h; l < 16 * h + 16; l++) {
                    int q = ((wb[i].qs[32 * (j / 4) + l] >> (2 * (j % 4))) & 3) - ((wb[i].hmask[l] >> j) & 1 ? 0 : 4);
                    qx += q * xq[l];
                }
                isum += (sc[2 * j + h] - 32) * qx;
            }
            sum += d * xa->d[b] * (float)isum;
        }
    }
    return sum;
}

/* Q4_K and Q5_K share their scales and layout but for Q5_K's fifth bit */
static inline float dot_k45(const uint8_t *scales, const uint8_t *qs, const uint8_t *qh, uint16_t dh, uint16_t dminh,
                            const fy_q8a_t *xa, int64_t i)
{
    float d = fy_fp16_to_fp32(dh), dmin = fy_fp16_to_fp32(dminh), sum = 0.0f;
    for (int j = 0; j < 8; j++) {
        int64_t b = i * 8 + j;
        const int8_t *xq = xa->qs + b * FY_QK;
        uint8_t sc, m;
        fy_k4_scale_min(scales, j, &sc, &m);
        int isum = 0;
        for (int l = 0; l < 32; l++) {
            int q = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0xf;
            if (qh) q |= ((qh[l] >> j) & 1) << 4;
            isum += q * xq[l];
        }
        sum += d * (float)sc * xa->d[b] * (float)isum - dmin * (float)m * xa->s[b];
    }
    return sum;
}

static float dot_q4_k(const void *w, const void *x, int64_t n)
{
    const fy_block_q4_k_t *wb = w;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / FY_QK_K; i++) sum += dot_k45(wb[i].scales, wb[i].qs, NULL, wb[i].d, wb[i].dmin, x, i);
    return sum;
}

static float dot_q5_k(const void *w, const void *x, int64_t n)
{
    const fy_block_q5_k_t *wb = w;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / FY_QK_K; i++)
        sum += dot_k45(wb[i].scales, wb[i].qs, wb[i].qh, wb[i].d, wb[i].dmin, x, i);
    return sum;
}

static float dot_q6_k(const void *w, const void *x, int64_t n)
{
    const fy_block_q6_k_t *wb = w;
    const fy_q8a_t *xa = x;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / FY_QK_K; i++) {
        float d = fy_fp16_to_fp32(wb[i].d);
        for (int j = 0; j < 8; j++) {
            int64_t b = i * 8 + j;
            const int8_t *xq = xa->qs + b * FY_QK;
            int isum = 0;
            for (int h = 0; h < 2; h++) {
                int qx = 0;
                for (int l = 16 * h; l < 16 * h + 16; l++) {
                    int e = 32 * j + l;
                    int lo = (wb[i].ql[64 * (e / 128) + e % 64] >> (4 * (e / 64 % 2))) & 0xf;
                    int hi = (wb[i].qh[32 * (e / 128) + l] >> (2 * (j % 4))) & 3;
                    qx += ((lo | (hi << 4)) - 32) * xq[l];
                }
                isum += wb[i].scales[2 * j + h] * qx;
            }
            sum += d * xa->d[b] * (float)isum;
        }
    }
    return sum;
}

/* Float weights straight from safetensors can sit at any address: load
 * them through memcpy (one plain load on x86). */
static inline float ld_f32(const void *p, int64_t i)
{
    float v;
    memcpy(&v, (const char *)p + 4 * i, 4);
    return v;
}

static inline uint16_t ld_u16(const void *p, int64_t i)
{
    uint16_t v;
    memcpy(&v, (const char *)p + 2 * i, 2);
    return v;
}

static float dot_f32(const void *w, const void *x, int64_t n)
{
    const float *b = x;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) sum += ld_f32(w, i) * b[i];
    return sum;
}

static float dot_f16(const void *w, const void *x, int64_t n)
{
    const float *b = x;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) sum += fy_fp16_to_fp32(ld_u16(w, i)) * b[i];
    return sum;
}

static float dot_bf16(const void *w, const void *x, int64_t n)
{
    const float *b = x;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) sum += fy_bf16_to_fp32(ld_u16(w, i)) * b[i];
    return sum;
}

static inline float kv_f32(const void *p, int64_t i) { return ((const float *)p)[i]; }
static inline float kv_f16(const void *p, int64_t i) { return fy_fp16_to_fp32(((const uint16_t *)p)[i]); }

static inline void attn_block(const float *q, int G, const void *k, const void *v, int nk, int hd, float scale,
                              float *m, float *l, float *acc, float *bsum, float (*get)(const void *, int64_t))
{
    for (int g = 0; g < G; g++) {
        const float *qg = q + (size_t)g * hd;
        float *ag = acc + (size_t)g * hd;
        float sc[32], mb = m[g];
        for (int i = 0; i < nk; i++) {
            float d = 0.0f;
            for (int j = 0; j < hd; j++) d += qg[j] * get(k, (int64_t)i * hd + j);
            sc[i] = d * scale;
            if (sc[i] > mb) mb = sc[i];
        }
        if (mb > m[g]) {
            float corr = expf(m[g] - mb); /* 0 on the first block */
            l[g] *= corr;
            for (int j = 0; j < hd; j++) ag[j] *= corr;
            m[g] = mb;
        }
        float bs = 0.0f;
        for (int i = 0; i < nk; i++) {
            float e = expf(sc[i] - m[g]);
            l[g] += e;
            bs += e;
            for (int j = 0; j < hd; j++) ag[j] += e * get(v, (int64_t)i * hd + j);
        }
        if (bsum) bsum[g] = bs;
    }
}

static void attn_block_f32(const float *q, int G, const void *k, const void *v, int nk, int hd, float scale, float *m,
                           float *l, float *acc, float *bsum)
{
    attn_block(q, G, k, v, nk, hd, scale, m, l, acc, bsum, kv_f32);
}

static void attn_block_f16(const float *q, int G, const void *k, const void *v, int nk, int hd, float scale, float *m,
                           float *l, float *acc, float *bsum)
{
    attn_block(q, G, k, v, nk, hd, scale, m, l, acc, bsum, kv_f16);
}

static void rmsnorm(const float *x, const float *w, int64_t n, float eps, float *y)
{
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float scale = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * scale * w[i];
}

static void swiglu(const float *gate, const float *up, float *out, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_C 0.044715f

static void geglu(const float *gate, const float *up, float *out, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i], u = GELU_K * (g + GELU_C * g * g * g);
        out[i] = g / (1.0f + expf(-2.0f * u)) * up[i];
    }
}

static void f32_to_f16(const float *x, uint16_t *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] = fy_fp32_to_fp16(x[i]);
}

static void kv_row_read(const void *row, int fp8, float *x, int64_t n)
{
    float sc;
    memcpy(&sc, row, sizeof(sc));
    const uint8_t *q = (const uint8_t *)row + sizeof(float);
    if (fp8)
        for (int64_t i = 0; i < n; i++) x[i] = sc * fy_fp8_to_fp32(q[i]);
    else
        for (int64_t i = 0; i < n; i++) x[i] = sc * (float)(int8_t)q[i];
}

const fy_cpu_kernels_t fy_cpu_kernels_scalar = {
    .name = "scalar",
    .quantize_q8a = quantize_q8a,
    .vec_dot =
        {
            [FY_DTYPE_F32] = dot_f32,
            [FY_DTYPE_F16] = dot_f16,
            [FY_DTYPE_BF16] = dot_bf16,
            [FY_DTYPE_Q8_0] = dot_q8_0,
            [FY_DTYPE_Q4_0] = dot_q4_0,
            [FY_DTYPE_Q4_1] = dot_q4_1,
            [FY_DTYPE_Q5_0] = dot_q5_0,
            [FY_DTYPE_Q5_1] = dot_q5_1,
            [FY_DTYPE_IQ4_NL] = dot_iq4_nl,
            [FY_DTYPE_Q2_K] = dot_q2_k,
            [FY_DTYPE_Q3_K] = dot_q3_k,
            [FY_DTYPE_Q4_K] = dot_q4_k,
            [FY_DTYPE_Q5_K] = dot_q5_k,
            [FY_DTYPE_Q6_K] = dot_q6_k,
        },
    .attn_block = {[FY_DTYPE_F32] = attn_block_f32, [FY_DTYPE_F16] = attn_block_f16},
    .rmsnorm = rmsnorm,
    .swiglu = swiglu,
    .geglu = geglu,
    .f32_to_f16 = f32_to_f16,
    .kv_row_read = kv_row_read,
};

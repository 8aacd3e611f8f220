/*
 * cpu_scalar.c - portable C versions of the CPU inner loops: the fallback
 * on machines without AVX2, and the reference the AVX2 versions are
 * tested against.
 */
#include <math.h>
#include <string.h>

#include "mem.h"

#include "cpu_kernels.h"

size_t fy_q8a_bytes(int64_t n)
{
    size_t nb = (size_t)n / FY_QK;
    return 3 * FY_ALIGN_UP(nb * sizeof(float), 64) + FY_ALIGN_UP((size_t)n, 64);
}

fy_q8a_t fy_q8a_at(void *mem, int64_t n)
{
    size_t nb = (size_t)n / FY_QK, fb = FY_ALIGN_UP(nb * sizeof(float), 64);
    char *p = mem;
    return (fy_q8a_t){
        .d = (float *)p, .s = (float *)(p + fb), .isum = (int32_t *)(p + 2 * fb), .qs = (int8_t *)(p + 3 * fb)};
}

void fy_pack_x8(fy_dtype_t dtype, const void *src, size_t row_bytes, int64_t nb, void *dst)
{
    const char *rows = src;
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
        int sum = 0;
        for (int j = 0; j < FY_QK; j++) {
            int q = (int)nearbyintf(xb[j] * id); /* to nearest even, as AVX2's cvtps */
            y->qs[b * FY_QK + j] = (int8_t)q;
            sum += q;
        }
        y->d[b] = d;
        y->s[b] = d * (float)sum;
        y->isum[b] = sum;
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
                              float *m, float *l, float *acc, float (*get)(const void *, int64_t))
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
        for (int i = 0; i < nk; i++) {
            float e = expf(sc[i] - m[g]);
            l[g] += e;
            for (int j = 0; j < hd; j++) ag[j] += e * get(v, (int64_t)i * hd + j);
        }
    }
}

static void attn_block_f32(const float *q, int G, const void *k, const void *v, int nk, int hd, float scale, float *m,
                           float *l, float *acc)
{
    attn_block(q, G, k, v, nk, hd, scale, m, l, acc, kv_f32);
}

static void attn_block_f16(const float *q, int G, const void *k, const void *v, int nk, int hd, float scale, float *m,
                           float *l, float *acc)
{
    attn_block(q, G, k, v, nk, hd, scale, m, l, acc, kv_f16);
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
        },
    .attn_block = {[FY_DTYPE_F32] = attn_block_f32, [FY_DTYPE_F16] = attn_block_f16},
    .rmsnorm = rmsnorm,
    .swiglu = swiglu,
    .geglu = geglu,
    .f32_to_f16 = f32_to_f16,
    .kv_row_read = kv_row_read,
};

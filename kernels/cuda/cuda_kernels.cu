/*
 * cuda_kernels.cu - the CUDA backend's kernels: each a static __global__
 * behind a plain extern "C" launcher (declared in cuda_kernels.h).  The
 * CPU reference of each is in kernels/cpu/cpu_backend.c and
 * cpu_scalar.c; the arithmetic follows it where that is cheap (double
 * sums in RMSNorm, double angles in RoPE, the same online-softmax merge),
 * so differences come from summation order only.
 *
 * Not here: the projections and the embedding lookup (cuda_quant.cu,
 * on weights as their file stores them) and anything that allocates.
 */
#include "kernels/cuda/cuda_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

/* ---- elementwise and row ops ---------------------------------------------------- */

static __global__ void f32_to_bf16_kernel(const float *x, __nv_bfloat16 *y, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = __float2bfloat16_rn(x[i]);
}

static unsigned grid_for(size_t n, unsigned threads)
{
    size_t b = (n + threads - 1) / threads;
    return b > 65535 ? 65535u : (b ? (unsigned)b : 1u);
}

extern "C" cudaError_t fy_cuda_f32_to_bf16(const float *x, void *y, size_t n, cudaStream_t s)
{
    f32_to_bf16_kernel<<<grid_for(n, 256), 256, 0, s>>>(x, (__nv_bfloat16 *)y, n);
    return cudaGetLastError();
}

#define RMS_THREADS 256

/* one block per row; the sum of squares in double, reduced in a fixed tree */
static __global__ void rmsnorm_kernel(const float *x, const float *w, int32_t dim, float eps, float *y)
{
    __shared__ double part[RMS_THREADS];
    const float *xr = x + (size_t)blockIdx.x * dim;
    float *yr = y + (size_t)blockIdx.x * dim;
    double ss = 0.0;
    for (int32_t i = threadIdx.x; i < dim; i += RMS_THREADS) ss += (double)xr[i] * xr[i];
    part[threadIdx.x] = ss;
    __syncthreads();
    for (int stride = RMS_THREADS / 2; stride > 0; stride /= 2) {
        if ((int)threadIdx.x < stride) part[threadIdx.x] += part[threadIdx.x + stride];
        __syncthreads();
    }
    float scale = (float)(1.0 / sqrt(part[0] / (double)dim + (double)eps));
    for (int32_t i = threadIdx.x; i < dim; i += RMS_THREADS) yr[i] = xr[i] * scale * w[i];
}

extern "C" cudaError_t fy_cuda_rmsnorm(const float *x, const float *w, int32_t n, int32_t dim, float eps, float *y,
                                       cudaStream_t s)
{
    rmsnorm_kernel<<<n, RMS_THREADS, 0, s>>>(x, w, dim, eps, y);
    return cudaGetLastError();
}

/* one block per token; each thread one (head, pair) of q or k.  Angles in
 * double as the CPU computes them: pos * inv_freq[i], the frequencies
 * computed on the host (fy_rope_inv_freq) and passed by value. */
static __global__ void rope_kernel(float *q, float *k, const int32_t *pos, int32_t n_heads, int32_t n_kv, int32_t hd,
                                   fy_cuda_rope_freqs_t freqs, int neox)
{
    const int32_t t = blockIdx.x, half = hd / 2, total = (n_heads + n_kv) * half;
    const double p = (double)pos[t];
    for (int32_t e = threadIdx.x; e < total; e += blockDim.x) {
        int32_t h = e / half, i = e % half;
        float *v = h < n_heads ? q + ((size_t)t * n_heads + h) * hd : k + ((size_t)t * n_kv + (h - n_heads)) * hd;
        double a = p * freqs.inv_freq[i];
        float cs = (float)cos(a), sn = (float)sin(a);
        int32_t ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
        float x0 = v[ia], x1 = v[ib];
        v[ia] = x0 * cs - x1 * sn;
        v[ib] = x0 * sn + x1 * cs;
    }
}

extern "C" cudaError_t fy_cuda_rope(float *q, float *k, const int32_t *pos, int32_t n, int32_t n_heads, int32_t n_kv,
                                    int32_t hd, const fy_cuda_rope_freqs_t *freqs, int neox, cudaStream_t s)
{
    rope_kernel<<<n, 128, 0, s>>>(q, k, pos, n_heads, n_kv, hd, *freqs, neox);
    return cudaGetLastError();
}

static __global__ void swiglu_kernel(const float *gate, const float *up, float *out, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

extern "C" cudaError_t fy_cuda_swiglu(const float *gate, const float *up, float *out, size_t n, cudaStream_t s)
{
    swiglu_kernel<<<grid_for(n, 256), 256, 0, s>>>(gate, up, out, n);
    return cudaGetLastError();
}

static __global__ void geglu_kernel(const float *gate, const float *up, float *out, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float g = gate[i], u = 0.7978845608028654f * (g + 0.044715f * g * g * g);
        out[i] = g / (1.0f + expf(-2.0f * u)) * up[i];
    }
}

extern "C" cudaError_t fy_cuda_geglu(const float *gate, const float *up, float *out, size_t n, cudaStream_t s)
{
    geglu_kernel<<<grid_for(n, 256), 256, 0, s>>>(gate, up, out, n);
    return cudaGetLastError();
}

/* one block per row */
static __global__ void add_bias_kernel(float *x, const float *b, int32_t width)
{
    float *row = x + (size_t)blockIdx.x * width;
    for (int32_t i = threadIdx.x; i < width; i += blockDim.x) row[i] += b[i];
}

extern "C" cudaError_t fy_cuda_add_bias(float *x, const float *b, int32_t n, int32_t width, cudaStream_t s)
{
    add_bias_kernel<<<n, 256, 0, s>>>(x, b, width);
    return cudaGetLastError();
}

static __global__ void scale_kernel(float *x, float a, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] *= a;
}

extern "C" cudaError_t fy_cuda_scale(float *x, float a, size_t n, cudaStream_t s)
{
    scale_kernel<<<grid_for(n, 256), 256, 0, s>>>(x, a, n);
    return cudaGetLastError();
}

static __global__ void add_kernel(float *x, const float *y, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] += y[i];
}

extern "C" cudaError_t fy_cuda_add(float *x, const float *y, size_t n, cudaStream_t s)
{
    add_kernel<<<grid_for(n, 256), 256, 0, s>>>(x, y, n);
    return cudaGetLastError();
}

/* ---- KV cache ------------------------------------------------------------------ */

/* The scaled row codecs of kv.h, the CPU's (dtype.h, kv.c) operation for
 * operation, so the GPU writes the same bytes and reads the same values. */
static __device__ __forceinline__ float fp8_to_fp32(uint32_t b)
{
    uint32_t mag = b & 0x7fu, sign = (b & 0x80u) << 24;
    float v = __uint_as_float(mag << 20) * 0x1p120f;
    uint32_t bits = mag == 0x7f ? 0x7fc00000u : __float_as_uint(v);
    return __uint_as_float(bits | sign);
}

static __device__ __forceinline__ uint8_t fp32_to_fp8(float f)
{
    uint32_t x = __float_as_uint(f);
    uint8_t sign = (uint8_t)((x >> 24) & 0x80);
    x &= 0x7fffffffu;
    if (x > 0x7f800000u) return (uint8_t)(sign | 0x7f);
    if (x >= 0x43e00000u) return (uint8_t)(sign | 0x7e);
    if (x < 0x3c800000u) {
        float q = __uint_as_float(x) * 512.0f;
        int qi = (int)q;
        float fr = q - (float)qi;
        if (fr > 0.5f || (fr == 0.5f && (qi & 1))) qi++;
        return (uint8_t)(sign | qi);
    }
    uint32_t e = (x >> 23) - 120, mant = x & 0x7fffff;
    uint32_t code = (e << 3) | (mant >> 20), rem = mant & 0xfffff;
    if (rem > 0x80000 || (rem == 0x80000 && (code & 1))) code++;
    return (uint8_t)(sign | code);
}

/* a scaled row's f32 scale, read bytewise (a row of 4 + head_dim bytes is
 * 4-byte aligned only where head_dim is) */
static __device__ __forceinline__ float row_scale(const uint8_t *row)
{
    return __uint_as_float((uint32_t)row[0] | (uint32_t)row[1] << 8 | (uint32_t)row[2] << 16 | (uint32_t)row[3] << 24);
}

static __device__ __forceinline__ char *kv_row(const fy_cuda_kv_geom_t &g, const void *arena, int32_t id, int32_t kvh,
                                               int32_t off)
{
    return (char *)arena + (size_t)id * g.block_bytes + (size_t)g.layer * g.layer_bytes + (size_t)kvh * g.head_bytes +
           (size_t)off * g.row_bytes;
}

#define KVW_THREADS 128

/* grid (token, kv head, k|v); one row each */
static __global__ void __launch_bounds__(KVW_THREADS)
    kv_write_kernel(char *arena, const int32_t *slots, const float *k, const float *v, fy_cuda_kv_geom_t g)
{
    __shared__ float red[KVW_THREADS];
    const int32_t t = blockIdx.x, h = blockIdx.y, is_v = blockIdx.z, hd = g.hd;
    const int32_t slot = slots[t];
    if (slot < 0) return; /* a padding row of a recorded step: nothing to keep */
    const float *src = (is_v ? v : k) + ((size_t)t * g.n_kv + h) * hd;
    char *row = kv_row(g, arena, slot / g.block_size, h, slot % g.block_size) + (size_t)is_v * g.kv_bytes;
    if (g.dtype == FY_CUDA_KV_F32) {
        for (int32_t d = threadIdx.x; d < hd; d += blockDim.x) ((float *)row)[d] = src[d];
        return;
    }
    if (g.dtype == FY_CUDA_KV_F16) {
        for (int32_t d = threadIdx.x; d < hd; d += blockDim.x) ((__half *)row)[d] = __float2half_rn(src[d]);
        return;
    }
    /* fp8 / int8: the row's largest magnitude (max is exact in any order) */
    float m = 0.0f;
    for (int32_t d = threadIdx.x; d < hd; d += blockDim.x) m = fmaxf(m, fabsf(src[d]));
    red[threadIdx.x] = m;
    __syncthreads();
    for (int stride = KVW_THREADS / 2; stride > 0; stride /= 2) {
        if ((int)threadIdx.x < stride) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + stride]);
        __syncthreads();
    }
    const float amax = red[0], qmax = g.dtype == FY_CUDA_KV_FP8 ? 448.0f : 127.0f;
    const float scale = amax / qmax, inv = amax > 0.0f ? qmax / amax : 0.0f;
    uint8_t *b = (uint8_t *)row;
    if (threadIdx.x < 4) b[threadIdx.x] = (uint8_t)(__float_as_uint(scale) >> (8 * threadIdx.x));
    uint8_t *q = b + 4;
    for (int32_t d = threadIdx.x; d < hd; d += blockDim.x) {
        if (g.dtype == FY_CUDA_KV_FP8) {
            q[d] = fp32_to_fp8(__fmul_rn(src[d], inv));
        } else {
            float x = fmaxf(-127.0f, fminf(127.0f, roundf(__fmul_rn(src[d], inv))));
            q[d] = (uint8_t)(int8_t)x;
        }
    }
}

extern "C" cudaError_t fy_cuda_kv_write(void *arena, const int32_t *slots, int32_t n, const float *k, const float *v,
                                        const fy_cuda_kv_geom_t *g, cudaStream_t s)
{
    dim3 grid((unsigned)n, (unsigned)g->n_kv, 2);
    kv_write_kernel<<<grid, KVW_THREADS, 0, s>>>((char *)arena, slots, k, v, *g);
    return cudaGetLastError();
}

/* ---- attention --------------------------------------------------------------------
 *
 * Pass 1: one block per (tile, kv head, segment).  A tile is up to qt
 * consecutive query tokens of one sequence (qt = 1 for decode; more in
 * prefill, so K/V staged once serve several tokens); the block serves all
 * G query heads of its KV head for those tokens: rows r = token * G + g
 * (GQA: K/V are read once per group, not once per head).  It walks its
 * segment's keys through the block table in chunks staged in shared
 * memory (16-byte loads where rows are aligned; K rows padded by one float
 * so the score loop, whose threads read different keys at the same
 * column, hits 32 different banks), keeping an online softmax (max m, sum
 * l, accumulator) per row, keys past a row's position masked (causal).
 * With a sliding window W a row also masks keys W or more positions behind
 * it; segments and chunks wholly before the window of the tile's first
 * (earliest) token are skipped, and keys before that window are never
 * loaded, so blocks wholly before every window are never read.  Keys of
 * evicted blocks (table entry -1) are masked for every row and never
 * loaded either.
 *
 * A sequence that is not split (seg_len 0: prefill chunks) has one
 * segment, and pass 1 writes its rows to out.  A split one (decode) writes
 * partials; pass 2, one block per (split token, head), merges them in
 * segment order (flash-decoding's reduction), from the first segment its
 * window reaches.  Each row's arithmetic depends only on its own position,
 * its sequence's length and keys, never on the tile, grid or batch.
 */

static __device__ int32_t attn_win_lo(int32_t window, int32_t p)
{
    return window && p - window + 1 > 0 ? p - window + 1 : 0;
}

/* ve consecutive elements d0.. of a K or V row into dst, as f32; ve is 1
 * or the vector width of the format (4 f32, 8 f16, 4 one-byte codes) */
static __device__ __forceinline__ void load_row(const char *row, int32_t dtype, int32_t d0, int32_t ve, float *dst)
{
    if (dtype == FY_CUDA_KV_F32) {
        if (ve == 4) {
            float4 x = *(const float4 *)(row + (size_t)d0 * 4);
            dst[0] = x.x, dst[1] = x.y, dst[2] = x.z, dst[3] = x.w;
        } else {
            dst[0] = ((const float *)row)[d0];
        }
    } else if (dtype == FY_CUDA_KV_F16) {
        if (ve == 8) {
            uint4 x = *(const uint4 *)(row + (size_t)d0 * 2);
            const __half2 *h = (const __half2 *)&x;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float2 f = __half22float2(h[i]);
                dst[2 * i] = f.x, dst[2 * i + 1] = f.y;
            }
        } else {
            dst[0] = __half2float(((const __half *)row)[d0]);
        }
    } else {
        const uint8_t *b = (const uint8_t *)row;
        const float sc = row_scale(b);
        const bool fp8 = dtype == FY_CUDA_KV_FP8;
        if (ve == 4) {
            uint32_t w = *(const uint32_t *)(b + 4 + d0);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                uint32_t c = (w >> (8 * i)) & 0xffu;
                dst[i] = sc * (fp8 ? fp8_to_fp32(c) : (float)(int8_t)c);
            }
        } else {
            uint32_t c = b[4 + d0];
            dst[0] = sc * (fp8 ? fp8_to_fp32(c) : (float)(int8_t)c);
        }
    }
}

static __device__ __forceinline__ int32_t load_width(const fy_cuda_attn_args_t &a)
{
    if (!a.vec) return 1;
    return a.kv.dtype == FY_CUDA_KV_F16 ? 8 : 4;
}

/* the tile a pass-1 block serves: its sequence and first token */
static __device__ bool attn_tile(const fy_cuda_attn_args_t &a, int32_t tile, int32_t *s_p, int32_t *t0_p)
{
    for (int32_t s = 0; s < a.n_seqs; s++) {
        int32_t nt = (a.seqs[s].n_q + a.qt - 1) / a.qt;
        if (tile < nt) {
            *s_p = s;
            *t0_p = a.seqs[s].q_start + tile * a.qt;
            return true;
        }
        tile -= nt;
    }
    return false;
}

/* K and V of positions p0 .. p0 + nk - 1 into shared memory as f32, VE
 * elements per thread and load (a compile-time width, so the staging
 * registers stay registers); K rows at stride hd + 1 */
template <int VE>
static __device__ __forceinline__ void stage_chunk(const fy_cuda_attn_args_t &a, const int32_t *bt, int32_t kvh,
                                                   int32_t p0, int32_t nk, int32_t wlo, float *sk, float *sv)
{
    const int32_t hd = a.kv.hd, nvec = hd / VE;
    for (int32_t e = threadIdx.x; e < nk * nvec; e += blockDim.x) {
        const int32_t j = e / nvec, d0 = (e % nvec) * VE, p = p0 + j;
        const int32_t id = bt[p / a.kv.block_size];
        float kx[VE], vx[VE];
        if (p < wlo || id < 0) { /* masked for every row: before the window, or evicted (-1) */
#pragma unroll
            for (int i = 0; i < VE; i++) kx[i] = vx[i] = 0.0f;
        } else {
            const char *krow = kv_row(a.kv, a.arena, id, kvh, p % a.kv.block_size);
            load_row(krow, a.kv.dtype, d0, VE, kx);
            load_row(krow + a.kv.kv_bytes, a.kv.dtype, d0, VE, vx);
        }
        float *kd = sk + (size_t)j * (hd + 1) + d0, *vd = sv + (size_t)j * hd + d0;
#pragma unroll
        for (int i = 0; i < VE; i++) kd[i] = kx[i], vd[i] = vx[i];
    }
}

static __global__ void __launch_bounds__(FY_CUDA_ATTN_THREADS) attn_part_kernel(fy_cuda_attn_args_t a)
{
    extern __shared__ float smem[];
    const int32_t G = a.G, hd = a.kv.hd, R = a.qt * G, CH = a.chunk, KS = hd + 1; /* K row stride: padded */
    float *sq = smem;                                                             /* [R][hd] queries */
    float *sk = sq + (size_t)R * hd;                                              /* [CH][hd + 1] keys */
    float *sv = sk + (size_t)CH * KS;                                             /* [CH][hd] values */
    float *ss = sv + (size_t)CH * hd;      /* [R][CH] scores, then probabilities */
    float *s_m = ss + R * CH;              /* [R] running max */
    float *s_l = s_m + R;                  /* [R] running sum */
    float *s_c = s_l + R;                  /* [R] this chunk's correction */
    int32_t *s_pos = (int32_t *)(s_c + R); /* [qt] position of each tile token */

    const int32_t kvh = blockIdx.x % a.kv.n_kv, seg = blockIdx.y;
    int32_t s, t0;
    if (!attn_tile(a, blockIdx.x / a.kv.n_kv, &s, &t0)) return;
    const fy_cuda_seq_t sd = a.seqs[s];
    const bool split = sd.seg_len > 0;
    if (!split && seg > 0) return; /* one segment: the whole context */
    const int32_t nq = min(a.qt, sd.q_start + sd.n_q - t0), nr = nq * G;
    const int32_t last = a.apos[t0 + nq - 1];
    const int32_t lo = split ? seg * sd.seg_len : 0;
    if (lo > last) return; /* no token of the tile reaches this segment */
    const int32_t hi = split ? min(lo + sd.seg_len, last + 1) : last + 1;
    const int32_t wlo = attn_win_lo(a.window, a.apos[t0]); /* the earliest key any row of the tile sees */
    /* a split row's partial for this segment is read by pass 2 only if the
     * segment reaches its window, which starts at or after wlo */
    if (hi <= wlo && split) return;
    const int32_t *bt = a.block_tables + sd.bt_off + (size_t)a.group * sd.n_blocks;
    const int tid = threadIdx.x;
    const int32_t ve = load_width(a);

    for (int32_t e = tid; e < nr * hd; e += blockDim.x) {
        int32_t r = e / hd, d = e % hd;
        sq[e] = a.q[((size_t)(t0 + r / G) * a.n_heads + (size_t)kvh * G + r % G) * hd + d];
    }
    for (int32_t r = tid; r < nr; r += blockDim.x) s_m[r] = -INFINITY, s_l[r] = 0.0f;
    for (int32_t i = tid; i < nq; i += blockDim.x) s_pos[i] = a.apos[t0 + i];
    float acc[FY_CUDA_ATTN_ACC];
#pragma unroll
    for (int i = 0; i < FY_CUDA_ATTN_ACC; i++) acc[i] = 0.0f;
    __syncthreads();

    /* chunks wholly before every row's window are all masked: skip them */
    const int32_t first = wlo > lo ? lo + (wlo - lo) / CH * CH : lo;
    for (int32_t p0 = first; p0 < hi; p0 += CH) {
        const int32_t nk = min(CH, hi - p0);
        if (ve == 8)
            stage_chunk<8>(a, bt, kvh, p0, nk, wlo, sk, sv);
        else if (ve == 4)
            stage_chunk<4>(a, bt, kvh, p0, nk, wlo, sk, sv);
        else
            stage_chunk<1>(a, bt, kvh, p0, nk, wlo, sk, sv);
        __syncthreads();
        for (int32_t e = tid; e < nr * nk; e += blockDim.x) {
            const int32_t r = e / nk, j = e % nk;
            const float *qr = sq + (size_t)r * hd, *kr = sk + (size_t)j * KS;
            float dot = 0.0f;
            for (int32_t d = 0; d < hd; d++) dot += qr[d] * kr[d];
            const int32_t rp = s_pos[r / G], p = p0 + j;
            const bool seen = p <= rp && p >= attn_win_lo(a.window, rp) && bt[p / a.kv.block_size] >= 0;
            ss[r * CH + j] = seen ? dot * a.scale : -INFINITY;
        }
        __syncthreads();
        for (int32_t r = tid; r < nr; r += blockDim.x) {
            float *sr = ss + r * CH, mx = s_m[r];
            for (int32_t j = 0; j < nk; j++) mx = fmaxf(mx, sr[j]);
            if (mx == -INFINITY) { /* nothing visible yet: keep the empty state */
                for (int32_t j = 0; j < nk; j++) sr[j] = 0.0f;
                s_c[r] = 1.0f;
                continue;
            }
            float corr = expf(s_m[r] - mx), sum = 0.0f; /* 0 at the first visible key */
            for (int32_t j = 0; j < nk; j++) {
                sr[j] = expf(sr[j] - mx);
                sum += sr[j];
            }
            s_l[r] = s_l[r] * corr + sum;
            s_m[r] = mx;
            s_c[r] = corr;
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < FY_CUDA_ATTN_ACC; i++) {
            int32_t e = tid + i * FY_CUDA_ATTN_THREADS;
            if (e >= nr * hd) break;
            int32_t r = e / hd, d = e % hd;
            float v = acc[i] * s_c[r];
            for (int32_t j = 0; j < nk; j++) v += ss[r * CH + j] * sv[(size_t)j * hd + d];
            acc[i] = v;
        }
        __syncthreads();
    }

    if (!split) { /* the whole context: the row's result, and its softmax state for H2O */
        for (int32_t r = tid; r < nr; r += blockDim.x) {
            size_t row = (size_t)(t0 + r / G) * a.n_heads + (size_t)kvh * G + r % G;
            a.fm[row] = s_m[r];
            a.fl[row] = s_l[r];
        }
#pragma unroll
        for (int i = 0; i < FY_CUDA_ATTN_ACC; i++) {
            int32_t e = tid + i * FY_CUDA_ATTN_THREADS;
            if (e >= nr * hd) break;
            int32_t r = e / hd, d = e % hd;
            size_t row = (size_t)(t0 + r / G) * a.n_heads + (size_t)kvh * G + r % G;
            a.out[row * hd + d] = s_l[r] > 0.0f ? acc[i] / s_l[r] : 0.0f; /* no key visible: zeros */
        }
        return;
    }
    const int32_t p0 = sd.part0 + (t0 - sd.q_start); /* the tile's first token among the split ones */
    for (int32_t r = tid; r < nr; r += blockDim.x) {
        size_t idx = ((size_t)(p0 + r / G) * a.n_heads + (size_t)kvh * G + r % G) * a.splits + seg;
        a.pm[idx] = s_m[r];
        a.pl[idx] = s_l[r];
    }
#pragma unroll
    for (int i = 0; i < FY_CUDA_ATTN_ACC; i++) {
        int32_t e = tid + i * FY_CUDA_ATTN_THREADS;
        if (e >= nr * hd) break;
        int32_t r = e / hd, d = e % hd;
        size_t idx = ((size_t)(p0 + r / G) * a.n_heads + (size_t)kvh * G + r % G) * a.splits + seg;
        a.pacc[idx * hd + d] = acc[i];
    }
}

/* one block per (split token, head): merge its segments in order, as the
 * CPU's attn_merge (a segment whose every key was evicted has m = -inf and
 * adds nothing; a row with no visible key at all gets zeros) */
static __global__ void attn_reduce_kernel(fy_cuda_attn_args_t a)
{
    const int32_t i = blockIdx.x / a.n_heads, h = blockIdx.x % a.n_heads, hd = a.kv.hd;
    const int32_t t = a.split_tok[i];
    const fy_cuda_seq_t sd = a.seqs[a.tseq[t]];
    const int32_t pi = sd.part0 + (t - sd.q_start);
    const int32_t seg0 = attn_win_lo(a.window, a.apos[t]) / sd.seg_len, segs = a.apos[t] / sd.seg_len + 1;
    const size_t base = ((size_t)pi * a.n_heads + h) * a.splits;
    for (int32_t d = threadIdx.x; d < hd; d += blockDim.x) {
        float M = -INFINITY, L = 0.0f, A = 0.0f;
        for (int32_t sg = seg0; sg < segs; sg++) {
            float m = a.pm[base + sg], l = a.pl[base + sg], x = a.pacc[(base + sg) * hd + d];
            if (m == -INFINITY) continue; /* every key of the segment masked */
            float mx = fmaxf(m, M);
            float ca = M == -INFINITY ? 0.0f : expf(M - mx), cs = expf(m - mx);
            L = L * ca + l * cs;
            A = A * ca + x * cs;
            M = mx;
        }
        a.out[((size_t)t * a.n_heads + h) * hd + d] = L > 0.0f ? A / L : 0.0f; /* no key left: zeros */
        if (d == 0) {
            a.fm[(size_t)t * a.n_heads + h] = M;
            a.fl[(size_t)t * a.n_heads + h] = L;
        }
    }
}

#define SCORE_THREADS 128

/* H2O: one block per (logical block i, sequence s) adds the attention mass
 * that block's keys received from every query row and head of s this
 * layer: sum of exp(scale q.k - M) / L with each row's final M and L,
 * masked as pass 1 masks.  A thread sums its (row, head, key) triples in
 * order, then a fixed tree: the same bits on every run. */
static __global__ void __launch_bounds__(SCORE_THREADS) attn_scores_kernel(fy_cuda_attn_args_t a)
{
    __shared__ float red[SCORE_THREADS];
    const int32_t i = blockIdx.x, s = blockIdx.y, hd = a.kv.hd, bs = a.kv.block_size;
    const fy_cuda_seq_t sd = a.seqs[s];
    if (i >= sd.n_blocks) return;
    const int32_t id = a.block_tables[sd.bt_off + (size_t)a.group * sd.n_blocks + i];
    if (id < 0) return; /* evicted: gets nothing */
    const int32_t k0 = i * bs, nk = min(bs, sd.kv_len - k0);
    float sum = 0.0f;
    const int32_t work = sd.n_q * a.n_heads * (nk > 0 ? nk : 0);
    for (int32_t e = threadIdx.x; e < work; e += SCORE_THREADS) {
        const int32_t j = e % nk, h = (e / nk) % a.n_heads, t = sd.q_start + e / nk / a.n_heads;
        const int32_t p = k0 + j, rp = a.apos[t];
        if (p > rp || p < attn_win_lo(a.window, rp)) continue;
        const size_t row = (size_t)t * a.n_heads + h;
        const float L = a.fl[row];
        if (!(L > 0.0f)) continue;
        const char *krow = kv_row(a.kv, a.arena, id, h / a.G, p % bs);
        const float *q = a.q + row * hd;
        float dot = 0.0f, kx;
        for (int32_t d = 0; d < hd; d++) {
            load_row(krow, a.kv.dtype, d, 1, &kx);
            dot += q[d] * kx;
        }
        sum += expf(dot * a.scale - a.fm[row]) / L;
    }
    red[threadIdx.x] = sum;
    __syncthreads();
    for (int stride = SCORE_THREADS / 2; stride > 0; stride /= 2) {
        if ((int)threadIdx.x < stride) red[threadIdx.x] += red[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) a.scores[(size_t)s * a.scores_stride + i] += red[0];
}

extern "C" cudaError_t fy_cuda_attention_init(size_t max_smem)
{
    return cudaFuncSetAttribute(attn_part_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)max_smem);
}

extern "C" cudaError_t fy_cuda_attention(const fy_cuda_attn_args_t *a, int32_t grid_segs, cudaStream_t s)
{
    size_t smem = fy_cuda_attn_smem(a->G, a->qt, a->kv.hd);
    dim3 grid((unsigned)(a->n_tiles * a->kv.n_kv), (unsigned)(grid_segs > 0 ? grid_segs : 1));
    attn_part_kernel<<<grid, FY_CUDA_ATTN_THREADS, smem, s>>>(*a);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    if (a->n_split > 0) {
        attn_reduce_kernel<<<(unsigned)(a->n_split * a->n_heads), 128, 0, s>>>(*a);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
    }
    if (a->scores) {
        dim3 sg((unsigned)a->max_n_blocks, (unsigned)a->n_seqs);
        attn_scores_kernel<<<sg, SCORE_THREADS, 0, s>>>(*a);
        e = cudaGetLastError();
    }
    return e;
}

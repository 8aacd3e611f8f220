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
#include "cuda_kernels.h"

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

/* grid (token, kv head, k|v); the layout is fy_kv_offset's:
 * [block][layer][k|v][kv_head][token_in_block][head_dim] */
static __global__ void kv_write_kernel(char *arena, const int32_t *slots, const float *k, const float *v, int32_t n_kv,
                                       int32_t hd, int32_t bs, size_t block_bytes, size_t layer_bytes, size_t kv_bytes,
                                       size_t head_bytes, int32_t layer, int f16)
{
    const int32_t t = blockIdx.x, h = blockIdx.y, is_v = blockIdx.z;
    const int32_t slot = slots[t], block = slot / bs, off = slot % bs;
    const float *src = (is_v ? v : k) + ((size_t)t * n_kv + h) * hd;
    char *dst = arena + (size_t)block * block_bytes + (size_t)layer * layer_bytes + (size_t)is_v * kv_bytes +
                (size_t)h * head_bytes;
    for (int32_t d = threadIdx.x; d < hd; d += blockDim.x) {
        if (f16)
            ((__half *)dst)[(size_t)off * hd + d] = __float2half_rn(src[d]);
        else
            ((float *)dst)[(size_t)off * hd + d] = src[d];
    }
}

extern "C" cudaError_t fy_cuda_kv_write(void *arena, const int32_t *slots, int32_t n, const float *k, const float *v,
                                        int32_t n_kv, int32_t hd, int32_t block_size, size_t block_bytes,
                                        size_t layer_bytes, size_t kv_bytes, size_t head_bytes, int32_t layer, int f16,
                                        cudaStream_t s)
{
    dim3 grid((unsigned)n, (unsigned)n_kv, 2);
    kv_write_kernel<<<grid, 128, 0, s>>>((char *)arena, slots, k, v, n_kv, hd, block_size, block_bytes, layer_bytes,
                                         kv_bytes, head_bytes, layer, f16);
    return cudaGetLastError();
}

/* ---- attention --------------------------------------------------------------------
 *
 * Pass 1: one block per (tile, kv head, segment).  A tile is up to qt
 * consecutive query tokens of one sequence (qt = 1 for decode; more in
 * prefill, so K/V staged once serve several tokens); the block serves all
 * G query heads of its KV head for those tokens: rows r = token * G + g
 * (GQA: K/V are read once per group, not once per head).  It walks the
 * segment's keys through the block table in chunks staged in shared
 * memory, keeping an online softmax (max m, sum l, accumulator) per row,
 * keys past a row's position masked (causal), and writes the partial.
 * With a sliding window W a row also masks keys W or more positions behind
 * it; segments and key chunks that lie wholly before the window of the
 * tile's first (earliest) token are skipped, and keys before that window
 * are never loaded, so blocks wholly before every window are never read.
 * Keys of evicted blocks (table entry -1) are masked for every row and
 * never loaded either.  Pass 2: one block per (token, head) merges that token's segment partials
 * in segment order (flash-decoding's reduction), from the first segment its
 * window reaches.  Each row's arithmetic depends only on its own position
 * and keys, never on the tile or grid.
 */

/* The first position a query at p sees. */
static __device__ int32_t attn_win_lo(int32_t window, int32_t p)
{
    return window && p - window + 1 > 0 ? p - window + 1 : 0;
}

/* Shared memory pass 1 needs for these shapes (bytes). */
static size_t attn_smem(int32_t G, int32_t qt, int32_t hd)
{
    size_t R = (size_t)G * qt;
    return (R * hd + 2 * (size_t)FY_CUDA_ATTN_CHUNK * hd + R * FY_CUDA_ATTN_CHUNK + 3 * R) * sizeof(float) +
           (size_t)qt * sizeof(int32_t);
}

static __global__ void __launch_bounds__(FY_CUDA_ATTN_THREADS) attn_part_kernel(fy_cuda_attn_args_t a)
{
    extern __shared__ float smem[];
    const int32_t G = a.G, hd = a.hd, R = a.qt * G;
    float *sq = smem;                         /* [R][hd] queries */
    float *sk = sq + (size_t)R * hd;          /* [CHUNK][hd] keys */
    float *sv = sk + FY_CUDA_ATTN_CHUNK * hd; /* [CHUNK][hd] values */
    float *ss = sv + FY_CUDA_ATTN_CHUNK * hd; /* [R][CHUNK] scores, then probabilities */
    float *s_m = ss + R * FY_CUDA_ATTN_CHUNK; /* [R] running max */
    float *s_l = s_m + R;                     /* [R] running sum */
    float *s_c = s_l + R;                     /* [R] this chunk's correction */
    int32_t *s_pos = (int32_t *)(s_c + R);    /* [qt] position of each tile token */

    const int32_t kvh = blockIdx.x % a.n_kv, seg = blockIdx.y;
    int32_t tile = blockIdx.x / a.n_kv, s = 0;
    for (; s < a.n_seqs; s++) {
        int32_t nt = (a.seqs[s].n_q + a.qt - 1) / a.qt;
        if (tile < nt) break;
        tile -= nt;
    }
    if (s == a.n_seqs) return;
    const fy_cuda_seq_t sd = a.seqs[s];
    const int32_t t0 = sd.q_start + tile * a.qt;
    const int32_t nq = min(a.qt, sd.q_start + sd.n_q - t0), nr = nq * G;
    const int32_t last = a.apos[t0 + nq - 1];
    const int32_t lo = seg * FY_CUDA_ATTN_SEG;
    if (lo > last) return; /* the whole block: no token of the tile reaches this segment */
    const int32_t hi = min(lo + FY_CUDA_ATTN_SEG, last + 1);
    const int32_t wlo = attn_win_lo(a.window, a.apos[t0]); /* the earliest key any row of the tile sees */
    if (hi <= wlo) return;                                 /* the segment lies before every row's window */
    const int32_t *bt = a.block_tables + sd.bt_off + (size_t)a.group * sd.n_blocks;
    const int tid = threadIdx.x;
    const size_t elem = a.f16 ? 2 : 4;

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
    const int32_t first = wlo > lo ? lo + (wlo - lo) / FY_CUDA_ATTN_CHUNK * FY_CUDA_ATTN_CHUNK : lo;
    for (int32_t p0 = first; p0 < hi; p0 += FY_CUDA_ATTN_CHUNK) {
        const int32_t nk = min(FY_CUDA_ATTN_CHUNK, hi - p0);
        for (int32_t e = tid; e < nk * hd; e += blockDim.x) {
            int32_t j = e / hd, d = e % hd, p = p0 + j;
            const int32_t id = bt[p / a.block_size];
            if (p < wlo || id < 0) { /* masked for every row: before the window, or evicted (-1) */
                sk[e] = 0.0f;
                sv[e] = 0.0f;
                continue;
            }
            const char *base = (const char *)a.arena + (size_t)id * a.block_bytes + (size_t)a.layer * a.layer_bytes +
                               (size_t)kvh * a.head_bytes + ((size_t)(p % a.block_size) * hd + d) * elem;
            if (a.f16) {
                sk[e] = __half2float(*(const __half *)base);
                sv[e] = __half2float(*(const __half *)(base + a.kv_bytes));
            } else {
                sk[e] = *(const float *)base;
                sv[e] = *(const float *)(base + a.kv_bytes);
            }
        }
        __syncthreads();
        for (int32_t e = tid; e < nr * nk; e += blockDim.x) {
            int32_t r = e / nk, j = e % nk;
            float dot = 0.0f;
            for (int32_t d = 0; d < hd; d++) dot += sq[r * hd + d] * sk[j * hd + d];
            const int32_t rp = s_pos[r / G];
            const bool seen = p0 + j <= rp && p0 + j >= attn_win_lo(a.window, rp) && bt[(p0 + j) / a.block_size] >= 0;
            ss[r * FY_CUDA_ATTN_CHUNK + j] = seen ? dot * a.scale : -INFINITY;
        }
        __syncthreads();
        for (int32_t r = tid; r < nr; r += blockDim.x) {
            float *sr = ss + r * FY_CUDA_ATTN_CHUNK, mx = s_m[r];
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
            for (int32_t j = 0; j < nk; j++) v += ss[r * FY_CUDA_ATTN_CHUNK + j] * sv[j * hd + d];
            acc[i] = v;
        }
        __syncthreads();
    }

    for (int32_t r = tid; r < nr; r += blockDim.x) {
        size_t idx = ((size_t)(t0 + r / G) * a.n_heads + (size_t)kvh * G + r % G) * a.max_segs + seg;
        a.pm[idx] = s_m[r];
        a.pl[idx] = s_l[r];
    }
#pragma unroll
    for (int i = 0; i < FY_CUDA_ATTN_ACC; i++) {
        int32_t e = tid + i * FY_CUDA_ATTN_THREADS;
        if (e >= nr * hd) break;
        int32_t r = e / hd, d = e % hd;
        size_t idx = ((size_t)(t0 + r / G) * a.n_heads + (size_t)kvh * G + r % G) * a.max_segs + seg;
        a.pacc[idx * hd + d] = acc[i];
    }
}

/* one block per (token, head): merge its segments in order, as the CPU's
 * attn_merge (a segment whose every key was evicted has m = -inf and adds
 * nothing; a row with no visible key at all gets zeros) */
static __global__ void attn_reduce_kernel(fy_cuda_attn_args_t a)
{
    const int32_t t = blockIdx.x / a.n_heads, h = blockIdx.x % a.n_heads;
    const int32_t seg0 = attn_win_lo(a.window, a.apos[t]) / FY_CUDA_ATTN_SEG, segs = a.apos[t] / FY_CUDA_ATTN_SEG + 1;
    const size_t base = ((size_t)t * a.n_heads + h) * a.max_segs;
    for (int32_t d = threadIdx.x; d < a.hd; d += blockDim.x) {
        float M = -INFINITY, L = 0.0f, A = 0.0f;
        for (int32_t sg = seg0; sg < segs; sg++) {
            float m = a.pm[base + sg], l = a.pl[base + sg], x = a.pacc[(base + sg) * a.hd + d];
            if (m == -INFINITY) continue; /* every key of the segment evicted */
            float mx = fmaxf(m, M);
            float ca = M == -INFINITY ? 0.0f : expf(M - mx), cs = expf(m - mx);
            L = L * ca + l * cs;
            A = A * ca + x * cs;
            M = mx;
        }
        a.out[((size_t)t * a.n_heads + h) * a.hd + d] = L > 0.0f ? A / L : 0.0f; /* no key left: zeros */
    }
}

extern "C" cudaError_t fy_cuda_attention(const fy_cuda_attn_args_t *a, int32_t grid_segs, cudaStream_t s)
{
    size_t smem = attn_smem(a->G, a->qt, a->hd);
    if (smem > 48 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(attn_part_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
    }
    dim3 grid((unsigned)(a->n_tiles * a->n_kv), (unsigned)grid_segs);
    attn_part_kernel<<<grid, FY_CUDA_ATTN_THREADS, smem, s>>>(*a);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    attn_reduce_kernel<<<(unsigned)(a->n_tokens * a->n_heads), 128, 0, s>>>(*a);
    return cudaGetLastError();
}

/*
 * cuda_attn.c - the CUDA attention's host-side plans (cuda_attn.h).
 */
#include "kernels/cuda_attn.h"

#include <stdio.h>

int32_t fy_cuda_attn_chunk(int32_t head_dim) { return head_dim > 128 ? FY_CUDA_ATTN_CHUNK_WIDE : FY_CUDA_ATTN_CHUNK; }

int32_t fy_cuda_attn_qt(int32_t G, int32_t head_dim)
{
    if (G < 1 || G > FY_CUDA_ATTN_ROWS || head_dim < 1) return 0;
    int32_t qt = FY_CUDA_ATTN_ROWS / G;
    while (qt > 0 && (int64_t)qt * G * head_dim > (int64_t)FY_CUDA_ATTN_THREADS * FY_CUDA_ATTN_ACC) qt--;
    return qt;
}

size_t fy_cuda_attn_smem(int32_t G, int32_t qt, int32_t head_dim)
{
    size_t R = (size_t)G * (size_t)qt, hd = (size_t)head_dim, ch = (size_t)fy_cuda_attn_chunk(head_dim);
    return (R * hd + ch * (hd + 1) + ch * hd + R * ch + 3 * R) * sizeof(float) + (size_t)qt * sizeof(int32_t);
}

int32_t fy_cuda_attn_splits(int32_t n_sms, int32_t n_kv_heads)
{
    if (n_sms < 1) n_sms = 1;
    if (n_kv_heads < 1) n_kv_heads = 1;
    int32_t s = (2 * n_sms + n_kv_heads - 1) / n_kv_heads;
    return s < 1 ? 1 : s > FY_CUDA_ATTN_MAX_SPLITS ? FY_CUDA_ATTN_MAX_SPLITS : s;
}

int32_t fy_cuda_attn_seg_len(int32_t kv_len, int32_t n_q, int32_t splits)
{
    if (n_q > FY_CUDA_SPLIT_MAX_Q) return 0;
    if (splits < 1) splits = 1;
    if (kv_len < 1) kv_len = 1;
    int32_t seg = (kv_len + splits - 1) / splits;
    return (seg + FY_CUDA_ATTN_MIN_SEG - 1) / FY_CUDA_ATTN_MIN_SEG * FY_CUDA_ATTN_MIN_SEG;
}

int32_t fy_cuda_attn_split_tokens(int32_t max_tokens, int32_t max_seqs)
{
    int64_t t = (int64_t)max_seqs * FY_CUDA_SPLIT_MAX_Q;
    return t < max_tokens ? (int32_t)t : max_tokens;
}

size_t fy_cuda_attn_part_bytes(int32_t split_tokens, int32_t n_heads, int32_t splits, int32_t head_dim)
{
    return (size_t)split_tokens * (size_t)n_heads * (size_t)splits * ((size_t)head_dim + 2) * sizeof(float);
}

bool fy_cuda_kv_dtype_ok(fy_dtype_t dtype)
{
    return dtype == FY_DTYPE_F32 || dtype == FY_DTYPE_F16 || dtype == FY_DTYPE_FP8 || dtype == FY_DTYPE_I8;
}

const char *fy_cuda_attn_unsupported(int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, fy_dtype_t kv_dtype,
                                     size_t max_smem, char *buf, size_t cap)
{
    if (!fy_cuda_kv_dtype_ok(kv_dtype)) {
        snprintf(buf, cap, "kv.dtype = %s: the cuda kernels hold f32, f16, fp8 or int8", fy_dtype_name(kv_dtype));
        return buf;
    }
    if (head_dim < 2 || head_dim % 2 || head_dim > FY_CUDA_MAX_HEAD_DIM) {
        snprintf(buf, cap, "the model's head size %d (the cuda kernels take even sizes up to %d)", head_dim,
                 FY_CUDA_MAX_HEAD_DIM);
        return buf;
    }
    if (n_kv_heads < 1 || n_heads < n_kv_heads || n_heads % n_kv_heads) {
        snprintf(buf, cap, "the model's %d query heads over %d kv heads", n_heads, n_kv_heads);
        return buf;
    }
    const int32_t G = n_heads / n_kv_heads, qt = fy_cuda_attn_qt(G, head_dim);
    if (qt < 1) {
        snprintf(buf, cap, "the model's %d query heads per kv head of size %d (one attention block holds %d rows)", G,
                 head_dim, FY_CUDA_ATTN_ROWS);
        return buf;
    }
    size_t smem = fy_cuda_attn_smem(G, qt, head_dim);
    if (smem > max_smem) {
        snprintf(buf, cap,
                 "attention over heads of size %d needs %zu bytes of shared memory per block; the device has %zu",
                 head_dim, smem, max_smem);
        return buf;
    }
    return NULL;
}

/*
 * mkbench.c - writes a random-weight model of a given shape, for
 * measuring speed where the values do not matter: decode speed per weight
 * type on one shape (`make bench-quant`, BENCHMARKS.md), and the GPU
 * check's models of real shapes (tools/gpu_check.sh).  The values are
 * uniform random numbers through ferry's reference quantizer: valid
 * blocks at realistic scales, no model's knowledge.
 *
 *   mkbench OUT.gguf TYPE [--shape llama3-8b|qwen2-7b|gemma3-4b] [--dim N] [--ffn N] [--layers N] [--heads N]
 *           [--kv-heads N] [--head-dim N] [--vocab N] [--window N] [--ctx N] [--pooled 0|1] [--full-vocab 0|1]
 *
 * TYPE is a weight dtype's name (q4_k, q8_0, ...) or q4_k_m, llama.cpp's
 * mix (Q4_K, with Q6_K for the output head and some layers' attn_v and
 * ffn_down).  Without --shape: a Llama of dim 1024, ffn 2816, 16 layers,
 * 16 heads, 4 KV heads (bench-quant's).  --shape llama3-8b is
 * Llama-3-8B's layer shape (dim 4096, 32 heads, 8 KV heads of 128, ffn
 * 14336, vocabulary 128256), 4 layers unless --layers says; qwen2-7b is
 * Qwen2-7B's (dim 3584, 28 heads, 4 KV heads of 128, ffn 18944,
 * 28 layers, vocabulary 152064, q/k/v biases); gemma3-4b is
 * Gemma-3-4B's (dim 2560, 8 heads, 4 KV heads of 256, ffn 10240,
 * vocabulary 262144, tied, window 1024 on five layers of six), 6 layers.
 * The options after --shape change it.  --full-vocab 1 lists every row of
 * the vocabulary in the tokenizer (unused tokens past the byte-level
 * 259), which llama.cpp needs to load the file.  A shape writes its matrices from
 * a pool of random blocks (--pooled 1: seconds for gigabytes); without
 * one every row is quantized from its own random values (--pooled 0).
 * Not here: tokenizers worth the name (the byte-level one of tinymodel.c,
 * 259 tokens whatever the vocabulary), real weights.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "tests/gguf_writer.h"
#include "tests/tinymodel.h"

static const struct {
    fy_dtype_t t;
    uint32_t ggml;
} g_map[] = {
    {FY_DTYPE_F32, GW_F32},       {FY_DTYPE_F16, GW_F16},   {FY_DTYPE_BF16, GW_BF16}, {FY_DTYPE_Q8_0, GW_Q8_0},
    {FY_DTYPE_Q4_0, GW_Q4_0},     {FY_DTYPE_Q4_1, GW_Q4_1}, {FY_DTYPE_Q5_0, GW_Q5_0}, {FY_DTYPE_Q5_1, GW_Q5_1},
    {FY_DTYPE_IQ4_NL, GW_IQ4_NL}, {FY_DTYPE_Q2_K, GW_Q2_K}, {FY_DTYPE_Q3_K, GW_Q3_K}, {FY_DTYPE_Q4_K, GW_Q4_K},
    {FY_DTYPE_Q5_K, GW_Q5_K},     {FY_DTYPE_Q6_K, GW_Q6_K},
};

static int usage(void)
{
    fprintf(stderr,
            "usage: mkbench OUT.gguf TYPE [--shape llama3-8b|qwen2-7b|gemma3-4b] [--dim N] [--ffn N] [--layers N] "
            "[--heads N]\n"
            "               [--kv-heads N] [--head-dim N] [--vocab N] [--window N] [--ctx N] [--pooled 0|1] "
            "[--full-vocab 0|1]\n"
            "  TYPE: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 iq4_nl q2_k q3_k q4_k q5_k q6_k, or q4_k_m (the mix)\n");
    return 2;
}

/* the real models' shapes, a few layers of each */
static bool set_shape(const char *name, fy_tiny_cfg_t *c, fy_tiny_random_t *r)
{
    if (!strcmp(name, "llama3-8b")) {
        fy_tiny_cfg_default(c);
        c->dim = 4096, c->ffn = 14336, c->n_layers = 4, c->n_heads = 32, c->n_kv_heads = 8, c->max_ctx = 8192;
        c->theta = 500000.0f;
        r->vocab = 128256;
    } else if (!strcmp(name, "qwen2-7b")) { /* q/k/v biases; head 128 = dim / heads */
        fy_tiny_cfg_arch(c, FY_ARCH_QWEN2);
        c->dim = 3584, c->ffn = 18944, c->n_layers = 28, c->n_heads = 28, c->n_kv_heads = 4, c->max_ctx = 32768;
        c->theta = 1000000.0f;
        r->vocab = 152064;
    } else if (!strcmp(name, "gemma3-4b")) {
        fy_tiny_cfg_arch(c, FY_ARCH_GEMMA3); /* tied, window with its period of 6, both rope bases */
        c->dim = 2560, c->ffn = 10240, c->n_layers = 6, c->n_heads = 8, c->n_kv_heads = 4, c->head_dim = 256;
        c->window = 1024, c->max_ctx = 32768;
        r->vocab = 262144;
    } else {
        return false;
    }
    r->pooled = true;
    return true;
}

int main(int argc, char **argv)
{
    if (argc < 3 || argc % 2 == 0) return usage();
    fy_tiny_cfg_t c;
    fy_tiny_cfg_default(&c);
    c.dim = 1024, c.ffn = 2816, c.n_layers = 16, c.n_heads = 16, c.n_kv_heads = 4, c.max_ctx = 4096;
    fy_tiny_random_t r;
    fy_tiny_random_default(&r, GW_F32);
    fy_dtype_t t = FY_DTYPE_Q4_K;
    if (!strcmp(argv[2], "q4_k_m")) {
        r.q4_k_m = true;
    } else {
        if (fy_dtype_from_name(argv[2], &t) != FY_OK) return usage();
        int ggml = -1;
        for (size_t i = 0; i < sizeof(g_map) / sizeof(g_map[0]); i++)
            if (g_map[i].t == t) ggml = (int)g_map[i].ggml;
        if (ggml < 0) return usage();
        r.type = (uint32_t)ggml;
    }
    for (int i = 3; i + 1 < argc; i += 2) { /* the shape first: the other options change it */
        if (strcmp(argv[i], "--shape")) continue;
        if (!set_shape(argv[i + 1], &c, &r)) {
            fprintf(stderr, "mkbench: unknown shape '%s' (llama3-8b, qwen2-7b, gemma3-4b)\n", argv[i + 1]);
            return 2;
        }
    }
    for (int i = 3; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--shape")) continue;
        int v = atoi(argv[i + 1]);
        if (v < (strcmp(argv[i], "--pooled") && strcmp(argv[i], "--full-vocab") ? 1 : 0)) return usage();
        if (!strcmp(argv[i], "--dim"))
            c.dim = v;
        else if (!strcmp(argv[i], "--ffn"))
            c.ffn = v;
        else if (!strcmp(argv[i], "--layers"))
            c.n_layers = v;
        else if (!strcmp(argv[i], "--heads"))
            c.n_heads = v;
        else if (!strcmp(argv[i], "--kv-heads"))
            c.n_kv_heads = v;
        else if (!strcmp(argv[i], "--head-dim"))
            c.head_dim = v;
        else if (!strcmp(argv[i], "--vocab"))
            r.vocab = v;
        else if (!strcmp(argv[i], "--window"))
            c.window = v;
        else if (!strcmp(argv[i], "--ctx"))
            c.max_ctx = v;
        else if (!strcmp(argv[i], "--pooled"))
            r.pooled = v != 0;
        else if (!strcmp(argv[i], "--full-vocab"))
            r.full_vocab = v != 0;
        else
            return usage();
    }
    /* the widest blocks of the types the file holds (q4_k_m: Q4_K and Q6_K, both 256) */
    int be = fy_dtype_info(t)->block_elems;
    int hd = c.head_dim ? c.head_dim : c.dim / c.n_heads;
    if (c.dim % be || c.ffn % be || (c.n_heads * hd) % be || (!c.head_dim && c.dim % c.n_heads) ||
        c.n_heads % c.n_kv_heads) {
        fprintf(stderr,
                "mkbench: dim %d, ffn %d and heads x head size %d must be multiples of %s's %d-element blocks, "
                "and the heads must divide dim (or --head-dim be given) and each other\n",
                c.dim, c.ffn, c.n_heads * hd, argv[2], be);
        return 2;
    }
    if (!fy_tiny_write_random_gguf_as(&c, argv[1], &r)) {
        fprintf(stderr, "mkbench: cannot write %s\n", argv[1]);
        return 1;
    }
    return 0;
}

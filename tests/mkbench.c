/*
 * mkbench.c - writes a random-weight Llama model of a given shape with
 * every matrix in one GGUF type, for measuring decode speed per weight
 * type on the same shape (`make bench-quant`, BENCHMARKS.md).  The values
 * are uniform random numbers through ferry's reference quantizer: valid
 * blocks at realistic scales, no model's knowledge.
 *
 *   mkbench OUT.gguf TYPE [--dim 1024] [--ffn 2816] [--layers 16] [--heads 16] [--kv-heads 4]
 *
 * TYPE is a weight dtype's name (q4_k, q8_0, ...).  Not here: tokenizers
 * worth the name (the byte-level one of tinymodel.c), real weights.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "gguf_writer.h"
#include "tinymodel.h"

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
    fprintf(stderr, "usage: mkbench OUT.gguf TYPE [--dim N] [--ffn N] [--layers N] [--heads N] [--kv-heads N]\n"
                    "  TYPE: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 iq4_nl q2_k q3_k q4_k q5_k q6_k\n");
    return 2;
}

int main(int argc, char **argv)
{
    if (argc < 3 || argc % 2 == 0) return usage();
    fy_dtype_t t;
    if (fy_dtype_from_name(argv[2], &t) != FY_OK) return usage();
    int ggml = -1;
    for (size_t i = 0; i < sizeof(g_map) / sizeof(g_map[0]); i++)
        if (g_map[i].t == t) ggml = (int)g_map[i].ggml;
    if (ggml < 0) return usage();
    fy_tiny_cfg_t c;
    fy_tiny_cfg_default(&c);
    c.dim = 1024, c.ffn = 2816, c.n_layers = 16, c.n_heads = 16, c.n_kv_heads = 4, c.max_ctx = 4096;
    for (int i = 3; i + 1 < argc; i += 2) {
        int v = atoi(argv[i + 1]);
        if (v < 1) return usage();
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
        else
            return usage();
    }
    int be = fy_dtype_info(t)->block_elems;
    if (c.dim % be || c.ffn % be || c.dim % c.n_heads || c.n_heads % c.n_kv_heads) {
        fprintf(stderr,
                "mkbench: dim %d and ffn %d must be multiples of %s's %d-element blocks, "
                "and the heads must divide dim and each other\n",
                c.dim, c.ffn, argv[2], be);
        return 2;
    }
    if (!fy_tiny_write_random_gguf(&c, argv[1], (uint32_t)ggml)) {
        fprintf(stderr, "mkbench: cannot write %s\n", argv[1]);
        return 1;
    }
    return 0;
}

/*
 * rope.h - the two conventions of rotary position embedding.  Shared by
 * the model (which knows which one its weights use) and the kernels.
 */
#ifndef FY_ROPE_H
#define FY_ROPE_H

typedef enum fy_rope_style {
    FY_ROPE_NORM = 0, /* rotate adjacent pairs (x[2i], x[2i+1]): GGUF llama, whose Q/K rows are permuted */
    FY_ROPE_NEOX,     /* rotate halves (x[i], x[i + d/2]): Hugging Face Llama */
} fy_rope_style_t;

#endif /* FY_ROPE_H */

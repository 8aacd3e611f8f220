/*
 * fuzz_reasoning.c - router/reasoning.c on any bytes: a thinking model's
 * answer (untrusted) split into reasoning and content.  The first byte
 * picks the parser (odd: deepseek_r1, even: qwen3); the rest is the
 * answer, also read as a rendered prompt (fy_reasoning_prompt_opens).
 *
 * Checks: the whole answer's reasoning and content lie within it, the
 * reasoning before the content and holding no </think>; fed in pieces
 * (cut at points drawn from the input, each piece a buffer of its own
 * length so that a read past it is caught), the reasoning never moves
 * its start, never shrinks, never passes what was fed, and ends as the
 * whole answer's; the content starts where the whole answer's does.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "router/reasoning.h"
#include "tests/fuzz/util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fz_quiet_log();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    fy_reasoning_parser_t p = data[0] & 1 ? FY_REASONING_DEEPSEEK_R1 : FY_REASONING_QWEN3;
    size_t len = size - 1;
    char *text = fy_malloc(len ? len : 1);
    if (!text) return 0;
    memcpy(text, data + 1, len);
    (void)fy_reasoning_prompt_opens(text, len);
    (void)fy_reasoning_template_thinks(NULL);

    fy_reasoning_t w;
    fy_reasoning_init(&w, p);
    fy_reasoning_feed(&w, text, len, true);
    size_t from, to, cf = len;
    fy_reasoning_span(&w, &from, &to);
    bool has_content = fy_reasoning_content_from(&w, &cf);
    FZ_CHECK(from <= to && to <= len, "reasoning [%zu, %zu) of %zu bytes", from, to, len);
    FZ_CHECK(has_content || fy_reasoning_thought(&w), "the whole answer is neither content nor reasoning");
    FZ_CHECK(!has_content || (cf <= len && cf >= to), "content from %zu, reasoning to %zu, of %zu", cf, to, len);
    FZ_CHECK(!memmem(text + from, to - from, "</think>", 8), "the reasoning holds </think>");
    if (p == FY_REASONING_DEEPSEEK_R1) FZ_CHECK(fy_reasoning_thought(&w), "deepseek_r1 did not think");

    fy_reasoning_t s;
    fy_reasoning_init(&s, p);
    uint32_t h = 2166136261u; /* cut points drawn from the input (FNV-1a) */
    for (size_t i = 0; i < len; i++) h = (h ^ (uint8_t)text[i]) * 16777619u;
    size_t at = 0, r_from = SIZE_MAX, r_to = 0, c_from = SIZE_MAX;
    for (bool done = false;;) { /* pieces, then all of it, then all of it done */
        char *piece = fy_malloc(at ? at : 1);
        if (!piece) break;
        memcpy(piece, text, at);
        fy_reasoning_feed(&s, piece, at, done);
        fy_free(piece);
        size_t f, t, c;
        fy_reasoning_span(&s, &f, &t);
        FZ_CHECK(f <= t && t <= at, "streamed reasoning [%zu, %zu) with %zu bytes fed", f, t, at);
        if (t > f) {
            FZ_CHECK(r_from == SIZE_MAX || r_from == f, "the reasoning's start moved from %zu to %zu", r_from, f);
            FZ_CHECK(t >= r_to, "the reasoning shrank from %zu to %zu bytes", r_to, t);
            r_from = f;
            r_to = t;
        }
        if (fy_reasoning_content_from(&s, &c)) {
            FZ_CHECK(c_from == SIZE_MAX || c_from == c, "the content's start moved from %zu to %zu", c_from, c);
            c_from = c;
        }
        if (done) break;
        if (at == len) {
            done = true;
        } else {
            h = h * 1103515245u + 12345u;
            at += 1 + (h >> 16) % 6;
            if (at > len) at = len;
        }
    }
    size_t f, t, c = len;
    fy_reasoning_span(&s, &f, &t);
    FZ_CHECK(f == from && t == to, "streamed reasoning [%zu, %zu); whole [%zu, %zu)", f, t, from, to);
    FZ_CHECK(fy_reasoning_content_from(&s, &c) == has_content && (!has_content || c == cf),
             "streamed content from %zu; whole from %zu", c, cf);
    fy_free(text);
    return 0;
}

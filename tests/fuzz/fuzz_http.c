/*
 * fuzz_http.c - HTTP request bodies of POST /v1/completions,
 * /v1/chat/completions, /tokenize and /detokenize through the router's
 * own parsing (router/http_parse.c: jansson with the router's flags,
 * every field checked with the wire's ranges, the prompt tokenized or
 * rendered with the default model's tokenizer and chat template).  The
 * first byte of an input picks the endpoint (modulo 4: 0 completions,
 * 1 chat, 2 tokenize, 3 detokenize; with bit 6 set, POST /v1/responses
 * through router/responses.c); the rest is the body.
 *
 * Checks: a refused body has a status (400 or 404), a message, and no
 * prompt; an accepted one has a prompt of 1 or more ids inside the
 * vocabulary, sampling parameters that pass the sampler's check,
 * max_tokens in [1, the context], n in [1, 16], a completion's prompt
 * array's prompts (1 to 32, each 1 or more ids, 64 choices at most)
 * filling the ids exactly, at most 8 stop strings
 * of 1 to 64 bytes, and parameters that the workers' decoder takes back
 * exactly as written (what HTTP accepts, the wire accepts).  Tokenize
 * and detokenize: a refusal as above; accepted ids inside the vocabulary,
 * which decode.  Responses: a refusal as above, an acceptance as a chat
 * completion's, and its answer built from the body's own bytes as the
 * model's text (whole, and streamed in two pieces with a tool call):
 * JSON objects, events that end with the response's end.  Needs the
 * default model; skipped without it.
 */
#include <jansson.h>
#include <math.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/genspec.h"
#include "router/http_parse.h"
#include "router/responses.h"
#include "common/msg.h"
#include "common/mem.h"
#include "model/model.h"
#include "model/prompt.h"
#include "model/tokenizer.h"
#include "tests/fuzz/util.h"

static fy_http_front_t g_front;
static char g_model_id[64];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    const char *path = fz_default_model();
    fz_quiet_log();
    if (sodium_init() < 0) abort();
    fy_model_t *m = NULL;
    if (fy_model_load(path, &m) != FY_OK) {
        fprintf(stderr, "fuzz_http: cannot load %s\n", path);
        exit(1);
    }
    fy_model_id(m, g_model_id, sizeof(g_model_id));
    g_front = (fy_http_front_t){.model = m,
                                .model_id = g_model_id,
                                .served = "SmolLM2-135M-Instruct.Q4_1",
                                .max_ctx = fy_model_config(m)->max_ctx,
                                .default_max_tokens = 1024};
    return 0;
}

/* POST /tokenize (detok: /detokenize). */
static int tokenize(const fy_http_front_t *f, bool detok, const char *body, size_t len)
{
    fy_http_tok_t t;
    fy_http_fault_t fault;
    fy_status_t st =
        detok ? fy_http_parse_detokenize(f, body, len, &t, &fault) : fy_http_parse_tokenize(f, body, len, &t, &fault);
    if (st == FY_ERR_INVALID) {
        FZ_CHECK(fault.status == 400 || fault.status == 404, "status %u", fault.status);
        FZ_CHECK(fault.type && fault.msg[0], "a refusal without a type or a message");
        FZ_CHECK(!fault.code || (fault.status == 400 && fault.param) ||
                     (fault.status == 404 && !strcmp(fault.code, "model_not_found") && fault.param &&
                      !strcmp(fault.param, "model")),
                 "a coded refusal without its field (%u, %s)", fault.status, fault.code);
        return 0;
    }
    FZ_CHECK(st == FY_OK, "parse: %s", fy_status_str(st));
    FZ_CHECK(t.ids != NULL && t.n >= 0, "accepted without ids");
    const fy_tokenizer_t *tok = fy_model_tokenizer(f->model);
    int32_t vocab = fy_tokenizer_vocab_size(tok);
    for (int32_t i = 0; i < t.n; i++) FZ_CHECK(t.ids[i] >= 0 && t.ids[i] < vocab, "token id %d", t.ids[i]);
    char small[64];
    size_t need = fy_tokenizer_decode(tok, t.ids, (size_t)t.n, true, small, sizeof(small));
    FZ_CHECK(strlen(small) <= need, "decode wrote %zu bytes of %zu", strlen(small), need);
    fy_free(t.ids);
    return 0;
}

static bool out_add(void *arg, const char *s, size_t n)
{
    size_t *total = arg;
    (void)s;
    *total += n;
    return true;
}

/* An accepted Responses request's answer, the text being text (any bytes). */
static void responses_answer(fy_responses_t *rs, const char *text, size_t len)
{
    json_t *usage = json_pack("{s:i, s:i, s:{s:i}}", "prompt_tokens", 3, "completion_tokens", 2,
                              "prompt_tokens_details", "cached_tokens", 0);
    json_t *calls = json_pack("[{s:s, s:s, s:{s:s, s:s}}]", "id", "call_1", "type", "function", "function", "name", "f",
                              "arguments", "{}");
    json_t *o = fy_responses_whole(rs, text, len, len & 1 ? calls : NULL, len & 2 ? "length" : "stop", usage);
    FZ_CHECK(json_is_object(o) && json_is_array(json_object_get(o, "output")), "no whole response");
    json_decref(o);
    size_t total = 0, half = len / 2;
    fy_responses_stream_text(rs, text, half, out_add, &total);
    fy_responses_stream_text(rs, text + half, len - half, out_add, &total);
    json_t *deltas =
        json_pack("[{s:i, s:s, s:s, s:{s:s, s:s}}, {s:i, s:{s:s%}}]", "index", 0, "id", "call_1", "type", "function",
                  "function", "name", "f", "arguments", "", "index", 0, "function", "arguments", text, half);
    if (deltas && len & 4) fy_responses_stream_calls(rs, deltas, out_add, &total);
    size_t before = total;
    fy_responses_stream_end(rs, len & 2 ? "length" : "stop", usage, len & 8 ? "failed" : NULL, out_add, &total);
    FZ_CHECK(total > before, "no end event");
    json_decref(deltas);
    json_decref(calls);
    json_decref(usage);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    bool chat = data[0] & 1;
    /* bit 7: a context of 8 tokens and its bound in bytes, so that the
     * refusal by bytes before tokenizing (context_length_exceeded) is
     * reached by inputs this short */
    fy_http_front_t small = g_front;
    small.max_ctx = 8;
    small.max_prompt_bytes = 8 * fy_tokenizer_max_token_text(fy_model_tokenizer(g_front.model));
    const fy_http_front_t *f = data[0] & 0x80 ? &small : &g_front;
    if (data[0] % 4 >= 2) return tokenize(f, data[0] % 4 == 3, (const char *)data + 1, size - 1);
    fy_http_gen_t g;
    fy_http_fault_t fault;
    fy_responses_t *rs = NULL;
    fy_status_t st = data[0] & 0x40 ? fy_responses_parse(f, (const char *)data + 1, size - 1, &g, &rs, &fault)
                                    : fy_http_parse_generation(f, (const char *)data + 1, size - 1, chat, &g, &fault);
    if (st == FY_ERR_INVALID) {
        FZ_CHECK(fault.status == 400 || fault.status == 404, "status %u", fault.status);
        FZ_CHECK(fault.type && fault.msg[0], "a refusal without a type or a message");
        FZ_CHECK(!fault.code || (fault.status == 400 && fault.param) ||
                     (fault.status == 404 && !strcmp(fault.code, "model_not_found") && fault.param &&
                      !strcmp(fault.param, "model")),
                 "a coded refusal without its field (%u, %s)", fault.status, fault.code);
        FZ_CHECK(!rs, "a refused Responses body left its state");
        return 0;
    }
    FZ_CHECK(st == FY_OK, "parse: %s", fy_status_str(st));
    FZ_CHECK(!(data[0] & 0x40) || (rs && g.n == 1), "an accepted Responses body without its state, or n %d", g.n);
    if (rs) responses_answer(rs, (const char *)data + 1, size - 1);
    fy_responses_free(rs);
    FZ_CHECK(g.ids != NULL && g.n_prompt >= 1, "an accepted request without a prompt");
    int32_t vocab = fy_tokenizer_vocab_size(fy_model_tokenizer(f->model));
    for (int32_t i = 0; i < g.n_prompt; i++) FZ_CHECK(g.ids[i] >= 0 && g.ids[i] < vocab, "prompt id %d", g.ids[i]);
    FZ_CHECK(fy_sampling_params_check(&g.gen.sampling) == FY_OK, "accepted sampling parameters fail the sampler");
    FZ_CHECK(g.gen.max_tokens >= 1 && g.gen.max_tokens <= f->max_ctx, "max_tokens %d", g.gen.max_tokens);
    FZ_CHECK((int64_t)g.n_prompt + g.gen.max_tokens <= f->max_ctx,
             "%d prompt tokens and max_tokens %d past the context", g.n_prompt,
             g.gen.max_tokens); /* OpenAI's rule: refused, or the default clamped to the room */
    FZ_CHECK(g.n >= 1 && g.n <= FY_HTTP_MAX_N, "n %d", g.n);
    /* a prompt array: its prompts fill ids exactly, none empty, within the bounds */
    FZ_CHECK(g.n_prompts >= 1 && g.n_prompts <= FY_HTTP_MAX_PROMPTS, "%d prompts", g.n_prompts);
    FZ_CHECK(g.n_prompts * g.n <= FY_HTTP_MAX_CHOICES, "%d prompts times n %d", g.n_prompts, g.n);
    FZ_CHECK(chat ? g.n_prompts == 1 : true, "a chat with %d prompts", g.n_prompts);
    int64_t sum = 0;
    for (int i = 0; i < g.n_prompts; i++) {
        FZ_CHECK(g.prompt_len[i] >= 1, "prompt %d of %d tokens", i, g.prompt_len[i]);
        FZ_CHECK(!g.truncate || g.prompt_len[i] <= g.truncate, "prompt %d of %d tokens kept %d", i, g.prompt_len[i],
                 g.truncate);
        sum += g.prompt_len[i];
    }
    FZ_CHECK(sum == g.n_prompt, "prompts of %lld tokens in all, ids %d", (long long)sum, g.n_prompt);
    FZ_CHECK(g.gen.n_stop >= 0 && g.gen.n_stop <= FY_GEN_MAX_STOP, "%d stop strings", g.gen.n_stop);
    for (int32_t i = 0; i < g.gen.n_stop; i++) {
        size_t l = strlen(g.gen.stop[i]);
        FZ_CHECK(l <= FY_GEN_STOP_LEN, "stop string of %zu bytes", l);
    }
    /* what the router forwards, a worker reads back the same */
    fy_msgw_t w;
    fy_msgw_init(&w, "generate");
    fy_genspec_write(&w, &g.gen);
    void *buf;
    size_t len;
    FZ_CHECK(fy_msgw_finish(&w, &buf, &len) == FY_OK, "cannot write the parameters");
    fy_msgr_t r;
    FZ_CHECK(fy_msgr_parse(&r, buf, len) == FY_OK, "written parameters do not parse: %s", r.err);
    fy_genspec_t back;
    fy_genspec_default(&back);
    fy_genspec_read(&r, &back, f->max_ctx);
    FZ_CHECK(fy_msgr_ok(&r), "parameters HTTP accepted are refused on the wire: %s", r.err);
    FZ_CHECK(back.max_tokens == g.gen.max_tokens && back.sampling.top_k == g.gen.sampling.top_k &&
                 back.sampling.top_p == g.gen.sampling.top_p && back.sampling.temperature == g.gen.sampling.temperature,
             "parameters changed on the wire");
    fy_msgr_free(&r);
    fy_free(buf);
    fy_free(g.ids);
    fy_free(g.tool_names);
    return 0;
}

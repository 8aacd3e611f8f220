/*
 * http_parse.c - the bodies of POST /v1/completions and
 * /v1/chat/completions, from bytes to a generation the router can run:
 * JSON (jansson), every field checked with the wire's ranges
 * (common/genspec.h), the prompt tokenized or rendered through the
 * model's chat template (model/prompt.h); and the bodies of POST
 * /tokenize and /detokenize (vLLM's shapes).  router/http.c answers with
 * what this returns; tests/fuzz/fuzz_http.c feeds it arbitrary bytes.
 *
 * Not here: the HTTP exchange, API keys, the router.
 */
#include "router/http_parse.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include <sodium.h>

#include "grammar/grammar.h"
#include "common/mem.h"
#include "model/prompt.h"
#include "model/tokenizer.h"
#include "router/tools.h"

#define MAX_N FY_HTTP_MAX_N
#define DEFAULT_MAX_TOKENS_COMPLETION 16 /* OpenAI's default for /v1/completions */

typedef fy_http_fault_t parsed_t;

static void bad(parsed_t *p, uint16_t status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void bad(parsed_t *p, uint16_t status, const char *param, const char *fmt, ...)
{
    if (p->status) return; /* the first fault is the one named */
    p->status = status;
    p->param = param;
    p->type = status == 400 ? "invalid_request_error" : status == 404 ? "not_found_error" : "error";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->msg, sizeof(p->msg), fmt, ap);
    va_end(ap);
}

/* A number field within [lo, hi]; absent or null keeps *out. */
static void num_field(parsed_t *p, json_t *o, const char *name, double lo, double hi, double *out)
{
    json_t *v = json_object_get(o, name);
    if (!v || json_is_null(v)) return;
    if (!json_is_number(v)) {
        bad(p, 400, name, "'%s' must be a number", name);
        return;
    }
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi)) {
        bad(p, 400, name, "'%s' is %g; it must be between %g and %g", name, d, lo, hi);
        return;
    }
    *out = d;
}

static void int_field(parsed_t *p, json_t *o, const char *name, json_int_t lo, json_int_t hi, json_int_t *out)
{
    json_t *v = json_object_get(o, name);
    if (!v || json_is_null(v)) return;
    if (!json_is_integer(v)) {
        bad(p, 400, name, "'%s' must be an integer", name);
        return;
    }
    json_int_t i = json_integer_value(v);
    if (i < lo || i > hi) {
        bad(p, 400, name, "'%s' is %lld; it must be between %lld and %lld", name, (long long)i, (long long)lo,
            (long long)hi);
        return;
    }
    *out = i;
}

static void bool_field(parsed_t *p, json_t *o, const char *name, bool *out)
{
    json_t *v = json_object_get(o, name);
    if (!v || json_is_null(v)) return;
    if (!json_is_boolean(v)) {
        bad(p, 400, name, "'%s' must be true or false", name);
        return;
    }
    *out = json_is_true(v);
}

typedef fy_http_gen_t gen_req_t;

/* An array of lo to hi token ids below vocab into out[*n_p] (absent or null: untouched). */
static void token_ids_field(parsed_t *p, json_t *o, const char *name, size_t lo, size_t hi, int32_t vocab, int32_t *out,
                            int32_t *n_p)
{
    json_t *a = json_object_get(o, name);
    if (!a || json_is_null(a) || p->status) return;
    if (!json_is_array(a) || json_array_size(a) < lo || json_array_size(a) > hi) {
        bad(p, 400, name, "'%s' must be an array of %zu to %zu token ids", name, lo, hi);
        return;
    }
    size_t i;
    json_t *v;
    json_array_foreach(a, i, v)
    {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= vocab) {
            bad(p, 400, name, "'%s' entry %zu is not a token id (0 to %d)", name, i, vocab - 1);
            return;
        }
        out[(*n_p)++] = (int32_t)json_integer_value(v);
    }
}

/* The logits processing fields (vLLM's and OpenAI's names): penalties,
 * logit_bias ({"token id": bias}), stop_token_ids. */
static void logits_fields(const fy_http_front_t *H, parsed_t *p, json_t *o, fy_genspec_t *g)
{
    int32_t vocab = fy_model_config(H->model)->vocab_size;
    double d = 0;
    num_field(p, o, "presence_penalty", -FY_GEN_PENALTY_MAX, FY_GEN_PENALTY_MAX, &d);
    g->presence_penalty = (float)d;
    d = 0;
    num_field(p, o, "frequency_penalty", -FY_GEN_PENALTY_MAX, FY_GEN_PENALTY_MAX, &d);
    g->frequency_penalty = (float)d;
    d = 1;
    num_field(p, o, "repetition_penalty", 0, FY_GEN_REP_PENALTY_MAX, &d);
    if (!p->status && !(d > 0)) bad(p, 400, "repetition_penalty", "'repetition_penalty' must be above 0 (1: off)");
    g->repetition_penalty = (float)d;
    json_t *lb = json_object_get(o, "logit_bias");
    if (lb && !json_is_null(lb)) {
        const char *key;
        json_t *v;
        if (!json_is_object(lb))
            bad(p, 400, "logit_bias", "'logit_bias' must be an object of token ids to biases");
        else if (json_object_size(lb) > FY_GEN_MAX_LOGIT_BIAS)
            bad(p, 400, "logit_bias", "'logit_bias' has %zu entries; at most %d", json_object_size(lb),
                FY_GEN_MAX_LOGIT_BIAS);
        json_object_foreach(lb, key, v)
        {
            if (p->status) break;
            char *end;
            errno = 0;
            long id = strtol(key, &end, 10);
            if (!*key || *end || errno || id < 0 || id >= vocab) {
                bad(p, 400, "logit_bias", "'logit_bias' key '%.40s' is not a token id (0 to %d)", key, vocab - 1);
            } else if (!json_is_number(v) || !(json_number_value(v) >= -FY_GEN_LOGIT_BIAS_MAX &&
                                               json_number_value(v) <= FY_GEN_LOGIT_BIAS_MAX)) {
                bad(p, 400, "logit_bias", "'logit_bias' of token %ld must be a number from -100 to 100", id);
            } else {
                g->logit_bias_id[g->n_logit_bias] = (int32_t)id;
                g->logit_bias[g->n_logit_bias++] = (float)json_number_value(v);
            }
        }
    }
    token_ids_field(p, o, "stop_token_ids", 0, FY_GEN_MAX_STOP_IDS, vocab, g->stop_ids, &g->n_stop_ids);
    /* allowed_token_ids (vLLM's): the only tokens the answer may hold */
    token_ids_field(p, o, "allowed_token_ids", 1, FY_GEN_MAX_ALLOWED_IDS, vocab, g->allowed_ids, &g->n_allowed);
}

/* "model": absent, null, the served name or the model's id; else 404,
 * code "model_not_found". */
static void model_field(const fy_http_front_t *H, parsed_t *p, json_t *o)
{
    json_t *m = json_object_get(o, "model");
    if (m && !json_is_null(m)) {
        if (!json_is_string(m))
            bad(p, 400, "model", "'model' must be a string");
        else if (strcmp(json_string_value(m), H->served) && strcmp(json_string_value(m), H->model_id) && !p->status) {
            bad(p, 404, "model", "the model '%s' does not exist; this server serves '%s'", json_string_value(m),
                H->served);
            p->code = "model_not_found"; /* OpenAI's, as GET /v1/models/{id} answers */
        }
    }
}

/* A structured output's source into g (FY_GEN_MAX_GRAMMAR bytes at most). */
static void set_grammar(parsed_t *p, fy_genspec_t *g, const char **first, const char *param, fy_gen_grammar_t kind,
                        const char *src, size_t len)
{
    if (p->status) return;
    if (g->grammar_kind != FY_GEN_GRAMMAR_NONE) {
        bad(p, 400, param, "'%s' asks for a structured output and so does '%s': give one", param, *first);
        return;
    }
    if (len > FY_GEN_MAX_GRAMMAR) {
        bad(p, 400, param, "'%s' is %zu bytes as compact JSON; at most %d", param, len, FY_GEN_MAX_GRAMMAR);
        return;
    }
    if (memchr(src, 0, len)) {
        bad(p, 400, param, "'%s' holds a NUL byte", param);
        return;
    }
    g->grammar_kind = kind;
    g->grammar_len = (int32_t)len;
    memcpy(g->grammar, src, len);
    g->grammar[len] = 0;
    *first = param;
}

/* A JSON Schema (an object, or its JSON text: vLLM takes both) as compact
 * JSON with its members in the order given (property order is the order
 * the output writes them). */
static void set_schema(parsed_t *p, fy_genspec_t *g, const char **first, const char *param, json_t *schema)
{
    json_t *own = NULL;
    if (json_is_string(schema)) schema = own = json_loads(json_string_value(schema), 0, NULL);
    if (!json_is_object(schema)) {
        bad(p, 400, param, "'%s' must be a JSON Schema (an object, or its JSON text)", param);
        json_decref(own);
        return;
    }
    char *s = json_dumps(schema, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (s)
        set_grammar(p, g, first, param, FY_GEN_GRAMMAR_JSON_SCHEMA, s, strlen(s));
    else
        bad(p, 400, param, "'%s' cannot be written back as JSON", param);
    free(s);
    json_decref(own);
}

static void set_regex(parsed_t *p, fy_genspec_t *g, const char **first, const char *param, json_t *v)
{
    if (!json_is_string(v) || !json_string_length(v))
        bad(p, 400, param, "'%s' must be a non-empty regular expression", param);
    else
        set_grammar(p, g, first, param, FY_GEN_GRAMMAR_REGEX, json_string_value(v), json_string_length(v));
}

static void set_choice(parsed_t *p, fy_genspec_t *g, const char **first, const char *param, json_t *v)
{
    size_t i;
    json_t *c;
    bool ok = json_is_array(v) && json_array_size(v) > 0;
    json_array_foreach(v, i, c) ok = ok && json_is_string(c);
    if (!ok) {
        bad(p, 400, param, "'%s' must be a non-empty array of strings", param);
        return;
    }
    char *s = json_dumps(v, JSON_COMPACT);
    if (s) set_grammar(p, g, first, param, FY_GEN_GRAMMAR_CHOICE, s, strlen(s));
    free(s);
}

/* Structured outputs: OpenAI's response_format, vLLM's guided_json,
 * guided_regex and guided_choice and its newer structured_outputs; one
 * of them at most. */
static void structured_fields(parsed_t *p, json_t *o, fy_genspec_t *g)
{
    const char *firstv = NULL, **first = &firstv;
    json_t *rf = json_object_get(o, "response_format");
    if (rf && !json_is_null(rf)) {
        json_t *t = json_object_get(rf, "type");
        const char *type = json_string_value(t);
        if (!json_is_object(rf) || !type) {
            bad(p, 400, "response_format", "'response_format' must be an object with a 'type'");
        } else if (!strcmp(type, "text")) {
        } else if (!strcmp(type, "json_object")) {
            set_grammar(p, g, first, "response_format", FY_GEN_GRAMMAR_JSON_OBJECT, "", 0);
        } else if (!strcmp(type, "json_schema")) {
            json_t *js = json_object_get(rf, "json_schema"), *name = json_object_get(js, "name");
            json_t *strict = json_object_get(js, "strict");
            if (!json_is_object(js))
                bad(p, 400, "response_format", "'response_format' of type json_schema needs a 'json_schema' object");
            else if (name && !json_is_null(name) && !json_is_string(name))
                bad(p, 400, "response_format", "'response_format.json_schema.name' must be a string");
            else if (strict && !json_is_null(strict) && !json_is_boolean(strict))
                bad(p, 400, "response_format", "'response_format.json_schema.strict' must be true or false");
            else if (!json_is_object(json_object_get(js, "schema")))
                bad(p, 400, "response_format", "'response_format.json_schema.schema' must be a JSON Schema object");
            else
                set_schema(p, g, first, "response_format", json_object_get(js, "schema"));
        } else {
            bad(p, 400, "response_format", "'response_format' type '%.40s' is not text, json_object or json_schema",
                type);
        }
    }
    json_t *v;
    if ((v = json_object_get(o, "guided_json")) && !json_is_null(v)) set_schema(p, g, first, "guided_json", v);
    if ((v = json_object_get(o, "guided_regex")) && !json_is_null(v)) set_regex(p, g, first, "guided_regex", v);
    if ((v = json_object_get(o, "guided_choice")) && !json_is_null(v)) set_choice(p, g, first, "guided_choice", v);
    json_t *so = json_object_get(o, "structured_outputs");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) {
            bad(p, 400, "structured_outputs", "'structured_outputs' must be an object");
            return;
        }
        const char *k;
        json_object_foreach(so, k, v)
        {
            if (json_is_null(v) || json_is_false(v)) continue;
            if (!strcmp(k, "json"))
                set_schema(p, g, first, "structured_outputs", v);
            else if (!strcmp(k, "regex"))
                set_regex(p, g, first, "structured_outputs", v);
            else if (!strcmp(k, "choice"))
                set_choice(p, g, first, "structured_outputs", v);
            else if (!strcmp(k, "json_object") && json_is_true(v))
                set_grammar(p, g, first, "structured_outputs", FY_GEN_GRAMMAR_JSON_OBJECT, "", 0);
            else if (strcmp(k, "disable_any_whitespace") && strcmp(k, "disable_fallback") &&
                     strcmp(k, "disable_additional_properties") && strcmp(k, "whitespace_pattern"))
                bad(p, 400, "structured_outputs",
                    "'structured_outputs.%.40s' is not supported (json, regex, choice, "
                    "json_object are)",
                    k);
        }
    }
}

/* bad_words (vLLM's): a list of strings, each banned as its tokens with
 * and without a leading space (the second only where it differs), as
 * vLLM's tokenization does. */
static void bad_words_field(const fy_http_front_t *H, parsed_t *p, json_t *o, fy_genspec_t *g)
{
    json_t *bw = json_object_get(o, "bad_words");
    if (!bw || json_is_null(bw) || p->status) return;
    if (!json_is_array(bw) || json_array_size(bw) > FY_GEN_MAX_BAD_SEQS / 2) {
        bad(p, 400, "bad_words", "'bad_words' must be an array of at most %d strings", FY_GEN_MAX_BAD_SEQS / 2);
        return;
    }
    const fy_tokenizer_t *tok = fy_model_tokenizer(H->model);
    int32_t used = 0;
    size_t i;
    json_t *w;
    json_array_foreach(bw, i, w)
    {
        if (!json_is_string(w) || json_string_length(w) < 1 || json_string_length(w) > 256) {
            bad(p, 400, "bad_words", "each of 'bad_words' must be a string of 1 to 256 bytes");
            return;
        }
        const char *s = json_string_value(w);
        while (*s == ' ') s++; /* vLLM strips the word's leading space */
        char buf[258];
        for (int sp = 0; sp < 2; sp++) {
            int n = snprintf(buf, sizeof(buf), "%s%s", sp ? " " : "", s);
            int32_t ids[FY_GEN_BAD_SEQ_MAX + 1];
            size_t nt = 0;
            fy_status_t st =
                n > 0 ? fy_tokenizer_encode(tok, buf, (size_t)n, false, false, ids, FY_GEN_BAD_SEQ_MAX + 1, &nt)
                      : FY_ERR_INVALID;
            if (st == FY_ERR_NOMEM) {
                bad(p, 500, NULL, "out of memory tokenizing 'bad_words'");
                return;
            }
            if (st || nt < 1 || nt > FY_GEN_BAD_SEQ_MAX || used + (int32_t)nt > FY_GEN_MAX_BAD_TOKENS) {
                bad(p, 400, "bad_words", "'bad_words' entry %zu is more than %d tokens, or the words more than %d", i,
                    FY_GEN_BAD_SEQ_MAX, FY_GEN_MAX_BAD_TOKENS);
                return;
            }
            /* the spaced form only when it is another sequence */
            if (sp && g->bad_lens[g->n_bad - 1] == (int32_t)nt &&
                !memcmp(g->bad_ids + used - nt, ids, nt * sizeof(int32_t)))
                continue;
            memcpy(g->bad_ids + used, ids, nt * sizeof(int32_t));
            g->bad_lens[g->n_bad++] = (int32_t)nt;
            used += (int32_t)nt;
        }
    }
}

static void parse_common(const fy_http_front_t *H, parsed_t *p, json_t *o, bool chat, gen_req_t *g)
{
    fy_genspec_default(&g->gen);
    g->gen.sampling.temperature = 1.0f; /* OpenAI's defaults */
    g->gen.sampling.top_k = 0;
    g->gen.sampling.top_p = 1.0f;
    g->gen.sampling.min_p = 0;
    model_field(H, p, o);
    /* echo (completions only: chat's is another thing, refused below) */
    if (!chat) bool_field(p, o, "echo", &g->echo);
    /* max_tokens, or its newer name max_completion_tokens, on both
     * endpoints; 0 with echo: the prompt alone (vLLM's); past the context:
     * refused once the prompt is tokenized, in OpenAI's words with both
     * counts (fy_http_parse_generation) */
    json_int_t mt = chat ? H->default_max_tokens : DEFAULT_MAX_TOKENS_COMPLETION, old = -1, mct = -1;
    int_field(p, o, "max_tokens", g->echo ? 0 : 1, INT32_MAX, &old);
    int_field(p, o, "max_completion_tokens", g->echo ? 0 : 1, INT32_MAX, &mct);
    if (old == 0 || mct == 0) {
        if (old > 0 || mct > 0)
            bad(p, 400, "max_completion_tokens",
                "'max_completion_tokens' and 'max_tokens' are the same limit, give one of them");
        g->echo_only = true;
        old = mct = 1; /* the prompt runs, one token is made and left out */
    }
    if (old < 0) old = 0;
    if (mct < 0) mct = 0;
    if (old && mct && old != mct)
        bad(p, 400, "max_completion_tokens",
            "'max_completion_tokens' is %lld and 'max_tokens' %lld: they are the same limit, give one of them",
            (long long)mct, (long long)old);
    if (mct || old) {
        g->max_tokens_set = true;
        mt = mct ? mct : old;
    } else if (mt > H->max_ctx) { /* the default: at most the context (and the room it leaves, once tokenized) */
        mt = H->max_ctx;
    }
    g->gen.max_tokens = (int32_t)mt;
    /* min_tokens: EOS, stop token ids and stop strings held back until then */
    json_int_t mn = 0;
    int_field(p, o, "min_tokens", 0, mt, &mn);
    g->gen.min_tokens = (int32_t)mn;
    logits_fields(H, p, o, &g->gen);
    double d = g->gen.sampling.temperature;
    num_field(p, o, "temperature", 0, FY_GEN_TEMPERATURE_MAX, &d);
    g->gen.sampling.temperature = (float)d;
    d = g->gen.sampling.top_p;
    num_field(p, o, "top_p", FY_GEN_TOP_P_MIN, 1, &d);
    g->gen.sampling.top_p = (float)d;
    d = 0;
    num_field(p, o, "min_p", 0, 1, &d);
    g->gen.sampling.min_p = (float)d;
    json_int_t k = 0;
    int_field(p, o, "top_k", -1, FY_GEN_TOP_K_MAX, &k);
    g->gen.sampling.top_k = k < 0 ? 0 : (int32_t)k; /* -1 is vLLM's "off" */
    json_t *seed = json_object_get(o, "seed");
    if (seed && !json_is_null(seed)) {
        if (!json_is_integer(seed) || json_integer_value(seed) < 0)
            bad(p, 400, "seed", "'seed' must be a non-negative integer");
        else
            g->gen.sampling.seed = (uint64_t)json_integer_value(seed);
    } else {
        randombytes_buf(&g->gen.sampling.seed, sizeof(g->gen.sampling.seed));
    }
    json_int_t n = 1;
    int_field(p, o, "n", 1, MAX_N, &n);
    g->n = (int)n;
    g->stream = false;
    bool_field(p, o, "stream", &g->stream);
    json_t *so = json_object_get(o, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so))
            bad(p, 400, "stream_options", "'stream_options' must be an object");
        else if (!g->stream) /* OpenAI's and vLLM's 400: it says how to stream, and nothing streams */
            bad(p, 400, "stream_options", "'stream_options' is allowed only with 'stream': true");
        else
            bool_field(p, so, "include_usage", &g->include_usage);
    }
    bool_field(p, o, "ignore_eos", &g->gen.ignore_eos);
    bool_field(p, o, "include_stop_str_in_output", &g->gen.include_stop); /* vLLM's */
    bool skip_special = true;                                             /* vLLM's, and its default */
    bool_field(p, o, "skip_special_tokens", &skip_special);
    g->gen.render_special = !skip_special;
    /* truncate_prompt_tokens (vLLM's): keep the prompt's last N tokens; -1:
     * as many as the context holds with room for one more */
    json_int_t trunc = 0;
    int_field(p, o, "truncate_prompt_tokens", -1, H->max_ctx - 1, &trunc);
    if (!p->status && json_is_integer(json_object_get(o, "truncate_prompt_tokens")) && trunc == 0)
        bad(p, 400, "truncate_prompt_tokens", "'truncate_prompt_tokens' keeps at least 1 token (-1: the context's)");
    g->truncate = trunc < 0 ? H->max_ctx - 1 : (int32_t)trunc;
    json_t *sp = json_object_get(o, "speculative"); /* ferry's: none, ngram, draft, default */
    if (sp && !json_is_null(sp)) {
        if (!json_is_string(sp) || fy_spec_method_parse(json_string_value(sp), true, &g->gen.spec) != FY_OK)
            bad(p, 400, "speculative", "'speculative' is one of default, none, ngram, draft");
    }
    json_int_t prio = 0;
    int_field(p, o, "priority", -FY_GEN_PRIORITY_MAX, FY_GEN_PRIORITY_MAX, &prio);
    g->gen.priority = (int32_t)prio;
    json_int_t budget = 0;
    int_field(p, o, "kv_budget", 0, FY_GEN_KV_BUDGET_MAX, &budget);
    g->gen.kv_budget = (int32_t)budget;
    /* stop: a string or an array of them */
    json_t *st = json_object_get(o, "stop");
    if (st && !json_is_null(st)) {
        json_t *one = json_is_string(st) ? st : NULL;
        size_t cnt = one ? 1 : json_is_array(st) ? json_array_size(st) : (size_t)-1;
        if (cnt == (size_t)-1) {
            bad(p, 400, "stop", "'stop' must be a string or an array of strings");
        } else if (cnt > FY_GEN_MAX_STOP) {
            bad(p, 400, "stop", "'stop' has %zu strings; at most %d", cnt, FY_GEN_MAX_STOP);
        } else {
            for (size_t i = 0; i < cnt && !p->status; i++) {
                json_t *s = one ? one : json_array_get(st, i);
                if (!json_is_string(s)) {
                    bad(p, 400, "stop", "'stop' must be a string or an array of strings");
                } else if (json_string_length(s) < 1 || json_string_length(s) > FY_GEN_STOP_LEN) {
                    /* (no NUL inside: jansson refuses \u0000 in what it parses) */
                    bad(p, 400, "stop", "each stop string has 1 to %d bytes", FY_GEN_STOP_LEN);
                } else {
                    memcpy(g->gen.stop[g->gen.n_stop], json_string_value(s), json_string_length(s) + 1);
                    g->gen.n_stop++;
                }
            }
        }
    }
    /* logprobs: chat says true/false (+ top_logprobs), completions an int */
    json_t *lp = json_object_get(o, "logprobs");
    if (lp && !json_is_null(lp)) {
        if (chat) {
            bool b = false;
            bool_field(p, o, "logprobs", &b);
            g->gen.logprobs = b;
            int_field(p, o, "top_logprobs", 0, 20, &g->top_logprobs);
        } else {
            json_int_t v = 0;
            int_field(p, o, "logprobs", 0, 20, &v);
            g->gen.logprobs = true;
            g->top_logprobs = v;
        }
        g->gen.top_logprobs = (int32_t)g->top_logprobs;
    }
    json_t *tl = json_object_get(o, "top_logprobs");
    if (chat && !p->status && tl && !json_is_null(tl) && !(json_is_integer(tl) && !json_integer_value(tl)) &&
        !g->gen.logprobs)
        bad(p, 400, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
    structured_fields(p, o, &g->gen);
    /* prompt_logprobs (vLLM's): 0 to 20 alternatives; not with stream (as vLLM) */
    json_t *pl = json_object_get(o, "prompt_logprobs");
    if (pl && !json_is_null(pl)) {
        json_int_t v = 0;
        int_field(p, o, "prompt_logprobs", 0, FY_GEN_MAX_PROMPT_LOGPROBS, &v);
        g->prompt_logprobs = true;
        g->prompt_top = (int32_t)v;
        if (g->stream) bad(p, 400, "prompt_logprobs", "'prompt_logprobs' is not available with 'stream': true");
    }
    /* echo with logprobs: the prompt's come from the same computation */
    g->gen.prompt_logprobs = g->prompt_logprobs || (g->echo && g->gen.logprobs);
    g->gen.prompt_top = g->prompt_top;
    if (g->echo && g->gen.logprobs && g->top_logprobs > g->gen.prompt_top) g->gen.prompt_top = (int32_t)g->top_logprobs;
    bad_words_field(H, p, o, &g->gen);
    /* known fields ferry does not implement: refused, not silently dropped
     * (tools on /v1/completions, which has no messages to put them in) */
    static const char *const unsupported[] = {"best_of", "echo", "suffix", "functions", "guided_grammar", "tools"};
    for (size_t i = 0; i < sizeof(unsupported) / sizeof(*unsupported); i++) {
        if (chat && !strcmp(unsupported[i], "tools")) continue; /* chat's are tools.c's */
        if (!chat && !strcmp(unsupported[i], "echo")) continue; /* completions' is above */
        json_t *v = json_object_get(o, unsupported[i]);
        bool set = v && !json_is_null(v) && !json_is_false(v) && !(json_is_number(v) && json_number_value(v) == 0) &&
                   !(json_is_integer(v) && json_integer_value(v) == 1 && !strcmp(unsupported[i], "best_of")) &&
                   !(json_is_object(v) && !json_object_size(v)) && !(json_is_array(v) && !json_array_size(v));
        if (set) bad(p, 400, unsupported[i], "'%s' is not supported by this server", unsupported[i]);
    }
    /* the wire's own ranges, on the values as they will travel: nothing
     * accepted here is refused by a worker */
    const char *field;
    char why[160];
    if (!p->status && fy_genspec_check(&g->gen, INT32_MAX, &field, why, sizeof(why)) != FY_OK) /* max_tokens: below */
        bad(p, 400, field, "%s", why);
}

/* A chat message's content: a string, or an array of {type: "text", text} parts. */
static char *message_text(parsed_t *p, json_t *c)
{
    if (json_is_string(c)) return fy_strndup(json_string_value(c), json_string_length(c));
    if (!json_is_array(c)) {
        bad(p, 400, "messages", "a message's 'content' must be a string or an array of text parts");
        return NULL;
    }
    size_t total = 0, i;
    json_t *part;
    json_array_foreach(c, i, part)
    {
        json_t *t = json_object_get(part, "type"), *x = json_object_get(part, "text");
        if (!json_is_string(t) || strcmp(json_string_value(t), "text") || !json_is_string(x)) {
            bad(p, 400, "messages", "only text parts are supported in a message's content");
            return NULL;
        }
        total += json_string_length(x);
    }
    char *s = fy_malloc(total + 1);
    if (!s) return NULL;
    size_t k = 0;
    json_array_foreach(c, i, part)
    {
        json_t *x = json_object_get(part, "text");
        memcpy(s + k, json_string_value(x), json_string_length(x));
        k += json_string_length(x);
    }
    s[k] = 0;
    return s;
}

/* Whether text, tokenized as template text is, holds a special token:
 * what a client wrote must never become one (prompt.h). */
static bool holds_special(const fy_tokenizer_t *tok, const char *text)
{
    size_t len = strlen(text), n = 0;
    int32_t *ids = fy_malloc((len + 2) * sizeof(int32_t));
    bool found = !ids || fy_tokenizer_encode(tok, text, len, false, true, ids, len + 2, &n) != FY_OK;
    for (size_t i = 0; i < n && !found; i++) found = fy_tokenizer_is_special(tok, ids[i]);
    fy_free(ids);
    /* and no prompt.c sentinel, which tojson would have written so */
    return found || strstr(text, "\\u0001") || strstr(text, "\\u0002");
}

/* An assistant message's tool_calls, checked; as the template sees them
 * (arguments as an object, as transformers' templates expect) in *tmpl_p
 * (a new reference). */
static bool check_tool_calls(parsed_t *p, size_t m, json_t *calls, json_t **tmpl_p)
{
    if (!json_is_array(calls) || !json_array_size(calls)) {
        bad(p, 400, "messages", "message %zu: 'tool_calls' must be a non-empty array", m);
        return false;
    }
    json_t *out = json_array();
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c)
    {
        json_t *id = json_object_get(c, "id"), *type = json_object_get(c, "type"), *fn = json_object_get(c, "function");
        json_t *name = json_object_get(fn, "name"), *args = json_object_get(fn, "arguments"), *obj = NULL;
        if (!json_is_string(id) || !json_string_length(id) || json_string_length(id) > 256)
            bad(p, 400, "messages", "message %zu: tool_calls[%zu] needs an 'id' (a string of 1 to 256 bytes)", m, i);
        else if (!json_is_string(type) || strcmp(json_string_value(type), "function"))
            bad(p, 400, "messages", "message %zu: tool_calls[%zu] must have \"type\": \"function\"", m, i);
        else if (!json_is_object(fn) || !json_is_string(name) || !json_string_length(name) ||
                 json_string_length(name) > FY_TOOL_NAME_MAX)
            bad(p, 400, "messages", "message %zu: tool_calls[%zu] needs a 'function' with a 'name' (1 to %d bytes)", m,
                i, FY_TOOL_NAME_MAX);
        else if (!json_is_string(args) || !(obj = json_loads(json_string_value(args), 0, NULL)) ||
                 !json_is_object(obj)) /* (a macro: its argument is evaluated twice) */
            bad(p, 400, "messages", "message %zu: tool_calls[%zu].function.arguments must be a JSON object as a string",
                m, i);
        if (p->status) {
            json_decref(obj);
            json_decref(out);
            return false;
        }
        json_array_append_new(out, json_pack("{s:O, s:s, s:{s:O, s:o}}", "id", id, "type", "function", "function",
                                             "name", name, "arguments", obj));
    }
    *tmpl_p = out;
    return true;
}

/* Text joined: a, sep, b (either may be NULL or empty); fy_malloc'd. */
static char *join(const char *a, const char *sep, const char *b)
{
    a = a ? a : "";
    b = b ? b : "";
    if (!*a) sep = "";
    size_t la = strlen(a), ls = strlen(sep), lb = strlen(b);
    char *s = fy_malloc(la + ls + lb + 1);
    if (!s) return NULL;
    memcpy(s, a, la);
    memcpy(s + la, sep, ls);
    memcpy(s + la + ls, b, lb + 1);
    return s;
}

/* A prompt of bytes bytes of text needs more tokens than the context
 * holds: refused as OpenAI refuses one, before any tokenizing. */
static void too_long(const fy_http_front_t *H, parsed_t *p, const char *param, size_t bytes)
{
    bad(p, 400, param,
        "This model's maximum context length is %d tokens. However, your %s is %zu bytes of text, and no %zu bytes "
        "fit in %d tokens (a token stands for at most %zu bytes)",
        H->max_ctx, param, bytes, bytes, H->max_ctx, H->max_prompt_bytes / (size_t)(H->max_ctx > 0 ? H->max_ctx : 1));
    p->code = "context_length_exceeded";
}

/* chat_template_kwargs (vLLM's): an object whose members the template
 * sees as variables (Qwen3's enable_thinking), as JSON text (free()), or
 * NULL (absent, or a fault said).  The server's own variables cannot be
 * set, and what the template writes of them is template text, so no
 * special token's text may be in them. */
static char *template_kwargs(parsed_t *p, const fy_tokenizer_t *tok, json_t *o)
{
    static const char *const reserved[] = {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"};
    json_t *kw = json_object_get(o, "chat_template_kwargs");
    if (!kw || json_is_null(kw)) return NULL;
    if (!json_is_object(kw)) {
        bad(p, 400, "chat_template_kwargs",
            "'chat_template_kwargs' must be an object (such as {\"enable_thinking\": "
            "false})");
        return NULL;
    }
    for (size_t i = 0; i < sizeof(reserved) / sizeof(*reserved); i++)
        if (json_object_get(kw, reserved[i])) {
            bad(p, 400, "chat_template_kwargs", "'chat_template_kwargs' cannot set '%s': the server does", reserved[i]);
            return NULL;
        }
    char *text = json_dumps(kw, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!text) {
        bad(p, 500, NULL, "out of memory");
    } else if (holds_special(tok, text)) {
        bad(p, 400, "chat_template_kwargs", "'chat_template_kwargs' holds the text of a special token");
        free(text);
        text = NULL;
    }
    return text;
}

/* A prompt of n tokens and the completion asked for (completion tokens;
 * 0: none asked for) that the context does not hold: refused as OpenAI
 * and vLLM refuse one, in their words. */
static void context_exceeded(const fy_http_front_t *H, parsed_t *p, bool chat, int32_t n, int32_t completion)
{
    const char *what = chat ? "messages" : "prompt";
    if (completion > 0)
        bad(p, 400, what,
            "This model's maximum context length is %d tokens. However, you requested %lld tokens (%d in the %s, "
            "%d in the completion). Please reduce the length of the %s or completion.",
            H->max_ctx, (long long)n + completion, n, what, completion, what);
    else
        bad(p, 400, what,
            "This model's maximum context length is %d tokens. However, your %s resulted in %d tokens, which "
            "leaves no room for the completion. Please reduce the length of the %s.",
            H->max_ctx, what, n, what);
    p->code = "context_length_exceeded";
}

/* the same for prompt at of a prompt array, which the message names first */
static void context_exceeded_at(const fy_http_front_t *H, parsed_t *p, int at, int32_t n, int32_t completion)
{
    if (p->status) return;
    context_exceeded(H, p, false, n, completion);
    char m[sizeof(p->msg) + 32];
    int k = snprintf(m, sizeof(m), "'prompt'[%d]: %s", at, p->msg);
    size_t len = k < 0 ? 0 : (size_t)k < sizeof(p->msg) ? (size_t)k : sizeof(p->msg) - 1;
    memcpy(p->msg, m, len);
    p->msg[len] = 0;
}

/* The chat messages to token ids through the model's template.  A
 * template that renders tools (it mentions 'tools': Qwen's, Llama 3's,
 * Mistral's) is given them and the messages' tool calls and ids, and its
 * syntax picks the output format; for one that does not (SmolLM2's,
 * ChatML, Gemma's) ferry writes SmolLM2's tool prompt into the system
 * message, an assistant's calls as <tool_call>[...]</tool_call> and tool
 * results as a user turn of <tool_response>s, all as message text. */
static int32_t *chat_ids(const fy_http_front_t *H, parsed_t *p, json_t *o, const fy_tools_req_t *tr, int32_t *n_p,
                         fy_tool_format_t *fmt_p)
{
    const fy_model_t *m = H->model;
    const fy_tokenizer_t *tok = fy_model_tokenizer(m);
    const char *src = fy_chat_template_source(fy_model_chat_template(m));
    bool in_template = strstr(src, "tools") != NULL;
    *fmt_p = !in_template || strstr(src, "<tool_call>")                ? FY_TOOL_FORMAT_HERMES
             : strstr(src, "[TOOL_CALLS]")                             ? FY_TOOL_FORMAT_MISTRAL
             : strstr(src, "<|python_tag|>") || strstr(src, "ipython") ? FY_TOOL_FORMAT_LLAMA3
                                                                       : FY_TOOL_FORMAT_HERMES;
    bool show_tools = tr && tr->tools && tr->choice != FY_TOOL_CHOICE_NONE;
    json_t *msgs = json_object_get(o, "messages");
    if (!json_is_array(msgs) || !json_array_size(msgs)) {
        bad(p, 400, "messages", "'messages' must be a non-empty array");
        return NULL;
    }
    size_t nm = json_array_size(msgs);
    if (nm + 1 > FY_PROMPT_MAX_MSGS) { /* (room for the tool prompt's system message) */
        bad(p, 400, "messages", "%zu messages; at most %d", nm, FY_PROMPT_MAX_MSGS - 1);
        return NULL;
    }
    fy_chat_msg_t cm[FY_PROMPT_MAX_MSGS];
    char *texts[FY_PROMPT_MAX_MSGS] = {0}, *extras[FY_PROMPT_MAX_MSGS] = {0}, *tools_json = NULL;
    json_t *names = json_object(); /* tool call id -> function name, for tool results */
    size_t k = 0;                  /* messages out */
    bool last_tool = false;        /* message k - 1 holds tool results */
    int32_t *ids = NULL;
    if (show_tools && !in_template) {
        texts[k] = fy_tools_system_prompt(tr);
        if (!texts[k]) goto out;
        cm[k] = (fy_chat_msg_t){"system", texts[k]};
        k++;
    }
    size_t i;
    json_t *msg;
    json_array_foreach(msgs, i, msg)
    {
        json_t *role = json_object_get(msg, "role"), *content = json_object_get(msg, "content");
        json_t *calls = json_object_get(msg, "tool_calls");
        const char *r = json_is_string(role) ? json_string_value(role) : NULL;
        if (!json_is_object(msg) || !r ||
            (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "developer") &&
             strcmp(r, "tool"))) {
            bad(p, 400, "messages", "message %zu needs a 'role' of system, developer, user, assistant or tool", i);
            break;
        }
        if (!strcmp(r, "developer")) r = "system";
        bool assistant = !strcmp(r, "assistant"), tool = !strcmp(r, "tool");
        if (calls && json_is_null(calls)) calls = NULL;
        if (calls && !assistant) {
            bad(p, 400, "messages", "message %zu: only an assistant's message has 'tool_calls'", i);
            break;
        }
        json_t *tmpl_calls = NULL;
        if (calls && !check_tool_calls(p, i, calls, &tmpl_calls)) break;
        char *text = NULL;
        if (!(calls && (!content || json_is_null(content)))) {
            text = message_text(p, content);
            if (!text) {
                json_decref(tmpl_calls);
                bad(p, 400, "messages", "message %zu has no usable 'content'", i);
                break;
            }
        }
        json_t *extra = NULL;
        if (tool) {
            json_t *id = json_object_get(msg, "tool_call_id"), *name = json_object_get(msg, "name");
            if (!json_is_string(id) || !json_string_length(id)) {
                fy_free(text);
                bad(p, 400, "messages", "message %zu: a tool message needs a 'tool_call_id' (a string)", i);
                break;
            }
            if (!json_is_string(name)) name = json_object_get(names, json_string_value(id));
            extra = json_pack("{s:O}", "tool_call_id", id);
            if (json_is_string(name)) json_object_set(extra, "name", name);
        } else if (tmpl_calls) {
            size_t c;
            json_t *call;
            json_array_foreach(tmpl_calls, c, call)
            {
                json_object_set(names, json_string_value(json_object_get(call, "id")),
                                json_object_get(json_object_get(call, "function"), "name"));
            }
            extra = json_pack("{s:o}", "tool_calls", tmpl_calls);
        }
        if (in_template) {
            if (extra && !(extras[k] = json_dumps(extra, JSON_PRESERVE_ORDER))) {
                json_decref(extra);
                fy_free(text);
                goto out;
            }
            json_decref(extra);
            if (extras[k] && holds_special(tok, extras[k])) {
                fy_free(text);
                bad(p, 400, "messages", "message %zu: its tool calls hold the text of a special token", i);
                break;
            }
            texts[k] = text;
            cm[k] = (fy_chat_msg_t){r, text};
            k++;
            continue;
        }
        /* no tool syntax in the template: calls and results as text */
        json_decref(extra);
        if (calls) {
            char *ct = fy_tools_calls_text(calls), *joined = ct ? join(text, "\n", ct) : NULL;
            fy_free(ct);
            fy_free(text);
            if (!(text = joined)) goto out;
        }
        if (tool) {
            char *a = join("<tool_response>\n", "", text), *b = a ? join(a, "", "\n</tool_response>") : NULL;
            fy_free(a);
            fy_free(text);
            if (!(text = b)) goto out;
            if (last_tool) {
                char *merged = join(texts[k - 1], "\n", text); /* consecutive results: one turn */
                fy_free(text);
                if (!merged) goto out;
                fy_free(texts[k - 1]);
                texts[k - 1] = merged;
                cm[k - 1].content = merged;
                continue;
            }
            r = "user";
        }
        last_tool = tool;
        if (show_tools && k == 1 && i == 0 && !strcmp(r, "system")) { /* the tool prompt, then the client's */
            char *merged = join(texts[0], "\n\n", text);
            fy_free(text);
            if (!merged) goto out;
            fy_free(texts[0]);
            texts[0] = merged;
            cm[0].content = merged;
            continue;
        }
        texts[k] = text;
        cm[k] = (fy_chat_msg_t){r, text};
        k++;
    }
    if (!p->status && in_template && show_tools) {
        /* the tool definitions as the template sees them; never a special token */
        if (!(tools_json = json_dumps(tr->tools, JSON_PRESERVE_ORDER))) goto out;
        if (holds_special(tok, tools_json)) bad(p, 400, "tools", "'tools' holds the text of a special token");
    }
    if (!p->status && H->max_prompt_bytes) { /* the template renders each text once, whole (prompt.h) */
        size_t bytes = 0;
        for (size_t x = 0; x < k; x++) bytes += cm[x].content ? strlen(cm[x].content) : 0;
        if (bytes > H->max_prompt_bytes) too_long(H, p, "messages", bytes);
    }
    char *vars = p->status ? NULL : template_kwargs(p, tok, o);
    if (!p->status && fy_prompt_chat_vars(m, cm, (const char *const *)extras, k, tools_json, vars, &ids, n_p) != FY_OK)
        bad(p, 400, "messages", "the chat template cannot render these messages");
    free(vars);
out: /* (out of memory: no fault, no ids) */
    for (size_t x = 0; x < FY_PROMPT_MAX_MSGS; x++) {
        fy_free(texts[x]);
        free(extras[x]);
    }
    free(tools_json);
    json_decref(names);
    return p->status ? (fy_free(ids), NULL) : ids;
}

/* One completion prompt, pr (a string or an array of token ids), its
 * last keep tokens when keep > 0, appended to *all (n_all ids; grown);
 * *len_p its tokens.  at: its place in the prompt array, for the
 * messages (-1: the prompt is no array).  False with a fault in p, or
 * without one when out of memory. */
static bool one_prompt(const fy_http_front_t *H, parsed_t *p, json_t *pr, int at, int32_t keep, int32_t **all,
                       int32_t *n_all, int32_t *len_p)
{
    const fy_model_t *m = H->model;
    int32_t vocab = fy_tokenizer_vocab_size(fy_model_tokenizer(m));
    char nm[32];
    if (at < 0)
        snprintf(nm, sizeof(nm), "'prompt'");
    else
        snprintf(nm, sizeof(nm), "'prompt'[%d]", at);
    int32_t *ids = NULL, n = 0;
    if (json_is_string(pr)) {
        if (!json_string_length(pr)) {
            bad(p, 400, "prompt", "%s is empty", nm);
            return false;
        }
        if (H->max_prompt_bytes && json_string_length(pr) > H->max_prompt_bytes) {
            too_long(H, p, "prompt", json_string_length(pr));
            return false;
        }
        /* a raw prompt's special tokens are parsed (vLLM's): prompt.h */
        if (fy_prompt_text(m, json_string_value(pr), json_string_length(pr), true, &ids, &n) != FY_OK) {
            bad(p, 400, "prompt", "cannot tokenize %s", nm);
            return false;
        }
    } else if (json_is_array(pr) && json_array_size(pr) > 0) {
        size_t k = json_array_size(pr);
        if (k >= (size_t)H->max_ctx && !keep) {
            int32_t nk = k > INT32_MAX ? INT32_MAX : (int32_t)k;
            if (at < 0)
                context_exceeded(H, p, false, nk, 0);
            else
                context_exceeded_at(H, p, at, nk, 0);
            return false;
        }
        if (!(ids = fy_malloc(k * sizeof(int32_t)))) return false;
        for (size_t i = 0; i < k; i++) {
            json_t *v = json_array_get(pr, i);
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= vocab) {
                bad(p, 400, "prompt", "%s[%zu] is not a token id below %d", nm, i, vocab);
                fy_free(ids);
                return false;
            }
            ids[i] = (int32_t)json_integer_value(v);
        }
        n = (int32_t)k;
    } else {
        bad(p, 400, "prompt", "%s %s", nm,
            json_is_array(pr) ? "is empty" : "must be a string or an array of token ids");
        return false;
    }
    int32_t from = keep > 0 && n > keep ? n - keep : 0; /* truncate_prompt_tokens */
    int32_t *grown = fy_realloc(*all, (size_t)(*n_all + n - from) * sizeof(int32_t));
    if (grown) {
        memcpy(grown + *n_all, ids + from, (size_t)(n - from) * sizeof(int32_t));
        *all = grown;
        *n_all += n - from;
        *len_p = n - from;
    }
    fy_free(ids);
    return grown != NULL;
}

/* A completion's prompt: a string, an array of token ids, or an array of
 * either (OpenAI's and vLLM's batch, at most FY_HTTP_MAX_PROMPTS and
 * FY_HTTP_MAX_CHOICES choices with g->n each): the prompts' ids one after
 * another (fy_malloc'd; g->n_prompts and g->prompt_len say where each
 * is, *n_p how many in all) or a fault in p (or NULL alone: out of memory). */
static int32_t *completion_ids(const fy_http_front_t *H, parsed_t *p, json_t *o, gen_req_t *g, int32_t keep,
                               int32_t *n_p)
{
    json_t *pr = json_object_get(o, "prompt");
    int32_t *ids = NULL;
    *n_p = 0;
    g->n_prompts = 0;
    if (json_is_string(pr) || (json_is_array(pr) && json_is_integer(json_array_get(pr, 0)))) {
        if (!one_prompt(H, p, pr, -1, keep, &ids, n_p, &g->prompt_len[0])) return fy_free(ids), NULL;
        g->n_prompts = 1;
        return ids;
    }
    size_t np = json_is_array(pr) ? json_array_size(pr) : 0;
    if (!json_is_array(pr))
        bad(p, 400, "prompt", "'prompt' must be a string, an array of token ids, or an array of either");
    else if (!np)
        bad(p, 400, "prompt", "'prompt' is an empty array; give at least one prompt");
    else if (np > FY_HTTP_MAX_PROMPTS)
        bad(p, 400, "prompt", "'prompt' has %zu prompts; at most %d in one request", np, FY_HTTP_MAX_PROMPTS);
    else if (np * (size_t)g->n > FY_HTTP_MAX_CHOICES)
        bad(p, 400, "prompt", "'prompt' has %zu prompts and 'n' is %d: %zu choices; at most %d in one request", np,
            g->n, np * (size_t)g->n, FY_HTTP_MAX_CHOICES);
    if (p->status) return NULL;
    for (size_t i = 0; i < np; i++) {
        json_t *e = json_array_get(pr, i);
        if (!json_is_string(e) && !json_is_array(e)) {
            bad(p, 400, "prompt", "'prompt'[%zu] must be a string or an array of token ids", i);
            return fy_free(ids), NULL;
        }
        if (!one_prompt(H, p, e, (int)i, keep, &ids, n_p, &g->prompt_len[i])) return fy_free(ids), NULL;
    }
    g->n_prompts = (int)np;
    return ids;
}

/* v holds the number x (as a real: jansson parsed integers so). */
static bool holds_number(json_t *v, double x, int depth)
{
    if (json_is_real(v)) return json_real_value(v) == x;
    if (depth >= 16) return false;
    size_t i;
    const char *k;
    json_t *e;
    json_array_foreach(v, i, e)
    {
        if (holds_number(e, x, depth + 1)) return true;
    }
    json_object_foreach(v, k, e)
    {
        if (holds_number(e, x, depth + 1)) return true;
    }
    return false;
}

/* jansson refuses an integer beyond int64 before any field is read ("too
 * big integer"), with the offset just past it: the body read again with
 * integers as reals finds the top-level field that holds that number, so
 * that the fault names it as OpenAI's does ('seed').  Its name into out,
 * or false. */
static bool huge_integer_field(const char *body, size_t len, const json_error_t *je, char *out, size_t cap)
{
    size_t end = je->position > 0 && (size_t)je->position <= len ? (size_t)je->position : 0, at = end;
    while (at > 0 && end - at < 320 && ((body[at - 1] >= '0' && body[at - 1] <= '9') || body[at - 1] == '-')) at--;
    if (at == end) return false;
    char lit[328];
    snprintf(lit, sizeof(lit), "%.*s", (int)(end - at), body + at);
    double x = strtod(lit, NULL);
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL, NULL);
    bool found = false;
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v)
    {
        if (!holds_number(v, x, 0)) continue;
        snprintf(out, cap, "%s", k);
        found = true;
        break;
    }
    json_decref(o);
    return found;
}

/* The body as a JSON object, or NULL with the fault said. */
static json_t *load_object(const char *body, size_t len, parsed_t *fault)
{
    json_error_t je;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!o) {
        if (strstr(je.text, "too big") &&
            huge_integer_field(body, len, &je, fault->param_buf, sizeof(fault->param_buf))) {
            bad(fault, 400, fault->param_buf,
                "'%s' holds an integer beyond the 64-bit range (-2^63 to 2^63-1; line %d column %d)", fault->param_buf,
                je.line, je.column);
        } else {
            bad(fault, 400, NULL, "malformed JSON at line %d column %d: %s", je.line, je.column, je.text);
        }
        return NULL;
    }
    if (!json_is_object(o)) {
        json_decref(o);
        bad(fault, 400, NULL, "the body must be a JSON object");
        return NULL;
    }
    return o;
}

/* Chat's tools, tool_choice and parallel_tool_calls into *tr; a required
 * or named choice becomes g's grammar (the tools' schema), which no
 * other structured output may ask for as well. */
static void tools_fields(parsed_t *p, json_t *o, fy_tools_req_t *tr, gen_req_t *g)
{
    const char *param = NULL;
    char why[256];
    if (fy_tools_request(o, tr, &param, why, sizeof(why)) != FY_OK) {
        bad(p, 400, param, "%s", why);
        return;
    }
    g->tool_choice = tr->choice;
    snprintf(g->tool_named, sizeof(g->tool_named), "%s", tr->named);
    g->tool_parallel = tr->parallel;
    if (tr->choice != FY_TOOL_CHOICE_NONE && !(g->tool_names = fy_tools_names(tr))) {
        bad(p, 500, NULL, "out of memory");
        return;
    }
    if (tr->choice != FY_TOOL_CHOICE_REQUIRED && tr->choice != FY_TOOL_CHOICE_NAMED) return;
    if (g->gen.grammar_kind != FY_GEN_GRAMMAR_NONE) {
        bad(p, 400, "tool_choice",
            "'tool_choice' %s constrains the output, and so does a structured output (response_format, guided_*): "
            "give one",
            tr->choice == FY_TOOL_CHOICE_REQUIRED ? "\"required\"" : "naming a function");
        return;
    }
    char *schema = NULL;
    fy_status_t st = fy_tools_schema(tr, &schema, why, sizeof(why));
    if (st == FY_ERR_INVALID) {
        bad(p, 400, "tools", "%s", why);
    } else if (st) {
        bad(p, 500, NULL, "out of memory");
    } else if (strlen(schema) > FY_GEN_MAX_GRAMMAR) {
        bad(p, 400, "tools", "the schema that enforces 'tool_choice' is %zu bytes; at most %d", strlen(schema),
            FY_GEN_MAX_GRAMMAR);
    } else {
        g->gen.grammar_kind = FY_GEN_GRAMMAR_JSON_SCHEMA;
        g->gen.grammar_len = (int32_t)strlen(schema);
        memcpy(g->gen.grammar, schema, strlen(schema) + 1);
    }
    fy_free(schema);
}

/* The structured output compiles (what the workers' engines will do):
 * else a 400 naming the field that asked for it and what the grammar
 * engine cannot take (a keyword, a construct, a limit). */
static void grammar_compiles(const fy_http_front_t *f, parsed_t *p, json_t *o, bool by_tools, const fy_genspec_t *g)
{
    static const char *const fields[] = {"response_format", "guided_json", "guided_regex", "guided_choice",
                                         "structured_outputs"};
    const char *param = "response_format";
    for (size_t i = 0; !by_tools && i < sizeof(fields) / sizeof(*fields); i++)
        if (json_object_get(o, fields[i]) && !json_is_null(json_object_get(o, fields[i]))) {
            param = fields[i];
            break;
        }
    if (by_tools) param = "tools";
    fy_grammar_kind_t kind;
    char err[FY_GRAMMAR_ERR_LEN] = "";
    fy_grammar_t *gr = NULL;
    fy_status_t st =
        !fy_grammar_kind_of_gen(g->grammar_kind, &kind) ? FY_ERR_INVALID
        : f->grammars
            ? fy_grammar_cache_get(f->grammars, kind, g->grammar, (size_t)g->grammar_len, &gr, NULL, err, sizeof(err))
            : fy_grammar_compile(kind, g->grammar, (size_t)g->grammar_len, &gr, err, sizeof(err));
    fy_grammar_unref(gr);
    if (st == FY_ERR_NOMEM)
        bad(p, 500, NULL, "out of memory compiling '%s'", param);
    else if (st)
        bad(p, 400, param, "'%s': %s", param, err[0] ? err : "not a structured output this server can enforce");
}

/* The parser a chat answer is split by.  AUTO: none unless the template
 * writes a thinking block; then deepseek_r1's rule when the rendered
 * prompt leaves the answer inside <think> (the template opened it), else
 * qwen3's (the answer opens its own, or does not think: Qwen3 with
 * enable_thinking false closes the block in the prompt).  A structured
 * output or a forced tool call constrains the answer from its first token,
 * so it cannot begin inside a thinking: deepseek_r1's rule becomes
 * qwen3's (a grammar that writes <think>...</think> first is still split). */
static fy_reasoning_parser_t reasoning_of(const fy_http_front_t *f, const fy_genspec_t *gen, const int32_t *ids,
                                          int32_t n)
{
    fy_reasoning_parser_t p = f->reasoning_parser;
    if (p == FY_REASONING_AUTO) {
        if (!fy_reasoning_template_thinks(fy_chat_template_source(fy_model_chat_template(f->model))))
            return FY_REASONING_NONE;
        enum { TAIL = 16 }; /* tokens: the last tag and the white space after it */
        const fy_tokenizer_t *tok = fy_model_tokenizer(f->model);
        int32_t k = n < TAIL ? n : TAIL;
        char tail[TAIL * 64];
        size_t tl;
        while ((tl = fy_tokenizer_decode(tok, ids + (n - k), (size_t)k, true, tail, sizeof(tail))) >= sizeof(tail) &&
               k > 1)
            k--; /* long tokens: fewer of them, so that the text read is the prompt's end */
        if (tl >= sizeof(tail)) tl = sizeof(tail) - 1;
        p = fy_reasoning_prompt_opens(tail, tl) ? FY_REASONING_DEEPSEEK_R1 : FY_REASONING_QWEN3;
    }
    if (p == FY_REASONING_DEEPSEEK_R1 && gen->grammar_kind != FY_GEN_GRAMMAR_NONE) p = FY_REASONING_QWEN3;
    return p;
}

fy_status_t fy_http_parse_generation(const fy_http_front_t *f, const char *body, size_t len, bool chat,
                                     fy_http_gen_t *g, fy_http_fault_t *fault)
{
    memset(g, 0, sizeof(*g));
    memset(fault, 0, sizeof(*fault));
    json_t *o = load_object(body, len, fault);
    if (!o) return FY_ERR_INVALID;
    parse_common(f, fault, o, chat, g);
    g->include_reasoning = true;
    if (chat) bool_field(fault, o, "include_reasoning", &g->include_reasoning);
    fy_tools_req_t tr = {0};
    if (chat && !fault->status) tools_fields(fault, o, &tr, g);
    if (!fault->status && g->gen.grammar_kind != FY_GEN_GRAMMAR_NONE)
        grammar_compiles(f, fault, o, tr.choice == FY_TOOL_CHOICE_REQUIRED || tr.choice == FY_TOOL_CHOICE_NAMED,
                         &g->gen);
    int32_t n_prompt = 0;
    int32_t *ids = fault->status ? NULL
                   : chat        ? chat_ids(f, fault, o, &tr, &n_prompt, &g->tool_format)
                                 : completion_ids(f, fault, o, g, g->truncate, &n_prompt);
    if (ids && chat && g->truncate > 0 && n_prompt > g->truncate) { /* the last truncate tokens */
        memmove(ids, ids + (n_prompt - g->truncate), (size_t)g->truncate * sizeof(int32_t));
        n_prompt = g->truncate;
    }
    if (chat) {
        g->n_prompts = 1;
        g->prompt_len[0] = n_prompt;
    }
    fy_tools_req_clear(&tr);
    json_decref(o);
    if (fault->status || !ids) {
        fy_free(g->tool_names);
        g->tool_names = NULL;
    }
    if (fault->status) return FY_ERR_INVALID;
    if (!ids) return FY_ERR_NOMEM;
    /* the context (the workers', front_of's): each prompt, and the
     * completion when the client said how long, must fit; without
     * max_tokens the completion takes the room left (below).  A prompt
     * array's prompts run apart: its longest must fit. */
    int32_t longest = 0, at = 0;
    for (int i = 0; i < g->n_prompts; i++)
        if (g->prompt_len[i] > longest) longest = g->prompt_len[at = i];
    if (longest >= f->max_ctx || (g->max_tokens_set && (int64_t)longest + g->gen.max_tokens > f->max_ctx)) {
        int32_t completion = g->max_tokens_set && !g->echo_only ? g->gen.max_tokens : 0;
        if (g->n_prompts > 1)
            context_exceeded_at(f, fault, at, longest, completion);
        else
            context_exceeded(f, fault, chat, longest, completion);
        fy_free(ids);
        fy_free(g->tool_names);
        g->tool_names = NULL;
        return FY_ERR_INVALID;
    }
    /* prompt logprobs: bounded, so is the answer */
    int64_t entries = (int64_t)n_prompt * (g->gen.prompt_top + 1);
    if (g->gen.prompt_logprobs && entries > FY_HTTP_MAX_PLP_ENTRIES) {
        fy_free(ids);
        fy_free(g->tool_names);
        g->tool_names = NULL;
        bad(fault, 400, g->prompt_logprobs ? "prompt_logprobs" : "logprobs",
            "prompt logprobs of %d tokens with %d alternatives each are %lld entries; at most %d", n_prompt,
            g->gen.prompt_top, (long long)entries, FY_HTTP_MAX_PLP_ENTRIES);
        return FY_ERR_INVALID;
    }
    /* the chat default: what the context has room for, within the configured cap */
    if (!g->max_tokens_set) { /* (a prompt array's: the longest prompt's room) */
        int32_t room = fy_genspec_max_tokens(&g->gen, longest, f->max_ctx);
        g->gen.max_tokens = room > 1 ? room : 1;
    }
    if (chat) g->reasoning = reasoning_of(f, &g->gen, ids, n_prompt);
    g->ids = ids;
    g->n_prompt = n_prompt;
    return FY_OK;
}

fy_status_t fy_http_parse_tokenize(const fy_http_front_t *f, const char *body, size_t len, fy_http_tok_t *t,
                                   fy_http_fault_t *fault)
{
    memset(t, 0, sizeof(*t));
    memset(fault, 0, sizeof(*fault));
    json_t *o = load_object(body, len, fault);
    if (!o) return FY_ERR_INVALID;
    model_field(f, fault, o);
    bool chat = json_object_get(o, "messages") != NULL, gen_prompt = true, cont = false;
    bool special = !chat; /* vLLM's defaults: BOS for a prompt, the template's own for messages */
    bool_field(fault, o, "return_token_strs", &t->token_strs);
    bool_field(fault, o, "add_special_tokens", &special);
    if (chat) {
        bool_field(fault, o, "add_generation_prompt", &gen_prompt);
        bool_field(fault, o, "continue_final_message", &cont);
        if (json_object_get(o, "prompt"))
            bad(fault, 400, "prompt", "give 'prompt' or 'messages', not both");
        else if (!gen_prompt)
            bad(fault, 400, "add_generation_prompt",
                "'add_generation_prompt': false is not supported (the assistant's turn is always opened)");
        else if (cont)
            bad(fault, 400, "continue_final_message", "'continue_final_message' is not supported");
        else if (special)
            bad(fault, 400, "add_special_tokens",
                "'add_special_tokens' with 'messages' is not supported (the chat template places them)");
    }
    int32_t *ids = NULL, n = 0;
    if (!fault->status && chat) { /* the tools too, as a chat completion renders them */
        fy_tools_req_t tr = {0};
        fy_tool_format_t fmt;
        const char *param = NULL;
        char why[256];
        if (fy_tools_request(o, &tr, &param, why, sizeof(why)) != FY_OK)
            bad(fault, 400, param, "%s", why);
        else
            ids = chat_ids(f, fault, o, &tr, &n, &fmt);
        fy_tools_req_clear(&tr);
    } else if (!fault->status) {
        json_t *pr = json_object_get(o, "prompt");
        const fy_tokenizer_t *tok = fy_model_tokenizer(f->model);
        if (!json_is_string(pr)) {
            bad(fault, 400, "prompt", "'prompt' must be a string (or give 'messages')");
        } else if (!json_string_length(pr)) { /* nothing, or BOS alone */
            ids = fy_malloc(sizeof(int32_t));
            if (ids && special && fy_tokenizer_wants_bos(tok) && fy_tokenizer_bos(tok) >= 0)
                ids[n++] = fy_tokenizer_bos(tok);
        } else {
            /* special tokens parsed, as /v1/completions does (prompt.h) */
            if (fy_prompt_text(f->model, json_string_value(pr), json_string_length(pr), true, &ids, &n) != FY_OK)
                bad(fault, 400, "prompt", "cannot tokenize 'prompt'");
            if (ids && !special && n > 0 && fy_tokenizer_wants_bos(tok) && ids[0] == fy_tokenizer_bos(tok)) {
                memmove(ids, ids + 1, (size_t)(n - 1) * sizeof(int32_t));
                n--;
            }
        }
    }
    json_decref(o);
    if (fault->status) {
        fy_free(ids);
        return FY_ERR_INVALID;
    }
    if (!ids) return FY_ERR_NOMEM;
    t->ids = ids;
    t->n = n;
    return FY_OK;
}

fy_status_t fy_http_parse_detokenize(const fy_http_front_t *f, const char *body, size_t len, fy_http_tok_t *t,
                                     fy_http_fault_t *fault)
{
    memset(t, 0, sizeof(*t));
    memset(fault, 0, sizeof(*fault));
    json_t *o = load_object(body, len, fault);
    if (!o) return FY_ERR_INVALID;
    model_field(f, fault, o);
    json_t *a = json_object_get(o, "tokens");
    int32_t vocab = fy_tokenizer_vocab_size(fy_model_tokenizer(f->model));
    size_t n = json_is_array(a) ? json_array_size(a) : 0;
    int32_t *ids = NULL;
    if (!fault->status && !json_is_array(a))
        bad(fault, 400, "tokens", "'tokens' must be an array of token ids");
    else if (!fault->status && !(ids = fy_malloc((n ? n : 1) * sizeof(int32_t)))) {
        json_decref(o);
        return FY_ERR_NOMEM;
    }
    for (size_t i = 0; i < n && !fault->status; i++) {
        json_t *v = json_array_get(a, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= vocab)
            bad(fault, 400, "tokens", "'tokens'[%zu] is not a token id below %d", i, vocab);
        else
            ids[i] = (int32_t)json_integer_value(v);
    }
    json_decref(o);
    if (fault->status) {
        fy_free(ids);
        return FY_ERR_INVALID;
    }
    t->ids = ids;
    t->n = (int32_t)n;
    return FY_OK;
}

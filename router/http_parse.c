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
#include "http_parse.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include <sodium.h>

#include "mem.h"
#include "prompt.h"
#include "tokenizer.h"

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
    json_t *si = json_object_get(o, "stop_token_ids");
    if (si && !json_is_null(si)) {
        if (!json_is_array(si) || json_array_size(si) > FY_GEN_MAX_STOP_IDS) {
            bad(p, 400, "stop_token_ids", "'stop_token_ids' must be an array of at most %d token ids",
                FY_GEN_MAX_STOP_IDS);
            return;
        }
        size_t i;
        json_t *v;
        json_array_foreach(si, i, v)
        {
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= vocab) {
                bad(p, 400, "stop_token_ids", "'stop_token_ids' entry %zu is not a token id (0 to %d)", i, vocab - 1);
                return;
            }
            g->stop_ids[g->n_stop_ids++] = (int32_t)json_integer_value(v);
        }
    }
}

/* "model": absent, null, the served name or the model's id; else 404. */
static void model_field(const fy_http_front_t *H, parsed_t *p, json_t *o)
{
    json_t *m = json_object_get(o, "model");
    if (m && !json_is_null(m)) {
        if (!json_is_string(m))
            bad(p, 400, "model", "'model' must be a string");
        else if (strcmp(json_string_value(m), H->served) && strcmp(json_string_value(m), H->model_id))
            bad(p, 404, "model", "the model '%s' does not exist; this server serves '%s'", json_string_value(m),
                H->served);
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
    /* max_tokens, or its newer name max_completion_tokens, on both endpoints */
    json_int_t mt = chat ? H->default_max_tokens : DEFAULT_MAX_TOKENS_COMPLETION, old = 0, mct = 0;
    int_field(p, o, "max_tokens", 1, H->max_ctx, &old);
    int_field(p, o, "max_completion_tokens", 1, H->max_ctx, &mct);
    if (old && mct && old != mct)
        bad(p, 400, "max_completion_tokens",
            "'max_completion_tokens' is %lld and 'max_tokens' %lld: they are the same limit, give one of them",
            (long long)mct, (long long)old);
    if (mct || old) {
        g->max_tokens_set = true;
        mt = mct ? mct : old;
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
        else
            bool_field(p, so, "include_usage", &g->include_usage);
    }
    bool_field(p, o, "ignore_eos", &g->gen.ignore_eos);
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
    /* known fields ferry does not implement: refused, not silently dropped */
    static const char *const unsupported[] = {"best_of",
                                              "echo",
                                              "suffix",
                                              "tools",
                                              "functions",
                                              "response_format",
                                              "guided_json",
                                              "guided_regex"};
    for (size_t i = 0; i < sizeof(unsupported) / sizeof(*unsupported); i++) {
        json_t *v = json_object_get(o, unsupported[i]);
        bool set = v && !json_is_null(v) && !json_is_false(v) && !(json_is_number(v) && json_number_value(v) == 0) &&
                   !(json_is_integer(v) && json_integer_value(v) == 1 && !strcmp(unsupported[i], "best_of")) &&
                   !(json_is_string(v) && !strcmp(unsupported[i], "response_format")) &&
                   !(json_is_object(v) && !json_object_size(v)) && !(json_is_array(v) && !json_array_size(v));
        if (json_is_object(v) && !strcmp(unsupported[i], "response_format")) {
            json_t *t = json_object_get(v, "type");
            set = !(json_is_string(t) && !strcmp(json_string_value(t), "text"));
        }
        if (set) bad(p, 400, unsupported[i], "'%s' is not supported by this server", unsupported[i]);
    }
    /* the wire's own ranges, on the values as they will travel: nothing
     * accepted here is refused by a worker */
    const char *field;
    char why[160];
    if (!p->status && fy_genspec_check(&g->gen, H->max_ctx, &field, why, sizeof(why)) != FY_OK)
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

/* The prompt's token ids (fy_malloc'd) or a fault in p. */
static int32_t *prompt_ids(const fy_http_front_t *H, parsed_t *p, json_t *o, bool chat, int32_t *n_p)
{
    const fy_model_t *m = H->model;
    int32_t vocab = fy_tokenizer_vocab_size(fy_model_tokenizer(m));
    int32_t *ids = NULL;
    if (chat) {
        json_t *msgs = json_object_get(o, "messages");
        if (!json_is_array(msgs) || !json_array_size(msgs)) {
            bad(p, 400, "messages", "'messages' must be a non-empty array");
            return NULL;
        }
        size_t nm = json_array_size(msgs);
        if (nm > FY_PROMPT_MAX_MSGS) {
            bad(p, 400, "messages", "%zu messages; at most %d", nm, FY_PROMPT_MAX_MSGS);
            return NULL;
        }
        fy_chat_msg_t cm[FY_PROMPT_MAX_MSGS];
        char *texts[FY_PROMPT_MAX_MSGS] = {0};
        size_t i;
        json_t *msg;
        json_array_foreach(msgs, i, msg)
        {
            json_t *role = json_object_get(msg, "role");
            const char *r = json_is_string(role) ? json_string_value(role) : NULL;
            if (!json_is_object(msg) || !r ||
                (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "developer"))) {
                bad(p, 400, "messages", "message %zu needs a 'role' of system, user or assistant", i);
                break;
            }
            texts[i] = message_text(p, json_object_get(msg, "content"));
            if (!texts[i]) {
                bad(p, 400, "messages", "message %zu has no usable 'content'", i);
                break;
            }
            cm[i] = (fy_chat_msg_t){!strcmp(r, "developer") ? "system" : r, texts[i]};
        }
        if (!p->status && fy_prompt_chat(m, cm, nm, &ids, n_p) != FY_OK)
            bad(p, 400, "messages", "the chat template cannot render these messages");
        for (size_t k = 0; k < nm; k++) fy_free(texts[k]);
        return p->status ? (fy_free(ids), NULL) : ids;
    }
    json_t *pr = json_object_get(o, "prompt");
    if (json_is_array(pr) && json_array_size(pr) == 1 && json_is_string(json_array_get(pr, 0)))
        pr = json_array_get(pr, 0);
    if (json_is_string(pr)) {
        if (!json_string_length(pr)) {
            bad(p, 400, "prompt", "'prompt' is empty");
            return NULL;
        }
        char *t = fy_strndup(json_string_value(pr), json_string_length(pr));
        if (!t || fy_prompt_tokens(m, NULL, t, false, &ids, n_p) != FY_OK)
            bad(p, 400, "prompt", "cannot tokenize 'prompt'");
        fy_free(t);
        return p->status ? (fy_free(ids), NULL) : ids;
    }
    if (json_is_array(pr) && json_array_size(pr) > 0 && json_is_integer(json_array_get(pr, 0))) {
        size_t n = json_array_size(pr);
        if (n >= (size_t)H->max_ctx) {
            bad(p, 400, "prompt", "'prompt' has %zu tokens; the context holds %d", n, H->max_ctx);
            return NULL;
        }
        ids = fy_malloc(n * sizeof(int32_t));
        if (!ids) return NULL;
        for (size_t i = 0; i < n; i++) {
            json_t *v = json_array_get(pr, i);
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= vocab) {
                bad(p, 400, "prompt", "'prompt'[%zu] is not a token id below %d", i, vocab);
                fy_free(ids);
                return NULL;
            }
            ids[i] = (int32_t)json_integer_value(v);
        }
        *n_p = (int32_t)n;
        return ids;
    }
    if (json_is_array(pr) && json_array_size(pr) > 1)
        bad(p, 400, "prompt",
            "one prompt per request (a string or an array of token ids); send batches as separate requests");
    else
        bad(p, 400, "prompt", "'prompt' must be a string or an array of token ids");
    return NULL;
}

/* The body as a JSON object, or NULL with the fault said. */
static json_t *load_object(const char *body, size_t len, parsed_t *fault)
{
    json_error_t je;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!o) {
        bad(fault, 400, NULL, "malformed JSON at line %d column %d: %s", je.line, je.column, je.text);
        return NULL;
    }
    if (!json_is_object(o)) {
        json_decref(o);
        bad(fault, 400, NULL, "the body must be a JSON object");
        return NULL;
    }
    return o;
}

fy_status_t fy_http_parse_generation(const fy_http_front_t *f, const char *body, size_t len, bool chat,
                                     fy_http_gen_t *g, fy_http_fault_t *fault)
{
    memset(g, 0, sizeof(*g));
    memset(fault, 0, sizeof(*fault));
    json_t *o = load_object(body, len, fault);
    if (!o) return FY_ERR_INVALID;
    parse_common(f, fault, o, chat, g);
    int32_t n_prompt = 0;
    int32_t *ids = fault->status ? NULL : prompt_ids(f, fault, o, chat, &n_prompt);
    json_decref(o);
    if (fault->status) return FY_ERR_INVALID;
    if (!ids) return FY_ERR_NOMEM;
    /* the chat default: what the context has room for, within the configured cap */
    if (!g->max_tokens_set && g->gen.max_tokens > f->max_ctx - n_prompt)
        g->gen.max_tokens = f->max_ctx - n_prompt > 1 ? f->max_ctx - n_prompt : 1;
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
    if (!fault->status && chat) {
        ids = prompt_ids(f, fault, o, true, &n);
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
            char *txt = fy_strndup(json_string_value(pr), json_string_length(pr));
            if (!txt || fy_prompt_tokens(f->model, NULL, txt, false, &ids, &n) != FY_OK)
                bad(fault, 400, "prompt", "cannot tokenize 'prompt'");
            fy_free(txt);
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

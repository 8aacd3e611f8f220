/*
 * fuzz_http.c - HTTP request bodies of POST /v1/completions and
 * /v1/chat/completions: jansson's parser with the router's flags, then
 * the router's field validation and prompt building over the default
 * model (its tokenizer and chat template, through common/prompt.c).  The
 * first byte of an input picks the endpoint (odd: chat); the rest is the
 * body.
 *
 * router/http.c keeps its parsing in static functions behind nng's HTTP
 * server, so the part of it between the body and the router
 * (parse_body's json_loadb, parse_common, message_text, prompt_ids) is
 * repeated below, as of main dc14c19, with only the router's accessors
 * replaced by the model's.  When http.c exposes that part as a function,
 * call it instead and delete the copy.
 *
 * Checks: a refused body has a status (400 or 404), a parameter name or
 * none, and a message; an accepted one has a prompt of 1 or more ids
 * inside the vocabulary, sampling parameters that pass the sampler's
 * check, max_tokens in [1, the context], n in [1, 16] and at most 8 stop
 * strings of 1 to 64 bytes.  Needs the default model; skipped without it.
 */
#include <jansson.h>
#include <math.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "genspec.h"
#include "mem.h"
#include "model.h"
#include "prompt.h"
#include "tokenizer.h"
#include "util.h"

/* ---- the router, as much of it as the parsing reads --------------------------------------------------- */

typedef struct front {
    const fy_model_t *model;
    char model_id[64];
    char served[128];
    int32_t max_ctx;
    int64_t default_max_tokens;
} front_t;

static front_t g_front;
static front_t *const H = &g_front;

/* ---- copied from router/http.c (main dc14c19): request parsing -------------------------------------- */

#define MAX_N 16
#define DEFAULT_MAX_TOKENS_COMPLETION 16

typedef struct parsed {
    uint16_t status; /* 0: fine */
    const char *type, *param;
    char msg[384];
    double retry_after;
} parsed_t;

static void bad(parsed_t *p, uint16_t status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void bad(parsed_t *p, uint16_t status, const char *param, const char *fmt, ...)
{
    if (p->status) return;
    p->status = status;
    p->param = param;
    p->type = status == 400 ? "invalid_request_error" : status == 404 ? "not_found_error" : "error";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->msg, sizeof(p->msg), fmt, ap);
    va_end(ap);
}

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

typedef struct gen_req {
    fy_genspec_t gen;
    int n;
    bool stream, include_usage, max_tokens_set;
    json_int_t top_logprobs;
} gen_req_t;

static void parse_common(front_t *h, parsed_t *p, json_t *o, bool chat, gen_req_t *g)
{
    fy_genspec_default(&g->gen);
    g->gen.sampling.temperature = 1.0f;
    g->gen.sampling.top_k = 0;
    g->gen.sampling.top_p = 1.0f;
    g->gen.sampling.min_p = 0;
    json_t *m = json_object_get(o, "model");
    if (m && !json_is_null(m)) {
        if (!json_is_string(m))
            bad(p, 400, "model", "'model' must be a string");
        else if (strcmp(json_string_value(m), h->served) && strcmp(json_string_value(m), h->model_id))
            bad(p, 404, "model", "the model '%s' does not exist; this server serves '%s'", json_string_value(m),
                h->served);
    }
    json_int_t mt = chat ? h->default_max_tokens : DEFAULT_MAX_TOKENS_COMPLETION;
    json_t *mtv = json_object_get(o, chat ? "max_completion_tokens" : "max_tokens");
    const char *mt_name = chat ? "max_completion_tokens" : "max_tokens";
    if (!mtv || json_is_null(mtv)) mtv = json_object_get(o, "max_tokens"), mt_name = "max_tokens";
    if (mtv && !json_is_null(mtv)) {
        g->max_tokens_set = true;
        json_t *tmp = json_object();
        json_object_set(tmp, mt_name, mtv);
        int_field(p, tmp, mt_name, 1, h->max_ctx, &mt);
        json_decref(tmp);
    }
    g->gen.max_tokens = (int32_t)mt;
    double d = g->gen.sampling.temperature;
    num_field(p, o, "temperature", 0, 100, &d);
    g->gen.sampling.temperature = (float)d;
    d = g->gen.sampling.top_p;
    num_field(p, o, "top_p", 1e-9, 1, &d);
    g->gen.sampling.top_p = (float)d;
    d = 0;
    num_field(p, o, "min_p", 0, 1, &d);
    g->gen.sampling.min_p = (float)d;
    json_int_t k = 0;
    int_field(p, o, "top_k", -1, 1 << 30, &k);
    g->gen.sampling.top_k = k < 0 ? 0 : (int32_t)k;
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
    json_t *sp = json_object_get(o, "speculative");
    if (sp && !json_is_null(sp)) {
        if (!json_is_string(sp) || fy_spec_method_parse(json_string_value(sp), true, &g->gen.spec) != FY_OK)
            bad(p, 400, "speculative", "'speculative' is one of default, none, ngram, draft");
    }
    json_int_t prio = 0;
    int_field(p, o, "priority", -1000000, 1000000, &prio);
    g->gen.priority = (int32_t)prio;
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
                    bad(p, 400, "stop", "each stop string has 1 to %d bytes", FY_GEN_STOP_LEN);
                } else {
                    memcpy(g->gen.stop[g->gen.n_stop], json_string_value(s), json_string_length(s) + 1);
                    g->gen.n_stop++;
                }
            }
        }
    }
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
        if (g->top_logprobs > 0)
            bad(p, 400, chat ? "top_logprobs" : "logprobs",
                "alternatives in logprobs are not supported (0 gives each chosen token's log-probability)");
    }
    static const char *const unsupported[] = {"presence_penalty", "frequency_penalty", "repetition_penalty",
                                              "logit_bias", "best_of", "echo", "suffix", "tools", "functions",
                                              "response_format", "guided_json", "guided_regex"};
    for (size_t i = 0; i < sizeof(unsupported) / sizeof(*unsupported); i++) {
        json_t *v = json_object_get(o, unsupported[i]);
        bool set = v && !json_is_null(v) && !json_is_false(v) &&
                   !(json_is_number(v) && json_number_value(v) == 0) &&
                   !(json_is_integer(v) && json_integer_value(v) == 1 && !strcmp(unsupported[i], "best_of")) &&
                   !(json_is_string(v) && !strcmp(unsupported[i], "response_format")) &&
                   !(json_is_object(v) && !json_object_size(v)) && !(json_is_array(v) && !json_array_size(v));
        if (json_is_object(v) && !strcmp(unsupported[i], "response_format")) {
            json_t *t = json_object_get(v, "type");
            set = !(json_is_string(t) && !strcmp(json_string_value(t), "text"));
        }
        if (set) bad(p, 400, unsupported[i], "'%s' is not supported by this server", unsupported[i]);
    }
}

static char *message_text(parsed_t *p, json_t *c)
{
    if (json_is_string(c)) return fy_strndup(json_string_value(c), json_string_length(c));
    if (!json_is_array(c)) {
        bad(p, 400, "messages", "a message's 'content' must be a string or an array of text parts");
        return NULL;
    }
    size_t total = 0, i;
    json_t *part;
    json_array_foreach(c, i, part) {
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
    json_array_foreach(c, i, part) {
        json_t *x = json_object_get(part, "text");
        memcpy(s + k, json_string_value(x), json_string_length(x));
        k += json_string_length(x);
    }
    s[k] = 0;
    return s;
}

static int32_t *prompt_ids(front_t *h, parsed_t *p, json_t *o, bool chat, int32_t *n_p)
{
    const fy_model_t *m = h->model;
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
        json_array_foreach(msgs, i, msg) {
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
        if (n >= (size_t)h->max_ctx) {
            bad(p, 400, "prompt", "'prompt' has %zu tokens; the context holds %d", n, h->max_ctx);
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
        bad(p, 400, "prompt", "one prompt per request (a string or an array of token ids); send batches as separate requests");
    else
        bad(p, 400, "prompt", "'prompt' must be a string or an array of token ids");
    return NULL;
}

/* ---- end of the copy ------------------------------------------------------------------------------------ */

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
    H->model = m;
    fy_model_id(m, H->model_id, sizeof(H->model_id));
    snprintf(H->served, sizeof(H->served), "SmolLM2-135M-Instruct.Q4_1");
    H->max_ctx = fy_model_config(m)->max_ctx;
    H->default_max_tokens = 1024;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    bool chat = data[0] & 1;
    json_error_t je;
    json_t *o = json_loadb((const char *)data + 1, size - 1, JSON_REJECT_DUPLICATES, &je); /* parse_body */
    if (!o) return 0;
    if (!json_is_object(o)) {
        json_decref(o);
        return 0;
    }
    parsed_t p = {0};
    gen_req_t g = {0};
    parse_common(H, &p, o, chat, &g);
    int32_t n_prompt = 0;
    int32_t *ids = p.status ? NULL : prompt_ids(H, &p, o, chat, &n_prompt);
    json_decref(o);
    if (p.status) {
        FZ_CHECK(p.status == 400 || p.status == 404, "status %u", p.status);
        FZ_CHECK(p.type && p.msg[0], "a refusal without a type or a message");
        FZ_CHECK(!ids, "ids with a refusal");
        return 0;
    }
    FZ_CHECK(ids != NULL && n_prompt >= 1, "an accepted request without a prompt");
    int32_t vocab = fy_tokenizer_vocab_size(fy_model_tokenizer(H->model));
    for (int32_t i = 0; i < n_prompt; i++) FZ_CHECK(ids[i] >= 0 && ids[i] < vocab, "prompt id %d", ids[i]);
    FZ_CHECK(fy_sampling_params_check(&g.gen.sampling) == FY_OK, "accepted sampling parameters fail the sampler");
    FZ_CHECK(g.gen.max_tokens >= 1 && g.gen.max_tokens <= H->max_ctx, "max_tokens %d", g.gen.max_tokens);
    FZ_CHECK(g.n >= 1 && g.n <= MAX_N, "n %d", g.n);
    FZ_CHECK(g.gen.n_stop >= 0 && g.gen.n_stop <= FY_GEN_MAX_STOP, "%d stop strings", g.gen.n_stop);
    for (int32_t i = 0; i < g.gen.n_stop; i++) {
        size_t l = strlen(g.gen.stop[i]);
        FZ_CHECK(l <= FY_GEN_STOP_LEN, "stop string of %zu bytes", l);
    }
    fy_free(ids);
    return 0;
}

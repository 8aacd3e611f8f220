/*
 * http.c - the router's OpenAI-compatible HTTP front door (router.http,
 * e.g. http://127.0.0.1:8080), on the process's HTTP server
 * (rpc/httpd.h).
 *
 *   POST /v1/completions        prompt (text, or token ids) -> text
 *   POST /v1/chat/completions   messages through the model's chat template
 *   POST /v1/responses          OpenAI's Responses API, run as a chat completion (router/responses.h)
 *   GET  /v1/models             the one model served
 *   GET  /v1/models/{id}        that model (404 for another id)
 *   (the four also without /v1, as llama.cpp's server answers them)
 *   POST /tokenize, /detokenize text or messages <-> token ids (vLLM's)
 *   GET  /version               {"version": ferry's}
 *   GET  /health                200 while requests can be served, else 503
 *   GET  /metrics               the router's Prometheus metrics
 *
 * Both POSTs stream as server-sent events ("data: {...}" chunks, then
 * "data: [DONE]") with "stream": true, or answer one JSON body with usage
 * counts.  Bodies are parsed with jansson; a wrong type or an
 * out-of-range value (genspec.h's ranges, the same as the wire's) is a
 * 400 with an OpenAI-style error body naming the field ("param"); unknown
 * fields are ignored, known ones ferry does not implement (best_of,
 * suffix, chat's echo, ...) are refused rather than silently ignored.
 * Completions' echo gives the prompt back before the completion (its
 * logprobs too), and prompt_logprobs (vLLM's) each prompt token's, both
 * computed where the prompt ran and carried here by the router.  Chat
 * answers with tools are parsed into tool_calls here (router/tools.c's
 * incremental parser, one per sample): a stream sends content until a
 * call begins (what may be a call's marker held back), then each call's
 * id and name and its arguments as they are generated, as OpenAI's
 * stream does.
 *
 * A generation is a held request (fy_httpd_hold): the router calls watch()
 * under its lock as tokens arrive, and what is new is handed to the
 * server (a stream's next events, or the whole answer at the end), which
 * writes it from its own threads.  The server tells end() when the answer
 * is out or the client went away; a client that leaves first has its
 * requests cancelled in the cluster, which frees their blocks.  Nothing
 * here closes a connection or waits on the server under the router's
 * lock, and end() is the only place a generation's state is freed.
 *
 * Draining (fy_http_drain): new generations get 503 with Retry-After,
 * /health says 503 "draining", running ones go on; whatever the router
 * then ends carries a terminal event (a stream's choices end with
 * finish_reason "abort", an error event, then [DONE]).
 *
 * Not here: TLS (put a proxy in front), CORS and the refusals made
 * before a handler runs (404, 405, 413: rpc/httpd.c).
 */
#include "router/http.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <sodium.h>

#include "common/clock.h"
#include "common/cluster.h"
#include "grammar/grammar.h"
#include "router/http_parse.h"
#include "router/reasoning.h"
#include "router/responses.h"
#include "rpc/httpd.h"
#include "common/log.h"
#include "common/mem.h"
#include "model/prompt.h"
#include "rpc/rpc.h"
#include "router/router_int.h"
#include "router/tenants.h"
#include "model/tokenizer.h"
#include "router/tools.h"
#include "common/version.h"

typedef struct fy_http fy_http_t;

#define MAX_N FY_HTTP_MAX_CHOICES /* choices per request: prompts times samples */

typedef struct hreq hreq_t;

struct fy_http {
    router_t *R;
    fy_httpd_t *srv;
    char url[256];
    char served[128];             /* the model's name in the API */
    fy_grammar_cache_t *grammars; /* structured outputs compiled at the door (thread-safe) */
    fy_tenants_t *tenants;        /* NULL: no keys, everyone is tenant "" */
    int64_t default_max_tokens;
    fy_reasoning_parser_t reasoning_parser; /* router.reasoning_parser */
    double retry_after_s;
    time_t model_created; /* the model file's time, for /v1/models */
    /* guarded by the router's lock */
    hreq_t *live; /* generations not yet ended */
    int32_t n_live;
    bool draining, stopping;
    /* 2xx, 400, other 4xx, 429, 5xx answers; clients gone before the end */
    fy_metric_t *responses[6];
    fy_metric_t *conns, *closed[3]; /* open connections; closed: header timeout, evicted, refused */
};

struct hreq {
    fy_http_t *H;
    fy_httpd_req_t *r; /* NULL once the server ended it */
    char *wbuf;
    size_t wlen, wcap;
    bool chat, stream, include_usage, logprobs;
    bool echo, echo_only, plp; /* http_parse.h; plp: the client asked for prompt_logprobs */
    int32_t plp_top;
    bool echo_sent[MAX_N];
    fy_tool_choice_t tool_choice; /* chat with tools: the output parsed into tool calls */
    fy_tool_format_t tool_format;
    char tool_named[FY_TOOL_NAME_MAX + 1];
    char *tool_names; /* the tools' names (fy_tools_names) */
    bool tool_parallel;
    fy_tools_stream_t *tools[MAX_N]; /* each sample's text read into tool calls as it grows */
    /* chat with a reasoning parser: each sample's answer split into
     * reasoning and content (router/reasoning.h), and the reasoning's
     * bytes streamed so far */
    fy_reasoning_parser_t reasoning;
    bool include_reasoning;
    fy_reasoning_t think[MAX_N];
    size_t from_reason[MAX_N];
    int n;   /* choices: n_prompts times per */
    int per; /* samples per prompt (the request's "n"); choice i is prompt i / per's */
    int n_prompts;
    uint64_t ids[MAX_N];
    int32_t from_tok[MAX_N];
    size_t from_text[MAX_N];
    bool done_sent[MAX_N];
    int n_done_sent;
    /* a prompt's samples after its first wait until its prompt is in the
     * caches; the prompts' ids one after another, prompt p's from
     * prompt_off[p] to prompt_off[p + 1] (NULL: one choice alone) */
    int n_submitted;
    int32_t *prompt;
    int32_t n_prompt;
    int32_t prompt_off[FY_HTTP_MAX_PROMPTS + 1];
    fy_genspec_t gen;
    fy_status_t sample_err[MAX_N];
    char sample_msg[MAX_N][96];
    char oid[48];
    time_t created; /* when this answer was made: its "created" */
    fy_tenant_t *tenant;
    int64_t charged, max_tokens;
    bool ready, head_sent, final, released;
    /* the body waits for a parse worker (parse_job): h_end leaves h to it */
    bool parsing, listed;
    char *body;
    size_t body_len;
    fy_tenant_t *key_tenant; /* the API key's, until admitted */
    bool responses;          /* POST /v1/responses: parsed and answered by router/responses.c */
    fy_responses_t *resp;    /* its request, once parsed */
    hreq_t *prev, *next;
};

/* ---- JSON helpers ------------------------------------------------------------------------------ */

/* Valid UTF-8 for JSON: bytes that are not become U+FFFD. */
static json_t *jstr(const char *s, size_t n)
{
    json_t *j = json_stringn(s, n);
    if (j) return j;
    char *o = fy_malloc(n * 3 + 1);
    if (!o) return json_string("");
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool ok = len > 0 && i + (size_t)len <= n;
        for (int b = 1; ok && b < len; b++) ok = ((unsigned char)s[i + (size_t)b] >> 6) == 2;
        if (ok && len > 1) {
            json_t *t = json_stringn(s + i, (size_t)len); /* overlongs and surrogates */
            ok = t != NULL;
            json_decref(t);
        }
        if (ok) {
            memcpy(o + k, s + i, (size_t)len);
            k += (size_t)len;
            i += (size_t)len;
        } else {
            memcpy(o + k, "\xef\xbf\xbd", 3);
            k += 3;
            i++;
        }
    }
    j = json_stringn(o, k);
    fy_free(o);
    return j ? j : json_string("");
}

static json_t *error_body_msg(const char *type, const char *param, const char *code, const char *msg)
{
    json_t *e = json_object();
    json_object_set_new(e, "message", jstr(msg, strlen(msg)));
    json_object_set_new(e, "type", json_string(type));
    json_object_set_new(e, "param", param ? json_string(param) : json_null());
    json_object_set_new(e, "code", code ? json_string(code) : json_null());
    json_t *o = json_object();
    json_object_set_new(o, "error", e);
    return o;
}

static int class_of(uint16_t status)
{
    if (status < 300) return 0;
    if (status == 400) return 1;
    if (status == 429) return 3;
    if (status >= 500) return 4;
    return 2;
}

/* A whole JSON answer (body taken), with Retry-After when retry_after > 0. */
static void answer_json(fy_http_t *H, fy_httpd_req_t *r, uint16_t status, json_t *body, double retry_after)
{
    char *txt = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    char ra[32];
    snprintf(ra, sizeof(ra), "%.0f", ceil(retry_after));
    const char *hdr[] = {"Retry-After", ra, NULL};
    if (!txt) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}";
        fy_httpd_answer(r, 500, "application/json", NULL, oom, sizeof(oom) - 1);
        fy_metric_inc(H->responses[class_of(500)]);
        return;
    }
    fy_httpd_answer(r, status, "application/json", retry_after > 0 ? hdr : NULL, txt, strlen(txt));
    free(txt);
    fy_metric_inc(H->responses[class_of(status)]);
}

static void respond_error(fy_http_t *H, fy_httpd_req_t *r, uint16_t status, const char *type, const char *param,
                          double retry_after, const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static void respond_error(fy_http_t *H, fy_httpd_req_t *r, uint16_t status, const char *type, const char *param,
                          double retry_after, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char msg[512];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    answer_json(H, r, status, error_body_msg(type, param, NULL, msg), retry_after);
}

/* A body the parser refused (st FY_ERR_INVALID: *f says why), or 500. */
static void respond_fault(fy_http_t *H, fy_httpd_req_t *r, fy_status_t st, const fy_http_fault_t *f)
{
    if (st == FY_ERR_INVALID)
        answer_json(H, r, f->status, error_body_msg(f->type, f->param, f->code, f->msg), 0);
    else
        respond_error(H, r, 500, "server_error", NULL, 0, "out of memory");
}

/* Server thread: the parse workers' queue is full (or the router is
 * stopping), answered at once: the client comes back later. */
static void refuse_busy(fy_http_t *H, fy_httpd_req_t *r, fy_status_t st)
{
    respond_error(H, r, 503, "server_overloaded", NULL, H->retry_after_s > 0 ? H->retry_after_s : 1, "%s",
                  st == FY_ERR_CANCELLED ? "the server is shutting down; try again shortly"
                                         : "overloaded: every prompt parser is busy and their queue is full; try "
                                           "again shortly");
}

/* ---- generations ------------------------------------------------------------------------------------ */

static bool wappend(hreq_t *h, const char *s, size_t n)
{
    if (h->wlen + n + 1 > h->wcap) {
        size_t cap = (h->wlen + n + 1) * 2;
        char *b = fy_realloc(h->wbuf, cap);
        if (!b) return false;
        h->wbuf = b;
        h->wcap = cap;
    }
    memcpy(h->wbuf + h->wlen, s, n);
    h->wlen += n;
    h->wbuf[h->wlen] = 0;
    return true;
}

static void wappend_json(hreq_t *h, const char *prefix, json_t *j, const char *suffix)
{
    char *t = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!t) return;
    wappend(h, prefix, strlen(prefix));
    wappend(h, t, strlen(t));
    wappend(h, suffix, strlen(suffix));
    free(t);
}

static const char *finish_reason(const char *f)
{
    if (!strcmp(f, "length") || !strcmp(f, "context")) return "length";
    return "stop"; /* stop string, end of turn */
}

static uint16_t status_of(fy_status_t st)
{
    switch (st) {
    case FY_ERR_INVALID:
    case FY_ERR_FORMAT: return 400;
    case FY_ERR_OVERLOADED:
    case FY_ERR_NO_SPACE:
    case FY_ERR_CANCELLED: return 503; /* cancelled: the router is shutting down */
    case FY_ERR_TIMEOUT: return 504;
    case FY_ERR_PEER: return 502;
    default: return 500;
    }
}

/* Sample i's view: the router's, or the error that kept it from starting. */
static bool h_view(hreq_t *h, int i, fy_router_view_t *v)
{
    if (h->sample_err[i]) {
        memset(v, 0, sizeof(*v));
        v->done = true;
        v->error = h->sample_err[i];
        v->message = h->sample_msg[i];
        v->text = "";
        v->finish = "";
        return true;
    }
    if (!h->ids[i] || !fy_router_view(h->H->R, h->ids[i], v)) return false;
    if (h->echo_only) { /* max_tokens 0: the one token made is not the client's */
        v->n_tokens = 0;
        v->text_len = 0;
        if (v->done && v->error == FY_OK) v->finish = "length";
    }
    return true;
}

/* ---- echo and prompt logprobs -------------------------------------------------------------------------- */

/* The prompt as text (echo): its tokens decoded, special ones left out.
 * NULL when out of memory; fy_free it. */
static char *prompt_text(const hreq_t *h, const fy_router_view_t *v, size_t *len_p)
{
    const fy_tokenizer_t *tok = fy_model_tokenizer(fy_router_model(h->H->R));
    char one[1];
    size_t need = fy_tokenizer_decode(tok, v->prompt_tokens, (size_t)v->n_prompt, false, one, sizeof(one));
    char *s = fy_malloc(need + 1);
    if (s) *len_p = fy_tokenizer_decode(tok, v->prompt_tokens, (size_t)v->n_prompt, false, s, need + 1);
    return s;
}

/* A token's text as the logprobs name it (and its length in bytes). */
static json_t *token_str(const fy_tokenizer_t *tok, int32_t id, size_t *len_p)
{
    const char *b;
    size_t bl;
    fy_tokenizer_token_bytes(tok, id, true, &b, &bl);
    if (len_p) *len_p = bl;
    return jstr(b, bl);
}

static size_t token_len(const fy_tokenizer_t *tok, int32_t id)
{
    const char *b;
    size_t bl;
    fy_tokenizer_token_bytes(tok, id, true, &b, &bl);
    return bl;
}

/* vLLM's prompt_logprobs: null for the first prompt token, then for each
 * a map of token ids to {logprob, rank, decoded_token}: its own token and
 * the plp_top most likely ones. */
static json_t *prompt_logprobs_json(const hreq_t *h, const fy_router_view_t *v)
{
    if (!v->plp_ready) return json_null();
    const fy_tokenizer_t *tok = fy_model_tokenizer(fy_router_model(h->H->R));
    json_t *list = json_array();
    json_array_append_new(list, json_null());
    int32_t K = v->plp_k, k_out = h->plp_top < K ? h->plp_top : K;
    for (int32_t i = 1; i < v->n_prompt; i++) {
        json_t *d = json_object();
        for (int32_t k = -1; k < k_out; k++) {
            int32_t id = k < 0 ? v->prompt_tokens[i] : v->plp_ids[(size_t)i * (size_t)K + (size_t)k];
            char key[16];
            snprintf(key, sizeof(key), "%d", id);
            if (k >= 0 && json_object_get(d, key)) continue; /* the prompt's own token, already there */
            json_t *e = json_object();
            json_object_set_new(e, "logprob",
                                json_real(k < 0 ? v->plp[i] : v->plp_tlps[(size_t)i * (size_t)K + (size_t)k]));
            json_object_set_new(e, "rank", json_integer(k < 0 ? v->plp_rank[i] : k + 1));
            json_object_set_new(e, "decoded_token", token_str(tok, id, NULL));
            json_object_set_new(d, key, e);
        }
        json_array_append_new(list, d);
    }
    return list;
}

/* The prompt's entries of a completion's logprobs (echo), appended to its
 * arrays: the first token's logprob and alternatives null, the others'
 * alternatives the top_logprobs most likely and the token itself. */
static void echo_logprobs(const hreq_t *h, const fy_router_view_t *v, json_t *list, json_t *lps, json_t *tops,
                          json_t *offs, size_t *off)
{
    const fy_tokenizer_t *tok = fy_model_tokenizer(fy_router_model(h->H->R));
    int32_t K = v->plp_k, k_out = h->gen.top_logprobs < K ? h->gen.top_logprobs : K;
    for (int32_t i = 0; i < v->n_prompt; i++) {
        size_t bl;
        int32_t id = v->prompt_tokens[i];
        json_array_append_new(list, token_str(tok, id, &bl));
        json_array_append_new(offs, json_integer((json_int_t)*off));
        *off += bl;
        bool have = i > 0 && v->plp_ready;
        json_array_append_new(lps, have ? json_real(v->plp[i]) : json_null());
        if (!json_is_array(tops)) continue;
        if (!have) {
            json_array_append_new(tops, json_null());
            continue;
        }
        json_t *alt = json_object();
        for (int32_t k = -1; k < k_out; k++) {
            int32_t t = k < 0 ? id : v->plp_ids[(size_t)i * (size_t)K + (size_t)k];
            json_t *key = token_str(tok, t, NULL);
            const char *ks = json_string_value(key);
            if (ks && !json_object_get(alt, ks))
                json_object_set_new(alt, ks,
                                    json_real(k < 0 ? v->plp[i] : v->plp_tlps[(size_t)i * (size_t)K + (size_t)k]));
            json_decref(key);
        }
        json_array_append_new(tops, alt);
    }
}

/* Chat's {token, logprob, bytes} of one token. */
static json_t *chat_token_json(const fy_tokenizer_t *tok, int32_t id, double lp)
{
    const char *b;
    size_t bl;
    fy_tokenizer_token_bytes(tok, id, true, &b, &bl);
    json_t *e = json_object(), *bytes = json_array();
    for (size_t k = 0; k < bl; k++) json_array_append_new(bytes, json_integer((unsigned char)b[k]));
    json_object_set_new(e, "token", jstr(b, bl));
    json_object_set_new(e, "logprob", json_real(lp));
    json_object_set_new(e, "bytes", bytes);
    return e;
}

/* Tokens [from, to) of a sample's logprobs; a completion's with echo also
 * the prompt's, first (prompt), and text_offset counts the prompt. */
static json_t *logprobs_json(const hreq_t *h, const fy_router_view_t *v, int32_t from, int32_t to, bool prompt)
{
    const fy_tokenizer_t *tok = fy_model_tokenizer(fy_router_model(h->H->R));
    json_t *list = json_array(), *lps = json_array(), *tops = v->top_k ? json_array() : json_null();
    json_t *offs = json_array();
    /* text_offset: where each token's text starts in the choice's text */
    size_t off = 0, bl;
    if (!h->chat && prompt)
        echo_logprobs(h, v, list, lps, tops, offs, &off);
    else if (h->echo)
        for (int32_t i = 0; i < v->n_prompt; i++) off += token_len(tok, v->prompt_tokens[i]);
    if (!h->chat)
        for (int32_t i = 0; i < from; i++) off += token_len(tok, v->tokens[i]);
    for (int32_t i = from; i < to; i++) {
        const char *b;
        fy_tokenizer_token_bytes(tok, v->tokens[i], true, &b, &bl);
        double lp = v->logprobs ? v->logprobs[i] : 0;
        /* the alternatives: chat, a list of {token, logprob, bytes};
         * completions, a {token text: logprob} map per position */
        int32_t nt = v->top_k ? v->n_top[i] : 0;
        const int32_t *ti = v->top_k ? v->top_ids + (size_t)i * (size_t)v->top_k : NULL;
        const float *tl = v->top_k ? v->top_logprobs + (size_t)i * (size_t)v->top_k : NULL;
        if (h->chat) {
            json_t *e = chat_token_json(tok, v->tokens[i], lp), *alt = json_array();
            for (int32_t k = 0; k < nt; k++) json_array_append_new(alt, chat_token_json(tok, ti[k], tl[k]));
            json_object_set_new(e, "top_logprobs", alt);
            json_array_append_new(list, e);
        } else {
            json_array_append_new(list, jstr(b, bl));
            json_array_append_new(lps, json_real(lp));
            json_array_append_new(offs, json_integer((json_int_t)off));
            off += bl;
            if (v->top_k) {
                json_t *alt = json_object();
                for (int32_t k = 0; k < nt; k++) {
                    const char *ab;
                    size_t abl;
                    fy_tokenizer_token_bytes(tok, ti[k], true, &ab, &abl);
                    json_t *key = jstr(ab, abl); /* valid UTF-8, as a key must be */
                    const char *ks = json_string_value(key);
                    if (ks && !json_object_get(alt, ks)) json_object_set_new(alt, ks, json_real(tl[k]));
                    json_decref(key);
                }
                json_array_append_new(tops, alt);
            }
        }
    }
    json_t *o = json_object();
    if (h->chat) {
        json_object_set_new(o, "content", list);
        json_decref(lps);
        json_decref(tops);
        json_decref(offs);
    } else {
        json_object_set_new(o, "tokens", list);
        json_object_set_new(o, "token_logprobs", lps);
        json_object_set_new(o, "top_logprobs", tops);
        json_object_set_new(o, "text_offset", offs);
    }
    return o;
}

static json_t *envelope(const hreq_t *h, bool chunk)
{
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(h->oid));
    json_object_set_new(
        o, "object", json_string(h->chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"));
    json_object_set_new(o, "created", json_integer((json_int_t)h->created));
    json_object_set_new(o, "model", json_string(h->H->served));
    return o;
}

/* A prompt array's usage sums its prompts' (each counted once, however
 * many samples it has). */
static json_t *usage_json(hreq_t *h)
{
    int64_t completion = 0, prompt = 0, cached = 0;
    for (int p = 0; p < h->n_prompts; p++) {
        int32_t pp = 0, pc = 0;
        for (int i = p * h->per; i < (p + 1) * h->per; i++) {
            fy_router_view_t v;
            if (!h_view(h, i, &v)) continue;
            completion += v.n_tokens;
            if (v.n_prompt) pp = v.n_prompt;
            if (v.cached > pc) pc = v.cached;
        }
        prompt += pp;
        cached += pc;
    }
    json_t *u = json_object(), *d = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer(prompt));
    json_object_set_new(u, "completion_tokens", json_integer(completion));
    json_object_set_new(u, "total_tokens", json_integer(prompt + completion));
    json_object_set_new(d, "cached_tokens", json_integer(cached));
    json_object_set_new(u, "prompt_tokens_details", d);
    return u;
}

/* Sample i's tool-call parser, fed with its text so far (NULL: the
 * request has no tools, or out of memory: then the text is all content). */
static fy_tools_stream_t *h_tools(hreq_t *h, int i, const fy_router_view_t *v)
{
    if (!h->chat || h->tool_choice == FY_TOOL_CHOICE_NONE) return NULL;
    if (!h->tools[i] && fy_tools_stream_create(h->tool_choice, h->tool_format, h->tool_named, h->tool_names,
                                               h->tool_parallel, &h->tools[i]) != FY_OK)
        return NULL;
    if (fy_tools_stream_feed(h->tools[i], v->text, v->text_len, v->done && v->error == FY_OK) != FY_OK) {
        fy_tools_stream_destroy(h->tools[i]);
        h->tools[i] = NULL;
        fy_error("http %s: out of memory reading tool calls; the answer goes out as text", h->oid);
    }
    return h->tools[i];
}

/* Chat with a reasoning parser: sample i's answer split.  v's text
 * becomes the content alone (nothing while the answer thinks), which the
 * tool-call parser and the content chunks read as they read a whole
 * answer; *r_p and *rl_p the reasoning sure so far.  false: no parser,
 * v untouched. */
static bool h_split(hreq_t *h, int i, fy_router_view_t *v, const char **r_p, size_t *rl_p)
{
    if (!h->chat || h->reasoning == FY_REASONING_NONE) return false;
    fy_reasoning_feed(&h->think[i], v->text, v->text_len, v->done);
    size_t from, to, cf;
    fy_reasoning_span(&h->think[i], &from, &to);
    *r_p = v->text + from;
    *rl_p = to - from;
    if (fy_reasoning_content_from(&h->think[i], &cf)) {
        v->text += cf;
        v->text_len -= cf;
    } else {
        v->text_len = 0;
    }
    return true;
}

/* The reasoning under both the names clients read: "reasoning" (vLLM's
 * newer name, after OpenAI's advice for chain of thought) and
 * "reasoning_content" (DeepSeek's, which LiteLLM and most SDKs read). */
static void set_reasoning(json_t *o, json_t *text)
{
    json_object_set(o, "reasoning", text);
    json_object_set_new(o, "reasoning_content", text);
}

/* The finish reason of a done sample: "tool_calls" when it made calls
 * (unless cut short by max_tokens: "length", as OpenAI says). */
static const char *h_finish(const fy_tools_stream_t *ts, const fy_router_view_t *v)
{
    const char *f = finish_reason(v->finish);
    return ts && fy_tools_stream_n_calls(ts) && strcmp(f, "length") ? "tool_calls" : f;
}

/* Content that is only white space before a call is no content. */
static bool blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\n' && s[i] != '\r' && s[i] != '\t') return false;
    return true;
}

static void stream_chunk_delta(hreq_t *h, int i, const char *text, size_t len, json_t *lp, const char *fin, bool role,
                               json_t *tool_calls);

/* Why choice i failed; a prompt array's message names the choice and its
 * prompt, so that the client knows which of its prompts had no answer. */
static json_t *choice_message(const hreq_t *h, int i, const fy_router_view_t *v)
{
    if (h->n_prompts <= 1) return jstr(v->message, strlen(v->message));
    char m[256];
    snprintf(m, sizeof(m), "choice %d ('prompt'[%d]): %s", i, i / h->per, v->message);
    return jstr(m, strlen(m));
}

static void stream_chunk(hreq_t *h, int i, const char *text, size_t len, json_t *lp, const char *fin, bool role)
{
    stream_chunk_delta(h, i, text, len, lp, fin, role, NULL);
}

/* One chunk of choice i; tool_calls (stolen; NULL: none) go in its delta. */
static void stream_chunk_delta(hreq_t *h, int i, const char *text, size_t len, json_t *lp, const char *fin, bool role,
                               json_t *tool_calls)
{
    json_t *o = envelope(h, true), *ch = json_object();
    json_object_set_new(ch, "index", json_integer(i));
    if (h->chat) {
        json_t *delta = json_object();
        if (role) json_object_set_new(delta, "role", json_string("assistant"));
        if (len || role) json_object_set_new(delta, "content", jstr(text, len));
        if (tool_calls) json_object_set_new(delta, "tool_calls", tool_calls);
        json_object_set_new(ch, "delta", delta);
    } else {
        json_object_set_new(ch, "text", jstr(text, len));
    }
    json_object_set_new(ch, "logprobs", lp ? lp : json_null());
    json_object_set_new(ch, "finish_reason", fin ? json_string(fin) : json_null());
    json_t *arr = json_array();
    json_array_append_new(arr, ch);
    json_object_set_new(o, "choices", arr);
    wappend_json(h, "data: ", o, "\n\n");
}

/* One chunk of choice i with reasoning (len > 0) in its delta. */
static void stream_reasoning(hreq_t *h, int i, const char *text, size_t len)
{
    json_t *o = envelope(h, true), *ch = json_object(), *delta = json_object();
    json_object_set_new(ch, "index", json_integer(i));
    set_reasoning(delta, jstr(text, len));
    json_object_set_new(ch, "delta", delta);
    json_object_set_new(ch, "logprobs", json_null());
    json_object_set_new(ch, "finish_reason", json_null());
    json_t *arr = json_array();
    json_array_append_new(arr, ch);
    json_object_set_new(o, "choices", arr);
    wappend_json(h, "data: ", o, "\n\n");
}

/* What is new for the client, as SSE chunks; the [DONE] after the last. */
static void build_stream(hreq_t *h)
{
    if (!h->head_sent) { /* (the status and headers went with fy_httpd_stream_begin) */
        h->head_sent = true;
        if (h->chat)
            for (int i = 0; i < h->n; i++) stream_chunk(h, i, "", 0, NULL, NULL, true);
    }
    for (int i = 0; i < h->n; i++) {
        fy_router_view_t v;
        if (h->done_sent[i] || !h_view(h, i, &v)) continue;
        /* a thinking answer: its reasoning first, as it becomes sure */
        const char *rt;
        size_t rl;
        if (h_split(h, i, &v, &rt, &rl) && rl > h->from_reason[i]) {
            if (h->include_reasoning) stream_reasoning(h, i, rt + h->from_reason[i], rl - h->from_reason[i]);
            h->from_reason[i] = rl;
        }
        /* with tools, the content the parser is sure of, then the calls'
         * deltas as they grow (what may begin a call is held back) */
        fy_tools_stream_t *ts = h_tools(h, i, &v);
        size_t avail = ts ? fy_tools_stream_content(ts, v.text) : v.text_len;
        if (avail < h->from_text[i]) avail = h->from_text[i];
        /* echo: the prompt first, with its logprobs (in before the first token) */
        if (h->echo && !h->echo_sent[i] && (v.t_first || v.done) && v.error == FY_OK) {
            size_t pl = 0;
            char *pt = prompt_text(h, &v, &pl);
            stream_chunk(h, i, pt ? pt : "", pt ? pl : 0, h->logprobs ? logprobs_json(h, &v, 0, 0, true) : NULL, NULL,
                         false);
            fy_free(pt);
            h->echo_sent[i] = true;
        }
        bool more_text = avail > h->from_text[i], more_tok = v.n_tokens > h->from_tok[i];
        if (more_text || (more_tok && h->logprobs)) {
            json_t *lp = h->logprobs ? logprobs_json(h, &v, h->from_tok[i], v.n_tokens, false) : NULL;
            const char *t = v.text + h->from_text[i];
            stream_chunk(h, i, t, avail - h->from_text[i], lp, NULL, false);
        }
        h->from_text[i] = avail;
        h->from_tok[i] = v.n_tokens;
        json_t *deltas = ts ? fy_tools_stream_deltas(ts) : NULL;
        for (size_t k = 0; k < json_array_size(deltas); k++) { /* one chunk each, as OpenAI sends them */
            json_t *one = json_array();
            json_array_append(one, json_array_get(deltas, k));
            stream_chunk_delta(h, i, "", 0, NULL, NULL, false, one);
        }
        json_decref(deltas);
        if (!v.done) continue;
        if (v.error == FY_OK) {
            stream_chunk(h, i, "", 0, NULL, h_finish(ts, &v), false);
        } else { /* the choice ends (vLLM's "abort"), then what ended it */
            stream_chunk(h, i, "", 0, NULL, "abort", false);
            json_t *e = json_object();
            json_t *eb = json_object();
            json_object_set_new(eb, "message", choice_message(h, i, &v));
            json_object_set_new(eb, "type", json_string(fy_status_tag(v.error)));
            json_object_set_new(eb, "param", json_null());
            json_object_set_new(eb, "code", json_integer(status_of(v.error)));
            json_object_set_new(e, "error", eb);
            wappend_json(h, "data: ", e, "\n\n");
        }
        h->done_sent[i] = true;
        h->n_done_sent++;
    }
    if (h->n_done_sent == h->n && !h->final) {
        if (h->include_usage) {
            json_t *o = envelope(h, true);
            json_object_set_new(o, "choices", json_array());
            json_object_set_new(o, "usage", usage_json(h));
            wappend_json(h, "data: ", o, "\n\n");
        }
        static const char done[] = "data: [DONE]\n\n";
        wappend(h, done, sizeof(done) - 1);
        h->final = true;
    }
}

/* The whole answer as one JSON body (503s with Retry-After); the end. */
static void raw_response(hreq_t *h, uint16_t status, json_t *body)
{
    h->final = true;
    answer_json(h->H, h->r, status, body, status == 503 ? h->H->retry_after_s : 0);
}

/* ---- the Responses API (router/responses.h): its one sample's text and tool calls as its output items */

static bool resp_write(void *arg, const char *s, size_t n) { return wappend(arg, s, n); }

/* What is new as the Responses stream's events (no [DONE]: its last
 * event is the response's end). */
static void resp_stream(hreq_t *h)
{
    fy_router_view_t v;
    if (!h_view(h, 0, &v)) return;
    fy_tools_stream_t *ts = h_tools(h, 0, &v);
    size_t avail = ts ? fy_tools_stream_content(ts, v.text) : v.text_len;
    if (avail < h->from_text[0]) avail = h->from_text[0];
    fy_responses_stream_text(h->resp, v.text + h->from_text[0], avail - h->from_text[0], resp_write, h);
    h->from_text[0] = avail;
    json_t *deltas = ts ? fy_tools_stream_deltas(ts) : NULL;
    if (deltas) fy_responses_stream_calls(h->resp, deltas, resp_write, h);
    json_decref(deltas);
    if (!v.done) return;
    json_t *usage = usage_json(h);
    fy_responses_stream_end(h->resp, v.error == FY_OK ? h_finish(ts, &v) : NULL, usage,
                            v.error == FY_OK ? NULL : v.message, resp_write, h);
    json_decref(usage);
    h->final = true;
}

/* The whole response of a done sample (v). */
static void resp_whole(hreq_t *h, const fy_router_view_t *v)
{
    fy_tools_stream_t *ts = h_tools(h, 0, v);
    size_t clen = ts ? fy_tools_stream_content(ts, v->text) : v->text_len;
    json_t *calls = ts && fy_tools_stream_n_calls(ts) ? fy_tools_stream_calls(ts) : NULL;
    json_t *usage = usage_json(h);
    json_t *o = fy_responses_whole(h->resp, v->text, clen, calls, h_finish(ts, v), usage);
    json_decref(usage);
    json_decref(calls);
    if (o)
        raw_response(h, 200, o);
    else
        raw_response(h, 500, error_body_msg("server_error", NULL, NULL, "out of memory"));
}

/* The whole answer, once every sample is done. */
static void build_whole(hreq_t *h)
{
    fy_router_view_t v;
    for (int i = 0; i < h->n; i++)
        if (!h_view(h, i, &v) || !v.done) return;
    json_t *choices = json_array();
    for (int i = 0; i < h->n; i++) {
        h_view(h, i, &v);
        if (v.error != FY_OK) {
            json_decref(choices);
            json_t *e = json_object(), *eb = json_object();
            json_object_set_new(eb, "message", choice_message(h, i, &v));
            json_object_set_new(eb, "type", json_string(fy_status_tag(v.error)));
            json_object_set_new(eb, "param", json_null());
            json_object_set_new(eb, "code", json_null());
            json_object_set_new(e, "error", eb);
            raw_response(h, status_of(v.error), e);
            return;
        }
        if (h->resp) { /* the Responses API's answer (its n is 1) */
            json_decref(choices);
            resp_whole(h, &v);
            return;
        }
        json_t *c = json_object();
        json_object_set_new(c, "index", json_integer(i));
        const char *rt = NULL;
        size_t rl = 0;
        bool split = h_split(h, i, &v, &rt, &rl), thought = split && fy_reasoning_thought(&h->think[i]);
        fy_tools_stream_t *ts = h_tools(h, i, &v);
        size_t clen = ts ? fy_tools_stream_content(ts, v.text) : v.text_len;
        json_t *calls = ts && fy_tools_stream_n_calls(ts) ? fy_tools_stream_calls(ts) : NULL;
        if (h->chat) {
            json_t *msg = json_object();
            json_object_set_new(msg, "role", json_string("assistant"));
            /* null: calls alone, or thinking alone (vLLM's) */
            json_object_set_new(msg, "content",
                                (calls && blank(v.text, clen)) || (thought && !clen) ? json_null()
                                                                                     : jstr(v.text, clen));
            if (split && h->include_reasoning) set_reasoning(msg, thought ? jstr(rt, rl) : json_null());
            if (calls) json_object_set_new(msg, "tool_calls", calls);
            json_object_set_new(c, "message", msg);
        } else if (h->echo) { /* the prompt, then the completion */
            size_t pl = 0;
            char *pt = prompt_text(h, &v, &pl), *all = pt ? fy_malloc(pl + v.text_len + 1) : NULL;
            if (all) {
                memcpy(all, pt, pl);
                memcpy(all + pl, v.text, v.text_len);
            }
            json_object_set_new(c, "text", all ? jstr(all, pl + v.text_len) : jstr(v.text, v.text_len));
            fy_free(all);
            fy_free(pt);
        } else {
            json_object_set_new(c, "text", jstr(v.text, v.text_len));
        }
        json_object_set_new(c, "logprobs", h->logprobs ? logprobs_json(h, &v, 0, v.n_tokens, h->echo) : json_null());
        if (h->plp && !h->chat) json_object_set_new(c, "prompt_logprobs", prompt_logprobs_json(h, &v));
        json_object_set_new(c, "finish_reason", json_string(h_finish(ts, &v)));
        json_array_append_new(choices, c);
    }
    json_t *o = envelope(h, false);
    json_object_set_new(o, "choices", choices);
    json_object_set_new(o, "usage", usage_json(h));
    if (h->plp && h->chat) { /* chat's are the response's (vLLM's): the prompt is one */
        h_view(h, 0, &v);
        json_object_set_new(o, "prompt_logprobs", prompt_logprobs_json(h, &v));
    }
    raw_response(h, 200, o);
}

/* Lock held.  Lets go of the router's requests (cancelling those still
 * running when the client is gone) and of the tenant's share. */
static void h_release(hreq_t *h, bool cancel)
{
    if (h->released) return;
    h->released = true;
    int64_t generated = 0;
    /* vLLM's max_num_generation_tokens: once per prompt (vLLM counts a
     * prompt array's prompts as requests of their own) whose samples all
     * finished; choice i is prompt i / per's */
    int32_t most[MAX_N] = {0};
    bool finished[MAX_N];
    int per = h->per > 0 ? h->per : 1;
    for (int i = 0; i < h->n; i++) {
        fy_router_view_t v;
        bool seen = h_view(h, i, &v);
        int p = i / per;
        if (i % per == 0) finished[p] = true;
        finished[p] = finished[p] && h->ids[i] && seen && v.done && v.error == FY_OK;
        if (seen && v.n_tokens > most[p]) most[p] = v.n_tokens;
        if (h->ids[i] && fy_router_view(h->H->R, h->ids[i], &v)) generated += v.n_tokens;
        if (h->ids[i]) fy_router_detach(h->H->R, h->ids[i], cancel);
    }
    for (int p = 0; p * per < h->n; p++)
        if (finished[p]) fy_router_observe_max_generation(h->H->R, most[p]);
    if (h->tenant) {
        int64_t unused = h->max_tokens * h->n - generated;
        fy_tenant_release(h->tenant, h->n, unused > 0 ? unused : 0, fy_now_s());
    }
}

static void watch(void *arg);

/* Lock held.  The other choices: each prompt's first at once, its other
 * samples once that one's prompt is cached.  Sample k of a prompt has the
 * seed plus k, as it would in a request of that prompt alone. */
static void h_submit_rest(hreq_t *h)
{
    if (h->n_submitted >= h->n || !h->r) return;
    const char *tname = h->tenant ? fy_tenant_name(h->tenant) : "";
    for (int i = 1; i < h->n; i++) {
        fy_router_view_t v;
        int p = i / h->per, k = i % h->per;
        if (h->ids[i] || h->sample_err[i]) continue; /* submitted */
        if (k && (!h_view(h, i - k, &v) || (!v.t_first && !v.done))) continue;
        int32_t len = h->prompt_off[p + 1] - h->prompt_off[p];
        int32_t *copy = fy_malloc((size_t)len * sizeof(int32_t));
        fy_genspec_t gi = h->gen;
        gi.sampling.seed += (uint64_t)k;
        fy_status_t st = FY_ERR_NOMEM;
        snprintf(h->sample_msg[i], sizeof(h->sample_msg[i]), "router out of memory");
        if (copy) {
            memcpy(copy, h->prompt + h->prompt_off[p], (size_t)len * sizeof(int32_t));
            st = fy_router_submit_locked(h->H->R, tname, copy, len, &gi, 0, watch, h, &h->ids[i], h->sample_msg[i],
                                         sizeof(h->sample_msg[i]));
        }
        h->sample_err[i] = st;
        h->n_submitted++;
    }
}

/* Lock held.  Hands the server what is new: a stream's next events (and
 * its end), or the whole answer once every sample is done. */
static void h_pump(hreq_t *h)
{
    if (!h->ready || !h->r || h->final) return;
    h_submit_rest(h);
    if (!h->stream) {
        build_whole(h); /* answers when every sample is done */
    } else {
        h->wlen = 0;
        if (h->resp)
            resp_stream(h);
        else
            build_stream(h);
        if (h->wlen && fy_httpd_stream_write(h->r, h->wbuf, h->wlen) != FY_OK)
            return; /* the client is gone (or reads nothing): end() follows */
        if (h->final) fy_httpd_stream_end(h->r);
    }
    if (h->final) h_release(h, false);
}

static void watch(void *arg) { h_pump(arg); }

static void hreq_free(hreq_t *h)
{
    fy_free(h->wbuf);
    fy_free(h->prompt);
    for (int i = 0; i < MAX_N; i++) fy_tools_stream_destroy(h->tools[i]);
    fy_free(h->tool_names);
    fy_free(h->body);
    fy_responses_free(h->resp);
    fy_free(h);
}

/* Lock held: its requests end (if still running), their blocks go back,
 * and it is no longer live. */
static void h_unlist(hreq_t *h)
{
    fy_http_t *H = h->H;
    h_release(h, true);
    if (!h->listed) return;
    h->listed = false;
    if (h->prev)
        h->prev->next = h->next;
    else
        H->live = h->next;
    if (h->next) h->next->prev = h->prev;
    H->n_live--;
}

/* Server thread: the generation's answer went out (complete), or its
 * client left first.  Where a generation is freed (or, while its body
 * waits for a parse worker, that worker). */
static void h_end(void *arg, bool complete)
{
    hreq_t *h = arg;
    fy_http_t *H = h->H;
    fy_router_lock(H->R);
    h->r = NULL;
    if (h->parsing) { /* its parse worker sees the client gone and frees it */
        fy_router_unlock(H->R);
        return;
    }
    if (!complete && !H->stopping && h->listed) {
        fy_metric_inc(H->responses[5]);
        fy_info("http %s: the client went away%s", h->oid, h->final ? " before the answer was out" : "; cancelling");
    }
    h_unlist(h);
    fy_router_unlock(H->R);
    hreq_free(h);
}

/* ---- handlers ------------------------------------------------------------------------------------- */

/* A JSON body's Content-Type; false with a 415 answered. */
static bool json_body(fy_http_t *H, fy_httpd_req_t *r)
{
    const char *ct = fy_httpd_req_header(r, "Content-Type");
    if (!ct || strncasecmp(ct, "application/json", 16) || (ct[16] && ct[16] != ';' && ct[16] != ' ')) {
        respond_error(H, r, 415, "invalid_request_error", NULL, 0,
                      "the body must be JSON with Content-Type: application/json (got %s)", ct ? ct : "none");
        return false;
    }
    return true;
}

/* The pool's context now (lock NOT held): what max_model_len says and
 * what a request must fit. */
static int32_t pool_ctx(const fy_http_t *H)
{
    fy_router_lock(H->R);
    int32_t ctx = fy_router_pool_ctx(H->R);
    fy_router_unlock(H->R);
    return ctx;
}

/* Lock NOT held. */
static fy_http_front_t front_of(const fy_http_t *H)
{
    int32_t ctx = pool_ctx(H), model_ctx = fy_router_max_ctx(H->R);
    size_t bytes = fy_router_max_prompt_bytes(H->R); /* the model's context's: a token's most bytes times it */
    return (fy_http_front_t){.model = fy_router_model(H->R),
                             .model_id = fy_router_model_id(H->R),
                             .served = H->served,
                             .max_ctx = ctx,
                             .max_prompt_bytes = bytes / (size_t)model_ctx * (size_t)ctx,
                             .default_max_tokens = H->default_max_tokens,
                             .grammars = H->grammars,
                             .reasoning_parser = H->reasoning_parser};
}

/* The tenant of the request's key; false with a 401 sent when keys are
 * configured and this one is missing or unknown. */
static bool authenticate(fy_http_t *H, fy_httpd_req_t *r, fy_tenant_t **t_p)
{
    *t_p = NULL;
    if (!H->tenants) return true;
    const char *a = fy_httpd_req_header(r, "Authorization");
    if (!a || strncasecmp(a, "Bearer ", 7)) {
        respond_error(H, r, 401, "authentication_error", NULL, 0, "an API key is required: Authorization: Bearer KEY");
        return false;
    }
    const char *k = a + 7;
    while (*k == ' ') k++;
    fy_router_lock(H->R);
    fy_tenant_t *t = fy_tenants_find(H->tenants, k, strlen(k));
    fy_router_unlock(H->R);
    if (!t) {
        respond_error(H, r, 401, "authentication_error", NULL, 0, "invalid API key");
        return false;
    }
    *t_p = t;
    return true;
}

static void refuse_draining(fy_http_t *H, fy_httpd_req_t *r)
{
    respond_error(H, r, 503, "server_error", NULL, H->retry_after_s > 0 ? H->retry_after_s : 1,
                  "the server is shutting down; try again shortly (another replica, or this one once restarted)");
}

/* h takes g's settings, with its own copy of the prompt when it has
 * more samples to submit later; false when out of memory. */
static bool hreq_fill(hreq_t *h, fy_http_gen_t *g)
{
    bool chat = h->chat;
    int choices = g->n * g->n_prompts;
    if (choices > 1 && !(h->prompt = fy_malloc((size_t)g->n_prompt * sizeof(int32_t)))) return false;
    if (h->prompt) memcpy(h->prompt, g->ids, (size_t)g->n_prompt * sizeof(int32_t));
    h->n_prompts = g->n_prompts;
    for (int p = 0; p < g->n_prompts; p++) h->prompt_off[p + 1] = h->prompt_off[p] + g->prompt_len[p];
    h->stream = g->stream;
    h->include_usage = g->include_usage;
    h->logprobs = g->gen.logprobs;
    h->echo = g->echo;
    h->echo_only = g->echo_only;
    h->plp = g->prompt_logprobs;
    h->plp_top = g->prompt_top;
    h->tool_choice = g->tool_choice;
    h->tool_format = g->tool_format;
    memcpy(h->tool_named, g->tool_named, sizeof(h->tool_named));
    h->tool_names = g->tool_names; /* (h's now) */
    g->tool_names = NULL;
    h->tool_parallel = g->tool_parallel;
    h->reasoning = g->reasoning;
    h->include_reasoning = g->include_reasoning;
    for (int i = 0; i < MAX_N; i++) fy_reasoning_init(&h->think[i], g->reasoning);
    h->n = choices;
    h->per = g->n;
    h->max_tokens = g->gen.max_tokens;
    h->gen = g->gen;
    h->n_prompt = g->n_prompt;
    h->n_submitted = 1;
    h->created = time(NULL);
    uint8_t rnd[12];
    randombytes_buf(rnd, sizeof(rnd));
    int k = snprintf(h->oid, sizeof(h->oid), "%s-", chat ? "chatcmpl" : "cmpl");
    for (size_t i = 0; i < sizeof(rnd); i++) k += snprintf(h->oid + k, sizeof(h->oid) - (size_t)k, "%02x", rnd[i]);
    return true;
}

/* Why a request was not admitted, for the answer given after the lock. */
typedef struct refusal {
    fy_tenant_verdict_t verdict; /* FY_TENANT_OK: the router is draining */
    double retry;
    int64_t cost;
} refusal_t;

/* Under the router's lock: lists h as live (its HTTP request is held
 * already, h lives until h_end); false (h untouched, *why said) while
 * draining or past its tenant's limits. */
static bool hreq_admit(fy_http_t *H, hreq_t *h, fy_tenant_t *tenant, const fy_http_gen_t *g, refusal_t *why)
{
    *why = (refusal_t){.verdict = FY_TENANT_OK};
    if (H->draining) return false;
    if (tenant) {
        int choices = g->n * g->n_prompts;
        why->cost = (int64_t)g->n_prompt + (int64_t)g->gen.max_tokens * choices;
        why->verdict = fy_tenant_admit(tenant, choices, why->cost, fy_now_s(), &why->retry);
        if (why->verdict != FY_TENANT_OK) return false;
        h->tenant = tenant;
    }
    h->next = H->live;
    if (H->live) H->live->prev = h;
    H->live = h;
    H->n_live++;
    h->listed = true;
    return true;
}

/* The lock released: the answer to a request hreq_admit refused. */
static void refuse_admission(fy_http_t *H, fy_httpd_req_t *r, const fy_tenant_t *tenant, const refusal_t *why)
{
    if (why->verdict == FY_TENANT_OK)
        refuse_draining(H, r);
    else if (why->verdict == FY_TENANT_CONCURRENCY)
        respond_error(H, r, 429, "rate_limit_error", NULL, why->retry,
                      "tenant %s has its maximum of concurrent requests running", fy_tenant_name(tenant));
    else
        respond_error(H, r, 429, "rate_limit_error", NULL, why->retry,
                      "tenant %s has spent its tokens per minute (this request needs %lld)", fy_tenant_name(tenant),
                      (long long)why->cost);
}

/* Under the router's lock: the answer to a first submission that failed
 * with st (err: why); h is released. */
static void refuse_submitted(hreq_t *h, fy_status_t st, const char *err)
{
    h_release(h, true);
    json_t *e = json_object(), *eb = json_object();
    char m[320];
    snprintf(m, sizeof(m), "%s%s", h->n_prompts > 1 ? "'prompt'[0]: " : "", err); /* (the first submitted) */
    json_object_set_new(eb, "message", jstr(m, strlen(m)));
    json_object_set_new(eb, "type",
                        json_string(st == FY_ERR_OVERLOADED ? "server_overloaded" : "invalid_request_error"));
    /* the router refuses a prompt it cannot hold, or a kv_budget the
     * deployment does not allow (its message starts with the field) */
    const char *param = !strncmp(err, "'kv_budget'", 11) ? "kv_budget"
                        : h->resp                        ? "input"
                        : h->chat                        ? "messages"
                                                         : "prompt";
    bool ctx = !strncmp(err, "This model's maximum context length", 35); /* the workers' context changed since */
    json_object_set_new(eb, "param", st == FY_ERR_INVALID ? json_string(param) : json_null());
    json_object_set_new(eb, "code", ctx ? json_string("context_length_exceeded") : json_null());
    json_object_set_new(e, "error", eb);
    raw_response(h, status_of(st), e);
}

/* A parse worker: the body parsed and its prompt tokenized, then the
 * request admitted and submitted; run false: the router is stopping
 * before it ran.  h->parsing stays set until the first sample is
 * submitted, so that a client leaving meanwhile (h_end) leaves h to this
 * function rather than free it under it. */
static void parse_job(void *arg, bool run)
{
    hreq_t *h = arg;
    fy_http_t *H = h->H;
    router_t *R = H->R;
    fy_http_gen_t g;
    fy_http_fault_t fault;
    fy_status_t pst = FY_ERR_CANCELLED;
    if (run) {
        fy_http_front_t f = front_of(H);
        pst = h->responses ? fy_responses_parse(&f, h->body, h->body_len, &g, &h->resp, &fault)
                           : fy_http_parse_generation(&f, h->body, h->body_len, h->chat, &g, &fault);
    }
    fy_free(h->body);
    h->body = NULL;
    fy_router_lock(R);
    if (!h->r) { /* the client left while it waited */
        fy_router_unlock(R);
        if (pst == FY_OK) {
            fy_free(g.ids);
            fy_free(g.tool_names);
        }
        hreq_free(h);
        return;
    }
    refusal_t why;
    fy_tenant_t *tenant = h->key_tenant;
    bool filled = pst == FY_OK && hreq_fill(h, &g);
    if (filled && h->resp) snprintf(h->oid, sizeof(h->oid), "%s", fy_responses_id(h->resp));
    if (!filled || !hreq_admit(H, h, tenant, &g, &why)) { /* answered now; h_end frees h once it is out */
        h->parsing = false;
        if (pst == FY_ERR_CANCELLED)
            refuse_draining(H, h->r);
        else if (pst)
            respond_fault(H, h->r, pst, &fault);
        else if (!filled)
            respond_error(H, h->r, 500, "server_error", NULL, 0, "out of memory");
        else
            refuse_admission(H, h->r, tenant, &why);
        fy_router_unlock(R);
        if (pst == FY_OK) {
            fy_free(g.ids);
            fy_free(g.tool_names);
        }
        return;
    }
    fy_router_unlock(R);

    /* the first sample now; the others (same prompt, seeds apart) once its
     * prompt is in the workers' prefix caches, where they find it */
    const char *tname = tenant ? fy_tenant_name(tenant) : "";
    char err[256] = "";
    fy_status_t st =
        fy_router_submit(R, tname, g.ids, g.prompt_len[0], &g.gen, 0, watch, h, &h->ids[0], err, sizeof(err));
    fy_router_lock(R);
    h->parsing = false;
    h->ready = true;
    if (!h->r) { /* the client left while this was submitted: as h_end would */
        h_unlist(h);
        fy_router_unlock(R);
        hreq_free(h);
        return;
    }
    if (!st && H->stopping) { /* the server stopped while this was submitted */
        h_release(h, true);
        st = FY_ERR_CANCELLED;
        snprintf(err, sizeof(err), "the router is shutting down");
    }
    if (st) {
        refuse_submitted(h, st, err);
    } else {
        if (h->stream) {
            const char *hdr[] = {"Cache-Control", "no-cache", NULL};
            fy_httpd_stream_begin(h->r, 200, "text/event-stream", hdr);
            fy_metric_inc(H->responses[0]);
        }
        h_pump(h);
    }
    fy_router_unlock(R);
}

/* Server thread: what is cheap (draining, the API key, the content type)
 * is checked here; the body, copied, waits for a parse worker, or is
 * refused at once (503) when their queue is full.  The request is held
 * from here on: its client leaving is noticed while it waits. */
static void generation_as(fy_http_t *H, fy_httpd_req_t *r, bool chat, bool responses)
{
    router_t *R = H->R;
    fy_router_lock(R);
    bool draining = H->draining;
    fy_router_unlock(R);
    if (draining) { /* before anything is parsed or spent */
        refuse_draining(H, r);
        return;
    }
    fy_tenant_t *tenant;
    if (!authenticate(H, r, &tenant) || !json_body(H, r)) return;
    size_t len;
    const char *body = fy_httpd_req_body(r, &len);
    hreq_t *h = fy_calloc(1, sizeof(*h));
    if (h && !(h->body = fy_malloc(len + 1))) {
        fy_free(h);
        h = NULL;
    }
    if (!h) {
        respond_error(H, r, 500, "server_error", NULL, 0, "out of memory");
        return;
    }
    memcpy(h->body, body, len);
    h->body[len] = 0;
    h->body_len = len;
    h->H = H;
    h->r = r;
    h->chat = chat;
    h->responses = responses;
    h->key_tenant = tenant;
    h->parsing = true;
    fy_router_lock(R);
    fy_httpd_hold(r, h_end, h);
    fy_status_t st = fy_router_offload(R, len, parse_job, h);
    if (st) { /* answered now; h_end frees h once the answer is out */
        h->parsing = false;
        refuse_busy(H, r, st);
    }
    fy_router_unlock(R);
}

static void generation(fy_http_t *H, fy_httpd_req_t *r, bool chat) { generation_as(H, r, chat, false); }

static void on_completions(void *arg, fy_httpd_req_t *r) { generation(arg, r, false); }
static void on_chat(void *arg, fy_httpd_req_t *r) { generation(arg, r, true); }
static void on_responses(void *arg, fy_httpd_req_t *r) { generation_as(arg, r, true, true); }

/* The model object of /v1/models and /v1/models/{id}. */
static json_t *model_json(const fy_http_t *H)
{
    json_t *m = json_object();
    json_object_set_new(m, "id", json_string(H->served));
    json_object_set_new(m, "object", json_string("model"));
    json_object_set_new(m, "created", json_integer((json_int_t)H->model_created));
    json_object_set_new(m, "owned_by", json_string("ferry"));
    /* root: the served name, as vLLM's is the model it was started with;
     * model_id: ferry's name and hash of the weights ("model" takes both) */
    json_object_set_new(m, "root", json_string(H->served));
    json_object_set_new(m, "model_id", json_string(fy_router_model_id(H->R)));
    json_object_set_new(m, "max_model_len", json_integer(pool_ctx(H)));
    return m;
}

/* GET /v1/models/{id}: the served name or the model's id (as "model"
 * takes them); another is OpenAI's 404, code "model_not_found". */
static void on_model(void *arg, fy_httpd_req_t *r)
{
    fy_http_t *H = arg;
    const char *path = fy_httpd_req_path(r);
    const char *id = path + (strncmp(path, "/v1/", 4) ? 0 : 3) + strlen("/models/"); /* routed with or without /v1 */
    if (!strcmp(id, H->served) || !strcmp(id, fy_router_model_id(H->R))) {
        answer_json(H, r, 200, model_json(H), 0);
        return;
    }
    char msg[400];
    snprintf(msg, sizeof(msg), "the model '%.200s' does not exist; this server serves '%s'", id, H->served);
    json_t *e = json_object(), *eb = json_object();
    json_object_set_new(eb, "message", jstr(msg, strlen(msg)));
    json_object_set_new(eb, "type", json_string("invalid_request_error"));
    json_object_set_new(eb, "param", json_string("model"));
    json_object_set_new(eb, "code", json_string("model_not_found"));
    json_object_set_new(e, "error", eb);
    answer_json(H, r, 404, e, 0);
}

/* POST /tokenize and /detokenize (vLLM's shapes), behind the API keys:
 * no cluster work, the router's own tokenizer, on a parse worker (a
 * long text takes as long as a prompt's).  The job is the held request's
 * end argument: whichever of the worker and end() comes second frees it. */
typedef struct tjob {
    fy_http_t *H;
    fy_httpd_req_t *r; /* NULL once the server ended it */
    bool detok, queued;
    char *body;
    size_t len;
} tjob_t;

/* The answer to a /tokenize or /detokenize body: status and JSON. */
static json_t *tokenize_answer(fy_http_t *H, const char *body, size_t len, bool detok, uint16_t *status_p)
{
    fy_http_front_t f = front_of(H);
    fy_http_fault_t fault;
    fy_http_tok_t t;
    fy_status_t st =
        detok ? fy_http_parse_detokenize(&f, body, len, &t, &fault) : fy_http_parse_tokenize(&f, body, len, &t, &fault);
    if (st == FY_ERR_INVALID) {
        *status_p = fault.status;
        return error_body_msg(fault.type, fault.param, fault.code, fault.msg);
    }
    if (st) {
        *status_p = 500;
        return error_body_msg("server_error", NULL, NULL, "out of memory");
    }
    const fy_tokenizer_t *tok = fy_model_tokenizer(f.model);
    json_t *o = json_object();
    if (detok) {
        size_t need = fy_tokenizer_decode(tok, t.ids, (size_t)t.n, true, NULL, 0);
        char *text = fy_malloc(need + 1);
        if (text) fy_tokenizer_decode(tok, t.ids, (size_t)t.n, true, text, need + 1);
        json_object_set_new(o, "prompt", text ? jstr(text, need) : json_null());
        fy_free(text);
    } else {
        json_t *ids = json_array(), *strs = t.token_strs ? json_array() : json_null();
        for (int32_t i = 0; i < t.n; i++) {
            json_array_append_new(ids, json_integer(t.ids[i]));
            if (!t.token_strs) continue;
            const char *b;
            size_t bl;
            fy_tokenizer_token_bytes(tok, t.ids[i], true, &b, &bl);
            json_array_append_new(strs, jstr(b, bl));
        }
        json_object_set_new(o, "count", json_integer(t.n));
        json_object_set_new(o, "max_model_len", json_integer(f.max_ctx));
        json_object_set_new(o, "tokens", ids);
        json_object_set_new(o, "token_strs", strs);
    }
    fy_free(t.ids);
    *status_p = 200;
    return o;
}

static void tjob_end(void *arg, bool complete)
{
    (void)complete;
    tjob_t *j = arg;
    fy_router_lock(j->H->R);
    j->r = NULL;
    bool mine = !j->queued;
    fy_router_unlock(j->H->R);
    if (!mine) return; /* its worker frees it */
    fy_free(j->body);
    fy_free(j);
}

static void tjob_run(void *arg, bool run)
{
    tjob_t *j = arg;
    fy_http_t *H = j->H;
    uint16_t status = 503;
    json_t *o = run ? tokenize_answer(H, j->body, j->len, j->detok, &status)
                    : error_body_msg("server_overloaded", NULL, NULL, "the server is shutting down");
    fy_router_lock(H->R);
    j->queued = false;
    bool gone = !j->r;
    if (!gone) answer_json(H, j->r, status, o, status == 503 ? 1 : 0); /* end() frees j after this */
    fy_router_unlock(H->R);
    if (!gone) return;
    json_decref(o);
    fy_free(j->body);
    fy_free(j);
}

static void tokenize(fy_http_t *H, fy_httpd_req_t *r, bool detok)
{
    fy_tenant_t *tenant;
    if (!authenticate(H, r, &tenant) || !json_body(H, r)) return;
    size_t len;
    const char *body = fy_httpd_req_body(r, &len);
    tjob_t *j = fy_calloc(1, sizeof(*j));
    if (j && !(j->body = fy_malloc(len + 1))) {
        fy_free(j);
        j = NULL;
    }
    if (!j) {
        respond_error(H, r, 500, "server_error", NULL, 0, "out of memory");
        return;
    }
    memcpy(j->body, body, len);
    j->body[len] = 0;
    *j = (tjob_t){.H = H, .r = r, .detok = detok, .queued = true, .body = j->body, .len = len};
    fy_router_lock(H->R);
    fy_httpd_hold(r, tjob_end, j);
    fy_status_t st = fy_router_offload(H->R, len, tjob_run, j);
    if (st) {
        j->queued = false;
        refuse_busy(H, r, st);
    }
    fy_router_unlock(H->R);
}

static void on_tokenize(void *arg, fy_httpd_req_t *r) { tokenize(arg, r, false); }
static void on_detokenize(void *arg, fy_httpd_req_t *r) { tokenize(arg, r, true); }

static void on_version(void *arg, fy_httpd_req_t *r)
{
    json_t *o = json_object();
    json_object_set_new(o, "version", json_string(FY_VERSION));
    answer_json(arg, r, 200, o, 0);
}

static void on_models(void *arg, fy_httpd_req_t *r)
{
    fy_http_t *H = arg;
    json_t *m = model_json(H);
    json_t *data = json_array();
    json_array_append_new(data, m);
    json_t *o = json_object();
    json_object_set_new(o, "object", json_string("list"));
    json_object_set_new(o, "data", data);
    answer_json(H, r, 200, o, 0);
}

static void on_health(void *arg, fy_httpd_req_t *r)
{
    fy_http_t *H = arg;
    int p, d;
    bool colocated;
    fy_router_lock(H->R);
    fy_router_workers_up(H->R, &p, &d, &colocated);
    bool draining = H->draining;
    int32_t live = H->n_live;
    fy_router_unlock(H->R);
    char why[96];
    if (draining)
        snprintf(why, sizeof(why), "shutting down: draining %d HTTP generation%s", live, live == 1 ? "" : "s");
    else if (d == 0)
        snprintf(why, sizeof(why), "no decode worker is reachable");
    else if (!colocated && p == 0)
        snprintf(why, sizeof(why), "no prefill worker is reachable");
    else
        why[0] = 0;
    json_t *o = json_object();
    json_object_set_new(o, "status", json_string(draining ? "draining" : why[0] ? "unhealthy" : "ok"));
    if (why[0]) json_object_set_new(o, "reason", json_string(why));
    json_object_set_new(o, "prefill_up", json_integer(p));
    json_object_set_new(o, "decode_up", json_integer(d));
    json_object_set_new(o, "mode", json_string(colocated ? "colocated" : "disaggregated"));
    answer_json(H, r, why[0] ? 503 : 200, o, why[0] ? (H->retry_after_s > 0 ? H->retry_after_s : 1) : 0);
}

static void on_metrics(void *arg, fy_httpd_req_t *r)
{
    fy_http_t *H = arg;
    fy_httpd_stats_t hs;
    fy_httpd_stats(H->srv, &hs);
    fy_router_lock(H->R); /* one scrape at a time brings the server's counts over */
    fy_metric_set(H->conns, hs.open);
    fy_metric_add(H->closed[0], (double)hs.timed_out - fy_metric_value(H->closed[0]));
    fy_metric_add(H->closed[1], (double)hs.evicted - fy_metric_value(H->closed[1]));
    fy_metric_add(H->closed[2], (double)hs.refused - fy_metric_value(H->closed[2]));
    fy_router_metrics_refresh(H->R);
    fy_router_unlock(H->R);
    char *text;
    size_t len;
    if (fy_metrics_render(fy_router_metrics(H->R), &text, &len) != FY_OK) {
        respond_error(H, r, 500, "server_error", NULL, 0, "out of memory rendering the metrics");
        return;
    }
    fy_httpd_answer(r, 200, FY_METRICS_CONTENT_TYPE, NULL, text, len);
    fy_free(text);
}

/* ---- start, drain and stop ---------------------------------------------------------------------------- */

static fy_status_t http_start(router_t *R, fy_http_t **h_p)
{
    const fy_router_conf_t *rc = fy_router_conf(R); /* read once at start */
    const char *url = rc->http, *keys = rc->api_keys, *path = rc->model_path, *cors = rc->cors_origins;
    const char *think = rc->reasoning_parser;
    int64_t max_body = rc->max_body, max_tokens = rc->default_max_tokens;
    double retry = rc->retry_after;
    fy_httpd_limits_t lim = rc->http_lim;
    fy_status_t st;
    *h_p = NULL;
    if ((st = fy_httpd_limits_check(&lim))) return st;
    if (!*url) return FY_OK;
    fy_reasoning_parser_t parser;
    if (!fy_reasoning_parser_of(think, &parser)) { /* (the schema's choices are these) */
        fy_error("router.reasoning_parser: '%s' is not auto, none, deepseek_r1 or qwen3", think);
        return FY_ERR_INVALID;
    }
    lim.threads = 2; /* prompts are parsed on the router's parse workers (fy_router_offload), not here */
    fy_http_t *H = fy_calloc(1, sizeof(*H));
    if (!H) return FY_ERR_NOMEM;
    H->R = R;
    H->default_max_tokens = max_tokens;
    H->reasoning_parser = parser;
    H->retry_after_s = retry;
    snprintf(H->url, sizeof(H->url), "%s", url);
    struct stat sb;
    H->model_created = stat(path, &sb) == 0 ? sb.st_mtime : time(NULL);
    /* the same name the model_name label of every process's metrics carries */
    snprintf(H->served, sizeof(H->served), "%s", rc->served);
    st = sodium_init() < 0 ? FY_ERR_INTERNAL : FY_OK;
    if (!st && *keys) st = fy_tenants_load(keys, &H->tenants);
    if (!st) st = fy_grammar_cache_create(64, &H->grammars);
    static const char *const classes[] = {"2xx", "400", "4xx", "429", "5xx", "client_gone"};
    fy_metrics_t *g = fy_router_metrics(R);
    for (int i = 0; i < 6 && !st; i++) {
        const char *l[] = {"code", classes[i], NULL};
        st = fy_metrics_counter(g, "ferry:http_responses_total",
                                "HTTP answers by status class; client_gone: the client left before the end", l,
                                &H->responses[i]);
    }
    static const char *const why[] = {"header_timeout", "evicted", "refused"};
    for (int i = 0; i < 3 && !st; i++) {
        const char *l[] = {"reason", why[i], NULL};
        st = fy_metrics_counter(g, "ferry:http_connections_closed_total",
                                "HTTP connections closed by the server: requests not complete within "
                                "http_header_timeout, idle ones closed for a newcomer at http_max_connections, "
                                "newcomers refused (503) when all were busy",
                                l, &H->closed[i]);
    }
    if (!st) st = fy_metrics_gauge(g, "ferry:http_connections", "HTTP connections open", NULL, &H->conns);
    if (!st) st = fy_httpd_create_with(url, &lim, &H->srv);
    if (!st) st = fy_httpd_cors(H->srv, cors);
    if (!st) st = fy_httpd_handle(H->srv, "POST", "/v1/completions", (size_t)max_body, on_completions, H);
    if (!st) st = fy_httpd_handle(H->srv, "POST", "/v1/chat/completions", (size_t)max_body, on_chat, H);
    if (!st) st = fy_httpd_handle(H->srv, "POST", "/v1/responses", (size_t)max_body, on_responses, H);
    if (!st) st = fy_httpd_handle(H->srv, "GET", "/v1/models", 0, on_models, H);
    if (!st) st = fy_httpd_handle(H->srv, "GET", "/v1/models/*", 0, on_model, H);
    /* the same without /v1, as llama.cpp's server answers them: clients
     * configured with a bare host (http://host:8080) call these */
    if (!st) st = fy_httpd_handle(H->srv, "POST", "/completions", (size_t)max_body, on_completions, H);
    if (!st) st = fy_httpd_handle(H->srv, "POST", "/chat/completions", (size_t)max_body, on_chat, H);
    if (!st) st = fy_httpd_handle(H->srv, "POST", "/responses", (size_t)max_body, on_responses, H);
    if (!st) st = fy_httpd_handle(H->srv, "GET", "/models", 0, on_models, H);
    if (!st) st = fy_httpd_handle(H->srv, "GET", "/models/*", 0, on_model, H);
    if (!st) st = fy_httpd_handle(H->srv, "POST", "/tokenize", (size_t)max_body, on_tokenize, H);
    if (!st) st = fy_httpd_handle(H->srv, "POST", "/detokenize", (size_t)max_body, on_detokenize, H);
    if (!st) st = fy_httpd_handle(H->srv, "GET", "/version", 0, on_version, H);
    if (!st) st = fy_httpd_handle(H->srv, "GET", "/health", 0, on_health, H);
    if (!st) st = fy_httpd_handle(H->srv, "GET", "/metrics", 0, on_metrics, H);
    if (st) {
        fy_httpd_destroy(H->srv);
        fy_tenants_destroy(H->tenants);
        fy_grammar_cache_destroy(H->grammars);
        fy_free(H);
        return st;
    }
    fy_info("http: OpenAI API on %s (%s, model '%s'%s)", url,
            fy_httpd_tls(H->srv) ? "HTTPS only: router.tls_cert" : "plain HTTP", H->served,
            H->tenants ? ", API keys required" : ", no API keys: one tenant");
    *h_p = H;
    return FY_OK;
}

static void http_drain(fy_http_t *H)
{
    if (H) H->draining = true; /* the router's lock is held */
}

static int32_t http_live(const fy_http_t *H) { return H ? H->n_live : 0; }

static void http_stop(fy_http_t *H)
{
    if (!H) return;
    router_t *R = H->R;
    /* what is left is ended: streams get their terminal events, the others
     * an error body, as the router's requests end (the router ended them
     * before, when it drained) */
    fy_router_lock(R);
    H->draining = H->stopping = true;
    for (hreq_t *h = H->live; h; h = h->next) {
        if (!h->r || h->final || !h->ready) continue; /* !ready: its handler sees stopping */
        for (int i = 0; i < h->n; i++) {
            fy_router_view_t v;
            if (!h_view(h, i, &v) || !v.done) {
                h->sample_err[i] = FY_ERR_CANCELLED;
                snprintf(h->sample_msg[i], sizeof(h->sample_msg[i]), "the router is shutting down");
            }
        }
        h_release(h, true);
        h_pump(h);
    }
    fy_router_unlock(R);
    /* the server writes those, then ends what is still held (end() for each) */
    fy_httpd_destroy(H->srv);
    fy_router_lock(R);
    bool left = H->live != NULL;
    fy_router_unlock(R);
    if (left) { /* an end() may still come: H stays (leaked) rather than be freed under it */
        fy_warn("http: generations still open at shutdown");
        return;
    }
    fy_tenants_destroy(H->tenants);
    fy_grammar_cache_destroy(H->grammars);
    fy_free(H);
}

/* ---- the router's front door -------------------------------------------------------------------------- */

static fy_status_t door_start(router_t *R, void **h_p)
{
    fy_http_t *h;
    fy_status_t st = http_start(R, &h);
    if (st == FY_OK) *h_p = h;
    return st;
}
static void door_drain(void *h) { http_drain(h); }
static int32_t door_live(const void *h) { return http_live(h); }
static void door_stop(void *h) { http_stop(h); }

const fy_router_door_t fy_http_door = {door_start, door_drain, door_live, door_stop};

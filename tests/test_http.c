/*
 * test_http.c - the router's OpenAI-compatible HTTP API against a real
 * cluster (router, 1 prefill and 1 decode worker as processes) on
 * loopback: plain and streamed completions and chat, the tokens of the
 * nng client for the same prompt, every kind of bad request answered
 * with the right status and a body naming the field, API keys and
 * tenants (401, 429 for concurrency and tokens per minute, and prefix
 * caches that a tenant never shares, timing included), a client that
 * disconnects mid-stream (its blocks come back), slow clients, the
 * router's /metrics moving as requests pass, overload (503), /tokenize,
 * /detokenize, /version and /v1/models/{id}, max_completion_tokens and
 * min_tokens, tool calls (auto answers well formed and the same streamed,
 * required and named choices enforced where the workers apply grammars),
 * structured-output fields, the workers' context (max_model_len, OpenAI's
 * context_length_exceeded at the door, on a cluster of small ctx),
 * refusals (404, 405, 413, OPTIONS) that leave a kept-alive
 * connection usable for the next request, CORS, what two peer projects'
 * OpenAI test suites found (stream_options without stream, codes and
 * params of faults, the routes without /v1, the served name as root and
 * in `ferry request --status`), and curl and the `openai` Python package
 * against it (the latter skipped where it cannot be installed).  The
 * router answers the next request after each.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "common/clock.h"
#include "tests/cluster_util.h"
#include "common/mem.h"
#include "common/metrics.h"
#include "model/model.h"
#include "router/http_parse.h"
#include "router/responses.h"
#include "tests/testutil.h"
#include "model/tokenizer.h"

static tc_cluster_t C;
static int PORT;
static char KEYS[512];
static const char *KEY_A = "key-alpha-0001", *KEY_B = "key-beta-00002", *KEY_C = "key-gamma-0003";

/* ---- a small HTTP client over a socket ---- */

static int free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(s, (struct sockaddr *)&a, sizeof(a)), 0);
    socklen_t l = sizeof(a);
    getsockname(s, (struct sockaddr *)&a, &l);
    close(s);
    return ntohs(a.sin_port);
}

static int dial(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {
        .sin_family = AF_INET, .sin_port = htons((uint16_t)PORT), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(connect(s, (struct sockaddr *)&a, sizeof(a)), 0);
    struct timeval tv = {.tv_sec = 120};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    int one = 1;
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return s;
}

static void send_all(int s, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        ssize_t k = send(s, p, n, MSG_NOSIGNAL);
        if (k <= 0) return; /* the server may refuse a huge body before reading it all */
        p += k;
        n -= (size_t)k;
    }
}

static void send_request(int s, const char *method, const char *path, const char *key, const char *ctype,
                         const char *body, size_t blen)
{
    char head[1024];
    int n = snprintf(head, sizeof(head),
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s%s%s%s%s%s"
                     "Content-Length: %zu\r\n\r\n",
                     method, path, key ? "Authorization: Bearer " : "", key ? key : "", key ? "\r\n" : "",
                     ctype ? "Content-Type: " : "", ctype ? ctype : "", ctype ? "\r\n" : "", blen);
    send_all(s, head, (size_t)n);
    if (blen) send_all(s, body, blen);
}

typedef struct resp {
    int status;
    char head[4096];
    char *body; /* NUL-terminated */
    size_t len;
} resp_t;

/* Reads a whole response: headers, then Content-Length bytes or to the close. */
static void read_response(int s, resp_t *r)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    char *hend = NULL;
    long clen = -1;
    for (;;) {
        if (n + 4096 > cap) buf = realloc(buf, cap *= 2);
        ssize_t k = recv(s, buf + n, cap - n - 1, 0);
        if (k <= 0) break;
        n += (size_t)k;
        buf[n] = 0;
        if (!hend && (hend = strstr(buf, "\r\n\r\n"))) {
            const char *cl = strcasestr(buf, "Content-Length:");
            if (cl && cl < hend) clen = atol(cl + 15);
        }
        if (hend && clen >= 0 && n >= (size_t)(hend + 4 - buf) + (size_t)clen) break;
        if (hend && (!strncmp(buf + 9, "204", 3) || !strncmp(buf + 9, "304", 3))) break; /* no body */
    }
    buf[n] = 0;
    memset(r, 0, sizeof(*r));
    if (sscanf(buf, "HTTP/1.%*d %d", &r->status) != 1) r->status = -1;
    hend = strstr(buf, "\r\n\r\n");
    size_t hl = hend ? (size_t)(hend - buf) : n;
    snprintf(r->head, sizeof(r->head), "%.*s", (int)hl, buf);
    r->len = hend ? n - hl - 4 : 0;
    r->body = malloc(r->len + 1);
    memcpy(r->body, hend ? hend + 4 : "", r->len);
    r->body[r->len] = 0;
    free(buf);
}

static resp_t call(const char *method, const char *path, const char *key, const char *body)
{
    int s = dial();
    send_request(s, method, path, key, body ? "application/json" : NULL, body, body ? strlen(body) : 0);
    resp_t r;
    read_response(s, &r);
    close(s);
    return r;
}

static json_t *json_of(const resp_t *r)
{
    json_error_t e;
    json_t *j = json_loads(r->body, 0, &e);
    if (!j) fail_msg("not JSON (%s): %s", e.text, r->body);
    return j;
}

/* The next SSE event's data from *at on (a "data: {" line), parsed, with
 * *at moved past it; NULL when there is none left ("data: [DONE]" is not
 * one).  Data that is not JSON fails the test.  A walk over a stream:
 * for (json_t *c; (c = sse_next(&at)); json_decref(c)) */
static json_t *sse_next(const char **at)
{
    const char *d = strstr(*at, "data: {");
    if (!d) return NULL;
    *at = d + 6;
    json_t *c = json_loadb(d + 6, strcspn(d + 6, "\n"), 0, NULL);
    if (!c) fail_msg("an event's data is not JSON: %.80s", d + 6);
    return c;
}

/* An error response: the status, and an OpenAI error body naming param. */
static void expect_error(const resp_t *r, int status, const char *param, const char *in_message)
{
    if (r->status != status) fail_msg("status %d, expected %d: %s", r->status, status, r->body);
    json_t *j = json_of(r);
    json_t *e = json_object_get(j, "error");
    assert_non_null(e);
    const char *msg = json_string_value(json_object_get(e, "message"));
    assert_non_null(msg);
    if (param) {
        const char *p = json_string_value(json_object_get(e, "param"));
        if (!p || strcmp(p, param)) fail_msg("param '%s', expected '%s' (%s)", p ? p : "null", param, msg);
    }
    if (in_message && !strstr(msg, in_message)) fail_msg("message '%s' lacks '%s'", msg, in_message);
    json_decref(j);
}

/* ---- the cluster, once for all tests ---- */

static int32_t decode_admittable(void);
static int32_t IDLE_ADMITTABLE; /* the decode worker's, before any request */

static int setup(void **state)
{
    (void)state;
    if (!tc_available()) return 0;
    PORT = free_port();
    const char *dir = fy_test_tmpdir();
    snprintf(KEYS, sizeof(KEYS), "%s/keys.txt", dir);
    char keys[512];
    snprintf(keys, sizeof(keys), "# test keys\n%s alpha\n%s beta max_concurrent=1\n%s gamma tokens_per_minute=150\n",
             KEY_A, KEY_B, KEY_C);
    assert_true(fy_test_write_file(KEYS, keys, strlen(keys)));
    static char http[128], keyset[600];
    snprintf(http, sizeof(http), "router.http=http://127.0.0.1:%d", PORT);
    snprintf(keyset, sizeof(keyset), "router.api_keys=%s", KEYS);
    tc_opts_t o = {.n_prefill = 1,
                   .n_decode = 1,
                   .metrics = true, /* the decode worker's steps (test_stream_chunk_per_step) */
                   /* speculation whatever the step costs measure (test_stream_chunk_per_step):
                    * under a sanitizer a step's cost grows with every token,
                    * and the cost model rightly proposes nothing */
                   .common = {http, keyset, "router.max_body=64KiB", "decode.kv_mem=64MiB",
                              "router.cors_origins=https://app.example, http://localhost:3000/",
                              "decode.spec_cost_aware=false"}};
    tc_start(&C, &o);
    IDLE_ADMITTABLE = decode_admittable();
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (C.n_procs) tc_stop(&C);
    fy_test_tmpdir_remove();
    return 0;
}

static int32_t decode_admittable(void)
{
    fy_client_status_t s;
    tc_status(&C, &s);
    for (int i = 0; i < s.n_workers; i++)
        if (s.workers[i].decode) return s.workers[i].admittable;
    return -1;
}

static char *token_prompt_json(int n, uint64_t seed, const char *extra)
{
    size_t cap = (size_t)n * 8 + 512;
    char *b = fy_malloc(cap);
    size_t k = (size_t)snprintf(b, cap, "{\"prompt\":[");
    for (int i = 0; i < n; i++)
        k += (size_t)snprintf(b + k, cap - k, "%s%d", i ? "," : "", 100 + (int)(fy_test_rand_u64(&seed) % 40000));
    snprintf(b + k, cap - k, "]%s}", extra);
    return b;
}

/* ---- plain and streamed ---- */

static void test_models_and_health(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    resp_t r = call("GET", "/health", NULL, NULL);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"ok\""));
    free(r.body);
    r = call("GET", "/v1/models", NULL, NULL);
    assert_int_equal(r.status, 200);
    json_t *j = json_of(&r);
    json_t *m = json_array_get(json_object_get(j, "data"), 0);
    assert_string_equal(json_string_value(json_object_get(m, "id")), "SmolLM2-135M-Instruct.Q4_1");
    json_decref(j);
    free(r.body);
}

static void test_completion_matches_nng_client(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    /* the same greedy prompt through the nng client */
    fy_client_req_t q = {.prompt = "The three primary colors are"};
    fy_genspec_default(&q.gen);
    q.gen.max_tokens = 12;
    q.gen.ignore_eos = true;
    fy_client_stream_t s;
    char err[256];
    assert_int_equal(fy_client_generate(C.client, &q, &s, err, sizeof(err)), FY_OK);
    tc_result_t ref = {0};
    tc_collect(&C, &s, &ref, 1, 60);
    assert_int_equal(ref.error, FY_OK);

    resp_t r = call("POST", "/v1/completions", KEY_A,
                    "{\"model\":\"SmolLM2-135M-Instruct.Q4_1\",\"prompt\":\"The three primary colors "
                    "are\",\"speculative\":\"none\","
                    "\"max_tokens\":12,\"temperature\":0,\"ignore_eos\":true,\"logprobs\":0,\"unknown_field\":[1,2]}");
    assert_int_equal(r.status, 200);
    json_t *j = json_of(&r);
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    const char *text = json_string_value(json_object_get(ch, "text"));
    json_t *u = json_object_get(j, "usage");
    assert_int_equal(json_integer_value(json_object_get(u, "completion_tokens")), 12);
    assert_int_equal(json_integer_value(json_object_get(u, "prompt_tokens")), s.n_prompt);
    assert_string_equal(json_string_value(json_object_get(ch, "finish_reason")), "length");
    json_t *lps = json_object_get(json_object_get(ch, "logprobs"), "token_logprobs");
    assert_int_equal(json_array_size(lps), 12);
    for (size_t i = 0; i < 12; i++) assert_true(json_real_value(json_array_get(lps, i)) <= 0);
    /* the nng client's tokens, as text */
    fy_model_t *model;
    assert_int_equal(fy_model_load(tc_model(), &model), FY_OK);
    char ref_text[4096] = "", streamed[4096] = "";
    fy_tokenizer_decode(fy_model_tokenizer(model), ref.tokens, (size_t)ref.n, false, ref_text, sizeof(ref_text));
    fy_model_destroy(model);
    assert_string_equal(text, ref_text);
    resp_t r2 = call("POST", "/v1/completions", KEY_A,
                     "{\"prompt\":\"The three primary colors are\",\"max_tokens\":12,\"temperature\":0,"
                     "\"ignore_eos\":true,\"stream\":true}");
    assert_int_equal(r2.status, 200);
    assert_non_null(strstr(r2.head, "text/event-stream"));
    /* the streamed deltas put together equal the plain text; the stream ends with [DONE] */
    size_t k = 0;
    const char *at = r2.body;
    for (json_t *c; (c = sse_next(&at)); json_decref(c)) {
        const char *t = json_string_value(json_object_get(json_array_get(json_object_get(c, "choices"), 0), "text"));
        if (t) k += (size_t)snprintf(streamed + k, sizeof(streamed) - k, "%s", t);
    }
    assert_non_null(strstr(r2.body, "data: [DONE]\n\n"));
    assert_string_equal(streamed, text);
    assert_int_equal(ref.n, 12);
    json_decref(j);
    free(r.body);
    free(r2.body);
}

static void test_chat_plain_and_n(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    resp_t r = call("POST", "/v1/chat/completions", KEY_A,
                    "{\"messages\":[{\"role\":\"system\",\"content\":\"You are terse.\"},"
                    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Name a fruit.\"}]}],"
                    "\"max_tokens\":6,\"n\":3,\"temperature\":0.8,\"seed\":7}");
    assert_int_equal(r.status, 200);
    json_t *j = json_of(&r);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "chat.completion");
    json_t *choices = json_object_get(j, "choices");
    assert_int_equal(json_array_size(choices), 3);
    for (size_t i = 0; i < 3; i++) {
        json_t *m = json_object_get(json_array_get(choices, i), "message");
        assert_string_equal(json_string_value(json_object_get(m, "role")), "assistant");
        assert_true(json_is_string(json_object_get(m, "content")));
        assert_int_equal(json_integer_value(json_object_get(json_array_get(choices, i), "index")), (json_int_t)i);
    }
    json_t *u = json_object_get(j, "usage");
    assert_true(json_integer_value(json_object_get(u, "completion_tokens")) <= 18);
    json_int_t np = json_integer_value(json_object_get(u, "prompt_tokens"));
    assert_true(np > 16);
    /* samples after the first found the prompt's full blocks in the caches */
    json_int_t cached =
        json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens"));
    print_message("n=3: %lld prompt tokens, %lld found cached by a later sample\n", (long long)np, (long long)cached);
    assert_true(cached >= 16 && cached < np);
    json_decref(j);
    free(r.body);
}

/* ---- bad requests: status and the field named, the router still serving ---- */

static void test_bad_requests(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    resp_t r;
#define CHECK(M, P, K, B, S, F, T)                                                                                     \
    do {                                                                                                               \
        r = call(M, P, K, B);                                                                                          \
        expect_error(&r, S, F, T);                                                                                     \
        free(r.body);                                                                                                  \
    } while (0)
    CHECK("POST", "/v1/completions", KEY_A, "{\"prompt\": \"hi\", \"max_tokens\": ", 400, NULL, "malformed JSON");
    CHECK("POST", "/v1/completions", KEY_A, "[1,2,3]", 400, NULL, "JSON object");
    CHECK("POST", "/v1/completions", KEY_A, "{\"prompt\":\"hi\",\"temperature\":\"hot\"}", 400, "temperature", NULL);
    CHECK("POST", "/v1/completions", KEY_A, "{\"prompt\":\"hi\",\"max_tokens\":0}", 400, "max_tokens", NULL);
    CHECK("POST", "/v1/completions", KEY_A, "{\"prompt\":\"hi\",\"max_tokens\":1.5}", 400, "max_tokens", NULL);
    CHECK("POST", "/v1/completions", KEY_A, "{\"prompt\":\"hi\",\"top_p\":1.5}", 400, "top_p", NULL);
    /* the wire's ranges, refused here rather than by a worker after a wasted retry (issue 13) */
    CHECK("POST", "/v1/completions", KEY_A, "{\"prompt\":\"hi\",\"top_p\":1e-9}", 400, "top_p", NULL);
    CHECK("POST", "/v1/completions", KEY_A, "{\"prompt\":\"hi\",\"top_p\":5e-7}", 400, "top_p", NULL);
    CHECK("POST", "/v1/completions", KEY_A, "{\"prompt\":\"hi\",\"top_k\":16777217}", 400, "top_k", NULL);
    CHECK("POST", "/v1/completions", KEY_A, "{\"prompt\":\"hi\",\"top_k\":1073741824}", 400, "top_k", NULL);
    CHECK("POST", "/v1/completions", KEY_A, "{\"prompt\":\"hi\",\"temperature\":100.5}", 400, "temperature", NULL);
    CHECK("POST", "/v1/completions", KEY_A, "{\"prompt\":\"hi\",\"min_p\":-0.1}", 400, "min_p", NULL);
    CHECK("POST", "/v1/completions", KEY_A, "{\"prompt\":\"hi\",\"priority\":1000001}", 400, "priority", NULL);
    CHECK("POST", "/v1/completions", KEY_A, "{\"prompt\":\"hi\",\"kv_budget\":-1}", 400, "kv_budget", NULL);
    /* a budget where the deployment evicts nothing (kv.evict = none): the worker refuses it by name */
    CHECK("POST", "/v1/completions", KEY_A, "{\"prompt\":\"hi\",\"kv_budget\":100}", 400, "kv_budget", NULL);
    CHECK("POST", "/v1/completions", KEY_A, "{\"prompt\":\"hi\",\"stop\":[\"a\\u0000b\"]}", 400, NULL, "JSON");
    CHECK("POST", "/v1/completions", KEY_A, "{\"prompt\":\"hi\",\"n\":99}", 400, "n", NULL);
    CHECK("POST", "/v1/completions", KEY_A, "{\"prompt\":\"hi\",\"seed\":-1}", 400, "seed", NULL);
    CHECK("POST", "/v1/completions", KEY_A, "{\"prompt\":\"hi\",\"stop\":[\"a\",3]}", 400, "stop", NULL);
    CHECK("POST", "/v1/completions", KEY_A, "{\"prompt\":\"hi\",\"stream\":\"yes\"}", 400, "stream", NULL);
    CHECK("POST", "/v1/completions", KEY_A, "{\"prompt\":[1,2,999999]}", 400, "prompt", NULL);
    CHECK("POST", "/v1/completions", KEY_A, "{\"prompt\":{\"a\":1}}", 400, "prompt", NULL);
    CHECK("POST", "/v1/completions", KEY_A, "{\"max_tokens\":3}", 400, "prompt", NULL);
    CHECK("POST", "/v1/completions", KEY_A, "{\"prompt\":\"hi\",\"presence_penalty\":2.5}", 400, "presence_penalty",
          "between -2 and 2");
    CHECK("POST", "/v1/completions", KEY_A, "{\"prompt\":\"hi\",\"logit_bias\":{\"99999999\":1}}", 400, "logit_bias",
          "not a token id");
    CHECK("POST", "/v1/completions", KEY_A, "{\"prompt\":\"hi\",\"logprobs\":30}", 400, "logprobs", NULL);
    /* a structured output the grammar engine cannot enforce: refused at the door, by keyword */
    CHECK("POST", "/v1/completions", KEY_A,
          "{\"prompt\":\"hi\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\","
          "\"schema\":{\"type\":\"object\",\"patternProperties\":{\"^a\":{\"type\":\"string\"}}}}}}",
          400, "response_format", "patternProperties");
    CHECK("POST", "/v1/completions", KEY_A, "{\"prompt\":\"hi\",\"guided_regex\":\"a(b\"}", 400, "guided_regex", NULL);
    CHECK("POST", "/v1/chat/completions", KEY_A,
          "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"required\","
          "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
          "\"patternProperties\":{\"^a\":{}}}}}]}",
          400, "tools", "patternProperties");
    CHECK("POST", "/v1/chat/completions", KEY_A,
          "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":3}", 400, "top_logprobs", "logprobs");
    CHECK("POST", "/v1/completions", KEY_A, "{\"prompt\":\"hi\",\"speculative\":\"magic\"}", 400, "speculative", NULL);
    CHECK("POST", "/v1/completions", KEY_A, "{\"prompt\":\"hi\",\"model\":\"gpt-4\"}", 404, "model", "gpt-4");
    CHECK("POST", "/v1/chat/completions", KEY_A, "{\"messages\":[]}", 400, "messages", NULL);
    CHECK("POST", "/v1/chat/completions", KEY_A, "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", 400,
          "messages", NULL);
    CHECK("POST", "/v1/chat/completions", KEY_A, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400, "messages",
          NULL);
    CHECK("POST", "/v1/completions", NULL, "{\"prompt\":\"hi\"}", 401, NULL, "API key");
    CHECK("POST", "/v1/completions", "not-a-valid-key", "{\"prompt\":\"hi\"}", 401, NULL, "invalid");
    /* a prompt longer than the context */
    char *big = token_prompt_json(9000, 5, "");
    CHECK("POST", "/v1/completions", KEY_A, big, 400, "prompt", NULL);
    fy_free(big);
    /* a regex of 5,000 alternatives: within the grammar's bytes, beyond what
     * a worker's matcher starts on; refused here by name (issue 32, item
     * 11: it used to pass the door, fail on the workers and come back as
     * another error after a retry), and on the nng port too */
    size_t rcap = 40000, rn = (size_t)snprintf(big = fy_malloc(rcap), rcap, "{\"prompt\":\"hi\",\"guided_regex\":\"");
    char *alts = big + rn;
    for (int i = 0; i < 5000; i++) rn += (size_t)snprintf(big + rn, rcap - rn, "%s%d", i ? "|" : "", i);
    size_t alts_len = (size_t)(big + rn - alts);
    snprintf(big + rn, rcap - rn, "\"}");
    CHECK("POST", "/v1/completions", KEY_A, big, 400, "guided_regex", "matcher's limits");
    fy_client_req_t greq = {.prompt = "hi"};
    fy_genspec_default(&greq.gen);
    greq.gen.max_tokens = 4;
    greq.gen.grammar_kind = FY_GEN_GRAMMAR_REGEX;
    greq.gen.grammar_len = (int32_t)alts_len;
    memcpy(greq.gen.grammar, alts, alts_len);
    greq.gen.grammar[alts_len] = 0;
    fy_client_stream_t gs;
    char gerr[512] = "";
    assert_int_equal(fy_client_generate(C.client, &greq, &gs, gerr, sizeof(gerr)), FY_ERR_INVALID);
    print_message("nng, 5000 alternatives: %s\n", gerr);
    assert_non_null(strstr(gerr, "field 'grammar'"));
    assert_non_null(strstr(gerr, "matcher's limits"));
    fy_free(big);
#undef CHECK
    /* wrong content type */
    int s = dial();
    send_request(s, "POST", "/v1/completions", KEY_A, "text/plain", "{\"prompt\":\"hi\"}", 15);
    read_response(s, &r);
    close(s);
    expect_error(&r, 415, NULL, "application/json");
    free(r.body);
    /* wrong method, unknown path: nng's own answers */
    r = call("GET", "/v1/completions", KEY_A, NULL);
    assert_int_equal(r.status, 405);
    free(r.body);
    r = call("GET", "/v2/nothing", KEY_A, NULL);
    assert_int_equal(r.status, 404);
    free(r.body);
    /* a body over router.max_body (64 KiB here) is refused unread */
    size_t hn = 200000;
    char *huge = fy_malloc(hn + 64);
    memset(huge, ' ', hn);
    memcpy(huge, "{\"prompt\":\"", 11);
    memcpy(huge + hn - 2, "\"}", 2);
    huge[hn] = 0;
    s = dial();
    send_request(s, "POST", "/v1/completions", KEY_A, "application/json", huge, hn);
    read_response(s, &r);
    close(s);
    print_message("a %zu-byte body: HTTP %d\n", hn, r.status);
    assert_int_equal(r.status, 413);
    free(r.body);
    fy_free(huge);
    /* still serving, and the boundaries themselves are served */
    static const char *const edges[] = {
        "{\"prompt\":\"Hello\",\"max_tokens\":2}",
        "{\"prompt\":\"Hello\",\"max_tokens\":2,\"top_p\":1e-6,\"temperature\":1}",
        "{\"prompt\":\"Hello\",\"max_tokens\":2,\"top_k\":16777216,\"temperature\":100}",
        "{\"prompt\":\"Hello\",\"max_tokens\":2,\"top_k\":-1,\"min_p\":1,\"priority\":-1000000}",
    };
    for (size_t i = 0; i < sizeof(edges) / sizeof(edges[0]); i++) {
        r = call("POST", "/v1/completions", KEY_A, edges[i]);
        if (r.status != 200) fail_msg("%s: HTTP %d %s", edges[i], r.status, r.body);
        free(r.body);
    }
}

/* ---- /tokenize, /detokenize, /version, /v1/models/{id} ---- */

/* A header's value in r's head, or NULL (static buffer). */
static const char *header_of(const resp_t *r, const char *name)
{
    static char v[512];
    char pat[128];
    snprintf(pat, sizeof(pat), "\r\n%s:", name);
    const char *h = strcasestr(r->head, pat);
    if (!h) return NULL;
    h += strlen(pat);
    while (*h == ' ') h++;
    size_t n = strcspn(h, "\r\n");
    snprintf(v, sizeof(v), "%.*s", (int)n, h);
    return v;
}

/* An OpenAI error body: an object "error" with message, type, param and code. */
static void expect_openai_error(const resp_t *r, int status)
{
    if (r->status != status) fail_msg("status %d, expected %d: %s", r->status, status, r->body);
    const char *ct = header_of(r, "Content-Type");
    if (!ct || strncmp(ct, "application/json", 16)) fail_msg("Content-Type %s: %s", ct ? ct : "none", r->body);
    json_t *j = json_of(r), *e = json_object_get(j, "error");
    if (!json_is_object(e) || !json_is_string(json_object_get(e, "message")) ||
        !json_is_string(json_object_get(e, "type")) || !json_object_get(e, "param") || !json_object_get(e, "code"))
        fail_msg("not an OpenAI error body: %s", r->body);
    json_decref(j);
}

static void test_tokenize_and_friends(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    resp_t r = call("GET", "/version", NULL, NULL);
    assert_int_equal(r.status, 200);
    json_t *j = json_of(&r);
    assert_true(json_is_string(json_object_get(j, "version")) && json_string_length(json_object_get(j, "version")));
    json_decref(j);
    free(r.body);
    /* the model by its served name; another id is OpenAI's 404 */
    r = call("GET", "/v1/models/SmolLM2-135M-Instruct.Q4_1", NULL, NULL);
    assert_int_equal(r.status, 200);
    j = json_of(&r);
    assert_string_equal(json_string_value(json_object_get(j, "id")), "SmolLM2-135M-Instruct.Q4_1");
    assert_string_equal(json_string_value(json_object_get(j, "object")), "model");
    assert_true(json_integer_value(json_object_get(j, "max_model_len")) > 0);
    json_decref(j);
    free(r.body);
    static const char *const unknown[] = {"/v1/models/gpt-4", "/v1/models/HuggingFaceTB/SmolLM2-135M-Instruct",
                                          "/v1/models/SmolLM2-135M-Instruct.Q4_1x"};
    for (size_t i = 0; i < 3; i++) {
        r = call("GET", unknown[i], NULL, NULL);
        expect_error(&r, 404, "model", "does not exist");
        j = json_of(&r);
        assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "code")), "model_not_found");
        json_decref(j);
        free(r.body);
    }
    /* tokenize and back */
    const char *text = "The quick brown fox jumps over the lazy dog. \\u00e9t\\u00e9";
    char body[512];
    snprintf(body, sizeof(body),
             "{\"model\":\"SmolLM2-135M-Instruct.Q4_1\",\"prompt\":\"%s\",\"return_token_strs\":true}", text);
    r = call("POST", "/tokenize", KEY_A, body);
    if (r.status != 200) fail_msg("tokenize: HTTP %d %s", r.status, r.body);
    j = json_of(&r);
    json_t *toks = json_object_get(j, "tokens"), *strs = json_object_get(j, "token_strs");
    size_t n = json_array_size(toks);
    assert_true(n > 5);
    assert_int_equal(json_integer_value(json_object_get(j, "count")), (json_int_t)n);
    assert_true(json_integer_value(json_object_get(j, "max_model_len")) > 0);
    assert_int_equal(json_array_size(strs), n);
    char joined[512] = "";
    for (size_t i = 0; i < n; i++) strcat(joined, json_string_value(json_array_get(strs, i)));
    assert_string_equal(joined, "The quick brown fox jumps over the lazy dog. \xc3\xa9t\xc3\xa9");
    char *ids = json_dumps(toks, JSON_COMPACT);
    snprintf(body, sizeof(body), "{\"tokens\":%s}", ids);
    free(ids);
    json_decref(j);
    free(r.body);
    r = call("POST", "/detokenize", KEY_A, body);
    if (r.status != 200) fail_msg("detokenize: HTTP %d %s", r.status, r.body);
    j = json_of(&r);
    assert_string_equal(json_string_value(json_object_get(j, "prompt")),
                        "The quick brown fox jumps over the lazy dog. \xc3\xa9t\xc3\xa9");
    json_decref(j);
    free(r.body);
    /* messages: as many tokens as the chat completion's prompt */
    const char *msgs = "\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                       "{\"role\":\"user\",\"content\":\"Name a colour.\"}]";
    snprintf(body, sizeof(body), "{%s}", msgs);
    r = call("POST", "/tokenize", KEY_A, body);
    assert_int_equal(r.status, 200);
    j = json_of(&r);
    json_int_t count = json_integer_value(json_object_get(j, "count"));
    json_decref(j);
    free(r.body);
    snprintf(body, sizeof(body), "{%s,\"max_tokens\":1}", msgs);
    r = call("POST", "/v1/chat/completions", KEY_A, body);
    assert_int_equal(r.status, 200);
    j = json_of(&r);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens")), count);
    json_decref(j);
    free(r.body);
    /* refusals, by name */
#define CHECK(P, K, B, S, F)                                                                                           \
    do {                                                                                                               \
        r = call("POST", P, K, B);                                                                                     \
        expect_error(&r, S, F, NULL);                                                                                  \
        free(r.body);                                                                                                  \
    } while (0)
    CHECK("/tokenize", KEY_A, "{\"prompt\":5}", 400, "prompt");
    CHECK("/tokenize", KEY_A, "{\"prompt\":\"hi\",\"model\":\"gpt-4\"}", 404, "model");
    CHECK("/tokenize", KEY_A, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"add_generation_prompt\":false}",
          400, "add_generation_prompt");
    CHECK("/tokenize", KEY_A, "{\"messages\":\"x\"}", 400, "messages");
    CHECK("/tokenize", KEY_A, "[1]", 400, NULL);
    CHECK("/tokenize", NULL, "{\"prompt\":\"hi\"}", 401, NULL);
    CHECK("/detokenize", KEY_A, "{\"tokens\":[1,-1]}", 400, "tokens");
    CHECK("/detokenize", KEY_A, "{\"tokens\":[1,99999999]}", 400, "tokens");
    CHECK("/detokenize", KEY_A, "{\"tokens\":\"1 2\"}", 400, "tokens");
#undef CHECK
    r = call("POST", "/detokenize", KEY_A, "{\"tokens\":[]}");
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"prompt\":\"\""));
    free(r.body);
}

/* ---- max_completion_tokens on both endpoints, min_tokens within it ---- */

static json_int_t completion_tokens(const char *path, const char *body)
{
    resp_t r = call("POST", path, KEY_A, body);
    if (r.status != 200) fail_msg("%s %s: HTTP %d %s", path, body, r.status, r.body);
    json_t *j = json_of(&r);
    json_int_t n = json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens"));
    json_decref(j);
    free(r.body);
    return n;
}

static void test_max_completion_tokens(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    const char *chat = "\"messages\":[{\"role\":\"user\",\"content\":\"Count to fifty.\"}],\"ignore_eos\":true";
    char b[512];
    assert_int_equal(completion_tokens("/v1/completions", "{\"prompt\":\"Once\",\"max_completion_tokens\":3,"
                                                          "\"ignore_eos\":true}"),
                     3);
    assert_int_equal(completion_tokens("/v1/completions", "{\"prompt\":\"Once\",\"max_completion_tokens\":4,"
                                                          "\"max_tokens\":4,\"ignore_eos\":true}"),
                     4);
    snprintf(b, sizeof(b), "{%s,\"max_tokens\":2}", chat);
    assert_int_equal(completion_tokens("/v1/chat/completions", b), 2);
    snprintf(b, sizeof(b), "{%s,\"max_completion_tokens\":5}", chat);
    assert_int_equal(completion_tokens("/v1/chat/completions", b), 5);
    snprintf(b, sizeof(b), "{%s,\"max_completion_tokens\":1,\"min_tokens\":0}", chat);
    assert_int_equal(completion_tokens("/v1/chat/completions", b), 1);
    resp_t r;
    r = call("POST", "/v1/completions", KEY_A, "{\"prompt\":\"Once\",\"max_completion_tokens\":3,\"max_tokens\":5}");
    expect_error(&r, 400, "max_completion_tokens", "max_tokens");
    free(r.body);
    snprintf(b, sizeof(b), "{%s,\"max_completion_tokens\":3,\"max_tokens\":7}", chat);
    r = call("POST", "/v1/chat/completions", KEY_A, b);
    expect_error(&r, 400, "max_completion_tokens", NULL);
    free(r.body);
    r = call("POST", "/v1/completions", KEY_A, "{\"prompt\":\"Once\",\"max_completion_tokens\":0}");
    expect_error(&r, 400, "max_completion_tokens", NULL);
    free(r.body);
    r = call("POST", "/v1/completions", KEY_A, "{\"prompt\":\"Once\",\"min_tokens\":4,\"max_tokens\":3}");
    expect_error(&r, 400, "min_tokens", "between 0 and 3");
    free(r.body);
    r = call("POST", "/v1/completions", KEY_A, "{\"prompt\":\"Once\",\"min_tokens\":-1}");
    expect_error(&r, 400, "min_tokens", NULL);
    free(r.body);
}

/* ---- sampling controls over HTTP ---- */

/* top_logprobs on both endpoints, streaming too: the alternatives in
 * OpenAI's shapes, greedy's pick first among them; logit_bias of 100
 * makes a token every pick; a stop token id ends the answer with "stop";
 * penalties are taken and change a repetitive greedy answer. */
static void test_sampling_controls(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    const char *chat = "\"messages\":[{\"role\":\"user\",\"content\":\"Count from one to twenty.\"}]";
    char b[768];
    snprintf(b, sizeof(b), "{%s,\"max_tokens\":6,\"temperature\":0,\"logprobs\":true,\"top_logprobs\":3}", chat);
    resp_t r = call("POST", "/v1/chat/completions", KEY_A, b);
    assert_int_equal(r.status, 200);
    json_t *j = json_of(&r);
    json_t *content =
        json_object_get(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs"), "content");
    assert_int_equal(json_array_size(content), 6);
    for (size_t i = 0; i < 6; i++) {
        json_t *e = json_array_get(content, i), *alt = json_object_get(e, "top_logprobs");
        assert_int_equal(json_array_size(alt), 3);
        assert_string_equal(json_string_value(json_object_get(json_array_get(alt, 0), "token")),
                            json_string_value(json_object_get(e, "token")));
        assert_true(fabs(json_real_value(json_object_get(json_array_get(alt, 0), "logprob")) -
                         json_real_value(json_object_get(e, "logprob"))) < 1e-5);
        assert_true(json_real_value(json_object_get(json_array_get(alt, 1), "logprob")) <=
                    json_real_value(json_object_get(json_array_get(alt, 0), "logprob")));
    }
    json_decref(j);
    free(r.body);
    /* completions: logprobs N, a {token: logprob} map per position; streamed */
    r = call("POST", "/v1/completions", KEY_A,
             "{\"prompt\":\"One, two,\",\"max_tokens\":4,\"temperature\":0,\"logprobs\":2,\"stream\":true}");
    assert_int_equal(r.status, 200);
    int maps = 0;
    const char *at = r.body;
    for (json_t *c; (c = sse_next(&at)); json_decref(c)) {
        json_t *tl = json_object_get(json_object_get(json_array_get(json_object_get(c, "choices"), 0), "logprobs"),
                                     "top_logprobs");
        for (size_t k = 0; k < json_array_size(tl); k++) maps += json_object_size(json_array_get(tl, k)) >= 1;
    }
    assert_int_equal(maps, 4);
    free(r.body);
    /* logit_bias 100 on one token: every pick */
    r = call("POST", "/v1/completions", KEY_A,
             "{\"prompt\":[1,2,3],\"max_tokens\":5,\"temperature\":0,\"ignore_eos\":true,\"logit_bias\":{\"320\":100},"
             "\"logprobs\":0}");
    assert_int_equal(r.status, 200);
    j = json_of(&r);
    json_t *toks =
        json_object_get(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs"), "tokens");
    assert_int_equal(json_array_size(toks), 5);
    for (size_t i = 1; i < 5; i++)
        assert_string_equal(json_string_value(json_array_get(toks, i)), json_string_value(json_array_get(toks, 0)));
    json_decref(j);
    free(r.body);
    /* a stop token id: the greedy answer's third token ends it */
    r = call("POST", "/v1/completions", KEY_A,
             "{\"prompt\":\"One, two,\",\"max_tokens\":8,\"temperature\":0,\"ignore_eos\":true}");
    j = json_of(&r);
    json_decref(j);
    free(r.body);
    r = call("POST", "/tokenize", KEY_A, "{\"prompt\":\" three, four, five\"}");
    assert_int_equal(r.status, 200);
    j = json_of(&r);
    json_int_t stop = json_integer_value(json_array_get(json_object_get(j, "tokens"), 0));
    json_decref(j);
    free(r.body);
    snprintf(b, sizeof(b),
             "{\"prompt\":\"One, two,\",\"max_tokens\":8,\"temperature\":0,\"ignore_eos\":true,"
             "\"stop_token_ids\":[%lld],\"logit_bias\":{\"%lld\":100}}",
             (long long)stop, (long long)stop);
    r = call("POST", "/v1/completions", KEY_A, b);
    assert_int_equal(r.status, 200);
    j = json_of(&r);
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(c0, "finish_reason")), "stop");
    assert_string_equal(json_string_value(json_object_get(c0, "text")), ""); /* the stop token is not text */
    json_decref(j);
    free(r.body);
    /* min_tokens holds it back: 3 tokens before the (forced) stop token can end it */
    snprintf(b, sizeof(b),
             "{\"prompt\":\"One, two,\",\"max_tokens\":8,\"temperature\":0,\"ignore_eos\":true,"
             "\"stop_token_ids\":[%lld],\"logit_bias\":{\"%lld\":100},\"min_tokens\":3}",
             (long long)stop, (long long)stop);
    r = call("POST", "/v1/completions", KEY_A, b);
    assert_int_equal(r.status, 200);
    j = json_of(&r);
    c0 = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(c0, "finish_reason")), "stop");
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), 3);
    json_decref(j);
    free(r.body);
}

/* ---- tool calls ---- */

#define WEATHER                                                                                                        \
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"The weather in a "     \
    "city\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":"         \
    "[\"city\"]}}}]"

/* A chat answer's message checked for shape: content (a string, or null
 * beside tool calls), tool calls with ids, names and JSON arguments, and
 * a finish reason that says tool_calls exactly when there are some.
 * Returns the message (a reference into j). */
static json_t *checked_message(json_t *j)
{
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0), *m = json_object_get(c0, "message");
    json_t *calls = json_object_get(m, "tool_calls"), *content = json_object_get(m, "content");
    const char *fin = json_string_value(json_object_get(c0, "finish_reason"));
    assert_non_null(fin);
    assert_true(json_is_string(content) || (json_is_null(content) && calls));
    if (calls) {
        assert_true(json_array_size(calls) >= 1);
        assert_string_equal(fin, "tool_calls");
        for (size_t k = 0; k < json_array_size(calls); k++) {
            json_t *c = json_array_get(calls, k), *fn = json_object_get(c, "function");
            assert_true(!strncmp(json_string_value(json_object_get(c, "id")), "call_", 5));
            assert_string_equal(json_string_value(json_object_get(c, "type")), "function");
            assert_true(json_string_length(json_object_get(fn, "name")) > 0);
            json_t *a = json_loads(json_string_value(json_object_get(fn, "arguments")), 0, NULL);
            assert_true(json_is_object(a));
            json_decref(a);
        }
    } else {
        assert_true(strcmp(fin, "tool_calls"));
    }
    return m;
}

/* A stream's content and tool calls, accumulated as a client does (the
 * deltas of a call joined by index). */
static void accumulate(const char *body, char *content, size_t cap, json_t *calls, const char **fin_p)
{
    content[0] = 0;
    const char *at = body;
    for (json_t *c; (c = sse_next(&at)); json_decref(c)) {
        json_t *ch = json_array_get(json_object_get(c, "choices"), 0), *delta = json_object_get(ch, "delta");
        const char *t = json_string_value(json_object_get(delta, "content"));
        if (t) strncat(content, t, cap - strlen(content) - 1);
        json_t *tc = json_object_get(delta, "tool_calls");
        for (size_t k = 0; k < json_array_size(tc); k++) {
            json_t *d1 = json_array_get(tc, k);
            size_t idx = (size_t)json_integer_value(json_object_get(d1, "index"));
            while (json_array_size(calls) <= idx)
                json_array_append_new(calls, json_pack("{s:s, s:s, s:s}", "id", "", "name", "", "arguments", ""));
            json_t *acc = json_array_get(calls, idx), *fn = json_object_get(d1, "function");
            static const char *const keys[] = {"id", "name", "arguments"};
            for (int q = 0; q < 3; q++) {
                json_t *v = json_object_get(q ? fn : d1, keys[q]);
                if (!json_is_string(v)) continue;
                char buf[4096];
                snprintf(buf, sizeof(buf), "%s%s", json_string_value(json_object_get(acc, keys[q])),
                         json_string_value(v));
                json_object_set_new(acc, keys[q], json_string(buf));
            }
        }
        const char *f = json_string_value(json_object_get(ch, "finish_reason"));
        if (f) *fin_p = strdup(f);
    }
}

static void test_tool_calls(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    /* auto: whatever the model says, the answer is well formed, and the
     * stream (content and accumulated tool-call deltas) says the same */
    const char *msgs = "\"messages\":[{\"role\":\"user\",\"content\":\"What is the weather in Paris?\"}]";
    for (int q = 0; q < 3; q++) {
        char b[2048];
        snprintf(b, sizeof(b), "{%s,%s,\"max_tokens\":48,\"temperature\":%s,\"seed\":%d%s}", msgs, WEATHER,
                 q ? "0.8" : "0", q, "");
        resp_t r = call("POST", "/v1/chat/completions", KEY_A, b);
        if (r.status != 200) fail_msg("%s", r.body);
        json_t *j = json_of(&r), *m = checked_message(j);
        snprintf(b + strlen(b) - 1, sizeof(b) - strlen(b) + 1, ",\"stream\":true}");
        resp_t rs = call("POST", "/v1/chat/completions", KEY_A, b);
        assert_int_equal(rs.status, 200);
        char content[8192];
        json_t *calls = json_array();
        const char *fin = NULL;
        accumulate(rs.body, content, sizeof(content), calls, &fin);
        json_t *want = json_object_get(m, "tool_calls");
        const char *wc = json_string_value(json_object_get(m, "content"));
        assert_string_equal(content, wc ? wc : "");
        assert_int_equal(json_array_size(calls), json_array_size(want));
        for (size_t k = 0; k < json_array_size(want); k++) {
            json_t *w = json_object_get(json_array_get(want, k), "function"), *g = json_array_get(calls, k);
            assert_string_equal(json_string_value(json_object_get(g, "name")),
                                json_string_value(json_object_get(w, "name")));
            assert_string_equal(json_string_value(json_object_get(g, "arguments")),
                                json_string_value(json_object_get(w, "arguments")));
            assert_true(!strncmp(json_string_value(json_object_get(g, "id")), "call_", 5));
        }
        assert_non_null(fin);
        assert_string_equal(
            fin, json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "finish_reason")));
        free((void *)fin);
        json_decref(calls);
        json_decref(j);
        free(r.body);
        free(rs.body);
    }
    /* a conversation with a call and its result */
    resp_t r = call("POST", "/v1/chat/completions", KEY_A,
                    "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"},{\"role\":\"assistant\","
                    "\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":"
                    "\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},{\"role\":\"tool\","
                    "\"tool_call_id\":\"call_1\",\"content\":\"21 C and sunny\"}]," WEATHER ",\"max_tokens\":8}");
    if (r.status != 200) fail_msg("%s", r.body);
    json_t *j = json_of(&r);
    checked_message(j);
    json_decref(j);
    free(r.body);
    /* bad tool requests name their field, and the server goes on */
    r = call("POST", "/v1/chat/completions", KEY_A,
             "{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]," WEATHER ",\"max_tokens\":2}");
    expect_error(&r, 400, "messages", "tool_call_id");
    free(r.body);
    r = call("POST", "/v1/chat/completions", KEY_A,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]," WEATHER
             ",\"tool_choice\":\"required\",\"response_format\":{\"type\":\"json_object\"}}");
    expect_error(&r, 400, "tool_choice", NULL);
    free(r.body);
    /* required and named choices: enforced once the workers apply the
     * grammar, which a choice list shows */
    r = call(
        "POST", "/v1/chat/completions", KEY_A,
        "{\"messages\":[{\"role\":\"user\",\"content\":\"Pick one.\"}],\"guided_choice\":[\"alpha-17\",\"beta-42\"],"
        "\"max_tokens\":8,\"temperature\":1,\"seed\":3}");
    assert_int_equal(r.status, 200);
    j = json_of(&r);
    const char *t = json_string_value(
        json_object_get(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message"), "content"));
    bool enforced = t && (!strcmp(t, "alpha-17") || !strcmp(t, "beta-42"));
    json_decref(j);
    free(r.body);
    if (!enforced) {
        print_message("the workers do not apply grammars yet (guided_choice gave '%s'): required and named tool "
                      "choices checked for shape only\n",
                      t ? t : "(null)");
    }
    static const char *const choices[] = {"\"required\"",
                                          "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}"};
    for (int k = 0; k < 2; k++) {
        char b[2048];
        snprintf(b, sizeof(b), "{%s,%s,\"tool_choice\":%s,\"max_tokens\":64,\"temperature\":0.7,\"seed\":1}", msgs,
                 WEATHER, choices[k]);
        r = call("POST", "/v1/chat/completions", KEY_A, b);
        if (r.status != 200) fail_msg("%s", r.body);
        j = json_of(&r);
        json_t *m = checked_message(j);
        if (enforced) {
            json_t *calls = json_object_get(m, "tool_calls");
            if (!calls) fail_msg("tool_choice %s gave no tool call: %s", choices[k], r.body);
            assert_string_equal(
                json_string_value(json_object_get(json_object_get(json_array_get(calls, 0), "function"), "name")),
                "get_weather");
        }
        json_decref(j);
        free(r.body);
    }
    /* issue 35: parameters as OpenAI's and Pydantic's clients write them
     * (strict, titles, descriptions, examples, defaults, vendor keys)
     * constrain nothing beyond their structure, and are served (they were
     * a 400 "keyword 'strict' is not supported" under required) */
    r = call(
        "POST", "/v1/chat/completions", KEY_A,
        "{\"messages\":[{\"role\":\"user\",\"content\":\"What is the weather in Paris?\"}],"
        "\"tool_choice\":\"required\",\"parallel_tool_calls\":false,\"max_tokens\":64,\"temperature\":0.7,\"seed\":1,"
        "\"tools\":[{\"type\":"
        "\"function\","
        "\"function\":{\"name\":\"get_weather\",\"strict\":true,\"parameters\":{\"type\":\"object\",\"strict\":true,"
        "\"title\":\"GetWeather\",\"description\":\"Arguments\",\"$comment\":\"c\",\"x-order\":[\"city\"],"
        "\"properties\":{\"city\":{\"type\":\"string\",\"title\":\"City\",\"description\":\"a city\","
        "\"examples\":[\"Paris\"],\"default\":\"Paris\",\"x-order\":0}},\"required\":[\"city\"],"
        "\"additionalProperties\":false}}}]}");
    if (r.status != 200) fail_msg("annotated parameters under tool_choice required: HTTP %d %s", r.status, r.body);
    j = json_of(&r);
    json_t *am = checked_message(j);
    if (enforced && !json_object_get(am, "tool_calls")) fail_msg("annotated parameters gave no tool call: %s", r.body);
    json_decref(j);
    free(r.body);
    /* what would constrain and cannot be enforced is still refused by name */
    r = call("POST", "/v1/chat/completions", KEY_A,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"required\",\"tools\":[{"
             "\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"x-order\":1,"
             "\"properties\":{\"n\":{\"type\":\"integer\",\"title\":\"N\",\"maximum\":9}}}}}]}");
    expect_error(&r, 400, "tools", "keyword 'maximum'");
    free(r.body);
}

/* ---- the Responses API (router/responses.c) ---- */

#define WEATHER_RESP                                                                                                   \
    "\"tools\":[{\"type\":\"function\",\"name\":\"get_weather\",\"description\":\"The weather in a city\","            \
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}]"

/* A stream's events, checked as OpenAI sends them: each "event: TYPE"
 * line and its data's "type" agree, sequence_number counts from 0, no
 * [DONE].  Returns them in order (a new array). */
static json_t *resp_events(const char *body)
{
    json_t *evs = json_array();
    assert_null(strstr(body, "[DONE]"));
    for (const char *e = strstr(body, "event: "); e; e = strstr(e + 1, "\nevent: ")) {
        if (*e == '\n') e++;
        const char *d = strstr(e, "\ndata: ");
        assert_non_null(d);
        json_t *j = json_loadb(d + 7, strcspn(d + 7, "\n"), 0, NULL);
        if (!j) fail_msg("an event's data is not JSON: %.200s", d);
        const char *type = json_string_value(json_object_get(j, "type"));
        assert_non_null(type);
        if (strncmp(e + 7, type, strlen(type)) || e[7 + strlen(type)] != '\n')
            fail_msg("event line %.60s for data of type %s", e, type);
        assert_int_equal(json_integer_value(json_object_get(j, "sequence_number")), (json_int_t)json_array_size(evs));
        json_array_append_new(evs, j);
    }
    return evs;
}

static const char *ev_type(json_t *evs, size_t i)
{
    return json_string_value(json_object_get(json_array_get(evs, i), "type"));
}

/* A whole response's first output item of type (NULL: none). */
static json_t *resp_item(json_t *j, const char *type)
{
    json_t *out = json_object_get(j, "output"), *it;
    size_t i;
    json_array_foreach(out, i, it) if (!strcmp(json_string_value(json_object_get(it, "type")), type)) return it;
    return NULL;
}

/* The message item's text (the item's one output_text part). */
static const char *resp_text(json_t *j)
{
    json_t *m = resp_item(j, "message");
    assert_non_null(m);
    assert_string_equal(json_string_value(json_object_get(m, "role")), "assistant");
    json_t *part = json_array_get(json_object_get(m, "content"), 0);
    assert_string_equal(json_string_value(json_object_get(part, "type")), "output_text");
    const char *t = json_string_value(json_object_get(part, "text"));
    assert_non_null(t);
    return t;
}

static void test_responses(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    /* text with instructions: the chat completion of the same messages,
     * as a response object with usage, and incomplete at its limit */
    resp_t r = call("POST", "/v1/responses", KEY_A,
                    "{\"input\":\"Count to fifty.\",\"instructions\":\"Be brief.\",\"max_output_tokens\":6,"
                    "\"temperature\":0,\"store\":true,\"metadata\":{\"run\":\"t1\"}}");
    if (r.status != 200) fail_msg("%s", r.body);
    json_t *j = json_of(&r);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "response");
    assert_true(!strncmp(json_string_value(json_object_get(j, "id")), "resp_", 5));
    assert_string_equal(json_string_value(json_object_get(j, "instructions")), "Be brief.");
    assert_int_equal(json_integer_value(json_object_get(j, "max_output_tokens")), 6);
    assert_true(json_is_false(json_object_get(j, "store"))); /* ferry keeps none */
    assert_string_equal(json_string_value(json_object_get(json_object_get(j, "metadata"), "run")), "t1");
    json_t *u = json_object_get(j, "usage");
    json_int_t in = json_integer_value(json_object_get(u, "input_tokens"));
    json_int_t out = json_integer_value(json_object_get(u, "output_tokens"));
    assert_true(in > 0 && out > 0 && out <= 6);
    assert_int_equal(json_integer_value(json_object_get(u, "total_tokens")), in + out);
    const char *status = json_string_value(json_object_get(j, "status"));
    if (out == 6) {
        assert_string_equal(status, "incomplete");
        assert_string_equal(json_string_value(json_object_get(json_object_get(j, "incomplete_details"), "reason")),
                            "max_output_tokens");
    } else {
        assert_string_equal(status, "completed");
    }
    const char *text = resp_text(j);
    resp_t c = call("POST", "/v1/chat/completions", KEY_A,
                    "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":"
                    "\"Count to fifty.\"}],\"max_completion_tokens\":6,\"temperature\":0}");
    json_t *cj = json_of(&c);
    json_t *c0 = json_array_get(json_object_get(cj, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(json_object_get(c0, "message"), "content")), text);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(cj, "usage"), "prompt_tokens")), in);
    json_decref(cj);
    free(c.body);

    /* streamed: the events in OpenAI's order, their deltas the same text */
    resp_t s = call("POST", "/v1/responses", KEY_A,
                    "{\"input\":[{\"role\":\"developer\",\"content\":\"Be brief.\"},{\"type\":\"message\",\"role\":"
                    "\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"Count to fifty.\"}]}],"
                    "\"max_output_tokens\":6,\"temperature\":0,\"stream\":true}");
    assert_int_equal(s.status, 200);
    assert_non_null(strcasestr(s.head, "text/event-stream"));
    json_t *evs = resp_events(s.body);
    static const char *const head[] = {"response.created", "response.in_progress", "response.output_item.added",
                                       "response.content_part.added"};
    size_t n = json_array_size(evs), k = 0;
    assert_true(n >= 9);
    for (; k < 4; k++) assert_string_equal(ev_type(evs, k), head[k]);
    char deltas[4096] = "";
    for (; k < n && !strcmp(ev_type(evs, k), "response.output_text.delta"); k++)
        strncat(deltas, json_string_value(json_object_get(json_array_get(evs, k), "delta")),
                sizeof(deltas) - strlen(deltas) - 1);
    static const char *const tail[] = {"response.output_text.done", "response.content_part.done",
                                       "response.output_item.done"};
    assert_int_equal(n - k, 4);
    for (int q = 0; q < 3; q++, k++) assert_string_equal(ev_type(evs, k), tail[q]);
    assert_string_equal(ev_type(evs, k), out == 6 ? "response.incomplete" : "response.completed");
    assert_string_equal(deltas, text);
    assert_string_equal(json_string_value(json_object_get(json_array_get(evs, n - 4), "text")), text);
    json_t *fin = json_object_get(json_array_get(evs, n - 1), "response");
    assert_string_equal(resp_text(fin), text);
    assert_string_equal(json_string_value(json_object_get(fin, "status")), status);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(fin, "usage"), "output_tokens")), out);
    json_t *added = json_object_get(json_array_get(evs, 2), "item");
    assert_string_equal(json_string_value(json_object_get(added, "id")),
                        json_string_value(json_object_get(resp_item(fin, "message"), "id")));
    json_decref(evs);
    free(s.body);
    json_decref(j);
    free(r.body);

    /* a named function tool: a function_call item, whole and streamed
     * (its argument deltas add up to the whole's arguments) */
    const char *named = "{\"input\":\"What is the weather in Paris?\"," WEATHER_RESP
                        ",\"tool_choice\":{\"type\":\"function\",\"name\":\"get_weather\"},\"max_output_tokens\":48,"
                        "\"temperature\":0%s}";
    char b[1024];
    snprintf(b, sizeof(b), named, "");
    r = call("POST", "/v1/responses", KEY_A, b);
    if (r.status != 200) fail_msg("%s", r.body);
    j = json_of(&r);
    json_t *fc = resp_item(j, "function_call");
    if (!fc) fail_msg("a named tool choice gave no function_call: %s", r.body);
    assert_string_equal(json_string_value(json_object_get(fc, "name")), "get_weather");
    assert_true(!strncmp(json_string_value(json_object_get(fc, "call_id")), "call_", 5));
    const char *args = json_string_value(json_object_get(fc, "arguments"));
    json_t *a = json_loads(args, 0, NULL);
    assert_true(json_is_string(json_object_get(a, "city")));
    json_decref(a);
    snprintf(b, sizeof(b), named, ",\"stream\":true");
    s = call("POST", "/v1/responses", KEY_A, b);
    assert_int_equal(s.status, 200);
    evs = resp_events(s.body);
    n = json_array_size(evs);
    char argd[4096] = "";
    const char *done_args = NULL;
    bool call_added = false;
    for (k = 0; k < n; k++) {
        json_t *e = json_array_get(evs, k);
        const char *t = ev_type(evs, k);
        if (!strcmp(t, "response.output_item.added"))
            call_added =
                !strcmp(json_string_value(json_object_get(json_object_get(e, "item"), "type")), "function_call");
        if (!strcmp(t, "response.function_call_arguments.delta")) {
            assert_true(call_added);
            strncat(argd, json_string_value(json_object_get(e, "delta")), sizeof(argd) - strlen(argd) - 1);
        }
        if (!strcmp(t, "response.function_call_arguments.done"))
            done_args = json_string_value(json_object_get(e, "arguments"));
        assert_true(strcmp(t, "response.output_text.delta")); /* no message: the answer is the call */
    }
    assert_non_null(done_args);
    assert_string_equal(argd, args);
    assert_string_equal(done_args, args);
    assert_string_equal(ev_type(evs, n - 1), "response.completed");
    fin = json_object_get(json_array_get(evs, n - 1), "response");
    assert_string_equal(json_string_value(json_object_get(resp_item(fin, "function_call"), "arguments")), args);
    json_decref(evs);
    free(s.body);

    /* the next turn: the call and its output as input items */
    char turn[2048], *fargs = json_dumps(json_object_get(fc, "arguments"), JSON_ENCODE_ANY);
    snprintf(turn, sizeof(turn),
             "{\"input\":[{\"role\":\"user\",\"content\":\"What is the weather in Paris?\"},{\"type\":"
             "\"function_call\",\"call_id\":\"%s\",\"name\":\"get_weather\",\"arguments\":%s},{\"type\":"
             "\"function_call_output\",\"call_id\":\"%s\",\"output\":\"21 C and sunny\"}]," WEATHER_RESP
             ",\"max_output_tokens\":8}",
             json_string_value(json_object_get(fc, "call_id")), fargs,
             json_string_value(json_object_get(fc, "call_id")));
    free(fargs);
    json_decref(j);
    free(r.body);
    r = call("POST", "/v1/responses", KEY_A, turn);
    if (r.status != 200) fail_msg("%s", r.body);
    j = json_of(&r);
    assert_true(json_array_size(json_object_get(j, "output")) >= 1);
    json_decref(j);
    free(r.body);

    /* structured output through text.format */
    r = call("POST", "/v1/responses", KEY_A,
             "{\"input\":\"Is the sky blue?\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"yn\","
             "\"schema\":{\"type\":\"object\",\"properties\":{\"answer\":{\"enum\":[\"yes\",\"no\"]}},\"required\":"
             "[\"answer\"],\"additionalProperties\":false},\"strict\":true}},\"max_output_tokens\":32}");
    if (r.status != 200) fail_msg("%s", r.body);
    j = json_of(&r);
    a = json_loads(resp_text(j), 0, NULL);
    if (!json_is_string(json_object_get(a, "answer"))) fail_msg("not the schema's: %s", r.body);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(json_object_get(j, "text"), "format"), "name")), "yn");
    json_decref(a);
    json_decref(j);
    free(r.body);

    /* what ferry does not do is refused naming the field, and it goes on serving */
    static const struct {
        const char *body, *param, *in_message;
    } bad[] = {
        {"{\"input\":\"x\",\"previous_response_id\":\"resp_1\"}", "previous_response_id", "keeps no responses"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"web_search\"}]}", "tools", "'web_search'"},
        {"{\"input\":\"x\",\"tool_choice\":{\"type\":\"file_search\"}}", "tool_choice", "file_search"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"a b\"}]}", "tools", "tools[0].name"},
        {"{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\",\"image_url\":\"x\"}]}]}", "input",
         "input_image"},
        {"{\"input\":[{\"type\":\"reasoning\",\"summary\":[]}]}", "input", "'reasoning'"},
        /* chat's message 2 is input item 1 (the instructions came first) */
        {"{\"instructions\":\"x\",\"input\":[{\"role\":\"user\",\"content\":\"a\"},{\"type\":"
         "\"function_call\",\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":\"nope\"}]}",
         "input", "input[1]: tool_calls[0]"},
        {"{\"input\":[{\"type\":\"function_call_output\",\"output\":\"x\"}]}", "input", "call_id"},
        {"{\"input\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "input", "role"},
        {"{\"input\":\"x\",\"max_output_tokens\":0}", "max_output_tokens", "'max_output_tokens'"},
        {"{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"xml\"}}}", "text.format", "xml"},
        {"{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"n\",\"schema\":3}}}",
         "text.format", "'text.format"},
        {"{\"input\":\"x\",\"include\":[\"message.output_text.logprobs\"]}", "include", NULL},
        {"{\"input\":\"x\",\"background\":true}", "background", NULL},
        {"{\"input\":\"x\",\"truncation\":\"auto\"}", "truncation", NULL},
        {"{\"instructions\":\"x\"}", "input", NULL},
        {"{\"input\":\"x\",\"model\":\"no-such-model\"}", "model", NULL},
    };
    for (size_t q = 0; q < sizeof(bad) / sizeof(bad[0]); q++) {
        r = call("POST", "/v1/responses", KEY_A, bad[q].body);
        int want = strstr(bad[q].body, "no-such-model") ? 404 : 400;
        expect_error(&r, want, bad[q].param, bad[q].in_message);
        free(r.body);
    }
    r = call("POST", "/v1/responses", KEY_A, "{\"input\":\"Hi\",\"max_output_tokens\":2}");
    assert_int_equal(r.status, 200);
    free(r.body);
}

/* ---- the Responses stream's ends, driven without a cluster (what a live
 * model seldom shows: calls after white space, a failure mid-answer) ---- */

typedef struct sse_buf {
    char s[65536];
    size_t n;
} sse_buf_t;

static bool sse_add(void *arg, const char *s, size_t n)
{
    sse_buf_t *b = arg;
    assert_true(b->n + n < sizeof(b->s));
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
    return true;
}

static void test_responses_stream_ends(void **state)
{
    (void)state;
    const char *path = fy_test_default_model();
    if (!path) skip();
    fy_model_t *m = NULL;
    assert_int_equal(fy_model_load(path, &m), FY_OK);
    fy_http_front_t f = {.model = m, .model_id = "", .served = "served", .max_ctx = 2048, .default_max_tokens = 64};
    static const char body[] = "{\"input\":\"Weather?\"," WEATHER_RESP "}";
    json_t *usage = json_pack("{s:i, s:i, s:{s:i}}", "prompt_tokens", 7, "completion_tokens", 5,
                              "prompt_tokens_details", "cached_tokens", 2);
    json_t *first = json_pack("[{s:i, s:s, s:s, s:{s:s, s:s}}]", "index", 0, "id", "call_1", "type", "function",
                              "function", "name", "get_weather", "arguments", "");
    json_t *more = json_pack("[{s:i, s:{s:s}}]", "index", 0, "function", "arguments", "{\"city\":\"Paris\"}");
    for (int q = 0; q < 4; q++) {
        fy_http_gen_t g;
        fy_http_fault_t fault;
        fy_responses_t *rs = NULL;
        assert_int_equal(fy_responses_parse(&f, body, strlen(body), &g, &rs, &fault), FY_OK);
        fy_free(g.ids);
        fy_free(g.tool_names);
        sse_buf_t *b = calloc(1, sizeof(*b));
        /* 0: white space, then a call; 1: text, then a call; 2: text, then a
         * failure; 3: nothing at all */
        if (q < 3) fy_responses_stream_text(rs, q ? "Hello" : " \n", q ? 5 : 2, sse_add, b);
        if (q < 2) {
            fy_responses_stream_calls(rs, first, sse_add, b);
            fy_responses_stream_calls(rs, more, sse_add, b);
        }
        fy_responses_stream_end(rs, q < 2 ? "tool_calls" : "stop", usage, q == 2 ? "worker lost" : NULL, sse_add, b);
        json_t *evs = resp_events(b->s);
        size_t n = json_array_size(evs);
        json_t *fin = json_object_get(json_array_get(evs, n - 1), "response"), *out = json_object_get(fin, "output");
        assert_string_equal(ev_type(evs, 0), "response.created");
        assert_string_equal(ev_type(evs, 1), "response.in_progress");
        assert_string_equal(ev_type(evs, n - 1), q == 2 ? "response.failed" : "response.completed");
        assert_int_equal(json_integer_value(json_object_get(json_object_get(fin, "usage"), "total_tokens")), 12);
        assert_int_equal(json_array_size(out), q == 1 ? 2 : 1);
        const char *t0 = json_string_value(json_object_get(json_array_get(out, 0), "type"));
        assert_string_equal(t0, q == 0 ? "function_call" : "message"); /* white space before a call is no message */
        if (q < 2) {
            json_t *fc = json_array_get(out, q);
            assert_string_equal(json_string_value(json_object_get(fc, "call_id")), "call_1");
            assert_string_equal(json_string_value(json_object_get(fc, "arguments")), "{\"city\":\"Paris\"}");
            /* the whole answer of the same text and call agrees */
            json_t *calls = json_pack("[{s:s, s:s, s:{s:s, s:s}}]", "id", "call_1", "type", "function", "function",
                                      "name", "get_weather", "arguments", "{\"city\":\"Paris\"}");
            json_t *w = fy_responses_whole(rs, q ? "Hello" : " \n", q ? 5 : 2, calls, "tool_calls", usage);
            assert_int_equal(json_array_size(json_object_get(w, "output")), json_array_size(out));
            assert_string_equal(
                json_string_value(json_object_get(json_array_get(json_object_get(w, "output"), 0), "type")), t0);
            json_decref(w);
            json_decref(calls);
        }
        if (q == 1) { /* the message closed before the call opened */
            assert_string_equal(ev_type(evs, 7), "response.output_item.done");
            assert_string_equal(ev_type(evs, 8), "response.output_item.added");
            assert_int_equal(json_integer_value(json_object_get(json_array_get(evs, 8), "output_index")), 1);
        }
        if (q == 2) { /* the message ends incomplete, the response failed naming why */
            assert_string_equal(json_string_value(json_object_get(fin, "status")), "failed");
            assert_string_equal(json_string_value(json_object_get(json_array_get(out, 0), "status")), "incomplete");
            assert_string_equal(json_string_value(json_object_get(json_object_get(fin, "error"), "message")),
                                "worker lost");
        }
        if (q == 3) { /* an empty answer is an empty message */
            assert_string_equal(resp_text(fin), "");
            assert_string_equal(json_string_value(json_object_get(fin, "status")), "completed");
        }
        json_decref(evs);
        free(b);
        fy_responses_free(rs);
    }
    json_decref(first);
    json_decref(more);
    json_decref(usage);
    fy_model_destroy(m);
}

/* ---- docs/protocol.md's field table, as the code treats each field ---- */

static void test_field_table(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    static const struct {
        const char *field; /* the name, and a value that asks for something */
        const char *value;
        int status; /* 400: refused naming the field; 200: taken (supported or ignored) */
        bool chat_only, completion_only;
    } f[] = {
        {"presence_penalty", "0.5", 200, 0, 0},
        {"frequency_penalty", "0.5", 200, 0, 0},
        {"repetition_penalty", "1.1", 200, 0, 0},
        {"logit_bias", "{\"1\":5}", 200, 0, 0},
        {"response_format", "{\"type\":\"json_object\"}", 200, 0, 0},
        {"response_format", "{\"type\":\"xml\"}", 400, 0, 0},
        {"guided_json", "{\"type\":\"object\"}", 200, 0, 0},
        {"guided_regex", "\"a+\"", 200, 0, 0},
        {"guided_choice", "[\"a\",\"b\"]", 200, 0, 0},
        {"guided_choice", "[]", 400, 0, 0},
        {"guided_grammar", "\"root ::= x\"", 400, 0, 0},
        {"structured_outputs", "{\"regex\":\"a+\"}", 200, 0, 0},
        {"tools", "[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]", 200, 1, 0},
        {"tools", "[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]", 400, 0, 1},
        {"tools", "[{\"type\":\"function\",\"function\":{\"name\":\"f g\"}}]", 400, 1, 0},
        {"tool_choice", "\"required\"", 400, 1, 0},
        {"parallel_tool_calls", "\"yes\"", 400, 1, 0},
        {"functions", "[{\"name\":\"f\"}]", 400, 0, 0},
        {"min_tokens", "1", 200, 0, 0},
        {"top_logprobs", "2", 200, 1, 0},
        {"logit_bias", "{\"x\":5}", 400, 0, 0},
        {"repetition_penalty", "0", 400, 0, 0},
        {"best_of", "2", 400, 0, 1},
        {"echo", "true", 200, 0, 1},
        {"echo", "true", 400, 1, 0},
        {"prompt_logprobs", "2", 200, 0, 0},
        {"prompt_logprobs", "21", 400, 0, 0},
        {"bad_words", "[\"x\"]", 200, 0, 0},
        {"bad_words", "\"x\"", 400, 0, 0},
        {"suffix", "\"x\"", 400, 0, 1},
        {"logprobs", "2", 200, 0, 1},
        {"logprobs", "21", 400, 0, 1},
        {"max_completion_tokens", "1", 200, 0, 0},
        {"min_tokens", "0", 200, 0, 0},
        {"response_format", "{\"type\":\"text\"}", 200, 0, 0},
        {"tool_choice", "\"none\"", 200, 1, 0},
        {"stop_token_ids", "[2]", 200, 0, 0},
        {"stop_token_ids", "[-1]", 400, 0, 0},
        {"user", "\"someone\"", 200, 0, 0},
        {"metadata", "{\"k\":\"v\"}", 200, 0, 0},
        {"top_k", "5", 200, 0, 0},
        {"min_p", "0.1", 200, 0, 0},
    };
    for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++) {
        for (int chat = 0; chat < 2; chat++) {
            if ((chat && f[i].completion_only) || (!chat && f[i].chat_only)) continue;
            char body[512];
            snprintf(body, sizeof(body), "{%s,\"max_tokens\":1,\"%s\":%s%s}",
                     chat ? "\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]" : "\"prompt\":\"Hi\"", f[i].field,
                     f[i].value, !strcmp(f[i].field, "top_logprobs") ? ",\"logprobs\":true" : "");
            if (!strcmp(f[i].field, "max_completion_tokens")) /* the same value as max_tokens */
                snprintf(body, sizeof(body), "{%s,\"max_tokens\":1,\"max_completion_tokens\":1}",
                         chat ? "\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]" : "\"prompt\":\"Hi\"");
            resp_t r = call("POST", chat ? "/v1/chat/completions" : "/v1/completions", KEY_A, body);
            if (f[i].status == 400)
                expect_error(&r, 400, f[i].field, NULL);
            else if (r.status != 200)
                fail_msg("%s: HTTP %d %s", body, r.status, r.body);
            free(r.body);
        }
    }
}

/* ---- refusals never corrupt the next request on a kept-alive connection ---- */

static void send_keepalive(int s, const char *method, const char *path, const char *extra, const char *body,
                           size_t blen)
{
    char head[1024];
    int n = snprintf(head, sizeof(head),
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n%s"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                     method, path, KEY_A, extra ? extra : "", blen);
    send_all(s, head, (size_t)n);
    if (blen) send_all(s, body, blen);
}

static void test_keepalive_after_refusals(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    static const char ok[] = "{\"prompt\":\"Hello\",\"max_tokens\":2,\"temperature\":0}";
    /* a body that looks like a request line: what a server that did not
     * read it would take for the next request */
    static const char trap[] = "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n";
    size_t big_n = 100000; /* over router.max_body (64 KiB) */
    char *big = fy_malloc(big_n);
    memset(big, 'x', big_n);
    static const struct {
        const char *method, *path, *extra;
        int status;
        int body; /* 0 none, 1 trap, 2 big */
    } kinds[] = {
        {"POST", "/v1/nothing", NULL, 404, 1},
        {"GET", "/v2/nothing", NULL, 404, 0},
        {"POST", "/v1/models", NULL, 405, 1},
        {"PUT", "/v1/completions", NULL, 405, 1},
        {"GET", "/v1/completions", NULL, 405, 0},
        {"POST", "/v1/completions", NULL, 413, 2},
        {"POST", "/tokenize", NULL, 413, 2},
        {"OPTIONS", "/v1/completions", NULL, 204, 1},
        {"OPTIONS", "/v1/completions", "Origin: https://evil.example\r\nAccess-Control-Request-Method: POST\r\n", 403,
         0},
        {"POST", "/v1/completions", NULL, 400, 1}, /* a route's own refusal (malformed JSON), for comparison */
    };
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
        int s = dial();
        const char *b = kinds[k].body == 1 ? trap : kinds[k].body == 2 ? big : "";
        size_t bl = kinds[k].body == 1 ? strlen(trap) : kinds[k].body == 2 ? big_n : 0;
        send_keepalive(s, kinds[k].method, kinds[k].path, kinds[k].extra, b, bl);
        resp_t r;
        read_response(s, &r);
        print_message("%s %s (%zu-byte body): HTTP %d\n", kinds[k].method, kinds[k].path, bl, r.status);
        if (kinds[k].status == 204) {
            assert_int_equal(r.status, 204);
            assert_non_null(header_of(&r, "Allow"));
        } else {
            expect_openai_error(&r, kinds[k].status);
        }
        const char *conn = header_of(&r, "Connection");
        if (conn && !strcasecmp(conn, "close")) fail_msg("%s %s closes the connection", kinds[k].method, kinds[k].path);
        free(r.body);
        /* the next request on the same connection is read from its start */
        send_keepalive(s, "POST", "/v1/completions", NULL, ok, strlen(ok));
        read_response(s, &r);
        if (r.status != 200) fail_msg("after %s %s: HTTP %d %s", kinds[k].method, kinds[k].path, r.status, r.body);
        assert_non_null(strstr(r.body, "text_completion"));
        free(r.body);
        close(s);
    }
    fy_free(big);
    /* a body declared far too long to read is refused at once, and the
     * connection closed (said in the answer) rather than read for it */
    int s = dial();
    char head[512];
    int n = snprintf(head, sizeof(head),
                     "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n"
                     "Content-Type: application/json\r\nContent-Length: 500000000\r\n\r\n{\"prompt\":",
                     KEY_A);
    send_all(s, head, (size_t)n);
    resp_t r;
    read_response(s, &r);
    expect_openai_error(&r, 413);
    const char *conn = header_of(&r, "Connection");
    assert_true(conn && !strcasecmp(conn, "close"));
    free(r.body);
    char c;
    assert_true(recv(s, &c, 1, 0) <= 0); /* closed */
    close(s);
}

/* ---- CORS (router.cors_origins: https://app.example, http://localhost:3000) ---- */

static resp_t raw_call(const char *method, const char *path, const char *extra_headers)
{
    int s = dial();
    char head[1024];
    int n = snprintf(head, sizeof(head), "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s\r\n", method,
                     path, extra_headers);
    send_all(s, head, (size_t)n);
    resp_t r;
    read_response(s, &r);
    close(s);
    return r;
}

static void test_cors(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    resp_t r = raw_call("OPTIONS", "/v1/chat/completions",
                        "Origin: https://app.example\r\nAccess-Control-Request-Method: POST\r\n"
                        "Access-Control-Request-Headers: authorization, content-type\r\n");
    assert_int_equal(r.status, 204);
    const char *h = header_of(&r, "Access-Control-Allow-Origin");
    assert_true(h && !strcmp(h, "https://app.example"));
    h = header_of(&r, "Access-Control-Allow-Methods");
    assert_true(h && strstr(h, "POST"));
    h = header_of(&r, "Access-Control-Allow-Headers");
    assert_true(h && strstr(h, "authorization") && strstr(h, "content-type"));
    assert_non_null(header_of(&r, "Access-Control-Max-Age"));
    free(r.body);
    r = raw_call("OPTIONS", "/v1/models", "Origin: http://localhost:3000\r\nAccess-Control-Request-Method: GET\r\n");
    assert_int_equal(r.status, 204);
    h = header_of(&r, "Access-Control-Allow-Methods");
    assert_true(h && strstr(h, "GET") && !strstr(h, "POST"));
    free(r.body);
    /* an origin not listed: the preflight is refused, answers carry no grant */
    r = raw_call("OPTIONS", "/v1/chat/completions",
                 "Origin: https://evil.example\r\nAccess-Control-Request-Method: POST\r\n");
    expect_openai_error(&r, 403);
    assert_null(header_of(&r, "Access-Control-Allow-Origin"));
    free(r.body);
    r = raw_call("GET", "/v1/models", "Origin: https://evil.example\r\n");
    assert_int_equal(r.status, 200);
    assert_null(header_of(&r, "Access-Control-Allow-Origin"));
    h = header_of(&r, "Vary");
    assert_true(h && strstr(h, "Origin"));
    free(r.body);
    /* answers to a listed origin carry it, errors included */
    r = raw_call("GET", "/v1/models", "Origin: https://app.example\r\n");
    assert_int_equal(r.status, 200);
    h = header_of(&r, "Access-Control-Allow-Origin");
    assert_true(h && !strcmp(h, "https://app.example"));
    free(r.body);
    r = raw_call("GET", "/v1/nothing", "Origin: http://localhost:3000\r\n");
    expect_openai_error(&r, 404);
    h = header_of(&r, "Access-Control-Allow-Origin");
    assert_true(h && !strcmp(h, "http://localhost:3000"));
    free(r.body);
    r = raw_call("POST", "/v1/completions", "Origin: https://app.example\r\nContent-Length: 0\r\n");
    expect_openai_error(&r, 401);
    h = header_of(&r, "Access-Control-Allow-Origin");
    assert_true(h && !strcmp(h, "https://app.example"));
    free(r.body);
}

/* ---- created: each answer's own time, not the router's start ---- */

static double sample(const char *text, const char *series);

/* The decode worker's metrics text (the worker after the prefill one). */
static char *decode_metrics(void)
{
    char *body = NULL;
    assert_int_equal(tc_http(C.metrics_port[1], "GET", "/metrics", &body), 200);
    return body;
}

/* A speculative step's accepted run reaches the client as one chunk (one
 * SSE event per engine step per choice, as vLLM sends them), and the
 * router's inter-token latency has one gap per step.  The decode worker's
 * forward passes count the steps: every chunk but the first (the prefill
 * worker's token) is one of them.  Before the runs were held, every token
 * was its own chunk: 48 chunks for 48 tokens, the run's gaps microseconds. */
static void test_stream_chunk_per_step(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    /* the worker's speculation controller may have switched speculation
     * off for its next 64 steps (decode.spec_probe_steps) after an earlier
     * test's text it could not predict: a request that met no speculation
     * is sent again (the steps count down, then it probes) */
    char *m0 = NULL, *r0 = NULL, *m1 = NULL;
    int chunks = 0, most = 0;
    double steps = 0, accepted = 0;
    for (int attempt = 0; attempt < 4 && accepted == 0; attempt++) {
        fy_free(m0);
        fy_free(r0);
        fy_free(m1);
        m0 = r0 = m1 = NULL;
        chunks = most = 0;
        /* the worker copies its engine's figures on its tick: the earlier
         * tests' last tokens may still be on their way into them */
        m0 = decode_metrics();
        for (double t0 = fy_now_s(); fy_now_s() - t0 < 5;) {
            usleep(200000);
            char *again = decode_metrics();
            bool same = tc_metric(again, "ferry:engine_generation_tokens_total") ==
                        tc_metric(m0, "ferry:engine_generation_tokens_total");
            fy_free(m0);
            m0 = again;
            if (same) break;
        }
        assert_int_equal(tc_http(PORT, "GET", "/metrics", &r0), 200);
        /* greedy, on a text that repeats: n-gram proposals are accepted */
        resp_t r = call("POST", "/v1/completions", KEY_A,
                        "{\"prompt\":\"one two three four five one two three four five one two three four five one\","
                        "\"max_tokens\":48,\"temperature\":0,\"ignore_eos\":true,\"stream\":true,\"logprobs\":0,"
                        "\"speculative\":\"ngram\"}");
        assert_int_equal(r.status, 200);
        int tokens = 0;
        const char *at = r.body;
        for (json_t *c; (c = sse_next(&at)); json_decref(c)) {
            json_t *lp = json_object_get(json_array_get(json_object_get(c, "choices"), 0), "logprobs");
            int n = (int)json_array_size(json_object_get(lp, "tokens"));
            if (n) {
                chunks++;
                tokens += n;
                most = n > most ? n : most;
                /* a chunk's text is its tokens' (their logprobs line up with it) */
                assert_int_equal(json_array_size(json_object_get(lp, "token_logprobs")), n);
            }
        }
        free(r.body);
        assert_int_equal(tokens, 48);
        /* and this request's: wait for all 48 */
        double gen = 0;
        for (double t0 = fy_now_s(); fy_now_s() - t0 < 10; usleep(50000)) {
            fy_free(m1);
            m1 = decode_metrics();
            gen = tc_metric(m1, "ferry:engine_generation_tokens_total") -
                  tc_metric(m0, "ferry:engine_generation_tokens_total");
            if (gen >= 48) break;
        }
        if (gen != 48) fail_msg("the decode worker generated %.0f tokens, the client got 48", gen);
        steps = tc_metric(m1, "ferry:engine_steps_total") - tc_metric(m0, "ferry:engine_steps_total");
        accepted = tc_metric(m1, "ferry:spec_decode_num_accepted_tokens_total") -
                   tc_metric(m0, "ferry:spec_decode_num_accepted_tokens_total");
        print_message(
            "48 tokens streamed in %d chunks (at most %d a chunk); %.0f decode steps, %.0f proposals accepted\n",
            chunks, most, steps, accepted);
    }
    assert_true(accepted > 0);        /* the test means nothing without speculation */
    assert_true(chunks < 48);         /* fewer chunks than tokens ... */
    assert_true(most > 1);            /* ... some carrying a run ... */
    assert_true(chunks == 1 + steps); /* ... one per step, the first token's from the prefill worker */
    char *r1 = NULL;
    assert_int_equal(tc_http(PORT, "GET", "/metrics", &r1), 200);
    /* one inter-token gap per step at the router, not one per token */
    assert_true(tc_metric(r1, "ferry:inter_token_latency_seconds_count") -
                    tc_metric(r0, "ferry:inter_token_latency_seconds_count") ==
                chunks - 1);
    fy_free(m0);
    fy_free(m1);
    fy_free(r0);
    fy_free(r1);
}

/* vLLM's request_max_num_generation_tokens: once per request, the most
 * tokens one of its samples generated (n = 3 here, each sample's count
 * read from its logprobs); request_generation_tokens counts each sample. */
static void test_max_num_generation_tokens(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    resp_t a = call("GET", "/metrics", NULL, NULL);
    /* two prompts, two samples each: vLLM observes each prompt (as a
     * request of its own) once, with its longest sample */
    resp_t r = call("POST", "/v1/completions", KEY_A,
                    "{\"prompt\":[\"Name a colour:\",\"Count to ten:\"],\"max_tokens\":8,\"n\":2,"
                    "\"temperature\":1.5,\"seed\":11,\"logprobs\":0}");
    assert_int_equal(r.status, 200);
    json_t *j = json_of(&r);
    int most = 0, sum = 0, most_p[2] = {0, 0};
    assert_int_equal(json_array_size(json_object_get(j, "choices")), 4);
    for (size_t i = 0; i < 4; i++) {
        json_t *ch = json_array_get(json_object_get(j, "choices"), i);
        int n = (int)json_array_size(json_object_get(json_object_get(ch, "logprobs"), "tokens"));
        size_t at = (size_t)json_integer_value(json_object_get(ch, "index"));
        assert_true(at < 4);
        sum += n;
        most_p[at / 2] = n > most_p[at / 2] ? n : most_p[at / 2];
    }
    most = most_p[0] + most_p[1];
    assert_int_equal(sum, json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")));
    json_decref(j);
    free(r.body);
    /* a request over nng (one sample) is observed by the router itself */
    fy_client_req_t q = {0};
    int32_t prompt[12];
    for (int i = 0; i < 12; i++) prompt[i] = 300 + i;
    q.tokens = prompt;
    q.n_tokens = 12;
    fy_genspec_default(&q.gen);
    q.gen.max_tokens = 6;
    q.gen.ignore_eos = true;
    fy_client_stream_t st;
    char err[256];
    assert_int_equal(fy_client_generate(C.client, &q, &st, err, sizeof(err)), FY_OK);
    tc_result_t res = {0};
    tc_collect(&C, &st, &res, 1, 60);
    assert_int_equal(res.error, FY_OK);
    resp_t b = call("GET", "/metrics", NULL, NULL);
#define DELTA(series) (sample(b.body, series) - sample(a.body, series))
    print_message("2 prompts, n=2: samples of %d and %d tokens at most, %d in all\n", most_p[0], most_p[1], sum);
    assert_true(DELTA("ferry:request_max_num_generation_tokens_count") == 3);
    assert_true(DELTA("ferry:request_max_num_generation_tokens_sum") == most + 6);
    assert_true(DELTA("ferry:request_generation_tokens_count") == 5);
    assert_true(DELTA("ferry:request_generation_tokens_sum") == sum + 6);
#undef DELTA
    free(a.body);
    free(b.body);
}

static void test_created_is_the_answer_time(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    /* the router started at least a test or two ago: its start is seconds back */
    time_t before = time(NULL);
    resp_t r = call("POST", "/v1/completions", KEY_A, "{\"prompt\":\"Hello\",\"max_tokens\":2}");
    assert_int_equal(r.status, 200);
    json_t *j = json_of(&r);
    json_int_t created = json_integer_value(json_object_get(j, "created"));
    json_decref(j);
    free(r.body);
    if (created < (json_int_t)before || created > (json_int_t)time(NULL))
        fail_msg("created is %lld, the answer was made in [%lld, %lld]", (long long)created, (long long)before,
                 (long long)time(NULL));
    /* a stream: every chunk carries the same time, this answer's */
    before = time(NULL);
    int s = dial();
    const char *req = "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":4,\"stream\":true}";
    send_request(s, "POST", "/v1/chat/completions", KEY_A, "application/json", req, strlen(req));
    read_response(s, &r);
    close(s);
    int chunks = 0;
    for (char *p = r.body; (p = strstr(p, "\"created\":")); p += 10, chunks++) {
        long long c = atoll(p + 10);
        if (c < (long long)before || c > (long long)time(NULL)) fail_msg("a chunk's created is %lld", c);
    }
    assert_true(chunks >= 2);
    free(r.body);
}

/* ---- slow clients and clients that leave ---- */

static void test_slow_and_departing_clients(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    int32_t before = IDLE_ADMITTABLE;
    /* a client that sends half a request and waits does not hold up another */
    int slow = dial();
    const char *part = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n";
    send_all(slow, part, strlen(part));
    resp_t r = call("POST", "/v1/completions", KEY_A, "{\"prompt\":\"Hello there\",\"max_tokens\":3}");
    assert_int_equal(r.status, 200);
    free(r.body);
    /* and is answered once it finishes, a second later */
    sleep(1); /* a fixed time: the slow client's pause is what the test is about */
    char rest[256];
    const char *body = "{\"prompt\":\"Hi\",\"max_tokens\":2}";
    int n = snprintf(rest, sizeof(rest), "Authorization: Bearer %s\r\nContent-Length: %zu\r\n\r\n%s", KEY_A,
                     strlen(body), body);
    send_all(slow, rest, (size_t)n);
    read_response(slow, &r);
    close(slow);
    assert_int_equal(r.status, 200);
    free(r.body);

    /* a stream whose client disconnects after the first tokens: cancelled, blocks back */
    fy_client_status_t st0;
    tc_status(&C, &st0);
    int s = dial();
    const char *req = "{\"prompt\":\"Tell me a very long story\",\"max_tokens\":400,\"ignore_eos\":true,"
                      "\"stream\":true,\"temperature\":0}";
    send_request(s, "POST", "/v1/completions", KEY_A, "application/json", req, strlen(req));
    char buf[4096];
    size_t got = 0;
    int chunks = 0;
    while (chunks < 4) {
        ssize_t k = recv(s, buf + got, sizeof(buf) - got - 1, 0);
        assert_true(k > 0);
        got += (size_t)k;
        buf[got] = 0;
        chunks = 0;
        for (char *p = buf; (p = strstr(p, "data: ")); p += 6) chunks++;
        if (got > sizeof(buf) / 2) got = 0, buf[0] = 0;
    }
    close(s);
    double t0 = fy_now_s();
    fy_client_status_t st;
    for (;;) {
        tc_status(&C, &st);
        if (st.failed > st0.failed || fy_now_s() - t0 > 10) break;
        usleep(20000);
    }
    print_message("disconnected client: request ended in %.2f s\n", fy_now_s() - t0);
    assert_int_equal(st.failed, st0.failed + 1); /* cancelled, not run to 400 tokens */
    assert_true(tc_wait_admittable(&C, "decode-0", before, 5.0));
    r = call("GET", "/health", NULL, NULL);
    assert_int_equal(r.status, 200);
    free(r.body);
}

/* ---- tenants: limits and isolated prefix caches ---- */

static void test_tenant_limits(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    /* beta may run one request at a time */
    int s = dial();
    const char *req = "{\"prompt\":\"Count slowly\",\"max_tokens\":300,\"ignore_eos\":true,\"stream\":true}";
    send_request(s, "POST", "/v1/completions", KEY_B, "application/json", req, strlen(req));
    char buf[512];
    assert_true(recv(s, buf, sizeof(buf), 0) > 0); /* it is running */
    resp_t r = call("POST", "/v1/completions", KEY_B, "{\"prompt\":\"Hi\",\"max_tokens\":2}");
    expect_error(&r, 429, NULL, "concurrent");
    assert_non_null(strcasestr(r.head, "Retry-After:"));
    free(r.body);
    /* another tenant is not held up */
    r = call("POST", "/v1/completions", KEY_A, "{\"prompt\":\"Hi\",\"max_tokens\":2}");
    assert_int_equal(r.status, 200);
    free(r.body);
    close(s); /* the stream is cancelled; beta's slot comes back */
    double t0 = fy_now_s();
    do {
        r = call("POST", "/v1/completions", KEY_B, "{\"prompt\":\"Hi\",\"max_tokens\":2}");
        if (r.status == 200) break;
        free(r.body);
        usleep(50000);
    } while (fy_now_s() - t0 < 5);
    assert_int_equal(r.status, 200);
    free(r.body);
    /* gamma has 150 tokens a minute: 2 + 100 fits once, not twice */
    r = call("POST", "/v1/completions", KEY_C, "{\"prompt\":\"Hi\",\"max_tokens\":100}");
    assert_int_equal(r.status, 200);
    free(r.body);
    r = call("POST", "/v1/completions", KEY_C, "{\"prompt\":\"Hi\",\"max_tokens\":100}");
    if (r.status == 200) { /* the first one stopped early and was refunded: spend the rest */
        free(r.body);
        r = call("POST", "/v1/completions", KEY_C, "{\"prompt\":\"Hi\",\"max_tokens\":140,\"ignore_eos\":true}");
        free(r.body);
        r = call("POST", "/v1/completions", KEY_C, "{\"prompt\":\"Hi\",\"max_tokens\":140}");
    }
    expect_error(&r, 429, NULL, "tokens per minute");
    free(r.body);
}

/* Time to the first streamed token, and the cached prompt tokens reported. */
static double stream_ttft(const char *key, const char *body, json_int_t *cached)
{
    int s = dial();
    double t0 = fy_now_s(), ttft = -1;
    send_request(s, "POST", "/v1/completions", key, "application/json", body, strlen(body));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (n + 4096 > cap) buf = realloc(buf, cap *= 2);
        ssize_t k = recv(s, buf + n, cap - n - 1, 0);
        if (k <= 0) break;
        n += (size_t)k;
        buf[n] = 0;
        if (ttft < 0 && strstr(buf, "\"text\":\"")) {
            /* the first chunk with text (an empty text is possible: any chunk counts) */
            ttft = fy_now_s() - t0;
        }
    }
    close(s);
    char *u = strstr(buf, "\"cached_tokens\":");
    *cached = u ? atoll(u + 16) : -1;
    free(buf);
    return ttft;
}

static void test_tenants_never_share_prefixes(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    /* a long prompt: a cache hit is obvious in the time to the first token */
    char *body = token_prompt_json(1200, 77,
                                   ",\"max_tokens\":2,\"stream\":true,\"temperature\":0,"
                                   "\"stream_options\":{\"include_usage\":true}");
    json_int_t c_cold, c_warm, c_other, c_other2;
    double cold = stream_ttft(KEY_A, body, &c_cold);
    double warm = stream_ttft(KEY_A, body, &c_warm);
    double other = stream_ttft(KEY_B, body, &c_other);
    double other2 = stream_ttft(KEY_B, body, &c_other2);
    print_message("1200-token prompt, TTFT: alpha cold %.0f ms (%lld cached), alpha again %.0f ms (%lld cached), "
                  "beta %.0f ms (%lld cached), beta again %.0f ms (%lld cached)\n",
                  cold * 1e3, (long long)c_cold, warm * 1e3, (long long)c_warm, other * 1e3, (long long)c_other,
                  other2 * 1e3, (long long)c_other2);
    assert_int_equal(c_cold, 0);
    assert_true(c_warm >= 1184);   /* all full blocks but the last token's */
    assert_int_equal(c_other, 0);  /* alpha's blocks are not beta's */
    assert_true(c_other2 >= 1184); /* beta's own, the second time */
    assert_true(other > 3 * warm); /* and the time says so too (not against cold: the first
                                      request also pays the workers' warm-up, which a loaded
                                      machine stretches by seconds) */
    fy_free(body);
}

/* ---- the router's /metrics ---- */

/* The value of the sample line that starts with series (name and labels). */
static double sample(const char *text, const char *series)
{
    double v = 0;
    if (fy_metrics_sample(text, series, &v) != FY_OK) fail_msg("no sample '%s' in the router's metrics", series);
    return v;
}

static void test_router_metrics(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    resp_t a = call("GET", "/metrics", NULL, NULL);
    assert_int_equal(a.status, 200);
    assert_non_null(strstr(a.head, "version=0.0.4"));
    assert_non_null(strstr(a.body, "# TYPE ferry:time_to_first_token_seconds histogram"));
    int lens[3] = {20, 33, 47};
    for (int i = 0; i < 3; i++) {
        char *b = token_prompt_json(lens[i], 40 + (uint64_t)i, ",\"max_tokens\":5,\"ignore_eos\":true");
        resp_t r = call("POST", "/v1/completions", KEY_A, b);
        assert_int_equal(r.status, 200);
        free(r.body);
        fy_free(b);
    }
    resp_t z = call("POST", "/v1/completions", KEY_A, "{\"prompt\":\"hi\",\"max_tokens\":-3}"); /* a 400 */
    free(z.body);
    resp_t b = call("GET", "/metrics", NULL, NULL);
    assert_int_equal(b.status, 200);
#define DELTA(series) (sample(b.body, series) - sample(a.body, series))
    /* alpha's series appeared with its first request, perhaps since a */
    double alpha0 = 0;
    (void)fy_metrics_sample(a.body, "ferry:prompt_tokens_total{tenant=\"alpha\"}", &alpha0);
    assert_true(sample(b.body, "ferry:prompt_tokens_total{tenant=\"alpha\"}") - alpha0 == 100);
    assert_true(
        sample(
            b.body,
            "ferry:prompt_tokens_total{model_name=\"SmolLM2-135M-Instruct.Q4_1\",role=\"router\",tenant=\"alpha\"}") >=
        100);
    assert_true(DELTA("ferry:request_prompt_tokens_count") == 3);
    assert_true(DELTA("ferry:request_prompt_tokens_sum") == 100);
    assert_true(DELTA("ferry:request_generation_tokens_sum") == 15);
    assert_true(DELTA("ferry:request_prefill_time_seconds_count") == 3);
    assert_true(DELTA("ferry:request_decode_time_seconds_count") == 3);
    assert_true(DELTA("ferry:request_inference_time_seconds_count") == 3);
    assert_true(DELTA("ferry:generation_tokens_total") == 15);
    assert_true(DELTA("ferry:time_to_first_token_seconds_count") == 3);
    assert_true(DELTA("ferry:e2e_request_latency_seconds_count") == 3);
    assert_true(DELTA("ferry:inter_token_latency_seconds_count") == 12);
    assert_true(DELTA("ferry:request_queue_time_seconds_count") == 3);
    assert_true(DELTA("ferry:request_success_total{finished_reason=\"length\"}") == 3);
    assert_true(DELTA("ferry:http_responses_total{code=\"2xx\"}") >= 3);
    assert_true(DELTA("ferry:http_responses_total{code=\"400\"}") == 1);
    assert_true(DELTA("ferry:request_kv_transfer_bytes_total") > 0);
    assert_true(sample(b.body, "ferry:workers_up{worker_role=\"decode\"}") == 1);
    assert_true(sample(b.body, "ferry:num_requests_running") == 0);
#undef DELTA
    free(a.body);
    free(b.body);
}

/* ---- overload: 503 with Retry-After, and the router keeps serving ---- */

/* Waits (up to 10 s) until the router of c holds requests requests,
 * queued of them in its queue (the rest placed on workers). */
static void wait_router_queue(tc_cluster_t *c, int32_t requests, int32_t queued)
{
    fy_client_status_t st;
    double t0 = fy_now_s();
    for (tc_status(c, &st); st.requests != requests || st.queued != queued; tc_status(c, &st)) {
        if (fy_now_s() - t0 > 10)
            fail_msg("the router holds %d requests, %d queued; waited for %d, %d queued", st.requests, st.queued,
                     requests, queued);
        usleep(10000);
    }
}

static void test_overload_503(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    /* a second cluster whose router holds one request in its queue at most,
     * and sends a prefill worker one prompt at a time */
    tc_cluster_t c2;
    int port2 = free_port();
    char http[128];
    snprintf(http, sizeof(http), "router.http=http://127.0.0.1:%d", port2);
    tc_opts_t o = {.n_prefill = 1,
                   .n_decode = 1,
                   .common = {http, "router.max_queue=1", "router.prefill_queue_tokens=1", "router.retry_after=3s"}};
    tc_start(&c2, &o);
    int keep = PORT;
    PORT = port2;
    char *body = token_prompt_json(1500, 9, ",\"max_tokens\":4");
    int s1 = dial(), s2 = dial();
    send_request(s1, "POST", "/v1/completions", NULL, "application/json", body, strlen(body)); /* prefilling */
    wait_router_queue(&c2, 1, 0);
    send_request(s2, "POST", "/v1/completions", NULL, "application/json", body, strlen(body)); /* queued */
    wait_router_queue(&c2, 2, 1);
    resp_t r = call("POST", "/v1/completions", NULL, body); /* refused */
    expect_error(&r, 503, NULL, "overloaded");
    assert_non_null(strcasestr(r.head, "Retry-After: 3"));
    free(r.body);
    resp_t r1, r2;
    read_response(s1, &r1);
    read_response(s2, &r2);
    close(s1);
    close(s2);
    assert_int_equal(r1.status, 200);
    assert_int_equal(r2.status, 200);
    free(r1.body);
    free(r2.body);
    r = call("POST", "/v1/completions", NULL, "{\"prompt\":\"Hi\",\"max_tokens\":2}");
    assert_int_equal(r.status, 200);
    free(r.body);
    fy_free(body);
    PORT = keep;
    tc_stop(&c2);
}

/* ---- echo, prompt logprobs, bad words ---- */

#define EPROMPT "The capital of France is"

/* The prompt's token ids (/tokenize). */
static json_t *prompt_tokens(void)
{
    resp_t r = call("POST", "/tokenize", KEY_A, "{\"prompt\":\"" EPROMPT "\"}");
    assert_int_equal(r.status, 200);
    json_t *j = json_of(&r), *t = json_incref(json_object_get(j, "tokens"));
    json_decref(j);
    free(r.body);
    assert_true(json_array_size(t) > 2);
    return t;
}

/* One completion with echo, logprobs 2 and prompt_logprobs 3 on the
 * cluster at PORT, checked for shape against the prompt's tokens: the
 * text is the prompt then the completion, the logprobs cover the prompt
 * (the first token's null) then the completion with increasing text
 * offsets, prompt_logprobs has a null then a map per token holding the
 * token itself (the same logprob as the echo's) and the 3 most likely
 * (ranks 1 to 3).  Returns the choice (the caller's). */
static json_t *echo_completion(const json_t *ptoks)
{
    resp_t r = call("POST", "/v1/completions", KEY_A,
                    "{\"prompt\":\"" EPROMPT "\",\"max_tokens\":5,\"temperature\":0,\"ignore_eos\":true,"
                    "\"echo\":true,\"logprobs\":2,\"prompt_logprobs\":3}");
    if (r.status != 200) fail_msg("HTTP %d: %s", r.status, r.body);
    json_t *j = json_of(&r), *c = json_incref(json_array_get(json_object_get(j, "choices"), 0));
    size_t np = json_array_size(ptoks);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens")), np);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), 5);
    json_decref(j);
    free(r.body);
    const char *text = json_string_value(json_object_get(c, "text"));
    assert_non_null(text);
    if (strncmp(text, EPROMPT, strlen(EPROMPT)) || strlen(text) <= strlen(EPROMPT))
        fail_msg("echo's text '%s' is not the prompt and more", text);
    json_t *lp = json_object_get(c, "logprobs"), *lps = json_object_get(lp, "token_logprobs");
    json_t *toks = json_object_get(lp, "tokens"), *tops = json_object_get(lp, "top_logprobs");
    json_t *offs = json_object_get(lp, "text_offset");
    assert_int_equal(json_array_size(lps), np + 5);
    assert_int_equal(json_array_size(toks), np + 5);
    assert_int_equal(json_array_size(tops), np + 5);
    assert_int_equal(json_array_size(offs), np + 5);
    assert_true(json_is_null(json_array_get(lps, 0)) && json_is_null(json_array_get(tops, 0)));
    size_t at = 0;
    for (size_t i = 0; i < np + 5; i++) {
        assert_int_equal(json_integer_value(json_array_get(offs, i)), at);
        at += strlen(json_string_value(json_array_get(toks, i)));
        if (i == 0) continue;
        assert_true(json_is_number(json_array_get(lps, i)) && json_number_value(json_array_get(lps, i)) <= 0);
        assert_true(json_object_size(json_array_get(tops, i)) >= 1);
    }
    assert_int_equal(at, strlen(text));
    json_t *pl = json_object_get(c, "prompt_logprobs");
    assert_int_equal(json_array_size(pl), np);
    assert_true(json_is_null(json_array_get(pl, 0)));
    for (size_t i = 1; i < np; i++) {
        json_t *d = json_array_get(pl, i);
        char key[16];
        snprintf(key, sizeof(key), "%lld", (long long)json_integer_value(json_array_get(ptoks, i)));
        json_t *own = json_object_get(d, key);
        if (!own) fail_msg("prompt_logprobs[%zu] lacks the prompt's token %s", i, key);
        assert_true(json_object_size(d) == 3 || json_object_size(d) == 4);
        assert_true(json_integer_value(json_object_get(own, "rank")) >= 1);
        assert_true(json_is_string(json_object_get(own, "decoded_token")));
        assert_true(fabs(json_number_value(json_object_get(own, "logprob")) -
                         json_number_value(json_array_get(lps, i))) < 1e-6);
        int ranks = 0;
        const char *k;
        json_t *v;
        json_object_foreach(d, k, v)
        {
            json_int_t rk = json_integer_value(json_object_get(v, "rank"));
            ranks |= rk >= 1 && rk <= 3 ? 1 << rk : 0;
        }
        assert_int_equal(ranks, 0xe); /* 1, 2 and 3 */
    }
    return c;
}

/* The same numbers (logprobs of the prompt and the completion, the
 * alternatives of the prompt) in two answers, within tol. */
static void same_logprobs(const json_t *a, const json_t *b, double tol, const char *what)
{
    assert_string_equal(json_string_value(json_object_get(a, "text")), json_string_value(json_object_get(b, "text")));
    json_t *la = json_object_get(json_object_get(a, "logprobs"), "token_logprobs");
    json_t *lb = json_object_get(json_object_get(b, "logprobs"), "token_logprobs");
    assert_int_equal(json_array_size(la), json_array_size(lb));
    for (size_t i = 1; i < json_array_size(la); i++) {
        double x = json_number_value(json_array_get(la, i)), y = json_number_value(json_array_get(lb, i));
        if (fabs(x - y) > tol) fail_msg("%s: logprob %zu is %g and %g", what, i, x, y);
    }
    json_t *pa = json_object_get(a, "prompt_logprobs"), *pb = json_object_get(b, "prompt_logprobs");
    for (size_t i = 1; i < json_array_size(pa); i++) {
        const char *k;
        json_t *v;
        json_object_foreach(json_array_get(pa, i), k, v)
        {
            json_t *w = json_object_get(json_array_get(pb, i), k);
            if (!w) fail_msg("%s: prompt token %zu: alternative %s in one answer only", what, i, k);
            double x = json_number_value(json_object_get(v, "logprob")),
                   y = json_number_value(json_object_get(w, "logprob"));
            if (fabs(x - y) > tol) fail_msg("%s: prompt token %zu, token %s: %g and %g", what, i, k, x, y);
        }
    }
}

/* A greedy completion's text under bad_words (NULL: none). */
static char *greedy_text(const char *bad_words)
{
    char body[512];
    snprintf(body, sizeof(body),
             "{\"prompt\":\"" EPROMPT "\",\"max_tokens\":12,\"temperature\":0,\"ignore_eos\":true%s%s}",
             bad_words ? ",\"bad_words\":" : "", bad_words ? bad_words : "");
    resp_t r = call("POST", "/v1/completions", KEY_A, body);
    if (r.status != 200) fail_msg("HTTP %d: %s", r.status, r.body);
    json_t *j = json_of(&r);
    char *t = fy_strdup(json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text")));
    json_decref(j);
    free(r.body);
    return t;
}

/* echo, logprobs over the prompt and prompt_logprobs, through the prefill
 * worker (this cluster) and colocated (a second cluster without prefill
 * workers): the same values from both, and again once the prompt is in
 * the prefix caches; streamed, the prompt comes first with its logprobs;
 * max_tokens 0 with echo is the prompt alone; bad_words keeps a word the
 * greedy answer has out of it, on both clusters; bad values are refused
 * naming the field. */
static void test_echo_prompt_logprobs_bad_words(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    json_t *ptoks = prompt_tokens();
    size_t np = json_array_size(ptoks);
    json_t *a = echo_completion(ptoks), *b = echo_completion(ptoks); /* b: the prompt cached by now */
    same_logprobs(a, b, 1e-5, "disaggregated, again");
    /* streamed: the prompt and its logprobs first, then the same text */
    resp_t r = call("POST", "/v1/completions", KEY_A,
                    "{\"prompt\":\"" EPROMPT "\",\"max_tokens\":5,\"temperature\":0,\"ignore_eos\":true,"
                    "\"echo\":true,\"logprobs\":1,\"stream\":true}");
    assert_int_equal(r.status, 200);
    char all[1024] = "";
    int chunk = 0;
    const char *at = r.body;
    for (json_t *c; (c = sse_next(&at)); json_decref(c)) {
        json_t *ch = json_array_get(json_object_get(c, "choices"), 0);
        const char *t = json_string_value(json_object_get(ch, "text"));
        if (chunk++ == 0) {
            assert_string_equal(t, EPROMPT);
            assert_int_equal(json_array_size(json_object_get(json_object_get(ch, "logprobs"), "tokens")), np);
        }
        strncat(all, t ? t : "", sizeof(all) - strlen(all) - 1);
    }
    assert_string_equal(all, json_string_value(json_object_get(a, "text")));
    free(r.body);
    /* max_tokens 0: the prompt alone */
    r = call("POST", "/v1/completions", KEY_A,
             "{\"prompt\":\"" EPROMPT "\",\"max_tokens\":0,\"echo\":true,\"logprobs\":0}");
    if (r.status != 200) fail_msg("HTTP %d: %s", r.status, r.body);
    json_t *j = json_of(&r), *c = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(c, "text")), EPROMPT);
    assert_string_equal(json_string_value(json_object_get(c, "finish_reason")), "length");
    assert_int_equal(json_array_size(json_object_get(json_object_get(c, "logprobs"), "tokens")), np);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), 0);
    json_decref(j);
    free(r.body);
    /* bad words: the greedy answer's first word is kept out of it */
    char *plain = greedy_text(NULL), word[64] = "", bw[80], spaced[66];
    sscanf(plain, " %63[A-Za-z]", word);
    if (!word[0]) fail_msg("no word in the greedy answer '%s'", plain);
    snprintf(bw, sizeof(bw), "[\"%s\"]", word);
    snprintf(spaced, sizeof(spaced), " %s", word);
    char *banned = greedy_text(bw);
    fprintf(stderr, "greedy '%s'; without '%s': '%s'\n", plain, word, banned);
    assert_non_null(strstr(plain, spaced));
    assert_null(strstr(banned, spaced));
    /* colocated: the same values and the same ban */
    tc_cluster_t c2;
    int port2 = free_port(), keep = PORT;
    char http[128], keyset[600];
    snprintf(http, sizeof(http), "router.http=http://127.0.0.1:%d", port2);
    snprintf(keyset, sizeof(keyset), "router.api_keys=%s", KEYS);
    tc_opts_t o = {.n_prefill = 0, .n_decode = 1, .common = {http, keyset, "decode.kv_mem=64MiB"}};
    tc_start(&c2, &o);
    PORT = port2;
    json_t *co = echo_completion(ptoks);
    same_logprobs(a, co, 1e-4, "colocated against disaggregated");
    char *banned2 = greedy_text(bw);
    assert_string_equal(banned2, banned);
    PORT = keep;
    tc_stop(&c2);
    /* refusals, each naming its field */
    static const struct {
        const char *body, *param;
    } bad[] = {
        {"{\"prompt\":\"x\",\"prompt_logprobs\":21}", "prompt_logprobs"},
        {"{\"prompt\":\"x\",\"prompt_logprobs\":-1}", "prompt_logprobs"},
        {"{\"prompt\":\"x\",\"prompt_logprobs\":\"3\"}", "prompt_logprobs"},
        {"{\"prompt\":\"x\",\"prompt_logprobs\":2,\"stream\":true}", "prompt_logprobs"},
        {"{\"prompt\":\"x\",\"bad_words\":\"word\"}", "bad_words"},
        {"{\"prompt\":\"x\",\"bad_words\":[1]}", "bad_words"},
        {"{\"prompt\":\"x\",\"bad_words\":[\"\"]}", "bad_words"},
        {"{\"prompt\":\"x\",\"bad_words\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\",\"j\",\"k\","
         "\"l\",\"m\",\"n\",\"o\",\"p\",\"q\",\"r\",\"s\",\"t\",\"u\",\"v\",\"w\",\"x\",\"y\",\"z\",\"A\",\"B\","
         "\"C\",\"D\",\"E\",\"F\",\"G\"]}",
         "bad_words"},
        {"{\"prompt\":\"x\",\"max_tokens\":0}", "max_tokens"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"echo\":true}", "echo"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        const char *path = strstr(bad[i].body, "messages") ? "/v1/chat/completions" : "/v1/completions";
        r = call("POST", path, KEY_A, bad[i].body);
        expect_error(&r, 400, bad[i].param, NULL);
        free(r.body);
    }
    /* the nng client's events carry no prompt logprobs: its port refuses them by name */
    fy_client_req_t q = {.prompt = "Hi"};
    fy_genspec_default(&q.gen);
    q.gen.prompt_logprobs = true;
    fy_client_stream_t cs;
    char err[256] = "";
    assert_int_equal(fy_client_generate(C.client, &q, &cs, err, sizeof(err)), FY_ERR_INVALID);
    assert_non_null(strstr(err, "prompt_logprobs"));
    /* a prompt whose logprobs would be too many entries (6300 tokens
     * times 21): refused by name; with 5 alternatives it is not */
    char *big = token_prompt_json(6300, 3, ",\"prompt_logprobs\":20,\"max_tokens\":1");
    r = call("POST", "/v1/completions", KEY_A, big);
    expect_error(&r, 400, "prompt_logprobs", "entries");
    free(r.body);
    fy_free(big);
    fy_free(plain);
    fy_free(banned);
    fy_free(banned2);
    json_decref(a);
    json_decref(b);
    json_decref(co);
    json_decref(ptoks);
}

/* ---- curl, the client people type ---- */

static char *run_capture(const char *cmd)
{
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t cap = 1 << 16, n = 0;
    char *out = malloc(cap);
    size_t k;
    while ((k = fread(out + n, 1, cap - n - 1, p)) > 0) {
        n += k;
        if (n + 1 >= cap) out = realloc(out, cap *= 2);
    }
    out[n] = 0;
    int rc = pclose(p);
    if (rc != 0) fail_msg("'%s' exited with %d: %s", cmd, rc, out);
    return out;
}

/* A completion's first choice and usage (fails the test unless HTTP 200). */
static json_t *completion(const char *body, const char **text_p, const char **finish_p, json_int_t *prompt_tokens_p)
{
    resp_t r = call("POST", "/v1/completions", KEY_A, body);
    if (r.status != 200) fail_msg("%s: HTTP %d %s", body, r.status, r.body);
    json_t *j = json_of(&r);
    free(r.body);
    json_t *c = json_array_get(json_object_get(j, "choices"), 0);
    *text_p = json_string_value(json_object_get(c, "text"));
    *finish_p = json_string_value(json_object_get(c, "finish_reason"));
    if (prompt_tokens_p)
        *prompt_tokens_p = json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens"));
    assert_non_null(*text_p);
    return j;
}

/* The id of a token by its text, from a chat prompt's tokens (special
 * tokens included: the template writes them). */
static json_int_t chat_token_id(const char *piece)
{
    resp_t r = call("POST", "/tokenize", KEY_A,
                    "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"return_token_strs\":true}");
    if (r.status != 200) fail_msg("tokenize: HTTP %d %s", r.status, r.body);
    json_t *j = json_of(&r);
    free(r.body);
    json_t *toks = json_object_get(j, "tokens"), *strs = json_object_get(j, "token_strs");
    json_int_t id = -1;
    for (size_t i = 0; i < json_array_size(strs) && id < 0; i++)
        if (!strcmp(json_string_value(json_array_get(strs, i)), piece))
            id = json_integer_value(json_array_get(toks, i));
    json_decref(j);
    if (id < 0) fail_msg("no token '%s' in the chat prompt", piece);
    return id;
}

/* vLLM's output controls through the cluster (issue 34's proof of the one
 * request type): allowed_token_ids, include_stop_str_in_output,
 * skip_special_tokens and truncate_prompt_tokens, each against the answer
 * without it. */
static void test_vllm_output_controls(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    char body[1024];
    const char *text, *finish;
    json_int_t np;
    /* allowed_token_ids: one token, sampled at temperature 1: the answer is
     * that token five times, and the end of turn, banned too, never comes */
    resp_t r = call("POST", "/tokenize", KEY_A, "{\"prompt\":\" the\"}");
    assert_int_equal(r.status, 200);
    json_t *j = json_of(&r);
    free(r.body);
    assert_int_equal(json_array_size(json_object_get(j, "tokens")), 1);
    json_int_t the = json_integer_value(json_array_get(json_object_get(j, "tokens"), 0));
    json_decref(j);
    snprintf(body, sizeof(body),
             "{\"prompt\":\"" EPROMPT "\",\"max_tokens\":5,\"temperature\":1,\"seed\":3,\"allowed_token_ids\":[%lld]}",
             (long long)the);
    j = completion(body, &text, &finish, NULL);
    assert_string_equal(text, " the the the the the");
    assert_string_equal(finish, "length");
    json_decref(j);
    /* include_stop_str_in_output: the greedy answer cut at its second word,
     * without and with the stop string */
    char *full = greedy_text(NULL);
    const char *sp = strchr(full + 1, ' ');
    assert_non_null(sp);
    char stop[16] = "";
    size_t sl = strcspn(sp + 1, " ");
    assert_true(sl > 0 && sl < 8);
    snprintf(stop, sizeof(stop), "%.*s", (int)sl + 1, sp); /* " word" */
    const char *at = strstr(full, stop);
    assert_non_null(at);
    for (int incl = 0; incl < 2; incl++) {
        snprintf(body, sizeof(body),
                 "{\"prompt\":\"" EPROMPT "\",\"max_tokens\":12,\"temperature\":0,\"ignore_eos\":true,"
                 "\"stop\":[\"%s\"]%s}",
                 stop, incl ? ",\"include_stop_str_in_output\":true" : "");
        j = completion(body, &text, &finish, NULL);
        size_t want = (size_t)(at - full) + (incl ? strlen(stop) : 0);
        if (strlen(text) != want || strncmp(text, full, want))
            fail_msg("stop '%s' (include %d): '%s' from '%s'", stop, incl, text, full);
        assert_string_equal(finish, "stop");
        json_decref(j);
    }
    fy_free(full);
    /* skip_special_tokens: the end-of-turn token alone, kept going with
     * ignore_eos: its text only when special tokens are not skipped */
    json_int_t end = chat_token_id("<|im_end|>");
    for (int skip = 0; skip < 2; skip++) {
        snprintf(body, sizeof(body),
                 "{\"prompt\":\"Hi\",\"max_tokens\":3,\"ignore_eos\":true,\"allowed_token_ids\":[%lld]%s}",
                 (long long)end, skip ? "" : ",\"skip_special_tokens\":false");
        j = completion(body, &text, &finish, NULL);
        assert_string_equal(text, skip ? "" : "<|im_end|><|im_end|><|im_end|>");
        json_decref(j);
    }
    /* truncate_prompt_tokens: the prompt's last N tokens, text or ids; an
     * id prompt longer than the context is taken when truncated */
    snprintf(body, sizeof(body), "{\"prompt\":\"" EPROMPT "\",\"max_tokens\":1,\"truncate_prompt_tokens\":3}");
    j = completion(body, &text, &finish, &np);
    assert_int_equal(np, 3);
    json_decref(j);
    r = call("GET", "/v1/models/SmolLM2-135M-Instruct.Q4_1", NULL, NULL);
    j = json_of(&r);
    free(r.body);
    json_int_t ctx = json_integer_value(json_object_get(j, "max_model_len"));
    json_decref(j);
    assert_true(ctx > 8);
    size_t cap = (size_t)(ctx + 16) * 8 + 256;
    char *big = malloc(cap);
    size_t n = (size_t)snprintf(big, cap, "{\"max_tokens\":1,\"truncate_prompt_tokens\":5,\"prompt\":[");
    for (json_int_t i = 0; i < ctx + 16; i++)
        n += (size_t)snprintf(big + n, cap - n, "%s%lld", i ? "," : "", (long long)(100 + i % 50));
    snprintf(big + n, cap - n, "]}");
    j = completion(big, &text, &finish, &np);
    assert_int_equal(np, 5);
    json_decref(j);
    strstr(big, ",\"truncate_prompt_tokens\":5")[0] = ' '; /* without it: too long */
    memset(strstr(big, " \"truncate_prompt_tokens\":5"), ' ', strlen(" \"truncate_prompt_tokens\":5"));
    r = call("POST", "/v1/completions", KEY_A, big);
    assert_int_equal(r.status, 400);
    free(r.body);
    free(big);
    /* refused naming the field */
    static const char *const bad[][2] = {
        {"allowed_token_ids", "[]"},
        {"allowed_token_ids", "[-1]"},
        {"allowed_token_ids", "\"1\""},
        {"truncate_prompt_tokens", "0"},
        {"truncate_prompt_tokens", "-2"},
        {"skip_special_tokens", "1"},
        {"include_stop_str_in_output", "\"yes\""},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(body, sizeof(body), "{\"prompt\":\"Hi\",\"max_tokens\":1,\"%s\":%s}", bad[i][0], bad[i][1]);
        r = call("POST", "/v1/completions", KEY_A, body);
        expect_error(&r, 400, bad[i][0], NULL);
        free(r.body);
    }
}

/* ---- the workers' context ---- */

/* An error answer of OpenAI's context-length kind: 400, param and code,
 * its message holding in_message. */
static void expect_context_error(const resp_t *r, const char *param, const char *in_message)
{
    expect_error(r, 400, param, in_message);
    json_t *j = json_of(r);
    const char *code = json_string_value(json_object_get(json_object_get(j, "error"), "code"));
    if (!code || strcmp(code, "context_length_exceeded"))
        fail_msg("code '%s', expected 'context_length_exceeded': %s", code ? code : "null", r->body);
    json_decref(j);
}

/* A chat body whose one user message is word n times (stream, then extra). */
static char *chat_words(const char *word, int n, bool stream, const char *extra)
{
    size_t cap = (size_t)n * (strlen(word) + 1) + 256;
    char *b = fy_malloc(cap);
    size_t k = (size_t)snprintf(b, cap, "{\"stream\":%s%s,\"messages\":[{\"role\":\"user\",\"content\":\"",
                                stream ? "true" : "false", extra);
    for (int i = 0; i < n; i++) k += (size_t)snprintf(b + k, cap - k, "%s ", word);
    snprintf(b + k, cap - k, "\"}]}");
    return b;
}

/* With prefill.ctx and decode.ctx below the model's (issue 35), the door
 * knows the pool's context, the smallest of the workers' (the prefill
 * worker's 384 here): /v1/models and /tokenize say it as max_model_len; a
 * request that does not fit it (its prompt, or its prompt and max_tokens)
 * is refused with OpenAI's context_length_exceeded, whole and streamed,
 * before any worker is asked (the router's counts do not move); without
 * max_tokens a chat gets the room left, not the configured default; what
 * fits exactly is served; and the nng client's port refuses the same
 * naming the context, not with a worker's "bad reserve". */
static void test_workers_context(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    tc_cluster_t c2;
    int port2 = free_port(), keep = PORT;
    char http[128];
    snprintf(http, sizeof(http), "router.http=http://127.0.0.1:%d", port2);
    tc_opts_t o = {.n_prefill = 1,
                   .n_decode = 1,
                   .common = {http, "decode.kv_mem=64MiB"},
                   .per_worker = {{"prefill.ctx=384"}, {"decode.ctx=512"}}};
    tc_start(&c2, &o);
    PORT = port2;
    resp_t r = call("GET", "/v1/models", NULL, NULL);
    assert_int_equal(r.status, 200);
    json_t *j = json_of(&r);
    free(r.body);
    assert_int_equal(
        json_integer_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "max_model_len")), 384);
    json_decref(j);
    r = call("POST", "/tokenize", NULL, "{\"prompt\":\"Hi\"}");
    assert_int_equal(r.status, 200);
    j = json_of(&r);
    free(r.body);
    assert_int_equal(json_integer_value(json_object_get(j, "max_model_len")), 384);
    json_decref(j);
    /* the long chat message's tokens: between the prefill worker's context and the decode worker's */
    char *long_chat = chat_words("river", 420, false, "");
    char *tok_body = fy_malloc(strlen(long_chat) + 2);
    sprintf(tok_body, "{%s", strstr(long_chat, "\"messages\""));
    r = call("POST", "/tokenize", NULL, tok_body);
    fy_free(tok_body);
    j = json_of(&r);
    free(r.body);
    json_int_t n_long = json_integer_value(json_object_get(j, "count"));
    json_decref(j);
    if (n_long <= 384 || n_long >= 512) fail_msg("the long chat is %lld tokens", (long long)n_long);

    fy_client_status_t s0, s1;
    tc_status(&c2, &s0);
    char msg[160];
    char *p384 = token_prompt_json(384, 11, ""), *p300 = token_prompt_json(300, 12, ",\"max_tokens\":100"),
         *p300s = token_prompt_json(300, 12, ",\"max_completion_tokens\":100,\"stream\":true"),
         *p450s = token_prompt_json(450, 13, ",\"stream\":true"), *long_chat_s = chat_words("river", 420, true, ""),
         *chat_mt = chat_words("river", 200, false, ",\"max_tokens\":200"),
         *p10 = token_prompt_json(10, 15, ",\"max_tokens\":500");
    r = call("POST", "/v1/completions", NULL, p384);
    expect_context_error(&r, "prompt",
                         "This model's maximum context length is 384 tokens. However, your prompt "
                         "resulted in 384 tokens");
    free(r.body);
    r = call("POST", "/v1/completions", NULL, p300);
    expect_context_error(&r, "prompt", "you requested 400 tokens (300 in the prompt, 100 in the completion)");
    free(r.body);
    r = call("POST", "/v1/completions", NULL, p300s);
    expect_context_error(&r, "prompt", "you requested 400 tokens (300 in the prompt, 100 in the completion)");
    free(r.body);
    r = call("POST", "/v1/completions", NULL, p450s);
    expect_context_error(&r, "prompt", "is 384 tokens");
    free(r.body);
    snprintf(msg, sizeof(msg), "your messages resulted in %lld tokens", (long long)n_long);
    r = call("POST", "/v1/chat/completions", NULL, long_chat);
    expect_context_error(&r, "messages", msg);
    free(r.body);
    r = call("POST", "/v1/chat/completions", NULL, long_chat_s);
    expect_context_error(&r, "messages", msg);
    free(r.body);
    r = call("POST", "/v1/chat/completions", NULL, chat_mt);
    expect_context_error(&r, "messages", "in the messages, 200 in the completion)");
    free(r.body);
    r = call("POST", "/v1/completions", NULL, p10); /* max_tokens past the context alone: the same rule */
    expect_context_error(&r, "prompt", "you requested 510 tokens (10 in the prompt, 500 in the completion)");
    free(r.body);
    tc_status(&c2, &s1);
    assert_int_equal(s1.completed, s0.completed); /* no worker was asked */
    assert_int_equal(s1.failed, s0.failed);
    assert_int_equal(s1.retried, s0.retried);
    fy_free(p384);
    fy_free(p300);
    fy_free(p300s);
    fy_free(p450s);
    fy_free(long_chat);
    fy_free(long_chat_s);
    fy_free(chat_mt);
    fy_free(p10);

    /* what fits: the whole context exactly; a chat without max_tokens gets the room left */
    char *p370 = token_prompt_json(370, 14, ",\"max_tokens\":14,\"ignore_eos\":true");
    r = call("POST", "/v1/completions", NULL, p370);
    if (r.status != 200) fail_msg("HTTP %d: %s", r.status, r.body);
    j = json_of(&r);
    free(r.body);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), 14);
    json_decref(j);
    fy_free(p370);
    char *fits = chat_words("river", 300, false, ",\"ignore_eos\":true");
    r = call("POST", "/v1/chat/completions", NULL, fits);
    if (r.status != 200) fail_msg("HTTP %d: %s", r.status, r.body);
    j = json_of(&r);
    free(r.body);
    json_t *u = json_object_get(j, "usage");
    json_int_t pt = json_integer_value(json_object_get(u, "prompt_tokens")),
               ct = json_integer_value(json_object_get(u, "completion_tokens"));
    if (pt >= 384 || ct < 1 || pt + ct != 384)
        fail_msg("%lld prompt and %lld completion tokens", (long long)pt, (long long)ct);
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "finish_reason")),
        "length");
    json_decref(j);
    fy_free(fits);

    /* the nng client's port: the same context, in words that name it */
    int32_t ids[450];
    for (int i = 0; i < 450; i++) ids[i] = 100 + i;
    fy_client_req_t q = {.tokens = ids, .n_tokens = 450};
    fy_genspec_default(&q.gen);
    q.gen.max_tokens = 4;
    fy_client_stream_t cs;
    char err[256] = "";
    assert_int_equal(fy_client_generate(c2.client, &q, &cs, err, sizeof(err)), FY_ERR_INVALID);
    if (!strstr(err, "maximum context length is 384 tokens") || !strstr(err, "450 tokens")) fail_msg("%s", err);
    q.n_tokens = 10;
    q.gen.max_tokens = 400;
    assert_int_equal(fy_client_generate(c2.client, &q, &cs, err, sizeof(err)), FY_ERR_INVALID);
    if (!strstr(err, "maximum context length is 384 tokens") || !strstr(err, "'max_tokens' is 400"))
        fail_msg("%s", err);
    q.gen.max_tokens = 4;
    assert_int_equal(fy_client_generate(c2.client, &q, &cs, err, sizeof(err)), FY_OK);
    tc_result_t res = {0};
    tc_collect(&c2, &cs, &res, 1, 60);
    assert_int_equal(res.error, FY_OK);
    PORT = keep;
    tc_stop(&c2);
}

/* ---- what two peer projects' OpenAI test suites found (issue 35) ---- */

static void test_peer_suite_findings(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    const char *served = "SmolLM2-135M-Instruct.Q4_1";
    resp_t r;
    json_t *j;
    /* stream_options says how to stream: without "stream": true it is
     * OpenAI's and vLLM's 400 naming it (null is no options) */
    static const char *const no_stream[] = {
        "{\"prompt\":\"hi\",\"max_tokens\":1,\"stream_options\":{\"include_usage\":true}}",
        "{\"prompt\":\"hi\",\"max_tokens\":1,\"stream\":false,\"stream_options\":{\"include_usage\":true}}",
        "{\"prompt\":\"hi\",\"max_tokens\":1,\"stream\":null,\"stream_options\":{}}",
    };
    for (size_t i = 0; i < 3; i++) {
        r = call("POST", "/v1/completions", KEY_A, no_stream[i]);
        expect_error(&r, 400, "stream_options", "'stream': true");
        free(r.body);
    }
    r = call("POST", "/v1/chat/completions", KEY_A,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":1,\"stream\":false,"
             "\"stream_options\":{\"include_usage\":true}}");
    expect_error(&r, 400, "stream_options", NULL);
    free(r.body);
    r = call("POST", "/v1/completions", KEY_A, "{\"prompt\":\"hi\",\"max_tokens\":1,\"stream_options\":null}");
    if (r.status != 200) fail_msg("stream_options null: HTTP %d %s", r.status, r.body);
    free(r.body);
    r = call("POST", "/v1/completions", KEY_A,
             "{\"prompt\":\"hi\",\"max_tokens\":1,\"stream\":true,\"stream_options\":{\"include_usage\":true}}");
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"usage\":{"));
    free(r.body);
    /* an unknown model in a body is OpenAI's 404 with code model_not_found,
     * as GET /v1/models/{id} answers */
    static const char *const unknown_model[][2] = {
        {"/v1/completions", "{\"prompt\":\"hi\",\"model\":\"gpt-4\"}"},
        {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"model\":\"gpt-4\"}"},
        {"/tokenize", "{\"prompt\":\"hi\",\"model\":\"gpt-4\"}"},
    };
    for (size_t i = 0; i < 3; i++) {
        r = call("POST", unknown_model[i][0], KEY_A, unknown_model[i][1]);
        expect_error(&r, 404, "model", "gpt-4");
        j = json_of(&r);
        json_t *code = json_object_get(json_object_get(j, "error"), "code");
        if (!json_is_string(code) || strcmp(json_string_value(code), "model_not_found"))
            fail_msg("%s: code is not model_not_found: %s", unknown_model[i][0], r.body);
        json_decref(j);
        free(r.body);
    }
    /* a seed beyond 64 bits: jansson refuses the number before any field
     * is read; the fault still names the field */
    static const char *const huge[] = {"18446744073709551616", "9223372036854775808", "-99999999999999999999"};
    for (size_t i = 0; i < 3; i++) {
        char b[256];
        snprintf(b, sizeof(b), "{\"prompt\":\"hi\",\"max_tokens\":1,\"temperature\":1e30,\"seed\":%s}", huge[i]);
        r = call("POST", "/v1/completions", KEY_A, b);
        expect_error(&r, 400, "seed", "64-bit");
        free(r.body);
    }
    r = call("POST", "/v1/completions", KEY_A, "{\"prompt\":\"hi\",\"logit_bias\":{\"5\":1e999999999999999999999}}");
    expect_error(&r, 400, NULL, "malformed JSON"); /* not an integer: as before */
    free(r.body);
    r = call("POST", "/v1/completions", KEY_A, "{\"prompt\":\"hi\",\"max_tokens\":1,\"seed\":9223372036854775807}");
    if (r.status != 200) fail_msg("seed 2^63-1: HTTP %d %s", r.status, r.body);
    free(r.body);
    /* the role list of the refusal names developer, which is served */
    r = call("POST", "/v1/chat/completions", KEY_A, "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}");
    expect_error(&r, 400, "messages", "system, developer, user, assistant or tool");
    free(r.body);
    r = call("POST", "/v1/chat/completions", KEY_A,
             "{\"messages\":[{\"role\":\"developer\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":"
             "\"hi\"}],\"max_tokens\":1}");
    if (r.status != 200) fail_msg("developer role: HTTP %d %s", r.status, r.body);
    free(r.body);
    /* the routes without /v1, as llama.cpp's server answers them */
    r = call("POST", "/completions", KEY_A, "{\"prompt\":\"hi\",\"max_tokens\":2}");
    if (r.status != 200) fail_msg("/completions: HTTP %d %s", r.status, r.body);
    j = json_of(&r);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "text_completion");
    json_decref(j);
    free(r.body);
    r = call("POST", "/chat/completions", KEY_A,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":2,\"stream\":true}");
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "chat.completion.chunk"));
    assert_non_null(strstr(r.body, "data: [DONE]"));
    free(r.body);
    r = call("POST", "/responses", KEY_A, "{\"input\":\"hi\",\"max_output_tokens\":2}");
    if (r.status != 200) fail_msg("/responses: HTTP %d %s", r.status, r.body);
    j = json_of(&r);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "response");
    json_decref(j);
    free(r.body);
    r = call("POST", "/completions", NULL, "{\"prompt\":\"hi\"}");
    expect_error(&r, 401, NULL, "API key"); /* behind the keys as /v1's */
    free(r.body);
    r = call("POST", "/chat/completions", KEY_A, "{\"messages\":[]}");
    expect_error(&r, 400, "messages", NULL);
    free(r.body);
    resp_t rv = call("GET", "/v1/models", NULL, NULL);
    r = call("GET", "/models", NULL, NULL);
    assert_int_equal(rv.status, 200);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, rv.body);
    /* root is the served name; the id (name and hash) is model_id */
    j = json_of(&r);
    json_t *m = json_array_get(json_object_get(j, "data"), 0);
    assert_string_equal(json_string_value(json_object_get(m, "id")), served);
    assert_string_equal(json_string_value(json_object_get(m, "root")), served);
    const char *model_id = json_string_value(json_object_get(m, "model_id"));
    assert_non_null(model_id);
    assert_non_null(strchr(model_id, '@'));
    char path[256], id_copy[128];
    snprintf(id_copy, sizeof(id_copy), "%s", model_id);
    json_decref(j);
    free(r.body);
    free(rv.body);
    snprintf(path, sizeof(path), "/models/%s", served);
    r = call("GET", path, NULL, NULL);
    assert_int_equal(r.status, 200);
    j = json_of(&r);
    assert_string_equal(json_string_value(json_object_get(j, "root")), served);
    json_decref(j);
    free(r.body);
    snprintf(path, sizeof(path), "/models/%s", id_copy); /* the model's id names it too */
    r = call("GET", path, NULL, NULL);
    assert_int_equal(r.status, 200);
    free(r.body);
    r = call("GET", "/models/gpt-4", NULL, NULL);
    expect_error(&r, 404, "model", "'gpt-4' does not exist");
    free(r.body);
    /* the nng status and `ferry request --status` name the served model
     * first, with the id beside it */
    fy_client_status_t st;
    assert_int_equal(fy_client_status(C.client, &st), FY_OK);
    assert_string_equal(st.served_model, served);
    assert_string_equal(st.model, id_copy);
    const char *bin = getenv("FERRY_BIN") ? getenv("FERRY_BIN") : "bin";
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "%s/ferry request -r '%s' --secret '%s' --status 2>&1", bin, C.router_url, C.secret);
    char *out = run_capture(cmd);
    char want[256];
    snprintf(want, sizeof(want), "model %s (id %s): ", served, id_copy);
    if (strncmp(out, want, strlen(want)))
        fail_msg("ferry request --status says '%s', expected it to start '%s'", out, want);
    free(out);
}

static void test_curl(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    if (system("curl --version >/dev/null 2>&1") != 0) {
        print_message("curl is not installed: skipped\n");
        skip();
    }
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             "curl -sS -f http://127.0.0.1:%d/v1/completions -H 'Authorization: Bearer %s' "
             "-H 'Content-Type: application/json' -d '{\"prompt\": \"Once upon a time\", \"max_tokens\": 6, "
             "\"temperature\": 0}'",
             PORT, KEY_A);
    char *plain = run_capture(cmd);
    json_error_t e;
    json_t *j = json_loads(plain, 0, &e);
    assert_non_null(j);
    const char *text = json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text"));
    assert_non_null(text);
    snprintf(cmd, sizeof(cmd),
             "curl -sS -N -f http://127.0.0.1:%d/v1/completions -H 'Authorization: Bearer %s' "
             "-H 'Content-Type: application/json' -d '{\"prompt\": \"Once upon a time\", \"max_tokens\": 6, "
             "\"temperature\": 0, \"stream\": true}'",
             PORT, KEY_A);
    char *streamed = run_capture(cmd);
    char joined[1024] = "";
    size_t k = 0;
    const char *at = streamed;
    for (json_t *c; (c = sse_next(&at)); json_decref(c)) {
        const char *t = json_string_value(json_object_get(json_array_get(json_object_get(c, "choices"), 0), "text"));
        if (t) k += (size_t)snprintf(joined + k, sizeof(joined) - k, "%s", t);
    }
    assert_non_null(strstr(streamed, "data: [DONE]"));
    assert_string_equal(joined, text);
    /* nothing but events: each line "data: ..." or the blank line after one */
    for (char *line = streamed, *nl; *line; line = nl + 1) {
        nl = strchr(line, '\n');
        if (!nl) nl = line + strlen(line) - 1;
        if (nl > line && strncmp(line, "data: ", 6))
            fail_msg("a stream line that is not an event: '%.*s'", (int)(nl - line), line);
        if (!nl[1]) break;
    }
    json_decref(j);
    free(plain);
    free(streamed);
}

/* ---- the openai Python package ---- */

static void test_openai_python(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    const char *venv = getenv("FERRY_OPENAI_VENV") ? getenv("FERRY_OPENAI_VENV") : "build/openai-venv";
    char cmd[2048];
    snprintf(cmd, sizeof(cmd),
             "[ -x %s/bin/python ] && %s/bin/python -c 'import openai' 2>/dev/null || "
             "{ python3 -m venv %s && %s/bin/pip install -q openai; } >/dev/null 2>&1",
             venv, venv, venv, venv);
    if (system(cmd) != 0) {
        print_message("the openai package cannot be installed here (no PyPI?): skipped\n");
        skip();
    }
    snprintf(cmd, sizeof(cmd), "%s/bin/python tests/openai_check.py http://127.0.0.1:%d/v1 %s", venv, PORT, KEY_A);
    int rc = system(cmd);
    assert_int_equal(rc, 0);
}

/* ---- prompt arrays and special tokens in raw prompts (issue 35) ---- */

/* A completion's greedy text (fy_strdup'd) and prompt tokens alone. */
static char *greedy_alone(const char *prompt, json_int_t *np)
{
    char body[512];
    snprintf(body, sizeof(body), "{\"prompt\":\"%s\",\"max_tokens\":4,\"temperature\":0,\"ignore_eos\":true}", prompt);
    const char *t, *f;
    json_t *j = completion(body, &t, &f, np);
    char *out = fy_strdup(t);
    json_decref(j);
    return out;
}

/* The streamed choices' texts put together (into texts[index]); every
 * chunk names one choice below n_choices; [DONE] comes once, last; the
 * usage chunk's counts into *np and *nc. */
static void read_stream(const char *body, int n_choices, char texts[][256], const char **fin, json_int_t *np,
                        json_int_t *nc)
{
    int done = 0;
    *np = *nc = -1;
    for (const char *p = body; (p = strstr(p, "data: ")); p += 6) {
        if (!strncmp(p + 6, "[DONE]", 6)) {
            done++;
            assert_null(strstr(p + 6, "data: ")); /* the last event sent */
            continue;
        }
        json_error_t e;
        json_t *c = json_loadb(p + 6, strcspn(p + 6, "\n"), 0, &e);
        if (!c) fail_msg("not JSON: %.80s", p + 6);
        json_t *u = json_object_get(c, "usage"), *ch = json_object_get(c, "choices");
        if (json_is_object(u)) {
            *np = json_integer_value(json_object_get(u, "prompt_tokens"));
            *nc = json_integer_value(json_object_get(u, "completion_tokens"));
        }
        if (json_array_size(ch)) {
            assert_int_equal(json_array_size(ch), 1);
            json_t *one = json_array_get(ch, 0);
            json_int_t i = json_integer_value(json_object_get(one, "index"));
            if (i < 0 || i >= n_choices) fail_msg("a chunk of choice %lld; there are %d", (long long)i, n_choices);
            const char *t = json_string_value(json_object_get(one, "text"));
            size_t have = strlen(texts[i]);
            if (t) snprintf(texts[i] + have, 256 - have, "%s", t);
            const char *f = json_string_value(json_object_get(one, "finish_reason"));
            if (f && fin) fin[i] = f[0] == 'l' ? "length" : f[0] == 'a' ? "abort" : "stop";
        }
        json_decref(c);
    }
    assert_int_equal(done, 1);
}

/*
 * /v1/completions' prompt arrays, as OpenAI and vLLM take them: strings or
 * token-id arrays, one choice per prompt and per n at index prompt * n +
 * k, whole and streamed, usage summed; each prompt's greedy answer is
 * the one it gets alone.  Before: 400 "one prompt per request".
 */
static void test_prompt_arrays(void **state)
{
    (void)state;
    if (!tc_available()) skip();
    static const char *const P[2] = {"The capital of France is", "One, two, three,"};
    json_int_t np[2];
    char *want[2];
    for (int p = 0; p < 2; p++) want[p] = greedy_alone(P[p], &np[p]);
    assert_string_not_equal(want[0], want[1]); /* (so that a choice under the wrong index shows) */
    char body[1024];
    for (int form = 0; form < 2; form++) { /* strings, then the same prompts as token ids */
        char prompts[512];
        if (form == 0) {
            snprintf(prompts, sizeof(prompts), "[\"%s\",\"%s\"]", P[0], P[1]);
        } else {
            size_t k = (size_t)snprintf(prompts, sizeof(prompts), "[");
            for (int p = 0; p < 2; p++) {
                snprintf(body, sizeof(body), "{\"prompt\":\"%s\"}", P[p]);
                resp_t t = call("POST", "/tokenize", KEY_A, body);
                assert_int_equal(t.status, 200);
                json_t *j = json_of(&t);
                char *ids = json_dumps(json_object_get(j, "tokens"), JSON_COMPACT);
                k += (size_t)snprintf(prompts + k, sizeof(prompts) - k, "%s%s", p ? "," : "", ids);
                free(ids);
                json_decref(j);
                free(t.body);
            }
            snprintf(prompts + k, sizeof(prompts) - k, "]");
        }
        snprintf(body, sizeof(body), "{\"prompt\":%s,\"n\":2,\"max_tokens\":4,\"temperature\":0,\"ignore_eos\":true}",
                 prompts);
        resp_t r = call("POST", "/v1/completions", KEY_A, body);
        if (r.status != 200) fail_msg("%s: HTTP %d %s", body, r.status, r.body);
        json_t *j = json_of(&r);
        json_t *choices = json_object_get(j, "choices");
        assert_int_equal(json_array_size(choices), 4);
        for (size_t i = 0; i < 4; i++) {
            json_t *c = json_array_get(choices, i);
            assert_int_equal(json_integer_value(json_object_get(c, "index")), (json_int_t)i);
            assert_string_equal(json_string_value(json_object_get(c, "text")), want[i / 2]);
            assert_string_equal(json_string_value(json_object_get(c, "finish_reason")), "length");
        }
        json_t *u = json_object_get(j, "usage");
        assert_int_equal(json_integer_value(json_object_get(u, "prompt_tokens")), np[0] + np[1]);
        assert_int_equal(json_integer_value(json_object_get(u, "completion_tokens")), 16);
        json_decref(j);
        free(r.body);
        /* streamed: each chunk names its choice, [DONE] once at the end */
        snprintf(body, sizeof(body),
                 "{\"prompt\":%s,\"n\":2,\"max_tokens\":4,\"temperature\":0,\"ignore_eos\":true,\"stream\":true,"
                 "\"stream_options\":{\"include_usage\":true}}",
                 prompts);
        r = call("POST", "/v1/completions", KEY_A, body);
        assert_int_equal(r.status, 200);
        char texts[4][256] = {""};
        const char *fin[4] = {NULL};
        json_int_t sp, sc;
        read_stream(r.body, 4, texts, fin, &sp, &sc);
        for (int i = 0; i < 4; i++) {
            assert_string_equal(texts[i], want[i / 2]);
            assert_non_null(fin[i]);
            assert_string_equal(fin[i], "length");
        }
        assert_int_equal(sp, np[0] + np[1]);
        assert_int_equal(sc, 16);
        free(r.body);
    }
    fy_free(want[0]);
    fy_free(want[1]);
    /* echo: each choice's own prompt (max_tokens 0: the prompt alone) */
    snprintf(body, sizeof(body), "{\"prompt\":[\"%s\",\"%s\"],\"n\":2,\"max_tokens\":0,\"echo\":true}", P[0], P[1]);
    resp_t e = call("POST", "/v1/completions", KEY_A, body);
    if (e.status != 200) fail_msg("%s: HTTP %d %s", body, e.status, e.body);
    json_t *ej = json_of(&e);
    for (size_t i = 0; i < 4; i++)
        assert_string_equal(
            json_string_value(json_object_get(json_array_get(json_object_get(ej, "choices"), i), "text")), P[i / 2]);
    json_decref(ej);
    free(e.body);

    /* the bounds and the faults, each naming 'prompt' (and where) */
    static const struct {
        const char *body, *in_message;
    } bad[] = {
        {"{\"prompt\":[]}", "empty array"},
        {"{\"prompt\":[\"a\",5]}", "'prompt'[1] must be a string or an array of token ids"},
        {"{\"prompt\":[\"a\",\"\"]}", "'prompt'[1] is empty"},
        {"{\"prompt\":[[1,2],[]]}", "'prompt'[1] is empty"},
        {"{\"prompt\":[[1,2],[3,999999]]}", "'prompt'[1][1] is not a token id"},
        {"{\"prompt\":[[1,2],{\"a\":1}]}", "'prompt'[1] must be"},
        {"{\"prompt\":[\"a\",\"b\",\"c\",\"d\",\"e\"],\"n\":16}", "80 choices; at most 64"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        resp_t r = call("POST", "/v1/completions", KEY_A, bad[i].body);
        expect_error(&r, 400, "prompt", bad[i].in_message);
        free(r.body);
    }
    size_t k = (size_t)snprintf(body, sizeof(body), "{\"prompt\":[");
    for (int i = 0; i < FY_HTTP_MAX_PROMPTS + 1; i++)
        k += (size_t)snprintf(body + k, sizeof(body) - k, "%s\"x\"", i ? "," : "");
    snprintf(body + k, sizeof(body) - k, "],\"max_tokens\":1}");
    resp_t r = call("POST", "/v1/completions", KEY_A, body);
    expect_error(&r, 400, "prompt", "33 prompts; at most 32");
    free(r.body);

    /* a prompt the router refuses (more tokens than the context holds)
     * ends its choice with an error that names it; the others end too */
    r = call("GET", "/v1/models", NULL, NULL);
    json_t *j = json_of(&r);
    json_int_t ctx =
        json_integer_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "max_model_len"));
    json_decref(j);
    free(r.body);
    assert_true(ctx > 0 && ctx < 20000);
    size_t cap = (size_t)ctx * 2 + 256;
    char *big = fy_malloc(cap);
    for (int where = 0; where < 2; where++)
        for (int stream = 0; stream < 2; stream++) {
            k = (size_t)snprintf(big, cap, "{\"max_tokens\":2,\"stream\":%s,\"prompt\":[%s\"",
                                 stream ? "true" : "false", where ? "\"Hi\"," : "");
            for (json_int_t i = 0; i < ctx + 8; i++) k += (size_t)snprintf(big + k, cap - k, " a");
            snprintf(big + k, cap - k, "\"%s]}", where ? "" : ",\"Hi\"");
            r = call("POST", "/v1/completions", KEY_A, big);
            char named[32];
            snprintf(named, sizeof(named), "'prompt'[%d]", where);
            /* refused at the door, before any worker is asked, streamed
             * or not, whichever prompt it is: OpenAI's context error,
             * naming the prompt */
            expect_error(&r, 400, "prompt", named);
            j = json_of(&r);
            json_t *err = json_object_get(j, "error");
            assert_non_null(strstr(json_string_value(json_object_get(err, "message")), "maximum context length"));
            assert_string_equal(json_string_value(json_object_get(err, "code")), "context_length_exceeded");
            json_decref(j);
            free(r.body);
        }
    fy_free(big);
    /* and the server serves on */
    want[0] = greedy_alone(P[0], &np[0]);
    fy_free(want[0]);
}

/*
 * Special tokens in a raw completion prompt are parsed (vLLM's): a
 * hand-written ChatML prompt is the 10 tokens Hugging Face's tokenizers
 * gives (test_tokenizer.c has the ids), in usage and in /tokenize; as
 * chat message content the same text stays text, its markers no control
 * tokens.  Before: 28 tokens.
 */
static void test_raw_prompt_special_tokens(void **state)
{
    (void)state;
    if (!tc_available()) skip();
#define CHATML "<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n"
    const char *t, *f;
    json_int_t np = 0;
    json_t *j = completion("{\"prompt\":\"" CHATML "\",\"max_tokens\":1}", &t, &f, &np);
    assert_int_equal(np, 10);
    json_decref(j);
    j = completion("{\"prompt\":[\"" CHATML "\",\"" CHATML "\"],\"max_tokens\":1}", &t, &f, &np);
    assert_int_equal(np, 20);
    json_decref(j);
    resp_t r = call("POST", "/tokenize", KEY_A, "{\"prompt\":\"" CHATML "\"}");
    assert_int_equal(r.status, 200);
    j = json_of(&r);
    static const json_int_t want[] = {1, 4093, 198, 6004, 2, 198, 1, 520, 9531, 198};
    json_t *toks = json_object_get(j, "tokens");
    assert_int_equal(json_array_size(toks), 10);
    for (size_t i = 0; i < 10; i++) assert_int_equal(json_integer_value(json_array_get(toks, i)), want[i]);
    json_decref(j);
    free(r.body);
    /* chat content: the markers are text; the template's own are the only
     * control tokens (as many as with any other content) */
    int specials[2] = {0, 0};
    for (int c = 0; c < 2; c++) {
        r = call("POST", "/tokenize", KEY_A,
                 c ? "{\"messages\":[{\"role\":\"user\",\"content\":\"" CHATML "\"}]}"
                   : "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
        assert_int_equal(r.status, 200);
        j = json_of(&r);
        toks = json_object_get(j, "tokens");
        for (size_t i = 0; i < json_array_size(toks); i++) {
            json_int_t id = json_integer_value(json_array_get(toks, i));
            specials[c] += id == 1 || id == 2;
        }
        assert_true(json_array_size(toks) > (c ? 28u : 3u));
        json_decref(j);
        free(r.body);
    }
    assert_true(specials[0] >= 2);
    assert_int_equal(specials[1], specials[0]);
#undef CHATML
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_models_and_health),
        cmocka_unit_test(test_completion_matches_nng_client),
        cmocka_unit_test(test_chat_plain_and_n),
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_tokenize_and_friends),
        cmocka_unit_test(test_max_completion_tokens),
        cmocka_unit_test(test_sampling_controls),
        cmocka_unit_test(test_echo_prompt_logprobs_bad_words),
        cmocka_unit_test(test_vllm_output_controls),
        cmocka_unit_test(test_prompt_arrays),
        cmocka_unit_test(test_raw_prompt_special_tokens),
        cmocka_unit_test(test_field_table),
        cmocka_unit_test(test_tool_calls),
        cmocka_unit_test(test_responses),
        cmocka_unit_test(test_responses_stream_ends),
        cmocka_unit_test(test_keepalive_after_refusals),
        cmocka_unit_test(test_cors),
        cmocka_unit_test(test_slow_and_departing_clients),
        cmocka_unit_test(test_tenant_limits),
        cmocka_unit_test(test_tenants_never_share_prefixes),
        cmocka_unit_test(test_router_metrics),
        cmocka_unit_test(test_stream_chunk_per_step),
        cmocka_unit_test(test_max_num_generation_tokens),
        cmocka_unit_test(test_created_is_the_answer_time),
        cmocka_unit_test(test_overload_503),
        cmocka_unit_test(test_workers_context),
        cmocka_unit_test(test_peer_suite_findings),
        cmocka_unit_test(test_curl),
        cmocka_unit_test(test_openai_python),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

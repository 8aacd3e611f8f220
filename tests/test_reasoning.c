/*
 * test_reasoning.c - a thinking model's answer split into reasoning and
 * content (router/reasoning.c): deepseek_r1's and qwen3's rules on whole
 * answers, then every answer fed as a stream cut at every point (and at
 * every pair of points, and byte by byte) giving what it gives whole,
 * never taking back what it has said; the rendered prompt's open
 * <think>.  Then chat bodies through router/http_parse.c with tiny models
 * the test writes (a Qwen3-style template with enable_thinking, and
 * ChatML): chat_template_kwargs reaching the template (and refused where
 * they would set the server's variables or hold a special token), the
 * parser each request gets (by the template and the rendered prompt,
 * router.reasoning_parser forcing it, a grammar that keeps the answer out
 * of a thinking the prompt opened), include_reasoning.  Last, that model
 * served by a cluster: reasoning and content whole and streamed (a
 * grammar forces the <think> block the random weights would never write;
 * its tags arrive a byte a token), the prompt's own <think>, thinking
 * switched off, tool calls after the thinking, and the `openai` package
 * reading reasoning_content (tests/openai_check.py's reasoning part).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>
#include <sodium.h>

#include "common/mem.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "router/http_parse.h"
#include "router/reasoning.h"
#include "tests/cluster_util.h"
#include "tests/gguf_writer.h"
#include "tests/testutil.h"
#include "tests/tinymodel.h"

typedef struct split_case {
    fy_reasoning_parser_t p;
    const char *text;
    const char *reasoning; /* NULL: the answer did not think */
    const char *content;   /* NULL: no content (empty) */
} split_case_t;

static const split_case_t CASES[] = {
    /* deepseek_r1: the prompt opened <think> */
    {FY_REASONING_DEEPSEEK_R1, "Let me see.\n</think>\n\nIt is 4.", "Let me see.\n", "\n\nIt is 4."},
    {FY_REASONING_DEEPSEEK_R1, "<think>\nhm</think>4", "\nhm", "4"}, /* a <think> of its own is dropped */
    {FY_REASONING_DEEPSEEK_R1, "  <think>x</think>y", "x", "y"},
    {FY_REASONING_DEEPSEEK_R1, "still thinking when cut", "still thinking when cut", NULL},
    {FY_REASONING_DEEPSEEK_R1, "ends with </thi", "ends with </thi", NULL}, /* a tag's beginning, then the end */
    {FY_REASONING_DEEPSEEK_R1, "</think>", "", NULL},
    {FY_REASONING_DEEPSEEK_R1, "a</think>b</think>c", "a", "b</think>c"}, /* only the first closes */
    {FY_REASONING_DEEPSEEK_R1, "<thin", "<thin", NULL},
    {FY_REASONING_DEEPSEEK_R1, "", "", NULL},
    {FY_REASONING_DEEPSEEK_R1, "\xc3\xa9t\xc3\xa9</think>\xe2\x82\xac", "\xc3\xa9t\xc3\xa9", "\xe2\x82\xac"},
    {FY_REASONING_DEEPSEEK_R1, "<</</think>>", "<</", ">"},
    /* qwen3: thinking only in a <think> the answer opens */
    {FY_REASONING_QWEN3, "<think>\nWhy?\n</think>\n\nBecause.", "\nWhy?\n", "\n\nBecause."},
    {FY_REASONING_QWEN3, "\n<think>a</think>b", "a", "b"},
    {FY_REASONING_QWEN3, "Plain answer.", NULL, "Plain answer."},
    {FY_REASONING_QWEN3, "No <think>here</think>", NULL, "No <think>here</think>"},
    {FY_REASONING_QWEN3, "<think>cut short", "cut short", NULL},
    {FY_REASONING_QWEN3, "<thi", NULL, "<thi"},
    {FY_REASONING_QWEN3, "<think></think>", "", NULL},
    {FY_REASONING_QWEN3, "<think>x</thinkk>y</think>z", "x</thinkk>y", "z"},
    {FY_REASONING_QWEN3, "   ", NULL, "   "},
    {FY_REASONING_QWEN3, "", NULL, NULL},
    /* none: all content */
    {FY_REASONING_NONE, "<think>a</think>b", NULL, "<think>a</think>b"},
};

/* What a stream sends: the reasoning's and the content's bytes as they
 * become sure, fed text[0, cuts[k]) for each cut and then the whole. */
typedef struct streamed {
    char reasoning[256], content[256];
    size_t rn, cn;
    bool thought;
} streamed_t;

static void stream_feed(fy_reasoning_t *r, const char *text, size_t len, bool done, streamed_t *s, size_t *r_from,
                        size_t *r_sent, size_t *c_sent)
{
    fy_reasoning_feed(r, text, len, done);
    size_t from, to, cf;
    fy_reasoning_span(r, &from, &to);
    if (to > from) {
        if (*r_from == (size_t)-1) *r_from = from;
        assert_int_equal(from, *r_from); /* where the reasoning begins never moves */
        assert_true(to >= *r_sent);      /* nor is any of it taken back */
        assert_true(to <= len);
        size_t start = *r_sent > from ? *r_sent : from;
        memcpy(s->reasoning + s->rn, text + start, to - start);
        s->rn += to - start;
        *r_sent = to;
    }
    if (fy_reasoning_content_from(r, &cf)) {
        assert_true(cf <= len);
        size_t start = *c_sent > cf ? *c_sent : cf;
        memcpy(s->content + s->cn, text + start, len - start);
        s->cn += len - start;
        *c_sent = len;
    }
    s->thought = fy_reasoning_thought(r);
}

static void run_stream(const split_case_t *c, const size_t *cuts, size_t n_cuts, streamed_t *s)
{
    memset(s, 0, sizeof(*s));
    fy_reasoning_t r;
    fy_reasoning_init(&r, c->p);
    size_t len = strlen(c->text), r_from = (size_t)-1, r_sent = 0, c_sent = 0;
    for (size_t k = 0; k < n_cuts; k++) stream_feed(&r, c->text, cuts[k], false, s, &r_from, &r_sent, &c_sent);
    stream_feed(&r, c->text, len, true, s, &r_from, &r_sent, &c_sent);
}

static void expect_case(const split_case_t *c, const streamed_t *s, const char *how)
{
    const char *want_r = c->reasoning ? c->reasoning : "", *want_c = c->content ? c->content : "";
    if (s->rn != strlen(want_r) || memcmp(s->reasoning, want_r, s->rn) || s->cn != strlen(want_c) ||
        memcmp(s->content, want_c, s->cn) || s->thought != (c->reasoning != NULL))
        fail_msg("%s %s \"%s\": reasoning \"%.*s\" (thought %d), content \"%.*s\"; want \"%s\" (%d), \"%s\"",
                 fy_reasoning_parser_name(c->p), how, c->text, (int)s->rn, s->reasoning, s->thought, (int)s->cn,
                 s->content, want_r, c->reasoning != NULL, want_c);
}

static void test_whole(void **state)
{
    (void)state;
    for (size_t i = 0; i < FY_ARRAY_LEN(CASES); i++) {
        streamed_t s;
        run_stream(&CASES[i], NULL, 0, &s);
        expect_case(&CASES[i], &s, "whole");
    }
}

/* Every cut point, every pair of them, and a byte at a time: the same
 * split as the whole answer's. */
static void test_every_cut(void **state)
{
    (void)state;
    for (size_t i = 0; i < FY_ARRAY_LEN(CASES); i++) {
        const split_case_t *c = &CASES[i];
        size_t len = strlen(c->text);
        streamed_t s;
        for (size_t a = 0; a <= len; a++) {
            run_stream(c, (size_t[]){a}, 1, &s);
            expect_case(c, &s, "cut once");
            for (size_t b = a; b <= len; b++) {
                run_stream(c, (size_t[]){a, b}, 2, &s);
                expect_case(c, &s, "cut twice");
            }
        }
        size_t bytes[64];
        assert_true(len < FY_ARRAY_LEN(bytes));
        for (size_t k = 0; k < len; k++) bytes[k] = k + 1;
        run_stream(c, bytes, len, &s);
        expect_case(c, &s, "byte by byte");
    }
}

/* A tag cut across the stream is held back, not sent as text. */
static void test_held_back(void **state)
{
    (void)state;
    fy_reasoning_t r;
    size_t from, to, cf;
    fy_reasoning_init(&r, FY_REASONING_DEEPSEEK_R1);
    const char *t = "abc</thi";
    fy_reasoning_feed(&r, t, strlen(t), false);
    fy_reasoning_span(&r, &from, &to);
    assert_int_equal(from, 0);
    assert_int_equal(to, 3);
    assert_false(fy_reasoning_content_from(&r, &cf));
    t = "abc</think>de";
    fy_reasoning_feed(&r, t, strlen(t), false);
    fy_reasoning_span(&r, &from, &to);
    assert_int_equal(to, 3);
    assert_true(fy_reasoning_content_from(&r, &cf));
    assert_int_equal(cf, 11);
    /* qwen3: an answer's first bytes that may open <think> are nothing yet */
    fy_reasoning_init(&r, FY_REASONING_QWEN3);
    fy_reasoning_feed(&r, "\n<thi", 5, false);
    fy_reasoning_span(&r, &from, &to);
    assert_int_equal(to, from);
    assert_false(fy_reasoning_content_from(&r, &cf));
    assert_false(fy_reasoning_thought(&r));
    fy_reasoning_feed(&r, "\n<thx", 5, false);
    assert_true(fy_reasoning_content_from(&r, &cf));
    assert_int_equal(cf, 0);
}

static void test_prompt_opens(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        bool open;
    } cases[] = {
        {"<|im_start|>assistant\n<think>\n", true},
        {"<｜Assistant｜><think>\n", true},
        {"<|im_start|>assistant\n<think>\n\n</think>\n\n", false}, /* Qwen3 with enable_thinking false */
        {"<|im_start|>assistant\n", false},
        {"<think>a</think>b<think>", true},
        {"</think>", false},
        {"", false},
        {"<think", false},
    };
    for (size_t i = 0; i < FY_ARRAY_LEN(cases); i++)
        if (fy_reasoning_prompt_opens(cases[i].text, strlen(cases[i].text)) != cases[i].open)
            fail_msg("\"%s\": open %d", cases[i].text, !cases[i].open);
    assert_true(fy_reasoning_template_thinks("{{ '<think>\\n' }}"));
    assert_true(fy_reasoning_template_thinks("{% set c = c.split('</think>')[-1] %}"));
    assert_false(fy_reasoning_template_thinks("{{ messages }}"));
    assert_false(fy_reasoning_template_thinks(NULL));
    fy_reasoning_parser_t p;
    for (int k = FY_REASONING_NONE; k <= FY_REASONING_AUTO; k++) {
        assert_true(fy_reasoning_parser_of(fy_reasoning_parser_name((fy_reasoning_parser_t)k), &p));
        assert_int_equal(p, k);
    }
    assert_false(fy_reasoning_parser_of("deepseek", &p));
    assert_false(fy_reasoning_parser_of(NULL, &p));
}

/* ---- chat bodies through http_parse.c, with tiny models ----------------- */

/* Qwen3's switch (enable_thinking false closes an empty thinking block in
 * the prompt), and open_think, a variable of this test's, opening one as
 * DeepSeek-R1's template does. */
static const char THINK_TEMPLATE[] =
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% elif open_think is defined and open_think %}<think>\n{% endif %}{% endif %}";

static char g_think_path[512], g_chatml_path[512];

static void write_tiny(const char *name, const char *tmpl, char *path, size_t cap)
{
    snprintf(path, cap, "%s/%s", fy_test_tmpdir(), name);
    fy_tiny_cfg_t cfg;
    fy_tiny_cfg_default(&cfg);
    cfg.max_ctx = 2048;
    cfg.chat_template = tmpl;
    fy_tiny_model_t tm;
    fy_tiny_init(&tm, &cfg);
    assert_true(fy_tiny_write_gguf(&tm, path, GW_F32));
    fy_tiny_free(&tm);
}

static int setup_models(void **state)
{
    (void)state;
    write_tiny("tiny-think.gguf", THINK_TEMPLATE, g_think_path, sizeof(g_think_path));
    write_tiny("tiny-chatml.gguf", NULL, g_chatml_path, sizeof(g_chatml_path));
    return 0;
}

#define USER "\"messages\": [{\"role\": \"user\", \"content\": \"2+2?\"}]"

/* body parsed as a chat completion by model path under parser: FY_OK and
 * *g (with its prompt's text in text), or the fault. */
static fy_status_t parse_chat(const char *path, fy_reasoning_parser_t parser, const char *body, fy_http_gen_t *g,
                              fy_http_fault_t *fault, char *text, size_t cap)
{
    fy_model_t *m;
    assert_int_equal(fy_model_load(path, &m), FY_OK);
    fy_http_front_t f = {.model = m,
                         .model_id = "tiny",
                         .served = "tiny",
                         .max_ctx = 2048,
                         .default_max_tokens = 8,
                         .reasoning_parser = parser};
    fy_status_t st = fy_http_parse_generation(&f, body, strlen(body), true, g, fault);
    if (st == FY_OK) {
        fy_tokenizer_decode(fy_model_tokenizer(m), g->ids, (size_t)g->n_prompt, true, text, cap);
        fy_free(g->ids);
        fy_free(g->tool_names);
    }
    fy_model_destroy(m);
    return st;
}

static void test_parse_chat(void **state)
{
    (void)state;
    static const struct {
        const char *path_of; /* "think" or "chatml" */
        fy_reasoning_parser_t parser;
        const char *extra; /* the body's other fields */
        fy_reasoning_parser_t want;
        const char *prompt_end; /* the rendered prompt ends so */
        bool include;
    } cases[] = {
        /* auto: the template thinks; the answer opens its own <think> (qwen3) */
        {"think", FY_REASONING_AUTO, "", FY_REASONING_QWEN3, "<|im_start|>assistant\n", true},
        {"think", FY_REASONING_AUTO, ", \"chat_template_kwargs\": {\"enable_thinking\": true}", FY_REASONING_QWEN3,
         "<|im_start|>assistant\n", true},
        /* thinking off: the prompt closes an empty block; what comes is content */
        {"think", FY_REASONING_AUTO, ", \"chat_template_kwargs\": {\"enable_thinking\": false}", FY_REASONING_QWEN3,
         "<|im_start|>assistant\n<think>\n\n</think>\n\n", true},
        /* the prompt opens <think>: deepseek_r1's rule */
        {"think", FY_REASONING_AUTO, ", \"chat_template_kwargs\": {\"open_think\": true}", FY_REASONING_DEEPSEEK_R1,
         "<|im_start|>assistant\n<think>\n", true},
        /* ... unless a grammar writes the answer from its first token */
        {"think", FY_REASONING_AUTO,
         ", \"chat_template_kwargs\": {\"open_think\": true}, \"response_format\": {\"type\": \"json_object\"}",
         FY_REASONING_QWEN3, "<think>\n", true},
        {"think", FY_REASONING_AUTO, ", \"chat_template_kwargs\": {\"open_think\": true}, \"guided_regex\": \"a\"",
         FY_REASONING_QWEN3, "<think>\n", true},
        {"think", FY_REASONING_AUTO, ", \"include_reasoning\": false", FY_REASONING_QWEN3, "assistant\n", false},
        {"think", FY_REASONING_NONE, ", \"chat_template_kwargs\": {\"open_think\": true}", FY_REASONING_NONE,
         "<think>\n", true},
        /* a template that never thinks: none, unless forced */
        {"chatml", FY_REASONING_AUTO, "", FY_REASONING_NONE, "<|im_start|>assistant\n", true},
        {"chatml", FY_REASONING_DEEPSEEK_R1, "", FY_REASONING_DEEPSEEK_R1, "<|im_start|>assistant\n", true},
        {"chatml", FY_REASONING_QWEN3, ", \"chat_template_kwargs\": null", FY_REASONING_QWEN3, "assistant\n", true},
    };
    for (size_t i = 0; i < FY_ARRAY_LEN(cases); i++) {
        char body[1024], text[4096];
        snprintf(body, sizeof(body), "{" USER "%s}", cases[i].extra);
        fy_http_gen_t *g = fy_calloc(1, sizeof(*g));
        fy_http_fault_t fault;
        fy_status_t st = parse_chat(!strcmp(cases[i].path_of, "think") ? g_think_path : g_chatml_path, cases[i].parser,
                                    body, g, &fault, text, sizeof(text));
        if (st) fail_msg("case %zu: %s", i, fault.msg);
        size_t tl = strlen(text), el = strlen(cases[i].prompt_end);
        if (tl < el || strcmp(text + tl - el, cases[i].prompt_end))
            fail_msg("case %zu: the prompt ends \"%s\", not \"%s\"", i, text + (tl > 40 ? tl - 40 : 0),
                     cases[i].prompt_end);
        if (g->reasoning != cases[i].want)
            fail_msg("case %zu: parser %s, want %s", i, fy_reasoning_parser_name(g->reasoning),
                     fy_reasoning_parser_name(cases[i].want));
        assert_int_equal(g->include_reasoning, cases[i].include);
        fy_free(g);
    }
}

/* Bad chat_template_kwargs and include_reasoning: a 400 naming the field. */
static void test_parse_refused(void **state)
{
    (void)state;
    static const struct {
        const char *extra, *param, *says;
    } cases[] = {
        {"\"chat_template_kwargs\": \"enable_thinking=false\"", "chat_template_kwargs", "must be an object"},
        {"\"chat_template_kwargs\": [true]", "chat_template_kwargs", "must be an object"},
        {"\"chat_template_kwargs\": {\"messages\": []}", "chat_template_kwargs", "cannot set 'messages'"},
        {"\"chat_template_kwargs\": {\"add_generation_prompt\": false}", "chat_template_kwargs",
         "cannot set 'add_generation_prompt'"},
        {"\"chat_template_kwargs\": {\"bos_token\": \"x\"}", "chat_template_kwargs", "cannot set 'bos_token'"},
        {"\"chat_template_kwargs\": {\"note\": \"<|im_end|>\"}", "chat_template_kwargs", "special token"},
        {"\"chat_template_kwargs\": {\"a\": {\"b\": [\"<|im_start|>\"]}}", "chat_template_kwargs", "special token"},
        {"\"include_reasoning\": \"no\"", "include_reasoning", "true or false"},
    };
    for (size_t i = 0; i < FY_ARRAY_LEN(cases); i++) {
        char body[1024], text[64];
        snprintf(body, sizeof(body), "{" USER ", %s}", cases[i].extra);
        fy_http_gen_t *g = fy_calloc(1, sizeof(*g));
        fy_http_fault_t fault;
        fy_status_t st = parse_chat(g_think_path, FY_REASONING_AUTO, body, g, &fault, text, sizeof(text));
        if (st != FY_ERR_INVALID) fail_msg("case %zu accepted: %s", i, body);
        assert_int_equal(fault.status, 400);
        assert_string_equal(fault.param, cases[i].param);
        if (!strstr(fault.msg, cases[i].says)) fail_msg("case %zu: \"%s\"", i, fault.msg);
        fy_free(g);
    }
    /* /tokenize renders the messages as a chat completion does: the kwargs too */
    fy_model_t *m;
    assert_int_equal(fy_model_load(g_think_path, &m), FY_OK);
    fy_http_front_t f = {.model = m, .model_id = "tiny", .served = "tiny", .max_ctx = 2048, .default_max_tokens = 8};
    const char *body = "{" USER ", \"chat_template_kwargs\": {\"enable_thinking\": false}}";
    fy_http_tok_t t;
    fy_http_fault_t fault;
    assert_int_equal(fy_http_parse_tokenize(&f, body, strlen(body), &t, &fault), FY_OK);
    char text[4096];
    fy_tokenizer_decode(fy_model_tokenizer(m), t.ids, (size_t)t.n, true, text, sizeof(text));
    assert_non_null(strstr(text, "<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    fy_free(t.ids);
    body = "{" USER ", \"chat_template_kwargs\": {\"eos_token\": \"\"}}";
    assert_int_equal(fy_http_parse_tokenize(&f, body, strlen(body), &t, &fault), FY_ERR_INVALID);
    assert_string_equal(fault.param, "chat_template_kwargs");
    fy_model_destroy(m);
}

/* ---- served ------------------------------------------------------------------------------- */

static int g_port;

static json_t *post_json(const char *body)
{
    int fd = tc_http_dial(g_port, 60);
    assert_true(fd >= 0);
    tc_http_send(fd, "POST", "/v1/chat/completions", NULL, "application/json", body, strlen(body));
    tc_http_resp_t r;
    tc_http_read(fd, &r);
    close(fd);
    if (r.status != 200) fail_msg("%d %s", r.status, r.body ? r.body : "");
    json_t *j = json_loads(r.body, 0, NULL);
    if (!j) { /* a stream: its chunks' choices, in order, as one array */
        j = json_array();
        for (const char *d = strstr(r.body, "data: {"); d; d = strstr(d + 1, "data: {")) {
            json_t *c = json_loadb(d + 6, strcspn(d + 6, "\n"), 0, NULL);
            assert_non_null(c);
            json_t *ch = json_array_get(json_object_get(c, "choices"), 0);
            if (ch) json_array_append(j, ch);
            json_decref(c);
        }
        assert_non_null(strstr(r.body, "data: [DONE]"));
    }
    tc_http_free(&r);
    return j;
}

/* Text only of the letters a to z, between lo and hi of them. */
static bool letters(const char *s, size_t lo, size_t hi)
{
    if (!s || strlen(s) < lo || strlen(s) > hi) return false;
    for (; *s; s++)
        if (*s < 'a' || *s > 'z') return false;
    return true;
}

typedef struct joined {
    char reasoning[512], content[512], finish[32];
    int n_calls;
    bool tags; /* a delta held a tag's bracket */
} joined_t;

/* A stream's deltas of choice idx joined as a client joins them. */
static void join(json_t *chunks, int idx, joined_t *o)
{
    memset(o, 0, sizeof(*o));
    size_t i;
    json_t *ch;
    json_array_foreach(chunks, i, ch)
    {
        if (json_integer_value(json_object_get(ch, "index")) != idx) continue;
        json_t *d = json_object_get(ch, "delta");
        const char *r = json_string_value(json_object_get(d, "reasoning_content"));
        const char *r2 = json_string_value(json_object_get(d, "reasoning"));
        if (r || r2) assert_true(r && r2 && !strcmp(r, r2)); /* the two names, one text */
        const char *c = json_string_value(json_object_get(d, "content"));
        if (r) strncat(o->reasoning, r, sizeof(o->reasoning) - strlen(o->reasoning) - 1);
        if (c) strncat(o->content, c, sizeof(o->content) - strlen(o->content) - 1);
        if ((r && strpbrk(r, "<>")) || (c && strpbrk(c, "<>"))) o->tags = true;
        json_t *tc = json_object_get(d, "tool_calls");
        for (size_t k = 0; k < json_array_size(tc); k++)
            if (json_object_get(json_array_get(tc, k), "id")) o->n_calls++;
        const char *f = json_string_value(json_object_get(ch, "finish_reason"));
        if (f) snprintf(o->finish, sizeof(o->finish), "%s", f);
    }
}

/* body (without its closing brace) whole and streamed: the same split;
 * the whole answer's message returned (the caller's), *fin its finish. */
static json_t *ask_both(const char *body, char *fin, size_t cap)
{
    char b[2048];
    snprintf(b, sizeof(b), "%s}", body);
    json_t *j = post_json(b);
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0), *msg = json_incref(json_object_get(c0, "message"));
    snprintf(fin, cap, "%s", json_string_value(json_object_get(c0, "finish_reason")));
    json_decref(j);
    json_t *rc = json_object_get(msg, "reasoning_content");
    if (rc) assert_true(json_equal(rc, json_object_get(msg, "reasoning")));
    snprintf(b, sizeof(b), "%s, \"stream\": true}", body);
    json_t *chunks = post_json(b);
    joined_t s;
    join(chunks, 0, &s);
    json_decref(chunks);
    const char *wr = json_string_value(rc), *wc = json_string_value(json_object_get(msg, "content"));
    if (strcmp(s.reasoning, wr ? wr : "") || strcmp(s.content, wc ? wc : "") || strcmp(s.finish, fin))
        fail_msg("streamed reasoning \"%s\" content \"%s\" (%s); whole %s", s.reasoning, s.content, s.finish,
                 json_dumps(msg, 0));
    assert_int_equal(s.n_calls, (int)json_array_size(json_object_get(msg, "tool_calls")));
    return msg;
}

static void test_served(void **state)
{
    (void)state;
    if (!tc_bins_available()) skip();
    g_port = tc_free_port();
    char http[96], model[600];
    snprintf(http, sizeof(http), "router.http=http://127.0.0.1:%d", g_port);
    snprintf(model, sizeof(model), "model.path=%s", g_think_path);
    tc_opts_t o = {.n_prefill = 1, .n_decode = 1, .model = g_think_path, .common = {http, model}};
    tc_cluster_t c;
    tc_start(&c, &o);
    char fin[32];

    /* qwen3's rule: the answer opens <think> (the grammar makes it; each tag
     * comes a byte a token), the reasoning inside, the content after */
    static const char FORCED[] = "{" USER ", \"guided_regex\": \"<think>[a-z]{2,5}</think>[a-z]{3}\", "
                                 "\"max_tokens\": 40, \"temperature\": 0";
    json_t *msg = ask_both(FORCED, fin, sizeof(fin));
    const char *rc = json_string_value(json_object_get(msg, "reasoning_content"));
    if (!letters(rc, 2, 5) || !letters(json_string_value(json_object_get(msg, "content")), 3, 3))
        fail_msg("not split: %s", json_dumps(msg, 0));
    assert_string_equal(fin, "stop");
    json_decref(msg);
    /* include_reasoning false: the content alone */
    char b[1024];
    snprintf(b, sizeof(b), "%s, \"include_reasoning\": false", FORCED);
    msg = ask_both(b, fin, sizeof(fin));
    assert_null(json_object_get(msg, "reasoning_content"));
    assert_null(json_object_get(msg, "reasoning"));
    assert_true(letters(json_string_value(json_object_get(msg, "content")), 3, 3));
    json_decref(msg);
    /* two samples, streamed: each its own split */
    json_t *chunks =
        post_json("{" USER ", \"guided_regex\": \"<think>[a-z]{2,5}</think>[a-z]{3}\", \"max_tokens\": 40, "
                  "\"n\": 2, \"temperature\": 1, \"seed\": 3, \"stream\": true}");
    for (int i = 0; i < 2; i++) {
        joined_t s;
        join(chunks, i, &s);
        if (!letters(s.reasoning, 2, 5) || !letters(s.content, 3, 3) || s.tags)
            fail_msg("choice %d: reasoning \"%s\" content \"%s\"", i, s.reasoning, s.content);
    }
    json_decref(chunks);

    /* thinking switched off: the prompt closes the block, all is content */
    msg = ask_both("{" USER ", \"chat_template_kwargs\": {\"enable_thinking\": false}, \"guided_regex\": "
                   "\"[a-z]{3}\", \"max_tokens\": 10, \"temperature\": 0",
                   fin, sizeof(fin));
    assert_true(json_is_null(json_object_get(msg, "reasoning_content")));
    assert_true(letters(json_string_value(json_object_get(msg, "content")), 3, 3));
    json_decref(msg);

    /* deepseek_r1's rule: the prompt opened <think>, and an answer cut
     * short before </think> is reasoning alone, its content null */
    msg = ask_both("{" USER ", \"chat_template_kwargs\": {\"open_think\": true}, \"max_tokens\": 6, "
                   "\"ignore_eos\": true, \"temperature\": 0",
                   fin, sizeof(fin));
    assert_true(json_is_string(json_object_get(msg, "reasoning_content")));
    assert_true(json_is_null(json_object_get(msg, "content")));
    assert_string_equal(fin, "length");
    json_decref(msg);

    /* tool calls after the thinking (tool_choice auto): the calls are read
     * from the content */
    msg =
        ask_both("{" USER ", \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"now\", \"parameters\": "
                 "{\"type\": \"object\", \"properties\": {}}}}], \"guided_regex\": \"<think>[a-z]{2}</think><tool_call>"
                 "\\\\{\\\"name\\\": \\\"now\\\", \\\"arguments\\\": \\\\{\\\\}\\\\}</tool_call>\", "
                 "\"max_tokens\": 120, \"temperature\": 0",
                 fin, sizeof(fin));
    if (!letters(json_string_value(json_object_get(msg, "reasoning_content")), 2, 2) ||
        json_array_size(json_object_get(msg, "tool_calls")) != 1)
        fail_msg("no call after the thinking: %s", json_dumps(msg, 0));
    assert_string_equal(
        json_string_value(json_object_get(
            json_object_get(json_array_get(json_object_get(msg, "tool_calls"), 0), "function"), "name")),
        "now");
    assert_true(json_is_null(json_object_get(msg, "content")));
    assert_string_equal(fin, "tool_calls");
    json_decref(msg);

    /* the openai package reads reasoning_content, whole and streamed */
    const char *venv = getenv("FERRY_OPENAI_VENV") ? getenv("FERRY_OPENAI_VENV") : "build/openai-venv";
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "%s/bin/python -c 'import openai' 2>/dev/null", venv);
    if (system(cmd) == 0) {
        snprintf(cmd, sizeof(cmd), "%s/bin/python tests/openai_check.py http://127.0.0.1:%d/v1 none reasoning", venv,
                 g_port);
        assert_int_equal(system(cmd), 0);
    } else {
        print_message("no openai package in %s: its reasoning check skipped\n", venv);
    }
    tc_stop(&c);
}

int main(void)
{
    if (sodium_init() < 0) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_whole),        cmocka_unit_test(test_every_cut),  cmocka_unit_test(test_held_back),
        cmocka_unit_test(test_prompt_opens), cmocka_unit_test(test_parse_chat), cmocka_unit_test(test_parse_refused),
        cmocka_unit_test(test_served),
    };
    return cmocka_run_group_tests(tests, setup_models, NULL);
}

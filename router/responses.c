/*
 * responses.c - POST /v1/responses as a chat completion (responses.h).
 *
 * The body is checked field by field and translated into a chat
 * completion's body, which fy_http_parse_generation then parses as it
 * parses any chat completion: the same template, limits, grammars and
 * tool handling, no second engine path.  What the chat parser refuses
 * names a chat field ('messages', 'max_completion_tokens',
 * 'response_format'); the fault is renamed to the Responses field the
 * client wrote.
 *
 * The answer: a response object whose output is a message item (its
 * text as one output_text part) and one function_call item per call
 * (call_id: the chat call's id, arguments: its JSON text).  A stream
 * sends OpenAI's events, each with its sequence_number: response.created
 * and response.in_progress, then per item output_item.added,
 * (content_part.added, output_text.delta..., output_text.done,
 * content_part.done | function_call_arguments.delta..., .done),
 * output_item.done, and at the end response.completed (incomplete:
 * response.incomplete; a failed generation: response.failed) with the
 * whole response and its usage.  Content that is only white space is
 * held back until something else follows, so that a stream whose answer
 * is all calls opens no message item, as the whole answer has none.
 */
#include "router/responses.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sodium.h>

#include "common/log.h"
#include "common/mem.h"

typedef struct buf {
    char *s;
    size_t n, cap;
} buf_t;

struct fy_responses {
    char id[32];
    time_t created;
    json_t *echo; /* the request's fields the response object repeats */
    /* a stream */
    bool started, msg_done, oom; /* oom: said once in the log */
    json_int_t seq;
    json_t *output; /* the items done, in order */
    int n_out;      /* output indices given */
    int msg_index;  /* the message item open; -1: none */
    char msg_id[32];
    buf_t text;     /* its text so far */
    size_t held;    /* the first held bytes of text are white space not yet sent */
    int call_index; /* the function_call item open; -1: none */
    char call_id_item[32];
    json_t *call; /* its call_id and name */
    buf_t args;   /* its arguments so far */
};

/* Out of memory while streaming: the client's events miss a piece,
 * which the log says once. */
static void stream_oom(fy_responses_t *rs)
{
    if (!rs->oom) fy_error("http %s: out of memory writing the Responses stream; its client misses events", rs->id);
    rs->oom = true;
}

static bool buf_add(buf_t *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->n + n + 1) * 2;
        char *t = fy_realloc(b->s, cap);
        if (!t) return false;
        b->s = t;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
    return true;
}

/* Valid UTF-8 for JSON: bytes that are not become U+FFFD (the model's
 * text may end inside a character). */
static json_t *text_json(const char *s, size_t n)
{
    json_t *j = json_stringn(s, n);
    if (j) return j;
    buf_t o = {0};
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        json_t *one = len && i + len <= n ? json_stringn(s + i, len) : NULL;
        bool ok = one != NULL;
        json_decref(one);
        if (!buf_add(&o, ok ? s + i : "\xef\xbf\xbd", ok ? len : 3)) break;
        i += ok ? len : 1;
    }
    j = json_stringn(o.s ? o.s : "", o.n);
    fy_free(o.s);
    return j ? j : json_string("");
}

static bool blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\n' && s[i] != '\r' && s[i] != '\t') return false;
    return true;
}

static void rand_id(const char *prefix, char *out, size_t cap)
{
    uint8_t rnd[12];
    randombytes_buf(rnd, sizeof(rnd));
    int k = snprintf(out, cap, "%s", prefix);
    for (size_t i = 0; i < sizeof(rnd) && k > 0 && (size_t)k < cap; i++)
        k += snprintf(out + k, cap - (size_t)k, "%02x", rnd[i]);
}

/* ---- the request ------------------------------------------------------------------------------------ */

static void bad(fy_http_fault_t *f, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void bad(fy_http_fault_t *f, const char *param, const char *fmt, ...)
{
    if (f->status) return; /* the first fault is the one named */
    f->status = 400;
    f->type = "invalid_request_error";
    f->param = param;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->msg, sizeof(f->msg), fmt, ap);
    va_end(ap);
}

/* Set, and not null or false: a field ferry would have to act on. */
static bool given(json_t *v) { return v && !json_is_null(v) && !json_is_false(v); }

/* The fields whose features need state ferry does not keep, or that it
 * does not implement: a 400 naming the field, rather than an answer that
 * silently differs from what was asked. */
static void refused_fields(fy_http_fault_t *f, json_t *o)
{
    static const struct {
        const char *name, *why;
    } no[] = {
        {"previous_response_id", "ferry keeps no responses: send the whole conversation in 'input'"},
        {"conversation", "ferry keeps no conversations: send the whole conversation in 'input'"},
        {"background", "background responses are not supported (ferry keeps no responses to poll)"},
        {"prompt", "prompt templates are not supported: send 'instructions' and 'input'"},
        {"max_tool_calls", "'max_tool_calls' is not supported"},
        {"reasoning", "'reasoning' is not supported"},
    };
    for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++)
        if (given(json_object_get(o, no[i].name))) {
            bad(f, no[i].name, "'%s' is not supported: %s", no[i].name, no[i].why);
            return;
        }
    json_t *inc = json_object_get(o, "include");
    if (inc && !json_is_null(inc) && (!json_is_array(inc) || json_array_size(inc)))
        bad(f, "include", "'include' is not supported (ferry adds no extra output data); give none or []");
    json_t *tl = json_object_get(o, "top_logprobs");
    if (tl && !json_is_null(tl) && !(json_is_integer(tl) && json_integer_value(tl) == 0))
        bad(f, "top_logprobs", "'top_logprobs' is not supported on /v1/responses; chat completions have logprobs");
    json_t *tr = json_object_get(o, "truncation");
    if (tr && !json_is_null(tr) && !(json_is_string(tr) && !strcmp(json_string_value(tr), "disabled")))
        bad(f, "truncation", "'truncation' must be \"disabled\" (an input too long for the context is refused)");
    json_t *st = json_object_get(o, "store");
    if (st && !json_is_null(st) && !json_is_boolean(st)) bad(f, "store", "'store' must be true or false");
    json_t *so = json_object_get(o, "stream_options");
    if (so && !json_is_null(so) && !json_is_object(so)) bad(f, "stream_options", "'stream_options' must be an object");
    json_t *md = json_object_get(o, "metadata");
    if (md && !json_is_null(md) && !json_is_object(md)) bad(f, "metadata", "'metadata' must be an object");
}

/* An input message's content: a string, or input_text (output_text for
 * an assistant's earlier answer) parts, as chat's text parts. */
static json_t *content_of(fy_http_fault_t *f, size_t i, json_t *c)
{
    if (json_is_string(c)) return json_incref(c);
    if (!json_is_array(c)) {
        bad(f, "input", "input[%zu].content must be a string or an array of input_text parts", i);
        return NULL;
    }
    json_t *parts = json_array();
    size_t k;
    json_t *p;
    json_array_foreach(c, k, p)
    {
        json_t *type = json_object_get(p, "type"), *text = json_object_get(p, "text");
        const char *t = json_is_string(type) ? json_string_value(type) : "";
        if (strcmp(t, "input_text") && strcmp(t, "output_text") && strcmp(t, "text")) {
            bad(f, "input", "input[%zu].content[%zu]: part type '%.40s' is not supported (text parts only)", i, k, t);
            break;
        }
        if (!json_is_string(text)) {
            bad(f, "input", "input[%zu].content[%zu] needs a 'text' string", i, k);
            break;
        }
        json_array_append_new(parts, json_pack("{s:s, s:O}", "type", "text", "text", text));
    }
    if (!f->status) return parts;
    json_decref(parts);
    return NULL;
}

/* A string field of item i, or a fault naming it. */
static json_t *item_string(fy_http_fault_t *f, json_t *item, size_t i, const char *name)
{
    json_t *v = json_object_get(item, name);
    if (json_is_string(v) && json_string_length(v)) return v;
    bad(f, "input", "input[%zu] needs '%s' (a non-empty string)", i, name);
    return NULL;
}

/* Appends chat message m (taken) made of input item i (-1: the
 * instructions), which origin records for the faults' names. */
static void add_message(json_t *msgs, json_t *origin, json_t *m, json_int_t i)
{
    json_array_append_new(msgs, m);
    json_array_append_new(origin, json_integer(i));
}

/* 'input' (and 'instructions' first) as chat messages: a string is the
 * user's message; a list holds messages, an assistant's function_call
 * items (those in a row, and a message of the assistant's before them,
 * one assistant turn) and function_call_output items (tool results).
 * origin: each message's input item. */
static void input_messages(fy_http_fault_t *f, json_t *o, json_t *msgs, json_t *origin)
{
    json_t *ins = json_object_get(o, "instructions"), *in = json_object_get(o, "input");
    if (ins && !json_is_null(ins)) {
        if (!json_is_string(ins))
            bad(f, "instructions", "'instructions' must be a string");
        else
            add_message(msgs, origin, json_pack("{s:s, s:O}", "role", "system", "content", ins), -1);
    }
    if (json_is_string(in)) {
        add_message(msgs, origin, json_pack("{s:s, s:O}", "role", "user", "content", in), 0);
        return;
    }
    if (!json_is_array(in) || !json_array_size(in)) {
        bad(f, "input", "'input' must be a string or a non-empty array of input items");
        return;
    }
    size_t i;
    json_t *item;
    json_array_foreach(in, i, item)
    {
        if (f->status) return;
        if (!json_is_object(item)) {
            bad(f, "input", "input[%zu] must be an object", i);
            return;
        }
        json_t *type = json_object_get(item, "type");
        const char *t = json_is_string(type) ? json_string_value(type) : type ? "" : "message";
        json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
        if (!strcmp(t, "message")) {
            json_t *role = json_object_get(item, "role");
            const char *r = json_is_string(role) ? json_string_value(role) : "";
            if (strcmp(r, "user") && strcmp(r, "system") && strcmp(r, "developer") && strcmp(r, "assistant")) {
                bad(f, "input", "input[%zu] needs a 'role' of user, system, developer or assistant", i);
                return;
            }
            json_t *c = content_of(f, i, json_object_get(item, "content"));
            if (c) add_message(msgs, origin, json_pack("{s:s, s:o}", "role", r, "content", c), (json_int_t)i);
        } else if (!strcmp(t, "function_call")) {
            json_t *id = item_string(f, item, i, "call_id"), *name = item_string(f, item, i, "name");
            json_t *args = item_string(f, item, i, "arguments");
            if (!id || !name || !args) return;
            json_t *call = json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", id, "type", "function", "function", "name", name,
                                     "arguments", args);
            json_t *role = json_object_get(last, "role");
            if (json_is_string(role) && !strcmp(json_string_value(role), "assistant")) {
                json_t *calls = json_object_get(last, "tool_calls");
                if (!calls) json_object_set_new(last, "tool_calls", calls = json_array());
                json_array_append_new(calls, call);
            } else {
                add_message(msgs, origin,
                            json_pack("{s:s, s:n, s:[o]}", "role", "assistant", "content", "tool_calls", call),
                            (json_int_t)i);
            }
        } else if (!strcmp(t, "function_call_output")) {
            json_t *id = item_string(f, item, i, "call_id"), *out = json_object_get(item, "output");
            if (!id) return;
            json_t *c = json_is_string(out) ? json_incref(out) : NULL;
            if (!c && json_is_array(out)) c = content_of(f, i, out);
            if (!c) {
                bad(f, "input", "input[%zu].output must be a string or an array of input_text parts", i);
                return;
            }
            add_message(msgs, origin, json_pack("{s:s, s:O, s:o}", "role", "tool", "tool_call_id", id, "content", c),
                        (json_int_t)i);
        } else {
            bad(f, "input",
                "input[%zu]: item type '%.40s' is not supported (message, function_call and "
                "function_call_output are)",
                i, t);
            return;
        }
    }
}

/* Responses' function tools ({"type": "function", "name", "description",
 * "parameters", "strict"}) as chat's; a built-in tool is refused by its
 * type. */
static json_t *chat_tools(fy_http_fault_t *f, json_t *tools)
{
    if (!json_is_array(tools)) {
        bad(f, "tools", "'tools' must be an array of {\"type\": \"function\", \"name\", ...}");
        return NULL;
    }
    json_t *out = json_array();
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t)
    {
        json_t *type = json_object_get(t, "type");
        const char *ty = json_is_string(type) ? json_string_value(type) : "";
        if (!json_is_object(t) || strcmp(ty, "function")) {
            bad(f, "tools",
                "tools[%zu]: tool type '%.40s' is not supported (ferry runs no built-in tools; "
                "function tools only)",
                i, ty);
            break;
        }
        json_t *fn = json_object();
        static const char *const keys[] = {"name", "description", "parameters", "strict"};
        for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
            json_t *v = json_object_get(t, keys[k]);
            if (v) json_object_set(fn, keys[k], v);
        }
        json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", fn));
    }
    if (!f->status) return out;
    json_decref(out);
    return NULL;
}

/* tool_choice: "none", "auto", "required", or {"type": "function",
 * "name"} as chat's {"type": "function", "function": {"name"}}. */
static json_t *chat_tool_choice(fy_http_fault_t *f, json_t *tc)
{
    if (json_is_string(tc)) return json_incref(tc);
    json_t *type = json_object_get(tc, "type"), *name = json_object_get(tc, "name");
    const char *ty = json_is_string(type) ? json_string_value(type) : "";
    if (json_is_object(tc) && !strcmp(ty, "function") && json_is_string(name))
        return json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name);
    bad(f, "tool_choice",
        "'tool_choice' is \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"name\": ...}%s%.40s%s",
        *ty ? " (not a built-in tool's type: '" : "", ty, *ty ? "')" : "");
    return NULL;
}

/* text.format as chat's response_format. */
static json_t *chat_format(fy_http_fault_t *f, json_t *text)
{
    if (!json_is_object(text)) {
        bad(f, "text", "'text' must be an object with a 'format'");
        return NULL;
    }
    json_t *verb = json_object_get(text, "verbosity");
    if (verb && !json_is_null(verb)) {
        bad(f, "text.verbosity", "'text.verbosity' is not supported");
        return NULL;
    }
    json_t *fmt = json_object_get(text, "format");
    if (!fmt || json_is_null(fmt)) return NULL;
    json_t *type = json_object_get(fmt, "type");
    const char *ty = json_is_string(type) ? json_string_value(type) : "";
    if (!strcmp(ty, "text") || !strcmp(ty, "json_object")) return json_pack("{s:s}", "type", ty);
    if (!strcmp(ty, "json_schema")) {
        json_t *js = json_object();
        static const char *const keys[] = {"name", "schema", "strict", "description"};
        for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
            json_t *v = json_object_get(fmt, keys[k]);
            if (v) json_object_set(js, keys[k], v);
        }
        return json_pack("{s:s, s:o}", "type", "json_schema", "json_schema", js);
    }
    bad(f, "text.format", "'text.format' type '%.40s' is not text, json_object or json_schema", ty);
    return NULL;
}

/* The chat completion's body of Responses body o (NULL: *f says why);
 * origin: each chat message's input item (add_message). */
static json_t *chat_body(fy_http_fault_t *f, json_t *o, json_t *origin)
{
    refused_fields(f, o);
    if (f->status) return NULL;
    json_t *c = json_object(), *msgs = json_array();
    json_object_set_new(c, "messages", msgs);
    input_messages(f, o, msgs, origin);
    /* the same meaning under chat's names */
    static const struct {
        const char *from, *to;
    } same[] = {{"model", "model"},
                {"stream", "stream"},
                {"temperature", "temperature"},
                {"top_p", "top_p"},
                {"seed", "seed"},
                {"max_output_tokens", "max_completion_tokens"},
                {"parallel_tool_calls", "parallel_tool_calls"}};
    for (size_t i = 0; i < sizeof(same) / sizeof(same[0]); i++) {
        json_t *v = json_object_get(o, same[i].from);
        if (v) json_object_set(c, same[i].to, v);
    }
    json_t *v;
    if (!f->status && (v = json_object_get(o, "tools")) && !json_is_null(v)) {
        json_t *t = chat_tools(f, v);
        if (t) json_object_set_new(c, "tools", t);
    }
    if (!f->status && (v = json_object_get(o, "tool_choice")) && !json_is_null(v)) {
        json_t *t = chat_tool_choice(f, v);
        if (t) json_object_set_new(c, "tool_choice", t);
    }
    if (!f->status && (v = json_object_get(o, "text")) && !json_is_null(v)) {
        json_t *t = chat_format(f, v);
        if (t) json_object_set_new(c, "response_format", t);
    }
    if (!f->status) return c;
    json_decref(c);
    return NULL;
}

/* A fault of the chat parser, renamed to the field the client wrote. */
static void rename_fault(fy_http_fault_t *f, json_t *origin)
{
    /* chat's "message N" is the input item it came from, or the instructions */
    char *at = f->param && !strcmp(f->param, "messages") ? strstr(f->msg, "message ") : NULL;
    char *end;
    unsigned long k = at ? strtoul(at + 8, &end, 10) : 0;
    if (at && end > at + 8 && k < json_array_size(origin)) {
        json_int_t item = json_integer_value(json_array_get(origin, k));
        char rest[sizeof(f->msg)], name[40];
        snprintf(rest, sizeof(rest), "%s", end);
        if (item < 0)
            snprintf(name, sizeof(name), "'instructions'");
        else
            snprintf(name, sizeof(name), "input[%lld]", (long long)item);
        snprintf(at, sizeof(f->msg) - (size_t)(at - f->msg), "%s%s", name, rest);
    }
    static const struct {
        const char *chat, *resp;
    } names[] = {{"messages", "input"},
                 {"max_completion_tokens", "max_output_tokens"},
                 {"max_tokens", "max_output_tokens"},
                 {"response_format", "text.format"}};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (f->param && !strcmp(f->param, names[i].chat)) f->param = names[i].resp;
        /* and its name quoted in the message ('response_format.json_schema.name' too) */
        char q[40];
        int ql = snprintf(q, sizeof(q), "'%s", names[i].chat);
        while ((at = strstr(f->msg, q)) && (at[ql] == '\'' || at[ql] == '.')) {
            char rest[sizeof(f->msg)];
            snprintf(rest, sizeof(rest), "%s", at + ql);
            snprintf(at, sizeof(f->msg) - (size_t)(at - f->msg), "'%s%s", names[i].resp, rest);
        }
    }
    /* a tool's fields are the tool's own here, not its 'function' object's */
    while (f->param && !strcmp(f->param, "tools") && (at = strstr(f->msg, "].function."))) {
        memmove(at + 2, at + 11, strlen(at + 11) + 1);
    }
}

/* What the response object repeats of the request (OpenAI's fields,
 * with the values the generation runs with). */
static json_t *echo_of(json_t *o, const fy_http_gen_t *g)
{
    json_t *e = json_object();
    json_t *ins = json_object_get(o, "instructions"), *mot = json_object_get(o, "max_output_tokens");
    json_t *md = json_object_get(o, "metadata"), *tools = json_object_get(o, "tools");
    json_t *tc = json_object_get(o, "tool_choice"), *text = json_object_get(o, "text");
    json_t *ptc = json_object_get(o, "parallel_tool_calls");
    json_object_set_new(e, "instructions", json_is_string(ins) ? json_incref(ins) : json_null());
    json_object_set_new(e, "max_output_tokens", json_is_integer(mot) ? json_incref(mot) : json_null());
    json_object_set_new(e, "metadata", json_is_object(md) ? json_deep_copy(md) : json_object());
    json_object_set_new(e, "parallel_tool_calls", json_boolean(!json_is_false(ptc)));
    json_object_set_new(e, "temperature", json_real(g->gen.sampling.temperature));
    json_object_set_new(e, "top_p", json_real(g->gen.sampling.top_p));
    json_object_set_new(e, "tools", json_is_array(tools) ? json_deep_copy(tools) : json_array());
    json_object_set_new(e, "tool_choice", tc && !json_is_null(tc) ? json_deep_copy(tc) : json_string("auto"));
    json_t *fmt = json_object_get(text, "format");
    json_object_set_new(
        e, "text",
        json_pack("{s:o}", "format", json_is_object(fmt) ? json_deep_copy(fmt) : json_pack("{s:s}", "type", "text")));
    return e;
}

fy_status_t fy_responses_parse(const fy_http_front_t *f, const char *body, size_t len, fy_http_gen_t *g,
                               fy_responses_t **rs_p, fy_http_fault_t *fault)
{
    *rs_p = NULL;
    memset(g, 0, sizeof(*g));
    memset(fault, 0, sizeof(*fault));
    json_error_t je;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!o || !json_is_object(o)) {
        if (o)
            bad(fault, NULL, "the body must be a JSON object");
        else
            bad(fault, NULL, "malformed JSON at line %d column %d: %s", je.line, je.column, je.text);
        json_decref(o);
        return FY_ERR_INVALID;
    }
    json_t *origin = json_array(), *c = chat_body(fault, o, origin);
    if (!c) {
        json_decref(origin);
        json_decref(o);
        return FY_ERR_INVALID;
    }
    char *cb = json_dumps(c, JSON_COMPACT);
    json_decref(c);
    fy_responses_t *rs = fy_calloc(1, sizeof(*rs));
    if (!cb || !rs) {
        free(cb);
        fy_free(rs);
        json_decref(origin);
        json_decref(o);
        return FY_ERR_NOMEM;
    }
    fy_status_t st = fy_http_parse_generation(f, cb, strlen(cb), true, g, fault);
    free(cb);
    if (st == FY_ERR_INVALID) rename_fault(fault, origin);
    json_decref(origin);
    if (st != FY_OK) {
        fy_free(rs);
        json_decref(o);
        return st;
    }
    rs->echo = echo_of(o, g);
    json_decref(o);
    if (rs->echo) json_object_set_new(rs->echo, "model", json_string(f->served ? f->served : ""));
    rs->output = json_array();
    rs->msg_index = rs->call_index = -1;
    rand_id("resp_", rs->id, sizeof(rs->id));
    if (!rs->echo || !rs->output) {
        fy_responses_free(rs);
        fy_free(g->ids);
        fy_free(g->tool_names);
        memset(g, 0, sizeof(*g));
        return FY_ERR_NOMEM;
    }
    *rs_p = rs;
    return FY_OK;
}

void fy_responses_free(fy_responses_t *rs)
{
    if (!rs) return;
    json_decref(rs->echo);
    json_decref(rs->output);
    json_decref(rs->call);
    fy_free(rs->text.s);
    fy_free(rs->args.s);
    fy_free(rs);
}

const char *fy_responses_id(const fy_responses_t *rs) { return rs->id; }

/* ---- the answer --------------------------------------------------------------------------------------- */

/* The response object with status and no output yet. */
static json_t *response_object(fy_responses_t *rs, const char *status)
{
    if (!rs->created) rs->created = time(NULL);
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(rs->id));
    json_object_set_new(o, "object", json_string("response"));
    json_object_set_new(o, "created_at", json_integer((json_int_t)rs->created));
    json_object_set_new(o, "status", json_string(status));
    json_object_set_new(o, "background", json_false());
    json_object_set_new(o, "error", json_null());
    json_object_set_new(o, "incomplete_details", json_null());
    json_object_set_new(o, "max_tool_calls", json_null());
    json_object_set_new(o, "model", json_string(""));
    json_object_set_new(o, "output", json_array());
    json_object_set_new(o, "previous_response_id", json_null());
    json_object_set_new(o, "reasoning", json_null());
    json_object_set_new(o, "service_tier", json_string("default"));
    json_object_set_new(o, "store", json_false()); /* ferry keeps no responses */
    json_object_set_new(o, "truncation", json_string("disabled"));
    json_object_set_new(o, "usage", json_null());
    json_object_set_new(o, "user", json_null());
    json_object_update(o, rs->echo);
    return o;
}

/* Chat's usage as the Responses API counts it. */
static json_t *usage_of(json_t *u)
{
    json_int_t in = json_integer_value(json_object_get(u, "prompt_tokens"));
    json_int_t out = json_integer_value(json_object_get(u, "completion_tokens"));
    json_int_t cached =
        json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens"));
    return json_pack("{s:I, s:{s:I}, s:I, s:{s:i}, s:I}", "input_tokens", in, "input_tokens_details", "cached_tokens",
                     cached, "output_tokens", out, "output_tokens_details", "reasoning_tokens", 0, "total_tokens",
                     in + out);
}

static json_t *message_item(const char *id, const char *status, const char *text, size_t len)
{
    json_t *content = json_array();
    if (text)
        json_array_append_new(content, json_pack("{s:s, s:o, s:[], s:[]}", "type", "output_text", "text",
                                                 text_json(text, len), "annotations", "logprobs"));
    return json_pack("{s:s, s:s, s:s, s:s, s:o}", "id", id, "type", "message", "status", status, "role", "assistant",
                     "content", content);
}

static json_t *call_item(const char *id, json_t *call_id, json_t *name, json_t *args, const char *status)
{
    return json_pack("{s:s, s:s, s:O, s:O, s:O, s:s}", "id", id, "type", "function_call", "call_id", call_id, "name",
                     name, "arguments", args, "status", status);
}

json_t *fy_responses_whole(fy_responses_t *rs, const char *content, size_t len, json_t *calls, const char *finish,
                           json_t *usage)
{
    bool incomplete = !strcmp(finish, "length");
    const char *status = incomplete ? "incomplete" : "completed";
    json_t *o = response_object(rs, status), *out = json_object_get(o, "output");
    size_t nc = json_array_size(calls);
    if (!nc || !blank(content, len)) { /* (white space before calls is no message) */
        char id[32];
        rand_id("msg_", id, sizeof(id));
        json_array_append_new(out, message_item(id, status, content, len));
    }
    for (size_t i = 0; i < nc; i++) {
        json_t *c = json_array_get(calls, i), *fn = json_object_get(c, "function");
        char id[32];
        rand_id("fc_", id, sizeof(id));
        json_array_append_new(out, call_item(id, json_object_get(c, "id"), json_object_get(fn, "name"),
                                             json_object_get(fn, "arguments"), status));
    }
    if (incomplete) json_object_set_new(o, "incomplete_details", json_pack("{s:s}", "reason", "max_output_tokens"));
    json_object_set_new(o, "usage", usage_of(usage));
    return o;
}

/* ---- the stream ---------------------------------------------------------------------------------------- */

/* A new event of type, numbered. */
static json_t *event(fy_responses_t *rs, const char *type)
{
    return json_pack("{s:s, s:I}", "type", type, "sequence_number", rs->seq++);
}

/* Sends ev (taken) as "event: TYPE" and its data. */
static void emit(fy_responses_t *rs, json_t *ev, fy_responses_write_fn write, void *arg)
{
    char *t = ev ? json_dumps(ev, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    const char *type = json_string_value(json_object_get(ev, "type"));
    char head[96];
    int hl = snprintf(head, sizeof(head), "event: %s\ndata: ", type ? type : "error");
    if (!t || !write(arg, head, (size_t)hl) || !write(arg, t, strlen(t)) || !write(arg, "\n\n", 2)) stream_oom(rs);
    free(t);
    json_decref(ev);
}

static void start(fy_responses_t *rs, fy_responses_write_fn write, void *arg)
{
    if (rs->started) return;
    rs->started = true;
    static const char *const types[] = {"response.created", "response.in_progress"};
    for (int i = 0; i < 2; i++) {
        json_t *ev = event(rs, types[i]);
        json_object_set_new(ev, "response", response_object(rs, "in_progress"));
        emit(rs, ev, write, arg);
    }
}

/* An event of the open message item's (content part 0). */
static json_t *msg_event(fy_responses_t *rs, const char *type, bool part)
{
    json_t *ev = event(rs, type);
    json_object_set_new(ev, "item_id", json_string(rs->msg_id));
    json_object_set_new(ev, "output_index", json_integer(rs->msg_index));
    if (part) json_object_set_new(ev, "content_index", json_integer(0));
    return ev;
}

static void open_message(fy_responses_t *rs, fy_responses_write_fn write, void *arg)
{
    if (rs->msg_index >= 0) return;
    rs->msg_index = rs->n_out++;
    rand_id("msg_", rs->msg_id, sizeof(rs->msg_id));
    json_t *ev = event(rs, "response.output_item.added");
    json_object_set_new(ev, "output_index", json_integer(rs->msg_index));
    json_object_set_new(ev, "item", message_item(rs->msg_id, "in_progress", NULL, 0));
    emit(rs, ev, write, arg);
    ev = msg_event(rs, "response.content_part.added", true);
    json_object_set_new(ev, "part", json_pack("{s:s, s:s, s:[]}", "type", "output_text", "text", "", "annotations"));
    emit(rs, ev, write, arg);
}

/* The text from byte `from` on goes out as one delta. */
static void send_text(fy_responses_t *rs, size_t from, fy_responses_write_fn write, void *arg)
{
    if (from >= rs->text.n) return;
    json_t *ev = msg_event(rs, "response.output_text.delta", true);
    json_object_set_new(ev, "delta", text_json(rs->text.s + from, rs->text.n - from));
    json_object_set_new(ev, "logprobs", json_array());
    emit(rs, ev, write, arg);
}

/* response.output_item.done for item at index, which joins the output */
static void item_done(fy_responses_t *rs, int index, json_t *item, fy_responses_write_fn write, void *arg)
{
    json_t *ev = event(rs, "response.output_item.done");
    json_object_set_new(ev, "output_index", json_integer(index));
    json_object_set(ev, "item", item);
    emit(rs, ev, write, arg);
    json_array_append_new(rs->output, item);
}
static void close_message(fy_responses_t *rs, const char *status, fy_responses_write_fn write, void *arg)
{
    if (rs->msg_index < 0) return;
    const char *text = rs->text.s ? rs->text.s : "";
    json_t *ev = msg_event(rs, "response.output_text.done", true);
    json_object_set_new(ev, "text", text_json(text, rs->text.n));
    json_object_set_new(ev, "logprobs", json_array());
    emit(rs, ev, write, arg);
    ev = msg_event(rs, "response.content_part.done", true);
    json_object_set_new(
        ev, "part",
        json_pack("{s:s, s:o, s:[]}", "type", "output_text", "text", text_json(text, rs->text.n), "annotations"));
    emit(rs, ev, write, arg);
    item_done(rs, rs->msg_index, message_item(rs->msg_id, status, text, rs->text.n), write, arg);
    rs->msg_index = -1;
    rs->msg_done = true;
}

static void close_call(fy_responses_t *rs, const char *status, fy_responses_write_fn write, void *arg)
{
    if (rs->call_index < 0) return;
    json_t *args = json_stringn(rs->args.s ? rs->args.s : "", rs->args.n);
    if (!args) args = json_string("");
    json_t *ev = event(rs, "response.function_call_arguments.done");
    json_object_set_new(ev, "item_id", json_string(rs->call_id_item));
    json_object_set_new(ev, "output_index", json_integer(rs->call_index));
    json_object_set(ev, "name", json_object_get(rs->call, "name"));
    json_object_set(ev, "arguments", args);
    emit(rs, ev, write, arg);
    json_t *item = call_item(rs->call_id_item, json_object_get(rs->call, "call_id"), json_object_get(rs->call, "name"),
                             args, status);
    json_decref(args);
    item_done(rs, rs->call_index, item, write, arg);
    rs->call_index = -1;
    json_decref(rs->call);
    rs->call = NULL;
    rs->args.n = 0;
}

void fy_responses_stream_text(fy_responses_t *rs, const char *text, size_t len, fy_responses_write_fn write, void *arg)
{
    start(rs, write, arg);
    if (!len || rs->msg_done) return; /* (the tool parser sends no content after a call) */
    size_t from = rs->text.n - rs->held;
    if (!buf_add(&rs->text, text, len)) {
        stream_oom(rs);
        return;
    }
    if (rs->msg_index < 0 && blank(rs->text.s, rs->text.n)) { /* held until something else comes */
        rs->held = rs->text.n;
        return;
    }
    rs->held = 0;
    open_message(rs, write, arg);
    send_text(rs, from, write, arg);
}

void fy_responses_stream_calls(fy_responses_t *rs, json_t *deltas, fy_responses_write_fn write, void *arg)
{
    start(rs, write, arg);
    size_t i;
    json_t *d;
    json_array_foreach(deltas, i, d)
    {
        json_t *fn = json_object_get(d, "function"), *id = json_object_get(d, "id");
        const char *more = json_string_value(json_object_get(fn, "arguments"));
        if (json_is_string(id)) { /* a new call: what was open is done */
            close_message(rs, "completed", write, arg);
            rs->msg_done = true;
            close_call(rs, "completed", write, arg);
            rs->call_index = rs->n_out++;
            rand_id("fc_", rs->call_id_item, sizeof(rs->call_id_item));
            json_t *name = json_object_get(fn, "name");
            rs->call =
                json_pack("{s:O, s:s}", "call_id", id, "name", json_is_string(name) ? json_string_value(name) : "");
            json_t *ev = event(rs, "response.output_item.added"), *empty = json_string("");
            json_object_set_new(ev, "output_index", json_integer(rs->call_index));
            json_object_set_new(
                ev, "item", call_item(rs->call_id_item, id, json_object_get(rs->call, "name"), empty, "in_progress"));
            json_decref(empty);
            emit(rs, ev, write, arg);
        }
        if (rs->call_index < 0 || !more || !*more) continue;
        if (!buf_add(&rs->args, more, strlen(more))) stream_oom(rs);
        json_t *ev = event(rs, "response.function_call_arguments.delta");
        json_object_set_new(ev, "item_id", json_string(rs->call_id_item));
        json_object_set_new(ev, "output_index", json_integer(rs->call_index));
        json_object_set_new(ev, "delta", text_json(more, strlen(more)));
        emit(rs, ev, write, arg);
    }
}

void fy_responses_stream_end(fy_responses_t *rs, const char *finish, json_t *usage, const char *error,
                             fy_responses_write_fn write, void *arg)
{
    start(rs, write, arg);
    bool incomplete = !error && finish && !strcmp(finish, "length");
    const char *status = error ? "failed" : incomplete ? "incomplete" : "completed";
    const char *item_status = error || incomplete ? "incomplete" : "completed";
    if (!error && !rs->msg_done && rs->msg_index < 0 && rs->call_index < 0 && !rs->n_out) {
        /* no call: the content, white space or nothing, is the answer */
        open_message(rs, write, arg);
        send_text(rs, 0, write, arg);
    }
    close_message(rs, item_status, write, arg);
    close_call(rs, item_status, write, arg);
    json_t *o = response_object(rs, status);
    json_object_set(o, "output", rs->output);
    json_object_set_new(o, "usage", usage_of(usage));
    if (incomplete) json_object_set_new(o, "incomplete_details", json_pack("{s:s}", "reason", "max_output_tokens"));
    if (error)
        json_object_set_new(
            o, "error", json_pack("{s:s, s:o}", "code", "server_error", "message", text_json(error, strlen(error))));
    json_t *ev = event(rs, error ? "response.failed" : incomplete ? "response.incomplete" : "response.completed");
    json_object_set_new(ev, "response", o);
    emit(rs, ev, write, arg);
}

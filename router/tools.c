/*
 * tools.c - tool calling (see tools.h): the request's tools checked, the
 * schema that enforces a choice, ferry's tool prompt for templates
 * without tool syntax, and the model's text parsed into tool calls.
 *
 * The model's output is untrusted bytes: every parser takes (text, len),
 * never reads past len, and treats anything malformed as plain content
 * (as vLLM's parsers do), so a broken call is shown to the client rather
 * than lost.
 *
 * Not here: the chat template (model/chat.c), HTTP (router/http*.c).
 */
#include "tools.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <sodium.h>

#include "mem.h"

#define JSON_OUT (JSON_COMPACT | JSON_PRESERVE_ORDER)

static fy_status_t fault(const char **param_p, const char *param, char *err, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static fy_status_t fault(const char **param_p, const char *param, char *err, size_t cap, const char *fmt, ...)
{
    if (param_p) *param_p = param;
    va_list ap;
    va_start(ap, fmt);
    if (err && cap) vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    return FY_ERR_INVALID;
}

/* OpenAI's rule for a function's name: 1 to 64 of a-z, A-Z, 0-9, _ and -. */
static bool good_name(json_t *n)
{
    if (!json_is_string(n)) return false;
    size_t len = json_string_length(n);
    const char *s = json_string_value(n);
    if (len < 1 || len > FY_TOOL_NAME_MAX) return false;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return false;
    }
    return true;
}

/* The function object of tool i (checked). */
static json_t *fn_of(json_t *tools, size_t i) { return json_object_get(json_array_get(tools, i), "function"); }

static json_t *tool_named(json_t *tools, const char *name)
{
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t)
    {
        if (!strcmp(json_string_value(json_object_get(fn_of(tools, i), "name")), name)) return t;
    }
    return NULL;
}

static fy_status_t check_tools(json_t *tools, const char **param_p, char *err, size_t cap)
{
    if (!json_is_array(tools))
        return fault(param_p, "tools", err, cap, "'tools' must be an array of {\"type\": \"function\", ...}");
    if (json_array_size(tools) > FY_TOOLS_MAX)
        return fault(param_p, "tools", err, cap, "'tools' has %zu tools; at most %d", json_array_size(tools),
                     FY_TOOLS_MAX);
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t)
    {
        json_t *type = json_object_get(t, "type"), *fn = json_object_get(t, "function");
        if (!json_is_object(t) || !json_is_string(type) || strcmp(json_string_value(type), "function"))
            return fault(param_p, "tools", err, cap, "tools[%zu] must have \"type\": \"function\"", i);
        if (!json_is_object(fn)) return fault(param_p, "tools", err, cap, "tools[%zu] needs a 'function' object", i);
        json_t *name = json_object_get(fn, "name"), *desc = json_object_get(fn, "description");
        json_t *params = json_object_get(fn, "parameters"), *strict = json_object_get(fn, "strict");
        if (!good_name(name))
            return fault(param_p, "tools", err, cap,
                         "tools[%zu].function.name must be 1 to %d letters, digits, '_' or '-'", i, FY_TOOL_NAME_MAX);
        if (desc && !json_is_null(desc) && !json_is_string(desc))
            return fault(param_p, "tools", err, cap, "tools[%zu].function.description must be a string", i);
        if (params && !json_is_null(params) && !json_is_object(params))
            return fault(param_p, "tools", err, cap, "tools[%zu].function.parameters must be a JSON Schema object", i);
        if (strict && !json_is_null(strict) && !json_is_boolean(strict))
            return fault(param_p, "tools", err, cap, "tools[%zu].function.strict must be true or false", i);
        for (size_t k = 0; k < i; k++)
            if (json_equal(json_object_get(fn_of(tools, k), "name"), name))
                return fault(param_p, "tools", err, cap, "tools[%zu] and tools[%zu] are both named '%s'", k, i,
                             json_string_value(name));
    }
    return FY_OK;
}

fy_status_t fy_tools_request(json_t *body, fy_tools_req_t *t, const char **param_p, char *err, size_t err_cap)
{
    memset(t, 0, sizeof(*t));
    t->parallel = true;
    json_t *tools = json_object_get(body, "tools"), *choice = json_object_get(body, "tool_choice");
    json_t *par = json_object_get(body, "parallel_tool_calls");
    if (tools && json_is_null(tools)) tools = NULL;
    if (choice && json_is_null(choice)) choice = NULL;
    if (par && !json_is_null(par)) {
        if (!json_is_boolean(par))
            return fault(param_p, "parallel_tool_calls", err, err_cap, "'parallel_tool_calls' must be true or false");
        t->parallel = json_is_true(par);
    }
    fy_status_t st = tools ? check_tools(tools, param_p, err, err_cap) : FY_OK;
    if (st) return st;
    if (tools && !json_array_size(tools)) tools = NULL; /* [] is no tools */
    t->choice = tools ? FY_TOOL_CHOICE_AUTO : FY_TOOL_CHOICE_NONE;
    if (choice) {
        const char *c = json_string_value(choice);
        json_t *fn = json_object_get(choice, "function"), *type = json_object_get(choice, "type");
        if (c && !strcmp(c, "none")) {
            t->choice = FY_TOOL_CHOICE_NONE;
        } else if (c && (!strcmp(c, "auto") || !strcmp(c, "required"))) {
            if (!tools) return fault(param_p, "tool_choice", err, err_cap, "'tool_choice' \"%s\" needs 'tools'", c);
            t->choice = !strcmp(c, "auto") ? FY_TOOL_CHOICE_AUTO : FY_TOOL_CHOICE_REQUIRED;
        } else if (json_is_object(choice) && json_is_string(type) && !strcmp(json_string_value(type), "function") &&
                   good_name(json_object_get(fn, "name"))) {
            const char *name = json_string_value(json_object_get(fn, "name"));
            if (!tools || !tool_named(tools, name))
                return fault(param_p, "tool_choice", err, err_cap, "'tool_choice' names '%s', which is not in 'tools'",
                             name);
            t->choice = FY_TOOL_CHOICE_NAMED;
            snprintf(t->named, sizeof(t->named), "%s", name);
        } else {
            return fault(param_p, "tool_choice", err, err_cap,
                         "'tool_choice' is \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                         "\"function\": {\"name\": ...}}");
        }
    }
    if (tools) t->tools = json_incref(tools);
    return FY_OK;
}

void fy_tools_req_clear(fy_tools_req_t *t)
{
    json_decref(t->tools);
    t->tools = NULL;
}

/* A function's parameters schema (a new reference): {} of no arguments when absent. */
static json_t *params_of(json_t *fn)
{
    json_t *p = json_object_get(fn, "parameters");
    if (json_is_object(p)) return json_deep_copy(p);
    return json_pack("{s:s, s:{}}", "type", "object", "properties");
}

fy_status_t fy_tools_schema(const fy_tools_req_t *t, char **schema_p, char *err, size_t err_cap)
{
    json_t *root = NULL;
    fy_status_t st = FY_ERR_NOMEM;
    if (t->choice == FY_TOOL_CHOICE_NAMED) {
        root = params_of(json_object_get(tool_named(t->tools, t->named), "function"));
    } else {
        /* each tool's $defs (or definitions) move to the root, where their
         * "#/$defs/..." references point once the tool's schema is nested */
        static const char *const def_keys[2] = {"$defs", "definitions"};
        json_t *any = json_array(), *defs[2] = {json_object(), json_object()};
        root = json_pack("{s:s, s:i, s:{s:o}}", "type", "array", "minItems", 1, "items", "anyOf", any);
        if (!root || !defs[0] || !defs[1]) goto fail_defs;
        if (!t->parallel) json_object_set_new(root, "maxItems", json_integer(1));
        size_t i;
        json_t *tool;
        json_array_foreach(t->tools, i, tool)
        {
            json_t *fn = json_object_get(tool, "function"), *p = params_of(fn);
            if (!p) goto fail_defs;
            for (size_t d = 0; d < 2; d++) {
                const char *k;
                json_t *v;
                json_object_foreach(json_object_get(p, def_keys[d]), k, v)
                {
                    json_t *have = json_object_get(defs[d], k);
                    if (have && !json_equal(have, v)) {
                        /* the message first: k belongs to p */
                        st = fault(NULL, NULL, err, err_cap,
                                   "two tools define '%s' in their %s differently; give them distinct names", k,
                                   def_keys[d]);
                        json_decref(p);
                        goto fail_defs;
                    }
                    json_object_set(defs[d], k, v);
                }
                json_object_del(p, def_keys[d]);
            }
            json_t *item =
                json_pack("{s:s, s:{s:{s:O}, s:o}, s:[s,s]}", "type", "object", "properties", "name", "const",
                          json_object_get(fn, "name"), "parameters", p, "required", "name", "parameters");
            if (!item || json_array_append_new(any, item)) goto fail_defs;
        }
        for (size_t d = 0; d < 2; d++)
            if (json_object_size(defs[d])) json_object_set(root, def_keys[d], defs[d]);
        json_decref(defs[0]);
        json_decref(defs[1]);
        goto dump;
    fail_defs:
        json_decref(defs[0]);
        json_decref(defs[1]);
        goto fail;
    }
dump:
    if (!root) goto fail;
    char *s = json_dumps(root, JSON_OUT);
    json_decref(root);
    if (!s) return FY_ERR_NOMEM;
    *schema_p = fy_strndup(s, strlen(s));
    free(s);
    return *schema_p ? FY_OK : FY_ERR_NOMEM;
fail:
    json_decref(root);
    return st;
}

/* ---- the prompt for templates without tool syntax ------------------------ */

/* SmolLM2-Instruct's tool prompt, as its authors publish it. */
static const char PROMPT_HEAD[] =
    "You are an expert in composing functions. You are given a question and a set of possible functions.\n"
    "Based on the question, you will need to make one or more function/tool calls to achieve the purpose.\n"
    "If none of the functions can be used, point it out and refuse to answer.\n"
    "If the given question lacks the parameters required by the function, also point it out.\n"
    "You have access to the following tools:\n"
    "<tools>";
static const char PROMPT_TAIL[] =
    "</tools>\n"
    "The output MUST strictly adhere to the following format, and NO other text MUST be included.\n"
    "The example format is as follows. Please make sure the parameter type is correct. If no function call is "
    "needed, please make the tool calls an empty list '[]'.\n"
    "<tool_call>[\n"
    "{\"name\": \"func_name1\", \"arguments\": {\"argument1\": \"value1\", \"argument2\": \"value2\"}},\n"
    "(more tool calls as required)\n"
    "]</tool_call>";

static char *concat3(const char *a, const char *b, const char *c)
{
    size_t la = strlen(a), lb = strlen(b), lc = strlen(c);
    char *s = fy_malloc(la + lb + lc + 1);
    if (!s) return NULL;
    memcpy(s, a, la);
    memcpy(s + la, b, lb);
    memcpy(s + la + lb, c, lc + 1);
    return s;
}

char *fy_tools_system_prompt(const fy_tools_req_t *t)
{
    /* the function objects, as SmolLM2 was shown them */
    json_t *fns = json_array();
    size_t i;
    json_t *tool;
    json_array_foreach(t->tools, i, tool) json_array_append(fns, json_object_get(tool, "function"));
    char *j = json_dumps(fns, JSON_PRESERVE_ORDER);
    json_decref(fns);
    char *s = j ? concat3(PROMPT_HEAD, j, PROMPT_TAIL) : NULL;
    free(j);
    return s;
}

char *fy_tools_calls_text(json_t *tool_calls)
{
    json_t *arr = json_array();
    size_t i;
    json_t *c;
    json_array_foreach(tool_calls, i, c)
    {
        json_t *fn = json_object_get(c, "function");
        json_t *args = json_loads(json_string_value(json_object_get(fn, "arguments")), 0, NULL);
        json_array_append_new(arr, json_pack("{s:O, s:o}", "name", json_object_get(fn, "name"), "arguments",
                                             args ? args : json_object()));
    }
    char *j = json_dumps(arr, JSON_PRESERVE_ORDER);
    json_decref(arr);
    char *s = j ? concat3("<tool_call>", j, "</tool_call>") : NULL;
    free(j);
    return s;
}

/* ---- output -------------------------------------------------------------- */

static const char OPEN[] = "<tool_call>", CLOSE[] = "</tool_call>", PYTAG[] = "<|python_tag|>";

static const char *find(const char *s, size_t n, const char *needle)
{
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= n; i++)
        if (!memcmp(s + i, needle, k)) return s + i;
    return NULL;
}

static bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

/* A call {"id", "type", "function": {"name", "arguments"}} appended to
 * calls from o, a model's {"name", "arguments"|"parameters"}; false when
 * o is not one. */
static bool add_call(json_t *calls, json_t *o, const char *forced_name)
{
    json_t *name = forced_name ? NULL : json_object_get(o, "name");
    if (!forced_name && !(json_is_string(name) && json_string_length(name) > 0)) return false;
    json_t *args = forced_name ? o : json_object_get(o, "arguments");
    if (!forced_name && !args) args = json_object_get(o, "parameters");
    char *a = NULL;
    if (!args) {
        a = strdup("{}");
    } else if (json_is_string(args)) { /* arguments already as JSON text */
        json_t *parsed = json_loads(json_string_value(args), 0, NULL);
        if (!json_is_object(parsed)) {
            json_decref(parsed);
            return false;
        }
        a = json_dumps(parsed, JSON_OUT);
        json_decref(parsed);
    } else if (json_is_object(args)) {
        a = json_dumps(args, JSON_OUT);
    } else {
        return false;
    }
    if (!a) return false;
    unsigned char rnd[12];
    char id[5 + 2 * sizeof(rnd) + 1] = "call_";
    randombytes_buf(rnd, sizeof(rnd));
    for (size_t i = 0; i < sizeof(rnd); i++) snprintf(id + 5 + 2 * i, 3, "%02x", rnd[i]);
    json_t *call = json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function", "function", "name",
                             forced_name ? forced_name : json_string_value(name), "arguments", a);
    free(a);
    return call && !json_array_append_new(calls, call);
}

/* One JSON value holding a call or an array of calls, appended; false
 * when it holds anything else. */
static bool add_calls(json_t *calls, json_t *v)
{
    if (json_is_object(v)) return add_call(calls, v, NULL);
    if (!json_is_array(v)) return false;
    size_t i;
    json_t *o;
    json_array_foreach(v, i, o) if (!add_call(calls, o, NULL)) return false;
    return true;
}

static void parse_hermes(json_t *calls, const char *text, size_t len, size_t *content_len_p)
{
    const char *first = find(text, len, OPEN), *end = text + len;
    if (!first) return;
    bool ok = true;
    for (const char *p = first; ok && p;) {
        const char *body = p + strlen(OPEN), *close = find(body, (size_t)(end - body), CLOSE);
        const char *stop = close ? close : end; /* a call cut short of its close still counts if it parses */
        json_t *v = json_loadb(body, (size_t)(stop - body), JSON_DECODE_ANY, NULL);
        ok = v && add_calls(calls, v);
        json_decref(v);
        if (!close) break;
        const char *after = close + strlen(CLOSE);
        p = find(after, (size_t)(end - after), OPEN);
    }
    if (!ok) {
        json_array_clear(calls);
        return;
    }
    *content_len_p = (size_t)(first - text);
}

static void parse_llama3(json_t *calls, const char *text, size_t len, size_t *content_len_p)
{
    size_t i = 0;
    while (i < len && is_ws(text[i])) i++;
    if (len - i >= strlen(PYTAG) && !memcmp(text + i, PYTAG, strlen(PYTAG))) i += strlen(PYTAG);
    while (i < len && is_ws(text[i])) i++;
    if (i >= len || text[i] != '{') return;
    /* one object, or several separated by ';' (Llama 3.2's parallel calls) */
    bool ok = true;
    while (ok && i < len) {
        json_error_t je;
        json_t *v = json_loadb(text + i, len - i, JSON_DISABLE_EOF_CHECK, &je);
        ok = json_is_object(v) && add_call(calls, v, NULL);
        json_decref(v);
        if (!ok) break;
        i += (size_t)je.position;
        while (i < len && is_ws(text[i])) i++;
        if (i < len && text[i] == ';') i++;
        while (i < len && is_ws(text[i])) i++;
    }
    if (!ok) {
        json_array_clear(calls);
        return;
    }
    *content_len_p = 0;
}

fy_status_t fy_tools_parse(fy_tool_format_t fmt, const char *text, size_t len, json_t **calls_p, size_t *content_len_p)
{
    json_t *calls = json_array();
    if (!calls) return FY_ERR_NOMEM;
    *content_len_p = len;
    if (fmt == FY_TOOL_FORMAT_LLAMA3)
        parse_llama3(calls, text, len, content_len_p);
    else
        parse_hermes(calls, text, len, content_len_p);
    if (!json_array_size(calls)) *content_len_p = len; /* (SmolLM2's "[]": no call) */
    *calls_p = calls;
    return FY_OK;
}

fy_status_t fy_tools_parse_forced(fy_tool_choice_t choice, const char *named, const char *text, size_t len,
                                  json_t **calls_p)
{
    json_t *calls = json_array();
    if (!calls) return FY_ERR_NOMEM;
    json_t *v = json_loadb(text, len, JSON_DECODE_ANY, NULL);
    bool ok = false;
    if (choice == FY_TOOL_CHOICE_NAMED && json_is_object(v)) {
        ok = add_call(calls, v, named);
    } else if (choice == FY_TOOL_CHOICE_REQUIRED && json_is_array(v) && json_array_size(v)) {
        ok = add_calls(calls, v);
    }
    json_decref(v);
    if (!ok) json_array_clear(calls);
    *calls_p = calls;
    return FY_OK;
}

size_t fy_tools_content_prefix(fy_tool_format_t fmt, const char *text, size_t len)
{
    if (fmt == FY_TOOL_FORMAT_LLAMA3) { /* a call is the whole answer: content once it begins otherwise */
        size_t i = 0;
        while (i < len && is_ws(text[i])) i++;
        if (i == len || text[i] == '{' || text[i] == '<') return 0;
        return len;
    }
    const char *p = find(text, len, OPEN);
    if (p) return (size_t)(p - text);
    /* hold back a tail that may be the start of "<tool_call>" */
    size_t k = strlen(OPEN) - 1 < len ? strlen(OPEN) - 1 : len;
    for (; k > 0; k--)
        if (!memcmp(text + len - k, OPEN, k)) return len - k;
    return len;
}

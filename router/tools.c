/*
 * tools.c - tool calling (see tools.h): the request's tools checked, the
 * schema that enforces a choice, ferry's tool prompt for templates
 * without tool syntax, and the model's text parsed into tool calls.
 *
 * The model's output is untrusted bytes: the parser takes (text, len),
 * never reads past len, and treats what is malformed before a call goes
 * out as plain content (as vLLM's parsers do), so a broken call is shown
 * to the client rather than lost.  Its one byte-at-a-time reading serves
 * both the whole answer and the stream, so they agree (fuzzed).
 *
 * Not here: the chat template (model/chat.c), HTTP (router/http*.c).
 */
#include "router/tools.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "common/mem.h"

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

/* ---- output: the incremental parser ---------------------------------------
 *
 * One parser reads the model's text a byte at a time, whether it comes
 * whole (fy_tools_parse) or as it grows (a stream), so the two agree by
 * construction: every decision depends only on the bytes already read.
 * Outside a call the bytes are content, except a tail that may begin a
 * call marker (held back); after a marker (or, for Llama 3 and Mistral,
 * a bare '{' or '[' that opens the answer) a JSON lexer checks the call:
 * {"name": a tool's name, "arguments" (or "parameters"): an object or
 * the JSON text of one}, alone or in an array.  A call is committed (its
 * id and name go out) once its name is known and its arguments begin;
 * its arguments then go out as they are read, white space outside
 * strings left out.  What fails before the first commit is content after
 * all (the text is read again from after the failed marker); what fails
 * after it is dropped, and a call cut short keeps what it had (OpenAI's
 * own calls may be cut by max_tokens: clients validate arguments).
 */

static const char OPEN[] = "<tool_call>", PYTAG[] = "<|python_tag|>", MISTRAL_TAG[] = "[TOOL_CALLS]";

static bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

#define LX_DEPTH 64 /* JSON nesting in a call */
#define NUM_MAX 64  /* bytes of one number */
#define KEY_MAX 15  /* bytes of a member's name worth reading */
#define ID_MAX 32

enum {
    LX_VALUE,
    LX_OBJ_FIRST,
    LX_OBJ_KEY,
    LX_COLON,
    LX_OBJ_NEXT,
    LX_ARR_FIRST,
    LX_ARR_NEXT,
    LX_STR,
    LX_NUM,
    LX_LIT,
    LX_DONE
};
enum { EV_ERR = -1, EV_WS = 0, EV_BYTE = 1, EV_START = 2, EV_END = 4, EV_KEY_END = 8, EV_NUM_ENDED = 16 };

/* A JSON lexer that checks at least what jansson checks (UTF-8,
 * escapes and surrogates, no NUL, numbers in range), so a call it
 * completes loads. */
typedef struct lx {
    uint8_t st;
    uint8_t stack[LX_DEPTH]; /* '{' or '[' */
    int depth;               /* open containers */
    int vdepth;              /* EV_START / EV_END: the depth of the value that began or ended */
    bool key;                /* LX_STR: an object's member name */
    uint8_t esc;             /* LX_STR: 0, 1 after '\\', 2-5 reading \u's hex digits */
    uint32_t u;
    bool want_lo;     /* a high surrogate's \u read: its low one must follow */
    uint8_t utf_need; /* continuation bytes still wanted */
    uint8_t lo, hi;   /* the next continuation byte's range */
    uint8_t num;      /* LX_NUM's sub-state */
    size_t num_start; /* the number's offset in the text */
    const char *lit;  /* LX_LIT: "true", "false" or "null", li bytes read */
    uint8_t li;
} lx_t;

enum { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };

static void lx_after_value(lx_t *l)
{
    l->st = !l->depth ? LX_DONE : l->stack[l->depth - 1] == '{' ? LX_OBJ_NEXT : LX_ARR_NEXT;
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* The number text[start, end) within jansson's range (it refuses
 * integers past 64 bits and reals that overflow). */
static bool num_ok(const char *text, size_t start, size_t end)
{
    char buf[NUM_MAX + 1];
    size_t n = end - start;
    if (n > NUM_MAX) return false;
    memcpy(buf, text + start, n);
    buf[n] = 0;
    errno = 0;
    if (!strpbrk(buf, ".eE")) {
        (void)strtoll(buf, NULL, 10);
        return errno != ERANGE;
    }
    double d = strtod(buf, NULL);
    return !(errno == ERANGE && (d == HUGE_VAL || d == -HUGE_VAL));
}

/* A string's byte c (after the opening quote). */
static int lx_str(lx_t *l, int c)
{
    if (l->utf_need) {
        if (c < l->lo || c > l->hi) return EV_ERR;
        l->utf_need--;
        l->lo = 0x80, l->hi = 0xbf;
        return EV_BYTE;
    }
    if (l->esc == 1) {
        if (c == 'u') {
            l->esc = 2, l->u = 0;
            return EV_BYTE;
        }
        if (l->want_lo || !strchr("\"\\/bfnrt", c) || !c) return EV_ERR;
        l->esc = 0;
        return EV_BYTE;
    }
    if (l->esc >= 2) {
        int h = hexval(c);
        if (h < 0) return EV_ERR;
        l->u = l->u << 4 | (uint32_t)h;
        if (++l->esc < 6) return EV_BYTE;
        l->esc = 0;
        if (l->want_lo) {
            if (l->u < 0xdc00 || l->u > 0xdfff) return EV_ERR;
            l->want_lo = false;
        } else if (l->u >= 0xd800 && l->u <= 0xdbff) {
            l->want_lo = true;
        } else if ((l->u >= 0xdc00 && l->u <= 0xdfff) || l->u == 0) {
            return EV_ERR;
        }
        return EV_BYTE;
    }
    if (l->want_lo && c != '\\') return EV_ERR;
    if (c == '\\') {
        l->esc = 1;
        return EV_BYTE;
    }
    if (c == '"') {
        bool key = l->key;
        if (key) {
            l->st = LX_COLON;
            return EV_BYTE | EV_KEY_END;
        }
        lx_after_value(l);
        l->vdepth = l->depth;
        return EV_BYTE | EV_END;
    }
    if (c < 0x20) return EV_ERR;
    if (c < 0x80) return EV_BYTE;
    l->lo = 0x80, l->hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) {
        l->utf_need = 1;
    } else if (c >= 0xe0 && c <= 0xef) {
        l->utf_need = 2;
        if (c == 0xe0) l->lo = 0xa0;
        if (c == 0xed) l->hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        l->utf_need = 3;
        if (c == 0xf0) l->lo = 0x90;
        if (c == 0xf4) l->hi = 0x8f;
    } else {
        return EV_ERR;
    }
    return EV_BYTE;
}

static bool num_char(uint8_t st, int c, uint8_t *next)
{
    bool digit = c >= '0' && c <= '9';
    switch (st) {
    case N_MINUS:
        if (!digit) return false;
        *next = c == '0' ? N_ZERO : N_INT;
        return true;
    case N_ZERO:
    case N_INT:
        if (digit && st == N_INT) return *next = N_INT, true;
        if (c == '.') return *next = N_DOT, true;
        if (c == 'e' || c == 'E') return *next = N_E, true;
        return false;
    case N_DOT:
    case N_FRAC:
        if (digit) return *next = N_FRAC, true;
        if (st == N_FRAC && (c == 'e' || c == 'E')) return *next = N_E, true;
        return false;
    case N_E:
        if (c == '+' || c == '-') return *next = N_ESIGN, true;
        /* fall through */
    case N_ESIGN:
    case N_EXP:
        if (digit) return *next = N_EXP, true;
        return false;
    }
    return false;
}

static int lx_value_start(lx_t *l, int c, size_t at)
{
    l->vdepth = l->depth;
    if (c == '{' || c == '[') {
        if (l->depth >= LX_DEPTH) return EV_ERR;
        l->stack[l->depth++] = (uint8_t)c;
        l->st = c == '{' ? LX_OBJ_FIRST : LX_ARR_FIRST;
        return EV_BYTE | EV_START;
    }
    if (c == '"') {
        l->st = LX_STR, l->key = false, l->esc = 0, l->want_lo = false, l->utf_need = 0;
        return EV_BYTE | EV_START;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        l->st = LX_NUM, l->num_start = at;
        l->num = c == '-' ? N_MINUS : c == '0' ? N_ZERO : N_INT;
        return EV_BYTE | EV_START;
    }
    l->lit = c == 't' ? "true" : c == 'f' ? "false" : c == 'n' ? "null" : NULL;
    if (!l->lit) return EV_ERR;
    l->st = LX_LIT, l->li = 1;
    return EV_BYTE | EV_START;
}

/* Byte text[at]: its events, or EV_ERR when the text cannot be JSON. */
static int lx_byte(lx_t *l, const char *text, size_t at)
{
    int c = (uint8_t)text[at], ev = 0;
    if (l->st == LX_NUM) {
        uint8_t next;
        if (num_char(l->num, c, &next)) {
            l->num = next;
            return EV_BYTE;
        }
        if (l->num == N_MINUS || l->num == N_DOT || l->num == N_E || l->num == N_ESIGN) return EV_ERR;
        if (!num_ok(text, l->num_start, at)) return EV_ERR;
        lx_after_value(l);
        l->vdepth = l->depth;
        ev = EV_NUM_ENDED; /* then c as what follows it */
    }
    if (l->st == LX_STR) return lx_str(l, c);
    if (l->st == LX_LIT) {
        if (c != l->lit[l->li]) return EV_ERR;
        if (l->lit[++l->li]) return EV_BYTE;
        lx_after_value(l);
        l->vdepth = l->depth;
        return EV_BYTE | EV_END;
    }
    if (is_ws((char)c)) return ev | EV_WS;
    switch (l->st) {
    case LX_VALUE: return ev | lx_value_start(l, c, at);
    case LX_ARR_FIRST:
        if (c != ']') return ev | lx_value_start(l, c, at);
        /* fall through */
    case LX_OBJ_NEXT:
    case LX_ARR_NEXT:
        if (c == ',') {
            l->st = l->st == LX_OBJ_NEXT ? LX_OBJ_KEY : LX_VALUE;
            return ev | EV_BYTE;
        }
        if (c != (l->stack[l->depth - 1] == '{' ? '}' : ']')) return EV_ERR;
        l->depth--;
        lx_after_value(l);
        l->vdepth = l->depth;
        return ev | EV_BYTE | EV_END;
    case LX_OBJ_FIRST:
        if (c == '}') {
            l->depth--;
            lx_after_value(l);
            l->vdepth = l->depth;
            return ev | EV_BYTE | EV_END;
        }
        /* fall through */
    case LX_OBJ_KEY:
        if (c != '"') return EV_ERR;
        l->st = LX_STR, l->key = true, l->esc = 0, l->want_lo = false, l->utf_need = 0;
        return ev | EV_BYTE;
    case LX_COLON:
        if (c != ':') return EV_ERR;
        l->st = LX_VALUE;
        return ev | EV_BYTE;
    default: return EV_ERR; /* LX_DONE: nothing may follow */
    }
}

/* ---- calls ---- */

typedef struct call {
    char id[ID_MAX];
    char name[FY_TOOL_NAME_MAX + 1];
    char *args; /* the arguments so far (fy_malloc'd) */
    size_t len, cap;
    size_t ok;   /* bytes of args that end with a whole UTF-8 character: what may go out */
    size_t sent; /* bytes of args handed out as deltas */
    bool head_sent, complete;
} call_t;

enum { O_TEXT, O_BODY, O_AFTER, O_DEAD };
enum { K_OTHER, K_NAME, K_ARGS };
enum { MODE_HERMES, MODE_LLAMA3, MODE_MISTRAL, MODE_REQUIRED, MODE_NAMED };

struct fy_tools_stream {
    int mode;
    bool parallel;
    char *names;        /* the tools' names (fy_tools_names' list); NULL: any */
    const char *marker; /* what opens a call anywhere in the text; NULL: only at the start */
    size_t pos;         /* the next byte to read */
    int outer;          /* O_* */
    size_t match;       /* O_TEXT, O_AFTER: bytes of the marker matched before pos */
    bool all_ws;        /* O_TEXT: the text so far is white space (a bare call may open it) */
    size_t confirmed;   /* bytes of text that are content unless a call follows */
    size_t content;     /* once a call is committed: the content before it */
    bool semi;          /* O_AFTER (Llama 3): the ';' between calls read */
    bool done;
    size_t end; /* done: the text's length */
    /* O_BODY: the region being read */
    lx_t lx;
    size_t region;    /* where it began (its marker, or the bare '{' or '[') */
    size_t rescan;    /* where O_TEXT reads on when it fails */
    int region_calls; /* calls committed in it */
    bool in_call;     /* a call object is open */
    int cd;           /* the depth its value began at */
    int key;          /* K_*: the member being read */
    char kbuf[KEY_MAX + 1];
    size_t klen;
    bool kbad;
    bool have_name, have_args, in_name, in_args, args_str;
    size_t str_start; /* a string argument's opening quote */
    call_t cur;       /* the call being read (committed: calls[n - 1] is it) */
    bool committed;
    call_t *calls;
    size_t n, cap;
};

static void call_free(call_t *c) { fy_free(c->args); }

/* n bytes onto c's arguments; whole: they end a UTF-8 character. */
static bool args_put(call_t *c, const char *b, size_t n, bool whole)
{
    if (c->len + n + 1 > c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 64;
        while (cap < c->len + n + 1) cap *= 2;
        char *a = fy_realloc(c->args, cap);
        if (!a) return false;
        c->args = a, c->cap = cap;
    }
    memcpy(c->args + c->len, b, n);
    c->len += n;
    c->args[c->len] = 0;
    if (whole) c->ok = c->len;
    return true;
}

static void make_id(char *id, bool mistral)
{
    static const char alnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    unsigned char rnd[12];
    randombytes_buf(rnd, sizeof(rnd));
    if (mistral) { /* Mistral's templates want 9 letters and digits */
        for (int i = 0; i < 9; i++) id[i] = alnum[rnd[i] % (sizeof(alnum) - 1)];
        id[9] = 0;
        return;
    }
    memcpy(id, "call_", 5);
    for (size_t i = 0; i < sizeof(rnd); i++) snprintf(id + 5 + 2 * i, 3, "%02x", rnd[i]);
}

static bool name_known(const fy_tools_stream_t *s, const char *name)
{
    if (!s->names) return true;
    for (const char *p = s->names; *p; p += strlen(p) + 1)
        if (!strcmp(p, name)) return true;
    return false;
}

static size_t trim(const char *text, size_t p)
{
    while (p > 0 && is_ws(text[p - 1])) p--;
    return p;
}

/* The call being read goes out: FY_ERR_NOMEM only. */
static fy_status_t commit(fy_tools_stream_t *s, const char *text)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 4;
        call_t *c = fy_realloc(s->calls, cap * sizeof(*c));
        if (!c) return FY_ERR_NOMEM;
        s->calls = c, s->cap = cap;
    }
    if (!s->n) s->content = trim(text, s->region);
    make_id(s->cur.id, s->mode == MODE_MISTRAL);
    s->calls[s->n++] = s->cur;
    memset(&s->cur, 0, sizeof(s->cur));
    s->committed = true;
    s->region_calls++;
    return FY_OK;
}

/* The call's args: calls[n - 1] once committed, else the one being read. */
static call_t *cur_call(fy_tools_stream_t *s) { return s->committed ? &s->calls[s->n - 1] : &s->cur; }

static void region_open(fy_tools_stream_t *s, size_t region, size_t body)
{
    s->outer = O_BODY;
    s->region = region;
    s->rescan = region + 1 > body ? region + 1 : body;
    s->region_calls = 0;
    memset(&s->lx, 0, sizeof(s->lx));
    s->lx.st = LX_VALUE;
    s->in_call = false;
    s->pos = body;
}

static void call_open(fy_tools_stream_t *s, int cd)
{
    call_free(&s->cur);
    memset(&s->cur, 0, sizeof(s->cur));
    s->in_call = true, s->cd = cd;
    s->have_name = s->have_args = s->in_name = s->in_args = s->args_str = false;
    s->committed = false;
    s->key = K_OTHER;
}

/* The region failed at pos: content after all when no call came before,
 * else the rest is dropped (or, between Hermes blocks, the next marker
 * looked for). */
static void region_fail(fy_tools_stream_t *s)
{
    call_free(&s->cur);
    memset(&s->cur, 0, sizeof(s->cur));
    s->in_call = false;
    if (s->region_calls || s->mode == MODE_REQUIRED || s->mode == MODE_NAMED) {
        s->outer = O_DEAD;
    } else if (s->n) {
        s->outer = s->marker ? O_AFTER : O_DEAD;
        s->pos = s->rescan, s->match = 0;
    } else {
        s->outer = O_TEXT;
        s->pos = s->rescan, s->match = 0, s->all_ws = false;
        s->confirmed = s->rescan;
    }
}

/* The region's value ended well. */
static void region_end(fy_tools_stream_t *s)
{
    if (!s->region_calls) {
        region_fail(s);
        return;
    }
    s->outer = !s->parallel || s->mode == MODE_REQUIRED || s->mode == MODE_NAMED ? O_DEAD : O_AFTER;
    s->match = 0, s->semi = false;
}

/* The lexer's events for byte text[at] in a region; false: it fails. */
static bool body_byte(fy_tools_stream_t *s, const char *text, size_t at, int ev, fy_status_t *st)
{
    lx_t *l = &s->lx;
    char c = text[at];
    if (s->mode == MODE_NAMED) {
        if ((ev & EV_START) && l->vdepth == 0) {
            if (c != '{') return false;
            call_open(s, -1);
            snprintf(s->cur.name, sizeof(s->cur.name), "%s", s->names ? s->names : "");
            if ((*st = commit(s, text))) return false;
        }
        if (s->n && (ev & EV_BYTE)) {
            call_t *k = cur_call(s);
            if (!k->complete && !args_put(k, &c, 1, !l->utf_need)) return *st = FY_ERR_NOMEM, false;
        }
        if ((ev & EV_END) && l->vdepth == 0) s->calls[s->n - 1].complete = true;
        return true;
    }
    if ((ev & EV_START) && l->vdepth == 0) { /* the region's value */
        bool ok = c == '{' ? s->mode != MODE_REQUIRED : c == '[' && s->mode != MODE_LLAMA3;
        if (!ok) return false;
        if (c == '{') call_open(s, 0);
        return true;
    }
    if ((ev & EV_START) && l->vdepth == 1 && !s->in_call) { /* an item of the array */
        if (c != '{') return false;
        if (!s->parallel && s->n) { /* one call only: the rest is dropped */
            s->outer = O_DEAD;
            return true;
        }
        call_open(s, 1);
        return true;
    }
    if (!s->in_call) return true; /* (the array's commas and close) */
    int member = s->cd + 1;
    if ((ev & EV_KEY_END) && l->depth == member) {
        s->key = s->kbad                          ? K_OTHER
                 : !strcmp(s->kbuf, "name")       ? K_NAME
                 : !strcmp(s->kbuf, "arguments")  ? K_ARGS
                 : !strcmp(s->kbuf, "parameters") ? K_ARGS
                                                  : K_OTHER;
        if ((s->key == K_NAME && s->have_name) || (s->key == K_ARGS && s->have_args)) {
            if (!s->committed) return false; /* twice: not a call */
            s->key = K_OTHER;
        }
        return true;
    }
    if (l->st == LX_STR && l->key && l->depth == member) return true; /* a member's name (key_byte) */
    if ((ev & EV_START) && l->vdepth == member) {
        if (s->key == K_NAME) {
            if (c != '"') return false;
            s->in_name = true;
            return true;
        }
        if (s->key == K_ARGS) {
            s->have_args = true;
            if (c == '"') {
                s->args_str = true, s->str_start = at;
                return true;
            }
            if (c != '{') return false;
            s->in_args = true;
            if (s->have_name && !s->committed && (*st = commit(s, text))) return false;
        }
    }
    if (s->in_name) {
        if (ev & EV_END) {
            s->in_name = false;
            s->have_name = true;
            if (!s->cur.name[0] || !name_known(s, s->cur.name)) return false;
            if (s->have_args && !s->in_args && !s->args_str && !s->committed && (*st = commit(s, text))) return false;
            return true;
        }
        if (ev & EV_START) return true;
        size_t nl = strlen(s->cur.name);
        bool good = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
        if (!good || nl >= FY_TOOL_NAME_MAX) return false;
        s->cur.name[nl] = c;
        return true;
    }
    if (s->in_args && (ev & EV_BYTE)) {
        call_t *k = cur_call(s);
        if (!args_put(k, &c, 1, !l->utf_need)) return *st = FY_ERR_NOMEM, false;
        if ((ev & EV_END) && l->vdepth == member) {
            s->in_args = false;
            k->complete = true;
        }
        return true;
    }
    if (s->args_str && (ev & EV_END) && l->vdepth == member) { /* arguments as JSON text: whole or nothing */
        s->args_str = false;
        json_t *str = json_loadb(text + s->str_start, at + 1 - s->str_start, JSON_DECODE_ANY, NULL);
        json_t *obj = json_loads(json_string_value(str) ? json_string_value(str) : "", 0, NULL);
        char *a = json_is_object(obj) ? json_dumps(obj, JSON_OUT) : NULL;
        json_decref(str);
        json_decref(obj);
        if (!a) return false;
        bool ok = args_put(&s->cur, a, strlen(a), true);
        free(a);
        if (!ok) return *st = FY_ERR_NOMEM, false;
        s->cur.complete = true;
        if (s->have_name && (*st = commit(s, text))) return false;
        return true;
    }
    if ((ev & EV_END) && l->vdepth == s->cd) { /* the call's object closed */
        s->in_call = false;
        if (!s->have_name) return false;
        if (!s->committed) {
            call_t *k = &s->cur;
            if (!s->have_args) {
                if (!args_put(k, "{}", 2, true)) return *st = FY_ERR_NOMEM, false;
                k->complete = true;
            }
            if ((*st = commit(s, text))) return false;
        }
        return true;
    }
    return true;
}

/* Keys: the lexer reports a key's bytes as EV_BYTE while it reads one. */
static void key_byte(fy_tools_stream_t *s, uint8_t st_before, uint8_t esc_before, char c)
{
    if (st_before == LX_OBJ_FIRST || st_before == LX_OBJ_KEY) { /* its opening quote */
        s->klen = 0, s->kbad = false, s->kbuf[0] = 0;
        return;
    }
    if (esc_before || c == '\\' || s->klen >= KEY_MAX) {
        s->kbad = true;
        return;
    }
    s->kbuf[s->klen++] = c;
    s->kbuf[s->klen] = 0;
}

/* One byte outside a region: content (O_TEXT) or dropped (O_AFTER),
 * unless it opens a call.  False: wait for more text. */
static bool outer_byte(fy_tools_stream_t *s, const char *text, size_t len, bool done)
{
    size_t at = s->pos, mlen = s->marker ? strlen(s->marker) : 0;
    char c = text[at];
    if (s->outer == O_AFTER && !s->marker) { /* Llama 3: calls apart by white space and a ';' */
        if (is_ws(c) || (c == ';' && !s->semi)) {
            s->semi |= c == ';';
            s->pos++;
        } else if (c == '{') {
            region_open(s, at, at);
        } else {
            s->outer = O_DEAD;
        }
        return true;
    }
    bool bare_ok = s->outer == O_TEXT && s->all_ws;
    if (s->marker && c == s->marker[s->match]) {
        s->pos++;
        if (++s->match == mlen) region_open(s, at + 1 - mlen, at + 1);
    } else if (s->match == 1 && bare_ok && s->mode == MODE_MISTRAL) {
        region_open(s, at - 1, at - 1); /* a bare '[' opened the answer: read again as JSON */
    } else if (s->match) {
        s->match = 0; /* (c is read again: it may open the marker) */
        if (bare_ok) s->all_ws = false;
    } else if (bare_ok && ((c == '{' && s->mode == MODE_LLAMA3) || (c == '[' && s->mode == MODE_MISTRAL))) {
        region_open(s, at, at);
    } else if (bare_ok && s->mode == MODE_LLAMA3 && c == '<' &&
               !memcmp(PYTAG, text + at, len - at < strlen(PYTAG) ? len - at : strlen(PYTAG)) &&
               (len - at >= strlen(PYTAG) || !done)) {
        if (len - at < strlen(PYTAG)) return false; /* <|python_tag|> (rendered special tokens), perhaps */
        region_open(s, at, at + strlen(PYTAG));
    } else {
        s->pos++;
        if (!is_ws(c)) s->all_ws = false;
    }
    if (s->outer == O_TEXT) s->confirmed = s->pos - s->match;
    return true;
}

fy_status_t fy_tools_stream_feed(fy_tools_stream_t *s, const char *text, size_t len, bool done)
{
    if (s->done) return FY_OK;
    for (;;) {
        while (s->pos < len) {
            size_t at = s->pos;
            if (s->outer == O_DEAD) {
                s->pos = len;
            } else if (s->outer != O_BODY) {
                if (!outer_byte(s, text, len, done)) break;
            } else {
                uint8_t st_before = s->lx.st, esc_before = s->lx.esc;
                int ev = lx_byte(&s->lx, text, at);
                if (ev == EV_ERR) {
                    region_fail(s);
                    continue;
                }
                if (s->in_call && s->lx.st == LX_STR && s->lx.key && s->lx.depth == s->cd + 1)
                    key_byte(s, st_before, esc_before, text[at]);
                fy_status_t st = FY_OK;
                if (!body_byte(s, text, at, ev, &st)) {
                    if (st) return st;
                    region_fail(s);
                    continue;
                }
                s->pos++;
                if (s->outer == O_BODY && s->lx.st == LX_DONE) region_end(s);
            }
        }
        /* at the end, a region with no call is not one: read on after it */
        if (!done || s->outer != O_BODY || s->region_calls) break;
        region_fail(s);
    }
    if (done) {
        s->done = true;
        s->end = len;
    }
    return FY_OK;
}

fy_status_t fy_tools_stream_create(fy_tool_choice_t choice, fy_tool_format_t fmt, const char *named, const char *names,
                                   bool parallel, fy_tools_stream_t **s_p)
{
    fy_tools_stream_t *s = fy_calloc(1, sizeof(*s));
    if (!s) return FY_ERR_NOMEM;
    s->parallel = parallel;
    s->all_ws = true;
    if (choice == FY_TOOL_CHOICE_NAMED) {
        s->mode = MODE_NAMED;
        names = named ? named : "";
        size_t n = strlen(names);
        s->names = fy_malloc(n + 2);
        if (s->names) memcpy(s->names, names, n + 1), s->names[n + 1] = 0;
    } else {
        s->mode = choice == FY_TOOL_CHOICE_REQUIRED ? MODE_REQUIRED
                  : fmt == FY_TOOL_FORMAT_LLAMA3    ? MODE_LLAMA3
                  : fmt == FY_TOOL_FORMAT_MISTRAL   ? MODE_MISTRAL
                                                    : MODE_HERMES;
        if (names) {
            size_t n = 0;
            while (names[n]) n += strlen(names + n) + 1;
            s->names = fy_malloc(n + 1);
            if (s->names) memcpy(s->names, names, n + 1);
        }
    }
    if ((s->mode == MODE_NAMED || names) && !s->names) {
        fy_free(s);
        return FY_ERR_NOMEM;
    }
    s->marker = s->mode == MODE_HERMES ? OPEN : s->mode == MODE_MISTRAL ? MISTRAL_TAG : NULL;
    if (s->mode == MODE_REQUIRED || s->mode == MODE_NAMED) region_open(s, 0, 0);
    *s_p = s;
    return FY_OK;
}

void fy_tools_stream_destroy(fy_tools_stream_t *s)
{
    if (!s) return;
    for (size_t i = 0; i < s->n; i++) call_free(&s->calls[i]);
    call_free(&s->cur);
    fy_free(s->calls);
    fy_free(s->names);
    fy_free(s);
}

size_t fy_tools_stream_content(const fy_tools_stream_t *s, const char *text)
{
    if (s->n) return s->content;
    if (s->done) return s->end; /* no call: all of it */
    if (s->mode == MODE_REQUIRED || s->mode == MODE_NAMED) return 0;
    size_t end = s->outer == O_BODY ? s->region : s->confirmed;
    return trim(text, end);
}

size_t fy_tools_stream_n_calls(const fy_tools_stream_t *s) { return s->n; }

bool fy_tools_stream_call_complete(const fy_tools_stream_t *s, size_t i) { return i < s->n && s->calls[i].complete; }

static json_t *call_json(const call_t *c, json_int_t index, bool whole)
{
    json_t *o = whole ? json_object() : json_pack("{s:I}", "index", index);
    if (!o) return NULL;
    json_object_set_new(o, "id", json_string(c->id));
    json_object_set_new(o, "type", json_string("function"));
    json_t *fn =
        json_pack("{s:s, s:s%}", "name", c->name, "arguments", whole && c->args ? c->args : "", whole ? c->ok : 0);
    if (!fn || json_object_set_new(o, "function", fn)) {
        json_decref(o);
        return NULL;
    }
    return o;
}

json_t *fy_tools_stream_calls(const fy_tools_stream_t *s)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < s->n; i++) {
        if (json_array_append_new(a, call_json(&s->calls[i], (json_int_t)i, true))) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

json_t *fy_tools_stream_deltas(fy_tools_stream_t *s)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < s->n; i++) {
        call_t *c = &s->calls[i];
        if (!c->head_sent) {
            json_array_append_new(a, call_json(c, (json_int_t)i, false));
            c->head_sent = true;
        }
        if (c->ok > c->sent) {
            json_t *d = json_pack("{s:I, s:{s:s%}}", "index", (json_int_t)i, "function", "arguments", c->args + c->sent,
                                  c->ok - c->sent);
            if (!d || json_array_append_new(a, d)) {
                json_decref(a);
                return NULL;
            }
            c->sent = c->ok;
        }
    }
    return a;
}

char *fy_tools_names(const fy_tools_req_t *t)
{
    size_t n = 1, i;
    json_t *tool;
    json_array_foreach(t->tools, i, tool) n += json_string_length(json_object_get(fn_of(t->tools, i), "name")) + 1;
    char *s = fy_malloc(n), *p = s;
    if (!s) return NULL;
    json_array_foreach(t->tools, i, tool)
    {
        json_t *name = json_object_get(fn_of(t->tools, i), "name");
        memcpy(p, json_string_value(name), json_string_length(name) + 1);
        p += json_string_length(name) + 1;
    }
    *p = 0;
    return s;
}

static fy_status_t parse_whole(fy_tools_stream_t *s, const char *text, size_t len, json_t **calls_p,
                               size_t *content_len_p)
{
    fy_status_t st = fy_tools_stream_feed(s, text, len, true);
    json_t *calls = st ? NULL : fy_tools_stream_calls(s);
    if (!st && !calls) st = FY_ERR_NOMEM;
    if (!st) {
        *calls_p = calls;
        if (content_len_p) *content_len_p = fy_tools_stream_content(s, text);
    }
    fy_tools_stream_destroy(s);
    return st;
}

fy_status_t fy_tools_parse(fy_tool_format_t fmt, const char *names, bool parallel, const char *text, size_t len,
                           json_t **calls_p, size_t *content_len_p)
{
    fy_tools_stream_t *s;
    fy_status_t st = fy_tools_stream_create(FY_TOOL_CHOICE_AUTO, fmt, NULL, names, parallel, &s);
    return st ? st : parse_whole(s, text, len, calls_p, content_len_p);
}

fy_status_t fy_tools_parse_forced(fy_tool_choice_t choice, const char *named, const char *text, size_t len,
                                  json_t **calls_p)
{
    fy_tools_stream_t *s;
    fy_status_t st = fy_tools_stream_create(choice, FY_TOOL_FORMAT_HERMES, named, NULL, true, &s);
    return st ? st : parse_whole(s, text, len, calls_p, NULL);
}

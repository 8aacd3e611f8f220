/*
 * chat.c - applies a model's chat template: a small interpreter for the
 * subset of Jinja2 that chat templates use.
 *
 * Three stages, top to bottom: a lexer that splits the source into text and
 * tag tokens with Jinja's whitespace rules as HF transformers configures
 * them (trim_blocks, lstrip_blocks, one trailing newline dropped); a
 * recursive-descent parser that builds an AST; a tree-walking evaluator
 * whose values follow Python (truthiness, str(), ==, slices, and
 * json.dumps for tojson as transformers overrides it).  Unknown tags,
 * filters, tests, functions and methods fail at parse time.
 *
 * Not a general Jinja2: no inheritance, includes, call or filter blocks,
 * recursive loops, autoescaping or string formatting; case mapping and
 * line splitting are ASCII-only.
 *
 * The template comes from a model file, so it is untrusted: nesting depth,
 * work, memory and output are bounded, and every failure becomes a status.
 * Errors unwind with longjmp to create()/apply(); nothing leaks because a
 * parse or a render allocates only from one arena, which the function that
 * called setjmp frees.
 */
#include "model/chat.h"

#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "common/log.h"
#include "common/mem.h"

#define CHAT_MAX_SOURCE ((size_t)1 << 20)   /* template bytes */
#define CHAT_MAX_DEPTH 200                  /* nesting: parse, render, values */
#define CHAT_MAX_WORK 10000000L             /* evaluation steps per render */
#define CHAT_MAX_STRING ((size_t)16 << 20)  /* any string, the output included */
#define CHAT_MAX_MEMORY ((size_t)256 << 20) /* arena bytes per template or render */
#define ARENA_CHUNK ((size_t)64 << 10)
#define NO_POS UINT32_MAX

static const char CHATML[] = "{% for message in messages %}"
                             "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
                             "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/* Gemma 3's template as google/gemma-3-*-it ship it (tokenizer_config.json):
 * for Gemma GGUF files that carry none.  A system message becomes a prefix
 * of the first user turn; the assistant is "model". */
static const char GEMMA[] =
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\\n'}}\n"
    "{%- endif -%}\n";

const char *fy_chat_template_builtin(const char *name)
{
    if (!strcmp(name, "chatml")) return CHATML;
    if (!strcmp(name, "gemma")) return GEMMA;
    return NULL;
}

/* ---- arena, errors, strings ---------------------------------------------- */

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    max_align_t data[]; /* cap bytes */
} chunk_t;

typedef struct arena {
    chunk_t *head;
    size_t total; /* bytes in chunks, at most CHAT_MAX_MEMORY */
    bool over;    /* the last failure was the limit, not malloc */
} arena_t;

static void arena_free(arena_t *a)
{
    for (chunk_t *c = a->head, *next; c; c = next) {
        next = c->next;
        fy_free(c);
    }
    a->head = NULL;
    a->total = 0;
}

static void *arena_alloc(arena_t *a, size_t size)
{
    a->over = size > CHAT_MAX_MEMORY;
    if (a->over) return NULL;
    size = FY_ALIGN_UP(size, sizeof(max_align_t));
    chunk_t *c = a->head;
    if (c && c->cap - c->used >= size) {
        void *p = (char *)c->data + c->used;
        c->used += size;
        return p;
    }
    size_t cap = FY_MAX(size, ARENA_CHUNK);
    a->over = cap > CHAT_MAX_MEMORY - a->total;
    if (a->over || !(c = fy_malloc(sizeof(*c) + cap))) return NULL;
    c->used = size;
    c->cap = cap;
    a->total += cap;
    /* a big block goes behind the head, so that the head's free space stays in use */
    if (a->head && size > ARENA_CHUNK / 2) {
        c->next = a->head->next;
        a->head->next = c;
    } else {
        c->next = a->head;
        a->head = c;
    }
    return c->data;
}

/* What parsing and rendering share: where to allocate, where to unwind. */
typedef struct ctx {
    arena_t *arena;
    const char *src; /* the normalized source, for line numbers */
    jmp_buf jmp;
    fy_status_t status;
} ctx_t;

static _Noreturn void fail(ctx_t *c, fy_status_t status, uint32_t pos, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void fail(ctx_t *c, fy_status_t status, uint32_t pos, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (pos == NO_POS) {
        fy_error("chat template: %s", msg);
    } else {
        unsigned line = 1, col = 1;
        for (uint32_t i = 0; i < pos && c->src[i]; i++) {
            if (c->src[i] == '\n')
                line++, col = 1;
            else
                col++;
        }
        fy_error("chat template: line %u, column %u: %s", line, col, msg);
    }
    c->status = status;
    longjmp(c->jmp, 1);
}

static void *alloc(ctx_t *c, size_t size)
{
    void *p = arena_alloc(c->arena, size);
    if (p) return p;
    if (c->arena->over)
        fail(c, FY_ERR_INVALID, NO_POS, "template needs more than %zu MiB of memory", CHAT_MAX_MEMORY >> 20);
    fail(c, FY_ERR_NOMEM, NO_POS, "out of memory");
}

static void *alloc_array(ctx_t *c, size_t n, size_t size)
{
    size_t total;
    if (!fy_mul_size(n, size, &total)) fail(c, FY_ERR_INVALID, NO_POS, "array too large");
    return memset(alloc(c, total), 0, total);
}

/* Room for one more of a vector's n elements (each elem bytes), in the arena. */
static void *grow(ctx_t *c, void *v, size_t n, size_t *cap, size_t elem)
{
    if (n < *cap) return v;
    size_t new_cap = *cap ? *cap * 2 : 4;
    void *nv = alloc_array(c, new_cap, elem);
    if (n) memcpy(nv, v, n * elem);
    *cap = new_cap;
    return nv;
}

typedef struct str {
    const char *p; /* not NUL-terminated */
    size_t n;
} str_t;

#define STR(lit) ((str_t){(lit), sizeof(lit) - 1})

static str_t cstr(const char *s) { return (str_t){s, strlen(s)}; }
static bool str_same(str_t a, str_t b) { return a.n == b.n && (!a.n || memcmp(a.p, b.p, a.n) == 0); }
static bool str_eq(str_t a, const char *b) { return str_same(a, cstr(b)); }

typedef struct buf {
    char *p;
    size_t n, cap;
} buf_t;

static void buf_add(ctx_t *c, buf_t *b, const char *s, size_t n)
{
    if (n > CHAT_MAX_STRING - b->n)
        fail(c, FY_ERR_INVALID, NO_POS, "a string or the output exceeds %zu MiB", CHAT_MAX_STRING >> 20);
    if (b->n + n > b->cap) {
        size_t cap = FY_MAX(FY_MAX(b->cap * 2, b->n + n), 64);
        char *p = alloc(c, cap);
        if (b->n) memcpy(p, b->p, b->n);
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
}

static void buf_str(ctx_t *c, buf_t *b, str_t s) { buf_add(c, b, s.p, s.n); }
static void buf_cstr(ctx_t *c, buf_t *b, const char *s) { buf_add(c, b, s, strlen(s)); }
static str_t buf_view(const buf_t *b) { return (str_t){b->p ? b->p : "", b->n}; }

/* ---- UTF-8 --------------------------------------------------------------- */

/* The code point at s[i] (i < n) and its length; invalid bytes decode one at a time as U+FFFD. */
static size_t utf8_char(const char *s, size_t n, size_t i, uint32_t *cp_p)
{
    const unsigned char *u = (const unsigned char *)s + i;
    uint32_t c = u[0], min;
    size_t len;
    if (c < 0x80) {
        *cp_p = c;
        return 1;
    }
    if ((c & 0xE0) == 0xC0)
        len = 2, c &= 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0)
        len = 3, c &= 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0)
        len = 4, c &= 0x07, min = 0x10000;
    else
        goto bad;
    if (len > n - i) goto bad;
    for (size_t k = 1; k < len; k++) {
        if ((u[k] & 0xC0) != 0x80) goto bad;
        c = c << 6 | (u[k] & 0x3F);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) goto bad;
    *cp_p = c;
    return len;
bad:
    *cp_p = 0xFFFD;
    return 1;
}

static void utf8_put(ctx_t *c, buf_t *b, uint32_t cp)
{
    char s[4];
    size_t n;
    if (cp < 0x80)
        s[0] = (char)cp, n = 1;
    else if (cp < 0x800)
        s[0] = (char)(0xC0 | cp >> 6), n = 2;
    else if (cp < 0x10000)
        s[0] = (char)(0xE0 | cp >> 12), n = 3;
    else
        s[0] = (char)(0xF0 | cp >> 18), n = 4;
    for (size_t k = 1; k < n; k++) s[k] = (char)(0x80 | ((cp >> (6 * (n - 1 - k))) & 0x3F));
    buf_add(c, b, s, n);
}

/* Python's str.isspace(). */
static bool is_space_cp(uint32_t c)
{
    return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1C && c <= 0x1F) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Length of the character at s[i] if it is in set (NULL: whitespace), else 0. */
static size_t char_in_at(str_t s, size_t i, const str_t *set)
{
    uint32_t cp, c2;
    size_t len = utf8_char(s.p, s.n, i, &cp);
    if (!set) return is_space_cp(cp) ? len : 0;
    for (size_t k = 0; k < set->n; k += utf8_char(set->p, set->n, k, &c2))
        if (utf8_char(set->p, set->n, k, &c2) && c2 == cp) return len;
    return 0;
}

/* Length of the character that ends at s[end] if it is in set, else 0. */
static size_t char_in_before(str_t s, size_t start, size_t end, const str_t *set)
{
    size_t j = end - 1;
    while (j > start && end - j < 4 && ((unsigned char)s.p[j] & 0xC0) == 0x80) j--;
    uint32_t cp;
    if (j + utf8_char(s.p, end, j, &cp) != end) return 0;
    return char_in_at(s, j, set);
}

static str_t str_strip(str_t s, const str_t *set, bool left, bool right)
{
    size_t a = 0, b = s.n, k;
    while (left && a < b && (k = char_in_at(s, a, set))) a += k;
    while (right && b > a && (k = char_in_before(s, a, b, set))) b -= k;
    return (str_t){s.p + a, b - a};
}

static size_t cp_count(str_t s)
{
    size_t n = 0;
    uint32_t cp;
    for (size_t i = 0; i < s.n; i += utf8_char(s.p, s.n, i, &cp)) n++;
    return n;
}

/* ---- lexer --------------------------------------------------------------- */

typedef enum tok_kind {
    TOK_EOF,
    TOK_TEXT,
    TOK_VAR_BEGIN,
    TOK_VAR_END,
    TOK_BLOCK_BEGIN,
    TOK_BLOCK_END,
    TOK_NAME,
    TOK_STRING,
    TOK_INT,
    TOK_FLOAT,
    TOK_OP,
} tok_kind_t;

typedef struct tok {
    tok_kind_t kind;
    uint32_t pos; /* byte offset in the source */
    str_t s;      /* TEXT, NAME, OP: the source; STRING: the decoded value */
    int64_t i;    /* INT */
    double f;     /* FLOAT */
} tok_t;

typedef struct node node_t;

typedef struct nodes {
    node_t **v;
    size_t n, cap;
} nodes_t;

typedef struct parser {
    ctx_t c;
    size_t len;      /* of c.src */
    arena_t *ast;    /* the template's arena, where c.arena points but in scratch_grow() */
    arena_t scratch; /* tokens and the checks below; freed after parsing */
    tok_t *toks;
    size_t n_toks, cap_toks, i;
    int depth;     /* of the recursion */
    int loops;     /* for-loops around the statement being parsed */
    nodes_t calls; /* calls of names, checked against the macros at the end */
    nodes_t macros;
} parser_t;

static void *scratch_grow(parser_t *p, void *v, size_t n, size_t *cap, size_t elem)
{
    p->c.arena = &p->scratch;
    v = grow(&p->c, v, n, cap, elem);
    p->c.arena = p->ast;
    return v;
}

static tok_t *push_tok(parser_t *p, tok_kind_t kind, size_t pos, str_t s)
{
    p->toks = scratch_grow(p, p->toks, p->n_toks, &p->cap_toks, sizeof(*p->toks));
    tok_t *t = &p->toks[p->n_toks++];
    *t = (tok_t){.kind = kind, .pos = (uint32_t)pos, .s = s};
    return t;
}

static bool is_alpha(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_'; }
static bool is_digit(char ch) { return ch >= '0' && ch <= '9'; }

static size_t space_at(const parser_t *p, size_t i)
{
    return i < p->len ? char_in_at((str_t){p->c.src, p->len}, i, NULL) : 0;
}

/* Where the text before the tag at `tag` ends once whitespace control has had its way:
 * '{%-' strips all whitespace; lstrip_blocks strips a block or comment tag's indentation. */
static size_t text_end(const parser_t *p, size_t pos, size_t tag)
{
    const char *s = p->c.src;
    str_t src = {s, p->len};
    size_t end = tag, k;
    char sign = s[tag + 2];
    if (sign == '-') {
        while (end > pos && (k = char_in_before(src, pos, end, NULL))) end -= k;
        return end;
    }
    if (sign == '+' || s[tag + 1] == '{') return end;
    while (end > pos && s[end - 1] != '\n' && (k = char_in_before(src, pos, end, NULL))) end -= k;
    bool line_start = end > pos ? s[end - 1] == '\n' : pos == 0 || s[pos - 1] == '\n';
    return line_start ? end : tag;
}

/* After a tag's end: '-' strips all whitespace; trim_blocks drops one newline after a block or comment. */
static size_t skip_after_tag(const parser_t *p, size_t pos, char sign, bool block)
{
    size_t k;
    if (sign == '-')
        while ((k = space_at(p, pos))) pos += k;
    else if (block && sign != '+' && p->c.src[pos] == '\n')
        pos++;
    return pos;
}

static uint32_t hex_value(parser_t *p, size_t pos, int digits)
{
    uint32_t v = 0;
    for (int k = 0; k < digits; k++) {
        char ch = p->c.src[pos + (size_t)k];
        int d = is_digit(ch) ? ch - '0' : (ch | 0x20) >= 'a' && (ch | 0x20) <= 'f' ? (ch | 0x20) - 'a' + 10 : -1;
        if (d < 0) fail(&p->c, FY_ERR_FORMAT, (uint32_t)pos, "invalid escape in string");
        v = v << 4 | (uint32_t)d;
    }
    if (v > 0x10FFFF) fail(&p->c, FY_ERR_FORMAT, (uint32_t)pos, "invalid escape in string");
    return v;
}

/* A quoted string with Python's escapes; returns the position after it. */
static size_t lex_string(parser_t *p, size_t pos)
{
    const char *s = p->c.src;
    char quote = s[pos];
    size_t i = pos + 1;
    buf_t b = {0};
    for (;;) {
        if (i >= p->len) fail(&p->c, FY_ERR_FORMAT, (uint32_t)pos, "unterminated string");
        char ch = s[i++];
        if (ch == quote) break;
        if (ch != '\\' || i >= p->len) {
            buf_add(&p->c, &b, &ch, 1);
            continue;
        }
        static const char esc_in[] = "ntr\\'\"abfv\n", esc_out[] = "\n\t\r\\'\"\a\b\f\v";
        const char *e = strchr(esc_in, s[i]);
        int hex = s[i] == 'x' ? 2 : s[i] == 'u' ? 4 : s[i] == 'U' ? 8 : 0;
        if (s[i] && e) {
            if (s[i] != '\n') buf_add(&p->c, &b, &esc_out[e - esc_in], 1); /* backslash-newline: nothing */
            i++;
        } else if (hex) {
            utf8_put(&p->c, &b, hex_value(p, i + 1, hex));
            i += 1 + (size_t)hex;
        } else {
            buf_add(&p->c, &b, "\\", 1); /* Python keeps unknown escapes */
        }
    }
    push_tok(p, TOK_STRING, pos, buf_view(&b));
    return i;
}

static size_t lex_number(parser_t *p, size_t pos)
{
    const char *s = p->c.src;
    size_t i = pos;
    bool is_float = false;
    const tok_t *prev = &p->toks[p->n_toks - 1]; /* there is always a '{{' or '{%' before */
    while (is_digit(s[i])) i++;
    bool after_dot = prev->kind == TOK_OP && str_eq(prev->s, "."); /* x.0.1 is two subscripts */
    if (s[i] == '.' && is_digit(s[i + 1]) && !after_dot)
        for (i++, is_float = true; is_digit(s[i]); i++) {}
    if (s[i] == 'e' || s[i] == 'E') {
        size_t j = i + 1 + (s[i + 1] == '+' || s[i + 1] == '-');
        if (is_digit(s[j]))
            for (i = j, is_float = true; is_digit(s[i]); i++) {}
    }
    tok_t *t = push_tok(p, is_float ? TOK_FLOAT : TOK_INT, pos, (str_t){s + pos, i - pos});
    char *end;
    errno = 0;
    if (is_float)
        t->f = strtod(s + pos, &end);
    else
        t->i = strtoll(s + pos, &end, 10);
    if (errno || end != s + i) fail(&p->c, FY_ERR_FORMAT, (uint32_t)pos, "number out of range");
    return i;
}

/* One token inside a tag; depth counts open brackets, inside which '}}' and '%}' are not ends. */
static size_t lex_expr_token(parser_t *p, size_t pos, int *depth)
{
    static const char *const ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                      ">",  "=",  "(",  ")",  "[",  "]",  "{", "}", ".", ",", ":", "|"};
    const char *s = p->c.src;
    if (is_alpha(s[pos])) {
        size_t i = pos;
        while (is_alpha(s[i]) || is_digit(s[i])) i++;
        push_tok(p, TOK_NAME, pos, (str_t){s + pos, i - pos});
        return i;
    }
    if (is_digit(s[pos])) return lex_number(p, pos);
    if (s[pos] == '\'' || s[pos] == '"') return lex_string(p, pos);
    for (size_t k = 0; k < FY_ARRAY_LEN(ops); k++) {
        size_t n = strlen(ops[k]);
        if (strncmp(s + pos, ops[k], n) != 0) continue;
        if (strchr("([{", s[pos])) ++*depth;
        if (strchr(")]}", s[pos]) && --*depth < 0) fail(&p->c, FY_ERR_FORMAT, (uint32_t)pos, "unexpected '%c'", s[pos]);
        push_tok(p, TOK_OP, pos, (str_t){s + pos, n});
        return pos + n;
    }
    unsigned char ch = (unsigned char)s[pos];
    if (ch >= 0x20 && ch < 0x7F) fail(&p->c, FY_ERR_FORMAT, (uint32_t)pos, "unexpected character '%c'", ch);
    fail(&p->c, FY_ERR_FORMAT, (uint32_t)pos, "unexpected byte 0x%02x", ch);
}

/* A '{{ ... }}' or '{% ... %}' tag at pos; returns the position after it. */
static size_t lex_tag(parser_t *p, size_t pos)
{
    const char *s = p->c.src;
    bool block = s[pos + 1] == '%';
    push_tok(p, block ? TOK_BLOCK_BEGIN : TOK_VAR_BEGIN, pos, STR(""));
    size_t i = pos + 2, k;
    if (s[i] == '-' || (block && s[i] == '+')) i++;
    for (int depth = 0;;) {
        while ((k = space_at(p, i))) i += k;
        if (i >= p->len) fail(&p->c, FY_ERR_FORMAT, (uint32_t)pos, "'%s' is never closed", block ? "{%" : "{{");
        size_t q = i + (s[i] == '-' || (block && s[i] == '+'));
        if (depth == 0 && s[q] == (block ? '%' : '}') && s[q + 1] == '}') {
            push_tok(p, block ? TOK_BLOCK_END : TOK_VAR_END, i, STR(""));
            return skip_after_tag(p, q + 2, q > i ? s[i] : 0, block);
        }
        i = lex_expr_token(p, i, &depth);
    }
}

static size_t lex_comment(parser_t *p, size_t pos)
{
    const char *s = p->c.src;
    size_t body = pos + 2 + (s[pos + 2] == '-' || s[pos + 2] == '+');
    const char *end = strstr(s + body, "#}");
    if (!end) fail(&p->c, FY_ERR_FORMAT, (uint32_t)pos, "unterminated comment");
    size_t e = (size_t)(end - s);
    return skip_after_tag(p, e + 2, e > body ? s[e - 1] : 0, true);
}

static void lex(parser_t *p)
{
    const char *s = p->c.src;
    size_t pos = 0;
    while (pos < p->len) {
        size_t tag = pos;
        while (tag + 1 < p->len && !(s[tag] == '{' && strchr("{%#", s[tag + 1]))) tag++; /* s[tag + 1] is not NUL */
        if (tag + 1 >= p->len) tag = p->len;
        size_t end = tag < p->len ? text_end(p, pos, tag) : tag;
        if (end > pos) push_tok(p, TOK_TEXT, pos, (str_t){s + pos, end - pos});
        if (tag == p->len) break;
        pos = s[tag + 1] == '#' ? lex_comment(p, tag) : lex_tag(p, tag);
    }
    push_tok(p, TOK_EOF, p->len, STR(""));
}

/* ---- AST and builtins ---------------------------------------------------- */

typedef enum vtype { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_MACRO, V_FUNC } vtype_t;

typedef struct list list_t;
typedef struct dict dict_t;

typedef struct val {
    vtype_t t;
    union {
        bool b;
        int64_t i;
        double f;
        str_t s; /* V_STR; V_UNDEF: the name it was looked up by, for messages */
        list_t *l;
        dict_t *d;
        const node_t *m; /* V_MACRO */
        int fn;          /* V_FUNC */
    } u;
} val_t;

struct list {
    val_t *v;
    size_t n, cap;
    bool tuple; /* prints as (a, b) */
};

typedef struct entry {
    str_t k;
    val_t v;
} entry_t;

struct dict { /* insertion-ordered, string keys */
    entry_t *e;
    size_t n, cap;
    bool ns; /* a namespace(): the one kind 'set x.y = ...' may change */
};

typedef enum node_kind {
    N_TEXT,   /* lit */
    N_OUTPUT, /* {{ a }} */
    N_IF,     /* args: N_BRANCH nodes */
    N_BRANCH, /* if a (NULL: else): body */
    N_FOR,    /* for name[, name2] in a [if b]: body, else_body */
    N_SET,    /* set name[.name2] = a, or to the rendered body */
    N_MACRO,  /* macro name(args: E_KWARG with default a or NULL): body */
    N_BREAK,
    N_CONTINUE,
    N_BLOCK,  /* body (generation) */
    E_LIT,    /* lit */
    E_NAME,   /* name */
    E_LIST,   /* args */
    E_TUPLE,  /* args */
    E_DICT,   /* args: key, value, key, value, ... */
    E_ATTR,   /* a.name */
    E_INDEX,  /* a[b] */
    E_SLICE,  /* a[b:c:d], each of b, c, d may be NULL */
    E_UNARY,  /* op a */
    E_BINARY, /* a op b */
    E_COND,   /* a if b else c (c may be NULL) */
    E_FILTER, /* a | op(args), args bound to the filter's parameters */
    E_TEST,   /* a is [not] op(args) */
    E_METHOD, /* a.name(args) */
    E_FUNC,   /* builtin op(args) */
    E_CALL,   /* macro name(args: positional, then E_KWARG) */
    E_KWARG,  /* name=a */
} node_kind_t;

struct node {
    node_kind_t kind;
    uint32_t pos;
    int op; /* an op_t, or a builtin's id */
    bool negate;
    str_t name, name2;
    val_t lit;
    node_t *a, *b, *c, *d;
    nodes_t args, body, else_body;
};

typedef enum op {
    OP_OR,
    OP_AND,
    OP_NOT,
    OP_EQ,
    OP_NE,
    OP_LT,
    OP_GT,
    OP_LE,
    OP_GE,
    OP_IN,
    OP_NOT_IN,
    OP_ADD,
    OP_SUB,
    OP_CONCAT,
    OP_MUL,
    OP_DIV,
    OP_FLOORDIV,
    OP_MOD,
    OP_POW,
    OP_NEG,
    OP_POS,
} op_t;

static const struct {
    const char *s;
    op_t op;
} binops[] = {
    {"==", OP_EQ}, {"!=", OP_NE},    {"<", OP_LT},  {">", OP_GT},  {"<=", OP_LE},       {">=", OP_GE}, {"+", OP_ADD},
    {"-", OP_SUB}, {"~", OP_CONCAT}, {"*", OP_MUL}, {"/", OP_DIV}, {"//", OP_FLOORDIV}, {"%", OP_MOD}, {"**", OP_POW},
};

/* A filter, test, function or method: arguments are bound to params at parse time. */
typedef struct builtin {
    const char *name;
    int id;
    int min;               /* required arguments; -1: any keyword arguments, no others */
    const char *params[4]; /* in positional order; NULL-terminated */
} builtin_t;

enum {
    F_TRIM,
    F_LENGTH,
    F_UPPER,
    F_LOWER,
    F_CAPITALIZE,
    F_DEFAULT,
    F_TOJSON,
    F_FIRST,
    F_LAST,
    F_JOIN,
    F_REPLACE,
    F_STRING,
    F_INT,
    F_SAFE,
    F_ITEMS,
    F_LIST,
    F_SELECTATTR,
    F_REJECTATTR,
    F_SELECT,
    F_REJECT,
    F_MAP,
    F_DICTSORT,
    F_INDENT,
};

static const builtin_t filters[] = {
    {"trim", F_TRIM, 0, {"chars"}},
    {"length", F_LENGTH, 0, {NULL}},
    {"count", F_LENGTH, 0, {NULL}},
    {"upper", F_UPPER, 0, {NULL}},
    {"lower", F_LOWER, 0, {NULL}},
    {"capitalize", F_CAPITALIZE, 0, {NULL}},
    {"first", F_FIRST, 0, {NULL}},
    {"last", F_LAST, 0, {NULL}},
    {"string", F_STRING, 0, {NULL}},
    {"int", F_INT, 0, {"default"}},
    {"safe", F_SAFE, 0, {NULL}},
    {"items", F_ITEMS, 0, {NULL}},
    {"list", F_LIST, 0, {NULL}},
    {"dictsort", F_DICTSORT, 0, {NULL}},
    {"join", F_JOIN, 0, {"d", "attribute"}},
    {"default", F_DEFAULT, 0, {"default_value", "boolean"}},
    {"d", F_DEFAULT, 0, {"default_value", "boolean"}},
    {"tojson", F_TOJSON, 0, {"ensure_ascii", "indent"}},
    {"replace", F_REPLACE, 2, {"old", "new", "count"}},
    {"selectattr", F_SELECTATTR, 1, {"attribute", "test", "value"}},
    {"rejectattr", F_REJECTATTR, 1, {"attribute", "test", "value"}},
    {"select", F_SELECT, 0, {"test", "value"}},
    {"reject", F_REJECT, 0, {"test", "value"}},
    {"map", F_MAP, 0, {"filter", "attribute", "default"}},
    {"indent", F_INDENT, 0, {"width", "first", "blank"}},
};

enum {
    T_DEFINED,
    T_UNDEFINED,
    T_NONE,
    T_STRING,
    T_MAPPING,
    T_ITERABLE,
    T_SEQUENCE,
    T_NUMBER,
    T_INTEGER,
    T_FLOAT,
    T_BOOLEAN,
    T_TRUE,
    T_FALSE,
    T_EQ,
    T_NE,
    T_ODD,
    T_EVEN,
};

static const builtin_t tests[] = {
    {"defined", T_DEFINED, 0, {NULL}},   {"undefined", T_UNDEFINED, 0, {NULL}},
    {"none", T_NONE, 0, {NULL}},         {"string", T_STRING, 0, {NULL}},
    {"mapping", T_MAPPING, 0, {NULL}},   {"iterable", T_ITERABLE, 0, {NULL}},
    {"sequence", T_SEQUENCE, 0, {NULL}}, {"number", T_NUMBER, 0, {NULL}},
    {"integer", T_INTEGER, 0, {NULL}},   {"float", T_FLOAT, 0, {NULL}},
    {"boolean", T_BOOLEAN, 0, {NULL}},   {"true", T_TRUE, 0, {NULL}},
    {"false", T_FALSE, 0, {NULL}},       {"equalto", T_EQ, 1, {"other"}},
    {"eq", T_EQ, 1, {"other"}},          {"sameas", T_EQ, 1, {"other"}},
    {"ne", T_NE, 1, {"other"}},          {"odd", T_ODD, 0, {NULL}},
    {"even", T_EVEN, 0, {NULL}},
};

enum { FN_RANGE, FN_NAMESPACE, FN_RAISE, FN_STRFTIME };

static const builtin_t functions[] = {
    {"range", FN_RANGE, 1, {"start", "stop", "step"}},
    {"namespace", FN_NAMESPACE, -1, {NULL}},
    {"raise_exception", FN_RAISE, 1, {"message"}},
    {"strftime_now", FN_STRFTIME, 1, {"format"}},
};

enum {
    M_STRIP,
    M_LSTRIP,
    M_RSTRIP,
    M_STARTSWITH,
    M_ENDSWITH,
    M_SPLIT,
    M_UPPER,
    M_LOWER,
    M_TITLE,
    M_CAPITALIZE,
    M_REPLACE,
    M_GET,
    M_ITEMS,
    M_KEYS,
};

static const builtin_t methods[] = {
    {"strip", M_STRIP, 0, {"chars"}},        {"lstrip", M_LSTRIP, 0, {"chars"}},
    {"rstrip", M_RSTRIP, 0, {"chars"}},      {"startswith", M_STARTSWITH, 1, {"prefix"}},
    {"endswith", M_ENDSWITH, 1, {"suffix"}}, {"split", M_SPLIT, 0, {"sep", "maxsplit"}},
    {"upper", M_UPPER, 0, {NULL}},           {"lower", M_LOWER, 0, {NULL}},
    {"title", M_TITLE, 0, {NULL}},           {"capitalize", M_CAPITALIZE, 0, {NULL}},
    {"get", M_GET, 1, {"key", "default"}},   {"replace", M_REPLACE, 2, {"old", "new", "count"}},
    {"items", M_ITEMS, 0, {NULL}},           {"keys", M_KEYS, 0, {NULL}},
};

#define MAX_PARAMS 4

static const builtin_t *find_builtin(const builtin_t *table, size_t n, str_t name)
{
    for (size_t k = 0; k < n; k++)
        if (str_eq(name, table[k].name)) return &table[k];
    return NULL;
}

/* ---- parser -------------------------------------------------------------- */

struct fy_chat_template {
    arena_t arena; /* the source, the AST, bos and eos */
    const char *src;
    nodes_t body;
    str_t bos, eos;
};

static const tok_t *cur(const parser_t *p) { return &p->toks[p->i]; }
static const tok_t *peek(const parser_t *p) { return &p->toks[p->i + (cur(p)->kind != TOK_EOF)]; }
static const tok_t *take(parser_t *p) { return &p->toks[cur(p)->kind != TOK_EOF ? p->i++ : p->i]; }
static bool is_op(const tok_t *t, const char *op) { return t->kind == TOK_OP && str_eq(t->s, op); }
static bool is_kw(const tok_t *t, const char *kw) { return t->kind == TOK_NAME && str_eq(t->s, kw); }

static bool accept_op(parser_t *p, const char *op)
{
    if (!is_op(cur(p), op)) return false;
    p->i++;
    return true;
}

static bool accept_kw(parser_t *p, const char *kw)
{
    if (!is_kw(cur(p), kw)) return false;
    p->i++;
    return true;
}

static _Noreturn void unexpected(parser_t *p, const char *expected)
{
    const tok_t *t = cur(p);
    static const char *const names[] = {"end of template", "text",     "'{{'",     "'}}'", "'{%'", "'%}'", "",
                                        "a string",        "a number", "a number", ""};
    char got[80];
    if (t->kind == TOK_NAME || t->kind == TOK_OP)
        snprintf(got, sizeof(got), "'%.*s'", (int)FY_MIN(t->s.n, 40), t->s.p);
    else
        snprintf(got, sizeof(got), "%s", names[t->kind]);
    if (expected) fail(&p->c, FY_ERR_FORMAT, t->pos, "expected %s, got %s", expected, got);
    fail(&p->c, FY_ERR_FORMAT, t->pos, "unexpected %s", got);
}

static void expect_op(parser_t *p, const char *op)
{
    if (accept_op(p, op)) return;
    char what[8];
    snprintf(what, sizeof(what), "'%s'", op);
    unexpected(p, what);
}

static void expect_kind(parser_t *p, tok_kind_t kind, const char *what)
{
    if (cur(p)->kind != kind) unexpected(p, what);
    p->i++;
}

static str_t expect_name(parser_t *p)
{
    if (cur(p)->kind != TOK_NAME) unexpected(p, "a name");
    return take(p)->s;
}

static void enter(parser_t *p)
{
    if (++p->depth > CHAT_MAX_DEPTH)
        fail(&p->c, FY_ERR_UNSUPPORTED, cur(p)->pos, "nested deeper than %d levels", CHAT_MAX_DEPTH);
}

static node_t *mk(parser_t *p, node_kind_t kind, uint32_t pos)
{
    node_t *n = alloc_array(&p->c, 1, sizeof(*n));
    n->kind = kind;
    n->pos = pos;
    return n;
}

static void push_node(ctx_t *c, nodes_t *v, node_t *n)
{
    v->v = grow(c, v->v, v->n, &v->cap, sizeof(*v->v));
    v->v[v->n++] = n;
}

static node_t *parse_expr(parser_t *p);
static node_t *parse_cond(parser_t *p, bool with_cond);
static node_t *parse_unary(parser_t *p, bool with_filters);

/* '(' already taken: positional arguments, then name=value ones, up to ')'. */
static void parse_args(parser_t *p, nodes_t *args)
{
    bool kw = false;
    while (!accept_op(p, ")")) {
        if (args->n) expect_op(p, ",");
        if (accept_op(p, ")")) break;
        if (cur(p)->kind == TOK_NAME && is_op(peek(p), "=")) {
            node_t *k = mk(p, E_KWARG, cur(p)->pos);
            k->name = take(p)->s;
            take(p);
            k->a = parse_expr(p);
            push_node(&p->c, args, k);
            kw = true;
        } else {
            if (kw) fail(&p->c, FY_ERR_FORMAT, cur(p)->pos, "positional argument after a keyword argument");
            push_node(&p->c, args, parse_expr(p));
        }
    }
}

/* Orders a builtin's arguments by its parameters: slot k is the argument for params[k], or NULL. */
static void bind_args(parser_t *p, const char *what, const builtin_t *b, nodes_t *args, uint32_t pos)
{
    size_t n_params = 0;
    while (n_params < MAX_PARAMS && b->params[n_params]) n_params++;
    node_t **slots = alloc_array(&p->c, MAX_PARAMS, sizeof(*slots));
    for (size_t k = 0, n_pos = 0; k < args->n; k++) {
        node_t *arg = args->v[k];
        bool kw = arg->kind == E_KWARG;
        if (b->min < 0 && !kw) fail(&p->c, FY_ERR_FORMAT, arg->pos, "%s '%s' takes keyword arguments", what, b->name);
        if (b->min < 0) continue;
        size_t slot = kw ? 0 : n_pos++;
        while (kw && slot < n_params && !str_eq(arg->name, b->params[slot])) slot++;
        if (slot >= n_params && kw)
            fail(&p->c, FY_ERR_UNSUPPORTED, arg->pos, "%s '%s' has no argument '%.*s'", what, b->name, (int)arg->name.n,
                 arg->name.p);
        if (slot >= n_params)
            fail(&p->c, FY_ERR_FORMAT, arg->pos, "%s '%s' takes at most %zu arguments", what, b->name, n_params);
        if (slots[slot]) fail(&p->c, FY_ERR_FORMAT, arg->pos, "%s '%s' got '%s' twice", what, b->name, b->params[slot]);
        slots[slot] = kw ? arg->a : arg;
    }
    for (int k = 0; k < b->min; k++)
        if (!slots[k]) fail(&p->c, FY_ERR_FORMAT, pos, "%s '%s' needs %d arguments", what, b->name, b->min);
    if (b->min < 0) return;
    args->v = slots;
    args->n = n_params;
}

/* Comma-separated items of n (a list, tuple or dict) after those it has, up to close. */
static node_t *parse_items(parser_t *p, node_t *n, const char *close)
{
    node_kind_t kind = n->kind;
    while (!accept_op(p, close)) {
        if (n->args.n) expect_op(p, ",");
        if (accept_op(p, close)) break;
        push_node(&p->c, &n->args, parse_expr(p));
        if (kind == E_DICT) {
            expect_op(p, ":");
            push_node(&p->c, &n->args, parse_expr(p));
        }
    }
    return n;
}

static node_t *parse_primary(parser_t *p)
{
    const tok_t *t = take(p);
    node_t *n;
    switch (t->kind) {
    case TOK_NAME:
        n = mk(p, E_LIT, t->pos);
        if (str_eq(t->s, "true") || str_eq(t->s, "True"))
            n->lit = (val_t){V_BOOL, {.b = true}};
        else if (str_eq(t->s, "false") || str_eq(t->s, "False"))
            n->lit = (val_t){V_BOOL, {.b = false}};
        else if (str_eq(t->s, "none") || str_eq(t->s, "None"))
            n->lit = (val_t){V_NONE, {0}};
        else
            n->kind = E_NAME, n->name = t->s;
        return n;
    case TOK_STRING: {
        buf_t b = {0}; /* adjacent literals concatenate */
        buf_str(&p->c, &b, t->s);
        while (cur(p)->kind == TOK_STRING) buf_str(&p->c, &b, take(p)->s);
        n = mk(p, E_LIT, t->pos);
        n->lit = (val_t){V_STR, {.s = buf_view(&b)}};
        return n;
    }
    case TOK_INT:
    case TOK_FLOAT:
        n = mk(p, E_LIT, t->pos);
        n->lit = t->kind == TOK_INT ? (val_t){V_INT, {.i = t->i}} : (val_t){V_FLOAT, {.f = t->f}};
        return n;
    case TOK_OP:
        if (str_eq(t->s, "[")) return parse_items(p, mk(p, E_LIST, t->pos), "]");
        if (str_eq(t->s, "{")) return parse_items(p, mk(p, E_DICT, t->pos), "}");
        if (str_eq(t->s, "(")) { /* a parenthesized expression, or a tuple */
            if (accept_op(p, ")")) return mk(p, E_TUPLE, t->pos);
            n = parse_expr(p);
            if (accept_op(p, ")")) return n;
            node_t *tuple = mk(p, E_TUPLE, t->pos);
            push_node(&p->c, &tuple->args, n);
            return parse_items(p, tuple, ")");
        }
        break;
    default: break;
    }
    p->i--;
    unexpected(p, NULL);
}

static node_t *parse_call(parser_t *p, node_t *callee)
{
    uint32_t pos = cur(p)->pos;
    nodes_t args = {0};
    parse_args(p, &args);
    const builtin_t *b;
    node_t *n = mk(p, E_CALL, callee->pos);
    n->args = args;
    if (callee->kind == E_ATTR) {
        if (!(b = find_builtin(methods, FY_ARRAY_LEN(methods), callee->name)))
            fail(&p->c, FY_ERR_UNSUPPORTED, callee->pos, "unknown method '%.*s'", (int)callee->name.n, callee->name.p);
        n->kind = E_METHOD;
        n->a = callee->a;
        n->op = b->id;
        bind_args(p, "method", b, &n->args, pos);
    } else if (callee->kind == E_NAME && (b = find_builtin(functions, FY_ARRAY_LEN(functions), callee->name))) {
        n->kind = E_FUNC;
        n->op = b->id;
        bind_args(p, "function", b, &n->args, pos);
    } else if (callee->kind == E_NAME) {
        p->calls.v = scratch_grow(p, p->calls.v, p->calls.n, &p->calls.cap, sizeof(node_t *));
        p->calls.v[p->calls.n++] = n;
    } else {
        fail(&p->c, FY_ERR_UNSUPPORTED, pos, "only names, methods and macros can be called");
    }
    n->name = callee->name;
    return n;
}

static node_t *parse_subscript(parser_t *p, node_t *obj, uint32_t pos)
{
    node_t *n = mk(p, E_INDEX, pos), *parts[3] = {NULL, NULL, NULL};
    n->a = obj;
    int colons = 0;
    while (!accept_op(p, "]")) {
        if (accept_op(p, ":")) {
            if (++colons > 2) unexpected(p, "']'");
            continue;
        }
        if (parts[colons]) unexpected(p, colons < 2 ? "':' or ']'" : "']'");
        parts[colons] = parse_expr(p);
    }
    if (!colons && !parts[0]) fail(&p->c, FY_ERR_FORMAT, pos, "empty subscript");
    if (colons)
        n->kind = E_SLICE, n->b = parts[0], n->c = parts[1], n->d = parts[2];
    else
        n->b = parts[0];
    return n;
}

static node_t *parse_postfix(parser_t *p, node_t *n)
{
    for (;;) {
        uint32_t pos = cur(p)->pos;
        if (accept_op(p, ".")) {
            node_t *a = mk(p, E_ATTR, pos);
            a->a = n;
            if (cur(p)->kind == TOK_INT) { /* x.0 is x[0] */
                a->kind = E_INDEX;
                a->b = mk(p, E_LIT, pos);
                a->b->lit = (val_t){V_INT, {.i = take(p)->i}};
            } else {
                a->name = expect_name(p);
            }
            n = a;
        } else if (accept_op(p, "[")) {
            n = parse_subscript(p, n, pos);
        } else if (accept_op(p, "(")) {
            n = parse_call(p, n);
        } else {
            return n;
        }
    }
}

/* Filters (a | f(x)) and tests (a is [not] t x), which bind tighter than any operator. */
static node_t *parse_filters(parser_t *p, node_t *n)
{
    for (;;) {
        bool filter = is_op(cur(p), "|");
        if (!filter && !is_kw(cur(p), "is")) return n;
        node_t *f = mk(p, filter ? E_FILTER : E_TEST, take(p)->pos);
        f->a = n;
        f->negate = !filter && accept_kw(p, "not");
        uint32_t pos = cur(p)->pos;
        str_t name = expect_name(p);
        const builtin_t *b = filter ? find_builtin(filters, FY_ARRAY_LEN(filters), name)
                                    : find_builtin(tests, FY_ARRAY_LEN(tests), name);
        const char *what = filter ? "filter" : "test";
        if (!b) fail(&p->c, FY_ERR_UNSUPPORTED, pos, "unknown %s '%.*s'", what, (int)name.n, name.p);
        f->op = b->id;
        if (accept_op(p, "(")) {
            parse_args(p, &f->args);
        } else if (!filter && b->min) { /* 'x is equalto 3': one argument without parentheses */
            push_node(&p->c, &f->args, parse_postfix(p, parse_primary(p)));
        }
        bind_args(p, what, b, &f->args, pos);
        n = parse_postfix(p, f);
    }
}

static node_t *parse_unary(parser_t *p, bool with_filters)
{
    enter(p);
    node_t *n;
    if (is_op(cur(p), "-") || is_op(cur(p), "+")) {
        n = mk(p, E_UNARY, cur(p)->pos);
        n->op = take(p)->s.p[0] == '-' ? OP_NEG : OP_POS;
        n->a = parse_unary(p, false);
    } else {
        n = parse_primary(p);
    }
    n = parse_postfix(p, n);
    if (with_filters) n = parse_filters(p, n);
    p->depth--;
    return n;
}

static node_t *binary(parser_t *p, op_t op, node_t *a, node_t *b)
{
    node_t *n = mk(p, E_BINARY, a->pos);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static op_t match_binop(const tok_t *t)
{
    for (size_t k = 0; t->kind == TOK_OP && k < FY_ARRAY_LEN(binops); k++)
        if (str_eq(t->s, binops[k].s)) return binops[k].op;
    return OP_OR; /* none */
}

/* Arithmetic, loosest first: + -, then ~, then * / // %, then **; all left-associative as in Jinja. */
static node_t *parse_arith(parser_t *p, int level)
{
    static const op_t first[] = {OP_ADD, OP_CONCAT, OP_MUL, OP_POW}, last[] = {OP_SUB, OP_CONCAT, OP_MOD, OP_POW};
    if (level == 4) return parse_unary(p, true);
    node_t *n = parse_arith(p, level + 1);
    for (op_t op; (op = match_binop(cur(p))) >= first[level] && op <= last[level];) {
        take(p);
        n = binary(p, op, n, parse_arith(p, level + 1));
    }
    return n;
}

static node_t *parse_compare(parser_t *p)
{
    node_t *n = parse_arith(p, 0);
    for (int count = 0;; count++) {
        op_t op = match_binop(cur(p));
        if (op >= OP_EQ && op <= OP_GE)
            take(p);
        else if (accept_kw(p, "in"))
            op = OP_IN;
        else if (is_kw(cur(p), "not") && is_kw(peek(p), "in"))
            op = OP_NOT_IN, p->i += 2;
        else
            return n;
        if (count) fail(&p->c, FY_ERR_UNSUPPORTED, n->pos, "chained comparisons are not supported");
        n = binary(p, op, n, parse_arith(p, 0));
    }
}

static node_t *parse_not(parser_t *p)
{
    if (!is_kw(cur(p), "not")) return parse_compare(p);
    enter(p);
    node_t *n = mk(p, E_UNARY, take(p)->pos);
    n->op = OP_NOT;
    n->a = parse_not(p);
    p->depth--;
    return n;
}

static node_t *parse_and(parser_t *p)
{
    node_t *n = parse_not(p);
    while (accept_kw(p, "and")) n = binary(p, OP_AND, n, parse_not(p));
    return n;
}

static node_t *parse_or(parser_t *p)
{
    node_t *n = parse_and(p);
    while (accept_kw(p, "or")) n = binary(p, OP_OR, n, parse_and(p));
    return n;
}

/* 'a if b else c'; a for-loop's iterable is parsed without it, so that its 'if' filters. */
static node_t *parse_cond(parser_t *p, bool with_cond)
{
    enter(p);
    node_t *n = parse_or(p);
    while (with_cond && accept_kw(p, "if")) {
        node_t *c = mk(p, E_COND, n->pos);
        c->a = n;
        c->b = parse_or(p);
        if (accept_kw(p, "else")) c->c = parse_cond(p, true);
        n = c;
    }
    p->depth--;
    return n;
}

static node_t *parse_expr(parser_t *p) { return parse_cond(p, true); }

static int parse_body(parser_t *p, nodes_t *body, const char *const *ends, const tok_t *opener);

static void expect_block_end(parser_t *p) { expect_kind(p, TOK_BLOCK_END, "'%}'"); }

/* Parses up to the end tag, which must be one of ends; returns which. */
static int parse_until(parser_t *p, nodes_t *body, const tok_t *opener, const char *e1, const char *e2, const char *e3)
{
    const char *const ends[] = {e1, e2, e3, NULL};
    return parse_body(p, body, ends, opener);
}

static node_t *parse_if(parser_t *p, const tok_t *opener)
{
    node_t *n = mk(p, N_IF, opener->pos);
    for (int end = 0; end != 2;) { /* what ended the last branch: 0 elif, 1 else, 2 endif */
        node_t *br = mk(p, N_BRANCH, cur(p)->pos);
        if (end == 0) br->a = parse_expr(p);
        expect_block_end(p);
        push_node(&p->c, &n->args, br);
        end = br->a ? parse_until(p, &br->body, opener, "elif", "else", "endif")
                    : parse_until(p, &br->body, opener, "endif", NULL, NULL) + 2;
    }
    expect_block_end(p);
    return n;
}

static node_t *parse_for(parser_t *p, const tok_t *opener)
{
    node_t *n = mk(p, N_FOR, opener->pos);
    n->name = expect_name(p);
    if (accept_op(p, ",")) n->name2 = expect_name(p);
    if (!accept_kw(p, "in")) unexpected(p, "'in'");
    n->a = parse_cond(p, false);
    if (accept_kw(p, "if")) n->b = parse_expr(p);
    if (is_kw(cur(p), "recursive")) fail(&p->c, FY_ERR_UNSUPPORTED, cur(p)->pos, "recursive loops are not supported");
    expect_block_end(p);
    p->loops++;
    if (parse_until(p, &n->body, opener, "else", "endfor", NULL) == 0) {
        expect_block_end(p);
        parse_until(p, &n->else_body, opener, "endfor", NULL, NULL);
    }
    p->loops--;
    expect_block_end(p);
    return n;
}

static node_t *parse_set(parser_t *p, const tok_t *opener)
{
    node_t *n = mk(p, N_SET, opener->pos);
    n->name = expect_name(p);
    if (accept_op(p, ".")) n->name2 = expect_name(p);
    if (is_op(cur(p), ",")) fail(&p->c, FY_ERR_UNSUPPORTED, cur(p)->pos, "'set' with several targets is not supported");
    if (accept_op(p, "=")) {
        n->a = parse_expr(p);
        expect_block_end(p);
        return n;
    }
    if (n->name2.n) unexpected(p, "'='");
    expect_block_end(p); /* {% set x %}...{% endset %} */
    parse_until(p, &n->body, opener, "endset", NULL, NULL);
    expect_block_end(p);
    return n;
}

static node_t *parse_macro(parser_t *p, const tok_t *opener)
{
    node_t *n = mk(p, N_MACRO, opener->pos);
    n->name = expect_name(p);
    expect_op(p, "(");
    while (!accept_op(p, ")")) {
        if (n->args.n) expect_op(p, ",");
        node_t *param = mk(p, E_KWARG, cur(p)->pos);
        param->name = expect_name(p);
        if (accept_op(p, "=")) param->a = parse_expr(p);
        push_node(&p->c, &n->args, param);
    }
    expect_block_end(p);
    p->macros.v = scratch_grow(p, p->macros.v, p->macros.n, &p->macros.cap, sizeof(node_t *));
    p->macros.v[p->macros.n++] = n;
    int loops = p->loops;
    p->loops = 0; /* break and continue do not cross a macro */
    parse_until(p, &n->body, opener, "endmacro", NULL, NULL);
    p->loops = loops;
    expect_block_end(p);
    return n;
}

/* After '{%' and the tag's name. */
static node_t *parse_statement(parser_t *p, const tok_t *opener, str_t name)
{
    if (str_eq(name, "if")) return parse_if(p, opener);
    if (str_eq(name, "for")) return parse_for(p, opener);
    if (str_eq(name, "set")) return parse_set(p, opener);
    if (str_eq(name, "macro")) return parse_macro(p, opener);
    if (str_eq(name, "break") || str_eq(name, "continue")) {
        if (!p->loops) fail(&p->c, FY_ERR_FORMAT, opener->pos, "'%.*s' outside a loop", (int)name.n, name.p);
        expect_block_end(p);
        return mk(p, name.p[0] == 'b' ? N_BREAK : N_CONTINUE, opener->pos);
    }
    if (str_eq(name, "generation")) { /* transformers' marker for assistant tokens; no effect on text */
        node_t *n = mk(p, N_BLOCK, opener->pos);
        expect_block_end(p);
        parse_until(p, &n->body, opener, "endgeneration", NULL, NULL);
        expect_block_end(p);
        return n;
    }
    bool closer = (name.n > 3 && !memcmp(name.p, "end", 3)) || str_eq(name, "else") || str_eq(name, "elif");
    fail(&p->c, closer ? FY_ERR_FORMAT : FY_ERR_UNSUPPORTED, opener->pos, "%s tag '%.*s'",
         closer ? "unexpected" : "unsupported", (int)name.n, name.p);
}

static int parse_body(parser_t *p, nodes_t *body, const char *const *ends, const tok_t *opener)
{
    enter(p);
    for (;;) {
        const tok_t *t = take(p);
        if (t->kind == TOK_TEXT) {
            node_t *n = mk(p, N_TEXT, t->pos);
            n->lit = (val_t){V_STR, {.s = t->s}};
            push_node(&p->c, body, n);
        } else if (t->kind == TOK_VAR_BEGIN) {
            node_t *n = mk(p, N_OUTPUT, t->pos);
            n->a = parse_expr(p);
            expect_kind(p, TOK_VAR_END, "'}}'");
            push_node(&p->c, body, n);
        } else if (t->kind == TOK_BLOCK_BEGIN) {
            str_t name = expect_name(p);
            for (int k = 0; ends && ends[k]; k++) {
                if (str_eq(name, ends[k])) {
                    p->depth--;
                    return k;
                }
            }
            push_node(&p->c, body, parse_statement(p, t, name));
        } else if (t->kind == TOK_EOF && !ends) {
            p->depth--;
            return 0;
        } else if (t->kind == TOK_EOF) {
            const char *last = ends[0];
            for (int k = 1; ends[k]; k++) last = ends[k];
            const tok_t *name = opener + 1;
            fail(&p->c, FY_ERR_FORMAT, opener->pos, "'%.*s' has no '{%% %s %%}'", (int)name->s.n, name->s.p, last);
        } else {
            p->i--;
            unexpected(p, NULL);
        }
    }
}

/* Line endings become '\n' and one trailing newline goes, as Jinja's lexer does. */
static char *normalize(ctx_t *c, const char *src, size_t *len_p)
{
    size_t len = strlen(src), n = 0;
    char *s = alloc(c, len + 1);
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r' && src[i + 1] == '\n') i++;
        s[n++] = src[i] == '\r' ? '\n' : src[i];
    }
    if (n && s[n - 1] == '\n') n--;
    s[n] = '\0';
    *len_p = n;
    return s;
}

static str_t dup_str(ctx_t *c, const char *s)
{
    if (!s) return STR("");
    size_t n = strlen(s);
    char *d = alloc(c, n + 1);
    memcpy(d, s, n + 1);
    return (str_t){d, n};
}

static void parse_template(parser_t *p, fy_chat_template_t *t, const char *src, const char *bos, const char *eos)
{
    t->src = p->c.src = normalize(&p->c, src, &p->len);
    t->bos = dup_str(&p->c, bos);
    t->eos = dup_str(&p->c, eos);
    lex(p);
    parse_body(p, &t->body, NULL, NULL);
    for (size_t k = 0; k < p->calls.n; k++) {
        const node_t *call = p->calls.v[k];
        size_t m = 0;
        while (m < p->macros.n && !str_same(p->macros.v[m]->name, call->name)) m++;
        if (m == p->macros.n)
            fail(&p->c, FY_ERR_UNSUPPORTED, call->pos, "unknown function '%.*s'", (int)call->name.n, call->name.p);
    }
}

static fy_status_t parse_guarded(parser_t *p, fy_chat_template_t *t, const char *src, const char *bos, const char *eos)
{
    if (setjmp(p->c.jmp)) return p->c.status;
    parse_template(p, t, src, bos, eos);
    return FY_OK;
}

fy_status_t fy_chat_template_create(const char *src, const char *bos_token, const char *eos_token,
                                    fy_chat_template_t **tmpl_p)
{
    if (!tmpl_p) {
        fy_error("chat template: create: no output pointer");
        return FY_ERR_INVALID;
    }
    if (!src) src = CHATML;
    if (strlen(src) > CHAT_MAX_SOURCE) {
        fy_error("chat template: longer than %zu KiB", CHAT_MAX_SOURCE >> 10);
        return FY_ERR_INVALID;
    }
    fy_chat_template_t *t = fy_calloc(1, sizeof(*t));
    if (!t) {
        fy_error("chat template: out of memory");
        return FY_ERR_NOMEM;
    }
    parser_t p = {.c.arena = &t->arena, .c.src = "", .ast = &t->arena};
    fy_status_t st = parse_guarded(&p, t, src, bos_token, eos_token);
    arena_free(&p.scratch);
    if (st != FY_OK) {
        fy_chat_template_destroy(t);
        return st;
    }
    *tmpl_p = t;
    return FY_OK;
}

const char *fy_chat_template_source(const fy_chat_template_t *tmpl) { return tmpl ? tmpl->src : ""; }

void fy_chat_template_destroy(fy_chat_template_t *tmpl)
{
    if (!tmpl) return;
    arena_free(&tmpl->arena);
    fy_free(tmpl);
}

/* ---- values -------------------------------------------------------------- */

typedef struct frame {
    struct frame *parent;
    dict_t vars;
} frame_t;

typedef struct render {
    ctx_t c;
    frame_t *root, *top; /* template-level variables; the innermost scope */
    buf_t *out;
    int depth;
    long work;
    enum { JUMP_NONE, JUMP_BREAK, JUMP_CONTINUE } jump;
} render_t;

static uint32_t pos_of(const node_t *n) { return n ? n->pos : NO_POS; }

#define ERR(r, at, ...) fail(&(r)->c, FY_ERR_INVALID, pos_of(at), __VA_ARGS__)

static val_t vbool(bool b) { return (val_t){V_BOOL, {.b = b}}; }
static val_t vint(int64_t i) { return (val_t){V_INT, {.i = i}}; }
static val_t vstr(str_t s) { return (val_t){V_STR, {.s = s}}; }
static val_t vundef(str_t name) { return (val_t){V_UNDEF, {.s = name}}; }
static val_t vlist(list_t *l) { return (val_t){V_LIST, {.l = l}}; }

static const char *type_name(val_t v)
{
    static const char *const names[] = {"undefined", "NoneType", "bool", "int",   "float",
                                        "str",       "list",     "dict", "macro", "function"};
    return names[v.t];
}

static void charge(render_t *r, const node_t *at, size_t units)
{
    r->work += (long)FY_MIN(units, (size_t)CHAT_MAX_WORK);
    if (r->work > CHAT_MAX_WORK) ERR(r, at, "template runs too long (more than %ld steps)", CHAT_MAX_WORK);
}

static list_t *list_new(render_t *r, size_t cap)
{
    list_t *l = alloc_array(&r->c, 1, sizeof(*l));
    l->v = cap ? alloc_array(&r->c, cap, sizeof(*l->v)) : NULL;
    l->cap = cap;
    return l;
}

static void list_push(render_t *r, list_t *l, val_t v)
{
    l->v = grow(&r->c, l->v, l->n, &l->cap, sizeof(*l->v));
    l->v[l->n++] = v;
}

static dict_t *dict_new(render_t *r) { return alloc_array(&r->c, 1, sizeof(dict_t)); }

static entry_t *dict_find(const dict_t *d, str_t key)
{
    for (size_t k = 0; k < d->n; k++)
        if (str_same(d->e[k].k, key)) return &d->e[k];
    return NULL;
}

static bool dict_get(const dict_t *d, str_t key, val_t *v_p)
{
    const entry_t *e = dict_find(d, key);
    if (e) *v_p = e->v;
    return e != NULL;
}

static void dict_set(render_t *r, dict_t *d, str_t key, val_t v)
{
    entry_t *e = dict_find(d, key);
    if (!e) {
        d->e = grow(&r->c, d->e, d->n, &d->cap, sizeof(*d->e));
        e = &d->e[d->n++];
        e->k = key;
    }
    e->v = v;
}

static bool truthy(val_t v)
{
    switch (v.t) {
    case V_UNDEF:
    case V_NONE: return false;
    case V_BOOL: return v.u.b;
    case V_INT: return v.u.i != 0;
    case V_FLOAT: return v.u.f != 0;
    case V_STR: return v.u.s.n > 0;
    case V_LIST: return v.u.l->n > 0;
    case V_DICT: return v.u.d->n > 0;
    default: return true;
    }
}

static bool is_int(val_t v) { return v.t == V_INT || v.t == V_BOOL; }
static bool is_num(val_t v) { return is_int(v) || v.t == V_FLOAT; }
static int64_t as_int(val_t v) { return v.t == V_BOOL ? v.u.b : v.u.i; }
static double as_float(val_t v) { return v.t == V_FLOAT ? v.u.f : (double)as_int(v); }

/* Jinja raises on most uses of an undefined value; rendering, tests and 'default' are the exceptions. */
static void need_defined(render_t *r, const node_t *at, val_t v)
{
    if (v.t == V_UNDEF) ERR(r, at, "'%.*s' is undefined", (int)v.u.s.n, v.u.s.p);
}

static str_t want_str(render_t *r, const node_t *at, val_t v, const char *what)
{
    need_defined(r, at, v);
    if (v.t != V_STR) ERR(r, at, "%s expects a string, got %s", what, type_name(v));
    return v.u.s;
}

static int64_t want_int(render_t *r, const node_t *at, val_t v, const char *what)
{
    need_defined(r, at, v);
    if (!is_int(v)) ERR(r, at, "%s expects an integer, got %s", what, type_name(v));
    return as_int(v);
}

/* Python's repr() of a float: the shortest string that reads back the same. */
static void format_float(double f, char out[32])
{
    if (isnan(f) || isinf(f)) {
        snprintf(out, 32, "%s", isnan(f) ? "nan" : f > 0 ? "inf" : "-inf");
        return;
    }
    char tmp[32];
    int prec = 1;
    for (; prec < 17; prec++) {
        snprintf(tmp, sizeof(tmp), "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    snprintf(tmp, sizeof(tmp), "%.*e", prec - 1, f);
    int exp = atoi(strchr(tmp, 'e') + 1);
    if (exp < -4 || exp >= 16) {
        snprintf(out, 32, "%s", tmp);
        return;
    }
    snprintf(out, 32, "%.*f", FY_MAX(prec - 1 - exp, 0), f);
    if (!strchr(out, '.')) strcat(out, ".0");
}

static void write_repr_str(render_t *r, buf_t *b, str_t s)
{
    char quote = memchr(s.p, '\'', s.n) && !memchr(s.p, '"', s.n) ? '"' : '\'';
    buf_add(&r->c, b, &quote, 1);
    for (size_t i = 0; i < s.n; i++) {
        unsigned char ch = (unsigned char)s.p[i];
        char esc[8];
        if (ch == (unsigned char)quote || ch == '\\')
            snprintf(esc, sizeof(esc), "\\%c", ch);
        else if (ch == '\n' || ch == '\t' || ch == '\r')
            snprintf(esc, sizeof(esc), "\\%c", ch == '\n' ? 'n' : ch == '\t' ? 't' : 'r');
        else if (ch < 0x20 || ch == 0x7F)
            snprintf(esc, sizeof(esc), "\\x%02x", ch);
        else
            esc[0] = (char)ch, esc[1] = '\0';
        buf_cstr(&r->c, b, esc);
    }
    buf_add(&r->c, b, &quote, 1);
}

/* Python's str() (or repr(), inside containers) of v. */
static void write_val(render_t *r, const node_t *at, buf_t *b, val_t v, bool repr, int depth)
{
    char num[32];
    charge(r, at, 1);
    if (depth > CHAT_MAX_DEPTH) ERR(r, at, "value nested deeper than %d levels", CHAT_MAX_DEPTH);
    switch (v.t) {
    case V_UNDEF: break;
    case V_NONE: buf_cstr(&r->c, b, "None"); break;
    case V_BOOL: buf_cstr(&r->c, b, v.u.b ? "True" : "False"); break;
    case V_INT:
        snprintf(num, sizeof(num), "%lld", (long long)v.u.i);
        buf_cstr(&r->c, b, num);
        break;
    case V_FLOAT:
        format_float(v.u.f, num);
        buf_cstr(&r->c, b, num);
        break;
    case V_STR:
        if (repr)
            write_repr_str(r, b, v.u.s);
        else
            buf_str(&r->c, b, v.u.s);
        break;
    case V_LIST:
        buf_cstr(&r->c, b, v.u.l->tuple ? "(" : "[");
        for (size_t k = 0; k < v.u.l->n; k++) {
            if (k) buf_cstr(&r->c, b, ", ");
            write_val(r, at, b, v.u.l->v[k], true, depth + 1);
        }
        buf_cstr(&r->c, b, !v.u.l->tuple ? "]" : v.u.l->n == 1 ? ",)" : ")");
        break;
    case V_DICT:
        buf_cstr(&r->c, b, "{");
        for (size_t k = 0; k < v.u.d->n; k++) {
            if (k) buf_cstr(&r->c, b, ", ");
            write_repr_str(r, b, v.u.d->e[k].k);
            buf_cstr(&r->c, b, ": ");
            write_val(r, at, b, v.u.d->e[k].v, true, depth + 1);
        }
        buf_cstr(&r->c, b, "}");
        break;
    case V_MACRO: buf_cstr(&r->c, b, "<macro>"); break;
    case V_FUNC: buf_cstr(&r->c, b, "<function>"); break;
    }
}

static str_t to_str(render_t *r, const node_t *at, val_t v)
{
    if (v.t == V_STR) return v.u.s;
    buf_t b = {0};
    write_val(r, at, &b, v, false, 0);
    return buf_view(&b);
}

static void write_json_str(render_t *r, buf_t *b, str_t s, bool ascii)
{
    buf_cstr(&r->c, b, "\"");
    for (size_t i = 0, len; i < s.n; i += len) {
        uint32_t cp;
        len = utf8_char(s.p, s.n, i, &cp);
        char esc[16];
        const char *named = cp == '"'    ? "\\\""
                            : cp == '\\' ? "\\\\"
                            : cp == '\n' ? "\\n"
                            : cp == '\r' ? "\\r"
                            : cp == '\t' ? "\\t"
                            : cp == '\b' ? "\\b"
                            : cp == '\f' ? "\\f"
                                         : NULL;
        if (named) {
            buf_cstr(&r->c, b, named);
        } else if (cp < 0x20 || (ascii && cp > 0x7E && cp < 0x10000)) {
            snprintf(esc, sizeof(esc), "\\u%04x", cp);
            buf_cstr(&r->c, b, esc);
        } else if (ascii && cp >= 0x10000) {
            snprintf(esc, sizeof(esc), "\\u%04x\\u%04x", 0xD800 + ((cp - 0x10000) >> 10), 0xDC00 + (cp & 0x3FF));
            buf_cstr(&r->c, b, esc);
        } else {
            buf_add(&r->c, b, s.p + i, len);
        }
    }
    buf_cstr(&r->c, b, "\"");
}

static void json_newline(render_t *r, buf_t *b, int indent, int level)
{
    buf_cstr(&r->c, b, "\n");
    for (int k = 0; k < indent * level; k++) buf_cstr(&r->c, b, " ");
}

/* json.dumps(v, ensure_ascii=ascii, indent=indent (<0: None)), as transformers' tojson does it. */
static void write_json(render_t *r, const node_t *at, buf_t *b, val_t v, int indent, bool ascii, int level)
{
    charge(r, at, 1);
    if (level > CHAT_MAX_DEPTH) ERR(r, at, "value nested deeper than %d levels", CHAT_MAX_DEPTH);
    char num[32];
    bool is_list = v.t == V_LIST;
    size_t n = is_list ? v.u.l->n : v.t == V_DICT ? v.u.d->n : 0;
    switch (v.t) {
    case V_NONE: buf_cstr(&r->c, b, "null"); return;
    case V_BOOL: buf_cstr(&r->c, b, v.u.b ? "true" : "false"); return;
    case V_INT: write_val(r, at, b, v, false, 0); return;
    case V_FLOAT:
        format_float(v.u.f, num);
        buf_cstr(&r->c, b, isnan(v.u.f) ? "NaN" : isinf(v.u.f) ? (v.u.f > 0 ? "Infinity" : "-Infinity") : num);
        return;
    case V_STR: write_json_str(r, b, v.u.s, ascii); return;
    case V_LIST:
    case V_DICT:
        buf_cstr(&r->c, b, is_list ? "[" : "{");
        for (size_t k = 0; k < n; k++) {
            if (k) buf_cstr(&r->c, b, indent >= 0 ? "," : ", ");
            if (indent >= 0) json_newline(r, b, indent, level + 1);
            if (!is_list) {
                write_json_str(r, b, v.u.d->e[k].k, ascii);
                buf_cstr(&r->c, b, ": ");
            }
            write_json(r, at, b, is_list ? v.u.l->v[k] : v.u.d->e[k].v, indent, ascii, level + 1);
        }
        if (indent >= 0 && n) json_newline(r, b, indent, level);
        buf_cstr(&r->c, b, is_list ? "]" : "}");
        return;
    default: ERR(r, at, "object of type %s is not JSON serializable", type_name(v));
    }
}

static bool equal(render_t *r, const node_t *at, val_t a, val_t b, int depth)
{
    charge(r, at, 1);
    if (depth > CHAT_MAX_DEPTH) ERR(r, at, "value nested deeper than %d levels", CHAT_MAX_DEPTH);
    if (is_num(a) && is_num(b)) {
        if (is_int(a) && is_int(b)) return as_int(a) == as_int(b);
        return as_float(a) == as_float(b);
    }
    if (a.t != b.t) return false;
    switch (a.t) {
    case V_UNDEF:
    case V_NONE: return true;
    case V_STR: return str_same(a.u.s, b.u.s);
    case V_LIST:
        if (a.u.l->n != b.u.l->n || a.u.l->tuple != b.u.l->tuple) return false;
        for (size_t k = 0; k < a.u.l->n; k++)
            if (!equal(r, at, a.u.l->v[k], b.u.l->v[k], depth + 1)) return false;
        return true;
    case V_DICT:
        if (a.u.d->n != b.u.d->n) return false;
        for (size_t k = 0; k < a.u.d->n; k++) {
            val_t other;
            const entry_t *e = &a.u.d->e[k];
            if (!dict_get(b.u.d, e->k, &other) || !equal(r, at, e->v, other, depth + 1)) return false;
        }
        return true;
    case V_MACRO: return a.u.m == b.u.m;
    default: return a.u.fn == b.u.fn;
    }
}

static int compare(render_t *r, const node_t *at, val_t a, val_t b)
{
    need_defined(r, at, a);
    need_defined(r, at, b);
    if (is_num(a) && is_num(b)) {
        if (is_int(a) && is_int(b)) return (as_int(a) > as_int(b)) - (as_int(a) < as_int(b));
        return (as_float(a) > as_float(b)) - (as_float(a) < as_float(b));
    }
    if (a.t != V_STR || b.t != V_STR) ERR(r, at, "cannot order %s and %s", type_name(a), type_name(b));
    charge(r, at, FY_MIN(a.u.s.n, b.u.s.n) / 64);
    int c = memcmp(a.u.s.p, b.u.s.p, FY_MIN(a.u.s.n, b.u.s.n));
    return c ? c : (a.u.s.n > b.u.s.n) - (a.u.s.n < b.u.s.n);
}

/* The items a for-loop or a filter walks: a list's, a dict's keys, a string's characters. */
static list_t *iterate(render_t *r, const node_t *at, val_t v)
{
    list_t *l;
    switch (v.t) {
    case V_UNDEF: return list_new(r, 0);
    case V_LIST: charge(r, at, v.u.l->n); return v.u.l;
    case V_DICT:
        l = list_new(r, v.u.d->n);
        for (size_t k = 0; k < v.u.d->n; k++) list_push(r, l, vstr(v.u.d->e[k].k));
        return l;
    case V_STR:
        l = list_new(r, 0);
        for (size_t i = 0, len; i < v.u.s.n; i += len) {
            uint32_t cp;
            len = utf8_char(v.u.s.p, v.u.s.n, i, &cp);
            list_push(r, l, vstr((str_t){v.u.s.p + i, len}));
        }
        return l;
    default: ERR(r, at, "'%s' object is not iterable", type_name(v));
    }
}

static bool contains(render_t *r, const node_t *at, val_t hay, val_t needle)
{
    switch (hay.t) {
    case V_UNDEF: return false;
    case V_STR: {
        str_t n = want_str(r, at, needle, "'in <string>'");
        charge(r, at, hay.u.s.n / 64);
        return !n.n || memmem(hay.u.s.p, hay.u.s.n, n.p, n.n);
    }
    case V_DICT: {
        val_t v;
        return needle.t == V_STR && dict_get(hay.u.d, needle.u.s, &v);
    }
    case V_LIST:
        for (size_t k = 0; k < hay.u.l->n; k++)
            if (equal(r, at, hay.u.l->v[k], needle, 0)) return true;
        return false;
    default: ERR(r, at, "argument of type '%s' is not iterable", type_name(hay));
    }
}

static val_t get_attr(render_t *r, const node_t *at, val_t obj, str_t name)
{
    need_defined(r, at, obj);
    val_t v;
    if (obj.t == V_DICT && dict_get(obj.u.d, name, &v)) return v;
    return vundef(name);
}

/* Byte offset of the k-th character of s (k <= its length). */
static size_t cp_offset(str_t s, int64_t k)
{
    size_t i = 0;
    uint32_t cp;
    for (; k > 0 && i < s.n; k--) i += utf8_char(s.p, s.n, i, &cp);
    return i;
}

static val_t get_item(render_t *r, const node_t *at, val_t obj, val_t key)
{
    need_defined(r, at, obj);
    if (obj.t == V_DICT && key.t == V_STR) return get_attr(r, at, obj, key.u.s);
    if ((obj.t == V_LIST || obj.t == V_STR) && is_int(key)) {
        int64_t n = obj.t == V_LIST ? (int64_t)obj.u.l->n : (int64_t)cp_count(obj.u.s), i = as_int(key);
        if (i < 0) i += n;
        if (i < 0 || i >= n) return vundef(STR("item"));
        if (obj.t == V_LIST) return obj.u.l->v[i];
        size_t off = cp_offset(obj.u.s, i);
        uint32_t cp;
        return vstr((str_t){obj.u.s.p + off, utf8_char(obj.u.s.p, obj.u.s.n, off, &cp)});
    }
    return vundef(STR("item"));
}

static val_t slice(render_t *r, const node_t *at, val_t obj, const val_t bound[3])
{
    need_defined(r, at, obj);
    if (obj.t != V_LIST && obj.t != V_STR) ERR(r, at, "cannot slice %s", type_name(obj));
    int64_t n = obj.t == V_LIST ? (int64_t)obj.u.l->n : (int64_t)cp_count(obj.u.s), idx[3];
    for (int k = 0; k < 3; k++)
        if (bound[k].t != V_NONE && bound[k].t != V_UNDEF) idx[k] = want_int(r, at, bound[k], "a slice");
    int64_t step = bound[2].t == V_NONE || bound[2].t == V_UNDEF ? 1 : idx[2];
    if (step == 0) ERR(r, at, "slice step cannot be zero");
    int64_t ends[2];
    for (int k = 0; k < 2; k++) { /* Python's slice.indices() */
        if (bound[k].t == V_NONE || bound[k].t == V_UNDEF) {
            ends[k] = k == 0 ? (step > 0 ? 0 : n - 1) : (step > 0 ? n : -1);
            continue;
        }
        int64_t i = idx[k] < 0 ? idx[k] + n : idx[k];
        ends[k] = i < 0 ? (step < 0 ? -1 : 0) : i >= n ? (step < 0 ? n - 1 : n) : i;
    }
    list_t *l = list_new(r, 0);
    buf_t b = {0};
    size_t *offs = NULL;
    if (obj.t == V_STR) { /* character offsets, so that every step is O(1) */
        offs = alloc_array(&r->c, (size_t)n + 1, sizeof(*offs));
        uint32_t cp;
        for (int64_t k = 0; k < n; k++) offs[k + 1] = offs[k] + utf8_char(obj.u.s.p, obj.u.s.n, offs[k], &cp);
    }
    for (int64_t i = ends[0]; step > 0 ? i < ends[1] : i > ends[1]; i += step) {
        charge(r, at, 1);
        if (offs)
            buf_add(&r->c, &b, obj.u.s.p + offs[i], offs[i + 1] - offs[i]);
        else
            list_push(r, l, obj.u.l->v[i]);
    }
    return offs ? vstr(buf_view(&b)) : vlist(l);
}

/* ---- evaluator ----------------------------------------------------------- */

static val_t eval(render_t *r, const node_t *e);
static void exec(render_t *r, const nodes_t *body);

static str_t str_cat(render_t *r, str_t a, str_t b)
{
    buf_t out = {0};
    buf_str(&r->c, &out, a);
    buf_str(&r->c, &out, b);
    return buf_view(&out);
}

static val_t arith(render_t *r, const node_t *e, val_t a, val_t b)
{
    static const char *const sym[] = {[OP_ADD] = "+",       [OP_SUB] = "-", [OP_MUL] = "*", [OP_DIV] = "/",
                                      [OP_FLOORDIV] = "//", [OP_MOD] = "%", [OP_POW] = "**"};
    op_t op = (op_t)e->op;
    need_defined(r, e, a);
    need_defined(r, e, b);
    if (op == OP_ADD && a.t == V_STR && b.t == V_STR) return vstr(str_cat(r, a.u.s, b.u.s));
    if (op == OP_ADD && a.t == V_LIST && b.t == V_LIST) {
        list_t *l = list_new(r, a.u.l->n + b.u.l->n);
        for (size_t k = 0; k < a.u.l->n; k++) list_push(r, l, a.u.l->v[k]);
        for (size_t k = 0; k < b.u.l->n; k++) list_push(r, l, b.u.l->v[k]);
        return vlist(l);
    }
    if (op == OP_MUL && (a.t == V_STR || a.t == V_LIST) && is_int(b)) { /* 'ab' * 3 */
        buf_t out = {0};
        list_t *l = list_new(r, 0);
        for (int64_t k = 0; k < as_int(b); k++) {
            charge(r, e, a.t == V_LIST ? a.u.l->n : 1);
            if (a.t == V_STR) buf_str(&r->c, &out, a.u.s);
            for (size_t j = 0; a.t == V_LIST && j < a.u.l->n; j++) list_push(r, l, a.u.l->v[j]);
        }
        return a.t == V_STR ? vstr(buf_view(&out)) : vlist(l);
    }
    if (!is_num(a) || !is_num(b))
        ERR(r, e, "unsupported operand types for %s: '%s' and '%s'", sym[op], type_name(a), type_name(b));
    if (is_int(a) && is_int(b) && op != OP_DIV && !(op == OP_POW && as_int(b) < 0)) {
        int64_t x = as_int(a), y = as_int(b), z = 1;
        bool overflow = false;
        if ((op == OP_FLOORDIV || op == OP_MOD) && y == 0) ERR(r, e, "division by zero");
        switch (op) {
        case OP_ADD: overflow = __builtin_add_overflow(x, y, &z); break;
        case OP_SUB: overflow = __builtin_sub_overflow(x, y, &z); break;
        case OP_MUL: overflow = __builtin_mul_overflow(x, y, &z); break;
        case OP_FLOORDIV:
            overflow = x == INT64_MIN && y == -1;
            z = overflow ? 0 : x / y - ((x % y != 0) && ((x < 0) != (y < 0)));
            break;
        case OP_MOD:
            z = y == -1 ? 0 : x % y;
            if (z != 0 && ((z < 0) != (y < 0))) z += y;
            break;
        default: /* OP_POW, by squaring */
            for (int64_t base = x; y > 0 && !overflow; y >>= 1) {
                if (y & 1) overflow = __builtin_mul_overflow(z, base, &z);
                if (y > 1 && !overflow) overflow = __builtin_mul_overflow(base, base, &base);
            }
            break;
        }
        if (overflow) ERR(r, e, "integer overflow");
        return vint(z);
    }
    double x = as_float(a), y = as_float(b), z;
    if ((op == OP_DIV || op == OP_FLOORDIV || op == OP_MOD) && y == 0) ERR(r, e, "division by zero");
    switch (op) {
    case OP_ADD: z = x + y; break;
    case OP_SUB: z = x - y; break;
    case OP_MUL: z = x * y; break;
    case OP_DIV: z = x / y; break;
    case OP_FLOORDIV: z = floor(x / y); break;
    case OP_MOD:
        z = fmod(x, y);
        if (z != 0 && ((z < 0) != (y < 0))) z += y;
        break;
    default: z = pow(x, y); break;
    }
    return (val_t){V_FLOAT, {.f = z}};
}

static val_t eval_binary(render_t *r, const node_t *e)
{
    val_t a = eval(r, e->a);
    if (e->op == OP_AND) return truthy(a) ? eval(r, e->b) : a;
    if (e->op == OP_OR) return truthy(a) ? a : eval(r, e->b);
    val_t b = eval(r, e->b);
    switch (e->op) {
    case OP_EQ: return vbool(equal(r, e, a, b, 0));
    case OP_NE: return vbool(!equal(r, e, a, b, 0));
    case OP_LT: return vbool(compare(r, e, a, b) < 0);
    case OP_GT: return vbool(compare(r, e, a, b) > 0);
    case OP_LE: return vbool(compare(r, e, a, b) <= 0);
    case OP_GE: return vbool(compare(r, e, a, b) >= 0);
    case OP_IN: return vbool(contains(r, e, b, a));
    case OP_NOT_IN: return vbool(!contains(r, e, b, a));
    case OP_CONCAT: return vstr(str_cat(r, to_str(r, e, a), to_str(r, e, b)));
    default: return arith(r, e, a, b);
    }
}

typedef struct args {
    val_t v[MAX_PARAMS];
    bool has[MAX_PARAMS];
} args_t;

static void eval_args(render_t *r, const node_t *e, args_t *a)
{
    for (size_t k = 0; k < MAX_PARAMS; k++) {
        a->has[k] = k < e->args.n && e->args.v[k];
        a->v[k] = a->has[k] ? eval(r, e->args.v[k]) : vundef(STR("argument"));
    }
}

static bool apply_test(render_t *r, const node_t *at, int id, val_t v, val_t arg)
{
    switch (id) {
    case T_DEFINED: return v.t != V_UNDEF;
    case T_UNDEFINED: return v.t == V_UNDEF;
    case T_NONE: return v.t == V_NONE;
    case T_STRING: return v.t == V_STR;
    case T_MAPPING: return v.t == V_DICT;
    case T_ITERABLE: /* Jinja's undefined is iterable (and empty) */
    case T_SEQUENCE: return v.t == V_STR || v.t == V_LIST || v.t == V_DICT || v.t == V_UNDEF;
    case T_NUMBER: return is_num(v);
    case T_INTEGER: return v.t == V_INT;
    case T_FLOAT: return v.t == V_FLOAT;
    case T_BOOLEAN: return v.t == V_BOOL;
    case T_TRUE: return v.t == V_BOOL && v.u.b;
    case T_FALSE: return v.t == V_BOOL && !v.u.b;
    case T_EQ: return equal(r, at, v, arg, 0);
    case T_NE: return !equal(r, at, v, arg, 0);
    default: return (want_int(r, at, v, "test 'odd'") & 1) == (id == T_ODD);
    }
}

/* selectattr('a.b', 'test', x) and friends: attribute is a dotted path, test a test's name. */
static val_t select_items(render_t *r, const node_t *at, val_t v, const args_t *a, bool by_attr, bool keep)
{
    list_t *in = truthy(v) ? iterate(r, at, v) : list_new(r, 0), *out = list_new(r, 0); /* Jinja: 'if seq:' */
    int ti = by_attr ? 1 : 0;
    const builtin_t *test = NULL;
    if (a->has[ti]) {
        str_t name = want_str(r, at, a->v[ti], "the test's name");
        if (!(test = find_builtin(tests, FY_ARRAY_LEN(tests), name)))
            ERR(r, at, "unknown test '%.*s'", (int)name.n, name.p);
        if (test->min && !a->has[ti + 1]) ERR(r, at, "test '%s' needs an argument", test->name);
    }
    str_t path = by_attr ? want_str(r, at, a->v[0], "the attribute") : STR("");
    for (size_t k = 0; k < in->n; k++) {
        val_t x = in->v[k];
        for (size_t i = 0, j; by_attr && i <= path.n; i = j + 1) {
            for (j = i; j < path.n && path.p[j] != '.'; j++) {}
            x = get_attr(r, at, x, (str_t){path.p + i, j - i});
        }
        if ((test ? apply_test(r, at, test->id, x, a->v[ti + 1]) : truthy(x)) == keep) list_push(r, out, in->v[k]);
    }
    return vlist(out);
}

static str_t str_case(render_t *r, str_t s, int id)
{
    char *d = alloc(&r->c, s.n + 1);
    bool prev_cased = false;
    for (size_t i = 0; i < s.n; i++) {
        char ch = s.p[i];
        bool lower = ch >= 'a' && ch <= 'z', upper = ch >= 'A' && ch <= 'Z';
        bool up = id == M_UPPER || (id == M_TITLE && !prev_cased) || (id == M_CAPITALIZE && i == 0);
        if (up && lower)
            ch = (char)(ch - 32);
        else if (!up && id != M_UPPER && upper)
            ch = (char)(ch + 32);
        prev_cased = lower || upper || (unsigned char)ch >= 0x80;
        d[i] = ch;
    }
    return (str_t){d, s.n};
}

static str_t str_replace(render_t *r, const node_t *at, str_t s, str_t old, str_t new, int64_t count)
{
    if (!old.n) ERR(r, at, "replacing an empty string is not supported");
    buf_t b = {0};
    size_t i = 0;
    charge(r, at, s.n / 64);
    for (const char *hit; count-- != 0 && (hit = memmem(s.p + i, s.n - i, old.p, old.n));) {
        buf_add(&r->c, &b, s.p + i, (size_t)(hit - s.p) - i);
        buf_str(&r->c, &b, new);
        i = (size_t)(hit - s.p) + old.n;
    }
    buf_add(&r->c, &b, s.p + i, s.n - i);
    return buf_view(&b);
}

/* Python's str.split(sep, maxsplit); no sep: runs of whitespace, ends ignored. */
static val_t str_split(render_t *r, const node_t *at, str_t s, const str_t *sep, int64_t max)
{
    list_t *l = list_new(r, 0);
    size_t i = 0, k;
    charge(r, at, s.n / 64);
    if (sep && !sep->n) ERR(r, at, "empty separator");
    if (!sep) s = str_strip(s, NULL, true, false);
    while (max < 0 || (int64_t)l->n < max) {
        size_t j = i;
        if (sep) {
            const char *hit = memmem(s.p + i, s.n - i, sep->p, sep->n);
            if (!hit) break;
            j = (size_t)(hit - s.p);
        } else {
            while (j < s.n && !char_in_at(s, j, NULL)) j += utf8_char(s.p, s.n, j, &(uint32_t){0});
            if (j == s.n) break;
        }
        list_push(r, l, vstr((str_t){s.p + i, j - i}));
        i = j + (sep ? sep->n : 0);
        while (!sep && i < s.n && (k = char_in_at(s, i, NULL))) i += k;
        if (!sep && i == s.n) return vlist(l);
    }
    str_t rest = {s.p + i, s.n - i};
    if (!sep) rest = str_strip(rest, NULL, false, true);
    if (sep || rest.n) list_push(r, l, vstr(rest));
    return vlist(l);
}

static val_t items_of(render_t *r, const node_t *at, val_t v, const char *what)
{
    if (v.t == V_UNDEF) return vlist(list_new(r, 0));
    if (v.t != V_DICT) ERR(r, at, "%s expects a mapping, got %s", what, type_name(v));
    list_t *l = list_new(r, v.u.d->n);
    for (size_t k = 0; k < v.u.d->n; k++) {
        list_t *pair = list_new(r, 2);
        pair->tuple = true;
        list_push(r, pair, vstr(v.u.d->e[k].k));
        list_push(r, pair, v.u.d->e[k].v);
        list_push(r, l, vlist(pair));
    }
    return vlist(l);
}

/* Python's int(s), or int(float(s)) as Jinja's int filter falls back to. */
static bool parse_int(str_t s, val_t *v_p)
{
    char tmp[64], *end;
    s = str_strip(s, NULL, true, true);
    if (!s.n || s.n >= sizeof(tmp)) return false;
    memcpy(tmp, s.p, s.n);
    tmp[s.n] = '\0';
    errno = 0;
    long long i = strtoll(tmp, &end, 10);
    if (*end) {
        double f = strtod(tmp, &end);
        if (*end || !(fabs(f) < 9.2e18)) return false;
        i = (long long)f;
    }
    *v_p = vint(i);
    return !errno;
}

static val_t apply_filter(render_t *r, const node_t *at, int id, val_t v, const args_t *a);

static val_t filter_indent(render_t *r, const node_t *at, str_t s, const args_t *a)
{
    buf_t pad = {0}, out = {0};
    if (a->has[0] && a->v[0].t == V_STR) buf_str(&r->c, &pad, a->v[0].u.s);
    for (int64_t k = a->has[0] ? want_int(r, at, a->v[0], "filter 'indent'") : 4; k > 0 && pad.n < 256; k--)
        buf_cstr(&r->c, &pad, " ");
    bool first = a->has[1] && truthy(a->v[1]), blank = a->has[2] && truthy(a->v[2]);
    if (first) buf_str(&r->c, &out, buf_view(&pad));
    for (size_t i = 0, line = 0;; line++) {
        const char *nl = memchr(s.p + i, '\n', s.n - i);
        size_t end = nl ? (size_t)(nl - s.p) : s.n;
        if (line) {
            buf_cstr(&r->c, &out, "\n");
            if (blank || end > i) buf_str(&r->c, &out, buf_view(&pad));
        }
        buf_add(&r->c, &out, s.p + i, end - i);
        if (!nl) break;
        i = end + 1;
    }
    return vstr(buf_view(&out));
}

static val_t apply_filter(render_t *r, const node_t *at, int id, val_t v, const args_t *a)
{
    list_t *l;
    val_t x;
    switch (id) {
    case F_TRIM: {
        str_t chars = a->has[0] ? want_str(r, at, a->v[0], "filter 'trim'") : STR("");
        return vstr(str_strip(to_str(r, at, v), a->has[0] ? &chars : NULL, true, true));
    }
    case F_LENGTH:
        if (v.t == V_STR) {
            charge(r, at, v.u.s.n / 64);
            return vint((int64_t)cp_count(v.u.s));
        }
        if (v.t == V_LIST || v.t == V_DICT) return vint((int64_t)(v.t == V_LIST ? v.u.l->n : v.u.d->n));
        if (v.t == V_UNDEF) return vint(0);
        ERR(r, at, "object of type '%s' has no length", type_name(v));
    case F_UPPER: return vstr(str_case(r, to_str(r, at, v), M_UPPER));
    case F_LOWER: return vstr(str_case(r, to_str(r, at, v), M_LOWER));
    case F_CAPITALIZE: return vstr(str_case(r, to_str(r, at, v), M_CAPITALIZE));
    case F_DEFAULT:
        if (v.t != V_UNDEF && !(a->has[1] && truthy(a->v[1]) && !truthy(v))) return v;
        return a->has[0] ? a->v[0] : vstr(STR(""));
    case F_TOJSON: {
        buf_t b = {0};
        int64_t indent = a->has[1] && a->v[1].t != V_NONE ? want_int(r, at, a->v[1], "tojson's indent") : -1;
        if (indent < -1) indent = 0; /* json.dumps: a negative indent is none */
        write_json(r, at, &b, v, (int)FY_MIN(indent, 64), a->has[0] && truthy(a->v[0]), 0);
        return vstr(buf_view(&b));
    }
    case F_FIRST:
    case F_LAST: l = iterate(r, at, v); return l->n ? l->v[id == F_FIRST ? 0 : l->n - 1] : vundef(STR("item"));
    case F_JOIN: {
        buf_t b = {0};
        str_t sep = a->has[0] ? to_str(r, at, a->v[0]) : STR("");
        l = iterate(r, at, v);
        for (size_t k = 0; k < l->n; k++) {
            if (k) buf_str(&r->c, &b, sep);
            x = a->has[1] ? get_attr(r, at, l->v[k], want_str(r, at, a->v[1], "join's attribute")) : l->v[k];
            buf_str(&r->c, &b, to_str(r, at, x));
        }
        return vstr(buf_view(&b));
    }
    case F_REPLACE:
        return vstr(str_replace(r, at, to_str(r, at, v), to_str(r, at, a->v[0]), to_str(r, at, a->v[1]),
                                a->has[2] ? want_int(r, at, a->v[2], "replace's count") : -1));
    case F_STRING: return vstr(to_str(r, at, v));
    case F_SAFE: return v;
    case F_INT:
        if (v.t == V_FLOAT && !(fabs(v.u.f) < 9.2e18)) ERR(r, at, "cannot convert %f to an integer", v.u.f);
        if (is_num(v)) return vint(v.t == V_FLOAT ? (int64_t)v.u.f : as_int(v));
        return v.t == V_STR && parse_int(v.u.s, &x) ? x : a->has[0] ? a->v[0] : vint(0);
    case F_ITEMS: return items_of(r, at, v, "filter 'items'");
    case F_LIST: return vlist(iterate(r, at, v)); /* lists are never changed once built */
    case F_SELECTATTR: return select_items(r, at, v, a, true, true);
    case F_REJECTATTR: return select_items(r, at, v, a, true, false);
    case F_SELECT: return select_items(r, at, v, a, false, true);
    case F_REJECT: return select_items(r, at, v, a, false, false);
    case F_MAP: {
        const builtin_t *f = NULL;
        if (!a->has[1]) {
            str_t name = want_str(r, at, a->v[0], "filter 'map'");
            f = find_builtin(filters, FY_ARRAY_LEN(filters), name);
            if (!f || f->min) ERR(r, at, "map cannot apply filter '%.*s'", (int)name.n, name.p);
        }
        args_t none = {0};
        list_t *in = truthy(v) ? iterate(r, at, v) : list_new(r, 0), *out = list_new(r, in->n);
        for (size_t k = 0; k < in->n; k++) {
            x = f ? apply_filter(r, at, f->id, in->v[k], &none)
                  : get_attr(r, at, in->v[k], want_str(r, at, a->v[1], "map's attribute"));
            list_push(r, out, x.t == V_UNDEF && a->has[2] ? a->v[2] : x);
        }
        return vlist(out);
    }
    case F_DICTSORT: /* by key, case-insensitively; an insertion sort, dicts here are small */
        x = items_of(r, at, v, "filter 'dictsort'");
        l = x.u.l;
        for (size_t k = 1; k < l->n; k++) {
            val_t item = l->v[k], key = vstr(str_case(r, item.u.l->v[0].u.s, M_LOWER));
            size_t j = k;
            for (; j > 0 && compare(r, at, vstr(str_case(r, l->v[j - 1].u.l->v[0].u.s, M_LOWER)), key) > 0; j--)
                l->v[j] = l->v[j - 1];
            l->v[j] = item;
        }
        return x;
    default: return filter_indent(r, at, to_str(r, at, v), a);
    }
}

static val_t call_method(render_t *r, const node_t *e)
{
    val_t obj = eval(r, e->a), x;
    args_t a;
    eval_args(r, e, &a);
    need_defined(r, e, obj);
    int id = e->op;
    if (obj.t == V_STR) {
        str_t s = obj.u.s, arg0 = STR("");
        const str_t *opt = NULL; /* the first argument when it is given and not None */
        if (a.has[0] && a.v[0].t != V_NONE && id != M_STARTSWITH && id != M_ENDSWITH) {
            arg0 = want_str(r, e, a.v[0], "the argument");
            opt = &arg0;
        }
        switch (id) {
        case M_STRIP:
        case M_LSTRIP:
        case M_RSTRIP: return vstr(str_strip(s, opt, id != M_RSTRIP, id != M_LSTRIP));
        case M_STARTSWITH:
        case M_ENDSWITH: { /* the argument may be a tuple of candidates */
            list_t *opts = a.v[0].t == V_LIST ? a.v[0].u.l : &(list_t){.v = &a.v[0], .n = 1};
            for (size_t k = 0; k < opts->n; k++) {
                str_t fix = want_str(r, e, opts->v[k], "startswith/endswith");
                if (fix.n <= s.n && (!fix.n || !memcmp(id == M_STARTSWITH ? s.p : s.p + s.n - fix.n, fix.p, fix.n)))
                    return vbool(true);
            }
            return vbool(false);
        }
        case M_SPLIT: return str_split(r, e, s, opt, a.has[1] ? want_int(r, e, a.v[1], "split") : -1);
        case M_UPPER:
        case M_LOWER:
        case M_TITLE:
        case M_CAPITALIZE: return vstr(str_case(r, s, id));
        case M_REPLACE:
            return vstr(str_replace(r, e, s, want_str(r, e, a.v[0], "replace"), want_str(r, e, a.v[1], "replace"),
                                    a.has[2] ? want_int(r, e, a.v[2], "replace") : -1));
        }
    } else if (obj.t == V_DICT) {
        switch (id) {
        case M_GET:
            if (a.v[0].t == V_STR && dict_get(obj.u.d, a.v[0].u.s, &x)) return x;
            return a.has[1] ? a.v[1] : (val_t){V_NONE, {0}};
        case M_ITEMS: return items_of(r, e, obj, "items()");
        case M_KEYS: return vlist(iterate(r, e, obj));
        }
    }
    ERR(r, e, "'%s' object has no method '%.*s'", type_name(obj), (int)e->name.n, e->name.p);
}

static val_t call_function(render_t *r, const node_t *e)
{
    if (e->op == FN_NAMESPACE) {
        dict_t *d = dict_new(r);
        d->ns = true;
        for (size_t k = 0; k < e->args.n; k++) dict_set(r, d, e->args.v[k]->name, eval(r, e->args.v[k]->a));
        return (val_t){V_DICT, {.d = d}};
    }
    args_t a;
    eval_args(r, e, &a);
    if (e->op == FN_RAISE) {
        str_t msg = to_str(r, e, a.v[0]);
        fail(&r->c, FY_ERR_INVALID, NO_POS, "%.*s", (int)FY_MIN(msg.n, 400), msg.p);
    }
    if (e->op == FN_STRFTIME) {
        str_t fmt = want_str(r, e, a.v[0], "strftime_now");
        char *z = alloc(&r->c, fmt.n + 1), out[256];
        memcpy(z, fmt.p, fmt.n);
        z[fmt.n] = '\0';
        time_t now = time(NULL);
        struct tm tm;
        size_t n = localtime_r(&now, &tm) ? strftime(out, sizeof(out), z, &tm) : 0;
        buf_t b = {0};
        buf_add(&r->c, &b, out, n);
        return vstr(buf_view(&b));
    }
    int64_t start = 0, stop = want_int(r, e, a.v[0], "range"), step = 1; /* FN_RANGE */
    if (a.has[1]) start = stop, stop = want_int(r, e, a.v[1], "range");
    if (a.has[2]) step = want_int(r, e, a.v[2], "range");
    if (step == 0) ERR(r, e, "range() step must not be zero");
    list_t *l = list_new(r, 0);
    for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
        charge(r, e, 1);
        list_push(r, l, vint(i));
        if (__builtin_add_overflow(i, step, &i)) break;
    }
    return vlist(l);
}

static val_t lookup(render_t *r, str_t name)
{
    val_t v;
    for (const frame_t *f = r->top; f; f = f->parent)
        if (dict_get(&f->vars, name, &v)) return v;
    const builtin_t *b = find_builtin(functions, FY_ARRAY_LEN(functions), name);
    return b ? (val_t){V_FUNC, {.fn = b->id}} : vundef(name);
}

/* A macro runs in its own scope under the template's; it returns what it renders. */
static val_t call_macro(render_t *r, const node_t *e)
{
    val_t m = lookup(r, e->name);
    if (m.t != V_MACRO) ERR(r, e, "'%.*s' is not a macro", (int)e->name.n, e->name.p);
    const node_t *def = m.u.m;
    size_t n = def->args.n;
    val_t *vals = alloc_array(&r->c, n + 1, sizeof(*vals));
    bool *given = alloc_array(&r->c, n + 1, sizeof(*given));
    for (size_t k = 0, pos = 0; k < e->args.n; k++) { /* the arguments, in the caller's scope */
        const node_t *arg = e->args.v[k];
        size_t slot = pos;
        if (arg->kind == E_KWARG)
            for (slot = 0; slot < n && !str_same(def->args.v[slot]->name, arg->name); slot++) {}
        else
            pos++;
        if (slot >= n || given[slot]) ERR(r, arg, "bad argument for macro '%.*s'", (int)e->name.n, e->name.p);
        vals[slot] = eval(r, arg->kind == E_KWARG ? arg->a : arg);
        given[slot] = true;
    }
    frame_t f = {.parent = r->root};
    buf_t out = {0}, *saved_out = r->out;
    frame_t *saved_top = r->top;
    r->top = &f;
    for (size_t k = 0; k < n; k++) { /* defaults, in the macro's scope */
        const node_t *param = def->args.v[k];
        val_t v = given[k] ? vals[k] : param->a ? eval(r, param->a) : vundef(param->name);
        dict_set(r, &f.vars, param->name, v);
    }
    r->out = &out;
    exec(r, &def->body);
    r->out = saved_out;
    r->top = saved_top;
    return vstr(buf_view(&out));
}

static val_t eval(render_t *r, const node_t *e)
{
    if (++r->depth > CHAT_MAX_DEPTH) ERR(r, e, "nested deeper than %d levels", CHAT_MAX_DEPTH);
    charge(r, e, 1);
    val_t v, x;
    args_t a;
    switch (e->kind) {
    case E_LIT: v = e->lit; break;
    case E_NAME: v = lookup(r, e->name); break;
    case E_LIST:
    case E_TUPLE:
        v = vlist(list_new(r, e->args.n));
        v.u.l->tuple = e->kind == E_TUPLE;
        for (size_t k = 0; k < e->args.n; k++) list_push(r, v.u.l, eval(r, e->args.v[k]));
        break;
    case E_DICT:
        v = (val_t){V_DICT, {.d = dict_new(r)}};
        for (size_t k = 0; k + 1 < e->args.n; k += 2) {
            x = eval(r, e->args.v[k]);
            if (x.t != V_STR) ERR(r, e->args.v[k], "dict keys must be strings");
            dict_set(r, v.u.d, x.u.s, eval(r, e->args.v[k + 1]));
        }
        break;
    case E_ATTR: v = get_attr(r, e, eval(r, e->a), e->name); break;
    case E_INDEX:
        x = eval(r, e->a);
        v = get_item(r, e, x, eval(r, e->b));
        break;
    case E_SLICE: {
        const node_t *parts[3] = {e->b, e->c, e->d};
        val_t bound[3];
        x = eval(r, e->a);
        for (int k = 0; k < 3; k++) bound[k] = parts[k] ? eval(r, parts[k]) : (val_t){V_NONE, {0}};
        v = slice(r, e, x, bound);
        break;
    }
    case E_UNARY:
        x = eval(r, e->a);
        if (e->op == OP_NOT) {
            v = vbool(!truthy(x));
            break;
        }
        need_defined(r, e, x);
        if (!is_num(x)) ERR(r, e, "bad operand type for unary %c: '%s'", e->op == OP_NEG ? '-' : '+', type_name(x));
        if (e->op == OP_POS)
            v = x;
        else if (x.t == V_FLOAT)
            v = (val_t){V_FLOAT, {.f = -x.u.f}};
        else if (as_int(x) == INT64_MIN)
            ERR(r, e, "integer overflow");
        else
            v = vint(-as_int(x));
        break;
    case E_BINARY: v = eval_binary(r, e); break;
    case E_COND: v = truthy(eval(r, e->b)) ? eval(r, e->a) : e->c ? eval(r, e->c) : vundef(STR("else")); break;
    case E_FILTER:
    case E_TEST:
        x = eval(r, e->a);
        eval_args(r, e, &a);
        if (e->kind == E_FILTER)
            v = apply_filter(r, e, e->op, x, &a);
        else
            v = vbool(apply_test(r, e, e->op, x, a.v[0]) != e->negate);
        break;
    case E_METHOD: v = call_method(r, e); break;
    case E_FUNC: v = call_function(r, e); break;
    default: v = call_macro(r, e); break;
    }
    r->depth--;
    return v;
}

static void bind_targets(render_t *r, const node_t *s, frame_t *f, val_t item)
{
    if (!s->name2.n) {
        dict_set(r, &f->vars, s->name, item);
        return;
    }
    if (item.t != V_LIST || item.u.l->n != 2) ERR(r, s, "cannot unpack %s into two names", type_name(item));
    dict_set(r, &f->vars, s->name, item.u.l->v[0]);
    dict_set(r, &f->vars, s->name2, item.u.l->v[1]);
}

static void exec_for(render_t *r, const node_t *s)
{
    list_t *items = iterate(r, s, eval(r, s->a));
    frame_t f = {.parent = r->top};
    r->top = &f;
    if (s->b) { /* 'for x in xs if cond': the loop sees only the items that pass */
        list_t *kept = list_new(r, 0);
        for (size_t k = 0; k < items->n; k++) {
            f.vars.n = 0;
            bind_targets(r, s, &f, items->v[k]);
            if (truthy(eval(r, s->b))) list_push(r, kept, items->v[k]);
        }
        items = kept;
    }
    dict_t *loop = dict_new(r);
    size_t n = items->n;
    for (size_t k = 0; k < n; k++) {
        charge(r, s, 1);
        f.vars.n = 0; /* Jinja: what one iteration sets, the next does not see */
        bind_targets(r, s, &f, items->v[k]);
        loop->n = 0; /* rewritten in place: templates read only the current one */
        dict_set(r, loop, STR("index"), vint((int64_t)k + 1));
        dict_set(r, loop, STR("index0"), vint((int64_t)k));
        dict_set(r, loop, STR("revindex"), vint((int64_t)(n - k)));
        dict_set(r, loop, STR("revindex0"), vint((int64_t)(n - k - 1)));
        dict_set(r, loop, STR("first"), vbool(k == 0));
        dict_set(r, loop, STR("last"), vbool(k + 1 == n));
        dict_set(r, loop, STR("length"), vint((int64_t)n));
        dict_set(r, loop, STR("previtem"), k ? items->v[k - 1] : vundef(STR("previtem")));
        dict_set(r, loop, STR("nextitem"), k + 1 < n ? items->v[k + 1] : vundef(STR("nextitem")));
        dict_set(r, &f.vars, STR("loop"), (val_t){V_DICT, {.d = loop}});
        exec(r, &s->body);
        bool stop = r->jump == JUMP_BREAK;
        r->jump = JUMP_NONE;
        if (stop) break;
    }
    r->top = f.parent;
    if (!n) exec(r, &s->else_body);
}

static void exec_set(render_t *r, const node_t *s)
{
    val_t v;
    if (s->a) {
        v = eval(r, s->a);
    } else { /* {% set x %}...{% endset %} */
        buf_t b = {0}, *saved = r->out;
        r->out = &b;
        exec(r, &s->body);
        r->out = saved;
        v = vstr(buf_view(&b));
    }
    if (!s->name2.n) {
        dict_set(r, &r->top->vars, s->name, v);
        return;
    }
    val_t ns = lookup(r, s->name);
    if (ns.t != V_DICT || !ns.u.d->ns) ERR(r, s, "'%.*s' is not a namespace", (int)s->name.n, s->name.p);
    dict_set(r, ns.u.d, s->name2, v);
}

static void exec(render_t *r, const nodes_t *body)
{
    if (++r->depth > CHAT_MAX_DEPTH) ERR(r, NULL, "nested deeper than %d levels", CHAT_MAX_DEPTH);
    for (size_t k = 0; k < body->n && r->jump == JUMP_NONE; k++) {
        const node_t *s = body->v[k];
        switch (s->kind) {
        case N_TEXT: buf_str(&r->c, r->out, s->lit.u.s); break;
        case N_OUTPUT: write_val(r, s, r->out, eval(r, s->a), false, 0); break;
        case N_IF:
            for (size_t b = 0; b < s->args.n; b++) {
                const node_t *br = s->args.v[b];
                if (!br->a || truthy(eval(r, br->a))) {
                    exec(r, &br->body);
                    break;
                }
            }
            break;
        case N_FOR: exec_for(r, s); break;
        case N_SET: exec_set(r, s); break;
        case N_MACRO: dict_set(r, &r->top->vars, s->name, (val_t){V_MACRO, {.m = s}}); break;
        case N_BREAK: r->jump = JUMP_BREAK; break;
        case N_CONTINUE: r->jump = JUMP_CONTINUE; break;
        default: exec(r, &s->body); break; /* N_BLOCK */
        }
    }
    r->depth--;
}

/* A JSON value (jansson's) as a template value, copied into the arena;
 * objects keep their members' order (jansson iterates in insertion order). */
static str_t arena_str(render_t *r, const char *src, size_t n)
{
    char *s = alloc(&r->c, n + 1);
    memcpy(s, src, n + 1);
    return (str_t){s, n};
}

static val_t from_json(render_t *r, json_t *j, int depth)
{
    charge(r, NULL, 1);
    if (depth > CHAT_MAX_DEPTH) ERR(r, NULL, "JSON nested deeper than %d levels", CHAT_MAX_DEPTH);
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        dict_t *d = dict_new(r);
        const char *k;
        json_t *v;
        json_object_foreach(j, k, v) dict_set(r, d, arena_str(r, k, strlen(k)), from_json(r, v, depth + 1));
        return (val_t){V_DICT, {.d = d}};
    }
    case JSON_ARRAY: {
        list_t *l = list_new(r, json_array_size(j));
        size_t i;
        json_t *v;
        json_array_foreach(j, i, v) list_push(r, l, from_json(r, v, depth + 1));
        return vlist(l);
    }
    case JSON_STRING: return vstr(arena_str(r, json_string_value(j), json_string_length(j)));
    case JSON_INTEGER: return vint((int64_t)json_integer_value(j));
    case JSON_REAL: return (val_t){V_FLOAT, {.f = json_real_value(j)}};
    case JSON_TRUE: return vbool(true);
    case JSON_FALSE: return vbool(false);
    default: return (val_t){V_NONE, {0}};
    }
}

static fy_status_t render_guarded(render_t *r, const fy_chat_template_t *t, const fy_chat_msg_t *msgs, size_t n_msgs,
                                  json_t *const *extra, json_t *tools, json_t *vars, bool add_generation_prompt,
                                  frame_t *root)
{
    if (setjmp(r->c.jmp)) return r->c.status;
    r->root = r->top = root;
    if (vars) { /* first, so that the caller's own variables below win */
        const char *key;
        json_t *v;
        json_object_foreach(vars, key, v) dict_set(r, &root->vars, arena_str(r, key, strlen(key)), from_json(r, v, 1));
    }
    list_t *l = list_new(r, n_msgs);
    for (size_t k = 0; k < n_msgs; k++) {
        if (!msgs[k].role) ERR(r, NULL, "message %zu has no role", k);
        dict_t *m = dict_new(r);
        dict_set(r, m, STR("role"), vstr(cstr(msgs[k].role)));
        dict_set(r, m, STR("content"), msgs[k].content ? vstr(cstr(msgs[k].content)) : (val_t){V_NONE, {0}});
        if (extra && extra[k]) { /* tool_calls, tool_call_id, name: beside role and content */
            const char *key;
            json_t *v;
            json_object_foreach(extra[k], key, v)
            {
                if (!strcmp(key, "role") || !strcmp(key, "content")) continue;
                size_t n = strlen(key);
                char *kc = alloc(&r->c, n + 1);
                memcpy(kc, key, n + 1);
                dict_set(r, m, (str_t){kc, n}, from_json(r, v, 1));
            }
        }
        list_push(r, l, (val_t){V_DICT, {.d = m}});
    }
    dict_set(r, &root->vars, STR("messages"), vlist(l));
    if (tools) dict_set(r, &root->vars, STR("tools"), from_json(r, tools, 0));
    dict_set(r, &root->vars, STR("add_generation_prompt"), vbool(add_generation_prompt));
    dict_set(r, &root->vars, STR("bos_token"), vstr(t->bos));
    dict_set(r, &root->vars, STR("eos_token"), vstr(t->eos));
    exec(r, &t->body);
    return FY_OK;
}

fy_status_t fy_chat_template_apply(const fy_chat_template_t *tmpl, const fy_chat_msg_t *msgs, size_t n_msgs,
                                   bool add_generation_prompt, char **out_p)
{
    return fy_chat_template_apply_tools(tmpl, msgs, NULL, n_msgs, NULL, add_generation_prompt, out_p);
}

/* A JSON text of the caller's (tools, a message's extra members) or NULL
 * with the fault logged. */
static json_t *load_json(const char *text, bool object, const char *what, size_t k)
{
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    if (!j || (object ? !json_is_object(j) : !json_is_array(j))) {
        fy_error("chat template: %s %zu is not a JSON %s%s%s", what, k, object ? "object" : "array", j ? "" : ": ",
                 j ? "" : je.text);
        json_decref(j);
        return NULL;
    }
    return j;
}

fy_status_t fy_chat_template_apply_tools(const fy_chat_template_t *tmpl, const fy_chat_msg_t *msgs,
                                         const char *const *extra_json, size_t n_msgs, const char *tools_json,
                                         bool add_generation_prompt, char **out_p)
{
    return fy_chat_template_apply_vars(tmpl, msgs, extra_json, n_msgs, tools_json, NULL, add_generation_prompt, out_p);
}

fy_status_t fy_chat_template_apply_vars(const fy_chat_template_t *tmpl, const fy_chat_msg_t *msgs,
                                        const char *const *extra_json, size_t n_msgs, const char *tools_json,
                                        const char *vars_json, bool add_generation_prompt, char **out_p)
{
    if (!tmpl || !out_p || (n_msgs && !msgs)) {
        fy_error("chat template: apply: no template, messages or output");
        return FY_ERR_INVALID;
    }
    /* the JSON parsed before the render, which may unwind with longjmp,
     * so that everything here is released on every path */
    json_t *tools = NULL, **extra = NULL, *vars = NULL;
    fy_status_t st = FY_OK;
    if (tools_json && !(tools = load_json(tools_json, false, "tools", 0))) return FY_ERR_INVALID;
    if (vars_json && !(vars = load_json(vars_json, true, "the variables", 0))) {
        json_decref(tools);
        return FY_ERR_INVALID;
    }
    for (size_t k = 0; k < n_msgs && st == FY_OK; k++) {
        if (!extra_json || !extra_json[k]) continue;
        if (!extra && !(extra = fy_calloc(n_msgs, sizeof(*extra)))) {
            fy_error("chat template: out of memory");
            st = FY_ERR_NOMEM;
        } else if (!(extra[k] = load_json(extra_json[k], true, "the extra members of message", k))) {
            st = FY_ERR_INVALID;
        }
    }
    arena_t arena = {0};
    buf_t out = {0};
    frame_t root = {0};
    render_t r = {.c = {.arena = &arena, .src = tmpl->src}, .out = &out};
    if (st == FY_OK) st = render_guarded(&r, tmpl, msgs, n_msgs, extra, tools, vars, add_generation_prompt, &root);
    for (size_t k = 0; extra && k < n_msgs; k++) json_decref(extra[k]);
    fy_free(extra);
    json_decref(tools);
    json_decref(vars);
    char *s = NULL;
    if (st == FY_OK && !(s = fy_malloc(out.n + 1))) {
        fy_error("chat template: out of memory");
        st = FY_ERR_NOMEM;
    }
    if (s) {
        if (out.n) memcpy(s, out.p, out.n);
        s[out.n] = '\0';
        *out_p = s;
    }
    arena_free(&arena);
    return st;
}

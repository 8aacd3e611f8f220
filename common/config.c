/*
 * config.c - INI configuration on top of inih.
 *
 * inih parses; we feed it one checked line at a time from a buffer (the
 * reader bounds the line, refuses control characters and broken UTF-8, and
 * drops indentation so that inih never sees a continuation line), check
 * each entry in its handler, and collect a file's entries in a staging list
 * that merges into the configuration only when the whole file is good.
 * Entries live in one flat array; everything here runs at start-up over a
 * few hundred keys, so lookups are linear.
 */
#include "common/config.h"

#include <errno.h>
#include <fcntl.h>
#include <ini.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/size.h"
#include "common/mem.h"

/* inih copies each line into a buffer of INI_MAX_LINE bytes that must also
 * hold "\r\n\0"; a longer line would be split and the rest read as a line
 * of its own.  The reader also checks the size inih actually passes. */
_Static_assert(FY_CONFIG_MAX_LINE + 3 <= INI_MAX_LINE, "a config line must fit inih's line buffer");

typedef struct entry {
    char *section;
    char *key;
    char *value;
    char *origin; /* "file:line" or "--set" */
    char data[];  /* the four strings */
} entry_t;

typedef struct list {
    entry_t **v;
    int n, cap;
} list_t;

struct fy_config {
    list_t l;
};

/* ---- entries and lists ----------------------------------------------------------------------- */

static entry_t *entry_new(const char *section, const char *key, const char *value, const char *origin, int line)
{
    char at[16] = "";
    if (line > 0) snprintf(at, sizeof(at), ":%d", line);
    size_t ls = strlen(section) + 1, lk = strlen(key) + 1, lv = strlen(value) + 1;
    size_t lo = strlen(origin) + strlen(at) + 1;
    entry_t *e = fy_malloc(sizeof(*e) + ls + lk + lv + lo);
    if (!e) return NULL;
    char *p = e->data;
    e->section = memcpy(p, section, ls);
    p += ls;
    e->key = memcpy(p, key, lk);
    p += lk;
    e->value = memcpy(p, value, lv);
    p += lv;
    e->origin = p;
    snprintf(p, lo, "%s%s", origin, at);
    return e;
}

static int list_find(const list_t *l, const char *section, const char *key)
{
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->v[i]->key, key) && !strcmp(l->v[i]->section, section)) return i;
    return -1;
}

static bool list_reserve(list_t *l, int want)
{
    if (want <= l->cap) return true;
    int cap = l->cap ? l->cap : 16;
    while (cap < want) cap *= 2;
    entry_t **v = fy_realloc(l->v, (size_t)cap * sizeof(*v));
    if (!v) return false;
    l->v = v;
    l->cap = cap;
    return true;
}

static void list_clear(list_t *l)
{
    for (int i = 0; i < l->n; i++) fy_free(l->v[i]);
    fy_free(l->v);
    *l = (list_t){0};
}

/* Moves every staged entry into c, replacing same-named ones.  All the
 * room is reserved first, so the merge itself cannot fail half-way. */
static fy_status_t merge(fy_config_t *c, list_t *st, const char *what, fy_status_t too_many)
{
    int fresh = 0;
    for (int i = 0; i < st->n; i++)
        if (list_find(&c->l, st->v[i]->section, st->v[i]->key) < 0) fresh++;
    if (c->l.n + fresh > FY_CONFIG_MAX_ENTRIES) {
        fy_error("config: %s: would make more than %d entries", what, FY_CONFIG_MAX_ENTRIES);
        return too_many;
    }
    if (!list_reserve(&c->l, c->l.n + fresh)) {
        fy_error("config: %s: out of memory merging %d entries", what, st->n);
        return FY_ERR_NOMEM;
    }
    for (int i = 0; i < st->n; i++) {
        entry_t *e = st->v[i];
        int at = list_find(&c->l, e->section, e->key);
        if (at >= 0) {
            fy_free(c->l.v[at]);
            c->l.v[at] = e;
        } else {
            c->l.v[c->l.n++] = e;
        }
    }
    st->n = 0;
    return FY_OK;
}

/* ---- names and bytes ------------------------------------------------------------------------- */

static bool name_char(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '-';
}

static bool valid_key(const char *s, size_t n)
{
    if (n == 0) return false;
    for (size_t i = 0; i < n; i++)
        if (!name_char(s[i])) return false;
    return true;
}

/* Dot-separated components, none empty: "router", "prefill.0". */
static bool valid_section(const char *s, size_t n)
{
    size_t start = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && s[i] != '.') continue;
        if (!valid_key(s + start, i - start)) return false;
        start = i + 1;
    }
    return true;
}

/* Index of the first byte that is not printable UTF-8 (tab allowed), or n;
 * *why_p says what is wrong with it. */
static size_t bad_byte(const char *str, size_t n, const char **why_p)
{
    const unsigned char *s = (const unsigned char *)str;
    for (size_t i = 0; i < n;) {
        unsigned char b = s[i];
        if (b == 0) {
            *why_p = "a NUL byte";
            return i;
        }
        if ((b < 0x20 && b != '\t') || b == 0x7f) {
            *why_p = "a control character";
            return i;
        }
        if (b < 0x80) {
            i++;
            continue;
        }
        size_t len;
        unsigned char lo = 0x80, hi = 0xbf; /* allowed range of the second byte */
        if (b >= 0xc2 && b <= 0xdf)
            len = 2;
        else if (b >= 0xe0 && b <= 0xef) {
            len = 3;
            if (b == 0xe0) lo = 0xa0; /* overlong */
            if (b == 0xed) hi = 0x9f; /* surrogates */
        } else if (b >= 0xf0 && b <= 0xf4) {
            len = 4;
            if (b == 0xf0) lo = 0x90; /* overlong */
            if (b == 0xf4) hi = 0x8f; /* past U+10FFFF */
        } else {
            *why_p = "invalid UTF-8";
            return i;
        }
        if (i + len > n || s[i + 1] < lo || s[i + 1] > hi) {
            *why_p = "invalid UTF-8";
            return i;
        }
        for (size_t k = 2; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80) {
                *why_p = "invalid UTF-8";
                return i;
            }
        }
        i += len;
    }
    return n;
}

/* A ';' at the start of a value or after a blank starts an inline comment
 * when inih reads the line, so such a value would not survive a reload. */
static bool starts_comment(const char *v)
{
    for (const char *s = v; *s; s++)
        if (*s == ';' && (s == v || s[-1] == ' ' || s[-1] == '\t')) return true;
    return false;
}

/* ---- relative paths -------------------------------------------------------------------------- */

/* base (an absolute folder without links: realpath's or getcwd's) joined
 * with rel into out.  Leading "./" and "../" are taken off against base
 * itself: base holds no links, so ".." is its parent by name.  Later ones
 * stay (a "../" after a link is not the link's folder's parent).  False
 * when the result does not fit cap. */
static bool join_path(const char *base, const char *rel, char *out, size_t cap)
{
    size_t n = strlen(base);
    if (n >= cap) return false;
    memcpy(out, base, n + 1);
    for (;;) {
        if (rel[0] == '.' && (rel[1] == '/' || !rel[1])) {
            rel += 1;
        } else if (rel[0] == '.' && rel[1] == '.' && (rel[2] == '/' || !rel[2])) {
            rel += 2;
            char *slash = strrchr(out, '/');
            if (slash) n = slash == out ? 1 : (size_t)(slash - out), out[n] = '\0';
        } else {
            break;
        }
        while (*rel == '/') rel++;
    }
    if (!*rel) return true;
    int w = snprintf(out + n, cap - n, "%s%s", out[n - 1] == '/' ? "" : "/", rel);
    return w >= 0 && (size_t)w < cap - n;
}

/* section.key = value with the relative path it names (fy_conf_path_at)
 * made absolute against base, into out.  *changed_p false: value names no
 * relative path, out untouched.  FY_ERR_INVALID (logged, naming the key,
 * where it was set and the path) when the result would not fit a line of
 * a written configuration (fy_config_write). */
static fy_status_t resolve_path(const char *section, const char *key, const char *value, const char *origin,
                                const char *base, char out[FY_CONFIG_MAX_LINE + 1], bool *changed_p)
{
    *changed_p = false;
    int at = fy_conf_path_at(section, key, value);
    if (at < 0 || value[at] == '/') return FY_OK;
    char joined[PATH_MAX + FY_CONFIG_MAX_LINE];
    size_t room = FY_CONFIG_MAX_LINE - strlen(key) - 3; /* "key = value" on one line */
    if (!join_path(base, value + at, joined, sizeof(joined)) || (size_t)at + strlen(joined) > room) {
        fy_error("config: %s.%s = '%s' (%s): resolved against %s, the path is longer than the %zu bytes a value "
                 "may hold; give it as an absolute path, or move the file nearer",
                 section, key, value, origin, base, room);
        return FY_ERR_INVALID;
    }
    memcpy(out, value, (size_t)at); /* "draft:" */
    memcpy(out + at, joined, strlen(joined) + 1);
    *changed_p = true;
    return FY_OK;
}

/* The folder a file's relative paths are resolved against: the one that
 * holds path, as a canonical absolute name; the working directory for a
 * file that is no plain file (a pipe, <(...)), which has no folder of its
 * own.  False (logged) when neither can be had. */
static bool config_folder(const char *path, int fd, char out[PATH_MAX])
{
    struct stat sb;
    if (fstat(fd, &sb) == 0 && !S_ISREG(sb.st_mode)) {
        if (getcwd(out, PATH_MAX)) return true;
        fy_error("config: %s: cannot get the working directory to resolve its paths against: %m", path);
        return false;
    }
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, sizeof(dir), ".");
    else
        snprintf(dir, sizeof(dir), "%.*s", slash == path ? 1 : (int)(slash - path), path);
    if (realpath(dir, out)) return true;
    fy_error("config: %s: cannot resolve its folder %s: %m", path, dir);
    return false;
}

/* ---- parsing a file -------------------------------------------------------------------------- */

typedef struct parse {
    const char *name;
    const char *buf;
    size_t len, pos;
    int line;                          /* of the line inih is on */
    char text[FY_CONFIG_MAX_LINE + 1]; /* that line, as inih got it */
    list_t staged;
    int err_line; /* first line our own checks refused; 0: none */
    fy_status_t err;
    char msg[384];
} parse_t;

__attribute__((format(printf, 3, 4))) static void refuse(parse_t *p, fy_status_t st, const char *fmt, ...)
{
    if (p->err_line) return;
    p->err_line = p->line;
    p->err = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->msg, sizeof(p->msg), fmt, ap);
    va_end(ap);
}

/* inih's fgets: one line per call, so inih's line numbers are ours.  After
 * a refusal it reports the end of input, which stops inih at once. */
static char *reader(char *str, int num, void *stream)
{
    parse_t *p = stream;
    if (p->err_line || p->pos >= p->len) return NULL;
    const char *s = p->buf + p->pos;
    size_t rest = p->len - p->pos;
    const char *nl = memchr(s, '\n', rest);
    size_t n = nl ? (size_t)(nl - s) : rest;
    p->pos += n + (nl ? 1 : 0);
    p->line++;
    if (n && s[n - 1] == '\r') n--;
    size_t max = FY_CONFIG_MAX_LINE;
    if (num > 0 && (size_t)num - 1 < max) max = (size_t)num - 1;
    if (n > max) {
        refuse(p, FY_ERR_FORMAT, "line longer than %zu bytes", max);
        return NULL;
    }
    const char *why;
    size_t bad = bad_byte(s, n, &why);
    if (bad < n) {
        if (s[bad] == '\0')
            refuse(p, FY_ERR_FORMAT, "a NUL byte at column %zu", bad + 1);
        else
            refuse(p, FY_ERR_FORMAT, "%s (byte 0x%02x) at column %zu", why, (unsigned char)s[bad], bad + 1);
        return NULL;
    }
    while (n && (*s == ' ' || *s == '\t')) s++, n--;
    memcpy(str, s, n);
    str[n] = '\0';
    memcpy(p->text, s, n);
    p->text[n] = '\0';
    return str;
}

static int handler(void *user, const char *section, const char *key, const char *value)
{
    parse_t *p = user;
    if (p->err_line) return 0;
    /* inih also takes "key: value"; a ':' before the '=' would otherwise
     * silently cut a key such as "host:port = 1" */
    if (p->text[strcspn(p->text, "=:")] == ':') {
        refuse(p, FY_ERR_FORMAT, "expected 'key = value' ('key: value' is not accepted)");
        return 0;
    }
    size_t ls = strlen(section), lk = strlen(key);
    if (ls == 0) {
        refuse(p, FY_ERR_FORMAT, "key '%s' comes before any [section]", key);
        return 0;
    }
    /* inih truncates section names to 49 bytes; anything that long is
     * refused rather than read as a shorter name */
    if (ls > FY_CONFIG_MAX_SECTION) {
        refuse(p, FY_ERR_FORMAT, "key '%s' is in a section whose name is longer than %d bytes", key,
               FY_CONFIG_MAX_SECTION);
        return 0;
    }
    if (!valid_section(section, ls)) {
        refuse(p, FY_ERR_FORMAT,
               "key '%s' is in section '[%s]', which is not a valid name (letters, digits, '_', '-', '.')", key,
               section);
        return 0;
    }
    if (lk == 0) {
        refuse(p, FY_ERR_FORMAT, "a value without a key");
        return 0;
    }
    if (lk > FY_CONFIG_MAX_KEY) {
        refuse(p, FY_ERR_FORMAT, "key longer than %d bytes", FY_CONFIG_MAX_KEY);
        return 0;
    }
    if (!valid_key(key, lk)) {
        refuse(p, FY_ERR_FORMAT, "'%s' is not a valid key (letters, digits, '_', '-')", key);
        return 0;
    }
    int dup = list_find(&p->staged, section, key);
    if (dup >= 0) {
        refuse(p, FY_ERR_FORMAT, "'%s.%s' is set twice (first at %s)", section, key, p->staged.v[dup]->origin);
        return 0;
    }
    if (p->staged.n >= FY_CONFIG_MAX_ENTRIES) {
        refuse(p, FY_ERR_FORMAT, "more than %d entries", FY_CONFIG_MAX_ENTRIES);
        return 0;
    }
    entry_t *e = entry_new(section, key, value, p->name, p->line);
    if (!e || !list_reserve(&p->staged, p->staged.n + 1)) {
        fy_free(e);
        refuse(p, FY_ERR_NOMEM, "out of memory");
        return 0;
    }
    p->staged.v[p->staged.n++] = e;
    return 1;
}

/* inih refused line `line` without our handler: say why from its text. */
static void explain_syntax(const parse_t *p, int line)
{
    const char *s = p->buf, *end = p->buf + p->len;
    for (int i = 1; i < line && s < end; i++) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        s = nl ? nl + 1 : end;
    }
    const char *nl = memchr(s, '\n', (size_t)(end - s));
    size_t n = nl ? (size_t)(nl - s) : (size_t)(end - s);
    if (n && s[n - 1] == '\r') n--;
    while (n && (*s == ' ' || *s == '\t')) s++, n--;
    size_t show = n;
    if (show > 60) {
        show = 60;
        while (show && ((unsigned char)s[show] & 0xc0) == 0x80) show--; /* whole UTF-8 characters */
    }
    const char *why = n && *s == '[' ? "section header without ']'" : "expected 'key = value'";
    fy_error("config: %s:%d: %s: '%.*s%s'", p->name, line, why, (int)show, s, show < n ? "..." : "");
}

/* Every staged entry that names a relative path, made absolute against
 * base (its file's folder), so that the value means the same whatever the
 * working directory and wherever the merged configuration is written. */
static fy_status_t resolve_staged(list_t *st, const char *base)
{
    for (int i = 0; i < st->n; i++) {
        entry_t *e = st->v[i];
        char value[FY_CONFIG_MAX_LINE + 1];
        bool changed;
        fy_status_t r = resolve_path(e->section, e->key, e->value, e->origin, base, value, &changed);
        if (r) return FY_ERR_FORMAT;
        if (!changed) continue;
        entry_t *n = entry_new(e->section, e->key, value, e->origin, 0);
        if (!n) {
            fy_error("config: %s: out of memory", e->origin);
            return FY_ERR_NOMEM;
        }
        fy_free(e);
        st->v[i] = n;
    }
    return FY_OK;
}

/* Parses buf and merges it into c; base: the folder its relative paths
 * are resolved against, NULL to keep them as written. */
static fy_status_t parse_buffer(fy_config_t *c, const char *buf, size_t len, const char *name, const char *base)
{
    parse_t *p = fy_calloc(1, sizeof(*p));
    if (!p) {
        fy_error("config: %s: out of memory", name);
        return FY_ERR_NOMEM;
    }
    p->name = name;
    p->buf = buf;
    p->len = len;
    int r = ini_parse_stream(reader, p, handler, p);
    fy_status_t st = FY_OK;
    if (r > 0 && (!p->err_line || r < p->err_line)) {
        explain_syntax(p, r);
        st = FY_ERR_FORMAT;
    } else if (p->err_line) {
        fy_error("config: %s:%d: %s", name, p->err_line, p->msg);
        st = p->err;
    } else if (r < 0) {
        fy_error("config: %s: the ini parser failed (%d)", name, r);
        st = r == -2 ? FY_ERR_NOMEM : FY_ERR_INTERNAL;
    } else {
        st = base ? resolve_staged(&p->staged, base) : FY_OK;
        if (st == FY_OK) st = merge(c, &p->staged, name, FY_ERR_FORMAT);
    }
    list_clear(&p->staged);
    fy_free(p);
    return st;
}

/* ---- public: create, load, set --------------------------------------------------------------- */

fy_status_t fy_config_create(fy_config_t **c_p)
{
    fy_config_t *c = fy_calloc(1, sizeof(*c));
    if (!c) {
        fy_error("config: out of memory");
        return FY_ERR_NOMEM;
    }
    *c_p = c;
    return FY_OK;
}

void fy_config_destroy(fy_config_t *c)
{
    if (!c) return;
    list_clear(&c->l);
    fy_free(c);
}

fy_status_t fy_config_load_string(fy_config_t *c, const char *text, const char *name)
{
    if (!name) name = "<string>";
    size_t len = strnlen(text, (size_t)FY_CONFIG_MAX_FILE + 1);
    if (len > FY_CONFIG_MAX_FILE) {
        fy_error("config: %s: larger than %d bytes", name, FY_CONFIG_MAX_FILE);
        return FY_ERR_FORMAT;
    }
    return parse_buffer(c, text, len, name, NULL);
}

fy_status_t fy_config_load(fy_config_t *c, const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fy_status_t st = errno == ENOENT ? FY_ERR_NOT_FOUND : FY_ERR_IO;
        fy_error("config: %s: cannot open: %m", path);
        return st;
    }
    /* read through a growing buffer rather than trusting st_size: the path
     * may be a pipe (<(...)) or a file that is still being written */
    fy_status_t st = FY_OK;
    size_t len = 0, cap = 4096;
    char *buf = fy_malloc(cap);
    if (!buf) goto nomem;
    for (;;) {
        if (len == cap) {
            if (cap > FY_CONFIG_MAX_FILE) {
                fy_error("config: %s: larger than %d bytes", path, FY_CONFIG_MAX_FILE);
                st = FY_ERR_FORMAT;
                goto out;
            }
            char *b = fy_realloc(buf, cap * 2);
            if (!b) goto nomem;
            buf = b;
            cap *= 2;
        }
        ssize_t n = read(fd, buf + len, cap - len);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            fy_error("config: %s: cannot read: %m", path);
            st = FY_ERR_IO;
            goto out;
        }
        if (n == 0) break;
        len += (size_t)n;
    }
    if (len > FY_CONFIG_MAX_FILE) {
        fy_error("config: %s: larger than %d bytes", path, FY_CONFIG_MAX_FILE);
        st = FY_ERR_FORMAT;
        goto out;
    }
    char base[PATH_MAX];
    if (!config_folder(path, fd, base)) {
        st = FY_ERR_IO;
        goto out;
    }
    st = parse_buffer(c, buf, len, path, base);
    goto out;
nomem:
    fy_error("config: %s: out of memory reading it", path);
    st = FY_ERR_NOMEM;
out:
    fy_free(buf);
    close(fd);
    return st;
}

static const char *skip_blank(const char *s, const char *end)
{
    while (s < end && (*s == ' ' || *s == '\t')) s++;
    return s;
}

static const char *trim_blank_end(const char *s, const char *end)
{
    while (end > s && (end[-1] == ' ' || end[-1] == '\t')) end--;
    return end;
}

fy_status_t fy_config_set(fy_config_t *c, const char *assignment)
{
    const char *eq = strchr(assignment, '=');
    if (!eq) {
        fy_error("config: --set '%.80s': expected section.key=value", assignment);
        return FY_ERR_INVALID;
    }
    const char *ls = skip_blank(assignment, eq), *le = trim_blank_end(ls, eq);
    const char *dot = NULL;
    for (const char *s = ls; s < le; s++)
        if (*s == '.') dot = s;
    if (!dot) {
        fy_error("config: --set '%.80s': expected section.key=value", assignment);
        return FY_ERR_INVALID;
    }
    size_t nsec = (size_t)(dot - ls), nkey = (size_t)(le - dot - 1);
    if (nsec > FY_CONFIG_MAX_SECTION || !valid_section(ls, nsec)) {
        fy_error("config: --set '%.*s': '%.*s' is not a valid section name (letters, digits, '_', '-', '.'; at most "
                 "%d bytes)",
                 (int)FY_MIN(le - ls, 120), ls, (int)FY_MIN(nsec, 120), ls, FY_CONFIG_MAX_SECTION);
        return FY_ERR_INVALID;
    }
    if (nkey > FY_CONFIG_MAX_KEY || !valid_key(dot + 1, nkey)) {
        fy_error("config: --set '%.*s': '%.*s' is not a valid key (letters, digits, '_', '-'; at most %d bytes)",
                 (int)FY_MIN(le - ls, 120), ls, (int)FY_MIN(nkey, 80), dot + 1, FY_CONFIG_MAX_KEY);
        return FY_ERR_INVALID;
    }
    char section[FY_CONFIG_MAX_SECTION + 1], key[FY_CONFIG_MAX_KEY + 1];
    memcpy(section, ls, nsec);
    section[nsec] = '\0';
    memcpy(key, dot + 1, nkey);
    key[nkey] = '\0';

    const char *end = eq + 1 + strlen(eq + 1);
    const char *vs = skip_blank(eq + 1, end), *ve = trim_blank_end(vs, end);
    size_t nval = (size_t)(ve - vs);
    /* fy_config_write writes "key = value" on one line */
    if (nkey + 3 + nval > FY_CONFIG_MAX_LINE) {
        fy_error("config: --set %s.%s: value too long (%zu bytes; 'key = value' must fit %d bytes)", section, key, nval,
                 FY_CONFIG_MAX_LINE);
        return FY_ERR_INVALID;
    }
    const char *why;
    size_t bad = bad_byte(vs, nval, &why);
    if (bad < nval) {
        fy_error("config: --set %s.%s: the value holds %s (byte 0x%02x) at column %zu", section, key, why,
                 (unsigned char)vs[bad], bad + 1);
        return FY_ERR_INVALID;
    }
    char value[FY_CONFIG_MAX_LINE + 1];
    memcpy(value, vs, nval);
    value[nval] = '\0';
    if (starts_comment(value)) {
        fy_error("config: --set %s.%s = '%s': a ';' at the start or after a blank would read back as a comment",
                 section, key, value);
        return FY_ERR_INVALID;
    }
    /* a path on the command line means what it does to the user typing it:
     * relative to the working directory */
    char resolved[FY_CONFIG_MAX_LINE + 1], cwd[PATH_MAX];
    bool changed = false;
    int at = fy_conf_path_at(section, key, value);
    if (at >= 0 && value[at] != '/') {
        if (!getcwd(cwd, sizeof(cwd))) {
            fy_error("config: --set %s.%s: cannot get the working directory to resolve '%s' against: %m", section, key,
                     value);
            return FY_ERR_INVALID;
        }
        if (resolve_path(section, key, value, "--set", cwd, resolved, &changed)) return FY_ERR_INVALID;
    }
    entry_t *e = entry_new(section, key, changed ? resolved : value, "--set", 0);
    if (!e) {
        fy_error("config: --set %s.%s: out of memory", section, key);
        return FY_ERR_NOMEM;
    }
    list_t one = {.v = &e, .n = 1, .cap = 1};
    char what[FY_CONFIG_MAX_SECTION + FY_CONFIG_MAX_KEY + 16];
    snprintf(what, sizeof(what), "--set %s.%s", section, key);
    fy_status_t st = merge(c, &one, what, FY_ERR_INVALID);
    if (st != FY_OK) fy_free(e);
    return st;
}

/* ---- lookups and typed getters --------------------------------------------------------------- */

static const entry_t *lookup(const fy_config_t *c, const char *section, const char *key)
{
    int i = list_find(&c->l, section, key);
    return i < 0 ? NULL : c->l.v[i];
}

const char *fy_config_get(const fy_config_t *c, const char *section, const char *key)
{
    const entry_t *e = lookup(c, section, key);
    return e ? e->value : NULL;
}

const char *fy_config_origin(const fy_config_t *c, const char *section, const char *key)
{
    const entry_t *e = lookup(c, section, key);
    return e ? e->origin : NULL;
}

int fy_config_count(const fy_config_t *c) { return c->l.n; }

__attribute__((format(printf, 2, 3))) static fy_status_t refuse_value(const entry_t *e, const char *fmt, ...)
{
    char want[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(want, sizeof(want), fmt, ap);
    va_end(ap);
    fy_error("config: %s.%s = '%s' (%s): expected %s", e->section, e->key, e->value, e->origin, want);
    return FY_ERR_INVALID;
}

/* Plain decimal: strtoll and strtod would also take leading blanks, and
 * strtod hexadecimal, infinities and NaN. */
static bool decimal_start(const char *s)
{
    if (*s == '+' || *s == '-') s++;
    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) return false;
    return (*s >= '0' && *s <= '9') || (*s == '.' && s[1] >= '0' && s[1] <= '9');
}

fy_status_t fy_config_int(const fy_config_t *c, const char *section, const char *key, int64_t def, int64_t lo,
                          int64_t hi, int64_t *out)
{
    const entry_t *e = lookup(c, section, key);
    if (!e) {
        *out = def;
        return FY_OK;
    }
    const char *s = e->value;
    const char *d = s + (*s == '+' || *s == '-');
    if (*d >= '0' && *d <= '9') {
        char *end;
        errno = 0;
        long long v = strtoll(s, &end, 10);
        if (!errno && !*end && v >= lo && v <= hi) {
            *out = v;
            return FY_OK;
        }
    }
    if (lo == INT64_MIN && hi == INT64_MAX) return refuse_value(e, "an integer");
    if (hi == INT64_MAX) return refuse_value(e, "an integer >= %lld", (long long)lo);
    if (lo == INT64_MIN) return refuse_value(e, "an integer <= %lld", (long long)hi);
    return refuse_value(e, "an integer in [%lld, %lld]", (long long)lo, (long long)hi);
}

fy_status_t fy_config_double(const fy_config_t *c, const char *section, const char *key, double def, double lo,
                             double hi, double *out)
{
    const entry_t *e = lookup(c, section, key);
    if (!e) {
        *out = def;
        return FY_OK;
    }
    if (decimal_start(e->value)) {
        char *end;
        errno = 0;
        double v = strtod(e->value, &end);
        if (!errno && !*end && isfinite(v) && v >= lo && v <= hi) {
            *out = v;
            return FY_OK;
        }
    }
    if (isinf(lo) && isinf(hi)) return refuse_value(e, "a finite number");
    if (isinf(hi)) return refuse_value(e, "a number >= %g", lo);
    if (isinf(lo)) return refuse_value(e, "a number <= %g", hi);
    return refuse_value(e, "a number in [%g, %g]", lo, hi);
}

fy_status_t fy_config_bool(const fy_config_t *c, const char *section, const char *key, bool def, bool *out)
{
    const entry_t *e = lookup(c, section, key);
    if (!e) {
        *out = def;
        return FY_OK;
    }
    static const char *yes[] = {"true", "yes", "on", "1"}, *no[] = {"false", "no", "off", "0"};
    for (size_t i = 0; i < FY_ARRAY_LEN(yes); i++) {
        if (!strcasecmp(e->value, yes[i])) {
            *out = true;
            return FY_OK;
        }
        if (!strcasecmp(e->value, no[i])) {
            *out = false;
            return FY_OK;
        }
    }
    return refuse_value(e, "true or false (or yes/no, on/off, 1/0)");
}

fy_status_t fy_config_size(const fy_config_t *c, const char *section, const char *key, int64_t def, int64_t lo,
                           int64_t hi, int64_t *out)
{
    const entry_t *e = lookup(c, section, key);
    if (!e) {
        *out = def;
        return FY_OK;
    }
    char what[FY_CONFIG_MAX_SECTION + FY_CONFIG_MAX_KEY + 128];
    snprintf(what, sizeof(what), "config: %s.%s (%.*s)", e->section, e->key, 100, e->origin);
    int64_t v;
    if (fy_parse_size(what, e->value, &v) != FY_OK) return FY_ERR_INVALID; /* logged, with examples */
    if (v < lo || v > hi) return refuse_value(e, "a size in [%lld, %lld] bytes", (long long)lo, (long long)hi);
    *out = v;
    return FY_OK;
}

static bool parse_duration(const char *s, double *out_s)
{
    static const struct {
        const char *unit;
        double seconds;
    } units[] = {{"", 1}, {"s", 1}, {"ms", 1e-3}, {"us", 1e-6}, {"m", 60}, {"min", 60}, {"h", 3600}};
    if (*s == '+' || *s == '-' || !decimal_start(s)) return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || !isfinite(v) || v < 0) return false;
    for (size_t i = 0; i < FY_ARRAY_LEN(units); i++) {
        if (strcmp(end, units[i].unit)) continue;
        *out_s = v * units[i].seconds;
        return isfinite(*out_s);
    }
    return false;
}

fy_status_t fy_config_duration(const fy_config_t *c, const char *section, const char *key, double def_s, double lo_s,
                               double hi_s, double *out_s)
{
    const entry_t *e = lookup(c, section, key);
    if (!e) {
        *out_s = def_s;
        return FY_OK;
    }
    double v;
    if (!parse_duration(e->value, &v) || v < lo_s || v > hi_s) {
        const char *eg = "(e.g. 250ms, 2s, 1.5m; a bare number is seconds)";
        if (isinf(hi_s)) return refuse_value(e, "a duration of at least %g s %s", lo_s, eg);
        return refuse_value(e, "a duration in [%g s, %g s] %s", lo_s, hi_s, eg);
    }
    *out_s = v;
    return FY_OK;
}

fy_status_t fy_config_string(const fy_config_t *c, const char *section, const char *key, const char *def,
                             const char **out)
{
    const entry_t *e = lookup(c, section, key);
    *out = e ? e->value : def;
    return FY_OK;
}

/* ---- known keys ------------------------------------------------------------------------------ */

static bool known_match(const char *known, const entry_t *e)
{
    size_t ls = strlen(e->section);
    if (strncmp(known, e->section, ls) || known[ls] != '.') return false;
    const char *rest = known + ls + 1;
    return !strcmp(rest, "*") || !strcmp(rest, e->key);
}

/* Levenshtein distance, or a large number for long strings. */
static int distance(const char *a, const char *b)
{
    enum { CAP = FY_CONFIG_MAX_SECTION + FY_CONFIG_MAX_KEY + 2 };
    size_t na = strlen(a), nb = strlen(b);
    if (na >= CAP || nb >= CAP) return 1 << 20;
    int row[CAP + 1];
    for (size_t j = 0; j <= nb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= na; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= nb; j++) {
            int up = row[j];
            int best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[nb];
}

fy_status_t fy_config_check_known(const fy_config_t *c, const char *const *known, int n_known)
{
    int unknown = 0;
    for (int i = 0; i < c->l.n; i++) {
        const entry_t *e = c->l.v[i];
        bool ok = false;
        for (int k = 0; k < n_known && !ok; k++) ok = known_match(known[k], e);
        if (ok) continue;
        char full[FY_CONFIG_MAX_SECTION + FY_CONFIG_MAX_KEY + 2];
        snprintf(full, sizeof(full), "%s.%s", e->section, e->key);
        const char *near = NULL;
        int best = 3; /* suggest only what a typo or two away */
        for (int k = 0; k < n_known; k++) {
            size_t lk = strlen(known[k]);
            if (lk >= 2 && !strcmp(known[k] + lk - 2, ".*")) continue;
            int d = distance(full, known[k]);
            if (d < best) best = d, near = known[k];
        }
        if (near)
            fy_error("config: unknown key '%s' (%s); did you mean '%s'?", full, e->origin, near);
        else
            fy_error("config: unknown key '%s' (%s)", full, e->origin);
        unknown++;
    }
    return unknown ? FY_ERR_INVALID : FY_OK;
}

/* ---- the schema (confkeys.c): typed reads with the table's default and range --------------------- */

/* The table's row for a read of type want (a STRING read also takes an
 * ENUM); NULL, logged, for a key the table lacks or a read of another type:
 * a bug in the caller, never a fault of the file. */
static const fy_conf_key_t *schema_key(const char *section, const char *key, fy_conf_type_t want)
{
    const fy_conf_key_t *k = fy_conf_key(section, key);
    if (!k) {
        fy_error("config: %s.%s is read but is not in the key table (common/confkeys.c)", section, key);
        return NULL;
    }
    if (k->type != want && !(want == FY_CONF_STRING && k->type == FY_CONF_ENUM)) {
        fy_error("config: %s.%s is of type %s in the key table, but read as %s", section, key,
                 fy_conf_type_str(k->type), fy_conf_type_str(want));
        return NULL;
    }
    return k;
}

/* Is v (n bytes) one of "a|b|c"?  *index_p: which. */
static bool choice_index(const char *choices, const char *v, int *index_p)
{
    size_t n = strlen(v);
    int i = 0;
    for (const char *s = choices;; i++) {
        const char *bar = strchr(s, '|');
        size_t len = bar ? (size_t)(bar - s) : strlen(s);
        if (len == n && !strncmp(s, v, n)) {
            *index_p = i;
            return true;
        }
        if (!bar) return false;
        s = bar + 1;
    }
}

/* "recompute|swap" -> "recompute or swap", "8|16|32" -> "8, 16 or 32". */
static void choices_text(const char *choices, char *out, size_t cap)
{
    size_t n = 0;
    out[0] = '\0';
    for (const char *s = choices; *s;) {
        const char *bar = strchr(s, '|');
        size_t len = bar ? (size_t)(bar - s) : strlen(s);
        const char *sep = s == choices ? "" : bar ? ", " : " or ";
        int w = snprintf(out + n, cap - n, "%s%.*s", sep, (int)len, s);
        if (w < 0 || (size_t)w >= cap - n) break;
        n += (size_t)w;
        if (!bar) break;
        s = bar + 1;
    }
}

/* A value of the key's choices, or a refusal naming them. */
static fy_status_t check_choice(const fy_config_t *c, const fy_conf_key_t *k, int *index_p)
{
    const entry_t *e = lookup(c, k->section, k->key);
    if (!e) return FY_OK;
    if (choice_index(k->choices, e->value, index_p)) return FY_OK;
    char want[160];
    choices_text(k->choices, want, sizeof(want));
    return refuse_value(e, "%s", want);
}

/* For a key whose default is another key's value (def_from) and that c
 * does not set: that other key's row, read in its place.  Else NULL. */
static const fy_conf_key_t *delegate(const fy_config_t *c, const fy_conf_key_t *k)
{
    if (!k->def_from || (c && lookup(c, k->section, k->key))) return NULL;
    char section[FY_CONFIG_MAX_SECTION + 1];
    const char *dot = strchr(k->def_from, '.');
    snprintf(section, sizeof(section), "%.*s", (int)(dot - k->def_from), k->def_from);
    return fy_conf_key(section, dot + 1);
}

static bool parse_int(const char *s, int64_t *v)
{
    const char *d = s + (*s == '+' || *s == '-');
    if (*d < '0' || *d > '9') return false;
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (errno || *end) return false;
    *v = x;
    return true;
}

static bool parse_double(const char *s, double *v)
{
    if (!decimal_start(s)) return false;
    char *end;
    errno = 0;
    double x = strtod(s, &end);
    if (errno || *end || !isfinite(x)) return false;
    *v = x;
    return true;
}

static fy_status_t bad_default(const fy_conf_key_t *k, const char *text)
{
    fy_error("config: the default of %s.%s ('%s') is not a valid %s", k->section, k->key, text ? text : "(unset)",
             fy_conf_type_str(k->type));
    return FY_ERR_INTERNAL;
}

fy_status_t fy_conf_string(const fy_config_t *c, const char *section, const char *key, const char **out)
{
    const fy_conf_key_t *k = schema_key(section, key, FY_CONF_STRING), *o;
    if (!k) return FY_ERR_INTERNAL;
    if ((o = delegate(c, k))) return fy_conf_string(c, o->section, o->key, out);
    int idx;
    fy_status_t st = k->choices && c ? check_choice(c, k, &idx) : FY_OK;
    if (st) return st;
    const entry_t *e = c ? lookup(c, section, key) : NULL;
    *out = e ? e->value : k->def;
    return FY_OK;
}

fy_status_t fy_conf_copy(const fy_config_t *c, const char *section, const char *key, char *out, size_t cap)
{
    const char *v;
    fy_status_t st = fy_conf_string(c, section, key, &v);
    if (st) return st;
    if (!v) v = "";
    size_t n = strlen(v);
    if (n >= cap) {
        fy_error("config: %s.%s: %zu bytes; at most %zu fit here", section, key, n, cap - 1);
        return FY_ERR_INVALID;
    }
    memcpy(out, v, n + 1);
    return FY_OK;
}

fy_status_t fy_conf_enum(const fy_config_t *c, const char *section, const char *key, int *out)
{
    const fy_conf_key_t *k = schema_key(section, key, FY_CONF_ENUM);
    if (!k) return FY_ERR_INTERNAL;
    const char *v;
    fy_status_t st = fy_conf_string(c, section, key, &v);
    if (st) return st;
    int idx;
    if (!v || !choice_index(k->choices, v, &idx)) return bad_default(k, v);
    *out = idx;
    return FY_OK;
}

/* The row for a numeric or boolean read of section.key, and its default's
 * text: NULL where the key is set in c and has no default of its own
 * (def_from), the default then being unused.  *o_p: the row to read in
 * its place (delegate), or NULL. */
static fy_status_t schema_default(const fy_config_t *c, const char *section, const char *key, fy_conf_type_t t,
                                  const fy_conf_key_t **k_p, const fy_conf_key_t **o_p, const char **text_p)
{
    const fy_conf_key_t *k = schema_key(section, key, t);
    if (!k) return FY_ERR_INTERNAL;
    *k_p = k;
    *o_p = delegate(c, k);
    if (k->def_from && !*o_p) { /* set in c: the default is not used */
        *text_p = NULL;
        return FY_OK;
    }
    if (!k->def && !*o_p) return bad_default(k, NULL);
    *text_p = k->def;
    return FY_OK;
}

fy_status_t fy_conf_int(const fy_config_t *c, const char *section, const char *key, int64_t *out)
{
    const fy_conf_key_t *k, *o;
    const char *text;
    int64_t def = 0;
    int idx;
    fy_status_t st = schema_default(c, section, key, FY_CONF_INT, &k, &o, &text);
    if (st) return st;
    if (o) return fy_conf_int(c, o->section, o->key, out);
    if (text && !parse_int(text, &def)) return bad_default(k, text);
    if (k->choices && c && (st = check_choice(c, k, &idx))) return st;
    if (!c) {
        *out = def;
        return FY_OK;
    }
    return fy_config_int(c, section, key, def, (int64_t)k->lo, (int64_t)k->hi, out);
}

fy_status_t fy_conf_float(const fy_config_t *c, const char *section, const char *key, double *out)
{
    const fy_conf_key_t *k, *o;
    const char *text;
    double def = 0;
    fy_status_t st = schema_default(c, section, key, FY_CONF_FLOAT, &k, &o, &text);
    if (st) return st;
    if (o) return fy_conf_float(c, o->section, o->key, out);
    if (text && !parse_double(text, &def)) return bad_default(k, text);
    if (!c) {
        *out = def;
        return FY_OK;
    }
    return fy_config_double(c, section, key, def, k->lo, k->hi, out);
}

fy_status_t fy_conf_bool(const fy_config_t *c, const char *section, const char *key, bool *out)
{
    const fy_conf_key_t *k, *o;
    const char *text;
    fy_status_t st = schema_default(c, section, key, FY_CONF_BOOL, &k, &o, &text);
    if (st) return st;
    if (o) return fy_conf_bool(c, o->section, o->key, out);
    if (text && strcmp(text, "true") && strcmp(text, "false")) return bad_default(k, text);
    bool def = text && !strcmp(text, "true");
    if (!c) {
        *out = def;
        return FY_OK;
    }
    return fy_config_bool(c, section, key, def, out);
}

fy_status_t fy_conf_size(const fy_config_t *c, const char *section, const char *key, int64_t *out)
{
    const fy_conf_key_t *k, *o;
    const char *text;
    int64_t def = 0;
    fy_status_t st = schema_default(c, section, key, FY_CONF_SIZE, &k, &o, &text);
    if (st) return st;
    if (o) return fy_conf_size(c, o->section, o->key, out);
    if (text && fy_parse_size("config: default", text, &def) != FY_OK) return bad_default(k, text);
    if (!c) {
        *out = def;
        return FY_OK;
    }
    return fy_config_size(c, section, key, def, (int64_t)k->lo, (int64_t)k->hi, out);
}

fy_status_t fy_conf_duration(const fy_config_t *c, const char *section, const char *key, double *out_s)
{
    const fy_conf_key_t *k, *o;
    const char *text;
    double def = 0;
    fy_status_t st = schema_default(c, section, key, FY_CONF_DURATION, &k, &o, &text);
    if (st) return st;
    if (o) return fy_conf_duration(c, o->section, o->key, out_s);
    if (text && !parse_duration(text, &def)) return bad_default(k, text);
    if (!c) {
        *out_s = def;
        return FY_OK;
    }
    return fy_config_duration(c, section, key, def, k->lo, k->hi, out_s);
}

/* The closest key of the table to an unknown one: a typo or two away, a
 * key of the same section that it is the start of ("decode.max_batch":
 * "decode.max_batch_tokens"), or the same key in another section
 * ("router.threads": "prefill.threads").  NULL when none is near. */
static const fy_conf_key_t *suggest(const entry_t *e, const char *full)
{
    int n;
    const fy_conf_key_t *keys = fy_conf_keys(&n), *near = NULL, *prefix = NULL, *moved = NULL;
    int best = 3;
    size_t lk = strlen(e->key);
    for (int i = 0; i < n; i++) {
        char name[FY_CONFIG_MAX_SECTION + FY_CONFIG_MAX_KEY + 2];
        snprintf(name, sizeof(name), "%s.%s", keys[i].section, keys[i].key);
        int d = distance(full, name);
        if (d < best) best = d, near = &keys[i];
        if (!prefix && lk >= 4 && !strcmp(keys[i].section, e->section) && !strncmp(keys[i].key, e->key, lk))
            prefix = &keys[i];
        if (!moved && !strcmp(keys[i].key, e->key)) moved = &keys[i];
    }
    return near ? near : prefix ? prefix : moved;
}

/* Does the table hold a key of section s? */
static bool known_section(const char *s)
{
    int n;
    const fy_conf_key_t *keys = fy_conf_keys(&n);
    for (int i = 0; i < n; i++)
        if (!strcmp(keys[i].section, s)) return true;
    return false;
}

/* The table's section nearest to an unknown one, a typo or two away
 * ("decod": "decode"), or NULL. */
static const char *near_section(const char *s)
{
    int n, best = 3;
    const fy_conf_key_t *keys = fy_conf_keys(&n);
    const char *near = NULL;
    for (int i = 0; i < n; i++) {
        int d = distance(s, keys[i].section);
        if (d < best) best = d, near = keys[i].section;
    }
    return near;
}

/* Entry i is in a section the table does not know: one line for the
 * whole section, at its first entry, rather than one per key (a misspelt
 * [decod] would otherwise give a line for each of its keys).  False for a
 * later entry of a section already reported. */
static bool report_section(const fy_config_t *c, int i)
{
    const entry_t *e = c->l.v[i];
    int keys = 0;
    for (int j = 0; j < c->l.n; j++) {
        if (strcmp(c->l.v[j]->section, e->section)) continue;
        if (j < i) return false;
        keys++;
    }
    const char *near = near_section(e->section);
    if (near)
        fy_error("config: unknown section '%s' (%s, %d key%s); did you mean '%s'?", e->section, e->origin, keys,
                 keys == 1 ? "" : "s", near);
    else
        fy_error("config: unknown section '%s' (%s, %d key%s)", e->section, e->origin, keys, keys == 1 ? "" : "s");
    return true;
}

fy_status_t fy_conf_check(const fy_config_t *c, bool values)
{
    int bad = 0;
    for (int i = 0; i < c->l.n; i++) {
        const entry_t *e = c->l.v[i];
        const fy_conf_key_t *k = fy_conf_key(e->section, e->key);
        if (!k && !known_section(e->section)) {
            bad += report_section(c, i);
            continue;
        }
        if (!k) {
            char full[FY_CONFIG_MAX_SECTION + FY_CONFIG_MAX_KEY + 2];
            snprintf(full, sizeof(full), "%s.%s", e->section, e->key);
            const fy_conf_key_t *near = suggest(e, full);
            if (near)
                fy_error("config: unknown key '%s' (%s); did you mean '%s.%s'?", full, e->origin, near->section,
                         near->key);
            else
                fy_error("config: unknown key '%s' (%s)", full, e->origin);
            bad++;
            continue;
        }
        if (!values) continue;
        union {
            const char *s;
            int64_t i;
            double d;
            bool b;
            int x;
        } v;
        fy_status_t st = FY_OK;
        switch (k->type) {
        case FY_CONF_STRING: st = fy_conf_string(c, e->section, e->key, &v.s); break;
        case FY_CONF_INT: st = fy_conf_int(c, e->section, e->key, &v.i); break;
        case FY_CONF_FLOAT: st = fy_conf_float(c, e->section, e->key, &v.d); break;
        case FY_CONF_BOOL: st = fy_conf_bool(c, e->section, e->key, &v.b); break;
        case FY_CONF_SIZE: st = fy_conf_size(c, e->section, e->key, &v.i); break;
        case FY_CONF_DURATION: st = fy_conf_duration(c, e->section, e->key, &v.d); break;
        case FY_CONF_ENUM: st = fy_conf_enum(c, e->section, e->key, &v.x); break;
        }
        if (st) bad++;
    }
    return bad ? FY_ERR_INVALID : FY_OK;
}

/* ---- writing --------------------------------------------------------------------------------- */

fy_status_t fy_config_write(const fy_config_t *c, const char *path)
{
    size_t n = strlen(path) + 32;
    char *tmp = fy_malloc(n);
    if (!tmp) {
        fy_error("config: %s: out of memory", path);
        return FY_ERR_NOMEM;
    }
    snprintf(tmp, n, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "we");
    if (!f) {
        fy_error("config: cannot create %s: %m", tmp);
        fy_free(tmp);
        return FY_ERR_IO;
    }
    fprintf(f, "; ferry configuration, merged from its files and --set options\n");
    for (int i = 0; i < c->l.n; i++) {
        const char *sec = c->l.v[i]->section;
        bool seen = false;
        for (int j = 0; j < i && !seen; j++) seen = !strcmp(c->l.v[j]->section, sec);
        if (seen) continue;
        fprintf(f, "\n[%s]\n", sec);
        /* "key =;x" holds ";x", but "key = ;x" an empty value and a comment:
         * no blank before a value that starts with ';'; and none around the
         * '=' where they would take the line past FY_CONFIG_MAX_LINE (a file
         * may have held "key=value" on a full line) */
        for (int j = i; j < c->l.n; j++) {
            const entry_t *e = c->l.v[j];
            if (strcmp(e->section, sec)) continue;
            bool tight = strlen(e->key) + 3 + strlen(e->value) > FY_CONFIG_MAX_LINE;
            fprintf(f, "%s%s=%s%s\n", e->key, tight ? "" : " ", e->value[0] == ';' || tight ? "" : " ", e->value);
        }
    }
    bool failed = ferror(f) != 0;
    if (fclose(f) != 0) failed = true;
    if (failed) {
        fy_error("config: cannot write %s: %m", tmp);
        unlink(tmp);
        fy_free(tmp);
        return FY_ERR_IO;
    }
    if (rename(tmp, path) != 0) {
        fy_error("config: cannot rename %s to %s: %m", tmp, path);
        unlink(tmp);
        fy_free(tmp);
        return FY_ERR_IO;
    }
    fy_free(tmp);
    return FY_OK;
}

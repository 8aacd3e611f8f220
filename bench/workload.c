/*
 * workload.c - requests and arrival times for ferry-bench (workload.h).
 */
#include "bench/workload.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/mem.h"

static const char *const WORDS[FY_BENCH_N_WORDS] = {
    "the",      "of",      "and",    "to",      "in",      "is",       "was",     "for",        "on",        "that",
    "with",     "as",      "by",     "at",      "from",    "his",      "her",     "an",         "be",        "it",
    "are",      "which",   "this",   "or",      "had",     "not",      "but",     "were",       "have",      "has",
    "one",      "their",   "they",   "all",     "new",     "first",    "been",    "more",       "other",     "also",
    "after",    "two",     "who",    "its",     "he",      "she",      "can",     "time",       "when",      "would",
    "into",     "only",    "over",   "some",    "than",    "most",     "may",     "three",      "such",      "these",
    "many",     "years",   "about",  "people",  "made",    "out",      "them",    "there",      "up",        "used",
    "world",    "during",  "where",  "between", "well",    "then",     "city",    "while",      "year",      "under",
    "state",    "part",    "both",   "so",      "each",    "through",  "known",   "later",      "since",     "being",
    "will",     "no",      "school", "we",      "any",     "what",     "several", "four",       "before",    "how",
    "if",       "own",     "life",   "did",     "series",  "high",     "early",   "however",    "against",   "team",
    "because",  "five",    "could",  "you",     "game",    "very",     "area",    "music",      "same",      "last",
    "family",   "name",    "number", "found",   "much",    "second",   "work",    "government", "group",     "best",
    "national", "small",   "off",    "take",    "good",    "major",    "long",    "day",        "season",    "back",
    "place",    "great",   "power",  "system",  "way",     "water",    "show",    "book",       "different", "often",
    "end",      "history", "film",   "among",   "within",  "around",   "large",   "war",        "local",     "home",
    "member",   "see",     "public", "without", "though",  "until",    "old",     "age",        "law",       "general",
    "few",      "land",    "must",   "again",   "point",   "house",    "country", "along",      "support",   "party",
    "per",      "make",    "case",   "form",    "set",     "left",     "play",    "should",     "us",        "even",
    "real",     "still",   "like",   "due",     "given",   "called",   "next",    "went",       "another",   "use",
    "do",       "does",    "got",    "get",     "our",     "my",       "your",    "me",         "him",       "come",
    "came",     "say",     "said",   "just",    "now",     "here",     "right",   "down",       "too",       "little",
    "six",      "seven",   "eight",  "ten",     "hundred", "thousand", "million", "hand",       "head",      "side",
    "line",     "order",   "level",  "fact",    "field",   "word",     "story",   "report",     "service",   "office",
    "money",    "light",   "body",   "market",  "process", "rate",     "price",   "value",      "course",    "plan",
    "road",     "car",     "river",  "north",   "south",   "east",
};

const char *fy_bench_word(int32_t i) { return WORDS[i & (FY_BENCH_N_WORDS - 1)]; }

static void say(char *err, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *err, size_t cap, const char *fmt, ...)
{
    if (!err || !cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
}

/* ---- random numbers ---------------------------------------------------------------------------- */

static uint64_t rng_next(fy_bench_rng_t *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void fy_bench_rng_seed(fy_bench_rng_t *r, uint64_t seed, uint64_t stream)
{
    r->s = seed ^ (stream * 0xd1342543de82ef95ull + 0x9e3779b97f4a7c15ull);
    rng_next(r);
}

static double rng_unit(fy_bench_rng_t *r) { return (double)(rng_next(r) >> 11) * 0x1.0p-53; } /* [0, 1) */

static double rng_exp(fy_bench_rng_t *r, double mean) { return -mean * log1p(-rng_unit(r)); }

static double rng_normal(fy_bench_rng_t *r)
{
    double u = 1.0 - rng_unit(r), v = rng_unit(r);
    return sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v);
}

/* Marsaglia and Tsang (2000); shape < 1 through Gamma(shape + 1) * U^(1/shape). */
static double rng_gamma(fy_bench_rng_t *r, double shape, double scale)
{
    if (shape < 1.0) {
        double u = 1.0 - rng_unit(r);
        return rng_gamma(r, shape + 1.0, scale) * pow(u, 1.0 / shape);
    }
    double d = shape - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x = rng_normal(r), v = 1.0 + c * x;
        if (v <= 0) continue;
        v = v * v * v;
        double u = 1.0 - rng_unit(r);
        if (log(u) < 0.5 * x * x + d - d * v + d * log(v)) return d * v * scale;
    }
}

/* ---- lengths ----------------------------------------------------------------------------------- */

static bool parse_i32(const char *s, const char **end_p, int32_t *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || errno || v < 1 || v > FY_BENCH_MAX_LEN) return false;
    *out = (int32_t)v;
    *end_p = end;
    return true;
}

static fy_status_t len_file(const char *path, fy_bench_len_t *l, char *err, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        say(err, cap, "length distribution %s: cannot open: %s", path, strerror(errno));
        return FY_ERR_IO;
    }
    char *line = NULL;
    size_t lcap = 0;
    int32_t n = 0, ncap = 0, lineno = 0;
    int32_t *vals = NULL;
    double *w = NULL, total = 0;
    fy_status_t st = FY_OK;
    while (getline(&line, &lcap, f) > 0) {
        lineno++;
        char *p = line;
        while (*p == ' ' || *p == '\t') p++;
        if (*p == '#' || *p == '\n' || *p == '\r' || !*p) continue;
        const char *end;
        int32_t v;
        double wt = 1.0;
        if (!parse_i32(p, &end, &v)) {
            say(err, cap, "length distribution %s:%d: expected a length from 1 to %d, got '%.40s'", path, lineno,
                FY_BENCH_MAX_LEN, p);
            st = FY_ERR_FORMAT;
            break;
        }
        while (*end == ' ' || *end == '\t' || *end == ',') end++;
        if (*end && *end != '\n' && *end != '\r' && *end != '#') {
            char *e2;
            wt = strtod(end, &e2);
            while (*e2 == ' ' || *e2 == '\t' || *e2 == '\r' || *e2 == '\n') e2++;
            if (e2 == end || (*e2 && *e2 != '#') || !(wt >= 0) || !isfinite(wt)) {
                say(err, cap, "length distribution %s:%d: expected 'LENGTH [WEIGHT]', got '%.40s'", path, lineno, p);
                st = FY_ERR_FORMAT;
                break;
            }
        }
        if (n == ncap) {
            int32_t nc = ncap ? 2 * ncap : 64;
            int32_t *nv = fy_realloc(vals, (size_t)nc * sizeof(*nv));
            if (nv) vals = nv;
            double *nw = nv ? fy_realloc(w, (size_t)nc * sizeof(*nw)) : NULL;
            if (!nv || !nw) {
                st = FY_ERR_NOMEM;
                say(err, cap, "length distribution %s: out of memory", path);
                break;
            }
            w = nw;
            ncap = nc;
        }
        vals[n] = v;
        w[n] = wt;
        total += wt;
        n++;
    }
    free(line);
    fclose(f);
    if (!st && (n == 0 || !(total > 0))) {
        say(err, cap, "length distribution %s: no lengths with a positive weight", path);
        st = FY_ERR_FORMAT;
    }
    if (st) {
        fy_free(vals);
        fy_free(w);
        return st;
    }
    double acc = 0;
    for (int32_t i = 0; i < n; i++) w[i] = (acc += w[i]) / total;
    w[n - 1] = 1.0;
    *l = (fy_bench_len_t){.kind = FY_BENCH_LEN_EMPIRICAL, .n = n, .vals = vals, .cum = w};
    return FY_OK;
}

fy_status_t fy_bench_len_parse(const char *spec, fy_bench_len_t *l, char *err, size_t cap)
{
    if (!spec || !*spec) {
        say(err, cap, "empty length: expected N, LO-HI or @FILE");
        return FY_ERR_INVALID;
    }
    if (spec[0] == '@') return len_file(spec + 1, l, err, cap);
    const char *end;
    int32_t lo, hi;
    if (!parse_i32(spec, &end, &lo)) goto bad;
    if (!*end) {
        *l = (fy_bench_len_t){.kind = FY_BENCH_LEN_FIXED, .lo = lo, .hi = lo};
        return FY_OK;
    }
    if (*end != '-' || !parse_i32(end + 1, &end, &hi) || *end || hi < lo) goto bad;
    *l = (fy_bench_len_t){.kind = lo == hi ? FY_BENCH_LEN_FIXED : FY_BENCH_LEN_UNIFORM, .lo = lo, .hi = hi};
    return FY_OK;
bad:
    say(err, cap, "length '%s': expected N, LO-HI (1 <= LO <= HI <= %d) or @FILE", spec, FY_BENCH_MAX_LEN);
    return FY_ERR_INVALID;
}

void fy_bench_len_free(fy_bench_len_t *l)
{
    if (!l) return;
    fy_free(l->vals);
    fy_free(l->cum);
    l->vals = NULL;
    l->cum = NULL;
    l->n = 0;
}

int32_t fy_bench_len_draw(const fy_bench_len_t *l, fy_bench_rng_t *r)
{
    switch (l->kind) {
    case FY_BENCH_LEN_FIXED: return l->lo;
    case FY_BENCH_LEN_UNIFORM: return l->lo + (int32_t)(rng_next(r) % (uint64_t)(l->hi - l->lo + 1));
    case FY_BENCH_LEN_EMPIRICAL: {
        double u = rng_unit(r);
        int32_t a = 0, b = l->n - 1; /* the first i with cum[i] > u */
        while (a < b) {
            int32_t m = (a + b) / 2;
            if (l->cum[m] > u)
                b = m;
            else
                a = m + 1;
        }
        return l->vals[a];
    }
    }
    return l->lo;
}

fy_status_t fy_bench_class_parse(const char *spec, fy_bench_class_t *c, char *err, size_t cap)
{
    char buf[512];
    if (snprintf(buf, sizeof(buf), "%s", spec) >= (int)sizeof(buf)) {
        say(err, cap, "class '%.40s...': too long", spec);
        return FY_ERR_INVALID;
    }
    char *in = buf, *out = strchr(buf, '/'), *wt = NULL;
    if (!out) {
        say(err, cap, "class '%s': expected IN/OUT[/WEIGHT], e.g. 480-544/16/1", spec);
        return FY_ERR_INVALID;
    }
    *out++ = 0;
    if ((wt = strchr(out, '/'))) *wt++ = 0;
    double w = 1.0;
    if (wt) {
        char *end;
        w = strtod(wt, &end);
        if (end == wt || *end || !(w > 0) || !isfinite(w)) {
            say(err, cap, "class '%s': weight '%s' must be a positive number", spec, wt);
            return FY_ERR_INVALID;
        }
    }
    fy_bench_class_t k = {.weight = w};
    fy_status_t st = fy_bench_len_parse(in, &k.in, err, cap);
    if (st) return st;
    if ((st = fy_bench_len_parse(out, &k.out, err, cap))) {
        fy_bench_len_free(&k.in);
        return st;
    }
    *c = k;
    return FY_OK;
}

void fy_bench_class_free(fy_bench_class_t *c)
{
    if (!c) return;
    fy_bench_len_free(&c->in);
    fy_bench_len_free(&c->out);
}

/* ---- building workloads ------------------------------------------------------------------------ */

static fy_bench_workload_t *workload_new(int32_t n_reqs, int32_t n_convs)
{
    fy_bench_workload_t *w = fy_calloc(1, sizeof(*w));
    if (!w) return NULL;
    w->reqs = fy_calloc((size_t)(n_reqs ? n_reqs : 1), sizeof(*w->reqs));
    w->convs = fy_calloc((size_t)(n_convs ? n_convs : 1), sizeof(*w->convs));
    if (!w->reqs || !w->convs) {
        fy_free(w->reqs);
        fy_free(w->convs);
        fy_free(w);
        return NULL;
    }
    return w;
}

void fy_bench_workload_destroy(fy_bench_workload_t *w)
{
    if (!w) return;
    for (int32_t i = 0; i < w->n_reqs; i++) fy_free(w->reqs[i].text);
    fy_free(w->reqs);
    fy_free(w->convs);
    fy_free(w);
}

#define MAX_WORD_BYTES 12 /* the longest word and its space, rounded up */

/* Appends n words drawn from r to buf at *len (the caller sized buf). */
static void put_words(char *buf, size_t *len, int32_t n, fy_bench_rng_t *r)
{
    for (int32_t i = 0; i < n; i++) {
        const char *wd = WORDS[rng_next(r) & (FY_BENCH_N_WORDS - 1)];
        size_t k = strlen(wd);
        buf[(*len)++] = ' ';
        memcpy(buf + *len, wd, k);
        *len += k;
    }
    buf[*len] = 0;
}

/* Room for n words and the NUL, or NULL. */
static char *words_alloc(int64_t n)
{
    size_t cap;
    if (n < 0 || !fy_mul_size((size_t)n, MAX_WORD_BYTES, &cap)) return NULL;
    char *t = fy_malloc(cap + 1);
    if (t) t[0] = 0;
    return t;
}

fy_status_t fy_bench_workload_synth(const fy_bench_synth_t *p, fy_bench_workload_t **w_p, char *err, size_t cap)
{
    if (p->n_requests < 1 || p->n_classes < 1 || p->n_classes > FY_BENCH_MAX_CLASSES || p->turns < 1 ||
        p->prefix_groups < 0 || p->prefix_len < 0 || (p->prefix_groups > 0) != (p->prefix_len > 0)) {
        say(err, cap,
            "workload: need at least one request and class, one turn, and prefix groups and length "
            "given together");
        return FY_ERR_INVALID;
    }
    int32_t n_convs = (p->n_requests + p->turns - 1) / p->turns;
    int32_t n = n_convs * p->turns;
    fy_bench_workload_t *w = workload_new(n, n_convs);
    if (!w) {
        say(err, cap, "workload: out of memory");
        return FY_ERR_NOMEM;
    }
    w->think_s = p->think_s;
    double total = 0;
    for (int32_t k = 0; k < p->n_classes; k++) total += p->classes[k].weight;
    fy_bench_rng_t cr;
    fy_bench_rng_seed(&cr, p->seed, 1);
    for (int32_t c = 0; c < n_convs; c++) {
        w->convs[c] = (fy_bench_conv_t){.at_s = -1, .first = c * p->turns, .n_turns = p->turns};
        for (int32_t t = 0; t < p->turns; t++) {
            int32_t i = c * p->turns + t;
            /* the class of each request from one stream, its words from its own */
            double u = rng_unit(&cr) * total, acc = 0;
            int32_t k = 0;
            while (k < p->n_classes - 1 && u >= (acc += p->classes[k].weight)) k++;
            fy_bench_rng_t r;
            fy_bench_rng_seed(&r, p->seed, 1000 + (uint64_t)i);
            int32_t n_in = fy_bench_len_draw(&p->classes[k].in, &r);
            int32_t n_out = fy_bench_len_draw(&p->classes[k].out, &r);
            int32_t group = -1, pre = 0;
            if (p->prefix_groups > 0 && t == 0) { /* later turns carry the prefix in their history */
                group = c % p->prefix_groups;
                pre = p->prefix_len;
            }
            fy_bench_req_t *q = &w->reqs[i];
            q->text = words_alloc((int64_t)pre + n_in);
            if (!q->text) {
                w->n_reqs = i;
                fy_bench_workload_destroy(w);
                say(err, cap, "workload: out of memory for %d-token prompts", pre + n_in);
                return FY_ERR_NOMEM;
            }
            if (pre) {
                fy_bench_rng_t pr; /* the group's own stream: the same words for every member */
                fy_bench_rng_seed(&pr, p->seed, 0x5eed0000000ull + (uint64_t)group);
                put_words(q->text, &q->text_len, pre, &pr);
            }
            put_words(q->text, &q->text_len, n_in, &r);
            q->n_in = pre + n_in;
            q->n_out = n_out;
            q->group = group;
            q->conv = c;
            q->turn = t;
        }
    }
    w->n_reqs = n;
    w->n_convs = n_convs;
    *w_p = w;
    return FY_OK;
}

/* ---- traces ------------------------------------------------------------------------------------ */

/* The first of keys present in o: true with *out set, or false (*bad when
 * present but not a valid length). */
static bool json_len(json_t *o, const char *const *keys, int32_t *out, bool *bad)
{
    for (int i = 0; keys[i]; i++) {
        json_t *v = json_object_get(o, keys[i]);
        if (!v) continue;
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > FY_BENCH_MAX_LEN) {
            *bad = true;
            return false;
        }
        *out = (int32_t)json_integer_value(v);
        return true;
    }
    return false;
}

/* Mooncake-style hash ids: block h is block words from stream h, so lines
 * naming the same ids share those blocks of prompt. */
static fy_status_t hash_text(json_t *ids, int32_t n_in, int32_t block, uint64_t seed, int32_t line, char **text_p,
                             size_t *len_p, char *sub, size_t cap)
{
    size_t i;
    json_t *h;
    json_array_foreach(ids, i, h)
    {
        if (!json_is_integer(h) || json_integer_value(h) < 0) {
            snprintf(sub, cap, "hash_ids[%zu] must be a non-negative integer", i);
            return FY_ERR_FORMAT;
        }
    }
    char *t = words_alloc(n_in);
    if (!t) return FY_ERR_NOMEM;
    size_t len = 0;
    int32_t left = n_in;
    json_array_foreach(ids, i, h)
    {
        if (!left) break;
        fy_bench_rng_t r;
        fy_bench_rng_seed(&r, seed, 0xb10c000000000ull + (uint64_t)json_integer_value(h));
        int32_t k = left < block ? left : block;
        put_words(t, &len, k, &r);
        left -= k;
    }
    if (left) { /* more prompt than blocks named: the rest is the line's own */
        fy_bench_rng_t r;
        fy_bench_rng_seed(&r, seed, 0x11e0000000000ull + (uint64_t)line);
        put_words(t, &len, left, &r);
    }
    *text_p = t;
    *len_p = len;
    return FY_OK;
}

fy_status_t fy_bench_workload_trace(const char *path, const fy_bench_trace_opts_t *o, fy_bench_workload_t **w_p,
                                    char *err, size_t cap)
{
    static const char *const IN_KEYS[] = {"input_length", "input_len", "prompt_len", NULL};
    static const char *const OUT_KEYS[] = {"output_length", "output_len", "max_tokens", NULL};
    char sub[256];
    FILE *f = fopen(path, "r");
    if (!f) {
        say(err, cap, "trace %s: cannot open: %s", path, strerror(errno));
        return FY_ERR_IO;
    }
    int32_t ncap = 256, n = 0, lineno = 0;
    fy_bench_workload_t *w = workload_new(ncap, ncap);
    fy_status_t st = w ? FY_OK : FY_ERR_NOMEM;
    char *line = NULL;
    size_t lcap = 0;
    ssize_t got;
    double t0 = 0, scale = o->time_scale > 0 ? o->time_scale : 1.0;
    int32_t block = o->block_tokens > 0 ? o->block_tokens : 512;
    while (!st && (o->max_requests <= 0 || n < o->max_requests) && (got = getline(&line, &lcap, f)) > 0) {
        lineno++;
        const char *p = line;
        while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n') p++;
        if (!*p) continue;
        json_error_t je;
        json_t *obj = json_loadb(line, (size_t)got, 0, &je);
        sub[0] = 0;
        if (!obj)
            snprintf(sub, sizeof(sub), "not JSON: %s", je.text);
        else if (!json_is_object(obj))
            snprintf(sub, sizeof(sub), "expected a JSON object");
        double at = -1;
        int32_t n_in = 0, n_out = 0;
        bool bad = false;
        json_t *prompt = NULL, *ids = NULL;
        if (!sub[0]) {
            prompt = json_object_get(obj, "prompt");
            json_t *ts = json_object_get(obj, "timestamp"), *as = json_object_get(obj, "arrival_s");
            if (ts && json_is_number(ts))
                at = json_number_value(ts) / 1000.0;
            else if (as && json_is_number(as))
                at = json_number_value(as);
            else if (ts || as)
                snprintf(sub, sizeof(sub), "timestamp / arrival_s must be a number");
            else
                snprintf(sub, sizeof(sub), "no arrival time (timestamp in ms, or arrival_s)");
        }
        if (!sub[0] && !(at >= 0 && isfinite(at))) snprintf(sub, sizeof(sub), "the arrival time must be >= 0");
        if (!sub[0] && prompt && !json_is_string(prompt)) snprintf(sub, sizeof(sub), "prompt must be a string");
        if (!sub[0] && !prompt && !json_len(obj, IN_KEYS, &n_in, &bad))
            snprintf(sub, sizeof(sub),
                     bad ? "input_length must be an integer from 1 to %d"
                         : "no prompt (prompt text, or input_length up to %d)",
                     FY_BENCH_MAX_LEN);
        bad = false;
        if (!sub[0] && !json_len(obj, OUT_KEYS, &n_out, &bad))
            snprintf(sub, sizeof(sub),
                     bad ? "output_length must be an integer from 1 to %d"
                         : "no output length (output_length up to %d)",
                     FY_BENCH_MAX_LEN);
        if (!sub[0] && (ids = json_object_get(obj, "hash_ids")) && !json_is_array(ids))
            snprintf(sub, sizeof(sub), "hash_ids must be an array");
        if (!sub[0] && n > 0 && at < t0)
            snprintf(sub, sizeof(sub), "arrival %.3f s is before the first line's %.3f s: sort the trace", at, t0);
        if (!sub[0] && n == ncap) {
            int32_t nc = 2 * ncap;
            fy_bench_req_t *nr = fy_realloc(w->reqs, (size_t)nc * sizeof(*nr));
            if (nr) w->reqs = nr;
            fy_bench_conv_t *nv = nr ? fy_realloc(w->convs, (size_t)nc * sizeof(*nv)) : NULL;
            if (nv)
                w->convs = nv, ncap = nc;
            else
                st = FY_ERR_NOMEM;
        }
        fy_bench_req_t *q = &w->reqs[n];
        if (!sub[0] && !st) {
            *q = (fy_bench_req_t){.n_out = n_out, .group = -1, .conv = n};
            if (prompt) {
                q->text_len = json_string_length(prompt);
                q->text = fy_strndup(json_string_value(prompt), q->text_len);
                q->n_in = (int32_t)(q->text_len / 4 > 0 ? q->text_len / 4 : 1);
                if (!q->text) st = FY_ERR_NOMEM;
            } else if (ids) {
                st = hash_text(ids, n_in, block, o->seed, lineno, &q->text, &q->text_len, sub, sizeof(sub));
                q->n_in = n_in;
            } else {
                fy_bench_rng_t r;
                fy_bench_rng_seed(&r, o->seed, 0x11e0000000000ull + (uint64_t)lineno);
                if ((q->text = words_alloc(n_in)))
                    put_words(q->text, &q->text_len, n_in, &r);
                else
                    st = FY_ERR_NOMEM;
                q->n_in = n_in;
            }
        }
        json_decref(obj);
        if (sub[0]) {
            say(err, cap, "trace %s:%d: %s", path, lineno, sub);
            if (!st) st = FY_ERR_FORMAT;
            break;
        }
        if (st) break;
        if (n == 0) t0 = at;
        w->convs[n] = (fy_bench_conv_t){.at_s = (at - t0) * scale, .first = n, .n_turns = 1};
        w->n_reqs = w->n_convs = ++n;
    }
    free(line);
    fclose(f);
    if (!st && n == 0) {
        say(err, cap, "trace %s: no requests in it", path);
        st = FY_ERR_FORMAT;
    }
    if (st) {
        if (st == FY_ERR_NOMEM) say(err, cap, "trace %s: out of memory", path);
        fy_bench_workload_destroy(w);
        return st;
    }
    w->timed = true;
    *w_p = w;
    return FY_OK;
}

fy_status_t fy_bench_workload_sharegpt(const char *path, int32_t max_requests, int32_t out_len,
                                       fy_bench_workload_t **w_p, char *err, size_t cap)
{
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) {
        say(err, cap, "sharegpt %s:%d: %s", path, je.line, je.text);
        return FY_ERR_FORMAT;
    }
    if (!json_is_array(root)) {
        say(err, cap, "sharegpt %s: expected a JSON array of conversations", path);
        json_decref(root);
        return FY_ERR_FORMAT;
    }
    size_t total = json_array_size(root);
    int32_t want = max_requests > 0 && (size_t)max_requests < total ? max_requests : (int32_t)total;
    fy_bench_workload_t *w = workload_new(want, want);
    if (!w) {
        json_decref(root);
        say(err, cap, "sharegpt %s: out of memory", path);
        return FY_ERR_NOMEM;
    }
    int32_t n = 0;
    fy_status_t st = FY_OK;
    for (size_t i = 0; i < total && n < want; i++) {
        json_t *conv = json_object_get(json_array_get(root, i), "conversations");
        const char *prompt = NULL, *reply = NULL;
        size_t plen = 0, rlen = 0, k;
        json_t *turn;
        json_array_foreach(conv, k, turn)
        {
            const char *from = json_string_value(json_object_get(turn, "from"));
            json_t *v = json_object_get(turn, "value");
            if (!from || !json_is_string(v)) continue;
            bool human = !strcmp(from, "human") || !strcmp(from, "user");
            if (!prompt && human) {
                prompt = json_string_value(v);
                plen = json_string_length(v);
            } else if (prompt && !human) {
                reply = json_string_value(v);
                rlen = json_string_length(v);
                break;
            }
        }
        if (!prompt || !plen || (!reply && out_len <= 0)) continue; /* as vLLM: entries without both are skipped */
        fy_bench_req_t *q = &w->reqs[n];
        if (!(q->text = fy_strndup(prompt, plen))) {
            st = FY_ERR_NOMEM;
            break;
        }
        q->text_len = plen;
        q->n_in = (int32_t)(plen / 4 > 0 ? plen / 4 : 1);
        q->n_out = out_len > 0 ? out_len : (int32_t)(rlen / 4 > 0 ? rlen / 4 : 1);
        q->group = -1;
        q->conv = n;
        w->convs[n] = (fy_bench_conv_t){.at_s = -1, .first = n, .n_turns = 1};
        w->n_reqs = w->n_convs = ++n;
    }
    json_decref(root);
    if (!st && n == 0) {
        say(err, cap, "sharegpt %s: no conversation with a human turn and a reply", path);
        st = FY_ERR_FORMAT;
    }
    if (st) {
        if (st == FY_ERR_NOMEM) say(err, cap, "sharegpt %s: out of memory", path);
        fy_bench_workload_destroy(w);
        return st;
    }
    *w_p = w;
    return FY_OK;
}

/* ---- arrivals ---------------------------------------------------------------------------------- */

bool fy_bench_closed_loop(const fy_bench_workload_t *w, double rate) { return rate <= 0 && !w->timed; }

void fy_bench_arrivals(const fy_bench_workload_t *w, double rate, double burstiness, uint64_t seed, double *at)
{
    if (rate <= 0) {
        for (int32_t i = 0; i < w->n_convs; i++) at[i] = w->timed ? w->convs[i].at_s : 0.0;
        return;
    }
    double k = burstiness > 0 ? burstiness : 1.0;
    fy_bench_rng_t r;
    fy_bench_rng_seed(&r, seed, 2);
    double t = 0;
    for (int32_t i = 0; i < w->n_convs; i++) {
        /* the first request goes at once, as in vLLM's bench */
        if (i > 0) t += k == 1.0 ? rng_exp(&r, 1.0 / rate) : rng_gamma(&r, k, 1.0 / (rate * k));
        at[i] = t;
    }
}

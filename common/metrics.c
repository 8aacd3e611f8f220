/*
 * metrics.c - the metrics registry and its Prometheus text (see metrics.h).
 *
 * A counter or gauge is one atomic double (its bits in a uint64_t, added
 * to by compare-and-swap); a histogram is a count per bucket, a sum and a
 * count behind a mutex of its own.  The registry's rwlock is taken for
 * reading by batches of updates and for writing by render, so a render
 * never sees half a batch; single updates outside a batch take no lock.
 */
#include "common/metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/mem.h"
#include "common/strbuf.h"

#define MAX_LABELS 12 /* the registry's own and the series' */

typedef enum kind { KIND_COUNTER, KIND_GAUGE, KIND_HISTOGRAM } kind_t;

static const char *const KIND_NAME[] = {"counter", "gauge", "histogram"};

typedef struct family {
    char *name, *help;
    kind_t kind;
    double *bounds; /* [n_bounds] histograms */
    int n_bounds;
    struct family *next;
} family_t;

struct fy_metric {
    family_t *fam;
    char *labels;          /* rendered and escaped: k1="v1",k2="v2" (empty when none) */
    _Atomic uint64_t bits; /* counters and gauges: the value's bits */
    pthread_mutex_t mu;    /* histograms */
    uint64_t *buckets;     /* [n_bounds + 1] non-cumulative; the last is +Inf */
    uint64_t count;
    double sum;
    struct fy_metric *next; /* registration order */
};

struct fy_metrics {
    pthread_rwlock_t lock;
    pthread_mutex_t reg_mu; /* registration */
    family_t *fams, *fams_tail;
    fy_metric_t *series, *series_tail;
    char *const_labels;            /* rendered, as a series' labels; "" when none */
    char *const_names[MAX_LABELS]; /* their names */
    int n_const;
};

const double fy_metrics_ttft_buckets[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
                                          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const int fy_metrics_n_ttft_buckets = (int)(sizeof(fy_metrics_ttft_buckets) / sizeof(double));
/* vLLM's from 10 ms up, and finer below: a small model's step on a GPU
 * (and a CPU's, for the smallest) takes a few milliseconds, and vLLM's
 * first bound put every such gap in one bucket */
const double fy_metrics_itl_buckets[] = {0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05,
                                         0.075,  0.1,   0.15,  0.2,   0.3,   0.4,    0.5,  0.75,  1.0,
                                         2.5,    5.0,   7.5,   10.0,  20.0,  40.0,   80.0};
const int fy_metrics_n_itl_buckets = (int)(sizeof(fy_metrics_itl_buckets) / sizeof(double));
const double fy_metrics_e2e_buckets[] = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
                                         30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
const int fy_metrics_n_e2e_buckets = (int)(sizeof(fy_metrics_e2e_buckets) / sizeof(double));
const double fy_metrics_iteration_buckets[] = {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384};
const int fy_metrics_n_iteration_buckets = (int)(sizeof(fy_metrics_iteration_buckets) / sizeof(double));

int fy_metrics_buckets_125(double max, double *out, int cap)
{
    static const double steps[] = {1, 2, 5};
    int n = 0;
    for (double mag = 1; n < cap; mag *= 10) {
        for (int i = 0; i < 3 && n < cap; i++) {
            double v = steps[i] * mag;
            if (v > max && n > 0) return n;
            out[n++] = v;
        }
    }
    return n;
}

static uint64_t d2u(double v)
{
    uint64_t u;
    memcpy(&u, &v, sizeof(u));
    return u;
}

static double u2d(uint64_t u)
{
    double v;
    memcpy(&v, &u, sizeof(v));
    return v;
}

static fy_status_t render_labels(const char *what, const char *const *labels, bool histogram, char *const *taken,
                                 int n_taken, char **text_p, int *n_p);

fy_status_t fy_metrics_create(fy_metrics_t **reg_p) { return fy_metrics_create_labeled(NULL, reg_p); }

fy_status_t fy_metrics_create_labeled(const char *const *const_labels, fy_metrics_t **reg_p)
{
    fy_metrics_t *r = fy_calloc(1, sizeof(*r));
    if (!r) {
        fy_error("metrics: out of memory for a registry");
        return FY_ERR_NOMEM;
    }
    fy_status_t st = render_labels("the registry", const_labels, true, NULL, 0, &r->const_labels, &r->n_const);
    for (int i = 0; !st && i < r->n_const; i++)
        if (!(r->const_names[i] = fy_strdup(const_labels[2 * i]))) st = FY_ERR_NOMEM;
    pthread_rwlock_init(&r->lock, NULL);
    pthread_mutex_init(&r->reg_mu, NULL);
    if (st) {
        if (st == FY_ERR_NOMEM) fy_error("metrics: out of memory for a registry");
        fy_metrics_destroy(r);
        return st;
    }
    *reg_p = r;
    return FY_OK;
}

void fy_metrics_destroy(fy_metrics_t *r)
{
    if (!r) return;
    for (fy_metric_t *m = r->series, *next; m; m = next) {
        next = m->next;
        if (m->fam->kind == KIND_HISTOGRAM) pthread_mutex_destroy(&m->mu);
        fy_free(m->buckets);
        fy_free(m->labels);
        fy_free(m);
    }
    for (family_t *f = r->fams, *next; f; f = next) {
        next = f->next;
        fy_free(f->name);
        fy_free(f->help);
        fy_free(f->bounds);
        fy_free(f);
    }
    for (int i = 0; i < r->n_const; i++) fy_free(r->const_names[i]);
    fy_free(r->const_labels);
    pthread_rwlock_destroy(&r->lock);
    pthread_mutex_destroy(&r->reg_mu);
    fy_free(r);
}

/* ---- text building ------------------------------------------------------------------------------ */

/* Help text escapes backslash and newline; label values also the double quote. */
static void sb_escaped(fy_strbuf_t *b, const char *s, bool quote)
{
    for (; *s; s++) {
        if (*s == '\\')
            fy_strbuf_puts(b, "\\\\");
        else if (*s == '\n')
            fy_strbuf_puts(b, "\\n");
        else if (quote && *s == '"')
            fy_strbuf_puts(b, "\\\"");
        else
            fy_strbuf_append(b, s, 1);
    }
}

/* The shortest text that reads back as v; Prometheus spells the infinities and NaN its own way. */
static void sb_value(fy_strbuf_t *b, double v)
{
    if (isnan(v)) {
        fy_strbuf_puts(b, "NaN");
        return;
    }
    if (isinf(v)) {
        fy_strbuf_puts(b, v > 0 ? "+Inf" : "-Inf");
        return;
    }
    char tmp[40];
    if (v == floor(v) && fabs(v) < 9007199254740992.0) { /* whole numbers (most counters) in full, no exponent */
        snprintf(tmp, sizeof(tmp), "%.0f", v);
        fy_strbuf_puts(b, tmp);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof(tmp), "%.*g", prec, v);
        if (strtod(tmp, NULL) == v) break;
    }
    fy_strbuf_puts(b, tmp);
}

/* ---- registration -------------------------------------------------------------------------------- */

static bool name_ok(const char *s, bool colon)
{
    if (!s || !*s) return false;
    for (const char *p = s; *p; p++) {
        char c = *p;
        bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':');
        if (!alpha && !(p > s && c >= '0' && c <= '9')) return false;
    }
    return true;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* Checks label pairs (none of them one of taken[n_taken]) and renders
 * them, escaped: k1="v1",k2="v2".  *text_p is the caller's to fy_free. */
static fy_status_t render_labels(const char *what, const char *const *labels, bool histogram, char *const *taken,
                                 int n_taken, char **text_p, int *n_p)
{
    int n_labels = 0;
    for (; labels && labels[2 * n_labels]; n_labels++) {
        const char *k = labels[2 * n_labels], *v = labels[2 * n_labels + 1];
        if (n_labels + n_taken == MAX_LABELS || !v || !name_ok(k, false) || !strncmp(k, "__", 2) ||
            (histogram && !strcmp(k, "le"))) {
            fy_error("metrics: %s: bad label '%s' (or more than %d labels, or one without a value)", what, k,
                     MAX_LABELS);
            return FY_ERR_INVALID;
        }
        for (int j = 0; j < n_labels + n_taken; j++) {
            if (!strcmp(j < n_labels ? labels[2 * j] : taken[j - n_labels], k)) {
                fy_error("metrics: %s: label '%s' given twice (or the registry's own)", what, k);
                return FY_ERR_INVALID;
            }
        }
    }
    fy_strbuf_t lb = {0};
    for (int i = 0; i < n_labels; i++) {
        if (i) fy_strbuf_puts(&lb, ",");
        fy_strbuf_puts(&lb, labels[2 * i]);
        fy_strbuf_puts(&lb, "=\"");
        sb_escaped(&lb, labels[2 * i + 1], true);
        fy_strbuf_puts(&lb, "\"");
    }
    char *text = fy_strbuf_take(&lb, NULL);
    if (!text) {
        fy_error("metrics: out of memory registering %s", what);
        return FY_ERR_NOMEM;
    }
    *text_p = text;
    *n_p = n_labels;
    return FY_OK;
}

static fy_status_t add_series(fy_metrics_t *r, kind_t kind, const char *name, const char *help,
                              const char *const *labels, const double *bounds, int n_bounds, fy_metric_t **m_p)
{
    if (!name_ok(name, true)) {
        fy_error("metrics: '%s' is not a metric name", name ? name : "(null)");
        return FY_ERR_INVALID;
    }
    if (kind == KIND_COUNTER && !ends_with(name, "_total")) {
        fy_error("metrics: counter %s: a counter's name ends in _total", name);
        return FY_ERR_INVALID;
    }
    if (kind == KIND_HISTOGRAM) {
        bool ok = bounds && n_bounds > 0;
        for (int i = 0; ok && i < n_bounds; i++) ok = isfinite(bounds[i]) && (i == 0 || bounds[i] > bounds[i - 1]);
        if (!ok) {
            fy_error("metrics: histogram %s: bounds must be finite and strictly increasing", name);
            return FY_ERR_INVALID;
        }
    }
    char *own = NULL;
    int n_own = 0;
    fy_status_t lst = render_labels(name, labels, kind == KIND_HISTOGRAM, r->const_names, r->n_const, &own, &n_own);
    if (lst) return lst;
    fy_strbuf_t lb = {0};
    fy_strbuf_puts(&lb, r->const_labels);
    if (*r->const_labels && *own) fy_strbuf_puts(&lb, ",");
    fy_strbuf_puts(&lb, own);
    fy_free(own);
    char *all = fy_strbuf_take(&lb, NULL);
    fy_metric_t *m = fy_calloc(1, sizeof(*m));
    if (!all || !m || (kind == KIND_HISTOGRAM && !(m->buckets = fy_calloc((size_t)n_bounds + 1, sizeof(uint64_t))))) {
        fy_free(all);
        if (m) fy_free(m->buckets);
        fy_free(m);
        fy_error("metrics: out of memory registering %s", name);
        return FY_ERR_NOMEM;
    }
    m->labels = all;
    atomic_init(&m->bits, d2u(0.0));

    fy_status_t st = FY_OK;
    pthread_mutex_lock(&r->reg_mu);
    family_t *f = r->fams;
    while (f && strcmp(f->name, name)) f = f->next;
    if (f) {
        bool same = f->kind == kind && !strcmp(f->help, help ? help : "") && f->n_bounds == n_bounds &&
                    (kind != KIND_HISTOGRAM || !memcmp(f->bounds, bounds, sizeof(double) * (size_t)n_bounds));
        if (!same) {
            fy_error("metrics: %s is already registered with another type, help or buckets", name);
            st = FY_ERR_INVALID;
        }
        for (fy_metric_t *o = r->series; st == FY_OK && o; o = o->next) {
            if (o->fam == f && !strcmp(o->labels, m->labels)) {
                fy_error("metrics: %s{%s} is already registered", name, m->labels);
                st = FY_ERR_INVALID;
            }
        }
    } else {
        f = fy_calloc(1, sizeof(*f));
        if (f) {
            f->name = fy_strdup(name);
            f->help = fy_strdup(help ? help : "");
            f->kind = kind;
            f->n_bounds = kind == KIND_HISTOGRAM ? n_bounds : 0;
            if (kind == KIND_HISTOGRAM && (f->bounds = fy_malloc(sizeof(double) * (size_t)n_bounds)))
                memcpy(f->bounds, bounds, sizeof(double) * (size_t)n_bounds);
        }
        if (!f || !f->name || !f->help || (kind == KIND_HISTOGRAM && !f->bounds)) {
            if (f) {
                fy_free(f->name);
                fy_free(f->help);
                fy_free(f->bounds);
                fy_free(f);
            }
            fy_error("metrics: out of memory registering %s", name);
            st = FY_ERR_NOMEM;
        } else {
            if (r->fams_tail)
                r->fams_tail->next = f;
            else
                r->fams = f;
            r->fams_tail = f;
        }
    }
    if (st == FY_OK) {
        m->fam = f;
        if (kind == KIND_HISTOGRAM) pthread_mutex_init(&m->mu, NULL);
        /* appended under the render lock: a render walks the list without reg_mu */
        pthread_rwlock_wrlock(&r->lock);
        if (r->series_tail)
            r->series_tail->next = m;
        else
            r->series = m;
        r->series_tail = m;
        pthread_rwlock_unlock(&r->lock);
    }
    pthread_mutex_unlock(&r->reg_mu);
    if (st) {
        fy_free(m->buckets);
        fy_free(m->labels);
        fy_free(m);
        return st;
    }
    *m_p = m;
    return FY_OK;
}

fy_status_t fy_metrics_counter(fy_metrics_t *r, const char *name, const char *help, const char *const *labels,
                               fy_metric_t **m_p)
{
    return add_series(r, KIND_COUNTER, name, help, labels, NULL, 0, m_p);
}

fy_status_t fy_metrics_gauge(fy_metrics_t *r, const char *name, const char *help, const char *const *labels,
                             fy_metric_t **m_p)
{
    return add_series(r, KIND_GAUGE, name, help, labels, NULL, 0, m_p);
}

fy_status_t fy_metrics_histogram(fy_metrics_t *r, const char *name, const char *help, const char *const *labels,
                                 const double *bounds, int n_bounds, fy_metric_t **m_p)
{
    return add_series(r, KIND_HISTOGRAM, name, help, labels, bounds, n_bounds, m_p);
}

/* ---- updates ------------------------------------------------------------------------------------ */

void fy_metric_inc(fy_metric_t *m) { fy_metric_add(m, 1.0); }

void fy_metric_add(fy_metric_t *m, double v)
{
    if (!m || m->fam->kind == KIND_HISTOGRAM || (m->fam->kind == KIND_COUNTER && !(v >= 0))) return;
    uint64_t old = atomic_load_explicit(&m->bits, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&m->bits, &old, d2u(u2d(old) + v), memory_order_relaxed,
                                                  memory_order_relaxed)) {}
}

void fy_metric_set(fy_metric_t *m, double v)
{
    if (!m || m->fam->kind == KIND_HISTOGRAM) return;
    atomic_store_explicit(&m->bits, d2u(v), memory_order_relaxed);
}

double fy_metric_value(const fy_metric_t *m)
{
    if (!m) return 0.0;
    fy_metric_t *h = (fy_metric_t *)m; /* the lock and the atomic change; the value does not */
    if (m->fam->kind != KIND_HISTOGRAM) return u2d(atomic_load_explicit(&h->bits, memory_order_relaxed));
    pthread_mutex_lock(&h->mu);
    double s = h->sum;
    pthread_mutex_unlock(&h->mu);
    return s;
}

static void observe_locked(fy_metric_t *m, double v)
{
    const family_t *f = m->fam;
    if (isnan(v)) return;
    int i = 0;
    while (i < f->n_bounds && v > f->bounds[i]) i++; /* the first bucket whose bound is >= v */
    m->buckets[i]++;
    m->count++;
    m->sum += v;
}

void fy_metric_observe(fy_metric_t *m, double v)
{
    if (!m || m->fam->kind != KIND_HISTOGRAM) return;
    pthread_mutex_lock(&m->mu);
    observe_locked(m, v);
    pthread_mutex_unlock(&m->mu);
}

void fy_metric_observe_f32(fy_metric_t *m, const float *v, int n)
{
    if (!m || m->fam->kind != KIND_HISTOGRAM || n <= 0) return;
    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < n; i++) observe_locked(m, v[i]);
    pthread_mutex_unlock(&m->mu);
}

unsigned long long fy_metric_count(const fy_metric_t *m)
{
    if (!m || m->fam->kind != KIND_HISTOGRAM) return 0;
    fy_metric_t *h = (fy_metric_t *)m;
    pthread_mutex_lock(&h->mu);
    unsigned long long c = h->count;
    pthread_mutex_unlock(&h->mu);
    return c;
}

void fy_metrics_batch_begin(fy_metrics_t *r) { pthread_rwlock_rdlock(&r->lock); }
void fy_metrics_batch_end(fy_metrics_t *r) { pthread_rwlock_unlock(&r->lock); }

/* ---- rendering ---------------------------------------------------------------------------------- */

static void sb_series(fy_strbuf_t *b, const char *name, const char *suffix, const char *labels, const char *extra)
{
    fy_strbuf_puts(b, name);
    fy_strbuf_puts(b, suffix);
    if (*labels || extra) {
        fy_strbuf_puts(b, "{");
        fy_strbuf_puts(b, labels);
        if (extra) {
            if (*labels) fy_strbuf_puts(b, ",");
            fy_strbuf_puts(b, extra);
        }
        fy_strbuf_puts(b, "}");
    }
    fy_strbuf_puts(b, " ");
}

static void render_histogram(fy_strbuf_t *b, fy_metric_t *m)
{
    const family_t *f = m->fam;
    uint64_t counts[64], *c = counts;
    if (f->n_bounds + 1 > 64 && !(c = fy_malloc(sizeof(uint64_t) * ((size_t)f->n_bounds + 1)))) {
        fy_strbuf_fail(b);
        return;
    }
    pthread_mutex_lock(&m->mu);
    memcpy(c, m->buckets, sizeof(uint64_t) * ((size_t)f->n_bounds + 1));
    uint64_t count = m->count;
    double sum = m->sum;
    pthread_mutex_unlock(&m->mu);
    uint64_t cum = 0;
    for (int i = 0; i <= f->n_bounds; i++) {
        cum += c[i];
        fy_strbuf_t le = {0};
        fy_strbuf_puts(&le, "le=\"");
        if (i < f->n_bounds)
            sb_value(&le, f->bounds[i]);
        else
            fy_strbuf_puts(&le, "+Inf");
        fy_strbuf_puts(&le, "\"");
        if (le.oom) fy_strbuf_fail(b);
        sb_series(b, f->name, "_bucket", m->labels, le.oom ? "" : le.p);
        fy_strbuf_free(&le);
        fy_strbuf_printf(b, "%llu\n", (unsigned long long)cum);
    }
    sb_series(b, f->name, "_sum", m->labels, NULL);
    sb_value(b, sum);
    fy_strbuf_puts(b, "\n");
    sb_series(b, f->name, "_count", m->labels, NULL);
    fy_strbuf_printf(b, "%llu\n", (unsigned long long)count);
    if (c != counts) fy_free(c);
}

fy_status_t fy_metrics_render(fy_metrics_t *r, char **text_p, size_t *len_p)
{
    fy_strbuf_t b = {0};
    fy_strbuf_reserve(&b, 4096);
    pthread_rwlock_wrlock(&r->lock);
    for (const family_t *f = r->fams; f && !b.oom; f = f->next) {
        bool any = false;
        for (fy_metric_t *m = r->series; m && !b.oom; m = m->next) {
            if (m->fam != f) continue;
            if (!any) {
                fy_strbuf_puts(&b, "# HELP ");
                fy_strbuf_puts(&b, f->name);
                fy_strbuf_puts(&b, " ");
                sb_escaped(&b, f->help, false);
                fy_strbuf_puts(&b, "\n# TYPE ");
                fy_strbuf_puts(&b, f->name);
                fy_strbuf_puts(&b, " ");
                fy_strbuf_puts(&b, KIND_NAME[f->kind]);
                fy_strbuf_puts(&b, "\n");
                any = true;
            }
            if (f->kind == KIND_HISTOGRAM) {
                render_histogram(&b, m);
            } else {
                sb_series(&b, f->name, "", m->labels, NULL);
                sb_value(&b, u2d(atomic_load_explicit(&m->bits, memory_order_relaxed)));
                fy_strbuf_puts(&b, "\n");
            }
        }
    }
    pthread_rwlock_unlock(&r->lock);
    size_t len;
    char *text = fy_strbuf_take(&b, &len);
    if (!text) {
        fy_error("metrics: out of memory rendering the registry");
        return FY_ERR_NOMEM;
    }
    *text_p = text;
    *len_p = len;
    return FY_OK;
}

/* ---- reading the text back (tests, tools) ------------------------------------------------------------ */

/* The label pair at *p (k="v", escapes kept), ending at '}' or ','; its
 * key and raw value as spans, *p past it (and past a ','); false when
 * malformed. */
static bool next_pair(const char **p, const char **k, size_t *kn, const char **v, size_t *vn)
{
    const char *s = *p;
    *k = s;
    while (*s && *s != '=' && *s != '}' && *s != '\n') s++;
    if (*s != '=' || s[1] != '"') return false;
    *kn = (size_t)(s - *k);
    s += 2;
    *v = s;
    while (*s && *s != '"' && *s != '\n') s += *s == '\\' && s[1] ? 2 : 1;
    if (*s != '"') return false;
    *vn = (size_t)(s - *v);
    s++;
    if (*s == ',') s++;
    *p = s;
    return true;
}

/* Whether the labels of a sample (at lp, after its '{'; NULL: none) hold
 * every pair of the spec's (at sp, after its '{'). */
static bool labels_hold(const char *lp, const char *sp)
{
    while (sp && *sp && *sp != '}') {
        const char *k, *v;
        size_t kn, vn;
        if (!next_pair(&sp, &k, &kn, &v, &vn)) return false;
        bool found = false;
        for (const char *q = lp; q && *q && *q != '}' && !found;) {
            const char *k2, *v2;
            size_t kn2, vn2;
            if (!next_pair(&q, &k2, &kn2, &v2, &vn2)) return false;
            found = kn == kn2 && vn == vn2 && !memcmp(k, k2, kn) && !memcmp(v, v2, vn);
        }
        if (!found) return false;
    }
    return true;
}

fy_status_t fy_metrics_sample(const char *text, const char *series, double *v_p)
{
    size_t n = strcspn(series, "{");
    const char *spec = series[n] == '{' ? series + n + 1 : NULL;
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (*p == '#' || strncmp(p, series, n) || (p[n] != ' ' && p[n] != '{')) continue;
        const char *lp = p[n] == '{' ? p + n + 1 : NULL;
        if (spec && !labels_hold(lp, spec)) continue;
        const char *val = p + n;
        if (lp) { /* past the labels: the first '}' outside a quoted value */
            bool quoted = false;
            for (val = lp; *val && *val != '\n' && (quoted || *val != '}'); val++) {
                if (*val == '\\' && quoted && val[1])
                    val++;
                else if (*val == '"')
                    quoted = !quoted;
            }
            if (*val != '}') continue;
            val++;
        }
        if (*val != ' ') continue;
        *v_p = strtod(val + 1, NULL);
        return FY_OK;
    }
    return FY_ERR_NOT_FOUND;
}

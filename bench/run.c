/*
 * run.c - sending a workload and timing it (run.h).
 *
 * The dispatcher (the caller's thread) releases each conversation at its
 * arrival time.  nng: a pool of threads, grown on demand up to the
 * concurrency limit, each with its own router client, takes released
 * conversations from a queue and runs their turns one after another
 * (generate, then long polls until done).  HTTP: one thread drives every
 * transfer through curl's multi interface and starts released
 * conversations while fewer than the limit are in flight.
 */
#include "bench/run.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>

#include "router/client.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"
#include "rpc/rpc.h"
#include "bench/stats.h"

static void abs_time(double t, struct timespec *ts)
{
    /* condition variables here use CLOCK_MONOTONIC */
    ts->tv_sec = (time_t)t;
    ts->tv_nsec = (long)((t - (double)ts->tv_sec) * 1e9);
    if (ts->tv_nsec >= 1000000000L) ts->tv_sec++, ts->tv_nsec -= 1000000000L;
}

/* ---- results ----------------------------------------------------------------------------------- */

fy_status_t fy_bench_results_create(const fy_bench_workload_t *w, fy_bench_result_t **res_p)
{
    fy_bench_result_t *res = fy_calloc((size_t)(w->n_reqs ? w->n_reqs : 1), sizeof(*res));
    if (!res) return FY_ERR_NOMEM;
    for (int32_t i = 0; i < w->n_reqs; i++) {
        int32_t cap = w->reqs[i].n_out + 1;
        res[i].cap_chunks = cap;
        res[i].chunk_s = fy_malloc((size_t)cap * sizeof(double));
        res[i].chunk_n = fy_malloc((size_t)cap * sizeof(int32_t));
        if (!res[i].chunk_s || !res[i].chunk_n) {
            fy_bench_results_destroy(res, i + 1);
            fy_error("bench: out of memory for the results of %d requests", w->n_reqs);
            return FY_ERR_NOMEM;
        }
    }
    *res_p = res;
    return FY_OK;
}

void fy_bench_results_destroy(fy_bench_result_t *res, int32_t n)
{
    if (!res) return;
    for (int32_t i = 0; i < n; i++) {
        fy_free(res[i].chunk_s);
        fy_free(res[i].chunk_n);
    }
    fy_free(res);
}

static void result_reset(fy_bench_result_t *r, double sched_s, int32_t n_in)
{
    r->sched_s = sched_s;
    r->sent_s = r->first_s = r->end_s = -1;
    r->n_in = n_in;
    r->n_out = 0;
    r->n_chunks = 0;
    r->n_cached = -1;
    r->server_counted_in = false;
    r->ok = false;
    r->error[0] = r->message[0] = 0;
}

static void result_fail(fy_bench_result_t *r, const char *kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void result_fail(fy_bench_result_t *r, const char *kind, const char *fmt, ...)
{
    r->ok = false;
    snprintf(r->error, sizeof(r->error), "%s", kind);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->message, sizeof(r->message), fmt, ap);
    va_end(ap);
}

/* A chunk of n tokens arrived at t (run time). */
static void result_chunk(fy_bench_result_t *r, double t, int32_t n)
{
    if (n <= 0) return;
    if (r->first_s < 0) r->first_s = t;
    if (r->n_chunks < r->cap_chunks) {
        r->chunk_s[r->n_chunks] = t;
        r->chunk_n[r->n_chunks++] = n;
    } else { /* more chunks than tokens asked for: the server sent extra; keep the count */
        r->chunk_n[r->n_chunks - 1] += n;
    }
    r->n_out += n;
}

/* ---- the shared state of one run ---------------------------------------------------------------- */

typedef struct run {
    const fy_bench_target_t *t;
    const fy_bench_workload_t *w;
    const fy_bench_run_params_t *p;
    fy_bench_result_t *res;
    char model[256]; /* http: the "model" field */
    char **answers;  /* [n_reqs] answer text of each turn of multi-turn conversations, else NULL */
    double t0;       /* monotonic time of the start */
    int32_t max_inflight;

    pthread_mutex_t mu;
    pthread_cond_t cv;   /* queue or stop changed */
    pthread_cond_t idle; /* a worker finished a conversation */
    int32_t *queue;      /* [n_convs] released conversations, FIFO */
    int32_t q_head, q_tail;
    int32_t n_workers, n_idle, n_ready, n_started;
    bool closing;
    pthread_t *threads; /* [max_inflight] nng workers */
    pthread_attr_t attr;

    atomic_int sent, done, failed, inflight;
    atomic_llong out_tokens, ttft_us;
    atomic_bool stop_progress;
} run_t;

static bool past_duration(const run_t *R, double t_run) { return R->p->duration_s > 0 && t_run > R->p->duration_s; }

static bool aborted(const run_t *R) { return R->p->abort_flag && *R->p->abort_flag; }

/* The prompt of request i: for a later turn of a conversation, every
 * earlier turn's text and answer, then its own text (a new allocation);
 * else the request's own text (not copied: *owned_p false). */
static char *prompt_of(run_t *R, int32_t i, size_t *len_p, bool *owned_p)
{
    const fy_bench_req_t *q = &R->w->reqs[i];
    *owned_p = false;
    if (q->turn == 0 || !R->answers) {
        *len_p = q->text_len;
        return q->text;
    }
    size_t len = 0;
    int32_t first = i - q->turn;
    for (int32_t k = first; k <= i; k++) {
        len += R->w->reqs[k].text_len;
        if (k < i && R->answers[k]) len += strlen(R->answers[k]);
    }
    char *s = fy_malloc(len + 1);
    if (!s) return NULL;
    size_t o = 0;
    for (int32_t k = first; k <= i; k++) {
        memcpy(s + o, R->w->reqs[k].text, R->w->reqs[k].text_len);
        o += R->w->reqs[k].text_len;
        if (k < i && R->answers[k]) {
            size_t a = strlen(R->answers[k]);
            memcpy(s + o, R->answers[k], a);
            o += a;
        }
    }
    s[o] = 0;
    *len_p = o;
    *owned_p = true;
    return s;
}

static void count_end(run_t *R, const fy_bench_result_t *r)
{
    atomic_fetch_add(&R->done, 1);
    atomic_fetch_sub(&R->inflight, 1);
    if (!r->ok) atomic_fetch_add(&R->failed, 1);
    atomic_fetch_add(&R->out_tokens, r->n_out);
    if (r->ok && r->first_s >= 0) atomic_fetch_add(&R->ttft_us, (long long)((r->first_s - r->sent_s) * 1e6));
}

static void count_start(run_t *R)
{
    atomic_fetch_add(&R->sent, 1);
    atomic_fetch_add(&R->inflight, 1);
}

/* Marks the requests of conversation c from turn `from` on as never sent. */
static void conv_not_sent(run_t *R, int32_t c, int32_t from, const char *kind, const char *why)
{
    const fy_bench_conv_t *cv = &R->w->convs[c];
    for (int32_t k = from; k < cv->n_turns; k++) {
        fy_bench_result_t *r = &R->res[cv->first + k];
        if (r->sched_s < 0) r->sched_s = 0;
        result_fail(r, kind, "%s", why);
        atomic_fetch_add(&R->done, 1);
        atomic_fetch_add(&R->failed, 1);
    }
}

/* ---- progress ---------------------------------------------------------------------------------- */

static void *progress_main(void *arg)
{
    run_t *R = arg;
    bool tty = isatty(2);
    double last_line = 0;
    int32_t total = R->w->n_reqs;
    while (!atomic_load(&R->stop_progress)) {
        usleep(250000);
        double t = fy_now_s() - R->t0;
        if (!tty && t - last_line < 5.0) continue;
        last_line = t;
        int done = atomic_load(&R->done), failed = atomic_load(&R->failed), sent = atomic_load(&R->sent);
        int inflight = atomic_load(&R->inflight);
        long long out = atomic_load(&R->out_tokens), tt = atomic_load(&R->ttft_us);
        int ok = done - failed;
        char bar[31];
        int fill = total ? (int)(30LL * done / total) : 30;
        for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
        bar[30] = 0;
        fprintf(stderr,
                "%s%s [%s] %d/%d done, %d sent, %d in flight, %d failed | %.2f req/s, %.0f tok/s, "
                "mean ttft %.0f ms | %.0f s%s",
                tty ? "\r" : "", R->p->label ? R->p->label : "bench", bar, done, total, sent, inflight, failed,
                t > 0 ? ok / t : 0, t > 0 ? (double)out / t : 0, ok ? (double)tt / ok / 1e3 : 0, t,
                tty ? "\033[K" : "\n");
    }
    if (tty) fprintf(stderr, "\r\033[K");
    return NULL;
}

/* ---- nng --------------------------------------------------------------------------------------- */

/* A client thread's routers (--url ADDR,ADDR...: several routers of one
 * cluster): thread k starts on router k mod n and moves to the next when
 * one cannot be reached or dies before a request's first token; the
 * request is then sent again there, and counted once. */
#define MAX_ROUTERS 8

typedef struct nng_conn {
    char url[MAX_ROUTERS][512];
    fy_client_t *c[MAX_ROUTERS];
    int n, cur;
} nng_conn_t;

static void conn_init(nng_conn_t *cn, const char *urls, int k)
{
    memset(cn, 0, sizeof(*cn));
    for (const char *u = urls; *u && cn->n < MAX_ROUTERS;) {
        size_t n = strcspn(u, ",");
        if (n && n < sizeof(cn->url[0])) snprintf(cn->url[cn->n++], sizeof(cn->url[0]), "%.*s", (int)n, u);
        u += n + (u[n] == ',');
    }
    cn->cur = cn->n ? k % cn->n : 0;
}

/* the current router's client (made on first use) */
static fy_status_t conn_get(run_t *R, nng_conn_t *cn, fy_client_t **c_p)
{
    if (!cn->n || !R->t->secret_file) return FY_ERR_INVALID;
    fy_client_t **c = &cn->c[cn->cur];
    fy_status_t st = *c ? FY_OK : fy_client_create(cn->url[cn->cur], R->t->secret_file, cn->n > 1 ? 3.0 : 10.0, c);
    if (!st) *c_p = *c;
    return st;
}

static void conn_free(nng_conn_t *cn)
{
    for (int i = 0; i < cn->n; i++) fy_client_destroy(cn->c[i]);
}

/* a failure another router may not share: no answer, or the router gone */
static bool conn_failover(nng_conn_t *cn, fy_status_t st)
{
    if (cn->n < 2 || (st != FY_ERR_PEER && st != FY_ERR_TIMEOUT)) return false;
    cn->cur = (cn->cur + 1) % cn->n;
    return true;
}

static const char *status_kind(fy_status_t st) { return fy_status_tag(st); }

/* One request through the router; the answer's text into *answer when asked. */
static void nng_request_on(run_t *R, fy_client_t *c, int32_t i, char **answer, fy_status_t *transport_p);

static void nng_request(run_t *R, nng_conn_t *cn, int32_t i, char **answer)
{
    for (int k = 0; k < (cn->n > 1 ? cn->n : 1); k++) {
        fy_client_t *c;
        fy_status_t st = conn_get(R, cn, &c);
        if (st) {
            count_start(R); /* ended by the caller, as a request that failed */
            result_fail(&R->res[i], "client", "cannot make a client of %s: %s", cn->url[cn->cur],
                        R->t->secret_file ? fy_status_str(st) : "no secret file (--secret)");
            if (k + 1 == cn->n || !conn_failover(cn, FY_ERR_PEER)) return;
            atomic_fetch_sub(&R->sent, 1);
            atomic_fetch_sub(&R->inflight, 1);
            continue;
        }
        fy_status_t transport = FY_OK;
        nng_request_on(R, c, i, answer, &transport);
        if (!transport || k + 1 == cn->n || !conn_failover(cn, transport)) return;
        atomic_fetch_sub(&R->sent, 1); /* sent again: counted once */
        atomic_fetch_sub(&R->inflight, 1);
        result_reset(&R->res[i], R->res[i].sched_s, R->w->reqs[i].n_in);
    }
}

/* *transport_p: a failure before the first token that another router may not share */
static void nng_request_on(run_t *R, fy_client_t *c, int32_t i, char **answer, fy_status_t *transport_p)
{
    const fy_bench_req_t *q = &R->w->reqs[i];
    fy_bench_result_t *r = &R->res[i];
    size_t plen;
    bool owned;
    char *prompt = prompt_of(R, i, &plen, &owned);
    if (!prompt) {
        result_fail(r, "client", "out of memory building the prompt");
        return;
    }
    fy_client_req_t req = {.prompt = prompt, .chat = R->t->chat, .deadline_s = R->p->timeout_s};
    fy_genspec_default(&req.gen);
    req.gen.max_tokens = q->n_out;
    req.gen.ignore_eos = R->t->ignore_eos;
    fy_client_stream_t s;
    char err[256] = "";
    double start = fy_now_s();
    r->sent_s = start - R->t0;
    count_start(R);
    fy_status_t st = fy_client_generate(c, &req, &s, err, sizeof(err));
    if (owned) fy_free(prompt);
    if (st) {
        r->end_s = fy_now_s() - R->t0;
        result_fail(r, status_kind(st), "%s", err[0] ? err : fy_status_str(st));
        *transport_p = st;
        return;
    }
    r->n_in = s.n_prompt;
    r->server_counted_in = true;
    size_t alen = 0, acap = 0;
    double deadline = start + R->p->timeout_s;
    for (;;) {
        double left = deadline - fy_now_s();
        if (left <= 0 || aborted(R)) {
            fy_client_cancel(c, s.id);
            r->end_s = fy_now_s() - R->t0;
            if (left <= 0)
                result_fail(r, "timeout", "no end within %.1f s", R->p->timeout_s);
            else
                result_fail(r, "interrupted", "the run was interrupted");
            return;
        }
        fy_client_update_t u;
        st = fy_client_poll(c, &s, left < 2.0 ? left : 2.0, &u);
        double t = fy_now_s() - R->t0;
        if (st) {
            r->end_s = t;
            result_fail(r, status_kind(st), "poll: %s", u.message[0] ? u.message : fy_status_str(st));
            fy_client_cancel(c, s.id);
            if (r->n_out == 0) *transport_p = st;
            return;
        }
        result_chunk(r, t, u.n_tokens);
        if (answer && u.text_len) {
            if (alen + u.text_len + 1 > acap) {
                size_t nc = (alen + u.text_len + 1) * 2;
                char *a = fy_realloc(*answer, nc);
                if (a) *answer = a, acap = nc;
            }
            if (alen + u.text_len + 1 <= acap) {
                memcpy(*answer + alen, u.text, u.text_len);
                alen += u.text_len;
                (*answer)[alen] = 0;
            }
        }
        if (u.done) {
            r->end_s = t;
            r->n_cached =
                u.timings.cached_prefill > u.timings.cached_decode ? u.timings.cached_prefill : u.timings.cached_decode;
            if (u.error)
                result_fail(r, status_kind(u.error), "%s", u.message[0] ? u.message : fy_status_str(u.error));
            else
                r->ok = true;
            return;
        }
    }
}

static void nng_conv(run_t *R, nng_conn_t *c, int32_t ci, double due)
{
    const fy_bench_conv_t *cv = &R->w->convs[ci];
    for (int32_t k = 0; k < cv->n_turns; k++) {
        int32_t i = cv->first + k;
        fy_bench_result_t *r = &R->res[i];
        if (k > 0) {
            due = fy_now_s() + R->w->think_s;
            if (R->w->think_s > 0) {
                struct timespec ts;
                abs_time(due, &ts);
                while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {}
            }
        }
        result_reset(r, due - R->t0, R->w->reqs[i].n_in);
        if (aborted(R) || (k > 0 && past_duration(R, fy_now_s() - R->t0))) {
            conv_not_sent(R, ci, k, aborted(R) ? "interrupted" : "not_sent",
                          aborted(R) ? "the run was interrupted" : "past --duration");
            return;
        }
        nng_request(R, c, i, R->answers && k + 1 < cv->n_turns ? &R->answers[i] : NULL);
        count_end(R, r);
        if (!r->ok && k + 1 < cv->n_turns) { /* the conversation cannot go on without this answer */
            conv_not_sent(R, ci, k + 1, "not_sent", "an earlier turn failed");
            return;
        }
    }
}

static void *nng_worker(void *arg)
{
    run_t *R = arg;
    pthread_mutex_lock(&R->mu);
    int me = R->n_started++;
    pthread_mutex_unlock(&R->mu);
    nng_conn_t cn;
    conn_init(&cn, R->t->url, me);
    fy_client_t *c = NULL;
    if (!conn_get(R, &cn, &c)) { /* connected before it takes work, so no request's time includes the dial */
        fy_client_status_t *s = fy_malloc(sizeof(*s));
        if (s) fy_client_status(c, s);
        fy_free(s);
    }
    pthread_mutex_lock(&R->mu);
    R->n_ready++;
    pthread_cond_broadcast(&R->idle);
    for (;;) {
        while (R->q_head == R->q_tail && !R->closing) pthread_cond_wait(&R->cv, &R->mu);
        if (R->q_head == R->q_tail) break;
        int32_t ci = R->queue[R->q_head++];
        R->n_idle--;
        pthread_mutex_unlock(&R->mu);
        double due = R->t0 + R->res[R->w->convs[ci].first].sched_s;
        nng_conv(R, &cn, ci, due);
        pthread_mutex_lock(&R->mu);
        R->n_idle++;
        pthread_cond_broadcast(&R->idle);
    }
    pthread_mutex_unlock(&R->mu);
    conn_free(&cn);
    return NULL;
}

static fy_status_t run_nng(run_t *R, const int32_t *order, const double *at)
{
    const fy_bench_workload_t *w = R->w;
    pthread_t *th = R->threads;
    fy_status_t st = FY_OK;
    for (int32_t k = 0; k < w->n_convs; k++) {
        int32_t ci = order[k];
        double due = R->t0 + at[ci];
        struct timespec ts;
        abs_time(due, &ts);
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR && !aborted(R)) {}
        R->res[w->convs[ci].first].sched_s = at[ci];
        pthread_mutex_lock(&R->mu);
        /* closed loop and the concurrency limit: wait for a free worker */
        while (R->n_idle - (R->q_tail - R->q_head) <= 0 && R->n_workers == R->max_inflight && !aborted(R)) {
            struct timespec tw;
            abs_time(fy_now_s() + 0.1, &tw);
            pthread_cond_timedwait(&R->idle, &R->mu, &tw);
        }
        pthread_mutex_unlock(&R->mu);
        double t = fy_now_s() - R->t0;
        if (aborted(R) || past_duration(R, t)) {
            for (int32_t j = k; j < w->n_convs; j++) {
                R->res[w->convs[order[j]].first].sched_s = at[order[j]];
                conv_not_sent(R, order[j], 0, aborted(R) ? "interrupted" : "not_sent",
                              aborted(R) ? "the run was interrupted" : "past --duration");
            }
            break;
        }
        pthread_mutex_lock(&R->mu);
        /* idle workers not yet woken for queued work do not count as free */
        if (R->n_idle - (R->q_tail - R->q_head) <= 0 && R->n_workers < R->max_inflight) {
            int rc = pthread_create(&th[R->n_workers], &R->attr, nng_worker, R);
            if (rc == 0) {
                R->n_workers++;
                R->n_idle++;
            } else if (R->n_workers == 0) {
                pthread_mutex_unlock(&R->mu);
                fy_error("bench: cannot start a client thread: %s", strerror(rc));
                st = FY_ERR_IO;
                for (int32_t j = k; j < w->n_convs; j++) conv_not_sent(R, order[j], 0, "client", "no client thread");
                pthread_mutex_lock(&R->mu);
                break;
            }
        }
        R->queue[R->q_tail++] = ci;
        pthread_cond_signal(&R->cv);
        pthread_mutex_unlock(&R->mu);
    }
    pthread_mutex_lock(&R->mu);
    R->closing = true;
    pthread_cond_broadcast(&R->cv);
    int32_t n = R->n_workers;
    pthread_mutex_unlock(&R->mu);
    for (int32_t i = 0; i < n; i++) pthread_join(th[i], NULL);
    return st;
}

/* ---- HTTP -------------------------------------------------------------------------------------- */

typedef struct hreq {
    run_t *R;
    struct hreq *prev, *next; /* the transfers in flight */
    CURL *h;
    struct curl_slist *hdrs;
    int32_t conv, turn, i;
    char *body; /* the request's JSON */
    char *buf;  /* bytes received not yet parsed (SSE), or the error body */
    size_t len, cap;
    char *answer; /* text received (kept for the next turn) */
    size_t alen, acap;
    long status;
    bool done_seen, finish_seen, failed;
    int32_t usage_out; /* completion_tokens from usage, -1 when absent */
    char errbuf[CURL_ERROR_SIZE];
} hreq_t;

static bool grow(char **b, size_t *cap, size_t need)
{
    if (need <= *cap) return true;
    size_t nc = *cap ? *cap : 256;
    while (nc < need) nc *= 2;
    char *nb = fy_realloc(*b, nc);
    if (!nb) return false;
    *b = nb;
    *cap = nc;
    return true;
}

/* One SSE "data:" payload. */
static void sse_event(hreq_t *q, const char *data, size_t n, double t)
{
    run_t *R = q->R;
    fy_bench_result_t *r = &R->res[q->i];
    if (n == 6 && !memcmp(data, "[DONE]", 6)) {
        q->done_seen = true;
        return;
    }
    json_error_t je;
    json_t *o = json_loadb(data, n, 0, &je);
    if (!o) {
        if (!q->failed) result_fail(r, "bad_response", "an event that is not JSON: %s", je.text);
        q->failed = true;
        return;
    }
    json_t *err = json_object_get(o, "error");
    if (err && !json_is_null(err)) {
        const char *m = json_string_value(json_object_get(err, "message"));
        if (!m) m = json_string_value(err);
        if (!q->failed) result_fail(r, "server_error", "%s", m ? m : "an error event");
        q->failed = true;
    }
    json_t *ch = json_array_get(json_object_get(o, "choices"), 0);
    if (ch) {
        json_t *txt =
            R->t->chat ? json_object_get(json_object_get(ch, "delta"), "content") : json_object_get(ch, "text");
        size_t tl = json_is_string(txt) ? json_string_length(txt) : 0;
        if (tl) {
            result_chunk(r, t, 1); /* an event is a chunk; usage corrects the token count at the end */
            if (grow(&q->answer, &q->acap, q->alen + tl + 1)) {
                memcpy(q->answer + q->alen, json_string_value(txt), tl);
                q->alen += tl;
                q->answer[q->alen] = 0;
            }
        }
        json_t *fr = json_object_get(ch, "finish_reason");
        if (fr && json_is_string(fr)) q->finish_seen = true;
    }
    json_t *usage = json_object_get(o, "usage");
    if (json_is_object(usage)) {
        json_t *pt = json_object_get(usage, "prompt_tokens"), *ct = json_object_get(usage, "completion_tokens");
        if (json_is_integer(pt)) {
            r->n_in = (int32_t)json_integer_value(pt);
            r->server_counted_in = true;
        }
        if (json_is_integer(ct)) q->usage_out = (int32_t)json_integer_value(ct);
        json_t *cached = json_object_get(json_object_get(usage, "prompt_tokens_details"), "cached_tokens");
        if (json_is_integer(cached)) r->n_cached = (int32_t)json_integer_value(cached);
    }
    json_decref(o);
}

static size_t on_data(char *p, size_t size, size_t nmemb, void *arg)
{
    hreq_t *q = arg;
    size_t n = size * nmemb;
    double t = fy_now_s() - q->R->t0;
    if (!q->status) curl_easy_getinfo(q->h, CURLINFO_RESPONSE_CODE, &q->status);
    if (!grow(&q->buf, &q->cap, q->len + n + 1)) return 0; /* curl ends the transfer: CURLE_WRITE_ERROR */
    memcpy(q->buf + q->len, p, n);
    q->len += n;
    q->buf[q->len] = 0;
    if (q->status >= 300) return n; /* an error body: read whole at the end */
    /* events end with a blank line; lines may end with \r\n */
    size_t start = 0;
    for (;;) {
        char *e1 = strstr(q->buf + start, "\n\n"), *e2 = strstr(q->buf + start, "\r\n\r\n");
        char *end = e1 && (!e2 || e1 < e2) ? e1 : e2;
        if (!end) break;
        size_t elen = (size_t)(end - (q->buf + start));
        size_t skip = end == e1 ? 2 : 4;
        /* each line of the event: "data: ..." (comments and other fields ignored) */
        char *line = q->buf + start, *stop = line + elen;
        while (line < stop) {
            char *nl = memchr(line, '\n', (size_t)(stop - line));
            char *le = nl ? nl : stop;
            size_t ll = (size_t)(le - line);
            if (ll && line[ll - 1] == '\r') ll--;
            if (ll >= 5 && !memcmp(line, "data:", 5)) {
                const char *d = line + 5;
                size_t dl = ll - 5;
                if (dl && *d == ' ') d++, dl--;
                sse_event(q, d, dl, t);
            }
            line = nl ? nl + 1 : stop;
        }
        start += elen + skip;
    }
    memmove(q->buf, q->buf + start, q->len - start + 1);
    q->len -= start;
    return n;
}

static void hreq_free(hreq_t *q)
{
    if (!q) return;
    if (q->h) curl_easy_cleanup(q->h);
    curl_slist_free_all(q->hdrs);
    fy_free(q->body);
    fy_free(q->buf);
    fy_free(q->answer);
    fy_free(q);
}

static char *request_body(run_t *R, int32_t i)
{
    const fy_bench_req_t *q = &R->w->reqs[i];
    json_t *o = json_pack("{s:s, s:i, s:b, s:{s:b}, s:f}", "model", R->model, "max_tokens", q->n_out, "stream", 1,
                          "stream_options", "include_usage", 1, "temperature", 0.0);
    if (!o) return NULL;
    if (R->t->ignore_eos) json_object_set_new(o, "ignore_eos", json_true());
    int bad = 0;
    if (R->t->chat) {
        json_t *msgs = json_array();
        int32_t first = i - q->turn;
        for (int32_t k = first; msgs && k <= i; k++) {
            bad |= json_array_append_new(
                msgs, json_pack("{s:s, s:s%}", "role", "user", "content", R->w->reqs[k].text, R->w->reqs[k].text_len));
            if (k < i)
                bad |= json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "assistant", "content",
                                                             R->answers && R->answers[k] ? R->answers[k] : ""));
        }
        bad |= !msgs || json_object_set_new(o, "messages", msgs);
    } else {
        size_t len;
        bool owned;
        char *p = prompt_of(R, i, &len, &owned);
        bad |= !p || json_object_set_new(o, "prompt", json_stringn(p, len));
        if (owned) fy_free(p);
    }
    char *s = bad ? NULL : json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

static hreq_t *http_start(run_t *R, CURLM *m, int32_t ci, int32_t turn, double due)
{
    int32_t i = R->w->convs[ci].first + turn;
    fy_bench_result_t *r = &R->res[i];
    result_reset(r, due - R->t0, R->w->reqs[i].n_in);
    hreq_t *q = fy_calloc(1, sizeof(*q));
    char url[1024], auth[512];
    const char *base = R->t->url;
    size_t bl = strlen(base);
    while (bl && base[bl - 1] == '/') bl--;
    snprintf(url, sizeof(url), "%.*s%s", (int)bl, base, R->t->chat ? "/v1/chat/completions" : "/v1/completions");
    if (q) {
        q->R = R;
        q->conv = ci;
        q->turn = turn;
        q->i = i;
        q->usage_out = -1;
        q->body = request_body(R, i);
        q->h = curl_easy_init();
        q->hdrs = curl_slist_append(NULL, "Content-Type: application/json");
        if (q->hdrs) q->hdrs = curl_slist_append(q->hdrs, "Accept: text/event-stream");
        if (q->hdrs && R->t->api_key) {
            snprintf(auth, sizeof(auth), "Authorization: Bearer %s", R->t->api_key);
            q->hdrs = curl_slist_append(q->hdrs, auth);
        }
    }
    if (!q || !q->body || !q->h || !q->hdrs) {
        result_fail(r, "client", "out of memory starting the request");
        hreq_free(q);
        atomic_fetch_add(&R->done, 1);
        atomic_fetch_add(&R->failed, 1);
        return NULL;
    }
    CURL *h = q->h;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, q->body);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, q->hdrs);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, q);
    curl_easy_setopt(h, CURLOPT_PRIVATE, q);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, q->errbuf);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(R->p->timeout_s * 1000));
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
    curl_easy_setopt(h, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    /* only the address given: no proxy from the environment, no redirects */
    curl_easy_setopt(h, CURLOPT_NOPROXY, "*");
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    if (R->t->ca_file) curl_easy_setopt(h, CURLOPT_CAINFO, R->t->ca_file);
    r->sent_s = fy_now_s() - R->t0;
    CURLMcode mc = curl_multi_add_handle(m, h);
    if (mc != CURLM_OK) {
        r->end_s = r->sent_s;
        result_fail(r, "client", "curl: %s", curl_multi_strerror(mc));
        hreq_free(q);
        atomic_fetch_add(&R->done, 1);
        atomic_fetch_add(&R->failed, 1);
        return NULL;
    }
    count_start(R);
    return q;
}

/* A transfer ended: its result; whether the conversation goes on. */
static bool http_end(run_t *R, hreq_t *q, CURLcode cc)
{
    fy_bench_result_t *r = &R->res[q->i];
    r->end_s = fy_now_s() - R->t0;
    if (!q->status) curl_easy_getinfo(q->h, CURLINFO_RESPONSE_CODE, &q->status);
    if (q->usage_out >= 0 && q->usage_out != r->n_out && r->n_chunks > 0) {
        /* the server counted the tokens: spread its count over the chunks seen */
        r->chunk_n[r->n_chunks - 1] += q->usage_out - r->n_out;
        if (r->chunk_n[r->n_chunks - 1] < 0) r->chunk_n[r->n_chunks - 1] = 0;
        r->n_out = q->usage_out;
    }
    if (cc != CURLE_OK) {
        const char *kind = cc == CURLE_OPERATION_TIMEDOUT ? "timeout"
                           : cc == CURLE_COULDNT_CONNECT  ? "connect"
                           : cc == CURLE_GOT_NOTHING      ? "no_response"
                           : cc == CURLE_RECV_ERROR       ? "recv"
                           : cc == CURLE_SEND_ERROR       ? "send"
                                                          : "http_io";
        result_fail(r, kind, "curl: %s", q->errbuf[0] ? q->errbuf : curl_easy_strerror(cc));
    } else if (q->status >= 300 || q->status < 200) {
        char kind[FY_BENCH_KIND_LEN];
        snprintf(kind, sizeof(kind), "http_%ld", q->status);
        const char *msg = NULL;
        json_t *o = q->buf ? json_loadb(q->buf, q->len, 0, NULL) : NULL;
        json_t *e = json_object_get(o, "error");
        msg = json_string_value(json_object_get(e, "message"));
        if (!msg) msg = json_string_value(e);
        result_fail(r, kind, "%.150s", msg ? msg : q->buf ? q->buf : "");
        json_decref(o);
    } else if (!q->failed && !q->done_seen && !q->finish_seen) {
        result_fail(r, "incomplete", "the stream ended without [DONE]");
    } else if (!q->failed) {
        r->ok = true;
    }
    count_end(R, r);
    if (R->answers && q->answer) {
        R->answers[q->i] = q->answer;
        q->answer = NULL;
    }
    return r->ok;
}

static void link_req(hreq_t **head, hreq_t *q)
{
    q->prev = NULL;
    q->next = *head;
    if (*head) (*head)->prev = q;
    *head = q;
}

static void unlink_req(hreq_t **head, hreq_t *q)
{
    if (q->prev)
        q->prev->next = q->next;
    else
        *head = q->next;
    if (q->next) q->next->prev = q->prev;
}

typedef struct due_turn {
    double due;
    int32_t conv, turn;
} due_turn_t;

typedef struct membuf {
    char *p;
    size_t len, cap;
} membuf_t;

static size_t on_body(char *p, size_t size, size_t nmemb, void *arg)
{
    membuf_t *b = arg;
    size_t n = size * nmemb;
    if (b->len + n > (1u << 20) || !grow(&b->p, &b->cap, b->len + n + 1)) return 0;
    memcpy(b->p + b->len, p, n);
    b->len += n;
    b->p[b->len] = 0;
    return n;
}

/* The served model's name, as vLLM's bench learns it: GET /v1/models. */
static fy_status_t http_model(const fy_bench_target_t *t, char *out, size_t cap)
{
    char url[1024], auth[512];
    size_t bl = strlen(t->url);
    while (bl && t->url[bl - 1] == '/') bl--;
    snprintf(url, sizeof(url), "%.*s/v1/models", (int)bl, t->url);
    CURL *h = curl_easy_init();
    struct curl_slist *hdrs = NULL;
    membuf_t b = {0};
    if (!h) return FY_ERR_NOMEM;
    if (t->api_key) {
        snprintf(auth, sizeof(auth), "Authorization: Bearer %s", t->api_key);
        hdrs = curl_slist_append(NULL, auth);
    }
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 10000L);
    curl_easy_setopt(h, CURLOPT_NOPROXY, "*");
    if (t->ca_file) curl_easy_setopt(h, CURLOPT_CAINFO, t->ca_file);
    CURLcode cc = curl_easy_perform(h);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(h);
    curl_slist_free_all(hdrs);
    json_t *o = cc == CURLE_OK && status == 200 && b.p ? json_loadb(b.p, b.len, 0, NULL) : NULL;
    const char *id = json_string_value(json_object_get(json_array_get(json_object_get(o, "data"), 0), "id"));
    fy_status_t st = FY_OK;
    if (id)
        snprintf(out, cap, "%s", id);
    else {
        fy_error("bench: cannot learn the model's name from %s (%s, HTTP %ld): give --model", url,
                 cc ? curl_easy_strerror(cc) : "no model in the answer", status);
        st = FY_ERR_NOT_FOUND;
    }
    json_decref(o);
    fy_free(b.p);
    return st;
}

static fy_status_t run_http(run_t *R, const int32_t *order, const double *at)
{
    const fy_bench_workload_t *w = R->w;
    CURLM *m = curl_multi_init();
    /* later turns waiting for their think time; at most one per conversation */
    due_turn_t *later = fy_calloc((size_t)w->n_convs, sizeof(*later));
    if (!m || !later) {
        if (m) curl_multi_cleanup(m);
        fy_free(later);
        fy_error("bench: cannot set up curl");
        return FY_ERR_NOMEM;
    }
    curl_multi_setopt(m, CURLMOPT_MAXCONNECTS, (long)R->max_inflight);
    int32_t n_later = 0, next = 0, inflight = 0;
    hreq_t *active = NULL;
    for (;;) {
        double t = fy_now_s();
        bool stop_new = aborted(R) || past_duration(R, t - R->t0);
        /* start what is due, later turns first (they were waiting on an answer) */
        for (int32_t k = 0; k < n_later && inflight < R->max_inflight;) {
            if (later[k].due > t && !stop_new) {
                k++;
                continue;
            }
            due_turn_t d = later[k];
            later[k] = later[--n_later];
            if (stop_new) {
                conv_not_sent(R, d.conv, d.turn, aborted(R) ? "interrupted" : "not_sent",
                              aborted(R) ? "the run was interrupted" : "past --duration");
                continue;
            }
            hreq_t *q = http_start(R, m, d.conv, d.turn, d.due);
            if (q) {
                inflight++;
                link_req(&active, q);
            } else {
                conv_not_sent(R, d.conv, d.turn + 1, "not_sent", "an earlier turn failed");
            }
        }
        while (next < w->n_convs && (stop_new || (R->t0 + at[order[next]] <= t && inflight < R->max_inflight))) {
            int32_t ci = order[next++];
            R->res[w->convs[ci].first].sched_s = at[ci];
            if (stop_new) {
                conv_not_sent(R, ci, 0, aborted(R) ? "interrupted" : "not_sent",
                              aborted(R) ? "the run was interrupted" : "past --duration");
                continue;
            }
            hreq_t *q = http_start(R, m, ci, 0, R->t0 + at[ci]);
            if (q) {
                inflight++;
                link_req(&active, q);
            } else {
                conv_not_sent(R, ci, 1, "not_sent", "an earlier turn failed");
            }
        }
        if (!inflight && !n_later && next == w->n_convs) break;
        int running;
        curl_multi_perform(m, &running);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(m, &left))) {
            if (msg->msg != CURLMSG_DONE) continue;
            hreq_t *q;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&q);
            CURLcode cc = msg->data.result;
            curl_multi_remove_handle(m, q->h);
            inflight--;
            unlink_req(&active, q);
            bool ok = http_end(R, q, cc);
            const fy_bench_conv_t *cv = &w->convs[q->conv];
            if (q->turn + 1 < cv->n_turns) {
                if (ok)
                    later[n_later++] = (due_turn_t){fy_now_s() + w->think_s, q->conv, q->turn + 1};
                else
                    conv_not_sent(R, q->conv, q->turn + 1, "not_sent", "an earlier turn failed");
            }
            hreq_free(q);
        }
        if (aborted(R)) /* end what is in flight now */
            while (active) {
                hreq_t *q = active;
                active = q->next;
                curl_multi_remove_handle(m, q->h);
                inflight--;
                fy_bench_result_t *r = &R->res[q->i];
                r->end_s = fy_now_s() - R->t0;
                result_fail(r, "interrupted", "the run was interrupted");
                count_end(R, r);
                conv_not_sent(R, q->conv, q->turn + 1, "interrupted", "the run was interrupted");
                hreq_free(q);
            }
        /* sleep until the next arrival, a transfer's activity, or 50 ms */
        double wake = t + 0.05;
        if (next < w->n_convs && inflight < R->max_inflight && R->t0 + at[order[next]] < wake)
            wake = R->t0 + at[order[next]];
        for (int32_t k = 0; k < n_later; k++)
            if (later[k].due < wake) wake = later[k].due;
        int ms = (int)ceil((wake - fy_now_s()) * 1000.0);
        if (ms > 0) curl_multi_poll(m, NULL, 0, ms, NULL);
    }
    curl_multi_cleanup(m);
    fy_free(later);
    return FY_OK;
}

/* ---- the run ----------------------------------------------------------------------------------- */

static const double *sort_at;
static int cmp_order(const void *a, const void *b)
{
    double x = sort_at[*(const int32_t *)a], y = sort_at[*(const int32_t *)b];
    if (x != y) return (x > y) - (x < y);
    return (*(const int32_t *)a > *(const int32_t *)b) - (*(const int32_t *)a < *(const int32_t *)b);
}

fy_status_t fy_bench_run(const fy_bench_target_t *t, const fy_bench_workload_t *w, const double *at,
                         const fy_bench_run_params_t *p, fy_bench_result_t *res, double *duration_p)
{
    run_t R = {.t = t, .w = w, .p = p, .res = res};
    R.max_inflight = p->max_concurrency > 0 && p->max_concurrency < FY_BENCH_MAX_INFLIGHT ? p->max_concurrency
                                                                                          : FY_BENCH_MAX_INFLIGHT;
    int32_t *order = fy_malloc((size_t)(w->n_convs ? w->n_convs : 1) * sizeof(int32_t));
    R.queue = fy_malloc((size_t)(w->n_convs ? w->n_convs : 1) * sizeof(int32_t));
    bool multi = false;
    for (int32_t c = 0; c < w->n_convs; c++) multi |= w->convs[c].n_turns > 1;
    if (multi) R.answers = fy_calloc((size_t)w->n_reqs, sizeof(char *));
    if (!order || !R.queue || (multi && !R.answers)) {
        fy_free(order);
        fy_free(R.queue);
        fy_free(R.answers);
        fy_error("bench: out of memory for a run of %d requests", w->n_reqs);
        return FY_ERR_NOMEM;
    }
    for (int32_t i = 0; i < w->n_reqs; i++) result_reset(&res[i], -1, w->reqs[i].n_in);
    for (int32_t c = 0; c < w->n_convs; c++) order[c] = c;
    sort_at = at; /* the caller's thread only; qsort has no argument */
    qsort(order, (size_t)w->n_convs, sizeof(int32_t), cmp_order);
    pthread_mutex_init(&R.mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&R.cv, &ca);
    pthread_cond_init(&R.idle, &ca);
    pthread_condattr_destroy(&ca);
    if (t->proto == FY_BENCH_PROTO_HTTP) {
        fy_status_t mst = FY_OK;
        if (t->model)
            snprintf(R.model, sizeof(R.model), "%s", t->model);
        else
            mst = http_model(t, R.model, sizeof(R.model));
        if (mst) {
            fy_free(order);
            fy_free(R.queue);
            fy_free(R.answers);
            return mst;
        }
    }
    if (t->proto == FY_BENCH_PROTO_NNG) {
        /* a few connected workers before the clock starts; more as the load needs them */
        R.threads = fy_calloc((size_t)R.max_inflight, sizeof(pthread_t));
        if (!R.threads) {
            fy_free(order);
            fy_free(R.queue);
            fy_free(R.answers);
            return FY_ERR_NOMEM;
        }
        pthread_attr_init(&R.attr);
        pthread_attr_setstacksize(&R.attr, 256 << 10);
        int32_t warm = R.max_inflight < 16 ? R.max_inflight : 16;
        if (warm > w->n_convs) warm = w->n_convs;
        pthread_mutex_lock(&R.mu);
        for (int32_t i = 0; i < warm; i++) {
            if (pthread_create(&R.threads[R.n_workers], &R.attr, nng_worker, &R)) break;
            R.n_workers++;
            R.n_idle++;
        }
        while (R.n_ready < R.n_workers) pthread_cond_wait(&R.idle, &R.mu);
        pthread_mutex_unlock(&R.mu);
    }
    pthread_t prog;
    R.t0 = fy_now_s();
    bool have_prog = p->progress && pthread_create(&prog, NULL, progress_main, &R) == 0;
    fy_status_t st = t->proto == FY_BENCH_PROTO_HTTP ? run_http(&R, order, at) : run_nng(&R, order, at);
    double end = 0;
    for (int32_t i = 0; i < w->n_reqs; i++)
        if (res[i].end_s > end) end = res[i].end_s;
    if (have_prog) {
        atomic_store(&R.stop_progress, true);
        pthread_join(prog, NULL);
    }
    if (R.threads) {
        pthread_attr_destroy(&R.attr);
        fy_free(R.threads);
    }
    pthread_cond_destroy(&R.cv);
    pthread_cond_destroy(&R.idle);
    pthread_mutex_destroy(&R.mu);
    if (R.answers)
        for (int32_t i = 0; i < w->n_reqs; i++) fy_free(R.answers[i]);
    fy_free(R.answers);
    fy_free(R.queue);
    fy_free(order);
    if (st) return st;
    *duration_p = end;
    return FY_OK;
}

/* ---- addresses --------------------------------------------------------------------------------- */

fy_status_t fy_bench_check_address(const char *url, bool allow_remote, char *err, size_t cap)
{
    if (strchr(url, ',')) { /* several routers of one cluster: each must pass */
        char one[1024];
        for (const char *u = url;;) {
            size_t n = strcspn(u, ",");
            snprintf(one, sizeof(one), "%.*s", (int)(n < sizeof(one) ? n : sizeof(one) - 1), u);
            fy_status_t st = fy_bench_check_address(one, allow_remote, err, cap);
            if (st) return st;
            if (!u[n]) return FY_OK;
            u += n + 1;
        }
    }
    const char *sep = strstr(url, "://");
    if (!sep) {
        snprintf(err, cap, "address '%s': expected scheme://host:port (tcp://, http://) or ipc://path", url);
        return FY_ERR_INVALID;
    }
    size_t sl = (size_t)(sep - url);
    if ((sl == 3 && !strncmp(url, "ipc", 3)) || (sl == 6 && !strncmp(url, "inproc", 6))) return FY_OK;
    if (!((sl == 3 && !strncmp(url, "tcp", 3)) || (sl == 4 && !strncmp(url, "http", 4)) ||
          (sl == 5 && !strncmp(url, "https", 5)) || (sl == 4 && !strncmp(url, "tcp4", 4)) ||
          (sl == 4 && !strncmp(url, "tcp6", 4)))) {
        snprintf(err, cap, "address '%s': unknown scheme (tcp, http, https, ipc)", url);
        return FY_ERR_INVALID;
    }
    const char *h = sep + 3, *e;
    char host[256];
    if (*h == '[') {
        e = strchr(h, ']');
        if (!e) {
            snprintf(err, cap, "address '%s': unclosed '['", url);
            return FY_ERR_INVALID;
        }
        h++;
    } else {
        e = h + strcspn(h, ":/");
    }
    if (e == h || (size_t)(e - h) >= sizeof(host)) {
        snprintf(err, cap, "address '%s': no host", url);
        return FY_ERR_INVALID;
    }
    memcpy(host, h, (size_t)(e - h));
    host[e - h] = 0;
    if (allow_remote) return FY_OK;
    struct in_addr a4;
    struct in6_addr a6;
    bool loop = !strcmp(host, "localhost") || (inet_pton(AF_INET, host, &a4) == 1 && (ntohl(a4.s_addr) >> 24) == 127) ||
                (inet_pton(AF_INET6, host, &a6) == 1 && IN6_IS_ADDR_LOOPBACK(&a6));
    if (!loop) {
        snprintf(err, cap,
                 "address '%s': %s is not a loopback address; ferry-bench only loads servers on this "
                 "host unless given --allow-remote",
                 url, host);
        return FY_ERR_INVALID;
    }
    return FY_OK;
}

/*
 * echo.c - the echo server (echo.h).
 *
 * nng: requests live in a table indexed by id; a poll is answered at once
 * when a token is due (or the request is done), else parked until its
 * next token or its wait runs out, and a timer thread answers parked
 * polls.  HTTP: libmicrohttpd; a streamed answer is a chunked response
 * whose reader writes the events as their tokens fall due (sleeping when
 * paced, which is why paced serving takes a thread per connection).
 */
#include "bench/echo.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <microhttpd.h>

#include "common/clock.h"
#include "common/cluster.h"
#include "common/log.h"
#include "common/mem.h"
#include "common/msg.h"
#include "rpc/rpc.h"
#include "common/wire.h"
#include "bench/workload.h"
#include "bench/stats.h"

typedef struct ereq {
    bool live;
    int32_t n_prompt, max_tokens;
    double t0;
} ereq_t;

typedef struct parked {
    fy_rpc_call_t *call;
    uint64_t id;
    int32_t from;
    double due, give_up;
    struct parked *next;
} parked_t;

struct fy_bench_echo {
    fy_bench_echo_params_t p;
    char *api_key;
    fy_rpc_server_t *srv;
    struct MHD_Daemon *mhd;
    int port;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ereq_t *reqs; /* [cap] by id - 1 */
    uint64_t n, cap;
    parked_t *parked;
    bool stopping, have_timer;
    pthread_t timer;
    atomic_ullong count, served, refused;
    atomic_bool http_stopping;
};

/* Tokens of a request due at t. */
static int32_t due_tokens(const fy_bench_echo_t *e, const ereq_t *q, double t)
{
    if (e->p.ttft_s <= 0 && e->p.itl_s <= 0) return q->max_tokens;
    double a = t - q->t0 - e->p.ttft_s;
    if (a < 0) return 0;
    if (e->p.itl_s <= 0) return q->max_tokens;
    double k = 1 + floor(a / e->p.itl_s);
    return k >= q->max_tokens ? q->max_tokens : (int32_t)k;
}

static double next_due(const fy_bench_echo_t *e, const ereq_t *q, int32_t have)
{
    return q->t0 + e->p.ttft_s + (double)have * (e->p.itl_s > 0 ? e->p.itl_s : 0);
}

static int32_t count_words(const char *s, size_t n)
{
    int32_t w = 0;
    bool in = false;
    for (size_t i = 0; i < n; i++) {
        bool sp = s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r';
        if (!sp && !in) w++;
        in = !sp;
    }
    return w;
}

/* Is this the fail_every-th request? */
static bool refuse_now(fy_bench_echo_t *e)
{
    unsigned long long k = atomic_fetch_add(&e->count, 1) + 1;
    if (e->p.fail_every > 0 && k % (unsigned long long)e->p.fail_every == 0) {
        atomic_fetch_add(&e->refused, 1);
        return true;
    }
    atomic_fetch_add(&e->served, 1);
    return false;
}

/* ---- nng --------------------------------------------------------------------------------------- */

/* The events reply for tokens [from, have) of request id. */
static void reply_events(fy_rpc_call_t *call, uint64_t id, const ereq_t *q, int32_t from, int32_t have, double t)
{
    int32_t n = have > from ? have - from : 0;
    int32_t toks[256];
    char text[256 * 12 + 1];
    if (n > 256) n = 256; /* the client asks again for the rest */
    size_t tl = 0;
    for (int32_t k = 0; k < n; k++) {
        toks[k] = 100 + (from + k) % 1000;
        tl += (size_t)snprintf(text + tl, sizeof(text) - tl, " %s", fy_bench_word(from + k));
    }
    fy_wire_events_t m;
    fy_wire_events_init(&m);
    m.id = id;
    m.tokens = toks;
    m.n_tokens = n;
    m.text = text;
    m.text_len = tl;
    m.n_prompt = q->n_prompt;
    m.done = from + n == q->max_tokens;
    snprintf(m.state, sizeof(m.state), "%s", m.done ? "done" : "decoding");
    if (m.done) {
        snprintf(m.finish_reason, sizeof(m.finish_reason), "length");
        m.has_timings = true;
        m.timings.e2e_s = t - q->t0;
    }
    fy_msgw_t w;
    fy_wire_events_write(&w, &m);
    fy_rpc_reply_msgw(call, &w);
}

static void on_generate(fy_bench_echo_t *e, fy_rpc_call_t *call, fy_msgr_t *r)
{
    /* any token ids (there is no vocabulary here), up to 64 Ki of them, and up to 2^20 new tokens */
    fy_wire_lim_t lim = {.token_hi = INT32_MAX, .max_prompt = 65536, .max_ctx = 1 << 20};
    fy_wire_generate_t m;
    fy_wire_generate_init(&m);
    if (fy_wire_generate_read(r, &lim, &m)) {
        fy_rpc_reply_error(call, 0, FY_ERR_FORMAT, r->err);
        return;
    }
    /* text or token ids: only their count matters here */
    int32_t n_prompt = m.prompt ? count_words(m.prompt, m.prompt_len) : m.n_tokens, max_tokens = m.gen.max_tokens;
    fy_wire_generate_clear(&m);
    if (refuse_now(e)) {
        fy_rpc_reply_error(call, 0, FY_ERR_OVERLOADED, "echo: refused on purpose (fail_every)");
        return;
    }
    pthread_mutex_lock(&e->mu);
    if (e->n == e->cap) {
        uint64_t nc = e->cap ? 2 * e->cap : 1024;
        ereq_t *nr = fy_realloc(e->reqs, nc * sizeof(*nr));
        if (!nr) {
            pthread_mutex_unlock(&e->mu);
            fy_rpc_reply_error(call, 0, FY_ERR_NOMEM, "echo: out of memory");
            return;
        }
        e->reqs = nr;
        e->cap = nc;
    }
    uint64_t id = ++e->n;
    e->reqs[id - 1] = (ereq_t){.live = true, .n_prompt = n_prompt, .max_tokens = max_tokens, .t0 = fy_now_s()};
    pthread_mutex_unlock(&e->mu);
    fy_wire_accepted_t a = {.id = id, .n_prompt = n_prompt};
    fy_msgw_t w;
    fy_wire_accepted_write(&w, &a);
    fy_rpc_reply_msgw(call, &w);
}

static void on_poll(fy_bench_echo_t *e, fy_rpc_call_t *call, fy_msgr_t *r)
{
    fy_wire_poll_t m;
    fy_wire_poll_init(&m);
    if (fy_wire_poll_read(r, NULL, &m)) {
        fy_rpc_reply_error(call, m.id, FY_ERR_FORMAT, r->err);
        return;
    }
    uint64_t id = m.id;
    int32_t from = m.from;
    double wait = m.wait_s;
    double t = fy_now_s();
    pthread_mutex_lock(&e->mu);
    if (id > e->n || !e->reqs[id - 1].live) {
        pthread_mutex_unlock(&e->mu);
        fy_rpc_reply_error(call, id, FY_ERR_NOT_FOUND, "echo: no such request");
        return;
    }
    ereq_t q = e->reqs[id - 1];
    int32_t have = due_tokens(e, &q, t);
    if (have > from || have == q.max_tokens || wait <= 0 || e->stopping) {
        if (have == q.max_tokens && from + 256 >= have) e->reqs[id - 1].live = false; /* its end goes out now */
        pthread_mutex_unlock(&e->mu);
        reply_events(call, id, &q, from, have, t);
        return;
    }
    parked_t *pk = fy_malloc(sizeof(*pk));
    if (!pk) {
        pthread_mutex_unlock(&e->mu);
        fy_rpc_reply_error(call, id, FY_ERR_NOMEM, "echo: out of memory");
        return;
    }
    double due = next_due(e, &q, from);
    *pk = (parked_t){call, id, from, due < t + wait ? due : t + wait, t + wait, e->parked};
    e->parked = pk;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

static void *timer_main(void *arg)
{
    fy_bench_echo_t *e = arg;
    pthread_mutex_lock(&e->mu);
    while (!e->stopping || e->parked) {
        double t = fy_now_s(), soonest = t + 1.0;
        parked_t **pp = &e->parked, *ready = NULL;
        while (*pp) {
            parked_t *pk = *pp;
            if (pk->due <= t || e->stopping) {
                *pp = pk->next;
                pk->next = ready;
                ready = pk;
            } else {
                if (pk->due < soonest) soonest = pk->due;
                pp = &pk->next;
            }
        }
        while (ready) {
            parked_t *pk = ready;
            ready = pk->next;
            ereq_t q = e->reqs[pk->id - 1];
            int32_t have = due_tokens(e, &q, t);
            if (have == q.max_tokens && pk->from + 256 >= have) e->reqs[pk->id - 1].live = false;
            pthread_mutex_unlock(&e->mu);
            if (!q.live)
                fy_rpc_reply_error(pk->call, pk->id, FY_ERR_CANCELLED, "echo: cancelled");
            else
                reply_events(pk->call, pk->id, &q, pk->from, have, t);
            fy_free(pk);
            pthread_mutex_lock(&e->mu);
        }
        if (e->stopping) continue;
        struct timespec ts;
        ts.tv_sec = (time_t)soonest;
        ts.tv_nsec = (long)((soonest - (double)ts.tv_sec) * 1e9);
        pthread_cond_timedwait(&e->cv, &e->mu, &ts);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

static void on_nng(void *arg, fy_rpc_call_t *call, const fy_env_hdr_t *from, const void *msg, size_t len)
{
    fy_bench_echo_t *e = arg;
    fy_msgr_t r;
    if (fy_msgr_parse(&r, msg, len)) {
        fy_rpc_reply_error(call, 0, FY_ERR_FORMAT, r.err);
        fy_msgr_free(&r);
        return;
    }
    fy_msgw_t w;
    if (fy_wire_generate_is(&r))
        on_generate(e, call, &r);
    else if (fy_wire_poll_is(&r))
        on_poll(e, call, &r);
    else if (fy_wire_cancel_is(&r)) {
        fy_wire_cancel_t m;
        fy_wire_cancel_init(&m);
        bool ok = fy_wire_cancel_read(&r, NULL, &m) == FY_OK;
        pthread_mutex_lock(&e->mu);
        if (ok && m.id <= e->n) e->reqs[m.id - 1].live = false;
        pthread_mutex_unlock(&e->mu);
        fy_wire_cancelled_t c = {.id = m.id};
        fy_wire_cancelled_write(&w, &c);
        fy_rpc_reply_msgw(call, &w);
    } else if (fy_wire_status_is(&r)) {
        fy_wire_status_reply_t *m = fy_calloc(1, sizeof(*m)); /* 6 KiB: not on an nng thread's stack */
        if (!m) {
            fy_rpc_reply_error(call, 0, FY_ERR_NOMEM, "echo: out of memory");
        } else {
            snprintf(m->model, sizeof(m->model), "echo");
            m->completed = atomic_load(&e->served);
            m->refused = atomic_load(&e->refused);
            fy_wire_status_reply_write(&w, m);
            fy_rpc_reply_msgw(call, &w);
            fy_free(m);
        }
    } else {
        fy_rpc_reply_error(call, 0, FY_ERR_UNSUPPORTED, "echo: unknown message type");
    }
    fy_msgr_free(&r);
}

/* ---- HTTP -------------------------------------------------------------------------------------- */

typedef struct hconn {
    char *body;
    size_t len, cap;
    bool too_big;
} hconn_t;

typedef struct hstream {
    fy_bench_echo_t *e;
    bool chat, usage;
    int32_t n_prompt, max_tokens, sent;
    int phase; /* 0: tokens, 1: usage, 2: [DONE], 3: end */
    double t0;
    uint64_t id;
} hstream_t;

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    hstream_t *s = cls;
    fy_bench_echo_t *e = s->e;
    size_t o = 0;
    const char *obj = s->chat ? "chat.completion.chunk" : "text_completion";
    for (;;) {
        char ev[512];
        int n = 0;
        if (s->phase == 0) {
            ereq_t q = {.max_tokens = s->max_tokens, .t0 = s->t0};
            int32_t have = due_tokens(e, &q, fy_now_s());
            if (have <= s->sent) {
                if (o) break; /* send what is written; come back for the rest */
                /* in slices, so a stopping server does not wait out a long delay */
                double d = next_due(e, &q, s->sent) - fy_now_s();
                if (d > 0.02) d = 0.02;
                if (d > 0) usleep((useconds_t)(d * 1e6) + 1);
                if (atomic_load(&e->http_stopping)) return MHD_CONTENT_READER_END_WITH_ERROR;
                continue;
            }
            const char *fin = s->sent + 1 == s->max_tokens ? "\"length\"" : "null";
            const char *word = fy_bench_word(s->sent);
            if (s->chat)
                n = snprintf(ev, sizeof(ev),
                             "data: {\"id\":\"chatcmpl-echo-%llu\",\"object\":\"%s\",\"created\":0,\"model\":\"echo\","
                             "\"choices\":[{\"index\":0,\"delta\":{\"content\":\" %s\"},\"finish_reason\":%s}]}\n\n",
                             (unsigned long long)s->id, obj, word, fin);
            else
                n = snprintf(ev, sizeof(ev),
                             "data: {\"id\":\"cmpl-echo-%llu\",\"object\":\"%s\",\"created\":0,\"model\":\"echo\","
                             "\"choices\":[{\"index\":0,\"text\":\" %s\",\"logprobs\":null,\"finish_reason\":%s}]}\n\n",
                             (unsigned long long)s->id, obj, word, fin);
            if ((size_t)n > max - o) break;
            s->sent++;
            if (s->sent == s->max_tokens) s->phase = s->usage ? 1 : 2;
        } else if (s->phase == 1) {
            n = snprintf(ev, sizeof(ev),
                         "data: {\"id\":\"cmpl-echo-%llu\",\"object\":\"%s\",\"created\":0,\"model\":\"echo\","
                         "\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,"
                         "\"total_tokens\":%d}}\n\n",
                         (unsigned long long)s->id, obj, s->n_prompt, s->max_tokens, s->n_prompt + s->max_tokens);
            if ((size_t)n > max - o) break;
            s->phase = 2;
        } else if (s->phase == 2) {
            n = snprintf(ev, sizeof(ev), "data: [DONE]\n\n");
            if ((size_t)n > max - o) break;
            s->phase = 3;
        } else {
            if (o) break;
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        memcpy(buf + o, ev, (size_t)n);
        o += (size_t)n;
    }
    return (ssize_t)o;
}

static void stream_free(void *cls) { fy_free(cls); }

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static enum MHD_Result send_json(struct MHD_Connection *c, unsigned code, const char *fmt, ...)
{
    char body[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(body, sizeof(body), fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    if ((size_t)n >= sizeof(body)) n = (int)sizeof(body) - 1;
    struct MHD_Response *r = MHD_create_response_from_buffer((size_t)n, body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "application/json");
    enum MHD_Result rc = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result send_error(struct MHD_Connection *c, unsigned code, const char *type, const char *msg)
{
    return send_json(c, code, "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"code\":%u}}", msg, type, code);
}

static enum MHD_Result on_http(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload, size_t *upload_size, void **state)
{
    fy_bench_echo_t *e = cls;
    hconn_t *h = *state;
    if (!h) {
        if (!(h = fy_calloc(1, sizeof(*h)))) return MHD_NO;
        *state = h;
        return MHD_YES;
    }
    if (*upload_size) {
        if (h->len + *upload_size > (16u << 20))
            h->too_big = true;
        else {
            size_t need = h->len + *upload_size + 1;
            if (need > h->cap) {
                size_t nc = need * 2;
                char *nb = fy_realloc(h->body, nc);
                if (!nb) return MHD_NO;
                h->body = nb;
                h->cap = nc;
            }
            memcpy(h->body + h->len, upload, *upload_size);
            h->len += *upload_size;
            h->body[h->len] = 0;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (!strcmp(url, "/v1/models") && !strcmp(method, "GET"))
        return send_json(c, 200, "{\"object\":\"list\",\"data\":[{\"id\":\"echo\",\"object\":\"model\"}]}");
    bool chat = !strcmp(url, "/v1/chat/completions");
    if (!chat && strcmp(url, "/v1/completions")) return send_error(c, 404, "not_found", "no such path");
    if (strcmp(method, "POST")) return send_error(c, 405, "invalid_request_error", "POST only");
    if (e->api_key) {
        const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
        if (!auth || strncmp(auth, "Bearer ", 7) || strcmp(auth + 7, e->api_key))
            return send_error(c, 401, "authentication_error", "bad or missing API key");
    }
    if (h->too_big) return send_error(c, 413, "invalid_request_error", "body too large");
    json_error_t je;
    json_t *o = h->body ? json_loadb(h->body, h->len, 0, &je) : NULL;
    const char *model = json_string_value(json_object_get(o, "model"));
    if (json_is_object(o) && (!model || strcmp(model, "echo"))) {
        json_decref(o);
        return send_error(c, 404, "not_found_error", "this server serves the model 'echo'");
    }
    if (!json_is_object(o)) {
        json_decref(o);
        return send_error(c, 400, "invalid_request_error", "the body is not a JSON object");
    }
    json_t *mt = json_object_get(o, "max_tokens");
    int32_t max_tokens = json_is_integer(mt) ? (int32_t)json_integer_value(mt) : 16;
    bool stream = json_is_true(json_object_get(o, "stream"));
    bool usage = json_is_true(json_object_get(json_object_get(o, "stream_options"), "include_usage"));
    int32_t n_prompt = 0;
    if (chat) {
        size_t i;
        json_t *m;
        json_array_foreach(json_object_get(o, "messages"), i, m)
        {
            json_t *ct = json_object_get(m, "content");
            if (json_is_string(ct)) n_prompt += count_words(json_string_value(ct), json_string_length(ct));
        }
    } else {
        json_t *p = json_object_get(o, "prompt");
        if (json_is_string(p)) n_prompt = count_words(json_string_value(p), json_string_length(p));
    }
    json_decref(o);
    if (max_tokens < 1 || max_tokens > (1 << 20))
        return send_error(c, 400, "invalid_request_error", "max_tokens must be from 1 to 1048576");
    if (refuse_now(e)) return send_error(c, 429, "overloaded", "echo: refused on purpose (fail_every)");
    uint64_t id = atomic_load(&e->count);
    if (!stream) {
        char text[8192];
        size_t tl = 0;
        for (int32_t k = 0; k < max_tokens && tl + 16 < sizeof(text); k++)
            tl += (size_t)snprintf(text + tl, sizeof(text) - tl, " %s", fy_bench_word(k));
        if (chat)
            return send_json(
                c, 200,
                "{\"id\":\"chatcmpl-echo-%llu\",\"object\":\"chat.completion\",\"created\":0,\"model\":"
                "\"echo\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"%s\"},"
                "\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,"
                "\"total_tokens\":%d}}",
                (unsigned long long)id, text, n_prompt, max_tokens, n_prompt + max_tokens);
        return send_json(c, 200,
                         "{\"id\":\"cmpl-echo-%llu\",\"object\":\"text_completion\",\"created\":0,\"model\":\"echo\","
                         "\"choices\":[{\"index\":0,\"text\":\"%s\",\"finish_reason\":\"length\"}],\"usage\":{"
                         "\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}}",
                         (unsigned long long)id, text, n_prompt, max_tokens, n_prompt + max_tokens);
    }
    hstream_t *s = fy_calloc(1, sizeof(*s));
    if (!s) return MHD_NO;
    *s = (hstream_t){.e = e,
                     .chat = chat,
                     .usage = usage,
                     .n_prompt = n_prompt,
                     .max_tokens = max_tokens,
                     .t0 = fy_now_s(),
                     .id = id};
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, s, stream_free);
    if (!r) {
        fy_free(s);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result rc = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return rc;
}

static void on_http_done(void *cls, struct MHD_Connection *c, void **state, enum MHD_RequestTerminationCode why)
{
    hconn_t *h = *state;
    if (!h) return;
    fy_free(h->body);
    fy_free(h);
    *state = NULL;
}

/* ---- life ---------------------------------------------------------------------------------------- */

fy_status_t fy_bench_echo_create(const fy_bench_echo_params_t *p, fy_bench_echo_t **e_p)
{
    fy_bench_echo_t *e = fy_calloc(1, sizeof(*e));
    if (!e) return FY_ERR_NOMEM;
    e->p = *p;
    e->p.nng_url = NULL; /* not kept */
    if (p->api_key && !(e->api_key = fy_strdup(p->api_key))) {
        fy_free(e);
        return FY_ERR_NOMEM;
    }
    pthread_mutex_init(&e->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&e->cv, &ca);
    pthread_condattr_destroy(&ca);
    fy_status_t st = FY_OK;
    if (p->nng_url) {
        if (pthread_create(&e->timer, NULL, timer_main, e)) {
            fy_error("echo: cannot start the timer thread");
            st = FY_ERR_IO;
        } else {
            e->have_timer = true;
            /* answers as a router would: clients check their replies come from one */
            fy_env_auth_t auth;
            st = p->secret_file ? fy_cluster_auth_file(p->secret_file, FY_ROLE_ROUTER, "echo", 0, &auth)
                                : FY_ERR_INVALID;
            if (!p->secret_file) fy_error("echo: the nng side needs the deployment's secret (--secret FILE)");
            if (!st)
                st = fy_rpc_server_create(p->nng_url, 1024, &auth, FY_RPC_FROM(FY_ROLE_CLIENT), on_nng, e, &e->srv);
            fy_env_auth_wipe(&auth);
        }
    }
    if (!st && p->http) {
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)p->http_port)};
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        bool paced = p->ttft_s > 0 || p->itl_s > 0;
        unsigned flags =
            paced ? MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD : MHD_USE_AUTO_INTERNAL_THREAD;
        if (paced)
            e->mhd = MHD_start_daemon(flags, 0, NULL, NULL, on_http, e, MHD_OPTION_SOCK_ADDR, &sa,
                                      MHD_OPTION_NOTIFY_COMPLETED, on_http_done, e, MHD_OPTION_CONNECTION_LIMIT,
                                      (unsigned)4096, MHD_OPTION_END);
        else
            e->mhd = MHD_start_daemon(flags, 0, NULL, NULL, on_http, e, MHD_OPTION_SOCK_ADDR, &sa,
                                      MHD_OPTION_NOTIFY_COMPLETED, on_http_done, e, MHD_OPTION_CONNECTION_LIMIT,
                                      (unsigned)4096, MHD_OPTION_THREAD_POOL_SIZE,
                                      (unsigned)(p->threads > 0 ? p->threads : 1), MHD_OPTION_END);
        if (!e->mhd) {
            fy_error("echo: cannot serve HTTP on 127.0.0.1:%d: %m", p->http_port);
            st = FY_ERR_IO;
        } else {
            const union MHD_DaemonInfo *di = MHD_get_daemon_info(e->mhd, MHD_DAEMON_INFO_BIND_PORT);
            e->port = di ? di->port : p->http_port;
        }
    }
    if (st) {
        fy_bench_echo_destroy(e);
        return st;
    }
    *e_p = e;
    return FY_OK;
}

void fy_bench_echo_destroy(fy_bench_echo_t *e)
{
    if (!e) return;
    atomic_store(&e->http_stopping, true);
    if (e->mhd) MHD_stop_daemon(e->mhd);
    if (e->have_timer) {
        /* parked polls are answered (cancelled) before the server goes */
        pthread_mutex_lock(&e->mu);
        e->stopping = true;
        pthread_cond_signal(&e->cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->timer, NULL);
    }
    fy_rpc_server_destroy(e->srv);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    fy_free(e->reqs);
    fy_free(e->api_key);
    fy_free(e);
}

int fy_bench_echo_http_port(const fy_bench_echo_t *e) { return e->port; }
uint64_t fy_bench_echo_served(const fy_bench_echo_t *e) { return atomic_load(&((fy_bench_echo_t *)e)->served); }
uint64_t fy_bench_echo_refused(const fy_bench_echo_t *e) { return atomic_load(&((fy_bench_echo_t *)e)->refused); }

/*
 * client.c - a blocking client of the router's nng protocol (client.h).
 * Its requests travel in envelopes sealed with the deployment's secret,
 * as a client role named after the program; the router answers only the
 * client that made a request about it.
 */
#include "router/client.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/cluster.h"
#include "common/log.h"
#include "common/mem.h"
#include "common/msg.h"
#include "rpc/rpc.h"
#include "common/wire.h"

struct fy_client {
    fy_rpc_client_t *rpc;
    double timeout_s;
    int32_t *tokens; /* the last poll's, as its reply held them */
    int32_t n_tokens;
    char *text;
    size_t cap_text;
};

fy_status_t fy_client_create(const char *url, const char *secret_file, double timeout_s, fy_client_t **c_p)
{
    /* the sender's name: the program, in the router's log lines */
    char name[FY_ENV_NAME_MAX + 1];
    const char *prog = program_invocation_short_name;
    size_t k = 0;
    for (; prog && prog[k] && k < FY_ENV_NAME_MAX; k++)
        name[k] = (unsigned char)prog[k] > 0x20 && (unsigned char)prog[k] < 0x7f ? prog[k] : '_';
    name[k] = 0;
    if (!k) snprintf(name, sizeof(name), "client");
    fy_env_auth_t auth;
    fy_status_t st = fy_cluster_auth_file(secret_file, FY_ROLE_CLIENT, name, 0, &auth);
    if (st) return st;
    fy_client_t *c = fy_calloc(1, sizeof(*c));
    if (!c) {
        fy_env_auth_wipe(&auth);
        return FY_ERR_NOMEM;
    }
    st = fy_rpc_client_create(url, &auth, &c->rpc);
    fy_env_auth_wipe(&auth);
    if (st) {
        fy_free(c);
        return st;
    }
    c->timeout_s = timeout_s;
    *c_p = c;
    return FY_OK;
}

void fy_client_destroy(fy_client_t *c)
{
    if (!c) return;
    fy_rpc_client_destroy(c->rpc);
    fy_free(c->tokens);
    fy_free(c->text);
    fy_free(c);
}

/* Sends w, parses the reply into r; an "error" reply becomes its status. */
static fy_status_t call(fy_client_t *c, fy_msgw_t *w, double timeout_s, fy_msgr_t *r, char *err, size_t cap,
                        void **buf_p)
{
    void *buf, *rep = NULL;
    size_t len, rlen;
    fy_status_t st = fy_msgw_finish(w, &buf, &len);
    if (st) return st;
    st = fy_rpc_call(c->rpc, buf, len, timeout_s, &rep, &rlen);
    fy_free(buf);
    if (st) {
        if (err && st == FY_ERR_MISMATCH)
            snprintf(err, cap,
                     "the router refused the request as unauthenticated (another kv.secret_file, or a "
                     "clock far off)");
        else if (err)
            snprintf(err, cap, "the router did not answer: %s", fy_status_str(st));
        return st;
    }
    st = fy_msgr_parse(r, rep, rlen);
    if (st) {
        if (err) snprintf(err, cap, "bad reply from the router: %s", r->err);
        fy_msgr_free(r);
        fy_free(rep);
        return st;
    }
    if (fy_wire_error_is(r)) {
        /* what could be read of it: a bad code is "internal", a bad message empty */
        fy_wire_error_t e;
        fy_wire_error_init(&e);
        fy_wire_error_read(r, NULL, &e);
        if (err) snprintf(err, cap, "%s", e.message);
        fy_msgr_free(r);
        fy_free(rep);
        return fy_msg_error_code(e.code[0] ? e.code : "internal");
    }
    *buf_p = rep;
    return FY_OK;
}

fy_status_t fy_client_generate(fy_client_t *c, const fy_client_req_t *req, fy_client_stream_t *s, char *err,
                               size_t err_cap)
{
    static int32_t none[1]; /* no prompt and no tokens: an empty array, which the router refuses */
    fy_wire_generate_t m;
    fy_wire_generate_init(&m);
    if (req->prompt) {
        m.prompt = req->prompt;
        m.prompt_len = strlen(req->prompt);
    } else {
        m.has_tokens = true;
        m.tokens = req->tokens ? (int32_t *)req->tokens : none; /* written, not kept */
        m.n_tokens = req->tokens ? req->n_tokens : 0;
    }
    m.chat = req->chat;
    if (req->system) m.system = req->system, m.system_len = strlen(req->system);
    m.deadline_s = req->deadline_s > 0 ? req->deadline_s : 0;
    m.gen = req->gen;
    fy_msgw_t w;
    fy_wire_generate_write(&w, &m);
    fy_msgr_t r;
    void *rep;
    fy_status_t st = call(c, &w, c->timeout_s, &r, err, err_cap, &rep);
    if (st) return st;
    fy_wire_accepted_t a;
    fy_wire_accepted_init(&a);
    st = fy_wire_accepted_read(&r, NULL, &a);
    if (st && err) snprintf(err, err_cap, "bad reply from the router: %s", r.err);
    fy_msgr_free(&r);
    fy_free(rep);
    if (st) return FY_ERR_FORMAT;
    *s = (fy_client_stream_t){.id = a.id, .n_prompt = a.n_prompt};
    return FY_OK;
}

fy_status_t fy_client_poll(fy_client_t *c, fy_client_stream_t *s, double wait_s, fy_client_update_t *u)
{
    memset(u, 0, sizeof(*u));
    fy_wire_poll_t p = {.id = s->id, .from = s->from, .from_text = (int64_t)s->from_text, .wait_s = wait_s};
    fy_msgw_t w;
    fy_wire_poll_write(&w, &p);
    fy_msgr_t r;
    void *rep;
    fy_status_t st = call(c, &w, wait_s + c->timeout_s, &r, u->message, sizeof(u->message), &rep);
    if (st) return st;
    fy_wire_events_t *m = fy_malloc(sizeof(*m)); /* 700 bytes: not on the caller's stack */
    if (!m)
        st = FY_ERR_NOMEM;
    else
        fy_wire_events_init(m);
    if (!st && fy_wire_events_read(&r, NULL, m)) {
        st = FY_ERR_FORMAT;
        snprintf(u->message, sizeof(u->message), "bad reply from the router: %.200s", r.err);
    }
    size_t tl = st ? 0 : m->text_len;
    if (!st && tl + 1 > c->cap_text) {
        char *t = fy_realloc(c->text, tl + 1);
        if (!t)
            st = FY_ERR_NOMEM;
        else
            c->text = t, c->cap_text = tl + 1;
    }
    if (!st) {
        if (tl) memcpy(c->text, m->text, tl);
        c->text[tl] = 0;
        /* the client keeps the tokens until the next poll */
        fy_free(c->tokens);
        c->tokens = m->tokens;
        c->n_tokens = m->n_tokens;
        m->tokens = NULL;
        u->done = m->done;
        u->n_prompt = m->n_prompt;
        snprintf(u->state, sizeof(u->state), "%s", m->state);
        if (u->done) {
            u->error = m->error_code[0] && strcmp(m->error_code, "ok") ? fy_msg_error_code(m->error_code) : FY_OK;
            snprintf(u->message, sizeof(u->message), "%s", m->error);
            snprintf(u->finish, sizeof(u->finish), "%s", m->finish_reason);
            const fy_wire_req_timings_t *x = &m->timings;
            u->timings = (fy_client_timings_t){
                .queue_s = x->queue_s,
                .reserve_s = x->reserve_s,
                .prefill_queue_s = x->prefill_queue_s,
                .prefill_compute_s = x->prefill_compute_s,
                .transfer_s = x->transfer_s,
                .transfer_tail_s = x->transfer_tail_s,
                .prefill_total_s = x->prefill_total_s,
                .first_token_s = x->first_token_s,
                .ttft_s = x->ttft_s,
                .e2e_s = x->e2e_s,
                .transfer_bytes = x->transfer_bytes,
                .cached_prefill = x->cached_prefill,
                .cached_decode = x->cached_decode,
                .retries = x->retries,
            };
        }
    }
    int32_t n = st ? 0 : c->n_tokens;
    if (m) fy_wire_events_clear(m);
    fy_free(m);
    fy_msgr_free(&r);
    fy_free(rep);
    if (st) return st;
    u->tokens = c->tokens;
    u->n_tokens = n;
    u->text = c->text ? c->text : "";
    u->text_len = tl;
    s->from += n;
    s->from_text += tl;
    return FY_OK;
}

fy_status_t fy_client_cancel(fy_client_t *c, uint64_t id)
{
    fy_wire_cancel_t m = {.id = id};
    fy_msgw_t w;
    fy_wire_cancel_write(&w, &m);
    fy_msgr_t r;
    void *rep;
    fy_status_t st = call(c, &w, c->timeout_s, &r, NULL, 0, &rep);
    if (st) return st;
    fy_msgr_free(&r);
    fy_free(rep);
    return FY_OK;
}

fy_status_t fy_client_status(fy_client_t *c, fy_client_status_t *s)
{
    memset(s, 0, sizeof(*s));
    fy_wire_status_t q = {0};
    fy_msgw_t w;
    fy_wire_status_write(&w, &q);
    fy_msgr_t r;
    void *rep;
    fy_status_t st = call(c, &w, c->timeout_s, &r, NULL, 0, &rep);
    if (st) return st;
    fy_wire_status_reply_t *m = fy_malloc(sizeof(*m)); /* 6 KiB */
    if (!m) {
        fy_msgr_free(&r);
        fy_free(rep);
        return FY_ERR_NOMEM;
    }
    fy_wire_status_reply_init(m);
    st = fy_wire_status_reply_read(&r, NULL, m) ? FY_ERR_FORMAT : FY_OK;
    fy_msgr_free(&r);
    fy_free(rep);
    if (!st) {
        s->prefill_up = m->prefill_up;
        s->decode_up = m->decode_up;
        s->requests = m->requests;
        s->queued = m->queued;
        s->completed = m->completed;
        s->failed = m->failed;
        s->refused = m->refused;
        s->retried = m->retried;
        s->bad_events = m->bad_events;
        snprintf(s->model, sizeof(s->model), "%s", m->model);
        snprintf(s->served_model, sizeof(s->served_model), "%s", m->served_model);
        const fy_wire_refused_t *f = &m->refused_messages;
        s->refused_messages[FY_ENV_FORMAT] = f->format;
        s->refused_messages[FY_ENV_MAC] = f->mac;
        s->refused_messages[FY_ENV_STALE] = f->stale;
        s->refused_messages[FY_ENV_REPLAY] = f->replay;
        s->refused_messages[FY_ENV_IDENTITY] = f->identity;
        s->refused_messages[FY_ENV_CLEAR] = f->clear;
        s->n_workers = m->n_workers;
        for (int32_t i = 0; i < m->n_workers; i++) {
            fy_client_worker_t *wk = &s->workers[i];
            snprintf(wk->name, sizeof(wk->name), "%s", m->workers[i]);
            /* each array as long as it is (a shorter one leaves zeros) */
            if (i < m->n_up) wk->up = m->up[i] != 0;
            if (i < m->n_decode) wk->decode = m->decode[i] != 0;
            if (i < m->n_assigned) wk->assigned = m->assigned[i];
            if (i < m->n_admittable) wk->admittable = m->admittable[i];
            if (i < m->n_total_blocks) wk->total_blocks = m->total_blocks[i];
            if (i < m->n_pending_tokens) wk->pending_tokens = m->pending_tokens[i];
            wk->ranks = i < m->n_ranks && m->ranks[i] > 0 ? m->ranks[i] : 1;
            if (i < m->n_out) wk->out_of_service = m->out[i] != 0;
        }
    }
    fy_free(m);
    return st;
}

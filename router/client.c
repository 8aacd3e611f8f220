/*
 * client.c - a blocking client of the router's nng protocol (client.h).
 * Its requests travel in envelopes sealed with the deployment's secret,
 * as a client role named after the program; the router answers only the
 * client that made a request about it.
 */
#include "client.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cluster.h"
#include "log.h"
#include "mem.h"
#include "msg.h"
#include "rpc.h"

struct fy_client {
    fy_rpc_client_t *rpc;
    double timeout_s;
    int32_t *tokens;
    int32_t cap_tokens;
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
            snprintf(err, cap, "the router refused the request as unauthenticated (another kv.secret_file, or a "
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
    if (!strcmp(fy_msgr_type(r), "error")) {
        char code[32], msg[256];
        fy_msgr_str(r, "code", FY_OPT, "internal", code, sizeof(code));
        fy_msgr_str(r, "message", FY_OPT, "", msg, sizeof(msg));
        if (err) snprintf(err, cap, "%s", msg);
        fy_msgr_free(r);
        fy_free(rep);
        return fy_msg_error_code(code);
    }
    *buf_p = rep;
    return FY_OK;
}

fy_status_t fy_client_generate(fy_client_t *c, const fy_client_req_t *req, fy_client_stream_t *s, char *err,
                               size_t err_cap)
{
    fy_msgw_t w;
    fy_msgw_init(&w, "generate");
    if (req->prompt)
        fy_msgw_str(&w, "prompt", req->prompt);
    else
        fy_msgw_i32s(&w, "tokens", req->tokens, req->n_tokens);
    if (req->chat) fy_msgw_bool(&w, "chat", true);
    if (req->system) fy_msgw_str(&w, "system", req->system);
    if (req->deadline_s > 0) fy_msgw_f64(&w, "deadline_s", req->deadline_s);
    fy_genspec_write(&w, &req->gen);
    fy_msgr_t r;
    void *rep;
    fy_status_t st = call(c, &w, c->timeout_s, &r, err, err_cap, &rep);
    if (st) return st;
    uint64_t id = fy_msgr_u64(&r, "id", FY_REQ, 0, 1, UINT64_MAX);
    int32_t n = (int32_t)fy_msgr_i64(&r, "n_prompt", FY_OPT, 0, 0, INT32_MAX);
    st = fy_msgr_ok(&r) ? FY_OK : FY_ERR_FORMAT;
    if (st && err) snprintf(err, err_cap, "bad reply from the router: %s", r.err);
    fy_msgr_free(&r);
    fy_free(rep);
    if (st) return st;
    *s = (fy_client_stream_t){.id = id, .n_prompt = n};
    return FY_OK;
}

fy_status_t fy_client_poll(fy_client_t *c, fy_client_stream_t *s, double wait_s, fy_client_update_t *u)
{
    memset(u, 0, sizeof(*u));
    fy_msgw_t w;
    fy_msgw_init(&w, "poll");
    fy_msgw_u64(&w, "id", s->id);
    fy_msgw_i64(&w, "from", s->from);
    fy_msgw_i64(&w, "from_text", (int64_t)s->from_text);
    fy_msgw_f64(&w, "wait_s", wait_s);
    fy_msgr_t r;
    void *rep;
    fy_status_t st = call(c, &w, wait_s + c->timeout_s, &r, u->message, sizeof(u->message), &rep);
    if (st) return st;
    int32_t n = 0;
    size_t tl = 0;
    if (fy_msgr_has(&r, "tokens")) {
        /* at most what the message can hold: grow to its size first */
        int32_t need = 1 << 17;
        if (c->cap_tokens < need) {
            int32_t *t = fy_realloc(c->tokens, (size_t)need * sizeof(int32_t));
            if (!t) st = FY_ERR_NOMEM;
            else c->tokens = t, c->cap_tokens = need;
        }
        if (!st) n = fy_msgr_i32s(&r, "tokens", FY_REQ, c->tokens, c->cap_tokens, 0, INT32_MAX);
    }
    const char *text = fy_msgr_bytes(&r, "text", FY_OPT, 64 << 20, &tl);
    if (!st && tl + 1 > c->cap_text) {
        char *t = fy_realloc(c->text, tl + 1);
        if (!t) st = FY_ERR_NOMEM;
        else c->text = t, c->cap_text = tl + 1;
    }
    if (!st && tl) memcpy(c->text, text, tl);
    if (c->text) c->text[tl] = 0;
    u->done = fy_msgr_bool(&r, "done", FY_REQ, false);
    u->n_prompt = (int32_t)fy_msgr_i64(&r, "n_prompt", FY_OPT, 0, 0, INT32_MAX);
    fy_msgr_str(&r, "state", FY_OPT, "", u->state, sizeof(u->state));
    if (u->done) {
        char code[32];
        fy_msgr_str(&r, "error_code", FY_OPT, "ok", code, sizeof(code));
        u->error = strcmp(code, "ok") ? fy_msg_error_code(code) : FY_OK;
        fy_msgr_str(&r, "error", FY_OPT, "", u->message, sizeof(u->message));
        fy_msgr_str(&r, "finish_reason", FY_OPT, "", u->finish, sizeof(u->finish));
        if (fy_msgr_enter(&r, "timings", FY_OPT)) {
            fy_client_timings_t *t = &u->timings;
            t->queue_s = fy_msgr_f64(&r, "queue_s", FY_OPT, 0, -1, 1e9);
            t->reserve_s = fy_msgr_f64(&r, "reserve_s", FY_OPT, 0, -1, 1e9);
            t->prefill_queue_s = fy_msgr_f64(&r, "prefill_queue_s", FY_OPT, 0, -1, 1e9);
            t->prefill_compute_s = fy_msgr_f64(&r, "prefill_compute_s", FY_OPT, 0, -1, 1e9);
            t->transfer_s = fy_msgr_f64(&r, "transfer_s", FY_OPT, 0, -1, 1e9);
            t->transfer_tail_s = fy_msgr_f64(&r, "transfer_tail_s", FY_OPT, 0, -1, 1e9);
            t->prefill_total_s = fy_msgr_f64(&r, "prefill_total_s", FY_OPT, 0, -1, 1e9);
            t->first_token_s = fy_msgr_f64(&r, "first_token_s", FY_OPT, 0, -1, 1e9);
            t->ttft_s = fy_msgr_f64(&r, "ttft_s", FY_OPT, 0, -1, 1e9);
            t->e2e_s = fy_msgr_f64(&r, "e2e_s", FY_OPT, 0, -1, 1e9);
            t->transfer_bytes = fy_msgr_i64(&r, "transfer_bytes", FY_OPT, 0, 0, INT64_MAX);
            t->cached_prefill = (int32_t)fy_msgr_i64(&r, "cached_prefill", FY_OPT, 0, 0, INT32_MAX);
            t->cached_decode = (int32_t)fy_msgr_i64(&r, "cached_decode", FY_OPT, 0, 0, INT32_MAX);
            t->retries = (int32_t)fy_msgr_i64(&r, "retries", FY_OPT, 0, 0, INT32_MAX);
            fy_msgr_leave(&r);
        }
    }
    if (!st && !fy_msgr_ok(&r)) {
        st = FY_ERR_FORMAT;
        snprintf(u->message, sizeof(u->message), "bad reply from the router: %.200s", r.err);
    }
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
    fy_msgw_t w;
    fy_msgw_init(&w, "cancel");
    fy_msgw_u64(&w, "id", id);
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
    fy_msgw_t w;
    fy_msgw_init(&w, "status");
    fy_msgr_t r;
    void *rep;
    fy_status_t st = call(c, &w, c->timeout_s, &r, NULL, 0, &rep);
    if (st) return st;
    s->prefill_up = (int32_t)fy_msgr_i64(&r, "prefill_up", FY_OPT, 0, 0, INT32_MAX);
    s->decode_up = (int32_t)fy_msgr_i64(&r, "decode_up", FY_OPT, 0, 0, INT32_MAX);
    s->requests = (int32_t)fy_msgr_i64(&r, "requests", FY_OPT, 0, 0, INT32_MAX);
    s->queued = (int32_t)fy_msgr_i64(&r, "queued", FY_OPT, 0, 0, INT32_MAX);
    s->completed = fy_msgr_u64(&r, "completed", FY_OPT, 0, 0, UINT64_MAX);
    s->failed = fy_msgr_u64(&r, "failed", FY_OPT, 0, 0, UINT64_MAX);
    s->refused = fy_msgr_u64(&r, "refused", FY_OPT, 0, 0, UINT64_MAX);
    s->retried = fy_msgr_u64(&r, "retried", FY_OPT, 0, 0, UINT64_MAX);
    s->bad_events = fy_msgr_u64(&r, "bad_events", FY_OPT, 0, 0, UINT64_MAX);
    fy_msgr_str(&r, "model", FY_OPT, "", s->model, sizeof(s->model));
    if (fy_msgr_enter(&r, "refused_messages", FY_OPT)) {
        for (int i = 1; i < FY_ENV_N_FAULTS; i++)
            s->refused_messages[i] = fy_msgr_u64(&r, fy_env_fault_str((fy_env_fault_t)i), FY_OPT, 0, 0, UINT64_MAX);
        fy_msgr_leave(&r);
    }
    const char *names[FY_CLIENT_MAX_WORKERS];
    size_t lens[FY_CLIENT_MAX_WORKERS];
    int32_t v[FY_CLIENT_MAX_WORKERS];
    int32_t n = fy_msgr_strs(&r, "workers", FY_OPT, names, lens, FY_CLIENT_MAX_WORKERS, 63);
    for (int32_t i = 0; i < n; i++) snprintf(s->workers[i].name, sizeof(s->workers[i].name), "%.*s", (int)lens[i], names[i]);
    s->n_workers = n;
    static const char *const keys[] = {"up", "decode", "assigned", "admittable", "total_blocks", "pending_tokens"};
    for (int k = 0; k < 6; k++) {
        int32_t m = fy_msgr_i32s(&r, keys[k], FY_OPT, v, FY_CLIENT_MAX_WORKERS, INT32_MIN, INT32_MAX);
        for (int32_t i = 0; i < m && i < n; i++) {
            fy_client_worker_t *wk = &s->workers[i];
            switch (k) {
            case 0: wk->up = v[i] != 0; break;
            case 1: wk->decode = v[i] != 0; break;
            case 2: wk->assigned = v[i]; break;
            case 3: wk->admittable = v[i]; break;
            case 4: wk->total_blocks = v[i]; break;
            case 5: wk->pending_tokens = v[i]; break;
            }
        }
    }
    st = fy_msgr_ok(&r) ? FY_OK : FY_ERR_FORMAT;
    fy_msgr_free(&r);
    fy_free(rep);
    return st;
}

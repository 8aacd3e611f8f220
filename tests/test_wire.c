/*
 * test_wire.c - the control-plane message schemas (common/wire.c): every
 * message written and read back equal; the bytes the hand-written
 * writers put on the wire before the schemas, unchanged; every field
 * refused, by name, when it has the wrong type, is out of range, or is
 * required and missing; the rules across fields; presets, allocation
 * failures; and that docs/protocol.md and tests/fuzz/wire.dict name every
 * message and field (the protocol reference's tables are generated from
 * the schemas: `test_wire --write-reference docs/protocol.md` rewrites
 * them, and this test fails when they are stale).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "common/envelope.h"
#include "common/mem.h"
#include "rpc/rpc.h"
#include "tests/testutil.h"
#include "common/wire.h"
#include "tests/wire_examples.h"

#define PROTOCOL_MD "docs/protocol.md"
#define WIRE_DICT "tests/fuzz/wire.dict"
#define REF_BEGIN                                                                                                      \
    "<!-- wire-reference: generated from common/wire.c by `build/release/tests/test_wire --write-reference "           \
    "docs/protocol.md`; do not edit -->"
#define REF_END "<!-- end of wire-reference -->"

static const fy_wire_lim_t *LIM = &fy_test_wire_lim;

/* ---- helpers -------------------------------------------------------------------------------------- */

static void *write_msg(const fy_wire_schema_t *s, const void *m, size_t *len)
{
    fy_msgw_t w;
    fy_wire_write(s, &w, m);
    void *buf;
    assert_int_equal(fy_msgw_finish(&w, &buf, len), FY_OK);
    return buf;
}

/* Parses and reads buf as s into out (a struct of s's size); the status,
 * and err the reader's text.  r must be freed, and out cleared, after. */
static fy_status_t read_msg(const fy_wire_schema_t *s, const void *buf, size_t len, const fy_wire_lim_t *lim, void *out,
                            fy_msgr_t *r)
{
    fy_status_t st = fy_msgr_parse(r, buf, len);
    if (st) return st;
    fy_wire_init(s, out);
    return fy_wire_read(s, r, lim, out);
}

static void *example(const fy_wire_schema_t *s)
{
    void *m = fy_calloc(1, fy_wire_size(s));
    assert_non_null(m);
    fy_test_wire_example(s, m);
    return m;
}

/* ---- round trips ------------------------------------------------------------------------------------ */

static void test_round_trip(void **state)
{
    for (int32_t i = 0; i < fy_wire_n_all; i++) {
        const fy_wire_schema_t *s = fy_wire_all[i];
        void *a = example(s), *b = fy_calloc(1, fy_wire_size(s));
        size_t len;
        void *buf = write_msg(s, a, &len);
        fy_msgr_t r;
        fy_status_t st = read_msg(s, buf, len, LIM, b, &r);
        if (st) fail_msg("%s (%s): %s", fy_wire_name(s), fy_wire_route(s), r.err);
        assert_string_equal(fy_msgr_type(&r), fy_wire_type(s));
        assert_true(fy_wire_is(s, &r));
        char why[128];
        if (!fy_wire_equal(s, a, b, why, sizeof(why))) fail_msg("%s: %s", fy_wire_name(s), why);
        /* and once more: what was read writes the same bytes */
        size_t len2;
        void *buf2 = write_msg(s, b, &len2);
        assert_int_equal(len2, len);
        assert_memory_equal(buf2, buf, len);
        fy_free(buf2);
        fy_wire_clear(s, b);
        fy_msgr_free(&r);
        fy_free(buf);
        fy_free(a);
        fy_free(b);
    }
}

/* The generate message with a prompt instead of tokens; the token event
 * without a logprob; a load report of each role. */
static void test_round_trip_variants(void **state)
{
    fy_wire_generate_t g, g2;
    fy_test_wire_example(&fy_wire_generate_schema, &g);
    g.has_tokens = false;
    g.prompt = "Hello";
    g.prompt_len = 5;
    size_t len;
    void *buf = write_msg(&fy_wire_generate_schema, &g, &len);
    fy_msgr_t r;
    assert_int_equal(read_msg(&fy_wire_generate_schema, buf, len, LIM, &g2, &r), FY_OK);
    assert_true(fy_wire_equal(&fy_wire_generate_schema, &g, &g2, NULL, 0));
    assert_false(g2.has_tokens);
    assert_null(g2.tokens);
    assert_int_equal(g2.prompt_len, 5);
    assert_memory_equal(g2.prompt, "Hello", 5);
    fy_msgr_free(&r);
    fy_free(buf);

    fy_wire_token_t t, t2;
    fy_test_wire_example(&fy_wire_token_schema, &t);
    t.has_logprob = false;
    buf = write_msg(&fy_wire_token_schema, &t, &len);
    assert_int_equal(read_msg(&fy_wire_token_schema, buf, len, LIM, &t2, &r), FY_OK);
    assert_false(t2.has_logprob);
    assert_true(t2.logprob == 0);
    assert_true(fy_wire_equal(&fy_wire_token_schema, &t, &t2, NULL, 0));
    fy_wire_token_clear(&t2); /* its alternatives */
    fy_msgr_free(&r);
    fy_free(buf);

    fy_wire_load_t l, l2;
    for (int k = 0; k < 2; k++) {
        fy_test_wire_example(&fy_wire_load_schema, &l);
        l.has_decode = k == 0, l.has_prefill = k == 1;
        buf = write_msg(&fy_wire_load_schema, &l, &len);
        assert_int_equal(read_msg(&fy_wire_load_schema, buf, len, LIM, &l2, &r), FY_OK);
        assert_int_equal(l2.has_decode, k == 0);
        assert_int_equal(l2.has_prefill, k == 1);
        assert_true(fy_wire_equal(&fy_wire_load_schema, &l, &l2, NULL, 0));
        assert_int_equal(k == 0 ? l2.leases : l2.jobs, 2);
        fy_msgr_free(&r);
        fy_free(buf);
    }
}

/* ---- the bytes the hand-written writers sent ------------------------------------------------------------ */

/* router.c's cmd_begin and node.c's fy_node_msg, as they were */
static void old_cmd(fy_msgw_t *w, const char *type, const fy_wire_cmd_t *c, uint64_t id)
{
    fy_msgw_init(w, type);
    fy_msgw_u64(w, "to", c->to);
    if (c->rid) fy_msgw_u64(w, "rid", c->rid);
    fy_msgw_u64(w, "id", id);
}

static void old_ev(fy_msgw_t *w, const char *type, const fy_wire_ev_t *e)
{
    fy_msgw_init(w, type);
    fy_msgw_str(w, "worker", e->worker);
    fy_msgw_u64(w, "inc", e->inc);
    if (e->rid) fy_msgw_u64(w, "rid", e->rid);
    fy_msgw_u64(w, "id", e->id);
}

/* What the code before the schemas wrote for m; false when no writer of it
 * existed in that form. */
static bool old_write(const fy_wire_schema_t *s, const void *p, fy_msgw_t *w)
{
    if (s == &fy_wire_generate_schema) { /* router/client.c */
        const fy_wire_generate_t *m = p;
        fy_msgw_init(w, "generate");
        if (m->prompt)
            fy_msgw_strn(w, "prompt", m->prompt, m->prompt_len);
        else
            fy_msgw_i32s(w, "tokens", m->tokens, m->n_tokens);
        if (m->chat) fy_msgw_bool(w, "chat", true);
        if (m->system) fy_msgw_strn(w, "system", m->system, m->system_len);
        if (m->deadline_s > 0) fy_msgw_f64(w, "deadline_s", m->deadline_s);
        fy_genspec_write(w, &m->gen);
    } else if (s == &fy_wire_poll_schema) {
        const fy_wire_poll_t *m = p;
        fy_msgw_init(w, "poll");
        fy_msgw_u64(w, "id", m->id);
        fy_msgw_i64(w, "from", m->from);
        fy_msgw_i64(w, "from_text", m->from_text);
        fy_msgw_f64(w, "wait_s", m->wait_s);
    } else if (s == &fy_wire_cancel_schema || s == &fy_wire_cancelled_schema) {
        fy_msgw_init(w, fy_wire_type(s));
        fy_msgw_u64(w, "id", ((const fy_wire_cancel_t *)p)->id);
    } else if (s == &fy_wire_status_schema) {
        fy_msgw_init(w, "status");
    } else if (s == &fy_wire_accepted_schema) {
        const fy_wire_accepted_t *m = p;
        fy_msgw_init(w, "accepted");
        fy_msgw_u64(w, "id", m->id);
        fy_msgw_i64(w, "n_prompt", m->n_prompt);
    } else if (s == &fy_wire_events_schema) { /* router.c's reply_events */
        const fy_wire_events_t *m = p;
        const fy_wire_req_timings_t *t = &m->timings;
        fy_msgw_init(w, "events");
        fy_msgw_u64(w, "id", m->id);
        fy_msgw_i32s(w, "tokens", m->tokens, m->n_tokens);
        fy_msgw_strn(w, "text", m->text, m->text_len);
        fy_msgw_i64(w, "n_prompt", m->n_prompt);
        fy_msgw_str(w, "state", m->state);
        fy_msgw_bool(w, "done", m->done);
        if (!m->done) return true;
        if (m->error_code[0]) {
            fy_msgw_str(w, "error_code", m->error_code);
            fy_msgw_str(w, "error", m->error);
        } else {
            fy_msgw_str(w, "finish_reason", m->finish_reason);
        }
        fy_msgw_map_begin(w, "timings");
        fy_msgw_f64(w, "queue_s", t->queue_s);
        fy_msgw_f64(w, "reserve_s", t->reserve_s);
        fy_msgw_f64(w, "prefill_queue_s", t->prefill_queue_s);
        fy_msgw_f64(w, "prefill_compute_s", t->prefill_compute_s);
        fy_msgw_f64(w, "transfer_s", t->transfer_s);
        fy_msgw_f64(w, "transfer_tail_s", t->transfer_tail_s);
        fy_msgw_f64(w, "prefill_total_s", t->prefill_total_s);
        fy_msgw_i64(w, "transfer_bytes", t->transfer_bytes);
        fy_msgw_f64(w, "first_token_s", t->first_token_s);
        fy_msgw_f64(w, "ttft_s", t->ttft_s);
        fy_msgw_f64(w, "e2e_s", t->e2e_s);
        fy_msgw_i64(w, "cached_prefill", t->cached_prefill);
        fy_msgw_i64(w, "cached_decode", t->cached_decode);
        fy_msgw_i64(w, "retries", t->retries);
        fy_msgw_map_end(w);
    } else if (s == &fy_wire_status_reply_schema) { /* router.c's client_status */
        const fy_wire_status_reply_t *m = p;
        fy_msgw_init(w, "status");
        fy_msgw_str(w, "model", m->model);
        fy_msgw_str(w, "served_model", m->served_model); /* issue 35: the name in the API, beside the id */
        fy_msgw_i64(w, "requests", m->requests);
        fy_msgw_i64(w, "queued", m->queued);
        fy_msgw_u64(w, "completed", m->completed);
        fy_msgw_u64(w, "failed", m->failed);
        fy_msgw_u64(w, "refused", m->refused);
        fy_msgw_u64(w, "retried", m->retried);
        fy_msgw_u64(w, "bad_events", m->bad_events);
        fy_msgw_i64(w, "prefill_up", m->prefill_up);
        fy_msgw_i64(w, "decode_up", m->decode_up);
        const char *names[FY_WIRE_MAX_WORKERS];
        for (int32_t i = 0; i < m->n_workers; i++) names[i] = m->workers[i];
        fy_msgw_strs(w, "workers", names, m->n_workers);
        fy_msgw_i32s(w, "up", m->up, m->n_up);
        fy_msgw_i32s(w, "assigned", m->assigned, m->n_assigned);
        fy_msgw_i32s(w, "admittable", m->admittable, m->n_admittable);
        fy_msgw_i32s(w, "total_blocks", m->total_blocks, m->n_total_blocks);
        fy_msgw_i32s(w, "decode", m->decode, m->n_decode);
        fy_msgw_i32s(w, "pending_tokens", m->pending_tokens, m->n_pending_tokens);
        fy_msgw_i32s(w, "ranks", m->ranks, m->n_ranks); /* issue 21: each worker's rank group */
        fy_msgw_i32s(w, "out_of_service", m->out, m->n_out);
        fy_msgw_map_begin(w, "refused_messages");
        const uint64_t *f = &m->refused_messages.format;
        for (int i = 1; i < FY_ENV_N_FAULTS; i++) fy_msgw_u64(w, fy_env_fault_str((fy_env_fault_t)i), f[i - 1]);
        fy_msgw_map_end(w);
    } else if (s == &fy_wire_error_schema) { /* rpc/rpc.c's fy_msg_error */
        const fy_wire_error_t *m = p;
        fy_msgw_init(w, "error");
        fy_msgw_u64(w, "id", m->id);
        fy_msgw_str(w, "code", m->code);
        fy_msgw_str(w, "message", m->message);
    } else if (s == &fy_wire_reserve_schema || s == &fy_wire_cmd_generate_schema) { /* router.c's send_to_decode */
        const fy_wire_reserve_t *m = p;
        old_cmd(w, fy_wire_type(s), &m->cmd, m->id);
        fy_msgw_str(w, "tenant", m->tenant);
        fy_msgw_i32s(w, "tokens", m->tokens, m->n_tokens);
        fy_genspec_write(w, &m->gen);
        if (s == &fy_wire_reserve_schema) fy_msgw_f64(w, "lease_s", m->lease_s);
    } else if (s == &fy_wire_renew_schema) {
        const fy_wire_renew_t *m = p;
        old_cmd(w, "renew", &m->cmd, m->id);
        fy_msgw_u64(w, "lease", m->lease);
        fy_msgw_f64(w, "lease_s", m->lease_s);
    } else if (s == &fy_wire_adopt_schema) {
        const fy_wire_adopt_t *m = p;
        old_cmd(w, "adopt", &m->cmd, m->id);
        fy_msgw_u64(w, "lease", m->lease);
        fy_msgw_i64(w, "first_token", m->first_token);
        fy_msgw_f64(w, "logprob", m->logprob);
        fy_msgw_u64s(w, "rng", m->rng, 4);
        if (m->n_kept) fy_msgw_i32s(w, "kept", m->kept, m->n_kept);
        if (m->n_scores) fy_msgw_f32s(w, "scores", m->scores, m->n_scores);
    } else if (s == &fy_wire_release_schema || s == &fy_wire_cmd_cancel_schema) {
        const fy_wire_release_t *m = p;
        old_cmd(w, fy_wire_type(s), &m->cmd, m->id);
    } else if (s == &fy_wire_prefill_schema) {
        const fy_wire_prefill_t *m = p;
        old_cmd(w, "prefill", &m->cmd, m->id);
        fy_msgw_i64(w, "attempt", m->attempt);
        fy_msgw_str(w, "tenant", m->tenant);
        fy_msgw_i32s(w, "tokens", m->tokens, m->n_tokens);
        fy_genspec_write(w, &m->gen);
        fy_msgw_bin(w, "target", m->target, m->target_len);
        fy_msgw_i64(w, "first_block", m->first_block);
        fy_msgw_i32s(w, "blocks", m->blocks, m->n_blocks);
        fy_msgw_f64(w, "deadline_s", m->deadline_s);
        if (m->slots) fy_msgw_i64(w, "slots", m->slots);
    } else if (s == &fy_wire_extend_schema) {
        const fy_wire_extend_t *m = p;
        old_cmd(w, "extend", &m->cmd, m->id);
        fy_msgw_i64(w, "attempt", m->attempt);
        fy_msgw_f64(w, "deadline_s", m->deadline_s);
    } else if (s == &fy_wire_load_schema) { /* node.c's send_load and the roles' load callbacks */
        const fy_wire_load_t *m = p;
        old_ev(w, "load", &m->ev);
        fy_msgw_str(w, "role", m->role);
        fy_msgw_str(w, "listen", m->listen);
        fy_msgw_str(w, "model", m->model);
        fy_msgw_i64(w, "block_size", m->block_size);
        fy_msgw_i64(w, "running", m->running);
        fy_msgw_i64(w, "waiting", m->waiting);
        fy_msgw_i64(w, "swapped", m->swapped);
        fy_msgw_i64(w, "max_seqs", m->max_seqs);
        fy_msgw_i64(w, "total_blocks", m->total_blocks);
        fy_msgw_i64(w, "free_blocks", m->free_blocks);
        fy_msgw_i64(w, "cached_blocks", m->cached_blocks);
        fy_msgw_i64(w, "admittable", m->admittable);
        fy_msgw_i64(w, "capacity", m->capacity);
        fy_msgw_f64(w, "kv_usage", m->kv_usage);
        fy_msgw_u64(w, "prefix_queries", m->prefix_queries);
        fy_msgw_u64(w, "prefix_hits", m->prefix_hits);
        fy_msgw_u64(w, "preemptions", m->preemptions);
        fy_msgw_u64(w, "bad_commands", m->bad_commands);
        fy_msgw_bin(w, "bloom", m->bloom, m->bloom_len);
        if (m->has_decode) {
            fy_msgw_i64(w, "leases", m->leases);
            fy_msgw_i64(w, "leased_blocks", m->leased_blocks);
            fy_msgw_u64(w, "leases_expired", m->leases_expired);
            fy_msgw_u64(w, "leases_renewed", m->leases_renewed);
            fy_msgw_u64(w, "adopted", m->adopted);
            fy_msgw_u64(w, "reserve_refused", m->reserve_refused);
        }
        if (m->has_prefill) {
            fy_msgw_i64(w, "jobs", m->jobs);
            fy_msgw_u64(w, "jobs_done", m->jobs_done);
            fy_msgw_u64(w, "jobs_failed", m->jobs_failed);
            fy_msgw_i64(w, "bytes_shipped", m->bytes_shipped);
        }
        if (m->tp) fy_msgw_i64(w, "tp", m->tp); /* issue 21: a rank group's shape and state */
        if (m->pp) fy_msgw_i64(w, "pp", m->pp);
        if (m->out_of_service[0]) fy_msgw_str(w, "out_of_service", m->out_of_service);
        if (m->ctx) fy_msgw_i64(w, "ctx", m->ctx); /* issue 35: the context it holds */
    } else if (s == &fy_wire_alive_schema) {
        const fy_wire_alive_t *m = p;
        old_ev(w, "alive", &m->ev);
        fy_msgw_f64(w, "busy_s", m->busy_s);
    } else if (s == &fy_wire_progress_schema) {
        const fy_wire_progress_t *m = p;
        old_ev(w, "progress", &m->ev);
        fy_msgw_u64s(w, "ids", m->ids, m->n_ids);
        fy_msgw_i32s(w, "attempts", m->attempts, m->n_attempts);
        fy_msgw_i32s(w, "computed", m->computed, m->n_computed);
    } else if (s == &fy_wire_reserved_schema) {
        const fy_wire_reserved_t *m = p;
        old_ev(w, "reserved", &m->ev);
        fy_msgw_u64(w, "lease", m->lease);
        fy_msgw_f64(w, "lease_s", m->lease_s);
        fy_msgw_i64(w, "cached", m->cached);
        fy_msgw_i64(w, "first_block", m->first_block);
        fy_msgw_i32s(w, "blocks", m->blocks, m->n_blocks);
        fy_msgw_bin(w, "target", m->target, m->target_len);
        if (m->slots) fy_msgw_i64(w, "slots", m->slots);
    } else if (s == &fy_wire_renewed_schema) {
        const fy_wire_renewed_t *m = p;
        old_ev(w, "renewed", &m->ev);
        fy_msgw_u64(w, "lease", m->lease);
        fy_msgw_f64(w, "lease_s", m->lease_s);
    } else if (s == &fy_wire_adopted_schema || s == &fy_wire_ev_accepted_schema) {
        old_ev(w, fy_wire_type(s), &((const fy_wire_ack_t *)p)->ev);
    } else if (s == &fy_wire_prefilled_schema) {
        const fy_wire_prefilled_t *m = p;
        old_ev(w, "prefilled", &m->ev);
        fy_msgw_i64(w, "attempt", m->attempt);
        fy_msgw_i64(w, "first_token", m->first_token);
        fy_msgw_f64(w, "logprob", m->logprob);
        fy_msgw_u64s(w, "rng", m->rng, 4);
        fy_msgw_i64(w, "cached", m->cached);
        fy_msgw_map_begin(w, "timings");
        fy_msgw_f64(w, "queue_s", m->timings.queue_s);
        fy_msgw_f64(w, "compute_s", m->timings.compute_s);
        fy_msgw_f64(w, "transfer_tail_s", m->timings.transfer_tail_s);
        fy_msgw_f64(w, "transfer_s", m->timings.transfer_s);
        fy_msgw_i64(w, "bytes", m->timings.bytes);
        fy_msgw_map_end(w);
        if (m->n_kept) fy_msgw_i32s(w, "kept", m->kept, m->n_kept);
        if (m->n_scores) fy_msgw_f32s(w, "scores", m->scores, m->n_scores);
    } else if (s == &fy_wire_token_schema) {
        const fy_wire_token_t *m = p;
        old_ev(w, "token", &m->ev);
        fy_msgw_i64(w, "n", m->n);
        fy_msgw_i64(w, "token", m->token);
        fy_msgw_strn(w, "text", m->text, m->text_len);
        if (m->has_logprob) fy_msgw_f64(w, "logprob", m->logprob);
        if (m->n_top_ids) fy_msgw_i32s(w, "top_ids", m->top_ids, m->n_top_ids);
        if (m->n_top_logprobs) fy_msgw_f32s(w, "top_logprobs", m->top_logprobs, m->n_top_logprobs);
    } else if (s == &fy_wire_prompt_logprobs_schema) { /* node.c's fy_node_push_prompt_logprobs, by hand */
        const fy_wire_prompt_logprobs_t *m = p;
        old_ev(w, "prompt_logprobs", &m->ev);
        if (m->has_attempt) fy_msgw_i64(w, "attempt", m->attempt);
        fy_msgw_i64(w, "first", m->first);
        fy_msgw_i64(w, "k", m->k);
        fy_msgw_f32s(w, "logprobs", m->logprobs, m->n_logprobs);
        fy_msgw_i32s(w, "ranks", m->ranks, m->n_ranks);
        if (m->n_top_ids) fy_msgw_i32s(w, "top_ids", m->top_ids, m->n_top_ids);
        if (m->n_top_logprobs) fy_msgw_f32s(w, "top_logprobs", m->top_logprobs, m->n_top_logprobs);
    } else if (s == &fy_wire_finish_schema) {
        const fy_wire_finish_t *m = p;
        old_ev(w, "finish", &m->ev);
        fy_msgw_str(w, "reason", m->reason);
        fy_msgw_strn(w, "text", m->text, m->text_len);
        fy_msgw_i64(w, "n", m->n);
        fy_msgw_map_begin(w, "timings");
        fy_msgw_f64(w, "e2e_s", m->timings.e2e_s);
        fy_msgw_i64(w, "n_generated", m->timings.n_generated);
        fy_msgw_i64(w, "n_preempted", m->timings.n_preempted);
        fy_msgw_i64(w, "n_cached", m->timings.n_cached);
        fy_msgw_f32s(w, "itl_s", m->timings.itl_s, m->timings.n_itl);
        fy_msgw_map_end(w);
    } else if (s == &fy_wire_lease_expired_schema) {
        const fy_wire_lease_expired_t *m = p;
        old_ev(w, "lease_expired", &m->ev);
        fy_msgw_u64(w, "lease", m->lease);
    } else if (s == &fy_wire_ev_error_schema) { /* node.c's fy_node_error; prefill's job_error with attempt */
        const fy_wire_ev_error_t *m = p;
        old_ev(w, "error", &m->ev);
        if (m->has_attempt) fy_msgw_i64(w, "attempt", m->attempt);
        fy_msgw_str(w, "code", m->code);
        fy_msgw_str(w, "message", m->message);
    } else {
        return false;
    }
    return true;
}

static void same_bytes(const fy_wire_schema_t *s, const void *m, const char *what)
{
    fy_msgw_t w;
    if (!old_write(s, m, &w)) fail_msg("no old writer of %s", fy_wire_name(s));
    void *old;
    size_t old_len, len;
    assert_int_equal(fy_msgw_finish(&w, &old, &old_len), FY_OK);
    void *buf = write_msg(s, m, &len);
    if (len != old_len || memcmp(buf, old, len)) fail_msg("%s (%s): the bytes changed", fy_wire_name(s), what);
    fy_free(old);
    fy_free(buf);
}

static void test_bytes_unchanged(void **state)
{
    for (int32_t i = 0; i < fy_wire_n_all; i++) {
        const fy_wire_schema_t *s = fy_wire_all[i];
        void *m = example(s);
        if (s == &fy_wire_events_schema) {
            fy_wire_events_t *e = m;
            e->finish_reason[0] = 0; /* the router sends one or the other */
            same_bytes(s, m, "done with an error");
            e->error_code[0] = e->error[0] = 0;
            snprintf(e->finish_reason, sizeof(e->finish_reason), "stop");
            same_bytes(s, m, "finished");
            e->done = false;
            e->has_timings = false;
            snprintf(e->state, sizeof(e->state), "decoding");
            e->finish_reason[0] = 0;
            same_bytes(s, m, "running");
        } else if (s == &fy_wire_load_schema) {
            fy_wire_load_t *l = m;
            l->has_prefill = false;
            same_bytes(s, m, "a decode worker's");
            l->has_prefill = true, l->has_decode = false;
            snprintf(l->role, sizeof(l->role), "prefill");
            same_bytes(s, m, "a prefill worker's");
        } else if (s == &fy_wire_ev_error_schema) {
            same_bytes(s, m, "a prefill job's");
            ((fy_wire_ev_error_t *)m)->has_attempt = false;
            same_bytes(s, m, "fy_node_error's");
        } else if (s == &fy_wire_token_schema) {
            same_bytes(s, m, "with a logprob");
            ((fy_wire_token_t *)m)->has_logprob = false;
            same_bytes(s, m, "without");
        } else if (s == &fy_wire_generate_schema) {
            same_bytes(s, m, "token ids");
            fy_wire_generate_t *g = m;
            g->has_tokens = false, g->prompt = "Hello", g->prompt_len = 5;
            g->chat = false, g->system = NULL, g->deadline_s = 0;
            fy_genspec_default(&g->gen);
            same_bytes(s, m, "text, defaults");
        } else {
            same_bytes(s, m, "the example");
        }
        fy_free(m);
    }
}

/* ---- refusals -------------------------------------------------------------------------------------------- */

typedef enum mut_kind { MUT_WRONG_TYPE = 0, MUT_REMOVE, MUT_VALUE } mut_kind_t;

typedef struct mutation {
    const char *parent, *name; /* the field, in the map under parent (NULL: the message) */
    mut_kind_t kind;
    void (*pack)(msgpack_packer *pk, const struct mutation *mu); /* MUT_VALUE */
    const fy_wire_field_t *f;
    int64_t i; /* an integer to pack */
    double d;  /* a float */
    int64_t n; /* entries or bytes */
} mutation_t;

static bool key_eq(const msgpack_object *k, const char *s)
{
    return k->type == MSGPACK_OBJECT_STR && k->via.str.size == strlen(s) &&
           (k->via.str.size == 0 || !memcmp(k->via.str.ptr, s, k->via.str.size));
}

static void pack_key(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

static void pack_mutated(msgpack_packer *pk, const mutation_t *mu)
{
    if (mu->kind == MUT_WRONG_TYPE) {
        if (mu->f->type == FY_WIRE_MAP)
            msgpack_pack_int(pk, 5);
        else
            msgpack_pack_map(pk, 0);
    } else {
        mu->pack(pk, mu);
    }
}

/* obj packed again, the mutation applied in the map under parent_key */
static void pack_obj(msgpack_packer *pk, const msgpack_object *o, const char *under, const mutation_t *mu)
{
    if (o->type != MSGPACK_OBJECT_MAP) {
        msgpack_pack_object(pk, *o);
        return;
    }
    bool here = mu->parent ? (under && !strcmp(under, mu->parent)) : !under;
    const msgpack_object_map *m = &o->via.map;
    bool found = false;
    for (uint32_t i = 0; here && i < m->size; i++) found |= key_eq(&m->ptr[i].key, mu->name);
    uint32_t n = m->size + (here && !found && mu->kind != MUT_REMOVE) - (here && found && mu->kind == MUT_REMOVE);
    msgpack_pack_map(pk, n);
    for (uint32_t i = 0; i < m->size; i++) {
        const msgpack_object *k = &m->ptr[i].key;
        if (here && key_eq(k, mu->name)) {
            if (mu->kind == MUT_REMOVE) continue;
            msgpack_pack_object(pk, *k);
            pack_mutated(pk, mu);
            continue;
        }
        msgpack_pack_object(pk, *k);
        char kb[64];
        snprintf(kb, sizeof(kb), "%.*s", k->type == MSGPACK_OBJECT_STR ? (int)k->via.str.size : 0,
                 k->type == MSGPACK_OBJECT_STR ? k->via.str.ptr : "");
        pack_obj(pk, &m->ptr[i].val, kb, mu);
    }
    if (here && !found && mu->kind != MUT_REMOVE) {
        pack_key(pk, mu->name);
        pack_mutated(pk, mu);
    }
}

/* The example of s with mu applied must be refused, naming the field. */
static void expect_refused(const fy_wire_schema_t *s, const mutation_t *mu, const char *what)
{
    void *ex = example(s);
    size_t len;
    void *buf = write_msg(s, ex, &len);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    assert_int_equal(msgpack_unpack_next(&u, buf, len, &off), MSGPACK_UNPACK_SUCCESS);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    pack_obj(&pk, &u.data, NULL, mu);
    void *m = fy_calloc(1, fy_wire_size(s));
    fy_msgr_t r;
    fy_status_t st = read_msg(s, sb.data, sb.size, LIM, m, &r);
    char quoted[80];
    snprintf(quoted, sizeof(quoted), "'%s'", mu->name);
    if (st == FY_OK)
        fail_msg("%s: %s %s%s%s was accepted", fy_wire_name(s), what, mu->parent ? mu->parent : "",
                 mu->parent ? "." : "", mu->name);
    if (st != FY_ERR_FORMAT || !strstr(r.err, quoted))
        fail_msg("%s: %s '%s': %s '%s' does not name the field", fy_wire_name(s), what, mu->name, fy_status_str(st),
                 r.err);
    fy_msgr_free(&r);
    fy_free(m);
    msgpack_sbuffer_destroy(&sb);
    msgpack_unpacked_destroy(&u);
    fy_free(buf);
    fy_free(ex);
}

static void pack_int(msgpack_packer *pk, const mutation_t *mu) { msgpack_pack_int64(pk, mu->i); }
static void pack_uint_max(msgpack_packer *pk, const mutation_t *mu) { msgpack_pack_uint64(pk, UINT64_MAX); }
static void pack_double(msgpack_packer *pk, const mutation_t *mu) { msgpack_pack_double(pk, mu->d); }

static void pack_string(msgpack_packer *pk, const mutation_t *mu)
{
    char *s = fy_malloc((size_t)mu->n + 1);
    assert_non_null(s);
    memset(s, 'x', (size_t)mu->n);
    msgpack_pack_str(pk, (size_t)mu->n);
    msgpack_pack_str_body(pk, s, (size_t)mu->n);
    fy_free(s);
}

/* an array of n entries: integers i (or strings of i bytes) */
static void pack_array(msgpack_packer *pk, const mutation_t *mu)
{
    msgpack_pack_array(pk, (size_t)mu->n);
    for (int64_t k = 0; k < mu->n; k++) {
        if (mu->f->type == FY_WIRE_STRS) {
            mutation_t e = {.n = mu->i};
            pack_string(pk, &e);
        } else {
            msgpack_pack_int64(pk, mu->i);
        }
    }
}

/* an array of one entry of the wrong type */
static void pack_bad_entry(msgpack_packer *pk, const mutation_t *mu)
{
    msgpack_pack_array(pk, 1);
    if (mu->f->type == FY_WIRE_STRS)
        msgpack_pack_int(pk, 1);
    else
        msgpack_pack_str(pk, 1), msgpack_pack_str_body(pk, "x", 1);
}

static void test_refusals(void **state)
{
    int checked = 0;
    for (int32_t i = 0; i < fy_wire_n_all; i++) {
        const fy_wire_schema_t *s = fy_wire_all[i];
        fy_wire_field_t fs[64];
        int32_t n = fy_wire_fields(s, LIM, fs, 64);
        assert_true(n <= 64);
        for (int32_t k = 0; k < n; k++) {
            const fy_wire_field_t *f = &fs[k];
            if (f->type == FY_WIRE_GEN) continue; /* genspec.c's: test_msg and test_genspec */
            mutation_t mu = {.parent = f->parent, .name = f->name, .f = f};
            expect_refused(s, &mu, "a wrong type for");
            checked++;
            if (f->required) {
                mu.kind = MUT_REMOVE;
                expect_refused(s, &mu, "no");
                checked++;
            }
            mu.kind = MUT_VALUE;
            switch (f->type) {
            case FY_WIRE_INT:
                if (f->ihi < INT64_MAX) mu.pack = pack_int, mu.i = f->ihi + 1, expect_refused(s, &mu, "too large a");
                if (f->ilo > INT64_MIN) mu.pack = pack_int, mu.i = f->ilo - 1, expect_refused(s, &mu, "too small a");
                mu.pack = pack_double, mu.d = 0.5, expect_refused(s, &mu, "a fraction for");
                checked += 3;
                break;
            case FY_WIRE_UINT:
                if (f->ulo > 0) mu.pack = pack_int, mu.i = (int64_t)f->ulo - 1, expect_refused(s, &mu, "too small a");
                if (f->uhi < UINT64_MAX) mu.pack = pack_uint_max, expect_refused(s, &mu, "too large a");
                mu.pack = pack_int, mu.i = -1, expect_refused(s, &mu, "a negative");
                checked += 2;
                break;
            case FY_WIRE_FLOAT:
                mu.pack = pack_double, mu.d = f->dhi + (fabs(f->dhi) > 1 ? fabs(f->dhi) : 1);
                expect_refused(s, &mu, "too large a");
                mu.d = f->dlo - (fabs(f->dlo) > 1 ? fabs(f->dlo) : 1);
                expect_refused(s, &mu, "too small a");
                mu.d = NAN;
                expect_refused(s, &mu, "a NaN");
                checked += 3;
                break;
            case FY_WIRE_STR:
            case FY_WIRE_TEXT:
            case FY_WIRE_BIN:
                if (f->cap <= (1 << 20)) {
                    mu.pack = pack_string, mu.n = f->cap + 1;
                    expect_refused(s, &mu, "too long a");
                    checked++;
                }
                break;
            case FY_WIRE_INTS:
            case FY_WIRE_UINTS:
            case FY_WIRE_FLOATS:
            case FY_WIRE_STRS:
                mu.pack = pack_bad_entry, expect_refused(s, &mu, "an entry of the wrong type in");
                checked++;
                if (f->cap < (1 << 20)) {
                    mu.pack = pack_array, mu.n = f->cap + 1;
                    mu.i = f->type == FY_WIRE_STRS ? 1 : f->type == FY_WIRE_INTS ? f->ilo : 0;
                    expect_refused(s, &mu, "too many entries in");
                    checked++;
                }
                mu.pack = pack_array, mu.n = 1;
                if (f->type == FY_WIRE_INTS && f->ihi < INT32_MAX)
                    mu.i = f->ihi + 1;
                else if (f->type == FY_WIRE_INTS && f->ilo > INT32_MIN)
                    mu.i = f->ilo - 1;
                else if (f->type == FY_WIRE_UINTS)
                    mu.i = -1;
                else if (f->type == FY_WIRE_STRS)
                    mu.i = f->len + 1;
                else
                    break;
                expect_refused(s, &mu, "an entry out of range in");
                checked++;
                if (f->type == FY_WIRE_STRS) {
                    mu.i = 0;
                    expect_refused(s, &mu, "an empty entry in");
                    checked++;
                }
                break;
            default: break;
            }
        }
    }
    print_message("%d refusals, each naming its field\n", checked);
    assert_true(checked > 200);
}

/* A bad generation parameter inside a command is named too (genspec.c reads it). */
static void test_refusal_in_genspec(void **state)
{
    mutation_t mu = {.name = "temperature", .kind = MUT_VALUE, .pack = pack_double, .d = 101};
    fy_wire_field_t f = {.name = "temperature", .type = FY_WIRE_FLOAT};
    mu.f = &f;
    expect_refused(&fy_wire_reserve_schema, &mu, "too hot a");
    expect_refused(&fy_wire_prefill_schema, &mu, "too hot a");
    mu.name = "max_tokens", mu.pack = pack_int, mu.i = LIM->max_ctx + 1;
    expect_refused(&fy_wire_cmd_generate_schema, &mu, "too long a");
}

/* ---- rules across fields ------------------------------------------------------------------------------ */

/* s's example, changed by edit, read under lim: accepted. */
static void expect_read(const fy_wire_schema_t *s, void (*edit)(void *m), const fy_wire_lim_t *lim)
{
    void *m = example(s), *out = fy_calloc(1, fy_wire_size(s));
    edit(m);
    size_t len;
    void *buf = write_msg(s, m, &len);
    fy_msgr_t r;
    fy_status_t st = read_msg(s, buf, len, lim, out, &r);
    if (st != FY_OK) fail_msg("%s: got %s '%s', want it read", fy_wire_name(s), fy_status_str(st), r.err);
    fy_msgr_free(&r);
    fy_wire_clear(s, out);
    fy_free(buf);
    fy_free(out);
    fy_free(m);
}

/* s's example, changed by edit, read under lim: refused with want in the text. */
static void expect_rule(const fy_wire_schema_t *s, void (*edit)(void *m), const fy_wire_lim_t *lim, const char *want)
{
    void *m = example(s), *out = fy_calloc(1, fy_wire_size(s));
    edit(m);
    size_t len;
    void *buf = write_msg(s, m, &len);
    fy_msgr_t r;
    fy_status_t st = read_msg(s, buf, len, lim, out, &r);
    if (st != FY_ERR_FORMAT || !strstr(r.err, want))
        fail_msg("%s: got %s '%s', want format '%s'", fy_wire_name(s), fy_status_str(st), r.err, want);
    fy_msgr_free(&r);
    fy_free(buf);
    fy_free(out);
    fy_free(m);
}

static void both_prompts(void *p)
{
    ((fy_wire_generate_t *)p)->prompt = "x", ((fy_wire_generate_t *)p)->prompt_len = 1;
}
static void no_prompt(void *p) { ((fy_wire_generate_t *)p)->has_tokens = false; }
static void no_tokens(void *p) { ((fy_wire_reserve_t *)p)->n_tokens = 0; }
static void prefill_no_tokens(void *p)
{
    ((fy_wire_prefill_t *)p)->n_tokens = 0, ((fy_wire_prefill_t *)p)->n_blocks = 0;
}
static void prefill_one_block_less(void *p) { ((fy_wire_prefill_t *)p)->n_blocks = 1; }
static void prefill_first_past_end(void *p) { ((fy_wire_prefill_t *)p)->first_block = 3; }
static void prefill_block_too_many(void *p)
{
    static int32_t four[4] = {1, 2, 3, 4};
    fy_wire_prefill_t *m = p;
    m->first_block = 0, m->blocks = four, m->n_blocks = 4;
}
static void reserved_one_block_less(void *p) { ((fy_wire_reserved_t *)p)->n_blocks = 1; }
/* two KV groups (kv.h): a table of the prompt's blocks from first_block for each */
static int32_t g_two_groups[6] = {7, 8, 9, -1, -1, 12};
static void prefill_two_groups(void *p)
{
    fy_wire_prefill_t *m = p;
    m->first_block = 0, m->blocks = g_two_groups, m->n_blocks = 6;
}
static void prefill_two_groups_short(void *p)
{
    prefill_two_groups(p);
    ((fy_wire_prefill_t *)p)->n_blocks = 5;
}
static void reserved_two_groups(void *p)
{
    fy_wire_reserved_t *m = p;
    m->first_block = 0, m->blocks = g_two_groups, m->n_blocks = 6;
}
static void reserved_two_groups_short(void *p)
{
    reserved_two_groups(p);
    ((fy_wire_reserved_t *)p)->n_blocks = 4;
}
static void reserved_below_none(void *p)
{
    static int32_t bad[3] = {7, -2, 9};
    fy_wire_reserved_t *m = p;
    m->first_block = 0, m->blocks = bad, m->n_blocks = 3;
}
/* a KV budget's reservation: slots blocks per group, not one per prompt block */
static void prefill_slots(void *p) { ((fy_wire_prefill_t *)p)->slots = 2; }
static void prefill_slots_past_prompt(void *p) { ((fy_wire_prefill_t *)p)->slots = 3; }
static void prefill_slots_short(void *p) { ((fy_wire_prefill_t *)p)->slots = 1; }
static void reserved_slots_two_groups(void *p)
{
    fy_wire_reserved_t *m = p;
    m->first_block = 0, m->blocks = g_two_groups, m->n_blocks = 4, m->slots = 2;
}
static void reserved_slots_uneven(void *p)
{
    reserved_slots_two_groups(p);
    ((fy_wire_reserved_t *)p)->n_blocks = 5;
}
static void adopt_kept_unsorted(void *p)
{
    static int32_t bad[2] = {2, 0};
    ((fy_wire_adopt_t *)p)->kept = bad;
}
static void adopt_scores_short(void *p) { ((fy_wire_adopt_t *)p)->n_scores = 1; }
static void prefilled_score_negative(void *p)
{
    static float bad[2] = {-1.0f, 2.0f};
    ((fy_wire_prefilled_t *)p)->scores = bad;
}
static void prefilled_score_nan(void *p)
{
    static float bad[2] = {1.0f, 0.0f};
    bad[1] = __builtin_nanf("");
    ((fy_wire_prefilled_t *)p)->scores = bad;
}
static void prefilled_kept_past_prompt(void *p)
{
    static int32_t bad[2] = {0, 3};
    ((fy_wire_prefilled_t *)p)->kept = bad;
}
static void progress_short(void *p) { ((fy_wire_progress_t *)p)->n_computed = 2; }
static void adopt_two_words(void *p) { ((fy_wire_adopt_t *)p)->n_rng = 2; }
static void prefilled_three_words(void *p) { ((fy_wire_prefilled_t *)p)->n_rng = 3; }
static void load_role(void *p) { snprintf(((fy_wire_load_t *)p)->role, 16, "router"); }
static void load_bloom(void *p) { ((fy_wire_load_t *)p)->bloom_len = 48; }

static void test_cross_field_rules(void **state)
{
    expect_rule(&fy_wire_generate_schema, both_prompts, LIM, "exactly one of 'prompt' (text) and 'tokens'");
    expect_rule(&fy_wire_generate_schema, no_prompt, LIM, "exactly one of 'prompt' (text) and 'tokens'");
    expect_rule(&fy_wire_reserve_schema, no_tokens, LIM, "field 'tokens' is empty");
    expect_rule(&fy_wire_cmd_generate_schema, no_tokens, LIM, "field 'tokens' is empty");
    expect_rule(&fy_wire_prefill_schema, prefill_no_tokens, LIM, "field 'tokens' is empty");
    expect_rule(&fy_wire_prefill_schema, prefill_one_block_less, LIM,
                "1 destination blocks from block 1 for a prompt of 3 blocks");
    expect_rule(&fy_wire_prefill_schema, prefill_first_past_end, LIM, "from block 3 for a prompt of 3 blocks");
    expect_rule(&fy_wire_prefill_schema, prefill_block_too_many, LIM, "field 'blocks' has 4 entries; at most 3");
    expect_rule(&fy_wire_reserved_schema, reserved_one_block_less, LIM, "1 blocks from block 1 for a 3-block prompt");
    /* KV groups: a table per group, -1 for a block a sliding group does not
     * want; the count is checked against the reader's groups, or (a
     * router, which forwards the list) against whole tables */
    fy_wire_lim_t two = *LIM, any = *LIM;
    two.kv_groups = 2, any.kv_groups = 0;
    expect_read(&fy_wire_prefill_schema, prefill_two_groups, &two);
    expect_read(&fy_wire_reserved_schema, reserved_two_groups, &any);
    expect_rule(&fy_wire_prefill_schema, prefill_two_groups_short, &two,
                "5 destination blocks from block 0 for a prompt of 3 blocks (2 kv groups)");
    expect_rule(&fy_wire_prefill_schema, prefill_two_groups, LIM, "field 'blocks' has 6 entries; at most 3");
    expect_rule(&fy_wire_reserved_schema, reserved_two_groups_short, &any,
                "4 blocks from block 0 for a 3-block prompt (a table per kv group)");
    expect_rule(&fy_wire_reserved_schema, reserved_below_none, &any, "blocks");
    expect_read(&fy_wire_prefill_schema, prefill_slots, LIM);
    expect_rule(&fy_wire_prefill_schema, prefill_slots_past_prompt, LIM,
                "3 slots from block 1 for a prompt of 3 blocks");
    expect_rule(&fy_wire_prefill_schema, prefill_slots_short, LIM,
                "2 destination blocks from block 1 for a prompt of 3 blocks");
    expect_read(&fy_wire_reserved_schema, reserved_slots_two_groups, &any);
    expect_rule(&fy_wire_reserved_schema, reserved_slots_uneven, &any,
                "5 blocks from block 0 for a 3-block prompt (a table per kv group)");
    expect_rule(&fy_wire_adopt_schema, adopt_kept_unsorted, LIM, "field 'kept' is not ascending at entry 1");
    expect_rule(&fy_wire_adopt_schema, adopt_scores_short, LIM, "1 scores for 2 kept blocks");
    expect_rule(&fy_wire_prefilled_schema, prefilled_score_negative, LIM, "entry 0 is not a finite, non-negative");
    expect_rule(&fy_wire_prefilled_schema, prefilled_score_nan, LIM, "entry 1 is not a finite, non-negative");
    expect_rule(&fy_wire_prefilled_schema, prefilled_kept_past_prompt, LIM, "kept");
    expect_rule(&fy_wire_progress_schema, progress_short, LIM, "3 ids, 3 attempts and 2 computed counts");
    expect_rule(&fy_wire_adopt_schema, adopt_two_words, LIM, "field 'rng' must hold 4 words");
    expect_rule(&fy_wire_prefilled_schema, prefilled_three_words, LIM, "field 'rng' must hold 4 words");
    expect_rule(&fy_wire_load_schema, load_role, LIM, "role 'router'");
    expect_rule(&fy_wire_load_schema, load_bloom, LIM, "bloom of 48 bytes (a power of two from 64)");

    /* a worker's name with a NUL byte inside (the writer cannot make one) */
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 3);
    pack_key(&pk, "v");
    msgpack_pack_int(&pk, 1);
    pack_key(&pk, "type");
    pack_key(&pk, "status");
    pack_key(&pk, "workers");
    msgpack_pack_array(&pk, 2);
    pack_key(&pk, "decode-0");
    msgpack_pack_str(&pk, 3);
    msgpack_pack_str_body(&pk, "a\0b", 3);
    fy_wire_status_reply_t *m = fy_malloc(sizeof(*m));
    fy_msgr_t r;
    assert_int_equal(read_msg(&fy_wire_status_reply_schema, sb.data, sb.size, LIM, m, &r), FY_ERR_FORMAT);
    assert_string_equal(r.err, "field 'workers': entry 1 holds a NUL byte");
    fy_msgr_free(&r);
    fy_free(m);
    msgpack_sbuffer_destroy(&sb);
}

/* The bounds that come from the reader: the same message passes a reader
 * that knows nothing and fails one that knows the vocabulary or the prompt. */
static void test_reader_bounds(void **state)
{
    fy_wire_reserve_t m, out;
    fy_test_wire_example(&fy_wire_reserve_schema, &m);
    int32_t toks[2] = {5, 49152};
    m.tokens = toks, m.n_tokens = 2;
    size_t len;
    void *buf = write_msg(&fy_wire_reserve_schema, &m, &len);
    fy_msgr_t r;
    assert_int_equal(read_msg(&fy_wire_reserve_schema, buf, len, NULL, &out, &r), FY_OK);
    assert_int_equal(out.n_tokens, 2);
    fy_wire_reserve_clear(&out);
    assert_null(out.tokens);
    fy_msgr_free(&r);
    assert_int_equal(read_msg(&fy_wire_reserve_schema, buf, len, LIM, &out, &r), FY_ERR_FORMAT);
    assert_string_equal(r.err, "field 'tokens': entry 1 must be an integer in [0, 49151]");
    assert_null(out.tokens); /* a failed read owns nothing */
    fy_msgr_free(&r);
    fy_free(buf);

    fy_wire_reserved_t rv, rout;
    fy_test_wire_example(&fy_wire_reserved_schema, &rv);
    rv.cached = 40;
    buf = write_msg(&fy_wire_reserved_schema, &rv, &len);
    fy_wire_lim_t lim = *LIM;
    assert_int_equal(read_msg(&fy_wire_reserved_schema, buf, len, &lim, &rout, &r), FY_ERR_FORMAT);
    assert_string_equal(r.err, "field 'cached' must be an integer in [0, 39]");
    fy_msgr_free(&r);
    lim.n_prompt = 41;
    assert_int_equal(read_msg(&fy_wire_reserved_schema, buf, len, &lim, &rout, &r), FY_OK);
    fy_wire_reserved_clear(&rout);
    fy_msgr_free(&r);
    fy_free(buf);
}

/* ---- presets, absence, allocation --------------------------------------------------------------------------- */

static void test_presets_kept(void **state)
{
    /* a reserve with only what is required */
    fy_msgw_t w;
    fy_msgw_init(&w, "reserve");
    fy_msgw_u64(&w, "to", 3);
    fy_msgw_u64(&w, "id", 4);
    int32_t toks[3] = {1, 2, 3};
    fy_msgw_i32s(&w, "tokens", toks, 3);
    fy_msgw_f64(&w, "temperature", 0.5);
    fy_msgw_map_begin(&w, "lease_s"); /* nil is absent; a map is not */
    fy_msgw_map_end(&w);
    void *buf;
    size_t len;
    assert_int_equal(fy_msgw_finish(&w, &buf, &len), FY_OK);
    fy_msgr_t r;
    fy_wire_reserve_t m;
    assert_int_equal(fy_msgr_parse(&r, buf, len), FY_OK);
    fy_wire_reserve_init(&m);
    m.lease_s = 7.5;
    assert_int_equal(fy_wire_reserve_read(&r, LIM, &m), FY_ERR_FORMAT);
    assert_string_equal(r.err, "field 'lease_s' must be a number in [0.01, 3600]");
    assert_true(m.lease_s == 7.5);
    fy_msgr_free(&r);
    fy_free(buf);

    fy_msgw_init(&w, "reserve");
    fy_msgw_u64(&w, "to", 3);
    fy_msgw_u64(&w, "id", 4);
    fy_msgw_i32s(&w, "tokens", toks, 3);
    fy_msgw_f64(&w, "temperature", 0.5);
    assert_int_equal(fy_msgw_finish(&w, &buf, &len), FY_OK);
    assert_int_equal(fy_msgr_parse(&r, buf, len), FY_OK);
    fy_wire_reserve_init(&m);
    m.lease_s = 7.5;
    snprintf(m.tenant, sizeof(m.tenant), "preset");
    assert_int_equal(fy_wire_reserve_read(&r, LIM, &m), FY_OK);
    assert_true(m.lease_s == 7.5);
    assert_string_equal(m.tenant, "preset");
    assert_int_equal(m.cmd.rid, 0);
    assert_int_equal(m.n_tokens, 3);
    assert_int_equal(m.tokens[2], 3);
    assert_true(m.gen.sampling.temperature == 0.5f);
    assert_int_equal(m.gen.max_tokens, 128); /* genspec's default */
    fy_wire_reserve_clear(&m);
    fy_msgr_free(&r);
    fy_free(buf);

    /* the header alone */
    fy_wire_cmd_t h = {0};
    fy_msgw_init(&w, "release");
    fy_msgw_u64(&w, "id", 4);
    assert_int_equal(fy_msgw_finish(&w, &buf, &len), FY_OK);
    assert_int_equal(fy_msgr_parse(&r, buf, len), FY_OK);
    assert_int_equal(fy_wire_cmd_read(&r, &h), FY_ERR_FORMAT);
    assert_string_equal(r.err, "field 'to' is missing");
    fy_msgr_free(&r);
    fy_free(buf);

    /* an optional map with a presence flag, absent; and one that is there */
    fy_wire_events_t e, e2;
    fy_test_wire_example(&fy_wire_events_schema, &e);
    e.has_timings = false;
    buf = write_msg(&fy_wire_events_schema, &e, &len);
    assert_int_equal(read_msg(&fy_wire_events_schema, buf, len, LIM, &e2, &r), FY_OK);
    assert_false(e2.has_timings);
    assert_true(e2.timings.e2e_s == 0);
    fy_wire_events_clear(&e2);
    fy_msgr_free(&r);
    fy_free(buf);
}

static void test_alloc_failure(void **state)
{
    /* every allocation a read makes, failed in turn: NOMEM, nothing kept (ASan: nothing leaked) */
    const fy_wire_schema_t *ss[] = {&fy_wire_progress_schema, &fy_wire_prefill_schema, &fy_wire_finish_schema};
    for (size_t i = 0; i < FY_ARRAY_LEN(ss); i++) {
        void *ex = example(ss[i]), *m = fy_calloc(1, fy_wire_size(ss[i]));
        size_t len;
        void *buf = write_msg(ss[i], ex, &len);
        for (long k = 1;; k++) {
            fy_msgr_t r;
            assert_int_equal(fy_msgr_parse(&r, buf, len), FY_OK);
            fy_wire_init(ss[i], m);
            fy_mem_fail_after(k);
            fy_status_t st = fy_wire_read(ss[i], &r, LIM, m);
            fy_mem_fail_after(0);
            fy_msgr_free(&r);
            if (st == FY_OK) {
                fy_wire_clear(ss[i], m);
                assert_true(k > 1);
                break;
            }
            assert_int_equal(st, FY_ERR_NOMEM);
            assert_non_null(strstr(r.err, "out of memory"));
        }
        fy_free(buf);
        fy_free(m);
        fy_free(ex);
    }
}

/* ---- the schemas themselves ---------------------------------------------------------------------------- */

static void test_schema_sanity(void **state)
{
    for (int32_t i = 0; i < fy_wire_n_all; i++) {
        const fy_wire_schema_t *s = fy_wire_all[i];
        fy_wire_field_t fs[64];
        int32_t n = fy_wire_fields(s, NULL, fs, 64);
        for (int32_t k = 0; k < n; k++) {
            const fy_wire_field_t *f = &fs[k];
            /* names once per map */
            for (int32_t j = 0; j < k; j++)
                if (fs[j].type != FY_WIRE_GEN && !strcmp(fs[j].name, f->name) &&
                    (fs[j].parent == f->parent || (fs[j].parent && f->parent && !strcmp(fs[j].parent, f->parent))))
                    fail_msg("%s: field '%s' twice", fy_wire_name(s), f->name);
            /* an optional field written always is written as zero when it was absent: zero must read back */
            if (!f->required && !strcmp(f->put, "always")) {
                bool zero_ok = (f->type != FY_WIRE_INT || (f->ilo <= 0 && f->ihi >= 0)) &&
                               (f->type != FY_WIRE_UINT || f->ulo == 0) &&
                               (f->type != FY_WIRE_FLOAT || (f->dlo <= 0 && f->dhi >= 0));
                if (!zero_ok)
                    fail_msg("%s: optional '%s' is written always and 0 is out of its range", fy_wire_name(s), f->name);
            }
            if (f->required && strcmp(f->put, "always"))
                fail_msg("%s: required '%s' is not always written", fy_wire_name(s), f->name);
            if (f->type == FY_WIRE_STR && f->cap >= 512)
                fail_msg("%s: '%s' is longer than wire.c's preset buffer", fy_wire_name(s), f->name);
        }
    }
    /* the refused-message counts are named as envelope.c names the faults */
    fy_wire_field_t fs[64];
    int32_t n = fy_wire_fields(&fy_wire_status_reply_schema, NULL, fs, 64);
    int found = 0;
    for (int32_t k = 0; k < n; k++) {
        if (!fs[k].parent || strcmp(fs[k].parent, "refused_messages")) continue;
        found++;
        assert_string_equal(fs[k].name, fy_env_fault_str((fy_env_fault_t)found));
    }
    assert_int_equal(found, FY_ENV_N_FAULTS - 1);
}

/* ---- docs/protocol.md and the fuzz dictionary ------------------------------------------------------------- */

typedef struct sb {
    char *p;
    size_t n, cap;
} sb_t;

static void sb_add(sb_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_add(sb_t *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (b->n + (size_t)k + 1 > b->cap) {
        b->cap = (b->n + (size_t)k + 1) * 2;
        b->p = realloc(b->p, b->cap);
        if (!b->p) abort();
    }
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)k + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)k;
}

static void fmt_int(char *out, size_t cap, int64_t v)
{
    if (v == INT64_MAX)
        snprintf(out, cap, "2^63-1");
    else if (v == INT64_MIN)
        snprintf(out, cap, "-2^63");
    else if (v == INT32_MAX)
        snprintf(out, cap, "2^31-1");
    else if (v == INT32_MIN)
        snprintf(out, cap, "-2^31");
    else
        snprintf(out, cap, "%lld", (long long)v);
}

static const char *type_words(fy_wire_vtype_t t)
{
    static const char *const w[] = {"uint",  "int",    "float",   "bool",  "str", "str or bin", "bin or str",
                                    "[int]", "[uint]", "[float]", "[str]", "map", "",           "str"};
    return w[t];
}

static void fmt_bytes(char *out, size_t cap, int64_t n)
{
    if (n >= (1 << 20) && n % (1 << 20) == 0)
        snprintf(out, cap, "%lld MiB", (long long)(n >> 20));
    else if (n >= 1024 && n % 1024 == 0)
        snprintf(out, cap, "%lld KiB", (long long)(n >> 10));
    else
        snprintf(out, cap, "%lld bytes", (long long)n);
}

static void values(sb_t *b, const fy_wire_field_t *f)
{
    char lo[32], hi[64], n[64];
    fmt_int(lo, sizeof(lo), f->ilo);
    if (f->bound)
        snprintf(hi, sizeof(hi), "%s", f->bound);
    else
        fmt_int(hi, sizeof(hi), f->ihi);
    if (f->cap_bound)
        snprintf(n, sizeof(n), "%s", f->cap_bound);
    else
        snprintf(n, sizeof(n), "%lld", (long long)f->cap);
    switch (f->type) {
    case FY_WIRE_UINT:
        snprintf(lo, sizeof(lo), "%llu", (unsigned long long)f->ulo);
        snprintf(hi, sizeof(hi), f->uhi == UINT64_MAX ? "2^64-1" : "%llu", (unsigned long long)f->uhi);
        sb_add(b, "%s to %s", lo, hi);
        break;
    case FY_WIRE_INT: sb_add(b, "%s to %s", lo, hi); break;
    case FY_WIRE_FLOAT: sb_add(b, "%g to %g", f->dlo, f->dhi); break;
    case FY_WIRE_BOOL: break;
    case FY_WIRE_STR: sb_add(b, "at most %lld bytes, no NUL", (long long)f->cap); break;
    case FY_WIRE_TEXT:
    case FY_WIRE_BIN:
        fmt_bytes(n, sizeof(n), f->cap);
        sb_add(b, "at most %s", n);
        break;
    case FY_WIRE_INTS: sb_add(b, "at most %s, each %s to %s", n, lo, hi); break;
    case FY_WIRE_UINTS:
    case FY_WIRE_FLOATS: sb_add(b, "at most %s", n); break;
    case FY_WIRE_STRS: sb_add(b, "at most %s, each of 1 to %lld bytes, no NUL", n, (long long)f->len); break;
    case FY_WIRE_MAP: sb_add(b, "the fields `%s.*` below", f->name); break;
    case FY_WIRE_GEN: sb_add(b, "the generation parameters (above)"); break;
    case FY_WIRE_ENUM:
        for (int64_t k = 0; k < f->cap; k++) sb_add(b, "%s`%s`", k ? ", " : "", f->name_of((int)k));
        break;
    }
}

/* The generated part of docs/protocol.md: the schemas as tables. */
static char *reference(void)
{
    sb_t b = {0};
    sb_add(&b, "%s\n\n", REF_BEGIN);
    sb_add(&b, "#### Generation parameters\n\n");
    sb_add(&b, "In `generate`, `reserve`, `prefill` (common/wire.c's GENSPEC table): all optional; absent, the "
               "default.\n\n");
    sb_add(&b, "| field | type | written | values |\n|---|---|---|---|\n");
    /* from common/wire.c's table; what a range cannot say, said here */
    static const char *const notes[][2] = {
        {"temperature", "default 0: greedy"},
        {"top_k", "0: off"},
        {"max_tokens", "default 128"},
        {"spec", "the decode worker's proposer unless `default`"},
        {"kv_budget", "tokens; the engine refuses more than `kv.evict` allows"},
        {"repetition_penalty", "1: off"},
        {"logit_bias_ids", "token ids (the engine refuses one past its vocabulary); as many as `logit_bias`"},
        {"logit_bias", "biases -100 to 100, as many as `logit_bias_ids`"},
        {"min_tokens", "at most `max_tokens`"},
        {"grammar_kind", "a structured output's kind"},
        {"grammar", "its source (a JSON Schema, a regex, a JSON array of choices); only with `grammar_kind`"},
        {"prompt_logprobs", "present: the prompt's logprobs are wanted, with this many alternatives per token; the "
                            "worker running the prompt sends `prompt_logprobs` events"},
        {"bad_words_lens", "each bad word's tokens"},
        {"bad_words_ids", "the words one after another: as many as `bad_words_lens` adds up to"},
        {"allowed_token_ids", "the only tokens that may be generated"},
        {"include_stop", "the stop string that ended the text is part of it"},
        {"render_special", "special tokens' text is part of the output"},
    };
    fy_wire_field_t gf[64];
    int32_t ng = fy_wire_gen_fields(NULL, gf, 64);
    for (int32_t k = 0; k < ng; k++) {
        const fy_wire_field_t *f = &gf[k];
        char put[48];
        snprintf(put, sizeof(put), "%s", f->put);
        if (!strcmp(f->put, "not default")) snprintf(put, sizeof(put), "not %g", f->def);
        sb_add(&b, "| `%s` | %s | %s | ", f->name, type_words(f->type), put);
        values(&b, f);
        for (size_t x = 0; x < sizeof(notes) / sizeof(notes[0]); x++)
            if (!strcmp(notes[x][0], f->name)) sb_add(&b, "%s%s", f->type == FY_WIRE_BOOL ? "" : "; ", notes[x][1]);
        sb_add(&b, " |\n");
    }
    for (int32_t i = 0; i < fy_wire_n_all; i++) {
        const fy_wire_schema_t *s = fy_wire_all[i];
        sb_add(&b, "\n#### `%s` (%s)\n\n", fy_wire_type(s), fy_wire_route(s));
        fy_wire_field_t fs[64];
        int32_t n = fy_wire_fields(s, NULL, fs, 64);
        if (!n) {
            sb_add(&b, "No fields.\n");
            continue;
        }
        sb_add(&b, "| field | type | required | written | values |\n|---|---|---|---|---|\n");
        for (int32_t k = 0; k < n; k++) {
            const fy_wire_field_t *f = &fs[k];
            if (f->type == FY_WIRE_GEN)
                sb_add(&b, "| generation parameters | | | | ");
            else
                sb_add(&b, "| `%s%s%s` | %s | %s | %s | ", f->parent ? f->parent : "", f->parent ? "." : "", f->name,
                       type_words(f->type), f->required ? "yes" : "", f->put);
            values(&b, f);
            sb_add(&b, " |\n");
        }
    }
    sb_add(&b, "\n%s\n", REF_END);
    return b.p;
}

/* The part of text between the markers (both included), or NULL. */
static char *ref_section(const char *text, size_t *len_p)
{
    const char *a = strstr(text, REF_BEGIN), *e = a ? strstr(a, REF_END) : NULL;
    if (!e) return NULL;
    *len_p = (size_t)(e - a) + strlen(REF_END) + (e[strlen(REF_END)] == '\n');
    return (char *)a;
}

/* Issue 32 item 5: a socket's receive limit comes from fy_wire_max_bytes:
 * a message with every field at its largest must fit under it (or the
 * limit would refuse real traffic), and the generation parameters at
 * their limits fit FY_WIRE_GEN_MAX_BYTES. */
static void test_max_bytes(void **state)
{
    (void)state;
    static fy_wire_generate_t g;
    fy_wire_generate_init(&g);
    fy_genspec_t *gs = &g.gen;
    gs->max_tokens = INT32_MAX;
    gs->n_stop = FY_GEN_MAX_STOP;
    for (int i = 0; i < FY_GEN_MAX_STOP; i++) memset(gs->stop[i], 'x', FY_GEN_STOP_LEN);
    gs->n_logit_bias = FY_GEN_MAX_LOGIT_BIAS;
    for (int i = 0; i < FY_GEN_MAX_LOGIT_BIAS; i++) gs->logit_bias_id[i] = INT32_MAX - i, gs->logit_bias[i] = -99.5f;
    gs->n_stop_ids = FY_GEN_MAX_STOP_IDS;
    for (int i = 0; i < FY_GEN_MAX_STOP_IDS; i++) gs->stop_ids[i] = INT32_MAX - i;
    gs->grammar_kind = FY_GEN_GRAMMAR_REGEX;
    gs->grammar_len = FY_GEN_MAX_GRAMMAR;
    memset(gs->grammar, 'a', FY_GEN_MAX_GRAMMAR);
    gs->n_bad = FY_GEN_MAX_BAD_SEQS;
    for (int i = 0; i < FY_GEN_MAX_BAD_SEQS; i++) gs->bad_lens[i] = FY_GEN_MAX_BAD_TOKENS / FY_GEN_MAX_BAD_SEQS;
    for (int i = 0; i < FY_GEN_MAX_BAD_TOKENS; i++) gs->bad_ids[i] = INT32_MAX - i;
    gs->n_allowed = FY_GEN_MAX_ALLOWED_IDS;
    for (int i = 0; i < FY_GEN_MAX_ALLOWED_IDS; i++) gs->allowed_ids[i] = INT32_MAX - i;
    gs->include_stop = gs->render_special = true;
    gs->presence_penalty = gs->frequency_penalty = 1.5f;
    gs->repetition_penalty = 3.25f;
    gs->priority = -FY_GEN_PRIORITY_MAX;
    gs->kv_budget = FY_GEN_KV_BUDGET_MAX;
    gs->logprobs = gs->prompt_logprobs = gs->ignore_eos = true;
    gs->top_logprobs = FY_GEN_MAX_TOP_LOGPROBS;
    gs->prompt_top = FY_GEN_MAX_PROMPT_LOGPROBS;
    gs->sampling.temperature = 99.5f;
    gs->sampling.top_k = FY_GEN_TOP_K_MAX;
    gs->sampling.top_p = 0.999f;
    gs->sampling.min_p = 0.999f;
    gs->sampling.seed = UINT64_MAX;
    fy_msgw_t w;
    fy_msgw_init(&w, "g");
    fy_genspec_write(&w, gs);
    void *buf;
    size_t len;
    assert_int_equal(fy_msgw_finish(&w, &buf, &len), FY_OK);
    print_message("generation parameters at their limits: %zu bytes (bound %zu)\n", len, fy_wire_gen_max_bytes());
    assert_true(len <= fy_wire_gen_max_bytes());
    fy_free(buf);
    /* a generate at its largest: 1 MiB of prompt and of system text */
    char *text = fy_malloc(FY_WIRE_MAX_PROMPT_BYTES);
    assert_non_null(text);
    memset(text, 'p', FY_WIRE_MAX_PROMPT_BYTES);
    g.prompt = text, g.prompt_len = FY_WIRE_MAX_PROMPT_BYTES;
    g.chat = true;
    g.system = text, g.system_len = FY_WIRE_MAX_PROMPT_BYTES;
    g.deadline_s = 86400;
    fy_wire_generate_write(&w, &g);
    assert_int_equal(fy_msgw_finish(&w, &buf, &len), FY_OK);
    fy_wire_lim_t lim = {.max_prompt = 32768};
    size_t bound = fy_wire_max_bytes(&fy_wire_generate_schema, &lim);
    print_message("a generate at its largest: %zu bytes; the bound %zu\n", len, bound);
    assert_true(len <= bound);
    assert_true(bound < 3u << 20); /* and the bound is not the 8 MiB of old */
    fy_free(buf);
    /* and a prompt of max_prompt token ids, each at its widest */
    g.prompt = NULL, g.prompt_len = 0;
    g.has_tokens = true;
    g.n_tokens = 32768;
    g.tokens = fy_malloc(sizeof(int32_t) * 32768);
    for (int i = 0; i < 32768; i++) g.tokens[i] = INT32_MAX;
    fy_wire_generate_write(&w, &g);
    assert_int_equal(fy_msgw_finish(&w, &buf, &len), FY_OK);
    assert_true(len <= bound);
    fy_free(buf);
    fy_free(g.tokens);
    fy_free(text);
    /* the routes: every message of a route fits its route's bound */
    static const char *const c2r[] = {"client → router"};
    assert_int_equal(fy_wire_max_route(c2r, 1, &lim), bound);
}

/* The worker ports' receive limits come from their routes' bounds: an
 * H2O adopt's kept blocks and scores are bounded by the longest prompt's
 * blocks, a finish's inter-token latencies by the context (both were 2^20
 * entries: 18 MB a frame, so nng's 8 MiB cap was the only limit before
 * authentication).  A message at its largest fits; one over is refused. */
static void test_worker_route_bounds(void **state)
{
    (void)state;
    static const char *const r2d[] = {"router → decode worker"}, *const d2r[] = {"decode worker → router"};
    fy_wire_lim_t lim = {
        .token_hi = 49151, .max_prompt = 8191, .n_prompt = 8191, .max_ctx = 8192, .block_size = 16, .kv_groups = 2};
    size_t to_decode = fy_wire_max_route(r2d, 1, &lim), from_decode = fy_wire_max_route(d2r, 1, &lim);
    print_message("bounds at an 8k context: router -> decode %zu bytes, decode -> router %zu bytes\n", to_decode,
                  from_decode);
    assert_true(to_decode < 1u << 20);
    assert_true(from_decode < 1u << 20);

    fy_wire_adopt_t a, a2;
    fy_test_wire_example(&fy_wire_adopt_schema, &a);
    int32_t n = (8191 + 15) / 16 * 2; /* every block of the longest prompt, both groups */
    int32_t *kept = fy_malloc(sizeof(int32_t) * (size_t)(n + 1));
    float *scores = fy_malloc(sizeof(float) * (size_t)(n + 1));
    assert_true(kept && scores);
    for (int32_t i = 0; i <= n; i++) kept[i] = INT32_MAX - n + i, scores[i] = 3.0e38f;
    a.kept = kept, a.n_kept = n, a.scores = scores, a.n_scores = n;
    size_t len;
    void *buf = write_msg(&fy_wire_adopt_schema, &a, &len);
    assert_true(len <= fy_wire_max_bytes(&fy_wire_adopt_schema, &lim));
    fy_msgr_t r;
    assert_int_equal(read_msg(&fy_wire_adopt_schema, buf, len, &lim, &a2, &r), FY_OK);
    fy_wire_adopt_clear(&a2);
    fy_msgr_free(&r);
    fy_free(buf);
    a.n_kept = a.n_scores = n + 1; /* one block more than the longest prompt has */
    buf = write_msg(&fy_wire_adopt_schema, &a, &len);
    assert_int_equal(read_msg(&fy_wire_adopt_schema, buf, len, &lim, &a2, &r), FY_ERR_FORMAT);
    print_message("%s\n", r.err);
    assert_non_null(strstr(r.err, "kept"));
    fy_wire_adopt_clear(&a2);
    fy_msgr_free(&r);
    fy_free(buf);
    fy_free(kept);
    fy_free(scores);

    fy_wire_finish_t f, f2;
    fy_test_wire_example(&fy_wire_finish_schema, &f);
    float *itl = fy_calloc(8193, sizeof(float));
    assert_non_null(itl);
    f.timings.itl_s = itl, f.timings.n_itl = 8192;
    buf = write_msg(&fy_wire_finish_schema, &f, &len);
    assert_int_equal(read_msg(&fy_wire_finish_schema, buf, len, &lim, &f2, &r), FY_OK);
    fy_wire_finish_clear(&f2);
    fy_msgr_free(&r);
    fy_free(buf);
    f.timings.n_itl = 8193; /* more gaps than the context has tokens */
    buf = write_msg(&fy_wire_finish_schema, &f, &len);
    assert_int_equal(read_msg(&fy_wire_finish_schema, buf, len, &lim, &f2, &r), FY_ERR_FORMAT);
    assert_non_null(strstr(r.err, "itl_s"));
    fy_wire_finish_clear(&f2);
    fy_msgr_free(&r);
    fy_free(buf);
    fy_free(itl);
}

static void test_protocol_md(void **state)
{
    size_t len;
    char *doc = fy_test_read_file(PROTOCOL_MD, &len);
    if (!doc) fail_msg("cannot read %s (run the tests from the repository's root)", PROTOCOL_MD);
    /* every message type, in the prose (before the generated tables) too */
    char *ref = strstr(doc, REF_BEGIN);
    if (!ref)
        fail_msg("%s has no generated reference: run build/release/tests/test_wire --write-reference %s", PROTOCOL_MD,
                 PROTOCOL_MD);
    *ref = 0;
    for (int32_t i = 0; i < fy_wire_n_all; i++) {
        char a[64], b[64];
        snprintf(a, sizeof(a), "`%s`", fy_wire_type(fy_wire_all[i]));
        snprintf(b, sizeof(b), "type: \"%s\"", fy_wire_type(fy_wire_all[i]));
        if (!strstr(doc, a) && !strstr(doc, b))
            fail_msg("%s does not describe the message '%s' (%s)", PROTOCOL_MD, fy_wire_type(fy_wire_all[i]),
                     fy_wire_route(fy_wire_all[i]));
    }
    *ref = REF_BEGIN[0];
    /* the generated tables are current */
    char *want = reference();
    size_t n = 0;
    const char *have = ref_section(doc, &n);
    if (!have) fail_msg("%s: the generated reference has no end marker", PROTOCOL_MD);
    if (n != strlen(want) || memcmp(have, want, n)) {
        size_t k = 0;
        while (k < n && want[k] && have[k] == want[k]) k++;
        size_t line = 1;
        for (size_t j = 0; j < k; j++) line += want[j] == '\n';
        fail_msg("%s's message reference is stale (line %zu of it differs): run build/release/tests/test_wire "
                 "--write-reference %s",
                 PROTOCOL_MD, line, PROTOCOL_MD);
    }
    free(want);
    fy_free(doc);
}

static void test_fuzz_dict(void **state)
{
    size_t len;
    char *dict = fy_test_read_file(WIRE_DICT, &len);
    if (!dict) fail_msg("cannot read %s (run the tests from the repository's root)", WIRE_DICT);
    for (int32_t i = 0; i < fy_wire_n_all; i++) {
        fy_wire_field_t fs[64];
        int32_t n = fy_wire_fields(fy_wire_all[i], NULL, fs, 64);
        for (int32_t k = -1; k < n; k++) {
            const char *name = k < 0 ? fy_wire_type(fy_wire_all[i]) : fs[k].name;
            if (k >= 0 && fs[k].type == FY_WIRE_GEN) continue;
            char entry[80]; /* the key as msgpack writes it: a fixstr header, then the name */
            snprintf(entry, sizeof(entry), "\"\\x%02x%s\"", 0xa0 | (unsigned)strlen(name), name);
            if (!strstr(dict, entry)) fail_msg("%s lacks %s", WIRE_DICT, entry);
        }
    }
    fy_free(dict);
}

/* ---- main ----------------------------------------------------------------------------------------------------- */

/* Rewrites the generated part of path (markers included) from the schemas. */
static int write_reference(const char *path)
{
    size_t len, n;
    char *doc = fy_test_read_file(path, &len);
    if (!doc) {
        fprintf(stderr, "test_wire: cannot read %s\n", path);
        return 1;
    }
    char *want = reference();
    char *at = ref_section(doc, &n);
    sb_t b = {0};
    if (at) {
        sb_add(&b, "%.*s%s%s", (int)(at - doc), doc, want, at + n);
    } else {
        sb_add(&b, "%s%s\n## Message reference\n\n%s", doc, len && doc[len - 1] == '\n' ? "" : "\n", want);
    }
    int rc = fy_test_write_file(path, b.p, b.n) ? 0 : 1;
    if (!rc) printf("test_wire: %s: the message reference is written\n", path);
    free(b.p);
    free(want);
    fy_free(doc);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--write-reference")) return write_reference(argv[2]);
    if (argc == 2 && !strcmp(argv[1], "--reference")) {
        char *r = reference();
        fputs(r, stdout);
        free(r);
        return 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),         cmocka_unit_test(test_round_trip_variants),
        cmocka_unit_test(test_bytes_unchanged),    cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_refusal_in_genspec), cmocka_unit_test(test_cross_field_rules),
        cmocka_unit_test(test_reader_bounds),      cmocka_unit_test(test_presets_kept),
        cmocka_unit_test(test_alloc_failure),      cmocka_unit_test(test_schema_sanity),
        cmocka_unit_test(test_protocol_md),        cmocka_unit_test(test_fuzz_dict),
        cmocka_unit_test(test_max_bytes),          cmocka_unit_test(test_worker_route_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * wire_examples.c - an example of every control-plane message (see
 * wire_examples.h).
 */
#include "tests/wire_examples.h"

#include <stdio.h>
#include <string.h>

const fy_wire_lim_t fy_test_wire_lim = {
    .token_hi = 49151, .max_prompt = 4096, .max_ctx = 8192, .n_prompt = 40, .block_size = 16, .kv_groups = 1};

/* a 40-token prompt: three 16-token blocks */
static int32_t g_prompt[40];
static int32_t g_blocks[3] = {7, 8, 9};
/* a KV budget's kept blocks of the 3-block prompt (the last one kept) and their H2O scores */
static int32_t g_kept[2] = {0, 2};
static float g_scores[2] = {12.5f, 0.75f};
/* a token's alternatives (top_logprobs) */
static int32_t g_top_ids[2] = {42, 7};
static float g_top_lps[2] = {-0.125f, -2.5f};
/* prompt logprobs of tokens 5 and 6, two alternatives each */
static float g_plp[2] = {-1.5f, -0.25f};
static int32_t g_plp_rank[2] = {3, 1};
static int32_t g_plp_ids[4] = {42, 7, 9, 42};
static float g_plp_tlps[4] = {-0.5f, -1.0f, -0.25f, -2.0f};
static uint64_t g_ids[3] = {7, 8, 1ull << 40};
static int32_t g_attempts[3] = {0, 1, 1000};
static int32_t g_computed[3] = {16, 40, 0};
static float g_itl[3] = {0.01f, 0.02f, 0.5f};
static uint8_t g_target[48];
static uint8_t g_bloom[64];
static const uint64_t g_rng[4] = {1, UINT64_MAX, 3, 0x9e3779b97f4a7c15ull};

static void gen_full(fy_genspec_t *g)
{
    fy_genspec_default(g);
    g->sampling.temperature = 0.7f;
    g->sampling.top_k = 40;
    g->sampling.top_p = 0.9f;
    g->sampling.min_p = 0.05f;
    g->sampling.seed = 12345;
    g->max_tokens = 64;
    g->n_stop = 2;
    snprintf(g->stop[0], sizeof(g->stop[0]), "\n\n");
    snprintf(g->stop[1], sizeof(g->stop[1]), "</s>");
    g->ignore_eos = true;
    g->logprobs = true;
    g->priority = -3;
    g->spec = FY_SPEC_NGRAM;
    g->kv_budget = 400;
    g->presence_penalty = 0.5f, g->frequency_penalty = 0.25f, g->repetition_penalty = 1.1f;
    g->n_logit_bias = 2;
    g->logit_bias_id[0] = 13, g->logit_bias[0] = -100.0f;
    g->logit_bias_id[1] = 42, g->logit_bias[1] = 2.5f;
    g->min_tokens = 4;
    g->top_logprobs = 3;
    g->n_stop_ids = 1, g->stop_ids[0] = 2;
    g->prompt_logprobs = true, g->prompt_top = 2;
    g->n_bad = 2, g->bad_lens[0] = 1, g->bad_lens[1] = 2;
    g->bad_ids[0] = 17, g->bad_ids[1] = 30, g->bad_ids[2] = 31;
    g->grammar_kind = FY_GEN_GRAMMAR_JSON_SCHEMA;
    g->grammar_len =
        snprintf(g->grammar, sizeof(g->grammar),
                 "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}");
}

static fy_wire_cmd_t cmd(uint64_t rid) { return (fy_wire_cmd_t){.to = 0xabcdef0123456789ull, .rid = rid}; }

static fy_wire_ev_t ev(const char *worker, uint64_t rid, uint64_t id)
{
    fy_wire_ev_t h = {.inc = 0x1122334455667788ull, .rid = rid, .id = id};
    snprintf(h.worker, sizeof(h.worker), "%s", worker);
    return h;
}

static void data(void)
{
    for (int i = 0; i < 40; i++) g_prompt[i] = i == 3 ? 49151 : 100 + i * 7;
    for (size_t i = 0; i < sizeof(g_target); i++) g_target[i] = (uint8_t)(i * 37 + 1);
    for (size_t i = 0; i < sizeof(g_bloom); i++) g_bloom[i] = (uint8_t)(i * 11);
}

void fy_test_wire_example(const fy_wire_schema_t *s, void *p)
{
    data();
    fy_wire_init(s, p);
    if (s == &fy_wire_generate_schema) {
        fy_wire_generate_t *m = p;
        m->has_tokens = true;
        m->tokens = g_prompt;
        m->n_tokens = 40;
        m->chat = true;
        m->system = "be brief";
        m->system_len = strlen(m->system);
        m->deadline_s = 12.5;
        gen_full(&m->gen);
    } else if (s == &fy_wire_poll_schema) {
        *(fy_wire_poll_t *)p = (fy_wire_poll_t){.id = 7, .from = 3, .from_text = 12, .wait_s = 2.5};
    } else if (s == &fy_wire_cancel_schema) {
        ((fy_wire_cancel_t *)p)->id = 7;
    } else if (s == &fy_wire_status_schema) {
        /* no fields */
    } else if (s == &fy_wire_accepted_schema) {
        *(fy_wire_accepted_t *)p = (fy_wire_accepted_t){.id = 7, .n_prompt = 40};
    } else if (s == &fy_wire_events_schema) {
        fy_wire_events_t *m = p;
        m->id = 7;
        m->tokens = g_prompt;
        m->n_tokens = 5;
        m->text = "abc \xe2\x9c\x93";
        m->text_len = strlen(m->text);
        m->n_prompt = 40;
        snprintf(m->state, sizeof(m->state), "done");
        m->done = true;
        snprintf(m->error_code, sizeof(m->error_code), "timeout");
        snprintf(m->error, sizeof(m->error), "deadline exceeded in state decoding");
        snprintf(m->finish_reason, sizeof(m->finish_reason), "length");
        m->has_timings = true;
        m->timings = (fy_wire_req_timings_t){.queue_s = 0.001,
                                             .reserve_s = 0.002,
                                             .prefill_queue_s = 0.003,
                                             .prefill_compute_s = -0.0005,
                                             .transfer_s = 0.004,
                                             .transfer_tail_s = 0.005,
                                             .prefill_total_s = 0.02,
                                             .first_token_s = 0.006,
                                             .ttft_s = 0.03,
                                             .e2e_s = 1.25,
                                             .transfer_bytes = 1 << 20,
                                             .cached_prefill = 16,
                                             .cached_decode = 32,
                                             .retries = 1};
    } else if (s == &fy_wire_cancelled_schema) {
        ((fy_wire_cancelled_t *)p)->id = 7;
    } else if (s == &fy_wire_status_reply_schema) {
        fy_wire_status_reply_t *m = p;
        snprintf(m->model, sizeof(m->model), "SmolLM2-135M-Instruct.Q4_1@0123456789abcdef");
        m->requests = 3, m->queued = 1, m->completed = 10, m->failed = 2, m->refused = 1, m->retried = 4;
        m->bad_events = 5, m->prefill_up = 1, m->decode_up = 1;
        m->n_workers = m->n_up = m->n_assigned = m->n_admittable = m->n_total_blocks = m->n_decode =
            m->n_pending_tokens = m->n_ranks = m->n_out = 2;
        m->ranks[0] = 1, m->ranks[1] = 3; /* decode-0: a tp 3 group, out of service */
        m->out[1] = 1;
        snprintf(m->workers[0], sizeof(m->workers[0]), "prefill-0");
        snprintf(m->workers[1], sizeof(m->workers[1]), "decode-0");
        m->up[0] = m->up[1] = 1;
        m->decode[1] = 1;
        m->assigned[0] = 2, m->assigned[1] = 3;
        m->admittable[1] = 1000;
        m->total_blocks[0] = 2048, m->total_blocks[1] = 4096;
        m->pending_tokens[0] = 512;
        m->refused_messages =
            (fy_wire_refused_t){.format = 1, .mac = 2, .stale = 3, .replay = 4, .identity = 5, .clear = 6};
    } else if (s == &fy_wire_error_schema) {
        fy_wire_error_t *m = p;
        m->id = 7;
        snprintf(m->code, sizeof(m->code), "overloaded");
        snprintf(m->message, sizeof(m->message), "overloaded: 256 requests are waiting");
    } else if (s == &fy_wire_reserve_schema || s == &fy_wire_cmd_generate_schema) {
        fy_wire_reserve_t *m = p;
        m->cmd = cmd(9);
        m->id = 7;
        snprintf(m->tenant, sizeof(m->tenant), "acme");
        m->tokens = g_prompt;
        m->n_tokens = 40;
        gen_full(&m->gen);
        if (s == &fy_wire_reserve_schema) m->lease_s = 30;
    } else if (s == &fy_wire_renew_schema) {
        *(fy_wire_renew_t *)p = (fy_wire_renew_t){.cmd = cmd(10), .id = 7, .lease = 5, .lease_s = 30};
    } else if (s == &fy_wire_adopt_schema) {
        fy_wire_adopt_t *m = p;
        *m = (fy_wire_adopt_t){.cmd = cmd(11),
                               .id = 7,
                               .lease = 5,
                               .first_token = 42,
                               .logprob = -0.5,
                               .n_rng = 4,
                               .kept = g_kept,
                               .n_kept = 2,
                               .scores = g_scores,
                               .n_scores = 2};
        memcpy(m->rng, g_rng, sizeof(m->rng));
    } else if (s == &fy_wire_release_schema || s == &fy_wire_cmd_cancel_schema) {
        *(fy_wire_release_t *)p = (fy_wire_release_t){.cmd = cmd(0), .id = 7};
    } else if (s == &fy_wire_prefill_schema) {
        fy_wire_prefill_t *m = p;
        m->cmd = cmd(12);
        m->id = 7;
        m->attempt = 1;
        snprintf(m->tenant, sizeof(m->tenant), "acme");
        m->tokens = g_prompt;
        m->n_tokens = 40;
        gen_full(&m->gen);
        m->target = g_target;
        m->target_len = sizeof(g_target);
        m->first_block = 1;
        m->blocks = g_blocks + 1;
        m->n_blocks = 2;
        m->deadline_s = 29;
    } else if (s == &fy_wire_extend_schema) {
        *(fy_wire_extend_t *)p = (fy_wire_extend_t){.cmd = cmd(0), .id = 7, .attempt = 1, .deadline_s = 29};
    } else if (s == &fy_wire_load_schema) {
        fy_wire_load_t *m = p;
        *m = (fy_wire_load_t){.ev = ev("decode-0", 0, 0),
                              .block_size = 16,
                              .running = 3,
                              .waiting = 1,
                              .swapped = 2,
                              .max_seqs = 32,
                              .total_blocks = 4096,
                              .free_blocks = 1000,
                              .cached_blocks = 500,
                              .admittable = 900,
                              .has_capacity = true,
                              .capacity = 4000,
                              .kv_usage = 0.25,
                              .prefix_queries = 100,
                              .prefix_hits = 60,
                              .preemptions = 1,
                              .bad_commands = 2,
                              .bloom = g_bloom,
                              .bloom_len = sizeof(g_bloom),
                              .has_decode = true,
                              .leases = 2,
                              .leased_blocks = 6,
                              .leases_expired = 1,
                              .leases_renewed = 3,
                              .adopted = 9,
                              .reserve_refused = 4,
                              .has_prefill = true,
                              .jobs = 2,
                              .jobs_done = 8,
                              .jobs_failed = 1,
                              .bytes_shipped = 1 << 24,
                              .tp = 3,
                              .pp = 2,
                              .ctx = 2048};
        snprintf(m->out_of_service, sizeof(m->out_of_service), "rank group broken: rank 4 (pid 1234) died");
        snprintf(m->role, sizeof(m->role), "decode");
        snprintf(m->listen, sizeof(m->listen), "tcp://127.0.0.1:7500");
        snprintf(m->model, sizeof(m->model), "SmolLM2-135M-Instruct.Q4_1@0123456789abcdef");
    } else if (s == &fy_wire_alive_schema) {
        *(fy_wire_alive_t *)p = (fy_wire_alive_t){.ev = ev("decode-0", 0, 0), .busy_s = 0.25};
    } else if (s == &fy_wire_progress_schema) {
        *(fy_wire_progress_t *)p = (fy_wire_progress_t){.ev = ev("prefill-0", 0, 0),
                                                        .ids = g_ids,
                                                        .n_ids = 3,
                                                        .attempts = g_attempts,
                                                        .n_attempts = 3,
                                                        .computed = g_computed,
                                                        .n_computed = 3};
    } else if (s == &fy_wire_reserved_schema) {
        *(fy_wire_reserved_t *)p = (fy_wire_reserved_t){.ev = ev("decode-0", 9, 7),
                                                        .lease = 5,
                                                        .lease_s = 30,
                                                        .cached = 16,
                                                        .first_block = 1,
                                                        .blocks = g_blocks + 1,
                                                        .n_blocks = 2,
                                                        .target = g_target,
                                                        .target_len = sizeof(g_target)};
    } else if (s == &fy_wire_renewed_schema) {
        *(fy_wire_renewed_t *)p = (fy_wire_renewed_t){.ev = ev("decode-0", 10, 7), .lease = 5, .lease_s = 29.5};
    } else if (s == &fy_wire_adopted_schema) {
        *(fy_wire_ack_t *)p = (fy_wire_ack_t){.ev = ev("decode-0", 11, 7)};
    } else if (s == &fy_wire_ev_accepted_schema) {
        *(fy_wire_ack_t *)p = (fy_wire_ack_t){.ev = ev("prefill-0", 12, 7)};
    } else if (s == &fy_wire_prefilled_schema) {
        fy_wire_prefilled_t *m = p;
        *m = (fy_wire_prefilled_t){.ev = ev("prefill-0", 0, 7),
                                   .attempt = 1,
                                   .first_token = 42,
                                   .logprob = -0.25,
                                   .n_rng = 4,
                                   .cached = 16,
                                   .timings = {.queue_s = 0.001,
                                               .compute_s = 0.01,
                                               .transfer_tail_s = 0.002,
                                               .transfer_s = 0.008,
                                               .bytes = 3 << 16},
                                   .kept = g_kept,
                                   .n_kept = 2,
                                   .scores = g_scores,
                                   .n_scores = 2};
        memcpy(m->rng, g_rng, sizeof(m->rng));
    } else if (s == &fy_wire_token_schema) {
        *(fy_wire_token_t *)p = (fy_wire_token_t){.ev = ev("decode-0", 0, 7),
                                                  .n = 3,
                                                  .token = 42,
                                                  .text = " wor",
                                                  .text_len = 4,
                                                  .has_logprob = true,
                                                  .logprob = -0.125,
                                                  .top_ids = g_top_ids,
                                                  .n_top_ids = 2,
                                                  .top_logprobs = g_top_lps,
                                                  .n_top_logprobs = 2};
    } else if (s == &fy_wire_prompt_logprobs_schema) {
        *(fy_wire_prompt_logprobs_t *)p = (fy_wire_prompt_logprobs_t){.ev = ev("prefill-0", 0, 7),
                                                                      .has_attempt = true,
                                                                      .attempt = 1,
                                                                      .first = 5,
                                                                      .k = 2,
                                                                      .logprobs = g_plp,
                                                                      .n_logprobs = 2,
                                                                      .ranks = g_plp_rank,
                                                                      .n_ranks = 2,
                                                                      .top_ids = g_plp_ids,
                                                                      .n_top_ids = 4,
                                                                      .top_logprobs = g_plp_tlps,
                                                                      .n_top_logprobs = 4};
    } else if (s == &fy_wire_finish_schema) {
        fy_wire_finish_t *m = p;
        *m = (fy_wire_finish_t){
            .ev = ev("decode-0", 0, 7),
            .text = "ld",
            .text_len = 2,
            .n = 4,
            .timings = {.e2e_s = 1.5, .n_generated = 4, .n_preempted = 1, .n_cached = 16, .itl_s = g_itl, .n_itl = 3}};
        snprintf(m->reason, sizeof(m->reason), "stop");
    } else if (s == &fy_wire_lease_expired_schema) {
        *(fy_wire_lease_expired_t *)p = (fy_wire_lease_expired_t){.ev = ev("decode-0", 0, 7), .lease = 5};
    } else if (s == &fy_wire_ev_error_schema) {
        fy_wire_ev_error_t *m = p;
        *m = (fy_wire_ev_error_t){.ev = ev("prefill-0", 12, 7), .has_attempt = true, .attempt = 1};
        snprintf(m->code, sizeof(m->code), "timeout");
        snprintf(m->message, sizeof(m->message), "kv transfer failed: the deadline passed");
    }
}

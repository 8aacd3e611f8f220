/*
 * decode_worker.c - the decode worker: reserves blocks for prompts that a
 * prefill worker will fill, adopts them into its continuous batch, streams
 * tokens to the router.
 *
 * A reservation is a lease: blocks taken from the pool (less the prompt's
 * prefix this worker already caches for the tenant), an admission promise
 * for the whole request, and a deadline.  The router is told the blocks,
 * the arena's address and rkey (the transfer descriptor); the prefill
 * worker writes into them with one-sided puts.  On "adopt" the lease
 * becomes a running request; a lease that reaches its deadline first is
 * freed (blocks and promise) and the router is told.  Under a KV budget
 * (kv.evict) the prefill worker evicts while it runs the prompt, so the
 * lease takes only as many blocks as the budget keeps ("slots", in no
 * particular place yet); "adopt" says which prompt blocks were kept (and
 * their H2O scores), and the blocks move there (fy_kvm_seq_place).  How long a lease
 * lasts is the router's ask capped by this worker's decode.max_lease, so a
 * command can never hold blocks and sequence slots longer than the
 * worker's own configuration allows.  Leases are reaped on
 * every engine step and heartbeat, so an idle worker reaps them too.
 *
 * Staged (worker.kv_transfer, xstage.h): the router is told staging
 * slots instead of pool blocks (the transfer engine registered the
 * staging area); the lease holds one slot per block the prefill worker
 * will send, taken all or none at reservation ("kv staging exhausted"
 * otherwise), and "adopt" copies them host-to-device into the blocks the
 * lease reserved before anything else.  Slots go back whenever the lease
 * ends (lease_free): adopted, expired, released, forgotten, or shutdown.
 *
 * Everything here runs on the engine thread.
 *
 * Metrics (besides node.c's): requests' decode-phase latency (adoption to
 * the end) and inter-token latencies, outcomes, and leases.  Time to first
 * token and queue time are not measured here: the first token is sampled
 * by the prefill worker (the router and the prefill worker time them).
 */
#include "decode/decode_worker.h"

#include <stdio.h>
#include <string.h>

#include "common/clock.h"
#include "common/genspec.h"
#include "common/log.h"
#include "common/mem.h"
#include "rpc/rpc.h"
#include "transfer/xgroup.h"
#include "worker/xstage.h"

#define MAX_PROMPT 32768

typedef struct lease {
    uint64_t lease, id;
    double deadline, t_reserved;
    fy_block_table_t bt;
    int32_t held;  /* blocks the reservation took (all groups) */
    int32_t slots; /* a KV budget's reservation: blocks per group for the kept ones; 0: one per prompt block */
    fy_kv_resv_t resv;
    int32_t *prompt;
    int32_t n_prompt, n_cached;
    fy_genspec_t gen;
    fy_kv_ns_t ns;
    int32_t n_recv;        /* blocks the prefill worker sends (entries of the reservation's list) */
    int32_t *stage_slots;  /* staged: [n_stage] the staging slots they land in, */
    int32_t *stage_blocks; /* and the pool blocks each goes to at adoption */
    int32_t n_stage;
    struct lease *next;
} lease_t;

typedef struct dreq {
    struct decode *d;
    uint64_t id, engine_id;
    int32_t n; /* tokens streamed */
    bool logprobs;
    struct dreq *prev, *next;
} dreq_t;

typedef struct decode {
    fy_node_t *n;
    lease_t *leases;
    int32_t n_leases, leased_blocks;
    dreq_t *reqs;
    int32_t n_reqs;
    uint64_t next_lease;
    double max_lease; /* decode.max_lease: no lease lasts longer */
    uint64_t reserved, refused, adopted, expired, released, renewed, generated;
    struct {
        fy_metric_t *e2e, *itl, *lease_wait, *kv_kept;
        fy_metric_t *success[FY_FINISH_CALLBACK + 1]; /* by fy_finish_reason_t */
        fy_metric_t *failed, *leases, *leased_blocks, *expired, *reserve_refused;
    } m;
} decode_t;

static void lease_free(decode_t *d, lease_t *l)
{
    fy_kvm_t *kvm = fy_node_kvm(d->n);
    fy_xstage_give(fy_node_stage(d->n), l->stage_slots, l->n_stage); /* n_stage 0 when not staged */
    fy_free(l->stage_slots);
    fy_kvm_resv_release(kvm, &l->resv);
    fy_kvm_seq_release(kvm, &l->bt);
    fy_kvm_seq_deinit(&l->bt);
    fy_free(l->prompt);
    fy_free(l);
}

static void lease_unlink(decode_t *d, lease_t *l)
{
    for (lease_t **p = &d->leases; *p; p = &(*p)->next) {
        if (*p == l) {
            *p = l->next;
            d->n_leases--;
            d->leased_blocks -= l->held;
            return;
        }
    }
}

static lease_t *lease_find(decode_t *d, uint64_t id, uint64_t lease)
{
    for (lease_t *l = d->leases; l; l = l->next)
        if (l->id == id && (!lease || l->lease == lease)) return l;
    return NULL;
}

static dreq_t *req_find(decode_t *d, uint64_t id)
{
    for (dreq_t *q = d->reqs; q; q = q->next)
        if (q->id == id) return q;
    return NULL;
}

static void req_unlink(decode_t *d, dreq_t *q)
{
    if (q->prev)
        q->prev->next = q->next;
    else
        d->reqs = q->next;
    if (q->next) q->next->prev = q->prev;
    d->n_reqs--;
}

/* ---- reserve --------------------------------------------------------------------------------- */

/* What this worker's commands may hold: token ids of its vocabulary, a
 * prompt that leaves room for a token in its context. */
static fy_wire_lim_t command_lim(fy_node_t *n)
{
    const fy_runner_params_t *rp = fy_runner_params(fy_node_runner(n));
    return (fy_wire_lim_t){.token_hi = fy_model_config(fy_node_model(n))->vocab_size - 1,
                           .max_prompt = rp->max_ctx - 1 < MAX_PROMPT ? rp->max_ctx - 1 : MAX_PROMPT,
                           .max_ctx = rp->max_ctx,
                           .block_size = fy_kvm_layout(fy_node_kvm(n))->block_size,
                           .kv_groups = fy_kvm_layout(fy_node_kvm(n))->n_groups};
}

static void cmd_reserve(decode_t *d, fy_msgr_t *r, uint64_t rid)
{
    fy_node_t *n = d->n;
    fy_kvm_t *kvm = fy_node_kvm(n);
    const fy_runner_params_t *rp = fy_runner_params(fy_node_runner(n));
    int32_t bs = fy_kvm_layout(kvm)->block_size;
    fy_wire_lim_t lim = command_lim(n);
    fy_wire_reserve_t m;
    fy_wire_reserve_init(&m);
    m.lease_s = d->max_lease;
    if (fy_wire_reserve_read(r, &lim, &m)) {
        fy_node_error(n, rid, m.id, r->status, "bad reserve: %s", r->err);
        return;
    }
    uint64_t id = m.id;
    double lease_s = m.lease_s < d->max_lease ? m.lease_s : d->max_lease;
    lease_t *l = fy_calloc(1, sizeof(*l));
    if (!l) {
        fy_wire_reserve_clear(&m);
        fy_node_error(n, rid, id, FY_ERR_NOMEM, "out of memory for a reservation");
        return;
    }
    int32_t *prompt = m.tokens; /* the lease keeps them */
    m.tokens = NULL;
    l->prompt = prompt;
    l->n_prompt = m.n_tokens;
    l->gen = m.gen;
    if (l->gen.spec == FY_SPEC_DRAFT && !fy_engine_has_draft(fy_node_engine(n))) {
        fy_node_error(n, rid, id, FY_ERR_INVALID,
                      "speculative decoding 'draft' asked for; this decode worker has no "
                      "draft model (decode.spec)");
        fy_free(prompt);
        fy_free(l);
        return;
    }
    if (d->n_leases + d->n_reqs >= fy_node_max_seqs(n)) {
        d->refused++;
        fy_metric_inc(d->m.reserve_refused);
        fy_node_error(n, rid, id, FY_ERR_NO_SPACE, "busy: %d running and %d reserved of %d sequences", d->n_reqs,
                      d->n_leases, fy_node_max_seqs(n));
        fy_free(prompt);
        fy_free(l);
        return;
    }
    int32_t max_tokens = fy_genspec_max_tokens(&l->gen, l->n_prompt, rp->max_ctx);
    fy_node_ns(n, m.tenant, &l->ns);
    fy_status_t st = fy_kvm_seq_init(kvm, &l->bt, l->n_prompt + max_tokens, &l->ns);
    if (st) {
        fy_node_error(n, rid, id, st, "cannot set up a block table");
        fy_free(prompt);
        fy_free(l);
        return;
    }
    /* a KV budget: the prefill worker evicts as it goes, and what it keeps
     * at the prompt's end (at most fy_evict_max_blocks with no step) comes
     * into that many blocks per group */
    fy_evict_params_t ev;
    int32_t kv_cap, hit = 0;
    if (fy_engine_request_evict(fy_node_engine(n), l->gen.kv_budget, &ev, &kv_cap)) {
        fy_kvm_seq_deinit(&l->bt);
        fy_node_error(n, rid, id, FY_ERR_INVALID, "kv_budget %d is more than this decode worker allows (kv.evict)",
                      l->gen.kv_budget);
        fy_free(prompt);
        fy_free(l);
        return;
    }
    if (!(st = fy_kvm_seq_lookup(kvm, &l->bt, prompt, l->n_prompt, &hit)) &&
        !(st = fy_kvm_admit(kvm, fy_kvm_blocks_for_capped(kvm, l->n_prompt, max_tokens, hit, kv_cap), &l->resv))) {
        int32_t left = (l->n_prompt + bs - 1) / bs - hit / bs;
        l->slots = ev.policy == FY_EVICT_NONE ? 0 : fy_evict_max_blocks(&ev, bs, 0);
        if (l->slots > left) l->slots = left;
        st = l->slots ? fy_kvm_seq_reserve_slots(kvm, &l->bt, l->n_prompt, l->slots, &l->resv)
                      : fy_kvm_seq_reserve_from(kvm, &l->bt, l->n_prompt, l->n_prompt, &l->resv);
    }
    if (st) {
        d->refused++;
        fy_metric_inc(d->m.reserve_refused);
        int32_t free_now = fy_kvm_admittable(kvm), n_prompt = l->n_prompt;
        lease_free(d, l);
        fy_node_error(n, rid, id, st,
                      "cannot reserve %d prompt tokens (%d cached) and %d to generate: %d blocks admittable", n_prompt,
                      hit, max_tokens, free_now);
        return;
    }
    const void *blob; /* where the KV goes: every rank's target, for a group */
    size_t blob_len;
    if ((st = fy_xgroup_target_desc(fy_node_xfer(n), &blob, &blob_len))) {
        lease_free(d, l);
        fy_node_error(n, rid, id, st, "no transfer engine to take the prompt's KV (shutting down)");
        return;
    }
    /* the prompt's blocks from the first not cached, per KV group: -1 for
     * those a sliding group does not hold (the prefill worker sends none);
     * under a KV budget, each group's slots in order from there (or from
     * its window), -1 past the prompt */
    int32_t first = hit / bs, per = l->slots ? l->slots : l->bt.n_blocks - first, ng = l->bt.n_groups;
    int32_t *list = fy_malloc((size_t)per * (size_t)ng * sizeof(int32_t));
    if (!list) {
        lease_free(d, l);
        fy_node_error(n, rid, id, FY_ERR_NOMEM, "out of memory for a reservation's block list");
        return;
    }
    for (int32_t g = 0; g < ng; g++) {
        const int32_t *tab = fy_block_table_group(&l->bt, g);
        int32_t from = l->slots && l->bt.lo[g] > first ? l->bt.lo[g] : first;
        for (int32_t i = 0; i < per; i++)
            list[g * per + i] = from + i >= l->bt.lo[g] && from + i < l->bt.n_blocks ? tab[from + i] : -1;
    }
    for (int32_t i = 0; i < per * ng; i++) l->n_recv += list[i] >= 0;
    /* staged: the prefill worker writes into staging slots, one per block
     * it sends; they go to the blocks above at adoption */
    fy_xstage_t *stage = fy_node_stage(n);
    if (stage && l->n_recv > 0) {
        int32_t need = l->n_recv;
        l->stage_slots = fy_malloc(2 * (size_t)need * sizeof(int32_t));
        if (!l->stage_slots) {
            fy_free(list);
            lease_free(d, l);
            fy_node_error(n, rid, id, FY_ERR_NOMEM, "out of memory for a reservation's staging list");
            return;
        }
        l->stage_blocks = l->stage_slots + need;
        if (fy_xstage_take(stage, need, true, l->stage_slots) < need) {
            /* busy (other leases hold slots: the router queues the request
             * again, as for blocks), or never (more than the whole area) */
            fy_xstage_stats_t ss;
            fy_xstage_stats(stage, &ss);
            d->refused++;
            fy_metric_inc(d->m.reserve_refused);
            fy_free(list);
            lease_free(d, l);
            fy_node_error(n, rid, id, need > ss.slots ? FY_ERR_INVALID : FY_ERR_NO_SPACE,
                          "kv staging exhausted: the prompt needs %d staging blocks, %d of %d are free%s "
                          "(worker.kv_staging_blocks)",
                          need, ss.free, ss.slots, need > ss.slots ? " and it can never fit" : "");
            return;
        }
        l->n_stage = need;
        for (int32_t i = 0, k = 0; i < per * ng; i++) {
            if (list[i] < 0) continue;
            l->stage_blocks[k] = list[i];
            list[i] = l->stage_slots[k++];
        }
    }
    l->n_cached = hit;
    l->id = id;
    l->lease = ++d->next_lease;
    l->t_reserved = fy_now_s();
    l->deadline = l->t_reserved + lease_s;
    l->next = d->leases;
    d->leases = l;
    d->n_leases++;
    l->held = fy_block_table_held(&l->bt);
    d->leased_blocks += l->held;
    d->reserved++;
    fy_wire_reserved_t rm = {.ev = fy_node_ev(n, rid, id),
                             .lease = l->lease,
                             .lease_s = lease_s,
                             .cached = hit,
                             .first_block = first,
                             .blocks = list,
                             .n_blocks = per * ng,
                             .target = blob,
                             .target_len = blob_len,
                             .slots = l->slots};
    fy_msgw_t w;
    fy_wire_reserved_write(&w, &rm);
    fy_free(list);
    fy_node_push(n, &w);
    fy_debug("request %llu: lease %llu, %d blocks (%d tokens cached), %.1f s", (unsigned long long)id,
             (unsigned long long)l->lease, l->bt.n_blocks - first, hit, lease_s);
}

/* ---- adopt and stream -------------------------------------------------------------------------- */

static void on_event(void *arg, const fy_event_t *ev)
{
    dreq_t *q = arg;
    decode_t *d = q->d;
    fy_node_t *n = d->n;
    fy_msgw_t w;
    switch (ev->kind) {
    case FY_EVENT_TOKEN: {
        fy_wire_token_t m = {.ev = fy_node_ev(n, 0, q->id),
                             .n = q->n++,
                             .token = ev->token,
                             .text = ev->text,
                             .text_len = ev->len,
                             .has_logprob = q->logprobs,
                             .logprob = ev->logprob,
                             .top_ids = (int32_t *)ev->top_ids, /* written, not kept */
                             .n_top_ids = ev->n_top,
                             .top_logprobs = (float *)ev->top_logprobs,
                             .n_top_logprobs = ev->n_top,
                             .more = ev->more};
        fy_wire_token_write(&w, &m);
        fy_node_push(n, &w);
        return;
    }
    case FY_EVENT_FINISH:
        if ((unsigned)ev->reason <= FY_FINISH_CALLBACK) fy_metric_inc(d->m.success[ev->reason]);
        fy_metric_observe(d->m.e2e, ev->timings->e2e_s);
        fy_metric_observe(d->m.kv_kept, (double)ev->timings->n_kv_kept);
        fy_metric_observe_f32(d->m.itl, ev->timings->itl_s, ev->timings->n_itl);
        fy_wire_finish_t m = {
            .ev = fy_node_ev(n, 0, q->id),
            .text = ev->text,
            .text_len = ev->len,
            .n = q->n,
            .timings = {.e2e_s = ev->timings->e2e_s,
                        .n_generated = ev->timings->n_generated,
                        .n_preempted = ev->timings->n_preempted,
                        .n_cached = ev->timings->n_cached,    /* colocated: the engine's own prefix hit */
                        .itl_s = (float *)ev->timings->itl_s, /* written, not kept */
                        .n_itl = ev->timings->n_itl}};
        snprintf(m.reason, sizeof(m.reason), "%s", fy_finish_reason_str(ev->reason));
        fy_wire_finish_write(&w, &m);
        fy_node_push(n, &w);
        break;
    case FY_EVENT_ERROR:
        fy_metric_inc(d->m.failed);
        if (ev->timings) {
            fy_metric_observe(d->m.e2e, ev->timings->e2e_s);
            fy_metric_observe_f32(d->m.itl, ev->timings->itl_s, ev->timings->n_itl);
        }
        fy_node_error(n, 0, q->id, ev->status, "%s", ev->message);
        break;
    case FY_EVENT_PROGRESS: return;
    case FY_EVENT_PROMPT_LOGPROBS: /* colocated: before the first token */
        fy_node_push_prompt_logprobs(n, q->id, -1, ev);
        return;
    }
    req_unlink(d, q);
    fy_free(q);
}

static dreq_t *req_link(decode_t *d, uint64_t id, bool logprobs)
{
    dreq_t *q = fy_calloc(1, sizeof(*q));
    if (!q) return NULL;
    q->d = d;
    q->id = id;
    q->logprobs = logprobs;
    q->next = d->reqs;
    if (d->reqs) d->reqs->prev = q;
    d->reqs = q;
    d->n_reqs++;
    return q;
}

static void cmd_adopt(decode_t *d, fy_msgr_t *r, uint64_t rid)
{
    fy_node_t *n = d->n;
    fy_wire_lim_t lim = command_lim(n);
    fy_wire_adopt_t m;
    fy_wire_adopt_init(&m);
    if (fy_wire_adopt_read(r, &lim, &m)) {
        fy_node_error(n, rid, m.id, r->status, "bad adopt: %s", r->err);
        return;
    }
    uint64_t id = m.id, lease = m.lease;
    int32_t first = m.first_token, ns = m.n_rng;
    float logprob = (float)m.logprob;
    lease_t *l = lease_find(d, id, lease);
    if (!l) {
        fy_wire_adopt_clear(&m);
        fy_node_error(n, rid, id, FY_ERR_NOT_FOUND, "no lease %llu for request %llu (expired or released)",
                      (unsigned long long)lease, (unsigned long long)id);
        return;
    }
    if (!l->slots != !m.n_kept) {
        fy_wire_adopt_clear(&m);
        fy_node_error(n, rid, id, FY_ERR_INVALID,
                      l->slots ? "adopt without the kept blocks for a KV budget's reservation"
                               : "adopt with kept blocks for a reservation of every prompt block");
        return;
    }
    lease_unlink(d, l);
    fy_metric_observe(d->m.lease_wait, fy_now_s() - l->t_reserved);
    /* staged: the prompt's blocks from the staging slots into the pool,
     * before they are placed or read */
    fy_status_t st = FY_OK;
    if (l->n_stage > 0) {
        if ((st = fy_xstage_in(fy_node_stage(n), l->stage_slots, l->stage_blocks, l->n_stage))) {
            fy_wire_adopt_clear(&m);
            lease_free(d, l);
            fy_node_error(n, rid, id, st, "kv staging: copying the prompt's blocks into the kv pool failed: %s",
                          fy_status_str(st));
            return;
        }
        fy_xstage_give(fy_node_stage(n), l->stage_slots, l->n_stage);
        l->n_stage = 0;
    }
    fy_node_kv_moved(n, l->n_recv, (int64_t)l->n_recv * (int64_t)fy_kvm_layout(fy_node_kvm(n))->block_bytes);
    /* a KV budget: the blocks go where the kept ones belong; the scores
     * spread over the prompt's blocks */
    float *scores = NULL;
    if (l->slots) {
        st = fy_kvm_seq_place(fy_node_kvm(n), &l->bt, m.kept, m.n_kept, &l->resv);
        if (!st && m.n_scores && !(scores = fy_calloc((size_t)l->bt.n_blocks, sizeof(float)))) st = FY_ERR_NOMEM;
        for (int32_t k = 0; scores && k < m.n_scores; k++) scores[m.kept[k]] = m.scores[k];
    }
    if (st) {
        fy_wire_adopt_clear(&m);
        lease_free(d, l);
        fy_node_error(n, rid, id, st, "cannot place the kept blocks of a KV budget (see the worker's log): %s",
                      fy_status_str(st));
        return;
    }
    /* linked first: the first token's events may end it inside adopt */
    dreq_t *q = req_link(d, id, l->gen.logprobs);
    if (!q) {
        fy_free(scores);
        fy_wire_adopt_clear(&m);
        lease_free(d, l);
        fy_node_error(n, rid, id, FY_ERR_NOMEM, "out of memory adopting a request");
        return;
    }
    /* the prefill worker's K/V are in the blocks now: name the full ones */
    fy_kvm_seq_commit(fy_node_kvm(n), &l->bt, l->prompt, l->n_prompt, &l->resv);
    fy_request_ctx_t ctx = {.ns = l->ns,
                            .kv_scores = scores,
                            .first_top_ids = m.top_ids,
                            .first_top_logprobs = m.top_logprobs,
                            .n_first_top = m.n_top_ids};
    fy_rng_t rng;
    memcpy(rng.s, m.rng, sizeof(rng.s));
    fy_wire_ack_t a = {.ev = fy_node_ev(n, rid, id)};
    fy_msgw_t w;
    fy_wire_adopted_write(&w, &a);
    fy_node_push(n, &w); /* before the first token's event: the router reads them in order */
    st = fy_engine_adopt(fy_node_engine(n), l->prompt, l->n_prompt, &l->gen, &ctx, &l->bt, &l->resv, first, logprob,
                         ns ? &rng : NULL, on_event, q, &q->engine_id);
    fy_free(scores);
    fy_wire_adopt_clear(&m); /* the engine copied what it keeps */
    if (st) {
        req_unlink(d, q);
        fy_free(q);
        lease_free(d, l);
        fy_node_error(n, 0, id, st, "cannot adopt the request: %s", fy_status_str(st));
        return;
    }
    d->adopted++;
    lease_free(d, l); /* its table and promise moved into the engine: frees the rest */
}

/*
 * Colocated mode (a deployment without prefill workers): the whole
 * request, prompt and all, runs in this worker's engine.  Replies
 * "adopted" once the engine took it, then streams like an adopted one.
 */
static void cmd_generate(decode_t *d, fy_msgr_t *r, uint64_t rid)
{
    fy_node_t *n = d->n;
    fy_wire_lim_t lim = command_lim(n);
    fy_wire_reserve_t m;
    fy_wire_cmd_generate_init(&m);
    if (fy_wire_cmd_generate_read(r, &lim, &m)) {
        fy_node_error(n, rid, m.id, r->status, "bad generate: %s", r->err);
        return;
    }
    uint64_t id = m.id;
    int32_t *prompt = m.tokens, n_prompt = m.n_tokens; /* freed here once the engine copied them */
    m.tokens = NULL;
    if (m.gen.spec == FY_SPEC_DRAFT && !fy_engine_has_draft(fy_node_engine(n))) {
        fy_node_error(n, rid, id, FY_ERR_INVALID,
                      "speculative decoding 'draft' asked for; this decode worker has no "
                      "draft model (decode.spec)");
        fy_free(prompt);
        return;
    }
    if (d->n_leases + d->n_reqs >= fy_node_max_seqs(n)) {
        d->refused++;
        fy_node_error(n, rid, id, FY_ERR_NO_SPACE, "busy: %d running and %d reserved of %d sequences", d->n_reqs,
                      d->n_leases, fy_node_max_seqs(n));
        fy_free(prompt);
        return;
    }
    fy_request_ctx_t ctx = {0};
    fy_node_ns(n, m.tenant, &ctx.ns);
    dreq_t *q = req_link(d, id, m.gen.logprobs);
    if (!q) {
        fy_free(prompt);
        fy_node_error(n, rid, id, FY_ERR_NOMEM, "out of memory for a request");
        return;
    }
    fy_status_t st = fy_engine_submit(fy_node_engine(n), prompt, n_prompt, &m.gen, &ctx, on_event, q, &q->engine_id);
    fy_free(prompt); /* the engine copied it */
    if (st) {
        req_unlink(d, q);
        fy_free(q);
        if (st == FY_ERR_OVERLOADED) d->refused++;
        fy_node_error(n, rid, id, st == FY_ERR_OVERLOADED ? FY_ERR_NO_SPACE : st, "cannot take the request: %s",
                      st == FY_ERR_INVALID && *fy_engine_refusal() ? fy_engine_refusal() : fy_status_str(st));
        return;
    }
    d->generated++;
    fy_wire_ack_t a = {.ev = fy_node_ev(n, rid, id)};
    fy_msgw_t w;
    fy_wire_adopted_write(&w, &a);
    fy_node_push(n, &w);
}

/* Pushes a lease's deadline to lease_s from now (never earlier than it
 * was): the router renews leases whose prompt its prefill worker is still
 * working on.  not_found when the lease is gone (it expired: the router
 * has its lease_expired). */
static void cmd_renew(decode_t *d, fy_msgr_t *r, uint64_t rid)
{
    fy_wire_renew_t m;
    fy_wire_renew_init(&m);
    if (fy_wire_renew_read(r, NULL, &m)) {
        fy_node_error(d->n, rid, m.id, r->status, "bad renew: %s", r->err);
        return;
    }
    uint64_t id = m.id, lease = m.lease;
    double lease_s = m.lease_s;
    lease_t *l = lease_find(d, id, lease);
    if (!l) {
        fy_node_error(d->n, rid, id, FY_ERR_NOT_FOUND, "no lease %llu for request %llu to renew (expired or released)",
                      (unsigned long long)lease, (unsigned long long)id);
        return;
    }
    if (lease_s > d->max_lease) lease_s = d->max_lease; /* the cap holds for renewals too */
    double until = fy_now_s() + lease_s;
    if (until > l->deadline) l->deadline = until;
    d->renewed++;
    fy_wire_renewed_t rm = {.ev = fy_node_ev(d->n, rid, id), .lease = l->lease, .lease_s = lease_s};
    fy_msgw_t w;
    fy_wire_renewed_write(&w, &rm);
    fy_node_push(d->n, &w);
}

/* Ends a lease, or a running request, of the router's request id. */
static void cmd_release(decode_t *d, fy_msgr_t *r, uint64_t rid)
{
    fy_wire_release_t m;
    fy_wire_release_init(&m);
    if (fy_wire_release_read(r, NULL, &m)) {
        fy_node_error(d->n, rid, 0, r->status, "bad release: %s", r->err);
        return;
    }
    uint64_t id = m.id;
    lease_t *l = lease_find(d, id, 0);
    if (l) {
        lease_unlink(d, l);
        lease_free(d, l);
        d->released++;
    }
    dreq_t *q = req_find(d, id);
    if (q) fy_engine_cancel(fy_node_engine(d->n), q->engine_id);
}

/* ---- the role ----------------------------------------------------------------------------------- */

static fy_status_t d_start(fy_node_t *n, void **state_p)
{
    decode_t *d = fy_calloc(1, sizeof(*d));
    fy_status_t st = d ? FY_OK : FY_ERR_NOMEM;
    if (st) return st;
    /* by default as long as the router asks (router.lease, the same file) */
    d->max_lease = fy_node_conf(n)->max_lease;
    d->n = n;
    fy_metrics_t *reg = fy_node_metrics(n);
    st = fy_metrics_histogram(
        reg, "ferry:decode_request_latency_seconds",
        "On a decode worker: from adoption (the first token, sampled by the prefill worker) to the request's end.",
        NULL, fy_metrics_e2e_buckets, fy_metrics_n_e2e_buckets, &d->m.e2e);
    if (!st)
        st = fy_metrics_histogram(reg, "ferry:decode_inter_token_latency_seconds",
                                  "Time between consecutive tokens of a request.", NULL, fy_metrics_itl_buckets,
                                  fy_metrics_n_itl_buckets, &d->m.itl);
    static const double kept_buckets[] = {16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768};
    if (!st)
        st = fy_metrics_histogram(reg, "ferry:request_kv_kept_tokens",
                                  "Tokens whose K/V a finished request held at its end: its whole length, or what "
                                  "its KV budget kept (kv.evict).",
                                  NULL, kept_buckets, (int)(sizeof(kept_buckets) / sizeof(kept_buckets[0])),
                                  &d->m.kv_kept);
    if (!st)
        st = fy_metrics_histogram(reg, "ferry:kv_lease_wait_seconds",
                                  "From reserving blocks for a prompt to adopting it (the prefill and KV transfer, "
                                  "as this worker sees them).",
                                  NULL, fy_metrics_ttft_buckets, fy_metrics_n_ttft_buckets, &d->m.lease_wait);
    for (int r = FY_FINISH_LENGTH; !st && r <= FY_FINISH_CALLBACK; r++) {
        const char *reason = fy_finish_reason_str((fy_finish_reason_t)r);
        st = fy_metrics_counter(reg, "ferry:decode_request_success_total", "Requests finished, by why they finished.",
                                (const char *const[]){"finished_reason", reason, NULL}, &d->m.success[r]);
    }
    if (!st)
        st = fy_metrics_counter(reg, "ferry:decode_request_failure_total",
                                "Adopted requests that ended with an error (cancelled, shutting down, compute).", NULL,
                                &d->m.failed);
    if (!st)
        st = fy_metrics_gauge(reg, "ferry:kv_leases", "Leases held: blocks reserved for prompts being prefilled.", NULL,
                              &d->m.leases);
    if (!st) st = fy_metrics_gauge(reg, "ferry:kv_leased_blocks", "Blocks held by leases.", NULL, &d->m.leased_blocks);
    if (!st)
        st = fy_metrics_counter(reg, "ferry:kv_leases_expired_total",
                                "Leases that reached their deadline before adoption; their blocks went back.", NULL,
                                &d->m.expired);
    if (!st)
        st = fy_metrics_counter(reg, "ferry:kv_reserve_refused_total",
                                "Reservations refused: no sequence slot or not enough blocks.", NULL,
                                &d->m.reserve_refused);
    if (st) {
        fy_free(d);
        return st;
    }
    *state_p = d;
    return FY_OK;
}

static void d_command(fy_node_t *n, void *state, const char *type, fy_msgr_t *r, uint64_t rid)
{
    decode_t *d = state;
    if (fy_wire_reserve_is(r))
        cmd_reserve(d, r, rid);
    else if (fy_wire_adopt_is(r))
        cmd_adopt(d, r, rid);
    else if (fy_wire_release_is(r))
        cmd_release(d, r, rid);
    else if (fy_wire_renew_is(r))
        cmd_renew(d, r, rid);
    else if (fy_wire_cmd_generate_is(r))
        cmd_generate(d, r, rid);
    else
        fy_node_error(n, rid, 0, FY_ERR_UNSUPPORTED, "unknown command '%s' for a decode worker", type);
}

static void d_tick(fy_node_t *n, void *state, double now)
{
    decode_t *d = state;
    lease_t **p = &d->leases;
    while (*p) {
        lease_t *l = *p;
        if (l->deadline > now) {
            p = &l->next;
            continue;
        }
        lease_unlink(d, l);
        d->expired++;
        fy_metric_inc(d->m.expired);
        fy_warn("request %llu: lease %llu expired; its %d blocks go back", (unsigned long long)l->id,
                (unsigned long long)l->lease, l->held);
        fy_wire_lease_expired_t m = {.ev = fy_node_ev(n, 0, l->id), .lease = l->lease};
        fy_msgw_t w;
        fy_wire_lease_expired_write(&w, &m);
        fy_node_push(n, &w);
        lease_free(d, l);
    }
    fy_metric_set(d->m.leases, d->n_leases);
    fy_metric_set(d->m.leased_blocks, d->leased_blocks);
}

static void d_load(fy_node_t *n, void *state, fy_wire_load_t *m)
{
    decode_t *d = state;
    m->has_decode = true;
    m->leases = d->n_leases;
    m->leased_blocks = d->leased_blocks;
    m->leases_expired = d->expired;
    m->leases_renewed = d->renewed;
    m->adopted = d->adopted;
    m->reserve_refused = d->refused;
}

/* leases go back; running requests end (errors pushed) when the engine is
 * destroyed, and their callbacks still need d */
static void d_stop(fy_node_t *n, void *state)
{
    decode_t *d = state;
    while (d->leases) {
        lease_t *l = d->leases;
        lease_unlink(d, l);
        lease_free(d, l);
    }
}

/* a router is gone (cluster.etcd): its leases go back at once, its
 * running requests are cancelled (their ends go nowhere) */
static void d_forget(fy_node_t *n, void *state, uint32_t tag)
{
    decode_t *d = state;
    int leases = 0, reqs = 0;
    for (lease_t **p = &d->leases; *p;) {
        lease_t *l = *p;
        if (fy_node_id_tag(l->id) != tag) {
            p = &l->next;
            continue;
        }
        lease_unlink(d, l);
        lease_free(d, l);
        d->released++;
        leases++;
    }
    for (dreq_t *q = d->reqs; q; q = q->next)
        if (fy_node_id_tag(q->id) == tag) {
            fy_engine_cancel(fy_node_engine(n), q->engine_id);
            reqs++;
        }
    if (leases || reqs) fy_warn("its router is gone: %d lease(s) released, %d request(s) cancelled", leases, reqs);
}

static void d_destroy(void *state) { fy_free(state); }

const fy_node_role_t fy_decode_role = {
    .name = "decode",
    .start = d_start,
    .command = d_command,
    .tick = d_tick,
    .load = d_load,
    .forget = d_forget,
    .stop = d_stop,
    .destroy = d_destroy,
};

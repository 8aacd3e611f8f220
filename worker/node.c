/*
 * node.c - a worker process around one engine (see node.h): start-up from
 * the configuration, the command intake, load reports, shutdown.
 *
 * Start-up order: configuration, model, backend, runner (the KV arena),
 * block manager, engine, transfer engine (registers the arena), the role,
 * then the sockets, so nothing arrives before it can be handled; the
 * heartbeats that announce the worker to the router start only once every
 * listener is bound, and then the supervisor, if any, hears "ready"
 * (fy_cluster_notify_ready).  A listener that cannot be bound ends the
 * start-up with an error naming its address and the cause.
 * Shutdown runs it backwards after SIGINT or SIGTERM: commands stop, the
 * engine thread stops, the transfer engine ends its jobs (their ends are
 * posted to the engine), the role ends what it holds, the engine runs
 * what was posted and ends what is left with errors (each reported to the
 * router), and only then does the event stream close.
 *
 * The command socket takes only a router's authenticated messages
 * (envelope.h, rpc/rpc.h) and every command must name this
 * incarnation in "to"; events go out sealed as this worker.
 *
 * Metrics and health (docs/operations.md): the engine tick copies the
 * engine's, block manager's and transfer engine's figures into the
 * registry and refreshes the health inputs; the HTTP thread only renders
 * the registry and judges those inputs, so it never touches engine state.
 * The HTTP server comes up last and goes after the engine: /health says
 * 503 while the worker drains.
 */
#include "worker/node.h"

#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "kv/bloom.h"
#include "common/clock.h"
#include "common/cluster.h"
#include "common/cpuset.h"
#include "engine/engine_config.h"
#include "rpc/etcd.h"
#include "common/log.h"
#include "rpc/httpd.h"
#include "common/mem.h"
#include "common/metrics.h"
#include "worker/node_metrics.h"
#include "rpc/rpc.h"
#include "common/wire.h"
#include "engine/spec.h"
#include "transfer/xgroup.h"
#include "worker/xstage.h"
#include "worker/worker_config.h"

#define RANK_SYNC_S 1.0       /* a timing report is a command to every rank: not every tick */
#define METRICS_SYNC_S 0.05   /* figures in /metrics are at most this much older than a tick */
#define KV_CHECK_S 10.0       /* between full scans of the block manager for /health */
#define MAX_ROUTERS 16        /* live routers a worker reports to (cluster.etcd) */
#define NODE_AUTH_S 30.0      /* seconds a connection to the command port has to authenticate */
#define NODE_MAX_PROMPT 32768 /* prompt tokens a command carries at most (the router's MAX_PROMPT_TOKENS) */

/* A router this worker reports to (cluster.etcd): its record's identity
 * and the push socket to its events address. */
typedef struct router_link {
    char name[64];
    uint64_t inc;
    uint32_t tag; /* the high bits of its request ids: events about a request go to its router alone */
    char addr[256];
    fy_push_t *push;
    /* its record is not in etcd, but the router still holds its connection
     * (it runs, or is stopped): its requests go on, as after an etcd
     * outage or a deleted record, which its router writes again */
    bool unlisted;
    /* its record went (its requests here were ended): no more load
     * reports, but replies to what it still sends get through, should it
     * come back under the same identity before LINK_LINGER_S (a router
     * whose lease expired while it was stopped registers again) */
    bool gone;
    double gone_at;
} router_link_t;

#define LINK_LINGER_S 30.0

#include <sodium.h>

#define EXIT_GROUP_BROKEN 3 /* a rank of the worker's group died or failed */
#define GROUP_DRAIN_S 2.0   /* the most a broken group's worker waits for its engine to end its requests */

struct fy_node {
    /* the rank group (engine thread): broken_at > 0 once a rank died or
     * failed; the worker then reports itself out of service with
     * group_why, lets the engine end its requests, and exits with
     * EXIT_GROUP_BROKEN for its supervisor (`ferry serve`) to start the
     * whole group again */
    double broken_at;
    char group_why[160];
    volatile sig_atomic_t exit_code;
    const fy_node_role_t *role;
    void *state;
    fy_node_conf_t conf; /* read once at start (worker_config.h); its secrets wiped once used */
    char name[64];
    char listen[256], events[256];
    uint64_t incarnation;
    fy_model_t *model;
    char model_id[64];
    /* backend, runner, hasher, block manager, a decode worker's speculative
     * draft (or NULL) and the engine (engine_config.h) */
    fy_engine_stack_t stack;
    fy_kvm_t *kvm;        /* stack.kvm */
    fy_engine_t *engine;  /* stack.engine */
    fy_kv_layout_t whole; /* the whole model's KV layout (tp = pp = 1) */
    fy_xgroup_t *xfer;    /* one transfer engine per rank of the model's group (one for one process) */
    /* worker.kv_transfer: how KV moves (the memory xfer registered), the
     * staging area when staged, and what moved (engine thread) */
    fy_xfer_mem_t kv_mem;
    fy_xstage_t *stage;
    fy_node_path_series_t *path_series;
    uint64_t kv_moved_blocks, kv_moved_bytes;
    fy_env_auth_t auth; /* this worker's control-plane credentials */
    fy_pull_t *cmds;
    fy_pull_t *cmds_stats; /* cmds, for the engine thread's metrics: under health_mu */
    fy_push_t *out;        /* the one router at router.events (no cluster.etcd) */
    /* cluster.etcd: the routers come from the membership thread, under
     * links_mu; an event goes to the router whose tag its request id
     * carries, load reports and other id-less events to every one */
    bool etcd;
    fy_membership_t *members;
    pthread_mutex_t links_mu;
    router_link_t links[MAX_ROUTERS];
    int n_links;
    fy_metric_t *ctl_refused[FY_ENV_N_FAULTS]; /* commands refused, by fault (0 unused) */
    int32_t max_seqs;
    double heartbeat_s, last_load;
    uint64_t commands, bad_commands, stale_commands;
    uint8_t *bloom;
    uint32_t bloom_bytes;
    /* heartbeats come from a thread of their own, so a long engine step
     * (a big prompt chunk on a busy host) never looks like a dead worker:
     * the engine thread leaves its latest load report here, and the
     * heartbeat thread sends it, or an "alive" note when nothing is new */
    pthread_t hb;
    bool hb_on, hb_stop;
    pthread_mutex_t hb_mu;
    pthread_cond_t hb_cv;
    void *snap;
    size_t snap_len;
    bool snap_new;
    _Atomic double last_tick;
    /* metrics and health: the registry and series are filled on the
     * engine thread; health inputs are left under health_mu */
    fy_metrics_t *metrics;
    fy_node_series_t *series;
    fy_httpd_t *http;
    char metrics_url[256];
    double stall_s, last_sync, last_kv_check;
    /* the rank group's own series: each rank's pool bytes and where its
     * time went (fy_runner_timing, read every RANK_SYNC_S) */
    double last_rank_sync;
    struct {
        fy_metric_t *kv_bytes, *phase[4];
    } ranks[FY_XGROUP_MAX_RANKS];
    fy_status_t kv_check;
    pthread_mutex_t health_mu;
    fy_health_t health;
    _Atomic bool up;
};

const fy_node_conf_t *fy_node_conf(const fy_node_t *n) { return &n->conf; }
fy_engine_t *fy_node_engine(fy_node_t *n) { return n->engine; }
fy_kvm_t *fy_node_kvm(fy_node_t *n) { return n->kvm; }
fy_runner_t *fy_node_runner(fy_node_t *n) { return n->stack.runner; }
const fy_model_t *fy_node_model(const fy_node_t *n) { return n->model; }
fy_xgroup_t *fy_node_xfer(fy_node_t *n) { return n->xfer; }
fy_xstage_t *fy_node_stage(fy_node_t *n) { return n->stage; }

void fy_node_kv_moved(fy_node_t *n, int64_t blocks, int64_t bytes)
{
    n->kv_moved_blocks += (uint64_t)blocks;
    n->kv_moved_bytes += (uint64_t)bytes;
}

double fy_node_heartbeat(const fy_node_t *n) { return n->heartbeat_s; }
int32_t fy_node_max_seqs(const fy_node_t *n) { return n->max_seqs; }
fy_metrics_t *fy_node_metrics(fy_node_t *n) { return n->metrics; }

void fy_node_ns(const fy_node_t *n, const char *tenant, fy_kv_ns_t *ns)
{
    fy_kv_ns_make(n->stack.hasher, tenant, n->model_id, &n->whole, NULL, ns);
}

/* Sends an event's bytes (cluster.etcd): to the router its request id
 * names, or to every router when it names none; dropped when that router
 * is gone (its requests are being ended here, see forget_router). */
static fy_status_t send_routed(fy_node_t *n, const void *buf, size_t len, bool all)
{
    uint32_t tag = 0;
    if (!all) {
        fy_msgr_t r;
        fy_wire_ev_t h = {0};
        if (fy_msgr_parse(&r, buf, len) == FY_OK) fy_wire_ev_read(&r, &h);
        fy_msgr_free(&r);
        tag = (uint32_t)(h.id >> 32);
    }
    fy_status_t st = tag ? FY_ERR_NOT_FOUND : FY_OK;
    pthread_mutex_lock(&n->links_mu);
    for (int i = 0; i < n->n_links; i++) {
        if (tag ? n->links[i].tag != tag : n->links[i].gone) continue;
        st = fy_push_send(n->links[i].push, buf, len);
    }
    pthread_mutex_unlock(&n->links_mu);
    return st;
}

fy_status_t fy_node_push(fy_node_t *n, fy_msgw_t *w)
{
    if (!n->etcd) return fy_push_msgw(n->out, w);
    void *buf;
    size_t len;
    fy_status_t st = fy_msgw_finish(w, &buf, &len);
    if (st) return st;
    st = send_routed(n, buf, len, false);
    fy_free(buf);
    return st;
}

fy_wire_ev_t fy_node_ev(const fy_node_t *n, uint64_t rid, uint64_t id)
{
    fy_wire_ev_t h = {.inc = n->incarnation, .rid = rid, .id = id};
    snprintf(h.worker, sizeof(h.worker), "%s", n->name);
    return h;
}

void fy_node_push_prompt_logprobs(fy_node_t *n, uint64_t id, int64_t attempt, const fy_event_t *ev)
{
    int32_t nt = ev->n_rows * ev->n_top;
    fy_wire_prompt_logprobs_t m = {.ev = fy_node_ev(n, 0, id),
                                   .has_attempt = attempt >= 0,
                                   .attempt = attempt >= 0 ? (int32_t)attempt : 0,
                                   .first = ev->first,
                                   .k = ev->n_top,
                                   .logprobs = (float *)ev->prompt_lps, /* written, not kept */
                                   .n_logprobs = ev->n_rows,
                                   .ranks = (int32_t *)ev->prompt_rank,
                                   .n_ranks = ev->n_rows,
                                   .top_ids = (int32_t *)ev->top_ids,
                                   .n_top_ids = nt,
                                   .top_logprobs = (float *)ev->top_logprobs,
                                   .n_top_logprobs = nt};
    fy_msgw_t w;
    fy_wire_prompt_logprobs_write(&w, &m);
    fy_node_push(n, &w);
}

void fy_node_error(fy_node_t *n, uint64_t rid, uint64_t id, fy_status_t st, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fy_warn("request %llu: %s", (unsigned long long)id, msg);
    fy_wire_ev_error_t m = {.ev = fy_node_ev(n, rid, id)};
    snprintf(m.code, sizeof(m.code), "%s", fy_status_tag(st));
    snprintf(m.message, sizeof(m.message), "%.*s", (int)sizeof(m.message) - 1, msg); /* the wire's limit */
    fy_msgw_t w;
    fy_wire_ev_error_write(&w, &m);
    fy_node_push(n, &w);
}

/* ---- commands ---------------------------------------------------------------------------------- */

typedef struct cmd {
    fy_node_t *n;
    size_t len;
    unsigned char buf[];
} cmd_t;

/* engine thread */
static void run_command(fy_engine_t *e, void *arg)
{
    cmd_t *c = arg;
    fy_node_t *n = c->n;
    fy_msgr_t r;
    n->commands++;
    if (fy_msgr_parse(&r, c->buf, c->len) != FY_OK) {
        n->bad_commands++;
        fy_node_error(n, 0, 0, r.status, "bad command: %s", r.err);
        goto out;
    }
    /* every command names the incarnation it is for: one that does not (a
     * release or cancel of a guessed request id) is refused */
    fy_wire_cmd_t h = {0};
    fy_wire_cmd_read(&r, &h);
    uint64_t rid = h.rid, to = h.to;
    if (!fy_msgr_ok(&r)) {
        n->bad_commands++;
        fy_node_error(n, 0, 0, r.status, "bad command '%s': %s", fy_msgr_type(&r), r.err);
        goto out;
    }
    if (to != n->incarnation) { /* queued for an earlier run of this worker */
        n->stale_commands++;
        fy_debug("dropped a '%s' command addressed to an earlier incarnation", fy_msgr_type(&r));
        goto out;
    }
    n->role->command(n, n->state, fy_msgr_type(&r), &r, rid);
out:
    fy_msgr_free(&r);
    fy_free(c);
}

/* nng thread: a command the role handles here, not on the engine thread */
static bool run_direct(fy_node_t *n, const void *buf, size_t len)
{
    fy_msgr_t r;
    bool done = false;
    fy_wire_cmd_t h = {0};
    if (fy_msgr_parse(&r, buf, len) == FY_OK && fy_wire_cmd_read(&r, &h) == FY_OK && h.to == n->incarnation)
        done = n->role->direct(n, n->state, fy_msgr_type(&r), &r);
    fy_msgr_free(&r); /* anything wrong is reported by the engine thread's pass */
    return done;
}

/* nng thread: copy, and hand to the engine thread (the pull let only a
 * router's authenticated commands through) */
static void on_command(void *arg, const fy_env_hdr_t *from, const void *buf, size_t len)
{
    fy_node_t *n = arg;
    if (n->role->direct && run_direct(n, buf, len)) return;
    cmd_t *c = fy_malloc(sizeof(*c) + len);
    if (!c) {
        fy_error("out of memory for a command of %zu bytes; dropped", len);
        return;
    }
    c->n = n;
    c->len = len;
    memcpy(c->buf, buf, len);
    if (fy_engine_post(n->engine, run_command, c) != FY_OK) fy_free(c);
}

/* ---- load reports ---------------------------------------------------------------------------------- */

static void bloom_add(void *arg, const fy_kv_hash_t *h)
{
    fy_node_t *n = arg;
    fy_bloom_add(n->bloom, n->bloom_bytes, h);
}

static void send_load(fy_node_t *n)
{
    fy_engine_stats_t es;
    fy_kvm_stats_t ks;
    fy_engine_stats(n->engine, &es);
    fy_kvm_stats(n->kvm, &ks);
    memset(n->bloom, 0, n->bloom_bytes);
    fy_kvm_foreach_name(n->kvm, FY_KV_DEVICE, bloom_add, n);
    fy_wire_load_t m = {.ev = fy_node_ev(n, 0, 0),
                        .block_size = fy_kvm_layout(n->kvm)->block_size,
                        .ctx = fy_runner_params(n->stack.runner)->max_ctx,
                        .running = es.running,
                        .waiting = es.waiting,
                        .swapped = es.swapped,
                        .max_seqs = n->max_seqs,
                        .total_blocks = ks.tier[FY_KV_DEVICE].total,
                        .free_blocks = ks.tier[FY_KV_DEVICE].free,
                        .cached_blocks = ks.tier[FY_KV_DEVICE].cached,
                        .admittable = fy_kvm_admittable(n->kvm),
                        .has_capacity = true,
                        .capacity = fy_kvm_capacity(n->kvm),
                        .kv_usage = ks.usage,
                        .prefix_queries = ks.query_tokens,
                        .prefix_hits = ks.hit_tokens,
                        .preemptions = es.preemptions_recompute + es.preemptions_swap,
                        .bad_commands = n->bad_commands,
                        .bloom = n->bloom,
                        .bloom_len = n->bloom_bytes};
    snprintf(m.role, sizeof(m.role), "%s", n->role->name);
    snprintf(m.listen, sizeof(m.listen), "%s", n->listen);
    snprintf(m.model, sizeof(m.model), "%s", n->model_id);
    if (n->stack.group) {
        const fy_runner_params_t *rp = fy_runner_params(n->stack.runner);
        m.tp = rp->tp > 1 ? rp->tp : 1;
        m.pp = rp->pp > 1 ? rp->pp : 1;
        if (n->broken_at > 0) snprintf(m.out_of_service, sizeof(m.out_of_service), "%s", n->group_why);
    }
    if (n->role->load) n->role->load(n, n->state, &m);
    fy_msgw_t w;
    fy_wire_load_write(&w, &m);
    void *buf;
    size_t len;
    if (fy_msgw_finish(&w, &buf, &len) != FY_OK) return;
    pthread_mutex_lock(&n->hb_mu);
    fy_free(n->snap);
    n->snap = buf;
    n->snap_len = len;
    n->snap_new = true;
    pthread_mutex_unlock(&n->hb_mu);
}

static void *hb_main(void *arg)
{
    fy_node_t *n = arg;
    pthread_mutex_lock(&n->hb_mu);
    while (!n->hb_stop) {
        if (n->snap_new) {
            if (n->etcd)
                send_routed(n, n->snap, n->snap_len, true);
            else
                fy_push_send(n->out, n->snap, n->snap_len);
            n->snap_new = false;
        } else {
            fy_wire_alive_t m = {.ev = fy_node_ev(n, 0, 0), .busy_s = fy_now_s() - n->last_tick};
            fy_msgw_t w;
            fy_wire_alive_write(&w, &m);
            fy_node_push(n, &w);
        }
        struct timespec ts;
        fy_deadline_in(CLOCK_REALTIME, n->heartbeat_s, &ts);
        pthread_cond_timedwait(&n->hb_cv, &n->hb_mu, &ts);
    }
    pthread_mutex_unlock(&n->hb_mu);
    return NULL;
}

/* ---- routers from etcd (cluster.etcd) -------------------------------------------------------------- */

typedef struct forget {
    fy_node_t *n;
    uint32_t tag;
    char name[64];
} forget_t;

/* engine thread: a router is gone, and with it whoever would take the
 * tokens of its requests: the role ends its leases, jobs and requests */
static void run_forget(fy_engine_t *e, void *arg)
{
    forget_t *f = arg;
    fy_info("router %s is gone: ending its requests (ids %08x...)", f->name, f->tag);
    if (f->n->role->forget) f->n->role->forget(f->n, f->n->state, f->tag);
    fy_free(f);
}

/* whether a live record other than l's own names l's events address (a
 * new router there: a connection to it says nothing of l's) */
static bool addr_taken(const router_link_t *l, const fy_member_t *live, int n_live)
{
    for (int k = 0; k < n_live; k++)
        if (!strcmp(live[k].addr, l->addr) && (strcmp(live[k].name, l->name) || live[k].inc != l->inc)) return true;
    return false;
}

/* membership thread: after every watch round that reached etcd, the live
 * routers; links to the gone ones close (their requests end), new ones
 * open.  A router is gone when its record is and it no longer holds its
 * connection: an etcd outage or a deleted record alone end nothing. */
static void on_routers(void *arg, const fy_member_t *live, int n_live)
{
    fy_node_t *n = arg;
    uint32_t gone[MAX_ROUTERS];
    char gone_name[MAX_ROUTERS][64];
    fy_push_t *closed[MAX_ROUTERS];
    int n_gone = 0, n_closed = 0;
    bool added = false;
    double now = fy_now_s();
    pthread_mutex_lock(&n->links_mu);
    for (int i = 0; i < n->n_links;) {
        router_link_t *l = &n->links[i];
        bool listed = false;
        for (int k = 0; k < n_live && !listed; k++)
            listed = !strcmp(live[k].name, l->name) && live[k].inc == l->inc && live[k].tag == l->tag;
        bool replaced = false;
        for (int k = 0; k < n_live && !replaced; k++) replaced = !listed && !strcmp(live[k].name, l->name);
        if (!listed && !l->gone && !replaced && fy_push_connected(l->push) && !addr_taken(l, live, n_live)) {
            if (!l->unlisted)
                fy_warn("router %s: its etcd record is gone, but it still holds its connection: its requests go on",
                        l->name);
            l->unlisted = true;
            i++;
            continue;
        }
        if (listed && l->unlisted) fy_info("router %s is listed in etcd again", l->name);
        l->unlisted = false;
        if (listed && l->gone) { /* back under the same identity */
            l->gone = false;
            added = true;
            fy_info("router %s is back: events to it again", l->name);
        } else if (!listed && !l->gone) {
            l->gone = true;
            l->gone_at = now;
            snprintf(gone_name[n_gone], sizeof(gone_name[n_gone]), "%s", l->name);
            gone[n_gone++] = l->tag;
        }
        /* a link another identity of the same name replaces, or one gone for long, closes */
        if (l->gone && (replaced || now - l->gone_at > LINK_LINGER_S)) {
            closed[n_closed++] = l->push;
            n->links[i] = n->links[--n->n_links];
            continue;
        }
        i++;
    }
    for (int k = 0; k < n_live; k++) {
        const fy_member_t *m = &live[k];
        if (strcmp(m->kind, "router")) continue;
        bool known = false;
        for (int i = 0; i < n->n_links && !known; i++) known = !strcmp(n->links[i].name, m->name);
        if (known) continue;
        if (n->n_links == MAX_ROUTERS) {
            fy_warn("router %s not used: %d routers already", m->name, MAX_ROUTERS);
            continue;
        }
        router_link_t *l = &n->links[n->n_links];
        memset(l, 0, sizeof(*l));
        fy_env_peer_t to = {.role = FY_ROLE_ROUTER}; /* its events are for that router alone */
        snprintf(to.name, sizeof(to.name), "%s", m->name);
        if (fy_push_create(m->addr, 8192, &n->auth, &to, &l->push) != FY_OK) {
            fy_error("router %s: cannot push events to %s", m->name, m->addr);
            continue;
        }
        snprintf(l->name, sizeof(l->name), "%s", m->name);
        snprintf(l->addr, sizeof(l->addr), "%s", m->addr);
        l->inc = m->inc;
        l->tag = m->tag;
        n->n_links++;
        added = true;
        fy_info("router %s joined: events to %s", m->name, m->addr);
    }
    pthread_mutex_unlock(&n->links_mu);
    for (int i = 0; i < n_closed; i++) fy_push_destroy(closed[i]);
    for (int i = 0; i < n_gone; i++) {
        fy_warn("router %s left the cluster (its etcd record is gone)", gone_name[i]);
        forget_t *f = fy_malloc(sizeof(*f));
        if (!f) continue;
        *f = (forget_t){.n = n, .tag = gone[i]};
        snprintf(f->name, sizeof(f->name), "%.63s", gone_name[i]);
        if (fy_engine_post(n->engine, run_forget, f) != FY_OK) fy_free(f);
    }
    if (added) { /* a new router hears of this worker now, not a heartbeat later */
        pthread_mutex_lock(&n->hb_mu);
        if (n->snap) n->snap_new = true;
        pthread_cond_signal(&n->hb_cv);
        pthread_mutex_unlock(&n->hb_mu);
    }
}

/* ---- metrics and health ---------------------------------------------------------------------------- */

/* engine thread: the figures into the registry, the health inputs under health_mu */
static void sync_metrics(fy_node_t *n, double now)
{
    fy_engine_stats_t es;
    fy_kvm_stats_t ks;
    fy_xfer_stats_t xs;
    fy_engine_stats(n->engine, &es);
    fy_kvm_stats(n->kvm, &ks);
    fy_xgroup_stats(n->xfer, &xs);
    fy_node_series_sync(n->series, &es, &ks, &xs, n->bad_commands);
    fy_xstage_stats_t ss;
    fy_xstage_stats(n->stage, &ss);
    fy_node_path_figures_t pf = {.blocks = n->kv_moved_blocks,
                                 .bytes = n->kv_moved_bytes,
                                 .mem_refusals = xs.mem_refusals,
                                 .staged = n->stage != NULL,
                                 .staging_slots = ss.slots,
                                 .staging_free = ss.free,
                                 .staging_waits = ss.waits,
                                 .staging_exhausted = ss.exhausted,
                                 .staging_copy_failures = ss.copy_failures};
    fy_node_path_series_sync(n->path_series, &pf);
    if (now - n->last_kv_check >= KV_CHECK_S) { /* a full scan: not on every tick */
        n->last_kv_check = now;
        n->kv_check = fy_kvm_check(n->kvm); /* logs what broke */
    }
    double waited;
    fy_status_t xst = fy_xgroup_health(n->xfer, now, n->stall_s, &waited);
    if (xst == FY_ERR_TIMEOUT && n->health.xfer != FY_ERR_TIMEOUT)
        fy_error("transfer thread has not answered for %.1f s", waited);
    pthread_mutex_lock(&n->health_mu);
    if (n->cmds_stats) {
        uint64_t refused[FY_ENV_N_FAULTS] = {0};
        fy_pull_refused(n->cmds_stats, refused);
        for (int i = 1; i < FY_ENV_N_FAULTS; i++) fy_metric_set(n->ctl_refused[i], (double)refused[i]);
    }
    n->health.kv_balanced = ks.balanced;
    n->health.kv_check = n->kv_check;
    n->health.xfer = xst;
    n->health.xfer_waited = waited;
    n->health.running = es.running;
    n->health.waiting = es.waiting;
    n->health.kv_usage = ks.usage;
    pthread_mutex_unlock(&n->health_mu);
}

/* nng thread */
static void on_metrics(void *arg, const char *path, fy_http_reply_t *reply)
{
    fy_node_t *n = arg;
    fy_httpd_reply_metrics(reply, n->metrics);
}

/* nng thread */
static void on_health(void *arg, const char *path, fy_http_reply_t *reply)
{
    fy_node_t *n = arg;
    fy_health_t h;
    pthread_mutex_lock(&n->health_mu);
    h = n->health;
    pthread_mutex_unlock(&n->health_mu);
    h.up = n->up;
    h.last_tick = n->last_tick;
    char *body = fy_malloc(512);
    if (!body) {
        reply->status = 503;
        return;
    }
    reply->status = fy_health_eval(&h, fy_now_s(), body, 512);
    reply->content_type = "application/json";
    reply->body = body;
    reply->body_len = strlen(body);
    reply->body_owned = 1;
}

/* engine thread, between passes: each rank's time since the last report */
static void sync_ranks(fy_node_t *n)
{
    fy_runner_timing_t t[FY_XGROUP_MAX_RANKS];
    int32_t nr = fy_runner_n_ranks(n->stack.runner);
    if (fy_runner_timing(n->stack.runner, t, nr, true) != FY_OK) return; /* broken: check_group says so */
    for (int32_t r = 0; r < nr; r++) {
        const uint64_t ns[4] = {t[r].compute_ns, t[r].allreduce_ns, t[r].wait_ns, t[r].send_ns};
        for (int k = 0; k < 4; k++) fy_metric_add(n->ranks[r].phase[k], (double)ns[k] * 1e-9);
    }
}

/* The group's series: per rank its pool's bytes (the same block ids on
 * every rank; a pipeline stage's bytes follow its layers) and its time. */
static fy_status_t rank_series(fy_node_t *n, int32_t n_pages)
{
    static const char *const phases[4] = {"compute", "collective", "pipeline_wait", "send"};
    fy_status_t st = FY_OK;
    for (int32_t r = 0; r < fy_xgroup_n_ranks(n->xfer) && st == FY_OK; r++) {
        char rank[16];
        snprintf(rank, sizeof(rank), "%d", (int)r);
        const char *l[] = {"rank", rank, NULL};
        st = fy_metrics_gauge(n->metrics, "ferry:rank_kv_bytes",
                              "Bytes of KV pool on each rank of the worker's group (every rank holds the same block "
                              "ids, each its own layers and heads of them)",
                              l, &n->ranks[r].kv_bytes);
        if (st == FY_OK)
            fy_metric_set(n->ranks[r].kv_bytes, (double)n_pages * (double)fy_xgroup_layout(n->xfer, r)->block_bytes);
        for (int k = 0; k < 4 && st == FY_OK; k++) {
            const char *lp[] = {"rank", rank, "phase", phases[k], NULL};
            st = fy_metrics_counter(n->metrics, "ferry:rank_seconds_total",
                                    "Time of each rank of the worker's group by phase: compute, collective (tensor "
                                    "ranks' gathers and reductions), pipeline_wait (a stage waiting for the one "
                                    "before: bubbles), send",
                                    lp, &n->ranks[r].phase[k]);
        }
    }
    return st;
}

/* A follower rank can die while the group is idle; nothing but this
 * looks then.  Once broken: out of service at once (health, load report),
 * and out of the process when the engine has ended what it held, or after
 * GROUP_DRAIN_S. */
static void check_group(fy_node_t *n, const fy_engine_stats_t *es, double now)
{
    if (!n->stack.group) return;
    if (n->broken_at == 0) {
        char why[160];
        if (fy_group_poll(n->stack.group, why, sizeof(why)) == FY_OK) return;
        for (char *c = why; *c; c++) /* it goes into JSON and log lines as it is */
            if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20) *c = '\'';
        n->broken_at = now;
        pthread_mutex_lock(&n->health_mu);
        snprintf(n->group_why, sizeof(n->group_why), "rank group broken: %.140s", why);
        snprintf(n->health.group, sizeof(n->health.group), "%s", n->group_why);
        pthread_mutex_unlock(&n->health_mu);
        fy_error("%s: out of service; requests here end with errors, then the worker exits (status %d) for its "
                 "supervisor to start the group again",
                 n->group_why, EXIT_GROUP_BROKEN);
        n->last_load = now;
        send_load(n); /* the router hears it now, not at the next heartbeat */
        pthread_mutex_lock(&n->hb_mu);
        pthread_cond_signal(&n->hb_cv);
        pthread_mutex_unlock(&n->hb_mu);
        return;
    }
    /* the engine ends running and waiting requests at its next pass (every
     * pass fails in a broken group); leases and jobs end with the process */
    pthread_mutex_lock(&n->hb_mu);
    bool told = !n->snap_new; /* the out-of-service report has gone out */
    pthread_mutex_unlock(&n->hb_mu);
    if (!n->exit_code && ((told && es->running == 0 && es->waiting == 0 && now - n->broken_at > 0.2) ||
                          now - n->broken_at > GROUP_DRAIN_S)) {
        n->exit_code = EXIT_GROUP_BROKEN;
        kill(getpid(), SIGTERM); /* the main thread's sigwait: the usual shutdown */
    }
}

/* engine thread, after every step and at least every heartbeat */
static void on_tick(void *arg)
{
    fy_node_t *n = arg;
    double now = fy_now_s();
    n->last_tick = now; /* read by the heartbeat and HTTP threads */
    fy_engine_stats_t es;
    fy_engine_stats(n->engine, &es);
    check_group(n, &es, now);
    if (n->stack.group && n->broken_at == 0 && now - n->last_rank_sync >= RANK_SYNC_S) {
        n->last_rank_sync = now;
        sync_ranks(n);
    }
    fy_node_series_step(n->series, &es);
    if (n->role->tick) n->role->tick(n, n->state, now);
    if (now - n->last_sync >= METRICS_SYNC_S) {
        n->last_sync = now;
        sync_metrics(n, now);
    }
    if (now - n->last_load >= n->heartbeat_s) {
        n->last_load = now;
        send_load(n);
    }
}

/* ---- start-up and shutdown ------------------------------------------------------------------------- */

static fy_status_t setup(fy_node_t *n, const fy_node_role_t *role)
{
    fy_node_conf_t *nc = &n->conf;
    const char *sec = role->name, *listen = nc->listen, *transports = nc->transports;
    const char *net_devices = nc->net_devices, *kv_transfer = nc->kv_transfer, *cpus = nc->cpus;
    int64_t staging_blocks = nc->staging_blocks;
    double heartbeat = nc->heartbeat, stall = nc->stall;
    fy_engine_build_t *ebp = &nc->eb, eb; /* eb: a copy for the stack, the tick added */
    fy_status_t st;
    if (*cpus) { /* first, so that every thread started below inherits the mask */
        char what[32];
        fy_cpuset_t set;
        snprintf(what, sizeof(what), "%s.cpus", sec);
        if ((st = fy_cpuset_parse(what, cpus, &set)) || (st = fy_cpuset_apply(what, &set))) return st;
        fy_info("%s = %s: pinned to %d CPU(s)", what, cpus, fy_cpuset_count(&set));
    }
    eb = *ebp;
    /* a rank group's arenas lie in one shared mapping that rank 0's
     * engines register directly (xgroup.h), and groups run on the CPU
     * alone: staging them is refused before anything is loaded */
    int32_t shape = (eb.runner.tp > 1 ? eb.runner.tp : 1) * (eb.runner.pp > 1 ? eb.runner.pp : 1);
    if (!strcmp(kv_transfer, "staged") && shape > 1) {
        fy_error("worker.kv_transfer = staged cannot serve a rank group (worker.tp = %d, worker.pp = %d, or %s.tp/pp): "
                 "its ranks' KV is moved directly from their shared mapping; use worker.kv_transfer = auto or direct",
                 eb.runner.tp, eb.runner.pp, sec);
        return FY_ERR_UNSUPPORTED;
    }
    snprintf(n->name, sizeof(n->name), "%.*s", (int)sizeof(n->name) - 1, nc->name);
    if (!n->name[0]) snprintf(n->name, sizeof(n->name), "%s-%d", sec, (int)getpid());
    fy_log_set_prefix(n->name);
    snprintf(n->listen, sizeof(n->listen), "%s", listen);
    snprintf(n->events, sizeof(n->events), "%s", nc->events);
    n->heartbeat_s = heartbeat;
    n->stall_s = stall;
    snprintf(n->metrics_url, sizeof(n->metrics_url), "%s", nc->metrics);
    n->max_seqs = eb.engine.max_num_seqs;
    if (sodium_init() < 0) return FY_ERR_INTERNAL;
    while (!n->incarnation) randombytes_buf(&n->incarnation, sizeof(n->incarnation));
    if ((st = fy_cluster_auth(nc->secret_file, nc->encrypt, strcmp(sec, "decode") ? FY_ROLE_PREFILL : FY_ROLE_DECODE,
                              n->name, n->incarnation, &n->auth)))
        return st;

    if ((st = fy_model_load(nc->model_path, &n->model))) return st;
    fy_model_id(n->model, n->model_id, sizeof(n->model_id));
    eb.engine.tick_fn = on_tick;
    eb.engine.tick_arg = n;
    eb.engine.tick_s = heartbeat < 0.05 ? heartbeat : 0.05; /* leases are reaped at least this often */
    /* a stuck rank (SIGSTOP, a hung device call) breaks the group when the
     * worker's /health turns 503 for the stall, so that the router hears
     * "out of service" then, not 30 s later while it goes on placing here */
    eb.group_timeout_ms = stall < 0.1 ? 100 : (int32_t)(stall * 1000); /* worker.stall_timeout is at most 1 h */
    st = fy_engine_stack_create(n->model, &eb, &n->stack);
    sodium_memzero(eb.hash_key, sizeof(eb.hash_key)); /* the hasher holds its own copy */
    sodium_memzero(ebp->hash_key, sizeof(ebp->hash_key));
    if (st) return st;
    n->kvm = n->stack.kvm;
    n->engine = n->stack.engine;

    const fy_kv_layout_t *lay = fy_kvm_layout(n->kvm);
    /* the whole model's layout (rank 0's is its shard's): prefix hashes and
     * the membership record must not depend on this worker's shape */
    fy_runner_params_t whole_p = *fy_runner_params(n->stack.runner);
    whole_p.tp = whole_p.pp = 1;
    if ((st = fy_runner_layout_for(n->model, fy_model_config(n->model)->n_layers, &whole_p, &n->whole))) return st;
    fy_kvm_stats_t ks;
    fy_kvm_stats(n->kvm, &ks);
    fy_xgroup_params_t xp = {0};
    snprintf(xp.layout.model_id, sizeof(xp.layout.model_id), "%s", n->model_id);
    xp.layout.dtype = lay->dtype;
    xp.layout.block_size = lay->block_size;
    xp.layout.n_layers = lay->n_layers;
    xp.layout.n_kv_heads = lay->n_kv_heads;
    xp.layout.head_dim = lay->head_dim;
    xp.layout.order = FY_XFER_ORDER_BLOCK_MAJOR;
    xp.layout.scale_format = fy_kv_scale_format(lay);
    xp.layout.block_bytes = lay->block_bytes;
    xp.layout.n_groups = lay->n_groups;
    xp.layout.groups = fy_kv_layout_groups_digest(lay);
    /* rank 0's shard; the group's other ranks' layouts follow from it
     * (xgroup.h), each over its arena in the stack's shared mapping */
    const fy_runner_params_t *rp = fy_runner_params(n->stack.runner);
    xp.tp = rp->tp > 1 ? rp->tp : 1;
    xp.pp = rp->pp > 1 ? rp->pp : 1;
    fy_xfer_layout_whole(&xp.layout);
    if (xp.tp * xp.pp > 1) {
        const fy_model_config_t *mc = fy_model_config(n->model);
        xp.layout.tp = xp.tp, xp.layout.pp = xp.pp;
        xp.layout.model_layers = mc->n_layers;
        xp.layout.model_kv_heads = mc->n_kv_heads;
        xp.arenas = n->stack.arenas;
        xp.arena_stride = n->stack.arena_stride;
    } else {
        xp.arenas = fy_runner_kv_arena(n->stack.runner);
    }
    xp.n_pages = ks.tier[FY_KV_DEVICE].total;
    xp.transports = *transports ? transports : NULL;
    /* how the KV moves: the pool itself, or a staging area of host memory */
    bool dev_mem = fy_backend_device_memory(n->stack.be);
    char why[256];
    if ((st = fy_xstage_choose(kv_transfer, dev_mem, dev_mem && fy_xfer_ucx_cuda(xp.transports), &n->kv_mem, why,
                               sizeof(why)))) {
        fy_error("%s (backend %s)", why, fy_backend_describe(n->stack.be));
        return st;
    }
    xp.mem = n->kv_mem;
    if (n->kv_mem == FY_XFER_MEM_STAGED) {
        int32_t per_prompt =
            (fy_runner_params(n->stack.runner)->max_ctx + lay->block_size - 1) / lay->block_size * lay->n_groups;
        int32_t slots = staging_blocks > 0 ? (int32_t)staging_blocks
                                           : fy_xstage_default_slots(!strcmp(sec, "decode"), xp.n_pages,
                                                                     eb.engine.max_num_seqs, per_prompt);
        fy_xstage_params_t sp = {
            .be = n->stack.be, .lay = lay, .pool = fy_runner_kv_arena(n->stack.runner), .n_slots = slots};
        if ((st = fy_xstage_create(&sp, &n->stage))) return st;
        xp.arenas = fy_xstage_base(n->stage);
        xp.n_pages = slots;
        fy_info(
            "kv transfer: staged (%s); %d staging blocks, %.1f MiB of pinned host memory (worker.kv_staging_blocks)",
            why, slots, (double)fy_xstage_bytes(n->stage) / (1 << 20));
    } else {
        fy_info("kv transfer: %s (%s)", fy_xfer_mem_name(n->kv_mem), why);
    }
    /* UCX listens where the worker was told to listen, not on every
     * interface: worker.net_devices, else UCX_NET_DEVICES, else the
     * interface of the listen address */
    char devs[1024];
    if (*net_devices)
        xp.net_devices = net_devices;
    else if (!getenv("UCX_NET_DEVICES")) {
        if ((st = fy_xfer_devices_for(listen, devs, sizeof(devs)))) return st;
        xp.net_devices = devs;
    }
    xp.connect_timeout_s = 5;
    if (xp.tp * xp.pp > 1 && fy_runner_kv_arena(n->stack.runner) != xp.arenas) { /* never staged: see above */
        fy_error("worker: rank 0's kv arena is not the first of the group's shared mapping");
        return FY_ERR_INTERNAL;
    }
    if ((st = fy_xgroup_create(&xp, &n->xfer))) return st;

    n->bloom_bytes = fy_bloom_bytes_for(ks.tier[FY_KV_DEVICE].total);
    if (!(n->bloom = fy_calloc(n->bloom_bytes, 1))) return FY_ERR_NOMEM;
    /* the registry before the role, which adds its own series */
    const char *served = nc->served;
    bool prefix_caching = nc->prefix_cache;
    fy_node_cache_info_t cache = {.block_size = lay->block_size,
                                  .device_blocks = ks.tier[FY_KV_DEVICE].total,
                                  .host_blocks = ks.tier[FY_KV_HOST].total,
                                  .dtype = fy_dtype_name(lay->dtype),
                                  .prefix_caching = prefix_caching,
                                  .n_groups = lay->n_groups,
                                  .block_bytes = lay->block_bytes};
    if ((st = fy_metrics_create_labeled((const char *const[]){"model_name", served, "role", sec, NULL}, &n->metrics)) ||
        (st = fy_node_series_create(n->metrics, n->name, n->model_id, &cache, ks.tier[FY_KV_HOST].total > 0,
                                    !strcmp(sec, "prefill"), &n->series)))
        return st;
    for (int i = 1; i < FY_ENV_N_FAULTS && !st; i++) {
        const char *l[] = {"reason", fy_env_fault_str((fy_env_fault_t)i), NULL};
        st = fy_metrics_counter(n->metrics, "ferry:control_messages_refused_total",
                                "Commands refused: not authenticated, stale, replayed, or not from a router", l,
                                &n->ctl_refused[i]);
    }
    if (st) return st;
    if (n->stack.group && (st = rank_series(n, ks.tier[FY_KV_DEVICE].total))) return st;
    char path[32];
    snprintf(path, sizeof(path), "%s", fy_xfer_mem_name(n->kv_mem));
    for (char *p = path; *p; p++)
        if (*p == ' ') *p = '_';
    if ((st = fy_node_path_series_create(n->metrics, path, n->stage != NULL, &n->path_series))) return st;
    n->health = (fy_health_t){.role = sec, .worker = n->name, .stall_s = stall, .kv_balanced = ks.balanced};
    n->kv_check = FY_OK;
    if ((st = role->start(n, &n->state))) return st;
    n->role = role;
    n->etcd = nc->members.etcd[0] != 0;
    /* without etcd there is one router, and its name is "router" (router.c) */
    static const fy_env_peer_t the_router = {.role = FY_ROLE_ROUTER, .name = "router"};
    if (!n->etcd && (st = fy_push_create(n->events, 8192, &n->auth, &the_router, &n->out))) return st;
    n->last_tick = fy_now_s();
    n->last_kv_check = n->last_tick - KV_CHECK_S; /* the first sync scans */
    sync_metrics(n, n->last_tick);
    send_load(n);
    if ((st = fy_engine_start(n->engine))) return st;
    if ((st = fy_pull_create(n->listen, &n->auth, FY_RPC_FROM(FY_ROLE_ROUTER), on_command, n, &n->cmds))) return st;
    /* only routers dial here: a few connections not authenticated yet,
     * each holding at most a frame of the largest command for a prompt
     * this worker can take (wire.c's bounds; rpc.h), for NODE_AUTH_S at
     * most.  The deadline is long: a router may stay silent for a while
     * before its first command (its connection is then made again, and a
     * command lost in that moment is the router's timeout to handle) */
    {
        static const char *const to_decode[] = {"router → decode worker"}, *const to_prefill[] = {
                                                                               "router → prefill worker"};
        const fy_kv_layout_t *kl = fy_kvm_layout(n->kvm);
        int32_t ctx = fy_runner_params(n->stack.runner)->max_ctx;
        int32_t mp = ctx < NODE_MAX_PROMPT ? ctx : NODE_MAX_PROMPT;
        fy_wire_lim_t wl = {.max_prompt = mp, .n_prompt = mp, .block_size = kl->block_size, .kv_groups = kl->n_groups};
        fy_rpc_limits_t cl = {.max_msg =
                                  fy_wire_max_route(n->auth.role == FY_ROLE_DECODE ? to_decode : to_prefill, 1, &wl),
                              .max_conns = 2 * MAX_ROUTERS,
                              .max_pending = MAX_ROUTERS,
                              .auth_s = NODE_AUTH_S};
        if (cl.max_msg > FY_RPC_MAX_MSG) cl.max_msg = FY_RPC_MAX_MSG;
        fy_pull_limit(n->cmds, &cl);
        fy_debug("commands before authentication: frames of at most %zu KiB, %d connections", cl.max_msg >> 10,
                 cl.max_conns);
    }
    pthread_mutex_lock(&n->health_mu);
    n->cmds_stats = n->cmds;
    pthread_mutex_unlock(&n->health_mu);
    if (n->metrics_url[0]) {
        fy_httpd_limits_t lim = nc->http_lim; /* slow or idle scrapers cannot take the worker's descriptors */
        if ((st = fy_httpd_create_with(n->metrics_url, &lim, &n->http)) ||
            (st = fy_httpd_route(n->http, "/metrics", on_metrics, n)) ||
            (st = fy_httpd_route(n->http, "/health", on_health, n)))
            return st;
        fy_info("metrics and health on %s (/metrics, /health)", n->metrics_url);
    }
    /* the router hears of us (the heartbeat thread sends the load report
     * left above) only once every listener is bound: a worker whose port
     * someone else holds must not draw the router's commands there */
    if (pthread_create(&n->hb, NULL, hb_main, n)) return FY_ERR_INTERNAL;
    n->hb_on = true;
    if (n->etcd) { /* the routers are whoever etcd lists */
        fy_membership_params_t mp = {.watch = "routers/", .fn = on_routers, .arg = n};
        char dir[32];
        snprintf(dir, sizeof(dir), "workers/%s", sec);
        mp.dir = dir;
        if ((st = fy_membership_params_conf(&mp, &nc->members))) return st;
        snprintf(mp.self.kind, sizeof(mp.self.kind), "%s", sec);
        snprintf(mp.self.name, sizeof(mp.self.name), "%s", n->name);
        mp.self.inc = n->incarnation;
        snprintf(mp.self.addr, sizeof(mp.self.addr), "%s", n->listen);
        snprintf(mp.self.http, sizeof(mp.self.http), "%s", n->metrics_url);
        snprintf(mp.self.model, sizeof(mp.self.model), "%s", n->model_id);
        const fy_kv_layout_t *wl = &n->whole; /* the model's, whatever this worker's shape */
        mp.self.layout = fy_member_layout_hash(wl->block_size, (int32_t)wl->dtype, wl->n_layers, wl->n_kv_heads,
                                               wl->head_dim, wl->block_bytes, fy_kv_layout_groups_digest(wl));
        st = fy_metrics_counter(n->metrics, "ferry:etcd_records_refused_total",
                                "etcd records refused (unsigned, forged, stale, malformed or incompatible), each once",
                                NULL, &mp.refused);
        if (!st) st = fy_membership_start(&mp, &n->members);
        sodium_memzero(mp.key, sizeof(mp.key));
        sodium_memzero(&mp.tls, sizeof(mp.tls));
        if (st) return st;
    }
    n->up = true;
    char desc[256];
    fy_model_describe(n->model, desc, sizeof(desc));
    fy_info("%s worker up: commands on %s, events to %s; %s; kv %d blocks of %d tokens (%zu bytes each)", sec,
            n->listen, n->etcd ? "the routers etcd lists" : n->events, n->model_id, ks.tier[FY_KV_DEVICE].total,
            lay->block_size, lay->block_bytes);
    return FY_OK;
}

static void teardown(fy_node_t *n)
{
    n->up = false; /* /health: 503 while the worker drains */
    pthread_mutex_lock(&n->health_mu);
    n->cmds_stats = NULL;
    pthread_mutex_unlock(&n->health_mu);
    fy_pull_destroy(n->cmds);
    n->cmds = NULL;
    fy_membership_stop(n->members); /* the record goes now; no more router changes */
    n->members = NULL;
    /* the engine thread stops first: it must not hand a block to a job
     * the transfer engine is ending */
    if (n->engine) fy_engine_stop(n->engine);
    fy_xgroup_destroy(n->xfer); /* unfinished jobs end now; their completions post to the engine */
    n->xfer = NULL;
    if (n->role && n->role->stop) n->role->stop(n, n->state); /* leases give their staging blocks back */
    fy_engine_destroy(n->engine); /* posted work runs; requests left end with errors (pushed) */
    n->engine = n->stack.engine = NULL;
    fy_spec_draft_destroy(n->stack.draft); /* after the engine that used it, before the runner it borrows from */
    n->stack.draft = NULL;
    if (n->role && n->role->destroy) n->role->destroy(n->state);
    fy_httpd_destroy(n->http); /* its callbacks read the registry and the health inputs */
    n->http = NULL;
    if (n->hb_on) {
        pthread_mutex_lock(&n->hb_mu);
        n->hb_stop = true;
        pthread_cond_signal(&n->hb_cv);
        pthread_mutex_unlock(&n->hb_mu);
        pthread_join(n->hb, NULL);
    }
    fy_free(n->snap);
    fy_node_series_destroy(n->series);
    fy_node_path_series_destroy(n->path_series);
    fy_metrics_destroy(n->metrics);
    fy_push_destroy(n->out);
    for (int i = 0; i < n->n_links; i++) fy_push_destroy(n->links[i].push);
    n->n_links = 0;
    /* the staging area after everything that could hold a slot (the
     * transfer engine that registered it, the role's leases and jobs), and
     * before the backend that allocated it */
    fy_xstage_destroy(n->stage);
    n->stage = NULL;
    fy_engine_stack_destroy(&n->stack); /* the block manager, hasher, runner and backend */
    n->kvm = NULL;
    fy_model_destroy(n->model);
    fy_node_conf_wipe_secrets(&n->conf);
    fy_free(n->bloom);
    fy_env_auth_wipe(&n->auth);
}

int fy_node_main(int argc, char **argv, const fy_node_role_t *role)
{
    fy_log_crash_reports();
    /* SIGINT and SIGTERM are taken by sigwait below; every thread started
     * from here on inherits the blocked mask */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    fy_cluster_raise_nofile();

    fy_node_t n = {0};
    pthread_mutex_init(&n.hb_mu, NULL);
    pthread_cond_init(&n.hb_cv, NULL);
    pthread_mutex_init(&n.health_mu, NULL);
    pthread_mutex_init(&n.links_mu, NULL);
    /* the configuration is read once, here (worker_config.h) */
    bool loaded;
    fy_status_t st = fy_node_conf_load(
        argc, argv,
        strcmp(role->name, "decode") ? "-c FILE [--set section.key=value]..."
                                     : "-c FILE [--set section.key=value]... [--spec none|ngram|draft:FILE|self:L]",
        role->name, &n.conf, &loaded);
    if (!loaded && st == FY_ERR_CANCELLED) return 0;
    if (!loaded) return 2;
    if (!st) st = setup(&n, role);
    fy_node_conf_wipe_secrets(&n.conf); /* the hasher, credentials and membership hold what they need */
    if (st) {
        fy_error("%s worker: start-up failed: %s", role->name, fy_status_str(st));
        teardown(&n);
        return 1;
    }
    fy_cluster_notify_ready(); /* every listener is bound */
    int sig = 0;
    sigwait(&sigs, &sig);
    fy_info("%s: shutting down", sig == SIGINT ? "SIGINT" : "SIGTERM");
    int code = n.exit_code;
    teardown(&n);
    return code;
}

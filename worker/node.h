/*
 * node.h - a worker process around one engine.
 *
 * A prefill worker and a decode worker are the same process shape: a
 * configuration, the model, a KV pool and its block manager, the engine
 * on its own thread, a UCX transfer engine over the KV arena, a command
 * socket the router pushes to, an event stream back to the router, and a
 * load report every heartbeat.  This file is that shape; a role (prefill
 * or decode) adds its command handlers, its share of the load report and
 * its periodic work.
 *
 * Threads.  Commands arrive on an nng thread, are copied and posted to
 * the engine thread, and every role callback runs there: the role owns
 * its state, the block manager and the engine without locks.  Transfer
 * completions arrive on the transfer thread and must post too.
 */
#ifndef FY_NODE_H
#define FY_NODE_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"
#include "common/genspec.h"
#include "kv/kv.h"
#include "common/metrics.h"
#include "model/model.h"
#include "common/msg.h"
#include "engine/runner.h"
#include "common/status.h"
#include "common/wire.h"
#include "worker/worker_config.h"

typedef struct fy_node fy_node_t;
typedef struct fy_xgroup fy_xgroup_t;

typedef struct fy_node_role {
    const char *name; /* "prefill" or "decode": also its config section */
    /* called once everything is up, before the first command; engine thread not yet running */
    fy_status_t (*start)(fy_node_t *n, void **state_p);
    /* a command from the router (engine thread); rid: the router's id for
     * the reply (0 when none is expected) */
    void (*command)(fy_node_t *n, void *state, const char *type, fy_msgr_t *r, uint64_t rid);
    /* optional: offered every command first, on the nng thread that
     * received it (addressed to this incarnation); true when it handled it.
     * For commands that must not wait behind a long engine step; it must
     * not block or touch what the engine thread owns. */
    bool (*direct)(fy_node_t *n, void *state, const char *type, fy_msgr_t *r);
    /* every engine step and heartbeat (engine thread) */
    void (*tick)(fy_node_t *n, void *state, double now);
    /* fills the role's fields of a load report (engine thread) */
    void (*load)(fy_node_t *n, void *state, fy_wire_load_t *m);
    /* optional (cluster.etcd): the router that made request ids with this
     * tag (fy_node_id_tag) is gone: end every lease, job and request of
     * its (engine thread); nothing of theirs reaches a router any more */
    void (*forget)(fy_node_t *n, void *state, uint32_t tag);
    /* shutting down (engine thread stopped): end what the role holds */
    void (*stop)(fy_node_t *n, void *state);
    /* after the engine is gone (its last events delivered): free state */
    void (*destroy)(void *state);
} fy_node_role_t;

/* The whole worker process: "-c FILE [--set section.key=value]...".
 * Returns the process exit status. */
int fy_node_main(int argc, char **argv, const fy_node_role_t *role);

/* ---- for role code ---- */

const fy_node_conf_t *fy_node_conf(const fy_node_t *n); /* read once at start: worker_config.h */
fy_engine_t *fy_node_engine(fy_node_t *n);
fy_kvm_t *fy_node_kvm(fy_node_t *n);
fy_runner_t *fy_node_runner(fy_node_t *n);
const fy_model_t *fy_node_model(const fy_node_t *n);
/* the KV data plane: one transfer engine per rank (xgroup.h) */
fy_xgroup_t *fy_node_xfer(fy_node_t *n);
/* worker.kv_transfer runs staged: the pinned host staging area the
 * transfer engine registered instead of the KV pool (xstage.h); else NULL */
struct fy_xstage *fy_node_stage(fy_node_t *n);
/* Blocks this worker moved over its KV path, and their bytes (engine
 * thread): ferry:kv_transfer_path_blocks_total and _bytes_total. */
void fy_node_kv_moved(fy_node_t *n, int64_t blocks, int64_t bytes);
/* worker.heartbeat: how often load reports (and a prefill worker's progress) go out */
double fy_node_heartbeat(const fy_node_t *n);
int32_t fy_node_max_seqs(const fy_node_t *n);
/* The worker's metrics registry (served on <role>.metrics at /metrics):
 * a role registers its own series in start() and updates them from its
 * callbacks. */
fy_metrics_t *fy_node_metrics(fy_node_t *n);
/* The prefix-cache namespace of a tenant on this deployment. */
void fy_node_ns(const fy_node_t *n, const char *tenant, fy_kv_ns_t *ns);
/* Sends an event to the router (any thread); w is consumed. */
fy_status_t fy_node_push(fy_node_t *n, fy_msgw_t *w);
/* The header of an event or reply from this worker: its name and
 * incarnation, the command's rid (0: none) and the request id. */
fy_wire_ev_t fy_node_ev(const fy_node_t *n, uint64_t rid, uint64_t id);
/* Sends {type: error, rid, id, code, message}; the message is also logged. */
void fy_node_error(fy_node_t *n, uint64_t rid, uint64_t id, fy_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* Sends an engine's FY_EVENT_PROMPT_LOGPROBS of request id as a
 * "prompt_logprobs" event (attempt < 0: none, a colocated request). */
void fy_node_push_prompt_logprobs(fy_node_t *n, uint64_t id, int64_t attempt, const fy_event_t *ev);
/* The router a request id comes from (cluster.etcd: each router makes
 * its ids with its tag in the high 32 bits; 0 for a single router). */
static inline uint32_t fy_node_id_tag(uint64_t id) { return (uint32_t)(id >> 32); }

#endif /* FY_NODE_H */

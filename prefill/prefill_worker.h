/*
 * prefill_worker.h - the prefill worker's role in a node (worker/node.h):
 * prompts in, KV blocks out over UCX, the first token to the router.
 * bin/ferry-prefill is fy_node_main with this role.
 */
#ifndef FY_PREFILL_WORKER_H
#define FY_PREFILL_WORKER_H

#include "worker/node.h"

extern const fy_node_role_t fy_prefill_role;

#endif /* FY_PREFILL_WORKER_H */

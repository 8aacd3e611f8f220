/*
 * decode_worker.h - the decode worker's role in a node (node.h): leases of
 * KV blocks for incoming prompts, adoption into the batch, token streams.
 * bin/ferry-decode is fy_node_main with this role.
 */
#ifndef FY_DECODE_WORKER_H
#define FY_DECODE_WORKER_H

#include "worker/node.h"

extern const fy_node_role_t fy_decode_role;

#endif /* FY_DECODE_WORKER_H */

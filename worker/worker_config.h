/*
 * worker_config.h - what a worker builds, read from its configuration once
 * at start: the typed fy_engine_build_t the engine's builder takes
 * (engine/engine_config.h), so nothing in engine/ or kv/ reads
 * configuration keys.
 */
#ifndef FY_WORKER_CONFIG_H
#define FY_WORKER_CONFIG_H

#include "common/config.h"
#include "engine/engine_config.h"
#include "common/status.h"

/*
 * What a worker of role ("prefill" or "decode") builds, from c through the
 * key table: ROLE.threads, kv_mem, max_seqs, max_batch_tokens (at least
 * max_seqs), max_waiting, ctx, tp and pp (fy_cluster_ranks); kv.block_size,
 * dtype, prefix_cache, sliding_groups, evict and the prefix hasher's secret
 * (kv.secret_file, copied into the build); worker.device, isa, attn and
 * cuda_graphs; for decode also host_kv_mem and the disk tier, preempt,
 * itl_target and the speculative decoding of decode.spec* (a draft takes
 * decode.spec_draft_kv_fraction of kv_mem).  String members point into c,
 * which must outlive the build.  The caller adds the engine's tick.
 * FY_ERR_INVALID (logged, naming the key) for a bad value; *b_p is set on
 * success only.
 */
fy_status_t fy_worker_build_read(const fy_config_t *c, const char *role, fy_engine_build_t *b_p);

#endif /* FY_WORKER_CONFIG_H */

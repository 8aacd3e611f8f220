/*
 * engine_config.h - one function that builds an engine and what it runs
 * on: the backend, the runner (its KV arena), the prefix hasher, the
 * block manager, a speculative draft when asked, and the engine, from a
 * typed build.
 *
 * A worker fills the build from its configuration, read once at start
 * (worker/worker_config.h: ROLE.*, kv.*, worker.*, decode.spec*); a
 * command that takes its own options (`ferry generate`, the bench
 * commands) starts from fy_engine_build_default and sets what it needs.
 * Both end in fy_engine_stack_create, so every engine is put together the
 * same way.  No configuration keys are read here.
 *
 * Not here: the model (the caller loads it and keeps it for the stack's
 * life), the worker around the engine (node.c), the engine itself
 * (engine.c).
 */
#ifndef FY_ENGINE_CONFIG_H
#define FY_ENGINE_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "engine/engine.h"
#include "engine/group.h"
#include "kv/kv.h"
#include "model/model.h"
#include "engine/runner.h"
#include "engine/spec.h"
#include "common/status.h"

typedef struct fy_engine_build {
    /* backend */
    const char *device; /* "cpu" or "cuda" (fy_backend_create_device); NULL: cpu */
    int threads;        /* 0: one per core; with ranks, split among them (at least 1 each) */
    /* ranks: runner.tp tensor-parallel ranks per stage, runner.pp stages
     * (0 and 1 mean 1); more than one rank forks a group (group.h) */
    const char *isa; /* CPU kernels; NULL: the best this CPU runs */
    bool attn_bf16;  /* worker.attn = bf16: CPU prefill attention in bf16 arithmetic */
    /* runner */
    fy_runner_params_t runner;
    int64_t host_kv_mem;  /* bytes of host tier for swapped blocks, in whole blocks; 0: none */
    const char *disk_dir; /* the disk tier under the host tier (kv.h); NULL: none */
    int64_t disk_bytes;
    /* the prefix hasher's key: the deployment's secret (kv.secret_file, as the
     * worker read it), so every worker and the router name blocks alike;
     * hash_key_len 0: a key private to the process */
    uint8_t hash_key[64];
    size_t hash_key_len;
    /* block manager */
    bool prefix_caching;
    float watermark; /* share of device blocks admission keeps free; < 0: the block manager's default */
    /* a speculative draft: "draft:FILE" or "self:L" (fy_spec_draft_open), or NULL */
    const char *draft;
    int64_t draft_kv_mem; /* its KV arena; 0: as many blocks as the target's */
    /* the engine; with no_engine the stack ends at the block manager (and
     * draft), for a caller that drives the runner or makes its own engines */
    bool no_engine;
    fy_engine_params_t engine;
    /* with ranks: every rank's device KV arena in one shared mapping made
     * before the fork (runner.kv_arenas), so that rank 0's transfer engine
     * can put into and read from every rank's KV (a worker's group) */
    bool shared_arenas;
    /* a worker's role ("prefill", "decode": fy_worker_build_read): its pool,
     * sized from ROLE.kv_mem, must admit one request of the whole context;
     * else refused at start naming ROLE.kv_mem and ROLE.ctx, or, with
     * ROLE.ctx = 0 (the model's trained context), a warning naming the
     * longest request it admits.  NULL: not checked (the caller
     * sized the pool for its context: fy_kv_pool_blocks) */
    const char *role;
    /* with ranks: a rank that does not arrive at a collective within this
     * is stuck, and the group breaks (group.h's timeout_ms); 0: its 30 s */
    int32_t group_timeout_ms;
} fy_engine_build_t;

/* The runner's and engine's defaults, cpu, one thread per core, prefix
 * caching on, a random hasher, no draft. */
void fy_engine_build_default(fy_engine_build_t *b);

/* What fy_engine_stack_create makes; members are NULL where not made. */
typedef struct fy_engine_stack {
    fy_group_t *group; /* the rank group when tp * pp > 1 (this process is rank 0) */
    fy_backend_t *be;
    fy_runner_t *runner;
    fy_kv_hasher_t *hasher;
    fy_kvm_t *kvm;
    fy_spec_draft_t *draft;
    fy_engine_t *engine;
    /* shared_arenas: the mapping, rank r's arena at arenas + r * arena_stride */
    void *arenas;
    size_t arenas_bytes, arena_stride;
} fy_engine_stack_t;

/* Builds, in order, the backend, runner, hasher, block manager, draft and
 * engine for model m (which must outlive the stack), the draft wired into
 * the engine's speculative parameters.  The component that fails logs
 * why; what was made is destroyed and *s_p is untouched.
 *
 * With b->runner.tp * pp > 1 it first checks the shape (fy_runner_check_shape)
 * and forks the group's other ranks, before any thread exists: each
 * creates its own backend and shard runner and follows rank 0 until the
 * stack is destroyed, then _exits (status 0, or 1 when its shard failed);
 * it never returns here.  Not with a group: a speculative draft, H2O
 * eviction, a device other than the CPU, a KV pool sized from free memory
 * alone (FY_ERR_UNSUPPORTED or FY_ERR_INVALID, logged). */
fy_status_t fy_engine_stack_create(const fy_model_t *m, const fy_engine_build_t *b, fy_engine_stack_t *s_p);
/* Destroys what s holds, the engine first and the backend last (the group
 * after the runner: its other ranks leave and are reaped), and zeroes
 * it.  A caller that must end the engine earlier (a worker that stops it
 * before its transfer engine) destroys it itself and sets it to NULL. */
void fy_engine_stack_destroy(fy_engine_stack_t *s);

#endif /* FY_ENGINE_CONFIG_H */

/*
 * prefill.h - running a prompt through the model in chunks, building its
 * KV cache block by block.
 *
 * The prompt is cut into chunks of at most `chunk` tokens (the runner's
 * batch size bounds it); each chunk reserves the blocks it needs, runs one
 * forward pass, and commits its tokens (full blocks get their prefix-cache
 * names); only the last chunk asks for logits.  Tokens a prefix-cache hit
 * already put in the table are skipped.  Used by the single-sequence
 * generate path now, and by the prefill worker, which ships each finished
 * chunk's blocks to a decode worker from the chunk callback.
 */
#ifndef FY_PREFILL_H
#define FY_PREFILL_H

#include <stdint.h>

#include "kv.h"
#include "runner.h"
#include "status.h"

/* Called after each chunk with the tokens now in the cache; a non-OK
 * return stops the prefill with that status. */
typedef fy_status_t (*fy_prefill_chunk_fn)(void *arg, const fy_block_table_t *bt, int32_t done);

/*
 * Prefills tokens [bt->n_tokens, n) of prompt into bt (the first
 * bt->n_tokens are already cached), taking blocks from kvm (drawing on
 * resv, which may be NULL).  logits (host, vocab_size floats) receives the
 * last token's logits.  On failure the table keeps the blocks of the
 * chunks that completed; the caller releases them.  Returns
 * FY_ERR_NO_SPACE when the pool runs out.
 */
fy_status_t fy_prefill_run(fy_runner_t *runner, fy_kvm_t *kvm, fy_block_table_t *bt, const int32_t *prompt, int32_t n,
                           int32_t chunk, fy_kv_resv_t *resv, fy_prefill_chunk_fn on_chunk, void *arg, float *logits);

#endif /* FY_PREFILL_H */

/* prefill.c - chunked prompt processing into the paged KV cache. */
#include "prefill.h"

#include "log.h"

fy_status_t fy_prefill_run(fy_runner_t *r, fy_kvm_t *kvm, fy_block_table_t *bt, const int32_t *prompt, int32_t n,
                           int32_t chunk, fy_kv_resv_t *resv, fy_prefill_chunk_fn on_chunk, void *arg, float *logits)
{
    const fy_runner_params_t *rp = fy_runner_params(r);
    if (chunk <= 0 || chunk > rp->max_batch_tokens) chunk = rp->max_batch_tokens;
    if (n < 1 || bt->n_tokens >= n) {
        fy_error("prefill: nothing to do (%d of %d tokens cached)", bt->n_tokens, n);
        return FY_ERR_INVALID;
    }
    while (bt->n_tokens < n) {
        int32_t done = bt->n_tokens;
        int32_t k = n - done < chunk ? n - done : chunk;
        fy_status_t st = fy_kvm_seq_reserve(kvm, bt, done + k, resv);
        if (st == FY_ERR_NO_SPACE) {
            fy_error("prefill: kv pool too small for a %d-token prompt (%d blocks free)", n,
                     fy_kvm_n_free(kvm, FY_KV_DEVICE));
            return st;
        }
        if (st != FY_OK) {
            fy_error("prefill: a %d-token prompt does not fit the block table", n);
            return st;
        }
        fy_forward_seq_t f = {bt, prompt + done, k, done, done + k == n ? 1 : 0};
        if ((st = fy_runner_forward(r, &f, 1, logits))) return st;
        fy_kvm_seq_commit(kvm, bt, prompt, done + k);
        if (on_chunk && (st = on_chunk(arg, bt, bt->n_tokens))) return st;
    }
    return FY_OK;
}

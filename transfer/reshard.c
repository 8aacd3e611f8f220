/* reshard.c - KV pieces between rank groups of different shapes (reshard.h). */
#include "transfer/reshard.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"

/* Bytes of one head of one layer's K (or V) in a block, from the shard. */
static bool head_bytes(const fy_xfer_layout_t *l, uint64_t *hb_p)
{
    uint64_t parts = (uint64_t)2 * (uint64_t)l->n_layers * (uint64_t)l->n_kv_heads;
    if (l->n_layers < 1 || l->n_kv_heads < 1 || l->block_bytes == 0 || l->block_bytes % parts) return false;
    *hb_p = l->block_bytes / parts;
    return true;
}

/* A shard that sits inside its model, as its rank's place says. */
bool fy_xfer_layout_shard_ok(const fy_xfer_layout_t *l)
{
    return l->tp >= 1 && l->pp >= 1 && l->tp <= 64 && l->pp <= 64 && l->tp_rank >= 0 && l->tp_rank < l->tp &&
           l->stage >= 0 && l->stage < l->pp && l->model_layers >= 1 && l->model_kv_heads >= 1 && l->layer0 >= 0 &&
           l->n_layers >= 1 && l->layer0 <= l->model_layers - l->n_layers && l->kv_head0 >= 0 && l->n_kv_heads >= 1 &&
           l->kv_head0 <= l->model_kv_heads - l->n_kv_heads;
}

/* The shard of rank (stage, tp_rank) of a model of model_layers layers and
 * model_kv_heads KV heads: the splits of kv/kvplan.h (fy_kv_tp_heads,
 * fy_kv_pp_layers; transfer/ sits below kv/, so the lines are repeated
 * here, and test_xfer's re-sharding test builds its layouts with kvplan's
 * functions, so the two cannot drift apart).  False when the heads do not
 * split over tp. */
static bool shard_of_rank(const fy_xfer_layout_t *l, int32_t *first_p, int32_t *count_p, int32_t *kv0_p, int32_t *nkv_p)
{
    int32_t base = l->model_layers / l->pp, extra = l->model_layers % l->pp;
    *first_p = l->stage * base + (l->stage < extra ? l->stage : extra);
    *count_p = base + (l->stage < extra);
    if (l->model_kv_heads % l->tp == 0) {
        *nkv_p = l->model_kv_heads / l->tp;
        *kv0_p = l->tp_rank * *nkv_p;
    } else if (l->tp % l->model_kv_heads == 0) {
        *nkv_p = 1;
        *kv0_p = l->tp_rank / (l->tp / l->model_kv_heads);
    } else {
        return false;
    }
    return true;
}

/* Is l's shard the one its rank holds? */
static bool shard_where_rank_says(const fy_xfer_layout_t *l)
{
    int32_t first, count, kv0, nkv;
    if (!shard_of_rank(l, &first, &count, &kv0, &nkv)) return false;
    return l->layer0 == first && l->n_layers == count && l->kv_head0 == kv0 && l->n_kv_heads == nkv;
}

static fy_status_t refuse(char *why, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static fy_status_t refuse(char *why, size_t cap, const char *fmt, ...)
{
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (why && cap) snprintf(why, cap, "kv re-sharding: %s", msg);
    return FY_ERR_MISMATCH;
}

/* src against one destination rank d (its number in its group, for messages) */
static fy_status_t pair_check(const fy_xfer_layout_t *src, const fy_xfer_layout_t *l, int32_t d, char *why, size_t cap)
{
    uint64_t hs = 0, hd = 0;
    /* a block of several KV groups is one group's page, not [layer][k|v][head]
     * of every layer: its bytes per head are not the block's share */
    bool grouped = l->n_groups != 1 || src->n_groups != 1;
    if (!fy_xfer_layout_shard_ok(src) || !shard_where_rank_says(src) || (!grouped && !head_bytes(src, &hs)))
        return refuse(why, cap,
                      "the source's shard (layers %d+%d of %d, kv heads %d+%d of %d, %llu-byte blocks) is "
                      "not its rank's",
                      src->layer0, src->n_layers, src->model_layers, src->kv_head0, src->n_kv_heads,
                      src->model_kv_heads, (unsigned long long)src->block_bytes);
    if (strncmp(l->model_id, src->model_id, sizeof(l->model_id)))
        return refuse(why, cap, "destination rank %d serves '%.64s', the source '%.64s'", d, l->model_id,
                      src->model_id);
    if (l->dtype != src->dtype || l->block_size != src->block_size || l->head_dim != src->head_dim ||
        l->order != src->order || l->scale_format != src->scale_format)
        return refuse(why, cap,
                      "destination rank %d stores kv differently (dtype %d, block %d, head size %d, "
                      "scales %d; the source %d, %d, %d, %d)",
                      d, l->dtype, l->block_size, l->head_dim, l->scale_format, src->dtype, src->block_size,
                      src->head_dim, src->scale_format);
    if (l->model_layers != src->model_layers || l->model_kv_heads != src->model_kv_heads)
        return refuse(why, cap, "destination rank %d's model has %d layers and %d kv heads, the source's %d and %d", d,
                      l->model_layers, l->model_kv_heads, src->model_layers, src->model_kv_heads);
    if (!fy_xfer_layout_shard_ok(l) || !shard_where_rank_says(l) || (!grouped && (!head_bytes(l, &hd) || hd != hs)) ||
        (d >= 0 && l->stage * l->tp + l->tp_rank != d))
        return refuse(why, cap,
                      "destination rank %d's shard (tp %d x pp %d, rank %d.%d, layers %d+%d, kv heads "
                      "%d+%d, %llu-byte blocks) is not rank %d of its group",
                      d, l->tp, l->pp, l->stage, l->tp_rank, l->layer0, l->n_layers, l->kv_head0, l->n_kv_heads,
                      (unsigned long long)l->block_bytes, d >= 0 ? d : l->stage * l->tp + l->tp_rank);
    /* grouped: only whole pages move, between ranks that hold the same layers
     * and heads grouped alike, or to ranks that hold none of them */
    bool disjoint = src->layer0 >= l->layer0 + l->n_layers || l->layer0 >= src->layer0 + src->n_layers ||
                    src->kv_head0 >= l->kv_head0 + l->n_kv_heads || l->kv_head0 >= src->kv_head0 + src->n_kv_heads;
    if (grouped && !disjoint && !fy_xfer_layout_same_data(src, l))
        return refuse(why, cap,
                      "kv groups (sliding windows: %d groups here, %d at destination rank %d) move only "
                      "between ranks holding the same layers and heads grouped alike",
                      src->n_groups, l->n_groups, d);
    return FY_OK;
}

fy_status_t fy_xfer_layout_for_rank(const fy_xfer_layout_t *l, int32_t tp, int32_t pp, int32_t rank,
                                    fy_xfer_layout_t *out_p)
{
    uint64_t hb = 0;
    fy_xfer_layout_t o = *l;
    o.tp = tp, o.pp = pp;
    o.tp_rank = tp > 0 ? rank % tp : 0, o.stage = tp > 0 ? rank / tp : 0;
    bool grouped = l->n_groups != 1;
    if (!fy_xfer_layout_shard_ok(l) || (!grouped && !head_bytes(l, &hb)) || tp < 1 || pp < 1 || tp > 64 || pp > 64 ||
        tp * pp > 64 || rank < 0 || rank >= tp * pp || pp > l->model_layers ||
        !shard_of_rank(&o, &o.layer0, &o.n_layers, &o.kv_head0, &o.n_kv_heads)) {
        fy_error("kv re-sharding: no rank %d of tp %d x pp %d for a model of %d layers and %d kv heads", rank, tp, pp,
                 l->model_layers, l->model_kv_heads);
        return FY_ERR_MISMATCH;
    }
    if (grouped) { /* pages of KV groups (sliding windows): the same layers, each rank its heads' share */
        if (o.layer0 != l->layer0 || o.n_layers != l->n_layers || l->block_bytes % (uint64_t)l->n_kv_heads) {
            fy_error("kv re-sharding: a rank of tp %d x pp %d cannot be derived from a layout of %d kv groups over "
                     "layers %d+%d (pipeline stages group their layers otherwise)",
                     tp, pp, l->n_groups, l->layer0, l->n_layers);
            return FY_ERR_MISMATCH;
        }
        o.block_bytes = l->block_bytes / (uint64_t)l->n_kv_heads * (uint64_t)o.n_kv_heads;
    } else {
        o.block_bytes = hb * 2 * (uint64_t)o.n_layers * (uint64_t)o.n_kv_heads;
    }
    *out_p = o;
    return FY_OK;
}

bool fy_xfer_layout_same_data(const fy_xfer_layout_t *a, const fy_xfer_layout_t *b)
{
    fy_xfer_layout_t x = *b; /* b with a's place in its group */
    x.tp = a->tp, x.pp = a->pp, x.tp_rank = a->tp_rank, x.stage = a->stage;
    return fy_xfer_layout_diff(a, &x) == NULL;
}

fy_status_t fy_xfer_reshard_pair(const fy_xfer_layout_t *src, const fy_xfer_layout_t *dst, char *why, size_t cap)
{
    return pair_check(src, dst, -1, why, cap);
}

fy_status_t fy_xfer_reshard_check(const fy_xfer_layout_t *src, const fy_xfer_layout_t *dst, int32_t n_dst, char *why,
                                  size_t cap)
{
    if (n_dst < 1 || n_dst > 64 || n_dst != dst[0].tp * dst[0].pp)
        return refuse(why, cap, "%d destination ranks for a group of tp %d x pp %d", n_dst, dst[0].tp, dst[0].pp);
    for (int32_t d = 0; d < n_dst; d++) {
        fy_status_t st = pair_check(src, &dst[d], d, why, cap);
        if (st != FY_OK) return st;
        if (dst[d].tp != dst[0].tp || dst[d].pp != dst[0].pp)
            return refuse(why, cap, "destination rank %d is of a tp %d x pp %d group, rank 0 of tp %d x pp %d", d,
                          dst[d].tp, dst[d].pp, dst[0].tp, dst[0].pp);
    }
    return FY_OK;
}

fy_status_t fy_xfer_reshard_plan(const fy_xfer_layout_t *src, const fy_xfer_layout_t *dst, int32_t n_dst,
                                 fy_xfer_piece_t *pieces, int32_t cap, int32_t *n_p)
{
    char why[240];
    fy_status_t st = fy_xfer_reshard_check(src, dst, n_dst, why, sizeof(why));
    if (st != FY_OK) {
        fy_error("xfer: %s", why);
        return st;
    }
    uint64_t hb = 0;
    bool grouped = src->n_groups != 1 || dst[0].n_groups != 1;
    if (!grouped) (void)head_bytes(src, &hb); /* checked */
    /* of heads the source group keeps on several ranks, the first sends */
    int32_t copies = src->tp > src->model_kv_heads ? src->tp / src->model_kv_heads : 1;
    bool sends = src->tp_rank % copies == 0;
    int32_t n = 0;
    for (int32_t d = 0; d < n_dst && sends; d++) {
        const fy_xfer_layout_t *l = &dst[d];
        if (grouped) { /* pages of the same bytes (checked), or nothing of this rank's */
            if (!fy_xfer_layout_same_data(src, l)) continue;
            if (n == cap) {
                fy_error("xfer: kv re-sharding needs more than %d pieces per block", cap);
                return FY_ERR_NO_SPACE;
            }
            pieces[n++] = (fy_xfer_piece_t){.dst_rank = d, .src_off = 0, .len = src->block_bytes, .dst_off = 0};
            continue;
        }
        int32_t lo = src->layer0 > l->layer0 ? src->layer0 : l->layer0;
        int32_t hi = src->layer0 + src->n_layers < l->layer0 + l->n_layers ? src->layer0 + src->n_layers
                                                                           : l->layer0 + l->n_layers;
        int32_t h0 = src->kv_head0 > l->kv_head0 ? src->kv_head0 : l->kv_head0;
        int32_t h1 = src->kv_head0 + src->n_kv_heads < l->kv_head0 + l->n_kv_heads ? src->kv_head0 + src->n_kv_heads
                                                                                   : l->kv_head0 + l->n_kv_heads;
        if (lo >= hi || h0 >= h1) continue;
        for (int32_t layer = lo; layer < hi; layer++) {
            for (int32_t kv = 0; kv < 2; kv++) {
                uint64_t so = ((uint64_t)(layer - src->layer0) * 2 + (uint64_t)kv) * (uint64_t)src->n_kv_heads * hb +
                              (uint64_t)(h0 - src->kv_head0) * hb;
                uint64_t dof = ((uint64_t)(layer - l->layer0) * 2 + (uint64_t)kv) * (uint64_t)l->n_kv_heads * hb +
                               (uint64_t)(h0 - l->kv_head0) * hb;
                uint64_t len = (uint64_t)(h1 - h0) * hb;
                fy_xfer_piece_t *prev = n ? &pieces[n - 1] : NULL;
                if (prev && prev->dst_rank == d && prev->src_off + prev->len == so &&
                    prev->dst_off + prev->len == dof) {
                    prev->len += len; /* both sides continue: one piece */
                    continue;
                }
                if (n == cap) {
                    fy_error("xfer: kv re-sharding needs more than %d pieces per block", cap);
                    return FY_ERR_NO_SPACE;
                }
                pieces[n++] = (fy_xfer_piece_t){.dst_rank = d, .src_off = so, .len = len, .dst_off = dof};
            }
        }
    }
    *n_p = n;
    return FY_OK;
}

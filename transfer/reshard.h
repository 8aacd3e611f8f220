/*
 * reshard.h - moving KV between rank groups of different shapes: which
 * bytes of a source rank's block go to which destination rank, where.
 *
 * A block is block-major ([layer][k|v][kv_head][token][head_dim], one KV
 * group of every layer the rank holds); a rank holds layers [layer0,
 * layer0 + n_layers) and KV heads [kv_head0, kv_head0 + n_kv_heads) of
 * the model (fy_xfer_layout_t's shard fields).  For every destination
 * rank whose layers and heads meet the source's, the source writes the
 * intersection: per layer one piece for K and one for V (each its heads in
 * the intersection, contiguous on both sides), merged with the next where
 * both sides continue (a whole stage moving to a whole model is one
 * piece).  KV heads that a group keeps on several ranks (more tensor
 * ranks than KV heads): a destination's copies each receive the head; of
 * a source's copies only the first rank holding it sends, so no byte is
 * written twice.  This is the arithmetic only: fy_xfer puts the pieces.
 *
 * Not here: UCX, which blocks move (the workers' lease protocol), KV
 * groups (sliding windows: refused unless both sides hold the whole
 * model alike).
 */
#ifndef FY_RESHARD_H
#define FY_RESHARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "transfer/xfer.h"

/* fy_xfer_piece_t (xfer.h): len bytes at src_off of a source block go to dst_off of dst_rank's block. */

/* Does l's shard sit inside its model where its rank says (tp, pp at most
 * 64, its layers and KV heads within the model's)? */
bool fy_xfer_layout_shard_ok(const fy_xfer_layout_t *l);

/*
 * Do a and b hold the same bytes in the same places: the same model, format,
 * block, groups, layers and KV heads, whatever their group's shape and their
 * rank in it (a tensor rank holding a KV head that its group replicates; a
 * rank of one KV head's model against a whole model)?  Whole blocks may go
 * between such ranks, KV groups (sliding windows) included.
 */
bool fy_xfer_layout_same_data(const fy_xfer_layout_t *a, const fy_xfer_layout_t *b);

/*
 * The layout of rank `rank` of a tp x pp group serving the model of l (any
 * rank's or a whole model's layout: its model, element format, block and
 * head size, groups, and the bytes per head and layer of a block): the
 * shard the splits give that rank, its block bytes from it.
 * FY_ERR_MISMATCH (logged) when l's shard is not sound, the shape out of
 * range, or the model's KV heads do not split over tp.  *out_p on success.
 */
fy_status_t fy_xfer_layout_for_rank(const fy_xfer_layout_t *l, int32_t tp, int32_t pp, int32_t rank,
                                    fy_xfer_layout_t *out_p);

/*
 * Can rank src put pieces into rank dst (one destination rank, as the
 * transfer handshake sees it)?  Everything fy_xfer_reshard_check asks of
 * one destination rank but that the group is whole.
 */
fy_status_t fy_xfer_reshard_pair(const fy_xfer_layout_t *src, const fy_xfer_layout_t *dst, char *why, size_t cap);

/*
 * Can the rank src hand its blocks to the group whose ranks' layouts are
 * dst[0..n_dst) (in rank order)?  The same model, element format, block
 * size and head size; each layout's shard within the model and its block
 * bytes what its shard implies; the destination ranks a whole group
 * (n_dst = tp * pp, each rank where its number says); one KV group on
 * both sides unless both hold the whole model in the same groups.
 * FY_OK, or FY_ERR_MISMATCH with the reason in why ("kv re-sharding: ...").
 */
fy_status_t fy_xfer_reshard_check(const fy_xfer_layout_t *src, const fy_xfer_layout_t *dst, int32_t n_dst, char *why,
                                  size_t cap);

/*
 * The pieces src writes into the group dst[0..n_dst) for one block (the
 * same pieces for every block), by destination rank then offset, into
 * pieces[0..cap): *n_p set on success.  FY_ERR_MISMATCH (logged) where
 * fy_xfer_reshard_check refuses, FY_ERR_NO_SPACE (logged) when cap is too
 * small (2 * n_layers * n_dst pieces always suffice).
 */
fy_status_t fy_xfer_reshard_plan(const fy_xfer_layout_t *src, const fy_xfer_layout_t *dst, int32_t n_dst,
                                 fy_xfer_piece_t *pieces, int32_t cap, int32_t *n_p);

#endif /* FY_RESHARD_H */

/* kv.c - KV layout arithmetic, the block pool and block tables. */
#include "kv.h"

#include <assert.h>

#include "log.h"
#include "mem.h"

fy_status_t fy_kv_layout_init(fy_kv_layout_t *lay, int32_t n_layers, int32_t n_kv_heads, int32_t head_dim,
                              int32_t block_size, fy_dtype_t dtype)
{
    if (block_size != 8 && block_size != 16 && block_size != 32) {
        fy_error("kv: block size %d is not one of 8, 16, 32", block_size);
        return FY_ERR_INVALID;
    }
    if (dtype != FY_DTYPE_F32 && dtype != FY_DTYPE_F16) {
        fy_error("kv: dtype %s is not supported for the kv cache (f32, f16)", fy_dtype_name(dtype));
        return FY_ERR_INVALID;
    }
    if (n_layers < 1 || n_kv_heads < 1 || head_dim < 1) {
        fy_error("kv: bad shape %d layers, %d kv heads, head size %d", n_layers, n_kv_heads, head_dim);
        return FY_ERR_INVALID;
    }
    fy_kv_layout_t l = {
        .n_layers = n_layers,
        .n_kv_heads = n_kv_heads,
        .head_dim = head_dim,
        .block_size = block_size,
        .dtype = dtype,
    };
    l.elem_bytes = (size_t)fy_dtype_info(dtype)->block_bytes;
    l.head_bytes = (size_t)block_size * (size_t)head_dim * l.elem_bytes;
    l.kv_bytes = l.head_bytes * (size_t)n_kv_heads;
    l.layer_bytes = 2 * l.kv_bytes;
    l.block_bytes = l.layer_bytes * (size_t)n_layers;
    *lay = l;
    return FY_OK;
}

/* ---- pool ------------------------------------------------------------------------- */

struct fy_kv_pool {
    int32_t n_blocks;
    int32_t n_free;
    int32_t *free_stack; /* [n_blocks]; the top n_free entries are free */
    int32_t *refcount;   /* [n_blocks] */
};

fy_status_t fy_kv_pool_create(int32_t n_blocks, fy_kv_pool_t **pool_p)
{
    if (n_blocks < 1) {
        fy_error("kv: pool of %d blocks", n_blocks);
        return FY_ERR_INVALID;
    }
    fy_kv_pool_t *p = fy_calloc(1, sizeof(*p));
    if (!p) goto nomem;
    p->free_stack = fy_malloc((size_t)n_blocks * sizeof(int32_t));
    p->refcount = fy_calloc((size_t)n_blocks, sizeof(int32_t));
    if (!p->free_stack || !p->refcount) goto nomem;
    p->n_blocks = p->n_free = n_blocks;
    /* lowest ids on top, so a fresh pool hands out 0, 1, 2, ... */
    for (int32_t i = 0; i < n_blocks; i++) p->free_stack[i] = n_blocks - 1 - i;
    *pool_p = p;
    return FY_OK;
nomem:
    fy_kv_pool_destroy(p);
    fy_error("kv: out of memory for a pool of %d blocks", n_blocks);
    return FY_ERR_NOMEM;
}

void fy_kv_pool_destroy(fy_kv_pool_t *p)
{
    if (!p) return;
    fy_free(p->free_stack);
    fy_free(p->refcount);
    fy_free(p);
}

fy_status_t fy_kv_pool_alloc(fy_kv_pool_t *p, int32_t *block_p)
{
    if (p->n_free == 0) return FY_ERR_NO_SPACE;
    int32_t b = p->free_stack[--p->n_free];
    assert(p->refcount[b] == 0);
    p->refcount[b] = 1;
    *block_p = b;
    return FY_OK;
}

void fy_kv_pool_ref(fy_kv_pool_t *p, int32_t b)
{
    assert(b >= 0 && b < p->n_blocks && p->refcount[b] > 0);
    p->refcount[b]++;
}

void fy_kv_pool_unref(fy_kv_pool_t *p, int32_t b)
{
    assert(b >= 0 && b < p->n_blocks && p->refcount[b] > 0);
    if (--p->refcount[b] == 0) p->free_stack[p->n_free++] = b;
}

int32_t fy_kv_pool_refcount(const fy_kv_pool_t *p, int32_t b) { return p->refcount[b]; }
int32_t fy_kv_pool_n_blocks(const fy_kv_pool_t *p) { return p->n_blocks; }
int32_t fy_kv_pool_n_free(const fy_kv_pool_t *p) { return p->n_free; }

/* ---- block table ------------------------------------------------------------------ */

fy_status_t fy_block_table_init(fy_block_table_t *bt, int32_t block_size, int32_t max_tokens)
{
    if (block_size < 1 || max_tokens < 1) return FY_ERR_INVALID;
    int32_t max_blocks = (max_tokens + block_size - 1) / block_size;
    int32_t *blocks = fy_malloc((size_t)max_blocks * sizeof(int32_t));
    if (!blocks) {
        fy_error("kv: out of memory for a block table of %d blocks", max_blocks);
        return FY_ERR_NOMEM;
    }
    *bt = (fy_block_table_t){.blocks = blocks, .max_blocks = max_blocks, .block_size = block_size};
    return FY_OK;
}

void fy_block_table_deinit(fy_block_table_t *bt)
{
    assert(bt->n_blocks == 0);
    fy_free(bt->blocks);
    bt->blocks = NULL;
    bt->max_blocks = 0;
}

fy_status_t fy_block_table_reserve(fy_block_table_t *bt, fy_kv_pool_t *pool, int32_t n_tokens)
{
    int32_t need = (n_tokens + bt->block_size - 1) / bt->block_size;
    if (need > bt->max_blocks) return FY_ERR_INVALID;
    if (need - bt->n_blocks > fy_kv_pool_n_free(pool)) return FY_ERR_NO_SPACE;
    while (bt->n_blocks < need) {
        fy_status_t st = fy_kv_pool_alloc(pool, &bt->blocks[bt->n_blocks]);
        assert(st == FY_OK); /* checked above */
        (void)st;
        bt->n_blocks++;
    }
    return FY_OK;
}

void fy_block_table_truncate(fy_block_table_t *bt, fy_kv_pool_t *pool, int32_t n_tokens)
{
    int32_t keep = (n_tokens + bt->block_size - 1) / bt->block_size;
    while (bt->n_blocks > keep) fy_kv_pool_unref(pool, bt->blocks[--bt->n_blocks]);
    if (bt->n_tokens > n_tokens) bt->n_tokens = n_tokens;
}

void fy_block_table_release(fy_block_table_t *bt, fy_kv_pool_t *pool)
{
    fy_block_table_truncate(bt, pool, 0);
}

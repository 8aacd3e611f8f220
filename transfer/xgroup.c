/* xgroup.c - a rank group's KV data plane: an engine per rank, jobs per rank pair (xgroup.h). */
#include "transfer/xgroup.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "common/mem.h"
#include "transfer/reshard.h"
#include "transfer/xfer_wire.h"

/* ---- the group descriptor ---------------------------------------------------------------------- */

#define DESC_MAGIC 0x47585946u /* "FYXG" little-endian */
#define DESC_VERSION 1u
#define DESC_HEAD 8u         /* magic, version (u16), tp (u8), pp (u8) */
#define DESC_MAX_BLOB 16384u /* one rank's blob: real ones are a few hundred bytes */
#define DESC_MAX (64u << 10) /* the wire's limit on a target */

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24);
}

int fy_xgroup_desc_is(const void *buf, size_t len) { return buf && len >= 4 && get32(buf) == DESC_MAGIC; }

static bool shape_ok(int32_t tp, int32_t pp)
{
    return tp >= 1 && pp >= 1 && tp <= 64 && pp <= 64 && tp * pp >= 2 && tp * pp <= FY_XGROUP_MAX_RANKS;
}

fy_status_t fy_xgroup_desc_build(const fy_xgroup_desc_t *d, uint8_t **buf_p, size_t *len_p)
{
    if (!shape_ok(d->tp, d->pp) || d->n != d->tp * d->pp) {
        fy_error("xgroup: a descriptor of tp %d x pp %d for %d ranks", d->tp, d->pp, d->n);
        return FY_ERR_INVALID;
    }
    size_t len = DESC_HEAD;
    for (int32_t r = 0; r < d->n; r++) {
        if (!d->blob[r] || d->blob_len[r] == 0 || d->blob_len[r] > DESC_MAX_BLOB) {
            fy_error("xgroup: rank %d's target blob is empty or over %u bytes", r, DESC_MAX_BLOB);
            return FY_ERR_INVALID;
        }
        len += 4 + d->blob_len[r];
    }
    if (len > DESC_MAX) {
        fy_error("xgroup: a descriptor of %zu bytes is over the wire's %u", len, DESC_MAX);
        return FY_ERR_INVALID;
    }
    uint8_t *b = fy_malloc(len);
    if (!b) return FY_ERR_NOMEM;
    put32(b, DESC_MAGIC);
    b[4] = (uint8_t)DESC_VERSION, b[5] = (uint8_t)(DESC_VERSION >> 8);
    b[6] = (uint8_t)d->tp, b[7] = (uint8_t)d->pp;
    size_t at = DESC_HEAD;
    for (int32_t r = 0; r < d->n; r++) {
        put32(b + at, (uint32_t)d->blob_len[r]);
        memcpy(b + at + 4, d->blob[r], d->blob_len[r]);
        at += 4 + d->blob_len[r];
    }
    *buf_p = b;
    *len_p = len;
    return FY_OK;
}

fy_status_t fy_xgroup_desc_parse(const void *buf, size_t len, fy_xgroup_desc_t *d_p)
{
    const uint8_t *b = buf;
    if (!b || len < DESC_HEAD || len > DESC_MAX || get32(b) != DESC_MAGIC) {
        fy_debug("xgroup: not a group descriptor (%zu bytes)", len);
        return FY_ERR_FORMAT;
    }
    unsigned version = (unsigned)b[4] | (unsigned)b[5] << 8;
    fy_xgroup_desc_t d = {.tp = b[6], .pp = b[7]};
    if (version != DESC_VERSION || !shape_ok(d.tp, d.pp)) {
        fy_debug("xgroup: descriptor version %u, tp %d x pp %d", version, d.tp, d.pp);
        return FY_ERR_FORMAT;
    }
    d.n = d.tp * d.pp;
    size_t at = DESC_HEAD;
    for (int32_t r = 0; r < d.n; r++) {
        if (len - at < 4) return FY_ERR_FORMAT;
        uint32_t n = get32(b + at);
        at += 4;
        if (n == 0 || n > DESC_MAX_BLOB || n > len - at) {
            fy_debug("xgroup: rank %d's blob of %u bytes with %zu left", r, n, len - at);
            return FY_ERR_FORMAT;
        }
        d.blob[r] = b + at;
        d.blob_len[r] = n;
        at += n;
    }
    if (at != len) {
        fy_debug("xgroup: %zu bytes after the last rank's blob", len - at);
        return FY_ERR_FORMAT;
    }
    *d_p = d;
    return FY_OK;
}

/* ---- the engines --------------------------------------------------------------------------------- */

struct fy_xgroup {
    int32_t tp, pp, n;
    fy_xfer_t *x[FY_XGROUP_MAX_RANKS];
    fy_xfer_layout_t lay[FY_XGROUP_MAX_RANKS];
    uint8_t *desc; /* n > 1: the group descriptor */
    size_t desc_len;
};

int32_t fy_xgroup_n_ranks(const fy_xgroup_t *g) { return g->n; }
fy_xfer_t *fy_xgroup_rank(fy_xgroup_t *g, int32_t rank) { return rank >= 0 && rank < g->n ? g->x[rank] : NULL; }
const fy_xfer_layout_t *fy_xgroup_layout(const fy_xgroup_t *g, int32_t rank)
{
    return rank >= 0 && rank < g->n ? &g->lay[rank] : NULL;
}

fy_status_t fy_xgroup_create(const fy_xgroup_params_t *p, fy_xgroup_t **g_p)
{
    int32_t tp = p->tp > 0 ? p->tp : 1, pp = p->pp > 0 ? p->pp : 1;
    if (tp > 64 || pp > 64 || tp * pp > FY_XGROUP_MAX_RANKS || p->n_pages < 1 || !p->arenas) {
        fy_error("xgroup: tp %d x pp %d ranks of %d blocks", tp, pp, p->n_pages);
        return FY_ERR_INVALID;
    }
    fy_xgroup_t *g = fy_calloc(1, sizeof(*g));
    if (!g) return FY_ERR_NOMEM;
    g->tp = tp, g->pp = pp, g->n = tp * pp;
    fy_status_t st = FY_OK;
    fy_xgroup_desc_t d = {.tp = tp, .pp = pp, .n = g->n};
    for (int32_t r = 0; r < g->n && st == FY_OK; r++) {
        if (g->n == 1)
            g->lay[r] = p->layout;
        else if ((st = fy_xfer_layout_for_rank(&p->layout, tp, pp, r, &g->lay[r])))
            break;
        size_t bytes;
        if (!fy_mul_size((size_t)p->n_pages, g->lay[r].block_bytes, &bytes) || (g->n > 1 && bytes > p->arena_stride)) {
            fy_error("xgroup: rank %d's %d blocks of %llu bytes do not fit its %zu-byte arena", r, p->n_pages,
                     (unsigned long long)g->lay[r].block_bytes, p->arena_stride);
            st = FY_ERR_INVALID;
            break;
        }
        fy_xfer_params_t xp = {.layout = g->lay[r],
                               .arena = (char *)p->arenas + (size_t)r * p->arena_stride,
                               .arena_bytes = bytes,
                               .transports = p->transports,
                               .net_devices = p->net_devices,
                               .connect_timeout_s = p->connect_timeout_s,
                               .err_mode = p->err_mode,
                               .mem = p->mem};
        if ((st = fy_xfer_create(&xp, &g->x[r]))) break;
        const void *blob;
        if ((st = fy_xfer_target_desc(g->x[r], &blob, &d.blob_len[r]))) break;
        d.blob[r] = blob;
    }
    if (st == FY_OK && g->n > 1) st = fy_xgroup_desc_build(&d, &g->desc, &g->desc_len);
    if (st != FY_OK) {
        fy_xgroup_destroy(g);
        return st;
    }
    *g_p = g;
    return FY_OK;
}

void fy_xgroup_destroy(fy_xgroup_t *g)
{
    if (!g) return;
    for (int32_t r = 0; r < g->n; r++) fy_xfer_destroy(g->x[r]);
    fy_free(g->desc);
    fy_free(g);
}

fy_status_t fy_xgroup_target_desc(fy_xgroup_t *g, const void **blob_p, size_t *len_p)
{
    if (!g) { /* shutting down: the engines are gone (commands posted before still run) */
        fy_warn("xgroup: no transfer engine (shutting down)");
        return FY_ERR_CANCELLED;
    }
    if (g->n == 1) return fy_xfer_target_desc(g->x[0], blob_p, len_p);
    *blob_p = g->desc;
    *len_p = g->desc_len;
    return FY_OK;
}

/* ---- jobs -------------------------------------------------------------------------------------- */

typedef struct sub {
    struct fy_xgroup_job *gj;
    fy_xfer_job_t *j;
    int32_t src, dst; /* local rank, destination rank */
    bool whole;       /* the same bytes on both (fy_xfer_layout_same_data): whole blocks, runs coalesced */
    int32_t n_pieces;
    fy_xfer_piece_t *pieces; /* into gj->pieces */
} sub_t;

struct fy_xgroup_job {
    pthread_mutex_t mu;
    int32_t left;      /* pairs whose job has not called back yet */
    bool begin_failed; /* begin returned an error: the callbacks of the pairs begun free the job, silently */
    fy_status_t st;
    char msg[200];
    fy_xfer_done_fn cb;
    void *arg;
    uint64_t block_bytes;
    int32_t n_sub;
    sub_t *sub;
    fy_xfer_piece_t *pieces;
};

static void job_free(fy_xgroup_job_t *gj)
{
    pthread_mutex_destroy(&gj->mu);
    fy_free(gj->sub);
    fy_free(gj->pieces);
    fy_free(gj);
}

/* a pair's job ended (its transfer thread) */
static void sub_done(void *arg, fy_status_t st, const char *message)
{
    sub_t *s = arg;
    fy_xgroup_job_t *gj = s->gj;
    pthread_mutex_lock(&gj->mu);
    if (st != FY_OK && gj->st == FY_OK) {
        gj->st = st;
        if (gj->n_sub > 1)
            snprintf(gj->msg, sizeof(gj->msg), "rank %d -> %d: %s", s->src, s->dst, message ? message : "");
        else
            snprintf(gj->msg, sizeof(gj->msg), "%s", message ? message : "");
    }
    int32_t left = --gj->left;
    pthread_mutex_unlock(&gj->mu);
    if (left) return;
    if (!gj->begin_failed) gj->cb(gj->arg, gj->st, gj->st == FY_OK ? NULL : gj->msg);
    job_free(gj);
}

/* The destination group of a target: its layouts and blobs. */
typedef struct dest {
    int32_t n;
    fy_xfer_layout_t lay[FY_XGROUP_MAX_RANKS];
    const uint8_t *blob[FY_XGROUP_MAX_RANKS];
    size_t len[FY_XGROUP_MAX_RANKS];
} dest_t;

static fy_status_t dest_of(const fy_xgroup_t *g, const void *blob, size_t len, dest_t *d)
{
    if (!fy_xgroup_desc_is(blob, len)) { /* one process holding the whole model */
        d->n = 1;
        d->blob[0] = blob;
        d->len[0] = len;
        fy_xfer_layout_t *l = &d->lay[0];
        *l = g->lay[0];
        if (g->n > 1) {
            fy_status_t st = fy_xfer_layout_for_rank(&g->lay[0], 1, 1, 0, l);
            if (st != FY_OK) return st;
        }
        return FY_OK;
    }
    fy_xgroup_desc_t gd;
    fy_status_t st = fy_xgroup_desc_parse(blob, len, &gd);
    if (st != FY_OK) {
        fy_warn("xgroup: a target group descriptor of %zu bytes does not parse", len);
        return st;
    }
    d->n = gd.n;
    for (int32_t r = 0; r < gd.n; r++) {
        d->blob[r] = gd.blob[r];
        d->len[r] = gd.blob_len[r];
        /* every rank's blob before any pair begins: a bad one must not leave pairs half made */
        fy_xfer_target_t t;
        if ((st = fy_xfer_blob_parse(d->blob[r], d->len[r], &t))) {
            fy_warn("xgroup: rank %d's target blob in a group descriptor does not parse", r);
            return st;
        }
        if ((st = fy_xfer_layout_for_rank(&g->lay[0], gd.tp, gd.pp, r, &d->lay[r]))) return st;
    }
    return FY_OK;
}

fy_status_t fy_xgroup_job_begin(fy_xgroup_t *g, const void *blob, size_t len, double deadline, fy_xfer_done_fn cb,
                                void *arg, fy_xgroup_job_t **job_p)
{
    if (!g) { /* shutting down: the engines are gone (commands posted before still run) */
        fy_warn("xgroup: no transfer engine (shutting down)");
        return FY_ERR_CANCELLED;
    }
    dest_t *d = fy_calloc(1, sizeof(*d));
    fy_xgroup_job_t *gj = fy_calloc(1, sizeof(*gj));
    fy_status_t st = d && gj ? FY_OK : FY_ERR_NOMEM;
    if (st == FY_OK) st = dest_of(g, blob, len, d);
    if (st != FY_OK) goto fail;
    pthread_mutex_init(&gj->mu, NULL);
    gj->cb = cb, gj->arg = arg;
    bool single = g->n == 1 && d->n == 1;
    /* the pieces: per local rank at most 2 * its layers * destination ranks */
    int32_t per = 2 * g->lay[0].model_layers * d->n;
    if (!(gj->sub = fy_calloc((size_t)g->n * (size_t)d->n, sizeof(sub_t))) ||
        !(gj->pieces = fy_calloc((size_t)g->n * (size_t)per, sizeof(fy_xfer_piece_t)))) {
        st = FY_ERR_NOMEM;
        goto fail_mu;
    }
    for (int32_t s = 0; s < g->n; s++) {
        fy_xfer_piece_t *pc = gj->pieces + (size_t)s * (size_t)per;
        int32_t np = 0;
        if (!single) {
            char why[256];
            if (fy_xfer_reshard_check(&g->lay[s], d->lay, d->n, why, sizeof(why))) {
                fy_error("xgroup: rank %d of tp %d x pp %d cannot feed a group of %d ranks: %s", s, g->tp, g->pp, d->n,
                         why);
                st = FY_ERR_MISMATCH;
                goto fail_mu;
            }
            if ((st = fy_xfer_reshard_plan(&g->lay[s], d->lay, d->n, pc, per, &np))) goto fail_mu;
        }
        for (int32_t r = 0; r < d->n; r++) {
            sub_t *sb = &gj->sub[gj->n_sub];
            *sb = (sub_t){.gj = gj, .src = s, .dst = r};
            bool feeds = single;
            for (int32_t k = 0; k < np && !feeds; k++) feeds = pc[k].dst_rank == r;
            if (feeds && fy_xfer_layout_same_data(&g->lay[s], &d->lay[r])) { /* the same bytes: whole blocks */
                sb->whole = true;
                gj->block_bytes += g->lay[s].block_bytes;
            } else {
                for (int32_t k = 0; k < np; k++)
                    if (pc[k].dst_rank == r) {
                        if (!sb->n_pieces) sb->pieces = &pc[k];
                        sb->n_pieces++;
                        gj->block_bytes += pc[k].len;
                    }
                if (!sb->n_pieces) continue; /* nothing of rank s's goes to rank r */
            }
            gj->n_sub++;
        }
    }
    /* every pair's job; left counts them before the first can call back */
    gj->left = gj->n_sub;
    for (int32_t k = 0; k < gj->n_sub; k++) {
        sub_t *sb = &gj->sub[k];
        st = fy_xfer_job_begin(g->x[sb->src], d->blob[sb->dst], d->len[sb->dst], deadline, sub_done, sb, &sb->j);
        if (st == FY_OK) continue;
        fy_error("xgroup: rank %d -> %d: cannot begin a transfer: %s", sb->src, sb->dst, fy_status_str(st));
        /* the pairs begun end now; the last callback frees the job */
        pthread_mutex_lock(&gj->mu);
        gj->begin_failed = true;
        gj->left -= gj->n_sub - k; /* those never begun */
        bool none = gj->left == 0;
        pthread_mutex_unlock(&gj->mu);
        for (int32_t i = 0; i < k; i++) fy_xfer_job_abort(gj->sub[i].j); /* may free gj on the last */
        if (none) job_free(gj);
        fy_free(d);
        return st;
    }
    if (gj->n_sub == 0) { /* cannot happen: every source rank's bytes go somewhere */
        fy_error("xgroup: a transfer with nothing to put");
        st = FY_ERR_INTERNAL;
        goto fail_mu;
    }
    fy_free(d);
    *job_p = gj;
    return FY_OK;
fail_mu:
    pthread_mutex_destroy(&gj->mu);
fail:
    if (gj) {
        fy_free(gj->sub);
        fy_free(gj->pieces);
    }
    fy_free(gj);
    fy_free(d);
    return st;
}

fy_status_t fy_xgroup_job_put(fy_xgroup_job_t *gj, const int32_t *src, const int32_t *dst, int32_t n)
{
    fy_status_t first = FY_OK;
    for (int32_t k = 0; k < gj->n_sub; k++) {
        sub_t *sb = &gj->sub[k];
        fy_status_t st = FY_OK;
        if (sb->whole)
            st = fy_xfer_job_put(sb->j, src, dst, n);
        else
            for (int32_t i = 0; i < sb->n_pieces && st == FY_OK; i++)
                st = fy_xfer_job_put_piece(sb->j, src, dst, n, &sb->pieces[i]);
        if (st != FY_OK && first == FY_OK) first = st;
    }
    return first;
}

/* One put_then call over every pair: the pairs' releases count down. */
typedef struct group_mark {
    _Atomic int32_t left;
    fy_xfer_release_fn fn;
    void *arg;
} group_mark_t;

static void group_mark_done(void *arg)
{
    group_mark_t *m = arg;
    if (atomic_fetch_sub(&m->left, 1) != 1) return;
    m->fn(m->arg);
    fy_free(m);
}

fy_status_t fy_xgroup_job_put_then(fy_xgroup_job_t *gj, const int32_t *src, const int32_t *dst, int32_t n,
                                   fy_xfer_release_fn release, void *arg)
{
    group_mark_t *m = fy_malloc(sizeof(*m));
    if (!m) {
        fy_error("xgroup: out of memory queueing puts");
        release(arg);
        return FY_ERR_NOMEM;
    }
    *m = (group_mark_t){.fn = release, .arg = arg};
    atomic_init(&m->left, 1); /* the caller's own hold, dropped below */
    fy_status_t first = FY_OK;
    int32_t taken = 0;
    for (int32_t k = 0; k < gj->n_sub; k++) {
        sub_t *sb = &gj->sub[k];
        int32_t calls = sb->whole ? 1 : sb->n_pieces;
        for (int32_t i = 0; i < calls; i++) {
            atomic_fetch_add(&m->left, 1);
            fy_status_t st =
                fy_xfer_job_put_then(sb->j, src, dst, n, sb->whole ? NULL : &sb->pieces[i], group_mark_done, m);
            if (st == FY_OK) {
                taken++;
                continue;
            }
            atomic_fetch_sub(&m->left, 1); /* that call never releases */
            if (first == FY_OK) first = st;
            break; /* the pair's job has failed: its later pieces would be ignored */
        }
    }
    group_mark_done(m); /* with taken == 0: release runs here, nothing having been queued */
    return taken == 0 && first == FY_OK ? FY_ERR_INTERNAL : first;
}

uint64_t fy_xgroup_job_block_bytes(const fy_xgroup_job_t *gj) { return gj->block_bytes; }

void fy_xgroup_job_extend(fy_xgroup_job_t *gj, double deadline)
{
    for (int32_t k = 0; k < gj->n_sub; k++) fy_xfer_job_extend(gj->sub[k].j, deadline);
}

/* The last pair's finish or abort may free gj (its callback runs on a
 * transfer thread): nothing of gj is read after it. */
void fy_xgroup_job_finish(fy_xgroup_job_t *gj)
{
    int32_t n = gj->n_sub;
    sub_t *sub = gj->sub;
    for (int32_t k = 0; k < n; k++) fy_xfer_job_finish(sub[k].j);
}

void fy_xgroup_job_abort(fy_xgroup_job_t *gj)
{
    int32_t n = gj->n_sub;
    sub_t *sub = gj->sub;
    for (int32_t k = 0; k < n; k++) fy_xfer_job_abort(sub[k].j);
}

/* ---- statistics and health --------------------------------------------------------------------- */

void fy_xgroup_stats(fy_xgroup_t *g, fy_xfer_stats_t *out)
{
    *out = (fy_xfer_stats_t){0};
    for (int32_t r = 0; g && r < g->n; r++) {
        fy_xfer_stats_t s;
        fy_xfer_stats(g->x[r], &s);
        out->jobs_ok += s.jobs_ok;
        out->jobs_failed += s.jobs_failed;
        out->puts += s.puts;
        out->bytes += s.bytes;
        out->layout_refusals += s.layout_refusals;
        out->peers_connected += s.peers_connected;
        out->peer_failures += s.peer_failures;
    }
}

fy_status_t fy_xgroup_health(fy_xgroup_t *g, double now, double timeout_s, double *waited_p)
{
    fy_status_t worst = g ? FY_OK : FY_ERR_CANCELLED;
    double most = 0;
    for (int32_t r = 0; g && r < g->n; r++) {
        double w = 0;
        fy_status_t st = fy_xfer_health(g->x[r], now, timeout_s, &w);
        if (w > most) most = w;
        if (st == FY_ERR_TIMEOUT || (st != FY_OK && worst == FY_OK)) worst = st;
    }
    *waited_p = most;
    return worst;
}

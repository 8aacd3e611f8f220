/*
 * bench_reshard.c - `ferry bench-reshard`: the time to move one prompt's
 * KV between rank groups of different shapes (transfer/reshard.h: pieces
 * of each block, fy_xfer_job_put_piece) against moving it between two
 * whole models (whole blocks, one put per run) in the same run.
 *
 * In one process: one fy_xfer_t per rank of each side, each with its own
 * arena, UCX worker and thread (as each rank's process would have), over
 * the transport asked for.  Every source rank opens one job to each
 * destination rank it feeds and puts its pieces of every block of the
 * prompt into scattered destination blocks; a round ends when every job
 * has flushed.  The figure is the median over --reps rounds after one
 * warm-up round (which makes the connections); the destination bytes are
 * checked after the last round.  No model file: the shape (SmolLM2-135M
 * by default) comes from the options.
 *
 * Not here: ranks as separate processes (the same UCX path; the process
 * boundary is bench-xfer's), the workers' protocol around a transfer.
 */
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/cli.h"
#include "common/clock.h"
#include "tools/commands.h"
#include "kv/kvplan.h"
#include "common/log.h"
#include "common/mem.h"
#include "transfer/reshard.h"
#include "transfer/xfer.h"
#include "bench/stats.h"

enum { MAX_RANKS = 8, MAX_SHAPES = 8 };

typedef struct model_shape {
    int32_t layers, heads, kv_heads, head_dim, block_size, tokens;
} model_shape_t;

typedef struct side {
    fy_xfer_layout_t l;
    fy_xfer_t *x;
    uint8_t *arena;
} side_t;

typedef struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int left;
    fy_status_t st;
    char msg[256];
} waiter_t;

static void on_done(void *arg, fy_status_t st, const char *message)
{
    waiter_t *w = arg;
    pthread_mutex_lock(&w->mu);
    if (st != FY_OK && w->st == FY_OK) {
        w->st = st;
        snprintf(w->msg, sizeof(w->msg), "%s", message ? message : "");
    }
    w->left--;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static fy_status_t rank_layout(const model_shape_t *m, int32_t tp, int32_t pp, int32_t rank, fy_xfer_layout_t *l_p)
{
    fy_xfer_layout_t l = {.dtype = 1 /* f16 */,
                          .block_size = m->block_size,
                          .head_dim = m->head_dim,
                          .order = FY_XFER_ORDER_BLOCK_MAJOR,
                          .n_groups = 1};
    snprintf(l.model_id, sizeof(l.model_id), "bench-reshard/%dx%dx%d", m->layers, m->kv_heads, m->head_dim);
    int32_t q0, nq, first, count;
    fy_status_t st;
    if ((st = fy_kv_tp_heads(m->heads, m->kv_heads, tp, rank % tp, &q0, &nq, &l.kv_head0, &l.n_kv_heads)) ||
        (st = fy_kv_pp_layers(m->layers, pp, rank / tp, &first, &count)))
        return st;
    l.tp = tp, l.pp = pp, l.tp_rank = rank % tp, l.stage = rank / tp;
    l.layer0 = first, l.n_layers = count;
    l.model_layers = m->layers, l.model_kv_heads = m->kv_heads;
    l.block_bytes =
        (uint64_t)2 * (uint64_t)count * (uint64_t)l.n_kv_heads * (uint64_t)m->block_size * (uint64_t)m->head_dim * 2;
    *l_p = l;
    return FY_OK;
}

/* the byte at (layer, k|v, head, i) of the model's block b */
static uint8_t kv_byte(int32_t b, int32_t layer, int32_t kv, int32_t head, uint64_t i)
{
    uint64_t x = ((uint64_t)b * 977 + (uint64_t)layer * 131 + (uint64_t)kv * 71 + (uint64_t)head * 29 + i) *
                 0x9E3779B97F4A7C15ull;
    return (uint8_t)(x >> 56);
}

static void fill_rank_block(const fy_xfer_layout_t *l, int32_t b, uint8_t *p)
{
    uint64_t hb = l->block_bytes / ((uint64_t)2 * (uint64_t)l->n_layers * (uint64_t)l->n_kv_heads), at = 0;
    for (int32_t layer = 0; layer < l->n_layers; layer++)
        for (int32_t kv = 0; kv < 2; kv++)
            for (int32_t h = 0; h < l->n_kv_heads; h++)
                for (uint64_t i = 0; i < hb; i++) p[at++] = kv_byte(b, l->layer0 + layer, kv, l->kv_head0 + h, i);
}

static fy_status_t open_side(const fy_xfer_layout_t *l, int32_t blocks, const char *tls, side_t *s)
{
    size_t bytes = (size_t)blocks * l->block_bytes;
    s->l = *l;
    bool shm = !strcmp(tls, "sm");
    fy_xfer_params_t p = {.layout = *l,
                          .arena_bytes = bytes,
                          .transports = tls,
                          .connect_timeout_s = 10,
                          .err_mode = shm ? FY_XFER_ERRMODE_NONE : FY_XFER_ERRMODE_PEER};
    fy_status_t st = fy_xfer_create(&p, &s->x);
    if (st != FY_OK) return st;
    s->arena = fy_xfer_arena(s->x);
    memset(s->arena, 0, bytes);
    return FY_OK;
}

/* One round: every source rank's pieces (or whole blocks, when both sides
 * are one whole model) of blocks src[i] -> dst[i]; seconds into *secs_p. */
static fy_status_t round_once(side_t *src, int32_t na, side_t *dst, int32_t nb, const int32_t *sb, const int32_t *db,
                              int32_t n, fy_xfer_piece_t *pieces, int32_t cap, int64_t *puts_p, double *secs_p)
{
    waiter_t w = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .st = FY_OK};
    fy_xfer_layout_t ld[MAX_RANKS];
    for (int32_t d = 0; d < nb; d++) ld[d] = dst[d].l;
    bool whole = na == 1 && nb == 1 && !fy_xfer_layout_diff(&src[0].l, &dst[0].l);
    int64_t puts = 0;
    double t0 = fy_now_s();
    fy_status_t st = FY_OK;
    for (int32_t s = 0; s < na && st == FY_OK; s++) {
        int32_t np = 0;
        if (!whole && (st = fy_xfer_reshard_plan(&src[s].l, ld, nb, pieces, cap, &np))) break;
        for (int32_t d = 0; d < nb && st == FY_OK; d++) {
            int32_t mine = whole;
            for (int32_t i = 0; i < np; i++) mine += pieces[i].dst_rank == d;
            if (!mine) continue;
            const void *blob;
            size_t len;
            fy_xfer_job_t *j;
            if ((st = fy_xfer_target_desc(dst[d].x, &blob, &len))) break;
            pthread_mutex_lock(&w.mu);
            w.left++;
            pthread_mutex_unlock(&w.mu);
            if ((st = fy_xfer_job_begin(src[s].x, blob, len, fy_now_s() + 60, on_done, &w, &j))) {
                pthread_mutex_lock(&w.mu);
                w.left--;
                pthread_mutex_unlock(&w.mu);
                break;
            }
            if (whole) {
                st = fy_xfer_job_put(j, sb, db, n);
                puts += n;
            }
            for (int32_t i = 0; i < np && st == FY_OK; i++) {
                if (pieces[i].dst_rank != d) continue;
                st = fy_xfer_job_put_piece(j, sb, db, n, &pieces[i]);
                puts += n;
            }
            fy_xfer_job_finish(j);
        }
    }
    pthread_mutex_lock(&w.mu);
    while (w.left > 0) pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    *secs_p = fy_now_s() - t0;
    *puts_p = puts;
    if (st == FY_OK && w.st != FY_OK) {
        fy_error("bench-reshard: a job failed: %s: %s", fy_status_str(w.st), w.msg);
        st = w.st;
    }
    return st;
}

static bool parse_shape(const char *s, int32_t *tp_p, int32_t *pp_p)
{
    int tp, pp, n;
    if (sscanf(s, "%dx%d%n", &tp, &pp, &n) != 2 || s[n] || tp < 1 || pp < 1 || tp * pp > MAX_RANKS) return false;
    *tp_p = tp;
    *pp_p = pp;
    return true;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ferry bench-reshard [--pairs 1x1:1x1,1x1:3x1,1x2:1x1,3x2:1x1] [--tls tcp|sm]\n"
            "                           [--tokens 2048] [--reps 5]\n"
            "  moving one prompt's KV between rank groups of different shapes (pieces of blocks)\n"
            "  against whole blocks between two whole models (the first pair), in one run\n"
            "      --pairs LIST    source:destination shapes, tp x pp each (at most %d ranks a side)\n"
            "      --tls NAME      the UCX transport (default tcp)\n"
            "      --tokens N      the prompt (default 2048)\n"
            "      --layers L --heads H --kv-heads K --head-dim D --block-size B\n"
            "                      the model's shape (default SmolLM2-135M: 30, 9, 3, 64, 16)\n"
            "      --reps N        timed rounds after a warm-up; the median is kept (default 5)\n"
            "  -h, --help\n",
            MAX_RANKS);
}

int fy_cmd_bench_reshard(int argc, char **argv)
{
    enum { O_PAIRS = 256, O_TLS, O_TOKENS, O_LAYERS, O_HEADS, O_KVH, O_HD, O_BS, O_REPS };
    static const struct option opts[] = {
        {"pairs", required_argument, 0, O_PAIRS},
        {"tls", required_argument, 0, O_TLS},
        {"tokens", required_argument, 0, O_TOKENS},
        {"layers", required_argument, 0, O_LAYERS},
        {"heads", required_argument, 0, O_HEADS},
        {"kv-heads", required_argument, 0, O_KVH},
        {"head-dim", required_argument, 0, O_HD},
        {"block-size", required_argument, 0, O_BS},
        {"reps", required_argument, 0, O_REPS},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    model_shape_t m = {.layers = 30, .heads = 9, .kv_heads = 3, .head_dim = 64, .block_size = 16, .tokens = 2048};
    const char *pairs = "1x1:1x1,1x1:3x1,1x2:1x1,3x2:1x1", *tls = "tcp";
    long v, reps = 5;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case O_PAIRS: pairs = optarg; break;
        case O_TLS: tls = optarg; break;
        case O_TOKENS:
            if (!fy_cli_parse_int("--tokens", optarg, 16, 1 << 20, &v)) return 2;
            m.tokens = (int32_t)v;
            break;
        case O_LAYERS:
            if (!fy_cli_parse_int("--layers", optarg, 1, 1024, &v)) return 2;
            m.layers = (int32_t)v;
            break;
        case O_HEADS:
            if (!fy_cli_parse_int("--heads", optarg, 1, 1024, &v)) return 2;
            m.heads = (int32_t)v;
            break;
        case O_KVH:
            if (!fy_cli_parse_int("--kv-heads", optarg, 1, 1024, &v)) return 2;
            m.kv_heads = (int32_t)v;
            break;
        case O_HD:
            if (!fy_cli_parse_int("--head-dim", optarg, 1, 1024, &v)) return 2;
            m.head_dim = (int32_t)v;
            break;
        case O_BS:
            if (!fy_cli_parse_int("--block-size", optarg, 1, 1024, &v)) return 2;
            m.block_size = (int32_t)v;
            break;
        case O_REPS:
            if (!fy_cli_parse_int("--reps", optarg, 1, 1000, &v)) return 2;
            reps = v;
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!fy_cli_no_operands("bench-reshard", argc, argv, usage)) return 2;
    int32_t sh[MAX_SHAPES][4], n_pairs = 0;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", pairs);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(tok, ':');
        if (n_pairs == MAX_SHAPES || !colon) {
            fprintf(stderr, "ferry: bench-reshard: --pairs '%s': expected SRC:DST shapes like 1x1:3x1, at most %d\n",
                    pairs, MAX_SHAPES);
            return 2;
        }
        *colon = '\0';
        if (!parse_shape(tok, &sh[n_pairs][0], &sh[n_pairs][1]) ||
            !parse_shape(colon + 1, &sh[n_pairs][2], &sh[n_pairs][3])) {
            fprintf(stderr, "ferry: bench-reshard: --pairs: '%s:%s' is not TPxPP:TPxPP (at most %d ranks a side)\n",
                    tok, colon + 1, MAX_RANKS);
            return 2;
        }
        n_pairs++;
    }
    int32_t n = (m.tokens + m.block_size - 1) / m.block_size, nblk = 2 * n + 1;
    int32_t *sb = fy_malloc((size_t)n * sizeof(int32_t)), *db = fy_malloc((size_t)n * sizeof(int32_t));
    double *secs = fy_calloc((size_t)reps, sizeof(double));
    int32_t cap = 2 * m.layers * MAX_RANKS;
    fy_xfer_piece_t *pieces = fy_malloc((size_t)cap * sizeof(*pieces));
    uint8_t *want = NULL;
    if (!sb || !db || !secs || !pieces) {
        fy_error("bench-reshard: out of memory");
        return 1;
    }
    for (int32_t i = 0; i < n; i++) sb[i] = i, db[i] = 2 * i + 1; /* scattered: one put per block and piece */
    printf("ferry bench-reshard: %d tokens (%d blocks of %d) of a %d-layer model, %d kv heads x %d, f16, over %s; "
           "median of %ld rounds\n\n",
           m.tokens, n, m.block_size, m.layers, m.kv_heads, m.head_dim, tls, reps);
    printf("| source | destination | puts | bytes moved | median ms | GB/s | x the first pair |\n");
    printf("|---|---|---:|---:|---:|---:|---:|\n");
    double first = 0;
    int rc = 0;
    for (int32_t k = 0; k < n_pairs && rc == 0; k++) {
        int32_t na = sh[k][0] * sh[k][1], nb = sh[k][2] * sh[k][3];
        side_t src[MAX_RANKS] = {0}, dst[MAX_RANKS] = {0};
        fy_status_t st = FY_OK;
        for (int32_t s = 0; s < na && st == FY_OK; s++) {
            fy_xfer_layout_t l;
            if ((st = rank_layout(&m, sh[k][0], sh[k][1], s, &l)) || (st = open_side(&l, n, tls, &src[s]))) break;
            for (int32_t b = 0; b < n; b++) fill_rank_block(&l, b, src[s].arena + (size_t)b * l.block_bytes);
        }
        for (int32_t d = 0; d < nb && st == FY_OK; d++) {
            fy_xfer_layout_t l;
            if ((st = rank_layout(&m, sh[k][2], sh[k][3], d, &l)) || (st = open_side(&l, nblk, tls, &dst[d]))) break;
        }
        int64_t puts = 0;
        double t;
        if (st == FY_OK) st = round_once(src, na, dst, nb, sb, db, n, pieces, cap, &puts, &t); /* connects */
        for (long r = 0; r < reps && st == FY_OK; r++)
            st = round_once(src, na, dst, nb, sb, db, n, pieces, cap, &puts, &secs[r]);
        bool ok = st == FY_OK;
        uint64_t moved = 0;
        for (int32_t d = 0; d < nb && ok; d++) { /* every destination block its rank's slice of the model's */
            fy_free(want);
            want = fy_malloc(dst[d].l.block_bytes);
            if (!want) ok = false;
            for (int32_t i = 0; i < n && ok; i++) {
                fill_rank_block(&dst[d].l, sb[i], want);
                if (memcmp(want, dst[d].arena + (size_t)db[i] * dst[d].l.block_bytes, dst[d].l.block_bytes)) {
                    fy_error("bench-reshard: %dx%d -> %dx%d: rank %d block %d holds the wrong bytes", sh[k][0],
                             sh[k][1], sh[k][2], sh[k][3], d, db[i]);
                    ok = false;
                }
            }
            moved += (uint64_t)n * dst[d].l.block_bytes;
        }
        if (ok) {
            qsort(secs, (size_t)reps, sizeof(double), cmp_double);
            double med = secs[reps / 2];
            if (k == 0) first = med;
            printf("| tp %d x pp %d | tp %d x pp %d | %lld | %.1f MB | %.1f | %.2f | %.2f |\n", sh[k][0], sh[k][1],
                   sh[k][2], sh[k][3], (long long)puts, (double)moved / 1e6, med * 1e3, (double)moved / med / 1e9,
                   first > 0 ? med / first : 0);
            fflush(stdout);
        } else {
            rc = 1;
        }
        for (int32_t s = 0; s < na; s++) fy_xfer_destroy(src[s].x);
        for (int32_t d = 0; d < nb; d++) fy_xfer_destroy(dst[d].x);
    }
    fy_free(want);
    fy_free(sb);
    fy_free(db);
    fy_free(secs);
    fy_free(pieces);
    return rc;
}

/* stop.c - stop-string matching over streamed text. */
#include "engine/stop.h"

#include <string.h>

#include "common/log.h"
#include "common/mem.h"

fy_status_t fy_stopper_init(fy_stopper_t *s, const char *const *stops, int n_stops, size_t piece_max)
{
    memset(s, 0, sizeof(*s));
    if (n_stops < 0 || n_stops > FY_STOP_MAX) {
        fy_error("stop: %d stop strings (at most %d)", n_stops, FY_STOP_MAX);
        return FY_ERR_INVALID;
    }
    size_t longest = 0;
    for (int i = 0; i < n_stops; i++) {
        size_t n = strlen(stops[i]);
        if (n == 0 || n > FY_STOP_MAX_LEN) {
            fy_error("stop: stop string %d is %s (1 to %d bytes)", i, n ? "too long" : "empty", FY_STOP_MAX_LEN);
            fy_stopper_deinit(s);
            return FY_ERR_INVALID;
        }
        s->stops[i] = fy_strdup(stops[i]);
        if (!s->stops[i]) goto nomem;
        s->stop_len[i] = n;
        s->n_stops = i + 1;
        if (n > longest) longest = n;
    }
    s->cap = longest + piece_max + 1;
    s->held = fy_malloc(s->cap);
    if (!s->held) goto nomem;
    return FY_OK;
nomem:
    fy_stopper_deinit(s);
    fy_error("stop: out of memory");
    return FY_ERR_NOMEM;
}

void fy_stopper_deinit(fy_stopper_t *s)
{
    for (int i = 0; i < s->n_stops; i++) fy_free(s->stops[i]);
    fy_free(s->held);
    memset(s, 0, sizeof(*s));
}

/* Length of the longest suffix of buf that is a proper prefix of a stop string. */
static size_t partial_suffix(const fy_stopper_t *s, const char *buf, size_t n)
{
    size_t best = 0;
    for (int i = 0; i < s->n_stops; i++) {
        size_t m = s->stop_len[i] - 1 < n ? s->stop_len[i] - 1 : n;
        for (size_t k = m; k > best; k--) {
            if (!memcmp(buf + n - k, s->stops[i], k)) {
                best = k;
                break;
            }
        }
    }
    return best;
}

bool fy_stopper_feed(fy_stopper_t *s, const char *text, size_t len, fy_stop_emit_fn emit, void *arg)
{
    if (s->stopped) return true;
    if (s->n_stops == 0) {
        if (len) emit(arg, text, len);
        return false;
    }
    while (len > 0) {
        size_t take = s->cap - s->n_held;
        if (take > len) take = len;
        memcpy(s->held + s->n_held, text, take);
        s->n_held += take;
        text += take;
        len -= take;
        /* earliest complete match (the longest stop string there, when it is kept) */
        size_t at = s->n_held, end = 0;
        for (int i = 0; i < s->n_stops; i++) {
            void *p = memmem(s->held, s->n_held, s->stops[i], s->stop_len[i]);
            size_t pos = p ? (size_t)((char *)p - s->held) : s->n_held;
            if (p && (pos < at || (pos == at && pos + s->stop_len[i] > end))) at = pos, end = pos + s->stop_len[i];
        }
        if (at < s->n_held) {
            size_t out = s->include_stop ? end : at;
            if (out) emit(arg, s->held, out);
            s->n_held = 0;
            s->stopped = true;
            return true;
        }
        size_t keep = partial_suffix(s, s->held, s->n_held);
        size_t out = s->n_held - keep;
        if (out) {
            emit(arg, s->held, out);
            memmove(s->held, s->held + out, keep);
            s->n_held = keep;
        }
    }
    return false;
}

void fy_stopper_flush(fy_stopper_t *s, fy_stop_emit_fn emit, void *arg)
{
    if (!s->stopped && s->n_held) emit(arg, s->held, s->n_held);
    s->n_held = 0;
}

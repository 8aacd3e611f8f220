/*
 * stop.h - stop strings over streamed text.
 *
 * Text arrives piece by piece (one detokenized token at a time).  The
 * matcher passes on everything that cannot be the start of a stop string
 * and holds back a suffix that still might be; when a stop string
 * completes, the text before it is released and the rest dropped, so the
 * stop string itself never reaches the client (OpenAI semantics), unless
 * include_stop is set (vLLM's include_stop_str_in_output): then the text
 * ends with it.
 * Buffers are sized at init: feeding never allocates.
 */
#ifndef FY_STOP_H
#define FY_STOP_H

#include <stdbool.h>
#include <stddef.h>

#include "common/status.h"

#define FY_STOP_MAX 16      /* stop strings per request */
#define FY_STOP_MAX_LEN 256 /* bytes per stop string */

/* Receives text that is final. */
typedef void (*fy_stop_emit_fn)(void *arg, const char *text, size_t len);

typedef struct fy_stopper {
    char *stops[FY_STOP_MAX];
    size_t stop_len[FY_STOP_MAX];
    int n_stops;
    char *held; /* text that may still start a stop string */
    size_t n_held, cap;
    bool stopped;
    bool include_stop; /* set after init: a matched stop string is released with the text before it */
} fy_stopper_t;

/* Copies the stop strings; FY_ERR_INVALID (logged) for too many, empty or
 * too long ones.  piece_max: the longest piece fed at once. */
fy_status_t fy_stopper_init(fy_stopper_t *s, const char *const *stops, int n_stops, size_t piece_max);
void fy_stopper_deinit(fy_stopper_t *s);
/* Feeds a piece; calls emit with the text now final.  Returns true once a
 * stop string has matched (later calls emit nothing). */
bool fy_stopper_feed(fy_stopper_t *s, const char *text, size_t len, fy_stop_emit_fn emit, void *arg);
/* At the end of generation: releases what is held. */
void fy_stopper_flush(fy_stopper_t *s, fy_stop_emit_fn emit, void *arg);

#endif /* FY_STOP_H */

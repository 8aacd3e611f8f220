/*
 * size.h - byte sizes as people write them in configs and on command
 * lines ("512M", "50GiB"), and back.
 */
#ifndef FY_SIZE_H
#define FY_SIZE_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* "4096", "50GiB", "50Gi", "1.5G", "512MB": K, M, G, T are powers of 1000,
 * Ki, Mi, Gi, Ti powers of 1024, a trailing B optional.  FY_ERR_INVALID
 * (logged, naming what) for anything else, negatives and overflow. */
fy_status_t fy_parse_size(const char *what, const char *s, int64_t *bytes_p);
/* "50.0 GiB" */
void fy_format_size(int64_t bytes, char *buf, size_t cap);

#endif /* FY_SIZE_H */

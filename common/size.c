/* size.c - parsing and formatting byte sizes. */
#include "common/size.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

fy_status_t fy_parse_size(const char *what, const char *s, int64_t *bytes_p)
{
    if (!s || !*s) goto bad;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !isfinite(v) || v < 0 || isspace((unsigned char)*s)) goto bad;
    static const struct {
        const char *suffix;
        double mult;
    } units[] = {
        {"", 1},
        {"B", 1},
        {"K", 1e3},
        {"KB", 1e3},
        {"M", 1e6},
        {"MB", 1e6},
        {"G", 1e9},
        {"GB", 1e9},
        {"T", 1e12},
        {"TB", 1e12},
        {"Ki", 1024.0},
        {"KiB", 1024.0},
        {"Mi", 1048576.0},
        {"MiB", 1048576.0},
        {"Gi", 1073741824.0},
        {"GiB", 1073741824.0},
        {"Ti", 1099511627776.0},
        {"TiB", 1099511627776.0},
    };
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strcmp(end, units[i].suffix)) continue;
        double b = floor(v * units[i].mult); /* 1.5Ki = 1536; fractions of a byte round down */
        if (b >= 9.2e18) goto bad;
        *bytes_p = (int64_t)b;
        return FY_OK;
    }
bad:
    fy_error("%s: '%s' is not a size (examples: 4096, 512M, 50GiB)", what, s ? s : "");
    return FY_ERR_INVALID;
}

void fy_format_size(int64_t bytes, char *buf, size_t cap)
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 4) v /= 1024.0, u++;
    if (u == 0)
        snprintf(buf, cap, "%lld B", (long long)bytes);
    else
        snprintf(buf, cap, "%.1f %s", v, units[u]);
}

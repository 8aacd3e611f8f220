/*
 * cli.c - option-value parsers, the file reader and the answer's output
 * the ferry subcommands share (cli.h).  A leaf: it knows no subcommand.
 */
#include "tools/cli.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"

bool fy_cli_parse_int(const char *opt, const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "ferry: %s expects an integer from %ld to %ld, got '%s'\n", opt, lo, hi, s);
        return false;
    }
    *out = v;
    return true;
}

bool fy_cli_parse_int_list(const char *opt, const char *s, long lo, long hi, int *out, int cap, int *n_p)
{
    char buf[256];
    if (strlen(s) >= sizeof(buf)) {
        fprintf(stderr, "ferry: %s: list too long\n", opt);
        return false;
    }
    snprintf(buf, sizeof(buf), "%s", s);
    int n = 0;
    for (char *save, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        long v;
        if (n == cap) {
            fprintf(stderr, "ferry: %s takes at most %d values\n", opt, cap);
            return false;
        }
        if (!fy_cli_parse_int(opt, t, lo, hi, &v)) return false;
        out[n++] = (int)v;
    }
    if (!n) {
        fprintf(stderr, "ferry: %s expects a comma-separated list, got '%s'\n", opt, s);
        return false;
    }
    *n_p = n;
    return true;
}

bool fy_cli_parse_float(const char *opt, const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "ferry: %s expects a number from %g to %g, got '%s'\n", opt, lo, hi, s);
        return false;
    }
    *out = v;
    return true;
}

bool fy_cli_parse_u64(const char *opt, const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-') {
        fprintf(stderr, "ferry: %s expects a non-negative integer, got '%s'\n", opt, s);
        return false;
    }
    *out = v;
    return true;
}

char *fy_cli_read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "ferry: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, len = 0;
    char *buf = fy_malloc(cap);
    size_t n;
    while (buf && (n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (cap - len - 1 == 0) {
            char *nb = cap < (64u << 20) ? fy_realloc(buf, cap * 2) : NULL;
            if (!nb) {
                fprintf(stderr, "ferry: %s: too large (64 MiB at most)\n", path);
                fy_free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf) buf[len] = '\0';
    return buf;
}

bool fy_cli_no_operands(const char *cmd, int argc, char **argv, void (*usage)(FILE *))
{
    if (optind >= argc) return true;
    fprintf(stderr, "ferry: %s: unexpected argument '%s'\n", cmd, argv[optind]);
    usage(stderr);
    return false;
}

void fy_cli_answer_put(fy_cli_answer_t *a, const char *text, size_t len)
{
    if (!len) return;
    fwrite(text, 1, len, a->out);
    fflush(a->out);
    a->mid_line = text[len - 1] != '\n';
}

void fy_cli_answer_end(fy_cli_answer_t *a)
{
    if (a->mid_line) fputc('\n', a->out);
    a->mid_line = false;
    fflush(a->out);
}

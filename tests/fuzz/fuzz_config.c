/*
 * fuzz_config.c - INI configuration (common/config.c over inih): an input
 * is an INI file, optionally followed by FZ_SEP and --set assignments, one
 * a line.
 *
 * Checks: a file either loads whole or leaves the configuration as it was
 * (same entry count); each --set is applied or refused without changing
 * anything; every typed getter, on every section.key the input names and
 * on keys ferry reads, answers FY_OK with a value inside the range asked
 * or FY_ERR_INVALID; fy_config_check_known and the key table's check
 * (fy_conf_check) run over all of it; the configuration written by
 * fy_config_write reads back to the same entries and values, and so does
 * the effective configuration of `ferry config` (fy_conf_print) for every
 * key of the table.  The file is loaded from a file (fy_config_load, which
 * resolves relative paths against its folder).  Seeds: configs/local.ini
 * and the cases test_config.c uses.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "tests/fuzz/util.h"

#define MAX_NAMES 48

typedef struct name {
    char section[FY_CONFIG_MAX_SECTION + 1];
    char key[FY_CONFIG_MAX_KEY + 1];
} name_t;

static const name_t k_fixed[] = {
    {"router", "port"},       {"router", "http"},     {"decode", "kv_mem"}, {"serve", "stop_grace"},
    {"decode", "count"},      {"prefill", "count"},   {"model", "path"},    {"router", "request_timeout"},
    {"decode", "block_size"}, {"router", "api_keys"},
};

/* The section.key names an INI text mentions, as the loader would read them (roughly). */
static int names_of(const char *text, name_t *out, int cap)
{
    int n = 0;
    char section[FY_CONFIG_MAX_SECTION + 1] = "";
    for (const char *line = text; *line && n < cap;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        const char *s = line;
        while (len && (*s == ' ' || *s == '\t')) s++, len--;
        if (len && *s == '[') {
            const char *close = memchr(s, ']', len);
            if (close && (size_t)(close - s - 1) <= FY_CONFIG_MAX_SECTION)
                snprintf(section, sizeof(section), "%.*s", (int)(close - s - 1), s + 1);
        } else {
            const char *eq = memchr(s, '=', len);
            if (eq) {
                size_t kl = (size_t)(eq - s);
                while (kl && (s[kl - 1] == ' ' || s[kl - 1] == '\t')) kl--;
                if (kl && kl <= FY_CONFIG_MAX_KEY) {
                    snprintf(out[n].section, sizeof(out[n].section), "%s", section);
                    snprintf(out[n].key, sizeof(out[n].key), "%.*s", (int)kl, s);
                    n++;
                }
            }
        }
        line = end ? end + 1 : line + len;
        if (!end) break;
    }
    return n;
}

static void check_status(fy_status_t st, const char *what)
{
    FZ_CHECK(st == FY_OK || st == FY_ERR_INVALID, "%s returned %s", what, fy_status_str(st));
}

static void read_all(const fy_config_t *c, const name_t *nm)
{
    const char *s = nm->section, *k = nm->key;
    int64_t i;
    double d;
    bool b;
    const char *str;
    fy_status_t st = fy_config_int(c, s, k, 7, -1000, 1000, &i);
    check_status(st, "fy_config_int");
    FZ_CHECK(st != FY_OK || (i >= -1000 && i <= 1000), "int %lld outside its range", (long long)i);
    check_status(fy_config_int(c, s, k, 0, INT64_MIN, INT64_MAX, &i), "fy_config_int");
    st = fy_config_double(c, s, k, 0.5, 0, 1, &d);
    check_status(st, "fy_config_double");
    FZ_CHECK(st != FY_OK || (d >= 0 && d <= 1), "double %g outside [0, 1]", d);
    check_status(fy_config_double(c, s, k, 0, -INFINITY, INFINITY, &d), "fy_config_double");
    FZ_CHECK(isfinite(d), "double %g", d);
    check_status(fy_config_bool(c, s, k, false, &b), "fy_config_bool");
    st = fy_config_size(c, s, k, 1, 1, (int64_t)1 << 50, &i);
    check_status(st, "fy_config_size");
    FZ_CHECK(st != FY_OK || (i >= 1 && i <= (int64_t)1 << 50), "size %lld outside its range", (long long)i);
    st = fy_config_duration(c, s, k, 1, 0, 3600, &d);
    check_status(st, "fy_config_duration");
    FZ_CHECK(st != FY_OK || (d >= 0 && d <= 3600), "duration %g outside [0, 3600]", d);
    check_status(fy_config_string(c, s, k, "def", &str), "fy_config_string");
    FZ_CHECK(str != NULL, "string NULL");
    const char *v = fy_config_get(c, s, k), *o = fy_config_origin(c, s, k);
    FZ_CHECK((v == NULL) == (o == NULL), "a value without an origin or the reverse");
    if (v) FZ_CHECK(strlen(v) <= FY_CONFIG_MAX_LINE, "value of %zu bytes", strlen(v));
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fz_quiet_log();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_part_t parts[2];
    size_t np = fz_split(data, size, FZ_SEP, parts, 2);
    char *text = fz_strndup(parts[0].p, parts[0].n);
    fy_config_t *c = NULL;
    if (fy_config_create(&c) != FY_OK) abort();
    /* something to keep when the file is refused */
    if (fy_config_load_string(c, "[router]\nport = 7400\n[decode]\nkv_mem = 1GiB\n", "base") != FY_OK) abort();
    int before = fy_config_count(c);
    /* from a file, as the processes read one: its relative paths are
     * resolved against its folder, so that the configuration written below
     * reads back to the same values from another file */
    fy_status_t st = fy_config_load(c, fz_write("fuzz.ini", text, strlen(text)));
    FZ_CHECK(st == FY_OK || st == FY_ERR_FORMAT, "load returned %s", fy_status_str(st));
    if (st != FY_OK) FZ_CHECK(fy_config_count(c) == before, "a refused file changed the configuration");

    name_t names[MAX_NAMES];
    int n = names_of(text, names, MAX_NAMES);
    if (np > 1) {
        char *sets = fz_strndup(parts[1].p, parts[1].n);
        for (char *save = NULL, *a = strtok_r(sets, "\n", &save); a; a = strtok_r(NULL, "\n", &save)) {
            int n0 = fy_config_count(c);
            st = fy_config_set(c, a);
            FZ_CHECK(st == FY_OK || st == FY_ERR_INVALID, "set returned %s", fy_status_str(st));
            if (st != FY_OK) FZ_CHECK(fy_config_count(c) == n0, "a refused --set changed the configuration");
            /* its name: the key follows the last '.' before '=' (blanks around it dropped) */
            const char *eq = strchr(a, '='), *dot = NULL;
            for (const char *q = a; eq && q < eq; q++)
                if (*q == '.') dot = q;
            if (st == FY_OK && dot && n < MAX_NAMES) {
                const char *s0 = a, *k0 = dot + 1, *k1 = eq;
                while (*s0 == ' ' || *s0 == '\t') s0++;
                while (k1 > k0 && (k1[-1] == ' ' || k1[-1] == '\t')) k1--;
                snprintf(names[n].section, sizeof(names[n].section), "%.*s", (int)(dot - s0), s0);
                snprintf(names[n].key, sizeof(names[n].key), "%.*s", (int)(k1 - k0), k0);
                n++;
            }
        }
        free(sets);
    }
    for (int i = 0; i < n; i++) read_all(c, &names[i]);
    for (size_t i = 0; i < sizeof(k_fixed) / sizeof(k_fixed[0]); i++) read_all(c, &k_fixed[i]);
    static const char *const known[] = {"router.*",      "decode.kv_mem",    "decode.count",
                                        "prefill.count", "serve.stop_grace", "model.path"};
    st = fy_config_check_known(c, known, 6);
    check_status(st, "fy_config_check_known");
    check_status(fy_conf_check(c, false), "fy_conf_check");
    check_status(fy_conf_check(c, true), "fy_conf_check (values)");

    /* the effective configuration reads back with every table key's value */
    char *eff = NULL;
    size_t eff_len = 0;
    FILE *ef = open_memstream(&eff, &eff_len);
    if (!ef) abort();
    fy_conf_print(c, ef);
    fclose(ef);
    fy_config_t *c3 = NULL;
    if (fy_config_create(&c3) != FY_OK) abort();
    st = fy_config_load_string(c3, eff, "effective");
    FZ_CHECK(st == FY_OK, "the effective configuration does not load: %s\n%s", fy_status_str(st), eff);
    int n_keys;
    const fy_conf_key_t *keys = fy_conf_keys(&n_keys);
    for (int i = 0; i < n_keys; i++) {
        const char *a = fy_config_get(c, keys[i].section, keys[i].key);
        const char *b = fy_config_get(c3, keys[i].section, keys[i].key);
        FZ_CHECK(!a || (b && !strcmp(a, b)), "%s.%s was '%s', printed '%s'", keys[i].section, keys[i].key, a,
                 b ? b : "(none)");
    }
    fy_config_destroy(c3);
    free(eff);

    /* written and read back: the same entries */
    char path[512];
    snprintf(path, sizeof(path), "%s/merged.ini", fz_dir());
    st = fy_config_write(c, path);
    FZ_CHECK(st == FY_OK, "fy_config_write: %s", fy_status_str(st));
    fy_config_t *c2 = NULL;
    if (fy_config_create(&c2) != FY_OK) abort();
    st = fy_config_load(c2, path);
    FZ_CHECK(st == FY_OK, "the written configuration does not load: %s", fy_status_str(st));
    FZ_CHECK(fy_config_count(c2) == fy_config_count(c), "%d entries written, %d read back", fy_config_count(c),
             fy_config_count(c2));
    for (int i = 0; i < n; i++) {
        const char *a = fy_config_get(c, names[i].section, names[i].key);
        const char *b = fy_config_get(c2, names[i].section, names[i].key);
        FZ_CHECK((!a && !b) || (a && b && !strcmp(a, b)), "%s.%s was '%s', read back '%s'", names[i].section,
                 names[i].key, a ? a : "(none)", b ? b : "(none)");
    }
    fy_config_destroy(c2);
    fy_config_destroy(c);
    free(text);
    return 0;
}

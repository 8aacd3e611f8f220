/*
 * fuzz_keyfile.c - a client key file (common/envelope.h,
 * fy_env_keyfile_parse), the bytes `ferry request --key FILE` reads
 * before it holds any credentials.
 *
 * Checks: what parses names a valid sender (1 to 63 printable bytes, no
 * space) and writes back (fy_env_keyfile_format) to the very input, less
 * an absent newline: one text per key, nothing else taken.
 *
 * Builds on its own (the project's libFuzzer rules pick up tests/fuzz/fuzz_*.c):
 *   clang -fsanitize=fuzzer,address,undefined -I. tests/fuzz/fuzz_keyfile.c \
 *         common/envelope.c common/log.c common/mem.c -lsodium -lpthread -o fuzz_keyfile
 * Seeds: FY_FUZZ_SEEDS=tests/fuzz/corpus/keyfile ./fuzz_keyfile writes
 * them (a key file, one without its newline, one with a long name, a
 * deployment secret's raw bytes) and exits.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/envelope.h"
#include "common/log.h"

static void quiet(fy_log_level_t level, const char *line, void *arg) { (void)level, (void)line, (void)arg; }

static void fail(const char *what)
{
    fprintf(stderr, "fuzz_keyfile: %s\n", what);
    abort();
}

static void write_seed(const char *dir, const char *name, const void *buf, size_t len)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, len, f) != len || fclose(f)) fail("cannot write a seed");
}

static void write_seeds(const char *dir)
{
    fy_env_key_t k;
    for (int i = 0; i < FY_ENV_KEY_BYTES; i++) k.k[i] = (uint8_t)(i * 53 + 7);
    char text[FY_ENV_KEYFILE_MAX], longname[64];
    memset(longname, 'q', 63);
    longname[63] = 0;
    size_t n = fy_env_keyfile_format("alice", &k, text, sizeof(text));
    if (!n) fail("cannot format");
    write_seed(dir, "alice", text, n);
    write_seed(dir, "no-newline", text, n - 1);
    n = fy_env_keyfile_format(longname, &k, text, sizeof(text));
    if (!n) fail("cannot format a long name");
    write_seed(dir, "long-name", text, n);
    write_seed(dir, "raw-secret", k.k, 32);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fy_log_set_sink(quiet, NULL);
    const char *seeds = getenv("FY_FUZZ_SEEDS");
    if (seeds) {
        write_seeds(seeds);
        exit(0);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char name[FY_ENV_NAME_MAX + 1];
    fy_env_key_t key;
    if (fy_env_keyfile_parse(data, size, name, &key) != FY_OK) return 0;
    size_t nl = strlen(name);
    if (nl < 1 || nl > FY_ENV_NAME_MAX) fail("name length");
    for (size_t i = 0; i < nl; i++)
        if ((unsigned char)name[i] <= 0x20 || (unsigned char)name[i] >= 0x7f) fail("a name byte");
    char text[FY_ENV_KEYFILE_MAX];
    size_t n = fy_env_keyfile_format(name, &key, text, sizeof(text));
    if (!n) fail("what parses does not format");
    bool nl_end = size && data[size - 1] == '\n';
    if (n - !nl_end != size || memcmp(text, data, size)) fail("not canonical");
    return 0;
}

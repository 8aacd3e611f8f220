/*
 * util.h - what ferry's libFuzzer targets share: the libFuzzer entry
 * points' prototypes, a quiet log, a private scratch folder for parsers
 * that read files, splitting one input into several parts, reading
 * numbers off an input, the default model, and the check that turns a
 * broken property into a crash (so libFuzzer keeps the input).
 *
 * Linked as a static archive: a target that uses none of it gets none of
 * it.  Files that the library maps (GGUF, safetensors) are read into a
 * heap buffer of exactly their size instead (see mmap in util.c), so that
 * AddressSanitizer sees a read past the end of the file, which a real
 * mapping would hide in the rest of the last page.
 *
 * Not here: any target's logic; libFuzzer's own hooks (a target defines
 * LLVMFuzzerInitialize itself if it needs it).
 */
#ifndef FY_FUZZ_UTIL_H
#define FY_FUZZ_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* Exit status that tests/fuzz/run.sh reads as "skipped" (the model is absent);
 * not 77, libFuzzer's own status for a crash. */
#define FZ_SKIP 121

/* ferry's log lines go nowhere (each rejected input logs one), unless
 * FUZZ_LOG=1; they are still formatted, so a bad format argument shows. */
void fz_quiet_log(void);

/* A private folder (in /dev/shm when it can be), removed at exit. */
const char *fz_dir(void);
/* Writes len bytes to fz_dir()/name (mode 0600) and returns the path
 * (a buffer that lives until the next call with the same name slot:
 * four rotate).  Aborts if the write fails: that is the machine, not
 * the input. */
const char *fz_write(const char *name, const void *data, size_t len);
/* Removes fz_dir()/name if it exists. */
void fz_unlink(const char *name);

/* A NUL-terminated copy of n bytes (malloc; free it). */
char *fz_strndup(const void *p, size_t n);

/* Separates the files of one input that stands for several (a model
 * folder, shards, a tokenizer and its config).  Unlikely in real files;
 * the dictionaries list it so that the fuzzer makes and keeps it. */
#define FZ_SEP "\n--ferry-fuzz-file--\n"

/* the deployment's secret the etcd seeds are signed with (mkseeds.c) and
 * fuzz_etcd verifies records with */
#define FZ_MEMBER_SECRET "ferry-fuzz-membership-secret-16+"

/* Splits data at each occurrence of sep into at most max parts (the last
 * part takes the rest); returns the count (at least 1). */
typedef struct fz_part {
    const uint8_t *p;
    size_t n;
} fz_part_t;
size_t fz_split(const uint8_t *data, size_t size, const char *sep, fz_part_t *parts, size_t max);

/* Numbers taken off the front of an input; zeros once it runs out. */
typedef struct fz_in {
    const uint8_t *p;
    size_t n;
} fz_in_t;
uint8_t fz_u8(fz_in_t *in);
uint32_t fz_u32(fz_in_t *in);
uint64_t fz_u64(fz_in_t *in);
double fz_f64(fz_in_t *in);

/* The default model ($FERRY_MODEL, else models/SmolLM2-135M-Instruct.Q4_1.gguf)
 * or, when absent, a message and exit(FZ_SKIP). */
const char *fz_default_model(void);

/* A property that must hold for every input: on failure, the message and
 * abort(), which libFuzzer reports as a crash and keeps the input. */
#define FZ_CHECK(cond, ...)                                                                                            \
    do {                                                                                                               \
        if (!(cond)) fz_fail(__FILE__, __LINE__, #cond, __VA_ARGS__);                                                  \
    } while (0)
_Noreturn void fz_fail(const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif /* FY_FUZZ_UTIL_H */

/*
 * fuzz_chat.c - chat templates (model/chat.c): the template of a model
 * file is untrusted code for ferry's Jinja interpreter.  An input is the
 * template, then optionally a NUL byte and message contents separated by
 * NUL bytes (roles system, user, assistant, user, ... in turn).
 *
 * Checks: creating the template fails with a parse status (format,
 * invalid, unsupported) or succeeds, and rendering it fails with
 * FY_ERR_INVALID or gives a NUL-terminated output within the interpreter's
 * 16 MiB bound, in bounded time (libFuzzer's -timeout) and memory
 * (-rss_limit_mb): runaway loops, recursion and output growth must be
 * stopped by chat.c's limits.  Seeds: the templates of SmolLM2, Llama-2,
 * Llama-3, Mistral, Zephyr, Qwen2, Phi-3 and Gemma as test_chat.c has them,
 * and ChatML.
 */
#include <stdlib.h>
#include <string.h>

#include "model/chat.h"
#include "common/mem.h"
#include "tests/fuzz/util.h"

#define MAX_MSGS 8

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fz_quiet_log();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const roles[] = {"system", "user", "assistant", "user"};
    const uint8_t *nul = memchr(data, 0, size);
    size_t tlen = nul ? (size_t)(nul - data) : size;
    char *src = fz_strndup(data, tlen);
    fy_chat_msg_t msgs[MAX_MSGS];
    char *texts[MAX_MSGS] = {0};
    size_t n = 0;
    if (nul) {
        const uint8_t *rest = nul + 1;
        size_t off = 0, left = size - tlen - 1;
        while (n < MAX_MSGS && off <= left) {
            const uint8_t *e = memchr(rest + off, 0, left - off);
            size_t l = e ? (size_t)(e - (rest + off)) : left - off;
            texts[n] = fz_strndup(rest + off, l);
            msgs[n] = (fy_chat_msg_t){roles[n % 4], texts[n]};
            n++;
            off += l + 1;
        }
    } else {
        static char hi[] = "Hello!", sys[] = "You are terse.";
        msgs[n++] = (fy_chat_msg_t){"system", sys};
        msgs[n++] = (fy_chat_msg_t){"user", hi};
    }
    fy_chat_template_t *t = NULL;
    fy_status_t st = fy_chat_template_create(src, "<s>", "</s>", &t);
    FZ_CHECK(st == FY_OK || st == FY_ERR_FORMAT || st == FY_ERR_INVALID || st == FY_ERR_UNSUPPORTED,
             "fy_chat_template_create returned %s", fy_status_str(st));
    if (st == FY_OK) {
        for (int gen = 0; gen < 2; gen++) {
            char *out = NULL;
            st = fy_chat_template_apply(t, msgs, n, gen, &out);
            FZ_CHECK(st == FY_OK || st == FY_ERR_INVALID, "fy_chat_template_apply returned %s", fy_status_str(st));
            if (st == FY_OK) {
                FZ_CHECK(out != NULL, "no output");
                FZ_CHECK(strlen(out) <= ((size_t)16 << 20), "output of %zu bytes", strlen(out));
            }
            fy_free(out);
        }
        fy_chat_template_destroy(t);
    }
    for (size_t i = 0; i < n; i++) free(texts[i]);
    free(src);
    return 0;
}

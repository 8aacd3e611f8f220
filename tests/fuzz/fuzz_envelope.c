/*
 * fuzz_envelope.c - the control plane's envelope (common/envelope.h), the
 * first thing every nng socket of a cluster does with bytes from the
 * network: fy_env_parse, fy_env_open with one identity's key,
 * fy_env_open_as with a router's credentials (each sender's key derived
 * from the deployment's, the receiver checked), and the replay guard on
 * whatever opens.
 *
 * Checks: a header that parses is canonical (sealing the parsed header
 * over the same payload gives back the very same header bytes, and a
 * refusal re-encodes to the input); fy_env_open accepts exactly the inputs
 * whose tag is the one the key gives (so the fuzzer can only get past the
 * MAC with the seeds' own tags); an encrypted message (the kind's AEAD
 * bit) that opens seals back, from its plaintext, to exactly the input,
 * and what we encrypt opens to what we encrypted; what opens agrees with
 * what parses;
 * fy_env_open_as accepts only what opens under the key fy_env_key_of
 * names and is addressed to the router (or is a hello); the guard never
 * crashes on any time or sequence, and never takes the same message
 * twice.
 *
 * Builds on its own (the project's libFuzzer rules pick up tests/fuzz/fuzz_*.c):
 *   clang -fsanitize=fuzzer,address,undefined -I. tests/fuzz/fuzz_envelope.c \
 *         common/envelope.c common/log.c common/mem.c -lsodium -lpthread -o fuzz_envelope
 * Seeds: FY_FUZZ_SEEDS=tests/fuzz/corpus/envelope ./fuzz_envelope writes
 * them (messages, replies, a hello, a refusal, another secret's message,
 * one for another router, plain msgpack, encrypted messages and an
 * encrypted reply) and exits.  fy_env_open decrypts in place: every open
 * here works on a copy of the input.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/envelope.h"
#include "common/log.h"

static const uint8_t SECRET[32] = "fuzz_envelope's deployment key.";
static fy_env_auth_t g_me;
static fy_env_keys_t *g_keys;
static fy_env_guard_t *g_guard;

static void quiet(fy_log_level_t level, const char *line, void *arg) { (void)level, (void)line, (void)arg; }

static void fail(const char *what)
{
    fprintf(stderr, "fuzz_envelope: %s\n", what);
    abort();
}

/* ---- seeds ---- */

static void write_seed(const char *dir, const char *name, const uint8_t *buf, size_t len)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, len, f) != len || fclose(f)) fail("cannot write a seed");
}

static bool g_seed_aead; /* seal_seed encrypts */

static size_t seal_seed(const fy_env_auth_t *a, fy_env_kind_t kind, int to_role, const char *to_name, uint64_t seq,
                        const char *payload, uint8_t *out)
{
    fy_env_hdr_t h;
    memset(&h, 0, sizeof(h));
    h.kind = kind;
    h.role = a->role;
    snprintf(h.name, sizeof(h.name), "%s", a->name);
    h.to.role = to_role;
    snprintf(h.to.name, sizeof(h.to.name), "%s", to_name);
    h.inc = a->inc;
    h.chan = 0x1122334455667788ull;
    h.seq = seq;
    h.ts_ms = 1700000000000ull + seq;
    if (kind == FY_ENV_REPLY) h.re_chan = 99, h.re_seq = seq;
    h.aead = g_seed_aead && (kind == FY_ENV_MSG || kind == FY_ENV_REPLY);
    size_t hl = fy_env_header_bytes(&h), n = strlen(payload);
    memcpy(out + hl, payload, n);
    if (!fy_env_seal_as(a, NULL, &h, out + hl, n, out)) fail("a seed's key");
    return hl + n;
}

static void write_seeds(const char *dir)
{
    static const uint8_t other[32] = "somebody else's deployment key.";
    fy_env_auth_t dec, rtr, cli, stranger;
    char longname[64];
    memset(longname, 'w', 63);
    longname[63] = 0;
    if (fy_env_auth_init(&dec, SECRET, 32, FY_ROLE_DECODE, "decode-0", 7) ||
        fy_env_auth_init(&rtr, SECRET, 32, FY_ROLE_ROUTER, "router", 8) ||
        fy_env_auth_init(&cli, SECRET, 32, FY_ROLE_CLIENT, longname, 9) ||
        fy_env_auth_init(&stranger, other, 32, FY_ROLE_PREFILL, "prefill-0", 10))
        fail("cannot make the seeds' credentials");
    uint8_t buf[1024];
    /* a load report's start, a reserve command's, a poll and its events */
    static const char load[] = "\x84\xa1v\x01\xa4type\xa4load\xa6worker\xa8"
                               "decode-0\xa3inc\x07";
    static const char reserve[] = "\x84\xa1v\x01\xa4type\xa7reserve\xa2to\x07\xa2id\x2a";
    static const char poll[] = "\x84\xa1v\x01\xa4type\xa4poll\xa2id\x01\xa6wait_s\x01";
    static const char events[] = "\x83\xa1v\x01\xa4type\xa6"
                                 "events\xa4"
                                 "done\xc3";
    write_seed(dir, "load", buf, seal_seed(&dec, FY_ENV_MSG, FY_ROLE_ROUTER, "router", 1, load, buf));
    write_seed(dir, "reserve", buf, seal_seed(&rtr, FY_ENV_MSG, FY_ROLE_DECODE, "decode-0", 2, reserve, buf));
    write_seed(dir, "poll-long-name", buf, seal_seed(&cli, FY_ENV_MSG, FY_ROLE_ROUTER, "router", 3, poll, buf));
    write_seed(dir, "reply", buf, seal_seed(&rtr, FY_ENV_REPLY, FY_ROLE_CLIENT, longname, 4, events, buf));
    write_seed(dir, "empty", buf, seal_seed(&dec, FY_ENV_MSG, FY_ROLE_ROUTER, "router", 5, "", buf));
    write_seed(dir, "another-secret", buf, seal_seed(&stranger, FY_ENV_MSG, FY_ROLE_ROUTER, "router", 6, load, buf));
    write_seed(dir, "hello", buf, seal_seed(&cli, FY_ENV_HELLO, 0, "", 7, "", buf));
    write_seed(dir, "another-router", buf, seal_seed(&cli, FY_ENV_MSG, FY_ROLE_ROUTER, "router-b", 8, poll, buf));
    write_seed(dir, "plain-msgpack", (const uint8_t *)load, sizeof(load) - 1);
    g_seed_aead = true; /* the same, encrypted (cluster.encrypt off loopback) */
    write_seed(dir, "aead-load", buf, seal_seed(&dec, FY_ENV_MSG, FY_ROLE_ROUTER, "router", 11, load, buf));
    write_seed(dir, "aead-poll", buf, seal_seed(&cli, FY_ENV_MSG, FY_ROLE_ROUTER, "router", 12, poll, buf));
    write_seed(dir, "aead-reply", buf, seal_seed(&rtr, FY_ENV_REPLY, FY_ROLE_CLIENT, longname, 13, events, buf));
    write_seed(dir, "aead-empty", buf, seal_seed(&dec, FY_ENV_MSG, FY_ROLE_ROUTER, "router", 14, "", buf));
    g_seed_aead = false;
    fy_env_hdr_t h;
    memset(&h, 0, sizeof(h));
    h.role = FY_ROLE_ROUTER;
    snprintf(h.name, sizeof(h.name), "router");
    h.inc = 8, h.chan = 5, h.seq = 1, h.ts_ms = 1700000000000ull;
    size_t n = fy_env_refusal(&h, FY_ENV_MAC, buf, sizeof(buf));
    if (!n) fail("cannot write a refusal");
    write_seed(dir, "refusal", buf, n);
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
    if (fy_env_auth_init(&g_me, SECRET, sizeof(SECRET), FY_ROLE_ROUTER, "router", 1) || fy_env_keys_create(&g_keys) ||
        fy_env_guard_create(64, 0, &g_guard))
        fail("cannot set up");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fy_env_hdr_t h, o;
    size_t off = 0, ooff = 0;
    fy_env_fault_t pf = fy_env_parse(data, size, &h, &off);
    if (pf != FY_ENV_OK && pf != FY_ENV_FORMAT) fail("parse gave a fault other than format");
    if (pf == FY_ENV_OK) {
        if (off > size || off != fy_env_header_bytes(&h) || off > FY_ENV_MAX_HEADER) fail("header size");
        size_t nl = strnlen(h.name, sizeof(h.name));
        if (nl < 1 || nl > FY_ENV_NAME_MAX) fail("name length");
        if (!h.inc || !h.chan || !h.seq) fail("a zero id parsed");
        uint8_t *buf = malloc(size ? size : 1), *cp = malloc(size ? size : 1), *re = malloc(size ? size : 1);
        if (!buf || !cp || !re) {
            free(buf), free(cp), free(re);
            return 0;
        }
        if (h.kind == FY_ENV_REFUSAL) {
            if (off != size) fail("bytes after a refusal");
            if (fy_env_refusal(&h, h.reason, buf, size) != size || memcmp(buf, data, size))
                fail("refusal not canonical");
        } else {
            /* sealing what was parsed over the same payload gives the same header
             * (encrypted: the input's payload taken for plaintext) */
            memcpy(buf + off, data + off, size - off);
            fy_env_seal(&g_me.key, &h, buf + off, size - off, buf);
            if (memcmp(buf, data, off - FY_ENV_TAG_BYTES)) fail("header not canonical");
            memcpy(cp, data, size);
            fy_env_fault_t of = fy_env_open(&g_me.key, cp, size, &o, &ooff);
            if (!h.aead) {
                bool tag_ok = !memcmp(buf + off - FY_ENV_TAG_BYTES, data + off - FY_ENV_TAG_BYTES, FY_ENV_TAG_BYTES);
                if ((of == FY_ENV_OK) != tag_ok) fail("open disagrees with the tag");
                if (memcmp(cp, data, size)) fail("opening a clear message changed it");
            } else if (of == FY_ENV_OK) { /* decrypted in cp: encrypting that again gives the input */
                memcpy(re + off, cp + off, size - off);
                fy_env_seal(&g_me.key, &h, re + off, size - off, re);
                if (memcmp(re, data, size)) fail("an opened encrypted message does not seal back to itself");
            }
            if (of != FY_ENV_OK && of != FY_ENV_MAC) fail("open of a parsed message: neither ok nor mac");
            /* and what we seal opens, to what was sealed */
            if (fy_env_open(&g_me.key, buf, size, &o, &ooff) != FY_ENV_OK || ooff != off) fail("own seal refused");
            if (memcmp(buf + off, data + off, size - off)) fail("own seal opened to other bytes");
            /* with credentials: authentic under the sender's key and for the router, or refused */
            fy_env_key_t k;
            if (!fy_env_key_of(&g_me, NULL, &h, &k)) fail("a master lacks a key");
            memcpy(cp, data, size);
            bool auth_ok = fy_env_open(&k, cp, size, &o, &ooff) == FY_ENV_OK;
            bool to_me = h.kind == FY_ENV_HELLO ? !h.to.role
                                                : h.to.role == FY_ROLE_ROUTER && !strcmp(h.to.name, "router") &&
                                                      (!h.to.inc || h.to.inc == g_me.inc);
            memcpy(cp, data, size);
            fy_env_fault_t af = fy_env_open_as(&g_me, g_keys, cp, size, &o, &ooff);
            if (af != (!auth_ok ? FY_ENV_MAC : !to_me ? FY_ENV_IDENTITY : FY_ENV_OK)) fail("open_as disagrees");
            if (h.kind == FY_ENV_HELLO && (h.to.role || h.to.name[0] || h.to.inc || off != size))
                fail("a hello with a receiver or a payload parsed");
        }
        free(buf), free(cp), free(re);
    }
    uint8_t *cp = malloc(size ? size : 1);
    if (!cp) return 0;
    memcpy(cp, data, size);
    fy_env_fault_t f = fy_env_open(&g_me.key, cp, size, &o, &ooff);
    free(cp);
    if (f == FY_ENV_OK) {
        if (pf != FY_ENV_OK || ooff != off || o.seq != h.seq || o.chan != h.chan || strcmp(o.name, h.name))
            fail("open and parse disagree");
        /* the guard at this message's own time: whatever it says, never twice yes */
        fy_env_fault_t a = fy_env_guard_admit(g_guard, &o, o.ts_ms);
        fy_env_fault_t b = fy_env_guard_admit(g_guard, &o, o.ts_ms);
        if (a == FY_ENV_OK && b == FY_ENV_OK) fail("the guard took a message twice");
    } else if (pf != FY_ENV_OK && f != FY_ENV_FORMAT) {
        fail("an unparsable input opened to a fault other than format");
    }
    return 0;
}

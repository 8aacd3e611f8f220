/*
 * test_envelope.c - the control plane's envelope (common/envelope.c):
 * sealed messages open with the same secret only; any altered or missing
 * byte is refused; replies carry the request they answer; refusals parse;
 * the replay guard takes messages a little out of order and never one
 * twice, refuses stale and future times, and stays safe when it forgets
 * a channel; keys differ by secret and never equal the secret itself;
 * encrypted envelopes open only under their identity's AEAD key.
 */
#include <stdio.h>
#include <string.h>

#include "common/envelope.h"
#include "common/mem.h"
#include "tests/testutil.h"

static const uint8_t SECRET[32] = "the deployment secret, 32 bytes";
static const uint8_t OTHER[32] = "another deployment's secret....";

static fy_env_auth_t auth_of(const uint8_t *secret, fy_env_role_t role, const char *name)
{
    fy_env_auth_t a;
    assert_int_equal(fy_env_auth_init(&a, secret, 32, role, name, 0), FY_OK);
    return a;
}

static fy_env_hdr_t hdr_of(const fy_env_auth_t *a, fy_env_kind_t kind, uint64_t chan, uint64_t seq, uint64_t ts)
{
    fy_env_hdr_t h;
    memset(&h, 0, sizeof(h));
    h.kind = kind;
    h.role = a->role;
    snprintf(h.name, sizeof(h.name), "%s", a->name);
    h.inc = a->inc;
    h.chan = chan;
    h.seq = seq;
    h.ts_ms = ts;
    return h;
}

/* A sealed message in buf; its length. */
static size_t seal(const fy_env_auth_t *a, const fy_env_hdr_t *h, const char *payload, uint8_t *buf)
{
    size_t hl = fy_env_header_bytes(h), n = strlen(payload);
    memcpy(buf + hl, payload, n);
    fy_env_seal(&a->key, h, buf + hl, n, buf);
    return hl + n;
}

static void test_seal_open(void **state)
{
    (void)state;
    fy_env_auth_t a = auth_of(SECRET, FY_ROLE_DECODE, "decode-0");
    fy_env_auth_t b = auth_of(SECRET, FY_ROLE_ROUTER, "router");
    assert_memory_equal(a.ctl.k, b.ctl.k, FY_ENV_KEY_BYTES);     /* one secret, one control-plane key */
    assert_memory_not_equal(a.key.k, b.key.k, FY_ENV_KEY_BYTES); /* a key per identity */
    assert_true(a.inc != 0 && a.inc != b.inc);
    uint8_t buf[512];
    fy_env_hdr_t h = hdr_of(&a, FY_ENV_MSG, 77, 5, fy_env_now_ms());
    h.to = (fy_env_peer_t){.role = FY_ROLE_ROUTER, .name = "router"};
    size_t n = seal(&a, &h, "a load report", buf);
    fy_env_hdr_t got;
    size_t off;
    assert_int_equal(fy_env_open_as(&b, NULL, buf, n, &got, &off), FY_ENV_OK);
    assert_int_equal(got.kind, FY_ENV_MSG);
    assert_int_equal(got.role, FY_ROLE_DECODE);
    assert_string_equal(got.name, "decode-0");
    assert_true(got.inc == a.inc && got.chan == 77 && got.seq == 5 && got.ts_ms == h.ts_ms);
    assert_int_equal(n - off, strlen("a load report"));
    assert_memory_equal(buf + off, "a load report", n - off);
    /* an empty payload is a message too */
    n = seal(&a, &h, "", buf);
    assert_int_equal(fy_env_open_as(&b, NULL, buf, n, &got, &off), FY_ENV_OK);
    assert_int_equal(off, n);
    /* a reply names the request it answers */
    fy_env_hdr_t r = hdr_of(&b, FY_ENV_REPLY, 9, 1, fy_env_now_ms());
    r.to = (fy_env_peer_t){.role = FY_ROLE_DECODE, .name = "decode-0", .inc = a.inc};
    r.re_chan = 77;
    r.re_seq = 5;
    n = seal(&b, &r, "events", buf);
    assert_int_equal(fy_env_open_as(&a, NULL, buf, n, &got, &off), FY_ENV_OK);
    assert_int_equal(got.kind, FY_ENV_REPLY);
    assert_true(got.re_chan == 77 && got.re_seq == 5);
    fy_env_auth_wipe(&a);
    fy_env_auth_wipe(&b);
}

static void test_forged_and_altered(void **state)
{
    (void)state;
    fy_env_auth_t a = auth_of(SECRET, FY_ROLE_DECODE, "decode-0");
    fy_env_auth_t x = auth_of(OTHER, FY_ROLE_DECODE, "decode-0");
    assert_memory_not_equal(a.key.k, x.key.k, FY_ENV_KEY_BYTES);
    uint8_t buf[512], alt[512];
    fy_env_hdr_t h = hdr_of(&x, FY_ENV_MSG, 3, 1, fy_env_now_ms());
    size_t n = seal(&x, &h, "{load}", buf);
    fy_env_hdr_t got;
    size_t off;
    /* another secret's message: parses, does not verify */
    assert_int_equal(fy_env_parse(buf, n, &got, &off), FY_ENV_OK);
    assert_int_equal(fy_env_open(&a.key, buf, n, &got, &off), FY_ENV_MAC);
    /* plain msgpack (no envelope) */
    assert_int_equal(fy_env_open(&a.key, "\x82\xa1v\x01\xa4type\xa4load", 13, &got, &off), FY_ENV_FORMAT);
    /* every byte altered in turn, every bit of it: never accepted */
    h = hdr_of(&a, FY_ENV_MSG, 3, 1, fy_env_now_ms());
    n = seal(&a, &h, "{a real payload}", buf);
    assert_int_equal(fy_env_open(&a.key, buf, n, &got, &off), FY_ENV_OK);
    for (size_t i = 0; i < n; i++) {
        for (int bit = 0; bit < 8; bit++) {
            memcpy(alt, buf, n);
            alt[i] ^= (uint8_t)(1u << bit);
            fy_env_fault_t f = fy_env_open(&a.key, alt, n, &got, &off);
            if (f != FY_ENV_MAC && f != FY_ENV_FORMAT)
                fail_msg("byte %zu bit %d altered: %s", i, bit, fy_env_fault_str(f));
        }
    }
    /* cut short anywhere, or a byte more: never accepted */
    for (size_t k = 0; k < n; k++) assert_int_not_equal(fy_env_open(&a.key, buf, k, &got, &off), FY_ENV_OK);
    memcpy(alt, buf, n);
    alt[n] = 'x';
    assert_int_equal(fy_env_open(&a.key, alt, n + 1, &got, &off), FY_ENV_MAC);
    fy_env_auth_wipe(&a);
    fy_env_auth_wipe(&x);
}

static void test_refusal(void **state)
{
    (void)state;
    fy_env_auth_t r = auth_of(SECRET, FY_ROLE_ROUTER, "router");
    fy_env_hdr_t h = hdr_of(&r, FY_ENV_MSG, 4, 2, fy_env_now_ms());
    uint8_t buf[FY_ENV_MAX_HEADER];
    size_t n = fy_env_refusal(&h, FY_ENV_REPLAY, buf, sizeof(buf));
    assert_true(n > 0);
    assert_int_equal(fy_env_refusal(&h, FY_ENV_REPLAY, buf, n - 1), 0);
    fy_env_hdr_t got;
    size_t off;
    assert_int_equal(fy_env_parse(buf, n, &got, &off), FY_ENV_OK);
    assert_int_equal(got.kind, FY_ENV_REFUSAL);
    assert_int_equal(got.reason, FY_ENV_REPLAY);
    assert_int_equal(off, n);
    /* a refusal carries nothing, and is never a message */
    assert_int_equal(fy_env_open(&r.key, buf, n, &got, &off), FY_ENV_FORMAT);
    uint8_t more[FY_ENV_MAX_HEADER + 1];
    memcpy(more, buf, n);
    more[n] = 0;
    assert_int_equal(fy_env_parse(more, n + 1, &got, &off), FY_ENV_FORMAT);
    buf[n - 1] = FY_ENV_N_FAULTS; /* an unknown reason */
    assert_int_equal(fy_env_parse(buf, n, &got, &off), FY_ENV_FORMAT);
    fy_env_auth_wipe(&r);
}

static void test_names_and_keys(void **state)
{
    (void)state;
    fy_env_auth_t a;
    fy_test_log_begin();
    assert_int_equal(fy_env_auth_init(&a, SECRET, 32, FY_ROLE_DECODE, "has space", 0), FY_ERR_INVALID);
    assert_int_equal(fy_env_auth_init(&a, SECRET, 32, FY_ROLE_DECODE, "", 0), FY_ERR_INVALID);
    assert_int_equal(fy_env_auth_init(&a, SECRET, 15, FY_ROLE_DECODE, "x", 0), FY_ERR_INVALID);
    assert_int_equal(fy_env_auth_init(&a, SECRET, 32, (fy_env_role_t)9, "x", 0), FY_ERR_INVALID);
    fy_test_log_end();
    char longname[80];
    memset(longname, 'n', sizeof(longname));
    longname[63] = 0;
    assert_int_equal(fy_env_auth_init(&a, SECRET, 32, FY_ROLE_CLIENT, longname, 42), FY_OK);
    assert_true(a.inc == 42);
    /* the control-plane key is derived, never the secret itself */
    assert_memory_not_equal(a.key.k, SECRET, FY_ENV_KEY_BYTES);
    uint8_t buf[512];
    fy_env_hdr_t h = hdr_of(&a, FY_ENV_MSG, 1, 1, 1);
    size_t n = seal(&a, &h, "", buf);
    assert_int_equal(n, fy_env_header_bytes(&h));
    assert_true(n <= FY_ENV_MAX_HEADER);
    fy_env_hdr_t r = hdr_of(&a, FY_ENV_REPLY, 1, 1, 1);
    assert_true(fy_env_header_bytes(&r) <= FY_ENV_MAX_HEADER);
    fy_env_auth_wipe(&a);
}

/* Issue 32 item 3: keys per identity.  A client holds only its own key
 * (what `ferry key --client` writes): with it, it cannot speak as a
 * router, a worker or another client, nor read what is between a router
 * and another client.  The deployment's secret (what every client held
 * before) could do all of it: the controls below. */
static void test_identity_keys(void **state)
{
    (void)state;
    fy_env_auth_t router = auth_of(SECRET, FY_ROLE_ROUTER, "router");
    fy_env_auth_t decode = auth_of(SECRET, FY_ROLE_DECODE, "decode-0");
    fy_env_key_t k;
    fy_env_identity_key(&router.ctl, FY_ROLE_CLIENT, "mallory", &k);
    fy_env_auth_t mallory;
    assert_int_equal(fy_env_auth_client(&mallory, &k, "mallory", 0), FY_OK);
    assert_false(mallory.master);
    fy_env_auth_t root = auth_of(SECRET, FY_ROLE_CLIENT, "mallory"); /* the secret in a client's hands */
    assert_memory_equal(root.key.k, k.k, FY_ENV_KEY_BYTES);          /* the same identity key */
    uint8_t buf[512];
    fy_env_hdr_t got;
    size_t off;
    const fy_env_peer_t to_router = {.role = FY_ROLE_ROUTER, .name = "router"};
    const fy_env_peer_t to_decode = {.role = FY_ROLE_DECODE, .name = "decode-0"};
    /* as itself, to the router: taken */
    fy_env_hdr_t h = hdr_of(&mallory, FY_ENV_MSG, 5, 1, fy_env_now_ms());
    h.to = to_router;
    size_t hl = fy_env_header_bytes(&h);
    assert_true(fy_env_seal_as(&mallory, NULL, &h, buf + hl, 0, buf));
    assert_int_equal(fy_env_open_as(&router, NULL, buf, hl, &got, &off), FY_ENV_OK);
    /* as a router to a worker (a release, a reserve), as a worker to the
     * router (a load report, a fake decode worker), as another client (its
     * polls and cancels): the client key has none of those keys */
    struct {
        int role;
        const char *name;
        const fy_env_peer_t *to;
        const fy_env_auth_t *rx;
    } forged[] = {{FY_ROLE_ROUTER, "router", &to_decode, &decode},
                  {FY_ROLE_DECODE, "decode-0", &to_router, &router},
                  {FY_ROLE_DECODE, "fake-decode", &to_router, &router},
                  {FY_ROLE_CLIENT, "alice", &to_router, &router}};
    for (size_t i = 0; i < sizeof(forged) / sizeof(forged[0]); i++) {
        fy_env_hdr_t f = h;
        f.role = forged[i].role;
        snprintf(f.name, sizeof(f.name), "%s", forged[i].name);
        f.to = *forged[i].to;
        hl = fy_env_header_bytes(&f);
        assert_false(fy_env_seal_as(&mallory, NULL, &f, buf + hl, 0, buf)); /* no such key */
        fy_env_seal(&mallory.key, &f, buf + hl, 0, buf);                    /* its own, then */
        assert_int_equal(fy_env_open_as(forged[i].rx, NULL, buf, hl, &got, &off), FY_ENV_MAC);
        /* the control: the secret forges it */
        assert_true(fy_env_seal_as(&root, NULL, &f, buf + hl, 0, buf));
        assert_int_equal(fy_env_open_as(forged[i].rx, NULL, buf, hl, &got, &off), FY_ENV_OK);
    }
    /* a reply from the router to alice: mallory cannot open it */
    fy_env_hdr_t r = hdr_of(&router, FY_ENV_REPLY, 9, 1, fy_env_now_ms());
    r.to = (fy_env_peer_t){.role = FY_ROLE_CLIENT, .name = "alice", .inc = 7};
    hl = fy_env_header_bytes(&r);
    memcpy(buf + hl, "tokens", 6);
    assert_true(fy_env_seal_as(&router, NULL, &r, buf + hl, 6, buf));
    assert_int_equal(fy_env_open_as(&mallory, NULL, buf, hl + 6, &got, &off), FY_ENV_MAC);
    /* the key table gives what derivation gives, for many identities */
    fy_env_keys_t *keys;
    assert_int_equal(fy_env_keys_create(&keys), FY_OK);
    for (int i = 0; i < 600; i++) {
        fy_env_hdr_t c = hdr_of(&mallory, FY_ENV_MSG, 5, 1, 1);
        snprintf(c.name, sizeof(c.name), "client-%d", i % 300);
        fy_env_key_t a, b;
        assert_true(fy_env_key_of(&router, keys, &c, &a));
        fy_env_identity_key(&router.ctl, FY_ROLE_CLIENT, c.name, &b);
        assert_memory_equal(a.k, b.k, FY_ENV_KEY_BYTES);
    }
    fy_env_keys_destroy(keys);
    fy_env_auth_wipe(&router);
    fy_env_auth_wipe(&decode);
    fy_env_auth_wipe(&mallory);
    fy_env_auth_wipe(&root);
}

/* Issue 32 (privacy): an encrypted envelope (XChaCha20-Poly1305, the
 * header as associated data).  It round-trips and its bytes hold no
 * plaintext; every altered bit (header, tag or ciphertext), a cut, the
 * flag dropped (a downgrade to the MAC) or another secret is refused as
 * mac and never yields plaintext; the AEAD key is neither the MAC key nor
 * another identity's; a client key cannot read what is between the
 * router and another client; the guard still refuses a replay; and only a
 * message or a reply may carry the flag. */
static void test_aead(void **state)
{
    (void)state;
    static const char text[] = "a distinctive prompt: zebra umbrella quantum";
    const size_t tl = sizeof(text) - 1;
    fy_env_auth_t router = auth_of(SECRET, FY_ROLE_ROUTER, "router");
    fy_env_auth_t decode = auth_of(SECRET, FY_ROLE_DECODE, "decode-0");
    fy_env_auth_t stranger = auth_of(OTHER, FY_ROLE_DECODE, "decode-0");
    uint8_t buf[512], alt[512];
    fy_env_hdr_t got;
    size_t off;

    /* keys: distinct from the MAC key, per identity, and one-way from it */
    fy_env_key_t ea, eb;
    fy_env_aead_key(&decode.key, &ea);
    fy_env_aead_key(&router.key, &eb);
    assert_memory_not_equal(ea.k, decode.key.k, FY_ENV_KEY_BYTES);
    assert_memory_not_equal(ea.k, eb.k, FY_ENV_KEY_BYTES);

    /* round trip: a message, decrypted in place */
    fy_env_hdr_t h = hdr_of(&decode, FY_ENV_MSG, 77, 5, fy_env_now_ms());
    h.to = (fy_env_peer_t){.role = FY_ROLE_ROUTER, .name = "router"};
    h.aead = true;
    size_t hl = fy_env_header_bytes(&h), n = hl + tl;
    memcpy(buf + hl, text, tl);
    assert_true(fy_env_seal_as(&decode, NULL, &h, buf + hl, tl, buf));
    assert_null(memmem(buf, n, "zebra", 5));
    assert_int_equal(buf[4], FY_ENV_MSG | FY_ENV_KIND_AEAD);
    memcpy(alt, buf, n);
    assert_int_equal(fy_env_parse(buf, n, &got, &off), FY_ENV_OK); /* parsing decrypts nothing */
    assert_true(got.aead);
    assert_memory_equal(buf, alt, n);
    assert_int_equal(fy_env_open_as(&router, NULL, buf, n, &got, &off), FY_ENV_OK);
    assert_true(got.aead && got.kind == FY_ENV_MSG && got.seq == 5);
    assert_int_equal(n - off, tl);
    assert_memory_equal(buf + off, text, tl);
    /* the guard: once, not twice */
    fy_env_guard_t *g;
    assert_int_equal(fy_env_guard_create(16, fy_env_now_ms() - 1000, &g), FY_OK);
    assert_int_equal(fy_env_guard_admit(g, &got, fy_env_now_ms()), FY_ENV_OK);
    memcpy(buf, alt, n);
    assert_int_equal(fy_env_open_as(&router, NULL, buf, n, &got, &off), FY_ENV_OK);
    assert_int_equal(fy_env_guard_admit(g, &got, fy_env_now_ms()), FY_ENV_REPLAY);
    fy_env_guard_destroy(g);

    /* every single bit altered, anywhere: refused, and no plaintext comes out */
    for (size_t i = 0; i < n; i++)
        for (int bit = 0; bit < 8; bit++) {
            memcpy(buf, alt, n);
            buf[i] ^= (uint8_t)(1u << bit);
            fy_env_fault_t f = fy_env_open_as(&router, NULL, buf, n, &got, &off);
            if (f == FY_ENV_OK) fail_msg("byte %zu bit %d altered: opened", i, bit);
            if (memmem(buf, n, "zebra", 5)) fail_msg("byte %zu bit %d altered: plaintext came out", i, bit);
        }
    /* the flag dropped: the AEAD's tag is no MAC (a downgrade to clear opens nothing) */
    memcpy(buf, alt, n);
    buf[4] = FY_ENV_MSG;
    assert_int_equal(fy_env_open_as(&router, NULL, buf, n, &got, &off), FY_ENV_MAC);
    /* the associated data: the header's receiver changed, tag kept */
    memcpy(buf, alt, n);
    buf[7 + strlen("decode-0") + 2] ^= 1; /* "router" -> "souter" */
    assert_int_equal(fy_env_open(&decode.key, buf, n, &got, &off), FY_ENV_MAC);
    /* cut short, or a byte added */
    for (size_t k = 0; k < n; k++) {
        memcpy(buf, alt, n);
        assert_int_not_equal(fy_env_open_as(&router, NULL, buf, k, &got, &off), FY_ENV_OK);
    }
    memcpy(buf, alt, n);
    buf[n] = 0;
    assert_int_equal(fy_env_open_as(&router, NULL, buf, n + 1, &got, &off), FY_ENV_MAC);
    /* another deployment's secret, same identity */
    memcpy(buf, alt, n);
    assert_int_equal(fy_env_open(&stranger.key, buf, n, &got, &off), FY_ENV_MAC);
    /* the MAC key used as the AEAD key, or the AEAD key as the identity key: nothing opens */
    memcpy(buf, alt, n);
    assert_int_equal(fy_env_open(&ea, buf, n, &got, &off), FY_ENV_MAC);
    memcpy(buf, alt, n);
    assert_int_equal(fy_env_open(&eb, buf, n, &got, &off), FY_ENV_MAC);

    /* a reply to alice, encrypted with alice's key: alice reads it, mallory's key does not */
    fy_env_key_t ka, km;
    fy_env_identity_key(&router.ctl, FY_ROLE_CLIENT, "alice", &ka);
    fy_env_identity_key(&router.ctl, FY_ROLE_CLIENT, "mallory", &km);
    fy_env_auth_t alice, mallory;
    assert_int_equal(fy_env_auth_client(&alice, &ka, "alice", 7), FY_OK);
    assert_int_equal(fy_env_auth_client(&mallory, &km, "mallory", 8), FY_OK);
    assert_int_equal(alice.crypt, FY_ENV_CRYPT_AUTO);
    fy_env_hdr_t r = hdr_of(&router, FY_ENV_REPLY, 9, 1, fy_env_now_ms());
    r.to = (fy_env_peer_t){.role = FY_ROLE_CLIENT, .name = "alice", .inc = 7};
    r.re_chan = 3, r.re_seq = 4;
    r.aead = true;
    hl = fy_env_header_bytes(&r);
    n = hl + tl;
    memcpy(buf + hl, text, tl);
    assert_true(fy_env_seal_as(&router, NULL, &r, buf + hl, tl, buf));
    memcpy(alt, buf, n);
    assert_null(memmem(buf, n, "zebra", 5));
    assert_int_equal(fy_env_open_as(&mallory, NULL, buf, n, &got, &off), FY_ENV_MAC);
    assert_null(memmem(buf, n, "zebra", 5));
    memcpy(buf, alt, n);
    assert_int_equal(fy_env_open(&mallory.key, buf, n, &got, &off), FY_ENV_MAC); /* its own key, forcibly */
    assert_null(memmem(buf, n, "zebra", 5));
    memcpy(buf, alt, n);
    assert_int_equal(fy_env_open_as(&alice, NULL, buf, n, &got, &off), FY_ENV_OK);
    assert_true(got.aead && got.kind == FY_ENV_REPLY && got.re_chan == 3 && got.re_seq == 4);
    assert_memory_equal(buf + off, text, tl);
    /* and alice's own request, encrypted with her key, opens at the router and not with mallory's key */
    fy_env_hdr_t q = hdr_of(&alice, FY_ENV_MSG, 11, 1, fy_env_now_ms());
    q.to = (fy_env_peer_t){.role = FY_ROLE_ROUTER, .name = "router"};
    q.aead = true;
    hl = fy_env_header_bytes(&q);
    n = hl + tl;
    memcpy(buf + hl, text, tl);
    assert_true(fy_env_seal_as(&alice, NULL, &q, buf + hl, tl, buf));
    memcpy(alt, buf, n);
    assert_int_equal(fy_env_open(&mallory.key, buf, n, &got, &off), FY_ENV_MAC);
    memcpy(buf, alt, n);
    assert_int_equal(fy_env_open_as(&router, NULL, buf, n, &got, &off), FY_ENV_OK);
    assert_memory_equal(buf + off, text, tl);

    /* the flag on a hello or a refusal: not an envelope */
    fy_env_hdr_t he = hdr_of(&alice, FY_ENV_HELLO, 12, 1, fy_env_now_ms());
    hl = fy_env_header_bytes(&he);
    assert_true(fy_env_seal_as(&alice, NULL, &he, buf + hl, 0, buf));
    assert_int_equal(fy_env_open_as(&router, NULL, buf, hl, &got, &off), FY_ENV_OK);
    buf[4] |= FY_ENV_KIND_AEAD;
    assert_int_equal(fy_env_parse(buf, hl, &got, &off), FY_ENV_FORMAT);
    n = fy_env_refusal(&r, FY_ENV_MAC, buf, sizeof(buf));
    assert_int_equal(fy_env_parse(buf, n, &got, &off), FY_ENV_OK);
    buf[4] |= FY_ENV_KIND_AEAD;
    assert_int_equal(fy_env_parse(buf, n, &got, &off), FY_ENV_FORMAT);

    /* the policy: auto encrypts off loopback only, always everywhere, off nowhere */
    assert_false(fy_env_crypt_wanted(FY_ENV_CRYPT_AUTO, true));
    assert_true(fy_env_crypt_wanted(FY_ENV_CRYPT_AUTO, false));
    assert_true(fy_env_crypt_wanted(FY_ENV_CRYPT_ALWAYS, true));
    assert_false(fy_env_crypt_wanted(FY_ENV_CRYPT_OFF, false));
    fy_env_auth_wipe(&router);
    fy_env_auth_wipe(&decode);
    fy_env_auth_wipe(&stranger);
    fy_env_auth_wipe(&alice);
    fy_env_auth_wipe(&mallory);
}

/* Issue 32 item 4: a message names its receiver; another receiver (other
 * name, or the same name in another incarnation) refuses it as identity. */
static void test_receiver_binding(void **state)
{
    (void)state;
    fy_env_auth_t a, b, a2;
    assert_int_equal(fy_env_auth_init(&a, SECRET, 32, FY_ROLE_ROUTER, "router-a", 11), FY_OK);
    assert_int_equal(fy_env_auth_init(&b, SECRET, 32, FY_ROLE_ROUTER, "router-b", 12), FY_OK);
    assert_int_equal(fy_env_auth_init(&a2, SECRET, 32, FY_ROLE_ROUTER, "router-a", 13), FY_OK); /* restarted */
    fy_env_auth_t cl = auth_of(SECRET, FY_ROLE_CLIENT, "client");
    uint8_t buf[512];
    fy_env_hdr_t got;
    size_t off;
    fy_env_hdr_t h = hdr_of(&cl, FY_ENV_MSG, 5, 1, fy_env_now_ms());
    h.to = (fy_env_peer_t){.role = FY_ROLE_ROUTER, .name = "router-a", .inc = 11};
    size_t n = seal(&cl, &h, "generate", buf);
    assert_int_equal(fy_env_open_as(&a, NULL, buf, n, &got, &off), FY_ENV_OK);
    assert_int_equal(fy_env_open_as(&b, NULL, buf, n, &got, &off), FY_ENV_IDENTITY);
    assert_int_equal(fy_env_open_as(&a2, NULL, buf, n, &got, &off), FY_ENV_IDENTITY);
    /* inc 0: any incarnation of that name (the workers' pushes) */
    h.to.inc = 0;
    n = seal(&cl, &h, "generate", buf);
    assert_int_equal(fy_env_open_as(&a2, NULL, buf, n, &got, &off), FY_ENV_OK);
    assert_int_equal(fy_env_open_as(&b, NULL, buf, n, &got, &off), FY_ENV_IDENTITY);
    /* to nobody: only a hello, which carries nothing */
    memset(&h.to, 0, sizeof(h.to));
    n = seal(&cl, &h, "generate", buf);
    assert_int_equal(fy_env_open_as(&a, NULL, buf, n, &got, &off), FY_ENV_IDENTITY);
    h.kind = FY_ENV_HELLO;
    n = seal(&cl, &h, "", buf);
    assert_int_equal(fy_env_open_as(&a, NULL, buf, n, &got, &off), FY_ENV_OK);
    assert_int_equal(got.kind, FY_ENV_HELLO);
    n = seal(&cl, &h, "x", buf); /* a hello with a payload does not parse */
    assert_int_equal(fy_env_parse(buf, n, &got, &off), FY_ENV_FORMAT);
    h.kind = FY_ENV_MSG; /* a name without a role, an incarnation without a name: not a header */
    h.to.inc = 5;
    n = seal(&cl, &h, "", buf);
    assert_int_equal(fy_env_parse(buf, n, &got, &off), FY_ENV_FORMAT);
    fy_env_auth_wipe(&a);
    fy_env_auth_wipe(&b);
    fy_env_auth_wipe(&a2);
    fy_env_auth_wipe(&cl);
}

static void test_keyfile(void **state)
{
    (void)state;
    fy_env_key_t k, got;
    for (int i = 0; i < FY_ENV_KEY_BYTES; i++) k.k[i] = (uint8_t)(i * 37 + 1);
    char text[FY_ENV_KEYFILE_MAX], name[FY_ENV_NAME_MAX + 1];
    size_t n = fy_env_keyfile_format("alice", &k, text, sizeof(text));
    assert_true(n > 0 && n <= FY_ENV_KEYFILE_MAX);
    assert_int_equal(strncmp(text, FY_ENV_KEYFILE_MAGIC "alice ", strlen(FY_ENV_KEYFILE_MAGIC) + 6), 0);
    assert_int_equal(fy_env_keyfile_parse(text, n, name, &got), FY_OK);
    assert_string_equal(name, "alice");
    assert_memory_equal(got.k, k.k, FY_ENV_KEY_BYTES);
    assert_int_equal(fy_env_keyfile_parse(text, n - 1, name, &got), FY_OK); /* the newline is optional */
    char alt[FY_ENV_KEYFILE_MAX + 2];
    for (size_t i = 0; i + 1 < n; i++) { /* any byte changed to a space, an upper-case digit, a NUL: refused */
        const char subs[3] = {' ', 'A', 0};
        for (int j = 0; j < 3; j++) {
            memcpy(alt, text, n);
            if (alt[i] == subs[j] ||
                (i >= strlen(FY_ENV_KEYFILE_MAGIC) && i < strlen(FY_ENV_KEYFILE_MAGIC) + 5 && subs[j] == 'A'))
                continue; /* 'A' is a fine letter of a name */
            alt[i] = subs[j];
            assert_int_equal(fy_env_keyfile_parse(alt, n, name, &got), FY_ERR_FORMAT);
        }
    }
    memcpy(alt, text, n);
    alt[n] = '\n'; /* two newlines */
    assert_int_equal(fy_env_keyfile_parse(alt, n + 1, name, &got), FY_ERR_FORMAT);
    assert_int_equal(fy_env_keyfile_parse("ferry-client-key 1 ", 19, name, &got), FY_ERR_FORMAT);
    assert_int_equal(fy_env_keyfile_format("has space", &k, text, sizeof(text)), 0);
    assert_int_equal(fy_env_keyfile_format("alice", &k, text, 40), 0);
}

static fy_env_hdr_t at(uint64_t chan, uint64_t seq, uint64_t ts)
{
    fy_env_hdr_t h;
    memset(&h, 0, sizeof(h));
    h.kind = FY_ENV_MSG;
    h.role = FY_ROLE_DECODE;
    snprintf(h.name, sizeof(h.name), "decode-0");
    h.inc = 1234;
    h.chan = chan;
    h.seq = seq;
    h.ts_ms = ts;
    return h;
}

static void test_replay_window(void **state)
{
    (void)state;
    const uint64_t t0 = 1700000000000ull;
    fy_env_guard_t *g;
    assert_int_equal(fy_env_guard_create(16, t0, &g), FY_OK);
    fy_env_hdr_t h = at(5, 100, t0 + 10);
    assert_int_equal(fy_env_guard_admit(g, &h, t0 + 10), FY_ENV_OK);
    assert_int_equal(fy_env_guard_admit(g, &h, t0 + 10), FY_ENV_REPLAY); /* the same message again */
    /* later ones, and earlier ones inside the window, once each */
    for (uint64_t s = 101; s < 140; s += 2) {
        h = at(5, s, t0 + 20);
        assert_int_equal(fy_env_guard_admit(g, &h, t0 + 20), FY_ENV_OK);
    }
    for (uint64_t s = 102; s < 140; s += 2) {
        h = at(5, s, t0 + 20);
        assert_int_equal(fy_env_guard_admit(g, &h, t0 + 20), FY_ENV_OK);
        assert_int_equal(fy_env_guard_admit(g, &h, t0 + 20), FY_ENV_REPLAY);
    }
    /* a jump ahead; what falls behind the window is refused, even if never seen */
    h = at(5, 1000, t0 + 30);
    assert_int_equal(fy_env_guard_admit(g, &h, t0 + 30), FY_ENV_OK);
    h = at(5, 1000 - FY_ENV_WINDOW + 1, t0 + 30);
    assert_int_equal(fy_env_guard_admit(g, &h, t0 + 30), FY_ENV_OK);
    h = at(5, 1000 - FY_ENV_WINDOW, t0 + 30);
    assert_int_equal(fy_env_guard_admit(g, &h, t0 + 30), FY_ENV_REPLAY);
    h = at(5, 141, t0 + 30);
    assert_int_equal(fy_env_guard_admit(g, &h, t0 + 30), FY_ENV_REPLAY);
    /* the same channel claimed by another sender */
    h = at(5, 2000, t0 + 30);
    h.inc = 999;
    assert_int_equal(fy_env_guard_admit(g, &h, t0 + 30), FY_ENV_IDENTITY);
    h = at(5, 2000, t0 + 30);
    snprintf(h.name, sizeof(h.name), "decode-1");
    assert_int_equal(fy_env_guard_admit(g, &h, t0 + 30), FY_ENV_IDENTITY);
    /* channels are independent */
    h = at(6, 100, t0 + 30);
    assert_int_equal(fy_env_guard_admit(g, &h, t0 + 30), FY_ENV_OK);
    fy_env_guard_destroy(g);
}

static void test_times(void **state)
{
    (void)state;
    const uint64_t t0 = 1700000000000ull, now = t0 + 600000;
    fy_env_guard_t *g;
    assert_int_equal(fy_env_guard_create(16, t0, &g), FY_OK);
    /* from the future beyond the skew; from before this receiver started */
    fy_env_hdr_t h = at(1, 1, now + FY_ENV_SKEW_MS + 1);
    assert_int_equal(fy_env_guard_admit(g, &h, now), FY_ENV_STALE);
    h = at(1, 1, t0 - FY_ENV_SKEW_MS - 1);
    assert_int_equal(fy_env_guard_admit(g, &h, now), FY_ENV_STALE);
    /* a new channel must be fresh; a known one may be slow */
    h = at(2, 1, now - FY_ENV_FRESH_MS - 1);
    assert_int_equal(fy_env_guard_admit(g, &h, now), FY_ENV_STALE);
    h = at(2, 1, now - 5);
    assert_int_equal(fy_env_guard_admit(g, &h, now), FY_ENV_OK);
    h = at(2, 2, now - FY_ENV_FRESH_MS - 1000);
    assert_int_equal(fy_env_guard_admit(g, &h, now), FY_ENV_OK);
    /* within the skew either way */
    h = at(3, 1, now + FY_ENV_SKEW_MS);
    assert_int_equal(fy_env_guard_admit(g, &h, now), FY_ENV_OK);
    fy_env_guard_destroy(g);
}

static void test_forgetting(void **state)
{
    (void)state;
    const uint64_t t0 = 1700000000000ull;
    fy_env_guard_t *g;
    assert_int_equal(fy_env_guard_create(4, t0, &g), FY_OK);
    /* channel 1 speaks first and last at t0+100, then four others push it out */
    fy_env_hdr_t h = at(1, 1, t0 + 100);
    assert_int_equal(fy_env_guard_admit(g, &h, t0 + 100), FY_ENV_OK);
    for (uint64_t c = 2; c <= 5; c++) {
        h = at(c, 1, t0 + 200 + c);
        assert_int_equal(fy_env_guard_admit(g, &h, t0 + 300), FY_ENV_OK);
    }
    /* channel 1's old message is not new again: the floor keeps it out */
    h = at(1, 1, t0 + 100);
    assert_int_equal(fy_env_guard_admit(g, &h, t0 + 300), FY_ENV_STALE);
    /* a message it sends now is fresh, and opens it again */
    h = at(1, 2, t0 + 300);
    assert_int_equal(fy_env_guard_admit(g, &h, t0 + 300), FY_ENV_OK);
    /* the most recently heard ones were kept: their replays are still caught */
    h = at(5, 1, t0 + 205);
    assert_int_equal(fy_env_guard_admit(g, &h, t0 + 300), FY_ENV_REPLAY);
    fy_env_guard_destroy(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seal_open),     cmocka_unit_test(test_identity_keys),
        cmocka_unit_test(test_aead),          cmocka_unit_test(test_receiver_binding),
        cmocka_unit_test(test_keyfile),       cmocka_unit_test(test_forged_and_altered),
        cmocka_unit_test(test_refusal),       cmocka_unit_test(test_names_and_keys),
        cmocka_unit_test(test_replay_window), cmocka_unit_test(test_times),
        cmocka_unit_test(test_forgetting),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * wire.c - the control plane's message schemas (see wire.h).
 *
 * Each message is a table of fields: name, kind, required or optional,
 * when it is written, where it lives in the struct, and its range (static,
 * narrowed by the reader's fy_wire_lim_t where a bound depends on the
 * reader's situation).  One writer and one reader walk any table, so a
 * field is named once and written and read the same way; a message's
 * rules across fields (exactly one of prompt and tokens, as many blocks as
 * the prompt has) are its check function, run after the fields.  The
 * range checks themselves are msg.c's getters, so their error texts are
 * the ones the handlers gave when they read the fields by hand.
 */
#include "common/wire.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/mem.h"

/* ---- tables ------------------------------------------------------------------------------------------- */

typedef enum kind {
    K_U64 = 0, /* uint64_t */
    K_I64,     /* int64_t */
    K_I32,     /* int32_t, written as an integer */
    K_F64,     /* double */
    K_BOOL,
    K_STR,   /* char[size]: a string of at most size - 1 bytes without NUL */
    K_TEXT,  /* const char * and size_t: a string (or bytes) in the message, written as a string */
    K_BIN,   /* const void * and size_t: bytes (or a string), written as bytes */
    K_I32S,  /* int32_t * (or int32_t[cap] inline) and an int32_t count */
    K_U64S,  /* uint64_t * (or inline) and a count */
    K_F32S,  /* float * and a count */
    K_STRS,  /* char[cap][len] inline and a count: strings of 1 to len - 1 bytes */
    K_MAP,   /* a nested map: the struct at off, its fields in sub */
    K_HDR,   /* a header: the fields of sub at off, in this map (gen: the generation parameters) */
    K_F32,   /* float, written as a double */
    K_ENUM,  /* an enum (int), written as its name: ename(0 .. cap - 1) */
    K_BYTES, /* char[cap + 1] inline and an int32_t length: a string of at most cap bytes without NUL, kept
                NUL-terminated */
} kind_t;

typedef enum put {
    P_ALWAYS = 0, /* written every time */
    P_NONZERO,    /* written when not zero (0, false, "", NULL) */
    P_HAS,        /* written when the bool at has is true; a read sets it when the field is there */
    P_NOTDEF,     /* K_F32: written when not def */
} put_t;

/* Bounds that come from the reader's fy_wire_lim_t (each narrows the static one). */
typedef enum lim_ref {
    L_NONE = 0,
    L_TOKEN,         /* hi: lim->token_hi */
    L_NPROMPT,       /* hi: lim->n_prompt */
    L_NPROMPT_M1,    /* hi: lim->n_prompt - 1 */
    L_NBLOCKS_M1,    /* hi: the prompt's blocks - 1 (n_prompt, block_size) */
    L_PROMPT_BLOCKS, /* hi: max_prompt / block_size */
    L_MAX_PROMPT,    /* cap: lim->max_prompt */
    L_NBLOCKS,       /* cap: the prompt's blocks, times the kv groups */
    L_MAX_NBLOCKS,   /* cap: the blocks of the longest prompt (max_prompt), times the kv groups */
    L_MAX_CTX,       /* cap: lim->max_ctx (one entry per token a sequence can hold) */
    L_CTX,           /* hi: lim->max_ctx (max_tokens) */
    L_MSG_NBLOCKS,   /* cap: the blocks of the "tokens" read before it in this message (block_size), times the
                        kv groups */
} lim_ref_t;

typedef struct field {
    const char *name;
    kind_t kind;
    fy_msg_need_t need;
    put_t put;
    lim_ref_t lim, limcap; /* narrowing of hi, and of cap */
    bool inl;              /* arrays: stored in the struct */
    size_t off;            /* the value */
    size_t aux;            /* the count (arrays), the length (text, bin) */
    size_t has;            /* P_HAS: the bool */
    int64_t ilo, ihi;
    uint64_t ulo, uhi;
    double dlo, dhi;
    int64_t cap; /* arrays: entries; text, bin: bytes; K_STR: the buffer's size; K_STRS: entries */
    int64_t len; /* K_STRS: each entry's buffer size */
    const struct field *sub;
    int32_t n_sub;
    double def;                  /* P_NOTDEF: the value not written */
    const char *(*ename)(int v); /* K_ENUM: the name of each value */
    bool gen;                    /* K_HDR: the generation parameters (one row in the docs, genspec defaults) */
    /* inline arrays whose count is derived from other fields (no aux): written with countf(m) entries, read
     * without storing a count (the K_HDR's check compares) */
    int32_t (*countf)(const void *m);
    /* K_HDR: checks across its fields once they are read (the first fault into r) */
    void (*check)(fy_msgr_t *r, const void *m);
} field_t;

struct fy_wire_schema {
    const char *type, *name, *route;
    const field_t *fields;
    int32_t n_fields;
    size_t size;
    void (*check)(fy_msgr_t *r, const fy_wire_lim_t *lim, const void *m);
};

#define OFF(T, m) offsetof(T, m)
#define MSIZE(T, m) sizeof(((T *)0)->m)
/* put = WHEN(T, has_x): written when m->has_x */
#define WHEN(T, h) P_HAS, .has = OFF(T, h)

#define U64(T, nm, m, nd, pt, lo, hi)                                                                                  \
    {                                                                                                                  \
        .name = nm, .kind = K_U64, .need = nd, .put = pt, .off = OFF(T, m), .ulo = lo, .uhi = hi                       \
    }
#define I64(T, nm, m, nd, pt, lo, hi)                                                                                  \
    {                                                                                                                  \
        .name = nm, .kind = K_I64, .need = nd, .put = pt, .off = OFF(T, m), .ilo = lo, .ihi = hi                       \
    }
#define I32(T, nm, m, nd, pt, lo, hi)                                                                                  \
    {                                                                                                                  \
        .name = nm, .kind = K_I32, .need = nd, .put = pt, .off = OFF(T, m), .ilo = lo, .ihi = hi                       \
    }
/* hi narrowed by the reader's lim (l: a lim_ref_t) */
#define I32_LIM(T, nm, m, nd, pt, lo, hi, l)                                                                           \
    {                                                                                                                  \
        .name = nm, .kind = K_I32, .need = nd, .put = pt, .off = OFF(T, m), .ilo = lo, .ihi = hi, .lim = l             \
    }
#define F64(T, nm, m, nd, pt, lo, hi)                                                                                  \
    {                                                                                                                  \
        .name = nm, .kind = K_F64, .need = nd, .put = pt, .off = OFF(T, m), .dlo = lo, .dhi = hi                       \
    }
#define BOOL(T, nm, m, nd, pt)                                                                                         \
    {                                                                                                                  \
        .name = nm, .kind = K_BOOL, .need = nd, .put = pt, .off = OFF(T, m)                                            \
    }
#define STR(T, nm, m, nd, pt)                                                                                          \
    {                                                                                                                  \
        .name = nm, .kind = K_STR, .need = nd, .put = pt, .off = OFF(T, m), .cap = (int64_t)MSIZE(T, m)                \
    }
#define TEXT(T, nm, m, n, nd, pt, max)                                                                                 \
    {                                                                                                                  \
        .name = nm, .kind = K_TEXT, .need = nd, .put = pt, .off = OFF(T, m), .aux = OFF(T, n), .cap = max              \
    }
#define BIN(T, nm, m, n, nd, pt, max)                                                                                  \
    {                                                                                                                  \
        .name = nm, .kind = K_BIN, .need = nd, .put = pt, .off = OFF(T, m), .aux = OFF(T, n), .cap = max               \
    }
#define I32S(T, nm, m, n, nd, pt, lo, hi, max)                                                                         \
    {                                                                                                                  \
        .name = nm, .kind = K_I32S, .need = nd, .put = pt, .off = OFF(T, m), .aux = OFF(T, n), .ilo = lo, .ihi = hi,   \
        .cap = max                                                                                                     \
    }
/* hi and cap narrowed by the reader's lim */
#define I32S_LIM(T, nm, m, n, nd, pt, lo, hi, max, l, lc)                                                              \
    {                                                                                                                  \
        .name = nm, .kind = K_I32S, .need = nd, .put = pt, .off = OFF(T, m), .aux = OFF(T, n), .ilo = lo, .ihi = hi,   \
        .cap = max, .lim = l, .limcap = lc                                                                             \
    }
/* an int32 array inside the struct: its size is the cap */
#define I32S_IN(T, nm, m, n, nd, pt, lo, hi)                                                                           \
    {                                                                                                                  \
        .name = nm, .kind = K_I32S, .need = nd, .put = pt, .off = OFF(T, m), .aux = OFF(T, n), .ilo = lo, .ihi = hi,   \
        .cap = (int64_t)(MSIZE(T, m) / sizeof(int32_t)), .inl = true                                                   \
    }
#define U64S(T, nm, m, n, nd, pt, max)                                                                                 \
    {                                                                                                                  \
        .name = nm, .kind = K_U64S, .need = nd, .put = pt, .off = OFF(T, m), .aux = OFF(T, n), .cap = max              \
    }
#define U64S_IN(T, nm, m, n, nd, pt)                                                                                   \
    {                                                                                                                  \
        .name = nm, .kind = K_U64S, .need = nd, .put = pt, .off = OFF(T, m), .aux = OFF(T, n),                         \
        .cap = (int64_t)(MSIZE(T, m) / sizeof(uint64_t)), .inl = true                                                  \
    }
#define F32S(T, nm, m, n, nd, pt, max)                                                                                 \
    {                                                                                                                  \
        .name = nm, .kind = K_F32S, .need = nd, .put = pt, .off = OFF(T, m), .aux = OFF(T, n), .cap = max              \
    }
#define F32S_LIM(T, nm, m, n, nd, pt, max, lc)                                                                         \
    {                                                                                                                  \
        .name = nm, .kind = K_F32S, .need = nd, .put = pt, .off = OFF(T, m), .aux = OFF(T, n), .cap = max,             \
        .limcap = lc                                                                                                   \
    }
#define STRS_IN(T, nm, m, n, nd, pt)                                                                                   \
    {                                                                                                                  \
        .name = nm, .kind = K_STRS, .need = nd, .put = pt, .off = OFF(T, m), .aux = OFF(T, n),                         \
        .cap = (int64_t)(MSIZE(T, m) / MSIZE(T, m[0])), .len = (int64_t)MSIZE(T, m[0]), .inl = true                    \
    }
#define MAP(T, nm, m, nd, pt, tab)                                                                                     \
    {                                                                                                                  \
        .name = nm, .kind = K_MAP, .need = nd, .put = pt, .off = OFF(T, m), .sub = tab,                                \
        .n_sub = (int32_t)FY_ARRAY_LEN(tab)                                                                            \
    }
#define HDR(T, m, tab)                                                                                                 \
    {                                                                                                                  \
        .name = "", .kind = K_HDR, .off = OFF(T, m), .sub = tab, .n_sub = (int32_t)FY_ARRAY_LEN(tab)                   \
    }
#define F32(T, nm, m, nd, pt, lo, hi)                                                                                  \
    {                                                                                                                  \
        .name = nm, .kind = K_F32, .need = nd, .put = pt, .off = OFF(T, m), .dlo = lo, .dhi = hi                       \
    }
/* written when not d */
#define F32_DEF(T, nm, m, nd, lo, hi, d)                                                                               \
    {                                                                                                                  \
        .name = nm, .kind = K_F32, .need = nd, .put = P_NOTDEF, .off = OFF(T, m), .dlo = lo, .dhi = hi, .def = d       \
    }
#define ENUM(T, nm, m, nd, pt, fn, n)                                                                                  \
    {                                                                                                                  \
        .name = nm, .kind = K_ENUM, .need = nd, .put = pt, .off = OFF(T, m), .ename = fn, .cap = n                     \
    }
#define BYTES_IN(T, nm, m, n, nd, pt)                                                                                  \
    {                                                                                                                  \
        .name = nm, .kind = K_BYTES, .need = nd, .put = pt, .off = OFF(T, m), .aux = OFF(T, n),                        \
        .cap = (int64_t)MSIZE(T, m) - 1                                                                                \
    }
/* an inline int32 array written with countf(m) entries (no count of its own; optional, when not zero) */
#define I32S_DERIVED(T, nm, m, fn, lo, hi)                                                                             \
    {                                                                                                                  \
        .name = nm, .kind = K_I32S, .need = FY_OPT, .put = P_NONZERO, .off = OFF(T, m), .ilo = lo, .ihi = hi,          \
        .cap = (int64_t)(MSIZE(T, m) / sizeof(int32_t)), .inl = true, .countf = fn                                     \
    }
#define F32S_IN(T, nm, m, n, nd, pt)                                                                                   \
    {                                                                                                                  \
        .name = nm, .kind = K_F32S, .need = nd, .put = pt, .off = OFF(T, m), .aux = OFF(T, n),                         \
        .cap = (int64_t)(MSIZE(T, m) / sizeof(float)), .inl = true                                                     \
    }

/* The generation parameters (common/genspec.h): in the map of every
 * message that carries a request (generate, reserve, prefill), as
 * fy_genspec_write and fy_genspec_read put and take them. */
static const char *spec_name(int v) { return fy_spec_method_str((fy_spec_method_t)v); }
static const char *grammar_name(int v) { return fy_gen_grammar_str((fy_gen_grammar_t)v); }
static void genspec_check(fy_msgr_t *r, const void *m);
static int32_t bad_ids_count(const void *m)
{
    const fy_genspec_t *g = m;
    int32_t total = 0;
    for (int32_t i = 0; i < g->n_bad && i < FY_GEN_MAX_BAD_SEQS; i++) total += g->bad_lens[i];
    return total < FY_GEN_MAX_BAD_TOKENS ? total : FY_GEN_MAX_BAD_TOKENS;
}

#define T fy_genspec_t
static const field_t GENSPEC[] = {
    F32(T, "temperature", sampling.temperature, FY_OPT, P_ALWAYS, 0, FY_GEN_TEMPERATURE_MAX),
    I32(T, "top_k", sampling.top_k, FY_OPT, P_ALWAYS, 0, FY_GEN_TOP_K_MAX),
    /* the bound is a float: top_p is kept and forwarded as a float, and 1e-6
     * is not one (the float nearest a top_p of 1e-6 is just below it) */
    F32(T, "top_p", sampling.top_p, FY_OPT, P_ALWAYS, FY_GEN_TOP_P_MIN, 1),
    F32(T, "min_p", sampling.min_p, FY_OPT, P_ALWAYS, 0, 1),
    U64(T, "seed", sampling.seed, FY_OPT, P_ALWAYS, 0, UINT64_MAX),
    I32_LIM(T, "max_tokens", max_tokens, FY_OPT, P_ALWAYS, 1, INT32_MAX, L_CTX),
    STRS_IN(T, "stop", stop, n_stop, FY_OPT, P_NONZERO),
    BOOL(T, "ignore_eos", ignore_eos, FY_OPT, P_NONZERO),
    BOOL(T, "logprobs", logprobs, FY_OPT, P_NONZERO),
    I32(T, "priority", priority, FY_OPT, P_NONZERO, -FY_GEN_PRIORITY_MAX, FY_GEN_PRIORITY_MAX),
    ENUM(T, "spec", spec, FY_OPT, P_NONZERO, spec_name, FY_SPEC_DRAFT + 1),
    I32(T, "kv_budget", kv_budget, FY_OPT, P_NONZERO, 0, FY_GEN_KV_BUDGET_MAX),
    F32(T, "presence_penalty", presence_penalty, FY_OPT, P_NONZERO, -FY_GEN_PENALTY_MAX, FY_GEN_PENALTY_MAX),
    F32(T, "frequency_penalty", frequency_penalty, FY_OPT, P_NONZERO, -FY_GEN_PENALTY_MAX, FY_GEN_PENALTY_MAX),
    F32_DEF(T, "repetition_penalty", repetition_penalty, FY_OPT, FY_GEN_REP_PENALTY_MIN, FY_GEN_REP_PENALTY_MAX, 1),
    /* as many of each (genspec_check) */
    I32S_IN(T, "logit_bias_ids", logit_bias_id, n_logit_bias, FY_OPT, P_NONZERO, 0, INT32_MAX),
    F32S_IN(T, "logit_bias", logit_bias, n_logit_bias, FY_OPT, P_NONZERO),
    I32(T, "min_tokens", min_tokens, FY_OPT, P_NONZERO, 0, INT32_MAX), /* at most max_tokens (genspec_check) */
    I32(T, "top_logprobs", top_logprobs, FY_OPT, P_NONZERO, 0, FY_GEN_MAX_TOP_LOGPROBS),
    I32S_IN(T, "stop_token_ids", stop_ids, n_stop_ids, FY_OPT, P_NONZERO, 0, INT32_MAX),
    ENUM(T, "grammar_kind", grammar_kind, FY_OPT, P_NONZERO, grammar_name, FY_GEN_GRAMMAR_CHOICE + 1),
    BYTES_IN(T, "grammar", grammar, grammar_len, FY_OPT, P_NONZERO),
    /* present: the prompt's logprobs are wanted, with this many alternatives */
    I32(T, "prompt_logprobs", prompt_top, FY_OPT, WHEN(T, prompt_logprobs), 0, FY_GEN_MAX_PROMPT_LOGPROBS),
    /* the ids are the sequences one after another (genspec_check) */
    I32S_IN(T, "bad_words_lens", bad_lens, n_bad, FY_OPT, P_NONZERO, 1, FY_GEN_BAD_SEQ_MAX),
    I32S_DERIVED(T, "bad_words_ids", bad_ids, bad_ids_count, 0, INT32_MAX),
    I32S_IN(T, "allowed_token_ids", allowed_ids, n_allowed, FY_OPT, P_NONZERO, 0, INT32_MAX),
    BOOL(T, "include_stop", include_stop, FY_OPT, P_NONZERO),
    BOOL(T, "render_special", render_special, FY_OPT, P_NONZERO),
};
#undef T
#define GEN(T, m)                                                                                                      \
    {                                                                                                                  \
        .name = "", .kind = K_HDR, .off = OFF(T, m), .sub = GENSPEC, .n_sub = (int32_t)FY_ARRAY_LEN(GENSPEC),          \
        .gen = true, .check = genspec_check                                                                            \
    }

/* ids the router hands out start at 1; the router tries a request at most 1000 times */
#define MAX_ARRAY (1 << 20)

/* headers */
#define T fy_wire_cmd_t
static const field_t CMD[] = {
    U64(T, "to", to, FY_REQ, P_ALWAYS, 1, UINT64_MAX),
    U64(T, "rid", rid, FY_OPT, P_NONZERO, 0, UINT64_MAX),
};
#undef T
#define T fy_wire_ev_t
static const field_t EV[] = {
    STR(T, "worker", worker, FY_REQ, P_ALWAYS),
    U64(T, "inc", inc, FY_REQ, P_ALWAYS, 1, UINT64_MAX),
    U64(T, "rid", rid, FY_OPT, P_NONZERO, 0, UINT64_MAX),
    U64(T, "id", id, FY_OPT, P_ALWAYS, 0, UINT64_MAX),
};
#undef T

/* client <-> router */
#define T fy_wire_generate_t
static const field_t GENERATE[] = {
    TEXT(T, "prompt", prompt, prompt_len, FY_OPT, P_NONZERO, FY_WIRE_MAX_PROMPT_BYTES),
    I32S_LIM(T, "tokens", tokens, n_tokens, FY_OPT, WHEN(T, has_tokens), 0, INT32_MAX, MAX_ARRAY, L_TOKEN,
             L_MAX_PROMPT),
    BOOL(T, "chat", chat, FY_OPT, P_NONZERO),
    TEXT(T, "system", system, system_len, FY_OPT, P_NONZERO, FY_WIRE_MAX_PROMPT_BYTES),
    F64(T, "deadline_s", deadline_s, FY_OPT, P_NONZERO, 0.001, 86400),
    GEN(T, gen),
};
#undef T
#define T fy_wire_poll_t
static const field_t POLL[] = {
    U64(T, "id", id, FY_REQ, P_ALWAYS, 1, UINT64_MAX),
    I32(T, "from", from, FY_OPT, P_ALWAYS, 0, INT32_MAX),
    I64(T, "from_text", from_text, FY_OPT, P_ALWAYS, 0, INT64_MAX),
    F64(T, "wait_s", wait_s, FY_OPT, P_ALWAYS, 0, 30),
};
#undef T
#define T fy_wire_cancel_t
static const field_t CANCEL[] = {
    U64(T, "id", id, FY_REQ, P_ALWAYS, 1, UINT64_MAX),
};
#undef T
#define T fy_wire_accepted_t
static const field_t ACCEPTED[] = {
    U64(T, "id", id, FY_REQ, P_ALWAYS, 1, UINT64_MAX),
    I32(T, "n_prompt", n_prompt, FY_OPT, P_ALWAYS, 0, INT32_MAX),
};
#undef T
#define T fy_wire_req_timings_t
static const field_t REQ_TIMINGS[] = {
    F64(T, "queue_s", queue_s, FY_OPT, P_ALWAYS, -1, 1e9),
    F64(T, "reserve_s", reserve_s, FY_OPT, P_NONZERO, -1, 1e9),
    F64(T, "prefill_queue_s", prefill_queue_s, FY_OPT, P_NONZERO, -1, 1e9),
    F64(T, "prefill_compute_s", prefill_compute_s, FY_OPT, P_NONZERO, -1, 1e9),
    F64(T, "transfer_s", transfer_s, FY_OPT, P_NONZERO, -1, 1e9),
    F64(T, "transfer_tail_s", transfer_tail_s, FY_OPT, P_NONZERO, -1, 1e9),
    F64(T, "prefill_total_s", prefill_total_s, FY_OPT, P_NONZERO, -1, 1e9),
    I64(T, "transfer_bytes", transfer_bytes, FY_OPT, P_NONZERO, 0, INT64_MAX),
    F64(T, "first_token_s", first_token_s, FY_OPT, P_NONZERO, -1, 1e9),
    F64(T, "ttft_s", ttft_s, FY_OPT, P_NONZERO, -1, 1e9),
    F64(T, "e2e_s", e2e_s, FY_OPT, P_ALWAYS, -1, 1e9),
    I32(T, "cached_prefill", cached_prefill, FY_OPT, P_ALWAYS, 0, INT32_MAX),
    I32(T, "cached_decode", cached_decode, FY_OPT, P_ALWAYS, 0, INT32_MAX),
    I32(T, "retries", retries, FY_OPT, P_ALWAYS, 0, INT32_MAX),
};
#undef T
#define T fy_wire_events_t
static const field_t EVENTS[] = {
    U64(T, "id", id, FY_REQ, P_ALWAYS, 1, UINT64_MAX),
    I32S(T, "tokens", tokens, n_tokens, FY_OPT, P_ALWAYS, 0, INT32_MAX, 1 << 17),
    TEXT(T, "text", text, text_len, FY_OPT, P_ALWAYS, 64 << 20),
    I32(T, "n_prompt", n_prompt, FY_OPT, P_ALWAYS, 0, INT32_MAX),
    STR(T, "state", state, FY_OPT, P_ALWAYS),
    BOOL(T, "done", done, FY_REQ, P_ALWAYS),
    STR(T, "error_code", error_code, FY_OPT, P_NONZERO),
    STR(T, "error", error, FY_OPT, P_NONZERO),
    STR(T, "finish_reason", finish_reason, FY_OPT, P_NONZERO),
    MAP(T, "timings", timings, FY_OPT, WHEN(T, has_timings), REQ_TIMINGS),
};
#undef T
#define T fy_wire_cancelled_t
static const field_t CANCELLED[] = {
    U64(T, "id", id, FY_OPT, P_ALWAYS, 0, UINT64_MAX),
};
#undef T
#define T fy_wire_refused_t
static const field_t REFUSED[] = {
    /* fy_env_fault_str's names (tests/test_wire.c checks they agree) */
    U64(T, "format", format, FY_OPT, P_ALWAYS, 0, UINT64_MAX),
    U64(T, "mac", mac, FY_OPT, P_ALWAYS, 0, UINT64_MAX),
    U64(T, "stale", stale, FY_OPT, P_ALWAYS, 0, UINT64_MAX),
    U64(T, "replay", replay, FY_OPT, P_ALWAYS, 0, UINT64_MAX),
    U64(T, "identity", identity, FY_OPT, P_ALWAYS, 0, UINT64_MAX),
    U64(T, "clear", clear, FY_OPT, P_ALWAYS, 0, UINT64_MAX),
};
#undef T
#define T fy_wire_status_reply_t
static const field_t STATUS_REPLY[] = {
    STR(T, "model", model, FY_OPT, P_ALWAYS),
    STR(T, "served_model", served_model, FY_OPT, P_ALWAYS),
    I32(T, "requests", requests, FY_OPT, P_ALWAYS, 0, INT32_MAX),
    I32(T, "queued", queued, FY_OPT, P_ALWAYS, 0, INT32_MAX),
    U64(T, "completed", completed, FY_OPT, P_ALWAYS, 0, UINT64_MAX),
    U64(T, "failed", failed, FY_OPT, P_ALWAYS, 0, UINT64_MAX),
    U64(T, "refused", refused, FY_OPT, P_ALWAYS, 0, UINT64_MAX),
    U64(T, "retried", retried, FY_OPT, P_ALWAYS, 0, UINT64_MAX),
    U64(T, "bad_events", bad_events, FY_OPT, P_ALWAYS, 0, UINT64_MAX),
    I32(T, "prefill_up", prefill_up, FY_OPT, P_ALWAYS, 0, INT32_MAX),
    I32(T, "decode_up", decode_up, FY_OPT, P_ALWAYS, 0, INT32_MAX),
    STRS_IN(T, "workers", workers, n_workers, FY_OPT, P_ALWAYS),
    I32S_IN(T, "up", up, n_up, FY_OPT, P_ALWAYS, INT32_MIN, INT32_MAX),
    I32S_IN(T, "assigned", assigned, n_assigned, FY_OPT, P_ALWAYS, INT32_MIN, INT32_MAX),
    I32S_IN(T, "admittable", admittable, n_admittable, FY_OPT, P_ALWAYS, INT32_MIN, INT32_MAX),
    I32S_IN(T, "total_blocks", total_blocks, n_total_blocks, FY_OPT, P_ALWAYS, INT32_MIN, INT32_MAX),
    I32S_IN(T, "decode", decode, n_decode, FY_OPT, P_ALWAYS, INT32_MIN, INT32_MAX),
    I32S_IN(T, "pending_tokens", pending_tokens, n_pending_tokens, FY_OPT, P_ALWAYS, INT32_MIN, INT32_MAX),
    I32S_IN(T, "ranks", ranks, n_ranks, FY_OPT, P_ALWAYS, 0, 4096),
    I32S_IN(T, "out_of_service", out, n_out, FY_OPT, P_ALWAYS, 0, 1),
    MAP(T, "refused_messages", refused_messages, FY_OPT, P_ALWAYS, REFUSED),
};
#undef T
#define T fy_wire_error_t
static const field_t ERROR_REPLY[] = {
    U64(T, "id", id, FY_OPT, P_ALWAYS, 0, UINT64_MAX),
    STR(T, "code", code, FY_OPT, P_ALWAYS),
    STR(T, "message", message, FY_OPT, P_ALWAYS),
};
#undef T

/* router -> decode worker */
#define T fy_wire_reserve_t
#define RESERVE_FIELDS                                                                                                 \
    HDR(T, cmd, CMD), U64(T, "id", id, FY_REQ, P_ALWAYS, 1, UINT64_MAX), STR(T, "tenant", tenant, FY_OPT, P_ALWAYS),   \
        I32S_LIM(T, "tokens", tokens, n_tokens, FY_REQ, P_ALWAYS, 0, INT32_MAX, MAX_ARRAY, L_TOKEN, L_MAX_PROMPT),     \
        GEN(T, gen)
static const field_t RESERVE[] = {
    RESERVE_FIELDS,
    F64(T, "lease_s", lease_s, FY_OPT, P_NONZERO, 0.01, 3600),
};
static const field_t CMD_GENERATE[] = {RESERVE_FIELDS};
#undef RESERVE_FIELDS
#undef T
#define T fy_wire_renew_t
static const field_t RENEW[] = {
    HDR(T, cmd, CMD),
    U64(T, "id", id, FY_REQ, P_ALWAYS, 1, UINT64_MAX),
    U64(T, "lease", lease, FY_REQ, P_ALWAYS, 1, UINT64_MAX),
    F64(T, "lease_s", lease_s, FY_REQ, P_ALWAYS, 0.01, 3600),
};
#undef T
#define T fy_wire_adopt_t
static const field_t ADOPT[] = {
    HDR(T, cmd, CMD),
    U64(T, "id", id, FY_REQ, P_ALWAYS, 1, UINT64_MAX),
    U64(T, "lease", lease, FY_REQ, P_ALWAYS, 1, UINT64_MAX),
    I32_LIM(T, "first_token", first_token, FY_REQ, P_ALWAYS, 0, INT32_MAX, L_TOKEN),
    F64(T, "logprob", logprob, FY_OPT, P_ALWAYS, -1e30, 0),
    U64S_IN(T, "rng", rng, n_rng, FY_OPT, P_ALWAYS),
    I32S_LIM(T, "kept", kept, n_kept, FY_OPT, P_NONZERO, 0, INT32_MAX, MAX_ARRAY, L_NONE, L_MAX_NBLOCKS),
    F32S_LIM(T, "scores", scores, n_scores, FY_OPT, P_NONZERO, MAX_ARRAY, L_MAX_NBLOCKS),
    I32S_LIM(T, "top_ids", top_ids, n_top_ids, FY_OPT, P_NONZERO, 0, INT32_MAX, FY_GEN_MAX_TOP_LOGPROBS, L_TOKEN,
             L_NONE),
    F32S(T, "top_logprobs", top_logprobs, n_top_logprobs, FY_OPT, P_NONZERO, FY_GEN_MAX_TOP_LOGPROBS),
};
#undef T
#define T fy_wire_release_t
static const field_t RELEASE[] = {
    HDR(T, cmd, CMD),
    U64(T, "id", id, FY_REQ, P_ALWAYS, 1, UINT64_MAX),
};
#undef T

/* router -> prefill worker */
#define T fy_wire_prefill_t
static const field_t PREFILL[] = {
    HDR(T, cmd, CMD),
    U64(T, "id", id, FY_REQ, P_ALWAYS, 1, UINT64_MAX),
    I32(T, "attempt", attempt, FY_OPT, P_ALWAYS, 0, 1000),
    STR(T, "tenant", tenant, FY_OPT, P_ALWAYS),
    I32S_LIM(T, "tokens", tokens, n_tokens, FY_REQ, P_ALWAYS, 0, INT32_MAX, MAX_ARRAY, L_TOKEN, L_MAX_PROMPT),
    GEN(T, gen),
    BIN(T, "target", target, target_len, FY_REQ, P_ALWAYS, 64 << 10),
    I32_LIM(T, "first_block", first_block, FY_REQ, P_ALWAYS, 0, INT32_MAX, L_PROMPT_BLOCKS),
    I32S_LIM(T, "blocks", blocks, n_blocks, FY_REQ, P_ALWAYS, -1, INT32_MAX, MAX_ARRAY, L_NONE, L_MSG_NBLOCKS),
    F64(T, "deadline_s", deadline_s, FY_OPT, P_NONZERO, 0.001, 3600),
    I32_LIM(T, "slots", slots, FY_OPT, P_NONZERO, 0, INT32_MAX, L_PROMPT_BLOCKS),
};
#undef T
#define T fy_wire_extend_t
static const field_t EXTEND[] = {
    HDR(T, cmd, CMD),
    U64(T, "id", id, FY_REQ, P_ALWAYS, 1, UINT64_MAX),
    I32(T, "attempt", attempt, FY_OPT, P_ALWAYS, 0, 1000),
    F64(T, "deadline_s", deadline_s, FY_REQ, P_ALWAYS, 0.001, 3600),
};
#undef T

/* worker -> router */
#define T fy_wire_load_t
static const field_t LOAD[] = {
    HDR(T, ev, EV),
    STR(T, "role", role, FY_REQ, P_ALWAYS),
    STR(T, "listen", listen, FY_REQ, P_ALWAYS),
    STR(T, "model", model, FY_REQ, P_ALWAYS),
    I32(T, "block_size", block_size, FY_REQ, P_ALWAYS, 1, 1024),
    I32(T, "running", running, FY_OPT, P_ALWAYS, 0, 1 << 20),
    I32(T, "waiting", waiting, FY_OPT, P_ALWAYS, 0, 1 << 20),
    I32(T, "swapped", swapped, FY_OPT, P_ALWAYS, 0, INT32_MAX),
    I32(T, "max_seqs", max_seqs, FY_REQ, P_ALWAYS, 1, 1 << 20),
    I32(T, "total_blocks", total_blocks, FY_REQ, P_ALWAYS, 0, INT32_MAX),
    I32(T, "free_blocks", free_blocks, FY_OPT, P_ALWAYS, 0, INT32_MAX),
    I32(T, "cached_blocks", cached_blocks, FY_OPT, P_ALWAYS, 0, INT32_MAX),
    I32(T, "admittable", admittable, FY_OPT, P_ALWAYS, 0, INT32_MAX),
    I32(T, "capacity", capacity, FY_OPT, WHEN(T, has_capacity), 0, INT32_MAX),
    F64(T, "kv_usage", kv_usage, FY_OPT, P_ALWAYS, 0, 1),
    U64(T, "prefix_queries", prefix_queries, FY_OPT, P_ALWAYS, 0, UINT64_MAX),
    U64(T, "prefix_hits", prefix_hits, FY_OPT, P_ALWAYS, 0, UINT64_MAX),
    U64(T, "preemptions", preemptions, FY_OPT, P_ALWAYS, 0, UINT64_MAX),
    U64(T, "bad_commands", bad_commands, FY_OPT, P_ALWAYS, 0, UINT64_MAX),
    BIN(T, "bloom", bloom, bloom_len, FY_OPT, P_NONZERO, FY_WIRE_BLOOM_MAX_BYTES),
    I32(T, "leases", leases, FY_OPT, WHEN(T, has_decode), 0, 1 << 20),
    I32(T, "leased_blocks", leased_blocks, FY_OPT, WHEN(T, has_decode), 0, INT32_MAX),
    U64(T, "leases_expired", leases_expired, FY_OPT, WHEN(T, has_decode), 0, UINT64_MAX),
    U64(T, "leases_renewed", leases_renewed, FY_OPT, WHEN(T, has_decode), 0, UINT64_MAX),
    U64(T, "adopted", adopted, FY_OPT, WHEN(T, has_decode), 0, UINT64_MAX),
    U64(T, "reserve_refused", reserve_refused, FY_OPT, WHEN(T, has_decode), 0, UINT64_MAX),
    I32(T, "jobs", jobs, FY_OPT, WHEN(T, has_prefill), 0, INT32_MAX),
    U64(T, "jobs_done", jobs_done, FY_OPT, WHEN(T, has_prefill), 0, UINT64_MAX),
    U64(T, "jobs_failed", jobs_failed, FY_OPT, WHEN(T, has_prefill), 0, UINT64_MAX),
    I64(T, "bytes_shipped", bytes_shipped, FY_OPT, WHEN(T, has_prefill), 0, INT64_MAX),
    I32(T, "tp", tp, FY_OPT, P_NONZERO, 0, 64),
    I32(T, "pp", pp, FY_OPT, P_NONZERO, 0, 64),
    STR(T, "out_of_service", out_of_service, FY_OPT, P_NONZERO),
    I32(T, "ctx", ctx, FY_OPT, P_NONZERO, 0, 1 << 24),
};
#undef T
#define T fy_wire_alive_t
static const field_t ALIVE[] = {
    HDR(T, ev, EV),
    F64(T, "busy_s", busy_s, FY_OPT, P_ALWAYS, -1e9, 1e9),
};
#undef T
#define T fy_wire_progress_t
static const field_t PROGRESS[] = {
    HDR(T, ev, EV),
    U64S(T, "ids", ids, n_ids, FY_REQ, P_ALWAYS, 4096),
    I32S(T, "attempts", attempts, n_attempts, FY_REQ, P_ALWAYS, 0, 1000, 4096),
    I32S(T, "computed", computed, n_computed, FY_REQ, P_ALWAYS, 0, INT32_MAX, 4096),
};
#undef T
#define T fy_wire_reserved_t
static const field_t RESERVED[] = {
    HDR(T, ev, EV),
    U64(T, "lease", lease, FY_REQ, P_ALWAYS, 1, UINT64_MAX),
    F64(T, "lease_s", lease_s, FY_OPT, P_NONZERO, 0.01, 3600),
    I32_LIM(T, "cached", cached, FY_REQ, P_ALWAYS, 0, INT32_MAX, L_NPROMPT_M1),
    I32_LIM(T, "first_block", first_block, FY_REQ, P_ALWAYS, 0, INT32_MAX, L_NBLOCKS_M1),
    I32S_LIM(T, "blocks", blocks, n_blocks, FY_REQ, P_ALWAYS, -1, INT32_MAX, MAX_ARRAY, L_NONE, L_NBLOCKS),
    BIN(T, "target", target, target_len, FY_REQ, P_ALWAYS, 64 << 10),
    I32(T, "slots", slots, FY_OPT, P_NONZERO, 0, INT32_MAX),
};
#undef T
#define T fy_wire_renewed_t
static const field_t RENEWED[] = {
    HDR(T, ev, EV),
    U64(T, "lease", lease, FY_REQ, P_ALWAYS, 1, UINT64_MAX),
    F64(T, "lease_s", lease_s, FY_REQ, P_ALWAYS, 0.01, 3600),
};
#undef T
#define T fy_wire_ack_t
static const field_t ACK[] = {
    HDR(T, ev, EV),
};
#undef T
#define T fy_wire_job_timings_t
static const field_t JOB_TIMINGS[] = {
    F64(T, "queue_s", queue_s, FY_OPT, P_ALWAYS, 0, 1e9),
    F64(T, "compute_s", compute_s, FY_OPT, P_ALWAYS, -1, 1e9),
    F64(T, "transfer_tail_s", transfer_tail_s, FY_OPT, P_ALWAYS, 0, 1e9),
    F64(T, "transfer_s", transfer_s, FY_OPT, P_ALWAYS, 0, 1e9),
    I64(T, "bytes", bytes, FY_OPT, P_ALWAYS, 0, INT64_MAX),
};
#undef T
#define T fy_wire_prefilled_t
static const field_t PREFILLED[] = {
    HDR(T, ev, EV),
    I32(T, "attempt", attempt, FY_OPT, P_ALWAYS, 0, 1000),
    I32_LIM(T, "first_token", first_token, FY_REQ, P_ALWAYS, 0, INT32_MAX, L_TOKEN),
    F64(T, "logprob", logprob, FY_OPT, P_ALWAYS, -1e30, 0),
    U64S_IN(T, "rng", rng, n_rng, FY_REQ, P_ALWAYS),
    I32_LIM(T, "cached", cached, FY_OPT, P_ALWAYS, 0, INT32_MAX, L_NPROMPT),
    MAP(T, "timings", timings, FY_OPT, P_ALWAYS, JOB_TIMINGS),
    I32S_LIM(T, "kept", kept, n_kept, FY_OPT, P_NONZERO, 0, INT32_MAX, MAX_ARRAY, L_NBLOCKS_M1, L_NBLOCKS),
    F32S_LIM(T, "scores", scores, n_scores, FY_OPT, P_NONZERO, MAX_ARRAY, L_NBLOCKS),
    I32S_LIM(T, "top_ids", top_ids, n_top_ids, FY_OPT, P_NONZERO, 0, INT32_MAX, FY_GEN_MAX_TOP_LOGPROBS, L_TOKEN,
             L_NONE),
    F32S(T, "top_logprobs", top_logprobs, n_top_logprobs, FY_OPT, P_NONZERO, FY_GEN_MAX_TOP_LOGPROBS),
};
#undef T
#define T fy_wire_token_t
static const field_t TOKEN[] = {
    HDR(T, ev, EV),
    I32(T, "n", n, FY_REQ, P_ALWAYS, 0, INT32_MAX),
    I32_LIM(T, "token", token, FY_REQ, P_ALWAYS, 0, INT32_MAX, L_TOKEN),
    TEXT(T, "text", text, text_len, FY_OPT, P_ALWAYS, 1 << 16),
    F64(T, "logprob", logprob, FY_OPT, WHEN(T, has_logprob), -1e30, 0),
    I32S_LIM(T, "top_ids", top_ids, n_top_ids, FY_OPT, P_NONZERO, 0, INT32_MAX, FY_GEN_MAX_TOP_LOGPROBS, L_TOKEN,
             L_NONE),
    F32S(T, "top_logprobs", top_logprobs, n_top_logprobs, FY_OPT, P_NONZERO, FY_GEN_MAX_TOP_LOGPROBS),
    BOOL(T, "more", more, FY_OPT, P_NONZERO),
};
#undef T
#define T fy_wire_prompt_logprobs_t
static const field_t PROMPT_LOGPROBS[] = {
    HDR(T, ev, EV),
    I32(T, "attempt", attempt, FY_OPT, WHEN(T, has_attempt), 0, 1000),
    I32_LIM(T, "first", first, FY_REQ, P_ALWAYS, 1, INT32_MAX, L_NPROMPT_M1),
    I32(T, "k", k, FY_OPT, P_ALWAYS, 0, FY_GEN_MAX_PROMPT_LOGPROBS),
    F32S(T, "logprobs", logprobs, n_logprobs, FY_REQ, P_ALWAYS, FY_WIRE_MAX_PLP_ROWS),
    I32S(T, "ranks", ranks, n_ranks, FY_REQ, P_ALWAYS, 1, INT32_MAX, FY_WIRE_MAX_PLP_ROWS),
    I32S_LIM(T, "top_ids", top_ids, n_top_ids, FY_OPT, P_NONZERO, 0, INT32_MAX,
             FY_WIRE_MAX_PLP_ROWS *FY_GEN_MAX_PROMPT_LOGPROBS, L_TOKEN, L_NONE),
    F32S(T, "top_logprobs", top_logprobs, n_top_logprobs, FY_OPT, P_NONZERO,
         FY_WIRE_MAX_PLP_ROWS *FY_GEN_MAX_PROMPT_LOGPROBS),
};
#undef T
#define T fy_wire_finish_timings_t
static const field_t FINISH_TIMINGS[] = {
    F64(T, "e2e_s", e2e_s, FY_OPT, P_ALWAYS, -1, 1e9),
    I32(T, "n_generated", n_generated, FY_OPT, P_ALWAYS, 0, INT32_MAX),
    I32(T, "n_preempted", n_preempted, FY_OPT, P_ALWAYS, 0, INT32_MAX),
    I32_LIM(T, "n_cached", n_cached, FY_OPT, P_ALWAYS, 0, INT32_MAX, L_NPROMPT),
    F32S_LIM(T, "itl_s", itl_s, n_itl, FY_OPT, P_ALWAYS, 1 << 21, L_MAX_CTX),
};
#undef T
#define T fy_wire_finish_t
static const field_t FINISH[] = {
    HDR(T, ev, EV),
    STR(T, "reason", reason, FY_REQ, P_ALWAYS),
    TEXT(T, "text", text, text_len, FY_OPT, P_ALWAYS, 1 << 16),
    I32(T, "n", n, FY_OPT, P_ALWAYS, 0, INT32_MAX),
    MAP(T, "timings", timings, FY_OPT, P_ALWAYS, FINISH_TIMINGS),
};
#undef T
#define T fy_wire_lease_expired_t
static const field_t LEASE_EXPIRED[] = {
    HDR(T, ev, EV),
    U64(T, "lease", lease, FY_OPT, P_ALWAYS, 0, UINT64_MAX),
};
#undef T
#define T fy_wire_ev_error_t
static const field_t EV_ERROR[] = {
    HDR(T, ev, EV),
    I32(T, "attempt", attempt, FY_OPT, WHEN(T, has_attempt), 0, 1000),
    STR(T, "code", code, FY_OPT, P_ALWAYS),
    STR(T, "message", message, FY_OPT, P_ALWAYS),
};
#undef T

/* ---- rules across fields ------------------------------------------------------------------------------ */

static int32_t blocks_of(int32_t n_tokens, int32_t block_size) { return (n_tokens + block_size - 1) / block_size; }

/* Whether n entries are one table of `per` blocks for each KV group:
 * lim's count of groups, or any count up to kv.h's layer limit. */
static bool groups_fit(const fy_wire_lim_t *lim, int32_t n, int32_t per)
{
    if (per < 1) return false;
    if (lim->kv_groups > 0) return (int64_t)n == (int64_t)per * lim->kv_groups;
    return n % per == 0 && n / per >= 1 && n / per <= FY_WIRE_MAX_KV_GROUPS;
}

/* "2 kv groups" or "a table per kv group", for the refusals above */
static const char *groups_text(const fy_wire_lim_t *lim)
{
    static _Thread_local char buf[40];
    if (lim->kv_groups < 1) return "a table per kv group";
    snprintf(buf, sizeof(buf), "%d kv group%s", lim->kv_groups, lim->kv_groups == 1 ? "" : "s");
    return buf;
}

static void check_generate(fy_msgr_t *r, const fy_wire_lim_t *lim, const void *p)
{
    const fy_wire_generate_t *m = p;
    if (!!m->prompt == m->has_tokens)
        fy_msgr_fail(r, FY_ERR_FORMAT, "a request needs exactly one of 'prompt' (text) and 'tokens'");
}

static void check_reserve(fy_msgr_t *r, const fy_wire_lim_t *lim, const void *p)
{
    const fy_wire_reserve_t *m = p;
    if (m->n_tokens < 1) fy_msgr_fail(r, FY_ERR_FORMAT, "field 'tokens' is empty");
}

/* A KV budget's kept blocks: ascending, and scores (if any) one per kept
 * block, each a finite, non-negative attention mass. */
static void check_kept(fy_msgr_t *r, const int32_t *kept, int32_t n_kept, const float *scores, int32_t n_scores)
{
    for (int32_t i = 1; i < n_kept; i++)
        if (kept[i] <= kept[i - 1]) {
            fy_msgr_fail(r, FY_ERR_FORMAT, "field 'kept' is not ascending at entry %d", i);
            return;
        }
    if (n_scores && n_scores != n_kept) {
        fy_msgr_fail(r, FY_ERR_FORMAT, "%d scores for %d kept blocks", n_scores, n_kept);
        return;
    }
    for (int32_t i = 0; i < n_scores; i++)
        if (!(scores[i] >= 0.0f && scores[i] <= 3.0e38f)) {
            fy_msgr_fail(r, FY_ERR_FORMAT, "field 'scores': entry %d is not a finite, non-negative mass", i);
            return;
        }
}

/* A token's alternatives: as many log-probabilities as ids, each a
 * log-probability (-1e30 to 0). */
static void check_top(fy_msgr_t *r, int32_t n_ids, const float *lps, int32_t n_lps)
{
    if (!fy_msgr_ok(r)) return;
    if (n_ids != n_lps) {
        fy_msgr_fail(r, FY_ERR_FORMAT, "%d top_ids for %d top_logprobs", n_ids, n_lps);
        return;
    }
    for (int32_t i = 0; i < n_lps; i++)
        if (!(lps[i] >= -1e30f && lps[i] <= 0.0f)) {
            fy_msgr_fail(r, FY_ERR_FORMAT, "field 'top_logprobs': entry %d is not a log-probability", i);
            return;
        }
}

static void check_adopt(fy_msgr_t *r, const fy_wire_lim_t *lim, const void *p)
{
    const fy_wire_adopt_t *m = p;
    if (m->n_rng != 0 && m->n_rng != 4) fy_msgr_fail(r, FY_ERR_FORMAT, "field 'rng' must hold 4 words");
    check_kept(r, m->kept, m->n_kept, m->scores, m->n_scores);
    check_top(r, m->n_top_ids, m->top_logprobs, m->n_top_logprobs);
}

static void check_token(fy_msgr_t *r, const fy_wire_lim_t *lim, const void *p)
{
    const fy_wire_token_t *m = p;
    check_top(r, m->n_top_ids, m->top_logprobs, m->n_top_logprobs);
}

static void check_prefill(fy_msgr_t *r, const fy_wire_lim_t *lim, const void *p)
{
    const fy_wire_prefill_t *m = p;
    if (m->n_tokens < 1) {
        fy_msgr_fail(r, FY_ERR_FORMAT, "field 'tokens' is empty");
        return;
    }
    if (!lim || lim->block_size < 1) return; /* the blocks cannot be counted */
    int32_t n = blocks_of(m->n_tokens, lim->block_size);
    if (m->slots > n - m->first_block)
        fy_msgr_fail(r, FY_ERR_FORMAT, "%d slots from block %d for a prompt of %d blocks", m->slots, m->first_block, n);
    else if (m->first_block >= n || !groups_fit(lim, m->n_blocks, m->slots ? m->slots : n - m->first_block))
        fy_msgr_fail(r, FY_ERR_FORMAT, "%d destination blocks from block %d for a prompt of %d blocks (%s)",
                     m->n_blocks, m->first_block, n, groups_text(lim));
}

static void check_load(fy_msgr_t *r, const fy_wire_lim_t *lim, const void *p)
{
    const fy_wire_load_t *m = p;
    if (strcmp(m->role, "prefill") && strcmp(m->role, "decode")) {
        fy_msgr_fail(r, FY_ERR_FORMAT, "role '%s'", m->role);
        return;
    }
    /* kv/bloom.h's sizes: a power of two from 64 bytes */
    if (m->bloom && (m->bloom_len < 64 || (m->bloom_len & (m->bloom_len - 1))))
        fy_msgr_fail(r, FY_ERR_FORMAT, "bloom of %zu bytes (a power of two from 64)", m->bloom_len);
}

static void check_progress(fy_msgr_t *r, const fy_wire_lim_t *lim, const void *p)
{
    const fy_wire_progress_t *m = p;
    if (m->n_attempts != m->n_ids || m->n_computed != m->n_ids)
        fy_msgr_fail(r, FY_ERR_FORMAT, "%d ids, %d attempts and %d computed counts", m->n_ids, m->n_attempts,
                     m->n_computed);
}

static void check_reserved(fy_msgr_t *r, const fy_wire_lim_t *lim, const void *p)
{
    const fy_wire_reserved_t *m = p;
    if (!lim || lim->n_prompt < 1 || lim->block_size < 1) return; /* the prompt is not known */
    int32_t n = blocks_of(lim->n_prompt, lim->block_size);
    if (m->slots > n - m->first_block)
        fy_msgr_fail(r, FY_ERR_FORMAT, "%d slots from block %d for a %d-block prompt", m->slots, m->first_block, n);
    else if (!groups_fit(lim, m->n_blocks, m->slots ? m->slots : n - m->first_block))
        fy_msgr_fail(r, FY_ERR_FORMAT, "%d blocks from block %d for a %d-block prompt (%s)", m->n_blocks,
                     m->first_block, n, groups_text(lim));
}

static void check_prompt_logprobs(fy_msgr_t *r, const fy_wire_lim_t *lim, const void *p)
{
    const fy_wire_prompt_logprobs_t *m = p;
    if (!fy_msgr_ok(r)) return;
    int32_t n = m->n_logprobs;
    if (n < 1 || m->n_ranks != n) {
        fy_msgr_fail(r, FY_ERR_FORMAT, "%d logprobs and %d ranks (one each, at least one)", n, m->n_ranks);
        return;
    }
    if (lim && lim->n_prompt > 0 && (int64_t)m->first + n > lim->n_prompt) {
        fy_msgr_fail(r, FY_ERR_FORMAT, "prompt tokens %d to %d of a prompt of %d", m->first, m->first + n - 1,
                     lim->n_prompt);
        return;
    }
    if ((int64_t)m->n_top_ids != (int64_t)n * m->k) {
        fy_msgr_fail(r, FY_ERR_FORMAT, "%d top_ids for %d tokens of %d alternatives", m->n_top_ids, n, m->k);
        return;
    }
    for (int32_t i = 0; i < n; i++)
        if (!(m->logprobs[i] >= -1e30f && m->logprobs[i] <= 0.0f)) {
            fy_msgr_fail(r, FY_ERR_FORMAT, "field 'logprobs': entry %d is not a log-probability", i);
            return;
        }
    check_top(r, m->n_top_ids, m->top_logprobs, m->n_top_logprobs);
}

static void check_prefilled(fy_msgr_t *r, const fy_wire_lim_t *lim, const void *p)
{
    const fy_wire_prefilled_t *m = p;
    if (m->n_rng != 4) fy_msgr_fail(r, FY_ERR_FORMAT, "field 'rng' must hold 4 words");
    check_kept(r, m->kept, m->n_kept, m->scores, m->n_scores);
    check_top(r, m->n_top_ids, m->top_logprobs, m->n_top_logprobs);
}

/* ---- schemas ------------------------------------------------------------------------------------------- */

#define SCHEMA(nm, ty, rt, T, tab, chk)                                                                                \
    const fy_wire_schema_t fy_wire_##nm##_schema = {.type = ty,                                                        \
                                                    .name = #nm,                                                       \
                                                    .route = rt,                                                       \
                                                    .fields = tab,                                                     \
                                                    .n_fields = (int32_t)FY_ARRAY_LEN(tab),                            \
                                                    .size = sizeof(T),                                                 \
                                                    .check = chk}

#define C2R "client → router"
#define R2C "router → client"
#define R2D "router → decode worker"
#define R2P "router → prefill worker"
#define D2R "decode worker → router"
#define P2R "prefill worker → router"
#define W2R "worker → router"

SCHEMA(generate, "generate", C2R, fy_wire_generate_t, GENERATE, check_generate);
SCHEMA(poll, "poll", C2R, fy_wire_poll_t, POLL, NULL);
SCHEMA(cancel, "cancel", C2R, fy_wire_cancel_t, CANCEL, NULL);
const fy_wire_schema_t fy_wire_status_schema = {
    .type = "status", .name = "status", .route = C2R, .size = sizeof(fy_wire_status_t)};
SCHEMA(accepted, "accepted", R2C, fy_wire_accepted_t, ACCEPTED, NULL);
SCHEMA(events, "events", R2C, fy_wire_events_t, EVENTS, NULL);
SCHEMA(cancelled, "cancelled", R2C, fy_wire_cancelled_t, CANCELLED, NULL);
SCHEMA(status_reply, "status", R2C, fy_wire_status_reply_t, STATUS_REPLY, NULL);
SCHEMA(error, "error", R2C, fy_wire_error_t, ERROR_REPLY, NULL);
SCHEMA(reserve, "reserve", R2D, fy_wire_reserve_t, RESERVE, check_reserve);
SCHEMA(renew, "renew", R2D, fy_wire_renew_t, RENEW, NULL);
SCHEMA(adopt, "adopt", R2D, fy_wire_adopt_t, ADOPT, check_adopt);
SCHEMA(cmd_generate, "generate", R2D, fy_wire_reserve_t, CMD_GENERATE, check_reserve);
SCHEMA(release, "release", R2D, fy_wire_release_t, RELEASE, NULL);
SCHEMA(prefill, "prefill", R2P, fy_wire_prefill_t, PREFILL, check_prefill);
SCHEMA(extend, "extend", R2P, fy_wire_extend_t, EXTEND, NULL);
SCHEMA(cmd_cancel, "cancel", R2P, fy_wire_release_t, RELEASE, NULL);
SCHEMA(load, "load", W2R, fy_wire_load_t, LOAD, check_load);
SCHEMA(alive, "alive", W2R, fy_wire_alive_t, ALIVE, NULL);
SCHEMA(progress, "progress", P2R, fy_wire_progress_t, PROGRESS, check_progress);
SCHEMA(reserved, "reserved", D2R, fy_wire_reserved_t, RESERVED, check_reserved);
SCHEMA(renewed, "renewed", D2R, fy_wire_renewed_t, RENEWED, NULL);
SCHEMA(adopted, "adopted", D2R, fy_wire_ack_t, ACK, NULL);
SCHEMA(ev_accepted, "accepted", P2R, fy_wire_ack_t, ACK, NULL);
SCHEMA(prefilled, "prefilled", P2R, fy_wire_prefilled_t, PREFILLED, check_prefilled);
SCHEMA(token, "token", D2R, fy_wire_token_t, TOKEN, check_token);
SCHEMA(prompt_logprobs, "prompt_logprobs", W2R, fy_wire_prompt_logprobs_t, PROMPT_LOGPROBS, check_prompt_logprobs);
SCHEMA(finish, "finish", D2R, fy_wire_finish_t, FINISH, NULL);
SCHEMA(lease_expired, "lease_expired", D2R, fy_wire_lease_expired_t, LEASE_EXPIRED, NULL);
SCHEMA(ev_error, "error", W2R, fy_wire_ev_error_t, EV_ERROR, NULL);

const fy_wire_schema_t *const fy_wire_all[] = {
    &fy_wire_generate_schema,     &fy_wire_poll_schema,          &fy_wire_cancel_schema,
    &fy_wire_status_schema,       &fy_wire_accepted_schema,      &fy_wire_events_schema,
    &fy_wire_cancelled_schema,    &fy_wire_status_reply_schema,  &fy_wire_error_schema,
    &fy_wire_reserve_schema,      &fy_wire_renew_schema,         &fy_wire_adopt_schema,
    &fy_wire_cmd_generate_schema, &fy_wire_release_schema,       &fy_wire_prefill_schema,
    &fy_wire_extend_schema,       &fy_wire_cmd_cancel_schema,    &fy_wire_load_schema,
    &fy_wire_alive_schema,        &fy_wire_progress_schema,      &fy_wire_reserved_schema,
    &fy_wire_renewed_schema,      &fy_wire_adopted_schema,       &fy_wire_ev_accepted_schema,
    &fy_wire_prefilled_schema,    &fy_wire_token_schema,         &fy_wire_prompt_logprobs_schema,
    &fy_wire_finish_schema,       &fy_wire_lease_expired_schema, &fy_wire_ev_error_schema,
};
const int32_t fy_wire_n_all = (int32_t)FY_ARRAY_LEN(fy_wire_all);

const char *fy_wire_type(const fy_wire_schema_t *s) { return s->type; }
const char *fy_wire_name(const fy_wire_schema_t *s) { return s->name; }
const char *fy_wire_route(const fy_wire_schema_t *s) { return s->route; }
size_t fy_wire_size(const fy_wire_schema_t *s) { return s->size; }
bool fy_wire_is(const fy_wire_schema_t *s, const fy_msgr_t *r) { return !strcmp(fy_msgr_type(r), s->type); }

/* ---- bounds ------------------------------------------------------------------------------------------------ */

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* The upper bound of an integer field, narrowed by lim. */
static int64_t ihi_of(const field_t *f, const fy_wire_lim_t *lim)
{
    if (!lim) return f->ihi;
    int32_t np = lim->n_prompt, bs = lim->block_size;
    switch (f->lim) {
    case L_TOKEN: return lim->token_hi > 0 ? min64(f->ihi, lim->token_hi) : f->ihi;
    case L_NPROMPT: return np > 0 ? min64(f->ihi, np) : f->ihi;
    case L_NPROMPT_M1: return np > 0 ? min64(f->ihi, np - 1) : f->ihi;
    case L_NBLOCKS_M1: return np > 0 && bs > 0 ? min64(f->ihi, blocks_of(np, bs) - 1) : f->ihi;
    case L_PROMPT_BLOCKS: return lim->max_prompt > 0 && bs > 0 ? min64(f->ihi, lim->max_prompt / bs) : f->ihi;
    case L_CTX: return lim->max_ctx > 0 ? min64(f->ihi, lim->max_ctx) : f->ihi;
    default: return f->ihi;
    }
}

/* The most entries of an array field; n_tokens: the message's tokens read so far. */
static int64_t cap_of(const field_t *f, const fy_wire_lim_t *lim, int32_t n_tokens)
{
    if (!lim) return f->cap;
    int32_t np = lim->n_prompt, bs = lim->block_size;
    int64_t groups = lim->kv_groups > 0 ? lim->kv_groups : FY_WIRE_MAX_KV_GROUPS;
    switch (f->limcap) {
    case L_MAX_PROMPT: return lim->max_prompt > 0 ? min64(f->cap, lim->max_prompt) : f->cap;
    case L_NBLOCKS: return np > 0 && bs > 0 ? min64(f->cap, (int64_t)blocks_of(np, bs) * groups) : f->cap;
    case L_MAX_CTX: return lim->max_ctx > 0 ? min64(f->cap, lim->max_ctx) : f->cap;
    case L_MAX_NBLOCKS:
        return lim->max_prompt > 0 && bs > 0 ? min64(f->cap, (int64_t)blocks_of(lim->max_prompt, bs) * groups) : f->cap;
    case L_MSG_NBLOCKS: return bs > 0 ? min64(f->cap, (int64_t)blocks_of(n_tokens, bs) * groups) : f->cap;
    default: return f->cap;
    }
}

/* ---- writing ------------------------------------------------------------------------------------------------- */

#define AT(m, off, type) (*(type *)((char *)(m) + (off)))
#define CAT(m, off, type) (*(const type *)((const char *)(m) + (off)))
typedef const void *cptr_t; /* the struct's const void * and const char * members, through CAT */
typedef const char *cstr_t;

static bool is_zero(const field_t *f, const char *m)
{
    switch (f->kind) {
    case K_U64: return CAT(m, f->off, uint64_t) == 0;
    case K_I64: return CAT(m, f->off, int64_t) == 0;
    case K_I32: return CAT(m, f->off, int32_t) == 0;
    case K_F64: return CAT(m, f->off, double) == 0;
    case K_F32: return CAT(m, f->off, float) == 0;
    case K_ENUM: return CAT(m, f->off, int) == 0;
    case K_BYTES: return CAT(m, f->aux, int32_t) == 0;
    case K_BOOL: return !CAT(m, f->off, bool);
    case K_STR: return !m[f->off];
    case K_TEXT:
    case K_BIN: return CAT(m, f->off, cptr_t) == NULL;
    case K_I32S:
    case K_U64S:
    case K_F32S:
    case K_STRS: return (f->countf ? f->countf(m) : CAT(m, f->aux, int32_t)) == 0;
    default: return false;
    }
}

static void write_fields(fy_msgw_t *w, const field_t *t, int32_t n, const char *m)
{
    for (int32_t i = 0; i < n; i++) {
        const field_t *f = &t[i];
        if (f->put == P_HAS && !CAT(m, f->has, bool)) continue;
        if (f->put == P_NONZERO && is_zero(f, m)) continue;
        if (f->put == P_NOTDEF && CAT(m, f->off, float) == (float)f->def) continue;
        bool array = f->kind == K_I32S || f->kind == K_U64S || f->kind == K_F32S || f->kind == K_STRS;
        const void *arr = !array ? NULL : f->inl ? (const void *)(m + f->off) : CAT(m, f->off, cptr_t);
        int32_t count = !array ? 0 : f->countf ? f->countf(m) : CAT(m, f->aux, int32_t);
        switch (f->kind) {
        case K_U64: fy_msgw_u64(w, f->name, CAT(m, f->off, uint64_t)); break;
        case K_I64: fy_msgw_i64(w, f->name, CAT(m, f->off, int64_t)); break;
        case K_I32: fy_msgw_i64(w, f->name, CAT(m, f->off, int32_t)); break;
        case K_F64: fy_msgw_f64(w, f->name, CAT(m, f->off, double)); break;
        case K_BOOL: fy_msgw_bool(w, f->name, CAT(m, f->off, bool)); break;
        case K_STR: fy_msgw_strn(w, f->name, m + f->off, strnlen(m + f->off, (size_t)f->cap)); break;
        case K_TEXT: {
            const char *p = CAT(m, f->off, cstr_t);
            fy_msgw_strn(w, f->name, p ? p : "", p ? CAT(m, f->aux, size_t) : 0);
            break;
        }
        case K_BIN: {
            const void *p = CAT(m, f->off, cptr_t);
            fy_msgw_bin(w, f->name, p ? p : "", p ? CAT(m, f->aux, size_t) : 0);
            break;
        }
        case K_I32S: fy_msgw_i32s(w, f->name, arr, count); break;
        case K_U64S: fy_msgw_u64s(w, f->name, arr, count); break;
        case K_F32S: fy_msgw_f32s(w, f->name, arr, count); break;
        case K_STRS: {
            const char *ptrs[FY_WIRE_MAX_WORKERS];
            if (count > (int32_t)FY_ARRAY_LEN(ptrs) || count > f->cap) count = 0; /* misuse: cannot happen */
            for (int32_t k = 0; k < count; k++) ptrs[k] = m + f->off + (size_t)k * (size_t)f->len;
            fy_msgw_strs(w, f->name, ptrs, count);
            break;
        }
        case K_MAP:
            fy_msgw_map_begin(w, f->name);
            write_fields(w, f->sub, f->n_sub, m + f->off);
            fy_msgw_map_end(w);
            break;
        case K_HDR: write_fields(w, f->sub, f->n_sub, m + f->off); break;
        case K_F32: fy_msgw_f64(w, f->name, CAT(m, f->off, float)); break;
        case K_ENUM: {
            int v = CAT(m, f->off, int);
            fy_msgw_str(w, f->name, v >= 0 && v < f->cap ? f->ename(v) : "?");
            break;
        }
        case K_BYTES: {
            int32_t len = CAT(m, f->aux, int32_t);
            fy_msgw_strn(w, f->name, m + f->off, len > 0 && len <= f->cap ? (size_t)len : 0);
            break;
        }
        }
    }
}

void fy_wire_write(const fy_wire_schema_t *s, fy_msgw_t *w, const void *m)
{
    fy_msgw_init(w, s->type);
    write_fields(w, s->fields, s->n_fields, m);
}

/* ---- reading --------------------------------------------------------------------------------------------------- */

typedef struct reader {
    fy_msgr_t *r;
    const fy_wire_lim_t *lim;
    int32_t n_tokens; /* of the last "tokens" array read (L_MSG_NBLOCKS) */
} reader_t;

static size_t elem_size(kind_t k)
{
    return k == K_U64S ? sizeof(uint64_t) : k == K_F32S ? sizeof(float) : sizeof(int32_t);
}

static void read_array(reader_t *c, const field_t *f, char *m)
{
    fy_msgr_t *r = c->r;
    if (!r->ok) return;
    int64_t cap = cap_of(f, c->lim, c->n_tokens);
    int32_t n = fy_msgr_count(r, f->name);
    void *buf;
    union {
        int32_t i;
        uint64_t u;
        float f;
    } none; /* nothing is written into it: an array longer than cap is refused unread */
    if (f->inl) {
        buf = m + f->off;
    } else if (n > 0 && n <= cap) {
        buf = fy_malloc((size_t)n * elem_size(f->kind));
        if (!buf) {
            fy_msgr_fail(r, FY_ERR_NOMEM, "field '%s': out of memory for %d entries", f->name, n);
            return;
        }
    } else {
        buf = &none;
    }
    int32_t got = 0;
    switch (f->kind) {
    case K_I32S:
        got = fy_msgr_i32s(r, f->name, f->need, buf, (int32_t)cap, (int32_t)f->ilo, (int32_t)ihi_of(f, c->lim));
        break;
    case K_U64S: got = fy_msgr_u64s(r, f->name, f->need, buf, (int32_t)cap); break;
    case K_F32S: got = fy_msgr_f32s(r, f->name, f->need, buf, (int32_t)cap); break;
    default: break;
    }
    bool took = !f->inl && buf != &none;
    if (!r->ok) {
        if (took) fy_free(buf);
        return;
    }
    if (!f->inl) {
        if (got == 0 && took) {
            fy_free(buf);
            took = false;
        }
        AT(m, f->off, void *) = took ? buf : NULL;
    }
    if (!f->countf && (!f->inl || fy_msgr_present(r, f->name)))
        AT(m, f->aux, int32_t) = got;                  /* an inline one keeps its preset */
    if (!strcmp(f->name, "tokens")) c->n_tokens = got; /* for the blocks after it (L_MSG_NBLOCKS) */
}

static void read_strs(reader_t *c, const field_t *f, char *m)
{
    fy_msgr_t *r = c->r;
    const char *p[FY_WIRE_MAX_WORKERS];
    size_t l[FY_WIRE_MAX_WORKERS];
    int32_t cap = f->cap < (int64_t)FY_ARRAY_LEN(p) ? (int32_t)f->cap : (int32_t)FY_ARRAY_LEN(p);
    if (!r->ok || !fy_msgr_present(r, f->name)) {
        fy_msgr_strs(r, f->name, f->need, p, l, cap, (size_t)f->len - 1); /* a required one is missing */
        return;
    }
    int32_t n = fy_msgr_strs(r, f->name, f->need, p, l, cap, (size_t)f->len - 1);
    for (int32_t i = 0; i < n && r->ok; i++)
        if (memchr(p[i], 0, l[i])) fy_msgr_fail(r, FY_ERR_FORMAT, "field '%s': entry %d holds a NUL byte", f->name, i);
    if (!r->ok) return;
    for (int32_t i = 0; i < n; i++) {
        char *dst = m + f->off + (size_t)i * (size_t)f->len;
        memcpy(dst, p[i], l[i]);
        dst[l[i]] = 0;
    }
    AT(m, f->aux, int32_t) = n;
}

/* An enum by its name (one of ename(0 .. cap - 1)). */
static void read_enum(fy_msgr_t *r, const field_t *f, char *m)
{
    if (!fy_msgr_present(r, f->name)) {
        if (f->need == FY_REQ) fy_msgr_fail(r, FY_ERR_FORMAT, "field '%s' is missing", f->name);
        return;
    }
    char buf[32];
    fy_msgr_str(r, f->name, f->need, NULL, buf, sizeof(buf));
    int v = 0;
    while (r->ok && v < f->cap && strcmp(buf, f->ename(v))) v++;
    if (r->ok && v < f->cap) {
        AT(m, f->off, int) = v;
    } else if (r->ok) {
        char names[160] = "";
        for (int k = 0, at = 0; k < f->cap && at < (int)sizeof(names); k++)
            at += snprintf(names + at, sizeof(names) - (size_t)at, "%s%s", k ? (k + 1 < f->cap ? ", " : " or ") : "",
                           f->ename(k));
        fy_msgr_fail(r, FY_ERR_FORMAT, "field '%s': '%s' is not %s", f->name, buf, names);
    }
}

static void read_fields(reader_t *c, const field_t *t, int32_t n, char *m)
{
    fy_msgr_t *r = c->r;
    for (int32_t i = 0; i < n; i++) {
        const field_t *f = &t[i];
        if (!r->ok) return; /* the first error stays; later fields keep their presets */
        if (f->put == P_HAS && fy_msgr_present(r, f->name)) AT(m, f->has, bool) = true;
        switch (f->kind) {
        case K_U64:
            AT(m, f->off, uint64_t) = fy_msgr_u64(r, f->name, f->need, AT(m, f->off, uint64_t), f->ulo, f->uhi);
            break;
        case K_I64:
            AT(m, f->off, int64_t) =
                fy_msgr_i64(r, f->name, f->need, AT(m, f->off, int64_t), f->ilo, ihi_of(f, c->lim));
            break;
        case K_I32:
            AT(m, f->off, int32_t) =
                (int32_t)fy_msgr_i64(r, f->name, f->need, AT(m, f->off, int32_t), f->ilo, ihi_of(f, c->lim));
            break;
        case K_F64:
            AT(m, f->off, double) = fy_msgr_f64(r, f->name, f->need, AT(m, f->off, double), f->dlo, f->dhi);
            break;
        case K_BOOL: AT(m, f->off, bool) = fy_msgr_bool(r, f->name, f->need, AT(m, f->off, bool)); break;
        case K_STR: {
            if (f->need == FY_OPT && !fy_msgr_present(r, f->name)) break; /* the preset stays */
            char def[512]; /* the preset, which fy_msgr_str puts back when the field is bad */
            size_t len = strnlen(m + f->off, (size_t)f->cap - 1);
            memcpy(def, m + f->off, len);
            def[len] = 0;
            fy_msgr_str(r, f->name, f->need, def, m + f->off, (size_t)f->cap);
            break;
        }
        case K_TEXT:
        case K_BIN: {
            size_t len;
            const void *p = fy_msgr_bytes(r, f->name, f->need, (size_t)f->cap, &len);
            if (p) {
                AT(m, f->off, const void *) = p;
                AT(m, f->aux, size_t) = len;
            }
            break;
        }
        case K_I32S:
        case K_U64S:
        case K_F32S: read_array(c, f, m); break;
        case K_STRS: read_strs(c, f, m); break;
        case K_MAP:
            if (fy_msgr_enter(r, f->name, f->need)) {
                read_fields(c, f->sub, f->n_sub, m + f->off);
                fy_msgr_leave(r);
            }
            break;
        case K_HDR:
            read_fields(c, f->sub, f->n_sub, m + f->off);
            if (r->ok && f->check) f->check(r, m + f->off);
            break;
        case K_F32:
            AT(m, f->off, float) = (float)fy_msgr_f64(r, f->name, f->need, AT(m, f->off, float), f->dlo, f->dhi);
            break;
        case K_ENUM: read_enum(r, f, m); break;
        case K_BYTES: {
            size_t len = 0;
            const char *p =
                fy_msgr_present(r, f->name) ? fy_msgr_bytes(r, f->name, f->need, (size_t)f->cap, &len) : NULL;
            if (!p) break; /* absent: the preset stays */
            if (memchr(p, 0, len)) {
                fy_msgr_fail(r, FY_ERR_FORMAT, "field '%s' holds a NUL byte", f->name);
                break;
            }
            memcpy(m + f->off, p, len);
            m[f->off + len] = 0;
            AT(m, f->aux, int32_t) = (int32_t)len;
            break;
        }
        }
    }
}

/* Frees the arrays a read allocated (and forgets them). */
static void clear_fields(const field_t *t, int32_t n, char *m)
{
    for (int32_t i = 0; i < n; i++) {
        const field_t *f = &t[i];
        if ((f->kind == K_I32S || f->kind == K_U64S || f->kind == K_F32S) && !f->inl) {
            fy_free(AT(m, f->off, void *));
            AT(m, f->off, void *) = NULL;
            AT(m, f->aux, int32_t) = 0;
        } else if (f->kind == K_MAP || f->kind == K_HDR) {
            clear_fields(f->sub, f->n_sub, m + f->off);
        }
    }
}

/* Array pointers and has_ flags are outputs of a read: nothing there is the caller's. */
static void forget_outputs(const field_t *t, int32_t n, char *m)
{
    for (int32_t i = 0; i < n; i++) {
        const field_t *f = &t[i];
        if (f->put == P_HAS) AT(m, f->has, bool) = false;
        if ((f->kind == K_I32S || f->kind == K_U64S || f->kind == K_F32S) && !f->inl)
            AT(m, f->off, void *) = NULL;
        else if (f->kind == K_MAP || f->kind == K_HDR)
            forget_outputs(f->sub, f->n_sub, m + f->off);
    }
}

fy_status_t fy_wire_read(const fy_wire_schema_t *s, fy_msgr_t *r, const fy_wire_lim_t *lim, void *m)
{
    reader_t c = {.r = r, .lim = lim};
    forget_outputs(s->fields, s->n_fields, m);
    read_fields(&c, s->fields, s->n_fields, m);
    if (r->ok && s->check) s->check(r, lim, m);
    if (r->ok) return FY_OK;
    clear_fields(s->fields, s->n_fields, m);
    return r->status;
}

void fy_wire_clear(const fy_wire_schema_t *s, void *m) { clear_fields(s->fields, s->n_fields, m); }

static void init_fields(const field_t *t, int32_t n, char *m)
{
    for (int32_t i = 0; i < n; i++) {
        if (t[i].gen)
            fy_genspec_default(&AT(m, t[i].off, fy_genspec_t));
        else if (t[i].kind == K_MAP || t[i].kind == K_HDR)
            init_fields(t[i].sub, t[i].n_sub, m + t[i].off);
    }
}

void fy_wire_init(const fy_wire_schema_t *s, void *m)
{
    memset(m, 0, s->size);
    init_fields(s->fields, s->n_fields, m);
}

fy_status_t fy_wire_cmd_read(fy_msgr_t *r, fy_wire_cmd_t *h)
{
    reader_t c = {.r = r};
    read_fields(&c, CMD, (int32_t)FY_ARRAY_LEN(CMD), (char *)h);
    return r->ok ? FY_OK : r->status;
}

fy_status_t fy_wire_ev_read(fy_msgr_t *r, fy_wire_ev_t *h)
{
    reader_t c = {.r = r};
    read_fields(&c, EV, (int32_t)FY_ARRAY_LEN(EV), (char *)h);
    return r->ok ? FY_OK : r->status;
}

/* ---- comparing ------------------------------------------------------------------------------------------------ */

static bool same_f(double a, double b) { return a == b || (isnan(a) && isnan(b)); }

static bool same_array(const field_t *f, const void *x, const void *y, int32_t n)
{
    if (n == 0) return true;
    if (!x || !y) return false;
    if (f->kind != K_F32S) return !memcmp(x, y, (size_t)n * elem_size(f->kind));
    for (int32_t k = 0; k < n; k++)
        if (!same_f(((const float *)x)[k], ((const float *)y)[k])) return false;
    return true;
}

static const char *diff_fields(const field_t *t, int32_t n, const char *a, const char *b)
{
    for (int32_t i = 0; i < n; i++) {
        const field_t *f = &t[i];
        if (f->put == P_HAS) {
            if (CAT(a, f->has, bool) != CAT(b, f->has, bool)) return f->name;
            if (!CAT(a, f->has, bool)) continue; /* the value does not travel */
        }
        bool same = true;
        switch (f->kind) {
        case K_U64: same = CAT(a, f->off, uint64_t) == CAT(b, f->off, uint64_t); break;
        case K_I64: same = CAT(a, f->off, int64_t) == CAT(b, f->off, int64_t); break;
        case K_I32: same = CAT(a, f->off, int32_t) == CAT(b, f->off, int32_t); break;
        case K_F64: same = same_f(CAT(a, f->off, double), CAT(b, f->off, double)); break;
        case K_F32: same = same_f(CAT(a, f->off, float), CAT(b, f->off, float)); break;
        case K_ENUM: same = CAT(a, f->off, int) == CAT(b, f->off, int); break;
        case K_BYTES: {
            int32_t la = CAT(a, f->aux, int32_t), lb = CAT(b, f->aux, int32_t);
            same = la == lb && (la <= 0 || la > f->cap || !memcmp(a + f->off, b + f->off, (size_t)la));
            break;
        }
        case K_BOOL: same = CAT(a, f->off, bool) == CAT(b, f->off, bool); break;
        case K_STR: same = !strncmp(a + f->off, b + f->off, (size_t)f->cap); break;
        case K_TEXT:
        case K_BIN: {
            size_t la = CAT(a, f->off, cptr_t) ? CAT(a, f->aux, size_t) : 0;
            size_t lb = CAT(b, f->off, cptr_t) ? CAT(b, f->aux, size_t) : 0;
            same = la == lb && (!la || !memcmp(CAT(a, f->off, cptr_t), CAT(b, f->off, cptr_t), la));
            break;
        }
        case K_I32S:
        case K_U64S:
        case K_F32S: {
            int32_t na = f->countf ? f->countf(a) : CAT(a, f->aux, int32_t);
            int32_t nb = f->countf ? f->countf(b) : CAT(b, f->aux, int32_t);
            const void *xa = f->inl ? (const void *)(a + f->off) : CAT(a, f->off, cptr_t);
            const void *xb = f->inl ? (const void *)(b + f->off) : CAT(b, f->off, cptr_t);
            same = na == nb && same_array(f, xa, xb, na);
            break;
        }
        case K_STRS: {
            int32_t na = CAT(a, f->aux, int32_t), nb = CAT(b, f->aux, int32_t);
            same = na == nb;
            for (int32_t k = 0; same && k < na && k < f->cap; k++)
                same = !strncmp(a + f->off + (size_t)k * (size_t)f->len, b + f->off + (size_t)k * (size_t)f->len,
                                (size_t)f->len);
            break;
        }
        case K_MAP:
        case K_HDR: {
            const char *d = diff_fields(f->sub, f->n_sub, a + f->off, b + f->off);
            if (d) return d;
            break;
        }
        }
        if (!same) return f->name;
    }
    return NULL;
}

bool fy_wire_equal(const fy_wire_schema_t *s, const void *a, const void *b, char *why, size_t why_cap)
{
    const char *d = diff_fields(s->fields, s->n_fields, a, b);
    if (d && why) snprintf(why, why_cap, "%s: field '%s' differs", s->type, d);
    return !d;
}

/* ---- description ------------------------------------------------------------------------------------------------ */

static fy_wire_vtype_t vtype_of(kind_t k)
{
    switch (k) {
    case K_U64: return FY_WIRE_UINT;
    case K_I64:
    case K_I32: return FY_WIRE_INT;
    case K_F64:
    case K_F32: return FY_WIRE_FLOAT;
    case K_ENUM: return FY_WIRE_ENUM;
    case K_BYTES: return FY_WIRE_TEXT;
    case K_BOOL: return FY_WIRE_BOOL;
    case K_STR: return FY_WIRE_STR;
    case K_TEXT: return FY_WIRE_TEXT;
    case K_BIN: return FY_WIRE_BIN;
    case K_I32S: return FY_WIRE_INTS;
    case K_U64S: return FY_WIRE_UINTS;
    case K_F32S: return FY_WIRE_FLOATS;
    case K_STRS: return FY_WIRE_STRS;
    case K_MAP: return FY_WIRE_MAP;
    default: return FY_WIRE_GEN; /* a K_HDR of the generation parameters */
    }
}

static const char *bound_words(lim_ref_t l)
{
    switch (l) {
    case L_TOKEN: return "the vocabulary's last id";
    case L_NPROMPT: return "the prompt's tokens";
    case L_NPROMPT_M1: return "the prompt's tokens - 1";
    case L_NBLOCKS_M1: return "the prompt's blocks - 1";
    case L_PROMPT_BLOCKS: return "the longest prompt's blocks";
    case L_MAX_PROMPT: return "the longest prompt";
    case L_NBLOCKS: return "the prompt's blocks";
    case L_MSG_NBLOCKS: return "the blocks of `tokens`";
    case L_MAX_NBLOCKS: return "the longest prompt's blocks";
    case L_MAX_CTX:
    case L_CTX: return "the context";
    default: return NULL;
    }
}

static int32_t describe(const field_t *t, int32_t n, const char *parent, const fy_wire_lim_t *lim, fy_wire_field_t *out,
                        int32_t cap, int32_t k)
{
    static const char *const puts[] = {"always", "not zero", "when set", "not default"};
    for (int32_t i = 0; i < n; i++) {
        const field_t *f = &t[i];
        if (f->kind == K_HDR && !f->gen) {
            k = describe(f->sub, f->n_sub, parent, lim, out, cap, k);
            continue;
        }
        if (k < cap) {
            fy_wire_field_t *o = &out[k];
            *o = (fy_wire_field_t){.name = f->gen ? "(generation parameters)" : f->name,
                                   .parent = parent,
                                   .type = vtype_of(f->kind),
                                   .required = f->need == FY_REQ,
                                   .put = puts[f->put],
                                   .ilo = f->ilo,
                                   .ihi = ihi_of(f, lim),
                                   .ulo = f->ulo,
                                   .uhi = f->uhi,
                                   .dlo = f->dlo,
                                   .dhi = f->dhi,
                                   .cap = f->kind == K_STR ? f->cap - 1 : f->cap,
                                   .len = f->len ? f->len - 1 : 0,
                                   .bound = bound_words(f->lim),
                                   .cap_bound = bound_words(f->limcap),
                                   .def = f->def,
                                   .name_of = f->ename};
            if (f->limcap && f->limcap != L_MSG_NBLOCKS)
                o->cap = cap_of(f, lim, 0); /* that one depends on the message */
        }
        k++;
        if (f->kind == K_MAP) k = describe(f->sub, f->n_sub, f->name, lim, out, cap, k);
    }
    return k;
}

/* ---- the largest message ------------------------------------------------------------------------------------ */

/* msgpack's worst case for a string or bytes of n: a 5-byte header */
static size_t str_max(size_t n) { return 5 + n; }

static size_t fields_max(const field_t *t, int32_t n, const fy_wire_lim_t *lim)
{
    size_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        const field_t *f = &t[i];
        if (f->kind == K_HDR) {
            total += fields_max(f->sub, f->n_sub, lim);
            continue;
        }
        size_t key = f->kind == K_HDR ? 0 : str_max(strlen(f->name));
        int64_t cap = f->limcap == L_MSG_NBLOCKS ? cap_of(f, lim, lim ? lim->max_prompt : 0) : cap_of(f, lim, 0);
        if (cap < 0) cap = 0;
        size_t v = 0;
        switch (f->kind) {
        case K_U64:
        case K_I64:
        case K_I32:
        case K_F64:
        case K_F32:
        case K_BOOL: v = 9; break;
        case K_ENUM: v = str_max(32); break;
        case K_BYTES:
        case K_STR: v = str_max((size_t)cap); break;
        case K_TEXT:
        case K_BIN: v = str_max((size_t)cap); break;
        case K_I32S:
        case K_U64S:
        case K_F32S: v = 5 + (size_t)cap * 9; break;
        case K_STRS: v = 5 + (size_t)cap * str_max((size_t)f->len); break;
        case K_MAP: v = 5 + fields_max(f->sub, f->n_sub, lim); break;
        case K_HDR: v = fields_max(f->sub, f->n_sub, lim); break;
        }
        total += key + v;
    }
    return total;
}

size_t fy_wire_max_bytes(const fy_wire_schema_t *s, const fy_wire_lim_t *lim)
{
    /* the map's header, "v" and "type" (at most 32 bytes), then the fields */
    return 5 + 2 + 9 + 5 + 5 + 32 + fields_max(s->fields, s->n_fields, lim);
}

size_t fy_wire_max_route(const char *const *routes, int n_routes, const fy_wire_lim_t *lim)
{
    size_t most = 0;
    for (int32_t i = 0; i < fy_wire_n_all; i++)
        for (int j = 0; j < n_routes; j++)
            if (!strcmp(fy_wire_all[i]->route, routes[j])) {
                size_t b = fy_wire_max_bytes(fy_wire_all[i], lim);
                if (b > most) most = b;
            }
    return most;
}

int32_t fy_wire_fields(const fy_wire_schema_t *s, const fy_wire_lim_t *lim, fy_wire_field_t *out, int32_t cap)
{
    return describe(s->fields, s->n_fields, NULL, lim, out, cap, 0);
}

int32_t fy_wire_gen_fields(const fy_wire_lim_t *lim, fy_wire_field_t *out, int32_t cap)
{
    return describe(GENSPEC, (int32_t)FY_ARRAY_LEN(GENSPEC), NULL, lim, out, cap, 0);
}

size_t fy_wire_gen_max_bytes(void) { return fields_max(GENSPEC, (int32_t)FY_ARRAY_LEN(GENSPEC), NULL); }

/* ---- the generation parameters ------------------------------------------------------------------------------- */

/* What the table cannot say: arrays that come in pairs on the wire (their
 * counts compared here, as only the message knows them), then every rule
 * across fields (min_tokens under max_tokens, the biases' range, the bad
 * words' lengths...) by genspec.h's own check, the door's. */
static void genspec_check(fy_msgr_t *r, const void *m)
{
    const fy_genspec_t *g = m;
    bool ids = fy_msgr_present(r, "logit_bias_ids"), vals = fy_msgr_present(r, "logit_bias");
    if (ids != vals || (ids && fy_msgr_count(r, "logit_bias_ids") != fy_msgr_count(r, "logit_bias"))) {
        fy_msgr_fail(r, FY_ERR_FORMAT, "%d logit_bias_ids for %d logit_bias values",
                     ids ? fy_msgr_count(r, "logit_bias_ids") : 0, vals ? fy_msgr_count(r, "logit_bias") : 0);
        return;
    }
    const char *field = NULL;
    char why[160];
    if (fy_genspec_check(g, INT32_MAX, &field, why, sizeof(why)) != FY_OK) {
        fy_msgr_fail(r, FY_ERR_FORMAT, "field '%s': %s", field, why);
        return;
    }
    bool lens = fy_msgr_present(r, "bad_words_lens"), bad = fy_msgr_present(r, "bad_words_ids");
    if (lens != bad || (bad && fy_msgr_count(r, "bad_words_ids") != bad_ids_count(g))) {
        fy_msgr_fail(r, FY_ERR_FORMAT, "field 'bad_words_ids': %d ids for sequences of %d tokens in all",
                     bad ? fy_msgr_count(r, "bad_words_ids") : 0, bad_ids_count(g));
        return;
    }
    if (g->grammar_len && g->grammar_kind == FY_GEN_GRAMMAR_NONE)
        fy_msgr_fail(r, FY_ERR_FORMAT, "field 'grammar' without a 'grammar_kind'");
}

void fy_genspec_write(fy_msgw_t *w, const fy_genspec_t *g)
{
    write_fields(w, GENSPEC, (int32_t)FY_ARRAY_LEN(GENSPEC), (const char *)g);
}

void fy_genspec_read(fy_msgr_t *r, fy_genspec_t *g, int32_t max_tokens_cap)
{
    /* into a copy: g keeps its values unless the whole read succeeds */
    fy_genspec_t *t = r->ok ? fy_malloc(sizeof(*t)) : NULL;
    if (!t) {
        if (r->ok) fy_msgr_fail(r, FY_ERR_NOMEM, "out of memory reading the generation parameters");
        return;
    }
    *t = *g;
    fy_wire_lim_t lim = {.max_ctx = max_tokens_cap};
    reader_t c = {.r = r, .lim = &lim};
    read_fields(&c, GENSPEC, (int32_t)FY_ARRAY_LEN(GENSPEC), (char *)t);
    if (r->ok) genspec_check(r, t);
    if (r->ok) *g = *t;
    fy_free(t);
}

/*
 * wire.h - the control plane's messages, one typed schema each: a C
 * struct, and a writer and a reader generated from one table of its
 * fields (wire.c), so a field's name, msgpack type, range and whether it
 * may be left out are written once.  docs/protocol.md is the reference:
 * what each message means, and (generated from these tables, checked by
 * tests/test_wire.c) every field with its type and range.
 *
 * For each message NAME below there are
 *
 *     void        fy_wire_NAME_init(T *m);              zeros, and default generation parameters
 *     void        fy_wire_NAME_write(fy_msgw_t *w, const T *m);   starts w and writes m
 *     fy_status_t fy_wire_NAME_read(fy_msgr_t *r, const fy_wire_lim_t *lim, T *m);
 *     void        fy_wire_NAME_clear(T *m);             frees what a read allocated
 *     bool        fy_wire_NAME_is(const fy_msgr_t *r);  the message's type is NAME's
 *
 * Reading.  Fields absent and optional keep the value m held before the
 * read (init's zero, or a default the caller set), so presets are the
 * defaults, as in genspec.h.  Every field is type- and range-checked and
 * then the message's cross-field rules; the first failure is kept in r
 * (msg.h's sticky errors: FY_ERR_FORMAT, the text naming the field, or
 * FY_ERR_NOMEM), and the status is returned.  Arrays (pointer and count)
 * are allocated by a successful read and m owns them until
 * fy_wire_NAME_clear (a handler may take one and set the pointer to
 * NULL); after a failed read m owns nothing.  Byte and text fields
 * (pointer and length) point into the message: valid until
 * fy_msgr_free(r).  Fields after the one that failed keep their presets.
 * A has_ flag is set when its field (any of its fields) was there.  The
 * reader does not look at the message's type: its dispatcher does
 * (fy_wire_NAME_is), so messages that share a type ("generate" from a
 * client and from the router) are told apart by who reads them.
 *
 * Writing.  Required fields are always written; an optional field is
 * written always, only when it is not zero (0, false, "", a NULL
 * pointer), or only when its has_ flag is set, as its table says (the
 * comments below say which).  A struct filled for writing points at the
 * caller's memory: do not clear it.  Field order is the table's, the
 * order the hand-written writers used.
 *
 * Some ranges depend on the reader's situation (the vocabulary, the
 * context, the prompt a reply is about): lim gives them; a member left 0,
 * or lim NULL, leaves that bound at its static value.
 *
 * The generation parameters (fy_genspec_t) are one more table here, its
 * fields in the map of every message that carries a request, with the
 * rules across fields (pairs of arrays, min_tokens under max_tokens) in
 * one check; fy_genspec_write and fy_genspec_read use the same table.
 *
 * Not here: the msgpack codec (msg.h), what the generation parameters
 * mean and the door's checks of them (genspec.h), sockets and envelopes
 * (rpc/rpc.h, envelope.h), and what a handler does with a message.
 */
#ifndef FY_WIRE_H
#define FY_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/genspec.h"
#include "common/msg.h"
#include "common/status.h"

/* The largest prefix digest a load report may carry (kv/bloom.h's
 * FY_BLOOM_MAX_BYTES is this: the wire's bound is the digest's). */
#define FY_WIRE_BLOOM_MAX_BYTES (128 * 1024)

/* ---- what a reader knows ---------------------------------------------------------------------------- */

/* The most KV groups a block list may carry when the reader does not know
 * its count (kv.h's FY_KV_MAX_LAYERS: a group has at least one layer). */
#define FY_WIRE_MAX_KV_GROUPS 1024

typedef struct fy_wire_lim {
    int32_t token_hi;   /* token ids: [0, token_hi] (the vocabulary less one) */
    int32_t max_prompt; /* tokens in a prompt: at most this many */
    int32_t max_ctx;    /* max_tokens: at most this (genspec's cap; 0: INT32_MAX); per-token arrays too */
    int32_t n_prompt;   /* a reply about a request: its prompt's tokens */
    int32_t block_size; /* tokens per KV block (with n_prompt or max_prompt: block counts) */
    int32_t kv_groups;  /* KV groups (kv.h): block lists hold one table per group; 0: any count */
} fy_wire_lim_t;

/* ---- schemas ------------------------------------------------------------------------------------------ */

typedef struct fy_wire_schema fy_wire_schema_t;

/* Every message, in docs/protocol.md's order. */
extern const fy_wire_schema_t *const fy_wire_all[];
extern const int32_t fy_wire_n_all;

const char *fy_wire_type(const fy_wire_schema_t *s);  /* the "type" on the wire: "reserve" */
const char *fy_wire_name(const fy_wire_schema_t *s);  /* the C name: "cmd_generate" */
const char *fy_wire_route(const fy_wire_schema_t *s); /* "router → decode worker" */
size_t fy_wire_size(const fy_wire_schema_t *s);       /* of its struct */

/* The generic forms of the typed functions (m: the schema's struct). */
void fy_wire_init(const fy_wire_schema_t *s, void *m);
void fy_wire_write(const fy_wire_schema_t *s, fy_msgw_t *w, const void *m);
fy_status_t fy_wire_read(const fy_wire_schema_t *s, fy_msgr_t *r, const fy_wire_lim_t *lim, void *m);
void fy_wire_clear(const fy_wire_schema_t *s, void *m);
bool fy_wire_is(const fy_wire_schema_t *s, const fy_msgr_t *r);
/* Field by field equal (arrays and bytes by content, floats by value);
 * else false, and why names the first field that differs.  For the tests
 * and the fuzz target's write-and-read-again property. */
bool fy_wire_equal(const fy_wire_schema_t *s, const void *a, const void *b, char *why, size_t why_cap);

/* One field as a table describes it (nested maps flattened, parent set). */
typedef enum fy_wire_vtype {
    FY_WIRE_UINT = 0, /* uint64 */
    FY_WIRE_INT,      /* int64 or int32 */
    FY_WIRE_FLOAT,    /* double */
    FY_WIRE_BOOL,
    FY_WIRE_STR,   /* a string of at most cap - 1 bytes, no NUL */
    FY_WIRE_TEXT,  /* a string (or bytes) of at most cap bytes */
    FY_WIRE_BIN,   /* bytes (or a string) of at most cap bytes */
    FY_WIRE_INTS,  /* at most cap integers */
    FY_WIRE_UINTS, /* at most cap non-negative integers */
    FY_WIRE_FLOATS,
    FY_WIRE_STRS, /* at most cap strings of 1 to len bytes */
    FY_WIRE_MAP,  /* a nested map: its fields follow with parent set */
    FY_WIRE_GEN,  /* the generation parameters (genspec.h): their fields are fy_wire_gen_fields' */
    FY_WIRE_ENUM, /* a string: one of name_of(0 .. cap - 1) */
} fy_wire_vtype_t;

typedef struct fy_wire_field {
    const char *name;
    const char *parent; /* the nested map it is in, or NULL */
    fy_wire_vtype_t type;
    bool required;
    const char *put;               /* when it is written: "always", "not zero", "when set" */
    int64_t ilo, ihi;              /* FY_WIRE_INT(S) */
    uint64_t ulo, uhi;             /* FY_WIRE_UINT */
    double dlo, dhi;               /* FY_WIRE_FLOAT */
    int64_t cap;                   /* strings, bytes: most bytes; arrays: most entries */
    int64_t len;                   /* FY_WIRE_STRS: most bytes per entry */
    const char *bound;             /* what narrows the upper bound of a value (from lim), in words, or NULL */
    const char *cap_bound;         /* what narrows cap (from lim), or NULL */
    double def;                    /* put "not default": the value not written */
    const char *(*name_of)(int v); /* FY_WIRE_ENUM: the names of its cap values */
} fy_wire_field_t;

/* Up to cap fields of s into out (lim narrows the bounds as a reader's
 * would; NULL: the static ones); returns how many s has. */
int32_t fy_wire_fields(const fy_wire_schema_t *s, const fy_wire_lim_t *lim, fy_wire_field_t *out, int32_t cap);

/* The generation parameters (fy_genspec_t): their fields as the table
 * describes them (what the docs list once, where a message's own list
 * says "generation parameters"), and their largest encoding (every field
 * at its limit: the grammar's 32 KiB, 1,024 allowed tokens, 300 logit
 * biases, 8 stop strings, bad words...). */
int32_t fy_wire_gen_fields(const fy_wire_lim_t *lim, fy_wire_field_t *out, int32_t cap);
size_t fy_wire_gen_max_bytes(void);

/* An upper bound on the bytes of any s message a reader with lim takes
 * (every field present at its largest; lim NULL: the static bounds):
 * what a socket's receive limit is sized from. */
size_t fy_wire_max_bytes(const fy_wire_schema_t *s, const fy_wire_lim_t *lim);
/* The largest fy_wire_max_bytes of the messages whose route is one of
 * routes ("client → router", ...: fy_wire_route). */
size_t fy_wire_max_route(const char *const *routes, int n_routes, const fy_wire_lim_t *lim);

/* Typed functions for message name with struct T. */ /* Typed functions for message name with struct T. */
#define FY_WIRE_MESSAGE(name, T)                                                                                       \
    extern const fy_wire_schema_t fy_wire_##name##_schema;                                                             \
    static inline void fy_wire_##name##_init(T *m) { fy_wire_init(&fy_wire_##name##_schema, m); }                      \
    static inline void fy_wire_##name##_write(fy_msgw_t *w, const T *m)                                                \
    {                                                                                                                  \
        fy_wire_write(&fy_wire_##name##_schema, w, m);                                                                 \
    }                                                                                                                  \
    static inline fy_status_t fy_wire_##name##_read(fy_msgr_t *r, const fy_wire_lim_t *lim, T *m)                      \
    {                                                                                                                  \
        return fy_wire_read(&fy_wire_##name##_schema, r, lim, m);                                                      \
    }                                                                                                                  \
    static inline void fy_wire_##name##_clear(T *m) { fy_wire_clear(&fy_wire_##name##_schema, m); }                    \
    static inline bool fy_wire_##name##_is(const fy_msgr_t *r) { return fy_wire_is(&fy_wire_##name##_schema, r); }

/* ---- headers ------------------------------------------------------------------------------------------- */

/* Every command from the router to a worker starts with these. */
typedef struct fy_wire_cmd {
    uint64_t to;  /* required: the worker's incarnation */
    uint64_t rid; /* not zero: the router's id for the reply (0: none expected) */
} fy_wire_cmd_t;

/* Every event from a worker to the router starts with these. */
typedef struct fy_wire_ev {
    char worker[64]; /* required: the worker's name (the envelope's) */
    uint64_t inc;    /* required: its incarnation (the envelope's) */
    uint64_t rid;    /* not zero: the command this answers */
    uint64_t id;     /* always: the request it is about (0: none) */
} fy_wire_ev_t;

/* The header alone, before a handler picks the message's schema. */
fy_status_t fy_wire_cmd_read(fy_msgr_t *r, fy_wire_cmd_t *h);
fy_status_t fy_wire_ev_read(fy_msgr_t *r, fy_wire_ev_t *h);

/* ---- client <-> router --------------------------------------------------------------------------------------- */

#define FY_WIRE_MAX_PROMPT_BYTES (1 << 20) /* prompt and system text */
#define FY_WIRE_MAX_WORKERS 64             /* the status reply's per-worker arrays */

/* generate: client -> router. */
typedef struct fy_wire_generate {
    const char *prompt; /* not zero (NULL): text; or */
    size_t prompt_len;
    bool has_tokens; /* when set: token ids (exactly one of the two) */
    int32_t *tokens;
    int32_t n_tokens;
    bool chat;          /* not zero */
    const char *system; /* not zero (NULL) */
    size_t system_len;
    double deadline_s; /* not zero; [0.001, 86400] */
    fy_genspec_t gen;
} fy_wire_generate_t;
FY_WIRE_MESSAGE(generate, fy_wire_generate_t)

/* poll: client -> router. */
typedef struct fy_wire_poll {
    uint64_t id;
    int32_t from;      /* tokens the client has */
    int64_t from_text; /* text bytes the client has */
    double wait_s;     /* always; [0, 30] */
} fy_wire_poll_t;
FY_WIRE_MESSAGE(poll, fy_wire_poll_t)

/* cancel: client -> router. */
typedef struct fy_wire_cancel {
    uint64_t id;
} fy_wire_cancel_t;
FY_WIRE_MESSAGE(cancel, fy_wire_cancel_t)

/* status: client -> router (no fields). */
typedef struct fy_wire_status {
    char unused; /* C wants a member */
} fy_wire_status_t;
FY_WIRE_MESSAGE(status, fy_wire_status_t)

/* accepted: router -> client, the answer to generate. */
typedef struct fy_wire_accepted {
    uint64_t id;
    int32_t n_prompt;
} fy_wire_accepted_t;
FY_WIRE_MESSAGE(accepted, fy_wire_accepted_t)

/* A request's timings in a done events reply (router clock; the prefill
 * worker's where it measured them). */
typedef struct fy_wire_req_timings {
    double queue_s, reserve_s, prefill_queue_s, prefill_compute_s, transfer_s, transfer_tail_s, prefill_total_s,
        first_token_s, ttft_s, e2e_s;
    int64_t transfer_bytes;
    int32_t cached_prefill, cached_decode, retries;
} fy_wire_req_timings_t;

/* events: router -> client, the answer to poll. */
typedef struct fy_wire_events {
    uint64_t id;
    int32_t *tokens; /* always (may be empty) */
    int32_t n_tokens;
    const char *text; /* always */
    size_t text_len;
    int32_t n_prompt;
    char state[16];
    bool done;
    char error_code[32];    /* not zero: done with an error */
    char error[256];        /* not zero */
    char finish_reason[16]; /* not zero: done without one */
    bool has_timings;       /* when set (done) */
    fy_wire_req_timings_t timings;
} fy_wire_events_t;
FY_WIRE_MESSAGE(events, fy_wire_events_t)

/* cancelled: router -> client, the answer to cancel. */
typedef struct fy_wire_cancelled {
    uint64_t id;
} fy_wire_cancelled_t;
FY_WIRE_MESSAGE(cancelled, fy_wire_cancelled_t)

/* Control messages the router refused, by envelope fault (fy_env_fault_str). */
typedef struct fy_wire_refused {
    uint64_t format, mac, stale, replay, identity, clear;
} fy_wire_refused_t;

/* status: router -> client, the answer to status (per-worker arrays in
 * the order of workers). */
typedef struct fy_wire_status_reply {
    char model[64];         /* the model's id: its name and a hash of its weights (fy_model_id) */
    char served_model[128]; /* its name in the API (router.served_model_name or the file's); "": an older router */
    int32_t requests, queued;
    uint64_t completed, failed, refused, retried, bad_events;
    int32_t prefill_up, decode_up;
    int32_t n_workers;
    char workers[FY_WIRE_MAX_WORKERS][64];
    int32_t n_up, up[FY_WIRE_MAX_WORKERS];
    int32_t n_ranks, ranks[FY_WIRE_MAX_WORKERS]; /* tp * pp of each worker's rank group (1: one process) */
    int32_t n_out, out[FY_WIRE_MAX_WORKERS];     /* 1: reports itself out of service (a rank died) */
    int32_t n_assigned, assigned[FY_WIRE_MAX_WORKERS];
    int32_t n_admittable, admittable[FY_WIRE_MAX_WORKERS];
    int32_t n_total_blocks, total_blocks[FY_WIRE_MAX_WORKERS];
    int32_t n_decode, decode[FY_WIRE_MAX_WORKERS];
    int32_t n_pending_tokens, pending_tokens[FY_WIRE_MAX_WORKERS];
    fy_wire_refused_t refused_messages;
} fy_wire_status_reply_t;
FY_WIRE_MESSAGE(status_reply, fy_wire_status_reply_t)

/* error: any reply (router -> client) that is a refusal. */
typedef struct fy_wire_error {
    uint64_t id;   /* 0: about a message that could not be read */
    char code[32]; /* fy_status_tag */
    char message[256];
} fy_wire_error_t;
FY_WIRE_MESSAGE(error, fy_wire_error_t)

/* ---- router -> decode worker --------------------------------------------------------------------------- */

/* reserve (and, colocated, generate: the same fields but lease_s). */
typedef struct fy_wire_reserve {
    fy_wire_cmd_t cmd;
    uint64_t id;
    char tenant[64]; /* the prefix-cache namespace */
    int32_t *tokens; /* required, not empty: [0, token_hi], at most max_prompt */
    int32_t n_tokens;
    fy_genspec_t gen;
    double lease_s; /* reserve only; not zero; [0.01, 3600] */
} fy_wire_reserve_t;
FY_WIRE_MESSAGE(reserve, fy_wire_reserve_t)
FY_WIRE_MESSAGE(cmd_generate, fy_wire_reserve_t)

/* renew. */
typedef struct fy_wire_renew {
    fy_wire_cmd_t cmd;
    uint64_t id;
    uint64_t lease;
    double lease_s;
} fy_wire_renew_t;
FY_WIRE_MESSAGE(renew, fy_wire_renew_t)

/* adopt. */
typedef struct fy_wire_adopt {
    fy_wire_cmd_t cmd;
    uint64_t id;
    uint64_t lease;
    int32_t first_token;
    double logprob;
    int32_t n_rng; /* always: 0 (none) or 4 words */
    uint64_t rng[4];
    int32_t *kept; /* a KV budget's reservation (slots): the prompt's blocks the prefill worker kept, ascending */
    int32_t n_kept;
    float *scores; /* H2O: the attention each kept block received (n_kept of them), or none */
    int32_t n_scores;
    int32_t *top_ids; /* top_logprobs: the first token's alternatives, most likely first */
    int32_t n_top_ids;
    float *top_logprobs; /* and their log-probabilities (as many) */
    int32_t n_top_logprobs;
} fy_wire_adopt_t;
FY_WIRE_MESSAGE(adopt, fy_wire_adopt_t)

/* release (decode worker) and cancel (prefill worker): the request only. */
typedef struct fy_wire_release {
    fy_wire_cmd_t cmd;
    uint64_t id;
} fy_wire_release_t;
FY_WIRE_MESSAGE(release, fy_wire_release_t)
FY_WIRE_MESSAGE(cmd_cancel, fy_wire_release_t)

/* ---- router -> prefill worker ------------------------------------------------------------------------- */

/* prefill. */
typedef struct fy_wire_prefill {
    fy_wire_cmd_t cmd;
    uint64_t id;
    int32_t attempt; /* always: the router's try */
    char tenant[64];
    int32_t *tokens;
    int32_t n_tokens;
    fy_genspec_t gen;
    const void *target; /* the decode worker's transfer descriptor */
    size_t target_len;
    int32_t first_block;
    int32_t *blocks; /* the decode worker's block for each prompt block from first_block, one table per KV
                        group (group-major; n_blocks = groups x prompt blocks from first_block); -1: a block
                        the decode side never reads (before a sliding window), not to be sent */
    int32_t n_blocks;
    double deadline_s; /* not zero; [0.001, 3600] */
    int32_t slots;     /* not zero: a KV budget's reservation; blocks holds, per group, the slots blocks that
                          the kept prompt blocks from first_block on go into, in order (-1: fewer) */
} fy_wire_prefill_t;
FY_WIRE_MESSAGE(prefill, fy_wire_prefill_t)

/* extend. */
typedef struct fy_wire_extend {
    fy_wire_cmd_t cmd;
    uint64_t id;
    int32_t attempt; /* always */
    double deadline_s;
} fy_wire_extend_t;
FY_WIRE_MESSAGE(extend, fy_wire_extend_t)

/* ---- worker -> router events ---------------------------------------------------------------------------- */

/* load: every heartbeat with fresh figures. */
typedef struct fy_wire_load {
    fy_wire_ev_t ev;
    char role[16]; /* "prefill" or "decode" */
    char listen[256];
    char model[64];
    int32_t block_size;
    int32_t running, waiting, swapped, max_seqs, total_blocks, free_blocks, cached_blocks, admittable;
    bool has_capacity; /* when set */
    int32_t capacity;
    double kv_usage;
    uint64_t prefix_queries, prefix_hits, preemptions, bad_commands;
    const void *bloom; /* not zero (NULL) */
    size_t bloom_len;
    bool has_decode; /* when set: a decode worker's figures */
    int32_t leases, leased_blocks;
    uint64_t leases_expired, leases_renewed, adopted, reserve_refused;
    bool has_prefill; /* when set: a prefill worker's */
    int32_t jobs;
    uint64_t jobs_done, jobs_failed;
    int64_t bytes_shipped;
    /* a rank group (docs/parallel.md): its shape (0: not sent, one
     * process), and why it serves nothing now (a rank died: every request
     * there has ended; "" when it serves) */
    int32_t tp, pp;
    char out_of_service[160];
    /* the longest sequence it holds (its ROLE.ctx, or the model's
     * context); 0: not sent (an older worker): the model's */
    int32_t ctx;
} fy_wire_load_t;
FY_WIRE_MESSAGE(load, fy_wire_load_t)

/* alive: every heartbeat while the engine thread is in a long step. */
typedef struct fy_wire_alive {
    fy_wire_ev_t ev;
    double busy_s;
} fy_wire_alive_t;
FY_WIRE_MESSAGE(alive, fy_wire_alive_t)

/* progress: a prefill worker's jobs (three arrays of one length). */
typedef struct fy_wire_progress {
    fy_wire_ev_t ev;
    uint64_t *ids;
    int32_t n_ids;
    int32_t *attempts;
    int32_t n_attempts;
    int32_t *computed;
    int32_t n_computed;
} fy_wire_progress_t;
FY_WIRE_MESSAGE(progress, fy_wire_progress_t)

/* reserved: the answer to reserve. */
typedef struct fy_wire_reserved {
    fy_wire_ev_t ev;
    uint64_t lease;
    double lease_s;      /* not zero: the lease granted */
    int32_t cached;      /* [0, n_prompt - 1] */
    int32_t first_block; /* [0, the prompt's blocks - 1] */
    int32_t *blocks;     /* the prompt's blocks from first_block, per KV group as in prefill (-1: not wanted) */
    int32_t n_blocks;
    const void *target;
    size_t target_len;
    int32_t slots; /* not zero: a KV budget's reservation, as in prefill */
} fy_wire_reserved_t;
FY_WIRE_MESSAGE(reserved, fy_wire_reserved_t)

/* renewed: the answer to renew. */
typedef struct fy_wire_renewed {
    fy_wire_ev_t ev;
    uint64_t lease;
    double lease_s;
} fy_wire_renewed_t;
FY_WIRE_MESSAGE(renewed, fy_wire_renewed_t)

/* adopted (decode worker: the answer to adopt or a colocated generate) and
 * accepted (prefill worker: it took a prefill command): the header only. */
typedef struct fy_wire_ack {
    fy_wire_ev_t ev;
} fy_wire_ack_t;
FY_WIRE_MESSAGE(adopted, fy_wire_ack_t)
FY_WIRE_MESSAGE(ev_accepted, fy_wire_ack_t)

/* A prefill job's timings. */
typedef struct fy_wire_job_timings {
    double queue_s, compute_s, transfer_tail_s, transfer_s;
    int64_t bytes;
} fy_wire_job_timings_t;

/* prefilled: the prompt's KV is at the decode worker. */
typedef struct fy_wire_prefilled {
    fy_wire_ev_t ev;
    int32_t attempt; /* always */
    int32_t first_token;
    double logprob;
    int32_t n_rng; /* exactly 4 */
    uint64_t rng[4];
    int32_t cached; /* [0, n_prompt] */
    fy_wire_job_timings_t timings;
    int32_t *kept; /* a KV budget's reservation: as in adopt */
    int32_t n_kept;
    float *scores;
    int32_t n_scores;
    int32_t *top_ids; /* top_logprobs: the first token's alternatives, as in adopt */
    int32_t n_top_ids;
    float *top_logprobs;
    int32_t n_top_logprobs;
} fy_wire_prefilled_t;
FY_WIRE_MESSAGE(prefilled, fy_wire_prefilled_t)

/* token: one sampled token. */
typedef struct fy_wire_token {
    fy_wire_ev_t ev;
    int32_t n; /* its index in the request's stream */
    int32_t token;
    const char *text; /* always: what became final with it */
    size_t text_len;
    bool has_logprob; /* when set (the request asked for them) */
    double logprob;
    int32_t *top_ids; /* top_logprobs: the most likely tokens at this step, most likely first */
    int32_t n_top_ids;
    float *top_logprobs; /* their log-probabilities (as many) */
    int32_t n_top_logprobs;
    bool more; /* more tokens of the same engine step follow at once (fy_event_t's more) */
} fy_wire_token_t;
FY_WIRE_MESSAGE(token, fy_wire_token_t)

/* prompt_logprobs: prompt tokens' log-probabilities (a request with
 * prompt_logprobs), from the worker that ran the prompt, before its
 * prefilled (prefill worker) or first token (colocated decode worker):
 * tokens [first, first + n) of the prompt, n = n_logprobs, each with its
 * rank and k alternatives (top_ids and top_logprobs: n * k, row after
 * row).  A position may come again (a recomputed prompt): the same values. */
#define FY_WIRE_MAX_PLP_ROWS 8192 /* prompt tokens in one message (a step's logit rows) */
typedef struct fy_wire_prompt_logprobs {
    fy_wire_ev_t ev;
    bool has_attempt; /* when set: a prefill job's try */
    int32_t attempt;
    int32_t first; /* [1, n_prompt - 1] */
    int32_t k;     /* [0, FY_GEN_MAX_PROMPT_LOGPROBS] */
    float *logprobs;
    int32_t n_logprobs;
    int32_t *ranks; /* as many, each at least 1 */
    int32_t n_ranks;
    int32_t *top_ids;
    int32_t n_top_ids;
    float *top_logprobs;
    int32_t n_top_logprobs;
} fy_wire_prompt_logprobs_t;
FY_WIRE_MESSAGE(prompt_logprobs, fy_wire_prompt_logprobs_t)

/* A decode-side request's timings. */
typedef struct fy_wire_finish_timings {
    double e2e_s;
    int32_t n_generated, n_preempted, n_cached; /* n_cached: [0, n_prompt] */
    float *itl_s;
    int32_t n_itl;
} fy_wire_finish_timings_t;

/* finish: the request's end. */
typedef struct fy_wire_finish {
    fy_wire_ev_t ev;
    char reason[16];
    const char *text; /* always: the held-back text */
    size_t text_len;
    int32_t n;
    fy_wire_finish_timings_t timings;
} fy_wire_finish_t;
FY_WIRE_MESSAGE(finish, fy_wire_finish_t)

/* lease_expired. */
typedef struct fy_wire_lease_expired {
    fy_wire_ev_t ev;
    uint64_t lease;
} fy_wire_lease_expired_t;
FY_WIRE_MESSAGE(lease_expired, fy_wire_lease_expired_t)

/* error: a worker's refusal of a command, or a request that failed. */
typedef struct fy_wire_ev_error {
    fy_wire_ev_t ev;
    bool has_attempt; /* when set: a prefill job's try */
    int32_t attempt;
    char code[32];
    char message[256];
} fy_wire_ev_error_t;
FY_WIRE_MESSAGE(ev_error, fy_wire_ev_error_t)

#endif /* FY_WIRE_H */

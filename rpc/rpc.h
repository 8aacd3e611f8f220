/*
 * rpc.h - the control plane's sockets, over nng.
 *
 * Three shapes, each a thin layer over one nng protocol:
 *  - a request/reply server (rep0) whose handler may answer later, from
 *    any thread: the router holds a client's poll until tokens arrive;
 *  - a request/reply client (req0) with asynchronous calls and a timeout;
 *  - a one-way event stream (push0 -> pull0): workers push tokens, load
 *    reports and completions to the router.
 * Message bodies are opaque bytes here (msgpack maps built with msg.h).
 * Handlers and callbacks run on nng's threads and must not block: they
 * hand work to their owner's thread.  nng reconnects dialers by itself,
 * so a restarted peer is reached again without help.
 *
 * Every message goes in an authenticated envelope (envelope.h): each
 * socket is made with its process's credentials (fy_env_auth_t, copied),
 * seals what it sends and opens what it receives.  A message that does
 * not verify, comes again, is stale, or comes from a role the receiver
 * does not take is dropped, counted by fault (fy_*_refused) and logged at
 * most once per fault every 10 s; a server answers such a request with a
 * refusal (no payload, the fault's code) rather than silence.  Handlers
 * and pull callbacks get the sender's authenticated header.  Replies are
 * bound to their request (its channel and sequence number).
 *
 * The credentials' crypt (cluster.encrypt) says which connections encrypt
 * the payload: a client or push socket decides once by its URL (not
 * loopback: encrypted, under auto), a server or pull socket per message by
 * the connection's remote address, and a server answers an encrypted
 * request encrypted.  Where a socket would encrypt, a payload in clear is
 * refused as FY_ENV_CLEAR.  Handlers and callbacks see plaintext.
 */
#ifndef FY_RPC_H
#define FY_RPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/envelope.h"
#include "common/msg.h"
#include "common/status.h"

#define FY_RPC_MAX_MSG (8u << 20) /* bytes a socket accepts in one message */

/* The nng this process links, as nng_version() says ("1.11.0"), and
 * whether it is at least 1.6.0: Debian 12's 1.5.2 has a use-after-free on
 * push sockets (nng issue 1653) and a receive that can hang a close (see
 * close_socket in rpc.c); `make deps` builds 1.11 (docs/architecture.md,
 * "Dependencies").  The first server a process opens logs the version
 * (a warning where it is older than 1.6). */
const char *fy_rpc_nng_version(void);
bool fy_rpc_nng_fixed(void);

/* A listening socket's limits before authentication (rpc.c, "a listening
 * socket's connections"): a frame longer than max_msg payload bytes
 * closes its connection before nng allocates it; at most max_conns
 * connections at once, of which at most max_pending not authenticated
 * yet (0: no cap), one more is closed as it arrives; a connection that
 * has not delivered an authenticated message auth_s seconds after
 * connecting is closed (0: never).  Defaults: FY_RPC_MAX_MSG,
 * FY_RPC_SERVER_CONNS or FY_RPC_PULL_CONNS, FY_RPC_PENDING, FY_RPC_AUTH_S. */
typedef struct fy_rpc_limits {
    size_t max_msg;
    int max_conns, max_pending;
    double auth_s;
} fy_rpc_limits_t;

#define FY_RPC_SERVER_CONNS 512 /* clients of one router's port at once */
#define FY_RPC_PULL_CONNS 256   /* senders to one event stream at once */
#define FY_RPC_PENDING 32       /* connections of a socket not authenticated yet */
#define FY_RPC_AUTH_S 10.0      /* seconds a new connection has to authenticate */

/* A listening socket's connections: open now, closed over the cap, closed past the deadline. */
typedef struct fy_rpc_conns {
    uint64_t open, over_cap, late;
} fy_rpc_conns_t;

/* Which sender roles a receiving socket takes: a mask of 1u << fy_env_role_t. */
#define FY_RPC_FROM(role) (1u << (role))

/* ---- server ---- */

typedef struct fy_rpc_server fy_rpc_server_t;
typedef struct fy_rpc_call fy_rpc_call_t; /* one request waiting for its reply */

/* Called for each authenticated request on an nng thread; must not block.
 * The handler owns call until it (or anyone it hands call to) calls
 * fy_rpc_reply* exactly once; msg is valid until then, from during this
 * call only. */
typedef void (*fy_rpc_handler_fn)(void *arg, fy_rpc_call_t *call, const fy_env_hdr_t *from, const void *msg,
                                  size_t len);

/* Listens on url (tcp://host:port, ipc:///path) and serves up to n_slots
 * requests at once, from senders whose role is in the mask roles
 * (FY_RPC_FROM(FY_ROLE_CLIENT)...); auth is this server's credentials. */
fy_status_t fy_rpc_server_create(const char *url, int n_slots, const fy_env_auth_t *auth, unsigned roles,
                                 fy_rpc_handler_fn fn, void *arg, fy_rpc_server_t **s_p);
/* Every call handed out must have been replied to. */
void fy_rpc_server_destroy(fy_rpc_server_t *s); /* accepts NULL */
/* Adds the requests refused so far, by fault, to out. */
void fy_rpc_server_refused(fy_rpc_server_t *s, uint64_t out[FY_ENV_N_FAULTS]);
/* Sets the server's limits (new connections and frames get them). */
void fy_rpc_server_limit(fy_rpc_server_t *s, const fy_rpc_limits_t *l);
void fy_rpc_server_conns(fy_rpc_server_t *s, fy_rpc_conns_t *out);

/* Sends the reply (copied); the call is gone afterwards. */
void fy_rpc_reply(fy_rpc_call_t *call, const void *buf, size_t len);
/* Finishes w and sends it; an error reply if w cannot be finished. */
void fy_rpc_reply_msgw(fy_rpc_call_t *call, fy_msgw_t *w);
/* {type: "error", id, code: fy_status_str(st) tag, message}. */
void fy_rpc_reply_error(fy_rpc_call_t *call, uint64_t id, fy_status_t st, const char *message);

/* Writes the common error message into a fresh writer (for pushes too). */
void fy_msg_error(fy_msgw_t *w, uint64_t id, fy_status_t st, const char *message);
/* The status named by an error message's "code" (FY_ERR_INTERNAL if unknown). */
fy_status_t fy_msg_error_code(const char *code);
/* The wire tag of a status: "overloaded", "no_space", ... */
const char *fy_status_tag(fy_status_t st);

/* ---- client ---- */

typedef struct fy_rpc_client fy_rpc_client_t;

/* Runs exactly once per accepted call, on an nng thread; reply is valid
 * during the call only (NULL unless st is FY_OK). */
typedef void (*fy_rpc_reply_fn)(void *arg, fy_status_t st, const void *reply, size_t len);

/* Dials url in the background; calls made before the peer is up wait for
 * it until their timeout.  Replies are taken from a router role only.
 * The first call asks the server who it is (a hello, answered by its
 * socket) and the calls made meanwhile wait for the answer; every request
 * then names that server (role, name, incarnation), so no other server
 * takes it.  A refusal as "identity" (the router restarted, or another
 * took the address) makes the next call ask again. */
fy_status_t fy_rpc_client_create(const char *url, const fy_env_auth_t *auth, fy_rpc_client_t **c_p);
/* Ends every outstanding call (callback with FY_ERR_CANCELLED) first,
 * then lets replies to requests already sent, timed-out ones included,
 * arrive (1 s at most) before it closes the socket (see rpc.c). */
void fy_rpc_client_destroy(fy_rpc_client_t *c); /* accepts NULL */
/* FY_ERR_TIMEOUT when no reply came within timeout_s, FY_ERR_PEER when
 * the connection failed or the reply did not verify, FY_ERR_MISMATCH when
 * the server refused the request as unauthenticated (another secret, a
 * clock far off; logged).  On FY_OK from the call itself, cb will run. */
fy_status_t fy_rpc_call_async(fy_rpc_client_t *c, const void *buf, size_t len, double timeout_s, fy_rpc_reply_fn cb,
                              void *arg);
/* Blocking: *reply_p (fy_free it) on success. */
fy_status_t fy_rpc_call(fy_rpc_client_t *c, const void *buf, size_t len, double timeout_s, void **reply_p,
                        size_t *len_p);

/* ---- event streams ---- */

typedef struct fy_push fy_push_t;
typedef struct fy_pull fy_pull_t;

/* Dials url; up to queue messages wait while the peer is slow or away.
 * Each is addressed to "to" (its role and name; inc 0: any incarnation),
 * and the receiver takes only what is addressed to itself. */
fy_status_t fy_push_create(const char *url, int queue, const fy_env_auth_t *auth, const fy_env_peer_t *to,
                           fy_push_t **p_p);
void fy_push_destroy(fy_push_t *p); /* accepts NULL */
/* Never blocks: FY_ERR_NO_SPACE when the queue is full (counted, logged once). */
fy_status_t fy_push_send(fy_push_t *p, const void *buf, size_t len);
fy_status_t fy_push_msgw(fy_push_t *p, fy_msgw_t *w);
uint64_t fy_push_dropped(fy_push_t *p);
/* Whether a connection to the peer is up now: a process that runs (or is
 * stopped) holds it; one that died does not. */
bool fy_push_connected(fy_push_t *p);

/* Called for each authenticated message, on an nng thread; must not
 * block.  from and buf are valid during the call only. */
typedef void (*fy_pull_fn)(void *arg, const fy_env_hdr_t *from, const void *buf, size_t len);
/* Listens on url for senders whose role is in the mask roles. */
fy_status_t fy_pull_create(const char *url, const fy_env_auth_t *auth, unsigned roles, fy_pull_fn fn, void *arg,
                           fy_pull_t **p_p);
void fy_pull_destroy(fy_pull_t *p); /* accepts NULL; no callback runs after it returns */
/* The owner refuses an authenticated message whose sender does not fit
 * it (an event naming another worker): counted as FY_ENV_IDENTITY and
 * logged (rate-limited) with why. */
void fy_pull_refuse(fy_pull_t *p, const fy_env_hdr_t *from, const char *why);
/* Adds the messages refused so far, by fault, to out. */
void fy_pull_refused(fy_pull_t *p, uint64_t out[FY_ENV_N_FAULTS]);
/* Sets the stream's limits (new connections and frames get them). */
void fy_pull_limit(fy_pull_t *p, const fy_rpc_limits_t *l);
void fy_pull_conns(fy_pull_t *p, fy_rpc_conns_t *out);

#endif /* FY_RPC_H */

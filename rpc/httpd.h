/*
 * httpd.h - the HTTP server of every ferry process: GET routes for
 * /metrics and /health, and full handlers (request bodies, answers given
 * later from another thread, streamed answers) for the router's OpenAI
 * API.
 *
 * One server per host and port, shared by its holders: a process that
 * already serves an API on an address (the router on
 * http://127.0.0.1:8080) can create an fy_httpd_t on the same URL and add
 * its routes beside the API's; each holder removes only its own routes,
 * and the last one stops the server.  A request for a path no route has
 * gets 404, another method on a route's path 405 (HEAD is answered as GET
 * without the body), OPTIONS on a route's path 204 with Allow (or a CORS
 * preflight's answer, fy_httpd_cors); every error has an OpenAI-shaped
 * JSON body ({"error": {"message", "type", "param", "code"}}).  A refused
 * request's body is read and dropped before it is answered (up to 8 MiB;
 * beyond that the answer says Connection: close), so the next request on
 * a kept-alive connection is read from where it starts; the process keeps
 * serving.  (Requests libmicrohttpd cannot parse at all, such as a
 * malformed request line, get its own short answer.)
 *
 * Every connection is guarded (fy_httpd_limits_t, docs/operations.md):
 * a request's line, headers and body must arrive within the header
 * timeout (counted from the connection's opening, or from the end of the
 * previous answer on a kept-alive connection: a client trickling a byte
 * every few seconds is closed); a connection where nothing moves for the
 * idle timeout is closed (a kept-alive connection between requests, a
 * client that stops reading its answer; an answer that waits for its
 * data is not idle); request lines and headers over max_header bytes are
 * answered 431 (414 for a request line alone), bodies over a route's
 * max_body 413.  A body framed two ways (Content-Length fields that
 * disagree, Content-Length with Transfer-Encoding) is answered 400 and
 * its connection closed, so that nothing of it is read as a request of
 * its own (request smuggling behind a proxy; RFC 9112, 6.1 and 6.3).  At most max_connections are served: a new connection
 * beyond that closes the oldest one that has no request under way, or,
 * when every one is busy answering, is answered 503 with a JSON body and
 * closed (GET routes such as /health are still answered on it).
 *
 * TLS (HTTPS only on the port) when the limits name a certificate and key
 * (router.tls_cert, tls_key): libmicrohttpd's own, on GnuTLS, TLS 1.2 and
 * 1.3 (or 1.3 alone), no 0-RTT early data, no client certificates.  The
 * header deadline counts from the TCP accept, so a client that never
 * finishes its handshake is closed at it like one that never sends its
 * request; a plain-HTTP request to a TLS port fails its handshake and the
 * connection is closed without an answer.
 *
 * Not a general web server: no HTTP/2, no uploads beyond a route's
 * max_body.
 */
#ifndef FY_HTTPD_H
#define FY_HTTPD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/netconf.h"
#include "common/status.h"

typedef struct fy_httpd fy_httpd_t;

/* ---- the server ---------------------------------------------------------------------------------- */

/* The limits (fy_httpd_limits_t, the key table's defaults and what the
 * configuration says: common/netconf.h) checked for what only this layer
 * knows: with tls_cert set, both files are regular files holding a PEM
 * certificate and a PEM private key, the key owned by this user (or root)
 * and not readable by its group or others, and this libmicrohttpd speaks
 * TLS.  FY_ERR_INVALID (logged, naming the key: SECTION.tls_cert) for a
 * file refused.  fy_httpd_create_with checks the same again when it
 * starts a server; a process calls this to refuse its configuration
 * before anything starts. */
fy_status_t fy_httpd_limits_check(const fy_httpd_limits_t *l);

/*
 * Holds the server for url ("http://HOST:PORT", or "tcp://HOST:PORT",
 * which means the same here; "https://HOST:PORT" with limits naming a
 * certificate) and starts it (binding the port) unless another holder
 * already runs it, in which case its limits stay.  FY_ERR_INVALID for a
 * URL that is not one of those, for https:// without a certificate, and
 * for a certificate and key the TLS library refuses (a mismatch: logged
 * naming SECTION.tls_cert and tls_key); FY_ERR_IO (logged with the
 * system's reason, "Address already in use") when the port cannot be
 * bound.  fy_httpd_create takes the default limits.
 */
fy_status_t fy_httpd_create_with(const char *url, const fy_httpd_limits_t *limits, fy_httpd_t **h_p);
fy_status_t fy_httpd_create(const char *url, fy_httpd_t **h_p);
/* The bound TCP port (useful with port 0), or -1. */
int fy_httpd_port(const fy_httpd_t *h);
/* Whether the server speaks TLS. */
bool fy_httpd_tls(const fy_httpd_t *h);
/* Removes this object's routes, waits for callbacks running in them to
 * return and ends their held requests (end(arg, false)), stops the
 * server unless another holder still runs it, and lets go of it.  No
 * callback of this object starts after it returns.  Accepts NULL. */
void fy_httpd_destroy(fy_httpd_t *h);

/* What the server has seen (all holders together). */
typedef struct fy_httpd_stats {
    int32_t open;       /* connections open now */
    uint64_t timed_out; /* closed at the header timeout */
    uint64_t evicted;   /* closed to make room for a new one */
    uint64_t refused;   /* answered 503: every connection was busy */
} fy_httpd_stats_t;
void fy_httpd_stats(const fy_httpd_t *h, fy_httpd_stats_t *s);

/*
 * Cross-origin requests from browsers: origins is "*" (any), a
 * comma-separated list of origins ("https://app.example,
 * http://localhost:3000"), or empty (off, the default).  Answers to an
 * allowed Origin carry Access-Control-Allow-Origin (errors too); a
 * preflight (OPTIONS with Origin and Access-Control-Request-Method) from
 * one is answered 204 with the route's methods and the headers asked for,
 * from another 403.  For the whole server (all its holders).
 * FY_ERR_INVALID (logged, naming the entry) for an entry that is not
 * http(s)://HOST[:PORT].
 */
fy_status_t fy_httpd_cors(fy_httpd_t *h, const char *origins);

/* ---- GET routes ------------------------------------------------------------------------------------ */

/* What a route answers.  The callback sets status (200 when left alone),
 * content_type (a string that outlives the call; "text/plain" when left
 * NULL) and the body: body points at body_len bytes, and when body_owned
 * is set the server fy_frees it after copying. */
typedef struct fy_http_reply {
    int status;
    const char *content_type;
    char *body;
    size_t body_len;
    int body_owned;
} fy_http_reply_t;

/* Runs on a server thread for each GET (or HEAD) of the route's path;
 * must not block for long. */
typedef void (*fy_httpd_get_fn)(void *arg, const char *path, fy_http_reply_t *reply);

/* Adds a GET route for exactly path ("/metrics").  FY_ERR_INVALID when
 * this server already has a route on that path. */
fy_status_t fy_httpd_route(fy_httpd_t *h, const char *path, fy_httpd_get_fn fn, void *arg);

/* A JSON body {"error": {"message": msg, "type": type}} (msg escaped),
 * for callbacks that answer an error. */
void fy_httpd_reply_error(fy_http_reply_t *reply, int status, const char *type, const char *msg);

/* reg rendered as Prometheus text (a 500 error when that runs out of
 * memory): the whole of a /metrics route. */
struct fy_metrics;
void fy_httpd_reply_metrics(fy_http_reply_t *reply, struct fy_metrics *reg);

/* ---- full handlers --------------------------------------------------------------------------------- */

/* One request to a handler's route, owned by the server.  Valid in the
 * handler and, once held, until its end callback has returned. */
typedef struct fy_httpd_req fy_httpd_req_t;

/* Runs on a server thread with the whole request (headers, and a body of
 * at most the route's max_body bytes).  It answers now (fy_httpd_answer)
 * or holds the request to answer later; one that does neither is answered
 * 500.  Must not block for long. */
typedef void (*fy_httpd_fn)(void *arg, fy_httpd_req_t *r);

/* Adds a route for method ("GET" also takes HEAD; "POST") on exactly
 * path, or, for a path ending in '*' (the router's models route is
 * "/v1/models/" and a star), on every path that starts with what is
 * before the '*' and goes on by a byte or more (an exact route wins, then
 * the longest prefix).  FY_ERR_INVALID when the server already has a
 * route on path. */
fy_status_t fy_httpd_handle(fy_httpd_t *h, const char *method, const char *path, size_t max_body, fy_httpd_fn fn,
                            void *arg);

/* The request's path (percent-escapes undone, without the query). */
const char *fy_httpd_req_path(fy_httpd_req_t *r);
/* A request header (case-insensitive name), or NULL. */
const char *fy_httpd_req_header(fy_httpd_req_t *r, const char *name);
/* The body (NUL-terminated for convenience; may hold NULs) and its length. */
const char *fy_httpd_req_body(fy_httpd_req_t *r, size_t *len_p);

/*
 * Answers r as a whole: status, content type, extra headers (NULL, or
 * {"Name", "value", ..., NULL}) and body (copied).  From the handler, or
 * for a held request from any thread.  Once r is answered (or its client
 * gone) further answers and writes are ignored.
 */
void fy_httpd_answer(fy_httpd_req_t *r, int status, const char *content_type, const char *const *headers,
                     const void *body, size_t len);

/* A held request has ended: complete when its whole answer went out,
 * false when the client went away (or the connection broke, or the server
 * is stopping) first.  Called once, on a server thread, holding no lock of
 * the server's; r must not be used once it returns. */
typedef void (*fy_httpd_end_fn)(void *arg, bool complete);

/* From the handler: r stays open after the handler returns, for an
 * answer (fy_httpd_answer or a stream) from any thread.  While it waits,
 * a client that closes its socket (or half-closes it) is noticed at once
 * and end(arg, false) is called. */
void fy_httpd_hold(fy_httpd_req_t *r, fy_httpd_end_fn end, void *arg);

/* A streamed answer (chunked) on a held request: begin with the status,
 * content type and headers; write appends (copied; sent as the client
 * reads); end finishes it.  Writes beyond 8 MiB not yet taken by the
 * client count as the client gone.  FY_ERR_CANCELLED once the client is
 * gone or r is answered; FY_ERR_NOMEM. */
fy_status_t fy_httpd_stream_begin(fy_httpd_req_t *r, int status, const char *content_type, const char *const *headers);
fy_status_t fy_httpd_stream_write(fy_httpd_req_t *r, const void *data, size_t len);
void fy_httpd_stream_end(fy_httpd_req_t *r);

#endif /* FY_HTTPD_H */

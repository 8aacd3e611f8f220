/*
 * httpd.h - GET routes on nng's HTTP server: what a process needs to
 * answer /metrics and /health.
 *
 * nng keeps one server per host and port (nng_http_server_hold), so a
 * process that already serves an API on an address (the router on
 * http://127.0.0.1:8080) can create an fy_httpd_t on the same URL and add
 * its routes beside the API's: both share the listener, and each side
 * removes only its own routes.  A request for a path no route has gets
 * nng's 404, another method on a route's path 405 (HEAD is answered as
 * GET without the body); the process keeps serving.
 *
 * Not a general web server: no request bodies, no streaming, no TLS.
 */
#ifndef FY_HTTPD_H
#define FY_HTTPD_H

#include <stddef.h>

#include "status.h"

typedef struct fy_httpd fy_httpd_t;

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

/* Runs on an nng thread for each GET (or HEAD) of the route's path; must
 * not block for long. */
typedef void (*fy_httpd_get_fn)(void *arg, const char *path, fy_http_reply_t *reply);

/*
 * Holds nng's server for url ("http://HOST:PORT", or "tcp://HOST:PORT",
 * which means the same here) and starts it (binding the port) unless it
 * already runs.  FY_ERR_INVALID for a URL that is not one of those,
 * FY_ERR_IO (logged with nng's reason) when the port cannot be bound.
 */
fy_status_t fy_httpd_create(const char *url, fy_httpd_t **h_p);
/* Adds a GET route for exactly path ("/metrics").  FY_ERR_INVALID when
 * this server already has a GET route on that path. */
fy_status_t fy_httpd_route(fy_httpd_t *h, const char *path, fy_httpd_get_fn fn, void *arg);
/* The bound TCP port (useful with port 0), or -1. */
int fy_httpd_port(const fy_httpd_t *h);
/* Removes this object's routes, waits for callbacks running in them to
 * return, stops the server unless another holder still runs it, and lets
 * go of it.  No callback of this object starts after it returns.
 * Accepts NULL. */
void fy_httpd_destroy(fy_httpd_t *h);

/* A JSON body {"error": {"message": msg, "type": type}} (msg escaped),
 * for callbacks that answer an error. */
void fy_httpd_reply_error(fy_http_reply_t *reply, int status, const char *type, const char *msg);

#endif /* FY_HTTPD_H */

/*
 * httpd.c - GET routes on nng's HTTP server (see httpd.h).
 *
 * Each route is an nng handler whose data is a route_t that nng frees
 * (through the handler's destructor) when its last reference goes: a
 * callback nng dispatched just before the route was removed still finds
 * its route_t, sees it closed and answers 503 without touching the
 * caller's state.  fy_httpd_destroy closes each route and waits for the
 * callbacks inside the caller's function to return.
 */
#include "httpd.h"

#include <arpa/inet.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <nng/nng.h>
#include <nng/supplemental/http/http.h>

#include "log.h"
#include "mem.h"

#define MAX_ROUTES 16

typedef struct route {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool closed;
    int inflight;
    fy_httpd_get_fn fn;
    void *arg;
    char path[128];
} route_t;

struct fy_httpd {
    char url[256];
    nng_http_server *srv;
    bool started;
    nng_http_handler *handlers[MAX_ROUTES];
    route_t *routes[MAX_ROUTES];
    int n_routes;
};

static void route_free(void *arg)
{
    route_t *r = arg;
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    fy_free(r);
}

static void json_escape(char *out, size_t cap, const char *s)
{
    size_t n = 0;
    for (; *s && n + 7 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            out[n++] = '\\';
            out[n++] = (char)c;
        } else if (c < 0x20) {
            n += (size_t)snprintf(out + n, cap - n, "\\u%04x", c);
        } else {
            out[n++] = (char)c;
        }
    }
    out[n] = 0;
}

void fy_httpd_reply_error(fy_http_reply_t *reply, int status, const char *type, const char *msg)
{
    char m[512], t[64], *body = fy_malloc(700);
    json_escape(m, sizeof(m), msg);
    json_escape(t, sizeof(t), type);
    reply->status = status;
    reply->content_type = "application/json";
    if (reply->body_owned) fy_free(reply->body);
    reply->body = body;
    reply->body_owned = body != NULL;
    reply->body_len =
        body ? (size_t)snprintf(body, 700, "{\"error\":{\"message\":\"%s\",\"type\":\"%s\"}}\n", m, t) : 0;
}

/* nng thread: one GET or HEAD of a route's path */
static void on_request(nng_aio *aio)
{
    nng_http_handler *h = nng_aio_get_input(aio, 1);
    route_t *r = nng_http_handler_get_data(h);
    fy_http_reply_t reply = {.status = 200};
    pthread_mutex_lock(&r->mu);
    bool closed = r->closed;
    if (!closed) r->inflight++;
    pthread_mutex_unlock(&r->mu);
    if (closed) {
        fy_httpd_reply_error(&reply, 503, "unavailable", "shutting down");
    } else {
        r->fn(r->arg, r->path, &reply);
        pthread_mutex_lock(&r->mu);
        if (--r->inflight == 0) pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
    }
    nng_http_res *res;
    int rv = nng_http_res_alloc(&res);
    if (rv == 0) {
        if (reply.status < 100 || reply.status > 599) reply.status = 500;
        if ((rv = nng_http_res_set_status(res, (uint16_t)reply.status)) == 0 &&
            (rv = nng_http_res_set_header(res, "Content-Type",
                                          reply.content_type ? reply.content_type : "text/plain")) == 0 &&
            (rv = nng_http_res_set_header(res, "Cache-Control", "no-store")) == 0)
            rv = nng_http_res_copy_data(res, reply.body ? reply.body : "", reply.body ? reply.body_len : 0);
        if (rv) nng_http_res_free(res);
    }
    if (reply.body_owned) fy_free(reply.body);
    if (rv) {
        fy_warn("http %s: cannot build a reply: %s", r->path, nng_strerror(rv));
        nng_aio_finish(aio, rv); /* nng closes the connection */
        return;
    }
    nng_aio_set_output(aio, 0, res);
    nng_aio_finish(aio, 0);
}

fy_status_t fy_httpd_create(const char *url, fy_httpd_t **h_p)
{
    fy_httpd_t *h = fy_calloc(1, sizeof(*h));
    if (!h) {
        fy_error("http: out of memory");
        return FY_ERR_NOMEM;
    }
    if (!url || (strncmp(url, "http://", 7) && strncmp(url, "tcp://", 6))) {
        fy_error("http: '%s': expected http://HOST:PORT or tcp://HOST:PORT", url ? url : "(null)");
        fy_free(h);
        return FY_ERR_INVALID;
    }
    snprintf(h->url, sizeof(h->url), "http://%s", url + (url[0] == 'h' ? 7 : 6));
    nng_url *u;
    int rv = nng_url_parse(&u, h->url);
    if (rv) {
        fy_error("http: '%s': %s", url, nng_strerror(rv));
        fy_free(h);
        return FY_ERR_INVALID;
    }
    if (strcmp(u->u_path, "") && strcmp(u->u_path, "/")) {
        fy_error("http: '%s': a server address takes no path", url);
        nng_url_free(u);
        fy_free(h);
        return FY_ERR_INVALID;
    }
    rv = nng_http_server_hold(&h->srv, u);
    nng_url_free(u);
    if (rv) {
        fy_error("http %s: %s", h->url, nng_strerror(rv));
        fy_free(h);
        return rv == NNG_ENOMEM ? FY_ERR_NOMEM : FY_ERR_INVALID;
    }
    if ((rv = nng_http_server_start(h->srv))) {
        fy_error("http %s: cannot listen: %s", h->url, nng_strerror(rv));
        nng_http_server_release(h->srv);
        fy_free(h);
        return FY_ERR_IO;
    }
    h->started = true;
    *h_p = h;
    return FY_OK;
}

fy_status_t fy_httpd_route(fy_httpd_t *h, const char *path, fy_httpd_get_fn fn, void *arg)
{
    if (!path || path[0] != '/' || strlen(path) >= sizeof(((route_t *)0)->path) || !fn) {
        fy_error("http %s: a route needs a path starting with / and a function", h->url);
        return FY_ERR_INVALID;
    }
    if (h->n_routes == MAX_ROUTES) {
        fy_error("http %s: more than %d routes", h->url, MAX_ROUTES);
        return FY_ERR_INVALID;
    }
    route_t *r = fy_calloc(1, sizeof(*r));
    if (!r) {
        fy_error("http %s: out of memory for route %s", h->url, path);
        return FY_ERR_NOMEM;
    }
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->fn = fn;
    r->arg = arg;
    snprintf(r->path, sizeof(r->path), "%s", path);
    nng_http_handler *hd;
    int rv = nng_http_handler_alloc(&hd, path, on_request);
    if (rv) {
        route_free(r);
        fy_error("http %s: route %s: %s", h->url, path, nng_strerror(rv));
        return FY_ERR_NOMEM;
    }
    /* from here the handler owns r */
    if ((rv = nng_http_handler_set_data(hd, r, route_free)) != 0) {
        route_free(r);
        nng_http_handler_free(hd);
        fy_error("http %s: route %s: %s", h->url, path, nng_strerror(rv));
        return FY_ERR_INTERNAL;
    }
    if ((rv = nng_http_handler_set_method(hd, "GET")) != 0 ||
        (rv = nng_http_handler_collect_body(hd, false, 0)) != 0 ||
        (rv = nng_http_server_add_handler(h->srv, hd)) != 0) {
        nng_http_handler_free(hd);
        fy_error("http %s: route %s: %s", h->url, path,
                 rv == NNG_EADDRINUSE ? "the path already has a GET route" : nng_strerror(rv));
        return rv == NNG_EADDRINUSE ? FY_ERR_INVALID : FY_ERR_INTERNAL;
    }
    h->handlers[h->n_routes] = hd;
    h->routes[h->n_routes++] = r;
    return FY_OK;
}

int fy_httpd_port(const fy_httpd_t *h)
{
    nng_sockaddr sa;
    if (!h || nng_http_server_get_addr(h->srv, &sa)) return -1;
    if (sa.s_family == NNG_AF_INET) return (int)ntohs(sa.s_in.sa_port);
    if (sa.s_family == NNG_AF_INET6) return (int)ntohs(sa.s_in6.sa_port);
    return -1;
}

void fy_httpd_destroy(fy_httpd_t *h)
{
    if (!h) return;
    for (int i = 0; i < h->n_routes; i++) {
        route_t *r = h->routes[i];
        pthread_mutex_lock(&r->mu);
        r->closed = true;
        while (r->inflight > 0) pthread_cond_wait(&r->cv, &r->mu);
        pthread_mutex_unlock(&r->mu);
        /* on success the server's reference comes back to us; r goes with the last one */
        if (nng_http_server_del_handler(h->srv, h->handlers[i]) == 0) nng_http_handler_free(h->handlers[i]);
    }
    if (h->started) nng_http_server_stop(h->srv);
    nng_http_server_release(h->srv);
    fy_free(h);
}

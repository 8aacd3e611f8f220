/*
 * http.h - the router's HTTP front door: OpenAI's API (/v1/completions,
 * /v1/chat/completions, /v1/responses, /v1/models), /health and /metrics, on
 * router.http.  docs/operations.md lists the routes; router/http.c says
 * how a request and its stream are driven.
 *
 * Not here: the router core it submits to (router_int.h), the body
 * parsing (http_parse.h).
 */
#ifndef FY_HTTP_H
#define FY_HTTP_H

#include "router/router_int.h"

/* What fy_router_run is given to start, drain and stop the front door. */
extern const fy_router_door_t fy_http_door;

#endif /* FY_HTTP_H */

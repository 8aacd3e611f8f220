/* main.c - the router process: the router core with its HTTP front door. */
#include "router/router.h"

#include "router/http.h"
#include "router/router_int.h"

int fy_router_main(int argc, char **argv) { return fy_router_run(argc, argv, &fy_http_door); }

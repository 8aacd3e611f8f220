/* ferry-router - the router process (router/router.h). */
#include "router/router.h"

int main(int argc, char **argv) { return fy_router_main(argc, argv); }

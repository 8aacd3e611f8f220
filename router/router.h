/*
 * router.h - the router: the front door of a ferry deployment.
 *
 * Clients send requests over nng (request/reply, msgpack); the router
 * tokenizes them, places each on a decode worker that can admit it (the
 * least loaded) and a prefill worker (the one that already caches most of
 * the prompt, weighed against how busy it is), drives the request through
 * reserve -> prefill -> adopt -> decode, and relays tokens back to the
 * client's polls.  Workers report their load every heartbeat on the event
 * stream; one that falls silent for health_timeout is marked down, its
 * requests end with an error (or, for a prefill worker, are retried once
 * elsewhere), and it rejoins when it reports again.  docs/protocol.md
 * describes every message; docs/architecture.md the request's life.
 */
#ifndef FY_ROUTER_H
#define FY_ROUTER_H

/* The whole router process: "-c FILE [--set section.key=value]...".
 * Returns the process exit status. */
int fy_router_main(int argc, char **argv);

#endif /* FY_ROUTER_H */

/*
 * capture_util.h - what crosses a network interface, for tests that
 * check what an eavesdropper on the wire would read: an AF_PACKET socket
 * (root) on one interface of the calling thread's network namespace,
 * keeping the TCP payload of IPv4 segments to or from one port, in
 * arrival order, both directions together.
 */
#ifndef FY_CAPTURE_UTIL_H
#define FY_CAPTURE_UTIL_H

#include <stddef.h>

typedef struct tc_cap tc_cap_t;

/* Starts capturing on ifname (of this thread's namespace) the TCP
 * payload to or from port; NULL (with a message) when the socket cannot
 * be had (not root). */
tc_cap_t *tc_cap_start(const char *ifname, int port);
/* Stops and frees c: the payload bytes (fy_free; NUL-terminated, may hold
 * NULs) and their length; *segments_p: TCP segments with a payload seen. */
char *tc_cap_stop(tc_cap_t *c, size_t *len_p, int *segments_p);

#endif /* FY_CAPTURE_UTIL_H */

/*
 * capture_util.c - TCP payload crossing an interface (see capture_util.h).
 *
 * A SOCK_DGRAM packet socket for every protocol (one for IPv4 alone is not
 * shown what the interface sends) gets each packet without its link
 * header, both directions; the IPv4 ones are looked at.  A thread
 * reads them until stopped (polling, so the stop is seen within 50 ms)
 * and keeps the TCP payload of those whose source or destination port is
 * the one asked for.  The payload is kept in the order packets arrived,
 * retransmissions included: enough to ask whether some text crossed.
 */
#include "tests/capture_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/mem.h"

#define CAP_MAX (64u << 20) /* payload bytes kept at most */

struct tc_cap {
    int fd;
    int port;
    pthread_t th;
    atomic_bool stop;
    char *buf;
    size_t len, cap;
    int segments;
};

static void keep(tc_cap_t *c, const uint8_t *p, size_t n)
{
    if (c->len + n + 1 > c->cap) {
        size_t want = (c->len + n + 1) * 2;
        if (want > CAP_MAX) return;
        char *b = fy_realloc(c->buf, want);
        if (!b) return;
        c->buf = b;
        c->cap = want;
    }
    memcpy(c->buf + c->len, p, n);
    c->len += n;
    c->buf[c->len] = 0;
    c->segments++;
}

/* one IPv4 packet: its TCP payload when a port is ours */
static void on_packet(tc_cap_t *c, const uint8_t *p, size_t n)
{
    if (n < 20 || (p[0] >> 4) != 4 || p[9] != IPPROTO_TCP) return;
    size_t ihl = (size_t)(p[0] & 15) * 4, total = ((size_t)p[2] << 8) | p[3];
    if (total < n) n = total; /* padding after the packet */
    if (ihl < 20 || n < ihl + 20) return;
    const uint8_t *t = p + ihl;
    int sport = (t[0] << 8) | t[1], dport = (t[2] << 8) | t[3];
    size_t doff = (size_t)(t[12] >> 4) * 4;
    if ((sport != c->port && dport != c->port) || doff < 20 || n < ihl + doff) return;
    if (n > ihl + doff) keep(c, t + doff, n - ihl - doff);
}

static void *cap_main(void *arg)
{
    tc_cap_t *c = arg;
    static uint8_t pkt[1 << 16];
    while (!atomic_load(&c->stop)) {
        struct pollfd pf = {.fd = c->fd, .events = POLLIN};
        if (poll(&pf, 1, 50) <= 0) continue;
        for (;;) { /* everything queued, then look at the stop flag again */
            struct sockaddr_ll from;
            socklen_t fl = sizeof(from);
            ssize_t k = recvfrom(c->fd, pkt, sizeof(pkt), MSG_DONTWAIT, (struct sockaddr *)&from, &fl);
            if (k <= 0) break;
            if (from.sll_protocol == htons(ETH_P_IP)) on_packet(c, pkt, (size_t)k);
        }
    }
    return NULL;
}

tc_cap_t *tc_cap_start(const char *ifname, int port)
{
    unsigned idx = if_nametoindex(ifname);
    if (!idx) {
        fprintf(stderr, "capture: no interface %s here: %s\n", ifname, strerror(errno));
        return NULL;
    }
    /* ETH_P_ALL: a socket for one protocol sees only what the interface receives */
    int fd = socket(AF_PACKET, SOCK_DGRAM | SOCK_CLOEXEC, htons(ETH_P_ALL));
    if (fd < 0) {
        fprintf(stderr, "capture: cannot open a packet socket (root?): %s\n", strerror(errno));
        return NULL;
    }
    struct sockaddr_ll sa = {.sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_ALL), .sll_ifindex = (int)idx};
    int rcvbuf = 8 << 20;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa))) {
        fprintf(stderr, "capture: cannot bind to %s: %s\n", ifname, strerror(errno));
        close(fd);
        return NULL;
    }
    tc_cap_t *c = fy_calloc(1, sizeof(*c));
    if (!c) {
        close(fd);
        return NULL;
    }
    c->fd = fd;
    c->port = port;
    if (pthread_create(&c->th, NULL, cap_main, c)) {
        close(fd);
        fy_free(c);
        return NULL;
    }
    return c;
}

char *tc_cap_stop(tc_cap_t *c, size_t *len_p, int *segments_p)
{
    atomic_store(&c->stop, true);
    pthread_join(c->th, NULL);
    close(c->fd);
    char *b = c->buf ? c->buf : fy_calloc(1, 1);
    *len_p = c->len;
    if (segments_p) *segments_p = c->segments;
    fy_free(c);
    return b;
}

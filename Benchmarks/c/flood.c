// Issue 28: a handshake flooder, written without our library. Every attempt connects, sends the
// version-2 preamble "LANMSG/2" and a Noise message 1 (a 2-byte length and 32 random bytes: an
// ephemeral key the server must do key agreement with), waits for the server's first bytes, and
// resets the connection (SO_LINGER 0: no TIME_WAIT on this side, so ports last).
//
//   flood --port P [--host 127.0.0.1] [--source 127.0.0.2] [--rate N] [--seconds S] [--inflight K]
//         [--timeout-ms T]
//
// --rate 0 (default): as fast as it can, at most K attempts open at once (default 4,096). An
// attempt not answered within T ms (default 250) is abandoned, so that a server that stops
// answering does not slow the flood down. Bounded by --seconds (default 10). Loopback only: it refuses any host outside 127.0.0.0/8. Prints one RESULT line:
// attempts per second, and what the server answered: message 2 (it did the handshake work),
// REFUSE busy (the two zero bytes; docs/PROTOCOL.md, "Busy"), closed without a word, reset.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifndef IP_BIND_ADDRESS_NO_PORT
#define IP_BIND_ADDRESS_NO_PORT 24
#endif

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

enum { CONNECTING = 1, SENT = 2 };
static unsigned char state[1 << 20];
static unsigned gen[1 << 20];
// Open attempts in the order they started: fd, its generation (fds are reused), start time.
struct pending { int fd; unsigned gen; double at; };
static struct pending ring[1 << 20];
static long head, tail;

int main(int argc, char **argv) {
    const char *host = "127.0.0.1", *source = "127.0.0.2";
    int port = 0, rate = 0, inflight_max = 4096, timeout_ms = 250;
    double seconds = 10;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--port")) port = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--host")) host = argv[i + 1];
        else if (!strcmp(argv[i], "--source")) source = argv[i + 1];
        else if (!strcmp(argv[i], "--rate")) rate = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seconds")) seconds = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--inflight")) inflight_max = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--timeout-ms")) timeout_ms = atoi(argv[i + 1]);
    }
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(port)};
    struct sockaddr_in from = {.sin_family = AF_INET};
    if (port <= 0 || inet_pton(AF_INET, host, &to.sin_addr) != 1 || inet_pton(AF_INET, source, &from.sin_addr) != 1 ||
        (ntohl(to.sin_addr.s_addr) >> 24) != 127 || (ntohl(from.sin_addr.s_addr) >> 24) != 127 || seconds > 600) {
        fprintf(stderr, "usage: flood --port P [--host 127.x] [--source 127.x] [--rate N] [--seconds S<=600] [--inflight K]\n");
        return 2;
    }
    int ep = epoll_create1(0);
    unsigned char hello[42] = "LANMSG/2";
    hello[8] = 0;
    hello[9] = 32;
    srand((unsigned)time(NULL));
    long attempts = 0, answered = 0, busy = 0, silent = 0, reset = 0, failed = 0, timedout = 0;
    int inflight = 0;
    struct linger abortive = {1, 0};
    int one = 1;
    double start = now(), end = start + seconds;
    struct epoll_event events[256];
    for (;;) {
        double t = now();
        if (t >= end) break;
        long due = rate > 0 ? (long)((t - start) * rate) + 1 : attempts + inflight_max;
        while (inflight < inflight_max && attempts < due) {
            int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
            if (fd < 0 || fd >= (int)sizeof state) { failed++; if (fd >= 0) close(fd); break; }
            setsockopt(fd, SOL_SOCKET, SO_LINGER, &abortive, sizeof abortive);
            setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
            if (bind(fd, (struct sockaddr *)&from, sizeof from) != 0 ||
                (connect(fd, (struct sockaddr *)&to, sizeof to) != 0 && errno != EINPROGRESS)) {
                failed++;
                close(fd);
                attempts++;
                continue;
            }
            struct epoll_event ev = {.events = EPOLLOUT | EPOLLIN | EPOLLRDHUP, .data.fd = fd};
            epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
            state[fd] = CONNECTING;
            gen[fd]++;
            ring[tail++ & ((1 << 20) - 1)] = (struct pending){fd, gen[fd], t};
            inflight++;
            attempts++;
        }
        // Abandon what the server has not answered in time (a dropped SYN is retried only after 1 s).
        while (head < tail) {
            struct pending *p = &ring[head & ((1 << 20) - 1)];
            if (state[p->fd] == 0 || gen[p->fd] != p->gen) { head++; continue; }  // already finished
            if (t - p->at < timeout_ms / 1000.0) break;
            state[p->fd] = 0;
            close(p->fd);
            inflight--;
            timedout++;
            head++;
        }
        int n = epoll_wait(ep, events, 256, 1);
        for (int i = 0; i < n; i++) {
            int fd = events[i].data.fd;
            uint32_t e = events[i].events;
            if (state[fd] == CONNECTING && (e & EPOLLOUT) && !(e & (EPOLLERR | EPOLLHUP))) {
                for (int k = 10; k < 42; k++) hello[k] = (unsigned char)rand();
                if (write(fd, hello, sizeof hello) == (ssize_t)sizeof hello) {
                    state[fd] = SENT;
                    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.fd = fd};
                    epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
                    continue;
                }
            }
            if (state[fd] == 0) continue;  // abandoned in this round
            if (!(e & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))) continue;
            unsigned char buf[4];
            ssize_t got = read(fd, buf, sizeof buf);
            if (got >= 2 && buf[0] == 0 && buf[1] == 0) busy++;
            else if (got >= 1) answered++;
            else if (got == 0) silent++;
            else if (got < 0 && errno == EAGAIN) continue;  // woke for EPOLLOUT only
            else reset++;
            state[fd] = 0;
            close(fd);  // abortive: RST
            inflight--;
        }
    }
    double elapsed = now() - start;
    printf("RESULT FLOOD flooder attempts=%ld attempts_per_s=%.0f answered_msg2=%ld refused_busy=%ld closed=%ld reset=%ld "
           "timed_out=%ld failed=%ld unfinished=%d\n",
           attempts, attempts / elapsed, answered, busy, silent, reset, timedout, failed, inflight);
    return 0;
}

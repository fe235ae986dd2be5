/* Issue 55: the physical limits of W2 and W1 on this machine — what a C program does with
 * blocking sockets on loopback when it moves the same frames and does nothing else (no JSON, no
 * envelope, no event loop, no threads besides the two processes).
 *
 *   roundtrip server                    prints "READY <port>"; serves one connection, then exits
 *   roundtrip client PORT w2 [SIZE]     W2's limit: 2,000 warm-up then 100,000 round trips, one
 *                                       frame of SIZE bytes (default 100, about W2's frame) in
 *                                       flight; prints "RESULT W2 c p50_us=... p99_us=... max_us=..."
 *   roundtrip client PORT w1 [SIZE]     W1's limit without JSON: 1,000,000 frames of SIZE bytes
 *                                       written 64 to a write(), the server reading 64 KiB at a time
 *                                       and counting them; prints "RESULT W1 c msgs_per_s=..."
 *                                       (the client's clock, until the server confirms the count, as W1)
 *
 * A frame is a 4-byte big-endian length and that many bytes; the first byte says what the server
 * does with it: 'E' echo it, 'S' count it, 'Q' answer with the count (8 bytes, big-endian).
 * TCP_NODELAY on both sides, as the libraries set it. Built by Benchmarks/run.sh with gcc -O2.
 * Loopback (127.0.0.1) only.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "io.h"

#define W2_WARMUP 2000
#define W2_ROUND_TRIPS 100000
#define W1_MESSAGES 1000000
#define W1_BATCH 64
#define MAX_SIZE 65536

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void nodelay(int fd) {
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) die("setsockopt");
}

static size_t put_frame(unsigned char *out, char kind, size_t size) {
    uint32_t length = htonl((uint32_t)size);
    memcpy(out, &length, 4);
    memset(out + 4, 'x', size);
    out[4] = (unsigned char)kind;
    return 4 + size;
}

/* The server: reads 64 KiB at a time and handles every whole frame in what it read. */
static int serve(void) {
    int listener = socket(AF_INET, SOCK_STREAM, 0);
    if (listener < 0) die("socket");
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(listener, (struct sockaddr *)&address, sizeof address) != 0) die("bind");
    if (listen(listener, 1) != 0) die("listen");
    socklen_t length = sizeof address;
    if (getsockname(listener, (struct sockaddr *)&address, &length) != 0) die("getsockname");
    printf("READY %d\n", ntohs(address.sin_port));
    fflush(stdout);
    int fd = accept(listener, NULL, NULL);
    if (fd < 0) die("accept");
    nodelay(fd);
    static unsigned char buffer[1 << 17];
    size_t filled = 0;
    uint64_t counted = 0;
    for (;;) {
        ssize_t r = read(fd, buffer + filled, sizeof buffer - filled);
        if (r == 0) break;
        if (r < 0) die("read");
        filled += (size_t)r;
        size_t at = 0;
        long size;
        while ((size = next_frame(buffer, at, filled, MAX_SIZE)) >= 0) {
            unsigned char kind = buffer[at + 4];
            if (kind == 'E') {
                write_full(fd, buffer + at, 4 + (size_t)size);
            } else if (kind == 'S') {
                counted += 1;
            } else if (kind == 'Q') {
                unsigned char answer[8];
                for (int i = 0; i < 8; i++) answer[i] = (unsigned char)(counted >> (56 - 8 * i));
                write_full(fd, answer, 8);
            }
            at += 4 + (size_t)size;
        }
        memmove(buffer, buffer + at, filled - at);
        filled -= at;
    }
    close(fd);
    close(listener);
    return 0;
}

static int compare(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int client(int port, const char *workload, size_t size) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) die("socket");
    struct sockaddr_in address = {
        .sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(fd, (struct sockaddr *)&address, sizeof address) != 0) die("connect");
    nodelay(fd);
    if (strcmp(workload, "w2") == 0) {
        unsigned char frame[4 + MAX_SIZE], back[4 + MAX_SIZE];
        size_t n = put_frame(frame, 'E', size);
        uint64_t *latencies = malloc(sizeof(uint64_t) * W2_ROUND_TRIPS);
        if (!latencies) die("malloc");
        for (int i = 0; i < W2_WARMUP + W2_ROUND_TRIPS; i++) {
            uint64_t t0 = now_ns();
            write_full(fd, frame, n);
            read_full(fd, back, n);
            if (i >= W2_WARMUP) latencies[i - W2_WARMUP] = now_ns() - t0;
        }
        if (memcmp(frame, back, n) != 0) {
            fprintf(stderr, "the echo differs\n");
            return 1;
        }
        qsort(latencies, W2_ROUND_TRIPS, sizeof(uint64_t), compare);
        printf("RESULT W2 c p50_us=%.1f p99_us=%.1f max_us=%.1f frame_bytes=%zu (C loop: blocking sockets, no codec)\n",
               latencies[W2_ROUND_TRIPS / 2] / 1e3, latencies[W2_ROUND_TRIPS * 99 / 100] / 1e3,
               latencies[W2_ROUND_TRIPS - 1] / 1e3, size);
        free(latencies);
    } else if (strcmp(workload, "w1") == 0) {
        size_t n = 4 + size;
        unsigned char *batch = malloc(n * W1_BATCH);
        if (!batch) die("malloc");
        for (int i = 0; i < W1_BATCH; i++) put_frame(batch + i * n, 'S', size);
        uint64_t t0 = now_ns();
        for (int sent = 0; sent < W1_MESSAGES; sent += W1_BATCH) {
            int count = W1_MESSAGES - sent < W1_BATCH ? W1_MESSAGES - sent : W1_BATCH;
            write_full(fd, batch, n * (size_t)count);
        }
        unsigned char query[4 + 1];
        put_frame(query, 'Q', 1);
        write_full(fd, query, sizeof query);
        unsigned char answer[8];
        read_full(fd, answer, 8);
        double seconds = (now_ns() - t0) / 1e9;
        uint64_t counted = 0;
        for (int i = 0; i < 8; i++) counted = (counted << 8) | answer[i];
        if (counted != W1_MESSAGES) {
            fprintf(stderr, "the server counted %llu frames, not %d\n", (unsigned long long)counted, W1_MESSAGES);
            return 1;
        }
        printf("RESULT W1 c msgs_per_s=%.0f seconds=%.3f frame_bytes=%zu (C loop: blocking sockets, no codec)\n",
               W1_MESSAGES / seconds, seconds, size);
        free(batch);
    } else {
        fprintf(stderr, "usage: roundtrip client PORT w1|w2 [SIZE]\n");
        return 2;
    }
    close(fd);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "server") == 0) return serve();
    if (argc >= 4 && strcmp(argv[1], "client") == 0) {
        size_t size = argc >= 5 ? (size_t)atol(argv[4]) : 100;
        if (size < 1 || size > MAX_SIZE) {
            fprintf(stderr, "SIZE: 1 to %d bytes\n", MAX_SIZE);
            return 2;
        }
        return client(atoi(argv[2]), argv[3], size);
    }
    fprintf(stderr, "usage: roundtrip server | roundtrip client PORT w1|w2 [SIZE]\n");
    return 2;
}

/* W3 baseline: plain blocking sockets moving 1 GiB over loopback as 1,024 length-prefixed
 * messages of 1 MiB (the same framing cost as a 4-byte length prefix, no envelope).
 *
 *   bulk server            prints "READY <port>", receives, replies with the byte count
 *   bulk client PORT       sends, waits for the reply, prints "RESULT W3 c mib_per_s=... seconds=..."
 *
 * Built by Benchmarks/run.sh with gcc -O2. Loopback (127.0.0.1) only.
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

/* W3's sizes; Benchmarks/curves.sh varies them (BENCH_W3_COUNT, BENCH_W3_SIZE, as the Swift
 * benchmarks read them). Messages under 64 KiB are written many to a write() and read 256 KiB at a
 * time, as a careful C program would move them; from 64 KiB on, one write and one read per message. */
static int MESSAGES = 1024;
static int MESSAGE_SIZE = 1 << 20;
#define BATCH_BYTES (256 * 1024)

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int server(void) {
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    if (ls < 0) die("socket");
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = 0};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(ls, (struct sockaddr *)&addr, sizeof addr) < 0) die("bind");
    if (listen(ls, 16) < 0) die("listen");
    socklen_t len = sizeof addr;
    getsockname(ls, (struct sockaddr *)&addr, &len);
    printf("READY %d\n", ntohs(addr.sin_port));
    fflush(stdout);
    int fd = accept(ls, NULL, NULL);
    if (fd < 0) die("accept");
    char *buf = malloc(MESSAGE_SIZE > BATCH_BYTES ? MESSAGE_SIZE : BATCH_BYTES);
    uint64_t total = 0;
    if (MESSAGE_SIZE < 65536) {
        /* Small messages: whole reads of up to 256 KiB, every complete frame in them counted. */
        size_t filled = 0;
        int counted = 0;
        while (counted < MESSAGES) {
            ssize_t r = read(fd, buf + filled, BATCH_BYTES - filled);
            if (r <= 0) die("read");
            filled += (size_t)r;
            size_t at = 0;
            long size;
            while ((size = next_frame((unsigned char *)buf, at, filled, (uint32_t)MESSAGE_SIZE)) >= 0) {
                total += (uint64_t)size;
                counted += 1;
                at += 4 + (size_t)size;
            }
            memmove(buf, buf + at, filled - at);
            filled -= at;
        }
    }
    for (int i = 0; MESSAGE_SIZE >= 65536 && i < MESSAGES; i++) {
        uint32_t prefix;
        read_full(fd, &prefix, 4);
        uint32_t size = ntohl(prefix);
        if (size > MESSAGE_SIZE) { fprintf(stderr, "bad size %u\n", size); return 1; }
        read_full(fd, buf, size);
        total += size;
    }
    uint64_t reply = total;
    write_full(fd, &reply, sizeof reply);
    close(fd);
    close(ls);
    free(buf);
    return 0;
}

static int client(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) die("socket");
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0) die("connect");
    char *buf = malloc(MESSAGE_SIZE);
    memset(buf, 0x5a, MESSAGE_SIZE);
    /* Small messages: as many whole frames as fit in 256 KiB, one write. */
    int per_batch = BATCH_BYTES / (4 + MESSAGE_SIZE);
    char *batch = malloc(BATCH_BYTES);
    for (int i = 0; i < per_batch; i++) {
        uint32_t prefix = htonl((uint32_t)MESSAGE_SIZE);
        memcpy(batch + (size_t)i * (4 + MESSAGE_SIZE), &prefix, 4);
        memset(batch + (size_t)i * (4 + MESSAGE_SIZE) + 4, 0x5a, (size_t)MESSAGE_SIZE);
    }
    double start = now();
    for (int sent = 0; MESSAGE_SIZE < 65536 && sent < MESSAGES; sent += per_batch) {
        int count = MESSAGES - sent < per_batch ? MESSAGES - sent : per_batch;
        write_full(fd, batch, (size_t)count * (4 + MESSAGE_SIZE));
    }
    for (int i = 0; MESSAGE_SIZE >= 65536 && i < MESSAGES; i++) {
        uint32_t prefix = htonl(MESSAGE_SIZE);
        write_full(fd, &prefix, 4);
        write_full(fd, buf, MESSAGE_SIZE);
    }
    uint64_t reply;
    read_full(fd, &reply, sizeof reply);
    double elapsed = now() - start;
    if (reply != (uint64_t)MESSAGES * MESSAGE_SIZE) { fprintf(stderr, "short: %llu\n", (unsigned long long)reply); return 1; }
    printf("RESULT W3 c mib_per_s=%.0f seconds=%.3f msgs_per_s=%.0f\n", (double)MESSAGES * MESSAGE_SIZE / (1 << 20) / elapsed,
           elapsed, MESSAGES / elapsed);
    close(fd);
    free(buf);
    free(batch);
    return 0;
}

int main(int argc, char **argv) {
    const char *count = getenv("BENCH_W3_COUNT"), *size = getenv("BENCH_W3_SIZE");
    if (count) MESSAGES = atoi(count);
    if (size) MESSAGE_SIZE = atoi(size);
    if (MESSAGES < 1 || MESSAGE_SIZE < 1 || MESSAGE_SIZE > (1 << 26)) {
        fprintf(stderr, "BENCH_W3_COUNT and BENCH_W3_SIZE: positive (the size at most 64 MiB)\n");
        return 2;
    }
    if (argc >= 2 && strcmp(argv[1], "server") == 0) return server();
    if (argc >= 3 && strcmp(argv[1], "client") == 0) return client(atoi(argv[2]));
    fprintf(stderr, "usage: bulk server | bulk client PORT\n");
    return 2;
}

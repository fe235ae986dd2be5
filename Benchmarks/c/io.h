/* What the C baselines share (c/bulk.c, c/roundtrip.c): whole reads and writes on blocking
 * sockets, failing loudly. Included, not compiled alone. */
#ifndef BENCH_IO_H
#define BENCH_IO_H
#include <arpa/inet.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void die(const char *what) {
    perror(what);
    exit(1);
}

static void read_full(int fd, void *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)buf + got, n - got);
        if (r <= 0) die("read");
        got += (size_t)r;
    }
}

static void write_full(int fd, const void *buf, size_t n) {
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(fd, (const char *)buf + done, n - done);
        if (w <= 0) die("write");
        done += (size_t)w;
    }
}

/* The length of the whole frame (a 4-byte big-endian length, then that many bytes) at buf + at in
 * the `filled` bytes read, or -1 when it is not all there yet; exits on a length of 0 or over max. */
static long next_frame(const unsigned char *buf, size_t at, size_t filled, uint32_t max) {
    if (filled - at < 4) return -1;
    uint32_t size;
    memcpy(&size, buf + at, 4);
    size = ntohl(size);
    if (size == 0 || size > max) {
        fprintf(stderr, "bad frame length %u\n", size);
        exit(1);
    }
    return filled - at < 4 + (size_t)size ? -1 : (long)size;
}
#endif

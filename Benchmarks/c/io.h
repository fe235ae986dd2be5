/* What the C baselines share (c/bulk.c, c/roundtrip.c): whole reads and writes on blocking
 * sockets, failing loudly. Included, not compiled alone. */
#ifndef BENCH_IO_H
#define BENCH_IO_H
#include <stdio.h>
#include <stdlib.h>
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
#endif

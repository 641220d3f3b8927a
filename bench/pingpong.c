/* Load generator for the egress latency benchmark.
 *   pingpong serve PORT              echo server on 127.0.0.1 (one connection at a time)
 *   pingpong rtt IP PORT N           one connection, N round trips of 64 bytes
 *   pingpong connect IP PORT N       N x (connect, one round trip, close)
 * Prints the median and p99 in microseconds. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }
static int full(int fd, char *b, int n, int rd) {
    for (int o = 0; o < n;) { int r = rd ? read(fd, b + o, n - o) : write(fd, b + o, n - o); if (r <= 0) return -1; o += r; }
    return 0;
}
static int dial(const char *ip, int port) {
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, ip, &a.sin_addr);
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(s, (struct sockaddr *)&a, sizeof a)) { perror("connect"); exit(1); }
    return s;
}
int main(int argc, char **argv) {
    char buf[64] = {0};
    if (argc >= 3 && !strcmp(argv[1], "serve")) {
        int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2])), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 64)) { perror("listen"); return 1; }
        for (;;) {
            int c = accept(l, NULL, NULL);
            setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            while (full(c, buf, 64, 1) == 0 && full(c, buf, 64, 0) == 0) {}
            close(c);
        }
    }
    if (argc < 5) { fprintf(stderr, "usage: pingpong serve PORT | rtt IP PORT N | connect IP PORT N\n"); return 2; }
    int n = atoi(argv[4]), port = atoi(argv[3]), each = !strcmp(argv[1], "connect");
    double *t = malloc(sizeof(double) * n);
    int s = each ? -1 : dial(argv[2], port);
    for (int i = 0; i < n; i++) {
        double a = now_us();
        if (each) s = dial(argv[2], port);
        if (full(s, buf, 64, 0) || full(s, buf, 64, 1)) { fprintf(stderr, "round trip failed\n"); return 1; }
        t[i] = now_us() - a;
        if (each) close(s);
    }
    qsort(t, n, sizeof(double), cmp);
    printf("median %.1f us p99 %.1f us\n", t[n / 2], t[n * 99 / 100]);
    return 0;
}

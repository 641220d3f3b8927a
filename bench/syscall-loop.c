/* Load generator for the per-syscall benchmark: N calls of one class, prints ns per call.
 * Classes: low (read(-1): nr 0, allowed), high (close_range of an unused fd: nr 436, allowed),
 * arg (ioctl TCGETS on /dev/null: argument-filtered, allowed; the kernel answers ENOTTY),
 * denied (ioprio_get: not on the allowlist). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: %s low|high|arg|denied N\n", argv[0]); return 2; }
    long n = atol(argv[2]), i;
    int cls = !strcmp(argv[1], "low") ? 0 : !strcmp(argv[1], "high") ? 1 : !strcmp(argv[1], "arg") ? 2 : 3;
    int fd = open("/dev/null", O_RDONLY);
    struct termios t;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (i = 0; i < n; i++) {
        switch (cls) {
        case 0: syscall(SYS_read, -1, NULL, 0); break;
        case 1: syscall(SYS_close_range, 4000, 4000, 0); break;
        case 2: syscall(SYS_ioctl, fd, TCGETS, &t); break;
        default: syscall(SYS_ioprio_get, 1, 0); break;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.1f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n);
    return 0;
}

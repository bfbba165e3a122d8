// SPDX-License-Identifier: Apache-2.0
// Kernel-heavy workload: most of its CPU time is spent in system calls (getppid and 4 KiB writes to /dev/null).
// Call chain: main -> run_syscalls -> do_syscalls -> (kernel). Usage: syscall_heavy [SECONDS] (default 5).
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static char buffer[4096];

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) unsigned long do_syscalls(int fd) {
    unsigned long calls = 0;
    for (int i = 0; i < 256; i++) {
        calls += syscall(SYS_getppid) > 0;
        calls += write(fd, buffer, sizeof buffer) > 0;
    }
    return calls;
}

__attribute__((noinline)) unsigned long run_syscalls(double seconds) {
    int fd = open("/dev/null", O_WRONLY);
    if (fd < 0) {
        perror("open /dev/null");
        exit(1);
    }
    unsigned long calls = 0;
    double end = now_s() + seconds;
    while (now_s() < end)
        calls += do_syscalls(fd);
    close(fd);
    return calls;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 5.0;
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    printf("done %lu\n", run_syscalls(seconds));
    return 0;
}

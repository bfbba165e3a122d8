// SPDX-License-Identifier: Apache-2.0
// A process that spins for a short time and exits (default 200 ms), to test that short-lived processes are
// symbolized. Call chain: main -> short_work -> short_spin. Usage: short_lived [MILLISECONDS].
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long sink;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) void short_spin(void) {
    unsigned long x = sink;
    for (int i = 0; i < 10000; i++) {
        x = x * 6364136223846793005UL + 1;
        __asm__ volatile("" : "+r"(x));
    }
    sink = x;
}

__attribute__((noinline)) unsigned long short_work(double seconds) {
    unsigned long rounds = 0;
    double end = now_s() + seconds;
    while (now_s() < end) {
        short_spin();
        rounds++;
    }
    return rounds;
}

int main(int argc, char **argv) {
    double millis = argc > 1 ? atof(argv[1]) : 200.0;
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    printf("done %lu\n", short_work(millis / 1000.0));
    return 0;
}

// SPDX-License-Identifier: Apache-2.0
// CPU workload with a known profile: busy_loop calls leaf_heavy three times for each call of leaf_light, and
// both leaves do the same amount of work per call, so leaf_heavy : leaf_light = 3 : 1 of the CPU time.
// Call chain: main -> run -> busy_loop -> {leaf_heavy, leaf_light}. Usage: cpu_3to1 [SECONDS] (default 5).
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define CHUNK 20000

static volatile unsigned long sink;

__attribute__((noinline)) void leaf_heavy(void) {
    unsigned long x = sink;
    for (int i = 0; i < CHUNK; i++) {
        x = x * 6364136223846793005UL + 1442695040888963407UL;
        __asm__ volatile("" : "+r"(x));
    }
    sink = x;
}

__attribute__((noinline)) void leaf_light(void) {
    unsigned long x = sink;
    for (int i = 0; i < CHUNK; i++) {
        x = x * 2862933555777941757UL + 3037000493UL;
        __asm__ volatile("" : "+r"(x));
    }
    sink = x;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) unsigned long busy_loop(double seconds) {
    unsigned long rounds = 0;
    double end = now_s() + seconds;
    while (now_s() < end) {
        for (int r = 0; r < 16; r++) {
            leaf_heavy();
            leaf_heavy();
            leaf_heavy();
            leaf_light();
        }
        rounds += 16;
    }
    return rounds;
}

__attribute__((noinline)) unsigned long run(double seconds) {
    return busy_loop(seconds);
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 5.0;
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    unsigned long rounds = run(seconds);
    printf("done %lu\n", rounds);
    return 0;
}

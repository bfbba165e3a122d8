// SPDX-License-Identifier: Apache-2.0
// exec_after MILLISECONDS PROGRAM [ARGS...]: spins in spin_before_exec for MILLISECONDS, then execs PROGRAM with
// ARGS under the same pid, as a wrapper does; for telling apart the samples of the two programs one pid runs.
// Call chain before the exec: main -> spin_before_exec -> exec_after_leaf.
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

__attribute__((noinline)) void exec_after_leaf(void) {
    unsigned long x = sink;
    for (int i = 0; i < 10000; i++) {
        x = x * 6364136223846793005UL + 7;
        __asm__ volatile("" : "+r"(x));
    }
    sink = x;
}

__attribute__((noinline)) unsigned long spin_before_exec(double seconds) {
    unsigned long rounds = 0;
    double end = now_s() + seconds;
    while (now_s() < end) {
        exec_after_leaf();
        rounds++;
    }
    return rounds;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: exec_after MILLISECONDS PROGRAM [ARGS...]\n");
        return 2;
    }
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    spin_before_exec(atof(argv[1]) / 1000.0);
    execv(argv[2], argv + 2);
    perror("execv");
    return 1;
}

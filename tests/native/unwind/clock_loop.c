// SPDX-License-Identifier: Apache-2.0
// The example: hot_three spins in clock_gettime(CLOCK_PROCESS_CPUTIME_ID) (a real syscall, through the
// vDSO's fallback and glibc's wrapper, neither with a frame pointer) under run_loop; built without frame pointers.
// Call chain: main -> run_loop -> hot_three -> clock_gettime. Usage: clock_loop [SECONDS] (default 5).
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static volatile long sink;

__attribute__((noinline)) long hot_three(int calls) {
    struct timespec ts;
    long total = 0;
    for (int i = 0; i < calls; i++) {
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
        total += ts.tv_nsec;
    }
    return total;
}

__attribute__((noinline)) void run_loop(double seconds) {
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    do {
        sink += hot_three(1000);
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 5.0;
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    run_loop(seconds);
    printf("done\n");
    return 0;
}

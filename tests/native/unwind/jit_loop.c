// SPDX-License-Identifier: Apache-2.0
// Code that no file backs, as a JIT writes it: a countdown loop copied into an anonymous executable page and called
// from run_jit. Its pc is in no registered mapping, so the walker stops there and counts why (unwind_no_mapping).
// Usage: jit_loop [SECONDS] (default 5).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

typedef void (*countdown_fn)(unsigned long);

__attribute__((noinline)) void run_jit(countdown_fn countdown, double seconds) {
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    do {
        countdown(10000000UL);
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 5.0;
    static const unsigned char code[] = {0x48, 0xff, 0xcf, 0x75, 0xfb, 0xc3}; /* 1: dec %rdi; jnz 1b; ret */
    void *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED)
        return 1;
    memcpy(page, code, sizeof(code));
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    run_jit((countdown_fn)page, seconds);
    printf("done\n");
    return 0;
}

// SPDX-License-Identifier: Apache-2.0
// Calls otel_test_target() of libuprobe_target.so exactly COUNT times and fires the USDT probe otel_test:tick
// (guarded by a semaphore) before each call. Usage: uprobe_caller COUNT [DELAY_MS].
// Prints "ready PID", waits DELAY_MS (default 0, so a test can attach first), calls, prints "done COUNT".
#define _SDT_HAS_SEMAPHORES 1
#include <sys/sdt.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int otel_test_target(int value);

__extension__ unsigned short otel_test_tick_semaphore __attribute__((unused)) __attribute__((section(".probes")));

__attribute__((noinline)) int call_target(int i) {
    return otel_test_target(i);
}

int main(int argc, char **argv) {
    long count = argc > 1 ? atol(argv[1]) : 100;
    long delay_ms = argc > 2 ? atol(argv[2]) : 0;
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    if (delay_ms > 0)
        usleep(delay_ms * 1000);
    for (long i = 0; i < count; i++) {
        if (otel_test_tick_semaphore)
            DTRACE_PROBE1(otel_test, tick, i);
        call_target((int)i);
    }
    printf("done %ld\n", count);
    return 0;
}

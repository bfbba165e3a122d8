// SPDX-License-Identifier: Apache-2.0
// Calls otel_test_target() of libuprobe_target.so exactly COUNT times. Usage: uprobe_caller COUNT [DELAY_MS].
// Prints "ready PID", waits DELAY_MS (default 0, so a test can attach first), calls, prints "done COUNT".
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int otel_test_target(int value);

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
    for (long i = 0; i < count; i++)
        call_target((int)i);
    printf("done %ld\n", count);
    return 0;
}

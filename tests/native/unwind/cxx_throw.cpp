// SPDX-License-Identifier: Apache-2.0
// C++ without frame pointers: thrower() throws, catcher() catches, in a loop, so most samples land inside the
// C++ runtime's own unwinder (libstdc++, libgcc_s) and must keep catcher -> work -> main above them. square() is
// always inlined into work(), so work's frame holds inlined code. Usage: cxx_throw [SECONDS] (default 5).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <unistd.h>

static volatile long sink;

__attribute__((noinline)) void thrower(int value) {
    if (value >= 0)
        throw std::runtime_error("thrown");
}

__attribute__((noinline)) long catcher(int value) {
    try {
        thrower(value);
    } catch (const std::runtime_error &) {
        return 1;
    }
    return 0;
}

static inline __attribute__((always_inline)) long square(long x) { return x * x; }

__attribute__((noinline)) long work(double seconds) {
    auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    long caught = 0;
    while (std::chrono::steady_clock::now() < end) {
        for (int i = 0; i < 100; i++)
            caught += catcher(i) + square(sink);
    }
    return caught;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? std::atof(argv[1]) : 5.0;
    std::printf("ready %d\n", (int)getpid());
    std::fflush(stdout);
    long caught = work(seconds);
    std::printf("done %ld\n", caught);
    return 0;
}

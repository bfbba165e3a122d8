// SPDX-License-Identifier: Apache-2.0
// Busy work for the ctypes case of tests/cpu/py_chain.py: spin_work(n) costs n iterations, in a callee of its own.
#include <stdint.h>

__attribute__((noinline)) static uint64_t spin_inner(uint64_t n) {
    volatile uint64_t total = 0;
    for (uint64_t i = 0; i < n; i++)
        total += i * i;
    return total;
}

__attribute__((noinline)) uint64_t spin_work(uint64_t n) {
    return spin_inner(n) + 1;
}

// SPDX-License-Identifier: Apache-2.0
// Busy work for the ctypes cases of tests/cpu/py_chain.py: spin_work(n) costs n iterations, in a callee of its own;
// call_back(fn, n) calls a Python function (a ctypes CFUNCTYPE) from C, so the Python stack is split by native code.
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

__attribute__((noinline)) uint64_t call_back(uint64_t (*fn)(uint64_t), uint64_t n) {
    return fn(n) + 1; /* not a tail call (-fno-optimize-sibling-calls): call_back stays on the stack */
}

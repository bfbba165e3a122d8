// SPDX-License-Identifier: Apache-2.0
// libuprobe_target.so: one exported function for uprobe tests.
volatile int otel_test_sink;

__attribute__((noinline, visibility("default"))) int otel_test_target(int value) {
    otel_test_sink += value;
    return otel_test_sink;
}

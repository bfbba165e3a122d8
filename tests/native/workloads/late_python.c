// SPDX-License-Identifier: Apache-2.0
// late_python LIBPYTHON SCRIPT [ARGS...]: a program that embeds CPython the way a plugin host does: it spins for
// ~300 ms with no libpython mapped (so a profiler's first look at it finds no interpreter), then dlopen()s
// LIBPYTHON and runs SCRIPT as __main__ with sys.argv = [SCRIPT, ARGS...]. Set PYTHONHOME to LIBPYTHON's prefix.
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) static unsigned long spin_before_python(double seconds) {
    volatile unsigned long total = 0;
    double end = now_s() + seconds;
    while (now_s() < end)
        for (int i = 0; i < 100000; i++)
            total += (unsigned long)i * i;
    return total;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s LIBPYTHON SCRIPT [ARGS...]\n", argv[0]);
        return 2;
    }
    spin_before_python(0.3);
    void *python = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
    if (!python) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    void (*initialize)(void) = (void (*)(void))dlsym(python, "Py_Initialize");
    int (*run)(const char *) = (int (*)(const char *))dlsym(python, "PyRun_SimpleString");
    int (*run_file)(FILE *, const char *, int, void *) =
        (int (*)(FILE *, const char *, int, void *))dlsym(python, "PyRun_SimpleFileExFlags");
    FILE *script = fopen(argv[2], "r");
    if (!initialize || !run || !run_file || !script)
        return 1;
    initialize();
    // sys.argv from our arguments (each passed hex-encoded: no quoting to get wrong)
    char code[8192] = "import sys\nsys.argv = [a.decode() for a in [";
    for (int i = 2; i < argc; i++) {
        size_t used = strlen(code);
        snprintf(code + used, sizeof(code) - used, "bytes.fromhex('");
        for (const char *c = argv[i]; *c; c++) {
            used = strlen(code);
            snprintf(code + used, sizeof(code) - used, "%02x", (unsigned char)*c);
        }
        used = strlen(code);
        snprintf(code + used, sizeof(code) - used, "'),");
    }
    size_t used = strlen(code);
    snprintf(code + used, sizeof(code) - used, "]]\n");
    if (run(code) != 0)
        return 1;
    return run_file(script, argv[2], 1, NULL) == 0 ? 0 : 1;  // the script is __main__ itself
}

# SPDX-License-Identifier: Apache-2.0
"""A Python workload with a known call chain and a 3:1 split of work by iteration counts, for any CPython 3.10+.

    python py_chain.py MODE ROUNDS UNIT [warm]  MODE: one | two (two threads) | ctypes (the work in libpyspin.so)
                                            | crowd (one, behind 100 idle Python threads created after main's)
                                            | deep (one, from DEEP frames of recursion: main -> recurse -> ...
                                              -> recurse -> run_rounds)
                                            | callback (main -> outer -> C call_back -> inner -> loop; a
                                              first round, "warm", then it waits for a second line)
                                            | cuda (main -> gpu_rounds -> Launcher.after -> loop, then a kernel
                                              launch on the fake driver, tests/native/cuda, GIL released)
                                            | cuda-callback (main -> outer_launch -> C call_back -> inner_launch
                                              -> a kernel launch on the fake driver)

Prints "ready PID" and waits for a line; with `warm`, then spins in warm-up until a second line (so a profiler can
register the process before the measured work); works, prints "done" and waits again (so the profiler can read the
code objects before the process exits).

main -> run_rounds -> step -> heavy (3 x UNIT iterations) / light (UNIT iterations); heavy and light run the same
loop, so their CPU time is 3:1.
"""

import ctypes
import os
import sys
import threading

SPIN = None
C_SCALE = 200  # a C loop iteration costs far less than a Python one: the ctypes case runs about as long


def loop(n):
    total = 0
    for i in range(n):
        total += i * i
    return total


def heavy(n):
    return SPIN.spin_work(3 * n * C_SCALE) if SPIN else loop(3 * n)  # LINE heavy


def light(n):
    return SPIN.spin_work(n * C_SCALE) if SPIN else loop(n)  # LINE light


class Steps:
    def step(self, unit):
        heavy(unit)  # LINE step-heavy
        light(unit)  # LINE step-light


def inner(n):  # called back from C (libpyspin.so's call_back)
    return loop(n)  # LINE inner


def outer(rounds, unit):
    callback = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_uint64)(inner)
    for _ in range(rounds):
        SPIN.call_back(callback, 3 * unit)  # LINE outer


DRIVER = None  # tests/native/cuda/workload.py's Driver on the fake libcuda (cuda mode)


class Launcher:
    def after(self, n):
        loop(n)  # LINE after-loop
        DRIVER.launch(DRIVER.matmul)  # LINE after-launch


def inner_launch(n):  # called back from C, launches a kernel
    loop(n)
    DRIVER.launch(DRIVER.matmul)  # LINE inner-launch
    return n


def outer_launch(rounds, unit):
    callback = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_uint64)(inner_launch)
    for _ in range(rounds):
        SPIN.call_back(callback, unit)  # LINE outer-launch


def gpu_rounds(rounds, unit):
    launcher = Launcher()
    for _ in range(rounds):
        launcher.after(unit)  # LINE gpu_rounds
        DRIVER.call("cuStreamSynchronize", DRIVER.stream)


def run_rounds(rounds, unit):
    steps = Steps()
    for _ in range(rounds):
        steps.step(unit)  # LINE run_rounds


DEEP = 300  # recurse frames under run_rounds: more than the BPF walker reads (OTEL_GPU_MAX_PYTHON_DEPTH)


def recurse(depth, rounds, unit):
    if depth == 0:
        return run_rounds(rounds, unit)
    return recurse(depth - 1, rounds, unit)


def _warm_until_told():
    told = threading.Event()
    threading.Thread(target=_warm_until_line, args=(told,), daemon=True).start()
    while not told.is_set():
        loop(10_000)


def _warm_until_line(told):
    sys.stdin.readline()
    told.set()


def main():
    global SPIN, DRIVER
    mode, rounds, unit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if mode in ("ctypes", "callback", "cuda-callback"):
        SPIN = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "native", "pyspin",
                                        "libpyspin.so"))
        SPIN.spin_work.argtypes = [ctypes.c_uint64]
        SPIN.spin_work.restype = ctypes.c_uint64
        SPIN.call_back.argtypes = [ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_uint64), ctypes.c_uint64]
        SPIN.call_back.restype = ctypes.c_uint64
    if mode in ("cuda", "cuda-callback"):
        fakes = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "native", "cuda")
        sys.path.insert(0, fakes)
        from workload import Driver

        # released as PyTorch does; 3.10's frames the injected library reads only through the C API, with the GIL
        DRIVER = Driver(os.path.join(fakes, "libcuda.so.1"), release_gil=sys.version_info >= (3, 11))
        DRIVER.setup()
    idle = threading.Event()
    if mode == "crowd":  # newer thread states come first in the interpreter's list: main's is the 101st
        for _ in range(100):
            threading.Thread(target=idle.wait, daemon=True).start()
    print("ready", os.getpid(), flush=True)
    sys.stdin.readline()
    if sys.argv[4:] == ["warm"]:  # spins until a second line: the profiler sees the process and registers it first
        _warm_until_told()
    if mode == "two":
        threads = [threading.Thread(target=run_rounds, args=(rounds, unit)) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    elif mode == "cuda":
        gpu_rounds(rounds, unit)  # LINE main-gpu
    elif mode == "cuda-callback":
        outer_launch(rounds, unit)  # LINE main-outer-launch
    elif mode == "deep":
        recurse(DEEP, rounds, unit)
    elif mode == "callback":  # a first round gets the process sampled (and its unwind tables built), then more
        outer(1, unit)
        print("warm", flush=True)
        sys.stdin.readline()
        outer(rounds, unit)  # LINE main-outer
    else:
        run_rounds(rounds, unit)  # LINE main
    print("done", flush=True)
    sys.stdin.readline()


if __name__ == "__main__":
    main()

# SPDX-License-Identifier: Apache-2.0
"""The agent's cost line reads this process's real /proc/self: a busy thread shows under its own name, start-up is
set apart, and the line names what an operator compares with issue 12's targets."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from otel_gpu import selfcost


def _spin(cpu_s: float) -> None:
    until = time.thread_time() + cpu_s
    while time.thread_time() < until:
        pass


def test_start_up_is_set_apart_from_what_follows() -> None:
    meter = selfcost.CostMeter(time.monotonic())
    _spin(0.3)  # start-up's work: in the start-up CPU, not in the main thread's CPU since start-up
    meter.running()
    assert meter.startup_cpu_s >= 0.3
    line = meter.summary()
    assert "start-up" in line and "% of one core" in line and "peak RSS" in line
    since = line.split("since start-up: ", 1)[1]
    main = next((float(part.split()[1]) for part in since.split(", ") if part.startswith("main ")), 0.0)
    assert main < 0.3, line
    assert selfcost.peak_rss_mb() > 1


def test_each_live_thread_is_named() -> None:
    finished = threading.Event()
    worker = threading.Thread(target=lambda: (_spin(0.2), finished.wait()), name="cost-test-worker")
    worker.start()
    try:
        time.sleep(0)
        deadline = time.monotonic() + 30
        while selfcost.thread_cpu_s().get("cost-test-worker", 0.0) < 0.15 and time.monotonic() < deadline:
            time.sleep(0.05)
        meter = selfcost.CostMeter(time.monotonic())
        meter.running_threads = {}
        assert "cost-test-worker 0." in meter.summary()
        assert selfcost.thread_cpu_s()["cost-test-worker"] >= 0.15
    finally:
        finished.set()
        worker.join()


def test_a_thread_that_ends_while_stopping_still_shows() -> None:
    """The cost line is written after the shutdown, which ends the exporters' threads: their CPU, read as stopping
    began, stays in it."""
    meter = selfcost.CostMeter(time.monotonic())
    meter.running()
    release = threading.Event()

    def work_then_wait() -> None:
        _spin(0.1)
        release.wait(30)  # ends only once stopping began (a loaded machine must not end it before)

    worker = threading.Thread(target=work_then_wait, name="cost-test-ending")
    worker.start()
    deadline = time.monotonic() + 30
    while selfcost.thread_cpu_s().get("cost-test-ending", 0.0) < 0.1 and time.monotonic() < deadline:
        time.sleep(0.02)
    meter.stopping()
    release.set()
    worker.join()
    assert "cost-test-ending" not in selfcost.thread_cpu_s()
    assert "cost-test-ending 0." in meter.summary()


def test_threads_carry_their_names_into_the_kernel() -> None:
    """``top -H`` and py-spy show which part of the agent runs: each thread's kernel name is its Python name less the
    shared prefix, cut to the kernel's 15 bytes."""
    release = threading.Event()
    workers = [threading.Thread(target=release.wait, name=name, daemon=True)
               for name in ("otel-gpu-gpu-time", "otel-gpu-metrics-file-exporter")]
    for worker in workers:
        worker.start()
    try:
        selfcost.name_native_threads()
        comms = [open(f"/proc/self/task/{w.native_id}/comm").read().strip() for w in workers]
        assert comms == ["gpu-time", "metrics-file-ex"]
        assert selfcost.native_name("MainThread") == "MainThread"
    finally:
        release.set()


_FREED_HEAP = """
import ctypes, re, sys
from otel_gpu import selfcost

def anonymous_kb() -> int:
    with open("/proc/self/smaps_rollup") as rollup:
        return int(re.search(r"Anonymous:\\s+(\\d+)", rollup.read()).group(1))

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
chunks = [libc.malloc(16384) for _ in range(4096)]  # 64 MiB in chunks below the mmap threshold: on the heap
for chunk in chunks:
    ctypes.memset(chunk, 1, 16384)
for chunk in chunks[:-1]:  # the last one stays: the freed pages lie below the heap's top, free() keeps them
    libc.free(chunk)
before = anonymous_kb()
selfcost.trim_heap()
print(before, anonymous_kb())
"""


def test_trim_heap_gives_freed_heap_pages_back() -> None:
    """Pages freed below the heap's top stay resident until trimmed; the agent trims after start-up and each report."""
    done = subprocess.run([sys.executable, "-c", _FREED_HEAP], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parents[1])
    before_kb, after_kb = map(int, done.stdout.split())
    assert before_kb - after_kb > 48 << 10  # most of the 64 MiB freed


_LARGE_BLOCKS = """
import ctypes, re, sys
from otel_gpu import selfcost

def anonymous_kb() -> int:
    with open("/proc/self/smaps_rollup") as rollup:
        return int(re.search(r"Anonymous:\\s+(\\d+)", rollup.read()).group(1))

tuned = sys.argv[1] == "tuned" and selfcost.tune_heap({})
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
big = libc.malloc(16 << 20)  # one large buffer (a report's encoding, a symbol table read): mmapped, then freed
ctypes.memset(big, 1, 16 << 20)
libc.free(big)
before = anonymous_kb()
blocks = [libc.malloc(1 << 20) for _ in range(24)]  # later 1 MiB buffers, all freed again
for block in blocks:
    ctypes.memset(block, 1, 1 << 20)
for block in blocks:
    libc.free(block)
print(int(tuned), anonymous_kb() - before)
"""


def test_large_buffers_freed_go_back_to_the_kernel_once_the_heap_is_tuned() -> None:
    """glibc raises its mmap threshold to the largest block freed: without the agent's tuning, 24 MiB of 1 MiB
    buffers freed after a 16 MiB one stay resident; with it, they are unmapped."""
    kept = {}
    for mode in ("default", "tuned"):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES"))}
        done = subprocess.run([sys.executable, "-c", _LARGE_BLOCKS, mode], capture_output=True, text=True,
                              check=True, cwd=Path(__file__).resolve().parents[1], env=env)
        tuned, kept[mode] = map(int, done.stdout.split())
        assert tuned == (mode == "tuned")
    assert kept["default"] > 16 << 10
    assert kept["tuned"] < 4 << 10


def test_the_heap_is_left_alone_when_the_environment_tunes_it() -> None:
    assert not selfcost.tune_heap({"MALLOC_MMAP_THRESHOLD_": "65536"})
    assert not selfcost.tune_heap({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"})

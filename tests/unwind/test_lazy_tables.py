# SPDX-License-Identifier: Apache-2.0
"""Lazy unwind tables, on the real kernel: files get tables only once samples hit them (files mapped but never hit
get none), walks still come whole once the hit files have theirs, and a library loaded after the process was
registered (as torch loads its own) is found by reading the maps again when a walk meets its code; a frame-pointer
step through code without a table and without frame pointers stops, counted, instead of reporting a garbage caller."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from otel_gpu import selfmetrics, semconv
from otel_gpu.cpu.sampler import CPUSampler, StackCount
from otel_gpu.unwind.processes import _Extents, executable_mappings
from tests.conftest import NATIVE
from tests.unwind.test_native_stacks import _registered, _warm

pytestmark = [pytest.mark.root, pytest.mark.usefixtures("other_agent")]

LLVM = Path("/usr/lib/x86_64-linux-gnu/libLLVM-15.so.1")
PYTHON = Path("/usr/bin/python3")
LATE_LOAD = """
import ctypes, os, select, sys, time
print("ready", os.getpid(), flush=True)
while not select.select([sys.stdin], [], [], 0)[0]:  # sampled (and registered) before the library is loaded
    sum(i * i for i in range(1000))
llvm = ctypes.CDLL(sys.argv[1])
llvm.LLVMContextCreate.restype = ctypes.c_void_p
llvm.LLVMContextDispose.argtypes = [ctypes.c_void_p]
print("loaded", flush=True)
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    llvm.LLVMContextDispose(llvm.LLVMContextCreate())
"""


def _sample(sampler: CPUSampler, samples: int, timeout_s: float = 60) -> list[StackCount]:
    counts: list[StackCount] = []
    deadline = time.monotonic() + timeout_s
    while sum(c.count for c in counts) < samples and time.monotonic() < deadline:
        time.sleep(0.5)
        counts += sampler.drain()
    return counts


def test_row_ranges_are_reused_and_merged() -> None:
    extents = _Extents(100)
    assert [extents.take(40), extents.take(40), extents.take(40)] == [0, 40, None]
    extents.give(0, 40)
    assert extents.take(30) == 0  # first fit
    extents.give(0, 30)
    extents.give(40, 40)  # merges with both neighbours: one range of all 100 rows
    assert extents.take(100) == 0


def test_only_hit_files_get_tables_and_the_chain_stays_whole() -> None:
    """Every file lazy (no size is built at registration): the program and libc are hit and built in turn, the
    dynamic loader's code is mapped but not run, so it gets no table; after that the chain is whole."""
    process = subprocess.Popen([str(NATIVE / "unwind" / "cpu_3to1_nofp"), "60"], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    pid = int(process.stdout.readline().split()[1])
    sampler = CPUSampler(199, pids=[pid], unwind_eager_frame_bytes=-1)
    sampler.open()
    try:
        _registered(sampler)
        _warm(sampler, 90)
        sampler.drain()
        counts = _sample(sampler, 200)
        stats = sampler.stats()
    finally:
        sampler.close()
        process.kill()
        process.wait()
    samples = sum(c.count for c in counts)
    assert 2 <= stats["unwind_files"] < stats["unwind_files_known"], stats
    deep = sum(c.count for c in counts if len(c.user_stack) >= 5)  # leaf, busy_loop, run, main, libc's start
    assert samples > 100 and deep > 0.9 * samples, (samples, deep)


def test_a_library_loaded_later_is_found_and_walked_through() -> None:
    """Python loads libLLVM-15 (C++ without frame pointers, 5 MiB of .eh_frame) after the process was registered:
    the first walks into it stop at an unmapped pc and ask for the maps again; then its table is built because
    samples hit it, and the walks go from LLVM's frames through ctypes back into the interpreter."""
    if not LLVM.exists() or not PYTHON.exists():
        pytest.fail(f"{LLVM} and {PYTHON} are needed (clang's dependencies: scripts/install-system.sh)")
    process = subprocess.Popen([str(PYTHON), "-c", LATE_LOAD, str(LLVM), "60"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdin is not None
    pid = int(process.stdout.readline().split()[1])
    sampler = CPUSampler(199, pids=[pid], unwind_max_frame_bytes=6 << 20)  # libLLVM's 5 MiB: over the default cap
    sampler.open()
    try:
        _registered(sampler)
        assert sampler.settle_unwinder(60)
        process.stdin.write("go\n")
        process.stdin.flush()
        assert process.stdout.readline().strip() == "loaded"
        _warm(sampler, 90)
        sampler.drain()
        counts = _sample(sampler, 200)
        stats = sampler.stats()
        mappings = executable_mappings(pid)
    finally:
        sampler.close()
        process.kill()
        process.wait()
    assert stats["unwind_remaps"] >= 1, stats

    def file_of(pc: int) -> str:
        return next((m.path for m in mappings if m.start <= pc < m.end), "")

    in_llvm = [c for c in counts if any(file_of(pc) == str(LLVM) for pc in c.user_stack[:3])]
    through = sum(c.count for c in in_llvm if any(file_of(pc).startswith("/usr/bin/python3")
                                                 for pc in c.user_stack))
    total = sum(c.count for c in in_llvm)
    assert total > 50 and through > 0.8 * total, (total, through)


def test_a_frame_pointer_step_without_frame_pointers_stops_as_bad_fp() -> None:
    """No table at all (every file over the cap): in a program built without frame pointers, the step by rbp from
    the leaf gives no caller any file holds. Counted as unwind_bad_fp (a self-metric), never as an unmapped pc (which
    would ask for the maps again) and never a frame past the leaf."""
    selfmetrics.reset()
    process = subprocess.Popen([str(NATIVE / "unwind" / "cpu_3to1_nofp"), "60"], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    pid = int(process.stdout.readline().split()[1])
    sampler = CPUSampler(199, pids=[pid], unwind_max_frame_bytes=1, unwind_eager_frame_bytes=-1)
    sampler.open()
    try:
        _registered(sampler)
        assert sampler.settle_unwinder(60)
        sampler.drain()  # the samples taken before the process was registered (bpf_get_stackid's own walk)
        counts = _sample(sampler, 200)
        stats = sampler.stats()
    finally:
        sampler.close()
        process.kill()
        process.wait()
    walked = stats["unwind_samples"]
    assert walked > 100 and stats["unwind_bad_fp"] > 0.9 * walked, stats
    assert stats["unwind_no_mapping"] + stats["unwind_read_failed"] < 0.05 * walked and stats["unwind_remaps"] == 0
    # a leftover rbp can, by chance, step to an address inside a mapped file (1 of 200 samples in a clean-clone run,
    # both in libc), which the walker cannot tell from a caller; never more than that
    longer = sum(c.count for c in counts if len(c.user_stack) > 1)
    assert longer <= 0.03 * sum(c.count for c in counts), [c.user_stack for c in counts if len(c.user_stack) > 1]
    reported = selfmetrics.total(semconv.SELF_ERRORS.name, otel_gpu__source=semconv.Source.CPU_PROFILER,
                                 otel_gpu__reason=semconv.Reason.UNWIND_BAD_FP)
    assert reported == stats["unwind_bad_fp"]


def test_a_table_without_room_is_not_parsed_again_until_room_could_be_made() -> None:
    """A hit file whose table has no room (the others in use) is tried again with a growing back-off, and its frame
    section is parsed again only once room could be made for the rows its first parse counted (on the H200, parsing
    CUDA's libraries again every 10 s for no room kept the unwinder at 1 % of a core)."""
    process = subprocess.Popen([str(NATIVE / "unwind" / "cpu_3to1_nofp"), "60"], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    pid = int(process.stdout.readline().split()[1])
    sampler = CPUSampler(99, pids=[pid])
    sampler.open()
    try:
        _registered(sampler)
        _warm(sampler)
        unwinder = sampler._unwinder
        assert unwinder is not None
        with unwinder._lock:
            file = max((f for f in unwinder._files.values() if f.row_count), key=lambda f: f.row_count)
            rows = file.row_count
            unwinder._unload(file)
            file.state = 0  # pending again, as after an eviction
            taken = unwinder._extents.free_rows()
            first = unwinder._extents.take(taken)  # every free row in use; the other tables are hot
            for other in unwinder._files.values():
                other.last_hit = time.monotonic()
        parses = unwinder.stats.parses
        unwinder._build(file)
        retry_at, retry_s = file.retry_at, file.retry_s
        unwinder._build(file)
        assert unwinder.stats.parses == parses, "parsed again although no room could be made"
        assert file.state == 0 and retry_at > time.monotonic() and file.retry_s == 2 * retry_s, \
            (file.state, retry_at, file.retry_s, retry_s)
        with unwinder._lock:
            unwinder._extents.give(first, taken)  # room again
        unwinder._build(file)
        assert unwinder.stats.parses == parses + 1 and file.state == 1 and file.row_count == rows
    finally:
        sampler.close()
        process.kill()
        process.wait()

# SPDX-License-Identifier: Apache-2.0
"""Native stacks without frame pointers, on the real kernel: programs built with -O2 -fomit-frame-pointer
(tests/native/unwind) profiled through CPUProfileSource keep their whole call chain and their 3:1 split; a loop in
libc's clock_gettime keeps its caller; C++ code inside the runtime's exception unwinder keeps its callers; frame-
pointer code still unwinds; and with native unwinding off the same programs lose their callers (the test's control)."""

from __future__ import annotations

import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from otel_gpu import selfmetrics, semconv
from otel_gpu.config import ProfilingConfig
from otel_gpu.ebpf import abi
from otel_gpu.cpu.sampler import CPUSampler, StackCount
from otel_gpu.cpu.source import CPUProfileSource
from otel_gpu.procfs import ProcessResolver
from otel_gpu.profiles.model import FrameKind, ProfileBatch
from tests.conftest import NATIVE

UNWIND = NATIVE / "unwind"
WORKLOADS = NATIVE / "workloads"
SAMPLES = 250  # per program: about 2.5 s of its CPU time at 99 Hz

pytestmark = [pytest.mark.root, pytest.mark.usefixtures("other_agent")]


def _profile(binary: Path, native_unwind: bool = True,
             **sampler_args: int) -> tuple[Counter[tuple[str, ...]], dict[str, int]]:
    """Caller-first user+kernel function chains of ``binary``'s samples, and the sampler's statistics (the BPF
    counters over the samples measured: from when the hit files' tables exist).

    Only this program is sampled, so the statistics (counted in the kernel for every sampled process) are its own:
    the other processes of a loaded machine do not add their walks' stops to them. It runs until SAMPLES of its
    samples are in (its CPU time, however loaded the machine), then is stopped."""
    if not binary.exists():
        pytest.fail(f"{binary} is not built: run make -s build")
    process = subprocess.Popen([str(binary), "120"], stdout=subprocess.PIPE, text=True)
    batches: list[ProfileBatch] = []
    try:
        assert process.stdout is not None
        line = process.stdout.readline().split()
        assert line and line[0] == "ready", line
        pid = int(line[1])
        sampler = CPUSampler(99, pids=[pid], native_unwind=native_unwind, **sampler_args)
        source = CPUProfileSource(ProfilingConfig(frequency_hz=99, pids=(pid,)), ProcessResolver(), sampler=sampler)
        source.open()
        try:
            if native_unwind:  # its samples count from when the tables of the files they hit exist
                sampler.register_unwinding(pid)
                _warm(sampler)
                source.drain()
                selfmetrics.reset()  # the self-metrics, like the BPF counters below, count from here
            before = sampler.stats()
            counted, deadline = 0, time.monotonic() + 100
            while counted < SAMPLES and process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.5)
                drained = source.drain()
                batches += drained
                counted += sum(s.value for b in drained for p in b.processes if p.process.pid == pid
                               for s in p.samples)
            stats = sampler.stats()
            for stat in abi.CPUStat:  # the walker's counters over the samples measured (the unwinder's stay totals)
                stats[stat.name.lower()] -= before[stat.name.lower()]
        finally:
            source.close()
    finally:
        process.kill()
        process.wait()
    stacks: Counter[tuple[str, ...]] = Counter()
    for batch in batches:
        for profile in batch.processes:
            if profile.process.pid != pid:
                continue
            for sample in profile.samples:  # C++ names without their parameters: work(double) -> work
                user = [f.function.split("(")[0] for f in reversed(sample.frames) if f.kind is not FrameKind.KERNEL]
                stacks[tuple(user)] += sample.value
    assert sum(stacks.values()) >= SAMPLES * 0.9, stacks
    return stacks, stats


def _registered(sampler: CPUSampler, timeout_s: float = 60) -> None:
    """Until the sampler registered a process for unwinding (its first sample announces it)."""
    deadline = time.monotonic() + timeout_s
    while sampler.stats()["unwind_processes"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)


def _warm(sampler: CPUSampler, timeout_s: float = 60) -> None:
    """Let the running programs' samples hit their files until no new table comes: tables are built only for files
    that samples hit, and a walk reaches the next file only once the one below has its table. What the tests assert
    counts from here."""
    deadline = time.monotonic() + timeout_s
    loaded = -1
    while time.monotonic() < deadline:
        time.sleep(0.25)
        assert sampler.settle_unwinder(max(0.0, deadline - time.monotonic()))
        files = sampler.stats()["unwind_files"] + sampler.stats()["unwind_files_too_large"]
        if files == loaded:
            return
        loaded = files
    pytest.fail("the unwind tables of the hit files did not settle")


def _ending(stacks: Counter[tuple[str, ...]], *chain: str) -> int:
    return sum(count for stack, count in stacks.items() if stack[-len(chain):] == chain)


def _containing(stacks: Counter[tuple[str, ...]], *chain: str) -> int:
    """Samples whose stack holds ``chain`` as consecutive frames (caller first)."""
    n = len(chain)
    return sum(count for stack, count in stacks.items()
               if any(stack[i:i + n] == chain for i in range(len(stack) - n + 1)))


def test_no_frame_pointer_call_chain_and_3to1_split() -> None:
    stacks, stats = _profile(UNWIND / "cpu_3to1_nofp")
    total = sum(stacks.values())
    heavy = _ending(stacks, "main", "run", "busy_loop", "leaf_heavy")
    light = _ending(stacks, "main", "run", "busy_loop", "leaf_light")
    assert (heavy + light) / total > 0.9, stacks.most_common(5)
    assert abs(heavy / (heavy + light) - 0.75) <= 0.075, (heavy, light)
    assert stats["unwind_samples"] > 0 and stats["unwind_processes"] > 0


def test_without_native_unwinding_the_same_program_loses_its_callers() -> None:
    stacks, stats = _profile(UNWIND / "cpu_3to1_nofp", native_unwind=False)
    whole = _ending(stacks, "main", "run", "busy_loop", "leaf_heavy") + _ending(
        stacks, "main", "run", "busy_loop", "leaf_light")
    assert whole < 0.5 * sum(stacks.values()), stacks.most_common(5)
    assert stats["unwind_samples"] == 0 and "unwind_processes" not in stats


def test_a_loop_in_libc_clock_gettime_keeps_its_caller() -> None:
    stacks, _ = _profile(UNWIND / "clock_loop")
    total = sum(stacks.values())
    # samples in the kernel, the vDSO or libc: the chain through hot_three must be there
    through = _containing(stacks, "main", "run_loop", "hot_three")
    assert through > 0.8 * total, stacks.most_common(5)
    below = sum(count for stack, count in stacks.items()
                if "hot_three" in stack and stack[-1] != "hot_three" and "clock_gettime" in stack[-1])
    assert below > 0.5 * total, stacks.most_common(5)  # most of the time is under hot_three, in clock_gettime


def test_cxx_exceptions_keep_their_callers() -> None:
    stacks, stats = _profile(UNWIND / "cxx_throw")
    total = sum(stacks.values())
    inside = sum(count for stack, count in stacks.items() if "catcher" in stack and stack[-1] not in
                 ("catcher", "work", "main"))
    assert inside > 0.5 * total, stacks.most_common(5)  # most samples are deep inside the runtime's unwinder
    runtime = {name for stack in stacks if "catcher" in stack for name in stack[stack.index("catcher") + 1:]}
    assert {"thrower", "__cxa_throw", "_Unwind_RaiseException"} <= runtime, runtime
    assert _containing(stacks, "main", "work", "catcher") > 0.8 * total, stacks.most_common(5)
    assert stats["unwind_read_failed"] + stats["unwind_unsupported"] + stats["unwind_no_mapping"] < 0.2 * total


def test_frame_pointer_code_keeps_working() -> None:
    stacks, _ = _profile(WORKLOADS / "cpu_3to1")
    total = sum(stacks.values())
    heavy = _ending(stacks, "main", "run", "busy_loop", "leaf_heavy")
    light = _ending(stacks, "main", "run", "busy_loop", "leaf_light")
    assert (heavy + light) / total > 0.9, stacks.most_common(5)


def test_files_over_the_frame_section_cap_are_walked_by_frame_pointer() -> None:
    """A file whose .eh_frame is over the cap gets no table (libtorch-sized files would cost the agent seconds and
    MiBs each) but its mapping is registered: the walk steps through it by frame pointer, so a frame-pointer
    program's chain stays whole, and the files left out are counted."""
    stacks, stats = _profile(WORKLOADS / "cpu_3to1", unwind_max_frame_bytes=1)
    total = sum(stacks.values())
    heavy = _ending(stacks, "main", "run", "busy_loop", "leaf_heavy")
    light = _ending(stacks, "main", "run", "busy_loop", "leaf_light")
    assert (heavy + light) / total > 0.9, stacks.most_common(5)
    assert stats["unwind_files_too_large"] >= 2 and stats["unwind_samples"] > 0, stats


def test_a_stop_in_code_no_file_backs_is_counted_by_reason() -> None:
    selfmetrics.reset()
    stacks, stats = _profile(UNWIND / "jit_loop")
    total = sum(stacks.values())
    # the walk ends in the anonymous page: one unnamed frame, counted as unwind_no_mapping, never silent
    assert stats["unwind_no_mapping"] > 0.5 * total, (stats, stacks.most_common(3))
    reported = selfmetrics.total(semconv.SELF_ERRORS.name, otel_gpu__source=semconv.Source.CPU_PROFILER,
                                 otel_gpu__reason=semconv.Reason.UNWIND_NO_MAPPING)
    assert reported == stats["unwind_no_mapping"]
    assert stats["unwind_unsupported"] + stats["unwind_read_failed"] + stats["unwind_truncated"] < 0.1 * total


def test_unwound_samples_are_counted_in_the_kernel() -> None:
    """A registered process's walked stacks are aggregated like frame-pointer ones: few distinct (thread, stack)
    entries for many samples, next to none sent whole, every one with its whole chain."""
    binary = UNWIND / "cpu_3to1_nofp"
    process = subprocess.Popen([str(binary), "60"], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    pid = int(process.stdout.readline().split()[1])
    sampler = CPUSampler(199, pids=[pid])
    sampler.open()
    counts: list[StackCount] = []
    try:
        _registered(sampler)
        _warm(sampler)
        sampler.drain()  # the samples taken before the process's hit files had tables (frame pointers)
        before, deadline = sampler.stats(), time.monotonic() + 60
        while sum(c.count for c in counts) < 300 and time.monotonic() < deadline:
            time.sleep(1.0)
            counts += sampler.drain()
        stats = sampler.stats()
    finally:
        sampler.close()
        process.kill()
        process.wait()
    samples = sum(c.count for c in counts)
    walked = stats["unwind_samples"] - before["unwind_samples"]
    assert samples > 100 and walked > 0.9 * samples, (samples, walked)
    # counted in the kernel: one entry per distinct (thread, leaf pc, stack) and drain, not one record per sample
    assert len(counts) < samples / 2 and max(c.count for c in counts) > 5, (len(counts), samples)
    # sent whole: only when a kernel stack's id collides in the stack map (the walked stacks share no map with it)
    assert stats["raw_sent"] - before["raw_sent"] < 0.05 * samples, (stats, before)
    deep = sum(c.count for c in counts if len(c.user_stack) >= 5)  # leaf, busy_loop, run, main, libc's start
    assert deep > 0.9 * samples, Counter(len(c.user_stack) for c in counts)


def test_files_that_do_not_fit_the_rows_are_counted_and_walked_by_frame_pointer() -> None:
    """unwind_rows sizes the tables: libc (28,000 rows) does not fit in 20,000, the program's own file does; the
    process is still registered (libc left to frame pointers) and the file left out is counted."""
    with pytest.raises(ValueError, match="unwind_rows"):
        CPUSampler(99, unwind_rows=0)
    process = subprocess.Popen([str(UNWIND / "cpu_3to1_nofp"), "60"], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    pid = int(process.stdout.readline().split()[1])
    sampler = CPUSampler(99, pids=[pid], unwind_rows=20_000)
    sampler.open()
    try:
        _registered(sampler)
        _warm(sampler)
        stats = sampler.stats()
    finally:
        sampler.close()
        process.kill()
        process.wait()
    assert stats["unwind_processes"] == 1 and stats["unwind_rows_full"] >= 1, stats
    assert 0 < stats["unwind_rows"] <= 20_000, stats


def test_walked_stacks_past_the_map_come_whole_and_complete() -> None:
    """With room for one walked stack per drain, the others are sent whole through the ring buffer: counted as
    raw_sent, none lost, each with its whole chain. (With two, the two stacks first seen after a drain sometimes held
    half of a loop's samples.)"""
    process = subprocess.Popen([str(UNWIND / "cpu_3to1_nofp"), "60"], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    pid = int(process.stdout.readline().split()[1])
    sampler = CPUSampler(199, pids=[pid], unwound_stacks=1)
    sampler.open()
    counts: list[StackCount] = []
    try:
        _registered(sampler)
        _warm(sampler)
        sampler.drain()
        before, deadline = sampler.stats(), time.monotonic() + 60
        while sum(c.count for c in counts) < 200 and time.monotonic() < deadline:
            time.sleep(0.5)
            counts += sampler.drain()
        stats = sampler.stats()
    finally:
        sampler.close()
        process.kill()
        process.wait()
    samples = sum(c.count for c in counts)
    whole = stats["raw_sent"] - before["raw_sent"]
    assert whole > 0.5 * samples, (whole, samples)  # a loop's leaf pcs make many distinct stacks
    assert stats["samples"] - before["samples"] <= samples + 5  # none lost (a few may fall in the next drain)
    deep = sum(c.count for c in counts if len(c.user_stack) >= 5)
    assert deep > 0.9 * samples, Counter(len(c.user_stack) for c in counts)

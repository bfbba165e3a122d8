# SPDX-License-Identifier: Apache-2.0
"""The programs one pid runs across exec(), told apart: on the real kernel, the samples a program took before it
exec'd another keep its name and its own symbols, and the program after carries none of them; with a fed sampler,
a program whose /proc was never read while it ran is reported under its thread's name, its frames unnamed."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from otel_gpu import selfmetrics, semconv
from otel_gpu.config import ProfilingConfig
from otel_gpu.cpu.sampler import StackCount
from otel_gpu.cpu.source import CPUProfileSource
from otel_gpu.procfs import ProcessInfo, ProcessResolver
from otel_gpu.profiles.model import ProcessProfile, ProfileBatch
from otel_gpu.symbolize.symbolizer import Symbolizer
from tests.cpu.test_source_filters import FedSampler
from tests.ebpf.helpers import WORKLOADS

pytestmark = pytest.mark.usefixtures("other_agent")

# each program's own functions: neither may show in the other's samples
BEFORE = {"spin_before_exec", "exec_after_leaf"}
AFTER = {"busy_loop", "leaf_heavy", "leaf_light"}


def _profiles(batches: list[ProfileBatch], pid: int) -> list[ProcessProfile]:
    return [p for b in batches for p in b.processes if p.process.pid == pid]


def _functions(profile: ProcessProfile) -> dict[str, int]:
    out: dict[str, int] = {}
    for sample in profile.samples:
        for name in {f.function for f in sample.frames}:
            out[name] = out.get(name, 0) + sample.value
    return out


def _run(source: CPUProfileSource, argv: list[str], drain_while_running: bool) -> tuple[list[ProfileBatch], int]:
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    pid = int(process.stdout.readline().split()[1])
    batches = []
    while process.poll() is None:
        time.sleep(0.5)
        if drain_while_running:
            batches += source.drain()
    time.sleep(0.2)
    batches += source.drain()  # without drains meanwhile: both programs' samples in one drain, after both ended
    return batches, pid


@pytest.mark.root
@pytest.mark.parametrize("drain_while_running", [False, True], ids=["one-drain-after", "drains-meanwhile"])
def test_samples_before_an_exec_keep_their_program_and_symbols(drain_while_running: bool) -> None:
    source = CPUProfileSource(ProfilingConfig(frequency_hz=199), ProcessResolver())
    source.open()
    try:
        batches, pid = _run(source, [str(WORKLOADS / "exec_after"), "1500", str(WORKLOADS / "cpu_3to1"), "1.5"],
                            drain_while_running)
    finally:
        source.close()
    profiles = _profiles(batches, pid)
    before = [p for p in profiles if p.process.executable_name == "exec_after"]
    after = [p for p in profiles if p.process.executable_name == "cpu_3to1"]
    assert before and after, [(p.process.executable_name, _functions(p)) for p in profiles]
    for profile in after:
        functions = _functions(profile)
        assert not BEFORE & set(functions), functions
        assert {s.thread_name for s in profile.samples} == {"cpu_3to1"}
        assert profile.process.executable_path.endswith("/cpu_3to1")
    for profile in before:
        functions = _functions(profile)
        assert not AFTER & set(functions), functions
        assert profile.process.executable_path.endswith("/exec_after")
    # exec renames the thread a moment before the kernel counts the exec: a tick inside execve may carry the new name
    assert sum(s.value for p in before for s in p.samples if s.thread_name != "exec_after") <= 2
    # its own frames, named from its own mappings (1.5 s at 199 Hz: ~300 samples on an idle machine)
    spun = sum(_functions(p).get("spin_before_exec", 0) for p in before)
    assert spun > 0.5 * sum(s.value for p in before for s in p.samples) and spun > 30, \
        [_functions(p) for p in before]
    assert sum(_functions(p).get("leaf_heavy", 0) for p in after) > 30
    # no sample of the pid's is left to a profile with another name (the forking pytest's tick is its own program)
    others = [p for p in profiles if p not in before and p not in after]
    assert all(not (BEFORE | AFTER) & set(_functions(p)) for p in others), [_functions(p) for p in others]


@pytest.mark.root
def test_a_python_that_execs_a_binary_keeps_its_samples() -> None:
    """python -c busy-loops, then os.execv's cpu_3to1: the interpreter's samples stay Python's, Python frames and
    all, though the one drain comes after the exec (and the exit)."""
    code = ("import os, sys, time\n"
            "print('ready', os.getpid(), flush=True)\n"
            "def spin_in_python_before_exec(end):\n"
            "    n = 0\n"
            "    while time.monotonic() < end:\n"
            "        n += 1\n"
            "spin_in_python_before_exec(time.monotonic() + 1.5)\n"
            f"os.execv({str(WORKLOADS / 'cpu_3to1')!r}, ['cpu_3to1', '1.5'])\n")
    source = CPUProfileSource(ProfilingConfig(frequency_hz=199), ProcessResolver())
    source.open()
    try:
        batches, pid = _run(source, [sys.executable, "-c", code], drain_while_running=False)
    finally:
        source.close()
    profiles = _profiles(batches, pid)
    after = [p for p in profiles if p.process.executable_name == "cpu_3to1"]
    python = [p for p in profiles if p.process.executable_name.startswith("python")]
    assert after and python, [(p.process.executable_name, _functions(p)) for p in profiles]
    for profile in after:
        functions = _functions(profile)
        assert not any(name.startswith(("_PyEval", "Py", "spin_in_python")) for name in functions), functions
        assert {s.thread_name for s in profile.samples} == {"cpu_3to1"}
    for profile in python:
        functions = _functions(profile)
        assert not AFTER & set(functions), functions
    assert sum(s.value for p in python for s in p.samples if s.thread_name == "cpu_3to1") <= 2
    # its Python frames too, from the code objects read while it ran (the memory is cpu_3to1's by the drain)
    spun = sum(_functions(p).get("spin_in_python_before_exec", 0) for p in python)
    assert spun > 30, [_functions(p) for p in python]


class _LookedSampler(FedSampler):
    """A fed sampler the source may register processes with (nothing to walk here)."""

    def register_python(self, pid: int, proc: object) -> None:
        pass

    def unregister_python(self, pid: int) -> None:
        pass

    def register_unwinding(self, pid: int) -> None:
        pass


class _Shows(ProcessResolver):
    """/proc of one pid that exec'd: it shows the second program (arg_start 0x2000) from the start."""

    def info(self, pid: int) -> ProcessInfo | None:
        return ProcessInfo(pid, "second", "/usr/bin/second", service_name="second") if pid == 77 else None

    def arg_start(self, pid: int) -> int | None:
        return 0x2000 if pid == 77 else None


def test_a_program_exec_replaced_before_it_was_read_keeps_its_thread_name_and_no_symbols(tmp_path) -> None:  # type: ignore[no-untyped-def]
    selfmetrics.reset()
    samples = [StackCount(77, 77, "first", 5, (0x401000, 0x401100), (), exec_id=1),
               StackCount(77, 77, "second", 3, (0x401000,), (), exec_id=2)]
    kallsyms = tmp_path / "kallsyms"
    kallsyms.write_text("ffffffff81000000 T do_syscall_64\n")
    symbolizer = Symbolizer(proc_root=str(tmp_path / "proc"), kallsyms_path=str(kallsyms))
    source = CPUProfileSource(ProfilingConfig(), _Shows(), symbolizer=symbolizer,
                              sampler=_LookedSampler(samples))  # type: ignore[arg-type]
    # announced as the first program, but /proc showed the second by the time the announcement was handled
    source._on_new_process(77, "first", 1, 0x1000)
    source._on_new_process(77, "second", 2, 0x2000)
    (batch,) = source.drain()
    by_name = {p.process.executable_name: p for p in batch.processes}
    assert set(by_name) == {"first", "second"}
    first = by_name["first"]
    assert first.process.service_name == "first" and first.process.executable_path == ""
    assert [[f.function for f in s.frames] for s in first.samples] == [["[unknown] 0x401000", "[unknown] 0x401100"]]
    assert by_name["second"].process.service_name == "second"
    assert selfmetrics.total(semconv.SELF_ERRORS.name, otel_gpu__source=semconv.Source.CPU_PROFILER,
                             otel_gpu__reason=semconv.Reason.REPLACED_BY_EXEC) == 5

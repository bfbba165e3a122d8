# SPDX-License-Identifier: Apache-2.0
"""Cost of Python frames in CPU profiles, and agreement with py-spy, measured side by side on this machine.

Reports:
  1. the BPF program's run time per sample (kernel.bpf_stats_enabled) on a busy CPython 3.12 process, with the
     process registered for Python walking and without (today's frame-pointer path), and the extra cost per sample;
  2. user space: Python stacks resolved and merged per second, first sight (code objects read through
     /proc/PID/mem) and cached;
  3. with --py-spy PATH: the same pure-Python program sampled by this profiler and by `py-spy record --format raw`
     at the same time, and the shares of heavy() and light() in each (the program splits its work 3:1);
  4. the share of a process's samples whose stack reaches a Python frame (python_share): of the workload, or with
     --pid PID of any running process (the H200 check points it at a PyTorch training step), through the whole
     CPU source (Python walk, native unwinding, merge), after the process is registered.

Run (as root, after make build): .venv/bin/python bench/bench_python_frames.py [--seconds 10] [--py-spy PATH]
                                 [--pid PID: only part 4, on that process]
"""

from __future__ import annotations

import argparse
import glob
import json
import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path

from otel_gpu.cpu.python import PythonFrames
from otel_gpu.cpu.sampler import CPUSampler

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = ROOT / "tests" / "cpu" / "py_chain.py"
PYTHON = sorted(glob.glob("/root/.pyenv/versions/3.12.*/bin/python3.12"))[-1]


def sampler_programs() -> dict[int, tuple[int, int]]:
    """id -> (run_time_ns, run_cnt) of every loaded on_cpu_sample program."""
    bpftool = shutil.which("bpftool") or "/usr/sbin/bpftool"
    out = subprocess.run([bpftool, "prog", "show", "-j"], capture_output=True, text=True, check=False).stdout
    return {prog["id"]: (prog.get("run_time_ns", 0), prog.get("run_cnt", 0))
            for prog in json.loads(out or "[]") if prog.get("name") == "on_cpu_sample"}


def prog_stats(ids: set[int]) -> tuple[int, int]:
    """(run_time_ns, run_cnt) summed over the programs ``ids`` (ours: loaded by this process)."""
    programs = sampler_programs()
    return sum(programs[i][0] for i in ids if i in programs), sum(programs[i][1] for i in ids if i in programs)


def start_workload(rounds: int) -> tuple[subprocess.Popen[str], int]:
    process = subprocess.Popen([PYTHON, str(WORKLOAD), "one", str(rounds), "200000"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdin is not None
    pid = int(process.stdout.readline().split()[1])
    process.stdin.write("go\n")
    process.stdin.flush()
    return process, pid


def bpf_cost(seconds: float, frequency_hz: int) -> dict[str, float]:
    """ns per sample of the BPF program with and without Python walking, on the same running process."""
    Path("/proc/sys/kernel/bpf_stats_enabled").write_text("1")
    process, pid = start_workload(100_000)
    others = set(sampler_programs())
    sampler = CPUSampler(frequency_hz, pids=[pid])
    sampler.open()
    ours = set(sampler_programs()) - others
    frames = PythonFrames()
    out: dict[str, float] = {}
    try:
        for phase in ("frame_pointers_only", "with_python", "frame_pointers_only_again"):
            if phase == "with_python":
                found = frames.discover(pid)
                assert found is not None
                sampler.register_python(pid, found.proc)
            elif phase.endswith("again"):
                sampler.unregister_python(pid)
            before = prog_stats(ours)
            time.sleep(seconds)
            after = prog_stats(ours)
            samples = sampler.drain()
            run_ns, count = after[0] - before[0], after[1] - before[1]
            out[f"{phase}_ns_per_sample"] = run_ns / max(1, count)
            out[f"{phase}_samples"] = count
            if phase == "with_python":
                out.update(resolve_rate(sampler, frames, pid, samples))
    finally:
        sampler.close()
        process.kill()
        process.wait()
        Path("/proc/sys/kernel/bpf_stats_enabled").write_text("0")
    return out


def resolve_rate(sampler: CPUSampler, frames: PythonFrames, pid: int, samples: list) -> dict[str, float]:  # type: ignore[type-arg]
    """Python stacks resolved + merged per second: the first time (code objects read) and cached."""
    ids = {s.python_stack_id for s in samples if s.python_stack_id}
    start = time.perf_counter()
    stacks = sampler.python_stacks(ids)
    lookup_s = time.perf_counter() - start
    out = {"distinct_python_stacks": float(len(stacks))}
    for label in ("first", "cached"):
        start = time.perf_counter()
        for sample in samples:
            frames.merged(pid, (), stacks.get(sample.python_stack_id))
        elapsed = time.perf_counter() - start + (lookup_s if label == "first" else 0.0)
        out[f"merge_{label}_samples_per_s"] = len(samples) / elapsed if elapsed else 0.0
    return out


def py_spy_agreement(py_spy: str, seconds: float) -> dict[str, float]:
    """Shares of heavy() and light() by this profiler and by py-spy, sampling the same process at once."""
    from otel_gpu.config import ProfilingConfig
    from otel_gpu.cpu.source import CPUProfileSource
    from otel_gpu.procfs import ProcessResolver

    process, pid = start_workload(100_000)
    source = CPUProfileSource(ProfilingConfig(frequency_hz=99, pids=(pid,)), ProcessResolver())
    source.open()
    raw = Path(f"/tmp/py-spy-{pid}.txt")
    try:
        time.sleep(0.5)
        source.drain()  # the samples before the process was registered
        spy = subprocess.Popen([py_spy, "record", "--format", "raw", "-r", "99", "-d", str(int(seconds)), "-p",
                                str(pid), "-o", str(raw), "--nonblocking"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        spy.wait()
        batch = source.drain()[0]
    finally:
        source.close()
        process.kill()
        process.wait()
    ours: Counter[str] = Counter()
    for profile in batch.processes:
        for sample in profile.samples:
            names = [f.function for f in sample.frames]
            ours[next((n for n in ("heavy", "light") if n in names), "other")] += sample.value
    theirs: Counter[str] = Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        functions = [frame.split(" (")[0] for frame in stack.split(";")]
        theirs[next((n for n in ("heavy", "light") if n in functions), "other")] += int(count)
    raw.unlink()
    out: dict[str, float] = {}
    for label, counts in (("otel_gpu", ours), ("py_spy", theirs)):
        total = sum(counts.values()) or 1
        out[f"{label}_samples"] = total
        for name in ("heavy", "light", "other"):
            out[f"{label}_{name}_share"] = counts[name] / total
    return out


def python_share(seconds: float, pid: int = 0) -> dict[str, float]:
    """Share of the samples of ``pid`` (default: the 3:1 workload) whose stack reaches a Python frame."""
    from otel_gpu.config import ProfilingConfig
    from otel_gpu.cpu.source import CPUProfileSource
    from otel_gpu.procfs import ProcessResolver
    from otel_gpu.profiles.model import FrameKind

    process = None
    if not pid:
        process, pid = start_workload(100_000)
    source = CPUProfileSource(ProfilingConfig(frequency_hz=99, pids=(pid,)), ProcessResolver())
    source.open()
    try:
        time.sleep(0.5)
        source.drain()  # the samples before the process was registered
        source.sampler.settle_unwinder(60)
        source.drain()
        time.sleep(seconds)
        batch = source.drain()[0]
    finally:
        source.close()
        if process is not None:
            process.kill()
            process.wait()
    samples = [s for p in batch.processes if p.process.pid == pid for s in p.samples]
    total = sum(s.value for s in samples)
    python = sum(s.value for s in samples if any(f.kind is FrameKind.PYTHON for f in s.frames))
    return {"pid": pid, "samples": total, "python_share": python / total if total else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--frequency-hz", type=int, default=999)
    parser.add_argument("--py-spy", default="")
    parser.add_argument("--pid", type=int, default=0, help="only the Python share, of this running process")
    args = parser.parse_args()
    if args.pid:
        print(json.dumps({"reach": python_share(args.seconds, args.pid)}, indent=2))
        return
    result = {"bpf": bpf_cost(args.seconds, args.frequency_hz), "reach": python_share(args.seconds)}
    if args.py_spy:
        result["py_spy"] = py_spy_agreement(args.py_spy, args.seconds)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

# SPDX-License-Identifier: Apache-2.0
"""The CPU profile's hot path in agent CPU time: resolve + symbolize + merge + encode, per sample.

Wall-clock rates on a shared machine mostly measure the load; this bench charges each step to the thread that runs
it (``time.thread_time()``), so the numbers hold under load. One run, side by side, for three kinds of stacks a
drain hands to :class:`CPUProfileSource` (the same source, symbolizer and encoders the agent runs):
  fp:       frame-pointer stacks, depth 8-16, through the executable and a few libraries;
  walked:   stacks unwound from .eh_frame (deeper, depth 20-40, through libc and libraries without frame pointers:
            to the agent they are addresses like any others, only more of them);
  python:   a live CPython 3.12 process's stacks: native frames with one to three ``_PyEval_EvalFrameDefault``
            frames and a Python stack (real code objects, read through /proc/PID/mem) merged in.
Each kind: DISTINCT stacks (default 4,000) drawn from 2,000 functions over every executable file the process maps
(a python3.12 that imported tens of extension modules: 40+ files), SAMPLES samples over them per drain (Zipf-like
spread, 4 threads). The first drain reads the symbol tables (cold); then DRAINS steady drains of the same mix, as a
profiler sees between reports. Printed: samples per CPU-second (drain+merge and encode apart) and the extra CPU
per sample against fp.

The stacks of that part are fed from lists built from the live process's real mappings. With --real SECONDS, a
second part runs the real sampler (eBPF, 999 Hz) on two programs built without frame pointers
(tests/native/unwind: cpu_3to1_nofp, clock_loop) and the Python callback workload (tests/cpu/py_chain.py), once
with frame pointers only and once with native unwinding, and charges each whole drain (the sampler's map reads
included) plus encoding to the draining thread; the unwinder's table building runs on its own thread and is not in
it.

Run (root; after make build): .venv/bin/python bench/bench_cpu_hot_path.py
        [--samples 50000] [--distinct 4000] [--drains 3] [--profile FILE.pstats] [--real SECONDS]
"""

from __future__ import annotations

import argparse
import cProfile
import glob
import shutil
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from otel_gpu.config import ProfilingConfig  # noqa: E402
from otel_gpu.cpu.python import EVALUATION_LOOP, elf_symbols  # noqa: E402
from otel_gpu.cpu.sampler import StackCount  # noqa: E402
from otel_gpu.cpu.source import CPUProfileSource  # noqa: E402
from otel_gpu.ebpf import abi  # noqa: E402
from otel_gpu.procfs import ProcessResolver  # noqa: E402
from otel_gpu.profiles.otlp import encode_otlp  # noqa: E402
from otel_gpu.profiles.pprof import encode_pprof  # noqa: E402
from otel_gpu.symbolize.maps import read_maps  # noqa: E402
from otel_gpu.symbolize.symbolizer import Symbolizer  # noqa: E402

# pyenv's 3.12 here; the GPU machine's own python3.12 there
PYTHON = (sorted(glob.glob("/root/.pyenv/versions/3.12.*/bin/python3.12")) or [shutil.which("python3.12") or ""])[-1]
# A long-lived CPython that maps tens of files and prints the addresses of its functions' code objects.
CHILD = """
import importlib, sys, types
for name in ("json", "csv", "decimal", "ssl", "sqlite3", "ctypes", "hashlib", "zlib", "bz2", "lzma", "socket",
             "select", "array", "math", "cmath", "struct", "pickle", "datetime", "uuid", "xml.etree.ElementTree",
             "email.parser", "http.client", "asyncio", "multiprocessing", "unicodedata", "readline", "curses",
             "mmap", "fcntl", "grp", "resource", "termios", "binascii", "random", "statistics", "heapq", "bisect",
             "queue", "zoneinfo", "pyexpat", "_posixsubprocess", "dbm", "tarfile", "zipfile", "argparse"):
    try:
        importlib.import_module(name)
    except ImportError:
        pass
codes = []
for module in list(sys.modules.values()):
    for value in list(vars(module).values()):
        if isinstance(value, types.FunctionType):
            codes.append(value.__code__)
        elif isinstance(value, type):
            codes.extend(v.__code__ for v in vars(value).values() if isinstance(v, types.FunctionType))
print(" ".join(str(id(c)) for c in codes), flush=True)
sys.stdin.readline()
"""


class FeedSampler:
    """Hands the source prepared samples and Python stacks, as CPUSampler.drain()/python_stacks() would."""

    frequency_hz = 19
    attached_ns = 0

    def __init__(self, samples: list[StackCount], python: dict[int, abi.PythonStack]) -> None:
        self.samples, self.python = samples, python

    def open(self) -> None: ...

    def close(self) -> None: ...

    def drain(self) -> list[StackCount]:
        return self.samples

    def python_stacks(self, ids: object) -> dict[int, abi.PythonStack]:
        return self.python

    def register_python(self, pid: int, proc: object) -> None: ...

    def unregister_python(self, pid: int) -> None: ...

    def forget(self, pids: object) -> None: ...


def functions(pid: int, rng: random.Random, count: int) -> tuple[list[int], list[int]]:
    """``count`` addresses spread over every executable file mapping of ``pid`` (an equal share per file, as
    functions of many libraries), and the addresses of its evaluation loop (a few bytes into it)."""
    code = [e for e in read_maps(pid) or [] if e.executable and e.file_backed]
    pool = [rng.randrange(entry.start, entry.end) for entry in code for _ in range(max(1, count // len(code)))]
    loops = []
    for entry in code:
        if "python" in entry.path:
            symbols, base = elf_symbols(entry.path, (EVALUATION_LOOP,))
            if EVALUATION_LOOP in symbols:
                bias = entry.start - entry.offset - base
                loops = [bias + symbols[EVALUATION_LOOP] + delta for delta in (0x40, 0x1234, 0x2345)]
    return pool, loops


def make_samples(kind: str, pid: int, pool: list[int], loops: list[int], codes: list[int], distinct: int,
                 samples: int, rng: random.Random) -> tuple[list[StackCount], dict[int, abi.PythonStack]]:
    """``samples`` samples over ``distinct`` stacks, Zipf-like (a few hot stacks, a long tail)."""
    stacks: list[tuple[tuple[int, ...], int]] = []
    python: dict[int, abi.PythonStack] = {}
    roots = rng.sample(pool, 8)  # what starts the threads: shared by every stack
    for index in range(distinct):
        depth = rng.randint(8, 16) if kind != "walked" else rng.randint(20, 40)
        native = [rng.choice(pool) for _ in range(depth - 2)] + [rng.choice(roots), roots[0]]
        stack_id = 0
        if kind == "python":
            runs = rng.randint(1, 3)
            stack = abi.PythonStack()
            depth_py = rng.randint(4, 30)
            stack.depth = depth_py
            cuts = sorted(rng.sample(range(depth_py - 1), runs - 1)) + [depth_py - 1]
            for i in range(depth_py):
                stack.code[i] = rng.choice(codes)
                stack.offset[i] = 2 * rng.randint(0, 20)
                if i in cuts:
                    stack.entries[i // 64] |= 1 << i % 64
            for run in range(runs):  # each loop takes the place of a native frame
                native.insert(min(len(native) - 2, 3 + 4 * run), loops[run % len(loops)])
            stack_id = index + 1
            python[stack_id] = stack
        stacks.append((tuple(native), stack_id))
    weights = [1.0 / (rank + 1) for rank in range(distinct)]
    out = []
    for (native, stack_id), count in zip(stacks, _spread(samples, weights, rng), strict=True):
        if count:
            tid = pid + (hash(native) & 3)
            out.append(StackCount(pid, tid, "bench", count, native, (), python_stack_id=stack_id))
    return out, python


def _spread(total: int, weights: list[float], rng: random.Random) -> list[int]:
    counts = [0] * len(weights)
    for index in rng.choices(range(len(weights)), weights=weights, k=total):
        counts[index] += 1
    return counts


def measure(kind: str, pid: int, feed: FeedSampler, drains: int,
            profiler: cProfile.Profile | None) -> dict[str, float]:
    symbolizer = Symbolizer()
    source = CPUProfileSource(ProfilingConfig(), ProcessResolver(), symbolizer=symbolizer,
                              sampler=feed)  # type: ignore[arg-type]
    if kind == "python":
        found = source._python.discover(pid)  # as a process's first sample does
        assert found is not None, "the python child was not recognised"
    total = sum(s.count for s in feed.samples)
    started = time.thread_time()
    source.drain()
    cold_s = time.thread_time() - started
    drain_s = encode_s = 0.0
    if profiler is not None:
        profiler.enable()
    for _ in range(drains):
        started = time.thread_time()
        (batch,) = source.drain()
        drained = time.thread_time()
        encode_pprof(batch)
        encode_otlp(batch).SerializeToString()
        drain_s += drained - started
        encode_s += time.thread_time() - drained
    if profiler is not None:
        profiler.disable()
    per_sample_us = 1e6 * (drain_s + encode_s) / (drains * total)
    return {"kind": kind, "samples": total, "distinct": len(feed.samples), "cold_samples_per_cpu_s": total / cold_s,
            "drain_samples_per_cpu_s": drains * total / drain_s, "encode_samples_per_cpu_s": drains * total / encode_s,
            "samples_per_cpu_s": drains * total / (drain_s + encode_s), "us_per_sample": per_sample_us}


def real_drains(native_unwind: bool, seconds: float) -> dict[str, float]:
    """The real sampler at 999 Hz on the three workloads for ``seconds``: agent thread CPU per drained sample."""
    from otel_gpu.cpu.sampler import CPUSampler

    unwind = ROOT / "tests" / "native" / "unwind"
    sampler = CPUSampler(999, native_unwind=native_unwind)
    config = ProfilingConfig(frequency_hz=999, process_name="^(cpu_3to1_nofp|clock_loop|python3.12)$")
    source = CPUProfileSource(config, ProcessResolver(), sampler=sampler)
    source.open()
    workloads = []
    try:
        workloads = [subprocess.Popen([str(unwind / name), str(seconds + 30)], stdout=subprocess.DEVNULL)
                     for name in ("cpu_3to1_nofp", "clock_loop")]
        python = subprocess.Popen([PYTHON, str(ROOT / "tests" / "cpu" / "py_chain.py"), "callback", "100000",
                                   "200000"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        workloads.append(python)
        assert python.stdin is not None and python.stdout is not None
        python.stdout.readline()
        python.stdin.write("go\n")
        python.stdin.flush()
        python.stdout.readline()  # warm
        python.stdin.write("go\n")
        python.stdin.flush()
        time.sleep(1.0)
        source.drain()  # announces and registers them (Python walker, unwind tables)
        assert sampler.settle_unwinder(120)
        source.drain()
        samples = 0
        cpu_s = 0.0
        ended = time.monotonic() + seconds
        while time.monotonic() < ended:
            time.sleep(1.0)
            started = time.thread_time()
            (batch,) = source.drain()
            encode_pprof(batch)
            encode_otlp(batch).SerializeToString()
            cpu_s += time.thread_time() - started
            samples += sum(s.value for p in batch.processes for s in p.samples)
    finally:
        source.close()
        for workload in workloads:
            workload.kill()
            workload.wait()
    return {"samples": samples, "cpu_s": cpu_s, "us_per_sample": 1e6 * cpu_s / max(1, samples)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=50_000)
    parser.add_argument("--distinct", type=int, default=4_000)
    parser.add_argument("--drains", type=int, default=3)
    parser.add_argument("--profile", help="write a cProfile of the steady drains to this file")
    parser.add_argument("--real", type=float, default=0.0, help="seconds of the real sampler, each way (0: skip)")
    args = parser.parse_args()
    child = subprocess.Popen([PYTHON, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        codes = [int(word) for word in child.stdout.readline().split()]
        rng = random.Random(14)
        pool, loops = functions(child.pid, rng, 2_000)
        files = len({e.path for e in read_maps(child.pid) or [] if e.executable and e.file_backed})
        print(f"CPU path per sample, agent thread CPU time; {args.samples} samples over {args.distinct} stacks a "
              f"drain, {len(pool)} functions in {files} files, {len(codes)} code objects; {args.drains} steady drains")
        profiler = cProfile.Profile() if args.profile else None
        rows = []
        for kind in ("fp", "walked", "python"):
            samples, python = make_samples(kind, child.pid, pool, loops, codes, args.distinct, args.samples, rng)
            rows.append(measure(kind, child.pid, FeedSampler(samples, python), args.drains, profiler))
        base = rows[0]["us_per_sample"]
        for row in rows:
            print(f"  {row['kind']:>6}: {row['samples_per_cpu_s']:>9,.0f} samples/CPU-s "
                  f"(drain+merge {row['drain_samples_per_cpu_s']:>9,.0f}, "
                  f"encode {row['encode_samples_per_cpu_s']:>9,.0f}), {row['us_per_sample']:.2f} us/sample, "
                  f"+{row['us_per_sample'] - base:.2f} us vs fp; "
                  f"first drain (symbol tables read; drain only) {row['cold_samples_per_cpu_s']:>9,.0f} samples/CPU-s")
        if profiler is not None:
            profiler.dump_stats(args.profile)
    finally:
        child.kill()
        child.wait()
    if args.real:
        print(f"real sampler, 999 Hz x {args.real:g} s, 3 workloads, drains every 1 s "
              "(drain + encode, agent thread CPU)")
        rows = [("frame pointers", real_drains(False, args.real)), ("native unwinding", real_drains(True, args.real))]
        for name, row in rows:
            print(f"  {name:>16}: {row['samples']:>6} samples, {row['cpu_s'] * 1000:7.1f} ms CPU, "
                  f"{row['us_per_sample']:.2f} us/sample ({1e6 / max(row['us_per_sample'], 1e-9):,.0f} samples/CPU-s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

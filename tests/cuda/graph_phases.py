# SPDX-License-Identifier: Apache-2.0
"""One run of the fake workload's clustered graph work (``workload --graph-phases``) and the graph's GPU time as the
agent estimates it, weighted by replay counts and by windows, against the fake driver's schedule (the truth); and
one of its launch-bound program that replays a graph and launches eagerly in turn (``workload --mixed``), with each
kind of kernel's GPU time as estimated against the schedule's.

The library's debug file (every record it fires, in order) is decoded with :func:`abi.decode_event` and fed to
:class:`GPUTimeAccounting` as the eBPF program would pass it; used by tests/cuda/test_graph_counts_fake_cuda.py and
bench/bench_gpu_time.py.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import struct
import subprocess
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from otel_gpu.cuda import abi
from otel_gpu.cuda.accounting import GPUTimeAccounting
from otel_gpu.cuda.join import GPUWork, pace_ratio
from otel_gpu.cuda.stacks import StackFrames
from otel_gpu.procfs import ProcessInfo, ProcessResolver
from tests.cuda.test_source_records import FakeSymbolizer

REPO = Path(__file__).resolve().parents[2]
FAKES = REPO / "tests" / "native" / "cuda"
LIBRARY = REPO / "otel_gpu" / "cuda" / "native" / "libotel_gpu_inject.so"
K = TypeVar("K")  # what estimated GPU time is summed by
_TYPES = {1: abi.EVENT_LAUNCH, 2: abi.EVENT_ACTIVITY, 3: abi.EVENT_SYNC, 4: abi.EVENT_WINDOW}  # emit.c's framing


class _Named(ProcessResolver):
    def info(self, pid: int) -> ProcessInfo | None:
        return ProcessInfo(pid, "workload")


def debug_records(path: Path, pid: int) -> list[abi.Record]:
    """The library's debug file (OTEL_GPU_DEBUG_FILE) as decoded records, in the order it fired them."""
    data, at, out = path.read_bytes(), 0, []
    activity_size = ctypes.sizeof(abi.ActivityC)
    while at < len(data):
        kind, length = struct.unpack_from("<II", data, at)
        payload = data[at + 8:at + 8 + length]
        at += 8 + length
        event = _TYPES[kind]
        pieces = [payload[i:i + activity_size] for i in range(0, length, activity_size)] \
            if event == abi.EVENT_ACTIVITY else [payload]
        for piece in pieces:
            header = abi.EventC(type=event, pid=pid, tid=pid, payload_len=len(piece), comm=b"workload")
            kstack = bytes(abi.KStackC()) if event in (abi.EVENT_LAUNCH, abi.EVENT_SYNC) else b""
            out.append(abi.decode_event(bytes(header) + kstack + piece))
    return out


@dataclass(frozen=True)
class GraphEstimate:
    truth_ns: int  # the graph kernels' GPU time in the schedule
    truth_replays: int  # graph launches whose kernels ran by then
    by_counts_ns: float  # the agent's estimate, replays weighted by counts
    by_windows_ns: float  # the same records, every launch weighted by its window
    windows: int
    sampled_replays: int
    replays: int  # counted by the library (execs in its table)
    other_replays: int  # counted, of execs beyond its table
    not_sampled: int  # replays of execs with no sampled replay (no time attributed)
    by_counts_counted_ns: float  # of by_counts_ns, the execs in the library's table
    execs_counted: int  # execs in the library's table


def weighted(records: list[abi.Record], count_graphs: bool,
             key: Callable[[GPUWork], K | None]) -> tuple[Counter[K], GPUTimeAccounting]:
    """The GPU time the agent estimates from ``records`` (one drain at the end, as one profiling interval), summed by
    ``key`` of each piece of work (None: left out)."""
    accounting = GPUTimeAccounting(_Named(), StackFrames(FakeSymbolizer()), lambda pid: True,
                                   count_graphs=count_graphs)
    totals: Counter[K] = Counter()

    def observe(work: GPUWork, weight: float) -> None:
        group = key(work)
        if group is not None:
            totals[group] += work.activity.duration_ns * weight

    accounting.observe_work(observe)
    for record in records:
        accounting.handle(record)
    accounting.drain(now_ns=1 << 62, final=True)
    return totals, accounting


def estimate(records: list[abi.Record], count_graphs: bool) -> tuple[Counter[int], GPUTimeAccounting]:
    """The graph kernels' estimated GPU time by graph exec from ``records``."""
    return weighted(records, count_graphs, lambda work: work.launch.graph_exec if work.activity.graph_id else None)


def _injected(work: Path, args: list[str], window_ms: str, budget: str, **fakes: str) -> tuple[list[abi.Record], Path]:
    """Runs the fake workload with ``args`` injected (the debug mode stands for an attached agent; graphs sampled),
    ``fakes`` as FAKE_* settings; returns the records the library fired and the fake driver's schedule."""
    debug, schedule = work / "records.bin", work / "schedule.txt"
    for path in (debug, schedule):
        path.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_GPU_", "CUDA_INJECTION", "FAKE_"))}
    env.update(FAKE_CUDA_SCHEDULE=str(schedule), OTEL_GPU_CUPTI_PATH=str(FAKES / "libcupti.so"),
               OTEL_GPU_DEBUG_ALWAYS_ON="1", OTEL_GPU_DEBUG_FILE=str(debug), OTEL_GPU_WINDOW_MS=window_ms,
               OTEL_GPU_OVERHEAD_BUDGET=budget, OTEL_GPU_CUDA_GRAPHS="sample", CUDA_INJECTION64_PATH=str(LIBRARY),
               **fakes)
    subprocess.run([str(FAKES / "workload"), *args], env=env, check=True, capture_output=True, timeout=300)
    return debug_records(debug, pid=1), schedule


def run(work: Path, blocks: int = 80, execs: int = 1, window_ms: str = "20", budget: str = "0.02",
        jitter: float = 0.0) -> GraphEstimate:
    """Runs ``workload --graph-phases blocks --graph-execs execs`` injected, each graph kernel's time varied by up to
    ``jitter`` (a fraction) per replay, and estimates its graph time both ways."""
    records, schedule = _injected(work, ["--graph-phases", str(blocks), "--graph-execs", str(execs)], window_ms, budget,
                                  FAKE_CUDA_GRAPH_JITTER=str(jitter))
    windows = [r for r in records if isinstance(r, abi.Window)]
    # what the records can account for: the graph kernels launched by the last window's close (a replay's kernels
    # start 5 us after its call; the workload waits for each before the next)
    until_ns = windows[-1].end_ns if windows else 0
    truth, launches = 0, set()
    for line in schedule.read_text().splitlines():
        parts = line.split()
        if parts[0] == "work" and int(parts[7]) != 0 and int(parts[4]) < until_ns:  # graph_id: a graph node's kernel
            truth += int(parts[5]) - int(parts[4])
            launches.add(int(parts[2]))
    by_counts, accounting = estimate(records, count_graphs=True)
    by_windows, _ = estimate(records, count_graphs=False)
    last = windows[-1] if windows else None
    counted = dict(last.graph_replays) if last else {}
    sampled = sum(1 for r in records if isinstance(r, abi.Launch) and r.kind == abi.LAUNCH_GRAPH)
    return GraphEstimate(truth, len(launches), sum(by_counts.values()), sum(by_windows.values()), len(windows), sampled,
                         sum(counted.values()), last.graph_other_replays if last else 0,
                         accounting.graph_replays_not_sampled,
                         sum(ns for exec_, ns in by_counts.items() if exec_ in counted), len(counted))


@dataclass(frozen=True)
class KernelEstimate:
    truth_ns: Counter[str]  # each kernel's GPU time in the schedule
    estimate_ns: Counter[str]  # as the agent weights the records (graph replays by counts)
    unlingered_ns: Counter[str]  # the same with the lingers' time weighted as undisturbed (before ABI 7)
    windows: int
    linger_ns: int  # the library's total time lingering after windows
    pace: float  # the last window's pace by launches (shadows over windows)


def mixed(work: Path, iterations: int, delivery_delay_us: int, trace_cost_us: int = 20, cpu_us: int = 10,
          window_ms: str = "5", budget: str = "0.2") -> KernelEstimate:
    """Runs ``workload --mixed iterations`` injected: a launch-bound program that replays a graph and launches tiny
    kernels eagerly in turn, each launch ``cpu_us`` of its own CPU time and ``trace_cost_us`` more while CUPTI's
    activity kinds are on, CUPTI's records handed over ``delivery_delay_us`` after their work ended (the library
    lingers that long after each window); returns each kernel's GPU time, estimated and true."""
    records, schedule = _injected(work, ["--mixed", str(iterations), "--mixed-cpu-us", str(cpu_us)], window_ms, budget,
                                  FAKE_CUPTI_TRACE_COST_US=str(trace_cost_us),
                                  FAKE_CUPTI_DELIVERY_DELAY_US=str(delivery_delay_us))
    truth: Counter[str] = Counter()
    for line in schedule.read_text().splitlines():
        parts = line.split()
        if parts[0] == "work":
            truth[parts[3]] += int(parts[5]) - int(parts[4])
    unlingered = [dataclasses.replace(r, linger_ns=0, linger_launches=0) if isinstance(r, abi.Window) else r
                  for r in records]
    windows = [r for r in records if isinstance(r, abi.Window)]
    return KernelEstimate(truth, _by_kernel(records), _by_kernel(unlingered), len(windows), windows[-1].linger_ns,
                          pace_ratio(windows[-1]))


def _by_kernel(records: list[abi.Record]) -> Counter[str]:
    """Each kernel's GPU time as the agent estimates it from ``records`` (graph replays by counts)."""
    return weighted(records, True, lambda work: work.activity.name)[0]

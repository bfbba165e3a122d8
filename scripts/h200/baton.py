#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Overhead with the machine's drift taken out: every process alive at once, one runs at a time.

Run THERE (the H200 machine; `bash scripts/h200/run.sh baton`). Tiny-kernel PyTorch processes (x.add_(1), the loop
verify_gpu_time.py times) in four modes, PER processes each, all pinned to the same two CPUs while the real agent
(`otel-gpu run`, GPU metrics and GPU-time profiling) runs on the others throughout:

  P  plain
  E  CUDA_INJECTION64_PATH = a library whose InitializeInjection returns at once (the driver's injection alone)
  N  our library, a copy the agent neither discovers nor probes (our library without an agent)
  I  `otel-gpu inject`: our library with the agent attached (what a user runs)

They take turns: in each cycle every process, in a random order, runs its loop for SLICE seconds while the others
wait on a pipe (no CUDA calls), then reports launches per second. A mode's loss is the median over cycles of
1 - (its median rate in the cycle) / (P's median rate in the cycle): paired within seconds, so the machine's drift
between processes and minutes (72k-143k kernels/s seen within one process) hits every mode alike.

Usage: baton.py REPORT.md [SECONDS]   (env: BATON_PER=3, BATON_SLICE=1.0, BATON_MODES=P,E,N,I, BATON_LOOP=tiny or
matmul: 10 8192x8192 bf16 matmuls per step, the GPU-bound case; graph: replays of a captured 10-kernel CUDA graph;
mixed: one replay and 20 eager kernels per step; bursty: a server's requests, 50 ms without a CUDA call and then 100
tiny kernels and a synchronize: what the windows that fall in its idle time cost the next request). Each mode's
steps' durations (a request for bursty) are reported too: the median over turns of each turn's p50 and p99, and the
longest step seen.
"""
from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHILD = r'''
import json, statistics, sys, time
import torch
def pause():
    pass
if sys.argv[1] == "matmul":  # GPU-bound: 8192x8192 bf16 matmuls, 10 per step
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    def step():
        for _ in range(10):
            torch.mm(a, a)
        return 10
elif sys.argv[1] in ("graph", "mixed"):  # a captured graph of 10 tiny kernels replayed (mixed: + 20 eager ones)
    x = torch.zeros(1, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x.add_(1)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(10):
            x.add_(1)
    eager = 20 if sys.argv[1] == "mixed" else 0
    def step():
        graph.replay()
        for _ in range(eager):
            x.add_(1)
        return 10 + eager
elif sys.argv[1] == "bursty":  # a server: 50 ms without a CUDA call, then a request of 100 tiny kernels, answered
    x = torch.zeros(1, device="cuda")
    def pause():
        time.sleep(0.05)
    def step():
        for _ in range(100):
            x.add_(1)
        torch.cuda.synchronize()
        return 100
else:  # launch-bound: 100 tiny kernels per step
    x = torch.zeros(1, device="cuda")
    def step():
        for _ in range(100):
            x.add_(1)
        return 100
for _ in range(50):
    step()
torch.cuda.synchronize()
print("ready", flush=True)
for line in sys.stdin:
    seconds = float(line)
    n, start, steps = 0, time.perf_counter(), []
    while time.perf_counter() - start < seconds:
        pause()
        began = time.perf_counter()
        n += step()
        steps.append(time.perf_counter() - began)
    torch.cuda.synchronize()
    q = statistics.quantiles(steps, n=100, method="inclusive") if len(steps) >= 2 else steps * 99
    print(json.dumps({"rate": n / (time.perf_counter() - start), "p50_ms": q[49] * 1e3, "p99_ms": q[98] * 1e3,
                      "max_ms": max(steps) * 1e3}), flush=True)
'''
# mode -> (injected library: None / "empty" / "inert" / "agent", extra environment); BATON_MODES picks (default P,E,N,I)
MODE_SETUP: dict[str, tuple[str | None, dict[str, str]]] = {
    "P": (None, {}), "E": ("empty", {}), "N": ("inert", {}), "I": ("agent", {}),
    # diagnostics (the library's OTEL_GPU_DEBUG_* knobs), all with the agent attached:
    "W0": ("agent", {"OTEL_GPU_DEBUG_NO_WAITS": "1"}),  # no wait callbacks
    "X": ("agent", {"OTEL_GPU_DEBUG_NO_WINDOWS": "1"}),  # subscribed with wait callbacks, never a window
    "X0": ("agent", {"OTEL_GPU_DEBUG_NO_WINDOWS": "1", "OTEL_GPU_DEBUG_NO_WAITS": "1"}),  # subscribed only
    "F": ("agent", {"OTEL_GPU_DEBUG_NO_WINDOWS": "1", "OTEL_GPU_DEBUG_NO_WAITS": "1", "OTEL_GPU_DEBUG_FINALIZE": "1"}),
    "S": ("agent", {"OTEL_GPU_CUDA_GRAPHS": "sample"}),
    "U": ("agent", {"OTEL_GPU_DEBUG_CHARGE_TAKE": "0"}),  # the takes of CUPTI after finalizes left out of the budget
    "C": ("agent", {"OTEL_GPU_DEBUG_CHARGE_TAKE": "cpu"}),  # only the controller's CPU time in them charged (before)
    "A": ("agent", {"OTEL_GPU_FINALIZE_AT_ONCE": "1"}),  # no 50 ms patience for loops that never synchronize (default)
    "L": ("agent", {"OTEL_GPU_FINALIZE_AT_ONCE": "0"}),  # every finalize waits up to 50 ms for a synchronize
    "K": ("agent", {"OTEL_GPU_DEBUG_IDLE_KEEP": "1"}),  # no finalize after a window in which nothing was launched
}
MODES = tuple(os.environ.get("BATON_MODES", "P,E,N,I").split(","))


def mean_loss(cycles: list[dict[str, list[float]]], mode: str, draws: int = 2000) -> tuple[float, float, float]:
    """1 - (the mode's mean rate) / (plain's mean rate) over all cycles, with a 90 % interval from resampling cycles:
    the budget is on the mean loss, and a window's cost falls on a few slices (the median of the cycles misses it)."""
    def loss(sample: list[dict[str, list[float]]]) -> float:
        ours = statistics.fmean(r for c in sample for r in c[mode])
        plain = statistics.fmean(r for c in sample for r in c["P"])
        return 1 - ours / plain
    rng = random.Random(11)
    spread = sorted(loss(rng.choices(cycles, k=len(cycles))) for _ in range(draws))
    return loss(cycles), spread[int(0.05 * draws)], spread[int(0.95 * draws) - 1]


def cycle_losses(cycles: list[dict[str, list[float]]], mode: str) -> list[float]:
    """Per cycle, 1 - (mode's median rate) / (plain's median rate), sorted."""
    return sorted(1 - statistics.median(c[mode]) / statistics.median(c["P"]) for c in cycles)


def process_loss(cycles: list[dict[str, list[float]]], rates: list[float]) -> float:
    """One process's loss: 1 - its mean rate over the cycles / plain's mean rate (each cycle's mean over the P
    processes, averaged), paired cycle by cycle since every process takes one turn in each: each of several injected
    processes against the budget, not only the mode's mean."""
    return 1 - statistics.fmean(rates) / statistics.fmean(statistics.fmean(c["P"]) for c in cycles)


def step_latency(turns: list[dict[str, float]]) -> str:
    """A mode's step durations: the median over its turns of each turn's p50 and p99, and the longest step."""
    if not turns:
        return "-"
    return (f"{statistics.median(t['p50_ms'] for t in turns):.2f} / {statistics.median(t['p99_ms'] for t in turns):.2f}"
            f", {max(t['max_ms'] for t in turns):.1f}")


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(__doc__)
        return 2
    out, seconds = Path(argv[1]), float(argv[2]) if len(argv) == 3 else 240.0
    per, slice_s = int(os.environ.get("BATON_PER", "3")), float(os.environ.get("BATON_SLICE", "1.0"))
    loop = os.environ.get("BATON_LOOP", "tiny")
    if loop not in ("tiny", "matmul", "graph", "mixed", "bursty"):
        print(f"BATON_LOOP must be tiny, matmul, graph, mixed or bursty, not {loop!r}")
        return 2
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from otel_gpu.cuda.inject import library_path
    from verify_gpu_time import pinned_to, write_report

    library = Path(str(library_path()))
    empty = REPO / ".device" / "empty_inject.so"
    cpus = sorted(os.sched_getaffinity(0))
    workload, rest = set(cpus[2:4]), set(cpus) - set(cpus[2:4])
    work = Path(tempfile.mkdtemp(prefix="otel-gpu-baton-"))
    (work / "child.py").write_text(CHILD)
    inert = work / "inert-copy.so"
    inert.write_bytes(library.read_bytes())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.pop("CUDA_INJECTION64_PATH", None)
    agent = subprocess.Popen([sys.executable, "-m", "otel_gpu", "run", "--no-cpu-profiling", "--duration",
                              f"{seconds + 120:.0f}", "--output-dir", str(work / "agent"), "--console", "off"],
                             env=env, stdout=subprocess.DEVNULL, stderr=open(work / "agent.err", "w"),
                             preexec_fn=pinned_to(rest))
    time.sleep(3.0)
    procs: list[tuple[str, subprocess.Popen[str]]] = []
    try:
        for k in range(per):
            for mode in MODES:
                how, extra = MODE_SETUP[mode]
                child_env = dict(env, OTEL_GPU_DEBUG_STATS="1", **extra)
                command = [sys.executable, str(work / "child.py"), loop]
                if how == "empty":
                    child_env["CUDA_INJECTION64_PATH"] = str(empty)
                elif how == "inert":
                    child_env["CUDA_INJECTION64_PATH"] = str(inert)
                elif how == "agent":
                    command = [sys.executable, "-m", "otel_gpu", "inject", "--", *command]
                procs.append((mode, subprocess.Popen(command, env=child_env, stdin=subprocess.PIPE,
                                                     stdout=subprocess.PIPE, stderr=open(work / f"{mode}{k}.err", "w"),
                                                     text=True, preexec_fn=pinned_to(workload))))
        for mode, p in procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            if line.strip() != "ready":
                print(f"a {mode} process did not start: {(work / 'agent.err').read_text()[-2000:]}")
                return 1
        time.sleep(5.0)  # the agent discovers and attaches to the I processes
        cycles: list[dict[str, list[float]]] = []
        per_process: dict[int, list[float]] = {i: [] for i in range(len(procs))}
        steps: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}  # each turn's step durations, per mode
        end = time.monotonic() + seconds
        rng = random.Random(7)
        while time.monotonic() < end:
            order = list(range(len(procs)))
            rng.shuffle(order)
            cycle: dict[str, list[float]] = {m: [] for m in MODES}
            for i in order:
                mode, p = procs[i]
                assert p.stdin is not None and p.stdout is not None
                p.stdin.write(f"{slice_s}\n")
                p.stdin.flush()
                turn = json.loads(p.stdout.readline())
                rate = turn["rate"]
                steps[mode].append(turn)
                cycle[mode].append(rate)
                per_process[i].append(rate)
            cycles.append(cycle)
    finally:  # also when a process failed to start: nothing is left running on the device
        for _, p in procs:
            if p.stdin is not None:
                p.stdin.close()
        give_up = time.monotonic() + 60
        for _, p in procs:
            try:
                p.wait(timeout=max(1.0, give_up - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
        agent.terminate()
        agent.wait(timeout=60)

    what = {"tiny": "Launch-bound overhead (tiny kernels)", "matmul": "GPU-bound overhead (large matmuls)",
            "graph": "CUDA graph replays (10 tiny kernels each)",
            "mixed": "CUDA graph replays beside eager launches (10 + 20 tiny kernels per step)",
            "bursty": "Requests after idle time (50 ms idle, then 100 tiny kernels and a synchronize)"}[loop]
    lines = [f"## {what}, processes taking turns (scripts/h200/baton.py)", "",
             f"{len(procs)} {loop} processes ({per} per mode) pinned to CPUs {sorted(workload)}, the agent "
             f"(`otel-gpu run --no-cpu-profiling`) on the others; {len(cycles)} cycles of {slice_s} s slices, "
             "each process once per cycle in a random order.", "",
             f"| mode | median {'matmuls' if loop == 'matmul' else 'kernels'}/s | per-process medians (loss of the mean rate) | "
             "loss vs P (median over cycles) | p25 / p75 of the cycle losses | loss of the mean rate (90 % interval) | "
             "step p50 / p99 ms (median over turns), longest |",
             "|---|---|---|---|---|---|---|"]
    for mode in MODES:
        rates = [r for c in cycles for r in c[mode]]
        losses = cycle_losses(cycles, mode)
        q = statistics.quantiles(losses, n=4) if len(losses) >= 4 else [float("nan")] * 3
        medians = [f"{statistics.median(per_process[i]):.0f} ({process_loss(cycles, per_process[i]) * 100:+.1f} %)"
                   for i, (m, _) in enumerate(procs) if m == mode]
        mean, low, high = mean_loss(cycles, mode)
        lines.append(f"| {mode} | {statistics.median(rates):.0f} | {' / '.join(medians)} | "
                     f"{statistics.median(losses) * 100:+.2f} % | {q[0] * 100:+.2f} % / {q[2] * 100:+.2f} % | "
                     f"{mean * 100:+.2f} % ({low * 100:+.2f} / {high * 100:+.2f}) | {step_latency(steps[mode])} |")
    lines += ["", "The library's lines on stderr, processes with the agent attached:"]
    for mode in MODES:
        for k in range(per):
            if MODE_SETUP[mode][0] == "agent":
                text = [ln for ln in (work / f"{mode}{k}.err").read_text().strip().splitlines()
                        if "stats" in ln and "graphs:" not in ln and "GOT slots" not in ln]
                lines.append(f"- {mode}{k}: {' | '.join(text) if text else '(nothing on stderr)'}")
    lines.append(f"- agent stderr tail: {' | '.join((work / 'agent.err').read_text().strip().splitlines()[-3:])}")
    write_report(out, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

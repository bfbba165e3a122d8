# SPDX-License-Identifier: Apache-2.0
"""Cost of GPU-time profiling that this machine can measure (root, BTF, uprobes; no GPU): the real injected library
on the fake CUDA driver and fake CUPTI, with the agent's real eBPF program attached.

Reports, side by side in one run:
  1. a launch-bound loop (the fake workload's ``--tiny``: launches cost ~0.2 us here, 40x cheaper than a real
     driver's, so recording one inside a window is ~50x the launch itself - the hardest case for the budget):
     launches per second plain against injected with the agent attached, in alternating rounds; the loss, the
     sampling fraction the library chose and the budget it aimed at;
  2. the agent side: records per second through GPUTimeSource (decode, join, re-weight, accumulate) and the drain,
     from launch + kernel + window records of known shape, and the agent's CPU while the workload of (1) ran;
  3. (--graph-runs N) clustered graph work: the fake workload's ``--graph-phases`` (blocks of 30 ms of graph replays
     and of eager launches taking turns, longer than a window; each replay's kernels vary in length) run N times;
     each run's graph GPU time as the agent estimates it from the library's records, weighted by the exact replay
     counts and by windows, over the truth (the fake driver's schedule), and the spread of each over the runs;
  4. the library's cost per counted replay (graphs.c alone, built here: one thread, and two threads replaying the
     same exec), to set against a graph launch's own cost;
  5. (--pace-runs N) a program that runs slower inside windows (each recorded driver call 800 us slower, as
     tests/cuda/test_native_inject.py's pace test): its matmul kernels' GPU time estimated over the truth with the
     windows weighted by time alone, by the pace from waits and by the pace from launches (ABI 6), side by side.
  7. (--linger-runs N) a launch-bound program that replays a graph and launches eagerly in turn (the fake workload's
     ``--mixed``, scripts/h200/graphs.py's program: launches 3x slower while recorded), with CUPTI's records handed
     over at once and 20 ms late (the library lingers after each window until they come): the eager kernels' GPU time
     estimated / true with the lingers weighted by their own launches (ABI 7) and as undisturbed time (before), side
     by side from the same records.

The targets of the issue are for a real GPU (scripts/h200/verify_gpu_time.py, docs/benchmarks.md); this measures
the library's budget controller and the agent's own cost where no GPU is.

Run (as root, after make build): .venv/bin/python bench/bench_gpu_time.py [--rounds 4] [--launches 12000000]
    [--graph-runs 8 --graph-blocks 120 --graph-window-ms 20 --graph-budget 0.02 --graph-jitter 0.2] [--skip-loss]
    [--pace-runs 5] [--linger-runs 3]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from otel_gpu.cuda import abi  # noqa: E402
from otel_gpu.cuda.source import GPUTimeSource  # noqa: E402

LIBRARY = REPO / "otel_gpu" / "cuda" / "native" / "libotel_gpu_inject.so"
FAKES = REPO / "tests" / "native" / "cuda"


def launch_rate(launches: int, inject: bool, budget: float) -> tuple[float, int]:
    """(launches per second, pid) of one run of the fake launch-bound loop."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_GPU_", "CUDA_INJECTION"))}
    env.update(FAKE_CUDA_SCHEDULE="", OTEL_GPU_CUPTI_PATH=str(FAKES / "libcupti.so"),
               OTEL_GPU_OVERHEAD_BUDGET=str(budget))
    if inject:
        env["CUDA_INJECTION64_PATH"] = str(LIBRARY)
    proc = subprocess.Popen([str(FAKES / "workload"), "--tiny", str(launches)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    out, _ = proc.communicate(timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"the fake workload exited {proc.returncode}")
    # the loop's own time: process start-up and exit (the library's bounded exit drain) are one-off costs
    match = re.search(r"tiny_launches (\d+) seconds ([\d.]+)", out)
    if match is None:
        raise RuntimeError(f"the fake workload did not report its loop time: {out[-300:]!r}")
    return int(match.group(1)) / float(match.group(2)), proc.pid


def part1(rounds: int, launches: int, budget: float) -> dict[str, object]:
    source = GPUTimeSource(rescan_interval_s=0.05, full_rescan_s=0.05)
    source.open()
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    wall0 = time.monotonic()
    plain: list[float] = []
    injected: list[float] = []
    fractions: list[float] = []
    try:
        for mode in ("plain", "injected", "injected", "plain") * (rounds // 2):
            rate, pid = launch_rate(launches, mode == "injected", budget)
            (injected if mode == "injected" else plain).append(rate)
            time.sleep(0.2)
            source.poll_now()
            fractions += [c.covered_ns / c.elapsed_ns for c in source.process_counters()
                          if c.info.pid == pid and c.elapsed_ns]
            source.drain()
    finally:
        source.close()
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    agent_cpu = (cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime) / (time.monotonic() - wall0)
    return {"plain": plain, "injected": injected, "fractions": fractions, "agent_cpu": agent_cpu}


def part2(count: int) -> dict[str, float]:
    """Records per second through GPUTimeSource.handle and drain (no symbolization: the stacks are unknown pcs of
    a process directory without maps, so frames come out as addresses, as for a process that is gone)."""
    with tempfile.TemporaryDirectory() as proc:
        pid = 4242
        Path(proc, str(pid)).mkdir()
        source = GPUTimeSource(proc_root=proc)
        stacks = [abi.Stack(native=tuple(0x400000 + 16 * ((i * 7 + d) % 64) for d in range(16))) for i in range(32)]
        records: list[abi.Record] = []
        for i in range(count):
            window = i // 500 + 1
            records.append(abi.Launch(pid, pid, "bench", abi.LAUNCH_KERNEL, i + 1, 307, window, i, 0,
                                      stacks[i % len(stacks)]))
            records.append(abi.Activity(pid, abi.ACTIVITY_KERNEL, i + 1, 1000 * i, 1000 * i + 500, 0, 7, 0,
                                        f"_Z6kernel{i % 8}v", 0, 0, 0, 0))
            if i % 500 == 499:
                records.append(abi.Window(pid, window, 0, 0, window * 1_000_000, window * 50_000_000, 500, 0, 0))
        started = time.perf_counter()
        for record in records:
            source.handle(record)
        handled = time.perf_counter() - started
        started = time.perf_counter()
        batches = source.drain()
        drained = time.perf_counter() - started
    samples = sum(len(p.samples) for b in batches for p in b.processes)
    return {"records_per_s": len(records) / handled, "launches_per_s": count / handled, "drain_s": drained,
            "stacks": samples}


def part3(runs: int, blocks: int, window_ms: str, budget: float, jitter: float) -> None:
    from tests.cuda.graph_phases import run

    print(f"3. clustered graph work ({blocks} blocks of 30 ms, graph and eager taking turns), {runs} runs, "
          f"{window_ms} ms windows, budget {budget * 100:g} %, graph kernels +-{jitter * 100:g} % a replay: "
          "graph GPU time estimated / true")
    counts, windows = [], []
    with tempfile.TemporaryDirectory() as work:
        for _ in range(runs):
            got = run(Path(work), blocks=blocks, window_ms=window_ms, budget=str(budget), jitter=jitter)
            counts.append(got.by_counts_ns / got.truth_ns)
            windows.append(got.by_windows_ns / got.truth_ns)
            print(f"   {got.windows:3d} windows, {got.sampled_replays:4d} of {got.replays} replays sampled: "
                  f"by counts {counts[-1]:.4f}, by windows {windows[-1]:.4f}")
    for name, ratios in (("by counts ", counts), ("by windows", windows)):
        spread = statistics.stdev(ratios) if len(ratios) > 1 else float("nan")
        print(f"   {name}: mean {statistics.mean(ratios):.4f}, sd {spread:.4f}, "
              f"range [{min(ratios):.4f}, {max(ratios):.4f}]")


def part5(runs: int) -> None:
    import dataclasses

    from otel_gpu.cuda.join import WindowWeights, pace_ratio
    from tests.cuda.records import decoded_window
    from tests.cuda.test_native_inject import WORKLOAD, run_workload, site_totals

    print(f"5. a program slowed inside windows (800 us a recorded call, a wait every step), {runs} runs: "
          "matmul_kernel's GPU time estimated / true, windows weighted by time, by the pace from waits, by the pace "
          "from launches")
    rows: dict[str, list[float]] = {"time": [], "waits": [], "launches": []}
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as work:
            got = run_workload(LIBRARY, Path(work), [str(WORKLOAD), "--steps", "2400", "--graph-every", "0"],
                               extra_env={"FAKE_CUPTI_TRACE_COST_US": "800", "OTEL_GPU_OVERHEAD_BUDGET": "0.1"})
        windows = [decoded_window(w, 1) for w in got.records.windows]
        no_launches = [dataclasses.replace(w, shadow_launches=0, shadow_launch_ns=0) for w in windows]
        no_pace = [dataclasses.replace(w, shadow_launches=0, shadow_waits=0) for w in windows]
        window_of = {la.correlation_id: la.window_id for la in got.records.launches}
        kernels = [a for a in got.records.activities if a.name == b"matmul_kernel"]
        truth = site_totals(got.stdout)["matmul_kernel"][1]
        line = []
        for name, series in (("time", no_pace), ("waits", no_launches), ("launches", windows)):
            weights = WindowWeights()
            weight = {w.window_id: weights.add(w)[0] for w in series}
            estimate = sum((a.end_ns - a.start_ns) * weight[window_of[a.correlation_id]] for a in kernels)
            rows[name].append(estimate / truth)
            line.append(f"{name} {rows[name][-1]:.3f} (pace {pace_ratio(series[-1]):.3f})")
        print(f"   {len(windows)} windows: " + ", ".join(line))
    print("   means: " + ", ".join(f"{name} {statistics.mean(values):.3f}" for name, values in rows.items()))


def part6(runs: int, budget: str) -> None:
    from collections import Counter

    from otel_gpu.cuda import abi
    from otel_gpu.cuda.accounting import GPUTimeAccounting
    from otel_gpu.cuda.join import GPUWork
    from otel_gpu.cuda.stacks import StackFrames
    from tests.cuda.graph_phases import debug_records
    from tests.cuda.test_native_inject import WORKLOAD, run_workload, site_totals
    from tests.cuda.test_source_records import FakeSymbolizer

    print(f"6. the time after a process's last window: the fake workload (eager matmul/relu, a graph every 2nd step), "
          f"20 ms windows, budget {float(budget) * 100:g} %, {runs} runs, a drain after every window record; GPU time "
          "estimated / true over the whole run, without and with the library's record of its totals at exit")
    rows: dict[str, list[float]] = {}
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as work:
            got = run_workload(LIBRARY, Path(work), [str(WORKLOAD), "--steps", "600", "--graph-every", "2"],
                               extra_env={"OTEL_GPU_WINDOW_MS": "20", "OTEL_GPU_OVERHEAD_BUDGET": budget})
            records = debug_records(Path(work) / "records.bin", pid=1)
        truth = site_totals(got.stdout)
        last = records[-1] if isinstance(records[-1], abi.Window) and records[-1].start_ns == records[-1].end_ns \
            else None
        line = []
        for label, series in (("without", [r for r in records if r is not last]), ("with", records)):
            accounting = GPUTimeAccounting(_Named(), StackFrames(FakeSymbolizer()), lambda pid: True)
            by_kernel: Counter[str] = Counter()

            def observe(work: GPUWork, weight: float, into: Counter[str] = by_kernel) -> None:
                into[work.activity.name] += work.activity.duration_ns * weight

            accounting.observe_work(observe)
            for record in series:
                accounting.handle(record)
                if isinstance(record, abi.Window):
                    accounting.drain(now_ns=record.end_ns)
            accounting.drain(now_ns=1 << 62, final=True)
            for kernel in ("matmul_kernel", "graph_a_kernel"):
                rows.setdefault(f"{kernel} {label}", []).append(by_kernel[kernel] / truth[kernel][1])
            line.append(f"{label}: matmul {rows[f'matmul_kernel {label}'][-1]:.3f}, graph "
                        f"{rows[f'graph_a_kernel {label}'][-1]:.3f} ({accounting.graph_replays_not_sampled} "
                        "replays not sampled)")
        windows = sum(1 for r in records if isinstance(r, abi.Window))
        print(f"   {windows} records, {'ends between windows' if last else 'ends in a window'}: " + "; ".join(line))
    print("   means: " + ", ".join(f"{name} {statistics.mean(values):.3f}" for name, values in rows.items()))


class _Named:
    def info(self, pid: int) -> object:
        from otel_gpu.procfs import ProcessInfo

        return ProcessInfo(pid, "workload")


COUNT_BENCH = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "graphs.h"
static long n;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
static void *replay(void *arg) {
    for (long i = 0; i < n; i++) graphs_count(0x7f0000001000ull + 0x100 * (uint64_t)(uintptr_t)arg);
    return NULL;
}
int main(int argc, char **argv) {
    n = atol(argv[1]);
    double t0 = now(); replay(0); double alone = now() - t0; /* the only exec */
    for (uintptr_t e = 0; e < 63; e++) graphs_count(0x7f0000002000ull + 0x40 * e); /* 64 execs: a full table */
    t0 = now(); replay((void *)1); double one = now() - t0; /* the 65th exec: probes the whole table, then "other" */
    pthread_t a, b; t0 = now();
    pthread_create(&a, NULL, replay, 0); pthread_create(&b, NULL, replay, 0);
    pthread_join(a, NULL); pthread_join(b, NULL);
    printf("%.2f %.2f %.2f\n", alone / n * 1e9, one / n * 1e9, (now() - t0) / n * 1e9);
    return 0;
}
"""


def part7(runs: int) -> None:
    from tests.cuda.graph_phases import mixed

    print(f"7. a launch-bound program of graph replays and eager launches in turn, {runs} runs per delivery delay: "
          "the eager kernels' GPU time estimated / true, lingers weighted by their own launches | as undisturbed time")
    for delay_us in (0, 20_000):
        rows: list[tuple[float, float]] = []
        for _ in range(runs):
            with tempfile.TemporaryDirectory() as work:
                got = mixed(Path(work), iterations=1000, delivery_delay_us=delay_us)
            truth = got.truth_ns["tiny_kernel"]
            rows.append((got.estimate_ns["tiny_kernel"] / truth, got.unlingered_ns["tiny_kernel"] / truth))
            print(f"   records {delay_us / 1000:g} ms late: {got.windows} windows, lingering "
                  f"{got.linger_ns / 1e9:.2f} s, pace {got.pace:.2f}: {rows[-1][0]:.3f} | {rows[-1][1]:.3f}")
        print(f"   records {delay_us / 1000:g} ms late, means: {statistics.mean(r[0] for r in rows):.3f} | "
              f"{statistics.mean(r[1] for r in rows):.3f}")


def part4(replays: int) -> None:
    native = REPO / "otel_gpu" / "cuda" / "native"
    with tempfile.TemporaryDirectory() as work:
        source, binary = Path(work) / "count.c", Path(work) / "count"
        source.write_text(COUNT_BENCH)
        subprocess.run(["cc", "-O2", "-std=c11", "-D_GNU_SOURCE", f"-I{native}", str(source), str(native / "graphs.c"),
                        "-o", str(binary), "-lpthread"], check=True)
        alone, full, two = (float(x) for x in subprocess.run([str(binary), str(replays)], check=True,
                                                             capture_output=True, text=True).stdout.split())
    print(f"4. cost per counted replay (graphs_count): {alone:.1f} ns (one exec in the table), {full:.1f} ns (an exec "
          f"beyond a full table: every slot looked at), {two:.1f} ns per replay per thread with two threads "
          "replaying one exec")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4, help="rounds per mode (even; P I I P order)")
    parser.add_argument("--launches", type=int, default=12_000_000, help="launches per round")
    parser.add_argument("--budget", type=float, default=0.02, help="the library's overhead budget (fraction)")
    parser.add_argument("--records", type=int, default=200_000, help="launches fed to GPUTimeSource in part 2")
    parser.add_argument("--graph-runs", type=int, default=0, help="part 3: runs (0: skipped)")
    parser.add_argument("--graph-blocks", type=int, default=120, help="part 3: blocks of 30 ms per run")
    parser.add_argument("--graph-window-ms", default="20", help="part 3: the library's window length")
    parser.add_argument("--graph-budget", type=float, default=0.02, help="part 3: the overhead budget (fraction)")
    parser.add_argument("--graph-jitter", type=float, default=0.2,
                        help="part 3: each graph kernel's time varies by up to this fraction a replay")
    parser.add_argument("--skip-loss", action="store_true", help="skip parts 1 and 2")
    parser.add_argument("--pace-runs", type=int, default=0, help="part 5: runs (0: skipped)")
    parser.add_argument("--tail-runs", type=int, default=0, help="part 6: runs (0: skipped)")
    parser.add_argument("--tail-budget", default="0.02", help="part 6: the overhead budget (fraction)")
    parser.add_argument("--linger-runs", type=int, default=0, help="part 7: runs per delivery delay (0: skipped)")
    args = parser.parse_args()
    for path in (LIBRARY, FAKES / "workload", FAKES / "libcupti.so"):
        if not path.exists():
            print(f"{path} is missing: run make build", file=sys.stderr)
            return 1
    if args.graph_runs > 0:
        part3(args.graph_runs, args.graph_blocks, args.graph_window_ms, args.graph_budget, args.graph_jitter)
    if args.pace_runs > 0:
        part5(args.pace_runs)
    if args.tail_runs > 0:
        part6(args.tail_runs, args.tail_budget)
    if args.linger_runs > 0:
        part7(args.linger_runs)
    part4(20_000_000)
    if args.skip_loss:
        return 0
    one = part1(max(2, args.rounds), args.launches, args.budget)
    plain, injected = statistics.median(one["plain"]), statistics.median(one["injected"])  # type: ignore[arg-type]
    print("1. launch-bound loop on the fake CUDA stack (launches/s; rounds P I I P)")
    print(f"   plain    {' / '.join(f'{r:,.0f}' for r in one['plain'])}  median {plain:,.0f}")  # type: ignore[union-attr]
    print(f"   injected {' / '.join(f'{r:,.0f}' for r in one['injected'])}  median {injected:,.0f}")  # type: ignore[union-attr]
    print(f"   loss {(1 - injected / plain) * 100:+.2f} % with the agent attached (budget {args.budget * 100:g} %); "
          f"sampling fraction per injected run: {', '.join(f'{f:.4f}' for f in one['fractions'])}; "  # type: ignore[union-attr]
          f"agent CPU {one['agent_cpu'] * 100:.1f} % of one core")  # type: ignore[operator]
    two = part2(args.records)
    print("2. agent side: GPUTimeSource.handle + drain")
    print(f"   {two['launches_per_s']:,.0f} sampled launches/s ({two['records_per_s']:,.0f} records/s: launch + kernel "
          f"+ window); drain of {two['stacks']} stacks {two['drain_s'] * 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())

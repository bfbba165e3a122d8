# SPDX-License-Identifier: Apache-2.0
"""Cost of GPU-time profiling that this machine can measure (root, BTF, uprobes; no GPU): the real injected library
on the fake CUDA driver and fake CUPTI, with the agent's real eBPF program attached.

Reports, side by side in one run:
  1. a launch-bound loop (the fake workload's ``--tiny``: launches cost ~0.2 us here, 40x cheaper than a real
     driver's, so recording one inside a window is ~50x the launch itself - the hardest case for the budget):
     launches per second plain against injected with the agent attached, in alternating rounds; the loss, the
     sampling fraction the library chose and the budget it aimed at;
  2. the agent side: records per second through GPUTimeSource (decode, join, re-weight, accumulate) and the drain,
     from launch + kernel + window records of known shape, and the agent's CPU while the workload of (1) ran.

The targets of the issue are for a real GPU (scripts/h200/verify_gpu_time.py, docs/benchmarks.md); this measures
the library's budget controller and the agent's own cost where no GPU is.

Run (as root, after make build): .venv/bin/python bench/bench_gpu_time.py [--rounds 4] [--launches 12000000]
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4, help="rounds per mode (even; P I I P order)")
    parser.add_argument("--launches", type=int, default=12_000_000, help="launches per round")
    parser.add_argument("--budget", type=float, default=0.02, help="the library's overhead budget (fraction)")
    parser.add_argument("--records", type=int, default=200_000, help="launches fed to GPUTimeSource in part 2")
    args = parser.parse_args()
    for path in (LIBRARY, FAKES / "workload", FAKES / "libcupti.so"):
        if not path.exists():
            print(f"{path} is missing: run make build", file=sys.stderr)
            return 1
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

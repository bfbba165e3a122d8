# SPDX-License-Identifier: Apache-2.0
"""Two builds of the CPU sampler's BPF program side by side: run time per sample (kernel.bpf_stats_enabled).

For a change to cpu_profiler.bpf.c: build the old tree's object somewhere (``git archive`` of the old commit, copy
``programs/vmlinux.h`` in, ``make -C otel_gpu/ebpf``), then compare it with the new one. Phases alternate
(before, after, before, ...), each loading one object alone at 999 Hz on every CPU while ``cpu_3to1`` spins, so load
on the machine falls on both alike; the medians are printed with every phase (on a shared machine the spread between
phases is larger than most changes: read the phases, not only the medians). No drain: the two objects' map layouts
may differ, only the program's run time is read.

Run (root): .venv/bin/python bench/bench_sampler_objects.py --before OLD.bpf.o [--after NEW.bpf.o]
            [--seconds 4] [--phases 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _bpfstats import program_stats  # this script's folder is on sys.path

REPO = Path(__file__).resolve().parent.parent
WORKLOADS = REPO / "tests" / "native" / "workloads"
sys.path.insert(0, str(REPO))


def phase(path: str, seconds: float) -> tuple[float, int]:
    """(ns per run, runs) of ``path``'s on_cpu_sample over ``seconds`` with cpu_3to1 spinning."""
    from otel_gpu.ebpf.loader import BPFObject

    burner = subprocess.Popen([str(WORKLOADS / "cpu_3to1"), str(seconds + 5)], stdout=subprocess.DEVNULL)
    bpf = BPFObject(path, max_entries={"unwind_rows": 1})
    try:
        bpf.attach_perf_event("on_cpu_sample", 999)
        program_id = bpf.program_ids()["on_cpu_sample"]
        time.sleep(0.5)
        run0, count0 = program_stats(program_id)
        time.sleep(seconds)
        run1, count1 = program_stats(program_id)
        return (run1 - run0) / max(1, count1 - count0), count1 - count0
    finally:
        bpf.close()
        burner.kill()
        burner.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="the old cpu_profiler.bpf.o")
    parser.add_argument("--after", default=str(REPO / "otel_gpu" / "ebpf" / "programs" / "cpu_profiler.bpf.o"))
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds per phase")
    parser.add_argument("--phases", type=int, default=5, help="phases of each object")
    args = parser.parse_args(argv)
    stats = Path("/proc/sys/kernel/bpf_stats_enabled")
    previous = stats.read_text().strip()
    stats.write_text("1")
    results: dict[str, list[float]] = {"before": [], "after": []}
    try:
        for _ in range(args.phases):
            for name, values in results.items():
                ns, runs = phase(getattr(args, name), args.seconds)
                if runs:
                    values.append(ns)
    finally:
        stats.write_text(previous)
    for name, values in results.items():
        if values:
            print(f"{name:>6}: median {statistics.median(values):.0f} ns per sample "
                  f"(phases: {', '.join(f'{x:.0f}' for x in values)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

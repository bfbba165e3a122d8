# SPDX-License-Identifier: Apache-2.0
"""Run THERE: what each NVML reading of one GPU-metrics cycle costs on the real driver (CPU and wall time per call,
median of ``--cycles`` cycles), to find the readings that dominate the NVML source's own cost.

Usage: nvml_cycle_cost.py OUT.md [--cycles 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from otel_gpu.gpu import _nvml as nvml  # noqa: E402
from otel_gpu.gpu.reader import GPUReader, read_info  # noqa: E402
from otel_gpu.procfs import ProcessResolver  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--cycles", type=int, default=20)
    args = parser.parse_args()
    nvml.init()
    handle = nvml.device_handle(0)
    reader = GPUReader(read_info(0, handle), handle, ProcessResolver(), per_process=True)
    costs: dict[str, list[tuple[int, int]]] = defaultdict(list)
    plain_get = reader._get

    def timed_get(reading, call, *a, **k):  # type: ignore[no-untyped-def]
        cpu0, wall0 = time.thread_time_ns(), time.perf_counter_ns()
        try:
            return plain_get(reading, call, *a, **k)
        finally:
            costs[reading].append((time.thread_time_ns() - cpu0, time.perf_counter_ns() - wall0))

    reader._get = timed_get  # type: ignore[method-assign]
    for method in ("_pcie_io", "_gpm", "_processes", "_nvlink_readings", "_static_limits"):
        plain = getattr(reader, method)

        def timed(*a, _plain=plain, _name=method, **k):  # type: ignore[no-untyped-def]
            return timed_get(_name, lambda: _plain(*a, **k))
        setattr(reader, method, timed)
    cycle_costs = []
    for _ in range(args.cycles):
        cpu0, wall0 = time.thread_time_ns(), time.perf_counter_ns()
        reader.read()
        cycle_costs.append((time.thread_time_ns() - cpu0, time.perf_counter_ns() - wall0))
        time.sleep(0.2)
    lines = [f"# NVML cost per reading ({args.cycles} cycles, median; ms)", "",
             f"whole cycle: CPU {statistics.median(c for c, _ in cycle_costs) / 1e6:.2f}, "
             f"wall {statistics.median(w for _, w in cycle_costs) / 1e6:.2f}", "",
             "| reading | CPU ms | wall ms | calls per cycle |", "|---|---:|---:|---:|"]
    for reading, samples in sorted(costs.items(), key=lambda kv: -statistics.median(c for c, _ in kv[1])):
        lines.append(f"| {reading} | {statistics.median(c for c, _ in samples) / 1e6:.3f} | "
                     f"{statistics.median(w for _, w in samples) / 1e6:.3f} | {len(samples) / args.cycles:.0f} |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

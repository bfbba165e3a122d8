# SPDX-License-Identifier: Apache-2.0
"""`make bench`: every benchmark of this machine in turn, each printing its side-by-side numbers.

The eBPF benchmarks need root (and BTF); without it they are listed as not run, and the command exits 1.
GPU-machine numbers come from scripts/h200/ (docs/benchmarks.md says which command gave which).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
RUNS = [("NVML metrics (fake libnvidia-ml)", ["bench_nvml.py"], False),
        ("eBPF CPU profiling", ["bench_cpu_profiler.py", "--seconds", "20"], True),
        ("GPU-time profiling (fake CUDA stack)", ["bench_gpu_time.py"], True),
        ("Cost of the whole agent, per source and scenario", ["bench_cost.py"], True),
        ("Native unwinding from .eh_frame", ["bench_unwind.py"], True)]


def main() -> int:
    failed = []
    root = os.geteuid() == 0 and Path("/sys/kernel/btf/vmlinux").exists()
    for title, argv, needs_root in RUNS:
        print(f"=== {title}: {' '.join(argv)}", flush=True)
        if needs_root and not root:
            print("    not run: needs root and a kernel with BTF")
            failed.append(title)
            continue
        if subprocess.run([sys.executable, str(BENCH / argv[0]), *argv[1:]], check=False).returncode != 0:
            failed.append(title)
    if failed:
        print(f"not run or failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

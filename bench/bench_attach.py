# SPDX-License-Identifier: Apache-2.0
"""How long after a process initialises CUDA the GPU-time source starts seeing it: the real injected library on the
fake CUDA driver and fake CUPTI, the agent's real eBPF program attached by GPUTimeProbes with the agent's scan
periods (/proc listed every 2 s, a new process read at the next scan, every process again from 10 s, backing off).

Two ways of attaching, side by side in one run:
  scan   only the /proc scan finds library files (what the agent did before issue 16: ``library_paths=[]``);
  known  the packaged library file is attached at open, before any process maps it (the agent's default now).
Two workloads each: ``fresh`` initialises CUDA as soon as it starts; ``late`` is a process the scan has already read
before it loads the library (``sh -c 'sleep 2.5; exec workload'``, the same pid), as a Python program that imports
for seconds before its first CUDA call is.

The library records every blocking wait while attached (budget 1.0 keeps one in one), and the workload waits once a
step on its stream, so the steps whose wait was not seen are the steps run before the agent attached; the latency is
the first seen wait's start less the time the process initialised CUDA (its start, plus the sleep for ``late``).

Run (as root, after make build): .venv/bin/python bench/bench_attach.py [--steps 2400]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from otel_gpu.cuda import abi  # noqa: E402
from otel_gpu.cuda.probes import GPUTimeProbes  # noqa: E402

LIBRARY = REPO / "otel_gpu" / "cuda" / "native" / "libotel_gpu_inject.so"
FAKES = REPO / "tests" / "native" / "cuda"
LATE_S = 2.5


def run(mode: str, workload: str, steps: int) -> tuple[int, float | None]:
    """(steps whose wait was not seen, attach latency in ms or None when nothing was seen)."""
    waits: list[abi.Sync] = []
    probes = GPUTimeProbes(lambda r: waits.append(r) if isinstance(r, abi.Sync) else None, lambda pids: None,
                           library_paths=[] if mode == "scan" else None, rescan_interval_s=2.0, full_rescan_s=10.0)
    probes.open()
    env = dict(os.environ, CUDA_INJECTION64_PATH=str(LIBRARY), OTEL_GPU_CUPTI_PATH=str(FAKES / "libcupti.so"),
               OTEL_GPU_OVERHEAD_BUDGET="1.0")
    command = [str(FAKES / "workload"), "--steps", str(steps)]
    delay = 0.0
    if workload == "late":
        delay = LATE_S
        command = ["sh", "-c", f'sleep {LATE_S}; exec "$0" "$@"', *command]
    try:
        started = time.time_ns()
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
        if process.wait() != 0:
            raise SystemExit(f"workload failed: {process.returncode}")
        time.sleep(0.3)
        probes.poll_now()
    finally:
        probes.close()
    ours = [w for w in waits if w.pid == process.pid]  # other injected processes on the machine may be seen too
    steps_seen = sum(1 for w in ours if w.kind == abi.SYNC_STREAM)
    if not ours:
        return steps, None
    return steps - steps_seen, (min(w.start_ns for w in ours) - started) / 1e6 - delay * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2400, help="workload steps (~5 ms each here)")
    args = parser.parse_args()
    print(f"workload: {args.steps} steps, one stream wait each; agent scan every 2 s (new processes read at the next), "
          "each process again from 10 s on")
    print(f"{'workload':<8} {'attach':<6} {'steps missed':>12} {'latency ms':>11}")
    for workload in ("fresh", "late"):
        for mode in ("scan", "known"):
            missed, latency = run(mode, workload, args.steps)
            shown = "never" if latency is None else f"{latency:.0f}"
            print(f"{workload:<8} {mode:<6} {missed:>12} {shown:>11}")


if __name__ == "__main__":
    main()

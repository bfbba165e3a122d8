# SPDX-License-Identifier: Apache-2.0
"""The GPU-time probes thread's own CPU while it waits for injected processes, in process (issue 12).

Opens :class:`otel_gpu.cuda.probes.GPUTimeProbes` as the agent does (the packaged library attached up front, scans
every 2 s, re-reads from 10 s) inside one of bench_cost.py's scenarios and reads its thread's CPU time from
/proc/self/task/TID/stat over ``--seconds``, so the other work on the machine does not enter the number. Run it
against two trees (``PYTHONPATH=tree``) to compare changes side by side.

Run (as root, after make build): .venv/bin/python bench/bench_probes_idle.py [--scenario node] [--seconds 30]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_cost  # noqa: E402  (bench/ is not a package)

# bench_cost put this tree first; PYTHONPATH (another tree) goes before it
sys.path[:0] = [path for path in os.environ.get("PYTHONPATH", "").split(":") if path]


def thread_cpu_s(tid: int) -> float:
    from otel_gpu.selfcost import task_cpu_s

    return task_cpu_s(Path(f"/proc/self/task/{tid}/stat").read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", default="node", choices=list(bench_cost.TARGETS))
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    from otel_gpu.cuda import probes as probes_module

    probes = probes_module.GPUTimeProbes(lambda record: None, lambda pids: None)
    with bench_cost.scenario(args.scenario) as stats:
        probes.open()
        try:
            thread = probes._thread
            assert thread is not None and thread.native_id is not None
            time.sleep(3.0)  # the first scan of what already runs is start-up
            began, cpu0 = time.monotonic(), thread_cpu_s(thread.native_id)
            churned0 = stats["churned"]
            time.sleep(args.seconds)
            elapsed, cpu = time.monotonic() - began, thread_cpu_s(thread.native_id) - cpu0
            churned = stats["churned"] - churned0
            processes = len([entry for entry in os.listdir("/proc") if entry.isdigit()])
        finally:
            probes.close()
    print(f"{probes_module.__file__}: scenario {args.scenario}, {args.seconds:g} s, "
          f"{churned / elapsed:.1f} new processes/s, {processes} processes: "
          f"probes thread {100 * cpu / elapsed:.3f} % of one core ({cpu:.2f} CPU-s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

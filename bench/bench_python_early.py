# SPDX-License-Identifier: Apache-2.0
"""The agent CPU that reading new Python stacks' code objects early costs (while their processes run, on the
sampler's event thread: ``CPUProfileSource._on_new_python_stacks``), charged to that thread (``time.thread_time()``),
so the number holds on a loaded machine where the agent's total over wall time is mostly noise.

The real sampler, every process, FREQUENCY Hz for SECONDS: one long pure-Python workload (tests/cpu/py_chain.py)
and, each second, a new short Python process (imports json, email and http.client, then spins 0.3 s and exits: the
case the early reading is for), with a drain every second.

    python bench/bench_python_early.py [--frequency-hz 19] [--seconds 20]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from otel_gpu.config import ProfilingConfig
from otel_gpu.cpu.source import CPUProfileSource
from otel_gpu.procfs import ProcessResolver

WORKLOAD = Path(__file__).resolve().parents[1] / "tests" / "cpu" / "py_chain.py"
SHORT_JOB = "import json, email, http.client\nimport time\nend = time.time() + 0.3\nwhile time.time() < end: pass"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frequency-hz", type=int, default=19)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    source = CPUProfileSource(ProfilingConfig(frequency_hz=args.frequency_hz), ProcessResolver())
    spent_s, hand_overs, stacks = 0.0, 0, 0
    read_early = source._on_new_python_stacks

    def timed(ids_by_pid: dict[int, list[int]]) -> None:
        nonlocal spent_s, hand_overs, stacks
        started = time.thread_time()
        read_early(ids_by_pid)
        spent_s += time.thread_time() - started
        hand_overs += 1
        stacks += sum(len(ids) for ids in ids_by_pid.values())

    source.sampler._on_new_python_stacks = timed
    source.open()
    work = subprocess.Popen([sys.executable, str(WORKLOAD), "one", "1000000", "200000"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert work.stdin is not None and work.stdout is not None
    jobs: list[subprocess.Popen[bytes]] = []
    try:
        work.stdout.readline()
        work.stdin.write("go\n")
        work.stdin.flush()
        started = time.monotonic()
        while time.monotonic() - started < args.seconds:
            time.sleep(1)
            jobs.append(subprocess.Popen([sys.executable, "-c", SHORT_JOB]))
            source.drain()
    finally:
        work.kill()
        work.wait()
        for job in jobs:
            job.wait()
        source.drain()
        source.close()
    print(f"{args.frequency_hz} Hz, {args.seconds:g} s, {len(jobs)} short jobs: early reads {spent_s * 1000:.1f} ms "
          f"of agent CPU ({spent_s / args.seconds * 100:.3f} % of one core) in {hand_overs} hand-overs, {stacks} new "
          f"stacks ({spent_s / max(1, stacks) * 1e6:.0f} us each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

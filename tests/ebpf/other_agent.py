# SPDX-License-Identifier: Apache-2.0
"""Another otel-gpu instance for the tests to run beside: loads every one of our BPF objects through the loader,
samples with the CPU profiler as an agent does, prints ``ready PID ID...`` and holds them until stdin closes.

Run as ``python -m tests.ebpf.other_agent``; the ``other_agent`` fixture (tests/conftest.py) starts it."""

from __future__ import annotations

import os
import sys

from otel_gpu.ebpf.loader import BPFObject, program_path


def main() -> None:
    objects = [BPFObject(program_path("cpu_profiler"), rodata={"self_tgid": os.getpid()}),
               BPFObject(program_path("probe_counter")), BPFObject(program_path("gpu_time"))]
    try:
        objects[0].attach_perf_event("on_cpu_sample", frequency_hz=19)
        ids = [i for bpf in objects for i in bpf.program_ids().values()]
        print("ready", os.getpid(), *ids, flush=True)
        sys.stdin.read()  # until the test run closes our stdin (or ends)
    finally:
        for bpf in objects:
            bpf.close()


if __name__ == "__main__":
    main()

# SPDX-License-Identifier: Apache-2.0
"""The real BPF sampler reads an instrumented process's span context: samples inside a span carry the
trace id and the id of its local root (the span with pyroscope.profile.id)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from otel_gpu.cpu.sampler import CPUSampler, StackCount

pytestmark = pytest.mark.usefixtures("other_agent")
WORKLOAD = Path(__file__).parent / "cpu_span_workload.py"


@pytest.mark.root
def test_cpu_samples_inside_a_child_span_carry_its_local_root_and_none_outside() -> None:
    process = subprocess.Popen([sys.executable, str(WORKLOAD)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True)
    assert process.stdin is not None and process.stdout is not None
    sampler = CPUSampler(199, pids=[process.pid])
    samples: list[StackCount] = []
    try:
        assert process.stdout.readline().strip() == "ready"
        sampler.open()
        for _ in range(100):  # until the sampler has found the table (it looks when it first sees the process)
            time.sleep(0.1)
            samples += sampler.drain()
            if sampler.reads_span_context(process.pid):
                break
        assert sampler.reads_span_context(process.pid)
        process.stdin.write("go\n")
        process.stdin.flush()
        while process.poll() is None:
            time.sleep(0.5)
            samples += sampler.drain()
        samples += sampler.drain()
    finally:
        sampler.close()
        process.kill()
    spans = {}
    for line in process.stdout.read().splitlines():
        _, name, span_id, tid, profile_id = line.split()
        spans[span_id] = (name, int(tid), profile_id)
    assert {name for name, _, _ in spans.values()} == {"busy-a", "busy-b", "child-a", "child-b"}
    inside = [s for s in samples if s.span_id]
    outside = [s for s in samples if not s.span_id]
    for s in inside:  # all taken in a child, all labelled with its local root: the span Grafana selects by
        name, tid, profile_id = spans[s.span_id]
        assert name.startswith("busy-") and profile_id == s.span_id and tid == s.tid, s
        assert len(s.trace_id) == 32
    assert {spans[s.span_id][0] for s in inside} == {"busy-a", "busy-b"}
    worker_tids = {tid for _, tid, _ in spans.values()}
    in_span = sum(s.count for s in inside)
    out_of_span = sum(s.count for s in outside if s.tid in worker_tids)
    assert in_span > 20 and out_of_span > 20, (in_span, out_of_span)

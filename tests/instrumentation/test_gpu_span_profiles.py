# SPDX-License-Identifier: Apache-2.0
"""End to end on the GPU side (root + BTF): the instrumented two-thread program on the fake CUDA stack, the real
injected library, USDT probes, eBPF program and GPUTimeSource; gpu_time and sync_wait samples link to
their span's local root."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from otel_gpu.profiles.model import FrameKind, Sample
from otel_gpu.profiles.otlp import encode_otlp
from tests.cuda.test_gpu_time_fake_cuda import FAKES, _run
from tests.instrumentation.test_gpu_span_context import PLACES, SPAN_WORKLOAD, THREADS
from tests.profiles.pyroscope_rules import violations

pytestmark = pytest.mark.root


def _where(sample: Sample) -> tuple[str, str]:
    names = [f.function for f in sample.frames if f.kind == FrameKind.PYTHON]
    return next(PLACES[n] for n in names if n in PLACES), next(THREADS[n] for n in names if n in THREADS)


def test_gpu_time_and_sync_wait_samples_link_to_the_local_root_of_the_span_they_ran_in(tmp_path: Path) -> None:
    command = [sys.executable, str(SPAN_WORKLOAD), str(FAKES / "libcuda.so.1"), str(FAKES / "workload.py"),
               "--steps", "150"]
    pid, batches, _, _, _, stdout, _ = _run(tmp_path, command)
    spans = {}
    for line in stdout.splitlines():
        _, name, trace_id, span_id, _ = line.split()
        spans[span_id] = (name, trace_id)
    seen: set[tuple[str, str]] = set()
    for batch in batches:
        for process in batch.processes:
            assert process.process.pid == pid
            for sample in process.samples:
                place, thread = _where(sample)
                if place:  # labelled with the local root (the outer span), where Grafana looks, from inner too
                    assert spans[sample.span_id] == (f"outer-{thread}", sample.trace_id)
                else:
                    assert (sample.trace_id, sample.span_id) == ("", "")
                seen.add((batch.type.sample_type, place))
        assert violations(encode_otlp(batch)) == []
    kinds = {batch.type.sample_type for batch in batches}
    assert len(kinds) == 2  # gpu_time and sync_wait
    assert seen == {(kind, place) for kind in kinds for place in ("", "outer", "inner")}

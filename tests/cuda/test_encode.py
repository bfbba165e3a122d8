# SPDX-License-Identifier: Apache-2.0
"""GPUTimeSource's batches through the shared encoders: Pyroscope names them gpu:gpu_time:... and
gpu_wait:sync_wait:..., and stacks, values and CUDA attributes survive pprof and OTLP encoding."""

from __future__ import annotations

from pathlib import Path

from otel_gpu.cuda import abi
from otel_gpu.cuda.source import GPUTimeSource
from otel_gpu.procfs import ProcessInfo, ProcessResolver
from otel_gpu.profiles.model import ProfileBatch
from otel_gpu.profiles.otlp import encode_otlp
from otel_gpu.profiles.pprof import encode_pprof
from tests.cuda.records import kernel, launch, stack, sync, window
from tests.cuda.test_source_records import FakeSymbolizer
from tests.profiles import pprof_proto
from tests.profiles.pyroscope_rules import profile_type_ids


class Resolver(ProcessResolver):
    def info(self, pid: int) -> ProcessInfo | None:
        return ProcessInfo(pid, "train", "/usr/bin/train", service_name="trainer")


def _batches(tmp_path: Path) -> list[ProfileBatch]:
    (tmp_path / "10").mkdir()
    source = GPUTimeSource(Resolver(), proc_root=str(tmp_path), symbolizer=FakeSymbolizer())
    source.handle(window(10, 1, covered_ns=100, elapsed_ns=1000))
    python = (abi.PythonFrame("A", "/app/train.py", 12),)
    source.handle(launch(10, 1, stack_=stack(0xA1, python=python)))
    source.handle(kernel(10, 1, 500, device=1, stream=3))
    source.handle(launch(10, 2, kind=abi.LAUNCH_GRAPH, stack_=stack(0xB1)))
    source.handle(kernel(10, 2, 70, name="relu", graph=4))
    source.handle(sync(10, 900, weight=2, stack_=stack(0xC1)))
    return source.drain()


def test_pyroscope_names_both_profiles(tmp_path: Path) -> None:
    gpu, waits = _batches(tmp_path)
    assert profile_type_ids(encode_otlp(gpu)) == ["gpu:gpu_time:nanoseconds:gpu:nanoseconds"]
    assert profile_type_ids(encode_otlp(waits)) == ["gpu_wait:sync_wait:nanoseconds:gpu_wait:nanoseconds"]


def test_pprof_keeps_stacks_values_and_labels(tmp_path: Path) -> None:
    gpu, waits = _batches(tmp_path)
    profile = pprof_proto.decode(encode_pprof(gpu))
    strings = profile.string_table
    assert [(strings[t.type], strings[t.unit]) for t in profile.sample_type] == [("gpu_time", "nanoseconds")]
    assert (strings[profile.period_type.type], strings[profile.period_type.unit]) == ("gpu", "nanoseconds")
    assert pprof_proto.stacks(profile) == {
        ("matmul(float*, float*, float*, int)", "fn_a1", "A"): [5000],
        ("relu", "fn_b1"): [700],
    }
    labels = {(strings[label.key], label.num if not label.str else strings[label.str])
              for sample in profile.sample for label in sample.label}
    assert {("cuda.device", 1), ("cuda.stream", 3), ("cuda.graph", 4)} <= labels
    wait_profile = pprof_proto.decode(encode_pprof(waits))
    assert pprof_proto.stacks(wait_profile) == {("[cuStreamSynchronize]", "fn_c1"): [1800]}

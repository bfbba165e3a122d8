# SPDX-License-Identifier: Apache-2.0
"""ProcessSelection: one rule for every profile source (--pid, --process-name over the executable and its thread
names, --container-id), and the GPU-time source reporting only what it selects."""

from __future__ import annotations

from pathlib import Path

from otel_gpu.config import ProfilingConfig
from otel_gpu.cuda.source import GPUTimeSource
from otel_gpu.procfs import ProcessInfo, ProcessResolver
from otel_gpu.profiles.model import Frame, ProcessProfile, ProfileBatch, Sample, gpu_time_profile_type
from otel_gpu.profiles.source import ProcessSelection
from tests.cuda.records import kernel, launch, window
from tests.cuda.test_source_records import FakeSymbolizer


def _batch() -> ProfileBatch:
    processes = (
        ProcessProfile(ProcessInfo(pid=10, executable_name="python3", container_id="abc123"),
                       (Sample(frames=(Frame("matmul_kernel"),), value=5, thread_name="pt_main_thread"),)),
        ProcessProfile(ProcessInfo(pid=11, executable_name="trainer", container_id="def456"),
                       (Sample(frames=(Frame("relu_kernel"),), value=7),)),
    )
    return ProfileBatch(type=gpu_time_profile_type(), start_unix_nano=1, duration_nano=2, processes=processes)


def _kept(**profiling: object) -> list[int]:
    selection = ProcessSelection(ProfilingConfig(**profiling))  # type: ignore[arg-type]
    return [p.process.pid for p in selection.keep(_batch()).processes]


def test_pid_name_and_container_select_processes() -> None:
    assert _kept() == [10, 11]
    assert _kept(pids=(11,)) == [11]
    assert _kept(process_name="^pyth") == [10]
    assert _kept(container_id="def") == [11]
    assert _kept(pids=(10,), container_id="def") == []


def test_the_name_may_be_any_thread_name() -> None:
    assert _kept(process_name="^pt_main") == [10]
    selection = ProcessSelection(ProfilingConfig(process_name="^loader$"))
    assert selection.selects(ProcessInfo(pid=5, executable_name="python3"), {"loader"})
    assert not selection.selects(ProcessInfo(pid=5, executable_name="python3"), {"worker"})


def test_the_gpu_time_source_reports_only_selected_processes(tmp_path: Path) -> None:
    for pid in (10, 11):
        (tmp_path / str(pid)).mkdir()
    source = GPUTimeSource(ProcessResolver(str(tmp_path)), proc_root=str(tmp_path), symbolizer=FakeSymbolizer(),
                           selection=ProcessSelection(ProfilingConfig(pids=(11,))))
    for pid in (10, 11):
        source.handle(window(pid, 1, covered_ns=10, elapsed_ns=10))
        source.handle(launch(pid, 1, window=1))
        source.handle(kernel(pid, 1, 100))
    gpu, _ = source.drain()
    assert [p.process.pid for p in gpu.processes] == [11]
    assert {c.info.pid for c in source.process_counters()} == {10, 11}  # the metrics still count every process

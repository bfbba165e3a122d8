# SPDX-License-Identifier: Apache-2.0
"""GPUTimeSource's record handling without the kernel: decoded records in, gpu_time/sync_wait batches out."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from otel_gpu import selfmetrics, semconv
from otel_gpu.cuda import abi
from otel_gpu.cuda.source import GPUTimeSource
from otel_gpu.procfs import ProcessResolver
from otel_gpu.profiles.model import Frame, FrameKind, ProfileBatch
from tests.cuda.records import kernel, launch, memcpy, stack, sync, window


class FakeSymbolizer:
    """pc -> frame named f"fn_{pc:x}"; counts what it was asked."""

    def __init__(self) -> None:
        self.remembered: list[int] = []
        self.calls = 0
        self.last_complete = True

    def remember(self, pid: int) -> None:
        self.remembered.append(pid)

    def frames(self, pid: int, pcs: Sequence[int]) -> tuple[Frame, ...]:
        self.calls += 1
        return tuple(Frame(f"fn_{pc:x}", FrameKind.NATIVE, address=pc) for pc in pcs)

    def forget(self, pid: int) -> None:
        pass


@pytest.fixture()
def proc(tmp_path: Path) -> Path:
    for pid in (10, 11):
        (tmp_path / str(pid)).mkdir()
    return tmp_path


def _source(proc: Path) -> tuple[GPUTimeSource, FakeSymbolizer]:
    symbolizer = FakeSymbolizer()
    return GPUTimeSource(ProcessResolver(str(proc)), proc_root=str(proc), symbolizer=symbolizer), symbolizer


def _totals(batch: ProfileBatch) -> dict[tuple[int, tuple[str, ...]], int]:
    return {(p.process.pid, tuple(f.function for f in s.frames)): s.value
            for p in batch.processes for s in p.samples}


def test_weighted_totals_per_stack(proc: Path) -> None:
    source, _ = _source(proc)
    a, b = stack(0xA1, 0xA2), stack(0xB1, 0xB2)
    source.handle(window(10, 1, covered_ns=100, elapsed_ns=1000, launches=3))  # weight 10
    source.handle(launch(10, 1, window=1, stack_=a))
    source.handle(kernel(10, 1, 500))
    source.handle(kernel(10, 2, 70, name="relu"))  # activity before its launch
    source.handle(launch(10, 2, window=1, stack_=b))
    source.handle(launch(10, 3, window=2, stack_=a))  # window 2 still open
    source.handle(kernel(10, 3, 40))
    source.handle(window(10, 2, covered_ns=300, elapsed_ns=1400))  # weight 2
    gpu, waits = source.drain()
    assert gpu.type.sample_type == "gpu_time"
    assert _totals(gpu) == {
        (10, ("matmul(float*, float*, float*, int)", "fn_a1", "fn_a2")): 500 * 10 + 40 * 2,
        (10, ("relu", "fn_b1", "fn_b2")): 700,
    }
    assert gpu.sampling_fraction == pytest.approx(300 / 1400)
    assert waits.processes == ()
    counters = {c.info.pid: c for c in source.process_counters()}
    assert counters[10].kernel_time_ns == 500 * 10 + 40 * 2 + 700
    assert counters[10].launches == 30


def _yielded(batch: ProfileBatch) -> dict[int, float]:
    """Seconds not measured by pid, as each process's profile states them."""
    return {p.process.pid: float(value) for p in batch.processes
            if (value := p.attribute(semconv.OTEL_GPU_GPU_TIME_YIELDED)) is not None}


def test_time_left_to_another_cupti_user_is_stated_in_the_profile(proc: Path) -> None:
    source, _ = _source(proc)
    source.handle(window(10, 1, covered_ns=100, elapsed_ns=1000))
    source.handle(window(10, 2, covered_ns=50, elapsed_ns=500, yielded_ns=2_500_000_000, yields=1))  # taken back
    source.handle(launch(10, 1, window=2))
    source.handle(kernel(10, 1, 500))
    gpu, _ = source.drain()
    assert _yielded(gpu) == {10: 2.5} and gpu.attributes == ()
    assert _totals(gpu) and sum(_totals(gpu).values()) == 500 * 10  # the restarted totals: weight 500 / 50
    source.handle(window(10, 3, covered_ns=100, elapsed_ns=1000, yielded_ns=2_500_000_000, yields=1))
    gpu, _ = source.drain()
    assert _yielded(gpu) == {}  # nothing yielded in this interval


def test_a_process_aside_for_a_whole_interval_is_in_the_batch_with_its_own_time(proc: Path) -> None:
    """No samples at all in an interval the library spent aside: the process is still in the gpu_time batch (the agent
    drops a batch with no processes), stating its own time; another process's time is not summed into it."""
    (proc / "12").mkdir()
    source, _ = _source(proc)
    source.handle(window(10, 1, covered_ns=100, elapsed_ns=1000))
    source.handle(window(12, 1, covered_ns=100, elapsed_ns=1000))
    source.handle(window(10, 2, covered_ns=100, elapsed_ns=1000, yielded_ns=4 * 10**9, yields=1))
    source.handle(window(12, 2, covered_ns=100, elapsed_ns=1000, yielded_ns=1 * 10**9, yields=1))
    gpu, _ = source.drain()
    assert [p.process.pid for p in gpu.processes] == [10, 12]
    assert all(p.samples == () for p in gpu.processes)
    assert _yielded(gpu) == {10: 4.0, 12: 1.0}


def test_time_while_the_library_is_still_aside_is_stated_at_each_drain(proc: Path) -> None:
    """torch keeps its profiler's CUPTI subscription (TEARDOWN_CUPTI=0): the library may stay aside for good. Each
    interval states the time so far; the record of its return settles the rest without counting anything twice."""
    source, _ = _source(proc)
    source.handle(window(10, 1, covered_ns=100, elapsed_ns=1000))
    source.handle(window(10, 2, covered_ns=100, elapsed_ns=1200, aside_since_ns=time.time_ns() - 3 * 10**9))
    gpu, _ = source.drain()
    first = _yielded(gpu)[10]
    assert 3.0 <= first < 4.0
    gpu, _ = source.drain()
    second = _yielded(gpu).get(10, 0.0)
    assert second < 1.0
    source.handle(window(10, 3, covered_ns=50, elapsed_ns=500, yielded_ns=10 * 10**9, yields=1))  # back after 10 s
    gpu, _ = source.drain()
    assert _yielded(gpu)[10] == pytest.approx(10.0 - first - second, abs=1e-6)
    # the per-process metric counts the same seconds, cumulatively
    assert source.process_counters()[0].unmeasured_ns == pytest.approx(10 * 10**9, abs=1000)


def test_work_of_an_open_window_waits_for_it_then_settles(proc: Path) -> None:
    source, _ = _source(proc)
    source.handle(window(10, 1, covered_ns=100, elapsed_ns=400))  # weight 4
    source.handle(launch(10, 1, window=2))
    source.handle(kernel(10, 1, 100))
    assert source.drain()[0].processes == ()  # window 2 not closed yet
    gpu, _ = source.drain()  # second drain: settled with the last known weight
    assert sum(_totals(gpu).values()) == 400


def test_exited_process_loses_nothing_recorded(proc: Path) -> None:
    source, symbolizer = _source(proc)
    source.handle(launch(11, 1, window=5))
    source.handle(kernel(11, 1, 250))
    (proc / "11").rmdir()  # the workload exited before its window closed
    gpu, _ = source.drain()
    assert _totals(gpu) == {(11, ("matmul(float*, float*, float*, int)", "fn_1001")): 250}
    assert 11 in symbolizer.remembered
    assert source.drain()[0].processes == ()


def test_graph_kernels_go_to_the_graph_launch_stack(proc: Path) -> None:
    source, _ = _source(proc)
    source.handle(window(10, 1, covered_ns=10, elapsed_ns=10))
    source.handle(launch(10, 4, window=1, kind=abi.LAUNCH_GRAPH, stack_=stack(0xC0)))
    for name, duration in (("g1", 10), ("g2", 20), ("g1", 30)):
        source.handle(kernel(10, 4, duration, name=name, graph=9))
    gpu, _ = source.drain()
    assert _totals(gpu) == {(10, ("g1", "fn_c0")): 40, (10, ("g2", "fn_c0")): 20}
    assert all(dict(s.attributes)[semconv.CUDA_GRAPH] == 9 for p in gpu.processes for s in p.samples)


def test_sync_waits_weighted_by_their_own_weight(proc: Path) -> None:
    source, _ = _source(proc)
    source.handle(sync(10, 1000, weight=4, stack_=stack(0xD0)))
    source.handle(sync(10, 500, weight=1, stack_=stack(0xD0)))
    source.handle(sync(10, 300, kind=abi.SYNC_CONTEXT, cbid=17, stack_=stack(0xE0), tid=12))
    _, waits = source.drain()
    assert waits.type.sample_type == "sync_wait" and waits.type.period_type == "gpu_wait"
    assert _totals(waits) == {(10, ("[cuStreamSynchronize]", "fn_d0")): 4500,
                              (10, ("[cuCtxSynchronize]", "fn_e0")): 300}
    assert {s.thread_id for p in waits.processes for s in p.samples} == {10, 12}
    assert source.process_counters()[0].sync_wait_ns == 4800


def test_memcpy_leaf_and_kernel_fallback_stack(proc: Path) -> None:
    source, _ = _source(proc)
    source.handle(window(10, 1, covered_ns=10, elapsed_ns=10))
    fallback = abi.Stack(native=(), kernel_native=(0xF1, 0xF2))
    source.handle(launch(10, 1, window=1, kind=abi.LAUNCH_MEMCPY, stack_=fallback))
    source.handle(memcpy(10, 1, 80, 4 << 20))
    assert _totals(source.drain()[0]) == {(10, ("[memcpy DtoH 4.0 MiB pageable]", "fn_f1", "fn_f2")): 80}


def test_stacks_are_symbolized_once(proc: Path) -> None:
    source, symbolizer = _source(proc)
    source.handle(window(10, 1, covered_ns=10, elapsed_ns=10))
    for corr in range(1, 50):
        source.handle(launch(10, corr, stack_=stack(0xA1)))
        source.handle(kernel(10, corr, 1))
    assert symbolizer.calls == 1
    assert sum(_totals(source.drain()[0]).values()) == 49


def test_join_misses_are_counted_as_drops(proc: Path) -> None:
    selfmetrics.reset()
    source = GPUTimeSource(ProcessResolver(str(proc)), proc_root=str(proc), symbolizer=FakeSymbolizer(),
                           max_pending_per_process=2)
    for corr in range(1, 6):
        source.handle(launch(10, corr))
    source.drain()
    assert selfmetrics.total(semconv.SELF_DROPPED.name, otel_gpu__reason="join_launch_unmatched") == 3


def test_launches_sharing_a_correlation_id_are_counted(proc: Path) -> None:
    """The joiner's queue for shared ids is a safety net: each launch it queues is counted as a source error."""
    selfmetrics.reset()
    source, _ = _source(proc)
    source.handle(window(10, 1, covered_ns=100, elapsed_ns=1000))
    for _ in range(3):
        source.handle(launch(10, 7, window=1))
    source.handle(launch(10, 8, window=1))
    source.drain()
    assert selfmetrics.total(semconv.SELF_ERRORS.name, otel_gpu__source="gpu_time",
                             otel_gpu__reason="correlation_id_reused") == 2
    source.handle(launch(10, 9, window=1))
    source.drain()
    assert selfmetrics.total(semconv.SELF_ERRORS.name, otel_gpu__source="gpu_time",
                             otel_gpu__reason="correlation_id_reused") == 2

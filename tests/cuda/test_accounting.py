# SPDX-License-Identifier: Apache-2.0
"""GPUTimeAccounting alone: hand-built records in, batches, per-process counters and loss counts out. No eBPF, no
thread, no /proc: whether a process is alive is a set the test changes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from otel_gpu import selfmetrics, semconv
from otel_gpu.cuda import abi
from otel_gpu.cuda import accounting as accounting_module
from otel_gpu.cuda.accounting import GPUTimeAccounting
from otel_gpu.cuda.join import PACE_PRIOR_LAUNCHES, GPUWork
from otel_gpu.cuda.stacks import StackFrames
from otel_gpu.procfs import ProcessInfo, ProcessResolver
from otel_gpu.profiles.model import Frame, Mapping, ProfileBatch
from tests.cuda.records import kernel, launch, stack, sync, window
from tests.cuda.test_source_records import FakeSymbolizer


class Named(ProcessResolver):
    """Every pid is a process named "proc<pid>"."""

    def info(self, pid: int) -> ProcessInfo | None:
        return ProcessInfo(pid, f"proc{pid}")


class Forgetting(FakeSymbolizer):
    def __init__(self) -> None:
        super().__init__()
        self.forgotten: list[int] = []

    def forget(self, pid: int) -> None:
        self.forgotten.append(pid)


def _accounting(alive: set[int], max_pending: int = 65536) -> tuple[GPUTimeAccounting, Forgetting]:
    symbolizer = Forgetting()
    accounting = GPUTimeAccounting(Named(), StackFrames(symbolizer), alive.__contains__,
                                   max_pending_per_process=max_pending, started_ns=1_000)
    return accounting, symbolizer


def _values(batch: ProfileBatch) -> dict[tuple[int, str], float]:
    return {(p.process.pid, s.frames[0].function): s.value for p in batch.processes for s in p.samples}


def test_work_waits_for_its_window_and_is_weighted_by_it() -> None:
    accounting, _ = _accounting({10})
    seen: list[tuple[GPUWork, float]] = []
    accounting.observe_work(lambda work, weight: seen.append((work, weight)))
    accounting.handle(launch(10, 1, window=3))
    accounting.handle(kernel(10, 1, 200, name="relu"))
    accounting.handle(window(10, 3, covered_ns=100, elapsed_ns=500))  # weight 5
    assert seen == []  # held for the drain, weighted at the pace known then
    gpu, waits = accounting.drain(now_ns=3_000)
    assert [(w.activity.name, weight) for w, weight in seen] == [("relu", 5.0)]
    assert _values(gpu) == {(10, "relu"): 1000}
    assert (gpu.start_unix_nano, gpu.duration_nano) == (1_000, 2_000)
    assert gpu.sampling_fraction == pytest.approx(0.2)
    assert waits.processes == ()
    assert [p.process.executable_name for p in gpu.processes] == ["proc10"]


def test_counters_add_up_weighted_launches_times_and_coverage() -> None:
    accounting, _ = _accounting({10, 11})
    accounting.handle(window(10, 1, covered_ns=100, elapsed_ns=1000, launches=2))  # weight 10
    accounting.handle(launch(10, 1, window=1))
    accounting.handle(kernel(10, 1, 30))
    accounting.handle(window(10, 2, covered_ns=300, elapsed_ns=1600, launches=1))  # weight 3 over the new 600 ns
    accounting.handle(sync(11, 700, weight=2))
    counters = {c.info.pid: c for c in accounting.process_counters()}
    assert counters[10].launches == 0 and counters[10].kernel_time_ns == 0  # weighted at the drain, as the profile
    accounting.drain(now_ns=2_000)
    counters = {c.info.pid: c for c in accounting.process_counters()}
    assert counters[10].launches == pytest.approx(2 * 10 + 1 * 3)
    assert counters[10].kernel_time_ns == pytest.approx(300)
    assert (counters[10].covered_ns, counters[10].elapsed_ns) == (300, 1600)
    assert counters[11].sync_wait_ns == 1400 and counters[11].kernel_time_ns == 0
    counters[10].launches = 0  # a copy: the accounting's own totals do not change
    assert accounting.process_counters()[0].launches == pytest.approx(23)


def test_an_intervals_windows_are_weighted_at_the_pace_known_when_it_is_drained() -> None:
    """The pace (how much faster the program runs outside windows) rests on a handful of launches after one window:
    a program's first window fell where it launched 8x faster in the gaps, the rest of its first interval showed 2x.
    Every window of the interval is weighted at the pace of all of them, the first one too (at its close it would
    have stood for 8x the work of its gap)."""
    accounting, _ = _accounting({10})

    def paced(window_id: int, launches_total: int, shadow_launches: int) -> abi.Window:
        # 1 ms windows, 9 ms gaps; shadow windows counted launches for as long as the windows lasted
        w = window(10, window_id, covered_ns=window_id * 10**6, elapsed_ns=window_id * 10**7, launches=1)
        return replace(w, launches_total=launches_total, shadow_launches=shadow_launches,
                       shadow_launch_ns=window_id * 10**6)

    accounting.handle(launch(10, 1, window=1))
    accounting.handle(kernel(10, 1, 100, name="first"))
    accounting.handle(paced(1, 1_000, 8_000))  # pace 8 from its 1,000 launches (7.4, shrunk by the prior)
    accounting.handle(launch(10, 2, window=2))
    accounting.handle(kernel(10, 2, 100, name="second"))
    accounting.handle(paced(2, 100_000, 200_000))  # over both windows: 2x, on 100,000 launches
    gpu, _ = accounting.drain(now_ns=3_000)
    pace = 1 + (200_000 / 100_000 - 1) * 100_000 / (100_000 + PACE_PRIOR_LAUNCHES)
    weighted = pytest.approx(100 * (1 + 9 * pace), abs=1)  # whole ns
    assert _values(gpu) == {(10, "first"): weighted, (10, "second"): weighted}
    assert accounting.process_counters()[0].launches == pytest.approx(2 * (1 + 9 * pace))


def test_held_work_is_bounded_the_oldest_weighted_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past :data:`MAX_HELD_WORK` pieces held for the drain, the oldest is weighted with what is known then (its
    window's weight, or the process's last for a window not closed): memory stays bounded, nothing is lost."""
    monkeypatch.setattr(accounting_module, "MAX_HELD_WORK", 2)
    accounting, _ = _accounting({10})
    seen: list[tuple[str, float]] = []
    accounting.observe_work(lambda work, weight: seen.append((work.activity.name, weight)))
    accounting.handle(window(10, 1, covered_ns=100, elapsed_ns=500))  # weight 5
    for corr, name in ((1, "a"), (2, "b"), (3, "c")):
        accounting.handle(launch(10, corr, window=1))
        accounting.handle(kernel(10, corr, 10, name=name))
    assert seen == [("a", 5.0)]
    accounting.drain(now_ns=3_000)
    assert seen == [("a", 5.0), ("b", 5.0), ("c", 5.0)]


def test_the_time_after_the_last_window_is_stood_for_by_it() -> None:
    """A process exits between windows: the library's record of the totals at exit gives the time since the last
    window to that window's work, by thread, stack, kernel and span; its work still to come takes it too."""
    accounting, _ = _accounting({10})

    def spanned(corr: int, pc: int) -> abi.Launch:
        return replace(launch(10, corr, window=2, stack_=stack(pc)), trace_id="ab" * 16, span_id="cd" * 8)

    def by_span(batch: ProfileBatch) -> dict[tuple[int, bool], float]:
        out: dict[tuple[int, bool], float] = {}
        for sample in (s for p in batch.processes for s in p.samples):
            key = (sample.frames[1].address, bool(sample.span_id))
            out[key] = out.get(key, 0) + sample.value
        return out

    accounting.handle(window(10, 1, covered_ns=100, elapsed_ns=1000))  # weight 10
    accounting.handle(spanned(1, 0xA))
    accounting.handle(kernel(10, 1, 30, name="relu"))
    accounting.handle(spanned(2, 0xA))
    accounting.handle(kernel(10, 2, 10, name="relu"))
    accounting.handle(spanned(3, 0xB))  # its kernel comes after the record at exit
    accounting.handle(window(10, 2, covered_ns=200, elapsed_ns=2000))  # weight 10
    assert by_span(accounting.drain(now_ns=3_000)[0]) == {(0xA, True): 400}
    accounting.handle(window(10, 3, covered_ns=200, elapsed_ns=2500))  # at exit: 500 ns after a 100 ns window
    accounting.handle(kernel(10, 3, 20, name="relu"))
    assert by_span(accounting.drain(now_ns=4_000)[0]) == {(0xA, True): 40 * 5, (0xB, True): 20 * 15}


def test_an_exited_process_is_forgotten_once_the_metrics_read_its_last_values() -> None:
    """--profiling-interval shorter than the metrics interval: drains come and go before a collection reads the
    counters; an exited process's stay until one has (its state for profiles goes at once)."""
    alive = {10}
    accounting, symbolizer = _accounting(alive)
    accounting.handle(window(10, 1, covered_ns=10, elapsed_ns=10))
    accounting.handle(launch(10, 1, window=1, stack_=stack(0xA1)))
    accounting.handle(launch(10, 2, window=1, stack_=stack(0xA1)))
    assert accounting.unpaired(10) == (2, 0)
    accounting.process_counters()  # a collection before the exit was noticed
    alive.clear()
    accounting.drain(now_ns=2_000)
    assert symbolizer.forgotten == [10] and accounting.unpaired(10) == (0, 0)
    for now_ns in (3_000, 4_000, 5_000):  # profiling drains, no metrics collection in between
        accounting.drain(now_ns=now_ns)
    assert [c.info.pid for c in accounting.process_counters()] == [10]  # the collection reads its last values
    accounting.drain(now_ns=6_000)
    assert accounting.process_counters() == []


def test_exited_processes_kept_for_the_metrics_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from otel_gpu.cuda import accounting as module

    monkeypatch.setattr(module, "MAX_EXITED_COUNTERS", 2)
    alive = {10, 11, 12}
    accounting, _ = _accounting(alive)
    for pid in (10, 11, 12):
        accounting.handle(window(pid, 1, covered_ns=10, elapsed_ns=10))
    alive.clear()
    accounting.drain(now_ns=2_000)  # no metrics reader: the oldest goes past the bound
    assert sorted(c.info.pid for c in accounting.process_counters()) == [11, 12]


def test_losses_are_counted_once_each() -> None:
    selfmetrics.reset()
    accounting, _ = _accounting({10}, max_pending=1)
    accounting.handle(launch(10, 1))
    accounting.handle(launch(10, 2))  # evicts launch 1: a launch without work
    accounting.handle(kernel(10, 99, 5))  # no launch will come
    drops = [0] * len(abi.DROP_REASONS)
    drops[0] = 4
    accounting.drain(now_ns=2_000, bpf_drops=drops)
    accounting.drain(now_ns=3_000, bpf_drops=drops)  # the same totals: nothing new
    dropped = semconv.SELF_DROPPED.name
    assert selfmetrics.total(dropped, otel_gpu__reason=f"bpf_{abi.DROP_REASONS[0]}") == 4
    assert selfmetrics.total(dropped, otel_gpu__reason="join_launch_unmatched") == 1
    assert accounting.dropped()[abi.DROP_REASONS[0]] == 4
    stats = accounting.join_stats
    assert (stats.launches_unmatched, stats.joined) == (1, 0)
    stats.joined = 99  # a copy
    assert accounting.join_stats.joined == 0


def test_the_records_of_the_library_say_what_it_dropped() -> None:
    selfmetrics.reset()
    accounting, _ = _accounting({10})
    accounting.handle(abi.Window(10, 1, start_ns=0, end_ns=10, covered_ns=10, elapsed_ns=10, launches=0, dropped=3,
                                  overhead_ns=0))
    assert selfmetrics.total(semconv.SELF_DROPPED.name, otel_gpu__reason="injected_library") == 3
    assert accounting.records == 1


def test_stacks_from_the_kernel_lose_the_tracing_libraries_frames() -> None:
    class InLibraries(FakeSymbolizer):
        def frames(self, pid, pcs):  # type: ignore[no-untyped-def]
            paths = ("/x/libotel_gpu_inject.so", "/y/libcupti.so.12", "/usr/bin/python3")
            return tuple(Frame(f"fn_{pc:x}", mapping=Mapping(0, 1, 0, path))
                         for pc, path in zip(pcs, paths, strict=True))

    frames = StackFrames(InLibraries())
    assert [f.function for f in frames.frames(10, abi.Stack(native=(), kernel_native=(1, 2, 3)))] == ["fn_3"]
    assert [f.function for f in frames.frames(10, abi.Stack(native=(1, 2, 3)))] == ["fn_1", "fn_2", "fn_3"]


def test_a_process_with_no_sampling_window_is_named_once(caplog: pytest.LogCaptureFixture) -> None:
    """A short program that uses CUDA graphs gets no window while the library looks at its launch rate: its waits
    come, its GPU time does not. One line per process says so, when it exits or after NO_WINDOW_NOTICE_NS; a
    process that sent nothing (a forked child) and one that was sampled are not named."""
    from otel_gpu.cuda.accounting import NO_WINDOW_NOTICE_NS

    alive = {10, 11, 12, 13}
    accounting, _ = _accounting(alive)
    for pid in (10, 11):
        accounting.handle(sync(pid, 1000))
    accounting.remember_process(12)  # maps the library, sends nothing
    accounting.handle(window(13, 1, covered_ns=100, elapsed_ns=1000))
    with caplog.at_level("INFO", logger="otel_gpu.cuda.source"):
        accounting.drain(now_ns=2_000)
        assert not [r for r in caplog.records if "no sampling window" in r.getMessage()]
        alive.discard(11)
        accounting.drain(now_ns=3_000)
        accounting.drain(now_ns=2_000 + NO_WINDOW_NOTICE_NS)
        accounting.drain(now_ns=3_000 + NO_WINDOW_NOTICE_NS)
    lines = [r.getMessage() for r in caplog.records if "no sampling window" in r.getMessage()]
    assert len(lines) == 2, lines
    assert lines[0].startswith("GPU-time: pid 11 (proc11) exited with no sampling window")
    assert lines[1].startswith(f"GPU-time: pid 10 (proc10) has had for {NO_WINDOW_NOTICE_NS // 10**9} s no sampling "
                               "window")
    assert "CUDA graphs" in lines[1]


def test_the_last_drain_names_a_process_still_without_a_window(caplog: pytest.LogCaptureFixture) -> None:
    accounting, _ = _accounting({10})
    accounting.handle(sync(10, 1000))
    with caplog.at_level("INFO", logger="otel_gpu.cuda.source"):
        accounting.drain(now_ns=2_000)
        accounting.drain(now_ns=1_000_002_000, final=True)  # the agent stops 1 s later
    lines = [r.getMessage() for r in caplog.records if "no sampling window" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("GPU-time: pid 10 (proc10) has had for 1 s no sampling window")


def test_the_library_stepping_aside_is_named_once_per_process(caplog: pytest.LogCaptureFixture) -> None:
    accounting, _ = _accounting({10})
    with caplog.at_level("INFO", logger="otel_gpu.cuda.source"):
        accounting.handle(window(10, 1, covered_ns=100, elapsed_ns=1000))
        accounting.handle(window(10, 2, covered_ns=100, elapsed_ns=1200, aside_since_ns=1_500))
        accounting.handle(window(10, 3, covered_ns=150, elapsed_ns=1500, yielded_ns=500, yields=1))
        accounting.handle(window(10, 4, covered_ns=150, elapsed_ns=1600, yielded_ns=500, yields=1,
                                 aside_since_ns=2_500))
        accounting.drain(now_ns=3_000)
    lines = [r.getMessage() for r in caplog.records if "stepped aside" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("GPU-time: pid 10 (proc10): the injected library stepped aside")


def test_a_library_of_the_release_before_is_profiled_and_named_once(caplog: pytest.LogCaptureFixture) -> None:
    """A workload that outlived an agent upgrade runs the older library (ABI 6): its work is weighted as any, and
    the log says once why its weights lack the linger totals and how it gets the new library."""
    accounting, _ = _accounting({10, 11})
    with caplog.at_level("INFO", logger="otel_gpu.cuda.source"):
        accounting.handle(replace(window(10, 1, covered_ns=100, elapsed_ns=1000), abi_version=6))  # weight 10
        accounting.handle(launch(10, 1, window=2))
        accounting.handle(kernel(10, 1, 30, name="relu"))
        accounting.handle(replace(window(10, 2, covered_ns=200, elapsed_ns=2000), abi_version=6))
        accounting.handle(window(11, 1, covered_ns=100, elapsed_ns=1000))
    gpu, _ = accounting.drain(now_ns=3_000)
    assert _values(gpu) == {(10, "relu"): 300}
    older = [r.getMessage() for r in caplog.records if "release before" in r.getMessage()]
    assert len(older) == 1 and older[0].startswith("GPU-time: pid 10 (proc10) runs the injection library of the "
                                                   "release before (ABI 6")

# SPDX-License-Identifier: Apache-2.0
"""CUDA graph replays weighted by the library's exact replay counts (otel_gpu/cuda/graphs.py) inside the accounting:
hand-built records in, gpu_time out."""

from __future__ import annotations

from dataclasses import replace

import pytest

from otel_gpu import selfmetrics, semconv
from otel_gpu.cuda import abi, graphs
from otel_gpu.cuda.accounting import GPUTimeAccounting
from otel_gpu.cuda.stacks import StackFrames
from tests.cuda.records import kernel, launch, stack, window
from tests.cuda.test_accounting import Forgetting, Named

PID = 10
EXEC_A, EXEC_B = 0xA000, 0xB000


def _accounting(count_graphs: bool = True) -> GPUTimeAccounting:
    return GPUTimeAccounting(Named(), StackFrames(Forgetting()), {PID}.__contains__, started_ns=0,
                             count_graphs=count_graphs)


def _graph(corr: int, window_id: int, exec_: int = EXEC_A, pc: int = 0x1000) -> abi.Launch:
    return replace(launch(PID, corr, window=window_id, kind=abi.LAUNCH_GRAPH, stack_=stack(pc)), graph_exec=exec_)


def _window(window_id: int, covered_ns: int, elapsed_ns: int, *replays: tuple[int, int],
            other: int = 0) -> abi.Window:
    return replace(window(PID, window_id, covered_ns, elapsed_ns), graph_replays=replays, graph_other_replays=other)


def _replay(acc: GPUTimeAccounting, corr: int, window_id: int, exec_: int = EXEC_A, pc: int = 0x1000,
            kernels: tuple[int, ...] = (300, 200, 100)) -> None:
    """A sampled replay: its launch and one kernel record per node (the graph's nodes share the launch's id)."""
    acc.handle(_graph(corr, window_id, exec_, pc))
    for index, ns in enumerate(kernels):
        acc.handle(kernel(PID, corr, ns, name=f"node{index}", graph=1))


def _total(batch: object, pc: int | None = None) -> float:
    return sum(s.value for p in batch.processes for s in p.samples  # type: ignore[attr-defined]
               if pc is None or any(f.address == pc for f in s.frames))


def test_replays_are_weighted_by_counts_not_by_windows() -> None:
    acc = _accounting()
    _replay(acc, 1, window_id=1)
    acc.handle(_window(1, 10, 1000, (EXEC_A, 40)))  # window weight 100
    _replay(acc, 2, window_id=2)
    acc.handle(_window(2, 20, 1010, (EXEC_A, 100)))  # window weight 1
    gpu, _ = acc.drain(now_ns=5_000)
    # 100 replays counted, 2 sampled (600 ns each): 100 x 600, whatever the windows' weights say
    assert _total(gpu) == pytest.approx(100 * 600)

    window_weighted = _accounting(count_graphs=False)
    _replay(window_weighted, 1, window_id=1)
    window_weighted.handle(_window(1, 10, 1000, (EXEC_A, 40)))
    _replay(window_weighted, 2, window_id=2)
    window_weighted.handle(_window(2, 20, 1010, (EXEC_A, 100)))
    assert _total(window_weighted.drain(now_ns=5_000)[0]) == pytest.approx(600 * 100 + 600 * 1)


def test_a_lost_window_record_loses_no_replays() -> None:
    acc = _accounting()
    _replay(acc, 1, window_id=1)
    acc.handle(_window(1, 10, 100, (EXEC_A, 10)))
    _replay(acc, 2, window_id=2)  # window 2's record never came
    _replay(acc, 3, window_id=3)
    acc.handle(_window(3, 30, 300, (EXEC_A, 90)))
    gpu, _ = acc.drain(now_ns=5_000)
    assert _total(gpu) == pytest.approx(90 * 600)  # totals: 90 replays over 3 sampled


def test_the_stack_keeps_its_share_and_late_work_takes_its_stretch_weight() -> None:
    acc = _accounting()
    _replay(acc, 1, window_id=1, pc=0x1111)
    _replay(acc, 2, window_id=1, pc=0x1111)
    acc.handle(_graph(3, 1, pc=0x2222))  # its work comes after the drain
    acc.handle(_window(1, 10, 100, (EXEC_A, 30)))
    gpu, _ = acc.drain(now_ns=5_000)  # 30 replays over 3 sampled: weight 10
    assert _total(gpu, 0x1111) == pytest.approx(2 * 600 * 10)
    assert _total(gpu, 0x2222) == 0
    for index, ns in enumerate((300, 200, 100)):
        acc.handle(kernel(PID, 3, ns, name=f"node{index}", graph=1))
    gpu, _ = acc.drain(now_ns=6_000)
    assert _total(gpu, 0x2222) == pytest.approx(600 * 10)


def test_replays_with_none_sampled_add_no_time_and_are_counted() -> None:
    selfmetrics.reset()
    acc = _accounting()
    _replay(acc, 1, window_id=1, exec_=EXEC_A)
    acc.handle(_window(1, 10, 100, (EXEC_A, 5), (EXEC_B, 70)))
    gpu, _ = acc.drain(now_ns=5_000)
    assert _total(gpu) == pytest.approx(5 * 600)
    assert acc.graph_replays_not_sampled == 70
    assert selfmetrics.total(semconv.SELF_DROPPED.name,
                             otel_gpu__reason=semconv.Reason.GRAPH_REPLAYS_NOT_SAMPLED) == 70
    # the next interval starts from the totals: B's 70 earlier replays are not counted again
    _replay(acc, 2, window_id=2, exec_=EXEC_B)
    acc.handle(_window(2, 20, 200, (EXEC_A, 5), (EXEC_B, 74)))
    gpu, _ = acc.drain(now_ns=6_000)
    assert _total(gpu) == pytest.approx(4 * 600)
    assert acc.graph_replays_not_sampled == 70


def _kernel_totals(batch: object) -> dict[str, float]:
    totals: dict[str, float] = {}
    for sample in (s for p in batch.processes for s in p.samples):  # type: ignore[attr-defined]
        totals[sample.frames[0].function] = totals.get(sample.frames[0].function, 0.0) + sample.value
    return totals


def test_replays_after_the_last_sampled_window_take_its_time_per_replay() -> None:
    """Replays in a stretch with no sampled one (after the process's last window: the library's record at exit counts
    them; or a graph replayed seldom) weigh their exec's last sampled replays, by stack, kernel and span."""
    selfmetrics.reset()
    acc = _accounting()
    acc.handle(replace(_graph(1, 1, pc=0x1111), trace_id="ab" * 16, span_id="cd" * 8))
    for index, ns in enumerate((300, 200, 100)):
        acc.handle(kernel(PID, 1, ns, name=f"node{index}", graph=1))
    _replay(acc, 2, window_id=1, pc=0x1111, kernels=(100, 200, 500))
    acc.handle(_window(1, 10, 100, (EXEC_A, 10)))
    gpu, _ = acc.drain(now_ns=5_000)
    assert _kernel_totals(gpu) == pytest.approx({"node0": 5 * 400, "node1": 5 * 400, "node2": 5 * 600})
    acc.handle(_window(2, 10, 900, (EXEC_A, 25)))  # the totals at exit: 15 replays since, none sampled
    gpu, _ = acc.drain(now_ns=6_000)
    assert _kernel_totals(gpu) == pytest.approx({"node0": 15 * 200, "node1": 15 * 200, "node2": 15 * 300})
    assert _total(gpu, 0x1111) == _total(gpu) == pytest.approx(15 * 700)
    assert {(s.trace_id, s.span_id) for p in gpu.processes for s in p.samples} == {("ab" * 16, "cd" * 8), ("", "")}
    assert acc.graph_replays_not_sampled == 0
    assert selfmetrics.total(semconv.SELF_DROPPED.name,
                             otel_gpu__reason=semconv.Reason.GRAPH_REPLAYS_NOT_SAMPLED) == 0
    # a later sampled stretch replaces what a replay weighs
    _replay(acc, 3, window_id=3, pc=0x2222, kernels=(1000,))
    acc.handle(_window(3, 20, 1000, (EXEC_A, 27)))
    acc.drain(now_ns=7_000)
    acc.handle(_window(4, 20, 1100, (EXEC_A, 30)))
    gpu, _ = acc.drain(now_ns=8_000)
    assert _total(gpu, 0x2222) == _total(gpu) == pytest.approx(3 * 1000)


def test_the_time_per_replay_carried_counts_only_replays_whose_work_had_come() -> None:
    acc = _accounting()
    _replay(acc, 1, window_id=1)
    acc.handle(_graph(2, 1))  # sampled; its work comes after the drain
    acc.handle(_window(1, 10, 100, (EXEC_A, 4)))
    assert _total(acc.drain(now_ns=5_000)[0]) == pytest.approx(2 * 600)
    for index, ns in enumerate((300, 200, 100)):
        acc.handle(kernel(PID, 2, ns, name=f"node{index}", graph=1))
    acc.handle(_window(2, 10, 200, (EXEC_A, 10)))  # 6 replays since, none sampled: 600 ns each
    assert _total(acc.drain(now_ns=6_000)[0]) == pytest.approx(2 * 600 + 6 * 600)


def test_an_exec_with_too_many_pieces_per_replay_is_not_carried(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(graphs, "MAX_CARRIED_PIECES", 2)
    acc = _accounting()
    _replay(acc, 1, window_id=1)  # three kernels: three pieces
    acc.handle(_window(1, 10, 100, (EXEC_A, 4)))
    acc.drain(now_ns=5_000)
    acc.handle(_window(2, 10, 200, (EXEC_A, 9)))
    gpu, _ = acc.drain(now_ns=6_000)
    assert _total(gpu) == 0 and acc.graph_replays_not_sampled == 5


def test_execs_beyond_the_librarys_table_keep_window_weights() -> None:
    acc = _accounting()
    _replay(acc, 1, window_id=1, exec_=EXEC_A)
    _replay(acc, 2, window_id=1, exec_=EXEC_B)  # not in the record's table: its replays went to "other"
    acc.handle(_window(1, 10, 100, (EXEC_A, 8), other=50))  # window weight 10
    gpu, _ = acc.drain(now_ns=5_000)
    assert _total(gpu) == pytest.approx(8 * 600 + 10 * 600)


def test_a_library_that_attached_again_counts_from_zero() -> None:
    acc = _accounting()
    _replay(acc, 1, window_id=1)
    acc.handle(_window(1, 10, 100, (EXEC_A, 500)))
    acc.drain(now_ns=5_000)
    _replay(acc, 2, window_id=2)
    acc.handle(_window(2, 10, 100, (EXEC_A, 20)))  # totals restarted (re-attached): 20 replays, not -480
    gpu, _ = acc.drain(now_ns=6_000)
    assert _total(gpu) == pytest.approx(20 * 600)


def test_work_of_a_window_still_open_waits_for_it() -> None:
    acc = _accounting()
    _replay(acc, 1, window_id=1)
    acc.handle(_window(1, 10, 100, (EXEC_A, 4)))
    _replay(acc, 2, window_id=2)  # window 2 closes after the drain: its replay belongs to the next stretch
    gpu, _ = acc.drain(now_ns=5_000)
    assert _total(gpu) == pytest.approx(4 * 600)
    acc.handle(_window(2, 20, 200, (EXEC_A, 10)))
    gpu, _ = acc.drain(now_ns=6_000)
    assert _total(gpu) == pytest.approx(6 * 600)


def test_totals_restart_when_the_library_takes_cupti_back() -> None:
    acc = _accounting()
    _replay(acc, 1, window_id=1)
    acc.handle(_window(1, 10, 100, (EXEC_A, 30)))
    acc.drain(now_ns=5_000)
    _replay(acc, 2, window_id=2)
    # it stepped aside for another tool and came back (yields 1): its totals restarted, 45 replays since
    acc.handle(replace(_window(2, 10, 200, (EXEC_A, 45)), yields=1))
    gpu, _ = acc.drain(now_ns=6_000)
    assert _total(gpu) == pytest.approx(45 * 600)

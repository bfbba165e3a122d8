# SPDX-License-Identifier: Apache-2.0
"""Waits joined with the NCCL collectives that ran while they blocked (pure: records built by hand), and the
accounting's sync_wait samples that carry ``nccl.collective``."""

from __future__ import annotations

import pytest

from otel_gpu import semconv
from otel_gpu.cuda import abi
from otel_gpu.cuda.accounting import SETTLE_LAG_NS, GPUTimeAccounting
from otel_gpu.cuda.stacks import StackFrames
from otel_gpu.cuda.waits import CollectiveWaits
from tests.cuda.records import kernel, stack
from tests.cuda.test_accounting import Named
from tests.cuda.test_source_records import FakeSymbolizer

ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
ALL_GATHER = "ncclDevKernel_AllGather_RING_LL"
MS = 1_000_000


def _window(pid: int, window_id: int, start_ns: int, end_ns: int) -> abi.Window:
    return abi.Window(pid, window_id, start_ns, end_ns, end_ns - start_ns, end_ns, 1, 0, 0)


def _wait(pid: int, start_ns: int, end_ns: int, site: int = 0x9000, weight: int = 1) -> abi.Sync:
    return abi.Sync(pid, pid, "rank", abi.SYNC_STREAM, 126, start_ns, end_ns, weight, stack(site))


def test_the_part_of_a_wait_a_collective_ran_is_labelled_with_it() -> None:
    waits = CollectiveWaits()
    waits.add_window(_window(1, 1, 0, 100 * MS))
    waits.add_activity(kernel(1, 5, 2 * MS, name="matmul", start_ns=10 * MS))  # not a collective: ignored
    waits.add_activity(kernel(1, 6, 8 * MS, name=ALL_REDUCE, start_ns=12 * MS))
    assert waits.runs_collectives(1) and not waits.runs_collectives(2)
    assert waits.split(_wait(1, 10 * MS, 20 * MS)) == [("all_reduce", 0.8), (None, pytest.approx(0.2))]
    # a wait during nothing but the matmul: no collective
    assert waits.split(_wait(1, 10 * MS, 12 * MS, site=0x9100)) == [(None, 1.0)]


def test_overlapping_kernels_count_once_and_several_collectives_share_the_wait() -> None:
    waits = CollectiveWaits()
    waits.add_window(_window(1, 1, 0, 100 * MS))
    waits.add_activity(kernel(1, 1, 4 * MS, name=ALL_REDUCE, start_ns=0))
    waits.add_activity(kernel(1, 2, 4 * MS, name=ALL_REDUCE, start_ns=2 * MS, stream=8))  # overlaps the first
    waits.add_activity(kernel(1, 3, 2 * MS, name=ALL_GATHER, start_ns=8 * MS))
    shares = dict(waits.split(_wait(1, 0, 10 * MS)))
    assert shares == {"all_reduce": 0.6, "all_gather": 0.2, None: pytest.approx(0.2)}


def test_a_wait_outside_windows_is_split_as_its_stack_was_inside() -> None:
    waits = CollectiveWaits()
    waits.add_window(_window(1, 1, 0, 50 * MS))
    waits.add_activity(kernel(1, 1, 3 * MS, name=ALL_REDUCE, start_ns=11 * MS))
    assert waits.split(_wait(1, 10 * MS, 14 * MS)) == [("all_reduce", 0.75), (None, 0.25)]  # covered
    # after the window: no kernel is known, the same stack's share stands in; another stack has none
    assert waits.split(_wait(1, 70 * MS, 74 * MS)) == [("all_reduce", 0.75), (None, 0.25)]
    assert waits.split(_wait(1, 70 * MS, 74 * MS, site=0x9100)) == [(None, 1.0)]
    waits.forget_process(1)
    assert waits.split(_wait(1, 10 * MS, 14 * MS)) == [(None, 1.0)]


def test_accounting_holds_the_waits_of_a_collective_process_until_its_work_arrives() -> None:
    accounting = GPUTimeAccounting(Named(), StackFrames(FakeSymbolizer()), alive=lambda pid: True)
    pid = 999_999_001
    accounting.handle(kernel(pid, 1, 1 * MS, name=ALL_REDUCE, start_ns=0))  # the process runs collectives
    accounting.handle(_window(pid, 1, 0, 5 * MS))
    early = _wait(pid, 10 * MS, 20 * MS)  # in the next window, whose record and kernel have not come yet
    accounting.handle(early)
    gpu, sync = accounting.drain(30 * MS)
    assert sync.processes == ()  # held: it ended less than SETTLE_LAG_NS before the drain
    accounting.handle(kernel(pid, 2, 6 * MS, name=ALL_REDUCE, start_ns=14 * MS))
    accounting.handle(_window(pid, 2, 8 * MS, 25 * MS))
    gpu, sync = accounting.drain(40 * MS)
    samples = {dict(s.attributes).get(semconv.NCCL_COLLECTIVE): s.value for p in sync.processes for s in p.samples}
    assert samples == {"all_reduce": 6 * MS, None: 4 * MS}
    assert accounting.process_counters()[0].sync_wait_ns == 10 * MS  # counted at once, whole


def test_a_process_without_collectives_has_its_waits_at_once_unlabelled() -> None:
    accounting = GPUTimeAccounting(Named(), StackFrames(FakeSymbolizer()), alive=lambda pid: True)
    pid = 999_999_002
    accounting.handle(_wait(pid, 10 * MS, 20 * MS))
    _, sync = accounting.drain(30 * MS)
    [sample] = [s for p in sync.processes for s in p.samples]
    assert sample.value == 10 * MS and semconv.NCCL_COLLECTIVE not in dict(sample.attributes)


def test_a_held_wait_is_let_go_after_a_drain_or_when_its_process_exits() -> None:
    alive = {999_999_003: True}
    accounting = GPUTimeAccounting(Named(), StackFrames(FakeSymbolizer()), alive=lambda pid: alive[pid])
    pid = 999_999_003
    accounting.handle(kernel(pid, 1, 1 * MS, name=ALL_REDUCE, start_ns=0))
    accounting.handle(_wait(pid, 10 * MS, 20 * MS))
    assert accounting.drain(30 * MS)[1].processes == ()
    assert sum(s.value for p in accounting.drain(40 * MS)[1].processes for s in p.samples) == 10 * MS
    accounting.handle(_wait(pid, 50 * MS, 52 * MS))
    alive[pid] = False
    assert sum(s.value for p in accounting.drain(60 * MS)[1].processes for s in p.samples) == 2 * MS


def test_held_waits_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from otel_gpu.cuda import accounting as module

    monkeypatch.setattr(module, "MAX_HELD_SYNCS", 3)
    accounting = GPUTimeAccounting(Named(), StackFrames(FakeSymbolizer()), alive=lambda pid: True)
    pid = 999_999_004
    accounting.handle(kernel(pid, 1, 1 * MS, name=ALL_REDUCE, start_ns=0))
    for index in range(5):
        accounting.handle(_wait(pid, (10 + index) * MS, (11 + index) * MS))
    # two went out at once (the oldest), three are held for their collectives
    assert sum(s.value for p in accounting.drain(30 * MS)[1].processes for s in p.samples) == 2 * MS
    assert sum(s.value for p in accounting.drain(40 * MS)[1].processes for s in p.samples) == 3 * MS


def test_waits_outside_windows_learn_their_share_from_the_same_drain() -> None:
    accounting = GPUTimeAccounting(Named(), StackFrames(FakeSymbolizer()), alive=lambda pid: True)
    pid = 999_999_005
    accounting.handle(kernel(pid, 1, 4 * MS, name=ALL_REDUCE, start_ns=100 * MS))
    accounting.handle(_wait(pid, 10 * MS, 14 * MS))  # before the first window: no share known yet
    accounting.handle(_wait(pid, 50 * MS, 54 * MS, site=0x9100))  # another stack, never covered
    accounting.handle(_wait(pid, 100 * MS, 104 * MS))  # inside the window: all of it in the all-reduce
    accounting.handle(_window(pid, 1, 90 * MS, 110 * MS))
    _, sync = accounting.drain(110 * MS + SETTLE_LAG_NS)
    labelled = {(s.frames[1].address, dict(s.attributes).get(semconv.NCCL_COLLECTIVE)): s.value
                for p in sync.processes for s in p.samples}
    # the earlier wait took the covered one's share; the never-covered stack has none: unlabelled
    assert labelled == {(0x9000, "all_reduce"): 8 * MS, (0x9100, None): 4 * MS}


def test_one_cut_off_for_every_process() -> None:
    """Ranks' waits go to the same interval whatever their windows: compared per interval, they stay comparable."""
    accounting = GPUTimeAccounting(Named(), StackFrames(FakeSymbolizer()), alive=lambda pid: True)
    now = 10 * SETTLE_LAG_NS
    for pid in (999_999_006, 999_999_007):
        accounting.handle(kernel(pid, 1, 1 * MS, name=ALL_REDUCE, start_ns=now - 3 * SETTLE_LAG_NS))
        accounting.handle(_wait(pid, now - 3 * SETTLE_LAG_NS, now - 2 * SETTLE_LAG_NS))  # before the cut-off
        accounting.handle(_wait(pid, now - SETTLE_LAG_NS // 2, now - SETTLE_LAG_NS // 4))  # after it
    # one process's window closed after both its waits, the other's only after the first
    accounting.handle(_window(999_999_006, 1, now - 4 * SETTLE_LAG_NS, now - SETTLE_LAG_NS // 8))
    accounting.handle(_window(999_999_007, 1, now - 4 * SETTLE_LAG_NS, now - SETTLE_LAG_NS))
    _, sync = accounting.drain(now)
    assert {p.process.pid: sum(s.value for s in p.samples) for p in sync.processes} == \
        {999_999_006: SETTLE_LAG_NS, 999_999_007: SETTLE_LAG_NS}


def test_the_last_drain_holds_no_wait_back() -> None:
    accounting = GPUTimeAccounting(Named(), StackFrames(FakeSymbolizer()), alive=lambda pid: True)
    pid = 999_999_008
    accounting.handle(kernel(pid, 1, 1 * MS, name=ALL_REDUCE, start_ns=0))
    accounting.handle(_wait(pid, 10 * MS, 20 * MS))
    _, sync = accounting.drain(30 * MS, final=True)
    assert sum(s.value for p in sync.processes for s in p.samples) == 10 * MS


def test_a_stack_share_follows_a_change_of_straggler() -> None:
    from otel_gpu.cuda.waits import SHARE_MEMORY_NS

    waits = CollectiveWaits()
    waits.add_window(_window(1, 1, 0, 1 << 62))
    step = 10 * MS
    waited = 0
    t = 0
    while waited < SHARE_MEMORY_NS:  # first this rank waits all in the all-reduce
        waits.add_activity(kernel(1, 1, step, name=ALL_REDUCE, start_ns=t))
        waits.split(_wait(1, t, t + step))
        waited, t = waited + step, t + 2 * step
    while waited < 3 * SHARE_MEMORY_NS:  # then never (it became the straggler)
        waits.split(_wait(1, t, t + step))
        waited, t = waited + step, t + 2 * step
    outside = abi.Sync(1, 1, "rank", abi.SYNC_STREAM, 126, -2 * step, -step, 1, stack(0x9000))  # before any window
    assert dict(waits.split(outside)).get("all_reduce", 0.0) < 0.25

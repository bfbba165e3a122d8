# SPDX-License-Identifier: Apache-2.0
"""Joiner and WindowWeights on synthetic records: order independence, graphs, bounds, misses, weights."""

from __future__ import annotations

import pytest

from otel_gpu.cuda import abi
from otel_gpu.cuda.join import (PACE_PRIOR_LAUNCHES, PACE_PRIOR_WAITS, Joiner, WindowWeights, linger_pace,
                                measured_pace, pace_ratio, since)
from tests.cuda.records import kernel, launch, window


def test_whichever_side_arrives_second_completes_the_pair() -> None:
    joiner = Joiner()
    assert joiner.add_launch(launch(10, 1)) == []
    done = joiner.add_activity(kernel(10, 1, 500))
    assert [(w.launch.correlation_id, w.activity.duration_ns) for w in done] == [(1, 500)]
    assert joiner.add_activity(kernel(10, 2, 300)) == []  # activity first
    done = joiner.add_launch(launch(10, 2))
    assert [(w.launch.correlation_id, w.activity.duration_ns) for w in done] == [(2, 300)]
    assert joiner.pending(10) == (0, 0)
    assert joiner.stats.joined == 2


def test_same_correlation_id_in_two_processes_does_not_mix() -> None:
    joiner = Joiner()
    joiner.add_launch(launch(10, 5))
    assert joiner.add_activity(kernel(11, 5, 100)) == []
    done = joiner.add_activity(kernel(10, 5, 200))
    assert [w.launch.pid for w in done] == [10]


def test_graph_launch_is_copied_to_every_kernel_of_the_graph() -> None:
    joiner = Joiner()
    graph = launch(10, 9, kind=abi.LAUNCH_GRAPH)
    early = joiner.add_activity(kernel(10, 9, 100, name="k0", graph=3))
    assert early == []
    assert [w.activity.name for w in joiner.add_launch(graph)] == ["k0"]
    names = [w.activity.name for k in ("k1", "k2") for w in joiner.add_activity(kernel(10, 9, 100, name=k, graph=3))]
    assert names == ["k1", "k2"]
    joiner.forget_process(10)
    assert joiner.stats.launches_unmatched == 0  # a matched graph launch is no miss


def test_bounded_maps_evict_oldest_and_count_misses() -> None:
    joiner = Joiner(max_pending=3)
    for corr in range(1, 6):
        joiner.add_launch(launch(10, corr))
    assert joiner.pending(10) == (3, 0)
    assert joiner.stats.launches_unmatched == 2
    for corr in range(100, 105):
        joiner.add_activity(kernel(10, corr, 1))
    assert joiner.pending(10)[1] == 3
    assert joiner.stats.activities_unmatched == 2
    assert joiner.add_activity(kernel(10, 1, 1)) == []  # evicted launch: no join
    assert [w.launch.correlation_id for w in joiner.add_activity(kernel(10, 5, 1))] == [5]


def test_id_window_drops_stale_ids() -> None:
    joiner = Joiner(id_window=100)
    joiner.add_launch(launch(10, 1))
    joiner.add_launch(launch(10, 500))
    assert joiner.pending(10) == (1, 0)
    assert joiner.stats.launches_unmatched == 1


def test_forget_process_counts_what_is_unmatched() -> None:
    joiner = Joiner()
    joiner.add_launch(launch(10, 1))
    joiner.add_activity(kernel(10, 2, 1))
    joiner.forget_process(10)
    assert (joiner.stats.launches_unmatched, joiner.stats.activities_unmatched) == (1, 1)
    assert joiner.pids() == set()


def test_window_weight_is_elapsed_over_covered_since_the_previous_window() -> None:
    weights = WindowWeights()
    assert weights.weight(10, 1) is None
    assert weights.latest(10) == 1.0
    assert weights.add(window(10, 1, covered_ns=10, elapsed_ns=100)) == (10.0, 10, 100)
    # the fraction changes: 20 more ns covered over 40 more elapsed -> weight 2
    assert weights.add(window(10, 2, covered_ns=30, elapsed_ns=140)) == (2.0, 20, 40)
    assert weights.weight(10, 1) == 10.0 and weights.weight(10, 2) == 2.0
    assert weights.latest(10) == 2.0
    # a lost window record: the next one covers both stretches
    assert weights.add(window(10, 4, covered_ns=50, elapsed_ns=240))[0] == pytest.approx(5.0)
    assert weights.weight(10, 3) is None


def test_the_totals_at_exit_give_the_time_after_the_last_window_to_it() -> None:
    """The library's record at exit has no window in it (no time covered, no launches): the time since the last
    window has no later window to stand for it, so the last one does (work of it still to come included)."""
    weights = WindowWeights()
    weights.add(window(10, 1, covered_ns=10, elapsed_ns=100))
    assert weights.add(window(10, 2, covered_ns=20, elapsed_ns=200))[0] == 10.0  # 10 ns standing for 100
    assert weights.take_tail(10) is None
    assert weights.add(window(10, 3, covered_ns=20, elapsed_ns=250)) == (10.0, 0, 50)
    assert weights.take_tail(10) == (2, 5.0) and weights.take_tail(10) is None  # 50 ns after a 10 ns window
    assert weights.weight(10, 2) == 15.0 and weights.weight(10, 1) == 10.0
    # a record of stepping aside for another tool is no tail: that time is yielded, not extrapolated into
    weights.add(window(11, 1, covered_ns=10, elapsed_ns=100))
    weights.add(window(11, 2, covered_ns=10, elapsed_ns=400, aside_since_ns=7))
    assert weights.take_tail(11) is None and weights.weight(11, 1) == 10.0


def test_window_totals_restart_after_reattach() -> None:
    weights = WindowWeights()
    weights.add(window(10, 1, covered_ns=10, elapsed_ns=100))
    assert weights.add(window(10, 2, covered_ns=5, elapsed_ns=20))[0] == 4.0


def test_window_totals_restart_after_another_tool_had_cupti() -> None:
    """The library took CUPTI back from torch.profiler: its totals restart even when the new ones are already larger
    than the old (a short first session), and the yielded time is never extrapolated into."""
    weights = WindowWeights()
    weights.add(window(10, 1, covered_ns=10, elapsed_ns=100))
    assert weights.add(window(10, 2, covered_ns=20, elapsed_ns=400, yielded_ns=3 * 10**9, yields=1)) == (20.0, 20, 400)
    assert weights.add(window(10, 3, covered_ns=30, elapsed_ns=500, yielded_ns=3 * 10**9, yields=1))[0] == 10.0


def test_time_outside_windows_counts_at_the_pace_the_program_keeps_there() -> None:
    """A program that syncs every iteration runs 2 % slower in windows: 10,000 waits in 1 s of windows, 10,200 in
    1 s of shadow windows. The time outside windows stands for 2 % more work (shrunk by the waits seen)."""
    w = window(10, 1, covered_ns=10**9, elapsed_ns=10 * 10**9, window_waits=10_000, shadow_waits=10_200,
               shadow_ns=10**9)
    shrink = 10_000 / (10_000 + PACE_PRIOR_WAITS)
    assert pace_ratio(w) == pytest.approx(1 + 0.02 * shrink)
    assert WindowWeights().add(w)[0] == pytest.approx(1 + 9 * (1 + 0.02 * shrink))


def test_pace_is_left_alone_without_waits_to_go_by() -> None:
    """No waits (a program that never synchronizes), none in shadows yet, or a handful: weights stay time-based."""
    assert pace_ratio(window(10, 1, covered_ns=10, elapsed_ns=100)) == 1.0
    assert pace_ratio(window(10, 1, 10, 100, window_waits=50, shadow_waits=0, shadow_ns=10)) == 1.0
    few = pace_ratio(window(10, 1, 10, 100, window_waits=2, shadow_waits=4, shadow_ns=10))  # measured 2x
    assert 1.0 < few < 1.03
    # and never more than 8x slower or 2x faster, however many waits say so
    assert pace_ratio(window(10, 1, 10, 100, window_waits=10**6, shadow_waits=10**8, shadow_ns=10)) == 8.0
    assert pace_ratio(window(10, 1, 10, 100, window_waits=10**8, shadow_waits=10**6, shadow_ns=10)) == 0.5


def paced(launches_total: int, covered_ns: int, shadow_launches: int, shadow_launch_ns: int,
          **waits: int) -> abi.Window:
    w = window(10, 1, covered_ns=covered_ns, elapsed_ns=50 * covered_ns, **waits)
    w.launches_total, w.shadow_launches, w.shadow_launch_ns = launches_total, shadow_launches, shadow_launch_ns
    return w


def test_a_launch_bound_program_is_paced_by_its_launches() -> None:
    """The H200 smoke run's tiny kernels: 36k launches a second in windows, 147k outside. A program that never
    waits is paced by its launches (the waits would leave it at 1), and launches are preferred where both were seen:
    there are many more of them."""
    w = paced(36_000, 10**9, 147_000, 10**9)
    pace, trust = measured_pace(w)
    assert pace == pytest.approx(147 / 36) and trust == pytest.approx(36_000 / (36_000 + PACE_PRIOR_LAUNCHES))
    assert pace_ratio(w) == pytest.approx(1 + (147 / 36 - 1) * trust)
    assert WindowWeights().add(w)[0] == pytest.approx(1 + 49 * pace_ratio(w))
    both = paced(36_000, 10**9, 147_000, 10**9, window_waits=100, shadow_waits=100, shadow_ns=10**9)
    assert pace_ratio(both) == pace_ratio(w)
    # a handful of launches says little; none in shadows (a library before ABI 6): the waits decide
    assert 1.0 < pace_ratio(paced(5, 10**9, 20, 10**9)) < 1.2  # measured 4x, trusted 5 / 105
    assert pace_ratio(paced(36_000, 10**9, 0, 0, window_waits=2, shadow_waits=4, shadow_ns=10**9)) < 1.03


def lingering(w: abi.Window, linger_ns: int, linger_launches: int) -> abi.Window:
    w.linger_ns, w.linger_launches = linger_ns, linger_launches
    return w


def test_the_pace_counts_windows_from_when_the_shadows_began() -> None:
    """An H100 run: the program's first 14 windows (5 ms each, imports and warm-up) saw no launch, and the shadow
    windows counted waits but no launch; then a window saw 105 launches in 5 ms and a shadow 220 in 5 ms. Counted from
    the start, the windows' rate took in the warm-up's 70 ms without launches: 8x (the bound) where the program kept
    2.1x. The pace by launches counts from the last record before the shadows counted launches, the pace by waits
    from the last before they counted waits."""
    weights = WindowWeights()
    for window_id in range(1, 15):
        weights.add(window(10, window_id, covered_ns=window_id * 5_000_000, elapsed_ns=window_id * 25_000_000,
                           shadow_ns=window_id * 5_000_000))
    first = window(10, 15, covered_ns=75_000_000, elapsed_ns=400_000_000, launches=105, shadow_ns=75_000_000)
    first.launches_total, first.shadow_launches, first.shadow_launch_ns = 105, 220, 5_000_000
    pace = 1 + (220 / 105 - 1) * 105 / (105 + PACE_PRIOR_LAUNCHES)
    assert pace_ratio(first) == pace_ratio(since(first, None)) == 8.0  # from the start
    weight, covered, elapsed = weights.add(first)
    assert weights.paces(10)[0] == pytest.approx(pace)
    assert weight == pytest.approx(1 + pace * (elapsed - covered) / covered)
    # the totals restart (the library re-attached): counted from the new start until shadows count again
    again = window(10, 16, covered_ns=5_000_000, elapsed_ns=50_000_000)
    again.launches_total = 100
    weights.add(again)
    then = window(10, 17, covered_ns=10_000_000, elapsed_ns=100_000_000)
    then.launches_total, then.shadow_launches, then.shadow_launch_ns = 200, 400, 5_000_000
    paced = since(then, again)
    assert (paced.covered_ns, paced.launches_total) == (5_000_000, 100)
    assert weights.add(then)[0] == pytest.approx(1 + pace_ratio(paced) * 45 / 5)
    # a program paced by its waits (no launch counted in shadows): from the last record before shadows counted waits
    waits = WindowWeights()
    waits.add(window(11, 1, covered_ns=10**9, elapsed_ns=2 * 10**9))  # 1 s of windows, no wait, no shadow yet
    paced_w = window(11, 2, covered_ns=2 * 10**9, elapsed_ns=4 * 10**9, window_waits=10_000, shadow_waits=15_000,
                     shadow_ns=10**9)
    waits.add(paced_w)
    assert waits.paces(11)[0] == pytest.approx(1 + 0.5 * 10_000 / (10_000 + PACE_PRIOR_WAITS))
    assert pace_ratio(paced_w) > 2.9  # from the start: 10,000 waits in 2 s of windows against 15,000 in 1 s


def test_garbled_totals_that_fall_below_their_base_give_no_pace() -> None:
    """Totals that go down without the library restarting (a garbled record): counted from the base they are negative,
    and the pace falls back to 1 instead of dividing by a negative count plus its prior (zero here)."""
    weights = WindowWeights()
    base = window(10, 1, covered_ns=10**9, elapsed_ns=2 * 10**9, window_waits=300)
    base.launches_total, base.linger_ns, base.linger_launches = 300, 10**9, 300
    weights.add(base)
    garbled = window(10, 2, covered_ns=2 * 10**9, elapsed_ns=4 * 10**9, window_waits=200, shadow_waits=100,
                     shadow_ns=10**9)
    garbled.launches_total, garbled.shadow_launches, garbled.shadow_launch_ns = 200, 100, 10**9
    garbled.linger_ns, garbled.linger_launches = 2 * 10**9, 200
    weights.add(garbled)  # 100 fewer launches and waits in windows than at the base: -100 + a prior of 100
    assert weights.paces(10) == (1.0, 1.0)


def test_time_spent_lingering_counts_at_the_pace_of_its_own_launches() -> None:
    """After a window the activity kinds stay on until its GPU work arrives, and the program runs slowed then, nearly
    as in a window: that time counts at the launch rate seen in it, not at the shadows' (a launch-bound program whose
    records came 20 ms late was 20 % heavier on the fake CUPTI when its lingers counted at the shadows' pace)."""
    # 36k launches/s in windows, 147k in shadows; lingers: 0.5 s of 49 s outside at 54k/s (1.5x a window's rate)
    w = lingering(paced(36_000, 10**9, 147_000, 10**9), 5 * 10**8, 27_000)
    pace = pace_ratio(w)
    trust = 27_000 / (27_000 + PACE_PRIOR_LAUNCHES)
    assert linger_pace(w, pace) == pytest.approx(1 + 0.5 * trust)
    assert WindowWeights().add(w)[0] == pytest.approx(1 + 0.5 * linger_pace(w, pace) + 48.5 * pace)
    # a linger never runs faster than the shadows, nor is its time taken for more than the time outside windows
    fast = lingering(paced(36_000, 10**9, 147_000, 10**9), 10**9, 10**6)
    assert linger_pace(fast, pace_ratio(fast)) == pace_ratio(fast)
    assert WindowWeights().add(lingering(paced(36_000, 10**9, 147_000, 10**9), 10**12, 0))[0] == pytest.approx(50)
    # no launches counted in lingers (a program waiting on its GPU): their time counts as a window's
    assert linger_pace(lingering(paced(36_000, 10**9, 147_000, 10**9), 10**9, 0), pace) == 1.0
    # the totals at exit: a linger in the tail counts at its own pace too
    weights = WindowWeights()
    weights.add(lingering(paced(36_000, 10**9, 147_000, 10**9), 0, 0))
    tail_w = lingering(paced(36_000, 10**9, 147_000, 10**9), 10**9, 36_000)
    tail_w.window_id, tail_w.elapsed_ns = 11, 52 * 10**9
    weights.add(tail_w)
    assert weights.take_tail(10) == (1, pytest.approx(1.0 + pace_ratio(tail_w)))  # 1 s lingering at 1x, 1 s at pace


def test_every_launch_recorded_gives_weight_one() -> None:
    weights = WindowWeights()
    assert weights.add(window(10, 1, covered_ns=100, elapsed_ns=100))[0] == 1.0


def test_launch_whose_work_never_arrives_is_counted_once_it_is_too_old() -> None:
    """A sampled launch whose GPU work was lost is let go after max_lag_ns of launch time and counted as a miss."""
    joiner = Joiner(max_lag_ns=5_000)
    joiner.add_launch(launch(10, 1, timestamp_ns=1_000))
    joiner.add_launch(launch(10, 2, timestamp_ns=2_000))
    joiner.add_launch(launch(10, 3, timestamp_ns=5_000))  # 1 and 2 are still within the lag
    assert joiner.pending(10) == (3, 0)
    assert joiner.stats.launches_unmatched == 0
    assert [w.launch.correlation_id for w in joiner.add_activity(kernel(10, 2, 100))] == [2]
    joiner.add_launch(launch(10, 4, timestamp_ns=6_500))  # 1 is now 5.5 us behind: lost
    assert joiner.pending(10) == (2, 0)
    assert joiner.stats.launches_unmatched == 1
    # Late work of a launch that is still within the lag joins as usual.
    assert [w.launch.correlation_id for w in joiner.add_activity(kernel(10, 3, 100))] == [3]


def test_launches_sharing_a_correlation_id_each_take_one_piece_of_work_in_order() -> None:
    """CUPTI on CUDA 13 hands one correlation id to many launches (seen on an H200): none may be lost silently."""
    joiner = Joiner()
    for window_id in (1, 2, 3):
        assert joiner.add_launch(launch(10, 7, window=window_id)) == []
    assert joiner.stats.launches_duplicate_id == 2
    assert joiner.pending(10) == (3, 0)
    done = [w for ns in (100, 200) for w in joiner.add_activity(kernel(10, 7, ns))]
    assert [(w.launch.window_id, w.activity.duration_ns) for w in done] == [(1, 100), (2, 200)]
    assert joiner.pending(10) == (1, 0)
    joiner.forget_process(10)
    assert joiner.stats.launches_unmatched == 1  # the third launch's work never came: counted, not dropped silently
    assert joiner.stats.joined == 2


def test_parked_work_with_a_shared_id_goes_one_piece_per_launch() -> None:
    joiner = Joiner()
    for ns in (100, 200):
        assert joiner.add_activity(kernel(10, 7, ns)) == []
    assert [w.activity.duration_ns for w in joiner.add_launch(launch(10, 7, window=1))] == [100]
    assert joiner.pending(10) == (0, 1)
    assert [w.activity.duration_ns for w in joiner.add_launch(launch(10, 7, window=2))] == [200]
    assert joiner.pending(10) == (0, 0)


def test_shared_ids_are_counted_when_evicted() -> None:
    joiner = Joiner(max_pending=1)
    joiner.add_launch(launch(10, 7))
    joiner.add_launch(launch(10, 7))
    joiner.add_launch(launch(10, 8))  # evicts id 7 with its queued twin
    assert joiner.stats.launches_unmatched == 2
    assert joiner.pending(10) == (1, 0)


def test_launches_queued_under_one_id_count_towards_the_bound() -> None:
    joiner = Joiner(max_pending=4)
    for _ in range(10):
        joiner.add_launch(launch(10, 7))
    assert joiner.pending(10)[0] <= 4 + 1  # the bound is checked before a new launch joins the queue
    joiner.add_launch(launch(10, 8))
    assert joiner.pending(10) == (1, 0)
    assert joiner.stats.launches_unmatched == 10

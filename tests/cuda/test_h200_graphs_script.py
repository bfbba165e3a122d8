# SPDX-License-Identifier: Apache-2.0
"""The GPU machine's graph-replay script (scripts/h200/graphs.py) checked before device time is spent on it: its
record-level diagnosis counts each sampled graph launch's kernel records, and the sampling spread it reports comes
from resampling the windows (exact when every window sees the same work, wide when windows differ)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from otel_gpu.cuda import abi
from tests import h200_scripts
from tests.cuda.records import kernel, launch, window


@pytest.fixture(scope="module")
def graphs():  # type: ignore[no-untyped-def]
    return h200_scripts.load("graphs")


def _records(windows: int, graph_in: set[int]) -> list[abi.Record]:
    """Per window: one graph launch of 60 kernels of 2 us (in the windows of ``graph_in``) and 60 eager launches of
    one 1.9 us kernel each."""
    records: list[abi.Record] = []
    corr = 1
    for w in range(1, windows + 1):
        if w in graph_in:
            records.append(launch(7, corr, window=w, kind=abi.LAUNCH_GRAPH))
            records += [kernel(7, corr, 2000, graph=5) for _ in range(60)]
            corr += 1
        for _ in range(60):
            records += [launch(7, corr, window=w), kernel(7, corr, 1900)]
            corr += 1
        records.append(window(7, w, covered_ns=w * 1_000_000, elapsed_ns=w * 100_000_000))
    return records


def _split(graphs, records: list[abi.Record]):  # type: ignore[no-untyped-def]
    """The script's inputs from ``records``: launches, kernel records by correlation id, windows and their weights."""
    launches = [r for r in records if isinstance(r, abi.Launch)]
    by_corr: dict[int, list[abi.Activity]] = {}
    for r in records:
        if isinstance(r, abi.Activity):
            by_corr.setdefault(r.correlation_id, []).append(r)
    windows = [r for r in records if isinstance(r, abi.Window)]
    return launches, by_corr, windows, graphs.weigh(windows)


def test_the_diagnosis_counts_each_graph_launchs_kernel_records(graphs) -> None:  # type: ignore[no-untyped-def]
    lines: list[str] = []
    graphs.diagnose(_records(12, set(range(1, 13))), lines)
    text = "\n".join(lines)
    assert "kernel records per sampled graph launch: {60: 12}" in text
    assert "kernel records whose correlation id no sampled launch has: 0" in text
    assert "720 with a graph id" in text
    # the eager kernels' time as a distribution (a mean above the median on the H200: where the tail is)
    assert "eager kernel records' time: n 720, mean 1.90 us, p50 1.90, p90 1.90" in text
    # equal windows: the weighted eager total is the evenly spread one
    assert "weighted by window 72,000 launches, 136.8 ms (at the paces known at each close; at the run's last paces " \
        "136.8 ms); the same windows' total weight spread evenly (x100.0): " \
        "72,000 launches, 136.8 ms" in text


def test_the_spread_is_exact_for_equal_windows_and_wide_for_clustered_work(graphs) -> None:  # type: ignore[no-untyped-def]
    truth = 60 * 2000 / (60 * 1900)
    low, high, count = graphs.ratio_interval(*_split(graphs, _records(40, set(range(1, 41)))))
    assert count == 40 and low == pytest.approx(truth) and high == pytest.approx(truth)
    # graph phases in every other window only: the estimate is half the ratio, and resampling the windows spreads it
    low, high, _ = graphs.ratio_interval(*_split(graphs, _records(40, set(range(1, 41, 2)))))
    assert low < truth / 2 < high and high - low > 0.1


def test_the_count_weighted_ratio_is_exact_where_windows_see_the_graph_half_the_time(graphs) -> None:  # type: ignore[no-untyped-def]
    truth = 60 * 2000 / (60 * 1900)
    records = _records(40, set(range(1, 41, 2)))  # graph launches sampled in every other window
    # each window stands for 100 windows' time (covered 1 ms of 100 ms): the graph ran 4,000 times in all
    records = [replace(r, graph_replays=((0xABC, r.window_id * 100),)) if isinstance(r, abi.Window) else r
               for r in records]
    by_counts, by_windows, replays, sampled = graphs.graph_ratios(*_split(graphs, records))
    assert (replays, sampled) == (4000, 20)
    assert by_counts == pytest.approx(truth)
    assert by_windows == pytest.approx(truth / 2)
    lines: list[str] = []
    graphs.diagnose(records, lines)
    assert f"**{truth:.3f} weighted by replay counts**" in "\n".join(lines)
    # the spread of the agent's estimate: every sampled replay took the same time, so resampling the windows leaves
    # the counted replays x their mean time where it is (by windows it spread around half the ratio, above)
    low, high, _ = graphs.ratio_interval(*_split(graphs, records))
    assert low == pytest.approx(truth) and high == pytest.approx(truth)


def test_the_program_compiles_with_its_reference_part(graphs) -> None:  # type: ignore[no-untyped-def]
    compile(graphs.PROGRAM, "program.py", "exec")
    assert graphs.PROGRAM.startswith(graphs.REFERENCE) and "kernel_time_per_call(calls, " in graphs.PROGRAM


def test_the_weighting_line_takes_a_record_of_the_totals_at_exit(graphs) -> None:  # type: ignore[no-untyped-def]
    """The library's record at exit covers no time: the weighting line left it out of the windows' lengths and raised
    KeyError on the H200."""
    records = _records(12, set(range(1, 13)))
    last = [r for r in records if isinstance(r, abi.Window)][-1]
    records.append(replace(last, window_id=last.window_id + 1, elapsed_ns=last.elapsed_ns + 10**8,
                                       launches=0))
    lines: list[str] = []
    graphs.diagnose(records, lines)
    assert any(line.startswith("- eager weighting: 720 sampled launches") for line in lines)
    assert any(line.startswith("- gaps between windows: median 99.0 ms") for line in lines)


def test_the_lingers_in_each_stretch_are_reported(graphs) -> None:  # type: ignore[no-untyped-def]
    """The lingers' share of the time between windows, from the totals (ABI 7): what the eager side's weights
    depended on before they were weighted by their own launches."""
    records = _records(12, set(range(1, 13)))
    windows = [r for r in records if isinstance(r, abi.Window)]
    for w in windows:
        w.linger_ns = w.window_id * 30_000_000  # 30 ms after each window, of 99 ms between windows
    lines: list[str] = []
    graphs.diagnose(records, lines)
    assert any(line.startswith("- lingers after windows: median 30.0 ms, p99 30.0 ms, max 30.0 ms, 0.303 of the time")
               for line in lines), lines
    assert any("99.0 ms of which 30.0 ms lingering" in line for line in lines)


def test_the_window_table_gives_each_window_its_weight_and_what_it_sampled(graphs, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The per-window CSV the next H200 run brings back: the weight each window got (1 ms windows 100 ms apart at a
    pace of 1: 100), and its sampled launches by kind (graph launches only in the windows that had them)."""
    lines: list[str] = []
    table = tmp_path / "h200-graphs.windows.csv"
    records = [replace(r, open_us=40 * r.window_id) if isinstance(r, abi.Window) else r
               for r in _records(4, {2, 4})]
    # the program launched 60 kernels and one graph each of 400 iterations (one a millisecond): windows 100 ms apart
    # stand for all the kernels, but for half the graphs (they sampled them in every other window only)
    graphs.diagnose(records, lines, per_window=table, per_iteration={abi.LAUNCH_KERNEL: 60, abi.LAUNCH_GRAPH: 1},
                    iterations=400)
    text = "\n".join(lines)
    assert f"every window's weight, pace, sampled launches by kind and switch-on time: {table.name}" in text
    # every window saw the same kernels: no spread; the graph came in two windows of four: a resampling draws
    # none of them, or only them, one time in 16
    assert ("launches weighted by window (at the last paces) over the program's count, with the 95 % interval of "
            "2000 bootstrap resamplings of the windows: kernels 1.000 [1.000, 1.000], graphs 0.500 [0.000, 1.000]") \
        in text
    assert "windows' switch-on time median 120 us, p90 120 us, max 160 us" in text
    header, *rows = [line.split(",") for line in table.read_text().splitlines()]
    assert header[:6] == ["window_id", "opened_s", "covered_ms", "gap_ms", "linger_ms", "weight"]
    row = [dict(zip(header, values, strict=True)) for values in rows]
    assert [r["window_id"] for r in row] == ["1", "2", "3", "4"]
    assert [float(r["weight"]) for r in row] == [100.0] * 4
    assert [float(r["weight_at_last_pace"]) for r in row] == [100.0] * 4  # no launches counted outside: pace 1
    assert [float(r["gap_ms"]) for r in row] == [99.0] * 4
    assert [(r["kernels"], r["graphs"], r["copies"]) for r in row] == [("60", "0", "0"), ("60", "1", "0"),
                                                                      ("60", "0", "0"), ("60", "1", "0")]
    assert [r["open_us"] for r in row] == ["40", "80", "120", "160"]

# SPDX-License-Identifier: Apache-2.0
"""The GPU machine's verification script (scripts/h200/verify_gpu_time.py) is checked here before device time is
spent on it: it loads without torch, explains itself when called wrongly, and its bookkeeping (re-weighted counts
and times, where launches fall in their windows, the accounting of every sampled launch) is right on known records."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from otel_gpu.cuda import abi
from tests import h200_scripts
from tests.cuda.records import kernel, launch
from tests.cuda.test_source_records import FakeSymbolizer

SCRIPT = h200_scripts.SCRIPTS / "verify_gpu_time.py"


@pytest.fixture(scope="module")
def verify():  # type: ignore[no-untyped-def]
    return h200_scripts.load("verify_gpu_time")


def test_without_arguments_it_prints_its_usage_and_exits_2() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "verify_gpu_time.py OUT.md" in done.stdout


def test_the_measured_program_compiles(verify) -> None:  # type: ignore[no-untyped-def]
    compile(verify.PROGRAM, "program.py", "exec")


def test_bookkeeping_of_two_windows(verify, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "10").mkdir()
    source = verify.WindowedSource(proc_root=str(tmp_path), symbolizer=FakeSymbolizer())
    before = source.accounting.join_stats
    # window 1 covers 100 ns of 1000 (weight 10): two launches at 20 % and 90 % of it
    source.handle(launch(10, 1, window=1, timestamp_ns=1020))
    source.handle(launch(10, 2, window=1, timestamp_ns=1090))
    source.handle(kernel(10, 1, 50))
    source.handle(kernel(10, 2, 30))
    source.handle(abi.Window(10, 1, 1000, 1100, 100, 1000, 2, 0, 0, open_us=7))
    # window 2 covers another 100 ns of 1000 more (weight 10): one launch sharing id 1
    source.handle(launch(10, 1, window=2, timestamp_ns=2050))
    source.handle(kernel(10, 1, 40))
    source.handle(abi.Window(10, 2, 2000, 2100, 200, 2000, 1, 0, 0, open_us=9))
    source.accounting.drain(now_ns=3_000)  # the work is weighted at the drain

    counts = source.executions[10]
    assert counts["_Z6matmulPfS_S_i"] == pytest.approx(30.0)  # 3 sampled executions x weight 10
    assert source.positions[10][2] == 1 and source.positions[10][9] == 1 and source.positions[10][5] == 1
    assert source.first_offsets[10] == [20, 50]
    assert source.open_us[10] == [7, 9] and source.per_window[10] == [2, 1]
    assert source.shared_ids(10) == 1
    assert source.fraction(10) == pytest.approx(0.1)
    line = verify.accounting(source, 10, (0, 0), before)
    assert "sampled launches neither joined nor counted: **0**" in line
    assert "(total 3)" in line and "launches sharing an id with another: 1" in line
    assert verify.quantiles([5, 1, 3]) == "1 / 3 / 5 / 5"
    assert verify.median([4, 1, 3, 2]) == 2.5


def test_iteration_rate_inside_and_outside_windows(verify) -> None:  # type: ignore[no-untyped-def]
    """A program slowed down inside the windows (one iteration per 2 s there, per 1 s outside) shows it."""
    spans = [(10_000_000_000, 14_000_000_000), (30_000_000_000, 34_000_000_000)]  # 8 s of 40 inside
    times = [t * 1_000_000_000 for t in range(0, 41)]  # outside: one per second
    times = [t for t in times if not any(a <= t < b for a, b in spans)]
    times += [a + k * 2_000_000_000 for a, _ in spans for k in range(2)]  # inside: one per 2 s
    inside, outside = verify.rate_inside_windows(times, spans, (0, 40_000_000_000))
    assert inside == pytest.approx(0.5) and outside == pytest.approx(33 / 32)
    # windows reaching past the span count only within it
    inside, _ = verify.rate_inside_windows(times, [(-5_000_000_000, 1_000_000_000)], (0, 40_000_000_000))
    assert inside == pytest.approx(1.0)  # the iteration at 0 s, in the 1 s of window inside the span


def test_copies_and_sets_meet_torch_profilers_names(verify) -> None:  # type: ignore[no-untyped-def]
    """The agent names a copy by direction, size and host memory, torch.profiler by direction and memory kinds: the
    accuracy table compares them by direction (the H200 tables read "not in the reference" for every copy)."""
    ours = verify.normalized("[memcpy DtoH 2 B pinned]")
    assert ours == verify.normalized("Memcpy DtoH (Device -> Pinned)")
    assert ours != verify.normalized("Memcpy HtoD (Pinned -> Device)")
    assert verify.normalized("[memset 4.0 MiB]") == verify.normalized("Memset (Device)")
    assert verify.normalized("void at::native::copy_kernel<float>") == "voidat::native::copy_kernel<float>"
    per_iteration = verify.per_name({"Memcpy DtoH (Device -> Pinned)": 30.0, "Memcpy DtoH (Device -> Pageable)": 10.0,
                                     "ampere gemm": 50.0}, 10)
    assert per_iteration == {ours: 4.0, "amperegemm": 5.0}

# SPDX-License-Identifier: Apache-2.0
"""The watch over each process's first seconds (otel_gpu/cpu/watch.py), on a fake /proc: when it checks, what it
reads, and that it stops."""

from __future__ import annotations

from pathlib import Path

import pytest

from otel_gpu.cpu.watch import CHECKS, FIRST_CHECK_S, Change, ProcessWatch

PID = 4242


def _process(root: Path, exe: str, size_pages: int) -> None:
    base = root / str(PID)
    base.mkdir(parents=True, exist_ok=True)
    (base / "exe").unlink(missing_ok=True)
    (base / "exe").symlink_to(exe)
    (base / "statm").write_text(f"{size_pages} 100 50 1 0 20 0\n")


def _looked(watch: ProcessWatch, now_s: float, settled: bool) -> None:
    watch.looked(PID, watch.state(PID), now_s, settled)


def test_a_process_is_checked_at_doubling_delays_after_its_look_and_then_no_more(tmp_path: Path) -> None:
    _process(tmp_path, "/usr/bin/dash", 1000)
    watch = ProcessWatch(str(tmp_path))
    _looked(watch, 100.0, settled=False)
    times = []
    now = 100.0
    while (wait := watch.next_in_s(now)) is not None:
        now += wait
        times.append(round(now - 100.0, 6))
        assert watch.due(now) == []  # nothing changed: nothing to look at
    assert times == [FIRST_CHECK_S * 2 ** k for k in range(CHECKS)]


def test_an_exec_is_looked_at_again_and_restarts_the_schedule(tmp_path: Path) -> None:
    _process(tmp_path, "/usr/bin/dash", 1000)
    watch = ProcessWatch(str(tmp_path))
    _looked(watch, 100.0, settled=True)
    assert watch.due(100.5) == []  # the 1st check (only one row was due)
    _process(tmp_path, "/opt/python/bin/python3.12", 1000)
    assert watch.executable_changed(PID)
    assert watch.due(101.0) == [(PID, Change.EXEC)]
    _looked(watch, 101.0, settled=False)
    assert not watch.executable_changed(PID)
    assert watch.next_in_s(101.0) == pytest.approx(FIRST_CHECK_S)  # anew: the new image is checked soon


def test_a_new_size_brings_a_new_look_only_while_no_interpreter_was_found(tmp_path: Path) -> None:
    _process(tmp_path, "/opt/host", 1000)
    watch = ProcessWatch(str(tmp_path))
    _looked(watch, 100.0, settled=False)
    _process(tmp_path, "/opt/host", 6000)  # libpython mapped
    assert watch.due(100.01) == [(PID, Change.MAPPINGS)]
    _looked(watch, 100.01, settled=True)  # found it: the schedule goes on, for an exec only
    assert watch.next_in_s(100.01) == pytest.approx(FIRST_CHECK_S)
    _process(tmp_path, "/opt/host", 9000)
    assert watch.due(100.02) == []


def test_a_process_that_is_gone_is_dropped(tmp_path: Path) -> None:
    _process(tmp_path, "/usr/bin/dash", 1000)
    watch = ProcessWatch(str(tmp_path))
    _looked(watch, 100.0, settled=False)
    (tmp_path / str(PID) / "exe").unlink()
    assert watch.due(100.01) == [] and watch.next_in_s(100.01) is None
    watch.forget([PID])
    assert not watch.executable_changed(PID)

# SPDX-License-Identifier: Apache-2.0
"""The time the library lingers after each window (its activity kinds on until the window's GPU work arrives) weighted
by the launches counted in it, end to end on the fake CUDA stack: a launch-bound program that replays a graph and
launches eagerly in turn (scripts/h200/graphs.py's program), whose launches slow threefold while CUPTI records them
and whose records CUPTI hands over 20 ms late. Weighted as undisturbed time (the shadows' pace), the lingers made the
eager kernels 20 % heavier than the schedule; on an H200 the same program's eager side came out 16-53 % heavy."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.cuda.graph_phases import FAKES, LIBRARY, mixed


@pytest.fixture(scope="module", autouse=True)
def built() -> None:
    """The library and the fakes (a no-op when `make build` already has)."""
    for folder in (LIBRARY.parent, FAKES):
        subprocess.run(["make", "-s", "-C", str(folder)], check=True, capture_output=True, timeout=600)


def test_eager_launches_are_weighted_right_when_records_come_late(tmp_path: Path) -> None:
    got = mixed(tmp_path, iterations=1000, delivery_delay_us=20_000)
    assert got.windows >= 50
    assert got.linger_ns >= got.windows * 20_000_000  # every window lingered at least as long as the records took
    assert got.pace > 2.0  # windows slow the program threefold: their time alone would under-count it
    graph = [name for name in got.truth_ns if name.startswith("graph_")]
    assert sum(got.estimate_ns[n] for n in graph) == pytest.approx(sum(got.truth_ns[n] for n in graph), rel=0.005)
    assert got.estimate_ns["tiny_kernel"] == pytest.approx(got.truth_ns["tiny_kernel"], rel=0.05)
    assert got.unlingered_ns["tiny_kernel"] > 1.1 * got.truth_ns["tiny_kernel"]  # the same records, weighted as before

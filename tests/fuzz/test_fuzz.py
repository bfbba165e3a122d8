# SPDX-License-Identifier: Apache-2.0
"""Every parser of outside input, fuzzed (coverage-guided, atheris) for a bounded time: no crash, no input slower
than the per-input timeout, memory within the limit, and coverage growing (an uninstrumented parser finds nothing).

Each target runs FUZZ_SECONDS (default 30) in its own process, two at a time (CI has two cores). The longer run of
10^6 inputs each and its numbers: docs/benchmarks.md, "Issue 10: fuzzing the parsers". A failing input is kept
under the test's temporary folder; replay it with ``python -m tests.fuzz.run --replay TARGET FILE``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("atheris", reason="atheris (the test extra) is not installed: pip install -e '.[test]'")

from tests.fuzz import run, targets  # noqa: E402 - only with atheris

SECONDS = int(os.environ.get("FUZZ_SECONDS", "30"))
JOBS = 2


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, run.Result]:
    workdir: Path = tmp_path_factory.mktemp("fuzz")
    return {result.target: result for result in run.fuzz_all(list(targets.TARGETS), workdir, JOBS, seconds=SECONDS)}


@pytest.mark.timeout(900)  # the first test waits for every target: 13 x 30 s two at a time, on a loaded machine
@pytest.mark.parametrize("target", list(targets.TARGETS))
def test_parser_survives_fuzzing(results: dict[str, run.Result], target: str) -> None:
    result = results[target]
    found = "\n".join(result.artifacts)
    assert (result.crashes, result.hangs, result.ooms) == (0, 0, 0), f"{result.line()}\n{found}\n{result.log_tail}"
    assert result.returncode == 0, result.log_tail
    assert result.runs > 0 and result.new_inputs > 0, f"not fuzzed or not instrumented:\n{result.log_tail}"
    assert 0 < result.peak_rss_mb < run.DEFAULT_RSS_LIMIT_MB

# SPDX-License-Identifier: Apache-2.0
"""The GPU machine's turn-taking overhead script (scripts/h200/baton.py), checked before device time is spent on it:
it loads without torch, its child program compiles, bad settings exit 2, and a cycle's loss is computed right."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import h200_scripts

SCRIPT = h200_scripts.SCRIPTS / "baton.py"


@pytest.fixture(scope="module")
def baton():  # type: ignore[no-untyped-def]
    return h200_scripts.load("baton")


def test_the_child_program_compiles_and_every_default_mode_is_defined(baton) -> None:  # type: ignore[no-untyped-def]
    compile(baton.CHILD, "child.py", "exec")
    assert set(baton.MODES) <= set(baton.MODE_SETUP)
    assert {"P", "I"} <= set(baton.MODE_SETUP)


def test_usage_and_a_bad_loop_exit_2(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "Usage: baton.py REPORT.md" in done.stdout
    env = dict(os.environ, BATON_LOOP="conv")
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "r.md")], capture_output=True, text=True,
                          timeout=60, check=False, env=env)
    assert done.returncode == 2 and "BATON_LOOP must be tiny, matmul, graph or mixed" in done.stdout


def test_cycle_losses_pair_each_mode_with_plain_of_the_same_cycle(baton) -> None:  # type: ignore[no-untyped-def]
    # the machine halves its pace in the second cycle: paired within the cycle, the loss stays 10 %
    cycles = [{"P": [100.0, 100.0, 100.0], "I": [90.0, 90.0, 95.0]}, {"P": [50.0, 40.0, 60.0], "I": [45.0, 44.0, 46.0]}]
    assert baton.cycle_losses(cycles, "I") == pytest.approx([0.10, 0.10])
    assert baton.cycle_losses(cycles, "P") == [0.0, 0.0]


def test_cupti_residue_script_prints_usage_and_exits_2() -> None:
    script = SCRIPT.parent / "cupti_residue.py"
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "Usage: cupti_residue.py REPORT.md" in done.stdout

# SPDX-License-Identifier: Apache-2.0
"""The GPU machine's turn-taking overhead script (scripts/h200/baton.py), checked before device time is spent on it:
it loads without torch, its child program compiles, bad settings exit 2, and a cycle's loss is computed right."""

from __future__ import annotations

import ast
import json
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
    assert done.returncode == 2 and "BATON_LOOP must be tiny, matmul, graph, mixed or bursty" in done.stdout


def test_cycle_losses_pair_each_mode_with_plain_of_the_same_cycle(baton) -> None:  # type: ignore[no-untyped-def]
    # the machine halves its pace in the second cycle: paired within the cycle, the loss stays 10 %
    cycles = [{"P": [100.0, 100.0, 100.0], "I": [90.0, 90.0, 95.0]}, {"P": [50.0, 40.0, 60.0], "I": [45.0, 44.0, 46.0]}]
    assert baton.cycle_losses(cycles, "I") == pytest.approx([0.10, 0.10])
    assert baton.cycle_losses(cycles, "P") == [0.0, 0.0]


def test_cupti_residue_script_prints_usage_and_exits_2() -> None:
    script = SCRIPT.parent / "cupti_residue.py"
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "Usage: cupti_residue.py REPORT.md" in done.stdout


FAKE_TORCH = """
class _Tensor:
    def add_(self, value):
        return self
def zeros(*shape, device=None):
    return _Tensor()
class cuda:
    @staticmethod
    def synchronize():
        pass
"""


@pytest.mark.parametrize("loop", ["tiny", "bursty"])
def test_the_child_reports_its_rate_and_step_durations(baton, loop: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The child runs its loop for each turn it is given and answers with its rate and its steps' durations; the
    bursty loop's 50 ms without a CUDA call count in the rate and not in the step (a request's latency). A stand-in
    torch module: the loops' control flow is what runs here, the GPU's part on the device."""
    (tmp_path / "torch.py").write_text(FAKE_TORCH)
    (tmp_path / "child.py").write_text(baton.CHILD)
    done = subprocess.run([sys.executable, str(tmp_path / "child.py"), loop], input="0.3\n0.3\n", capture_output=True,
                          text=True, timeout=60, check=True, env=dict(os.environ, PYTHONPATH=str(tmp_path)))
    lines = done.stdout.splitlines()
    assert lines[0] == "ready" and len(lines) == 3, done.stdout
    for line in lines[1:]:
        turn = json.loads(line)
        assert 0 < turn["p50_ms"] <= turn["p99_ms"] <= turn["max_ms"], turn
        if loop == "bursty":  # 100 kernels a request after 50 ms: the pauses in the rate, not in the steps
            assert turn["rate"] < 2000 and turn["p50_ms"] < 50, turn
        else:
            assert turn["rate"] > 2000, turn


def test_step_latency_takes_the_median_of_the_turns_and_the_longest_step(baton) -> None:  # type: ignore[no-untyped-def]
    turns = [{"p50_ms": 1.0, "p99_ms": 2.0, "max_ms": 9.0}, {"p50_ms": 3.0, "p99_ms": 4.0, "max_ms": 5.0},
             {"p50_ms": 2.0, "p99_ms": 30.0, "max_ms": 31.0}]
    assert baton.step_latency(turns) == "2.00 / 4.00, 31.0"
    assert baton.step_latency([]) == "-"


def test_every_cupti_residue_variant_names_kinds_its_child_knows() -> None:
    """Each variant the residue script runs (an ``_idle`` one: the same kinds on while the process makes no CUDA call)
    is the driver-API callbacks or a set of activity kinds that the child program defines."""
    residue = h200_scripts.load("cupti_residue")
    compile(residue.CHILD, "child.py", "exec")
    kinds = next(ast.literal_eval(node.value) for node in ast.walk(ast.parse(residue.CHILD))
                 if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "KINDS")
    assert {"agent", "agent_idle"} <= set(residue.VARIANTS)
    assert kinds["agent"] == [10, 1, 2, 4]  # the library's default: concurrent kernels, copies, sets, driver API
    for variant in residue.VARIANTS:
        assert variant == "callbacks" or variant.removesuffix("_idle") in kinds, variant


def test_each_process_loss_is_paired_with_plain_cycle_by_cycle(baton) -> None:  # type: ignore[no-untyped-def]
    # two cycles, plain at 100 and then 50 (the machine halved its pace): a process at 95 and 47.5 lost 5 %
    cycles = [{"P": [100.0, 100.0], "I": [95.0, 90.0]}, {"P": [40.0, 60.0], "I": [47.5, 45.0]}]
    assert baton.process_loss(cycles, [95.0, 47.5]) == pytest.approx(0.05)
    assert baton.process_loss(cycles, [100.0, 50.0]) == pytest.approx(0.0)

# SPDX-License-Identifier: Apache-2.0
"""Self-metric reasons, signals and sources come from semconv's enums: no module spells one inline."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from otel_gpu import semconv, selfmetrics

PACKAGE = Path(__file__).resolve().parents[1] / "otel_gpu"
LABELS = {"otel_gpu__reason", "otel_gpu__signal", "otel_gpu__source"}
# functions whose first argument is an otel_gpu.reason
REASON_TAKERS = {"count_error", "_drop"}


def _inline(node: ast.expr) -> bool:
    """A string spelled at the call: a literal, an f-string, or a conditional choosing between such."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.IfExp):
        return _inline(node.body) or _inline(node.orelse)
    return False


def inline_names(source: str, filename: str = "<test>") -> list[str]:
    """``file:line label`` of every self-metric label value spelled inline in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Call):
            continue
        for keyword in node.keywords:
            if keyword.arg in LABELS and _inline(keyword.value):
                found.append(f"{filename}:{node.lineno} {keyword.arg}")
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if name in REASON_TAKERS and node.args and _inline(node.args[-1]):
            found.append(f"{filename}:{node.lineno} {name}")
    return found


def test_no_module_spells_a_reason_signal_or_source_inline() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += inline_names(path.read_text(), str(path.relative_to(PACKAGE.parent)))
    assert found == []


@pytest.mark.parametrize("source", [
    'selfmetrics.count(X, otel_gpu__reason="drain")',
    'selfmetrics.count(X, 3, otel_gpu__reason=f"bpf_{r}", otel_gpu__signal=semconv.Signal.PROFILES)',
    'selfmetrics.count(X, otel_gpu__source="gpu_time", otel_gpu__reason=semconv.Reason.DRAIN)',
    'count_error("timeout")',
    'self._drop(1, "queue_full" if full else semconv.Reason.SHUTDOWN)',
])
def test_the_check_finds_inline_names(source: str) -> None:
    assert len(inline_names(source)) == 1


def test_enum_values_are_recorded_as_plain_strings() -> None:
    selfmetrics.reset()
    selfmetrics.count(semconv.SELF_DROPPED.name, 2, otel_gpu__reason=semconv.Reason.QUEUE_FULL,
                      otel_gpu__signal=semconv.Signal.PROFILES)
    counters, _ = selfmetrics.snapshot()
    (key,) = counters
    assert key == (semconv.SELF_DROPPED.name, (("otel_gpu.reason", "queue_full"), ("otel_gpu.signal", "profiles")))
    assert all(type(value) is str for _, value in key[1])
    selfmetrics.reset()


def test_every_bpf_drop_reason_has_a_member() -> None:
    from otel_gpu.cuda import abi

    assert {semconv.Reason(f"bpf_{reason}") for reason in abi.DROP_REASONS}

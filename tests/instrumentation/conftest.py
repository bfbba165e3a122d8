# SPDX-License-Identifier: Apache-2.0
"""Every test here runs twice: with the span processor's hooks in C (the path taken where `make build` built
_hooks.abi3.so) and with its Python hooks (the fallback), in the test's process and in the programs it starts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from otel_gpu.instrumentation import _processor

PYTHON_HOOKS = Path(__file__).parent / "python_hooks"  # its sitecustomize turns the C hooks off in child programs


@pytest.fixture(autouse=True, params=["c", "python"])
def hooks_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which hooks the processors made in this test run: "c" or "python"."""
    if request.param == "c":
        if not _processor.C_HOOKS:
            pytest.skip("the C hooks are not built (make build) or this SDK's internals are not the known ones")
        return "c"
    monkeypatch.setattr(_processor, "C_HOOKS", False)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, (str(PYTHON_HOOKS), os.environ.get("PYTHONPATH")))))
    return "python"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test marked ``both_paths`` compares or builds the paths itself: it runs once, under the C parameter."""
    once = [item for item in items if item.get_closest_marker("both_paths") is not None
            and getattr(item, "callspec", None) is not None and item.callspec.params.get("hooks_path") == "python"]
    if once:
        config.hook.pytest_deselected(items=once)
        items[:] = [item for item in items if item not in once]

# SPDX-License-Identifier: Apache-2.0
"""Shared test fixtures: where the repository, its virtualenv and its built native parts are."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NATIVE = REPO / "tests" / "native"
BACKENDS = REPO / ".cache" / "backends"


def agent_command(*args: str) -> list[str]:
    """The real agent as a subprocess command line (same interpreter as the tests)."""
    return [sys.executable, "-m", "otel_gpu", *args]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    is_root = os.geteuid() == 0
    has_btf = Path("/sys/kernel/btf/vmlinux").exists()
    for item in items:
        if item.get_closest_marker("root") is not None and not (is_root and has_btf):
            item.add_marker(pytest.mark.skip(reason="needs root and a kernel with BTF (/sys/kernel/btf/vmlinux)"))
        if item.get_closest_marker("gpu") is not None and not Path("/dev/nvidia0").exists():
            item.add_marker(pytest.mark.skip(reason="needs a real NVIDIA GPU (/dev/nvidia0)"))

# SPDX-License-Identifier: Apache-2.0
"""Shared test fixtures: where the repository, its virtualenv and its built native parts are; for BPF tests, another
otel-gpu instance to run beside and the ids of the programs a test loaded."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.ebpf.helpers import BPFLoads

REPO = Path(__file__).resolve().parent.parent
NATIVE = REPO / "tests" / "native"
BACKENDS = REPO / ".cache" / "backends"


def agent_command(*args: str) -> list[str]:
    """The real agent as a subprocess command line (same interpreter as the tests)."""
    return [sys.executable, "-m", "otel_gpu", *args]


def _can_load_bpf() -> bool:
    return os.geteuid() == 0 and Path("/sys/kernel/btf/vmlinux").exists()


@pytest.fixture(scope="session")
def other_agent() -> Iterator[dict[int, str] | None]:
    """Another otel-gpu instance holding every one of our BPF programs (the CPU profiler sampling) for the whole
    session, as on a node that runs the agent; yields its programs by id (None where BPF cannot be loaded).
    Tests that check what they loaded use it to show that they look only at their own programs."""
    if not _can_load_bpf():
        yield None
        return
    from tests.ebpf.helpers import held_by

    process = subprocess.Popen([sys.executable, "-m", "tests.ebpf.other_agent"], cwd=REPO, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdin is not None
    line = process.stdout.readline().split()
    assert line[:2] == ["ready", str(process.pid)], f"the other agent did not start: {line}"
    held = held_by(process.pid)
    assert set(held) == {int(i) for i in line[2:]}, held
    try:
        yield held
    finally:
        process.stdin.close()
        process.wait(timeout=30)


@pytest.fixture
def bpf_loads(monkeypatch: pytest.MonkeyPatch) -> BPFLoads:
    """Records the program ids of every BPFObject this test loads, through a source or directly."""
    from otel_gpu.ebpf.loader import BPFObject
    from tests.ebpf.helpers import BPFLoads

    loads = BPFLoads()
    original = BPFObject.__init__

    def recording_init(self: BPFObject, *args: object, **kwargs: object) -> None:
        original(self, *args, **kwargs)  # type: ignore[arg-type]
        loads.record(self.program_ids())

    monkeypatch.setattr(BPFObject, "__init__", recording_init)
    return loads


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("root") is not None and not _can_load_bpf():
            item.add_marker(pytest.mark.skip(reason="needs root and a kernel with BTF (/sys/kernel/btf/vmlinux)"))
        if item.get_closest_marker("gpu") is not None and not Path("/dev/nvidia0").exists():
            item.add_marker(pytest.mark.skip(reason="needs a real NVIDIA GPU (/dev/nvidia0)"))

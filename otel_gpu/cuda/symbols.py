# SPDX-License-Identifier: Apache-2.0
"""Native frames for launching stacks, through the shared symbolizer (:mod:`otel_gpu.symbolize`).

:class:`NativeSymbolizer` is what the GPU-time source needs; :class:`SharedSymbolizer` adapts the shared
:class:`~otel_gpu.symbolize.symbolizer.Symbolizer` to it (snapshotting a process's mappings when it is first seen,
so stacks of a process that exits are still symbolized).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from otel_gpu.profiles.model import Frame
from otel_gpu.symbolize.symbolizer import Symbolizer


class NativeSymbolizer(Protocol):
    def remember(self, pid: int) -> None:
        """Snapshot what is needed to symbolize ``pid`` later, while it runs."""
        ...

    def frames(self, pid: int, pcs: Sequence[int]) -> tuple[Frame, ...]:
        """Frames for leaf-first ``pcs`` of process ``pid`` (pcs after the first are return addresses)."""
        ...

    def forget(self, pid: int) -> None:
        """``pid`` exited and its records are all handled."""
        ...


class SharedSymbolizer:
    """The shared ELF/perf-map symbolizer behind the :class:`NativeSymbolizer` interface."""

    def __init__(self, symbolizer: Symbolizer | None = None, proc_root: str = "/proc") -> None:
        self._symbolizer = symbolizer or Symbolizer(proc_root)

    def remember(self, pid: int) -> None:
        self._symbolizer.remember(pid)

    def frames(self, pid: int, pcs: Sequence[int]) -> tuple[Frame, ...]:
        if not self._symbolizer.knows(pid):
            self._symbolizer.remember(pid)
        return self._symbolizer.user_stacks(pid, [pcs])[0]

    def forget(self, pid: int) -> None:
        self._symbolizer.prune(keep=())  # forgets processes that no longer exist

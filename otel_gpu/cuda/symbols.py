# SPDX-License-Identifier: Apache-2.0
"""Native frames for launching stacks, through the shared symbolizer (:mod:`otel_gpu.symbolize`).

:class:`NativeSymbolizer` is what the GPU-time source needs; :class:`SharedSymbolizer` adapts the shared
:class:`~otel_gpu.symbolize.symbolizer.Symbolizer` to it (snapshotting a process's mappings when it is first seen,
so stacks of a process that exits are still symbolized). Reading new symbol tables is rationed by the agent's
:class:`~otel_gpu.symbolize.allowance.ReadAllowance`, shared with the CPU source: past it, a frame of a file not read
yet is named file+offset (with its mapping and build id) and the stack is not kept, so a later launch names it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

from otel_gpu.profiles.model import Frame
from otel_gpu.symbolize.allowance import ReadAllowance
from otel_gpu.symbolize.symbolizer import Symbolizer


class NativeSymbolizer(Protocol):
    last_complete: bool  # False when the last frames() left a frame unnamed for now (its file not read yet)

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

    def __init__(self, symbolizer: Symbolizer | None = None, proc_root: str = "/proc",
                 allowance: ReadAllowance | None = None) -> None:
        """``allowance``: None reads every symbol table at once (tests, tools)."""
        self._symbolizer = symbolizer or Symbolizer(proc_root)
        self._allowance = allowance
        self.last_complete = True

    def remember(self, pid: int) -> None:
        self._symbolizer.remember(pid)

    def frames(self, pid: int, pcs: Sequence[int]) -> tuple[Frame, ...]:
        if not self._symbolizer.knows(pid):
            self._symbolizer.remember(pid)
        if self._allowance is None:
            return self._symbolizer.user_stacks(pid, [pcs])[0]
        now = time.monotonic()
        read_before_s, deferred_before = self._symbolizer.read_seconds, self._symbolizer.deferred_frames
        frames = self._symbolizer.user_stacks(pid, [pcs], now + self._allowance.available_s(now))[0]
        self._allowance.spend(self._symbolizer.read_seconds - read_before_s)
        self.last_complete = self._symbolizer.deferred_frames == deferred_before
        return frames

    def forget(self, pid: int) -> None:
        self._symbolizer.prune(keep=())  # forgets processes that no longer exist

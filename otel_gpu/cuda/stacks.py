# SPDX-License-Identifier: Apache-2.0
"""StackFrames: the frames of each launching stack, symbolized once per process and kept while the process lives.

A launch's stack is symbolized when its record arrives (the process may exit before its work is weighted), and most
launches repeat a few stacks, so the frames are cached by (pid, stack) up to ``max_stacks``, oldest out first; a
stack with a frame left unnamed for now (the symbol-reading allowance was spent) is not cached, so a later launch of
it names it. Python frames are merged as in CPU samples (:func:`otel_gpu.cpu.python.merge`): the library marks each
run's entry frame, and each run takes the place of the ``_PyEval_EvalFrameDefault`` frame that runs it, so
Python -> C -> Python reads as such.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Sequence

from otel_gpu.cpu.python import merge
from otel_gpu.cuda import abi, builder
from otel_gpu.cuda.symbols import NativeSymbolizer
from otel_gpu.profiles.model import Frame, FrameKind

MAX_SAMPLE_STACKS = 8192  # (leaf, pid, stack) -> frames kept for samples (past it, kept afresh): a few MB at most

# In otel_gpu_python_frame.first_line: the frame is the outermost its evaluation loop runs (otel_gpu_probes.h).
PYTHON_ENTRY = 0x80000000
# The root of a launching stack whose Python frames the library cut (as CPU samples' TRUNCATED_FRAME): its own root
# is not there, and a flame graph must not show its innermost frames as a root of their own.
PYTHON_TRUNCATED = Frame(f"[truncated: Python frames past the innermost {abi.MAX_PYTHON_FRAMES} not read]",
                         FrameKind.PYTHON)


class FrameStack(tuple[Frame, ...]):
    """A sample's frames, hashed once: samples are summed by their frames, and a tuple hashes each frame every time."""

    _hash: int

    def __new__(cls, frames: tuple[Frame, ...]) -> FrameStack:
        self = super().__new__(cls, frames)
        self._hash = tuple.__hash__(self)
        return self

    def __hash__(self) -> int:
        return self._hash


class StackFrames:
    """(pid, launching stack) -> frames, leaf first, Python frames merged into the native ones."""

    def __init__(self, symbolizer: NativeSymbolizer, max_stacks: int = 65536) -> None:
        self._symbolizer = symbolizer
        self._max_stacks = max_stacks
        self._frames: OrderedDict[tuple[int, abi.Stack], tuple[Frame, ...]] = OrderedDict()
        self._samples: dict[tuple[Frame, int, abi.Stack], FrameStack] = {}  # see sample_frames

    def remember(self, pid: int) -> None:
        """A new process: let the symbolizer snapshot its mappings while it runs."""
        self._symbolizer.remember(pid)

    def frames(self, pid: int, stack: abi.Stack) -> tuple[Frame, ...]:
        key = (pid, stack)
        frames = self._frames.get(key)
        if frames is not None:
            self._frames.move_to_end(key)
            return frames
        if stack.native:
            native = self._symbolizer.frames(pid, stack.native)
        elif stack.kernel_native:  # the kernel's unwind starts inside the library and CUPTI: cut those frames
            native = self._symbolizer.frames(pid, stack.kernel_native)
            while native and native[0].mapping is not None and _is_tracing_library(native[0].mapping.path):
                native = native[1:]
        else:
            native = ()
        frames = merge(native, python_runs(stack.python))
        if stack.flags & abi.STACK_FLAG_PYTHON_TRUNCATED:  # its outermost frames were not read: say so at the root
            frames = (*frames, PYTHON_TRUNCATED)
        if not self._symbolizer.last_complete:
            return frames
        self._frames[key] = frames
        while len(self._frames) > self._max_stacks:
            self._frames.popitem(last=False)
        return frames

    def sample_frames(self, leaf: Frame, pid: int, stack: abi.Stack) -> FrameStack:
        """``leaf`` (the kernel, copy or wait) followed by the stack's frames; kept per (leaf, pid, stack) once the
        stack's frames are kept, so that the samples of a loop's few stacks reuse one hashed tuple each."""
        key = (leaf, pid, stack)
        found = self._samples.get(key)
        if found is not None:
            return found
        frames = FrameStack((leaf,) + self.frames(pid, stack))
        if (pid, stack) in self._frames:  # complete: a stack with a frame unnamed for now is named again next time
            if len(self._samples) >= MAX_SAMPLE_STACKS:
                self._samples.clear()
            self._samples[key] = frames
        return frames

    def forget(self, pid: int) -> None:
        """``pid`` exited and every record of it is handled."""
        self._symbolizer.forget(pid)
        for key in [key for key in self._frames if key[0] == pid]:
            del self._frames[key]
        for sample in [sample for sample in self._samples if sample[1] == pid]:
            del self._samples[sample]


def python_runs(python: Sequence[abi.PythonFrame]) -> tuple[tuple[Frame, ...], ...]:
    """The launch's Python frames, innermost first, cut after each entry frame into runs (as
    :meth:`otel_gpu.cpu.python.CodeReader.runs`); without marks (a reader that cannot tell), one run."""
    runs: list[tuple[Frame, ...]] = []
    start = 0
    for index, frame in enumerate(python):
        if frame.first_line & PYTHON_ENTRY:
            runs.append(builder.python_frames(python[start:index + 1]))
            start = index + 1
    if start < len(python):
        runs.append(builder.python_frames(python[start:]))
    return tuple(runs)


def _is_tracing_library(path: str) -> bool:
    name = os.path.basename(path)
    return name.startswith(("libotel_gpu_inject", "libcupti"))

# SPDX-License-Identifier: Apache-2.0
"""GPU-time launching stacks read symbol tables within the agent's shared allowance (symbolize/allowance.py)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import time

from otel_gpu.cuda import abi
from otel_gpu.cuda.stacks import StackFrames
from otel_gpu.cuda.symbols import SharedSymbolizer
from otel_gpu.profiles.model import Frame, FrameKind
from otel_gpu.symbolize.allowance import ReadAllowance
from otel_gpu.symbolize.symbolizer import Symbolizer


class Clock:
    def __init__(self) -> None:
        self.now = time.monotonic()

    def __call__(self) -> float:
        return self.now


def _libc_function() -> int:
    """The address of a libc function in this process (libc's symbols are read from its file)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    return ctypes.cast(libc.getpid, ctypes.c_void_p).value or 0


def test_a_spent_allowance_defers_the_read_and_a_later_launch_names_the_frame() -> None:
    allowance = ReadAllowance(share=0.0, burst_s=0.0, now_s=time.monotonic())  # nothing may be read
    symbolizer = SharedSymbolizer(Symbolizer(), allowance=allowance)
    stacks = StackFrames(symbolizer)
    stack = abi.Stack(native=(_libc_function(),))
    pid = os.getpid()
    deferred = stacks.frames(pid, stack)
    assert deferred[0].function.startswith("libc") and "+0x" in deferred[0].function
    assert deferred[0].mapping is not None and deferred[0].mapping.build_id  # symbolizable off the node
    assert not symbolizer.last_complete
    allowance.burst_s = 5.0  # the allowance refills
    allowance.share = 1.0
    named = stacks.frames(pid, stack)  # not kept while it was unnamed: read now
    assert symbolizer.last_complete
    assert "getpid" in named[0].function
    assert stacks.frames(pid, stack) is named  # kept once named


def test_a_samples_frames_name_the_frame_once_the_allowance_lets_it() -> None:
    """A sample's frames (leaf + stack) are kept for reuse only once the stack is named: a kernel's GPU time is not
    left on an unnamed frame for the rest of the run."""
    allowance = ReadAllowance(share=0.0, burst_s=0.0, now_s=time.monotonic())
    stacks = StackFrames(SharedSymbolizer(Symbolizer(), allowance=allowance))
    stack = abi.Stack(native=(_libc_function(),))
    leaf = Frame("[matmul]", FrameKind.CUDA)
    pid = os.getpid()
    deferred = stacks.sample_frames(leaf, pid, stack)
    assert deferred[0] is leaf and "+0x" in deferred[1].function
    allowance.burst_s = 5.0
    allowance.share = 1.0
    named = stacks.sample_frames(leaf, pid, stack)
    assert named[0] is leaf and "getpid" in named[1].function
    assert stacks.sample_frames(leaf, pid, stack) is named
    assert named == (leaf, *stacks.frames(pid, stack)) and hash(named) == hash((leaf, *stacks.frames(pid, stack)))


def test_reading_a_symbol_table_spends_the_shared_allowance() -> None:
    start = time.monotonic()
    allowance = ReadAllowance(share=0.0, burst_s=5.0, now_s=start)
    symbolizer = SharedSymbolizer(Symbolizer(), allowance=allowance)
    symbolizer.frames(os.getpid(), [_libc_function()])
    assert symbolizer.last_complete
    assert allowance.available_s(start) < 5.0  # libc's symbol table was read and paid for

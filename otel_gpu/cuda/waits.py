# SPDX-License-Identifier: Apache-2.0
"""Joins blocking waits with the NCCL collectives that ran while the thread was blocked.

A rank of a distributed job that reaches a collective first waits (cuStreamSynchronize, an event, a blocking copy)
while its collective kernel spins for the other ranks; the slowest rank finds its collective about to finish and
barely waits in it. So the part of each wait during which a collective kernel of the same process ran is labelled
with that collective (``nccl.collective``): the fast ranks' waits are all-reduce time, the straggler's are not.

The wait record says neither its stream nor what it waited for; the join is by time, per process, over the NCCL
kernels CUPTI reported: the collectives overlapping the wait. Only launches inside sampling windows have their GPU
work reported, so a wait is joined by time only when it began inside one of its process's windows (``covered``);
any other wait is split as the covered waits of the same stack were (the same call site, step after step), and left
unlabelled while its stack has no covered wait yet. A process that drives several GPUs has the collectives of all of
them overlap its waits: the label says a collective ran, not which device's.

Pure and single-threaded (the accounting owns it); bounded per process.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from dataclasses import dataclass, field

from otel_gpu.cuda import abi
from otel_gpu.cuda.builder import nccl_collective

MAX_SPANS = 4096  # collective kernels kept per process (the newest)
MAX_WINDOWS = 256  # window intervals kept per process
MAX_STACKS = 1024  # wait stacks with a covered history kept per process
# A stack's share forgets: its totals are halved each time they pass this much covered wait, so that when the
# straggler changes, the waits outside windows follow within seconds of covered waits
SHARE_MEMORY_NS = 5_000_000_000


@dataclass(slots=True)
class _StackShare:
    covered_ns: float = 0.0  # covered wait time of this stack
    collective_ns: dict[str, float] = field(default_factory=dict)  # of that, overlapping each collective


@dataclass(slots=True)
class _Process:
    spans: list[tuple[int, int, str]] = field(default_factory=list)  # (start, end, collective), sorted by start
    longest_span_ns: int = 0
    windows: list[tuple[int, int]] = field(default_factory=list)  # (start, end), sorted by start
    stacks: OrderedDict[abi.Stack, _StackShare] = field(default_factory=OrderedDict)


class CollectiveWaits:
    """``add_activity``/``add_window`` as records come; ``split(sync)`` once the wait's GPU work has arrived."""

    def __init__(self) -> None:
        self._processes: dict[int, _Process] = {}

    def add_activity(self, activity: abi.Activity) -> None:
        """Keep ``activity`` if it is an NCCL kernel."""
        if activity.kind != abi.ACTIVITY_KERNEL:
            return
        collective = nccl_collective(activity.name)
        if collective is not None and activity.end_ns > activity.start_ns:
            proc = self._process(activity.pid)
            bisect.insort(proc.spans, (activity.start_ns, activity.end_ns, collective))
            proc.longest_span_ns = max(proc.longest_span_ns, activity.end_ns - activity.start_ns)
            if len(proc.spans) > MAX_SPANS:
                del proc.spans[:len(proc.spans) - MAX_SPANS]

    def add_window(self, window: abi.Window) -> None:
        """Keep the closed window's interval (CUPTI clock, unix ns)."""
        if window.end_ns > window.start_ns:
            proc = self._process(window.pid)
            bisect.insort(proc.windows, (window.start_ns, window.end_ns))
            if len(proc.windows) > MAX_WINDOWS:
                del proc.windows[:len(proc.windows) - MAX_WINDOWS]

    def runs_collectives(self, pid: int) -> bool:
        """Whether an NCCL kernel of ``pid`` was seen (only such a process's waits need joining)."""
        proc = self._processes.get(pid)
        return proc is not None and bool(proc.spans)

    def covered(self, sync: abi.Sync) -> bool:
        """Whether the wait began inside a window of its process (its collectives were recorded)."""
        proc = self._processes.get(sync.pid)
        return proc is not None and self._covered(proc, sync)

    def split(self, sync: abi.Sync) -> list[tuple[str | None, float]]:
        """Shares of the wait: (collective, fraction) per collective that ran during it, then (None, the rest);
        fractions sum to 1."""
        proc = self._processes.get(sync.pid)
        blocked = sync.blocked_ns
        if proc is None or blocked <= 0:
            return [(None, 1.0)]
        if self._covered(proc, sync):
            overlaps = self._overlaps(proc, sync.start_ns, sync.end_ns)
            share = proc.stacks.get(sync.stack)
            if share is None:
                share = proc.stacks[sync.stack] = _StackShare()
                while len(proc.stacks) > MAX_STACKS:
                    proc.stacks.popitem(last=False)
            proc.stacks.move_to_end(sync.stack)
            share.covered_ns += blocked
            for name, ns in overlaps.items():
                share.collective_ns[name] = share.collective_ns.get(name, 0.0) + ns
            if share.covered_ns > SHARE_MEMORY_NS:
                share.covered_ns /= 2
                share.collective_ns = {name: ns / 2 for name, ns in share.collective_ns.items()}
            fractions = {name: ns / blocked for name, ns in overlaps.items()}
        else:
            share = proc.stacks.get(sync.stack)
            if share is None or share.covered_ns <= 0:
                return [(None, 1.0)]
            fractions = {name: ns / share.covered_ns for name, ns in share.collective_ns.items()}
        labelled = sum(fractions.values())
        if labelled > 1.0:  # collectives that overlap each other (several streams): shares of the whole wait
            fractions = {name: value / labelled for name, value in fractions.items()}
            labelled = 1.0
        out: list[tuple[str | None, float]] = [(name, value) for name, value in sorted(fractions.items()) if value > 0]
        if labelled < 1.0:
            out.append((None, 1.0 - labelled))
        return out

    def forget_process(self, pid: int) -> None:
        self._processes.pop(pid, None)

    def _process(self, pid: int) -> _Process:
        proc = self._processes.get(pid)
        if proc is None:
            proc = self._processes[pid] = _Process()
        return proc

    @staticmethod
    def _covered(proc: _Process, sync: abi.Sync) -> bool:
        index = bisect.bisect_right(proc.windows, (sync.start_ns, 1 << 64)) - 1  # the last window begun by then
        return index >= 0 and sync.start_ns < proc.windows[index][1]

    @staticmethod
    def _overlaps(proc: _Process, start_ns: int, end_ns: int) -> dict[str, float]:
        """ns of [start_ns, end_ns) during which a collective of each kind ran (the union of its kernels)."""
        by_name: dict[str, list[tuple[int, int]]] = {}
        first = bisect.bisect_left(proc.spans, (start_ns - proc.longest_span_ns,))
        last = bisect.bisect_left(proc.spans, (end_ns,))
        for span_start, span_end, name in proc.spans[first:last]:
            lo, hi = max(span_start, start_ns), min(span_end, end_ns)
            if hi > lo:
                by_name.setdefault(name, []).append((lo, hi))
        out: dict[str, float] = {}
        for name, pieces in by_name.items():
            pieces.sort()
            total, reach = 0, start_ns
            for lo, hi in pieces:
                lo = max(lo, reach)
                if hi > lo:
                    total += hi - lo
                    reach = hi
            out[name] = float(total)
        return out

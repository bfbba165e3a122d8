# SPDX-License-Identifier: Apache-2.0
"""Weights for CUDA graph replays from exact replay counts (a ratio estimator), instead of sampling windows.

Windows sample launches by time. On clustered work (a phase of graph replays, then an eager phase, each longer than
a window) a window sees one phase or the other, so a graph's window-weighted time spreads widely between runs. The
injected library counts every replay of each graph exec (``graphs.c``) and reports the totals since it attached in
each window record (:attr:`abi.Window.graph_replays`). Over a *stretch* (the windows between two drains) a sampled
replay of exec ``e`` then stands for ``replays(e) / sampled(e)`` replays: the replays counted in the stretch over the
sampled graph launches of ``e`` in its windows. The work of the sampled replays is held, unweighted, until the
stretch ends; their stacks keep their shares of it. An exec replayed in a stretch with no sampled replay (a graph
replayed seldom, or after the process's last window: the library's record at exit counts those replays) is weighted
by its last sampled stretch: that stretch's work per sampled replay, by stack, kernel and span, times the replays
(an exec replays the same kernels each time). One never sampled adds its count to :attr:`GraphReplayWeights.unsampled`
and no time. Execs the library's table had no room for (``graph_other_replays``) are not listed and keep the window
weights, as do eager launches.

Stretches end at window records: a window's record comes after every launch sampled in it has returned (the library
waits for them before it closes the window), so the replays counted up to it include every sampled one. Work that
arrives after its stretch ended (a GPU queue that lags) takes the weight its stretch had. Pure and single-threaded.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from otel_gpu.cuda.abi import LAUNCH_GRAPH, Launch, Window
from otel_gpu.cuda.join import GPUWork

MAX_HELD_WORK = 1 << 20  # pieces of graph work held for their stretch, all processes: past it, window weights
MAX_STRETCHES = 64  # ended stretches remembered per process (their weights), for work that arrives late
MAX_CARRIED_PIECES = 256  # an exec's work per replay kept for stretches without a sample: (stack, kernel) pieces


@dataclass(slots=True)
class _Stretch:
    first_window: int = 0  # the stretch covers windows from this id to the process's newest
    replays: Counter[int] = field(default_factory=Counter)  # exec -> replays counted
    sampled: Counter[int] = field(default_factory=Counter)  # exec -> sampled graph launches in its windows


@dataclass(slots=True)
class _ProcessGraphs:
    totals: dict[int, int] = field(default_factory=dict)  # exec -> the library's last reported total
    elapsed_ns: int = 0  # the last window record's time total, and how often the library had stepped aside
    yields: int = 0
    counted: set[int] = field(default_factory=set)  # execs the library's table holds: weighted by counts
    last_window: int = 0  # the newest window record seen
    sampled_open: Counter[tuple[int, int]] = field(default_factory=Counter)  # (window, exec) not yet closed
    stretch: _Stretch = field(default_factory=_Stretch)
    held: list[tuple[GPUWork, float]] = field(default_factory=list)  # (work, its window weight)
    ended: list[tuple[int, int, dict[int, float]]] = field(default_factory=list)  # (first, last window, weights)
    ended_through: int = 0  # windows up to this id belong to ended stretches
    # exec -> its last sampled stretch's work per replay: (one piece of work, the weight that makes it the mean time
    # per replay of all pieces of its stack and kernel), for its replays in stretches without a sample
    per_replay: dict[int, list[tuple[GPUWork, float]]] = field(default_factory=dict)


class GraphReplayWeights:
    """Per-process replay counts and sampled replays of CUDA graph execs, and the weights they give.

    Feed :meth:`add_launch` and :meth:`add_window` with the records in order; offer each piece of joined work whose
    window has closed to :meth:`take` (True: held or not a counted graph's); :meth:`end_stretch` at each drain
    returns the held work with its weights.
    """

    def __init__(self, max_held: int = MAX_HELD_WORK) -> None:
        self.max_held = max_held
        self.unsampled = 0  # replays of execs never sampled, in stretches without a sample (running total)
        self.carried = 0  # replays in stretches without a sample, weighted by their exec's last sampled stretch
        self._held_count = 0
        self._processes: dict[int, _ProcessGraphs] = {}

    def add_launch(self, launch: Launch) -> None:
        """A sampled launch: a graph's counts as a sampled replay of its exec in its window."""
        if launch.kind == LAUNCH_GRAPH and launch.graph_exec:
            self._process(launch.pid).sampled_open[(launch.window_id, launch.graph_exec)] += 1

    def add_window(self, window: Window) -> None:
        """A window record: the replays counted since the previous one join the stretch, and so do the sampled
        replays of the windows up to it."""
        proc = self._process(window.pid)
        # the library attached again, or took CUPTI back from another tool: its totals count from zero (as
        # join.WindowWeights tells it by its time totals)
        if window.elapsed_ns < proc.elapsed_ns or window.yields != proc.yields:
            proc.totals = {}
        proc.elapsed_ns, proc.yields = window.elapsed_ns, window.yields
        for exec_, total in window.graph_replays:
            before = proc.totals.get(exec_, 0)
            proc.stretch.replays[exec_] += total - before if total >= before else total
            proc.totals[exec_] = total
            proc.counted.add(exec_)
        proc.last_window = max(proc.last_window, window.window_id)
        for key in [key for key in proc.sampled_open if key[0] <= proc.last_window]:
            proc.stretch.sampled[key[1]] += proc.sampled_open.pop(key)

    def take(self, work: GPUWork, window_weight: float) -> tuple[bool, float]:
        """Whether ``work`` (its window closed) is a counted graph's, and the weight to apply now: (False, window
        weight) for other work, (True, weight) for work of an ended stretch, (True, 0.0) when it is held until the
        stretch ends."""
        launch = work.launch
        proc = self._processes.get(launch.pid)
        if (launch.kind != LAUNCH_GRAPH or proc is None or launch.graph_exec not in proc.counted
                or launch.window_id > proc.last_window):
            return False, window_weight
        if launch.window_id <= proc.ended_through:  # late work: its stretch's weight
            for first, last, weights in proc.ended:
                if first <= launch.window_id <= last and launch.graph_exec in weights:
                    return True, weights[launch.graph_exec]
            return False, window_weight  # its stretch is no longer remembered
        if self._held_count >= self.max_held:
            return False, window_weight
        proc.held.append((work, window_weight))
        self._held_count += 1
        return True, 0.0

    def end_stretch(self) -> list[tuple[GPUWork, float]]:
        """The held work of every process with its count weight; new stretches begin."""
        return [item for proc in self._processes.values() for item in self._end(proc)]

    def forget_process(self, pid: int) -> list[tuple[GPUWork, float]]:
        """Drop an exited process; returns its held work weighted by its last stretch (the counts of its last window
        record)."""
        proc = self._processes.pop(pid, None)
        return self._end(proc) if proc is not None else []

    def _end(self, proc: _ProcessGraphs) -> list[tuple[GPUWork, float]]:
        stretch = proc.stretch
        weights: dict[int, float] = {}
        released: list[tuple[GPUWork, float]] = []
        self._remember_per_replay(proc)
        for exec_, replays in stretch.replays.items():
            sampled = stretch.sampled.get(exec_, 0)
            if sampled:
                weights[exec_] = max(replays, sampled) / sampled
            elif replays and exec_ in proc.per_replay:
                released.extend((work, weight * replays) for work, weight in proc.per_replay[exec_])
                self.carried += replays
            else:
                self.unsampled += replays
        released += [(work, weights.get(work.launch.graph_exec, window_weight)) for work, window_weight in proc.held]
        self._held_count -= len(proc.held)
        proc.held = []
        if weights:
            proc.ended.append((stretch.first_window, proc.last_window, weights))
            del proc.ended[:-MAX_STRETCHES]
        proc.ended_through = proc.last_window
        proc.stretch = _Stretch(first_window=proc.last_window + 1)
        return released

    @staticmethod
    def _remember_per_replay(proc: _ProcessGraphs) -> None:
        """Each sampled exec's held work as time per replay, by stack, kernel and span (as a window's weight puts the
        time it stands for in the spans its launches ran in), over the replays whose work has come (a sampled
        replay's work may come after the stretch ended); an exec whose replays hold more than MAX_CARRIED_PIECES
        pieces keeps none."""
        pieces: dict[tuple[object, ...], GPUWork] = {}  # (exec, thread, stack, span, kernel) -> one piece of its work
        totals: Counter[tuple[object, ...]] = Counter()  # the same -> its time in the stretch
        kept: Counter[int] = Counter()  # exec -> its pieces
        replays: dict[int, set[int]] = {}  # exec -> the sampled replays whose work has come (correlation ids)
        too_many: set[int] = set()
        for work, _ in proc.held:
            launch, activity = work.launch, work.activity
            exec_ = launch.graph_exec
            if exec_ not in proc.stretch.sampled or exec_ in too_many or activity.duration_ns <= 0:
                continue
            replays.setdefault(exec_, set()).add(launch.correlation_id)
            key = (exec_, *work.sample_key())
            if key not in pieces:
                if kept[exec_] == MAX_CARRIED_PIECES:
                    too_many.add(exec_)
                    continue
                kept[exec_] += 1
                pieces[key] = work
            totals[key] += activity.duration_ns
        fresh: dict[int, list[tuple[GPUWork, float]]] = {}
        for key, work in pieces.items():
            exec_ = work.launch.graph_exec
            if exec_ not in too_many:
                per_replay = totals[key] / len(replays[exec_])
                fresh.setdefault(exec_, []).append((work, per_replay / work.activity.duration_ns))
        for exec_ in too_many:
            proc.per_replay.pop(exec_, None)
        proc.per_replay.update(fresh)

    def _process(self, pid: int) -> _ProcessGraphs:
        proc = self._processes.get(pid)
        if proc is None:
            proc = self._processes[pid] = _ProcessGraphs()
        return proc

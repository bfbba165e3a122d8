# SPDX-License-Identifier: Apache-2.0
"""Joins sampled launches with their GPU activity by (pid, correlation id), and turns sampling windows into weights.

Pure and single-threaded (the source serialises calls). Whichever side arrives second completes the pair; a graph
launch stays after its first match so that every kernel of the graph is attributed to the graph launch's stack.
CUPTI does not keep correlation ids unique (CUDA 13 hands the same id to several launches, in one window or in
several): launches that share an id are queued and take its pieces of work in order, never overwritten.
Maps are bounded per process: the oldest entries are evicted and unmatched ones counted as join misses. A launch
whose GPU work has not arrived ``max_lag_ns`` of launch time after it (the injected library itself gives up after
3 s and counts it as dropped in its window record) is let go and counted as a miss too, never silently kept.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field, replace

from otel_gpu.cuda.abi import LAUNCH_GRAPH, Activity, Launch, Window


@dataclass(frozen=True, slots=True)
class GPUWork:
    """One piece of completed GPU work (kernel, copy, set) with the launch that caused it."""

    launch: Launch
    activity: Activity

    def sample_key(self) -> tuple[object, ...]:
        """What makes its sample in a profile: thread, stack, span and the work's leaf and attributes. Pieces of
        work with one key add up to one sample, so one of them with their summed time stands for all."""
        launch, activity = self.launch, self.activity
        return (launch.tid, launch.stack, launch.trace_id, launch.span_id, activity.kind, activity.name,
                activity.bytes, activity.copy_kind, activity.src_kind, activity.dst_kind, activity.device_id,
                activity.stream_id, activity.graph_id)


@dataclass(slots=True)
class JoinStats:
    """Counts since the joiner was created."""

    joined: int = 0
    launches_unmatched: int = 0   # launches evicted (or forgotten) before any activity arrived
    activities_unmatched: int = 0  # activities evicted (or forgotten) before their launch arrived
    launches_duplicate_id: int = 0  # launches whose correlation id an unmatched earlier launch still held (queued)


@dataclass(slots=True)
class _ProcessJoin:
    launches: OrderedDict[int, tuple[Launch, bool]] = field(default_factory=OrderedDict)  # corr -> (launch, matched)
    activities: OrderedDict[int, list[Activity]] = field(default_factory=OrderedDict)
    queued: dict[int, list[Launch]] = field(default_factory=dict)  # corr -> later launches with the same id, FIFO
    queued_count: int = 0
    parked_activities: int = 0
    max_id: int = 0
    newest_launch_ns: int = 0


class Joiner:
    """Pairs :class:`Launch` and :class:`Activity` records of the same (pid, correlation id).

    ``max_pending`` bounds, per process, both the launches kept and the activities waiting for their launch;
    ``id_window`` drops entries whose correlation id is that far behind the newest one seen (ids grow per process);
    ``max_lag_ns`` drops launches whose work has not arrived by the time a launch that much later is seen.
    """

    def __init__(self, max_pending: int = 65536, id_window: int = 1 << 20,
                 max_lag_ns: int = 10_000_000_000) -> None:
        self.max_pending = max_pending
        self.id_window = id_window
        self.max_lag_ns = max_lag_ns
        self.stats = JoinStats()
        self._processes: dict[int, _ProcessJoin] = {}

    def add_launch(self, launch: Launch) -> list[GPUWork]:
        """Record ``launch``; returns the work completed by activities that arrived before it."""
        proc = self._process(launch.pid, launch.correlation_id)
        proc.newest_launch_ns = max(proc.newest_launch_ns, launch.timestamp_ns)
        waiting = proc.activities.pop(launch.correlation_id, [])
        if waiting and launch.kind != LAUNCH_GRAPH and len(waiting) > 1:
            # CUPTI reuses correlation ids (seen on CUDA 13): an eager launch takes one piece of work, the rest
            # stays parked for the next launch with the same id.
            proc.activities[launch.correlation_id] = waiting[1:]
            waiting = waiting[:1]
        proc.parked_activities -= len(waiting)
        done = [GPUWork(launch, activity) for activity in waiting]
        held = proc.launches.get(launch.correlation_id)
        if not done and held is not None and not held[1]:
            # The id is still held by a launch without work: never overwrite it (that loses a launch silently);
            # queue this one, it takes the id's next piece of work after the earlier launch got its own.
            proc.queued.setdefault(launch.correlation_id, []).append(launch)
            proc.queued_count += 1
            self.stats.launches_duplicate_id += 1
        elif not done or launch.kind == LAUNCH_GRAPH:
            proc.launches[launch.correlation_id] = (launch, bool(done))
            proc.launches.move_to_end(launch.correlation_id)
        self.stats.joined += len(done)
        self._bound(proc)
        return done

    def add_activity(self, activity: Activity) -> list[GPUWork]:
        """Record ``activity``; returns its work when the launch is known, else parks it."""
        proc = self._process(activity.pid, activity.correlation_id)
        entry = proc.launches.get(activity.correlation_id)
        if entry is None:
            proc.activities.setdefault(activity.correlation_id, []).append(activity)
            proc.parked_activities += 1
            self._bound(proc)
            return []
        launch, _ = entry
        queue = proc.queued.get(activity.correlation_id)
        if queue:
            proc.launches[activity.correlation_id] = (queue.pop(0), False)
            proc.queued_count -= 1
            if not queue:
                del proc.queued[activity.correlation_id]
        elif launch.kind == LAUNCH_GRAPH:
            proc.launches[activity.correlation_id] = (launch, True)
        else:
            del proc.launches[activity.correlation_id]
        self.stats.joined += 1
        return [GPUWork(launch, activity)]

    def forget_process(self, pid: int) -> None:
        """Drop a process that exited; what is still unmatched counts as misses."""
        proc = self._processes.pop(pid, None)
        if proc is not None:
            self.stats.launches_unmatched += sum(1 for _, matched in proc.launches.values() if not matched)
            self.stats.launches_unmatched += proc.queued_count
            self.stats.activities_unmatched += proc.parked_activities

    def pids(self) -> set[int]:
        return set(self._processes)

    def pending(self, pid: int) -> tuple[int, int]:
        """(launches kept, activities parked) for ``pid``."""
        proc = self._processes.get(pid)
        return (len(proc.launches) + proc.queued_count, proc.parked_activities) if proc else (0, 0)

    def _process(self, pid: int, correlation_id: int) -> _ProcessJoin:
        proc = self._processes.get(pid)
        if proc is None:
            proc = self._processes[pid] = _ProcessJoin()
        proc.max_id = max(proc.max_id, correlation_id)
        return proc

    def _bound(self, proc: _ProcessJoin) -> None:
        oldest_kept = proc.max_id - self.id_window
        oldest_ns = proc.newest_launch_ns - self.max_lag_ns
        while proc.launches:  # in launch order (a graph launch keeps its place while its kernels arrive)
            corr, (launch, matched) = next(iter(proc.launches.items()))
            kept = len(proc.launches) + proc.queued_count
            if kept <= self.max_pending and corr >= oldest_kept and launch.timestamp_ns >= oldest_ns:
                break
            proc.launches.popitem(last=False)
            self.stats.launches_unmatched += (not matched) + len(proc.queued.get(corr, ()))
            proc.queued_count -= len(proc.queued.pop(corr, ()))
        while proc.activities:
            corr, waiting = next(iter(proc.activities.items()))
            if proc.parked_activities <= self.max_pending and corr >= oldest_kept:
                break
            proc.activities.popitem(last=False)
            proc.parked_activities -= len(waiting)
            self.stats.activities_unmatched += len(waiting)


PACE_PRIOR_WAITS = 100  # waits seen in windows and in shadow windows at which the pace by waits counts half
PACE_PRIOR_LAUNCHES = 100  # launches seen in windows and in shadow windows at which the pace by launches counts half
PACE_BOUNDS = (0.5, 8.0)  # an H200 smoke run's tiny kernels: 36k launches/s in windows, ~147k/s outside (4.1x)


def measured_pace(window: Window) -> tuple[float, float] | None:
    """How much faster the program ran outside windows than inside, and how far to trust it (0..1: the fewer side's
    count over itself plus its prior): launches per second in the gaps' shadow windows (counting only) over launches
    per second in windows, or, for a library that counted no launches in shadows, the same by blocking waits (totals
    since the library started, or since a base: :func:`since`); None until both sides have seen one (a count below
    its base, from a garbled record, is none)."""
    if min(window.launches_total, window.shadow_launches, window.covered_ns, window.shadow_launch_ns) > 0:
        pace = (window.shadow_launches / window.shadow_launch_ns) / (window.launches_total / window.covered_ns)
        seen, prior = min(window.launches_total, window.shadow_launches), PACE_PRIOR_LAUNCHES
    elif min(window.window_waits, window.shadow_waits, window.covered_ns, window.shadow_ns) > 0:
        pace = (window.shadow_waits / window.shadow_ns) / (window.window_waits / window.covered_ns)
        seen, prior = min(window.window_waits, window.shadow_waits), PACE_PRIOR_WAITS
    else:
        return None
    return pace, seen / (seen + prior)


def pace_ratio(window: Window) -> float:
    """:func:`measured_pace`, shrunk toward 1 while few events were seen and kept within ``PACE_BOUNDS``; 1 for a
    program that neither launches nor waits outside windows."""
    measured = measured_pace(window)
    if measured is None:
        return 1.0
    pace, trust = measured
    return min(PACE_BOUNDS[1], max(PACE_BOUNDS[0], 1.0 + (pace - 1.0) * trust))


def linger_pace(window: Window, pace: float) -> float:
    """How much faster the program ran in lingers (after windows, while their GPU work was awaited with the activity
    kinds on) than in windows: launches per second counted in lingers over those in windows (totals since the library
    started), shrunk toward 1 (a window's pace) while few were seen, and at most ``pace`` (the shadows': nothing runs
    faster than undisturbed)."""
    if min(window.linger_ns, window.launches_total, window.covered_ns) <= 0 or window.linger_launches < 0:
        return 1.0  # nothing lingered or launched in windows yet, or a count below its base (garbled)
    measured = (window.linger_launches / window.linger_ns) / (window.launches_total / window.covered_ns)
    seen = min(window.launches_total, window.linger_launches)
    trust = seen / (seen + PACE_PRIOR_LAUNCHES)
    return min(max(pace, 1.0), max(PACE_BOUNDS[0], 1.0 + (measured - 1.0) * trust))


def since(window: Window, base: Window | None) -> Window:
    """``window`` with its pace totals (windows', shadows', lingers') counted from ``base`` (None: from the start)."""
    if base is None:
        return window
    return replace(window, covered_ns=window.covered_ns - base.covered_ns,
                   launches_total=window.launches_total - base.launches_total,
                   shadow_launches=window.shadow_launches - base.shadow_launches,
                   shadow_launch_ns=window.shadow_launch_ns - base.shadow_launch_ns,
                   window_waits=window.window_waits - base.window_waits,
                   shadow_waits=window.shadow_waits - base.shadow_waits, shadow_ns=window.shadow_ns - base.shadow_ns,
                   linger_ns=window.linger_ns - base.linger_ns,
                   linger_launches=window.linger_launches - base.linger_launches)


def shadow_paces(window: Window, launch_base: Window | None, wait_base: Window | None) -> tuple[float, float]:
    """(pace, linger pace) with each side's rates counted over the same stretch of the run: by launches from
    ``launch_base``, the process's last record before its shadow windows counted launches, by waits from
    ``wait_base``, its last before they counted waits (None: from the start). Counted from the start, the windows of a
    program's first second (imports, warm-up: 15 windows, one launch) made its windows' launch rate seem 8x slower than
    its shadows' where it was 2.1x, and the pace took 15 s to come down to 2.5 (an H100 run of
    scripts/h200/graphs.py)."""
    by_launches = since(window, launch_base)
    if by_launches.launches_total and by_launches.shadow_launches:
        pace = pace_ratio(by_launches)
    else:
        pace = pace_ratio(since(window, wait_base))
    return pace, linger_pace(by_launches, pace)


@dataclass(slots=True)
class _Parts:
    """What a window's stretch holds outside windows per ns inside it: plain time (undisturbed) and lingering time.
    Its weight is 1 + pace * plain + linger pace * lingered, with the paces as the process's newest totals give them."""

    plain: float = 0.0
    lingered: float = 0.0


@dataclass(slots=True)
class _Totals:
    """A process's totals as of its newest window record, and what :class:`WindowWeights` derived from them."""

    covered: int = 0
    elapsed: int = 0
    lingered: int = 0
    parts: _Parts = field(default_factory=_Parts)
    yields: int = 0
    last_id: int = 0  # the last window with time covered, and its length
    last_len: int = 0
    newest_id: int = 0  # the newest record's window id
    paces: tuple[float, float] = (1.0, 1.0)  # (pace, linger pace) from the newest record's totals
    # the last records before the shadow windows counted launches, and waits (:func:`shadow_paces`)
    bases: tuple[Window | None, Window | None] = (None, None)


class WindowWeights:
    """Per-process weights of sampling windows: a window stands for the time since the previous window closed.

    The library reports, at each window's close, the totals ``covered_ns`` (time inside windows) and ``elapsed_ns``
    (time since it started). Window w's weight is (covered + pace * (elapsed - covered)) / covered over the stretch of
    time it represents (differences of the totals at w and at the previous window): the inverse of the sampling
    fraction, so weighted sums are unbiased even when the fraction adapts (differences of totals also survive a lost
    window record). ``pace`` (:func:`pace_ratio`) scales the time outside windows by how much faster the program ran
    there: observing launches slows a program that waits on the GPU every iteration (2 % on an H200 for one that does
    6 launches in 2 ms), and windows then see that much less of its work than their share of the time.
    The lingers after windows are outside them but not undisturbed: the activity kinds stay on while the sampled
    launches' GPU work is awaited, and the program runs nearly as slowly as in a window. Their time (``linger_ns``) is
    scaled by :func:`linger_pace` instead (the launches counted in them): scaled by the shadows' pace, a launch-bound
    program whose records came 20 ms late came out 20 % heavier on the fake CUPTI.

    Each window keeps its stretch's parts, not a number: :meth:`weight` applies the paces of the process's newest
    totals, so work weighted late (the accounting holds an interval's work until its drain) takes the pace measured
    over every window so far. Taken at each window's close, the pace of a program's first few windows (a handful of
    launches in whichever phase of its loop they fell) weighted an H200 program's first seconds at 8x where its run
    settled at 2.1x, and its eager kernels came out 1.55x torch.profiler's.

    The time after a process's last window has no window after it to stand for it: the library's record of the totals
    at exit (no window in it: no time covered, no launches, not stepping aside) gives it to the last window, whose
    weight grows by pace * (that time) / (its length) (:meth:`take_tail`: the caller re-weights the work it has
    already accounted of that window).
    """

    def __init__(self, max_windows: int = 4096) -> None:
        self.max_windows = max_windows
        self._parts: dict[int, OrderedDict[int, _Parts]] = {}
        self._last: dict[int, _Totals] = {}
        self._tails: dict[int, tuple[int, _Parts]] = {}  # pid -> (its last window, the parts it took on) not taken

    def add(self, window: Window) -> tuple[float, int, int]:
        """Record ``window``; returns (its weight at the paces known now, covered delta ns, elapsed delta ns)."""
        last = self._last.get(window.pid) or _Totals()
        # the library re-attached, or took CUPTI back from another tool: its totals restart (the time in between
        # stands for nothing: it is reported as yielded, not extrapolated into)
        if window.elapsed_ns < last.elapsed or window.covered_ns < last.covered or window.yields != last.yields \
                or window.linger_ns < last.lingered:
            last = _Totals(parts=last.parts)
        covered = window.covered_ns - last.covered
        elapsed = window.elapsed_ns - last.elapsed
        windows = self._parts.setdefault(window.pid, OrderedDict())
        parts, last_id, last_len = last.parts, last.last_id, last.last_len
        if covered <= 0 or elapsed < covered:
            parts = parts if covered <= 0 else _Parts()
            if covered == 0 and elapsed > 0 and not window.launches and not window.aside_since_ns and last_len \
                    and last_id in windows:  # the totals at exit: the last window stands for the time since too
                tail = _outside(elapsed, window.linger_ns - last.lingered, last_len)
                lasts = windows[last_id]
                windows[last_id] = _Parts(lasts.plain + tail.plain, lasts.lingered + tail.lingered)
                self._tails[window.pid] = (last_id, tail)
        else:
            parts = _outside(elapsed - covered, window.linger_ns - last.lingered, covered)
            last_id, last_len = window.window_id, covered
        bases = (window if not window.shadow_launch_ns else last.bases[0],
                 window if not window.shadow_ns else last.bases[1])
        self._last[window.pid] = _Totals(window.covered_ns, window.elapsed_ns, window.linger_ns, parts,
                                         window.yields, last_id, last_len, window.window_id,
                                         shadow_paces(window, *bases), bases)
        windows[window.window_id] = parts
        while len(windows) > self.max_windows:
            windows.popitem(last=False)
        return self._weigh(window.pid, parts), max(covered, 0), max(elapsed, 0)

    def _weigh(self, pid: int, parts: _Parts) -> float:
        pace, lingering = self.paces(pid)
        return 1.0 + pace * parts.plain + lingering * parts.lingered

    def take_tail(self, pid: int) -> tuple[int, float] | None:
        """(window id, added weight at the paces known now) when the record just added gave ``pid``'s last window the
        time after it."""
        tail = self._tails.pop(pid, None)
        return None if tail is None else (tail[0], self._weigh(pid, tail[1]) - 1.0)

    def weight(self, pid: int, window_id: int) -> float | None:
        """The weight of a closed window at the paces known now, None while it is still open (or unknown)."""
        windows = self._parts.get(pid)
        parts = windows.get(window_id) if windows else None
        return None if parts is None else self._weigh(pid, parts)

    def latest(self, pid: int) -> float:
        """The weight of the process's last closed window (1.0 before any): for work whose window never closed."""
        last = self._last.get(pid)
        return self._weigh(pid, last.parts) if last else 1.0

    def paces(self, pid: int) -> tuple[float, float]:
        """(pace, linger pace) as the process's newest record gives them (1, 1 before any)."""
        last = self._last.get(pid)
        return last.paces if last else (1.0, 1.0)

    def newest(self, pid: int) -> int:
        """The window id of the process's newest record (0 before any)."""
        last = self._last.get(pid)
        return last.newest_id if last else 0

    def forget_process(self, pid: int) -> None:
        self._parts.pop(pid, None)
        self._last.pop(pid, None)
        self._tails.pop(pid, None)


def _outside(outside_ns: int, lingered_ns: int, covered_ns: int) -> _Parts:
    """``outside_ns`` of time outside windows, ``lingered_ns`` of it in lingers, per ns of ``covered_ns``."""
    lingered = min(max(lingered_ns, 0), outside_ns)
    return _Parts((outside_ns - lingered) / covered_ns, lingered / covered_ns)

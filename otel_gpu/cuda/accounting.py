# SPDX-License-Identifier: Apache-2.0
"""GPUTimeAccounting: decoded GPU-time records in, weighted profiles and per-process counters out.

It joins launches with their GPU activity (:class:`~otel_gpu.cuda.join.Joiner`), weights each piece of work by its
sampling window (:class:`~otel_gpu.cuda.join.WindowWeights`: the interval's work is held until its drain, then
weighted at the pace measured over every window so far) or, for CUDA graph replays the library counted, by the exact
replay counts (:class:`~otel_gpu.cuda.graphs.GraphReplayWeights`: scaled at the drain by replays over sampled replays
of each graph exec), accumulates
the gpu_time and sync_wait profiles of the interval, keeps cumulative per-process counters and counts what was lost.
The waits of a process that runs NCCL kernels are held until their collectives' records can have come (one cut-off
for every process, :data:`SETTLE_LAG_NS`) and split by the collectives that ran while they blocked
(:mod:`otel_gpu.cuda.waits`); its counters count them at once.
It reads no kernel state and starts no thread: the caller feeds records one at a time and serializes the calls
(:class:`~otel_gpu.cuda.source.GPUTimeSource` holds a lock), so it is tested with records built by hand.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from otel_gpu import selfmetrics, semconv
from otel_gpu.cuda import abi, builder
from otel_gpu.cuda.graphs import GraphReplayWeights
from otel_gpu.cuda.join import GPUWork, Joiner, JoinStats, WindowWeights
from otel_gpu.cuda.stacks import StackFrames
from otel_gpu.cuda.waits import CollectiveWaits
from otel_gpu.procfs import ProcessInfo, ProcessResolver
from otel_gpu.profiles.model import Frame, ProfileBatch, gpu_time_profile_type, sync_wait_profile_type
from otel_gpu.symbolize.demangle import Demangler

# the GPU-time source's parts log under its name, as its log lines always have
_logger = logging.getLogger("otel_gpu.cuda.source")

SOURCE = semconv.Source.GPU_TIME

WorkObserver = Callable[[GPUWork, float], None]
MAX_HELD_SYNCS = 65536  # waits held for their collectives, all processes: past it the oldest is accounted at once
# A collective process's waits of the last second of an interval go to the next one: their collectives' records come
# after the window closes (CUPTI's buffers, the library's linger). One cut-off for every process keeps each
# interval's waits comparable between the ranks of a job (a per-process rule would move one rank's waits and not
# another's, and name a straggler that is not one).
SETTLE_LAG_NS = 1_000_000_000
MAX_LEAVES = 4096  # leaf frames of GPU work kept by kernel, copy or set (past it, kept afresh)
# pieces of GPU work held for the drain, all processes (past it, the oldest is weighted at once with what is known then:
# at a 20 % budget an H100 program's tiny eager kernels gave 4,000 a second). Each holds its launch and activity (their
# stack and kernel name shared with the interval's other pieces: ~0.5 KB), so at most ~16 MB.
MAX_HELD_WORK = 1 << 15
MAX_TAIL_PIECES = 4096  # a process's last window's work kept by thread, stack and kernel, for the time after it
# exited processes whose counters wait for a metrics collection to read their last values (past it, oldest first go:
# with no metrics reader at all, they would wait for ever)
MAX_EXITED_COUNTERS = 4096
# a process that sent records (its waits) but no sampling window for this long is named once in the log: its GPU time
# goes unmeasured, and nothing else says so. Longer than the library's gaps between windows at a small budget (their
# mean was 6.6 s at 0.3 % sampled, each 0.5-1.5x the mean) and than a graph program's five looks at its launch rate.
NO_WINDOW_NOTICE_NS = 30_000_000_000


@dataclass(slots=True)
class _LastWindow:
    """A process's newest window's work by thread, stack, kernel and span: one piece of each and their time, for the
    time after the process's last window (in the spans of that window's work, as a window's weight puts the time
    before it in the spans its launches ran in)."""

    window_id: int
    pieces: dict[tuple[object, ...], tuple[GPUWork, int]] = field(default_factory=dict)


@dataclass(slots=True)
class ProcessCounters:
    """Cumulative per-process totals since the agent saw the process (estimates, re-weighted)."""

    info: ProcessInfo
    launches: float = 0.0
    kernel_time_ns: float = 0.0
    sync_wait_ns: float = 0.0
    since_ns: int = 0  # start of the time the library's windows account for (CUPTI clock, unix ns)
    until_ns: int = 0  # end of the last closed window
    covered_ns: int = 0  # time inside sampling windows seen by the agent; covered/elapsed = sampling fraction
    elapsed_ns: int = 0
    yielded_ns: int = 0  # the library's running total of time left to another CUPTI user (torch.profiler, ...)
    aside_since_ns: int = 0  # the library stepped aside then and is not back yet (CUPTI clock, unix ns), else 0
    aside_counted_ns: int = 0  # of that stretch, what drains have already counted as yielded
    unmeasured_ns: int = 0  # time stood aside that the profiles have stated since the agent saw the process


@dataclass(slots=True)
class _Interval:
    covered_ns: int = 0
    elapsed_ns: int = 0
    # by pid: time the library stood aside in each process (another CUPTI user held CUPTI, or its CUDA graphs)
    yielded_ns: dict[int, int] = field(default_factory=dict)

    def add_yielded(self, pid: int, ns: int) -> None:
        if ns > 0:
            self.yielded_ns[pid] = self.yielded_ns.get(pid, 0) + ns


class GPUTimeAccounting:
    """``handle(record)`` for each decoded record, ``drain(now_ns)`` each interval -> [gpu_time, sync_wait]."""

    def __init__(self, resolver: ProcessResolver, stacks: StackFrames, alive: Callable[[int], bool], *,
                 max_pending_per_process: int = 65536, started_ns: int = 0, count_graphs: bool = True) -> None:
        """``alive(pid)`` says whether a process still runs; ``started_ns`` (unix ns) starts the first interval;
        ``count_graphs=False`` weights graph replays by their windows like other launches (for comparisons)."""
        self._resolver = resolver
        self._stacks = stacks
        self._alive = alive
        self._joiner = Joiner(max_pending=max_pending_per_process)
        self._weights = WindowWeights()
        self._graphs = GraphReplayWeights() if count_graphs else None
        self._unsampled_seen = 0
        self._held: deque[tuple[GPUWork, int]] = deque()  # joined work held for the drain, drains waited
        self._shared: dict[object, object] = {}  # the held work's stacks and kernel names, one object each (drains)
        self._held_launches: dict[tuple[int, int], int] = {}  # (pid, window) -> launches it sampled, for the drain
        self._last_windows: dict[int, _LastWindow] = {}
        self._waits = CollectiveWaits()
        self._held_syncs: deque[tuple[abi.Sync, int]] = deque()  # waits of NCCL processes whose work may come, drains
        self._gpu = builder.ProfileAccumulator(gpu_time_profile_type())
        self._sync = builder.ProfileAccumulator(sync_wait_profile_type())
        self._interval = _Interval()
        self._interval_start_ns = started_ns
        self._processes: OrderedDict[int, ProcessInfo] = OrderedDict()
        self._counters: dict[int, ProcessCounters] = {}
        self._exited: list[int] = []
        self._reads = 0  # times the counters were read (metrics collections)
        self._first_drain_ns: dict[int, int] = {}  # pid -> the first drain that saw it (unix ns)
        self._told: set[int] = set()  # pids already named in the log for going unmeasured
        self._older: set[int] = set()  # pids named in the log for running the library of the release before
        self._exited_counters: OrderedDict[int, int] = OrderedDict()  # pid -> reads when its exit was noticed
        self._drops_seen = [0] * len(abi.DROP_REASONS)
        self._misses_seen = (0, 0)
        self._duplicates_seen = 0
        self._work_observers: list[WorkObserver] = []
        self._work_leaves: dict[tuple[object, ...], tuple[Frame, tuple[tuple[str, str | int], ...]]] = {}
        self._sync_leaves: dict[tuple[int, int], Frame] = {}
        self.records = 0

    # --- records in ------------------------------------------------------------------------------------------------

    def handle(self, record: abi.Record) -> None:
        """Account for one decoded record."""
        self.records += 1
        if record.pid not in self._processes:
            self.remember_process(record.pid)
        if isinstance(record, abi.Launch):
            self._stacks.frames(record.pid, record.stack)  # symbolize while the process is alive
            if self._graphs is not None:
                self._graphs.add_launch(record)
            for work in self._joiner.add_launch(record):
                self._account(work)
        elif isinstance(record, abi.Activity):
            self._waits.add_activity(record)
            for work in self._joiner.add_activity(record):
                self._account(work)
        elif isinstance(record, abi.Sync):
            self._on_sync(record)
        else:
            self._on_window(record)

    def remember_process(self, pid: int) -> ProcessInfo:
        """Note ``pid`` (its identity and mappings are read now, while it runs); returns its identity."""
        info = self._processes.get(pid)
        if info is None:
            if self._exited_counters.pop(pid, None) is not None:  # the pid was reused: the old process's totals go
                self._counters.pop(pid, None)
            info = self._resolver.info(pid) or ProcessInfo(pid=pid, executable_name="")
            self._processes[pid] = info
            self._stacks.remember(pid)
        return info

    def observe_work(self, observer: WorkObserver) -> None:
        """Call ``observer(work, weight)`` for each piece of GPU work as it is weighted (verification scripts)."""
        self._work_observers.append(observer)

    def _on_sync(self, sync: abi.Sync) -> None:
        self._counter(sync.pid).sync_wait_ns += sync.blocked_ns * sync.weight
        if self._waits.runs_collectives(sync.pid):  # the collectives it waited in may not have arrived yet
            self._stacks.frames(sync.pid, sync.stack)  # symbolize while the process is alive
            self._held_syncs.append((sync, 0))
            if len(self._held_syncs) > MAX_HELD_SYNCS:  # bounded memory: the oldest goes with what is known now
                self._add_sync(self._held_syncs.popleft()[0])
        else:
            self._add_sync(sync)

    def _add_sync(self, sync: abi.Sync) -> None:
        """The wait's sample, split by the NCCL collectives that ran while it blocked (:mod:`otel_gpu.cuda.waits`)."""
        value = sync.blocked_ns * sync.weight
        leaf = self._sync_leaves.get((sync.cbid, sync.kind))
        if leaf is None:
            leaf = self._sync_leaves[(sync.cbid, sync.kind)] = builder.sync_frame(sync)  # a few driver calls
        frames = self._stacks.sample_frames(leaf, sync.pid, sync.stack)
        api = (semconv.CUDA_SYNC_API, builder.sync_api_name(sync))
        for collective, fraction in self._waits.split(sync):
            attributes = (api, (semconv.NCCL_COLLECTIVE, collective)) if collective else (api,)
            self._sync.add(sync.pid, frames, value * fraction, sync.tid, sync.comm, attributes, sync.trace_id,
                           sync.span_id)

    def _settle_syncs(self, now_ns: int, final: bool = False) -> None:
        """Waits whose collectives have arrived: those that ended :data:`SETTLE_LAG_NS` before ``now_ns``, all of
        an exited process, any that has waited a drain. The waits inside windows go first: they teach their stacks'
        shares to those outside (one whose stack has no share goes unlabelled: holding it longer would move it to a
        later interval than the same wait of another rank)."""
        still: deque[tuple[abi.Sync, int]] = deque()
        ready: list[tuple[abi.Sync, int]] = []
        for sync, age in self._held_syncs:
            if final or age >= 1 or sync.end_ns <= now_ns - SETTLE_LAG_NS or not self._alive(sync.pid):
                ready.append((sync, age))
            else:
                still.append((sync, age + 1))
        ready.sort(key=lambda item: not self._waits.covered(item[0]))  # stable: in order within each kind
        for sync, _ in ready:
            self._add_sync(sync)
        self._held_syncs = still

    def _on_window(self, window: abi.Window) -> None:
        self._waits.add_window(window)
        if self._graphs is not None:
            self._graphs.add_window(window)
        _, covered, elapsed = self._weights.add(window)
        tail = self._weights.take_tail(window.pid)
        if tail is not None:
            self._add_tail(window.pid, *tail)
        self._interval.covered_ns += covered
        self._interval.elapsed_ns += elapsed
        counters = self._counter(window.pid)
        if window.abi_version != abi.ABI_VERSION and window.pid not in self._older:
            self._older.add(window.pid)
            _logger.info("GPU-time: pid %d (%s) runs the injection library of the release before (ABI %d, loaded "
                         "before the agent was upgraded): profiled, its windows weighted without this release's "
                         "linger totals; it loads this release's library when it starts again", window.pid,
                         _name(counters.info), window.abi_version)
        if window.launches:
            key = (window.pid, window.window_id)
            self._held_launches[key] = self._held_launches.get(key, 0) + window.launches
        counters.covered_ns += covered
        counters.elapsed_ns += elapsed
        if not counters.since_ns or elapsed == window.elapsed_ns:  # first window, or the library re-attached
            counters.since_ns = window.end_ns - window.elapsed_ns
        counters.until_ns = max(counters.until_ns, window.end_ns)
        self._account_yielded(counters, window)
        if window.dropped:
            selfmetrics.count(semconv.SELF_DROPPED.name, window.dropped,
                              otel_gpu__reason=semconv.Reason.INJECTED_LIBRARY,
                              otel_gpu__signal=semconv.Signal.PROFILES)

    def _account_yielded(self, counters: ProcessCounters, window: abi.Window) -> None:
        """Time the library left CUPTI to another tool of the program: stated per interval, never extrapolated into.
        While it is away, each drain counts the time so far; its next record's total settles the rest."""
        if window.aside_since_ns:  # the library steps aside now
            counters.aside_since_ns, counters.aside_counted_ns = window.aside_since_ns, 0
            if window.pid not in self._told:
                self._told.add(window.pid)
                _logger.info("GPU-time: pid %d (%s): the injected library stepped aside (another tool of the program "
                             "such as torch.profiler took CUPTI, or its CUDA graphs launch too often for CUPTI's "
                             "lasting cost; its stderr says which): its GPU time is not measured until the library "
                             "takes CUPTI back (the profiles state the seconds, %s)", window.pid,
                             _name(counters.info), semconv.OTEL_GPU_GPU_TIME_YIELDED)
        elif window.yielded_ns > counters.yielded_ns:  # back: its total covers the whole stretch
            self._add_yielded(counters, window.yielded_ns - counters.yielded_ns - counters.aside_counted_ns)
            counters.aside_since_ns = counters.aside_counted_ns = 0
        counters.yielded_ns = window.yielded_ns

    def _account(self, work: GPUWork) -> None:
        """Holds ``work`` for the drain, when its window's weight takes the pace of every window so far (its stack and
        kernel name shared with the held work's equal ones: a loop's launches repeat a few stacks)."""
        work.launch.stack = self._shared.setdefault(work.launch.stack, work.launch.stack)  # type: ignore[assignment]
        work.activity.name = self._shared.setdefault(work.activity.name, work.activity.name)  # type: ignore[assignment]
        self._held.append((work, 0))
        if len(self._held) > MAX_HELD_WORK:  # bounded memory: the oldest goes with what is known now
            oldest = self._held.popleft()[0]
            pid = oldest.launch.pid
            weight = self._weights.weight(pid, oldest.launch.window_id)
            self._add_work(oldest, self._weights.latest(pid) if weight is None else weight)

    def _add_work(self, work: GPUWork, weight: float) -> None:
        """Adds ``work`` with its window's ``weight``, or hands a counted graph replay's to the replay weights."""
        if self._graphs is not None:
            counted, weight = self._graphs.take(work, weight)
            if counted:
                if weight:  # else held until the drain ends its stretch
                    self._add_weighted(work, weight)
                return
        self._note_last_window(work)
        self._add_weighted(work, weight)

    def _note_last_window(self, work: GPUWork) -> None:
        launch, activity = work.launch, work.activity
        last = self._last_windows.get(launch.pid)
        if last is None or launch.window_id > last.window_id:
            last = self._last_windows[launch.pid] = _LastWindow(launch.window_id)
        elif launch.window_id < last.window_id or activity.duration_ns <= 0:
            return
        key = work.sample_key()
        piece = last.pieces.get(key)
        if piece is not None:
            last.pieces[key] = (piece[0], piece[1] + activity.duration_ns)
        elif len(last.pieces) < MAX_TAIL_PIECES:
            last.pieces[key] = (work, activity.duration_ns)

    def _add_tail(self, pid: int, window_id: int, weight: float) -> None:
        """The time after ``pid``'s last window, at ``weight`` more of that window's work (its work still to come
        takes it with the window's weight)."""
        last = self._last_windows.get(pid)
        if last is None or last.window_id != window_id:
            return
        for piece, total_ns in last.pieces.values():
            self._add_weighted(piece, weight * total_ns / piece.activity.duration_ns)

    def _add_weighted(self, work: GPUWork, weight: float) -> None:
        for observe in self._work_observers:
            observe(work, weight)
        launch, activity = work.launch, work.activity
        value = activity.duration_ns * weight
        leaf, attributes = self._work_leaf(activity)
        frames = self._stacks.sample_frames(leaf, launch.pid, launch.stack)
        self._gpu.add(launch.pid, frames, value, launch.tid, launch.comm, attributes, launch.trace_id, launch.span_id)
        self._counter(launch.pid).kernel_time_ns += value

    def _work_leaf(self, activity: abi.Activity) -> tuple[Frame, tuple[tuple[str, str | int], ...]]:
        """The leaf frame and sample attributes of ``activity`` (:mod:`builder`), kept by what they are made of: a
        loop runs the same few kernels. A kernel name c++filt has not answered for yet is not kept (asked again)."""
        shape = (activity.kind, activity.name, activity.bytes, activity.copy_kind, activity.src_kind,
                 activity.dst_kind, activity.device_id, activity.stream_id, activity.graph_id)
        leaf = self._work_leaves.get(shape)
        if leaf is None:
            leaf = (builder.work_frame(activity), builder.work_attributes(activity))
            if leaf[0].function != activity.name or not Demangler.is_mangled(activity.name):
                if len(self._work_leaves) >= MAX_LEAVES:
                    self._work_leaves.clear()
                self._work_leaves[shape] = leaf
        return leaf

    # --- profiles out ----------------------------------------------------------------------------------------------

    def drain(self, now_ns: int, bpf_drops: Sequence[int] | None = None, *, final: bool = False) -> list[ProfileBatch]:
        """The gpu_time and sync_wait batches of the interval that ends at ``now_ns`` (unix ns; each batch may have
        no processes). ``bpf_drops``: the eBPF program's running totals by :data:`abi.DROP_REASONS`, if loaded;
        ``final``: the last drain, which holds no wait back."""
        self._release_held(final)
        self._end_graph_stretch()
        self._settle_syncs(now_ns, final)
        processes = dict(self._processes)
        fraction = (self._interval.covered_ns / self._interval.elapsed_ns) if self._interval.elapsed_ns else 1.0
        start, duration = self._interval_start_ns, max(0, now_ns - self._interval_start_ns)
        self._count_aside(now_ns)
        # stated per process: with several, a batch-wide total would not say whose time went unmeasured
        yielded = {pid: ((semconv.OTEL_GPU_GPU_TIME_YIELDED, ns / 1e9),)
                   for pid, ns in self._interval.yielded_ns.items()}
        gpu = self._gpu.build(start, duration, processes, fraction, process_attributes=yielded)
        sync = self._sync.build(start, duration, processes, 1.0)
        self._interval = _Interval()
        self._interval_start_ns = now_ns
        if bpf_drops is not None:
            self._count_bpf_drops(bpf_drops)
        self._count_join_losses()
        self._tell_unsampled(now_ns, final)
        self._forget_exited()
        return [gpu, sync]

    def _tell_unsampled(self, now_ns: int, final: bool) -> None:
        """One log line per process that sent records but had no sampling window in its first
        :data:`NO_WINDOW_NOTICE_NS`, or exited (or the agent stops) without one: none of its GPU time was measured.
        A process that sent nothing (a forked child never touches CUDA) is not named."""
        for pid, info in self._processes.items():
            first = self._first_drain_ns.setdefault(pid, now_ns)
            counters = self._counters.get(pid)
            if pid in self._told or counters is None or counters.covered_ns:
                continue
            exited = not self._alive(pid)
            if not exited and not final and now_ns - first < NO_WINDOW_NOTICE_NS:
                continue
            self._told.add(pid)
            when = "exited with" if exited else f"has had for {(now_ns - first) / 1e9:.0f} s"
            _logger.info("GPU-time: pid %d (%s) %s no sampling window, so none of its GPU time was measured: windows "
                         "open seconds apart at a small overhead budget (a process shorter than the first gap gets "
                         "none), a program that uses CUDA graphs gets none while the library looks at its launch rate "
                         "(5 looks at least 1 s apart, then it samples or stands aside; its stderr says which), nor "
                         "does one whose CUPTI another tool holds (OTEL_GPU_DEBUG_STATS=1 in its environment prints "
                         "the library's state at exit)", pid, _name(info), when)

    def _end_graph_stretch(self) -> None:
        """Held graph work, weighted by replays over sampled replays of its exec in the interval; replays of execs
        with no sampled replay add no time and are counted as dropped (``graph_replays_not_sampled``)."""
        if self._graphs is None:
            return
        for work, weight in self._graphs.end_stretch():
            self._add_weighted(work, weight)
        if self._graphs.unsampled > self._unsampled_seen:
            selfmetrics.count(semconv.SELF_DROPPED.name, self._graphs.unsampled - self._unsampled_seen,
                              otel_gpu__reason=semconv.Reason.GRAPH_REPLAYS_NOT_SAMPLED,
                              otel_gpu__signal=semconv.Signal.PROFILES)
            self._unsampled_seen = self._graphs.unsampled

    @property
    def graph_replays_not_sampled(self) -> int:
        """Replays of CUDA graphs that had no sampled replay in their interval (no time attributed), since the start."""
        return self._graphs.unsampled if self._graphs is not None else 0

    def _release_held(self, final: bool) -> None:
        """The held work of closed windows, weighted at the paces known now; work whose window has not closed waits,
        weighted by the process's last window once the process is gone, the work has waited two drains (the library
        closes a window at exit, so this is rare) or, for a graph replay, a later window's record came (its own was
        lost: it joins the replay counts' stretch now). Then each window's sampled launches, in the counters."""
        still: deque[tuple[GPUWork, int]] = deque()
        for work, age in self._held:
            launch = work.launch
            weight = self._weights.weight(launch.pid, launch.window_id)
            if weight is None:
                lost = self._graphs is not None and launch.kind == abi.LAUNCH_GRAPH \
                    and launch.window_id < self._weights.newest(launch.pid)
                if not (final or lost or age + 1 >= 2 or not self._alive(launch.pid)):
                    still.append((work, age + 1))
                    continue
                weight = self._weights.latest(launch.pid)
            self._add_work(work, weight)
        self._held = still
        self._shared.clear()
        for (pid, window_id), launches in self._held_launches.items():
            self._counter(pid).launches += launches * (self._weights.weight(pid, window_id) or 1.0)
        self._held_launches.clear()

    def _add_yielded(self, counters: ProcessCounters, ns: int) -> None:
        if ns > 0:
            self._interval.add_yielded(counters.info.pid, ns)
            counters.unmeasured_ns += ns

    def _count_aside(self, now_ns: int) -> None:
        for counters in self._counters.values():
            if counters.aside_since_ns:
                so_far = max(0, now_ns - counters.aside_since_ns)
                self._add_yielded(counters, so_far - counters.aside_counted_ns)
                counters.aside_counted_ns = max(so_far, counters.aside_counted_ns)

    def _count_bpf_drops(self, totals: Sequence[int]) -> None:
        for index, (reason, total) in enumerate(zip(abi.DROP_REASONS, totals, strict=True)):
            if total > self._drops_seen[index]:
                selfmetrics.count(semconv.SELF_DROPPED.name, total - self._drops_seen[index],
                                  otel_gpu__reason=semconv.Reason(f"bpf_{reason}"),
                                  otel_gpu__signal=semconv.Signal.PROFILES)
                self._drops_seen[index] = total

    def _count_join_losses(self) -> None:
        stats = self._joiner.stats
        misses = (stats.launches_unmatched, stats.activities_unmatched)
        for (reason, now, before) in ((semconv.Reason.JOIN_LAUNCH_UNMATCHED, misses[0], self._misses_seen[0]),
                                      (semconv.Reason.JOIN_ACTIVITY_UNMATCHED, misses[1], self._misses_seen[1])):
            if now > before:
                selfmetrics.count(semconv.SELF_DROPPED.name, now - before, otel_gpu__reason=reason,
                                  otel_gpu__signal=semconv.Signal.PROFILES)
        self._misses_seen = misses
        if stats.launches_duplicate_id > self._duplicates_seen:
            # The injected library keeps ids unique; a repeat means CUPTI behaves otherwise: the joiner's queue pairs
            # the launches in order, but work under a shared id may go to the wrong stack.
            if self._duplicates_seen == 0:
                _logger.warning("GPU-time: CUPTI gave one correlation id to several sampled launches; their GPU time "
                                "may go to the wrong stacks (counted in %s, reason correlation_id_reused)",
                                semconv.SELF_ERRORS.name)
            selfmetrics.count(semconv.SELF_ERRORS.name, stats.launches_duplicate_id - self._duplicates_seen,
                              otel_gpu__source=SOURCE, otel_gpu__reason=semconv.Reason.CORRELATION_ID_REUSED)
            self._duplicates_seen = stats.launches_duplicate_id

    def _forget_exited(self) -> None:
        """Drop the state of exited processes; their counters stay until the metrics have read them after the drain
        that noticed the exit (a metrics interval may be longer than the profiling interval: read one drain later,
        a short process's last values never reached the metrics), at most :data:`MAX_EXITED_COUNTERS` of them."""
        for pid, reads in list(self._exited_counters.items()):
            if self._reads > reads:
                del self._exited_counters[pid]
                self._counters.pop(pid, None)
        self._exited = [pid for pid in self._processes if not self._alive(pid)]
        for pid in self._exited:
            if pid in self._counters:
                self._exited_counters[pid] = self._reads
            while len(self._exited_counters) > MAX_EXITED_COUNTERS:
                self._counters.pop(self._exited_counters.popitem(last=False)[0], None)
            self._joiner.forget_process(pid)
            if self._graphs is not None:
                self._graphs.forget_process(pid)  # already released: the drain ended every stretch first
            self._weights.forget_process(pid)
            self._last_windows.pop(pid, None)
            self._waits.forget_process(pid)
            self._stacks.forget(pid)
            self._first_drain_ns.pop(pid, None)
            self._told.discard(pid)
            self._older.discard(pid)
            del self._processes[pid]

    # --- per-process -----------------------------------------------------------------------------------------------

    def process_counters(self) -> list[ProcessCounters]:
        """Cumulative totals of every process seen (copies); an exited process's are forgotten at the first drain
        after a call has read its last values (the metrics' collections call this)."""
        self._reads += 1
        return [replace(c) for c in self._counters.values()]

    def dropped(self) -> dict[str, int]:
        """Records the eBPF program could not deliver since open, by reason (as of the last drain)."""
        return dict(zip(abi.DROP_REASONS, self._drops_seen, strict=True))

    @property
    def join_stats(self) -> JoinStats:
        """The joiner's running totals since the start (a copy)."""
        return replace(self._joiner.stats)

    def unpaired(self, pid: int) -> tuple[int, int]:
        """(launches, activities) of ``pid`` still waiting for their other half."""
        return self._joiner.pending(pid)

    def _counter(self, pid: int) -> ProcessCounters:
        counters = self._counters.get(pid)
        if counters is None:
            counters = self._counters[pid] = ProcessCounters(self.remember_process(pid))
        return counters


def _name(info: ProcessInfo) -> str:
    return info.service_name or info.executable_name or "?"

# SPDX-License-Identifier: Apache-2.0
"""GPUTimeSource: GPU time by launching stack, and CPU time blocked on the GPU, for every injected process.

It loads ebpf/programs/gpu_time.bpf.o, attaches its four USDT handlers system-wide to each distinct copy of
libotel_gpu_inject.so it finds mapped (new processes every ``rescan_interval_s``, every process again every
``full_rescan_s``, for those that initialise CUDA late), reads the ring buffer on a thread every ``poll_interval_s``
(the program wakes it early only when a quarter of the buffer is used),
symbolizes each launching stack as it arrives (so a process that exits keeps its stacks), joins launches with
their GPU activity (:mod:`otel_gpu.cuda.join`) and re-weights by the sampling windows. ``drain()`` returns the
gpu_time and sync_wait batches of the interval; :meth:`process_counters` feeds the per-process metrics.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from otel_gpu import selfmetrics, semconv
from otel_gpu.cuda import abi, builder
from otel_gpu.cuda.discovery import LIBRARY_NAME, InjectedLibrary, scan
from otel_gpu.cuda.join import GPUWork, Joiner, WindowWeights
from otel_gpu.cuda.symbols import NativeSymbolizer, SharedSymbolizer
from otel_gpu.ebpf import PROGRAMS_DIR
from otel_gpu.errors import SourceUnavailable
from otel_gpu.procfs import ProcessInfo, ProcessResolver
from otel_gpu.profiles.model import Frame, ProfileBatch, gpu_time_profile_type, sync_wait_profile_type

if TYPE_CHECKING:
    from otel_gpu.ebpf.loader import BPFObject, RingBuffer

_logger = logging.getLogger(__name__)

PROGRAM_PATH = PROGRAMS_DIR / "gpu_time.bpf.o"
# Attach order matters: the library starts recording as soon as any semaphore is set. Windows first (so every
# weight is known), launches last (so every launch seen has its activity and window probes in place).
PROBES = (("otel_gpu_window", "window"), ("otel_gpu_activity", "activity"), ("otel_gpu_sync", "sync"),
          ("otel_gpu_launch", "launch"))
_SOURCE = "gpu_time"
_HOW_TO = ("run workloads with `otel-gpu inject -- python train.py`, or set CUDA_INJECTION64_PATH={path} in their "
           "environment (containers: mount the library and set the same variable)")


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


@dataclass(slots=True)
class _Interval:
    covered_ns: int = 0
    elapsed_ns: int = 0
    yielded_ns: int = 0  # time another CUPTI user held CUPTI in profiled processes (summed over processes)


class GPUTimeSource:
    """Mirrors the CPU profile source: ``open()``, ``drain() -> [gpu_time batch, sync_wait batch]``, ``close()``."""

    name = _SOURCE

    def __init__(self, resolver: ProcessResolver | None = None, *, proc_root: str = "/proc",
                 program_path: str | os.PathLike[str] = PROGRAM_PATH, ringbuf_bytes: int = 4 << 20,
                 poll_interval_s: float = 0.1, rescan_interval_s: float = 2.0, full_rescan_s: float = 10.0,
                 library_name: str = LIBRARY_NAME,
                 symbolizer: NativeSymbolizer | None = None, max_pending_per_process: int = 65536) -> None:
        self._resolver = resolver or ProcessResolver(proc_root)
        self._proc_root = proc_root
        self._program_path = Path(program_path)
        self._ringbuf_bytes = ringbuf_bytes
        self._poll_interval_s = poll_interval_s
        self._rescan_interval_s = rescan_interval_s
        self._full_rescan_s = full_rescan_s
        self._checked: dict[int, float] = {}  # pid -> when its maps were last read (monotonic s)
        self._library_name = library_name
        self._symbolizer: NativeSymbolizer = symbolizer or SharedSymbolizer(proc_root=proc_root)
        self._lock = threading.RLock()  # join, weights, accumulators, processes
        self._ring_lock = threading.Lock()  # libbpf's ring buffer has one consumer at a time
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bpf: BPFObject | None = None
        self._ring: RingBuffer | None = None
        self._attached: dict[tuple[int, int], InjectedLibrary] = {}
        self._failed: set[tuple[int, int]] = set()
        self._last_scan = 0.0
        # join and weighting state (guarded by _lock)
        self._joiner = Joiner(max_pending=max_pending_per_process)
        self._weights = WindowWeights()
        self._pending: list[tuple[GPUWork, int]] = []  # joined work whose window has not closed, drains waited
        self._gpu = builder.ProfileAccumulator(gpu_time_profile_type())
        self._sync = builder.ProfileAccumulator(sync_wait_profile_type())
        self._interval = _Interval()
        self._interval_start_ns = time.time_ns()
        self._processes: OrderedDict[int, ProcessInfo] = OrderedDict()
        self._counters: dict[int, ProcessCounters] = {}
        self._exited: list[int] = []
        self._stack_frames: OrderedDict[tuple[int, abi.Stack], tuple[Frame, ...]] = OrderedDict()
        self._drops_seen = [0] * len(abi.DROP_REASONS)
        self._misses_seen = (0, 0)
        self._duplicates_seen = 0
        self.records = 0
        self.decode_errors = 0

    # --- lifecycle -------------------------------------------------------------------------------------------------

    def open(self) -> None:
        """Load the eBPF program and start watching for injected processes.

        Raises SourceUnavailable when the program cannot load (not root, no BTF, not built, no libbpf).
        """
        try:
            from otel_gpu.ebpf.loader import BPFError, BPFObject
        except (ImportError, OSError) as exc:
            raise SourceUnavailable(f"GPU-time profiling needs libbpf.so.1 (apt install libbpf1): {exc}") from exc
        if not self._program_path.is_file():
            raise SourceUnavailable(f"GPU-time profiling: {self._program_path} is missing (run `make build`)")
        if not Path("/sys/kernel/btf/vmlinux").exists():
            raise SourceUnavailable("GPU-time profiling needs a kernel with BTF (/sys/kernel/btf/vmlinux)")
        try:
            self._bpf = BPFObject(self._program_path, max_entries={"events": self._ringbuf_bytes},
                                  rodata={"wakeup_bytes": self._ringbuf_bytes // 4})
            self._ring = self._bpf.ring_buffer("events", self._on_record)
        except (BPFError, OSError) as exc:
            if self._bpf is not None:
                self._bpf.close()
                self._bpf = None
            raise SourceUnavailable(f"GPU-time profiling could not load its eBPF program (needs root, or "
                                    f"CAP_BPF+CAP_PERFMON): {exc}") from exc
        self.rescan()
        if not self._attached:
            _logger.info("GPU-time profiling is waiting: no process has %s loaded; %s", self._library_name,
                         _HOW_TO.format(path=_library_hint()))
        self._thread = threading.Thread(target=self._run, name="otel-gpu-gpu-time", daemon=True)
        self._thread.start()

    def stop_polling(self) -> None:
        """Stop reading records in the background (the agent's last report comes next): records then reach the
        per-process counters only through drain, so the last profiles hold everything the counters counted."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def close(self) -> None:
        """Stop polling, detach every probe and free the program (idempotent)."""
        self.stop_polling()
        with self._ring_lock:
            if self._bpf is not None:
                self._bpf.close()
                self._bpf = None
                self._ring = None
        self._attached.clear()

    # --- discovery -------------------------------------------------------------------------------------------------

    def rescan(self) -> list[InjectedLibrary]:
        """Attach to library files not seen before; returns the newly attached ones."""
        now = self._last_scan = time.monotonic()
        # A process is read again only every full_rescan_s: new processes are found within rescan_interval_s, and
        # one that initialises CUDA later within full_rescan_s, at a fraction of the cost of reading every map.
        skip = {pid for pid, at in self._checked.items() if now - at < self._full_rescan_s}
        skip.add(os.getpid())
        checked: set[int] = set()
        libraries, pids = scan(self._proc_root, self._library_name, frozenset(skip), checked)
        self._checked = {pid: at for pid, at in self._checked.items() if pid in skip and self._alive(pid)}
        self._checked.update({pid: now for pid in checked})
        with self._lock:
            for pid in pids:
                self._remember_process(pid)
        added: list[InjectedLibrary] = []
        for key, library in libraries.items():
            if key in self._attached or key in self._failed or self._bpf is None:
                continue
            try:
                for program, probe in PROBES:
                    self._bpf.attach_usdt(program, library.host_path, "otel_gpu", probe)
            except OSError as exc:
                self._failed.add(key)
                _logger.warning("GPU-time profiling cannot attach to %s (pid %d): %s", library.path, library.pid, exc)
                selfmetrics.count(semconv.SELF_ERRORS.name, otel_gpu__source=_SOURCE, otel_gpu__reason="attach")
                continue
            self._attached[key] = library
            added.append(library)
            _logger.info("GPU-time profiling attached to %s (first seen in pid %d)", library.path, library.pid)
        return added

    @property
    def attached_libraries(self) -> list[InjectedLibrary]:
        return list(self._attached.values())

    # --- polling ---------------------------------------------------------------------------------------------------

    def _run(self) -> None:
        timeout_ms = max(1, int(self._poll_interval_s * 1000))
        failures = 0
        while not self._stop.is_set():
            try:
                with self._ring_lock:
                    if self._ring is not None:
                        # the program wakes us only when the buffer fills up; otherwise read every poll interval
                        self._ring.poll(timeout_ms)
                        self._ring.consume()
                if time.monotonic() - self._last_scan >= self._rescan_interval_s:
                    self.rescan()
            except Exception:  # loop boundary: keep polling
                failures += 1
                if failures == 1:
                    _logger.exception("GPU-time polling failed (counting further failures in otel_gpu.source.errors)")
                selfmetrics.count(semconv.SELF_ERRORS.name, otel_gpu__source=_SOURCE, otel_gpu__reason="poll")
                self._stop.wait(1.0)

    def poll_now(self) -> int:
        """Consume every record available now (tests, and drain)."""
        with self._ring_lock:
            return self._ring.consume() if self._ring is not None else 0

    def _on_record(self, data: bytes) -> None:
        try:
            record = abi.decode_event(data)
        except abi.DecodeError as exc:
            with self._lock:
                self.decode_errors += 1
                if self.decode_errors == 1:
                    _logger.warning("GPU-time: undecodable record (%s); counting further ones", exc)
            selfmetrics.count(semconv.SELF_ERRORS.name, otel_gpu__source=_SOURCE, otel_gpu__reason="decode")
            return
        self.handle(record)

    def handle(self, record: abi.Record) -> None:
        """Feed one decoded record (the ring-buffer callback; tests may call it directly)."""
        with self._lock:
            self.records += 1
            self._remember_process(record.pid)
            if isinstance(record, abi.Launch):
                self._frames(record.pid, record.stack)  # symbolize while the process is alive
                for work in self._joiner.add_launch(record):
                    self._account(work)
            elif isinstance(record, abi.Activity):
                for work in self._joiner.add_activity(record):
                    self._account(work)
            elif isinstance(record, abi.Sync):
                self._on_sync(record)
            else:
                self._on_window(record)

    def _on_sync(self, sync: abi.Sync) -> None:
        value = sync.blocked_ns * sync.weight
        frames = (builder.sync_frame(sync),) + self._frames(sync.pid, sync.stack)
        self._sync.add(sync.pid, frames, value, sync.tid, sync.comm,
                       ((semconv.CUDA_SYNC_API, builder.sync_api_name(sync)),))
        self._counter(sync.pid).sync_wait_ns += value

    def _on_window(self, window: abi.Window) -> None:
        weight, covered, elapsed = self._weights.add(window)
        self._interval.covered_ns += covered
        self._interval.elapsed_ns += elapsed
        counters = self._counter(window.pid)
        counters.launches += window.launches * weight
        counters.covered_ns += covered
        counters.elapsed_ns += elapsed
        if not counters.since_ns or elapsed == window.elapsed_ns:  # first window, or the library re-attached
            counters.since_ns = window.end_ns - window.elapsed_ns
        counters.until_ns = max(counters.until_ns, window.end_ns)
        self._account_yielded(counters, window)
        if window.dropped:
            selfmetrics.count(semconv.SELF_DROPPED.name, window.dropped, otel_gpu__reason="injected_library",
                              otel_gpu__signal="profiles")
        still = []
        for work, age in self._pending:
            if work.launch.pid == window.pid and work.launch.window_id == window.window_id:
                self._add_work(work, weight)
            else:
                still.append((work, age))
        self._pending = still

    def _account_yielded(self, counters: ProcessCounters, window: abi.Window) -> None:
        """Time the library left CUPTI to another tool of the program: stated per interval, never extrapolated into.
        While it is away, each drain counts the time so far; its next record's total settles the rest."""
        if window.aside_since_ns:  # the library steps aside now
            counters.aside_since_ns, counters.aside_counted_ns = window.aside_since_ns, 0
        elif window.yielded_ns > counters.yielded_ns:  # back: its total covers the whole stretch
            self._interval.yielded_ns += max(0, window.yielded_ns - counters.yielded_ns - counters.aside_counted_ns)
            counters.aside_since_ns = counters.aside_counted_ns = 0
        counters.yielded_ns = window.yielded_ns

    def _count_aside(self, now_ns: int) -> None:
        for counters in self._counters.values():
            if counters.aside_since_ns:
                so_far = max(0, now_ns - counters.aside_since_ns)
                self._interval.yielded_ns += max(0, so_far - counters.aside_counted_ns)
                counters.aside_counted_ns = max(so_far, counters.aside_counted_ns)

    def _account(self, work: GPUWork) -> None:
        weight = self._weights.weight(work.launch.pid, work.launch.window_id)
        if weight is None:
            self._pending.append((work, 0))
        else:
            self._add_work(work, weight)

    def _add_work(self, work: GPUWork, weight: float) -> None:
        launch, activity = work.launch, work.activity
        value = activity.duration_ns * weight
        frames = (builder.work_frame(activity),) + self._frames(launch.pid, launch.stack)
        self._gpu.add(launch.pid, frames, value, launch.tid, launch.comm, builder.work_attributes(activity))
        self._counter(launch.pid).kernel_time_ns += value

    # --- drain -----------------------------------------------------------------------------------------------------

    def drain(self) -> list[ProfileBatch]:
        """The gpu_time and sync_wait batches since the last drain (each may have no processes)."""
        self.poll_now()
        now_ns = time.time_ns()
        with self._lock:
            self._settle_pending()
            processes = {pid: info for pid, info in self._processes.items()}
            fraction = (self._interval.covered_ns / self._interval.elapsed_ns) if self._interval.elapsed_ns else 1.0
            start, duration = self._interval_start_ns, max(0, now_ns - self._interval_start_ns)
            self._count_aside(now_ns)
            yielded = ((semconv.OTEL_GPU_GPU_TIME_YIELDED, self._interval.yielded_ns / 1e9),) \
                if self._interval.yielded_ns else ()
            gpu = self._gpu.build(start, duration, processes, fraction, yielded)
            sync = self._sync.build(start, duration, processes, 1.0)
            self._interval = _Interval()
            self._interval_start_ns = now_ns
            self._count_losses()
            self._forget_exited()
        return [gpu, sync]

    def _settle_pending(self) -> None:
        """Work whose window never closed: weighted by the process's last window once the process is gone or the
        work has waited two drains (the library closes a window at exit, so this is rare)."""
        still = []
        for work, age in self._pending:
            pid = work.launch.pid
            if age + 1 >= 2 or not self._alive(pid):
                self._add_work(work, self._weights.latest(pid))
            else:
                still.append((work, age + 1))
        self._pending = still

    def _count_losses(self) -> None:
        if self._bpf is not None:
            for index, reason in enumerate(abi.DROP_REASONS):
                raw = self._bpf.map("drops").lookup(index.to_bytes(4, "little"))
                total = sum(int.from_bytes(raw[i:i + 8], "little") for i in range(0, len(raw), 8)) if raw else 0
                if total > self._drops_seen[index]:
                    selfmetrics.count(semconv.SELF_DROPPED.name, total - self._drops_seen[index],
                                      otel_gpu__reason=f"bpf_{reason}", otel_gpu__signal="profiles")
                    self._drops_seen[index] = total
        stats = self._joiner.stats
        misses = (stats.launches_unmatched, stats.activities_unmatched)
        for (reason, now, before) in (("join_launch_unmatched", misses[0], self._misses_seen[0]),
                                      ("join_activity_unmatched", misses[1], self._misses_seen[1])):
            if now > before:
                selfmetrics.count(semconv.SELF_DROPPED.name, now - before, otel_gpu__reason=reason,
                                  otel_gpu__signal="profiles")
        self._misses_seen = misses
        if stats.launches_duplicate_id > self._duplicates_seen:
            # The injected library keeps ids unique; a repeat means CUPTI behaves otherwise: the joiner's queue pairs
            # the launches in order, but work under a shared id may go to the wrong stack.
            if self._duplicates_seen == 0:
                _logger.warning("GPU-time: CUPTI gave one correlation id to several sampled launches; their GPU time "
                                "may go to the wrong stacks (counted in %s, reason correlation_id_reused)",
                                semconv.SELF_ERRORS.name)
            selfmetrics.count(semconv.SELF_ERRORS.name, stats.launches_duplicate_id - self._duplicates_seen,
                              otel_gpu__source=_SOURCE, otel_gpu__reason="correlation_id_reused")
            self._duplicates_seen = stats.launches_duplicate_id

    def _forget_exited(self) -> None:
        """Drop the state of exited processes; their counters stay one more drain so metrics see the last values."""
        for pid in self._exited:
            self._counters.pop(pid, None)
        self._exited = [pid for pid in self._processes if not self._alive(pid)]
        for pid in self._exited:
            self._joiner.forget_process(pid)
            self._weights.forget_process(pid)
            self._symbolizer.forget(pid)
            del self._processes[pid]
            for key in [key for key in self._stack_frames if key[0] == pid]:
                del self._stack_frames[key]

    # --- per-process -----------------------------------------------------------------------------------------------

    def process_counters(self) -> list[ProcessCounters]:
        """Cumulative totals of every process seen (copies)."""
        with self._lock:
            return [replace(c) for c in self._counters.values()]

    def dropped(self) -> dict[str, int]:
        """Records the eBPF program could not deliver since open, by reason (as of the last drain)."""
        with self._lock:
            return dict(zip(abi.DROP_REASONS, self._drops_seen))

    def join_stats(self) -> tuple[int, int, int]:
        """(joined, launches unmatched, activities unmatched) since open."""
        stats = self._joiner.stats
        return stats.joined, stats.launches_unmatched, stats.activities_unmatched

    def _counter(self, pid: int) -> ProcessCounters:
        counters = self._counters.get(pid)
        if counters is None:
            counters = self._counters[pid] = ProcessCounters(self._remember_process(pid))
        return counters

    def _remember_process(self, pid: int) -> ProcessInfo:
        info = self._processes.get(pid)
        if info is None:
            info = self._resolver.info(pid) or ProcessInfo(pid=pid, executable_name="")
            self._processes[pid] = info
            self._symbolizer.remember(pid)
        return info

    def _alive(self, pid: int) -> bool:
        return os.path.exists(f"{self._proc_root}/{pid}")

    def _frames(self, pid: int, stack: abi.Stack) -> tuple[Frame, ...]:
        key = (pid, stack)
        frames = self._stack_frames.get(key)
        if frames is not None:
            self._stack_frames.move_to_end(key)
            return frames
        if stack.native:
            native = self._symbolizer.frames(pid, stack.native)
        elif stack.kernel_native:  # the kernel's unwind starts inside the library and CUPTI: cut those frames
            native = self._symbolizer.frames(pid, stack.kernel_native)
            while native and native[0].mapping is not None and _is_tracing_library(native[0].mapping.path):
                native = native[1:]
        else:
            native = ()
        frames = builder.merge_python_frames(native, stack.python)
        self._stack_frames[key] = frames
        while len(self._stack_frames) > 65536:
            self._stack_frames.popitem(last=False)
        return frames


def _is_tracing_library(path: str) -> bool:
    name = os.path.basename(path)
    return name.startswith(("libotel_gpu_inject", "libcupti"))


def _library_hint() -> str:
    from otel_gpu.cuda.inject import library_path

    path = library_path()
    return str(path) if path is not None else "<path to libotel_gpu_inject.so>"

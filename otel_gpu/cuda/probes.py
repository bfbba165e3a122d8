# SPDX-License-Identifier: Apache-2.0
"""GPUTimeProbes: the kernel side of GPU-time profiling, from loading the eBPF program to decoded records.

It loads ebpf/programs/gpu_time.bpf.o and attaches its four USDT handlers system-wide (pid -1: by file) to each
distinct copy of libotel_gpu_inject.so. The files it knows of - the packaged library that ``otel-gpu inject`` names,
and ``library_paths`` - are attached at once, before any process maps them: the kernel then sets the semaphores and
places the probes in every process that loads such a file, from its first mapping, so a new process is profiled from
its CUDA initialisation with no scan at all. Other copies (containers, other paths) are found by scanning /proc and
counted as late attaches. A scan lists /proc every ``rescan_interval_s`` and reads the maps only of processes due:
one listed for the first time is read at the next scan (most of a churning node's processes have exited by then,
and reading a maps file is most of a scan's cost), and one read without the library is read again after
``full_rescan_s`` (it may initialise CUDA late), then after twice as long each time nothing is found, up to
``RECHECK_BACKOFF`` times ``full_rescan_s``; so on a node whose processes churn, a scan reads only the new processes
that outlived the previous scan, and the long-lived ones ever more rarely. The first scan, at open, reads every
process. Its thread blocks on the ring buffer's epoll descriptor
(the program wakes it only when a quarter of the buffer is used) for at most ``poll_interval_s``, or until the next
scan or :meth:`stop`, and hands each decoded record to ``on_record``. What the records mean is
:mod:`otel_gpu.cuda.accounting`'s job.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from otel_gpu import selfmetrics, semconv
from otel_gpu.cuda import abi
from otel_gpu.cuda.accounting import SOURCE
from otel_gpu.cuda.discovery import LIBRARY_NAME, InjectedLibrary, list_pids, scan
from otel_gpu.ebpf import PROGRAMS_DIR
from otel_gpu.ebpf.abi import CPUStat
from otel_gpu.errors import SourceUnavailable

if TYPE_CHECKING:
    from otel_gpu.ebpf.loader import BPFObject, RingBuffer

# the GPU-time source's parts log under its name, as its log lines always have
_logger = logging.getLogger("otel_gpu.cuda.source")

PROGRAM_PATH = PROGRAMS_DIR / "gpu_time.bpf.o"
# Attach order matters: the library starts recording as soon as any semaphore is set. Windows first (so every
# weight is known), launches last (so every launch seen has its activity and window probes in place).
PROBES = (("otel_gpu_window", "window"), ("otel_gpu_activity", "activity"), ("otel_gpu_sync", "sync"),
          ("otel_gpu_launch", "launch"))
# A process read without the library is read again after full_rescan_s, then twice as long each time, up to this many
# times full_rescan_s: a long-lived process that never loads a copy costs a maps read every 80 s, not every 10 s.
RECHECK_BACKOFF = 8
_HOW_TO = ("run workloads with `otel-gpu inject -- python train.py`, or set CUDA_INJECTION64_PATH={path} in their "
           "environment (containers: mount the library and set the same variable)")


# the native unwinder's counters in gpu_time.bpf.c's unwind_stats (the CPU sampler's enum) and their reasons
_UNWIND_REASONS = {CPUStat.UNWIND_NO_MAPPING: semconv.Reason.UNWIND_NO_MAPPING,
                   CPUStat.UNWIND_UNSUPPORTED: semconv.Reason.UNWIND_UNSUPPORTED,
                   CPUStat.UNWIND_READ_FAILED: semconv.Reason.UNWIND_READ_FAILED,
                   CPUStat.UNWIND_TRUNCATED: semconv.Reason.UNWIND_TRUNCATED,
                   CPUStat.UNWIND_BAD_FP: semconv.Reason.UNWIND_BAD_FP}
_UNWIND_STATS = (CPUStat.UNWIND_SAMPLES, CPUStat.UNWIND_FP_FRAMES, *_UNWIND_REASONS)

class GPUTimeProbes:
    """``open()`` loads and starts polling, ``stop()`` stops polling, ``close()`` detaches and frees.

    ``on_record(record)`` is called for each decoded record and ``on_processes(pids)`` with the injected processes
    each scan found, both from the polling thread or from the caller of :meth:`poll_now` / :meth:`rescan`.
    """

    def __init__(self, on_record: Callable[[abi.Record], None], on_processes: Callable[[Iterable[int]], None], *,
                 proc_root: str = "/proc", program_path: str | os.PathLike[str] = PROGRAM_PATH,
                 ringbuf_bytes: int = 4 << 20, poll_interval_s: float = 1.0, rescan_interval_s: float = 2.0,
                 full_rescan_s: float = 10.0, library_name: str = LIBRARY_NAME,
                 library_paths: Iterable[str | os.PathLike[str]] | None = None,
                 clock: Callable[[], float] = time.monotonic, unwind_maps: Mapping[str, int] | None = None) -> None:
        """``unwind_maps``: the CPU sampler's unwind tables (:meth:`CPUSampler.unwind_maps`), so that a fallback
        stack of a process it registered is walked from them: one unwinder per process, not two."""
        self._on_record = on_record
        self._unwind_maps = dict(unwind_maps or {})
        self._unwind_seen: dict[str, int] = {}
        self._on_processes = on_processes
        self._proc_root = proc_root
        self._program_path = Path(program_path)
        self._ringbuf_bytes = ringbuf_bytes
        self._poll_interval_s = poll_interval_s
        self._rescan_interval_s = rescan_interval_s
        self._full_rescan_s = full_rescan_s
        self._library_name = library_name
        # None: the packaged library, when built
        self._library_paths = [Path(p) for p in library_paths] if library_paths is not None else _packaged()
        self._clock = clock
        # pid -> (when its maps are due to be read again, the wait after that read), clock seconds
        self._checked: dict[int, tuple[float, float]] = {}
        self._last_scan = 0.0
        self._listed = False  # the first scan (at open) reads every process: some may have a copy mapped already
        self._wake_r, self._wake_w = -1, -1  # a pipe: stop() writes to it to end the thread's wait at once
        self._ring_lock = threading.Lock()  # libbpf's ring buffer has one consumer at a time
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bpf: BPFObject | None = None
        self._ring: RingBuffer | None = None
        self._attached: dict[tuple[int, int], InjectedLibrary] = {}
        self._failed: set[tuple[int, int]] = set()
        self.late_attaches = 0  # library files attached only after a process had mapped them
        self.decode_errors = 0  # guarded by _ring_lock: records are decoded while the ring buffer is consumed

    # --- lifecycle -------------------------------------------------------------------------------------------------

    def open(self) -> None:
        """Load the eBPF program, attach to the injected processes running now and start polling.

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
            sizes = {"events": self._ringbuf_bytes}
            if not self._unwind_maps:  # nothing to walk: the tables stay empty, one entry each
                sizes.update(unwind_rows=1, unwind_processes=1)
            self._bpf = BPFObject(self._program_path, max_entries=sizes, reuse_maps=self._unwind_maps,
                                  rodata={"wakeup_bytes": self._ringbuf_bytes // 4})
            self._ring = self._bpf.ring_buffer("events", self._decode)
        except (BPFError, OSError) as exc:
            if self._bpf is not None:
                self._bpf.close()
                self._bpf = None
            if isinstance(exc, BPFError) and exc.without_privileges():
                raise SourceUnavailable(f"needs root or CAP_BPF+CAP_PERFMON ({exc.step})") from exc
            raise SourceUnavailable(f"its eBPF program did not load: {exc}") from exc
        self._attach_known()
        self.rescan()
        if not any(library.pid for library in self._attached.values()):
            _logger.info("GPU-time profiling is waiting: no process has %s loaded; %s", self._library_name,
                         _HOW_TO.format(path=_library_hint()))
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="otel-gpu-gpu-time", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop reading records in the background; :meth:`poll_now` still reads them."""
        self._stop.set()
        if self._wake_w >= 0:
            os.close(self._wake_w)  # the thread's wait sees the pipe's end at once
            self._wake_w = -1
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._wake_r >= 0:
            os.close(self._wake_r)
            self._wake_r = -1

    def close(self) -> None:
        """Stop polling, detach every probe and free the program (idempotent)."""
        self.stop()
        with self._ring_lock:
            if self._bpf is not None:
                self._bpf.close()
                self._bpf = None
                self._ring = None
        self._attached.clear()

    # --- discovery -------------------------------------------------------------------------------------------------

    def _attach_known(self) -> None:
        """Attach to the library files named up front, whether or not a process maps them yet."""
        for path in self._library_paths:
            if not path.name.startswith(self._library_name):
                continue
            try:
                st = path.stat()
            except OSError as exc:
                _logger.warning("GPU-time profiling cannot read %s (%s); processes that load it are found by scanning "
                                "/proc instead", path, exc)
                continue
            library = InjectedLibrary(st.st_dev, st.st_ino, str(path), str(path), 0)
            if self._attach(library):  # the waiting line at open names the path already
                _logger.debug("GPU-time profiling attached to %s: processes that load it are profiled from their "
                              "start", path)

    def _attach(self, library: InjectedLibrary) -> bool:
        key = (library.device, library.inode)
        if key in self._attached or key in self._failed or self._bpf is None:
            return False
        try:
            for program, probe in PROBES:
                self._bpf.attach_usdt(program, library.host_path, "otel_gpu", probe)
        except OSError as exc:
            self._failed.add(key)
            _logger.warning("GPU-time profiling cannot attach to %s (pid %d): %s", library.path, library.pid, exc)
            selfmetrics.count(semconv.SELF_ERRORS.name, otel_gpu__source=SOURCE, otel_gpu__reason=semconv.Reason.ATTACH)
            return False
        self._attached[key] = library
        return True

    def rescan(self) -> list[InjectedLibrary]:
        """Attach to library files not seen before; returns the newly attached ones."""
        now = self._last_scan = self._clock()
        live = list_pids(self._proc_root)
        live.discard(os.getpid())
        self._checked = {pid: due for pid, due in self._checked.items() if pid in live}  # the rest exited
        first = not self._listed
        self._listed = True
        read = [pid for pid in live if first or (pid in self._checked and self._checked[pid][0] <= now)]
        for pid in live:
            if pid not in self._checked:  # listed for the first time: read at the next scan, if it still runs then
                self._checked[pid] = (now, 0.0)
        libraries, pids = scan(self._proc_root, self._library_name, only=read)
        for pid in read:
            _due, wait = self._checked[pid]
            # nothing found (or a process already known to map a copy): read it less often each time
            wait = self._full_rescan_s if wait <= 0 else min(2 * wait, RECHECK_BACKOFF * self._full_rescan_s)
            self._checked[pid] = (now + wait, wait)
        self._on_processes(pids)
        added: list[InjectedLibrary] = []
        for library in libraries.values():
            known = self._attached.get((library.device, library.inode))
            if known is not None and not known.pid:  # a file attached up front, now seen in a process: say so once
                self._attached[(library.device, library.inode)] = library
                _logger.info("GPU-time profiling: pid %d loaded %s, whose probes were in place already (attached when "
                             "the agent started): it is profiled from its start", library.pid, library.path)
                continue
            if not self._attach(library):
                continue
            added.append(library)
            # the process ran with the library before the agent attached: what it did until now is not profiled
            self.late_attaches += 1
            _logger.info("GPU-time profiling attached to %s (first seen in pid %d%s)", library.path, library.pid,
                         "; the copy the process loaded, since replaced on disk" if library.replaced else "")
        return added

    @property
    def attached_libraries(self) -> list[InjectedLibrary]:
        return list(self._attached.values())

    # --- polling ---------------------------------------------------------------------------------------------------

    def poll_now(self) -> int:
        """Consume every record available now; returns how many."""
        with self._ring_lock:
            return self._ring.consume() if self._ring is not None else 0

    def drop_totals(self) -> list[int] | None:
        """The program's running totals of records it could not deliver, by :data:`abi.DROP_REASONS`; None when
        it is not loaded."""
        if self._bpf is None:
            return None
        totals = []
        for index in range(len(abi.DROP_REASONS)):
            raw = self._bpf.map("drops").lookup(index.to_bytes(4, "little"))  # per-CPU u64s
            totals.append(sum(int.from_bytes(raw[i:i + 8], "little") for i in range(0, len(raw), 8)) if raw else 0)
        return totals

    def unwind_totals(self) -> dict[str, int]:
        """Running totals of the fallback stacks walked from the CPU sampler's tables and of why walks stopped early
        (names of :class:`otel_gpu.ebpf.abi.CPUStat` ``UNWIND_*``, lower case); empty when not loaded."""
        if self._bpf is None:
            return {}
        stats = self._bpf.map("unwind_stats")
        out = {}
        for stat in _UNWIND_STATS:
            raw = stats.lookup(int(stat).to_bytes(4, "little")) or b""  # per-CPU u64s
            out[stat.name.lower()] = sum(int.from_bytes(raw[i:i + 8], "little") for i in range(0, len(raw), 8))
        return out

    def report_unwind(self) -> None:
        """Count the walks' early stops since the last call in ``otel_gpu.source.errors`` by reason."""
        totals = self.unwind_totals()
        for stat, reason in _UNWIND_REASONS.items():
            name = stat.name.lower()
            delta = totals.get(name, 0) - self._unwind_seen.get(name, 0)
            if delta > 0:
                selfmetrics.count(semconv.SELF_ERRORS.name, delta, otel_gpu__source=SOURCE, otel_gpu__reason=reason)
        self._unwind_seen = totals

    def _run(self) -> None:
        ring = self._ring
        watched = [self._wake_r] + ([ring.epoll_fd] if ring is not None else [])
        failures = 0
        while not self._stop.is_set():
            try:
                next_scan_in = self._last_scan + self._rescan_interval_s - self._clock()
                # the program wakes us only when the buffer fills up; otherwise records wait for the timeout, the
                # next scan, a drain (poll_now) or stop()
                select.select(watched, [], [], max(0.0, min(self._poll_interval_s, next_scan_in)))
                if self._stop.is_set():
                    break
                self.poll_now()
                if self._clock() - self._last_scan >= self._rescan_interval_s:
                    self.rescan()
            except Exception:  # loop boundary: keep polling
                failures += 1
                if failures == 1:
                    _logger.exception("GPU-time polling failed (counting further failures in otel_gpu.source.errors)")
                selfmetrics.count(semconv.SELF_ERRORS.name, otel_gpu__source=SOURCE,
                                  otel_gpu__reason=semconv.Reason.POLL)
                self._stop.wait(1.0)

    def _decode(self, data: bytes) -> None:
        try:
            record = abi.decode_event(data)
        except abi.DecodeError as exc:
            self.decode_errors += 1
            if self.decode_errors == 1:
                _logger.warning("GPU-time: undecodable record (%s); counting further ones", exc)
            selfmetrics.count(semconv.SELF_ERRORS.name, otel_gpu__source=SOURCE, otel_gpu__reason=semconv.Reason.DECODE)
            return
        self._on_record(record)


def _packaged() -> list[Path]:
    from otel_gpu.cuda.inject import library_path

    path = library_path()
    return [path] if path is not None else []


def _library_hint() -> str:
    from otel_gpu.cuda.inject import library_path

    path = library_path()
    return str(path) if path is not None else "<path to libotel_gpu_inject.so>"

# SPDX-License-Identifier: Apache-2.0
"""The kernel side of CPU profiling: loads ``cpu_profiler.bpf.o``, attaches it to a software cpu-clock event on
every online CPU, and drains the in-kernel aggregation.

No sample is lost while draining: the program writes into one of two generations of maps (counts + stack traces),
selected by the ``control`` array. :meth:`CPUSampler.drain` flips the generation first, waits for programs that
already read the old value to finish (they run for microseconds), then reads and clears the old generation.
The first sample of each process is announced through a ring buffer, which a background thread polls, so that
the process's mappings can be captured while it still runs (``on_new_process``); so is its first sample after each
exec, and every sample carries the exec id it was taken under, so that the programs one pid runs are told apart.
A sample whose stack id collides in the stack map comes whole through a second ring buffer (polled by the same
thread) and is added to the next drain.
User stacks walked from unwind tables (``programs/native_unwind.h``) are counted the same way, their frames kept in
``unwound_stacks{0,1}`` under ids from ``abi.UNWOUND_ID_BASE`` up.
Processes registered with :meth:`CPUSampler.register_python` also get their Python stack walked at each sample
(``programs/python_frames.h``); :meth:`CPUSampler.python_stacks` reads those by the id each sample carries. Each stack
the walker stores for the first time is announced through a third ring buffer (``python_events``, without waking the
thread: it is read at the thread's next poll), so its code objects can be read while the process still lives
(``on_new_python_stacks``).
"""

from __future__ import annotations

import ctypes
import errno as errno_codes
import logging
import math
import os
import struct
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from otel_gpu import selfmetrics, semconv
from otel_gpu.ebpf import _libbpf, abi
from otel_gpu.ebpf.loader import BPFError, BPFObject, program_path
from otel_gpu.errors import SourceUnavailable
from otel_gpu.unwind.processes import EAGER_FRAME_BYTES, NativeUnwinder
from otel_gpu.unwind.table import MAX_FRAME_BYTES, TableCache

_logger = logging.getLogger(__name__)

PROGRAM = "cpu_profiler"
SOURCE = semconv.Source.CPU_PROFILER
BTF_PATH = "/sys/kernel/btf/vmlinux"
_SETTLE_S = 0.002
_EVENT_POLL_MS = 250  # only bounds how fast close() stops the thread: a new record wakes the poll at once
_STACK = struct.Struct(f"<{abi.MAX_STACK_DEPTH}Q")
_EFAULT = -errno_codes.EFAULT
_SPAN_TABLE_RECHECK_S = 10.0  # a process may load the span context library after its first sample
_PYTHON_EVENT = struct.Struct("<I4xQ")  # abi.PythonStackEvent: pid, stack_id
_PYTHON_PENDING_MAX = 4096  # new Python stacks held between two polls; more are read at the drain only
# 16 MiB of kernel memory at 8 bytes a row, all of it in the agent's RSS from the start (the array is mmap-ed whole:
# RssFile grows by the map's size at open, docs/benchmarks.md): a table at MAX_FRAME_BYTES (~1.5 M rows) beside
# libpython's, libc's and the other hit files'; cold tables are evicted for hit ones, and building one again costs
# ~0.12 CPU-s per million rows.
DEFAULT_UNWIND_ROWS = 1 << 21
MAX_UNWIND_ROWS = 1 << 26  # 512 MiB: what native_unwind.h's per-file binary search covers
DEFAULT_UNWOUND_STACKS = 4096  # 4 MiB a generation: 21 busy cores' samples at 19 Hz over a 10 s interval


def _span_ids(trace_id: ctypes.Array[ctypes.c_uint8], span_id: ctypes.Array[ctypes.c_uint8]) -> tuple[str, str]:
    span = bytes(span_id)
    return (bytes(trace_id).hex(), span.hex()) if any(span) else ("", "")


@dataclass(frozen=True, slots=True)
class StackCount:
    """One aggregated (process, thread, stack) with its count; stacks are raw addresses, leaf first. Built from the
    kernel's count maps, or from one whole sample of the ring buffer (the C struct :class:`abi.RawSample`).

    ``user_stack_lost`` is True when the user stack could not be recorded (stack-map collision or error)."""

    pid: int
    tid: int
    comm: str
    count: int
    user_stack: tuple[int, ...]
    kernel_stack: tuple[int, ...]
    user_stack_lost: bool = False
    python_stack_id: int = 0  # key in the python_stacks map (python_frames.h), 0 when none
    trace_id: str = ""  # hex ids of the span the thread was in (docs/span-context.md), "" outside any
    span_id: str = ""
    exec_id: int = 0  # the program of the pid it was taken in: the kernel's count of the process's execs (32 bits)


class CPUSampler:
    """Loads and attaches the sampler; :meth:`drain` returns every sample since the last drain."""

    def __init__(self, frequency_hz: int, pids: Iterable[int] = (), exclude_tgid: int = 0,
                 on_new_process: Callable[[int, str, int, int], None] | None = None,
                 on_tick: Callable[[], float | None] | None = None,
                 on_new_python_stacks: Callable[[dict[int, list[int]]], None] | None = None, btf_path: str = BTF_PATH,
                 object_path: str | os.PathLike[str] | None = None, raw_only: bool = False,
                 cpus: list[int] | None = None, native_unwind: bool = True,
                 unwind_rows: int = DEFAULT_UNWIND_ROWS, unwound_stacks: int = DEFAULT_UNWOUND_STACKS,
                 unwind_max_frame_bytes: int = MAX_FRAME_BYTES,
                 unwind_eager_frame_bytes: int = EAGER_FRAME_BYTES) -> None:
        """``on_new_process(pid, comm, exec_id, arg_start)`` and ``on_tick()`` run on the event thread: the first
        at a process's first sample and at its first after each exec (``exec_id`` as in :attr:`StackCount.exec_id`;
        ``arg_start``: where that program's arguments begin, /proc/PID/stat's field 48 while it runs, 0 unknown),
        the second after every poll (at least every 250 ms); it returns the seconds until it wants to run
        again (None: no sooner than that). ``on_new_python_stacks({pid: [stack id, ...]})`` runs there too, after a
        poll that found Python stacks the walker stored for the first time (ids for :meth:`python_stacks`).
        ``raw_only`` sends every sample whole through the ring buffer instead of aggregating in the kernel
        (for comparing the two designs; the aggregated default is cheaper, see bench/bench_cpu_profiler.py).
        ``cpus`` defaults to every online CPU. ``native_unwind`` off: frame pointers only (the comparison path).
        ``unwind_rows``: capacity of the unwind tables of every file, 8 bytes a row of kernel memory (the default,
        2 Mi rows, is 16 MiB, mapped whole into the agent; libtorch_cpu.so alone needs 2.56 M rows,
        docs/benchmarks.md). ``unwound_stacks``:
        distinct walked stacks counted in the kernel per drain, 1 KiB each in each of two generations; past it a
        walked sample comes whole through the ring buffer. ``unwind_max_frame_bytes``: files whose .eh_frame is larger
        are walked by frame pointer (see unwind.table.MAX_FRAME_BYTES).
        ``unwind_eager_frame_bytes``: files with at most this much frame section get their table when a process that
        maps them is registered, larger ones only once samples hit them (``unwind_max_frame_bytes``: everything
        eagerly, as before tables were lazy)."""
        self.frequency_hz = frequency_hz
        self.raw_only = raw_only
        self.native_unwind = native_unwind
        if not 1 <= unwind_rows <= MAX_UNWIND_ROWS:
            raise ValueError(f"unwind_rows must be 1..{MAX_UNWIND_ROWS}, got {unwind_rows}")
        self.unwind_rows = unwind_rows
        if unwound_stacks < 1:
            raise ValueError(f"unwound_stacks must be at least 1, got {unwound_stacks}")
        self.unwound_stacks = unwound_stacks
        self.unwind_max_frame_bytes = unwind_max_frame_bytes
        self.unwind_eager_frame_bytes = unwind_eager_frame_bytes
        self._unwinder: NativeUnwinder | None = None
        self._unwind_seen = (0, 0, 0, 0)  # (rows_full, file_errors, evictions, files_no_builder) already reported
        self._cpus = cpus
        self.pids = tuple(pids)
        self.exclude_tgid = exclude_tgid
        self._on_new_process = on_new_process
        self._on_tick = on_tick
        self._on_new_python_stacks = on_new_python_stacks
        self._python_pending: dict[int, list[int]] = {}  # pid -> new stack ids since the last poll (event thread)
        self._python_pending_count = 0
        self._btf_path = btf_path
        self._object_path = Path(object_path) if object_path else program_path(PROGRAM)
        self._bpf: BPFObject | None = None
        self._generation = 0
        self._stats_seen = [0] * abi.STAT_COUNT
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._drain_lock = threading.Lock()
        self._raw_lock = threading.Lock()
        self._raw: list[StackCount] = []
        self._span_checked: dict[int, float] = {}  # pid -> monotonic time its span context table was looked for
        self._span_found: set[int] = set()
        self.cpus = 0
        self.attached_ns = 0  # wall clock (unix ns) when the sampling began

    # --- lifecycle -------------------------------------------------------------------------------------------------

    def open(self) -> None:
        """Load and attach. Raises SourceUnavailable naming what is missing, leaving nothing attached."""
        self._preflight()
        try:
            self._bpf = BPFObject(self._object_path, rodata={"self_tgid": self.exclude_tgid,
                                                             "filter_pids": 1 if self.pids else 0,
                                                             "raw_only": 1 if self.raw_only else 0},
                                  max_entries={"unwind_rows": self.unwind_rows if self.native_unwind else 1,
                                               "unwound_stacks0": self.unwound_stacks,
                                               "unwound_stacks1": self.unwound_stacks})
            pid_filter = self._bpf.map("pid_filter")
            for pid in self.pids:
                pid_filter.update(ctypes.c_uint32(pid), ctypes.c_uint8(1))
            self._bpf.map("control").update(ctypes.c_uint32(0), abi.Control(generation=0))
            if self.native_unwind:
                self._unwinder = NativeUnwinder(self._bpf.map("unwind_rows"), self._bpf.map("unwind_processes"),
                                               TableCache(max_frame_bytes=self.unwind_max_frame_bytes),
                                               hits=self._bpf.map("unwind_file_hits"),
                                               remap=self._bpf.map("unwind_remap"),
                                               eager_frame_bytes=self.unwind_eager_frame_bytes)
            ring = self._bpf.ring_buffer("process_events", self._handle_event, {"raw_samples": self._handle_raw,
                                                                                "python_events": self._handle_python})
            self.attached_ns = time.time_ns()  # samples are taken from here on (the first profile starts here)
            self.cpus = self._bpf.attach_perf_event("on_cpu_sample", self.frequency_hz, cpus=self._cpus)
        except BPFError as exc:
            self.close()
            raise SourceUnavailable(_explain(exc)) from exc
        except BaseException:
            self.close()
            raise
        self._stop.clear()
        self._thread = threading.Thread(target=self._poll_events, args=(ring,), name="otel-gpu-cpu-events",
                                        daemon=True)
        self._thread.start()
        _logger.debug("CPU sampler attached on %d CPUs at %d Hz", self.cpus, self.frequency_hz)

    def close(self) -> None:
        """Stop the event thread, detach and free every program, link, perf fd and map. Idempotent."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None
        if self._unwinder is not None:
            self._unwinder.close()
            self._unwinder = None
        if self._bpf is not None:
            self._bpf.close()
            self._bpf = None

    @property
    def is_open(self) -> bool:
        return self._bpf is not None

    # --- drain -----------------------------------------------------------------------------------------------------

    def drain(self) -> list[StackCount]:
        """Every sample counted since the last drain (flips the map generation; nothing is lost meanwhile)."""
        with self._drain_lock:
            bpf = self._bpf
            if bpf is None:
                return []
            old = self._generation
            self._generation = 1 - old
            bpf.map("control").update(ctypes.c_uint32(0), abi.Control(generation=self._generation))
            time.sleep(_SETTLE_S)
            entries = bpf.map(f"counts{old}").pop_all()
            stacks = self._read_stacks(bpf, old, entries)
            self._report_stats(bpf)
            with self._raw_lock:
                out, self._raw = self._raw, []
        key_size = ctypes.sizeof(abi.SampleKey)
        self._find_span_tables({struct.unpack_from("<I", k)[0] for k, _ in entries} | {s.pid for s in out})
        for raw_key, raw_value in entries:
            key = abi.SampleKey.from_buffer_copy(raw_key[:key_size])
            value = abi.SampleValue.from_buffer_copy(raw_value[:ctypes.sizeof(abi.SampleValue)])
            user_id, kernel_id = key.user_stack_id, key.kernel_stack_id
            trace_id, span_id = _span_ids(key.trace_id, key.span_id)
            out.append(StackCount(
                pid=key.pid, tid=key.tid, comm=value.comm.decode(errors="replace"), count=value.count,
                user_stack=stacks.get(user_id, ()) if user_id >= 0 else (),
                kernel_stack=stacks.get(kernel_id, ()) if kernel_id >= 0 else (),
                user_stack_lost=user_id < 0 and user_id != _EFAULT, python_stack_id=key.python_stack_id,
                trace_id=trace_id, span_id=span_id, exec_id=key.exec_id))
        return out

    def register_python(self, pid: int, proc: abi.PythonProc) -> None:
        """Have the BPF program walk the Python frames of ``pid`` (see :mod:`otel_gpu.cpu.python`)."""
        bpf = self._bpf
        if bpf is not None:
            bpf.map("python_procs").update(ctypes.c_uint32(pid), proc)

    def walks_python(self, pid: int) -> bool:
        """Whether the BPF program walks the Python frames of ``pid`` (it was registered and not dropped since)."""
        bpf = self._bpf
        return bpf is not None and bpf.map("python_procs").lookup(ctypes.c_uint32(pid)) is not None

    def unregister_python(self, pid: int) -> None:
        """Stop walking the Python frames of ``pid`` (it no longer runs a supported CPython)."""
        bpf = self._bpf
        if bpf is not None:
            bpf.map("python_procs").delete(ctypes.c_uint32(pid))

    def python_stacks(self, ids: Iterable[int]) -> dict[int, abi.PythonStack]:
        """The Python stacks of these ids (from :attr:`StackCount.python_stack_id`); ids evicted meanwhile are
        missing."""
        bpf = self._bpf
        if bpf is None:
            return {}
        stacks = bpf.map("python_stacks")
        out = {}
        for stack_id in ids:
            raw = stacks.lookup(ctypes.c_uint64(stack_id))
            if raw is not None:
                out[stack_id] = abi.PythonStack.from_buffer_copy(raw[:ctypes.sizeof(abi.PythonStack)])
        return out

    def reads_span_context(self, pid: int) -> bool:
        """True once the program reads ``pid``'s span context table (found at a drain after its first sample)."""
        return pid in self._span_found

    def _find_span_tables(self, pids: set[int]) -> None:
        """Tell the program where processes that publish span context keep it (looked for again every 10 s)."""
        from otel_gpu.instrumentation.locate import find_span_table

        bpf = self._bpf
        now = time.monotonic()
        for pid in pids - self._span_found:
            if bpf is None or now - self._span_checked.get(pid, -_SPAN_TABLE_RECHECK_S) < _SPAN_TABLE_RECHECK_S:
                continue
            self._span_checked[pid] = now
            try:
                address = find_span_table(pid)
            except (OSError, ValueError) as exc:  # exited, unreadable, or a malformed ELF
                _logger.debug("span context of pid %d not readable: %s", pid, exc)
                continue
            if address is not None:
                bpf.map("span_tables").update(ctypes.c_uint32(pid), ctypes.c_uint64(address))
                self._span_found.add(pid)

    def forget(self, pids: Iterable[int]) -> None:
        """Forget that ``pids`` were seen, so that a process reusing one of them is announced again."""
        bpf = self._bpf
        if bpf is None:
            return
        known, python = bpf.map("known_pids"), bpf.map("python_procs")
        tables = bpf.map("span_tables")
        for pid in pids:
            known.delete(ctypes.c_uint32(pid))
            python.delete(ctypes.c_uint32(pid))
            if pid in self._span_found:
                tables.delete(ctypes.c_uint32(pid))
            self._span_found.discard(pid)
            self._span_checked.pop(pid, None)
            if self._unwinder is not None:
                self._unwinder.forget(pid)

    def unwind_maps(self) -> dict[str, int]:
        """The native unwinder's table maps by name -> fd, for another BPF object to walk the same tables (the
        GPU-time probes' fallback stacks); empty when native unwinding is off or the sampler is closed."""
        bpf = self._bpf
        if bpf is None or self._unwinder is None:
            return {}
        return {name: bpf.map(name).fd for name in ("unwind_rows", "unwind_processes", "unwind_file_hits",
                                                    "unwind_remap")}

    def register_unwinding(self, pid: int) -> None:
        """Build and register ``pid``'s unwind tables now (in the background), rather than at its first sample."""
        if self._unwinder is not None:
            self._unwinder.submit(pid)

    def stop_unwinding(self) -> None:
        """Stopping: register no more processes for native unwinding and drop what is queued, so that neither the
        last drain nor close() waits for table builds (their stacks fall back to frame pointers)."""
        if self._unwinder is not None:
            self._unwinder.abandon()

    def settle_unwinder(self, timeout_s: float) -> bool:
        """Wait until every process announced so far is registered for native unwinding (True at once without)."""
        return self._unwinder is None or self._unwinder.settle(timeout_s)

    def stats(self) -> dict[str, int]:
        """Totals of the BPF-side statistics since open (names of :class:`otel_gpu.ebpf.abi.CPUStat`), and the
        native unwinder's (``unwind_processes``, ``unwind_files``, ``unwind_rows``, ``unwind_rows_full``,
        ``unwind_file_errors``, ``unwind_files_too_large``, ``unwind_files_known``, ``unwind_evictions``,
        ``unwind_remaps``, ``unwind_files_no_builder``, ``unwind_parses``)."""
        out = {stat.name.lower(): self._stats_seen[stat] for stat in abi.CPUStat}
        if self._unwinder is not None:
            unwinder = self._unwinder.stats
            out.update(unwind_processes=unwinder.processes, unwind_files=unwinder.files, unwind_rows=unwinder.rows,
                       unwind_rows_full=unwinder.rows_full, unwind_file_errors=unwinder.file_errors,
                       unwind_files_too_large=unwinder.files_too_large, unwind_files_known=unwinder.files_known,
                       unwind_evictions=unwinder.evictions, unwind_remaps=unwinder.remaps,
                       unwind_files_no_builder=unwinder.files_no_builder, unwind_parses=unwinder.parses)
        return out

    # --- internals -------------------------------------------------------------------------------------------------

    def _preflight(self) -> None:
        try:
            _libbpf.lib()
        except OSError as exc:
            raise SourceUnavailable(str(exc)) from exc
        if not Path(self._btf_path).exists():
            raise SourceUnavailable(f"no BTF at {self._btf_path} (the kernel needs CONFIG_DEBUG_INFO_BTF=y)")
        if not self._object_path.is_file():
            raise SourceUnavailable(f"BPF object {self._object_path} not built (run make build)")

    @staticmethod
    def _read_stacks(bpf: BPFObject, generation: int, entries: list[tuple[bytes, bytes]]) -> dict[int, tuple[int, ...]]:
        wanted: set[int] = set()
        for raw_key, _ in entries:
            key = abi.SampleKey.from_buffer_copy(raw_key)
            if key.user_stack_id >= 0:
                wanted.add(key.user_stack_id)
            if key.kernel_stack_id >= 0:
                wanted.add(key.kernel_stack_id)
        stack_map = bpf.map(f"stacks{generation}")
        stacks: dict[int, tuple[int, ...]] = {}
        for stack_id in wanted:
            if stack_id >= abi.UNWOUND_ID_BASE:
                continue
            raw = stack_map.lookup(ctypes.c_uint32(stack_id))
            if raw is None:
                continue
            addresses = _STACK.unpack_from(raw)
            depth = addresses.index(0) if 0 in addresses else len(addresses)
            stacks[stack_id] = addresses[:depth]
        stack_map.clear()
        # stacks walked by native_unwind.h: every entry of the generation is some sample's (read in batches)
        for raw_key, raw_value in bpf.map(f"unwound_stacks{generation}").pop_all():
            depth = min(struct.unpack_from("<I", raw_value, 8)[0], abi.MAX_STACK_DEPTH)
            stacks[struct.unpack_from("<I", raw_key)[0]] = struct.unpack_from(f"<{depth}Q", raw_value, 16)
        return stacks

    def _report_stats(self, bpf: BPFObject) -> None:
        stats = bpf.map("stats")
        totals = [0] * abi.STAT_COUNT
        for index in range(abi.STAT_COUNT):
            raw = stats.lookup(ctypes.c_uint32(index))
            if raw is not None:
                totals[index] = sum(struct.unpack(f"<{len(raw) // 8}Q", raw))
        delta = [now - seen for now, seen in zip(totals, self._stats_seen, strict=True)]
        self._stats_seen = totals
        if delta[abi.CPUStat.SAMPLES]:
            selfmetrics.count(semconv.SELF_PROFILE_SAMPLES.name, delta[abi.CPUStat.SAMPLES], otel_gpu__source=SOURCE)
        collisions = delta[abi.CPUStat.USER_COLLISION] + delta[abi.CPUStat.KERNEL_COLLISION]
        if collisions:  # not lost: those samples came whole through raw_samples
            selfmetrics.count(semconv.SELF_ERRORS.name, collisions, otel_gpu__source=SOURCE,
                              otel_gpu__reason=semconv.Reason.STACK_COLLISION)
        drops = ((semconv.Reason.RAW_FULL, delta[abi.CPUStat.RAW_FULL]),
                 (semconv.Reason.COUNTS_FULL, delta[abi.CPUStat.COUNTS_FULL]),
                 (semconv.Reason.EVENTS_FULL, delta[abi.CPUStat.EVENTS_FULL]))
        for reason, amount in drops:
            if amount:
                selfmetrics.count(semconv.SELF_DROPPED.name, amount, otel_gpu__reason=reason,
                                  otel_gpu__signal=semconv.Signal.PROFILES)
        if delta[abi.CPUStat.STACK_ERROR]:
            selfmetrics.count(semconv.SELF_ERRORS.name, delta[abi.CPUStat.STACK_ERROR], otel_gpu__source=SOURCE,
                              otel_gpu__reason=semconv.Reason.STACK_ERROR)
        python_errors = ((semconv.Reason.PYTHON_NO_THREAD, delta[abi.CPUStat.PYTHON_NO_THREAD]),
                         (semconv.Reason.PYTHON_TRUNCATED, delta[abi.CPUStat.PYTHON_TRUNCATED]),
                         (semconv.Reason.PYTHON_STACKS_FULL, delta[abi.CPUStat.PYTHON_STACKS_FULL]),
                         (semconv.Reason.PYTHON_READ_LATE, delta[abi.CPUStat.PYTHON_EVENTS_FULL]))
        for reason, amount in python_errors:
            if amount:
                selfmetrics.count(semconv.SELF_ERRORS.name, amount, otel_gpu__source=SOURCE, otel_gpu__reason=reason)
        self._report_unwind(delta)
        if delta[abi.CPUStat.COUNTS_FULL]:
            _logger.warning("CPU sampler: %d samples dropped because the counts map was full (shorten "
                            "--profiling-interval)", delta[abi.CPUStat.COUNTS_FULL])

    def _report_unwind(self, delta: list[int]) -> None:
        stops = ((semconv.Reason.UNWIND_NO_MAPPING, delta[abi.CPUStat.UNWIND_NO_MAPPING]),
                 (semconv.Reason.UNWIND_UNSUPPORTED, delta[abi.CPUStat.UNWIND_UNSUPPORTED]),
                 (semconv.Reason.UNWIND_READ_FAILED, delta[abi.CPUStat.UNWIND_READ_FAILED]),
                 (semconv.Reason.UNWIND_TRUNCATED, delta[abi.CPUStat.UNWIND_TRUNCATED]),
                 (semconv.Reason.UNWIND_NO_REGS, delta[abi.CPUStat.UNWIND_NO_REGS]),
                 (semconv.Reason.UNWIND_BAD_FP, delta[abi.CPUStat.UNWIND_BAD_FP]))
        unwinder = self._unwinder
        if unwinder is not None:
            rows_full, file_errors, evictions, no_builder = (
                unwinder.stats.rows_full, unwinder.stats.file_errors, unwinder.stats.evictions,
                unwinder.stats.files_no_builder)
            seen_full, seen_errors, seen_evictions, seen_no_builder = self._unwind_seen
            self._unwind_seen = (rows_full, file_errors, evictions, no_builder)
            stops += ((semconv.Reason.UNWIND_TABLES_FULL, rows_full - seen_full),
                      (semconv.Reason.UNWIND_FILE_ERROR, file_errors - seen_errors),
                      (semconv.Reason.UNWIND_CACHE_EVICTED, evictions - seen_evictions),
                      (semconv.Reason.UNWIND_NO_BUILDER, no_builder - seen_no_builder))
            if rows_full and not seen_full:
                _logger.warning("CPU sampler: no room in unwind_rows (%d rows) for a hit file's table: it is unwound "
                                "by frame pointer until room is freed", self.unwind_rows)
        for reason, amount in stops:
            if amount:
                selfmetrics.count(semconv.SELF_ERRORS.name, amount, otel_gpu__source=SOURCE, otel_gpu__reason=reason)

    def _handle_event(self, data: bytes) -> None:
        event = abi.ProcessEvent.from_buffer_copy(data[:ctypes.sizeof(abi.ProcessEvent)])
        if self._unwinder is not None:
            self._unwinder.submit(event.pid)
        if self._on_new_process is not None:
            self._on_new_process(event.pid, event.comm.decode(errors="replace"), event.exec_id, event.arg_start)

    def _handle_raw(self, data: bytes) -> None:
        raw = abi.RawSample.from_buffer_copy(data[:ctypes.sizeof(abi.RawSample)])
        user = tuple(raw.user[:max(0, raw.user_bytes) // 8])
        kernel = tuple(raw.kernel[:max(0, raw.kernel_bytes) // 8])
        trace_id, span_id = _span_ids(raw.trace_id, raw.span_id)
        sample = StackCount(pid=raw.pid, tid=raw.tid, comm=raw.comm.decode(errors="replace"), count=1,
                           user_stack=user, kernel_stack=kernel,
                           user_stack_lost=raw.user_bytes < 0 and raw.user_bytes != _EFAULT,
                           python_stack_id=raw.python_stack_id, trace_id=trace_id, span_id=span_id,
                           exec_id=raw.exec_id)
        with self._raw_lock:
            self._raw.append(sample)

    def _handle_python(self, data: bytes) -> None:
        if self._on_new_python_stacks is None:
            return
        if self._python_pending_count >= _PYTHON_PENDING_MAX:
            selfmetrics.count(semconv.SELF_ERRORS.name, otel_gpu__source=SOURCE,
                              otel_gpu__reason=semconv.Reason.PYTHON_READ_LATE)
            return
        pid, stack_id = _PYTHON_EVENT.unpack_from(data)
        self._python_pending.setdefault(pid, []).append(stack_id)
        self._python_pending_count += 1

    def _hand_over_python(self) -> None:
        if not self._python_pending or self._on_new_python_stacks is None:
            return
        pending, self._python_pending, self._python_pending_count = self._python_pending, {}, 0
        self._on_new_python_stacks(pending)

    def _poll_events(self, ring) -> None:  # type: ignore[no-untyped-def]
        failures = 0
        wait_ms = _EVENT_POLL_MS
        while not self._stop.is_set():
            try:
                ring.poll(wait_ms)
                ring.consume()  # python_events: its records wake no one, each poll picks them up
                self._hand_over_python()
            except BPFError as exc:  # loop boundary: keep polling, count, log once
                failures += 1
                selfmetrics.count(semconv.SELF_ERRORS.name, otel_gpu__source=SOURCE,
                                  otel_gpu__reason=semconv.Reason.EVENT_POLL)
                if failures == 1:
                    _logger.warning("CPU sampler: polling process events failed: %s", exc)
                time.sleep(_EVENT_POLL_MS / 1000)
            wait_ms = _EVENT_POLL_MS
            if self._on_tick is not None:
                next_s = self._on_tick()
                if next_s is not None:
                    wait_ms = max(1, min(_EVENT_POLL_MS, math.ceil(next_s * 1000)))


def _explain(exc: BPFError) -> str:
    """One clear message naming what is missing, from a load or attach failure."""
    text = str(exc)
    if exc.without_privileges():
        return f"needs root or CAP_BPF+CAP_PERFMON ({exc.step})"
    if "perf_event_open" in text:
        return f"perf events unavailable ({text})"
    return text

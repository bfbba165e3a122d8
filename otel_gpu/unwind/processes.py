# SPDX-License-Identifier: Apache-2.0
"""Registers processes with the BPF stack walker (``programs/native_unwind.h``): each executable mapping of the
process (files and the vDSO) gets its file's unwind table loaded once into ``unwind_rows`` (an mmap-able array: a
table is one slice assignment, not a syscall per row) and is listed, sorted, in the process's ``unwind_processes``
entry. Rows are appended and never moved; when the array is full a file gets no rows and its code is walked by
frame pointer, which is counted.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import queue
import threading
import time
from dataclasses import dataclass, field

from otel_gpu.ebpf import abi
from otel_gpu.ebpf.loader import BPFError, BPFMap
from otel_gpu.unwind.table import TableCache, UnwindTable, file_key

_logger = logging.getLogger(__name__)
_ROW_BYTES = ctypes.sizeof(abi.UnwindRow)
_CLOSE_JOIN_S = 0.1  # close() waits this long for the thread to leave a build, then lets it end by itself


@dataclass(frozen=True, slots=True)
class Mapping:
    """One executable mapping of /proc/PID/maps."""

    start: int
    end: int
    offset: int
    path: str  # "[vdso]" or a file path


@dataclass(slots=True)
class UnwinderStats:
    processes: int = 0  # processes registered
    files: int = 0  # files whose rows were loaded
    rows: int = 0  # rows used in unwind_rows
    rows_full: int = 0  # files left to frame pointers because unwind_rows was full
    files_too_large: int = 0  # files left to frame pointers because their .eh_frame is over the cache's cap
    file_errors: int = 0  # files that could not be read or parsed
    errors_by_file: dict[str, str] = field(default_factory=dict)  # the last few, for one log line each


def executable_mappings(pid: int, proc: str = "/proc") -> list[Mapping]:
    """The executable file-backed mappings and the vDSO of ``pid``, sorted by start."""
    out: list[Mapping] = []
    with open(f"{proc}/{pid}/maps") as maps:
        for line in maps:
            parts = line.split(None, 5)
            if len(parts) < 6 or "x" not in parts[1]:
                continue
            path = parts[5].strip()
            if not (path.startswith("/") or path == "[vdso]"):
                continue
            low, _, high = parts[0].partition("-")
            out.append(Mapping(int(low, 16), int(high, 16), int(parts[2], 16), path))
    out.sort(key=lambda mapping: mapping.start)
    return out


class NativeUnwinder:
    """Owns the walker's two maps: loads tables, registers and forgets processes. Thread-safe.

    :meth:`submit` queues a process for a background thread (a large file's table takes about a second to build, and
    the sampler's event thread must not wait); until it is registered, its stacks are unwound by frame pointer."""

    def __init__(self, rows: BPFMap, processes: BPFMap, cache: TableCache | None = None, proc: str = "/proc") -> None:
        self._rows_map = rows
        self._processes = processes
        self._cache = cache or TableCache()
        self._proc = proc
        self._loaded: dict[tuple[int, ...], tuple[int, int]] = {}  # file identity -> (first row, row count)
        self._lock = threading.Lock()
        self.stats = UnwinderStats()
        size = rows.max_entries * _ROW_BYTES
        self._memory = mmap.mmap(rows.fd, (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE,
                                 mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._queue: queue.Queue[int | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._abandoned = threading.Event()  # stopping: register nothing more
        self._write_lock = threading.Lock()  # held only to write the maps, so abandon() never waits for a build

    def submit(self, pid: int) -> None:
        """Register ``pid`` in the background (see :meth:`settle`); nothing once :meth:`abandon` was called."""
        if self._abandoned.is_set():
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="otel-gpu-unwind", daemon=True)
            self._thread.start()
        self._queue.put(pid)

    def settle(self, timeout_s: float) -> bool:
        """Wait until every submitted process is registered; False if ``timeout_s`` passed first."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and not self._abandoned.is_set():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def abandon(self) -> None:
        """Stop registering at once: what is queued is dropped, and a table being built is finished by the thread but
        never loaded (a build takes up to ~1.5 s of CPU; stopping must not wait for it, nor for the files queued
        after it). Nothing is written to the maps after this returns. Idempotent."""
        with self._write_lock:
            self._abandoned.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
            self._queue.task_done()
        if self._thread is not None:
            self._queue.put(None)

    def close(self) -> None:
        """:meth:`abandon`, then free the rows' memory once the thread has ended; a thread still inside a build after
        _CLOSE_JOIN_S is left to end by itself (a daemon that writes nothing more) and the memory to the process's
        exit."""
        self.abandon()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=_CLOSE_JOIN_S)
            if thread.is_alive():
                return
        self._memory.close()

    def _work(self) -> None:
        # Not niced: this thread holds the GIL while it builds, and a thread at nice 19 that holds it on a busy node
        # is seldom scheduled, stalling every other thread of the agent (measured on the H200: a new Python
        # process's frames were registered only after the tables, 43 s later). The size cap bounds the work instead.
        while True:
            pid = self._queue.get()
            try:
                if pid is None or self._abandoned.is_set():
                    return
                self.add_process(pid)
            except (BPFError, OSError, ValueError) as exc:  # loop boundary: that process keeps frame pointers
                self.stats.file_errors += 1
                _logger.debug("native unwinding: registering %s failed: %s", pid, exc)
            finally:
                self._queue.task_done()

    def add_process(self, pid: int) -> bool:
        """Register ``pid``; False when it is gone or has no executable mapping. Raises BPFError on map failures."""
        try:
            mappings = executable_mappings(pid, self._proc)
        except OSError:
            return False
        entries: list[abi.UnwindMapping] = []
        with self._lock:
            for mapping in mappings[:abi.UNWIND_MAX_MAPPINGS]:
                if self._abandoned.is_set():  # stopping: checked between files, the unit of work
                    return False
                try:
                    entry = self._entry(pid, mapping)
                except (FileNotFoundError, ProcessLookupError):  # the process exited meanwhile
                    return False
                if entry is not None:
                    entries.append(entry)
        if not entries:
            return False
        value = abi.UnwindProcess(count=len(entries))
        for index, entry in enumerate(entries):
            value.mappings[index] = entry
        with self._write_lock:
            if self._abandoned.is_set():
                return False
            self._processes.update(ctypes.c_uint32(pid), value)
        self.stats.processes += 1
        return True

    def forget(self, pid: int) -> None:
        try:
            self._processes.delete(ctypes.c_uint32(pid))
        except BPFError:
            pass  # already gone

    def _entry(self, pid: int, mapping: Mapping) -> abi.UnwindMapping | None:
        image: bytes | None = None
        path = f"{self._proc}/{pid}/map_files/{mapping.start:x}-{mapping.end:x}"
        try:
            if mapping.path == "[vdso]":
                with open(f"{self._proc}/{pid}/mem", "rb", buffering=0) as memory:
                    memory.seek(mapping.start)
                    image = memory.read(mapping.end - mapping.start)
            key = file_key(path, image)
            table = self._cache.get(path, image)
        except (FileNotFoundError, ProcessLookupError):
            raise
        except (OSError, ValueError) as exc:
            self.stats.file_errors += 1
            if len(self.stats.errors_by_file) < 16 and mapping.path not in self.stats.errors_by_file:
                self.stats.errors_by_file[mapping.path] = str(exc)
                _logger.debug("native unwinding: %s: %s", mapping.path, exc)
            return None
        bias = table.bias(mapping.start, mapping.offset)
        if bias is None:
            return None
        first, count = self._load(key, table)
        return abi.UnwindMapping(start=mapping.start, end=mapping.end, bias=bias & 0xFFFFFFFFFFFFFFFF,
                                 first_row=first, row_count=count)

    def _load(self, key: tuple[int, ...], table: UnwindTable) -> tuple[int, int]:
        loaded = self._loaded.get(key)
        if loaded is not None:
            return loaded
        count = len(table.pcs)
        first = self.stats.rows
        if count == 0:  # no frame information, or too large to build (walked by frame pointer)
            self.stats.files_too_large += table.too_large
            loaded = (0, 0)
        elif first + count > self._rows_map.max_entries:
            self.stats.rows_full += 1
            return 0, 0  # not remembered: a later, smaller file may still fit
        else:
            rows = table.row_bytes()
            with self._write_lock:
                if self._abandoned.is_set():
                    return 0, 0
                self._memory[first * _ROW_BYTES:(first + count) * _ROW_BYTES] = rows
            self.stats.rows += count
            self.stats.files += 1
            loaded = (first, count)
        self._loaded[key] = loaded
        return loaded

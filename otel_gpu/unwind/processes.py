# SPDX-License-Identifier: Apache-2.0
"""Registers processes with the BPF stack walker (``programs/native_unwind.h``) and builds unwind tables lazily.

Registering a process only reads its maps: each executable mapping (files and the vDSO) is listed, sorted, in the
process's ``unwind_processes`` entry with the id of its file (by identity: device, inode, size, mtime, so one table
serves every process that maps the file). The walker counts the frames it looks up per file id in
``unwind_file_hits``; a file is given a table only once samples hit it, and until then its code is stepped by frame
pointer. Tables live in ``unwind_rows`` (an mmap-able array the native builder writes a table into), allocated
first-fit; when a hit file does not fit, the least recently hit files are evicted (counted). A walk that meets a pc
outside every registered mapping (a library loaded later, as torch loads its own) asks, through ``unwind_remap``, for
the process's maps to be read again.
"""

from __future__ import annotations

import bisect
import ctypes
import logging
import mmap
import queue
import threading
import time
from dataclasses import dataclass, field

from otel_gpu.ebpf import abi
from otel_gpu.ebpf.loader import BPFError, BPFMap
from otel_gpu.symbolize.maps import read_maps
from otel_gpu.unwind.native_table import NativeBuilderMissing, ParsedRows
from otel_gpu.unwind.table import TableCache, UnwindTable, file_key, frame_section_size, parse_table

_logger = logging.getLogger(__name__)
_ROW_BYTES = ctypes.sizeof(abi.UnwindRow)
_U64 = 0xFFFFFFFFFFFFFFFF
_CLOSE_JOIN_S = 0.1  # close() waits this long for the thread to leave a build, then lets it end by itself
_POLL_S = 0.2  # how often the unwinder thread looks at the hit counters when no process is queued
# Small files get their tables at registration: a walk that reaches a file without a table steps it by frame pointer,
# which in code without frame pointers ends the walk, so the callers' files would be hit (and built) only one
# sampling round after each other. Small files (a program, libgcc, a C extension: up to ~12,000 rows, ~0.1 s each)
# are cheap; the large ones (libpython, libc, libstdc++, libtorch) are where the samples land, so they are hit.
EAGER_FRAME_BYTES = 64 << 10
_REMAP_EVERY_S = 2.0  # a process's maps are read again at most this often (JIT code keeps asking)
_COLD_S = 10.0  # a table is evicted for another only when samples have not hit it for this long
# A hit file with no room for its table is tried again after _COLD_S, then after twice as long each time room is still
# lacking, up to this long; and it is parsed again only once its rows (known from the first parse) could be made room
# for: on the H200 a PyTorch process's CUDA libraries (1-8 MiB of .eh_frame each) outgrew unwind_rows, and parsing
# the ones left out again every 10 s kept the unwinder at 1 % of a core.
_MAX_RETRY_S = 160.0

# A file's table state
_PENDING = 0  # not built: built when samples hit the file
_LOADED = 1  # rows in unwind_rows
_NO_ROWS = 2  # no frame information, too large, unreadable, or larger than unwind_rows: frame pointers only


@dataclass(frozen=True, slots=True)
class Mapping:
    """One executable mapping of /proc/PID/maps."""

    start: int
    end: int
    offset: int
    path: str  # "[vdso]" or a file path


@dataclass(slots=True)
class UnwinderStats:
    processes: int = 0  # processes registered (again after a remap: counted once)
    files: int = 0  # tables loaded into unwind_rows (again after an eviction: counted again)
    rows: int = 0  # rows of unwind_rows in use now
    rows_full: int = 0  # tables left out: larger than unwind_rows, or no room without evicting tables in use
    files_too_large: int = 0  # files left to frame pointers: .eh_frame over the cache's cap, or code spanning 4 GiB
    file_errors: int = 0  # files that could not be read or parsed
    files_no_builder: int = 0  # files left to frame pointers because libotel_gpu_cfi.so does not load
    files_known: int = 0  # file ids in use (files mapped by registered processes)
    evictions: int = 0  # tables evicted, least recently hit first, to make room for a hit file
    remaps: int = 0  # processes whose maps were read again after a pc outside them
    build_s: float = 0.0  # thread CPU time spent building tables
    parses: int = 0  # frame sections parsed (a file's again after an eviction or a try without room)
    errors_by_file: dict[str, str] = field(default_factory=dict)  # the last few, for one log line each


@dataclass(slots=True)
class _File:
    id: int
    key: tuple[int, ...]
    name: str  # the path as the first process maps it (for log lines)
    sources: dict[int, str] = field(default_factory=dict)  # pid -> a path that opens the file (map_files)
    image: bytes | None = None  # the vDSO's bytes
    state: int = _PENDING
    first_row: int = 0
    row_count: int = 0
    base: int = 0  # the link-time pc its rows' 32-bit pcs are offsets from (the processes' biases include it)
    table: UnwindTable | None = None  # kept only for its segments (load bias), rows dropped once loaded
    hits: int = 0  # unwind_file_hits value last seen
    since: int = 0  # its value when the file last became pending: built once hits pass it
    retry_at: float = 0.0  # monotonic time before which it is not built again (no room for it last time)
    retry_s: float = _COLD_S  # the wait before the next try after the next failed one (doubles up to _MAX_RETRY_S)
    rows_needed: int = 0  # its table's rows, once parsed (0: not known)
    last_hit: float = 0.0  # monotonic time the hits last changed


def executable_mappings(pid: int, proc: str = "/proc") -> list[Mapping]:
    """The executable file-backed mappings and the vDSO of ``pid``, sorted by start; none when it is gone.

    Paths are any bytes the process chose: the maps are read as the symbolizer reads them (kept as surrogates, lines
    ending at "\\n" only), since reading them as UTF-8 text let one oddly named file cost the whole process its
    registration (a UnicodeDecodeError)."""
    out = [Mapping(entry.start, entry.end, entry.offset, entry.path) for entry in read_maps(pid, proc) or ()
           if entry.executable and (entry.path.startswith("/") or entry.path == "[vdso]")]
    out.sort(key=lambda mapping: mapping.start)
    return out


class _Extents:
    """First-fit allocator of row ranges in unwind_rows; freed ranges merge with their neighbours."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._free: list[tuple[int, int]] = [(0, capacity)]  # (first, count), sorted by first

    def take(self, count: int) -> int | None:
        for index, (first, size) in enumerate(self._free):
            if size >= count:
                if size == count:
                    del self._free[index]
                else:
                    self._free[index] = (first + count, size - count)
                return first
        return None

    def free_rows(self) -> int:
        return sum(size for _, size in self._free)

    def give(self, first: int, count: int) -> None:
        index = bisect.bisect_left(self._free, (first, 0))
        self._free.insert(index, (first, count))
        if index + 1 < len(self._free) and first + count == self._free[index + 1][0]:
            self._free[index] = (first, count + self._free.pop(index + 1)[1])
        if index > 0 and self._free[index - 1][0] + self._free[index - 1][1] == first:
            previous = self._free.pop(index - 1)
            self._free[index - 1] = (previous[0], previous[1] + self._free[index - 1][1])


class NativeUnwinder:
    """Owns the walker's maps: registers and forgets processes, builds hit files' tables. Thread-safe.

    :meth:`submit` queues a process for a background thread, which also builds the tables of files that samples hit
    (a large file's table takes seconds, and the sampler's event thread must not wait)."""

    def __init__(self, rows: BPFMap, processes: BPFMap, cache: TableCache | None = None, proc: str = "/proc",
                 hits: BPFMap | None = None, remap: BPFMap | None = None,
                 eager_frame_bytes: int = EAGER_FRAME_BYTES) -> None:
        """``hits`` and ``remap``: the walker's unwind_file_hits and unwind_remap (without ``hits`` only small files
        get tables). ``eager_frame_bytes``: files whose frame section is at most this large get their table when a
        process that maps them is registered, the others once samples hit them (see EAGER_FRAME_BYTES)."""
        self._eager_frame_bytes = eager_frame_bytes
        self._rows_map = rows
        self._processes = processes
        self._remap = remap
        self._max_frame_bytes = (cache or TableCache()).max_frame_bytes
        self._proc = proc
        self._lock = threading.RLock()
        self.stats = UnwinderStats()
        self._files: dict[tuple[int, ...], _File] = {}
        self._by_id: dict[int, _File] = {}
        self._free_ids = list(range(abi.UNWIND_MAX_FILES - 1, 0, -1))  # 0: no id
        self._processes_seen: dict[int, list[tuple[Mapping, _File]]] = {}
        self._remapped: dict[int, float] = {}
        self._extents = _Extents(rows.max_entries)
        self._memory = _map(rows.fd, rows.max_entries * _ROW_BYTES)
        self._hits_memory = _map(hits.fd, hits.max_entries * 8) if hits is not None else None
        self._hits = memoryview(self._hits_memory).cast("Q") if self._hits_memory is not None else None
        self._queue: queue.Queue[int | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._abandoned = threading.Event()  # stopping: build and register nothing more

    # --- the sampler's side ----------------------------------------------------------------------------------------

    def submit(self, pid: int) -> None:
        """Register ``pid`` in the background (see :meth:`settle`); nothing once :meth:`abandon` was called."""
        if self._abandoned.is_set():
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="otel-gpu-unwind", daemon=True)
            self._thread.start()
        self._queue.put(pid)

    def settle(self, timeout_s: float) -> bool:
        """Wait until every submitted process is registered and every file hit so far has its table (or is known to
        get none); False if ``timeout_s`` passed first. Files that later samples hit are built after that."""
        deadline = time.monotonic() + timeout_s
        while (self._queue.unfinished_tasks or self._wanted() or self._remap_wanted()) and \
                not self._abandoned.is_set():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def abandon(self) -> None:
        """Stop at once: what is queued is dropped, and a table being built is finished by the thread but never
        loaded (a large file's build takes seconds of CPU; stopping must not wait for it, nor for the files wanted
        after it). Nothing is written to the maps after this returns (every write holds the lock). Idempotent."""
        with self._lock:
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
        """:meth:`abandon`, then free the maps' memory once the thread has ended; a thread still inside a build after
        _CLOSE_JOIN_S is left to end by itself (a daemon that writes nothing more) and the memory to the process's
        exit."""
        self.abandon()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=_CLOSE_JOIN_S)
            if thread.is_alive():
                return
        if self._hits is not None:
            self._hits.release()
            self._hits = None
        for memory in (self._memory, self._hits_memory):
            if memory is not None:
                memory.close()

    def forget(self, pid: int) -> None:
        """Drop ``pid``'s entry; files no registered process maps any more give back their rows and id."""
        with self._lock:  # held across the delete, so that a table loaded meanwhile cannot write the entry back
            try:
                self._processes.delete(ctypes.c_uint32(pid))
            except BPFError:
                pass  # already gone
            for _, file in self._processes_seen.pop(pid, []):
                file.sources.pop(pid, None)
                if not file.sources and file.key in self._files:
                    self._drop_file(file)

    # --- registering -----------------------------------------------------------------------------------------------

    def add_process(self, pid: int) -> bool:
        """Register ``pid``; False when it is gone or has no executable mapping. Raises BPFError on map failures."""
        mappings = executable_mappings(pid, self._proc)
        entries: list[tuple[Mapping, _File]] = []
        with self._lock:
            for mapping in mappings[:abi.UNWIND_MAX_MAPPINGS]:
                try:
                    file = self._file(pid, mapping)
                except (FileNotFoundError, ProcessLookupError):  # the process exited meanwhile
                    return False
                if file is not None:
                    entries.append((mapping, file))
            if not entries:
                return False
            old = self._processes_seen.get(pid)
            self._processes_seen[pid] = entries
            if old is None:
                self.stats.processes += 1
            else:
                kept = {id(file) for _, file in entries}
                for _, file in old:
                    if id(file) not in kept:
                        file.sources.pop(pid, None)
                        if not file.sources and file.key in self._files:
                            self._drop_file(file)
            self._write_process(pid)
        return True

    def _file(self, pid: int, mapping: Mapping) -> _File | None:
        image: bytes | None = None
        path = f"{self._proc}/{pid}/map_files/{mapping.start:x}-{mapping.end:x}"
        try:
            if mapping.path == "[vdso]":
                with open(f"{self._proc}/{pid}/mem", "rb", buffering=0) as memory:
                    memory.seek(mapping.start)
                    image = memory.read(mapping.end - mapping.start)
            key = file_key(path, image)
        except (FileNotFoundError, ProcessLookupError):
            raise
        except OSError as exc:
            self._file_error(mapping.path, exc)
            return None
        file = self._files.get(key)
        if file is None:
            if not self._free_ids:
                return None  # more distinct files than ids: walked by frame pointer
            file = _File(self._free_ids.pop(), key, mapping.path, image=image)
            if self._small(path, image):
                file.since = -1  # built at once, hit or not
            if self._hits is not None:
                self._hits[file.id] = 0
            self._files[key] = file
            self._by_id[file.id] = file
            self.stats.files_known = len(self._files)
        file.sources[pid] = path
        return file

    def _small(self, path: str, image: bytes | None) -> bool:
        """Whether the file's frame section is within eager_frame_bytes (or it has none: nothing to build)."""
        if image is not None:
            return True
        try:
            return frame_section_size(path) <= self._eager_frame_bytes
        except (OSError, ValueError):
            return True  # the build will fail and count it

    def _write_process(self, pid: int) -> None:
        entries = self._processes_seen.get(pid)
        if not entries or self._abandoned.is_set():
            return
        value = abi.UnwindProcess(count=len(entries))
        for index, (mapping, file) in enumerate(entries):
            bias = file.table.bias(mapping.start, mapping.offset) if file.table is not None else None
            loaded = file.state == _LOADED and bias is not None
            value.mappings[index] = abi.UnwindMapping(
                start=mapping.start, end=mapping.end, bias=((bias or 0) + (file.base if loaded else 0)) & _U64,
                first_row=file.first_row if loaded else 0, row_count=file.row_count if loaded else 0,
                file_id=file.id)
        self._processes.update(ctypes.c_uint32(pid), value)

    # --- building what samples hit ---------------------------------------------------------------------------------

    def _wanted(self) -> list[_File]:
        """Pending files that samples hit since they became pending."""
        hits = self._hits
        with self._lock:
            now = time.monotonic()
            return [file for file in self._files.values()
                    if file.state == _PENDING and (hits[file.id] if hits is not None else 0) > file.since
                    and file.retry_at <= now]

    def _remap_wanted(self) -> bool:
        if self._remap is None:
            return False
        now = time.monotonic()
        return any(now - self._remapped.get(int.from_bytes(key, "little"), -1e9) >= _REMAP_EVERY_S
                   for key in self._remap.keys())

    def serve(self) -> None:
        """Build and load the tables of the files that samples hit, re-read the maps of processes that asked."""
        hits = self._hits
        if hits is not None:
            now = time.monotonic()
            with self._lock:
                for file in self._files.values():
                    if hits[file.id] != file.hits:
                        file.hits, file.last_hit = hits[file.id], now
        for file in self._wanted():
            if self._abandoned.is_set():  # stopping: checked between files, the unit of work
                return
            self._build(file)
        if self._remap is not None:
            now = time.monotonic()
            for key, _ in self._remap.pop_all():
                pid = int.from_bytes(key, "little")
                if now - self._remapped.get(pid, -1e9) >= _REMAP_EVERY_S and pid in self._processes_seen:
                    self._remapped[pid] = now
                    self.stats.remaps += 1
                    self.add_process(pid)

    def _build(self, file: _File) -> None:
        with self._lock:
            if file.rows_needed and not self._room_possible(file.rows_needed, file):
                self._defer(file)  # parsing it again would find no room either
                return
        started = time.thread_time()
        table: UnwindTable | None = None
        rows: ParsedRows | None = None
        for pid, path in list(file.sources.items()):
            try:
                self.stats.parses += 1
                table, rows = parse_table(path, file.image, self._max_frame_bytes)
                break
            except (FileNotFoundError, ProcessLookupError):
                file.sources.pop(pid, None)  # that process exited: try another that maps the file
            except NativeBuilderMissing as exc:
                if not self.stats.files_no_builder:
                    _logger.warning("native unwinding off: %s; stacks are walked by frame pointer", exc)
                self.stats.files_no_builder += 1
                break
            except (OSError, ValueError, MemoryError) as exc:
                self._file_error(file.name, exc)
                break
        try:
            self._load(file, table, rows)
        finally:
            if rows is not None:
                rows.close()
            self.stats.build_s += time.thread_time() - started

    def _load(self, file: _File, table: UnwindTable | None, rows: ParsedRows | None) -> None:
        """Writes the parsed rows straight into unwind_rows (no copy of the table in Python) and points the
        processes that map the file at them."""
        with self._lock:
            if file.key not in self._files or self._abandoned.is_set():
                return  # forgotten meanwhile, or stopping
            if table is None:
                file.state = _NO_ROWS
                return
            file.table = table  # rowless: kept for its segments
            count = rows.count if rows is not None else 0
            if count == 0:
                self.stats.files_too_large += table.too_large
                file.state = _NO_ROWS
            elif count > self._extents.capacity:
                self.stats.rows_full += 1
                file.state = _NO_ROWS
            elif rows is not None and not rows.fits_rows():  # its pcs do not fit unwind_rows' 32-bit offsets
                self.stats.files_too_large += 1
                file.state = _NO_ROWS
            else:
                assert rows is not None
                file.rows_needed = count
                first = self._room(count, file)
                if first is None:  # only recently hit tables to evict: no room now, try again later
                    self._defer(file)
                    return
                file.retry_s = _COLD_S
                target = (ctypes.c_char * (count * _ROW_BYTES)).from_buffer(self._memory, first * _ROW_BYTES)
                rows.write_rows(ctypes.addressof(target))
                del target  # the mmap can be closed only once no ctypes object points into it
                file.state, file.first_row, file.row_count, file.base = _LOADED, first, count, rows.base
                self.stats.rows += count
                self.stats.files += 1
            for pid in list(file.sources):
                self._write_process(pid)

    def _room(self, count: int, wanting: _File) -> int | None:
        """Rows for ``count`` (at most the capacity), evicting the least recently hit tables not hit for _COLD_S
        until they fit; None if that is not enough (evicting tables still in use would only trade one for another,
        rebuilding both again and again)."""
        first = self._extents.take(count)
        while first is None:
            loaded = self._evictable(wanting)
            if not loaded:
                return None
            victim = min(loaded, key=lambda file: file.last_hit)
            self._unload(victim)
            victim.state = _PENDING  # built again if samples hit it again
            victim.since = self._hits[victim.id] if self._hits is not None else 0
            self.stats.evictions += 1
            first = self._extents.take(count)
        return first

    def _room_possible(self, count: int, wanting: _File) -> bool:
        """Whether :meth:`_room` might find ``count`` rows now: free rows and the rows of tables cold enough to evict
        add up to it (contiguity is _room's to find)."""
        return self._extents.free_rows() + sum(file.row_count for file in self._evictable(wanting)) >= count

    def _evictable(self, wanting: _File) -> list[_File]:
        """The loaded tables :meth:`_room` may evict for ``wanting``: not hit for _COLD_S."""
        cold = time.monotonic() - _COLD_S
        return [file for file in self._files.values()
                if file.state == _LOADED and file is not wanting and file.last_hit < cold]

    def _defer(self, file: _File) -> None:
        """No room for ``file``'s table: counted, tried again after its back-off (which then doubles)."""
        self.stats.rows_full += 1
        file.retry_at = time.monotonic() + file.retry_s
        file.retry_s = min(2 * file.retry_s, _MAX_RETRY_S)
        file.since = self._hits[file.id] if self._hits is not None else 0

    def _unload(self, file: _File) -> None:
        """Give back a loaded file's rows, after every process that maps it stops pointing at them."""
        if file.state != _LOADED:
            return
        file.state = _NO_ROWS
        for pid in list(file.sources):
            self._write_process(pid)
        self._extents.give(file.first_row, file.row_count)
        self.stats.rows -= file.row_count
        file.first_row = file.row_count = file.base = 0

    def _drop_file(self, file: _File) -> None:
        self._unload(file)
        del self._files[file.key]
        del self._by_id[file.id]
        self._free_ids.append(file.id)
        self.stats.files_known = len(self._files)

    def _file_error(self, name: str, exc: Exception) -> None:
        self.stats.file_errors += 1
        if len(self.stats.errors_by_file) < 16 and name not in self.stats.errors_by_file:
            self.stats.errors_by_file[name] = str(exc)
            _logger.debug("native unwinding: %s: %s", name, exc)

    def _work(self) -> None:
        # Not niced: this thread holds the GIL while it builds, and a thread at nice 19 that holds it on a busy node
        # is seldom scheduled, stalling every other thread of the agent (measured on the H200: a new Python
        # process's frames were registered only after the tables, 43 s later). Laziness and the size cap bound it.
        while True:
            try:
                pid: int | None = self._queue.get(timeout=_POLL_S)
            except queue.Empty:
                pid = -1
            try:
                if pid is None or self._abandoned.is_set():
                    return
                if pid >= 0:
                    self.add_process(pid)
            except (BPFError, OSError, ValueError) as exc:  # loop boundary: that process keeps frame pointers
                self.stats.file_errors += 1
                _logger.debug("native unwinding: registering %s failed: %s", pid, exc)
            finally:
                if pid != -1:
                    self._queue.task_done()
            try:
                self.serve()
            except (BPFError, OSError, ValueError) as exc:  # loop boundary: try again at the next poll
                self.stats.file_errors += 1
                _logger.debug("native unwinding: building hit files failed: %s", exc)


def _map(fd: int, size: int) -> mmap.mmap:
    return mmap.mmap(fd, (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE, mmap.MAP_SHARED,
                     mmap.PROT_READ | mmap.PROT_WRITE)

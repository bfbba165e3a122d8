# SPDX-License-Identifier: Apache-2.0
"""Turns raw stack addresses into :class:`otel_gpu.profiles.model.Frame` values.

User frames: /proc/PID/maps finds the mapping, the ELF file's load segments turn the address into a link-time
address (PIE and shared-library bias removed), and .symtab/.dynsym name it. Addresses outside any file (JIT code)
are looked up in /tmp/perf-PID.map. Kernel frames come from /proc/kallsyms. ELF files are cached by file identity
(device, inode, mtime, size), so one library shared by many processes is read once. Never by build id alone: any
process can write a file that claims another binary's build id, and its names would then show in the frames of
every process that maps the real one (a separate debug file is still found by build id, under a root-owned
folder). The cache is bounded by file count and by bytes of symbol tables (least recently used files go first,
and are read again from their file if needed later).

Short-lived processes: :meth:`Symbolizer.remember` snapshots a process's mappings and opens its executable files
as soon as it is first seen; the snapshot outlives the process until :meth:`Symbolizer.prune`. A caller that tells
the programs one pid runs apart (the CPU sampler's exec id) passes each one's ``image``: the snapshot of a program
that an exec replaced is kept beside the new one's, to name the samples taken before the exec, and is never read
again from /proc (whose maps are the new program's by then). A binary that is gone
or unreadable yields a frame named ``file+0xOFFSET`` that keeps its address, mapping and build id, never an error.
Files without a full symbol table take it from a separate debug file found by build id
(``/usr/lib/debug/.build-id/xx/yyyy.debug``, as installed by distributions' debug-symbol packages).
Code no symbol names (static functions of a stripped library) is named ``file+0xSTART`` by the start of its function
from ``.eh_frame_hdr``, so its samples group per function; PLT stubs are ``name@plt``.
Non-leaf addresses are return addresses; they are looked up at ``address - 1`` so a call at the very end of a
function is attributed to that function.
"""

from __future__ import annotations

import bisect
import logging
import os
import resource
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from otel_gpu import procfs, selfmetrics, semconv
from otel_gpu.profiles.model import Frame, FrameKind, Mapping
from otel_gpu.symbolize.demangle import Demangler
from otel_gpu.symbolize.elf import ElfError, ElfSymbols, read_build_id
from otel_gpu.symbolize.kallsyms import KernelSymbols
from otel_gpu.symbolize.maps import MapEntry, read_maps, read_maps_capped
from otel_gpu.symbolize.perfmap import PerfMap

_logger = logging.getLogger(__name__)

SOURCE = semconv.Source.SYMBOLIZER
FileKey = tuple[int, int, int, int]  # st_dev, st_ino, st_mtime_ns, st_size


class _Resolved(NamedTuple):
    """One address looked up, before demangling (names of a batch are demangled together)."""

    address: int
    leaf: bool
    name: str  # the raw symbol name, "" when none was found
    entry: MapEntry | None  # the mapping of /proc/PID/maps it falls in
    mapping: Mapping | None  # the profile's mapping (file-backed or the vDSO)
    file_offset: int  # -1: none
    deferred: bool = False  # its file was not read (the call's deadline had passed): not cached, named file+offset
    function_offset: int = -1  # no symbol: the file offset of its function's start (from .eh_frame_hdr), -1 if none

_EVICTED = object()  # a file key no longer in the cache
# Whole stacks remembered per process (their frames are remembered anyway): a drain of stacks seen before is one
# lookup per stack instead of one per frame. Past it, the process's stacks are forgotten and built again.
_STACK_CACHE_ENTRIES = 8192  # about 3 MB per process at most (stacks of ~20 frames)
# Snapshots of programs an exec replaced, kept for the samples taken before the exec (their callers forget each one
# once its samples are drained): past it, the oldest go first.
_MAX_REPLACED = 256


class _Process:
    """What is known about one process: its mappings, their ELF files, and the frames already built."""

    def __init__(self, pid: int, entries: list[MapEntry], start_ticks: int = 0, image: int | None = None) -> None:
        self.pid = pid
        self.start_ticks = start_ticks  # tells a reused pid apart
        self.image = image  # which program of the pid (the caller's id), None: whichever runs
        self.replaced = False  # an exec replaced it: /proc/PID shows another program, never read for this one
        self.set_entries(entries)
        # by entry start: the file's cache key (None: no readable file) and its mapping; the ElfSymbols itself lives
        # only in the Symbolizer's bounded cache, so evicting it frees its memory and file descriptor
        self.files: dict[int, tuple[FileKey | None, Mapping]] = {}
        self.frames: dict[tuple[int, bool], Frame] = {}  # (address, is_leaf)
        self.stacks: dict[tuple[int, ...], tuple[Frame, ...]] = {}  # whole stacks whose every frame is in frames
        self.build_ids: dict[int, str] = {}  # by entry start: files whose symbols were not read yet (deferred frames)
        self.perf_map: PerfMap | None = None
        self.perf_map_checked = False
        self.perf_map_capped = False  # counted once: its perf map is larger than the symbolizer reads
        self.maps_capped = False  # counted once: its maps file is larger than the symbolizer reads
        self.refreshed = False

    def set_entries(self, entries: list[MapEntry]) -> None:
        self.entries = sorted((e for e in entries if e.executable or e.file_backed), key=_start_of)  # bisected
        self.starts = [e.start for e in self.entries]

    def find(self, address: int) -> MapEntry | None:
        index = bisect.bisect_right(self.starts, address) - 1
        if index >= 0 and address < self.entries[index].end:
            return self.entries[index]
        return None


class Symbolizer:
    """Symbolizes user and kernel stacks; thread-safe (the CPU sampler calls :meth:`remember` from its event thread
    and the stack methods from the drain)."""

    def __init__(self, proc_root: str = "/proc", kallsyms_path: str = "/proc/kallsyms", max_files: int = 512,
                 max_symbol_bytes: int = 36 * 1024 * 1024, max_processes: int = 8192,
                 debug_dirs: Sequence[str] = ("/usr/lib/debug",)) -> None:
        self._proc = proc_root
        self._debug_dirs = tuple(debug_dirs)
        self._kallsyms_path = kallsyms_path
        self._kernel: KernelSymbols | None = None
        self._kernel_frames: dict[int, Frame] = {}
        self._files: OrderedDict[FileKey, ElfSymbols | None] = OrderedDict()
        self._max_files = max(1, min(max_files, _descriptor_budget()))  # each cached file holds one descriptor
        self._max_symbol_bytes = max_symbol_bytes
        self._symbol_bytes = 0
        self.read_seconds = 0.0  # CPU time spent reading symbol tables (ELF and debug files), all threads together
        self.evictions = 0  # ELF files dropped from the cache to stay within max_files and max_symbol_bytes
        self.deferred_frames = 0  # frames named file+offset because their file was not read before the deadline
        self._unsymbolized = 0  # frames in a known file without a symbol, counted per call into selfmetrics
        self._vdso: ElfSymbols | None = None
        self._vdso_read = False
        self._max_processes = max_processes
        self._processes: OrderedDict[int, _Process] = OrderedDict()  # each pid's current program
        self._replaced: OrderedDict[tuple[int, int], _Process] = OrderedDict()  # (pid, image): programs exec replaced
        self._demangler = Demangler()
        self._lock = threading.RLock()
        self._deadline: float | None = None  # monotonic s; set during user_stacks(deadline=...): no new file after it

    # --- processes -------------------------------------------------------------------------------------------------

    def remember(self, pid: int, image: int | None = None) -> bool:
        """Snapshot the mappings of ``pid`` while it runs, and read now the symbols of executable files that could
        not be read once it exits (deleted files, files seen only through its mount namespace). False when gone.

        ``image``: which program of the pid this is (the caller made sure /proc shows that one). A snapshot of
        another image is kept aside as replaced, for :meth:`user_stacks` of that image, until :meth:`forget_image`."""
        found = read_maps_capped(pid, self._proc)
        if found is None:
            return False
        entries, capped = found
        start_ticks = _start_ticks(self._proc, pid)
        with self._lock:
            process = self._processes.get(pid)
            if process is not None and process.start_ticks != start_ticks:
                process = None  # the pid was reused
            if process is not None and image is not None and process.image != image:
                if process.image is not None:  # an exec: its samples taken before it are named with this snapshot
                    process.replaced = True
                    self._replaced[(pid, process.image)] = process
                    while len(self._replaced) > _MAX_REPLACED:
                        self._replaced.popitem(last=False)
                process = None  # another program: frames cached by address would be the old one's
            if process is None:
                process = _Process(pid, entries, start_ticks, image)
                self._processes[pid] = process
                while len(self._processes) > self._max_processes:
                    self._processes.popitem(last=False)
            else:
                process.set_entries(entries)
            self._count_capped_maps(process, capped)
            for entry in process.entries:
                if entry.executable and entry.file_backed and not self._reopenable(entry):
                    self._file_for(process, entry)
        return True

    @staticmethod
    def _reopenable(entry: MapEntry) -> bool:
        """True when ``entry``'s file can be read later through its path (same inode), even after the process
        exited."""
        if entry.deleted:
            return False
        try:
            return os.stat(entry.path).st_ino == entry.inode
        except OSError:
            return False

    def knows(self, pid: int, image: int | None = None) -> bool:
        """Whether a snapshot of ``pid`` is held (of that ``image``, current or replaced, when one is given)."""
        with self._lock:
            if image is None:
                return pid in self._processes
            process = self._processes.get(pid)
            return (process is not None and process.image == image) or (pid, image) in self._replaced

    def forget_image(self, pid: int, image: int) -> None:
        """Drop the snapshot of program ``image`` of ``pid``: one an exec replaced (its samples are all drained),
        or the current one when it may hold another program's mappings."""
        with self._lock:
            self._replaced.pop((pid, image), None)
            process = self._processes.get(pid)
            if process is not None and process.image == image:
                del self._processes[pid]

    def prune(self, keep: Iterable[int]) -> int:
        """Forget processes that are not in ``keep`` and no longer exist; returns how many were forgotten."""
        keep_set = set(keep)
        with self._lock:
            gone = [pid for pid in self._processes if pid not in keep_set and not os.path.exists(f"{self._proc}/{pid}")]
            for pid in gone:
                del self._processes[pid]
            for key in [key for key in self._replaced if key[0] not in keep_set and key[0] not in self._processes]:
                del self._replaced[key]
        return len(gone)

    # --- stacks ----------------------------------------------------------------------------------------------------

    def user_stacks(self, pid: int, stacks: Sequence[Sequence[int]], deadline: float | None = None,
                    image: int | None = None) -> list[tuple[Frame, ...]]:
        """Frames (leaf first) for each stack of user addresses (leaf first) of process ``pid``: of its program
        ``image`` when one is given (its snapshot, current or replaced by an exec; with none held its frames are
        ``[unknown] 0xADDRESS``: /proc shows another program), else of whatever it runs.

        ``deadline`` (``time.monotonic()`` seconds) bounds the one slow step: reading a file's symbol table (0.3 s
        for a 150 MB library). Past it, a frame in a file not yet read is named ``file+0xOFFSET`` with its mapping and
        address (symbolizable off the node), counted as ``symbols_deferred``, and not remembered: the next call that
        has time reads the file and names it."""
        with self._lock:
            self._deadline = deadline
            try:
                return self._user_stacks(pid, stacks, image)
            finally:
                self._deadline = None

    def _user_stacks(self, pid: int, stacks: Sequence[Sequence[int]],
                     image: int | None) -> list[tuple[Frame, ...]]:
        with self._lock:
            process = self._processes.get(pid)
            if image is not None and (process is None or process.image != image):
                process = self._replaced.get((pid, image))
                if process is None:  # never read: nothing to name its addresses with, and /proc is another's
                    process = _Process(pid, [], image=image)
                    process.replaced = True
            if process is None:
                found = read_maps_capped(pid, self._proc)
                process = _Process(pid, found[0] if found is not None else [])
                self._processes[pid] = process
                self._count_capped_maps(process, found is not None and found[1])
            process.refreshed = False  # re-read the maps at most once per call (a library loaded meanwhile)
            process.perf_map_checked = False
            known = process.stacks
            todo = [stack for stack in dict.fromkeys(map(tuple, stacks)) if stack not in known]
            if not todo:  # the steady state: every stack seen before, one lookup each
                return [known[tuple(stack)] for stack in stacks]
            if len(known) + len(todo) > _STACK_CACHE_ENTRIES:  # forgotten: this call's known stacks are built again
                known.clear()
                todo = list(dict.fromkeys(map(tuple, stacks)))
            raw: list[list[_Resolved]] = []
            names: set[str] = set()
            for stack in todo:
                resolved: list[_Resolved] = []
                for depth, address in enumerate(stack):
                    leaf = depth == 0
                    if (address, leaf) in process.frames:
                        resolved.append(_Resolved(address, leaf, "", None, None, -1))
                        continue
                    item = self._resolve(process, address, leaf)
                    resolved.append(item)
                    if item.name:
                        names.add(item.name)
                raw.append(resolved)
            self._demangler.prepare(names)
            built: dict[tuple[int, ...], tuple[Frame, ...]] = {}
            unsymbolized_before = self._unsymbolized
            deferred = 0
            for stack, resolved in zip(todo, raw, strict=True):
                frames = []
                deferred_before = deferred
                for address, leaf, name, entry, mapping, file_offset, later, function_offset in resolved:
                    frame = process.frames.get((address, leaf))
                    if frame is None and later:
                        deferred += 1
                        assert mapping is not None  # a deferred frame is always in a file
                        frame = Frame(f"{os.path.basename(mapping.path)}+0x{file_offset:x}", FrameKind.NATIVE,
                                      address, mapping)
                    elif frame is None:
                        frame = self._frame(address, name, entry, mapping, file_offset, function_offset)
                        other = process.frames.get((address, not leaf))
                        if other == frame:  # one object per value: encoders deduplicate frames by identity first
                            frame = other
                        process.frames[(address, leaf)] = frame
                    frames.append(frame)
                built[stack] = tuple(frames)
                if deferred == deferred_before:  # a frame named later must not be remembered as file+offset
                    known[stack] = built[stack]
            out = [built[stack] if stack in built else known[stack] for stack in map(tuple, stacks)]
            if self._unsymbolized != unsymbolized_before:
                selfmetrics.count(semconv.SELF_ERRORS.name, self._unsymbolized - unsymbolized_before,
                                  otel_gpu__source=SOURCE, otel_gpu__reason=semconv.Reason.NO_SYMBOL)
            if deferred:
                self.deferred_frames += deferred
                selfmetrics.count(semconv.SELF_ERRORS.name, deferred, otel_gpu__source=SOURCE,
                                  otel_gpu__reason=semconv.Reason.SYMBOLS_DEFERRED)
            return out

    def load_kernel_symbols(self) -> bool:
        """Read /proc/kallsyms now (about 0.2 s) instead of at the first kernel frame; False when unavailable."""
        with self._lock:
            return self._kernel_symbols().available

    def _kernel_symbols(self) -> KernelSymbols:
        """The kernel's symbols, read at the first use (the lock held); a capped read is counted then, once."""
        if self._kernel is None:
            self._kernel = KernelSymbols(self._kallsyms_path)
            if self._kernel.truncated:
                selfmetrics.count(semconv.SELF_ERRORS.name, otel_gpu__source=SOURCE,
                                  otel_gpu__reason=semconv.Reason.KALLSYMS_TOO_LARGE)
        return self._kernel

    def kernel_stack(self, addresses: Sequence[int]) -> tuple[Frame, ...]:
        """Frames (leaf first) for kernel addresses (leaf first)."""
        with self._lock:
            kernel = self._kernel_symbols()
            frames = []
            for depth, address in enumerate(addresses):
                frame = self._kernel_frames.get(address if depth else -address)
                if frame is None:
                    found = kernel.lookup(address - 1 if depth else address)
                    if found is None:
                        frame = Frame(f"[kernel] 0x{address:x}", FrameKind.KERNEL, address)
                    else:
                        name, _offset, module = found
                        frame = Frame(name, FrameKind.KERNEL, address, system_name=name, filename=module)
                    if len(self._kernel_frames) > 500_000:
                        self._kernel_frames.clear()
                    self._kernel_frames[address if depth else -address] = frame
                frames.append(frame)
            return tuple(frames)

    # --- internals -------------------------------------------------------------------------------------------------

    def _resolve(self, process: _Process, address: int, leaf: bool) -> _Resolved:
        entry = process.find(address)
        if entry is None and not process.refreshed and not process.replaced:
            process.refreshed = True
            fresh = read_maps_capped(process.pid, self._proc)  # a library loaded after the snapshot
            if fresh is not None:
                process.set_entries(fresh[0])
                self._count_capped_maps(process, fresh[1])
                entry = process.find(address)
        if entry is not None and entry.path == "[vdso]":
            return self._resolve_vdso(entry, address, leaf)
        if entry is None or not entry.file_backed:
            name = None if process.replaced else self._perf_map_name(process, address)  # the pid's map is the new one's
            return _Resolved(address, leaf, name or "", entry, None, -1)
        file_offset = address - entry.start + entry.offset
        if self._past_deadline() and not self._file_cached(process, entry):
            mapping = Mapping(entry.start, entry.end, entry.offset, _exported(entry.path),
                              self._build_id_only(process, entry))
            return _Resolved(address, leaf, "", entry, mapping, file_offset, deferred=True)
        elf, mapping = self._file_for(process, entry)
        if elf is not None:
            lookup_offset = file_offset if leaf else file_offset - 1
            vaddr = elf.vaddr_of(lookup_offset)
            if vaddr is not None:
                found = elf.lookup(vaddr)
                if found is not None:
                    return _Resolved(address, leaf, found[0], entry, mapping, file_offset)
                start = elf.function_start(vaddr)  # a static function of a stripped file: one name for all of it
                function_offset = elf.offset_of(start) if start is not None else None
                if function_offset is not None:
                    return _Resolved(address, leaf, "", entry, mapping, file_offset, function_offset=function_offset)
        return _Resolved(address, leaf, "", entry, mapping, file_offset)

    def _resolve_vdso(self, entry: MapEntry, address: int, leaf: bool) -> _Resolved:
        """The vDSO is the same image in every process of this kernel: read once from our own memory."""
        if not self._vdso_read:
            self._vdso_read = True
            self._vdso = _read_own_vdso()
        vdso = self._vdso
        mapping = Mapping(entry.start, entry.end, 0, "[vdso]", vdso.build_id if vdso is not None else "")
        offset = address - entry.start
        found = vdso.lookup(offset if leaf else offset - 1) if vdso is not None else None
        return _Resolved(address, leaf, found[0] if found else "", entry, mapping, offset)

    def _frame(self, address: int, name: str, entry: MapEntry | None, mapping: Mapping | None, file_offset: int,
               function_offset: int = -1) -> Frame:
        if mapping is not None:
            if name:
                return Frame(self._demangler.demangle(name), FrameKind.NATIVE, address, mapping, system_name=name)
            self._unsymbolized += 1
            # named by its function's start when unwind info gives one, so samples group per function (the frame
            # keeps its own address and mapping)
            offset = function_offset if function_offset >= 0 else file_offset
            return Frame(f"{os.path.basename(mapping.path)}+0x{offset:x}", FrameKind.NATIVE, address, mapping)
        if name:
            kind = FrameKind.PYTHON if name.startswith("py::") else FrameKind.NATIVE
            return Frame(self._demangler.demangle(name), kind, address, system_name=name)
        label = _exported(entry.path) if entry is not None and entry.path else "unknown"
        return Frame(f"[{label.strip('[]')}] 0x{address:x}", FrameKind.NATIVE, address)

    def _past_deadline(self) -> bool:
        return self._deadline is not None and time.monotonic() >= self._deadline

    def _file_cached(self, process: _Process, entry: MapEntry) -> bool:
        """True when ``entry``'s file needs no reading: known unreadable, or its symbols are in the cache."""
        known = process.files.get(entry.start)
        return known is not None and (known[0] is None or known[0] in self._files)

    def _build_id_only(self, process: _Process, entry: MapEntry) -> str:
        """The build id of ``entry``'s file without its symbols (a few KiB of headers and notes), so a frame sent as
        file+offset can be symbolized off the node; "" when the file cannot be read. Kept per mapping."""
        found = process.build_ids.get(entry.start)
        if found is not None:
            return found
        build_id = ""
        for candidate, must_match_inode in self._candidates(process, entry):
            try:
                if must_match_inode and os.stat(candidate).st_ino != entry.inode:
                    continue
                build_id = read_build_id(candidate)
                break
            except (OSError, ElfError):
                continue
        process.build_ids[entry.start] = build_id
        return build_id

    def _candidates(self, process: _Process, entry: MapEntry) -> tuple[tuple[str, bool], ...]:
        """Paths that may hold ``entry``'s file, and whether each must still have the mapped inode (map_files too
        for a replaced program: the same range may map another file now)."""
        pid = process.pid
        return ((f"{self._proc}/{pid}/map_files/{entry.start:x}-{entry.end:x}", process.replaced),
                (f"{self._proc}/{pid}/root{entry.path}", True),
                (entry.path, True))

    def _file_for(self, process: _Process, entry: MapEntry) -> tuple[ElfSymbols | None, Mapping]:
        known = process.files.get(entry.start)
        if known is not None:
            key, mapping = known
            if key is None:
                return None, mapping
            elf = self._files.get(key, _EVICTED)
            if elf is not _EVICTED:
                self._files.move_to_end(key)
                return elf, mapping  # type: ignore[return-value]  # not _EVICTED
            # evicted since: read it again while it can still be opened (the mapping keeps its build id either way)
        key, elf = self._open_elf(process, entry)
        if known is not None and elf is None:
            mapping = known[1]
        else:
            mapping = Mapping(entry.start, entry.end, entry.offset, _exported(entry.path),
                              elf.build_id if elf is not None else "")
        process.files[entry.start] = (key if elf is not None else None, mapping)
        return elf, mapping

    def _open_elf(self, process: _Process, entry: MapEntry) -> tuple[FileKey | None, ElfSymbols | None]:
        """The cache key and symbols of ``entry``'s file (None, None when no candidate path holds it)."""
        for candidate, must_match_inode in self._candidates(process, entry):
            try:
                stat = os.stat(candidate)
            except OSError:
                continue
            if must_match_inode and stat.st_ino != entry.inode:
                continue  # replaced since it was mapped: its symbols would be wrong
            key = (stat.st_dev, stat.st_ino, stat.st_mtime_ns, stat.st_size)
            if key in self._files:
                self._files.move_to_end(key)
                return key, self._files[key]
            read_from = time.thread_time()
            try:
                elf = ElfSymbols(candidate)
            except OSError as exc:  # gone between stat and open (the process exited): try the next path
                _logger.debug("cannot open %s: %s", candidate, exc)
                continue
            except Exception as exc:  # noqa: BLE001 - any process may map any file: a parser failure costs its symbols
                _logger.debug("cannot read symbols of %s: %s", entry.path, exc)
                selfmetrics.count(semconv.SELF_ERRORS.name, otel_gpu__source=SOURCE,
                                  otel_gpu__reason=semconv.Reason.UNREADABLE_ELF)
                elf = None
            if elf is not None and elf.build_id and not elf.has_symtab:
                self._add_debug_symbols(elf)
            self.read_seconds += time.thread_time() - read_from
            if elf is not None:
                self._symbol_bytes += elf.size_bytes
            self._files[key] = elf
            self._evict()
            return key, elf
        selfmetrics.count(semconv.SELF_ERRORS.name, otel_gpu__source=SOURCE,
                          otel_gpu__reason=semconv.Reason.MISSING_FILE)
        return None, None

    def _evict(self) -> None:
        """Drop least recently used files until the cache is within max_files and max_symbol_bytes (the newest
        file stays even when it alone is larger)."""
        while len(self._files) > 1 and (len(self._files) > self._max_files
                                        or self._symbol_bytes > self._max_symbol_bytes):
            _, dropped = self._files.popitem(last=False)
            if dropped is not None:
                self._symbol_bytes -= dropped.size_bytes
                self.evictions += 1
                selfmetrics.count(semconv.SELF_ERRORS.name, otel_gpu__source=SOURCE,
                                  otel_gpu__reason=semconv.Reason.SYMBOL_FILE_EVICTED)

    def _add_debug_symbols(self, elf: ElfSymbols) -> None:
        for folder in self._debug_dirs:
            path = f"{folder}/.build-id/{elf.build_id[:2]}/{elf.build_id[2:]}.debug"
            if not os.path.exists(path):
                continue
            try:
                debug = ElfSymbols(path)
            except Exception as exc:  # noqa: BLE001 - a parser failure costs the debug file only
                _logger.debug("cannot read debug file %s: %s", path, exc)
                continue
            if debug.build_id == elf.build_id and debug.symbol_count >= elf.symbol_count:
                elf.add_symbols_from(debug)
                return

    @staticmethod
    def _count_capped_maps(process: _Process, capped: bool) -> None:
        """Count once per process that its maps file is past the cap (mappings past it give unnamed frames)."""
        if capped and not process.maps_capped:
            process.maps_capped = True
            selfmetrics.count(semconv.SELF_ERRORS.name, otel_gpu__source=SOURCE,
                              otel_gpu__reason=semconv.Reason.MAPS_TOO_LARGE)

    def _perf_map_name(self, process: _Process, address: int) -> str | None:
        perf_map = self._perf_map(process)
        return perf_map.lookup(address) if perf_map is not None else None

    def _perf_map(self, process: _Process) -> PerfMap | None:
        if process.perf_map_checked:
            return process.perf_map
        process.perf_map_checked = True  # once per call: JIT maps grow while the process runs
        ns_pid = _namespace_pid(self._proc, process.pid)
        for path in (f"{self._proc}/{process.pid}/root/tmp/perf-{ns_pid}.map", f"/tmp/perf-{process.pid}.map"):
            if not os.path.exists(path):
                continue
            current = process.perf_map
            try:
                if current is not None and current.path == path:
                    current.refresh()  # what was appended since the last look, nothing when nothing was
                else:
                    process.perf_map = PerfMap(path)
            except OSError:
                continue
            if process.perf_map is not None and process.perf_map.truncated and not process.perf_map_capped:
                process.perf_map_capped = True
                selfmetrics.count(semconv.SELF_ERRORS.name, otel_gpu__source=SOURCE,
                                  otel_gpu__reason=semconv.Reason.PERF_MAP_TOO_LARGE)
            return process.perf_map
        return process.perf_map


def _exported(path: str) -> str:
    """``path`` as valid UTF-8 for profiles: a file name may hold any bytes, kept in a :class:`MapEntry` as lone
    surrogates (so the file can be opened) that no encoder of the profile would take."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _start_of(entry: MapEntry) -> int:
    return entry.start


def _descriptor_budget() -> int:
    """A quarter of this process's open-file limit (the rest is for perf events, BPF maps and sockets)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft // 4 if soft != resource.RLIM_INFINITY else 1 << 20


def _read_own_vdso() -> ElfSymbols | None:
    """The kernel's vDSO image as mapped into this process (from /proc/self/mem), or None."""
    try:
        entry = next(e for e in read_maps(os.getpid()) or [] if e.path == "[vdso]")
        with open("/proc/self/mem", "rb") as memory:
            memory.seek(entry.start)
            image = memory.read(entry.end - entry.start)
        return ElfSymbols("[vdso]", image)
    except (StopIteration, OSError, ElfError, ValueError) as exc:
        _logger.debug("vDSO frames stay unsymbolized: %s", exc)
        return None


def _start_ticks(proc_root: str, pid: int) -> int:
    """The start time of ``pid`` in clock ticks since boot (field 22 of /proc/PID/stat), 0 when unreadable."""
    try:
        return procfs.parse_stat_start_time(procfs.read_capped(f"{proc_root}/{pid}/stat", procfs.MAX_STAT_BYTES)[0])
    except OSError:
        return 0


def _namespace_pid(proc_root: str, pid: int) -> int:
    """The pid of ``pid`` inside its own pid namespace (the number in its perf map file name)."""
    try:
        status, _ = procfs.read_capped(f"{proc_root}/{pid}/status", procfs.MAX_STATUS_BYTES)
    except OSError:
        return pid
    found = procfs.parse_namespace_pid(status)
    return found if found is not None else pid

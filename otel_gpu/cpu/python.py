# SPDX-License-Identifier: Apache-2.0
"""CPython frames in CPU profiles: finds Python processes, registers them with the BPF walker
(``programs/python_frames.h``), and turns the walker's (code object, instruction offset) stacks into frames.

A process runs CPython when its executable or a mapped ``libpython3.X`` defines ``_PyRuntime``. The version comes
from ``Py_Version`` (3.11+) or the file's name (3.10). Offsets come from ``_Py_DebugOffsets`` at the start of
``_PyRuntime`` on 3.13 (the layout of that struct is the one thing this module knows of 3.13), else from the one
table of layouts, ``otel_gpu/cuda/native/python_layouts.h``, shared with the injected library. Code objects are read
through ``/proc/PID/mem``, type-checked against ``PyCode_Type``, and cached per (pid, address) within a bound: a
frame whose code object cannot be read or is not one is dropped rather than named wrongly. They are read as soon as
the walker stores a new stack (:meth:`PythonFrames.read_new_stacks`, from the sampler's event thread), so a process
that exits before the drain keeps its frames: the drain finds them cached, and what was read while the process ran
stands once its memory is gone.
"""

from __future__ import annotations

import logging
import os
import re
import struct
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from otel_gpu import selfmetrics, semconv
from otel_gpu.ebpf import abi
from otel_gpu.profiles.model import Frame, FrameKind
from otel_gpu.symbolize.elf import _SYM, ElfError, _elf_header, _program_headers, _section_headers
from otel_gpu.symbolize.elf import _Source as _ElfSource
from otel_gpu.symbolize.maps import read_maps

_logger = logging.getLogger(__name__)

LAYOUTS_HEADER = Path(__file__).resolve().parent.parent / "cuda" / "native" / "python_layouts.h"
EVALUATION_LOOP = "_PyEval_EvalFrameDefault"  # one native frame per run of Python frames (also its .cold part)
_LIBRARY = re.compile(r"(?:^|/)(?:lib)?python(\d)\.(\d+)[a-z]*(?:\.so[.\d]*)?$")
_DEBUG_COOKIE = b"xdebugpy"
_CODE_CACHE_ENTRIES = 16384  # per process; with line tables of at most _LINETABLE_BYTES
_RUNS_CACHE_ENTRIES = 4096  # per process: stacks whose runs are kept across drains (a key is ~250 bytes)
_STACK_CODE, _STACK_OFFSET = abi.PythonStack.code.offset, abi.PythonStack.offset.offset
_NAME_BYTES = 1024
_LINETABLE_BYTES = 65536  # a longer table is cut: lines past it read as 0
_OWNER_CSTACK_NONE = 0xFF
_MAX_INTERPRETER_TABLE_BYTES = 64 << 20  # of a symbol or string table read for 3 symbols (libpython's: ~1 MiB each)
_MAX_OBJECT_OFFSET = 4096  # a field of a code, bytes or str object past this is no CPython layout (they are < 256)
_MAX_LINE = (1 << 31) - 1  # CPython's line numbers are C ints


def load_layouts(path: Path = LAYOUTS_HEADER) -> dict[tuple[int, int], dict[str, int]]:
    """(major, minor) -> field -> value, parsed from the ``py_layouts`` table of the C header."""
    text = path.read_text()
    layouts: dict[tuple[int, int], dict[str, int]] = {}
    for block in re.finditer(r"\{ /\* CPython (\d+)\.(\d+) \*/(.*?)\n    \}", text, re.S):
        fields = {name: int(value, 0) for name, value in re.findall(r"^\s+\.(\w+) = (-?\w+),", block.group(3), re.M)}
        layouts[(int(block.group(1)), int(block.group(2)))] = fields
    return layouts


def elf_symbols(path: str, names: Sequence[str]) -> tuple[dict[str, int], int]:
    """The values of ``names`` in the ELF file's .dynsym/.symtab, and the vaddr its first PT_LOAD maps at file
    offset 0 (the load bias is the mapping's start minus that). See :func:`elf_symbol_ranges`."""
    ranges, base = elf_symbol_ranges(path, names)
    return {name: start for name, (start, _end) in ranges.items()}, base


def elf_symbol_ranges(path: str, names: Sequence[str]) -> tuple[dict[str, tuple[int, int]], int]:
    """The [start, end) vaddrs of ``names`` in the ELF file's .dynsym/.symtab (end = start for a symbol without a
    size), and the vaddr its first PT_LOAD maps at file offset 0 (the load bias is the mapping's start minus that).

    Any process can map a file named like libpython, so every offset, size and index is the file's own claim: reads
    are clamped to the file and to :data:`_MAX_INTERPRETER_TABLE_BYTES`, and a section whose string table is not a
    section is skipped. Raises OSError, or ElfError (a ValueError) for a file that is not a regular file."""
    wanted = set(names)
    found: dict[str, tuple[int, int]] = {}
    source = _ElfSource(path, None)  # opened without blocking (a FIFO put in its place) and never followed past its end
    try:
        def read(offset: int, size: int) -> bytes:
            return source.read(offset, min(size, _MAX_INTERPRETER_TABLE_BYTES))

        try:
            header = _elf_header(source, path)
        except ElfError:
            return {}, 0
        phoff, shoff, phentsize, phnum, shentsize, shnum = (header[i] for i in (5, 6, 9, 10, 11, 12))
        base = next((p_vaddr - p_offset for p_type, p_offset, p_vaddr, _size in
                     _program_headers(read, phoff, phentsize, phnum) if p_type == 1), 0)  # the first PT_LOAD
        sections = _section_headers(read, shoff, shentsize, shnum)
        for section in sections:
            if section[1] not in (2, 11) or section[6] >= len(sections):  # SHT_SYMTAB, SHT_DYNSYM; its strings
                continue
            strtab = sections[section[6]]
            strings = read(strtab[4], strtab[5])
            symbols = read(section[4], section[5])
            for name_off, _info, _other, shndx, value, size in _SYM.iter_unpack(
                    symbols[:len(symbols) - len(symbols) % _SYM.size]):
                if not shndx or not value:
                    continue
                end = strings.find(b"\0", name_off)
                name = strings[name_off:end].decode(errors="replace")
                if name in wanted:
                    found.setdefault(name, (value, value + size))
            if len(found) == len(wanted):
                break
    finally:
        source.close()
    return found, base


@dataclass(frozen=True, slots=True)
class PythonProcess:
    """One CPython process as the walker and the frame reader see it."""

    pid: int
    version: tuple[int, int]
    proc: abi.PythonProc
    code_type: int  # address of PyCode_Type
    layout: dict[str, int]  # code and str offsets: code_filename, code_qualname, ..., ascii_size, ...
    # [start, end) of the evaluation loop (and its .cold part) in the process: its native frames, named or not
    evaluation_loops: tuple[tuple[int, int], ...] = ()


class ProcessMemory:
    """Reads another process's memory through /proc/PID/mem."""

    def __init__(self, pid: int, proc_root: str = "/proc") -> None:
        self._fd = os.open(f"{proc_root}/{pid}/mem", os.O_RDONLY)

    def read(self, address: int, size: int) -> bytes:
        """``size`` bytes at ``address``, or b"" where they cannot be read (unmapped, or an address past the 63 bits
        a file offset has: a torn pointer read from a process that is exec'ing or exiting)."""
        try:
            data = os.pread(self._fd, size, address)
        except (OSError, OverflowError):
            return b""
        return data if len(data) == size else b""

    def u64(self, address: int) -> int | None:
        data = self.read(address, 8)
        return struct.unpack("<Q", data)[0] if data else None

    def close(self) -> None:
        os.close(self._fd)


_EVALUATION_LOOPS = (EVALUATION_LOOP, EVALUATION_LOOP + ".cold")  # the .cold part: in .symtab only, when there
_INTERPRETER_SYMBOLS = ("_PyRuntime", "Py_Version", "PyCode_Type", *_EVALUATION_LOOPS)
_SYMBOLS_BY_FILE: dict[tuple[int, int, int, int, int], tuple[dict[str, tuple[int, int]], int]] = {}
_SYMBOLS_BY_FILE_MAX = 64  # interpreter and libpython files; a few hundred bytes each


def _interpreter_symbols(path: str) -> tuple[dict[str, int], int, tuple[tuple[int, int], ...]]:
    """:func:`elf_symbols` of the interpreter's symbols, and the file's [start, end) vaddrs of its evaluation loop,
    once per file: every new process of the same interpreter (a node starts many) maps the same file, and reading
    its symbol table took most of the time spent on a new process. Cached by the file's identity (each process
    names it through its own /proc/PID/root)."""
    st = os.stat(path)
    identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    found = _SYMBOLS_BY_FILE.pop(identity, None)
    if found is None:
        found = elf_symbol_ranges(path, _INTERPRETER_SYMBOLS)
    _SYMBOLS_BY_FILE[identity] = found  # most recently used last
    while len(_SYMBOLS_BY_FILE) > _SYMBOLS_BY_FILE_MAX:
        del _SYMBOLS_BY_FILE[next(iter(_SYMBOLS_BY_FILE))]
    ranges, base = found
    loops = tuple(ranges[name] for name in _EVALUATION_LOOPS if name in ranges and ranges[name][1] > ranges[name][0])
    return {name: start for name, (start, _end) in ranges.items()}, base, loops


def find_python(pid: int, proc_root: str = "/proc") -> PythonProcess | str | None:
    """The process's CPython, a description of an unsupported one ("CPython 3.9"), or None when it runs none."""
    entries = read_maps(pid, proc_root)  # paths of any bytes (kept as surrogates: the files still open)
    if entries is None:
        return None
    starts: dict[str, int] = {}
    for entry in entries:
        if entry.path.startswith("/") and entry.offset == 0 and not entry.deleted:
            starts.setdefault(entry.path, entry.start)
    candidates = sorted((path for path in starts if _LIBRARY.search(path)), key=lambda p: "libpython" not in p)
    for path in candidates:
        try:
            symbols, base, loops = _interpreter_symbols(f"{proc_root}/{pid}/root{path}")
        except (OSError, ValueError):  # gone, or a file named like libpython that is no ELF file: the next one
            continue
        if "PyCode_Type" not in symbols:
            continue
        match = _LIBRARY.search(path)
        version = (int(match.group(1)), int(match.group(2))) if match else (0, 0)
        if "_PyRuntime" not in symbols:  # CPython before 3.7 has no runtime state to start from: named, not walked
            return f"CPython {version[0]}.{version[1]}" if match else None
        bias = starts[path] - base
        try:
            memory = ProcessMemory(pid, proc_root)
        except OSError:
            return None
        try:
            if "Py_Version" in symbols:
                raw = memory.read(bias + symbols["Py_Version"], 4)
                if raw:
                    hexversion = struct.unpack("<I", raw)[0]
                    version = (hexversion >> 24, (hexversion >> 16) & 0xFF)
            described = _describe(pid, version, bias + symbols["_PyRuntime"], bias + symbols["PyCode_Type"], memory)
            if isinstance(described, str):
                return described
            return replace(described, evaluation_loops=tuple((bias + start, bias + end) for start, end in loops))
        finally:
            memory.close()
    return None


def _describe(pid: int, version: tuple[int, int], runtime: int, code_type: int,
              memory: ProcessMemory) -> PythonProcess | str:
    name = f"CPython {version[0]}.{version[1]}"
    if version >= (3, 13):
        layout = _debug_offsets(memory, runtime, version)
        if layout is None:
            return name
    else:
        table = load_layouts()
        if version not in table:
            return name
        layout = table[version]
    none = abi.PYTHON_NO_OFFSET
    walked = ("interp_threads_head", "tstate_next", "tstate_thread_id", "tstate_frame", "cframe_current",
              "frame_code", "frame_previous", "frame_instr", "frame_owner", "code_adaptive")
    if any(not 0 <= layout[field] < none for field in walked) or not _object_offsets_fit(layout):
        return name  # an offset the walker's 16-bit fields cannot hold, or past the objects it names: not this layout
    legacy = bool(layout.get("frame_objects"))
    proc = abi.PythonProc(
        interpreters_head=runtime + layout["runtime_interpreters_head"],
        version=(version[0] << 24) | (version[1] << 16),
        interp_threads_head=layout["interp_threads_head"], tstate_next=layout["tstate_next"],
        tstate_thread_id=layout["tstate_thread_id"], tstate_frame=layout["tstate_frame"],
        cframe_current=layout["cframe_current"] if layout["has_cframe"] else none,
        frame_code=layout["frame_code"], frame_previous=layout["frame_previous"], frame_instr=layout["frame_instr"],
        frame_owner=none if legacy else layout["frame_owner"], code_adaptive=layout["code_adaptive"],
        frame_is_entry=layout["frame_is_entry"] if layout["frame_is_entry"] >= 0 else none,
        instr_is_lasti=1 if legacy else 0,
        owner_cstack=layout["owner_cstack"] if layout["owner_cstack"] >= 0 else _OWNER_CSTACK_NONE)
    return PythonProcess(pid, version, proc, code_type, layout)


def _object_offsets_fit(layout: dict[str, int]) -> bool:
    """Whether the offsets :class:`CodeReader` reads code, bytes and str objects at are small and each field lies
    within the header it is read from. On 3.13 they come from the process's own memory (_Py_DebugOffsets), which a
    process can overwrite: an offset of terabytes would size a read, one past the header would not unpack."""
    read = ("code_filename", "code_qualname", "code_linetable", "code_firstlineno", "ascii_size", "compact_size")
    if any(not 0 <= layout[field] < _MAX_OBJECT_OFFSET for field in read):
        return False
    fields = {"bytes_size": 16, "bytes_data": 32, "str_length": 16, "str_state": 32}  # CodeReader's defaults
    if any(not 0 <= layout.get(field, default) < _MAX_OBJECT_OFFSET for field, default in fields.items()):
        return False
    return (layout.get("str_length", 16) + 8 <= layout["compact_size"]
            and layout.get("str_state", 32) + 4 <= layout["compact_size"])


def _debug_offsets(memory: ProcessMemory, runtime: int, version: tuple[int, int]) -> dict[str, int] | None:
    """The offsets 3.13 publishes in _Py_DebugOffsets (its 3.13 layout: 71 u64 words), None when absent or another
    layout of that struct (3.14 changed it) or a free-threaded build."""
    raw = memory.read(runtime, 71 * 8)
    if len(raw) != 71 * 8 or raw[:8] != _DEBUG_COOKIE:
        return None
    words = struct.unpack("<71Q", raw)
    published = ((words[1] >> 24) & 0xFF, (words[1] >> 16) & 0xFF)
    if published != (3, 13) or published != version or words[2]:
        return None
    return {
        "frame_objects": 0, "has_cframe": 0, "cframe_current": 0,
        "runtime_interpreters_head": words[5], "interp_threads_head": words[9], "tstate_next": words[21],
        "tstate_frame": words[23], "tstate_thread_id": words[24],
        "frame_previous": words[29], "frame_code": words[30], "frame_instr": words[31], "frame_owner": words[33],
        "frame_is_entry": -1,  # 3.12+ mark the frames that start an evaluation loop with a shim frame below them
        "owner_cstack": 3,  # FRAME_OWNED_BY_CSTACK, an enum value the struct does not publish
        "code_filename": words[35], "code_name": words[36], "code_qualname": words[37], "code_linetable": words[38],
        "code_firstlineno": words[39], "code_adaptive": words[43],
        "bytes_size": words[65], "bytes_data": words[66], "str_state": words[68], "str_length": words[69],
        "ascii_size": words[70], "compact_utf8_length": words[70], "compact_utf8": words[70] + 8,
        "compact_size": words[70] + 16,
    }


@dataclass(frozen=True, slots=True)
class _Code:
    name: str
    filename: str
    first_line: int
    linetable: bytes
    identity: tuple[int, ...]  # type, name, file and line table pointers, first line: differ when the address is reused


class CodeReader:
    """Names, files and lines of one process's code objects, read from its memory and cached within a bound.

    A cached code object is checked once per drain (:meth:`new_drain`) with one small read: a code object freed and
    another allocated at its address must not keep the old name. Once the process's memory can no longer be read (it
    exited), the cached code objects stand: they were read while it ran. So do they once an exec replaced the
    program (:attr:`replaced`): the memory is another program's then. Hold :attr:`lock` around every call: the
    sampler's event thread reads new stacks' code objects while a drain may be reading the same process's."""

    def __init__(self, process: PythonProcess, proc_root: str = "/proc", image: int | None = None) -> None:
        self.process = process
        self.image = image  # which program of the pid (the caller's id), None: not told
        self.replaced = False  # an exec replaced the program: its memory is never read again
        self._proc_root = proc_root
        self._cache: dict[int, _Code | None] = {}
        self._frames: dict[int, dict[int, Frame]] = {}  # code address -> instruction offset -> its frame
        self._lines: dict[tuple[int, int], Frame] = {}  # (code address, line) -> its frame
        self._checked: set[int] = set()  # code addresses checked since the last drain began
        # a stack's bytes in use -> its runs; emptied whenever a code object read before reads differently
        self._runs: dict[bytes, tuple[tuple[Frame, ...], ...]] = {}
        self.read_errors = 0
        self.lock = threading.Lock()

    def new_drain(self) -> None:
        self._checked.clear()

    def frames(self, stack: abi.PythonStack) -> tuple[Frame, ...]:
        """The stack's frames, innermost first; code objects that cannot be read are left out (and counted)."""
        return tuple(frame for run in self.runs(stack) for frame in run)

    def runs(self, stack: abi.PythonStack) -> tuple[tuple[Frame, ...], ...]:
        """The stack's frames, innermost first, in runs: the frames one native call of the evaluation loop runs
        (each run ends with a frame the walker marked as an entry). A run whose code objects cannot be read is
        empty, never left out, so the runs still pair with the native evaluation-loop frames."""
        depth = min(stack.depth, abi.MAX_PYTHON_DEPTH)
        checked = self._checked
        unchecked = [address for address in stack.code[:depth] if address not in checked]
        if unchecked:
            self._refresh(unchecked)
        raw = bytes(stack)  # the key: depth, flags, marks, then the code addresses and offsets in use
        key = raw[:_STACK_CODE + 8 * depth] + raw[_STACK_OFFSET:_STACK_OFFSET + 4 * depth]
        cached = self._runs.get(key)
        if cached is not None:
            return cached
        runs: list[tuple[Frame, ...]] = []
        run: list[Frame] = []
        entries = sum(word << 64 * n for n, word in enumerate(stack.entries))
        for i in range(depth):
            frame = self._frame(stack.code[i], stack.offset[i])
            if frame is not None:
                run.append(frame)
            if entries >> i & 1:
                runs.append(tuple(run))
                run = []
        if stack.flags & abi.PYTHON_TRUNCATED:  # the walker stopped at its bound: the root says so
            run.append(TRUNCATED_FRAME)
        if run:  # the outermost frames were cut (or the walk found no entry mark)
            runs.append(tuple(run))
        if len(self._runs) >= _RUNS_CACHE_ENTRIES:
            self._runs.clear()
        out = self._runs[key] = tuple(runs)
        return out

    def prepare(self, stacks: Iterable[abi.PythonStack]) -> None:
        """Checks every code object of ``stacks`` not checked in this drain yet, with one open of the memory file
        (rather than one per stack)."""
        checked = self._checked
        unchecked = {address for stack in stacks for address in stack.code[:min(stack.depth, abi.MAX_PYTHON_DEPTH)]
                     if address not in checked}
        if unchecked:
            self._refresh(list(unchecked))

    def _frame(self, address: int, offset: int) -> Frame | None:
        by_offset = self._frames.get(address)
        frame = by_offset.get(offset) if by_offset is not None else None
        if frame is None:
            code = self._cache.get(address)
            if code is None:
                return None
            frame = Frame(code.name, FrameKind.PYTHON, filename=code.filename, line=self._line(code, offset))
            # one object per (code, line), not per instruction: encoders deduplicate frames by identity first
            frame = self._lines.setdefault((address, frame.line), frame)
            self._frames.setdefault(address, {})[offset] = frame
        return frame

    def _refresh(self, addresses: list[int]) -> None:
        if len(self._cache) + len(addresses) > _CODE_CACHE_ENTRIES:
            self._cache.clear()
            self._frames.clear()
            self._lines.clear()
            self._runs.clear()
        try:
            if self.replaced:
                raise OSError("replaced by exec")
            memory = ProcessMemory(self.process.pid, self._proc_root)
        except OSError:  # gone (or another program now): what was read while it ran stands
            self._checked.update(addresses)
            self.read_errors += sum(1 for address in set(addresses) if self._cache.get(address) is None)
            return
        try:
            for address in dict.fromkeys(addresses):
                self._checked.add(address)
                cached = self._cache.get(address)
                if cached is not None and cached.identity == (self._identity(memory, address) or cached.identity):
                    continue  # the same code object, or memory that reads empty (an exited process not yet reaped)
                for frame in self._frames.pop(address, {}).values():
                    self._lines.pop((address, frame.line), None)
                code = self._read_code(memory, address)
                if code is None:
                    self.read_errors += 1
                if address in self._cache and code != cached:  # runs built with the old one are wrong now
                    self._runs.clear()
                self._cache[address] = code
        finally:
            memory.close()

    def _identity(self, memory: ProcessMemory, address: int) -> tuple[int, ...]:
        layout = self.process.layout
        header = memory.read(address, max(layout["code_linetable"], layout["code_qualname"],
                                          layout["code_filename"], layout["code_firstlineno"]) + 8)
        if not header:
            return ()
        pointer = struct.Struct("<Q")
        return (pointer.unpack_from(header, 8)[0], pointer.unpack_from(header, layout["code_qualname"])[0],
                pointer.unpack_from(header, layout["code_filename"])[0],
                pointer.unpack_from(header, layout["code_linetable"])[0],
                struct.unpack_from("<i", header, layout["code_firstlineno"])[0])

    def _read_code(self, memory: ProcessMemory, address: int) -> _Code | None:
        layout = self.process.layout
        identity = self._identity(memory, address)
        if not identity or identity[0] != self.process.code_type:  # ob_type
            return None
        _type, qualname, filename, table, first_line = identity
        name, file = self._str(memory, qualname), self._str(memory, filename)
        size = memory.u64(table + layout.get("bytes_size", 16)) or 0
        linetable = memory.read(table + layout.get("bytes_data", 32), min(size, _LINETABLE_BYTES)) if size else b""
        if name is None or file is None:
            return None
        return _Code(name, file, first_line, linetable, identity)

    def _str(self, memory: ProcessMemory, address: int) -> str | None:
        """A compact str's text (every str the compiler makes is compact)."""
        layout = self.process.layout
        header = memory.read(address, layout["compact_size"])
        if not header:
            return None
        length = struct.unpack_from("<q", header, layout.get("str_length", 16))[0]
        state = struct.unpack_from("<I", header, layout.get("str_state", 32))[0]
        kind, compact, ascii_ = (state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1
        if not compact or kind not in (1, 2, 4) or not 0 <= length <= _NAME_BYTES:
            return None
        if ascii_:
            data = memory.read(address + layout["ascii_size"], length)
            return data.decode("ascii", errors="replace") if data or not length else None
        data = memory.read(address + layout["compact_size"], length * kind)
        if len(data) != length * kind:
            return None
        return data.decode({1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind], errors="replace")

    def _line(self, code: _Code, offset: int) -> int:
        if self.process.version < (3, 11):
            return _line_310(code.linetable, code.first_line, offset)
        return _line_311(code.linetable, code.first_line, offset)


def _line_310(table: bytes, line: int, offset: int) -> int:
    """PEP 626's 3.10 table: (bytecode bytes, line delta) pairs, -128 = no line."""
    start = 0
    for i in range(0, len(table) - 1, 2):
        end = start + table[i]
        delta = table[i + 1] - 256 if table[i + 1] >= 128 else table[i + 1]
        if delta != -128:
            line += delta
        if start <= offset < end:
            return line if delta != -128 else 0
        start = end
    return line


def _line_311(table: bytes, line: int, offset: int) -> int:
    """The 3.11+ location table (Objects/locations.md), as PyCode_Addr2Line reads it."""
    position, start, end = 0, 0, len(table)

    def varint() -> int:
        nonlocal position
        value, shift = 0, 0
        while position < end:
            byte = table[position]
            position += 1
            if shift < 36:  # CPython writes 32-bit values (6 bytes); bits past that are a corrupt table's
                value |= (byte & 63) << shift
            shift += 6
            if not byte & 64:
                break
        return value

    while position < end:
        first = table[position]
        position += 1
        kind = (first >> 3) & 15
        length = ((first & 7) + 1) * 2
        delta, has_line = 0, True
        if kind == 15:
            has_line = False
        elif kind in (13, 14):
            raw = varint()
            delta = -(raw >> 1) if raw & 1 else raw >> 1
        elif kind >= 10:
            delta = kind - 10
        while position < end and not table[position] & 128:
            position += 1  # the rest of the entry (columns)
        line += delta
        if offset < start + length:
            return line if has_line and 0 <= line <= _MAX_LINE else 0  # a line no encoder's int64 would refuse
        start += length
    return 0


def merge(native: tuple[Frame, ...], runs: Sequence[tuple[Frame, ...]],
          evaluation_loops: Sequence[tuple[int, int]] = ()) -> tuple[Frame, ...]:
    """User frames leaf first, each run of Python frames (innermost first, :meth:`CodeReader.runs`) in place of
    the evaluation-loop frame that runs it, counted from the leaf: Python -> C extension -> Python callback reads
    as such. The native frames the innermost Python frame called (C extensions, libraries, the interpreter's own C
    functions) stay; between two runs, the frames of C extensions and libraries stay and the interpreter's own
    calling glue (3.10 runs one loop per Python frame) and addresses in no file go; beyond the outermost run, the
    frames that started the interpreter or the thread go. A native stack with fewer loops than runs (cut short) gets
    the other runs after its frames; one with more (the Python stack was cut) ends with the last run.

    An evaluation-loop frame is one whose address lies in ``evaluation_loops`` (the process's [start, end) of the
    loop, :attr:`PythonProcess.evaluation_loops`), named or not: frames left as file+offset (no time to read
    libpython's symbols) must not put the Python frames under the thread's start; or one named after the loop."""
    if not any(runs):
        return native
    out: list[Frame] = []
    used = 0
    for depth, frame in enumerate(native):
        if frame.function.startswith(EVALUATION_LOOP) or (not frame.system_name and evaluation_loops and any(
                start <= (frame.address - 1 if depth else frame.address) < end  # a return address is past its call
                for start, end in evaluation_loops)):  # a named frame's name decides: the hot path, kept short
            if used == len(runs):
                break
            out.extend(runs[used])
            used += 1
            if used == len(runs):
                break
        elif used == 0 or _is_library(frame):
            out.append(frame)
    for run in runs[used:]:
        out.extend(run)
    return tuple(out)


def _is_library(frame: Frame) -> bool:
    """A frame of a mapped file other than the interpreter's own (the python executable or libpython). A return
    address in no mapped file between two evaluation loops is what a native unwind that went astray leaves."""
    return frame.mapping is not None and not _LIBRARY.search(frame.mapping.path)


# The outermost frame of a Python stack deeper than the walker reads: the stack's own root is not there, so a flame
# graph shows every cut stack under this one root rather than under its innermost frames as if they were roots.
TRUNCATED_FRAME = Frame(f"[truncated: Python frames past the innermost {abi.MAX_PYTHON_DEPTH} not read]",
                        FrameKind.PYTHON)


def unsupported_frame(description: str) -> Frame:
    """The one frame an unsupported interpreter gets, naming it."""
    return Frame(f"[{description}: Python frames not supported]", FrameKind.PYTHON)


class PythonFrames:
    """Per process: its CPython (registered with the sampler's walker) or the unsupported version it runs. A caller
    that tells the programs one pid runs apart passes each one's ``image``: the code objects of a Python an exec
    replaced stay readable from the cache, for the samples it took before the exec, until :meth:`forget_image`."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self._proc_root = proc_root
        self._readers: dict[int, CodeReader] = {}
        self._unsupported: dict[int, str] = {}
        self._images: dict[int, int | None] = {}  # pid -> the image its last look was of
        self._replaced: dict[tuple[int, int], CodeReader] = {}  # (pid, image): Pythons an exec replaced

    def discover(self, pid: int, image: int | None = None) -> PythonProcess | None:
        """Looks at a process (again: what an earlier look found is dropped, or kept aside when it was of another
        ``image``); returns what the walker must be given (None: nothing to walk)."""
        old, before = self._readers.pop(pid, None), self._images.get(pid)
        if old is not None and before is not None and before != image:
            old.replaced = True
            self._replaced[(pid, before)] = old
        self._images[pid] = image
        self._unsupported.pop(pid, None)
        try:
            found = find_python(pid, self._proc_root)
        except (OSError, ValueError, struct.error) as exc:  # a file that changed under us: native frames only
            _logger.debug("pid %d: reading its Python failed: %s", pid, exc)
            return None
        if isinstance(found, str):
            self._unsupported[pid] = found
            selfmetrics.count(semconv.SELF_ERRORS.name, otel_gpu__source=semconv.Source.CPU_PROFILER,
                              otel_gpu__reason=semconv.Reason.PYTHON_UNSUPPORTED)
            return None
        if found is not None:
            self._readers[pid] = CodeReader(found, self._proc_root, image)
        return found

    def new_drain(self) -> None:
        """Cached code objects get checked again (once) from now on."""
        for reader in list(self._readers.values()):
            with reader.lock:
                reader.new_drain()

    def read_new_stacks(self, pid: int, stacks: Iterable[abi.PythonStack]) -> None:
        """Reads the code objects of stacks the walker just stored for the first time (those not checked since the
        drain began), so that the drain finds them cached even when the process has exited by then. Read errors are
        left for the drain, which tries again and counts them."""
        reader = self._readers.get(pid)
        if reader is None:
            return
        with reader.lock:
            errors = reader.read_errors
            reader.prepare(stacks)
            reader.read_errors = errors

    def merged(self, pid: int, native: tuple[Frame, ...], stack: abi.PythonStack | None) -> tuple[Frame, ...]:
        """The user frames of one sample, leaf first, with its Python frames merged in."""
        runs = self.runs_of(pid, {0: stack}).get(0) if stack is not None else None
        return self.merged_runs(pid, native, runs)

    def _current(self, pid: int, image: int | None) -> bool:
        """Whether ``image`` is what the last look at ``pid`` found (one not told its image: unless it was replaced)."""
        looked = self._images.get(pid)
        return image is None or looked == image or (looked is None and (pid, image) not in self._replaced)

    def _reader(self, pid: int, image: int | None) -> CodeReader | None:
        return self._readers.get(pid) if self._current(pid, image) else self._replaced.get((pid, image or 0))

    def runs_of(self, pid: int, stacks: dict[int, abi.PythonStack],
                image: int | None = None) -> dict[int, tuple[tuple[Frame, ...], ...]]:
        """Each Python stack's frames in runs (:meth:`CodeReader.runs`), by stack id: once per drain and stack, however
        many threads and native stacks share it. ``image``: of that program of the pid (none when it was not
        looked at: another program's memory must not name its frames)."""
        reader = self._reader(pid, image)
        if reader is None or not stacks:
            return {}
        with reader.lock:
            before = reader.read_errors
            reader.prepare(stacks.values())
            runs = {stack_id: reader.runs(stack) for stack_id, stack in stacks.items()}
        if reader.read_errors > before:
            selfmetrics.count(semconv.SELF_ERRORS.name, reader.read_errors - before,
                              otel_gpu__source=semconv.Source.CPU_PROFILER,
                              otel_gpu__reason=semconv.Reason.PYTHON_CODE_UNREADABLE)
        return runs

    def merged_runs(self, pid: int, native: tuple[Frame, ...], runs: Sequence[tuple[Frame, ...]] | None,
                    image: int | None = None) -> tuple[Frame, ...]:
        """The user frames of one sample, leaf first, with its Python runs (:meth:`runs_of`) merged in."""
        if pid in self._unsupported and self._current(pid, image):
            return native + (unsupported_frame(self._unsupported[pid]),)
        if runs is None:
            return native
        reader = self._reader(pid, image)
        return merge(native, runs, reader.process.evaluation_loops if reader is not None else ())

    def runs_python(self, pid: int) -> bool:
        """Whether the last look at ``pid`` found a CPython, supported or not."""
        return pid in self._readers or pid in self._unsupported

    def forget_image(self, pid: int, image: int) -> None:
        """Drop the code objects of a Python an exec replaced (its samples are all drained)."""
        self._replaced.pop((pid, image), None)

    def forget(self, pids: Sequence[int]) -> None:
        for pid in pids:
            self._readers.pop(pid, None)
            self._unsupported.pop(pid, None)
            self._images.pop(pid, None)
        for key in [key for key in self._replaced if key[0] in set(pids)]:
            del self._replaced[key]

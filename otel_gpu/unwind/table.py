# SPDX-License-Identifier: Apache-2.0
"""Compact unwind tables per executable file, built from ``.eh_frame`` (else ``.debug_frame``), cached per file
identity and bounded in bytes.

A table is two sorted arrays: ``pcs`` (link-time addresses, 8 bytes) and ``rules`` (4 bytes each), one entry per
pc where the rule changes, and a NONE entry where no FDE covers the code (a gap, the end of the last FDE). One rule
says how to step from a frame to its caller, which is all a stack walker needs on x86-64:

    CFA = (rsp | rbp) + cfa_offset;  return address = [CFA - 8];  rbp = [CFA + rbp_offset] or unchanged

Rows that need something else (a CFA expression such as the PLT's, a CFA in another register, a return address
elsewhere than CFA-8, offsets wider than a packed rule holds) become UNSUPPORTED, so the walker can count why it
stopped; the outermost frame (return address undefined, e.g. ``_start``) becomes END.
"""

from __future__ import annotations

import bisect
import os
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

from otel_gpu.ebpf import abi
from otel_gpu.symbolize.elf import _EHDR, Segment, _program_headers, _section_headers
from otel_gpu.unwind import native_table

# Rule kinds (the low byte of a packed rule), shared with native_unwind.h
KIND_NONE = 0  # no FDE covers the pc: fall back to frame pointers
KIND_RSP = 1  # CFA = rsp + cfa_offset
KIND_RBP = 2  # CFA = rbp + cfa_offset
KIND_END = 3  # the outermost frame: stop
KIND_UNSUPPORTED = 4  # CFA expression, CFA in another register, return address not at CFA-8, offsets too wide

# A packed rule (struct otel_gpu_unwind_row's 32-bit rule), from the low bits up: kind, rbp_offset, cfa_offset, both
# signed. A rule whose offsets are outside these ranges is UNSUPPORTED (none of this machine's libraries has one:
# docs/benchmarks.md, "8-byte unwind rows").
CFA_OFFSETS = range(-(1 << (abi.UNWIND_CFA_BITS - 1)), 1 << (abi.UNWIND_CFA_BITS - 1))
RBP_OFFSETS = range(-(1 << (abi.UNWIND_RBP_BITS - 1)), 1 << (abi.UNWIND_RBP_BITS - 1))
_RBP_SHIFT = abi.UNWIND_KIND_BITS
_CFA_SHIFT = abi.UNWIND_KIND_BITS + abi.UNWIND_RBP_BITS

_MAX_SECTION_BYTES = 256 << 20  # .eh_frame read per file at most (libtorch_cpu.so's is 17 MiB)
_CACHE_BYTES = 64 << 20  # tables kept in all
# Files whose frame section is larger get a table without rows and are walked by frame pointer. Tables are built only
# for files that samples hit (unwind/processes.py), by the native builder (native/cfi_table.c): about 0.12 CPU-s
# per million rows (~190 rows per KiB of .eh_frame), and besides the rows themselves, which go straight into
# unwind_rows, the section's bytes and 48 bytes per FDE while it builds (docs/benchmarks.md, "Native unwind-table
# builder"). CPU no longer bounds the cap (it did at 1 MiB with the Python builder, ~0.3 CPU-s per 100,000 rows);
# the rows do: at 8 MiB a table is ~1.5 M rows, ~0.2 CPU-s once per file and ~15 MiB while built, and leaves a
# quarter of the sampler's DEFAULT_UNWIND_ROWS (2 Mi, mapped whole into the agent) to libpython, libc and the rest.
# That covers LLVM, clang, rustc's and CUDA's libraries of 1-6 MiB; libtorch_cpu.so (17 MiB, 2.56 M rows) needs more
# rows than the default holds, so it stays on frame pointers: fitting it beside the rest takes ~4 Mi rows, 32 MiB at 8
# bytes a row, the whole saving of the 8-byte rows (docs/benchmarks.md, "8-byte unwind rows").
MAX_FRAME_BYTES = 8 << 20


@dataclass(frozen=True, slots=True)
class UnwindTable:
    """Sorted ``pcs`` (link-time) and their packed ``rules`` (:func:`pack_rule`).

    ``rbp_offset`` 0 means rbp is unchanged (a saved rbp is never at CFA+0)."""

    pcs: array[int]
    rules: array[int]
    source: str  # ".eh_frame", ".debug_frame" or "" (no frame information)
    segments: tuple[Segment, ...] = ()  # the file's PT_LOAD segments (to find a mapping's load bias)
    too_large: bool = False  # the frame section is over the cache's max_frame_bytes: no rows, frame pointers only

    @property
    def size_bytes(self) -> int:
        return self.pcs.itemsize * len(self.pcs) + self.rules.itemsize * len(self.rules)

    def bias(self, start: int, file_offset: int) -> int | None:
        """Load bias of a mapping at ``start`` of the file from ``file_offset``: address - bias = link-time address."""
        for segment in self.segments:
            if segment.offset <= file_offset < segment.offset + max(segment.file_size, 1):
                return (start - (segment.vaddr + file_offset - segment.offset)) & 0xFFFFFFFFFFFFFFFF
        return None

    def row_bytes(self) -> bytes:
        """The rows as struct otel_gpu_unwind_row[]: each pc as its offset from the first, then the packed rule."""
        base = self.pcs[0] if self.pcs else 0
        rows = array("I", bytes(8 * len(self.pcs)))
        rows[0::2] = array("I", (pc - base for pc in self.pcs))
        rows[1::2] = self.rules
        return rows.tobytes()

    def lookup(self, pc: int) -> tuple[int, int, int]:
        """(kind, cfa_offset, rbp_offset) for the link-time ``pc``."""
        index = bisect.bisect_right(self.pcs, pc) - 1
        if index < 0:
            return KIND_NONE, 0, 0
        return unpack_rule(self.rules[index])


def pack_rule(kind: int, cfa_offset: int, rbp_offset: int) -> int:
    """The 32-bit rule; the offsets must be within CFA_OFFSETS and RBP_OFFSETS (rule_of makes the rest UNSUPPORTED)."""
    return ((kind & ((1 << abi.UNWIND_KIND_BITS) - 1)) | ((rbp_offset & ((1 << abi.UNWIND_RBP_BITS) - 1)) << _RBP_SHIFT)
            | ((cfa_offset & ((1 << abi.UNWIND_CFA_BITS) - 1)) << _CFA_SHIFT))


def unpack_rule(rule: int) -> tuple[int, int, int]:
    """(kind, cfa_offset, rbp_offset) of a packed rule."""
    kind = rule & ((1 << abi.UNWIND_KIND_BITS) - 1)
    rbp = (rule >> _RBP_SHIFT) & ((1 << abi.UNWIND_RBP_BITS) - 1)
    cfa = rule >> _CFA_SHIFT
    return (kind, cfa - (1 << abi.UNWIND_CFA_BITS) if cfa >= 1 << (abi.UNWIND_CFA_BITS - 1) else cfa,
            rbp - (1 << abi.UNWIND_RBP_BITS) if rbp >= 1 << (abi.UNWIND_RBP_BITS - 1) else rbp)


_PT_LOAD = 1
_Read = Callable[[int, int], bytes]


def _file_reader(file: BinaryIO) -> _Read:
    def read(offset: int, size: int) -> bytes:
        file.seek(offset)
        return file.read(size)
    return read


def _image_reader(image: bytes) -> _Read:
    return lambda offset, size: image[offset:offset + size]


def _frame_sections(read: _Read, name: str) -> tuple[tuple[str, int, bytes] | None, tuple[Segment, ...]]:
    found, segments = _find_frame_section(read, name)
    if found is None:
        return None, segments
    section, addr, offset, size = found
    return (section, addr, read(offset, _checked_size(name, section, size))), segments


def _checked_size(name: str, section: str, size: int) -> int:
    if size > _MAX_SECTION_BYTES:
        raise ValueError(f"{name}: {section} is {size} bytes, over {_MAX_SECTION_BYTES}")
    return size


def _find_frame_section(read: _Read, name: str) -> tuple[tuple[str, int, int, int] | None, tuple[Segment, ...]]:
    """(section name, link-time address, file offset, size) of .eh_frame, else .debug_frame, and the PT_LOAD
    segments; the section itself is not read."""
    header = read(0, _EHDR.size)
    if len(header) < _EHDR.size or header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
        raise ValueError(f"{name}: not a 64-bit little-endian ELF file")
    fields = _EHDR.unpack(header)
    phoff, shoff, phentsize, phnum = fields[5], fields[6], fields[9], fields[10]
    shentsize, shnum, shstrndx = fields[11], fields[12], fields[13]
    segments = tuple(Segment(offset, vaddr, file_size)
                     for kind, offset, vaddr, file_size in _program_headers(read, phoff, phentsize, phnum)
                     if kind == _PT_LOAD)
    headers = _section_headers(read, shoff, shentsize, shnum)  # entry sizes and counts bounded there
    if shstrndx >= len(headers):
        return None, segments
    names = read(headers[shstrndx][4], min(headers[shstrndx][5], 1 << 20))
    found: dict[str, tuple[int, int, int]] = {}
    for name_offset, kind, _flags, addr, offset, size, *_ in headers:
        end = names.find(b"\0", name_offset)
        section = names[name_offset:end].decode("ascii", "replace") if end >= 0 else ""
        if section in (".eh_frame", ".debug_frame") and kind != 8:  # SHT_NOBITS: stripped into a debug file
            found[section] = (addr, offset, size)
    for section in (".eh_frame", ".debug_frame"):
        if section in found:
            addr, offset, size = found[section]
            return (section, addr, offset, size), segments
    return None, segments


def frame_sections(path: str) -> tuple[str, int, bytes] | None:
    """(section name, link-time address, bytes) of the file's .eh_frame, else .debug_frame; None if neither."""
    with open(path, "rb") as file:
        return _frame_sections(_file_reader(file), path)[0]


def frame_section_size(path: str) -> int:
    """Bytes of the file's .eh_frame, else .debug_frame (0 if neither); reads only the ELF headers."""
    with open(path, "rb") as file:
        found, _ = _find_frame_section(_file_reader(file), path)
    return found[3] if found is not None else 0


def build_table(path: str, image: bytes | None = None, max_frame_bytes: int = _MAX_SECTION_BYTES) -> UnwindTable:
    """The unwind table of the ELF file at ``path`` (or of the in-memory ``image``, e.g. the vDSO, which ``path``
    then only names); without rows (``too_large``) when its frame section is over ``max_frame_bytes``. Raises what
    :func:`parse_table` raises."""
    table, rows = parse_table(path, image, max_frame_bytes)
    if rows is None:
        return table
    with rows:
        pcs, rules = rows.arrays()
    return UnwindTable(pcs, rules, table.source, table.segments)


def parse_table(path: str, image: bytes | None = None,
                max_frame_bytes: int = _MAX_SECTION_BYTES) -> tuple[UnwindTable, native_table.ParsedRows | None]:
    """The file's table without its rows (source, segments, too_large), and its rows as the native builder holds
    them (None without frame information or over ``max_frame_bytes``), for the caller to write where they go.
    Raises OSError or ValueError for unreadable files, ``native_table.NativeBuilderMissing`` (an OSError) without
    the builder, MemoryError when it runs out of memory."""
    if image is not None:
        return _parse(_image_reader(image), path, max_frame_bytes)
    with open(path, "rb") as file:
        return _parse(_file_reader(file), path, max_frame_bytes)


def _parse(read: _Read, name: str,
           max_frame_bytes: int) -> tuple[UnwindTable, native_table.ParsedRows | None]:
    found, segments = _find_frame_section(read, name)
    if found is None:
        return UnwindTable(array("Q"), array("I"), "", segments), None
    section, addr, offset, size = found
    if _checked_size(name, section, size) > max_frame_bytes:
        return UnwindTable(array("Q"), array("I"), section, segments, too_large=True), None
    rows = native_table.parse(read(offset, size), addr, section == ".eh_frame")
    return UnwindTable(array("Q"), array("I"), section, segments), rows


def file_key(path: str, image: bytes | None = None) -> tuple[int, ...]:
    """A file's identity (device, inode, size, mtime), or an in-memory image's (its hash and size)."""
    if image is not None:
        return (-1, hash(image), len(image), 0)
    found = os.stat(path)
    return (found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns)


class TableCache:
    """Tables by file identity (device, inode, size, mtime), least recently used dropped past ``max_bytes``."""

    def __init__(self, max_bytes: int = _CACHE_BYTES, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        """``max_frame_bytes``: files with a larger frame section get a table without rows (see MAX_FRAME_BYTES)."""
        self.max_bytes = max_bytes
        self.max_frame_bytes = max_frame_bytes
        self.size_bytes = 0
        self.builds = 0
        self._tables: OrderedDict[tuple[int, ...], UnwindTable] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, path: str, image: bytes | None = None) -> UnwindTable:
        """The table of the file at ``path``, or of ``image`` (cached by its hash: the vDSO is one per kernel)."""
        key = file_key(path, image)
        with self._lock:
            table = self._tables.get(key)
            if table is not None:
                self._tables.move_to_end(key)
                return table
        table = build_table(path, image, self.max_frame_bytes)
        with self._lock:
            self.builds += 1
            if key not in self._tables:
                self._tables[key] = table
                self.size_bytes += table.size_bytes
            while self.size_bytes > self.max_bytes and len(self._tables) > 1:
                _, dropped = self._tables.popitem(last=False)
                self.size_bytes -= dropped.size_bytes
        return table


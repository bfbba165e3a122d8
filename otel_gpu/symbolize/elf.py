# SPDX-License-Identifier: Apache-2.0
"""A small, memory-bounded reader of 64-bit little-endian ELF files: function symbols (.symtab and .dynsym), the GNU
build id and the PT_LOAD segments that translate a file offset into a link-time virtual address (which is how PIE
and shared-library load bias is removed).

Huge binaries (libtorch_cpu.so: 530,000 symbols and 76 MB of mostly C++ names) cost little: headers, notes and
symbol tables are read with ``pread`` in chunks of at most :data:`_CHUNK_BYTES` (nothing is mapped, so no file page
stays resident), only function start addresses, sizes and the file offsets of their names are kept (about 12 bytes
per function), and a name is read from the file only when an address resolves to it, then kept in a small LRU.
The file stays open (one descriptor per :class:`ElfSymbols`) so names remain readable after the file is deleted or
its process exits; the descriptor is closed when the object is garbage or :meth:`ElfSymbols.close` is called.
Symbol tables are read by libotel_gpu_symtab.so (:mod:`native_symtab`) when it loads; the Python reader here is the
fallback and the reference the tests compare it with. What no symbol covers is read only when looked up: PLT stubs are
named ``name@plt`` (:mod:`plt`), and :meth:`ElfSymbols.function_start` finds the start of an unnamed function in
``.eh_frame_hdr`` (:mod:`function_starts`); a function of unknown size ends at the end of its section.

Where several symbols name one address, the function is named the way users know it: the best binding (global, then
weak, then local: glibc's ``__libc_start_main`` over its local ``__libc_start_main_alias_2``), then among local
symbols a name without a suffix the compiler or linker made (:func:`_is_made`: ``parse`` over ``parse.isra.0``), then
the first read (.symtab before .dynsym, file order). Only local names are read to choose: compilers make their clones
local and the linker makes hidden symbols local, so two global or weak names at one address are both names the
program exported (C1/C2 constructors, folded functions), and reading them would cost a name read per alias of every
large stripped library (docs/benchmarks.md, "s18-alias"). A symbol version that .symtab writes into a name
(``__libc_start_main@@GLIBC_2.34``) is dropped, as .dynsym's names carry none.
"""

from __future__ import annotations

import bisect
import functools
import heapq
import os
import re
import stat
import struct
import weakref
from array import array
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from operator import itemgetter

from otel_gpu.symbolize import native_symtab
from otel_gpu.symbolize.function_starts import FunctionStarts
from otel_gpu.symbolize.plt import CACHE_BYTES as _PLT_CACHE_BYTES
from otel_gpu.symbolize.plt import PLT_SECTIONS, PltStubs

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_PHDR = struct.Struct("<IIQQQQQQ")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")
_NOTE = struct.Struct("<III")
_PT_LOAD = 1
_PT_NOTE = 4
_PT_GNU_EH_FRAME = 0x6474E550
_SHT_SYMTAB = 2
_SHT_NOTE = 7
_SHT_DYNSYM = 11
_STT_FUNC = 2
_STT_GNU_IFUNC = 10
_LOCAL_RANK = 2  # any binding but global and weak (STB_LOCAL): the last, and the only one whose names are compared
_BINDING_RANK = {1: 0, 2: 1}  # STB_GLOBAL, STB_WEAK
# A name the compiler or linker made from another (symtab.c's made_name): one of GCC's and LLVM's clone suffixes
# (foo.cold, foo.part.0, foo.isra.0, foo.constprop.0, foo.lto_priv.0, foo.localalias, foo.llvm.123, foo.__uniq.123)
# as a whole '.'-separated part, not after ".." (which separates a path in Rust's names: core..cold..f), or glibc's
# local aliases (__libc_start_main_alias_2)
_MADE_NAME = re.compile(rb"(?<!\.)\.(?:cold|part|isra|constprop|lto_priv|localalias|llvm|__uniq)(?:\.|\Z)"
                        rb"|_alias_[0-9]+\Z")
_SHF_EXECINSTR = 0x4
_NT_GNU_BUILD_ID = 3
_CHUNK_BYTES = 16384 * _SYM.size  # symbols read (and sorted) per pread: 384 KiB
_MAX_NOTES_BYTES = 1 << 16  # build-id notes sit in the first notes of a file; never read more than this in all
_MAX_BUILD_ID_BYTES = 64  # 20 (SHA-1) or 16 (MD5, UUID) in practice; a longer "build id" is a corrupt note
_MAX_TABLE_BYTES = 128 << 20  # symbol tables read per file: 5.6 M entries (libtorch_cpu.so has 1 M, 25 MB)
_MAX_NAME_BYTES = 1 << 20  # a longer "name" is a corrupt string table
_MAX_DYNSTR_BYTES = 16 << 20  # dynamic string table read to find one data symbol (libtorch_cpu.so's: ~10 MB)
_NAME_CACHE_ENTRIES = 1024  # resolved names kept per file
_NAME_CACHE_BYTES = 256 * 1024  # what the name cache is counted as in size_bytes (C++ names average ~200 bytes)
_MAX_ENTRY_BYTES = 256  # a program or section header entry larger than this is a corrupt header (they are 56 / 64)
# sizes are clamped to 30 bits (no function is 1 GiB long): the native reader keeps the binding's rank in the other 2
_MAX_SIZE = (1 << 30) - 1
_MAX_SECTION_NAMES_BYTES = 1 << 16  # section names read (a few hundred bytes in practice)
_get_first = itemgetter(0)
_Read = Callable[[int, int], bytes]  # (offset, size) -> at most size bytes


class ElfError(ValueError):
    """Not an ELF file this reader understands (or a truncated one)."""


@dataclass(frozen=True, slots=True)
class Segment:
    """One PT_LOAD segment: file range [offset, offset + file_size) is loaded at link-time address vaddr."""

    offset: int
    vaddr: int
    file_size: int


class _Source:
    """Random-access reads from an open file (``pread``) or an in-memory image; owns the file descriptor."""

    def __init__(self, path: str, image: bytes | None) -> None:
        self.path = path
        self.image = image
        self._fd = -1
        if image is not None:
            self.size = len(image)
            self._closer = None
            return
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # a FIFO in its place: never wait
        self._closer = weakref.finalize(self, os.close, self._fd)
        try:
            found = os.fstat(self._fd)
        except OSError:
            self.close()
            raise
        if not stat.S_ISREG(found.st_mode):
            self.close()
            raise ElfError(f"{path}: not a regular file")
        self.size = found.st_size

    def read(self, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes at ``offset`` (fewer at the end of the file); raises OSError.

        Offsets and sizes come from the file itself, which any process on the node may have written: both are clamped
        to the file's size (an offset near 2**64 would overflow ``pread``, a size of gigabytes would be allocated)."""
        if offset < 0 or size <= 0 or offset >= self.size:
            return b""
        size = min(size, self.size - offset)
        if self.image is not None:
            return self.image[offset:offset + size]
        if self._fd < 0:
            raise OSError(f"{self.path}: closed")
        return os.pread(self._fd, size, offset)

    @property
    def fd(self) -> int:
        """The open file's descriptor (-1 once closed or for an image)."""
        return self._fd

    def close(self) -> None:
        if self._closer is not None:
            self._fd = -1  # never read a descriptor number that the process may reuse
            self._closer()


class ElfSymbols:
    """Function symbols of one ELF file, sorted by address, with its build id and load segments.

    Holds per function its start address (4 bytes, 8 when a function starts past 4 GiB), size (4 bytes) and the file
    offset of its name (4 bytes, 8 for files over 4 GiB); names are read from the file when looked up and the last
    :data:`_NAME_CACHE_ENTRIES` kept."""

    def __init__(self, path: str, image: bytes | None = None, *, native: bool = True) -> None:
        """Read the ELF file at ``path``, or the in-memory ``image`` (then ``path`` only names it). Symbol tables are
        read by libotel_gpu_symtab.so when ``native`` and it loads, else in Python (the reference the tests compare
        the library with)."""
        self.path = path
        self._native = native
        self.build_id = ""
        self.has_symtab = False  # False: only exported (.dynsym) names; a separate debug file may have the rest
        self.segments: list[Segment] = []
        self._source = _Source(path, image)
        self._starts = array("Q")
        self._sizes = array("I")  # 0: unknown, the function runs up to the next one
        self._name_at = array("I" if self._source.size < 1 << 32 else "Q")  # file offset of the NUL-ended name
        self._names: OrderedDict[int, str] = OrderedDict()  # symbol index -> name, least recently used first
        # [start, end) of each code section, sorted: a function of unknown size ends at its section's end (_init,
        # whose next symbol is past the PLT, must not name the PLT's stubs)
        self._code_starts: list[int] = []
        self._code_ends: list[int] = []
        self._plt: PltStubs | None = None  # names of PLT stubs, which no symbol covers
        self._function_starts: FunctionStarts | None = None  # .eh_frame_hdr: starts of functions without a symbol
        try:
            if self._source.size < _EHDR.size:
                raise ElfError(f"{path}: too small for an ELF header")
            self._parse()
        except BaseException:
            self._source.close()
            raise

    @property
    def symbol_count(self) -> int:
        return len(self._starts)

    @property
    def size_bytes(self) -> int:
        """Approximate memory held by the symbol table and its name cache, in bytes."""
        return (self._starts.itemsize + self._sizes.itemsize + self._name_at.itemsize) * len(self._starts) + \
            min(_NAME_CACHE_BYTES, 256 * len(self._starts)) + (_PLT_CACHE_BYTES if self._plt is not None else 0)

    def close(self) -> None:
        """Close the file now (later lookups still find functions but name them "")."""
        self._source.close()

    def symbols(self) -> list[tuple[int, str]]:
        """Every (link-time address, name), sorted by address (reads every name: meant for tests and tools)."""
        return [(self._starts[i], self._read_name(i)) for i in range(len(self._starts))]

    def vaddr_of(self, file_offset: int) -> int | None:
        """The link-time virtual address of ``file_offset``, None when no loadable segment holds it."""
        for segment in self.segments:
            if segment.offset <= file_offset < segment.offset + segment.file_size:
                return file_offset - segment.offset + segment.vaddr
        return None

    def offset_of(self, vaddr: int) -> int | None:
        """The file offset of link-time address ``vaddr``, None when no loadable segment holds it."""
        for segment in self.segments:
            if segment.vaddr <= vaddr < segment.vaddr + segment.file_size:
                return vaddr - segment.vaddr + segment.offset
        return None

    def add_symbols_from(self, debug: ElfSymbols) -> None:
        """Take the symbol table of ``debug`` (a separate debug file of this same build) in place of this one's.

        PLT stubs and function starts were read from this file, which is closed now (a debug file has no code): from
        then on stubs are named ``[plt]`` and code without a symbol has no function start."""
        self._starts, self._sizes, self._name_at = debug._starts, debug._sizes, debug._name_at
        self._source.close()
        self._source = debug._source  # names are now read from the debug file, kept open by this object
        self._names = OrderedDict()
        self.has_symtab = debug.has_symtab

    def lookup(self, vaddr: int) -> tuple[str, int] | None:
        """(symbol name, offset into it) of the function containing link-time address ``vaddr``, or None. A PLT stub
        is ``name@plt`` (``[plt]`` when its relocation names no symbol)."""
        found = self._symbol(vaddr)
        if found is None and self._plt is not None:
            return self._plt.lookup(vaddr, self._symbol_name)
        return found

    def _symbol(self, vaddr: int) -> tuple[str, int] | None:
        """(name, offset into it) of the symbol holding ``vaddr``, or None."""
        starts = self._starts
        index = bisect.bisect_right(starts, vaddr) - 1
        if index >= 0:
            start = starts[index]
            size = self._sizes[index]
            if size:
                end = start + size
            else:  # unknown size: up to the next symbol, within its section
                end = starts[index + 1] if index + 1 < len(starts) else start + 1
                section = bisect.bisect_right(self._code_starts, start) - 1
                if section >= 0 and start < self._code_ends[section]:
                    end = min(end, self._code_ends[section])
            if vaddr < end:
                return self._name(index), vaddr - start
        return None

    def _symbol_name(self, vaddr: int) -> str:
        """The name of the symbol holding ``vaddr`` ("" when none does)."""
        found = self._symbol(vaddr)
        return found[0] if found is not None else ""

    def function_start(self, vaddr: int) -> int | None:
        """The link-time start of the function holding ``vaddr`` from its unwind info (``.eh_frame_hdr``), for an
        address that :meth:`lookup` finds no symbol for; None when no FDE covers it or the file has no table."""
        if self._function_starts is None:
            return None
        try:
            return self._function_starts.start_of(vaddr)
        except OSError:
            return None

    def _name(self, index: int) -> str:
        names = self._names
        name = names.get(index)
        if name is not None:
            names.move_to_end(index)
            return name
        name = self._read_name(index)
        names[index] = name
        if len(names) > _NAME_CACHE_ENTRIES:
            names.popitem(last=False)
        return name

    def _read_name(self, index: int) -> str:
        """The NUL-ended name of symbol ``index`` without a symbol version (``@GLIBC_2.2.5``, ``@@GLIBC_2.34``); ""
        when the file cannot be read any more."""
        name = _read_name_bytes(self._source, self._name_at[index])
        version = name.find(b"@")
        return (name[:version] if version > 0 else name).decode(errors="replace")

    # --- parsing ---------------------------------------------------------------------------------------------------

    def _parse(self) -> None:
        read = self._source.read
        (ident, _type, _machine, _version, _entry, phoff, shoff, _flags, _ehsize, phentsize, phnum, shentsize,
         shnum, shstrndx) = _EHDR.unpack(read(0, _EHDR.size))
        if ident[:4] != b"\x7fELF":
            raise ElfError(f"{self.path}: not an ELF file")
        if ident[4] != 2 or ident[5] != 1:
            raise ElfError(f"{self.path}: only 64-bit little-endian ELF is supported")
        notes = _Notes(read)
        eh_frame_header: tuple[int, int] | None = None  # (vaddr, size)
        for p_type, p_offset, p_vaddr, p_filesz in _program_headers(read, phoff, phentsize, phnum):
            if p_type == _PT_LOAD:
                self.segments.append(Segment(p_offset, p_vaddr, p_filesz))
            elif p_type == _PT_NOTE and not self.build_id:
                self.build_id = notes.build_id(p_offset, p_filesz)
            elif p_type == _PT_GNU_EH_FRAME:
                eh_frame_header = p_vaddr, p_filesz
        sections = _section_headers(read, shoff, shentsize, shnum)
        self._read_code_sections(sections, shstrndx)
        if eh_frame_header is not None:
            try:
                self._function_starts = FunctionStarts(read, self.offset_of, *eh_frame_header)
            except (ValueError, OSError):
                self._function_starts = None  # no search table: code without a symbol keeps its address
        tables: list[tuple[int, int, int, int]] = []  # (offset, size, string table offset, string table size)
        for kind in (_SHT_SYMTAB, _SHT_DYNSYM):  # .symtab first: it has the local functions too
            # a file has at most one table of each kind: a corrupt one listing the same table 65,535 times is read once
            section = next((s for s in sections if s[1] == kind and s[6] < len(sections)), None)
            if section is not None:
                self.has_symtab = self.has_symtab or kind == _SHT_SYMTAB
                strtab = sections[section[6]]
                tables.append((section[4], section[5], strtab[4], strtab[5]))
        for section in sections:
            if self.build_id or not notes.budget:
                break
            if section[1] == _SHT_NOTE:
                self.build_id = notes.build_id(section[4], section[5])
        if self._native and native_symtab.available():
            source = self._source
            self._starts, self._sizes, self._name_at = native_symtab.read_functions(
                source.fd, source.image, source.size, tables, _MAX_TABLE_BYTES, self._name_at.typecode)
            return
        starts, sizes, name_at, ranks = array("Q"), array("I"), array(self._name_at.typecode), array("B")
        runs: list[tuple[int, int]] = []  # [begin, end) of each chunk's entries, each sorted by address
        budget = _MAX_TABLE_BYTES
        for table in tables:
            budget -= self._read_symbols(*table, budget, starts, sizes, name_at, ranks, runs)
        self._store(starts, sizes, name_at, ranks, runs)

    def _read_code_sections(self, sections: list[tuple[int, ...]], shstrndx: int) -> None:
        """Keep the ranges of code sections and, when the file has PLT stubs, what names them."""
        code = sorted((s[3], s[3] + s[5]) for s in sections if s[2] & _SHF_EXECINSTR and s[3] and s[5])
        self._code_starts = [start for start, _end in code]
        self._code_ends = [end for _start, end in code]
        if not 0 < shstrndx < len(sections):
            return
        strings = self._source.read(sections[shstrndx][4], min(sections[shstrndx][5], _MAX_SECTION_NAMES_BYTES))
        # only the names the stubs need are told apart (a corrupt file's 65,535 sections cost one compare each)
        names = [next((n for n in PLT_SECTIONS if strings.startswith(n + b"\0", s[0])), b"") for s in sections]
        plt = PltStubs(self._source.read, sections, names, functools.partial(_read_name, self._source))
        self._plt = plt if plt.stubs else None

    def _read_symbols(self, offset: int, size: int, str_offset: int, str_size: int, max_bytes: int,
                      starts: array[int], sizes: array[int], name_at: array[int], ranks: array[int],
                      runs: list[tuple[int, int]]) -> int:
        """Append the function symbols of one symbol table (its first ``max_bytes`` at most) with the rank of their
        binding, chunk by chunk, each chunk sorted by address (stable); returns the bytes of table read."""
        file_size = self._source.size
        if offset + size > file_size or str_offset + str_size > file_size or size % _SYM.size:
            return 0  # a section that is not in the file (e.g. NOBITS in a debug-only file)
        position, end = offset, offset + min(size, max_bytes // _SYM.size * _SYM.size)
        while position < end:
            data = self._source.read(position, min(_CHUNK_BYTES, end - position))
            if not data or len(data) % _SYM.size:
                break  # the file shrank under us: keep what was read
            position += len(data)
            found = [(value, sym_size, str_offset + name_off, _BINDING_RANK.get(info >> 4, _LOCAL_RANK))
                     for name_off, info, _other, shndx, value, sym_size in _SYM.iter_unpack(data)
                     if (info & 0xF == _STT_FUNC or info & 0xF == _STT_GNU_IFUNC) and value and shndx
                     and name_off < str_size]
            found.sort(key=_get_first)
            begin = len(starts)
            for value, sym_size, name, rank in found:
                starts.append(value)
                sizes.append(min(sym_size, _MAX_SIZE))
                name_at.append(name)
                ranks.append(rank)
            if found:
                runs.append((begin, len(starts)))
        return position - offset

    def _store(self, starts: array[int], sizes: array[int], name_at: array[int], ranks: array[int],
               runs: list[tuple[int, int]]) -> None:
        """Merge the sorted chunks by address, one function per address with the largest size at it, named by the first
        symbol of the best binding rank; among local symbols by the first whose name is not made. Names are read only
        to choose between two local symbols."""
        kept_starts, kept_sizes, kept_names = self._starts, self._sizes, self._name_at
        ordered = heapq.merge(*(range(begin, end) for begin, end in runs), key=starts.__getitem__)  # stable
        source = self._source
        last = -1
        best_rank = _LOCAL_RANK
        made: bool | None = None  # whether the kept name is made: read once a second local symbol asks
        for index in ordered:
            start = starts[index]
            size = sizes[index]
            if start == last:
                kept_sizes[-1] = max(kept_sizes[-1], size)
                rank, name = ranks[index], name_at[index]
                if rank < best_rank:
                    best_rank, made = rank, None
                    kept_names[-1] = name
                elif rank == best_rank == _LOCAL_RANK and made is not False and name != kept_names[-1]:
                    if made is None:
                        made = _is_made(_read_name_bytes(source, kept_names[-1]))
                    if made and not _is_made(_read_name_bytes(source, name)):
                        kept_names[-1], made = name, False
                continue
            last = start
            best_rank, made = ranks[index], None
            kept_starts.append(start)
            kept_sizes.append(size)
            kept_names.append(name_at[index])
        if kept_starts and kept_starts[-1] < 1 << 32:  # sorted: every start fits in 4 bytes (shared libraries do)
            self._starts = array("I", kept_starts)


def _read_name(source: _Source, offset: int) -> str:
    """The NUL-ended name at file offset ``offset`` of ``source`` ("" when the file cannot be read any more)."""
    return _read_name_bytes(source, offset).decode(errors="replace")


def _read_name_bytes(source: _Source, offset: int) -> bytes:
    """The NUL-ended name at file offset ``offset`` of ``source``, at most :data:`_MAX_NAME_BYTES` (b"" when the file
    cannot be read any more)."""
    want = 128
    found = b""
    try:
        while True:
            found = source.read(offset, want)
            end = found.find(b"\0")
            if end >= 0:
                found = found[:end]
                break
            if len(found) < want or want >= _MAX_NAME_BYTES:
                break  # end of the file or a corrupt table: keep what was read
            want = min(want * 8, _MAX_NAME_BYTES)
    except OSError:
        return b""
    return found


def _is_made(name: bytes) -> bool:
    """Whether a symbol name was made by the compiler or linker from another one (:data:`_MADE_NAME`)."""
    return _MADE_NAME.search(name) is not None


def _program_headers(read: _Read, phoff: int, phentsize: int, phnum: int) -> list[tuple[int, int, int, int]]:
    """(p_type, p_offset, p_vaddr, p_filesz) of each program header."""
    if not phoff or not phnum or not _PHDR.size <= phentsize <= _MAX_ENTRY_BYTES:
        return []
    data = read(phoff, phnum * phentsize)
    out = []
    for i in range(min(phnum, len(data) // phentsize)):
        p_type, _pf, p_offset, p_vaddr, _pa, p_filesz, _pm, _al = _PHDR.unpack_from(data, i * phentsize)
        out.append((p_type, p_offset, p_vaddr, p_filesz))
    return out


def _section_headers(read: _Read, shoff: int, shentsize: int, shnum: int) -> list[tuple[int, ...]]:
    if not shoff or not shnum or not _SHDR.size <= shentsize <= _MAX_ENTRY_BYTES:
        return []
    data = read(shoff, shnum * shentsize)
    return [_SHDR.unpack_from(data, i * shentsize) for i in range(min(shnum, len(data) // shentsize))]


class _Notes:
    """Reads note blocks looking for the build id, at most :data:`_MAX_NOTES_BYTES` in all (a corrupt file may list
    thousands of note segments or sections over the same bytes)."""

    def __init__(self, read: _Read) -> None:
        self._read = read
        self.budget = _MAX_NOTES_BYTES

    def build_id(self, offset: int, size: int) -> str:
        """The GNU build id in the notes at [offset, offset + size) of the file, or ""."""
        size = min(size, self.budget)
        if size <= 0:
            return ""
        self.budget -= size
        return _build_id(self._read(offset, size))


def _build_id(notes: bytes) -> str:
    """The GNU build id (lowercase hex) in a block of ELF notes, or ""."""
    offset, end = 0, len(notes)
    while offset + _NOTE.size <= end:
        namesz, descsz, note_type = _NOTE.unpack_from(notes, offset)
        name_start = offset + _NOTE.size
        desc_start = name_start + (namesz + 3) // 4 * 4
        if note_type == _NT_GNU_BUILD_ID and notes[name_start:name_start + namesz].rstrip(b"\0") == b"GNU":
            return notes[desc_start:desc_start + descsz].hex() if descsz <= _MAX_BUILD_ID_BYTES else ""
        offset = desc_start + (descsz + 3) // 4 * 4
    return ""


def _elf_header(source: _Source, path: str) -> tuple[int, ...]:
    """The ELF header's fields (``_EHDR``); raises ElfError when the file is not a 64-bit little-endian ELF file."""
    header = source.read(0, _EHDR.size)
    if len(header) < _EHDR.size or header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
        raise ElfError(f"{path}: not a 64-bit little-endian ELF file")
    return _EHDR.unpack(header)


def read_build_id(path: str) -> str:
    """The GNU build id of the ELF file at ``path`` ("" when it has none); raises OSError or ElfError."""
    source = _Source(path, None)
    try:
        fields = _elf_header(source, path)
        notes = _Notes(source.read)
        for p_type, p_offset, _vaddr, p_filesz in _program_headers(source.read, fields[5], fields[9], fields[10]):
            if p_type == _PT_NOTE:
                found = notes.build_id(p_offset, p_filesz)
                if found:
                    return found
        return ""
    finally:
        source.close()


def dynamic_symbol_value(path: str, name: str) -> int | None:
    """``st_value`` of the dynamic symbol ``name`` (any type: data too) of the ELF file at ``path``, None when it has
    none; raises OSError or ElfError. Reads only the headers, .dynsym and its string table: the agent's own reader,
    so that finding one symbol does not import pyelftools (~5 MB of memory kept for the agent's life)."""
    source = _Source(path, None)
    try:
        fields = _elf_header(source, path)
        sections = _section_headers(source.read, fields[6], fields[11], fields[12])
        dynsym = next((s for s in sections if s[1] == _SHT_DYNSYM and s[6] < len(sections)), None)
        if dynsym is None:
            return None
        str_offset, str_size = sections[dynsym[6]][4], sections[dynsym[6]][5]
        if str_size > _MAX_DYNSTR_BYTES:
            raise ElfError(f"{path}: a dynamic string table of {str_size} bytes")
        strings = source.read(str_offset, str_size)
        wanted = name.encode() + b"\0"
        starts = set()  # where the name starts in the string table (a longer name may end with it: suffixes share)
        at = strings.find(wanted)
        while at >= 0:
            starts.add(at)
            at = strings.find(wanted, at + 1)
        offset, end = dynsym[4], dynsym[4] + min(dynsym[5], _MAX_TABLE_BYTES) // _SYM.size * _SYM.size
        while starts and offset < end:
            data = source.read(offset, min(_CHUNK_BYTES, end - offset))
            if not data or len(data) % _SYM.size:
                break
            offset += len(data)
            for name_off, _info, _other, shndx, value, _size in _SYM.iter_unpack(data):
                if name_off in starts and shndx:  # defined here, not an import
                    return value
        return None
    finally:
        source.close()

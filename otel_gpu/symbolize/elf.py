# SPDX-License-Identifier: Apache-2.0
"""A small, fast reader of 64-bit little-endian ELF files: function symbols (.symtab and .dynsym), the GNU build id
and the PT_LOAD segments that translate a file offset into a link-time virtual address (which is how PIE and
shared-library load bias is removed). Reads only headers, notes and symbol tables, through mmap.
"""

from __future__ import annotations

import bisect
import mmap
import os
import struct
from array import array
from dataclasses import dataclass

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_PHDR = struct.Struct("<IIQQQQQQ")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")
_NOTE = struct.Struct("<III")
_PT_LOAD = 1
_PT_NOTE = 4
_SHT_SYMTAB = 2
_SHT_NOTE = 7
_SHT_DYNSYM = 11
_STT_FUNC = 2
_STT_GNU_IFUNC = 10
_NT_GNU_BUILD_ID = 3


class ElfError(ValueError):
    """Not an ELF file this reader understands (or a truncated one)."""


@dataclass(frozen=True, slots=True)
class Segment:
    """One PT_LOAD segment: file range [offset, offset + file_size) is loaded at link-time address vaddr."""

    offset: int
    vaddr: int
    file_size: int


class ElfSymbols:
    """Function symbols of one ELF file, sorted by address, with its build id and load segments.

    Stored compactly (two address arrays and one byte string of names, about 20 bytes plus the name per symbol);
    names are decoded when looked up."""

    def __init__(self, path: str, image: bytes | None = None) -> None:
        """Read the ELF file at ``path``, or the in-memory ``image`` (then ``path`` only names it)."""
        self.path = path
        self.build_id = ""
        self.has_symtab = False  # False: only exported (.dynsym) names; a separate debug file may have the rest
        self.segments: list[Segment] = []
        self._starts = array("Q")
        self._ends = array("Q")
        self._name_ends = array("I")
        self._names = b""
        if image is not None:
            if len(image) < _EHDR.size:
                raise ElfError(f"{path}: too small for an ELF header")
            self._parse(image)  # type: ignore[arg-type]  # bytes offer what the parser uses of mmap
            return
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size < _EHDR.size:
                raise ElfError(f"{path}: too small for an ELF header")
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
                self._parse(data)

    @property
    def symbol_count(self) -> int:
        return len(self._starts)

    @property
    def size_bytes(self) -> int:
        """Approximate memory held by the symbol table."""
        return len(self._names) + 20 * len(self._starts)

    def symbols(self) -> list[tuple[int, str]]:
        """Every (link-time address, name), sorted by address."""
        return [(self._starts[i], self._name(i)) for i in range(len(self._starts))]

    def _name(self, index: int) -> str:
        begin = self._name_ends[index - 1] if index else 0
        return self._names[begin:self._name_ends[index]].decode(errors="replace")

    def vaddr_of(self, file_offset: int) -> int | None:
        """The link-time virtual address of ``file_offset``, None when no loadable segment holds it."""
        for segment in self.segments:
            if segment.offset <= file_offset < segment.offset + segment.file_size:
                return file_offset - segment.offset + segment.vaddr
        return None

    def add_symbols_from(self, debug: ElfSymbols) -> None:
        """Take the symbol table of ``debug`` (a separate debug file of this same build) in place of this one's."""
        self._starts, self._ends, self._name_ends, self._names = (debug._starts, debug._ends, debug._name_ends,
                                                                  debug._names)
        self.has_symtab = debug.has_symtab

    def lookup(self, vaddr: int) -> tuple[str, int] | None:
        """(symbol name, offset into it) of the function containing link-time address ``vaddr``, or None."""
        index = bisect.bisect_right(self._starts, vaddr) - 1
        if index < 0 or vaddr >= self._ends[index]:
            return None
        return self._name(index), vaddr - self._starts[index]

    # --- parsing ---------------------------------------------------------------------------------------------------

    def _parse(self, data: mmap.mmap) -> None:
        (ident, _type, _machine, _version, _entry, phoff, shoff, _flags, _ehsize, phentsize, phnum, shentsize,
         shnum, _shstrndx) = _EHDR.unpack_from(data, 0)
        if ident[:4] != b"\x7fELF":
            raise ElfError(f"{self.path}: not an ELF file")
        if ident[4] != 2 or ident[5] != 1:
            raise ElfError(f"{self.path}: only 64-bit little-endian ELF is supported")
        for i in range(phnum):
            p_type, _pf, p_offset, p_vaddr, _pa, p_filesz, _pm, _al = _PHDR.unpack_from(data, phoff + i * phentsize)
            if p_type == _PT_LOAD:
                self.segments.append(Segment(p_offset, p_vaddr, p_filesz))
            elif p_type == _PT_NOTE and not self.build_id:
                self.build_id = _build_id(data, p_offset, p_filesz)
        sections = [_SHDR.unpack_from(data, shoff + i * shentsize) for i in range(shnum)] if shoff else []
        starts, sizes, name_at = array("Q"), array("Q"), array("Q")  # name_at: file offset of the NUL-ended name
        for kind in (_SHT_SYMTAB, _SHT_DYNSYM):  # .symtab first: it has the local functions too
            for section in sections:
                if section[1] == kind and section[6] < len(sections):
                    self.has_symtab = self.has_symtab or kind == _SHT_SYMTAB
                    strtab = sections[section[6]]
                    _read_symbols(data, section[4], section[5], strtab[4], strtab[5], starts, sizes, name_at)
        if not self.build_id:
            for section in sections:
                if section[1] == _SHT_NOTE:
                    self.build_id = _build_id(data, section[4], section[5])
                    if self.build_id:
                        break
        self._store(data, starts, sizes, name_at)

    def _store(self, data: mmap.mmap, starts: array[int], sizes: array[int], name_at: array[int]) -> None:
        """Sort by address (first symbol wins at an address, the larger size kept) and keep names in one blob."""
        names = bytearray()
        kept_sizes = array("Q")
        for index in sorted(range(len(starts)), key=starts.__getitem__):
            start = starts[index]
            if self._starts and self._starts[-1] == start:
                kept_sizes[-1] = max(kept_sizes[-1], sizes[index])
                continue
            position = name_at[index]
            end = data.find(b"\0", position)
            names += data[position:end if end >= 0 else position]
            self._starts.append(start)
            kept_sizes.append(sizes[index])
            self._name_ends.append(len(names))
        self._names = bytes(names)
        count = len(self._starts)
        for i in range(count):
            size = kept_sizes[i]
            if size:
                self._ends.append(self._starts[i] + size)
            else:  # unknown size: up to the next symbol
                self._ends.append(self._starts[i + 1] if i + 1 < count else self._starts[i] + 1)


def _read_symbols(data: mmap.mmap, offset: int, size: int, str_offset: int, str_size: int, starts: array[int],
                  sizes: array[int], name_at: array[int]) -> None:
    """Append the function symbols of one symbol table (address, size, name offset in the file)."""
    if offset + size > len(data) or str_offset + str_size > len(data) or size % _SYM.size:
        return  # a section that is not in the file (e.g. NOBITS in a debug-only file)
    view = memoryview(data)[offset:offset + size]
    try:
        for name_off, info, _other, shndx, value, sym_size in _SYM.iter_unpack(view):
            kind = info & 0xF
            if (kind == _STT_FUNC or kind == _STT_GNU_IFUNC) and value and shndx and name_off < str_size:
                starts.append(value)
                sizes.append(sym_size)
                name_at.append(str_offset + name_off)
    finally:
        view.release()


def _build_id(data: mmap.mmap, offset: int, size: int) -> str:
    """The GNU build id (lowercase hex) in the notes at [offset, offset + size), or ""."""
    end = min(offset + size, len(data))
    while offset + _NOTE.size <= end:
        namesz, descsz, note_type = _NOTE.unpack_from(data, offset)
        name_start = offset + _NOTE.size
        desc_start = name_start + (namesz + 3) // 4 * 4
        if note_type == _NT_GNU_BUILD_ID and data[name_start:name_start + namesz].rstrip(b"\0") == b"GNU":
            return bytes(data[desc_start:desc_start + descsz]).hex()
        offset = desc_start + (descsz + 3) // 4 * 4
    return ""


def read_build_id(path: str) -> str:
    """The GNU build id of the ELF file at ``path`` ("" when it has none); raises OSError or ElfError."""
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        ident = data[:16]
        if ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
            raise ElfError(f"{path}: not a 64-bit little-endian ELF file")
        fields = _EHDR.unpack_from(data, 0)
        phoff, phentsize, phnum = fields[5], fields[9], fields[10]
        for i in range(phnum):
            p_type, _pf, p_offset, _pv, _pa, p_filesz, _pm, _al = _PHDR.unpack_from(data, phoff + i * phentsize)
            if p_type == _PT_NOTE:
                found = _build_id(data, p_offset, p_filesz)
                if found:
                    return found
    return ""

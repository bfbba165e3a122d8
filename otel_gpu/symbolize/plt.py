# SPDX-License-Identifier: Apache-2.0
"""Names of x86-64 PLT stubs (``.plt``, ``.plt.sec``, ``.plt.got``) as objdump and perf write them: ``name@plt``.

No symbol table covers a stub; the stub's own jump says whose it is. Each stub jumps through one GOT slot
(``jmp *disp32(%rip)``, after an ``endbr64`` and a ``bnd`` prefix where IBT is on); the relocation that fills that slot
(``.rela.plt``'s JUMP_SLOT, or ``.rela.dyn``'s GLOB_DAT for ``.plt.got``) names the dynamic symbol, or for an
IRELATIVE slot (libc calling its own ``strlen``) its addend is the IFUNC, named by the file's symbols. IBT's lazy
``.plt`` stubs jump to nothing and push their ``.rela.plt`` index instead. A stub that names no symbol (PLT0, an
IRELATIVE slot, an unknown layout) is ``[plt]``.

Nothing is read until an address falls in a stub, then one stub, one relocation (its index is a good guess: stubs and
JUMP_SLOTs are in the same order) or a search of the relocation tables for the slot's 8 bytes, one dynamic symbol and
its name; names are kept per stub, up to :data:`_CACHE_ENTRIES`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence

PLT_NAME = "[plt]"  # a stub without a symbol: PLT0, an IRELATIVE slot, a layout this reader does not know
_STUB_SECTIONS = (b".plt", b".plt.sec", b".plt.got")
_SHF_EXECINSTR = 0x4
PLT_SECTIONS = (*_STUB_SECTIONS, b".rela.plt", b".rela.dyn")  # the sections whose names the caller tells apart
_RELA = struct.Struct("<QQq")  # r_offset, r_info, r_addend
_SYM_NAME = struct.Struct("<I")  # st_name, the first field of an Elf64_Sym
_SYM_BYTES = 24
_DISP = struct.Struct("<i")
_ENDBR64 = b"\xf3\x0f\x1e\xfa"
_BND = b"\xf2"
_JUMP = b"\xff\x25"  # jmp *disp32(%rip)
_PUSH = b"\x68"  # push imm32: IBT's lazy .plt stub (endbr64; push; jmp PLT0) pushes its .rela.plt index
_R_X86_64_GLOB_DAT, _R_X86_64_JUMP_SLOT, _R_X86_64_IRELATIVE = 6, 7, 37
_JUMP_SLOT_KINDS = (_R_X86_64_JUMP_SLOT, _R_X86_64_IRELATIVE)  # .rela.plt: imports, and IFUNCs of the file itself
_GLOBAL_DATA_KINDS = (_R_X86_64_GLOB_DAT, _R_X86_64_IRELATIVE)  # .rela.dyn, for .plt.got
_MAX_STUB_BYTES = 32  # stubs are 8 or 16 bytes; a larger entry size is a corrupt header
_MAX_RELOCATION_BYTES = 64 << 20  # searched per stub at most (libtorch_cpu.so's .rela.dyn: ~20 MB)
_SEARCH_BYTES = (1 << 20) // _RELA.size * _RELA.size  # relocations read per pread while searching
_CACHE_ENTRIES = 64  # hot stubs per file are few; the symbolizer keeps each frame it built anyway
CACHE_BYTES = _CACHE_ENTRIES * 128  # what the name cache is counted as (names of imports average < 64 bytes)

_Read = Callable[[int, int], bytes]
Section = tuple[int, ...]  # a section header as elf._SHDR unpacks it


class PltStubs:
    """The PLT stub sections of one file and the relocations that name their stubs."""

    def __init__(self, read: _Read, sections: Sequence[Section], names: Sequence[bytes],
                 read_name: Callable[[int], str]) -> None:
        """``sections`` are the file's section headers (``elf._SHDR`` fields), ``names`` their names; ``read_name``
        reads the NUL-ended name at a file offset."""
        self._read = read
        self._read_name = read_name
        # (sh_addr, end, sh_offset, entry size, name) of each stub section
        self.stubs: list[tuple[int, int, int, int, bytes]] = []
        for header, name in zip(sections, names, strict=True):
            flags, addr, offset, size, entsize = header[2], header[3], header[4], header[5], header[9]
            if name in _STUB_SECTIONS and flags & _SHF_EXECINSTR and size:
                entsize = entsize if entsize in (8, 16) else 16
                self.stubs.append((addr, addr + size, offset, entsize, name))
        self._jump_slots = self._table(sections, names, b".rela.plt")
        self._global_data = self._table(sections, names, b".rela.dyn")
        self._names: dict[int, str] = {}  # stub address -> name

    @staticmethod
    def _table(sections: Sequence[Section], names: Sequence[bytes], wanted: bytes) -> tuple[int, int, int, int] | None:
        """(offset, size, symbol table offset, string table offset) of the relocation section ``wanted``."""
        for header, name in zip(sections, names, strict=True):
            link = header[6]
            if name == wanted and link < len(sections):
                symbols = sections[link]
                if symbols[6] < len(sections):
                    return header[4], header[5] // _RELA.size * _RELA.size, symbols[4], sections[symbols[6]][4]
        return None

    def lookup(self, vaddr: int, name_of: Callable[[int], str]) -> tuple[str, int] | None:
        """(``name@plt`` or ``[plt]``, offset into the stub) when link-time address ``vaddr`` is in a stub, else None;
        ``[plt]`` too when the file cannot be read any more. ``name_of`` names the file's function at a link-time
        address ("" if none): an IFUNC's."""
        for addr, end, offset, entsize, section in self.stubs:
            if addr <= vaddr < end:
                stub = addr + (vaddr - addr) // entsize * entsize
                name = self._names.get(stub)
                if name is None:
                    try:
                        name = self._name(stub, offset + stub - addr, (stub - addr) // entsize, section, name_of)
                    except OSError:
                        return PLT_NAME, vaddr - stub  # closed: not cached, as ElfSymbols' own names are not
                    if len(self._names) >= _CACHE_ENTRIES:
                        self._names.clear()
                    self._names[stub] = name
                return name, vaddr - stub
        return None

    def _name(self, stub: int, file_offset: int, index: int, section: bytes, name_of: Callable[[int], str]) -> str:
        code = self._read(file_offset, _MAX_STUB_BYTES)[:16]
        found: tuple[tuple[int, int, int, int], int, int] | None = None  # (table, r_info, r_addend)
        at = len(_ENDBR64) if code.startswith(_ENDBR64) else 0
        at += len(_BND) if code.startswith(_BND, at) else 0
        if code.startswith(_JUMP, at) and at + 6 <= len(code):
            slot = (stub + at + 6 + _DISP.unpack_from(code, at + 2)[0]) & 0xFFFFFFFFFFFFFFFF
            # .plt's first stub is PLT0, so its JUMP_SLOTs are one behind; .plt.sec's are in step
            guess = index - 1 if section == b".plt" else index if section == b".plt.sec" else -1
            found = self._relocation_of_slot(self._jump_slots, slot, guess, _JUMP_SLOT_KINDS)
            if found is None:
                found = self._relocation_of_slot(self._global_data, slot, -1, _GLOBAL_DATA_KINDS)
        elif at == len(_ENDBR64) and code.startswith(_PUSH, at) and len(code) >= 9 and self._jump_slots is not None:
            rela = self._relocation(self._jump_slots, _DISP.unpack_from(code, 5)[0])
            if rela is not None and rela[1] & 0xFFFFFFFF in _JUMP_SLOT_KINDS:
                found = self._jump_slots, rela[1], rela[2]
        if found is None:
            return PLT_NAME
        (_offset, _size, symbols, strings), info, addend = found
        if info & 0xFFFFFFFF == _R_X86_64_IRELATIVE:  # no symbol: the addend is the IFUNC's resolver, which has one
            name = name_of(addend)
        else:
            entry = self._read(symbols + (info >> 32) * _SYM_BYTES, _SYM_BYTES) if info >> 32 else b""
            name = self._read_name(strings + _SYM_NAME.unpack_from(entry)[0]) if len(entry) == _SYM_BYTES else ""
        return f"{name}@plt" if name else PLT_NAME

    def _relocation(self, table: tuple[int, int, int, int], index: int) -> tuple[int, int, int] | None:
        """(r_offset, r_info, r_addend) of relocation ``index`` of ``table``."""
        if not 0 <= index < table[1] // _RELA.size:
            return None
        data = self._read(table[0] + index * _RELA.size, _RELA.size)
        return _RELA.unpack(data) if len(data) == _RELA.size else None

    def _relocation_of_slot(self, table: tuple[int, int, int, int] | None, slot: int, guess: int,
                            kinds: tuple[int, ...]) -> tuple[tuple[int, int, int, int], int, int] | None:
        """(table, r_info, r_addend) of the relocation of one of ``kinds`` that fills GOT ``slot`` in ``table``: its
        entry ``guess`` when that is the one, else the first found."""
        if table is None:
            return None
        rela = self._relocation(table, guess)
        if rela is not None and rela[0] == slot and rela[1] & 0xFFFFFFFF in kinds:
            return table, rela[1], rela[2]
        wanted = struct.pack("<Q", slot)
        position, end = table[0], table[0] + min(table[1], _MAX_RELOCATION_BYTES)
        while position < end:
            data = self._read(position, min(_SEARCH_BYTES, end - position))
            at = data.find(wanted)
            while at >= 0:
                if at % _RELA.size == 0 and at + _RELA.size <= len(data):
                    _offset, info, addend = _RELA.unpack_from(data, at)
                    if info & 0xFFFFFFFF in kinds:
                        return table, info, addend
                at = data.find(wanted, at + 1)
            if len(data) < _RELA.size:
                break
            position += len(data) // _RELA.size * _RELA.size
        return None

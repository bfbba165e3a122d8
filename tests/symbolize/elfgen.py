# SPDX-License-Identifier: Apache-2.0
"""Writes synthetic 64-bit ELF files with any number of symbols, for tests of the ELF reader on huge tables."""

from __future__ import annotations

import random
import re
import struct
from dataclasses import dataclass
from pathlib import Path

STT_OBJECT, STT_FUNC, STT_GNU_IFUNC = 1, 2, 10
STB_LOCAL, STB_GLOBAL, STB_WEAK = 0, 1, 2
SHN_UNDEF, SHN_TEXT = 0, 1
# a name the compiler or linker made from another: a clone suffix after one '.' (Rust's ".." separates a path), or
# glibc's _alias_<digits>
_MADE = re.compile(r"(^|[^.])\.(cold|part|isra|constprop|lto_priv|localalias|llvm|__uniq)(\.|\Z)|_alias_[0-9]+\Z")


@dataclass(frozen=True)
class Symbol:
    name: str
    value: int
    size: int
    kind: int = STT_FUNC
    shndx: int = SHN_TEXT
    binding: int = STB_GLOBAL


def write_elf(path: Path, symbols: list[Symbol], build_id: bytes = bytes(range(20))) -> None:
    """An ET_DYN file: one PT_LOAD covering [0, 2**40), a GNU build-id note, .symtab (in the given order) and
    .strtab; no code. Sections: 0 null, 1 .note.gnu.build-id (also stands in for .text), 2 .symtab, 3 .strtab,
    4 .shstrtab."""
    strtab = bytearray(b"\0")
    entries = bytearray(bytes(24))  # the null symbol
    for symbol in symbols:
        name_off = len(strtab)
        strtab += symbol.name.encode() + b"\0"
        entries += struct.pack("<IBBHQQ", name_off, (symbol.binding << 4) | symbol.kind, 0, symbol.shndx,
                               symbol.value, symbol.size)
    note = struct.pack("<III", 4, len(build_id), 3) + b"GNU\0" + build_id
    shstrtab = b"\0.note.gnu.build-id\0.symtab\0.strtab\0.shstrtab\0"
    phoff, phnum = 64, 2
    note_off = phoff + phnum * 56
    symtab_off = (note_off + len(note) + 7) // 8 * 8
    strtab_off = symtab_off + len(entries)
    shstrtab_off = strtab_off + len(strtab)
    shoff = (shstrtab_off + len(shstrtab) + 7) // 8 * 8
    header = struct.pack("<16sHHIQQQIHHHHHH", b"\x7fELF\x02\x01\x01" + bytes(9), 3, 62, 1, 0, phoff, shoff, 0, 64, 56,
                         phnum, 64, 5, 4)
    phdrs = (struct.pack("<IIQQQQQQ", 1, 5, 0, 0, 0, shoff, 1 << 40, 0x1000)
             + struct.pack("<IIQQQQQQ", 4, 4, note_off, note_off, note_off, len(note), len(note), 4))

    def section(name: bytes, kind: int, offset: int, size: int, link: int = 0, info: int = 0,
                entsize: int = 0) -> bytes:
        return struct.pack("<IIQQQQIIQQ", shstrtab.index(name), kind, 2 if kind == 7 else 0, 0, offset, size, link,
                           info, 1, entsize)

    shdrs = (bytes(64) + section(b".note.gnu.build-id\0", 7, note_off, len(note))
             + section(b".symtab\0", 2, symtab_off, len(entries), link=3, info=1, entsize=24)
             + section(b".strtab\0", 3, strtab_off, len(strtab)) + section(b".shstrtab\0", 3, shstrtab_off,
                                                                           len(shstrtab)))
    with path.open("wb") as out:
        out.write(header + phdrs + note)
        out.write(bytes(symtab_off - out.tell()))
        out.write(entries)
        out.write(strtab)
        out.write(shstrtab)
        out.write(bytes(shoff - out.tell()))
        out.write(shdrs)


def cxx_like_symbols(count: int, seed: int = 3, mixed_bindings: bool = False) -> list[Symbol]:
    """``count`` symbols in random order with long mangled-looking names (about 150 bytes, a few of 5,000), like a
    big C++ library: mostly sized functions, some without a size, some aliases at one address, some IFUNCs, and
    objects and undefined symbols that must be ignored. All global, unless ``mixed_bindings``: then a symbol is
    global, weak or local and an alias's name may end in a suffix the compiler makes (``.cold``, ``_alias_2``)."""
    rng = random.Random(seed)
    symbols: list[Symbol] = []
    address = 0x10000
    for i in range(count):
        length = 5000 if i % 997 == 0 else rng.randrange(60, 240)
        name = f"_ZN2at6native{i}" + "x" * (length - 20) + f"E{i}"
        roll = rng.random()
        binding = rng.choice((STB_GLOBAL, STB_WEAK, STB_LOCAL)) if mixed_bindings else STB_GLOBAL
        if roll < 0.05 and symbols:
            prior = rng.choice(symbols)  # an alias of an earlier symbol: same address, maybe another size
            if mixed_bindings:
                name += rng.choice(("", "", ".cold", ".isra.0", "_alias_2", "..cold..f", ".coldish"))
            symbols.append(Symbol(name, prior.value, rng.choice((0, prior.size, prior.size // 2)), binding=binding))
            continue
        step = rng.randrange(16, 512)
        size = 0 if roll < 0.15 else rng.randrange(1, step + 1)
        kind = STT_OBJECT if roll > 0.97 else STT_GNU_IFUNC if roll > 0.96 else STT_FUNC
        shndx = SHN_UNDEF if 0.95 < roll <= 0.955 else SHN_TEXT
        symbols.append(Symbol(name, address, size, kind, shndx, binding))
        address += step
    rng.shuffle(symbols)
    return symbols


def expected_functions(symbols: list[Symbol]) -> list[tuple[int, int, str]]:
    """(start, end, name) the reader must find: functions with an address and a section, an unknown size running
    up to the next function; at one address the largest size, and the name of the best binding (global, weak, then
    any other: local), among local ones one that is not made, then the first in file order."""
    at: dict[int, list[Symbol]] = {}
    for symbol in symbols:
        if symbol.kind in (STT_FUNC, STT_GNU_IFUNC) and symbol.value and symbol.shndx != SHN_UNDEF:
            at.setdefault(symbol.value, []).append(symbol)
    rank = {STB_GLOBAL: 0, STB_WEAK: 1}
    starts = sorted(at)
    out = []
    for index, start in enumerate(starts):
        group = at[start]
        best = min(rank.get(s.binding, 2) for s in group)
        name = min((s for s in group if rank.get(s.binding, 2) == best),
                   key=lambda s: best == 2 and _MADE.search(s.name) is not None).name  # stable: the first of equals
        size = max(symbol.size for symbol in group)
        end = start + size if size else (starts[index + 1] if index + 1 < len(starts) else start + 1)
        out.append((start, end, name))
    return out

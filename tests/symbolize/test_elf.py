# SPDX-License-Identifier: Apache-2.0
"""The ELF reader on real binaries (symbols, build ids and load segments of PIE, non-PIE, stripped, a library) and
on generated files with huge symbol tables (memory held and resolution, against a reference)."""

from __future__ import annotations

import os
import random
import re
import shutil
import struct
import subprocess
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import NoteSection, SymbolTableSection

from otel_gpu.symbolize import elf as elf_module
from otel_gpu.symbolize.elf import ElfError, ElfSymbols, read_build_id
from tests.conftest import NATIVE
from tests.symbolize.elfgen import (STB_GLOBAL, STB_LOCAL, STB_WEAK, Symbol, cxx_like_symbols, expected_functions,
                                    write_elf)

WORKLOADS = NATIVE / "workloads"


def _reference(path: Path) -> tuple[dict[str, tuple[int, int]], str]:
    """Function symbols (name -> (value, size)) and build id as pyelftools reads them."""
    with path.open("rb") as handle:
        elf = ELFFile(handle)
        functions: dict[str, tuple[int, int]] = {}
        for section_name in (".symtab", ".dynsym"):
            section = elf.get_section_by_name(section_name)
            if not isinstance(section, SymbolTableSection):
                continue
            for symbol in section.iter_symbols():
                if symbol["st_info"]["type"] == "STT_FUNC" and symbol["st_value"]:
                    functions.setdefault(symbol.name, (symbol["st_value"], symbol["st_size"]))
        build_id = ""
        for section in elf.iter_sections():
            if isinstance(section, NoteSection):
                for note in section.iter_notes():
                    if note["n_type"] == "NT_GNU_BUILD_ID":
                        build_id = note["n_desc"]
    return functions, build_id


@pytest.mark.parametrize("binary", ["cpu_3to1", "cpu_3to1_nopie", "libuprobe_target.so"])
def test_every_function_symbol_is_found_at_its_address(binary: str) -> None:
    path = WORKLOADS / binary
    functions, build_id = _reference(path)
    elf = ElfSymbols(str(path))
    assert elf.build_id == build_id and len(build_id) == 40
    assert read_build_id(str(path)) == build_id
    for name, (value, size) in functions.items():
        assert elf.lookup(value) == (name, 0), name
        if size > 1:
            assert elf.lookup(value + size - 1) == (name, size - 1), name


def test_pie_and_non_pie_segments_translate_file_offsets() -> None:
    pie = ElfSymbols(str(WORKLOADS / "cpu_3to1"))
    nopie = ElfSymbols(str(WORKLOADS / "cpu_3to1_nopie"))
    # a PIE links at 0: the text segment's vaddr equals its file offset region; -no-pie links at 0x400000
    assert min(s.vaddr for s in pie.segments) == 0
    assert min(s.vaddr for s in nopie.segments) >= 0x400000
    functions, _ = _reference(WORKLOADS / "cpu_3to1_nopie")
    value = functions["leaf_heavy"][0]
    segment = next(s for s in nopie.segments if s.vaddr <= value < s.vaddr + s.file_size)
    assert nopie.vaddr_of(value - segment.vaddr + segment.offset) == value
    assert nopie.vaddr_of(10**12) is None


def test_stripped_binary_keeps_only_dynamic_symbols_and_its_build_id() -> None:
    stripped = ElfSymbols(str(WORKLOADS / "cpu_3to1_stripped"))
    full = ElfSymbols(str(WORKLOADS / "cpu_3to1"))
    assert stripped.build_id == full.build_id
    functions, _ = _reference(WORKLOADS / "cpu_3to1")
    assert stripped.lookup(functions["leaf_heavy"][0]) is None  # only in .symtab, which strip removed


def test_shared_c_library_has_its_exports() -> None:
    libc = Path("/lib/x86_64-linux-gnu/libc.so.6")
    if not libc.exists():
        pytest.skip("no glibc at /lib/x86_64-linux-gnu/libc.so.6 on this machine")
    functions, build_id = _reference(libc)
    elf = ElfSymbols(str(libc))
    assert elf.build_id == build_id
    value = functions["getpid"][0]
    name, offset = elf.lookup(value) or ("", -1)
    assert offset == 0 and functions[name][0] == value


def test_not_an_elf_file_raises_elf_error(tmp_path: Path) -> None:
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho hello, this is long enough to hold a fake ELF header\n")
    with pytest.raises(ElfError):
        ElfSymbols(str(script))
    tiny = tmp_path / "tiny"
    tiny.write_bytes(b"\x7fELF")
    with pytest.raises(ElfError):
        ElfSymbols(str(tiny))


def test_32_bit_elf_is_refused_not_misread(tmp_path: Path) -> None:
    compiler = shutil.which("clang") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    source = tmp_path / "x.c"
    source.write_text("int f(void) { return 1; }\n")
    obj = tmp_path / "x32.o"
    built = subprocess.run([compiler, "-m32", "-c", str(source), "-o", str(obj)], capture_output=True, check=False)
    if built.returncode:
        pytest.skip("this compiler cannot build 32-bit objects")
    with pytest.raises(ElfError, match="64-bit"):
        ElfSymbols(str(obj))


@pytest.fixture(scope="module")
def huge_elf(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[Symbol]]]:
    """A generated library with 150,000 symbols and ~25 MB of C++-like names (libtorch_cpu.so has 530,000 and 76 MB)."""
    symbols = cxx_like_symbols(150_000)
    path = tmp_path_factory.mktemp("huge") / "libhuge.so"
    write_elf(path, symbols)
    yield path, symbols


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
def test_huge_symbol_table_loads_in_memory_bounded_by_function_count(huge_elf: tuple[Path, list[Symbol]],
                                                                     native: bool) -> None:
    """tracemalloc sees the Python reader's allocations and the arrays either reader fills (the native reader's own
    peak: test_native_symtab.py)."""
    path, symbols = huge_elf
    functions = len(expected_functions(symbols))
    names_bytes = sum(len(s.name) + 1 for s in symbols)
    peak_bound = 48 * functions + 6 * 1024 * 1024  # bytes per function kept while merging, plus one chunk of symbols
    held_bound = 13 * functions + 256 * 1024  # 4-byte starts, sizes and name offsets (8-byte starts would not fit)
    assert names_bytes > 1.5 * peak_bound  # so copying the names, or the whole table, would break the bound
    tracemalloc.start()
    try:
        elf = ElfSymbols(str(path), native=native)
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elf.symbol_count == functions
    assert peak < peak_bound, f"peak {peak} bytes for {functions} functions"
    assert held < held_bound, f"held {held} bytes for {functions} functions"
    assert elf.size_bytes < held_bound and elf.build_id == bytes(range(20)).hex()


def test_huge_symbol_table_resolves_like_the_reference(huge_elf: tuple[Path, list[Symbol]]) -> None:
    path, symbols = huge_elf
    expected = expected_functions(symbols)
    elf = ElfSymbols(str(path))
    assert elf.symbols() == [(start, name) for start, _end, name in expected]
    for index, (start, end, name) in enumerate(expected):
        assert elf.lookup(start) == (name, 0)
        assert elf.lookup(end - 1) == (name, end - 1 - start)
        if index + 1 < len(expected) and end < expected[index + 1][0]:
            assert elf.lookup(end) is None  # in the gap after a sized function
    assert elf.lookup(expected[0][0] - 1) is None
    assert any(len(name) > 4000 for _s, _e, name in expected)  # names longer than one read are joined
    assert len(elf._names) <= elf_module._NAME_CACHE_ENTRIES  # names read on lookup are kept in a bounded cache


def test_a_function_past_4_gib_keeps_8_byte_starts(tmp_path: Path) -> None:
    symbols = [Symbol("low", 0x1000, 16), Symbol("high", (5 << 32) + 0x40, 32)]
    path = tmp_path / "libhigh.so"
    write_elf(path, symbols)
    elf = ElfSymbols(str(path))
    assert elf.lookup(0x1008) == ("low", 8)
    assert elf.lookup((5 << 32) + 0x50) == ("high", 0x10)
    assert elf.lookup(0x40 + 0x10) is None  # not the high function's address taken modulo 2^32


def test_names_stay_readable_after_the_file_is_deleted(tmp_path: Path) -> None:
    copy = tmp_path / "doomed"
    shutil.copy2(WORKLOADS / "cpu_3to1", copy)
    functions, _ = _reference(copy)
    elf = ElfSymbols(str(copy))
    copy.unlink()
    value, _size = functions["leaf_heavy"]
    assert elf.lookup(value + 1) == ("leaf_heavy", 1)
    elf.close()
    assert elf.lookup(functions["leaf_light"][0]) == ("", 0)  # closed: the function is still found, unnamed


def _header(**fields: int) -> bytes:
    """A 64-bit little-endian ELF header with the given e_* fields (the rest 0)."""
    values = {"phoff": 0, "shoff": 0, "phentsize": 0, "phnum": 0, "shentsize": 0, "shnum": 0} | fields
    return elf_module._EHDR.pack(b"\x7fELF\x02\x01\x01" + b"\0" * 9, 3, 62, 1, 0, values["phoff"], values["shoff"],
                                 0, 64, values["phentsize"], values["phnum"], values["shentsize"], values["shnum"], 0)


@pytest.mark.parametrize("fields", [
    {"shoff": (1 << 64) - 1, "shentsize": 64, "shnum": 10},  # issue 10: OverflowError blinded the CPU profiler
    {"phoff": (1 << 64) - 8, "phentsize": 56, "phnum": 3},
    {"shoff": 64, "shentsize": 65535, "shnum": 65535},  # 4 GiB of "section headers" asked for
    {"phoff": 64, "phentsize": 65535, "phnum": 65535},
])
def test_hostile_header_fields_cost_the_file_its_symbols_only(tmp_path: Path, fields: dict[str, int]) -> None:
    path = tmp_path / "hostile"
    path.write_bytes(_header(**fields) + b"\0" * 4096)
    tracemalloc.start()
    try:
        elf = ElfSymbols(str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert elf.symbol_count == 0 and elf.lookup(0x1000) is None
    assert peak < 1 << 20


def test_mutated_real_binaries_raise_only_elf_errors(tmp_path: Path) -> None:
    """Random bytes written over a real binary's headers (the issue's "random bytes after the ELF magic"): every
    parse ends in symbols or an ElfError, never another exception, within bounded memory."""
    original = Path(shutil.which("true") or "/bin/true").read_bytes()
    rng = random.Random(10)
    path = tmp_path / "mutant"
    tracemalloc.start()
    try:
        for _ in range(300):
            data = bytearray(original)
            for _ in range(rng.randrange(1, 24)):
                at = rng.randrange(4, 64) if rng.random() < 0.6 else rng.randrange(4, min(len(data), 4096))
                data[at] = rng.randrange(256)
            if rng.random() < 0.2:
                data[4:] = rng.randbytes(len(data) - 4)
            path.write_bytes(bytes(data))
            try:
                ElfSymbols(str(path)).lookup(0x1000)
            except ElfError:
                pass
        assert tracemalloc.get_traced_memory()[1] < 64 << 20
    finally:
        tracemalloc.stop()


class _CountingRead:
    """Counts the bytes an ElfSymbols reads from its file."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bytes = 0
        original = elf_module._Source.read

        def read(source: elf_module._Source, offset: int, size: int) -> bytes:
            data = original(source, offset, size)
            self.bytes += len(data)
            return data
        monkeypatch.setattr(elf_module._Source, "read", read)


def test_a_symbol_table_listed_many_times_is_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file may have one .symtab and one .dynsym; one listing the same 24 KB table 3,000 times asked for 72 MB of
    reads and 3 M symbols (a 1 MB table listed 65,535 times: 2.7 G symbols, the agent out of memory)."""
    path = tmp_path / "repeated"
    write_elf(path, [Symbol(f"f{i}", 0x1000 + 16 * i, 16) for i in range(1000)])
    data = bytearray(path.read_bytes())
    shoff, shnum = elf_module._EHDR.unpack_from(data)[6], elf_module._EHDR.unpack_from(data)[12]
    headers = [bytes(data[shoff + 64 * i:shoff + 64 * (i + 1)]) for i in range(shnum)]
    new_shoff = len(data)
    data += b"".join(headers) + headers[2] * 3000  # section 2 is .symtab (linked to 3, .strtab)
    struct.pack_into("<Q", data, 40, new_shoff)
    struct.pack_into("<H", data, 60, shnum + 3000)
    counter = _CountingRead(monkeypatch)
    elf = ElfSymbols("repeated", image=bytes(data))
    assert elf.symbol_count == 1000 and elf.lookup(0x1000 + 16 * 7 + 3) == ("f7", 3)
    assert counter.bytes < 2 * len(data)


def test_note_segments_are_searched_up_to_a_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """5,000 note segments over the same 60 KiB of notes without a build id: read once, not 300 MB (and 25 M notes
    parsed) as when each segment was read on its own."""
    phnum, notes = 5000, struct.pack("<III", 0, 0, 1) * 5000
    phoff = 64
    notes_offset = phoff + 56 * phnum
    phdr = elf_module._PHDR.pack(elf_module._PT_NOTE, 4, notes_offset, 0, 0, len(notes), len(notes), 4)
    data = _header(phoff=phoff, phentsize=56, phnum=phnum) + phdr * phnum + notes
    counter = _CountingRead(monkeypatch)
    elf = ElfSymbols("notes", image=data)
    assert elf.build_id == "" and counter.bytes <= 64 + 56 * phnum + elf_module._MAX_NOTES_BYTES
    path = tmp_path / "notes"
    path.write_bytes(data)
    counter.bytes = 0
    assert read_build_id(str(path)) == "" and counter.bytes <= 64 + 56 * phnum + elf_module._MAX_NOTES_BYTES


def test_build_ids_of_corrupt_length_are_ignored() -> None:
    def note(desc: bytes) -> bytes:
        return struct.pack("<III", 4, len(desc), 3) + b"GNU\0" + desc + bytes(-len(desc) % 4)
    assert elf_module._build_id(note(bytes(range(20)))) == bytes(range(20)).hex()
    assert elf_module._build_id(note(bytes(1000))) == ""  # a 2,000-character "build id" would name debug files
    assert elf_module._build_id(struct.pack("<III", 4, 0xFFFFFFFF, 3) + b"GNU\0") == ""


@pytest.mark.timeout(60)
def test_a_fifo_in_place_of_a_binary_is_refused_without_waiting(tmp_path: Path) -> None:
    """A process controls what its mapped paths point to by the time the agent opens them: opening a FIFO for
    reading would wait for a writer forever (here: the test's timeout)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ElfError, match="not a regular file"):
        ElfSymbols(str(fifo))
    with pytest.raises(ElfError):
        read_build_id(str(fifo))


def test_symbol_tables_are_read_up_to_a_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Any process may map a file with a table of billions of symbols: past the budget its functions stay unnamed
    (the budget here is 100 entries instead of 5.6 M, the first being the null symbol)."""
    path = tmp_path / "big"
    write_elf(path, [Symbol(f"f{i}", 0x1000 + 16 * i, 16) for i in range(500)])
    monkeypatch.setattr(elf_module, "_MAX_TABLE_BYTES", 100 * elf_module._SYM.size + 7)
    elf = ElfSymbols(str(path))
    assert elf.symbol_count == 99 and elf.lookup(0x1000 + 16 * 98) == ("f98", 0)
    assert elf.lookup(0x1000 + 16 * 99) is None


def test_dynamic_symbol_value_agrees_with_pyelftools_on_every_dynamic_symbol() -> None:
    """The span-context table is found with the agent's own reader (pyelftools costs ~5 MB once imported): data and
    function symbols alike, an import (undefined here) is not a definition."""
    path = "/usr/lib/x86_64-linux-gnu/libc.so.6" if os.path.exists("/usr/lib/x86_64-linux-gnu/libc.so.6") \
        else "/lib/x86_64-linux-gnu/libc.so.6"
    with open(path, "rb") as file:
        dynsym = ELFFile(file).get_section_by_name(".dynsym")
        assert isinstance(dynsym, SymbolTableSection)
        expected: dict[str, int | None] = {}
        for symbol in dynsym.iter_symbols():
            if symbol.name:
                defined = symbol["st_shndx"] != "SHN_UNDEF"
                expected.setdefault(symbol.name, symbol["st_value"] if defined else None)
    assert {"environ", "malloc"} <= set(expected) and len(expected) > 1000  # a data object and functions
    assert {name: elf_module.dynamic_symbol_value(path, name) for name in expected} == expected
    assert elf_module.dynamic_symbol_value(path, "no_such_symbol_anywhere") is None
    assert elf_module.dynamic_symbol_value(path, "_rtld_global") is None  # imported from ld.so: undefined in libc


LIBC = Path("/lib/x86_64-linux-gnu/libc.so.6")
_ALIAS = re.compile(r"_alias_[0-9]+$")


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
def test_an_address_is_named_by_its_best_binding_then_by_a_name_not_made(tmp_path: Path, native: bool) -> None:
    """Global, then weak, then local; among local symbols a name the compiler or linker did not make; then the first.
    Each group lists the name users expect after worse ones, so keeping the first symbol read fails it."""
    groups = [
        [("__libc_start_main_alias_2", STB_LOCAL), ("__libc_start_main_impl", STB_LOCAL),
         ("__libc_start_main@@GLIBC_2.34", STB_GLOBAL), ("__libc_start_main@GLIBC_2.2.5", STB_GLOBAL)],
        [("newlocale", STB_WEAK), ("__newlocale_alias_1", STB_LOCAL), ("__newlocale", STB_GLOBAL)],
        [("abort_alias_3", STB_LOCAL), ("abort", STB_WEAK)],
        [("parse.isra.0", STB_LOCAL), ("parse.constprop.1.isra.0", STB_LOCAL), ("parse", STB_LOCAL)],
        [("run.llvm.8423", STB_LOCAL), ("run.cold", STB_LOCAL), ("run", STB_LOCAL), ("run2", STB_LOCAL)],
        [("first", STB_GLOBAL), ("second", STB_GLOBAL)],  # nothing to choose by: the first read
        [("C1.cold", STB_WEAK), ("C2", STB_WEAK)],  # global and weak names were all exported: the first read
        [("part.0", STB_LOCAL), ("other", STB_LOCAL)],  # "part" is the name here, no suffix
        [("_ZN4core3fmt..cold..Arguments17h0E", STB_LOCAL), ("_ZN4core3fmt9Arguments17h1E", STB_LOCAL)],  # Rust's ::
        [("_ZN4core3fmt..Write9write_str17h2E.llvm.77", STB_LOCAL), ("_ZN4core3fmt..Write9write_str17h2E", STB_LOCAL)],
        [("only.cold", STB_LOCAL)],  # made, but the only name there is
        [("x" * 3000 + "_alias_1", STB_LOCAL), ("x" * 3000, STB_LOCAL)],  # names longer than one read
    ]
    symbols = [Symbol(name, 0x1000 + 0x100 * at, 16, binding=binding)
               for at, group in enumerate(groups) for name, binding in group]
    path = tmp_path / "libaliases.so"
    write_elf(path, symbols)
    elf = ElfSymbols(str(path), native=native)
    names = [name for _start, name in elf.symbols()]
    assert names == ["__libc_start_main", "__newlocale", "abort", "parse", "run", "first", "C1.cold", "part.0",
                     "_ZN4core3fmt..cold..Arguments17h0E", "_ZN4core3fmt..Write9write_str17h2E", "only.cold",
                     "x" * 3000]
    assert names == [name.partition("@")[0] for _start, _end, name in expected_functions(symbols)]
    assert elf.lookup(0x1008) == ("__libc_start_main", 8)


def _global_functions(path: Path) -> Iterator[tuple[str, int, str]]:
    """(table, value, name) of each global function (or IFUNC) defined in the file, as pyelftools reads them."""
    with path.open("rb") as handle:
        for section in ELFFile(handle).iter_sections():
            if not isinstance(section, SymbolTableSection):
                continue
            for symbol in section.iter_symbols():
                info = symbol["st_info"]
                if info["type"] in ("STT_FUNC", "STT_GNU_IFUNC", "STT_LOOS") and info["bind"] == "STB_GLOBAL" and \
                        symbol["st_value"] and symbol["st_shndx"] != "SHN_UNDEF":
                    yield section.name, symbol["st_value"], symbol.name


def _libc_with_debug_symbols(native: bool) -> ElfSymbols:
    """The machine's libc with the .symtab of its separate debug file (libc6-dbg), as the symbolizer reads it."""
    elf = ElfSymbols(str(LIBC), native=native)
    debug = Path("/usr/lib/debug/.build-id", elf.build_id[:2], f"{elf.build_id[2:]}.debug")
    if not debug.exists():
        pytest.skip(f"no debug file for libc ({debug}; install libc6-dbg): .dynsym has no local aliases to avoid")
    elf.add_symbols_from(ElfSymbols(str(debug), native=native))
    return elf


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
def test_libc_exports_are_named_by_a_global_symbol_not_a_local_alias(native: bool) -> None:
    """libc6-dbg's .symtab lists __libc_start_main_alias_2 (local) before __libc_start_main (global) at one
    address: the frames of every exported function are named by a global symbol at its address (pyelftools reads
    the reference: .dynsym's exports and .symtab's globals, their versions cut)."""
    if not LIBC.exists():
        pytest.skip(f"no glibc at {LIBC} on this machine")
    elf = _libc_with_debug_symbols(native)
    globals_at: dict[int, set[str]] = {}
    exported: set[int] = set()
    for path in (LIBC, Path(elf._source.path)):
        for table, value, name in _global_functions(path):
            globals_at.setdefault(value, set()).add(name.partition("@")[0])
            if table == ".dynsym":
                exported.add(value)
    assert len(exported) > 1000
    start_main = elf_module.dynamic_symbol_value(str(LIBC), "__libc_start_main")
    assert start_main is not None and elf.lookup(start_main + 4) == ("__libc_start_main", 4)
    named = {value: (elf.lookup(value) or ("", 0))[0] for value in exported}
    assert not {value: name for value, name in named.items() if _ALIAS.search(name)}
    assert {hex(value): name for value, name in named.items() if name not in globals_at[value]} == {}

# SPDX-License-Identifier: Apache-2.0
"""The native symbol-table reader (libotel_gpu_symtab.so, what the agent reads with) against the Python reference
(ElfSymbols(native=False): _read_symbols + _store, itself checked against pyelftools in test_elf.py): identical
arrays for every shared library of this machine, the largest binaries on it, generated tables with aliases, IFUNCs,
objects and undefined symbols, and corrupt or truncated tables; memory bounded by the functions kept."""

from __future__ import annotations

import os
import random
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from otel_gpu._native import NativeLibrary
from otel_gpu.symbolize import elf as elf_module
from otel_gpu.symbolize import native_symtab
from otel_gpu.symbolize.elf import ElfError, ElfSymbols
from tests.symbolize.elfgen import STB_LOCAL, Symbol, cxx_like_symbols, expected_functions, write_elf

LIBRARIES = Path("/usr/lib/x86_64-linux-gnu")
LARGE = [Path("/usr/lib/x86_64-linux-gnu/libLLVM-15.so.1"), Path("/usr/lib/llvm-14/lib/libclang-cpp.so.14"),
         *sorted(Path("/root/.rustup/toolchains").glob("*/lib/librustc_driver-*.so"))]
DEBUG_FILES = Path("/usr/lib/debug/.build-id")
SYMTAB_SECTION = 2  # elfgen's .symtab section index


def _arrays(elf: ElfSymbols) -> tuple[tuple[str, list[int]], ...]:
    return tuple((found.typecode, found.tolist()) for found in (elf._starts, elf._sizes, elf._name_at))


def _both(path: Path | str, image: bytes | None = None) -> tuple[tuple[object, ...], tuple[object, ...]]:
    """(native, reference) arrays of one file, or (ElfError, ElfError) when neither reads it."""
    found = []
    for native in (True, False):
        try:
            found.append(_arrays(ElfSymbols(str(path), image, native=native)))
        except ElfError:
            found.append(ElfError)
    return found[0], found[1]


@pytest.fixture(autouse=True)
def _library() -> None:
    assert native_symtab.available(), "run `make build`: libotel_gpu_symtab.so is not built"


def test_identical_arrays_for_every_library_of_the_machine() -> None:
    missing = [str(path) for path in LARGE if not path.exists()]
    assert not missing and len(LARGE) >= 3, f"install llvm-15, libclang-cpp14 and rustup's toolchains: {missing}"
    seen: set[tuple[int, int]] = set()
    compared, functions, different = 0, 0, []
    for path in [*sorted(LIBRARIES.glob("*.so*")), *LARGE]:
        found = path.stat()
        if not path.is_file() or (found.st_dev, found.st_ino) in seen:
            continue
        seen.add((found.st_dev, found.st_ino))
        native, reference = _both(path)
        if native != reference:
            different.append(str(path))
        elif reference is not ElfError:
            compared += 1
            functions += len(reference[0][1])  # type: ignore[index]
    assert not different, different
    assert compared > 100 and functions > 200_000, (compared, functions)


def test_identical_arrays_for_a_generated_cxx_library(tmp_path: Path) -> None:
    """Aliases at one address (first name, largest size), IFUNCs, objects, undefined symbols, names past 4 KB, and
    more functions than one chunk: by descriptor and from an in-memory image alike."""
    symbols = cxx_like_symbols(60_000)
    path = tmp_path / "libcxx.so"
    write_elf(path, symbols)
    native, reference = _both(path)
    assert native == reference
    assert len(native[0][1]) == len(expected_functions(symbols))  # type: ignore[index]
    assert _both(path, path.read_bytes())[0] == reference


def test_identical_names_for_a_generated_library_of_mixed_bindings(tmp_path: Path) -> None:
    """Aliases that are global, weak or local, some named with a suffix the compiler makes (.cold, _alias_2): both
    readers name each address alike and as the reference does, by descriptor and from an image."""
    symbols = cxx_like_symbols(60_000, mixed_bindings=True)
    path = tmp_path / "libmixed.so"
    write_elf(path, symbols)
    native, reference = _both(path)
    assert native == reference
    assert _both(path, path.read_bytes())[0] == reference
    expected = expected_functions(symbols)
    assert ElfSymbols(str(path)).symbols() == [(start, name) for start, _end, name in expected]
    first_read: dict[int, str] = {}
    for symbol in symbols:
        first_read.setdefault(symbol.value, symbol.name)
    assert sum(first_read[start] != name for start, _end, name in expected) > 500  # the rule chose, many times


def test_identical_arrays_for_every_debug_file_of_the_machine() -> None:
    """Separate debug files (/usr/lib/debug, e.g. libc6-dbg's) carry .symtab's local aliases and clones: the
    readers choose the same name at every address."""
    files = sorted(path for path in DEBUG_FILES.glob("*/*.debug") if path.is_file())
    if not files:
        pytest.skip(f"no debug files under {DEBUG_FILES} (install libc6-dbg)")
    different = [str(path) for path in files if (found := _both(path))[0] != found[1]]
    assert not different, different


def test_a_global_in_dynsym_names_an_address_over_a_local_in_symtab(tmp_path: Path) -> None:
    """Binding before table: a .dynsym global beats the .symtab local read first; among one binding .symtab's
    symbol is read first."""
    path = tmp_path / "lib.so"
    write_elf(path, [Symbol("f_alias_1", 0x1000, 16, binding=STB_LOCAL), Symbol("g", 0x2000, 16),
                     Symbol("f", 0x1000, 16), Symbol("g2", 0x2000, 16)])
    data = _split_symtab(path.read_bytes(), 3)  # .symtab: null, f_alias_1, g; .dynsym: f, g2
    native, reference = _both("split", data)
    assert native == reference
    assert ElfSymbols("split", data).symbols() == [(0x1000, "f"), (0x2000, "g")]


def test_functions_past_4_gib_keep_8_byte_starts(tmp_path: Path) -> None:
    path = tmp_path / "libhigh.so"
    write_elf(path, [Symbol("low", 0x1000, 16), Symbol("high", (5 << 32) + 0x40, 1 << 33), Symbol("zero", 0, 4)])
    native, reference = _both(path)
    assert native == reference and native[0] == ("Q", [0x1000, (5 << 32) + 0x40])
    assert native[1] == ("I", [16, (1 << 30) - 1])  # a size past 30 bits is clamped


def _with_symtab(path: Path, **fields: int) -> bytes:
    """The file with .symtab's section header fields (offset, size, link) replaced."""
    data = bytearray(path.read_bytes())
    shoff = elf_module._EHDR.unpack_from(data)[6]
    at = shoff + 64 * SYMTAB_SECTION
    for name, value in fields.items():
        struct.pack_into("<Q" if name != "link" else "<I", data, at + {"offset": 24, "size": 32, "link": 40}[name],
                         value)
    return bytes(data)


@pytest.mark.parametrize("fields", [
    {"offset": (1 << 64) - 24},  # past the end of the file (and offset + size past 2**64)
    {"size": (1 << 64) - 24},
    {"size": 24 * 400 + 7},  # not a whole number of entries
    {"size": 24 * 400},  # part of the table only
    {"offset": 0},  # the headers read as symbols
    {"link": 0},  # names in the null section: every name offset past its size
    {"link": 1},  # names in the build-id note
])
def test_identical_arrays_for_corrupt_tables(tmp_path: Path, fields: dict[str, int]) -> None:
    path = tmp_path / "lib.so"
    write_elf(path, [Symbol(f"f{i}", 0x1000 + 16 * (i % 700), 16 + i % 3) for i in range(1000)])
    data = _with_symtab(path, **fields)
    native, reference = _both("corrupt", data)
    assert native == reference
    corrupt = path.with_name("corrupt.so")
    corrupt.write_bytes(data)
    assert _both(corrupt) == (native, reference)


def test_mutated_and_truncated_binaries_read_identically(tmp_path: Path) -> None:
    original = Path("/lib/x86_64-linux-gnu/libc.so.6").read_bytes()
    rng = random.Random(12)
    shoff = elf_module._EHDR.unpack_from(original)[6]
    with_functions = 0
    for _ in range(150):
        data = bytearray(original)
        for _ in range(rng.randrange(1, 16)):  # in the section headers, the tables' offsets and sizes
            data[rng.randrange(shoff, len(data))] = rng.randrange(256)
        if rng.random() < 0.3:
            data = data[:rng.randrange(len(data) // 2, len(data))] + data[shoff:]
            struct.pack_into("<Q", data, 40, len(data) - (len(original) - shoff))
        native, reference = _both("mutant", bytes(data))
        assert native == reference
        with_functions += reference is not ElfError and bool(reference[0][1])  # type: ignore[index]
    assert with_functions > 50, with_functions


def test_a_file_shorter_than_when_opened_keeps_what_was_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file shrinks between fstat and the reads: the table's whole entries read so far are kept (a read ending
    inside an entry keeps none of its chunk), as the Python reader does."""
    path = tmp_path / "lib.so"
    write_elf(path, [Symbol(f"f{i}", 0x1000 + 16 * i, 16) for i in range(1000)])
    data = bytearray(path.read_bytes())
    shoff, symtab = elf_module._EHDR.unpack_from(data)[6], 64 * SYMTAB_SECTION
    table_offset, table_size = struct.unpack_from("<QQ", data, shoff + symtab + 24)
    moved = len(data)  # the table again at the end of the file, where a cut file loses it
    data += data[table_offset:table_offset + table_size]
    struct.pack_into("<Q", data, shoff + symtab + 24, moved)
    real_fstat = os.fstat

    def claimed(fd: int) -> os.stat_result:
        found = list(real_fstat(fd))
        found[6] = len(data)  # st_size as it was
        return os.stat_result(found)

    monkeypatch.setattr(os, "fstat", claimed)
    for cut, functions in ((moved + 24 * 300, 299), (moved + 24 * 300 + 7, 0)):  # the null symbol is no function
        path.write_bytes(data[:cut])
        native, reference = _both(path)
        assert native == reference
        assert len(native[0][1]) == functions  # type: ignore[index]


def _split_symtab(data: bytes, symtab_entries: int) -> bytes:
    """The file with .symtab cut to its first ``symtab_entries`` entries and one more section, a .dynsym over the rest
    (same string table)."""
    data = bytearray(data)
    shoff, shnum = elf_module._EHDR.unpack_from(data)[6], elf_module._EHDR.unpack_from(data)[12]
    headers = data[shoff:shoff + 64 * shnum]
    at = 64 * SYMTAB_SECTION
    offset, size = struct.unpack_from("<QQ", headers, at + 24)
    dynsym = bytearray(headers[at:at + 64])
    struct.pack_into("<I", dynsym, 4, 11)  # SHT_DYNSYM
    struct.pack_into("<QQ", dynsym, 24, offset + 24 * symtab_entries, size - 24 * symtab_entries)
    struct.pack_into("<Q", headers, at + 32, 24 * symtab_entries)
    struct.pack_into("<Q", data, 40, len(data))
    struct.pack_into("<H", data, 60, shnum + 1)
    return bytes(data + headers + dynsym)


def test_symbol_tables_are_read_up_to_the_budget_in_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The budget covers .symtab and .dynsym together: .dynsym gets what .symtab left."""
    path = tmp_path / "big"
    write_elf(path, [Symbol(f"f{i}", 0x1000 + 16 * i, 16) for i in range(1000)])
    data = _split_symtab(path.read_bytes(), 501)  # the null symbol and 500 functions, then 500 more
    assert _both("both", data)[0][0][1] == [0x1000 + 16 * i for i in range(1000)]  # type: ignore[index]
    monkeypatch.setattr(elf_module, "_MAX_TABLE_BYTES", 600 * elf_module._SYM.size + 7)
    native, reference = _both("both", data)
    assert native == reference and len(native[0][1]) == 500 + 99  # type: ignore[index]
    path.write_bytes(data)
    assert _both(path) == (native, reference)


def test_a_table_of_a_partial_entry_is_not_read(tmp_path: Path) -> None:
    """A table size that is not a whole number of entries is a corrupt header: nothing of it is read, even the
    whole chunks before its end."""
    path = tmp_path / "lib.so"
    write_elf(path, [Symbol(f"f{i}", 0x1000 + 16 * i, 16) for i in range(20_000)])  # more than one chunk
    native, reference = _both("partial", _with_symtab(path, size=24 * 20_001 - 1))
    assert native == reference == (("Q", []), ("I", []), ("I", []))


_MEASURE = """
import sys
from otel_gpu.symbolize.elf import ElfSymbols

def status(field):
    with open("/proc/self/status") as lines:
        return next(int(line.split()[1]) for line in lines if line.startswith(field + ":"))

ElfSymbols("/lib/x86_64-linux-gnu/libc.so.6")  # the library loaded, its first allocations made
with open("/proc/self/clear_refs", "w") as clear:
    clear.write("5")  # the resident high-water mark starts again from here
before = status("VmRSS")
elf = ElfSymbols(sys.argv[1], native=sys.argv[2] == "native")
print(elf.symbol_count, status("VmHWM") - before)
"""


def test_native_memory_is_bounded_by_the_functions_kept(tmp_path: Path) -> None:
    """Peak memory (the process's resident high-water mark, which sees native allocations) grows with the functions
    kept, not with the 25 MB of names or the table: 16 bytes per function read, 16 more while one table is sorted."""
    symbols = cxx_like_symbols(150_000)
    path = tmp_path / "libhuge.so"
    write_elf(path, symbols)
    functions = len(expected_functions(symbols))
    names_bytes = sum(len(s.name) + 1 for s in symbols)
    peak_bound = 48 * functions + 1024 * 1024  # the Python reader peaks at ~70 bytes a function
    assert names_bytes > 2 * peak_bound
    out = subprocess.run([sys.executable, "-c", _MEASURE, str(path), "native"], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[2]).stdout.split()
    assert int(out[0]) == functions
    assert int(out[1]) * 1024 < peak_bound, f"peak grew {out[1]} KiB for {functions} functions"


def test_without_the_library_the_python_reader_reads_the_same(monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:
    expected = _arrays(ElfSymbols("/lib/x86_64-linux-gnu/libc.so.6"))
    missing = NativeLibrary(tmp_path / "libotel_gpu_symtab.so", native_symtab._SIGNATURES)
    monkeypatch.setattr(native_symtab, "LIBRARY", missing)
    assert not native_symtab.available()
    assert _arrays(ElfSymbols("/lib/x86_64-linux-gnu/libc.so.6")) == expected

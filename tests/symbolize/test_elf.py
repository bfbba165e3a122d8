# SPDX-License-Identifier: Apache-2.0
"""The ELF reader on real binaries: symbols, build ids and load segments (PIE, non-PIE, stripped, a library)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from otel_gpu.symbolize.elf import ElfError, ElfSymbols, read_build_id
from tests.conftest import NATIVE

WORKLOADS = NATIVE / "workloads"


def _reference(path: Path) -> tuple[dict[str, tuple[int, int]], str]:
    """Function symbols (name -> (value, size)) and build id as pyelftools reads them."""
    with path.open("rb") as handle:
        elf = ELFFile(handle)
        functions = {}
        for section_name in (".symtab", ".dynsym"):
            section = elf.get_section_by_name(section_name)
            if section is None:
                continue
            for symbol in section.iter_symbols():
                if symbol["st_info"]["type"] == "STT_FUNC" and symbol["st_value"]:
                    functions.setdefault(symbol.name, (symbol["st_value"], symbol["st_size"]))
        build_id = ""
        for section in elf.iter_sections():
            if section["sh_type"] == "SHT_NOTE":
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

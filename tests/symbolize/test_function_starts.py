# SPDX-License-Identifier: Apache-2.0
"""Code that no symbol names (static functions of stripped libraries) gets its function's start from .eh_frame_hdr,
checked against every FDE the unwinder's own .eh_frame parser finds; the symbolizer names such frames by it, so the
samples of one static function (SHA-256 in libcrypto, deflate in zlib) are one pprof function."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from otel_gpu.symbolize.elf import ElfSymbols
from otel_gpu.symbolize.maps import read_maps
from otel_gpu.symbolize.symbolizer import Symbolizer
from otel_gpu.unwind.cfi import parse_frames
from otel_gpu.unwind.table import frame_sections
from tests.symbolize.elfgen import Symbol, write_elf

STRIPPED = [Path("/usr/lib/x86_64-linux-gnu/libz.so.1"), Path("/usr/lib/x86_64-linux-gnu/libcrypto.so.3")]


def _fdes(path: Path) -> list[tuple[int, int]]:
    found = frame_sections(str(path))
    assert found is not None and found[0] == ".eh_frame"
    return sorted((fde.start, fde.end) for fde in parse_frames(found[2], found[1], True))


def _static_function(path: Path, elf: ElfSymbols) -> tuple[int, int]:
    """(start, end) of the largest function of ``path`` that no symbol names."""
    unnamed = [(start, end) for start, end in _fdes(path) if elf.lookup(start) is None]
    assert unnamed, f"{path}: every function has a symbol"
    return max(unnamed, key=lambda fde: fde[1] - fde[0])


@pytest.mark.parametrize("path", STRIPPED, ids=lambda path: path.name)
def test_every_fde_gives_its_start_for_each_of_its_addresses(path: Path) -> None:
    elf = ElfSymbols(str(path))
    assert not elf.has_symtab, f"{path} is expected stripped (only .dynsym)"
    fdes = _fdes(path)
    assert len(fdes) > 50
    wrong = [(hex(start), hex(address), elf.function_start(address))
             for start, end in fdes for address in {start, (start + end) // 2, end - 1}
             if elf.function_start(address) != start]
    assert not wrong, wrong[:10]
    # padding between functions: no FDE holds it
    gaps = [end for (_s, end), (next_start, _e) in zip(fdes, fdes[1:], strict=False) if end < next_start]
    assert gaps and all(elf.function_start(gap) is None for gap in gaps)
    assert elf.function_start(fdes[0][0] - 1) is None and elf.function_start(fdes[-1][1]) is None


def test_a_file_without_eh_frame_hdr_has_no_function_starts(tmp_path: Path) -> None:
    path = tmp_path / "libnone.so"
    write_elf(path, [Symbol("f", 0x1000, 0x10)])
    elf = ElfSymbols(str(path))
    assert elf.function_start(0x2000) is None and elf.lookup(0x2000) is None


@pytest.mark.parametrize("path", STRIPPED, ids=lambda path: path.name)
def test_a_static_function_of_a_live_process_is_one_frame_name(path: Path) -> None:
    """Addresses across one static function of a library mapped by a live process share one name, its start's file
    offset; each frame keeps its own address."""
    elf = ElfSymbols(str(path))
    start, end = _static_function(path, elf)
    process = subprocess.Popen([sys.executable, "-c", f"import ctypes, sys; ctypes.CDLL({str(path)!r}); "
                                "print('ready', flush=True); sys.stdin.read()"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        real = os.path.realpath(path)
        start_offset = elf.offset_of(start)
        assert start_offset is not None
        entry = next(e for e in read_maps(process.pid) or [] if e.path == real and e.executable)
        addresses = [entry.start + elf.offset_of(vaddr) - entry.offset  # type: ignore[operator]
                     for vaddr in (start, start + (end - start) // 3, end - 1)]
        (leaves,) = Symbolizer().user_stacks(process.pid, [addresses])
    finally:
        process.kill()
        process.wait()
    assert {frame.function for frame in leaves} == {f"{os.path.basename(real)}+0x{start_offset:x}"}
    assert [frame.address for frame in leaves] == addresses

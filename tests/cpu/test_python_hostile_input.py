# SPDX-License-Identifier: Apache-2.0
"""What a process controls on the way to its Python frames: the files it maps (any name, any bytes in a file named
like libpython), the offsets its _Py_DebugOffsets publish, the line tables of its code objects. None of it may raise
out of discovery or a drain, or give a frame that no encoder would take."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from otel_gpu.cpu import python as module
from otel_gpu.cpu.python import PythonFrames, PythonProcess, _describe, _line_311, elf_symbols, find_python
from otel_gpu.profiles.model import Frame, FrameKind, ProcessProfile, ProfileBatch, Sample, cpu_profile_type
from otel_gpu.profiles.otlp import encode_otlp
from otel_gpu.procfs import ProcessInfo
from tests.symbolize.elfgen import Symbol, write_elf

_SHDR_SIZE = 64


def _corrupt_elf(tmp_path: Path, **fields: int) -> str:
    """A small ELF file named like libpython whose .symtab section header (index 2) has ``fields`` changed
    (``link``: its string table's index; ``size``: the table's size)."""
    path = tmp_path / "libpython3.11.so.1.0"
    write_elf(path, [Symbol("_PyRuntime", 0x1000, 8, kind=1)])
    data = bytearray(path.read_bytes())
    shoff = struct.unpack_from("<Q", data, 40)[0]
    at = shoff + 2 * _SHDR_SIZE
    if "link" in fields:
        struct.pack_into("<I", data, at + 40, fields["link"])
    if "size" in fields:
        struct.pack_into("<Q", data, at + 32, fields["size"])
    if "strtab_size" in fields:
        struct.pack_into("<Q", data, shoff + 3 * _SHDR_SIZE + 32, fields["strtab_size"])
    if "phoff" in fields:
        struct.pack_into("<Q", data, 32, fields["phoff"])
    path.write_bytes(bytes(data))
    return str(path)


@pytest.mark.parametrize("fields", [{"link": 99}, {"strtab_size": 1 << 62}, {"size": 1 << 62},
                                    {"phoff": (1 << 64) - 8}])
def test_a_corrupt_file_named_like_libpython_reads_as_no_symbols(tmp_path: Path, fields: dict[str, int]) -> None:
    """A string-table index past the sections was an IndexError, a table size of exabytes a MemoryError, a program
    header offset near 2**64 a ValueError: none of which discovery caught (IndexError, MemoryError) before."""
    symbols, _base = elf_symbols(_corrupt_elf(tmp_path, **fields), ("_PyRuntime", "PyCode_Type"))
    assert "PyCode_Type" not in symbols


def test_the_good_file_still_reads(tmp_path: Path) -> None:
    assert elf_symbols(_corrupt_elf(tmp_path), ("_PyRuntime",))[0] == {"_PyRuntime": 0x1000}


def test_discovery_of_a_process_mapping_a_corrupt_libpython_returns_nothing(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the drain's own path (a process that exec'd since it was first seen is discovered again inside
    drain()): the corrupt file costs that process's Python frames, never an exception."""
    monkeypatch.setattr(module, "_SYMBOLS_BY_FILE", {})
    path = _corrupt_elf(tmp_path, link=99)
    proc = _fake_proc(tmp_path, f"7f0000000000-7f0000001000 r-xp 00000000 08:02 17 {path}\n".encode())
    assert PythonFrames(str(proc)).discover(4242) is None


def _fake_proc(tmp_path: Path, maps: bytes, pid: int = 4242) -> Path:
    """A /proc tree of one process: its maps, its root (the real one) and, for memory, this test's own."""
    proc = tmp_path / "proc"
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "maps").write_bytes(maps)
    (proc / str(pid) / "root").symlink_to("/")
    (proc / str(pid) / "mem").symlink_to(f"/proc/{os.getpid()}/mem")
    (proc / str(pid) / "exe").symlink_to(os.path.realpath("/proc/self/exe"))
    return proc


def test_a_mapping_with_a_non_utf8_name_does_not_hide_the_interpreter(tmp_path: Path) -> None:
    """Any process may map a file whose name is not UTF-8; the maps file was read as strict UTF-8, so the process's
    Python frames were lost (a UnicodeDecodeError that discovery took for a file changing under it)."""
    own = Path(f"/proc/{os.getpid()}/maps").read_bytes()
    odd = b"7f0000000000-7f0000001000 r--p 00000000 08:02 17 /tmp/caf\xe9/data.bin\n"
    proc = _fake_proc(tmp_path, odd + own)
    found = find_python(4242, str(proc))
    assert isinstance(found, PythonProcess), found


class _Memory:
    """ProcessMemory over a dict of address -> bytes."""

    def __init__(self, blocks: dict[int, bytes]) -> None:
        self._blocks = blocks

    def read(self, address: int, size: int) -> bytes:
        data = self._blocks.get(address, b"")
        return data[:size] if len(data) >= size else b""


def _debug_offsets(**changes: int) -> bytes:
    """A 3.13 _Py_DebugOffsets (71 words) with plausible values, ``changes`` by word index (w35 = code_filename...)."""
    words = [0] * 71
    words[1] = (3 << 24) | (13 << 16)
    for index, value in {5: 16, 9: 8, 21: 8, 23: 72, 24: 144, 29: 0, 30: 16, 31: 56, 33: 70, 35: 112, 36: 120,
                         37: 128, 38: 136, 39: 68, 43: 200, 65: 16, 66: 32, 68: 32, 69: 16, 70: 40}.items():
        words[index] = value
    for name, value in changes.items():
        words[int(name[1:])] = value
    return b"xdebugpy" + struct.pack("<70Q", *words[1:])


def test_debug_offsets_as_published_give_a_layout() -> None:
    found = _describe(1, (3, 13), 0x1000, 0x2000, _Memory({0x1000: _debug_offsets()}))  # type: ignore[arg-type]
    assert isinstance(found, PythonProcess)


@pytest.mark.parametrize("changes", [{"w37": 1 << 40}, {"w70": 1 << 40}, {"w69": 4000}, {"w68": 1 << 63}])
def test_debug_offsets_a_process_overwrote_are_no_layout(changes: dict[str, int]) -> None:
    """A 3.13 process publishes the offsets the reader uses in its own memory: a code_qualname of a terabyte sized a
    read of a terabyte (MemoryError), a str_length past the str header an unpack past the bytes read
    (struct.error), on every drain. Such a layout is taken for an unsupported interpreter instead."""
    found = _describe(1, (3, 13), 0x1000, 0x2000, _Memory({0x1000: _debug_offsets(**changes)}))  # type: ignore[arg-type]
    assert found == "CPython 3.13"


def test_a_line_table_claiming_a_huge_line_gives_line_zero() -> None:
    """A varint of 20 bytes in a code object's location table was a line of 2**120: the frame then failed the whole
    profile batch's encoding (int64 fields)."""
    long_form = 0x80 | (14 << 3)  # a long-form entry of one code unit, then its line delta as a varint
    table = bytes([long_form]) + b"\x7f" * 20 + b"\x3e"
    line = _line_311(table, 1, 0)
    assert 0 <= line < 1 << 31
    frame = Frame("f", FrameKind.PYTHON, filename="x.py", line=line)
    batch = ProfileBatch(type=cpu_profile_type(19), start_unix_nano=1, duration_nano=1, processes=(
        ProcessProfile(ProcessInfo(pid=1, executable_name="x"), (Sample((frame,), 1),)),))
    assert encode_otlp(batch).ByteSize() > 0


def test_the_layouts_of_the_table_fit() -> None:
    """Every layout of python_layouts.h passes the bound on object offsets (a wrong bound would turn off a
    supported version)."""
    assert all(module._object_offsets_fit(layout) for layout in module.load_layouts().values())


# SPDX-License-Identifier: Apache-2.0
"""Finding a process's span context table reads what the process controls: its maps (any path bytes), the
library file it mapped under the library's name (any symbol value) and its memory there. None of it may raise out
of the CPU sampler's drain, which looks for tables on every drain."""

from __future__ import annotations

import ctypes
import os
import struct
from pathlib import Path

import pytest

from otel_gpu.instrumentation import locate
from otel_gpu.instrumentation._table import SYMBOL
from tests.symbolize.elfgen import Symbol, write_elf

pytestmark = pytest.mark.both_paths  # no hooks involved: once is enough

_SHT_DYNSYM = 11


def _library(path: Path, value: int) -> None:
    """A file named like libotel_gpu_context.so whose dynamic symbol table gives the table symbol ``value``."""
    write_elf(path, [Symbol(SYMBOL, value, 64, kind=1)])
    data = bytearray(path.read_bytes())
    shoff = struct.unpack_from("<Q", data, 40)[0]
    struct.pack_into("<I", data, shoff + 2 * 64 + 4, _SHT_DYNSYM)  # its .symtab becomes .dynsym
    path.write_bytes(bytes(data))


def _proc(tmp_path: Path, maps: bytes) -> Path:
    proc = tmp_path / "proc"
    (proc / "42").mkdir(parents=True)
    (proc / "42" / "maps").write_bytes(maps)
    (proc / "42" / "root").symlink_to(tmp_path / "root")
    (proc / "42" / "mem").symlink_to(f"/proc/{os.getpid()}/mem")
    return proc


@pytest.fixture(autouse=True)
def _no_cached_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(locate, "_symbol_values", {})


def test_a_process_that_exits_while_its_table_is_read_has_no_table(tmp_path: Path) -> None:
    """A process that exits after its memory file was opened reads as end of file (the kernel gives 0 bytes once
    its memory is gone; the mem file here is empty, as that read is). The header unpacked from b"" raised
    struct.error, which the sampler does not catch (only OSError and ValueError): the whole CPU drain was lost."""
    (tmp_path / "root").mkdir()
    _library(tmp_path / "root" / "libotel_gpu_context.so", 0x100)
    proc = _proc(tmp_path, b"10000-11000 r--p 00000000 08:02 7 /libotel_gpu_context.so\n")  # a file's seek limits
    (proc / "42" / "mem").unlink()
    (proc / "42" / "mem").write_bytes(b"")
    assert locate.find_span_table(42, proc) is None


@pytest.mark.parametrize("value", [(1 << 63) + 0x1000, (1 << 64) - 8])
def test_a_table_address_past_63_bits_is_no_table(tmp_path: Path, value: int) -> None:
    """The symbol's value is the mapped file's claim: an address no file offset holds was a ValueError from seek."""
    (tmp_path / "root").mkdir()
    _library(tmp_path / "root" / "libotel_gpu_context.so", value)
    proc = _proc(tmp_path, b"7f0000000000-7f0000001000 r--p 00000000 08:02 7 /libotel_gpu_context.so\n")
    assert locate.find_span_table(42, proc) is None


def test_a_non_utf8_path_in_the_maps_does_not_hide_the_table(tmp_path: Path) -> None:
    """The maps were read as UTF-8 text: another mapping's odd name raised UnicodeDecodeError, so the process's
    samples never carried their span ids."""
    header = (ctypes.c_char * 8).from_buffer_copy(struct.pack("<IHH", locate.MAGIC, locate.VERSION, locate.SLOT_SIZE))
    (tmp_path / "root").mkdir()
    _library(tmp_path / "root" / "libotel_gpu_context.so", 0x100)
    start = ctypes.addressof(header) - 0x100
    proc = _proc(tmp_path, b"7f0000000000-7f0000001000 r-xp 00000000 08:02 3 /opt/caf\xe9/x.so\n"
                 + f"{start:x}-{start + 0x1000:x} r--p 00000000 08:02 7 /libotel_gpu_context.so\n".encode())
    assert locate.find_span_table(42, proc) == ctypes.addressof(header)


def test_the_maps_are_read_up_to_the_symbolizers_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process chooses how many mappings it has and how long their paths are: the maps were read whole, at every
    look for the table (each drain, until found). The library's mapping past the cap stays unseen; before it, found."""
    header = (ctypes.c_char * 8).from_buffer_copy(struct.pack("<IHH", locate.MAGIC, locate.VERSION, locate.SLOT_SIZE))
    (tmp_path / "root").mkdir()
    _library(tmp_path / "root" / "libotel_gpu_context.so", 0x100)
    start = ctypes.addressof(header) - 0x100
    filler = b"".join(b"%x-%x rw-p 00000000 00:00 0 \n" % (0x1000 * i, 0x1000 * (i + 1)) for i in range(1, 200))
    table = f"{start:x}-{start + 0x1000:x} r--p 00000000 08:02 7 /libotel_gpu_context.so\n".encode()
    proc = _proc(tmp_path, filler + table)
    monkeypatch.setattr(locate, "MAX_MAPS_BYTES", len(filler))
    assert locate.find_span_table(42, proc) is None
    monkeypatch.setattr(locate, "MAX_MAPS_BYTES", len(filler) + len(table))
    assert locate.find_span_table(42, proc) == ctypes.addressof(header)

# SPDX-License-Identifier: Apache-2.0
"""unwind_rows' 8-byte rows: a 32-bit pc (the offset from the table's first pc, which the mapping's bias includes)
and a 32-bit rule. Offsets a packed rule holds come back exact from both builders; wider ones become UNSUPPORTED
(never a truncated, wrong rule); a file whose code spans 4 GiB or more gets no table, counted, and is walked by
frame pointer."""

from __future__ import annotations

import ctypes
import struct
import subprocess
import time
from array import array
from pathlib import Path

import pytest

from otel_gpu.cpu.sampler import DEFAULT_UNWIND_ROWS, CPUSampler
from otel_gpu.ebpf import abi
from otel_gpu.unwind import cfi, native_table
from otel_gpu.unwind.table import (CFA_OFFSETS, KIND_NONE, KIND_RSP, KIND_UNSUPPORTED, RBP_OFFSETS, frame_sections,
                                   unpack_rule)
from tests.unwind.test_native_stacks import _registered, _warm

LIBC = Path("/lib/x86_64-linux-gnu/libc.so.6")


def _uleb(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _debug_frame(fdes: list[tuple[int, int, int, int]]) -> bytes:
    """A .debug_frame: one CIE (CFA = rsp + 8, return address at CFA-8, data alignment -8) and per (start, span,
    cfa_offset, rbp_slot) an FDE whose rule from start on is CFA = rsp + cfa_offset, rbp saved at CFA - 8 * rbp_slot."""
    cie_body = struct.pack("<IB", 0xFFFFFFFF, 1) + b"\x00" + b"\x01\x78\x10" + b"\x0c\x07\x08\x90\x01"
    section = struct.pack("<I", len(cie_body)) + cie_body
    for start, span, cfa_offset, rbp_slot in fdes:
        body = struct.pack("<IQQ", 0, start, span) + b"\x0e" + _uleb(cfa_offset) + b"\x86" + _uleb(rbp_slot)
        section += struct.pack("<I", len(body)) + body
    return section


def _rules(section: bytes) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
    """The unpacked rules of the reference's table and the native builder's."""
    reference = cfi.table_from_fdes(cfi.parse_frames(section, 0, False), "")
    _, native = native_table.build_rows(section, 0, False)
    return [unpack_rule(rule) for rule in reference.rules], [unpack_rule(rule) for rule in native]


def test_offsets_a_rule_holds_are_exact_and_wider_ones_are_unsupported() -> None:
    widest_cfa, widest_rbp = CFA_OFFSETS.stop - 8, RBP_OFFSETS.start  # the largest CFA offset, the lowest saved rbp
    section = _debug_frame([(0x1000, 0x10, widest_cfa, -widest_rbp // 8),
                            (0x2000, 0x10, CFA_OFFSETS.stop, 2),  # a frame of 1 MiB: CFA offset one past the field
                            (0x3000, 0x10, 16, -widest_rbp // 8 + 1)])  # rbp saved 136 below the CFA
    reference, native = _rules(section)
    assert native == reference
    assert reference == [(KIND_RSP, widest_cfa, widest_rbp), (KIND_NONE, 0, 0), (KIND_UNSUPPORTED, 0, 0),
                         (KIND_NONE, 0, 0), (KIND_UNSUPPORTED, 0, 0), (KIND_NONE, 0, 0)]


def test_rows_are_8_byte_offsets_from_the_table_base() -> None:
    """What the agent writes into unwind_rows is libc's table: each pc less the first, and its rule; the default
    2 Mi rows take 16 MiB."""
    found = frame_sections(str(LIBC))
    assert found is not None
    section, vaddr, data = found
    with native_table.parse(data, vaddr, section == ".eh_frame") as rows:
        pcs, rules = rows.arrays()
        memory = (abi.UnwindRow * rows.count)()
        assert rows.fits_rows()
        rows.write_rows(ctypes.addressof(memory))
        base, span = rows.base, rows.span
    written = array("I", bytes(memory))
    assert len(pcs) > 10_000 and base == pcs[0] and span == pcs[-1] - pcs[0]
    assert list(written[0::2]) == [pc - base for pc in pcs] and written[1::2] == rules
    assert ctypes.sizeof(abi.UnwindRow) * DEFAULT_UNWIND_ROWS == 16 << 20


def test_a_section_spanning_4_gib_is_not_written() -> None:
    with native_table.parse(_debug_frame([(0x1000, 0x10, 16, 2), (0x1000 + (1 << 32), 0x10, 16, 2)]), 0,
                            False) as rows:
        assert rows.count == 4 and rows.span == (1 << 32) + 0x10 and not rows.fits_rows()
        memory = (abi.UnwindRow * rows.count)()
        with pytest.raises(ValueError, match="32-bit"):
            rows.write_rows(ctypes.addressof(memory))
        assert bytes(memory) == bytes(len(memory) * ctypes.sizeof(abi.UnwindRow))
    with native_table.parse(_debug_frame([(0x1000, 0x10, 16, 2), (0xFFFF_F000, 0x10, 16, 2)]), 0, False) as rows:
        assert rows.fits_rows()


FAR = """
__attribute__((noinline)) int near_fn(int x) { volatile int y = x; return y + 1; }
__attribute__((noinline, section(".far"))) int far_fn(int x) { volatile int y = x; return y * 3; }
int main(int c, char **v) { (void)v; for (;;) c = near_fn(far_fn(c)); return c; }
"""


@pytest.mark.root
@pytest.mark.usefixtures("other_agent")
def test_a_program_whose_code_spans_4_gib_is_counted_and_walked_by_frame_pointer(tmp_path: Path) -> None:
    """A program with code 8 GiB above its .text (.debug_frame: absolute addresses) gets no table; it is counted as
    too large, and the process is still registered and sampled."""
    source, program = tmp_path / "far.c", tmp_path / "far"
    source.write_text(FAR)
    subprocess.run(["gcc", "-O2", "-fomit-frame-pointer", "-no-pie", "-mcmodel=large",
                    "-fno-asynchronous-unwind-tables", "-fno-unwind-tables", "-g", "-o", str(program), str(source),
                    "-Wl,--section-start=.far=0x200001000"], check=True)
    subprocess.run(["objcopy", "--remove-section=.eh_frame", "--remove-section=.eh_frame_hdr", str(program)],
                   check=True)
    process = subprocess.Popen([str(program)])
    sampler = CPUSampler(99, pids=[process.pid])
    sampler.open()
    try:
        _registered(sampler)
        _warm(sampler)
        samples, deadline = 0, time.monotonic() + 30
        while samples < 20 and time.monotonic() < deadline:
            time.sleep(0.25)
            samples += sum(count.count for count in sampler.drain() if count.user_stack)
        stats = sampler.stats()
    finally:
        sampler.close()
        process.kill()
        process.wait()
    assert stats["unwind_processes"] == 1 and stats["unwind_files_too_large"] == 1, stats
    assert samples >= 20 and stats["unwind_files"] >= 1, (samples, stats)  # libc's table is in; the program's is not

# SPDX-License-Identifier: Apache-2.0
"""A process's maps as the unwinder reads them to register it: the paths are the process's choice (any bytes)."""

from __future__ import annotations

from pathlib import Path

from otel_gpu.unwind.processes import executable_mappings


def test_a_non_utf8_file_name_does_not_cost_the_process_its_registration(tmp_path: Path) -> None:
    """The maps were read as UTF-8 text: one mapped file whose name is not UTF-8 raised UnicodeDecodeError, and the
    process was never registered (all of it walked by frame pointer)."""
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "maps").write_bytes(
        b"55d0c0000000-55d0c0001000 r-xp 00001000 08:02 11 /usr/bin/prog\n"
        b"7f0000000000-7f0000001000 r-xp 00000000 08:02 12 /opt/caf\xe9/libx.so\n"
        b"7f0000002000-7f0000003000 r-xp 00000000 08:02 13 /opt/a\rb/liby.so (deleted)\n"
        b"7fff00000000-7fff00002000 r-xp 00000000 00:00 0 [vdso]\n"
        b"7fff00002000-7fff00003000 rw-p 00000000 00:00 0 [stack]\n")
    found = executable_mappings(42, str(tmp_path))
    assert [m.start for m in found] == [0x55D0C0000000, 0x7F0000000000, 0x7F0000002000, 0x7FFF00000000]
    assert found[1].path.encode("utf-8", "surrogateescape") == b"/opt/caf\xe9/libx.so"
    assert found[0].offset == 0x1000 and found[3].path == "[vdso]"


def test_a_huge_header_entry_size_reads_no_header_table() -> None:
    """Header entry sizes come from the file: 65,535 entries of 65,535 bytes asked for ~4 GiB of headers at once."""
    from otel_gpu.unwind import table

    fields = [0] * 14
    fields[0] = b"\x7fELF\x02\x01\x01" + bytes(9)  # e_ident: 64-bit little-endian
    fields[5], fields[6] = 64, 64  # phoff, shoff
    fields[9], fields[10] = 0xFFFF, 0xFFFE  # phentsize, phnum
    fields[11], fields[12], fields[13] = 0xFFFF, 0xFFFF, 1  # shentsize, shnum, shstrndx
    header = table._EHDR.pack(*fields)
    asked: list[int] = []

    def read(offset: int, size: int) -> bytes:
        asked.append(size)
        return header[offset:offset + size] if offset < len(header) else b""

    assert table._find_frame_section(read, "crafted") == (None, ())
    assert max(asked) <= 1 << 20, asked

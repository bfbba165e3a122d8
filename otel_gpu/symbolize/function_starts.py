# SPDX-License-Identifier: Apache-2.0
"""The start of the function that holds an address, for code no symbol names: static functions of a stripped library
(libcrypto's SHA-256, zlib's deflate loops), so its samples group per function instead of per address.

Every function that can be unwound through has an FDE in ``.eh_frame``, and ``.eh_frame_hdr`` (the PT_GNU_EH_FRAME
segment, kept by ``strip``) lists every FDE's start, sorted, for the unwinder's binary search. The search here reads
that table in place with ``pread`` (about log2(FDEs / 512) reads of 8 bytes, then one of 4 KiB) and checks the
address is inside the FDE's range (read from the FDE and its CIE's pointer encoding), so nothing per function is kept
in memory: a frame built from it is cached by the symbolizer anyway.
"""

from __future__ import annotations

import bisect
import struct
from array import array
from collections.abc import Callable

from otel_gpu.unwind.dwarf import FIXED_POINTERS, U32, CfiError, read_cie

_Read = Callable[[int, int], bytes]
_OffsetOf = Callable[[int], int | None]  # link-time address -> file offset

_ENTRY = struct.Struct("<ii")  # (initial location, FDE address), each relative to .eh_frame_hdr (array "i" pairs)
_DATAREL_SDATA4 = 0x3B  # the table encoding every linker writes
_OMIT = 0xFF
_SLICE_ENTRIES = 512  # a range of the table this small is read at once (4 KiB) and searched in memory
_MAX_CIE_BYTES = 256  # a CIE's header, augmentation included; longer ones are not read
_MAX_CIES = 64  # CIE encodings remembered per file (libraries have one to a few)


class FunctionStarts:
    """Binary search of one file's ``.eh_frame_hdr`` table, read in place."""

    def __init__(self, read: _Read, offset_of: _OffsetOf, header_vaddr: int, header_size: int) -> None:
        """``read`` reads the file at a file offset, ``offset_of`` maps link-time addresses to file offsets, and
        [header_vaddr, header_vaddr + header_size) is the PT_GNU_EH_FRAME segment. Raises ValueError when the table is
        missing, unsorted-by-design (an encoding linkers do not write) or outside the file."""
        self._read = read
        self._offset_of = offset_of
        self._base = header_vaddr
        offset = offset_of(header_vaddr)
        header = read(offset, 4) if offset is not None else b""
        if len(header) < 4 or header[0] != 1 or header[3] != _DATAREL_SDATA4:
            raise ValueError("no .eh_frame_hdr search table")
        pointer_size = _fixed_size(header[1]) if header[1] != _OMIT else 0
        count_size = _fixed_size(header[2])
        if pointer_size is None or count_size not in (4, 8):
            raise ValueError(f".eh_frame_hdr encodings {header[1]:#x}, {header[2]:#x}")
        assert offset is not None
        count_at = offset + 4 + pointer_size
        count = int.from_bytes(read(count_at, count_size), "little")
        self._table = count_at + count_size  # file offset of the first entry
        self.count = min(count, max(0, header_size - (self._table - offset)) // _ENTRY.size)
        self._cies: dict[int, int | None] = {}  # CIE file offset -> size of its FDEs' pc fields (None: unknown)

    def start_of(self, vaddr: int) -> int | None:
        """The link-time start of the FDE whose range holds ``vaddr``, None when none does; raises OSError."""
        low, high = 0, self.count  # the answer is the last entry at or below vaddr, in [low, high)
        relative = vaddr - self._base
        while high - low > _SLICE_ENTRIES:
            middle = (low + high) // 2
            data = self._read(self._table + middle * _ENTRY.size, _ENTRY.size)
            if len(data) < _ENTRY.size:
                return None
            if _ENTRY.unpack(data)[0] <= relative:
                low = middle
            else:
                high = middle
        data = self._read(self._table + low * _ENTRY.size, (high - low) * _ENTRY.size)
        entries = array("i")
        entries.frombytes(data[:len(data) // _ENTRY.size * _ENTRY.size])
        index = bisect.bisect_right(entries[0::2], relative) - 1  # the initial locations
        if index < 0:
            return None
        start, fde = entries[2 * index], entries[2 * index + 1]
        span = self._span(self._base + fde)
        if span is None or not start <= relative < start + span:
            return None
        return self._base + start

    def _span(self, fde_vaddr: int) -> int | None:
        """The pc range of the FDE at ``fde_vaddr``, None when it cannot be read."""
        offset = self._offset_of(fde_vaddr)
        if offset is None:
            return None
        head = self._read(offset, 8)
        if len(head) < 8:
            return None
        length, cie_pointer = struct.unpack("<II", head)
        if length == 0xFFFFFFFF or not cie_pointer:  # a 64-bit length (no linker writes one here), or a CIE
            return None
        cie = offset + 4 - cie_pointer
        size = self._cies.get(cie, -1)
        if size == -1:
            size = _pc_size(self._read(cie, _MAX_CIE_BYTES))
            if len(self._cies) < _MAX_CIES:
                self._cies[cie] = size
        if size is None:
            return None
        found = self._read(offset + 8 + size, size)
        return int.from_bytes(found, "little") if len(found) == size else None


def _fixed_size(encoding: int) -> int | None:
    """The size of a DW_EH_PE pointer of a fixed size (the low nibble of ``encoding``), None for LEB128 forms."""
    fixed = FIXED_POINTERS.get(encoding & 0x0F)
    return fixed.size if fixed is not None else None


def _pc_size(cie: bytes) -> int | None:
    """The byte size of the pc fields of FDEs whose CIE is ``cie`` (its 'R' augmentation; 8 without one), None when
    the CIE is not one this reader understands."""
    try:
        if U32.unpack_from(cie, 4)[0] != 0:  # a CIE's id is 0 in .eh_frame
            return None
        encoding = read_cie(cie, 8, min(len(cie), 4 + U32.unpack_from(cie, 0)[0]), True).fde_encoding
    except (CfiError, IndexError, ValueError, struct.error):
        return None
    return _fixed_size(encoding)

# SPDX-License-Identifier: Apache-2.0
"""The DWARF encodings the call frame information is written in: LEB128 numbers, DW_EH_PE pointers and a CIE's
header. A leaf (no project imports), shared by the CFI interpreter (:mod:`otel_gpu.unwind.cfi`) and the
``.eh_frame_hdr`` search that names stripped functions (:mod:`otel_gpu.symbolize.function_starts`), which the ELF
reader imports before :mod:`otel_gpu.unwind` can be.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

U16 = struct.Struct("<H")
U32 = struct.Struct("<I")
U64 = struct.Struct("<Q")
# DW_EH_PE value formats of a fixed size: absptr, udata2/4/8, sdata2/4/8 (uleb128 0x01 and sleb128 0x09 aside)
FIXED_POINTERS = {0x00: U64, 0x02: U16, 0x03: U32, 0x04: U64, 0x0A: struct.Struct("<h"), 0x0B: struct.Struct("<i"),
                  0x0C: struct.Struct("<q")}


class CfiError(ValueError):
    """Call frame information this interpreter cannot read."""


@dataclass(slots=True)
class Cie:
    code_align: int
    data_align: int
    ra_reg: int
    fde_encoding: int
    lsda_encoding: int
    has_augmentation_data: bool
    initial: bytes
    address_size: int


def uleb(data: bytes, pos: int) -> tuple[int, int]:
    """The unsigned LEB128 number at ``pos`` and the position after it."""
    result = 0
    shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 70:
            raise CfiError("LEB128 too long")


def sleb(data: bytes, pos: int) -> tuple[int, int]:
    """The signed LEB128 number at ``pos`` and the position after it."""
    result = 0
    shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            if byte & 0x40:
                result -= 1 << shift
            return result, pos
        if shift > 70:
            raise CfiError("LEB128 too long")


def pointer(data: bytes, pos: int, encoding: int, section_vaddr: int) -> tuple[int, int]:
    """Decode a DW_EH_PE-encoded pointer at ``pos``; returns (value, next position)."""
    if encoding == 0xFF:
        return 0, pos
    form = encoding & 0x0F
    start = pos
    if form == 0x01:
        value, pos = uleb(data, pos)
    elif form == 0x09:
        value, pos = sleb(data, pos)
    elif form in FIXED_POINTERS:
        fixed = FIXED_POINTERS[form]
        value = fixed.unpack_from(data, pos)[0]
        pos += fixed.size
    else:
        raise CfiError(f"pointer encoding {encoding:#x}")
    application = encoding & 0x70
    if application == 0x10:  # pcrel
        value += section_vaddr + start
    elif application not in (0x00,):  # textrel/datarel/funcrel/aligned: not used for FDE ranges on x86-64
        raise CfiError(f"pointer application {encoding:#x}")
    return value & 0xFFFFFFFFFFFFFFFF, pos


def read_cie(data: bytes, pos: int, end: int, is_eh: bool) -> Cie:
    """The CIE whose version byte is at ``pos`` (after its length and id) and that ends at ``end``; ``is_eh``: from
    ``.eh_frame`` (else ``.debug_frame``). Raises CfiError, IndexError or ValueError on what it cannot read."""
    version = data[pos]
    pos += 1
    nul = data.index(b"\0", pos, end)
    augmentation = data[pos:nul].decode("ascii", "replace")
    pos = nul + 1
    address_size = 8
    if not is_eh and version >= 4:
        address_size = data[pos]
        pos += 2  # address_size, segment_selector_size
    code_align, pos = uleb(data, pos)
    data_align, pos = sleb(data, pos)
    if version == 1:
        ra_reg = data[pos]
        pos += 1
    else:
        ra_reg, pos = uleb(data, pos)
    fde_encoding = 0x00  # absolute 8-byte addresses unless the augmentation says otherwise
    lsda_encoding = 0xFF
    has_aug = augmentation.startswith("z")
    if has_aug:
        aug_len, pos = uleb(data, pos)
        aug_end = pos + aug_len
        for letter in augmentation[1:]:
            if letter == "R":
                fde_encoding = data[pos]
                pos += 1
            elif letter == "L":
                lsda_encoding = data[pos]
                pos += 1
            elif letter == "P":
                personality_encoding = data[pos]
                pos += 1
                _, pos = pointer(data, pos, personality_encoding & 0x7F, 0)
            elif letter in "SB":
                continue
            else:
                break
        pos = aug_end
    elif augmentation not in ("",):
        raise CfiError(f"CIE augmentation {augmentation!r}")
    return Cie(code_align, data_align, ra_reg, fde_encoding, lsda_encoding, has_aug, data[pos:end], address_size)

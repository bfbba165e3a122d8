# SPDX-License-Identifier: Apache-2.0
"""Call frame information drawn opcode by opcode: .eh_frame sections for differential tests and fuzz seeds."""

from __future__ import annotations

import random
import subprocess
from pathlib import Path


def _leb(generator: random.Random, signed: bool = False) -> bytes:
    """A LEB128 of 1 to 12 bytes (the interpreters stop past 11), small values most often."""
    length = generator.choice((1, 1, 1, 2, 3, 9, 10, 11, 12))
    body = [generator.randrange(128) for _ in range(length)]
    if length == 1 and not signed:
        body[0] = generator.choice((0, 1, 8, 16, 63, 127, generator.randrange(128)))
    return bytes([byte | 0x80 for byte in body[:-1]] + [body[-1]])


_OPERANDS = {  # opcode -> operands: u (ULEB128), s (SLEB128), 1/2/4 (fixed bytes), e (a ULEB length then bytes)
    0x00: "", 0x01: "4", 0x02: "1", 0x03: "2", 0x04: "4", 0x05: "uu", 0x06: "u", 0x07: "u", 0x08: "u", 0x09: "uu",
    0x0A: "", 0x0B: "", 0x0C: "uu", 0x0D: "u", 0x0E: "u", 0x0F: "e", 0x10: "ue", 0x11: "us", 0x12: "us", 0x13: "s",
    0x14: "uu", 0x15: "us", 0x16: "ue", 0x2E: "u", 0x2F: "uu"}


def _instructions(generator: random.Random, count: int) -> bytes:
    out = bytearray()
    for _ in range(count):
        kind = generator.random()
        if kind < 0.25:
            out.append(0x40 | generator.randrange(64))  # advance_loc
        elif kind < 0.4:
            out.append(0x80 | generator.choice((6, 16, 7, generator.randrange(64))))  # offset
            out += _leb(generator)
        elif kind < 0.45:
            out.append(0xC0 | generator.choice((6, 16, generator.randrange(64))))  # restore
        else:
            op = generator.choice(list(_OPERANDS) + [generator.randrange(256)])
            out.append(op)
            for operand in _OPERANDS.get(op, ""):
                if operand in "us":
                    out += _leb(generator, operand == "s") if generator.random() < 0.3 else \
                        bytes([generator.choice((6, 7, 16, 8, 0x78, 0x7F, 3))])
                elif operand == "e":
                    length = generator.randrange(4)
                    out += bytes([length]) + bytes(generator.randrange(256) for _ in range(length))
                else:
                    out += bytes(generator.randrange(256) for _ in range(int(operand)))
    return bytes(out)


def _entry(body: bytes) -> bytes:
    return len(body).to_bytes(4, "little") + body


def synthetic_section(generator: random.Random, vaddr: int) -> bytes:
    """One CIE (code and data alignment, return-address column, pointer encoding all drawn) and FDEs whose
    instructions are drawn opcode by opcode, so that every rule and every long operand is reached."""
    encoding = generator.choice((0x1B, 0x1B, 0x03, 0x0B, 0x00, 0x04, 0x0C, 0x01, 0x09, 0x02, 0x0A, 0x9B, 0x30, 0xFF))
    code_align = generator.choice((b"\x01", b"\x01", b"\x04", _leb(generator)))
    data_align = generator.choice((b"\x78", b"\x78", b"\x7c", _leb(generator, True)))
    ra = generator.choice((b"\x10", b"\x10", b"\x06", _leb(generator)))
    cie = _entry(b"\0\0\0\0\x03zR\0" + code_align + data_align + ra + b"\x01" + bytes([encoding])
                 + b"\x0c\x07\x08\x90\x01" + _instructions(generator, generator.randrange(3)))
    section = bytearray(cie)
    for _ in range(generator.randrange(1, 6)):
        at = len(section)
        pointer = (at + 4).to_bytes(4, "little")  # back to the CIE at 0
        start = generator.choice((0x1000, 0x1040, 0x2000, 0xFFFFFFFF, 0)) - (vaddr + at + 8 if encoding & 0x70 else 0)
        span = generator.choice((0x40, 0x100, 0x10, 0, 0xFFFFFFFFFFFF))
        width = {0x03: 4, 0x0B: 4, 0x02: 2, 0x0A: 2}.get(encoding & 0x0F, 8)
        fields = (start % (1 << (8 * width))).to_bytes(width, "little") + \
            (span % (1 << (8 * width))).to_bytes(width, "little") if encoding & 0x0F not in (0x01, 0x09) else \
            _leb(generator) + _leb(generator)
        section += _entry(pointer + fields + b"\0" + _instructions(generator, generator.randrange(1, 40)))
    return bytes(section) + b"\0\0\0\0"


def debug_frame_binary(folder: Path) -> Path:
    """A small C program built with its call frame information in .debug_frame only (.eh_frame removed)."""
    source = folder / "f.c"
    source.write_text("int g(int x) { volatile int y[16]; y[0] = x; return y[0] + 1; }\n"
                      "int main(int c, char **v) { (void)v; return g(c); }\n")
    binary = folder / "f"
    subprocess.run(["gcc", "-O2", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables", "-g", "-o", str(binary),
                    str(source)], check=True)
    subprocess.run(["objcopy", "--remove-section=.eh_frame", "--remove-section=.eh_frame_hdr", str(binary)],
                   check=True)
    return binary

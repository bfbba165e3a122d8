# SPDX-License-Identifier: Apache-2.0
"""A DWARF call-frame-information interpreter for x86-64: reads ``.eh_frame`` or ``.debug_frame`` bytes and yields,
per FDE, the rows of its unwind table (the rule for the CFA, for the saved rbp and for the return address at each
pc where one of them changes). Only what a stack walker needs is kept; other registers' rules are skipped.

Everything is bounded by the section's length: a corrupt length, pointer or LEB128 ends the FDE (or the section),
never reads past it. Pure: no I/O (:mod:`otel_gpu.unwind.table` reads the ELF file).

The reference interpreter: the agent builds its tables with the native builder (``native/cfi_table.c``, through
:mod:`otel_gpu.unwind.native_table`), and the tests hold that builder to this module's tables
(:func:`table_from_fdes`) on the machine's shared libraries and on fuzzed sections. This one is kept readable
rather than fast (~0.3 CPU-s per 100,000 rows) and is checked row by row against binutils' readelf.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from otel_gpu.unwind.dwarf import U16, U32, U64, Cie, CfiError, pointer, read_cie, sleb, uleb
from otel_gpu.unwind.table import (CFA_OFFSETS, KIND_END, KIND_NONE, KIND_RBP, KIND_RSP, KIND_UNSUPPORTED,
                                   RBP_OFFSETS, UnwindTable, pack_rule)

RSP = 7  # DWARF register numbers on x86-64
RBP = 6
RA = 16

# CFA rule kinds
CFA_REG = 0  # CFA = register + offset
CFA_EXPR = 1  # DW_CFA_def_cfa_expression: not evaluated

# Register rule kinds (for rbp and the return address)
SAME = 0  # unchanged from the caller (also "undefined" for rbp: the default rule)
OFFSET = 1  # saved at CFA + offset
UNDEFINED = 2  # for the return address: the outermost frame
OTHER = 3  # in another register, val_offset, an expression: not followed

_MAX_STATE_STACK = 64  # remember_state nesting; deeper is corrupt


@dataclass(frozen=True, slots=True)
class Row:
    """The unwind rules from ``pc`` on (until the next row or the end of the FDE).

    ``cfa_reg``/``cfa_offset``: CFA = reg + offset when ``cfa_kind`` is CFA_REG. ``rbp``/``ra``: (kind, offset)."""

    pc: int
    cfa_kind: int
    cfa_reg: int
    cfa_offset: int
    rbp_kind: int
    rbp_offset: int
    ra_kind: int
    ra_offset: int


@dataclass(frozen=True, slots=True)
class Fde:
    start: int  # link-time virtual address
    end: int
    rows: list[Row]


class _State:
    __slots__ = ("cfa_kind", "cfa_reg", "cfa_offset", "rbp", "ra")

    def __init__(self) -> None:
        self.cfa_kind = CFA_REG
        self.cfa_reg = RSP
        self.cfa_offset = 8
        self.rbp = (SAME, 0)
        self.ra = (SAME, 0)

    def copy(self) -> _State:
        other = _State()
        other.cfa_kind, other.cfa_reg, other.cfa_offset = self.cfa_kind, self.cfa_reg, self.cfa_offset
        other.rbp, other.ra = self.rbp, self.ra
        return other

    def row(self, pc: int) -> Row:
        return Row(pc, self.cfa_kind, self.cfa_reg, self.cfa_offset, self.rbp[0], self.rbp[1], self.ra[0], self.ra[1])


def _execute(code: bytes, cie: Cie, state: _State, initial: _State | None, pc: int, rows: list[Row],
             section_vaddr: int) -> int:
    """Run CFA instructions from ``state`` at ``pc``; appends a row each time the location advances (the row of the
    rules before the advance). ``initial`` is the CIE's state (what DW_CFA_restore goes back to); ``section_vaddr``
    is the link-time address of ``code[0]`` (for pc-relative DW_CFA_set_loc). Returns the final pc."""
    pos = 0
    n = len(code)
    stack: list[_State] = []
    data_align = cie.data_align
    code_align = cie.code_align
    ra_reg = cie.ra_reg

    def set_reg(reg: int, rule: tuple[int, int]) -> None:
        if reg == RBP:
            state.rbp = rule
        elif reg == ra_reg:
            state.ra = rule

    def restore(reg: int) -> None:
        base = initial if initial is not None else _State()
        if reg == RBP:
            state.rbp = base.rbp
        elif reg == ra_reg:
            state.ra = base.ra

    def advance(new_pc: int) -> None:
        nonlocal pc
        if new_pc != pc:
            if rows and rows[-1].pc == pc:
                rows[-1] = state.row(pc)
            else:
                rows.append(state.row(pc))
        pc = new_pc

    while pos < n:
        op = code[pos]
        pos += 1
        high = op & 0xC0
        low = op & 0x3F
        if high == 0x40:  # advance_loc
            advance(pc + low * code_align)
        elif high == 0x80:  # offset
            value, pos = uleb(code, pos)
            set_reg(low, (OFFSET, value * data_align))
        elif high == 0xC0:  # restore
            restore(low)
        elif op == 0x00:  # nop
            continue
        elif op == 0x01:  # set_loc
            new_pc, pos = pointer(code, pos, cie.fde_encoding, section_vaddr)
            advance(new_pc)
        elif op == 0x02:
            advance(pc + code[pos] * code_align)
            pos += 1
        elif op == 0x03:
            advance(pc + U16.unpack_from(code, pos)[0] * code_align)
            pos += 2
        elif op == 0x04:
            advance(pc + U32.unpack_from(code, pos)[0] * code_align)
            pos += 4
        elif op == 0x05:  # offset_extended
            reg, pos = uleb(code, pos)
            value, pos = uleb(code, pos)
            set_reg(reg, (OFFSET, value * data_align))
        elif op == 0x06:  # restore_extended
            reg, pos = uleb(code, pos)
            restore(reg)
        elif op == 0x07:  # undefined
            reg, pos = uleb(code, pos)
            set_reg(reg, (UNDEFINED, 0) if reg == ra_reg else (SAME, 0))
        elif op == 0x08:  # same_value
            reg, pos = uleb(code, pos)
            set_reg(reg, (SAME, 0))
        elif op == 0x09:  # register
            reg, pos = uleb(code, pos)
            _, pos = uleb(code, pos)
            set_reg(reg, (OTHER, 0))
        elif op == 0x0A:  # remember_state
            if len(stack) >= _MAX_STATE_STACK:
                raise CfiError("remember_state nested too deep")
            stack.append(state.copy())
        elif op == 0x0B:  # restore_state
            if not stack:
                raise CfiError("restore_state without remember_state")
            saved = stack.pop()
            # the CFA rule is restored too (DWARF 5 says every rule; GCC and readelf agree)
            state.cfa_kind, state.cfa_reg, state.cfa_offset = saved.cfa_kind, saved.cfa_reg, saved.cfa_offset
            state.rbp, state.ra = saved.rbp, saved.ra
        elif op == 0x0C:  # def_cfa
            state.cfa_reg, pos = uleb(code, pos)
            state.cfa_offset, pos = uleb(code, pos)
            state.cfa_kind = CFA_REG
        elif op == 0x0D:  # def_cfa_register
            state.cfa_reg, pos = uleb(code, pos)
            state.cfa_kind = CFA_REG
        elif op == 0x0E:  # def_cfa_offset
            state.cfa_offset, pos = uleb(code, pos)
        elif op == 0x0F:  # def_cfa_expression
            length, pos = uleb(code, pos)
            pos += length
            state.cfa_kind = CFA_EXPR
        elif op == 0x10:  # expression
            reg, pos = uleb(code, pos)
            length, pos = uleb(code, pos)
            pos += length
            set_reg(reg, (OTHER, 0))
        elif op == 0x11:  # offset_extended_sf
            reg, pos = uleb(code, pos)
            value, pos = sleb(code, pos)
            set_reg(reg, (OFFSET, value * data_align))
        elif op == 0x12:  # def_cfa_sf
            state.cfa_reg, pos = uleb(code, pos)
            value, pos = sleb(code, pos)
            state.cfa_offset = value * data_align
            state.cfa_kind = CFA_REG
        elif op == 0x13:  # def_cfa_offset_sf
            value, pos = sleb(code, pos)
            state.cfa_offset = value * data_align
        elif op in (0x14, 0x15):  # val_offset(_sf)
            reg, pos = uleb(code, pos)
            _, pos = (uleb if op == 0x14 else sleb)(code, pos)
            set_reg(reg, (OTHER, 0))
        elif op == 0x16:  # val_expression
            reg, pos = uleb(code, pos)
            length, pos = uleb(code, pos)
            pos += length
            set_reg(reg, (OTHER, 0))
        elif op == 0x2E:  # GNU_args_size
            _, pos = uleb(code, pos)
        elif op == 0x2F:  # GNU_negative_offset_extended
            reg, pos = uleb(code, pos)
            value, pos = uleb(code, pos)
            set_reg(reg, (OFFSET, -value * data_align))
        else:
            raise CfiError(f"CFA opcode {op:#x}")
    return pc


def parse_frames(data: bytes, section_vaddr: int, is_eh: bool) -> Iterator[Fde]:
    """Every FDE of an ``.eh_frame`` (``is_eh``) or ``.debug_frame`` section loaded at ``section_vaddr``.

    A corrupt FDE is skipped; a corrupt length ends the walk."""
    cies: dict[int, Cie | None] = {}
    pos = 0
    size = len(data)
    while pos + 4 <= size:
        start = pos
        length = U32.unpack_from(data, pos)[0]
        pos += 4
        if length == 0:
            if is_eh:
                break  # the terminator
            continue
        offset_size = 4
        if length == 0xFFFFFFFF:
            if pos + 8 > size:
                break
            length = U64.unpack_from(data, pos)[0]
            pos += 8
            offset_size = 8
        end = pos + length
        if end > size:
            break
        id_pos = pos
        if pos + offset_size > size:
            break  # the id runs past the section: as corrupt as a length that does
        cie_id = (U32 if offset_size == 4 else U64).unpack_from(data, pos)[0]
        pos += offset_size
        is_cie = cie_id == 0 if is_eh else cie_id in (0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF)
        if is_cie:
            try:
                cies[start] = read_cie(data, pos, end, is_eh)
            except (CfiError, IndexError, ValueError, struct.error):
                cies[start] = None
            pos = end
            continue
        cie_at = id_pos - cie_id if is_eh else cie_id
        if not 0 <= cie_at < size:
            pos = end
            continue  # points before or past the section
        try:
            cie = cies.get(cie_at)
            if cie_at not in cies:
                cie = cies[cie_at] = _cie_at(data, cie_at, is_eh)
            if cie is None:
                pos = end
                continue
            fde = _read_fde(data, pos, end, cie, section_vaddr, is_eh)
        except (CfiError, IndexError, ValueError, struct.error):
            fde = None
        pos = end
        if fde is not None:
            yield fde


def _cie_at(data: bytes, at: int, is_eh: bool) -> Cie | None:
    try:
        length = U32.unpack_from(data, at)[0]
        pos = at + 4
        offset_size = 4
        if length == 0xFFFFFFFF:
            length = U64.unpack_from(data, pos)[0]
            pos += 8
            offset_size = 8
        end = min(pos + length, len(data))
        return read_cie(data, pos + offset_size, end, is_eh)
    except (CfiError, IndexError, ValueError, struct.error):
        return None


def _read_fde(data: bytes, pos: int, end: int, cie: Cie, section_vaddr: int, is_eh: bool) -> Fde | None:
    if is_eh:
        start, pos = pointer(data, pos, cie.fde_encoding, section_vaddr)
        span, pos = pointer(data, pos, cie.fde_encoding & 0x0F, 0)
    else:
        start = U64.unpack_from(data, pos)[0]
        span = U64.unpack_from(data, pos + 8)[0]
        pos += 16
    if cie.has_augmentation_data:
        aug_len, pos = uleb(data, pos)
        pos += aug_len
    if span == 0 or start == 0 or start + span > 0xFFFFFFFFFFFFFFFF:
        return None  # a discarded function (start 0 in .debug_frame, or a zero-length FDE), or past the address space
    # Instructions are executed on the bytes themselves: pcrel set_loc operands are relative to the section.
    state = _State()
    _execute(cie.initial, cie, state, None, start, [], 0)
    initial = state.copy()
    rows: list[Row] = []
    code = data[pos:end]
    pc = _execute(code, cie, state, initial, start, rows, section_vaddr + pos)
    if not rows or rows[-1].pc != pc:
        rows.append(state.row(pc))
    else:
        rows[-1] = state.row(pc)
    return Fde(start, start + span, [row for row in rows if row.pc < start + span])


def rule_of(row: Row) -> int:
    """The packed rule of one CFI row."""
    if row.ra_kind == UNDEFINED:
        return pack_rule(KIND_END, 0, 0)
    if (row.cfa_kind != CFA_REG or row.cfa_reg not in (RSP, RBP) or row.ra_kind != OFFSET
            or row.ra_offset != -8 or row.rbp_kind == OTHER or row.cfa_offset not in CFA_OFFSETS
            or row.rbp_offset not in RBP_OFFSETS or (row.rbp_kind == OFFSET and row.rbp_offset == 0)):
        return pack_rule(KIND_UNSUPPORTED, 0, 0)
    kind = KIND_RSP if row.cfa_reg == RSP else KIND_RBP
    return pack_rule(kind, row.cfa_offset, row.rbp_offset if row.rbp_kind == OFFSET else 0)


def table_from_fdes(fdes: Iterable[Fde], source: str) -> UnwindTable:
    """Merge FDEs (sorted by start here) into one table; consecutive equal rules are kept once (what
    ``cfi_table.c``'s merge() does)."""
    starts, ends, firsts = array("Q"), array("Q"), array("Q")
    row_pcs, row_rules = array("Q"), array("I")
    for fde in fdes:
        starts.append(fde.start)
        ends.append(fde.end)
        firsts.append(len(row_pcs))
        for row in fde.rows:
            row_pcs.append(row.pc)
            row_rules.append(rule_of(row))
    firsts.append(len(row_pcs))
    pcs = array("Q")
    rules = array("I")
    none = pack_rule(KIND_NONE, 0, 0)
    covered_to = 0
    for index in sorted(range(len(starts)), key=starts.__getitem__):
        start = starts[index]
        if start < covered_to:
            continue  # overlapping FDEs (duplicates from linker quirks): the first one wins
        if pcs and start > covered_to and rules[-1] != none:
            pcs.append(covered_to)
            rules.append(none)
        for at in range(firsts[index], firsts[index + 1]):
            rule = row_rules[at]
            if pcs and rules[-1] == rule:
                continue
            pc = row_pcs[at]
            if pcs and pcs[-1] == pc:
                rules[-1] = rule
                continue
            pcs.append(pc)
            rules.append(rule)
        covered_to = ends[index]
    if pcs:
        pcs.append(covered_to)
        rules.append(none)
    return UnwindTable(pcs, rules, source)

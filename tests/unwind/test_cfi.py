# SPDX-License-Identifier: Apache-2.0
"""The CFI interpreter and table builder against binutils' own interpretation (``readelf --debug-dump=frames-interp``)
on real binaries: every FDE's rows for the CFA, rbp and the return address must agree."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from otel_gpu.unwind import cfi
from otel_gpu.unwind.table import (KIND_END, KIND_NONE, KIND_RBP, KIND_RSP, KIND_UNSUPPORTED, TableCache,
                                   build_table, frame_sections)
from tests.conftest import NATIVE
from tests.unwind.cfigen import debug_frame_binary

LIBC = Path("/lib/x86_64-linux-gnu/libc.so.6")
LIBSTDCXX = Path("/usr/lib/x86_64-linux-gnu/libstdc++.so.6")
WORKLOAD = NATIVE / "workloads" / "cpu_3to1"
_REGS = {"rsp": cfi.RSP, "rbp": cfi.RBP}


@pytest.fixture(autouse=True)
def _readelf() -> None:
    if shutil.which("readelf") is None:
        pytest.fail("binutils' readelf is not installed (apt-get install binutils)")


def _readelf_rows(path: Path, section: str) -> dict[int, list[tuple[int, str, str, str]]]:
    """FDE start -> [(pc, cfa, rbp, ra)] as readelf prints them, consecutive duplicates merged."""
    text = subprocess.run(["readelf", "--debug-dump=frames-interp", str(path)], capture_output=True, text=True,
                          check=False).stdout  # exits 1 on a stripped libc (no debug sections) yet prints the frames
    out: dict[int, list[tuple[int, str, str, str]]] = {}
    in_section = False
    current: list[tuple[int, str, str, str]] | None = None
    columns: list[str] = []
    for line in text.splitlines():
        if line.startswith("Contents of the "):
            in_section = line.startswith(f"Contents of the {section} section")
            current = None
            continue
        if not in_section:
            continue
        fields = line.split()
        if " FDE " in line and "pc=" in line:
            start = int(line.split("pc=")[1].split("..")[0], 16)
            current = out.setdefault(start, [])
        elif " CIE " in line:
            current = None
        elif fields and fields[0] == "LOC":
            columns = fields
        elif current is not None and len(fields) >= 3 and re.fullmatch("[0-9a-f]{16}", fields[0]):
            values = dict(zip(columns, re.findall(r"\S+(?: \(\w+\))?", line), strict=False))  # "r9 (r9)": one value
            row = (int(fields[0], 16), values["CFA"], values.get("rbp", "u"), values.get("ra", "u"))
            if not current or current[-1][1:] != row[1:]:
                current.append(row)
    assert out, f"readelf printed no FDE for {path}"
    return out


def _render(row: cfi.Row) -> tuple[int, str, str, str]:
    if row.cfa_kind == cfi.CFA_EXPR:
        cfa = "exp"
    else:
        name = {cfi.RSP: "rsp", cfi.RBP: "rbp"}.get(row.cfa_reg, f"r{row.cfa_reg}")
        cfa = f"{name}{row.cfa_offset:+d}"

    def rule(kind: int, offset: int) -> str:
        return {cfi.SAME: "u", cfi.OFFSET: f"c{offset:+d}", cfi.UNDEFINED: "u"}.get(kind, "other")

    return row.pc, cfa, rule(row.rbp_kind, row.rbp_offset), rule(row.ra_kind, row.ra_offset)


def _normalise(rows: list[tuple[int, str, str, str]]) -> list[tuple[int, str, str, str]]:
    out: list[tuple[int, str, str, str]] = []
    for pc, cfa, rbp, ra in rows:
        rbp = "u" if rbp in ("u", "s") else rbp if rbp.startswith("c") else "other"
        ra = "u" if ra in ("u", "s") else ra if ra.startswith("c") else "other"
        if cfa not in ("exp",) and cfa.split("+")[0].split("-")[0] not in ("rsp", "rbp"):
            cfa = "other"
        row = (pc, cfa, rbp, ra)
        if not out or out[-1][1:] != row[1:]:
            out.append(row)
    return out


@pytest.mark.parametrize("path", [WORKLOAD, LIBC, LIBSTDCXX], ids=lambda p: p.name)
def test_rows_match_readelf(path: Path) -> None:
    if not path.exists():
        pytest.fail(f"{path} is missing: build the native workloads (make -s build) / install libstdc++")
    found = frame_sections(str(path))
    assert found is not None and found[0] == ".eh_frame"
    expected = _readelf_rows(path, ".eh_frame")
    fdes = list(cfi.parse_frames(found[2], found[1], True))
    assert len(fdes) > 0
    compared = 0
    for fde in fdes:
        want = expected.get(fde.start)
        if not want:  # readelf prints no rows for an FDE without instructions
            continue
        assert _normalise([_render(row) for row in fde.rows]) == _normalise(want), hex(fde.start)
        compared += 1
    assert compared == sum(1 for rows in expected.values() if rows) > 0


def test_debug_frame_matches_readelf(tmp_path: Path) -> None:
    binary = debug_frame_binary(tmp_path)
    found = frame_sections(str(binary))
    assert found is not None and found[0] == ".debug_frame"
    expected = _readelf_rows(binary, ".debug_frame")
    fdes = list(cfi.parse_frames(found[2], found[1], False))
    assert fdes
    for fde in fdes:
        want = expected.get(fde.start)
        if want:
            assert _normalise([_render(row) for row in fde.rows]) == _normalise(want)


def test_table_rules_for_a_frame_pointer_function() -> None:
    table = build_table(str(WORKLOAD))
    assert table.source == ".eh_frame"
    assert list(table.pcs) == sorted(table.pcs)
    kinds = {table.lookup(pc)[0] for pc in table.pcs}
    assert {KIND_RSP, KIND_NONE} <= kinds
    # any row with CFA = rbp+16 saves rbp at CFA-16 (the classic prologue)
    rbp_rows = [table.lookup(pc) for pc in table.pcs if table.lookup(pc)[0] == KIND_RBP]
    assert rbp_rows and all(rule == (KIND_RBP, 16, -16) for rule in rbp_rows)
    assert table.lookup(0) == (KIND_NONE, 0, 0)


def test_libc_table_has_an_end_and_plt_like_rules() -> None:
    table = build_table(str(LIBC))
    kinds = {table.lookup(pc)[0] for pc in table.pcs}
    assert KIND_RSP in kinds and KIND_END in kinds and KIND_UNSUPPORTED in kinds
    # every rsp-based CFA is at least 8 (the return address itself)
    assert all(rule[1] >= 8 for rule in map(table.lookup, table.pcs) if rule[0] == KIND_RSP)


def test_cache_builds_once_and_stays_bounded() -> None:
    cache = TableCache(max_bytes=1)
    first = cache.get(str(WORKLOAD))
    assert cache.get(str(WORKLOAD)) is first and cache.builds == 1
    cache.get(str(LIBC))
    assert cache.builds == 2 and cache.size_bytes == cache.get(str(LIBC)).size_bytes  # the workload was dropped
    assert cache.get(str(WORKLOAD)) is not first and cache.builds == 3

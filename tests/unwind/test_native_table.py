# SPDX-License-Identifier: Apache-2.0
"""The native table builder (libotel_gpu_cfi.so, what the agent builds with) against the reference interpreter
(cfi.parse_frames + cfi.table_from_fdes, itself checked against readelf in test_cfi.py): identical tables for every
shared library of this machine and the largest C++ and Rust libraries on it, for .debug_frame, and for corrupt
sections (truncated, mutated); with the library missing, the agent says so once, counts it and walks by frame
pointer."""

from __future__ import annotations

import base64
import logging
import os
import random
import subprocess
import time
from pathlib import Path

import pytest

from otel_gpu._native import NativeLibrary
from otel_gpu import selfmetrics, semconv
from otel_gpu.cpu.sampler import CPUSampler
from otel_gpu.unwind import cfi, native_table
from otel_gpu.unwind.table import build_table, frame_sections
from tests.unwind.cfigen import debug_frame_binary, synthetic_section

LIBRARIES = Path("/usr/lib/x86_64-linux-gnu")
LARGE = [Path("/usr/lib/x86_64-linux-gnu/libLLVM-15.so.1"), Path("/usr/lib/llvm-14/lib/libclang-cpp.so.14"),
         *sorted(Path("/root/.rustup/toolchains").glob("*/lib/librustc_driver-*.so"))]
LIBC = Path("/lib/x86_64-linux-gnu/libc.so.6")


def _reference(section: bytes, vaddr: int, is_eh: bool) -> tuple[list[int], list[int]]:
    table = cfi.table_from_fdes(cfi.parse_frames(section, vaddr, is_eh), "")
    return list(table.pcs), list(table.rules)


def _native(section: bytes, vaddr: int, is_eh: bool) -> tuple[list[int], list[int]]:
    pcs, rules = native_table.build_rows(section, vaddr, is_eh)
    return list(pcs), list(rules)


def _files() -> list[Path]:
    """Every distinct ELF file among the machine's shared libraries and LARGE (symlinks and hard links once)."""
    seen: set[tuple[int, int]] = set()
    out: list[Path] = []
    for path in [*sorted(LIBRARIES.glob("*.so*")), *LARGE]:
        try:
            found = path.stat()
        except OSError:
            continue
        if path.is_file() and (found.st_dev, found.st_ino) not in seen:
            seen.add((found.st_dev, found.st_ino))
            out.append(path)
    return out


def test_identical_tables_for_every_library_of_the_machine() -> None:
    missing = [str(path) for path in LARGE if not path.exists()]
    assert not missing and len(LARGE) >= 3, f"install llvm-15, libclang-cpp14 and rustup's toolchains: {missing}"
    compared, rows, different = 0, 0, []
    for path in _files():
        try:
            found = frame_sections(str(path))
        except (OSError, ValueError):
            continue  # not a 64-bit ELF file (a linker script, a 32-bit library)
        if found is None:
            continue
        section, vaddr, data = found
        expected = _reference(data, vaddr, section == ".eh_frame")
        compared += 1
        rows += len(expected[0])
        if _native(data, vaddr, section == ".eh_frame") != expected:
            different.append(str(path))
    assert not different, different
    assert compared > 100 and rows > 3_000_000, (compared, rows)  # the large ones alone are ~4 M rows


def test_identical_tables_for_debug_frame(tmp_path: Path) -> None:
    binary = debug_frame_binary(tmp_path)
    found = frame_sections(str(binary))
    assert found is not None and found[0] == ".debug_frame"
    expected = _reference(found[2], found[1], False)
    assert expected[0] and _native(found[2], found[1], False) == expected
    table = build_table(str(binary))
    assert table.source == ".debug_frame" and list(table.pcs) == expected[0]


def _libc_section() -> tuple[bytes, int]:
    found = frame_sections(str(LIBC))
    assert found is not None and found[0] == ".eh_frame"
    return found[2], found[1]


def test_truncated_sections_give_the_reference_rows() -> None:
    data, vaddr = _libc_section()
    head = data[:64 << 10]
    for cut in [*range(0, 64), *random.Random(1).sample(range(64, len(head)), 200)]:
        assert _native(head[:cut], vaddr, True) == _reference(head[:cut], vaddr, True), cut


@pytest.mark.parametrize("is_eh", [True, False], ids=["eh_frame", "debug_frame"])
def test_mutated_sections_give_the_reference_rows(is_eh: bool) -> None:
    """Random bytes, bit flips and spliced-in values (lengths, CIE pointers, encodings, LEB128s of 10 bytes and
    more, remember_state runs) in real sections: never a crash, always the reference's rows."""
    data, vaddr = _libc_section()
    generator = random.Random(2 if is_eh else 3)
    interesting = [b"\xff\xff\xff\xff", b"\x00\x00\x00\x00", b"\xff" * 11 + b"\x7f", b"\x80" * 12, b"\x0a" * 70,
                   b"\x0b" * 3, b"\x1b", b"\x9b", b"\x00\x00\x00\x80", b"\x10\x00\x00\x00", b"zPLR\x00"]
    for _ in range(600):
        start = generator.randrange(0, len(data) - 4096)
        sample = bytearray(data[:64] + data[start:start + generator.choice((64, 512, 4096))])
        for _ in range(generator.randrange(1, 8)):
            at = generator.randrange(len(sample))
            choice = generator.random()
            if choice < 0.4:
                sample[at] ^= 1 << generator.randrange(8)
            elif choice < 0.7:
                sample[at] = generator.randrange(256)
            else:
                value = generator.choice(interesting)
                sample[at:at + len(value)] = value
        section = bytes(sample)
        assert _native(section, vaddr, is_eh) == _reference(section, vaddr, is_eh), section.hex()
    random_bytes = os.urandom(8192)
    assert _native(random_bytes, vaddr, is_eh) == _reference(random_bytes, vaddr, is_eh), random_bytes.hex()


def test_a_debug_frame_cie_pointer_past_any_offset_is_skipped() -> None:
    """A .debug_frame FDE whose CIE pointer is past 2^63 (the CI fuzz run's input; the reference raised OverflowError):
    both builders skip that FDE."""
    crash = base64.b64decode(
        "Bv////8fAAAAAAAAAAN6UrkAwciqwfT455kuorP1Gng/AQEMBwiQAX1gRQAAACcAAACftIbW+/3I1Y7JomsBDyAAAAkICAoWAwB/LxCA+p4AAL"
        "N1kILm0MGxp+/0nkmQvv+Gnc6Z1tbYpqamdQIAAAAAAACmpqampqampqampqampqampqampqampqamJqYpAWT/EIsBcqmgcYZ/hgjQVgAAAAA=")
    assert _native(crash[1:], 0x5000, False) == _reference(crash[1:], 0x5000, False)


def test_drawn_call_frame_programs_give_the_reference_rows() -> None:
    """Sections written opcode by opcode (every DW_CFA_* op, LEB128s up to past the 11-byte limit, remember and
    restore runs, alignments and pointer encodings drawn): the native rows are the reference's, and enough of them
    are real rows (not all rejected) for the comparison to mean something."""
    generator = random.Random(4)
    vaddr = 0x5000
    with_rows = 0
    for _ in range(3000):
        section = synthetic_section(generator, vaddr)
        expected = _reference(section, vaddr, True)
        with_rows += bool(expected[0])
        assert _native(section, vaddr, True) == expected, section.hex()
    assert with_rows > 600, with_rows


def test_without_the_library_the_build_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(native_table, "LIBRARY", NativeLibrary(tmp_path / "libotel_gpu_cfi.so", native_table._SIGNATURES))
    assert not native_table.available()
    with pytest.raises(native_table.NativeBuilderMissing, match="make build"):
        build_table(str(LIBC))


@pytest.mark.root
@pytest.mark.usefixtures("other_agent")
def test_without_the_library_the_agent_walks_by_frame_pointer_and_counts_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from tests.unwind.test_native_stacks import WORKLOADS, _ending, _profile
    monkeypatch.setattr(native_table, "LIBRARY", NativeLibrary(tmp_path / "libotel_gpu_cfi.so", native_table._SIGNATURES))
    process = subprocess.Popen([str(WORKLOADS / "cpu_3to1"), "60"], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        pid = int(process.stdout.readline().split()[1])
        sampler = CPUSampler(99, pids=[pid])
        selfmetrics.reset()
        with caplog.at_level(logging.WARNING, logger="otel_gpu.unwind.processes"):
            sampler.open()
            try:
                sampler.register_unwinding(pid)
                deadline = time.monotonic() + 60
                while sampler.stats()["unwind_files_no_builder"] < 2 and time.monotonic() < deadline:
                    time.sleep(0.2)
                    sampler.settle_unwinder(10)
                sampler.drain()
                stats = sampler.stats()
            finally:
                sampler.close()
    finally:
        process.kill()
        process.wait()
    assert stats["unwind_files"] == 0 and stats["unwind_files_no_builder"] >= 2, stats  # the program and libc
    reported = selfmetrics.total(semconv.SELF_ERRORS.name, otel_gpu__source=semconv.Source.CPU_PROFILER,
                                 otel_gpu__reason=semconv.Reason.UNWIND_NO_BUILDER)
    assert reported == stats["unwind_files_no_builder"]
    lines = [record.getMessage() for record in caplog.records if "libotel_gpu_cfi.so" in record.getMessage()]
    assert len(lines) == 1 and "frame pointer" in lines[0], lines
    # and the profile: a frame-pointer program's chain stays whole
    stacks, stats = _profile(WORKLOADS / "cpu_3to1")
    whole = _ending(stacks, "main", "run", "busy_loop", "leaf_heavy") + _ending(
        stacks, "main", "run", "busy_loop", "leaf_light")
    assert whole > 0.9 * sum(stacks.values()), stacks.most_common(5)
    assert stats["unwind_files"] == 0 and stats["unwind_files_no_builder"] >= 2, stats

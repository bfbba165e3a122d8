# SPDX-License-Identifier: Apache-2.0
"""The ctypes mirrors in otel_gpu.ebpf.abi match the C header programs/cpu_profiler.h (sizes, offsets, enums)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

from otel_gpu.ebpf import abi
from otel_gpu.ebpf.loader import PROGRAMS_DIR

_ENUM = {
    "OTEL_GPU_STAT_SAMPLES": abi.CPUStat.SAMPLES,
    "OTEL_GPU_STAT_FILTERED": abi.CPUStat.FILTERED,
    "OTEL_GPU_STAT_USER_COLLISION": abi.CPUStat.USER_COLLISION,
    "OTEL_GPU_STAT_KERNEL_COLLISION": abi.CPUStat.KERNEL_COLLISION,
    "OTEL_GPU_STAT_STACK_ERROR": abi.CPUStat.STACK_ERROR,
    "OTEL_GPU_STAT_COUNTS_FULL": abi.CPUStat.COUNTS_FULL,
    "OTEL_GPU_STAT_EVENTS_FULL": abi.CPUStat.EVENTS_FULL,
    "OTEL_GPU_STAT_RAW_SENT": abi.CPUStat.RAW_SENT,
    "OTEL_GPU_STAT_RAW_FULL": abi.CPUStat.RAW_FULL,
    "OTEL_GPU_STAT_COUNT": abi.STAT_COUNT,
    "OTEL_GPU_COMM_LEN": abi.COMM_LEN,
    "OTEL_GPU_MAX_STACK_DEPTH": abi.MAX_STACK_DEPTH,
}


def _layout_program() -> str:
    lines = ["#include <stdio.h>", "#include <stddef.h>", '#include "cpu_profiler.h"', "int main(void) {"]
    for c_name, mirror in abi.STRUCTS.items():
        lines.append(f'  printf("{c_name} sizeof %zu\\n", sizeof(struct {c_name}));')
        for field, _ in mirror._fields_:
            lines.append(f'  printf("{c_name} {field} %zu\\n", offsetof(struct {c_name}, {field}));')
    for name in _ENUM:
        lines.append(f'  printf("enum {name} %d\\n", (int)({name}));')
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    assert compiler, "a C compiler is needed to check the header (apt-get install gcc)"
    folder = tmp_path_factory.mktemp("abi")
    source = folder / "layout.c"
    source.write_text(_layout_program())
    binary = folder / "layout"
    subprocess.run([compiler, "-I", str(PROGRAMS_DIR), "-o", str(binary), str(source)], check=True)
    out = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout
    values: dict[str, int] = {}
    for line in out.splitlines():
        *name, value = line.split()
        values[" ".join(name)] = int(value)
    return values


@pytest.mark.parametrize("c_name", sorted(abi.STRUCTS))
def test_struct_size_and_offsets_match_the_header(c_layout: dict[str, int], c_name: str) -> None:
    mirror = abi.STRUCTS[c_name]
    assert ctypes.sizeof(mirror) == c_layout[f"{c_name} sizeof"]
    for field, _ in mirror._fields_:
        assert getattr(mirror, field).offset == c_layout[f"{c_name} {field}"], field


def test_enum_values_match_the_header(c_layout: dict[str, int]) -> None:
    for name, value in _ENUM.items():
        assert c_layout[f"enum {name}"] == int(value), name


def test_header_is_the_one_the_programs_include() -> None:
    for program in Path(PROGRAMS_DIR).glob("cpu_profiler.bpf.c"):
        assert '#include "cpu_profiler.h"' in program.read_text()

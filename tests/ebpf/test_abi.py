# SPDX-License-Identifier: Apache-2.0
"""The one ABI check: every ctypes mirror (otel_gpu.ebpf.abi, otel_gpu.cuda.abi) against the C header it mirrors.

A C program that includes every shared header under otel_gpu/ebpf/programs/ (gpu_time.h brings in the injected
library's otel_gpu/cuda/native/otel_gpu_probes.h) prints each struct's size, each field's offset and size (and an
array's element size), each constant and each enumerator; they must equal the mirrors'. The tables below drive it:
mirroring a new struct or constant is one line here, and a mirror left out of them fails
:func:`test_every_mirror_is_in_the_tables`.
"""

from __future__ import annotations

import ctypes
import enum
import inspect
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from otel_gpu.cuda import abi as cuda_abi
from otel_gpu.ebpf import PROGRAMS_DIR
from otel_gpu.ebpf import abi as ebpf_abi

MODULES: tuple[ModuleType, ...] = (ebpf_abi, cuda_abi)

# C struct -> its ctypes mirror.
STRUCTS: dict[str, type[ctypes.Structure]] = {
    # cpu_profiler.h
    "otel_gpu_sample_key": ebpf_abi.SampleKey,
    "otel_gpu_sample_value": ebpf_abi.SampleValue,
    "otel_gpu_process_event": ebpf_abi.ProcessEvent,
    "otel_gpu_python_stack_event": ebpf_abi.PythonStackEvent,
    "otel_gpu_raw_sample": ebpf_abi.RawSample,
    "otel_gpu_control": ebpf_abi.Control,
    "otel_gpu_python_proc": ebpf_abi.PythonProc,
    "otel_gpu_python_stack": ebpf_abi.PythonStack,
    "otel_gpu_unwind_row": ebpf_abi.UnwindRow,
    "otel_gpu_unwind_mapping": ebpf_abi.UnwindMapping,
    "otel_gpu_unwind_process": ebpf_abi.UnwindProcess,
    "otel_gpu_unwound_stack": ebpf_abi.UnwoundStack,
    # gpu_time.h
    "otel_gpu_event": cuda_abi.EventC,
    "otel_gpu_kstack": cuda_abi.KStackC,
    # otel_gpu_probes.h
    "otel_gpu_python_frame": cuda_abi.PythonFrameC,
    "otel_gpu_stack": cuda_abi.StackC,
    "otel_gpu_launch": cuda_abi.LaunchC,
    "otel_gpu_activity": cuda_abi.ActivityC,
    "otel_gpu_sync": cuda_abi.SyncC,
    "otel_gpu_span": cuda_abi.SpanC,
    "otel_gpu_window": cuda_abi.WindowC,
    "otel_gpu_graph_replays": cuda_abi.GraphReplaysC,
}

# C #define (or an enum's count member) -> the mirror's value.
CONSTANTS: dict[str, int] = {
    # common.h
    "OTEL_GPU_COMM_LEN": ebpf_abi.COMM_LEN,
    # cpu_profiler.h
    "OTEL_GPU_MAX_STACK_DEPTH": ebpf_abi.MAX_STACK_DEPTH,
    "OTEL_GPU_STAT_COUNT": ebpf_abi.STAT_COUNT,
    "OTEL_GPU_PYTHON_NO_OFFSET": ebpf_abi.PYTHON_NO_OFFSET,
    "OTEL_GPU_MAX_PYTHON_DEPTH": ebpf_abi.MAX_PYTHON_DEPTH,
    "OTEL_GPU_PYTHON_ENTRY_WORDS": ebpf_abi.PYTHON_ENTRY_WORDS,
    "OTEL_GPU_PYTHON_TRUNCATED": ebpf_abi.PYTHON_TRUNCATED,
    "OTEL_GPU_UNWIND_MAX_MAPPINGS": ebpf_abi.UNWIND_MAX_MAPPINGS,
    "OTEL_GPU_UNWIND_MAX_FILES": ebpf_abi.UNWIND_MAX_FILES,
    "OTEL_GPU_UNWIND_KIND_BITS": ebpf_abi.UNWIND_KIND_BITS,
    "OTEL_GPU_UNWIND_RBP_BITS": ebpf_abi.UNWIND_RBP_BITS,
    "OTEL_GPU_UNWIND_CFA_BITS": ebpf_abi.UNWIND_CFA_BITS,
    "OTEL_GPU_UNWOUND_ID_BASE": ebpf_abi.UNWOUND_ID_BASE,
    # gpu_time.h
    "OTEL_GPU_KSTACK_DEPTH": cuda_abi.KSTACK_DEPTH,
    "OTEL_GPU_DROP_REASONS": len(cuda_abi.DROP_REASONS),
    # otel_gpu_probes.h
    "OTEL_GPU_ABI_VERSION": cuda_abi.ABI_VERSION,
    "OTEL_GPU_MAX_NATIVE_FRAMES": cuda_abi.MAX_NATIVE_FRAMES,
    "OTEL_GPU_MAX_PYTHON_FRAMES": cuda_abi.MAX_PYTHON_FRAMES,
    "OTEL_GPU_MAX_STRINGS": cuda_abi.MAX_STRINGS,
    "OTEL_GPU_MAX_NAME": cuda_abi.MAX_NAME,
    "OTEL_GPU_ACTIVITY_BATCH": cuda_abi.ACTIVITY_BATCH,
    "OTEL_GPU_GRAPH_SLOTS": cuda_abi.GRAPH_SLOTS,
    "OTEL_GPU_MAX_RECORD": cuda_abi.MAX_RECORD,
}

# C enum's mirror -> the prefix of its enumerators (every member is checked as prefix + member name).
ENUMS: dict[type[enum.IntEnum], str] = {
    ebpf_abi.CPUStat: "OTEL_GPU_STAT_",  # cpu_profiler.h
    ebpf_abi.UnwindKind: "OTEL_GPU_UNWIND_",
    cuda_abi.EventType: "OTEL_GPU_EVENT_",  # gpu_time.h
    cuda_abi.DropReason: "OTEL_GPU_DROP_",
    cuda_abi.LaunchKind: "OTEL_GPU_LAUNCH_",  # otel_gpu_probes.h
    cuda_abi.ActivityKind: "OTEL_GPU_ACTIVITY_",
    cuda_abi.SyncKind: "OTEL_GPU_SYNC_",
}


def _headers() -> list[Path]:
    """Every header of the BPF tree that user space shares (vmlinux.h is the kernel's, generated)."""
    return sorted(path for path in PROGRAMS_DIR.glob("*.h") if path.name != "vmlinux.h")


def _enumerators() -> dict[str, int]:
    return {prefix + member.name: int(member) for mirror, prefix in ENUMS.items() for member in mirror}


def _layout_program() -> str:
    lines = ["#include <stdio.h>", "#include <stddef.h>"]
    lines += [f'#include "{header.name}"' for header in _headers()]
    lines.append("int main(void) {")
    for c_name, mirror in STRUCTS.items():
        lines.append(f'  printf("{c_name} %zu\\n", sizeof(struct {c_name}));')
        for name, kind, *_ in mirror._fields_:
            member = f"((struct {c_name} *)0)->{name}"
            offset = f"offsetof(struct {c_name}, {name})"
            lines.append(f'  printf("{c_name}.{name} %zu %zu\\n", {offset}, sizeof({member}));')
            if issubclass(kind, ctypes.Array):  # an array's element too: u32[128] is not u64[64]
                lines.append(f'  printf("{c_name}.{name}[0] %zu\\n", sizeof({member}[0]));')
    for c_name in [*CONSTANTS, *_enumerators()]:
        lines.append(f'  printf("{c_name} %lld\\n", (long long)({c_name}));')
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        pytest.fail("no C compiler (cc, gcc or clang) on PATH to check the headers: apt-get install gcc")
    folder = tmp_path_factory.mktemp("abi")
    source = folder / "layout.c"
    source.write_text(_layout_program())
    binary = folder / "layout"
    subprocess.run([compiler, "-Wall", "-Werror", "-I", str(PROGRAMS_DIR), "-o", str(binary), str(source)],
                   check=True)
    out = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout
    return dict(line.split(" ", 1) for line in out.splitlines())


@pytest.mark.parametrize("c_name", sorted(STRUCTS))
def test_struct_size_and_fields_match_the_header(c_layout: dict[str, str], c_name: str) -> None:
    mirror = STRUCTS[c_name]
    assert str(ctypes.sizeof(mirror)) == c_layout[c_name], f"sizeof(struct {c_name})"
    for name, kind, *_ in mirror._fields_:
        field = getattr(mirror, name)
        assert f"{field.offset} {field.size}" == c_layout[f"{c_name}.{name}"], f"struct {c_name}.{name}: offset size"
        if issubclass(kind, ctypes.Array):
            assert str(ctypes.sizeof(kind._type_)) == c_layout[f"{c_name}.{name}[0]"], f"struct {c_name}.{name}[0]"


def test_constants_and_enumerators_match_the_header(c_layout: dict[str, str]) -> None:
    python = {c_name: str(value) for c_name, value in [*CONSTANTS.items(), *_enumerators().items()]}
    assert python == {c_name: c_layout[c_name] for c_name in python}


def test_every_mirror_is_in_the_tables() -> None:
    for module in MODULES:
        for name, value in vars(module).items():
            if inspect.isclass(value) and value.__module__ == module.__name__:
                if issubclass(value, ctypes.Structure):
                    assert value in STRUCTS.values(), f"{module.__name__}.{name} is missing from STRUCTS"
                if issubclass(value, enum.IntEnum):
                    assert value in ENUMS, f"{module.__name__}.{name} is missing from ENUMS"


def test_short_names_are_the_enum_members() -> None:
    """The module constants that name enumerators (``LAUNCH_GRAPH``, ...) are the enum's members, not copies."""
    for mirror, prefix in ENUMS.items():
        module = sys.modules[mirror.__module__]
        for member in mirror:
            short = (prefix + member.name).removeprefix("OTEL_GPU_")
            assert getattr(module, short, member) is member, f"{module.__name__}.{short}"


def test_every_program_includes_its_header_and_every_header_the_common_one() -> None:
    includes = re.compile(r'^#include "([^"]+)"', re.MULTILINE)
    for header in _headers():
        program = header.with_name(header.stem + ".bpf.c")
        if program.exists():
            assert header.name in includes.findall(program.read_text()), f"{program.name} includes {header.name}"
        if header.name != "common.h":
            assert "common.h" in includes.findall(header.read_text()), f"{header.name} includes common.h"

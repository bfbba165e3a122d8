# SPDX-License-Identifier: Apache-2.0
"""The ctypes mirrors in otel_gpu.cuda.abi against the C headers: a compiled C program prints every struct's size
and every field's offset, and every shared constant; they must match exactly. Plus decode round trips."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

from otel_gpu.cuda import abi

REPO = Path(__file__).resolve().parents[2]
PROGRAMS = REPO / "otel_gpu" / "ebpf" / "programs"

CONSTANTS = {
    "OTEL_GPU_ABI_VERSION": abi.ABI_VERSION, "OTEL_GPU_MAX_NATIVE_FRAMES": abi.MAX_NATIVE_FRAMES,
    "OTEL_GPU_MAX_PYTHON_FRAMES": abi.MAX_PYTHON_FRAMES, "OTEL_GPU_MAX_STRINGS": abi.MAX_STRINGS,
    "OTEL_GPU_MAX_NAME": abi.MAX_NAME, "OTEL_GPU_ACTIVITY_BATCH": abi.ACTIVITY_BATCH,
    "OTEL_GPU_MAX_RECORD": abi.MAX_RECORD, "OTEL_GPU_KSTACK_DEPTH": abi.KSTACK_DEPTH,
    "OTEL_GPU_COMM_LEN": abi.COMM_LEN,
    "OTEL_GPU_LAUNCH_KERNEL": abi.LAUNCH_KERNEL, "OTEL_GPU_LAUNCH_GRAPH": abi.LAUNCH_GRAPH,
    "OTEL_GPU_LAUNCH_MEMCPY": abi.LAUNCH_MEMCPY, "OTEL_GPU_LAUNCH_MEMSET": abi.LAUNCH_MEMSET,
    "OTEL_GPU_ACTIVITY_KERNEL": abi.ACTIVITY_KERNEL, "OTEL_GPU_ACTIVITY_MEMCPY": abi.ACTIVITY_MEMCPY,
    "OTEL_GPU_ACTIVITY_MEMSET": abi.ACTIVITY_MEMSET,
    "OTEL_GPU_SYNC_STREAM": abi.SYNC_STREAM, "OTEL_GPU_SYNC_CONTEXT": abi.SYNC_CONTEXT,
    "OTEL_GPU_SYNC_EVENT": abi.SYNC_EVENT, "OTEL_GPU_SYNC_MEMCPY": abi.SYNC_MEMCPY,
    "OTEL_GPU_EVENT_LAUNCH": abi.EVENT_LAUNCH, "OTEL_GPU_EVENT_ACTIVITY": abi.EVENT_ACTIVITY,
    "OTEL_GPU_EVENT_SYNC": abi.EVENT_SYNC, "OTEL_GPU_EVENT_WINDOW": abi.EVENT_WINDOW,
    "OTEL_GPU_DROP_RINGBUF_FULL": abi.DROP_RINGBUF_FULL, "OTEL_GPU_DROP_READ_FAILED": abi.DROP_READ_FAILED,
    "OTEL_GPU_DROP_BAD_LENGTH": abi.DROP_BAD_LENGTH, "OTEL_GPU_DROP_REASONS": len(abi.DROP_REASONS),
}


def _c_layout(tmp_path: Path) -> dict[str, int]:
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        pytest.fail("no C compiler (cc, gcc or clang) on PATH; install build-essential")
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "gpu_time.h"', "int main(void) {"]
    for c_name, mirror in abi.MIRRORS.items():
        lines.append(f'printf("{c_name} %zu\\n", sizeof(struct {c_name}));')
        for field, *_ in mirror._fields_:
            lines.append(f'printf("{c_name}.{field} %zu\\n", offsetof(struct {c_name}, {field}));')
    for constant in CONSTANTS:
        lines.append(f'printf("{constant} %lld\\n", (long long)({constant}));')
    lines.append("return 0; }")
    source = tmp_path / "layout.c"
    source.write_text("\n".join(lines) + "\n")
    binary = tmp_path / "layout"
    subprocess.run([compiler, "-I", str(PROGRAMS), str(source), "-o", str(binary)], check=True)
    out = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout
    return {key: int(value) for key, value in (line.split() for line in out.splitlines())}


def test_mirrors_match_the_c_headers(tmp_path: Path) -> None:
    c = _c_layout(tmp_path)
    python: dict[str, int] = {}
    for c_name, mirror in abi.MIRRORS.items():
        python[c_name] = ctypes.sizeof(mirror)
        for field, *_ in mirror._fields_:
            python[f"{c_name}.{field}"] = getattr(mirror, field).offset
    python.update(CONSTANTS)
    assert python == c


def _event(kind: int, pid: int, tid: int, payload: bytes, kstack: abi.KStackC | None = None) -> bytes:
    header = abi.EventC(type=kind, pid=pid, tid=tid, payload_len=len(payload), ktime_ns=5, comm=b"train")
    return bytes(header) + (bytes(kstack) if kstack is not None else b"") + payload


def test_decode_launch_with_python_frames_and_short_payload() -> None:
    launch = abi.LaunchC(abi_version=abi.ABI_VERSION, kind=abi.LAUNCH_KERNEL, correlation_id=77, cbid=307, window_id=3,
                         timestamp_ns=1000, graph_exec=0)
    launch.stack.native_count = 2
    launch.stack.native[0] = 0x1111
    launch.stack.native[1] = 0x2222
    strings = b"model.forward\0/srv/model.py\0"
    ctypes.memmove(ctypes.addressof(launch) + abi.LaunchC.stack.offset + abi.StackC.strings.offset, strings,
                   len(strings))
    launch.stack.strings_len = len(strings)
    launch.stack.python_count = 1
    launch.stack.python[0] = abi.PythonFrameC(line=42, name_offset=0, filename_offset=14, first_line=40)
    launch.stack.flags = abi.STACK_FLAG_PYTHON
    kstack = abi.KStackC(bytes=16)
    kstack.pcs[0], kstack.pcs[1] = 0xAAAA, 0xBBBB
    raw = bytes(launch)
    used = abi.LaunchC.stack.offset + abi.StackC.strings.offset + len(strings)
    record = abi.decode_event(_event(abi.EVENT_LAUNCH, 10, 11, raw[:used], kstack))  # the library may send a prefix
    assert isinstance(record, abi.Launch)
    assert (record.pid, record.tid, record.comm, record.correlation_id, record.window_id) == (10, 11, "train", 77, 3)
    assert record.stack.native == (0x1111, 0x2222)
    assert record.stack.kernel_native == (0xAAAA, 0xBBBB)
    assert record.stack.python == (abi.PythonFrame("model.forward", "/srv/model.py", 42, 40),)


def test_decode_activity_window_sync() -> None:
    name = b"_Z6matmulPfS_S_i"
    act = abi.ActivityC(kind=abi.ACTIVITY_KERNEL, correlation_id=9, start_ns=100, end_ns=350, device_id=1,
                        stream_id=7, graph_id=0, name_len=len(name), name=name)
    record = abi.decode_event(_event(abi.EVENT_ACTIVITY, 10, 10, bytes(act)))
    assert isinstance(record, abi.Activity)
    assert (record.name, record.duration_ns, record.device_id, record.stream_id) == (name.decode(), 250, 1, 7)

    window = abi.WindowC(abi_version=abi.ABI_VERSION, window_id=4, start_ns=0, end_ns=10, covered_ns=10,
                         elapsed_ns=100, launches=3, window_waits=5, shadow_waits=7, shadow_ns=11)
    record = abi.decode_event(_event(abi.EVENT_WINDOW, 10, 10, bytes(window)))
    assert isinstance(record, abi.Window) and (record.covered_ns, record.elapsed_ns) == (10, 100)
    assert (record.window_waits, record.shadow_waits, record.shadow_ns) == (5, 7, 11)

    sync = abi.SyncC(abi_version=abi.ABI_VERSION, kind=abi.SYNC_STREAM, cbid=126, start_ns=10, end_ns=510, weight=4)
    record = abi.decode_event(_event(abi.EVENT_SYNC, 10, 12, bytes(sync), abi.KStackC(bytes=-14)))
    assert isinstance(record, abi.Sync) and (record.blocked_ns, record.weight) == (500, 4)
    assert record.stack.kernel_native == ()


def test_decode_rejects_bad_records() -> None:
    with pytest.raises(abi.DecodeError):
        abi.decode_event(b"\0" * 8)
    with pytest.raises(abi.DecodeError):
        abi.decode_event(_event(99, 1, 1, b""))
    window = abi.WindowC(abi_version=abi.ABI_VERSION + 1)
    with pytest.raises(abi.DecodeError):
        abi.decode_event(_event(abi.EVENT_WINDOW, 1, 1, bytes(window)))

# SPDX-License-Identifier: Apache-2.0
"""ctypes mirrors of the GPU-time probe ABI and decoders from ring-buffer bytes to plain frozen records.

Two C headers cross the kernel/user boundary: ``native/otel_gpu_probes.h`` (the injected library's records) and
``programs/gpu_time.h`` (the eBPF program's event header and fallback stack). tests/cuda/test_abi.py compiles a
C program printing every size and offset and compares it with these mirrors. Times are nanoseconds.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

ABI_VERSION = 1
MAX_NATIVE_FRAMES = 96
MAX_PYTHON_FRAMES = 64
MAX_STRINGS = 6144
MAX_NAME = 512
ACTIVITY_BATCH = 32
KSTACK_DEPTH = 64
COMM_LEN = 16

LAUNCH_KERNEL, LAUNCH_GRAPH, LAUNCH_MEMCPY, LAUNCH_MEMSET = 1, 2, 3, 4
ACTIVITY_KERNEL, ACTIVITY_MEMCPY, ACTIVITY_MEMSET = 1, 2, 3
SYNC_STREAM, SYNC_CONTEXT, SYNC_EVENT, SYNC_MEMCPY = 1, 2, 3, 4
EVENT_LAUNCH, EVENT_ACTIVITY, EVENT_SYNC, EVENT_WINDOW = 1, 2, 3, 4
DROP_RINGBUF_FULL, DROP_READ_FAILED, DROP_BAD_LENGTH = 0, 1, 2
DROP_REASONS = ("ringbuf_full", "read_failed", "bad_length")

STACK_FLAG_PYTHON = 1
STACK_FLAG_NATIVE_TRUNCATED = 2
STACK_FLAG_PYTHON_TRUNCATED = 4

_u8, _u32, _s32, _u64 = ctypes.c_uint8, ctypes.c_uint32, ctypes.c_int32, ctypes.c_uint64


class PythonFrameC(ctypes.Structure):
    _fields_ = [("line", _u32), ("name_offset", _u32), ("filename_offset", _u32), ("first_line", _u32)]


class StackC(ctypes.Structure):
    _fields_ = [
        ("native_count", _u32), ("python_count", _u32), ("strings_len", _u32), ("flags", _u32),
        ("native", _u64 * MAX_NATIVE_FRAMES),
        ("python", PythonFrameC * MAX_PYTHON_FRAMES),
        ("strings", ctypes.c_char * MAX_STRINGS),
    ]


class LaunchC(ctypes.Structure):
    _fields_ = [
        ("abi_version", _u32), ("kind", _u32), ("correlation_id", _u32), ("cbid", _s32),
        ("window_id", _u64), ("timestamp_ns", _u64), ("graph_exec", _u64), ("stack", StackC),
    ]


class ActivityC(ctypes.Structure):
    _fields_ = [
        ("kind", _u32), ("correlation_id", _u32), ("start_ns", _u64), ("end_ns", _u64),
        ("device_id", _u32), ("stream_id", _u32), ("graph_id", _u32), ("name_len", _u32), ("bytes", _u64),
        ("copy_kind", _u8), ("src_kind", _u8), ("dst_kind", _u8), ("reserved", _u8 * 5),
        ("name", ctypes.c_char * MAX_NAME),
    ]


class SyncC(ctypes.Structure):
    _fields_ = [
        ("abi_version", _u32), ("kind", _u32), ("cbid", _s32), ("reserved", _u32),
        ("start_ns", _u64), ("end_ns", _u64), ("weight", _u64), ("stack", StackC),
    ]


class WindowC(ctypes.Structure):
    _fields_ = [
        ("abi_version", _u32), ("reserved", _u32), ("window_id", _u64), ("start_ns", _u64), ("end_ns", _u64),
        ("covered_ns", _u64), ("elapsed_ns", _u64), ("launches", _u64), ("dropped", _u64), ("overhead_ns", _u64),
    ]


class EventC(ctypes.Structure):
    _fields_ = [
        ("type", _u32), ("pid", _u32), ("tid", _u32), ("payload_len", _u32), ("ktime_ns", _u64),
        ("comm", ctypes.c_char * COMM_LEN),
    ]


class KStackC(ctypes.Structure):
    _fields_ = [("bytes", _s32), ("reserved", _u32), ("pcs", _u64 * KSTACK_DEPTH)]


MAX_RECORD = max(ctypes.sizeof(SyncC), ctypes.sizeof(LaunchC))
MIRRORS: dict[str, type[ctypes.Structure]] = {
    "otel_gpu_python_frame": PythonFrameC, "otel_gpu_stack": StackC, "otel_gpu_launch": LaunchC,
    "otel_gpu_activity": ActivityC, "otel_gpu_sync": SyncC, "otel_gpu_window": WindowC,
    "otel_gpu_event": EventC, "otel_gpu_kstack": KStackC,
}

# --- decoded records ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PythonFrame:
    """One interpreter frame: qualified function name, source file and line."""

    name: str
    filename: str
    line: int
    first_line: int = 0


@dataclass(frozen=True, slots=True)
class Stack:
    """The launching thread's stack: native PCs leaf first, Python frames innermost first, and the kernel's
    fallback user stack (bpf_get_stack) for when the library's own unwind is empty."""

    native: tuple[int, ...] = ()
    python: tuple[PythonFrame, ...] = ()
    flags: int = 0
    kernel_native: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Launch:
    """One sampled launch (kernel, graph, memcpy, memset) at the API's exit."""

    pid: int
    tid: int
    comm: str
    kind: int
    correlation_id: int
    cbid: int
    window_id: int
    timestamp_ns: int
    graph_exec: int
    stack: Stack


@dataclass(frozen=True, slots=True)
class Activity:
    """Completed GPU work of a sampled launch; ``name`` is the mangled kernel name ("" for copies and sets)."""

    pid: int
    kind: int
    correlation_id: int
    start_ns: int
    end_ns: int
    device_id: int
    stream_id: int
    graph_id: int
    name: str
    bytes: int
    copy_kind: int
    src_kind: int
    dst_kind: int

    @property
    def duration_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns)


@dataclass(frozen=True, slots=True)
class Sync:
    """One sampled blocking wait; blocked for ``end_ns - start_ns``, standing for ``weight`` waits."""

    pid: int
    tid: int
    comm: str
    kind: int
    cbid: int
    start_ns: int
    end_ns: int
    weight: int
    stack: Stack

    @property
    def blocked_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns)


@dataclass(frozen=True, slots=True)
class Window:
    """One closed sampling window; covered/elapsed are totals since the library started."""

    pid: int
    window_id: int
    start_ns: int
    end_ns: int
    covered_ns: int
    elapsed_ns: int
    launches: int
    dropped: int
    overhead_ns: int


Record = Launch | Activity | Sync | Window


class DecodeError(ValueError):
    """A ring-buffer record that does not match the ABI (short, unknown type or ABI version)."""


_EVENT_SIZE = ctypes.sizeof(EventC)
_KSTACK_SIZE = ctypes.sizeof(KStackC)


def _padded(data: bytes, offset: int, struct: type[ctypes.Structure], length: int) -> ctypes.Structure:
    size = ctypes.sizeof(struct)
    chunk = data[offset:offset + min(length, size)]
    if len(chunk) < size:
        chunk = chunk + bytes(size - len(chunk))
    return struct.from_buffer_copy(chunk)


def _cstring(raw: bytes, offset: int, limit: int) -> str:
    if offset >= limit:
        return ""
    end = raw.find(b"\0", offset, limit)
    return raw[offset:end if end >= 0 else limit].decode("utf-8", "replace")


def decode_stack(stack: StackC, kstack: KStackC | None = None) -> Stack:
    """Plain :class:`Stack` from the library's stack and the eBPF fallback stack (counts clamped to the ABI)."""
    native = tuple(stack.native[:min(stack.native_count, MAX_NATIVE_FRAMES)])
    strings = ctypes.string_at(ctypes.addressof(stack) + StackC.strings.offset, MAX_STRINGS)
    limit = min(stack.strings_len, MAX_STRINGS)
    python = tuple(
        PythonFrame(_cstring(strings, f.name_offset, limit), _cstring(strings, f.filename_offset, limit), f.line,
                    f.first_line)
        for f in stack.python[:min(stack.python_count, MAX_PYTHON_FRAMES)]
    )
    kernel_native: tuple[int, ...] = ()
    if kstack is not None and kstack.bytes > 0:
        kernel_native = tuple(pc for pc in kstack.pcs[:min(kstack.bytes // 8, KSTACK_DEPTH)] if pc)
    return Stack(native, python, stack.flags, kernel_native)


def decode_event(data: bytes) -> Record:
    """Decode one ring-buffer record written by gpu_time.bpf.c. Raises :class:`DecodeError` on a bad record."""
    if len(data) < _EVENT_SIZE:
        raise DecodeError(f"record of {len(data)} bytes is shorter than its header")
    event = EventC.from_buffer_copy(data[:_EVENT_SIZE])
    comm = event.comm.decode("utf-8", "replace")
    if event.type in (EVENT_LAUNCH, EVENT_SYNC):
        if len(data) < _EVENT_SIZE + _KSTACK_SIZE:
            raise DecodeError("launch/sync record without its stack")
        kstack = KStackC.from_buffer_copy(data[_EVENT_SIZE:_EVENT_SIZE + _KSTACK_SIZE])
        offset = _EVENT_SIZE + _KSTACK_SIZE
        if event.type == EVENT_LAUNCH:
            rec = _padded(data, offset, LaunchC, event.payload_len)
            _check_version(rec.abi_version, "launch")
            return Launch(event.pid, event.tid, comm, rec.kind, rec.correlation_id, rec.cbid, rec.window_id,
                          rec.timestamp_ns, rec.graph_exec, decode_stack(rec.stack, kstack))
        rec = _padded(data, offset, SyncC, event.payload_len)
        _check_version(rec.abi_version, "sync")
        return Sync(event.pid, event.tid, comm, rec.kind, rec.cbid, rec.start_ns, rec.end_ns, max(rec.weight, 1),
                    decode_stack(rec.stack, kstack))
    if event.type == EVENT_ACTIVITY:
        rec = _padded(data, _EVENT_SIZE, ActivityC, event.payload_len)
        name_len = min(rec.name_len, MAX_NAME - 1)
        name = ctypes.string_at(ctypes.addressof(rec) + ActivityC.name.offset, name_len).split(b"\0", 1)[0].decode("utf-8", "replace")
        return Activity(event.pid, rec.kind, rec.correlation_id, rec.start_ns, rec.end_ns, rec.device_id,
                        rec.stream_id, rec.graph_id, name, rec.bytes, rec.copy_kind, rec.src_kind, rec.dst_kind)
    if event.type == EVENT_WINDOW:
        rec = _padded(data, _EVENT_SIZE, WindowC, event.payload_len)
        _check_version(rec.abi_version, "window")
        return Window(event.pid, rec.window_id, rec.start_ns, rec.end_ns, rec.covered_ns, rec.elapsed_ns,
                      rec.launches, rec.dropped, rec.overhead_ns)
    raise DecodeError(f"unknown record type {event.type}")


def _check_version(version: int, what: str) -> None:
    if version != ABI_VERSION:
        raise DecodeError(f"{what} record has ABI version {version}, this agent reads {ABI_VERSION}")

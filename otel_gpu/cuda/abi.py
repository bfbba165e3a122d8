# SPDX-License-Identifier: Apache-2.0
"""ctypes mirrors of the GPU-time probe ABI and decoders from ring-buffer bytes to plain frozen records.

Mirrors two C headers, each in one place below: ``otel_gpu/cuda/native/otel_gpu_probes.h`` (the injected library's
records) and ``otel_gpu/ebpf/programs/gpu_time.h`` (the eBPF program's event header and fallback stack); what every
program shares (``common.h``) is mirrored in :mod:`otel_gpu.ebpf.abi`. tests/ebpf/test_abi.py compiles a C program
printing every size, offset and constant and compares it with these mirrors. Times are nanoseconds.
"""

from __future__ import annotations

import ctypes
import enum
import struct
from dataclasses import dataclass, field

from otel_gpu.ebpf.abi import COMM_LEN

_u8, _u32, _s32, _u64 = ctypes.c_uint8, ctypes.c_uint32, ctypes.c_int32, ctypes.c_uint64

# --- otel_gpu_probes.h: the injected library's records ----------------------------------------------------------------

ABI_VERSION = 7
# Also read: the ABI before, so that a workload started before an agent upgrade (its library stays loaded; the
# DaemonSet's init container replaces the file by rename) stays profiled. ABI 6 differs in the window record only: it
# has no linger totals, so its windows are weighted as before them.
PREVIOUS_ABI_VERSION = 6
MAX_NATIVE_FRAMES = 96
MAX_PYTHON_FRAMES = 64
MAX_STRINGS = 6144
MAX_NAME = 512
ACTIVITY_BATCH = 32
GRAPH_SLOTS = 64

# bits of otel_gpu_stack.flags
STACK_FLAG_PYTHON = 1
STACK_FLAG_NATIVE_TRUNCATED = 2
STACK_FLAG_PYTHON_TRUNCATED = 4


class LaunchKind(enum.IntEnum):
    """enum otel_gpu_launch_kind: what a sampled launch started."""

    KERNEL = 1
    GRAPH = 2
    MEMCPY = 3
    MEMSET = 4


class ActivityKind(enum.IntEnum):
    """enum otel_gpu_activity_kind: what completed on the GPU."""

    KERNEL = 1
    MEMCPY = 2
    MEMSET = 3


class SyncKind(enum.IntEnum):
    """enum otel_gpu_sync_kind: what a CPU thread waited on."""

    STREAM = 1
    CONTEXT = 2
    EVENT = 3
    MEMCPY = 4


class PythonFrameC(ctypes.Structure):
    """struct otel_gpu_python_frame."""

    _fields_ = [("line", _u32), ("name_offset", _u32), ("filename_offset", _u32), ("first_line", _u32)]


class StackC(ctypes.Structure):
    """struct otel_gpu_stack."""

    _fields_ = [
        ("native_count", _u32), ("python_count", _u32), ("strings_len", _u32), ("flags", _u32),
        ("native", _u64 * MAX_NATIVE_FRAMES),
        ("python", PythonFrameC * MAX_PYTHON_FRAMES),
        ("strings", ctypes.c_char * MAX_STRINGS),
    ]


class SpanC(ctypes.Structure):
    """struct otel_gpu_span: the span the recording thread was in (docs/span-context.md); all zero outside one."""

    _fields_ = [("trace_id", _u8 * 16), ("span_id", _u8 * 8), ("local_root_span_id", _u8 * 8)]


class LaunchC(ctypes.Structure):
    """struct otel_gpu_launch."""

    _fields_ = [
        ("abi_version", _u32), ("kind", _u32), ("correlation_id", _u32), ("cbid", _s32),
        ("window_id", _u64), ("timestamp_ns", _u64), ("graph_exec", _u64), ("span", SpanC),
        ("stack", StackC),
    ]


class ActivityC(ctypes.Structure):
    """struct otel_gpu_activity."""

    _fields_ = [
        ("kind", _u32), ("correlation_id", _u32), ("start_ns", _u64), ("end_ns", _u64),
        ("device_id", _u32), ("stream_id", _u32), ("graph_id", _u32), ("name_len", _u32), ("bytes", _u64),
        ("copy_kind", _u8), ("src_kind", _u8), ("dst_kind", _u8), ("reserved", _u8 * 5),
        ("name", ctypes.c_char * MAX_NAME),
    ]


class SyncC(ctypes.Structure):
    """struct otel_gpu_sync."""

    _fields_ = [
        ("abi_version", _u32), ("kind", _u32), ("cbid", _s32), ("reserved", _u32),
        ("start_ns", _u64), ("end_ns", _u64), ("weight", _u64), ("span", SpanC),
        ("stack", StackC),
    ]


class GraphReplaysC(ctypes.Structure):
    """struct otel_gpu_graph_replays: one graph exec's replays since the library attached."""

    _fields_ = [("exec", _u64), ("replays", _u64)]


class WindowC(ctypes.Structure):
    """struct otel_gpu_window."""

    _fields_ = [
        ("abi_version", _u32), ("open_us", _u32), ("window_id", _u64), ("start_ns", _u64), ("end_ns", _u64),
        ("covered_ns", _u64), ("elapsed_ns", _u64), ("launches", _u64), ("dropped", _u64), ("overhead_ns", _u64),
        ("window_waits", _u64), ("shadow_waits", _u64), ("shadow_ns", _u64), ("yielded_ns", _u64), ("yields", _u64),
        ("aside_since_ns", _u64), ("launches_total", _u64), ("shadow_launches", _u64), ("shadow_launch_ns", _u64),
        ("linger_ns", _u64), ("linger_launches", _u64),
        ("graph_other_replays", _u64), ("graph_count", _u32), ("reserved", _u32),
        ("graphs", GraphReplaysC * GRAPH_SLOTS),
    ]


MAX_RECORD = max(ctypes.sizeof(SyncC), ctypes.sizeof(LaunchC))

# --- gpu_time.h: the eBPF program's records ---------------------------------------------------------------------------

KSTACK_DEPTH = 64


class EventType(enum.IntEnum):
    """enum otel_gpu_event_type: what follows a ring-buffer record's header."""

    LAUNCH = 1
    ACTIVITY = 2
    SYNC = 3
    WINDOW = 4


class DropReason(enum.IntEnum):
    """enum otel_gpu_drop_reason: indices of the program's per-CPU drop counters."""

    RINGBUF_FULL = 0
    READ_FAILED = 1
    BAD_LENGTH = 2


class EventC(ctypes.Structure):
    """struct otel_gpu_event."""

    _fields_ = [
        ("type", _u32), ("pid", _u32), ("tid", _u32), ("payload_len", _u32), ("ktime_ns", _u64),
        ("comm", ctypes.c_char * COMM_LEN),
    ]


class KStackC(ctypes.Structure):
    """struct otel_gpu_kstack."""

    _fields_ = [("bytes", _s32), ("reserved", _u32), ("pcs", _u64 * KSTACK_DEPTH)]


# The enumerators by their C names less the prefix, for the modules that import them so.
LAUNCH_KERNEL, LAUNCH_GRAPH, LAUNCH_MEMCPY, LAUNCH_MEMSET = LaunchKind
ACTIVITY_KERNEL, ACTIVITY_MEMCPY, ACTIVITY_MEMSET = ActivityKind
SYNC_STREAM, SYNC_CONTEXT, SYNC_EVENT, SYNC_MEMCPY = SyncKind
EVENT_LAUNCH, EVENT_ACTIVITY, EVENT_SYNC, EVENT_WINDOW = EventType
DROP_RINGBUF_FULL, DROP_READ_FAILED, DROP_BAD_LENGTH = DropReason
DROP_REASONS = tuple(reason.name.lower() for reason in DropReason)  # the drop counters' names, by index

# --- decoded records ------------------------------------------------------------------------------------------------
# Launch, Activity, Sync and Window are built for every record the agent reads: they are slotted dataclasses that
# nothing changes, not frozen ones (a frozen dataclass's __init__ sets each field through object.__setattr__, five
# times the cost, a fifth of decoding a record). Build changed copies with dataclasses.replace.


@dataclass(frozen=True, slots=True)
class PythonFrame:
    """One interpreter frame: qualified function name, source file and line."""

    name: str
    filename: str
    line: int
    first_line: int = 0


@dataclass(frozen=True, slots=True, eq=False)
class Stack:
    """The launching thread's stack: native PCs leaf first, Python frames innermost first, and the kernel's
    fallback user stack (bpf_get_stack) for when the library's own unwind is empty.

    Decoded stacks carry ``key``, the raw bytes they came from: equality and hashing use it (fast, and the same
    stack seen twice is one cache entry); stacks built by hand compare by content.
    """

    native: tuple[int, ...] = ()
    python: tuple[PythonFrame, ...] = ()
    flags: int = 0
    kernel_native: tuple[int, ...] = ()
    key: bytes = field(default=b"", repr=False)

    def _identity(self) -> object:
        return self.key or (self.native, self.python, self.flags, self.kernel_native)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stack) and self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())


@dataclass(slots=True)
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
    trace_id: str = ""  # hex, "" outside any span
    span_id: str = ""  # hex: the active span's local root (docs/span-context.md), "" outside any span


@dataclass(slots=True)
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


@dataclass(slots=True)
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
    trace_id: str = ""  # hex, "" outside any span
    span_id: str = ""  # hex: the active span's local root (docs/span-context.md), "" outside any span

    @property
    def blocked_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns)


@dataclass(slots=True)
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
    # the program's pace, totals since the library started: blocking waits that ended inside windows (over
    # covered_ns) and inside the shadow windows of the gaps, where only waits are observed (over shadow_ns)
    window_waits: int = 0
    shadow_waits: int = 0
    shadow_ns: int = 0
    # time another tool of the program (torch.profiler, ...) held CUPTI so that no window could open, and how many
    # times the library stepped aside (totals since the library started; covered/elapsed restart after each)
    yielded_ns: int = 0
    yields: int = 0
    aside_since_ns: int = 0  # non-zero in the record of the moment the library stepped aside (CUPTI clock, unix ns)
    # the pace by launches (totals since the library started): launches recorded in windows (over covered_ns), and
    # launches counted in the shadow windows over those shadows' time (counted only while CUPTI stays subscribed)
    launches_total: int = 0
    shadow_launches: int = 0
    shadow_launch_ns: int = 0
    # lingers (totals since the library started): the time after windows while their GPU work was awaited with the
    # activity kinds on (the program runs slowed, nearly as in a window), and the launches counted in that time
    linger_ns: int = 0
    linger_launches: int = 0
    open_us: int = 0  # how long switching the library's callbacks and activity on took when the window opened
    # every replay of a CUDA graph since the library attached: (graph exec, replays) per exec the library's table
    # holds, and the replays of execs beyond it (those are weighted by windows)
    graph_replays: tuple[tuple[int, int], ...] = ()
    graph_other_replays: int = 0
    abi_version: int = ABI_VERSION  # PREVIOUS_ABI_VERSION: the library of the release before (no linger totals)


Record = Launch | Activity | Sync | Window


class DecodeError(ValueError):
    """A ring-buffer record that does not match the ABI (short, unknown type or ABI version)."""


_EVENT = struct.Struct("<IIIIQ16s")
_KSTACK_HEAD = struct.Struct("<iI")
_LAUNCH_HEAD = struct.Struct("<IIIiQQQ16s8s8s")
_SYNC_HEAD = struct.Struct("<IIiIQQQ16s8s8s")
_STACK_HEAD = struct.Struct("<IIII")
_PYTHON_FRAME = struct.Struct("<IIII")
_ACTIVITY_HEAD = struct.Struct("<IIQQIIIIQBBB")
_WINDOW = struct.Struct("<IIQQQQQQQQQQQQQQQQQQQ")  # up to linger_launches
_WINDOW_6 = struct.Struct("<IIQQQQQQQQQQQQQQQQQ")  # ABI 6: up to shadow_launch_ns, then the graphs
_WINDOW_GRAPHS = struct.Struct("<QII")  # graph_other_replays, graph_count, reserved
_GRAPH_REPLAYS = struct.Struct("<QQ")
_EVENT_SIZE = _EVENT.size
_EVENT_UNPACK = _EVENT.unpack_from  # bound once: these run for every record
_LAUNCH_HEAD_UNPACK = _LAUNCH_HEAD.unpack_from
_SYNC_HEAD_UNPACK = _SYNC_HEAD.unpack_from
_ACTIVITY_HEAD_UNPACK = _ACTIVITY_HEAD.unpack_from
_STACK_HEAD_UNPACK = _STACK_HEAD.unpack_from
_KSTACK_HEAD_UNPACK = _KSTACK_HEAD.unpack_from
_KSTACK_SIZE = ctypes.sizeof(KStackC)
_NATIVE_OFFSET = StackC.native.offset
_PYTHON_OFFSET = StackC.python.offset
_STRINGS_OFFSET = StackC.strings.offset
_ACTIVITY_NAME_OFFSET = ActivityC.name.offset
_STACK_CACHE: dict[bytes, Stack] = {}
_STACK_CACHE_SIZE = 8192

assert _EVENT.size == ctypes.sizeof(EventC) and _WINDOW.size == WindowC.graph_other_replays.offset
assert _WINDOW.size + _WINDOW_GRAPHS.size == WindowC.graphs.offset
assert _LAUNCH_HEAD.size == LaunchC.stack.offset and _SYNC_HEAD.size == SyncC.stack.offset


_NO_SPAN = bytes(8)
_LAUNCH_SIZE = ctypes.sizeof(LaunchC)
_SYNC_SIZE = ctypes.sizeof(SyncC)
_ACTIVITY_SIZE = ctypes.sizeof(ActivityC)
_WINDOW_SIZE = ctypes.sizeof(WindowC)
_PREVIOUS_VERSION = struct.pack("<I", PREVIOUS_ABI_VERSION)
# Thread and kernel names repeat from record to record: each raw name is decoded once (bounded: cleared when full).
_NAMES: dict[bytes, str] = {}
_NAMES_SIZE = 4096


def _span_ids(trace_id: bytes, span_id: bytes, local_root_span_id: bytes) -> tuple[str, str]:
    """Hex trace id and the span id samples are labelled with: the local root of the active span (what Grafana's
    traces-to-profiles selects by, docs/span-context.md), else the active span; both "" outside any span."""
    if span_id == _NO_SPAN:
        return "", ""
    return trace_id.hex(), (span_id if local_root_span_id == _NO_SPAN else local_root_span_id).hex()


def _name(raw: bytes) -> str:
    """A NUL-terminated name of a record, decoded (cached by its raw bytes)."""
    name = _NAMES.get(raw)
    if name is None:
        if len(_NAMES) >= _NAMES_SIZE:
            _NAMES.clear()
        name = _NAMES[raw] = raw.split(b"\0", 1)[0].decode("utf-8", "replace")
    return name


def _cstring(raw: bytes, offset: int, limit: int) -> str:
    if offset >= limit:
        return ""
    end = raw.find(b"\0", offset, limit)
    return raw[offset:end if end >= 0 else limit].decode("utf-8", "replace")


def decode_stack(stack: StackC, kstack: KStackC | None = None) -> Stack:
    """Plain :class:`Stack` from ctypes mirrors of the library's stack and the eBPF fallback stack."""
    return _stack_from(bytes(stack), 0, bytes(kstack) if kstack is not None else b"")


def _stack_from(buf: bytes, base: int, kstack: bytes) -> Stack:
    """The stack at ``buf[base:]`` (bytes past its end read as zero, as in the full struct) plus the fallback stack
    bytes; cached by the bytes in use, since a loop launches from the same few stacks over and over."""
    if len(buf) < base + _STACK_HEAD.size:
        buf = _padded(buf, base + _STACK_HEAD.size)
    native_count, python_count, strings_len, flags = _STACK_HEAD_UNPACK(buf, base)
    native_count = MAX_NATIVE_FRAMES if native_count > MAX_NATIVE_FRAMES else native_count
    python_count = MAX_PYTHON_FRAMES if python_count > MAX_PYTHON_FRAMES else python_count
    strings_len = MAX_STRINGS if strings_len > MAX_STRINGS else strings_len
    kernel_count = 0
    if kstack:
        kbytes = _KSTACK_HEAD_UNPACK(kstack)[0]
        kernel_count = min(kbytes // 8, KSTACK_DEPTH) if kbytes > 0 else 0
    native_at, python_at, strings_at = base + _NATIVE_OFFSET, base + _PYTHON_OFFSET, base + _STRINGS_OFFSET
    native_end, python_end = native_at + 8 * native_count, python_at + 16 * python_count
    strings_end = strings_at + strings_len  # the struct's last member: the end of every part in use
    if len(buf) < strings_end:
        buf = _padded(buf, strings_end)
    key = b"".join((buf[base:native_end], buf[python_at:python_end], buf[strings_at:strings_end],
                    kstack[:8 + 8 * kernel_count]))
    cached = _STACK_CACHE.get(key)
    if cached is not None:
        return cached
    native = struct.unpack_from(f"<{native_count}Q", buf, native_at)
    strings = buf[strings_at:strings_end]
    python = []
    for index in range(python_count):
        line, name_at, file_at, first_line = _PYTHON_FRAME.unpack_from(buf, python_at + 16 * index)
        python.append(PythonFrame(_cstring(strings, name_at, strings_len), _cstring(strings, file_at, strings_len),
                                  line, first_line))
    kernel_native = tuple(pc for pc in struct.unpack_from(f"<{kernel_count}Q", kstack, 8) if pc)
    stack = Stack(native, tuple(python), flags, kernel_native, key)
    if len(_STACK_CACHE) >= _STACK_CACHE_SIZE:  # the oldest out: equal stacks are equal whichever object is kept
        del _STACK_CACHE[next(iter(_STACK_CACHE))]
    _STACK_CACHE[key] = stack
    return stack


def _padded(buf: bytes, size: int) -> bytes:
    """``buf`` zero-padded to at least ``size`` bytes (the library sends only the used prefix of its structs)."""
    return buf if len(buf) >= size else buf + bytes(size - len(buf))


def decode_event(data: bytes) -> Record:
    """Decode one ring-buffer record written by gpu_time.bpf.c. Raises :class:`DecodeError` on a bad record."""
    if len(data) < _EVENT_SIZE:
        raise DecodeError(f"record of {len(data)} bytes is shorter than its header")
    kind, pid, tid, payload_len, _, raw_comm = _EVENT_UNPACK(data)
    if kind == EVENT_LAUNCH or kind == EVENT_SYNC:
        if len(data) < _EVENT_SIZE + _KSTACK_SIZE:
            raise DecodeError("launch/sync record without its stack")
        kstack = data[_EVENT_SIZE:_EVENT_SIZE + _KSTACK_SIZE]
        offset = _EVENT_SIZE + _KSTACK_SIZE
        if kind == EVENT_LAUNCH:
            buf = _padded(data[offset:offset + min(payload_len, _LAUNCH_SIZE)], _LAUNCH_HEAD.size)
            (version, launch_kind, corr, cbid, window_id, timestamp_ns, graph_exec, trace_id, span_id,
             root_id) = _LAUNCH_HEAD_UNPACK(buf)
            _check_version(version, "launch")
            return Launch(pid, tid, _name(raw_comm), launch_kind, corr, cbid, window_id, timestamp_ns, graph_exec,
                          _stack_from(buf, _LAUNCH_HEAD.size, kstack), *_span_ids(trace_id, span_id, root_id))
        buf = _padded(data[offset:offset + min(payload_len, _SYNC_SIZE)], _SYNC_HEAD.size)
        version, sync_kind, cbid, _, start_ns, end_ns, weight, trace_id, span_id, root_id = _SYNC_HEAD_UNPACK(buf)
        _check_version(version, "sync")
        return Sync(pid, tid, _name(raw_comm), sync_kind, cbid, start_ns, end_ns, max(weight, 1),
                    _stack_from(buf, _SYNC_HEAD.size, kstack), *_span_ids(trace_id, span_id, root_id))
    if kind == EVENT_ACTIVITY:
        buf = _padded(data[_EVENT_SIZE:_EVENT_SIZE + min(payload_len, _ACTIVITY_SIZE)], _ACTIVITY_NAME_OFFSET)
        (activity_kind, corr, start_ns, end_ns, device, stream, graph, name_len, nbytes, copy_kind, src_kind,
         dst_kind) = _ACTIVITY_HEAD_UNPACK(buf)
        name_len = min(name_len, MAX_NAME - 1)
        name = _name(buf[_ACTIVITY_NAME_OFFSET:_ACTIVITY_NAME_OFFSET + name_len])
        return Activity(pid, activity_kind, corr, start_ns, end_ns, device, stream, graph, name, nbytes, copy_kind,
                        src_kind, dst_kind)
    if kind == EVENT_WINDOW:
        buf = _padded(data[_EVENT_SIZE:_EVENT_SIZE + min(payload_len, _WINDOW_SIZE)], _WINDOW_SIZE)
        head = _WINDOW_6 if buf[:4] == _PREVIOUS_VERSION else _WINDOW
        fields = head.unpack_from(buf)
        _check_version(fields[0], "window")
        other, count, _ = _WINDOW_GRAPHS.unpack_from(buf, head.size)
        at = head.size + _WINDOW_GRAPHS.size
        graphs = tuple(_GRAPH_REPLAYS.unpack_from(buf, at + _GRAPH_REPLAYS.size * index)
                       for index in range(min(count, GRAPH_SLOTS)))
        return Window(pid, *fields[2:], open_us=fields[1], graph_replays=graphs, graph_other_replays=other,
                      abi_version=fields[0])
    raise DecodeError(f"unknown record type {kind}")


def _check_version(version: int, what: str) -> None:
    if version != ABI_VERSION and version != PREVIOUS_ABI_VERSION:
        raise DecodeError(f"{what} record has ABI version {version}, this agent reads {PREVIOUS_ABI_VERSION} and "
                          f"{ABI_VERSION}")

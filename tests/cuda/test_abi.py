# SPDX-License-Identifier: Apache-2.0
"""Decoding ring-buffer records with otel_gpu.cuda.abi: round trips through the ctypes mirrors, and bad records.
The mirrors' layout against the C headers is checked once, with every other mirror, in tests/ebpf/test_abi.py."""

from __future__ import annotations

import ctypes
import struct
from dataclasses import replace

import pytest

from otel_gpu.cuda import abi


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


@pytest.mark.parametrize(("root", "labelled"), [(b"\x0c" * 8, "0c" * 8), (bytes(8), "0b" * 8)])
def test_launch_and_sync_records_are_labelled_with_the_local_root_else_the_active_span(root: bytes,
                                                                                      labelled: str) -> None:
    span = abi.SpanC.from_buffer_copy(b"\x0a" * 16 + b"\x0b" * 8 + root)  # trace, active span, local root
    launch = abi.LaunchC(abi_version=abi.ABI_VERSION, kind=abi.LAUNCH_KERNEL, span=span)
    sync = abi.SyncC(abi_version=abi.ABI_VERSION, kind=abi.SYNC_STREAM, cbid=126, end_ns=1, weight=1, span=span)
    for kind, rec in ((abi.EVENT_LAUNCH, launch), (abi.EVENT_SYNC, sync)):
        record = abi.decode_event(_event(kind, 10, 11, bytes(rec), abi.KStackC()))
        assert (record.trace_id, record.span_id) == ("0a" * 16, labelled)  # type: ignore[union-attr]
    none = abi.decode_event(_event(abi.EVENT_LAUNCH, 10, 11, bytes(abi.LaunchC(abi_version=abi.ABI_VERSION)),
                                   abi.KStackC()))
    assert (none.trace_id, none.span_id) == ("", "")  # type: ignore[union-attr]


@pytest.mark.parametrize("cut", ["head", "native", "python", "strings"])
def test_a_record_cut_short_decodes_as_its_zero_padded_struct(cut: str) -> None:
    """Bytes a record does not carry read as zero, wherever it ends (a short or damaged record)."""
    launch = abi.LaunchC(abi_version=abi.ABI_VERSION, kind=abi.LAUNCH_KERNEL, correlation_id=5, window_id=1)
    launch.stack.native_count, launch.stack.python_count, launch.stack.strings_len = 3, 2, 20
    for index in range(3):
        launch.stack.native[index] = 0x1000 + index
    for index in range(2):
        launch.stack.python[index] = abi.PythonFrameC(line=index + 1, name_offset=0, filename_offset=6)
    ctypes.memmove(ctypes.addressof(launch) + abi.LaunchC.stack.offset + abi.StackC.strings.offset, b"step\0\0f.py\0",
                   12)
    stack_at = abi.LaunchC.stack.offset
    length = {"head": stack_at + 8, "native": stack_at + abi.StackC.native.offset + 12,
              "python": stack_at + abi.StackC.python.offset + 20, "strings": stack_at + abi.StackC.strings.offset + 8}
    raw = bytes(launch)[:length[cut]]
    padded = raw + bytes(ctypes.sizeof(abi.LaunchC) - len(raw))
    short = abi.decode_event(_event(abi.EVENT_LAUNCH, 1, 1, raw, abi.KStackC()))
    full = abi.decode_event(_event(abi.EVENT_LAUNCH, 1, 1, padded, abi.KStackC()))
    assert isinstance(short, abi.Launch) and isinstance(full, abi.Launch)
    assert short == full
    assert (short.stack.native, short.stack.python, short.stack.key) == (full.stack.native, full.stack.python,
                                                                         full.stack.key)


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


def test_decode_window_graph_replays() -> None:
    window = abi.WindowC(abi_version=abi.ABI_VERSION, window_id=6, covered_ns=10, elapsed_ns=100,
                         graph_other_replays=17, graph_count=2)
    window.graphs[0] = abi.GraphReplaysC(exec=0x7F00AA00, replays=120)
    window.graphs[1] = abi.GraphReplaysC(exec=0x7F00BB00, replays=3)
    window.graphs[2] = abi.GraphReplaysC(exec=0xDEAD, replays=9)  # beyond graph_count: not in use
    record = abi.decode_event(_event(abi.EVENT_WINDOW, 10, 10, bytes(window)))
    assert isinstance(record, abi.Window) and record.window_id == 6
    assert record.graph_replays == ((0x7F00AA00, 120), (0x7F00BB00, 3))
    assert record.graph_other_replays == 17
    # a count past the table (a corrupt record) reads no further than the table
    window.graph_count = abi.GRAPH_SLOTS + 5
    record = abi.decode_event(_event(abi.EVENT_WINDOW, 10, 10, bytes(window)))
    assert isinstance(record, abi.Window) and len(record.graph_replays) == abi.GRAPH_SLOTS


def test_the_previous_abi_is_read_so_a_workload_outlives_an_agent_upgrade() -> None:
    """ABI 6 (the library of the release before) has the window record without the linger totals: the same fields
    and graph table 16 bytes earlier. Its launches and waits are laid out as now."""
    window = abi.WindowC(abi_version=abi.ABI_VERSION, window_id=6, start_ns=5, end_ns=9, covered_ns=10,
                         elapsed_ns=100, launches=3, launches_total=40, shadow_launches=7, shadow_launch_ns=70,
                         linger_ns=0, linger_launches=0, graph_other_replays=17, graph_count=1)
    window.graphs[0] = abi.GraphReplaysC(exec=0x7F00AA00, replays=120)
    now = bytes(window)
    linger = abi.WindowC.linger_ns.offset
    old = struct.pack("<I", 6) + now[4:linger] + now[linger + 16:]  # as the ABI 6 library lays it out
    assert old[abi.WindowC.graph_other_replays.offset - 16:][:8] == (17).to_bytes(8, "little")
    record = abi.decode_event(_event(abi.EVENT_WINDOW, 10, 10, old + bytes(16)))  # the probe reads 16 bytes past it
    expected = abi.decode_event(_event(abi.EVENT_WINDOW, 10, 10, now))
    assert record == replace(expected, abi_version=6) and record.graph_replays == ((0x7F00AA00, 120),)
    launch = abi.LaunchC(abi_version=6, kind=abi.LAUNCH_KERNEL, correlation_id=5, window_id=6)
    decoded = abi.decode_event(_event(abi.EVENT_LAUNCH, 10, 11, bytes(launch), abi.KStackC()))
    assert isinstance(decoded, abi.Launch) and decoded.correlation_id == 5
    with pytest.raises(abi.DecodeError, match="reads 6 and 7"):
        abi.decode_event(_event(abi.EVENT_WINDOW, 10, 10, struct.pack("<I", 5) + old[4:]))


def test_decode_rejects_bad_records() -> None:
    with pytest.raises(abi.DecodeError):
        abi.decode_event(b"\0" * 8)
    with pytest.raises(abi.DecodeError):
        abi.decode_event(_event(99, 1, 1, b""))
    window = abi.WindowC(abi_version=abi.ABI_VERSION + 1)
    with pytest.raises(abi.DecodeError):
        abi.decode_event(_event(abi.EVENT_WINDOW, 1, 1, bytes(window)))

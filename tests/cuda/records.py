# SPDX-License-Identifier: Apache-2.0
"""Builders of decoded GPU-time records for the pure tests (what abi.decode_event would return)."""

from __future__ import annotations

from otel_gpu.cuda import abi


def stack(*pcs: int, python: tuple[abi.PythonFrame, ...] = ()) -> abi.Stack:
    return abi.Stack(native=tuple(pcs), python=python, flags=abi.STACK_FLAG_PYTHON if python else 0)


def launch(pid: int, corr: int, window: int = 1, kind: int = abi.LAUNCH_KERNEL, tid: int = 0,
           stack_: abi.Stack | None = None, comm: str = "worker",
           timestamp_ns: int = 0) -> abi.Launch:
    return abi.Launch(pid, tid or pid, comm, kind, corr, 307, window, timestamp_ns, 0xabc if kind == abi.LAUNCH_GRAPH else 0,
                      stack_ or stack(0x1000 + corr))


def kernel(pid: int, corr: int, duration_ns: int, name: str = "_Z6matmulPfS_S_i", start_ns: int = 1000,
           device: int = 0, stream: int = 7, graph: int = 0) -> abi.Activity:
    return abi.Activity(pid, abi.ACTIVITY_KERNEL, corr, start_ns, start_ns + duration_ns, device, stream, graph, name,
                        0, 0, 0, 0)


def memcpy(pid: int, corr: int, duration_ns: int, nbytes: int, copy_kind: int = 2, src_kind: int = 3,
           dst_kind: int = 1) -> abi.Activity:
    return abi.Activity(pid, abi.ACTIVITY_MEMCPY, corr, 0, duration_ns, 0, 7, 0, "", nbytes, copy_kind, src_kind,
                        dst_kind)


def window(pid: int, window_id: int, covered_ns: int, elapsed_ns: int, launches: int = 0, window_waits: int = 0,
           shadow_waits: int = 0, shadow_ns: int = 0, yielded_ns: int = 0, yields: int = 0,
           aside_since_ns: int = 0) -> abi.Window:
    return abi.Window(pid, window_id, 0, 0, covered_ns, elapsed_ns, launches, 0, 0, window_waits, shadow_waits,
                      shadow_ns, yielded_ns, yields, aside_since_ns)


def sync(pid: int, blocked_ns: int, weight: int = 1, kind: int = abi.SYNC_STREAM, cbid: int = 126,
         stack_: abi.Stack | None = None, tid: int = 0) -> abi.Sync:
    return abi.Sync(pid, tid or pid, "worker", kind, cbid, 100, 100 + blocked_ns, weight, stack_ or stack(0x9000))


def decoded_window(rec: abi.WindowC, pid: int) -> abi.Window:
    """A window record as the library fired it (its C layout, e.g. from the debug file), decoded."""
    skip = ("abi_version", "graph_count", "reserved", "graphs")
    fields = {name: getattr(rec, name) for name, _ in abi.WindowC._fields_ if name not in skip}
    graphs = tuple((rec.graphs[i].exec, rec.graphs[i].replays) for i in range(min(rec.graph_count, abi.GRAPH_SLOTS)))
    return abi.Window(pid=pid, graph_replays=graphs, **fields)

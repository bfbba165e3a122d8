# SPDX-License-Identifier: Apache-2.0
"""Pure pieces of the GPU-time profiles: leaf frames for kernels, copies, sets and waits, their sample attributes,
the merge of Python frames into a native stack, and the accumulator that sums weighted values into a ProfileBatch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from otel_gpu import semconv
from otel_gpu.cuda import abi
from otel_gpu.cuda._cbids import DRIVER_API_NAMES
from otel_gpu.procfs import ProcessInfo
from otel_gpu.profiles.model import Frame, FrameKind, ProcessProfile, ProfileBatch, ProfileType, Sample
from otel_gpu.symbolize.demangle import demangle

# CUpti_ActivityMemcpyKind and CUpti_ActivityMemoryKind
_COPY_KINDS = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD", 9: "HtoH",
               10: "PtoP"}
_MEMORY_KINDS = {1: "pageable", 2: "pinned", 3: "device", 4: "array", 5: "managed", 6: "device", 7: "managed"}
_HOST_SIDE = {"HtoD": "src", "HtoA": "src", "DtoH": "dst", "AtoH": "dst", "HtoH": "src"}
_SYNC_KINDS = {abi.SYNC_STREAM: "cuStreamSynchronize", abi.SYNC_CONTEXT: "cuCtxSynchronize",
               abi.SYNC_EVENT: "cuEventSynchronize", abi.SYNC_MEMCPY: "blocking memcpy"}
# NCCL's kernels, mangled or not: ncclDevKernel_AllReduce_Sum_f32_RING_LL (2.19+),
# ncclKernel_AllReduce_RING_LL_Sum_float (older). ncclDevKernel_Generic runs whatever collective it is handed: "other".
_NCCL_KERNEL = re.compile(r"nccl(?:Dev)?Kernel_(AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|SendRecv|Send|Recv)"
                          r"(?![A-Za-z])")
_NCCL_COLLECTIVES = dict(zip(("AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce", "SendRecv", "Send",
                              "Recv"), semconv.NCCL_COLLECTIVE_NAMES[:-1], strict=True))


def format_bytes(count: int) -> str:
    """``count`` bytes in binary units with one decimal: 512 B, 4.0 KiB, 4.0 MiB, 1.5 GiB."""
    if count < 1024:
        return f"{count} B"
    value = float(count)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}"
    return f"{count} B"  # unreachable


def copy_kind_name(activity: abi.Activity) -> str:
    return _COPY_KINDS.get(activity.copy_kind, "unknown")


def host_memory_kind(activity: abi.Activity) -> str:
    """"pageable" or "pinned" for the host side of a copy, "" when no side is on the host."""
    side = _HOST_SIDE.get(copy_kind_name(activity))
    if side is None:
        return ""
    return _MEMORY_KINDS.get(activity.src_kind if side == "src" else activity.dst_kind, "unknown")


def work_frame(activity: abi.Activity) -> Frame:
    """The leaf frame of one piece of GPU work: the kernel (demangled, mangled kept), or a named copy/set."""
    if activity.kind == abi.ACTIVITY_MEMCPY:
        host = host_memory_kind(activity)
        label = f"memcpy {copy_kind_name(activity)} {format_bytes(activity.bytes)}" + (f" {host}" if host else "")
        return Frame(f"[{label}]", FrameKind.CUDA)
    if activity.kind == abi.ACTIVITY_MEMSET:
        return Frame(f"[memset {format_bytes(activity.bytes)}]", FrameKind.CUDA)
    if not activity.name:
        return Frame("[unknown kernel]", FrameKind.CUDA)
    return Frame(demangle(activity.name), FrameKind.CUDA, system_name=activity.name)


def nccl_collective(kernel_name: str) -> str | None:
    """The collective (``all_reduce``, ``send_recv``, ...) an NCCL kernel runs, from its (mangled or plain) name;
    ``other`` for an NCCL kernel whose name does not say, None for other kernels."""
    if "ncclDevKernel_" not in kernel_name and "ncclKernel_" not in kernel_name:
        return None
    match = _NCCL_KERNEL.search(kernel_name)
    return _NCCL_COLLECTIVES[match.group(1)] if match else "other"


def work_attributes(activity: abi.Activity) -> tuple[tuple[str, str | int], ...]:
    """Sample attributes of GPU work: device, stream, graph (when part of one), the NCCL collective of an NCCL kernel,
    and copy/set details."""
    attrs: list[tuple[str, str | int]] = [(semconv.CUDA_DEVICE, activity.device_id),
                                          (semconv.CUDA_STREAM, activity.stream_id)]
    if activity.graph_id:
        attrs.append((semconv.CUDA_GRAPH, activity.graph_id))
    if activity.kind == abi.ACTIVITY_KERNEL and (collective := nccl_collective(activity.name)):
        attrs.append((semconv.NCCL_COLLECTIVE, collective))
    if activity.kind == abi.ACTIVITY_MEMCPY:
        attrs.append((semconv.CUDA_MEMCPY_KIND, copy_kind_name(activity)))
        if host := host_memory_kind(activity):
            attrs.append((semconv.CUDA_HOST_MEMORY, host))
    if activity.kind in (abi.ACTIVITY_MEMCPY, abi.ACTIVITY_MEMSET):
        attrs.append((semconv.CUDA_MEMORY_BYTES, activity.bytes))
    return tuple(attrs)


def sync_api_name(sync: abi.Sync) -> str:
    """The driver call that blocked (from its CUPTI callback id, else from the wait's kind)."""
    return DRIVER_API_NAMES.get(sync.cbid) or _SYNC_KINDS.get(sync.kind, "synchronize")


def sync_frame(sync: abi.Sync) -> Frame:
    """The leaf frame of a wait, e.g. ``[cuStreamSynchronize]``."""
    return Frame(f"[{sync_api_name(sync)}]", FrameKind.CUDA)


def python_frames(frames: Sequence[abi.PythonFrame]) -> tuple[Frame, ...]:
    return tuple(Frame(f.name or "<unknown>", FrameKind.PYTHON, filename=f.filename, line=f.line) for f in frames)


# a sample's identity in the accumulator: (frames, thread id, thread name, attributes, trace id, span id); a plain
# tuple, hashed in C (stacks.FrameStack frames hash in one call, not one per frame)
_Key = tuple[tuple[Frame, ...], int, str, tuple[tuple[str, str | int], ...], str, str]


class ProfileAccumulator:
    """Sums weighted values per (process, stack, thread, attributes) over one reporting interval."""

    def __init__(self, profile_type: ProfileType) -> None:
        self.profile_type = profile_type
        self._values: dict[int, dict[_Key, float]] = {}

    def add(self, pid: int, frames: tuple[Frame, ...], value: float, thread_id: int = 0, thread_name: str = "",
            attributes: tuple[tuple[str, str | int], ...] = (), trace_id: str = "", span_id: str = "") -> None:
        """``trace_id``/``span_id``: hex ids of the span the work was launched or waited in, "" outside any."""
        samples = self._values.get(pid)
        if samples is None:
            samples = self._values[pid] = {}
        key = (frames, thread_id, thread_name, attributes, trace_id, span_id)
        samples[key] = samples.get(key, 0.0) + value

    def pids(self) -> set[int]:
        return set(self._values)

    def total(self, pid: int | None = None) -> float:
        """Sum of values (of ``pid``, or all processes)."""
        groups = [self._values.get(pid, {})] if pid is not None else list(self._values.values())
        return sum(sum(group.values()) for group in groups)

    def build(self, start_unix_nano: int, duration_nano: int, processes: Mapping[int, ProcessInfo],
              sampling_fraction: float = 1.0,
              attributes: tuple[tuple[str, str | int | float], ...] = (),
              process_attributes: Mapping[int, tuple[tuple[str, str | int | float], ...]] | None = None
              ) -> ProfileBatch:
        """The batch of everything added (values rounded to integers), then start over.

        ``processes`` names each pid; a pid missing there gets a bare ProcessInfo with its pid.
        ``process_attributes``: profile attributes by pid; a pid that has some is in the batch even with no samples.
        """
        stated = process_attributes or {}
        profiles = []
        for pid in sorted(self._values.keys() | stated.keys()):
            samples = tuple(
                Sample(tuple(frames), round(value), thread_id, thread_name, attributes, trace_id, span_id)
                for (frames, thread_id, thread_name, attributes, trace_id, span_id), value
                in sorted(self._values.get(pid, {}).items(), key=lambda item: -item[1])
                if round(value) > 0
            )
            if samples or stated.get(pid):
                info = processes.get(pid) or ProcessInfo(pid=pid, executable_name="")
                profiles.append(ProcessProfile(info, samples, stated.get(pid, ())))
        self._values.clear()
        return ProfileBatch(self.profile_type, start_unix_nano, duration_nano, tuple(profiles),
                            sampling_fraction=sampling_fraction, attributes=attributes)

# SPDX-License-Identifier: Apache-2.0
"""The profile model: plain frozen values shared by every profile source, encoder and exporter.

Sources (the eBPF CPU sampler, the GPU-time joiner) produce :class:`ProfileBatch` values; encoders turn a batch
into pprof or OTLP bytes without I/O; exporters send those bytes. Stacks are stored leaf first.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from otel_gpu.procfs import ProcessInfo


class FrameKind(str, enum.Enum):
    """What produced a frame; exported as ``profile.frame.type``."""

    NATIVE = "native"
    KERNEL = "kernel"
    PYTHON = "cpython"
    CUDA = "cuda"


@dataclass(frozen=True, slots=True)
class Mapping:
    """A mapped file: where it sits in the process and how a backend can find its symbols later."""

    start: int
    limit: int
    file_offset: int
    path: str
    build_id: str = ""  # lowercase hex, "" when unknown


@dataclass(frozen=True, slots=True)
class Frame:
    """One stack frame. ``function`` is the display name (demangled); ``system_name`` the raw symbol."""

    function: str
    kind: FrameKind = FrameKind.NATIVE
    address: int = 0
    mapping: Mapping | None = None
    system_name: str = ""
    filename: str = ""
    line: int = 0
    # Frames are dictionary keys on every hot path (stacks, locations); hashing one field by field (the kind and the
    # mapping each a Python-level hash) cost more than the rest of a sample's work, so it is computed once.
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.function, self.kind.value, self.address, self.mapping,
                                                self.system_name, self.filename, self.line)))

    def __hash__(self) -> int:
        return self._hash


@dataclass(frozen=True, slots=True)
class ProfileType:
    """The sample type of a profile and its period, as OTLP and pprof name them.

    ``sample_type``/``sample_unit`` describe :attr:`Sample.value`; for ``samples/count`` profiles (CPU) the pprof
    encoder also emits ``cpu/nanoseconds`` = value x period.
    """

    sample_type: str
    sample_unit: str
    period_type: str
    period_unit: str
    period: int


def cpu_profile_type(frequency_hz: int) -> ProfileType:
    """CPU samples at ``frequency_hz``: Pyroscope files it as process_cpu:cpu:nanoseconds:cpu:nanoseconds."""
    return ProfileType("samples", "count", "cpu", "nanoseconds", round(1e9 / frequency_hz))


def gpu_time_profile_type() -> ProfileType:
    """GPU execution time in nanoseconds: Pyroscope files it as gpu:gpu_time:nanoseconds:gpu:nanoseconds."""
    return ProfileType("gpu_time", "nanoseconds", "gpu", "nanoseconds", 1)


def sync_wait_profile_type() -> ProfileType:
    """CPU time blocked on the GPU in nanoseconds: Pyroscope files it as gpu_wait:sync_wait:nanoseconds:..."""
    return ProfileType("sync_wait", "nanoseconds", "gpu_wait", "nanoseconds", 1)


@dataclass(frozen=True, slots=True)
class Sample:
    """A distinct (stack, thread, attributes) with its aggregated value over the profile's duration.

    ``value`` is in the profile type's unit (sample count for CPU, nanoseconds for GPU time).
    ``attributes`` are extra sample attributes as (key, value) pairs, e.g. ``("cuda.device", 0)``.
    ``trace_id``/``span_id`` are hex strings when the sample is linked to a trace, else "": ``span_id`` names the local
    root of the span the sample was taken in (the span with ``pyroscope.profile.id``, docs/span-context.md).
    """

    frames: tuple[Frame, ...]
    value: int
    thread_id: int = 0
    thread_name: str = ""
    attributes: tuple[tuple[str, str | int], ...] = ()
    trace_id: str = ""
    span_id: str = ""


@dataclass(frozen=True, slots=True)
class ProcessProfile:
    """Every sample of one process over one reporting interval, and what its profile states beside them.

    ``attributes`` are the process's profile attributes as (key, value) pairs, e.g. the seconds its GPU time went
    unmeasured (``otel_gpu.gpu_time.yielded``); a process may have them and no samples.
    """

    process: ProcessInfo
    samples: tuple[Sample, ...]
    attributes: tuple[tuple[str, str | int | float], ...] = ()

    def attribute(self, key: str) -> str | int | float | None:
        """The value of the profile attribute ``key``, None when absent."""
        return next((value for name, value in self.attributes if name == key), None)


@dataclass(frozen=True, slots=True)
class ProfileBatch:
    """One reporting interval of one profile type, all processes.

    ``sampling_fraction`` is the share of events the values were measured on before re-weighting (1.0 when every
    event was measured); it is exported as a profile attribute so users can judge the estimate. ``node`` holds the
    resource attributes every process of the batch shares (``host.name``, ``k8s.node.name``, ...); the agent sets it.
    """

    type: ProfileType
    start_unix_nano: int
    duration_nano: int
    processes: tuple[ProcessProfile, ...]
    sampling_fraction: float = 1.0
    attributes: tuple[tuple[str, str | int | float], ...] = field(default=())
    node: tuple[tuple[str, str], ...] = field(default=())

    @property
    def sample_count(self) -> int:
        return sum(len(p.samples) for p in self.processes)

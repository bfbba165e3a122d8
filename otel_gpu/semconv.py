# SPDX-License-Identifier: Apache-2.0
"""Every metric name, unit and attribute key the agent emits, in one place.

OpenTelemetry semantic-convention names come first (``hw.*``, ``process.*``, ``container.*``, ``k8s.*``);
NVIDIA-only readings live under ``nvidia.gpu.*``; the agent's own health under ``otel_gpu.*``.
Units are base UCUM units: W, J, By, Hz, Cel, s, and ratios 0..1 (unit ``1``).
No other module spells these strings.
"""

from __future__ import annotations

import enum
import sys
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """Name, instrument kind, unit and description of one metric."""

    name: str
    instrument: str  # "gauge" | "counter" | "updowncounter"
    unit: str
    description: str


# --- attribute keys -------------------------------------------------------------------------------------------------
HW_ID: Final = "hw.id"
HW_NAME: Final = "hw.name"
HW_MODEL: Final = "hw.model"
HW_VENDOR: Final = "hw.vendor"
HW_TYPE: Final = "hw.type"
HW_STATE: Final = "hw.state"
HW_DRIVER_VERSION: Final = "hw.driver_version"
HW_GPU_TASK: Final = "hw.gpu.task"
HW_SENSOR_LOCATION: Final = "hw.sensor_location"
HW_LIMIT_TYPE: Final = "hw.limit_type"
ERROR_TYPE: Final = "error.type"
NETWORK_IO_DIRECTION: Final = "network.io.direction"
NVIDIA_GPU_INDEX: Final = "nvidia.gpu.index"
NVIDIA_GPU_PCI_BUS_ID: Final = "nvidia.gpu.pci.bus_id"
NVIDIA_GPU_CLOCK_TYPE: Final = "nvidia.gpu.clock.type"
NVIDIA_GPU_THROTTLE_REASON: Final = "nvidia.gpu.throttle.reason"
NVIDIA_GPU_XID_CODE: Final = "nvidia.gpu.xid.code"
NVIDIA_GPU_POWER_LIMIT_TYPE: Final = "nvidia.gpu.power.limit_type"
NVIDIA_GPU_NVLINK: Final = "nvidia.gpu.nvlink"  # the link's number on its GPU (0..17 on an H200)

HOST_NAME: Final = "host.name"
SERVICE_NAME: Final = "service.name"
SERVICE_VERSION: Final = "service.version"
SERVICE_INSTANCE_ID: Final = "service.instance.id"
# semantic conventions' namespace for UUID v5 service.instance.id values (service.instance.id's note)
SERVICE_INSTANCE_ID_NAMESPACE: Final = "4d63009a-8d0f-11ee-aad7-4c796ed8e320"
K8S_NODE_NAME: Final = "k8s.node.name"
K8S_POD_UID: Final = "k8s.pod.uid"
K8S_POD_NAME: Final = "k8s.pod.name"
K8S_NAMESPACE_NAME: Final = "k8s.namespace.name"
K8S_CONTAINER_NAME: Final = "k8s.container.name"
CONTAINER_ID: Final = "container.id"
PROCESS_PID: Final = "process.pid"
PROCESS_EXECUTABLE_NAME: Final = "process.executable.name"
PROCESS_EXECUTABLE_PATH: Final = "process.executable.path"
PROCESS_COMMAND_ARGS: Final = "process.command_args"  # a string array: argv, capped, secret-named values masked
PROCESS_EXECUTABLE_BUILD_ID_GNU: Final = "process.executable.build_id.gnu"
THREAD_ID: Final = "thread.id"
THREAD_NAME: Final = "thread.name"
PROFILE_FRAME_TYPE: Final = "profile.frame.type"
CUDA_DEVICE: Final = "cuda.device"
# On a local-root span (otel_gpu.instrumentation): the cuda.device ordinals of the launches its thread made inside it
# that the injected library sampled, i.e. the devices of the span's gpu_time samples; not every device it used (the
# library sees launches only inside sampling windows). Absent when none was sampled.
CUDA_SAMPLED_DEVICES: Final = "cuda.sampled_devices"
CUDA_STREAM: Final = "cuda.stream"
CUDA_GRAPH: Final = "cuda.graph"
CUDA_MEMCPY_KIND: Final = "cuda.memcpy.kind"  # HtoD, DtoH, DtoD, ...
CUDA_MEMORY_BYTES: Final = "cuda.memory.bytes"  # bytes copied or set
CUDA_HOST_MEMORY: Final = "cuda.host_memory"  # pageable or pinned host side of a copy
CUDA_SYNC_API: Final = "cuda.sync.api"  # the driver call that blocked, e.g. cuStreamSynchronize
# The collective an NCCL kernel runs (no OpenTelemetry convention exists): one of NCCL_COLLECTIVE_NAMES, "other" for
# an NCCL kernel whose name does not say (ncclDevKernel_Generic runs whichever it is handed)
# (on gpu_time samples of NCCL kernels, and on the part of sync_wait samples during which one ran: cuda/waits.py)
NCCL_COLLECTIVE: Final = "nccl.collective"
NCCL_COLLECTIVE_NAMES: Final = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "send_recv",
                                "send", "recv", "other")
# A process's place in a distributed job (no OpenTelemetry convention exists): the RANK, LOCAL_RANK and WORLD_SIZE
# its launcher (torchrun and the launchers that follow it) set in its environment (otel_gpu/ranks.py); resource
# attributes of its profiles and attributes of its per-process GPU metrics
DISTRIBUTED_RANK: Final = "distributed.rank"
DISTRIBUTED_LOCAL_RANK: Final = "distributed.local_rank"
DISTRIBUTED_WORLD_SIZE: Final = "distributed.world_size"

OTEL_GPU_SOURCE: Final = "otel_gpu.source"
OTEL_GPU_EXPORTER: Final = "otel_gpu.exporter"
OTEL_GPU_REASON: Final = "otel_gpu.reason"
OTEL_GPU_SIGNAL: Final = "otel_gpu.signal"
OTEL_GPU_SAMPLING_FRACTION: Final = "otel_gpu.sampling_fraction"  # profile attribute: share of events measured
# profile attribute: seconds of the interval in which another tool of a profiled program (torch.profiler, Nsight, ...)
# held CUPTI, summed over processes: GPU time was not measured then (and not extrapolated into)
OTEL_GPU_GPU_TIME_YIELDED: Final = "otel_gpu.gpu_time.yielded"

# pprof sample label keys (pprof's own snake_case convention; Pyroscope keeps str labels as series labels)
PPROF_LABEL_PID: Final = "pid"
PPROF_LABEL_THREAD_ID: Final = "thread_id"
PPROF_LABEL_THREAD_NAME: Final = "thread_name"
PPROF_LABEL_CONTAINER_ID: Final = "container_id"
PPROF_LABEL_TRACE_ID: Final = "trace_id"
PPROF_LABEL_SPAN_ID: Final = "span_id"
PPROF_LABEL_RANK: Final = "rank"  # distributed.rank as a str label: a Pyroscope series label, one per rank

# --- attribute values -----------------------------------------------------------------------------------------------
HW_TYPE_GPU: Final = "gpu"
VENDOR_NVIDIA: Final = "NVIDIA"

# --- GPU metrics (per GPU: hw.id, hw.name, hw.model, nvidia.gpu.index, nvidia.gpu.pci.bus_id) ----------------------
GPU_UTILIZATION = MetricSpec("hw.gpu.utilization", "gauge", "1",
                             "Fraction of time the GPU spent on a task (hw.gpu.task: general, encoder, decoder)")
GPU_MEMORY_USAGE = MetricSpec("hw.gpu.memory.usage", "updowncounter", "By", "GPU memory used")
GPU_MEMORY_LIMIT = MetricSpec("hw.gpu.memory.limit", "updowncounter", "By", "GPU memory size")
GPU_MEMORY_UTILIZATION = MetricSpec("hw.gpu.memory.utilization", "gauge", "1", "Fraction of GPU memory used")
GPU_IO = MetricSpec("hw.gpu.io", "counter", "By", "Bytes moved over PCIe (network.io.direction)")
GPU_POWER = MetricSpec("hw.power", "gauge", "W", "Power drawn by the GPU")
GPU_ENERGY = MetricSpec("hw.energy", "counter", "J", "Energy consumed by the GPU since the driver loaded")
GPU_TEMPERATURE = MetricSpec("hw.temperature", "gauge", "Cel", "GPU temperature")
GPU_TEMPERATURE_LIMIT = MetricSpec("hw.temperature.limit", "gauge", "Cel",
                                   "GPU temperature limits (hw.limit_type: high.degraded = slowdown, "
                                   "high.critical = shutdown)")
GPU_ERRORS = MetricSpec("hw.errors", "counter", "{error}",
                        "GPU errors (error.type: corrected, uncorrected, pcie_replay, xid)")
GPU_STATUS = MetricSpec("hw.status", "updowncounter", "1", "1 for the GPU's current hw.state (ok, failed), else 0")
GPU_POWER_LIMIT = MetricSpec("nvidia.gpu.power.limit", "gauge", "W", "Enforced power limit")
GPU_MEMORY_BANDWIDTH_UTILIZATION = MetricSpec("nvidia.gpu.memory.bandwidth.utilization", "gauge", "1",
                                              "Fraction of time the memory controller was busy")
GPU_CLOCK_FREQUENCY = MetricSpec("nvidia.gpu.clock.frequency", "gauge", "Hz",
                                 "Current clock (nvidia.gpu.clock.type: sm, memory)")
GPU_CLOCK_FREQUENCY_LIMIT = MetricSpec("nvidia.gpu.clock.frequency.limit", "gauge", "Hz",
                                       "Maximum clock (nvidia.gpu.clock.type: sm, memory)")
GPU_CLOCK_THROTTLE = MetricSpec("nvidia.gpu.clock.throttle", "gauge", "{reason}",
                                "1 while the clocks are held back for nvidia.gpu.throttle.reason, else 0")
GPU_PERFORMANCE_STATE = MetricSpec("nvidia.gpu.performance_state", "gauge", "{state}",
                                   "Performance state, 0 (P0, highest) to 15 (P15, lowest)")
GPU_SM_ACTIVITY = MetricSpec("nvidia.gpu.sm.activity", "gauge", "1", "GPM: fraction of time SMs had work (Hopper+)")
GPU_SM_OCCUPANCY = MetricSpec("nvidia.gpu.sm.occupancy", "gauge", "1",
                              "GPM: resident warps over the maximum (Hopper+)")
GPU_TENSOR_ACTIVITY = MetricSpec("nvidia.gpu.tensor.activity", "gauge", "1",
                                 "GPM: fraction of time any tensor pipe was active (Hopper+)")
GPU_DRAM_ACTIVITY = MetricSpec("nvidia.gpu.dram.activity", "gauge", "1",
                               "GPM: fraction of peak DRAM bandwidth used (Hopper+)")
GPU_NVLINK_IO = MetricSpec("nvidia.gpu.nvlink.io", "counter", "By",
                           "Data bytes over one NVLink since the driver loaded (nvidia.gpu.nvlink, "
                           "network.io.direction)")
GPU_NVLINK_ERRORS = MetricSpec("nvidia.gpu.nvlink.errors", "counter", "{error}",
                               "NVLink data-link errors (nvidia.gpu.nvlink, error.type: replay, recovery, crc_flit, "
                               "crc_data)")
# Only GPUs with NVLink have these series, so they are kept apart from GPU_METRICS (which every GPU has)
NVLINK_METRICS: Final = (GPU_NVLINK_IO, GPU_NVLINK_ERRORS)
GPU_XID_LAST_TIME = MetricSpec("nvidia.gpu.xid.last_time", "gauge", "s",
                               "Unix time of the last XID error per nvidia.gpu.xid.code (counts are in hw.errors)")

# --- per-process GPU metrics (process.pid, process.executable.name, container.id, k8s.pod.uid + GPU attrs) ---------
# The process, container and pod ids are data-point attributes: the SDK's one MeterProvider has one resource (the
# node's). The Collector's k8sattributes reads resource attributes only, so collector-config/ lifts container.id and
# k8s.pod.uid to a resource of their own first (groupbyattrs/pod); the GPU-time series below are alike.
GPU_PROCESS_MEMORY_USAGE = MetricSpec("nvidia.gpu.process.memory.usage", "updowncounter", "By",
                                      "GPU memory used by the process")
GPU_PROCESS_SM_UTILIZATION = MetricSpec("nvidia.gpu.process.sm.utilization", "gauge", "1",
                                        "Fraction of time the process had kernels on the GPU's SMs")

# --- per-process GPU-time metrics (process.pid, process.executable.name, container.id, k8s.pod.uid) ---------------
GPU_PROCESS_KERNEL_LAUNCHES = MetricSpec("nvidia.gpu.process.kernel.launches", "counter", "{launch}",
                                         "CUDA launches (kernels, graphs, copies, sets) estimated from sampled windows")
GPU_PROCESS_KERNEL_TIME = MetricSpec("nvidia.gpu.process.kernel.time", "counter", "s",
                                     "GPU execution time of the process's kernels, copies and sets (re-weighted)")
GPU_PROCESS_SYNC_WAIT_TIME = MetricSpec("nvidia.gpu.process.sync_wait.time", "counter", "s",
                                        "Time the process's threads spent blocked waiting on the GPU (re-weighted)")
# per process like the three above, but a statement about the measurement, not the GPU: the profile attribute's name
GPU_TIME_YIELDED = MetricSpec("otel_gpu.gpu_time.yielded", "counter", "s",
                              "Time the process's GPU time was not measured: the injected library stood aside for "
                              "another CUPTI user (torch.profiler, ...) or for its CUDA graphs")
GPU_TIME_SAMPLED = MetricSpec("otel_gpu.gpu_time.sampled", "counter", "s",
                              "Time the injected library's sampling windows covered in the process (its rate is the "
                              "sampling fraction the overhead budget allows; the GPU-time estimates scale it up)")
GPU_TIME_METRICS: Final = (GPU_PROCESS_KERNEL_LAUNCHES, GPU_PROCESS_KERNEL_TIME, GPU_PROCESS_SYNC_WAIT_TIME,
                           GPU_TIME_YIELDED, GPU_TIME_SAMPLED)

# --- the agent's own health ----------------------------------------------------------------------------------------
SELF_COLLECTION_DURATION = MetricSpec("otel_gpu.collection.duration", "gauge", "s",
                                      "Wall time of the last collection cycle (otel_gpu.source)")
SELF_EXPORT_FAILURES = MetricSpec("otel_gpu.export.failures", "counter", "{failure}",
                                  "Exports that failed (otel_gpu.exporter, otel_gpu.signal)")
SELF_DROPPED = MetricSpec("otel_gpu.dropped", "counter", "{item}",
                          "Data the agent had to drop (otel_gpu.reason, otel_gpu.signal)")
SELF_ERRORS = MetricSpec("otel_gpu.source.errors", "counter", "{error}",
                         "Errors reading a source, by otel_gpu.source and otel_gpu.reason")

GPU_METRICS: Final = (
    GPU_UTILIZATION, GPU_MEMORY_USAGE, GPU_MEMORY_LIMIT, GPU_MEMORY_UTILIZATION, GPU_IO, GPU_POWER, GPU_ENERGY,
    GPU_TEMPERATURE, GPU_TEMPERATURE_LIMIT, GPU_ERRORS, GPU_STATUS, GPU_POWER_LIMIT, GPU_MEMORY_BANDWIDTH_UTILIZATION,
    GPU_CLOCK_FREQUENCY, GPU_CLOCK_FREQUENCY_LIMIT, GPU_CLOCK_THROTTLE, GPU_PERFORMANCE_STATE, GPU_SM_ACTIVITY,
    GPU_SM_OCCUPANCY, GPU_TENSOR_ACTIVITY, GPU_DRAM_ACTIVITY, GPU_PROCESS_MEMORY_USAGE, GPU_PROCESS_SM_UTILIZATION,
    GPU_XID_LAST_TIME,
)
SELF_PROFILE_SAMPLES = MetricSpec("otel_gpu.profiling.samples", "counter", "{sample}",
                                  "CPU stack samples taken by the eBPF sampler (otel_gpu.source)")



if sys.version_info >= (3, 11):
    _StrEnum = enum.StrEnum
else:  # CPython 3.10 (an instrumented application's interpreter may be one): the same behaviour, str() the value
    class _StrEnum(str, enum.Enum):
        def __str__(self) -> str:
            return str(self.value)


class Signal(_StrEnum):
    """otel_gpu.signal: what kind of data an export or a drop concerns."""

    PROFILES = "profiles"
    METRICS = "metrics"


class Source(_StrEnum):
    """otel_gpu.source: the part of the agent that read (or failed to read) something."""

    NVML = "nvml"
    CPU_PROFILER = "cpu_profiler"
    GPU_TIME = "gpu_time"
    SYMBOLIZER = "symbolizer"
    PROCFS = "procfs"
    OTLP_METRICS = "otlp_metrics"
    PROMETHEUS = "prometheus"
    K8S = "k8s"  # the optional pod name lookup (--k8s-names)


class Reason(_StrEnum):
    """otel_gpu.reason: why data was dropped (otel_gpu.dropped) or a read failed (otel_gpu.source.errors).

    NVML call failures use the name of NVML's return code instead (``gpu._nvml.NVMLCallError.reason``).
    """

    # dropped on the way out (any signal)
    QUEUE_FULL = "queue_full"  # the export queue was full: the oldest item went
    TOO_LARGE = "too_large"  # one item larger than the queue's byte bound
    REJECTED = "rejected"  # the backend refused it for good (or in part)
    SHUTDOWN = "shutdown"  # still queued when stopping's time ran out
    ENCODE_ERROR = "encode_error"
    WRITE_ERROR = "write_error"  # a local file could not be written
    DISK_FULL = "disk_full"  # an older local profile file removed to make room for a new one on a full disk
    EXPORT_FAILED = "export_failed"  # a metrics export failed
    SUPERSEDED = "superseded"  # a newer collection replaced it while the previous one was still being sent
    NO_DESTINATION = "no_destination"  # every destination of the signal was turned off (--local-files/--console off)
    # dropped by the CPU sampler
    RAW_FULL = "raw_ringbuf_full"  # a collided sample could not be sent whole: sample dropped
    COUNTS_FULL = "counts_map_full"  # the in-kernel counts map was full: sample dropped
    EVENTS_FULL = "events_ringbuf_full"  # new-process event dropped: that process may stay unsymbolized
    # dropped on the GPU-time path
    INJECTED_LIBRARY = "injected_library"  # records the injected library lost or timed out
    BPF_RINGBUF_FULL = "bpf_ringbuf_full"  # abi.DropReason, prefixed: the eBPF program could not pass a record on
    BPF_READ_FAILED = "bpf_read_failed"
    BPF_BAD_LENGTH = "bpf_bad_length"
    JOIN_LAUNCH_UNMATCHED = "join_launch_unmatched"  # a sampled launch whose GPU work never came
    JOIN_ACTIVITY_UNMATCHED = "join_activity_unmatched"  # GPU work whose launch never came
    GRAPH_REPLAYS_NOT_SAMPLED = "graph_replays_not_sampled"  # replays of a CUDA graph with none sampled that interval
    # source errors: CPU sampler
    STACK_COLLISION = "stack_collision"  # stack-map hash collision (the sample is sent whole instead)
    STACK_ERROR = "stack_error"  # bpf_get_stackid failed otherwise
    EVENT_POLL = "event_poll"
    PYTHON_NO_THREAD = "python_no_thread"  # a Python process's thread without a PyThreadState: native frames only
    PYTHON_TRUNCATED = "python_truncated"  # Python stack deeper than the walker's bound: outermost frames cut
    PYTHON_STACKS_FULL = "python_stacks_full"  # the BPF map of Python stacks refused one: its frames lost
    PYTHON_CODE_UNREADABLE = "python_code_unreadable"  # a code object could not be read: that frame left out
    # a new Python stack's code objects not read while its process ran (python_events ring full, or the agent's
    # share for reading them early used up): read at the drain, so a process gone by then loses those frames
    PYTHON_READ_LATE = "python_read_late"
    PYTHON_UNSUPPORTED = "python_unsupported"  # a CPython version without a layout: native frames only
    PROCESS_GONE = "process_gone"  # the process exited before its identity was read
    # samples of a program a process ran before an exec, whose mappings were not read before the exec replaced them:
    # reported under the thread's name then, their user frames unnamed ([unknown] 0xADDRESS)
    REPLACED_BY_EXEC = "replaced_by_exec"
    # source errors: native unwinding (a user stack walked from .eh_frame tables stopped early)
    UNWIND_NO_MAPPING = "unwind_no_mapping"  # a pc outside every registered mapping (JIT code, a later dlopen)
    UNWIND_UNSUPPORTED = "unwind_unsupported"  # a rule the walker does not follow (CFA expression, as in PLTs)
    UNWIND_READ_FAILED = "unwind_read_failed"  # the return address or saved rbp could not be read
    UNWIND_TRUNCATED = "unwind_truncated"  # deeper than the stack depth
    UNWIND_NO_REGS = "unwind_no_regs"  # the user registers could not be read
    UNWIND_BAD_FP = "unwind_bad_fp"  # a frame-pointer step where no table is gave no frame pointer or caller
    UNWIND_CACHE_EVICTED = "unwind_cache_evicted"  # a file's rows evicted (least recently hit) to make room
    UNWIND_TABLES_FULL = "unwind_tables_full"  # a file left to frame pointers: the rows map was full
    UNWIND_FILE_ERROR = "unwind_file_error"  # a file's frame information could not be read
    UNWIND_NO_BUILDER = "unwind_no_builder"  # a file left to frame pointers: libotel_gpu_cfi.so does not load
    # source errors: symbolizer and /proc
    NO_SYMBOL = "no_symbol"
    SYMBOLS_DEFERRED = "symbols_deferred"  # a drain's time for reading new ELF files ran out: frame sent as file+offset
    SYMBOL_FILE_EVICTED = "symbol_file_evicted"  # an ELF file's symbols left the bounded cache (read again if needed)
    UNREADABLE_ELF = "unreadable_elf"
    MISSING_FILE = "missing_file"
    MAPS_TOO_LARGE = "maps_too_large"
    PERF_MAP_TOO_LARGE = "perf_map_too_large"
    KALLSYMS_TOO_LARGE = "kallsyms_too_large"  # kallsyms past its read cap: later kernel symbols missing
    ENVIRON_TOO_LARGE = "environ_too_large"
    CGROUP_TOO_LARGE = "cgroup_too_large"
    # source errors: GPU time
    ATTACH = "attach"
    POLL = "poll"
    DECODE = "decode"
    CORRELATION_ID_REUSED = "correlation_id_reused"
    # source errors: NVML beyond its return codes
    TIMEOUT = "timeout"
    UNEXPECTED = "unexpected"
    GPM_FREE = "gpm_free"
    XID_UNKNOWN_DEVICE = "xid_unknown_device"  # an XID event for a GPU the agent does not know
    # source errors: the agent and the metrics pipeline
    DRAIN = "drain"  # a profile source's drain raised
    CERTIFICATE = "certificate"
    LISTEN = "listen"  # the Prometheus port could not be opened
    # source errors: the Kubernetes API (--k8s-names)
    K8S_NO_TOKEN = "k8s_no_token"  # the service-account token could not be read
    K8S_UNAUTHORIZED = "k8s_unauthorized"  # 401 or 403: a bad token, or no RBAC to list pods
    K8S_TIMEOUT = "k8s_timeout"
    K8S_UNREACHABLE = "k8s_unreachable"  # refused, unknown host, TLS failure
    K8S_API_ERROR = "k8s_api_error"  # another HTTP status, or an answer that is not a pod list

SELF_SOURCE_UP = MetricSpec("otel_gpu.source.up", "updowncounter", "1",
                            "1 while a source (otel_gpu.source: nvml, cpu_profiler, gpu_time) runs, 0 when it is off")
SELF_METRICS: Final = (SELF_COLLECTION_DURATION, SELF_EXPORT_FAILURES, SELF_DROPPED, SELF_ERRORS, SELF_SOURCE_UP,
                       SELF_PROFILE_SAMPLES)


def prometheus_name(spec: MetricSpec) -> str:
    """The name Prometheus-style translation gives ``spec`` (OTel-to-Prometheus compatibility rules).

    Dots become underscores, the unit adds a suffix (By -> bytes, W -> watts, ...), ``{...}`` units add none,
    gauges with unit ``1`` get ``_ratio`` and monotonic counters ``_total``.
    """
    base = spec.name.replace(".", "_")
    suffix = _UNIT_SUFFIX.get(spec.unit, "")
    if spec.unit == "1" and spec.instrument == "gauge":
        suffix = "ratio"
    if suffix and not base.endswith("_" + suffix):
        base = f"{base}_{suffix}"
    if spec.instrument == "counter":
        base += "_total"
    return base


def victoria_metrics_name(spec: MetricSpec) -> str:
    """The name VictoriaMetrics gives ``spec`` over OTLP with ``-opentelemetry.usePrometheusNaming``: the same as
    ``prometheus_name``, except that every metric of unit ``1`` gets ``_ratio``, up-down counters too (Prometheus'
    translation and the scrape endpoint give it to gauges only): ``hw_status_ratio``."""
    if spec.unit != "1" or spec.instrument == "gauge":
        return prometheus_name(spec)
    base = spec.name.replace(".", "_")
    base = base if base.endswith("_ratio") else f"{base}_ratio"
    return base + ("_total" if spec.instrument == "counter" else "")


_UNIT_SUFFIX: Final = {"By": "bytes", "W": "watts", "J": "joules", "Hz": "hertz", "Cel": "celsius", "s": "seconds",
                       "ns": "nanoseconds"}

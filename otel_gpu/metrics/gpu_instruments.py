# SPDX-License-Identifier: Apache-2.0
"""OTel observable instruments over the NVML source's latest snapshots (names and units from semconv).

Callbacks only read ``source.snapshots()`` and ``source.xid_errors()``; they never call NVML (they ask for readings
taken within FRESH_WITHIN_S, which the source's threads take). A series that a
callback stops yielding (an exited process, a lost GPU's readings) is not exported again: the OTel SDK drops
asynchronous attribute sets that were not observed in a collection.

Every GPU series carries hw.id (UUID), hw.name and hw.model (the NVML device name), nvidia.gpu.index and
nvidia.gpu.pci.bus_id; the generic ``hw.*`` metrics add hw.type=gpu.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from otel_gpu import semconv
from otel_gpu.gpu.model import STATES, THROTTLE_REASONS, GPUInfo, GPUSnapshot, ProcessUsage, XIDErrors
from otel_gpu.procfs import ProcessInfo, identity_attributes
from otel_gpu.semconv import MetricSpec

FRESH_WITHIN_S = 1.0  # an export carries GPU readings taken at most this long before it (the source reads again)
Attributes = dict[str, str | int]
Points = Iterator[tuple[float, Attributes]]


class GPUSnapshotSource(Protocol):
    """What the instruments need from a GPU source."""

    def snapshots(self, fresh_within_s: float | None = None) -> tuple[GPUSnapshot, ...]: ...

    def xid_errors(self) -> tuple[XIDErrors, ...]: ...


def gpu_attributes(info: GPUInfo) -> Attributes:
    """The attributes that identify one GPU on every series."""
    return {
        semconv.HW_ID: info.uuid,
        semconv.HW_NAME: info.name,
        semconv.HW_MODEL: info.name,
        semconv.NVIDIA_GPU_INDEX: info.index,
        semconv.NVIDIA_GPU_PCI_BUS_ID: info.pci_bus_id,
    }


def process_attributes(process: ProcessUsage) -> Attributes:
    """The process's identity, the same attributes (and values) its profiles carry: procfs.identity_attributes."""
    return dict(identity_attributes(ProcessInfo(
        pid=process.pid, executable_name=process.executable_name, container_id=process.container_id,
        pod_uid=process.pod_uid, service_name=process.service_name, k8s_pod_name=process.k8s_pod_name,
        k8s_namespace_name=process.k8s_namespace_name, k8s_container_name=process.k8s_container_name,
        ranks=process.ranks)))


# --- per-metric readings: (value, extra attributes) from one snapshot ------------------------------------------

def _one(value: float | None, **attributes: str | int) -> Points:
    if value is not None:
        yield value, dict(attributes)


def _utilization(s: GPUSnapshot) -> Points:
    for task, value in (("general", s.utilization), ("encoder", s.encoder_utilization),
                        ("decoder", s.decoder_utilization)):
        yield from _one(value, **{semconv.HW_GPU_TASK: task})


def _io(s: GPUSnapshot) -> Points:
    yield from _one(s.pcie_transmit_bytes, **{semconv.NETWORK_IO_DIRECTION: "transmit"})
    yield from _one(s.pcie_receive_bytes, **{semconv.NETWORK_IO_DIRECTION: "receive"})


def _nvlink_io(s: GPUSnapshot) -> Points:
    for link in s.nvlinks:
        yield from _one(link.transmit_bytes, **{semconv.NVIDIA_GPU_NVLINK: link.link,
                                                semconv.NETWORK_IO_DIRECTION: "transmit"})
        yield from _one(link.receive_bytes, **{semconv.NVIDIA_GPU_NVLINK: link.link,
                                               semconv.NETWORK_IO_DIRECTION: "receive"})


def _nvlink_errors(s: GPUSnapshot) -> Points:
    for link in s.nvlinks:
        for error_type, count in link.errors:
            yield count, {semconv.NVIDIA_GPU_NVLINK: link.link, semconv.ERROR_TYPE: error_type}


def _temperature_limit(s: GPUSnapshot) -> Points:
    yield from _one(s.temperature_slowdown_c, **{semconv.HW_LIMIT_TYPE: "high.degraded"})
    yield from _one(s.temperature_shutdown_c, **{semconv.HW_LIMIT_TYPE: "high.critical"})


def _errors(s: GPUSnapshot) -> Points:
    yield from _one(s.ecc_corrected_errors, **{semconv.ERROR_TYPE: "corrected"})
    yield from _one(s.ecc_uncorrected_errors, **{semconv.ERROR_TYPE: "uncorrected"})
    yield from _one(s.pcie_replay_errors, **{semconv.ERROR_TYPE: "pcie_replay"})


def _status(s: GPUSnapshot) -> Points:
    for state in STATES:
        yield (1 if s.state == state else 0), {semconv.HW_STATE: state}


def _clock(s: GPUSnapshot) -> Points:
    yield from _one(s.sm_clock_hz, **{semconv.NVIDIA_GPU_CLOCK_TYPE: "sm"})
    yield from _one(s.memory_clock_hz, **{semconv.NVIDIA_GPU_CLOCK_TYPE: "memory"})


def _clock_limit(s: GPUSnapshot) -> Points:
    yield from _one(s.sm_clock_max_hz, **{semconv.NVIDIA_GPU_CLOCK_TYPE: "sm"})
    yield from _one(s.memory_clock_max_hz, **{semconv.NVIDIA_GPU_CLOCK_TYPE: "memory"})


def _throttle(s: GPUSnapshot) -> Points:
    if s.throttle_reasons is None:
        return
    for reason, bit in THROTTLE_REASONS:
        yield (1 if s.throttle_reasons & bit else 0), {semconv.NVIDIA_GPU_THROTTLE_REASON: reason}


def _process_memory(s: GPUSnapshot) -> Points:
    for process in s.processes:
        yield from _one(process.memory_bytes, **process_attributes(process))


def _process_sm(s: GPUSnapshot) -> Points:
    for process in s.processes:
        yield from _one(process.sm_utilization, **process_attributes(process))


_GPU_TYPE = {semconv.HW_TYPE: semconv.HW_TYPE_GPU}

# Every metric whose points come from snapshots alone; hw.errors and the XID gauge add the XID watcher's counts.
_READINGS: dict[str, Callable[[GPUSnapshot], Points]] = {
    semconv.GPU_UTILIZATION.name: _utilization,
    semconv.GPU_MEMORY_USAGE.name: lambda s: _one(s.memory_used_bytes),
    semconv.GPU_MEMORY_LIMIT.name: lambda s: _one(s.memory_total_bytes),
    semconv.GPU_MEMORY_UTILIZATION.name: lambda s: _one(s.memory_utilization),
    semconv.GPU_IO.name: _io,
    semconv.GPU_POWER.name: lambda s: _one(s.power_w, **_GPU_TYPE),
    semconv.GPU_ENERGY.name: lambda s: _one(s.energy_j, **_GPU_TYPE),
    semconv.GPU_TEMPERATURE.name: lambda s: _one(s.temperature_c, **_GPU_TYPE),
    semconv.GPU_TEMPERATURE_LIMIT.name: lambda s: ((v, {**a, **_GPU_TYPE}) for v, a in _temperature_limit(s)),
    semconv.GPU_ERRORS.name: lambda s: ((v, {**a, **_GPU_TYPE}) for v, a in _errors(s)),
    semconv.GPU_STATUS.name: lambda s: ((v, {**a, **_GPU_TYPE}) for v, a in _status(s)),
    semconv.GPU_POWER_LIMIT.name: lambda s: _one(s.power_limit_w, **{semconv.NVIDIA_GPU_POWER_LIMIT_TYPE: "enforced"}),
    semconv.GPU_MEMORY_BANDWIDTH_UTILIZATION.name: lambda s: _one(s.memory_bandwidth_utilization),
    semconv.GPU_CLOCK_FREQUENCY.name: _clock,
    semconv.GPU_CLOCK_FREQUENCY_LIMIT.name: _clock_limit,
    semconv.GPU_CLOCK_THROTTLE.name: _throttle,
    semconv.GPU_PERFORMANCE_STATE.name: lambda s: _one(s.performance_state),
    semconv.GPU_SM_ACTIVITY.name: lambda s: _one(s.sm_activity),
    semconv.GPU_SM_OCCUPANCY.name: lambda s: _one(s.sm_occupancy),
    semconv.GPU_TENSOR_ACTIVITY.name: lambda s: _one(s.tensor_activity),
    semconv.GPU_DRAM_ACTIVITY.name: lambda s: _one(s.dram_activity),
    semconv.GPU_PROCESS_MEMORY_USAGE.name: _process_memory,
    semconv.GPU_PROCESS_SM_UTILIZATION.name: _process_sm,
    semconv.GPU_NVLINK_IO.name: _nvlink_io,
    semconv.GPU_NVLINK_ERRORS.name: _nvlink_errors,
}


def _xid_points(errors: Iterable[XIDErrors], last_time: bool) -> Iterator[Observation]:
    for entry in errors:
        attributes = gpu_attributes(entry.info)
        attributes[semconv.NVIDIA_GPU_XID_CODE] = entry.code
        if last_time:
            yield Observation(entry.last_time_s, attributes)
        else:
            attributes[semconv.ERROR_TYPE] = "xid"
            attributes.update(_GPU_TYPE)
            yield Observation(entry.count, attributes)


def _callback(spec: MetricSpec, source: GPUSnapshotSource) -> Callable[[CallbackOptions], Iterable[Observation]]:
    reading = _READINGS.get(spec.name)
    with_xid_counts = spec.name == semconv.GPU_ERRORS.name
    xid_last_time = spec.name == semconv.GPU_XID_LAST_TIME.name

    def callback(options: CallbackOptions) -> Iterable[Observation]:
        out: list[Observation] = []
        if reading is not None:
            for snapshot in source.snapshots(fresh_within_s=FRESH_WITHIN_S):
                base = gpu_attributes(snapshot.info)
                out.extend(Observation(value, {**base, **extra}) for value, extra in reading(snapshot))
        if with_xid_counts or xid_last_time:
            out.extend(_xid_points(source.xid_errors(), last_time=xid_last_time))
        return out

    return callback


def register_gpu_instruments(meter: Meter, source: GPUSnapshotSource) -> None:
    """Create one observable instrument per ``semconv.GPU_METRICS`` and ``NVLINK_METRICS`` entry, fed by ``source``'s
    latest data."""
    for spec in semconv.GPU_METRICS + semconv.NVLINK_METRICS:
        callbacks = [_callback(spec, source)]
        if spec.instrument == "counter":
            meter.create_observable_counter(spec.name, callbacks=callbacks, unit=spec.unit,
                                            description=spec.description)
        elif spec.instrument == "updowncounter":
            meter.create_observable_up_down_counter(spec.name, callbacks=callbacks, unit=spec.unit,
                                                    description=spec.description)
        else:
            meter.create_observable_gauge(spec.name, callbacks=callbacks, unit=spec.unit,
                                          description=spec.description)

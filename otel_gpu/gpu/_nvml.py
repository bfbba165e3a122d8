# SPDX-License-Identifier: Apache-2.0
"""The only module that imports ``pynvml``: thin wrappers that return plain Python values in NVML's own units
(the unit is in each function's name) and raise one error type, :class:`NVMLCallError`.

Nothing here converts units, caches, logs or decides what to do about an error; the GPU reader does.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import pynvml

Handle = Any  # pynvml's c_nvmlDevice_t (an opaque pointer)
EventSet = Any
GPMSample = Any

T = TypeVar("T")

# GPM metric ids (nvml.h nvmlGpmMetricId_t), values in percent
GPM_SM_UTIL = 2
GPM_SM_OCCUPANCY = 3
GPM_ANY_TENSOR_UTIL = 5
GPM_DRAM_BW_UTIL = 10

_FI_PCIE_TX_BYTES = 197  # NVML_FI_DEV_PCIE_COUNT_TX_BYTES ("value can be wrapped")
_FI_PCIE_RX_BYTES = 198
_FI_NVLINK_LINK_COUNT = 91  # NVML_FI_DEV_NVLINK_LINK_COUNT
_FI_NVLINK_DATA_TX_KIB = 138  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: KiB of data (no protocol), scopeId = link
_FI_NVLINK_DATA_RX_KIB = 139
# nvmlNvLinkErrorCounter_t values and the error.type each is reported as
NVLINK_ERROR_COUNTERS = (("replay", 0), ("recovery", 1), ("crc_flit", 2), ("crc_data", 3))
_XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError
_VALUE_BITS = {1: 32, 2: 64, 3: 64, 4: 64, 5: 32, 6: 16}  # nvmlValueType_t -> counter width

_UNSUPPORTED = {pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND}
_REASONS = {
    pynvml.NVML_ERROR_UNINITIALIZED: "uninitialized", pynvml.NVML_ERROR_INVALID_ARGUMENT: "invalid_argument",
    pynvml.NVML_ERROR_NOT_SUPPORTED: "not_supported", pynvml.NVML_ERROR_NO_PERMISSION: "no_permission",
    pynvml.NVML_ERROR_NOT_FOUND: "not_found", pynvml.NVML_ERROR_INSUFFICIENT_SIZE: "insufficient_size",
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: "driver_not_loaded", pynvml.NVML_ERROR_TIMEOUT: "timeout",
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: "library_not_found", pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
    "function_not_found", pynvml.NVML_ERROR_GPU_IS_LOST: "gpu_is_lost",
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: "lib_rm_version_mismatch",
}


class NVMLCallError(Exception):
    """An NVML call failed. ``code`` is the nvmlReturn_t value, ``function`` the wrapper that failed."""

    def __init__(self, function: str, code: int, message: str) -> None:
        super().__init__(f"{function}: {message}")
        self.function = function
        self.code = code

    @property
    def unsupported(self) -> bool:
        """The GPU or the driver does not offer this reading (NOT_SUPPORTED or FUNCTION_NOT_FOUND)."""
        return self.code in _UNSUPPORTED

    @property
    def gpu_lost(self) -> bool:
        return self.code == pynvml.NVML_ERROR_GPU_IS_LOST

    @property
    def not_found(self) -> bool:
        return self.code == pynvml.NVML_ERROR_NOT_FOUND

    @property
    def timeout(self) -> bool:
        return self.code == pynvml.NVML_ERROR_TIMEOUT

    @property
    def reason(self) -> str:
        """A short, low-cardinality name of the error for self-metrics."""
        return _REASONS.get(self.code, f"nvml_error_{self.code}")


def _call(function: Callable[..., T], *args: Any) -> T:
    try:
        return function(*args)
    except pynvml.NVMLError as exc:
        raise NVMLCallError(function.__name__, int(exc.value), str(exc)) from None
    except pynvml.NVMLLibraryMismatchError as exc:
        raise NVMLCallError(function.__name__, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, str(exc)) from None


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


# --- library -------------------------------------------------------------------------------------------------------

def init() -> None:
    """Load libnvidia-ml.so.1 and initialise NVML (refcounted: pair with :func:`shutdown`)."""
    _call(pynvml.nvmlInit)


def shutdown() -> None:
    _call(pynvml.nvmlShutdown)


def driver_version() -> str:
    return _text(_call(pynvml.nvmlSystemGetDriverVersion))


def device_count() -> int:
    return int(_call(pynvml.nvmlDeviceGetCount))


def device_handle(index: int) -> Handle:
    return _call(pynvml.nvmlDeviceGetHandleByIndex, index)


def handle_key(handle: Handle) -> int:
    """A stable integer for a device handle (its address), to match event data to devices."""
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


# --- identity ------------------------------------------------------------------------------------------------------

def name(handle: Handle) -> str:
    return _text(_call(pynvml.nvmlDeviceGetName, handle))


def uuid(handle: Handle) -> str:
    return _text(_call(pynvml.nvmlDeviceGetUUID, handle))


def pci_bus_id(handle: Handle) -> str:
    return _text(_call(pynvml.nvmlDeviceGetPciInfo_v3, handle).busId)


# --- readings ------------------------------------------------------------------------------------------------------

_memory_v2 = [True]  # cleared once the driver turns nvmlDeviceGetMemoryInfo_v2 down


def memory_bytes(handle: Handle) -> tuple[int, int]:
    """(used, total) device memory in bytes; used excludes the driver's reserved memory where the driver can
    tell (nvmlDeviceGetMemoryInfo_v2, as nvidia-smi shows it), else it is v1's used (reserved included)."""
    if _memory_v2[0]:
        try:
            info = _call(pynvml.nvmlDeviceGetMemoryInfo, handle, pynvml.nvmlMemory_v2)
            return int(info.used), int(info.total)
        except NVMLCallError as exc:
            if not (exc.unsupported or exc.code == pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH):
                raise
            _memory_v2[0] = False
    info = _call(pynvml.nvmlDeviceGetMemoryInfo, handle)
    return int(info.used), int(info.total)


def utilization_percent(handle: Handle) -> tuple[int, int]:
    """(gpu, memory controller) utilization over the driver's last sample period, in percent."""
    rates = _call(pynvml.nvmlDeviceGetUtilizationRates, handle)
    return int(rates.gpu), int(rates.memory)


def encoder_utilization_percent(handle: Handle) -> int:
    return int(_call(pynvml.nvmlDeviceGetEncoderUtilization, handle)[0])


def decoder_utilization_percent(handle: Handle) -> int:
    return int(_call(pynvml.nvmlDeviceGetDecoderUtilization, handle)[0])


def power_mw(handle: Handle) -> int:
    return int(_call(pynvml.nvmlDeviceGetPowerUsage, handle))


def enforced_power_limit_mw(handle: Handle) -> int:
    return int(_call(pynvml.nvmlDeviceGetEnforcedPowerLimit, handle))


def total_energy_mj(handle: Handle) -> int:
    """Energy since the driver was loaded, in millijoules."""
    return int(_call(pynvml.nvmlDeviceGetTotalEnergyConsumption, handle))


def temperature_c(handle: Handle) -> int:
    return int(_call(pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU))


def slowdown_temperature_c(handle: Handle) -> int:
    return int(_call(pynvml.nvmlDeviceGetTemperatureThreshold, handle, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN))


def shutdown_temperature_c(handle: Handle) -> int:
    return int(_call(pynvml.nvmlDeviceGetTemperatureThreshold, handle, pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN))


def sm_clock_mhz(handle: Handle) -> int:
    return int(_call(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM))


def memory_clock_mhz(handle: Handle) -> int:
    return int(_call(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_MEM))


def max_sm_clock_mhz(handle: Handle) -> int:
    return int(_call(pynvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_SM))


def max_memory_clock_mhz(handle: Handle) -> int:
    return int(_call(pynvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_MEM))


def clocks_event_reasons(handle: Handle) -> int:
    """Bitmask of the reasons the clocks are held back (nvmlClocksEventReason*)."""
    return int(_call(pynvml.nvmlDeviceGetCurrentClocksEventReasons, handle))


def performance_state(handle: Handle) -> int:
    return int(_call(pynvml.nvmlDeviceGetPerformanceState, handle))


def ecc_errors(handle: Handle, *, corrected: bool) -> int:
    """Volatile (since driver load) ECC error count, corrected or uncorrected."""
    kind = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED if corrected else pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    return int(_call(pynvml.nvmlDeviceGetTotalEccErrors, handle, kind, pynvml.NVML_VOLATILE_ECC))


def pcie_replay_count(handle: Handle) -> int:
    return int(_call(pynvml.nvmlDeviceGetPcieReplayCounter, handle))


def pcie_byte_counters(handle: Handle) -> tuple[int, int, int]:
    """(transmitted, received, counter width in bits) from the PCIe byte counter field values; may wrap."""
    values = _call(pynvml.nvmlDeviceGetFieldValues, handle, [_FI_PCIE_TX_BYTES, _FI_PCIE_RX_BYTES])
    out = []
    bits = 64
    for entry in values:
        if entry.nvmlReturn != pynvml.NVML_SUCCESS:
            message = _text(pynvml.nvmlErrorString(entry.nvmlReturn))
            raise NVMLCallError("nvmlDeviceGetFieldValues", int(entry.nvmlReturn), f"field {entry.fieldId}: {message}")
        bits = _VALUE_BITS.get(int(entry.valueType), 64)
        out.append(_field_value(entry))
    return out[0], out[1], bits


def _field_value(entry: Any) -> int:
    kind = int(entry.valueType)
    value = entry.value
    return int({0: value.dVal, 1: value.uiVal, 2: value.ulVal, 3: value.ullVal, 4: value.sllVal, 5: value.siVal,
                6: value.usVal}.get(kind, value.ullVal))


def nvlink_count(handle: Handle) -> int:
    """How many NVLinks the GPU has (NOT_SUPPORTED without NVLink)."""
    entry = _call(pynvml.nvmlDeviceGetFieldValues, handle, [_FI_NVLINK_LINK_COUNT])[0]
    if entry.nvmlReturn != pynvml.NVML_SUCCESS:
        message = _text(pynvml.nvmlErrorString(entry.nvmlReturn))
        raise NVMLCallError("nvmlDeviceGetFieldValues", int(entry.nvmlReturn), f"field {entry.fieldId}: {message}")
    return _field_value(entry)


def nvlink_active(handle: Handle, link: int) -> bool:
    return bool(_call(pynvml.nvmlDeviceGetNvLinkState, handle, link))


def nvlink_data_bytes(handle: Handle, links: list[int]) -> dict[int, tuple[int, int]]:
    """{link: (data bytes sent, received)} since the driver loaded, in one call; links whose fields fail are left
    out."""
    fields = [(field, link) for link in links for field in (_FI_NVLINK_DATA_TX_KIB, _FI_NVLINK_DATA_RX_KIB)]
    values = _call(pynvml.nvmlDeviceGetFieldValues, handle, fields)
    read: dict[tuple[int, int], int] = {}
    for entry in values:
        if entry.nvmlReturn == pynvml.NVML_SUCCESS:
            read[(int(entry.scopeId), int(entry.fieldId))] = _field_value(entry) * 1024
    return {link: (read[(link, _FI_NVLINK_DATA_TX_KIB)], read[(link, _FI_NVLINK_DATA_RX_KIB)]) for link in links
            if (link, _FI_NVLINK_DATA_TX_KIB) in read and (link, _FI_NVLINK_DATA_RX_KIB) in read}


def nvlink_errors(handle: Handle, link: int) -> tuple[tuple[str, int], ...]:
    """(error.type, count) of one link's data-link error counters."""
    return tuple((name, int(_call(pynvml.nvmlDeviceGetNvLinkErrorCounter, handle, link, counter)))
                 for name, counter in NVLINK_ERROR_COUNTERS)


def pcie_throughput_kib_s(handle: Handle, *, transmit: bool) -> int:
    """PCIe throughput over a 20 ms window in KiB/s (the call blocks ~20 ms)."""
    counter = pynvml.NVML_PCIE_UTIL_TX_BYTES if transmit else pynvml.NVML_PCIE_UTIL_RX_BYTES
    return int(_call(pynvml.nvmlDeviceGetPcieThroughput, handle, counter))


# --- processes -----------------------------------------------------------------------------------------------------

def running_processes(handle: Handle, *, graphics: bool) -> list[tuple[int, int | None]]:
    """(pid, used GPU memory in bytes or None when unknown) of compute or graphics processes."""
    function = pynvml.nvmlDeviceGetGraphicsRunningProcesses if graphics else pynvml.nvmlDeviceGetComputeRunningProcesses
    return [(int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory)) for p in _call(function, handle)]


def process_sm_utilization(handle: Handle, last_seen_us: int) -> list[tuple[int, int, int]]:
    """(pid, sample timestamp in µs, SM utilization in percent) for samples newer than ``last_seen_us``.

    Empty when no process had non-zero utilization since then (NVML answers NOT_FOUND).
    """
    try:
        samples = _call(pynvml.nvmlDeviceGetProcessUtilization, handle, last_seen_us)
    except NVMLCallError as exc:
        if exc.not_found:
            return []
        raise
    return [(int(s.pid), int(s.timeStamp), int(s.smUtil)) for s in samples]


# --- GPM (Hopper and newer) ----------------------------------------------------------------------------------------

def gpm_supported(handle: Handle) -> bool:
    return bool(_call(pynvml.nvmlGpmQueryDeviceSupport, handle).isSupportedDevice)


def gpm_sample_alloc() -> GPMSample:
    return _call(pynvml.nvmlGpmSampleAlloc)


def gpm_sample_free(sample: GPMSample) -> None:
    _call(pynvml.nvmlGpmSampleFree, sample)


def gpm_sample_get(handle: Handle, sample: GPMSample) -> None:
    _call(pynvml.nvmlGpmSampleGet, handle, sample)


def gpm_metrics_percent(first: GPMSample, second: GPMSample, metric_ids: Sequence[int]) -> dict[int, float | None]:
    """Each metric between two samples (> 100 ms apart), in percent; None for a metric the GPU cannot give."""
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(metric_ids)
    request.sample1 = first
    request.sample2 = second
    for i, metric_id in enumerate(metric_ids):
        request.metrics[i].metricId = metric_id
    _call(pynvml.nvmlGpmMetricsGet, request)
    out: dict[int, float | None] = {}
    for i, metric_id in enumerate(metric_ids):
        entry = request.metrics[i]
        out[metric_id] = float(entry.value) if entry.nvmlReturn == pynvml.NVML_SUCCESS else None
    return out


# --- events --------------------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class XIDEvent:
    """One XID critical error: the device's :func:`handle_key` and the XID code."""

    device_key: int
    code: int


def event_set_create() -> EventSet:
    return _call(pynvml.nvmlEventSetCreate)


def register_xid_events(handle: Handle, event_set: EventSet) -> None:
    _call(pynvml.nvmlDeviceRegisterEvents, handle, _XID_EVENT, event_set)


def wait_xid_event(event_set: EventSet, timeout_ms: int) -> XIDEvent | None:
    """The next XID event, or None when none came within ``timeout_ms`` (or the event was not an XID)."""
    try:
        data = _call(pynvml.nvmlEventSetWait_v2, event_set, timeout_ms)
    except NVMLCallError as exc:
        if exc.timeout:
            return None
        raise
    if not int(data.eventType) & _XID_EVENT:
        return None
    return XIDEvent(handle_key(data.device), int(data.eventData))


def event_set_free(event_set: EventSet) -> None:
    _call(pynvml.nvmlEventSetFree, event_set)

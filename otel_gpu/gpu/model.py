# SPDX-License-Identifier: Apache-2.0
"""What the NVML source produces: plain frozen dataclasses in base units (bytes, W, J, Hz, Cel, ratios 0..1).

A reading the GPU does not offer (or that failed this cycle) is ``None``; instruments skip it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

STATE_OK: Final = "ok"
STATE_FAILED: Final = "failed"
STATES: Final = (STATE_OK, STATE_FAILED)

# Clock event ("throttle") reason bits, as in nvml.h nvmlClocksEventReason* / nvmlClocksThrottleReason*.
# pynvml 13.615 lacks names for 0x200 and 0x400, so the agent keeps its own table.
THROTTLE_REASONS: Final = (
    ("gpu_idle", 0x1),
    ("app_clocks", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal", 0x20),
    ("hw_thermal", 0x40),
    ("hw_power_brake", 0x80),
    ("display", 0x100),
    ("board_limit", 0x200),
    ("reliability", 0x400),
)


@dataclass(frozen=True, slots=True)
class GPUInfo:
    """Identity of one GPU, read once when the source opens."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessUsage:
    """One process's use of one GPU, with its identity from /proc (empty strings when unknown)."""

    pid: int
    executable_name: str = ""
    container_id: str = ""
    pod_uid: str = ""
    ranks: tuple[tuple[str, int], ...] = ()  # distributed.rank, ... (otel_gpu/ranks.py)
    service_name: str = ""  # the process's own (OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES), else its executable
    k8s_pod_name: str = ""  # with --k8s-names
    k8s_namespace_name: str = ""
    k8s_container_name: str = ""
    memory_bytes: int | None = None
    sm_utilization: float | None = None  # ratio 0..1 over the last sample period


@dataclass(frozen=True, slots=True)
class NVLinkReading:
    """One active NVLink of a GPU: data bytes since the driver loaded (None when unread) and its error counts as
    (error.type, count): replay, recovery, crc_flit, crc_data."""

    link: int
    transmit_bytes: int | None = None
    receive_bytes: int | None = None
    errors: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class GPUSnapshot:
    """Every reading of one GPU from one collection cycle. ``state`` is ``ok`` or ``failed`` (GPU lost)."""

    info: GPUInfo
    time_s: float  # Unix time of the read
    state: str = STATE_OK
    utilization: float | None = None  # ratio, general
    encoder_utilization: float | None = None
    decoder_utilization: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    memory_bandwidth_utilization: float | None = None  # ratio of time the memory controller was busy
    pcie_transmit_bytes: int | None = None  # cumulative since the source opened
    pcie_receive_bytes: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    energy_j: float | None = None  # cumulative since the driver loaded
    temperature_c: float | None = None
    temperature_slowdown_c: float | None = None
    temperature_shutdown_c: float | None = None
    sm_clock_hz: float | None = None
    memory_clock_hz: float | None = None
    sm_clock_max_hz: float | None = None
    memory_clock_max_hz: float | None = None
    throttle_reasons: int | None = None  # bitmask, see THROTTLE_REASONS
    performance_state: int | None = None  # 0 (P0) .. 15
    ecc_corrected_errors: int | None = None
    ecc_uncorrected_errors: int | None = None
    pcie_replay_errors: int | None = None
    sm_activity: float | None = None  # GPM ratios (Hopper+)
    sm_occupancy: float | None = None
    tensor_activity: float | None = None
    dram_activity: float | None = None
    processes: tuple[ProcessUsage, ...] = ()
    nvlinks: tuple[NVLinkReading, ...] = ()  # active links only; () without NVLink

    @property
    def memory_utilization(self) -> float | None:
        """Fraction of the GPU's memory in use."""
        if self.memory_used_bytes is None or not self.memory_total_bytes:
            return None
        return self.memory_used_bytes / self.memory_total_bytes


@dataclass(frozen=True, slots=True)
class XIDErrors:
    """How many XID errors with one code a GPU reported since the source opened, and when the last came."""

    info: GPUInfo
    code: int
    count: int
    last_time_s: float  # Unix time

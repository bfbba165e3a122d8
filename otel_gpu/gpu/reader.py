# SPDX-License-Identifier: Apache-2.0
"""Reads one GPU through NVML into a :class:`GPUSnapshot`, converting NVML units to base units.

A reading the GPU does not support is turned off for that GPU and logged once. Any other failed call is
counted in self-metrics and leaves that reading empty for the cycle. A GPU that answers GPU_IS_LOST is
reported as ``failed`` (status only) and probed with one cheap call per cycle until it answers again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from otel_gpu import selfmetrics, semconv
from otel_gpu.gpu import _nvml as nvml
from otel_gpu.gpu.model import STATE_FAILED, GPUInfo, GPUSnapshot, NVLinkReading, ProcessUsage
from otel_gpu.procfs import ProcessResolver

_logger = logging.getLogger(__name__)

T = TypeVar("T")

SOURCE_NAME = semconv.Source.NVML
GPM_MIN_GAP_S = 0.1  # NVML needs two GPM samples at least 100 ms apart
_MHZ = 1e6
_GPM_IDS = (nvml.GPM_SM_UTIL, nvml.GPM_SM_OCCUPANCY, nvml.GPM_ANY_TENSOR_UTIL, nvml.GPM_DRAM_BW_UTIL)


def count_error(reason: str) -> None:
    """One NVML source error in self-metrics (``otel_gpu.source.errors``): a :class:`semconv.Reason`, or the name of an
    NVML return code (:attr:`nvml.NVMLCallError.reason`)."""
    selfmetrics.count(semconv.SELF_ERRORS.name, otel_gpu__source=SOURCE_NAME, otel_gpu__reason=reason)


def read_info(index: int, handle: nvml.Handle) -> GPUInfo:
    """Identity of the GPU at ``index``; raises :class:`NVMLCallError` when it cannot be read."""
    return GPUInfo(index=index, uuid=nvml.uuid(handle), name=nvml.name(handle), pci_bus_id=nvml.pci_bus_id(handle))


class GPUReader:
    """Collects one GPU. Not thread-safe: one thread reads a GPU at a time (the source ensures it)."""

    def __init__(self, info: GPUInfo, handle: nvml.Handle, resolver: ProcessResolver, *, per_process: bool) -> None:
        self.info = info
        self.handle = handle
        self._resolver = resolver
        self._per_process = per_process
        self._off: set[str] = set()
        self._logged_errors: set[tuple[str, int]] = set()
        self._lost = False
        self._limits: dict[str, float | None] | None = None
        self._limits_pending = True  # a limit failed for another reason than "not supported": read it again
        self._pcie_mode = "fields"  # -> "throughput" when the byte counters are unsupported
        self._pcie_raw: tuple[int, int] | None = None
        self._pcie_total = [0, 0]
        self._pcie_last_s: float | None = None
        self._gpm_samples: list[nvml.GPMSample] = []
        self._gpm_last_s: float | None = None
        self._gpm_values: dict[int, float | None] = {}
        self._process_last_seen_us = 0
        self._nvlinks: list[int] | None = None  # the active links, found once

    @property
    def lost(self) -> bool:
        return self._lost

    @property
    def pcie_counter_source(self) -> str:
        """Where PCIe bytes come from: ``fields`` (byte counters) or ``throughput`` (KiB/s integrated)."""
        return self._pcie_mode

    def disabled(self) -> frozenset[str]:
        """Names of the readings turned off for this GPU because it does not support them."""
        return frozenset(self._off)

    def read(self) -> GPUSnapshot:
        """One collection cycle. Never raises for NVML errors."""
        now_s = time.time()
        try:
            if self._lost:
                nvml.memory_bytes(self.handle)  # cheap probe: raises while the GPU stays lost
                self._lost = False
                _logger.warning("GPU %d (%s) answers again after being lost", self.info.index, self.info.uuid)
            return self._read(now_s)
        except nvml.NVMLCallError as exc:
            if not exc.gpu_lost:
                raise
            if not self._lost:
                self._lost = True
                count_error(exc.reason)
                _logger.error("GPU %d (%s, %s) is lost (NVML_ERROR_GPU_IS_LOST in %s): reported as hw.status failed "
                              "until it answers again", self.info.index, self.info.uuid, self.info.pci_bus_id,
                              exc.function)
            return GPUSnapshot(info=self.info, time_s=now_s, state=STATE_FAILED)

    def close(self) -> None:
        """Free the GPM samples."""
        for sample in self._gpm_samples:
            try:
                nvml.gpm_sample_free(sample)
            except nvml.NVMLCallError:
                count_error(semconv.Reason.GPM_FREE)
        self._gpm_samples = []

    # --- the cycle ---------------------------------------------------------------------------------------------

    def _read(self, now_s: float) -> GPUSnapshot:
        h = self.handle
        get = self._get
        limits = self._static_limits()
        rates = get("utilization", nvml.utilization_percent, h)
        memory = get("memory", nvml.memory_bytes, h)
        encoder = get("encoder_utilization", nvml.encoder_utilization_percent, h)
        decoder = get("decoder_utilization", nvml.decoder_utilization_percent, h)
        power = get("power", nvml.power_mw, h)
        power_limit = get("power_limit", nvml.enforced_power_limit_mw, h)
        energy = get("energy", nvml.total_energy_mj, h)
        temperature = get("temperature", nvml.temperature_c, h)
        sm_clock = get("sm_clock", nvml.sm_clock_mhz, h)
        memory_clock = get("memory_clock", nvml.memory_clock_mhz, h)
        ecc_corrected = get("ecc_corrected", _ecc_corrected, h)
        ecc_uncorrected = get("ecc_uncorrected", _ecc_uncorrected, h)
        tx, rx = self._pcie_io()
        gpm = self._gpm()
        return GPUSnapshot(
            info=self.info,
            time_s=now_s,
            utilization=_ratio(rates[0]) if rates else None,
            memory_bandwidth_utilization=_ratio(rates[1]) if rates else None,
            encoder_utilization=_ratio(encoder),
            decoder_utilization=_ratio(decoder),
            memory_used_bytes=memory[0] if memory else None,
            memory_total_bytes=memory[1] if memory else None,
            pcie_transmit_bytes=tx,
            pcie_receive_bytes=rx,
            power_w=power / 1000 if power is not None else None,
            power_limit_w=power_limit / 1000 if power_limit is not None else None,
            energy_j=energy / 1000 if energy is not None else None,
            temperature_c=float(temperature) if temperature is not None else None,
            temperature_slowdown_c=limits["slowdown_c"],
            temperature_shutdown_c=limits["shutdown_c"],
            sm_clock_hz=sm_clock * _MHZ if sm_clock is not None else None,
            memory_clock_hz=memory_clock * _MHZ if memory_clock is not None else None,
            sm_clock_max_hz=limits["sm_max_hz"],
            memory_clock_max_hz=limits["memory_max_hz"],
            throttle_reasons=get("throttle_reasons", nvml.clocks_event_reasons, h),
            performance_state=get("performance_state", nvml.performance_state, h),
            ecc_corrected_errors=ecc_corrected,
            ecc_uncorrected_errors=ecc_uncorrected,
            pcie_replay_errors=get("pcie_replay", nvml.pcie_replay_count, h),
            sm_activity=_ratio(gpm.get(nvml.GPM_SM_UTIL)),
            sm_occupancy=_ratio(gpm.get(nvml.GPM_SM_OCCUPANCY)),
            tensor_activity=_ratio(gpm.get(nvml.GPM_ANY_TENSOR_UTIL)),
            dram_activity=_ratio(gpm.get(nvml.GPM_DRAM_BW_UTIL)),
            processes=self._processes() if self._per_process else (),
            nvlinks=self._nvlink_readings(),
        )

    def _get(self, reading: str, call: Callable[..., T], *args: object, **kwargs: object) -> T | None:
        """``call(*args, **kwargs)``, or None when the reading is off or failed; GPU_IS_LOST propagates."""
        if reading in self._off:
            return None
        try:
            return call(*args, **kwargs)
        except nvml.NVMLCallError as exc:
            if exc.gpu_lost:
                raise
            self._failed(reading, exc)
            return None

    def _failed(self, reading: str, exc: nvml.NVMLCallError) -> None:
        count_error(exc.reason)
        if exc.unsupported:
            self._off.add(reading)
            _logger.info("GPU %d (%s): %s is not supported (%s); turned off for this GPU", self.info.index,
                         self.info.name, reading, exc)
            return
        if (reading, exc.code) not in self._logged_errors:  # once per reading and error; later ones are counted
            self._logged_errors.add((reading, exc.code))
            _logger.warning("GPU %d (%s): reading %s failed: %s (further failures are only counted in %s)",
                            self.info.index, self.info.uuid, reading, exc, semconv.SELF_ERRORS.name)

    def _static_limits(self) -> dict[str, float | None]:
        """Limits that do not change while the driver runs, read until every one was read or turned off."""
        if self._limits is None or self._limits_pending:
            h = self.handle
            slowdown = self._get("temperature_slowdown", nvml.slowdown_temperature_c, h)
            shutdown = self._get("temperature_shutdown", nvml.shutdown_temperature_c, h)
            sm_max = self._get("sm_clock_max", nvml.max_sm_clock_mhz, h)
            memory_max = self._get("memory_clock_max", nvml.max_memory_clock_mhz, h)
            self._limits = {
                "slowdown_c": float(slowdown) if slowdown is not None else None,
                "shutdown_c": float(shutdown) if shutdown is not None else None,
                "sm_max_hz": sm_max * _MHZ if sm_max is not None else None,
                "memory_max_hz": memory_max * _MHZ if memory_max is not None else None,
            }
            self._limits_pending = any(
                value is None and reading not in self._off for value, reading in (
                    (slowdown, "temperature_slowdown"), (shutdown, "temperature_shutdown"),
                    (sm_max, "sm_clock_max"), (memory_max, "memory_clock_max")))
        return self._limits

    # --- PCIe bytes: wrapping field counters, else throughput (KiB/s) integrated over time ---------------------

    def _pcie_io(self) -> tuple[int | None, int | None]:
        if self._pcie_mode == "fields":
            try:
                tx, rx, bits = nvml.pcie_byte_counters(self.handle)
            except nvml.NVMLCallError as exc:
                if exc.gpu_lost:
                    raise
                if not exc.unsupported:
                    self._failed("pcie_io", exc)
                    return None, None
                self._pcie_mode = "throughput"
                _logger.info("GPU %d (%s): PCIe byte counters are not supported (%s); integrating "
                             "nvmlDeviceGetPcieThroughput instead (blocks ~20 ms per direction)",
                             self.info.index, self.info.name, exc)
            else:
                if self._pcie_raw is not None:
                    self._pcie_total[0] += counter_delta(self._pcie_raw[0], tx, bits)
                    self._pcie_total[1] += counter_delta(self._pcie_raw[1], rx, bits)
                self._pcie_raw = (tx, rx)
                return self._pcie_total[0], self._pcie_total[1]
        tx_kib_s = self._throughput(transmit=True)
        rx_kib_s = self._throughput(transmit=False)
        now = time.monotonic()
        if tx_kib_s is None or rx_kib_s is None:
            return None, None
        if self._pcie_last_s is not None:
            elapsed_s = now - self._pcie_last_s
            self._pcie_total[0] += int(tx_kib_s * 1024 * elapsed_s)
            self._pcie_total[1] += int(rx_kib_s * 1024 * elapsed_s)
        self._pcie_last_s = now
        return self._pcie_total[0], self._pcie_total[1]

    def _throughput(self, *, transmit: bool) -> int | None:
        if "pcie_throughput" in self._off:
            return None
        try:
            return nvml.pcie_throughput_kib_s(self.handle, transmit=transmit)
        except nvml.NVMLCallError as exc:
            if exc.gpu_lost:
                raise
            self._failed("pcie_throughput", exc)
            return None

    # --- NVLink: the active links found once, then their data counters (one call) and error counters per link -----

    def _nvlink_readings(self) -> tuple[NVLinkReading, ...]:
        if self._nvlinks is None:
            try:
                count = nvml.nvlink_count(self.handle)
            except nvml.NVMLCallError as exc:
                if exc.gpu_lost:
                    raise
                if not exc.unsupported:
                    self._failed("nvlink", exc)  # tried again next cycle
                    return ()
                # a GPU without NVLink (PCIe cards, NVL boards without a bridge): nothing is off, there is nothing
                _logger.info("GPU %d (%s): no NVLink (%s)", self.info.index, self.info.name, exc)
                count = 0
            self._nvlinks = [link for link in range(count)
                             if self._get("nvlink_state", nvml.nvlink_active, self.handle, link)]
        if not self._nvlinks:
            return ()
        data = self._get("nvlink_io", nvml.nvlink_data_bytes, self.handle, self._nvlinks) or {}
        return tuple(NVLinkReading(link, *data.get(link, (None, None)),
                                   errors=self._get("nvlink_errors", nvml.nvlink_errors, self.handle, link) or ())
                     for link in self._nvlinks)

    # --- GPM: two samples at least 100 ms apart; values kept until the next pair ------------------------------

    def _gpm(self) -> dict[int, float | None]:
        if "gpm" in self._off:
            return {}
        if not self._gpm_samples:
            supported = self._get("gpm", nvml.gpm_supported, self.handle)
            if not supported:
                if supported is not None:
                    self._off.add("gpm")
                    _logger.info("GPU %d (%s): GPM metrics are not supported (Hopper or newer only); SM activity, "
                                 "occupancy, tensor and DRAM activity are off", self.info.index, self.info.name)
                return {}
            try:
                self._gpm_samples = [nvml.gpm_sample_alloc(), nvml.gpm_sample_alloc()]
            except nvml.NVMLCallError as exc:
                self._failed("gpm", exc)
                return {}
        now = time.monotonic()
        if self._gpm_last_s is not None and now - self._gpm_last_s < GPM_MIN_GAP_S:
            return self._gpm_values
        previous, current = self._gpm_samples
        try:
            nvml.gpm_sample_get(self.handle, current)
            if self._gpm_last_s is not None:
                self._gpm_values = nvml.gpm_metrics_percent(previous, current, _GPM_IDS)
        except nvml.NVMLCallError as exc:
            if exc.gpu_lost:
                raise
            self._failed("gpm", exc)
            self._gpm_last_s = None  # start a fresh pair next cycle
            self._gpm_values = {}
            return {}
        self._gpm_samples = [current, previous]  # the newest sample is the next cycle's first
        self._gpm_last_s = now
        return self._gpm_values

    # --- processes ---------------------------------------------------------------------------------------------

    def _processes(self) -> tuple[ProcessUsage, ...]:
        memory: dict[int, int | None] = {}
        for graphics, reading in ((False, "compute_processes"), (True, "graphics_processes")):
            listed = self._get(reading, nvml.running_processes, self.handle, graphics=graphics)
            for pid, used in listed or ():
                previous = memory.get(pid)
                memory[pid] = used if previous is None else max(previous, used or 0)
        if not memory:
            return ()
        sm = self._process_sm()
        out = []
        for pid, used in sorted(memory.items()):
            info = self._resolver.info(pid)
            out.append(ProcessUsage(
                pid=pid,
                executable_name=info.executable_name if info else "",
                container_id=info.container_id if info else "",
                pod_uid=info.pod_uid if info else "",
                ranks=info.ranks if info else (),
                service_name=info.service_name if info else "",
                k8s_pod_name=info.k8s_pod_name if info else "",
                k8s_namespace_name=info.k8s_namespace_name if info else "",
                k8s_container_name=info.k8s_container_name if info else "",
                memory_bytes=used,
                sm_utilization=None if sm is None else sm.get(pid, 0.0),
            ))
        return tuple(out)

    def _process_sm(self) -> dict[int, float] | None:
        """Latest SM utilization per pid since the last cycle; a pid without samples was idle (0)."""
        samples = self._get("process_utilization", nvml.process_sm_utilization, self.handle,
                            self._process_last_seen_us)
        if samples is None:
            return None
        latest: dict[int, tuple[int, int]] = {}
        for pid, stamp_us, sm_percent in samples:
            if pid not in latest or stamp_us >= latest[pid][0]:
                latest[pid] = (stamp_us, sm_percent)
            self._process_last_seen_us = max(self._process_last_seen_us, stamp_us)
        return {pid: sm_percent / 100 for pid, (_, sm_percent) in latest.items()}


def counter_delta(previous: int, current: int, bits: int) -> int:
    """Increase of a hardware counter of ``bits`` bits that may wrap. A value below 2**32 that goes back is a
    32-bit wrap (even in a 64-bit field); a wider counter that goes back was reset (driver reload) and counts
    from zero, so no near-2**64 jump is ever added."""
    if current >= previous:
        return current - previous
    if previous < 1 << 32:
        return current + (1 << 32) - previous
    if bits < 64 and previous < 1 << bits:
        return current + (1 << bits) - previous
    return current


def _ratio(percent: float | None) -> float | None:
    return None if percent is None else percent / 100


def _ecc_corrected(handle: nvml.Handle) -> int:
    return nvml.ecc_errors(handle, corrected=True)


def _ecc_uncorrected(handle: nvml.Handle) -> int:
    return nvml.ecc_errors(handle, corrected=False)

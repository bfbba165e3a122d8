# SPDX-License-Identifier: Apache-2.0
"""The terminal summary: one compact table per export, a row per GPU and its top processes by GPU memory.

``render_console`` is pure: it reads the collected ``MetricsData`` by metric name (names from
:mod:`otel_gpu.semconv`) and returns text. ``ConsoleTableExporter`` prints it each interval, redrawing in place
when the stream is a terminal and printing plain blocks otherwise (logs, pipes, CI), where a status line that has
not changed is not printed again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData

from otel_gpu import semconv
from otel_gpu.metrics import CUMULATIVE_EVERYWHERE

_GIB = 1024**3
_MHZ = 1e6


@dataclass(slots=True)
class _ProcessRow:
    pid: int
    name: str = ""
    memory_bytes: float = 0.0
    sm_ratio: float | None = None


@dataclass(slots=True)
class _GPURow:
    hw_id: str
    index: int | None = None
    name: str = ""
    utilization_ratio: float | None = None
    memory_used_bytes: float | None = None
    memory_limit_bytes: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temperature_cel: float | None = None
    sm_clock_hz: float | None = None
    memory_clock_hz: float | None = None
    state: str = ""  # hw.state whose hw.status series is 1 (ok, failed)
    processes: dict[int, _ProcessRow] = field(default_factory=dict)


def render_console(metrics_data: MetricsData | None, *, interval_s: float, top_processes: int = 3,
                   now_s: float | None = None) -> str:
    """The table for ``metrics_data`` (lines joined by newlines), or a one-line status when no GPU data exists.
    Every column states its unit, in its heading or (utilization %, temperature C) in its cells; memory and power
    are ``used/limit``."""
    stamp = time.strftime("%H:%M:%S", time.localtime(time.time() if now_s is None else now_s))
    gpus = _collect_rows(metrics_data)
    if not gpus:
        return f"otel-gpu {stamp}: {console_status(metrics_data, interval_s=interval_s)}"
    lines = [f"otel-gpu {stamp}  {len(gpus)} GPU{'s' if len(gpus) != 1 else ''}, every {interval_s:g} s",
             f"{'GPU':<4}{'NAME':<22}{'UTIL':>7}{'MEMORY GiB used/limit':>23}{'POWER W used/limit':>20}"
             f"{'TEMP':>8}{'SM MHz':>8}{'MEM MHz':>9}"]
    for row in sorted(gpus.values(), key=lambda r: (r.index is None, r.index or 0, r.hw_id)):
        lines.append(
            f"{_text(row.index):<4}{(row.name or row.hw_id)[:21]:<22}{_percent(row.utilization_ratio):>7}"
            f"{_pair(row.memory_used_bytes, row.memory_limit_bytes, _GIB, 1):>23}"
            f"{_pair(row.power_w, row.power_limit_w, 1, 0):>20}{_number(row.temperature_cel, 1, 0, 'C'):>8}"
            f"{_number(row.sm_clock_hz, _MHZ, 0):>8}{_number(row.memory_clock_hz, _MHZ, 0):>9}"
            + (f"  {row.state.upper()}" if row.state and row.state != "ok" else ""))
        top = sorted(row.processes.values(), key=lambda p: -p.memory_bytes)[:top_processes]
        if top:
            shown = ", ".join(
                f"{p.pid} {p.name or '?'} {p.memory_bytes / _GIB:.1f} GiB"
                + (f" SM {_percent(p.sm_ratio)}" if p.sm_ratio is not None else "") for p in top)
            more = len(row.processes) - len(top)
            lines.append(f"    processes: {shown}" + (f" (+{more} more)" if more > 0 else ""))
    return "\n".join(lines)


def console_status(metrics_data: MetricsData | None, *, interval_s: float) -> str | None:
    """Why there is no table (GPU metrics off, or none collected yet), without a timestamp; None when there is."""
    if _collect_rows(metrics_data):
        return None
    if _source_off(metrics_data, "nvml"):
        return ("GPU metrics are off (the log says why), so there is no GPU table; profiles, when on, print their own "
                "summary")
    return f"no GPU metrics yet (next collection in {interval_s:g} s)"


def _source_off(metrics_data: MetricsData | None, source: str) -> bool:
    """True when the agent reported ``otel_gpu.source.up{otel_gpu.source=source}`` as 0."""
    if metrics_data is None:
        return False
    for resource_metrics in metrics_data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                if metric.name != semconv.SELF_SOURCE_UP.name:
                    continue
                for point in metric.data.data_points:
                    if (point.attributes or {}).get(semconv.OTEL_GPU_SOURCE) == source:
                        return point.value == 0
    return False


def _collect_rows(metrics_data: MetricsData | None) -> dict[str, _GPURow]:
    gpus: dict[str, _GPURow] = {}
    if metrics_data is None:
        return gpus
    for resource_metrics in metrics_data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                for point in getattr(metric.data, "data_points", ()):
                    value = getattr(point, "value", None)
                    attributes = point.attributes or {}
                    hw_id = attributes.get(semconv.HW_ID)
                    if value is None or hw_id is None:
                        continue
                    row = gpus.get(str(hw_id))
                    if row is None:
                        row = gpus[str(hw_id)] = _GPURow(hw_id=str(hw_id))
                    _apply(row, metric.name, attributes, float(value))
    return gpus


def _apply(row: _GPURow, name: str, attributes: Mapping[str, Any], value: float) -> None:
    if row.index is None and semconv.NVIDIA_GPU_INDEX in attributes:
        row.index = int(attributes[semconv.NVIDIA_GPU_INDEX])
    if not row.name:
        row.name = str(attributes.get(semconv.HW_MODEL) or attributes.get(semconv.HW_NAME) or "")
    if name == semconv.GPU_UTILIZATION.name:
        if attributes.get(semconv.HW_GPU_TASK, "general") == "general":
            row.utilization_ratio = value
    elif name == semconv.GPU_MEMORY_USAGE.name:
        row.memory_used_bytes = value
    elif name == semconv.GPU_MEMORY_LIMIT.name:
        row.memory_limit_bytes = value
    elif name == semconv.GPU_POWER.name:
        row.power_w = value
    elif name == semconv.GPU_POWER_LIMIT.name:
        if attributes.get(semconv.NVIDIA_GPU_POWER_LIMIT_TYPE, "enforced") == "enforced":
            row.power_limit_w = value
    elif name == semconv.GPU_TEMPERATURE.name:
        if attributes.get(semconv.HW_SENSOR_LOCATION, "gpu") == "gpu":
            row.temperature_cel = value
    elif name == semconv.GPU_STATUS.name:
        if value == 1:
            row.state = str(attributes.get(semconv.HW_STATE, ""))
    elif name == semconv.GPU_CLOCK_FREQUENCY.name:
        clock = attributes.get(semconv.NVIDIA_GPU_CLOCK_TYPE)
        if clock == "sm":
            row.sm_clock_hz = value
        elif clock == "memory":
            row.memory_clock_hz = value
    elif name in (semconv.GPU_PROCESS_MEMORY_USAGE.name, semconv.GPU_PROCESS_SM_UTILIZATION.name):
        pid = attributes.get(semconv.PROCESS_PID)
        if pid is None:
            return
        process = row.processes.get(int(pid))
        if process is None:
            process = row.processes[int(pid)] = _ProcessRow(pid=int(pid))
        process.name = str(attributes.get(semconv.PROCESS_EXECUTABLE_NAME, process.name))
        if name == semconv.GPU_PROCESS_MEMORY_USAGE.name:
            process.memory_bytes = value
        else:
            process.sm_ratio = value


def _text(value: object) -> str:
    return "-" if value is None else str(value)


def _percent(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio * 100:.0f}%"


def _number(value: float | None, scale: float, digits: int, suffix: str = "") -> str:
    return "-" if value is None else f"{value / scale:.{digits}f}{suffix}"


def _pair(used: float | None, limit: float | None, scale: float, digits: int) -> str:
    return f"{_number(used, scale, digits)}/{_number(limit, scale, digits)}"


class ConsoleTableExporter(MetricExporter):
    """Prints :func:`render_console` of each export to ``stream``; redraws in place on a terminal."""

    def __init__(self, stream: TextIO, *, interval_s: float, top_processes: int = 3) -> None:
        super().__init__(preferred_temporality=CUMULATIVE_EVERYWHERE)
        self._stream = stream
        self._interval_s = interval_s
        self._top_processes = top_processes
        self._previous_lines = 0
        self._previous_status: str | None = None  # the status line printed last, while there is no table
        self._lock = threading.Lock()
        self.last_error = ""

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        text = render_console(metrics_data, interval_s=self._interval_s, top_processes=self._top_processes)
        status = console_status(metrics_data, interval_s=self._interval_s)
        with self._lock:
            repeated = status is not None and status == self._previous_status
            self._previous_status = status
            try:
                if self._is_tty():
                    # move to the first line of the previous table and clear to the end of the screen
                    prefix = f"\x1b[{self._previous_lines}F\x1b[J" if self._previous_lines else ""
                    self._stream.write(prefix + text + "\n")
                    self._previous_lines = text.count("\n") + 1
                elif not repeated:  # a log or pipe gets a status line once, not every interval
                    self._stream.write(text + "\n\n")
                self._stream.flush()
            except (OSError, ValueError) as exc:  # a closed or broken stdout
                self.last_error = str(exc)
                return MetricExportResult.FAILURE
        return MetricExportResult.SUCCESS

    def _is_tty(self) -> bool:
        try:
            return self._stream.isatty()
        except (AttributeError, ValueError):
            return False

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        return None

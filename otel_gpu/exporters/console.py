# SPDX-License-Identifier: Apache-2.0
"""A terminal summary per reporting interval: the profile type, totals and the top stacks by value."""

from __future__ import annotations

import sys
import threading
from typing import TextIO

from otel_gpu import semconv
from otel_gpu.profiles.model import ProfileBatch, Sample

_STACK_DEPTH = 6  # frames shown per stack, leaf first


def summarize(batch: ProfileBatch, top_n: int = 10, width: int = 120) -> str:
    """The text printed for ``batch``: one header line, then one line per top stack (leaf <- caller <- ...)."""
    kind = batch.type
    rows: dict[tuple[int, str, tuple[str, ...]], int] = {}
    total = 0
    for process in batch.processes:
        name = process.process.service_name or process.process.executable_name
        for sample in process.samples:
            key = (process.process.pid, name, _names(sample))
            rows[key] = rows.get(key, 0) + sample.value
            total += sample.value
    unit = _unit_label(batch)
    title = kind.period_type if kind.sample_type == "samples" and kind.period_type else kind.sample_type
    header = (f"== {title} ({kind.sample_unit}) over {batch.duration_nano / 1e9:.1f} s: "
              f"{len(batch.processes)} processes, {batch.sample_count} stacks, total {_value(total, batch)} {unit}")
    if batch.sampling_fraction < 1.0:
        header += f" (estimated from {batch.sampling_fraction:.0%} of events)"
    yielded = dict(batch.attributes).get(semconv.OTEL_GPU_GPU_TIME_YIELDED)
    if yielded:
        header += (f"; not measured for {yielded:.1f} s while another tool (torch.profiler, ...) held CUPTI or "
                   "the library stood aside for a program's CUDA graphs")
    lines = [header]
    for (pid, name, frames), value in sorted(rows.items(), key=lambda item: -item[1])[:top_n]:
        share = 100.0 * value / total if total else 0.0
        stack = " <- ".join(frames[:_STACK_DEPTH]) + (" <- ..." if len(frames) > _STACK_DEPTH else "")
        line = f"{share:5.1f}% {_value(value, batch):>10} {name}[{pid}] {stack}"
        lines.append(line if len(line) <= width else line[: width - 3] + "...")
    return "\n".join(lines)


def _names(sample: Sample) -> tuple[str, ...]:
    return tuple(frame.function or f"0x{frame.address:x}" for frame in sample.frames) or ("(no frames)",)


def _unit_label(batch: ProfileBatch) -> str:
    if batch.type.sample_unit == "nanoseconds" or (batch.type.sample_unit == "count" and batch.type.period_unit ==
                                                   "nanoseconds" and batch.type.period > 0):
        return "ms"
    return batch.type.sample_unit


def _value(value: int, batch: ProfileBatch) -> str:
    """Counts of a time-period profile and nanosecond values are shown in milliseconds."""
    kind = batch.type
    if kind.sample_unit == "nanoseconds":
        return f"{value / 1e6:.1f}"
    if kind.sample_unit == "count" and kind.period_unit == "nanoseconds" and kind.period > 0:
        return f"{value * kind.period / 1e6:.1f}"
    return str(value)


class ConsoleProfileExporter:
    """Prints :func:`summarize` of each batch to ``stream`` (stdout by default)."""

    def __init__(self, stream: TextIO | None = None, top_n: int = 10) -> None:
        self.name = "console"
        self._stream = stream
        self._top_n = top_n
        self._lock = threading.Lock()
        self._closed = False

    def export(self, batch: ProfileBatch) -> bool:
        if self._closed:
            return False
        stream = self._stream or sys.stdout
        text = summarize(batch, self._top_n) + "\n"
        with self._lock:
            try:
                stream.write(text)
                stream.flush()
            except (OSError, ValueError):  # a closed terminal or pipe: the summary is optional
                return False
        return True

    def shutdown(self, timeout_s: float = 5.0) -> None:
        self._closed = True

# SPDX-License-Identifier: Apache-2.0
"""A terminal summary per reporting interval: the profile type, totals and the top stacks by value, then the
insight line of the batch if it has one (:mod:`otel_gpu.profiles.insights`)."""

from __future__ import annotations

import math
import sys
import threading
from typing import TextIO

from otel_gpu import semconv
from otel_gpu.profiles.insights import straggler_line
from otel_gpu.profiles.model import ProcessProfile, ProfileBatch, Sample

_STACK_DEPTH = 6  # frames shown per stack, leaf first


def summarize(batch: ProfileBatch, top_n: int = 10, width: int = 120, explain_yield: bool = True) -> str:
    """The text printed for ``batch``: a header that states the unit of every value, a line of column headings,
    then one line per top stack (leaf <- caller <- ...). A batch with no samples is one line. ``explain_yield``:
    say why GPU time went unmeasured in full (the exporter says it once, then only the seconds)."""
    rows: dict[tuple[int, str, tuple[str, ...]], int] = {}
    total = 0
    for process in batch.processes:
        name = _process_name(process)
        for sample in process.samples:
            key = (process.process.pid, name, _names(sample))
            rows[key] = rows.get(key, 0) + sample.value
            total += sample.value
    unit = _unit_label(batch)
    title = _title(batch)
    over = f"== {title} over {batch.duration_nano / 1e9:.1f} s:"
    if not rows:
        return f"{over} nothing recorded" + _yield_note(batch, explain_yield)
    processes = sum(1 for process in batch.processes if process.samples)
    header = (f"{over} {processes} process{'es' if processes != 1 else ''}, {batch.sample_count} stacks, "
              f"total {_value(total, batch)} {unit}")
    if batch.sampling_fraction < 1.0:
        header += f" (estimated: {_fraction(batch.sampling_fraction)} of the time sampled)"
    header += _yield_note(batch, explain_yield)
    value_heading = "TIME ms" if unit == "ms" else unit.upper()
    lines = [header, f"{'SHARE':>6} {value_heading:>10} PROCESS[PID] STACK (leaf <- callers)"]
    for (pid, name, frames), value in sorted(rows.items(), key=lambda item: -item[1])[:top_n]:
        share = 100.0 * value / total if total else 0.0
        stack = " <- ".join(frames[:_STACK_DEPTH]) + (" <- ..." if len(frames) > _STACK_DEPTH else "")
        line = f"{share:5.1f}% {_value(value, batch):>10} {name}[{pid}] {stack}"
        lines.append(line if len(line) <= width else line[: width - 3] + "...")
    return "\n".join(lines)


def _process_name(process: ProcessProfile) -> str:
    name = process.process.service_name or process.process.executable_name
    rank = dict(process.process.ranks).get(semconv.DISTRIBUTED_RANK)
    if rank is not None:  # ranks of a distributed job are told apart by rank, not by pid
        name += f" rank {rank}"
    return name


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


def _yielded(batch: ProfileBatch) -> list[tuple[str, float]]:
    """(process[pid], seconds) of each process whose GPU time went unmeasured in the interval."""
    out = []
    for process in batch.processes:
        seconds = process.attribute(semconv.OTEL_GPU_GPU_TIME_YIELDED)
        if isinstance(seconds, (int, float)) and seconds > 0:
            out.append((f"{_process_name(process)}[{process.process.pid}]", float(seconds)))
    return out


def _yield_note(batch: ProfileBatch, explain: bool) -> str:
    yielded = _yielded(batch)
    if not yielded:
        return ""
    note = "; not measured for " + ", ".join(f"{seconds:.1f} s in {name}" for name, seconds in yielded)
    if explain:
        note += (" while another tool (torch.profiler, ...) held CUPTI or the library stood aside for a program's"
                 " CUDA graphs")
    return note


def _title(batch: ProfileBatch) -> str:
    """What was measured: ``cpu samples at 19 Hz``, ``gpu_time``, ``sync_wait``."""
    kind = batch.type
    if kind.sample_type == "samples" and kind.period_type:
        if kind.period_unit == "nanoseconds" and kind.period > 0:
            return f"{kind.period_type} samples at {1e9 / kind.period:.3g} Hz"
        return f"{kind.period_type} samples"
    return kind.sample_type


def _fraction(ratio: float) -> str:
    """A share in percent with two significant digits below 10 % (0.19 %, 1.9 %), so that a small sampling
    fraction is never rounded to 0."""
    percent = ratio * 100
    if percent <= 0:
        return "0%"
    if percent >= 10:
        return f"{percent:.0f}%"
    digits = max(1, 1 - math.floor(math.log10(percent)))
    return f"{percent:.{digits}f}%"


class ConsoleProfileExporter:
    """Prints :func:`summarize` of each batch to ``stream`` (stdout by default). Nothing repeats needlessly: an
    empty batch is printed once until its profile type records something again, and why GPU time went unmeasured
    is explained once."""

    shows_empty = True  # the agent hands it batches with no process too: an idle interval is said, once

    def __init__(self, stream: TextIO | None = None, top_n: int = 10) -> None:
        self.name = "console"
        self._stream = stream
        self._top_n = top_n
        self._lock = threading.Lock()
        self._closed = False
        self._quiet: set[str] = set()  # profile types whose last batch was empty and said so
        self._yield_explained = False

    def export(self, batch: ProfileBatch) -> bool:
        if self._closed:
            return False
        stream = self._stream or sys.stdout
        with self._lock:
            yielded = bool(_yielded(batch))
            empty = not any(process.samples for process in batch.processes) and not yielded
            if empty and batch.type.sample_type in self._quiet:
                return True
            (self._quiet.add if empty else self._quiet.discard)(batch.type.sample_type)
            text = summarize(batch, self._top_n, explain_yield=not self._yield_explained) + "\n"
            if insight := straggler_line(batch):
                text += insight + "\n"
            self._yield_explained |= yielded
            try:
                stream.write(text)
                stream.flush()
            except (OSError, ValueError):  # a closed terminal or pipe: the summary is optional
                return False
        return True

    def shutdown(self, timeout_s: float = 5.0) -> None:
        self._closed = True

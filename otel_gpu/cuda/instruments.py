# SPDX-License-Identifier: Apache-2.0
"""Per-process GPU-time counters as OTel observable instruments: kernel launches, GPU kernel time and sync-wait
time of every injected process, the time its GPU time was not measured (the library stood aside) and the time its
sampling windows covered, read from :meth:`GPUTimeSource.process_counters` at each collection.

Attributes: the process's identity (procfs.identity_attributes: with its distributed.* rank attributes), as on its
profiles.
Values are cumulative estimates (sampled windows re-weighted), so a dashboard can rate() them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from otel_gpu import semconv
from otel_gpu.cuda.source import ProcessCounters
from otel_gpu.procfs import ProcessInfo, identity_attributes

METER_NAME = "otel_gpu.cuda"


Naming = Callable[[ProcessInfo], ProcessInfo]


def _as_is(info: ProcessInfo) -> ProcessInfo:
    return info


class CounterSource(Protocol):
    def process_counters(self) -> list[ProcessCounters]: ...


def process_attributes(counters: ProcessCounters, named: Naming = _as_is) -> dict[str, str | int]:
    """The process's identity, as on its profiles and NVML metrics (procfs.identity_attributes); ``named`` adds the
    k8s names known now (``ProcessResolver.with_names``)."""
    return dict(identity_attributes(named(counters.info)))


def register_gpu_time_instruments(meter: Meter, source: CounterSource, named: Naming = _as_is) -> None:
    """Create the ``nvidia.gpu.process.*`` GPU-time counters, ``otel_gpu.gpu_time.yielded`` and ``.sampled`` on
    ``meter``, observing ``source``; ``named`` completes an identity kept since a process's first record
    (``ProcessResolver.with_names``)."""
    readers: dict[str, Callable[[ProcessCounters], float]] = {
        semconv.GPU_PROCESS_KERNEL_LAUNCHES.name: lambda c: round(c.launches),
        semconv.GPU_PROCESS_KERNEL_TIME.name: lambda c: c.kernel_time_ns / 1e9,
        semconv.GPU_PROCESS_SYNC_WAIT_TIME.name: lambda c: c.sync_wait_ns / 1e9,
        semconv.GPU_TIME_YIELDED.name: lambda c: c.unmeasured_ns / 1e9,
        semconv.GPU_TIME_SAMPLED.name: lambda c: c.covered_ns / 1e9,
    }
    for spec in semconv.GPU_TIME_METRICS:
        meter.create_observable_counter(spec.name, callbacks=[_observe(source, readers[spec.name], named)],
                                        unit=spec.unit, description=spec.description)


def _observe(source: CounterSource, read: Callable[[ProcessCounters], float], named: Naming
             ) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def callback(options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(read(c), process_attributes(c, named)) for c in source.process_counters()]

    return callback

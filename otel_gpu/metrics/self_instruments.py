# SPDX-License-Identifier: Apache-2.0
"""The agent's own health as observable instruments, read from :mod:`otel_gpu.selfmetrics` at each collection.

Sources and exporters count in plain Python (``selfmetrics.count`` / ``set_gauge``); the callbacks here turn the
latest snapshot into ``otel_gpu.*`` observations, so nothing on a hot path touches the OTel SDK.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from otel_gpu import selfmetrics, semconv
from otel_gpu.semconv import MetricSpec

SELF_METER_NAME = "otel_gpu.self"

Callback = Callable[[CallbackOptions], Iterable[Observation]]


def register_self_instruments(meter: Meter) -> None:
    """Create one observable instrument per ``semconv.SELF_METRICS`` entry on ``meter``."""
    for spec in semconv.SELF_METRICS:
        callback = _observe(spec)
        if spec.instrument == "counter":
            meter.create_observable_counter(spec.name, callbacks=[callback], unit=spec.unit,
                                            description=spec.description)
        elif spec.instrument == "updowncounter":
            meter.create_observable_up_down_counter(spec.name, callbacks=[callback], unit=spec.unit,
                                                    description=spec.description)
        else:
            meter.create_observable_gauge(spec.name, callbacks=[callback], unit=spec.unit,
                                          description=spec.description)


def _observe(spec: MetricSpec) -> Callback:
    """A callback yielding every recorded series of ``spec`` (counters for counters, gauges otherwise)."""
    use_counters = spec.instrument == "counter"

    def callback(options: CallbackOptions) -> Iterable[Observation]:
        counters, gauges = selfmetrics.snapshot()
        values = counters if use_counters else gauges
        return [Observation(value, dict(attributes)) for (name, attributes), value in values.items()
                if name == spec.name]

    return callback

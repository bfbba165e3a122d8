# SPDX-License-Identifier: Apache-2.0
"""The metrics pipeline: OTel instruments in, OTLP / Prometheus / local files / terminal table out.

:mod:`otel_gpu.metrics.pipeline` owns the MeterProvider and its readers; :mod:`.files` writes OTLP JSON lines;
:mod:`.console` renders the terminal table; :mod:`.self_instruments` reports the agent's own health counters.
"""

from __future__ import annotations

from opentelemetry.sdk.metrics import (
    Counter,
    Histogram,
    ObservableCounter,
    ObservableGauge,
    ObservableUpDownCounter,
    UpDownCounter,
    _Gauge,
)
from opentelemetry.sdk.metrics.export import AggregationTemporality

# Mimir and Prometheus reject delta: every exporter of the pipeline asks for cumulative points, for every kind.
CUMULATIVE_EVERYWHERE: dict[type, AggregationTemporality] = {
    kind: AggregationTemporality.CUMULATIVE
    for kind in (Counter, UpDownCounter, Histogram, ObservableCounter, ObservableUpDownCounter, ObservableGauge,
                 _Gauge)
}

# SPDX-License-Identifier: Apache-2.0
"""Observable streams forget processes that exited, so per-process series never hit the SDK's cardinality limit."""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_gpu.metrics import CUMULATIVE_EVERYWHERE, _stale


def _points(reader: InMemoryMetricReader, name: str) -> list:  # type: ignore[type-arg]
    data = reader.get_metrics_data()
    return [point for rm in data.resource_metrics for sm in rm.scope_metrics for metric in sm.metrics
            if metric.name == name for point in metric.data.data_points]


def test_thousands_of_short_lived_processes_keep_their_own_series() -> None:
    _stale.install()
    reader = InMemoryMetricReader(preferred_temporality=CUMULATIVE_EVERYWHERE)
    provider = MeterProvider(metric_readers=[reader])
    live: dict[int, int] = {}

    def observe(options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(used, {"process.pid": pid}) for pid, used in live.items()]

    meter = provider.get_meter("test")
    meter.create_observable_up_down_counter("nvidia.gpu.process.memory.usage", [observe], unit="By")
    meter.create_observable_counter("kernel.time", [lambda o: [Observation(7, {"k": "steady"})]], unit="s")

    for pid in range(1, 2501):  # more distinct processes than the SDK's default limit of 2000
        live.clear()
        live[pid] = pid * 10
        points = _points(reader, "nvidia.gpu.process.memory.usage")
        assert [(p.attributes["process.pid"], p.value) for p in points] == [(pid, pid * 10)]
    assert not any("otel.metric.overflow" in p.attributes for p in _points(reader, "nvidia.gpu.process.memory.usage"))

    # a series reported every cycle keeps its start time (a cumulative counter is not reset by the eviction)
    starts = {p.start_time_unix_nano for _ in range(3) for p in _points(reader, "kernel.time")}
    assert len(starts) == 1
    provider.shutdown()

# SPDX-License-Identifier: Apache-2.0
"""The per-process GPU-time counters through a real OTel SDK MeterProvider and in-memory reader."""

from __future__ import annotations

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_gpu import semconv
from otel_gpu.cuda.instruments import register_gpu_time_instruments
from otel_gpu.cuda.source import ProcessCounters
from otel_gpu.procfs import ProcessInfo


class Counters:
    def __init__(self) -> None:
        self.values = [ProcessCounters(ProcessInfo(42, "train", container_id="c" * 64, service_name="trainer"),
                                       launches=1234.4, kernel_time_ns=2.5e9, sync_wait_ns=0.25e9,
                                       unmeasured_ns=4_000_000_000, covered_ns=1_500_000_000)]

    def process_counters(self) -> list[ProcessCounters]:
        return self.values


def _read(reader: InMemoryMetricReader) -> dict[str, tuple[float, dict[str, object], str]]:
    data = reader.get_metrics_data()
    out = {}
    for resource_metrics in data.resource_metrics:
        for scope in resource_metrics.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    out[metric.name] = (point.value, dict(point.attributes), metric.unit)
    return out


def test_counters_per_process() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    source = Counters()
    register_gpu_time_instruments(provider.get_meter("test"), source)
    values = _read(reader)
    attrs = {semconv.PROCESS_PID: 42, semconv.PROCESS_EXECUTABLE_NAME: "train", semconv.CONTAINER_ID: "c" * 64,
             semconv.SERVICE_NAME: "trainer"}
    assert values == {
        "nvidia.gpu.process.kernel.launches": (1234, attrs, "{launch}"),
        "nvidia.gpu.process.kernel.time": (2.5, attrs, "s"),
        "nvidia.gpu.process.sync_wait.time": (0.25, attrs, "s"),
        "otel_gpu.gpu_time.yielded": (4.0, attrs, "s"),  # the seconds its GPU time was not measured
        "otel_gpu.gpu_time.sampled": (1.5, attrs, "s"),  # the seconds its sampling windows covered
    }
    source.values[0].kernel_time_ns += 1e9
    assert _read(reader)["nvidia.gpu.process.kernel.time"][0] == 3.5
    provider.shutdown()

# SPDX-License-Identifier: Apache-2.0
"""The pipeline against real backends: OTLP/HTTP into VictoriaMetrics, and a real Prometheus scraping the endpoint.

Both must end up with the same Prometheus-style names (``semconv.prometheus_name``), labels and values.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from opentelemetry.sdk.resources import Resource

from otel_gpu import semconv
from otel_gpu.config import AgentConfig, MetricsConfig, OTLPConfig, OutputConfig
from otel_gpu.metrics.pipeline import MetricsPipeline
from tests.backends import (
    Prometheus,
    VictoriaMetrics,
    free_port,
    prometheus_factory,
    settle,
    values_by,
    victoria_metrics,
    wait_until,
)
from tests.metrics.gpu_readings import GIB, SimReadings

__all__ = ["prometheus_factory", "victoria_metrics"]  # fixtures used below

GPU0 = "GPU-00000000-fa4e-4c1d-9a6b-000000000000"
GPU1 = "GPU-00000000-fa4e-4c1d-9a6b-000000000001"


def _check_gpu_series(backend: VictoriaMetrics | Prometheus, readings: SimReadings) -> None:
    names = wait_until(lambda: (semconv.prometheus_name(semconv.GPU_PROCESS_SM_UTILIZATION) in backend.series_names()
                                and backend.series_names()), 60, f"GPU series in {backend.name}")
    for spec in readings.specs:
        assert semconv.prometheus_name(spec) in names, (semconv.prometheus_name(spec), sorted(names))
    # freshly ingested samples become searchable a moment after their series names
    settle(lambda: values_by(backend.query("hw_gpu_utilization_ratio"), "hw_id"), {GPU0: 0.4, GPU1: 0.7})
    settle(lambda: values_by(backend.query("hw_gpu_memory_usage_bytes"), "hw_id"), {GPU0: 16 * GIB, GPU1: 32 * GIB})
    settle(lambda: values_by(backend.query("hw_power_watts"), "hw_id"), {GPU0: 300.0, GPU1: 400.0})
    settle(lambda: values_by(backend.query('nvidia_gpu_clock_frequency_hertz{nvidia_gpu_clock_type="sm"}'), "hw_id"),
           {GPU0: 1980e6, GPU1: 1755e6})
    energy = settle(lambda: values_by(backend.query("hw_energy_joules_total"), "hw_id"), None)
    assert energy[GPU0] >= 1e6 and energy[GPU1] >= 2e6
    settle(lambda: {(p["metric"]["process_pid"], p["metric"]["process_executable_name"], p["metric"]["hw_id"],
                     float(p["value"][1])) for p in backend.query("nvidia_gpu_process_memory_usage_bytes")},
           {("4242", "trainer", GPU0, 8.0 * GIB), ("4343", "server", GPU1, 2.0 * GIB)})
    settle(lambda: values_by(backend.query("nvidia_gpu_process_sm_utilization_ratio"), "process_pid"),
           {"4242": 0.5, "4343": 0.25})


PROCESSES = {0: [(4242, "trainer", 8 * GIB, 0.5)], 1: [(4343, "server", 2 * GIB, 0.25)]}


@pytest.mark.backend
def test_otlp_http_into_victoria_metrics(victoria_metrics: VictoriaMetrics) -> None:
    config = AgentConfig(otlp=OTLPConfig(metrics_endpoint=victoria_metrics.otlp_metrics_url, protocol="http/protobuf"),
                         metrics=MetricsConfig(export_interval_s=0.5), output=OutputConfig(files="off", console="off"))
    pipeline = MetricsPipeline(config, Resource({"service.name": "backend-test", "host.name": "node-a"}))
    try:
        readings = SimReadings(pipeline.meter("otel_gpu.gpu"), gpus=2, processes=PROCESSES)
        _check_gpu_series(victoria_metrics, readings)
        # resource attributes become labels, so a host's GPUs can be told apart
        assert {r["metric"].get("host_name") for r in victoria_metrics.query("hw_gpu_utilization_ratio")} == {"node-a"}
    finally:
        pipeline.shutdown()


@pytest.mark.backend
def test_victoria_metrics_names_up_down_counters_of_unit_1_with_ratio(victoria_metrics: VictoriaMetrics) -> None:
    """hw.status and otel_gpu.source.up (up-down counters of unit 1) get _ratio in VictoriaMetrics, as
    ``semconv.victoria_metrics_name`` and the README say, where the scrape endpoint names them without it."""
    config = AgentConfig(otlp=OTLPConfig(metrics_endpoint=victoria_metrics.otlp_metrics_url, protocol="http/protobuf"),
                         metrics=MetricsConfig(export_interval_s=0.5), output=OutputConfig(files="off", console="off"))
    pipeline = MetricsPipeline(config, Resource({"service.name": "backend-test", "host.name": "node-b"}))
    try:
        meter = pipeline.meter("test")
        for spec in (semconv.GPU_STATUS, semconv.SELF_SOURCE_UP):
            meter.create_up_down_counter(spec.name, unit=spec.unit).add(1, {"hw.state": "ok"})
        expected = {semconv.victoria_metrics_name(semconv.GPU_STATUS),
                    semconv.victoria_metrics_name(semconv.SELF_SOURCE_UP)}
        assert expected == {"hw_status_ratio", "otel_gpu_source_up_ratio"}
        names = wait_until(lambda: expected <= victoria_metrics.series_names() and victoria_metrics.series_names(),
                           60, "the two series in VictoriaMetrics")
        assert "hw_status" not in names and "otel_gpu_source_up" not in names
        assert semconv.prometheus_name(semconv.GPU_STATUS) == "hw_status"  # what the scrape endpoint serves
    finally:
        pipeline.shutdown()


@pytest.mark.backend
def test_prometheus_scrapes_the_endpoint(prometheus_factory: Callable[[list[str]], Prometheus]) -> None:
    port = free_port()
    config = AgentConfig(metrics=MetricsConfig(export_interval_s=60, prometheus_port=port,
                                               prometheus_host="127.0.0.1"),
                         output=OutputConfig(files="off", console="off"))
    pipeline = MetricsPipeline(config, Resource({"service.name": "backend-test"}))
    try:
        readings = SimReadings(pipeline.meter("otel_gpu.gpu"), gpus=2, processes=PROCESSES)
        prometheus = prometheus_factory([f"127.0.0.1:{port}"])
        wait_until(prometheus.targets_up, 60, "Prometheus scraping the agent")
        _check_gpu_series(prometheus, readings)
    finally:
        pipeline.shutdown()

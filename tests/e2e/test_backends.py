# SPDX-License-Identifier: Apache-2.0
"""End to end: the real agent on the fake NVML exports to a real VictoriaMetrics (OTLP/HTTP) and is scraped by a
real Prometheus; both hold the same names, labels and values for both GPUs and for the GPU processes.
Then VictoriaMetrics goes away and comes back while the agent keeps running.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from otel_gpu import semconv
from otel_gpu.resource import service_instance_id
from tests.backends import (
    Prometheus,
    VictoriaMetrics,
    free_port,
    http_get,
    prometheus_factory,
    settle,
    values_by,
    victoria_metrics,
    wait_until,
)
from tests.e2e.agent import GIB, GPU_UUIDS, MEMORY_TOTAL_BYTES, AgentProcess, build_fake_nvml, sleepers

__all__ = ["prometheus_factory", "sleepers", "victoria_metrics"]  # fixtures used below

GPU0, GPU1 = GPU_UUIDS
NODE = "gpu-node-7"
# a generous OTLP timeout: on a busy machine a slow answer must not read as an outage
INTERVAL_ARGS = ["--metric-export-interval", "1", "--otlp-timeout", "5", "--log-level", "info"]


def _processes_knob(sleepers: list[subprocess.Popen[bytes]]) -> str:
    first, second = sleepers
    return f"{first.pid}@0:{8 * GIB}:50,{second.pid}@1:{2 * GIB}:25"


def _check_agent_series(backend: VictoriaMetrics | Prometheus, sleepers: list[subprocess.Popen[bytes]]) -> None:
    """The fake's documented default scenario, converted to base units, for both GPUs and both processes."""
    name = semconv.prometheus_name

    def by_gpu(promql: str) -> Callable[[], dict[str, float]]:
        return lambda: values_by(backend.query(promql), "hw_id")

    wanted = [semconv.GPU_UTILIZATION, semconv.GPU_MEMORY_USAGE, semconv.GPU_MEMORY_LIMIT, semconv.GPU_POWER,
              semconv.GPU_ENERGY, semconv.GPU_TEMPERATURE, semconv.GPU_CLOCK_FREQUENCY,
              semconv.GPU_PROCESS_MEMORY_USAGE, semconv.GPU_PROCESS_SM_UTILIZATION]
    names = wait_until(lambda: all(name(s) in backend.series_names() for s in wanted) and backend.series_names(),
                       90, f"the agent's GPU series in {backend.name}")
    assert {name(s) for s in wanted} <= names
    settle(by_gpu(f'{name(semconv.GPU_UTILIZATION)}{{hw_gpu_task="general"}}'), {GPU0: 0.4, GPU1: 0.7})
    settle(by_gpu(name(semconv.GPU_MEMORY_USAGE)), {GPU0: 16.0 * GIB, GPU1: 32.0 * GIB})
    settle(by_gpu(name(semconv.GPU_MEMORY_LIMIT)), {GPU0: float(MEMORY_TOTAL_BYTES), GPU1: float(MEMORY_TOTAL_BYTES)})
    settle(by_gpu(name(semconv.GPU_POWER)), {GPU0: 300.0, GPU1: 400.0})
    settle(by_gpu(name(semconv.GPU_TEMPERATURE)), {GPU0: 50.0, GPU1: 60.0})
    settle(by_gpu(f'{name(semconv.GPU_CLOCK_FREQUENCY)}{{nvidia_gpu_clock_type="sm"}}'), {GPU0: 1980e6, GPU1: 1755e6})
    settle(by_gpu(f'{name(semconv.GPU_CLOCK_FREQUENCY)}{{nvidia_gpu_clock_type="memory"}}'),
           {GPU0: 3201e6, GPU1: 3201e6})
    energy = settle(by_gpu(name(semconv.GPU_ENERGY)), None)
    # (i+1)*1e6 J at nvmlInit plus power * seconds since; a run of this test lasts far less than 1000 s
    assert 1e6 <= energy[GPU0] < 1e6 + 300 * 1000 and 2e6 <= energy[GPU1] < 2e6 + 400 * 1000
    # GPU identity on every series
    for item in backend.query(name(semconv.GPU_POWER)):
        labels = item["metric"]
        assert labels.get("nvidia_gpu_index") in ("0", "1") and labels.get("nvidia_gpu_pci_bus_id"), labels
    first, second = sleepers
    settle(lambda: {(p["metric"]["process_pid"], p["metric"].get("process_executable_name"), p["metric"]["hw_id"],
                     float(p["value"][1])) for p in backend.query(name(semconv.GPU_PROCESS_MEMORY_USAGE))},
           {(str(first.pid), "sleep", GPU0, 8.0 * GIB), (str(second.pid), "sleep", GPU1, 2.0 * GIB)})
    settle(lambda: values_by(backend.query(name(semconv.GPU_PROCESS_SM_UTILIZATION)), "process_pid"),
           {str(first.pid): 0.5, str(second.pid): 0.25})
    # the agent's own health: how long the NVML collection cycle took
    durations = settle(lambda: values_by(backend.query(name(semconv.SELF_COLLECTION_DURATION)), "otel_gpu_source"),
                       None)
    assert durations and all(0 < seconds < 10 for seconds in durations.values()), durations


@pytest.mark.backend
def test_agent_into_victoria_metrics_and_prometheus(tmp_path: Path, victoria_metrics: VictoriaMetrics,
                                                    prometheus_factory: Callable[[list[str]], Prometheus],
                                                    sleepers: list[subprocess.Popen[bytes]]) -> None:
    build_fake_nvml()
    port = free_port()
    agent = AgentProcess(tmp_path, [*INTERVAL_ARGS, "--otlp-metrics-endpoint", victoria_metrics.otlp_metrics_url,
                                    "--otlp-metrics-protocol", "http/protobuf", "--prometheus-port", str(port),
                                    "--prometheus-host", "127.0.0.1", "--node-name", NODE],
                         fake_nvml={"PROCESSES": _processes_knob(sleepers)})
    try:
        prometheus = prometheus_factory([f"127.0.0.1:{port}"])
        _check_agent_series(victoria_metrics, sleepers)
        wait_until(prometheus.targets_up, 60, "Prometheus scraping the agent")
        _check_agent_series(prometheus, sleepers)
        # each node its own instance: service.instance.id (a UUID v5 of the node name) on every pushed series, and
        # in the scraped target_info next to the node's name
        instance = service_instance_id(NODE)
        labels = [item["metric"] for item in victoria_metrics.query(semconv.prometheus_name(semconv.GPU_POWER))]
        assert labels and all(item.get("service_instance_id") == instance for item in labels), labels
        target_info = settle(lambda: [item["metric"] for item in prometheus.query("target_info")], None)
        assert target_info[0].get("service_instance_id") == instance, target_info
        assert target_info[0].get("k8s_node_name") == NODE and target_info[0].get("host_name") == NODE, target_info
        assert agent.running(), agent.stderr()
    finally:
        code = agent.stop()
    assert code == 0, agent.stderr()
    # a backend was configured, so no local files and no table by default
    assert not (tmp_path / "otel-gpu-data").exists() and "GPU" not in agent.stdout()


@pytest.mark.backend
def test_backend_goes_away_and_comes_back(tmp_path: Path, victoria_metrics: VictoriaMetrics,
                                          sleepers: list[subprocess.Popen[bytes]]) -> None:
    build_fake_nvml()
    prometheus_port = free_port()
    agent = AgentProcess(tmp_path, [*INTERVAL_ARGS, "--otlp-metrics-endpoint", victoria_metrics.otlp_metrics_url,
                                    "--otlp-metrics-protocol", "http/protobuf", "--prometheus-port",
                                    str(prometheus_port), "--prometheus-host", "127.0.0.1"],
                         fake_nvml={"PROCESSES": _processes_knob(sleepers)})
    energy = f'hw_energy_joules_total{{hw_id="{GPU0}"}}'
    try:
        before = settle(lambda: victoria_metrics.query(energy), None, timeout_s=90)
        energy_before = float(before[0]["value"][1])
        rss_before = agent.rss_bytes()

        victoria_metrics.stop()  # the backend goes away; the agent keeps collecting and failing to export
        scrape = f"http://127.0.0.1:{prometheus_port}/metrics"
        failures = wait_until(lambda: _failures(http_get(scrape).decode()) >= 4, 120,
                              "four failed exports counted in the agent's own self-metrics")
        assert failures and agent.running(), agent.stderr()
        rss_during = agent.rss_bytes()

        restarted_s = time.time()
        victoria_metrics.start()  # same port, same data folder
        after = settle(lambda: [r for r in victoria_metrics.query(energy) if float(r["value"][0]) > restarted_s],
                       None, timeout_s=90)
        energy_after = float(after[0]["value"][1])
        failures_query = 'otel_gpu_export_failures_total{otel_gpu_exporter="otlp_http"}'
        counted = settle(lambda: victoria_metrics.query(failures_query), None, timeout_s=60)
        assert float(counted[0]["value"][1]) >= 4
        rss_after = agent.rss_bytes()
        assert agent.running(), agent.stderr()
    finally:
        code = agent.stop()
    assert code == 0
    # cumulative values carry on across the outage (the GPU kept drawing 300 W)
    assert energy_after > energy_before
    # memory stays bounded while exports fail: nothing queues up
    assert rss_during - rss_before < 20 * 1024**2 and rss_after - rss_before < 20 * 1024**2, \
        (rss_before, rss_during, rss_after)
    assert rss_after < 200 * 1024**2
    # one line when the outage starts and one when it ends, not one per failed attempt
    log = agent.stderr()
    assert len(re.findall(r"metrics export to otlp_http .* is failing", log)) == 1, log
    assert len(re.findall(r"metrics export to otlp_http .* recovered after \d+ failed exports", log)) == 1, log


def _failures(exposition: str) -> float:
    total = 0.0
    for line in exposition.splitlines():
        if line.startswith("otel_gpu_export_failures_total{") and 'otel_gpu_exporter="otlp_http"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total

# SPDX-License-Identifier: Apache-2.0
"""The Grafana dashboards (scripts/dashboards.py -> helm/otel-gpu/dashboards/*.json) against real data.

The agent's own instruments (register_gpu_instruments, register_gpu_time_instruments, and the pipeline's
self-metrics) read a fake 2-GPU node with processes in two pods and a few health readings, export OTLP/HTTP
through a stand-in for the gateway Collector (tests/dashboards/gateway.py) into a real VictoriaMetrics. Every
variable query must list values; every query of every panel, with the variables filled in (all values, and the
first value of each), must return data.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.resources import Resource

from otel_gpu import selfmetrics, semconv
from otel_gpu.config import AgentConfig, MetricsConfig, OTLPConfig, OutputConfig
from otel_gpu.cuda.instruments import METER_NAME as CUDA_METER
from otel_gpu.cuda.instruments import register_gpu_time_instruments
from otel_gpu.cuda.source import ProcessCounters
from otel_gpu.gpu.model import GPUInfo, GPUSnapshot, NVLinkReading, ProcessUsage, XIDErrors
from otel_gpu.metrics.gpu_instruments import register_gpu_instruments
from otel_gpu.metrics.pipeline import MetricsPipeline
from otel_gpu.procfs import ProcessInfo
from otel_gpu.profiles import model as profile_model
from tests.backends import VictoriaMetrics, http_get, settle, victoria_metrics
from tests.conftest import REPO
from tests.dashboards.gateway import Gateway

__all__ = ["victoria_metrics"]  # fixture used below

GIB = 1024**3
GPUS = (GPUInfo(0, "GPU-00000000-fa4e-4c1d-9a6b-000000000000", "NVIDIA H200", "00000000:18:00.0"),
        GPUInfo(1, "GPU-00000000-fa4e-4c1d-9a6b-000000000001", "NVIDIA H200", "00000000:2A:00.0"))
POD_A = "6f1c2d3e-0000-4000-8000-00000000000a"
POD_B = "6f1c2d3e-0000-4000-8000-00000000000b"
CONTAINER_A = "a" * 64
CONTAINER_B = "b" * 64
# what k8sattributes would find for each pod uid (the gateway stand-in adds these)
PODS = {POD_A: {"k8s.pod.name": "trainer-0", "k8s.namespace.name": "ml", "k8s.statefulset.name": "trainer"},
        POD_B: {"k8s.pod.name": "server-7d9f-x2", "k8s.namespace.name": "serving",
                "k8s.deployment.name": "server"}}
# GPU 0: a trainer that holds memory but leaves the GPU idle (the idle-but-allocated case); GPU 1: a busy server
PROCESSES = {0: ProcessUsage(pid=4242, executable_name="trainer", container_id=CONTAINER_A, pod_uid=POD_A,
                             memory_bytes=8 * GIB, sm_utilization=0.01),
             1: ProcessUsage(pid=4343, executable_name="server", container_id=CONTAINER_B, pod_uid=POD_B,
                             memory_bytes=2 * GIB, sm_utilization=0.6)}


def load_generator() -> Any:
    spec = importlib.util.spec_from_file_location("otel_gpu_dashboards", REPO / "scripts" / "dashboards.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


dashboards = load_generator()


class FakeNode:
    """Snapshots, XID counts and GPU-time counters of a 2-GPU node; counters grow with time like real ones."""

    def __init__(self) -> None:
        self.started = time.time()

    def snapshots(self, fresh_within_s: float | None = None) -> tuple[GPUSnapshot, ...]:
        elapsed = time.time() - self.started
        return tuple(GPUSnapshot(
            info=info, time_s=time.time(), utilization=(0.02, 0.7)[info.index], encoder_utilization=0.0,
            decoder_utilization=0.0, memory_used_bytes=(9, 3)[info.index] * GIB, memory_total_bytes=143771 * 1024**2,
            memory_bandwidth_utilization=(0.01, 0.4)[info.index], pcie_transmit_bytes=int(1e6 * (1 + elapsed)),
            pcie_receive_bytes=int(5e6 * (1 + elapsed)), power_w=(120.0, 610.0)[info.index], power_limit_w=700.0,
            energy_j=1e6 + 400.0 * elapsed, temperature_c=(38.0, 71.0)[info.index], temperature_slowdown_c=87.0,
            temperature_shutdown_c=92.0, sm_clock_hz=(345e6, 1980e6)[info.index], memory_clock_hz=3201e6,
            sm_clock_max_hz=1980e6, memory_clock_max_hz=3201e6, throttle_reasons=(0x1, 0x4)[info.index],
            performance_state=(8, 0)[info.index], ecc_corrected_errors=3, ecc_uncorrected_errors=0,
            pcie_replay_errors=1, sm_activity=(0.01, 0.65)[info.index], sm_occupancy=(0.0, 0.4)[info.index],
            tensor_activity=(0.0, 0.3)[info.index], dram_activity=(0.0, 0.35)[info.index],
            processes=(PROCESSES[info.index],),
            nvlinks=tuple(NVLinkReading(link, transmit_bytes=int(2e9 * (1 + elapsed)),
                                        receive_bytes=int(3e9 * (1 + elapsed)), errors=(("replay", 2), ("crc_flit", 0)))
                          for link in range(2))) for info in GPUS)

    def xid_errors(self) -> tuple[XIDErrors, ...]:
        return tuple(XIDErrors(info, 79 if info.index else 13, 1 + info.index, self.started) for info in GPUS)

    def process_counters(self) -> list[ProcessCounters]:
        elapsed = time.time() - self.started
        out = []
        for usage in PROCESSES.values():
            info = ProcessInfo(pid=usage.pid, executable_name=usage.executable_name,
                               container_id=usage.container_id, pod_uid=usage.pod_uid)
            out.append(ProcessCounters(info, launches=1000.0 * (1 + elapsed), kernel_time_ns=3e8 * (1 + elapsed),
                                       sync_wait_ns=1e8 * (1 + elapsed), unmeasured_ns=int(5e7 * (1 + elapsed))))
        return out


def record_agent_health() -> None:
    """The agent's own readings (otel_gpu.*) as its sources and exporters record them; selfmetrics.reset() after."""
    for source in (semconv.Source.NVML, semconv.Source.CPU_PROFILER, semconv.Source.GPU_TIME):
        selfmetrics.set_gauge(semconv.SELF_SOURCE_UP.name, 1, otel_gpu__source=source)
        selfmetrics.set_gauge(semconv.SELF_COLLECTION_DURATION.name, 0.02, otel_gpu__source=source)
    selfmetrics.count(semconv.SELF_PROFILE_SAMPLES.name, 190, otel_gpu__source=semconv.Source.CPU_PROFILER)
    selfmetrics.count(semconv.SELF_DROPPED.name, 3, otel_gpu__reason=semconv.Reason.QUEUE_FULL,
                      otel_gpu__signal=semconv.Signal.PROFILES)
    selfmetrics.count(semconv.SELF_EXPORT_FAILURES.name, otel_gpu__exporter="otlp_grpc",
                      otel_gpu__signal=semconv.Signal.PROFILES)
    selfmetrics.count(semconv.SELF_ERRORS.name, otel_gpu__source=semconv.Source.SYMBOLIZER,
                      otel_gpu__reason=semconv.Reason.NO_SYMBOL)


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def prometheus_queries() -> list[tuple[str, str, str]]:
    """(dashboard uid, panel title, expr) of every Prometheus query of every panel."""
    out = []
    for board in (build() for build in dashboards.DASHBOARDS.values()):
        for panel in panels(board):
            for target in panel.get("targets", []):
                if target["datasource"]["type"] == "prometheus":
                    out.append((board["uid"], panel["title"], target["expr"]))
    return out


def query_variables(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [v for v in board["templating"]["list"] if v["type"] == "query"]


_LABEL_VALUES = re.compile(r"^label_values\((?P<series>.+),\s*(?P<label>\w+)\)$")


def fill(text: str, values: dict[str, list[str]]) -> str:
    """Grafana's interpolation for a Prometheus data source: multi values as a regex alternation."""
    text = text.replace("$__rate_interval", "1m").replace("$__interval", "15s")
    for name in sorted(values, key=len, reverse=True):
        chosen = values[name]
        text = text.replace("$" + name, chosen[0] if len(chosen) == 1 else "(" + "|".join(map(re.escape, chosen)) + ")")
    return text


def label_values(backend: VictoriaMetrics, query: str) -> list[str]:
    match = _LABEL_VALUES.match(query)
    assert match, f"not a label_values() query: {query}"
    url = (f"{backend.url}/api/v1/label/{match['label']}/values?"
           + urllib.parse.urlencode({"match[]": match["series"]}))
    return sorted(json.loads(http_get(url))["data"])


def resolve_variables(backend: VictoriaMetrics, board: dict[str, Any], first_only: bool,
                      problems: list[str]) -> dict[str, list[str]]:
    """Every query variable's values in order (each may use the ones before); "All" = its allValue otherwise."""
    values: dict[str, list[str]] = {}
    for variable in query_variables(board):
        query = fill(variable["query"], values)
        listed = label_values(backend, query)
        if not listed:
            problems.append(f"{board['uid']}: variable {variable['name']} lists no values: {query}")
        values[variable["name"]] = listed[:1] if first_only else [variable["allValue"]]
    return values


@pytest.fixture
def fed_backend(victoria_metrics: VictoriaMetrics) -> Iterator[VictoriaMetrics]:
    """VictoriaMetrics holding a few seconds of the fake node's metrics, as the gateway Collector forwards them."""
    gateway = Gateway(victoria_metrics.otlp_metrics_url, "prod", PODS)
    config = AgentConfig(otlp=OTLPConfig(metrics_endpoint=gateway.otlp_metrics_url, protocol="http/protobuf"),
                         metrics=MetricsConfig(export_interval_s=0.5), output=OutputConfig(files="off", console="off"))
    pipeline = MetricsPipeline(config, Resource({"service.name": "otel-gpu", "host.name": "node-a",
                                                 "k8s.node.name": "node-a"}))
    node = FakeNode()
    register_gpu_instruments(pipeline.meter("otel_gpu.gpu"), node)
    register_gpu_time_instruments(pipeline.meter(CUDA_METER), node)
    record_agent_health()
    try:
        deadline = time.monotonic() + 30
        while gateway.forwarded < 6 and time.monotonic() < deadline:  # enough points for rate() over 1m
            time.sleep(0.25)
        assert gateway.forwarded >= 6, "the agent did not export through the gateway stand-in"
        yield victoria_metrics
    finally:
        pipeline.shutdown()
        gateway.close()
        selfmetrics.reset()


def _empty_queries(backend: VictoriaMetrics, first_only: bool) -> list[str]:
    empty: list[str] = []
    for board in (build() for build in dashboards.DASHBOARDS.values()):
        values = resolve_variables(backend, board, first_only, empty)
        for panel in panels(board):
            for target in panel.get("targets", []):
                if target["datasource"]["type"] != "prometheus":
                    continue
                expr = fill(target["expr"], values)
                if not backend.query(expr):
                    empty.append(f"{board['uid']} / {panel['title']}: {expr}")
    return empty


@pytest.mark.backend
@pytest.mark.parametrize("first_only", [False, True], ids=["all-values", "first-value"])
def test_every_panel_query_returns_data(fed_backend: VictoriaMetrics, first_only: bool) -> None:
    assert len(prometheus_queries()) >= 40
    deadline = time.monotonic() + 30
    while True:  # freshly ingested samples become searchable a moment after their series
        empty = _empty_queries(fed_backend, first_only)
        if not empty or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert not empty, "queries without data:\n" + "\n".join(empty)


@pytest.mark.backend
def test_variables_list_the_fake_node(fed_backend: VictoriaMetrics) -> None:
    board = dashboards.workloads()
    every = {v["name"]: [".*"] for v in query_variables(board)}
    listed = {v["name"]: label_values(fed_backend, fill(v["query"], every)) for v in query_variables(board)}
    assert listed == {"cluster": ["prod"], "node": ["node-a"], "gpu": [g.uuid for g in GPUS],
                      "namespace": ["ml", "serving"], "pod": ["server-7d9f-x2", "trainer-0"]}


@pytest.mark.backend
def test_idle_but_allocated_finds_the_idle_gpu(fed_backend: VictoriaMetrics) -> None:
    values = {"cluster": [".*"], "node": [".*"], "gpu": [".*"]}
    expr = fill(f"max by (hw_id) ({dashboards.IDLE_ALLOCATED})", values)
    settle(lambda: [r["metric"]["hw_id"] for r in fed_backend.query(expr)], [GPUS[0].uuid])


def pyroscope_type_id(kind: profile_model.ProfileType) -> str:
    """Pyroscope's name for an OTLP profile of this type (tests/profiles/pyroscope_rules.py, on the model)."""
    key = f"{kind.sample_type}:{kind.sample_unit}:{kind.period_type}:{kind.period_unit}"
    if key == "samples:count:cpu:nanoseconds":
        return "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
    return f"{kind.period_type}:{key}"


def test_flame_graphs_show_the_profile_types_the_agent_sends() -> None:
    emitted = {pyroscope_type_id(kind) for kind in (profile_model.cpu_profile_type(19),
                                                     profile_model.gpu_time_profile_type(),
                                                     profile_model.sync_wait_profile_type())}
    shown = []
    for board in (build() for build in dashboards.DASHBOARDS.values()):
        for panel in panels(board):
            if panel["type"] == "flamegraph":
                assert panel["datasource"]["type"] == "grafana-pyroscope-datasource"
                shown += [t["profileTypeId"] for t in panel["targets"]]
    assert sorted(shown) == sorted(emitted)


def test_flame_graphs_follow_every_filter_but_the_gpu() -> None:
    """The flame graphs narrow with the board's cluster, node, namespace and pod choices (profiles carry those
    labels: collector-config/README.md), and never by GPU, which a CPU or sync-wait profile does not have."""
    board = dashboards.workloads()
    filters = {v["name"] for v in query_variables(board)} - {"gpu"}
    for panel in panels(board):
        if panel["type"] == "flamegraph":
            selector = panel["targets"][0]["labelSelector"]
            assert set(re.findall(r"\$(\w+)", selector)) == filters, selector


def test_committed_json_is_what_the_generator_builds(tmp_path: Path) -> None:
    assert dashboards.main(["--out", str(tmp_path)]) == 0
    committed = REPO / "helm" / "otel-gpu" / "dashboards"
    built = {p.name: p.read_text() for p in tmp_path.iterdir()}
    assert built == {p.name: p.read_text() for p in committed.glob("*.json")}
    assert dashboards.main(["--check"]) == 0


# emitted but on no panel: the memory panels show usage against the limit instead
NOT_ON_A_PANEL = {semconv.GPU_MEMORY_UTILIZATION}


def test_dashboards_use_only_metrics_the_agent_emits() -> None:
    """Every name a query uses is one the agent emits, and every metric the agent emits is on some panel."""
    specs = (*semconv.GPU_METRICS, *semconv.NVLINK_METRICS, *semconv.GPU_TIME_METRICS, *semconv.SELF_METRICS)
    known = {semconv.prometheus_name(spec) for spec in specs}
    used = set()
    shown = set()
    for _, _, expr in prometheus_queries():
        used |= set(re.findall(r"\b([a-z][a-z0-9_]*)\{", expr))
        for pattern in re.findall(r'__name__=~"([^"]+)"', expr):
            matched = {name for name in known if re.fullmatch(pattern, name)}
            assert matched, pattern
            used.add(pattern)
            shown |= matched
    assert len(used) >= 25
    names = {name for name in used if "(" not in name}
    assert names <= known, sorted(names - known)
    shown |= names
    missing = known - shown - {semconv.prometheus_name(spec) for spec in NOT_ON_A_PANEL}
    assert not missing, f"emitted but on no panel: {sorted(missing)}"


def test_every_panel_has_an_id_of_its_own() -> None:
    for board in (build() for build in dashboards.DASHBOARDS.values()):
        ids = [panel.get("id") for panel in panels(board)]
        assert all(isinstance(i, int) and i > 0 for i in ids), (board["uid"], ids)
        assert len(set(ids)) == len(ids), (board["uid"], ids)


def test_every_variable_is_present() -> None:
    for board in (build() for build in dashboards.DASHBOARDS.values()):
        names = {v["name"] for v in board["templating"]["list"]}
        assert {"datasource", "cluster", "node"} <= names, board["uid"]
    workloads = {v["name"] for v in dashboards.workloads()["templating"]["list"]}
    assert {"pyroscope", "gpu", "namespace", "pod"} <= workloads


# SPDX-License-Identifier: Apache-2.0
"""The Grafana dashboards against a real Prometheus scraping the agent's ``--prometheus-port`` endpoint.

The same fake 2-GPU node as test_dashboards.py feeds the agent's instruments; a real Prometheus (Debian's package,
scripts/fetch-backends.sh) scrapes the endpoint with the relabelings of the chart's PodMonitor (rendered by helm
with ``clusterName``), so the series carry what they would in a cluster: the node as ``host_name`` and the cluster
as ``k8s_cluster_name``. Every query of every panel, with its variables filled in, must return data.

What differs from OTLP ingestion through the gateway Collector: the scrape carries the resource only in
``target_info``, and nothing adds pod and namespace names to the per-process series (they carry ``k8s_pod_uid``),
so the namespace and pod variables list nothing and stay at "All" (``.*``, which matches series without the label).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml
from opentelemetry.sdk.resources import Resource

from otel_gpu import selfmetrics
from otel_gpu.config import AgentConfig, MetricsConfig, OutputConfig
from otel_gpu.cuda.instruments import METER_NAME as CUDA_METER
from otel_gpu.cuda.instruments import register_gpu_time_instruments
from otel_gpu.metrics.gpu_instruments import register_gpu_instruments
from otel_gpu.metrics.pipeline import MetricsPipeline
from tests.backends import Prometheus, free_port, prometheus_factory, settle, wait_until
from tests.dashboards.test_dashboards import (
    GPUS,
    PROCESSES,
    FakeNode,
    dashboards,
    fill,
    label_values,
    panels,
    prometheus_queries,
    query_variables,
    record_agent_health,
)
from tests.deploy.test_chart import HELM, by_kind, render

__all__ = ["prometheus_factory"]  # fixture used below

# what the scrape cannot give without the agent's Kubernetes lookup: names of the pods that hold GPU memory
UNLISTED_WITHOUT_POD_NAMES = {"namespace", "pod"}


def pod_monitor_relabelings(cluster: str) -> list[dict[str, Any]]:
    """The chart's PodMonitor relabelings, in Prometheus' own spelling (relabel_configs)."""
    if not HELM.exists():
        pytest.fail(f"{HELM} is missing: run 'make test-deps' (scripts/fetch-helm.sh) first", pytrace=False)
    (monitor,) = by_kind(render(["metrics.prometheusPort=9464", "metrics.podMonitor.enabled=true",
                                 f"clusterName={cluster}"]), "PodMonitor")
    spelling = {"sourceLabels": "source_labels", "targetLabel": "target_label", "replacement": "replacement",
                "action": "action", "regex": "regex", "separator": "separator"}
    return [{spelling[key]: value for key, value in rule.items()}
            for rule in monitor["spec"]["podMetricsEndpoints"][0]["relabelings"]]


def scrape_like_the_pod_monitor(server: Prometheus, target: str, node: str, cluster: str) -> None:
    """Rewrite ``server``'s configuration: ``target`` as the pod the PodMonitor would find on ``node``."""
    config = yaml.safe_load(server.config_path.read_text())
    config["scrape_configs"] = [{
        "job_name": "otel-gpu",
        # the meta label Kubernetes service discovery sets for a pod, here set by hand for the static target
        "static_configs": [{"targets": [target], "labels": {"__meta_kubernetes_pod_node_name": node}}],
        "relabel_configs": pod_monitor_relabelings(cluster),
    }]
    server.config_path.write_text(yaml.safe_dump(config))


@pytest.fixture
def scraped(prometheus_factory: Callable[[list[str]], Prometheus]) -> Iterator[Prometheus]:
    """A Prometheus holding a few seconds of the fake node's metrics, scraped from the agent's endpoint."""
    port = free_port()
    config = AgentConfig(metrics=MetricsConfig(export_interval_s=60, prometheus_port=port,
                                               prometheus_host="127.0.0.1"),
                         output=OutputConfig(files="off", console="off"))
    pipeline = MetricsPipeline(config, Resource({"service.name": "otel-gpu", "host.name": "node-a",
                                                 "k8s.node.name": "node-a"}))
    node = FakeNode()
    register_gpu_instruments(pipeline.meter("otel_gpu.gpu"), node)
    register_gpu_time_instruments(pipeline.meter(CUDA_METER), node)
    record_agent_health()
    try:
        server = prometheus_factory([])
        server.stop()
        scrape_like_the_pod_monitor(server, f"127.0.0.1:{port}", node="node-a", cluster="prod")
        server.start()
        wait_until(server.targets_up, 60, "Prometheus scraping the agent")
        # enough scrapes (1 s apart) for rate() and increase() over the 1m that $__rate_interval stands for here
        wait_until(lambda: len(server.query("count_over_time(hw_gpu_memory_limit_bytes[1m])")) == 2 and all(
            float(r["value"][1]) >= 6 for r in server.query("count_over_time(hw_gpu_memory_limit_bytes[1m])")),
            60, "six scrapes")
        yield server
    finally:
        pipeline.shutdown()
        selfmetrics.reset()


def resolve(server: Prometheus, board: dict[str, Any], first_only: bool) -> tuple[dict[str, list[str]], set[str]]:
    """Variable values as Grafana would choose them, and the names of the variables that listed nothing (those
    stay at "All": the dashboards' default, and the only option Grafana offers then)."""
    values: dict[str, list[str]] = {}
    unlisted = set()
    for variable in query_variables(board):
        listed = label_values(server, fill(variable["query"], values))  # type: ignore[arg-type]
        if not listed:
            unlisted.add(variable["name"])
        values[variable["name"]] = listed[:1] if first_only and listed else [variable["allValue"]]
    return values, unlisted


@pytest.mark.backend
@pytest.mark.parametrize("first_only", [False, True], ids=["all-values", "first-value"])
def test_every_panel_query_returns_data_from_prometheus(scraped: Prometheus, first_only: bool) -> None:
    assert len(prometheus_queries()) >= 40
    empty: list[str] = []
    for board in (build() for build in dashboards.DASHBOARDS.values()):
        values, unlisted = resolve(scraped, board, first_only)
        names = {v["name"] for v in query_variables(board)}
        assert unlisted == UNLISTED_WITHOUT_POD_NAMES & names, f"{board['uid']}: {sorted(unlisted)} list nothing"
        for panel in panels(board):
            for target in panel.get("targets", []):
                if target["datasource"]["type"] == "prometheus":
                    expr = fill(target["expr"], values)
                    if not scraped.query(expr):
                        empty.append(f"{board['uid']} / {panel['title']}: {expr}")
    assert not empty, "queries without data from Prometheus:\n" + "\n".join(empty)


@pytest.mark.backend
def test_prometheus_lists_the_fake_node_in_the_variables(scraped: Prometheus) -> None:
    board = dashboards.gpu()
    every = {v["name"]: [".*"] for v in query_variables(board)}
    listed = {v["name"]: label_values(scraped, fill(v["query"], every))  # type: ignore[arg-type]
              for v in query_variables(board)}
    assert listed == {"cluster": ["prod"], "node": ["node-a"], "gpu": [g.uuid for g in GPUS]}


@pytest.mark.backend
def test_prometheus_finds_the_idle_but_allocated_gpu(scraped: Prometheus) -> None:
    expr = fill(f"max by (hw_id) ({dashboards.IDLE_ALLOCATED})", {"cluster": [".*"], "node": [".*"], "gpu": [".*"]})
    settle(lambda: [r["metric"]["hw_id"] for r in scraped.query(expr)], [GPUS[0].uuid])


@pytest.mark.backend
def test_gpu_state_reads_the_scrape_name(scraped: Prometheus) -> None:
    """hw.status (an up-down counter of unit 1) is hw_status when scraped, hw_status_ratio in VictoriaMetrics:
    the dashboards' state panels match both."""
    names = scraped.series_names()
    assert "hw_status" in names and "hw_status_ratio" not in names
    states = fill(f"sum by (hw_state) ({{{dashboards.STATUS}, {dashboards.GPU}}})",
                  {"cluster": ["prod"], "node": ["node-a"], "gpu": [".*"]})
    assert {r["metric"]["hw_state"]: float(r["value"][1]) for r in scraped.query(states)} == {"ok": 2.0,
                                                                                              "failed": 0.0}


@pytest.mark.backend
def test_scraped_processes_are_told_apart_by_pod_uid(scraped: Prometheus) -> None:
    """Without pod names on scraped series, the GPU dashboard's process table still names each process's pod."""
    (expr,) = [target["expr"] for panel in panels(dashboards.gpu()) if panel["title"] == "Processes on the GPU"
               for target in panel["targets"]]
    rows = scraped.query(fill(expr, {"cluster": [".*"], "node": [".*"], "gpu": [".*"]}))
    assert {(r["metric"]["process_pid"], r["metric"].get("k8s_pod_uid")) for r in rows} == {
        (str(usage.pid), usage.pod_uid) for usage in PROCESSES.values()}

# SPDX-License-Identifier: Apache-2.0
"""collector-config/*.yaml against the Collector-contrib v0.159.0 component table (components.py here).

No Collector with the OTLP receiver can be had here, so these checks stand in for ``otelcol-contrib validate``:
every component type exists and supports the pipeline's signal, every key is one the component's config struct
decodes, the values the components validate are allowed, pipelines only name defined components, profiles
pipelines come with the feature gate, and each file states the versions it needs.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.collector_config import components as c
from tests.conftest import REPO

CONFIGS = sorted((REPO / "collector-config").glob("*.yaml"))
KINDS = {"receivers": c.RECEIVERS, "processors": c.PROCESSORS, "exporters": c.EXPORTERS, "extensions": c.EXTENSIONS}


def schema_problems(value: Any, schema: Any, where: str) -> list[str]:
    """Keys of ``value`` that ``schema`` does not know, recursively."""
    if schema is c.LEAF:
        if isinstance(value, dict) or (isinstance(value, list) and any(isinstance(v, dict) for v in value)):
            return [f"{where}: a mapping where the component takes a value"]
        return []
    if schema == c.ANY_MAP:
        return [] if isinstance(value, dict) else [f"{where}: not a mapping"]
    if isinstance(schema, list):
        if not isinstance(value, list):
            return [f"{where}: not a list"]
        return [p for i, item in enumerate(value) for p in schema_problems(item, schema[0], f"{where}[{i}]")]
    if value is None:
        return []
    if not isinstance(value, dict):
        return [f"{where}: not a mapping"]
    out = []
    for key, sub in value.items():
        if key not in schema:
            out.append(f"{where}.{key}: unknown key (known: {', '.join(sorted(schema))})")
        else:
            out.extend(schema_problems(sub, schema[key], f"{where}.{key}"))
    return out


def value_problems(kind: str, name: str, config: dict[str, Any]) -> list[str]:
    """Values the components' Validate() would refuse."""
    out = []
    config = config or {}
    type_ = name.split("/", maxsplit=1)[0] if kind == "processors" else ""
    if type_ == "k8sattributes":
        for field in config.get("extract", {}).get("metadata", []):
            if field not in c.K8S_METADATA:
                out.append(f"{name}: extract.metadata {field!r} is not supported")
        for rule in config.get("pod_association", []):
            for source in rule.get("sources", []):
                if source.get("from") not in c.K8S_ASSOCIATION_FROM:
                    out.append(f"{name}: pod_association from {source.get('from')!r}")
    if type_ == "resource":
        out += [f"{name}: action {a.get('action')!r}" for a in config.get("attributes", [])
                if str(a.get("action")).lower() not in c.RESOURCE_ACTIONS]
    if type_ == "transform":
        if config.get("error_mode", "propagate") not in c.ERROR_MODES:
            out.append(f"{name}: error_mode {config['error_mode']!r}")
        for group in config.get("metric_statements", []):
            if isinstance(group, dict) and group.get("context") not in c.TRANSFORM_CONTEXTS:
                out.append(f"{name}: metric_statements context {group.get('context')!r}")
    return out


def check(document: dict[str, Any]) -> list[str]:
    problems = []
    for kind, table in KINDS.items():
        for name, config in (document.get(kind) or {}).items():
            type_ = name.split("/")[0]
            if type_ not in table:
                problems.append(f"{kind}.{name}: no {kind[:-1]} {type_!r} in Collector-contrib {c.COLLECTOR_VERSION}")
                continue
            problems += schema_problems(config, table[type_].schema, f"{kind}.{name}")
            problems += value_problems(kind, name, config)
    service = document.get("service", {})
    for name in service.get("extensions", []):
        if name not in (document.get("extensions") or {}):
            problems.append(f"service.extensions: {name} is not defined")
    for pipeline_name, pipeline in service.get("pipelines", {}).items():
        signal = pipeline_name.split("/")[0]
        if signal not in c.SIGNALS:
            problems.append(f"service.pipelines.{pipeline_name}: unknown signal")
            continue
        for kind in ("receivers", "processors", "exporters"):
            for name in pipeline.get(kind, []):
                type_ = name.split("/")[0]
                if name not in (document.get(kind) or {}):
                    problems.append(f"service.pipelines.{pipeline_name}: {kind[:-1]} {name} is not defined")
                elif type_ in KINDS[kind] and signal not in KINDS[kind][type_].signals:
                    problems.append(f"service.pipelines.{pipeline_name}: {name} does not support {signal}")
        if pipeline.get("processors") and pipeline["processors"][0].split("/")[0] != "memory_limiter":
            problems.append(f"service.pipelines.{pipeline_name}: memory_limiter must come first")
    return problems


def test_there_are_configs() -> None:
    assert CONFIGS, "collector-config/ has no YAML file"


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_components_and_keys_exist_in_the_stated_release(path: Path) -> None:
    document = yaml.safe_load(path.read_text())
    assert check(document) == []


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_each_file_states_its_versions_and_feature_gate(path: Path) -> None:
    text = path.read_text()
    header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
    assert f"Collector-contrib {c.COLLECTOR_VERSION}" in header
    assert re.search(r"Pyroscope >= \d+\.\d+", header)
    document = yaml.safe_load(text)
    if any(name.split("/")[0] == "profiles" for name in document["service"]["pipelines"]):
        assert f"--feature-gates={c.PROFILES_FEATURE_GATE}" in header
    assert "Not run here" in header


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_exporter_retries_and_queues(path: Path) -> None:
    document = yaml.safe_load(path.read_text())
    for name, config in document["exporters"].items():
        assert config["retry_on_failure"]["enabled"] is True, name
        assert config["sending_queue"]["enabled"] is True, name


def test_k8sattributes_looks_pods_up_by_the_ids_the_agent_sends() -> None:
    """The agent puts k8s.pod.uid / container.id on per-process data points (metrics) and on each process's
    resource (profiles); k8sattributes only reads resource attributes, so the metrics pipeline must lift them first."""
    from otel_gpu import semconv

    document = yaml.safe_load((REPO / "collector-config" / "otel-gpu-to-lgtm.yaml").read_text())
    association = document["processors"]["k8sattributes"]["pod_association"]
    names = [s["name"] for rule in association for s in rule["sources"] if s["from"] == "resource_attribute"]
    assert set(names) == {semconv.K8S_POD_UID, semconv.CONTAINER_ID}
    metrics = document["service"]["pipelines"]["metrics"]["processors"]
    lift = next(name for name in metrics if name.startswith("groupbyattrs"))
    assert set(document["processors"][lift]["keys"]) == {semconv.K8S_POD_UID, semconv.CONTAINER_ID}
    assert metrics.index(lift) < metrics.index("k8sattributes")


def test_every_pipeline_gets_the_cluster_name_without_overriding_the_agents() -> None:
    """The dashboards filter metrics and flame graphs by k8s_cluster_name: both pipelines add it, and only where the
    agent sent none (the chart's clusterName must win over the Collector's default)."""
    document = yaml.safe_load((REPO / "collector-config" / "otel-gpu-to-lgtm.yaml").read_text())
    for signal in ("metrics", "profiles"):
        actions = [action for name in document["service"]["pipelines"][signal]["processors"]
                   if name.split("/")[0] == "resource"
                   for action in document["processors"][name]["attributes"] if action["key"] == "k8s.cluster.name"]
        assert actions, f"the {signal} pipeline adds no k8s.cluster.name"
        assert {action["action"] for action in actions} == {"insert"}, (signal, actions)


def test_the_check_finds_a_typo() -> None:
    document = yaml.safe_load((REPO / "collector-config" / "otel-gpu-to-lgtm.yaml").read_text())
    document["processors"]["memory_limiter"]["limit_percent"] = 80
    document["exporters"]["otlp_http/mimir"]["sending_queue"]["queue_sise"] = 10
    document["processors"]["k8sattributes"]["extract"]["metadata"].append("k8s.pod.label")
    document["service"]["pipelines"]["profiles"]["processors"].append("batch")
    problems = "\n".join(check(document))
    for expected in ("limit_percent", "queue_sise", "k8s.pod.label", "batch does not support profiles"):
        assert expected in problems

# SPDX-License-Identifier: Apache-2.0
"""The real agent in a subprocess with GPU metrics only, loading the fake libnvidia-ml.so.1 through the library
path, while GPU 1 is lost mid-run and an XID arrives: it keeps running and exits cleanly."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from otel_gpu import semconv
from tests.conftest import REPO, agent_command
from tests.gpu.conftest import FAKE_NVML_DIR, UUIDS, build_fake_nvml


def test_agent_keeps_running_through_a_lost_gpu_and_an_xid(tmp_path: Path, sleepers) -> None:
    build_fake_nvml()
    (proc,) = sleepers(1)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "FAKE_NVML_"))}
    env.update({
        "LD_LIBRARY_PATH": str(FAKE_NVML_DIR),
        "FAKE_NVML_PROCESSES": f"{proc.pid}@0:{1 << 30}:50",
        "FAKE_NVML_LOST": "1@1.5",
        "FAKE_NVML_XID": "1:79@1.0",
    })
    output = tmp_path / "out"
    result = subprocess.run(
        agent_command("run", "--duration", "4", "--no-cpu-profiling", "--no-gpu-time-profiling",
                      "--metric-export-interval", "0.5",
                      "--output-dir", str(output), "--local-files", "on", "--console", "off"),
        check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    log = result.stderr
    assert "gpu metrics on" in log
    assert log.count("is lost") == 1 and "GPU 1" in log
    assert log.count("XID 79 on GPU 1") == 1
    assert "Traceback" not in log
    exported = "\n".join(p.read_text() for p in output.rglob("*.jsonl"))  # OTLP JSON lines
    for name in (semconv.GPU_UTILIZATION.name, semconv.GPU_STATUS.name, semconv.GPU_PROCESS_MEMORY_USAGE.name):
        assert name in exported
    assert UUIDS[0] in exported and UUIDS[1] in exported
    last_export = json.loads((output / "metrics.jsonl").read_text().strip().splitlines()[-1])
    status = {(attrs[semconv.HW_ID], attrs[semconv.HW_STATE]): int(point["asInt"])
              for point, attrs in data_points(last_export, semconv.GPU_STATUS.name)}
    assert status == {(UUIDS[0], "ok"): 1, (UUIDS[0], "failed"): 0, (UUIDS[1], "ok"): 0, (UUIDS[1], "failed"): 1}


def data_points(export: dict[str, Any], name: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(data point, attributes as a plain dict) of metric ``name`` in one OTLP JSON export."""
    out = []
    for resource_metrics in export["resourceMetrics"]:
        for scope_metrics in resource_metrics["scopeMetrics"]:
            for metric in scope_metrics["metrics"]:
                if metric["name"] != name:
                    continue
                body = metric.get("sum") or metric.get("gauge") or {}
                for point in body.get("dataPoints", []):
                    attrs = {a["key"]: next(iter(a["value"].values())) for a in point.get("attributes", [])}
                    out.append((point, attrs))
    return out

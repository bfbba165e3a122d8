# SPDX-License-Identifier: Apache-2.0
"""End to end, the embedded default: no backend configured, metrics go to OTLP JSON lines and a terminal table."""

from __future__ import annotations

import subprocess
from pathlib import Path

from otel_gpu import semconv
from otel_gpu.metrics.files import decode_otlp_json
from tests.e2e.agent import GIB, GPU_UUIDS, AgentProcess, build_fake_nvml, sleepers

__all__ = ["sleepers"]  # fixture used below


def _points(request, name: str) -> list:  # type: ignore[no-untyped-def, type-arg]
    return [p for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics if m.name == name
            for p in getattr(m, m.WhichOneof("data")).data_points]


def _attribute(point, key: str) -> str | int | None:  # type: ignore[no-untyped-def]
    for attribute in point.attributes:
        if attribute.key == key:
            return attribute.value.string_value or attribute.value.int_value
    return None


def test_local_default_writes_otlp_json_lines_and_prints_the_table(
        tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]) -> None:
    build_fake_nvml()
    first, _ = sleepers
    agent = AgentProcess(tmp_path, ["--duration", "4", "--metric-export-interval", "1", "--output-dir", "out"],
                         fake_nvml={"PROCESSES": f"{first.pid}@1:{3 * GIB}:20"})
    code = agent.wait(timeout_s=60)
    assert code == 0, agent.stderr()

    lines = (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) >= 2
    request = decode_otlp_json(lines[-1])
    used = {_attribute(p, semconv.HW_ID): p.as_int for p in _points(request, semconv.GPU_MEMORY_USAGE.name)}
    assert used == {GPU_UUIDS[0]: 16 * GIB, GPU_UUIDS[1]: 32 * GIB}
    utilization = {_attribute(p, semconv.HW_ID): p.as_double for p in _points(request, semconv.GPU_UTILIZATION.name)
                   if _attribute(p, semconv.HW_GPU_TASK) in ("general", None)}
    assert utilization == {GPU_UUIDS[0]: 0.4, GPU_UUIDS[1]: 0.7}
    process = [(_attribute(p, semconv.PROCESS_PID), _attribute(p, semconv.PROCESS_EXECUTABLE_NAME), p.as_int)
               for p in _points(request, semconv.GPU_PROCESS_MEMORY_USAGE.name)]
    assert process == [(first.pid, "sleep", 3 * GIB)]
    resource = {a.key: a.value.string_value for a in request.resource_metrics[0].resource.attributes}
    assert resource[semconv.SERVICE_NAME] == "otel-gpu" and resource[semconv.HOST_NAME]

    # stdout is a file here, so the table comes as plain blocks (no cursor movement)
    out = agent.stdout()
    assert "\x1b[" not in out
    table = out.strip().split("\n\n")[-1].splitlines()
    assert "2 GPUs" in table[0]
    rows = [line for line in table if line[:2] in ("0 ", "1 ")]
    assert len(rows) == 2 and all("NVIDIA H200" in row for row in rows)
    assert "40%" in rows[0] and "16.0/140.4" in rows[0] and "300/700" in rows[0] and "50C" in rows[0]
    assert "70%" in rows[1] and "32.0/140.4" in rows[1] and "400/700" in rows[1] and "60C" in rows[1]
    assert f"{first.pid} sleep 3.0 GiB SM 20%" in out


def test_no_nvml_keeps_the_agent_running_with_one_clear_line(tmp_path: Path) -> None:
    build_fake_nvml()
    agent = AgentProcess(tmp_path, ["--duration", "3", "--metric-export-interval", "1", "--output-dir", "out"],
                         fake_nvml={"INIT_ERROR": "9"})  # NVML_ERROR_DRIVER_NOT_LOADED
    code = agent.wait(timeout_s=60)
    assert code == 0, agent.stderr()
    off = [line for line in agent.stderr().splitlines() if "GPU metrics are off" in line]
    assert len(off) == 1, agent.stderr()
    assert "GPU metrics are off (the log says why)" in agent.stdout()
    assert (tmp_path / "out" / "metrics.jsonl").exists()


def test_a_gpu_lost_mid_run_reports_failed_and_the_other_carries_on(tmp_path: Path) -> None:
    build_fake_nvml()
    agent = AgentProcess(tmp_path, ["--duration", "7", "--metric-export-interval", "1", "--output-dir", "out"],
                         fake_nvml={"LOST": "1@3"})  # GPU 1 answers GPU_IS_LOST from 3 s after nvmlInit
    assert agent.wait(timeout_s=60) == 0, agent.stderr()
    last = decode_otlp_json((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()[-1])
    status = {(_attribute(p, semconv.HW_ID), _attribute(p, semconv.HW_STATE)): p.as_int
              for p in _points(last, semconv.GPU_STATUS.name)}
    assert status[(GPU_UUIDS[0], "ok")] == 1 and status[(GPU_UUIDS[1], "failed")] == 1
    assert status[(GPU_UUIDS[1], "ok")] == 0
    # GPU 0 still reports its readings, and the table still shows it
    used = {_attribute(p, semconv.HW_ID): p.as_int for p in _points(last, semconv.GPU_MEMORY_USAGE.name)}
    assert used.get(GPU_UUIDS[0]) == 16 * GIB
    table = agent.stdout().strip().split("\n\n")[-1]
    assert any(line.startswith("0 ") and "40%" in line for line in table.splitlines())
    assert any(line.startswith("1 ") and line.endswith("FAILED") for line in table.splitlines()), table

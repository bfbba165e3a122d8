# SPDX-License-Identifier: Apache-2.0
"""End to end through the command line: `otel-gpu run` (GPU-time profiling only) profiles a workload injected with
the real library on the fake CUDA driver and fake CUPTI, writes gpu_time and sync_wait pprof files, and
``go tool pprof`` reads them back: kernels as leaves under the functions that launched them, in the schedule's 4:1
ratio of matmul to relu time, and the blocking waits under the function that waited. In the same run: both profiles
over OTLP gRPC under Pyroscope's names, and the per-process counters in the local metrics file agree with them.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.e2e.agent import run_profiling_agent
from tests.exporters.receivers import GrpcProfilesReceiver
from tests.gotool import needs_go, pprof_top
from tests.profiles import pprof_proto
from tests.profiles.pyroscope_rules import profile_type_ids

LIBRARY = REPO / "otel_gpu" / "cuda" / "native" / "libotel_gpu_inject.so"
FAKES = REPO / "tests" / "native" / "cuda"
AGENT_SECONDS = 5


@pytest.fixture(scope="module")
def agent_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    missing = [str(p) for p in (LIBRARY, FAKES / "workload", FAKES / "libcupti.so") if not p.exists()]
    if missing:
        pytest.fail(f"not built: {', '.join(missing)} (run make build)")
    out_dir = tmp_path_factory.mktemp("gpu-time-e2e")
    env = dict(os.environ, CUDA_INJECTION64_PATH=str(LIBRARY), OTEL_GPU_CUPTI_PATH=str(FAKES / "libcupti.so"),
               OTEL_GPU_OVERHEAD_BUDGET="0.05",
               OTEL_GPU_DEBUG_GRAPH_PROBE_EVERY_MS="10")  # the workload's graphs: launch rate looked at 5 times first
    receiver = GrpcProfilesReceiver().start()
    # 3000 steps take about 8 s: the agent attaches while it runs and stops before it ends
    workload = subprocess.Popen([str(FAKES / "workload"), "--steps", "3000"], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
    time.sleep(0.3)  # the library is loaded at the workload's cuInit, right at its start
    agent = run_profiling_agent(workload, receiver, "--duration", str(AGENT_SECONDS), "--no-gpu-metrics",
                                "--no-cpu-profiling", "--pid", str(workload.pid), "--output-dir", str(out_dir),
                                "--local-files", "on", "--console", "on", "--profiling-interval", "2")
    return {"out_dir": out_dir, "agent": agent, "pid": workload.pid, "requests": list(receiver.requests)}


@pytest.mark.root
@pytest.mark.backend
@needs_go
def test_go_tool_pprof_reads_kernels_under_their_launching_functions(agent_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    files = _profile_files(Path(agent_run["out_dir"]), "gpu_time")
    _, top = pprof_top(files, tmp_path, f"-tagfocus=pid={agent_run['pid']}")
    matmul, relu = top["matmul_kernel"][0], top["relu_kernel"][0]
    assert matmul > 0 and relu > 0, top
    assert matmul / relu == pytest.approx(4.0, rel=0.15)  # the schedule's ratio, re-weighted from sampled windows
    # each kernel's time is inside its launching function's cumulative time, and train_step holds both
    assert top["launch_matmul"][1] >= matmul * 0.999 and top["launch_relu"][1] >= relu * 0.999, top
    assert top["train_step"][1] >= (matmul + relu) * 0.999, top
    assert "matmul_kernel" in agent_run["agent"].stdout  # the terminal summary names the kernel


@pytest.mark.root
@pytest.mark.backend
@needs_go
def test_go_tool_pprof_reads_waits_under_the_waiting_function(agent_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    files = _profile_files(Path(agent_run["out_dir"]), "sync_wait")
    _, top = pprof_top(files, tmp_path)
    waited = top["[cuStreamSynchronize]"][0]
    assert waited > 0, top
    assert top["sync_point"][1] >= waited * 0.999, top


def _profile_files(out_dir: Path, kind: str) -> list[Path]:
    """The agent's local pprof files of one profile type; there is at least one."""
    files = sorted(out_dir.glob(f"profile-{kind}-*.pb.gz"))
    assert files, sorted(p.name for p in out_dir.iterdir())
    return files


def _file_total_ns(files: list[Path]) -> int:
    total = 0
    for path in files:
        profile = pprof_proto.decode(path.read_bytes())
        total += sum(sample.value[0] for sample in profile.sample)
    return total


def _last_counter(out_dir: Path, name: str, pid: int) -> float:
    """The last value of a per-process counter in the local OTLP JSON lines file."""
    value = None
    text = (out_dir / "metrics.jsonl").read_text()
    for line in text.splitlines():
        for rm in json.loads(line)["resourceMetrics"]:
            for sm in rm["scopeMetrics"]:
                for metric in sm["metrics"]:
                    if metric["name"] != name:
                        continue
                    for point in metric["sum"]["dataPoints"]:
                        attributes = {a["key"]: a["value"] for a in point["attributes"]}
                        if int(attributes["process.pid"]["intValue"]) == pid:
                            value = float(point.get("asDouble", point.get("asInt", 0)))
    assert value is not None, f"no {name} for pid {pid}"
    return value


@pytest.mark.root
def test_otlp_and_metrics_carry_the_same_gpu_time(agent_run) -> None:  # type: ignore[no-untyped-def]
    types = {t for request in agent_run["requests"] for t in profile_type_ids(request)}
    assert {"gpu:gpu_time:nanoseconds:gpu:nanoseconds", "gpu_wait:sync_wait:nanoseconds:gpu_wait:nanoseconds"} <= types
    out_dir, pid = Path(agent_run["out_dir"]), agent_run["pid"]
    gpu_ns = _file_total_ns(_profile_files(out_dir, "gpu_time"))
    wait_ns = _file_total_ns(_profile_files(out_dir, "sync_wait"))
    assert gpu_ns > 0 and wait_ns > 0
    # the counters and the profiles come from the same re-weighted records (rounding apart)
    assert _last_counter(out_dir, "nvidia.gpu.process.kernel.time", pid) * 1e9 == pytest.approx(gpu_ns, rel=0.01)
    assert _last_counter(out_dir, "nvidia.gpu.process.sync_wait.time", pid) * 1e9 == pytest.approx(wait_ns, rel=0.01)
    assert _last_counter(out_dir, "nvidia.gpu.process.kernel.launches", pid) > 0
    # the seconds its windows covered: some, and at most the library's largest fraction (20 %) of the agent's run
    sampled = _last_counter(out_dir, "otel_gpu.gpu_time.sampled", pid)
    assert 0 < sampled <= 0.2 * AGENT_SECONDS, sampled

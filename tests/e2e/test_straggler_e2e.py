# SPDX-License-Identifier: Apache-2.0
"""End to end through the command line: `otel-gpu run` (GPU-time profiling, local files and the terminal) while a
3-rank job on the fake CUDA driver runs with rank 1 slowed: the terminal summary and ``summary.txt`` name rank 1 as
the straggler, and the sync_wait files label each rank and the waits in the all-reduce."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from otel_gpu.exporters.files import SUMMARY
from tests.conftest import REPO, agent_command
from tests.profiles import pprof_proto

LIBRARY = REPO / "otel_gpu" / "cuda" / "native" / "libotel_gpu_inject.so"
FAKES = REPO / "tests" / "native" / "cuda"


def _labels(profile, sample) -> dict[str, object]:  # type: ignore[no-untyped-def]
    strings = profile.string_table
    return {strings[label.key]: strings[label.str] if label.str else label.num for label in sample.label}


@pytest.mark.root
def test_the_agent_names_the_straggler_on_the_terminal_and_in_the_summary_file(tmp_path: Path) -> None:
    missing = [str(p) for p in (LIBRARY, FAKES / "ranks", FAKES / "libcupti.so") if not p.exists()]
    if missing:
        pytest.fail(f"not built: {', '.join(missing)} (run make build)")
    out = tmp_path / "out"
    agent = subprocess.Popen(
        agent_command("run", "--duration", "9", "--no-gpu-metrics", "--no-cpu-profiling", "--process-name", "ranks",
                      "--output-dir", str(out), "--local-files", "on", "--console", "on",
                      "--profiling-interval", "2"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(2.5)  # the agent attaches to the packaged library at open: the ranks are seen from their start
        env = dict(os.environ, CUDA_INJECTION64_PATH=str(LIBRARY), OTEL_GPU_CUPTI_PATH=str(FAKES / "libcupti.so"),
                   OTEL_GPU_OVERHEAD_BUDGET="0.05")
        job = subprocess.run([str(FAKES / "ranks"), "--ranks", "3", "--slow-rank", "1", "--slow-us", "8000",
                              "--steps", "400"], env=env, capture_output=True, text=True, timeout=120)
        assert job.returncode == 0, job.stderr
        stdout, stderr = agent.communicate(timeout=60)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    assert agent.returncode == 0, stderr[-3000:]
    pids = dict(re.findall(r"^rank (\d+) pid (\d+)", job.stdout, re.M))
    insights = [line for line in stdout.splitlines() if line.startswith("insight:")]
    assert insights, stdout[-3000:]
    named = f"insight: straggler rank 1 (pid {pids['1']}): ranks 0, 2 waited"
    assert all(line.startswith(named) for line in insights), insights  # every interval of the job names rank 1
    assert all(" in all_reduce at sync_point <- train_step <- run_rank, " in line for line in insights), insights
    summary = (out / SUMMARY).read_text().splitlines()
    assert len(summary) == len(insights) and all(s.endswith(i) for s, i in zip(summary, insights, strict=True))

    in_all_reduce: dict[str, int] = {}
    for path in sorted(out.glob("profile-sync_wait-*.pb.gz")):
        profile = pprof_proto.decode(path.read_bytes())
        for sample in profile.sample:
            labels = _labels(profile, sample)
            assert str(labels["rank"]) in pids and pids[str(labels["rank"])] == str(labels["pid"])
            if labels.get("nccl.collective") == "all_reduce":
                in_all_reduce[str(labels["rank"])] = in_all_reduce.get(str(labels["rank"]), 0) + sample.value[0]
    for fast in ("0", "2"):  # the fast ranks wait in the all-reduce, the straggler hardly
        assert in_all_reduce.get(fast, 0) > 5 * in_all_reduce.get("1", 0), in_all_reduce

# SPDX-License-Identifier: Apache-2.0
"""Agent wiring that has no other home: GPU-time profiles obey the same process filters as CPU profiles."""

from __future__ import annotations

from otel_gpu.agent import Agent
from otel_gpu.config import AgentConfig, ProfilingConfig
from otel_gpu.procfs import ProcessInfo
from otel_gpu.profiles.model import Frame, ProcessProfile, ProfileBatch, Sample, gpu_time_profile_type


def _batch() -> ProfileBatch:
    processes = (
        ProcessProfile(ProcessInfo(pid=10, executable_name="python3", container_id="abc123"),
                       (Sample(frames=(Frame("matmul_kernel"),), value=5),)),
        ProcessProfile(ProcessInfo(pid=11, executable_name="trainer", container_id="def456"),
                       (Sample(frames=(Frame("relu_kernel"),), value=7),)),
    )
    return ProfileBatch(type=gpu_time_profile_type(), start_unix_nano=1, duration_nano=2, processes=processes)


def _kept(**profiling: object) -> list[int]:
    agent = Agent(AgentConfig(profiling=ProfilingConfig(**profiling)))  # type: ignore[arg-type]
    return [p.process.pid for p in agent._keep_selected(_batch()).processes]


def test_gpu_time_batches_obey_pid_name_and_container_filters() -> None:
    assert _kept() == [10, 11]
    assert _kept(pids=(11,)) == [11]
    assert _kept(process_name="^pyth") == [10]
    assert _kept(container_id="def") == [11]
    assert _kept(pids=(10,), container_id="def") == []

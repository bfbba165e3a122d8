# SPDX-License-Identifier: Apache-2.0
"""The multi-GPU machine's DDP check (scripts/h200/ddp.py), checked before device time is spent on it: it loads without
torch, its child program compiles and has the functions the report names, bad settings exit 2 naming the variable,
and its bookkeeping is right: per-rank totals from the agent's batches, the straggler, the report's table, NVLink
bytes against nvidia-smi's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from otel_gpu import semconv
from otel_gpu.gpu.model import GPUInfo, GPUSnapshot, NVLinkReading
from otel_gpu.procfs import ProcessInfo
from otel_gpu.profiles.model import (Frame, FrameKind, ProcessProfile, ProfileBatch, Sample, gpu_time_profile_type,
                                     sync_wait_profile_type)
from tests import h200_scripts

SCRIPT = h200_scripts.SCRIPTS / "ddp.py"


@pytest.fixture(scope="module")
def ddp() -> ModuleType:
    return h200_scripts.load("ddp")


def test_the_child_program_compiles_and_slows_one_rank(ddp: ModuleType) -> None:
    code = compile(ddp.CHILD, "program.py", "exec")
    functions = {c.co_name for c in code.co_consts if hasattr(c, "co_name")}
    assert {"load_batch", "forward", "backward", "sync_point", "train_step", "main"} <= functions
    assert "DistributedDataParallel" in ddp.CHILD and "DDP_SLOW_RANK" in ddp.CHILD
    run_sh = (h200_scripts.SCRIPTS / "run.sh").read_text()
    assert 'scripts/h200/ddp.py "$OUT/h200-ddp.md"' in run_sh


@pytest.mark.parametrize(("env", "message"), [
    ({"DDP_GPUS": "1"}, "DDP_GPUS must be a number >= 2, not '1'"),
    ({"DDP_GPUS": "two"}, "DDP_GPUS must be a number >= 2, not 'two'"),
    ({"DDP_SLOW_RANK": "2"}, "DDP_SLOW_RANK must be below DDP_GPUS (2), not 2"),
    ({"DDP_SLOW_MS": "-1"}, "DDP_SLOW_MS must be a number >= 0"),
    ({"DDP_STEPS": "0"}, "DDP_STEPS must be a number >= 1"),
])
def test_bad_settings_exit_2_before_anything_runs(tmp_path: Path, env: dict[str, str], message: str) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "r.md")], capture_output=True, text=True,
                          timeout=60, check=False, env=dict(os.environ, **env))
    assert done.returncode == 2 and message in done.stdout, done.stdout + done.stderr
    assert not (tmp_path / "r.md").exists()


def _sample(value: int, device: int, collective: str | None = None) -> Sample:
    attributes: tuple[tuple[str, str | int], ...] = ((semconv.CUDA_DEVICE, device), (semconv.CUDA_STREAM, 7))
    if collective:
        attributes += ((semconv.NCCL_COLLECTIVE, collective),)
    frames = (Frame("ncclDevKernel_AllReduce_Sum_bf16_RING_LL" if collective else "gemm", FrameKind.CUDA),
              Frame("backward", FrameKind.PYTHON, filename="/tmp/program.py", line=27))
    return Sample(frames, value, attributes=attributes)


def _batch(kind: str, processes: dict[int, list[Sample]]) -> ProfileBatch:
    profile_type = gpu_time_profile_type() if kind == "gpu" else sync_wait_profile_type()
    return ProfileBatch(profile_type, 0, 10**9, tuple(
        ProcessProfile(ProcessInfo(pid=pid, executable_name="python3",
                                   ranks=((semconv.DISTRIBUTED_RANK, pid - 100),)), tuple(samples))
        for pid, samples in processes.items()))


def test_the_reference_wait_in_collectives_is_the_overlap_with_nccl_kernels(ddp: ModuleType) -> None:
    import ast

    [function] = [node for node in ast.parse(ddp.CHILD).body
                  if isinstance(node, ast.FunctionDef) and node.name == "overlap_us"]
    scope: dict[str, object] = {}
    exec(compile(ast.Module([function], []), "program.py", "exec"), scope)
    overlap = scope["overlap_us"]
    assert overlap([(0, 10)], [(2, 4), (3, 6), (8, 20)]) == 6  # 2-6 (two kernels at once counted once), 8-10
    assert overlap([(0, 10), (30, 40)], [(5, 35)]) == 10
    assert overlap([(0, 10)], []) == 0


def test_per_rank_totals_and_the_straggler(ddp: ModuleType) -> None:
    gpu = _batch("gpu", {100: [_sample(50, 0), _sample(30, 0, "all_reduce")],
                         101: [_sample(50, 1), _sample(2, 1, "all_reduce")],
                         999: [_sample(1000, 0, "all_reduce")]})  # another process on the node: left out
    wait = (Frame("[cuStreamSynchronize]", FrameKind.CUDA),)
    in_all_reduce = ((semconv.NCCL_COLLECTIVE, "all_reduce"),)
    waits = _batch("wait", {100: [Sample(wait, 10), Sample(wait, 30, attributes=in_all_reduce)],
                            101: [Sample(wait, 3), Sample(wait, 1, attributes=in_all_reduce)]})
    totals = ddp.summarize(gpu, waits, {100: 0, 101: 1})
    assert set(totals) == {0, 1}
    assert (totals[0].gpu_ns, totals[0].nccl_ns, totals[0].sync_ns, totals[0].devices) == (80, 30, 40, {0})
    assert (totals[1].gpu_ns, totals[1].nccl_ns, totals[1].sync_ns, totals[1].devices) == (52, 2, 4, {1})
    assert (totals[0].sync_nccl_ns, totals[1].sync_nccl_ns) == (30, 1)
    assert (totals[0].ranks, totals[1].ranks) == ({0}, {1})
    assert totals[0].collectives == {"all_reduce": 30}
    assert totals[0].nccl_stacks == {"backward (program.py:27)": 30}
    assert ddp.straggler({r: t.sync_ns for r, t in totals.items()}) == 1

    s = ddp.Settings(gpus=2, slow_rank=1, slow_ms=20.0, steps=8, profile_steps=4)
    reference = {0: {"gpu_ns": 40, "nccl_ns": 16, "sync_ns": 20, "sync_nccl_ns": 15, "steps": 4},
                 1: {"gpu_ns": 26, "nccl_ns": 1, "sync_ns": 2, "sync_nccl_ns": 1, "steps": 4}}
    plain = {0: {"step_s": 0.010}, 1: {"step_s": 0.010}}
    measured = {0: {"steps": 8, "warmup": 2, "device": 0, "step_s": 0.011},
                1: {"steps": 8, "warmup": 2, "device": 1, "step_s": 0.0105}}
    lines = ddp.report(s, reference, plain, measured, totals, "insight: straggler rank 1 (pid 101): ...")
    table = "\n".join(lines)
    assert "| 0 | [0] (expected [0]) | 0.00 / 0.00 (0.800) |" in table  # 80 ns / 10 steps against 40 ns / 4 steps
    assert "straggler by sync_wait: rank 1; by NCCL time: rank 1; by waits in collectives: rank 1 (expected 1)" in table
    assert "| 0.00 / 0.00 (0.800) | 10.00 / 11.00" in table  # rank 0's waits in collectives: 30 / 10 against 15 / 4
    assert "the agent's insight (expected to name rank 1): insight: straggler rank 1 (pid 101)" in table
    assert "every process labelled with its own distributed.rank: True" in table
    assert "every rank's kernels on its own device only: True" in table
    assert "| 10.00 / 11.00 (0.100) |" in table  # rank 0's step time plain / injected (cost)


SMI_NVLINK = """GPU 0: NVIDIA H200 (UUID: GPU-00000000-fa4e-4c1d-9a6b-000000000000)
\t Link 0: Data Tx: 1000 KiB
\t Link 0: Data Rx: 2000 KiB
\t Link 1: Data Tx: 10 KiB
\t Link 1: Data Rx: 20 KiB
GPU 1: NVIDIA H200 (UUID: GPU-00000000-fa4e-4c1d-9a6b-000000000001)
\t Link 0: Data Tx: 5 KiB
\t Link 0: Data Rx: 7 KiB
"""


def test_nvlink_bytes_against_nvidia_smi(ddp: ModuleType) -> None:
    assert ddp.smi_nvlink_bytes(SMI_NVLINK) == {0: (1010 * 1024, 2020 * 1024), 1: (5 * 1024, 7 * 1024)}
    assert ddp.smi_nvlink_bytes("NVML: Unable to find NVLink\n") == {}

    def snapshot(index: int, sent: int, links: int = 2) -> GPUSnapshot:
        info = GPUInfo(index=index, uuid=f"GPU-{index}", name="NVIDIA H200", pci_bus_id="")
        return GPUSnapshot(info=info, time_s=0.0, nvlinks=tuple(
            NVLinkReading(n, transmit_bytes=sent, receive_bytes=2 * sent) for n in range(links)))

    before = ddp.nvml_nvlink_bytes([snapshot(0, 0), snapshot(1, 0, links=0)])
    after = ddp.nvml_nvlink_bytes([snapshot(0, 505 * 1024), snapshot(1, 0, links=0)])
    assert after == {0: (1010 * 1024, 2020 * 1024), 1: (0, 0)}
    table = "\n".join(ddp.nvlink_section(before, after, {}, ddp.smi_nvlink_bytes(SMI_NVLINK)))
    assert "| 0 | 1.0 / 1.0 MB (1.000) | 2.1 / 2.1 MB (1.000) |" in table
    assert "no NVLink readings" not in table
    assert "no NVLink readings" in "\n".join(ddp.nvlink_section({}, {0: (0, 0)}, {}, {}))


def test_the_agent_cpu_line(ddp: ModuleType) -> None:
    assert ddp.agent_cpu_line(0.5, 50.0) == ("- agent CPU (GPUTimeSource + NVML source, drain included): 0.50 s over "
                                             "50.0 s (1.00 % of a core)")
    assert ddp.agent_cpu_line(0.0, 0.0).endswith("(n/a)")

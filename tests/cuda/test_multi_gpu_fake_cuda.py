# SPDX-License-Identifier: Apache-2.0
"""Multi-GPU jobs on the fake CUDA driver and fake CUPTI (root tests: root + BTF), through the real injected library,
the real eBPF program and GPUTimeSource: per-device attribution in a process per device and in one process driving
several, NCCL kernels named as collectives at the stack (C or Python line) that launched them, and the straggler rank
seen in the others' waits; and NCCL kernel names (a pure test).

The job (tests/native/cuda/ranks.c): every rank launches a 2 ms kernel, then an all-reduce that completes only once
every rank has launched it, then waits for its stream; one rank sleeps before each step. The others reach the
all-reduce first, so per step their all-reduce kernel spins and their wait lasts about the slow rank's extra time
longer than the slow rank's own.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from otel_gpu import semconv
from otel_gpu.cuda.source import GPUTimeSource
from otel_gpu.profiles.model import FrameKind, ProfileBatch, Sample

REPO = Path(__file__).resolve().parents[2]
LIBRARY = REPO / "otel_gpu" / "cuda" / "native" / "libotel_gpu_inject.so"
FAKES = REPO / "tests" / "native" / "cuda"
ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
RENDEZVOUS_BYTES = 65536 * 8 * 8  # fake_cuda.c: MAX_COLLECTIVES x MAX_RANKS launch times
SLOW_US = 8000  # per step on the slow rank, against 2.3 ms of GPU work per step: the others wait ~4x longer


def _run(args: list[str], python_ranks: int = 0, slow_ms: float = 0) -> tuple[str, list[ProfileBatch]]:
    """The ranks job with ``args``, or ``python_ranks`` ranks of workload.py's ddp variant (rank 1 slowed by
    ``slow_ms`` a step) meeting in a rendezvous file made here, while a GPUTimeSource runs: (stdout, batches)."""
    needed = (LIBRARY, FAKES / "libcupti.so", FAKES / "libcuda.so.1", FAKES / "ranks")
    missing = [str(p) for p in needed if not p.exists()]
    if missing:
        pytest.fail(f"not built: {', '.join(missing)} (run make build)")
    env = dict(os.environ, CUDA_INJECTION64_PATH=str(LIBRARY), OTEL_GPU_CUPTI_PATH=str(FAKES / "libcupti.so"),
               OTEL_GPU_OVERHEAD_BUDGET="0.05")
    meeting = Path(f"/dev/shm/otel-gpu-test-nccl-{os.getpid()}")
    source = GPUTimeSource(rescan_interval_s=0.05, full_rescan_s=0.05)
    source.open()
    try:
        if not python_ranks:
            job = subprocess.run([str(FAKES / "ranks"), *args], env=env, capture_output=True, text=True, timeout=120)
            assert job.returncode == 0, job.stderr
            out = job.stdout
        else:
            meeting.write_bytes(bytes(RENDEZVOUS_BYTES))
            ranks = [subprocess.Popen(
                [sys.executable, str(FAKES / "workload.py"), str(FAKES / "libcuda.so.1"), "--variant", "ddp", *args,
                 "--slow-ms", str(slow_ms if rank == 1 else 0)],
                env=dict(env, FAKE_CUDA_RENDEZVOUS=str(meeting), FAKE_CUDA_RANKS=str(python_ranks),
                         FAKE_CUDA_RANK=str(rank), FAKE_CUDA_DEVICES=str(python_ranks), RANK=str(rank),
                         LOCAL_RANK=str(rank), WORLD_SIZE=str(python_ranks)),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(python_ranks)]
            outputs = [rank.communicate(timeout=120) for rank in ranks]
            assert all(rank.returncode == 0 for rank in ranks), [err for _, err in outputs]
            out = "".join(stdout for stdout, _ in outputs)
        time.sleep(0.3)
        batches = source.drain()
        assert source.decode_errors == 0
    finally:
        source.close()
        meeting.unlink(missing_ok=True)
    return out, batches


def _samples(batch: ProfileBatch, pid: int) -> list[Sample]:
    return [s for p in batch.processes if p.process.pid == pid for s in p.samples]


def _functions(sample: Sample) -> list[str]:
    return [f.function for f in sample.frames]


@pytest.mark.root
def test_straggler_rank_stands_out_in_the_others_waits() -> None:
    out, (gpu, waits) = _run(["--ranks", "3", "--slow-rank", "1", "--slow-us", str(SLOW_US), "--steps", "400"])
    ranks = {int(r): int(pid) for r, pid in re.findall(r"^rank (\d+) pid (\d+)", out, re.M)}
    assert sorted(ranks) == [0, 1, 2]
    assert sorted(re.findall(r"^collectives (\d+) (\d+)", out, re.M)) == [("0", "400"), ("1", "400"), ("2", "400")]

    wait_ns: dict[int, int] = {}
    in_collective_ns: dict[int, int] = {}
    collective_ns: dict[int, int] = {}
    for rank, pid in ranks.items():
        kernels = _samples(gpu, pid)
        assert kernels, f"no gpu_time of rank {rank}"
        # per-device attribution: rank r drives device r only
        assert {dict(s.attributes)[semconv.CUDA_DEVICE] for s in kernels} == {rank}
        by_leaf: Counter[str] = Counter()
        for sample in kernels:
            by_leaf[sample.frames[0].function] += sample.value
            attributes = dict(sample.attributes)
            if sample.frames[0].function == ALL_REDUCE:
                assert attributes.get(semconv.NCCL_COLLECTIVE) == "all_reduce"
                assert {"launch_collective", "all_reduce", "train_step", "run_rank"} <= set(_functions(sample))
            else:
                assert semconv.NCCL_COLLECTIVE not in attributes
                assert "launch_matmul" in _functions(sample)
        assert by_leaf[ALL_REDUCE] > 0 and by_leaf["matmul_kernel"] > 0
        collective_ns[rank] = by_leaf[ALL_REDUCE]
        syncs = [s for s in _samples(waits, pid) if s.frames[0].function == "[cuStreamSynchronize]"]
        assert syncs and all("sync_point" in _functions(s) for s in syncs)
        wait_ns[rank] = sum(s.value for s in syncs)
        in_collective_ns[rank] = sum(s.value for s in syncs
                                     if dict(s.attributes).get(semconv.NCCL_COLLECTIVE) == "all_reduce")
        assert {dict(s.attributes).get(semconv.NCCL_COLLECTIVE) for s in syncs} <= {"all_reduce", None}
        # the rank identity its launcher set (RANK, LOCAL_RANK, WORLD_SIZE), on both profiles
        for batch in (gpu, waits):
            [profile] = [p for p in batch.processes if p.process.pid == pid]
            assert dict(profile.process.ranks) == {semconv.DISTRIBUTED_RANK: rank, semconv.DISTRIBUTED_LOCAL_RANK: rank,
                                                   semconv.DISTRIBUTED_WORLD_SIZE: 3}
    # the fast ranks wait ~(8 + 2.3) ms a step, the slow one ~2.3 ms: a 4.5x ratio, asserted at 2.5x
    for fast in (0, 2):
        assert wait_ns[fast] > 2.5 * wait_ns[1], wait_ns
        assert collective_ns[fast] > 5 * collective_ns[1], collective_ns  # ~8.3 ms against 0.3 ms a step
    print(f"\nper rank: sync_wait ns {wait_ns}, in all-reduce {in_collective_ns}, all-reduce GPU ns {collective_ns}")
    assert min(wait_ns, key=wait_ns.__getitem__) == 1  # the straggler is the rank that waits least
    # the fast ranks wait in the all-reduce (~8.3 of ~10.3 ms a step), the straggler hardly (~0.3 of ~2.3 ms)
    for fast in (0, 2):
        assert in_collective_ns[fast] > 0.5 * wait_ns[fast], (in_collective_ns, wait_ns)
        assert in_collective_ns[fast] > 5 * in_collective_ns[1], in_collective_ns
    assert in_collective_ns[1] < 0.35 * wait_ns[1], (in_collective_ns, wait_ns)


@pytest.mark.root
def test_python_ranks_name_the_line_that_issued_the_collective() -> None:
    source_lines = (FAKES / "workload.py").read_text().splitlines()
    launch_line = 1 + source_lines.index("    driver.launch(driver.all_reduce)")
    out, (gpu, waits) = _run(["--steps", "300"], python_ranks=2, slow_ms=SLOW_US / 1000)
    ranks = {int(r): int(pid) for r, pid in re.findall(r"^rank (\d+) pid (\d+)", out, re.M)}
    assert sorted(ranks) == [0, 1]
    wait_ns: dict[int, int] = {}
    for rank, pid in ranks.items():
        collectives = [s for s in _samples(gpu, pid) if s.frames[0].function == ALL_REDUCE]
        assert collectives, f"no all-reduce of rank {rank}"
        for sample in collectives:
            attributes = dict(sample.attributes)
            assert attributes[semconv.NCCL_COLLECTIVE] == "all_reduce" and attributes[semconv.CUDA_DEVICE] == rank
            python = [f for f in sample.frames if f.kind == FrameKind.PYTHON]
            assert [f.function for f in python][:5] == ["Driver.call", "Driver.launch", "all_reduce", "ddp_step",
                                                        "main"], python
            assert python[2].filename.endswith("workload.py") and python[2].line == launch_line  # the issuing line
        assert all(dict(s.attributes)[semconv.CUDA_DEVICE] == rank for s in _samples(gpu, pid))
        wait_ns[rank] = sum(s.value for s in _samples(waits, pid) if s.frames[0].function == "[cuStreamSynchronize]")
    assert wait_ns[0] > 2 * wait_ns[1], wait_ns  # rank 1 is the straggler rank 0 waits for
    from otel_gpu.profiles.insights import find_straggler

    straggler = find_straggler(waits)
    assert straggler is not None and straggler.rank == 1 and straggler.collective == "all_reduce"
    sync_line = 1 + source_lines.index('    driver.call("cuStreamSynchronize", driver.stream)')
    step_line = 1 + source_lines.index("def ddp_step(driver: Driver, slow_s: float) -> None:") + 4
    assert straggler.site.endswith(f"<- sync_point (workload.py:{sync_line}) <- ddp_step (workload.py:{step_line})"), \
        straggler.site  # the step's line where the others waited


@pytest.mark.root
def test_one_process_driving_several_devices() -> None:
    out, (gpu, waits) = _run(["--devices", "4", "--steps", "1500"])
    pids = {int(pid) for pid in re.findall(r"^device \d+ pid (\d+)", out, re.M)}
    assert len(pids) == 1
    samples = _samples(gpu, pids.pop())
    devices: Counter[int] = Counter()
    for sample in samples:
        leaf = sample.frames[0].function
        match = re.fullmatch(r"shard(\d)_kernel", leaf)
        assert match, leaf
        device = dict(sample.attributes)[semconv.CUDA_DEVICE]
        assert device == int(match.group(1)), (leaf, device)
        assert "launch_shard" in _functions(sample)
        devices[int(device)] += sample.value
    assert sorted(devices) == [0, 1, 2, 3]
    # each device ran the same work: equal shares up to the sampling error
    assert max(devices.values()) < 1.5 * min(devices.values()), devices


@pytest.mark.parametrize(("name", "collective"), [
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "all_reduce"),
    ("_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LL24ncclDevKernelArgsStorageILm4096EE", "all_reduce"),
    ("ncclDevKernel_AllGather_RING_LL", "all_gather"),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_SIMPLE", "reduce_scatter"),
    ("ncclDevKernel_Broadcast_RING_LL", "broadcast"),
    ("ncclDevKernel_Reduce_Sum_f16_RING_LL", "reduce"),
    ("ncclDevKernel_SendRecv", "send_recv"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float", "all_reduce"),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", "send_recv"),
    ("ncclDevKernel_Generic", "other"),  # runs whichever collective it is handed
    ("_Z23ncclDevKernel_Generic_424ncclDevKernelArgsStorageILm4096EE", "other"),
    ("ncclDevKernel_ReduceX", "other"),
    ("my_nccl_like_kernel", None),
    ("matmul_kernel", None),
    ("_Z6matmulPfS_S_i", None),
])
def test_nccl_kernel_names(name: str, collective: str | None) -> None:
    from otel_gpu.cuda import builder
    from tests.cuda.records import kernel

    assert builder.nccl_collective(name) == collective
    attributes = dict(builder.work_attributes(kernel(1, 1, 10, name=name, device=3)))
    assert attributes.get(semconv.NCCL_COLLECTIVE) == collective
    assert attributes[semconv.CUDA_DEVICE] == 3
    assert collective is None or collective in semconv.NCCL_COLLECTIVE_NAMES


@pytest.mark.root
@pytest.mark.parametrize(("ranks", "slow_rank"), [(2, 1), (2, None), (4, 2), (4, None)])
def test_the_straggler_insight_names_the_slowed_rank_and_none_otherwise(ranks: int, slow_rank: int | None,
                                                                        tmp_path: Path) -> None:
    import io

    from otel_gpu.exporters.console import ConsoleProfileExporter
    from otel_gpu.exporters.files import SUMMARY, FilesProfileExporter
    from otel_gpu.profiles.insights import find_straggler

    slow = ["--slow-rank", str(slow_rank), "--slow-us", str(SLOW_US)] if slow_rank is not None else []
    out, (gpu, waits) = _run(["--ranks", str(ranks), "--steps", "300", *slow])
    pids = {int(r): int(pid) for r, pid in re.findall(r"^rank (\d+) pid (\d+)", out, re.M)}
    assert sorted(pids) == list(range(ranks))
    terminal = io.StringIO()
    ConsoleProfileExporter(terminal).export(waits)
    assert FilesProfileExporter(str(tmp_path)).export(waits)
    insights = [line for line in terminal.getvalue().splitlines() if line.startswith("insight:")]
    found = find_straggler(waits)
    in_collectives = {rank: sum(s.value for s in _samples(waits, pid)
                                if dict(s.attributes).get(semconv.NCCL_COLLECTIVE)) for rank, pid in pids.items()}
    print(f"\n{ranks} ranks, slowed {slow_rank}: waits in collectives ns {in_collectives}, interval "
          f"{waits.duration_nano} ns; {insights}")  # docs/benchmarks.md
    if slow_rank is None:
        assert found is None and insights == [] and not (tmp_path / SUMMARY).exists()
        return
    assert found is not None and found.rank == slow_rank and found.pid == pids[slow_rank]
    assert found.collective == "all_reduce" and found.site.startswith("sync_point <- train_step")
    [line] = insights
    assert line.startswith(f"insight: straggler rank {slow_rank} (pid {pids[slow_rank]}):") and "all_reduce" in line
    assert (tmp_path / SUMMARY).read_text().splitlines()[0].endswith(line)

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Multi-GPU GPU time verified on a machine of several GPUs (issue 17): a torchrun DDP training job, one rank slowed
on purpose, measured by the agent's GPU-time source against torch.profiler.

    python3 scripts/h200/ddp.py OUT.md        (scripts/h200/run.sh step "ddp"; root, 2+ GPUs, torch with NCCL)

Settings (environment; a bad one exits 2 naming it, before anything runs): DDP_GPUS (ranks, one GPU each, default 2),
DDP_SLOW_RANK (default 1), DDP_SLOW_MS (host-side delay per step on the slow rank, default 20), DDP_STEPS (measured
steps, default 300), DDP_PROFILE_STEPS (steps under torch.profiler in the reference run, default 40).

Runs, each a fresh torchrun job of DDP_GPUS ranks training the same model (a stack of bf16 Linear layers, DDP
all-reducing the gradients in buckets during backward, torch.cuda.synchronize() at the end of every step):
1. reference: torch.profiler over DDP_PROFILE_STEPS steps after a warm-up; per rank, per step: GPU time of all
   kernels, of NCCL kernels, CPU time blocked in cuda*Synchronize, of that the part while an NCCL kernel ran (the
   union of their intervals), and the step time;
2. plain: no profiler, no injection: step times (the agent's cost is measured against these);
3. measured: under ``otel-gpu inject`` while a GPUTimeSource runs in this process: per rank (pid), per step, the
   gpu_time total, the NCCL part (samples with ``nccl.collective``), the sync_wait total and its part in collectives
   (sync_wait samples with ``nccl.collective``), the ``cuda.device`` values seen, the ``distributed.rank`` of each
   process, the collectives named and the stacks that launched them; step times with the agent attached.
Checks reported (not asserted): every rank's kernels carry its own device only, every process its own rank; NCCL
kernels are named as collectives; the slow rank has the least NCCL time, sync_wait and wait in collectives (the
others wait for it), and the straggler insight (otel_gpu/profiles/insights.py) names it; per-rank GPU time, NCCL time
and waits in collectives within 10 % of torch.profiler's per step; the agent's cost: step time and its own CPU;
NVLink data bytes the NVML source read per GPU over the measured run against ``nvidia-smi nvlink -gt d`` over the
same run (GPUs without NVLink: said so). Prints the table and writes it as markdown to OUT.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from otel_gpu import semconv  # noqa: E402 (after the repository is on sys.path)
from otel_gpu.profiles.insights import straggler_line  # noqa: E402
from otel_gpu.profiles.model import ProfileBatch  # noqa: E402

CHILD = r"""
import json, os, sys, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

MODE, OUT_DIR = sys.argv[1], sys.argv[2]
STEPS, PROFILE_STEPS = int(os.environ["DDP_STEPS"]), int(os.environ["DDP_PROFILE_STEPS"])
SLOW_RANK, SLOW_MS = int(os.environ["DDP_SLOW_RANK"]), float(os.environ["DDP_SLOW_MS"])
WARMUP = 20
SYNC_APIS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def overlap_us(waits, kernels):
    # microseconds of the waits during which any of the kernels ran (their union)
    union = []
    for start, end in sorted(kernels):
        if union and start <= union[-1][1]:
            union[-1][1] = max(union[-1][1], end)
        else:
            union.append([start, end])
    return sum(max(0, min(end, k_end) - max(start, k_start)) for start, end in waits for k_start, k_end in union)


def load_batch(rank, x):
    if rank == SLOW_RANK:
        time.sleep(SLOW_MS / 1000)  # the straggler: a slow data loader
    return x


def forward(model, x):
    return model(x).float().pow(2).mean()


def backward(loss):
    loss.backward()  # DDP all-reduces the gradient buckets from here


def sync_point():
    torch.cuda.synchronize()


def train_step(rank, model, optimizer, x):
    batch = load_batch(rank, x)
    loss = forward(model, batch)
    backward(loss)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    sync_point()


def main():
    dist.init_process_group("nccl")
    rank, local = dist.get_rank(), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    torch.manual_seed(0)
    layers = [torch.nn.Linear(4096, 4096, bias=False) for _ in range(8)]
    model = DistributedDataParallel(torch.nn.Sequential(*layers).cuda().to(torch.bfloat16), device_ids=[local])
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    for _ in range(WARMUP):
        train_step(rank, model, optimizer, x)
    result = {"rank": rank, "device": local, "pid": os.getpid(), "warmup": WARMUP}
    steps = PROFILE_STEPS if MODE == "reference" else STEPS
    times = []
    if MODE == "reference":
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                t = time.perf_counter()
                train_step(rank, model, optimizer, x)
                times.append(time.perf_counter() - t)
        gpu = nccl = sync = 0.0
        nccl_spans, sync_spans = [], []
        for e in prof.events():
            us = e.time_range.elapsed_us()
            if e.device_type == torch.autograd.DeviceType.CUDA:
                gpu += us
                if e.name.startswith("nccl"):
                    nccl += us
                    nccl_spans.append((e.time_range.start, e.time_range.end))
            elif e.name in SYNC_APIS:
                sync += us
                sync_spans.append((e.time_range.start, e.time_range.end))
        result.update(gpu_ns=gpu * 1e3, nccl_ns=nccl * 1e3, sync_ns=sync * 1e3,
                      sync_nccl_ns=overlap_us(sync_spans, nccl_spans) * 1e3)
    else:
        for _ in range(steps):
            t = time.perf_counter()
            train_step(rank, model, optimizer, x)
            times.append(time.perf_counter() - t)
    dist.barrier()
    result.update(steps=steps, step_s=sorted(times)[len(times) // 2])
    with open(os.path.join(OUT_DIR, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


main()
"""


@dataclasses.dataclass(frozen=True)
class Settings:
    gpus: int
    slow_rank: int
    slow_ms: float
    steps: int
    profile_steps: int


def settings(environ: Mapping[str, str]) -> Settings:
    """The run's settings; SystemExit(2) naming every bad one."""
    problems: list[str] = []

    def number(name: str, default: str, kind: type[int] | type[float], low: float) -> float:
        raw = environ.get(name, default)
        try:
            value = kind(raw)
        except ValueError:
            value = None
        if value is None or value < low:
            problems.append(f"{name} must be a number >= {low:g}, not {raw!r}")
            return low
        return value

    gpus = int(number("DDP_GPUS", "2", int, 2))
    slow_rank = int(number("DDP_SLOW_RANK", "1", int, 0))
    slow_ms = number("DDP_SLOW_MS", "20", float, 0)
    steps = int(number("DDP_STEPS", "300", int, 1))
    profile_steps = int(number("DDP_PROFILE_STEPS", "40", int, 1))
    if not problems and slow_rank >= gpus:
        problems.append(f"DDP_SLOW_RANK must be below DDP_GPUS ({gpus}), not {slow_rank}")
    if problems:
        for problem in problems:
            print(f"ddp: {problem}")
        raise SystemExit(2)
    return Settings(gpus, slow_rank, slow_ms, steps, profile_steps)


@dataclasses.dataclass
class RankTotals:
    """What the agent's profiles say about one rank (process), in ns over the whole run."""

    gpu_ns: int = 0
    nccl_ns: int = 0
    sync_ns: int = 0
    sync_nccl_ns: int = 0  # sync_wait while a collective ran (samples with nccl.collective)
    devices: set[int] = dataclasses.field(default_factory=set)
    ranks: set[int] = dataclasses.field(default_factory=set)  # distributed.rank of the process's profiles
    collectives: Counter[str] = dataclasses.field(default_factory=Counter)
    nccl_stacks: Counter[str] = dataclasses.field(default_factory=Counter)


def summarize(gpu_time: ProfileBatch, sync_wait: ProfileBatch, pids: Mapping[int, int]) -> dict[int, RankTotals]:
    """Per rank (``pids``: pid -> rank) totals of the gpu_time and sync_wait batches; other processes are left out."""
    totals = {rank: RankTotals() for rank in pids.values()}
    for profile in gpu_time.processes:
        rank = pids.get(profile.process.pid)
        if rank is None:
            continue
        totals[rank].ranks.update(v for k, v in profile.process.ranks if k == semconv.DISTRIBUTED_RANK)
        for sample in profile.samples:
            attributes = dict(sample.attributes)
            totals[rank].gpu_ns += sample.value
            if semconv.CUDA_DEVICE in attributes:
                totals[rank].devices.add(int(attributes[semconv.CUDA_DEVICE]))
            collective = attributes.get(semconv.NCCL_COLLECTIVE)
            if collective is not None:
                totals[rank].nccl_ns += sample.value
                totals[rank].collectives[str(collective)] += sample.value
                caller = next((f for f in sample.frames[1:] if f.filename), None)
                where = f"{caller.function} ({Path(caller.filename).name}:{caller.line})" if caller else "?"
                totals[rank].nccl_stacks[where] += sample.value
    for profile in sync_wait.processes:
        rank = pids.get(profile.process.pid)
        if rank is not None:
            totals[rank].ranks.update(v for k, v in profile.process.ranks if k == semconv.DISTRIBUTED_RANK)
            totals[rank].sync_ns += sum(s.value for s in profile.samples)
            totals[rank].sync_nccl_ns += sum(s.value for s in profile.samples
                                             if semconv.NCCL_COLLECTIVE in dict(s.attributes))
    return totals


def straggler(values: Mapping[int, float]) -> int:
    """The rank that waits least: the one the others wait for."""
    return min(values, key=values.__getitem__)


def torchrun(s: Settings, mode: str, out_dir: Path, inject: bool) -> dict[int, dict[str, float]]:
    """One job; each rank's result file, by rank."""
    program = out_dir / "program.py"
    program.write_text(CHILD)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={s.gpus}",
               str(program), mode, str(out_dir)]
    if inject:  # exactly what a user types: otel-gpu inject -- torchrun ...
        command = [sys.executable, "-m", "otel_gpu", "inject", "--", *command]
    env = dict(os.environ, DDP_STEPS=str(s.steps), DDP_PROFILE_STEPS=str(s.profile_steps),
               DDP_SLOW_RANK=str(s.slow_rank), DDP_SLOW_MS=f"{s.slow_ms:g}")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.pop("CUDA_INJECTION64_PATH", None)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=500, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{mode} run failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return {r: json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(s.gpus)}


_SMI_NVLINK = re.compile(r"^GPU (\d+):|Link (\d+): Data (Tx|Rx): (\d+) KiB", re.MULTILINE)


def smi_nvlink_bytes(text: str) -> dict[int, tuple[int, int]]:
    """{GPU index: (data bytes sent, received) summed over its links} from ``nvidia-smi nvlink -gt d``."""
    out: dict[int, tuple[int, int]] = {}
    gpu = -1
    for match in _SMI_NVLINK.finditer(text):
        if match.group(1) is not None:
            gpu = int(match.group(1))
            out[gpu] = (0, 0)
        elif gpu >= 0:
            tx, rx = out[gpu]
            kib = int(match.group(4)) * 1024
            out[gpu] = (tx + kib, rx) if match.group(3) == "Tx" else (tx, rx + kib)
    return out


def nvml_nvlink_bytes(snapshots: Iterable[Any]) -> dict[int, tuple[int, int]]:
    """{GPU index: (data bytes sent, received) summed over its links} from the NVML source's snapshots."""
    return {snapshot.info.index: (sum(link.transmit_bytes or 0 for link in snapshot.nvlinks),
                                  sum(link.receive_bytes or 0 for link in snapshot.nvlinks)) for snapshot in snapshots}


def nvlink_section(before: Mapping[int, tuple[int, int]], after: Mapping[int, tuple[int, int]],
                   smi_before: Mapping[int, tuple[int, int]], smi_after: Mapping[int, tuple[int, int]]) -> list[str]:
    """NVLink bytes moved during the measured run per GPU: the agent's NVML source against nvidia-smi."""
    lines = ["", "## NVLink data bytes over the measured run: NVML source vs nvidia-smi", "",
             "| GPU | sent agent / nvidia-smi | received agent / nvidia-smi |", "|---|---|---|"]
    for gpu in sorted(after):
        ours = [after[gpu][i] - before.get(gpu, (0, 0))[i] for i in (0, 1)]
        theirs = [smi_after.get(gpu, (0, 0))[i] - smi_before.get(gpu, (0, 0))[i] for i in (0, 1)]
        lines.append(f"| {gpu} | {ours[0] / 1e6:.1f} / {theirs[0] / 1e6:.1f} MB ({ratio(ours[0], theirs[0])}) | "
                     f"{ours[1] / 1e6:.1f} / {theirs[1] / 1e6:.1f} MB ({ratio(ours[1], theirs[1])}) |")
    if not any(any(v) for v in after.values()):
        lines.append("- no NVLink readings (GPUs without NVLink, or NVML does not offer them)")
    return lines


def smi_nvlink() -> dict[int, tuple[int, int]]:
    done = subprocess.run(["nvidia-smi", "nvlink", "-gt", "d"], capture_output=True, text=True, timeout=60,
                          check=False)
    return smi_nvlink_bytes(done.stdout)


def ratio(a: float, b: float) -> str:
    return f"{a / b:.3f}" if b else "n/a"


def agent_cpu_line(cpu_s: float, wall_s: float) -> str:
    """The agent's own CPU over the measured run (its GPU-time and NVML sources ran in this process)."""
    share = f"{100 * cpu_s / wall_s:.2f} % of a core" if wall_s > 0 else "n/a"
    return f"- agent CPU (GPUTimeSource + NVML source, drain included): {cpu_s:.2f} s over {wall_s:.1f} s ({share})"


def report(s: Settings, reference: Mapping[int, Mapping[str, float]], plain: Mapping[int, Mapping[str, float]],
           measured: Mapping[int, Mapping[str, float]], totals: Mapping[int, RankTotals],
           insight: str = "") -> list[str]:
    """The markdown lines of the results; ``insight``: the straggler line of the agent's sync_wait batch."""
    lines = [f"## DDP on {s.gpus} GPUs, rank {s.slow_rank} slowed by {s.slow_ms:g} ms a step", "",
             "| rank | device(s) seen | GPU ms/step agent / profiler | NCCL ms/step agent / profiler | "
             "sync_wait ms/step agent / profiler | of it in collectives agent / profiler | step ms plain / injected "
             "| collectives |",
             "|---|---|---|---|---|---|---|---|"]
    keys = ("gpu_ns", "nccl_ns", "sync_ns", "sync_nccl_ns")
    for rank in sorted(totals):
        t, ref, run = totals[rank], reference[rank], measured[rank]
        steps = run["steps"] + run["warmup"]  # the agent was attached from the job's start
        per = {k: getattr(t, k) / steps / 1e6 for k in keys}
        refs = {k: ref.get(k, 0.0) / ref["steps"] / 1e6 for k in keys}
        lines.append(
            f"| {rank} | {sorted(t.devices)} (expected [{int(run['device'])}]) | "
            f"{per['gpu_ns']:.2f} / {refs['gpu_ns']:.2f} ({ratio(per['gpu_ns'], refs['gpu_ns'])}) | "
            f"{per['nccl_ns']:.2f} / {refs['nccl_ns']:.2f} ({ratio(per['nccl_ns'], refs['nccl_ns'])}) | "
            f"{per['sync_ns']:.2f} / {refs['sync_ns']:.2f} | "
            f"{per['sync_nccl_ns']:.2f} / {refs['sync_nccl_ns']:.2f} "
            f"({ratio(per['sync_nccl_ns'], refs['sync_nccl_ns'])}) | "
            f"{plain[rank]['step_s'] * 1e3:.2f} / {run['step_s'] * 1e3:.2f} "
            f"({ratio(run['step_s'] - plain[rank]['step_s'], plain[rank]['step_s'])}) | "
            f"{dict(t.collectives)} |")
    waits = {rank: float(t.sync_ns) for rank, t in totals.items()}
    nccl = {rank: float(t.nccl_ns) for rank, t in totals.items()}
    in_collectives = {rank: float(t.sync_nccl_ns) for rank, t in totals.items()}
    devices_right = all(t.devices == {int(measured[r]["device"])} for r, t in totals.items())
    ranks_right = all(t.ranks == {r} for r, t in totals.items())
    lines += ["", f"- straggler by sync_wait: rank {straggler(waits)}; by NCCL time: rank {straggler(nccl)}; by "
              f"waits in collectives: rank {straggler(in_collectives)} (expected {s.slow_rank}); torch.profiler's "
              f"NCCL straggler: rank {straggler({r: v['nccl_ns'] for r, v in reference.items()})}",
              f"- the agent's insight (expected to name rank {s.slow_rank}): {insight or 'none'}",
              f"- every rank's kernels on its own device only: {devices_right}",
              f"- every process labelled with its own distributed.rank: {ranks_right}"]
    for rank in sorted(totals):
        top = ", ".join(f"{where}: {ns / 1e6:.1f} ms" for where, ns in totals[rank].nccl_stacks.most_common(3))
        lines.append(f"- rank {rank}: NCCL launched from {top or 'nothing'}")
    return lines


def main(argv: Iterable[str]) -> int:
    args = list(argv)
    s = settings(os.environ)
    if len(args) != 1:
        print("usage: ddp.py OUT.md")
        return 2
    from otel_gpu.config import GPUConfig
    from otel_gpu.cuda.source import GPUTimeSource
    from otel_gpu.gpu.source import NVMLSource
    from otel_gpu.procfs import ProcessResolver

    work = Path(tempfile.mkdtemp(prefix="otel-gpu-ddp-"))
    runs = {name: work / name for name in ("reference", "plain", "measured")}
    for path in runs.values():
        path.mkdir()
    print("reference (torch.profiler) ...", flush=True)
    reference = torchrun(s, "reference", runs["reference"], inject=False)
    print("plain ...", flush=True)
    plain = torchrun(s, "plain", runs["plain"], inject=False)
    print("measured (otel-gpu inject, GPUTimeSource attached) ...", flush=True)
    source = GPUTimeSource()
    source.open()
    nvml = NVMLSource(GPUConfig(), ProcessResolver(), interval_s=1.0)
    nvml.open()
    try:
        links_before, smi_before = nvml_nvlink_bytes(nvml.collect()), smi_nvlink()
        cpu0, wall0 = time.process_time(), time.monotonic()  # this process: the agent's sources (children apart)
        measured = torchrun(s, "measured", runs["measured"], inject=True)
        links_after, smi_after = nvml_nvlink_bytes(nvml.collect()), smi_nvlink()
        time.sleep(1.0)
        gpu_time, sync_wait = source.drain()
        cost = agent_cpu_line(time.process_time() - cpu0, time.monotonic() - wall0)
    finally:
        source.close()
        nvml.close()
    totals = summarize(gpu_time, sync_wait, {int(v["pid"]): rank for rank, v in measured.items()})
    lines = report(s, reference, plain, measured, totals, straggler_line(sync_wait)) + [cost]
    lines += nvlink_section(links_before, links_after, smi_before, smi_after)
    Path(args[0]).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

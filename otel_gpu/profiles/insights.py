# SPDX-License-Identifier: Apache-2.0
"""Insights: one line of text that says what a batch shows, for the terminal summary and the local summary file.

The straggler of a distributed job: the ranks (``distributed.rank``) that reach a collective first wait in it
(sync_wait samples labelled ``nccl.collective``) for the one that arrives last, which itself hardly waits there. A
rank is named the straggler when, over one interval,

- at least two ranks waited on the GPU,
- its time waiting in collectives is at most :data:`STRAGGLER_MAX_RATIO` of the median of the other ranks', and
- that median exceeds its own by at least :data:`STRAGGLER_MIN_EXCESS` of the interval,

so balanced ranks, whose waits differ by jitter and the CPUs they share, name none. Pure: batches in, text out.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from otel_gpu import semconv
from otel_gpu.profiles.model import Frame, FrameKind, ProfileBatch, Sample

STRAGGLER_MAX_RATIO = 0.5  # the straggler waits in collectives at most half as long as the others' median
# ... and the others' median is longer by at least a fifth of the interval: the job loses that much to it. Ranks
# that are balanced but share busy CPUs differ by a few percent (6.5 % of the interval seen on the fake 2-rank job
# with no rank slowed, on this machine's two loaded cores), a rank slowed on purpose by over half (docs/benchmarks.md)
STRAGGLER_MIN_EXCESS = 0.2
SITE_FRAMES = 3  # frames of the waiting stack named (Python frames if it has any)


@dataclass(frozen=True, slots=True)
class Straggler:
    """The rank the others waited for in collectives over one interval."""

    rank: int
    pid: int
    wait_ns: int  # its own time waiting in collectives
    others_median_ns: float  # the median of the other ranks'
    others: tuple[int, ...]  # the other ranks
    collective: str  # the collective the others waited in most
    site: str  # where they waited: the top frames of their largest such wait
    interval_ns: int


def find_straggler(waits: ProfileBatch) -> Straggler | None:
    """The straggler of ``waits`` (a sync_wait batch), None when no rank stands out (see the module's rules)."""
    if waits.type.sample_type != "sync_wait":
        return None
    per_rank: dict[int, tuple[int, int, list[Sample]]] = {}  # rank -> (pid, ns in collectives, those samples)
    for profile in waits.processes:
        rank = dict(profile.process.ranks).get(semconv.DISTRIBUTED_RANK)
        if rank is None or rank in per_rank:  # unranked, or a second job's rank of the same number: left out
            continue
        in_collectives = [s for s in profile.samples if dict(s.attributes).get(semconv.NCCL_COLLECTIVE)]
        per_rank[rank] = (profile.process.pid, sum(s.value for s in in_collectives), in_collectives)
    if len(per_rank) < 2:
        return None
    rank = min(per_rank, key=lambda r: (per_rank[r][1], r))
    pid, wait_ns, _ = per_rank[rank]
    others = sorted(r for r in per_rank if r != rank)
    median = statistics.median(per_rank[r][1] for r in others)
    if wait_ns > STRAGGLER_MAX_RATIO * median or median - wait_ns < STRAGGLER_MIN_EXCESS * waits.duration_nano:
        return None
    samples = [s for r in others for s in per_rank[r][2]]
    by_collective: dict[str, int] = {}
    for sample in samples:
        name = str(dict(sample.attributes)[semconv.NCCL_COLLECTIVE])
        by_collective[name] = by_collective.get(name, 0) + sample.value
    collective = max(by_collective, key=lambda name: by_collective[name])
    top = max((s for s in samples if dict(s.attributes)[semconv.NCCL_COLLECTIVE] == collective),
              key=lambda s: s.value)
    return Straggler(rank, pid, wait_ns, median, tuple(others), collective, wait_site(top), waits.duration_nano)


def wait_site(sample: Sample) -> str:
    """Where a wait happened: its first :data:`SITE_FRAMES` Python frames (``function (file:line)``), else its
    first named native frames outside the CUDA driver and runtime, below the leaf (the synchronize call)."""
    frames = sample.frames[1:]
    python = [f for f in frames if f.kind == FrameKind.PYTHON]
    chosen = python or [f for f in frames if f.function and f.kind == FrameKind.NATIVE and not _in_cuda(f)]
    return " <- ".join(_frame(f) for f in chosen[:SITE_FRAMES]) or "(no frames)"


def _in_cuda(frame: Frame) -> bool:
    """A frame of the CUDA driver or runtime (libcuda.so.1, libcudart.so.12, ...): how the wait was made, not where."""
    name = frame.mapping.path.rsplit("/", 1)[-1] if frame.mapping else ""
    return name.startswith(("libcuda.", "libcudart."))


def _frame(frame: Frame) -> str:
    if frame.kind == FrameKind.PYTHON and frame.filename:
        return f"{frame.function} ({frame.filename.rsplit('/', 1)[-1]}:{frame.line})"
    return frame.function


def straggler_line(waits: ProfileBatch) -> str:
    """The insight line for ``waits`` ("" when no rank stands out)."""
    found = find_straggler(waits)
    if found is None:
        return ""
    others = ", ".join(str(r) for r in found.others)
    return (f"insight: straggler rank {found.rank} (pid {found.pid}): rank{'s' if len(found.others) > 1 else ''} "
            f"{others} waited a median {found.others_median_ns / 1e9:.2f} s in {found.collective} at {found.site}, "
            f"rank {found.rank} {found.wait_ns / 1e9:.2f} s (named when at most {STRAGGLER_MAX_RATIO:g}x the "
            f"others' median and {STRAGGLER_MIN_EXCESS:.0%} of the {found.interval_ns / 1e9:.1f} s interval less)")


def unmeasured_line(batch: ProfileBatch) -> str:
    """``GPU time not measured: 3.2 s in python[4242], ...`` when the injected library stood aside in some process
    over the interval (its profile attribute ``otel_gpu.gpu_time.yielded``), else ""."""
    parts = []
    for process in batch.processes:
        seconds = process.attribute(semconv.OTEL_GPU_GPU_TIME_YIELDED)
        if isinstance(seconds, (int, float)) and seconds > 0:
            name = process.process.service_name or process.process.executable_name
            parts.append(f"{float(seconds):.1f} s in {name}[{process.process.pid}]")
    if not parts:
        return ""
    return (f"GPU time not measured: {', '.join(parts)} (another tool such as torch.profiler held CUPTI, or the "
            "library stood aside for the program's CUDA graphs)")


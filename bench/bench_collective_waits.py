# SPDX-License-Identifier: Apache-2.0
"""The agent's cost of joining waits with NCCL collectives (otel_gpu/cuda/waits.py), side by side.

The same record stream of a data-parallel rank goes through GPUTimeAccounting twice: per step a matmul launch and
kernel, an all-reduce launch and kernel, one stream synchronize, a window every 50 steps, a drain every 1,000 steps.
In one the all-reduce kernel has an NCCL name (its process's waits are held, then split by the collectives that ran
during them); in the other an ordinary name (waits accounted at once, as before the join). Reports microseconds of
agent CPU per step for each and their ratio.

Run: .venv/bin/python bench/bench_collective_waits.py [--steps 20000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from otel_gpu.cuda import abi  # noqa: E402
from otel_gpu.cuda.accounting import GPUTimeAccounting  # noqa: E402
from otel_gpu.cuda.stacks import StackFrames  # noqa: E402
from otel_gpu.procfs import ProcessInfo, ProcessResolver  # noqa: E402
from otel_gpu.profiles.model import Frame  # noqa: E402

PID = 4242
STEP_NS = 10_000_000
MS = 1_000_000


class _Resolver(ProcessResolver):
    def info(self, pid: int) -> ProcessInfo | None:
        return ProcessInfo(pid, "rank", ranks=(("distributed.rank", 0),))


class _Symbolizer:
    def remember(self, pid: int) -> None:
        pass

    def frames(self, pid: int, pcs: Sequence[int]) -> tuple[Frame, ...]:
        return tuple(Frame(f"fn_{pc:x}") for pc in pcs)

    def forget(self, pid: int) -> None:
        pass


def _stack(*pcs: int) -> abi.Stack:
    return abi.Stack(native=pcs, python=(), flags=0)


def records(steps: int, collective_name: str) -> list[abi.Record]:
    """The record stream of ``steps`` steps of one rank."""
    out: list[abi.Record] = []
    matmul_stack, reduce_stack, wait_stack = _stack(0x10, 0x20, 0x30), _stack(0x11, 0x21, 0x30), _stack(0x12, 0x30)
    window = 1
    for step in range(steps):
        t = step * STEP_NS
        for offset, (name, stack, duration) in enumerate(((f"matmul_{0}", matmul_stack, 2 * MS),
                                                          (collective_name, reduce_stack, 6 * MS))):
            corr = 2 * step + offset + 1
            out.append(abi.Launch(PID, PID, "rank", abi.LAUNCH_KERNEL, corr, 307, window, t + offset, 0, stack))
            start = t + (2 * MS if offset else 0)
            out.append(abi.Activity(PID, abi.ACTIVITY_KERNEL, corr, start, start + duration, 0, 7, 0, name, 0, 0, 0,
                                    0))
        out.append(abi.Sync(PID, PID, "rank", abi.SYNC_STREAM, 126, t + 1000, t + 8 * MS, 1, wait_stack))
        if step % 50 == 49:
            start = (step - 49) * STEP_NS
            out.append(abi.Window(PID, window, start, t + STEP_NS, 50 * STEP_NS * window, 50 * STEP_NS * window, 100,
                                  0, 0))
            window += 1
    return out


def run(stream: list[abi.Record]) -> float:
    """Seconds of CPU to account for ``stream``, draining every 1,000 steps."""
    accounting = GPUTimeAccounting(_Resolver(), StackFrames(_Symbolizer()), alive=lambda pid: True)  # type: ignore[arg-type]
    started = time.process_time()
    for index, record in enumerate(stream, 1):
        accounting.handle(record)
        if index % 5000 == 0:
            accounting.drain(index)
    accounting.drain(len(stream) + 1)
    return time.process_time() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    plain = records(args.steps, "reduce_kernel")
    nccl = records(args.steps, "ncclDevKernel_AllReduce_Sum_f32_RING_LL")
    times: dict[str, list[float]] = {"plain": [], "nccl": []}
    for _ in range(args.rounds):  # alternating, so that the machine's load falls on both alike
        times["plain"].append(run(plain))
        times["nccl"].append(run(nccl))
    per_step = {name: statistics.median(values) / args.steps * 1e6 for name, values in times.items()}
    print(f"agent CPU per step (median of {args.rounds} rounds, {args.steps} steps, 5 records a step): "
          f"waits not joined {per_step['plain']:.1f} us, joined with collectives {per_step['nccl']:.1f} us, "
          f"ratio {per_step['nccl'] / per_step['plain']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

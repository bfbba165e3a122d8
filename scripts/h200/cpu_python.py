#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""CPU profiles of a PyTorch training step on a real GPU machine (issue 14; scripts/h200/run.sh step "cpu_python").

    python3 scripts/h200/cpu_python.py OUT.md        (about 1-2 minutes)

A small model trained on the GPU from Python (its own functions: ``train_step`` -> ``forward`` -> ``block``) is
profiled by the agent's CPU source (eBPF, 99 Hz, this process only), twice side by side: frame pointers only, then
with native unwinding from .eh_frame. Reported for each: the share of the program's samples whose stack reaches a
Python frame and one of its own functions, the share where a Python frame sits above a torch C++ frame
(``at::`` / ``c10::`` / ``torch::``) or libcuda, the median stack depth, the top functions, the unwinder's and the
Python walker's statistics, and this process's (the agent side's) CPU time and peak RSS.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from verify_gpu_time import write_report  # noqa: E402

from otel_gpu.config import ProfilingConfig  # noqa: E402
from otel_gpu.cpu.source import CPUProfileSource  # noqa: E402
from otel_gpu.procfs import ProcessResolver  # noqa: E402
from otel_gpu.profiles.model import FrameKind, Sample  # noqa: E402

PROGRAM = r"""
import os, sys, time
import torch

def block(layer, x):
    return torch.nn.functional.gelu(layer(x))

def forward(layers, x):
    for layer in layers:
        x = block(layer, x)
    return x.float().pow(2).mean()

def train_step(layers, optimizer, x):
    optimizer.zero_grad(set_to_none=True)
    loss = forward(layers, x)
    loss.backward()
    optimizer.step()
    return loss

def main(seconds):
    torch.manual_seed(0)
    layers = torch.nn.ModuleList(torch.nn.Linear(256, 256) for _ in range(24)).cuda()
    optimizer = torch.optim.SGD(layers.parameters(), lr=1e-3)
    x = torch.randn(64, 256, device="cuda")
    print("ready", os.getpid(), flush=True)
    end = time.time() + seconds
    steps = 0
    while time.time() < end:
        loss = train_step(layers, optimizer, x)
        steps += 1
        if steps % 50 == 0:
            loss.item()
    print("steps", steps, flush=True)

main(float(sys.argv[1]))
"""

# CPU_PYTHON_LOCAL=1 (a machine without torch): the same shape in pure Python, with large native libraries mapped
# (LLVM, clang, z3 where installed) so that the unwinder meets libtorch-sized files
LOCAL_PROGRAM = r"""
import ctypes, glob, os, sys, time
for pattern in ("libLLVM-*.so.1", "libclang-*.so.*", "libz3.so.*"):
    for lib in sorted(glob.glob("/usr/lib/x86_64-linux-gnu/" + pattern))[:1]:
        ctypes.CDLL(lib)

def block(n):
    s = 0
    for i in range(n):
        s += i
    return s

def forward():
    return block(20000)

def train_step():
    return forward()

def main(seconds):
    print("ready", os.getpid(), flush=True)
    end = time.time() + seconds
    while time.time() < end:
        train_step()

main(float(sys.argv[1]))
"""

OWN = {"train_step", "forward", "block", "main"}
TORCH_NATIVE = ("at::", "c10::", "torch::")


def python_above_native(sample: Sample) -> bool:
    """A Python frame nearer the root than a torch C++ or libcuda frame (frames run leaf first)."""
    seen_native = False
    for frame in sample.frames:
        if frame.kind == FrameKind.NATIVE and (frame.function.startswith(TORCH_NATIVE) or "libcuda" in
                                               (frame.mapping.path if frame.mapping else "")):
            seen_native = True
        elif frame.kind == FrameKind.PYTHON and seen_native:
            return True
    return False


def profile(seconds: float, native_unwind: bool, program: Path, env: dict[str, str]) -> tuple[list[str], dict]:
    process = subprocess.Popen([sys.executable, str(program), str(seconds + 25)], stdout=subprocess.PIPE, text=True,
                               env=env)
    assert process.stdout is not None
    try:
        line = process.stdout.readline().split()
        if not line or line[0] != "ready":
            raise RuntimeError(f"the program did not start: {line}")
        pid = int(line[1])
        time.sleep(3)  # past CUDA initialisation and the first steps
        usage0 = resource.getrusage(resource.RUSAGE_SELF)
        started = time.monotonic()
        source = CPUProfileSource(ProfilingConfig(frequency_hz=99, pids=(pid,)), ProcessResolver())
        source.sampler.native_unwind = native_unwind
        source.open()
        samples: list[Sample] = []
        try:
            settled = source.sampler.settle_unwinder(30.0)
            settle_s = time.monotonic() - started
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                time.sleep(5)
                batch = source.drain()[0]
                samples += [s for p in batch.processes if p.process.pid == pid for s in p.samples]
            stats = source.sampler.stats()
        finally:
            source.close()
        usage1 = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        process.kill()
        process.wait()
    total = sum(s.value for s in samples)
    python = sum(s.value for s in samples if any(f.kind == FrameKind.PYTHON for f in s.frames))
    own = sum(s.value for s in samples if any(f.kind == FrameKind.PYTHON and f.function.split(".")[-1] in OWN
                                              for f in s.frames))
    above = sum(s.value for s in samples if python_above_native(s))
    depths = [len(s.frames) for s in samples for _ in range(s.value)]
    leaves: Counter[str] = Counter()
    pyfuncs: Counter[str] = Counter()
    for s in samples:
        leaves[s.frames[0].function[:80]] += s.value
        for f in {f.function for f in s.frames if f.kind == FrameKind.PYTHON}:
            pyfuncs[f] += s.value
    cpu_s = (usage1.ru_utime + usage1.ru_stime) - (usage0.ru_utime + usage0.ru_stime)

    def share(n: int) -> str:
        return f"{n / total * 100:.1f} %" if total else "n/a"

    label = "native unwinding (.eh_frame)" if native_unwind else "frame pointers only"
    lines = ["", f"### {label}", "",
             f"- samples {total}; reaching a Python frame {share(python)}; reaching one of the program's own "
             f"functions ({', '.join(sorted(OWN))}) {share(own)}; a Python frame above a torch C++ / libcuda frame "
             f"{share(above)}",
             f"- stack depth median {statistics.median(depths) if depths else 0}, p90 "
             f"{sorted(depths)[int(0.9 * len(depths))] if depths else 0}",
             f"- unwinder settled {settled} after {settle_s:.1f} s; sampler stats "
             f"{ {k: v for k, v in stats.items() if v and (k.startswith(('unwind', 'python')) or k in ('samples',))} }",
             f"- agent side (this process) over the run: CPU {cpu_s:.2f} s in {time.monotonic() - started:.0f} s, "
             f"peak RSS {usage1.ru_maxrss / 1024:.0f} MB",
             "- top leaves: " + "; ".join(f"`{k}` {v / total * 100:.1f} %" for k, v in leaves.most_common(6)),
             "- top Python functions (inclusive): " + "; ".join(f"`{k}` {v / total * 100:.1f} %"
                                                                  for k, v in pyfuncs.most_common(8))]
    heaviest = max((s for s in samples if python_above_native(s)), key=lambda s: s.value, default=None)
    if heaviest is not None:
        lines.append("- a stack with Python above torch C++ (leaf first): "
                     + " <- ".join(f.function[:50] for f in heaviest.frames[:24]))
    return lines, {"python": python / total if total else 0.0, "own": own / total if total else 0.0}


def main(argv: list[str]) -> int:
    out = Path(argv[1])
    seconds = float(os.environ.get("CPU_PYTHON_SECONDS", "20"))
    lines = ["## CPU profiles of a PyTorch training step (issue 14)", "",
             f"- Python {sys.version.split()[0]} ({sys.executable})"]
    work = Path(tempfile.mkdtemp(prefix="otel-gpu-cpu-python-"))
    program = work / "train.py"
    program.write_text(LOCAL_PROGRAM if os.environ.get("CPU_PYTHON_LOCAL") == "1" else PROGRAM)
    env = dict(os.environ)
    env.pop("CUDA_INJECTION64_PATH", None)
    for native_unwind in (False, True):
        try:
            part, _ = profile(seconds, native_unwind, program, env)
            lines += part
        except Exception:  # noqa: BLE001  (report what ran)
            lines += ["", "```", traceback.format_exc()[-3000:], "```"]
    write_report(out, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Attach latency and several injected processes on one GPU (issue 16 items 2 and 3; scripts/h200/run.sh "attach").

    python3 scripts/h200/attach.py OUT.md        (about 1-2 minutes)

The agent's GPU-time source runs here with the agent's default rescan periods (2 s, 10 s). Then:
1. Three injected torch processes, one after the other, each started after the agent: the time from the process's
   CUDA initialisation (its first kernel has completed) to the start of the first sampling window the agent received
   from it (an upper bound of the attach latency: it includes the first gap between windows).
2. Four injected torch processes at once on the one GPU, each calling a function of its own name: each attributed to
   its own function, with its sampling fraction and gpu_time total.
"""

from __future__ import annotations

import json
import os
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

from verify_gpu_time import WindowedSource, write_report  # noqa: E402

from otel_gpu.errors import SourceUnavailable  # noqa: E402
from otel_gpu.profiles.model import FrameKind  # noqa: E402

PROGRAM = r"""
import json, os, sys, time
import torch

def make_work(name):
    def work(x):
        for _ in range(20):
            x = torch.relu(x * 1.0001 + 0.0001)
        return x
    work.__code__ = work.__code__.replace(co_name=name, co_qualname=name)  # the name frames carry
    return work

def main(name, seconds, out):
    x = torch.randn(1 << 20, device="cuda")
    x.sum().item()  # CUDA initialised and a kernel completed
    ready_ns = time.time_ns()
    work = make_work(name)
    end = time.time() + seconds
    steps = 0
    while time.time() < end:
        x = work(x)
        x.sum().item()
        steps += 1
    open(out, "w").write(json.dumps({"pid": os.getpid(), "ready_ns": ready_ns, "steps": steps}))

main(sys.argv[1], float(sys.argv[2]), sys.argv[3])
"""


def start(program: Path, name: str, seconds: float, out: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "otel_gpu", "inject", "--", sys.executable, str(program), name,
                             str(seconds), str(out)], env=env, text=True, stderr=subprocess.PIPE)


def main(argv: list[str]) -> int:
    out = Path(argv[1])
    lines = ["## Attach latency and several processes on one GPU (issue 16)", ""]
    work = Path(tempfile.mkdtemp(prefix="otel-gpu-attach-"))
    program = work / "program.py"
    program.write_text(PROGRAM)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.pop("CUDA_INJECTION64_PATH", None)
    source = WindowedSource()  # the agent's defaults
    try:
        source.open()
    except SourceUnavailable as exc:
        write_report(out, lines + [f"- eBPF unavailable: {exc}"])
        return 1
    try:
        lines += ["### Attach latency (process started after the agent)", "",
                  "| run | CUDA ready -> first window received (ms) | windows |", "|---|---|---|"]
        for run in range(3):
            result = work / f"latency{run}.json"
            proc = start(program, "latency_work", 6.0, result, env)
            _, err = proc.communicate(timeout=120)
            if proc.returncode != 0:
                lines.append(f"| {run} | exited {proc.returncode}: {err[-300:]} | |")
                continue
            info = json.loads(result.read_text())
            time.sleep(0.3)
            source.poll_now()
            spans = source.window_spans.get(info["pid"], [])
            first = min((s for s, _ in spans), default=0)
            latency = f"{(first - info['ready_ns']) / 1e6:.0f}" if first else "never"
            lines.append(f"| {run} | {latency} | {len(spans)} |")
            source.drain()

        lines += ["", "### Four injected processes at once on one GPU", "",
                  "| process | steps | gpu_time in its own function (ms) | share of its gpu_time | sampling fraction |",
                  "|---|---|---|---|---|"]
        names = [f"worker_{k}" for k in range(4)]
        procs = [(name, work / f"{name}.json", start(program, name, 20.0, work / f"{name}.json", env))
                 for name in names]
        for _, _, proc in procs:
            proc.communicate(timeout=180)
        time.sleep(0.5)
        source.poll_now()
        gpu, _ = source.drain()
        for name, result, proc in procs:
            if proc.returncode != 0 or not result.exists():
                lines.append(f"| {name} | exited {proc.returncode} | | | |")
                continue
            info = json.loads(result.read_text())
            by_function: Counter[str] = Counter()
            for process in gpu.processes:
                if process.process.pid == info["pid"]:
                    for sample in process.samples:
                        own = next((f.function for f in sample.frames
                                    if f.kind == FrameKind.PYTHON and f.function.startswith("worker_")), "other")
                        by_function[own] += sample.value
            total = sum(by_function.values())
            lines.append(f"| {name} | {info['steps']} | {by_function[name] / 1e6:.1f} | "
                         f"{by_function[name] / total * 100 if total else 0:.1f} % | "
                         f"{source.fraction(info['pid']):.4f} |")
    except Exception:  # noqa: BLE001  (report what ran)
        lines += ["", "```", traceback.format_exc()[-3000:], "```"]
    finally:
        source.close()
    write_report(out, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

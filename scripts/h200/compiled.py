#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""``torch.compile(mode="reduce-overhead")`` attributed to the line that calls the compiled function, on a real GPU
(issue 16; scripts/h200/run.sh step "compiled").

    python3 scripts/h200/compiled.py OUT.md        (about 3 minutes: two compilations, COMPILED_SECONDS measured)

One program, two functions called equally often: ``compiled_step()`` calls a 12-layer MLP compiled with
``mode="reduce-overhead"`` (Inductor's CUDA graph trees replay it), ``eager_step()`` calls the same model eagerly.
Reference: torch.profiler's kernel time per call of each (its own run). Measured: the program under
``otel-gpu inject`` with the agent's GPU-time source attached, the library's settings as a user gets them (the
workload's own ``OTEL_GPU_*`` variables pass through, e.g. ``OTEL_GPU_CUDA_GRAPHS=sample``). Reported: how much of
``compiled_step()``'s gpu_time has the line that calls the compiled model in its stack and a ``cuda.graph``
attribute, the ratio compiled / eager against torch.profiler's, each side against torch.profiler's time per call x
the calls, and what the library chose for the graphs (its stats lines).
"""

from __future__ import annotations

import os
import sys
import traceback
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from graphs import REFERENCE, diagnose, measure  # noqa: E402
from verify_gpu_time import write_report  # noqa: E402

from otel_gpu.profiles.model import FrameKind, Sample  # noqa: E402
from otel_gpu.semconv import CUDA_GRAPH  # noqa: E402

PROGRAM = REFERENCE + r"""
import inspect, json, os, sys, time
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(1024, 1024) for _ in range(12))

    def forward(self, x):
        for layer in self.layers:
            x = torch.nn.functional.gelu(layer(x))
        return x

def compiled_step(fast, x):
    return fast(x)  # the call line

def eager_step(model, x):
    return model(x)

CALL_LINE = next(n for n, text in enumerate(inspect.getsource(sys.modules[__name__]).splitlines(), 1)
                 if text.strip().startswith("return fast(x)"))

def main(mode, seconds, out):
    torch.manual_seed(0)
    model = Net().cuda()
    fast = torch.compile(model, mode="reduce-overhead")
    x = torch.randn(64, 1024, device="cuda")
    calls = {"compiled_step": lambda: compiled_step(fast, x), "eager_step": lambda: eager_step(model, x)}
    result = {"pid": os.getpid(), "call_line": CALL_LINE}
    with torch.no_grad():
        started = time.time()
        for _ in range(5):  # compiles, records the graph trees, then replays
            calls["compiled_step"]()
        torch.cuda.synchronize()
        result["compile_s"] = time.time() - started
        if mode == "profile":
            result.update(kernel_time_per_call(calls, 100))
        else:
            iterations = 0
            end = time.time() + seconds
            while time.time() < end:
                calls["compiled_step"]()
                calls["eager_step"]()
                torch.cuda.synchronize()
                iterations += 1
            result["iterations"] = iterations
    open(out, "w").write(json.dumps(result))

if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), sys.argv[3])
"""

STEPS = ("compiled_step", "eager_step")


def step_of(sample: Sample) -> str:
    """The innermost of the two step functions in the sample's stack, else "other"."""
    for frame in sample.frames:
        if frame.kind == FrameKind.PYTHON and frame.function in STEPS:
            return frame.function
    return "other"


def line_shares(samples: list[Sample], call_line: int) -> tuple[int, float, float]:
    """(compiled_step's gpu_time ns, the share of it whose stack holds compiled_step at ``call_line``, the share
    that carries a cuda.graph attribute)."""
    total = at_line = in_graph = 0
    for sample in samples:
        if step_of(sample) != "compiled_step":
            continue
        total += sample.value
        if any(f.kind == FrameKind.PYTHON and f.function == "compiled_step" and f.line == call_line
               for f in sample.frames):
            at_line += sample.value
        if any(key == CUDA_GRAPH for key, _ in sample.attributes):
            in_graph += sample.value
    return total, (at_line / total if total else 0.0), (in_graph / total if total else 0.0)


def report(run_reference: dict, measured: dict, samples: list[Sample], lines: list[str]) -> None:  # type: ignore[type-arg]
    """The attribution lines for one measured run against its reference."""
    totals: Counter[str] = Counter()
    for sample in samples:
        totals[step_of(sample)] += sample.value
    ref = {name: run_reference[name]["ns_per_call"] for name in STEPS}
    ref_ratio = ref["compiled_step"] / ref["eager_step"]
    ratio = totals["compiled_step"] / totals["eager_step"] if totals["eager_step"] else float("nan")
    total, at_line, in_graph = line_shares(samples, measured["call_line"])
    lines += [f"- torch.profiler: compiled_step() {ref['compiled_step'] / 1e3:.1f} us of kernels per call "
              f"({run_reference['compiled_step']['kernels_per_call']:.1f} kernels), eager_step() "
              f"{ref['eager_step'] / 1e3:.1f} us ({run_reference['eager_step']['kernels_per_call']:.1f} kernels); "
              f"ratio **{ref_ratio:.3f}**; compilation {measured.get('compile_s', 0):.1f} s (measured run)",
              "", "### Attribution (the agent's gpu_time)", "",
              f"- {measured['iterations']} iterations; gpu_time: compiled_step() {totals['compiled_step'] / 1e6:.1f} "
              f"ms, eager_step() {totals['eager_step'] / 1e6:.1f} ms, other {totals['other'] / 1e6:.1f} ms",
              f"- compiled_step()'s gpu_time with the calling line ({measured['call_line']}) in its stack: "
              f"**{at_line:.3f}**, with a `{CUDA_GRAPH}` attribute: {in_graph:.3f} (of {total / 1e6:.1f} ms)",
              f"- ratio compiled / eager **{ratio:.3f}** against torch.profiler's {ref_ratio:.3f}: "
              f"{(ratio / ref_ratio - 1) * 100:+.1f} %",
              "- each against torch.profiler's time per call x the iterations (the compilation's launches aside): "
              + ", ".join(f"{name}() {totals[name] / (measured['iterations'] * ref[name]):.3f}" for name in STEPS)]


def main(argv: list[str]) -> int:
    out = Path(argv[1])
    seconds = float(os.environ.get("COMPILED_SECONDS", "60"))
    lines = ['## torch.compile(mode="reduce-overhead") attributed to the calling line (issue 16)', ""]
    try:
        run = measure(PROGRAM, seconds, lines, {})
        if run is None:
            write_report(out, lines)
            return 1
        report(run.reference, run.measured, run.samples, lines)
        lines.append(f"- sampling fraction {run.sampling_fraction:.4f}; joins (joined, launches unmatched, activities "
                     f"unmatched): {run.join_stats}; library drops {run.library_dropped}")
        diagnose(run.records, lines, nodes=None)
    except Exception:  # noqa: BLE001  (report what ran)
        lines += ["", "```", traceback.format_exc()[-3000:], "```"]
    write_report(out, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

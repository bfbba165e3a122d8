# SPDX-License-Identifier: Apache-2.0
"""Costs of span context: the span processor per span, and the BPF sampler's reading of the table per sample.

1. The processor's added cost per span (start + end), side by side against the SDK alone: both tracer providers run
   the same nested workload in alternating rounds (so drift and neighbours' load hit both), with a no-op exporter
   behind a SimpleSpanProcessor as the baseline pipeline. Prints medians, their difference and ratio.
2. With --bpf-seconds N (root): the CPU sampler's run time per sample (kernel.bpf_stats_enabled, this sampler's own
   program only) on a busy process that never loads the module (one failed map lookup) against one whose two threads
   are always inside a span (the lookup plus the slot reads), alternating phases of N seconds.

Run: .venv/bin/python bench/bench_span_context.py [--rounds 60] [--spans 2000] [--bpf-seconds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from otel_gpu.instrumentation import SpanContextProcessor


class _Discard(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def _provider(with_context: bool) -> TracerProvider:
    provider = TracerProvider()
    if with_context:
        provider.add_span_processor(SpanContextProcessor())
    provider.add_span_processor(SimpleSpanProcessor(_Discard()))
    return provider


def _round_us(provider: TracerProvider, spans: int) -> float:
    """Microseconds per span: a root with three nested children, repeated; start_as_current_span as apps use it."""
    tracer = provider.get_tracer("bench")
    start = time.perf_counter_ns()
    for _ in range(spans // 4):
        with tracer.start_as_current_span("root"):
            with tracer.start_as_current_span("a"):
                with tracer.start_as_current_span("b"):
                    pass
            with tracer.start_as_current_span("c"):
                pass
    return (time.perf_counter_ns() - start) / 1000 / (spans // 4 * 4)


_BUSY = """
import sys, threading, time
spans = sys.argv[1] == "spans"
if spans:
    from opentelemetry.sdk.trace import TracerProvider
    from otel_gpu.instrumentation import SpanContextProcessor
    provider = TracerProvider()
    provider.add_span_processor(SpanContextProcessor())
    tracer = provider.get_tracer("bench")
def burn():
    if spans:
        with tracer.start_as_current_span("busy"):
            while True:
                pass
    while True:
        pass
for _ in range(2):
    threading.Thread(target=burn, daemon=True).start()
print("ready", flush=True)
sys.stdin.readline()
"""


def _program_stats(program_id: int) -> tuple[int, int]:
    bpftool = shutil.which("bpftool") or "/usr/sbin/bpftool"
    out = subprocess.run([bpftool, "prog", "show", "id", str(program_id), "-j"], capture_output=True, text=True,
                         check=True).stdout
    prog = json.loads(out)
    return int(prog.get("run_time_ns", 0)), int(prog.get("run_cnt", 0))


def _bpf_phase(with_spans: bool, seconds: float) -> tuple[float, int]:
    """(ns per sample, samples) of a fresh sampler on one busy child."""
    from otel_gpu.cpu.sampler import CPUSampler

    child = subprocess.Popen([sys.executable, "-c", _BUSY, "spans" if with_spans else "plain"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    sampler = CPUSampler(999, pids=[child.pid])
    try:
        child.stdout.readline()
        sampler.open()
        deadline = time.monotonic() + 10
        while with_spans and not sampler.reads_span_context(child.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
            sampler.drain()
        if with_spans and not sampler.reads_span_context(child.pid):
            raise RuntimeError("the sampler did not find the child's span context table")
        sampler.drain()
        program_id = sampler._bpf.program_ids()["on_cpu_sample"]  # type: ignore[union-attr]
        run0, count0 = _program_stats(program_id)
        time.sleep(seconds)
        linked = sum(s.count for s in sampler.drain() if s.span_id)
        run1, count1 = _program_stats(program_id)
        if with_spans and linked == 0:
            raise RuntimeError("no sample carried a span id")
        return (run1 - run0) / max(1, count1 - count0), count1 - count0
    finally:
        sampler.close()
        child.kill()
        child.wait()


def _list(values: list[float]) -> str:
    return ", ".join(f"{x:.0f}" for x in values)


def bpf_cost(seconds: float, phases: int = 3) -> None:
    stats_path = Path("/proc/sys/kernel/bpf_stats_enabled")
    previous = stats_path.read_text().strip()
    stats_path.write_text("1")
    plain: list[float] = []
    spans: list[float] = []
    try:
        for _ in range(phases):
            plain.append(_bpf_phase(False, seconds)[0])
            spans.append(_bpf_phase(True, seconds)[0])
    finally:
        stats_path.write_text(previous)
    p, w = statistics.median(plain), statistics.median(spans)
    print(f"BPF sampler, process without the module: {p:.0f} ns per sample (phases: {_list(plain)})")
    print(f"BPF sampler, threads inside a span:      {w:.0f} ns per sample (phases: {_list(spans)})")
    print(f"reading the span context adds {w - p:.0f} ns per sample (ratio {w / p:.2f})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--spans", type=int, default=2000, help="spans per round")
    parser.add_argument("--bpf-seconds", type=float, default=0.0, help="also measure the BPF side (root)")
    args = parser.parse_args(argv)
    sdk, ours = _provider(False), _provider(True)
    _round_us(sdk, args.spans), _round_us(ours, args.spans)  # warm-up
    base: list[float] = []
    with_ctx: list[float] = []
    for _ in range(args.rounds):
        base.append(_round_us(sdk, args.spans))
        with_ctx.append(_round_us(ours, args.spans))
    b, w = statistics.median(base), statistics.median(with_ctx)
    bmin, wmin = min(base), min(with_ctx)
    diffs = sorted(x - y for x, y in zip(with_ctx, base, strict=True))
    print(f"SDK alone:              {b:.2f} us per span (start + end), median of {args.rounds} rounds")
    print(f"SDK + span context:     {w:.2f} us per span")
    print(f"added cost:             {w - b:.2f} us per span (paired rounds: p10 {diffs[len(diffs) // 10]:.2f}, "
          f"p90 {diffs[len(diffs) * 9 // 10]:.2f}); ratio {w / b:.2f}")
    print(f"fastest rounds:         {bmin:.2f} vs {wmin:.2f} us per span: "
          f"added {wmin - bmin:.2f} us, ratio {wmin / bmin:.2f}")
    if args.bpf_seconds > 0:
        if os.geteuid() != 0:
            print("--bpf-seconds needs root (loads eBPF programs)", file=sys.stderr)
            return 1
        bpf_cost(args.bpf_seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())

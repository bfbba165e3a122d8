# SPDX-License-Identifier: Apache-2.0
"""Costs of span context: the span processor per span, and the BPF sampler's reading of the table per sample.

1. The processor's added cost per span (start + end), side by side against the SDK alone: the tracer providers (the
   SDK alone, the processor with its C hooks, the processor with its Python hooks) run the same workload in
   alternating rounds (so drift and neighbours' load hit all), with a no-op exporter behind a SimpleSpanProcessor as
   the baseline pipeline; --path c or --path python measures one path only. Three mixes: "nested" (a local root with
   three nested children per four spans), "roots" (every span a local root: the three root attributes each time),
   "children" (every span a child of one long-lived root). Prints medians, fastest rounds, their differences and
   ratios, then each hook of the processor alone (best of repeated timeit runs; `_on_ending` too, which the SDK calls
   on every processor, and a local root's with devices to write) and one SUMMARY line per path to paste.
   --hooks-only: only the hooks.
2. With --bpf-seconds N (root): the CPU sampler's run time per sample (kernel.bpf_stats_enabled, this sampler's own
   program only) on a busy process that never loads the module (one failed map lookup) against one whose two threads
   are always inside a span (the lookup plus the slot reads), alternating phases of N seconds.

Run: .venv/bin/python bench/bench_span_context.py [--rounds 60] [--spans 2000] [--bpf-seconds 5] [--hooks-only]
     [--path both|c|python]
(without --bpf-seconds, or with 0, it needs neither root nor BPF: only the built libotel_gpu_context.so)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import timeit
from collections.abc import Callable, Sequence
from pathlib import Path

from _bpfstats import program_stats  # this script's folder is on sys.path

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from otel_gpu.instrumentation import SpanContextProcessor, SpanContextTable, _processor


class _Discard(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def processor_on(path: str) -> SpanContextProcessor:
    """A processor with its C hooks ("c") or its Python ones ("python")."""
    available = _processor.C_HOOKS
    if path == "c" and not available:
        raise SystemExit("the C hooks are not built or not usable here (make build); give --path python")
    _processor.C_HOOKS = path == "c"
    try:
        return SpanContextProcessor()
    finally:
        _processor.C_HOOKS = available


def _provider(path: str) -> TracerProvider:
    """The SDK alone ("sdk"), or with the processor on one path, before the exporter's processor."""
    provider = TracerProvider()
    if path != "sdk":
        provider.add_span_processor(processor_on(path))
    provider.add_span_processor(SimpleSpanProcessor(_Discard()))
    return provider


def _round_us(provider: TracerProvider, spans: int, mix: str) -> float:
    """Microseconds per span (start + end) of one mix; start_as_current_span as apps use it."""
    tracer = provider.get_tracer("bench")
    span = tracer.start_as_current_span
    start = time.perf_counter_ns()
    if mix == "nested":
        for _ in range(spans // 4):
            with span("root"):
                with span("a"):
                    with span("b"):
                        pass
                with span("c"):
                    pass
    elif mix == "roots":
        for _ in range(spans // 4 * 4):
            with span("root"):
                pass
    else:
        with span("long-lived root"):
            start = time.perf_counter_ns()
            for _ in range(spans // 4 * 4):
                with span("child"):
                    pass
    return (time.perf_counter_ns() - start) / 1000 / (spans // 4 * 4)


MIXES = ("nested", "roots", "children")


def span_cost(rounds: int, spans: int, paths: Sequence[str]) -> dict[tuple[str, str], tuple[float, float]]:
    """Per path and mix: (added us per span, median of paired rounds; added us, fastest rounds). Prints the table."""
    providers = {path: _provider(path) for path in ("sdk", *paths)}
    result: dict[tuple[str, str], tuple[float, float]] = {}
    print(f"load average before: {_load()}")
    for mix in MIXES:
        for provider in providers.values():
            _round_us(provider, spans, mix)  # warm-up
        times: dict[str, list[float]] = {path: [] for path in providers}
        for _ in range(rounds):
            for path, provider in providers.items():
                times[path].append(_round_us(provider, spans, mix))
        base = times["sdk"]
        b, bmin = statistics.median(base), min(base)
        print(f"[{mix}] SDK alone {b:.2f} us per span (start + end), median of {rounds} rounds (fastest {bmin:.2f})")
        for path in paths:
            w, wmin = statistics.median(times[path]), min(times[path])
            diffs = sorted(x - y for x, y in zip(times[path], base, strict=True))
            print(f"[{mix}]   + span context, {path:6s} hooks {w:.2f} us: added {w - b:.2f} us (paired p10 "
                  f"{diffs[len(diffs) // 10]:.2f}, p90 {diffs[len(diffs) * 9 // 10]:.2f}), ratio {w / b:.2f}; "
                  f"fastest rounds {wmin:.2f}: added {wmin - bmin:.2f} us")
            result[path, mix] = (w - b, wmin - bmin)
        if len(paths) == 2:
            (c, _), (py, _) = result["c", mix], result["python", mix]
            print(f"[{mix}]   added cost, C hooks / Python hooks: {c:.2f} / {py:.2f} us = {c / py:.2f}")
    print(f"load average after: {_load()}")
    return result


def device_mask(table: SpanContextTable) -> memoryview:
    """The calling thread's device mask (it must hold a slot): [0] is what the injected library sets."""
    import ctypes
    import threading

    tid = threading.get_native_id()
    for i in range(table.max_probe):
        index = (tid + i) & (table.slot_count - 1)
        if int.from_bytes(ctypes.string_at(table.address + 16 + index * 40, 4), "little") == tid:
            return memoryview((ctypes.c_uint8 * 8).from_address(table.devices_address + 8 * index)).cast("B").cast("Q")
    raise RuntimeError("this thread holds no slot")


def hook_cost(path: str, number: int = 20000, repeat: int = 15) -> dict[str, float]:
    """Each hook of the processor on one path alone on a live span, best of `repeat` timeit runs, in us."""
    provider = TracerProvider()
    processor = processor_on(path)
    tracer = provider.get_tracer("bench")
    root = tracer.start_span("root")
    child = tracer.start_span("child", context=trace.set_span_in_context(root))
    root_items = root._attributes._dict  # type: ignore[attr-defined]
    ended_root, ended_child = root._readable_span(), child._readable_span()

    def root_start_end() -> None:
        root_items.clear()  # a fresh local root each time, as the processor sees one (clearing is timed apart)
        processor.on_start(root)
        processor.on_end(ended_root)  # paired: a thread's open local roots stay as they are in an application

    def best_of(hook: Callable[[], object]) -> float:
        return min(timeit.repeat(hook, number=number, repeat=repeat)) / number * 1e6

    best = {"local root on_start + on_end": best_of(root_start_end),
            "  of which clearing the attributes (harness)": best_of(root_items.clear)}
    processor.on_start(root)  # the root open, as it is while its children start and end
    processor.on_start(child)
    devices = device_mask(SpanContextTable.shared())  # the thread's slot, claimed by its first span

    def root_ending_with_devices() -> None:
        devices[0] = 0b11  # as after sampled launches on devices 0 and 1
        processor._on_ending(root)
        root_items.pop("cuda.sampled_devices", None)

    hooks: dict[str, Callable[[], object]] = {
        "local root _on_ending": lambda: processor._on_ending(root),  # the SDK calls it on every processor
        "child on_start": lambda: processor.on_start(child),
        "child _on_ending": lambda: processor._on_ending(child),
        "child on_end": lambda: processor.on_end(ended_child),
        "local root _on_ending, devices 0 and 1 sampled": root_ending_with_devices,
    }
    best |= {name: best_of(hook) for name, hook in hooks.items()}
    root.end(), child.end()
    for name, us in best.items():
        print(f"{path:6s} hook {name:46s} {us:.3f} us")
    clear = best["  of which clearing the attributes (harness)"]
    root_us = best["local root on_start + on_end"] - clear + best["local root _on_ending"]
    child_us = best["child on_start"] + best["child _on_ending"] + best["child on_end"]
    print(f"{path:6s} hooks per span: local root {root_us:.2f} us, child {child_us:.2f} us (start + end)")
    return {"root": root_us, "child": child_us}


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg()) + f" ({os.cpu_count()} CPUs)"


_BUSY = """
import sys, threading, time
spans = sys.argv[1] == "spans"
if spans:
    from opentelemetry.sdk.trace import TracerProvider
    from otel_gpu.instrumentation import SpanContextProcessor, SpanContextTable, _processor
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
        run0, count0 = program_stats(program_id)
        time.sleep(seconds)
        linked = sum(s.count for s in sampler.drain() if s.span_id)
        run1, count1 = program_stats(program_id)
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
            for with_spans, into in ((False, plain), (True, spans)):
                ns, samples = _bpf_phase(with_spans, seconds)
                if samples == 0:  # the program's run count did not move: no reading, not a zero cost
                    print(f"BPF phase ({'spans' if with_spans else 'plain'}) counted no runs; left out",
                          file=sys.stderr)
                    continue
                into.append(ns)
    finally:
        stats_path.write_text(previous)
    if not plain or not spans:
        print("BPF sampler: no phase counted runs (kernel.bpf_stats_enabled?)", file=sys.stderr)
        return
    p, w = statistics.median(plain), statistics.median(spans)
    print(f"BPF sampler, process without the module: {p:.0f} ns per sample (phases: {_list(plain)})")
    print(f"BPF sampler, threads inside a span:      {w:.0f} ns per sample (phases: {_list(spans)})")
    print(f"reading the span context adds {w - p:.0f} ns per sample (ratio {w / p:.2f})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--spans", type=int, default=2000, help="spans per round")
    parser.add_argument("--bpf-seconds", type=float, default=0.0, help="also measure the BPF side (root); 0: skip")
    parser.add_argument("--hooks-only", action="store_true", help="only each hook alone (steadier on a loaded host)")
    parser.add_argument("--path", choices=("both", "c", "python"), default="both",
                        help="the processor's hooks to measure: in C, in Python, or both side by side")
    args = parser.parse_args(argv)
    paths = ("c", "python") if args.path == "both" else (args.path,)
    if args.bpf_seconds > 0 and os.geteuid() != 0:
        print("--bpf-seconds needs root (it loads eBPF programs); give 0 to measure only the span processor",
              file=sys.stderr)
        return 2
    hooks = {}
    if args.hooks_only:
        hooks = {path: hook_cost(path) for path in paths}
        alone = "; ".join(f"{path} root {h['root']:.2f}, child {h['child']:.2f}" for path, h in hooks.items())
        print(f"SUMMARY span context hooks: {alone}; load {_load()}")
        return 0
    added = span_cost(args.rounds, args.spans, paths)
    hooks = {path: hook_cost(path) for path in paths}
    for path in paths:
        mixes = ", ".join(f"{mix} {added[path, mix][0]:.2f}/{added[path, mix][1]:.2f}" for mix in MIXES)
        print(f"SUMMARY span context, {path} hooks: added us per span (start + end), median/fastest of {args.rounds} "
              f"paired rounds: {mixes}; hooks alone: root {hooks[path]['root']:.2f}, child "
              f"{hooks[path]['child']:.2f}; load {_load()}")
    if args.bpf_seconds > 0:
        bpf_cost(args.bpf_seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())

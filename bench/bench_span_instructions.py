# SPDX-License-Identifier: Apache-2.0
"""Instructions per span (start + end) under valgrind: the SDK alone, with a no-op processor, with the span processor
(its C hooks and its Python hooks), and the processor's hooks alone on each path. Deterministic (PYTHONHASHSEED=0),
so it splits the end-to-end difference where wall-clock rounds on a shared host cannot: each count is a run of N spans
minus a run of 0, so start-up cancels.

Pipelines as in bench_span_context.py (the processor with its C hooks, "c", or its Python hooks, "python", or a
`SpanProcessor` that does nothing, before a SimpleSpanProcessor with a discarding exporter). Mixes: "root" (every span
a local root), "child" (every span a child of one long-lived root), "nested" (a root with three nested children per
four spans); "hooks-root" / "hooks-child": the processor's on_start, _on_ending and on_end called directly on one live
span, as the --hooks-only timings do.

Run: .venv/bin/python bench/bench_span_instructions.py [--spans 4000] (needs valgrind; about 10 s per count)
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

PIPELINES = ("sdk", "noop", "c", "python")
MIXES = ("root", "child", "nested")


def _workload(pipeline: str, mix: str, spans: int) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from bench_span_context import _Discard, processor_on  # this script's folder is on sys.path

    provider = TracerProvider()
    processor = processor_on("python" if pipeline == "python" else "c")
    if pipeline != "sdk":
        provider.add_span_processor(processor if pipeline in ("c", "python") else SpanProcessor())
    provider.add_span_processor(SimpleSpanProcessor(_Discard()))
    tracer = provider.get_tracer("bench")
    span = tracer.start_as_current_span
    root = tracer.start_span("root")
    child = tracer.start_span("child", context=trace.set_span_in_context(root))
    processor.on_start(root), processor.on_start(child)
    ended_root, ended_child = root._readable_span(), child._readable_span()
    root_items = root._attributes._dict  # type: ignore[attr-defined]

    def run(n: int) -> None:
        for _ in range(n // 4):
            if mix == "nested":
                with span("root"), span("a"):
                    with span("b"):
                        pass
                with span("c"):
                    pass
                continue
            for _ in range(4):
                if mix == "root":
                    with span("root"):
                        pass
                elif mix == "child":
                    with span("child"):
                        pass
                elif mix == "hooks-root":
                    root_items.clear()
                    processor.on_start(root), processor._on_ending(root), processor.on_end(ended_root)
                else:
                    processor.on_start(child), processor._on_ending(child), processor.on_end(ended_child)

    if mix == "child":
        with span("long-lived root"):
            run(200), run(spans)  # the first 200: warm-up (specialisation, the thread's slot)
    else:
        run(200), run(spans)


def _instructions(pipeline: str, mix: str, spans: int) -> int:
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__,
               "--workload", pipeline, mix, str(spans)]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    out = subprocess.run(command, capture_output=True, text=True, check=True, env=env).stderr
    return int(re.search(r"Collected : (\d+)", out).group(1))  # type: ignore[union-attr]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spans", type=int, default=4000)
    parser.add_argument("--workload", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.workload:
        pipeline, mix, spans = args.workload
        _workload(pipeline, mix, int(spans))
        return 0
    per_span = {}
    for mix in MIXES:
        for pipeline in PIPELINES:
            n = (_instructions(pipeline, mix, args.spans) - _instructions(pipeline, mix, 0)) / args.spans
            per_span[pipeline, mix] = n
            print(f"{mix:7s} {pipeline:9s} {n:9.0f} instructions per span", flush=True)
    for mix in ("hooks-root", "hooks-child"):
        for path in ("c", "python"):  # the processor's hooks on that path, called directly (the pipeline: unused)
            n = (_instructions(path, mix, args.spans) - _instructions(path, mix, 0)) / args.spans
            print(f"{mix:11s} {path:6s} {n:9.0f} instructions per span (the hooks alone, harness loop included)",
                  flush=True)
    for path in ("c", "python"):
        added = ", ".join(f"{mix} +{per_span[path, mix] - per_span['sdk', mix]:.0f}" for mix in MIXES)
        print(f"SUMMARY span processor instructions added per span, {path} hooks: {added}")
    noop = ", ".join(f"{mix} +{per_span['noop', mix] - per_span['sdk', mix]:.0f}" for mix in MIXES)
    print(f"SUMMARY a no-op processor adds: {noop}")
    for mix in MIXES:
        c, python = (per_span[path, mix] - per_span["sdk", mix] for path in ("c", "python"))
        print(f"SUMMARY {mix}: C hooks / Python hooks, instructions added: {c:.0f} / {python:.0f} = {c / python:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

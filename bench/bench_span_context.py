# SPDX-License-Identifier: Apache-2.0
"""The span processor's added cost per span (start + end), measured side by side against the SDK alone.

Both tracer providers run the same nested workload in alternating rounds (so drift and neighbours' load hit both),
with a no-op exporter behind a SimpleSpanProcessor as the baseline pipeline. Prints the median per-span cost of each,
their difference in microseconds and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--spans", type=int, default=2000, help="spans per round")
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
    return 0


if __name__ == "__main__":
    sys.exit(main())

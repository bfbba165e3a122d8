# SPDX-License-Identifier: Apache-2.0
"""An instrumented CPU-bound program: two threads alternate busy work outside any span and inside a child span
("child-a", "child-b") of a local-root span of their own ("busy-a", "busy-b"). Keeps busy outside any span until a
line arrives on stdin (so the sampler, however long it takes to start, samples it and finds its span context table),
then prints every finished span as
`span <name> <span hex> <thread.id> <pyroscope.profile.id or ->`.
"""

from __future__ import annotations

import select
import sys
import threading
import time

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_gpu.instrumentation import SpanContextProcessor


def busy(seconds: float) -> None:
    end = time.monotonic() + seconds
    x = 0
    while time.monotonic() < end:
        x += 1


def work(tracer: object, name: str, rounds: int) -> None:
    for _ in range(rounds):
        busy(0.15)
        with tracer.start_as_current_span(f"busy-{name}"):  # type: ignore[attr-defined]
            with tracer.start_as_current_span(f"child-{name}"):  # type: ignore[attr-defined]
                busy(0.15)  # all the in-span work is in the child: its samples must carry the root's id


def main() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SpanContextProcessor())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("cpu_span_workload")
    print("ready", flush=True)
    while not select.select([sys.stdin], [], [], 0)[0]:  # on CPU until "go": the sampler finds the table once it
        busy(0.05)                                         # has sampled the process, however long its start took
    sys.stdin.readline()
    threads = [threading.Thread(target=work, args=(tracer, n, 8)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    threads_of = {s.name[-1]: s.attributes["thread.id"] for s in exporter.get_finished_spans()
                  if s.attributes and "thread.id" in s.attributes}
    for span in exporter.get_finished_spans():
        attributes = span.attributes or {}
        print(f"span {span.name} {span.get_span_context().span_id:016x} {threads_of[span.name[-1]]}"
              f" {attributes.get('pyroscope.profile.id', '-')}")


if __name__ == "__main__":
    main()

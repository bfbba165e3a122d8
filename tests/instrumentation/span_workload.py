# SPDX-License-Identifier: Apache-2.0
"""An instrumented program on the fake CUDA stack: two threads, each launching and waiting outside any span, inside a
span "outer-<t>" and inside its child "inner-<t>"; the function that launches names where it is (outside, in_outer,
in_inner) and the thread's function names the thread (worker_a, worker_b). Prints every finished span as
`span <name> <trace hex> <span hex> <pyroscope.profile.id or ->`.

With --busy-ms each of those places also burns that much CPU, and with --otlp-traces URL the spans also go to an
OTLP/HTTP receiver (the SDK's own exporter).

usage: span_workload.py LIBCUDA WORKLOAD_PY [--steps N] [--busy-ms MS] [--otlp-traces URL]
"""

from __future__ import annotations

import argparse
import importlib.util
import threading
import time
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_gpu.instrumentation import SpanContextProcessor


BUSY_S = 0.0


def step(driver: Any) -> None:
    end = time.monotonic() + BUSY_S
    while time.monotonic() < end:
        pass
    driver.launch(driver.matmul)
    driver.call("cuStreamSynchronize", driver.stream)


def outside(driver: Any) -> None:
    step(driver)


def in_outer(driver: Any) -> None:
    step(driver)


def in_inner(driver: Any) -> None:
    step(driver)


def work(driver: Any, tracer: Any, name: str, steps: int) -> None:
    for _ in range(steps):
        outside(driver)
        with tracer.start_as_current_span(f"outer-{name}"):
            in_outer(driver)
            with tracer.start_as_current_span(f"inner-{name}"):
                in_inner(driver)
            in_outer(driver)
        outside(driver)


def worker_a(driver: Any, tracer: Any, steps: int) -> None:
    work(driver, tracer, "a", steps)


def worker_b(driver: Any, tracer: Any, steps: int) -> None:
    work(driver, tracer, "b", steps)


def load_workload(path: str) -> Any:
    """tests/native/cuda/workload.py (its Driver) as a module."""
    spec = importlib.util.spec_from_file_location("fake_workload", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def instrumented_provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    """A tracer provider with the span context processor, its finished spans kept in memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SpanContextProcessor())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("libcuda")
    parser.add_argument("workload_py")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--busy-ms", type=float, default=0.0)
    parser.add_argument("--otlp-traces", default="")
    args = parser.parse_args()
    global BUSY_S
    BUSY_S = args.busy_ms / 1000
    module = load_workload(args.workload_py)
    provider, exporter = instrumented_provider()
    if args.otlp_traces:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=args.otlp_traces)))
    tracer = provider.get_tracer("span_workload")
    driver = module.Driver(args.libcuda, False)
    driver.setup()
    threads = [threading.Thread(target=f, args=(driver, tracer, args.steps)) for f in (worker_a, worker_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for span in exporter.get_finished_spans():
        ctx = span.get_span_context()
        profile_id = (span.attributes or {}).get("pyroscope.profile.id", "-")
        print(f"span {span.name} {ctx.trace_id:032x} {ctx.span_id:016x} {profile_id}")
    provider.shutdown()  # flushes the OTLP exporter


if __name__ == "__main__":
    main()

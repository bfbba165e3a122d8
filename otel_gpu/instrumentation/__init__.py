# SPDX-License-Identifier: Apache-2.0
"""Span context for the agent's samples: one line in an application's OpenTelemetry set-up.

    trace.get_tracer_provider().add_span_processor(otel_gpu.instrumentation.SpanContextProcessor())

or `opentelemetry-instrument` picks it up through the `otel_gpu` instrumentor entry point. Each thread's active trace
and span ids then sit in the span context table (docs/span-context.md), where the agent's CPU sampler and the injected
CUDA library read them, so samples taken inside a span link to it.
"""

from otel_gpu.instrumentation._processor import (
    PROFILE_ID_ATTRIBUTE,
    SpanContextInstrumentor,
    SpanContextProcessor,
)
from otel_gpu.instrumentation._table import LIBRARY_PATH, SpanContextTable

__all__ = [
    "LIBRARY_PATH",
    "PROFILE_ID_ATTRIBUTE",
    "SpanContextInstrumentor",
    "SpanContextProcessor",
    "SpanContextTable",
]

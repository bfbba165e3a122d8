# SPDX-License-Identifier: Apache-2.0
"""The span processor that publishes each thread's active span, and its `opentelemetry-instrument` entry point."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from otel_gpu.instrumentation._table import SlotWriter, SpanContextTable

PROFILE_ID_ATTRIBUTE = "pyroscope.profile.id"
_log = logging.getLogger(__name__)


class SpanContextProcessor(SpanProcessor):
    """On start, publishes the span as its thread's active one; on end, its local parent again (or nothing).

    Local-root spans (no parent, or a remote one) get `pyroscope.profile.id` (their own 16-hex span id, as
    pyroscope-otel sets it), `process.pid` and `thread.id`: what the agent's profiles are keyed by. Assumes spans on a
    thread nest and end on the thread that started them, as `start_as_current_span` gives; ending a local root clears
    the thread's record even if another trace's span encloses it.
    """

    def __init__(self, table: SpanContextTable | None = None) -> None:
        self._table = table or SpanContextTable.shared()
        self._pid = os.getpid()
        self._thread = threading.local()  # per thread: .writer (False: no slot free), .root, .tid

    def _writer(self) -> SlotWriter | None:
        thread = self._thread
        writer = getattr(thread, "writer", None)
        if writer is None:
            writer = thread.writer = self._table.thread_writer() or False
        return writer or None

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        ctx = span.get_span_context()
        parent = span.parent
        if parent is None or parent.is_remote:
            root = ctx.span_id
            span.set_attributes(
                {
                    PROFILE_ID_ATTRIBUTE: format(root, "016x"),
                    "process.pid": self._pid,
                    "thread.id": threading.get_native_id(),
                }
            )
        else:
            root = getattr(self._thread, "root", 0)
        self._thread.root = root
        writer = self._writer()
        if writer is not None:
            writer.write(ctx.trace_id, ctx.span_id, root)

    def on_end(self, span: ReadableSpan) -> None:
        writer = self._writer()
        if writer is None:
            return
        parent = span.parent
        if parent is None or parent.is_remote:
            self._thread.root = 0
            writer.write(0, 0, 0)
        else:
            writer.write(parent.trace_id, parent.span_id, getattr(self._thread, "root", 0))

    def shutdown(self) -> None:
        writer = self._writer()
        if writer is not None:
            writer.write(0, 0, 0)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class SpanContextInstrumentor:
    """What `opentelemetry-instrument` loads (entry point group `opentelemetry_instrumentor`, name `otel_gpu`)."""

    def instrument(self, **kwargs: Any) -> None:
        provider = kwargs.get("tracer_provider") or trace.get_tracer_provider()
        add = getattr(provider, "add_span_processor", None)
        if add is None:
            _log.warning("otel_gpu.instrumentation: the tracer provider is not the SDK's; spans are not published")
            return
        add(SpanContextProcessor())

    def uninstrument(self, **kwargs: Any) -> None:
        """Span processors cannot be removed from an SDK tracer provider; the table stays until exit."""

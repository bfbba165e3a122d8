# SPDX-License-Identifier: Apache-2.0
"""The span processor that publishes each thread's active span, and its `opentelemetry-instrument` entry point."""

from __future__ import annotations

import logging
import os
import threading
import weakref
from operator import attrgetter, itemgetter
from typing import Any

from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import SpanContext

from otel_gpu.instrumentation._table import HEADER_SIZE, NO_ROOT, NO_TRACE, SlotWriter, SpanContextTable
from otel_gpu.semconv import CUDA_SAMPLED_DEVICES

try:  # the hooks in C (native/hooks.c), built by `make build`; without it the Python methods below run
    from otel_gpu.instrumentation import _hooks
except ImportError:
    _hooks = None  # type: ignore[assignment]

PROFILE_ID_ATTRIBUTE = "pyroscope.profile.id"
_PID_ATTRIBUTE = "process.pid"
_TID_ATTRIBUTE = "thread.id"
_PROFILE_ID_LENGTH = 16
_log = logging.getLogger(__name__)


def _sdk_attributes_are_known() -> bool:
    """Whether the SDK's span attributes have the private fields the fast path writes (checked once at import)."""
    probe = BoundedAttributes(maxlen=1, immutable=False, max_value_len=None)
    return all(hasattr(probe, name) for name in ("_dict", "_lock", "_immutable", "maxlen", "max_value_len"))


_FAST_ATTRIBUTES = _sdk_attributes_are_known()


def _sdk_fields_are_known() -> bool:
    """Whether spans keep their context and parent in `_context` and `_parent` and a span context is the API's tuple
    of trace id, span id and is_remote first, as the fast getters read them (checked once at import)."""
    context, parent = SpanContext(1, 2, True), SpanContext(1, 3, False)
    span = ReadableSpan("probe", context=context, parent=parent)
    return (
        isinstance(context, tuple)
        and context[:3] == (1, 2, True)
        and getattr(span, "_context", None) is context
        and getattr(span, "_parent", None) is parent
    )


# Each hook reads a span's context and parent and their ids. The SDK's public getters are Python properties (and
# `Span.get_span_context` also calls `typing.cast`): a Python frame each, about a tenth of a microsecond. These C
# getters read the same fields where the SDK keeps them; with another SDK the public getters do the same job.
PUBLIC_GETTERS = (attrgetter("context", "parent"), attrgetter("trace_id", "span_id", "is_remote"))
FAST_GETTERS = (attrgetter("_context", "_parent"), itemgetter(0, 1, 2))
_FAST_FIELDS = _sdk_fields_are_known()
_context_and_parent, _ids = FAST_GETTERS if _FAST_FIELDS else PUBLIC_GETTERS

# The C hooks read the same private fields the fast paths do, so they stand in for the Python methods only where both
# probes passed. Read at each processor's construction (tests and the bench turn it off to run the Python hooks).
C_HOOKS = _hooks is not None and _FAST_FIELDS and _FAST_ATTRIBUTES


class _ThreadState:
    """What the processor keeps per thread: its slot writer and device mask, its local root (as an int and as its
    bytes), the local roots open on it, whether it publishes nothing for now (`dark`: more than one root is open), its
    tid, the last trace id (as an int and as its bytes)."""

    __slots__ = ("writer", "devices", "root", "root_bytes", "roots", "dark", "tid", "trace_id", "trace_bytes")

    def __init__(self, writer: SlotWriter | None) -> None:
        self.writer = writer
        self.devices = writer.devices if writer is not None else None
        self.root = 0
        self.root_bytes = NO_ROOT
        self.roots: list[int] = []
        self.dark = False
        self.tid = threading.get_native_id()
        self.trace_id = 0
        self.trace_bytes = NO_TRACE


class SpanContextProcessor(SpanProcessor):
    """On start, publishes the span as its thread's active one; on end, its local parent again (or nothing).

    Local-root spans (no parent, or a remote one) get `pyroscope.profile.id` (their own 16-hex span id, as
    pyroscope-otel sets it), `process.pid` and `thread.id`: what the agent's profiles are keyed by; and, when they end,
    `cuda.sampled_devices`: the devices of the launches the injected CUDA library sampled on their thread while they
    ran (absent when it sampled none). Assumes spans on a thread nest and end on the thread that started them, as
    `start_as_current_span` gives. While more than one local root is open on a thread (asyncio tasks each in a trace
    of their own, a root started inside another) the thread publishes nothing: which one runs is not known here. When
    they are down to one, its spans publish again from their next start or end.

    Where `_hooks.abi3.so` is built and the SDK's internals are the known ones, the instance's on_start, _on_ending and
    on_end are that extension's, which do what the methods below do; elsewhere the methods run.
    """

    def __init__(self, table: SpanContextTable | None = None) -> None:
        self._table = table or SpanContextTable.shared()
        self._pid = os.getpid()
        self._thread = threading.local()  # .state: this thread's _ThreadState
        self._hooks: _hooks.Hooks | None = None
        if C_HOOKS:
            # Instance attributes: the SDK's `processor.on_start(span, parent_context=...)` finds them before the
            # methods, and calls straight into C, without a Python frame (most of the Python hooks' cost).
            hooks = self._hooks = _hooks.Hooks(
                self._table.slot_function_address, self._table.address + HEADER_SIZE, self._table.devices_address,
                self._pid, BoundedAttributes, PROFILE_ID_ATTRIBUTE, _PID_ATTRIBUTE, _TID_ATTRIBUTE,
                CUDA_SAMPLED_DEVICES,
            )
            self.on_start = hooks.on_start  # type: ignore[method-assign]
            self._on_ending = hooks._on_ending  # type: ignore[method-assign]
            self.on_end = hooks.on_end  # type: ignore[method-assign]
        me = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: (p := me()) is not None and p._forked())

    def _forked(self) -> None:
        """A forked child has another pid and, for the forking thread, another tid and no slot: start afresh."""
        self._pid = os.getpid()
        self._thread = threading.local()
        if self._hooks is not None:
            self._hooks.forked(self._pid)

    def _state(self) -> _ThreadState:
        """This thread's state, made (and its slot claimed) on its first span."""
        try:
            return self._thread.state  # type: ignore[no-any-return]
        except AttributeError:
            state = self._thread.state = _ThreadState(self._table.thread_writer())
            return state

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        try:
            state = self._thread.state
        except AttributeError:
            state = self._state()
        context, parent = _context_and_parent(span)
        trace_id, span_id, _ = _ids(context)
        if parent is None or _ids(parent)[2]:  # no parent, or a remote one: a local root
            roots = state.roots
            roots.append(span_id)
            root_bytes = span_id.to_bytes(8, "big")
            self._set_root_attributes(span, state.tid, root_bytes.hex())
            devices = state.devices
            if devices is not None:
                devices[0] = 0  # the injected library notes this root's sampled launches from here on
            if len(roots) > 1:  # another local root is open here: which one a sample is in is not known
                state.dark = True
                state.root, state.root_bytes = 0, NO_ROOT
                if state.writer is not None:
                    state.writer.write(NO_TRACE, 0, NO_ROOT)
                return
            state.root, state.root_bytes = span_id, root_bytes
        elif state.dark:
            return
        else:
            root_bytes = state.root_bytes
        writer = state.writer
        if writer is not None:
            if trace_id != state.trace_id:  # a new trace on this thread: convert its id once, not per span
                state.trace_id = trace_id
                state.trace_bytes = trace_id.to_bytes(16, "big")
            writer.write(state.trace_bytes, span_id, root_bytes)

    def _set_root_attributes(self, span: Span, tid: int, profile_id: str) -> None:
        """`span.set_attributes` of the three root attributes, or what it would do, without its validation.

        The values need none: a 16-character string of hex digits and two ints are valid attribute values. The fast
        path is taken only where the SDK would store them unchanged and drop nothing: the span's attributes are still
        mutable, none of the three keys is set yet, the count limit leaves room for all three and the length limit
        for the 16 characters. Anywhere else (and with an SDK whose attribute internals differ) the SDK's own call
        runs, so its limits and warnings apply as before.
        """
        attributes = getattr(span, "_attributes", None)
        if _FAST_ATTRIBUTES and type(attributes) is BoundedAttributes and not attributes._immutable:
            items = attributes._dict
            maxlen = attributes.maxlen
            max_value_len = attributes.max_value_len
            if (
                (maxlen is None or len(items) + 3 <= maxlen)
                and (max_value_len is None or max_value_len >= _PROFILE_ID_LENGTH)
                and PROFILE_ID_ATTRIBUTE not in items
                and _PID_ATTRIBUTE not in items
                and _TID_ATTRIBUTE not in items
            ):
                lock = attributes._lock
                lock.acquire()  # acquire and release: half the cost of `with` (its __enter__ / __exit__ lookups)
                try:
                    items[PROFILE_ID_ATTRIBUTE] = profile_id
                    items[_PID_ATTRIBUTE] = self._pid
                    items[_TID_ATTRIBUTE] = tid
                finally:
                    lock.release()
                return
        span.set_attributes({PROFILE_ID_ATTRIBUTE: profile_id, _PID_ATTRIBUTE: self._pid, _TID_ATTRIBUTE: tid})

    def _on_ending(self, span: Span) -> None:
        """Puts the devices of the local root's sampled launches on it, before exporters see the span.

        The SDK has frozen the attributes by now (`Span.end` sets `_immutable` before calling this), so
        `set_attribute` would store nothing: the value goes into the attribute dict directly, when the SDK's
        `BoundedAttributes` is the one known and the count limit leaves room; otherwise, or when the span set the key
        itself, nothing is recorded. Only for the thread's current local root (so never for a child): one that another
        trace's root interrupted has lost its mask to it.
        """
        try:
            state = self._thread.state
        except AttributeError:
            return
        devices = state.devices
        if devices is None:
            return
        mask = devices[0]
        if not mask:  # most spans: nothing sampled on this thread since its local root started
            return
        if state.root != span.get_span_context().span_id:  # a child, or a root another trace's root interrupted
            return
        attributes = getattr(span, "_attributes", None)
        if not _FAST_ATTRIBUTES or type(attributes) is not BoundedAttributes:
            return
        with attributes._lock:
            items = attributes._dict
            if CUDA_SAMPLED_DEVICES in items or (attributes.maxlen is not None and len(items) >= attributes.maxlen):
                return
            items[CUDA_SAMPLED_DEVICES] = tuple(d for d in range(mask.bit_length()) if mask >> d & 1)

    def on_end(self, span: ReadableSpan) -> None:
        try:
            state = self._thread.state
        except AttributeError:
            state = self._state()
        writer = state.writer
        if writer is None:
            return
        context, parent = _context_and_parent(span)
        trace_id, span_id, is_remote = _ids(parent) if parent is not None else (0, 0, True)
        if is_remote:  # a local root ended (no parent, or a remote one)
            roots = state.roots
            ended = _ids(context)[1]
            if ended in roots:
                roots.remove(ended)
            if len(roots) == 1:  # down to one: its spans publish again from their next start or end
                state.root = roots[0]
                state.root_bytes = state.root.to_bytes(8, "big")
                if state.devices is not None and state.dark:
                    state.devices[0] = 0  # it gets the devices of launches made while it is alone again
            elif not roots:  # the thread is in no span now
                state.root, state.root_bytes = 0, NO_ROOT
            else:
                return  # still more than one: nothing published
            state.dark = False
            writer.write(NO_TRACE, 0, NO_ROOT)
        elif state.dark:
            return
        elif trace_id == state.trace_id:
            writer.write(state.trace_bytes, span_id, state.root_bytes)
        else:  # spans of two traces interleaved on this thread
            writer.write(trace_id.to_bytes(16, "big"), span_id, state.root_bytes)

    def shutdown(self) -> None:
        if self._hooks is not None:
            self._hooks.shutdown()
            return
        state = self._state()
        if state.writer is not None:
            state.writer.write(NO_TRACE, 0, NO_ROOT)

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

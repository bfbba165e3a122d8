# SPDX-License-Identifier: Apache-2.0
"""The span processor publishes each thread's active span in the real native table, read back as the agent reads it."""

from __future__ import annotations

import asyncio
import ctypes
import os
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, set_span_in_context

from otel_gpu.instrumentation import LIBRARY_PATH, PROFILE_ID_ATTRIBUTE, SpanContextProcessor, SpanContextTable


@pytest.fixture
def traced() -> Iterator[tuple[TracerProvider, InMemorySpanExporter, SpanContextTable]]:
    table = SpanContextTable.shared()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SpanContextProcessor(table))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter, table
    provider.shutdown()


def _ids(table: SpanContextTable) -> tuple[int, int, int]:
    reading = table.read(threading.get_native_id())
    assert reading is not None
    return reading.trace_id, reading.span_id, reading.local_root_span_id


def test_library_is_built_with_the_table_symbol() -> None:
    symbols = subprocess.run(["nm", "-D", str(LIBRARY_PATH)], capture_output=True, text=True, check=True).stdout
    assert " D otel_gpu_span_context_table" in symbols


def test_nested_spans_publish_the_active_one_and_restore_the_parent(traced) -> None:
    provider, exporter, table = traced
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("root") as root:
        r = root.get_span_context()
        assert _ids(table) == (r.trace_id, r.span_id, r.span_id)
        with tracer.start_as_current_span("child") as child:
            c = child.get_span_context()
            assert _ids(table) == (r.trace_id, c.span_id, r.span_id)
        assert _ids(table) == (r.trace_id, r.span_id, r.span_id)
    assert _ids(table) == (0, 0, 0)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert spans["root"].attributes[PROFILE_ID_ATTRIBUTE] == format(r.span_id, "016x")
    assert spans["root"].attributes["thread.id"] == threading.get_native_id()
    assert spans["root"].attributes["process.pid"] > 0
    assert PROFILE_ID_ATTRIBUTE not in spans["child"].attributes


def test_a_span_under_a_remote_parent_is_a_local_root(traced) -> None:
    provider, exporter, table = traced
    remote = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1))
    parent = set_span_in_context(NonRecordingSpan(remote))
    with provider.get_tracer("t").start_as_current_span("served", context=parent) as s:
        assert _ids(table) == (0xABC, s.get_span_context().span_id, s.get_span_context().span_id)
    assert _ids(table) == (0, 0, 0)
    assert PROFILE_ID_ATTRIBUTE in exporter.get_finished_spans()[0].attributes


def test_threads_each_have_their_own_record_and_free_it_at_exit(traced) -> None:
    provider, _, table = traced
    tracer = provider.get_tracer("t")
    seen: dict[str, tuple[int, int, int, int]] = {}
    inside = threading.Barrier(2)
    tids: dict[str, int] = {}

    def work(name: str) -> None:
        tids[name] = threading.get_native_id()
        with tracer.start_as_current_span(name) as span:
            inside.wait()
            ids = _ids(table)
            seen[name] = (*ids, span.get_span_context().span_id)
            inside.wait()

    threads = [threading.Thread(target=work, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name in ("a", "b"):
        _, span_id, root, expected = seen[name]
        assert span_id == expected == root
    assert seen["a"][1] != seen["b"][1]
    for tid in tids.values():
        # join() returns before the OS thread runs its destructors; the slot is free once the task is gone
        for _ in range(1000):
            if not os.path.exists(f"/proc/self/task/{tid}"):
                break
            time.sleep(0.01)
        assert table.read(tid) is None


def test_the_instrumentor_entry_point_adds_the_processor() -> None:
    code = (
        "from importlib.metadata import entry_points\n"
        "from opentelemetry import trace\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "import threading\n"
        "trace.set_tracer_provider(TracerProvider())\n"
        "(ep,) = [e for e in entry_points(group='opentelemetry_instrumentor') if e.name == 'otel_gpu']\n"
        "ep.load()().instrument()\n"
        "from otel_gpu.instrumentation import SpanContextTable\n"
        "with trace.get_tracer('t').start_as_current_span('s') as s:\n"
        "    r = SpanContextTable.shared().read(threading.get_native_id())\n"
        "    assert r.span_id == s.get_span_context().span_id, r\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr


@pytest.mark.parametrize(
    ("limits", "given"),
    [
        ({}, {}),  # the fast path
        ({}, {"http.route": "/step", "rank": 3}),  # the fast path, after the span's own attributes
        ({"max_span_attributes": 3}, {}),  # exactly room for the three: the fast path
        ({"max_span_attributes": 4}, {"a": 1, "b": 2}),  # the SDK drops the oldest: its own call runs
        ({"max_span_attributes": 0}, {}),  # nothing kept, three counted as dropped
        ({"max_span_attribute_length": 8}, {}),  # the SDK truncates the profile id
        ({}, {"thread.id": "worker-1", "z": 0}),  # the span set one of the keys already: overwritten, moved last
    ],
)
def test_root_attributes_are_what_the_sdk_call_would_leave(limits: dict[str, int], given: dict[str, object]) -> None:
    provider = TracerProvider(span_limits=SpanLimits(**limits))
    provider.add_span_processor(SpanContextProcessor(SpanContextTable.shared()))
    span = provider.get_tracer("t").start_span("root", attributes=given)
    try:
        root = span.get_span_context().span_id
        expected = BoundedAttributes(
            span._limits.max_span_attributes, given, immutable=False,
            max_value_len=span._limits.max_span_attribute_length,
        )
        expected._set_items(
            {PROFILE_ID_ATTRIBUTE: format(root, "016x"), "process.pid": os.getpid(),
             "thread.id": threading.get_native_id()}
        )
        assert list(span.attributes.items()) == list(expected.items())
        assert span.dropped_attributes == expected.dropped
    finally:
        span.end()


def test_a_written_slot_is_left_with_an_even_seq(traced) -> None:
    provider, _, table = traced
    with provider.get_tracer("t").start_as_current_span("root"):
        pass
    tid = threading.get_native_id()
    for i in range(table.max_probe):
        index = (tid + i) & (table.slot_count - 1)
        tid_field, seq = struct.unpack_from("<II", ctypes.string_at(table.address + 16 + index * 40, 8))
        if tid_field == tid:
            assert seq % 2 == 0 and seq != 0
            return
    raise AssertionError("this thread holds no slot")


def test_a_forked_child_publishes_under_its_own_pid_and_tid() -> None:
    code = (
        "import os, threading\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from opentelemetry.sdk.trace.export import SimpleSpanProcessor\n"
        "from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter\n"
        "from otel_gpu.instrumentation import SpanContextProcessor, SpanContextTable\n"
        "table = SpanContextTable.shared()\n"
        "provider = TracerProvider()\n"
        "provider.add_span_processor(SpanContextProcessor(table))\n"
        "exporter = InMemorySpanExporter()\n"
        "provider.add_span_processor(SimpleSpanProcessor(exporter))\n"
        "tracer = provider.get_tracer('t')\n"
        "with tracer.start_as_current_span('parent'):\n"
        "    pass\n"
        "parent_tid = threading.get_native_id()\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        "    code = 1\n"
        "    try:\n"
        "        assert table.read(parent_tid) is None, 'the inherited slot is still claimed'\n"
        "        with tracer.start_as_current_span('child') as s:\n"
        "            r = table.read(threading.get_native_id())\n"
        "            assert r is not None and r.span_id == s.get_span_context().span_id, r\n"
        "        (span,) = exporter.get_finished_spans()[1:]\n"
        "        assert span.attributes['process.pid'] == os.getpid(), span.attributes\n"
        "        assert span.attributes['thread.id'] == threading.get_native_id(), span.attributes\n"
        "        code = 0\n"
        "    finally:\n"
        "        os._exit(code)\n"
        "_, status = os.waitpid(child, 0)\n"
        "assert os.waitstatus_to_exitcode(status) == 0\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr


def _device_mask(table: SpanContextTable) -> ctypes.c_uint64:
    """This thread's device mask, where the injected CUDA library sets a bit at each sampled launch inside a span."""
    tid = threading.get_native_id()
    for i in range(table.max_probe):
        index = (tid + i) & (table.slot_count - 1)
        if struct.unpack_from("<I", ctypes.string_at(table.address + 16 + index * 40, 4))[0] == tid:
            return ctypes.c_uint64.from_address(table.devices_address + 8 * index)
    raise AssertionError("this thread holds no slot")


def test_a_local_root_carries_the_devices_noted_while_it_ran_and_nothing_else_does(traced) -> None:
    provider, exporter, table = traced
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("launches"):
        mask = _device_mask(table)
        with tracer.start_as_current_span("child"):
            mask.value |= 1 << 1  # what the injected library does at a sampled launch on device 1
        mask.value |= 1 << 0
    with tracer.start_as_current_span("idle"):  # the mask still holds devices 0 and 1 from the root before
        with tracer.start_as_current_span("idle-child"):
            pass
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert spans["launches"].attributes["cuda.sampled_devices"] == (0, 1)
    for name in ("child", "idle", "idle-child"):
        assert "cuda.sampled_devices" not in spans[name].attributes, name


def test_a_root_interrupted_by_another_traces_root_carries_only_the_devices_noted_once_alone_again(traced) -> None:
    provider, exporter, table = traced
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("outer"):
        _device_mask(table).value |= 1 << 1
        with tracer.start_as_current_span("inner", context=Context()):  # a local root of another trace
            _device_mask(table).value |= 1 << 2  # (the injected library notes none while two roots are open)
        _device_mask(table).value |= 1 << 3
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert "cuda.sampled_devices" not in spans["inner"].attributes  # which root launched is not known
    assert spans["outer"].attributes["cuda.sampled_devices"] == (3,)


def test_devices_are_left_out_when_the_count_limit_is_reached(traced) -> None:
    table = SpanContextTable.shared()
    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=SpanLimits(max_span_attributes=3))
    provider.add_span_processor(SpanContextProcessor(table))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("t").start_as_current_span("full"):
        _device_mask(table).value = 1 << 3
    (span,) = exporter.get_finished_spans()
    assert set(span.attributes) == {PROFILE_ID_ATTRIBUTE, "process.pid", "thread.id"}
    provider.shutdown()


def test_the_fast_getters_read_what_the_public_ones_do(traced) -> None:
    from otel_gpu.instrumentation._processor import FAST_GETTERS, PUBLIC_GETTERS

    provider, exporter, _ = traced
    remote = set_span_in_context(NonRecordingSpan(SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1))))
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("served", context=remote) as served:
        with tracer.start_as_current_span("child") as child:
            pass
    spans = [served, child, *exporter.get_finished_spans()]  # live spans and the ended ones exporters get
    for span in spans:
        fast, public = (tuple(getter(span)) for getter in (FAST_GETTERS[0], PUBLIC_GETTERS[0]))
        assert fast == public and fast[0] is not None
        for context in (c for c in fast if c is not None):
            assert tuple(FAST_GETTERS[1](context)) == tuple(PUBLIC_GETTERS[1](context))


def test_while_two_local_roots_are_open_on_a_thread_nothing_is_published(traced) -> None:
    provider, _, table = traced
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("outer") as outer:
        o = outer.get_span_context()
        other = tracer.start_span("other root", context=Context())  # a local root of another trace, not current
        assert _ids(table) == (0, 0, 0)
        with tracer.start_as_current_span("inner", context=set_span_in_context(other)) as inner:
            with tracer.start_as_current_span("child of outer", context=set_span_in_context(outer)):
                with tracer.start_as_current_span("child of inner", context=set_span_in_context(inner)):
                    assert _ids(table) == (0, 0, 0)
                assert _ids(table) == (0, 0, 0)
            assert _ids(table) == (0, 0, 0)
        other.end()
        assert _ids(table) == (0, 0, 0)  # down to one root: published again from its next span event
        with tracer.start_as_current_span("child") as child:
            assert _ids(table) == (o.trace_id, child.get_span_context().span_id, o.span_id)
        assert _ids(table) == (o.trace_id, o.span_id, o.span_id)
    assert _ids(table) == (0, 0, 0)


def test_asyncio_tasks_in_their_own_traces_on_one_thread_are_never_published_as_each_other(traced) -> None:
    """Two tasks, each in a local root of its own, interleave on the event loop's thread: every record read inside
    a task names that task's trace or nothing, never the other task's."""
    provider, _, table = traced
    tracer = provider.get_tracer("t")
    readings: dict[str, list[tuple[int, int, int]]] = {"a": [], "b": []}
    traces: dict[str, int] = {}

    async def task(name: str, delay_s: float) -> None:
        with tracer.start_as_current_span(f"root-{name}", context=Context()) as root:
            traces[name] = root.get_span_context().trace_id
            for _ in range(5):
                with tracer.start_as_current_span(f"step-{name}"):
                    readings[name].append(_ids(table))
                    await asyncio.sleep(delay_s)
                    readings[name].append(_ids(table))
                readings[name].append(_ids(table))
        readings[name].append(_ids(table))

    async def main() -> None:
        await task("warm", 0)  # alone on the thread: published
        await asyncio.gather(task("a", 0.001), task("b", 0.0015))

    readings["warm"] = []
    asyncio.run(main())
    assert all(trace_id == traces["warm"] for trace_id, _, _ in readings["warm"][:-1])
    for name, other in (("a", "b"), ("b", "a")):
        assert readings[name], name
        assert all(trace_id in (0, traces[name]) for trace_id, _, _ in readings[name]), (name, readings[name])
        assert not any(trace_id == traces[other] for trace_id, _, _ in readings[name])
    # the task that finishes last is alone again at the end: its spans are published once more
    assert any(trace_id == traces["b"] for trace_id, _, _ in readings["b"])
    assert _ids(table) == (0, 0, 0)

# SPDX-License-Identifier: Apache-2.0
"""The span processor's hooks in C (_hooks.abi3.so): taken where built, the Python hooks where not, and the same
records, attributes and devices either way, on each CPython the one build serves."""

from __future__ import annotations

import ctypes
import itertools
import os
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.context import Context
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, set_span_in_context

from otel_gpu.instrumentation import SpanContextProcessor, SpanContextTable, _processor

REPO = Path(__file__).resolve().parents[2]
EXTENSION = REPO / "otel_gpu" / "instrumentation" / "_hooks.abi3.so"
PYENV = Path("/root/.pyenv/versions")


def test_the_extension_is_built_for_the_stable_abi_and_exports_only_its_init() -> None:
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(EXTENSION)], capture_output=True, text=True,
                             check=True).stdout
    exported = [line.split()[-1] for line in symbols.splitlines() if line.split()[1] in "TDB"]
    assert exported == ["PyInit__hooks"]


def test_each_processor_takes_the_hooks_of_its_path(hooks_path: str) -> None:
    code = (
        "from otel_gpu.instrumentation import SpanContextProcessor\n"
        "p = SpanContextProcessor()\n"
        "print('c' if getattr(p.on_start, '__self__', None) is p._hooks is not None else 'python')\n"
    )
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert child.stdout.strip() == hooks_path, child.stderr
    processor = SpanContextProcessor()
    hooks = (processor.on_start, processor._on_ending, processor.on_end)
    if hooks_path == "c":
        assert all(type(hook).__name__ == "builtin_function_or_method" for hook in hooks)
        assert all(hook.__self__ is processor._hooks for hook in hooks)
    else:
        assert processor._hooks is None
        assert [hook.__func__ for hook in hooks] == [  # type: ignore[attr-defined]
            SpanContextProcessor.on_start, SpanContextProcessor._on_ending, SpanContextProcessor.on_end]


def test_a_python_that_cannot_import_the_extension_runs_the_python_hooks() -> None:
    code = (
        "import sys, threading\n"
        "sys.modules['otel_gpu.instrumentation._hooks'] = None  # import fails, as without the .so or on PyPy\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from otel_gpu.instrumentation import SpanContextProcessor, SpanContextTable, _processor\n"
        "provider = TracerProvider()\n"
        "processor = SpanContextProcessor()\n"
        "provider.add_span_processor(processor)\n"
        "assert not _processor.C_HOOKS and processor._hooks is None and 'on_start' not in vars(processor)\n"
        "with provider.get_tracer('t').start_as_current_span('s') as s:\n"
        "    r = SpanContextTable.shared().read(threading.get_native_id())\n"
        "    assert r.span_id == r.local_root_span_id == s.get_span_context().span_id, r\n"
        "print('ok')\n"
    )
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert child.stdout.strip() == "ok", child.stderr


class _CountingIds(IdGenerator):
    """The same ids on every run, so the two paths' records can be compared whole."""

    def __init__(self) -> None:
        self._next = itertools.count(1)

    def generate_span_id(self) -> int:
        return 0x1000_0000_0000_0000 + next(self._next)

    def generate_trace_id(self) -> int:
        return 0xABCD << 100 | next(self._next)


def _mask(table: SpanContextTable) -> ctypes.c_uint64:
    tid = threading.get_native_id()
    for i in range(table.max_probe):
        index = (tid + i) & (table.slot_count - 1)
        if struct.unpack_from("<I", ctypes.string_at(table.address + 16 + index * 40, 4))[0] == tid:
            return ctypes.c_uint64.from_address(table.devices_address + 8 * index)
    raise AssertionError("this thread holds no slot")


def _scenario(c_hooks: bool) -> list[Any]:
    """Everything a path publishes and sets over nested, remote-parented, interleaved, limited and multi-provider
    spans on two threads: each record read after each step, then every exported span's attributes."""
    table = SpanContextTable.shared()
    seen: list[Any] = []
    exporter = InMemorySpanExporter()
    threads = {threading.get_native_id(): "this thread"}

    def record(step: str) -> None:
        reading = table.read(threading.get_native_id())
        seen.append((step, None if reading is None else reading.__dict__ | {"tid": "thread"}))

    def provider(**limits: int) -> TracerProvider:
        made = TracerProvider(id_generator=_CountingIds(), span_limits=SpanLimits(**limits))
        made.add_span_processor(SpanContextProcessor(table))
        made.add_span_processor(SimpleSpanProcessor(exporter))
        return made

    _processor.C_HOOKS, before = c_hooks, _processor.C_HOOKS
    try:
        providers = [provider(), provider(), provider(max_span_attributes=4), provider(max_span_attribute_length=8)]
    finally:
        _processor.C_HOOKS = before
    tracer, other, limited, short = (p.get_tracer("t") for p in providers)
    with tracer.start_as_current_span("root"):
        record("root")
        with tracer.start_as_current_span("child"):
            record("child")
            _mask(table).value |= 1 << 1
            with tracer.start_as_current_span("grandchild"):
                record("grandchild")
            record("grandchild ended")
        _mask(table).value |= 1 << 0
        record("child ended")
        with tracer.start_as_current_span("another trace's root", context=Context()):
            record("interrupting root")
            with other.start_as_current_span("other provider's root", context=Context()):  # another processor
                record("other provider's root")
            record("other provider's root ended")
            _mask(table).value |= 1 << 5
        record("interrupting root ended")
        _mask(table).value |= 1 << 4
    record("root ended")
    with tracer.start_as_current_span("launches"):
        with tracer.start_as_current_span("launching child"):
            _mask(table).value |= 1 << 1
        _mask(table).value |= 1 << 0
    remote = set_span_in_context(NonRecordingSpan(SpanContext(0xABC, 0xDEF, is_remote=True,
                                                              trace_flags=TraceFlags(1))))
    with tracer.start_as_current_span("served", context=remote):
        record("served")
    outer = tracer.start_span("outer")
    with tracer.start_as_current_span("inner", context=Context()) as inner:
        with tracer.start_as_current_span("child of outer", context=set_span_in_context(outer)):
            with tracer.start_as_current_span("child of inner", context=set_span_in_context(inner)):
                record("child of inner")
            record("child of inner ended")
        record("child of outer ended")
    outer.end()
    with limited.start_as_current_span("full", attributes={"a": 1, "b": 2}):
        _mask(table).value = 1 << 3
    with short.start_as_current_span("short", attributes={"thread.id": "worker-1"}):
        pass
    def work() -> None:
        threads[threading.get_native_id()] = "worker thread"
        with tracer.start_as_current_span("worker"):
            record("worker")

    worker = threading.Thread(target=work)
    worker.start(), worker.join()
    for made in providers:
        made.shutdown()
    record("shut down")
    for span in exporter.get_finished_spans():
        attributes = [(k, threads.get(v, v) if k == "thread.id" else v) for k, v in span.attributes.items()]
        seen.append((span.name, attributes, span.dropped_attributes))
    return seen


@pytest.mark.both_paths
def test_both_paths_publish_the_same_records_and_set_the_same_attributes() -> None:
    c, python = _scenario(c_hooks=True), _scenario(c_hooks=False)
    assert c == python
    names = {entry[0]: entry[1] for entry in python if len(entry) == 3}
    # the scenario reaches what it means to compare
    assert ("cuda.sampled_devices", (0, 1)) in names["launches"]
    records = {entry[0]: entry[1] for entry in python if len(entry) == 2}
    assert records["interrupting root"]["span_id"] == 0  # two local roots open: nothing published
    assert records["interrupting root ended"]["span_id"] == 0  # nor before the remaining root's next span event
    assert "cuda.sampled_devices" not in dict(names["another trace's root"])
    assert ("cuda.sampled_devices", (4,)) in names["root"]  # only launches made once it was alone again


@pytest.mark.both_paths
@pytest.mark.parametrize("version", ["3.10.13", "3.12.1", "3.13.0"])
def test_the_one_build_runs_on_other_cpythons(version: str) -> None:
    python = PYENV / version / "bin" / "python"
    assert python.exists(), f"pyenv's CPython {version} is part of the test machine (env: machines/python.md)"
    site = next((REPO / ".venv" / "lib").glob("python3*/site-packages"))  # the SDK and its pure-Python dependencies
    code = (
        "import ctypes, os, sys, threading, types\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from opentelemetry.sdk.trace.export import SimpleSpanProcessor\n"
        "from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter\n"
        "from otel_gpu.instrumentation import SpanContextProcessor, SpanContextTable\n"
        "table = SpanContextTable.shared()\n"
        "processor, exporter, provider = SpanContextProcessor(table), InMemorySpanExporter(), TracerProvider()\n"
        "assert processor.on_start.__self__ is processor._hooks is not None\n"
        "provider.add_span_processor(processor)\n"
        "provider.add_span_processor(SimpleSpanProcessor(exporter))\n"
        "tracer, tid = provider.get_tracer('t'), threading.get_native_id()\n"
        "def ids():\n"
        "    r = table.read(threading.get_native_id())\n"
        "    return r.trace_id, r.span_id, r.local_root_span_id\n"
        "with tracer.start_as_current_span('root') as root:\n"
        "    r = root.get_span_context()\n"
        "    with tracer.start_as_current_span('child') as child:\n"
        "        assert ids() == (r.trace_id, child.get_span_context().span_id, r.span_id)\n"
        "        index = (table._lib.otel_gpu_span_context_slot() - table.address - 16) // 40\n"
        "        ctypes.c_uint64.from_address(table.devices_address + 8 * index).value = 0b101  # devices 0 and 2\n"
        "    assert ids() == (r.trace_id, r.span_id, r.span_id)\n"
        "assert ids() == (0, 0, 0)\n"
        "spans = {s.name: s.attributes for s in exporter.get_finished_spans()}\n"
        "assert spans['root']['pyroscope.profile.id'] == format(r.span_id, '016x'), spans\n"
        "assert spans['root']['process.pid'] == os.getpid() and spans['root']['thread.id'] == tid, spans\n"
        "assert spans['root']['cuda.sampled_devices'] == (0, 2) and 'pyroscope.profile.id' not in spans['child']\n"
        "if os.fork() == 0:\n"
        "    with tracer.start_as_current_span('forked') as s:\n"
        "        ok = ids()[1] == s.get_span_context().span_id and table.read(tid) is None\n"
        "    os._exit(0 if ok and exporter.get_finished_spans()[-1].attributes['process.pid'] == os.getpid() else 1)\n"
        "assert os.waitstatus_to_exitcode(os.wait()[1]) == 0, 'the forked child'\n"
        "print(sys.version_info[:2], 'ok')\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{REPO}"}
    child = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert child.stdout.strip().endswith("ok"), child.stderr


TWICE_C = """
#include <pthread.h>
static void *call_twice(void *f) { ((void (*)(void))f)(); ((void (*)(void))f)(); return 0; }
void run_twice(void (*f)(void)) { pthread_t t; pthread_create(&t, 0, call_twice, (void *)f); pthread_join(t, 0); }
"""


def test_a_foreign_thread_that_attaches_twice_gets_a_fresh_state_each_time(tmp_path: Path, hooks_path: str) -> None:
    """A thread Python did not start gets a new Python thread state at each call in (PyGILState_Ensure) and loses it
    at each return, and with it the processor's per-thread state: the next call must not use the freed one."""
    library = tmp_path / "twice.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), "-x", "c", "-", "-lpthread"], input=TWICE_C,
                   text=True, check=True)
    code = (
        "import ctypes, sys, threading\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from otel_gpu.instrumentation import SpanContextProcessor, SpanContextTable\n"
        "table, provider = SpanContextTable.shared(), TracerProvider()\n"
        "provider.add_span_processor(SpanContextProcessor(table))\n"
        "tracer, seen = provider.get_tracer('t'), []\n"
        "def call():\n"
        "    litter = [(i, i, i, i, i, i) for i in range(20000)]  # reuses freed blocks of a State's size class\n"
        "    with tracer.start_as_current_span('root') as root:\n"
        "        with tracer.start_as_current_span('child') as child:\n"
        "            r = table.read(threading.get_native_id())\n"
        "            ids = (r.span_id, r.local_root_span_id)\n"
        "            seen.append(ids == (child.get_span_context().span_id, root.get_span_context().span_id))\n"
        "callback = ctypes.CFUNCTYPE(None)(call)\n"
        "ctypes.CDLL(sys.argv[1]).run_twice(callback)\n"
        "print(seen)\n"
    )
    child = subprocess.run([sys.executable, "-c", code, str(library)], capture_output=True, text=True, timeout=60)
    assert child.returncode == 0 and child.stdout.strip() == "[True, True]", (child.returncode, child.stderr)

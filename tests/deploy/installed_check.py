# SPDX-License-Identifier: Apache-2.0
"""Run with ``python -c`` by the interpreter of an installed package (a wheel's virtual environment, the image), from
outside the repository: one span through the span processor, then, as one JSON line, where the package and its
native parts were found, whether the processor ran the C hooks and whether the span reached the table."""

import json
import threading

from opentelemetry.sdk.trace import TracerProvider

import otel_gpu
from otel_gpu.cuda import inject
from otel_gpu.ebpf import PROGRAMS_DIR
from otel_gpu.instrumentation import LIBRARY_PATH, SpanContextProcessor, SpanContextTable, _processor
from otel_gpu.symbolize import native_symtab
from otel_gpu.unwind import native_table

processor = SpanContextProcessor()
provider = TracerProvider()
provider.add_span_processor(processor)
with provider.get_tracer("installed-check").start_as_current_span("inside") as span:
    reading = SpanContextTable.shared().read(threading.get_native_id())
hooks = _processor._hooks
print(json.dumps({
    "package": otel_gpu.__file__,
    "hooks": hooks.__file__ if hooks is not None else None,
    "c_hooks": processor._hooks is not None and processor.on_start.__self__ is processor._hooks,
    "table": str(LIBRARY_PATH),
    "published": reading is not None and reading.span_id == span.get_span_context().span_id,
    "bpf_objects": sorted(str(p) for p in PROGRAMS_DIR.glob("*.bpf.o")),
    "inject": str(inject.library_path()),
    "unwind": native_table.available(),
    "symtab": native_symtab.LIBRARY.get() is not None,
}))

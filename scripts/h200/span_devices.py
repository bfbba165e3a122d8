# SPDX-License-Identifier: Apache-2.0
"""Run THERE: the GPU devices a local-root span launched work on, as the span processor records them, on the real
driver and CUPTI (issue 15 item 3). An instrumented PyTorch program under ``otel-gpu inject`` runs three local roots:
one that launches on cuda:0, one that launches nothing, one that launches on every visible GPU; the exported spans'
attributes are printed and checked (device attributes present on the launching roots only, naming the right devices).

Usage: span_devices.py OUT.md
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, sys
import torch
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otel_gpu.instrumentation import SpanContextProcessor

provider = TracerProvider()
provider.add_span_processor(SpanContextProcessor())
exporter = InMemorySpanExporter()
provider.add_span_processor(SimpleSpanProcessor(exporter))
tracer = provider.get_tracer("span-devices")
devices = torch.cuda.device_count()
x = torch.ones(1024, device="cuda:0")
torch.cuda.synchronize()
for round in range(3):
    with tracer.start_as_current_span("on_gpu0"):
        for _ in range(50):
            x.mul_(1.0001)
        torch.cuda.synchronize()
    with tracer.start_as_current_span("cpu_only"):
        sum(i * i for i in range(100000))
    with tracer.start_as_current_span("on_every_gpu"):
        for d in range(devices):
            y = torch.ones(1024, device=f"cuda:{d}")
            y.add_(1)
            torch.cuda.synchronize(d)
spans = [{"name": s.name, "attributes": {k: (list(v) if isinstance(v, tuple) else v) for k, v in s.attributes.items()}}
         for s in exporter.get_finished_spans()]
print(json.dumps({"devices": devices, "spans": spans}))
"""


def main() -> int:
    out = Path(sys.argv[1])
    proc = subprocess.run([sys.executable, "-m", "otel_gpu", "inject", "--", sys.executable, "-c", CHILD],
                          capture_output=True, text=True, timeout=240, cwd=REPO)
    lines = ["# Span devices on the real driver", "", f"exit {proc.returncode}", ""]
    try:
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        lines += ["no result; stderr:", "```", proc.stderr[-3000:], "```"]
        out.write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
        return 1
    lines.append(f"visible GPUs: {result['devices']}")
    lines += ["", "| span | device-like attributes | all attribute keys |", "|---|---|---|"]
    for span in result["spans"]:
        attrs = span["attributes"]
        found = {k: v for k, v in attrs.items() if any(word in k for word in ("gpu", "cuda", "device"))}
        lines.append(f"| {span['name']} | {json.dumps(found)} | {', '.join(sorted(attrs))} |")
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

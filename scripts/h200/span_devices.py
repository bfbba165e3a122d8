#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""GPU devices on local-root spans, on a real GPU (issue 15 item 3; scripts/h200/run.sh step "span_devices").

    python3 scripts/h200/span_devices.py OUT.md [--seconds 40]        (about a minute)

An instrumented PyTorch program (the SDK with ``SpanContextProcessor``) runs under ``otel-gpu inject`` beside the
agent (GPU-time profiling only, local pprof files). On one thread it alternates two local roots: ``gpu-step`` (a child
``forward`` runs matmuls on every visible GPU, then synchronizes each) and ``cpu-step`` (Python arithmetic, no GPU).
Checked from the program's finished spans and the agent's gpu_time pprof files:
- ``cuda.sampled_devices`` is only ever on ``gpu-step`` roots, never on a child or a ``cpu-step`` root;
- every device a root names is a device its children's gpu_time samples (``span_id`` label) are on, and every root
  whose children have gpu_time samples names their devices (the attribute and the profiles tell the same story);
- the share of ``gpu-step`` roots that carry the attribute (the library samples launches in windows, so a share near
  the sampling fraction, not all of them).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from otel_gpu import semconv  # noqa: E402
from tests.profiles import pprof_proto  # noqa: E402

PROGRAM = r"""
import json, sys, time
import torch
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otel_gpu.instrumentation import SpanContextProcessor

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SpanContextProcessor())
provider.add_span_processor(SimpleSpanProcessor(exporter))
tracer = provider.get_tracer("span_devices")
devices = list(range(torch.cuda.device_count()))
xs = [torch.randn(2048, 2048, device=f"cuda:{d}") for d in devices]
end = time.time() + float(sys.argv[2])
while time.time() < end:
    with tracer.start_as_current_span("gpu-step"):
        with tracer.start_as_current_span("forward"):
            for x in xs:
                for _ in range(10):
                    x @ x
            for d in devices:
                torch.cuda.synchronize(d)
    with tracer.start_as_current_span("cpu-step"):
        total = sum(range(20000))
spans = []
for span in exporter.get_finished_spans():
    parent = span.parent.span_id if span.parent is not None else 0
    spans.append([span.name, f"{span.context.span_id:016x}", f"{parent:016x}" if parent else "",
                  list((span.attributes or {}).get("cuda.sampled_devices", ()))])
with open(sys.argv[1], "w") as f:
    json.dump({"devices": devices, "spans": spans}, f)
"""


def gpu_samples(out: Path) -> dict[str, Counter[str]]:
    """span_id -> Counter of cuda.device over the agent's gpu_time pprof files (sample values summed)."""
    found: dict[str, Counter[str]] = defaultdict(Counter)
    for path in sorted(out.glob("profile-gpu_time-*.pb.gz")):
        profile = pprof_proto.decode(path.read_bytes())
        strings = profile.string_table
        for sample in profile.sample:
            labels = {strings[label.key]: (strings[label.str] if label.str else str(label.num))
                      for label in sample.label}
            span = labels.get(semconv.PPROF_LABEL_SPAN_ID)
            device = labels.get(semconv.CUDA_DEVICE, labels.get(semconv.CUDA_DEVICE.replace(".", "_"), "?"))
            if span:
                found[span][device] += sum(sample.value)
    return found


def analyse(visible: list[int], spans: list[list], samples: dict[str, Counter[str]]) -> tuple[list[str], bool]:
    """The report's table and checks from the program's spans ([name, span id, parent id, devices]) and the
    gpu_time samples by span id; True when every check passes."""
    by_id = {span_id: (name, parent, devices) for name, span_id, parent, devices in spans}
    per_root: dict[str, Counter[str]] = defaultdict(Counter)  # gpu-step root -> devices of its children's samples
    for span_id, devices in samples.items():
        name, parent, _ = by_id.get(span_id, ("?", "", []))
        per_root[parent if name == "forward" else span_id].update(devices)
    counts = Counter(name for name, _, _, _ in spans)
    carrying = Counter(name for name, _, _, devices in spans if devices)
    values = Counter((name, tuple(devices)) for name, _, _, devices in spans if devices)
    wrong_place = sum(n for (name, _), n in values.items() if name != "gpu-step")
    disagree = [(span_id, devices, dict(per_root.get(span_id, {}))) for name, span_id, _, devices in spans
                if name == "gpu-step" and set(map(str, devices)) != set(per_root.get(span_id, {}))]
    unmatched = sum(1 for span_id in samples if span_id not in by_id)
    lines = [f"Visible devices: {visible}.", "",
             "| span | count | with cuda.sampled_devices | values |", "|---|---|---|---|"]
    for name in sorted(counts):
        shown = ", ".join(f"{list(v)} x{n}" for (k, v), n in sorted(values.items()) if k == name) or "-"
        lines.append(f"| {name} | {counts[name]} | {carrying[name]} ({100 * carrying[name] / counts[name]:.2f} %) "
                     f"| {shown} |")
    lines += ["", f"gpu_time samples with a span_id: {len(samples)} spans ({unmatched} not among the program's spans); "
              f"gpu-step roots whose children have gpu_time samples: {len(per_root)}",
              f"Attribute on a span other than a gpu-step root: {wrong_place}",
              f"gpu-step roots where the attribute and the children's gpu_time devices differ: {len(disagree)}"]
    lines += [f"  {span_id}: attribute {devices}, samples {found}" for span_id, devices, found in disagree[:10]]
    return lines, wrong_place == 0 and not disagree and carrying["gpu-step"] > 0


def main(argv: list[str]) -> int:
    report = Path(argv[1])
    seconds = float(argv[argv.index("--seconds") + 1]) if "--seconds" in argv else 40.0
    work = Path(tempfile.mkdtemp(prefix="span-devices-"))
    out, spans_file, program = work / "agent", work / "spans.json", work / "program.py"
    program.write_text(PROGRAM)
    agent = subprocess.Popen([sys.executable, "-m", "otel_gpu", "run", "--duration", str(seconds + 25),
                              "--no-cpu-profiling", "--no-gpu-metrics", "--profiling-interval", "5",
                              "--output-dir", str(out), "--console", "off"],
                             stdout=subprocess.DEVNULL, stderr=open(work / "agent.log", "w"))
    time.sleep(8)
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "otel_gpu", "inject", "--", sys.executable, str(program),
                          str(spans_file), str(seconds)], capture_output=True, text=True, timeout=seconds + 120)
    program_s = time.monotonic() - started
    agent.send_signal(2)
    try:
        agent.wait(timeout=30)
    except subprocess.TimeoutExpired:
        agent.kill()
    log = (work / "agent.log").read_text()
    lines = [f"# GPU devices on local-root spans ({time.strftime('%Y-%m-%d %H:%M')})", "",
             f"`python3 scripts/h200/span_devices.py OUT.md --seconds {seconds:g}`; program exit {run.returncode}, "
             f"{program_s:.1f} s; agent exit {agent.returncode}", ""]
    if run.returncode != 0 or not spans_file.exists():
        lines += ["FAIL: the program did not finish", "```", run.stderr[-3000:], "```", "```", log[-3000:], "```"]
        report.write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
        return 1
    data = json.loads(spans_file.read_text())
    found, ok = analyse(data["devices"], data["spans"], gpu_samples(out))
    lines += found
    lines += ["", f"**{'PASS' if ok else 'FAIL'}**", "", "Agent log (warnings):", "```"]
    lines += [line for line in log.splitlines() if "WARNING" in line or "ERROR" in line or "cost" in line][:20]
    lines += ["```"]
    report.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))

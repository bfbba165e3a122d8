# SPDX-License-Identifier: Apache-2.0
"""Traces to profiles end to end (root + BTF): an instrumented program with nested spans on two threads burns CPU
and launches and waits on the fake CUDA stack inside known spans; its SDK sends the spans, and the agent's CPU and
GPU-time sources (real eBPF, real injected library) with the OTLP/HTTP profile exporter send the profiles, to one
in-process receiver. Every linked sample names the local root (with its pyroscope.profile.id) of a span the receiver
got, in every profile type, and samples outside spans carry no link."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from collections import defaultdict

import pytest
from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import ExportProfilesServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_gpu.config import ProfilingConfig
from otel_gpu.cpu.source import CPUProfileSource
from otel_gpu.cuda.source import GPUTimeSource
from otel_gpu.exporters.queue import Outcome
from otel_gpu.exporters.otlp_profiles import OTLPHttpProfileExporter
from otel_gpu.procfs import ProcessResolver
from otel_gpu.profiles.model import ProfileBatch
from tests.cuda.test_gpu_time_fake_cuda import FAKES, LIBRARY
from tests.exporters.receivers import HttpReceiver
from tests.instrumentation.test_gpu_span_context import SPAN_WORKLOAD
from tests.profiles.pyroscope_rules import profile_type_ids

pytestmark = [pytest.mark.root, pytest.mark.usefixtures("other_agent")]


def test_spans_and_their_cpu_gpu_time_and_sync_wait_samples_meet_at_the_receiver() -> None:
    receiver = HttpReceiver().start()
    cpu = CPUProfileSource(ProfilingConfig(frequency_hz=199), ProcessResolver())
    gpu = GPUTimeSource(rescan_interval_s=0.05, full_rescan_s=0.05)
    env = dict(os.environ, CUDA_INJECTION64_PATH=str(LIBRARY), OTEL_GPU_CUPTI_PATH=str(FAKES / "libcupti.so"),
               OTEL_GPU_OVERHEAD_BUDGET="0.05", OTEL_SERVICE_NAME="trainer")
    batches: list[ProfileBatch] = []
    cpu.open()
    gpu.open()
    try:
        workload = subprocess.Popen(
            [sys.executable, str(SPAN_WORKLOAD), str(FAKES / "libcuda.so.1"), str(FAKES / "workload.py"),
             "--steps", "60", "--busy-ms", "10", "--otlp-traces", f"http://127.0.0.1:{receiver.port}/v1/traces"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        while workload.poll() is None:
            time.sleep(0.3)
            batches += cpu.drain()
        _, stderr = workload.communicate(timeout=60)
        assert workload.returncode == 0, stderr
        time.sleep(0.3)
        batches += cpu.drain() + gpu.drain()
    finally:
        cpu.close()
        gpu.close()
    exporter = OTLPHttpProfileExporter(f"http://127.0.0.1:{receiver.port}/v1development/profiles")
    # other processes on the machine are sampled too: send only the workload's program. Its pid first ran this test's
    # fork (between fork and exec), a program of its own that a sample may have caught: never more than a moment
    before_exec = [(batch.type.sample_type, p) for batch in batches for p in batch.processes
                   if p.process.pid == workload.pid and str(SPAN_WORKLOAD) not in p.process.command_args]
    assert all(kind == "samples" for kind, _ in before_exec), before_exec  # CPU samples only: no CUDA before exec
    assert sum(s.value for _, p in before_exec for s in p.samples) <= 5, before_exec
    for batch in batches:
        ours = tuple(p for p in batch.processes
                     if p.process.pid == workload.pid and str(SPAN_WORKLOAD) in p.process.command_args)
        for payload in exporter.payloads(dataclasses.replace(batch, processes=ours)) if ours else ():
            assert exporter.send(payload).outcome is Outcome.OK
    receiver.stop()

    spans: dict[str, dict[str, object]] = {}
    for record in receiver.requests:
        if record.path == "/v1/traces":
            request = ExportTraceServiceRequest.FromString(record.decoded_body())
            for rs in request.resource_spans:
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        attrs = {a.key: a.value for a in span.attributes}
                        spans[span.span_id.hex()] = {"name": span.name, "trace": span.trace_id.hex(),
                                                     "profile_id": attrs.get("pyroscope.profile.id")}
    assert {s["name"] for s in spans.values()} == {"outer-a", "inner-a", "outer-b", "inner-b"}
    for span_id, span in spans.items():  # local roots carry their own span id for Grafana
        if str(span["name"]).startswith("outer-"):
            profile_id = span["profile_id"]
            assert profile_id is not None and profile_id.string_value == span_id  # type: ignore[attr-defined]

    linked: dict[str, set[str]] = defaultdict(set)
    unlinked: dict[str, int] = defaultdict(int)
    for record in receiver.requests:
        if record.path != "/v1development/profiles":
            continue
        request = ExportProfilesServiceRequest.FromString(record.decoded_body())
        (type_id,) = set(profile_type_ids(request))
        links = request.dictionary.link_table
        for rp in request.resource_profiles:
            service = {a.key: a.value.string_value for a in rp.resource.attributes}["service.name"]
            assert service == "trainer"  # the process's own OTEL_SERVICE_NAME, on every profile type
            for sp in rp.scope_profiles:
                for profile in sp.profiles:
                    for sample in profile.samples:
                        link = links[sample.link_index]
                        if sample.link_index:  # to the local root: the span Grafana opens the flame graph from
                            span = spans[link.span_id.hex()]
                            assert span["trace"] == link.trace_id.hex()
                            assert span["profile_id"].string_value == link.span_id.hex()  # type: ignore[union-attr]
                            linked[type_id].add(str(span["name"]))
                        else:
                            unlinked[type_id] += 1
    assert set(linked) == {"process_cpu:cpu:nanoseconds:cpu:nanoseconds", "gpu:gpu_time:nanoseconds:gpu:nanoseconds",
                           "gpu_wait:sync_wait:nanoseconds:gpu_wait:nanoseconds"}, linked
    for type_id, names in linked.items():
        assert names == {"outer-a", "outer-b"}, (type_id, names)  # samples in inner-* too (test_gpu_span_profiles)
        assert unlinked[type_id] > 0, type_id


# SPDX-License-Identifier: Apache-2.0
"""Pyroscope: the OTLP endpoint (path, tenant, basic auth, Pyroscope's rules) and the legacy /ingest pprof API."""

from __future__ import annotations

import base64
import urllib.parse

from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2 as svc

from otel_gpu.exporters import PyroscopeIngestExporter
from otel_gpu.exporters.pyroscope import ingest_name, pyroscope_headers, pyroscope_otlp_exporter
from otel_gpu.exporters.queue import Backoff
from tests.exporters.receivers import HttpReceiver
from tests.profiles import batches, pprof_proto
from tests.profiles.pyroscope_rules import profile_type_ids

FAST = Backoff(initial_s=0.02, max_s=0.2)


def test_headers_for_tenant_and_basic_auth() -> None:
    headers = pyroscope_headers("tenant-1", "alice", "s3cret")
    assert headers["X-Scope-OrgID"] == "tenant-1"
    assert base64.b64decode(headers["Authorization"].removeprefix("Basic ")) == b"alice:s3cret"
    assert pyroscope_headers() == {}


def test_otlp_api_posts_to_v1development_profiles_with_tenant() -> None:
    receiver = HttpReceiver().start()
    exporter = pyroscope_otlp_exporter(f"http://127.0.0.1:{receiver.port}/",
                                       headers=pyroscope_headers("tenant-1", "alice", "pw"), backoff=FAST)
    try:
        exporter.export(batches.cpu_batch())
        assert receiver.wait_for(1)
    finally:
        exporter.shutdown(5.0)
        receiver.stop()
    record = receiver.requests[0]
    assert record.path == "/v1development/profiles"
    assert record.headers["x-scope-orgid"] == "tenant-1"
    assert record.headers["authorization"].startswith("Basic ")
    assert record.headers["content-type"] == "application/x-protobuf"
    request = svc.ExportProfilesServiceRequest.FromString(record.decoded_body())
    assert profile_type_ids(request) == ["process_cpu:cpu:nanoseconds:cpu:nanoseconds"] * 2


def test_ingest_api_posts_one_pprof_per_process() -> None:
    receiver = HttpReceiver().start()
    exporter = PyroscopeIngestExporter(f"http://127.0.0.1:{receiver.port}",
                                       headers=pyroscope_headers(tenant_id="t2"), backoff=FAST)
    try:
        exporter.export(batches.cpu_batch(frequency_hz=100))
        assert receiver.wait_for(2)
    finally:
        exporter.shutdown(5.0)
        receiver.stop()
    first, second = receiver.requests
    path, _, query = first.path.partition("?")
    params = dict(urllib.parse.parse_qsl(query))
    assert path == "/ingest"
    assert params["name"] == "checkout{container_id=" + "c" * 64 + "}"
    assert params["format"] == "pprof" and params["spyName"] == "otel-gpu"
    assert int(params["from"]) == batches.START_NS // 10**9
    assert int(params["until"]) == (batches.START_NS + batches.DURATION_NS) // 10**9
    assert first.headers["x-scope-orgid"] == "t2"
    profile = pprof_proto.decode(first.body)
    assert pprof_proto.stacks(profile) == {
        ("hot_loop", "main"): [30, 300_000_000], ("cold_loop", "main"): [10, 100_000_000],
        ("ksys_write", "__GI___libc_write", "main"): [5, 50_000_000]}
    assert dict(urllib.parse.parse_qsl(second.path.partition("?")[2]))["name"] == "other"
    assert pprof_proto.stacks(pprof_proto.decode(second.body)) == {("main",): [7, 70_000_000]}


def test_ingest_name_is_sanitized() -> None:
    assert ingest_name("my service/1", "") == "my_service_1"
    assert ingest_name("", "abc") == "unknown_service{container_id=abc}"


def test_ingest_sends_no_profile_for_a_process_with_no_samples() -> None:
    """A process whose GPU time went unmeasured for the whole interval has only its profile attributes, which
    /ingest does not keep: nothing is sent for it."""
    import dataclasses

    from otel_gpu.profiles.model import ProcessProfile

    gpu = batches.gpu_batch()
    other = ProcessProfile(batches.OTHER, (), (("otel_gpu.gpu_time.yielded", 1.5),))
    exporter = PyroscopeIngestExporter("http://127.0.0.1:9", backoff=FAST)
    try:
        payloads = exporter.payloads(dataclasses.replace(gpu, processes=(*gpu.processes, other)))
    finally:
        exporter.shutdown(0.1)
    assert len(payloads) == 1 and "checkout" in payloads[0].context["query"]

# SPDX-License-Identifier: Apache-2.0
"""OTLP profiles over the wire: a real in-process gRPC ProfilesService and a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import gzip
import socket
import time
from pathlib import Path

import grpc
import pytest
from google.rpc import status_pb2
from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2 as svc

from otel_gpu import selfmetrics, semconv
from otel_gpu.exporters import OTLPGrpcProfileExporter, OTLPHttpProfileExporter
from otel_gpu.exporters.queue import Backoff
from otel_gpu.profiles.otlp import encode_otlp
from tests.exporters.receivers import (
    ClosingServer,
    GrpcProfilesReceiver,
    HttpReceiver,
    free_port,
    self_signed_certificate,
)
from tests.profiles import batches
from tests.profiles.pyroscope_rules import profile_type_ids

FAST = Backoff(initial_s=0.02, max_s=0.2, jitter=0.2)


@pytest.fixture(autouse=True)
def _fresh_selfmetrics() -> None:
    selfmetrics.reset()


def _dropped(reason: str) -> float:
    return selfmetrics.total(semconv.SELF_DROPPED.name, otel_gpu__reason=reason)


def _failures(exporter: str) -> float:
    return selfmetrics.total(semconv.SELF_EXPORT_FAILURES.name, otel_gpu__exporter=exporter)


def _eventually(predicate, timeout_s: float = 30.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_grpc_export_arrives_decodable_with_headers() -> None:
    receiver = GrpcProfilesReceiver().start()
    exporter = OTLPGrpcProfileExporter(f"http://127.0.0.1:{receiver.port}", headers={"X-Tenant": "team-a"},
                                       backoff=FAST)
    try:
        assert exporter.export(batches.cpu_batch(frequency_hz=100))
        assert receiver.wait_for(1)
    finally:
        exporter.shutdown(5.0)
        receiver.stop()
    request = receiver.requests[0]
    assert profile_type_ids(request) == ["process_cpu:cpu:nanoseconds:cpu:nanoseconds"] * 2
    assert receiver.metadata[0]["x-tenant"] == "team-a"
    assert receiver.metadata[0]["user-agent"].startswith("otel-gpu/")
    pids = [kv.value.int_value for rp in request.resource_profiles for kv in rp.resource.attributes
            if kv.key == "process.pid"]
    assert pids == [4242, 77]


def test_grpc_insecure_flag_for_an_endpoint_without_scheme() -> None:
    receiver = GrpcProfilesReceiver().start()
    exporter = OTLPGrpcProfileExporter(f"127.0.0.1:{receiver.port}", insecure=True, compression="none",
                                       backoff=FAST)
    try:
        exporter.export(batches.gpu_batch())
        assert receiver.wait_for(1)
    finally:
        exporter.shutdown(5.0)
        receiver.stop()
    assert profile_type_ids(receiver.requests[0]) == ["gpu:gpu_time:nanoseconds:gpu:nanoseconds"]


def test_grpc_backend_down_then_up_queue_bounded_and_data_arrives() -> None:
    port = free_port()
    payload_size = encode_otlp(batches.cpu_batch()).ByteSize()
    bound = payload_size * 3 + payload_size // 2  # room for three payloads
    exporter = OTLPGrpcProfileExporter(f"http://127.0.0.1:{port}", timeout_s=1.0, queue_max_bytes=bound,
                                       backoff=FAST)
    receiver = None
    try:
        for _ in range(8):
            assert exporter.export(batches.cpu_batch()) is True
            assert exporter.queue.queued_bytes <= bound
        assert exporter.queue.queued_count == 3
        assert _dropped("queue_full") == 5
        assert _eventually(lambda: _failures("otlp_grpc") >= 2)  # the backend really was down for a while
        receiver = GrpcProfilesReceiver(port).start()
        assert receiver.wait_for(3, timeout_s=60.0)
    finally:
        exporter.shutdown(5.0)
        if receiver is not None:
            receiver.stop()
    assert len(receiver.requests) == 3


def test_grpc_unavailable_is_retried_invalid_argument_is_not() -> None:
    receiver = GrpcProfilesReceiver().start()
    receiver.fail_next.extend([grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAVAILABLE])
    exporter = OTLPGrpcProfileExporter(f"http://127.0.0.1:{receiver.port}", backoff=FAST)
    try:
        exporter.export(batches.cpu_batch())  # 2 x UNAVAILABLE, then delivered
        assert receiver.wait_for(1)
        receiver.fail_next.append(grpc.StatusCode.INVALID_ARGUMENT)
        exporter.export(batches.cpu_batch())  # refused: dropped, not retried
        exporter.export(batches.gpu_batch())  # delivered after it
        assert receiver.wait_for(2)
    finally:
        exporter.shutdown(5.0)
        receiver.stop()
    assert receiver.attempts == 5  # 2 x UNAVAILABLE + delivered, refused once, delivered
    assert _dropped("rejected") == 1
    assert profile_type_ids(receiver.requests[1]) == ["gpu:gpu_time:nanoseconds:gpu:nanoseconds"]


def test_grpc_partial_success_is_counted() -> None:
    receiver = GrpcProfilesReceiver().start()
    receiver.rejected_profiles = 2
    exporter = OTLPGrpcProfileExporter(f"http://127.0.0.1:{receiver.port}", backoff=FAST)
    try:
        exporter.export(batches.cpu_batch())
        assert receiver.wait_for(1)
    finally:
        exporter.shutdown(5.0)
        receiver.stop()
    assert _dropped("rejected") == 2


def test_http_export_is_gzipped_protobuf_on_the_profiles_path_when_asked() -> None:
    receiver = HttpReceiver().start()
    url = f"http://127.0.0.1:{receiver.port}/v1development/profiles"
    exporter = OTLPHttpProfileExporter(url, headers={"Authorization": "Bearer t0k"}, compression="gzip",
                                       backoff=FAST)
    try:
        exporter.export(batches.cpu_batch(frequency_hz=100))
        assert receiver.wait_for(1)
    finally:
        exporter.shutdown(5.0)
        receiver.stop()
    record = receiver.requests[0]
    assert record.path == "/v1development/profiles"
    assert record.headers["content-type"] == "application/x-protobuf"
    assert record.headers["content-encoding"] == "gzip" and record.body[:2] == b"\x1f\x8b"
    assert record.headers["authorization"] == "Bearer t0k"
    assert record.headers["user-agent"].startswith("otel-gpu/")
    request = svc.ExportProfilesServiceRequest.FromString(gzip.decompress(record.body))
    assert profile_type_ids(request) == ["process_cpu:cpu:nanoseconds:cpu:nanoseconds"] * 2


def test_http_uncompressed_by_default() -> None:
    receiver = HttpReceiver().start()
    exporter = OTLPHttpProfileExporter(f"http://127.0.0.1:{receiver.port}/v1development/profiles", backoff=FAST)
    try:
        exporter.export(batches.cpu_batch())
        assert receiver.wait_for(1)
    finally:
        exporter.shutdown(5.0)
        receiver.stop()
    record = receiver.requests[0]
    assert "content-encoding" not in record.headers
    assert len(svc.ExportProfilesServiceRequest.FromString(record.body).resource_profiles) == 2


def test_http_503_and_429_are_retried_400_is_dropped() -> None:
    receiver = HttpReceiver().start()
    receiver.fail_next.extend([(503, {}), (429, {"Retry-After": "0"}), (400, {})])
    exporter = OTLPHttpProfileExporter(f"http://127.0.0.1:{receiver.port}/v1development/profiles", backoff=FAST)
    try:
        exporter.export(batches.cpu_batch())  # 503, 429, then refused with 400
        exporter.export(batches.gpu_batch())  # delivered
        assert receiver.wait_for(1)
    finally:
        exporter.shutdown(5.0)
        receiver.stop()
    assert receiver.attempts == 4
    assert _dropped("rejected") == 1
    request = svc.ExportProfilesServiceRequest.FromString(receiver.requests[0].decoded_body())
    assert profile_type_ids(request) == ["gpu:gpu_time:nanoseconds:gpu:nanoseconds"]


@pytest.mark.parametrize(("body", "content_type", "expected"), [
    (status_pb2.Status(code=3, message="profile has no sample type").SerializeToString(), "application/x-protobuf",
     "HTTP 400 from http://127.0.0.1:{port}/v1development/profiles: INVALID_ARGUMENT (3): profile has no sample type"),
    (b'{"code": 3, "message": "bad"}', "application/json", '{"code": 3, "message": "bad"}'),
    (b"\x00\xffbinary" + b"x" * 500, "application/octet-stream", "\\x00\ufffdbinary"),
], ids=["rpc-status", "json", "binary"])
def test_http_error_bodies_are_logged_in_words(body: bytes, content_type: str, expected: str,
                                               caplog: pytest.LogCaptureFixture) -> None:
    receiver = HttpReceiver(fail_body=(body, content_type)).start()
    receiver.fail_next.append((400, {}))
    exporter = OTLPHttpProfileExporter(f"http://127.0.0.1:{receiver.port}/v1development/profiles", backoff=FAST)
    try:
        exporter.export(batches.cpu_batch())
        assert _eventually(lambda: _dropped("rejected") == 1)
    finally:
        exporter.shutdown(5.0)
        receiver.stop()
    refused = [r.getMessage() for r in caplog.records if "refused a payload" in r.getMessage()]
    assert len(refused) == 1 and expected.replace("{port}", str(receiver.port)) in refused[0], refused
    assert len(refused[0]) < 400  # an excerpt, not the whole body



def test_http_to_a_grpc_port_is_a_refusal_that_names_the_protocol(caplog: pytest.LogCaptureFixture) -> None:
    """A gRPC server answers an HTTP/1 request with an HTTP/2 frame (NULs and all): no bytes of it in the log, a line
    that says what to change, and a refusal (dropped, counted, logged once), not an outage retried for ever."""
    receiver = GrpcProfilesReceiver().start()
    exporter = OTLPHttpProfileExporter(f"http://127.0.0.1:{receiver.port}/v1development/profiles", backoff=FAST)
    try:
        exporter.export(batches.cpu_batch())
        exporter.export(batches.gpu_batch())
        assert _eventually(lambda: _dropped("rejected") == 2)
    finally:
        exporter.shutdown(5.0)
        receiver.stop()
    lines = [r.getMessage() for r in caplog.records if r.name == "otel_gpu.exporters.queue"]
    assert lines == [f"otlp_http: the backend refused a payload (127.0.0.1:{receiver.port} answers, but not as "
                     "OTLP/HTTP (a gRPC port? try --otlp-protocol grpc)); dropped it; the same refusal is logged "
                     "again at most every 300 s"], lines
    assert _failures("otlp_http") == 2


def test_http_to_a_server_that_closes_connections_is_retried_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    server = ClosingServer()
    exporter = OTLPHttpProfileExporter(f"http://127.0.0.1:{server.port}/v1development/profiles", backoff=FAST)
    try:
        exporter.export(batches.cpu_batch())
        assert _eventually(lambda: _failures("otlp_http") >= 2)  # retried
    finally:
        exporter.shutdown(0.0)
        server.stop()
    lines = [r.getMessage() for r in caplog.records if "backend unavailable" in r.getMessage()]
    assert len(lines) == 1 and (f"(127.0.0.1:{server.port} takes connections but closes them without an answer; "
                                "check that it takes OTLP/HTTP)") in lines[0], lines


def test_http_backend_down_then_up() -> None:
    port = free_port()
    exporter = OTLPHttpProfileExporter(f"http://127.0.0.1:{port}/v1development/profiles", timeout_s=1.0,
                                       queue_max_bytes=1 << 20, backoff=FAST)
    receiver = None
    try:
        exporter.export(batches.cpu_batch())
        exporter.export(batches.gpu_batch())
        assert _eventually(lambda: _failures("otlp_http") >= 2)
        receiver = HttpReceiver(port=port).start()
        assert receiver.wait_for(2, timeout_s=60.0)
    finally:
        exporter.shutdown(5.0)
        if receiver is not None:
            receiver.stop()
    assert [profile_type_ids(svc.ExportProfilesServiceRequest.FromString(r.decoded_body()))[0]
            for r in receiver.requests] == ["process_cpu:cpu:nanoseconds:cpu:nanoseconds",
                                            "gpu:gpu_time:nanoseconds:gpu:nanoseconds"]


def test_grpc_tls_with_the_configured_ca_certificate(tmp_path: Path) -> None:
    cert, key = self_signed_certificate(tmp_path)
    receiver = GrpcProfilesReceiver(tls=(cert.read_bytes(), key.read_bytes())).start()
    exporter = OTLPGrpcProfileExporter(f"https://127.0.0.1:{receiver.port}", certificate=str(cert), backoff=FAST)
    try:
        exporter.export(batches.cpu_batch())
        assert receiver.wait_for(1)
    finally:
        exporter.shutdown(5.0)
        receiver.stop()
    assert len(receiver.requests[0].resource_profiles) == 2


def test_http_tls_with_the_configured_ca_certificate(tmp_path: Path) -> None:
    cert, key = self_signed_certificate(tmp_path)
    receiver = HttpReceiver(tls=(str(cert), str(key))).start()
    exporter = OTLPHttpProfileExporter(f"https://127.0.0.1:{receiver.port}/v1development/profiles",
                                       certificate=str(cert), backoff=FAST)
    try:
        exporter.export(batches.cpu_batch())
        assert receiver.wait_for(1)
    finally:
        exporter.shutdown(5.0)
        receiver.stop()
    assert len(svc.ExportProfilesServiceRequest.FromString(receiver.requests[0].decoded_body()).resource_profiles) == 2


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_mutual_tls_from_the_per_signal_variables(tmp_path: Path, protocol: str) -> None:
    """The server requires a client certificate: the profiles exporter built from OTEL_EXPORTER_OTLP_PROFILES_CLIENT_*
    presents it (and without one nothing arrives)."""
    from otel_gpu import config as config_module
    from otel_gpu.exporters import build_profile_exporters

    cert, key = self_signed_certificate(tmp_path)
    (tmp_path / "client").mkdir()
    client_cert, client_key = self_signed_certificate(tmp_path / "client")
    if protocol == "grpc":
        receiver = GrpcProfilesReceiver(tls=(cert.read_bytes(), key.read_bytes()),
                                        client_ca=client_cert.read_bytes()).start()
    else:
        receiver = HttpReceiver(tls=(str(cert), str(key)), client_ca=str(client_cert)).start()  # type: ignore[assignment]
    base = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"https://127.0.0.1:{receiver.port}",
            "OTEL_EXPORTER_OTLP_PROTOCOL": protocol, "OTEL_EXPORTER_OTLP_CERTIFICATE": str(cert),
            "OTEL_GPU_OUTPUT_FILES": "off", "OTEL_GPU_OUTPUT_CONSOLE": "off"}
    mutual = {"OTEL_EXPORTER_OTLP_PROFILES_CLIENT_KEY": str(client_key),
              "OTEL_EXPORTER_OTLP_PROFILES_CLIENT_CERTIFICATE": str(client_cert)}
    try:
        without, = build_profile_exporters(config_module.load(None, base))
        without.export(batches.cpu_batch())
        assert _eventually(lambda: _failures(without.name) >= 1)
        without.shutdown(0.5)
        assert receiver.requests == []
        exporter, = build_profile_exporters(config_module.load(None, {**base, **mutual}))
        exporter.export(batches.cpu_batch())
        assert receiver.wait_for(1)
        exporter.shutdown(5.0)
    finally:
        receiver.stop()


def test_tls_without_the_ca_certificate_is_not_delivered(tmp_path: Path) -> None:
    """The self-signed server is not trusted by the system roots: nothing arrives, failures are counted."""
    cert, key = self_signed_certificate(tmp_path)
    receiver = HttpReceiver(tls=(str(cert), str(key))).start()
    exporter = OTLPHttpProfileExporter(f"https://127.0.0.1:{receiver.port}/v1development/profiles", backoff=FAST)
    try:
        exporter.export(batches.cpu_batch())
        assert _eventually(lambda: _failures("otlp_http") >= 1)
    finally:
        exporter.shutdown(0.5)
        receiver.stop()
    assert receiver.requests == []
    assert _dropped("shutdown") == 1


def test_export_returns_while_the_backend_hangs() -> None:
    """A backend that accepts connections but never answers: export() still returns at once (it only queues),
    and shutdown gives up within its timeout, counting what it could not send."""
    with socket.socket() as blackhole:
        blackhole.bind(("127.0.0.1", 0))
        blackhole.listen(16)
        port = blackhole.getsockname()[1]
        exporter = OTLPHttpProfileExporter(f"http://127.0.0.1:{port}/v1development/profiles", timeout_s=30.0,
                                           backoff=FAST)
        results = [exporter.export(batches.cpu_batch()) for _ in range(3)]
        assert results == [True, True, True]
        assert exporter.queue.queued_count == 3
        exporter.shutdown(0.2)
    assert _dropped("shutdown") == 3
    assert exporter.queue.sent == 0 and exporter.queue.queued_bytes == 0

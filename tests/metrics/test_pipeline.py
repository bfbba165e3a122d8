# SPDX-License-Identifier: Apache-2.0
"""The metrics pipeline against real receivers: an OTLP gRPC server, the Prometheus endpoint, a backend outage,
a backend that refuses connections and one that takes them and never answers."""

from __future__ import annotations

import contextlib
import gzip
import http.server
import logging
import socket
import subprocess
import threading
import urllib.error
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricExporter, MetricExportResult
from opentelemetry.sdk.resources import Resource

from otel_gpu import selfmetrics, semconv
from otel_gpu.config import AgentConfig, MetricsConfig, OTLPConfig, OutputConfig
from otel_gpu.metrics.pipeline import CountingExporter, MetricsPipeline
from tests.backends import free_port, http_get, wait_until
from tests.metrics.gpu_readings import SimReadings

RESOURCE = Resource({"service.name": "pipeline-test", "host.name": "test-host"})
QUIET = OutputConfig(files="off", console="off")


class _Receiver(metrics_service_pb2_grpc.MetricsServiceServicer):
    """A real OTLP/gRPC metrics endpoint that keeps what it receives."""

    def __init__(self) -> None:
        self.requests: list[metrics_service_pb2.ExportMetricsServiceRequest] = []
        self.metadata: list[dict[str, str]] = []
        self.lock = threading.Lock()

    def Export(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802 - gRPC method name
        with self.lock:
            self.requests.append(request)
            self.metadata.append(dict(context.invocation_metadata()))
        return metrics_service_pb2.ExportMetricsServiceResponse()

    def names(self) -> set[str]:
        with self.lock:
            return {m.name for r in self.requests for rm in r.resource_metrics for sm in rm.scope_metrics
                    for m in sm.metrics}

    def points(self, name: str) -> list:  # type: ignore[type-arg]
        with self.lock:
            return [p for r in self.requests for rm in r.resource_metrics for sm in rm.scope_metrics
                    for m in sm.metrics if m.name == name for p in getattr(m, m.WhichOneof("data")).data_points]


def _serve(port: int, credentials: grpc.ServerCredentials | None = None) -> tuple[grpc.Server, _Receiver]:
    receiver = _Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(receiver, server)
    if credentials is None:
        server.add_insecure_port(f"127.0.0.1:{port}")
    else:
        server.add_secure_port(f"127.0.0.1:{port}", credentials)
    server.start()
    return server, receiver


@pytest.fixture(autouse=True)
def _fresh_selfmetrics() -> Iterator[None]:
    selfmetrics.reset()
    yield
    selfmetrics.reset()


def _grpc_config(port: int, **otlp: object) -> AgentConfig:
    return AgentConfig(otlp=OTLPConfig(endpoint=f"http://127.0.0.1:{port}", protocol="grpc", **otlp),  # type: ignore[arg-type]
                       metrics=MetricsConfig(export_interval_s=0.2), output=QUIET)


def test_otlp_grpc_export_is_cumulative_with_headers_and_resource() -> None:
    port = free_port()
    server, receiver = _serve(port)
    pipeline = MetricsPipeline(_grpc_config(port, headers=(("authorization", "Bearer s3cret"),)), RESOURCE)
    try:
        SimReadings(pipeline.meter("otel_gpu.gpu"), gpus=2)
        wait_until(lambda: len(receiver.points(semconv.GPU_ENERGY.name)) >= 4, 20, "two exports with energy")
    finally:
        pipeline.shutdown()
        server.stop(0)
    assert receiver.metadata[0]["authorization"] == "Bearer s3cret"
    resource = {a.key: a.value.string_value for a in receiver.requests[0].resource_metrics[0].resource.attributes}
    assert resource == {"service.name": "pipeline-test", "host.name": "test-host"}
    assert {semconv.GPU_UTILIZATION.name, semconv.GPU_MEMORY_USAGE.name, semconv.GPU_ENERGY.name} <= receiver.names()
    with receiver.lock:
        sums = [m.sum for r in receiver.requests for rm in r.resource_metrics for sm in rm.scope_metrics
                for m in sm.metrics if m.WhichOneof("data") == "sum"]
    assert sums and {s.aggregation_temporality for s in sums} == {
        AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE}
    energy = receiver.points(semconv.GPU_ENERGY.name)
    gpu0 = [p for p in energy if p.attributes[0].value.string_value.endswith("000000000000")]
    assert len({p.start_time_unix_nano for p in gpu0}) == 1  # one cumulative series, not deltas
    assert gpu0[-1].as_double > gpu0[0].as_double >= 1e6


class _HTTPReceiver(http.server.ThreadingHTTPServer):
    """A real OTLP/HTTP endpoint (stdlib HTTP server) that keeps each request's headers and decoded body."""

    def __init__(self) -> None:
        self.received: list[tuple[dict[str, str], metrics_service_pb2.ExportMetricsServiceRequest]] = []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - stdlib handler name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = metrics_service_pb2.ExportMetricsServiceRequest.FromString(body)
                receiver.received.append(({k.lower(): v for k, v in self.headers.items()}, request))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()
                self.wfile.write(metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString())

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
                return None

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


@pytest.mark.parametrize("compression", ["gzip", "none"])
def test_otlp_http_sends_headers_and_compression(compression: str) -> None:
    receiver = _HTTPReceiver()
    url = f"http://127.0.0.1:{receiver.server_address[1]}/v1/metrics"
    config = AgentConfig(otlp=OTLPConfig(metrics_endpoint=url, protocol="http/protobuf", compression=compression,
                                         headers=(("X-Scope-OrgID", "tenant-1"),),
                                         metrics_headers=(("Authorization", "Basic abc"),)),
                         metrics=MetricsConfig(export_interval_s=0.2), output=QUIET)
    pipeline = MetricsPipeline(config, RESOURCE)
    try:
        SimReadings(pipeline.meter("otel_gpu.gpu"), gpus=2)
        wait_until(lambda: receiver.received, 20, "an OTLP/HTTP request")
    finally:
        pipeline.shutdown()
        receiver.shutdown()
        receiver.server_close()
    headers, request = receiver.received[0]
    assert headers["x-scope-orgid"] == "tenant-1" and headers["authorization"] == "Basic abc"
    assert headers["content-type"] == "application/x-protobuf"
    assert headers.get("content-encoding") == ("gzip" if compression == "gzip" else None)
    names = {m.name for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert semconv.GPU_MEMORY_USAGE.name in names


def test_an_http_backend_s_rpc_status_is_logged_in_words(caplog: pytest.LogCaptureFixture) -> None:
    from google.rpc import status_pb2

    from tests.exporters.receivers import HttpReceiver

    receiver = HttpReceiver(fail_body=(status_pb2.Status(code=3, message="metric name is too long").SerializeToString(),
                                       "application/x-protobuf")).start()
    receiver.fail_next.extend([(400, {})] * 1000)
    url = f"http://127.0.0.1:{receiver.port}/v1/metrics"
    config = AgentConfig(otlp=OTLPConfig(metrics_endpoint=url, protocol="http/protobuf"),
                         metrics=MetricsConfig(export_interval_s=0.2), output=QUIET)
    pipeline = MetricsPipeline(config, RESOURCE)
    try:
        SimReadings(pipeline.meter("otel_gpu.gpu"), gpus=1)
        wait_until(lambda: any("is failing" in r.getMessage() for r in caplog.records), 20, "a failure line")
    finally:
        pipeline.shutdown()
        receiver.stop()
    failing = [r.getMessage() for r in caplog.records if "is failing" in r.getMessage()]
    assert f"(HTTP 400 from {url}: INVALID_ARGUMENT (3): metric name is too long)" in failing[0], failing


def test_otlp_grpc_over_tls_trusts_the_configured_certificate(tmp_path: Path) -> None:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    port = free_port()
    server, receiver = _serve(port, grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())]))
    config = AgentConfig(otlp=OTLPConfig(endpoint=f"https://localhost:{port}", protocol="grpc",
                                         certificate=str(cert), timeout_s=2),
                         metrics=MetricsConfig(export_interval_s=0.2), output=QUIET)
    pipeline = MetricsPipeline(config, RESOURCE)
    try:
        SimReadings(pipeline.meter("otel_gpu.gpu"), gpus=1)
        wait_until(lambda: receiver.points(semconv.GPU_UTILIZATION.name), 20, "an export over TLS")
    finally:
        pipeline.shutdown()
        server.stop(0)
    assert selfmetrics.total(semconv.SELF_EXPORT_FAILURES.name) == 0


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_mutual_tls_and_timeout_from_the_per_signal_variables(tmp_path: Path, protocol: str) -> None:
    """A backend that requires a client certificate gets the one OTEL_EXPORTER_OTLP_METRICS_CLIENT_* names."""
    from otel_gpu import config as config_module
    from tests.exporters.receivers import HttpReceiver, self_signed_certificate

    cert, key = self_signed_certificate(tmp_path)
    (tmp_path / "client").mkdir()
    client_cert, client_key = self_signed_certificate(tmp_path / "client")
    environ = {"OTEL_EXPORTER_OTLP_PROTOCOL": protocol, "OTEL_EXPORTER_OTLP_CERTIFICATE": str(cert),
               "OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY": str(client_key),
               "OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE": str(client_cert),
               "OTEL_EXPORTER_OTLP_TIMEOUT": "1000", "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "7000",
               "OTEL_GPU_METRICS_EXPORT_INTERVAL": "0.2", "OTEL_GPU_OUTPUT_FILES": "off",
               "OTEL_GPU_OUTPUT_CONSOLE": "off"}
    if protocol == "grpc":
        port = free_port()
        server, receiver = _serve(port, grpc.ssl_server_credentials(
            [(key.read_bytes(), cert.read_bytes())], root_certificates=client_cert.read_bytes(),
            require_client_auth=True))
        stop, arrived = (lambda: server.stop(0)), (lambda: receiver.points(semconv.GPU_UTILIZATION.name))
        environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"https://localhost:{port}"
    else:
        http_receiver = HttpReceiver(tls=(str(cert), str(key)), client_ca=str(client_cert)).start()
        stop, arrived = http_receiver.stop, (lambda: http_receiver.requests)
        environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"https://localhost:{http_receiver.port}"
    config = config_module.load(None, environ)
    assert config.otlp.signal("metrics").timeout_s == 7.0 and config.otlp.signal("profiles").timeout_s == 1.0
    pipeline = MetricsPipeline(config, RESOURCE)
    try:
        SimReadings(pipeline.meter("otel_gpu.gpu"), gpus=1)
        wait_until(arrived, 20, "an export over mutual TLS")
    finally:
        pipeline.shutdown()
        stop()
    assert selfmetrics.total(semconv.SELF_EXPORT_FAILURES.name) == 0


def test_unreadable_certificate_turns_otlp_off_with_one_line(tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    config = AgentConfig(otlp=OTLPConfig(endpoint="https://localhost:4317", protocol="grpc",
                                         certificate=str(tmp_path / "missing.pem")), output=QUIET)
    pipeline = MetricsPipeline(config, RESOURCE)
    pipeline.shutdown()
    assert pipeline.exporters == []
    assert [r for r in caplog.records if "--otlp-certificate" in r.getMessage()]
    assert selfmetrics.total(semconv.SELF_ERRORS.name, otel_gpu__reason="certificate") == 1


def test_backend_down_then_back_counts_failures_logs_once_and_recovers(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="otel_gpu.metrics.pipeline")
    port = free_port()  # nothing listens here yet: the backend is down
    pipeline = MetricsPipeline(_grpc_config(port, timeout_s=0.5), RESOURCE)
    server = None
    try:
        SimReadings(pipeline.meter("otel_gpu.gpu"), gpus=2)
        wait_until(lambda: selfmetrics.total(semconv.SELF_EXPORT_FAILURES.name, otel_gpu__exporter="otlp_grpc") >= 3,
                   30, "three failed exports")
        assert selfmetrics.total(semconv.SELF_DROPPED.name, otel_gpu__reason="export_failed") > 0
        failing = [r for r in caplog.records if "is failing" in r.getMessage()]
        assert len(failing) == 1 and f"127.0.0.1:{port}" in failing[0].getMessage()
        server, receiver = _serve(port)  # the backend comes back on the same port
        wait_until(lambda: receiver.points(semconv.GPU_UTILIZATION.name), 30, "metrics after recovery")
        wait_until(lambda: [r for r in caplog.records if "recovered after" in r.getMessage()], 10, "recovery log")
        # the failures the agent counted are in its own self-metrics, exported once the backend is back
        wait_until(lambda: [p for p in receiver.points(semconv.SELF_EXPORT_FAILURES.name) if p.as_int >= 3], 10,
                   "otel_gpu.export.failures at the backend")
    finally:
        pipeline.shutdown()
        if server is not None:
            server.stop(0)
    assert len([r for r in caplog.records if "is failing" in r.getMessage()]) == 1
    assert len([r for r in caplog.records if "recovered after" in r.getMessage()]) == 1


@contextlib.contextmanager
def _silent_backend() -> Iterator[int]:
    """A port that takes connections and never answers them: a backend that hangs."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield int(sock.getsockname()[1])


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_refused_connection_is_reported_as_refused(protocol: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="otel_gpu.metrics.pipeline")
    port = free_port()  # nothing listens: every connection is refused
    config = AgentConfig(otlp=OTLPConfig(endpoint=f"http://127.0.0.1:{port}", protocol=protocol, timeout_s=0.5),
                         metrics=MetricsConfig(export_interval_s=0.2), output=QUIET)
    pipeline = MetricsPipeline(config, RESOURCE)
    SimReadings(pipeline.meter("otel_gpu.gpu"), gpus=1)
    try:
        failing = wait_until(lambda: [r.getMessage() for r in caplog.records if "is failing" in r.getMessage()], 30,
                             "the line that says the export fails")
    finally:
        pipeline.shutdown()
    assert f"connection refused by 127.0.0.1:{port}" in failing[0], failing[0]


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_the_first_line_of_an_outage_says_why(protocol: str, caplog: pytest.LogCaptureFixture) -> None:
    """The SDK's exporter retries within its timeout (5 s here) and reports the failure only then; collections
    superseded meanwhile are logged first, and that line says why the send has not finished."""
    caplog.set_level(logging.WARNING, logger="otel_gpu.metrics.pipeline")
    port = free_port()  # nothing listens: every connection is refused
    config = AgentConfig(otlp=OTLPConfig(endpoint=f"http://127.0.0.1:{port}", protocol=protocol, timeout_s=5),
                         metrics=MetricsConfig(export_interval_s=0.2), output=QUIET)
    pipeline = MetricsPipeline(config, RESOURCE)
    SimReadings(pipeline.meter("otel_gpu.gpu"), gpus=1)
    try:
        lines = wait_until(lambda: [r.getMessage() for r in caplog.records if r.name == "otel_gpu.metrics.pipeline"
                                    and f"(http://127.0.0.1:{port}" in r.getMessage()], 30, "a line about the export")
    finally:
        pipeline.shutdown(timeout_s=1.0)
    assert "has not finished before the next collection" in lines[0], lines
    assert f"(connection refused by 127.0.0.1:{port}: nothing listens there)" in lines[0], lines


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_server_that_closes_connections_at_once_is_reported_so(protocol: str,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    from tests.exporters.receivers import ClosingServer

    caplog.set_level(logging.WARNING, logger="otel_gpu.metrics.pipeline")
    server = ClosingServer()
    config = AgentConfig(otlp=OTLPConfig(endpoint=f"http://127.0.0.1:{server.port}", protocol=protocol,
                                         timeout_s=0.5), metrics=MetricsConfig(export_interval_s=0.2), output=QUIET)
    pipeline = MetricsPipeline(config, RESOURCE)
    SimReadings(pipeline.meter("otel_gpu.gpu"), gpus=1)
    try:
        failing = wait_until(lambda: [r.getMessage() for r in caplog.records if "is failing" in r.getMessage()
                                      and f"(http://127.0.0.1:{server.port}" in r.getMessage()], 30,
                             "the line that says the export fails")
    finally:
        pipeline.shutdown(timeout_s=1.0)
        server.stop()
    expects = "OTLP gRPC" if protocol == "grpc" else "OTLP HTTP/protobuf"
    assert (f"(127.0.0.1:{server.port} takes connections but closes them without an answer; check that it takes "
            f"{expects})") in failing[0], failing


def test_a_grpc_backend_s_status_is_logged_in_words_and_a_new_one_at_once(caplog: pytest.LogCaptureFixture) -> None:
    """INVALID_ARGUMENT three times, then UNAVAILABLE from a server that is up (a Collector's memory limiter): the
    status and its message, not a guess from a probe; the second reason in a line of its own."""
    caplog.set_level(logging.WARNING, logger="otel_gpu.metrics.pipeline")

    class Refusing(metrics_service_pb2_grpc.MetricsServiceServicer):
        calls = 0

        def Export(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802 - gRPC method name
            Refusing.calls += 1
            if Refusing.calls <= 3:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad \x00 metric")
            context.abort(grpc.StatusCode.UNAVAILABLE, "data refused due to high memory usage")

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Refusing(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    pipeline = MetricsPipeline(_grpc_config(port, timeout_s=0.5), RESOURCE)
    SimReadings(pipeline.meter("otel_gpu.gpu"), gpus=1)
    try:
        def failing_lines() -> list[str]:
            return [r.getMessage() for r in caplog.records if "is failing" in r.getMessage()
                    and f"127.0.0.1:{port}" in r.getMessage()]

        wait_until(lambda: len(failing_lines()) >= 2, 30, "two failure lines")
        failing = failing_lines()
    finally:
        pipeline.shutdown(timeout_s=1.0)
        server.stop(0)
    address = f"http://127.0.0.1:{port}"
    assert f"is failing (gRPC INVALID_ARGUMENT from {address}: bad \\x00 metric)" in failing[0], failing
    assert (f"is failing for another reason now (gRPC UNAVAILABLE from {address}: data refused due to high memory "
            "usage); 4 failed exports so far") in failing[1], failing


class _FailingExporter(MetricExporter):
    """Fails every export, each for the next reason of ``reasons`` (``last_error``, as the OTLP exporters keep it)."""

    def __init__(self, reasons: list[str]) -> None:
        super().__init__()
        self.reasons = reasons
        self.last_error = ""

    def export(self, metrics_data: object, timeout_millis: float = 10_000, **kwargs: object) -> MetricExportResult:
        self.last_error = self.reasons.pop(0)
        return MetricExportResult.FAILURE

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:
        pass


def test_a_new_reason_is_logged_at_once_the_same_one_at_most_every_interval(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    from otel_gpu.metrics import pipeline as pipeline_module

    clock = [1000.0]
    monkeypatch.setattr(pipeline_module.time, "monotonic", lambda: clock[0])
    caplog.set_level(logging.INFO, logger="otel_gpu.metrics.pipeline")
    url = "http://backend:4318/v1/metrics"
    reasons = [f"HTTP 500 from {url}: try {i}" for i in range(3)] + [f"HTTP 413 from {url}: too big {i}"
                                                                      for i in range(3)]
    counting = CountingExporter(_FailingExporter(reasons), "otlp_http", url)

    def send(count: int) -> list[str]:
        for _ in range(count):
            counting.export(_collection())  # type: ignore[arg-type]
            assert counting.force_flush(10_000)
        return [r.getMessage() for r in caplog.records if "is" in r.getMessage() and "failing" in r.getMessage()]

    try:
        lines = send(3)
        assert len(lines) == 1 and f"is failing (HTTP 500 from {url}: try 0)" in lines[0], lines
        lines = send(1)
        assert len(lines) == 2 and f"is failing for another reason now (HTTP 413 from {url}: too big 0); 4 failed " \
                                   "exports so far" in lines[1], lines
        lines = send(1)
        assert len(lines) == 2, lines  # the same reason within the interval: counted only
        clock[0] += pipeline_module.FAILURE_LOG_INTERVAL_S
        lines = send(1)
        assert len(lines) == 3 and f"is still failing (HTTP 413 from {url}: too big 2): 2 more failed exports in " \
                                   "300 s" in lines[2], lines
    finally:
        counting.shutdown(1000)
    assert selfmetrics.total(semconv.SELF_EXPORT_FAILURES.name, otel_gpu__exporter="otlp_http") == 6


@pytest.mark.parametrize("backend", ["nothing-listens", "closes-at-once"])
def test_a_down_grpc_backend_is_probed_at_most_once_per_backoff_period(
        backend: str, caplog: pytest.LogCaptureFixture) -> None:
    """gRPC UNAVAILABLE leaves the reason to a probe of the address (up to 2.2 s each): consecutive failed exports of
    one outage share one probe's verdict until its backoff period (10 s, then 20 s, ...) ends, and a send that goes
    through starts the next outage afresh. Each failure is still counted and the first line names the cause."""
    from otel_gpu.exporters import diagnosis
    from otel_gpu.metrics.pipeline import build_otlp_exporter
    from tests.exporters.receivers import ClosingServer

    caplog.set_level(logging.WARNING, logger="otel_gpu.metrics.pipeline")
    closing = ClosingServer() if backend == "closes-at-once" else None
    port = closing.port if closing is not None else free_port()
    url = f"http://127.0.0.1:{port}"
    built = build_otlp_exporter(OTLPConfig(endpoint=url, protocol="grpc", timeout_s=0.5))
    assert built is not None
    clock = [1000.0]
    outage_probe = diagnosis.OutageProbe(lambda: diagnosis.probe(url, "OTLP gRPC", grpc=True, connect_s=0.5),
                                         clock=lambda: clock[0])
    counting = CountingExporter(built[0], "otlp_grpc", url, probe=outage_probe)
    inner = counting.inner

    def fail(count: int) -> None:
        for _ in range(count):
            counting.export(_collection())  # type: ignore[arg-type]
            assert counting.force_flush(30_000)
            assert inner.last_error.startswith("gRPC UNAVAILABLE") and inner.last_error_transport, inner.last_error

    try:
        fail(4)
        assert outage_probe.runs == 1
        clock[0] += diagnosis.PROBE_BACKOFF_INITIAL_S - 0.001
        fail(2)
        assert outage_probe.runs == 1  # still within the first period
        clock[0] += 0.001
        fail(3)
        assert outage_probe.runs == 2  # the second period (twice as long) begins with one probe
        clock[0] += 2 * diagnosis.PROBE_BACKOFF_INITIAL_S - 0.001
        fail(2)
        assert outage_probe.runs == 2
        counting.inner = _HeldExporter()  # the backend answers: the outage is over
        counting.inner.release.set()
        counting.export(_collection())  # type: ignore[arg-type]
        assert counting.force_flush(30_000)
        counting.inner = inner
        fail(2)
        assert outage_probe.runs == 3  # a new outage: probed at once, not after the old period
    finally:
        counting.shutdown(1000)
        if closing is not None:
            closing.stop()
    assert selfmetrics.total(semconv.SELF_EXPORT_FAILURES.name, otel_gpu__exporter="otlp_grpc") == 13
    assert selfmetrics.total(semconv.SELF_DROPPED.name, otel_gpu__reason="export_failed") == 13
    failing = [r.getMessage() for r in caplog.records if "is failing" in r.getMessage()]
    cause = (f"connection refused by 127.0.0.1:{port}: nothing listens there" if closing is None else
             f"127.0.0.1:{port} takes connections but closes them without an answer; check that it takes OTLP gRPC")
    assert len(failing) == 2 and all(f"is failing ({cause})" in line for line in failing), failing


def test_collection_keeps_its_interval_while_an_export_hangs() -> None:
    with _silent_backend() as port:
        pipeline = MetricsPipeline(_grpc_config(port, timeout_s=600), RESOURCE)
        collections: list[int] = []
        pipeline.meter("test").create_observable_gauge(
            "test.collections", callbacks=[lambda options: collections.append(1) or []])
        SimReadings(pipeline.meter("otel_gpu.gpu"), gpus=1)
        try:
            # the first export hangs for up to 600 s; collections go on every 0.2 s regardless
            wait_until(lambda: len(collections) >= 5, 60, "five collections while the first export hangs")
            wait_until(lambda: selfmetrics.total(semconv.SELF_DROPPED.name, otel_gpu__reason="superseded") > 0, 30,
                       "collections that never went out counted as dropped")
        finally:
            pipeline.shutdown(timeout_s=1.0)


class _HeldExporter(MetricExporter):
    """Sends only once ``release`` is set, then succeeds: a backend that is down while the SDK's retries go on, and
    is back before they give up."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.sent = 0

    def export(self, metrics_data: object, timeout_millis: float = 10_000, **kwargs: object) -> MetricExportResult:
        self.release.wait(60)
        self.sent += 1
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:
        self.release.set()


def _collection() -> object:
    from opentelemetry.sdk.metrics import MeterProvider

    reader = InMemoryMetricReader()
    MeterProvider(metric_readers=[reader]).get_meter("test").create_counter("test.points").add(1)
    return reader.get_metrics_data()


def test_points_dropped_for_a_slow_backend_are_logged_once_and_when_it_goes_through(
        caplog: pytest.LogCaptureFixture) -> None:
    """A short outage that the exporter's retries outlast fails no export, but collections handed over meanwhile
    are dropped (superseded): one line says so at once, later ones only after the interval, one when it is over."""
    caplog.set_level(logging.INFO, logger="otel_gpu.metrics.pipeline")
    inner = _HeldExporter()
    counting = CountingExporter(inner, "otlp_http", "http://backend:4318/v1/metrics")
    try:
        counting.export(_collection())  # type: ignore[arg-type]
        wait_until(lambda: counting._sending, 30, "the first send under way")
        for _ in range(4):  # one waits, three replace it
            counting.export(_collection())  # type: ignore[arg-type]
        assert selfmetrics.total(semconv.SELF_DROPPED.name, otel_gpu__reason="superseded") == 3
        behind = [r for r in caplog.records if "dropped 1 points of older collections" in r.getMessage()]
        assert len(behind) == 1 and behind[0].levelno == logging.WARNING, caplog.text
        assert "slow or unreachable" in behind[0].getMessage() and "otel_gpu.dropped" in behind[0].getMessage()
        inner.release.set()
        assert counting.force_flush(30_000) and inner.sent == 2
        through = [r.getMessage() for r in caplog.records if "went through again" in r.getMessage()]
        assert through == ["metrics export to otlp_http (http://backend:4318/v1/metrics) went through again; 3 "
                           "points of older collections were dropped meanwhile (superseded)"], caplog.text
        assert not [r for r in caplog.records if "is failing" in r.getMessage() and "backend:4318" in r.getMessage()]
    finally:
        counting.shutdown(1000)


def test_shutdown_with_a_hanging_backend_ends_within_its_timeout() -> None:
    with _silent_backend() as port:
        pipeline = MetricsPipeline(_grpc_config(port, timeout_s=600), RESOURCE)
        SimReadings(pipeline.meter("otel_gpu.gpu"), gpus=1)
        sending = pipeline.exporters[0]
        wait_until(lambda: sending._sending, 30, "an export that hangs")
        stopped = threading.Event()

        def stop() -> None:
            pipeline.shutdown(timeout_s=1.0)
            stopped.set()

        threading.Thread(target=stop, daemon=True).start()
        # generous: this checks that shutdown ends, not how fast; without the bound it would wait 600 s
        assert stopped.wait(120), "shutdown is still waiting for a backend that never answers"


def test_prometheus_endpoint_serves_prometheus_names_and_stops_on_shutdown() -> None:
    port = free_port()
    config = AgentConfig(metrics=MetricsConfig(export_interval_s=60, prometheus_port=port,
                                               prometheus_host="127.0.0.1"), output=QUIET)
    pipeline = MetricsPipeline(config, RESOURCE)
    readings = SimReadings(pipeline.meter("otel_gpu.gpu"), gpus=2, processes={1: [(77, "server", 3 * 1024**3, 0.25)]})
    selfmetrics.count(semconv.SELF_DROPPED.name, 5, otel_gpu__reason="test", otel_gpu__signal="metrics")
    try:
        text = http_get(f"http://127.0.0.1:{port}/metrics").decode()
    finally:
        pipeline.shutdown()
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    for spec in readings.specs + [semconv.SELF_DROPPED]:
        assert any(s.startswith(semconv.prometheus_name(spec) + "{") for s in samples), semconv.prometheus_name(spec)
    gpu1 = 'hw_id="GPU-00000000-fa4e-4c1d-9a6b-000000000001"'
    assert any(s.startswith("hw_gpu_utilization_ratio{") and gpu1 in s and s.endswith(" 0.7") for s in samples)
    assert any(s.startswith("hw_gpu_memory_usage_bytes{") and gpu1 in s and float(s.split()[-1]) == 32 * 1024**3
               for s in samples)
    assert any(s.startswith("nvidia_gpu_process_memory_usage_bytes{") and 'process_pid="77"' in s
               and 'process_executable_name="server"' in s for s in samples)
    assert any(s.startswith("otel_gpu_dropped_total{") and s.endswith(" 5.0") for s in samples)
    assert any(s.startswith("process_resident_memory_bytes") for s in samples)
    with pytest.raises(urllib.error.URLError):
        http_get(f"http://127.0.0.1:{port}/metrics", timeout_s=2)


def test_prometheus_port_in_use_is_logged_counted_and_the_rest_runs(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        memory = InMemoryMetricReader()
        config = AgentConfig(metrics=MetricsConfig(prometheus_port=port, prometheus_host="127.0.0.1"), output=QUIET)
        pipeline = MetricsPipeline(config, RESOURCE, extra_readers=(memory,))
        try:
            SimReadings(pipeline.meter("otel_gpu.gpu"), gpus=1)
            names = {m.name for rm in memory.get_metrics_data().resource_metrics for sm in rm.scope_metrics
                     for m in sm.metrics}
        finally:
            pipeline.shutdown()
    assert pipeline.prometheus_address is None
    assert [r for r in caplog.records if "--prometheus-port" in r.getMessage()]
    assert selfmetrics.total(semconv.SELF_ERRORS.name, otel_gpu__source="prometheus") == 1
    assert semconv.GPU_UTILIZATION.name in names and semconv.SELF_ERRORS.name in names


def test_self_metrics_are_reported_under_their_names() -> None:
    memory = InMemoryMetricReader()
    pipeline = MetricsPipeline(AgentConfig(output=QUIET), RESOURCE, extra_readers=(memory,))
    selfmetrics.set_gauge(semconv.SELF_COLLECTION_DURATION.name, 0.025, otel_gpu__source="nvml")
    selfmetrics.count(semconv.SELF_EXPORT_FAILURES.name, 2, otel_gpu__exporter="otlp_http", otel_gpu__signal="metrics")
    try:
        data = memory.get_metrics_data()
    finally:
        pipeline.shutdown()
    found = {(m.name, tuple(sorted(p.attributes.items())), p.value) for rm in data.resource_metrics
             for sm in rm.scope_metrics for m in sm.metrics for p in m.data.data_points}
    assert (semconv.SELF_COLLECTION_DURATION.name, (("otel_gpu.source", "nvml"),), 0.025) in found
    assert (semconv.SELF_EXPORT_FAILURES.name, (("otel_gpu.exporter", "otlp_http"), ("otel_gpu.signal", "metrics")),
            2) in found


def test_shutdown_is_idempotent_and_writes_a_last_file_line(tmp_path: Path) -> None:
    config = AgentConfig(metrics=MetricsConfig(export_interval_s=3600),
                         output=OutputConfig(dir=str(tmp_path), files="on", console="off"))
    pipeline = MetricsPipeline(config, RESOURCE)
    SimReadings(pipeline.meter("otel_gpu.gpu"), gpus=2)
    pipeline.shutdown()
    pipeline.shutdown()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 1 and semconv.GPU_UTILIZATION.name in lines[0]

# SPDX-License-Identifier: Apache-2.0
"""In-process receivers for exporter tests: an OTLP ProfilesService gRPC server and a plain HTTP server.

Both listen on 127.0.0.1, record what arrives, and can be told to fail the next requests with a given status.
"""

from __future__ import annotations

import gzip
import http.server
import socket
import ssl
import subprocess
import threading
from collections import deque
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2 as svc
from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2_grpc as svc_grpc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    """(certificate, key) files of a throw-away certificate for 127.0.0.1 and localhost (openssl CLI)."""
    cert, key = directory / "server.pem", directory / "server.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return cert, key


class GrpcProfilesReceiver(svc_grpc.ProfilesServiceServicer):
    """A real gRPC ProfilesService on 127.0.0.1; ``requests`` holds every decoded request received."""

    def __init__(self, port: int = 0, tls: tuple[bytes, bytes] | None = None, client_ca: bytes | None = None) -> None:
        """``tls``: (PEM certificate chain, PEM private key) to serve TLS instead of plaintext; ``client_ca``: PEM
        certificates a client must present a certificate of (mutual TLS)."""
        self.requests: list[svc.ExportProfilesServiceRequest] = []
        self.metadata: list[dict[str, str]] = []
        self.fail_next: deque[grpc.StatusCode] = deque()
        self.rejected_profiles = 0
        self.attempts = 0
        self._cond = threading.Condition()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        svc_grpc.add_ProfilesServiceServicer_to_server(self, self._server)
        if tls is None:
            self.port = self._server.add_insecure_port(f"127.0.0.1:{port}")
        else:
            credentials = grpc.ssl_server_credentials([(tls[1], tls[0])], root_certificates=client_ca,
                                                      require_client_auth=client_ca is not None)
            self.port = self._server.add_secure_port(f"127.0.0.1:{port}", credentials)
        assert self.port, f"could not bind 127.0.0.1:{port}"

    def start(self) -> GrpcProfilesReceiver:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=None)

    def Export(self, request, context):  # type: ignore[no-untyped-def]
        with self._cond:
            self.attempts += 1
            failure = self.fail_next.popleft() if self.fail_next else None
        if failure is not None:
            context.abort(failure, "told to fail")
        with self._cond:
            self.requests.append(request)
            self.metadata.append({k: v for k, v in context.invocation_metadata()})
            self._cond.notify_all()
        response = svc.ExportProfilesServiceResponse()
        if self.rejected_profiles:
            response.partial_success.rejected_profiles = self.rejected_profiles
            response.partial_success.error_message = "some were bad"
        return response

    def wait_for(self, count: int, timeout_s: float = 30.0) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: len(self.requests) >= count, timeout_s)


@dataclass
class HttpRequestRecord:
    path: str
    headers: dict[str, str]
    body: bytes  # as received (still gzipped when Content-Encoding says so)

    def decoded_body(self) -> bytes:
        return gzip.decompress(self.body) if self.headers.get("content-encoding") == "gzip" else self.body


@dataclass
class HttpReceiver:
    """A ThreadingHTTPServer on 127.0.0.1 recording POSTs; ``fail_next`` holds (status, headers) to answer first."""

    port: int = 0
    requests: list[HttpRequestRecord] = field(default_factory=list)
    fail_next: deque[tuple[int, dict[str, str]]] = field(default_factory=deque)
    response_body: bytes = b""
    fail_body: tuple[bytes, str] = (b"nope", "text/plain")  # the body and content type of a failure answer
    attempts: int = 0
    tls: tuple[str, str] | None = None  # (certificate file, key file) to serve HTTPS
    client_ca: str | None = None  # a PEM file: HTTPS then requires a client certificate it signed (mutual TLS)

    def __post_init__(self) -> None:
        receiver = self
        self._cond = threading.Condition()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver._cond:
                    receiver.attempts += 1
                    failure = receiver.fail_next.popleft() if receiver.fail_next else None
                if failure is not None:
                    status, headers = failure
                    self.send_response(status)
                    for key, value in headers.items():
                        self.send_header(key, value)
                    body, content_type = receiver.fail_body
                    self.send_header("Content-Type", content_type)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                with receiver._cond:
                    receiver.requests.append(HttpRequestRecord(
                        self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                    receiver._cond.notify_all()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(receiver.response_body)))
                self.end_headers()
                self.wfile.write(receiver.response_body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        if self.tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*self.tls)
            if self.client_ca is not None:
                context.verify_mode = ssl.CERT_REQUIRED
                context.load_verify_locations(cafile=self.client_ca)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> HttpReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def wait_for(self, count: int, timeout_s: float = 30.0) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: len(self.requests) >= count, timeout_s)


class ClosingServer:
    """A port on 127.0.0.1 whose server takes each connection and closes it at once, without an answer (a proxy
    with nothing behind it)."""

    def __init__(self) -> None:
        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen(64)
        self.port = int(self._socket.getsockname()[1])
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self._socket.accept()
            except OSError:
                return  # stopped
            self.connections += 1
            connection.close()

    def stop(self) -> None:
        self._socket.shutdown(socket.SHUT_RDWR)
        self._socket.close()

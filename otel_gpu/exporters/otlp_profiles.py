# SPDX-License-Identifier: Apache-2.0
"""OTLP profiles over gRPC (``ProfilesService/Export``) and HTTP (``/v1development/profiles``, protobuf).

Retryable outcomes follow the OTLP specification: gRPC ``CANCELLED``, ``DEADLINE_EXCEEDED``,
``RESOURCE_EXHAUSTED``, ``ABORTED``, ``OUT_OF_RANGE``, ``UNAVAILABLE``, ``DATA_LOSS``; HTTP 429, 502, 503, 504 and
connection errors. Anything else is a permanent refusal of that payload, and so is an answer that is not HTTP/1 (a
gRPC port sends an HTTP/2 frame back). A partial success (rejected profiles) is logged once and counted.
"""

from __future__ import annotations

import gzip
import http.client
import logging
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from google.protobuf.message import DecodeError
from google.rpc import code_pb2, status_pb2
from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import ExportProfilesServiceResponse

from otel_gpu import __version__, selfmetrics, semconv
from otel_gpu._log import once
from otel_gpu.exporters.base import QueuedProfileExporter
from otel_gpu.exporters.diagnosis import GRPC_PORT_HINT, describe_exception, escaped
from otel_gpu.exporters.queue import (
    Backoff,
    Outcome,
    Payload,
    SendResult,
)
from otel_gpu.profiles.model import ProfileBatch
from otel_gpu.profiles.otlp import encode_otlp

_logger = logging.getLogger(__name__)

EXPORT_METHOD = "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export"
HTTP_PATH = "/v1development/profiles"
# by name, so that importing this module does not import grpc (~9 MB of anonymous memory, 20 MB resident in all):
# only the gRPC exporter needs it, and imports it when built
RETRYABLE_GRPC_CODES = frozenset({
    "CANCELLED", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED", "OUT_OF_RANGE", "UNAVAILABLE", "DATA_LOSS",
})
RETRYABLE_HTTP_STATUSES = frozenset({429, 502, 503, 504})
USER_AGENT = f"otel-gpu/{__version__}"
PROTOBUF_CONTENT_TYPE = "application/x-protobuf"


def _partial_success(name: str, response: ExportProfilesServiceResponse) -> None:
    rejected = response.partial_success.rejected_profiles
    if rejected > 0:
        selfmetrics.count(semconv.SELF_DROPPED.name, rejected, otel_gpu__reason=semconv.Reason.REJECTED,
                          otel_gpu__signal=semconv.Signal.PROFILES, otel_gpu__exporter=name)
        once(_logger, logging.WARNING, f"{name}:partial", "%s: the backend rejected %d profiles: %s (further "
             "rejections are only counted)", name, rejected, response.partial_success.error_message)


class OTLPGrpcProfileExporter(QueuedProfileExporter):
    """Sends ``ExportProfilesServiceRequest`` over gRPC; TLS unless the URL is http:// or ``insecure`` is set."""

    def __init__(self, endpoint: str, *, headers: Mapping[str, str] | None = None, insecure: bool = False,
                 certificate: str = "", client_key: str = "", client_certificate: str = "",
                 compression: str = "none", timeout_s: float = 10.0, queue_max_bytes: int = 64 << 20,
                 backoff: Backoff | None = None, name: str = "otlp_grpc") -> None:
        import grpc

        self._grpc = grpc
        parsed = urllib.parse.urlparse(endpoint if "://" in endpoint else f"//{endpoint}")
        target = parsed.netloc or endpoint
        plaintext = parsed.scheme == "http" or (parsed.scheme == "" and insecure)
        options = [("grpc.primary_user_agent", USER_AGENT)]
        if plaintext:
            self._channel = grpc.insecure_channel(target, options=options)
        else:
            root, key, chain = (Path(name).read_bytes() if name else None
                                for name in (certificate, client_key, client_certificate))
            credentials = grpc.ssl_channel_credentials(root_certificates=root, private_key=key, certificate_chain=chain)
            self._channel = grpc.secure_channel(target, credentials, options=options)
        self._call = self._channel.unary_unary(EXPORT_METHOD, request_serializer=None,
                                               response_deserializer=ExportProfilesServiceResponse.FromString)
        self._metadata = tuple((key.lower(), value) for key, value in (headers or {}).items())
        self._compression = grpc.Compression.Gzip if compression == "gzip" else grpc.Compression.NoCompression
        self._timeout_s = timeout_s
        self.target = target
        super().__init__(name, queue_max_bytes, backoff)

    def payloads(self, batch: ProfileBatch) -> list[Payload]:
        return [Payload(encode_otlp(batch).SerializeToString())]

    def send(self, payload: Payload) -> SendResult:
        try:
            response = self._call(payload.body, timeout=self._timeout_s, metadata=self._metadata,
                                  compression=self._compression)
        except self._grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else self._grpc.StatusCode.UNKNOWN
            details = exc.details() if hasattr(exc, "details") else str(exc)
            outcome = Outcome.RETRY if code.name in RETRYABLE_GRPC_CODES else Outcome.FAIL
            return SendResult(outcome, f"gRPC {code.name} from {self.target}: {details}")
        _partial_success(self.name, response)
        return SendResult(Outcome.OK)

    def close(self) -> None:
        self._channel.close()


class HttpPoster:
    """POSTs one body to one URL; maps the answer to a :class:`SendResult`. Shared by OTLP/HTTP and Pyroscope."""

    def __init__(self, headers: Mapping[str, str] | None = None, *, certificate: str = "", client_key: str = "",
                 client_certificate: str = "", timeout_s: float = 10.0, expects: str = "OTLP/HTTP",
                 hint: str = GRPC_PORT_HINT) -> None:
        """``expects`` and ``hint`` word a server that answers in another protocol (what to check)."""
        self._headers = {"User-Agent": USER_AGENT, **(headers or {})}
        self._timeout_s = timeout_s
        self._expects, self._hint = expects, hint
        self._ssl = ssl.create_default_context(cafile=certificate or None)
        if client_certificate:  # mutual TLS
            self._ssl.load_cert_chain(client_certificate, client_key or None)

    def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> tuple[SendResult, bytes]:
        """(result, response body). Never raises for network or HTTP errors."""
        request = urllib.request.Request(url, data=body, method="POST", headers={**self._headers, **headers})
        try:
            with urllib.request.urlopen(request, timeout=self._timeout_s, context=self._ssl) as response:
                return SendResult(Outcome.OK), response.read()
        except urllib.error.HTTPError as exc:
            explained = describe_error_body(exc.read(), exc.headers.get("Content-Type", ""))
            detail = f"HTTP {exc.code} from {url}: {explained}"
            if exc.code in RETRYABLE_HTTP_STATUSES:
                return SendResult(Outcome.RETRY, detail, _retry_after_s(exc.headers.get("Retry-After"))), b""
            return SendResult(Outcome.FAIL, detail), b""
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            detail = describe_exception(exc, url, expects=self._expects, hint=self._hint, timeout_s=self._timeout_s)
            # an answer that is no HTTP/1 status line will not become one: a refusal (RemoteDisconnected, a subclass,
            # is a connection closed without an answer, retried)
            refused = isinstance(exc, http.client.BadStatusLine) and not isinstance(exc, http.client.RemoteDisconnected)
            return SendResult(Outcome.FAIL if refused else Outcome.RETRY, detail), b""


def describe_error_body(body: bytes, content_type: str = "", limit: int = 200) -> str:
    """An OTLP backend's error answer in words: a protobuf ``google.rpc.Status`` (what the OTLP/HTTP specification
    says a failed request returns) as its code name, number and message; anything else (JSON, text, HTML) as a
    short excerpt with unprintable characters escaped, so raw bytes never reach a log line."""
    if not body:
        return "(empty body)"
    if "json" not in content_type and "text" not in content_type and "html" not in content_type:
        status = status_pb2.Status()
        try:
            status.ParseFromString(body)
        except DecodeError:
            status = None  # type: ignore[assignment]
        if status is not None and (status.code or status.message) and status.message.isprintable():
            name = code_pb2.Code.Name(status.code) if status.code in code_pb2.Code.values() else "code"
            message = status.message[:limit] if status.message else "(no message)"
            return f"{name} ({status.code}): {message}"
    more = f" ... ({len(body)} bytes)" if len(body) > limit else ""
    return (escaped(body[:limit].decode("utf-8", "replace"), limit) or "(empty body)") + more


def _retry_after_s(value: str | None) -> float:
    try:
        return max(0.0, float(value)) if value else 0.0
    except ValueError:
        return 0.0  # an HTTP date: fall back to our own backoff


class OTLPHttpProfileExporter(QueuedProfileExporter):
    """Sends protobuf ``ExportProfilesServiceRequest`` bodies (gzipped when ``compression='gzip'``) to ``url``."""

    def __init__(self, url: str, *, headers: Mapping[str, str] | None = None, certificate: str = "",
                 client_key: str = "", client_certificate: str = "", compression: str = "none",
                 timeout_s: float = 10.0, queue_max_bytes: int = 64 << 20, backoff: Backoff | None = None,
                 name: str = "otlp_http", hint: str = GRPC_PORT_HINT) -> None:
        """``hint``: what to check when ``url`` answers in another protocol than HTTP/1."""
        self.url = url
        self._gzip = compression == "gzip"
        self._poster = HttpPoster(headers, certificate=certificate, client_key=client_key,
                                  client_certificate=client_certificate, timeout_s=timeout_s, hint=hint)
        super().__init__(name, queue_max_bytes, backoff)

    def payloads(self, batch: ProfileBatch) -> list[Payload]:
        body = encode_otlp(batch).SerializeToString()
        headers = {"Content-Type": PROTOBUF_CONTENT_TYPE}
        if self._gzip:
            body = gzip.compress(body, compresslevel=6, mtime=0)
            headers["Content-Encoding"] = "gzip"
        return [Payload(body, headers)]

    def send(self, payload: Payload) -> SendResult:
        result, body = self._poster.post(self.url, payload.body, payload.context)
        if result.outcome is Outcome.OK and body:
            response = ExportProfilesServiceResponse()
            try:
                response.ParseFromString(body)
            except DecodeError:  # a non-protobuf 2xx body (e.g. "{}") still means success
                return result
            _partial_success(self.name, response)
        return result

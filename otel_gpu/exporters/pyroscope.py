# SPDX-License-Identifier: Apache-2.0
"""Grafana Pyroscope as a direct backend: its OTLP profiles endpoint, or the legacy ``/ingest`` pprof API.

``api="otlp"`` (Pyroscope >= 1.20) POSTs protobuf OTLP profiles to ``<url>/v1development/profiles`` on the server's
HTTP port (4040). ``api="ingest"`` (older servers) POSTs one gzipped pprof per process to
``<url>/ingest?name=<service>{container_id=...}&from=&until=&format=pprof``. Both send ``X-Scope-OrgID`` when a
tenant is set and HTTP basic auth when a user is set.
"""

from __future__ import annotations

import base64
import dataclasses
import re
import urllib.parse
from collections.abc import Mapping

from otel_gpu.exporters.base import QueuedProfileExporter
from otel_gpu.exporters.otlp_profiles import HTTP_PATH, HttpPoster, OTLPHttpProfileExporter
from otel_gpu.exporters.queue import Backoff, Payload, SendResult
from otel_gpu.profiles.model import ProfileBatch
from otel_gpu.profiles.pprof import encode_pprof

TENANT_HEADER = "X-Scope-OrgID"
INGEST_PATH = "/ingest"
SPY_NAME = "otel-gpu"
PYROSCOPE_URL_HINT = "is --pyroscope-url the server's HTTP port, 4040 by default?"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")


def pyroscope_headers(tenant_id: str = "", user: str = "", password: str = "") -> dict[str, str]:
    """The tenant and basic-auth headers Pyroscope expects (empty when neither is configured)."""
    headers: dict[str, str] = {}
    if tenant_id:
        headers[TENANT_HEADER] = tenant_id
    if user:
        token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
        headers["Authorization"] = f"Basic {token}"
    return headers


def pyroscope_otlp_exporter(url: str, *, headers: Mapping[str, str], timeout_s: float = 10.0,
                            queue_max_bytes: int = 64 << 20, backoff: Backoff | None = None,
                            ) -> OTLPHttpProfileExporter:
    """OTLP/HTTP profiles to Pyroscope's own receiver (same wire as a Collector)."""
    return OTLPHttpProfileExporter(url.rstrip("/") + HTTP_PATH, headers=headers, timeout_s=timeout_s,
                                   compression="gzip",  # Pyroscope's own receiver, not OTEL_EXPORTER_OTLP_*: as ever
                                   queue_max_bytes=queue_max_bytes, backoff=backoff, name="pyroscope_otlp",
                                   hint=PYROSCOPE_URL_HINT)


class PyroscopeIngestExporter(QueuedProfileExporter):
    """One ``/ingest?format=pprof`` request per process and interval; the service name becomes the app name."""

    def __init__(self, url: str, *, headers: Mapping[str, str] | None = None, timeout_s: float = 10.0,
                 queue_max_bytes: int = 64 << 20, backoff: Backoff | None = None) -> None:
        self.url = url.rstrip("/") + INGEST_PATH
        self._poster = HttpPoster(headers, timeout_s=timeout_s, expects="HTTP", hint=PYROSCOPE_URL_HINT)
        super().__init__("pyroscope_ingest", queue_max_bytes, backoff)

    def payloads(self, batch: ProfileBatch) -> list[Payload]:
        out = []
        from_s = batch.start_unix_nano // 1_000_000_000
        until_s = max(from_s + 1, (batch.start_unix_nano + batch.duration_nano) // 1_000_000_000)
        for process in batch.processes:
            if not process.samples:  # only attributes (GPU time not measured): /ingest keeps no profile comments
                continue
            single = dataclasses.replace(batch, processes=(process,))
            query = urllib.parse.urlencode({"name": ingest_name(process.process.service_name
                                                                or process.process.executable_name,
                                                                process.process.container_id),
                                            "from": from_s, "until": until_s, "format": "pprof",
                                            "spyName": SPY_NAME})
            out.append(Payload(encode_pprof(single), {"query": query}))
        return out

    def send(self, payload: Payload) -> SendResult:
        headers = {"Content-Type": "application/octet-stream"}
        result, _ = self._poster.post(f"{self.url}?{payload.context['query']}", payload.body, headers)
        return result


def ingest_name(service: str, container_id: str = "") -> str:
    """``app{label=value}`` as /ingest's ``name`` parameter wants it; unsafe characters become ``_``."""
    app = _UNSAFE.sub("_", service) or "unknown_service"
    if container_id:
        return f"{app}{{container_id={_UNSAFE.sub('_', container_id)}}}"
    return app

# SPDX-License-Identifier: Apache-2.0
"""Profile exporters: OTLP gRPC/HTTP, Grafana Pyroscope, local pprof files and the terminal summary.

Exporters are transport only: they take a :class:`~otel_gpu.profiles.model.ProfileBatch`, encode it with the pure
encoders in :mod:`otel_gpu.profiles` and send it. Network exporters queue the encoded bytes for a sender thread
(bounded in bytes, exponential backoff with jitter), so ``export()`` never blocks the agent's loop.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from otel_gpu.config import AgentConfig
from otel_gpu.exporters.base import ProfileExporter, QueuedProfileExporter
from otel_gpu.exporters.console import ConsoleProfileExporter
from otel_gpu.exporters.files import FilesProfileExporter
from otel_gpu.exporters.queue import Backoff, RetryQueue

_logger = logging.getLogger(__name__)
# the network exporters are imported when named: http.client, ssl (libcrypto, libssl) and the protobuf messages cost
# several MB resident in an agent that writes local files only
_NETWORK = {"OTLPGrpcProfileExporter": "otlp_profiles", "OTLPHttpProfileExporter": "otlp_profiles",
            "PyroscopeIngestExporter": "pyroscope"}


def __getattr__(name: str) -> Any:
    if name in _NETWORK:
        return getattr(importlib.import_module(f"{__name__}.{_NETWORK[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "Backoff", "ConsoleProfileExporter", "FilesProfileExporter", "OTLPGrpcProfileExporter", "OTLPHttpProfileExporter",
    "ProfileExporter", "PyroscopeIngestExporter", "QueuedProfileExporter", "RetryQueue", "build_profile_exporters",
]


def build_profile_exporters(config: AgentConfig) -> list[ProfileExporter]:
    """Every profile destination the configuration names, in a stable order: OTLP, Pyroscope, files, console."""
    exporters: list[ProfileExporter] = []
    otlp = config.otlp
    queue_max_bytes = config.output.queue_max_bytes
    settings = otlp.signal("profiles")
    if settings.url:
        import ssl

        from otel_gpu.exporters.otlp_profiles import OTLPGrpcProfileExporter, OTLPHttpProfileExporter

        tls = {"certificate": settings.certificate, "client_key": settings.client_key,
               "client_certificate": settings.client_certificate}
        try:
            if settings.protocol == "grpc":
                exporters.append(OTLPGrpcProfileExporter(
                    settings.url, headers=dict(settings.headers), insecure=settings.insecure, **tls,
                    compression=settings.compression, timeout_s=settings.timeout_s, queue_max_bytes=queue_max_bytes))
            else:
                exporters.append(OTLPHttpProfileExporter(
                    settings.url, headers=dict(settings.headers), **tls, compression=settings.compression,
                    timeout_s=settings.timeout_s, queue_max_bytes=queue_max_bytes))
        except (OSError, ssl.SSLError) as exc:  # a TLS file gone or unusable since validation
            _logger.error("OTLP profiles export is off: cannot use the TLS files (--otlp-certificate, "
                          "--otlp-client-key, --otlp-client-certificate): %s", exc)
    pyroscope = config.pyroscope
    if pyroscope.url:
        from otel_gpu.exporters.pyroscope import PyroscopeIngestExporter, pyroscope_headers, pyroscope_otlp_exporter

        headers = pyroscope_headers(pyroscope.tenant_id, pyroscope.basic_auth_user, pyroscope.basic_auth_password)
        if pyroscope.api == "ingest":
            exporters.append(PyroscopeIngestExporter(pyroscope.url, headers=headers, timeout_s=otlp.timeout_s,
                                                     queue_max_bytes=queue_max_bytes))
        else:
            exporters.append(pyroscope_otlp_exporter(pyroscope.url, headers=headers, timeout_s=otlp.timeout_s,
                                                     queue_max_bytes=queue_max_bytes))
    if config.writes_files("profiles"):
        exporters.append(FilesProfileExporter(config.output.dir, max_files=config.output.max_profile_files,
                                              max_bytes=config.output.max_profile_bytes))
    if config.shows_console("profiles"):
        exporters.append(ConsoleProfileExporter())
    return exporters

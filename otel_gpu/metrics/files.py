# SPDX-License-Identifier: Apache-2.0
"""Local metric files: one OTLP/JSON ``ExportMetricsServiceRequest`` per line, as the Collector's file exporter writes.

``encode_otlp_json`` is pure (OTLP/JSON rules: camelCase keys, enums as integers, trace and span ids as hex);
``JsonLinesMetricExporter`` appends the lines to ``metrics.jsonl`` and rotates it past a size bound, keeping one
old file (``metrics.jsonl.1``), so the folder never grows past about twice the bound.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common._internal.metrics_encoder import encode_metrics
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData

from otel_gpu.metrics import CUMULATIVE_EVERYWHERE

_logger = logging.getLogger(__name__)

METRICS_FILE_NAME = "metrics.jsonl"
DEFAULT_MAX_FILE_BYTES = 64 * 1024 * 1024
_ID_KEYS = frozenset({"traceId", "spanId"})
_TAIL_CHUNK_BYTES = 1 << 16


def encode_otlp_json(request: ExportMetricsServiceRequest) -> str:
    """``request`` as one line of OTLP/JSON (no newline)."""
    document = json_format.MessageToDict(request, use_integers_for_enums=True, preserving_proto_field_name=False)
    return json.dumps(_hex_ids(document), separators=(",", ":"), ensure_ascii=False)


def decode_otlp_json(line: str) -> ExportMetricsServiceRequest:
    """Inverse of :func:`encode_otlp_json` (for tests and readers of the files)."""
    document = _base64_ids(json.loads(line))
    return json_format.ParseDict(document, ExportMetricsServiceRequest())


def _hex_ids(node: Any) -> Any:
    """protobuf's JSON mapping writes bytes as base64; OTLP/JSON wants trace and span ids as hex."""
    if isinstance(node, dict):
        return {key: (base64.b64decode(value).hex() if key in _ID_KEYS and isinstance(value, str) else _hex_ids(value))
                for key, value in node.items()}
    if isinstance(node, list):
        return [_hex_ids(item) for item in node]
    return node


def _base64_ids(node: Any) -> Any:
    if isinstance(node, dict):
        return {key: (base64.b64encode(bytes.fromhex(value)).decode() if key in _ID_KEYS and isinstance(value, str)
                      else _base64_ids(value))
                for key, value in node.items()}
    if isinstance(node, list):
        return [_base64_ids(item) for item in node]
    return node


class JsonLinesMetricExporter(MetricExporter):
    """Appends each export to ``<dir>/metrics.jsonl``; returns FAILURE (never raises) when the disk refuses."""

    def __init__(self, directory: str | os.PathLike[str], max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> None:
        super().__init__(preferred_temporality=CUMULATIVE_EVERYWHERE)
        self.path = Path(directory) / METRICS_FILE_NAME
        self.rotated_path = self.path.with_name(METRICS_FILE_NAME + ".1")
        self.max_file_bytes = max_file_bytes
        self.last_error = ""
        self._lock = threading.Lock()

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        line = (encode_otlp_json(encode_metrics(metrics_data)) + "\n").encode()
        with self._lock:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                size_bytes = _append_line(self.path, line)
                if size_bytes >= self.max_file_bytes:
                    os.replace(self.path, self.rotated_path)
            except OSError as exc:
                self.last_error = f"{self.path}: {exc.strerror or exc}"
                return MetricExportResult.FAILURE
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        return None


def _append_line(path: Path, line: bytes) -> int:
    """Append ``line`` to ``path`` whole or not at all; the file's size after it.

    A full disk can take part of a write: the part is cut off again, so that readers never meet half a JSON line.
    A file that already ends in half a line (the agent was killed mid-write, or the disk refused even the cut) is
    first cut back to its last whole line."""
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        start = _whole_lines_end(fd, path)
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(fd, view):]
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            raise
        return start + len(line)
    finally:
        os.close(fd)


def _whole_lines_end(fd: int, path: Path) -> int:
    """The size of ``fd``'s file up to its last newline, the file cut back to it when it has more."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return size
    end = size
    while end > 0:
        begin = max(0, end - _TAIL_CHUNK_BYTES)
        newline = os.pread(fd, end - begin, begin).rfind(b"\n")
        if newline >= 0:
            end = begin + newline + 1
            break
        end = begin
    os.ftruncate(fd, end)
    _logger.warning("%s ended in half a line (%d bytes); cut back to its last whole line", path, size - end)
    return end

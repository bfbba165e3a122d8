# SPDX-License-Identifier: Apache-2.0
"""The terminal summary, and which exporters the configuration builds."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

from otel_gpu import config as config_module
from otel_gpu import semconv
from otel_gpu.exporters import (
    ConsoleProfileExporter,
    FilesProfileExporter,
    OTLPGrpcProfileExporter,
    OTLPHttpProfileExporter,
    PyroscopeIngestExporter,
    build_profile_exporters,
)
from otel_gpu.exporters.console import summarize
from tests.profiles import batches


def test_summary_lists_top_stacks_by_value() -> None:
    text = summarize(batches.cpu_batch(frequency_hz=100), top_n=2)
    lines = text.splitlines()
    assert lines[0].startswith("== cpu") and "total 520.0 ms" in lines[0] and "2 processes" in lines[0]
    assert len(lines) == 3
    assert "57.7%" in lines[1] and "300.0" in lines[1] and "checkout[4242] hot_loop <- main" in lines[1]
    assert "cold_loop <- main" in lines[2]


def test_summary_of_gpu_time_states_the_sampling_fraction() -> None:
    text = summarize(batches.gpu_batch())
    assert "gpu_time" in text.splitlines()[0] and "25% of events" in text
    assert "75.0%" in text and "gemm_kernel(float*, int) <- hot_loop <- main" in text


def test_summary_of_gpu_time_states_the_time_another_tool_held_cupti() -> None:
    batch = dataclasses.replace(batches.gpu_batch(), attributes=((semconv.OTEL_GPU_GPU_TIME_YIELDED, 12.5),))
    assert "not measured for 12.5 s while another tool" in summarize(batch).splitlines()[0]
    assert "not measured" not in summarize(batches.gpu_batch())


def test_console_exporter_writes_to_its_stream() -> None:
    stream = io.StringIO()
    exporter = ConsoleProfileExporter(stream)
    assert exporter.export(batches.cpu_batch())
    exporter.shutdown()
    exporter.shutdown()
    assert "hot_loop" in stream.getvalue()
    assert exporter.export(batches.cpu_batch()) is False


def _build(tmp_path: Path, environ: dict[str, str]):  # type: ignore[no-untyped-def]
    config = config_module.load(None, {"OTEL_GPU_OUTPUT_DIR": str(tmp_path), **environ})
    exporters = build_profile_exporters(config)
    for exporter in exporters:
        exporter.shutdown(1.0)
    return exporters


def test_no_backend_means_files_and_console(tmp_path: Path) -> None:
    exporters = _build(tmp_path, {})
    assert [type(e) for e in exporters] == [FilesProfileExporter, ConsoleProfileExporter]
    assert exporters[0].directory == tmp_path


def test_otlp_grpc_http_and_pyroscope_ingest(tmp_path: Path) -> None:
    grpc_only = _build(tmp_path, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"})
    assert [type(e) for e in grpc_only] == [OTLPGrpcProfileExporter]
    http = _build(tmp_path, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
                             "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_GPU_OUTPUT_FILES": "on",
                             "OTEL_GPU_PYROSCOPE_URL": "http://127.0.0.1:4040", "OTEL_GPU_PYROSCOPE_API": "ingest"})
    assert [type(e) for e in http] == [OTLPHttpProfileExporter, PyroscopeIngestExporter, FilesProfileExporter]
    assert http[0].url == "http://127.0.0.1:4318/v1development/profiles"
    assert http[1].url == "http://127.0.0.1:4040/ingest"
    assert [e.name for e in http] == ["otlp-http", "pyroscope-ingest", "files"]


def test_certificate_gone_after_validation_leaves_otlp_out(tmp_path: Path) -> None:
    pem = tmp_path / "ca.pem"
    pem.write_text("placeholder")
    config = config_module.load(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://127.0.0.1:4317",
                                       "OTEL_EXPORTER_OTLP_CERTIFICATE": str(pem)})
    pem.unlink()  # removed between validation and start
    assert build_profile_exporters(config) == []

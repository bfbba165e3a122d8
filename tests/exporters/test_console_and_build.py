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


def test_summary_lists_top_stacks_by_value_under_column_headings() -> None:
    text = summarize(batches.cpu_batch(frequency_hz=100), top_n=2)
    lines = text.splitlines()
    assert lines[0] == "== cpu samples at 100 Hz over 10.0 s: 2 processes, 4 stacks, total 520.0 ms"
    assert "(count)" not in text  # values are milliseconds of CPU time, not counts
    assert lines[1].split() == ["SHARE", "TIME", "ms", "PROCESS[PID]", "STACK", "(leaf", "<-", "callers)"]
    assert len(lines) == 4
    assert lines[2].split() == ["57.7%", "300.0", "checkout[4242]", "hot_loop", "<-", "main"]
    # each value sits under its heading
    assert lines[2].index("300.0") + len("300.0") == lines[1].index("ms") + len("ms")
    assert lines[2].index("checkout") == lines[1].index("PROCESS")
    assert "cold_loop <- main" in lines[3]


def test_summary_of_gpu_time_states_the_sampling_fraction_and_unit() -> None:
    text = summarize(batches.gpu_batch())
    assert text.splitlines()[0] == ("== gpu_time over 10.0 s: 1 process, 2 stacks, total 4.0 ms "
                                    "(estimated: 25% of the time sampled)")
    assert "(nanoseconds)" not in text and "TIME ms" in text.splitlines()[1]
    assert "75.0%" in text and "gemm_kernel(float*, int) <- hot_loop <- main" in text


def test_a_small_sampling_fraction_is_not_rounded_away() -> None:
    def header(fraction: float) -> str:
        return summarize(dataclasses.replace(batches.gpu_batch(), sampling_fraction=fraction)).splitlines()[0]

    assert "(estimated: 1.9% of the time sampled)" in header(0.019)
    assert "(estimated: 0.19% of the time sampled)" in header(0.0019)
    assert "(estimated: 0.0012% of the time sampled)" in header(0.0000123)
    assert "(estimated: 50% of the time sampled)" in header(0.5)
    assert "estimated" not in header(1.0)


def test_an_empty_batch_is_one_line_printed_once_until_samples_return() -> None:
    empty = dataclasses.replace(batches.cpu_batch(frequency_hz=100), processes=())
    assert summarize(empty) == "== cpu samples at 100 Hz over 10.0 s: nothing recorded"
    stream = io.StringIO()
    exporter = ConsoleProfileExporter(stream)
    for batch in (empty, empty, empty, batches.gpu_batch(), batches.cpu_batch(), empty, empty):
        assert exporter.export(batch)
    text = stream.getvalue()
    assert text.count("nothing recorded") == 2  # once at first, once after samples came and went
    assert text.count("== gpu_time") == 1 and text.count("hot_loop") == 2


def _yielded(batch, seconds: float):  # type: ignore[no-untyped-def]
    return dataclasses.replace(batch, processes=tuple(
        dataclasses.replace(p, attributes=((semconv.OTEL_GPU_GPU_TIME_YIELDED, seconds),)) for p in batch.processes))


def test_summary_of_gpu_time_states_the_time_another_tool_held_cupti() -> None:
    batch = _yielded(batches.gpu_batch(), 12.5)
    assert "not measured for 12.5 s in checkout[4242] while another tool" in summarize(batch).splitlines()[0]
    assert "not measured" not in summarize(batches.gpu_batch())
    # the exporter explains why once; later intervals state only the seconds, with no samples too
    stream = io.StringIO()
    exporter = ConsoleProfileExporter(stream)
    exporter.export(batch)
    unmeasured = dataclasses.replace(batch, processes=tuple(
        dataclasses.replace(p, samples=()) for p in batch.processes))
    exporter.export(unmeasured)
    headers = [line for line in stream.getvalue().splitlines() if line.startswith("==")]
    assert len(headers) == 2 and "while another tool" in headers[0]
    assert headers[1] == "== gpu_time over 10.0 s: nothing recorded; not measured for 12.5 s in checkout[4242]"


def test_summary_names_each_process_whose_gpu_time_went_unmeasured() -> None:
    from otel_gpu.profiles.model import ProcessProfile

    gpu = batches.gpu_batch()
    other = ProcessProfile(batches.OTHER, (), ((semconv.OTEL_GPU_GPU_TIME_YIELDED, 4.0),))
    header = summarize(dataclasses.replace(gpu, processes=(*gpu.processes, other))).splitlines()[0]
    assert header.startswith("== gpu_time over 10.0 s: 1 process, 2 stacks")  # other has no samples
    assert "not measured for 4.0 s in other[77]" in header


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
    assert [e.name for e in http] == ["otlp_http", "pyroscope_ingest", "files"]


def test_certificate_gone_after_validation_leaves_otlp_out(tmp_path: Path) -> None:
    pem = tmp_path / "ca.pem"
    pem.write_text("placeholder")
    config = config_module.load(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://127.0.0.1:4317",
                                       "OTEL_EXPORTER_OTLP_CERTIFICATE": str(pem)})
    pem.unlink()  # removed between validation and start
    assert build_profile_exporters(config) == []

# SPDX-License-Identifier: Apache-2.0
"""Local OTLP JSON lines: the encoding follows the OTLP/JSON rules, lines decode back, the file rotates."""

from __future__ import annotations

import json
from pathlib import Path

from opentelemetry.exporter.otlp.proto.common._internal.metrics_encoder import encode_metrics
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricExportResult
from opentelemetry.sdk.resources import Resource

from otel_gpu import selfmetrics, semconv
from otel_gpu.metrics.files import JsonLinesMetricExporter, decode_otlp_json, encode_otlp_json
from otel_gpu.metrics.pipeline import CountingExporter
from tests.metrics.gpu_readings import SimReadings
from tests.tmpfs import small_tmpfs


def _collect(gpus: int = 2):  # type: ignore[no-untyped-def]
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], resource=Resource({"service.name": "files-test"}))
    SimReadings(provider.get_meter("otel_gpu.gpu"), gpus=gpus, processes={0: [(4242, "python3", 2 * 1024**3, 0.5)]})
    return reader.get_metrics_data()


def _points(request: ExportMetricsServiceRequest, name: str) -> list:  # type: ignore[type-arg]
    found = []
    for resource_metrics in request.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                if metric.name == name:
                    data = getattr(metric, metric.WhichOneof("data"))
                    found.extend(data.data_points)
    return found


def test_lines_decode_as_otlp_json_with_every_gpu_metric(tmp_path: Path) -> None:
    exporter = JsonLinesMetricExporter(tmp_path)
    assert exporter.export(_collect()) is MetricExportResult.SUCCESS
    assert exporter.export(_collect()) is MetricExportResult.SUCCESS
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2
    document = json.loads(lines[0])
    # OTLP/JSON: camelCase field names, enums as integers, 64-bit integers as strings
    metric = document["resourceMetrics"][0]["scopeMetrics"][0]["metrics"][0]
    assert set(document) == {"resourceMetrics"} and "scopeMetrics" in document["resourceMetrics"][0]
    assert "unit" in metric and "name" in metric
    request = decode_otlp_json(lines[1])
    usage = {p.attributes[0].value.string_value: p.as_int for p in _points(request, semconv.GPU_MEMORY_USAGE.name)}
    assert usage == {"GPU-00000000-fa4e-4c1d-9a6b-000000000000": 16 * 1024**3,
                     "GPU-00000000-fa4e-4c1d-9a6b-000000000001": 32 * 1024**3}
    utilization = sorted(p.as_double for p in _points(request, semconv.GPU_UTILIZATION.name))
    assert utilization == [0.4, 0.7]
    process = _points(request, semconv.GPU_PROCESS_MEMORY_USAGE.name)
    assert [p.as_int for p in process] == [2 * 1024**3]
    sums = [m for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
            if m.WhichOneof("data") == "sum"]
    assert sums and all(m.sum.aggregation_temporality == AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
                        for m in sums)
    energy = json.dumps([m for m in json.loads(lines[1])["resourceMetrics"][0]["scopeMetrics"][0]["metrics"]
                         if m["name"] == semconv.GPU_ENERGY.name])
    assert '"aggregationTemporality": 2' in energy and '"isMonotonic": true' in energy


def test_trace_and_span_ids_are_hex() -> None:
    request = ExportMetricsServiceRequest()
    metric = request.resource_metrics.add().scope_metrics.add().metrics.add()
    metric.name = "x"
    point = metric.gauge.data_points.add()
    point.as_double = 1.0
    exemplar = point.exemplars.add()
    exemplar.trace_id = bytes.fromhex("5b8efff798038103d269b633813fc60c")
    exemplar.span_id = bytes.fromhex("eee19b7ec3c1b174")
    line = encode_otlp_json(request)
    assert '"traceId":"5b8efff798038103d269b633813fc60c"' in line
    assert '"spanId":"eee19b7ec3c1b174"' in line
    assert decode_otlp_json(line) == request


def test_rotates_past_the_bound_and_keeps_one_old_file(tmp_path: Path) -> None:
    data = _collect()
    line_bytes = len(encode_otlp_json(encode_metrics(data))) + 1
    exporter = JsonLinesMetricExporter(tmp_path, max_file_bytes=int(3.5 * line_bytes))
    for _ in range(10):  # lines 1-4 rotate out, then 5-8 replace them, 9-10 stay current
        assert exporter.export(data) is MetricExportResult.SUCCESS
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl", "metrics.jsonl.1"]
    current = (tmp_path / "metrics.jsonl").read_text().splitlines()
    old = (tmp_path / "metrics.jsonl.1").read_text().splitlines()
    assert (len(old), len(current)) == (4, 2)
    for line in old + current:
        decode_otlp_json(line)


def test_unwritable_folder_is_a_failure_not_an_exception(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the output folder should be")
    exporter = JsonLinesMetricExporter(blocker)
    assert exporter.export(_collect()) is MetricExportResult.FAILURE
    assert "not-a-folder" in exporter.last_error


def test_a_full_disk_leaves_only_whole_lines_and_the_drop_is_counted(tmp_path: Path) -> None:
    """A real tmpfs of 3 pages: the write that meets the end of the space is taken in part by the kernel; that part
    is cut off again, so every line in the file decodes, and the pipeline counts the collection as dropped."""
    data = _collect(gpus=1)
    line_bytes = len(encode_otlp_json(encode_metrics(data))) + 1
    assert 4096 < line_bytes < 3 * 4096 and 3 * 4096 % line_bytes  # the last line that fits only in part
    selfmetrics.reset()
    with small_tmpfs(tmp_path / "full", 3 * 4096) as folder:
        counting = CountingExporter(JsonLinesMetricExporter(folder), "files", "test")
        try:
            for _ in range(3 * 4096 // line_bytes + 2):  # more lines than fit
                counting.export(data)
                assert counting.force_flush(5_000)
        finally:
            counting.shutdown()
        content = (folder / "metrics.jsonl").read_bytes()
        assert content.endswith(b"\n") and len(content) % line_bytes == 0
        assert 0 < len(content) < 3 * 4096
        for line in content.decode().splitlines():
            decode_otlp_json(line)
    dropped = selfmetrics.total(semconv.SELF_DROPPED.name, otel_gpu__reason="export_failed", otel_gpu__signal="metrics")
    assert dropped > 0
    assert selfmetrics.total(semconv.SELF_EXPORT_FAILURES.name, otel_gpu__exporter="files") >= 2


def test_half_a_line_left_by_a_killed_agent_is_cut_before_the_next_line(tmp_path: Path) -> None:
    data = _collect()
    whole = encode_otlp_json(encode_metrics(data)) + "\n"
    (tmp_path / "metrics.jsonl").write_text(whole + whole[:100])
    assert JsonLinesMetricExporter(tmp_path).export(data) is MetricExportResult.SUCCESS
    assert (tmp_path / "metrics.jsonl").read_text() == whole + whole

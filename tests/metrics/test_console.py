# SPDX-License-Identifier: Apache-2.0
"""The terminal table: both GPUs with their readings and top processes; a status line before any data."""

from __future__ import annotations

import io

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricExportResult
from opentelemetry.sdk.resources import Resource

from otel_gpu import semconv
from otel_gpu.metrics.console import ConsoleTableExporter, render_console
from tests.metrics.gpu_readings import GIB, SimGPU, SimReadings

PROCESSES = {
    0: [(101, "trainer", 10 * GIB, 0.4), (102, "notebook", 1 * GIB, 0.0), (103, "tiny", GIB // 2, 0.0),
        (104, "smallest", GIB // 4, 0.0)],
    1: [(201, "server", 20 * GIB, 0.65)],
}


def _data(gpus: int = 2):  # type: ignore[no-untyped-def]
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], resource=Resource({}))
    SimReadings(provider.get_meter("otel_gpu.gpu"), gpus=gpus, processes=PROCESSES)
    return reader.get_metrics_data()


HEADINGS = ("GPU", "NAME", "UTIL", "MEMORY GiB used/limit", "POWER W used/limit", "TEMP", "SM MHz", "MEM MHz")


def _columns(heading: str, row: str) -> dict[str, str]:
    """Each cell of ``row`` by its heading: GPU and NAME start at their heading, the readings end under theirs."""
    starts = [heading.index(name) for name in HEADINGS]
    ends = [start + len(name) for start, name in zip(starts, HEADINGS, strict=True)]
    cells = {"GPU": row[:starts[1]].strip(), "NAME": row[starts[1]:starts[2]].strip()}
    for i, name in enumerate(HEADINGS[2:], start=2):
        cells[name] = row[starts[i] if i == 2 else ends[i - 1]:ends[i]].strip()
    return cells


def test_table_shows_each_gpu_with_its_readings_under_headings() -> None:
    text = render_console(_data(), interval_s=10, top_processes=3)
    lines = text.splitlines()
    assert "2 GPUs" in lines[0]
    assert lines[1].split("  ")[0].split() == ["GPU", "NAME"] and all(name in lines[1] for name in HEADINGS)
    gpu0 = _columns(lines[1], next(line for line in lines if line.startswith("0 ")))
    gpu1 = _columns(lines[1], next(line for line in lines if line.startswith("1 ")))
    assert gpu0 == {"GPU": "0", "NAME": "NVIDIA H200", "UTIL": "40%", "MEMORY GiB used/limit": "16.0/140.4",
                    "POWER W used/limit": "300/700", "TEMP": "50C", "SM MHz": "1980", "MEM MHz": "3201"}
    assert gpu1 == {"GPU": "1", "NAME": "NVIDIA H200", "UTIL": "70%", "MEMORY GiB used/limit": "32.0/140.4",
                    "POWER W used/limit": "400/700", "TEMP": "60C", "SM MHz": "1755", "MEM MHz": "3201"}


def test_top_processes_by_memory() -> None:
    text = render_console(_data(), interval_s=10, top_processes=3)
    lines = text.splitlines()
    processes0 = lines[lines.index(next(line for line in lines if line.startswith("0 "))) + 1]
    assert processes0.strip().startswith("processes: 101 trainer 10.0 GiB SM 40%, 102 notebook 1.0 GiB")
    assert "103 tiny" in processes0 and "smallest" not in processes0 and "(+1 more)" in processes0
    assert "201 server 20.0 GiB SM 65%" in text


def test_a_failed_gpu_is_marked() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], resource=Resource({}))
    meter = provider.get_meter("otel_gpu.gpu")
    readings = SimReadings(meter, gpus=1)
    lost = SimGPU(1)

    def status(options: CallbackOptions) -> list[Observation]:
        return [Observation(1, {**readings.gpus[0].attributes, semconv.HW_STATE: "ok"}),
                Observation(0, {**readings.gpus[0].attributes, semconv.HW_STATE: "failed"}),
                Observation(0, {**lost.attributes, semconv.HW_STATE: "ok"}),
                Observation(1, {**lost.attributes, semconv.HW_STATE: "failed"})]

    meter.create_observable_up_down_counter(semconv.GPU_STATUS.name, callbacks=[status], unit=semconv.GPU_STATUS.unit)
    lines = render_console(reader.get_metrics_data(), interval_s=1).splitlines()
    assert "2 GPUs" in lines[0]
    row0 = next(line for line in lines if line.startswith("0 "))
    row1 = next(line for line in lines if line.startswith("1 "))
    assert row1.endswith("FAILED") and "FAILED" not in row0 and _columns(lines[1], row0)["UTIL"] == "40%"


def test_status_line_before_any_gpu_data() -> None:
    reader = InMemoryMetricReader()
    MeterProvider(metric_readers=[reader], resource=Resource({}))
    text = render_console(reader.get_metrics_data(), interval_s=5)
    assert "\n" not in text and "no GPU metrics yet" in text
    assert "no GPU metrics yet" in render_console(None, interval_s=5)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_terminal_redraws_in_place_and_pipes_get_plain_blocks() -> None:
    terminal = _Terminal()
    exporter = ConsoleTableExporter(terminal, interval_s=1)
    assert exporter.export(_data()) is MetricExportResult.SUCCESS
    first = terminal.getvalue()
    assert "\x1b[" not in first
    exporter.export(_data())
    second = terminal.getvalue()[len(first):]
    table_lines = first.count("\n")
    assert second.startswith(f"\x1b[{table_lines}F\x1b[J")

    pipe = io.StringIO()
    plain = ConsoleTableExporter(pipe, interval_s=1)
    plain.export(_data())
    plain.export(_data())
    assert "\x1b" not in pipe.getvalue()
    assert pipe.getvalue().count("2 GPUs") == 2


def test_a_log_gets_an_unchanged_status_line_once_a_terminal_redraws_it() -> None:
    reader = InMemoryMetricReader()
    MeterProvider(metric_readers=[reader], resource=Resource({}))
    empty = reader.get_metrics_data()
    pipe = io.StringIO()
    plain = ConsoleTableExporter(pipe, interval_s=1)
    for data in (empty, empty, empty, _data(), _data(), empty, empty):
        assert plain.export(data) is MetricExportResult.SUCCESS
    assert pipe.getvalue().count("no GPU metrics yet") == 2  # at first, and again after the tables
    assert pipe.getvalue().count("2 GPUs") == 2

    terminal = _Terminal()
    redrawn = ConsoleTableExporter(terminal, interval_s=1)
    redrawn.export(empty)
    redrawn.export(empty)
    assert terminal.getvalue().count("no GPU metrics yet") == 2 and "\x1b[1F\x1b[J" in terminal.getvalue()


def test_closed_stream_is_a_failure_not_an_exception() -> None:
    stream = io.StringIO()
    stream.close()
    assert ConsoleTableExporter(stream, interval_s=1).export(_data()) is MetricExportResult.FAILURE


def test_status_line_says_gpu_metrics_are_off_when_the_source_is_down() -> None:
    from otel_gpu import selfmetrics
    from otel_gpu.metrics.self_instruments import register_self_instruments

    selfmetrics.reset()
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    register_self_instruments(provider.get_meter("self"))
    selfmetrics.set_gauge(semconv.SELF_SOURCE_UP.name, 0, otel_gpu__source="nvml")
    try:
        assert "GPU metrics are off" in render_console(reader.get_metrics_data(), interval_s=10)
        selfmetrics.set_gauge(semconv.SELF_SOURCE_UP.name, 1, otel_gpu__source="nvml")
        assert "no GPU metrics yet" in render_console(reader.get_metrics_data(), interval_s=10)
    finally:
        selfmetrics.reset()
        provider.shutdown()

# SPDX-License-Identifier: Apache-2.0
"""A node of 8 GPUs on the fake NVML: one collection cycle reads all 8, and every per-GPU metric has a series of the
right GPU for each (the readings of GPU i are the fake's documented values for i, never another GPU's); NVLink
throughput and errors per link where the GPUs have links, nothing (and one log line per GPU) where they have none."""

from __future__ import annotations

import logging
import time

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_gpu import selfmetrics, semconv
from otel_gpu.gpu.reader import GPM_MIN_GAP_S
from otel_gpu.metrics.gpu_instruments import register_gpu_instruments
from tests.gpu.conftest import read_points, select

GPUS = 8
PER_PROCESS = (semconv.GPU_PROCESS_MEMORY_USAGE, semconv.GPU_PROCESS_SM_UTILIZATION, semconv.GPU_XID_LAST_TIME)


def _uuid(gpu: int) -> str:
    return f"GPU-00000000-fa4e-4c1d-9a6b-{gpu:012x}"


def _gpus_with_series(points: list[tuple[dict[str, object], float]]) -> set[int]:
    return {int(str(a[semconv.NVIDIA_GPU_INDEX])) for a, _ in points if semconv.NVIDIA_GPU_INDEX in a}


def test_one_cycle_reads_all_eight_gpus(make_source, scenario) -> None:  # type: ignore[no-untyped-def]
    scenario.write(gpus=GPUS)
    source = make_source()
    source.collect()
    snapshots = source.snapshots()
    assert [s.info.index for s in snapshots] == list(range(GPUS))
    assert [s.info.uuid for s in snapshots] == [_uuid(i) for i in range(GPUS)]
    assert [s.power_w for s in snapshots] == [300.0 + 100.0 * i for i in range(GPUS)]
    _, gauges = selfmetrics.snapshot()
    cycles = {dict(attrs).get(semconv.NVIDIA_GPU_INDEX) for (name, attrs), _ in gauges.items()
              if name == semconv.SELF_COLLECTION_DURATION.name and dict(attrs).get(semconv.OTEL_GPU_SOURCE) == "nvml"}
    assert cycles == {str(i) for i in range(GPUS)}

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    register_gpu_instruments(provider.get_meter("test"), source)
    per_gpu = [s for s in semconv.GPU_METRICS if s not in PER_PROCESS]
    points = read_points(reader)
    after_one = {spec.name for spec in per_gpu if points.get(spec.name)}
    assert len(after_one) > len(per_gpu) / 2, after_one  # all but the GPM ratios, which need two samples
    for name in after_one:
        assert _gpus_with_series(points[name]) == set(range(GPUS)), name
    time.sleep(GPM_MIN_GAP_S + 0.02)
    source.collect()
    points = read_points(reader)
    for spec in per_gpu:
        assert _gpus_with_series(points.get(spec.name, [])) == set(range(GPUS)), spec.name
    for gpu in range(GPUS):
        assert select(points[semconv.GPU_POWER.name], hw__id=_uuid(gpu))[0][1] == 300.0 + 100.0 * gpu
    provider.shutdown()


def test_nvlink_throughput_and_errors_per_link(make_source, scenario) -> None:  # type: ignore[no-untyped-def]
    scenario.write(gpus=GPUS, nvlinks=18)  # an H200 SXM's 18 links
    source = make_source()
    source.collect()
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    register_gpu_instruments(provider.get_meter("test"), source)
    first = read_points(reader)
    time.sleep(0.2)
    source.collect()
    points = read_points(reader)
    link = semconv.NVIDIA_GPU_NVLINK.replace(".", "__")
    direction = semconv.NETWORK_IO_DIRECTION.replace(".", "__")
    error_type = semconv.ERROR_TYPE.replace(".", "__")
    for gpu in range(GPUS):
        for n in range(18):
            sent = select(points[semconv.GPU_NVLINK_IO.name], hw__id=_uuid(gpu), **{link: n, direction: "transmit"})
            received = select(points[semconv.GPU_NVLINK_IO.name], hw__id=_uuid(gpu), **{link: n, direction: "receive"})
            before = select(first[semconv.GPU_NVLINK_IO.name], hw__id=_uuid(gpu), **{link: n, direction: "transmit"})
            assert len(sent) == len(received) == len(before) == 1, (gpu, n)
            # the fake's link n of GPU i sends (1000 (1 + i) + 100 n) KiB/s and receives twice that
            assert sent[0][1] > before[0][1] > 0
            assert received[0][1] == pytest.approx(2 * sent[0][1], rel=0.01)
            errors = {a[semconv.ERROR_TYPE]: v for a, v in select(points[semconv.GPU_NVLINK_ERRORS.name],
                                                                  hw__id=_uuid(gpu), **{link: n})}
            assert errors == {"replay": (gpu + 1) * (n + 1), "recovery": gpu, "crc_flit": n, "crc_data": 0}
            assert select(points[semconv.GPU_NVLINK_ERRORS.name], hw__id=_uuid(gpu),
                          **{link: n, error_type: "replay"})
    provider.shutdown()


def test_no_nvlink_is_turned_off_once_and_gives_no_series(make_source, scenario, caplog) -> None:  # type: ignore[no-untyped-def]
    scenario.write(gpus=2)
    source = make_source()
    with caplog.at_level(logging.INFO, logger="otel_gpu.gpu.reader"):
        source.collect()
        source.collect()
    assert all(s.nvlinks == () for s in source.snapshots())
    assert sum("no NVLink" in r.getMessage() for r in caplog.records) == 2  # once per GPU
    assert source.disabled_readings() == {0: frozenset(), 1: frozenset()}  # a GPU without NVLink lacks nothing
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    register_gpu_instruments(provider.get_meter("test"), source)
    points = read_points(reader)
    assert not points.get(semconv.GPU_NVLINK_IO.name) and not points.get(semconv.GPU_NVLINK_ERRORS.name)
    assert points[semconv.GPU_POWER.name]  # the rest is read as before
    provider.shutdown()

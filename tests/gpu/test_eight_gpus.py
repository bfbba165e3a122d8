# SPDX-License-Identifier: Apache-2.0
"""A node of 8 GPUs on the fake NVML: one collection cycle reads all 8, and every per-GPU metric has a series of the
right GPU for each (the readings of GPU i are the fake's documented values for i, never another GPU's)."""

from __future__ import annotations

import time

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

# SPDX-License-Identifier: Apache-2.0
"""The GPU instruments over the real pynvml and the fake libnvidia-ml.so.1: names, units, attributes and
values converted to base units for both simulated H200s (values from tests/native/nvml/README.md)."""

from __future__ import annotations

import time

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_gpu import semconv
from otel_gpu.gpu.model import THROTTLE_REASONS
from otel_gpu.gpu.reader import GPM_MIN_GAP_S
from otel_gpu.metrics.gpu_instruments import register_gpu_instruments
from tests.gpu.conftest import BUS_IDS, GIB, MEMORY_TOTAL_BYTES, UUIDS, read_points, select, units

GPU_ATTRIBUTES = (semconv.HW_ID, semconv.HW_NAME, semconv.HW_MODEL, semconv.NVIDIA_GPU_INDEX,
                  semconv.NVIDIA_GPU_PCI_BUS_ID)


def instruments(source):  # type: ignore[no-untyped-def]
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    register_gpu_instruments(provider.get_meter("test"), source)
    return reader, provider


def two_cycles(source) -> None:  # type: ignore[no-untyped-def]
    """Two collections far enough apart for a GPM pair."""
    source.collect()
    time.sleep(GPM_MIN_GAP_S + 0.02)
    source.collect()


def value(points, gpu: int, **attributes):  # type: ignore[no-untyped-def]
    found = select(points, hw__id=UUIDS[gpu], **attributes)
    assert len(found) == 1, (gpu, attributes, points)
    return found[0][1]


def test_every_gpu_metric_has_its_unit_and_gpu_attributes_for_both_gpus(make_source) -> None:
    source = make_source()
    two_cycles(source)
    reader, provider = instruments(source)
    data = reader.get_metrics_data()
    metric_units = units(data)
    points = read_points(reader)
    per_gpu = [s for s in semconv.GPU_METRICS if s not in (semconv.GPU_PROCESS_MEMORY_USAGE,
               semconv.GPU_PROCESS_SM_UTILIZATION, semconv.GPU_XID_LAST_TIME)]
    for spec in per_gpu:
        assert metric_units.get(spec.name) == spec.unit, spec.name
        for gpu in (0, 1):
            series = select(points[spec.name], hw__id=UUIDS[gpu])
            assert series, f"{spec.name} has no series for GPU {gpu}"
            for attributes, _ in series:
                assert {k: attributes[k] for k in GPU_ATTRIBUTES} == {
                    semconv.HW_ID: UUIDS[gpu], semconv.HW_NAME: "NVIDIA H200", semconv.HW_MODEL: "NVIDIA H200",
                    semconv.NVIDIA_GPU_INDEX: gpu, semconv.NVIDIA_GPU_PCI_BUS_ID: BUS_IDS[gpu]}
    provider.shutdown()


def test_values_are_converted_to_base_units(make_source) -> None:
    source = make_source()
    two_cycles(source)
    reader, provider = instruments(source)
    p = read_points(reader)
    task = semconv.HW_GPU_TASK.replace(".", "__")
    for gpu, (general, encoder, decoder) in enumerate(((0.40, 0.02, 0.04), (0.70, 0.03, 0.05))):
        assert value(p["hw.gpu.utilization"], gpu, **{task: "general"}) == pytest.approx(general)
        assert value(p["hw.gpu.utilization"], gpu, **{task: "encoder"}) == pytest.approx(encoder)
        assert value(p["hw.gpu.utilization"], gpu, **{task: "decoder"}) == pytest.approx(decoder)
    assert [value(p["hw.gpu.memory.usage"], g) for g in (0, 1)] == [16 * GIB, 32 * GIB]
    assert [value(p["hw.gpu.memory.limit"], g) for g in (0, 1)] == [MEMORY_TOTAL_BYTES] * 2
    assert value(p["hw.gpu.memory.utilization"], 1) == pytest.approx(32 * GIB / MEMORY_TOTAL_BYTES)
    assert [value(p["nvidia.gpu.memory.bandwidth.utilization"], g) for g in (0, 1)] == pytest.approx([0.10, 0.15])
    assert [value(p["hw.power"], g, hw__type="gpu") for g in (0, 1)] == pytest.approx([300.0, 400.0])
    assert [value(p["nvidia.gpu.power.limit"], g) for g in (0, 1)] == pytest.approx([700.0, 700.0])
    energy = [value(p["hw.energy"], g) for g in (0, 1)]
    assert 1e6 <= energy[0] < 2e6 <= energy[1] < 3e6  # (i+1)*1e6 J at init, plus power * seconds since
    assert [value(p["hw.temperature"], g) for g in (0, 1)] == [50.0, 60.0]
    for gpu in (0, 1):
        assert value(p["hw.temperature.limit"], gpu, hw__limit_type="high.degraded") == 89.0
        assert value(p["hw.temperature.limit"], gpu, hw__limit_type="high.critical") == 94.0
        assert value(p["nvidia.gpu.clock.frequency"], gpu, nvidia__gpu__clock__type="memory") == 3201e6
        assert value(p["nvidia.gpu.clock.frequency.limit"], gpu, nvidia__gpu__clock__type="sm") == 1980e6
        assert value(p["hw.status"], gpu, hw__state="ok") == 1
        assert value(p["hw.status"], gpu, hw__state="failed") == 0
    assert [value(p["nvidia.gpu.clock.frequency"], g, nvidia__gpu__clock__type="sm") for g in (0, 1)] == [1980e6, 1755e6]
    assert [value(p["nvidia.gpu.performance_state"], g) for g in (0, 1)] == [0, 2]
    throttle = {g: {a[semconv.NVIDIA_GPU_THROTTLE_REASON]: v for a, v in select(p["nvidia.gpu.clock.throttle"],
                                                                               hw__id=UUIDS[g])} for g in (0, 1)}
    assert throttle[0] == {name: 0 for name, _ in THROTTLE_REASONS}
    assert throttle[1] == {name: (1 if name == "sw_power_cap" else 0) for name, _ in THROTTLE_REASONS}
    errors = {g: {a[semconv.ERROR_TYPE]: v for a, v in select(p["hw.errors"], hw__id=UUIDS[g])} for g in (0, 1)}
    assert errors == {0: {"corrected": 0, "uncorrected": 0, "pcie_replay": 0},
                      1: {"corrected": 5, "uncorrected": 1, "pcie_replay": 2}}
    gpm = {name: [value(p[name], g) for g in (0, 1)] for name in (
        "nvidia.gpu.sm.activity", "nvidia.gpu.sm.occupancy", "nvidia.gpu.tensor.activity", "nvidia.gpu.dram.activity")}
    assert gpm == {"nvidia.gpu.sm.activity": pytest.approx([0.60, 0.70]),
                   "nvidia.gpu.sm.occupancy": pytest.approx([0.25, 0.30]),
                   "nvidia.gpu.tensor.activity": pytest.approx([0.30, 0.50]),
                   "nvidia.gpu.dram.activity": pytest.approx([0.15, 0.25])}
    provider.shutdown()


def test_pcie_bytes_are_a_growing_counter_from_the_byte_counters(make_source) -> None:
    source = make_source()
    reader, provider = instruments(source)
    source.collect()
    first = read_points(reader)["hw.gpu.io"]
    time.sleep(0.05)
    source.collect()
    second = read_points(reader)["hw.gpu.io"]
    for gpu in (0, 1):
        for direction in ("transmit", "receive"):
            before = value(first, gpu, network__io__direction=direction)
            after = value(second, gpu, network__io__direction=direction)
            assert after > before
        # the fake moves RX faster than TX on every GPU, and GPU 1 faster than GPU 0
        assert value(second, gpu, network__io__direction="receive") > value(second, gpu,
                                                                          network__io__direction="transmit")
    provider.shutdown()


def test_pcie_falls_back_to_throughput_when_byte_counters_are_unsupported(make_source, scenario, caplog) -> None:
    scenario.write(unsupported="*:field197", pcie_throughput_us=1000)
    source = make_source()
    reader, provider = instruments(source)
    with caplog.at_level("INFO"):
        for _ in range(3):
            source.collect()
            time.sleep(0.02)
    points = read_points(reader)["hw.gpu.io"]
    assert value(points, 0, network__io__direction="transmit") > 0
    assert value(points, 1, network__io__direction="receive") > 0
    fallback_lines = [r for r in caplog.records if "integrating nvmlDeviceGetPcieThroughput" in r.getMessage()]
    assert len(fallback_lines) == 2  # once per GPU, not once per cycle
    provider.shutdown()


def test_callbacks_read_snapshots_only(make_source, scenario) -> None:
    """Collecting metrics calls no NVML: with every GPU lost after the last cycle, the last readings remain."""
    source = make_source()
    source.collect()
    scenario.write(lost="0,1")
    reader, provider = instruments(source)
    points = read_points(reader)
    assert [value(points["hw.power"], g) for g in (0, 1)] == pytest.approx([300.0, 400.0])
    provider.shutdown()

# SPDX-License-Identifier: Apache-2.0
"""In-test GPU readings as real observable instruments under the semconv names (no NVML needed).

Values follow the fake NVML's documented default scenario (tests/native/nvml/README.md) in base units, so the
pipeline tests and the end-to-end tests check the same numbers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from otel_gpu import semconv

GIB = 1024**3


@dataclass(frozen=True)
class SimGPU:
    index: int

    @property
    def uuid(self) -> str:
        return f"GPU-00000000-fa4e-4c1d-9a6b-{self.index:012x}"

    @property
    def attributes(self) -> dict[str, str | int]:
        return {semconv.HW_ID: self.uuid, semconv.HW_MODEL: "NVIDIA H200", semconv.NVIDIA_GPU_INDEX: self.index}

    @property
    def utilization_ratio(self) -> float:
        return (40 + 30 * self.index) / 100

    @property
    def memory_used_bytes(self) -> int:
        return 16 * GIB * (self.index + 1)

    memory_limit_bytes = 150754820096

    @property
    def power_w(self) -> float:
        return 300.0 + 100.0 * self.index

    power_limit_w = 700.0

    @property
    def temperature_cel(self) -> float:
        return 50.0 + 10 * self.index

    @property
    def sm_clock_hz(self) -> float:
        return (1980 - 225 * self.index) * 1e6

    memory_clock_hz = 3201e6


class SimReadings:
    """Registers the instruments; ``energy_j`` grows by ``power_w`` each collection, like a real counter."""

    def __init__(self, meter: Meter, gpus: int = 2,
                 processes: dict[int, list[tuple[int, str, int, float]]] | None = None) -> None:
        self.gpus = [SimGPU(i) for i in range(gpus)]
        self.processes = processes or {}
        self.collections = 0
        specs = {
            semconv.GPU_UTILIZATION: lambda g: [(g.utilization_ratio, {semconv.HW_GPU_TASK: "general"})],
            semconv.GPU_MEMORY_USAGE: lambda g: [(g.memory_used_bytes, {})],
            semconv.GPU_MEMORY_LIMIT: lambda g: [(g.memory_limit_bytes, {})],
            semconv.GPU_POWER: lambda g: [(g.power_w, {})],
            semconv.GPU_POWER_LIMIT: lambda g: [(g.power_limit_w, {})],
            semconv.GPU_ENERGY: lambda g: [((g.index + 1) * 1e6 + g.power_w * self.collections, {})],
            semconv.GPU_TEMPERATURE: lambda g: [(g.temperature_cel, {semconv.HW_SENSOR_LOCATION: "gpu"})],
            semconv.GPU_CLOCK_FREQUENCY: lambda g: [(g.sm_clock_hz, {semconv.NVIDIA_GPU_CLOCK_TYPE: "sm"}),
                                                    (g.memory_clock_hz, {semconv.NVIDIA_GPU_CLOCK_TYPE: "memory"})],
        }
        self.specs = list(specs) + [semconv.GPU_PROCESS_MEMORY_USAGE, semconv.GPU_PROCESS_SM_UTILIZATION]
        for spec, read in specs.items():
            self._register(meter, spec, self._per_gpu(spec, read))
        self._register(meter, semconv.GPU_PROCESS_MEMORY_USAGE, self._per_process(memory=True))
        self._register(meter, semconv.GPU_PROCESS_SM_UTILIZATION, self._per_process(memory=False))

    @staticmethod
    def _register(meter: Meter, spec: semconv.MetricSpec, callback) -> None:  # type: ignore[no-untyped-def]
        create = {"gauge": meter.create_observable_gauge, "counter": meter.create_observable_counter,
                  "updowncounter": meter.create_observable_up_down_counter}[spec.instrument]
        create(spec.name, callbacks=[callback], unit=spec.unit, description=spec.description)

    def _per_gpu(self, spec: semconv.MetricSpec, read):  # type: ignore[no-untyped-def]
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            if spec is semconv.GPU_ENERGY:
                self.collections += 1
            return [Observation(value, {**gpu.attributes, **extra}) for gpu in self.gpus for value, extra in read(gpu)]

        return callback

    def _per_process(self, memory: bool):  # type: ignore[no-untyped-def]
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            out = []
            for gpu in self.gpus:
                for pid, name, memory_bytes, sm_ratio in self.processes.get(gpu.index, []):
                    attributes = {**gpu.attributes, semconv.PROCESS_PID: pid, semconv.PROCESS_EXECUTABLE_NAME: name}
                    out.append(Observation(memory_bytes if memory else sm_ratio, attributes))
            return out

        return callback

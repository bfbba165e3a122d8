# SPDX-License-Identifier: Apache-2.0
"""Fixtures for the NVML source tests: the fake libnvidia-ml.so.1 loaded in-process, its scenario file,
real processes for it to list, and helpers to read OTel points from an InMemoryMetricReader.

The fake is loaded by absolute path before pynvml's first nvmlInit (glibc then hands pynvml the same object by
soname), with FAKE_NVML_SCENARIO pointing at one file for the whole session; each test writes the knobs it needs
(README.md in tests/native/nvml) and the fixture restores the default scenario afterwards.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_gpu import selfmetrics
from otel_gpu.config import GPUConfig
from otel_gpu.procfs import ProcessResolver
from tests.conftest import NATIVE

FAKE_NVML_DIR = NATIVE / "nvml" / "build"
FAKE_NVML = FAKE_NVML_DIR / "libnvidia-ml.so.1"
GIB = 1024**3
UUIDS = ("GPU-00000000-fa4e-4c1d-9a6b-000000000000", "GPU-00000000-fa4e-4c1d-9a6b-000000000001")
BUS_IDS = ("00000000:18:00.0", "00000000:2A:00.0")
MEMORY_TOTAL_BYTES = 143771 * 1024 * 1024

_SCENARIO_FILE = Path(tempfile.gettempdir()) / f"otel-gpu-fake-nvml-{os.getpid()}.scenario"


def build_fake_nvml() -> Path:
    """``make -C tests/native/nvml`` (a no-op when up to date); fails the test if it does not build."""
    result = subprocess.run(["make", "-s", "-C", str(NATIVE / "nvml")], check=False, capture_output=True, text=True, timeout=300)
    if result.returncode != 0 or not FAKE_NVML.exists():
        pytest.fail(f"building the fake NVML failed:\n{result.stdout}\n{result.stderr}", pytrace=False)
    return FAKE_NVML


class Scenario:
    """Writes the fake's scenario file atomically (the fake re-reads it on the next NVML call)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, **knobs: str | int) -> None:
        text = "".join(f"{name.upper()}={value}\n" for name, value in knobs.items())
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.path)


@pytest.fixture(scope="session")
def fake_nvml_loaded() -> Path:
    """The fake loaded into this process, reading its knobs from the session's scenario file."""
    path = build_fake_nvml()
    _SCENARIO_FILE.write_text("")
    os.environ["FAKE_NVML_SCENARIO"] = str(_SCENARIO_FILE)
    for name in [k for k in os.environ if k.startswith("FAKE_NVML_") and k != "FAKE_NVML_SCENARIO"]:
        del os.environ[name]
    ctypes.CDLL(str(path))
    return path


@pytest.fixture
def scenario(fake_nvml_loaded: Path) -> Iterator[Scenario]:
    """The scenario file, default (empty) at the start and the end of the test."""
    sc = Scenario(_SCENARIO_FILE)
    sc.write()
    selfmetrics.reset()
    yield sc
    sc.write()


@pytest.fixture
def make_source(scenario: Scenario) -> Iterator[Callable[..., Any]]:
    """Factory of opened NVMLSource objects (closed after the test)."""
    from otel_gpu.gpu.source import NVMLSource

    made: list[NVMLSource] = []

    def make(resolver: ProcessResolver | None = None, interval_s: float = 0.2, **config: Any) -> NVMLSource:
        source = NVMLSource(GPUConfig(**config), resolver or ProcessResolver(), interval_s=interval_s)
        source.open()
        made.append(source)
        return source

    yield make
    scenario.write()  # fast calls again, so threads stuck in a slow scenario finish quickly
    for source in made:
        source.close()


@pytest.fixture
def sleepers() -> Iterator[Callable[[int], list[subprocess.Popen[bytes]]]]:
    """Starts real ``sleep`` processes for the fake to list as GPU processes; kills them afterwards."""
    started: list[subprocess.Popen[bytes]] = []

    def start(count: int) -> list[subprocess.Popen[bytes]]:
        procs = [subprocess.Popen(["sleep", "600"]) for _ in range(count)]
        started.extend(procs)
        return procs

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


Point = tuple[dict[str, Any], float]


def read_points(reader: Any) -> dict[str, list[Point]]:
    """Every data point an InMemoryMetricReader collects now, by metric name: [(attributes, value)]."""
    out: dict[str, list[Point]] = {}
    data = reader.get_metrics_data()
    if data is None:
        return out
    for resource_metrics in data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                points = out.setdefault(metric.name, [])
                points.extend((dict(p.attributes), p.value) for p in metric.data.data_points)
    return out


def units(reader_data: Any) -> dict[str, str]:
    """Metric name -> unit in collected metrics data."""
    return {m.name: m.unit for rm in reader_data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}


def select(points: list[Point], **wanted: Any) -> list[Point]:
    """Points whose attributes include ``wanted`` (keys with ``__`` for ``.``)."""
    want = {k.replace("__", "."): v for k, v in wanted.items()}
    return [(a, v) for a, v in points if all(a.get(k) == val for k, val in want.items())]


def python_env_without_fake() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_NVML_") and k != "LD_LIBRARY_PATH"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


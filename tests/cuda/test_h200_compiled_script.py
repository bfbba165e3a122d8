# SPDX-License-Identifier: Apache-2.0
"""The GPU machine's torch.compile attribution script (scripts/h200/compiled.py) checked before device time is spent
on it: the share of compiled_step()'s gpu_time that has the calling line in its stack, and the report's ratios."""

from __future__ import annotations

import sys

import pytest

from otel_gpu.profiles.model import Frame, FrameKind, Sample
from otel_gpu.semconv import CUDA_GRAPH
from tests import h200_scripts


@pytest.fixture(scope="module")
def compiled():  # type: ignore[no-untyped-def]
    return h200_scripts.load("compiled")


def _py(function: str, line: int) -> Frame:
    return Frame(function, FrameKind.PYTHON, filename="program.py", line=line)


def _samples() -> list[Sample]:
    kernel = Frame("cudaGraphLaunch")
    return [
        # a replay from the calling line, with its graph id; a launch from another line of compiled_step (no graph)
        Sample((kernel, _py("run", 900), _py("compiled_step", 17), _py("main", 60)), 600,
               attributes=((CUDA_GRAPH, 3),)),
        Sample((kernel, _py("compiled_step", 16), _py("main", 60)), 200),
        Sample((kernel, _py("forward", 11), _py("eager_step", 20), _py("main", 61)), 400),
        Sample((kernel, _py("main", 40)), 50),
    ]


def test_the_share_at_the_calling_line_counts_only_compiled_steps_time(compiled) -> None:  # type: ignore[no-untyped-def]
    total, at_line, in_graph = compiled.line_shares(_samples(), call_line=17)
    assert total == 800
    assert at_line == pytest.approx(0.75) and in_graph == pytest.approx(0.75)
    assert compiled.line_shares(_samples(), call_line=99)[1] == 0.0


def test_the_report_sets_each_side_against_torch_profiler(compiled) -> None:  # type: ignore[no-untyped-def]
    reference = {"compiled_step": {"ns_per_call": 8.0, "kernels_per_call": 13},
                 "eager_step": {"ns_per_call": 4.0, "kernels_per_call": 24}}
    lines: list[str] = []
    compiled.report(reference, {"iterations": 100, "call_line": 17, "compile_s": 30.0}, _samples(), lines)
    text = "\n".join(lines)
    assert "ratio **2.000**" in text  # torch.profiler's 8 / 4
    assert "calling line (17) in its stack: **0.750**" in text
    assert "ratio compiled / eager **2.000** against torch.profiler's 2.000: +0.0 %" in text
    assert "compiled_step() 1.000, eager_step() 1.000" in text  # 800 ns over 100 x 8, 400 over 100 x 4


def test_the_program_compiles_and_finds_its_call_line(compiled) -> None:  # type: ignore[no-untyped-def]
    compile(compiled.PROGRAM, "program.py", "exec")
    lines = compiled.PROGRAM.splitlines()
    assert sum(1 for text in lines if text.strip().startswith("return fast(x)")) == 1


def test_the_reference_divides_torch_profilers_kernel_time_by_the_calls(compiled, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """kernel_time_per_call (the programs' shared torch.profiler part) run against a stand-in torch: each call of
    `a` launches two kernels of 3 us, each of `b` one of 5 us; CPU events are not kernels."""
    import types

    launched: list[float] = []

    class Event:
        def __init__(self, us: float, device: str) -> None:
            self.device_type = f"DeviceType.{device}"
            self.time_range = types.SimpleNamespace(elapsed_us=lambda: us)

    class Profile:
        def __init__(self, activities) -> None:  # type: ignore[no-untyped-def]
            self.seen: list[Event] = []

        def __enter__(self):  # type: ignore[no-untyped-def]
            launched.clear()
            return self

        def __exit__(self, *exc) -> None:  # type: ignore[no-untyped-def]
            self.seen = [Event(us, "CUDA") for us in launched] + [Event(99.0, "CPU")]

        def events(self) -> list[Event]:
            return self.seen

    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(synchronize=lambda: None)  # type: ignore[attr-defined]
    profiler = types.ModuleType("torch.profiler")
    profiler.ProfilerActivity = types.SimpleNamespace(CUDA="cuda")  # type: ignore[attr-defined]
    profiler.profile = Profile  # type: ignore[attr-defined]
    torch.profiler = profiler  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.profiler", profiler)
    namespace: dict[str, object] = {}
    exec(compile(compiled.REFERENCE, "reference.py", "exec"), namespace)  # noqa: S102
    result = namespace["kernel_time_per_call"]({"a": lambda: launched.extend([3.0, 3.0]),  # type: ignore[operator]
                                                "b": lambda: launched.append(5.0)}, 10)
    assert result == {"a": {"ns_per_call": 6000.0, "kernels_per_call": 2.0},
                      "b": {"ns_per_call": 5000.0, "kernels_per_call": 1.0}}

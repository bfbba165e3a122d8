# SPDX-License-Identifier: Apache-2.0
"""GPU-time launch stacks interleave Python and native frames as CPU samples do: a kernel launched from Python code
that C called back (main -> outer_launch -> C call_back -> inner_launch -> launch) reads
inner_launch -> call_back -> outer_launch -> main, on the interpreters the CPU interleaving test covers (the
injected library's direct reader on 3.11+, the C API on 3.10), with the real library on the fake CUDA stack."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from otel_gpu.cuda.abi import STACK_FLAG_PYTHON, STACK_FLAG_PYTHON_TRUNCATED, KStackC, PythonFrame, Stack, decode_stack
from otel_gpu.cuda.stacks import PYTHON_ENTRY, PYTHON_TRUNCATED, StackFrames, python_runs
from otel_gpu.cuda.symbols import NativeSymbolizer, SharedSymbolizer
from otel_gpu.profiles.model import Frame, FrameKind, Mapping
from tests.cpu.test_python_frames import VERSIONS, WORKLOAD, _interpreter, _marker_lines
from tests.cuda.test_native_inject import read_debug_file

ROOT = Path(__file__).parents[2]
INJECTED = ROOT / "otel_gpu" / "cuda" / "native" / "libotel_gpu_inject.so"
FAKE_CUDA = ROOT / "tests" / "native" / "cuda"


def test_entry_marks_cut_the_python_frames_into_runs() -> None:
    frames = [PythonFrame("leaf", "a.py", 3, 1), PythonFrame("called_back", "a.py", 5, 4 | PYTHON_ENTRY),
              PythonFrame("caller", "a.py", 9, 8), PythonFrame("<module>", "a.py", 12, 1 | PYTHON_ENTRY)]
    assert [[f.function for f in run] for run in python_runs(frames)] == [["leaf", "called_back"],
                                                                          ["caller", "<module>"]]
    assert [[f.function for f in run] for run in python_runs(frames[:3])] == [["leaf", "called_back"], ["caller"]]
    unmarked = [PythonFrame(f.name, f.filename, f.line, f.first_line & ~PYTHON_ENTRY) for f in frames]
    assert [len(run) for run in python_runs(unmarked)] == [4]


class _Named:
    """A NativeSymbolizer over a fixed table: pc -> frame."""

    last_complete = True

    def __init__(self, frames: dict[int, Frame]) -> None:
        self._frames = frames

    def remember(self, pid: int) -> None: ...

    def frames(self, pid: int, pcs: object) -> tuple[Frame, ...]:
        return tuple(self._frames[pc] for pc in pcs)  # type: ignore[attr-defined]

    def forget(self, pid: int) -> None: ...


def _native(name: str, path: str) -> Frame:
    return Frame(name, FrameKind.NATIVE, mapping=Mapping(0, 1, 0, path))


def test_launch_stacks_merge_like_cpu_samples() -> None:
    """The launch stack's runs go where the evaluation loops are; the interpreter's glue between two loops and what
    started it go; a stack cut short gets the remaining runs after its frames; no Python frames: unchanged."""
    table = dict(enumerate([
        _native("cuLaunchKernel", "/usr/lib/libcuda.so.1"), _native("at::launch", "/x/libtorch_cuda.so"),
        _native("_PyEval_EvalFrameDefault", "/usr/bin/python3.12"), _native("_PyObject_Call", "/usr/bin/python3.12"),
        _native("call_back", "/x/libpyspin.so"), _native("_PyEval_EvalFrameDefault", "/usr/bin/python3.12"),
        _native("Py_RunMain", "/usr/bin/python3.12"), _native("main", "/usr/bin/python3.12")]))
    symbolizer: NativeSymbolizer = _Named(table)
    python = (PythonFrame("A", "/app/a.py", 10, 9 | PYTHON_ENTRY), PythonFrame("B", "/app/a.py", 20, 19),
              PythonFrame("<module>", "/app/a.py", 30, 1 | PYTHON_ENTRY))
    frames = StackFrames(symbolizer).frames(1, Stack(native=tuple(range(8)), python=python))
    assert [f.function for f in frames] == ["cuLaunchKernel", "at::launch", "A", "call_back", "B", "<module>"]
    assert frames[2] == Frame("A", FrameKind.PYTHON, filename="/app/a.py", line=10)
    short = StackFrames(symbolizer).frames(1, Stack(native=(0, 1), python=python))
    assert [f.function for f in short] == ["cuLaunchKernel", "at::launch", "A", "B", "<module>"]
    plain = StackFrames(symbolizer).frames(1, Stack(native=tuple(range(8))))
    assert plain == tuple(table.values())
    cut = StackFrames(symbolizer).frames(1, Stack(native=tuple(range(8)), python=python[:2],
                                                   flags=STACK_FLAG_PYTHON | STACK_FLAG_PYTHON_TRUNCATED))
    assert [f.function for f in cut] == ["cuLaunchKernel", "at::launch", "A", "call_back", "B",
                                         PYTHON_TRUNCATED.function]
    assert PYTHON_TRUNCATED.function == "[truncated: Python frames past the innermost 64 not read]"


@pytest.mark.root
@pytest.mark.parametrize("name", VERSIONS)
def test_launch_stacks_put_each_python_run_in_place_of_its_evaluation_loop(name: str, tmp_path: Path) -> None:
    for built in (INJECTED, FAKE_CUDA / "libcuda.so.1", FAKE_CUDA / "libcupti.so"):
        if not built.exists():
            pytest.fail(f"{built} is not built: run make -s build")
    library = tmp_path / "inject-under-test.so"  # a private copy: no agent elsewhere attaches to it
    shutil.copyfile(INJECTED, library)
    debug = tmp_path / "records.bin"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_GPU_", "CUDA_INJECTION"))}
    env.update({"CUDA_INJECTION64_PATH": str(library), "OTEL_GPU_CUPTI_PATH": str(FAKE_CUDA / "libcupti.so"),
                "OTEL_GPU_DEBUG_FILE": str(debug), "OTEL_GPU_DEBUG_ALWAYS_ON": "1", "OTEL_GPU_WINDOW_MS": "5",
                "OTEL_GPU_OVERHEAD_BUDGET": "0.5"})
    process = subprocess.Popen([_interpreter(name), str(WORKLOAD), "cuda-callback", "200", "20000"], env=env,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    stacks = StackFrames(SharedSymbolizer())
    assert process.stdin is not None and process.stdout is not None
    try:
        pid = int(process.stdout.readline().split()[1])
        process.stdin.write("go\n")
        process.stdin.flush()
        assert process.stdout.readline().strip() == "done"
        stacks.remember(pid)  # its mappings, while it runs
        process.stdin.write("exit\n")  # a normal exit: the library writes its last records
        process.stdin.flush()
        assert process.wait(timeout=60) == 0
    finally:
        process.kill()
        process.wait()
    launches = [stacks.frames(pid, decode_stack(launch.stack, KStackC())) for launch in read_debug_file(debug).launches]
    assert len(launches) >= 10, len(launches)
    lines = _marker_lines()
    expected = [("inner_launch", FrameKind.PYTHON, lines["inner-launch"]), ("call_back", FrameKind.NATIVE, 0),
                ("outer_launch", FrameKind.PYTHON, lines["outer-launch"]),
                ("main", FrameKind.PYTHON, lines["main-outer-launch"])]
    for frames in launches:
        assert [(f.function, f.kind, f.line) for f in _chain(frames)][:4] == expected, frames
        assert [f.function for f in _chain(frames)][4:] == ["<module>"], frames
        assert not any(f.function.startswith("_PyEval_EvalFrameDefault") for f in frames), frames
        # the driver's own Python frames (tests/native/cuda/workload.py) are above inner_launch, nothing below it
        python = [f for f in frames if f.kind is FrameKind.PYTHON]
        assert python[0].filename.endswith("workload.py") and python[-1].function == "<module>", frames


def _chain(frames: tuple[Frame, ...]) -> list[Frame]:
    """The workload's own Python frames and the C frames of libpyspin.so (call_back), leaf first."""
    return [f for f in frames if (f.kind is FrameKind.PYTHON and f.filename == str(WORKLOAD)) or
            (f.mapping is not None and f.mapping.path.endswith("libpyspin.so"))]

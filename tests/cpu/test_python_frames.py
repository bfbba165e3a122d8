# SPDX-License-Identifier: Apache-2.0
"""Python frames in CPU profiles, on the real kernel with real interpreters (pyenv's 3.10-3.13 and Debian's static
3.11): tests/cpu/py_chain.py's call chain with names, files and lines, its 3:1 split by iteration counts, two
threads, and native frames of a C library (called through ctypes, built without frame pointers) above the Python
ones; `go tool pprof` reads the result and the OTLP frames carry their types."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from otel_gpu.config import ProfilingConfig
from otel_gpu.cpu.python import TRUNCATED_FRAME, PythonFrames, find_python, load_layouts
from otel_gpu.cpu.sampler import CPUSampler
from otel_gpu.cpu.source import CPUProfileSource
from otel_gpu.cuda.abi import KStackC, decode_stack
from otel_gpu.cuda.builder import python_frames
from otel_gpu.ebpf.abi import MAX_PYTHON_DEPTH
from otel_gpu.procfs import ProcessResolver
from otel_gpu.profiles.model import Frame, FrameKind, ProfileBatch, Sample
from otel_gpu.profiles.otlp import encode_otlp
from otel_gpu.profiles.pprof import encode_pprof
from otel_gpu.symbolize.elf import ElfSymbols
from tests.cuda.test_native_inject import read_debug_file
from tests.gotool import pprof_top

WORKLOAD = Path(__file__).with_name("py_chain.py")
LIBRARY = Path(__file__).parents[1] / "native" / "pyspin" / "libpyspin.so"
PYENV = Path("/root/.pyenv/versions")
INTERPRETERS = {"3.10": "3.10.*/bin/python3.10", "3.11": "3.11.*/bin/python3.11", "3.12": "3.12.*/bin/python3.12",
                "3.13": "3.13.*/bin/python3.13"}
WARM_UP = {"_warm_until_told", "_warm_until_line"}  # py_chain.py's functions before the measured work
UNIT = 200_000  # loop iterations of light(); heavy() runs three times as many


def _interpreter(name: str) -> str:
    if name == "debian-3.11":
        path = "/usr/bin/python3.11"
    else:
        found = sorted(glob.glob(str(PYENV / INTERPRETERS[name])))
        path = found[-1] if found else ""
    if not path or not Path(path).exists():
        pytest.fail(f"CPython {name} is not installed ({PYENV / INTERPRETERS.get(name, '')}): "
                    "scripts/install-system.sh installs the interpreters these tests profile")
    return path


def _marker_lines() -> dict[str, int]:
    """'heavy' -> the line of `# LINE heavy` in the workload."""
    return {line.split("# LINE ")[1].strip(): number
            for number, line in enumerate(WORKLOAD.read_text().splitlines(), 1) if "# LINE " in line}


def _profile(python: str, mode: str, rounds: int,
             symbols: bool = True) -> tuple[list[Sample], ProfileBatch, int]:
    """Samples of the measured rounds only: the workload spins in warm-up until its Python frames are walked (it is
    registered when first sampled, from the sampler's event thread), and what was sampled before is drained away.
    ``symbols=False``: no drain has time to read a symbol table (native frames stay file+offset)."""
    process = subprocess.Popen([python, str(WORKLOAD), mode, str(rounds), str(UNIT), "warm"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    assert process.stdin is not None and process.stdout is not None
    try:
        line = process.stdout.readline().split()
        assert line and line[0] == "ready", line
        pid = int(line[1])
        source = CPUProfileSource(ProfilingConfig(frequency_hz=199, pids=(pid,)), ProcessResolver())
        if not symbols:
            source.symbolize_budget_s = lambda: 0.0  # type: ignore[method-assign]
        source.open()
        try:
            process.stdin.write("go\n")  # warm-up
            process.stdin.flush()
            deadline = time.monotonic() + 60
            while not source.sampler.walks_python(pid):
                assert time.monotonic() < deadline, f"pid {pid} was never registered for Python frames"
                time.sleep(0.05)
            source.drain()
            process.stdin.write("go\n")  # the measured rounds
            process.stdin.flush()
            assert process.stdout.readline().strip() == "done"
            batch = source.drain()[0]  # while the process still lives: its code objects are read now
        finally:
            source.close()
    finally:
        process.kill()
        process.wait()
    samples = [s for p in batch.processes if p.process.pid == pid for s in p.samples
               if not WARM_UP & {f.function for f in s.frames}]  # the warm-up's last moments, before the second line
    return samples, batch, pid


def _python_chain(sample: Sample) -> tuple[Frame, ...]:
    """The sample's Python frames, root first."""
    return tuple(f for f in reversed(sample.frames) if f.kind is FrameKind.PYTHON)


def _check_chain_and_split(samples: list[Sample], version: str, threads: bool = False) -> tuple[int, int]:
    """The chain under run_rounds (and above it: main and <module>, or the thread's run) with files and lines, and
    the 3:1 split between heavy and light."""
    lines = _marker_lines()
    step = "step" if version == "3.10" else "Steps.step"  # 3.10 has no co_qualname
    caller = ("_bootstrap_inner", "run") if version == "3.10" else ("Thread._bootstrap_inner", "Thread.run")
    total = sum(s.value for s in samples)
    with_python = sum(s.value for s in samples if _python_chain(s))
    # the rounds give 260-290 samples at 199 Hz on the fastest interpreter (Debian's 3.11 on an idle machine: 30 rounds
    # gave 132-148); the 3:1 split's +-0.075 below is then about three standard deviations of the sampling
    assert total > 150, total
    assert with_python / total > 0.9, (with_python, total)  # only the samples before registration lack them
    heavy = light = 0
    glued: list[Sample] = []
    for sample in samples:
        chain = _python_chain(sample)
        names = tuple(f.function for f in chain)
        if "run_rounds" not in names:
            continue
        at = names.index("run_rounds")
        leaf = names[at + 2] if len(names) > at + 2 else ""
        if names[at:] != ("run_rounds", step, leaf, "loop") or leaf not in ("heavy", "light"):
            continue
        if leaf == "heavy":
            heavy += sample.value
        else:
            light += sample.value
        assert names[:at] == (caller if threads else ("<module>", "main")) or \
            (threads and names[at - 2:at] == caller), names
        assert all(f.filename == str(WORKLOAD) for f in chain[at:]), chain
        assert [f.line for f in chain[at:at + 3]] == [lines["run_rounds"], lines[f"step-{leaf}"], lines[leaf]], chain
        if not threads:
            assert chain[1].line == lines["main"], chain
        # pure Python: the interpreter's calling glue between evaluation loops (3.10: one loop per frame) is gone
        python_at = [i for i, f in enumerate(sample.frames) if f.kind is FrameKind.PYTHON]
        if python_at != list(range(python_at[0], python_at[-1] + 1)):
            glued.append(sample)
    assert (heavy + light) / with_python > 0.9, Counter(tuple(f.function for f in _python_chain(s)) for s in samples)
    share = heavy / (heavy + light)
    assert abs(share - 0.75) <= 0.075, (heavy, light)  # 3:1 within +-10 %
    # (a native unwind that goes astray inside the loop can leave a frame of some library: a few samples at most)
    assert sum(s.value for s in glued) <= 0.05 * (heavy + light), [s.frames for s in glued[:3]]
    return heavy, light


VERSIONS = ["3.10", "3.11", "3.12", "3.13", "debian-3.11"]


@pytest.mark.root
@pytest.mark.parametrize("name", VERSIONS)
def test_one_thread_chain_lines_and_split(name: str, tmp_path: Path) -> None:
    samples, batch, _ = _profile(_interpreter(name), "one", 60)
    _check_chain_and_split(samples, name.removeprefix("debian-"))
    kinds = {f.kind for s in samples for f in s.frames}
    assert FrameKind.PYTHON in kinds
    assert "cpython" in _frame_types(batch)
    _pprof_reads(batch, tmp_path)


@pytest.mark.root
@pytest.mark.parametrize("name", VERSIONS)
def test_python_frames_sit_above_the_threads_start_when_native_frames_are_unnamed(name: str) -> None:
    """With no time to read libpython's symbols (a short run's only drain, a busy node), its evaluation loops are
    still found by address: the Python chain takes their place, and what started the interpreter (main, libc's
    __libc_start_main, _start) goes, rather than sitting between the leaf and the Python frames."""
    samples, _, _ = _profile(_interpreter(name), "one", 60, symbols=False)
    _check_chain_and_split(samples, name.removeprefix("debian-"))
    python = [s for s in samples if _python_chain(s)]
    assert not any(f.function.startswith("_PyEval") for s in python for f in s.frames)  # nothing was named
    files: dict[str, ElfSymbols] = {}
    misplaced = []
    for sample in python:  # named here, after the fact: none is a loop or what started the interpreter
        user = [f for f in sample.frames if f.kind is not FrameKind.KERNEL]
        first = next(i for i, f in enumerate(user) if f.kind is FrameKind.PYTHON)
        assert all(f.kind is FrameKind.PYTHON for f in user[first:]), user  # the Python frames are the root's
        names = {_name(files, frame, leaf=i == 0) for i, frame in enumerate(user[:first])}
        if names & {"_PyEval_EvalFrameDefault", "Py_RunMain", "main", "__libc_start_main", "_start"}:
            misplaced.append(sample)
    assert sum(s.value for s in misplaced) <= 0.05 * sum(s.value for s in python), \
        [[_name(files, f, leaf=i == 0) for i, f in enumerate(s.frames)] for s in misplaced[:3]]


def _name(files: dict[str, ElfSymbols], frame: Frame, leaf: bool) -> str:
    """The function a user frame's address lies in, read from its file here ("" when not found)."""
    if frame.mapping is None:
        return ""
    path = frame.mapping.path
    if path not in files:
        files[path] = ElfSymbols(path)
    elf = files[path]
    vaddr = elf.vaddr_of(frame.address - frame.mapping.start + frame.mapping.file_offset - (0 if leaf else 1))
    found = elf.lookup(vaddr) if vaddr is not None else None
    return found[0] if found is not None else ""


@pytest.mark.root
@pytest.mark.parametrize("name", ["3.10", "3.12", "3.13"])
def test_a_python_stack_deeper_than_the_walker_reads_is_rooted_in_a_truncation_frame(name: str) -> None:
    """run_rounds under 300 recurse frames: the walker reads the innermost MAX_PYTHON_DEPTH, and the sample's root
    is the one truncation frame (not a recurse frame, which a flame graph would show as a root of its own)."""
    samples, _, _ = _profile(_interpreter(name), "deep", 20)
    deep = [s for s in samples if "run_rounds" in {f.function for f in s.frames}]
    assert sum(s.value for s in deep) > 100, len(samples)
    for sample in deep:
        chain = _python_chain(sample)
        assert chain[0] is TRUNCATED_FRAME, [f.function for f in chain[:3]]
        assert len(chain) == MAX_PYTHON_DEPTH + 1, len(chain)
        names = [f.function for f in chain[1:]]
        assert set(names[:names.index("run_rounds")]) == {"recurse"}, names


def _frame_types(batch: ProfileBatch) -> set[str]:
    """profile.frame.type of every location of the batch's OTLP encoding."""
    d = encode_otlp(batch).dictionary
    return {d.attribute_table[i].value.string_value for loc in d.location_table for i in loc.attribute_indices
            if d.string_table[d.attribute_table[i].key_strindex] == "profile.frame.type"}


@pytest.mark.root
def test_a_thread_behind_a_hundred_others_is_found() -> None:
    samples, _, _ = _profile(_interpreter("3.12"), "crowd", 60)
    _check_chain_and_split(samples, "3.12")


def _pprof_reads(batch: ProfileBatch, tmp_path: Path) -> None:
    path = tmp_path / "cpu.pb.gz"
    path.write_bytes(encode_pprof(batch))
    _, rows = pprof_top([path], tmp_path, "-cum")  # by cumulative time: a stripped interpreter's many unnamed leaf
    assert "heavy" in rows and "loop" in rows, rows  # addresses can push heavy's flat time out of the top rows
    assert "<module>" in rows and "<unknown>" not in rows, rows  # pprof keeps Python's names in angle brackets


@pytest.mark.root
@pytest.mark.parametrize("name", VERSIONS)
def test_two_threads_each_with_its_own_chain(name: str) -> None:
    samples, _, pid = _profile(_interpreter(name), "two", 30)
    _check_chain_and_split(samples, name.removeprefix("debian-"), threads=True)
    per_thread: Counter[int] = Counter()
    for sample in samples:
        if "run_rounds" in [f.function for f in _python_chain(sample)]:
            per_thread[sample.thread_id] += sample.value
    workers = [tid for tid in per_thread if tid != pid]
    assert len(workers) == 2, per_thread  # both worker threads, neither the main thread, run the chain
    assert min(per_thread[t] for t in workers) > 0.25 * sum(per_thread.values()), per_thread


@pytest.mark.root
@pytest.mark.parametrize("name", VERSIONS)
def test_native_frames_of_a_c_library_sit_above_the_python_ones(name: str) -> None:
    samples, batch, _ = _profile(_interpreter(name), "ctypes", 30)
    heavy = light = with_library = 0
    for sample in samples:
        names = [f.function for f in _python_chain(sample)]
        user = [f for f in sample.frames if f.kind is not FrameKind.KERNEL]
        first_python = next((i for i, f in enumerate(user) if f.kind is FrameKind.PYTHON), len(user))
        native = user[:first_python]
        if names[-1:] == ["heavy"]:
            heavy += sample.value
        elif names[-1:] == ["light"]:
            light += sample.value
        else:
            continue
        if native and native[0].function in ("spin_inner", "spin_work") and native[0].mapping is not None \
                and native[0].mapping.path.endswith("libpyspin.so"):
            with_library += sample.value
    assert heavy + light > 150, (heavy, light)
    assert with_library / (heavy + light) > 0.9, (with_library, heavy, light)
    assert abs(heavy / (heavy + light) - 0.75) <= 0.075, (heavy, light)
    assert {"cpython", "native"} <= _frame_types(batch)


@pytest.mark.root
@pytest.mark.parametrize("name", VERSIONS)
def test_python_called_back_from_c_sits_below_the_c_frames_that_called_it(name: str) -> None:
    """main -> outer -> call_back (C, libpyspin.so, no frame pointers) -> inner -> loop: each run of Python frames
    takes the place of the evaluation loop that runs it, so the C frame sits between outer and inner."""
    python = _interpreter(name)
    process = subprocess.Popen([python, str(WORKLOAD), "callback", "80", str(UNIT)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    assert process.stdin is not None and process.stdout is not None
    try:
        pid = int(process.stdout.readline().split()[1])
        source = CPUProfileSource(ProfilingConfig(frequency_hz=199, pids=(pid,)), ProcessResolver())
        source.open()
        try:
            process.stdin.write("go\n")
            process.stdin.flush()
            assert process.stdout.readline().strip() == "warm"
            source.drain()  # registers the process: its Python walker and its native unwind tables
            assert source.sampler.settle_unwinder(60)
            source.drain()
            process.stdin.write("go\n")
            process.stdin.flush()
            assert process.stdout.readline().strip() == "done"
            batch = source.drain()[0]
        finally:
            source.close()
    finally:
        process.kill()
        process.wait()
    lines = _marker_lines()
    expected = [("loop", FrameKind.PYTHON), ("inner", FrameKind.PYTHON), ("call_back", FrameKind.NATIVE),
                ("outer", FrameKind.PYTHON), ("main", FrameKind.PYTHON), ("<module>", FrameKind.PYTHON)]
    total = interleaved = 0
    orders: Counter[tuple[str, ...]] = Counter()
    for sample in (s for p in batch.processes if p.process.pid == pid for s in p.samples):
        total += sample.value
        kept = [f for f in sample.frames if f.kind is FrameKind.PYTHON or
                (f.mapping is not None and f.mapping.path.endswith("libpyspin.so"))]
        orders[tuple(f.function for f in kept)] += sample.value
        if [(f.function, f.kind) for f in kept] != expected:
            continue
        assert [f.line for f in kept if f.kind is FrameKind.PYTHON][1:3] == [lines["inner"], lines["outer"]], kept
        assert not any(f.function.startswith("_PyEval_EvalFrameDefault") for f in sample.frames), sample.frames
        interleaved += sample.value
    assert total > 150, total
    assert interleaved / total > 0.8, orders.most_common(5)


INJECTED = Path(__file__).parents[2] / "otel_gpu" / "cuda" / "native" / "libotel_gpu_inject.so"
FAKE_CUDA = Path(__file__).parents[1] / "native" / "cuda"


@pytest.mark.root
@pytest.mark.parametrize("name", VERSIONS)
def test_gpu_launch_stacks_and_cpu_samples_name_python_frames_alike(name: str, tmp_path: Path) -> None:
    """One process, profiled both ways at once: the CPU sampler (BPF walker, code objects read by the agent) and the
    injected library's launch stacks (pyframes.c in-process, or the C API on 3.10) name the same Python frames with
    equal frames (function, file, line, type), so each function is one node in both flame graphs."""
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
    process = subprocess.Popen([_interpreter(name), str(WORKLOAD), "cuda", "200", str(UNIT // 10)], env=env,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert process.stdin is not None and process.stdout is not None
    try:
        pid = int(process.stdout.readline().split()[1])
        source = CPUProfileSource(ProfilingConfig(frequency_hz=199, pids=(pid,)), ProcessResolver())
        source.open()
        try:
            process.stdin.write("go\n")
            process.stdin.flush()
            assert process.stdout.readline().strip() == "done"
            batch = source.drain()[0]
        finally:
            source.close()
        process.stdin.write("exit\n")  # a normal exit: the library writes its last records
        process.stdin.flush()
        assert process.wait(timeout=60) == 0
    finally:
        process.kill()
        process.wait()
    cpu = Counter(_python_chain(s)[:4] for p in batch.processes if p.process.pid == pid for s in p.samples)
    gpu = Counter(tuple(reversed(python_frames(decode_stack(launch.stack, KStackC()).python)))[:4]
                  for launch in read_debug_file(debug).launches)
    assert cpu and gpu, (cpu, gpu)
    lines = _marker_lines()
    # root first: <module>, main, gpu_rounds, Launcher.after; only the last one's line differs (loop vs launch)
    cpu_chain, _ = cpu.most_common(1)[0]
    gpu_chain, _ = gpu.most_common(1)[0]
    after = "after" if name == "3.10" else "Launcher.after"  # 3.10 has no co_qualname
    assert [f.function for f in cpu_chain] == ["<module>", "main", "gpu_rounds", after], cpu.most_common(3)
    assert cpu_chain[:3] == gpu_chain[:3], (cpu_chain, gpu_chain)
    assert (cpu_chain[3].function, cpu_chain[3].filename, cpu_chain[3].kind) == \
        (gpu_chain[3].function, gpu_chain[3].filename, gpu_chain[3].kind), (cpu_chain, gpu_chain)
    assert [cpu_chain[3].line, gpu_chain[3].line] == [lines["after-loop"], lines["after-launch"]]
    assert cpu_chain[2].line == lines["gpu_rounds"] and cpu_chain[1].line == lines["main-gpu"], cpu_chain


def test_layouts_table_parses_every_version() -> None:
    layouts = load_layouts()
    assert set(layouts) == {(3, 10), (3, 11), (3, 12), (3, 13)}
    assert layouts[(3, 10)]["frame_objects"] == 1 and layouts[(3, 12)]["owner_cstack"] == 3
    assert all(len(fields) == len(layouts[(3, 11)]) for fields in layouts.values())


@pytest.mark.root
@pytest.mark.parametrize("name", VERSIONS)
def test_each_interpreter_is_found_with_its_version(name: str) -> None:
    python = _interpreter(name)
    process = subprocess.Popen([python, str(WORKLOAD), "one", "1", "1"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    try:
        pid = int(process.stdout.readline().split()[1])
        found = find_python(pid)
        assert found is not None and not isinstance(found, str), found
        assert f"{found.version[0]}.{found.version[1]}" == name.removeprefix("debian-")
        if found.version >= (3, 13):  # read from _Py_DebugOffsets: the same as the table's row
            row = load_layouts()[found.version]
            assert {k: v for k, v in found.layout.items() if k in row} == {k: row[k] for k in found.layout if k in row}
        assert PythonFrames().discover(pid) is not None
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize("version", ["3.9", "3.6"])  # 3.6 has no _PyRuntime: it was taken for no Python at all
def test_an_unsupported_version_gets_one_frame_naming_it(version: str) -> None:
    python = sorted(glob.glob(str(PYENV / f"{version}.*/bin/python{version}")))
    if not python:
        pytest.fail(f"pyenv's CPython {version} is not installed (scripts/install-system.sh)")
    process = subprocess.Popen([python[-1], str(WORKLOAD), "one", "1", "1"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    try:
        pid = int(process.stdout.readline().split()[1])
        frames = PythonFrames()
        assert frames.discover(pid) is None
        merged = frames.merged(pid, (), None)
        assert [f.function for f in merged] == [f"[CPython {version}: Python frames not supported]"]
    finally:
        process.kill()
        process.wait()


@pytest.mark.root
def test_a_process_first_sampled_before_it_execs_python_gets_its_frames() -> None:
    """A shell spins (sampled and announced as a shell), then execs Python: the next drain sees the new executable
    and registers it, so the Python work after that has its frames."""
    python = _interpreter("3.12")
    script = f"i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; exec {python} {WORKLOAD} one 30 {UNIT}"
    source = CPUProfileSource(ProfilingConfig(frequency_hz=199), ProcessResolver())
    source.open()
    process = subprocess.Popen(["sh", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert process.stdin is not None and process.stdout is not None
    try:
        line = process.stdout.readline().split()
        pid = int(line[1])
        assert pid == process.pid
        first = [s for b in source.drain() for p in b.processes if p.process.pid == pid for s in p.samples]
        assert sum(s.value for s in first) > 5  # the shell was sampled: the process was announced before exec
        process.stdin.write("go\n")
        process.stdin.flush()
        assert process.stdout.readline().strip() == "done"
        samples = [s for b in source.drain() for p in b.processes if p.process.pid == pid for s in p.samples]
    finally:
        source.close()
        process.kill()
        process.wait()
    _check_chain_and_split(samples, "3.12")


@pytest.mark.root
def test_whole_samples_through_the_ring_buffer_carry_their_python_stack() -> None:
    """raw_only sends every sample whole (the path a stack-id collision takes): each still carries its Python stack."""
    process = subprocess.Popen([_interpreter("3.11"), str(WORKLOAD), "one", "10", str(UNIT)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    assert process.stdin is not None and process.stdout is not None
    sampler = CPUSampler(199, pids=[int(process.stdout.readline().split()[1])], raw_only=True)
    sampler.open()
    try:
        frames = PythonFrames()
        found = frames.discover(process.pid)
        assert found is not None
        sampler.register_python(process.pid, found.proc)
        process.stdin.write("go\n")
        process.stdin.flush()
        assert process.stdout.readline().strip() == "done"
        time.sleep(0.3)  # the ring buffer's poller hands the last samples over
        samples = [s for s in sampler.drain() if s.pid == process.pid]
        stacks = sampler.python_stacks({s.python_stack_id for s in samples if s.python_stack_id})
        names = Counter(f.function for s in samples for f in frames.merged(process.pid, (), stacks.get(
            s.python_stack_id)))
    finally:
        sampler.close()
        process.kill()
        process.wait()
    assert len(samples) > 50 and sum(1 for s in samples if s.python_stack_id) / len(samples) > 0.9
    assert names["heavy"] > 2 * names["light"] > 0, names


@pytest.mark.root
def test_a_failure_reading_one_processs_python_frames_keeps_its_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever reading a process's Python frames raises (a torn pointer once gave os.pread an offset past 2**63),
    the drain goes on: the samples keep their native frames, the failure is counted and logged once."""
    from otel_gpu import selfmetrics, semconv
    from otel_gpu.cpu.python import PythonFrames

    def broken(self, pid, stacks):  # type: ignore[no-untyped-def]
        if stacks:
            raise OverflowError("Python int too large to convert to C long")
        return {}

    selfmetrics.reset()
    monkeypatch.setattr(PythonFrames, "runs_of", broken)
    samples, _, _ = _profile(_interpreter("3.12"), "one", 10)
    assert sum(s.value for s in samples) > 50
    assert not any(f.kind is FrameKind.PYTHON for s in samples for f in s.frames)
    assert any(f.kind is FrameKind.NATIVE for s in samples for f in s.frames)
    assert selfmetrics.total(semconv.SELF_ERRORS.name,
                             otel_gpu__reason=semconv.Reason.PYTHON_CODE_UNREADABLE) >= 1


def _shell_then_python(python: str, args: str, spin: int = 60000) -> subprocess.Popen[str]:
    """A shell that spins (so that it is sampled, and announced, as a shell) and then execs Python: the way a
    wrapper script or an interactive shell starts it."""
    script = f"i=0; while [ $i -lt {spin} ]; do i=$((i+1)); done; exec {python} {args}"
    return subprocess.Popen(["sh", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _announced_as(source: CPUProfileSource) -> dict[int, str]:
    """pid -> the name each process had when first sampled (announced by the kernel), recorded from now on."""
    names: dict[int, str] = {}
    announce = source.sampler._on_new_process
    assert announce is not None

    def record(pid: int, comm: str, exec_id: int, arg_start: int) -> None:
        names.setdefault(pid, comm)
        announce(pid, comm, exec_id, arg_start)

    source.sampler._on_new_process = record
    return names


@pytest.mark.root
@pytest.mark.parametrize("process_name", ["", "^python3\\.12$"])
def test_a_python_a_shell_execs_after_the_agent_started_is_walked_before_any_drain(process_name: str) -> None:
    """No drain between the exec and the work: the Python frames come from the process being watched after its first
    sample (as a shell), not from a drain noticing the new executable. With --process-name, the shell was filtered
    out at that first sample: the Python it became is selected."""
    python = _interpreter("3.12")
    source = CPUProfileSource(ProfilingConfig(frequency_hz=199, process_name=process_name), ProcessResolver())
    announced = _announced_as(source)
    source.open()
    process = _shell_then_python(python, f"{WORKLOAD} one 30 {UNIT} warm")
    assert process.stdin is not None and process.stdout is not None
    try:
        pid = int(process.stdout.readline().split()[1])
        assert pid == process.pid
        process.stdin.write("go\n")  # warm-up: spins until told
        process.stdin.flush()
        deadline = time.monotonic() + 5
        while not source.sampler.walks_python(pid):
            assert time.monotonic() < deadline, f"pid {pid} (first sampled as {announced.get(pid)!r}) was not " \
                                                "registered for Python frames within 5 s"
            time.sleep(0.02)
        assert announced.get(pid) not in (None, "python3.12"), announced  # sampled first as the shell (or the fork)
        source.drain()  # the warm-up
        process.stdin.write("go\n")
        process.stdin.flush()
        assert process.stdout.readline().strip() == "done"
        profiles = [p for b in source.drain() for p in b.processes if p.process.pid == pid]
    finally:
        source.close()
        process.kill()
        process.wait()
    # the identity read again after the exec: python's, named after its script
    assert [(p.process.executable_name, p.process.service_name) for p in profiles] == [("python3.12",
                                                                                        Path(WORKLOAD).stem)]
    _check_chain_and_split([s for p in profiles for s in p.samples if not WARM_UP & {f.function for f in s.frames}],
                           "3.12")


@pytest.mark.root
def test_a_process_that_execs_and_exits_between_two_drains_is_named_by_its_new_executable() -> None:
    """First sampled as a shell, exec'd, gone before the drain: its samples after the exec carry the identity it had
    after exec, and the shell's before it stay the shell's (tests/cpu/test_exec.py)."""
    python = _interpreter("3.13")
    source = CPUProfileSource(ProfilingConfig(frequency_hz=199), ProcessResolver())
    announced = _announced_as(source)
    source.open()
    try:
        process = _shell_then_python(python, "-c 'import time\nend = time.time() + 0.6\nwhile time.time() < end: pass'")
        process.communicate(timeout=30)
        profiles = [p for b in source.drain() for p in b.processes if p.process.pid == process.pid]
    finally:
        source.close()
    assert announced.get(process.pid) not in (None, "python3.13"), announced  # as the shell (or the fork)
    (after,) = [p for p in profiles if p.process.executable_name == "python3.13"]
    info = after.process
    assert (info.executable_name, info.service_name) == ("python3.13", "python3.13"), info
    assert info.executable_path == os.path.realpath(python)
    assert sum(s.value for s in after.samples if s.thread_name == "python3.13") > 50
    # the shell's (and the fork's) samples under their own names; the exec renames the thread a moment before the
    # kernel counts the exec, so a tick inside execve may carry the new name
    before = [s for p in profiles if p is not after for s in p.samples]
    assert sum(s.value for s in before if s.thread_name == "python3.13") <= 2, before


@pytest.mark.root
def test_a_program_that_maps_libpython_after_its_first_sample_gets_its_python_frames() -> None:
    """The first look finds no interpreter (the program embeds CPython and dlopen()s libpython 300 ms in, as a loader
    still mapping it would): the watch sees the process grow and looks again, no exec and no drain needed."""
    python = Path(_interpreter("3.12"))
    library = sorted(python.parent.parent.glob("lib/libpython3.12.so*"))
    host = Path(__file__).parents[1] / "native" / "workloads" / "late_python"
    assert library and host.exists(), "make -C tests/native builds late_python; pyenv's 3.12 is a shared build"
    source = CPUProfileSource(ProfilingConfig(frequency_hz=199), ProcessResolver())
    announced = _announced_as(source)
    source.open()
    process = subprocess.Popen([host, library[-1], WORKLOAD, "one", "30", str(UNIT), "warm"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONHOME": str(python.parents[1])})
    assert process.stdin is not None and process.stdout is not None
    try:
        pid = int(process.stdout.readline().split()[1])
        # looked at while it had no libpython: as late_python, or first as this process forked, before the exec
        own = Path("/proc/self/comm").read_text().strip()
        assert announced.get(pid) in ("late_python", own), announced
        process.stdin.write("go\n")
        process.stdin.flush()
        deadline = time.monotonic() + 5
        while not source.sampler.walks_python(pid):
            assert time.monotonic() < deadline, f"pid {pid} was not registered for Python frames within 5 s"
            time.sleep(0.02)
        source.drain()
        process.stdin.write("go\n")
        process.stdin.flush()
        assert process.stdout.readline().strip() == "done"
        samples = [s for b in source.drain() for p in b.processes if p.process.pid == pid for s in p.samples
                   if not WARM_UP & {f.function for f in s.frames}]
    finally:
        source.close()
        process.kill()
        process.wait()
    _check_chain_and_split(samples, "3.12")


@pytest.mark.root
@pytest.mark.parametrize("name", ["3.11", "3.12", "3.13"])
def test_a_python_process_that_exits_before_the_first_drain_keeps_its_python_frames(name: str) -> None:
    """A short job (~1.5 s of py_chain.py's rounds) starts after the agent and exits before any drain: its code
    objects are read while it runs (when the walker first stores each of its stacks), so the drain after its exit
    names its Python frames rather than leaving the interpreter's native ones."""
    source = CPUProfileSource(ProfilingConfig(frequency_hz=199), ProcessResolver())
    source.open()
    try:
        process = subprocess.Popen([_interpreter(name), str(WORKLOAD), "one", "50", str(UNIT)], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True)
        out, _ = process.communicate("go\n", timeout=60)  # the rounds, then "done", then stdin's end: it exits
        assert out.split()[-1:] == ["done"], out
        started = time.monotonic()
        profiles = [p for b in source.drain() for p in b.processes if p.process.pid == process.pid]
        assert time.monotonic() - started < 30
    finally:
        source.close()
    samples = [s for p in profiles for s in p.samples]
    total = sum(s.value for s in samples)
    chains = Counter(tuple(f.function for f in _python_chain(s)) for s in samples)
    with_rounds = sum(s.value for s in samples if "run_rounds" in [f.function for f in _python_chain(s)])
    assert total > 150, total
    # only its start-up (before it was registered, ~15 ms after Python appeared) and its imports lack the chain
    assert with_rounds / total > 0.6, (with_rounds, total, chains.most_common(5))
    leaves: Counter[str] = Counter()
    for sample in samples:
        if _python_chain(sample):
            leaves[_python_chain(sample)[-1].function] += sample.value
    assert leaves["loop"] > 0.5 * total, leaves
    files = {f.filename for s in samples for f in _python_chain(s) if f.function in ("run_rounds", "heavy", "light")}
    assert files == {str(WORKLOAD)}, files

# SPDX-License-Identifier: Apache-2.0
"""python_layouts.h (the one table of CPython layouts, shared by the injected library and the BPF walker) against
offsetof() compiled with each installed interpreter's own internal headers; the merge rule and line tables."""

from __future__ import annotations

import ctypes
import glob
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from otel_gpu import selfmetrics, semconv
from otel_gpu.cpu.python import (TRUNCATED_FRAME, CodeReader, PythonFrames, PythonProcess, _line_310, _line_311,
                                 find_python, load_layouts, merge)
from otel_gpu.ebpf import abi
from otel_gpu.profiles.model import Frame, FrameKind, Mapping

PROGRAM = r"""
#define Py_BUILD_CORE 1
#include <Python.h>
#include <frameobject.h>
#include <internal/pycore_runtime.h>
#include <internal/pycore_interp.h>
#include <internal/pycore_pystate.h>
#if PY_VERSION_HEX >= 0x030B0000
#include <internal/pycore_frame.h>
#endif
#include <internal/pycore_code.h>
#include <stdio.h>
#include <stddef.h>
#define P(name, expr) printf("%s %zu\n", name, (size_t)(expr))
int main(void) {
    P("runtime_interpreters_head", offsetof(_PyRuntimeState, interpreters.head));
    P("tstate_next", offsetof(PyThreadState, next));
    P("tstate_thread_id", offsetof(PyThreadState, thread_id));
    P("code_filename", offsetof(PyCodeObject, co_filename));
    P("code_name", offsetof(PyCodeObject, co_name));
    P("code_firstlineno", offsetof(PyCodeObject, co_firstlineno));
    P("code_linetable", offsetof(PyCodeObject, co_linetable));
    P("ascii_size", sizeof(PyASCIIObject));
    P("compact_size", sizeof(PyCompactUnicodeObject));
    P("compact_utf8", offsetof(PyCompactUnicodeObject, utf8));
#if PY_VERSION_HEX >= 0x030B0000
    P("interp_threads_head", offsetof(PyInterpreterState, threads.head));
    P("code_qualname", offsetof(PyCodeObject, co_qualname));
    P("code_adaptive", offsetof(PyCodeObject, co_code_adaptive));
    P("frame_previous", offsetof(_PyInterpreterFrame, previous));
    P("frame_owner", offsetof(_PyInterpreterFrame, owner));
#else
    P("interp_threads_head", offsetof(PyInterpreterState, tstate_head));
    P("tstate_frame", offsetof(PyThreadState, frame));
    P("frame_previous", offsetof(PyFrameObject, f_back));
    P("frame_code", offsetof(PyFrameObject, f_code));
    P("frame_instr", offsetof(PyFrameObject, f_lasti));
#endif
#if PY_VERSION_HEX >= 0x030D0000
    P("tstate_frame", offsetof(PyThreadState, current_frame));
    P("frame_code", offsetof(_PyInterpreterFrame, f_executable));
    P("frame_instr", offsetof(_PyInterpreterFrame, instr_ptr));
#elif PY_VERSION_HEX >= 0x030B0000
#if PY_VERSION_HEX < 0x030C0000
    P("frame_is_entry", offsetof(_PyInterpreterFrame, is_entry));
#endif
    P("tstate_frame", offsetof(PyThreadState, cframe));
    P("cframe_current", offsetof(_PyCFrame, current_frame));
    P("frame_code", offsetof(_PyInterpreterFrame, f_code));
    P("frame_instr", offsetof(_PyInterpreterFrame, prev_instr));
#endif
    return 0;
}
"""

INCLUDES = {(3, 10): "/root/.pyenv/versions/3.10.*/include/python3.10",
            (3, 11): "/root/.pyenv/versions/3.11.*/include/python3.11",
            (3, 12): "/root/.pyenv/versions/3.12.*/include/python3.12",
            (3, 13): "/root/.pyenv/versions/3.13.*/include/python3.13",
            (3, 110): "/usr/include/python3.11"}  # Debian's 3.11: the same layout as pyenv's


@pytest.mark.parametrize("version", sorted(INCLUDES))
def test_table_matches_offsetof_against_the_interpreters_headers(version: tuple[int, int], tmp_path: Path) -> None:
    found = sorted(glob.glob(INCLUDES[version]))
    compiler = shutil.which("cc") or shutil.which("gcc")
    if not found or compiler is None:
        pytest.fail(f"needs a C compiler and the headers at {INCLUDES[version]} (scripts/install-system.sh)")
    source = tmp_path / "offsets.c"
    source.write_text(PROGRAM)
    binary = tmp_path / "offsets"
    subprocess.run([compiler, "-I", found[-1], "-I", f"{found[-1]}/internal", "-o", str(binary), str(source)],
                   check=True)
    printed = dict(line.split() for line in subprocess.run([str(binary)], check=True, capture_output=True,
                                                           text=True).stdout.splitlines())
    table = load_layouts()[(3, 11) if version == (3, 110) else version]
    assert printed, "nothing printed"
    for name, value in printed.items():
        assert table[name] == int(value), (name, table[name], value)


def test_native_frames_above_the_innermost_python_one_are_kept_the_interpreters_replaced() -> None:
    native = (Frame("spin_inner"), Frame("ffi_call"), Frame("_PyEval_EvalFrameDefault"), Frame("Py_RunMain"))
    python = (Frame("heavy", FrameKind.PYTHON), Frame("main", FrameKind.PYTHON))
    assert [f.function for f in merge(native, (python,))] == ["spin_inner", "ffi_call", "heavy", "main"]
    assert merge(native, ()) == native
    # a native stack cut short before the interpreter (no frame pointers) keeps what it has, Python below it
    assert [f.function for f in merge(native[:2], (python,))] == ["spin_inner", "ffi_call", "heavy", "main"]


def _at(path: str) -> Mapping:
    return Mapping(0x1000, 0x2000, 0, path)


def test_each_run_of_python_frames_takes_the_place_of_its_evaluation_loop() -> None:
    """Python -> C -> Python: the runs pair with the loops from the leaf; between them the C library's frames stay
    and the interpreter's calling glue and addresses in no file go; past the outermost loop, what started the
    interpreter goes."""
    python, library = _at("/usr/lib/libpython3.12.so.1.0"), _at("/tmp/libpyspin.so")
    native = (Frame("PyNumber_Add", mapping=python), Frame("_PyEval_EvalFrameDefault", mapping=python),
              Frame("_PyObject_Call", mapping=python), Frame("[unknown]", address=0x7F0000001000),
              Frame("ffi_closure_unix64_inner", mapping=_at("/l/libffi.so")),
              Frame("call_back", mapping=library), Frame("_PyObject_Vectorcall", mapping=python),
              Frame("_PyEval_EvalFrameDefault.cold", mapping=python), Frame("Py_RunMain", mapping=python),
              Frame("main", mapping=_at("/usr/bin/python3.12")))
    inner = (Frame("loop", FrameKind.PYTHON), Frame("inner", FrameKind.PYTHON))
    outer = (Frame("outer", FrameKind.PYTHON), Frame("<module>", FrameKind.PYTHON))
    assert [f.function for f in merge(native, (inner, outer))] == \
        ["PyNumber_Add", "loop", "inner", "ffi_closure_unix64_inner", "call_back", "outer", "<module>"]
    # the native stack cut short after call_back: the outer run follows what it has
    assert [f.function for f in merge(native[:7], (inner, outer))] == \
        ["PyNumber_Add", "loop", "inner", "ffi_closure_unix64_inner", "call_back", "outer", "<module>"]
    # the Python stack cut (one run for two loops): it ends with that run
    assert [f.function for f in merge(native, (inner,))] == ["PyNumber_Add", "loop", "inner"]
    # a run whose code objects could not be read is empty but still takes its loop's place
    assert [f.function for f in merge(native, ((), outer))] == \
        ["PyNumber_Add", "ffi_closure_unix64_inner", "call_back", "outer", "<module>"]


def test_evaluation_loops_left_unnamed_are_found_by_their_address() -> None:
    """The run's only drain is the last (half a second to read symbol tables): libpython's frames are file+offset.
    The loops are still found, by the addresses the interpreter's symbols gave at discovery, so the Python frames
    sit above the thread's start, not below it; a caller's return address just past the loop's end is the loop's."""
    libpython, executable = _at("/py/lib/libpython3.12.so.1.0"), _at("/py/bin/python3.12")
    loop, cold = (0x7F00_0010_0000, 0x7F00_0010_8000), (0x7F00_000F_F000, 0x7F00_000F_F400)

    def unnamed(address: int, mapping: Mapping) -> Frame:
        return Frame(f"{os.path.basename(mapping.path)}+0x{address & 0xFFFFF:x}", address=address, mapping=mapping)

    native = (unnamed(0x7F00_0010_0040, libpython),  # the leaf: in the loop itself
              unnamed(0x7F00_0000_2000, libpython),  # a C function of the interpreter between the two loops
              unnamed(0x7F00_000F_F400, libpython),  # returns to the loop's .cold part, at its very end
              unnamed(0x7F00_0000_3000, libpython),  # Py_RunMain
              unnamed(0x1081, executable))  # _start
    inner = (Frame("spin", FrameKind.PYTHON), Frame("gen_items", FrameKind.PYTHON))
    outer = (Frame("gen_consumer", FrameKind.PYTHON), Frame("<module>", FrameKind.PYTHON))
    assert [f.function for f in merge(native, (inner, outer), (loop, cold))] == \
        ["spin", "gen_items", "gen_consumer", "<module>"]
    # an address past a loop's end is no loop: the leaf there is the interpreter's C code the Python frame called
    native = (unnamed(0x7F00_0010_8000, libpython),) + native[1:]
    assert [f.function for f in merge(native, (inner + outer,), (loop, cold))] == \
        ["libpython3.12.so.1.0+0x8000", "libpython3.12.so.1.0+0x2000", "spin", "gen_items", "gen_consumer",
         "<module>"]


def test_the_interpreters_evaluation_loop_is_known_at_discovery() -> None:
    """find_python gives the address range of _PyEval_EvalFrameDefault in the process (this test's interpreter)."""
    found = find_python(os.getpid())
    assert isinstance(found, PythonProcess), found
    address = ctypes.cast(ctypes.pythonapi._PyEval_EvalFrameDefault, ctypes.c_void_p).value
    assert address is not None
    assert any(start == address < end for start, end in found.evaluation_loops), \
        ([(hex(s), hex(e)) for s, e in found.evaluation_loops], hex(address))


def test_a_python_stack_cut_at_the_walkers_bound_ends_with_one_truncation_frame() -> None:
    """A stack deeper than the walker reads is flagged: its root is the truncation frame (one for every cut stack,
    so a flame graph groups them), after its outermost run, however the runs pair with the native loops."""
    found = find_python(os.getpid())
    assert isinstance(found, PythonProcess), found
    reader = CodeReader(found)

    def recurse() -> None: ...

    stack = abi.PythonStack(depth=abi.MAX_PYTHON_DEPTH, flags=abi.PYTHON_TRUNCATED)
    for i in range(abi.MAX_PYTHON_DEPTH):
        stack.code[i] = id(recurse.__code__)
    runs = reader.runs(stack)
    assert [len(run) for run in runs] == [abi.MAX_PYTHON_DEPTH + 1]
    assert runs[0][-1] is TRUNCATED_FRAME and TRUNCATED_FRAME.kind is FrameKind.PYTHON
    assert TRUNCATED_FRAME.function == f"[truncated: Python frames past the innermost {abi.MAX_PYTHON_DEPTH} not read]"
    native = (Frame("_PyEval_EvalFrameDefault"), Frame("_PyEval_EvalFrameDefault"), Frame("thread_run"))
    merged = merge(native, runs)
    assert merged[-1] is TRUNCATED_FRAME and len(merged) == abi.MAX_PYTHON_DEPTH + 1
    stack.flags = 0
    assert reader.runs(stack)[-1][-1].function.endswith("recurse")  # a whole stack has none


def test_line_tables() -> None:
    def lines_of(function) -> list[int]:  # type: ignore[no-untyped-def]
        code = function.__code__
        table = _line_311 if hasattr(code, "co_qualname") else _line_310
        return [table(code.co_linetable, code.co_firstlineno, offset) for offset, _, line in code.co_lines()
                if line is not None]

    def sample(x: int) -> int:
        y = x + 1
        z = y * 2
        return z

    expected = [line for _, _, line in sample.__code__.co_lines() if line is not None]
    assert lines_of(sample) == expected
    assert len(set(expected)) == 4


def test_a_code_address_reused_by_another_code_object_is_read_again() -> None:
    """The reader checks cached code objects once per drain; here the cache holds another function's entry at the
    address (as after the old code object was freed and a new one allocated there)."""
    found = find_python(os.getpid())  # this test's own interpreter, read through /proc/PID/mem like any other
    assert isinstance(found, PythonProcess), found
    reader = CodeReader(found)

    def first() -> None: ...

    def second() -> None: ...

    stack = abi.PythonStack(depth=1)
    stack.code[0] = id(first.__code__)
    assert reader.frames(stack)[0].function.endswith("first")
    reader._cache[id(second.__code__)] = reader._cache[id(first.__code__)]  # what the address held before
    reader.new_drain()
    stack.code[0] = id(second.__code__)
    frame = reader.frames(stack)[0]
    assert frame.function.endswith("second") and frame.filename == __file__ and frame.line > 0


def test_runs_kept_from_an_earlier_drain_are_built_again_when_their_code_reads_differently() -> None:
    """A stack's runs are kept across drains (by its raw bytes); a code object of it that reads differently at the
    next drain's check (its address reused) drops them, so the new name shows even for the very same stack bytes."""
    found = find_python(os.getpid())
    assert isinstance(found, PythonProcess), found
    reader = CodeReader(found)

    def first() -> None: ...

    def second() -> None: ...

    primer = abi.PythonStack(depth=1)
    primer.code[0] = id(first.__code__)
    reader.frames(primer)
    stack = abi.PythonStack(depth=1)
    stack.code[0] = id(second.__code__)
    reader._cache[id(second.__code__)] = reader._cache[id(first.__code__)]  # what the address held before
    reader._checked.add(id(second.__code__))  # checked in this drain already: its stale entry is used
    assert reader.frames(stack)[0].function.endswith("first")
    reader.new_drain()
    assert reader.frames(stack)[0].function.endswith("second")
    assert reader.frames(primer)[0].function.endswith("first")


def _started(python: Path) -> subprocess.Popen[bytes]:
    """``python`` sleeping, once its interpreter runs (read any earlier and its version may not be set yet)."""
    process = subprocess.Popen([str(python), "-c", "import time; print(flush=True); time.sleep(60)"],
                               stdout=subprocess.PIPE)
    assert process.stdout is not None and process.stdout.readline() == b"\n"
    return process


def test_an_interpreter_file_is_read_once_for_all_its_processes(monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    """A node starts many processes of one interpreter: its symbol table is read for the first only, and again when
    the file is replaced (another inode)."""
    from otel_gpu.cpu import python as module

    reads: list[str] = []
    real = module.elf_symbol_ranges

    def counting(path: str, names: tuple[str, ...]) -> tuple[dict[str, tuple[int, int]], int]:
        reads.append(path)
        return real(path, names)

    monkeypatch.setattr(module, "elf_symbol_ranges", counting)
    monkeypatch.setattr(module, "_SYMBOLS_BY_FILE", {})
    copy = tmp_path / "python3.11"
    shutil.copy2("/usr/bin/python3.11", copy)
    sleeping = [_started(copy) for _ in range(3)]
    try:
        found = [find_python(p.pid) for p in sleeping]
        assert all(isinstance(f, PythonProcess) and f.version == (3, 11) for f in found), found
        assert len(reads) == 1, reads
        for p in sleeping:
            p.kill()
            p.wait()
        os.unlink(copy)
        shutil.copy2("/usr/bin/python3.11", copy)  # same path, new file
        sleeping = [_started(copy)]
        assert isinstance(find_python(sleeping[0].pid), PythonProcess)
        assert len(reads) == 2, reads
    finally:
        for p in sleeping:
            p.kill()
            p.wait()


@pytest.mark.parametrize("end", ["reaped", "zombie"])
def test_code_objects_read_while_a_process_ran_name_its_frames_after_it_exits(tmp_path: Path, end: str) -> None:
    """read_new_stacks (the sampler's event thread, at a stack's first sight) fills the cache; once the process is gone
    (no /proc/PID: reaped; a mem file that reads nothing: a zombie) the drain names the frames from it, and counts as
    unreadable only the code objects it never read."""
    pid = os.getpid()
    root = tmp_path / "proc"
    root.mkdir()
    (root / str(pid)).symlink_to(f"/proc/{pid}")  # this process, as long as the link is there
    frames = PythonFrames(str(root))
    assert frames.discover(pid) is not None

    def early() -> None: ...

    def never_read() -> None: ...

    stack = abi.PythonStack(depth=1)
    stack.code[0] = id(early.__code__)
    unread = abi.PythonStack(depth=1)
    unread.code[0] = id(never_read.__code__)
    frames.read_new_stacks(pid, [stack])
    (root / str(pid)).unlink()
    if end == "zombie":
        (root / str(pid)).mkdir()
        (root / str(pid) / "mem").write_bytes(b"")
    frames.new_drain()
    selfmetrics.reset()
    runs = frames.runs_of(pid, {1: stack, 2: unread})
    assert [f.function for run in runs[1] for f in run] == [early.__code__.co_qualname]
    assert runs[1][0][0].filename == __file__ and runs[1][0][0].line == early.__code__.co_firstlineno
    assert runs[2] == ()  # its one frame unreadable
    assert selfmetrics.total(semconv.SELF_ERRORS.name, otel_gpu__reason=semconv.Reason.PYTHON_CODE_UNREADABLE) == 1

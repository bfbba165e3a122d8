# SPDX-License-Identifier: Apache-2.0
"""Stopping never waits for the native unwinder: with a process whose many executable files take the unwinder tens of
seconds of table building, ``--duration`` still ends the agent soon after it elapses (before this, close() waited up
to 5 s for the unwinder thread, and the last drain shared the GIL with its builds), and after ``stop_unwinding()``
nothing more is loaded into the maps."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from otel_gpu.cpu.sampler import CPUSampler
from otel_gpu.unwind.table import MAX_FRAME_BYTES, frame_sections
from tests.conftest import REPO, agent_command

pytestmark = [pytest.mark.root, pytest.mark.usefixtures("other_agent")]

FRAME_BYTES = 16 << 20  # .eh_frame in all: ~3 million rows (20 s of building in Python, ~0.4 s natively)
DURATION_S = 6  # long enough that start-up under load (up to ~4 s here) ends inside it
# keeps every file mapped executable (as a process that loaded them does) and keeps running, so it is sampled
_MAPPER = ("import mmap, sys\n"
           "files = [open(p, 'rb') for p in sys.argv[1:]]\n"
           "maps = [mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ | mmap.PROT_EXEC) for f in files]\n"
           "print('ready', flush=True)\n"
           "while True:\n    pass\n")


def _library() -> tuple[Path, int]:
    """A shared library this interpreter maps whose .eh_frame is the largest under the unwinder's cap, and its size."""
    best: tuple[Path, int] | None = None
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if ".so" in line and "x" in line.split()[1]}
    for path in sorted(paths):
        with contextlib.suppress(OSError, ValueError):
            found = frame_sections(path)
            if found is not None and found[0] == ".eh_frame" and len(found[2]) < MAX_FRAME_BYTES \
                    and (best is None or len(found[2]) > best[1]):
                best = (Path(path), len(found[2]))
    assert best is not None and best[1] >= 64 << 10, f"no library with a large enough .eh_frame: {best}"
    return best


@contextlib.contextmanager
def _many_files_mapped(folder: Path) -> Iterator[int]:
    """A running process mapping distinct copies of one library (a table each): yields its pid."""
    library, frame_bytes = _library()
    copies = []
    for index in range(FRAME_BYTES // frame_bytes + 1):
        copy = folder / f"lib{index}.so"
        shutil.copyfile(library, copy)
        copies.append(str(copy))
    process = subprocess.Popen([sys.executable, "-c", _MAPPER, *copies], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        yield process.pid
    finally:
        process.kill()
        process.wait()
        for copy in copies:  # ~170 MB: not left for pytest's kept temporary folders
            os.unlink(copy)


def test_duration_ends_the_agent_while_the_unwinder_builds(tmp_path: Path) -> None:
    with _many_files_mapped(tmp_path) as pid:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        began = time.monotonic()
        run = subprocess.run(
            agent_command("run", "--duration", str(DURATION_S), "--profiling-interval", "1", "--no-gpu-metrics",
                          "--no-gpu-time-profiling", "--pid", str(pid), "--output-dir", str(tmp_path / "out"),
                          "--console", "off", "--log-level", "debug"),
            capture_output=True, text=True, timeout=120, cwd=REPO, env=clean)
        took_s = time.monotonic() - began
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-2000:]
    # a generous bound: start-up counts inside --duration; the unwinder alone had over 20 s of work queued, and
    # waiting up to 5 s for it at close (as before) ends past the bound
    assert took_s < DURATION_S + 4, f"--duration {DURATION_S} ran {took_s:.1f} s"


def test_nothing_is_loaded_after_stop_unwinding(tmp_path: Path) -> None:
    with _many_files_mapped(tmp_path) as pid:
        sampler = CPUSampler(19, pids=(pid,))
        sampler.open()
        try:
            sampler.register_unwinding(pid)
            deadline = time.monotonic() + 60
            while sampler.stats()["unwind_files"] == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert sampler.stats()["unwind_files"] > 0, "the unwinder never loaded a file"
            sampler.stop_unwinding()
            loaded = sampler.stats()["unwind_files"], sampler.stats()["unwind_processes"]
            sampler.register_unwinding(pid)  # ignored once stopping
            assert sampler.settle_unwinder(0)
            time.sleep(2)  # the thread finishes the file it was building, and loads nothing
            # (without the stop, the spinning interpreter's hit files, libpython among them, would be built now)
            assert (sampler.stats()["unwind_files"], sampler.stats()["unwind_processes"]) == loaded
        finally:
            sampler.close()

# SPDX-License-Identifier: Apache-2.0
"""One unwinder per process: a GPU-time launch whose library stack is empty gets the kernel's fallback stack, walked
from the CPU sampler's unwind tables when the GPU-time probes reuse its maps. On the real kernel, with the stand-in
library of tests/cuda/emitter and its schedule built without frame pointers: the fallback launch keeps main, which
the frame-pointer walk (the control) loses."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from otel_gpu.cpu.sampler import CPUSampler
from otel_gpu.cuda.source import GPUTimeSource
from otel_gpu.profiles.model import ProfileBatch

pytestmark = [pytest.mark.root, pytest.mark.usefixtures("other_agent")]

REPO = Path(__file__).resolve().parents[2]
EMITTER = REPO / "tests" / "cuda" / "emitter"
NATIVE_INCLUDE = REPO / "otel_gpu" / "cuda" / "native"
# a name of its own: other agents on this machine attach to every libotel_gpu_inject.so they find, and a probe they
# enable before ours lets the schedule run before this test's source listens
LIBRARY = "libotel_gpu_unwind_test"


@pytest.fixture(scope="module")
def schedule_nofp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("emitter")
    (out / "lib").mkdir()
    cc = shutil.which("gcc") or "cc"
    subprocess.run([cc, "-O2", "-g", "-fPIC", "-shared", "-fno-omit-frame-pointer", "-fvisibility=hidden",
                    f"-I{NATIVE_INCLUDE}", str(EMITTER / "emitter.c"),
                    "-o", str(out / "lib" / f"{LIBRARY}.so")], check=True)
    subprocess.run([cc, "-O1", "-g", "-fomit-frame-pointer", "-fno-optimize-sibling-calls", f"-I{NATIVE_INCLUDE}",
                    str(EMITTER / "schedule.c"), "-o", str(out / "schedule"), f"-L{out / 'lib'}",
                    f"-l{LIBRARY[3:]}", "-Wl,-rpath,$ORIGIN/lib"], check=True)
    return out / "schedule"


def _stacks(batch: ProfileBatch, pid: int) -> list[tuple[str, ...]]:
    return [tuple(f.function for f in sample.frames) for profile in batch.processes if profile.process.pid == pid
            for sample in profile.samples]


def _run(schedule: Path, shared_tables: bool) -> list[tuple[str, ...]]:
    workload = subprocess.Popen([str(schedule), "40", "300"], stdout=subprocess.PIPE, text=True)
    sampler = CPUSampler(99, pids=[workload.pid])
    source: GPUTimeSource | None = None
    try:
        assert workload.stdout is not None
        assert workload.stdout.readline().split()[:1] == ["ready"]
        sampler.open()
        sampler.register_unwinding(workload.pid)  # it waits for the probes: it may never be sampled before
        assert sampler.settle_unwinder(60) and sampler.stats()["unwind_processes"] >= 1
        source = GPUTimeSource(rescan_interval_s=0.1, full_rescan_s=0.1, library_name=LIBRARY,
                               unwind_maps=sampler.unwind_maps() if shared_tables else None)
        source.open()
        out, _ = workload.communicate(timeout=30)
        assert workload.returncode == 0 and "done" in out, out
        time.sleep(0.2)
        gpu, _waits = source.drain()
        walked = source._probes.unwind_totals()["unwind_samples"]
        assert (walked >= 1) if shared_tables else (walked == 0), walked  # this program's own walks
        return _stacks(gpu, workload.pid)
    finally:
        workload.kill()
        workload.wait()
        if source is not None:
            source.close()
        sampler.close()


def test_fallback_launch_stack_is_walked_from_the_cpu_samplers_tables(schedule_nofp: Path) -> None:
    every = _run(schedule_nofp, shared_tables=True)
    stacks = [s for s in every if s[0] == "fallback_kernel"]
    chain = ("emit_launch", "launch", "launch_site_fallback", "main")  # the stand-in library's frame, then schedule
    assert stacks and all(s[1:5] == chain for s in stacks), every


def test_without_the_tables_the_frame_pointer_walk_loses_main(schedule_nofp: Path) -> None:
    every = _run(schedule_nofp, shared_tables=False)
    stacks = [s for s in every if s[0] == "fallback_kernel"]
    assert stacks and all("main" not in s for s in stacks), every  # lost after the library's frame

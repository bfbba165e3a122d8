# SPDX-License-Identifier: Apache-2.0
"""The real eBPF program end to end (root + BTF): a stand-in libotel_gpu_inject.so with the same four USDT probes
(tests/cuda/emitter/) fires a known schedule; GPUTimeSource discovers the process, attaches, joins and re-weights.

Expected values (see emitter/schedule.c): window 1 has weight 1000/100 = 10, window 2 weight (1400-1000)/(300-100)
= 2; the sync wait of 10 us stands for 3 waits.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from otel_gpu import selfmetrics
from otel_gpu.cuda.source import GPUTimeSource
from otel_gpu.profiles.model import FrameKind, ProfileBatch
from tests.ebpf.helpers import BPFLoads, still_loaded

# beside another otel-gpu instance, as on a node that runs the agent: each test checks only what it loaded
pytestmark = [pytest.mark.root, pytest.mark.usefixtures("other_agent")]

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
NATIVE_INCLUDE = REPO / "otel_gpu" / "cuda" / "native"
PROGRAM = REPO / "otel_gpu" / "ebpf" / "programs" / "gpu_time.bpf.o"
OUR_PROGRAMS = {"otel_gpu_launch", "otel_gpu_activi", "otel_gpu_sync", "otel_gpu_window"}  # as the kernel names them


@pytest.fixture(scope="module")
def schedule(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not PROGRAM.is_file():
        pytest.fail(f"{PROGRAM} is not built: run make -C otel_gpu/ebpf")
    out = tmp_path_factory.mktemp("emitter")
    (out / "lib").mkdir()
    cc = shutil.which("gcc") or "cc"
    subprocess.run([cc, "-O2", "-g", "-fPIC", "-shared", "-fno-omit-frame-pointer", "-fvisibility=hidden",
                    f"-I{NATIVE_INCLUDE}", str(HERE / "emitter" / "emitter.c"),
                    "-o", str(out / "lib" / "libotel_gpu_inject.so")], check=True)
    subprocess.run([cc, "-O1", "-g", "-fno-omit-frame-pointer", "-fno-optimize-sibling-calls", f"-I{NATIVE_INCLUDE}",
                    str(HERE / "emitter" / "schedule.c"), "-o", str(out / "schedule"), f"-L{out / 'lib'}",
                    "-lotel_gpu_inject", "-Wl,-rpath,$ORIGIN/lib"], check=True)
    return out / "schedule"


def _totals(batch: ProfileBatch, pid: int) -> dict[tuple[str, ...], int]:
    out: dict[tuple[str, ...], int] = {}
    for profile in batch.processes:
        if profile.process.pid != pid:
            continue
        for sample in profile.samples:
            # native frames below main (libc's start code) depend on libc's symbols: left out
            names = [f.function for f in sample.frames]
            below_main = names.index("main") + 1 if "main" in names else len(names)
            key = tuple(f.function for i, f in enumerate(sample.frames)
                        if i < below_main or f.kind == FrameKind.PYTHON)
            out[key] = out.get(key, 0) + sample.value
    return out


def _run(schedule: Path, many: int, source_first: bool, linger_ms: int = 300
         ) -> tuple[GPUTimeSource, int, list[ProfileBatch]]:
    source = GPUTimeSource(rescan_interval_s=0.1, full_rescan_s=0.1)
    if source_first:
        source.open()
    workload = subprocess.Popen([str(schedule), str(many), str(linger_ms)], stdout=subprocess.PIPE, text=True)
    try:
        ready = workload.stdout.readline().split() if workload.stdout else []
        assert ready[:1] == ["ready"], ready
        if not source_first:
            source.open()
        out, _ = workload.communicate(timeout=30)
        assert workload.returncode == 0 and "done" in out, out
    except BaseException:
        workload.kill()
        source.close()
        raise
    time.sleep(0.2)  # the workload has exited: what it emitted must still come out
    return source, workload.pid, source.drain()


@pytest.mark.parametrize(("many", "source_first"), [(40, False), (200, True)])
def test_schedule_comes_out_exact(schedule: Path, many: int, source_first: bool) -> None:
    source, pid, (gpu, waits) = _run(schedule, many, source_first)
    try:
        assert source.decode_errors == 0
        symbolizer_errors = {k: v for k, v in selfmetrics.snapshot()[0].items() if "symbolizer" in str(k)}
        assert _totals(gpu, pid) == {
            ("kernelA()", "launch_site_a", "main"): 1000 * 10 + many * 10 * 2,
            ("kernelB()", "launch_site_b", "main", "train_step", "<module>"): 3000 * 10,
            ("graph_k1", "launch_site_graph", "main"): (100 + 100) * 10,
            ("graph_k2", "launch_site_graph", "main"): 200 * 10,
            ("[memcpy DtoH 4.0 MiB pageable]", "launch_site_copy", "main"): 700 * 10,
            ("fallback_kernel", "launch_site_fallback", "main"): 50 * 2,
        }, symbolizer_errors
        assert _totals(waits, pid) == {("[cuStreamSynchronize]", "wait_site_c", "main"): 10000 * 3}
        assert 0 < gpu.sampling_fraction <= 1  # all processes; other injected processes may run on this machine
        profile = next(p for p in gpu.processes if p.process.pid == pid)
        assert profile.process.executable_name == "schedule"
        by_leaf = {s.frames[0].function: s for s in profile.samples}
        kernel_a = by_leaf["kernelA()"]
        assert kernel_a.frames[0].kind == FrameKind.CUDA and kernel_a.frames[0].system_name == "_Z7kernelAv"
        python = by_leaf["kernelB()"].frames[3]
        assert (python.kind, python.filename, python.line) == (FrameKind.PYTHON, "/app/train.py", 12)
        assert kernel_a.thread_id == pid and kernel_a.thread_name == "schedule"
        counters = {c.info.pid: c for c in source.process_counters()}[pid]
        assert counters.launches == 4 * 10 + (many + 1) * 2
        assert counters.kernel_time_ns == sum(_totals(gpu, pid).values())
        assert counters.sync_wait_ns == 30000
        assert (counters.covered_ns, counters.elapsed_ns) == (300, 1400)
        assert source.join_stats()[0] >= 47 + many - 40  # (misses are machine-wide: other injected processes may run here)
    finally:
        source.close()


def test_exit_right_after_emitting_loses_no_value(schedule: Path) -> None:
    """The workload exits the moment it has fired its last probe: every value still comes out.

    (Frame names are not compared here: the shared symbolizer may not reopen the binary of a process that exits
    while its first stack is being symbolized.)"""
    source, pid, (gpu, waits) = _run(schedule, 40, source_first=False, linger_ms=0)
    try:
        leaves: dict[str, int] = {}
        for profile in gpu.processes:
            if profile.process.pid == pid:
                for sample in profile.samples:
                    leaves[sample.frames[0].function] = leaves.get(sample.frames[0].function, 0) + sample.value
        assert leaves == {"kernelA()": 1000 * 10 + 40 * 10 * 2, "kernelB()": 30000, "graph_k1": 2000,
                          "graph_k2": 2000, "[memcpy DtoH 4.0 MiB pageable]": 7000, "fallback_kernel": 100}
        assert sum(s.value for p in waits.processes if p.process.pid == pid for s in p.samples) == 30000
    finally:
        source.close()


def test_close_leaves_no_program_loaded(schedule: Path, bpf_loads: BPFLoads,
                                       other_agent: dict[int, str]) -> None:
    source, _, _ = _run(schedule, 1, True)
    assert len(source.attached_libraries) >= 1
    assert bpf_loads.names() == OUR_PROGRAMS
    source.close()
    assert bpf_loads.leaked() == {}
    assert OUR_PROGRAMS <= set(still_loaded(other_agent).values())  # another instance's programs are not ours


def test_no_injected_process_says_how_to_turn_it_on(caplog: pytest.LogCaptureFixture) -> None:
    source = GPUTimeSource(library_name="libotel_gpu_inject_nobody_has_this.so")
    with caplog.at_level(logging.INFO, logger="otel_gpu.cuda.source"):
        source.open()
    try:
        messages = [r.getMessage() for r in caplog.records]
        assert len(messages) == 1 and "otel-gpu inject -- python train.py" in messages[0]
        assert "CUDA_INJECTION64_PATH" in messages[0]
        gpu, waits = source.drain()
        assert gpu.processes == () and waits.processes == ()
    finally:
        source.close()


def test_the_thread_reads_what_wakes_it_and_stop_ends_its_wait(schedule: Path) -> None:
    """The probes' thread blocks on the ring buffer's epoll descriptor: records that fill a quarter of the buffer
    wake it and come out with no drain and no scan (both an hour away here), and stop() ends its wait at once."""
    import threading

    from otel_gpu.cuda.probes import GPUTimeProbes

    seen: list[object] = []
    arrived = threading.Event()

    def on_record(record: object) -> None:
        seen.append(record)
        arrived.set()

    probes = GPUTimeProbes(on_record, lambda pids: None, ringbuf_bytes=64 << 10, poll_interval_s=3600,
                           rescan_interval_s=3600, full_rescan_s=3600,
                           library_paths=[schedule.parent / "lib" / "libotel_gpu_inject.so"])
    probes.open()
    try:
        thread = probes._thread
        assert thread is not None
        done = subprocess.run([str(schedule), "2000", "0"], capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        assert arrived.wait(30), "no record reached on_record without a drain"
        probes.stop()
        assert not thread.is_alive()  # stop() joins for at most 5 s: the wait (an hour) was ended at once
        assert probes.decode_errors == 0
    finally:
        probes.close()

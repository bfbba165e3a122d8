# SPDX-License-Identifier: Apache-2.0
"""New processes are profiled from their first step (issue 16): the real injected library on the fake CUDA driver and
fake CUPTI, the real eBPF program attached by GPUTimeProbes (root + BTF).

The library records every blocking wait while an agent is attached (budget 1.0 keeps one in one) and the fake
workload waits on its stream once a step, so the stream waits seen count the steps the agent saw. The scans are made
too rare to find anything during a test (``rescan_interval_s=3600``) wherever the packaged library file, attached
when the probes open, is what must find the process.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import pytest

from otel_gpu.cuda import abi
from otel_gpu.cuda.probes import GPUTimeProbes

pytestmark = pytest.mark.root

REPO = Path(__file__).resolve().parents[2]
LIBRARY = REPO / "otel_gpu" / "cuda" / "native" / "libotel_gpu_inject.so"
FAKES = REPO / "tests" / "native" / "cuda"
STEPS = 40


class Seen:
    """Stream waits and the pids the scans reported, per process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.stream_waits: Counter[int] = Counter()
        self.scanned: set[int] = set()

    def record(self, record: abi.Record) -> None:
        if isinstance(record, abi.Sync) and record.kind == abi.SYNC_STREAM:
            with self._lock:
                self.stream_waits[record.pid] += 1

    def processes(self, pids: Iterable[int]) -> None:
        with self._lock:
            self.scanned.update(pids)


@pytest.fixture
def seen() -> Seen:
    for path in (LIBRARY, FAKES / "libcupti.so", FAKES / "libcuda.so.1", FAKES / "workload"):
        if not path.exists():
            pytest.fail(f"not built: {path} (run make build)")
    return Seen()


def _probes(seen: Seen, **kwargs: object) -> GPUTimeProbes:
    probes = GPUTimeProbes(seen.record, seen.processes, **kwargs)  # type: ignore[arg-type]
    probes.open()
    return probes


def _start(library: Path = LIBRARY, steps: int = STEPS, gate: Path | None = None) -> subprocess.Popen[str]:
    env = dict(os.environ, CUDA_INJECTION64_PATH=str(library), OTEL_GPU_CUPTI_PATH=str(FAKES / "libcupti.so"),
               OTEL_GPU_OVERHEAD_BUDGET="1.0")
    command = [str(FAKES / "workload"), "--steps", str(steps)]
    if gate is not None:  # the same pid, loading the library only once a line is written to the fifo ``gate``
        command = ["sh", "-c", f'read line < {gate}; exec "$0" "$@"', *command]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _finish(probes: GPUTimeProbes, *workloads: subprocess.Popen[str]) -> set[str]:
    """Waits for the workloads, reads what is left and closes the probes; returns the paths they were attached to."""
    try:
        for workload in workloads:
            _, stderr = workload.communicate(timeout=120)
            assert workload.returncode == 0, stderr
        time.sleep(0.2)
        probes.poll_now()
        return {library.path for library in probes.attached_libraries}
    finally:
        probes.close()


def test_a_workload_started_after_the_agent_is_seen_from_its_first_step(seen: Seen) -> None:
    probes = _probes(seen, rescan_interval_s=3600, full_rescan_s=3600)
    workload = _start()
    _finish(probes, workload)
    assert seen.stream_waits[workload.pid] == STEPS
    assert workload.pid not in seen.scanned  # no scan found it: the library file was attached before it started


def test_without_the_library_file_attached_up_front_the_same_workload_is_missed(seen: Seen) -> None:
    probes = _probes(seen, library_paths=[], rescan_interval_s=3600, full_rescan_s=3600)
    workload = _start()
    _finish(probes, workload)
    assert seen.stream_waits[workload.pid] == 0


def test_a_process_that_loads_the_library_late_is_seen_from_its_first_step(seen: Seen, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    workload = _start(gate=gate)  # running, without the library, when the probes open and scan
    probes = _probes(seen, rescan_interval_s=3600, full_rescan_s=3600)
    gate.write_text("go\n")
    _finish(probes, workload)
    assert seen.stream_waits[workload.pid] == STEPS


def test_two_processes_at_once_are_each_seen_from_their_first_step(seen: Seen) -> None:
    probes = _probes(seen, rescan_interval_s=3600, full_rescan_s=3600)
    first, second = _start(steps=STEPS), _start(steps=STEPS + 7)
    _finish(probes, first, second)
    assert (seen.stream_waits[first.pid], seen.stream_waits[second.pid]) == (STEPS, STEPS + 7)


def test_a_copy_of_the_library_elsewhere_is_found_by_the_scan_and_counted_late(seen: Seen, tmp_path: Path) -> None:
    copy = tmp_path / LIBRARY.name
    shutil.copy(LIBRARY, copy)
    probes = _probes(seen, rescan_interval_s=0.05, full_rescan_s=0.05)
    workload = _start(copy, steps=400)
    attached = _finish(probes, workload)
    assert workload.pid in seen.scanned
    assert seen.stream_waits[workload.pid] > 0
    assert str(copy) in attached
    assert probes.late_attaches >= 1


def test_a_process_already_running_with_the_packaged_library_is_named_not_waited_for(
        seen: Seen, caplog: pytest.LogCaptureFixture) -> None:
    """The agent started after the workload (a DaemonSet restarted on a busy node): the packaged file is attached up
    front and the scan at open finds the process mapping it; the log names the process instead of saying it waits
    for one (the H200 do-no-harm run read "waiting: no process has libotel_gpu_inject.so loaded" there)."""
    workload = _start(steps=4000)
    try:
        deadline = time.monotonic() + 30
        while LIBRARY.name not in Path(f"/proc/{workload.pid}/maps").read_text() and time.monotonic() < deadline:
            time.sleep(0.02)
        with caplog.at_level("INFO", logger="otel_gpu.cuda.source"):
            probes = _probes(seen, rescan_interval_s=3600, full_rescan_s=3600)
    finally:
        workload.kill()
        workload.communicate()
    try:
        text = caplog.text
        assert f"pid {workload.pid} loaded {LIBRARY}, whose probes were in place already" in text, text
        assert "is waiting" not in text, text
        assert {library.pid for library in probes.attached_libraries} == {workload.pid}
        assert probes.late_attaches == 0  # its probes were in place from its start
    finally:
        probes.close()


def test_a_process_whose_library_was_replaced_on_disk_is_still_profiled(seen: Seen, tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    """The agent's pod restarted on a busy node: its init container put a new copy of the library in place by rename
    while a workload kept running the old one (maps: "(deleted)"). The path now names the new file, which the agent
    attaches up front; the running process is found by the scan and profiled through the copy it loaded."""
    library = tmp_path / LIBRARY.name
    shutil.copy(LIBRARY, library)
    workload = _start(library, steps=100_000)
    try:
        deadline = time.monotonic() + 30
        while LIBRARY.name not in Path(f"/proc/{workload.pid}/maps").read_text() and time.monotonic() < deadline:
            time.sleep(0.02)
        staged = tmp_path / ".staged"
        shutil.copy(LIBRARY, staged)
        staged.rename(library)  # as helm/otel-gpu/templates/daemonset.yaml does
        assert "(deleted)" in Path(f"/proc/{workload.pid}/maps").read_text()
        with caplog.at_level("INFO", logger="otel_gpu.cuda.source"):
            probes = _probes(seen, library_paths=[library], rescan_interval_s=0.05, full_rescan_s=0.05)
        try:
            deadline = time.monotonic() + 30
            while seen.stream_waits[workload.pid] < 5 and time.monotonic() < deadline and workload.poll() is None:
                time.sleep(0.05)
                probes.poll_now()
            assert seen.stream_waits[workload.pid] >= 5
            replaced = [lib for lib in probes.attached_libraries if lib.replaced]
            assert [lib.pid for lib in replaced] == [workload.pid]
            assert str(library.stat().st_ino) != str(replaced[0].inode)  # the old file, not the one at the path now
            assert "since replaced on disk" in caplog.text
        finally:
            probes.close()
    finally:
        workload.kill()
        workload.communicate()

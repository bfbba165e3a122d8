# SPDX-License-Identifier: Apache-2.0
"""NVMLSource over the real pynvml and the fake libnvidia-ml.so.1: processes (and their exit), a lost GPU,
unsupported readings, XID events, collection that never stalls, self-metrics, and no NVML at all."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_gpu import selfmetrics, semconv
from otel_gpu.errors import SourceUnavailable
from otel_gpu.metrics.gpu_instruments import register_gpu_instruments
from otel_gpu.procfs import ProcessResolver
from tests.gpu.conftest import GIB, UUIDS, python_env_without_fake, read_points, select

CONTAINER_ID = "4f1c0e6a" * 8
POD_UID = "0d3c8a52-6b1e-4c7f-9a21-5e8f7d6c4b3a"


def instruments(source):  # type: ignore[no-untyped-def]
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    register_gpu_instruments(provider.get_meter("test"), source)
    return reader, provider


def wait_for(condition: Callable[[], object], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout_s} s")
        time.sleep(0.02)


def fake_proc_tree(root: Path, pid: int, comm: str, cgroup: str, environ: bytes = b"") -> None:
    """A /proc/<pid> entry with the files ProcessResolver reads."""
    folder = root / str(pid)
    folder.mkdir(parents=True)
    (folder / "stat").write_text(f"{pid} ({comm}) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 4242 0 0\n")
    (folder / "comm").write_text(comm + "\n")
    (folder / "cgroup").write_text(cgroup)
    (folder / "environ").write_bytes(environ)


def test_processes_carry_identity_and_an_exited_process_leaves_no_stale_series(make_source, scenario, sleepers,
                                                                                tmp_path) -> None:
    busy, idle = sleepers(2)
    scenario.write(processes=f"{busy.pid}@0:{GIB}:55,{idle.pid}@1:{2 * GIB}:0")
    fake_proc_tree(tmp_path, busy.pid, "trainer",
                   f"0::/kubepods.slice/kubepods-burstable-pod{POD_UID.replace('-', '_')}.slice/"
                   f"cri-containerd-{CONTAINER_ID}.scope\n", b"OTEL_RESOURCE_ATTRIBUTES=service.name=train-job\0")
    fake_proc_tree(tmp_path, idle.pid, "sleep", "0::/user.slice/session-1.scope\n")
    source = make_source(resolver=ProcessResolver(proc_root=str(tmp_path)))
    reader, provider = instruments(source)
    source.collect()
    points = read_points(reader)
    memory = points[semconv.GPU_PROCESS_MEMORY_USAGE.name]
    sm = points[semconv.GPU_PROCESS_SM_UTILIZATION.name]
    assert select(memory, process__pid=busy.pid) == [({
        semconv.HW_ID: UUIDS[0], semconv.HW_NAME: "NVIDIA H200", semconv.HW_MODEL: "NVIDIA H200",
        semconv.NVIDIA_GPU_INDEX: 0, semconv.NVIDIA_GPU_PCI_BUS_ID: "00000000:18:00.0",
        semconv.PROCESS_PID: busy.pid, semconv.PROCESS_EXECUTABLE_NAME: "trainer",
        semconv.CONTAINER_ID: CONTAINER_ID, semconv.K8S_POD_UID: POD_UID, semconv.SERVICE_NAME: "train-job"}, GIB)]
    idle_memory = select(memory, process__pid=idle.pid)
    assert [(a[semconv.HW_ID], a[semconv.PROCESS_EXECUTABLE_NAME], v) for a, v in idle_memory] == [
        (UUIDS[1], "sleep", 2 * GIB)]
    assert semconv.CONTAINER_ID not in idle_memory[0][0] and semconv.K8S_POD_UID not in idle_memory[0][0]
    assert idle_memory[0][0][semconv.SERVICE_NAME] == "sleep"  # no service of its own: the executable, as on profiles
    assert [v for _, v in select(sm, process__pid=busy.pid)] == [pytest.approx(0.55)]
    assert [v for _, v in select(sm, process__pid=idle.pid)] == [0.0]  # listed, but no utilization sample

    busy.kill()
    busy.wait()
    source.collect()
    points = read_points(reader)
    for name in (semconv.GPU_PROCESS_MEMORY_USAGE.name, semconv.GPU_PROCESS_SM_UTILIZATION.name):
        assert select(points[name], process__pid=busy.pid) == [], f"stale {name} series for an exited process"
        assert len(select(points[name], process__pid=idle.pid)) == 1
    provider.shutdown()


def test_processes_resolve_through_the_real_proc(make_source, scenario, sleepers) -> None:
    (proc,) = sleepers(1)
    scenario.write(processes=f"{proc.pid}@1:{3 * GIB}:20")
    source = make_source()
    (_, gpu1) = source.collect()
    assert [(p.pid, p.executable_name, p.memory_bytes, p.sm_utilization) for p in gpu1.processes] == [
        (proc.pid, "sleep", 3 * GIB, pytest.approx(0.20))]


def test_per_process_metrics_can_be_turned_off(make_source, scenario, sleepers) -> None:
    (proc,) = sleepers(1)
    scenario.write(processes=f"{proc.pid}@0:{GIB}:10")
    source = make_source(per_process=False)
    assert all(snapshot.processes == () for snapshot in source.collect())


def test_lost_gpu_reports_failed_and_the_other_gpu_keeps_reporting(make_source, scenario, caplog) -> None:
    source = make_source()
    reader, provider = instruments(source)
    source.collect()
    scenario.write(lost="1")
    with caplog.at_level("INFO"):
        for _ in range(3):
            time.sleep(0.06)  # GPM needs two samples 100 ms apart
            source.collect()
    points = read_points(reader)
    status = {(a[semconv.HW_ID], a[semconv.HW_STATE]): v for a, v in points[semconv.GPU_STATUS.name]}
    assert status == {(UUIDS[0], "ok"): 1, (UUIDS[0], "failed"): 0, (UUIDS[1], "ok"): 0, (UUIDS[1], "failed"): 1}
    for spec in (semconv.GPU_POWER, semconv.GPU_MEMORY_USAGE, semconv.GPU_UTILIZATION, semconv.GPU_SM_ACTIVITY):
        gpus = {a[semconv.HW_ID] for a, _ in points[spec.name]}
        assert gpus == {UUIDS[0]}, spec.name  # GPU 1's readings stop; GPU 0 goes on
    lost_lines = [r for r in caplog.records if "is lost" in r.getMessage()]
    assert len(lost_lines) == 1 and "GPU 1" in lost_lines[0].getMessage()
    assert selfmetrics.total(semconv.SELF_ERRORS.name, otel_gpu__source="nvml", otel_gpu__reason="gpu_is_lost") == 1

    scenario.write()  # the GPU answers again
    source.collect()
    points = read_points(reader)
    status = {(a[semconv.HW_ID], a[semconv.HW_STATE]): v for a, v in points[semconv.GPU_STATUS.name]}
    assert status[(UUIDS[1], "ok")] == 1 and status[(UUIDS[1], "failed")] == 0
    assert {a[semconv.HW_ID] for a, _ in points[semconv.GPU_POWER.name]} == set(UUIDS)
    provider.shutdown()


def test_unsupported_reading_is_turned_off_for_that_gpu_and_logged_once(make_source, scenario, caplog) -> None:
    scenario.write(unsupported="1:nvmlDeviceGetEncoderUtilization,*:nvmlGpmQueryDeviceSupport")
    source = make_source()
    reader, provider = instruments(source)
    with caplog.at_level("INFO"):
        for _ in range(3):
            source.collect()
    messages = [r.getMessage() for r in caplog.records]
    assert len([m for m in messages if "encoder_utilization is not supported" in m]) == 1
    assert len([m for m in messages if "gpm is not supported" in m]) == 2  # once per GPU
    assert source.disabled_readings() == {0: frozenset({"gpm"}), 1: frozenset({"gpm", "encoder_utilization"})}
    points = read_points(reader)
    encoder = select(points[semconv.GPU_UTILIZATION.name], hw__gpu__task="encoder")
    assert {a[semconv.HW_ID] for a, _ in encoder} == {UUIDS[0]}
    assert semconv.GPU_SM_ACTIVITY.name not in points
    assert {a[semconv.HW_ID] for a, _ in points[semconv.GPU_POWER.name]} == set(UUIDS)
    provider.shutdown()


def test_memory_falls_back_to_v1_when_the_driver_lacks_memory_info_v2(make_source, scenario) -> None:
    from otel_gpu.gpu import _nvml

    scenario.write(unsupported="*:nvmlDeviceGetMemoryInfo_v2")
    _nvml._memory_v2[0] = True
    try:
        source = make_source()
        assert [(s.memory_used_bytes, s.memory_total_bytes) for s in source.collect()] == [
            (16 * GIB, 143771 * 1024 * 1024), (32 * GIB, 143771 * 1024 * 1024)]
        assert _nvml._memory_v2[0] is False
        assert source.disabled_readings() == {0: frozenset(), 1: frozenset()}
    finally:
        _nvml._memory_v2[0] = True


def test_xid_events_are_counted_per_code_with_one_log_line_each(make_source, scenario, caplog) -> None:
    scenario.write(xid="1:79,1:79,0:48")
    source = make_source()
    reader, provider = instruments(source)
    with caplog.at_level("INFO"):
        source.start()
        wait_for(lambda: sum(e.count for e in source.xid_errors()) == 3)
    counts = {(e.info.index, e.code): e.count for e in source.xid_errors()}
    assert counts == {(1, 79): 2, (0, 48): 1}  # a repeated XID stays visible (a counter, not a last value)
    assert len([r for r in caplog.records if r.getMessage().startswith("XID ")]) == 3
    points = read_points(reader)
    xid = select(points[semconv.GPU_ERRORS.name], error__type="xid")
    assert {(a[semconv.HW_ID], a[semconv.NVIDIA_GPU_XID_CODE]): v for a, v in xid} == {
        (UUIDS[1], 79): 2, (UUIDS[0], 48): 1}
    last = {(a[semconv.HW_ID], a[semconv.NVIDIA_GPU_XID_CODE]): v for a, v in points[semconv.GPU_XID_LAST_TIME.name]}
    assert set(last) == {(UUIDS[1], 79), (UUIDS[0], 48)}
    assert all(abs(v - time.time()) < 3600 for v in last.values())  # Unix seconds, not a relative time
    provider.shutdown()


def test_an_export_gets_readings_taken_just_before_it_not_an_interval_before(make_source) -> None:
    """The exporters' timers and the collection's ran apart: each export carried the reading of one interval
    before. Asked for readings fresh within a second, each GPU's thread reads at once (its timer starts over)."""
    source = make_source(interval_s=3600.0)
    source.start()
    wait_for(lambda: len(source.snapshots()) == 2)
    first = {s.info.index: s.time_s for s in source.snapshots()}
    time.sleep(1.2)
    assert {s.info.index: s.time_s for s in source.snapshots()} == first  # the next timed read is an hour away
    asked = time.time()
    fresh = source.snapshots(fresh_within_s=1.0)
    assert len(fresh) == 2 and all(s.time_s >= asked for s in fresh)
    again = source.snapshots(fresh_within_s=1.0)  # fresh already: nothing read again
    assert {s.info.index: s.time_s for s in again} == {s.info.index: s.time_s for s in fresh}


def test_the_xid_counts_outlive_close_for_the_last_export(make_source, scenario) -> None:
    """The agent's last metrics export runs after the sources closed: it dropped every XID series."""
    scenario.write(xid="1:79,0:48")
    source = make_source()
    source.start()
    wait_for(lambda: sum(e.count for e in source.xid_errors()) == 2)
    source.close()
    assert {(e.info.index, e.code): e.count for e in source.xid_errors()} == {(1, 79): 1, (0, 48): 1}


def test_a_slow_gpu_delays_neither_the_other_gpu_nor_the_readers(make_source, scenario) -> None:
    source = make_source(interval_s=0.05, collection_timeout_s=0.3)
    source.collect()
    scenario.write(gpu_delay_us="1:100000")  # every call on GPU 1 now takes 100 ms: a cycle takes seconds
    source.start()
    first = {s.info.index: s.time_s for s in source.snapshots()}
    wait_for(lambda: next(s for s in source.snapshots() if s.info.index == 0).time_s > first[0] + 0.2)
    # GPU 1 has been stuck in its cycle past the 0.3 s limit: status only, no stale readings
    wait_for(lambda: next(s for s in source.snapshots() if s.info.index == 1).power_w is None)
    gpu0, gpu1 = source.snapshots()
    assert gpu0.power_w == 300.0 and gpu1.state == "ok" and gpu1.power_w is None
    assert selfmetrics.total(semconv.SELF_ERRORS.name, otel_gpu__source="nvml", otel_gpu__reason="timeout") == 1


def test_each_gpu_cycle_records_its_duration(make_source) -> None:
    source = make_source()
    source.collect()
    _, gauges = selfmetrics.snapshot()
    durations = {dict(attrs).get(semconv.NVIDIA_GPU_INDEX): v for (name, attrs), v in gauges.items()
                 if name == semconv.SELF_COLLECTION_DURATION.name and dict(attrs).get(semconv.OTEL_GPU_SOURCE) == "nvml"}
    assert set(durations) == {"0", "1"} and all(v > 0 for v in durations.values())


def test_close_is_idempotent_and_stops_threads(make_source) -> None:
    source = make_source()
    source.start()
    wait_for(lambda: len(source.snapshots()) == 2)
    source.close()
    source.close()
    import threading

    assert not [t for t in threading.enumerate() if t.name.startswith("otel-gpu-nvml")]


@pytest.mark.parametrize(("knobs", "reason"), [
    ({"init_error": 9}, "the NVIDIA kernel driver is not loaded"),
    ({"gpus": 0}, "NVML sees no GPU"),
])
def test_open_without_usable_nvml_raises_source_unavailable(make_source, scenario, knobs, reason) -> None:
    scenario.write(**knobs)
    with pytest.raises(SourceUnavailable, match=reason):
        make_source()


def test_no_nvidia_library_at_all_raises_source_unavailable_with_a_clear_reason() -> None:
    """In a fresh interpreter where no libnvidia-ml.so.1 can be found (this test machine has no NVIDIA driver)."""
    code = ("from otel_gpu.gpu.source import NVMLSource\n"
            "from otel_gpu.config import GPUConfig\n"
            "from otel_gpu.procfs import ProcessResolver\n"
            "from otel_gpu.errors import SourceUnavailable\n"
            "try:\n"
            "    NVMLSource(GPUConfig(), ProcessResolver()).open()\n"
            "except SourceUnavailable as exc:\n"
            "    print('UNAVAILABLE:', exc)\n")
    result = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60,
                            env=python_env_without_fake())
    if "UNAVAILABLE:" not in result.stdout and result.returncode == 0:
        pytest.skip("a real libnvidia-ml.so.1 is installed on this machine")
    assert result.returncode == 0, result.stderr
    assert "UNAVAILABLE: libnvidia-ml.so.1 was not found: no NVIDIA driver on this machine" in result.stdout

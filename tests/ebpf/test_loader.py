# SPDX-License-Identifier: Apache-2.0
"""The libbpf loader on the real kernel: uprobe and USDT (semaphore) attach with exact counts, perf events on every
CPU, .rodata settings, error messages, and nothing the test loaded left loaded after close."""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import subprocess
import time

import pytest

from otel_gpu.ebpf import abi, loader
from otel_gpu.ebpf.loader import BPFError, BPFObject, online_cpus, program_path
from tests.ebpf.helpers import WORKLOADS, BPFLoads

# beside another otel-gpu instance, as on a node that runs the agent: each test checks only what it loaded
pytestmark = pytest.mark.usefixtures("other_agent")

LIBRARY = str(WORKLOADS / "libuprobe_target.so")
CALLER = str(WORKLOADS / "uprobe_caller")


def _hits(bpf: BPFObject, map_name: str, pid: int) -> int:
    raw = bpf.map(map_name).lookup(ctypes.c_uint32(pid))
    return struct.unpack("<Q", raw)[0] if raw else 0


def _run_caller(count: int) -> int:
    done = subprocess.run([CALLER, str(count)], check=True, capture_output=True, text=True)
    return int(done.stdout.split()[1])  # "ready PID"


@pytest.mark.root
def test_counting_uprobe_on_a_library_function_counts_every_call(bpf_loads: BPFLoads) -> None:
    with BPFObject(program_path("probe_counter")) as bpf:
        bpf.attach_uprobe("count_uprobe", LIBRARY, "otel_test_target")
        pid = _run_caller(250)
        assert _hits(bpf, "uprobe_hits", pid) == 250
        # the probe reads the first argument: sum of 0..249
        assert struct.unpack("<Q", bpf.map("arg_sum").lookup(ctypes.c_uint32(0)) or b"")[0] == sum(range(250))
    assert bpf_loads.leaked() == {}


@pytest.mark.root
def test_uretprobe_and_pid_scoped_uprobe() -> None:
    with BPFObject(program_path("probe_counter")) as bpf:
        process = subprocess.Popen([CALLER, "40", "300"], stdout=subprocess.PIPE, text=True)
        assert process.stdout is not None
        pid = int(process.stdout.readline().split()[1])
        bpf.attach_uprobe("count_uprobe", LIBRARY, "otel_test_target", pid=pid, retprobe=True)
        other = _run_caller(7)  # not the attached pid
        process.wait(timeout=10)
        assert _hits(bpf, "uprobe_hits", pid) == 40
        assert _hits(bpf, "uprobe_hits", other) == 0


@pytest.mark.root
def test_usdt_probe_with_semaphore_counts_every_hit(bpf_loads: BPFLoads) -> None:
    with BPFObject(program_path("probe_counter")) as bpf:
        bpf.attach_usdt("count_usdt", CALLER, "otel_test", "tick")
        pid = _run_caller(123)
        assert _hits(bpf, "usdt_hits", pid) == 123
    assert bpf_loads.leaked() == {}


@pytest.mark.root
def test_perf_event_sampler_runs_on_every_cpu_and_obeys_rodata(bpf_loads: BPFLoads) -> None:
    cpus = online_cpus()
    with BPFObject(program_path("cpu_profiler"), rodata={"self_tgid": os.getpid(), "filter_pids": 0}) as bpf:
        assert bpf.attach_perf_event("on_cpu_sample", frequency_hz=99) == len(cpus)
        burners = [subprocess.Popen([str(WORKLOADS / "cpu_3to1"), "1"], stdout=subprocess.DEVNULL)
                   for _ in cpus]
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            pass  # our own tgid burns too, and must be filtered
        for burner in burners:
            burner.wait(timeout=10)
        raw = bpf.map("stats").lookup(ctypes.c_uint32(abi.CPUStat.SAMPLES))
        assert raw is not None
        per_cpu = struct.unpack(f"<{len(raw) // 8}Q", raw)
        assert all(per_cpu[cpu] > 0 for cpu in cpus), per_cpu
        pids = {abi.SampleKey.from_buffer_copy(key).pid for key, _ in bpf.map("counts0").items()}
        assert {b.pid for b in burners} <= pids
        assert os.getpid() not in pids
        filtered = bpf.map("stats").lookup(ctypes.c_uint32(abi.CPUStat.FILTERED))
        assert filtered is not None and sum(struct.unpack(f"<{len(filtered) // 8}Q", filtered)) > 0
        assert "on_cpu_sample" in bpf_loads.names()
    assert bpf_loads.leaked() == {}


@pytest.mark.root
def test_missing_function_names_the_symbol_and_leaves_nothing_attached(bpf_loads: BPFLoads) -> None:
    bpf = BPFObject(program_path("probe_counter"))
    try:
        with pytest.raises(BPFError) as caught:
            bpf.attach_uprobe("count_uprobe", LIBRARY, "no_such_function")
        assert caught.value.errno == errno.ENOENT
        assert "no_such_function" in str(caught.value)
    finally:
        bpf.close()
        bpf.close()  # idempotent
    assert bpf.closed
    assert bpf_loads.leaked() == {}


def test_missing_object_file_says_how_to_build_it(tmp_path: os.PathLike[str]) -> None:
    with pytest.raises(BPFError, match="make build"):
        BPFObject(os.path.join(str(tmp_path), "absent.bpf.o"))


@pytest.mark.root
def test_unknown_rodata_name_fails_and_frees_the_object(bpf_loads: BPFLoads) -> None:
    with pytest.raises(BPFError, match="no_such_setting"):
        BPFObject(program_path("cpu_profiler"), rodata={"no_such_setting": 1})
    assert bpf_loads.leaked() == {}


def test_online_cpu_list_parsing(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(str(tmp_path), "online")
    with open(path, "w") as handle:
        handle.write("0-2,5,7-8\n")
    assert online_cpus(path) == [0, 1, 2, 5, 7, 8]


@pytest.mark.root
def test_ring_buffer_delivers_each_new_process_once() -> None:
    events: list[abi.ProcessEvent] = []
    with BPFObject(program_path("cpu_profiler"), rodata={"self_tgid": os.getpid()}) as bpf:
        ring = bpf.ring_buffer("process_events", lambda data: events.append(abi.ProcessEvent.from_buffer_copy(data)))
        bpf.attach_perf_event("on_cpu_sample", frequency_hz=199)
        done = subprocess.run([str(WORKLOADS / "cpu_3to1"), "0.5"], check=True, capture_output=True, text=True)
        pid = int(done.stdout.split()[1])
        deadline = time.monotonic() + 5
        while not any(e.pid == pid for e in events) and time.monotonic() < deadline:
            ring.poll(100)
        ring.consume()
    mine = [e for e in events if e.pid == pid]
    assert len(mine) == 1
    assert mine[0].comm == b"cpu_3to1" and mine[0].tid == pid and mine[0].time_ns > 0
    assert os.getpid() not in {e.pid for e in events}


@pytest.mark.root
def test_pop_all_returns_and_deletes_every_entry_of_a_map_larger_than_one_batch(bpf_loads: BPFLoads) -> None:
    """A drain of walked stacks (values of ~1 KiB) takes several batch calls; every entry comes back once, whole."""
    with BPFObject(program_path("cpu_profiler"), rodata={"self_tgid": os.getpid()}) as bpf:
        stacks = bpf.map("unwound_stacks0")
        count = min(stacks.max_entries, 3 * max(1, loader._BATCH_BYTES // (stacks.key_size + stacks.value_size)) + 7)
        written = {}
        for n in range(count):
            key = n.to_bytes(4, "little") * (stacks.key_size // 4)
            value = bytes((n + i) % 251 for i in range(stacks.value_size))
            stacks.update(key, value)
            written[key] = value
        popped = stacks.pop_all()
        assert len(popped) == count
        assert dict(popped) == written
        assert list(stacks.keys()) == []
    assert bpf_loads.leaked() == {}

# SPDX-License-Identifier: Apache-2.0
"""The pprof encoder: decoded with independently built pprof classes, and read by ``go tool pprof``."""

from __future__ import annotations

import dataclasses
import gzip
import subprocess
from pathlib import Path

import pytest

from otel_gpu import semconv
from otel_gpu.profiles.model import Frame, FrameKind, ProcessProfile, Sample
from otel_gpu.profiles.pprof import encode_pprof, encode_pprof_raw
from tests.gotool import go_binary, needs_go, pprof_top
from tests.profiles import batches, pprof_proto


def _labels(profile, sample) -> dict[str, object]:  # type: ignore[no-untyped-def]
    strings = profile.string_table
    return {strings[label.key]: (strings[label.str] if label.str else label.num) for label in sample.label}


def test_cpu_batch_round_trips_with_both_sample_types() -> None:
    batch = batches.cpu_batch(frequency_hz=100)
    data = encode_pprof(batch)
    assert data[:2] == b"\x1f\x8b"
    assert gzip.decompress(data) == encode_pprof_raw(batch)
    profile = pprof_proto.decode(data)
    strings = profile.string_table
    assert strings[0] == ""
    assert [(strings[t.type], strings[t.unit]) for t in profile.sample_type] == [("samples", "count"),
                                                                                  ("cpu", "nanoseconds")]
    assert (strings[profile.period_type.type], strings[profile.period_type.unit]) == ("cpu", "nanoseconds")
    assert profile.period == 10_000_000
    assert profile.time_nanos == batches.START_NS and profile.duration_nanos == batches.DURATION_NS
    stacks = pprof_proto.stacks(profile)
    assert stacks == {
        ("hot_loop", "main"): [30, 300_000_000],
        ("cold_loop", "main"): [10, 100_000_000],
        ("ksys_write", "__GI___libc_write", "main"): [5, 50_000_000],
        ("main",): [7, 70_000_000],
    }


def test_labels_name_process_thread_container_and_trace() -> None:
    profile = pprof_proto.decode(encode_pprof(batches.cpu_batch()))
    labels = [_labels(profile, s) for s in profile.sample]
    # the process's identity as on its OTLP resource, "." -> "_": one label selector joins pprof and OTLP series
    assert labels[0] == {"pid": 4242, "thread_id": 4242, "thread_name": "worker", "container_id": "c" * 64,
                         "service_name": "checkout", "process_executable_name": "worker",
                         "k8s_pod_uid": "11111111-2222-3333-4444-555555555555"}
    assert labels[1]["thread_id"] == 4243 and labels[1]["thread_name"] == "helper"
    assert labels[3] == {"pid": 77, "thread_id": 77, "thread_name": "other", "service_name": "other",
                         "process_executable_name": "other", "trace_id": batches.TRACE_ID, "span_id": batches.SPAN_ID}
    # pid and thread id are numbers (Pyroscope leaves num labels out of its series)
    pid_key = list(profile.string_table).index("pid")
    assert all(label.num and not label.str for s in profile.sample for label in s.label if label.key == pid_key)


def test_every_sample_names_the_node() -> None:
    node = (("host.name", "gpu-node-7"), ("k8s.node.name", "gpu-node-7"), ("k8s.cluster.name", "east"))
    profile = pprof_proto.decode(encode_pprof(dataclasses.replace(batches.cpu_batch(), node=node)))
    for sample in profile.sample:
        labels = _labels(profile, sample)
        assert labels["host_name"] == labels["k8s_node_name"] == "gpu-node-7"
        assert "k8s_cluster_name" not in labels  # only the node's names: Pyroscope allows 30 labels a series


def test_mappings_locations_functions_are_deduplicated() -> None:
    profile = pprof_proto.decode(encode_pprof(batches.cpu_batch()))
    strings = profile.string_table
    assert len(strings) == len(set(strings))
    assert sorted(strings[m.filename] for m in profile.mapping) == ["/usr/bin/worker",
                                                                    "/usr/lib/x86_64-linux-gnu/libc.so.6"]
    exe = next(m for m in profile.mapping if strings[m.filename] == "/usr/bin/worker")
    assert strings[exe.build_id] == "abcdef0123456789"
    assert (exe.memory_start, exe.memory_limit, exe.has_functions) == (0x400000, 0x500000, True)
    assert len(profile.location) == 5  # main, hot, cold, write, ksys: main shared by every stack
    assert len(profile.function) == 5
    assert all(loc.id > 0 for loc in profile.location) and all(m.id > 0 for m in profile.mapping)
    by_name = {strings[f.name]: f for f in profile.function}
    assert strings[by_name["main"].filename] == "worker.c"
    main = next(loc for loc in profile.location if loc.line[0].function_id == by_name["main"].id)
    assert (main.address, main.mapping_id, main.line[0].line) == (0x401000, exe.id, 40)
    kernel = next(loc for loc in profile.location if loc.line[0].function_id == by_name["ksys_write"].id)
    assert kernel.mapping_id == 0 and kernel.address == 0xFFFFFFFF81000000


def test_gpu_batch_has_its_own_sample_type_and_cuda_labels() -> None:
    profile = pprof_proto.decode(encode_pprof(batches.gpu_batch()))
    strings = profile.string_table
    assert [(strings[t.type], strings[t.unit]) for t in profile.sample_type] == [("gpu_time", "nanoseconds")]
    assert (strings[profile.period_type.type], profile.period) == ("gpu", 1)
    stacks = pprof_proto.stacks(profile)
    assert stacks[("gemm_kernel(float*, int)", "hot_loop", "main")] == [3_000_000]
    assert stacks[("add_kernel", "cold_loop", "main")] == [1_000_000]
    labels = _labels(profile, profile.sample[0])
    assert labels["cuda.stream"] == 7 and labels["pid"] == 4242
    kernel = next(f for f in profile.function if strings[f.name] == "gemm_kernel(float*, int)")
    assert strings[kernel.system_name] == "_Z11gemm_kernelPfi"


def test_sync_wait_batch_has_one_nanosecond_sample_type() -> None:
    profile = pprof_proto.decode(encode_pprof(batches.sync_wait_batch()))
    strings = profile.string_table
    assert [(strings[t.type], strings[t.unit]) for t in profile.sample_type] == [("sync_wait", "nanoseconds")]
    assert pprof_proto.stacks(profile) == {("[cudaStreamSynchronize]", "cold_loop", "main"): [2_500_000]}


@pytest.mark.backend
@needs_go
def test_go_tool_pprof_reads_the_file(tmp_path: Path) -> None:
    path = tmp_path / "cpu.pb.gz"
    path.write_bytes(encode_pprof(batches.cpu_batch(frequency_hz=100)))
    output, rows = pprof_top([path], tmp_path)
    flat = {name: ms for name, (ms, _) in rows.items() if ms}
    # cpu/nanoseconds (the last sample type) is the default: 30 x 10 ms, 10 x 10 ms, ...
    assert flat == {"hot_loop": 300.0, "main": 70.0, "cold_loop": 100.0, "ksys_write": 50.0}, output
    assert "Type: cpu" in output
    tags = subprocess.run([str(go_binary()), "tool", "pprof", "-tags", str(path)], capture_output=True, text=True,
                          timeout=120, check=True, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert "thread_name" in tags.stdout and "worker" in tags.stdout and "pid" in tags.stdout


@pytest.mark.backend
@needs_go
def test_go_tool_pprof_shows_python_names_in_angle_brackets(tmp_path: Path) -> None:
    """pprof takes a name with <...> whose system name is the same for demangled C++ and cuts the brackets out, so
    `<module>`, `<lambda>` and `<listcomp>` showed blank; Python frames carry a system name of their own."""
    names = ("<module>", "<lambda>", "<listcomp>", "Outer.<locals>.inner", "work")
    frames = tuple(Frame(name, FrameKind.PYTHON, filename="app.py", line=n + 1) for n, name in enumerate(names))
    batch = dataclasses.replace(batches.cpu_batch(frequency_hz=100), processes=(
        ProcessProfile(batches.WORKER, tuple(Sample(frames[n:], 10 * (n + 1), thread_id=1) for n in range(5))),))
    path = tmp_path / "python.pb.gz"
    path.write_bytes(encode_pprof(batch))
    output, rows = pprof_top([path], tmp_path)
    assert {name: flat for name, (flat, _) in rows.items()} == {
        "<module>": 100.0, "<lambda>": 200.0, "<listcomp>": 300.0, "Outer.<locals>.inner": 400.0, "work": 500.0}, output


def _unmeasured_batch():  # type: ignore[no-untyped-def]
    """The gpu batch, with 3.25 s of the worker's GPU time and 1.5 s of another process's (no samples) unmeasured."""
    gpu = batches.gpu_batch()
    worker = dataclasses.replace(gpu.processes[0], attributes=((semconv.OTEL_GPU_GPU_TIME_YIELDED, 3.25),))
    other = ProcessProfile(batches.OTHER, (), ((semconv.OTEL_GPU_GPU_TIME_YIELDED, 1.5),))
    return dataclasses.replace(gpu, processes=(worker, other))


def test_comments_state_the_sampling_fraction_and_the_time_not_measured_per_process() -> None:
    profile = pprof_proto.decode(encode_pprof(_unmeasured_batch()))
    comments = [profile.string_table[index] for index in profile.comment]
    assert comments[0].startswith("otel_gpu.sampling_fraction=0.25: values re-weighted from the 25% of the time")
    assert comments[1].startswith("otel_gpu.gpu_time.yielded=3.250 s in pid 4242 (checkout): GPU time not measured")
    assert comments[2].startswith("otel_gpu.gpu_time.yielded=1.500 s in pid 77 (other)")
    assert pprof_proto.decode(encode_pprof(batches.cpu_batch())).comment == []  # nothing to state


def test_the_main_executable_is_the_first_mapping() -> None:
    """Readers name a profile after mapping[0] (`File:` in pprof -top): the GPU time's first native frame below the
    kernel is libcuda's, so the first mapping used is a library's."""
    gpu = batches.gpu_batch()
    lib = Frame("cuLaunchKernel", address=0x7F0000001000, mapping=batches.LIBC)
    worker = gpu.processes[0]
    samples = tuple(dataclasses.replace(s, frames=(s.frames[0], lib, *s.frames[1:])) for s in worker.samples)
    profile = pprof_proto.decode(encode_pprof(dataclasses.replace(gpu, processes=(
        dataclasses.replace(worker, samples=samples),))))
    strings = profile.string_table
    assert [strings[m.filename] for m in profile.mapping] == ["/usr/bin/worker", "/usr/lib/x86_64-linux-gnu/libc.so.6"]
    by_id = {m.id: strings[m.filename] for m in profile.mapping}
    by_function = {strings[f.name]: f.id for f in profile.function}
    culaunch = next(loc for loc in profile.location if loc.line[0].function_id == by_function["cuLaunchKernel"])
    assert by_id[culaunch.mapping_id].endswith("libc.so.6")  # the ids still say which mapping each location is in


@pytest.mark.backend
@needs_go
def test_go_tool_pprof_shows_the_comments(tmp_path: Path) -> None:
    path = tmp_path / "gpu.pb.gz"
    path.write_bytes(encode_pprof(_unmeasured_batch()))
    comments = subprocess.run([str(go_binary()), "tool", "pprof", "-comments", str(path)], capture_output=True,
                              text=True, timeout=120, check=True, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert "otel_gpu.gpu_time.yielded=1.500 s in pid 77" in comments.stdout, comments.stderr
    output, _ = pprof_top([path], tmp_path)
    assert "File: worker" in output

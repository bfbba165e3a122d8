# SPDX-License-Identifier: Apache-2.0
"""The OTLP profiles encoder: decoded with opentelemetry-proto's classes, and checked against Pyroscope's rules."""

from __future__ import annotations

import dataclasses

from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import ExportProfilesServiceRequest

from otel_gpu.profiles.otlp import encode_otlp
from tests.profiles import batches
from tests.profiles.pyroscope_rules import profile_type_ids, violations


def _decoded(batch) -> ExportProfilesServiceRequest:  # type: ignore[no-untyped-def]
    request = ExportProfilesServiceRequest()
    request.ParseFromString(encode_otlp(batch).SerializeToString())
    return request


def _resource(request: ExportProfilesServiceRequest, index: int) -> dict[str, object]:
    out: dict[str, object] = {}
    for kv in request.resource_profiles[index].resource.attributes:
        out[kv.key] = getattr(kv.value, kv.value.WhichOneof("value"))
    return out


def _attributes(request: ExportProfilesServiceRequest, indices) -> dict[str, object]:  # type: ignore[no-untyped-def]
    d = request.dictionary
    out = {}
    for i in indices:
        kv = d.attribute_table[i]
        out[d.string_table[kv.key_strindex]] = getattr(kv.value, kv.value.WhichOneof("value"))
    return out


def _stacks(request: ExportProfilesServiceRequest, resource: int) -> dict[tuple[str, ...], int]:
    d = request.dictionary
    out: dict[tuple[str, ...], int] = {}
    for sample in request.resource_profiles[resource].scope_profiles[0].profiles[0].samples:
        names = tuple(d.string_table[d.function_table[d.location_table[i].lines[0].function_index].name_strindex]
                      for i in d.stack_table[sample.stack_index].location_indices)
        out[names] = out.get(names, 0) + sample.values[0]
    return out


def test_cpu_batch_is_filed_as_process_cpu_by_pyroscope() -> None:
    request = _decoded(batches.cpu_batch(frequency_hz=100))
    assert violations(request) == []
    assert profile_type_ids(request) == ["process_cpu:cpu:nanoseconds:cpu:nanoseconds"] * 2
    profile = request.resource_profiles[0].scope_profiles[0].profiles[0]
    strings = request.dictionary.string_table
    assert (strings[profile.sample_type.type_strindex], strings[profile.sample_type.unit_strindex]) == ("samples",
                                                                                                        "count")
    assert profile.period == 10_000_000
    assert (profile.time_unix_nano, profile.duration_nano) == (batches.START_NS, batches.DURATION_NS)
    assert _attributes(request, profile.attribute_indices) == {"otel_gpu.sampling_fraction": 1.0}


def test_every_table_starts_with_its_zero_entry() -> None:
    d = _decoded(batches.cpu_batch()).dictionary
    assert d.string_table[0] == ""
    for table in (d.mapping_table, d.location_table, d.function_table, d.link_table, d.attribute_table,
                  d.stack_table):
        assert len(table) >= 2 and table[0].ByteSize() == 0


def test_one_resource_per_process_with_plain_keys() -> None:
    request = _decoded(batches.cpu_batch())
    assert len(request.resource_profiles) == 2
    assert _resource(request, 0) == {
        "service.name": "checkout", "process.pid": 4242, "process.executable.name": "worker",
        "process.executable.path": "/usr/bin/worker", "container.id": "c" * 64,
        "k8s.pod.uid": "11111111-2222-3333-4444-555555555555",
    }
    # no service name of its own: the executable name stands in
    assert _resource(request, 1) == {"service.name": "other", "process.pid": 77,
                                     "process.executable.name": "other", "process.executable.path": "/opt/other"}
    scope = request.resource_profiles[0].scope_profiles[0].scope
    assert scope.name == "otel-gpu"


def test_command_args_are_a_string_array_on_the_resource_only() -> None:
    batch = batches.cpu_batch()
    first = batch.processes[0]
    info = dataclasses.replace(first.process, command_args=("python", "train.py", "--lr", "0.1"))
    request = _decoded(dataclasses.replace(batch, processes=(dataclasses.replace(first, process=info),
                                                             *batch.processes[1:])))
    args = _resource(request, 0)["process.command_args"]
    assert [value.string_value for value in args.values] == ["python", "train.py", "--lr", "0.1"]  # type: ignore[attr-defined]
    assert "process.command_args" not in _resource(request, 1)  # none read (or --no-process-command-args)


def test_the_node_is_on_every_resource_and_a_process_key_wins() -> None:
    node = (("host.name", "gpu-node-7"), ("k8s.node.name", "gpu-node-7"), ("container.id", "not-the-process"))
    request = _decoded(dataclasses.replace(batches.cpu_batch(), node=node))
    first, second = _resource(request, 0), _resource(request, 1)
    assert first["host.name"] == second["host.name"] == "gpu-node-7"
    assert first["k8s.node.name"] == second["k8s.node.name"] == "gpu-node-7"
    assert first["container.id"] == "c" * 64  # the process's own
    assert second["container.id"] == "not-the-process"  # it had none; the node's stands


def test_samples_stacks_and_values_round_trip() -> None:
    request = _decoded(batches.cpu_batch())
    assert _stacks(request, 0) == {("hot_loop", "main"): 30, ("cold_loop", "main"): 10,
                                   ("ksys_write", "__GI___libc_write", "main"): 5}
    assert _stacks(request, 1) == {("main",): 7}
    samples = request.resource_profiles[0].scope_profiles[0].profiles[0].samples
    assert all(len(s.values) == 1 and s.link_index == 0 for s in samples)
    assert _attributes(request, samples[1].attribute_indices) == {"thread.id": 4243, "thread.name": "helper"}


def test_locations_mappings_functions_and_frame_types() -> None:
    request = _decoded(batches.cpu_batch())
    d = request.dictionary
    strings = d.string_table
    assert len(d.location_table) == 6 and len(d.function_table) == 6 and len(d.mapping_table) == 3
    assert len(set(strings)) == len(strings)
    by_function = {strings[d.function_table[loc.lines[0].function_index].name_strindex]: loc
                   for loc in d.location_table[1:]}
    hot = by_function["hot_loop"]
    assert hot.address == 0x401100 and hot.lines[0].line == 12
    assert _attributes(request, hot.attribute_indices) == {"profile.frame.type": "native"}
    assert _attributes(request, by_function["ksys_write"].attribute_indices) == {"profile.frame.type": "kernel"}
    assert by_function["ksys_write"].mapping_index == 0
    exe = d.mapping_table[hot.mapping_index]
    assert strings[exe.filename_strindex] == "/usr/bin/worker"
    assert (exe.memory_start, exe.memory_limit) == (0x400000, 0x500000)
    assert _attributes(request, exe.attribute_indices) == {"process.executable.build_id.gnu": "abcdef0123456789"}
    function = d.function_table[hot.lines[0].function_index]
    assert strings[function.system_name_strindex] == "hot_loop" and strings[function.filename_strindex] == "worker.c"


def test_trace_links_go_through_the_link_table() -> None:
    request = _decoded(batches.cpu_batch())
    sample = request.resource_profiles[1].scope_profiles[0].profiles[0].samples[0]
    link = request.dictionary.link_table[sample.link_index]
    assert sample.link_index == 1
    assert link.trace_id.hex() == batches.TRACE_ID and link.span_id.hex() == batches.SPAN_ID


def test_gpu_batch_is_filed_as_gpu_time_with_cuda_attributes() -> None:
    request = _decoded(batches.gpu_batch())
    assert profile_type_ids(request) == ["gpu:gpu_time:nanoseconds:gpu:nanoseconds"]
    profile = request.resource_profiles[0].scope_profiles[0].profiles[0]
    assert _attributes(request, profile.attribute_indices) == {"otel_gpu.sampling_fraction": 0.25,
                                                               "otel_gpu.profile.kind": "gpu_time"}
    assert _stacks(request, 0) == {("gemm_kernel(float*, int)", "hot_loop", "main"): 3_000_000,
                                   ("add_kernel", "cold_loop", "main"): 1_000_000}
    sample_attributes = _attributes(request, profile.samples[0].attribute_indices)
    assert sample_attributes == {"thread.id": 4242, "thread.name": "worker", "cuda.device": 0, "cuda.stream": 7,
                                 "cuda.graph": 0}
    d = request.dictionary
    kernel = d.location_table[d.stack_table[profile.samples[0].stack_index].location_indices[0]]
    assert _attributes(request, kernel.attribute_indices) == {"profile.frame.type": "cuda"}
    assert d.string_table[d.function_table[kernel.lines[0].function_index].system_name_strindex] == \
        "_Z11gemm_kernelPfi"


def test_each_process_profile_states_its_own_time_not_measured() -> None:
    from otel_gpu.profiles.model import ProcessProfile

    gpu = batches.gpu_batch()
    worker = dataclasses.replace(gpu.processes[0], attributes=(("otel_gpu.gpu_time.yielded", 3.25),))
    other = ProcessProfile(batches.OTHER, (), (("otel_gpu.gpu_time.yielded", 1.5),))
    request = _decoded(dataclasses.replace(gpu, processes=(worker, other)))
    yielded = [_attributes(request, r.scope_profiles[0].profiles[0].attribute_indices)["otel_gpu.gpu_time.yielded"]
               for r in request.resource_profiles]
    assert yielded == [3.25, 1.5]
    assert len(request.resource_profiles[1].scope_profiles[0].profiles[0].samples) == 0


def test_checker_catches_what_pyroscope_rejects() -> None:
    """The rule checker is itself able to fail: break a valid request in the ways Pyroscope rejects."""
    request = _decoded(batches.cpu_batch())
    request.resource_profiles[0].scope_profiles[0].profiles[0].samples[0].values.append(1)
    request.dictionary.mapping_table[0].memory_start = 5
    del request.resource_profiles[1].resource.attributes[0]  # service.name
    problems = "\n".join(violations(request))
    assert "sample values length mismatch" in problems
    assert "mapping_table[0] is not the zero value" in problems
    assert "no service.name" in problems


def test_sync_wait_batch_is_filed_under_its_period_type() -> None:
    request = _decoded(batches.sync_wait_batch())
    assert profile_type_ids(request) == ["gpu_wait:sync_wait:nanoseconds:gpu_wait:nanoseconds"]
    assert _stacks(request, 0) == {("[cudaStreamSynchronize]", "cold_loop", "main"): 2_500_000}

# SPDX-License-Identifier: Apache-2.0
"""End to end: the real agent profiles the C workload ``cpu_3to1`` with eBPF, writes pprof files that
``go tool pprof`` reads with the 3:1 share of the two leaf functions, and sends OTLP profiles over gRPC to an
in-process ProfilesService in the same run.
"""

from __future__ import annotations

import gzip
import re
import subprocess
from pathlib import Path

import pytest
from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import ExportProfilesServiceRequest

from tests.conftest import NATIVE
from tests.e2e.agent import run_profiling_agent
from tests.exporters.receivers import GrpcProfilesReceiver
from tests.gotool import needs_go, pprof_top
from tests.profiles import pprof_proto
from tests.profiles.pyroscope_rules import profile_type_ids

WORKLOAD = NATIVE / "workloads" / "cpu_3to1"
CHAIN_HEAVY = ("leaf_heavy", "busy_loop", "run", "main")
CHAIN_LIGHT = ("leaf_light", "busy_loop", "run", "main")
AGENT_SECONDS = 6
FREQUENCY_HZ = 499
TOLERANCE = 0.10
NODE = "gpu-node-7"  # the heavy leaf's share of both leaves: 0.75 +- 10 % of 0.75


@pytest.fixture(scope="module")
def agent_run(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """One agent run: files under a folder and OTLP gRPC to an in-process receiver, profiling cpu_3to1 only."""
    if not WORKLOAD.exists():
        pytest.fail(f"{WORKLOAD} is missing: run `make build` (it builds tests/native)")
    out_dir = tmp_path_factory.mktemp("cpu-e2e")
    receiver = GrpcProfilesReceiver().start()
    workload = subprocess.Popen([str(WORKLOAD), str(AGENT_SECONDS + 20)], stdout=subprocess.PIPE, text=True)
    ready = workload.stdout.readline() if workload.stdout else ""
    match = re.match(r"ready (\d+)", ready)
    if not match:
        workload.kill()
        receiver.stop()
        pytest.fail(f"workload did not say 'ready PID': {ready!r}")
    pid = int(match.group(1))
    agent = run_profiling_agent(workload, receiver, "--duration", str(AGENT_SECONDS), "--no-gpu-metrics",
                                "--no-gpu-time-profiling", "--pid", str(pid), "--output-dir", str(out_dir),
                                "--local-files", "on", "--console", "on", "--profiling-frequency-hz",
                                str(FREQUENCY_HZ), "--profiling-interval", "2", "--node-name", NODE,
                                "--resource-attributes", "k8s.cluster.name=gpu-east,service.name=not-for-profiles")
    files = sorted(out_dir.glob("profile-cpu-*.pb.gz"))
    assert files, f"no profile files in {out_dir}: {sorted(p.name for p in out_dir.iterdir())}\n{agent.stderr[-4000:]}"
    # CPU profiles only: each request holds one batch, so one profile type
    requests = [r for r in receiver.requests
                if set(profile_type_ids(r)) == {"process_cpu:cpu:nanoseconds:cpu:nanoseconds"}]
    return {"pid": pid, "files": files, "requests": requests, "out_dir": out_dir, "agent": agent,
            "all_requests": list(receiver.requests)}


def _merged_stacks(files: list[Path], pid: int) -> dict[tuple[str, ...], int]:
    """Function names leaf first -> samples, over every file, for ``pid`` only."""
    out: dict[tuple[str, ...], int] = {}
    for path in files:
        profile = pprof_proto.decode(path.read_bytes())
        strings = profile.string_table
        functions = {f.id: strings[f.name] for f in profile.function}
        locations = {loc.id: functions[loc.line[0].function_id] for loc in profile.location}
        for sample in profile.sample:
            labels = {strings[label.key]: label.num for label in sample.label}
            if labels.get("pid") != pid:
                continue
            key = tuple(locations[i] for i in sample.location_id)
            out[key] = out.get(key, 0) + sample.value[0]
    return out


def _share_heavy(heavy: float, light: float) -> float:
    return heavy / (heavy + light)


@pytest.mark.root
def test_pprof_files_have_the_full_chain_and_the_3_to_1_share(agent_run) -> None:  # type: ignore[no-untyped-def]
    stacks = _merged_stacks(agent_run["files"], agent_run["pid"])
    heavy = sum(v for k, v in stacks.items() if k[:4] == CHAIN_HEAVY)
    light = sum(v for k, v in stacks.items() if k[:4] == CHAIN_LIGHT)
    assert heavy + light >= 200, f"too few samples of the leaves: {sorted(stacks.items(), key=lambda i: -i[1])[:10]}"
    assert abs(_share_heavy(heavy, light) - 0.75) <= 0.75 * TOLERANCE, (heavy, light)
    assert "leaf_heavy" in agent_run["agent"].stdout  # terminal summary printed each interval


@pytest.mark.root
@pytest.mark.backend
@needs_go
def test_go_tool_pprof_top_shows_the_leaves_3_to_1(agent_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # go tool pprof merges several profiles given on one command line
    output, rows = pprof_top(agent_run["files"], tmp_path, f"-tagfocus=pid={agent_run['pid']}")
    flat = {name: ms for name, (ms, _) in rows.items() if ms}
    assert "leaf_heavy" in flat and "leaf_light" in flat, output
    assert abs(_share_heavy(flat["leaf_heavy"], flat["leaf_light"]) - 0.75) <= 0.75 * TOLERANCE, output
    assert "Type: cpu" in output


@pytest.mark.root
def test_otlp_grpc_receiver_gets_the_workload_profiles(agent_run) -> None:  # type: ignore[no-untyped-def]
    requests: list[ExportProfilesServiceRequest] = agent_run["requests"]
    assert requests, f"the in-process OTLP gRPC receiver got no CPU profiles ({len(agent_run['all_requests'])} requests)"
    pid = agent_run["pid"]
    heavy = light = 0
    resources = []
    for request in agent_run["all_requests"]:
        profile_type_ids(request)  # every request, whatever its type, meets Pyroscope's rules
    for request in requests:
        d = request.dictionary
        for resource_profiles in request.resource_profiles:
            attributes = {kv.key: kv.value for kv in resource_profiles.resource.attributes}
            if attributes["process.pid"].int_value != pid:
                continue
            samples = resource_profiles.scope_profiles[0].profiles[0].samples
            resources.append((sum(sample.values[0] for sample in samples), attributes))
            for sample in samples:
                names = tuple(
                    d.string_table[d.function_table[d.location_table[i].lines[0].function_index].name_strindex]
                    for i in d.stack_table[sample.stack_index].location_indices)
                if names[:4] == CHAIN_HEAVY:
                    heavy += sample.values[0]
                elif names[:4] == CHAIN_LIGHT:
                    light += sample.values[0]
    assert resources, f"no resource with process.pid={pid}"
    # the workload's program; the pid first ran the test's fork (between fork and exec), a program of its own that a
    # sample may have caught: never more than a moment
    workload = [(count, a) for count, a in resources if a["process.executable.name"].string_value == "cpu_3to1"]
    assert sum(count for count, a in resources) - sum(count for count, _ in workload) <= 5, resources
    assert workload, resources
    first = workload[0][1]
    assert first["process.executable.name"].string_value == "cpu_3to1"
    assert first["process.executable.path"].string_value == str(WORKLOAD.resolve())
    assert first["service.name"].string_value == "cpu_3to1"  # the process's, never the agent's nor its override
    # the node's identity, so that two nodes' processes stay apart; OTEL_RESOURCE_ATTRIBUTES other than service.*
    assert first["host.name"].string_value == NODE and first["k8s.node.name"].string_value == NODE
    assert first["k8s.cluster.name"].string_value == "gpu-east"
    assert heavy + light >= 200
    assert abs(_share_heavy(heavy, light) - 0.75) <= 0.75 * TOLERANCE, (heavy, light)


@pytest.mark.root
def test_files_and_otlp_carry_the_same_samples(agent_run) -> None:  # type: ignore[no-untyped-def]
    """Every sample of the workload went to both destinations: the totals agree exactly."""
    pid = agent_run["pid"]
    file_total = sum(_merged_stacks(agent_run["files"], pid).values())
    otlp_total = 0
    for request in agent_run["requests"]:
        for resource_profiles in request.resource_profiles:
            attributes = {kv.key: kv.value for kv in resource_profiles.resource.attributes}
            if attributes["process.pid"].int_value == pid:
                otlp_total += sum(s.values[0] for s in resource_profiles.scope_profiles[0].profiles[0].samples)
    assert file_total == otlp_total > 0
    assert all(gzip.decompress(p.read_bytes()) for p in agent_run["files"])

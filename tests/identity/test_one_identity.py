# SPDX-License-Identifier: Apache-2.0
"""One identity per process on every signal (issue 15, item 1), end to end through `otel-gpu run` (root, real eBPF,
real VictoriaMetrics): an instrumented Python program on the fake CUDA stack, listed by the fake NVML as a GPU
process, runs in a cgroup laid out as a Kubernetes pod's container and names its service only through
OTEL_RESOURCE_ATTRIBUTES; the agent looks its pod's names up (--k8s-names) from a server that answers as the API
server does. Its CPU, gpu_time and sync_wait profiles (OTLP resource and pprof labels) and its GPU
metrics (NVML per-process gauges and GPU-time counters, queried back from VictoriaMetrics) carry equal values for
every identity key, so one label selector built from a profile's resource selects every metric series."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from otel_gpu import semconv
from tests.backends import VictoriaMetrics, victoria_metrics, wait_until
from tests.conftest import agent_command
from tests.cuda.test_gpu_time_fake_cuda import FAKES, LIBRARY
from tests.e2e.agent import FAKE_NVML_DIR, build_fake_nvml
from tests.exporters.receivers import GrpcProfilesReceiver
from tests.instrumentation.test_gpu_span_context import SPAN_WORKLOAD
from tests.k8s.api_server import PODS, FakeAPIServer, make_pod
from tests.profiles import pprof_proto
from tests.profiles.pyroscope_rules import profile_type_ids

__all__ = ["victoria_metrics"]  # fixture used below
pytestmark = [pytest.mark.root, pytest.mark.backend]

NODE = "gpu-node-7"  # the fake API server's node
SERVICE = "trainer"
# the identity keys every signal carries, as OTel attributes and as the Prometheus labels they become
IDENTITY = (semconv.PROCESS_PID, semconv.PROCESS_EXECUTABLE_NAME, semconv.CONTAINER_ID, semconv.K8S_POD_UID,
            semconv.SERVICE_NAME, semconv.HOST_NAME, semconv.K8S_NODE_NAME, semconv.K8S_POD_NAME,
            semconv.K8S_NAMESPACE_NAME, semconv.K8S_CONTAINER_NAME)
PROFILE_TYPES = {"process_cpu:cpu:nanoseconds:cpu:nanoseconds", "gpu:gpu_time:nanoseconds:gpu:nanoseconds",
                 "gpu_wait:sync_wait:nanoseconds:gpu_wait:nanoseconds"}
METRICS = (semconv.GPU_PROCESS_MEMORY_USAGE, semconv.GPU_PROCESS_SM_UTILIZATION, semconv.GPU_PROCESS_KERNEL_LAUNCHES,
           semconv.GPU_PROCESS_KERNEL_TIME, semconv.GPU_PROCESS_SYNC_WAIT_TIME)
# where a test may make a cgroup: cgroup v1's pids hierarchy, a hybrid layout's v2 tree, or a v2-only root
CGROUP_ROOTS = (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))


@pytest.fixture
def pod_cgroup() -> Iterator[tuple[Path, str, str]]:
    """A cgroup laid out as the kubelet lays out a pod's container (kubepods/burstable/pod<uid>/<container id>):
    (its folder, pod uid, container id); removed afterwards."""
    pod_uid, container_id = str(uuid.uuid4()), uuid.uuid4().hex + uuid.uuid4().hex
    root = next((r for r in CGROUP_ROOTS if (r / "cgroup.procs").exists()), None)
    assert root is not None, f"no cgroup hierarchy among {CGROUP_ROOTS}"
    top = root / f"kubepods-otel-gpu-test-{os.getpid()}"
    folder = top / "burstable" / f"pod{pod_uid}" / container_id
    folder.mkdir(parents=True)
    try:
        yield folder, pod_uid, container_id
    finally:
        for path in (folder, folder.parent, folder.parent.parent, top):
            for _ in range(50):  # a killed process leaves its cgroup a moment after wait() returns
                try:
                    path.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)


def _label(key: str) -> str:
    """The Prometheus label an OTel attribute key becomes."""
    return key.replace(".", "_")


def _labels(series: dict[str, str]) -> dict[str, str]:
    return {key: series.get(_label(key), "") for key in IDENTITY}


def test_one_label_selector_joins_every_signal_of_a_process(victoria_metrics: VictoriaMetrics, pod_cgroup,  # type: ignore[no-untyped-def]
                                                             tmp_path: Path) -> None:
    build_fake_nvml()
    folder, pod_uid, container_id = pod_cgroup
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "FAKE_NVML_", "K8S_"))}
    env.update(CUDA_INJECTION64_PATH=str(LIBRARY), OTEL_GPU_CUPTI_PATH=str(FAKES / "libcupti.so"),
               OTEL_GPU_OVERHEAD_BUDGET="0.05", OTEL_RESOURCE_ATTRIBUTES=f"team=ml,service.name={SERVICE}")
    workload = subprocess.Popen([sys.executable, str(SPAN_WORKLOAD), str(FAKES / "libcuda.so.1"),
                                 str(FAKES / "workload.py"), "--steps", "100000", "--busy-ms", "3"],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    receiver = GrpcProfilesReceiver().start()
    api = FakeAPIServer(tmp_path)
    PODS.append(make_pod(pod_uid, "trainer-0", NODE, {"trainer": container_id, "sidecar": "ef" * 32}))
    try:
        (folder / "cgroup.procs").write_text(str(workload.pid))  # before the agent first reads its identity
        agent_env = {k: v for k, v in env.items() if not k.startswith(("OTEL_", "CUDA_"))}
        agent_env.update(LD_LIBRARY_PATH=str(FAKE_NVML_DIR), FAKE_NVML_PROCESSES=f"{workload.pid}@0:{1 << 30}:50")
        out = tmp_path / "out"
        agent = subprocess.run(
            agent_command("run", "--duration", "7", "--pid", str(workload.pid), "--node-name", NODE,
                          "--otlp-metrics-endpoint", victoria_metrics.otlp_metrics_url,
                          "--otlp-metrics-protocol", "http/protobuf", "--metric-export-interval", "0.5",
                          "--otlp-profiles-endpoint", f"http://127.0.0.1:{receiver.port}",
                          "--otlp-profiles-protocol", "grpc", "--profiling-interval", "2",
                          "--profiling-frequency-hz", "99", "--output-dir", str(out), "--local-files", "on",
                          "--console", "off", "--k8s-names", "--k8s-api-url", api.url,
                          "--k8s-service-account-dir", str(api.service_account(tmp_path / "serviceaccount"))),
            env=agent_env, capture_output=True, text=True, timeout=120, check=False)
        assert workload.poll() is None, workload.stderr.read() if workload.stderr else ""
    finally:
        workload.kill()
        workload.wait()
        receiver.stop()
        api.stop()
        PODS.pop()
    assert agent.returncode == 0, agent.stderr[-4000:]

    # the profiles: one resource per process and profile type, all with the same identity
    identities: dict[str, dict[str, str]] = {}
    for request in receiver.requests:
        (type_id,) = set(profile_type_ids(request))
        for rp in request.resource_profiles:
            attributes = {a.key: a.value for a in rp.resource.attributes}
            if attributes[semconv.PROCESS_PID].int_value == workload.pid:
                identities[type_id] = {key: str(attributes[key].int_value or attributes[key].string_value)
                                       for key in IDENTITY if key in attributes}
    assert set(identities) == PROFILE_TYPES, identities
    executable = Path(sys.executable).resolve().name
    expected = {semconv.PROCESS_PID: str(workload.pid), semconv.PROCESS_EXECUTABLE_NAME: executable,
                semconv.CONTAINER_ID: container_id, semconv.K8S_POD_UID: pod_uid, semconv.SERVICE_NAME: SERVICE,
                semconv.HOST_NAME: NODE, semconv.K8S_NODE_NAME: NODE, semconv.K8S_POD_NAME: "trainer-0",
                semconv.K8S_NAMESPACE_NAME: "ml", semconv.K8S_CONTAINER_NAME: "trainer"}
    for type_id, identity in identities.items():
        assert identity == expected, type_id

    # the local pprof files: the labels pprof has for identity name the same process, container and node
    for kind in ("cpu", "gpu_time", "sync_wait"):
        files = sorted(out.glob(f"profile-{kind}-*.pb.gz"))
        assert files, (kind, sorted(p.name for p in out.iterdir()))
        seen = set()
        for path in files:
            profile = pprof_proto.decode(path.read_bytes())
            for sample in profile.sample:
                labels = {profile.string_table[label.key]: (profile.string_table[label.str] if label.str else
                                                            str(label.num)) for label in sample.label}
                seen.add((labels.get(semconv.PPROF_LABEL_PID), labels.get(semconv.PPROF_LABEL_CONTAINER_ID),
                          labels.get(_label(semconv.HOST_NAME)), labels.get(_label(semconv.K8S_NODE_NAME))))
        assert seen == {(str(workload.pid), container_id, NODE, NODE)}, (kind, seen)

    # the metrics: the profile's identity as one selector selects every per-process series, with equal values
    selector = ",".join(f'{_label(key)}="{value}"' for key, value in expected.items())
    names = {semconv.prometheus_name(spec) for spec in METRICS}
    found = wait_until(lambda: (names <= {s["metric"]["__name__"] for s in victoria_metrics.query(f"{{{selector}}}")}
                                and victoria_metrics.query(f"{{{selector}}}")), 30, f"every metric under {selector}")
    for series in found:
        assert _labels(series["metric"]) == expected, series
    for name in names:  # and no series of these metrics for the process carries another value
        for series in victoria_metrics.query(f'{name}{{process_pid="{workload.pid}"}}'):
            assert _labels(series["metric"]) == expected, series

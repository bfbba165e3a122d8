# SPDX-License-Identifier: Apache-2.0
"""The optional k8s name lookup (--k8s-names) against a small HTTPS server that answers as the API server does
(no cluster can be had in CI): the pod list of this node only, with the service account's token, over TLS checked
against its ca.crt; a 401, an API that does not answer and one that is not there; lookups that never wait on it."""

from __future__ import annotations

import logging
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from otel_gpu import config, k8s, selfmetrics, semconv
from otel_gpu.k8s import K8sNames, PodNames, parse_pod_list
from otel_gpu.procfs import ProcessResolver, identity_attributes
from tests.exporters.receivers import free_port, self_signed_certificate
from tests.k8s.api_server import CONTAINER_ID, NODE, PODS, POD_UID, FakeAPIServer, make_pod


@pytest.fixture
def api(tmp_path: Path) -> Iterator[FakeAPIServer]:
    server = FakeAPIServer(tmp_path)
    yield server
    server.stop()


@pytest.fixture
def account(tmp_path: Path, api: FakeAPIServer) -> Path:
    """A service-account folder as the kubelet mounts it: token and ca.crt."""
    return api.service_account(tmp_path / "serviceaccount")


def _errors(reason: str) -> float:
    return selfmetrics.total(semconv.SELF_ERRORS.name, otel_gpu__source="k8s", otel_gpu__reason=reason)


def test_names_of_this_nodes_pods_with_the_token_over_checked_tls(api: FakeAPIServer, account: Path) -> None:
    names = K8sNames(api.url, NODE, str(account), ttl_s=60)
    assert names.refresh()
    ((path, authorization),) = api.requests
    assert urllib.parse.parse_qs(urllib.parse.urlparse(path).query) == {"fieldSelector": [f"spec.nodeName={NODE}"]}
    assert authorization == "Bearer sa-token-123"
    assert names.lookup(POD_UID, CONTAINER_ID) == PodNames("trainer-0", "ml", "trainer")
    assert names.lookup(POD_UID, "99" * 32) == PodNames("trainer-0", "ml", "")  # a container the list lacks
    assert names.lookup("11111111-2222-3333-4444-555555555555") is None  # another node's pod is not listed


def test_a_server_the_ca_does_not_vouch_for_is_refused(api: FakeAPIServer, account: Path, tmp_path: Path) -> None:
    (tmp_path / "other").mkdir()
    other, _ = self_signed_certificate(tmp_path / "other")  # a certificate for 127.0.0.1 the server does not hold
    (account / "ca.crt").write_bytes(other.read_bytes())
    before = _errors("k8s_unreachable")
    assert not K8sNames(api.url, NODE, str(account)).refresh()
    assert _errors("k8s_unreachable") - before == 1
    assert api.requests == []


def test_401_is_counted_and_logged_once_per_outage(api: FakeAPIServer, account: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    names = K8sNames(api.url, NODE, str(account))
    api.status = 401
    before = _errors("k8s_unauthorized")
    with caplog.at_level(logging.INFO, logger="otel_gpu.k8s"):
        assert not names.refresh() and not names.refresh()
        api.status = 200
        assert names.refresh()
    assert _errors("k8s_unauthorized") - before == 2
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert "HTTP 401" in messages[0] and "answers again" in messages[1]
    assert names.lookup(POD_UID, CONTAINER_ID) == PodNames("trainer-0", "ml", "trainer")


def test_an_api_that_does_not_answer_times_out_and_never_blocks_a_lookup(api: FakeAPIServer, account: Path) -> None:
    names = K8sNames(api.url, NODE, str(account), ttl_s=3600, timeout_s=0.5)
    assert names.refresh()
    api.hold.clear()  # the next list hangs until the test lets it go
    before = _errors("k8s_timeout")
    names.start()  # lists at once on its own thread, which now waits on the server
    try:
        assert api.held.wait(10)
        # the background list is stuck in the server right now: a lookup still answers from the last list
        assert names.lookup(POD_UID, CONTAINER_ID) == PodNames("trainer-0", "ml", "trainer")
        deadline = time.monotonic() + 10
        while _errors("k8s_timeout") == before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _errors("k8s_timeout") - before == 1
    finally:
        api.hold.set()
        names.stop()


def test_an_api_that_is_not_there_and_a_missing_token(account: Path) -> None:
    before = _errors("k8s_unreachable")
    assert not K8sNames(f"https://127.0.0.1:{free_port()}", NODE, str(account)).refresh()
    assert _errors("k8s_unreachable") - before == 1
    (account / "token").unlink()
    before = _errors("k8s_no_token")
    assert not K8sNames(f"https://127.0.0.1:{free_port()}", NODE, str(account)).refresh()
    assert _errors("k8s_no_token") - before == 1


def test_names_older_than_three_ttls_are_dropped(api: FakeAPIServer, account: Path) -> None:
    names = K8sNames(api.url, NODE, str(account), ttl_s=0.1)
    assert names.refresh()
    assert names.lookup(POD_UID) is not None
    api.status = 401
    assert not names.refresh()
    time.sleep(0.4)
    assert names.lookup(POD_UID) is None  # the API has been failing for longer than 3 TTLs: no stale names


def test_an_unknown_pod_asks_the_background_thread_for_an_early_list(api: FakeAPIServer, account: Path) -> None:
    names = K8sNames(api.url, NODE, str(account), ttl_s=3600)
    names.start()
    try:
        deadline = time.monotonic() + 10
        while len(api.requests) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        PODS.append(make_pod("22222222-3333-4444-5555-666666666666", "late-0", NODE, {}))
        try:
            deadline = time.monotonic() + 20  # MIN_RELIST_S after the first list at most
            found = None
            while found is None and time.monotonic() < deadline:
                found = names.lookup("22222222-3333-4444-5555-666666666666")
                time.sleep(0.1)
            assert found == PodNames("late-0", "ml", "")
            assert len(api.requests) == 2  # one early list, not one per lookup
        finally:
            PODS.pop()
    finally:
        names.stop()


RESTARTED_ID = "77" * 32  # the trainer container's id after a restart, or its main container's after the init one


def _restarted_pod() -> dict[str, object]:
    return make_pod(POD_UID, "trainer-0", NODE, {"trainer": RESTARTED_ID, "sidecar": "ef" * 32})


def test_a_new_container_of_a_listed_pod_asks_for_an_early_list(api: FakeAPIServer, account: Path) -> None:
    names = K8sNames(api.url, NODE, str(account), ttl_s=3600)
    names.start()
    listed = PODS[0]
    try:
        deadline = time.monotonic() + 10
        while len(api.requests) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        PODS[0] = _restarted_pod()
        deadline = time.monotonic() + 20  # MIN_RELIST_S after the first list at most
        found = names.lookup(POD_UID, RESTARTED_ID)
        assert found == PodNames("trainer-0", "ml", "")  # the pod is known, its new container not yet
        while found is not None and not found.container_name and time.monotonic() < deadline:
            time.sleep(0.1)
            found = names.lookup(POD_UID, RESTARTED_ID)
        assert found == PodNames("trainer-0", "ml", "trainer")
        assert len(api.requests) == 2  # one early list, not one per lookup
        # a container no list names (a pod's sandbox) asks for one early list, not one every MIN_RELIST_S
        deadline = time.monotonic() + 20
        while len(api.requests) < 3 and time.monotonic() < deadline:
            assert names.lookup(POD_UID, "55" * 32) == PodNames("trainer-0", "ml", "")
            time.sleep(0.1)
        assert len(api.requests) == 3
        time.sleep(k8s.MIN_RELIST_S + 0.5)
        assert names.lookup(POD_UID, "55" * 32) == PodNames("trainer-0", "ml", "")
        time.sleep(0.5)
        assert len(api.requests) == 3
    finally:
        PODS[0] = listed
        names.stop()


def test_the_resolver_looks_again_while_the_container_is_unnamed(api: FakeAPIServer, account: Path,
                                                                  tmp_path: Path) -> None:
    base = tmp_path / "proc" / "4242"
    base.mkdir(parents=True)
    (base / "stat").write_bytes(b"4242 (trainer) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 987654 0 0\n")
    (base / "comm").write_bytes(b"trainer\n")
    (base / "cgroup").write_bytes(f"0::/kubepods/burstable/pod{POD_UID}/{RESTARTED_ID}\n".encode())
    names = K8sNames(api.url, NODE, str(account))
    resolver = ProcessResolver(str(tmp_path / "proc"), names=names)
    assert names.refresh()  # a list from before the restart
    info = resolver.info(4242)
    assert info is not None and (info.k8s_pod_name, info.k8s_container_name) == ("trainer-0", "")
    listed = PODS[0]
    PODS[0] = _restarted_pod()
    try:
        assert names.refresh()
    finally:
        PODS[0] = listed
    again = resolver.info(4242)
    assert again is not None and (again.k8s_pod_name, again.k8s_container_name) == ("trainer-0", "trainer")
    assert resolver.with_names(info) == again  # an identity kept from before is completed too
    assert resolver.info(4242) is again  # named: no more lookups


def test_the_resolver_adds_the_names_to_a_process_identity(api: FakeAPIServer, account: Path, tmp_path: Path) -> None:
    base = tmp_path / "proc" / "4242"
    base.mkdir(parents=True)
    (base / "stat").write_bytes(b"4242 (trainer) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 987654 0 0\n")
    (base / "comm").write_bytes(b"trainer\n")
    (base / "cgroup").write_bytes(f"0::/kubepods/burstable/pod{POD_UID}/{CONTAINER_ID}\n".encode())
    (base / "environ").write_bytes(b"OTEL_SERVICE_NAME=trainer\0")
    names = K8sNames(api.url, NODE, str(account))
    resolver = ProcessResolver(str(tmp_path / "proc"), names=names)
    info = resolver.info(4242)
    assert info is not None and info.pod_uid == POD_UID and info.k8s_pod_name == ""  # not listed yet
    assert names.refresh()
    info = resolver.info(4242)
    assert info is not None
    assert dict(identity_attributes(info)) == {
        semconv.SERVICE_NAME: "trainer", semconv.PROCESS_PID: 4242, semconv.PROCESS_EXECUTABLE_NAME: "trainer",
        semconv.CONTAINER_ID: CONTAINER_ID, semconv.K8S_POD_UID: POD_UID, semconv.K8S_POD_NAME: "trainer-0",
        semconv.K8S_NAMESPACE_NAME: "ml", semconv.K8S_CONTAINER_NAME: "trainer"}


def test_parse_pod_list_skips_what_is_not_a_pod() -> None:
    odd = {"metadata": {"uid": "u"}, "status": {"containerStatuses": 5}}
    pods, containers = parse_pod_list({"items": [None, {"metadata": {"name": "no-uid"}}, {"metadata": []}, *PODS[:1],
                                                 odd]})
    assert pods == {POD_UID: ("trainer-0", "ml"), "u": ("", "")}
    assert containers == {CONTAINER_ID: "trainer", "ef" * 32: "sidecar", "cd" * 32: "setup"}
    assert parse_pod_list([1, 2]) == ({}, {})


def test_the_flag_needs_a_node_name_and_an_api_server() -> None:
    with pytest.raises(config.ConfigError) as caught:
        config.load(None, {"OTEL_GPU_K8S_NAMES": "true"})
    assert all(problem.startswith("flag --k8s-names") for problem in caught.value.problems)
    assert len(caught.value.problems) == 2
    loaded = config.load(None, {"OTEL_GPU_K8S_NAMES": "true", "K8S_NODE_NAME": NODE,
                                "KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"})
    assert loaded.k8s.names and loaded.k8s.api_url == "https://[fd00::1]:6443"
    assert not config.load(None, {}).k8s.names  # off by default


def test_an_identity_kept_from_before_the_list_gets_the_names_when_reported(api: FakeAPIServer, account: Path) -> None:
    """The GPU-time source keeps a process's identity from its first record, often before a new pod is listed: the
    agent completes it with ProcessResolver.with_names before it exports profiles and in the GPU-time counters."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from otel_gpu.cuda.instruments import register_gpu_time_instruments
    from otel_gpu.cuda.source import ProcessCounters
    from otel_gpu.procfs import ProcessInfo

    names = K8sNames(api.url, NODE, str(account))
    resolver = ProcessResolver("/nonexistent", names=names)
    early = ProcessInfo(4242, "trainer", container_id=CONTAINER_ID, pod_uid=POD_UID)
    assert resolver.with_names(early) is early  # not listed yet
    counters = [ProcessCounters(early, launches=1, kernel_time_ns=1, sync_wait_ns=1)]

    class Source:
        def process_counters(self) -> list[ProcessCounters]:
            return counters

    reader = InMemoryMetricReader()
    register_gpu_time_instruments(MeterProvider(metric_readers=[reader]).get_meter("t"), Source(),
                                  resolver.with_names)
    assert names.refresh()
    named = resolver.with_names(early)
    assert (named.k8s_pod_name, named.k8s_namespace_name, named.k8s_container_name) == ("trainer-0", "ml", "trainer")
    assert resolver.with_names(named) is named
    data = reader.get_metrics_data()
    points = [p for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
              for p in m.data.data_points]
    assert points and all(p.attributes[semconv.K8S_POD_NAME] == "trainer-0" for p in points)
    assert ProcessResolver().with_names(early) is early  # the lookup off: nothing changes


def test_the_agent_names_the_processes_of_a_batch_before_export(api: FakeAPIServer, account: Path) -> None:
    from otel_gpu.agent import Agent
    from otel_gpu.config import AgentConfig, K8sConfig
    from otel_gpu.procfs import ProcessInfo
    from otel_gpu.profiles.model import ProcessProfile

    agent = Agent(AgentConfig(node_name=NODE, k8s=K8sConfig(names=True, api_url=api.url,
                                                            service_account_dir=str(account))))
    early = ProcessProfile(ProcessInfo(4242, "trainer", container_id=CONTAINER_ID, pod_uid=POD_UID), ())
    plain = ProcessProfile(ProcessInfo(7, "bash"), ())
    assert agent._named((early, plain)) == (early, plain)  # noqa: SLF001 - not listed yet
    assert agent._k8s_names is not None and agent._k8s_names.refresh()  # noqa: SLF001
    named, same = agent._named((early, plain))  # noqa: SLF001
    assert named.process.k8s_pod_name == "trainer-0" and same is plain
